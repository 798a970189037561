# client.capnp: a client of a running cluster (`troupe generate --head`, `troupe status --head`,
# later the HTTP gateway on another host) talking to the head node's router over the transport.
# The client sends GenerateRequest; the head streams GenerateEvent deltas and ends each request
# with one GenerateEvent whose `finished` is true. CancelRequest stops a request early.
# Users: actors/ (head node, cluster client), bin/.
#
# SCHEMA EVOLUTION RULE: add fields only, with the next unused ordinal; never renumber, retype or
# reuse an ordinal, never change a default; a retired field stays, renamed `deprecatedX`; enums
# grow at the end and unknown enumerants are invalid input. Readers validate sizes, ids, ranges
# and shapes: any peer may be malformed (see common.capnp for the full rule).

@0xc2f1e07d6a3b9e51;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::schemas");

using Common = import "common.capnp";
using Step = import "step.capnp";

struct GenerateRequest {
  # Client -> head: one generation request (actors::GenerateRequest).
  header @0 :Common.Header;
  tag @1 :UInt64;
  # client-chosen id of the request, echoed in every GenerateEvent; unique among the client's
  # requests in flight
  prompt @2 :Text;
  # prompt text; used when promptTokens is empty
  promptTokens @3 :List(Int32);
  # prompt token ids (take precedence over the text); each in [0, nVocab)
  addBos @4 :Bool = true;
  # prepend the vocabulary's BOS token to a text prompt
  sampling @5 :Step.SamplingParams;
  # sampling settings; stop strings travel in stopStrings
  stopStrings @6 :List(Text);
  # generation ends before any of these strings (each non-empty)
  maxTokens @7 :Int64 = 128;
  # tokens to generate at most, >= 1
  returnLogits @8 :Bool;
  # true: every finished event carries the logits row of each sampled token (tests, eval)
  images @9 :List(Data);
  # image files (PNG or JPEG bytes, each non-empty), one per "<__media__>" marker in the text
  # prompt, in order (with no marker they come first); the head's vision encoder lays the prompt
  # out around them. Needs a text prompt (promptTokens empty) and a cluster with [model] mmproj.
}

struct CancelRequest {
  # Client -> head: stop request `tag`; it then finishes with finishReason "cancelled".
  header @0 :Common.Header;
  tag @1 :UInt64;
}

struct GenerateEvent {
  # Head -> client: a streamed piece of request `tag`, or its end.
  header @0 :Common.Header;
  tag @1 :UInt64;
  # the request's tag
  delta @2 :Text;
  # text safe to show now (never a partial UTF-8 sequence; may be empty)
  token @3 :Int32 = -1;
  # the generated token this piece comes from; -1 when none (the final flush)
  finished @4 :Bool;
  # true: the request is over and the fields below are set
  promptTokens @5 :List(Int32);
  # (finished) the prompt as tokenized; -1 at each image position
  tokens @6 :List(Int32);
  # (finished) every generated token, without an end-of-generation token
  text @7 :Text;
  # (finished) the whole generated text
  finishReason @8 :Text;
  # (finished) "length", "eos", "stop", "cancelled", "error" or "overloaded"
  error @9 :Common.ErrorReport;
  # (finished) why the request failed, when finishReason is "error" or "overloaded"
  logits @10 :Common.Tensor;
  # (finished, returnLogits) f32 [tokens sampled, nVocab]
}
