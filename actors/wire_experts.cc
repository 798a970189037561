// Wire codec of the expert messages: dispatch (a stage's rows for the experts a shard owns) and
// combine (the shard's outputs). Same rules as wire.cc: every frame hostile, lists sized before
// they are walked, values checked before they reach an actor (actors/detail/wire.h).
#include <algorithm>
#include <string>
#include <utility>

#include "actors/detail/messages.h"
#include "actors/detail/wire.h"
#include "actors/detail/wire_internal.h"
#include "schemas/expert.capnp.h"

namespace troupe::actors::detail {

using schemas::TensorDtype;
using wire_internal::build_frame;
using wire_internal::check_len;
using wire_internal::check_send;
using wire_internal::decode_frame;
using wire_internal::fail;
using wire_internal::in_field;
using wire_internal::kMaxU32;
using wire_internal::read_error;
using wire_internal::read_wire_header;
using wire_internal::to_ns;
using wire_internal::to_vector;
using wire_internal::write_error;
using wire_internal::write_f32;
using wire_internal::write_header;

// ---- Experts -----------------------------------------------------------------------------------

namespace {

// Total rows of req's tasks, or an error for mismatched or negative entries.
Result<uint64_t> task_rows(const ExpertRequest& req, const char* what) {
  if (req.experts.size() != req.rows.size() || req.layer < 0 || uint64_t(req.layer) > kMaxU32) {
    return fail(
        WireErrc::kUnencodable,
        strfmt("%s: %zu experts, %zu row counts, layer %lld: expected equal counts and a "
               "layer in [0, 2^32)",
               what, req.experts.size(), req.rows.size(), static_cast<long long>(req.layer)));
  }
  uint64_t total = 0;
  for (size_t t = 0; t < req.experts.size(); ++t) {
    if (req.experts[t] < 0 || req.rows[t] < 0) {
      return fail(WireErrc::kUnencodable,
                  strfmt("%s: task %zu: expert %d, %lld rows: expected "
                         "both >= 0",
                         what, t, req.experts[t], static_cast<long long>(req.rows[t])));
    }
    total += static_cast<uint64_t>(req.rows[t]);
  }
  return total;
}

// Turns one expert id per row into tasks (runs of equal ids), rejecting ids not in `owned`.
Status read_tasks(capnp::List<uint32_t>::Reader ids, std::span<const int32_t> owned_ids,
                  ExpertRequest& req) {
  std::vector<bool> owned;  // [max owned id + 1]
  for (int32_t e : owned_ids) {
    if (e < 0) continue;
    if (size_t(e) >= owned.size()) owned.resize(size_t(e) + 1, false);
    owned[size_t(e)] = true;
  }
  for (unsigned i = 0; i < ids.size(); ++i) {
    const uint32_t e = ids[i];
    if (e >= owned.size() || !owned[e]) {
      return fail(WireErrc::kInvalid,
                  strfmt("ExpertDispatch.expertIds[%u]: expert %u is not owned by this shard "
                         "(%zu owned)",
                         i, e, owned_ids.size()));
    }
    if (req.experts.empty() || uint32_t(req.experts.back()) != e) {
      req.experts.push_back(static_cast<int32_t>(e));
      req.rows.push_back(0);
    }
    ++req.rows.back();
  }
  return Ok{};
}

// `have` floats of `field` must be rows x n_embd.
Status check_floats(const char* what, const char* field, size_t have, uint64_t rows,
                    int64_t n_embd) {
  if (have == rows * uint64_t(n_embd)) return Ok{};
  return fail(WireErrc::kUnencodable,
              strfmt("%s: %s has %zu floats, expected %llu rows x %lld", what, field, have,
                     static_cast<unsigned long long>(rows), static_cast<long long>(n_embd)));
}

// The fields an ExpertDispatch and an ExpertCombine share: header, step, attempt, layer.
template <class Builder>
void write_expert_step(Builder root, const ExpertStep& step, const SendInfo& send, int64_t layer) {
  write_header(root.initHeader(), step.epoch, send);
  root.setStepId(step.step_id);
  root.setMicrobatch(step.microbatch);
  root.setAttempt(send.attempt);
  root.setLayer(static_cast<uint32_t>(layer));
}

}  // namespace

Result<WireFrame> encode_expert_dispatch(ExpertRequestPtr req, int64_t n_embd,
                                         const ExpertStep& step, const SendInfo& send) {
  const char* what = "encode_expert_dispatch";
  if (auto st = check_send(step.epoch, send, what); !st) return st.error();
  if (!req || n_embd < 1) return fail(WireErrc::kUnencodable, "encode_expert_dispatch: no request");
  auto rows = task_rows(*req, what);
  if (!rows) return rows.error();
  if (auto st = check_floats(what, "x", req->x.size(), *rows, n_embd); !st) return st.error();
  return build_frame<schemas::ExpertDispatch>(
      what, [&](schemas::ExpertDispatch::Builder root, WireFrame::Impl& impl) -> Status {
        write_expert_step(root, step, send, req->layer);
        auto ids = root.initExpertIds(static_cast<unsigned>(*rows));
        unsigned at = 0;
        for (size_t t = 0; t < req->experts.size(); ++t)
          for (int64_t r = 0; r < req->rows[t]; ++r) ids.set(at++, uint32_t(req->experts[t]));
        if (auto st = write_f32(root.initRows(), req->x, *rows, n_embd); !st)
          return in_field("encode_expert_dispatch: rows", st.error());
        impl.payload = req;
        return Ok{};
      });
}

Result<DecodedDispatch> decode_expert_dispatch(std::span<const uint8_t> frame,
                                               const DispatchLimits& lim) {
  if (lim.n_embd < 1 || lim.n_layer < 1)
    return fail(WireErrc::kInvalid, "decode_expert_dispatch: n_embd and n_layer must be >= 1");
  return decode_frame<schemas::ExpertDispatch, DecodedDispatch>(
      frame, lim.max_frame_bytes, "ExpertDispatch",
      [&](schemas::ExpertDispatch::Reader root) -> Result<DecodedDispatch> {
        DecodedDispatch d;
        auto header = read_wire_header(root.getHeader(), lim.expected_epoch, "ExpertDispatch");
        if (!header) return header.error();
        d.header = *header;
        d.step = {d.header.cluster_epoch, root.getStepId(), root.getMicrobatch()};
        d.attempt = root.getAttempt();
        if (int64_t(root.getLayer()) >= lim.n_layer) {
          return fail(WireErrc::kInvalid,
                      strfmt("ExpertDispatch.layer: %u is outside [0, %lld)", root.getLayer(),
                             static_cast<long long>(lim.n_layer)));
        }
        auto ids = root.getExpertIds();
        if (auto st = check_len("ExpertDispatch.expertIds", ids.size(), lim.max_rows); !st)
          return st.error();
        const size_t num_rows = ids.size();
        if (root.getWeights().size() != 0) {
          return fail(
              WireErrc::kUnsupported,
              strfmt("ExpertDispatch.weights: %u weights, expected none (this shard returns "
                     "unweighted outputs)",
                     root.getWeights().size()));
        }
        for (auto [name, n] : {std::pair{"tokenIdx", root.getTokenIdx().size()},
                               std::pair{"slots", root.getSlots().size()}}) {
          if (n != 0 && n != num_rows) {
            return fail(
                WireErrc::kInvalid,
                strfmt("ExpertDispatch.%s: %u entries, expected 0 or %zu", name, n, num_rows));
          }
        }
        auto req = std::make_shared<ExpertRequest>();
        req->layer = root.getLayer();
        if (auto st = read_tasks(ids, lim.owned, *req); !st) return st.error();
        if (!root.hasRows())
          return fail(WireErrc::kInvalid, "ExpertDispatch.rows: absent, expected a tensor");
        auto v = schemas::read_tensor(root.getRows());
        if (!v) return in_field("ExpertDispatch.rows", v.error());
        if (auto st = schemas::expect_tensor(*v, {TensorDtype::kF32},
                                             {static_cast<int64_t>(num_rows), lim.n_embd},
                                             "ExpertDispatch.rows");
            !st)
          return st.error();
        auto x = v->as<float>();
        req->x.assign(x.begin(), x.end());
        req->y.assign(req->x.size(), 0.0f);
        req->done = std::make_shared<Latch>(1);
        d.request = std::move(req);
        return d;
      });
}

Result<WireFrame> encode_expert_combine(ExpertRequestPtr req, int64_t n_embd,
                                        const ExpertStep& step, const SendInfo& send,
                                        double compute_seconds) {
  const char* what = "encode_expert_combine";
  if (auto st = check_send(step.epoch, send, what); !st) return st.error();
  if (!req || n_embd < 1) return fail(WireErrc::kUnencodable, "encode_expert_combine: no request");
  auto rows = task_rows(*req, what);
  if (!rows) return rows.error();
  const bool failed = !req->error.empty();
  if (!failed) {
    if (auto st = check_floats(what, "y", req->y.size(), *rows, n_embd); !st) return st.error();
  }
  return build_frame<schemas::ExpertCombine>(
      what, [&](schemas::ExpertCombine::Builder root, WireFrame::Impl& impl) -> Status {
        write_expert_step(root, step, send, req->layer);
        root.setComputeNs(to_ns(compute_seconds));
        if (failed) {
          write_error(root.initError(), req->error);
        } else {
          if (auto st = write_f32(root.initOutputs(), req->y, *rows, n_embd); !st)
            return in_field("encode_expert_combine: outputs", st.error());
          impl.payload = req;
        }
        return Ok{};
      });
}

Result<DecodedCombine> decode_expert_combine(std::span<const uint8_t> frame,
                                             const CombineLimits& lim) {
  if (lim.n_embd < 1) return fail(WireErrc::kInvalid, "decode_expert_combine: n_embd must be >= 1");
  return decode_frame<schemas::ExpertCombine, DecodedCombine>(
      frame, lim.max_frame_bytes, "ExpertCombine",
      [&](schemas::ExpertCombine::Reader root) -> Result<DecodedCombine> {
        DecodedCombine d;
        auto header = read_wire_header(root.getHeader(), lim.expected_epoch, "ExpertCombine");
        if (!header) return header.error();
        d.header = *header;
        d.step = {d.header.cluster_epoch, root.getStepId(), root.getMicrobatch()};
        d.attempt = root.getAttempt();
        d.layer = root.getLayer();
        d.compute_seconds = static_cast<double>(root.getComputeNs()) * 1e-9;
        if (root.hasError()) {
          if (root.hasOutputs())
            return fail(WireErrc::kInvalid, "ExpertCombine: an error with outputs, expected none");
          d.error = read_error(root.getError());
          return d;
        }
        if (!root.hasOutputs())
          return fail(WireErrc::kInvalid, "ExpertCombine.outputs: absent without an error");
        auto v = schemas::read_tensor(root.getOutputs());
        if (!v) return in_field("ExpertCombine.outputs", v.error());
        // expected_rows 0: any number of rows (the caller checks y.size() itself).
        const int64_t rows = lim.expected_rows == 0 ? -1 : static_cast<int64_t>(lim.expected_rows);
        if (auto st = schemas::expect_tensor(*v, {TensorDtype::kF32}, {rows, lim.n_embd},
                                             "ExpertCombine.outputs");
            !st)
          return st.error();
        auto y = v->as<float>();
        d.y.assign(y.begin(), y.end());
        return d;
      });
}

}  // namespace troupe::actors::detail
