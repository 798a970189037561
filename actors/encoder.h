// Image encoding (actors/encoder.cc). Two actors:
// - the encoder front (EncoderActor, one, on the head or in LocalCluster): turns a request's image
//   files (PNG or JPEG bytes, as a client sent them) into the multimodal prompt the scheduler
//   runs. It keeps encoded rows cached by a SHA-256 digest (an HMAC with a fixed key) of the
//   file's bytes, so a conversation that sends the same image every turn encodes it once; hands
//   each cache miss to the encoder instance with the fewest jobs (one job per distinct image in
//   flight); and lays the text prompt out around the rows (compute/multimodal_prompt.h).
// - encoder instances (ImageWorkerActor, [[encoder]] in the plan): decode, preprocess and run the
//   vision encoder, each on its own thread (spawned detached: an image takes seconds). One on
//   another node is reached through a proxy (detail/remote.h) over the EncodeImage /
//   EncodedImage messages; when that node is gone, the head re-places the instance and the
//   front sends its jobs to the new one.
// Users: the node daemons (node_head.cc, node_place.cc), LocalCluster; the router asks the front
// (router.cc).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include <caf/fwd.hpp>

#include "actors/interfaces.h"
#include "base/result.h"
#include "model/model.h"
#include "model/vision.h"

namespace troupe::actors {

/// What the encoder has done, readable from any thread (the node's status snapshot).
struct EncoderCounters {
  std::atomic<uint64_t> requests{0};    // requests laid out or refused
  std::atomic<uint64_t> images{0};      // images of those requests
  std::atomic<uint64_t> encoded{0};     // run through the encoder; the rest came from the cache
  std::atomic<uint64_t> cache_hits{0};  // images found cached, or being encoded already
  std::atomic<uint64_t> failed{0};      // requests refused
  std::atomic<uint64_t> encode_us{0};   // microseconds spent encoding
  std::atomic<uint64_t> cache_entries{0}, cache_bytes{0};
  std::atomic<uint64_t> retried{0};  // jobs sent again: a retryable failure, their instance gone
};

namespace detail {
struct EncoderInfo;  // detail/control_wire.h
}  // namespace detail

/// The counts as the status snapshot carries them, the encoder named by its file name.
detail::EncoderInfo encoder_info(const std::string& mmproj_path, const EncoderCounters& c);

struct EncoderConfig {
  std::shared_ptr<const model::VisionModel> vision;  // the mmproj (its spec: rows per image)
  std::shared_ptr<const model::Model> model;         // the language model: tokenizer and width
  int64_t cache_bytes = int64_t{256} << 20;          // encoded rows kept; 0 = no cache
  std::shared_ptr<EncoderCounters> counters;         // kept up to date when set
};

/// Checks that the encoder and the language model belong together (row width, a vocabulary,
/// Gemma 3's image tokens) and spawns the front, with no instance yet (send it (encoders, ...)).
/// Errors name the mismatch.
Result<EncoderActor> spawn_encoder(caf::actor_system& sys, EncoderConfig cfg);

/// Spawns an encoder instance computing on `threads` threads (0 = all cores).
Result<ImageWorkerActor> spawn_image_worker(caf::actor_system& sys,
                                            std::shared_ptr<const model::VisionModel> vision,
                                            int threads);

/// A front with local instances, one per entry of `threads` (each its compute threads, 0 = all
/// cores): spawn_encoder, spawn_image_worker, and the list sent. The instances stop with it.
Result<EncoderActor> spawn_local_encoder(caf::actor_system& sys, EncoderConfig cfg,
                                         const std::vector<int>& threads);

}  // namespace troupe::actors
