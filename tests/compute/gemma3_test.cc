// Google Gemma 3's text decoder (GGUF "gemma3", llama.cpp's conventions; Hugging Face
// Gemma3ForCausalLM) through the engine: a synthesized model against the independent float64
// forward pass of tests/gemma3_reference.h. New parts it exercises: embeddings scaled by
// sqrt(n_embd), RMSNorms of the attention's and the FFN's outputs, the GELU FFN, five
// sliding-window layers (their own rope base) to every global one, llama.cpp's query scale for
// the 27B shape, the final logit soft cap of the variant without a window, Gemma's 1 + w norms in
// the Hugging Face form, and image positions: input rows (unscaled) prefilled as one non-causal
// step. No ../shared golden case exists for this architecture.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numbers>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/model.h"
#include "model/synth.h"
#include "tests/compute/engine_test_util.h"
#include "tests/edited_model.h"
#include "tests/gemma3_hf_twin.h"
#include "tests/gemma3_reference.h"
#include "tests/hf_twin_model.h"
#include "tests/test_support.h"

namespace troupe::compute {
namespace {

using testing::TempDir;

std::string synth_gemma3(const TempDir& dir, uint64_t seed = 11) {
  return testing::synth_arch(dir, "gemma3", seed);
}

TEST(Gemma3, GgufMapsAsLlamaCpp) {
  TempDir dir;
  auto m = model::load_model(synth_gemma3(dir));
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const model::ModelSpec& s = (*m)->spec;
  EXPECT_EQ(s.arch, model::Arch::kGemma3);
  EXPECT_STREQ(model::arch_name(s.arch), "gemma3");
  EXPECT_EQ(s.ffn_act, model::FfnAct::kGeluTanh);
  EXPECT_EQ(s.embd_scale, std::sqrt(128.0f));
  EXPECT_EQ(s.rope_style, model::RopeStyle::kNeox);
  EXPECT_EQ(s.rope_theta_local, 10000.f);
  EXPECT_EQ(s.kq_scale_mult, 1.0);
  EXPECT_EQ(s.final_logit_softcap, 0.f);
  EXPECT_EQ(s.output.data, s.token_embd.data) << "the head is the embedding";
  ASSERT_EQ(s.layers.size(), 7u);
  for (size_t il = 0; il < s.layers.size(); ++il) {
    const model::LayerSpec& L = s.layers[il];
    const bool global = il == 5;  // five sliding-window layers, then a global one
    EXPECT_EQ(L.window, global ? 0 : 8) << il;
    EXPECT_EQ(L.local_rope, !global) << il;
    EXPECT_TRUE(L.attn_post_norm.present() && L.ffn_post_norm.present()) << il;
    EXPECT_TRUE(L.q_norm.present() && L.k_norm.present()) << il;
    EXPECT_EQ(L.attn_post_norm.name, "blk." + std::to_string(il) + ".post_attention_norm.weight");
    EXPECT_FALSE(L.is_moe);
  }
}

// No golden case exists: the engine's logits are held to an independent float64 forward pass.
// 40 tokens over a window of 8, KV blocks of 4 and 16.
TEST(Gemma3, EngineMatchesTheFloat64Reference) {
  TempDir dir;
  const std::string path = synth_gemma3(dir);
  auto m = model::load_model(path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const int32_t vocab = static_cast<int32_t>((*m)->spec.n_vocab);
  const std::vector<int32_t> prompt = prompt_of(40, vocab, 19);
  expect_engine_near_reference(*m, prompt, testing::gemma3_reference_logits(path, prompt));
}

TEST(Gemma3, LogitsBitIdenticalAcrossChunkingThreadsAndBatches) {
  TempDir dir;
  auto m = model::load_model(synth_gemma3(dir, 17));
  ASSERT_TRUE(m.has_value()) << m.error().message;
  expect_batch_invariant(*m);
}

// llama.cpp's variants: without a sliding window every layer is global and the file's final
// logit soft cap applies; linear rope scaling stretches the global layers only; 62 layers (the
// 27B shape) scale queries by 1/sqrt(n_embd / n_head).
TEST(Gemma3, VariantsMatchTheReference) {
  TempDir dir;
  const std::string src = synth_gemma3(dir, 23);
  const std::string no_window = testing::edited_gguf(dir, "nw.gguf", src, [](auto& w) {
    w.remove_key("gemma3.attention.sliding_window");
    w.set_f32("gemma3.final_logit_softcapping", 3.0f);
  });
  const std::string linear = testing::edited_gguf(dir, "lin.gguf", src, [](auto& w) {
    w.set_string("gemma3.rope.scaling.type", "linear");
    w.set_f32("gemma3.rope.scaling.factor", 8.0f);
  });
  model::SynthOptions o;
  o.arch = "gemma3";
  o.seed = 29;
  o.n_ctx = 256;
  o.n_layer = 62;
  o.n_embd = 64;
  o.n_head = 4;
  o.head_dim = 32;  // n_embd / n_head is 16
  o.n_ff = 64;
  const std::string deep = dir.file("62.gguf");
  ASSERT_TRUE(model::synth_model(o, deep).has_value());
  for (const std::string& path : {no_window, linear, deep}) {
    SCOPED_TRACE(path);
    auto m = model::load_model(path);
    ASSERT_TRUE(m.has_value()) << m.error().message;
    const model::ModelSpec& s = (*m)->spec;
    if (path == no_window) {
      EXPECT_EQ(s.final_logit_softcap, 3.0f);
      for (const model::LayerSpec& L : s.layers) EXPECT_TRUE(L.window == 0 && !L.local_rope);
    }
    if (path == linear) {
      EXPECT_EQ(s.rope_scaling.type, model::RopeScalingType::kLinear);
    }
    if (path == deep) {
      EXPECT_DOUBLE_EQ(s.kq_scale_mult, std::sqrt(2.0));
    }
    const int32_t vocab = static_cast<int32_t>(s.n_vocab);
    const std::vector<int32_t> prompt = prompt_of(20, vocab, 31);
    expect_near_reference(prompt_logits(*m, prompt), testing::gemma3_reference_logits(path, prompt),
                          vocab);
  }
}

// The Hugging Face form (norms stored as w - 1, the names Gemma3ForCausalLM uses) gives the
// GGUF's logits bit for bit.
TEST(Gemma3, HuggingFaceTwinEqualsTheGguf) {
  TempDir dir, hf;
  const std::string path = synth_gemma3(dir, 37);
  testing::write_gemma3_hf_twin(path, hf);
  auto m = model::load_model(hf.path());
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const model::ModelSpec& s = (*m)->spec;
  EXPECT_EQ(s.arch, model::Arch::kGemma3);
  EXPECT_EQ(s.output.data, s.token_embd.data);
  EXPECT_EQ(s.layers[5].window, 0);
  EXPECT_EQ(s.layers[6].window, 8);
  EXPECT_TRUE(s.layers[6].local_rope);
  const std::vector<int32_t> prompt = prompt_of(30, static_cast<int32_t>(s.n_vocab), 41);
  EXPECT_TRUE(bit_equal(prompt_logits(*m, prompt), prompt_logits(path, prompt)));
}

// The multimodal checkpoints (Gemma 3 4B, 12B, 27B): the decoder under text_config, keys at
// Gemma3TextConfig's defaults left out, tensors under either prefix transformers has written,
// the vision tower beside them unread: the GGUF's logits bit for bit.
TEST(Gemma3, MultimodalCheckpointsTextDecoderEqualsTheGguf) {
  TempDir dir;
  const std::string path = synth_gemma3(dir, 39);
  const std::vector<int32_t> prompt = prompt_of(25, 512, 43);
  const std::vector<float> want = prompt_logits(path, prompt);
  for (const std::string prefix : {"language_model.model.", "model.language_model."}) {
    SCOPED_TRACE(prefix);
    TempDir hf;
    testing::write_gemma3_hf_twin(path, hf, prefix);
    auto m = model::load_model(hf.path());
    ASSERT_TRUE(m.has_value()) << m.error().message;
    EXPECT_EQ((*m)->spec.arch, model::Arch::kGemma3);
    EXPECT_EQ((*m)->spec.layers[5].window, 0);
    EXPECT_TRUE(bit_equal(prompt_logits(*m, prompt), want));
  }
}

// Gemma3TextConfig's keys: query_pre_attn_scalar, sliding_window_pattern (without layer_types),
// rope_local_base_freq and final_logit_softcapping are read; Gemma 2's attention soft cap and
// other activations are refused by name.
TEST(Gemma3, HuggingFaceConfigChecked) {
  TempDir dir, hf;
  testing::write_gemma3_hf_twin(synth_gemma3(dir, 43), hf);
  const nlohmann::json base =
      nlohmann::json::parse(testing::read_text_file(hf.file("config.json")));
  auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json c = base;
    edit(c);
    hf.write("config.json", c.dump());
    return hf.path();
  };
  {
    auto m = model::load_model(with([](nlohmann::json& c) {
      c.erase("layer_types");
      c["sliding_window_pattern"] = 3;
      c["query_pre_attn_scalar"] = 8;
      c["rope_local_base_freq"] = 5000.0;
      c["final_logit_softcapping"] = 30.0;
    }));
    ASSERT_TRUE(m.has_value()) << m.error().message;
    const model::ModelSpec& s = (*m)->spec;
    for (size_t il = 0; il < s.layers.size(); ++il)
      EXPECT_EQ(s.layers[il].window, (il + 1) % 3 != 0 ? 8 : 0) << il;
    EXPECT_DOUBLE_EQ(s.kq_scale_mult, std::sqrt(static_cast<double>(s.head_dim_k) / 8.0));
    EXPECT_EQ(s.rope_theta_local, 5000.f);
    EXPECT_EQ(s.final_logit_softcap, 30.f);
  }
  EXPECT_NE(load_error(with([](nlohmann::json& c) {
              c["attn_logit_softcapping"] = 50.0;
            })).find("attn_logit_softcapping is not supported"),
            std::string::npos);
  EXPECT_NE(load_error(with([](nlohmann::json& c) {
              c["hidden_activation"] = "relu";
            })).find("hidden_activation 'relu' is not supported for Gemma3ForCausalLM"),
            std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Image positions: input rows (SeqStep::kEmbedded) decoded as one non-causal step

// A Gemma 3 with a window of 4, smaller than the image below and than the prompt, so that both
// the window's lower bound and the global layer's whole prefix matter.
std::string synth_gemma3_window4(const TempDir& dir) {
  model::SynthOptions o;
  o.arch = "gemma3";
  o.seed = 47;
  o.n_ctx = 256;
  o.sliding_window = 4;
  const std::string path = dir.file("gemma3-w4.gguf");
  const Status st = model::synth_model(o, path);
  EXPECT_TRUE(st.has_value()) << st.error().message;
  return path;
}

// n rows [n, E] of deterministic N(0, 1) values (the magnitude of a projector's image rows):
// Box-Muller over mt19937, whose output the standard fixes.
std::vector<float> normal_rows(int64_t n, int64_t E, uint32_t seed) {
  std::mt19937 gen(seed);
  auto uniform = [&] { return (static_cast<double>(gen()) + 0.5) / 4294967296.0; };
  std::vector<float> rows(static_cast<size_t>(n * E));
  for (float& v : rows)
    v = static_cast<float>(std::sqrt(-2.0 * std::log(uniform())) *
                           std::cos(2.0 * std::numbers::pi * uniform()));
  return rows;
}

// One step of a plan: how many tokens, and whether they attend to all of the step.
struct Chunk {
  int64_t size = 0;
  bool non_causal = false;
};

// The logits [toks x vocab] of toks stepped chunk by chunk on seq (every position's row); the
// kEmbedded tokens take their rows from `rows` in order.
std::vector<float> run_steps(Engine& eng, Sequence& seq, std::span<const int32_t> toks,
                             std::span<const float> rows, const std::vector<Chunk>& chunks) {
  const auto E = static_cast<size_t>(eng.spec().n_embd);
  std::vector<float> out;
  size_t at = 0, row = 0;
  for (const Chunk& c : chunks) {
    const std::span<const int32_t> piece = toks.subspan(at, static_cast<size_t>(c.size));
    const size_t n_rows = static_cast<size_t>(std::ranges::count(piece, SeqStep::kEmbedded)) * E;
    EXPECT_TRUE(seq.reserve(c.size));
    SeqStep st = seq.next(piece, SeqStep::Logits::kAll);
    st.embd = rows.subspan(row, n_rows);
    st.non_causal = c.non_causal;
    StepResult r;
    const Status s = eng.step({&st, 1}, &r);
    EXPECT_TRUE(s.has_value()) << s.error().message;
    out.insert(out.end(), r.logits.begin(), r.logits.end());
    seq.advance(c.size);
    at += piece.size();
    row += n_rows;
  }
  return out;
}

// The prefill plan of a Gemma 3 image prompt: the text before the image, the image as one step
// (non-causal as llama.cpp decodes it, or causal), the text after it, then one step per token.
std::vector<Chunk> image_plan(int64_t before, int64_t image, int64_t after, int64_t decode,
                              bool non_causal) {
  std::vector<Chunk> plan{{before, false}, {image, non_causal}, {after, false}};
  for (int64_t i = 0; i < decode; ++i) plan.push_back({1, false});
  return plan;
}

std::vector<double> to_double(std::span<const float> v) { return {v.begin(), v.end()}; }

// 8 text tokens, a 6-position image of N(0, 1) rows prefilled as one non-causal step, 6 text
// tokens, then 4 greedy tokens decoded one by one: every position's logits against the float64
// reference. The same tokens with a causal image step give other logits from the image on (the
// same before it), and those match the reference without the non-causal range.
TEST(Gemma3, ImageRowsAndNonCausalChunkMatchReference) {
  TempDir dir;
  const std::string path = synth_gemma3_window4(dir);
  auto m = model::load_model(path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const auto vocab = static_cast<int32_t>((*m)->spec.n_vocab);
  const int64_t E = (*m)->spec.n_embd, kBefore = 8, kImage = 6, kAfter = 6, kDecode = 4;
  std::vector<int32_t> toks = prompt_of(kBefore, vocab, 13);
  toks.insert(toks.end(), kImage, SeqStep::kEmbedded);
  for (int32_t t : prompt_of(kAfter, vocab, 29)) toks.push_back(t);
  const std::vector<float> rows = normal_rows(kImage, E, 5);
  EngineOptions o;
  o.max_tokens_in_cache = 64;
  o.kv_block_size = 4;
  auto eng = Engine::create(*m, o);
  ASSERT_TRUE(eng.has_value()) << eng.error().message;

  Sequence seq(**eng);
  std::vector<float> got =
      run_steps(**eng, seq, toks, rows, image_plan(kBefore, kImage, kAfter, 0, true));
  for (int64_t i = 0; i < kDecode; ++i) {
    const std::span<const float> last(got.end() - vocab, got.end());
    toks.push_back(static_cast<int32_t>(std::ranges::max_element(last) - last.begin()));
    const std::vector<float> next = run_steps(**eng, seq, {&toks.back(), 1}, {}, {{1, false}});
    got.insert(got.end(), next.begin(), next.end());
  }
  testing::gemma3_ref::Prompt p{toks, to_double(rows), {{kBefore, kBefore + kImage}}};
  expect_near_reference(got, testing::gemma3_reference_logits(path, p), vocab);

  Sequence causal_seq(**eng);
  const std::vector<float> causal =
      run_steps(**eng, causal_seq, toks, rows, image_plan(kBefore, kImage, kAfter, kDecode, false));
  const auto split = static_cast<std::ptrdiff_t>(kBefore * vocab);
  EXPECT_TRUE(
      bit_equal({got.begin(), got.begin() + split}, {causal.begin(), causal.begin() + split}))
      << "the text before the image does not see it";
  for (size_t i = static_cast<size_t>(kBefore); i < toks.size(); ++i) {
    const auto at = static_cast<std::ptrdiff_t>(i) * vocab;
    EXPECT_FALSE(bit_equal({got.begin() + at, got.begin() + at + vocab},
                           {causal.begin() + at, causal.begin() + at + vocab}))
        << "position " << i << ": non_causal changed nothing";
  }
  p.non_causal.clear();
  expect_near_reference(causal, testing::gemma3_reference_logits(path, p), vocab);
}

// kEmbedded rows enter the decoder as they are: the token embedding rows of some tokens, given
// as rows, change the logits; the same rows times the model's sqrt(n_embd) give the token ids'
// logits bit for bit.
TEST(Gemma3, EmbeddedRowsTakeNoEmbeddingScale) {
  TempDir dir;
  const std::string path = synth_gemma3_window4(dir);
  auto m = model::load_model(path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const model::ModelSpec& s = (*m)->spec;
  const std::vector<int32_t> ids = prompt_of(10, static_cast<int32_t>(s.n_vocab), 7);
  const auto g = testing::gemma3_ref::open_gguf(path);
  const testing::gemma3_ref::Model ref = testing::gemma3_ref::read_model(*g);
  std::vector<int32_t> embedded(ids.begin(), ids.begin() + 3);
  std::vector<float> plain, scaled;  // f32 [7, n_embd]: the rows of ids[3..10)
  for (size_t i = 3; i < ids.size(); ++i) {
    embedded.push_back(SeqStep::kEmbedded);
    for (double v : testing::gemma3_ref::row(*ref.embed, ids[i])) {
      plain.push_back(static_cast<float>(v));
      scaled.push_back(static_cast<float>(v) * s.embd_scale);
    }
  }
  EngineOptions o;
  o.max_tokens_in_cache = 64;
  auto eng = Engine::create(*m, o);
  ASSERT_TRUE(eng.has_value()) << eng.error().message;
  auto logits = [&](const std::vector<int32_t>& toks, std::span<const float> rows) {
    Sequence seq(**eng);
    return run_steps(**eng, seq, toks, rows, {{static_cast<int64_t>(toks.size()), false}});
  };
  const std::vector<float> want = logits(ids, {});
  ASSERT_EQ(want.size(), ids.size() * static_cast<size_t>(s.n_vocab));
  EXPECT_TRUE(bit_equal(logits(embedded, scaled), want));
  EXPECT_FALSE(bit_equal(logits(embedded, plain), want));
}

}  // namespace
}  // namespace troupe::compute
