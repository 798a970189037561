// `troupe generate` and `troupe eval`: single-process runs of the CPU engine.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <span>
#include <sstream>

#include <nlohmann/json.hpp>

#include "bin/args.h"
#include "bin/cluster_generate.h"
#include "bin/commands.h"
#include "bin/common.h"
#include "compute/engine.h"
#include "compute/grammar.h"
#include "compute/grammar_sampling.h"
#include "compute/multimodal_prompt.h"
#include "compute/sampler.h"
#include "compute/thread_pool.h"
#include "compute/vision_encoder.h"
#include "model/image.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "model/vision.h"
#include "serve/json_schema.h"

namespace troupe::cli {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// --grammar FILE or --json-schema FILE as GBNF (checked: it compiles); "" for neither.
std::string grammar_option(const ArgParser& ap) {
  if (ap.has("grammar") && ap.has("json-schema"))
    throw CliError("give one of --grammar and --json-schema");
  std::string text;
  const char* opt = ap.has("grammar") ? "grammar" : "json-schema";
  if (!ap.has(opt)) return text;
  const std::string file = ap.str(opt);
  std::ifstream in(file, std::ios::binary);
  if (!in) throw CliError("--" + std::string(opt) + ": cannot read " + file);
  std::stringstream ss;
  ss << in.rdbuf();
  text = ss.str();
  if (ap.has("json-schema")) {
    const auto schema = nlohmann::ordered_json::parse(text, nullptr, false);
    if (schema.is_discarded()) throw CliError("--json-schema: " + file + " is not JSON");
    auto g = serve::json_schema_grammar(schema);
    if (!g) throw CliError("--json-schema: " + file + ": " + g.error().message);
    text = std::move(*g);
  }
  if (auto g = compute::Grammar::compile(text); !g)
    throw CliError("--" + std::string(opt) + ": " + file + ": " + g.error().message);
  return text;
}

constexpr const char* kGenerateHelp =
    "usage: troupe generate --model PATH (--prompt TEXT | --prompt-tokens 1,2,3) [options]\n"
    "  --max-tokens N       tokens to generate (default 128)\n"
    "  --temperature T      0 = greedy (default 0)\n"
    "  --top-k K --top-p P --min-p P\n"
    "  --repeat-penalty R --presence-penalty P --frequency-penalty F\n"
    "  --seed S             sampling seed (default 0)\n"
    "  --stop TEXT          end the output just before this text\n"
    "  --grammar FILE       the output must be a sentence of this GBNF grammar (root rule\n"
    "                       `root`; compute/grammar.h)\n"
    "  --json-schema FILE   the output must be JSON this schema accepts (the subset of\n"
    "                       docs/http-api.md, Structured outputs)\n"
    "  --ignore-eos         keep generating after end-of-generation tokens\n"
    "  --no-bos             do not add the BOS token to a text prompt\n"
    "  --threads N|auto     compute threads (default auto: the CPUs this process may use;\n"
    "                       with a plan, each stage's and expert shard's own setting unless\n"
    "                       given, auto dividing those CPUs among them)\n"
    "  --weights W          where compute reads weights: auto (default: memory if the copy\n"
    "                       fits with room to spare, else map), memory (a private copy in\n"
    "                       huge-page memory, made at start) or map (the file mapping)\n"
    "  --kv-type T          what the KV cache stores: f32 (default: the exact values), f16 or\n"
    "                       bf16 (half the memory and half the attention reads; each value\n"
    "                       rounded once; with a plan, every CPU stage's)\n"
    "  --mmproj PATH        a vision encoder: a llama.cpp mmproj GGUF (LLaVA mlp, Gemma 3)\n"
    "                       or a Hugging Face LLaVA directory; default with --image: the\n"
    "                       --model directory, when it is one\n"
    "  --image FILE         a PNG or JPEG for the prompt (repeatable); each goes where the\n"
    "                       prompt says <__media__>, or before the text when it says none\n"
    "  --json               print {\"prompt_tokens\":[...],\"tokens\":[...],\"text\":\"...\"}\n"
    "                       (image positions are -1 in prompt_tokens)\n"
    "  --stats              print prefill/decode speed to stderr\n"
    "through the actor system (router, scheduler, pipeline stages, expert shards):\n"
    "  --config PLAN.toml   run the plan a TOML file describes (see conf/plan-example.toml)\n"
    "  --stages N --expert-shards M   an even plan: N pipeline stages, M expert shards\n"
    "  --prompt-file FILE   one prompt per line; --concurrency K runs K of them at once\n"
    "on a running cluster (troupe serve / troupe node):\n"
    "  --head HOST:PORT     send the prompts to the cluster's head node\n"
    "  --token T            the cluster token (or TROUPE_CLUSTER_TOKEN, or --config CLUSTER)\n";

}  // namespace

int cmd_generate(const Args& args) {
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    std::fputs(kGenerateHelp, stdout);
    return 0;
  }
  ArgParser ap(args,
               {"model",
                "prompt",
                "prompt-tokens",
                "max-tokens",
                "temperature",
                "top-k",
                "top-p",
                "min-p",
                "repeat-penalty",
                "presence-penalty",
                "frequency-penalty",
                "seed",
                "stop",
                "grammar",
                "json-schema",
                "threads",
                "config",
                "stages",
                "expert-shards",
                "concurrency",
                "prompt-file",
                "head",
                "token",
                "weights",
                "kv-type",
                "mmproj",
                "image"},
               {"json", "stats", "ignore-eos", "no-bos"}, 0, {"image"});
  const bool with_images = ap.has("image") || ap.has("mmproj");
  const bool use_plan =
      ap.has("config") || ap.has("stages") || ap.has("expert-shards") || ap.has("head");
  if (!use_plan && ap.has("prompt-file"))
    throw CliError("--prompt-file runs through the actor system: add --config or --stages");
  if (!use_plan && ap.has("concurrency"))
    throw CliError("--concurrency runs through the actor system: add --config or --stages");
  if (static_cast<int>(ap.has("prompt")) + static_cast<int>(ap.has("prompt-tokens")) +
          static_cast<int>(ap.has("prompt-file")) !=
      1)
    throw CliError(
        "give exactly one of --prompt TEXT, --prompt-tokens 1,2,3 or --prompt-file FILE");
  const int64_t max_tokens = ap.integer("max-tokens", 128, 0, 1 << 20);
  compute::SamplingParams sp;
  sp.temperature = static_cast<float>(ap.number("temperature", 0, 0, 100));
  sp.top_k = static_cast<int32_t>(ap.integer("top-k", 0, 0, 1 << 30));
  sp.top_p = static_cast<float>(ap.number("top-p", 1, 0, 1));
  sp.min_p = static_cast<float>(ap.number("min-p", 0, 0, 1));
  sp.repetition_penalty = static_cast<float>(ap.number("repeat-penalty", 1, 0, 100));
  sp.presence_penalty = static_cast<float>(ap.number("presence-penalty", 0, -100, 100));
  sp.frequency_penalty = static_cast<float>(ap.number("frequency-penalty", 0, -100, 100));
  sp.seed = static_cast<uint64_t>(ap.integer("seed", 0, 0, INT64_MAX));
  sp.ignore_eos = ap.flag("ignore-eos");
  if (ap.has("stop")) sp.stop_strings.push_back(ap.str("stop"));
  sp.grammar = grammar_option(ap);
  if (auto st = sp.validate(); !st) throw CliError(st.error().message);
  if (ap.has("mmproj") && ap.has("head"))
    throw CliError(
        "--mmproj is not for a remote cluster (--head): its vision encoder is the [model] mmproj "
        "of its config; send just the --image files");
  if (with_images && !ap.has("prompt"))
    throw CliError("--image needs a text --prompt (where <__media__> marks each image)");
  if (ap.has("head") && ap.has("kv-type"))
    throw CliError(
        "--kv-type is not for a running cluster (--head): its config's [stages] kv_type says "
        "what its KV pools store");
  if (ap.has("head")) return generate_with_head(ap, sp, max_tokens);
  if (use_plan) return generate_with_plan(ap, sp, max_tokens);
  const std::string path = ap.required("model");

  auto model = load_model_or_throw(path, ap.str("weights", "auto"));
  const model::Tokenizer* tok = model->tokenizer.get();
  const int threads = compute::resolve_threads(threads_option(ap), 1);
  compute::MultimodalPrompt mp;  // the prompt's tokens, and its images' rows where it has any
  std::vector<int32_t>& prompt = mp.tokens;
  if (with_images) {
    if (!tok || !ap.has("prompt")) throw CliError("--image needs a text --prompt and a vocabulary");
    mp = prompt_with_images(ap, *model, threads);
  } else if (ap.has("prompt")) {
    if (!tok) throw CliError(path + " has no vocabulary: use --prompt-tokens");
    prompt = tok->encode(ap.str("prompt"), !ap.flag("no-bos"));
  } else {
    prompt = parse_id_list(ap.str("prompt-tokens"), "--prompt-tokens");
  }
  if (prompt.empty()) throw CliError("the prompt is empty (no tokens)");
  for (int32_t id : prompt)
    if (id >= model->spec.n_vocab)
      throw CliError("prompt token " + std::to_string(id) + " is outside the vocabulary (size " +
                     std::to_string(model->spec.n_vocab) + ")");

  compute::EngineOptions eo;
  eo.n_threads = threads;
  eo.max_tokens_in_cache = static_cast<int64_t>(prompt.size()) + max_tokens + 1;
  eo.max_positions = static_cast<int64_t>(prompt.size()) + max_tokens;  // LongRoPE's factors
  eo.kv_type = kv_type_option(ap);
  auto eng = compute::Engine::create(model, eo);
  if (!eng) throw CliError(eng.error().message);
  compute::Sequence seq(**eng);
  if (!seq.reserve(static_cast<int64_t>(prompt.size()) + max_tokens))
    throw CliError("KV cache too small");

  compute::Sampler sampler(sp);
  std::unique_ptr<compute::GrammarSampling> constrained;
  if (!sp.grammar.empty()) {
    if (!tok) throw CliError(path + " has no vocabulary: a grammar cannot be followed");
    constrained = std::make_unique<compute::GrammarSampling>(compute::TokenVocab::of(*tok));
  }
  std::vector<int32_t> history, generated;  // penalties see the prompt's tokens, not its images
  std::copy_if(prompt.begin(), prompt.end(), std::back_inserter(history),
               [](int32_t id) { return id != compute::SeqStep::kEmbedded; });
  std::vector<int32_t> eos_ids;
  if (tok && tok->eos_id() >= 0) eos_ids.push_back(tok->eos_id());
  const bool json = ap.flag("json");
  std::optional<model::StreamDecoder> sdec;
  if (tok) sdec.emplace(*tok);
  compute::StopMatcher stops(sp.stop_strings);
  std::string text;
  auto emit = [&](const std::string& s) {
    text += s;
    if (!json && !s.empty()) {
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);
    }
  };

  // Prefill in chunks; only the last chunk asks for logits.
  constexpr int64_t kChunk = 512;
  compute::StepResult res;
  const auto t0 = Clock::now();
  const auto E = static_cast<size_t>(model->spec.n_embd);
  for (const compute::PrefillChunk& c : compute::prefill_chunks(mp, kChunk)) {
    const auto n = static_cast<size_t>(c.end - c.begin);
    const bool last = c.end == static_cast<int64_t>(prompt.size());
    compute::SeqStep st =
        seq.next({prompt.data() + c.begin, n},
                 last ? compute::SeqStep::Logits::kLast : compute::SeqStep::Logits::kNone);
    const auto rows = static_cast<size_t>(
        std::count(st.tokens.begin(), st.tokens.end(), compute::SeqStep::kEmbedded));
    st.embd = {mp.embd.data() + static_cast<size_t>(c.row_begin) * E, rows * E};
    st.non_causal = c.non_causal;
    if (auto s = (*eng)->step({&st, 1}, &res); !s) throw CliError(s.error().message);
    seq.advance(static_cast<int64_t>(n));
  }
  const double t_prefill = seconds_since(t0);
  const auto t1 = Clock::now();
  bool stopped = false;
  for (int64_t i = 0; i < max_tokens && !stopped; ++i) {
    const std::span<const float> row(res.row(0), static_cast<size_t>(res.n_vocab));
    int32_t next = 0;
    if (constrained) {
      auto t = constrained->sample(0, sp, generated, sampler, row, history);
      if (!t) throw CliError(t.error().message);
      next = *t;
    } else {
      next = sampler.sample(row, history);
    }
    history.push_back(next);
    const bool eog = (!sp.ignore_eos && tok && tok->is_eog(next)) ||
                     std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), next) !=
                         sp.stop_token_ids.end();
    if (eog) break;
    generated.push_back(next);
    if (sdec) {
      auto out = stops.feed(sdec->push(next));
      emit(out.text);
      if (out.stopped) break;
    }
    if (i + 1 == max_tokens) break;
    compute::SeqStep st = seq.next({&generated.back(), 1}, compute::SeqStep::Logits::kLast);
    if (auto s = (*eng)->step({&st, 1}, &res); !s) throw CliError(s.error().message);
    seq.advance(1);
  }
  if (sdec && !stops.stopped()) {
    auto out = stops.feed(sdec->flush());
    emit(out.text);
    if (!out.stopped) emit(stops.flush());
  }
  const double t_decode = seconds_since(t1);
  if (json) {
    nlohmann::json j;
    j["prompt_tokens"] = prompt;
    j["tokens"] = generated;
    j["text"] = text;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("\n");
  }
  std::fflush(stdout);
  if (ap.flag("stats")) {
    std::fprintf(stderr,
                 "prefill: %zu tokens in %.3f s (%.1f tok/s); decode: %zu tokens in %.3f s "
                 "(%.1f tok/s); threads %d\n",
                 prompt.size(), t_prefill, static_cast<double>(prompt.size()) / t_prefill,
                 generated.size(), t_decode,
                 generated.empty() ? 0.0 : static_cast<double>(generated.size()) / t_decode,
                 threads);
  }
  return 0;
}

int cmd_eval(const Args& args) {
  ArgParser ap(args, {"model", "tokens", "logits-out", "threads", "kv-type", "weights"}, {});
  const std::string path = ap.required("model");
  const std::vector<int32_t> toks = parse_id_list(ap.required("tokens"), "--tokens");
  const std::string out_path = ap.required("logits-out");
  const int threads = compute::resolve_threads(threads_option(ap), 1);
  // The file mapping unless asked (no copy's start-up for a check); --weights memory|auto as
  // generate's, to check that a copy gives the mapped model's logits.
  auto model = load_model_or_throw(path, ap.str("weights", "map"));
  for (int32_t id : toks)
    if (id >= model->spec.n_vocab)
      throw CliError("token " + std::to_string(id) + " is outside the vocabulary (size " +
                     std::to_string(model->spec.n_vocab) + ")");
  compute::EngineOptions eo;
  eo.n_threads = threads;
  eo.max_tokens_in_cache = static_cast<int64_t>(toks.size()) + 1;
  eo.max_positions = static_cast<int64_t>(toks.size());
  eo.kv_type = kv_type_option(ap);
  auto eng = compute::Engine::create(model, eo);
  if (!eng) throw CliError(eng.error().message);
  compute::Sequence seq(**eng);
  if (!seq.reserve(static_cast<int64_t>(toks.size()))) throw CliError("KV cache too small");
  std::ofstream f(out_path, std::ios::binary);
  if (!f) throw CliError("cannot write " + out_path);
  constexpr size_t kChunk = 512;
  compute::StepResult res;
  for (size_t at = 0; at < toks.size();) {
    const size_t n = std::min(kChunk, toks.size() - at);
    compute::SeqStep st = seq.next({toks.data() + at, n}, compute::SeqStep::Logits::kAll);
    if (auto s = (*eng)->step({&st, 1}, &res); !s) throw CliError(s.error().message);
    seq.advance(static_cast<int64_t>(n));
    f.write(reinterpret_cast<const char*>(res.logits.data()),
            static_cast<std::streamsize>(res.logits.size() * sizeof(float)));
    at += n;
  }
  if (!f.flush()) throw CliError("error writing " + out_path);
  std::fprintf(stderr, "wrote %zu x %lld float32 logits to %s\n", toks.size(),
               static_cast<long long>(model->spec.n_vocab), out_path.c_str());
  return 0;
}

}  // namespace troupe::cli
