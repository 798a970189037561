// `troupe synth`: writes a deterministic random-weight model of a supported architecture in
// llama.cpp's GGUF conventions (see model/synth.h). Prints one summary line, plus one note per
// tensor kind stored in another type than --dtype.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <set>
#include <string>

#include "bin/args.h"
#include "bin/commands.h"
#include "model/synth.h"

namespace troupe::cli {

namespace {

constexpr const char* kUsage =
    "usage: troupe synth --arch llama|mixtral|qwen2|qwen3|qwen2moe|qwen3moe|deepseek2|deepseek32|\n"
    "                           glm-dsa|glm4moe|minimax-m2|bailingmoe2|gpt-oss|gemma3|llama4|\n"
    "                           qwen3next|qwen35moe|qwen35|phi3|ernie4_5|ernie4_5-moe|\n"
    "                           deepseek4 --out FILE (deepseek4: a directory)\n"
    "  [--n-embd N] [--n-layer N] [--n-head N] [--n-head-kv N] [--n-ff N] [--head-dim N]\n"
    "  [--n-expert N] [--n-expert-used N] [--n-ff-exp N] [--n-ff-shexp N]\n"
    "  [--q-lora-rank N] [--kv-lora-rank N] [--qk-rope-dim N] [--qk-nope-dim N] [--v-head-dim N]\n"
    "  [--n-dense-lead N] [--n-expert-shared N] [--n-group N] [--n-group-used N]\n"
    "  [--sliding-window N] [--moe-layer-step N] [--index-top-k N] [--index-heads N]\n"
    "  [--index-dim N] [--linear-k-heads N] [--linear-v-heads N] [--linear-head-dim N]\n"
    "  [--full-attn-interval N]\n"
    "  [--gating softmax|sigmoid] [--expert-weights-norm 0|1] [--expert-weights-scale X]\n"
    "  [--rope-theta X] [--rms-eps X] [--n-vocab N] [--n-ctx N] [--name NAME]\n"
    "  [--dtype f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q2_k|q3_k|q4_k|q5_k|q6_k|q4_k_m|q5_k_m|\n"
    "           iq4_nl|iq4_xs|mxfp4]\n"
    "  [--seed S] [--vocab-donor GGUF] [--threads N]\n"
    "Defaults give the shapes of ../shared/models/synth/<arch> (mixtral: 8 experts of --n-ff\n"
    "32). Without --vocab-donor the model gets a built-in byte-level BPE vocabulary of 512 tokens\n"
    "(or --n-vocab). Norms, biases and routers stay f32; a matrix whose rows do not fill whole\n"
    "q8_0/q4_0 blocks is stored as f16 (noted in the output). glm4moe rotates half of each head\n"
    "and ends with one multi-token-prediction layer, as GLM-4.5's files; minimax-m2's experts are\n"
    "--n-ff wide; gemma3 has 7 layers (the sixth global, the others --sliding-window 8) and ties\n"
    "its head to the embedding; llama4 routes each token to one of 8 experts plus a shared one,\n"
    "in every --moe-layer-step-th layer (2), its fourth layers global without rotary;\n"
    "deepseek32 is deepseek2 with DeepSeek-V3.2's lightning indexer (--index-heads 4 of\n"
    "--index-dim 2 x --qk-rope-dim, --index-top-k 2048 positions per query); glm-dsa is GLM-5.2's\n"
    "layout of it (the indexer rotating neighbouring pairs; from layer 2 on, three layers in four\n"
    "reuse the last indexer's choice); qwen3next has\n"
    "Gated DeltaNet linear attention (--linear-k-heads 2, --linear-v-heads 4 of\n"
    "--linear-head-dim 32) in three layers of every --full-attn-interval 4, gated full\n"
    "attention in the fourth, 8 experts plus a gated shared one of --n-ff-shexp 64; qwen35moe\n"
    "and qwen35 (dense) are Qwen3.5's, as llama.cpp converts them; phi3 is Phi-4-mini's layout\n"
    "(fused q/k/v and gate/up, rope on three quarters of each head, LongRoPE over a quarter of\n"
    "--n-ctx, --sliding-window 0 = none); ernie4_5 and ernie4_5-moe are ERNIE 4.5's (tied head;\n"
    "the MoE model's experts from --n-dense-lead 1 on, every --moe-layer-step-th layer, 8 with a\n"
    "softmax router and a selection bias, beside --n-expert-shared 2 shared ones); deepseek4\n"
    "writes a Hugging Face directory (DeepSeek-V4-Flash's layout in DeepSeek's names: four\n"
    "hyper-connection streams, one key-and-value head of --head-dim 64, a --sliding-window 32,\n"
    "entries compressed every 4 (with --index-heads 4 of --index-dim 32 keeping --index-top-k 16)\n"
    "and every 128 positions in turn, the first three layers hash-routed; f32, f16 or bf16; no\n"
    "tokenizer). Same options and seed, same bytes.\n"
    "A vision encoder (llama.cpp mmproj GGUF) for --mmproj:\n"
    "  troupe synth --arch clip --out FILE [--projector mlp|gemma3] [--image-size N]\n"
    "    [--patch-size N] [--n-embd N] [--n-ff N] [--n-layer N] [--n-head N] [--feature-layer N]\n"
    "    [--proj-dim N] [--merge N] [--dtype f32|f16|q8_0] [--seed S]\n"
    "  defaults: LLaVA 1.5's CLIP ViT-L/14-336 shape (mlp, block 23 of 24, to 4096 wide).\n";

// `troupe synth --arch clip`: a synthetic mmproj (model::synth_mmproj).
int synth_clip(const Args& args) {
  ArgParser ap(args,
               {"arch", "out", "projector", "image-size", "patch-size", "n-embd", "n-ff", "n-layer",
                "n-head", "feature-layer", "proj-dim", "merge", "dtype", "seed"},
               {});
  model::MmprojSynthOptions o;
  const std::string out = ap.required("out");
  o.projector = ap.str("projector", o.projector);
  constexpr int64_t kMax = int64_t{1} << 16;
  o.image_size = ap.integer("image-size", o.image_size, 1, kMax);
  o.patch_size = ap.integer("patch-size", o.patch_size, 1, kMax);
  o.n_embd = ap.integer("n-embd", o.n_embd, 1, kMax);
  o.n_ff = ap.integer("n-ff", o.n_ff, 1, kMax * 4);
  o.n_layer = ap.integer("n-layer", o.n_layer, 1, 1024);
  o.n_head = ap.integer("n-head", o.n_head, 1, 1024);
  o.n_layer_used = ap.integer("feature-layer", std::min(o.n_layer_used, o.n_layer), 0, 1024);
  o.proj_dim = ap.integer("proj-dim", o.proj_dim, 1, kMax * 4);
  o.merge = ap.integer("merge", o.merge, 1, 1024);
  o.seed = static_cast<uint64_t>(ap.integer("seed", 1, 0, INT64_MAX));
  const std::string dt = ap.str("dtype", "f16");
  const std::optional<model::GgmlType> t = model::parse_synth_dtype(dt);
  if (!t ||
      (*t != model::GgmlType::kF32 && *t != model::GgmlType::kF16 && *t != model::GgmlType::kQ8_0))
    throw CliError("--dtype for a vision encoder must be f32, f16 or q8_0, got '" + dt + "'");
  o.dtype = *t;
  if (auto st = model::synth_mmproj(o, out); !st) throw CliError(st.error().message);
  std::printf("synth: clip (%s projector, %lldx%lld images, %lld blocks) -> %s\n",
              o.projector.c_str(), static_cast<long long>(o.image_size),
              static_cast<long long>(o.image_size), static_cast<long long>(o.n_layer), out.c_str());
  return 0;
}

// Options taking an integer (flag name without "--") and where they go.
struct IntOption {
  const char* name;
  std::optional<int64_t> model::SynthOptions::*field;
  int64_t lo;
};

constexpr IntOption kIntOptions[] = {
    {"n-embd", &model::SynthOptions::n_embd, 1},
    {"n-layer", &model::SynthOptions::n_layer, 1},
    {"n-head", &model::SynthOptions::n_head, 1},
    {"n-head-kv", &model::SynthOptions::n_head_kv, 1},
    {"n-ff", &model::SynthOptions::n_ff, 1},
    {"head-dim", &model::SynthOptions::head_dim, 1},
    {"n-expert", &model::SynthOptions::n_expert, 1},
    {"n-expert-used", &model::SynthOptions::n_expert_used, 1},
    {"n-ff-exp", &model::SynthOptions::n_ff_exp, 1},
    {"n-ff-shexp", &model::SynthOptions::n_ff_shexp, 1},
    {"n-expert-shared", &model::SynthOptions::n_expert_shared, 0},
    {"n-dense-lead", &model::SynthOptions::n_dense_lead, 0},
    {"n-group", &model::SynthOptions::n_group, 1},
    {"n-group-used", &model::SynthOptions::n_group_used, 1},
    {"sliding-window", &model::SynthOptions::sliding_window, 1},
    {"moe-layer-step", &model::SynthOptions::moe_layer_step, 1},
    {"index-top-k", &model::SynthOptions::index_top_k, 1},
    {"index-heads", &model::SynthOptions::index_heads, 1},
    {"index-dim", &model::SynthOptions::index_dim, 1},
    {"linear-k-heads", &model::SynthOptions::linear_k_heads, 1},
    {"linear-v-heads", &model::SynthOptions::linear_v_heads, 1},
    {"linear-head-dim", &model::SynthOptions::linear_head_dim, 1},
    {"full-attn-interval", &model::SynthOptions::full_attn_interval, 1},
    {"q-lora-rank", &model::SynthOptions::q_lora_rank, 0},
    {"kv-lora-rank", &model::SynthOptions::kv_lora_rank, 1},
    {"qk-rope-dim", &model::SynthOptions::qk_rope_dim, 1},
    {"qk-nope-dim", &model::SynthOptions::qk_nope_dim, 1},
    {"v-head-dim", &model::SynthOptions::v_head_dim, 1},
    {"n-vocab", &model::SynthOptions::n_vocab, 1},
};

constexpr int64_t kMaxDim = int64_t{1} << 24;

}  // namespace

int cmd_synth(const Args& args) {
  for (const std::string& a : args) {
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i] == "--arch=clip" ||
        (args[i] == "--arch" && i + 1 < args.size() && args[i + 1] == "clip"))
      return synth_clip(args);
  std::set<std::string> with_value = {"arch",
                                      "out",
                                      "dtype",
                                      "seed",
                                      "vocab-donor",
                                      "name",
                                      "gating",
                                      "threads",
                                      "rope-theta",
                                      "rms-eps",
                                      "n-ctx",
                                      "expert-weights-norm",
                                      "expert-weights-scale"};
  for (const IntOption& io : kIntOptions) with_value.insert(io.name);
  ArgParser ap(args, with_value, {});

  model::SynthOptions o;
  const std::string out = ap.required("out");
  o.arch = ap.str("arch", "llama");
  o.name = ap.str("name");
  o.vocab_donor = ap.str("vocab-donor");
  for (const IntOption& io : kIntOptions)
    if (ap.has(io.name)) o.*io.field = ap.integer(io.name, 0, io.lo, kMaxDim);
  if (ap.has("rope-theta"))
    o.rope_theta = static_cast<float>(ap.number("rope-theta", 0, 1e-3, 1e12));
  if (ap.has("rms-eps")) o.rms_eps = static_cast<float>(ap.number("rms-eps", 0, 1e-12, 0.5));
  if (ap.has("gating")) o.gating = ap.str("gating");
  if (ap.has("expert-weights-norm"))
    o.expert_weights_norm = ap.integer("expert-weights-norm", 1, 0, 1) != 0;
  if (ap.has("expert-weights-scale"))
    o.expert_weights_scale = static_cast<float>(ap.number("expert-weights-scale", 1, 1e-6, 1e6));
  o.n_ctx = ap.integer("n-ctx", o.n_ctx, 1, kMaxDim);
  o.seed = static_cast<uint64_t>(ap.integer("seed", 1, 0, INT64_MAX));
  o.num_threads = static_cast<int>(ap.integer("threads", 0, 0, 1024));
  if (ap.has("dtype") && !model::parse_synth_dtype(ap.str("dtype"), &o))
    throw CliError(
        "--dtype must be f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, "
        "q6_k, q4_k_m, "
        "q5_k_m, iq4_nl, iq4_xs or mxfp4, got '" +
        ap.str("dtype") + "'");
  // Recorded as general.synth.command; the output path and thread count do not change the bytes.
  o.command_line = "troupe synth";
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--out" || a == "--threads") {
      ++i;
      continue;
    }
    if (a.rfind("--out=", 0) == 0 || a.rfind("--threads=", 0) == 0) continue;
    o.command_line += " " + a;
  }

  auto r = model::synth_model_summary(o, out);
  if (!r.has_value()) throw CliError(r.error().message);
  for (const std::string& note : r->notes) std::printf("synth: note: %s\n", note.c_str());
  std::printf("synth: %s -> %s\n", r->line().c_str(), out.c_str());
  return 0;
}

}  // namespace troupe::cli
