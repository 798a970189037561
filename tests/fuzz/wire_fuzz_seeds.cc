// Writes the wire fuzzer's seed corpus: for each decoder of wire_fuzz.cc, one or more valid frames
// (from the real encoders, for wire_fuzz.h's limits; control and client messages are the samples
// of tests/actors/control_wire_samples.h) behind their selector byte, plus a few
// truncations of each. Exits non-zero when an encoder refuses a seed or its decoder refuses
// the frame, so a codec change that breaks the seeds is noticed at build time.
// Usage: wire_fuzz_seeds DIR
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "actors/detail/messages.h"
#include "tests/actors/control_wire_samples.h"
#include "tests/fuzz/wire_fuzz.h"

namespace {

using namespace troupe;
using namespace troupe::actors;
using namespace troupe::actors::detail;
using namespace troupe::actors::detail::fuzz;

const SendInfo kNode{.sender = {.node = 2, .role = ActorRole::kNodeDaemon, .index = 0}, .seq = 5};
const SendInfo kStage{.sender = {.node = 2, .role = ActorRole::kStage, .index = 1}, .seq = 6};

int g_failures = 0;

void save(const std::filesystem::path& dir, const std::string& name, Decoder d,
          const std::vector<uint8_t>& frame, size_t keep) {
  std::vector<uint8_t> b;
  b.push_back(static_cast<uint8_t>(d));
  b.insert(b.end(), frame.begin(), frame.begin() + static_cast<std::ptrdiff_t>(keep));
  std::ofstream out(dir / name, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// Saves the frame and some truncations of it, after checking its decoder accepts it.
template <class Decode>
void emit(const std::filesystem::path& dir, const std::string& name, Decoder d,
          const Result<WireFrame>& frame, Decode decode) {
  if (!frame) {
    std::fprintf(stderr, "wire_fuzz_seeds: %s: encode: %s\n", name.c_str(),
                 frame.error().message.c_str());
    ++g_failures;
    return;
  }
  const std::vector<uint8_t> bytes = frame->flatten();
  const auto back = decode(std::span<const uint8_t>(bytes));
  if (!back) {
    std::fprintf(stderr, "wire_fuzz_seeds: %s: decode: %s\n", name.c_str(),
                 back.error().message.c_str());
    ++g_failures;
    return;
  }
  save(dir, name, d, bytes, bytes.size());
  for (size_t k = 1; k <= 3; ++k)
    save(dir, name + ".cut" + std::to_string(k), d, bytes, bytes.size() * k / 4);
}

// The control and client seeds are control_wire_test.cc's sample messages (every field set).
void control_seeds(const std::filesystem::path& dir) {
  using namespace samples;
  const ControlLimits l = control_limits();
  emit(dir, "join_request", Decoder::kJoinRequest, encode(make_join_request(), kNode),
       [&](auto f) { return decode_join_request(f, l); });
  emit(dir, "join_reply", Decoder::kJoinReply, encode(make_join_reply(), kNode),
       [&](auto f) { return decode_join_reply(f, l); });
  HeartbeatMsg hb;
  hb.header.cluster_epoch = fuzz::kEpoch;
  hb.lease_ms = 3000;
  hb.resources = kResources;
  hb.num_actors = 2;
  hb.links = make_links();
  hb.transport = {"node-a", 1, 2, 3};
  emit(dir, "heartbeat", Decoder::kHeartbeat, encode(hb, kNode),
       [&](auto f) { return decode_heartbeat(f, l); });
  HeartbeatAckMsg ack;
  ack.header.cluster_epoch = fuzz::kEpoch;
  ack.lease_ms = 3000;
  ack.membership_version = 3;
  emit(dir, "heartbeat_ack", Decoder::kHeartbeatAck, encode(ack, kNode),
       [&](auto f) { return decode_heartbeat_ack(f, l); });
  emit(dir, "membership", Decoder::kMembership, encode(make_membership(), kNode),
       [&](auto f) { return decode_membership(f, l); });
  emit(dir, "placement", Decoder::kPlacement, encode(make_placement(), kNode),
       [&](auto f) { return decode_placement(f, l); });
  emit(dir, "placement_report", Decoder::kPlacementReport, encode(make_placement_report(), kNode),
       [&](auto f) { return decode_placement_report(f, l); });
  LeaveNoticeMsg ln;
  ln.header.cluster_epoch = fuzz::kEpoch;
  ln.reason = "SIGTERM";
  emit(dir, "leave_notice", Decoder::kLeaveNotice, encode(ln, kNode),
       [&](auto f) { return decode_leave_notice(f, l); });
  ActorRestartMsg ar;
  ar.header.cluster_epoch = fuzz::kEpoch;
  ar.actor = {2, ActorRole::kStage, 1};
  ar.reason = "injected";
  ar.kv_lost = true;
  ar.restarts = 1;
  emit(dir, "actor_restart", Decoder::kActorRestart, encode(ar, kNode),
       [&](auto f) { return decode_actor_restart(f, l); });
  StatusRequestMsg sr;
  sr.header.cluster_epoch = fuzz::kEpoch;
  emit(dir, "status_request", Decoder::kStatusRequest, encode(sr, kNode),
       [&](auto f) { return decode_status_request(f, l); });
  emit(dir, "status_snapshot", Decoder::kStatusSnapshot, encode(make_snapshot(), kNode),
       [&](auto f) { return decode_status_snapshot(f, l); });
}

void client_seeds(const std::filesystem::path& dir) {
  using namespace samples;
  const ClientLimits l = client_limits();
  emit(dir, "generate_request", Decoder::kGenerateRequest, encode(make_generate_request(), kNode),
       [&](auto f) { return decode_generate_request(f, l); });
  CancelRequestMsg c;
  c.header.cluster_epoch = fuzz::kEpoch;
  c.tag = 7;
  emit(dir, "cancel_request", Decoder::kCancelRequest, encode(c, kNode),
       [&](auto f) { return decode_cancel_request(f, l); });
  GenerateEventMsg piece;
  piece.header.cluster_epoch = fuzz::kEpoch;
  piece.tag = 7;
  piece.delta = "he";
  piece.token = 9;
  emit(dir, "generate_event_piece", Decoder::kGenerateEvent, encode(piece, fuzz::kVocab, kNode),
       [&](auto f) { return decode_generate_event(f, l); });
  emit(dir, "generate_event_end", Decoder::kGenerateEvent,
       encode(make_finished_event(fuzz::kVocab), fuzz::kVocab, kNode),
       [&](auto f) { return decode_generate_event(f, l); });
}

void data_seeds(const std::filesystem::path& dir) {
  StepBatch b;
  b.epoch = kEpoch;
  b.step_id = 42;
  SeqWork prefill;
  prefill.seq_id = 0;
  prefill.pos0 = 4;
  prefill.tokens = {1, 2, 3};
  prefill.blocks = {0, 1};
  prefill.sampling = std::make_shared<const compute::SamplingParams>();
  prefill.rng = compute::Sampler::seeded_state(1);
  b.seqs.push_back(prefill);
  SeqWork decode;
  decode.seq_id = 5;
  decode.pos0 = 8;
  decode.tokens = {17};
  decode.blocks = {2, 3, 4};
  decode.sample = true;
  decode.want_logits = true;
  auto params = std::make_shared<compute::SamplingParams>();
  params->temperature = 0.8f;
  params->repetition_penalty = 1.2f;
  params->penalty_last_n = 4;
  decode.sampling = params;
  decode.rng = compute::Sampler::seeded_state(2);
  decode.history = std::make_shared<const std::vector<int32_t>>(
      std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 17});
  b.seqs.push_back(decode);
  const StepLimits sl = step_limits();
  emit(dir, "step_stage0", Decoder::kStep, encode_step(b, nullptr, kEmbd, 0, kStage),
       [&](auto f) { return decode_step(f, sl); });
  auto hidden = std::make_shared<std::vector<float>>(4 * kEmbd, 0.25f);
  emit(dir, "step_stage1", Decoder::kStep, encode_step(b, hidden, kEmbd, 1, kStage),
       [&](auto f) { return decode_step(f, sl); });

  // A prompt chunk with two runs of image positions (token id -1): stage 0 carries their rows as
  // one splice per run; later stages would take hidden states instead.
  StepBatch bi = b;
  SeqWork image;
  image.seq_id = 9;
  image.pos0 = 0;
  image.tokens = {1, compute::SeqStep::kEmbedded, compute::SeqStep::kEmbedded, 2,
                  compute::SeqStep::kEmbedded};
  image.blocks = {5, 6};
  image.non_causal = true;
  image.image_rows = std::make_shared<const std::vector<float>>(3 * kEmbd, 0.5f);
  image.sampling = std::make_shared<const compute::SamplingParams>();
  image.rng = compute::Sampler::seeded_state(3);
  bi.seqs = {image};
  emit(dir, "step_stage0_images", Decoder::kStep, encode_step(bi, nullptr, kEmbd, 0, kStage),
       [&](auto f) { return decode_step(f, sl); });

  StepOutcome o;
  o.epoch = kEpoch;
  o.step_id = 42;
  o.compute_seconds = 0.01;
  SeqResult r0;
  r0.seq_id = 0;
  r0.rng = compute::Sampler::seeded_state(3);
  SeqResult r1;
  r1.seq_id = 5;
  r1.rng = compute::Sampler::seeded_state(4);
  r1.token = 11;
  r1.logits.assign(kVocab, 0.125f);
  o.results = {r0, r1};
  const OutcomeLimits ol = outcome_limits();
  emit(dir, "step_outcome", Decoder::kStepOutcome, encode_step_outcome(o, kVocab, kStage),
       [&](auto f) { return decode_step_outcome(f, ol); });

  auto req = std::make_shared<ExpertRequest>();
  req->layer = 3;
  req->experts = {1, 4};
  req->rows = {2, 1};
  req->x.assign(3 * kEmbd, 0.5f);
  req->y.assign(3 * kEmbd, -0.5f);
  const ExpertStep step{.epoch = kEpoch, .step_id = 42, .microbatch = 0};
  const DispatchLimits dl = dispatch_limits();
  emit(dir, "expert_dispatch", Decoder::kExpertDispatch,
       encode_expert_dispatch(req, kEmbd, step, kStage),
       [&](auto f) { return decode_expert_dispatch(f, dl); });
  const CombineLimits cl = combine_limits();
  emit(dir, "expert_combine", Decoder::kExpertCombine,
       encode_expert_combine(req, kEmbd, step, kStage, 0.002),
       [&](auto f) { return decode_expert_combine(f, cl); });
}

// The image messages: one image for an encoder instance, and its answers (rows, an error to try
// again elsewhere, a bad image). The peek seeds are the answers' frames behind its own selector.
void image_seeds(const std::filesystem::path& dir) {
  const SendInfo encoder{.sender = {.node = 3, .role = ActorRole::kEncoder, .index = 1}, .seq = 7};
  ImageJobWire job;
  job.job_id = 42;
  job.encoder = 1;
  std::string png = "\x89PNG\r\n\x1a\n";
  png.append(200, '\0');
  job.image = std::make_shared<const std::string>(std::move(png));
  job.what = "image 2";
  const EncodeImageLimits el = encode_image_limits();
  emit(dir, "encode_image", Decoder::kEncodeImage, encode_encode_image(job, kEpoch, encoder),
       [&](auto f) { return decode_encode_image(f, el); });

  ImageRowsWire rows;
  rows.job_id = 42;
  rows.rows = std::make_shared<const std::vector<float>>(kImageRows * kEmbd, 0.5f);
  rows.seconds = 0.25;
  ImageRowsWire retry = rows;
  retry.rows = nullptr;
  retry.error = "image encoder 1 is not running on node node-c";
  retry.retry = true;
  ImageRowsWire bad = retry;
  bad.error = "image 2: not a PNG or JPEG file";
  bad.retry = false;
  ImageRowsWire receipt;
  receipt.job_id = 42;
  receipt.accepted = true;
  const EncodedImageLimits il = encoded_image_limits();
  const std::pair<const char*, const ImageRowsWire*> answers[] = {
      {"rows", &rows}, {"retry", &retry}, {"error", &bad}, {"receipt", &receipt}};
  for (const auto& [name, answer] : answers) {
    const auto frame = encode_encoded_image(*answer, kImageRows, kEmbd, kEpoch, encoder);
    emit(dir, std::string("encoded_image_") + name, Decoder::kEncodedImage, frame,
         [&](auto f) { return decode_encoded_image(f, il); });
    emit(dir, std::string("peek_encoded_image_") + name, Decoder::kPeekEncodedImage, frame,
         [&](auto f) { return peek_encoded_image(f); });
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: wire_fuzz_seeds DIR\n");
    return 2;
  }
  const std::filesystem::path dir(argv[1]);
  std::filesystem::create_directories(dir);
  control_seeds(dir);
  client_seeds(dir);
  data_seeds(dir);
  image_seeds(dir);
  if (g_failures != 0) {
    std::fprintf(stderr, "wire_fuzz_seeds: %d seeds failed\n", g_failures);
    return 1;
  }
  return 0;
}
