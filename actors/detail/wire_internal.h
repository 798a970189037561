// Internals shared by the wire codecs: actors/wire.cc (steps, outcomes), wire_experts.cc and
// actors/control_wire*.cc (control plane, clients; through detail/control_wire_internal.h).
// Building and finishing a WireFrame, guarded reads of untrusted frames, Header, ErrorReport,
// SamplingParams and SamplerState, length checks. Includes Cap'n Proto headers: only those codec
// .cc files may include it (STYLE.md "Header hygiene"). Thread safety: free functions with no
// shared state.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include "actors/detail/wire.h"
#include "base/check.h"
#include "base/result.h"
#include "compute/sampler.h"
#include "schemas/errc.h"
#include "schemas/frame.h"
#include "schemas/step.capnp.h"
#include "schemas/tensor_codec.h"

namespace troupe::actors::detail {

struct WireFrame::Impl {
  capnp::MallocMessageBuilder builder;
  schemas::FrameGather gather;
  std::vector<std::span<const uint8_t>> iov;
  std::shared_ptr<const void> payload;  // the buffer an external tensor points into
};

namespace wire_internal {

using ImplPtr = std::shared_ptr<WireFrame::Impl>;

inline constexpr uint64_t kMaxU32 = std::numeric_limits<uint32_t>::max();
inline constexpr const char* kErrorDomain = "actors";

inline Error fail(WireErrc e, std::string message) {
  return make_error(code(e), std::move(message));
}

/// Prefixes an error from a schemas/ helper with the field it was reading.
inline Error in_field(const std::string& where, const Error& e) {
  return make_error(e.code, where + ": " + e.message);
}

// ---- Encoding ----------------------------------------------------------------------------------

/// Lays out the finished builder of `impl` as gather pieces and wraps it.
inline WireFrame finish(ImplPtr impl) {
  impl->gather = schemas::frame_gather(impl->builder);
  impl->iov.push_back(impl->gather.table_bytes());
  for (const auto& s : impl->gather.segments) impl->iov.push_back(s);
  return WireFrame(std::move(impl));
}

/// Builds a frame whose root is a `Root`: fill(Root::Builder, WireFrame::Impl&) -> Status writes
/// the content (and may set impl.payload to keep an external tensor alive). A kj::Exception
/// (a list too long for Cap'n Proto, ...) becomes an Errc::kMalformed Error naming `what`.
template <class Root, class Fill>
Result<WireFrame> build_frame(const char* what, Fill&& fill) {
  auto impl = std::make_shared<WireFrame::Impl>();
  try {
    auto root = impl->builder.initRoot<Root>();
    if (Status st = fill(root, *impl); !st) return st.error();
  } catch (const kj::Exception& e) {
    return schemas::malformed_error(what, e);
  }
  return finish(std::move(impl));
}

/// Checks what every sender adds: epoch >= 1 (0 only with allow_zero_epoch), seq >= 1, a known
/// sender role. Errors: WireErrc::kUnencodable naming `what`.
inline Status check_send(uint64_t epoch, const SendInfo& send, const char* what,
                         bool allow_zero_epoch = false) {
  const auto role = static_cast<uint16_t>(send.sender.role);
  if (epoch == 0 && !allow_zero_epoch)
    return fail(WireErrc::kUnencodable, strfmt("%s: epoch 0 is unset", what));
  if (send.seq == 0) return fail(WireErrc::kUnencodable, strfmt("%s: seq 0 is unset", what));
  if (role == 0 || role > uint16_t(ActorRole::kGateway))
    return fail(WireErrc::kUnencodable, strfmt("%s: sender role %u is invalid", what, role));
  return Ok{};
}

inline void write_header(schemas::Header::Builder dst, uint64_t epoch, const SendInfo& send) {
  schemas::set_header(dst, {.cluster_epoch = epoch,
                            .node = send.sender.node,
                            .role = static_cast<schemas::Role>(send.sender.role),
                            .index = send.sender.index,
                            .seq = send.seq});
}

/// ErrorReport{domain "actors", code 0, message cut to kMaxErrorBytes}.
inline void write_error(schemas::ErrorReport::Builder dst, const std::string& message) {
  dst.setDomain(kErrorDomain);
  dst.setCode(0);
  dst.setMessage(message.substr(0, kMaxErrorBytes));
}

// Writes f32 [rows, n_embd] from `data`: in place when Cap'n Proto can read the last word whole
// within the vector's capacity, else as a copy.
inline Status write_f32(schemas::Tensor::Builder dst, const std::vector<float>& data, uint64_t rows,
                        int64_t n_embd) {
  const uint64_t shape[] = {rows, static_cast<uint64_t>(n_embd)};
  std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(data.data()),
                                 data.size() * sizeof(float));
  Status st = schemas::set_tensor_external(dst, schemas::TensorDtype::kF32, shape, bytes,
                                           data.capacity() * 4);
  if (!st && st.error().code == schemas::code(schemas::Errc::kMisaligned))
    st = schemas::set_tensor_copy(dst, schemas::TensorDtype::kF32, shape, bytes);
  return st;
}

inline uint64_t to_ns(double seconds) {
  if (!(seconds > 0)) return 0;  // also NaN
  if (seconds >= 1.8e10) return std::numeric_limits<uint64_t>::max();
  return static_cast<uint64_t>(std::llround(seconds * 1e9));
}

/// Writes p field by field; stop_strings stay out (they have no place in SamplingParams) and
/// numLogprobs is 0 (no home in compute::SamplingParams).
inline void write_sampling(schemas::SamplingParams::Builder dst, const compute::SamplingParams& p) {
  dst.setTemperature(p.temperature);
  dst.setTopK(p.top_k);
  dst.setTopP(p.top_p);
  dst.setMinP(p.min_p);
  dst.setRepetitionPenalty(p.repetition_penalty);
  dst.setPresencePenalty(p.presence_penalty);
  dst.setFrequencyPenalty(p.frequency_penalty);
  dst.setPenaltyLastN(p.penalty_last_n);
  dst.setSeed(p.seed);
  auto stops = dst.initStopTokenIds(static_cast<unsigned>(p.stop_token_ids.size()));
  for (size_t i = 0; i < p.stop_token_ids.size(); ++i) stops.set(unsigned(i), p.stop_token_ids[i]);
  dst.setIgnoreEos(p.ignore_eos);
  dst.setNumLogprobs(0);
  if (!p.grammar.empty()) dst.setGrammar(p.grammar);
}

/// The longest grammar a request may carry (compute::GrammarLimits' default source limit).
inline constexpr size_t kMaxGrammarBytes = size_t{1} << 20;

inline void write_state(schemas::SamplerState::Builder dst, const compute::SamplerState& s) {
  dst.setS0(s.s[0]);
  dst.setS1(s.s[1]);
  dst.setS2(s.s[2]);
  dst.setS3(s.s[3]);
}

// ---- Decoding ----------------------------------------------------------------------------------

/// The error with control characters in its message replaced by spaces: a kj::Exception's
/// description may quote bytes of the hostile message (a newline in a Text, ...), and errors
/// are logged as one line.
inline Error one_line(Error e) {
  for (char& c : e.message)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  return e;
}

/// Validates `frame` (schemas::read_frame with max_bytes) and runs read(Root::Reader) -> Result<T>
/// inside schemas::guard(), so a hostile pointer that Cap'n Proto finds while `read` walks the
/// message becomes an Errc::kMalformed Error naming `what`. Never throws kj exceptions; error
/// messages are one line.
template <class Root, class T, class Read>
Result<T> decode_frame(std::span<const uint8_t> frame, size_t max_bytes, const char* what,
                       Read&& read) {
  auto reader = schemas::read_frame(frame, max_bytes);
  if (!reader) return one_line(reader.error());
  Result<T> out =
      schemas::guard(what, [&]() -> Result<T> { return read((*reader)->getRoot<Root>()); });
  if (!out) return one_line(out.error());
  return out;
}

/// Cap'n Proto's list iterators are not std iterators: copy by index.
template <class List>
std::vector<int32_t> to_vector(const List& list) {
  std::vector<int32_t> out(list.size());
  for (unsigned i = 0; i < list.size(); ++i) out[i] = static_cast<int32_t>(list[i]);
  return out;
}

/// Reads and checks a Header (seq >= 1, known role; the stale/future check when expected_epoch
/// != 0) and, unless allow_zero_epoch, epoch >= 1. Errors name `what`.header.
inline Result<WireHeader> read_wire_header(schemas::Header::Reader src, uint64_t expected_epoch,
                                           const char* what, bool allow_zero_epoch = false) {
  auto h = schemas::read_header(src, expected_epoch);
  if (!h) return in_field(std::string(what) + ".header", h.error());
  if (h->cluster_epoch == 0 && !allow_zero_epoch) {
    return make_error(schemas::code(schemas::Errc::kBadHeader),
                      std::string(what) + ".header: cluster epoch is unset (0)");
  }
  return WireHeader{h->cluster_epoch, ActorRef{h->node, static_cast<ActorRole>(h->role), h->index},
                    h->seq};
}

/// WireErrc::kTooLong unless got <= max.
inline Status check_len(const std::string& where, size_t got, size_t max) {
  if (got <= max) return Ok{};
  return fail(WireErrc::kTooLong,
              strfmt("%s: %zu entries exceed the limit of %zu", where.c_str(), got, max));
}

/// The report's message cut to kMaxErrorBytes; never empty.
inline std::string read_error(schemas::ErrorReport::Reader src) {
  auto text = src.getMessage();
  std::string msg(text.cStr(), std::min<size_t>(text.size(), kMaxErrorBytes));
  if (msg.empty()) {
    msg = strfmt("remote error without a message (domain '%.64s', code %u)", src.getDomain().cStr(),
                 unsigned{src.getCode()});
  }
  return msg;
}

/// A non-zero xoshiro256** state.
inline Result<compute::SamplerState> read_state(schemas::SamplerState::Reader src,
                                                const std::string& where) {
  compute::SamplerState s;
  s.s[0] = src.getS0();
  s.s[1] = src.getS1();
  s.s[2] = src.getS2();
  s.s[3] = src.getS3();
  if (s == compute::SamplerState{}) {
    return fail(WireErrc::kInvalid,
                where + ": sampler state is all zero (the one invalid xoshiro256** state)");
  }
  return s;
}

/// compute::SamplingParams from the wire, validated (stop_strings empty: the caller adds them).
/// Errors: more than max_stops stop token ids (kTooLong), numLogprobs != 0 (kUnsupported), a
/// value validate() rejects (kInvalid).
inline Result<compute::SamplingParams> read_sampling(schemas::SamplingParams::Reader src,
                                                     const std::string& where, size_t max_stops) {
  compute::SamplingParams p;
  p.temperature = src.getTemperature();
  p.top_k = src.getTopK();
  p.top_p = src.getTopP();
  p.min_p = src.getMinP();
  p.repetition_penalty = src.getRepetitionPenalty();
  p.presence_penalty = src.getPresencePenalty();
  p.frequency_penalty = src.getFrequencyPenalty();
  p.penalty_last_n = src.getPenaltyLastN();
  p.seed = src.getSeed();
  auto stops = src.getStopTokenIds();
  if (auto st = check_len(where + ".stopTokenIds", stops.size(), max_stops); !st) return st.error();
  p.stop_token_ids = to_vector(stops);
  p.ignore_eos = src.getIgnoreEos();
  const auto grammar = src.getGrammar();
  if (auto st = check_len(where + ".grammar", grammar.size(), kMaxGrammarBytes); !st)
    return st.error();
  p.grammar.assign(grammar.begin(), grammar.end());
  if (src.getNumLogprobs() != 0) {
    return fail(WireErrc::kUnsupported,
                strfmt("%s.numLogprobs: expected 0 (this build returns no logprobs), got %u",
                       where.c_str(), unsigned{src.getNumLogprobs()}));
  }
  if (auto st = p.validate(); !st)
    return fail(WireErrc::kInvalid, where + ": " + st.error().message);
  return p;
}

/// Ids in [0, bound): returns Ok or names the first bad entry.
template <class List>
Status check_ids(const List& ids, int64_t bound, const std::string& where, const char* what) {
  for (unsigned i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    if (id < 0 || id >= bound) {
      return fail(WireErrc::kInvalid,
                  strfmt("%s[%u]: %s %lld is outside [0, %lld)", where.c_str(), i, what,
                         static_cast<long long>(id), static_cast<long long>(bound)));
    }
  }
  return Ok{};
}

}  // namespace wire_internal
}  // namespace troupe::actors::detail
