# kv.capnp: operations on one stage's paged KV pool. The scheduler asks each stage's KvManager
# for blocks before a step (KvAllocateRequest/Reply), commits written tokens after it (KvAppend,
# which makes full blocks reusable through the prefix cache) and releases sequences (KvFree).
# KvStats reports the pool's usage.
# Users: actors/scheduler, actors/kv_manager, actors/controller (stats), transport/.
#
# SCHEMA EVOLUTION RULE: add fields only, with the next unused ordinal; never renumber, retype or
# reuse an ordinal, never change a default; a retired field stays, renamed `deprecatedX`; enums
# grow at the end and unknown enumerants are invalid input. Readers validate sizes, ids, ranges
# and shapes: any peer may be malformed (see common.capnp for the full rule).

@0xda7f446484aba188;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::schemas");

using Common = import "common.capnp";

struct KvAllocateRequest {
  # Scheduler -> KvManager: make room for a sequence to hold numTokens tokens.
  header @0 :Common.Header;
  requestId @1 :UInt64;
  # router-assigned request id
  seqId @2 :UInt32;
  # scheduler sequence slot
  numTokens @3 :UInt32;
  # tokens the sequence must hold after the coming step (its new total length, not a delta)
  prefixBlockHashes @4 :List(UInt64);
  # [numFullPromptBlocks] chained content hashes of the prompt's full blocks, for prefix-cache
  # lookup on a new sequence; empty on later calls for the same sequence
}

struct KvAllocateReply {
  # KvManager -> scheduler.
  header @0 :Common.Header;
  requestId @1 :UInt64;
  # as in the request
  seqId @2 :UInt32;
  # as in the request
  ok @3 :Bool;
  # false: not enough free blocks (nothing was allocated); the scheduler preempts or waits
  blockIds @4 :List(Int32);
  # [numBlocks] the sequence's whole block table after the allocation, in position order
  numCachedTokens @5 :UInt32;
  # tokens at the start of the sequence already in KV through prefix-cache hits (a multiple of
  # the block size); the scheduler skips computing them
  numFreeBlocks @6 :UInt32;
  # blocks: free (plus evictable cached) blocks left in the pool after this allocation
  error @7 :Common.ErrorReport;
  # set when the request was invalid (unknown sequence, numTokens shrinking); ok is then false
}

struct KvAppend {
  # Scheduler -> KvManager after a step: the sequence's KV now holds numTokens tokens; blocks
  # that became full get their content hashes so later requests can reuse them.
  header @0 :Common.Header;
  requestId @1 :UInt64;
  # router-assigned request id
  seqId @2 :UInt32;
  # scheduler sequence slot
  numTokens @3 :UInt32;
  # tokens now written in the sequence's KV (its committed length)
  firstFullBlockIdx @4 :UInt32;
  # index in the sequence's block table of the first block in fullBlockHashes
  fullBlockHashes @5 :List(UInt64);
  # chained content hashes of the blocks that became full with this step, in table order
}

enum KvFreeReason {
  # Why a sequence's blocks are released (for metrics).
  finished @0;
  cancelled @1;   # client cancelled or disconnected
  preempted @2;   # pool full: recomputed later from the token log
  failed @3;      # the request failed
}

struct KvFree {
  # Scheduler -> KvManager: release a sequence's blocks.
  header @0 :Common.Header;
  requestId @1 :UInt64;
  # router-assigned request id
  seqId @2 :UInt32;
  # scheduler sequence slot; free after this message
  keepCached @3 :Bool;
  # true: full blocks with a hash stay in the prefix cache (evictable) instead of being freed
  reason @4 :KvFreeReason;
  # why
}

struct KvStats {
  # KvManager -> controller (and inside StatusSnapshot): one pool's usage.
  header @0 :Common.Header;
  stage @1 :UInt32;
  # pipeline stage whose pool this is
  blockSizeTokens @2 :UInt32;
  # tokens per block
  blockSizeBytes @3 :UInt64;
  # bytes per block, all layers of the stage, K and V
  numBlocks @4 :UInt32;
  # blocks in the pool
  blocksUsed @5 :UInt32;
  # blocks referenced by running sequences
  blocksCached @6 :UInt32;
  # blocks held only by the prefix cache (evictable)
  blocksFree @7 :UInt32;
  # blocks on the free list; used + cached + free = numBlocks
  usagePerc @8 :Float32;
  # blocksUsed / numBlocks, in [0, 1]
  fragmentationPerc @9 :Float32;
  # unused token slots inside used blocks / token slots of used blocks, in [0, 1]
  prefixQueriesTotal @10 :UInt64;
  # tokens looked up in the prefix cache since start (counter)
  prefixHitsTotal @11 :UInt64;
  # of those, tokens found (counter)
  evictionsTotal @12 :UInt64;
  # cached blocks evicted since start (counter)
  numSequences @13 :UInt32;
  # sequences holding blocks
}
