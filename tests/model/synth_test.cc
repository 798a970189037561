// synth_model: metadata and tensors match ../shared's llama.cpp-convention models, weights are
// deterministic and sensibly scaled, the built-in vocabulary is well formed, bad options fail.
#include "model/synth.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include "model/gguf.h"
#include "tests/test_support.h"

namespace troupe::model {
namespace {

using testing::TempDir;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string value_string(const GgufValue& v) {
  switch (v.type) {
    case GgufType::kString:
      return "s:" + std::string(v.str);
    case GgufType::kF32:
    case GgufType::kF64:
      return "f:" + std::to_string(v.f);
    case GgufType::kArray: {
      std::string s =
          "a" + std::to_string(static_cast<int>(v.elem_type)) + ":" + std::to_string(v.count);
      if (v.elem_type == GgufType::kString) {
        for (auto x : v.strings) s += "|" + std::string(x);
      } else {
        for (uint64_t i = 0; i < v.count; ++i) s += "|" + std::to_string(v.array_f64(i));
      }
      return s;
    }
    default:
      return "i:" + std::to_string(v.i) + "/" + std::to_string(v.u);
  }
}

struct RefCase {
  const char* dir;
  const char* arch;
  GgmlType dtype;
};

class SynthMatchesShared : public ::testing::TestWithParam<RefCase> {};

TEST_P(SynthMatchesShared, SameKeysTensorsAndShapes) {
  TROUPE_SHARED_OR_SKIP(shared);
  const RefCase rc = GetParam();
  auto ref = GgufFile::open(shared + "/models/synth/" + rc.dir + "/model.gguf");
  ASSERT_TRUE(ref.has_value()) << ref.error().message;
  TempDir tmp;
  SynthOptions o;
  o.arch = rc.arch;
  o.dtype = rc.dtype;
  o.vocab_donor = shared + "/models/stories260K/stories260K.gguf";
  o.command_line = "test";
  const std::string out = tmp.file("m.gguf");
  auto sum = synth_model_summary(o, out);
  ASSERT_TRUE(sum.has_value()) << sum.error().message;
  auto got = GgufFile::open(out);
  ASSERT_TRUE(got.has_value()) << got.error().message;
  const GgufFile& r = **ref;
  const GgufFile& g = **got;

  for (const auto& [key, value] : r.metadata()) {
    const GgufValue* mine = g.find(key);
    ASSERT_NE(mine, nullptr) << "missing key " << key;
    EXPECT_EQ(mine->type, value.type) << key;
    if (key == "general.synth.command") continue;
    EXPECT_EQ(value_string(*mine), value_string(value)) << key;
  }
  for (const auto& [key, value] : g.metadata())
    EXPECT_NE(r.find(key), nullptr) << "extra key " << key;

  ASSERT_EQ(g.tensors().size(), r.tensors().size());
  for (size_t i = 0; i < r.tensors().size(); ++i) {
    const TensorInfo& a = r.tensors()[i];
    const TensorInfo& b = g.tensors()[i];
    EXPECT_EQ(b.name, a.name) << i;
    EXPECT_EQ(b.shape_string(), a.shape_string()) << a.name;
    EXPECT_EQ(b.type, a.type) << a.name;
  }
  EXPECT_EQ(sum->num_tensors, static_cast<int>(r.tensors().size()));
  EXPECT_EQ(sum->n_vocab, 512);
  EXPECT_EQ(sum->num_bytes, std::filesystem::file_size(out));
  EXPECT_TRUE(sum->notes.empty());
}

INSTANTIATE_TEST_SUITE_P(Synth, SynthMatchesShared,
                         ::testing::Values(RefCase{"llama-dense", "llama", GgmlType::kF32},
                                           RefCase{"llama-dense-f16", "llama", GgmlType::kF16},
                                           RefCase{"mixtral-moe", "mixtral", GgmlType::kF32},
                                           RefCase{"qwen3moe", "qwen3moe", GgmlType::kF32},
                                           RefCase{"qwen2moe", "qwen2moe", GgmlType::kF32},
                                           RefCase{"deepseek2", "deepseek2", GgmlType::kF32}),
                         [](const ::testing::TestParamInfo<RefCase>& i) {
                           std::string s = i.param.dir;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

TEST(Synth, SameSeedSameBytesAnyThreadCount) {
  TempDir tmp;
  SynthOptions o;
  o.arch = "qwen2moe";
  o.dtype = GgmlType::kQ8_0;
  o.seed = 7;
  o.num_threads = 1;
  ASSERT_TRUE(synth_model(o, tmp.file("a.gguf")).has_value());
  o.num_threads = 4;
  ASSERT_TRUE(synth_model(o, tmp.file("b.gguf")).has_value());
  o.seed = 8;
  ASSERT_TRUE(synth_model(o, tmp.file("c.gguf")).has_value());
  const std::string a = read_bytes(tmp.file("a.gguf"));
  EXPECT_GT(a.size(), 100000u);
  EXPECT_EQ(a, read_bytes(tmp.file("b.gguf")));
  EXPECT_NE(a, read_bytes(tmp.file("c.gguf")));
}

TEST(Synth, WeightsAreScaledByFanIn) {
  TempDir tmp;
  SynthOptions o;
  o.n_embd = 256;
  o.n_ff = 512;
  o.n_layer = 1;
  ASSERT_TRUE(synth_model(o, tmp.file("m.gguf")).has_value());
  auto f = GgufFile::open(tmp.file("m.gguf"));
  ASSERT_TRUE(f.has_value());
  auto stats = [&](const char* name, double* mean, double* sd) {
    const TensorInfo* t = (*f)->find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    const auto* x = reinterpret_cast<const float*>(t->data);
    const int64_t n = t->num_elements();
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; ++i) s += x[i], s2 += double(x[i]) * x[i];
    *mean = s / n;
    *sd = std::sqrt(s2 / n - *mean * *mean);
  };
  double m, sd;
  stats("blk.0.attn_q.weight", &m, &sd);
  EXPECT_NEAR(m, 0, 0.01);
  EXPECT_NEAR(sd, 1 / 16.0, 0.005);
  stats("blk.0.ffn_down.weight", &m, &sd);
  EXPECT_NEAR(sd, 1 / std::sqrt(512.0), 0.003);
  stats("token_embd.weight", &m, &sd);
  EXPECT_NEAR(sd, 1.0, 0.05);
  stats("blk.0.attn_norm.weight", &m, &sd);
  EXPECT_NEAR(m, 1.0, 0.02);
  EXPECT_LT(sd, 0.1);
  EXPECT_EQ((*f)->get_string("tokenizer.ggml.model"), "gpt2");
  // Output rows of <|bos|>/<|eos|> are drawn small so random generation rarely stops early.
  const TensorInfo* out = (*f)->find_tensor("output.weight");
  ASSERT_NE(out, nullptr);
  const auto* w = reinterpret_cast<const float*>(out->data);
  auto row_rms = [&](int64_t r) {
    double s2 = 0;
    for (int64_t j = 0; j < 256; ++j) s2 += double(w[r * 256 + j]) * w[r * 256 + j];
    return std::sqrt(s2 / 256);
  };
  const BuiltinVocab v = builtin_vocab();
  EXPECT_LT(row_rms(v.eos_id), 0.2 / 16);
  EXPECT_GT(row_rms(100), 0.7 / 16);
}

TEST(Synth, BuiltinVocabularyIsWellFormed) {
  const BuiltinVocab v = builtin_vocab();
  ASSERT_EQ(v.tokens.size(), 512u);
  ASSERT_EQ(v.token_types.size(), 512u);
  EXPECT_EQ(v.tokens[0], "!");
  EXPECT_EQ(v.tokens[188], "\xC4\x80");  // byte 0 -> U+0100
  EXPECT_EQ(v.tokens[v.bos_id], "<|bos|>");
  EXPECT_EQ(v.tokens[v.eos_id], "<|eos|>");
  EXPECT_EQ(v.token_types[v.bos_id], 3);
  EXPECT_EQ(v.token_types[0], 1);
  EXPECT_GE(v.merges.size(), 250u);
  std::set<std::string> toks(v.tokens.begin(), v.tokens.end());
  EXPECT_EQ(toks.size(), v.tokens.size()) << "duplicate tokens";
  for (const std::string& m : v.merges) {
    const size_t sp = m.find(' ');
    ASSERT_NE(sp, std::string::npos) << m;
    EXPECT_TRUE(toks.count(m.substr(0, sp))) << m;
    EXPECT_TRUE(toks.count(m.substr(sp + 1))) << m;
    EXPECT_TRUE(toks.count(m.substr(0, sp) + m.substr(sp + 1))) << m;
  }
  EXPECT_TRUE(toks.count("\xC4\xA0the")) << "expected a merged ' the' token";
  // Same every time; a larger target learns more merges, then pads.
  EXPECT_EQ(builtin_vocab().merges, v.merges);
  const BuiltinVocab big = builtin_vocab(4000);
  EXPECT_EQ(big.tokens.size(), 4000u);
  EXPECT_EQ(big.tokens.back().rfind("<|reserved_", 0), 0u);
  EXPECT_GT(big.merges.size(), v.merges.size());
}

TEST(Synth, FallsBackToF16ForRowsOffTheBlockSize) {
  TempDir tmp;
  SynthOptions o;
  o.arch = "deepseek2";
  o.dtype = GgmlType::kQ4_0;
  o.qk_nope_dim = 16;  // attn_k_b rows of 16
  o.n_layer = 2;
  auto sum = synth_model_summary(o, tmp.file("m.gguf"));
  ASSERT_TRUE(sum.has_value()) << sum.error().message;
  ASSERT_EQ(sum->notes.size(), 1u);
  EXPECT_EQ(sum->notes[0],
            "attn_k_b.weight: row of 16 is not a multiple of the q4_0 block (32): stored as f16");
  auto f = GgufFile::open(tmp.file("m.gguf"));
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ((*f)->find_tensor("blk.1.attn_k_b.weight")->type, GgmlType::kF16);
  EXPECT_EQ((*f)->find_tensor("blk.1.attn_v_b.weight")->type, GgmlType::kQ4_0);
  EXPECT_EQ((*f)->find_tensor("blk.1.ffn_gate_inp.weight")->type, GgmlType::kF32);
  EXPECT_EQ((*f)->get_int("general.file_type"), 2);
}

// Rows off the 256-value super-block (widths like Qwen2.5-0.5B's 896) take the 32-value type
// llama.cpp's quantizer writes there: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K / Q3_K /
// IQ4_XS -> IQ4_NL; rows that fit keep the K-quant.
TEST(Synth, KQuantRowsOffTheSuperBlockTakeLlamaCppsFallbackTypes) {
  TempDir tmp;
  struct Want {
    const char* dtype;
    GgmlType narrow, narrow_mixed;  // rows of 288: the dtype's and the mix's Q6_K fallback
    GgmlType wide;                  // rows of 512 (ffn_down, an odd layer)
  };
  const Want wants[] = {{"q4_k_m", GgmlType::kQ5_0, GgmlType::kQ8_0, GgmlType::kQ4_K},
                        {"q5_k", GgmlType::kQ5_1, GgmlType::kQ5_1, GgmlType::kQ5_K},
                        {"q3_k", GgmlType::kIQ4_NL, GgmlType::kIQ4_NL, GgmlType::kQ3_K},
                        {"iq4_xs", GgmlType::kIQ4_NL, GgmlType::kIQ4_NL, GgmlType::kIQ4_XS}};
  for (const Want& w : wants) {
    SynthOptions o;
    o.arch = "llama";
    o.n_embd = 288;
    o.n_head = 4;
    o.n_head_kv = 2;
    o.n_ff = 512;
    o.n_layer = 2;
    ASSERT_TRUE(parse_synth_dtype(w.dtype, &o));
    const std::string path = tmp.file(std::string(w.dtype) + ".gguf");
    auto sum = synth_model_summary(o, path);
    ASSERT_TRUE(sum.has_value()) << sum.error().message;
    ASSERT_FALSE(sum->notes.empty());
    EXPECT_EQ(sum->notes[0], "token_embd.weight: row of 288 is not a multiple of the " +
                                 type_name(o.dtype) + " block (256): stored as " +
                                 type_name(w.narrow))
        << w.dtype;
    auto f = GgufFile::open(path);
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ((*f)->find_tensor("blk.1.attn_q.weight")->type, w.narrow) << w.dtype;
    EXPECT_EQ((*f)->find_tensor("blk.0.attn_v.weight")->type, w.narrow_mixed) << w.dtype;
    EXPECT_EQ((*f)->find_tensor("output.weight")->type, w.narrow_mixed) << w.dtype;
    EXPECT_EQ((*f)->find_tensor("blk.1.ffn_down.weight")->type, w.wide) << w.dtype;
  }
}

// --dtype q4_k_m / q5_k_m: Q4_K / Q5_K, with Q6_K for the output head and attn_v / ffn_down of
// even layers.
TEST(Synth, KQuantMixKeepsSomeMatricesInQ6K) {
  struct Mix {
    const char* dtype;
    GgmlType base;
    const char* name;
    int file_type;
  };
  for (const Mix& m : {Mix{"q4_k_m", GgmlType::kQ4_K, "q4_K_M", 15},
                       Mix{"q5_k_m", GgmlType::kQ5_K, "q5_K_M", 17}}) {
    SCOPED_TRACE(m.dtype);
    TempDir tmp;
    SynthOptions o;
    ASSERT_TRUE(parse_synth_dtype(m.dtype, &o));
    EXPECT_FALSE(parse_synth_dtype("q4_k_s", &o));
    o.arch = "llama";
    o.n_embd = 256;
    o.n_ff = 512;
    o.n_layer = 3;
    auto sum = synth_model_summary(o, tmp.file("m.gguf"));
    ASSERT_TRUE(sum.has_value()) << sum.error().message;
    EXPECT_EQ(sum->dtype, m.name);
    auto f = GgufFile::open(tmp.file("m.gguf"));
    ASSERT_TRUE(f.has_value());
    auto type = [&](const std::string& n) { return (*f)->find_tensor(n)->type; };
    EXPECT_EQ(type("output.weight"), GgmlType::kQ6_K);
    EXPECT_EQ(type("token_embd.weight"), m.base);
    for (int l = 0; l < 3; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      const GgmlType mixed = l % 2 == 0 ? GgmlType::kQ6_K : m.base;
      EXPECT_EQ(type(b + "attn_v.weight"), mixed) << l;
      EXPECT_EQ(type(b + "ffn_down.weight"), mixed) << l;
      EXPECT_EQ(type(b + "attn_q.weight"), m.base) << l;
      EXPECT_EQ(type(b + "ffn_up.weight"), m.base) << l;
    }
    EXPECT_EQ((*f)->get_int("general.file_type"), m.file_type);
  }
}

TEST(Synth, DeepseekWithoutQLoraUsesPlainQ) {
  TempDir tmp;
  SynthOptions o;
  o.arch = "deepseek2";
  o.q_lora_rank = 0;
  o.gating = "softmax";
  o.n_expert_shared = 2;
  o.n_layer = 2;
  ASSERT_TRUE(synth_model(o, tmp.file("m.gguf")).has_value());
  auto f = GgufFile::open(tmp.file("m.gguf"));
  ASSERT_TRUE(f.has_value());
  const GgufFile& g = **f;
  EXPECT_NE(g.find_tensor("blk.0.attn_q.weight"), nullptr);
  EXPECT_EQ(g.find_tensor("blk.0.attn_q_a.weight"), nullptr);
  EXPECT_EQ(g.find_tensor("blk.1.exp_probs_b.bias"), nullptr);
  EXPECT_EQ(g.find_tensor("blk.1.ffn_up_shexp.weight")->shape_string(), "[128, 64]");
  EXPECT_EQ(g.get_int("deepseek2.attention.q_lora_rank"), 0);
  EXPECT_EQ(g.get_int("deepseek2.expert_gating_func"), 1);
  EXPECT_EQ(g.get_int("deepseek2.attention.key_length"), 32 + 16);
  EXPECT_EQ(g.get_int("deepseek2.attention.key_length_mla"), 32 + 16);
}

// GLM-4.5 as llama.cpp's converter writes it: the norm before the FFN named
// post_attention_norm, rope on half of each head, and the multi-token-prediction layer last.
TEST(Synth, Glm4MoeHasLlamaCppsLayout) {
  TempDir tmp;
  SynthOptions o;
  o.arch = "glm4moe";
  o.n_layer = 3;
  o.head_dim = 12;
  o.n_expert_shared = 2;
  ASSERT_TRUE(synth_model(o, tmp.file("m.gguf")).has_value());
  auto f = GgufFile::open(tmp.file("m.gguf"));
  ASSERT_TRUE(f.has_value());
  const GgufFile& g = **f;
  EXPECT_EQ(g.get_int("glm4moe.block_count"), 4);
  EXPECT_EQ(g.get_int("glm4moe.nextn_predict_layers"), 1);
  EXPECT_EQ(g.get_int("glm4moe.attention.key_length"), 12);
  EXPECT_EQ(g.get_int("glm4moe.rope.dimension_count"), 6);
  EXPECT_EQ(g.get_int("glm4moe.expert_gating_func"), 2);
  EXPECT_EQ(g.get_int("glm4moe.leading_dense_block_count"), 1);
  EXPECT_EQ(g.find("glm4moe.expert_group_count"), nullptr);
  EXPECT_NE(g.find_tensor("blk.0.post_attention_norm.weight"), nullptr);
  EXPECT_EQ(g.find_tensor("blk.0.ffn_norm.weight"), nullptr);
  EXPECT_NE(g.find_tensor("blk.0.ffn_gate.weight"), nullptr);
  EXPECT_NE(g.find_tensor("blk.1.attn_q.bias"), nullptr);
  EXPECT_EQ(g.find_tensor("blk.1.attn_q_norm.weight")->shape_string(), "[12]");
  EXPECT_NE(g.find_tensor("blk.2.exp_probs_b.bias"), nullptr);
  EXPECT_EQ(g.find_tensor("blk.2.ffn_up_shexp.weight")->shape_string(), "[128, 64]");
  EXPECT_EQ(g.find_tensor("blk.2.nextn.eh_proj.weight"), nullptr);
  EXPECT_EQ(g.find_tensor("blk.3.nextn.eh_proj.weight")->shape_string(), "[256, 128]");
  EXPECT_NE(g.find_tensor("blk.3.nextn.shared_head_norm.weight"), nullptr);
  EXPECT_NE(g.find_tensor("blk.3.ffn_gate_exps.weight"), nullptr);
}

// MiniMax-M2 as llama.cpp's converter writes it: q/k norms over all heads, rope on half of each
// head, every layer routed with a selection bias, experts feed_forward_length wide.
TEST(Synth, MinimaxM2HasLlamaCppsLayout) {
  TempDir tmp;
  SynthOptions o;
  o.arch = "minimax-m2";
  o.n_layer = 2;
  o.n_head = 4;
  o.n_head_kv = 2;
  o.head_dim = 16;
  o.n_ff = 24;
  ASSERT_TRUE(synth_model(o, tmp.file("m.gguf")).has_value());
  auto f = GgufFile::open(tmp.file("m.gguf"));
  ASSERT_TRUE(f.has_value());
  const GgufFile& g = **f;
  EXPECT_EQ(g.get_int("minimax-m2.block_count"), 2);
  EXPECT_EQ(g.get_int("minimax-m2.rope.dimension_count"), 8);
  EXPECT_EQ(g.get_int("minimax-m2.expert_gating_func"), 2);
  EXPECT_EQ(g.get_int("minimax-m2.expert_feed_forward_length"), 24);
  EXPECT_EQ(g.get_int("minimax-m2.feed_forward_length"), 24);
  EXPECT_EQ(g.find_tensor("blk.0.attn_q_norm.weight")->shape_string(), "[64]");
  EXPECT_EQ(g.find_tensor("blk.0.attn_k_norm.weight")->shape_string(), "[32]");
  EXPECT_EQ(g.find_tensor("blk.0.ffn_gate_exps.weight")->shape_string(), "[128, 24, 8]");
  EXPECT_NE(g.find_tensor("blk.0.exp_probs_b.bias"), nullptr);
  EXPECT_NE(g.find_tensor("blk.1.ffn_norm.weight"), nullptr);
  EXPECT_EQ(g.find_tensor("blk.0.ffn_gate.weight"), nullptr);
  EXPECT_EQ(g.find_tensor("blk.0.attn_q.bias"), nullptr);
}

// Phi-4-mini's layout as llama.cpp's converter writes it: q, k and v in one matrix, ffn_up twice
// the FFN's width (the gate's rows, then up's) and no ffn_gate, rope on three quarters of each
// head, LongRoPE's two factor tensors (one divisor per rotary pair) and its attention factor,
// the window only when asked for.
TEST(Synth, Phi3HasLlamaCppsLayout) {
  TempDir tmp;
  SynthOptions o;
  o.arch = "phi3";
  o.n_layer = 2;
  o.n_ctx = 1024;
  ASSERT_TRUE(synth_model(o, tmp.file("m.gguf")).has_value());
  auto f = GgufFile::open(tmp.file("m.gguf"));
  ASSERT_TRUE(f.has_value());
  const GgufFile& g = **f;
  EXPECT_EQ(g.get_int("phi3.rope.dimension_count"), 12);  // of heads of 16
  EXPECT_EQ(g.get_int("phi3.rope.scaling.original_context_length"), 256);
  EXPECT_FLOAT_EQ(static_cast<float>(g.get_float_or("phi3.rope.scaling.attn_factor", 0)),
                  static_cast<float>(std::sqrt(1 + std::log(4.0) / std::log(256.0))));
  EXPECT_EQ(g.find("phi3.attention.sliding_window"), nullptr);
  EXPECT_EQ(g.find_tensor("rope_factors_short.weight")->shape_string(), "[6]");
  EXPECT_EQ(g.find_tensor("rope_factors_long.weight")->shape_string(), "[6]");
  EXPECT_EQ(g.find_tensor("blk.0.attn_qkv.weight")->shape_string(), "[128, 192]");
  EXPECT_EQ(g.find_tensor("blk.0.attn_q.weight"), nullptr);
  EXPECT_EQ(g.find_tensor("blk.1.ffn_up.weight")->shape_string(), "[128, 512]");
  EXPECT_EQ(g.find_tensor("blk.1.ffn_gate.weight"), nullptr);
  o.sliding_window = 32;
  ASSERT_TRUE(synth_model(o, tmp.file("w.gguf")).has_value());
  auto w = GgufFile::open(tmp.file("w.gguf"));
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ((*w)->get_int("phi3.attention.sliding_window"), 32);
}

// ERNIE 4.5's MoE layout as llama.cpp's converter writes it: Llama's tensors with the head tied
// to the embedding; from --n-dense-lead on, every --moe-layer-step-th layer has a router, its
// selection bias (exp_probs_b), stacked experts and the shared experts as one MLP of their
// summed width; the keys that say so.
TEST(Synth, Ernie45MoeHasLlamaCppsLayout) {
  TempDir tmp;
  SynthOptions o;
  o.arch = "ernie4_5-moe";
  o.moe_layer_step = 2;
  o.n_expert_shared = 3;
  ASSERT_TRUE(synth_model(o, tmp.file("m.gguf")).has_value());
  auto f = GgufFile::open(tmp.file("m.gguf"));
  ASSERT_TRUE(f.has_value());
  const GgufFile& g = **f;
  EXPECT_EQ(g.get_int("ernie4_5-moe.interleave_moe_layer_step"), 2);
  EXPECT_EQ(g.get_int("ernie4_5-moe.leading_dense_block_count"), 1);
  EXPECT_EQ(g.get_int("ernie4_5-moe.expert_shared_count"), 3);
  EXPECT_EQ(g.get_int("ernie4_5-moe.expert_shared_feed_forward_length"), 96);
  EXPECT_EQ(g.find_tensor("output.weight"), nullptr);
  EXPECT_NE(g.find_tensor("blk.0.ffn_gate.weight"), nullptr);  // leading dense
  EXPECT_NE(g.find_tensor("blk.1.ffn_gate_exps.weight"), nullptr);
  EXPECT_EQ(g.find_tensor("blk.1.exp_probs_b.bias")->shape_string(), "[8]");
  EXPECT_EQ(g.find_tensor("blk.1.ffn_up_shexp.weight")->shape_string(), "[128, 96]");
  EXPECT_EQ(g.find_tensor("blk.1.ffn_gate_inp_shexp.weight"), nullptr);
  EXPECT_NE(g.find_tensor("blk.2.ffn_gate.weight"), nullptr);  // between MoE layers
  EXPECT_NE(g.find_tensor("blk.3.ffn_down_exps.weight"), nullptr);
  EXPECT_EQ(g.find_tensor("blk.1.attn_q.weight")->shape_string(), "[128, 128]");
  o.arch = "ernie4_5";  // 0.3B's heads: twice n_embd / n_head
  o.moe_layer_step.reset();
  o.n_expert_shared.reset();
  ASSERT_TRUE(synth_model(o, tmp.file("d.gguf")).has_value());
  auto d = GgufFile::open(tmp.file("d.gguf"));
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ((*d)->get_int("ernie4_5.attention.key_length"), 32);
  EXPECT_EQ((*d)->find_tensor("blk.0.attn_q.weight")->shape_string(), "[128, 256]");
}

TEST(Synth, BuiltinVocabGrowsToNVocab) {
  TempDir tmp;
  SynthOptions o;
  o.n_vocab = 1000;
  o.n_layer = 1;
  auto sum = synth_model_summary(o, tmp.file("m.gguf"));
  ASSERT_TRUE(sum.has_value()) << sum.error().message;
  EXPECT_EQ(sum->n_vocab, 1000);
  auto f = GgufFile::open(tmp.file("m.gguf"));
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ((*f)->get_int("llama.vocab_size"), 1000);
  EXPECT_EQ((*f)->find_tensor("output.weight")->shape_string(), "[128, 1000]");
  EXPECT_EQ((*f)->find("tokenizer.ggml.tokens")->count, 1000u);
}

TEST(Synth, BadOptionsFailWithOneLine) {
  TempDir tmp;
  const std::string out = tmp.file("bad.gguf");
  auto err = [&](SynthOptions o) {
    auto r = synth_model(o, out);
    EXPECT_FALSE(r.has_value());
    return r.has_value() ? std::string() : r.error().message;
  };
  SynthOptions o;
  o.arch = "gpt5";
  EXPECT_EQ(
      err(o),
      "unknown --arch 'gpt5' (llama, mixtral, qwen2, qwen3, qwen2moe, qwen3moe, deepseek2, "
      "deepseek32, glm-dsa, glm4moe, minimax-m2, bailingmoe2, gpt-oss, gemma3, llama4, qwen3next, "
      "qwen35moe, qwen35, phi3, ernie4_5, ernie4_5-moe)");
  o = {};
  o.arch = "minimax-m2";
  o.n_ff_exp = 16;  // its experts are --n-ff wide
  EXPECT_EQ(err(o), "--n-ff-exp does not apply to --arch minimax-m2");
  o = {};
  o.arch = "glm4moe";
  o.gating = "softmax";  // GLM's router is always sigmoid
  EXPECT_EQ(err(o), "--gating does not apply to --arch glm4moe");
  o = {};
  o.arch = "glm4moe";
  o.n_group = 2;  // llama.cpp's glm4moe reads no expert groups
  EXPECT_EQ(err(o), "--n-group does not apply to --arch glm4moe");
  o = {};
  o.n_expert = 4;
  EXPECT_EQ(err(o), "--n-expert does not apply to --arch llama");
  o = {};
  o.arch = "mixtral";
  o.q_lora_rank = 4;
  EXPECT_EQ(err(o), "--q-lora-rank does not apply to --arch mixtral");
  o = {};
  o.n_embd = 100;
  o.n_head = 8;
  EXPECT_EQ(err(o), "--n-embd 100 is not a multiple of --n-head 8");
  o = {};
  o.n_head_kv = 3;
  EXPECT_EQ(err(o), "--n-head 8 is not a multiple of --n-head-kv 3");
  o = {};
  o.n_layer = 0;
  EXPECT_EQ(err(o), "--n-layer must be between 1 and 16777216, got 0");
  o = {};
  o.arch = "qwen3moe";
  o.n_expert_used = 9;
  EXPECT_EQ(err(o), "--n-expert-used 9 exceeds --n-expert 8");
  o = {};
  o.arch = "deepseek2";
  o.n_group = 3;
  EXPECT_EQ(err(o), "--n-expert 16 is not a multiple of --n-group 3");
  o = {};
  o.arch = "glm4moe";
  o.head_dim = 2;
  EXPECT_EQ(err(o), "--head-dim must be at least 4 for glm4moe");
  o = {};
  o.vocab_donor = "/nonexistent/donor.gguf";
  EXPECT_EQ(err(o).rfind("--vocab-donor: /nonexistent/donor.gguf: cannot open", 0), 0u);
  o = {};
  o.dtype = GgmlType::kQ8_K;
  EXPECT_EQ(err(o),
            "--dtype q8_K cannot be generated (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, "
            "q3_k, q4_k, q5_k, q6_k, q4_k_m, q5_k_m, iq4_nl, iq4_xs, mxfp4)");
  o = {};
  o.dtype = GgmlType::kQ8_0;
  o.k_mix = true;
  EXPECT_EQ(err(o), "a K-quant mix is made of q4_K or q5_K (--dtype q4_k_m or q5_k_m), not q8_0");
  o = {};
  o.n_vocab = 100;
  EXPECT_EQ(err(o), "--n-vocab must be between 258 and 4194304 for the built-in vocabulary");
  EXPECT_FALSE(std::filesystem::exists(out));
}

}  // namespace
}  // namespace troupe::model
