// GgufWriter round trips: every metadata type, every writable tensor type, alignment, streaming
// fills, and the writer's own argument checks. Files go to a per-test temporary directory.
#include "model/gguf_writer.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>

#include "model/gguf.h"
#include "tests/test_support.h"

namespace troupe::model {
namespace {

// A per-process scratch directory, removed at exit.
struct ScratchDir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("troupe_gguf_writer_" + std::to_string(::getpid()));
  ScratchDir() { std::filesystem::create_directories(path); }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

std::string temp_path(const std::string& name) {
  static const ScratchDir dir;
  return (dir.path / name).string();
}

std::unique_ptr<GgufFile> write_and_open(const GgufWriter& w, const std::string& name) {
  const std::string path = temp_path(name);
  Status s = w.write(path);
  EXPECT_TRUE(s.has_value()) << s.error().message;
  auto f = GgufFile::open(path);
  EXPECT_TRUE(f.has_value()) << f.error().message;
  if (!f.has_value()) return nullptr;
  EXPECT_EQ(std::filesystem::file_size(path), w.file_size());
  return std::move(f).value();
}

TEST(GgufWriter, RoundTripsEveryMetadataType) {
  GgufWriter w;
  w.set_u8("k.u8", 200);
  w.set_i8("k.i8", -100);
  w.set_u16("k.u16", 65000);
  w.set_i16("k.i16", -32000);
  w.set_u32("k.u32", 4000000000u);
  w.set_i32("k.i32", -2000000000);
  w.set_u64("k.u64", 18000000000000000000ull);
  w.set_i64("k.i64", -9000000000000000000ll);
  w.set_f32("k.f32", 1.5f);
  w.set_f64("k.f64", -2.25e300);
  w.set_bool("k.true", true);
  w.set_bool("k.false", false);
  w.set_string("k.str", "héllo");
  w.set_string("k.empty", "");
  const std::vector<int32_t> ai = {1, -2, 3};
  const std::vector<uint32_t> au = {7, 8};
  const std::vector<float> af = {0.5f, -1.f, 3.25f, 1e-3f};
  const bool ab[] = {true, false, true};
  const std::vector<std::string> as = {"a", "", "Ġthe", std::string("x\0y", 3)};
  const uint16_t a16[] = {1, 65535};
  const double a64[] = {1.0 / 3.0};
  w.set_array_i32("a.i32", ai);
  w.set_array_u32("a.u32", au);
  w.set_array_f32("a.f32", af);
  w.set_array_bool("a.bool", ab);
  w.set_string_array("a.str", as);
  w.set_array("a.u16", GgufType::kU16, a16, 2);
  w.set_array("a.f64", GgufType::kF64, a64, 1);
  w.set_array("a.empty", GgufType::kI64, nullptr, 0);
  w.set_string_array("a.nostr", std::span<const std::string>());
  EXPECT_EQ(w.num_keys(), 23u);

  auto f = write_and_open(w, "meta.gguf");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->metadata().size(), 23u);
  EXPECT_EQ(f->find("k.u8")->type, GgufType::kU8);
  EXPECT_EQ(f->get_int("k.u8"), 200);
  EXPECT_EQ(f->get_int("k.i8"), -100);
  EXPECT_EQ(f->get_int("k.u16"), 65000);
  EXPECT_EQ(f->get_int("k.i16"), -32000);
  EXPECT_EQ(f->get_int("k.u32"), 4000000000ll);
  EXPECT_EQ(f->get_int("k.i32"), -2000000000);
  EXPECT_EQ(f->find("k.u64")->u, 18000000000000000000ull);
  EXPECT_EQ(f->get_int("k.i64"), -9000000000000000000ll);
  EXPECT_EQ(f->find("k.f32")->type, GgufType::kF32);
  EXPECT_EQ(f->get_float("k.f32"), 1.5);
  EXPECT_EQ(f->find("k.f64")->type, GgufType::kF64);
  EXPECT_EQ(f->get_float("k.f64"), -2.25e300);
  EXPECT_TRUE(f->get_bool("k.true"));
  EXPECT_FALSE(f->get_bool("k.false"));
  EXPECT_EQ(f->get_string("k.str"), "héllo");
  EXPECT_EQ(f->get_string("k.empty"), "");

  const GgufValue* v = f->find("a.i32");
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->type, GgufType::kArray);
  EXPECT_EQ(v->elem_type, GgufType::kI32);
  ASSERT_EQ(v->count, 3u);
  EXPECT_EQ(v->array_i64(1), -2);
  v = f->find("a.u32");
  ASSERT_EQ(v->count, 2u);
  EXPECT_EQ(v->array_i64(1), 8);
  v = f->find("a.f32");
  ASSERT_EQ(v->count, 4u);
  EXPECT_EQ(v->array_f64(2), 3.25);
  EXPECT_FLOAT_EQ(static_cast<float>(v->array_f64(3)), 1e-3f);
  v = f->find("a.bool");
  ASSERT_EQ(v->count, 3u);
  EXPECT_EQ(v->array_i64(0), 1);
  EXPECT_EQ(v->array_i64(1), 0);
  v = f->find("a.str");
  EXPECT_EQ(v->elem_type, GgufType::kString);
  ASSERT_EQ(v->strings.size(), 4u);
  EXPECT_EQ(v->strings[2], "Ġthe");
  EXPECT_EQ(v->strings[3], std::string_view("x\0y", 3));
  EXPECT_EQ(v->strings[1], "");
  v = f->find("a.u16");
  EXPECT_EQ(v->array_i64(1), 65535);
  v = f->find("a.f64");
  EXPECT_EQ(v->array_f64(0), 1.0 / 3.0);
  EXPECT_EQ(f->find("a.empty")->count, 0u);
  EXPECT_EQ(f->find("a.nostr")->count, 0u);
  EXPECT_TRUE(f->tensors().empty());
}

TEST(GgufWriter, SettingAKeyTwiceReplacesIt) {
  GgufWriter w;
  w.set_u32("a", 1);
  w.set_string("b", "x");
  w.set_string("a", "now a string");
  EXPECT_EQ(w.num_keys(), 2u);
  EXPECT_TRUE(w.has_key("a"));
  w.remove_key("b");
  EXPECT_FALSE(w.has_key("b"));
  auto f = write_and_open(w, "replace.gguf");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->get_string("a"), "now a string");
  EXPECT_EQ(f->find("b"), nullptr);
}

TEST(GgufWriter, CopyValueReproducesEveryType) {
  GgufWriter w;
  w.set_i16("s", -5);
  w.set_f64("d", 0.125);
  const std::vector<std::string> toks = {"<s>", "a b", "c"};
  w.set_string_array("toks", toks);
  const std::vector<float> sc = {1.f, 2.f, 3.f};
  w.set_array_f32("scores", sc);
  w.set_bool("flag", true);
  auto f = write_and_open(w, "copy_src.gguf");
  ASSERT_NE(f, nullptr);
  GgufWriter w2;
  for (const auto& [k, v] : f->metadata()) w2.copy_value(k, v);
  auto g = write_and_open(w2, "copy_dst.gguf");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->get_int("s"), -5);
  EXPECT_EQ(g->find("s")->type, GgufType::kI16);
  EXPECT_EQ(g->get_float("d"), 0.125);
  EXPECT_TRUE(g->get_bool("flag"));
  ASSERT_EQ(g->find("toks")->strings.size(), 3u);
  EXPECT_EQ(g->find("toks")->strings[1], "a b");
  EXPECT_EQ(g->find("scores")->array_f64(2), 3.0);
}

std::vector<float> ramp(int64_t n, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = scale * std::sin(0.37f * i + 0.1f);
  return v;
}

TEST(GgufWriter, TensorsOfEveryWritableTypeRoundTrip) {
  struct Case {
    GgmlType type;
    float tol;  // max abs error relative to the value range (1.0)
  };
  const Case cases[] = {{GgmlType::kF32, 0.f},
                        {GgmlType::kF16, 1e-3f},
                        {GgmlType::kBF16, 8e-3f},
                        {GgmlType::kQ8_0, 1e-2f},
                        {GgmlType::kQ4_0, 0.15f}};
  GgufWriter w;
  const int64_t shape[] = {64, 3, 2};
  const std::vector<float> src = ramp(64 * 3 * 2, 1.f);
  for (const Case& c : cases) {
    ASSERT_TRUE(w.add_tensor_f32("t." + type_name(c.type), c.type, shape, src).has_value());
  }
  auto f = write_and_open(w, "types.gguf");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(f->tensors().size(), 5u);
  for (const Case& c : cases) {
    const TensorInfo* t = f->find_tensor("t." + type_name(c.type));
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->type, c.type);
    EXPECT_EQ(t->n_dims, 3);
    EXPECT_EQ(t->shape_string(), "[64, 3, 2]");
    EXPECT_EQ(t->offset % 32, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % 32, 0u);
    std::vector<float> back(src.size());
    dequantize_row(t->type, t->data, back.data(), static_cast<int64_t>(back.size()));
    float err = 0.f;
    for (size_t i = 0; i < src.size(); ++i) err = std::max(err, std::fabs(back[i] - src[i]));
    EXPECT_LE(err, c.tol) << type_name(c.type);
  }
}

// The K-quant writers (synth's q4_K, q5_K and q6_K): each value comes back within half a step of
// its group's grid, whatever the groups' magnitudes (spread over 4 decades here, as scales
// are relative to one f16 per 256 values), and all-zero blocks stay zero.
TEST(GgufWriter, KQuantsRoundTripWithinTheirSteps) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> src(4 * 256);
  for (size_t i = 0; i < src.size(); ++i) {
    const int group = static_cast<int>(i / 16);
    src[i] = normal(rng) * std::pow(10.f, static_cast<float>(group % 5) - 3.f);
  }
  std::fill(src.begin() + 512, src.begin() + 768, 0.f);  // the third block: zeros
  for (GgmlType t :
       {GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    std::vector<uint8_t> q(static_cast<size_t>(row_bytes(t, 1024)));
    quantize_row(t, src.data(), q.data(), 1024);
    std::vector<float> back(src.size());
    dequantize_row(t, q.data(), back.data(), 1024);
    double err2 = 0, ref2 = 0;
    for (int b = 0; b < 4; ++b) {
      float amax = 0.f;
      for (int i = 0; i < 256; ++i) amax = std::max(amax, std::fabs(src[256 * b + i]));
      // Q6_K: 64 levels per group (step <= amax_g / 32, scale rounded to 8 bits); Q4_K: 16
      // levels over each 32-value range (<= 2 amax / 15), its min rounded to 6 bits of dmin;
      // Q5_K: likewise with 32 levels (<= 2 amax / 31). Q3_K: 8 levels per group (step
      // amax_g / 4; the largest value of the other sign clamps to a whole step), scale rounded
      // to 6 bits; Q2_K: 4 levels over each 16-value range (<= 2 amax_g / 3), scale and min
      // rounded to 4 bits of d and dmin.
      for (int g = 0; g < 16; ++g) {
        float gmax = 0.f;
        for (int i = 0; i < 16; ++i) gmax = std::max(gmax, std::fabs(src[256 * b + 16 * g + i]));
        for (int i = 0; i < 16; ++i) {
          const size_t k = static_cast<size_t>(256 * b + 16 * g + i);
          const float tol = t == GgmlType::kQ6_K   ? 0.02f * gmax + 5e-3f * amax
                            : t == GgmlType::kQ5_K ? 0.06f * amax
                            : t == GgmlType::kQ4_K ? 0.09f * amax
                            : t == GgmlType::kQ3_K ? 0.26f * gmax + 0.02f * amax
                                                   : 0.35f * gmax + 0.12f * amax;
          ASSERT_LE(std::fabs(back[k] - src[k]), tol) << type_name(t) << " value " << k;
          err2 += (back[k] - src[k]) * (back[k] - src[k]);
          ref2 += src[k] * src[k];
        }
      }
    }
    for (int i = 512; i < 768; ++i) ASSERT_EQ(back[static_cast<size_t>(i)], 0.f) << type_name(t);
    // Uniform rounding's step / sqrt(12) over these groups: ~2 %, ~5 % and ~9 % of the RMS value
    // for Q6_K, Q5_K and Q4_K; Q3_K and Q2_K as measured, with room.
    const double rms_bound = t == GgmlType::kQ6_K   ? 0.03
                             : t == GgmlType::kQ5_K ? 0.06
                             : t == GgmlType::kQ4_K ? 0.11
                             : t == GgmlType::kQ3_K ? 0.2
                                                    : 0.4;
    std::printf("%s: RMS error %.4f of the RMS value\n", type_name(t).c_str(),
                std::sqrt(err2 / ref2));
    EXPECT_LT(std::sqrt(err2 / ref2), rms_bound) << type_name(t);
  }
}

TEST(GgufWriter, RawBytesAndFillCallbacksRoundTrip) {
  GgufWriter w;
  std::vector<uint8_t> raw(7 * 2);  // i16 needs no conversion: any bytes are valid
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<uint8_t>(i * 11);
  const int64_t s1[] = {7};
  ASSERT_TRUE(w.add_tensor("raw", GgmlType::kI16, s1, raw).has_value());
  // 1000 rows of 4 f32: fill writes each row's index, called in whatever chunks write() picks.
  const int64_t s2[] = {4, 10, 10, 10};
  int calls = 0;
  ASSERT_TRUE(
      w.add_tensor("filled", GgmlType::kF32, s2, [&calls](int64_t r0, int64_t n, uint8_t* dst) {
         ++calls;
         auto* f = reinterpret_cast<float*>(dst);
         for (int64_t r = 0; r < n; ++r)
           for (int j = 0; j < 4; ++j) f[r * 4 + j] = static_cast<float>(r0 + r);
       }).has_value());
  auto f = write_and_open(w, "fill.gguf");
  ASSERT_NE(f, nullptr);
  EXPECT_GE(calls, 1);
  const TensorInfo* t = f->find_tensor("raw");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(std::vector<uint8_t>(t->data, t->data + t->nbytes), raw);
  t = f->find_tensor("filled");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->n_dims, 4);
  const auto* fl = reinterpret_cast<const float*>(t->data);
  EXPECT_EQ(fl[0], 0.f);
  EXPECT_EQ(fl[4 * 999 + 3], 999.f);
  EXPECT_EQ(fl[4 * 500], 500.f);
}

TEST(GgufWriter, HonoursCustomAlignment) {
  for (uint32_t a : {8u, 64u, 4096u}) {
    GgufWriter w;
    w.set_alignment(a);
    w.set_string("general.architecture", "test");
    const int64_t s[] = {3};
    const std::vector<float> x = {1, 2, 3};
    ASSERT_TRUE(w.add_tensor_f32("a", GgmlType::kF32, s, x).has_value());
    ASSERT_TRUE(w.add_tensor_f32("b", GgmlType::kF32, s, x).has_value());
    auto f = write_and_open(w, "align" + std::to_string(a) + ".gguf");
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(f->alignment(), a);
    EXPECT_EQ(f->data_offset() % a, 0u);
    const TensorInfo* b = f->find_tensor("b");
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->offset, (12 + a - 1) / a * a);
    float last;  // alignment 1 leaves the data unaligned: copy, do not dereference
    std::memcpy(&last, b->data + 8, 4);
    EXPECT_EQ(last, 3.f);
  }
}

TEST(GgufWriter, LargeTensorIsStreamedInChunks) {
  // 48 MiB of f16 rows: write() must call the fill more than once (it buffers ~16 MiB).
  GgufWriter w;
  const int64_t s[] = {4096, 6144};
  int calls = 0;
  ASSERT_TRUE(w.add_tensor("big", GgmlType::kF16, s, [&calls](int64_t r0, int64_t n, uint8_t* dst) {
                 ++calls;
                 auto* h = reinterpret_cast<uint16_t*>(dst);
                 for (int64_t r = 0; r < n; ++r)
                   h[r * 4096] = fp32_to_fp16(static_cast<float>((r0 + r) % 1000));
               }).has_value());
  auto f = write_and_open(w, "big.gguf");
  ASSERT_NE(f, nullptr);
  EXPECT_GE(calls, 3);
  const TensorInfo* t = f->find_tensor("big");
  const auto* h = reinterpret_cast<const uint16_t*>(t->data);
  EXPECT_EQ(fp16_to_fp32(h[4096 * 6143]), 143.f);
  std::filesystem::remove(temp_path("big.gguf"));
}

TEST(GgufWriter, RejectsBadTensors) {
  GgufWriter w;
  const int64_t s[] = {32};
  const std::vector<float> x(32, 1.f);
  ASSERT_TRUE(w.add_tensor_f32("x", GgmlType::kQ8_0, s, x).has_value());
  auto dup = w.add_tensor_f32("x", GgmlType::kF32, s, x);
  ASSERT_FALSE(dup.has_value());
  EXPECT_EQ(dup.error().message, "duplicate tensor 'x'");
  const int64_t odd[] = {33};
  const std::vector<float> y(33, 1.f);
  auto r = w.add_tensor_f32("odd", GgmlType::kQ4_0, odd, y);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().message,
            "tensor 'odd': row of 33 elements is not a multiple of the q4_0 block size 32");
  const int64_t zero[] = {4, 0};
  EXPECT_FALSE(w.add_tensor("z", GgmlType::kF32, zero, std::span<const uint8_t>()).has_value());
  const int64_t five[] = {1, 1, 1, 1, 1};
  EXPECT_FALSE(w.add_tensor("five", GgmlType::kF32, five, std::span<const uint8_t>()).has_value());
  const std::vector<uint8_t> small(3);
  auto sz = w.add_tensor("short", GgmlType::kF32, s, small);
  ASSERT_FALSE(sz.has_value());
  EXPECT_EQ(sz.error().message, "tensor 'short' (f32): 3 bytes given, 128 needed");
  EXPECT_FALSE(w.add_tensor_f32(std::string(64, 'n'), GgmlType::kF32, s, x).has_value());
  EXPECT_FALSE(w.add_tensor_f32("q4k", GgmlType::kQ4_K, s, x).has_value());
  EXPECT_EQ(w.num_tensors(), 1u);
  EXPECT_THROW(w.set_alignment(3), InternalError);
}

TEST(GgufWriter, FailedWriteLeavesNoFile) {
  GgufWriter w;
  const int64_t s[] = {4};
  ASSERT_TRUE(w.add_tensor("boom", GgmlType::kF32, s, [](int64_t, int64_t, uint8_t*) {
                 throw InputError("fill failed");
               }).has_value());
  const std::string path = temp_path("boom.gguf");
  Status st = w.write(path);
  ASSERT_FALSE(st.has_value());
  EXPECT_EQ(st.error().message, path + ": fill failed");
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  Status bad = GgufWriter().write("/nonexistent-dir/x.gguf");
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("/nonexistent-dir/x.gguf"), std::string::npos);
}

}  // namespace
}  // namespace troupe::model
