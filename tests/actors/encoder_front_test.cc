// The image encoder front (actors/encoder.h) with real encoder instances: each distinct image is
// encoded once and the jobs are spread over the instances; jobs wait while there is no instance
// and go out when a list arrives; a job whose instance cannot be reached goes to another one, and
// fails with a clear error when none answers. The instances are spawn_image_worker's, seen
// through relays that count their jobs or answer "unreachable" as a proxy does when its link is
// down.
#include <atomic>
#include <chrono>
#include <thread>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <gtest/gtest.h>

#include "actors/encoder.h"
#include "actors/local_cluster.h"
#include "compute/multimodal_prompt.h"
#include "compute/vision_encoder.h"
#include "model/model.h"
#include "model/vision.h"
#include "tests/actors/solo_reference.h"
#include "tests/test_support.h"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;

// Forwards every job to `to` and counts it; with `to` null it answers as a proxy whose link is
// down (a retryable error).
ImageWorkerActor::behavior_type relay(ImageWorkerActor::pointer self, ImageWorkerActor to,
                                      std::shared_ptr<std::atomic<int>> jobs) {
  return {
      [=](image_atom, const ImageJobPtr& job) -> caf::result<ImageRowsPtr> {
        ++*jobs;
        if (!to) {
          auto r = std::make_shared<ImageRows>();
          r->error = "the link to test-node went down";
          r->retry = true;
          return ImageRowsPtr(std::move(r));
        }
        return self->delegate(to, image_atom::value, job);
      },
  };
}

struct Fixture {
  std::string shared, dir;
  std::shared_ptr<const model::Model> m;
  std::shared_ptr<const model::VisionModel> vm;
  std::unique_ptr<compute::VisionEncoder> enc;
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  EncoderActor front;
  std::shared_ptr<EncoderCounters> n = std::make_shared<EncoderCounters>();

  void load(const std::string& s) {
    shared = s;
    dir = shared + "/golden/vlm/images/";
    auto mm = model::load_model(shared + "/models/synth/llava-tiny/model.gguf");
    ASSERT_TRUE(mm) << mm.error().message;
    m = *mm;
    auto v = model::load_vision_model(shared + "/models/synth/llava-tiny/mmproj.gguf");
    ASSERT_TRUE(v) << v.error().message;
    vm = *v;
    auto e = compute::VisionEncoder::create(vm, 1);
    ASSERT_TRUE(e);
    enc = std::move(*e);
    sys = std::make_unique<caf::actor_system>(cfg);
    EncoderConfig ec;
    ec.vision = vm;
    ec.model = m;
    ec.counters = n;
    auto f = spawn_encoder(*sys, ec);
    ASSERT_TRUE(f) << f.error().message;
    front = *f;
  }

  ImageWorkerActor worker() {
    auto w = spawn_image_worker(*sys, vm, 1);
    EXPECT_TRUE(w) << w.error().message;
    return w ? *w : ImageWorkerActor{};
  }

  ImageWorkerActor counted(ImageWorkerActor to, std::shared_ptr<std::atomic<int>> jobs) {
    return sys->spawn(relay, std::move(to), std::move(jobs));
  }

  // Sends the requests at once and waits for every answer (at most `wait`).
  std::vector<EncodedPromptPtr> encode(const std::vector<GenerateRequest>& reqs,
                                       caf::duration wait = caf::duration(60s)) {
    caf::scoped_actor s{*sys};
    std::vector<EncodedPromptPtr> out(reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i)
      s->request(front, wait, encode_atom::value,
                 GenerateRequestPtr(std::make_shared<GenerateRequest>(reqs[i])))
          .receive([&](const EncodedPromptPtr& p) { out[i] = p; },
                   [&](const caf::error& e) {
                     ADD_FAILURE() << "request " << i << ": " << sys->render(e);
                   });
    return out;
  }

  // The prompt laid out from the images encoded here, against the front's.
  void expect_laid_out(const EncodedPromptPtr& got, const std::string& text,
                       const std::vector<std::string>& images) {
    ASSERT_TRUE(got);
    ASSERT_TRUE(got->prompt) << got->error;
    std::vector<std::string> paths;
    for (const auto& i : images) paths.push_back(dir + i + ".png");
    const auto want = reference_prompt(*m, *enc, text, paths);
    EXPECT_EQ(got->prompt->tokens, want.tokens);
    EXPECT_TRUE(got->prompt->embd == want.embd) << "the image rows differ";
    EXPECT_EQ(got->prompt->images.size(), want.images.size());
    EXPECT_EQ(got->prompt->image_keys.size(), images.size());
  }

  GenerateRequest req(const std::string& text, const std::vector<std::string>& images) {
    std::vector<std::string> files;
    for (const auto& i : images) files.push_back(image_file(dir + i + ".png"));
    return file_request(text, files, 1);
  }

  ~Fixture() {
    if (sys) caf::anon_send_exit(front, caf::exit_reason::user_shutdown);
  }
};

TEST(EncoderFront, EachDistinctImageIsEncodedOnceAndTheJobsAreSpread) {
  TROUPE_SHARED_OR_SKIP(shared);
  Fixture f;
  ASSERT_NO_FATAL_FAILURE(f.load(shared));
  auto a = std::make_shared<std::atomic<int>>(0), b = std::make_shared<std::atomic<int>>(0);
  caf::anon_send(f.front, encoders_atom::value,
                 std::vector<ImageWorkerActor>{f.counted(f.worker(), a), f.counted(f.worker(), b)});
  const std::string text = "<__media__> and <__media__>";
  const auto got = f.encode({f.req(text, {"circles_64x64", "checker_50x40"}),
                             f.req(text, {"checker_50x40", "circles_64x64"})});
  f.expect_laid_out(got[0], text, {"circles_64x64", "checker_50x40"});
  f.expect_laid_out(got[1], text, {"checker_50x40", "circles_64x64"});
  // Two distinct images: one job each, one on each instance (the second request's images were
  // cached or being encoded already).
  EXPECT_EQ(a->load(), 1);
  EXPECT_EQ(b->load(), 1);
  EXPECT_EQ(f.n->encoded.load(), 2u);
  EXPECT_EQ(f.n->cache_hits.load(), 2u);
}

TEST(EncoderFront, JobsWaitForAnInstanceAndGoWhenTheListArrives) {
  TROUPE_SHARED_OR_SKIP(shared);
  Fixture f;
  ASSERT_NO_FATAL_FAILURE(f.load(shared));
  caf::scoped_actor s{*f.sys};
  const GenerateRequest r = f.req("<__media__>", {"gradient_32x32"});
  EncodedPromptPtr got;
  auto h = s->request(f.front, caf::duration(60s), encode_atom::value,
                      GenerateRequestPtr(std::make_shared<GenerateRequest>(r)));
  // No instance yet (a placement is under way): the request waits rather than fails.
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(f.n->encoded.load(), 0u);
  EXPECT_EQ(f.n->failed.load(), 0u);
  caf::anon_send(f.front, encoders_atom::value, std::vector<ImageWorkerActor>{f.worker()});
  h.receive([&](const EncodedPromptPtr& p) { got = p; },
            [&](const caf::error& e) { ADD_FAILURE() << f.sys->render(e); });
  f.expect_laid_out(got, "<__media__>", {"gradient_32x32"});
}

TEST(EncoderFront, AJobWhoseInstanceIsUnreachableGoesToAnother) {
  TROUPE_SHARED_OR_SKIP(shared);
  Fixture f;
  ASSERT_NO_FATAL_FAILURE(f.load(shared));
  auto down = std::make_shared<std::atomic<int>>(0), up = std::make_shared<std::atomic<int>>(0);
  // The unreachable one is first: it gets the job (ties go to the first instance).
  caf::anon_send(f.front, encoders_atom::value,
                 std::vector<ImageWorkerActor>{f.counted(ImageWorkerActor{}, down),
                                               f.counted(f.worker(), up)});
  const auto got = f.encode({f.req("<__media__>", {"circles_64x64"})});
  f.expect_laid_out(got[0], "<__media__>", {"circles_64x64"});
  EXPECT_EQ(down->load(), 1);
  EXPECT_EQ(up->load(), 1);
}

TEST(EncoderFront, AJobNoInstanceAnswersFailsNamingWhy) {
  TROUPE_SHARED_OR_SKIP(shared);
  Fixture f;
  ASSERT_NO_FATAL_FAILURE(f.load(shared));
  auto down = std::make_shared<std::atomic<int>>(0);
  caf::anon_send(f.front, encoders_atom::value,
                 std::vector<ImageWorkerActor>{f.counted(ImageWorkerActor{}, down)});
  const auto got = f.encode({f.req("<__media__>", {"circles_64x64"})});
  ASSERT_TRUE(got[0]);
  EXPECT_FALSE(got[0]->prompt);
  EXPECT_NE(got[0]->error.find("the link to test-node went down"), std::string::npos)
      << got[0]->error;
  EXPECT_GE(down->load(), 2);  // tried again before giving up
  EXPECT_EQ(f.n->failed.load(), 1u);
  // A bad image is not retried: one job, and the error names the image.
  auto up = std::make_shared<std::atomic<int>>(0);
  caf::anon_send(f.front, encoders_atom::value,
                 std::vector<ImageWorkerActor>{f.counted(f.worker(), up)});
  const auto bad = f.encode({file_request("<__media__>", {"GIF89a"}, 1)});
  ASSERT_TRUE(bad[0]);
  EXPECT_NE(bad[0]->error.find("image 1: unknown image format"), std::string::npos)
      << bad[0]->error;
  EXPECT_EQ(up->load(), 1);
}

}  // namespace
}  // namespace troupe::actors
