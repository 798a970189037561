// Image encoder actor (actors/encoder.cc): turns a request's image files (PNG or JPEG bytes, as a
// client sent them) into the multimodal prompt the scheduler runs: decode, preprocess, the vision
// encoder, then the prompt text split at its <__media__> markers with the rows in their places
// (compute/multimodal_prompt.h). Runs on its own thread (spawned detached): encoding an image
// takes seconds and must not stall the router. Rows are cached by a SHA-256 digest (an HMAC with
// a fixed key) of the file's bytes, so a conversation that sends the same image every turn
// encodes it once.
// Users: the head node (node_head.cc), LocalCluster; the router asks it (router.cc).
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
  std::atomic<uint64_t> requests{0};  // requests laid out or refused
  std::atomic<uint64_t> images{0};    // images of those requests
  std::atomic<uint64_t> encoded{0};   // run through the encoder; the rest came from the cache
  std::atomic<uint64_t> cache_hits{0};
  std::atomic<uint64_t> failed{0};     // requests refused
  std::atomic<uint64_t> encode_us{0};  // microseconds spent encoding
  std::atomic<uint64_t> cache_entries{0}, cache_bytes{0};
};

namespace detail {
struct EncoderInfo;  // detail/control_wire.h
}  // namespace detail

/// The counts as the status snapshot carries them, the encoder named by its file name.
detail::EncoderInfo encoder_info(const std::string& mmproj_path, const EncoderCounters& c);

struct EncoderConfig {
  std::shared_ptr<const model::VisionModel> vision;  // the mmproj
  std::shared_ptr<const model::Model> model;         // the language model: tokenizer and width
  int threads = 0;                                   // encoder compute threads; 0 = all cores
  int64_t cache_bytes = int64_t{256} << 20;          // encoded rows kept; 0 = no cache
  std::shared_ptr<EncoderCounters> counters;         // kept up to date when set
};

/// Checks that the encoder and the language model belong together (row width, a vocabulary,
/// Gemma 3's image tokens) and spawns the actor. Errors name the mismatch.
Result<EncoderActor> spawn_encoder(caf::actor_system& sys, EncoderConfig cfg);

}  // namespace troupe::actors
