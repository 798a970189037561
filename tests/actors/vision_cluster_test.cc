// Image prompts through the actor system: for plans of 1 to 4 stages, with the prefix cache on
// and off and scheduler budgets that cut the prompt before, inside and after the image, every
// greedy token and logit is bit-identical to the single-process engine; two images behind the
// same text never share KV; and a Gemma 3 image is prefilled as one non-causal step, even when
// it is longer than the step budget. Requests that carry image files are laid out by the
// cluster's encoder actor exactly as here, encode each distinct image once, and bad ones get
// errors naming the image.
#include <cstring>
#include <random>

#include <nlohmann/json.hpp>

#include "actors/local_cluster.h"
#include "actors/plan.h"
#include "compute/engine.h"
#include "compute/multimodal_prompt.h"
#include "compute/sampler.h"
#include "compute/vision_encoder.h"
#include "model/image.h"
#include "model/model.h"
#include "model/synth.h"
#include "model/tokenizer.h"
#include "model/vision.h"
#include "tests/actors/solo_reference.h"
#include "tests/test_support.h"

namespace troupe::actors {
namespace {

using compute::MultimodalPrompt;

GenerateRequest request(const MultimodalPrompt& p, int64_t n) {
  GenerateRequest r;
  r.images = std::make_shared<const MultimodalPrompt>(p);
  r.max_tokens = n;
  r.sampling.ignore_eos = true;
  r.return_logits = true;
  return r;
}

// Runs `reqs` on every plan of 1..max_stages stages x prefix cache on/off x the budgets, each
// result against its solo reference.
void expect_plans_match(std::shared_ptr<const model::Model> m, int64_t max_stages,
                        const std::vector<int64_t>& budgets,
                        const std::vector<MultimodalPrompt>& prompts, int64_t n_gen) {
  std::vector<Reference> refs;
  std::vector<GenerateRequest> reqs;
  for (const auto& p : prompts) {
    refs.push_back(solo(m, p, n_gen));
    reqs.push_back(request(p, n_gen));
  }
  for (int64_t ns = 1; ns <= max_stages; ++ns)
    for (bool prefix : {true, false})
      for (int64_t budget : budgets) {
        Plan plan = even_plan(m->path, ns, 0);
        plan.scheduler.prefix_cache = prefix;
        plan.scheduler.max_tokens_per_step = budget;
        plan.scheduler.max_sequences = 8;
        plan.scheduler.max_model_len = 128;
        ASSERT_TRUE(resolve_plan(plan, m->spec).has_value());
        auto lc = LocalCluster::start(plan, m);
        ASSERT_TRUE(lc) << lc.error().message;
        const auto res = (*lc)->generate_many(reqs);
        const std::string what = "stages=" + std::to_string(ns) +
                                 " prefix=" + std::to_string(prefix) +
                                 " budget=" + std::to_string(budget);
        for (size_t i = 0; i < reqs.size(); ++i)
          expect_identical(res[i], refs[i], what + " request " + std::to_string(i));
      }
}

TEST(VisionCluster, LlavaPromptsMatchTheEngineOnEveryPlan) {
  TROUPE_SHARED_OR_SKIP(shared);
  Llava l;
  ASSERT_NO_FATAL_FAILURE(load_llava(shared, &l));
  auto& m = l.m;
  auto& vm = l.vm;
  auto& enc = l.enc;
  // Three images behind the same text (so the prefix cache sees equal placeholders with other
  // rows), the text alone, and an image with no text after it.
  std::vector<MultimodalPrompt> prompts;
  for (const char* img : {"circles_64x64", "checker_50x40", "gradient_32x32"})
    prompts.push_back(reference_prompt(**m, **enc,
                                       "Look at this picture: <__media__>\nOnce upon a time",
                                       {shared + "/golden/vlm/images/" + img + ".png"}));
  auto tail = compute::build_multimodal_prompt(
      *(*m)->tokenizer, "A cat <__media__>",
      std::vector<std::vector<float>>{std::vector<float>(prompts[0].embd)}, (*vm)->spec, true);
  ASSERT_TRUE(tail) << tail.error().message;
  prompts.push_back(*tail);
  MultimodalPrompt text;
  text.tokens = (*m)->tokenizer->encode("Look at this picture: and then", true);
  prompts.push_back(text);
  expect_plans_match(*m, 4, {5, 16, 512}, prompts, 8);
}

// n rows [n, E] of deterministic values of about unit size.
std::vector<float> rows(int64_t n, int64_t E, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(static_cast<size_t>(n * E));
  for (float& x : v) x = d(rng);
  return v;
}

TEST(VisionCluster, Gemma3NonCausalImageIsOneStepOnEveryPlan) {
  testing::TempDir dir;
  model::SynthOptions o;
  o.arch = "gemma3";
  o.seed = 47;
  o.n_ctx = 256;
  o.sliding_window = 4;
  const std::string path = dir.file("gemma3.gguf");
  ASSERT_TRUE(model::synth_model(o, path).has_value());
  auto m = model::load_model(path);
  ASSERT_TRUE(m) << m.error().message;
  const int64_t E = (*m)->spec.n_embd;
  const int32_t I = compute::SeqStep::kEmbedded;
  std::vector<MultimodalPrompt> prompts(2);
  // 7 text tokens, a 6-position image, 5 tokens, a 3-position image, 2 tokens.
  prompts[0].tokens = {1, 40, 41, 42, 43, 44, 45, I, I, I,  I, I,
                       I, 50, 51, 52, 53, 54, I,  I, I, 60, 61};
  prompts[0].images = {{7, 6}, {18, 3}};
  prompts[0].embd = rows(9, E, 5);
  prompts[0].non_causal_images = true;
  // The same text with other image rows: no KV may be shared past the first image.
  prompts[1] = prompts[0];
  prompts[1].embd = rows(9, E, 6);
  // Budgets below the image's length (it goes whole, alone), inside it and above the prompt.
  expect_plans_match(*m, 2, {4, 9, 512}, prompts, 6);
}

TEST(VisionCluster, ImageFilesAreLaidOutByTheClusterEncoderAndEncodedOnce) {
  TROUPE_SHARED_OR_SKIP(shared);
  Llava l;
  ASSERT_NO_FATAL_FAILURE(load_llava(shared, &l));
  auto& m = l.m;
  auto& vm = l.vm;
  auto& enc = l.enc;
  const std::string dir = shared + "/golden/vlm/images/";
  // One image each, then two in one prompt (both seen before: taken from the cache).
  struct Case {
    std::string text;
    std::vector<std::string> images;
  };
  const std::vector<Case> cases = {
      {"Look at this picture: <__media__>\nOnce upon a time", {"circles_64x64"}},
      {"Look at this picture: <__media__>\nOnce upon a time", {"checker_50x40"}},
      {"<__media__> what is it", {"gradient_32x32"}},
      {"First <__media__> then <__media__> and", {"checker_50x40", "circles_64x64"}},
  };
  std::vector<Reference> refs;
  std::vector<GenerateRequest> reqs;
  for (const Case& c : cases) {
    std::vector<std::string> paths, files;
    for (const auto& img : c.images) {
      paths.push_back(dir + img + ".png");
      files.push_back(image_file(paths.back()));
    }
    refs.push_back(solo(*m, reference_prompt(**m, **enc, c.text, paths), 6));
    reqs.push_back(file_request(c.text, files, 6));
  }
  Plan plan = even_plan((*m)->path, 2, 0);
  plan.scheduler.max_tokens_per_step = 16;  // the prompts are cut inside their images
  ASSERT_TRUE(resolve_plan(plan, (*m)->spec).has_value());
  ClusterOptions opts;
  opts.vision = *vm;
  opts.vision_threads = 1;
  auto lc = LocalCluster::start(plan, *m, opts);
  ASSERT_TRUE(lc) << lc.error().message;
  const auto encoder_stats = [&] { return nlohmann::json::parse((*lc)->stats_json())["encoder"]; };
  for (int round = 0; round < 2; ++round) {
    const auto res = (*lc)->generate_many(reqs);
    for (size_t i = 0; i < reqs.size(); ++i)
      expect_identical(res[i], refs[i],
                       "round " + std::to_string(round) + " request " + std::to_string(i));
    // Each distinct image is encoded once; every later sight of it comes from the cache.
    const auto s = encoder_stats();
    EXPECT_EQ(s["encoded"], 3) << s;
    EXPECT_EQ(s["cache_hits"], round == 0 ? 2 : 7) << s;
    EXPECT_EQ(s["cache_entries"], 3) << s;
  }

  // Bad requests get an error naming the image, and the cluster goes on serving.
  const std::string png = image_file(dir + "circles_64x64.png");
  const std::vector<std::pair<GenerateRequest, std::string>> bad = {
      {file_request("<__media__>", {"hello"}, 2), "image 1: unknown image format"},
      {file_request("<__media__> <__media__>", {png, png.substr(0, png.size() / 2)}, 2),
       "image 2:"},
      {file_request("one <__media__>", {png, png}, 2), "1 image markers"},
  };
  for (const auto& [req, want] : bad) {
    auto r = (*lc)->generate(req);
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.finish_reason, "error");
    EXPECT_NE(r.error.find(want), std::string::npos) << r.error;
  }
  GenerateRequest tokens = file_request("", {png}, 2);
  tokens.prompt_tokens = {1, 2, 3};
  auto rt = (*lc)->generate(tokens);
  EXPECT_NE(rt.error.find("must be text"), std::string::npos) << rt.error;
  EXPECT_EQ(encoder_stats()["failed"], 4);
  expect_identical((*lc)->generate(reqs[0]), refs[0], "after the bad requests");
}

// A chat that sends its picture again every turn: the second turn's prompt starts with the
// first's, image included, so its KV comes from the prefix cache through the image (the
// encoder's content key names it); tokens and logits stay the engine's. Another picture behind
// the same text reuses only the text before it. Runs on model m with encoder vm, 2 stages, KV
// blocks of 4.
void expect_chat_reuses_image_kv(std::shared_ptr<const model::Model> m,
                                 std::shared_ptr<const model::VisionModel> vm,
                                 const std::string& images_dir) {
  auto enc = compute::VisionEncoder::create(vm, 1);
  ASSERT_TRUE(enc);
  Plan plan = even_plan(m->path, 2, 0);
  plan.kv_block_size = 4;
  plan.scheduler.max_model_len = 160;
  ASSERT_TRUE(resolve_plan(plan, m->spec).has_value());
  ClusterOptions opts;
  opts.vision = vm;
  opts.vision_threads = 1;
  auto lc = LocalCluster::start(plan, m, opts);
  ASSERT_TRUE(lc) << lc.error().message;
  const auto hits = [&] {
    return nlohmann::json::parse((*lc)->stats_json())["scheduler"]["prefix_hit_tokens"]
        .get<int64_t>();
  };
  // The reference: the prompt laid out here, run alone on the engine; and where its image ends.
  const auto expect_turn = [&](const std::string& text, const std::string& img, int64_t min_hit,
                               int64_t max_hit, const std::string& what) {
    const std::string path = images_dir + img + ".png";
    const MultimodalPrompt p = reference_prompt(*m, **enc, text, {path});
    ASSERT_EQ(p.images.size(), 1u);
    const int64_t image_end = p.images[0].begin + p.images[0].count;
    const int64_t before = hits();
    expect_identical((*lc)->generate(file_request(text, {image_file(path)}, 5)), solo(m, p, 5),
                     what);
    const int64_t hit = hits() - before;
    const int64_t bs = plan.kv_block_size;
    if (min_hit < 0) min_hit = image_end / bs * bs;  // at least every block up to the image's end
    if (max_hit < 0) max_hit = p.images[0].begin / bs * bs + bs - 1;
    EXPECT_GE(hit, min_hit) << what << ": image ends at " << image_end;
    EXPECT_LE(hit, max_hit) << what << ": image starts at " << p.images[0].begin;
  };
  const std::string turn1 = "USER: <__media__>\nWhat is in the picture? ASSISTANT:";
  const std::string turn2 = turn1 + " circles and more USER: and the colours? ASSISTANT:";
  expect_turn(turn1, "circles_64x64", 0, 0, "turn 1");
  expect_turn(turn2, "circles_64x64", -1, 1 << 20, "turn 2, the same picture");
  expect_turn(turn2, "checker_50x40", 0, -1, "turn 2, another picture");
  expect_turn(turn2, "checker_50x40", -1, 1 << 20, "turn 2, that picture again");
}

TEST(VisionCluster, ChatTurnsWithTheSameImageReuseItsKv) {
  TROUPE_SHARED_OR_SKIP(shared);
  Llava l;
  ASSERT_NO_FATAL_FAILURE(load_llava(shared, &l));
  expect_chat_reuses_image_kv(*l.m, *l.vm, shared + "/golden/vlm/images/");
}

// The same for Gemma 3, whose images are non-causal (one step each): a cache hit takes an image
// whole (blocks of 4 and images of 16 positions start mid-block, so a hit inside one is near).
TEST(VisionCluster, Gemma3ChatTurnsReuseTheKvOfWholeImages) {
  TROUPE_SHARED_OR_SKIP(shared);
  testing::TempDir dir;
  model::SynthOptions o;
  o.arch = "gemma3";
  o.seed = 53;
  o.n_ctx = 256;
  o.sliding_window = 4;
  ASSERT_TRUE(model::synth_model(o, dir.file("gemma3.gguf")).has_value());
  auto m = model::load_model(dir.file("gemma3.gguf"));
  ASSERT_TRUE(m) << m.error().message;
  model::MmprojSynthOptions mo;
  mo.projector = "gemma3";
  mo.image_size = 64;
  mo.patch_size = 8;
  mo.n_embd = 64;
  mo.n_ff = 128;
  mo.n_layer = 2;
  mo.n_layer_used = 0;
  mo.n_head = 4;
  mo.merge = 2;
  mo.proj_dim = (*m)->spec.n_embd;
  mo.dtype = model::GgmlType::kF32;
  ASSERT_TRUE(model::synth_mmproj(mo, dir.file("mmproj.gguf")).has_value());
  auto vm = model::load_vision_model(dir.file("mmproj.gguf"));
  ASSERT_TRUE(vm) << vm.error().message;
  expect_chat_reuses_image_kv(*m, *vm, shared + "/golden/vlm/images/");
}

// A request cancelled while the encoder works on its image ends as "cancelled" once the encoder
// is done, and never reaches the scheduler; the cluster serves on.
TEST(VisionCluster, RequestCancelledWhileItsImageIsEncodedEndsCancelled) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto m = model::load_model(shared + "/models/synth/llava-tiny/model.gguf");
  ASSERT_TRUE(m) << m.error().message;
  // An encoder slow enough (a few hundred ms; its first token takes a few ms) that the other
  // request streams before it is done.
  testing::TempDir dir;
  model::MmprojSynthOptions mo;
  mo.image_size = 112;
  mo.n_embd = 768;
  mo.n_ff = 3072;
  mo.n_layer = 8;
  mo.n_layer_used = 0;
  mo.n_head = 12;
  mo.proj_dim = (*m)->spec.n_embd;
  ASSERT_TRUE(model::synth_mmproj(mo, dir.file("slow-mmproj.gguf")).has_value());
  auto vm = model::load_vision_model(dir.file("slow-mmproj.gguf"));
  ASSERT_TRUE(vm) << vm.error().message;
  Plan plan = even_plan((*m)->path, 1, 0);
  ASSERT_TRUE(resolve_plan(plan, (*m)->spec).has_value());
  ClusterOptions opts;
  opts.vision = *vm;
  opts.vision_threads = 1;
  auto lc = LocalCluster::start(plan, *m, opts);
  ASSERT_TRUE(lc) << lc.error().message;
  GenerateRequest text;
  text.prompt = "Once upon a time";
  text.max_tokens = 4;
  text.sampling.ignore_eos = true;
  const std::string png = image_file(shared + "/golden/vlm/images/circles_64x64.png");
  const std::vector<GenerateRequest> reqs = {text, file_request("<__media__> a", {png}, 4)};
  bool cancelled = false;
  const auto res = (*lc)->generate_many(reqs, 0, [&](size_t i, const std::string&, int32_t) {
    if (i == 0 && !cancelled) {
      cancelled = true;
      (*lc)->cancel(1);
    }
  });
  ASSERT_TRUE(cancelled);
  EXPECT_TRUE(res[0].ok()) << res[0].error;
  EXPECT_EQ(res[0].tokens.size(), 4u);
  EXPECT_EQ(res[1].finish_reason, "cancelled") << res[1].error;
  EXPECT_TRUE(res[1].tokens.empty());
  const auto s = nlohmann::json::parse((*lc)->stats_json());
  EXPECT_EQ(s["encoder"]["encoded"], 1) << s;
  EXPECT_EQ(s["scheduler"]["tokens_generated"], 4) << "the cancelled request was scheduled: " << s;
  // The image is cached: the same request again runs at once, whole.
  const auto again = (*lc)->generate(reqs[1]);
  EXPECT_TRUE(again.ok()) << again.error;
  EXPECT_EQ(again.tokens.size(), 4u);
}

TEST(VisionCluster, BadImageRequestsGetErrors) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto m = model::load_model(shared + "/models/synth/llava-tiny/model.gguf");
  ASSERT_TRUE(m);
  Plan plan = even_plan((*m)->path, 2, 0);
  ASSERT_TRUE(resolve_plan(plan, (*m)->spec).has_value());
  auto lc = LocalCluster::start(plan, *m);
  ASSERT_TRUE(lc) << lc.error().message;
  // Image positions in plain token ids.
  GenerateRequest plain;
  plain.prompt_tokens = {1, compute::SeqStep::kEmbedded, 5};
  plain.max_tokens = 2;
  auto r1 = (*lc)->generate(plain);
  EXPECT_FALSE(r1.ok());
  EXPECT_NE(r1.error.find("outside the vocabulary"), std::string::npos) << r1.error;
  // Rows that do not divide among the image positions.
  MultimodalPrompt p;
  p.tokens = {1, compute::SeqStep::kEmbedded, compute::SeqStep::kEmbedded, 5};
  p.images = {{1, 2}};
  p.embd = std::vector<float>(7);
  auto r2 = (*lc)->generate(request(p, 2));
  EXPECT_FALSE(r2.ok());
  EXPECT_NE(r2.error.find("image row values"), std::string::npos) << r2.error;
  // Image files for a cluster without a vision encoder.
  GenerateRequest files;
  files.prompt = "<__media__>";
  files.image_files = std::make_shared<const std::vector<std::string>>(1, "x");
  auto r3 = (*lc)->generate(files);
  EXPECT_FALSE(r3.ok());
  EXPECT_NE(r3.error.find("no vision encoder"), std::string::npos) << r3.error;
}

}  // namespace
}  // namespace troupe::actors
