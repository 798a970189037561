# common.capnp: types every other schema uses: the message header (cluster epoch, sender,
# sequence number), actor identities, tensors and error reports.
# Users: every schema in schemas/, schemas/tensor_codec.cc, transport/ and actors/.
#
# SCHEMA EVOLUTION RULE (applies to every file in schemas/):
# - Add fields only, with the next unused ordinal (@N). Never renumber, retype, rename the
#   meaning of, or reuse an ordinal; never change a default value.
# - A field that is no longer used stays in the file, renamed with a `deprecated` prefix
#   (e.g. `deprecatedFoo @3 :UInt32;`) and commented with the date or issue that retired it.
# - Enums grow at the end only; a reader must treat an enumerant it does not know as invalid
#   input, never as a default.
# - Readers validate everything (sizes, ids, ranges, shapes, enum values) because any peer may
#   be malformed, stale or from another build: a bad message is counted and dropped, it never
#   crashes the receiver (ARCHITECTURE.md section 4).

@0x8839488828d3fac2;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::schemas");

enum Role {
  # What kind of actor an ActorId names (ARCHITECTURE.md section 1).
  unknown @0;      # never valid on the wire: an unset field
  controller @1;
  router @2;
  scheduler @3;
  stage @4;
  expertShard @5;
  kvManager @6;
  encoder @7;
  nodeDaemon @8;   # the per-host `troupe node` process itself
  gateway @9;
}

struct ActorId {
  # One actor instance, printed as `role/index@node` (e.g. `stage/2@node-b`) in logs.
  node @0 :UInt32;
  # node id assigned by the controller in JoinReply; 0 = not yet joined (valid only in JoinRequest)
  role @1 :Role;
  # what the actor is; `unknown` is invalid
  index @2 :UInt32;
  # instance index within the role: stage index, expert shard index, KV pool (= stage) index; 0
  # for singletons (controller, router, scheduler, node daemon)
}

struct Header {
  # Field @0 of every top-level message. Receivers drop a message whose epoch is not theirs
  # (stale: from a replaced actor or a fenced node) and duplicates by (sender, seq).
  clusterEpoch @0 :UInt64;
  # cluster epoch the sender acted in; starts at 1 and is bumped by the controller on every
  # membership or placement change; 0 = unset (invalid)
  sender @1 :ActorId;
  # who sent the message
  seq @2 :UInt64;
  # per (sender, receiver) link sequence number: starts at 1, +1 per message sent; a retried
  # message gets a new seq (its own ids, e.g. stepId, say what it retries); 0 = unset (invalid)
}

enum DType {
  # Element type of a Tensor. Byte sizes: f32 4, f16 2, bf16 2, f64 8, i8 1, u8 1, i16 2, i32 4,
  # i64 8, f8e4m3 1, f8e5m2 1. Quantized block formats never travel in messages.
  unknown @0;      # never valid on the wire: an unset field
  f32 @1;
  f16 @2;
  bf16 @3;
  f64 @4;
  i8 @5;
  u8 @6;
  i16 @7;
  i32 @8;
  i64 @9;
  f8e4m3 @10;      # OCP FP8 E4M3 (fn variant: no infinities)
  f8e5m2 @11;      # OCP FP8 E5M2
}

struct BulkRef {
  # A payload that travels as a separate bulk transfer (UCX rendezvous or RMA) instead of
  # inline in the frame; the transport resolves it before the receiver reads the tensor.
  transferId @0 :UInt64;
  # transport-assigned id of the bulk transfer, unique per (sender, epoch); 0 = no bulk payload
  sizeBytes @1 :UInt64;
  # bytes; must equal the tensor's element count times its dtype size
}

struct Tensor {
  # A dense row-major tensor. The payload is read in place from the receive buffer (zero copy):
  # read it with schemas::read_tensor(), which validates dtype, shape and size.
  dtype @0 :DType;
  # element type; `unknown` (or a value this build does not know) is invalid
  shape @1 :List(UInt64);
  # dimensions, outermost first, each in elements; rank 1..8; an empty list is invalid
  data @2 :Data;
  # product(shape) * sizeof(dtype) bytes, little-endian, row-major; empty when `bulk` is set
  bulk @3 :BulkRef;
  # set (transferId != 0) when the payload is sent separately; then `data` is empty
}

struct ErrorReport {
  # Why a request failed, sent back instead of (or beside) a result.
  domain @0 :Text;
  # folder whose Errc `code` is, e.g. "compute", "schemas", "actors"; "" = unspecified
  code @1 :UInt16;
  # that folder's Errc value; 0 = unspecified
  message @2 :Text;
  # one line: what, where, expected and got (UTF-8, at most 1 KiB by convention)
}
