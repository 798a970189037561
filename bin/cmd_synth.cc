// `troupe synth`: writes a deterministic random-weight model of a supported architecture in
// llama.cpp's GGUF conventions (see model/synth.h). Prints one summary line, plus one note per
// tensor kind stored in another type than --dtype.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "bin/commands.h"
#include "model/synth.h"

namespace troupe::cli {

namespace {

constexpr const char* kUsage =
    "usage: troupe synth --arch llama|mixtral|qwen3moe|qwen2moe|deepseek2 --out FILE\n"
    "  [--n-embd N] [--n-layer N] [--n-head N] [--n-head-kv N] [--n-ff N] [--head-dim N]\n"
    "  [--n-expert N] [--n-expert-used N] [--n-ff-exp N] [--n-ff-shexp N]\n"
    "  [--q-lora-rank N] [--kv-lora-rank N] [--qk-rope-dim N] [--qk-nope-dim N] [--v-head-dim N]\n"
    "  [--n-dense-lead N] [--n-expert-shared N] [--n-group N] [--n-group-used N]\n"
    "  [--gating softmax|sigmoid] [--expert-weights-norm 0|1] [--expert-weights-scale X]\n"
    "  [--rope-theta X] [--rms-eps X] [--n-vocab N] [--n-ctx N] [--name NAME]\n"
    "  [--dtype f32|f16|bf16|q8_0|q4_0] [--seed S] [--vocab-donor GGUF] [--threads N]\n"
    "Defaults give the shapes of ../shared/models/synth/<arch>; without --vocab-donor the model\n"
    "gets a built-in byte-level BPE vocabulary (512 tokens unless --n-vocab).\n";

int fail(const std::string& what) {
  std::fprintf(stderr, "troupe synth: %s\n", what.c_str());
  return 2;
}

std::optional<int64_t> parse_int(const std::string& s) {
  if (s.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return std::nullopt;
  return v;
}

std::optional<double> parse_float(const std::string& s) {
  if (s.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v)) return std::nullopt;
  return v;
}

}  // namespace

int cmd_synth(const Args& args) {
  model::SynthOptions o;
  std::string out;
  std::string cmdline = "troupe synth";
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    if (flag == "-h" || flag == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    std::string value;
    const size_t eq = flag.find('=');
    if (flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else {
      if (flag.rfind("--", 0) != 0) return fail("unexpected argument '" + flag + "' (see --help)");
      if (i + 1 >= args.size()) return fail(flag + " needs a value");
      value = args[++i];
    }
    if (flag != "--out" && flag != "--threads") cmdline += " " + flag + " " + value;

    auto int_opt = [&](std::optional<int64_t>& dst) -> bool {
      auto v = parse_int(value);
      if (!v) return false;
      dst = *v;
      return true;
    };
    auto float_opt = [&](std::optional<float>& dst) -> bool {
      auto v = parse_float(value);
      if (!v) return false;
      dst = static_cast<float>(*v);
      return true;
    };
    bool ok = true;
    if (flag == "--arch") o.arch = value;
    else if (flag == "--out") out = value;
    else if (flag == "--name") o.name = value;
    else if (flag == "--vocab-donor") o.vocab_donor = value;
    else if (flag == "--gating") o.gating = value;
    else if (flag == "--n-embd") ok = int_opt(o.n_embd);
    else if (flag == "--n-layer") ok = int_opt(o.n_layer);
    else if (flag == "--n-head") ok = int_opt(o.n_head);
    else if (flag == "--n-head-kv") ok = int_opt(o.n_head_kv);
    else if (flag == "--n-ff") ok = int_opt(o.n_ff);
    else if (flag == "--head-dim") ok = int_opt(o.head_dim);
    else if (flag == "--n-expert") ok = int_opt(o.n_expert);
    else if (flag == "--n-expert-used") ok = int_opt(o.n_expert_used);
    else if (flag == "--n-ff-exp") ok = int_opt(o.n_ff_exp);
    else if (flag == "--n-ff-shexp") ok = int_opt(o.n_ff_shexp);
    else if (flag == "--n-expert-shared") ok = int_opt(o.n_expert_shared);
    else if (flag == "--n-dense-lead") ok = int_opt(o.n_dense_lead);
    else if (flag == "--n-group") ok = int_opt(o.n_group);
    else if (flag == "--n-group-used") ok = int_opt(o.n_group_used);
    else if (flag == "--q-lora-rank") ok = int_opt(o.q_lora_rank);
    else if (flag == "--kv-lora-rank") ok = int_opt(o.kv_lora_rank);
    else if (flag == "--qk-rope-dim") ok = int_opt(o.qk_rope_dim);
    else if (flag == "--qk-nope-dim") ok = int_opt(o.qk_nope_dim);
    else if (flag == "--v-head-dim") ok = int_opt(o.v_head_dim);
    else if (flag == "--n-vocab") ok = int_opt(o.n_vocab);
    else if (flag == "--rope-theta") ok = float_opt(o.rope_theta);
    else if (flag == "--rms-eps") ok = float_opt(o.rms_eps);
    else if (flag == "--expert-weights-scale") ok = float_opt(o.expert_weights_scale);
    else if (flag == "--expert-weights-norm") {
      ok = value == "0" || value == "1";
      o.expert_weights_norm = value == "1";
    } else if (flag == "--n-ctx") {
      std::optional<int64_t> v;
      ok = int_opt(v);
      if (ok) o.n_ctx = *v;
    } else if (flag == "--seed") {
      auto v = parse_int(value);
      ok = v.has_value() && *v >= 0;
      if (ok) o.seed = static_cast<uint64_t>(*v);
    } else if (flag == "--threads") {
      auto v = parse_int(value);
      ok = v.has_value() && *v >= 0 && *v <= 1024;
      if (ok) o.num_threads = static_cast<int>(*v);
    } else if (flag == "--dtype") {
      auto t = model::parse_synth_dtype(value);
      if (!t) return fail("--dtype must be f32, f16, bf16, q8_0 or q4_0, got '" + value + "'");
      o.dtype = *t;
    } else {
      return fail("unknown option " + flag + " (see --help)");
    }
    if (!ok) return fail("bad value '" + value + "' for " + flag);
  }
  if (out.empty()) return fail("--out FILE is required (see --help)");
  o.command_line = cmdline;

  auto r = model::synth_model_summary(o, out);
  if (!r.has_value()) return fail(r.error().message);
  for (const std::string& note : r->notes) std::printf("synth: note: %s\n", note.c_str());
  std::printf("synth: %s -> %s\n", r->line().c_str(), out.c_str());
  return 0;
}

}  // namespace troupe::cli
