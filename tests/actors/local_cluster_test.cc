// The actor system against the single-process engine: for every plan (stages x expert shards,
// prefix cache on and off, several scheduler budgets), many concurrent requests, a tiny KV pool
// that forces preemption, and actors that crash mid-run, every greedy token and every logit is
// bit-identical to the engine run alone; a crashed scheduler or router changes no result and no
// streamed byte; and the per-stage KV statistics add up.
#include "actors/local_cluster.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>

#include <nlohmann/json.hpp>

#include "compute/engine.h"
#include "model/model.h"
#include "tests/actors/solo_reference.h"
#include "tests/fp8_model.h"
#include "tests/int4_model.h"
#include "tests/test_support.h"

namespace troupe::actors {
namespace {

std::vector<int32_t> random_prompt(size_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> v(n);
  for (auto& t : v) t = static_cast<int32_t>(3 + rng() % static_cast<uint32_t>(vocab - 3));
  return v;
}

GenerateRequest greedy_request(const std::vector<int32_t>& prompt, int64_t n) {
  GenerateRequest r;
  r.prompt_tokens = prompt;
  r.max_tokens = n;
  r.sampling.ignore_eos = true;
  r.return_logits = true;
  return r;
}

std::shared_ptr<const model::Model> load(const std::string& path) {
  auto m = model::load_model(path);
  EXPECT_TRUE(m) << (m ? "" : m.error().message);
  return m ? *m : nullptr;
}

class PlanMatrix : public ::testing::TestWithParam<const char*> {};

TEST_P(PlanMatrix, EveryPlanIsBitIdenticalToTheEngine) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto m = load(shared + "/" + GetParam());
  ASSERT_TRUE(m);
  const auto& spec = m->spec;
  // Prompts that share a prefix (prefix-cache hits) and ones that do not, of mixed lengths.
  std::vector<std::vector<int32_t>> prompts;
  const auto common = random_prompt(37, spec.n_vocab, 1);
  for (uint32_t i = 0; i < 6; ++i) {
    auto p = random_prompt(3 + 7 * i, spec.n_vocab, 100 + i);
    if (i % 2 == 0) p.insert(p.begin(), common.begin(), common.end());
    prompts.push_back(p);
  }
  const int64_t n_gen = 12;
  std::vector<Reference> refs;
  for (const auto& p : prompts) refs.push_back(solo(m, p, n_gen));
  std::vector<GenerateRequest> reqs;
  for (const auto& p : prompts) reqs.push_back(greedy_request(p, n_gen));

  const int64_t max_stages = std::min<int64_t>(4, spec.n_layer);
  std::vector<int64_t> shard_counts = {0};
  if (spec.n_expert > 0) shard_counts = {0, 1, 2, 3, 4};
  const int64_t budgets[] = {5, 16, 512};
  int combo = 0;
  for (int64_t ns = 1; ns <= max_stages; ++ns) {
    for (int64_t ne : shard_counts) {
      for (bool prefix : {true, false}) {
        Plan plan = even_plan(m->path, ns, ne);
        plan.scheduler.prefix_cache = prefix;
        plan.scheduler.max_tokens_per_step = budgets[combo % 3];
        plan.scheduler.max_sequences = 8;
        plan.scheduler.max_model_len = 128;
        ++combo;
        ASSERT_TRUE(resolve_plan(plan, spec).has_value());
        auto lc = LocalCluster::start(plan, m);
        ASSERT_TRUE(lc) << lc.error().message;
        const auto res = (*lc)->generate_many(reqs);
        const std::string what = "stages=" + std::to_string(ns) + " shards=" + std::to_string(ne) +
                                 " prefix=" + std::to_string(prefix) +
                                 " budget=" + std::to_string(plan.scheduler.max_tokens_per_step);
        for (size_t i = 0; i < reqs.size(); ++i)
          expect_identical(res[i], refs[i], what + " request " + std::to_string(i));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, PlanMatrix,
    ::testing::Values("models/stories260K/stories260K.gguf", "models/synth/mixtral-moe/model.gguf",
                      "models/synth/deepseek2/model.gguf", "models/synth/qwen3moe/model.gguf"),
    [](const auto& info) { return ::troupe::testing::model_param_name(info.param); });

// A quantized Hugging Face checkpoint (the shared DeepSeek-V3-style model written by a test
// helper) through 2 stages x 2 expert shards, its weights copied into memory as a node does:
// bit-identical to the engine on the same files.
void expect_checkpoint_across_stages_and_shards(const std::string& dir, model::GgmlType experts,
                                                uint32_t seed) {
  auto m = load(dir);
  ASSERT_TRUE(m);
  ASSERT_EQ(m->spec.layers.back().experts[0].gate.type, experts);
  std::vector<GenerateRequest> reqs;
  std::vector<Reference> refs;
  for (uint32_t i = 0; i < 4; ++i) {
    auto p = random_prompt(5 + 9 * i, m->spec.n_vocab, seed + i);
    reqs.push_back(greedy_request(p, 10));
    refs.push_back(solo(m, p, 10));
  }
  Plan plan = even_plan(m->path, 2, 2);
  plan.scheduler.max_sequences = 8;
  plan.scheduler.max_model_len = 128;
  ASSERT_TRUE(resolve_plan(plan, m->spec).has_value());
  auto in_memory = model::copy_weights_to_memory(m, {}, 2);
  ASSERT_TRUE(in_memory.has_value()) << in_memory.error().message;
  auto lc = LocalCluster::start(plan, *in_memory);
  ASSERT_TRUE(lc) << lc.error().message;
  const auto res = (*lc)->generate_many(reqs);
  for (size_t i = 0; i < reqs.size(); ++i)
    expect_identical(res[i], refs[i], "request " + std::to_string(i));
}

// DeepSeek's FP8 form (blocks of 128 x 128).
TEST(LocalCluster, Fp8CheckpointAcrossStagesAndExpertShards) {
  TROUPE_SHARED_OR_SKIP(shared);
  const testing::Fp8Copy copy(shared + "/models/hf/deepseek2", 128, 128);
  expect_checkpoint_across_stages_and_shards(copy.fp8_path(), model::GgmlType::kF8_E4M3, 700);
}

// compressed-tensors int4 laid out as Kimi-K2-Thinking (routed experts packed int4 with BF16
// group scales, the rest as stored).
TEST(LocalCluster, Int4CheckpointAcrossStagesAndExpertShards) {
  TROUPE_SHARED_OR_SKIP(shared);
  testing::Int4Options o;
  o.quantize = [](const std::string& name) { return name.find(".experts.") != std::string::npos; };
  const testing::Int4Copy copy(shared + "/models/hf/deepseek2", o);
  expect_checkpoint_across_stages_and_shards(copy.int4_path(), model::GgmlType::kI4_PACKED, 800);
}

TEST(LocalCluster, SixtyFourConcurrentRequestsMatchTheirSoloRuns) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto m = load(shared + "/models/synth/mixtral-moe/model.gguf");
  ASSERT_TRUE(m);
  std::vector<GenerateRequest> reqs;
  std::vector<Reference> refs;
  for (uint32_t i = 0; i < 64; ++i) {
    auto p = random_prompt(1 + (i * 13) % 40, m->spec.n_vocab, 500 + i);
    const int64_t n = 1 + (i * 7) % 20;
    reqs.push_back(greedy_request(p, n));
    refs.push_back(solo(m, p, n));
  }
  Plan plan = even_plan(m->path, 2, 2);
  plan.scheduler.max_sequences = 64;
  plan.scheduler.max_tokens_per_step = 96;
  plan.scheduler.max_model_len = 128;
  ASSERT_TRUE(resolve_plan(plan, m->spec).has_value());
  auto lc = LocalCluster::start(plan, m);
  ASSERT_TRUE(lc) << lc.error().message;
  const auto res = (*lc)->generate_many(reqs);
  for (size_t i = 0; i < reqs.size(); ++i)
    expect_identical(res[i], refs[i], "request " + std::to_string(i));
}

// 12 requests through a 2-stage CPU pipeline whose KV pool (40 blocks of 4 tokens: 160 slots
// for 12 x ~50 tokens, split into kv_pools pools) forces preemption: every output is still the
// solo engine's, and preemptions happened.
void expect_preemption_matches(const std::string& shared, int64_t kv_pools, uint32_t seed) {
  auto m = load(shared + "/models/stories260K/stories260K.gguf");
  ASSERT_TRUE(m);
  std::vector<GenerateRequest> reqs;
  std::vector<Reference> refs;
  for (uint32_t i = 0; i < 12; ++i) {
    auto p = random_prompt(10 + i, m->spec.n_vocab, seed + i);
    reqs.push_back(greedy_request(p, 30));
    refs.push_back(solo(m, p, 30));
  }
  Plan plan = even_plan(m->path, 2, 0);
  plan.kv_block_size = 4;
  plan.scheduler.max_model_len = 64;
  plan.scheduler.max_sequences = 12;
  for (auto& s : plan.stages) s.kv_blocks = 40;
  ASSERT_TRUE(resolve_plan(plan, m->spec).has_value());
  ClusterOptions opts;
  opts.kv_pools = kv_pools;
  auto lc = LocalCluster::start(plan, m, opts);
  ASSERT_TRUE(lc) << lc.error().message;
  const auto res = (*lc)->generate_many(reqs);
  for (size_t i = 0; i < reqs.size(); ++i)
    expect_identical(res[i], refs[i], "request " + std::to_string(i));
  const std::string stats = (*lc)->stats_json();
  EXPECT_EQ(stats.find("\"preemptions\":0,"), std::string::npos)
      << "no preemption happened: " << stats;
}

TEST(LocalCluster, TinyKvPoolPreemptsAndStillMatches) {
  TROUPE_SHARED_OR_SKIP(shared);
  expect_preemption_matches(shared, 1, 900);
}

TEST(LocalCluster, TwoKvPoolsPreemptWithinAPoolAndStillMatch) {
  // The scheduler's KV ids split into two pools (as for a data-parallel GPU stage): sequences are
  // preempted inside their pool.
  TROUPE_SHARED_OR_SKIP(shared);
  expect_preemption_matches(shared, 2, 1900);
  auto m = load(shared + "/models/stories260K/stories260K.gguf");
  ASSERT_TRUE(m);
  Plan plan = even_plan(m->path, 2, 0);
  plan.kv_block_size = 4;
  plan.scheduler.max_model_len = 64;
  for (auto& s : plan.stages) s.kv_blocks = 40;
  ASSERT_TRUE(resolve_plan(plan, m->spec).has_value());
  ClusterOptions opts;
  opts.kv_pools = 3;  // 40 blocks do not split into 3
  auto bad = LocalCluster::start(plan, m, opts);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("does not split into 3 pools"), std::string::npos)
      << bad.error().message;
}

// Plan::kv_type: stages whose KV pools store f16 or bf16 give the bits of the engine with the same
// cache (pipeline stages, expert shards, continuous batching and the prefix cache change
// nothing), and their pools take half the bytes per block of f32's.
TEST(LocalCluster, HalfPrecisionKvStagesMatchTheEngineWithTheSameCache) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto m = load(shared + "/models/synth/mixtral-moe/model.gguf");
  ASSERT_TRUE(m);
  std::vector<uint64_t> f32_block_bytes;
  for (const compute::KvType kv :
       {compute::KvType::kF32, compute::KvType::kF16, compute::KvType::kBF16}) {
    SCOPED_TRACE(std::string(compute::kv_type_name(kv)));
    const auto common = random_prompt(21, m->spec.n_vocab, 7);
    std::vector<GenerateRequest> reqs;
    std::vector<Reference> refs;
    for (uint32_t i = 0; i < 5; ++i) {
      auto p = random_prompt(4 + 5 * i, m->spec.n_vocab, 500 + i);
      if (i % 2 == 0) p.insert(p.begin(), common.begin(), common.end());
      reqs.push_back(greedy_request(p, 16));
      refs.push_back(solo(m, p, 16, kv));
    }
    Plan plan = even_plan(m->path, 2, 1);
    plan.kv_type = kv;
    plan.scheduler.max_model_len = 128;
    ASSERT_TRUE(resolve_plan(plan, m->spec).has_value());
    auto lc = LocalCluster::start(plan, m);
    ASSERT_TRUE(lc) << lc.error().message;
    const auto res = (*lc)->generate_many(reqs);
    for (size_t i = 0; i < reqs.size(); ++i)
      expect_identical(res[i], refs[i], "request " + std::to_string(i));
    const auto st = nlohmann::json::parse((*lc)->stats_json());
    for (size_t i = 0; i < st["kv_stages"].size(); ++i) {
      const auto bytes = st["kv_stages"][i]["block_bytes"].get<uint64_t>();
      if (kv == compute::KvType::kF32)
        f32_block_bytes.push_back(bytes);
      else
        EXPECT_EQ(2 * bytes, f32_block_bytes.at(i)) << "stage " << i;
    }
  }
  // And not the f32 cache's bits: the rounding is really applied.
  const auto p = random_prompt(30, m->spec.n_vocab, 9);
  EXPECT_NE(solo(m, p, 4).logits, solo(m, p, 4, compute::KvType::kF16).logits);
}

TEST(LocalCluster, CrashedStageAndShardAreRestartedWithIdenticalOutput) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto m = load(shared + "/models/synth/mixtral-moe/model.gguf");
  ASSERT_TRUE(m);
  std::vector<GenerateRequest> reqs;
  std::vector<Reference> refs;
  for (uint32_t i = 0; i < 8; ++i) {
    auto p = random_prompt(5 + 3 * i, m->spec.n_vocab, 300 + i);
    reqs.push_back(greedy_request(p, 40));
    refs.push_back(solo(m, p, 40));
  }
  Plan plan = even_plan(m->path, 3, 2);
  plan.scheduler.max_model_len = 128;
  ASSERT_TRUE(resolve_plan(plan, m->spec).has_value());
  ClusterOptions opts;
  opts.expert_timeout_ms = 2000;
  auto lc = LocalCluster::start(plan, m, opts);
  ASSERT_TRUE(lc) << lc.error().message;
  ASSERT_TRUE((*lc)->inject_fault("stage/1").has_value());
  ASSERT_TRUE((*lc)->inject_fault("expert/1").has_value());
  const auto res = (*lc)->generate_many(reqs);
  for (size_t i = 0; i < reqs.size(); ++i)
    expect_identical(res[i], refs[i], "request " + std::to_string(i));
  const std::string stats = (*lc)->stats_json();
  EXPECT_NE(stats.find("\"stage_restarts\":[0,1,0]"), std::string::npos) << stats;
  EXPECT_NE(stats.find("\"expert_restarts\":[0,1]"), std::string::npos) << stats;
  EXPECT_FALSE((*lc)->inject_fault("stage/9").has_value());
}

TEST(LocalCluster, BadRequestsGetErrorsAndOthersComplete) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto m = load(shared + "/models/stories260K/stories260K.gguf");
  ASSERT_TRUE(m);
  Plan plan = even_plan(m->path, 2, 0);
  plan.scheduler.max_model_len = 64;
  ASSERT_TRUE(resolve_plan(plan, m->spec).has_value());
  auto lc = LocalCluster::start(plan, m);
  ASSERT_TRUE(lc) << lc.error().message;
  GenerateRequest ok = greedy_request({1, 403, 407}, 4);
  GenerateRequest bad_token = greedy_request({1, 99999}, 4);
  GenerateRequest too_long = greedy_request(std::vector<int32_t>(80, 5), 4);
  GenerateRequest bad_temp = ok;
  bad_temp.sampling.temperature = -1;
  GenerateRequest text;
  text.prompt = "Once upon a time";
  text.max_tokens = 8;
  const auto res = (*lc)->generate_many({ok, bad_token, too_long, bad_temp, text});
  EXPECT_TRUE(res[0].ok());
  EXPECT_EQ(res[0].tokens.size(), 4u);
  EXPECT_NE(res[1].error.find("outside the vocabulary"), std::string::npos) << res[1].error;
  EXPECT_NE(res[2].error.find("model length limit is 64"), std::string::npos) << res[2].error;
  EXPECT_NE(res[3].error.find("temperature"), std::string::npos) << res[3].error;
  EXPECT_TRUE(res[4].ok()) << res[4].error;
  EXPECT_EQ(res[4].prompt_tokens, (std::vector<int32_t>{1, 403, 407, 261, 378}));
  EXPECT_FALSE(res[4].text.empty());
}

TEST(LocalCluster, CancelledRequestStopsAndFreesItsBlocks) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto m = load(shared + "/models/stories260K/stories260K.gguf");
  ASSERT_TRUE(m);
  Plan plan = even_plan(m->path, 2, 0);
  plan.scheduler.max_model_len = 128;
  ASSERT_TRUE(resolve_plan(plan, m->spec).has_value());
  auto lc = LocalCluster::start(plan, m);
  ASSERT_TRUE(lc);
  std::vector<GenerateRequest> reqs;
  std::vector<Reference> refs;
  for (uint32_t i = 0; i < 4; ++i) {
    auto p = random_prompt(6 + i, m->spec.n_vocab, 40 + i);
    reqs.push_back(greedy_request(p, 60));
    refs.push_back(solo(m, p, 60));
  }
  int seen = 0;
  LocalCluster* c = lc->get();
  const auto res = c->generate_many(reqs, 0, [&](size_t i, const std::string&, int32_t) {
    if (i == 1 && ++seen == 5) c->cancel(1);
  });
  EXPECT_EQ(res[1].finish_reason, "cancelled");
  EXPECT_GE(res[1].tokens.size(), 5u);
  EXPECT_LT(res[1].tokens.size(), 60u);
  EXPECT_TRUE(std::equal(res[1].tokens.begin(), res[1].tokens.end(), refs[1].tokens.begin()));
  for (size_t i : {0u, 2u, 3u}) EXPECT_EQ(res[i].tokens, refs[i].tokens) << i;
  const std::string stats = c->stats_json();
  EXPECT_NE(stats.find("\"running\":0,\"waiting\":0"), std::string::npos) << stats;
  EXPECT_NE(stats.find("\"kv_usage_perc\":0.00"), std::string::npos) << stats;
}

TEST(LocalCluster, QueueBeyondItsLimitAnswersOverloaded) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto m = load(shared + "/models/stories260K/stories260K.gguf");
  ASSERT_TRUE(m);
  Plan plan = even_plan(m->path, 1, 0);
  plan.scheduler.max_model_len = 64;
  plan.scheduler.max_sequences = 1;
  plan.scheduler.max_queue = 2;
  ASSERT_TRUE(resolve_plan(plan, m->spec).has_value());
  auto lc = LocalCluster::start(plan, m);
  ASSERT_TRUE(lc);
  std::vector<GenerateRequest> reqs(8, greedy_request({1, 403, 407}, 20));
  const auto res = (*lc)->generate_many(reqs);
  int overloaded = 0, completed = 0;
  for (const auto& r : res) {
    if (r.finish_reason == "overloaded") {
      ++overloaded;
      EXPECT_NE(r.error.find("server overloaded"), std::string::npos);
    } else if (r.ok() && r.tokens.size() == 20) {
      ++completed;
    }
  }
  EXPECT_GT(overloaded, 0);
  EXPECT_EQ(overloaded + completed, 8);
}

// One generate_many run as the client saw it: results and what was streamed per request.
struct Streamed {
  std::vector<GenerateResult> results;
  std::vector<std::string> text;             // concatenated deltas
  std::vector<std::vector<int32_t>> tokens;  // streamed token ids
};

// hook(i, n) runs after request i streamed its n-th token.
Streamed run_streaming(LocalCluster& lc, const std::vector<GenerateRequest>& reqs,
                       const std::function<void(size_t, size_t)>& hook = nullptr) {
  Streamed s;
  s.text.resize(reqs.size());
  s.tokens.resize(reqs.size());
  s.results = lc.generate_many(reqs, 0, [&](size_t i, const std::string& delta, int32_t token) {
    s.text[i] += delta;
    if (token < 0) return;
    s.tokens[i].push_back(token);
    if (hook) hook(i, s.tokens[i].size());
  });
  return s;
}

void expect_same_run(const Streamed& got, const Streamed& want) {
  ASSERT_EQ(got.results.size(), want.results.size());
  for (size_t i = 0; i < want.results.size(); ++i) {
    const GenerateResult& g = got.results[i];
    const GenerateResult& w = want.results[i];
    const std::string what = "request " + std::to_string(i);
    EXPECT_TRUE(g.ok()) << what << ": " << g.error;
    EXPECT_EQ(g.finish_reason, w.finish_reason) << what;
    EXPECT_EQ(g.prompt_tokens, w.prompt_tokens) << what;
    EXPECT_EQ(g.tokens, w.tokens) << what;
    EXPECT_EQ(g.text, w.text) << what;
    ASSERT_EQ(g.logits.size(), w.logits.size()) << what;
    EXPECT_EQ(std::memcmp(g.logits.data(), w.logits.data(), w.logits.size() * 4), 0)
        << what << ": logits differ";
    // Nothing streamed twice, nothing missing: the stream is the result.
    EXPECT_EQ(got.text[i], g.text) << what;
    EXPECT_EQ(got.tokens[i], want.tokens[i]) << what;
  }
}

// Greedy and seeded-temperature requests, token and text prompts, of different lengths.
std::vector<GenerateRequest> mixed_requests(int64_t vocab, int64_t n) {
  std::vector<GenerateRequest> reqs;
  for (uint32_t i = 0; i < 6; ++i) {
    GenerateRequest r = greedy_request(random_prompt(4 + 5 * i, vocab, 700 + i), n + i);
    if (i % 2 == 1) {
      r.sampling.temperature = 0.9f;
      r.sampling.top_k = 40;
      r.sampling.seed = 1000 + i;
    }
    reqs.push_back(r);
  }
  GenerateRequest text;
  text.prompt = "Once upon a time, there was a little";
  text.max_tokens = n;
  text.sampling.temperature = 0.8f;
  text.sampling.seed = 42;
  text.sampling.ignore_eos = true;
  text.return_logits = true;
  reqs.push_back(text);
  return reqs;
}

nlohmann::json stats_of(LocalCluster& lc) { return nlohmann::json::parse(lc.stats_json()); }

void expect_no_blocks_held(const nlohmann::json& st) {
  EXPECT_EQ(st["scheduler"]["running"], 0) << st.dump();
  EXPECT_EQ(st["scheduler"]["waiting"], 0) << st.dump();
  for (const auto& s : st["kv_stages"]) EXPECT_EQ(s["blocks_used"], 0) << st.dump();
}

// A fault injected while request 0 streams its fifth token, into `actor`; the run must equal the
// fault-free one byte for byte and leave no KV behind.
void crash_mid_generation(const std::string& actor, const std::string& restart_key) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto m = load(shared + "/models/stories260K/stories260K.gguf");
  ASSERT_TRUE(m);
  Plan plan = even_plan(m->path, 2, 0);
  plan.scheduler.max_model_len = 128;
  ASSERT_TRUE(resolve_plan(plan, m->spec).has_value());
  auto lc = LocalCluster::start(plan, m);
  ASSERT_TRUE(lc) << lc.error().message;
  auto reqs = mixed_requests(m->spec.n_vocab, 30);
  // A stop string from the middle of the text request's output: the router holds text back while
  // it may match, and that state must survive the failure too.
  const GenerateResult probe = (*lc)->generate(reqs.back());
  ASSERT_GE(probe.text.size(), 30u) << probe.text;
  GenerateRequest stop = reqs.back();
  stop.sampling.stop_strings = {probe.text.substr(20, 6)};
  reqs.push_back(stop);
  const Streamed clean = run_streaming(**lc, reqs);
  ASSERT_EQ(clean.results.back().finish_reason, "stop");
  EXPECT_EQ(stats_of(**lc)["controller"][restart_key], 0);
  bool injected = false;
  const Streamed faulty = run_streaming(**lc, reqs, [&](size_t i, size_t n) {
    if (i != 0 || n != 5 || injected) return;
    injected = true;
    EXPECT_TRUE((*lc)->inject_fault(actor).has_value());
  });
  ASSERT_TRUE(injected);
  expect_same_run(faulty, clean);
  const auto st = stats_of(**lc);
  EXPECT_EQ(st["controller"][restart_key], 1) << st.dump();
  expect_no_blocks_held(st);
  // The replacement serves the next call as well.
  expect_same_run(run_streaming(**lc, reqs), clean);
}

TEST(LocalCluster, SchedulerCrashMidGenerationChangesNoResult) {
  crash_mid_generation("scheduler", "scheduler_restarts");
}

TEST(LocalCluster, RouterCrashMidGenerationChangesNoResultOrStream) {
  crash_mid_generation("router", "router_restarts");
}

TEST(LocalCluster, SchedulerAndStageCrashTogetherChangeNoResult) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto m = load(shared + "/models/synth/mixtral-moe/model.gguf");
  ASSERT_TRUE(m);
  Plan plan = even_plan(m->path, 3, 2);
  plan.scheduler.max_model_len = 128;
  ASSERT_TRUE(resolve_plan(plan, m->spec).has_value());
  ClusterOptions opts;
  opts.expert_timeout_ms = 2000;
  auto lc = LocalCluster::start(plan, m, opts);
  ASSERT_TRUE(lc) << lc.error().message;
  std::vector<GenerateRequest> reqs;
  for (uint32_t i = 0; i < 6; ++i) {
    GenerateRequest r = greedy_request(random_prompt(5 + 3 * i, m->spec.n_vocab, 310 + i), 24);
    if (i % 2 == 1) {
      r.sampling.temperature = 1.0f;
      r.sampling.seed = 77 + i;
    }
    reqs.push_back(r);
  }
  const Streamed clean = run_streaming(**lc, reqs);
  bool injected = false;
  const Streamed faulty = run_streaming(**lc, reqs, [&](size_t i, size_t n) {
    if (i != 2 || n != 3 || injected) return;
    injected = true;
    EXPECT_TRUE((*lc)->inject_fault("scheduler").has_value());
    EXPECT_TRUE((*lc)->inject_fault("stage/2").has_value());
    EXPECT_TRUE((*lc)->inject_fault("router").has_value());
  });
  ASSERT_TRUE(injected);
  expect_same_run(faulty, clean);
  const auto st = stats_of(**lc);
  EXPECT_EQ(st["controller"]["scheduler_restarts"], 1) << st.dump();
  EXPECT_EQ(st["controller"]["router_restarts"], 1) << st.dump();
  EXPECT_EQ(st["controller"]["stage_restarts"][2], 1) << st.dump();
  expect_no_blocks_held(st);
  EXPECT_FALSE((*lc)->inject_fault("scheduler/0").has_value());
}

TEST(LocalCluster, StatsReportEachStagesKvPool) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto m = load(shared + "/models/stories260K/stories260K.gguf");
  ASSERT_TRUE(m);
  Plan plan = even_plan(m->path, 3, 0);
  plan.kv_block_size = 4;
  plan.scheduler.max_model_len = 64;
  ASSERT_TRUE(resolve_plan(plan, m->spec).has_value());
  auto lc = LocalCluster::start(plan, m);
  ASSERT_TRUE(lc) << lc.error().message;
  int64_t pool_blocks = plan.stages[0].kv_blocks;
  for (const auto& s : plan.stages) pool_blocks = std::min(pool_blocks, s.kv_blocks);

  auto check = [&](const nlohmann::json& st) {
    const auto& stages = st["kv_stages"];
    ASSERT_EQ(stages.size(), plan.stages.size()) << st.dump();
    int64_t layer = 0;
    for (size_t i = 0; i < stages.size(); ++i) {
      const auto& s = stages[i];
      EXPECT_EQ(s["stage"], i);
      EXPECT_EQ(s["layers"][0], layer) << st.dump();
      layer = s["layers"][1];
      EXPECT_EQ(s["blocks_total"], pool_blocks);
      EXPECT_EQ(s["blocks_used"].get<int64_t>() + s["blocks_cached"].get<int64_t>() +
                    s["blocks_free"].get<int64_t>(),
                pool_blocks);
      EXPECT_GT(s["block_bytes"], 0);
      EXPECT_EQ(s["bytes_used"],
                s["block_bytes"].get<uint64_t>() * s["blocks_used"].get<uint64_t>());
      EXPECT_GE(s["fragmentation_perc"], 0.0);
      EXPECT_LE(s["fragmentation_perc"], 1.0);
      // Every layer of this model has the same KV width: bytes per block follow the layer count.
      const int64_t n = s["layers"][1].get<int64_t>() - s["layers"][0].get<int64_t>();
      const auto& s0 = stages[0];
      const int64_t n0 = s0["layers"][1].get<int64_t>() - s0["layers"][0].get<int64_t>();
      EXPECT_EQ(s["block_bytes"].get<uint64_t>() * static_cast<uint64_t>(n0),
                s0["block_bytes"].get<uint64_t>() * static_cast<uint64_t>(n));
    }
    EXPECT_EQ(layer, m->spec.n_layer);
  };

  std::vector<GenerateRequest> reqs;
  for (uint32_t i = 0; i < 4; ++i)
    reqs.push_back(greedy_request(random_prompt(9 + 2 * i, m->spec.n_vocab, 60 + i), 20));
  bool sampled = false;
  run_streaming(**lc, reqs, [&](size_t i, size_t n) {
    if (i != 0 || n != 3 || sampled) return;
    sampled = true;
    const auto st = stats_of(**lc);
    check(st);
    EXPECT_GT(st["kv_stages"][0]["blocks_used"], 0) << st.dump();
    EXPECT_GT(st["kv_stages"][0]["bytes_used"], 0) << st.dump();
  });
  ASSERT_TRUE(sampled);
  const auto st = stats_of(**lc);
  check(st);
  expect_no_blocks_held(st);
  // The prompts' full blocks stay in the prefix cache for the next request.
  EXPECT_GT(st["kv_stages"][0]["blocks_cached"], 0) << st.dump();
  EXPECT_EQ(st["kv_stages"][0]["fragmentation_perc"], 0.0) << st.dump();
}

}  // namespace
}  // namespace troupe::actors
