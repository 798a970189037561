// Image encoding (see encoder.h): the front (cache, jobs, layout) and the encoder instances.
#include "actors/encoder.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <list>
#include <map>

#include <caf/actor_system.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/detail/control_wire.h"
#include "actors/local_cluster.h"
#include "base/check.h"
#include "compute/multimodal_prompt.h"
#include "compute/thread_pool.h"
#include "compute/vision_encoder.h"
#include "model/image.h"
#include "model/tokenizer.h"
#include "transport/auth.h"

namespace troupe::actors {

namespace {

using Rows = std::shared_ptr<const std::vector<float>>;

// Encoded rows by the SHA-256 of the image file, least recently used first out.
class RowCache {
 public:
  explicit RowCache(int64_t max_bytes) : max_bytes_(max_bytes) {}
  Rows find(const transport::Digest& key) {
    auto it = map_.find(key);
    if (it == map_.end()) return nullptr;
    order_.splice(order_.end(), order_, it->second.at);  // now the most recent
    return it->second.rows;
  }
  void insert(const transport::Digest& key, Rows rows) {
    const int64_t b = bytes_of(*rows);
    if (b > max_bytes_ || map_.count(key)) return;
    while (bytes_ + b > max_bytes_) {
      auto old = map_.find(order_.front());
      bytes_ -= bytes_of(*old->second.rows);
      map_.erase(old);
      order_.pop_front();
    }
    order_.push_back(key);
    map_.emplace(key, Entry{std::move(rows), std::prev(order_.end())});
    bytes_ += b;
  }
  int64_t bytes() const { return bytes_; }
  size_t size() const { return map_.size(); }

 private:
  static int64_t bytes_of(const std::vector<float>& v) {
    return static_cast<int64_t>(v.size() * sizeof(float));
  }
  struct Entry {
    Rows rows;
    std::list<transport::Digest>::iterator at;
  };
  int64_t max_bytes_ = 0, bytes_ = 0;
  std::list<transport::Digest> order_;
  std::map<transport::Digest, Entry> map_;
};

using Clock = std::chrono::steady_clock;
using Digest = transport::Digest;

// How long a job may wait with no instance to run it (the node of the only one is gone and the
// head re-places it), and how often an unreachable instance is tried again for one image.
constexpr auto kNoEncoderWait = std::chrono::seconds(120);
constexpr int kMaxTries = 5;
// An instance that has not answered a job within this time is taken as lost (the job goes to
// another, or fails): far above any image's encoding time on a CPU.
constexpr auto kJobTimeout = std::chrono::minutes(10);

// The cache key of an image file (and its content key in the prefix cache).
Digest key_of(const std::string& bytes) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  return transport::hmac_sha256("troupe image cache", "image file",
                                {std::span<const uint8_t>(data, bytes.size())});
}

// --- an encoder instance --------------------------------------------------------------------

struct WorkerState {
  std::unique_ptr<compute::VisionEncoder> encoder;
  static inline const char* name = "image_encoder";
};

ImageWorkerActor::behavior_type worker_behavior(
    ImageWorkerActor::stateful_pointer<WorkerState> self,
    std::shared_ptr<std::unique_ptr<compute::VisionEncoder>> made) {
  self->state.encoder = std::move(*made);
  return {
      [=](image_atom, const ImageJobPtr& job) -> ImageRowsPtr {
        auto out = std::make_shared<ImageRows>();
        if (!job || !job->bytes) {
          out->error = "an image job without bytes";
          return out;
        }
        const auto t0 = Clock::now();
        const auto* data = reinterpret_cast<const uint8_t*>(job->bytes->data());
        auto image =
            model::decode_image(std::span<const uint8_t>(data, job->bytes->size()), job->what);
        if (!image) {
          out->error = image.error().message;
          return out;
        }
        auto e = self->state.encoder->encode(*image);
        out->seconds = std::chrono::duration<double>(Clock::now() - t0).count();
        if (!e) {
          out->error = job->what + ": " + e.error().message;
          return out;
        }
        out->rows = std::make_shared<const std::vector<float>>(std::move(*e));
        return out;
      },
  };
}

// --- the front -----------------------------------------------------------------------------

// One image file being encoded (or waiting for an instance), shared by every request that sent
// the same bytes meanwhile.
struct Job {
  std::shared_ptr<const std::string> bytes;
  std::string what;
  std::vector<std::pair<uint64_t, size_t>> waiters;  // (request, image index)
  uint64_t attempt = 0;                              // of the dispatch whose answer counts
  caf::actor_addr worker;                            // that dispatch's instance; null while waiting
  int tries = 0;                 // dispatches that found their instance unreachable
  caf::actor_addr failed_on;     // the last of them: the next try prefers another
  Clock::time_point since;       // waiting for an instance since
  Clock::time_point not_before;  // waiting: next try not before (backs off after a failure)
};

// A request whose images are being encoded.
struct Pending {
  caf::typed_response_promise<EncodedPromptPtr> promise;
  GenerateRequestPtr req;
  std::vector<Digest> keys;
  std::vector<Rows> rows;
  size_t missing = 0;
};

struct FrontState {
  std::shared_ptr<const model::Model> model;
  std::shared_ptr<const model::VisionModel> vision;
  std::unique_ptr<RowCache> cache;
  std::shared_ptr<EncoderCounters> n;
  std::map<uint64_t, Pending> requests;
  std::map<Digest, Job> jobs;
  std::vector<ImageWorkerActor> instances;
  uint64_t next_request = 1, next_attempt = 1;
  bool timer = false;  // a (deadline) is on its way
  std::string none;    // why there is no instance and none is coming; "" = one is or may be
  static inline const char* name = "encoder";
};

using Front = EncoderActor::stateful_pointer<FrontState>;

void dispatch(Front self, const Digest& key);

void arm_timer(Front self, Clock::duration after) {
  if (self->state.timer) return;
  self->state.timer = true;
  self->delayed_send(
      self,
      std::chrono::duration_cast<std::chrono::milliseconds>(after) + std::chrono::milliseconds(1),
      deadline_atom::value);
}

void answer(Front self, uint64_t id, std::string error) {
  auto& st = self->state;
  auto it = st.requests.find(id);
  if (it == st.requests.end()) return;
  Pending p = std::move(it->second);
  st.requests.erase(it);
  auto out = std::make_shared<EncodedPrompt>();
  if (error.empty()) {
    std::vector<std::vector<float>> rows;
    rows.reserve(p.rows.size());
    for (const Rows& r : p.rows) rows.push_back(*r);
    auto laid = compute::build_multimodal_prompt(*st.model->tokenizer, p.req->prompt, rows,
                                                 st.vision->spec, p.req->add_bos);
    if (laid) {
      laid->image_keys = std::move(p.keys);
      out->prompt = std::make_shared<const compute::MultimodalPrompt>(std::move(*laid));
    } else {
      error = laid.error().message;
    }
  }
  if (!error.empty()) {
    ++st.n->failed;
    out->error = std::move(error);
  }
  p.promise.deliver(EncodedPromptPtr(std::move(out)));
}

void fail_job(Front self, const Digest& key, const std::string& why) {
  auto& st = self->state;
  auto it = st.jobs.find(key);
  if (it == st.jobs.end()) return;
  auto waiters = std::move(it->second.waiters);
  st.jobs.erase(it);
  for (const auto& [id, index] : waiters) answer(self, id, why);
}

void on_rows(Front self, const Digest& key, uint64_t attempt, const ImageRowsPtr& r) {
  auto& st = self->state;
  auto it = st.jobs.find(key);
  if (it == st.jobs.end() || it->second.attempt != attempt) return;  // re-sent meanwhile
  Job& job = it->second;
  const caf::actor_addr failed_on = job.worker;
  job.worker = caf::actor_addr{};
  if (!r->error.empty()) {
    if (!r->retry || ++job.tries >= kMaxTries) return fail_job(self, key, r->error);
    job.failed_on = failed_on;
    ++st.n->retried;
    std::fprintf(stderr, "troupe: encoder: %s: %s; trying again\n", job.what.c_str(),
                 r->error.c_str());
    job.since = Clock::now();
    job.not_before = job.since + std::chrono::milliseconds(100 << job.tries);
    return arm_timer(self, job.not_before - job.since);
  }
  const auto& spec = st.vision->spec;
  const size_t want = static_cast<size_t>(spec.n_image_tokens() * spec.n_embd_out);
  if (!r->rows || r->rows->size() != want)
    return fail_job(self, key,
                    strfmt("%s: the encoder answered %zu values, expected %zu", job.what.c_str(),
                           r->rows ? r->rows->size() : size_t{0}, want));
  ++st.n->encoded;
  st.n->encode_us += static_cast<uint64_t>(r->seconds * 1e6);
  st.cache->insert(key, r->rows);
  st.n->cache_entries = st.cache->size();
  st.n->cache_bytes = static_cast<uint64_t>(st.cache->bytes());
  auto waiters = std::move(job.waiters);
  st.jobs.erase(it);
  for (const auto& [id, index] : waiters) {
    auto p = st.requests.find(id);
    if (p == st.requests.end()) continue;
    p->second.rows[index] = r->rows;
    if (--p->second.missing == 0) answer(self, id, "");
  }
}

// Sends the job to the instance with the fewest jobs, or leaves it waiting.
void dispatch(Front self, const Digest& key) {
  auto& st = self->state;
  Job& job = st.jobs.at(key);
  if (st.instances.empty() || Clock::now() < job.not_before)
    return arm_timer(self, st.instances.empty() ? Clock::duration(kNoEncoderWait)
                                                : job.not_before - Clock::now());
  // The instance with the fewest jobs in hand, not the one that just failed this job if there is
  // another.
  const ImageWorkerActor* best = nullptr;
  size_t best_jobs = 0;
  for (const auto& in : st.instances) {
    if (in.address() == job.failed_on && st.instances.size() > 1) continue;
    size_t jobs = 0;
    for (const auto& [k, other] : st.jobs) jobs += other.worker == in.address();
    if (!best || jobs < best_jobs) {
      best = &in;
      best_jobs = jobs;
    }
  }
  job.worker = best->address();
  job.attempt = st.next_attempt++;
  const uint64_t attempt = job.attempt;
  auto msg = std::make_shared<const ImageJob>(ImageJob{job.bytes, job.what});
  self->request(*best, kJobTimeout, image_atom::value, ImageJobPtr(msg))
      .then([self, key, attempt](const ImageRowsPtr& r) { on_rows(self, key, attempt, r); },
            [self, key, attempt](const caf::error& e) {
              auto r = std::make_shared<ImageRows>();
              r->error = "the image encoder did not answer: " + self->system().render(e);
              r->retry = true;
              on_rows(self, key, attempt, r);
            });
}

EncodedPromptPtr refuse(FrontState& st, std::string why) {
  ++st.n->failed;
  return std::make_shared<EncodedPrompt>(EncodedPrompt{nullptr, std::move(why)});
}

EncoderActor::behavior_type front_behavior(Front self, std::shared_ptr<const model::Model> model,
                                           std::shared_ptr<const model::VisionModel> vision,
                                           int64_t cache_bytes,
                                           std::shared_ptr<EncoderCounters> counters) {
  auto& st = self->state;
  st.model = std::move(model);
  st.vision = std::move(vision);
  st.cache = std::make_unique<RowCache>(cache_bytes);
  st.n = std::move(counters);
  return {
      [=](encode_atom, const GenerateRequestPtr& req) -> caf::result<EncodedPromptPtr> {
        auto& st = self->state;
        ++st.n->requests;
        if (!req->image_files) return refuse(st, "the request has no image files");
        if (!req->prompt_tokens.empty())
          return refuse(st,
                        "a prompt with images must be text, with a <__media__> marker where each "
                        "image goes, not token ids");
        if (!st.none.empty()) return refuse(st, st.none);
        const uint64_t id = st.next_request++;
        Pending& p = st.requests[id];
        p.promise = self->make_response_promise<EncodedPromptPtr>();
        p.req = req;
        auto promise = p.promise;
        const std::vector<std::string>& files = *req->image_files;
        p.rows.resize(files.size());
        std::vector<Digest> fresh;
        for (size_t i = 0; i < files.size(); ++i) {
          ++st.n->images;
          const Digest key = key_of(files[i]);
          p.keys.push_back(key);
          if (Rows r = st.cache->find(key)) {
            ++st.n->cache_hits;
            p.rows[i] = r;
            continue;
          }
          ++p.missing;
          Job& job = st.jobs[key];
          if (job.waiters.empty() && !job.bytes) {
            job.bytes = std::make_shared<const std::string>(files[i]);
            job.what = strfmt("image %zu", i + 1);
            job.since = Clock::now();
            fresh.push_back(key);
          } else {
            ++st.n->cache_hits;  // being encoded for another request: encoded once for both
          }
          job.waiters.emplace_back(id, i);
        }
        if (p.missing == 0) answer(self, id, "");
        for (const Digest& k : fresh) dispatch(self, k);
        return promise;
      },
      [=](encoders_atom, const std::string& why) {
        auto& st = self->state;
        st.none = why.empty() ? "no image encoder is placed" : why;
        st.instances.clear();
        std::vector<Digest> all;
        for (const auto& [key, job] : st.jobs) all.push_back(key);
        for (const Digest& k : all) fail_job(self, k, st.none);
      },
      [=](encoders_atom, const std::vector<ImageWorkerActor>& list) {
        auto& st = self->state;
        st.none.clear();
        st.instances.clear();
        for (const auto& a : list)
          if (a) st.instances.push_back(a);
        // Jobs on instances that stay keep them; the others go out again.
        std::vector<Digest> resend;
        for (const auto& [key, job] : st.jobs) {
          const caf::actor_addr& on = job.worker;
          const bool kept = std::any_of(st.instances.begin(), st.instances.end(),
                                        [&on](const auto& in) { return in.address() == on; });
          if (!kept) resend.push_back(key);
        }
        for (const Digest& k : resend) {
          Job& job = st.jobs.at(k);
          if (job.worker) ++st.n->retried;  // it was on an instance that is gone
          job.worker = caf::actor_addr{};
          job.attempt = 0;  // an answer of the old dispatch no longer counts
          job.not_before = Clock::time_point{};
          job.since = Clock::now();
          dispatch(self, k);
        }
      },
      [=](deadline_atom) {
        auto& st = self->state;
        st.timer = false;
        const auto now = Clock::now();
        std::vector<Digest> due, late;
        Clock::duration next = Clock::duration::max();
        for (const auto& [key, job] : st.jobs) {
          if (job.worker) continue;  // with an instance
          if (st.instances.empty()) {
            if (now - job.since >= kNoEncoderWait)
              late.push_back(key);
            else
              next = std::min(next, job.since + kNoEncoderWait - now);
          } else if (now >= job.not_before) {
            due.push_back(key);
          } else {
            next = std::min(next, job.not_before - now);
          }
        }
        for (const Digest& k : late)
          fail_job(self, k,
                   "no image encoder is reachable: the node of every [[encoder]] is gone and none "
                   "was re-placed within " +
                       std::to_string(kNoEncoderWait.count()) + " s");
        for (const Digest& k : due) dispatch(self, k);
        if (next != Clock::duration::max()) arm_timer(self, next);
      },
  };
}

}  // namespace

detail::EncoderInfo encoder_info(const std::string& mmproj_path, const EncoderCounters& c) {
  return {std::filesystem::path(mmproj_path).filename().string(),
          c.requests,
          c.images,
          c.encoded,
          c.cache_hits,
          c.failed,
          static_cast<double>(c.encode_us) * 1e-6,
          c.cache_entries,
          c.cache_bytes,
          c.retried};
}

Result<EncoderActor> spawn_encoder(caf::actor_system& sys, EncoderConfig cfg) {
  if (!cfg.vision || !cfg.model)
    return Error{1, "image encoder: no vision model or language model"};
  if (auto st = compute::check_vision_pair(cfg.model->tokenizer.get(), cfg.model->spec.n_embd,
                                           cfg.vision->spec);
      !st)
    return st.error();
  if (!cfg.counters) cfg.counters = std::make_shared<EncoderCounters>();
  return sys.spawn(front_behavior, std::move(cfg.model), std::move(cfg.vision),
                   std::max<int64_t>(0, cfg.cache_bytes), std::move(cfg.counters));
}

Result<ImageWorkerActor> spawn_image_worker(caf::actor_system& sys,
                                            std::shared_ptr<const model::VisionModel> vision,
                                            int threads) {
  if (!vision) return Error{1, "image encoder: no vision model"};
  auto enc =
      compute::VisionEncoder::create(std::move(vision), compute::resolve_threads(threads, 1));
  if (!enc) return enc.error();
  auto made = std::make_shared<std::unique_ptr<compute::VisionEncoder>>(std::move(*enc));
  return sys.spawn<caf::detached>(worker_behavior, std::move(made));
}

Result<EncoderActor> spawn_local_encoder(caf::actor_system& sys, EncoderConfig cfg,
                                         const std::vector<int>& threads) {
  auto vision = cfg.vision;
  auto front = spawn_encoder(sys, std::move(cfg));
  if (!front) return front.error();
  std::vector<ImageWorkerActor> workers;
  for (int t : threads) {
    auto w = spawn_image_worker(sys, vision, t);
    if (!w) {
      caf::anon_send_exit(*front, caf::exit_reason::user_shutdown);
      for (auto& x : workers) caf::anon_send_exit(x, caf::exit_reason::user_shutdown);
      return w.error();
    }
    workers.push_back(*w);
  }
  caf::anon_send(*front, encoders_atom::value, workers);
  caf::actor_cast<caf::actor>(*front)->attach_functor([workers](const caf::error&) {
    for (auto& w : workers) caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
  });
  return front;
}

}  // namespace troupe::actors
