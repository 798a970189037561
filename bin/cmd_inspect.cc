// `troupe inspect PATH`: what a model file holds (metadata, tensors) and what troupe makes of it.
#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "bin/args.h"
#include "bin/commands.h"
#include "bin/common.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/rope.h"
#include "model/tokenizer.h"
#include "model/vision.h"

namespace troupe::cli {

namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, units[u]);
  return buf;
}

std::string value_string(const model::GgufValue& v) {
  using model::GgufType;
  switch (v.type) {
    case GgufType::kString: {
      std::string s(v.str.substr(0, 80));
      for (char& c : s)
        if (c == '\n') c = ' ';
      return "\"" + s + (v.str.size() > 80 ? "...\"" : "\"");
    }
    case GgufType::kF32:
    case GgufType::kF64:
      return std::to_string(v.f);
    case GgufType::kBool:
      return v.u ? "true" : "false";
    case GgufType::kArray:
      return "[" + std::string(model::gguf_type_name(v.elem_type)) + " x " +
             std::to_string(v.count) + "]";
    default:
      return std::to_string(v.i);
  }
}

void print_spec(const model::ModelSpec& s) {
  std::printf("architecture: %s%s\n", model::arch_name(s.arch),
              s.n_expert > 0 ? " (mixture of experts)" : "");
  std::printf(
      "  n_vocab %lld, n_embd %lld, n_layer %lld, n_head %lld, n_head_kv %lld, head_dim "
      "k/v %lld/%lld, n_ff %lld, rope %s n_rot %lld base %g, rms_eps %g\n",
      (long long)s.n_vocab, (long long)s.n_embd, (long long)s.n_layer, (long long)s.n_head,
      (long long)s.n_head_kv, (long long)s.head_dim_k, (long long)s.head_dim_v, (long long)s.n_ff,
      s.rope_style == model::RopeStyle::kNeox ? "neox" : "normal", (long long)s.n_rot, s.rope_theta,
      s.rms_eps);
  const model::RopeScaling& sc = s.rope_scaling;
  if (sc.type != model::RopeScalingType::kNone || !s.rope_freq_factors.empty() ||
      s.kq_scale_mult != 1.0 || sc.attn_factor != 1.0) {
    std::printf("  rope scaling %s", model::rope_scaling_name(sc.type));
    if (sc.type != model::RopeScalingType::kNone) std::printf(" factor %g", sc.factor);
    if (sc.type == model::RopeScalingType::kYarn)
      std::printf(" (original context %lld, beta %g/%g, cos/sin x %g)", (long long)sc.orig_ctx,
                  sc.beta_fast, sc.beta_slow, sc.attn_factor);
    else if (sc.attn_factor != 1.0)
      std::printf(", cos/sin x %g", sc.attn_factor);
    const auto span = [](const std::vector<float>& v) {  // "lowest..highest"
      const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
      return strfmt("%g..%g", (double)*lo, (double)*hi);
    };
    if (!s.rope_freq_factors.empty())
      std::printf(", per-pair divisors %s", span(s.rope_freq_factors).c_str());
    if (!s.rope_freq_factors_long.empty())
      std::printf(", LongRoPE: long divisors %s for a context above %lld positions",
                  span(s.rope_freq_factors_long).c_str(), (long long)s.rope_long_after);
    if (s.kq_scale_mult != 1.0) std::printf(", attention scale x %g", s.kq_scale_mult);
    std::printf("\n");
  }
  int64_t shared_ff = 0;
  for (const auto& L : s.layers)
    if (L.is_moe && L.shared.gate.present()) shared_ff = L.shared.gate.rows();
  if (s.n_expert > 0)
    std::printf(
        "  experts %lld (used %lld, ff %lld), shared %lld (ff %lld), leading dense %lld, "
        "gating %s, norm_topk %d, scale %g, groups %lld/%lld%s\n",
        (long long)s.n_expert, (long long)s.n_expert_used, (long long)s.n_ff_exp,
        (long long)s.n_expert_shared, (long long)shared_ff, (long long)s.n_leading_dense,
        s.gating == model::Gating::kSigmoid        ? "sigmoid"
        : s.gating == model::Gating::kSqrtSoftplus ? "sqrt-softplus"
        : s.gating == model::Gating::kSoftmaxTopk  ? "softmax over the top k"
                                                   : "softmax",
        s.norm_topk ? 1 : 0, s.routed_scale, (long long)s.n_group_used, (long long)s.n_group,
        s.n_group_used < s.n_group
            ? (s.group_score == model::GroupScore::kMax ? " (ranked by best score)"
                                                        : " (ranked by two best scores)")
            : "");
  // Layer kinds beyond the plain causal one (gpt-oss, Gemma 3, Llama 4).
  int64_t windowed = 0, chunked = 0, chunk = 0, nope = 0, l2 = 0, moe = 0;
  for (const auto& L : s.layers) {
    windowed += L.window > 0;
    chunked += L.chunk > 0;
    chunk = std::max(chunk, L.chunk);
    nope += L.nope;
    l2 += L.qk_l2_norm;
    moe += L.is_moe;
  }
  std::vector<std::string> kinds;
  if (windowed > 0) kinds.push_back(strfmt("%lld windowed", (long long)windowed));
  if (chunked > 0)
    kinds.push_back(strfmt("%lld in chunks of %lld", (long long)chunked, (long long)chunk));
  if (nope > 0) kinds.push_back(strfmt("%lld without rope", (long long)nope));
  if (l2 > 0) kinds.push_back(strfmt("%lld norm q/k without weights", (long long)l2));
  int64_t gated = 0, linear = 0;
  for (const auto& L : s.layers) {
    gated += L.attn_gate;
    linear += L.recurrent;
  }
  if (linear > 0)
    kinds.push_back(
        strfmt("%lld Gated DeltaNet (linear; %lld key heads of %lld, %lld value heads "
               "of %lld%s, conv %lld; a state of %s per sequence)",
               (long long)linear, (long long)s.ssm_k_heads, (long long)s.ssm_k_dim,
               (long long)s.ssm_v_heads, (long long)s.ssm_v_dim,
               s.ssm_tiled ? " in tiled order" : "", (long long)s.ssm_conv_kernel,
               human_bytes(static_cast<double>(s.ssm_state_floats() * linear * 4)).c_str()));
  if (gated > 0) kinds.push_back(strfmt("%lld with a sigmoid output gate", (long long)gated));
  if (s.attn_temp_scale != 0.0f)
    kinds.push_back(strfmt("queries without rope x (1 + %g ln(1 + floor((pos + 1) / %lld)))",
                           (double)s.attn_temp_scale, (long long)s.attn_temp_floor));
  for (size_t i = 0; i < kinds.size(); ++i)
    std::printf("%s%s", i == 0 ? "  attention layers: " : "; ", kinds[i].c_str());
  if (!kinds.empty()) std::printf("\n");
  if (s.n_expert > 0 && (moe < s.n_layer - s.n_leading_dense || s.moe_weight_input))
    std::printf("  %lld of %lld layers MoE%s\n", (long long)moe, (long long)s.n_layer,
                s.moe_weight_input ? "; the router's weight scales the expert's input" : "");
  if (s.is_v4()) {
    int64_t csa = 0, hca = 0, hashed = 0, rate_c = 0, rate_h = 0;
    for (const auto& L : s.layers) {
      if (L.compress_overlap) {
        ++csa;
        rate_c = L.compress;
      } else if (L.compress > 0) {
        ++hca;
        rate_h = L.compress;
      }
      hashed += L.hash_experts.present();
    }
    std::printf(
        "  DeepSeek-V4: %lld residual streams (hyper-connections, %lld Sinkhorn steps); one "
        "key-and-value head, window %lld, local rope base %g; %lld layers compressed every %lld "
        "positions with overlap, their indexer %lld heads of %lld keeping %lld entries; %lld "
        "every %lld; %lld sliding only; output in %lld groups of %lld; %lld layers route by "
        "token id; SwiGLU clamped at %g\n",
        (long long)s.hc_mult, (long long)s.hc_sinkhorn_iters,
        (long long)(s.layers.empty() ? 0 : s.layers[0].window), (double)s.rope_theta_local,
        (long long)csa, (long long)rate_c, (long long)s.idx_n_head, (long long)s.idx_head_dim,
        (long long)s.idx_top_k, (long long)hca, (long long)rate_h,
        (long long)(s.n_layer - csa - hca), (long long)s.o_groups, (long long)s.o_lora_rank,
        (long long)hashed, (double)s.act_limit);
  } else if (s.has_indexer()) {
    int64_t shared = 0;
    for (const auto& L : s.layers) shared += L.idx_shared ? 1 : 0;
    std::printf(
        "  sparse attention (DeepSeek-V3.2's indexer): %lld heads of %lld, %lld positions "
        "per query, rotated %s",
        (long long)s.idx_n_head, (long long)s.idx_head_dim, (long long)s.idx_top_k,
        s.idx_rope_neox ? "in halves" : "in neighbouring pairs");
    if (shared > 0)
      std::printf(
          "; %lld of %lld layers reuse the choice of the last layer before them with "
          "an indexer",
          (long long)shared, (long long)s.n_layer);
    std::printf("\n");
  }
  if (s.is_mla())
    std::printf("  MLA: q_lora %lld, kv_lora %lld, qk nope/rope %lld/%lld, v %lld\n",
                (long long)s.q_lora_rank, (long long)s.kv_lora_rank, (long long)s.qk_nope_dim,
                (long long)s.qk_rope_dim, (long long)s.v_head_dim);
  // The linear-attention layers keep no KV (their state is per sequence, above).
  std::printf(
      "  KV cache per token: %s (f32)\n",
      human_bytes(static_cast<double>((s.kv_k_width() + s.kv_v_width()) * (s.n_layer - linear) * 4))
          .c_str());
}

/// The weights troupe computes with, by type (a tied head counted once): a Hugging Face model's
/// tensors as loaded (F8_E4M3 and packed int4 with their scale blocks; the few converted to f32
/// as f32).
void print_weights(const model::ModelSpec& s) {
  std::map<std::string, std::pair<int, uint64_t>> by_type;
  std::set<const uint8_t*> seen;
  int64_t params = 0;
  uint64_t total = 0;
  model::for_each_weight(s, [&](const model::WeightView& w) {
    if (!w.present() || !seen.insert(w.data).second) return;
    std::string name = model::type_name(w.type);
    if (w.type == model::GgmlType::kF8_E4M3)
      name += strfmt(" (scale per %lld x %lld)", (long long)w.scale_block[0],
                     (long long)w.scale_block[1]);
    if (w.type == model::GgmlType::kI4_PACKED || w.type == model::GgmlType::kFP4_PACKED)
      name += strfmt(" (%s scale per %lld columns%s)", model::type_name(w.scale_type).c_str(),
                     (long long)w.scale_block[1],
                     w.scale_mul != 1.0f || w.scale_div != 1.0f ? ", and one per matrix" : "");
    auto& e = by_type[name];
    e.first++;
    e.second += w.nbytes();
    total += w.nbytes();
    params += w.ne[0] * w.ne[1] * w.ne[2];
  });
  std::printf("weights: %lld parameters, %s", (long long)params,
              human_bytes(static_cast<double>(total)).c_str());
  for (const auto& [k, v] : by_type)
    std::printf("; %s: %d (%s)", k.c_str(), v.first,
                human_bytes(static_cast<double>(v.second)).c_str());
  std::printf("\n");
}

// A vision encoder's shape, one line (an mmproj GGUF, or a Hugging Face directory's tower).
void print_vision(const model::VisionSpec& v) {
  std::printf(
      "vision encoder: %s projector, %lld of %zu blocks run, %lld px images in %lld px patches, "
      "width %lld (%lld heads, ffn %lld), %lld image tokens of width %lld\n",
      model::projector_name(v.projector), (long long)v.n_layer_run, v.layers.size(),
      (long long)v.image_size, (long long)v.patch_size, (long long)v.n_embd, (long long)v.n_head,
      (long long)v.n_ff, (long long)v.n_image_tokens(), (long long)v.n_embd_out);
}

}  // namespace

int cmd_inspect(const Args& args) {
  ArgParser ap(args, {}, {"metadata"}, 1);
  if (ap.positional().empty()) throw CliError("usage: troupe inspect PATH [--metadata]");
  const std::string path = ap.positional()[0];
  const bool is_gguf = path.size() > 5 && path.substr(path.size() - 5) == ".gguf";
  if (!is_gguf) {
    auto m = load_model_or_throw(path);
    std::printf("%s: Hugging Face model\n", path.c_str());
    print_weights(m->spec);
    print_spec(m->spec);
    if (m->tokenizer)
      std::printf("tokenizer: %s, %d tokens\n", m->tokenizer->model_kind().c_str(),
                  m->tokenizer->n_vocab());
    if (model::hf_names_multimodal_model(path)) {
      auto v = model::load_vision_model(path);
      if (v)
        print_vision((*v)->spec);
      else
        std::printf("vision encoder: not runnable by troupe: %s\n", v.error().message.c_str());
    }
    return 0;
  }
  auto g = model::GgufFile::open(path);
  if (!g) throw CliError(g.error().message);
  const model::GgufFile& f = **g;
  std::printf("%s: GGUF v%u, %s, %zu metadata keys, %zu tensors, alignment %llu\n", path.c_str(),
              f.version(), human_bytes(static_cast<double>(f.file_size())).c_str(),
              f.metadata().size(), f.tensors().size(), (unsigned long long)f.alignment());
  if (ap.flag("metadata"))
    for (const auto& [k, v] : f.metadata())
      std::printf("  %s = %s\n", k.c_str(), value_string(v).c_str());
  std::map<std::string, std::pair<int, uint64_t>> by_type;
  uint64_t total = 0;
  int64_t params = 0;
  for (const auto& t : f.tensors()) {
    std::printf("  %-32s %-6s %-22s %s\n", t.name.c_str(), model::type_name(t.type).c_str(),
                t.shape_string().c_str(), human_bytes(static_cast<double>(t.nbytes)).c_str());
    auto& e = by_type[model::type_name(t.type)];
    e.first++;
    e.second += t.nbytes;
    total += t.nbytes;
    params += t.num_elements();
  }
  std::printf("tensors: %lld parameters, %s", (long long)params,
              human_bytes(static_cast<double>(total)).c_str());
  for (const auto& [k, v] : by_type)
    std::printf("; %s: %d (%s)", k.c_str(), v.first,
                human_bytes(static_cast<double>(v.second)).c_str());
  std::printf("\n");
  if (f.tensors().empty()) {
    std::printf("no weights (vocabulary-only file)\n");
  } else if (f.get_string_or("general.architecture", "") == "clip") {
    auto v = model::load_vision_model(path);
    if (v)
      print_vision((*v)->spec);
    else
      std::printf("not runnable by troupe: %s\n", v.error().message.c_str());
  } else {
    try {
      print_spec(model::spec_from_gguf(f));
    } catch (const std::exception& e) {
      std::printf("not runnable by troupe: %s\n", e.what());
    }
  }
  if (f.find("tokenizer.ggml.model")) {
    auto t = model::Tokenizer::from_gguf(f);
    if (t)
      std::printf("tokenizer: %s, %d tokens, bos %d, eos %d\n", (*t)->model_kind().c_str(),
                  (*t)->n_vocab(), (*t)->bos_id(), (*t)->eos_id());
    else
      std::printf("tokenizer: invalid: %s\n", t.error().message.c_str());
  }
  return 0;
}

}  // namespace troupe::cli
