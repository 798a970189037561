// Image encoder actor (see encoder.h): decode, encode (or take from the cache), lay out.
#include "actors/encoder.h"

#include <chrono>
#include <filesystem>
#include <list>
#include <map>

#include <caf/actor_system.hpp>
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

struct EncoderState {
  std::shared_ptr<const model::Model> model;
  std::shared_ptr<compute::VisionEncoder> encoder;
  std::unique_ptr<RowCache> cache;
  std::shared_ptr<EncoderCounters> n;
  static inline const char* name = "encoder";
};

using Self = EncoderActor::stateful_pointer<EncoderState>;

// The cache key of an image file (and its content key in the prefix cache).
transport::Digest key_of(const std::string& bytes) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  return transport::hmac_sha256("troupe image cache", "image file",
                                {std::span<const uint8_t>(data, bytes.size())});
}

// Rows of one image file: from the cache, or decoded and encoded now.
Result<Rows> rows_of(EncoderState& st, const std::string& bytes, const transport::Digest& key,
                     size_t index) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  if (Rows r = st.cache->find(key)) {
    ++st.n->cache_hits;
    return r;
  }
  const std::string what = strfmt("image %zu", index + 1);
  auto image = model::decode_image(std::span<const uint8_t>(data, bytes.size()), what);
  if (!image) return image.error();
  const auto t0 = std::chrono::steady_clock::now();
  auto e = st.encoder->encode(*image);
  st.n->encode_us += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
          .count());
  if (!e) return Error{e.error().code, what + ": " + e.error().message};
  ++st.n->encoded;
  Rows r = std::make_shared<const std::vector<float>>(std::move(*e));
  st.cache->insert(key, r);
  st.n->cache_entries = st.cache->size();
  st.n->cache_bytes = static_cast<uint64_t>(st.cache->bytes());
  return r;
}

EncodedPromptPtr encode_request(EncoderState& st, const GenerateRequest& req) {
  auto out = std::make_shared<EncodedPrompt>();
  ++st.n->requests;
  const auto fail = [&](std::string why) {
    ++st.n->failed;
    out->error = std::move(why);
    return out;
  };
  if (!req.prompt_tokens.empty())
    return fail(
        "a prompt with images must be text, with a <__media__> marker where each image goes, not "
        "token ids");
  std::vector<std::vector<float>> rows;
  std::vector<std::array<uint8_t, 32>> keys;
  const std::vector<std::string>& files = *req.image_files;
  for (size_t i = 0; i < files.size(); ++i) {
    keys.push_back(key_of(files[i]));
    auto r = rows_of(st, files[i], keys.back(), i);
    if (!r) return fail(r.error().message);
    rows.push_back(**r);
    ++st.n->images;
  }
  auto p = compute::build_multimodal_prompt(*st.model->tokenizer, req.prompt, rows,
                                            st.encoder->spec(), req.add_bos);
  if (!p) return fail(p.error().message);
  p->image_keys = std::move(keys);
  out->prompt = std::make_shared<const compute::MultimodalPrompt>(std::move(*p));
  return out;
}

EncoderActor::behavior_type encoder_behavior(Self self, std::shared_ptr<const model::Model> model,
                                             std::shared_ptr<compute::VisionEncoder> encoder,
                                             int64_t cache_bytes,
                                             std::shared_ptr<EncoderCounters> counters) {
  auto& st = self->state;
  st.model = std::move(model);
  st.encoder = std::move(encoder);
  st.cache = std::make_unique<RowCache>(cache_bytes);
  st.n = std::move(counters);
  return {
      [=](encode_atom, const GenerateRequestPtr& req) -> EncodedPromptPtr {
        if (!req->image_files)
          return std::make_shared<EncodedPrompt>(
              EncodedPrompt{nullptr, "the request has no image files"});
        return encode_request(self->state, *req);
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
          c.cache_bytes};
}

Result<EncoderActor> spawn_encoder(caf::actor_system& sys, EncoderConfig cfg) {
  if (!cfg.vision || !cfg.model)
    return Error{1, "image encoder: no vision model or language model"};
  if (auto st = compute::check_vision_pair(cfg.model->tokenizer.get(), cfg.model->spec.n_embd,
                                           cfg.vision->spec);
      !st)
    return st.error();
  auto enc = compute::VisionEncoder::create(cfg.vision, compute::resolve_threads(cfg.threads, 1));
  if (!enc) return enc.error();
  std::shared_ptr<compute::VisionEncoder> e = std::move(*enc);
  if (!cfg.counters) cfg.counters = std::make_shared<EncoderCounters>();
  return sys.spawn<caf::detached>(encoder_behavior, std::move(cfg.model), std::move(e),
                                  std::max<int64_t>(0, cfg.cache_bytes), std::move(cfg.counters));
}

}  // namespace troupe::actors
