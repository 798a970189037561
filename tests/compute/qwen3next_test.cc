// Qwen3-Next (qwen3next GGUF as llama.cpp runs it; Qwen3NextForCausalLM) through the engine:
// three Gated DeltaNet linear-attention layers to each gated full-attention one, a recurrent
// state per sequence. A synthesized GGUF, the same GGUF with llama.cpp's older ssm_in layout,
// and the Hugging Face twin against the independent float64 forward pass of
// tests/qwen3next_reference.h; batch and chunk invariance through the recurrent state; the
// state's rules (one per sequence, no skipping positions) and bad files refused by name. No
// ../shared golden case exists for this architecture.
#include <cstring>
#include <deque>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/model.h"
#include "model/synth.h"
#include "tests/compute/engine_test_util.h"
#include "tests/edited_model.h"
#include "tests/hf_twin_model.h"
#include "tests/qwen3next_hf_twin.h"
#include "tests/qwen3next_reference.h"
#include "tests/test_support.h"

namespace troupe::compute {
namespace {

using testing::TempDir;

// troupe synth --arch qwen3next's defaults: 4 layers (0-2 linear attention, 3 full), 2 key heads
// and 4 value heads of 32, 8 experts (2 used) in every layer plus a gated shared one.
std::string synth_qwen3next(const TempDir& dir, uint64_t seed = 5) {
  return testing::synth_arch(dir, "qwen3next", seed);
}

std::shared_ptr<const model::Model> load(const std::string& path) {
  auto m = model::load_model(path);
  EXPECT_TRUE(m.has_value()) << m.error().message;
  return m.has_value() ? *m : nullptr;
}

// The GGUF with llama.cpp's older layout of the linear layers' input projection: one ssm_in
// matrix whose rows hold, per key head, its q, k, v and z (Hugging Face's in_proj_qkvz), made
// from the synthesized attn_qkv (all q, all k, all v) and attn_gate (z).
std::string legacy_ssm_in(const TempDir& dir, const std::string& src) {
  auto f = model::GgufFile::open(src);
  EXPECT_TRUE(f.has_value());
  if (!f) return {};
  const model::GgufFile& g = **f;
  const int64_t nk = g.get_int("qwen3next.ssm.group_count");
  const int64_t nv = g.get_int("qwen3next.ssm.time_step_rank");
  const int64_t dk = g.get_int("qwen3next.ssm.state_size");
  const int64_t dv = g.get_int("qwen3next.ssm.inner_size") / nv, r = nv / nk;
  model::GgufWriter w;
  for (const auto& [key, value] : g.metadata()) w.copy_value(key, value);
  std::deque<std::vector<float>> made;  // the writer reads them when it writes
  for (const model::TensorInfo& t : g.tensors()) {
    const std::string& n = t.name;
    if (n.ends_with("attn_gate.weight")) continue;
    const std::vector<int64_t> shape(t.ne, t.ne + t.n_dims);
    if (!n.ends_with("attn_qkv.weight")) {
      EXPECT_TRUE(w.add_tensor(n, t.type, shape,
                               std::span<const uint8_t>(t.data, static_cast<size_t>(t.nbytes)))
                      .has_value());
      continue;
    }
    EXPECT_EQ(t.type, model::GgmlType::kF32);
    const std::string at = n.substr(0, n.size() - std::strlen("attn_qkv.weight"));
    const model::TensorInfo* z = g.find_tensor(at + "attn_gate.weight");
    EXPECT_NE(z, nullptr);
    if (!z) return {};
    const int64_t E = t.ne[0], kw = nk * dk;
    const auto* qkv = reinterpret_cast<const float*>(t.data);
    const auto* zz = reinterpret_cast<const float*>(z->data);
    std::vector<float>& out = made.emplace_back();
    auto rows = [&](const float* m, int64_t r0, int64_t n_rows) {
      out.insert(out.end(), m + r0 * E, m + (r0 + n_rows) * E);
    };
    for (int64_t k = 0; k < nk; ++k) {
      rows(qkv, k * dk, dk);
      rows(qkv, kw + k * dk, dk);
      rows(qkv, 2 * kw + k * r * dv, r * dv);
      rows(zz, k * r * dv, r * dv);
    }
    const int64_t ne[2] = {E, static_cast<int64_t>(out.size()) / E};
    EXPECT_TRUE(w.add_tensor_f32(at + "ssm_in.weight", model::GgmlType::kF32, ne, out).has_value());
  }
  const std::string path = dir.file("legacy.gguf");
  EXPECT_TRUE(w.write(path).has_value());
  return path;
}

// The Qwen3-Next form of a Qwen3.5 GGUF, written from the definition of llama.cpp's converter
// (its _reorder_v_heads): Qwen3.5's value heads are stored tiled -- tiled head j * nk + g is the
// checkpoint's head g * r + j -- in attn_qkv's v rows, attn_gate's rows, the convolution's v
// channels, ssm_beta, ssm_alpha, ssm_dt, ssm_a and ssm_out's columns. Here they go back to the
// checkpoint's grouped order, b and a are interleaved per key head into ssm_ba, and the keys
// become qwen3next's. What remains is Qwen3-Next's arithmetic, which tests/qwen3next_hf_twin.h
// and the float64 reference read.
std::string untiled_as_qwen3next(const TempDir& dir, const std::string& src) {
  auto f = model::GgufFile::open(src);
  EXPECT_TRUE(f.has_value());
  if (!f) return {};
  const model::GgufFile& g = **f;
  const std::string from = g.get_string("general.architecture") + ".";
  const int64_t nk = g.get_int(from + "ssm.group_count"),
                nv = g.get_int(from + "ssm.time_step_rank");
  const int64_t dk = g.get_int(from + "ssm.state_size"),
                dv = g.get_int(from + "ssm.inner_size") / nv;
  const int64_t r = nv / nk, kw = nk * dk;
  auto tiled = [&](int64_t grouped) { return grouped % r * nk + grouped / r; };
  model::GgufWriter w;
  for (const auto& [key, value] : g.metadata()) {
    if (key == from + "rope.dimension_sections") continue;
    w.copy_value(key.rfind(from, 0) == 0 ? "qwen3next." + key.substr(from.size()) : key, value);
  }
  w.set_string("general.architecture", "qwen3next");
  std::deque<std::vector<float>> made;
  auto floats = [](const model::TensorInfo& t) {
    EXPECT_EQ(t.type, model::GgmlType::kF32) << t.name;
    const auto* p = reinterpret_cast<const float*>(t.data);
    return std::vector<float>(p, p + t.num_elements());
  };
  // Rows [off, off + nv * per) of a [rows, width] matrix, in blocks of `per` rows per head.
  auto untile_rows = [&](std::vector<float> v, int64_t width, int64_t off, int64_t per) {
    const std::vector<float> in = v;
    for (int64_t h = 0; h < nv; ++h)
      std::copy_n(in.begin() + (off + tiled(h) * per) * width, per * width,
                  v.begin() + (off + h * per) * width);
    return v;
  };
  for (const model::TensorInfo& t : g.tensors()) {
    const std::string& n = t.name;
    std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
    const std::string at = n.substr(0, n.find('.', 4) + 1), rest = n.substr(at.size());
    std::vector<float> v;
    if (rest == "attn_qkv.weight") {
      v = untile_rows(floats(t), t.ne[0], 2 * kw, dv);
    } else if (rest == "attn_gate.weight") {
      v = untile_rows(floats(t), t.ne[0], 0, dv);
    } else if (rest == "ssm_conv1d.weight") {  // rows: channels, each its kernel
      v = untile_rows(floats(t), t.ne[0], 2 * kw, dv);
    } else if (rest == "ssm_dt.bias" || rest == "ssm_a") {
      v = untile_rows(floats(t), 1, 0, 1);
    } else if (rest == "ssm_out.weight") {  // columns: value heads
      const std::vector<float> in = floats(t);
      v = in;
      const int64_t cols = t.ne[0];
      for (int64_t row = 0; row < t.ne[1]; ++row)
        for (int64_t h = 0; h < nv; ++h)
          std::copy_n(in.begin() + row * cols + tiled(h) * dv, dv, v.begin() + row * cols + h * dv);
    } else if (rest == "ssm_alpha.weight") {
      continue;  // joins ssm_beta in ssm_ba
    } else if (rest == "ssm_beta.weight") {
      const model::TensorInfo* alpha = g.find_tensor(at + "ssm_alpha.weight");
      EXPECT_NE(alpha, nullptr);
      if (!alpha) return {};
      const std::vector<float> b = floats(t), a = floats(*alpha);
      const int64_t E = t.ne[0];
      for (int64_t k = 0; k < nk; ++k) {  // per key head: its r heads' b, then their a
        for (int64_t j = 0; j < r; ++j)
          v.insert(v.end(), b.begin() + tiled(k * r + j) * E,
                   b.begin() + (tiled(k * r + j) + 1) * E);
        for (int64_t j = 0; j < r; ++j)
          v.insert(v.end(), a.begin() + tiled(k * r + j) * E,
                   a.begin() + (tiled(k * r + j) + 1) * E);
      }
      ne = {E, 2 * nv};
      const std::vector<float>& kept = made.emplace_back(std::move(v));
      EXPECT_TRUE(
          w.add_tensor_f32(at + "ssm_ba.weight", model::GgmlType::kF32, ne, kept).has_value());
      continue;
    } else {
      EXPECT_TRUE(w.add_tensor(n, t.type, ne,
                               std::span<const uint8_t>(t.data, static_cast<size_t>(t.nbytes)))
                      .has_value());
      continue;
    }
    const std::vector<float>& kept = made.emplace_back(std::move(v));
    EXPECT_TRUE(w.add_tensor_f32(n, model::GgmlType::kF32, ne, kept).has_value());
  }
  const std::string path = dir.file("untiled.gguf");
  EXPECT_TRUE(w.write(path).has_value());
  return path;
}

TEST(Qwen3Next, GgufMapsAsLlamaCpp) {
  TempDir dir;
  auto m = load(synth_qwen3next(dir));
  ASSERT_TRUE(m);
  const model::ModelSpec& s = m->spec;
  EXPECT_EQ(s.arch, model::Arch::kQwen3Next);
  EXPECT_STREQ(model::arch_name(s.arch), "qwen3next");
  EXPECT_EQ(s.rope_style, model::RopeStyle::kNeox);
  EXPECT_EQ(s.n_rot, s.head_dim_k / 4);
  EXPECT_EQ(s.gating, model::Gating::kSoftmax);
  EXPECT_TRUE(s.norm_topk);
  EXPECT_EQ(s.ssm_k_heads, 2);
  EXPECT_EQ(s.ssm_v_heads, 4);
  EXPECT_EQ(s.ssm_k_dim, 32);
  EXPECT_EQ(s.ssm_v_dim, 32);
  EXPECT_EQ(s.ssm_conv_kernel, 4);
  EXPECT_EQ(s.ssm_state_floats(), 3 * (2 * 2 * 32 + 4 * 32) + 4 * 32 * 32);
  ASSERT_EQ(s.layers.size(), 4u);
  for (size_t il = 0; il < 4; ++il) {
    SCOPED_TRACE("layer " + std::to_string(il));
    const model::LayerSpec& L = s.layers[il];
    const bool full = il == 3;
    EXPECT_EQ(L.recurrent, !full);
    EXPECT_EQ(L.attn_gate, full);
    EXPECT_EQ(L.q_norm.present(), full);
    EXPECT_EQ(L.ssm_qkv.present(), !full);
    EXPECT_FALSE(L.ssm_in.present());
    EXPECT_EQ(L.ffn_norm.name, "blk." + std::to_string(il) + ".post_attention_norm.weight");
    EXPECT_TRUE(L.is_moe);
    EXPECT_TRUE(L.shared_gate.present());
  }
  // The KV pool holds the one attention layer only; each sequence has its state.
  EngineOptions o;
  o.max_tokens_in_cache = 64;
  auto eng = Engine::create(m, o);
  ASSERT_TRUE(eng.has_value()) << eng.error().message;
  EXPECT_EQ((*eng)->kv_cache().config().n_layer, 1);
  EXPECT_TRUE((*eng)->needs_state());
}

// No golden case exists for Qwen3-Next: the engine's logits are held to an independent float64
// forward pass of the Hugging Face form, written from transformers' semantics, for the GGUF in
// both of llama.cpp's layouts and for the twin itself.
TEST(Qwen3Next, EngineMatchesTheFloat64ReferenceFromGgufAndHf) {
  TempDir dir, hf;
  const std::string gguf = synth_qwen3next(dir);
  ASSERT_NO_FATAL_FAILURE(testing::write_qwen3next_hf_twin(gguf, hf));
  auto m = load(gguf);
  ASSERT_TRUE(m);
  const auto vocab = static_cast<int32_t>(m->spec.n_vocab);
  const std::vector<int32_t> prompt = prompt_of(33, vocab, 37);
  const std::vector<double> ref = testing::qwen3next_reference_logits(hf.path(), prompt);
  const std::vector<float> from_gguf = prompt_logits(m, prompt);
  expect_near_reference(from_gguf, ref, vocab);
  expect_engine_near_reference(m, prompt, ref);
  // llama.cpp's older ssm_in layout: the same rows, so the same bits.
  auto legacy = load(legacy_ssm_in(dir, gguf));
  ASSERT_TRUE(legacy);
  EXPECT_TRUE(legacy->spec.layers[0].ssm_in.present());
  const std::vector<float> from_legacy = prompt_logits(legacy, prompt);
  expect_near_reference(from_legacy, ref, vocab);
  EXPECT_TRUE(bit_equal(from_legacy, from_gguf));
  // The Hugging Face directory: the same layer kinds; its decay rates are -exp(A_log) again, so
  // near, not equal.
  auto h = load(hf.path());
  ASSERT_TRUE(h);
  for (size_t il = 0; il < m->spec.layers.size(); ++il) {
    const model::LayerSpec &a = m->spec.layers[il], &b = h->spec.layers[il];
    EXPECT_EQ(std::tuple(a.is_moe, a.recurrent, a.attn_gate),
              std::tuple(b.is_moe, b.recurrent, b.attn_gate))
        << "layer " << il;
  }
  EXPECT_EQ(h->spec.n_rot, m->spec.n_rot);
  expect_near_reference(prompt_logits(h, prompt), ref, vocab);
}

// The recurrent state makes each token's arithmetic the same however its sequence arrives:
// in one chunk, in several, token by token, with 2 threads, beside another sequence.
TEST(Qwen3Next, RecurrentStateIsBatchAndChunkInvariant) {
  TempDir dir;
  auto m = load(synth_qwen3next(dir, 9));
  ASSERT_TRUE(m);
  expect_batch_invariant(m);
}

// The linear layers matter beyond the current token: the state carries earlier positions, so
// changing the first token changes every later row, and the full-attention layer alone would
// not explain it (a model whose linear layers forget at once would).
TEST(Qwen3Next, StateCarriesEarlierPositions) {
  TempDir dir;
  auto m = load(synth_qwen3next(dir, 11));
  ASSERT_TRUE(m);
  const auto vocab = static_cast<int32_t>(m->spec.n_vocab);
  std::vector<int32_t> a = prompt_of(10, vocab, 3), b = a;
  b[0] = a[0] + 1;
  const std::vector<float> la = prompt_logits(m, a), lb = prompt_logits(m, b);
  const auto V = static_cast<size_t>(vocab);
  for (size_t row = 0; row < 10; ++row)
    EXPECT_NE(std::memcmp(&la[row * V], &lb[row * V], V * 4), 0) << "row " << row;
}

// One state per sequence, held while the sequence lives; a step must continue where the state
// ended (or start again at 0); a failed step leaves the state to start again.
TEST(Qwen3Next, StatesFollowTheirSequences) {
  TempDir dir;
  auto m = load(synth_qwen3next(dir, 3));
  ASSERT_TRUE(m);
  EngineOptions o;
  o.max_tokens_in_cache = 64;
  o.max_recurrent_seqs = 2;
  auto made = Engine::create(m, o);
  ASSERT_TRUE(made.has_value());
  Engine& eng = **made;
  const std::vector<int32_t> toks = prompt_of(6, static_cast<int32_t>(m->spec.n_vocab), 5);
  StepResult r;
  {
    Sequence s1(eng), s2(eng);
    EXPECT_NE(s1.state(), s2.state());
    EXPECT_THROW(Sequence s3(eng), std::runtime_error);
    ASSERT_TRUE(s1.reserve(6));
    SeqStep st = s1.next({toks.data(), 3}, SeqStep::Logits::kLast);
    ASSERT_TRUE(eng.step({&st, 1}, &r).has_value());
    s1.advance(3);
    EXPECT_EQ(eng.state_positions(s1.state()), 3);
    // Skipping a position is refused, by name.
    SeqStep skip = s1.next({toks.data() + 4, 1}, SeqStep::Logits::kLast);
    skip.pos0 = 4;
    Status bad = eng.step({&skip, 1}, &r);
    ASSERT_FALSE(bad.has_value());
    EXPECT_NE(bad.error().message.find("starts at position 4, but its recurrent state holds 3"),
              std::string::npos)
        << bad.error().message;
    // No state, or two sequences on one state.
    SeqStep none = s1.next({toks.data() + 3, 1}, SeqStep::Logits::kLast);
    none.state = -1;
    bad = eng.step({&none, 1}, &r);
    ASSERT_FALSE(bad.has_value());
    EXPECT_NE(bad.error().message.find("names recurrent state -1, outside [0, 2)"),
              std::string::npos)
        << bad.error().message;
    ASSERT_TRUE(s2.reserve(6));
    SeqStep one = s1.next({toks.data() + 3, 1}, SeqStep::Logits::kLast);
    SeqStep other = s2.next({toks.data(), 1}, SeqStep::Logits::kLast);
    other.state = one.state;
    const SeqStep pair[] = {one, other};
    bad = eng.step(pair, &r);
    ASSERT_FALSE(bad.has_value());
    EXPECT_NE(bad.error().message.find("shares recurrent state"), std::string::npos)
        << bad.error().message;
    // The refused steps changed nothing: continuing gives what one chunk of 4 gives.
    ASSERT_TRUE(eng.step({&one, 1}, &r).has_value());
    s1.advance(1);
    const std::vector<float> cont(r.logits.begin(), r.logits.end());
    auto other_engine = Engine::create(m, o);  // the same options, states of its own
    ASSERT_TRUE(other_engine.has_value());
    const std::vector<float> whole =
        run_chunks(**other_engine, {toks.begin(), toks.begin() + 4}, {4});
    const auto V = static_cast<std::ptrdiff_t>(m->spec.n_vocab);
    ASSERT_EQ(whole.size(), static_cast<size_t>(4 * V));
    EXPECT_TRUE(bit_equal(cont, {whole.begin() + 3 * V, whole.end()}));
  }
  // Both states are free again; a step at position 0 starts afresh, whatever the state held.
  Sequence s(eng);
  ASSERT_TRUE(s.reserve(4));
  SeqStep st = s.next({toks.data(), 4}, SeqStep::Logits::kLast);
  ASSERT_TRUE(eng.step({&st, 1}, &r).has_value());
  const std::vector<float> first(r.logits.begin(), r.logits.end());
  ASSERT_TRUE(eng.step({&st, 1}, &r).has_value());  // again from 0: the same bits
  EXPECT_TRUE(bit_equal(first, {r.logits.begin(), r.logits.end()}));
}

// Slots assigned by the caller (the cluster's scheduler, as it assigns KV blocks): any slot in
// range, its memory allocated by its first step; a step that continues another owner's state is
// refused by name (a late step of the slot's previous sequence), and position 0 takes it over.
TEST(Qwen3Next, CallerAssignedSlotsKeepTheirOwners) {
  TempDir dir;
  auto m = load(synth_qwen3next(dir, 4));
  ASSERT_TRUE(m);
  EngineOptions o;
  o.max_tokens_in_cache = 64;
  o.max_recurrent_seqs = 4;
  auto made = Engine::create(m, o);
  ASSERT_TRUE(made.has_value());
  Engine& eng = **made;
  EXPECT_EQ(eng.state_bytes(), 0u);
  const std::vector<int32_t> toks = prompt_of(7, static_cast<int32_t>(m->spec.n_vocab), 3);
  const std::vector<int32_t> blocks = {0, 1, 2, 3};  // 64 positions at 16 a block
  StepResult r;
  std::vector<float> got;
  auto step = [&](int32_t slot, int64_t owner, int64_t pos0, int64_t n) {
    SeqStep st;
    st.pos0 = pos0;
    st.tokens = {toks.data() + pos0, static_cast<size_t>(n)};
    st.blocks = blocks;
    st.logits = SeqStep::Logits::kAll;
    st.state = slot;
    st.state_owner = owner;
    Status s = eng.step({&st, 1}, &r);
    if (s) got.insert(got.end(), r.logits.begin(), r.logits.end());
    return s;
  };
  ASSERT_TRUE(step(3, 70, 0, 4).has_value());
  EXPECT_EQ(eng.state_positions(3), 4);
  // One slot's memory: three linear layers' conv history and heads' states.
  EXPECT_EQ(eng.state_bytes(), static_cast<uint64_t>(3 * m->spec.ssm_state_floats() * 4));
  Status bad = step(3, 71, 4, 1);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("(owner 71) continues recurrent state 3, which holds the "
                                     "positions of owner 70"),
            std::string::npos)
      << bad.error().message;
  bad = step(4, 70, 0, 1);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("names recurrent state 4, outside [0, 4)"), std::string::npos)
      << bad.error().message;
  ASSERT_TRUE(step(3, 70, 4, 3).has_value());
  // What the engine's own slots give for the same tokens in the same chunks.
  auto twin = Engine::create(m, o);
  ASSERT_TRUE(twin.has_value());
  EXPECT_TRUE(bit_equal(got, run_chunks(**twin, toks, {4, 3})));
  // Position 0 starts the slot afresh for a new owner, whose steps then continue it.
  got.clear();
  ASSERT_TRUE(step(3, 71, 0, 4).has_value());
  ASSERT_TRUE(step(3, 71, 4, 3).has_value());
  EXPECT_TRUE(bit_equal(got, run_chunks(**twin, toks, {4, 3})));
  bad = step(3, 70, 4, 1);  // the slot's former owner, late
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("holds the positions of owner 71"), std::string::npos)
      << bad.error().message;
}

// Qwen3.5 as llama.cpp converts it: value heads tiled, b and a apart, its multimodal rope's
// sections (text positions: NeoX rope on the rotated quarter). The MoE and the dense form, each
// against the float64 reference of the same weights in Qwen3-Next's order.
TEST(Qwen3Next, Qwen35TiledHeadsMatchTheReference) {
  for (const std::string arch : {"qwen35moe", "qwen35"}) {
    SCOPED_TRACE(arch);
    TempDir dir, hf;
    const std::string gguf = testing::synth_arch(dir, arch, 15);
    auto m = load(gguf);
    ASSERT_TRUE(m);
    const model::ModelSpec& s = m->spec;
    EXPECT_STREQ(model::arch_name(s.arch), arch.c_str());
    EXPECT_TRUE(s.ssm_tiled);
    EXPECT_EQ(s.ssm_v_heads / s.ssm_k_heads, 2);  // so that tiled and grouped orders differ
    EXPECT_TRUE(s.layers[0].ssm_beta.present());
    EXPECT_FALSE(s.layers[0].ssm_ba.present());
    EXPECT_EQ(s.layers[0].is_moe, arch == "qwen35moe");
    const std::string untiled = untiled_as_qwen3next(dir, gguf);
    ASSERT_NO_FATAL_FAILURE(testing::write_qwen3next_hf_twin(untiled, hf));
    const auto vocab = static_cast<int32_t>(s.n_vocab);
    const std::vector<int32_t> prompt = prompt_of(21, vocab, 13);
    const std::vector<double> ref = testing::qwen3next_reference_logits(hf.path(), prompt);
    expect_near_reference(prompt_logits(m, prompt), ref, vocab);
    expect_near_reference(prompt_logits(hf.path(), prompt), ref, vocab);
    expect_batch_invariant(m);
  }
}

// Qwen3.5 as released, in Hugging Face form (Qwen3_5MoeForConditionalGeneration and the
// dense Qwen3_5ForConditionalGeneration; the text-only causal classes, experts one by one): its
// decoder under model.language_model., in_proj_qkv / z / b / a apart with value heads grouped by
// key head, experts stacked, rope in rope_parameters; MTP and vision tensors skipped. The same
// weights as the Qwen3-Next twin give its logits bit for bit (each projection row is the same
// dot product), near the float64 reference.
TEST(Qwen3Next, Qwen35HuggingFaceFormMatchesQwen3NextBitForBit) {
  struct Case {
    const char* arch;
    testing::Qwen35HfOptions o;
  };
  for (const Case& c :
       {Case{"qwen35moe", {}}, Case{"qwen35moe", {false, false}}, Case{"qwen35", {}}}) {
    SCOPED_TRACE(std::string(c.arch) + (c.o.multimodal ? " multimodal" : " causal") +
                 (c.o.stacked_experts ? ", stacked experts" : ", experts one by one"));
    TempDir dir, next, hf;
    // Half of each head rotated (not the config class's default quarter), so that the
    // partial_rotary_factor in rope_parameters must be read.
    const std::string untiled = testing::edited_gguf(
        dir, "half_rope.gguf", untiled_as_qwen3next(dir, testing::synth_arch(dir, c.arch, 16)),
        [&](model::GgufWriter& w) {
          auto f = model::GgufFile::open(dir.file("untiled.gguf"));
          ASSERT_TRUE(f.has_value());
          w.set_u32("qwen3next.rope.dimension_count",
                    static_cast<uint32_t>((*f)->get_int("qwen3next.attention.key_length") / 2));
        });
    ASSERT_NO_FATAL_FAILURE(testing::write_qwen3next_hf_twin(untiled, next));
    ASSERT_NO_FATAL_FAILURE(testing::write_qwen35_hf_twin(untiled, hf, c.o));
    auto m = load(hf.path());
    ASSERT_TRUE(m);
    const model::ModelSpec& s = m->spec;
    EXPECT_STREQ(model::arch_name(s.arch), c.arch);
    EXPECT_FALSE(s.ssm_tiled);
    EXPECT_EQ(2 * s.n_rot, s.head_dim_k);
    EXPECT_TRUE(s.layers[0].ssm_qkv.present() && s.layers[0].ssm_beta.present());
    EXPECT_EQ(s.layers[0].is_moe, std::string(c.arch) == "qwen35moe");
    const auto vocab = static_cast<int32_t>(s.n_vocab);
    const std::vector<int32_t> prompt = prompt_of(21, vocab, 13);
    const std::vector<float> got = prompt_logits(m, prompt);
    EXPECT_TRUE(bit_equal(got, prompt_logits(next.path(), prompt)));
    expect_near_reference(got, testing::qwen3next_reference_logits(next.path(), prompt), vocab);
  }
  // Sections of the multimodal rope that do not cover the rotated pairs are refused by name.
  TempDir dir, hf;
  const std::string untiled = untiled_as_qwen3next(dir, testing::synth_arch(dir, "qwen35moe", 17));
  ASSERT_NO_FATAL_FAILURE(testing::write_qwen35_hf_twin(untiled, hf));
  std::ifstream in(hf.file("config.json"));
  nlohmann::json cfg = nlohmann::json::parse(in);
  cfg["text_config"]["rope_parameters"]["mrope_section"] = {1, 1, 1};
  hf.write("config.json", cfg.dump());
  const std::string e = load_error(hf.path());
  EXPECT_NE(e.find("rope_parameters.mrope_section [1,1,1] must be up to 4 counts summing to the"),
            std::string::npos)
      << e;
}

TEST(Qwen3Next, BadFilesAreRefusedByName) {
  TempDir dir, hf;
  const std::string gguf = synth_qwen3next(dir, 7);
  auto expect_error = [](const std::string& path, const std::string& what) {
    const std::string e = load_error(path);
    EXPECT_NE(e.find(what), std::string::npos) << e;
  };
  expect_error(
      testing::edited_gguf(dir, "no_a.gguf", gguf, [](model::GgufWriter&) {}, {}, {"blk.1.ssm_a"}),
      "missing tensor 'blk.1.ssm_a'");
  expect_error(testing::edited_gguf(
                   dir, "heads.gguf", gguf,
                   [](model::GgufWriter& w) { w.set_u32("qwen3next.ssm.time_step_rank", 3); }),
               "value heads must be a multiple of the key heads");
  expect_error(testing::edited_gguf(
                   dir, "interval.gguf", gguf,
                   [](model::GgufWriter& w) { w.set_u32("qwen3next.full_attention_interval", 0); }),
               "full_attention_interval 0 must be in 1..4");
  // attention.recurrent_layers, when there, says which layers are linear: the file's own
  // layout loads (the interval then does not matter); a full layer named linear lacks its
  // tensors; a short list is refused.
  auto with_layers = [&](const char* name, std::vector<int32_t> flags) {
    return testing::edited_gguf(dir, name, gguf, [&](model::GgufWriter& w) {
      w.set_array_i32("qwen3next.attention.recurrent_layers", flags);
      w.set_u32("qwen3next.full_attention_interval", 2);
    });
  };
  expect_error(with_layers("layers_ok.gguf", {1, 1, 1, 0}), "loaded");
  expect_error(with_layers("layers_bad.gguf", {1, 1, 1, 1}), "missing tensor 'blk.3.attn_qkv");
  expect_error(with_layers("layers_short.gguf", {1, 1, 1}),
               "attention.recurrent_layers must hold a flag per layer (4)");
  const std::string q35 = testing::synth_arch(dir, "qwen35moe", 8);
  expect_error(
      testing::edited_gguf(
          dir, "sections.gguf", q35,
          [](model::GgufWriter& w) {
            w.set_array_i32("qwen35moe.rope.dimension_sections", std::vector<int32_t>{2, 2, 1, 0});
          }),
      "rope.dimension_sections must be 3 or 4 counts of rotated pairs");
  ASSERT_NO_FATAL_FAILURE(testing::write_qwen3next_hf_twin(gguf, hf, {.drop_a_log = true}));
  expect_error(hf.path(), "missing tensor 'model.layers.0.linear_attn.A_log'");
  // A layer_types entry of another family's kind.
  TempDir hf2;
  ASSERT_NO_FATAL_FAILURE(testing::write_qwen3next_hf_twin(gguf, hf2));
  std::ifstream in(hf2.file("config.json"));
  nlohmann::json cfg = nlohmann::json::parse(in);
  cfg["layer_types"][0] = "sliding_attention";
  hf2.write("config.json", cfg.dump());
  expect_error(hf2.path(),
               "layer_types[0] is \"sliding_attention\"; troupe reads "
               "\"linear_attention\" and \"full_attention\"");
}

}  // namespace
}  // namespace troupe::compute
