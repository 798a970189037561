// Wire codec of the placement messages (actors/detail/control_wire.h): Placement, which the head
// sends to lay the plan's stages, expert shards and KV pools over the nodes, and the
// PlacementReport a node answers with. The decoder checks the whole layout (stage order, contiguous
// layer ranges, one owner per expert, one KV pool per stage) before it returns it.
#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "actors/detail/control_wire.h"
#include "actors/detail/control_wire_internal.h"
#include "actors/detail/wire_internal.h"
#include "schemas/cluster.capnp.h"

namespace troupe::actors::detail {

using control_wire_internal::check_node_id;
using control_wire_internal::encode_msg;
using control_wire_internal::read_phases;
using control_wire_internal::read_text;
using control_wire_internal::text;
using control_wire_internal::write_ints;
using control_wire_internal::write_phases;
using wire_internal::check_len;
using wire_internal::decode_frame;
using wire_internal::fail;
using wire_internal::read_error;
using wire_internal::read_wire_header;
using wire_internal::write_error;

namespace {

// Stages in index order 0..n-1, layer ranges non-empty and contiguous from layer 0, exactly the
// first with the embedding and exactly the last with the output head.
Result<std::vector<StagePlacementInfo>> read_stages(
    capnp::List<schemas::StagePlacement>::Reader src, const ControlLimits& l) {
  if (auto st = check_len("Placement.stages", src.size(), l.max_list); !st) return st.error();
  if (src.size() == 0) return fail(WireErrc::kInvalid, "Placement.stages: empty, expected >= 1");
  std::vector<StagePlacementInfo> out(src.size());
  const unsigned last = src.size() - 1;
  for (unsigned i = 0; i < src.size(); ++i) {
    const std::string at = strfmt("Placement.stages[%u]", i);
    auto x = src[i];
    StagePlacementInfo& y = out[i];
    y = {x.getStage(),        x.getNodeId(),        x.getLayerBegin(), x.getLayerEnd(),
         x.getHasEmbedding(), x.getHasOutputHead(), x.getThreads()};
    if (y.stage != i) {
      return fail(WireErrc::kInvalid, strfmt("%s.stage: %u, expected %u (stages in index order)",
                                             at.c_str(), y.stage, i));
    }
    if (auto st = check_node_id(y.node_id, at + ".nodeId"); !st) return st.error();
    if (y.layer_begin >= y.layer_end) {
      return fail(WireErrc::kInvalid, strfmt("%s: layers [%u, %u) are empty, expected begin < end",
                                             at.c_str(), y.layer_begin, y.layer_end));
    }
    const uint32_t want = i == 0 ? 0 : out[i - 1].layer_end;
    if (y.layer_begin != want) {
      return fail(
          WireErrc::kInvalid,
          strfmt("%s.layerBegin: %u, expected %u: the layer ranges %s", at.c_str(), y.layer_begin,
                 want, y.layer_begin < want ? "overlap" : "leave a gap (or do not start at 0)"));
    }
    if (y.has_embedding != (i == 0) || y.has_output_head != (i == last)) {
      return fail(WireErrc::kInvalid,
                  strfmt("%s: hasEmbedding %d, hasOutputHead %d: expected the embedding on the "
                         "first stage only and the output head on the last (of %u) only",
                         at.c_str(), int(y.has_embedding), int(y.has_output_head), last + 1));
    }
  }
  return out;
}

// Shards in index order 0..n-1, each with ascending non-negative experts; no expert in two.
Result<std::vector<ShardPlacementInfo>> read_shards(
    capnp::List<schemas::ExpertShardPlacement>::Reader src, const ControlLimits& l) {
  if (auto st = check_len("Placement.expertShards", src.size(), l.max_list); !st) return st.error();
  std::vector<ShardPlacementInfo> out(src.size());
  std::vector<std::pair<uint32_t, uint32_t>> owner;  // (expert, shard)
  for (unsigned i = 0; i < src.size(); ++i) {
    const std::string at = strfmt("Placement.expertShards[%u]", i);
    auto x = src[i];
    ShardPlacementInfo& y = out[i];
    y.shard = x.getShard();
    y.node_id = x.getNodeId();
    y.threads = x.getThreads();
    if (y.shard != i) {
      return fail(WireErrc::kInvalid, strfmt("%s.shard: %u, expected %u (shards in index order)",
                                             at.c_str(), y.shard, i));
    }
    if (auto st = check_node_id(y.node_id, at + ".nodeId"); !st) return st.error();
    auto experts = x.getExperts();
    if (auto st = check_len(at + ".experts", experts.size(), l.max_list); !st) return st.error();
    for (unsigned e = 0; e < experts.size(); ++e) {
      const uint32_t id = experts[e];
      if (id > uint32_t(std::numeric_limits<int32_t>::max())) {
        return fail(WireErrc::kInvalid,
                    strfmt("%s.experts[%u]: %u is outside [0, 2^31)", at.c_str(), e, id));
      }
      if (e > 0 && id <= experts[e - 1]) {
        return fail(WireErrc::kInvalid,
                    strfmt("%s.experts[%u]: %u after %u, expected strictly ascending ids",
                           at.c_str(), e, id, experts[e - 1]));
      }
      y.experts.push_back(static_cast<int32_t>(id));
      owner.emplace_back(id, i);
    }
  }
  std::sort(owner.begin(), owner.end());
  for (size_t k = 1; k < owner.size(); ++k) {
    if (owner[k].first != owner[k - 1].first) continue;
    return fail(WireErrc::kInvalid,
                strfmt("Placement.expertShards: expert %u is in shards %u and %u, expected one "
                       "owner per expert",
                       owner[k].first, owner[k - 1].second, owner[k].second));
  }
  return out;
}

// One pool per stage (any order), each with blocks.
Result<std::vector<KvPoolInfo>> read_kv_pools(capnp::List<schemas::KvPoolPlacement>::Reader src,
                                              size_t num_stages) {
  if (src.size() != num_stages) {
    return fail(WireErrc::kInvalid,
                strfmt("Placement.kvPools: %u pools for %zu stages, expected one per stage",
                       src.size(), num_stages));
  }
  std::vector<KvPoolInfo> out(src.size());
  std::vector<bool> seen(num_stages, false);
  for (unsigned i = 0; i < src.size(); ++i) {
    const std::string at = strfmt("Placement.kvPools[%u]", i);
    auto x = src[i];
    out[i] = {x.getStage(), x.getNodeId(), x.getNumBlocks(), x.getBlockSizeTokens()};
    const KvPoolInfo& y = out[i];
    if (y.stage >= num_stages || seen[y.stage]) {
      return fail(WireErrc::kInvalid,
                  strfmt("%s.stage: %u is %s, expected one pool per stage 0..%zu", at.c_str(),
                         y.stage, y.stage >= num_stages ? "no stage" : "a second pool of its stage",
                         num_stages - 1));
    }
    seen[y.stage] = true;
    if (auto st = check_node_id(y.node_id, at + ".nodeId"); !st) return st.error();
    if (y.num_blocks == 0 || y.block_size == 0) {
      return fail(WireErrc::kInvalid, strfmt("%s: %u blocks of %u tokens, expected both >= 1",
                                             at.c_str(), y.num_blocks, y.block_size));
    }
  }
  return out;
}

}  // namespace

Result<WireFrame> encode(const PlacementMsg& m, const SendInfo& send) {
  for (size_t s = 0; s < m.shards.size(); ++s) {
    for (int32_t e : m.shards[s].experts) {
      if (e < 0) {
        return fail(WireErrc::kUnencodable,
                    strfmt("encode Placement: shards[%zu] has expert %d, expected ids >= 0", s, e));
      }
    }
  }
  return encode_msg<schemas::Placement>(
      "encode Placement", m.header.cluster_epoch, send,
      [&](schemas::Placement::Builder root) -> Status {
        root.setVersion(m.version);
        root.setModelName(text(m.model_name));
        root.setModelFileHash(m.model_hash);
        auto stages = root.initStages(static_cast<unsigned>(m.stages.size()));
        for (size_t i = 0; i < m.stages.size(); ++i) {
          const StagePlacementInfo& x = m.stages[i];
          auto y = stages[unsigned(i)];
          y.setStage(x.stage);
          y.setNodeId(x.node_id);
          y.initDevices(1).set(0, -1);  // CPU: the only device this build places on
          y.setLayerBegin(x.layer_begin);
          y.setLayerEnd(x.layer_end);
          y.setHasEmbedding(x.has_embedding);
          y.setHasOutputHead(x.has_output_head);
          y.setThreads(x.threads);
        }
        auto shards = root.initExpertShards(static_cast<unsigned>(m.shards.size()));
        for (size_t i = 0; i < m.shards.size(); ++i) {
          const ShardPlacementInfo& x = m.shards[i];
          auto y = shards[unsigned(i)];
          y.setShard(x.shard);
          y.setNodeId(x.node_id);
          y.setDevice(-1);
          write_ints(y.initExperts(static_cast<unsigned>(x.experts.size())), x.experts);
          y.setThreads(x.threads);
        }
        auto pools = root.initKvPools(static_cast<unsigned>(m.kv_pools.size()));
        for (size_t i = 0; i < m.kv_pools.size(); ++i) {
          const KvPoolInfo& x = m.kv_pools[i];
          auto y = pools[unsigned(i)];
          y.setStage(x.stage);
          y.setNodeId(x.node_id);
          y.setDevice(-1);
          y.setNumBlocks(x.num_blocks);
          y.setBlockSizeTokens(x.block_size);
        }
        auto encoders = root.initEncoders(static_cast<unsigned>(m.encoders.size()));
        for (size_t i = 0; i < m.encoders.size(); ++i) {
          auto y = encoders[unsigned(i)];
          y.setIndex(m.encoders[i].index);
          y.setNodeId(m.encoders[i].node_id);
          y.setDevice(-1);
          y.setThreads(m.encoders[i].threads);
        }
        root.setNumMicrobatches(m.microbatches);
        return Ok{};
      });
}

Result<PlacementMsg> decode_placement(std::span<const uint8_t> f, const ControlLimits& l) {
  return decode_frame<schemas::Placement, PlacementMsg>(
      f, l.max_frame_bytes, "Placement",
      [&](schemas::Placement::Reader root) -> Result<PlacementMsg> {
        PlacementMsg m;
        auto h = read_wire_header(root.getHeader(), l.expected_epoch, "Placement");
        if (!h) return h.error();
        m.header = *h;
        m.version = root.getVersion();
        auto name = read_text(root.getModelName(), l.max_text, "Placement.modelName");
        if (!name) return name.error();
        m.model_name = std::move(*name);
        m.model_hash = root.getModelFileHash();
        auto stages = read_stages(root.getStages(), l);
        if (!stages) return stages.error();
        m.stages = std::move(*stages);
        auto shards = read_shards(root.getExpertShards(), l);
        if (!shards) return shards.error();
        m.shards = std::move(*shards);
        auto pools = read_kv_pools(root.getKvPools(), m.stages.size());
        if (!pools) return pools.error();
        m.kv_pools = std::move(*pools);
        auto encoders = root.getEncoders();
        if (auto st = check_len("Placement.encoders", encoders.size(), l.max_list); !st)
          return st.error();
        for (unsigned i = 0; i < encoders.size(); ++i) {
          EncoderPlacementInfo e{encoders[i].getIndex(), encoders[i].getNodeId(),
                                 encoders[i].getThreads()};
          if (e.index != i) {
            return fail(WireErrc::kInvalid,
                        strfmt("Placement.encoders[%u].index: %u, expected %u (in index order)", i,
                               e.index, i));
          }
          if (auto st = check_node_id(e.node_id, strfmt("Placement.encoders[%u].nodeId", i)); !st)
            return st.error();
          m.encoders.push_back(e);
        }
        m.microbatches = root.getNumMicrobatches();
        if (m.microbatches == 0)
          return fail(WireErrc::kInvalid, "Placement.numMicrobatches: 0, expected >= 1");
        return m;
      });
}

Result<WireFrame> encode(const PlacementReportMsg& m, const SendInfo& send) {
  return encode_msg<schemas::PlacementReport>(
      "encode PlacementReport", m.header.cluster_epoch, send,
      [&](schemas::PlacementReport::Builder root) -> Status {
        root.setVersion(m.version);
        root.setOk(m.ok);
        if (!m.error.empty()) write_error(root.initError(), m.error);
        write_phases(root.initStartupPhases(static_cast<unsigned>(m.phases.size())), m.phases);
        return Ok{};
      });
}

Result<PlacementReportMsg> decode_placement_report(std::span<const uint8_t> f,
                                                   const ControlLimits& l) {
  return decode_frame<schemas::PlacementReport, PlacementReportMsg>(
      f, l.max_frame_bytes, "PlacementReport",
      [&](schemas::PlacementReport::Reader root) -> Result<PlacementReportMsg> {
        PlacementReportMsg m;
        auto h = read_wire_header(root.getHeader(), l.expected_epoch, "PlacementReport");
        if (!h) return h.error();
        m.header = *h;
        m.version = root.getVersion();
        m.ok = root.getOk();
        if (root.hasError()) m.error = read_error(root.getError());
        auto phases = read_phases(root.getStartupPhases(), l, "PlacementReport.startupPhases");
        if (!phases) return phases.error();
        m.phases = std::move(*phases);
        return m;
      });
}

}  // namespace troupe::actors::detail
