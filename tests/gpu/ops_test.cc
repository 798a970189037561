// gpu/ops: each kernel against a CPU reference written here from compute/ (get_row,
// detail::rms_norm, detail::rope_cs, detail::silu, the engine's rope table): outputs poisoned
// with NaN before every run, so an element a kernel skips fails. Bad shapes are refused on the
// host with a message naming the argument (those tests need no GPU).
// Tolerances: bf16 outputs of exact f32 math are compared for equality; outputs whose f32 value
// may differ from the CPU's in the last bits (norms: double sums in another order; swiglu: CUDA's
// expf) get the bf16 rounding bound, rtol 2^-8 against the unrounded CPU value (+1e-6).
#include "gpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/check.h"
#include "compute/matmul.h"
#include "gpu/runtime.h"
#include "model/ggml_types.h"
#include "model/gguf.h"
#include "model/model_spec.h"
#include "model/rope.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kquant_blocks.h"
#include "tests/test_support.h"

namespace troupe::gpu {
namespace {

using model::GgmlType;
using testing::all_close;
using testing::from_bf16;
using testing::random_floats;
using testing::to_bf16;

constexpr float kBf16Rtol = 1.0f / 256 + 1e-6f;  // half a bf16 ulp, relative, plus f32 noise
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Expects f() to throw InputError whose message contains `needle`.
void expect_input_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no InputError; expected one mentioning '" << needle << "'";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

template <class T>
DeviceBuffer<T> upload(const std::vector<T>& host) {
  DeviceBuffer<T> buf(host.size());
  buf.upload(host);
  return buf;
}

// bf16 of every f32 value, back as f32: the exact expectation for a bf16 output.
std::vector<float> bf16_of(const std::vector<float>& v) { return testing::round_bf16(v); }

// ---- CPU references (compute/detail/ops.h, operation for operation) ----

void ref_rms_norm(const float* x, const float* w, float* out, int64_t n, float eps) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::sqrt(static_cast<float>(sum / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * scale) * w[i];
}

void ref_rope_cs(float* x, int64_t n_rot, const float* cs, const float* sn, bool neox) {
  const int64_t half = n_rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const int64_t a = neox ? i : 2 * i;
    const int64_t b = neox ? i + half : 2 * i + 1;
    const float x0 = x[a], x1 = x[b];
    x[a] = x0 * cs[i] - x1 * sn[i];
    x[b] = x0 * sn[i] + x1 * cs[i];
  }
}

float ref_silu(float x) { return x / (1.0f + std::exp(-x)); }

// ---- dequantize_to_bf16 ----

// Random weights of type t, [rows, cols], as stored bytes. K-quants: random bytes (any pattern
// is a valid block) with sane f16 scales; others: quantize_row of random values spanning many
// magnitudes (f16 subnormals included).
std::vector<uint8_t> random_weights(GgmlType t, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t rb = model::row_bytes(t, cols);
  std::vector<uint8_t> bytes(static_cast<size_t>(rb * rows));
  std::uniform_real_distribution<float> uni(-1.f, 1.f), expo(-8.f, 1.f);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* dst = bytes.data() + r * rb;
    if (model::type_traits(static_cast<uint32_t>(t))->block_elems == model::kQK_K) {
      ::troupe::testing::random_kquant_row(t, dst, cols, rng);
    } else {
      for (auto& v : row) v = uni(rng) * std::pow(10.f, expo(rng));
      model::quantize_row(t, row.data(), dst, cols);
    }
  }
  return bytes;
}

// Dequantizes on the GPU (src at byte offset `misalign` of its buffer) and compares with
// bf16(get_row) element for element.
void expect_dequant_matches(const model::WeightView& w, size_t misalign) {
  const int64_t rows = w.ne[1] * w.ne[2], cols = w.cols();
  const size_t nbytes = static_cast<size_t>(w.row_bytes() * rows);
  std::vector<uint8_t> host(nbytes + misalign);
  std::memcpy(host.data() + misalign, w.data, nbytes);
  DeviceBuffer<uint8_t> src = upload(host);
  DeviceBuffer<__nv_bfloat16> out(static_cast<size_t>(rows * cols));
  out.fill_bytes(0xFF);
  dequantize_to_bf16(src.get() + misalign, nbytes, w.type, rows, cols, out.get(), nullptr);
  TROUPE_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = from_bf16(out.download());
  std::vector<float> want(static_cast<size_t>(rows * cols));
  model::WeightView flat = w;
  flat.ne[1] = rows;
  flat.ne[2] = 1;
  for (int64_t r = 0; r < rows; ++r)
    compute::get_row(flat, r, &want[static_cast<size_t>(r * cols)]);
  EXPECT_TRUE(all_close(got, bf16_of(want), 0, 0, w.name.c_str()));
}

TEST(GpuOps, DequantizeMatchesGetRowForEveryType) {
  TROUPE_REQUIRE_GPU();
  const GgmlType types[] = {GgmlType::kF32,  GgmlType::kF16,    GgmlType::kBF16,  GgmlType::kQ8_0,
                            GgmlType::kQ4_0, GgmlType::kQ4_1,   GgmlType::kQ5_0,  GgmlType::kQ5_1,
                            GgmlType::kQ2_K, GgmlType::kQ3_K,   GgmlType::kQ4_K,  GgmlType::kQ5_K,
                            GgmlType::kQ6_K, GgmlType::kIQ4_NL, GgmlType::kIQ4_XS};
  uint32_t seed = 1;
  for (GgmlType t : types) {
    const int64_t rows = 7, cols = 768;
    const std::vector<uint8_t> bytes = random_weights(t, rows, cols, seed++);
    model::WeightView w;
    w.name = "random." + model::type_name(t);
    w.type = t;
    w.ne[0] = cols;
    w.ne[1] = rows;
    w.data = bytes.data();
    expect_dequant_matches(w, 0);
    expect_dequant_matches(w, 1);  // rows at an odd address: loads are bytewise
  }
}

TEST(GpuOps, DequantizeMatchesGetRowOnRealGgufTensors) {
  TROUPE_REQUIRE_GPU();
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string files[] = {shared + "/models/stories260K/stories260K.gguf",
                               shared + "/models/synth/llama-dense-f16/model.gguf",
                               shared + "/models/synth/llama-dense/model.gguf"};
  int checked = 0;
  for (const std::string& path : files) {
    if (!::troupe::testing::file_exists(path)) continue;
    auto file = model::GgufFile::open(path);
    ASSERT_TRUE(file.has_value()) << file.error().message;
    for (const model::TensorInfo& t : (*file)->tensors()) {
      if (!dequantize_supported(t.type)) continue;
      model::WeightView w;
      w.name = path + ":" + t.name;
      w.type = t.type;
      w.ne[0] = t.ne[0];
      w.ne[1] = t.ne[1] * t.ne[2] * t.ne[3];
      w.data = t.data;
      expect_dequant_matches(w, 0);
      ++checked;
    }
  }
  if (checked == 0) GTEST_SKIP() << "no GGUF model with dequantizable tensors under " << shared;
}

TEST(GpuOps, DequantizeRejectsUnsupportedType) {
  expect_input_error(
      [] { dequantize_to_bf16(nullptr, 0, GgmlType::kQ8_1, 1, 256, nullptr, nullptr); },
      "type q8_1 is not supported");
}

TEST(GpuOps, DequantizeRejectsColsOffTheBlockSize) {
  expect_input_error(
      [] { dequantize_to_bf16(nullptr, 1 << 20, GgmlType::kQ4_K, 2, 100, nullptr, nullptr); },
      "cols (100) must be a multiple of 256 for q4_K");
}

TEST(GpuOps, DequantizeRejectsShortSource) {
  expect_input_error(
      [] { dequantize_to_bf16(nullptr, 33, GgmlType::kQ8_0, 1, 32, nullptr, nullptr); },
      "needs 34 bytes, src has 33");
}

// ---- embed_rows ----

TEST(GpuOps, EmbedRowsCopiesRowsAndMakesBadIdsNaN) {
  TROUPE_REQUIRE_GPU();
  const int64_t n_vocab = 50, n_embd = 300;
  const std::vector<float> table = bf16_of(random_floats(n_vocab * n_embd, 3));
  const std::vector<int32_t> ids = {3, 0, 49, -1, 50, 7, 3};
  DeviceBuffer<__nv_bfloat16> d_table = upload(to_bf16(table));
  DeviceBuffer<int32_t> d_ids = upload(ids);
  DeviceBuffer<float> out(ids.size() * n_embd);
  out.fill_bytes(0xFF);
  embed_rows(d_table.get(), n_vocab, n_embd, d_ids.get(), static_cast<int64_t>(ids.size()),
             out.get(), nullptr);
  TROUPE_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = out.download();
  for (size_t t = 0; t < ids.size(); ++t) {
    const std::vector<float> row(got.begin() + t * n_embd, got.begin() + (t + 1) * n_embd);
    if (ids[t] < 0 || ids[t] >= n_vocab) {
      for (float v : row) ASSERT_TRUE(std::isnan(v)) << "token " << t << " id " << ids[t];
    } else {
      const std::vector<float> want(table.begin() + ids[t] * n_embd,
                                    table.begin() + (ids[t] + 1) * n_embd);
      EXPECT_TRUE(all_close(row, want, 0, 0, "embedding row"));
    }
  }
}

TEST(GpuOps, EmbedRowsRejectsEmptyTable) {
  expect_input_error([] { embed_rows(nullptr, 0, 64, nullptr, 1, nullptr, nullptr); },
                     "table shape [0, 64] is empty");
}

// ---- add_rms_norm ----

struct NormCase {
  int64_t rows, width;
  bool with_delta;
};

TEST(GpuOps, AddRmsNormMatchesCpu) {
  TROUPE_REQUIRE_GPU();
  const NormCase cases[] = {{7, 1000, true}, {3, 4096, false}, {1, 1, true}, {2, 8192, true}};
  const float eps = 1e-5f;
  uint64_t seed = 10;
  for (const NormCase& c : cases) {
    SCOPED_TRACE("rows " + std::to_string(c.rows) + " width " + std::to_string(c.width));
    const size_t n = static_cast<size_t>(c.rows * c.width);
    const std::vector<float> x = random_floats(n, seed++, -3, 3);
    const std::vector<float> delta = random_floats(n, seed++, -1, 1);
    const std::vector<float> w = random_floats(static_cast<size_t>(c.width), seed++, 0.5f, 1.5f);
    // CPU: the engine's residual add, then detail::rms_norm per row.
    std::vector<float> x_new = x, want(n);
    if (c.with_delta)
      for (size_t i = 0; i < n; ++i) x_new[i] += delta[i];
    for (int64_t r = 0; r < c.rows; ++r)
      ref_rms_norm(&x_new[r * c.width], w.data(), &want[r * c.width], c.width, eps);

    DeviceBuffer<float> d_delta = upload(delta), d_w = upload(w);
    const float* dp = c.with_delta ? d_delta.get() : nullptr;
    {  // bf16 out
      DeviceBuffer<float> d_x = upload(x);
      DeviceBuffer<__nv_bfloat16> out(n);
      out.fill_bytes(0xFF);
      add_rms_norm(d_x.get(), dp, d_w.get(), c.rows, c.width, eps, out.get(), nullptr);
      TROUPE_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_TRUE(all_close(d_x.download(), x_new, 0, 0, "residual"));
      EXPECT_TRUE(all_close(from_bf16(out.download()), want, kBf16Rtol, 1e-30f, "bf16 out"));
    }
    {  // f32 out: the CPU's value (the double sum's order can move the mean by one ulp at most)
      DeviceBuffer<float> d_x = upload(x);
      DeviceBuffer<float> out(n);
      out.fill_bytes(0xFF);
      add_rms_norm(d_x.get(), dp, d_w.get(), c.rows, c.width, eps, out.get(), nullptr);
      TROUPE_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_TRUE(all_close(d_x.download(), x_new, 0, 0, "residual"));
      EXPECT_TRUE(all_close(out.download(), want, 1e-6f, 1e-30f, "f32 out"));
    }
  }
}

TEST(GpuOps, AddRmsNormRowDoesNotDependOnTheBatch) {
  TROUPE_REQUIRE_GPU();
  const int64_t rows = 9, width = 2048;
  const std::vector<float> x = random_floats(rows * width, 21, -2, 2);
  const std::vector<float> delta = random_floats(rows * width, 22);
  const std::vector<float> w = random_floats(width, 23, 0.5f, 1.5f);
  DeviceBuffer<float> d_delta = upload(delta), d_w = upload(w);
  DeviceBuffer<float> all_x = upload(x), one_x = upload(x);
  DeviceBuffer<float> all_out(rows * width), one_out(rows * width);
  all_out.fill_bytes(0xFF);
  one_out.fill_bytes(0xFF);
  add_rms_norm(all_x.get(), d_delta.get(), d_w.get(), rows, width, 1e-6f, all_out.get(), nullptr);
  for (int64_t r = 0; r < rows; ++r)  // one launch per row
    add_rms_norm(one_x.get() + r * width, d_delta.get() + r * width, d_w.get(), 1, width, 1e-6f,
                 one_out.get() + r * width, nullptr);
  TROUPE_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> a = all_out.download(), b = one_out.download();
  ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  for (float v : a) ASSERT_FALSE(std::isnan(v));
}

TEST(GpuOps, AddRmsNormRejectsZeroWidth) {
  expect_input_error(
      [] {
        add_rms_norm(nullptr, nullptr, nullptr, 1, 0, 1e-5f, static_cast<float*>(nullptr), nullptr);
      },
      "width must be in [1, 1048576], got 0");
}

// ---- rope_qkv_write ----

TEST(GpuOps, RopeTableEqualsTheEngineFormula) {
  const int64_t max_pos = 300, n_rot = 64;
  const float theta = 1e6f;
  const RopeTable t = make_rope_table(max_pos, n_rot, theta);
  ASSERT_EQ(t.cos.size(), static_cast<size_t>(max_pos * n_rot / 2));
  for (int64_t p = 0; p < max_pos; ++p) {
    for (int64_t i = 0; i < n_rot / 2; ++i) {  // compute/engine.cc
      const double freq = std::pow(static_cast<double>(theta),
                                   -2.0 * static_cast<double>(i) / static_cast<double>(n_rot));
      const double pos = static_cast<double>(p);
      ASSERT_EQ(t.cos[p * n_rot / 2 + i], static_cast<float>(std::cos(pos * freq)));
      ASSERT_EQ(t.sin[p * n_rot / 2 + i], static_cast<float>(std::sin(pos * freq)));
    }
  }
}

// A scaled model's table (YaRN here): model::rope_frequencies' pairs and magnitude, as the
// CPU engine (compute/engine.cc) builds its cos/sin.
TEST(GpuOps, ScaledRopeTableEqualsTheEngineFormula) {
  model::ModelSpec s;
  s.n_rot = 16;
  s.rope_theta = 1e4f;
  s.rope_scaling.type = model::RopeScalingType::kYarn;
  s.rope_scaling.factor = 4;
  s.rope_scaling.orig_ctx = 64;
  s.rope_scaling.attn_factor = 1.25;
  const model::RopeFrequencies f = model::rope_frequencies(s);
  const int64_t max_pos = 200, half = 8;
  const RopeTable t = make_rope_table(max_pos, f.inv_freq, f.mscale);
  ASSERT_EQ(t.n_rot, 16);
  ASSERT_EQ(t.cos.size(), static_cast<size_t>(max_pos * half));
  for (int64_t p = 0; p < max_pos; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(p) * f.inv_freq[static_cast<size_t>(i)];
      ASSERT_EQ(t.cos[p * half + i], static_cast<float>(1.25 * std::cos(a)));
      ASSERT_EQ(t.sin[p * half + i], static_cast<float>(1.25 * std::sin(a)));
    }
  }
  expect_input_error([&] { make_rope_table(max_pos, f.inv_freq, 0.0); },
                     "mscale must be finite and > 0, got 0");
  expect_input_error([&] { make_rope_table(max_pos, std::vector<double>{}, 1.0); },
                     "no rotary pairs");
}

struct RopeCase {
  bool neox, qk_norm, bias;
  int64_t head_dim, n_rot;
};

std::string rope_case_name(const RopeCase& c) {
  return std::string(c.neox ? "neox" : "normal") + (c.qk_norm ? "+qknorm" : "") +
         (c.bias ? "+bias" : "") + " head_dim " + std::to_string(c.head_dim) + " n_rot " +
         std::to_string(c.n_rot);
}

// Runs one case: 6 tokens, one padding (slot -1), one with a position past the table (bad when
// n_rot > 0), the rest in scattered slots; checks q, every written cache row and that no other
// cache row was touched.
void run_rope_case(const RopeCase& c) {
  SCOPED_TRACE(rope_case_name(c));
  const int64_t T = 6, H = 4, HK = 2, D = c.head_dim, max_pos = 128;
  const int64_t num_blocks = 5, block_size = 4, num_slots = num_blocks * block_size;
  const int64_t width = (H + 2 * HK) * D;
  const float eps = 1e-6f;
  const std::vector<int32_t> pos = {0, 1, 17, 127, 5, 200};  // 200 >= max_pos: bad
  const std::vector<int64_t> slots = {0, 13, 6, 19, -1, 2};  // token 4 is padding
  const std::vector<float> qkv = random_floats(T * width, 31, -2, 2);
  const std::vector<float> bias = random_floats(width, 32, -0.5f, 0.5f);
  const std::vector<float> qn = random_floats(D, 33, 0.5f, 1.5f);
  const std::vector<float> kn = random_floats(D, 34, 0.5f, 1.5f);
  const RopeTable table =
      c.n_rot > 0 ? make_rope_table(max_pos, c.n_rot, 10000.f) : RopeTable{{0.f}, {0.f}, 1, 0};

  // CPU: the engine's attention() prologue, per token.
  std::vector<float> want_q(T * H * D, kNaN), want_k(num_slots * HK * D, kNaN),
      want_v(num_slots * HK * D, kNaN);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> x(qkv.begin() + t * width, qkv.begin() + (t + 1) * width);
    if (c.bias)
      for (int64_t i = 0; i < width; ++i) x[i] += bias[i];
    if (c.qk_norm) {
      for (int64_t h = 0; h < H; ++h) ref_rms_norm(&x[h * D], qn.data(), &x[h * D], D, eps);
      for (int64_t h = H; h < H + HK; ++h) ref_rms_norm(&x[h * D], kn.data(), &x[h * D], D, eps);
    }
    const bool bad = c.n_rot > 0 && pos[t] >= max_pos;  // positions matter only with rope
    if (!bad && c.n_rot > 0) {
      const float* cs = &table.cos[pos[t] * c.n_rot / 2];
      const float* sn = &table.sin[pos[t] * c.n_rot / 2];
      for (int64_t h = 0; h < H + HK; ++h) ref_rope_cs(&x[h * D], c.n_rot, cs, sn, c.neox);
    }
    for (int64_t i = 0; i < H * D; ++i) want_q[t * H * D + i] = bad ? kNaN : x[i];
    if (slots[t] < 0) continue;
    for (int64_t i = 0; i < HK * D; ++i) {
      want_k[slots[t] * HK * D + i] = bad ? kNaN : x[H * D + i];
      want_v[slots[t] * HK * D + i] = bad ? kNaN : x[(H + HK) * D + i];
    }
  }

  DeviceBuffer<float> d_qkv = upload(qkv), d_bias = upload(bias), d_qn = upload(qn),
                      d_kn = upload(kn), d_cos = upload(table.cos), d_sin = upload(table.sin);
  DeviceBuffer<int32_t> d_pos = upload(pos);
  DeviceBuffer<int64_t> d_slots = upload(slots);
  DeviceBuffer<__nv_bfloat16> q(T * H * D), k(num_slots * HK * D), v(num_slots * HK * D);
  q.fill_bytes(0xFF);
  k.fill_bytes(0xFF);
  v.fill_bytes(0xFF);
  RopeQkvArgs a;
  a.qkv = d_qkv.get();
  a.bias = c.bias ? d_bias.get() : nullptr;
  a.num_tokens = T;
  a.n_head = H;
  a.n_head_kv = HK;
  a.head_dim = D;
  a.q_norm = c.qk_norm ? d_qn.get() : nullptr;
  a.k_norm = c.qk_norm ? d_kn.get() : nullptr;
  a.norm_eps = eps;
  a.n_rot = c.n_rot;
  a.neox = c.neox;
  a.rope_cos = d_cos.get();
  a.rope_sin = d_sin.get();
  a.max_pos = max_pos;
  a.positions = d_pos.get();
  a.slots = d_slots.get();
  a.q_out = q.get();
  a.kv = PagedKv{k.get(), v.get(), num_blocks, block_size, HK, D};
  rope_qkv_write(a, nullptr);
  TROUPE_CUDA_CHECK(cudaDeviceSynchronize());

  // Rows that must be NaN (bad position, untouched cache rows) are checked apart; the rest are
  // exact bf16 of the CPU value without q/k norm, within the bf16 bound with it.
  const auto check = [&](const std::vector<float>& got, const std::vector<float>& want,
                         const char* what) {
    std::vector<float> g, w;
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::isnan(want[i])) {
        ASSERT_TRUE(std::isnan(got[i])) << what << "[" << i << "] should be NaN, got " << got[i];
      } else {
        g.push_back(got[i]);
        w.push_back(c.qk_norm ? want[i] : from_bf16(to_bf16(want[i])));
      }
    }
    EXPECT_TRUE(all_close(g, w, c.qk_norm ? kBf16Rtol : 0, c.qk_norm ? 1e-30f : 0, what));
  };
  check(from_bf16(q.download()), want_q, "q");
  check(from_bf16(k.download()), want_k, "k cache");
  check(from_bf16(v.download()), want_v, "v cache");
}

TEST(GpuOps, RopeQkvWriteMatchesCpu) {
  TROUPE_REQUIRE_GPU();
  const RopeCase cases[] = {
      {true, false, false, 128, 128}, {false, false, false, 128, 128},
      {true, true, false, 128, 128},  {false, true, true, 64, 64},
      {true, false, true, 96, 32},    {false, false, false, 80, 0},
  };
  for (const RopeCase& c : cases) run_rope_case(c);
}

TEST(GpuOps, RopeQkvWriteRejectsCacheShapeMismatch) {
  RopeQkvArgs a;
  a.num_tokens = 1;
  a.n_head = 4;
  a.n_head_kv = 2;
  a.head_dim = 64;
  a.kv = PagedKv{nullptr, nullptr, 4, 16, 2, 128};
  expect_input_error([&] { rope_qkv_write(a, nullptr); },
                     "cache is [n_head_kv 2, head_dim 128], the heads are [2, 64]");
}

TEST(GpuOps, RopeQkvWriteRejectsOddRotation) {
  RopeQkvArgs a;
  a.num_tokens = 1;
  a.n_head = 4;
  a.n_head_kv = 2;
  a.head_dim = 64;
  a.n_rot = 33;
  a.kv = PagedKv{nullptr, nullptr, 4, 16, 2, 64};
  expect_input_error([&] { rope_qkv_write(a, nullptr); },
                     "n_rot must be even and in [0, head_dim = 64], got 33");
}

// ---- swiglu, add, casts ----

TEST(GpuOps, SwigluMatchesCpu) {
  TROUPE_REQUIRE_GPU();
  const int64_t rows = 5, ff = 1111;
  const std::vector<float> gate = random_floats(rows * ff, 41, -12, 12);
  const std::vector<float> up = random_floats(rows * ff, 42, -3, 3);
  std::vector<float> fused(rows * 2 * ff), want(rows * ff);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < ff; ++i) {
      fused[r * 2 * ff + i] = gate[r * ff + i];
      fused[r * 2 * ff + ff + i] = up[r * ff + i];
      want[r * ff + i] = ref_silu(gate[r * ff + i]) * up[r * ff + i];
    }
  }
  DeviceBuffer<float> d_fused = upload(fused), d_gate = upload(gate), d_up = upload(up);
  DeviceBuffer<__nv_bfloat16> out(rows * ff);
  out.fill_bytes(0xFF);
  swiglu(d_fused.get(), rows, ff, out.get(), nullptr);
  TROUPE_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(all_close(from_bf16(out.download()), want, kBf16Rtol, 1e-30f, "fused"));
  out.fill_bytes(0xFF);
  swiglu(d_gate.get(), d_up.get(), rows, ff, out.get(), nullptr);
  TROUPE_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(all_close(from_bf16(out.download()), want, kBf16Rtol, 1e-30f, "split"));
}

TEST(GpuOps, AddInplaceAndCastsAreExact) {
  TROUPE_REQUIRE_GPU();
  const int64_t n = 100003;
  const std::vector<float> x = random_floats(n, 51, -100, 100), d = random_floats(n, 52);
  std::vector<float> sum(n);
  for (int64_t i = 0; i < n; ++i) sum[i] = x[i] + d[i];
  DeviceBuffer<float> d_x = upload(x), d_d = upload(d);
  add_inplace(d_x.get(), d_d.get(), n, nullptr);
  DeviceBuffer<__nv_bfloat16> b(n);
  b.fill_bytes(0xFF);
  cast_f32_to_bf16(d_x.get(), n, b.get(), nullptr);
  DeviceBuffer<float> back(n);
  back.fill_bytes(0xFF);
  cast_bf16_to_f32(b.get(), n, back.get(), nullptr);
  TROUPE_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(all_close(d_x.download(), sum, 0, 0, "add_inplace"));
  EXPECT_TRUE(all_close(back.download(), bf16_of(sum), 0, 0, "casts"));
}

TEST(GpuOps, ElementwiseRejectsNegativeCount) {
  expect_input_error([] { add_inplace(nullptr, nullptr, -1, nullptr); },
                     "add_inplace: element count must be >= 0, got -1");
  expect_input_error([] { swiglu(nullptr, 2, -3, nullptr, nullptr); },
                     "swiglu: shape [2, -3] is negative");
}

}  // namespace
}  // namespace troupe::gpu
