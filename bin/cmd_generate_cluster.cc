// `troupe generate --config PLAN | --stages N --expert-shards M | --head HOST:PORT`: the same
// generation as the single-process path, run through the actor system a plan describes (router,
// scheduler, stages, expert shards) in this process, or sent to a running cluster's head;
// optionally with many prompts at once (--prompt-file, --concurrency).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "actors/cluster_client.h"
#include "actors/local_cluster.h"
#include "actors/plan.h"
#include "bin/args.h"
#include "bin/cluster_generate.h"
#include "bin/common.h"
#include "compute/thread_pool.h"
#include "model/vision.h"

namespace troupe::cli {

namespace {

std::vector<actors::GenerateRequest> build_requests(const ArgParser& ap,
                                                    const compute::SamplingParams& sp,
                                                    int64_t max_tokens) {
  std::vector<actors::GenerateRequest> reqs;
  auto add = [&](actors::GenerateRequest r) {
    r.sampling = sp;
    r.max_tokens = max_tokens;
    r.add_bos = !ap.flag("no-bos");
    reqs.push_back(std::move(r));
  };
  if (ap.has("prompt-file")) {
    std::ifstream f(ap.str("prompt-file"));
    if (!f) throw CliError("cannot read " + ap.str("prompt-file"));
    std::string line;
    while (std::getline(f, line)) {
      if (line.empty()) continue;
      actors::GenerateRequest r;
      r.prompt = line;
      add(std::move(r));
    }
    if (reqs.empty()) throw CliError(ap.str("prompt-file") + " has no prompts (one per line)");
  } else if (ap.has("prompt")) {
    actors::GenerateRequest r;
    r.prompt = ap.str("prompt");
    add(std::move(r));
  } else {
    actors::GenerateRequest r;
    r.prompt_tokens = parse_id_list(ap.str("prompt-tokens"), "--prompt-tokens");
    add(std::move(r));
  }
  return reqs;
}

actors::StreamCallback stream_callback(const ArgParser& ap, size_t num_requests) {
  if (ap.flag("json") || num_requests != 1) return nullptr;
  return [](size_t, const std::string& delta, int32_t) {
    std::fwrite(delta.data(), 1, delta.size(), stdout);
    std::fflush(stdout);
  };
}

int print_results(const ArgParser& ap, const std::vector<actors::GenerateResult>& results) {
  const bool json = ap.flag("json");
  const bool stream = !json && results.size() == 1;
  int rc = 0;
  for (const auto& r : results) {
    if (!r.ok()) {
      std::fprintf(stderr, "troupe generate: %s\n", r.error.c_str());
      rc = 1;
      continue;
    }
    if (json) {
      nlohmann::json j;
      j["prompt_tokens"] = r.prompt_tokens;
      j["tokens"] = r.tokens;
      j["text"] = r.text;
      j["finish_reason"] = r.finish_reason;
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else if (stream) {
      std::printf("\n");
    } else {
      std::printf("%s\n", r.text.c_str());
    }
  }
  return rc;
}

/// host:port of --head, or of the plan's head node with --config.
std::pair<std::string, uint16_t> head_address(const std::string& s) {
  const size_t colon = s.rfind(':');
  char* end = nullptr;
  const long port = colon == std::string::npos ? 0 : std::strtol(s.c_str() + colon + 1, &end, 10);
  if (colon == std::string::npos || colon == 0 || !end || *end || port < 1 || port > 65535)
    throw CliError("--head: expected HOST:PORT, got '" + s + "'");
  return {s.substr(0, colon), static_cast<uint16_t>(port)};
}

}  // namespace

std::string cluster_token(const ArgParser& ap) {
  if (ap.has("token")) return ap.str("token");
  if (const char* env = std::getenv("TROUPE_CLUSTER_TOKEN"); env && *env) return env;
  if (ap.has("config")) {
    auto p = actors::parse_plan_file(ap.str("config"));
    if (!p) throw CliError(p.error().message);
    if (auto s = actors::resolve_placement(*p); !s) throw CliError(s.error().message);
    return p->cluster.token;
  }
  throw CliError("no cluster token: give --token, TROUPE_CLUSTER_TOKEN or --config CLUSTER.toml");
}

std::unique_ptr<actors::ClusterClient> connect_head(const ArgParser& ap) {
  auto [host, port] = head_address(ap.required("head"));
  auto c = actors::ClusterClient::connect(host, port, cluster_token(ap));
  if (!c) throw CliError(c.error().message);
  return std::move(*c);
}

int generate_with_plan(const ArgParser& ap, const compute::SamplingParams& sp, int64_t max_tokens) {
  actors::Plan plan;
  if (ap.has("config")) {
    auto p = actors::parse_plan_file(ap.str("config"));
    if (!p) throw CliError(p.error().message);
    plan = std::move(*p);
    if (ap.has("model")) plan.model_path = ap.str("model");
    if (ap.has("stages") || ap.has("expert-shards"))
      throw CliError("--stages/--expert-shards cannot be combined with --config");
  } else {
    plan = actors::even_plan(ap.required("model"), ap.integer("stages", 1, 1, 4096),
                             ap.integer("expert-shards", 0, 0, 4096));
  }
  if (plan.model_path.empty())
    throw CliError(plan.source + ": the plan names no model (give --model)");
  const bool cpu_only = std::all_of(plan.stages.begin(), plan.stages.end(),
                                    [](const actors::StagePlan& s) { return s.on_cpu(); });
  auto model = load_model_or_throw(plan.model_path,
                                   ap.has("weights") ? ap.str("weights") : plan.weights, cpu_only);
  if (auto st = actors::resolve_plan(plan, model->spec); !st) throw CliError(st.error().message);
  if (ap.has("kv-type")) plan.kv_type = kv_type_option(ap);
  if (ap.has("threads")) {  // every stage and expert shard (0 = auto: LocalCluster divides)
    const int n = threads_option(ap);
    for (auto& s : plan.stages) s.threads = n;
    for (auto& s : plan.expert_shards) s.threads = n;
  }
  if (ap.flag("stats")) std::fprintf(stderr, "%s\n", actors::describe_plan(plan).c_str());
  auto reqs = build_requests(ap, sp, max_tokens);
  actors::ClusterOptions opts;
  if (ap.has("image") || ap.has("mmproj")) {
    // The cluster's image encoder lays each prompt out; the first stage splices the rows.
    std::string mmproj = ap.has("mmproj") ? ap.str("mmproj") : plan.mmproj;
    if (mmproj.empty() && std::filesystem::is_directory(plan.model_path))
      mmproj = plan.model_path;  // a Hugging Face LLaVA directory holds its vision tower
    if (mmproj.empty())
      throw CliError("--image needs a vision encoder: --mmproj FILE, or [model] mmproj in " +
                     plan.source);
    if (!ap.has("image")) throw CliError("--mmproj needs at least one --image");
    auto vision = model::load_vision_model(mmproj);
    if (!vision) throw CliError(vision.error().message);
    opts.vision = *vision;
    opts.vision_threads = ap.has("threads") ? compute::resolve_threads(threads_option(ap), 1)
                                            : static_cast<int>(plan.vision_threads);
    opts.image_cache_bytes = plan.image_cache_mb << 20;
    const auto files = image_file_bytes(ap);
    for (auto& r : reqs) r.image_files = files;
  }
  auto lc = actors::LocalCluster::start(plan, model, opts);
  if (!lc) throw CliError(lc.error().message);
  const size_t concurrency = static_cast<size_t>(ap.integer("concurrency", 1, 1, 1 << 20));
  const auto results = (*lc)->generate_many(reqs, concurrency, stream_callback(ap, reqs.size()));
  const int rc = print_results(ap, results);
  if (ap.flag("stats")) std::fprintf(stderr, "%s\n", (*lc)->stats_json().c_str());
  return rc;
}

int generate_with_head(const ArgParser& ap, const compute::SamplingParams& sp, int64_t max_tokens) {
  auto reqs = build_requests(ap, sp, max_tokens);
  if (ap.has("image")) {
    const auto files = image_file_bytes(ap);  // the head's encoder lays the prompts out
    for (auto& r : reqs) r.image_files = files;
  }
  auto client = connect_head(ap);
  const size_t concurrency = static_cast<size_t>(ap.integer("concurrency", 1, 1, 1 << 20));
  return print_results(ap,
                       client->generate_many(reqs, concurrency, stream_callback(ap, reqs.size())));
}

}  // namespace troupe::cli
