// Tests of load_hf_model: each shared HF checkpoint against its GGUF twin (hyperparameters and
// every weight element by element, q/k rows through the RoPE permutation for Llama), F16/BF16 and
// misaligned files, and one test per kind of bad config or missing tensor.

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>

#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"
#include "tests/edited_model.h"
#include "tests/test_support.h"

namespace troupe::model {
namespace {

using nlohmann::json;

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "message: " << (haystack)

using testing::TempDir;
using EditedModel = testing::EditedHfModel;

/// The whole tensor as floats (rows dequantized from its stored type).
std::vector<float> to_f32(const WeightView& w) {
  const int64_t rows = w.ne[1] * w.ne[2];
  std::vector<float> out(static_cast<size_t>(rows * w.ne[0]));
  for (int64_t r = 0; r < rows; ++r)
    dequantize_row(w.type, w.row(r), out.data() + r * w.ne[0], w.ne[0]);
  return out;
}

/// Every weight slot of a spec with a field path, in a fixed order.
std::vector<std::pair<std::string, const WeightView*>> all_weights(const ModelSpec& s) {
  std::vector<std::pair<std::string, const WeightView*>> v;
  v.emplace_back("token_embd", &s.token_embd);
  v.emplace_back("output_norm", &s.output_norm);
  v.emplace_back("output", &s.output);
  for (size_t il = 0; il < s.layers.size(); ++il) {
    const LayerSpec& L = s.layers[il];
    const std::string p = "layers[" + std::to_string(il) + "].";
    const std::pair<const char*, const WeightView*> fields[] = {{"attn_norm", &L.attn_norm},
                                                                {"wq", &L.wq},
                                                                {"wk", &L.wk},
                                                                {"wv", &L.wv},
                                                                {"wo", &L.wo},
                                                                {"bq", &L.bq},
                                                                {"bk", &L.bk},
                                                                {"bv", &L.bv},
                                                                {"q_norm", &L.q_norm},
                                                                {"k_norm", &L.k_norm},
                                                                {"wq_a", &L.wq_a},
                                                                {"q_a_norm", &L.q_a_norm},
                                                                {"wq_b", &L.wq_b},
                                                                {"wkv_a", &L.wkv_a},
                                                                {"kv_a_norm", &L.kv_a_norm},
                                                                {"wk_b", &L.wk_b},
                                                                {"wv_b", &L.wv_b},
                                                                {"ffn_norm", &L.ffn_norm},
                                                                {"ffn_gate", &L.ffn_gate},
                                                                {"ffn_up", &L.ffn_up},
                                                                {"ffn_down", &L.ffn_down},
                                                                {"router", &L.router},
                                                                {"router_bias", &L.router_bias},
                                                                {"shared.gate", &L.shared.gate},
                                                                {"shared.up", &L.shared.up},
                                                                {"shared.down", &L.shared.down},
                                                                {"shared_gate", &L.shared_gate}};
    for (const auto& [name, w] : fields) v.emplace_back(p + name, w);
    for (size_t e = 0; e < L.experts.size(); ++e) {
      const std::string x = p + "experts[" + std::to_string(e) + "].";
      v.emplace_back(x + "gate", &L.experts[e].gate);
      v.emplace_back(x + "up", &L.experts[e].up);
      v.emplace_back(x + "down", &L.experts[e].down);
    }
  }
  return v;
}

/// Row of the GGUF (interleaved-pair) q/k matrix that holds HF (rotate_half) row `r`:
/// llama.cpp's converter permutes each head's rows (j*hd/2 + i) to (2i + j).
int64_t gguf_row_of_hf_row(int64_t r, int64_t head_dim) {
  const int64_t h = r / head_dim, k = r % head_dim, half = head_dim / 2;
  const int64_t j = k / half, i = k % half;
  return h * head_dim + 2 * i + j;
}

struct TwinCase {
  std::string hf_dir;  // under shared/models/hf
  std::string gguf;    // under shared/models
};

/// Loads both forms and compares hyperparameters and every weight. Returns the HF model.
std::shared_ptr<const Model> compare_with_gguf(const std::string& shared, const TwinCase& c) {
  auto hf = load_hf_model(shared + "/models/hf/" + c.hf_dir);
  EXPECT_TRUE(hf.has_value()) << hf.error().message;
  if (!hf) return nullptr;
  auto g = GgufFile::open(shared + "/models/" + c.gguf);
  EXPECT_TRUE(g.has_value()) << g.error().message;
  if (!g) return nullptr;
  const ModelSpec& h = (*hf)->spec;
  const ModelSpec gs = spec_from_gguf(**g);

  EXPECT_EQ((*hf)->format, "hf");
  EXPECT_EQ(h.arch, gs.arch);
  EXPECT_EQ(h.n_vocab, gs.n_vocab);
  EXPECT_EQ(h.n_embd, gs.n_embd);
  EXPECT_EQ(h.n_layer, gs.n_layer);
  EXPECT_EQ(h.n_head, gs.n_head);
  EXPECT_EQ(h.n_head_kv, gs.n_head_kv);
  EXPECT_EQ(h.head_dim_k, gs.head_dim_k);
  EXPECT_EQ(h.head_dim_v, gs.head_dim_v);
  EXPECT_EQ(h.n_ff, gs.n_ff);
  EXPECT_EQ(h.n_rot, gs.n_rot);
  EXPECT_EQ(h.rope_theta, gs.rope_theta);
  EXPECT_EQ(h.rms_eps, gs.rms_eps);
  EXPECT_EQ(h.n_expert, gs.n_expert);
  EXPECT_EQ(h.n_expert_used, gs.n_expert_used);
  EXPECT_EQ(h.n_ff_exp, gs.n_ff_exp);
  EXPECT_EQ(h.n_leading_dense, gs.n_leading_dense);
  EXPECT_EQ(h.gating, gs.gating);
  EXPECT_EQ(h.norm_topk, gs.norm_topk);
  EXPECT_EQ(h.routed_scale, gs.routed_scale);
  EXPECT_EQ(h.n_group, gs.n_group);
  EXPECT_EQ(h.n_group_used, gs.n_group_used);
  EXPECT_EQ(h.q_lora_rank, gs.q_lora_rank);
  EXPECT_EQ(h.kv_lora_rank, gs.kv_lora_rank);
  EXPECT_EQ(h.qk_nope_dim, gs.qk_nope_dim);
  EXPECT_EQ(h.qk_rope_dim, gs.qk_rope_dim);
  EXPECT_EQ(h.v_head_dim, gs.v_head_dim);
  EXPECT_EQ(h.kv_k_width(), gs.kv_k_width());
  // The GGUF files carry no shared-expert count / width keys where llama.cpp derives them; the
  // HF reader states them (Qwen2-MoE: one shared expert; DeepSeek: n_shared x expert width).
  if (gs.n_expert_shared != 0) {
    EXPECT_EQ(h.n_expert_shared, gs.n_expert_shared);
  }
  if (gs.n_ff_shexp != 0) {
    EXPECT_EQ(h.n_ff_shexp, gs.n_ff_shexp);
  }
  // Llama q/k rows: GGUF permuted for pair rotation; HF kept in rotate_half order.
  const bool permuted = gs.arch == Arch::kLlama;
  EXPECT_EQ(h.rope_style, permuted ? RopeStyle::kNeox : gs.rope_style);

  const auto hw = all_weights(h);
  const auto gw = all_weights(gs);
  EXPECT_EQ(hw.size(), gw.size());
  if (hw.size() != gw.size()) return *hf;
  int compared = 0;
  for (size_t i = 0; i < hw.size(); ++i) {
    const std::string& field = hw[i].first;
    const WeightView& a = *hw[i].second;
    const WeightView& b = *gw[i].second;
    EXPECT_EQ(a.present(), b.present()) << field << " (" << a.name << " / " << b.name << ")";
    if (!a.present() || !b.present()) continue;
    if (field != "output") {
      EXPECT_EQ(a.name, b.name) << field;
    }
    const bool same_shape = a.ne[0] == b.ne[0] && a.ne[1] == b.ne[1] && a.ne[2] == b.ne[2];
    EXPECT_TRUE(same_shape) << field << " " << a.name;
    if (!same_shape) continue;
    const std::vector<float> av = to_f32(a), bv = to_f32(b);
    const bool is_qk = field.ends_with(".wq") || field.ends_with(".wk");
    const int64_t cols = a.ne[0];
    int64_t bad = 0;
    for (int64_t r = 0; r < a.ne[1] * a.ne[2]; ++r) {
      const int64_t gr = permuted && is_qk ? gguf_row_of_hf_row(r, h.head_dim_k) : r;
      if (std::memcmp(&av[static_cast<size_t>(r * cols)], &bv[static_cast<size_t>(gr * cols)],
                      static_cast<size_t>(cols) * sizeof(float)) != 0)
        ++bad;
    }
    EXPECT_EQ(bad, 0) << field << " (" << a.name << "): rows differ from the GGUF twin";
    ++compared;
  }
  EXPECT_GT(compared, 10);
  return *hf;
}

/// Every shared HF folder has tok512.model: 512 pieces, <s> 1, </s> 2.
void check_tokenizer(const Model& m) {
  ASSERT_NE(m.tokenizer, nullptr);
  EXPECT_EQ(m.tokenizer->n_vocab(), m.spec.n_vocab);
  EXPECT_EQ(m.tokenizer->bos_id(), 1);
  EXPECT_EQ(m.tokenizer->eos_id(), 2);
  EXPECT_EQ(m.tokenizer->model_kind(), "llama");
}

TEST(HfModel, Stories260KMatchesGguf) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto m = compare_with_gguf(shared, {"stories260K", "stories260K/stories260K.gguf"});
  ASSERT_NE(m, nullptr);
  const ModelSpec& s = m->spec;
  EXPECT_EQ(s.n_ctx_train, 512);  // config's max_position_embeddings (the GGUF says 2048)
  EXPECT_EQ(s.rope_style, RopeStyle::kNeox);
  EXPECT_EQ(s.output.data, s.token_embd.data);  // tied
  EXPECT_EQ(s.n_expert, 0);
  // All F32 and aligned: nothing converted, the only storage is the mapping.
  EXPECT_EQ(m->storage.size(), 1u);
  EXPECT_TRUE(m->chat_template.empty());
  check_tokenizer(*m);
}

TEST(HfModel, ShardedMixtralMatchesGguf) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto m = compare_with_gguf(shared, {"mixtral-moe", "synth/mixtral-moe/model.gguf"});
  ASSERT_NE(m, nullptr);
  const ModelSpec& s = m->spec;
  EXPECT_EQ(s.arch, Arch::kLlama);
  EXPECT_EQ(s.n_expert, 8);
  EXPECT_EQ(s.n_expert_used, 2);
  EXPECT_TRUE(s.norm_topk);
  EXPECT_EQ(s.head_dim_k, 16);  // derived: no head_dim key
  EXPECT_NE(s.output.data, s.token_embd.data);
  EXPECT_EQ(s.layers[1].experts[7].gate.name, "blk.1.ffn_gate_exps.weight[7]");
  EXPECT_EQ(m->storage.size(), 1u);
  check_tokenizer(*m);
}

TEST(HfModel, Qwen3MoeMatchesGguf) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto m = compare_with_gguf(shared, {"qwen3moe", "synth/qwen3moe/model.gguf"});
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->spec.head_dim_k, 32);
  EXPECT_TRUE(m->spec.norm_topk);
  EXPECT_TRUE(m->spec.layers[0].q_norm.present());
  EXPECT_EQ(m->spec.rope_style, RopeStyle::kNeox);
  check_tokenizer(*m);
}

TEST(HfModel, Qwen2MoeMatchesGguf) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto m = compare_with_gguf(shared, {"qwen2moe", "synth/qwen2moe/model.gguf"});
  ASSERT_NE(m, nullptr);
  const ModelSpec& s = m->spec;
  EXPECT_FALSE(s.norm_topk);
  EXPECT_EQ(s.n_expert_shared, 1);
  EXPECT_EQ(s.n_ff_shexp, 64);
  EXPECT_TRUE(s.layers[0].bq.present());
  EXPECT_EQ(s.layers[0].shared_gate.ne[0], 128);
  EXPECT_EQ(s.layers[0].shared_gate.ne[1], 1);
  check_tokenizer(*m);
}

TEST(HfModel, DeepseekV3MatchesGguf) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto m = compare_with_gguf(shared, {"deepseek2", "synth/deepseek2/model.gguf"});
  ASSERT_NE(m, nullptr);
  const ModelSpec& s = m->spec;
  EXPECT_EQ(s.arch, Arch::kDeepseek2);
  EXPECT_EQ(s.rope_style, RopeStyle::kNormal);  // rope_interleave: stored as adjacent pairs
  EXPECT_EQ(s.gating, Gating::kSigmoid);
  EXPECT_EQ(s.n_leading_dense, 1);
  EXPECT_FALSE(s.layers[0].is_moe);
  EXPECT_TRUE(s.layers[1].is_moe);
  EXPECT_TRUE(s.layers[1].router_bias.present());
  EXPECT_EQ(s.n_expert_shared, 1);
  EXPECT_EQ(s.n_ff_shexp, 32);
  EXPECT_EQ(s.n_group, 4);
  EXPECT_EQ(s.n_group_used, 2);
  EXPECT_FLOAT_EQ(s.routed_scale, 2.5f);
  // The mapping plus the two converted kv_b halves of each of the 4 layers.
  EXPECT_EQ(m->storage.size(), 1u + 2u * 4u);
  check_tokenizer(*m);
}

// ---- configurations written into temporary directories ----

std::string load_error(const std::string& dir) {
  auto m = load_hf_model(dir);
  return m ? std::string() : m.error().message;
}

TEST(HfModel, MissingConfig) {
  TempDir dir;
  EXPECT_HAS(load_error(dir.path()), "not a Hugging Face model directory (no config.json)");
}

TEST(HfModel, BadConfigJson) {
  TempDir dir;
  dir.write("config.json", "{\"architectures\": [");
  EXPECT_HAS(load_error(dir.path()), dir.path() + "/config.json: not valid JSON");
}

TEST(HfModel, UnsupportedArchitecture) {
  TROUPE_SHARED_OR_SKIP(shared);
  EditedModel m(shared, "stories260K",
                [](json& c) { c["architectures"] = json::array({"GPT2LMHeadModel"}); });
  EXPECT_HAS(load_error(m.path()), "architecture 'GPT2LMHeadModel' is not supported");
}

TEST(HfModel, MissingKey) {
  TROUPE_SHARED_OR_SKIP(shared);
  EditedModel m(shared, "stories260K", [](json& c) { c.erase("hidden_size"); });
  EXPECT_HAS(load_error(m.path()), "config.json: missing key 'hidden_size'");
}

TEST(HfModel, WrongKeyType) {
  TROUPE_SHARED_OR_SKIP(shared);
  EditedModel m(shared, "stories260K", [](json& c) { c["num_attention_heads"] = "eight"; });
  EXPECT_HAS(load_error(m.path()), "'num_attention_heads' must be an integer, got \"eight\"");
}

TEST(HfModel, HeadsNotMultipleOfKvHeads) {
  TROUPE_SHARED_OR_SKIP(shared);
  EditedModel m(shared, "stories260K", [](json& c) { c["num_key_value_heads"] = 3; });
  EXPECT_HAS(load_error(m.path()),
             "num_attention_heads 8 is not a multiple of num_key_value_heads 3");
}

TEST(HfModel, ShapeMismatchNamesTensorAndFile) {
  TROUPE_SHARED_OR_SKIP(shared);
  EditedModel m(shared, "stories260K", [](json& c) { c["vocab_size"] = 1000; });
  const std::string msg = load_error(m.path());
  EXPECT_HAS(msg,
             "model.safetensors: tensor 'model.embed_tokens.weight' has shape [512, 64], "
             "expected [1000, 64]");
}

TEST(HfModel, MissingTensor) {
  TROUPE_SHARED_OR_SKIP(shared);
  EditedModel m(shared, "stories260K", [](json& c) { c["num_hidden_layers"] = 6; });
  EXPECT_HAS(load_error(m.path()), "missing tensor 'model.layers.5.input_layernorm.weight'");
}

TEST(HfModel, UntiedWithoutLmHead) {
  TROUPE_SHARED_OR_SKIP(shared);
  EditedModel m(shared, "stories260K", [](json& c) { c["tie_word_embeddings"] = false; });
  EXPECT_HAS(load_error(m.path()), "no 'lm_head.weight' and tie_word_embeddings is not true");
}

TEST(HfModel, UnsupportedActivation) {
  TROUPE_SHARED_OR_SKIP(shared);
  EditedModel m(shared, "stories260K", [](json& c) { c["hidden_act"] = "gelu"; });
  EXPECT_HAS(load_error(m.path()), "hidden_act 'gelu' is not supported");
}

TEST(HfModel, QwenMlpOnlyLayersNeedDenseTensors) {
  TROUPE_SHARED_OR_SKIP(shared);
  EditedModel m(shared, "qwen3moe", [](json& c) { c["mlp_only_layers"] = json::array({0}); });
  EXPECT_HAS(load_error(m.path()), "missing tensor 'model.layers.0.mlp.gate_proj.weight'");
}

TEST(HfModel, DeepseekWithoutRopeInterleaveIsNeox) {
  TROUPE_SHARED_OR_SKIP(shared);
  EditedModel m(shared, "deepseek2", [](json& c) { c["rope_interleave"] = false; });
  auto r = load_hf_model(m.path());
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ((*r)->spec.rope_style, RopeStyle::kNeox);
  EXPECT_EQ((*r)->tokenizer, nullptr);  // no tokenizer files in the edited copy
}

TEST(HfModel, DeepseekV2Defaults) {
  TROUPE_SHARED_OR_SKIP(shared);
  EditedModel m(shared, "deepseek2", [](json& c) {
    c["architectures"] = json::array({"DeepseekV2ForCausalLM"});
    c.erase("scoring_func");
    c.erase("topk_method");
    c.erase("norm_topk_prob");
  });
  auto r = load_hf_model(m.path());
  ASSERT_TRUE(r.has_value()) << r.error().message;
  const ModelSpec& s = (*r)->spec;
  EXPECT_EQ(s.arch, Arch::kDeepseek2);
  EXPECT_EQ(s.gating, Gating::kSoftmax);  // DeepSeek-V2's default scoring
  EXPECT_FALSE(s.norm_topk);
  EXPECT_EQ(s.n_group, 1);  // topk_method greedy: no group limit
  EXPECT_EQ(s.rope_style, RopeStyle::kNormal);
}

TEST(HfModel, ChatTemplateFromTokenizerConfig) {
  TROUPE_SHARED_OR_SKIP(shared);
  EditedModel m(shared, "stories260K", [](json&) {});
  m.dir().write("tokenizer_config.json", R"({"chat_template": "{{ messages }}"})");
  auto r = load_hf_model(m.path());
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ((*r)->chat_template, "{{ messages }}");
  m.dir().write("tokenizer_config.json",
                R"({"chat_template": [{"name": "tool_use", "template": "T"},)"
                R"( {"name": "default", "template": "D"}]})");
  r = load_hf_model(m.path());
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ((*r)->chat_template, "D");
}

// ---- dtypes and alignment: a BF16/F16 copy of stories260K written by the test ----

uint16_t to_half(float f, bool bf16) { return bf16 ? fp32_to_bf16(f) : fp32_to_fp16(f); }

/// Rewrites a safetensors file with every tensor converted to F16 or BF16; `pad` header bytes
/// of odd length make every tensor start at an odd address.
std::string convert_file(const SafetensorsFile& src, bool bf16, bool misalign) {
  json header = json::object();
  std::string data;
  for (const SafetensorsTensor& t : src.tensors()) {
    const size_t n = static_cast<size_t>(t.num_elements());
    const size_t begin = data.size();
    for (size_t i = 0; i < n; ++i) {
      float f;
      std::memcpy(&f, t.data + 4 * i, 4);
      const uint16_t h = to_half(f, bf16);
      data.append(reinterpret_cast<const char*>(&h), 2);
    }
    header[t.name] = {{"dtype", bf16 ? "BF16" : "F16"},
                      {"shape", t.shape},
                      {"data_offsets", {begin, data.size()}}};
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != (misalign ? 1u : 0u)) h += ' ';
  std::string out(8, '\0');
  const uint64_t len = h.size();
  std::memcpy(out.data(), &len, 8);
  return out + h + data;
}

void check_half_model(const std::string& shared, bool bf16, bool misalign) {
  const std::string src = shared + "/models/hf/stories260K";
  auto f32 = load_hf_model(src);
  ASSERT_TRUE(f32.has_value()) << f32.error().message;
  auto st = SafetensorsFile::open(src + "/model.safetensors");
  ASSERT_TRUE(st.has_value()) << st.error().message;
  TempDir dir;
  std::filesystem::copy_file(src + "/config.json", dir.path() + "/config.json");
  dir.write("model.safetensors", convert_file(**st, bf16, misalign));
  auto half = load_hf_model(dir.path());
  ASSERT_TRUE(half.has_value()) << half.error().message;
  const ModelSpec& h = (*half)->spec;
  const GgmlType want = bf16 ? GgmlType::kBF16 : GgmlType::kF16;
  EXPECT_EQ(h.token_embd.type, want);
  EXPECT_EQ(h.layers[2].wq.type, want);
  EXPECT_EQ(h.layers[2].attn_norm.type, GgmlType::kF32);  // norms always become f32
  EXPECT_EQ(h.output_norm.type, GgmlType::kF32);
  // Aligned: matrices are views into the file and only the 11 norms are converted buffers.
  if (!misalign) {
    EXPECT_EQ((*half)->storage.size(), 1u + 11u);
  }
  for (const WeightView* w : {&h.token_embd, &h.layers[4].wq})
    EXPECT_EQ(reinterpret_cast<uintptr_t>(w->data) % 2, 0u) << w->name;

  const auto a = all_weights(h), b = all_weights((*f32)->spec);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (!b[i].second->present()) continue;
    const std::vector<float> av = to_f32(*a[i].second), bv = to_f32(*b[i].second);
    ASSERT_EQ(av.size(), bv.size()) << a[i].first;
    for (size_t k = 0; k < av.size(); ++k) {
      const uint16_t hb = to_half(bv[k], bf16);
      const float expect = bf16 ? bf16_to_fp32(hb) : fp16_to_fp32(hb);
      ASSERT_EQ(av[k], expect) << a[i].first << " element " << k;
    }
  }
}

TEST(HfModel, Bf16WeightsStayBf16ZeroCopy) {
  TROUPE_SHARED_OR_SKIP(shared);
  check_half_model(shared, /*bf16=*/true, /*misalign=*/false);
}

TEST(HfModel, F16WeightsStayF16ZeroCopy) {
  TROUPE_SHARED_OR_SKIP(shared);
  check_half_model(shared, /*bf16=*/false, /*misalign=*/false);
}

TEST(HfModel, MisalignedTensorsAreCopied) {
  TROUPE_SHARED_OR_SKIP(shared);
  check_half_model(shared, /*bf16=*/true, /*misalign=*/true);
}

TEST(HfModel, UnsupportedDtypeNamesTensor) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string src = shared + "/models/hf/stories260K";
  auto st = SafetensorsFile::open(src + "/model.safetensors");
  ASSERT_TRUE(st.has_value()) << st.error().message;
  std::string bytes = convert_file(**st, true, false);
  // Relabel one BF16 tensor as I16 (same size): valid safetensors, not a weight type.
  const std::string needle = "\"model.norm.weight\":{\"data_offsets\":";
  const size_t at = bytes.find(needle);
  ASSERT_NE(at, std::string::npos);
  const size_t dt = bytes.find("\"BF16\"", at);
  bytes.replace(dt, 6, "\"I16\" ");
  TempDir dir;
  std::filesystem::copy_file(src + "/config.json", dir.path() + "/config.json");
  dir.write("model.safetensors", bytes);
  EXPECT_HAS(
      load_error(dir.path()),
      "model.safetensors: tensor 'model.norm.weight' has dtype I16; troupe reads F32, "
      "F16, BF16, F8_E4M3 (block-scaled fp8), packed int4 (compressed-tensors) and U8 NVFP4");
}

TEST(HfModel, ViewsLiveAsLongAsTheModel) {
  TROUPE_SHARED_OR_SKIP(shared);
  std::shared_ptr<const Model> m;
  {
    auto r = load_hf_model(shared + "/models/hf/deepseek2");
    ASSERT_TRUE(r.has_value()) << r.error().message;
    m = *r;
  }
  // Views stay readable through the Model's storage alone.
  const WeightView& w = m->spec.layers[3].wk_b;
  EXPECT_EQ(to_f32(w).size(), 32u * 32u * 8u);
  EXPECT_EQ(to_f32(m->spec.layers[3].experts[15].down).size(), 128u * 32u);
}

}  // namespace
}  // namespace troupe::model
