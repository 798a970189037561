// Wire codec of the actor messages: steps and step outcomes here, expert dispatch and combine in
// wire_experts.cc (see actors/detail/wire.h for the contract and the mapping).
// Decoders treat every frame as hostile: each Cap'n Proto read runs inside schemas::guard() (via
// decode_frame(), actors/detail/wire_internal.h, shared with control_wire.cc), each list is sized
// before it is walked, and every value is checked before it reaches an actor.
#include "actors/detail/wire.h"

#include <algorithm>
#include <limits>
#include <span>
#include <string>
#include <utility>

#include "actors/detail/messages.h"
#include "actors/detail/wire_internal.h"
#include "schemas/step.capnp.h"

namespace troupe::actors::detail {

static_assert(uint16_t(ActorRole::kController) == uint16_t(schemas::Role::CONTROLLER));
static_assert(uint16_t(ActorRole::kRouter) == uint16_t(schemas::Role::ROUTER));
static_assert(uint16_t(ActorRole::kScheduler) == uint16_t(schemas::Role::SCHEDULER));
static_assert(uint16_t(ActorRole::kStage) == uint16_t(schemas::Role::STAGE));
static_assert(uint16_t(ActorRole::kExpertShard) == uint16_t(schemas::Role::EXPERT_SHARD));
static_assert(uint16_t(ActorRole::kKvManager) == uint16_t(schemas::Role::KV_MANAGER));
static_assert(uint16_t(ActorRole::kEncoder) == uint16_t(schemas::Role::ENCODER));
static_assert(uint16_t(ActorRole::kNodeDaemon) == uint16_t(schemas::Role::NODE_DAEMON));
static_assert(uint16_t(ActorRole::kGateway) == uint16_t(schemas::Role::GATEWAY));

const char* to_string(WireErrc e) {
  switch (e) {
    case WireErrc::kInvalid:
      return "invalid";
    case WireErrc::kTooLong:
      return "too_long";
    case WireErrc::kUnsupported:
      return "unsupported";
    case WireErrc::kUnencodable:
      return "unencodable";
    case WireErrc::kUnavailable:
      return "unavailable";
  }
  return "unknown";
}

// ---- WireFrame ---------------------------------------------------------------------------------

const std::vector<std::span<const uint8_t>>& WireFrame::iov() const {
  static const std::vector<std::span<const uint8_t>> kEmpty;
  return impl_ ? impl_->iov : kEmpty;
}

size_t WireFrame::size_bytes() const { return impl_ ? impl_->gather.size_bytes() : 0; }

std::vector<uint8_t> WireFrame::flatten() const {
  std::vector<uint8_t> out;
  out.reserve(size_bytes());
  for (const auto& piece : iov()) out.insert(out.end(), piece.begin(), piece.end());
  return out;
}

using schemas::TensorDtype;
using wire_internal::build_frame;
using wire_internal::check_ids;
using wire_internal::check_len;
using wire_internal::check_send;
using wire_internal::decode_frame;
using wire_internal::fail;
using wire_internal::in_field;
using wire_internal::kMaxU32;
using wire_internal::one_line;
using wire_internal::read_error;
using wire_internal::read_sampling;
using wire_internal::read_state;
using wire_internal::read_wire_header;
using wire_internal::to_ns;
using wire_internal::to_vector;
using wire_internal::write_error;
using wire_internal::write_f32;
using wire_internal::write_header;
using wire_internal::write_sampling;
using wire_internal::write_state;

namespace {

// ---- encoding helpers ----

bool penalties_on(const compute::SamplingParams& p) {
  return p.penalty_last_n != 0 &&
         (p.repetition_penalty != 1 || p.presence_penalty != 0 || p.frequency_penalty != 0);
}

// The runs of image positions (SeqStep::kEmbedded) in tokens: [begin, end) pairs, in order.
std::vector<std::pair<size_t, size_t>> image_runs(std::span<const int32_t> tokens) {
  std::vector<std::pair<size_t, size_t>> runs;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] != compute::SeqStep::kEmbedded) continue;
    if (runs.empty() || runs.back().second != i) runs.push_back({i, i});
    runs.back().second = i + 1;
  }
  return runs;
}

// One splice per run of image positions, with the run's rows (stage 0 only).
Status write_splices(schemas::SequenceStep::Builder dst, const SeqWork& w, size_t idx) {
  const auto runs = image_runs(w.tokens);
  size_t k = 0;
  for (const auto& r : runs) k += r.second - r.first;
  const size_t n_rows = w.image_rows ? w.image_rows->size() : 0;
  if (k == 0 && n_rows == 0) return Ok{};
  if (k == 0 || n_rows % k != 0)
    return fail(WireErrc::kUnencodable,
                strfmt("seqs[%zu]: %zu image positions but %zu image row values", idx, k, n_rows));
  const size_t width = n_rows / k;
  auto splices = dst.initSplices(static_cast<unsigned>(runs.size()));
  size_t row = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const size_t n = runs[i].second - runs[i].first;
    auto sp = splices[unsigned(i)];
    sp.setOffset(static_cast<uint32_t>(runs[i].first));
    const uint64_t shape[] = {n, width};
    const std::span<const uint8_t> bytes(
        reinterpret_cast<const uint8_t*>(w.image_rows->data() + row * width),
        n * width * sizeof(float));
    if (auto st = schemas::set_tensor_copy(sp.initEmbeddings(), TensorDtype::kF32, shape, bytes);
        !st)
      return in_field(strfmt("seqs[%zu].splices[%zu]", idx, i), st.error());
    row += n;
  }
  return Ok{};
}

Status write_seq(schemas::SequenceStep::Builder dst, const SeqWork& w, uint32_t stage, size_t idx) {
  if (w.seq_id < 0 || uint64_t(w.seq_id) > kMaxU32 || w.pos0 < 0 || uint64_t(w.pos0) > kMaxU32 ||
      w.tokens.empty() || w.tokens.size() > kMaxU32) {
    return fail(WireErrc::kUnencodable,
                strfmt("seqs[%zu]: seq_id %lld, pos0 %lld, %zu tokens: expected seq_id and pos0 "
                       "in [0, 2^32) and 1 .. 2^32-1 tokens",
                       idx, static_cast<long long>(w.seq_id), static_cast<long long>(w.pos0),
                       w.tokens.size()));
  }
  dst.setRequestId(static_cast<uint64_t>(w.seq_id) + 1);
  dst.setSeqId(static_cast<uint32_t>(w.seq_id));
  dst.setPos0(static_cast<uint32_t>(w.pos0));
  dst.setCount(static_cast<uint32_t>(w.tokens.size()));
  auto ids = dst.initTokenIds(static_cast<unsigned>(w.tokens.size()));
  for (size_t i = 0; i < w.tokens.size(); ++i) ids.set(unsigned(i), w.tokens[i]);
  dst.setNonCausal(w.non_causal);
  dst.setStateSlot(w.state);
  if (stage == 0)
    if (auto st = write_splices(dst, w, idx); !st) return st;
  auto table = dst.initBlockTables(1)[0];
  table.setStage(stage);
  auto blocks = table.initBlockIds(static_cast<unsigned>(w.blocks.size()));
  for (size_t i = 0; i < w.blocks.size(); ++i) blocks.set(unsigned(i), w.blocks[i]);
  // troupe's last stage computes only the last row: it feeds the draw and the returned row.
  using Mode = schemas::LogitsMode;
  dst.setLogits(w.sample || w.want_logits ? Mode::LAST : Mode::NONE);
  dst.setSample(w.sample);
  dst.setReturnLogits(w.want_logits);
  write_state(dst.initSamplerState(), w.rng);
  if (!w.sampling) return Ok{};
  write_sampling(dst.initSampling(), *w.sampling);
  if (w.output && w.sample && !w.sampling->grammar.empty()) {
    if (w.output->size() > kMaxU32)
      return fail(WireErrc::kUnencodable, strfmt("seqs[%zu]: reply too long", idx));
    auto out = dst.initReplyTokens(static_cast<unsigned>(w.output->size()));
    for (size_t i = 0; i < w.output->size(); ++i) out.set(unsigned(i), (*w.output)[i]);
  }
  if (!w.history || !penalties_on(*w.sampling)) return Ok{};
  // The sampler reads only the last penalty_last_n tokens (compute/sampler.cc penalize()).
  std::span<const int32_t> h(*w.history);
  if (w.sampling->penalty_last_n >= 0)
    h = h.last(std::min(h.size(), static_cast<size_t>(w.sampling->penalty_last_n)));
  auto hist = dst.initPenaltyHistory(static_cast<unsigned>(h.size()));
  for (size_t i = 0; i < h.size(); ++i) hist.set(unsigned(i), h[i]);
  return Ok{};
}

// ---- decoding helpers ----

// Finds this stage's block table, checks that it covers `positions` tokens, copies it.
Status read_blocks(capnp::List<schemas::BlockTable>::Reader tables, uint32_t stage,
                   int64_t positions, const StepLimits& lim, const std::string& where,
                   std::vector<int32_t>& out) {
  if (auto st = check_len(where + ".blockTables", tables.size(), lim.max_stages); !st) return st;
  int found = -1;
  for (unsigned t = 0; t < tables.size(); ++t) {
    if (tables[t].getStage() != stage) continue;
    if (found >= 0) {
      return fail(WireErrc::kInvalid, strfmt("%s.blockTables: tables %d and %u are both for stage "
                                             "%u, expected one",
                                             where.c_str(), found, t, stage));
    }
    found = static_cast<int>(t);
  }
  if (found < 0) {
    return fail(WireErrc::kInvalid, strfmt("%s.blockTables: no table for stage %u among %u",
                                           where.c_str(), stage, tables.size()));
  }
  const std::string bw = strfmt("%s.blockTables[%d].blockIds", where.c_str(), found);
  auto ids = tables[unsigned(found)].getBlockIds();
  const int64_t need = (positions + lim.block_size - 1) / lim.block_size;
  const int64_t most = (lim.max_positions + lim.block_size - 1) / lim.block_size;
  if (int64_t(ids.size()) < need) {
    return fail(
        WireErrc::kInvalid,
        strfmt("%s: block table too short: %lld positions at block size %lld need %lld "
               "blocks, got %u",
               bw.c_str(), static_cast<long long>(positions),
               static_cast<long long>(lim.block_size), static_cast<long long>(need), ids.size()));
  }
  if (auto st = check_len(bw, ids.size(), static_cast<size_t>(most)); !st) return st;
  const int64_t bound =
      lim.num_kv_blocks > 0 ? lim.num_kv_blocks : std::numeric_limits<int32_t>::max();
  if (auto st = check_ids(ids, bound, bw, "block id"); !st) return st;
  out = to_vector(ids);
  return Ok{};
}

Status read_sampling_part(schemas::SequenceStep::Reader src, const StepLimits& lim,
                          const std::string& where, SeqWork& w) {
  using Mode = schemas::LogitsMode;
  const auto mode = src.getLogits();
  if (static_cast<uint16_t>(mode) > static_cast<uint16_t>(Mode::ALL)) {
    return fail(WireErrc::kInvalid, strfmt("%s.logits: unknown logits mode %u, expected 0..2",
                                           where.c_str(), unsigned(mode)));
  }
  if (mode == Mode::ALL) {
    return fail(WireErrc::kUnsupported,
                where +
                    ".logits: all (one row per new position) is not supported, expected none "
                    "or last");
  }
  w.sample = src.getSample();
  w.want_logits = src.getReturnLogits();
  if (w.sample && mode == Mode::NONE)
    return fail(WireErrc::kInvalid, where + ".sample: sampling needs logits rows, logits is none");
  if (w.want_logits && mode == Mode::NONE) {
    return fail(WireErrc::kInvalid,
                where + ".returnLogits: returning logits needs a logits row, logits is none");
  }
  auto rng = read_state(src.getSamplerState(), where + ".samplerState");
  if (!rng) return rng.error();
  w.rng = *rng;
  if (!src.hasSampling()) {
    if (w.sample) return fail(WireErrc::kInvalid, where + ".sampling: absent, sample is true");
    return Ok{};
  }
  auto p = read_sampling(src.getSampling(), where + ".sampling", lim.max_stop_tokens);
  if (!p) return p.error();
  auto hist = src.getPenaltyHistory();
  const size_t max_hist = p->penalty_last_n >= 0 ? static_cast<size_t>(p->penalty_last_n)
                                                 : static_cast<size_t>(lim.max_positions);
  if (auto st = check_len(where + ".penaltyHistory", hist.size(), max_hist); !st) return st;
  if (auto st = check_ids(hist, lim.n_vocab, where + ".penaltyHistory", "token id"); !st) return st;
  if (hist.size() > 0) w.history = std::make_shared<const std::vector<int32_t>>(to_vector(hist));
  auto reply = src.getReplyTokens();
  if (reply.size() > 0 && (p->grammar.empty() || !w.sample)) {
    return fail(WireErrc::kInvalid,
                where + ".replyTokens: only a sampled sequence with a grammar carries them");
  }
  if (auto st = check_len(where + ".replyTokens", reply.size(), size_t(lim.max_positions)); !st)
    return st;
  if (auto st = check_ids(reply, lim.n_vocab, where + ".replyTokens", "token id"); !st) return st;
  if (!p->grammar.empty() && w.sample)
    w.output = std::make_shared<const std::vector<int32_t>>(to_vector(reply));
  w.sampling = std::make_shared<const compute::SamplingParams>(std::move(*p));
  return Ok{};
}

// Stage 0: one f32 splice per run of image positions, covering it exactly, in order; their rows
// become w.image_rows. Later stages get none (they take hidden states).
Status read_splices(schemas::SequenceStep::Reader src, uint32_t stage, const StepLimits& lim,
                    const std::string& where, SeqWork& w) {
  auto splices = src.getSplices();
  if (stage != 0) {
    if (splices.size() == 0) return Ok{};
    return fail(WireErrc::kInvalid, strfmt("%s.splices: %u image splices sent to stage %u, "
                                           "expected none after stage 0",
                                           where.c_str(), splices.size(), stage));
  }
  const auto runs = image_runs(w.tokens);
  if (splices.size() != runs.size())
    return fail(WireErrc::kInvalid,
                strfmt("%s.splices: %u splices for %zu runs of image positions (token id -1)",
                       where.c_str(), splices.size(), runs.size()));
  if (runs.empty()) return Ok{};
  auto rows = std::make_shared<std::vector<float>>();
  for (unsigned i = 0; i < splices.size(); ++i) {
    const std::string sw = strfmt("%s.splices[%u]", where.c_str(), i);
    const size_t n = runs[i].second - runs[i].first;
    if (splices[i].getOffset() != runs[i].first)
      return fail(WireErrc::kInvalid,
                  strfmt("%s.offset: %u, expected %zu (the start of image run %u)", sw.c_str(),
                         splices[i].getOffset(), runs[i].first, i));
    auto v = schemas::read_tensor(splices[i].getEmbeddings());
    if (!v) return in_field(sw + ".embeddings", v.error());
    if (auto st = schemas::expect_tensor(*v, {TensorDtype::kF32},
                                         {static_cast<int64_t>(n), lim.n_embd}, sw + ".embeddings");
        !st)
      return st;
    auto f = v->as<float>();
    rows->insert(rows->end(), f.begin(), f.end());
  }
  w.image_rows = std::move(rows);
  return Ok{};
}

Status read_seq(schemas::SequenceStep::Reader src, uint32_t stage, const StepLimits& lim,
                const std::string& where, SeqWork& w) {
  if (src.getRequestId() == 0) return fail(WireErrc::kInvalid, where + ".requestId: 0 is invalid");
  w.seq_id = src.getSeqId();
  w.pos0 = src.getPos0();
  const int64_t count = src.getCount();
  auto tokens = src.getTokenIds();
  if (count < 1 || int64_t(tokens.size()) != count) {
    return fail(WireErrc::kInvalid,
                strfmt("%s: count %lld with %u tokenIds, expected count >= 1 and as many ids",
                       where.c_str(), static_cast<long long>(count), tokens.size()));
  }
  if (w.pos0 + count > lim.max_positions) {
    return fail(WireErrc::kInvalid,
                strfmt("%s: positions pos0 %lld + count %lld exceed the context of %lld",
                       where.c_str(), static_cast<long long>(w.pos0), static_cast<long long>(count),
                       static_cast<long long>(lim.max_positions)));
  }
  for (unsigned i = 0; i < tokens.size(); ++i) {
    const int64_t id = tokens[i];
    if (id != compute::SeqStep::kEmbedded && (id < 0 || id >= lim.n_vocab))
      return fail(WireErrc::kInvalid,
                  strfmt("%s.tokenIds[%u]: token id %lld is outside [0, %lld) and not -1 (an "
                         "image position)",
                         where.c_str(), i, static_cast<long long>(id),
                         static_cast<long long>(lim.n_vocab)));
  }
  w.tokens = to_vector(tokens);
  w.non_causal = src.getNonCausal();
  w.state = src.getStateSlot();
  if (w.state < -1 || w.state >= lim.num_state_slots)
    return fail(WireErrc::kInvalid,
                strfmt("%s.stateSlot: %d is outside [-1, %lld) (-1: none; this model has %lld "
                       "recurrent state slots)",
                       where.c_str(), w.state, static_cast<long long>(lim.num_state_slots),
                       static_cast<long long>(lim.num_state_slots)));
  if (auto st = read_splices(src, stage, lim, where, w); !st) return st;
  if (auto st = read_blocks(src.getBlockTables(), stage, w.pos0 + count, lim, where, w.blocks); !st)
    return st;
  return read_sampling_part(src, lim, where, w);
}

Status check_step_limits(const StepLimits& l) {
  if (l.n_embd >= 1 && l.n_vocab >= 1 && l.block_size >= 1 && l.max_positions >= 1) return Ok{};
  return fail(WireErrc::kInvalid,
              "decode_step: StepLimits n_embd, n_vocab, block_size and "
              "max_positions must be >= 1");
}

Result<HiddenPtr> read_hidden(schemas::BatchDescriptor::Reader root, uint32_t stage,
                              int64_t num_tokens, int64_t n_embd) {
  if (stage == 0) {
    if (!root.hasHidden()) return HiddenPtr{};
    return fail(WireErrc::kInvalid,
                "BatchDescriptor.hidden: stage 0 embeds token ids, expected no hidden, got one");
  }
  if (!root.hasHidden())
    return fail(WireErrc::kInvalid, strfmt("BatchDescriptor.hidden: absent for stage %u", stage));
  auto v = schemas::read_tensor(root.getHidden());
  if (!v) return in_field("BatchDescriptor.hidden", v.error());
  if (auto st = schemas::expect_tensor(*v, {TensorDtype::kF32}, {num_tokens, n_embd},
                                       "BatchDescriptor.hidden");
      !st)
    return st.error();
  auto f = v->as<float>();
  return HiddenPtr(std::make_shared<const std::vector<float>>(f.begin(), f.end()));
}

}  // namespace

// ---- Steps -------------------------------------------------------------------------------------

Result<WireFrame> encode_step(const StepBatch& batch, HiddenPtr hidden, int64_t n_embd,
                              uint32_t stage, const SendInfo& send) {
  if (auto st = check_send(batch.epoch, send, "encode_step"); !st) return st.error();
  if (batch.microbatch < 0 || n_embd < 1) {
    return fail(WireErrc::kUnencodable, strfmt("encode_step: microbatch %d, n_embd %lld: expected "
                                               "microbatch >= 0 and n_embd >= 1",
                                               batch.microbatch, static_cast<long long>(n_embd)));
  }
  uint64_t num_tokens = 0;
  for (const SeqWork& w : batch.seqs) num_tokens += w.tokens.size();
  if ((stage == 0) != !hidden) {
    return fail(WireErrc::kUnencodable,
                strfmt("encode_step: stage %u %s hidden states", stage,
                       stage == 0 ? "embeds token ids, expected no" : "needs"));
  }
  if (hidden && hidden->size() != num_tokens * uint64_t(n_embd)) {
    return fail(
        WireErrc::kUnencodable,
        strfmt("encode_step: hidden has %zu floats, expected %llu tokens x %lld", hidden->size(),
               static_cast<unsigned long long>(num_tokens), static_cast<long long>(n_embd)));
  }
  return build_frame<schemas::BatchDescriptor>(
      "encode_step", [&](schemas::BatchDescriptor::Builder root, WireFrame::Impl& impl) -> Status {
        write_header(root.initHeader(), batch.epoch, send);
        root.setStepId(batch.step_id);
        root.setMicrobatch(static_cast<uint32_t>(batch.microbatch));
        root.setAttempt(send.attempt);
        root.setStage(stage);
        auto seqs = root.initSequences(static_cast<unsigned>(batch.seqs.size()));
        for (size_t i = 0; i < batch.seqs.size(); ++i)
          if (auto st = write_seq(seqs[unsigned(i)], batch.seqs[i], stage, i); !st)
            return st.error();
        if (hidden) {
          if (auto st = write_f32(root.initHidden(), *hidden, num_tokens, n_embd); !st)
            return in_field("encode_step: hidden", st.error());
          impl.payload = hidden;
        }
        return Ok{};
      });
}

Result<DecodedStep> decode_step(std::span<const uint8_t> frame, const StepLimits& lim) {
  if (auto st = check_step_limits(lim); !st) return st.error();
  return decode_frame<schemas::BatchDescriptor, DecodedStep>(
      frame, lim.max_frame_bytes, "BatchDescriptor",
      [&](schemas::BatchDescriptor::Reader root) -> Result<DecodedStep> {
        DecodedStep out;
        auto header = read_wire_header(root.getHeader(), lim.expected_epoch, "BatchDescriptor");
        if (!header) return header.error();
        out.header = *header;
        out.stage = root.getStage();
        out.attempt = root.getAttempt();
        out.deadline_ms = root.getDeadlineMs();
        auto batch = std::make_shared<StepBatch>();
        batch->epoch = out.header.cluster_epoch;
        batch->step_id = root.getStepId();
        if (root.getMicrobatch() > uint32_t(std::numeric_limits<int32_t>::max())) {
          return fail(WireErrc::kInvalid, strfmt("BatchDescriptor.microbatch: %u exceeds 2^31-1",
                                                 root.getMicrobatch()));
        }
        batch->microbatch = static_cast<int32_t>(root.getMicrobatch());
        auto seqs = root.getSequences();
        if (auto st = check_len("BatchDescriptor.sequences", seqs.size(), lim.max_seqs); !st)
          return st.error();
        if (seqs.size() == 0)
          return fail(WireErrc::kInvalid, "BatchDescriptor.sequences: empty, expected >= 1");
        batch->seqs.resize(seqs.size());
        int64_t num_tokens = 0;
        for (unsigned i = 0; i < seqs.size(); ++i) {
          const std::string where = strfmt("BatchDescriptor.sequences[%u]", i);
          if (auto st = read_seq(seqs[i], out.stage, lim, where, batch->seqs[i]); !st)
            return st.error();
          num_tokens += static_cast<int64_t>(batch->seqs[i].tokens.size());
          if (auto st = check_len("BatchDescriptor tokens (sum of counts)", size_t(num_tokens),
                                  lim.max_step_tokens);
              !st)
            return st.error();
        }
        auto hidden = read_hidden(root, out.stage, num_tokens, lim.n_embd);
        if (!hidden) return hidden.error();
        out.hidden = std::move(*hidden);
        out.batch = std::move(batch);
        return out;
      });
}

// ---- Step outcomes -----------------------------------------------------------------------------

namespace {

// Checks that out's results fit the wire and counts their logits rows.
Result<size_t> logits_rows(const StepOutcome& out, int64_t n_vocab) {
  size_t rows = 0;
  for (size_t i = 0; i < out.results.size(); ++i) {
    const SeqResult& r = out.results[i];
    if (r.seq_id < 0 || uint64_t(r.seq_id) > kMaxU32 || r.token < -1 || r.token >= n_vocab ||
        (!r.logits.empty() && r.logits.size() != size_t(n_vocab))) {
      return fail(WireErrc::kUnencodable,
                  strfmt("encode_step_outcome: results[%zu]: seq_id %lld, token %d, %zu logits: "
                         "expected seq_id in [0, 2^32), token in [-1, %lld), 0 or n_vocab logits",
                         i, static_cast<long long>(r.seq_id), r.token, r.logits.size(),
                         static_cast<long long>(n_vocab)));
    }
    rows += r.logits.empty() ? 0 : 1;
  }
  return rows;
}

}  // namespace

Result<WireFrame> encode_step_outcome(const StepOutcome& out, int64_t n_vocab,
                                      const SendInfo& send) {
  if (auto st = check_send(out.epoch, send, "encode_step_outcome"); !st) return st.error();
  if (out.microbatch < 0 || n_vocab < 1)
    return fail(WireErrc::kUnencodable, "encode_step_outcome: microbatch < 0 or n_vocab < 1");
  const bool failed = !out.error.empty();
  auto rows = failed ? Result<size_t>(size_t{0}) : logits_rows(out, n_vocab);
  if (!rows) return rows.error();
  return build_frame<schemas::StepResult>(
      "encode_step_outcome", [&](schemas::StepResult::Builder root, WireFrame::Impl&) -> Status {
        write_header(root.initHeader(), out.epoch, send);
        root.setStepId(out.step_id);
        root.setMicrobatch(static_cast<uint32_t>(out.microbatch));
        root.setAttempt(send.attempt);
        root.setComputeNs(to_ns(out.compute_seconds));
        if (failed) {
          write_error(root.initError(), out.error);
          return Ok{};
        }
        auto seqs = root.initSequences(static_cast<unsigned>(out.results.size()));
        std::vector<float> logits;
        logits.reserve(*rows * size_t(n_vocab));
        for (size_t i = 0; i < out.results.size(); ++i) {
          const SeqResult& r = out.results[i];
          auto s = seqs[unsigned(i)];
          s.setRequestId(static_cast<uint64_t>(r.seq_id) + 1);
          s.setSeqId(static_cast<uint32_t>(r.seq_id));
          s.setSampledToken(r.token);
          if (!r.error.empty()) s.setError(r.error.substr(0, kMaxErrorBytes));
          write_state(s.initSamplerState(), r.rng);
          s.setLogitsRowBegin(static_cast<uint32_t>(logits.size() / size_t(n_vocab)));
          s.setLogitsRowCount(r.logits.empty() ? 0 : 1);
          logits.insert(logits.end(), r.logits.begin(), r.logits.end());
        }
        if (*rows > 0) {
          const uint64_t shape[] = {*rows, static_cast<uint64_t>(n_vocab)};
          std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(logits.data()),
                                         logits.size() * sizeof(float));
          if (auto st =
                  schemas::set_tensor_copy(root.initLogits(), TensorDtype::kF32, shape, bytes);
              !st)
            return in_field("encode_step_outcome: logits", st.error());
        }
        return Ok{};
      });
}

namespace {

// Reads StepResult.sequences into `out`, the logits rows from `logits` (f32 [rows, n_vocab]).
Status read_results(capnp::List<schemas::SequenceResult>::Reader seqs,
                    std::span<const float> logits, int64_t n_vocab, StepOutcome& out) {
  const uint64_t num_rows = logits.size() / uint64_t(n_vocab);
  out.results.resize(seqs.size());
  for (unsigned i = 0; i < seqs.size(); ++i) {
    const std::string where = strfmt("StepResult.sequences[%u]", i);
    auto s = seqs[i];
    SeqResult& r = out.results[i];
    if (s.getRequestId() == 0) return fail(WireErrc::kInvalid, where + ".requestId: 0 is invalid");
    r.seq_id = s.getSeqId();
    r.token = s.getSampledToken();
    if (r.token < -1 || r.token >= n_vocab) {
      return fail(WireErrc::kInvalid,
                  strfmt("%s.sampledToken: %d is outside [-1, %lld)", where.c_str(), r.token,
                         static_cast<long long>(n_vocab)));
    }
    auto rng = read_state(s.getSamplerState(), where + ".samplerState");
    if (!rng) return rng.error();
    r.rng = *rng;
    if (s.hasError()) {
      const auto e = s.getError();
      r.error =
          one_line(Error{0, std::string(e.cStr(), std::min<size_t>(e.size(), kMaxErrorBytes))})
              .message;
      if (r.error.empty()) r.error = "the last stage ended the sequence without saying why";
      if (r.token != -1) {
        return fail(WireErrc::kInvalid, strfmt("%s: an error with sampled token %d, expected -1",
                                               where.c_str(), r.token));
      }
    }
    const uint64_t begin = s.getLogitsRowBegin();
    const uint64_t count = s.getLogitsRowCount();
    if (count > 1 || begin + count > num_rows) {
      return fail(WireErrc::kInvalid,
                  strfmt("%s: logits rows [%llu, +%llu): expected 0 or 1 rows inside the %llu "
                         "rows of StepResult.logits",
                         where.c_str(), static_cast<unsigned long long>(begin),
                         static_cast<unsigned long long>(count),
                         static_cast<unsigned long long>(num_rows)));
    }
    if (count == 1) {
      auto row = logits.subspan(begin * uint64_t(n_vocab), size_t(n_vocab));
      r.logits.assign(row.begin(), row.end());
    }
  }
  return Ok{};
}

}  // namespace

Result<DecodedOutcome> decode_step_outcome(std::span<const uint8_t> frame,
                                           const OutcomeLimits& lim) {
  if (lim.n_vocab < 1) return fail(WireErrc::kInvalid, "decode_step_outcome: n_vocab must be >= 1");
  return decode_frame<schemas::StepResult, DecodedOutcome>(
      frame, lim.max_frame_bytes, "StepResult",
      [&](schemas::StepResult::Reader root) -> Result<DecodedOutcome> {
        DecodedOutcome d;
        auto header = read_wire_header(root.getHeader(), lim.expected_epoch, "StepResult");
        if (!header) return header.error();
        d.header = *header;
        d.attempt = root.getAttempt();
        auto out = std::make_shared<StepOutcome>();
        out->epoch = d.header.cluster_epoch;
        out->step_id = root.getStepId();
        if (root.getMicrobatch() > uint32_t(std::numeric_limits<int32_t>::max()))
          return fail(WireErrc::kInvalid, "StepResult.microbatch: exceeds 2^31-1");
        out->microbatch = static_cast<int32_t>(root.getMicrobatch());
        out->compute_seconds = static_cast<double>(root.getComputeNs()) * 1e-9;
        auto seqs = root.getSequences();
        if (auto st = check_len("StepResult.sequences", seqs.size(), lim.max_seqs); !st)
          return st.error();
        if (root.hasError()) {
          if (seqs.size() != 0) {
            return fail(WireErrc::kInvalid,
                        strfmt("StepResult: an error with %u sequences, expected "
                               "none",
                               seqs.size()));
          }
          out->error = read_error(root.getError());
          d.outcome = std::move(out);
          return d;
        }
        schemas::TensorView logits;
        std::span<const float> rows;
        if (root.hasLogits()) {
          auto v = schemas::read_tensor(root.getLogits());
          if (!v) return in_field("StepResult.logits", v.error());
          if (auto st = schemas::expect_tensor(*v, {TensorDtype::kF32}, {-1, lim.n_vocab},
                                               "StepResult.logits");
              !st)
            return st.error();
          logits = *v;
          rows = logits.as<float>();
        }
        if (auto st = read_results(seqs, rows, lim.n_vocab, *out); !st) return st.error();
        d.outcome = std::move(out);
        return d;
      });
}

}  // namespace troupe::actors::detail
