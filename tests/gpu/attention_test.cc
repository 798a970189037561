// Paged attention on the GPU (gpu/attention.h) against a CPU reference written here: f32 math on
// the same bf16-rounded inputs, the formula of compute/engine.cc attend() (softmax of q.k * scale
// over positions 0..p, weighted sum of values). Also: batch and chunked-prefill invariance
// (bitwise) and argument validation (host only: those tests run without a GPU).
//
// Tolerances: both sides read identical bf16 inputs and accumulate in f32; they differ only in
// summation order, exp vs exp2 and the folding of the scale (relative error ~1e-6 per output,
// ~1e-5 after 2000-key sums). f32 output: rtol 1e-3, atol 1e-4 (a wrong mask, slot or split drops
// or adds a key: errors of 1e-2 and more at the short lengths, where one key weighs >= 1/17).
// bf16 output adds the output rounding, at most 2^-8 relative: rtol 8e-3, atol 2e-4.
#include "gpu/attention.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/check.h"
#include "gpu/runtime.h"
#include "tests/gpu/gpu_test_util.h"

namespace troupe::gpu {
namespace {

using testing::all_close;
using testing::from_bf16;
using testing::random_floats;
using testing::to_bf16;

constexpr float kRtolF32 = 1e-3f, kAtolF32 = 1e-4f;
constexpr float kRtolBf16 = 8e-3f, kAtolBf16 = 2e-4f;
const float kNaN = std::numeric_limits<float>::quiet_NaN();

struct SeqSpec {
  int32_t pos0;
  int32_t q_len;
};

// Context lengths 1, 7, 16, 17, 300, 2000 and 20000 (decode chunks of 512); q_len 1 (decode) and
// > 1 (prefill), pos0 > 0 (a later chunk of a chunked prefill).
const std::vector<SeqSpec> kMixedSeqs = {{0, 1},   {0, 7},   {9, 7},    {16, 1},     {0, 17},
                                         {0, 300}, {299, 1}, {1999, 1}, {1700, 300}, {19999, 1}};

// One layer's cache and one step's queries, on the host. GQA: k, v are
// [num_slots, n_head_kv, dk]. MLA (n_head_kv 1, dk = lora + rope, dv = lora): k is the latent
// cache, v is empty (the values are k's first dv columns). Slots that no position of a sequence
// uses hold NaN: reading one poisons the output.
struct Problem {
  bool mla = false;
  int32_t n_head = 0, n_head_kv = 0, dk = 0, dv = 0, block_size = 0;
  std::vector<SeqSpec> seqs;
  std::vector<int64_t> q_start;  // first q row of each sequence
  int64_t n_tok = 0;
  int32_t max_blocks = 0;
  std::vector<int32_t> table;  // [n_seqs, max_blocks], shuffled block ids, -1 past the need
  int64_t num_slots = 0;
  std::vector<float> q, k, v;  // bf16-rounded values
  std::vector<__nv_bfloat16> q_bf, k_bf, v_bf;

  int64_t slot(size_t s, int64_t pos) const {
    return static_cast<int64_t>(
               table[s * static_cast<size_t>(max_blocks) + static_cast<size_t>(pos / block_size)]) *
               block_size +
           pos % block_size;
  }
  int64_t k_width() const { return mla ? dk : static_cast<int64_t>(n_head_kv) * dk; }
  int64_t v_width() const { return mla ? 0 : static_cast<int64_t>(n_head_kv) * dv; }
};

Problem make_problem(bool mla, int32_t n_head, int32_t n_head_kv, int32_t dk, int32_t dv,
                     int32_t block_size, std::vector<SeqSpec> seqs, uint64_t seed) {
  Problem pb;
  pb.mla = mla;
  pb.n_head = n_head;
  pb.n_head_kv = n_head_kv;
  pb.dk = dk;
  pb.dv = dv;
  pb.block_size = block_size;
  pb.seqs = std::move(seqs);
  std::vector<int32_t> need;
  int64_t total_blocks = 0;
  for (const SeqSpec& s : pb.seqs) {
    pb.q_start.push_back(pb.n_tok);
    pb.n_tok += s.q_len;
    const int64_t kv_len = static_cast<int64_t>(s.pos0) + s.q_len;
    need.push_back(static_cast<int32_t>((kv_len + block_size - 1) / block_size));
    total_blocks += need.back();
  }
  total_blocks += 3;  // blocks no sequence owns
  std::vector<int32_t> ids(static_cast<size_t>(total_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937_64 shuffle_rng(seed);
  std::shuffle(ids.begin(), ids.end(), shuffle_rng);
  pb.max_blocks = *std::max_element(need.begin(), need.end()) + 1;  // padded rows
  pb.table.assign(pb.seqs.size() * static_cast<size_t>(pb.max_blocks), -1);
  size_t next = 0;
  for (size_t s = 0; s < pb.seqs.size(); ++s)
    for (int32_t b = 0; b < need[s]; ++b)
      pb.table[s * static_cast<size_t>(pb.max_blocks) + static_cast<size_t>(b)] = ids[next++];
  pb.num_slots = total_blocks * block_size;

  const int64_t kw = pb.k_width(), vw = pb.v_width();
  pb.k.assign(static_cast<size_t>(pb.num_slots * kw), kNaN);
  pb.v.assign(static_cast<size_t>(pb.num_slots * vw), kNaN);
  std::mt19937_64 rng(seed + 1);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  auto bf = [](float x) { return from_bf16(to_bf16(x)); };
  for (size_t s = 0; s < pb.seqs.size(); ++s) {
    const int64_t kv_len = static_cast<int64_t>(pb.seqs[s].pos0) + pb.seqs[s].q_len;
    for (int64_t pos = 0; pos < kv_len; ++pos) {
      const int64_t sl = pb.slot(s, pos);
      for (int64_t i = 0; i < kw; ++i) pb.k[static_cast<size_t>(sl * kw + i)] = bf(dist(rng));
      for (int64_t i = 0; i < vw; ++i) pb.v[static_cast<size_t>(sl * vw + i)] = bf(dist(rng));
    }
  }
  // Queries in [-2, 2]: sharper softmax than [-1, 1], so masking mistakes show more.
  pb.q = testing::round_bf16(
      random_floats(static_cast<size_t>(pb.n_tok * n_head * dk), seed + 2, -2.f, 2.f));
  pb.q_bf = to_bf16(pb.q);
  pb.k_bf = to_bf16(pb.k);
  pb.v_bf = to_bf16(pb.v);
  return pb;
}

// f32 [n_tok, n_head, dv]: what compute/engine.cc computes, on the same bf16-rounded inputs.
std::vector<float> reference(const Problem& pb, float scale) {
  const int64_t H = pb.n_head, dk = pb.dk, dv = pb.dv;
  const int64_t group = H / pb.n_head_kv;
  const int64_t kw = pb.k_width(), vw = pb.v_width();
  std::vector<float> out(static_cast<size_t>(pb.n_tok * H * dv), 0.f);
  std::vector<float> sc;
  std::vector<int64_t> slots;
  for (size_t s = 0; s < pb.seqs.size(); ++s) {
    const int64_t kv_len = static_cast<int64_t>(pb.seqs[s].pos0) + pb.seqs[s].q_len;
    slots.resize(static_cast<size_t>(kv_len));
    for (int64_t j = 0; j < kv_len; ++j) slots[static_cast<size_t>(j)] = pb.slot(s, j);
    for (int64_t i = 0; i < pb.seqs[s].q_len; ++i) {
      const int64_t t = pb.q_start[s] + i;
      const int64_t n = pb.seqs[s].pos0 + i + 1;  // positions 0..pos
      for (int64_t h = 0; h < H; ++h) {
        const int64_t kvh = h / group;
        const float* qv = &pb.q[static_cast<size_t>((t * H + h) * dk)];
        auto key = [&](int64_t j) {
          return &pb.k[static_cast<size_t>(slots[static_cast<size_t>(j)] * kw + kvh * dk)];
        };
        auto value = [&](int64_t j) {
          return pb.mla ? &pb.k[static_cast<size_t>(slots[static_cast<size_t>(j)] * kw)]
                        : &pb.v[static_cast<size_t>(slots[static_cast<size_t>(j)] * vw + kvh * dv)];
        };
        sc.resize(static_cast<size_t>(n));
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < n; ++j) {
          const float* kr = key(j);
          float dot = 0.f;
          for (int64_t d = 0; d < dk; ++d) dot += qv[d] * kr[d];
          sc[static_cast<size_t>(j)] = dot * scale;
          mx = std::max(mx, sc[static_cast<size_t>(j)]);
        }
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) {
          sc[static_cast<size_t>(j)] = std::exp(sc[static_cast<size_t>(j)] - mx);
          sum += sc[static_cast<size_t>(j)];
        }
        const float inv = static_cast<float>(1.0 / sum);
        float* o = &out[static_cast<size_t>((t * H + h) * dv)];
        for (int64_t j = 0; j < n; ++j) {
          const float w = sc[static_cast<size_t>(j)] * inv;
          const float* vr = value(j);
          for (int64_t d = 0; d < dv; ++d) o[d] += w * vr[d];
        }
      }
    }
  }
  return out;
}

// One entry of a GPU batch: `q_len` tokens of Problem sequence `seq` starting at position
// `pos0`, whose queries are the Problem's q rows src_row .. src_row + q_len - 1.
struct Item {
  int32_t seq;
  int32_t pos0;
  int32_t q_len;
  int64_t src_row;
};

std::vector<Item> whole_batch(const Problem& pb) {
  std::vector<Item> items;
  for (size_t s = 0; s < pb.seqs.size(); ++s)
    items.push_back({static_cast<int32_t>(s), pb.seqs[s].pos0, pb.seqs[s].q_len, pb.q_start[s]});
  return items;
}

// A run's output placed in the Problem's row order [n_tok, n_head, dv]: f (as f32) and raw (the
// bytes the kernel wrote). Rows of tokens that were not in the batch hold NaN.
struct GpuOut {
  std::vector<float> f;
  std::vector<uint8_t> raw;
};

class Runner {
 public:
  explicit Runner(const Problem& pb) : pb_(pb), k_(pb.k_bf.size()), v_(pb.v_bf.size()) {
    k_.upload(pb.k_bf);
    if (!pb.v_bf.empty()) v_.upload(pb.v_bf);
  }

  GpuOut run(const std::vector<Item>& items, AttnOut out_type, float scale) const {
    const Problem& pb = pb_;
    const int64_t q_w = static_cast<int64_t>(pb.n_head) * pb.dk;
    const int64_t o_w = static_cast<int64_t>(pb.n_head) * pb.dv;
    const size_t es = out_type == AttnOut::kF32 ? sizeof(float) : sizeof(__nv_bfloat16);
    std::vector<int32_t> q_start, q_len, pos0, table;
    std::vector<__nv_bfloat16> q;
    int32_t max_q = 0, min_q = INT_MAX, max_kv = 0;
    int64_t n_tok = 0;
    for (const Item& it : items) {
      q_start.push_back(static_cast<int32_t>(n_tok));
      q_len.push_back(it.q_len);
      pos0.push_back(it.pos0);
      const auto row = pb.table.begin() + static_cast<int64_t>(it.seq) * pb.max_blocks;
      table.insert(table.end(), row, row + pb.max_blocks);
      q.insert(q.end(), pb.q_bf.begin() + it.src_row * q_w,
               pb.q_bf.begin() + (it.src_row + it.q_len) * q_w);
      n_tok += it.q_len;
      max_q = std::max(max_q, it.q_len);
      min_q = std::min(min_q, it.q_len);
      max_kv = std::max(max_kv, it.pos0 + it.q_len);
    }
    const int32_t n_seqs = static_cast<int32_t>(items.size());
    DeviceBuffer<int32_t> d_start(q_start.size()), d_len(q_len.size()), d_pos0(pos0.size()),
        d_table(table.size());
    DeviceBuffer<__nv_bfloat16> d_q(q.size());
    d_start.upload(q_start);
    d_len.upload(q_len);
    d_pos0.upload(pos0);
    d_table.upload(table);
    d_q.upload(q);
    DeviceBuffer<uint8_t> d_out(static_cast<size_t>(n_tok * o_w) * es);
    d_out.fill_bytes(0xFF);
    const size_t ws_bytes = paged_attention_workspace_bytes(n_seqs, pb.n_head, pb.dv, max_kv);
    DeviceBuffer<uint8_t> d_ws(std::max<size_t>(ws_bytes, 16));
    d_ws.fill_bytes(0xFF);  // an unwritten partial is NaN

    AttnBatch b;
    b.n_seqs = n_seqs;
    b.n_tok = n_tok;
    b.q_start = d_start.get();
    b.q_len = d_len.get();
    b.pos0 = d_pos0.get();
    b.block_table = d_table.get();
    b.max_blocks_per_seq = pb.max_blocks;
    b.max_q_len = max_q;
    b.min_q_len = min_q;
    b.max_kv_len = max_kv;
    if (pb.mla) {
      AttnMlaArgs a;
      a.q = d_q.get();
      a.n_head = pb.n_head;
      a.kv.kv = k_.get();
      a.kv.num_slots = pb.num_slots;
      a.kv.kv_lora_rank = pb.dv;
      a.kv.rope_dim = pb.dk - pb.dv;
      a.kv.block_size = pb.block_size;
      a.batch = b;
      a.scale = scale;
      a.out = d_out.get();
      a.out_type = out_type;
      a.workspace = d_ws.get();
      a.workspace_bytes = d_ws.size();
      paged_attention_mla(a, nullptr);
    } else {
      AttnArgs a;
      a.q = d_q.get();
      a.n_head = pb.n_head;
      a.kv.k = k_.get();
      a.kv.v = v_.get();
      a.kv.num_slots = pb.num_slots;
      a.kv.n_head_kv = pb.n_head_kv;
      a.kv.head_dim = pb.dk;
      a.kv.block_size = pb.block_size;
      a.batch = b;
      a.scale = scale;
      a.out = d_out.get();
      a.out_type = out_type;
      a.workspace = d_ws.get();
      a.workspace_bytes = d_ws.size();
      paged_attention(a, nullptr);
    }
    TROUPE_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint8_t> raw = d_out.download();

    GpuOut g;
    const size_t row_bytes = static_cast<size_t>(o_w) * es;
    g.raw.assign(static_cast<size_t>(pb.n_tok) * row_bytes, 0xFF);
    g.f.assign(static_cast<size_t>(pb.n_tok * o_w), kNaN);
    int64_t r = 0;
    for (const Item& it : items) {
      for (int64_t i = 0; i < it.q_len; ++i, ++r) {
        const size_t dst = static_cast<size_t>(it.src_row + i);
        std::memcpy(&g.raw[dst * row_bytes], &raw[static_cast<size_t>(r) * row_bytes], row_bytes);
        for (int64_t e = 0; e < o_w; ++e) {
          const uint8_t* src =
              &raw[static_cast<size_t>(r) * row_bytes + static_cast<size_t>(e) * es];
          float x;
          if (out_type == AttnOut::kF32) {
            std::memcpy(&x, src, sizeof x);
          } else {
            __nv_bfloat16 h;
            std::memcpy(&h, src, sizeof h);
            x = from_bf16(h);
          }
          g.f[dst * static_cast<size_t>(o_w) + static_cast<size_t>(e)] = x;
        }
      }
    }
    return g;
  }

 private:
  const Problem& pb_;
  DeviceBuffer<__nv_bfloat16> k_, v_;
};

// Runs the whole problem as one batch with both output types and compares with the reference.
void check_against_reference(const Problem& pb, float scale, float ref_scale) {
  const std::vector<float> want = reference(pb, ref_scale);
  Runner runner(pb);
  const std::vector<Item> items = whole_batch(pb);
  EXPECT_TRUE(
      all_close(runner.run(items, AttnOut::kF32, scale).f, want, kRtolF32, kAtolF32, "f32 output"));
  EXPECT_TRUE(all_close(runner.run(items, AttnOut::kBf16, scale).f, want, kRtolBf16, kAtolBf16,
                        "bf16 output"));
}

void check_gqa(int32_t n_head, int32_t n_head_kv, int32_t head_dim, int32_t block_size,
               uint64_t seed) {
  SCOPED_TRACE("n_head " + std::to_string(n_head) + " n_head_kv " + std::to_string(n_head_kv) +
               " head_dim " + std::to_string(head_dim) + " block_size " +
               std::to_string(block_size));
  const Problem pb =
      make_problem(false, n_head, n_head_kv, head_dim, head_dim, block_size, kMixedSeqs, seed);
  // scale 0 asks for the default 1/sqrt(head_dim).
  check_against_reference(pb, 0.f, 1.f / std::sqrt(static_cast<float>(head_dim)));
}

// Bytes of rows [row, row + n) of a run.
std::vector<uint8_t> rows_of(const GpuOut& g, const Problem& pb, int64_t row, int64_t n) {
  const size_t row_bytes = g.raw.size() / static_cast<size_t>(pb.n_tok);
  return {g.raw.begin() + static_cast<int64_t>(row_bytes) * row,
          g.raw.begin() + static_cast<int64_t>(row_bytes) * (row + n)};
}

// Every sequence alone, the batch reversed and a two-sequence batch give bitwise the rows of
// the whole batch.
void check_batch_invariance(const Problem& pb, float scale, AttnOut out_type) {
  Runner runner(pb);
  const std::vector<Item> all = whole_batch(pb);
  const GpuOut full = runner.run(all, out_type, scale);
  std::vector<Item> reversed(all.rbegin(), all.rend());
  const GpuOut rev = runner.run(reversed, out_type, scale);
  const GpuOut pair = runner.run({all[1], all.back()}, out_type, scale);
  for (size_t s = 0; s < all.size(); ++s) {
    SCOPED_TRACE("sequence " + std::to_string(s) + " pos0 " + std::to_string(all[s].pos0) +
                 " q_len " + std::to_string(all[s].q_len));
    const GpuOut alone = runner.run({all[s]}, out_type, scale);
    const auto want = rows_of(full, pb, all[s].src_row, all[s].q_len);
    EXPECT_TRUE(rows_of(alone, pb, all[s].src_row, all[s].q_len) == want) << "alone differs";
    EXPECT_TRUE(rows_of(rev, pb, all[s].src_row, all[s].q_len) == want) << "reversed differs";
    if (s == 1 || s + 1 == all.size()) {
      EXPECT_TRUE(rows_of(pair, pb, all[s].src_row, all[s].q_len) == want) << "pair differs";
    }
  }
}

// ---- host-only: decode chunking, workspace, argument validation ----

TEST(GpuAttention, DecodeChunkDependsOnlyOnContextLength) {
  EXPECT_EQ(attention_decode_chunk(1), 256);
  EXPECT_EQ(attention_decode_chunk(2000), 256);
  EXPECT_EQ(attention_decode_chunk(256 * 64), 256);
  EXPECT_EQ(attention_decode_chunk(256 * 64 + 1), 512);
  EXPECT_EQ(attention_decode_chunk(20000), 512);
  EXPECT_EQ(attention_decode_chunk(1 << 20), 16384);
  // splits = min(64, ceil(max_kv_len / 256)); per row: head_dim partials + max + sum (f32).
  EXPECT_EQ(paged_attention_workspace_bytes(3, 8, 128, 300), size_t{3} * 2 * 8 * 130 * 4);
  EXPECT_EQ(paged_attention_workspace_bytes(1, 4, 64, 1 << 20), size_t{64} * 4 * 66 * 4);
  EXPECT_EQ(paged_attention_workspace_bytes(0, 4, 64, 100), 0u);
}

alignas(16) __nv_bfloat16 g_dummy_bf16[64];
alignas(16) int32_t g_dummy_i32[64];
alignas(16) float g_dummy_out[64];
alignas(16) unsigned char g_dummy_ws[4096];

// Arguments that pass validation; pointers are host addresses that validation never reads.
AttnBatch valid_batch() {
  AttnBatch b;
  b.n_seqs = 2;
  b.n_tok = 5;
  b.q_start = g_dummy_i32;
  b.q_len = g_dummy_i32;
  b.pos0 = g_dummy_i32;
  b.block_table = g_dummy_i32;
  b.max_blocks_per_seq = 3;
  b.max_q_len = 4;
  b.min_q_len = 1;
  b.max_kv_len = 40;
  return b;
}

AttnArgs valid_args() {
  AttnArgs a;
  a.q = g_dummy_bf16;
  a.n_head = 8;
  a.kv.k = g_dummy_bf16;
  a.kv.v = g_dummy_bf16;
  a.kv.num_slots = 64;
  a.kv.n_head_kv = 2;
  a.kv.head_dim = 16;
  a.kv.block_size = 16;
  a.batch = valid_batch();
  a.out = g_dummy_out;
  a.out_type = AttnOut::kF32;
  a.workspace = g_dummy_ws;
  a.workspace_bytes = sizeof g_dummy_ws;
  return a;
}

AttnMlaArgs valid_mla_args() {
  AttnMlaArgs a;
  a.q = g_dummy_bf16;
  a.n_head = 8;
  a.kv.kv = g_dummy_bf16;
  a.kv.num_slots = 64;
  a.kv.kv_lora_rank = 32;
  a.kv.rope_dim = 16;
  a.kv.block_size = 16;
  a.batch = valid_batch();
  a.scale = 0.125f;
  a.out = g_dummy_out;
  a.workspace = g_dummy_ws;
  a.workspace_bytes = sizeof g_dummy_ws;
  return a;
}

void expect_input_error(const std::function<void()>& f, const std::string& want) {
  try {
    f();
    ADD_FAILURE() << "no InputError; expected one containing: " << want;
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

TEST(GpuAttention, AcceptsValidArgumentsAndEmptyBatch) {
  EXPECT_NO_THROW(validate_attention_args(valid_args()));
  EXPECT_NO_THROW(validate_attention_mla_args(valid_mla_args()));
  AttnArgs empty;  // everything null: a batch of no sequences does nothing
  EXPECT_NO_THROW(paged_attention(empty, nullptr));
  AttnMlaArgs empty_mla;
  EXPECT_NO_THROW(paged_attention_mla(empty_mla, nullptr));
}

TEST(GpuAttention, RejectsHeadsNotAMultipleOfKvHeads) {
  AttnArgs a = valid_args();
  a.n_head = 6;
  a.kv.n_head_kv = 4;
  // paged_attention validates before touching the device.
  expect_input_error([&] { paged_attention(a, nullptr); },
                     "paged_attention: n_head 6 is not a positive multiple of kv.n_head_kv 4");
}

TEST(GpuAttention, RejectsHeadDimAbove256) {
  AttnArgs a = valid_args();
  a.kv.head_dim = 320;
  expect_input_error([&] { validate_attention_args(a); }, "kv.head_dim 320 is outside 1..256");
}

TEST(GpuAttention, RejectsBlockTableTooShortForContext) {
  AttnArgs a = valid_args();
  a.batch.max_blocks_per_seq = 2;
  expect_input_error([&] { validate_attention_args(a); },
                     "block table rows of 2 blocks of 16 positions cannot hold max_kv_len 40");
}

TEST(GpuAttention, RejectsQLenBoundsOutOfOrder) {
  AttnArgs a = valid_args();
  a.batch.min_q_len = 5;
  expect_input_error([&] { validate_attention_args(a); },
                     "batch q_len bounds [5, 4] must satisfy 1 <= min_q_len <= max_q_len");
}

TEST(GpuAttention, RejectsTooSmallWorkspace) {
  AttnArgs a = valid_args();
  const size_t need = paged_attention_workspace_bytes(2, 8, 16, 40);
  a.workspace_bytes = need - 1;
  expect_input_error([&] { validate_attention_args(a); },
                     "is too small: " + std::to_string(need) + " needed");
  a.batch.min_q_len = 2;  // no decode: no workspace needed
  a.workspace = nullptr;
  a.workspace_bytes = 0;
  EXPECT_NO_THROW(validate_attention_args(a));
}

TEST(GpuAttention, RejectsNegativeScale) {
  AttnArgs a = valid_args();
  a.scale = -1.f;
  expect_input_error([&] { validate_attention_args(a); }, "scale -1 must be finite and >= 0");
}

TEST(GpuAttention, MlaRejectsMissingScale) {
  AttnMlaArgs a = valid_mla_args();
  a.scale = 0.f;
  expect_input_error([&] { paged_attention_mla(a, nullptr); },
                     "paged_attention_mla: scale 0 must be finite and > 0");
}

TEST(GpuAttention, MlaRejectsRopeDimAbove64) {
  AttnMlaArgs a = valid_mla_args();
  a.kv.rope_dim = 96;
  expect_input_error([&] { validate_attention_mla_args(a); }, "kv.rope_dim 96 is outside 0..64");
}

TEST(GpuAttention, MlaRejectsLoraRankAbove512) {
  AttnMlaArgs a = valid_mla_args();
  a.kv.kv_lora_rank = 1024;
  expect_input_error([&] { validate_attention_mla_args(a); },
                     "kv.kv_lora_rank 1024 is outside 1..512");
}

// ---- device: numerics against the CPU reference ----

TEST(GpuAttention, GqaHeadDim8NoGroupingBlock16MatchesCpu) {
  TROUPE_REQUIRE_GPU();
  check_gqa(4, 4, 8, 16, 11);
}

TEST(GpuAttention, GqaHeadDim64GroupOf4Block32MatchesCpu) {
  TROUPE_REQUIRE_GPU();
  check_gqa(8, 2, 64, 32, 12);
}

TEST(GpuAttention, GqaHeadDim128GroupOf8Block16MatchesCpu) {
  TROUPE_REQUIRE_GPU();
  check_gqa(8, 1, 128, 16, 13);
}

TEST(GpuAttention, GqaHeadDim128GroupOf4Block32MatchesCpu) {
  TROUPE_REQUIRE_GPU();
  check_gqa(8, 2, 128, 32, 14);
}

// The test models: llama2-tiny-random (head_dim 4: scalar loads), stories260K (8, group 2),
// synth llama (16, group 4), qwen3moe (32); 96 pads to the 128 kernel; 256 needs more than
// 48 KiB of shared memory (opt-in).
TEST(GpuAttention, GqaOtherHeadDimsMatchCpu) {
  TROUPE_REQUIRE_GPU();
  check_gqa(2, 2, 4, 16, 21);
  check_gqa(8, 4, 8, 32, 22);
  check_gqa(8, 2, 16, 16, 23);
  check_gqa(8, 2, 32, 32, 24);
  check_gqa(4, 2, 96, 16, 25);
  check_gqa(4, 2, 256, 32, 26);
}

// Groups wider than a decode block's 8 rows (several row tiles per kv head: grid.y > 1), and
// a head size that is not a multiple of 8 (the element-wise loads past their first chunk) with
// blocks of a size that is not a power of two.
TEST(GpuAttention, GqaSeveralRowTilesAndOddWidthsMatchCpu) {
  TROUPE_REQUIRE_GPU();
  check_gqa(32, 2, 64, 16, 15);
  check_gqa(4, 2, 20, 24, 27);
}

TEST(GpuAttention, GqaSequenceIsBitwiseSameAloneOrInAnyBatch) {
  TROUPE_REQUIRE_GPU();
  const Problem pb = make_problem(false, 8, 2, 128, 128, 16, kMixedSeqs, 31);
  check_batch_invariance(pb, 0.f, AttnOut::kBf16);
  check_batch_invariance(pb, 0.f, AttnOut::kF32);
}

// A 2000-token prompt in one chunk or in chunks of 500, 1000 and 500 (one batch, or one launch
// per chunk): bitwise the same rows, and close to the reference.
TEST(GpuAttention, GqaChunkedPrefillIsBitwiseSameAsOneChunk) {
  TROUPE_REQUIRE_GPU();
  const Problem pb = make_problem(false, 4, 1, 64, 64, 16, {{0, 2000}}, 41);
  Runner runner(pb);
  const GpuOut one = runner.run({{0, 0, 2000, 0}}, AttnOut::kF32, 0.f);
  const std::vector<Item> chunks = {{0, 0, 500, 0}, {0, 500, 1000, 500}, {0, 1500, 500, 1500}};
  const GpuOut batched = runner.run(chunks, AttnOut::kF32, 0.f);
  EXPECT_TRUE(one.raw == batched.raw) << "chunks in one batch differ from one chunk";
  for (const Item& c : chunks) {
    const GpuOut alone = runner.run({c}, AttnOut::kF32, 0.f);
    EXPECT_TRUE(rows_of(alone, pb, c.src_row, c.q_len) == rows_of(one, pb, c.src_row, c.q_len))
        << "chunk at pos0 " << c.pos0 << " run alone differs";
  }
  EXPECT_TRUE(all_close(one.f, reference(pb, 0.125f), kRtolF32, kAtolF32, "one chunk"));
}

// MLA of the synthetic deepseek2 model: 8 heads, kv_lora_rank 32, rope 16, qk_nope 32.
TEST(GpuAttention, MlaSynthShapesMatchCpu) {
  TROUPE_REQUIRE_GPU();
  const Problem pb = make_problem(true, 8, 1, 48, 32, 16, kMixedSeqs, 51);
  const float scale = 1.f / std::sqrt(32.f + 16.f);
  check_against_reference(pb, scale, scale);
}

// DeepSeek-V3 widths (kv_lora_rank 512, rope 64, qk_nope 128) with 16 heads; fewer long
// prefills than kMixedSeqs to keep the CPU reference short.
TEST(GpuAttention, MlaDeepSeekShapesMatchCpu) {
  TROUPE_REQUIRE_GPU();
  const Problem pb =
      make_problem(true, 16, 1, 576, 512, 32,
                   {{0, 1}, {0, 7}, {9, 7}, {16, 1}, {0, 300}, {1999, 1}, {1960, 40}}, 52);
  const float scale = 1.f / std::sqrt(128.f + 64.f);
  check_against_reference(pb, scale, scale);
}

// 48 heads: three decode row tiles of 16 per sequence (DeepSeek-V3's 128 heads take eight);
// and MLA without a rope part (kv_lora_rank 32, rope 0).
TEST(GpuAttention, MlaSeveralRowTilesAndNoRopeMatchCpu) {
  TROUPE_REQUIRE_GPU();
  const Problem wide = make_problem(true, 48, 1, 48, 32, 16, kMixedSeqs, 53);
  const float scale = 1.f / std::sqrt(32.f + 16.f);
  check_against_reference(wide, scale, scale);
  const Problem no_rope = make_problem(true, 8, 1, 32, 32, 16, kMixedSeqs, 54);
  const float scale0 = 1.f / std::sqrt(32.f);
  check_against_reference(no_rope, scale0, scale0);
}

TEST(GpuAttention, MlaSequenceIsBitwiseSameAloneOrInAnyBatch) {
  TROUPE_REQUIRE_GPU();
  const Problem pb = make_problem(true, 8, 1, 48, 32, 16, kMixedSeqs, 61);
  check_batch_invariance(pb, 1.f / std::sqrt(48.f), AttnOut::kBf16);
}

}  // namespace
}  // namespace troupe::gpu
