// Wire codec of the client protocol (actors/detail/control_wire.h): GenerateRequest,
// CancelRequest and the GenerateEvent stream a client reads (deltas, then the finished result with
// its tokens, finish reason and optional logits). Token ids, sampling, stop strings and the logits'
// shape are checked against ClientLimits before a message is returned.
#include <algorithm>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "actors/detail/control_wire.h"
#include "actors/detail/control_wire_internal.h"
#include "actors/detail/wire_internal.h"
#include "schemas/client.capnp.h"

namespace troupe::actors::detail {

using control_wire_internal::encode_msg;
using control_wire_internal::read_text;
using control_wire_internal::text;
using control_wire_internal::write_ints;
using schemas::TensorDtype;
using wire_internal::check_len;
using wire_internal::decode_frame;
using wire_internal::fail;
using wire_internal::in_field;
using wire_internal::read_error;
using wire_internal::read_sampling;
using wire_internal::read_wire_header;
using wire_internal::write_error;
using wire_internal::write_sampling;

namespace {

// The finish reasons GenerateEvent.finishReason may carry (schemas/client.capnp).
constexpr const char* kFinishReasons[] = {"length",    "eos",   "stop",
                                          "cancelled", "error", "overloaded"};

// Token ids in [0, n_vocab), or in [0, 2^31) when n_vocab is 0 (not known to this side).
template <class List>
Status check_tokens(const List& ids, int64_t n_vocab, const std::string& where) {
  const int64_t bound = n_vocab > 0 ? n_vocab : int64_t{std::numeric_limits<int32_t>::max()} + 1;
  return wire_internal::check_ids(ids, bound, where, "token id");
}

// Rows of a finished event's logits: one per generated token, plus one when a stop token (EOS
// or a stop id) ended the request: the router keeps that token's row but not the token.
bool logits_rows_ok(uint64_t rows, size_t tokens, const std::string& finish_reason) {
  return rows == tokens || (rows == tokens + 1 && finish_reason == "stop");
}

Result<GenerateRequest> read_request(schemas::GenerateRequest::Reader root, const ClientLimits& l) {
  GenerateRequest r;
  auto prompt = read_text(root.getPrompt(), l.max_text, "GenerateRequest.prompt");
  if (!prompt) return prompt.error();
  r.prompt = std::move(*prompt);
  auto tokens = root.getPromptTokens();
  if (auto st = check_len("GenerateRequest.promptTokens", tokens.size(), l.max_prompt_tokens); !st)
    return st.error();
  if (auto st = check_tokens(tokens, l.n_vocab, "GenerateRequest.promptTokens"); !st)
    return st.error();
  r.prompt_tokens = wire_internal::to_vector(tokens);
  r.add_bos = root.getAddBos();
  auto sampling = read_sampling(root.getSampling(), "GenerateRequest.sampling", l.max_stop_tokens);
  if (!sampling) return sampling.error();
  r.sampling = std::move(*sampling);
  auto stops = root.getStopStrings();
  if (auto st = check_len("GenerateRequest.stopStrings", stops.size(), l.max_stop_strings); !st)
    return st.error();
  for (unsigned i = 0; i < stops.size(); ++i) {
    const std::string at = strfmt("GenerateRequest.stopStrings[%u]", i);
    auto s = read_text(stops[i], l.max_text, at);
    if (!s) return s.error();
    if (s->empty()) return fail(WireErrc::kInvalid, at + ": empty, expected a non-empty string");
    r.sampling.stop_strings.push_back(std::move(*s));
  }
  if (auto st = r.sampling.validate(); !st)
    return fail(WireErrc::kInvalid, "GenerateRequest.sampling: " + st.error().message);
  r.max_tokens = root.getMaxTokens();
  if (r.max_tokens < 1 || r.max_tokens > l.max_tokens) {
    return fail(WireErrc::kInvalid,
                strfmt("GenerateRequest.maxTokens: %lld, expected 1 .. %lld",
                       static_cast<long long>(r.max_tokens), static_cast<long long>(l.max_tokens)));
  }
  r.return_logits = root.getReturnLogits();
  auto images = root.getImages();
  if (auto st = check_len("GenerateRequest.images", images.size(), l.max_images); !st)
    return st.error();
  if (images.size() > 0) {
    if (!r.prompt_tokens.empty())
      return fail(WireErrc::kInvalid,
                  "GenerateRequest.images: a request with images needs a text prompt, not "
                  "promptTokens");
    auto files = std::make_shared<std::vector<std::string>>();
    for (unsigned i = 0; i < images.size(); ++i) {
      const std::string at = strfmt("GenerateRequest.images[%u]", i);
      auto d = images[i];
      if (d.size() == 0) return fail(WireErrc::kInvalid, at + ": empty, expected image bytes");
      if (d.size() > l.max_image_bytes)
        return fail(WireErrc::kTooLong, strfmt("%s: %zu bytes exceed the limit of %zu", at.c_str(),
                                               d.size(), l.max_image_bytes));
      files->emplace_back(reinterpret_cast<const char*>(d.begin()), d.size());
    }
    r.image_files = std::move(files);
  }
  return r;
}

// The finished part of an event: prompt and generated tokens, text, reason, error, logits.
Status read_result(schemas::GenerateEvent::Reader root, const ClientLimits& l, GenerateResult& r) {
  auto prompt = root.getPromptTokens();
  if (auto st = check_len("GenerateEvent.promptTokens", prompt.size(), l.max_prompt_tokens); !st)
    return st;
  // A prompt laid out around images has -1 (compute::SeqStep::kEmbedded) at their positions.
  for (unsigned i = 0; i < prompt.size(); ++i) {
    const int64_t bound = l.n_vocab > 0 ? l.n_vocab : int64_t{1} << 31;
    if (prompt[i] < -1 || prompt[i] >= bound)
      return fail(WireErrc::kInvalid,
                  strfmt("GenerateEvent.promptTokens[%u]: token id %d is outside [0, %lld) and "
                         "not -1 (an image position)",
                         i, prompt[i], static_cast<long long>(bound)));
  }
  r.prompt_tokens = wire_internal::to_vector(prompt);
  auto tokens = root.getTokens();
  if (auto st = check_len("GenerateEvent.tokens", tokens.size(),
                          size_t(std::max<int64_t>(l.max_tokens, 0)));
      !st)
    return st;
  if (auto st = check_tokens(tokens, l.n_vocab, "GenerateEvent.tokens"); !st) return st;
  r.tokens = wire_internal::to_vector(tokens);
  auto text = read_text(root.getText(), l.max_text, "GenerateEvent.text");
  if (!text) return text.error();
  r.text = std::move(*text);
  auto reason = read_text(root.getFinishReason(), l.max_text, "GenerateEvent.finishReason");
  if (!reason) return reason.error();
  if (std::find_if(std::begin(kFinishReasons), std::end(kFinishReasons),
                   [&](const char* k) { return *reason == k; }) == std::end(kFinishReasons)) {
    return fail(WireErrc::kInvalid,
                strfmt("GenerateEvent.finishReason: '%.64s', expected length, eos, stop, "
                       "cancelled, error or overloaded",
                       reason->c_str()));
  }
  r.finish_reason = std::move(*reason);
  if (root.hasError()) r.error = read_error(root.getError());
  if (!root.hasLogits()) return Ok{};
  auto v = schemas::read_tensor(root.getLogits());
  if (!v) return in_field("GenerateEvent.logits", v.error());
  const int64_t width = l.n_vocab > 0 ? l.n_vocab : -1;
  if (auto st =
          schemas::expect_tensor(*v, {TensorDtype::kF32}, {-1, width}, "GenerateEvent.logits");
      !st)
    return st;
  if (!logits_rows_ok(v->dim(0), r.tokens.size(), r.finish_reason) || v->dim(1) == 0) {
    return fail(WireErrc::kInvalid,
                strfmt("GenerateEvent.logits: f32 [%llu, %llu], expected [%zu tokens (+1 when a "
                       "stop token ended it), n_vocab >= 1] for finish reason '%s'",
                       static_cast<unsigned long long>(v->dim(0)),
                       static_cast<unsigned long long>(v->dim(1)), r.tokens.size(),
                       r.finish_reason.c_str()));
  }
  auto logits = v->as<float>();
  r.logits.assign(logits.begin(), logits.end());
  return Ok{};
}

}  // namespace

Result<WireFrame> encode(const GenerateRequestMsg& m, const SendInfo& send) {
  const GenerateRequest& r = m.request;
  return encode_msg<schemas::GenerateRequest>(
      "encode GenerateRequest", m.header.cluster_epoch, send,
      [&](schemas::GenerateRequest::Builder root) -> Status {
        root.setTag(m.tag);
        root.setPrompt(text(r.prompt));
        write_ints(root.initPromptTokens(static_cast<unsigned>(r.prompt_tokens.size())),
                   r.prompt_tokens);
        root.setAddBos(r.add_bos);
        write_sampling(root.initSampling(), r.sampling);
        const auto& stops = r.sampling.stop_strings;
        auto list = root.initStopStrings(static_cast<unsigned>(stops.size()));
        for (size_t i = 0; i < stops.size(); ++i) list.set(unsigned(i), text(stops[i]));
        root.setMaxTokens(r.max_tokens);
        root.setReturnLogits(r.return_logits);
        if (r.image_files && !r.image_files->empty()) {
          const auto& files = *r.image_files;
          auto images = root.initImages(static_cast<unsigned>(files.size()));
          for (size_t i = 0; i < files.size(); ++i)
            images.set(
                static_cast<unsigned>(i),
                kj::arrayPtr(reinterpret_cast<const kj::byte*>(files[i].data()), files[i].size()));
        }
        return Ok{};
      });
}

Result<GenerateRequestMsg> decode_generate_request(std::span<const uint8_t> f,
                                                   const ClientLimits& l) {
  return decode_frame<schemas::GenerateRequest, GenerateRequestMsg>(
      f, l.max_frame_bytes, "GenerateRequest",
      [&](schemas::GenerateRequest::Reader root) -> Result<GenerateRequestMsg> {
        GenerateRequestMsg m;
        auto h = read_wire_header(root.getHeader(), l.expected_epoch, "GenerateRequest");
        if (!h) return h.error();
        m.header = *h;
        m.tag = root.getTag();
        auto r = read_request(root, l);
        if (!r) return r.error();
        m.request = std::move(*r);
        return m;
      });
}

Result<WireFrame> encode(const CancelRequestMsg& m, const SendInfo& send) {
  return encode_msg<schemas::CancelRequest>("encode CancelRequest", m.header.cluster_epoch, send,
                                            [&](schemas::CancelRequest::Builder root) -> Status {
                                              root.setTag(m.tag);
                                              return Ok{};
                                            });
}

Result<CancelRequestMsg> decode_cancel_request(std::span<const uint8_t> f, const ClientLimits& l) {
  return decode_frame<schemas::CancelRequest, CancelRequestMsg>(
      f, l.max_frame_bytes, "CancelRequest",
      [&](schemas::CancelRequest::Reader root) -> Result<CancelRequestMsg> {
        CancelRequestMsg m;
        auto h = read_wire_header(root.getHeader(), l.expected_epoch, "CancelRequest");
        if (!h) return h.error();
        m.header = *h;
        m.tag = root.getTag();
        return m;
      });
}

Result<WireFrame> encode(const GenerateEventMsg& m, int64_t n_vocab, const SendInfo& send) {
  const GenerateResult& r = m.result;
  const char* what = "encode GenerateEvent";
  if (m.finished && !r.logits.empty()) {
    const uint64_t rows = n_vocab >= 1 ? r.logits.size() / uint64_t(n_vocab) : 0;
    if (n_vocab < 1 || r.logits.size() % uint64_t(n_vocab) != 0 ||
        !logits_rows_ok(rows, r.tokens.size(), r.finish_reason)) {
      return fail(WireErrc::kUnencodable,
                  strfmt("%s: %zu logits for %zu tokens at n_vocab %lld, expected tokens (+1 "
                         "when a stop token ended it) x n_vocab >= 1",
                         what, r.logits.size(), r.tokens.size(), static_cast<long long>(n_vocab)));
    }
  }
  return encode_msg<schemas::GenerateEvent>(
      what, m.header.cluster_epoch, send, [&](schemas::GenerateEvent::Builder root) -> Status {
        root.setTag(m.tag);
        root.setDelta(text(m.delta));
        root.setToken(m.token);
        root.setFinished(m.finished);
        if (!m.finished) return Ok{};
        write_ints(root.initPromptTokens(static_cast<unsigned>(r.prompt_tokens.size())),
                   r.prompt_tokens);
        write_ints(root.initTokens(static_cast<unsigned>(r.tokens.size())), r.tokens);
        root.setText(text(r.text));
        root.setFinishReason(text(r.finish_reason));
        if (!r.error.empty()) write_error(root.initError(), r.error);
        if (r.logits.empty()) return Ok{};
        const uint64_t shape[] = {r.logits.size() / uint64_t(n_vocab), uint64_t(n_vocab)};
        std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(r.logits.data()),
                                       r.logits.size() * sizeof(float));
        if (auto st = schemas::set_tensor_copy(root.initLogits(), TensorDtype::kF32, shape, bytes);
            !st)
          return in_field("encode GenerateEvent: logits", st.error());
        return Ok{};
      });
}

uint64_t generate_event_tag(std::span<const uint8_t> f, const ClientLimits& l) {
  auto tag = decode_frame<schemas::GenerateEvent, uint64_t>(
      f, l.max_frame_bytes, "GenerateEvent",
      [&](schemas::GenerateEvent::Reader root) -> Result<uint64_t> {
        auto h = read_wire_header(root.getHeader(), l.expected_epoch, "GenerateEvent");
        if (!h) return h.error();
        return root.getTag();
      });
  return tag ? *tag : 0;
}

Result<GenerateEventMsg> decode_generate_event(std::span<const uint8_t> f, const ClientLimits& l) {
  return decode_frame<schemas::GenerateEvent, GenerateEventMsg>(
      f, l.max_frame_bytes, "GenerateEvent",
      [&](schemas::GenerateEvent::Reader root) -> Result<GenerateEventMsg> {
        GenerateEventMsg m;
        auto h = read_wire_header(root.getHeader(), l.expected_epoch, "GenerateEvent");
        if (!h) return h.error();
        m.header = *h;
        m.tag = root.getTag();
        auto delta = read_text(root.getDelta(), l.max_text, "GenerateEvent.delta");
        if (!delta) return delta.error();
        m.delta = std::move(*delta);
        m.token = root.getToken();
        if (m.token < -1 || (l.n_vocab > 0 && m.token >= l.n_vocab)) {
          return fail(WireErrc::kInvalid,
                      strfmt("GenerateEvent.token: %d, expected -1 or a token id in [0, %lld)",
                             m.token, static_cast<long long>(l.n_vocab)));
        }
        m.finished = root.getFinished();
        // The result fields mean something only in the finished event; elsewhere not read.
        if (m.finished) {
          if (auto st = read_result(root, l, m.result); !st) return st.error();
        }
        return m;
      });
}

}  // namespace troupe::actors::detail
