// Tests of actors/plan.h: reading plan TOML, filling auto parts from a model, and one test per
// way a plan can be bad, each asserting the message text (file, line, parts at fault).
#include "actors/plan.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compute/thread_pool.h"
#include "model/model.h"
#include "model/model_spec.h"
#include "tests/test_support.h"

namespace troupe::actors {
namespace {

// gmock is not linked into the test binaries; these stand in for its string matchers.
#define EXPECT_STARTS_WITH(text, prefix) \
  EXPECT_TRUE(std::string(text).starts_with(prefix)) << "text: " << (text)
#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "text: " << (text)
#define EXPECT_ENDS_WITH(text, suffix) \
  EXPECT_TRUE(std::string(text).ends_with(suffix)) << "text: " << (text)

/// A model description with only what a plan looks at; no weights.
model::ModelSpec make_spec(int64_t n_layer, int64_t n_expert, int64_t n_ctx_train = 4096) {
  model::ModelSpec spec;
  spec.n_layer = n_layer;
  spec.layers.resize(static_cast<size_t>(n_layer));
  for (model::LayerSpec& l : spec.layers) l.is_moe = n_expert > 0;
  spec.n_expert = n_expert;
  spec.n_expert_used = n_expert > 0 ? 2 : 0;
  spec.n_ctx_train = n_ctx_train;
  return spec;
}

std::string conf_dir() {
  // tests/actors/plan_test.cc -> the checkout root.
  return (std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "conf")
      .string();
}

Plan parse_ok(std::string_view text, const std::string& source = "plan.toml") {
  Result<Plan> r = parse_plan_string(text, source);
  EXPECT_TRUE(r.has_value()) << r.error().message;
  return r.has_value() ? *r : Plan{};
}

/// The parse error's message ("" and a test failure when it parsed).
std::string parse_error(std::string_view text, PlanErrc code = PlanErrc::kSchema) {
  Result<Plan> r = parse_plan_string(text, "plan.toml");
  EXPECT_FALSE(r.has_value()) << "parsed, but should not have";
  if (r.has_value()) return "";
  EXPECT_EQ(r.error().code, static_cast<int>(code)) << r.error().message;
  return r.error().message;
}

/// The message of resolve_plan's error on a plan that parses.
std::string resolve_error(Plan plan, const model::ModelSpec& spec,
                          PlanErrc code = PlanErrc::kInvalid) {
  Status s = resolve_plan(plan, spec);
  EXPECT_FALSE(s.has_value()) << "resolved, but should not have:\n" << describe_plan(plan);
  if (s.has_value()) return "";
  EXPECT_EQ(s.error().code, static_cast<int>(code)) << s.error().message;
  return s.error().message;
}
std::string resolve_error(std::string_view text, const model::ModelSpec& spec,
                          PlanErrc code = PlanErrc::kInvalid) {
  return resolve_error(parse_ok(text), spec, code);
}

Plan resolve_ok(Plan plan, const model::ModelSpec& spec) {
  Status s = resolve_plan(plan, spec);
  EXPECT_TRUE(s.has_value()) << s.error().message;
  return plan;
}
Plan resolve_ok(std::string_view text, const model::ModelSpec& spec) {
  return resolve_ok(parse_ok(text), spec);
}

using Ranges = std::vector<std::pair<int64_t, int64_t>>;
Ranges layer_ranges(const Plan& p) {
  Ranges out;
  for (const StagePlan& s : p.stages) out.emplace_back(s.layer_begin, s.layer_end);
  return out;
}
std::vector<std::vector<int32_t>> expert_sets(const Plan& p) {
  std::vector<std::vector<int32_t>> out;
  for (const ExpertShardPlan& s : p.expert_shards) out.push_back(s.experts);
  return out;
}

// --- the files in conf/ ---------------------------------------------------------------------

TEST(PlanConf, ExampleParsesAndResolves) {
  Result<Plan> r = parse_plan_file(conf_dir() + "/plan-example.toml");
  ASSERT_TRUE(r.has_value()) << r.error().message;
  Plan p = resolve_ok(*r, make_spec(4, 8, 2048));
  EXPECT_EQ(layer_ranges(p), (Ranges{{0, 2}, {2, 4}}));
  EXPECT_EQ(expert_sets(p), (std::vector<std::vector<int32_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(p.stages[0].kv_blocks, 512);
  EXPECT_EQ(p.stages[1].kv_blocks, 8 * 16);  // auto: 8 sequences of 256 tokens, 16-token blocks
  EXPECT_EQ(p.scheduler.max_sequences, 8);
  EXPECT_EQ(p.scheduler.max_model_len, 256);
  EXPECT_TRUE(p.scheduler.prefix_cache);
}

TEST(PlanConf, TwoStageMoeParsesAndResolves) {
  Result<Plan> r = parse_plan_file(conf_dir() + "/plan-2stage-moe.toml");
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->num_stages, 2);
  EXPECT_EQ(r->num_expert_shards, 2);
  Plan p = resolve_ok(*r, make_spec(4, 8, 2048));
  EXPECT_EQ(layer_ranges(p), (Ranges{{0, 2}, {2, 4}}));
  EXPECT_EQ(expert_sets(p), (std::vector<std::vector<int32_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(p.stages[0].kv_blocks, 1024);
  EXPECT_EQ(p.stages[1].kv_blocks, 1024);
  EXPECT_EQ(p.scheduler.max_tokens_per_step, 256);
  EXPECT_EQ(p.scheduler.max_queue, 256);  // default
}

TEST(PlanConf, AutoParsesAndResolves) {
  Result<Plan> r = parse_plan_file(conf_dir() + "/plan-auto.toml");
  ASSERT_TRUE(r.has_value()) << r.error().message;
  Plan p = resolve_ok(*r, make_spec(4, 8, 2048));
  EXPECT_EQ(layer_ranges(p), (Ranges{{0, 2}, {2, 4}}));
  EXPECT_EQ(expert_sets(p), (std::vector<std::vector<int32_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(p.stages[0].kv_blocks, 64 * 128);  // defaults: 64 sequences of 2048 tokens
}

TEST(PlanConf, VisionClusterExamplePlacesItsEncoders) {
  Result<Plan> r = parse_plan_file(conf_dir() + "/cluster-vision-example.toml");
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_ENDS_WITH(r->mmproj, "shared/models/synth/llava-tiny/mmproj.gguf");
  ASSERT_TRUE(resolve_placement(*r).has_value());
  ASSERT_EQ(r->encoders.size(), 2u);
  EXPECT_EQ(r->encoders[0].node, "node-c");
  EXPECT_EQ(r->encoders[0].threads, 0);  // auto
  EXPECT_EQ(r->encoders[1].node, "node-b");
  EXPECT_EQ(r->encoders[1].threads, 1);
  TROUPE_SHARED_OR_SKIP(dir);
  auto m = model::load_model(r->model_path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  Plan p = resolve_ok(*r, (*m)->spec);
  EXPECT_EQ(p.stages[0].node, "node-a");
  EXPECT_EQ(p.stages[1].node, "node-b");
}

TEST(PlanConf, ModelPathIsRelativeToTheConfDirectory) {
  namespace fs = std::filesystem;
  for (const char* name : {"plan-example.toml", "plan-2stage-moe.toml", "plan-auto.toml"}) {
    Result<Plan> r = parse_plan_file(conf_dir() + "/" + name);
    ASSERT_TRUE(r.has_value()) << r.error().message;
    EXPECT_ENDS_WITH(r->model_path, "shared/models/synth/mixtral-moe/model.gguf");
    EXPECT_EQ(r->model_path, fs::path(r->model_path).lexically_normal().string());
    std::string dir = testing::shared_dir();
    std::string shared_model = dir + "/models/synth/mixtral-moe/model.gguf";
    if (!dir.empty() && fs::exists(shared_model) && fs::exists(r->model_path)) {
      EXPECT_TRUE(fs::equivalent(r->model_path, shared_model)) << r->model_path;
    }
  }
}

TEST(PlanConf, ResolvesAgainstTheSyntheticMixtral) {
  TROUPE_SHARED_OR_SKIP(dir);
  auto m = model::load_model(dir + "/models/synth/mixtral-moe/model.gguf");
  ASSERT_TRUE(m.has_value()) << m.error().message;
  for (const char* name : {"plan-example.toml", "plan-2stage-moe.toml", "plan-auto.toml"}) {
    Result<Plan> r = parse_plan_file(conf_dir() + "/" + name);
    ASSERT_TRUE(r.has_value()) << r.error().message;
    Plan p = resolve_ok(*r, (*m)->spec);
    EXPECT_EQ(p.stages.back().layer_end, (*m)->spec.n_layer) << name;
  }
  // A GPU stage computes its experts itself: expert shards beside it are refused.
  Result<Plan> r = parse_plan_file(conf_dir() + "/plan-2stage-moe.toml");
  ASSERT_TRUE(r.has_value());
  r->stages[1].device = "cuda:0";
  const std::string e = resolve_error(*r, (*m)->spec);
  EXPECT_NE(e.find("stage[1] runs on cuda:0"), std::string::npos) << e;
  EXPECT_NE(e.find("expert shards with GPU stages are not supported yet"), std::string::npos) << e;
}

// --- reading ---------------------------------------------------------------------------------

TEST(PlanParse, EmptyFileIsOneAutoStageAndDefaults) {
  Plan p = parse_ok("");
  EXPECT_EQ(p.source, "plan.toml");
  EXPECT_EQ(p.model_path, "");
  EXPECT_EQ(p.num_stages, 1);
  ASSERT_EQ(p.stages.size(), 1u);
  EXPECT_EQ(p.stages[0].layer_begin, -1);
  EXPECT_EQ(p.stages[0].kv_blocks, 0);
  EXPECT_EQ(p.num_expert_shards, 0);
  EXPECT_EQ(p.kv_block_size, 16);
  EXPECT_EQ(p.scheduler.max_tokens_per_step, 512);
  EXPECT_EQ(p.scheduler.microbatches, 2);
}

TEST(PlanParse, KvTypeIsReadCheckedAndShown) {
  EXPECT_EQ(parse_ok("").kv_type, compute::KvType::kF32);
  for (const char* t : {"f32", "f16", "bf16"}) {
    Plan p = parse_ok(std::string("[stages]\nkv_type = \"") + t + "\"\n");
    EXPECT_EQ(compute::kv_type_name(p.kv_type), t);
    EXPECT_NE(describe_plan(p).find(std::string("tokens (") + t + ")"), std::string::npos)
        << describe_plan(p);
  }
  const std::string e = parse_error("[stages]\ncount = 2\nkv_type = \"fp8\"\n");
  EXPECT_NE(e.find("plan.toml:3"), std::string::npos) << e;
  EXPECT_NE(e.find("stages.kv_type"), std::string::npos) << e;
  EXPECT_NE(e.find("expected \"f32\", \"f16\" or \"bf16\", got \"fp8\""), std::string::npos) << e;
  EXPECT_NE(parse_error("[stages]\nkv_type = 16\n").find("stages.kv_type"), std::string::npos);
}

TEST(PlanParse, StageTablesSetTheCountAndInheritDefaults) {
  Plan p = parse_ok(R"([stages]
kv_blocks = 300
threads = 3
[[stage]]
layers = [0, 1]
[[stage]]
layers = "auto"
kv_blocks = "auto"
threads = 2
)");
  ASSERT_EQ(p.num_stages, 2);
  EXPECT_EQ(p.stages[0].kv_blocks, 300);
  EXPECT_EQ(p.stages[0].threads, 3);
  EXPECT_EQ(p.stages[0].line, 4);
  EXPECT_EQ(p.stages[1].layer_begin, -1);
  EXPECT_EQ(p.stages[1].kv_blocks, 0);
  EXPECT_EQ(p.stages[1].threads, 2);
}

TEST(PlanParse, ThreadsAutoIsZeroAndShownAsAuto) {
  Plan p = parse_ok(R"([stages]
threads = "auto"
[[stage]]
layers = [0, 1]
[[stage]]
layers = [1, 2]
threads = 2
[expert_shards]
count = 1
threads = "auto"
)");
  ASSERT_EQ(p.stages.size(), 2u);
  EXPECT_EQ(p.stages[0].threads, 0);
  EXPECT_EQ(p.stages[1].threads, 2);
  const std::string d = describe_plan(p);
  EXPECT_NE(d.find("stage 0: layers [0, 1), kv_blocks auto, threads auto"), std::string::npos) << d;
  EXPECT_NE(d.find("stage 1: layers [1, 2), kv_blocks auto, threads 2"), std::string::npos) << d;
  EXPECT_EQ(parse_error("[stages]\nthreads = \"all\"\n"),
            "plan.toml:2: stages.threads: expected an integer in [1, 1024] or \"auto\", got the "
            "string \"all\"");
  // The rule that resolves it, per process (LocalCluster) or per node (node daemons).
  EXPECT_EQ(compute::resolve_threads(3, 4), 3);
  EXPECT_EQ(compute::resolve_threads(0, 1), compute::available_cpus());
  EXPECT_EQ(compute::resolve_threads(0, 1024), 1);
}

TEST(PlanParse, ModelPathAnchoredAtTheFileDirectory) {
  EXPECT_EQ(parse_ok("model.path = \"../m.gguf\"", "a/b/plan.toml").model_path, "a/m.gguf");
  EXPECT_EQ(parse_ok("model.path = \"/abs/m.gguf\"", "a/b/plan.toml").model_path, "/abs/m.gguf");
  EXPECT_EQ(parse_ok("model.path = \"m.gguf\"", "plan.toml").model_path, "m.gguf");
}

TEST(PlanParse, RejectsUnknownTopLevelKey) {
  EXPECT_EQ(parse_error("[model]\npath = \"m.gguf\"\n\n[schedular]\nmax_queue = 3\n"),
            "plan.toml:4: unknown key 'schedular' (known here: model, stages, stage, "
            "expert_shards, expert_shard, encoder, scheduler, cluster, node)");
}

TEST(PlanParse, RejectsUnknownKeyInStageWithLineAndPath) {
  EXPECT_EQ(parse_error("[[stage]]\nlayers = [0, 2]\n[[stage]]\nlaeyrs = [2, 4]\n"),
            "plan.toml:4: unknown key 'stage[1].laeyrs' (known here: layers, kv_blocks, threads, "
            "node, device, parallel)");
}

TEST(PlanParse, RejectsUnknownSchedulerKey) {
  std::string msg = parse_error("[scheduler]\nmax_seqs = 3\n");
  EXPECT_STARTS_WITH(msg, ("plan.toml:2: unknown key 'scheduler.max_seqs' (known here: "
                           "max_tokens_per_step, max_sequences,"));
}

TEST(PlanParse, RejectsWrongType) {
  EXPECT_EQ(parse_error("[scheduler]\nmax_sequences = \"64\"\n"),
            "plan.toml:2: scheduler.max_sequences: expected an integer >= 1, got the string "
            "\"64\"");
  EXPECT_EQ(parse_error("[scheduler]\nprefix_cache = 1\n"),
            "plan.toml:2: scheduler.prefix_cache: expected a boolean (true or false), got the "
            "integer 1");
  EXPECT_EQ(parse_error("[model]\npath = 3\n"),
            "plan.toml:2: model.path: expected a string, got the integer 3");
}

TEST(PlanParse, RejectsAutoWhereNotAccepted) {
  EXPECT_EQ(parse_error("[scheduler]\nmicrobatches = \"auto\"\n"),
            "plan.toml:2: scheduler.microbatches: expected an integer in [1, 1024], got the "
            "string \"auto\"");
}

TEST(PlanParse, RejectsMisspeltAuto) {
  EXPECT_EQ(parse_error("[[stage]]\nkv_blocks = \"aut\"\n"),
            "plan.toml:2: stage[0].kv_blocks: expected an integer >= 1 or \"auto\", got the "
            "string \"aut\"");
}

TEST(PlanParse, RejectsValueOutOfRange) {
  EXPECT_EQ(parse_error("[scheduler]\nmax_tokens_per_step = 0\n"),
            "plan.toml:2: scheduler.max_tokens_per_step: expected an integer >= 1, got the "
            "integer 0");
  EXPECT_EQ(parse_error("[stages]\nthreads = 0\n"),
            "plan.toml:2: stages.threads: expected an integer in [1, 1024] or \"auto\", got the "
            "integer 0");
}

TEST(PlanParse, RejectsBadLayersShape) {
  const char* expected =
      "stage[0].layers: expected [begin, end] as two integers >= 0 (end exclusive), or "
      "\"auto\", got ";
  EXPECT_EQ(parse_error("[[stage]]\nlayers = [0, 1, 2]\n"),
            std::string("plan.toml:2: ") + expected + "the array [0, 1, 2]");
  EXPECT_EQ(parse_error("[[stage]]\nlayers = [-1, 2]\n"),
            std::string("plan.toml:2: ") + expected + "the array [-1, 2]");
  EXPECT_EQ(parse_error("[[stage]]\nlayers = 3\n"),
            std::string("plan.toml:2: ") + expected + "the integer 3");
}

TEST(PlanParse, RejectsBadExpertId) {
  EXPECT_EQ(parse_error("[[expert_shard]]\nexperts = [0, \"1\"]\n"),
            "plan.toml:2: expert_shard[0].experts[1]: expected an expert id >= 0, got the "
            "string \"1\"");
  EXPECT_EQ(parse_error("[[expert_shard]]\nexperts = [0, -3]\n"),
            "plan.toml:2: expert_shard[0].experts[1]: expected an expert id >= 0, got the "
            "integer -3");
}

TEST(PlanParse, RejectsStageWrittenAsPlainTable) {
  EXPECT_EQ(parse_error("[stage]\nlayers = [0, 2]\n"),
            "plan.toml:1: stage: expected an array of tables ([[stage]]), got a table");
}

TEST(PlanParse, RejectsCountDisagreeingWithTables) {
  EXPECT_EQ(parse_error("[stages]\ncount = 3\n[[stage]]\n[[stage]]\n"),
            "plan.toml:2: stages.count: says 3 but the file has 2 [[stage]] tables");
  EXPECT_EQ(parse_error("[expert_shards]\ncount = 2\n[[expert_shard]]\n"),
            "plan.toml:2: expert_shards.count: says 2 but the file has 1 [[expert_shard]] table");
}

TEST(PlanParse, RejectsMalformedTomlWithLine) {
  std::string msg =
      parse_error("[scheduler]\nmax_sequences = 4\nmax_queue = = 5\n", PlanErrc::kSyntax);
  EXPECT_STARTS_WITH(msg, ("plan.toml:3:"));
  EXPECT_CONTAINS(msg, "not valid TOML: ");
}

TEST(PlanParse, RejectsDuplicateKeyAsSyntaxError) {
  std::string msg = parse_error("[scheduler]\nmax_queue = 4\nmax_queue = 5\n", PlanErrc::kSyntax);
  EXPECT_STARTS_WITH(msg, "plan.toml:3:");
}

TEST(PlanParse, MissingFileIsAnIoError) {
  Result<Plan> r = parse_plan_file("/nonexistent/plan.toml");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, static_cast<int>(PlanErrc::kIo));
  EXPECT_EQ(r.error().message,
            "/nonexistent/plan.toml: cannot open the plan file: No such file or directory");
}

TEST(PlanParse, DirectoryIsAnIoError) {
  Result<Plan> r = parse_plan_file(conf_dir());
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, static_cast<int>(PlanErrc::kIo)) << r.error().message;
  EXPECT_STARTS_WITH(r.error().message, conf_dir() + ": cannot read the plan file");
}

TEST(PlanParse, AcceptsInlineStageTables) {
  Plan p = parse_ok("stage = [{ layers = [0, 2] }, { layers = \"auto\", threads = 4 }]\n");
  ASSERT_EQ(p.num_stages, 2);
  EXPECT_EQ(p.stages[0].layer_end, 2);
  EXPECT_EQ(p.stages[1].threads, 4);
}

TEST(PlanReject, ExplicitStagesOverlappingAcrossAnAutoStage) {
  EXPECT_EQ(resolve_error("[[stage]]\nlayers = [0, 3]\n[[stage]]\n[[stage]]\nlayers = [2, 5]\n",
                          make_spec(5, 0)),
            "plan.toml:4: stages 0 [0, 3) and 2 [2, 5) overlap on layers [2, 3)");
}

// --- auto splits -----------------------------------------------------------------------------

TEST(PlanResolve, SplitsFiveLayersOverTwoStagesEarlierStageTakesTheExtra) {
  Plan p = resolve_ok("stages.count = 2\n", make_spec(5, 0));
  EXPECT_EQ(layer_ranges(p), (Ranges{{0, 3}, {3, 5}}));
}

TEST(PlanResolve, AutoStagesFillTheLayersBetweenExplicitOnes) {
  Plan p = resolve_ok(R"([[stage]]
[[stage]]
layers = [3, 5]
[[stage]]
[[stage]]
)",
                      make_spec(10, 0));
  EXPECT_EQ(layer_ranges(p), (Ranges{{0, 3}, {3, 5}, {5, 8}, {8, 10}}));
}

// GLM-5.2's layers that reuse an earlier indexer's choice must share a stage with it: auto
// boundaries move to the nearest layers with their own indexer (here 0, 1, 2, 6, 10 of 12),
// leaving enough for the boundaries after; explicit ones that fall on a shared layer, or more
// stages than such layers, are refused naming the layers.
TEST(PlanResolve, StagesStartAtLayersWithTheirOwnIndexer) {
  model::ModelSpec spec = make_spec(12, 0);
  for (int64_t il = 2; il < 12; ++il)
    spec.layers[static_cast<size_t>(il)].idx_shared = (il - 2) % 4 != 0;
  EXPECT_EQ(layer_ranges(resolve_ok("stages.count = 2\n", spec)), (Ranges{{0, 6}, {6, 12}}));
  EXPECT_EQ(layer_ranges(resolve_ok("stages.count = 3\n", spec)),
            (Ranges{{0, 2}, {2, 6}, {6, 12}}));
  EXPECT_EQ(layer_ranges(resolve_ok("stages.count = 5\n", spec)),
            (Ranges{{0, 1}, {1, 2}, {2, 6}, {6, 10}, {10, 12}}));
  EXPECT_CONTAINS(resolve_error("stages.count = 6\n", spec),
                  "stage 2 starts at layer 4, which has no indexer of its own and reuses the "
                  "positions layer 2 chose");
  EXPECT_CONTAINS(resolve_error(R"([[stage]]
layers = [0, 4]
[[stage]]
layers = [4, 12]
)",
                                spec),
                  "stage 1 starts at layer 4, which has no indexer of its own and reuses the "
                  "positions layer 2 chose");
  // Without shared layers the split is the plain one.
  EXPECT_EQ(layer_ranges(resolve_ok("stages.count = 3\n", make_spec(12, 0))),
            (Ranges{{0, 4}, {4, 8}, {8, 12}}));
}

TEST(PlanResolve, SplitsEightExpertsOverThreeShardsContiguously) {
  Plan p = resolve_ok("expert_shards.count = 3\n", make_spec(2, 8));
  EXPECT_EQ(expert_sets(p), (std::vector<std::vector<int32_t>>{{0, 1, 2}, {3, 4, 5}, {6, 7}}));
  for (const ExpertShardPlan& s : p.expert_shards) EXPECT_FALSE(s.auto_experts);
}

TEST(PlanResolve, AutoShardsSplitTheExpertsExplicitShardsLeave) {
  Plan p = resolve_ok(R"([[expert_shard]]
experts = [7, 2, 3]
[[expert_shard]]
[[expert_shard]]
)",
                      make_spec(2, 8));
  EXPECT_EQ(expert_sets(p), (std::vector<std::vector<int32_t>>{{2, 3, 7}, {0, 1, 4}, {5, 6}}));
}

TEST(PlanResolve, AutoKvHoldsMaxSequencesFullLengthSequences) {
  Plan p = resolve_ok("[scheduler]\nmax_sequences = 8\nmax_model_len = 100\n", make_spec(2, 0));
  EXPECT_EQ(p.stages[0].kv_blocks, 8 * 7);  // ceil(100 / 16) = 7 blocks a sequence
}

TEST(PlanResolve, KvPoolOfExactlyOneSequenceIsEnough) {
  Plan p =
      resolve_ok("[scheduler]\nmax_model_len = 64\n[[stage]]\nkv_blocks = 4\n", make_spec(2, 0));
  EXPECT_EQ(p.stages[0].kv_blocks, 4);
}

TEST(PlanResolve, IsIdempotent) {
  Plan once = resolve_ok("stages.count = 3\nexpert_shards.count = 3\n", make_spec(7, 8));
  Plan twice = resolve_ok(once, make_spec(7, 8));
  EXPECT_EQ(layer_ranges(once), layer_ranges(twice));
  EXPECT_EQ(expert_sets(once), expert_sets(twice));
  EXPECT_EQ(once.stages[2].kv_blocks, twice.stages[2].kv_blocks);
}

TEST(PlanResolve, MoeModelWithoutShardsKeepsExpertsInTheStages) {
  Plan p = resolve_ok("stages.count = 2\n", make_spec(4, 8));
  EXPECT_TRUE(p.expert_shards.empty());
}

TEST(EvenPlan, SplitsLayersAndExperts) {
  Plan p = resolve_ok(even_plan("m.gguf", 3, 2), make_spec(8, 6));
  EXPECT_EQ(p.model_path, "m.gguf");
  EXPECT_EQ(p.source, "--stages 3 --expert-shards 2");
  EXPECT_EQ(layer_ranges(p), (Ranges{{0, 3}, {3, 6}, {6, 8}}));
  EXPECT_EQ(expert_sets(p), (std::vector<std::vector<int32_t>>{{0, 1, 2}, {3, 4, 5}}));
  EXPECT_EQ(p.stages[0].kv_blocks, 64 * 128);
}

TEST(EvenPlan, RejectsZeroStages) {
  EXPECT_EQ(resolve_error(even_plan("m.gguf", 0, 0), make_spec(4, 0), PlanErrc::kSchema),
            "--stages 0 --expert-shards 0: stages.count: expected an integer in [1, 4096], got 0");
}

TEST(EvenPlan, RejectsMoreStagesThanLayers) {
  EXPECT_EQ(resolve_error(even_plan("m.gguf", 5, 0), make_spec(4, 0)),
            "--stages 5 --expert-shards 0: 5 stages for a model of 4 layers: each stage needs "
            "at least one layer");
}

TEST(PlanDescribe, OneLinePerStageAndShard) {
  Plan p = resolve_ok(even_plan("m.gguf", 2, 3), make_spec(5, 8));
  EXPECT_EQ(describe_plan(p),
            "plan --stages 2 --expert-shards 3: model m.gguf, 2 stages, 3 expert shards, KV "
            "blocks of 16 tokens (f32)\n"
            "scheduler: max_tokens_per_step 512, max_sequences 64, max_queue 256, microbatches "
            "2, max_model_len 2048, prefix_cache on\n"
            "stage 0: layers [0, 3), kv_blocks 8192 (131072 tokens), threads 1\n"
            "stage 1: layers [3, 5), kv_blocks 8192 (131072 tokens), threads 1\n"
            "expert shard 0: experts 0-2 (3), threads 1\n"
            "expert shard 1: experts 3-5 (3), threads 1\n"
            "expert shard 2: experts 6-7 (2), threads 1\n");
}

TEST(PlanDescribe, ShowsAutoBeforeResolve) {
  std::string d = describe_plan(parse_ok("expert_shards.count = 1\n"));
  EXPECT_CONTAINS(d, "model (from the command line)");
  EXPECT_CONTAINS(d, ("stage 0: layers auto, kv_blocks auto, threads 1\n"));
  EXPECT_CONTAINS(d, ("expert shard 0: experts auto, threads 1\n"));
}

// --- bad plans: one test per way ------------------------------------------------------------

TEST(PlanReject, OverlappingLayerRanges) {
  EXPECT_EQ(
      resolve_error("[[stage]]\nlayers = [0, 3]\n[[stage]]\nlayers = [2, 5]\n", make_spec(5, 0)),
      "plan.toml:3: stages 0 [0, 3) and 1 [2, 5) overlap on layers [2, 3)");
}

TEST(PlanReject, GapBetweenStages) {
  EXPECT_EQ(
      resolve_error("[[stage]]\nlayers = [0, 2]\n[[stage]]\nlayers = [3, 5]\n", make_spec(5, 0)),
      "plan.toml:3: layers [2, 3) are owned by no stage: a gap between stage 0 [0, 2) and "
      "stage 1 [3, 5)");
}

TEST(PlanReject, FirstStageNotAtLayerZero) {
  EXPECT_EQ(resolve_error("[[stage]]\nlayers = [1, 5]\n", make_spec(5, 0)),
            "plan.toml:1: layers [0, 1) are owned by no stage: the first stage, stage 0 [1, 5), "
            "must begin at layer 0");
}

TEST(PlanReject, LastStageShortOfTheLastLayer) {
  EXPECT_EQ(resolve_error("[[stage]]\nlayers = [0, 4]\n", make_spec(5, 0)),
            "plan.toml:1: layers [4, 5) are owned by no stage: the last stage, stage 0 [0, 4), "
            "must end at layer 5, the model's layer count");
}

TEST(PlanReject, EmptyStage) {
  EXPECT_EQ(resolve_error("[[stage]]\nlayers = [0, 3]\n[[stage]]\nlayers = [3, 3]\n"
                          "[[stage]]\nlayers = [3, 5]\n",
                          make_spec(5, 0)),
            "plan.toml:3: stage 1 [3, 3) is empty: a stage needs at least one layer");
}

TEST(PlanReject, LayerBeyondTheModel) {
  EXPECT_EQ(
      resolve_error("[[stage]]\nlayers = [0, 3]\n[[stage]]\nlayers = [3, 9]\n", make_spec(5, 0)),
      "plan.toml:3: stage 1 [3, 9) runs past the model's 5 layers");
}

TEST(PlanReject, StagesOutOfOrder) {
  EXPECT_EQ(
      resolve_error("[[stage]]\nlayers = [3, 5]\n[[stage]]\nlayers = [0, 3]\n", make_spec(5, 0)),
      "plan.toml:3: stage 1 [0, 3) comes after stage 0 [3, 5): list stages in pipeline "
      "order, by ascending layers");
}

TEST(PlanReject, MoreStagesThanLayers) {
  EXPECT_EQ(resolve_error("stages.count = 6\n", make_spec(5, 0)),
            "plan.toml: 6 stages for a model of 5 layers: each stage needs at least one layer");
}

TEST(PlanReject, TooFewLayersLeftForAutoStages) {
  EXPECT_EQ(resolve_error("[[stage]]\nlayers = [0, 4]\n[[stage]]\n[[stage]]\n", make_spec(5, 0)),
            "plan.toml:3: stages 1 to 2 are auto but only 1 layer ([4, 5)) is left between the "
            "explicit ranges: each stage needs at least one");
}

TEST(PlanReject, ExpertOwnedTwice) {
  EXPECT_EQ(resolve_error("[[expert_shard]]\nexperts = [0, 1, 2, 3, 4]\n"
                          "[[expert_shard]]\nexperts = [4, 5, 6, 7]\n",
                          make_spec(2, 8)),
            "plan.toml:3: expert 4 is owned twice: by expert shards 0 and 1");
}

TEST(PlanReject, ExpertOwnedByNoShard) {
  EXPECT_EQ(resolve_error("[[expert_shard]]\nexperts = [0, 1, 2, 3]\n"
                          "[[expert_shard]]\nexperts = [4, 6, 7]\n",
                          make_spec(2, 8)),
            "plan.toml: expert 5 is owned by no expert shard");
  EXPECT_EQ(resolve_error("[[expert_shard]]\nexperts = [0, 1, 2]\n", make_spec(2, 8)),
            "plan.toml: experts 3, 4, 5, 6 and 7 are owned by no expert shard");
}

TEST(PlanReject, ExpertIdOutOfRange) {
  EXPECT_EQ(resolve_error("[[expert_shard]]\nexperts = [0, 1, 2, 3]\n"
                          "[[expert_shard]]\nexperts = [4, 5, 6, 7, 8]\n",
                          make_spec(2, 8)),
            "plan.toml:3: expert shard 1: expert 8 is out of range: the model has 8 experts, ids "
            "0 to 7");
}

TEST(PlanReject, ExpertListedTwiceInOneShard) {
  EXPECT_EQ(resolve_error("[[expert_shard]]\nexperts = [0, 1, 1, 2]\n", make_spec(2, 3)),
            "plan.toml:1: expert shard 0 lists expert 1 twice");
}

TEST(PlanReject, ShardWithNoExperts) {
  EXPECT_EQ(resolve_error("[[expert_shard]]\nexperts = []\n[[expert_shard]]\n", make_spec(2, 8)),
            "plan.toml:1: expert shard 0 owns no experts (experts = [])");
}

TEST(PlanReject, TooFewExpertsLeftForAutoShards) {
  EXPECT_EQ(resolve_error("[[expert_shard]]\nexperts = [0, 1, 2]\n[[expert_shard]]\n"
                          "[[expert_shard]]\n",
                          make_spec(2, 4)),
            "plan.toml:3: 2 expert shards are auto but only 1 expert (3) left after the explicit "
            "shards: each shard needs at least one");
}

TEST(PlanReject, ExpertShardsForADenseModel) {
  EXPECT_EQ(resolve_error("expert_shards.count = 2\n", make_spec(4, 0)),
            "plan.toml: the model is dense (it has no experts) but the plan has 2 expert shards");
}

TEST(PlanReject, MoreShardsThanExperts) {
  EXPECT_EQ(resolve_error("expert_shards.count = 5\n", make_spec(4, 4)),
            "plan.toml: 5 expert shards for a model of 4 experts: each shard needs at least one "
            "expert");
}

TEST(PlanReject, KvPoolTooSmallForOneSequence) {
  EXPECT_EQ(resolve_error("[scheduler]\nmax_model_len = 2048\n[[stage]]\n[[stage]]\n"
                          "kv_blocks = 100\n",
                          make_spec(4, 0)),
            "plan.toml:4: stage 1: a KV pool of 100 blocks (1600 tokens at 16 tokens a block) "
            "cannot hold one sequence of scheduler.max_model_len = 2048 tokens, which needs 128 "
            "blocks");
}

TEST(PlanReject, MaxModelLenBeyondTrainingContext) {
  EXPECT_EQ(resolve_error("scheduler.max_model_len = 4096\n", make_spec(4, 0, 2048)),
            "plan.toml: scheduler.max_model_len = 4096 exceeds the model's training context of "
            "2048 tokens");
}

TEST(PlanResolve, MicrobatchesAreACeilingNotARequirement) {
  Plan p = resolve_ok("[scheduler]\nmax_sequences = 1\nmicrobatches = 4\n", make_spec(4, 0));
  EXPECT_EQ(p.scheduler.microbatches, 4);
}

TEST(PlanReject, SchedulerValueOutOfRangeInCode) {
  Plan p = even_plan("m.gguf", 1, 0);
  p.scheduler.max_tokens_per_step = 0;
  EXPECT_EQ(resolve_error(p, make_spec(4, 0), PlanErrc::kSchema),
            "--stages 1 --expert-shards 0: scheduler.max_tokens_per_step: expected an integer "
            ">= 1, got 0");
}

TEST(PlanReject, MoreStageEntriesThanNumStagesInCode) {
  Plan p = even_plan("m.gguf", 1, 0);
  p.stages.resize(2);
  EXPECT_EQ(resolve_error(p, make_spec(4, 0)),
            "--stages 1 --expert-shards 0: num_stages is 1 but 2 stages are listed");
}

}  // namespace
}  // namespace troupe::actors

// --- clusters: [cluster], [[node]] and placement of stages and shards on nodes ----------------

namespace troupe::actors {
namespace {

const char* kCluster =
    "[cluster]\ntoken = \"s3cret\"\nhead = \"b\"\n"
    "[[node]]\nname = \"a\"\naddress = \"10.0.0.1:7401\"\n"
    "[[node]]\nname = \"b\"\naddress = \"10.0.0.2:7401\"\n";

TEST(ClusterPlan, ParsesNodesAndPlacesRoundRobin) {
  auto p = parse_plan_string(
      std::string(kCluster) + "[stages]\ncount = 3\n[expert_shards]\ncount = 3\n", "c.toml");
  ASSERT_TRUE(p) << p.error().message;
  ASSERT_EQ(p->cluster.nodes.size(), 2u);
  EXPECT_EQ(p->cluster.nodes[1].host, "10.0.0.2");
  EXPECT_EQ(p->cluster.nodes[1].port, 7401);
  ASSERT_TRUE(resolve_placement(*p));
  EXPECT_EQ(p->cluster.head, "b");
  EXPECT_EQ(p->cluster.token, "s3cret");
  std::vector<std::string> stages, shards;
  for (const auto& s : p->stages) stages.push_back(s.node);
  for (const auto& s : p->expert_shards) shards.push_back(s.node);
  EXPECT_EQ(stages, (std::vector<std::string>{"a", "b", "a"}));
  EXPECT_EQ(shards, (std::vector<std::string>{"b", "a", "b"}));
  EXPECT_EQ(node_index(*p, "b"), 1);
  EXPECT_EQ(node_index(*p, "zz"), -1);
}

std::string placement_error(const std::string& toml) {
  auto p = parse_plan_string(toml, "c.toml");
  if (!p) return "parse: " + p.error().message;
  auto s = resolve_placement(*p);
  return s ? std::string("ok") : s.error().message;
}

TEST(ClusterPlan, RejectsBadClusters) {
  const std::string nodes =
      "[[node]]\nname = \"a\"\naddress = \"h:1\"\n[[node]]\nname = \"a\"\naddress = \"h:2\"\n";
  EXPECT_EQ(placement_error("[cluster]\ntoken = \"t\"\n" + nodes),
            "c.toml:6: node[1]: the name 'a' is taken by node[0]");
  EXPECT_EQ(placement_error("[cluster]\ntoken = \"t\"\n[[node]]\nname = \"a\"\naddress = \"h:1\"\n"
                            "[[node]]\nname = \"b\"\naddress = \"h:1\"\n"),
            "c.toml:6: node[1]: the address h:1 is taken by node[0]");
  EXPECT_EQ(placement_error("[cluster]\ntoken = \"t\"\nhead = \"x\"\n[[node]]\nname = \"a\"\n"
                            "address = \"h:1\"\n"),
            "c.toml:1: cluster.head: no [[node]] is named 'x'");
  EXPECT_EQ(placement_error("[[node]]\nname = \"a\"\naddress = \"h:1\"\n[[stage]]\nnode = \"q\"\n"),
            "c.toml: cluster: a cluster needs a token (cluster.token, cluster.token_file or the "
            "TROUPE_CLUSTER_TOKEN environment variable)");
  EXPECT_EQ(placement_error("[cluster]\ntoken = \"t\"\n[[node]]\nname = \"a\"\naddress = \"h:1\"\n"
                            "[[stage]]\nnode = \"q\"\n"),
            "c.toml:6: stage[0].node: no [[node]] is named 'q'");
  EXPECT_EQ(placement_error("[[stage]]\nnode = \"q\"\n"),
            "c.toml:1: stage[0].node: names node 'q' but the plan has no [[node]] tables");
  EXPECT_NE(placement_error("[[node]]\nname = \"a\"\naddress = \"nohostport\"\n")
                .find("node[0].address: expected \"host:port\""),
            std::string::npos);
  EXPECT_NE(placement_error("[[node]]\nname = \"a\"\naddress = \"h:70000\"\n").find("1..65535"),
            std::string::npos);
  EXPECT_NE(placement_error("[cluster]\nheartbeat_ms = 500\nlease_ms = 600\n")
                .find("must be at least twice heartbeat_ms"),
            std::string::npos);
  EXPECT_NE(placement_error("[cluster]\nerror_mode = \"sometimes\"\n").find("cluster.error_mode"),
            std::string::npos);
  EXPECT_NE(placement_error("[cluster]\nreplace_wait_ms = -1\n").find("cluster.replace_wait_ms"),
            std::string::npos);
  EXPECT_NE(placement_error("[[node]]\nname = \"a\"\naddress = \"h:1\"\nmemory_limit_mb = -5\n")
                .find("node[0].memory_limit_mb"),
            std::string::npos);
}

TEST(ClusterPlan, ReadsReplaceWaitAndMemoryLimits) {
  auto p = parse_plan_string(
      "[cluster]\ntoken = \"t\"\nreplace_wait_ms = 2500\n[[node]]\nname = \"a\"\n"
      "address = \"h:1\"\nmemory_limit_mb = 4096\n[[node]]\nname = \"b\"\naddress = \"h:2\"\n",
      "c.toml");
  ASSERT_TRUE(p) << p.error().message;
  EXPECT_EQ(p->cluster.replace_wait_ms, 2500);
  ASSERT_EQ(p->cluster.nodes.size(), 2u);
  EXPECT_EQ(p->cluster.nodes[0].memory_limit_mb, 4096);
  EXPECT_EQ(p->cluster.nodes[1].memory_limit_mb, 0);  // no limit
  auto d = parse_plan_string("[cluster]\ntoken = \"t\"\n", "d.toml");
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->cluster.replace_wait_ms, 60000);
}

TEST(ClusterPlan, SameHostPullIsOnUnlessTurnedOff) {
  auto on = parse_plan_string("[cluster]\ntoken = \"t\"\n", "c.toml");
  ASSERT_TRUE(on) << on.error().message;
  EXPECT_TRUE(on->cluster.same_host_pull);
  auto off = parse_plan_string("[cluster]\ntoken = \"t\"\nsame_host_pull = false\n", "c.toml");
  ASSERT_TRUE(off) << off.error().message;
  EXPECT_FALSE(off->cluster.same_host_pull);
  auto bad = parse_plan_string("[cluster]\nsame_host_pull = 1\n", "c.toml");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("cluster.same_host_pull"), std::string::npos)
      << bad.error().message;
}

TEST(ClusterPlan, PayloadChecksumsAreOnUnlessTurnedOff) {
  auto on = parse_plan_string("[cluster]\ntoken = \"t\"\n", "c.toml");
  ASSERT_TRUE(on) << on.error().message;
  EXPECT_TRUE(on->cluster.payload_checksums);
  auto off = parse_plan_string("[cluster]\ntoken = \"t\"\npayload_checksums = false\n", "c.toml");
  ASSERT_TRUE(off) << off.error().message;
  EXPECT_FALSE(off->cluster.payload_checksums);
  auto bad = parse_plan_string("[cluster]\npayload_checksums = \"no\"\n", "c.toml");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("cluster.payload_checksums"), std::string::npos)
      << bad.error().message;
}

TEST(ClusterPlan, TokenFromEnvironmentOrFile) {
  const std::string dir = ::testing::TempDir();
  {
    std::ofstream f(dir + "/troupe-plan-test-token");
    f << "from-file\n";
  }
  auto p = parse_plan_string(
      "[cluster]\ntoken_file = \"troupe-plan-test-token\"\n[[node]]\nname = \"a\"\n"
      "address = \"h:1\"\n",
      dir + "/c.toml");
  ASSERT_TRUE(p) << p.error().message;
  auto s = resolve_placement(*p);
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(p->cluster.token, "from-file");
  setenv("TROUPE_CLUSTER_TOKEN", "from-env", 1);
  auto q = parse_plan_string(std::string(kCluster), "c.toml");
  ASSERT_TRUE(q);
  ASSERT_TRUE(resolve_placement(*q));
  unsetenv("TROUPE_CLUSTER_TOKEN");
  EXPECT_EQ(q->cluster.token, "from-env");
}

}  // namespace
}  // namespace troupe::actors

namespace troupe::actors {
namespace {

TEST(PlanWeights, StorageIsReadAndChecked) {
  EXPECT_EQ(parse_ok("[model]\npath = \"m.gguf\"\n").weights, "auto");
  EXPECT_EQ(parse_ok("[model]\npath = \"m.gguf\"\nweights = \"auto\"\n").weights, "auto");
  EXPECT_EQ(parse_ok("[model]\npath = \"m.gguf\"\nweights = \"memory\"\n").weights, "memory");
  EXPECT_EQ(parse_ok("[model]\npath = \"m.gguf\"\nweights = \"map\"\n").weights, "map");
  const std::string e = parse_error("[model]\npath = \"m.gguf\"\nweights = \"ram\"\n");
  EXPECT_NE(
      e.find("plan.toml:3: model.weights: expected \"auto\", \"memory\" or \"map\", got \"ram\""),
      std::string::npos)
      << e;
}

TEST(PlanVision, MmprojIsAnchoredAndItsKnobsChecked) {
  const Plan none = parse_ok("[model]\npath = \"m.gguf\"\n");
  EXPECT_EQ(none.mmproj, "");
  EXPECT_EQ(none.image_cache_mb, 256);
  EXPECT_EQ(none.vision_threads, 0);
  const Plan p = parse_ok(
      "[model]\npath = \"m.gguf\"\nmmproj = \"v/mmproj.gguf\"\nimage_cache_mb = 0\n"
      "vision_threads = 3\n",
      "/etc/troupe/plan.toml");
  EXPECT_EQ(p.mmproj, "/etc/troupe/v/mmproj.gguf");  // relative to the plan, like the model
  EXPECT_EQ(p.image_cache_mb, 0);
  EXPECT_EQ(p.vision_threads, 3);
  EXPECT_EQ(parse_ok("[model]\nmmproj = \"/abs/mm.gguf\"\nvision_threads = \"auto\"\n").mmproj,
            "/abs/mm.gguf");
  std::string e = parse_error("[model]\nimage_cache_mb = -1\n");
  EXPECT_NE(e.find("plan.toml:2: model.image_cache_mb: expected"), std::string::npos) << e;
  e = parse_error("[model]\nvision_threads = 0\n");
  EXPECT_NE(e.find("model.vision_threads: expected"), std::string::npos) << e;
  e = parse_error("[model]\nmmproj = 5\n");
  EXPECT_NE(e.find("model.mmproj"), std::string::npos) << e;
}

}  // namespace
}  // namespace troupe::actors

namespace troupe::actors {
namespace {

TEST(PlanDevice, DataParallelStagesSplitTheKvIdsIntoOnePoolPerGpu) {
  // Two stages, the second data-parallel over 2 GPUs: its pool and the pipeline's split in two,
  // each holding a whole sequence (max_model_len 64 at 16 tokens a block: 4 blocks).
  Plan p = parse_ok(
      "[model]\npath = \"m.gguf\"\n[scheduler]\nmax_model_len = 64\nmax_sequences = 3\n"
      "[[stage]]\n[[stage]]\ndevice = \"cuda:0,1\"\nparallel = \"data\"\n");
  ASSERT_EQ(p.stages.size(), 2u);
  EXPECT_EQ(p.stages[0].parallel, "tensor");
  EXPECT_EQ(p.stages[1].parallel, "data");
  EXPECT_EQ(p.stages[0].data_ranks(), 1);
  EXPECT_EQ(p.stages[1].data_ranks(), 2);
  EXPECT_EQ(p.kv_pools(), 2);
  // Stage pools: auto = 3 sequences x 4 blocks = 12, then per GPU max(12 / 2, 4) = 6: 12; a
  // given 9 becomes max(9 / 2, 4) = 4 per GPU: 8.
  p.stages[0].kv_blocks = 9;
  const Plan r = resolve_ok(p, make_spec(4, 8, 2048));
  EXPECT_EQ(r.stages[0].kv_blocks, 8);
  EXPECT_EQ(r.stages[1].kv_blocks, 12);
  Plan mixed = parse_ok(
      "[model]\npath = \"m.gguf\"\n[[stage]]\ndevice = \"cuda:0,1\"\nparallel = \"data\"\n"
      "[[stage]]\ndevice = \"cuda:2,3,4\"\nparallel = \"data\"\n");
  EXPECT_NE(resolve_error(mixed, make_spec(4, 8, 2048)).find("the same number of GPUs (2 and 3)"),
            std::string::npos);
  const Plan tp = parse_ok("[model]\npath = \"m.gguf\"\n[[stage]]\ndevice = \"cuda:0,1\"\n");
  EXPECT_EQ(tp.kv_pools(), 1) << "tensor parallelism keeps one pool";
  for (const auto& [text, needle] : std::vector<std::pair<std::string, std::string>>{
           {"[[stage]]\nparallel = \"data\"\n", "give device = \"cuda:N,M,...\""},
           {"[[stage]]\ndevice = \"cuda:0\"\nparallel = \"pipeline\"\n",
            "stage[0].parallel: expected \"tensor\" or \"data\""}}) {
    const std::string e = parse_error("[model]\npath = \"m.gguf\"\n" + text);
    EXPECT_NE(e.find(needle), std::string::npos) << e;
  }
}

TEST(PlanDevice, StageDeviceIsReadAndChecked) {
  const Plan p =
      parse_ok("[model]\npath = \"m.gguf\"\n[[stage]]\n[[stage]]\ndevice = \"cuda:1\"\n");
  ASSERT_EQ(p.stages.size(), 2u);
  EXPECT_EQ(p.stages[0].device, "cpu");
  EXPECT_EQ(p.stages[1].device, "cuda:1");
  for (const char* bad :
       {"tpu", "cuda:", "cuda:x", "cuda:-1", "gpu0", "cuda:0,", "cuda:,1", "cuda:0,,1", "cuda:1000",
        "cuda:0;1", "cuda:0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16"}) {
    const std::string e = parse_error(
        std::string("[model]\npath = \"m.gguf\"\n[[stage]]\ndevice = \"") + bad + "\"\n");
    EXPECT_NE(e.find("plan.toml:4: stage[0].device: expected \"cpu\", \"cuda:N\""),
              std::string::npos)
        << bad << ": " << e;
  }
  const Plan tp = parse_ok("[model]\npath = \"m.gguf\"\n[[stage]]\ndevice = \"cuda:2,3\"\n");
  EXPECT_EQ(tp.stages[0].device, "cuda:2,3");
  EXPECT_EQ(cuda_devices("cuda:2,3"), (std::vector<int>{2, 3}));
  EXPECT_EQ(cuda_devices("cuda:0,0"), (std::vector<int>{0, 0}));
  EXPECT_EQ(cuda_devices("cuda:7"), (std::vector<int>{7}));
  EXPECT_EQ(cuda_devices("cuda:0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15").size(), 16u);
  EXPECT_TRUE(cuda_devices("cpu").empty());
}

}  // namespace
}  // namespace troupe::actors

// --- image encoders: [[encoder]] and its default for an mmproj --------------------------------

namespace troupe::actors {
namespace {

const char* kVision = "[model]\nmmproj = \"/m/mmproj.gguf\"\nvision_threads = 3\n";

// Two nodes, "a" and the head "b" (not the first, so that "the head" is not "node 0").
const char* kTwoNodes =
    "[cluster]\ntoken = \"s3cret\"\nhead = \"b\"\n"
    "[[node]]\nname = \"a\"\naddress = \"10.0.0.1:7401\"\n"
    "[[node]]\nname = \"b\"\naddress = \"10.0.0.2:7401\"\n";

/// resolve_placement's error on a plan that parses ("" and a test failure when it resolved).
std::string encoder_error(const std::string& toml) {
  Plan p = parse_ok(toml, "c.toml");
  Status s = resolve_placement(p);
  EXPECT_FALSE(s.has_value()) << "resolved, but should not have:\n" << describe_plan(p);
  if (s.has_value()) return "";
  EXPECT_EQ(s.error().code, static_cast<int>(PlanErrc::kInvalid)) << s.error().message;
  return s.error().message;
}

TEST(PlanEncoder, ParsesNodeAndThreadsWhichDefaultToVisionThreads) {
  const Plan p = parse_ok(std::string(kVision) +
                          "[[encoder]]\nnode = \"b\"\nthreads = 2\n"              // line 4
                          "[[encoder]]\n"                                         // line 7
                          "[[encoder]]\nthreads = \"auto\"\nnode = \"auto\"\n");  // line 8
  ASSERT_EQ(p.encoders.size(), 3u);
  EXPECT_EQ(p.encoders[0].node, "b");
  EXPECT_EQ(p.encoders[0].threads, 2);
  EXPECT_EQ(p.encoders[0].line, 4);
  EXPECT_EQ(p.encoders[1].node, "");
  EXPECT_EQ(p.encoders[1].threads, 3);  // [model] vision_threads
  EXPECT_EQ(p.encoders[1].line, 7);
  EXPECT_EQ(p.encoders[2].node, "");    // "auto": placed by resolve_placement
  EXPECT_EQ(p.encoders[2].threads, 0);  // "auto"
  // The default follows vision_threads wherever [model] sits in the file; unset, it is auto.
  const Plan later =
      parse_ok("[[encoder]]\n[model]\nmmproj = \"/m/mmproj.gguf\"\nvision_threads = 5\n");
  ASSERT_EQ(later.encoders.size(), 1u);
  EXPECT_EQ(later.encoders[0].threads, 5);
  const Plan unset = parse_ok("[model]\nmmproj = \"/m/mmproj.gguf\"\n[[encoder]]\n");
  ASSERT_EQ(unset.encoders.size(), 1u);
  EXPECT_EQ(unset.encoders[0].threads, 0);
  // No [[encoder]] table: none until resolve_placement adds the default.
  EXPECT_TRUE(parse_ok(kVision).encoders.empty());
}

TEST(PlanEncoder, RejectsBadEncoderTables) {
  EXPECT_EQ(parse_error(std::string(kVision) + "[[encoder]]\ndevice = \"cpu\"\n"),
            "plan.toml:5: unknown key 'encoder[0].device' (known here: threads, node)");
  EXPECT_EQ(parse_error(std::string(kVision) + "[[encoder]]\nthreads = 0\n"),
            "plan.toml:5: encoder[0].threads: expected an integer in [1, 1024] or \"auto\", got "
            "the integer 0");
  EXPECT_EQ(parse_error(std::string(kVision) + "[[encoder]]\nnode = 2\n"),
            "plan.toml:5: encoder[0].node: expected a string, got the integer 2");
  EXPECT_EQ(parse_error(std::string(kVision) + "[encoder]\nthreads = 2\n"),
            "plan.toml:4: encoder: expected an array of tables ([[encoder]]), got a table");
}

TEST(PlanEncoder, EncoderWithoutMmprojIsAnError) {
  EXPECT_EQ(encoder_error("[model]\npath = \"m.gguf\"\n[[encoder]]\nthreads = 2\n"),
            "c.toml:3: encoder[0]: an [[encoder]] encodes images for [model] mmproj, which the "
            "plan does not name");
  EXPECT_EQ(encoder_error(std::string(kTwoNodes) + "[[encoder]]\nnode = \"a\"\n"),
            "c.toml:10: encoder[0]: an [[encoder]] encodes images for [model] mmproj, which the "
            "plan does not name");
}

TEST(PlanEncoder, EncoderOnAnUnknownNodeIsAnError) {
  EXPECT_EQ(encoder_error(std::string(kTwoNodes) + kVision +
                          "[[encoder]]\nnode = \"a\"\n[[encoder]]\nnode = \"q\"\n"),
            "c.toml:15: encoder[1].node: no [[node]] is named 'q'");
}

TEST(PlanEncoder, EncoderNamingANodeInASingleProcessPlanIsAnError) {
  EXPECT_EQ(encoder_error(std::string(kVision) + "[[encoder]]\n[[encoder]]\nnode = \"b\"\n"),
            "c.toml:5: encoder[1].node: names node 'b' but the plan has no [[node]] tables");
}

TEST(PlanEncoder, MmprojWithoutEncodersGetsOneOnTheHead) {
  // Single process: one encoder with vision_threads, on no named node.
  Plan solo = parse_ok(kVision, "c.toml");
  ASSERT_TRUE(resolve_placement(solo));
  ASSERT_EQ(solo.encoders.size(), 1u);
  EXPECT_EQ(solo.encoders[0].threads, 3);
  EXPECT_EQ(solo.encoders[0].node, "");
  EXPECT_EQ(solo.encoders[0].line, 0);   // not from the file
  ASSERT_TRUE(resolve_placement(solo));  // idempotent: still one
  EXPECT_EQ(solo.encoders.size(), 1u);
  // A cluster: on the head, which is not the first node here.
  Plan multi = parse_ok(std::string(kTwoNodes) + kVision, "c.toml");
  ASSERT_TRUE(resolve_placement(multi));
  ASSERT_EQ(multi.encoders.size(), 1u);
  EXPECT_EQ(multi.encoders[0].node, "b");
  EXPECT_EQ(multi.encoders[0].threads, 3);
  // An [[encoder]] without a node goes to the head too; named ones stay; none is added.
  Plan named = parse_ok(
      std::string(kTwoNodes) + kVision + "[[encoder]]\nnode = \"a\"\n[[encoder]]\nthreads = 1\n",
      "c.toml");
  ASSERT_TRUE(resolve_placement(named));
  ASSERT_EQ(named.encoders.size(), 2u);
  EXPECT_EQ(named.encoders[0].node, "a");
  EXPECT_EQ(named.encoders[1].node, "b");
  EXPECT_EQ(named.encoders[1].threads, 1);
  // Without an mmproj: no encoder at all.
  Plan text = parse_ok(kTwoNodes, "c.toml");
  ASSERT_TRUE(resolve_placement(text));
  EXPECT_TRUE(text.encoders.empty());
  Plan text_solo = parse_ok("[model]\npath = \"m.gguf\"\n", "c.toml");
  ASSERT_TRUE(resolve_placement(text_solo));
  EXPECT_TRUE(text_solo.encoders.empty());
}

TEST(PlanEncoder, DescribeShowsOneLinePerEncoder) {
  Plan multi = parse_ok(std::string(kTwoNodes) + kVision +
                            "[[encoder]]\nnode = \"a\"\nthreads = 2\n[[encoder]]\nthreads = "
                            "\"auto\"\n",
                        "c.toml");
  ASSERT_TRUE(resolve_placement(multi));
  const std::string d = describe_plan(multi);
  EXPECT_CONTAINS(d, "\nimage encoder 0: threads 2, on a\nimage encoder 1: threads auto, on b\n");
  EXPECT_EQ(d.find("image encoder 2"), std::string::npos) << d;
  Plan solo = parse_ok(kVision, "c.toml");
  EXPECT_EQ(describe_plan(solo).find("image encoder"), std::string::npos);  // not resolved yet
  ASSERT_TRUE(resolve_placement(solo));
  EXPECT_CONTAINS(describe_plan(solo), "\nimage encoder 0: threads 3\n");
  // Encoders come after the expert shards and before the cluster line.
  const size_t enc = d.find("image encoder 0");
  EXPECT_LT(d.find("stage 0"), enc);
  EXPECT_LT(enc, d.find("cluster "));
}

}  // namespace
}  // namespace troupe::actors
