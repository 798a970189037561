// Plan: reading the TOML plan (the only toml++ user in actors/) into the Plan structs, checking
// shape, types, unknown keys and the ranges that need no model; every error names the file, line
// and key path. Runs once at start, on the caller's thread; see plan.h. Resolving the auto parts
// and validating against the model is in plan.cc.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>

#include <toml++/toml.h>

#include "actors/detail/plan_internal.h"
#include "actors/plan.h"
#include "model/model.h"

namespace troupe::actors {

std::vector<int> cuda_devices(std::string_view device) {
  constexpr size_t kMaxRanks = 16;
  if (device.substr(0, 5) != "cuda:") return {};
  std::vector<int> out;
  std::string_view rest = device.substr(5);
  for (;;) {
    const size_t comma = rest.find(',');
    const std::string_view num = rest.substr(0, comma);
    if (num.empty() || num.size() > 3 || num.find_first_not_of("0123456789") != std::string::npos)
      return {};
    int v = 0;
    for (char c : num) v = v * 10 + (c - '0');
    out.push_back(v);
    if (out.size() > kMaxRanks) return {};
    if (comma == std::string_view::npos) return out;
    rest = rest.substr(comma + 1);
  }
}

using namespace detail::plan_internal;

namespace {

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
    read_int(t, path, "threads", kThreads, v, /*auto_value=*/0);
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
      check_keys(*s, "stages", {"count", "kv_block_size", "kv_type", "kv_blocks", "threads"});
      count_node = read_int(*s, "stages", "count", kStageCount, count, -1);
      read_int(*s, "stages", "kv_block_size", kBlockSize, p.kv_block_size);
      std::string kv_type(compute::kv_type_name(p.kv_type));
      read_string(*s, "stages", "kv_type", kv_type);
      if (auto t = compute::parse_kv_type(kv_type)) {
        p.kv_type = *t;
      } else {
        fail(s->get("kv_type")->source().begin.line, "stages.kv_type",
             "expected \"f32\", \"f16\" or \"bf16\", got \"" + kv_type + "\"");
      }
      read_int(*s, "stages", "kv_blocks", kKvBlocks, defaults.kv_blocks, 0);
      read_threads(*s, "stages", defaults.threads);
    }
    if (const toml::array* arr = read_table_array(root, "stage")) {
      for (size_t i = 0; i < arr->size(); ++i) {
        const toml::table& t = *(*arr)[i].as_table();
        std::string path = "stage[" + std::to_string(i) + "]";
        check_keys(t, path, {"layers", "kv_blocks", "threads", "node", "device", "parallel"});
        StagePlan sp = defaults;
        sp.line = static_cast<int>(t.source().begin.line);
        read_layers(t, path, sp);
        read_int(t, path, "kv_blocks", kKvBlocks, sp.kv_blocks, 0);
        read_threads(t, path, sp.threads);
        read_node_name(t, path, sp.node);
        read_string(t, path, "device", sp.device);
        if (sp.device != "cpu" && cuda_devices(sp.device).empty())
          fail(t.get("device")->source().begin.line, path + ".device",
               "expected \"cpu\", \"cuda:N\" (N a GPU index) or \"cuda:N,M,...\" (a "
               "tensor-parallel group of up to 16 GPUs), got \"" +
                   sp.device + "\"");
        read_string(t, path, "parallel", sp.parallel);
        if (sp.parallel != "tensor" && sp.parallel != "data")
          fail(t.get("parallel")->source().begin.line, path + ".parallel",
               "expected \"tensor\" or \"data\", got \"" + sp.parallel + "\"");
        if (sp.parallel == "data" && sp.on_cpu())
          fail(t.get("parallel")->source().begin.line, path + ".parallel",
               "\"data\" splits a stage over GPUs: give device = \"cuda:N,M,...\"");
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

  void read_encoders(const toml::table& root, Plan& p) const {
    const toml::array* arr = read_table_array(root, "encoder");
    if (arr == nullptr) return;
    for (size_t i = 0; i < arr->size(); ++i) {
      const toml::table& t = *(*arr)[i].as_table();
      std::string path = "encoder[" + std::to_string(i) + "]";
      check_keys(t, path, {"threads", "node"});
      EncoderPlan e;
      e.threads = static_cast<int>(p.vision_threads);
      e.line = static_cast<int>(t.source().begin.line);
      read_threads(t, path, e.threads);
      read_node_name(t, path, e.node);
      p.encoders.push_back(e);
    }
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
               {"model", "stages", "stage", "expert_shards", "expert_shard", "encoder", "scheduler",
                "cluster", "node"});
    if (const toml::table* m = read_table(root, "model")) {
      check_keys(*m, "model", {"path", "weights", "mmproj", "image_cache_mb", "vision_threads"});
      read_string(*m, "model", "path", p.model_path);
      read_string(*m, "model", "weights", p.weights);
      read_string(*m, "model", "mmproj", p.mmproj);
      read_int(*m, "model", "image_cache_mb", kImageCacheMb, p.image_cache_mb);
      read_int(*m, "model", "vision_threads", kThreads, p.vision_threads, /*auto_value=*/0);
      if (!model::parse_weight_storage(p.weights))
        fail(m->get("weights")->source().begin.line, "model.weights",
             "expected \"auto\", \"memory\" or \"map\", got \"" + p.weights + "\"");
    }
    read_stages(root, p);
    read_expert_shards(root, p);
    read_encoders(root, p);
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
      check_keys(
          *t, "cluster",
          {"name", "token", "token_file", "head", "heartbeat_ms", "lease_ms", "replace_wait_ms",
           "ucx_tls", "ucx_net_devices", "error_mode", "payload_checksums", "same_host_pull"});
      read_string(*t, "cluster", "name", c.name);
      read_string(*t, "cluster", "token", c.token);
      read_string(*t, "cluster", "token_file", c.token_file);
      read_string(*t, "cluster", "head", c.head);
      read_int(*t, "cluster", "heartbeat_ms", kHeartbeatMs, c.heartbeat_ms);
      read_int(*t, "cluster", "lease_ms", kLeaseMs, c.lease_ms);
      read_int(*t, "cluster", "replace_wait_ms", kReplaceWaitMs, c.replace_wait_ms);
      read_string(*t, "cluster", "ucx_tls", c.ucx_tls);
      read_string(*t, "cluster", "ucx_net_devices", c.ucx_net_devices);
      read_string(*t, "cluster", "error_mode", c.error_mode);
      read_bool(*t, "cluster", "payload_checksums", c.payload_checksums);
      read_bool(*t, "cluster", "same_host_pull", c.same_host_pull);
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
      check_keys(t, path, {"name", "address", "memory_limit_mb"});
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
      read_int(t, path, "memory_limit_mb", kMemoryLimitMb, n.memory_limit_mb);
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
    p.mmproj = anchor_model_path(p.mmproj, source_name);
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

}  // namespace troupe::actors
