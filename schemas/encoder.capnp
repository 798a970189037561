# encoder.capnp: images to a vision encoder placed on another node, and its rows back. The head's
# encoder front (actors/encoder.cc) keeps the cache and lays prompts out; an encoder instance
# ([[encoder]] in the plan) decodes the image file and runs the vision encoder.
# Users: actors/encoder, actors/cluster_node (routing), transport/.
#
# SCHEMA EVOLUTION RULE: add fields only, with the next unused ordinal; never renumber, retype or
# reuse an ordinal, never change a default; a retired field stays, renamed `deprecatedX`; enums
# grow at the end and unknown enumerants are invalid input. Readers validate sizes, ids, ranges
# and shapes: any peer may be malformed (see common.capnp for the full rule).

@0xf3bf3281f324d210;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::schemas");

using Common = import "common.capnp";

struct EncodeImage {
  # Head -> the node of encoder instance `encoder`: encode one image file.
  header @0 :Common.Header;
  jobId @1 :UInt64;
  # the head's number for this job (non-zero); EncodedImage answers with it
  encoder @2 :UInt32;
  # EncoderPlacement.index of the instance that is to encode it
  image @3 :Data;
  # the file's bytes as the client sent them (PNG or JPEG), at most 32 MiB
  what @4 :Text;
  # how errors name the image ("image 2"), at most 64 bytes
}

struct EncodedImage {
  # Encoder node -> head: the rows of one EncodeImage, or why there are none.
  header @0 :Common.Header;
  jobId @1 :UInt64;
  # EncodeImage.jobId
  rows @2 :Common.Tensor;
  # f32 [tokens per image, text model width] (absent with an error)
  error @3 :Common.ErrorReport;
  # set when the image could not be decoded or encoded (then `rows` is absent)
  encodeNs @4 :UInt64;
  # ns the node spent decoding and encoding it
  accepted @5 :Bool;
  # true: a receipt, sent as the job reaches a running instance (no rows, no error) and again
  # every heartbeat while the instance holds it; the rows follow. The head retries a job it hears
  # nothing of for a lease: no first receipt (its EncodeImage was lost), or no more receipts and
  # no answer (the answer was lost)
}
