// What the KV cache stores its K and V values as (compute/kv_cache.h, the attention kernel in
// compute/vec_ops.h). A small header: engine options and command lines name it.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace troupe::compute {

/// f32 (the default) keeps every K and V value as the step computed it. f16 and bf16 halve the
/// pool, so it holds twice the tokens, and halve what attention reads per position: each value
/// is rounded once, to nearest even, when it is written, and attention computes in f32 on the
/// rounded values (results stay deterministic and batch-invariant, but are no longer the f32
/// cache's bits). f16 keeps 11 significant bits and overflows above 65504 (to infinity); bf16
/// keeps 8 and f32's range.
enum class KvType : uint8_t { kF32, kF16, kBF16 };

/// "f32", "f16" or "bf16".
constexpr std::string_view kv_type_name(KvType t) {
  return t == KvType::kF16 ? "f16" : t == KvType::kBF16 ? "bf16" : "f32";
}

/// The type named by "f32", "f16" or "bf16" (those exact names); nothing for anything else.
constexpr std::optional<KvType> parse_kv_type(std::string_view s) {
  for (KvType t : {KvType::kF32, KvType::kF16, KvType::kBF16})
    if (s == kv_type_name(t)) return t;
  return std::nullopt;
}

/// Bytes per stored value.
constexpr int64_t kv_type_bytes(KvType t) { return t == KvType::kF32 ? 4 : 2; }

}  // namespace troupe::compute
