// Tests of actors/detail/wire.h: round trips of steps, outcomes and expert messages that compare
// every field (and a sampler run on both sides), zero-copy sends of large tensors, one test per
// kind of malformed input (each asserting the error names the problem), and a byte-flip loop.
#include "actors/detail/wire.h"

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include "actors/detail/messages.h"
#include "compute/sampler.h"
#include "schemas/errc.h"
#include "schemas/expert.capnp.h"
#include "schemas/frame.h"
#include "schemas/step.capnp.h"
#include "tests/actors/wire_test_util.h"

namespace troupe::actors::detail {
namespace {

constexpr int64_t kEmbd = 8;
constexpr int64_t kVocab = 50;
constexpr int64_t kBlockSize = 4;
constexpr uint64_t kEpoch = 7;
const SendInfo kSend{
    .sender = {.node = 2, .role = ActorRole::kStage, .index = 1}, .seq = 11, .attempt = 3};

using testing::Bytes;
using testing::expect_error;
using testing::flip_bytes;
using testing::mutate;
using testing::schema;
using testing::wire;

StepLimits step_limits() {
  StepLimits l;
  l.n_embd = kEmbd;
  l.n_vocab = kVocab;
  l.block_size = kBlockSize;
  l.max_positions = 256;
  l.num_kv_blocks = 64;
  l.num_state_slots = 8;
  l.expected_epoch = kEpoch;
  return l;
}

std::shared_ptr<const compute::SamplingParams> penalized_params(int32_t last_n) {
  auto p = std::make_shared<compute::SamplingParams>();
  p->temperature = 0.8f;
  p->top_k = 20;
  p->top_p = 0.9f;
  p->min_p = 0.01f;
  p->repetition_penalty = 1.5f;
  p->presence_penalty = 0.75f;
  p->frequency_penalty = 0.5f;
  p->penalty_last_n = last_n;
  p->seed = 1234;
  p->stop_token_ids = {3, 9};
  p->ignore_eos = true;
  return p;
}

std::vector<int32_t> blocks_for(int64_t positions, int32_t first) {
  std::vector<int32_t> b;
  for (int64_t i = 0; i < (positions + kBlockSize - 1) / kBlockSize; ++i)
    b.push_back(first + static_cast<int32_t>(i));
  return b;
}

// Three sequences: a prefill chunk that does not sample, a decode step that samples with
// penalties over a history longer than penalty_last_n, and one that samples and wants logits.
StepBatch make_batch(int32_t last_n = 5) {
  StepBatch b;
  b.epoch = kEpoch;
  b.step_id = 42;
  b.microbatch = 1;
  SeqWork prefill;
  prefill.seq_id = 0;
  prefill.pos0 = 4;
  prefill.tokens = {1, 2, 3};
  prefill.blocks = blocks_for(7, 0);
  prefill.sampling = std::make_shared<const compute::SamplingParams>();
  prefill.rng = compute::Sampler::seeded_state(1);
  b.seqs.push_back(prefill);
  SeqWork decode;
  decode.seq_id = 5;
  decode.pos0 = 20;
  decode.tokens = {17};
  decode.blocks = blocks_for(21, 10);
  decode.sample = true;
  decode.sampling = penalized_params(last_n);
  decode.rng = compute::Sampler::seeded_state(99);
  decode.state = 7;  // recurrent state slots: the prefill has none (-1)
  std::vector<int32_t> hist;
  for (int32_t i = 0; i < 21; ++i) hist.push_back((i * 7) % kVocab);
  decode.history = std::make_shared<const std::vector<int32_t>>(hist);
  b.seqs.push_back(decode);
  SeqWork eval = decode;
  eval.seq_id = 9;
  eval.state = 0;
  eval.want_logits = true;
  eval.blocks = blocks_for(21, 30);
  b.seqs.push_back(eval);
  return b;
}

size_t num_tokens(const StepBatch& b) {
  size_t n = 0;
  for (const auto& w : b.seqs) n += w.tokens.size();
  return n;
}

HiddenPtr make_hidden(size_t tokens, int64_t n_embd = kEmbd) {
  auto h = std::make_shared<std::vector<float>>(tokens * static_cast<size_t>(n_embd));
  for (size_t i = 0; i < h->size(); ++i) (*h)[i] = 0.25f * static_cast<float>(i) - 1.0f;
  return h;
}

Bytes encode_valid_step(uint32_t stage = 1) {
  StepBatch b = make_batch();
  auto f = encode_step(b, stage == 0 ? nullptr : make_hidden(num_tokens(b)), kEmbd, stage, kSend);
  EXPECT_TRUE(f) << (f ? "" : f.error().message);
  return f ? f->flatten() : Bytes{};
}

void expect_same_params(const compute::SamplingParams& a, const compute::SamplingParams& b) {
  EXPECT_EQ(a.temperature, b.temperature);
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.top_p, b.top_p);
  EXPECT_EQ(a.min_p, b.min_p);
  EXPECT_EQ(a.repetition_penalty, b.repetition_penalty);
  EXPECT_EQ(a.presence_penalty, b.presence_penalty);
  EXPECT_EQ(a.frequency_penalty, b.frequency_penalty);
  EXPECT_EQ(a.penalty_last_n, b.penalty_last_n);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.stop_token_ids, b.stop_token_ids);
  EXPECT_EQ(a.ignore_eos, b.ignore_eos);
  EXPECT_TRUE(b.stop_strings.empty());  // stop strings stay with the router
}

// ---- Steps ----

TEST(WireStep, RoundTripKeepsEveryField) {
  const StepBatch b = make_batch();
  HiddenPtr hidden = make_hidden(num_tokens(b));
  auto f = encode_step(b, hidden, kEmbd, 1, kSend);
  ASSERT_TRUE(f) << f.error().message;
  const Bytes bytes = f->flatten();
  EXPECT_EQ(bytes.size(), f->size_bytes());
  auto d = decode_step(bytes, step_limits());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->header.cluster_epoch, kEpoch);
  EXPECT_EQ(d->header.sender, kSend.sender);
  EXPECT_EQ(d->header.seq, kSend.seq);
  EXPECT_EQ(d->stage, 1u);
  EXPECT_EQ(d->attempt, kSend.attempt);
  EXPECT_EQ(d->deadline_ms, 0u);
  const StepBatch& g = *d->batch;
  EXPECT_EQ(g.epoch, b.epoch);
  EXPECT_EQ(g.step_id, b.step_id);
  EXPECT_EQ(g.microbatch, b.microbatch);
  ASSERT_EQ(g.seqs.size(), b.seqs.size());
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    SCOPED_TRACE(i);
    const SeqWork& x = b.seqs[i];
    const SeqWork& y = g.seqs[i];
    EXPECT_EQ(y.seq_id, x.seq_id);
    EXPECT_EQ(y.pos0, x.pos0);
    EXPECT_EQ(y.state, x.state);
    EXPECT_EQ(y.tokens, x.tokens);
    EXPECT_EQ(y.blocks, x.blocks);
    EXPECT_EQ(y.sample, x.sample);
    EXPECT_EQ(y.want_logits, x.want_logits);
    EXPECT_EQ(y.rng, x.rng);
    ASSERT_TRUE(y.sampling);
    expect_same_params(*x.sampling, *y.sampling);
    if (x.history) {
      // Only the penalty window travels: the last penalty_last_n tokens.
      ASSERT_TRUE(y.history);
      const size_t n = static_cast<size_t>(x.sampling->penalty_last_n);
      EXPECT_EQ(*y.history, std::vector<int32_t>(x.history->end() - n, x.history->end()));
    } else {
      EXPECT_FALSE(y.history);
    }
  }
  ASSERT_TRUE(d->hidden);
  EXPECT_EQ(*d->hidden, *hidden);
}

// A constrained sequence: its grammar and the reply's tokens so far travel; a sequence without
// a grammar sends no reply tokens, and a frame that gives them to one is refused.
TEST(WireStep, GrammarAndReplyTokensTravelWithAConstrainedSequence) {
  StepBatch b = make_batch();
  auto p = std::make_shared<compute::SamplingParams>(*b.seqs[1].sampling);
  p->grammar = "root ::= [a-z]+ \"!\"\n";
  p->ignore_eos = false;  // refused with a grammar
  b.seqs[1].sampling = p;
  b.seqs[1].output = std::make_shared<const std::vector<int32_t>>(std::vector<int32_t>{3, 1, 4});
  b.seqs[2].output = std::make_shared<const std::vector<int32_t>>(std::vector<int32_t>{9});
  auto f = encode_step(b, make_hidden(num_tokens(b)), kEmbd, 1, kSend);
  ASSERT_TRUE(f) << f.error().message;
  const Bytes bytes = f->flatten();
  auto d = decode_step(bytes, step_limits());
  ASSERT_TRUE(d) << d.error().message;
  const auto& seqs = d->batch->seqs;
  EXPECT_EQ(seqs[1].sampling->grammar, p->grammar);
  ASSERT_TRUE(seqs[1].output);
  EXPECT_EQ(*seqs[1].output, (std::vector<int32_t>{3, 1, 4}));
  EXPECT_TRUE(seqs[2].sampling->grammar.empty());
  EXPECT_FALSE(seqs[2].output);  // no grammar: not sent
  Bytes stray = mutate<schemas::BatchDescriptor>(
      bytes, [](auto root) { root.getSequences()[2].initReplyTokens(2); });
  expect_error(decode_step(stray, step_limits()), wire(WireErrc::kInvalid),
               "sequences[2].replyTokens: only a sampled sequence with a grammar carries them");
  Bytes bad_id = mutate<schemas::BatchDescriptor>(
      bytes, [](auto root) { root.getSequences()[1].getReplyTokens().set(1, kVocab); });
  expect_error(decode_step(bad_id, step_limits()), wire(WireErrc::kInvalid),
               "sequences[1].replyTokens[1]: token id 50 is outside [0, 50)");
  Bytes huge = mutate<schemas::BatchDescriptor>(bytes, [](auto root) {
    root.getSequences()[1].getSampling().setGrammar(std::string((1 << 20) + 1, 'x'));
  });
  expect_error(decode_step(huge, step_limits()), wire(WireErrc::kTooLong),
               "sequences[1].sampling.grammar: 1048577 entries exceed the limit of 1048576");
}

TEST(WireStep, LogitsModeIsLastAndReturnLogitsCarriesWantLogits) {
  StepBatch b = make_batch();
  b.seqs[0].want_logits = true;  // a prefill chunk that returns its row without sampling
  auto f = encode_step(b, make_hidden(num_tokens(b)), kEmbd, 1, kSend);
  ASSERT_TRUE(f) << f.error().message;
  const Bytes bytes = f->flatten();
  auto r = schemas::read_frame(bytes, 1 << 20);
  ASSERT_TRUE(r);
  auto seqs = (*r)->getRoot<schemas::BatchDescriptor>().getSequences();
  for (unsigned i = 0; i < seqs.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(seqs[i].getLogits(), schemas::LogitsMode::LAST);
    EXPECT_EQ(seqs[i].getReturnLogits(), b.seqs[i].want_logits);
  }
  auto d = decode_step(bytes, step_limits());
  ASSERT_TRUE(d) << d.error().message;
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    EXPECT_EQ(d->batch->seqs[i].want_logits, b.seqs[i].want_logits);
    EXPECT_EQ(d->batch->seqs[i].sample, b.seqs[i].sample);
  }
  b.seqs[0].want_logits = false;  // neither sample nor logits: no row at all
  f = encode_step(b, make_hidden(num_tokens(b)), kEmbd, 1, kSend);
  ASSERT_TRUE(f);
  const Bytes none = f->flatten();
  r = schemas::read_frame(none, 1 << 20);
  ASSERT_TRUE(r);
  EXPECT_EQ((*r)->getRoot<schemas::BatchDescriptor>().getSequences()[0].getLogits(),
            schemas::LogitsMode::NONE);
}

TEST(WireStep, SamplerDrawsTheSameTokensOnBothSides) {
  for (int32_t last_n : {5, -1, 0}) {
    SCOPED_TRACE(last_n);
    const StepBatch b = make_batch(last_n);
    auto f = encode_step(b, make_hidden(num_tokens(b)), kEmbd, 1, kSend);
    ASSERT_TRUE(f) << f.error().message;
    auto d = decode_step(f->flatten(), step_limits());
    ASSERT_TRUE(d) << d.error().message;
    const SeqWork& x = b.seqs[1];
    const SeqWork& y = d->batch->seqs[1];
    if (last_n == 0) {
      EXPECT_FALSE(y.history);  // penalties off: no history sent
    } else if (last_n == -1) {
      EXPECT_EQ(*y.history, *x.history);
    }
    compute::Sampler here(*x.sampling);
    compute::Sampler there(*y.sampling);
    ASSERT_TRUE(here.set_state(x.rng));
    ASSERT_TRUE(there.set_state(y.rng));
    static const std::vector<int32_t> kNone;
    std::mt19937 gen(5);
    std::normal_distribution<float> logit(0.0f, 2.0f);
    int differs_without_penalties = 0;
    for (int draw = 0; draw < 200; ++draw) {
      std::vector<float> row(kVocab);
      for (float& v : row) v = logit(gen);
      const compute::SamplerState before = here.state();
      const int32_t a = here.sample(row, *x.history);
      const int32_t c = there.sample(row, y.history ? *y.history : kNone);
      ASSERT_EQ(a, c) << "draw " << draw;
      ASSERT_EQ(here.state(), there.state());
      compute::Sampler plain(*x.sampling);
      ASSERT_TRUE(plain.set_state(before));
      differs_without_penalties += plain.sample(row, kNone) != a;
    }
    // The history matters (so the test would catch a wrong window) unless penalties are off.
    if (last_n != 0) {
      EXPECT_GT(differs_without_penalties, 0);
    }
  }
}

TEST(WireStep, StageZeroTakesTokensWithoutHidden) {
  const StepBatch b = make_batch();
  auto f = encode_step(b, nullptr, kEmbd, 0, kSend);
  ASSERT_TRUE(f) << f.error().message;
  auto d = decode_step(f->flatten(), step_limits());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->stage, 0u);
  EXPECT_FALSE(d->hidden);
  expect_error(encode_step(b, make_hidden(num_tokens(b)), kEmbd, 0, kSend),
               wire(WireErrc::kUnencodable), "stage 0 embeds token ids");
  expect_error(encode_step(b, nullptr, kEmbd, 2, kSend), wire(WireErrc::kUnencodable),
               "stage 2 needs hidden states");
}

TEST(WireStep, LargeHiddenIsSentWithoutCopy) {
  StepBatch b = make_batch();
  constexpr int64_t kWide = 1024;
  b.seqs[0].tokens.assign(500, 1);
  b.seqs[0].blocks = blocks_for(b.seqs[0].pos0 + 500, 0);
  HiddenPtr hidden = make_hidden(num_tokens(b), kWide);  // 502 x 1024 f32 = 2 MB
  const uint8_t* data = reinterpret_cast<const uint8_t*>(hidden->data());
  const size_t bytes = hidden->size() * sizeof(float);
  auto f = encode_step(b, hidden, kWide, 1, kSend);
  ASSERT_TRUE(f) << f.error().message;
  size_t others = 0;
  int found = 0;
  for (const auto& piece : f->iov()) {
    if (piece.data() == data && piece.size() == bytes) {
      ++found;
    } else {
      others += piece.size();
    }
  }
  EXPECT_EQ(found, 1) << "the hidden states must be one iov piece pointing at the caller's buffer";
  EXPECT_LT(others, 16u * 1024) << "only the descriptor is copied into the message";
  // The frame keeps the buffer alive after the sender lets go of it, and keep_alive() keeps it
  // after the frame itself is gone (what a transport holds while an async send runs).
  std::weak_ptr<const std::vector<float>> weak = hidden;
  hidden.reset();
  WireFrame frame = std::move(*f);
  f = Error{};
  EXPECT_FALSE(weak.expired());
  StepLimits lim = step_limits();
  lim.n_embd = kWide;
  lim.max_positions = 1024;
  lim.num_kv_blocks = 256;
  auto d = decode_step(frame.flatten(), lim);
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->hidden->size(), num_tokens(b) * kWide);
  EXPECT_EQ((*d->hidden)[12345], 0.25f * 12345 - 1.0f);
  std::shared_ptr<const void> keep = frame.keep_alive();
  frame = WireFrame();
  EXPECT_FALSE(weak.expired());
  keep.reset();
  EXPECT_TRUE(weak.expired());
}

TEST(WireStep, OddSizedHiddenIsCopied) {
  // 5 tokens x 3 floats = 60 bytes, not a whole number of words, and no spare capacity.
  StepBatch b = make_batch();
  auto hidden = std::make_shared<std::vector<float>>(15, 1.5f);
  hidden->shrink_to_fit();
  ASSERT_EQ(hidden->capacity(), 15u) << "precondition: no spare capacity to pad into";
  auto f = encode_step(b, hidden, 3, 1, kSend);
  ASSERT_TRUE(f) << f.error().message;
  for (const auto& piece : f->iov())
    EXPECT_NE(piece.data(), reinterpret_cast<const uint8_t*>(hidden->data()));
  StepLimits lim = step_limits();
  lim.n_embd = 3;
  auto d = decode_step(f->flatten(), lim);
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(*d->hidden, *hidden);
}

// ---- Malformed steps: one test per way a frame can be bad ----

TEST(WireStep, RejectsTruncatedFrame) {
  Bytes frame = encode_valid_step();
  frame.resize(frame.size() - 8);
  expect_error(decode_step(frame, step_limits()), schema(schemas::Errc::kTruncated), "need");
}

TEST(WireStep, RejectsHiddenOfWrongDtype) {
  Bytes frame = mutate<schemas::BatchDescriptor>(encode_valid_step(), [](auto root) {
    auto t = root.getHidden();
    t.setDtype(schemas::DType::BF16);
    t.initData(static_cast<unsigned>(5 * kEmbd * 2));  // a valid bf16 [5, 8] tensor
  });
  expect_error(decode_step(frame, step_limits()), schema(schemas::Errc::kShapeMismatch),
               "BatchDescriptor.hidden: expected f32 [5, 8], got bf16 [5, 8]");
}

TEST(WireStep, RejectsHiddenOfWrongShape) {
  Bytes frame = mutate<schemas::BatchDescriptor>(encode_valid_step(), [](auto root) {
    auto t = root.getHidden();
    t.getShape().set(0, 4);
    t.initData(static_cast<unsigned>(4 * kEmbd * 4));
  });
  expect_error(decode_step(frame, step_limits()), schema(schemas::Errc::kShapeMismatch),
               "BatchDescriptor.hidden: expected f32 [5, 8], got f32 [4, 8]");
}

TEST(WireStep, RejectsMissingHiddenAfterStageZero) {
  Bytes frame =
      mutate<schemas::BatchDescriptor>(encode_valid_step(), [](auto root) { root.disownHidden(); });
  expect_error(decode_step(frame, step_limits()), wire(WireErrc::kInvalid),
               "BatchDescriptor.hidden: absent for stage 1");
}

TEST(WireStep, RejectsTokenOutOfRange) {
  Bytes frame = mutate<schemas::BatchDescriptor>(
      encode_valid_step(), [](auto root) { root.getSequences()[0].getTokenIds().set(1, kVocab); });
  expect_error(decode_step(frame, step_limits()), wire(WireErrc::kInvalid),
               "BatchDescriptor.sequences[0].tokenIds[1]: token id 50 is outside [0, 50)");
}

TEST(WireStep, RejectsCountThatDisagreesWithTokens) {
  Bytes frame = mutate<schemas::BatchDescriptor>(
      encode_valid_step(), [](auto root) { root.getSequences()[0].setCount(4); });
  expect_error(decode_step(frame, step_limits()), wire(WireErrc::kInvalid),
               "sequences[0]: count 4 with 3 tokenIds");
}

TEST(WireStep, RejectsPositionsBeyondContext) {
  Bytes frame = mutate<schemas::BatchDescriptor>(
      encode_valid_step(), [](auto root) { root.getSequences()[1].setPos0(256); });
  expect_error(decode_step(frame, step_limits()), wire(WireErrc::kInvalid),
               "pos0 256 + count 1 exceed the context of 256");
}

// A recurrent state slot outside the receiver's slots, or any slot for a model without them.
TEST(WireStep, RejectsStateSlotOutOfRange) {
  Bytes frame = mutate<schemas::BatchDescriptor>(
      encode_valid_step(), [](auto root) { root.getSequences()[1].setStateSlot(8); });
  expect_error(decode_step(frame, step_limits()), wire(WireErrc::kInvalid),
               "BatchDescriptor.sequences[1].stateSlot: 8 is outside [-1, 8)");
  frame = mutate<schemas::BatchDescriptor>(
      encode_valid_step(), [](auto root) { root.getSequences()[0].setStateSlot(-2); });
  expect_error(decode_step(frame, step_limits()), wire(WireErrc::kInvalid),
               "sequences[0].stateSlot: -2 is outside [-1, 8)");
  StepLimits none = step_limits();
  none.num_state_slots = 0;
  expect_error(decode_step(encode_valid_step(), none), wire(WireErrc::kInvalid),
               "sequences[1].stateSlot: 7 is outside [-1, 0) (-1: none; this model has 0 "
               "recurrent state slots)");
}

TEST(WireStep, RejectsBlockTableTooShort) {
  Bytes frame = mutate<schemas::BatchDescriptor>(encode_valid_step(), [](auto root) {
    root.getSequences()[1].getBlockTables()[0].initBlockIds(5);  // 21 positions need 6
  });
  expect_error(decode_step(frame, step_limits()), wire(WireErrc::kInvalid),
               "sequences[1].blockTables[0].blockIds: block table too short: 21 positions at "
               "block size 4 need 6 blocks, got 5");
}

TEST(WireStep, RejectsBlockIdOutOfPool) {
  Bytes frame = mutate<schemas::BatchDescriptor>(encode_valid_step(), [](auto root) {
    root.getSequences()[0].getBlockTables()[0].getBlockIds().set(1, 64);
  });
  expect_error(decode_step(frame, step_limits()), wire(WireErrc::kInvalid),
               "blockIds[1]: block id 64 is outside [0, 64)");
}

TEST(WireStep, RejectsMissingBlockTableForThisStage) {
  Bytes frame = mutate<schemas::BatchDescriptor>(encode_valid_step(), [](auto root) {
    root.getSequences()[2].getBlockTables()[0].setStage(0);
  });
  expect_error(decode_step(frame, step_limits()), wire(WireErrc::kInvalid),
               "sequences[2].blockTables: no table for stage 1");
}

TEST(WireStep, RejectsZeroSamplerState) {
  Bytes frame = mutate<schemas::BatchDescriptor>(encode_valid_step(), [](auto root) {
    auto s = root.getSequences()[1].getSamplerState();
    s.setS0(0);
    s.setS1(0);
    s.setS2(0);
    s.setS3(0);
  });
  expect_error(decode_step(frame, step_limits()), wire(WireErrc::kInvalid),
               "sequences[1].samplerState: sampler state is all zero");
}

TEST(WireStep, RejectsInvalidSamplingParams) {
  Bytes frame = mutate<schemas::BatchDescriptor>(
      encode_valid_step(), [](auto root) { root.getSequences()[1].getSampling().setTopP(0); });
  expect_error(decode_step(frame, step_limits()), wire(WireErrc::kInvalid),
               "sequences[1].sampling: top_p must be in (0, 1]");
}

TEST(WireStep, RejectsSampleWithoutParams) {
  Bytes frame = mutate<schemas::BatchDescriptor>(
      encode_valid_step(), [](auto root) { root.getSequences()[1].disownSampling(); });
  expect_error(decode_step(frame, step_limits()), wire(WireErrc::kInvalid),
               "sequences[1].sampling: absent, sample is true");
}

TEST(WireStep, RejectsUnknownLogitsMode) {
  Bytes frame = mutate<schemas::BatchDescriptor>(encode_valid_step(), [](auto root) {
    root.getSequences()[0].setLogits(static_cast<schemas::LogitsMode>(7));
  });
  expect_error(decode_step(frame, step_limits()), wire(WireErrc::kInvalid),
               "sequences[0].logits: unknown logits mode 7");
}

TEST(WireStep, RejectsAllLogitsModeAndLogitsWithoutARow) {
  Bytes all = mutate<schemas::BatchDescriptor>(encode_valid_step(), [](auto root) {
    root.getSequences()[2].setLogits(schemas::LogitsMode::ALL);
  });
  expect_error(decode_step(all, step_limits()), wire(WireErrc::kUnsupported),
               "sequences[2].logits: all (one row per new position) is not supported");
  Bytes none = mutate<schemas::BatchDescriptor>(encode_valid_step(), [](auto root) {
    root.getSequences()[0].setReturnLogits(true);  // seq 0 neither samples nor has a row
  });
  expect_error(decode_step(none, step_limits()), wire(WireErrc::kInvalid),
               "sequences[0].returnLogits: returning logits needs a logits row, logits is none");
}

TEST(WireStep, RejectsHistoryLongerThanPenaltyWindow) {
  Bytes frame = mutate<schemas::BatchDescriptor>(
      encode_valid_step(), [](auto root) { root.getSequences()[1].initPenaltyHistory(6); });
  expect_error(decode_step(frame, step_limits()), wire(WireErrc::kTooLong),
               "sequences[1].penaltyHistory: 6 entries exceed the limit of 5");
}

TEST(WireStep, RejectsZeroRequestId) {
  Bytes frame = mutate<schemas::BatchDescriptor>(
      encode_valid_step(), [](auto root) { root.getSequences()[2].setRequestId(0); });
  expect_error(decode_step(frame, step_limits()), wire(WireErrc::kInvalid),
               "sequences[2].requestId: 0 is invalid");
}

// A prefill chunk with two runs of image positions (-1) and their rows.
StepBatch image_batch() {
  StepBatch b = make_batch();
  SeqWork& w = b.seqs[0];
  w.tokens = {1, -1, -1, 4, -1};
  w.blocks = blocks_for(w.pos0 + 5, 0);
  auto rows = std::make_shared<std::vector<float>>(3 * kEmbd);
  for (size_t i = 0; i < rows->size(); ++i) (*rows)[i] = 0.5f * static_cast<float>(i) - 3.f;
  w.image_rows = rows;
  w.non_causal = true;
  return b;
}

TEST(WireStep, ImageRowsGoToStageZeroAsSplices) {
  const StepBatch b = image_batch();
  auto f0 = encode_step(b, nullptr, kEmbd, 0, kSend);
  ASSERT_TRUE(f0) << f0.error().message;
  auto d0 = decode_step(f0->flatten(), step_limits());
  ASSERT_TRUE(d0) << d0.error().message;
  const SeqWork& w0 = d0->batch->seqs[0];
  EXPECT_EQ(w0.tokens, b.seqs[0].tokens);
  ASSERT_TRUE(w0.image_rows);
  EXPECT_EQ(*w0.image_rows, *b.seqs[0].image_rows);
  EXPECT_TRUE(w0.non_causal);
  EXPECT_FALSE(d0->batch->seqs[1].image_rows);
  EXPECT_FALSE(d0->batch->seqs[1].non_causal);
  // A later stage gets the positions (and the attention rule) but not the rows.
  auto f1 = encode_step(b, make_hidden(num_tokens(b)), kEmbd, 1, kSend);
  ASSERT_TRUE(f1) << f1.error().message;
  auto d1 = decode_step(f1->flatten(), step_limits());
  ASSERT_TRUE(d1) << d1.error().message;
  EXPECT_EQ(d1->batch->seqs[0].tokens, b.seqs[0].tokens);
  EXPECT_FALSE(d1->batch->seqs[0].image_rows);
  EXPECT_TRUE(d1->batch->seqs[0].non_causal);
  // Rows that do not match the image positions are not sent.
  StepBatch bad = image_batch();
  bad.seqs[0].image_rows = std::make_shared<const std::vector<float>>(2 * kEmbd + 1);
  expect_error(encode_step(bad, nullptr, kEmbd, 0, kSend), wire(WireErrc::kUnencodable),
               "seqs[0]: 3 image positions but");
}

Bytes encode_image_step() {
  auto f = encode_step(image_batch(), nullptr, kEmbd, 0, kSend);
  EXPECT_TRUE(f) << (f ? "" : f.error().message);
  return f ? f->flatten() : Bytes{};
}

TEST(WireStep, RejectsSplicesThatDoNotCoverTheImagePositions) {
  Bytes offset = mutate<schemas::BatchDescriptor>(
      encode_image_step(), [](auto root) { root.getSequences()[0].getSplices()[1].setOffset(3); });
  expect_error(decode_step(offset, step_limits()), wire(WireErrc::kInvalid),
               "sequences[0].splices[1].offset: 3, expected 4");
  Bytes missing = mutate<schemas::BatchDescriptor>(
      encode_image_step(), [](auto root) { root.getSequences()[0].disownSplices(); });
  expect_error(decode_step(missing, step_limits()), wire(WireErrc::kInvalid),
               "sequences[0].splices: 0 splices for 2 runs of image positions");
  Bytes extra_run = mutate<schemas::BatchDescriptor>(encode_image_step(), [](auto root) {
    root.getSequences()[0].getTokenIds().set(3, -1);  // the two runs become one
  });
  expect_error(decode_step(extra_run, step_limits()), wire(WireErrc::kInvalid),
               "sequences[0].splices: 2 splices for 1 runs");
  Bytes negative = mutate<schemas::BatchDescriptor>(
      encode_image_step(), [](auto root) { root.getSequences()[0].getTokenIds().set(0, -2); });
  expect_error(decode_step(negative, step_limits()), wire(WireErrc::kInvalid),
               "tokenIds[0]: token id -2 is outside [0, 50) and not -1");
  // Splices for a stage that takes hidden states.
  Bytes later = mutate<schemas::BatchDescriptor>(
      encode_valid_step(), [](auto root) { root.getSequences()[0].initSplices(1); });
  expect_error(decode_step(later, step_limits()), wire(WireErrc::kInvalid),
               "sequences[0].splices: 1 image splices sent to stage 1");
}

TEST(WireStep, RejectsSpliceOfWrongShape) {
  StepBatch b = image_batch();
  auto f = encode_step(b, nullptr, kEmbd, 0, kSend);
  ASSERT_TRUE(f);
  StepLimits wide = step_limits();
  wide.n_embd = kEmbd + 1;  // the receiver's model is wider than the rows sent
  expect_error(decode_step(f->flatten(), wide), schema(schemas::Errc::kShapeMismatch),
               "BatchDescriptor.sequences[0].splices[0].embeddings: expected f32 [2, 9], got f32 "
               "[2, 8]");
}

TEST(WireStep, RejectsUnsupportedLogprobs) {
  Bytes logprobs = mutate<schemas::BatchDescriptor>(encode_valid_step(), [](auto root) {
    root.getSequences()[1].getSampling().setNumLogprobs(5);
  });
  expect_error(decode_step(logprobs, step_limits()), wire(WireErrc::kUnsupported),
               "sequences[1].sampling.numLogprobs: expected 0");
}

TEST(WireStep, RejectsOversizedLists) {
  StepLimits lim = step_limits();
  lim.max_seqs = 2;
  expect_error(decode_step(encode_valid_step(), lim), wire(WireErrc::kTooLong),
               "BatchDescriptor.sequences: 3 entries exceed the limit of 2");
  lim = step_limits();
  lim.max_step_tokens = 4;
  expect_error(decode_step(encode_valid_step(), lim), wire(WireErrc::kTooLong),
               "tokens (sum of counts): 5 entries exceed the limit of 4");
  Bytes long_table = mutate<schemas::BatchDescriptor>(encode_valid_step(), [](auto root) {
    root.getSequences()[0].getBlockTables()[0].initBlockIds(65);  // 256 positions need 64
  });
  expect_error(decode_step(long_table, step_limits()), wire(WireErrc::kTooLong),
               "blockIds: 65 entries exceed the limit of 64");
}

TEST(WireStep, RejectsStaleEpochAndBadHeader) {
  StepLimits lim = step_limits();
  lim.expected_epoch = kEpoch + 1;
  expect_error(decode_step(encode_valid_step(), lim), schema(schemas::Errc::kStaleEpoch),
               "BatchDescriptor.header: message from epoch 7, receiver is in epoch 8");
  Bytes no_seq = mutate<schemas::BatchDescriptor>(encode_valid_step(),
                                                  [](auto root) { root.getHeader().setSeq(0); });
  expect_error(decode_step(no_seq, step_limits()), schema(schemas::Errc::kBadHeader),
               "header seq is unset");
}

TEST(WireStep, RejectsRandomGarbage) {
  std::mt19937 gen(17);
  for (size_t size : {0, 7, 8, 64, 4096}) {
    Bytes junk(size);
    for (uint8_t& x : junk) x = static_cast<uint8_t>(gen());
    auto d = decode_step(junk, step_limits());
    ASSERT_FALSE(d) << size;
    EXPECT_FALSE(d.error().message.empty());
  }
  // Words that pass the segment-table check but whose root pointer is garbage.
  Bytes junk(64);
  for (uint8_t& x : junk) x = static_cast<uint8_t>(gen());
  const uint32_t table[2] = {0, 7};  // one segment of 7 words
  std::memcpy(junk.data(), table, sizeof(table));
  auto d = decode_step(junk, step_limits());
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().code, schema(schemas::Errc::kMalformed)) << d.error().message;
}

// ---- Outcomes ----

StepOutcome make_outcome() {
  StepOutcome o;
  o.epoch = kEpoch;
  o.step_id = 42;
  o.microbatch = 1;
  o.compute_seconds = 0.125;
  for (int i = 0; i < 3; ++i) {
    SeqResult r;
    r.seq_id = i * 4;
    r.token = i == 0 ? -1 : 10 + i;
    r.rng = compute::Sampler::seeded_state(static_cast<uint64_t>(i + 1));
    if (i == 1) {
      r.logits.resize(kVocab);
      for (int64_t v = 0; v < kVocab; ++v) r.logits[v] = 0.5f * static_cast<float>(v);
    }
    o.results.push_back(r);
  }
  return o;
}

OutcomeLimits outcome_limits() {
  OutcomeLimits l;
  l.n_vocab = kVocab;
  l.expected_epoch = kEpoch;
  return l;
}

Bytes encode_valid_outcome() {
  auto f = encode_step_outcome(make_outcome(), kVocab, kSend);
  EXPECT_TRUE(f) << (f ? "" : f.error().message);
  return f ? f->flatten() : Bytes{};
}

TEST(WireOutcome, RoundTripKeepsEveryField) {
  const StepOutcome o = make_outcome();
  auto d = decode_step_outcome(encode_valid_outcome(), outcome_limits());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->header.sender, kSend.sender);
  EXPECT_EQ(d->attempt, kSend.attempt);
  const StepOutcome& g = *d->outcome;
  EXPECT_EQ(g.epoch, o.epoch);
  EXPECT_EQ(g.step_id, o.step_id);
  EXPECT_EQ(g.microbatch, o.microbatch);
  EXPECT_DOUBLE_EQ(g.compute_seconds, o.compute_seconds);
  EXPECT_TRUE(g.error.empty());
  ASSERT_EQ(g.results.size(), o.results.size());
  for (size_t i = 0; i < o.results.size(); ++i) {
    EXPECT_EQ(g.results[i].seq_id, o.results[i].seq_id);
    EXPECT_EQ(g.results[i].token, o.results[i].token);
    EXPECT_EQ(g.results[i].rng, o.results[i].rng);
    EXPECT_EQ(g.results[i].logits, o.results[i].logits);
  }
}

TEST(WireOutcome, ErrorRoundTripsWithoutSequences) {
  StepOutcome o = make_outcome();
  o.error = "stage 1: KV pool exhausted";
  auto f = encode_step_outcome(o, kVocab, kSend);
  ASSERT_TRUE(f) << f.error().message;
  auto d = decode_step_outcome(f->flatten(), outcome_limits());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->outcome->error, o.error);
  EXPECT_TRUE(d->outcome->results.empty());
  o.error = std::string(5000, 'x');  // cut to the 1 KiB the schema allows
  f = encode_step_outcome(o, kVocab, kSend);
  ASSERT_TRUE(f);
  d = decode_step_outcome(f->flatten(), outcome_limits());
  ASSERT_TRUE(d);
  EXPECT_EQ(d->outcome->error.size(), kMaxErrorBytes);
}

TEST(WireOutcome, ASequencesErrorEndsOnlyIt) {
  StepOutcome o = make_outcome();
  o.results[1].token = -1;
  o.results[1].error = "the grammar allows no token of the vocabulary after the reply's 3 tokens";
  auto f = encode_step_outcome(o, kVocab, kSend);
  ASSERT_TRUE(f) << f.error().message;
  const Bytes bytes = f->flatten();
  auto d = decode_step_outcome(bytes, outcome_limits());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_TRUE(d->outcome->error.empty());
  EXPECT_EQ(d->outcome->results[1].error, o.results[1].error);
  EXPECT_EQ(d->outcome->results[1].token, -1);
  EXPECT_TRUE(d->outcome->results[0].error.empty());
  EXPECT_EQ(d->outcome->results[2].token, o.results[2].token);
  // An error beside a sampled token is refused; control characters in one become spaces.
  Bytes both =
      mutate<schemas::StepResult>(bytes, [](auto root) { root.getSequences()[2].setError("no"); });
  expect_error(decode_step_outcome(both, outcome_limits()), wire(WireErrc::kInvalid),
               "StepResult.sequences[2]: an error with sampled token 12, expected -1");
  Bytes ctl = mutate<schemas::StepResult>(
      bytes, [](auto root) { root.getSequences()[1].setError("bad\nline"); });
  auto c = decode_step_outcome(ctl, outcome_limits());
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->outcome->results[1].error, "bad line");
}

TEST(WireOutcome, RejectsBadResults) {
  Bytes token = mutate<schemas::StepResult>(
      encode_valid_outcome(), [](auto root) { root.getSequences()[2].setSampledToken(kVocab); });
  expect_error(decode_step_outcome(token, outcome_limits()), wire(WireErrc::kInvalid),
               "StepResult.sequences[2].sampledToken: 50 is outside [-1, 50)");
  Bytes rows = mutate<schemas::StepResult>(
      encode_valid_outcome(), [](auto root) { root.getSequences()[1].setLogitsRowBegin(1); });
  expect_error(decode_step_outcome(rows, outcome_limits()), wire(WireErrc::kInvalid),
               "sequences[1]: logits rows [1, +1): expected 0 or 1 rows inside the 1 rows");
  Bytes zero = mutate<schemas::StepResult>(
      encode_valid_outcome(), [](auto root) { root.getSequences()[0].initSamplerState(); });
  expect_error(decode_step_outcome(zero, outcome_limits()), wire(WireErrc::kInvalid),
               "sequences[0].samplerState: sampler state is all zero");
  Bytes shape = mutate<schemas::StepResult>(
      encode_valid_outcome(), [](auto root) { root.getLogits().getShape().set(1, kVocab + 1); });
  // [1, 51] with 50 floats of data: the tensor itself is inconsistent.
  expect_error(decode_step_outcome(shape, outcome_limits()), schema(schemas::Errc::kBadShape),
               "StepResult.logits:");
  Bytes both = mutate<schemas::StepResult>(encode_valid_outcome(),
                                           [](auto root) { root.initError().setMessage("boom"); });
  expect_error(decode_step_outcome(both, outcome_limits()), wire(WireErrc::kInvalid),
               "StepResult: an error with 3 sequences, expected none");
}

// ---- Experts ----

ExpertRequestPtr make_expert_request() {
  auto r = std::make_shared<ExpertRequest>();
  r->layer = 3;
  r->experts = {1, 4, 6};
  r->rows = {2, 1, 3};
  r->x.resize(6 * kEmbd);
  for (size_t i = 0; i < r->x.size(); ++i) r->x[i] = static_cast<float>(i) * 0.5f;
  r->y = r->x;
  for (float& v : r->y) v = -v;
  return r;
}

const ExpertStep kExpertStep{.epoch = kEpoch, .step_id = 42, .microbatch = 1};
const std::vector<int32_t> kOwned = {1, 4, 6, 8};

DispatchLimits dispatch_limits() {
  DispatchLimits l;
  l.n_embd = kEmbd;
  l.n_layer = 8;
  l.owned = kOwned;
  l.expected_epoch = kEpoch;
  return l;
}

TEST(WireExpert, DispatchRoundTripSendsRowsWithoutCopy) {
  ExpertRequestPtr req = make_expert_request();
  auto f = encode_expert_dispatch(req, kEmbd, kExpertStep, kSend);
  ASSERT_TRUE(f) << f.error().message;
  int found = 0;
  for (const auto& piece : f->iov())
    found += piece.data() == reinterpret_cast<const uint8_t*>(req->x.data());
  EXPECT_EQ(found, 1);
  const Bytes bytes = f->flatten();
  auto r = schemas::read_frame(bytes, 1 << 20);
  ASSERT_TRUE(r);
  auto root = (*r)->getRoot<schemas::ExpertDispatch>();
  ASSERT_EQ(root.getExpertIds().size(), 6u);  // one id per row
  EXPECT_EQ(root.getExpertIds()[2], 4u);
  EXPECT_EQ(root.getWeights().size(), 0u);  // unweighted: the stage weights the outputs
  auto d = decode_expert_dispatch(bytes, dispatch_limits());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->header.sender, kSend.sender);
  EXPECT_EQ(d->step, kExpertStep);
  EXPECT_EQ(d->attempt, kSend.attempt);
  EXPECT_EQ(d->request->layer, req->layer);
  EXPECT_EQ(d->request->experts, req->experts);
  EXPECT_EQ(d->request->rows, req->rows);
  EXPECT_EQ(d->request->x, req->x);
  EXPECT_EQ(d->request->y.size(), req->x.size());
  ASSERT_TRUE(d->request->done);
}

TEST(WireExpert, CombineRoundTripAndError) {
  ExpertRequestPtr req = make_expert_request();
  auto f = encode_expert_combine(req, kEmbd, kExpertStep, kSend, 0.002);
  ASSERT_TRUE(f) << f.error().message;
  CombineLimits lim{.n_embd = kEmbd, .expected_rows = 6, .expected_epoch = kEpoch};
  auto d = decode_expert_combine(f->flatten(), lim);
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->step, kExpertStep);
  EXPECT_EQ(d->layer, 3u);
  EXPECT_EQ(d->y, req->y);
  EXPECT_TRUE(d->error.empty());
  EXPECT_NEAR(d->compute_seconds, 0.002, 1e-9);
  lim.expected_rows = 5;
  expect_error(decode_expert_combine(f->flatten(), lim), schema(schemas::Errc::kShapeMismatch),
               "ExpertCombine.outputs: expected f32 [5, 8], got f32 [6, 8]");
  // expected_rows 0: any row count (the caller checks y against its dispatch).
  auto any = decode_expert_combine(f->flatten(), {.n_embd = kEmbd, .expected_rows = 0});
  ASSERT_TRUE(any) << any.error().message;
  EXPECT_EQ(any->y, req->y);
  req->error = "expert 4 is not owned by shard 0";
  f = encode_expert_combine(req, kEmbd, kExpertStep, kSend, 0);
  ASSERT_TRUE(f) << f.error().message;
  d = decode_expert_combine(f->flatten(), lim);
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->error, req->error);
  EXPECT_TRUE(d->y.empty());
}

TEST(WireExpert, RejectsExpertNotOwned) {
  auto f = encode_expert_dispatch(make_expert_request(), kEmbd, kExpertStep, kSend);
  ASSERT_TRUE(f);
  DispatchLimits lim = dispatch_limits();
  const std::vector<int32_t> owned = {1, 6};
  lim.owned = owned;
  expect_error(decode_expert_dispatch(f->flatten(), lim), wire(WireErrc::kInvalid),
               "ExpertDispatch.expertIds[2]: expert 4 is not owned by this shard");
}

TEST(WireExpert, RejectsBadDispatches) {
  auto f = encode_expert_dispatch(make_expert_request(), kEmbd, kExpertStep, kSend);
  ASSERT_TRUE(f);
  const Bytes valid = f->flatten();
  Bytes weights = mutate<schemas::ExpertDispatch>(valid, [](auto root) { root.initWeights(6); });
  expect_error(decode_expert_dispatch(weights, dispatch_limits()), wire(WireErrc::kUnsupported),
               "ExpertDispatch.weights: 6 weights, expected none");
  Bytes layer = mutate<schemas::ExpertDispatch>(valid, [](auto root) { root.setLayer(8); });
  expect_error(decode_expert_dispatch(layer, dispatch_limits()), wire(WireErrc::kInvalid),
               "ExpertDispatch.layer: 8 is outside [0, 8)");
  Bytes ids = mutate<schemas::ExpertDispatch>(valid, [](auto root) { root.initExpertIds(5); });
  DispatchLimits lim = dispatch_limits();
  const std::vector<int32_t> with_zero = {0, 1, 4, 6};
  lim.owned = with_zero;
  expect_error(decode_expert_dispatch(ids, lim), schema(schemas::Errc::kShapeMismatch),
               "ExpertDispatch.rows: expected f32 [5, 8], got f32 [6, 8]");
  lim = dispatch_limits();
  lim.max_rows = 4;
  expect_error(decode_expert_dispatch(valid, lim), wire(WireErrc::kTooLong),
               "ExpertDispatch.expertIds: 6 entries exceed the limit of 4");
}

// ---- Byte flips: decoding must never crash (run under ASan) ----

TEST(WireFuzz, FlippedBytesNeverCrashTheDecoders) {
  flip_bytes(encode_valid_step(1), 2000, 1,
             [](const Bytes& b) { return decode_step(b, step_limits()); });
  flip_bytes(encode_valid_step(0), 500, 2,
             [](const Bytes& b) { return decode_step(b, step_limits()); });
  flip_bytes(encode_valid_outcome(), 500, 3,
             [](const Bytes& b) { return decode_step_outcome(b, outcome_limits()); });
  auto f = encode_expert_dispatch(make_expert_request(), kEmbd, kExpertStep, kSend);
  ASSERT_TRUE(f);
  flip_bytes(f->flatten(), 500, 4,
             [](const Bytes& b) { return decode_expert_dispatch(b, dispatch_limits()); });
  f = encode_expert_combine(make_expert_request(), kEmbd, kExpertStep, kSend, 0.5);
  ASSERT_TRUE(f);
  flip_bytes(f->flatten(), 500, 5, [](const Bytes& b) {
    return decode_expert_combine(b, {.n_embd = kEmbd, .expected_rows = 6});
  });
}

}  // namespace
}  // namespace troupe::actors::detail
