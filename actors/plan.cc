// Plan: reading the TOML plan (the only toml++ user in actors/), filling its auto parts from the
// model and validating it. Runs once at start, on the caller's thread; see plan.h.
#include "actors/plan.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>

#include <toml++/toml.h>

#include "base/check.h"
#include "model/model_spec.h"

namespace troupe::actors {

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

/// Thrown inside this file only; the public functions turn it into an Error.
class PlanError : public InputError {
 public:
  PlanError(PlanErrc code, const std::string& message) : InputError(message), code_(code) {}
  PlanErrc code() const { return code_; }

 private:
  PlanErrc code_;
};

/// Inclusive limits of an integer setting; shared by the parser (which names the line) and
/// resolve_plan (which judges plans built in code).
struct Bound {
  int64_t min, max;
};
constexpr int64_t kHuge = int64_t{1} << 20;  // above this, messages say ">= min" only
constexpr Bound kStageCount{1, 4096};
constexpr Bound kShardCount{0, 4096};
constexpr Bound kThreads{1, 1024};
constexpr Bound kBlockSize{1, 4096};
constexpr Bound kKvBlocks{1, int64_t{1} << 40};
constexpr Bound kLayerIdx{0, int64_t{1} << 24};
constexpr Bound kExpertId{0, INT32_MAX};
constexpr Bound kHeartbeatMs{10, 600000};
constexpr Bound kLeaseMs{20, 3600000};

struct SchedField {
  const char* name;
  int64_t SchedulerConfig::*field;
  Bound bound;
};
constexpr SchedField kSchedFields[] = {
    {"max_tokens_per_step", &SchedulerConfig::max_tokens_per_step, {1, int64_t{1} << 24}},
    {"max_sequences", &SchedulerConfig::max_sequences, {1, kHuge}},
    {"max_queue", &SchedulerConfig::max_queue, {0, int64_t{1} << 30}},
    {"microbatches", &SchedulerConfig::microbatches, {1, 1024}},
    {"max_model_len", &SchedulerConfig::max_model_len, {1, int64_t{1} << 24}},
};

std::string where(const std::string& source, int64_t line) {
  return line > 0 ? source + ":" + std::to_string(line) : source;
}

std::string expect_text(Bound b) {
  if (b.max >= kHuge) return "an integer >= " + std::to_string(b.min);
  return "an integer in [" + std::to_string(b.min) + ", " + std::to_string(b.max) + "]";
}

std::string range_text(int64_t begin, int64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

std::string plural(int64_t n, const char* word) {
  return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}

// ------------------------------------------------------------------------------------------
// Reading TOML into the structs. Checks shape, types, unknown keys and model-free ranges.

std::string render(const toml::node& n) {
  std::ostringstream os;
  switch (n.type()) {
    case toml::node_type::string:
      os << '"' << n.as_string()->get() << '"';
      break;
    case toml::node_type::integer:
      os << n.as_integer()->get();
      break;
    case toml::node_type::floating_point:
      os << n.as_floating_point()->get();
      break;
    case toml::node_type::boolean:
      os << (n.as_boolean()->get() ? "true" : "false");
      break;
    case toml::node_type::array: {
      os << '[';
      const char* sep = "";
      for (const toml::node& e : *n.as_array()) os << std::exchange(sep, ", ") << render(e);
      os << ']';
      break;
    }
    case toml::node_type::table:
      os << "{...}";
      break;
    default:
      os << n.type();
      break;
  }
  return os.str();
}

/// "the string \"x\"", "the integer 3", "a table": what a message says it got.
std::string got_text(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string:
      return "the string " + render(n);
    case toml::node_type::integer:
      return "the integer " + render(n);
    case toml::node_type::floating_point:
      return "the floating-point number " + render(n);
    case toml::node_type::boolean:
      return "the boolean " + render(n);
    case toml::node_type::array:
      return "the array " + render(n);
    case toml::node_type::table:
      return "a table";
    default:
      return "a date or time";
  }
}

bool is_auto(const toml::node& n) { return n.is_string() && n.as_string()->get() == "auto"; }

std::string join(const std::string& path, std::string_view name) {
  return path.empty() ? std::string(name) : path + "." + std::string(name);
}

class Parser {
 public:
  explicit Parser(const std::string& source) : source_(source) {}

  [[noreturn]] void fail(int64_t line, const std::string& key, const std::string& what) const {
    throw PlanError(PlanErrc::kSchema, where(source_, line) + ": " + key + ": " + what);
  }
  [[noreturn]] void fail_type(const toml::node& n, const std::string& key,
                              const std::string& expected) const {
    fail(n.source().begin.line, key, "expected " + expected + ", got " + got_text(n));
  }

  void check_keys(const toml::table& t, const std::string& path,
                  const std::vector<std::string_view>& known) const {
    for (auto&& [k, v] : t) {
      if (std::find(known.begin(), known.end(), k.str()) != known.end()) continue;
      std::string list;
      for (std::string_view s : known) list += (list.empty() ? "" : ", ") + std::string(s);
      throw PlanError(PlanErrc::kSchema, where(source_, k.source().begin.line) + ": unknown key '" +
                                             join(path, k.str()) + "' (known here: " + list + ")");
    }
  }

  const toml::table* read_table(const toml::table& t, std::string_view name) const {
    const toml::node* n = t.get(name);
    if (n == nullptr) return nullptr;
    if (!n->is_table()) fail_type(*n, std::string(name), "a table ([" + std::string(name) + "])");
    return n->as_table();
  }

  /// [[name]] tables (or an inline array of tables); null when absent.
  const toml::array* read_table_array(const toml::table& t, std::string_view name) const {
    const toml::node* n = t.get(name);
    if (n == nullptr) return nullptr;
    std::string expected = "an array of tables ([[" + std::string(name) + "]])";
    if (!n->is_array_of_tables()) fail_type(*n, std::string(name), expected);
    return n->as_array();
  }

  /// Reads integer `name` when present, checking `b`; with `auto_value`, "auto" is accepted
  /// and stored as that value. Returns the node (for its line) or null.
  const toml::node* read_int(const toml::table& t, const std::string& path, std::string_view name,
                             Bound b, int64_t& out,
                             std::optional<int64_t> auto_value = std::nullopt) const {
    const toml::node* n = t.get(name);
    if (n == nullptr) return nullptr;
    std::string key = join(path, name);
    std::string expected = expect_text(b) + (auto_value ? " or \"auto\"" : "");
    if (auto_value && is_auto(*n)) {
      out = *auto_value;
      return n;
    }
    if (!n->is_integer()) fail_type(*n, key, expected);
    int64_t v = n->as_integer()->get();
    if (v < b.min || v > b.max) fail_type(*n, key, expected);
    out = v;
    return n;
  }

  void read_threads(const toml::table& t, const std::string& path, int& out) const {
    int64_t v = out;
    read_int(t, path, "threads", kThreads, v);
    out = static_cast<int>(v);
  }

  void read_bool(const toml::table& t, const std::string& path, std::string_view name,
                 bool& out) const {
    const toml::node* n = t.get(name);
    if (n == nullptr) return;
    if (!n->is_boolean()) fail_type(*n, join(path, name), "a boolean (true or false)");
    out = n->as_boolean()->get();
  }

  void read_string(const toml::table& t, const std::string& path, std::string_view name,
                   std::string& out) const {
    const toml::node* n = t.get(name);
    if (n == nullptr) return;
    if (!n->is_string()) fail_type(*n, join(path, name), "a string");
    out = n->as_string()->get();
  }

  /// `layers = [begin, end]` (end exclusive) or "auto".
  void read_layers(const toml::table& t, const std::string& path, StagePlan& sp) const {
    const toml::node* n = t.get("layers");
    if (n == nullptr || is_auto(*n)) return;
    std::string key = join(path, "layers");
    const char* expected = "[begin, end] as two integers >= 0 (end exclusive), or \"auto\"";
    const toml::array* a = n->as_array();
    if (a == nullptr || a->size() != 2 || !(*a)[0].is_integer() || !(*a)[1].is_integer())
      fail_type(*n, key, expected);
    int64_t begin = (*a)[0].as_integer()->get(), end = (*a)[1].as_integer()->get();
    if (begin < kLayerIdx.min || begin > kLayerIdx.max || end < kLayerIdx.min ||
        end > kLayerIdx.max)
      fail_type(*n, key, expected);
    sp.layer_begin = begin;
    sp.layer_end = end;
  }

  /// `experts = [id, ...]` or "auto".
  void read_experts(const toml::table& t, const std::string& path, ExpertShardPlan& sp) const {
    const toml::node* n = t.get("experts");
    if (n == nullptr || is_auto(*n)) return;
    std::string key = join(path, "experts");
    const toml::array* a = n->as_array();
    if (a == nullptr) fail_type(*n, key, "an array of expert ids, or \"auto\"");
    sp.experts.clear();
    for (size_t i = 0; i < a->size(); ++i) {
      const toml::node& e = (*a)[i];
      if (!e.is_integer()) fail_type(e, key + "[" + std::to_string(i) + "]", "an expert id >= 0");
      int64_t v = e.as_integer()->get();
      if (v < kExpertId.min || v > kExpertId.max)
        fail_type(e, key + "[" + std::to_string(i) + "]", "an expert id >= 0");
      sp.experts.push_back(static_cast<int32_t>(v));
    }
    sp.auto_experts = false;
  }

  void read_stages(const toml::table& root, Plan& p) const {
    int64_t count = -1;
    const toml::node* count_node = nullptr;
    StagePlan defaults;
    if (const toml::table* s = read_table(root, "stages")) {
      check_keys(*s, "stages", {"count", "kv_block_size", "kv_blocks", "threads"});
      count_node = read_int(*s, "stages", "count", kStageCount, count, -1);
      read_int(*s, "stages", "kv_block_size", kBlockSize, p.kv_block_size);
      read_int(*s, "stages", "kv_blocks", kKvBlocks, defaults.kv_blocks, 0);
      read_threads(*s, "stages", defaults.threads);
    }
    if (const toml::array* arr = read_table_array(root, "stage")) {
      for (size_t i = 0; i < arr->size(); ++i) {
        const toml::table& t = *(*arr)[i].as_table();
        std::string path = "stage[" + std::to_string(i) + "]";
        check_keys(t, path, {"layers", "kv_blocks", "threads", "node", "device"});
        StagePlan sp = defaults;
        sp.line = static_cast<int>(t.source().begin.line);
        read_layers(t, path, sp);
        read_int(t, path, "kv_blocks", kKvBlocks, sp.kv_blocks, 0);
        read_threads(t, path, sp.threads);
        read_node_name(t, path, sp.node);
        read_string(t, path, "device", sp.device);
        if (sp.device != "cpu" &&
            !(sp.device.rfind("cuda:", 0) == 0 && sp.device.size() > 5 && sp.device.size() <= 8 &&
              sp.device.find_first_not_of("0123456789", 5) == std::string::npos))
          fail(t.get("device")->source().begin.line, path + ".device",
               "expected \"cpu\" or \"cuda:N\" (N a GPU index), got \"" + sp.device + "\"");
        p.stages.push_back(sp);
      }
    }
    int64_t tables = static_cast<int64_t>(p.stages.size());
    if (count >= 0 && tables > 0 && count != tables)
      fail(count_node->source().begin.line, "stages.count",
           "says " + std::to_string(count) + " but the file has " +
               plural(tables, "[[stage]] table"));
    p.num_stages = count >= 0 ? count : std::max<int64_t>(tables, 1);
    p.stages.resize(static_cast<size_t>(p.num_stages), defaults);
  }

  void read_expert_shards(const toml::table& root, Plan& p) const {
    int64_t count = -1;
    const toml::node* count_node = nullptr;
    ExpertShardPlan defaults;
    if (const toml::table* s = read_table(root, "expert_shards")) {
      check_keys(*s, "expert_shards", {"count", "threads"});
      count_node = read_int(*s, "expert_shards", "count", kShardCount, count, -1);
      read_threads(*s, "expert_shards", defaults.threads);
    }
    if (const toml::array* arr = read_table_array(root, "expert_shard")) {
      for (size_t i = 0; i < arr->size(); ++i) {
        const toml::table& t = *(*arr)[i].as_table();
        std::string path = "expert_shard[" + std::to_string(i) + "]";
        check_keys(t, path, {"experts", "threads", "node"});
        ExpertShardPlan sp = defaults;
        sp.line = static_cast<int>(t.source().begin.line);
        read_experts(t, path, sp);
        read_threads(t, path, sp.threads);
        read_node_name(t, path, sp.node);
        p.expert_shards.push_back(sp);
      }
    }
    int64_t tables = static_cast<int64_t>(p.expert_shards.size());
    if (count >= 0 && tables > 0 && count != tables)
      fail(count_node->source().begin.line, "expert_shards.count",
           "says " + std::to_string(count) + " but the file has " +
               plural(tables, "[[expert_shard]] table"));
    p.num_expert_shards = count >= 0 ? count : tables;
    p.expert_shards.resize(static_cast<size_t>(p.num_expert_shards), defaults);
  }

  void read_scheduler(const toml::table& root, SchedulerConfig& sc) const {
    const toml::table* s = read_table(root, "scheduler");
    if (s == nullptr) return;
    std::vector<std::string_view> known;
    for (const SchedField& f : kSchedFields) known.push_back(f.name);
    known.push_back("prefix_cache");
    check_keys(*s, "scheduler", known);
    for (const SchedField& f : kSchedFields)
      read_int(*s, "scheduler", f.name, f.bound, sc.*f.field);
    read_bool(*s, "scheduler", "prefix_cache", sc.prefix_cache);
  }

  Plan read_plan(const toml::table& root) const {
    Plan p;
    p.source = source_;
    check_keys(root, "",
               {"model", "stages", "stage", "expert_shards", "expert_shard", "scheduler", "cluster",
                "node"});
    if (const toml::table* m = read_table(root, "model")) {
      check_keys(*m, "model", {"path", "weights"});
      read_string(*m, "model", "path", p.model_path);
      read_string(*m, "model", "weights", p.weights);
      if (p.weights != "map" && p.weights != "memory")
        fail(m->get("weights")->source().begin.line, "model.weights",
             "expected \"map\" or \"memory\", got \"" + p.weights + "\"");
    }
    read_stages(root, p);
    read_expert_shards(root, p);
    read_scheduler(root, p.scheduler);
    read_cluster(root, p.cluster);
    return p;
  }

  /// A stage's or shard's `node`: a node name, or "auto" (stored as "").
  void read_node_name(const toml::table& t, const std::string& path, std::string& out) const {
    read_string(t, path, "node", out);
    if (out == "auto") out.clear();
  }

  void read_cluster(const toml::table& root, ClusterPlan& c) const {
    if (const toml::table* t = read_table(root, "cluster")) {
      c.line = static_cast<int>(t->source().begin.line);
      check_keys(*t, "cluster",
                 {"name", "token", "token_file", "head", "heartbeat_ms", "lease_ms", "ucx_tls",
                  "ucx_net_devices", "error_mode"});
      read_string(*t, "cluster", "name", c.name);
      read_string(*t, "cluster", "token", c.token);
      read_string(*t, "cluster", "token_file", c.token_file);
      read_string(*t, "cluster", "head", c.head);
      read_int(*t, "cluster", "heartbeat_ms", kHeartbeatMs, c.heartbeat_ms);
      read_int(*t, "cluster", "lease_ms", kLeaseMs, c.lease_ms);
      read_string(*t, "cluster", "ucx_tls", c.ucx_tls);
      read_string(*t, "cluster", "ucx_net_devices", c.ucx_net_devices);
      read_string(*t, "cluster", "error_mode", c.error_mode);
      if (c.error_mode != "auto" && c.error_mode != "peer" && c.error_mode != "none")
        fail(t->get("error_mode")->source().begin.line, "cluster.error_mode",
             "expected \"auto\", \"peer\" or \"none\", got \"" + c.error_mode + "\"");
      if (c.lease_ms < 2 * c.heartbeat_ms)
        fail(c.line, "cluster.lease_ms",
             "must be at least twice heartbeat_ms (" + std::to_string(c.heartbeat_ms) +
                 " ms), got " + std::to_string(c.lease_ms) + " ms");
    }
    const toml::array* arr = read_table_array(root, "node");
    if (arr == nullptr) return;
    for (size_t i = 0; i < arr->size(); ++i) {
      const toml::table& t = *(*arr)[i].as_table();
      std::string path = "node[" + std::to_string(i) + "]";
      check_keys(t, path, {"name", "address"});
      NodePlan n;
      n.line = static_cast<int>(t.source().begin.line);
      read_string(t, path, "name", n.name);
      if (n.name.empty()) fail(n.line, path + ".name", "every node needs a non-empty name");
      std::string address;
      read_string(t, path, "address", address);
      const size_t colon = address.rfind(':');
      char* end = nullptr;
      const long port =
          colon == std::string::npos ? 0 : std::strtol(address.c_str() + colon + 1, &end, 10);
      if (colon == std::string::npos || colon == 0 || !end || *end != '\0' || port < 1 ||
          port > 65535)
        fail(n.line, path + ".address",
             "expected \"host:port\" with a port in 1..65535, got \"" + address + "\"");
      n.host = address.substr(0, colon);
      n.port = port;
      c.nodes.push_back(n);
    }
  }

 private:
  const std::string& source_;
};

/// A relative model path is relative to the plan file's directory.
std::string anchor_model_path(const std::string& model_path, const std::string& source) {
  namespace fs = std::filesystem;
  fs::path m(model_path);
  if (model_path.empty() || m.is_absolute()) return model_path;
  fs::path dir = fs::path(source).parent_path();
  if (dir.empty()) return model_path;
  return (dir / m).lexically_normal().string();
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
    check_bound(p, key + ".threads", kThreads, p.stages[i].threads);
    if (p.stages[i].kv_blocks != 0)
      check_bound(p, key + ".kv_blocks", kKvBlocks, p.stages[i].kv_blocks);
  }
  for (size_t i = 0; i < p.expert_shards.size(); ++i)
    check_bound(p, "expert_shard[" + std::to_string(i) + "].threads", kThreads,
                p.expert_shards[i].threads);
}

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
  for (size_t i = 0; i < p.stages.size(); ++i) {
    StagePlan& s = p.stages[i];
    if (s.kv_blocks == 0) s.kv_blocks = sc.max_sequences * per_seq;
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
  resolve_layers(p, spec.n_layer);
  resolve_experts(p, spec);
  resolve_kv(p);
}

Error to_error(const PlanError& e) { return make_error(static_cast<int>(e.code()), e.what()); }

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

Result<Plan> parse_plan_string(std::string_view toml_text, const std::string& source_name) {
  try {
    toml::table root;
    try {
      root = toml::parse(toml_text, source_name);
    } catch (const toml::parse_error& e) {
      const toml::source_position& at = e.source().begin;
      return make_error(static_cast<int>(PlanErrc::kSyntax),
                        source_name + ":" + std::to_string(at.line) + ":" +
                            std::to_string(at.column) +
                            ": not valid TOML: " + std::string(e.description()));
    }
    Plan p = Parser(source_name).read_plan(root);
    p.model_path = anchor_model_path(p.model_path, source_name);
    return p;
  } catch (const PlanError& e) {
    return to_error(e);
  } catch (const std::exception& e) {
    return make_error(static_cast<int>(PlanErrc::kSchema), source_name + ": " + e.what());
  }
}

Result<Plan> parse_plan_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return make_error(static_cast<int>(PlanErrc::kIo),
                      path + ": cannot read the plan file: it is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return make_error(static_cast<int>(PlanErrc::kIo),
                      path + ": cannot open the plan file: " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad())
    return make_error(static_cast<int>(PlanErrc::kIo), path + ": cannot read the plan file");
  return parse_plan_string(text.str(), path);
}

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
      if (plan.stages[i].device != "cpu" && !plan.expert_shards.empty())
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
    return Ok{};
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
  return Ok{};
}

std::string describe_plan(const Plan& p) {
  std::ostringstream os;
  const SchedulerConfig& sc = p.scheduler;
  os << "plan " << p.source << ": model "
     << (p.model_path.empty() ? "(from the command line)" : p.model_path) << ", "
     << plural(p.num_stages, "stage") << ", " << plural(p.num_expert_shards, "expert shard")
     << ", KV blocks of " << p.kv_block_size << " tokens\n";
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
    os << ", threads " << s.threads;
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
    os << ", threads " << s.threads;
    if (!s.node.empty()) os << ", on " << s.node;
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

}  // namespace troupe::actors
