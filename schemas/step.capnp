# step.capnp: one batched pipeline step. The scheduler sends a BatchDescriptor to stage 0; every
# stage runs its layers and forwards the same descriptor, with `hidden` set, to the next stage;
# the last stage computes logits, samples, and returns a StepResult to the scheduler.
# Users: actors/scheduler, actors/stage, transport/. Mirrors compute::SeqStep, compute::StepResult,
# compute::SamplingParams and compute::SamplerState.
#
# SCHEMA EVOLUTION RULE: add fields only, with the next unused ordinal; never renumber, retype or
# reuse an ordinal, never change a default; a retired field stays, renamed `deprecatedX`; enums
# grow at the end and unknown enumerants are invalid input. Readers validate sizes, ids, ranges
# and shapes: any peer may be malformed (see common.capnp for the full rule).

@0xb51107a1d5b03ed7;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::schemas");

using Common = import "common.capnp";

enum LogitsMode {
  # Which of a sequence's new positions produce logits rows (compute::SeqStep::Logits).
  none @0;   # no rows: a prefill chunk that is not the prompt's last
  last @1;   # one row, for the last new position
  all @2;    # one row per new position (prompt logprobs, evaluation)
}

struct SamplingParams {
  # Per-request sampling settings, as compute::SamplingParams. Defaults mean "off" and equal the
  # C++ defaults. Stop strings stay with the router (they act on text, not on sampling).
  temperature @0 :Float32;
  # >= 0; 0 = greedy (argmax)
  topK @1 :Int32;
  # >= 0 tokens; 0 = off
  topP @2 :Float32 = 1.0;
  # probability mass in (0, 1]; 1 = off
  minP @3 :Float32;
  # fraction of the best token's probability in [0, 1]; 0 = off
  repetitionPenalty @4 :Float32 = 1.0;
  # > 0 (divisor for positive logits, factor for others); 1 = off
  presencePenalty @5 :Float32;
  # logit units, finite; 0 = off
  frequencyPenalty @6 :Float32;
  # logit units per occurrence, finite; 0 = off
  penaltyLastN @7 :Int32 = 64;
  # tokens of history the penalties see; -1 = all, 0 = none
  seed @8 :UInt64;
  # RNG seed the request started from (the state itself travels in SamplerState)
  stopTokenIds @9 :List(Int32);
  # token ids (>= 0) that end generation after being sampled
  ignoreEos @10 :Bool;
  # true: the model's EOS tokens do not end generation
  numLogprobs @11 :UInt16;
  # how many most likely tokens to return with each sampled token; 0 = none (max 20)
  grammar @12 :Text;
  # GBNF (compute/grammar.h) the reply must be a sentence of; empty = none. At most 1 MiB.
}

struct SamplerState {
  # The xoshiro256** state of a request's Sampler (compute::SamplerState::s[0..3]). All four
  # words zero is invalid. Travels with every step so a replay draws the same tokens.
  s0 @0 :UInt64;
  s1 @1 :UInt64;
  s2 @2 :UInt64;
  s3 @3 :UInt64;
}

struct BlockTable {
  # One stage's KV block table for one sequence (each stage's KvManager owns its own pool).
  stage @0 :UInt32;
  # pipeline stage index the table belongs to
  blockIds @1 :List(Int32);
  # [numBlocks] block ids in that stage's pool, in position order; must cover positions
  # [0, pos0 + count) at the pool's block size. Sent whole every step, so a retried or replayed
  # step is self-contained.
}

struct EmbeddingSplice {
  # Encoder output that replaces image placeholder tokens (vision-language models, stage 0).
  offset @0 :UInt32;
  # tokens from the sequence's first new position (pos0) to the first replaced position
  embeddings @1 :Common.Tensor;
  # f32|bf16 [numTokens, nEmbd]: rows replace positions pos0 + offset .. + numTokens - 1
  contentHash @2 :UInt64;
  # hash of the image bytes (encoder cache key); 0 = unknown
}

struct SequenceStep {
  # One sequence's part of a step (compute::SeqStep).
  requestId @0 :UInt64;
  # router-assigned request id, unique for the cluster's lifetime; 0 is invalid
  seqId @1 :UInt32;
  # scheduler-assigned sequence slot, unique among running sequences
  pos0 @2 :UInt32;
  # tokens: positions [0, pos0) are already in this sequence's KV cache
  count @3 :UInt32;
  # tokens: this step adds positions pos0 .. pos0 + count - 1; >= 1
  tokenIds @4 :List(Int32);
  # [count] token ids for the new positions (stage 0 embeds them; later stages may ignore them);
  # -1 marks an image position, whose row comes from a splice at stage 0
  blockTables @5 :List(BlockTable);
  # one table per pipeline stage (each stage reads its own)
  logits @6 :LogitsMode;
  # which new positions produce logits rows at the last stage
  sample @7 :Bool;
  # true: the last stage draws a token from the last logits row (needs logits != none)
  sampling @8 :SamplingParams;
  # read by the last stage when `sample` is true
  samplerState @9 :SamplerState;
  # RNG state before this step's draw; the reply carries the state after it
  penaltyHistory @10 :List(Int32);
  # token ids, oldest first: the last penaltyLastN tokens of prompt + generated text before this
  # step (all of them when penaltyLastN = -1); empty when penalties are off
  splices @11 :List(EmbeddingSplice);
  # image embeddings to splice in at stage 0, in position order, non-overlapping: one per run of
  # -1 token ids, covering it exactly; absent for later stages
  returnLogits @12 :Bool;
  # true: return the logits row(s) of this sequence in StepResult.logits
  nonCausal @13 :Bool;
  # true: every new position attends to all of this step's positions, not only to earlier ones
  # (a Gemma 3 image, prefilled as one step of its own)
  stateSlot @14 :Int32 = -1;
  # the sequence's recurrent state slot at every stage, in [0, slots) (models with linear-attention
  # layers, whose state per sequence lives in the stages); -1 = none. Scheduler-assigned, like
  # the block tables. A step at pos0 0 starts the state afresh; any other continues it.
  replyTokens @15 :List(Int32);
  # with a grammar and `sample`: the reply's tokens so far (what the grammar has matched), oldest
  # first; empty otherwise
}

struct BatchDescriptor {
  # One micro-batch of one scheduler step, sent scheduler -> stage 0 -> stage 1 -> ... -> last.
  header @0 :Common.Header;
  stepId @1 :UInt64;
  # scheduler step number, increasing; a retried step keeps its stepId and bumps `attempt`
  microbatch @2 :UInt32;
  # micro-batch slot in flight, in [0, numMicrobatches)
  attempt @3 :UInt32;
  # 0 on the first try, +1 per retry of the same stepId (receivers drop older attempts)
  stage @4 :UInt32;
  # pipeline stage index of the receiver
  sequences @5 :List(SequenceStep);
  # the step's sequences, in row order
  hidden @6 :Common.Tensor;
  # f32|bf16 [numTokens, nEmbd], numTokens = sum of sequences' count, rows in sequence order:
  # the previous stage's output; absent (null) for stage 0
  deadlineMs @7 :UInt32;
  # ms the sender waits for this step's result before retrying it; 0 = no deadline
}

struct TokenLogprob {
  # One candidate token and its log-probability under the final distribution.
  tokenId @0 :Int32;
  # token id in [0, nVocab)
  logprob @1 :Float32;
  # natural log of the probability, <= 0
}

struct SequenceResult {
  # One sequence's outcome of a step at the last stage.
  requestId @0 :UInt64;
  # as in the SequenceStep
  seqId @1 :UInt32;
  # as in the SequenceStep
  sampledToken @2 :Int32 = -1;
  # token id drawn from the last logits row; -1 when the step did not sample this sequence
  samplerState @3 :SamplerState;
  # RNG state after the draw (equal to the request's when nothing was drawn)
  stopToken @4 :Bool;
  # the sampled token ends generation (a stop token id, or EOS without ignoreEos)
  logitsRowBegin @5 :UInt32;
  # index of this sequence's first row in StepResult.logits
  logitsRowCount @6 :UInt32;
  # rows: 0, 1 or count (per LogitsMode), 0 when StepResult.logits is not returned
  sampledLogprob @7 :Float32;
  # natural log of the sampled token's probability; 0 when nothing was drawn
  topLogprobs @8 :List(TokenLogprob);
  # the numLogprobs most likely tokens, most likely first; empty when numLogprobs = 0
  error @9 :Text;
  # non-empty: this sequence cannot go on (its grammar allows no token, ...) and ends with this
  # error; sampledToken is -1. The step's other sequences stand.
}

struct StepResult {
  # Reply of the last stage to the scheduler for one BatchDescriptor.
  header @0 :Common.Header;
  stepId @1 :UInt64;
  # as in the BatchDescriptor
  microbatch @2 :UInt32;
  # as in the BatchDescriptor
  attempt @3 :UInt32;
  # as in the BatchDescriptor
  sequences @4 :List(SequenceResult);
  # one per SequenceStep, same order
  logits @5 :Common.Tensor;
  # f32 [numRows, nVocab], only when logits rows were asked back (evaluation, prompt logprobs);
  # usually absent: sampling happens at the last stage
  hidden @6 :Common.Tensor;
  # f32|bf16 [numRows, nEmbd] final hidden states when asked for (embeddings, debugging); usually
  # absent
  error @7 :Common.ErrorReport;
  # set when the step was rejected or failed (then `sequences` is empty): bad input, pool full
  computeNs @8 :UInt64;
  # ns the last stage spent computing this step (for the console's timeline)
}
