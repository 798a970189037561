// Architectures ../shared has no files of (GLM-4.5's glm4moe, MiniMax-M2, Ling-2.0's
// bailingmoe2, ERNIE 4.5, gpt-oss, Gemma 3, Llama 4, DeepSeek-V3.2, DeepSeek-V4), synthesized, as
// GGUF and in Hugging Face form (gpt-oss's with MXFP4 experts), through the actor system with
// stages and expert shards spread out: every token and logit bit-identical to the single-process
// run. Qwen3-Next and Qwen3.5 keep a recurrent state per sequence in every stage: the same, also
// against the plain engine, and through crashed actors, whose steps' sequences are recomputed.
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "actors/detail/actor_configs.h"
#include "actors/detail/replan.h"
#include "actors/local_cluster.h"
#include "actors/plan.h"
#include "model/model.h"
#include "model/synth.h"
#include "tests/actors/solo_reference.h"
#include "tests/cluster_test_util.h"
#include "tests/deepseek_v4_model.h"
#include "tests/gemma3_hf_twin.h"
#include "tests/gpt_oss_hf_twin.h"
#include "tests/hf_twin_model.h"
#include "tests/llama4_hf_twin.h"
#include "tests/qwen3next_hf_twin.h"
#include "tests/test_support.h"

namespace troupe::actors {
namespace {

void expect_plans_match_one_process(const std::string& path, bool dense = false) {
  auto m = model::load_model(path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const auto reqs = testing::cluster_requests((*m)->spec.n_vocab, 4, 10, 900);
  const auto want = testing::local_results(path, reqs);
  for (const auto& [stages, shards] : {std::pair{2, dense ? 0 : 2}, std::pair{4, dense ? 0 : 3}}) {
    SCOPED_TRACE("stages=" + std::to_string(stages) + " shards=" + std::to_string(shards));
    Plan plan = even_plan(path, stages, shards);
    plan.scheduler.max_sequences = 8;
    plan.scheduler.max_model_len = 256;
    ASSERT_TRUE(resolve_plan(plan, (*m)->spec).has_value());
    // The 4-stage plan runs on weights copied into memory, as a node daemon's are (every view,
    // biases and sinks included, must move with the copy).
    std::shared_ptr<const model::Model> weights = *m;
    if (stages == 4) {
      auto copy = model::copy_weights_to_memory(*m, {}, 2);
      ASSERT_TRUE(copy.has_value()) << copy.error().message;
      weights = *copy;
    }
    auto lc = LocalCluster::start(plan, weights);
    ASSERT_TRUE(lc) << lc.error().message;
    testing::expect_same((*lc)->generate_many(reqs), want);
  }
}

TEST(Glm4MoeCluster, GgufAcrossStagesAndExpertShards) {
  testing::TempDir dir;
  expect_plans_match_one_process(testing::synth_glm(dir, 21));
}

TEST(Glm4MoeCluster, HuggingFaceFormAcrossStagesAndExpertShards) {
  testing::TempDir dir, hf;
  testing::write_hf_twin(testing::synth_glm(dir, 22), hf);
  expect_plans_match_one_process(hf.path());
}

TEST(MinimaxM2Cluster, GgufAndHuggingFaceFormAcrossStagesAndExpertShards) {
  testing::TempDir dir, hf;
  const std::string gguf = testing::synth_arch(dir, "minimax-m2", 23);
  expect_plans_match_one_process(gguf);
  testing::write_hf_twin(gguf, hf);
  expect_plans_match_one_process(hf.path());
}

// Phi-3 (Phi-4-mini's layout, synthesized with a 512-position context trained at 128): across
// stages as in one process, and the stages rotate with LongRoPE's long factors because the plan's
// max_model_len (256) is above 128 (a plan of 100 gives other logits: the short factors).
TEST(Phi3Cluster, AcrossStagesWithTheFactorsOfThePlansContext) {
  testing::TempDir dir;
  model::SynthOptions o;
  o.arch = "phi3";
  o.n_ctx = 512;
  o.sliding_window = 8;
  o.seed = 25;
  const std::string path = dir.file("phi3.gguf");
  ASSERT_TRUE(model::synth_model(o, path).has_value());
  expect_plans_match_one_process(path, true);
  auto m = model::load_model(path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  ASSERT_EQ((*m)->spec.rope_long_after, 128);
  const auto reqs = testing::cluster_requests((*m)->spec.n_vocab, 2, 10, 20);
  const auto long_run = testing::local_results(path, reqs);  // one stage, max_model_len 256
  Plan plan = even_plan(path, 1, 0);
  plan.scheduler.max_sequences = 8;
  plan.scheduler.max_model_len = 100;
  ASSERT_TRUE(resolve_plan(plan, (*m)->spec).has_value());
  auto lc = LocalCluster::start(plan, *m);
  ASSERT_TRUE(lc) << lc.error().message;
  const auto short_run = (*lc)->generate_many(reqs);
  ASSERT_EQ(long_run.size(), 2u);
  ASSERT_EQ(short_run.size(), 2u);
  ASSERT_TRUE(long_run[0].ok() && short_run[0].ok());
  EXPECT_NE(long_run[0].logits, short_run[0].logits);
}

TEST(BailingMoe2Cluster, GgufAndHuggingFaceFormAcrossStagesAndExpertShards) {
  testing::TempDir dir, hf;
  const std::string gguf = testing::synth_arch(dir, "bailingmoe2", 24);
  expect_plans_match_one_process(gguf);
  testing::write_hf_twin(gguf, hf);
  expect_plans_match_one_process(hf.path());
}

// GLM-5.2 (glm-dsa, 6 layers: the last three reuse layer 2's indexer choice): its stages start
// at layers with their own indexer (an auto plan's boundaries move there), and give the
// single process's tokens and logits; the plan says so.
TEST(Glm5Cluster, SharedIndexersStayInTheirFullLayersStage) {
  testing::TempDir dir;
  model::SynthOptions o;
  o.arch = "glm-dsa";
  o.seed = 26;
  o.n_layer = 6;
  o.n_ctx = 256;
  o.index_top_k = 6;
  const std::string path = dir.file("glm5.gguf");
  ASSERT_TRUE(model::synth_model(o, path).has_value());
  auto m = model::load_model(path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const auto reqs = testing::cluster_requests((*m)->spec.n_vocab, 3, 14, 901);
  const auto want = testing::local_results(path, reqs);
  for (const int stages : {2, 3}) {
    Plan plan = even_plan(path, stages, 2);
    plan.scheduler.max_sequences = 8;
    plan.scheduler.max_model_len = 256;
    ASSERT_TRUE(resolve_plan(plan, (*m)->spec).has_value());
    std::vector<int64_t> begins;
    for (const StagePlan& s : plan.stages) begins.push_back(s.layer_begin);
    EXPECT_EQ(begins, stages == 2 ? (std::vector<int64_t>{0, 2}) : (std::vector<int64_t>{0, 1, 2}));
    auto lc = LocalCluster::start(plan, *m);
    ASSERT_TRUE(lc) << lc.error().message;
    testing::expect_same((*lc)->generate_many(reqs), want);
  }
}

// ERNIE 4.5: the softmax router's selection bias and the shared experts, in shards and stages.
TEST(Ernie45Cluster, GgufAndHuggingFaceFormAcrossStagesAndExpertShards) {
  testing::TempDir dir, hf;
  const std::string gguf = testing::synth_arch(dir, "ernie4_5-moe", 25);
  expect_plans_match_one_process(gguf);
  testing::write_hf_twin(gguf, hf);
  expect_plans_match_one_process(hf.path());
}

// DeepSeek-V4: its four hyper-connection streams per position cross the stage boundaries, its
// hash-routed layers read token ids in whichever stage they land, its compressed entries and the
// indexer's keys live in each stage's KV rows; the shards run the clamped experts.
TEST(DeepseekV4Cluster, HuggingFaceFormAcrossStagesAndExpertShards) {
  testing::TempDir dir;
  testing::V4Options o;
  o.seed = 30;
  o.num_hash_layers = 2;
  o.swiglu_limit = 0.5;
  testing::write_deepseek_v4(dir.path(), o);
  expect_plans_match_one_process(dir.path());
}

// gpt-oss: expert shards run the biased, clamped experts; stages carry the sliding window.
TEST(GptOssCluster, GgufAcrossStagesAndExpertShards) {
  testing::TempDir dir;
  expect_plans_match_one_process(testing::synth_arch(dir, "gpt-oss", 25));
}

// gpt-oss as released: MXFP4 experts read in place, gate and up interleaved in one matrix.
TEST(GptOssCluster, HuggingFaceMxfp4AcrossStagesAndExpertShards) {
  testing::TempDir dir, hf;
  const std::string path = testing::synth_gpt_oss_mxfp4(dir, 26);
  testing::write_gpt_oss_hf_twin(path, hf, testing::OssExperts::kMxfp4);
  expect_plans_match_one_process(hf.path());
}

// Gemma 3 (dense): its window layers, local rope and post-norms split across stages.
TEST(Gemma3Cluster, GgufAndHuggingFaceFormAcrossStages) {
  testing::TempDir dir, hf;
  const std::string gguf = testing::synth_arch(dir, "gemma3", 27);
  expect_plans_match_one_process(gguf, /*dense=*/true);
  testing::write_gemma3_hf_twin(gguf, hf);
  expect_plans_match_one_process(hf.path(), /*dense=*/true);
}

// DeepSeek-V3.2: the indexer's keys ride in each stage's KV rows; 8 positions per query, so the
// requests' prompts and replies attend sparsely.
TEST(Deepseek32Cluster, GgufAcrossStagesAndExpertShards) {
  testing::TempDir dir;
  model::SynthOptions o;
  o.arch = "deepseek32";
  o.seed = 29;
  o.n_ctx = 256;
  o.index_top_k = 8;
  const std::string path = dir.file("d32.gguf");
  ASSERT_TRUE(model::synth_model(o, path).has_value());
  expect_plans_match_one_process(path);
}

// Llama 4: experts weighted at their input on the shards; the twin's chunks of 8 positions and
// early temperature cross the requests' prompts and replies.
TEST(Llama4Cluster, GgufAndHuggingFaceFormAcrossStagesAndExpertShards) {
  testing::TempDir dir, hf;
  const std::string gguf = testing::synth_arch(dir, "llama4", 28);
  expect_plans_match_one_process(gguf);
  testing::write_llama4_hf_twin(gguf, hf, {.chunk = 8, .floor_scale = 4, .attn_scale = 0.5});
  expect_plans_match_one_process(hf.path());
}

// The greedy requests of `reqs` against the plain engine (solo_reference.h), not only against
// the one-stage actor system: a recurrent state carried wrong in both would agree with itself.
void expect_greedy_match_engine(const std::string& path, const std::vector<GenerateRequest>& reqs,
                                const std::vector<GenerateResult>& got) {
  auto m = model::load_model(path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  ASSERT_EQ(got.size(), reqs.size());
  int greedy = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (reqs[i].sampling.temperature != 0.0f) continue;
    ++greedy;
    expect_identical(got[i], solo(*m, reqs[i].prompt_tokens, reqs[i].max_tokens),
                     "request " + std::to_string(i));
  }
  EXPECT_GE(greedy, 2);
}

// Qwen3-Next: the linear-attention layers' state per sequence lives in each stage (layers 0-1
// and 2-3: both stages hold some; with four, every stage), in the slot the scheduler assigns.
TEST(Qwen3NextCluster, GgufAndHuggingFaceFormAcrossStagesAndExpertShards) {
  testing::TempDir dir, hf;
  const std::string gguf = testing::synth_arch(dir, "qwen3next", 30);
  auto m = model::load_model(gguf);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const auto reqs = testing::cluster_requests((*m)->spec.n_vocab, 4, 10, 900);
  expect_greedy_match_engine(gguf, reqs, testing::local_results(gguf, reqs));
  expect_plans_match_one_process(gguf);
  testing::write_qwen3next_hf_twin(gguf, hf);
  expect_plans_match_one_process(hf.path());
}

// Qwen3.5 (value heads in tiled order, b and a apart), the MoE form.
TEST(Qwen3NextCluster, Qwen35AcrossStagesAndExpertShards) {
  testing::TempDir dir;
  const std::string gguf = testing::synth_arch(dir, "qwen35moe", 31);
  expect_plans_match_one_process(gguf);
}

// Prompts that share a prefix of whole KV blocks, one after the other: with the prefix cache the
// second would start at position 32 with a fresh state (its linear layers would never see the
// prefix). The scheduler of a recurrent model keeps the cache off even when the plan asks for
// it; both requests equal the plain engine.
TEST(Qwen3NextCluster, SharedPromptsRunWithoutThePrefixCache) {
  testing::TempDir dir;
  const std::string gguf = testing::synth_arch(dir, "qwen3next", 33);
  auto m = model::load_model(gguf);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  Plan plan = even_plan(gguf, 2, 0);
  plan.scheduler.max_model_len = 256;
  ASSERT_TRUE(resolve_plan(plan, (*m)->spec).has_value());
  plan.scheduler.prefix_cache = true;  // as if resolve_plan had left it on
  auto lc = LocalCluster::start(plan, *m);
  ASSERT_TRUE(lc) << lc.error().message;
  auto reqs = testing::cluster_requests((*m)->spec.n_vocab, 5, 6, 902);
  GenerateRequest first = reqs[4], second = reqs[4];  // 41 prompt tokens
  first.sampling = second.sampling = {};
  first.sampling.ignore_eos = second.sampling.ignore_eos = true;
  second.prompt_tokens.resize(36);
  second.prompt_tokens.push_back(5);
  const std::vector<GenerateRequest> both = {first, second};
  std::vector<GenerateResult> got;
  for (const GenerateRequest& r : both) got.push_back((*lc)->generate(r));
  expect_greedy_match_engine(gguf, both, got);
  const auto st = nlohmann::json::parse((*lc)->stats_json());
  EXPECT_EQ(st["scheduler"]["prefix_hit_tokens"], 0) << st.dump();
}

// Crashed expert shard, then (in later runs) a crashed stage and a crashed scheduler,
// mid-generation. The shard's crash fails a decode step after stage 0 advanced its states (the
// step's rows go unanswered at a later layer), so the scheduler computes those sequences again
// from position 0, in chunks of 16 positions; the stage's restart recomputes every sequence; the
// new scheduler's slots start their states afresh, whatever its predecessor's steps left there.
// Every token and logit equals the plain engine's, and the stages' states stay within their slots.
TEST(Qwen3NextCluster, CrashedShardStageAndSchedulerChangeNoResult) {
  testing::TempDir dir;
  const std::string gguf = testing::synth_arch(dir, "qwen3next", 32);
  auto m = model::load_model(gguf);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  auto reqs = testing::cluster_requests((*m)->spec.n_vocab, 6, 24, 901);
  for (auto& r : reqs) r.sampling.temperature = 0.0f;  // all greedy: each against the engine
  Plan plan = even_plan(gguf, 3, 2);
  plan.scheduler.max_sequences = 4;  // fewer slots than requests: slots are handed on
  plan.scheduler.max_tokens_per_step = 16;
  plan.scheduler.max_model_len = 256;
  ASSERT_TRUE(resolve_plan(plan, (*m)->spec).has_value());
  EXPECT_FALSE(plan.scheduler.prefix_cache) << "a recurrent model runs without the prefix cache";
  ClusterOptions opts;
  opts.expert_timeout_ms = 2000;
  auto lc = LocalCluster::start(plan, *m, opts);
  ASSERT_TRUE(lc) << lc.error().message;
  for (const std::string actor : {"expert/1", "stage/2", "scheduler"}) {
    SCOPED_TRACE(actor);
    const auto before = nlohmann::json::parse((*lc)->stats_json());
    size_t streamed = 0;
    const auto got = (*lc)->generate_many(reqs, 0, [&](size_t i, const std::string&, int32_t t) {
      if (t >= 0 && i == 0 && ++streamed == 8) {
        EXPECT_TRUE((*lc)->inject_fault(actor).has_value());
      }
    });
    expect_greedy_match_engine(gguf, reqs, got);
    const auto st = nlohmann::json::parse((*lc)->stats_json());
    if (actor != "scheduler") {  // a new scheduler counts afresh
      EXPECT_GT(st["scheduler"]["recomputes"].get<int64_t>(),
                before["scheduler"]["recomputes"].get<int64_t>())
          << st.dump();
    }
    EXPECT_EQ(st["scheduler"]["running"], 0) << st.dump();
  }
  const auto st = nlohmann::json::parse((*lc)->stats_json());
  EXPECT_EQ(st["controller"]["expert_restarts"][1], 1) << st.dump();
  EXPECT_EQ(st["controller"]["stage_restarts"][2], 1) << st.dump();
  EXPECT_EQ(st["controller"]["scheduler_restarts"], 1) << st.dump();
  // The stages' states, allocated by the steps that first used their slots: at most one per slot
  // (4 slots for 6 requests), each of whole linear layers.
  const uint64_t layer_slot = static_cast<uint64_t>((*m)->spec.ssm_state_floats()) * 4;
  uint64_t total = 0;
  ASSERT_EQ(st["kv_stages"].size(), 3u) << st.dump();
  for (const auto& s : st["kv_stages"]) {
    const auto b = s["state_bytes"].get<uint64_t>();
    EXPECT_EQ(b % layer_slot, 0u) << st.dump();
    total += b;
  }
  EXPECT_GT(total, 0u) << st.dump();
  EXPECT_LE(total, 4 * 3 * layer_slot) << st.dump();  // 3 linear layers
}

// What a re-placement counts for a moved stage beside its weights (detail::stage_pools_memory:
// its KV pool and its recurrent states) is what the running stage takes: the pool its engine
// reserved for the attention layers of its range, in the plan's KV type, and one state per slot
// once every slot has been used (8 requests through 4 slots).
TEST(Qwen3NextCluster, ReplacementCountsWhatAStageReserves) {
  testing::TempDir dir;
  const std::string gguf = testing::synth_arch(dir, "qwen3next", 33);
  auto m = model::load_model(gguf);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const model::ModelSpec& spec = (*m)->spec;
  Plan plan = even_plan(gguf, 3, 0);
  plan.scheduler.max_sequences = 4;
  plan.scheduler.max_model_len = 128;
  plan.kv_type = compute::KvType::kF16;
  ASSERT_TRUE(resolve_plan(plan, spec).has_value());
  auto lc = LocalCluster::start(plan, *m);
  ASSERT_TRUE(lc) << lc.error().message;
  const auto reqs = testing::cluster_requests(spec.n_vocab, 8, 6, 902);
  for (const auto& r : (*lc)->generate_many(reqs)) EXPECT_TRUE(r.ok()) << r.error;
  // The placement a head would send for this plan (its pools: the smallest stage's blocks).
  detail::PlacementMsg pl;
  int64_t blocks = plan.stages[0].kv_blocks;
  for (const auto& s : plan.stages) blocks = std::min(blocks, s.kv_blocks);
  for (uint32_t i = 0; i < plan.stages.size(); ++i) {
    detail::StagePlacementInfo sp;
    sp.stage = i;
    sp.layer_begin = static_cast<uint32_t>(plan.stages[i].layer_begin);
    sp.layer_end = static_cast<uint32_t>(plan.stages[i].layer_end);
    pl.stages.push_back(sp);
    pl.kv_pools.push_back(
        {i, 0, static_cast<uint32_t>(blocks), static_cast<uint32_t>(plan.kv_block_size)});
  }
  const auto st = nlohmann::json::parse((*lc)->stats_json());
  ASSERT_EQ(st["kv_stages"].size(), 3u) << st.dump();
  uint64_t states = 0;
  for (uint32_t i = 0; i < 3; ++i) {
    SCOPED_TRACE("stage " + std::to_string(i));
    const detail::ActorMemory want =
        detail::stage_pools_memory(spec, plan, pl, i, state_slots_for(spec, plan.scheduler));
    const auto& s = st["kv_stages"][i];
    EXPECT_EQ(s["block_bytes"].get<uint64_t>() * s["blocks_total"].get<uint64_t>(), want.kv)
        << st.dump();
    EXPECT_EQ(s["state_bytes"].get<uint64_t>(), want.states) << st.dump();
    EXPECT_GT(want.kv, 0u);
    EXPECT_EQ(want.weights, 0u);
    states += want.states;
  }
  // Over the stages: 4 slots of every linear-attention layer of the model.
  int64_t linear = 0;
  for (const auto& L : spec.layers) linear += L.recurrent ? 1 : 0;
  EXPECT_GT(linear, 0);
  EXPECT_EQ(states, static_cast<uint64_t>(4 * linear * spec.ssm_state_floats()) * 4);
  // A GPU stage keeps both on its device.
  Plan gpu = plan;
  gpu.stages[1].device = "cuda:0";
  const detail::ActorMemory none = detail::stage_pools_memory(spec, gpu, pl, 1, 4);
  EXPECT_EQ(none.total(), 0u);
}

}  // namespace
}  // namespace troupe::actors
