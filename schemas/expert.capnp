# expert.capnp: Mixture-of-Experts dispatch and combine. A stage sends each expert shard the
# token rows routed to the experts it owns (ExpertDispatch); the shard returns one weighted output
# row per dispatched row, in the same order (ExpertCombine). The stage sums a token's rows in
# slot order, so the result does not depend on how experts are split across shards.
# Users: actors/stage, actors/expert_shard, transport/.
#
# SCHEMA EVOLUTION RULE: add fields only, with the next unused ordinal; never renumber, retype or
# reuse an ordinal, never change a default; a retired field stays, renamed `deprecatedX`; enums
# grow at the end and unknown enumerants are invalid input. Readers validate sizes, ids, ranges
# and shapes: any peer may be malformed (see common.capnp for the full rule).

@0x8a54f732b3337b65;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::schemas");

using Common = import "common.capnp";

struct ExpertDispatch {
  # Stage -> expert shard: the rows of one MoE layer of one step routed to this shard.
  # One row per (token, expert) pair: a token routed to two experts of this shard appears twice.
  header @0 :Common.Header;
  stepId @1 :UInt64;
  # BatchDescriptor.stepId of the step
  microbatch @2 :UInt32;
  # BatchDescriptor.microbatch of the step
  attempt @3 :UInt32;
  # BatchDescriptor.attempt of the step
  layer @4 :UInt32;
  # model layer index (global, not relative to the stage)
  rows @5 :Common.Tensor;
  # f32|bf16 [numRows, nEmbd]: normalized hidden states of the routed tokens
  tokenIdx @6 :List(UInt32);
  # [numRows] token index of each row within the step (0 .. numTokens - 1); troupe sends it empty
  # (the stage keeps the row -> token map itself)
  expertIds @7 :List(UInt32);
  # [numRows] global expert id of each row, in [0, nExpert); must be one this shard owns
  slots @8 :List(UInt8);
  # [numRows] position of the expert in the token's top-k, in [0, nExpertUsed); troupe sends it
  # empty (the stage keeps the slots itself)
  weights @9 :List(Float32);
  # [numRows] router gate weight of the (token, expert) pair; troupe sends it empty and its shards
  # reject a non-empty list: the shard returns UNWEIGHTED outputs, and the stage weights and sums
  # them in a fixed order, so the numerics are exact whatever the split across shards
}

struct ExpertCombine {
  # Expert shard -> stage: the weighted expert outputs for one ExpertDispatch.
  header @0 :Common.Header;
  stepId @1 :UInt64;
  # as in the ExpertDispatch
  microbatch @2 :UInt32;
  # as in the ExpertDispatch
  attempt @3 :UInt32;
  # as in the ExpertDispatch
  layer @4 :UInt32;
  # as in the ExpertDispatch
  outputs @5 :Common.Tensor;
  # f32|bf16 [numRows, nEmbd]: UNWEIGHTED expert(row), same row order as the dispatch's rows; the
  # stage weights and combines them in a fixed order for exact numerics
  error @6 :Common.ErrorReport;
  # set when the dispatch was rejected (then `outputs` is absent): unknown expert, bad shape
  computeNs @7 :UInt64;
  # ns the shard spent computing these rows
}
