// Plan: filling its auto parts from the model (layer split, expert sets, KV pools), validating it,
// placing it over the cluster's nodes and describing it. Runs once at start, on the caller's
// thread; see plan.h. Reading the TOML file is in plan_parse.cc.
#include "actors/plan.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>

#include "actors/detail/plan_internal.h"
#include "base/check.h"
#include "model/model_spec.h"

namespace troupe::actors {

using namespace detail::plan_internal;

const char* to_string(PlanErrc e) {
  switch (e) {
    case PlanErrc::kIo:
      return "io";
    case PlanErrc::kSyntax:
      return "syntax";
    case PlanErrc::kSchema:
      return "schema";
    case PlanErrc::kInvalid:
      return "invalid";
  }
  return "unknown";
}

namespace {

std::string range_text(int64_t begin, int64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

// ------------------------------------------------------------------------------------------
// Resolving and validating against the model.

[[noreturn]] void invalid(const Plan& p, int64_t line, const std::string& what) {
  throw PlanError(PlanErrc::kInvalid, where(p.source, line) + ": " + what);
}

[[noreturn]] void out_of_bound(const Plan& p, const std::string& key, Bound b, int64_t got) {
  throw PlanError(PlanErrc::kSchema, p.source + ": " + key + ": expected " + expect_text(b) +
                                         ", got " + std::to_string(got));
}

void check_bound(const Plan& p, const std::string& key, Bound b, int64_t v) {
  if (v < b.min || v > b.max) out_of_bound(p, key, b, v);
}

/// Values a plan built in code may get wrong that the parser already rejects with a line.
void check_bounds(const Plan& p) {
  check_bound(p, "stages.count", kStageCount, p.num_stages);
  check_bound(p, "expert_shards.count", kShardCount, p.num_expert_shards);
  check_bound(p, "stages.kv_block_size", kBlockSize, p.kv_block_size);
  for (const SchedField& f : kSchedFields)
    check_bound(p, std::string("scheduler.") + f.name, f.bound, p.scheduler.*f.field);
  for (size_t i = 0; i < p.stages.size(); ++i) {
    std::string key = "stage[" + std::to_string(i) + "]";
    if (p.stages[i].threads != 0) check_bound(p, key + ".threads", kThreads, p.stages[i].threads);
    if (p.stages[i].kv_blocks != 0)
      check_bound(p, key + ".kv_blocks", kKvBlocks, p.stages[i].kv_blocks);
  }
  for (size_t i = 0; i < p.expert_shards.size(); ++i)
    if (p.expert_shards[i].threads != 0)
      check_bound(p, "expert_shard[" + std::to_string(i) + "].threads", kThreads,
                  p.expert_shards[i].threads);
}

std::string threads_text(int threads) { return threads == 0 ? "auto" : std::to_string(threads); }

std::string stage_text(const Plan& p, size_t i) {
  return "stage " + std::to_string(i) + " " +
         range_text(p.stages[i].layer_begin, p.stages[i].layer_end);
}

bool layers_auto(const StagePlan& s) { return s.layer_begin == -1 && s.layer_end == -1; }

/// Checks the stages whose ranges are set, in list order. With `complete` (no auto left) the
/// ranges must also tile [0, n_layer) with no gap.
void check_layer_ranges(const Plan& p, int64_t n_layer, bool complete) {
  std::optional<size_t> prev;
  for (size_t i = 0; i < p.stages.size(); ++i) {
    const StagePlan& s = p.stages[i];
    if (layers_auto(s)) continue;
    if (s.layer_begin < 0 || s.layer_end < 0)
      invalid(p, s.line,
              "stage " + std::to_string(i) +
                  ": layer_begin and layer_end must both be set or both be -1 (auto)");
    if (s.layer_begin >= s.layer_end)
      invalid(p, s.line, stage_text(p, i) + " is empty: a stage needs at least one layer");
    if (s.layer_end > n_layer)
      invalid(p, s.line, stage_text(p, i) + " runs past the model's " + plural(n_layer, "layer"));
    if (!prev) {
      if (complete && s.layer_begin != 0)
        invalid(p, s.line,
                "layers " + range_text(0, s.layer_begin) +
                    " are owned by no stage: the first stage, " + stage_text(p, i) +
                    ", must begin at layer 0");
    } else {
      const StagePlan& q = p.stages[*prev];
      if (s.layer_end <= q.layer_begin)
        invalid(p, s.line,
                stage_text(p, i) + " comes after " + stage_text(p, *prev) +
                    ": list stages in pipeline order, by ascending layers");
      if (s.layer_begin < q.layer_end)
        invalid(p, s.line,
                "stages " + std::to_string(*prev) + " " + range_text(q.layer_begin, q.layer_end) +
                    " and " + std::to_string(i) + " " + range_text(s.layer_begin, s.layer_end) +
                    " overlap on layers " +
                    range_text(s.layer_begin, std::min(q.layer_end, s.layer_end)));
      if (complete && s.layer_begin > q.layer_end)
        invalid(p, s.line,
                "layers " + range_text(q.layer_end, s.layer_begin) +
                    " are owned by no stage: a gap between " + stage_text(p, *prev) + " and " +
                    stage_text(p, i));
    }
    prev = i;
  }
  if (complete && prev && p.stages[*prev].layer_end != n_layer)
    invalid(p, p.stages[*prev].line,
            "layers " + range_text(p.stages[*prev].layer_end, n_layer) +
                " are owned by no stage: the last stage, " + stage_text(p, *prev) +
                ", must end at layer " + std::to_string(n_layer) + ", the model's layer count");
}

/// Splits [lo, hi) evenly over stages [first, last), earlier stages taking the extra layer.
void split_layers(Plan& p, size_t first, size_t last, int64_t lo, int64_t hi) {
  int64_t n = static_cast<int64_t>(last - first), span = hi - lo;
  if (span < n) {
    std::string who = n == 1 ? "stage " + std::to_string(first) + " is auto"
                             : "stages " + std::to_string(first) + " to " +
                                   std::to_string(last - 1) + " are auto";
    invalid(p, p.stages[first].line,
            who + " but only " + plural(span, "layer") + " (" + range_text(lo, hi) + ") " +
                (span == 1 ? "is" : "are") +
                " left between the explicit ranges: each stage needs at least one");
  }
  int64_t begin = lo;
  for (size_t i = first; i < last; ++i) {
    int64_t k = static_cast<int64_t>(i - first);
    int64_t size = span / n + (k < span % n ? 1 : 0);
    p.stages[i].layer_begin = begin;
    p.stages[i].layer_end = begin + size;
    begin += size;
  }
}

void resolve_layers(Plan& p, int64_t n_layer) {
  if (n_layer <= 0) invalid(p, 0, "the model has no layers");
  if (p.num_stages > n_layer)
    invalid(p, 0,
            plural(p.num_stages, "stage") + " for a model of " + plural(n_layer, "layer") +
                ": each stage needs at least one layer");
  check_layer_ranges(p, n_layer, false);
  size_t n = p.stages.size();
  for (size_t i = 0; i < n;) {
    if (!layers_auto(p.stages[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < n && layers_auto(p.stages[j])) ++j;
    int64_t lo = i == 0 ? 0 : p.stages[i - 1].layer_end;
    int64_t hi = j == n ? n_layer : p.stages[j].layer_begin;
    split_layers(p, i, j, lo, hi);
    i = j;
  }
  check_layer_ranges(p, n_layer, true);
}

std::string shard_name(size_t i) { return "expert shard " + std::to_string(i); }

std::string id_list(const std::vector<int32_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size() && i < 8; ++i) {
    if (i > 0) out += (i + 1 == ids.size()) ? " and " : ", ";
    out += std::to_string(ids[i]);
  }
  if (ids.size() > 8) out += " and " + std::to_string(ids.size() - 8) + " more";
  return out;
}

/// Checks the explicit shards and returns the owner of each expert (-1: none yet).
std::vector<int64_t> explicit_owners(Plan& p, int64_t n_expert) {
  std::vector<int64_t> owner(static_cast<size_t>(n_expert), -1);
  for (size_t i = 0; i < p.expert_shards.size(); ++i) {
    ExpertShardPlan& s = p.expert_shards[i];
    if (s.auto_experts) continue;
    if (s.experts.empty()) invalid(p, s.line, shard_name(i) + " owns no experts (experts = [])");
    std::sort(s.experts.begin(), s.experts.end());
    for (size_t k = 0; k < s.experts.size(); ++k) {
      int64_t e = s.experts[k];
      if (e < 0 || e >= n_expert)
        invalid(p, s.line,
                shard_name(i) + ": expert " + std::to_string(e) +
                    " is out of range: the model has " + plural(n_expert, "expert") +
                    ", ids 0 to " + std::to_string(n_expert - 1));
      if (k > 0 && s.experts[k - 1] == e)
        invalid(p, s.line, shard_name(i) + " lists expert " + std::to_string(e) + " twice");
      int64_t& o = owner[static_cast<size_t>(e)];
      if (o >= 0)
        invalid(p, s.line,
                "expert " + std::to_string(e) + " is owned twice: by expert shards " +
                    std::to_string(o) + " and " + std::to_string(i));
      o = static_cast<int64_t>(i);
    }
  }
  return owner;
}

void resolve_experts(Plan& p, const model::ModelSpec& spec) {
  int64_t n_shards = p.num_expert_shards, n_expert = spec.n_expert;
  if (n_shards == 0) return;
  if (n_expert <= 0)
    invalid(p, 0,
            "the model is dense (it has no experts) but the plan has " +
                plural(n_shards, "expert shard"));
  if (n_shards > n_expert)
    invalid(p, 0,
            plural(n_shards, "expert shard") + " for a model of " + plural(n_expert, "expert") +
                ": each shard needs at least one expert");
  std::vector<int64_t> owner = explicit_owners(p, n_expert);
  std::vector<int32_t> left;
  for (int64_t e = 0; e < n_expert; ++e)
    if (owner[static_cast<size_t>(e)] < 0) left.push_back(static_cast<int32_t>(e));
  std::vector<size_t> autos;
  for (size_t i = 0; i < p.expert_shards.size(); ++i)
    if (p.expert_shards[i].auto_experts) autos.push_back(i);
  if (autos.empty() && !left.empty())
    invalid(p, 0,
            (left.size() == 1 ? "expert " : "experts ") + id_list(left) +
                (left.size() == 1 ? " is" : " are") + " owned by no expert shard");
  if (left.size() < autos.size())
    invalid(p, p.expert_shards[autos[0]].line,
            plural(static_cast<int64_t>(autos.size()), "expert shard") + " are auto but only " +
                plural(static_cast<int64_t>(left.size()), "expert") + " " +
                (left.empty() ? "" : "(" + id_list(left) + ") ") +
                "left after the explicit shards: each shard needs at least one");
  // Contiguous runs: a shard's experts are adjacent rows of every stacked expert tensor.
  size_t next = 0, n = autos.size();
  for (size_t k = 0; k < n; ++k) {
    size_t size = left.size() / n + (k < left.size() % n ? 1 : 0);
    ExpertShardPlan& s = p.expert_shards[autos[k]];
    s.experts.assign(left.begin() + static_cast<std::ptrdiff_t>(next),
                     left.begin() + static_cast<std::ptrdiff_t>(next + size));
    s.auto_experts = false;
    next += size;
  }
}

void resolve_kv(Plan& p) {
  const SchedulerConfig& sc = p.scheduler;
  int64_t per_seq = (sc.max_model_len + p.kv_block_size - 1) / p.kv_block_size;
  // Data-parallel stages share one split of the KV ids: the same GPU count for all of them.
  const int64_t pools = p.kv_pools();
  for (size_t i = 0; i < p.stages.size(); ++i) {
    const int64_t d = p.stages[i].data_ranks();
    if (d != 1 && d != pools)
      invalid(p, p.stages[i].line,
              "stage " + std::to_string(i) +
                  ": data-parallel stages must use the same number of GPUs (" + std::to_string(d) +
                  " and " + std::to_string(pools) +
                  "): the KV block ids split into one pool per GPU for the whole pipeline");
  }
  for (size_t i = 0; i < p.stages.size(); ++i) {
    StagePlan& s = p.stages[i];
    if (s.kv_blocks == 0) s.kv_blocks = sc.max_sequences * per_seq;
    // One pool per data-parallel GPU, each able to hold a whole sequence.
    if (pools > 1) s.kv_blocks = std::max(s.kv_blocks / pools, per_seq) * pools;
    if (s.kv_blocks < per_seq)
      invalid(p, s.line,
              "stage " + std::to_string(i) + ": a KV pool of " + plural(s.kv_blocks, "block") +
                  " (" + std::to_string(s.kv_blocks * p.kv_block_size) + " tokens at " +
                  std::to_string(p.kv_block_size) +
                  " tokens a block) cannot hold one sequence of scheduler.max_model_len = " +
                  std::to_string(sc.max_model_len) + " tokens, which needs " +
                  std::to_string(per_seq) + " blocks");
  }
}

void check_scheduler(const Plan& p, const model::ModelSpec& spec) {
  const SchedulerConfig& sc = p.scheduler;
  if (spec.n_ctx_train > 0 && sc.max_model_len > spec.n_ctx_train)
    invalid(p, 0,
            "scheduler.max_model_len = " + std::to_string(sc.max_model_len) +
                " exceeds the model's training context of " + std::to_string(spec.n_ctx_train) +
                " tokens");
  // NOTE: microbatches above max_sequences is fine: it is a ceiling, and the scheduler keeps
  // fewer micro-batches in flight when fewer sequences run.
}

/// GLM-5.2's shared-indexer layers reuse the positions the last layer before them with an
/// indexer chose, which must then run in the same stage. A run of auto stages with a boundary on
/// a shared layer takes, for each boundary in turn, the nearest layer with an indexer that leaves
/// enough for the boundaries after it; a stage that still starts on a shared layer (an explicit
/// range, or too few layers with indexers) is an error naming both layers.
void align_to_indexers(Plan& p, const model::ModelSpec& spec, const std::vector<bool>& was_auto) {
  if (spec.layers.size() != static_cast<size_t>(spec.n_layer)) return;  // a spec without layers
  auto shared = [&](int64_t l) { return spec.layers[static_cast<size_t>(l)].idx_shared; };
  const size_t n = p.stages.size();
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && was_auto[j]) ++j;
    bool on_shared = false;
    for (size_t k = i + 1; k < j; ++k) on_shared = on_shared || shared(p.stages[k].layer_begin);
    std::vector<int64_t> starts;  // layers inside the run where a stage may start
    if (on_shared)
      for (int64_t l = p.stages[i].layer_begin + 1; l < p.stages[j - 1].layer_end; ++l)
        if (!shared(l)) starts.push_back(l);
    if (on_shared && starts.size() + 1 >= j - i) {
      size_t from = 0;
      for (size_t k = i + 1; k < j; ++k) {
        const size_t after = j - k - 1;  // boundaries still to place
        const int64_t want = p.stages[k].layer_begin;
        size_t best = from;
        for (size_t x = from; x + after < starts.size(); ++x)
          if (std::abs(starts[x] - want) < std::abs(starts[best] - want)) best = x;
        p.stages[k - 1].layer_end = p.stages[k].layer_begin = starts[best];
        from = best + 1;
      }
    }
    i = std::max(j, i + 1);
  }
  for (size_t i = 1; i < n; ++i) {
    const int64_t b = p.stages[i].layer_begin;
    if (!shared(b)) continue;
    int64_t full = b;
    while (full > 0 && shared(full)) --full;
    invalid(p, p.stages[i].line,
            "stage " + std::to_string(i) + " starts at layer " + std::to_string(b) +
                ", which has no indexer of its own and reuses the positions layer " +
                std::to_string(full) +
                " chose (GLM-5.2's shared indexers): a stage must start at a layer with its own "
                "indexer");
  }
}

void resolve(Plan& p, const model::ModelSpec& spec) {
  check_bounds(p);
  if (static_cast<int64_t>(p.stages.size()) > p.num_stages)
    invalid(p, 0,
            "num_stages is " + std::to_string(p.num_stages) + " but " +
                plural(static_cast<int64_t>(p.stages.size()), "stage") + " are listed");
  if (static_cast<int64_t>(p.expert_shards.size()) > p.num_expert_shards)
    invalid(p, 0,
            "num_expert_shards is " + std::to_string(p.num_expert_shards) + " but " +
                plural(static_cast<int64_t>(p.expert_shards.size()), "expert shard") +
                " are listed");
  p.stages.resize(static_cast<size_t>(p.num_stages));
  p.expert_shards.resize(static_cast<size_t>(p.num_expert_shards));
  check_scheduler(p, spec);
  // Linear-attention layers keep a state per sequence that a cached KV prefix does not hold: a
  // hit would skip positions they must see, so their models run without the prefix cache.
  if (spec.has_recurrent_layers()) p.scheduler.prefix_cache = false;
  std::vector<bool> was_auto;
  for (const StagePlan& s : p.stages) was_auto.push_back(layers_auto(s));
  resolve_layers(p, spec.n_layer);
  align_to_indexers(p, spec, was_auto);
  resolve_experts(p, spec);
  resolve_kv(p);
}

/// "0-3, 6, 8-9".
std::string compress_ids(const std::vector<int32_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(ids[i]);
    if (j > i) out += "-" + std::to_string(ids[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace

Plan even_plan(const std::string& model_path, int64_t num_stages, int64_t num_expert_shards) {
  Plan p;
  p.source = "--stages " + std::to_string(num_stages) + " --expert-shards " +
             std::to_string(num_expert_shards);
  p.model_path = model_path;
  p.num_stages = num_stages;
  p.num_expert_shards = num_expert_shards;
  p.stages.resize(static_cast<size_t>(std::max<int64_t>(num_stages, 0)));
  p.expert_shards.resize(static_cast<size_t>(std::max<int64_t>(num_expert_shards, 0)));
  return p;
}

Status resolve_plan(Plan& plan, const model::ModelSpec& spec) {
  try {
    resolve(plan, spec);
    for (size_t i = 0; i < plan.stages.size(); ++i)
      if (!plan.stages[i].on_cpu() && !plan.expert_shards.empty())
        return make_error(static_cast<int>(PlanErrc::kInvalid),
                          where(plan.source, plan.stages[i].line) + ": stage[" + std::to_string(i) +
                              "] runs on " + plan.stages[i].device +
                              ", and a GPU stage computes its layers' experts itself: expert "
                              "shards with GPU stages are not supported yet (drop the "
                              "[[expert_shard]] tables or use device = \"cpu\")");
    return Ok{};
  } catch (const PlanError& e) {
    return to_error(e);
  } catch (const std::exception& e) {
    return make_error(static_cast<int>(PlanErrc::kInvalid), plan.source + ": " + e.what());
  }
}

int node_index(const Plan& plan, const std::string& name) {
  for (size_t i = 0; i < plan.cluster.nodes.size(); ++i)
    if (plan.cluster.nodes[i].name == name) return static_cast<int>(i);
  return -1;
}

namespace {

// [[encoder]] tables need an mmproj; an mmproj without them gets one encoder (node "" = the head).
Status resolve_encoders(Plan& p) {
  if (p.mmproj.empty() && !p.encoders.empty())
    return Error{static_cast<int>(PlanErrc::kInvalid),
                 where(p.source, p.encoders[0].line) +
                     ": encoder[0]: an [[encoder]] encodes images for [model] mmproj, which the "
                     "plan does not name"};
  if (!p.mmproj.empty() && p.encoders.empty())
    p.encoders.push_back({static_cast<int>(p.vision_threads), "", 0});
  return Ok{};
}

}  // namespace

Status resolve_placement(Plan& p) {
  ClusterPlan& c = p.cluster;
  auto err = [&](int line, const std::string& what) -> Status {
    return Error{static_cast<int>(PlanErrc::kInvalid), where(p.source, line) + ": " + what};
  };
  if (!c.present()) {
    for (size_t i = 0; i < p.stages.size(); ++i)
      if (!p.stages[i].node.empty())
        return err(p.stages[i].line, "stage[" + std::to_string(i) + "].node: names node '" +
                                         p.stages[i].node +
                                         "' but the plan has no [[node]] tables");
    for (size_t i = 0; i < p.expert_shards.size(); ++i)
      if (!p.expert_shards[i].node.empty())
        return err(p.expert_shards[i].line, "expert_shard[" + std::to_string(i) +
                                                "].node: names node '" + p.expert_shards[i].node +
                                                "' but the plan has no [[node]] tables");
    for (size_t i = 0; i < p.encoders.size(); ++i)
      if (!p.encoders[i].node.empty())
        return err(p.encoders[i].line, "encoder[" + std::to_string(i) + "].node: names node '" +
                                           p.encoders[i].node +
                                           "' but the plan has no [[node]] tables");
    return resolve_encoders(p);
  }
  for (size_t i = 0; i < c.nodes.size(); ++i)
    for (size_t j = 0; j < i; ++j) {
      if (c.nodes[i].name == c.nodes[j].name)
        return err(c.nodes[i].line, "node[" + std::to_string(i) + "]: the name '" +
                                        c.nodes[i].name + "' is taken by node[" +
                                        std::to_string(j) + "]");
      if (c.nodes[i].host == c.nodes[j].host && c.nodes[i].port == c.nodes[j].port)
        return err(c.nodes[i].line, "node[" + std::to_string(i) + "]: the address " +
                                        c.nodes[i].host + ":" + std::to_string(c.nodes[i].port) +
                                        " is taken by node[" + std::to_string(j) + "]");
    }
  if (c.head.empty()) c.head = c.nodes[0].name;
  if (node_index(p, c.head) < 0)
    return err(c.line, "cluster.head: no [[node]] is named '" + c.head + "'");
  if (const char* env = std::getenv("TROUPE_CLUSTER_TOKEN"); env && *env) {
    c.token = env;
  } else if (c.token.empty() && !c.token_file.empty()) {
    namespace fs = std::filesystem;
    fs::path f(c.token_file);
    if (f.is_relative() && !fs::path(p.source).parent_path().empty())
      f = fs::path(p.source).parent_path() / f;
    std::ifstream in(f);
    std::string tok;
    if (!in || !std::getline(in, tok) || tok.empty())
      return err(c.line, "cluster.token_file: cannot read a token from " + f.string());
    c.token = tok;
  }
  if (c.token.empty())
    return err(c.line,
               "cluster: a cluster needs a token (cluster.token, cluster.token_file or the "
               "TROUPE_CLUSTER_TOKEN environment variable)");
  const size_t num_nodes = c.nodes.size();
  for (size_t i = 0; i < p.stages.size(); ++i) {
    StagePlan& s = p.stages[i];
    if (s.node.empty()) s.node = c.nodes[i % num_nodes].name;
    if (node_index(p, s.node) < 0)
      return err(s.line,
                 "stage[" + std::to_string(i) + "].node: no [[node]] is named '" + s.node + "'");
  }
  for (size_t j = 0; j < p.expert_shards.size(); ++j) {
    ExpertShardPlan& s = p.expert_shards[j];
    if (s.node.empty()) s.node = c.nodes[(p.stages.size() + j) % num_nodes].name;
    if (node_index(p, s.node) < 0)
      return err(s.line, "expert_shard[" + std::to_string(j) + "].node: no [[node]] is named '" +
                             s.node + "'");
  }
  if (auto s = resolve_encoders(p); !s) return s;
  for (size_t i = 0; i < p.encoders.size(); ++i) {
    EncoderPlan& e = p.encoders[i];
    if (e.node.empty()) e.node = c.head;
    if (node_index(p, e.node) < 0)
      return err(e.line,
                 "encoder[" + std::to_string(i) + "].node: no [[node]] is named '" + e.node + "'");
  }
  return Ok{};
}

std::string describe_plan(const Plan& p) {
  std::ostringstream os;
  const SchedulerConfig& sc = p.scheduler;
  os << "plan " << p.source << ": model "
     << (p.model_path.empty() ? "(from the command line)" : p.model_path) << ", "
     << plural(p.num_stages, "stage") << ", " << plural(p.num_expert_shards, "expert shard")
     << ", KV blocks of " << p.kv_block_size << " tokens (" << compute::kv_type_name(p.kv_type)
     << ")\n";
  os << "scheduler: max_tokens_per_step " << sc.max_tokens_per_step << ", max_sequences "
     << sc.max_sequences << ", max_queue " << sc.max_queue << ", microbatches " << sc.microbatches
     << ", max_model_len " << sc.max_model_len << ", prefix_cache "
     << (sc.prefix_cache ? "on" : "off") << "\n";
  for (size_t i = 0; i < p.stages.size(); ++i) {
    const StagePlan& s = p.stages[i];
    os << "stage " << i << ": layers "
       << (layers_auto(s) ? "auto" : range_text(s.layer_begin, s.layer_end));
    if (s.kv_blocks == 0)
      os << ", kv_blocks auto";
    else
      os << ", kv_blocks " << s.kv_blocks << " (" << s.kv_blocks * p.kv_block_size << " tokens)";
    os << ", threads " << threads_text(s.threads);
    if (!s.on_cpu()) os << ", " << s.device << (s.data_ranks() > 1 ? " data-parallel" : "");
    if (!s.node.empty()) os << ", on " << s.node;
    os << "\n";
  }
  for (size_t i = 0; i < p.expert_shards.size(); ++i) {
    const ExpertShardPlan& s = p.expert_shards[i];
    os << "expert shard " << i << ": experts ";
    if (s.auto_experts)
      os << "auto";
    else
      os << compress_ids(s.experts) << " (" << s.experts.size() << ")";
    os << ", threads " << threads_text(s.threads);
    if (!s.node.empty()) os << ", on " << s.node;
    os << "\n";
  }
  for (size_t i = 0; i < p.encoders.size(); ++i) {
    const EncoderPlan& e = p.encoders[i];
    os << "image encoder " << i << ": threads " << threads_text(e.threads);
    if (!e.node.empty()) os << ", on " << e.node;
    os << "\n";
  }
  if (p.cluster.present()) {
    os << "cluster " << p.cluster.name << ": head "
       << (p.cluster.head.empty() ? p.cluster.nodes[0].name : p.cluster.head) << ", nodes";
    for (const NodePlan& n : p.cluster.nodes) os << " " << n.name << "@" << n.host << ":" << n.port;
    os << "\n";
  }
  return os.str();
}

int64_t StagePlan::data_ranks() const {
  return parallel == "data" ? static_cast<int64_t>(std::max<size_t>(cuda_devices(device).size(), 1))
                            : 1;
}

int64_t Plan::kv_pools() const {
  int64_t pools = 1;
  for (const StagePlan& s : stages) pools = std::max(pools, s.data_ranks());
  return pools;
}

}  // namespace troupe::actors
