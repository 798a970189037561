// libFuzzer entry for the message codecs a node reads from the network (actors/detail/wire.h and
// control_wire.h): the first byte picks the decoder, the rest is the frame. A decoder may reject
// the frame (that is its job) but must not crash, read out of bounds or throw; what it accepts
// is read in full, and a status snapshot is also rendered as text and JSON (operator-facing
// formatting of peer-supplied strings). Built by tests/fuzz/CMakeLists.txt; run by
// scripts/fuzz-smoke.
#include "tests/fuzz/wire_fuzz.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "actors/detail/messages.h"

namespace {

using namespace troupe::actors::detail;
using namespace troupe::actors::detail::fuzz;

volatile uint64_t g_sink = 0;
void sink(uint64_t v) { g_sink = g_sink + v; }
void sink_floats(const std::vector<float>& v) {
  uint32_t h = 0;
  for (float f : v) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    h = h * 31 + bits;
  }
  sink(h);
}

void require(bool ok) {
  if (!ok) std::abort();  // an accepted message breaks its own documented shape
}

void check_step(const DecodedStep& d) {
  require(d.batch != nullptr);
  size_t tokens = 0;
  for (const auto& w : d.batch->seqs) {
    tokens += w.tokens.size();
    size_t image_positions = 0;
    for (int32_t t : w.tokens) {
      require(t == troupe::compute::SeqStep::kEmbedded || (t >= 0 && t < kVocab));
      image_positions += t == troupe::compute::SeqStep::kEmbedded;
    }
    // Image positions carry their rows at stage 0 (one splice per run) and none after it.
    const size_t rows = w.image_rows ? w.image_rows->size() : 0;
    require(rows == (d.stage == 0 ? image_positions * static_cast<size_t>(kEmbd) : 0));
    if (w.image_rows) sink_floats(*w.image_rows);
    for (int32_t b : w.blocks) require(b >= 0 && b < 64);
    require(w.pos0 + static_cast<int64_t>(w.tokens.size()) <= 256);
    if (w.history) sink(w.history->size());
  }
  if (d.hidden) {
    require(d.hidden->size() == tokens * static_cast<size_t>(kEmbd));
    sink_floats(*d.hidden);
  }
}

template <class T, class Check>
void run(const troupe::Result<T>& r, Check check) {
  if (!r) {
    require(!r.error().message.empty());
    sink(r.error().message.size());
    return;
  }
  check(*r);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const auto which = static_cast<Decoder>(data[0] % kNumDecoders);
  // A transport hands decoders word-aligned buffers; copy so the frame starts aligned, or (by
  // the selector's next bit) one byte past that: read_frame copies an unaligned frame itself.
  const size_t shift = (data[0] / kNumDecoders) & 1;
  std::vector<uint64_t> words((size + 7) / 8 + 1);
  auto* base = reinterpret_cast<uint8_t*>(words.data()) + shift;
  std::memcpy(base, data + 1, size - 1);
  const std::span<const uint8_t> f(base, size - 1);
  const auto header = [](const auto& m) { sink(m.header.seq ^ m.header.cluster_epoch); };
  switch (which) {
    case Decoder::kJoinRequest:
      run(decode_join_request(f, control_limits()), [&](const JoinRequestMsg& m) {
        header(m);
        sink(m.name.size() + m.address.size() + m.version.size());
      });
      break;
    case Decoder::kJoinReply:
      run(decode_join_reply(f, control_limits()), header);
      break;
    case Decoder::kHeartbeat:
      run(decode_heartbeat(f, control_limits()), [&](const HeartbeatMsg& m) {
        header(m);
        for (const auto& l : m.links) sink(l.node.size() + l.bytes_received);
      });
      break;
    case Decoder::kHeartbeatAck:
      run(decode_heartbeat_ack(f, control_limits()), header);
      break;
    case Decoder::kMembership:
      run(decode_membership(f, control_limits()), [&](const MembershipMsg& m) {
        header(m);
        for (const auto& x : m.members) require(x.node_id >= 1 && !x.name.empty());
      });
      break;
    case Decoder::kPlacement:
      run(decode_placement(f, control_limits()), [&](const PlacementMsg& m) {
        header(m);
        require(!m.stages.empty() && m.microbatches >= 1);
        for (size_t i = 0; i < m.stages.size(); ++i) {
          require(m.stages[i].stage == i);
          require(m.stages[i].layer_begin < m.stages[i].layer_end);
        }
        for (const auto& s : m.shards)
          for (size_t i = 1; i < s.experts.size(); ++i) require(s.experts[i - 1] < s.experts[i]);
        for (size_t i = 0; i < m.encoders.size(); ++i)
          require(m.encoders[i].index == i && m.encoders[i].node_id >= 1);
      });
      break;
    case Decoder::kPlacementReport:
      run(decode_placement_report(f, control_limits()), header);
      break;
    case Decoder::kLeaveNotice:
      run(decode_leave_notice(f, control_limits()), header);
      break;
    case Decoder::kActorRestart:
      run(decode_actor_restart(f, control_limits()), header);
      break;
    case Decoder::kStatusRequest:
      run(decode_status_request(f, control_limits()), header);
      break;
    case Decoder::kStatusSnapshot:
      run(decode_status_snapshot(f, control_limits()), [&](const StatusSnapshotMsg& m) {
        header(m);
        sink(status_text(m).size() + status_json(m).size());
      });
      break;
    case Decoder::kGenerateRequest:
      run(decode_generate_request(f, client_limits()), [&](const GenerateRequestMsg& m) {
        header(m);
        for (int32_t t : m.request.prompt_tokens) require(t >= 0 && t < kVocab);
        require(m.request.max_tokens >= 1);
      });
      break;
    case Decoder::kCancelRequest:
      run(decode_cancel_request(f, client_limits()), header);
      break;
    case Decoder::kGenerateEvent:
      run(decode_generate_event(f, client_limits()), [&](const GenerateEventMsg& m) {
        header(m);
        if (m.finished && !m.result.logits.empty())
          require(m.result.logits.size() % static_cast<size_t>(kVocab) == 0);
        sink_floats(m.result.logits);
      });
      break;
    case Decoder::kStep:
      run(decode_step(f, step_limits()), check_step);
      break;
    case Decoder::kStepOutcome:
      run(decode_step_outcome(f, outcome_limits()), [&](const DecodedOutcome& d) {
        require(d.outcome != nullptr);
        for (const auto& r : d.outcome->results) {
          require(r.logits.empty() || r.logits.size() == static_cast<size_t>(kVocab));
          sink_floats(r.logits);
        }
      });
      break;
    case Decoder::kExpertDispatch:
      run(decode_expert_dispatch(f, dispatch_limits()), [&](const DecodedDispatch& d) {
        require(d.request != nullptr);
        require(d.request->layer >= 0 && d.request->layer < kLayers);
        for (int32_t e : d.request->experts) {
          const auto& own = owned_experts();
          require(std::find(own.begin(), own.end(), e) != own.end());
        }
        int64_t rows = 0;
        for (int64_t r : d.request->rows) rows += r;
        require(d.request->x.size() == static_cast<size_t>(rows * kEmbd));
        require(d.request->y.size() == d.request->x.size());
        sink_floats(d.request->x);
      });
      break;
    case Decoder::kExpertCombine:
      run(decode_expert_combine(f, combine_limits()), [&](const DecodedCombine& d) {
        require(d.y.size() % static_cast<size_t>(kEmbd) == 0);
        sink_floats(d.y);
      });
      break;
    case Decoder::kEncodeImage:
      run(decode_encode_image(f, encode_image_limits()), [&](const DecodedEncodeImage& d) {
        header(d);
        require(d.job.job_id >= 1 && d.job.encoder < encode_image_limits().num_encoders);
        require(d.job.image != nullptr && !d.job.image->empty() &&
                d.job.image->size() <= encode_image_limits().max_image_bytes);
        require(d.job.what.size() <= kMaxImageWhatBytes);
        for (char c : d.job.what)  // it ends up in one-line error messages
          require(static_cast<unsigned char>(c) >= 0x20 && c != 0x7f);
        sink(static_cast<uint8_t>(d.job.image->back()));
      });
      break;
    case Decoder::kEncodedImage:
      run(decode_encoded_image(f, encoded_image_limits()), [&](const DecodedEncodedImage& d) {
        header(d);
        require(d.job_id >= 1);
        if (d.accepted) {
          require(d.rows.empty() && d.error.empty());
        } else if (d.error.empty()) {
          require(d.rows.size() == static_cast<size_t>(kImageRows * kEmbd));
          for (float v : d.rows) require(std::isfinite(v));
        } else {
          require(d.rows.empty() && d.error.size() <= kMaxErrorBytes);
        }
        sink_floats(d.rows);
        sink(d.error.size() + d.retry);
      });
      break;
    case Decoder::kPeekEncodedImage:
      run(peek_encoded_image(f), [&](const WireHeader& h) {
        require(h.sender.role == ActorRole::kEncoder && h.cluster_epoch >= 1 && h.seq >= 1);
        sink(h.sender.index);
      });
      break;
  }
  return 0;
}
