#include "compute/kv_cache.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "base/check.h"
#include "base/huge_pages.h"
#include "compute/vec_ops.h"
#include "model/ggml_types.h"
#include "model/model.h"

namespace troupe::compute {

uint64_t kv_pool_bytes(const KvCacheConfig& cfg) {
  return static_cast<uint64_t>(cfg.n_layer) * static_cast<uint64_t>(cfg.num_blocks) *
         static_cast<uint64_t>(cfg.block_size) * static_cast<uint64_t>(cfg.k_width + cfg.v_width) *
         static_cast<uint64_t>(kv_type_bytes(cfg.type));
}

KvCache::KvCache(const KvCacheConfig& cfg)
    : cfg_(cfg), row_(cfg.k_width + cfg.v_width), elem_bytes_(kv_type_bytes(cfg.type)) {
  if (cfg.n_layer <= 0 || row_ <= 0 || cfg.k_width <= 0 || cfg.v_width < 0 || cfg.block_size <= 0 ||
      cfg.num_blocks <= 0 || cfg.heads <= 0 || cfg.k_width % cfg.heads != 0 ||
      cfg.v_width % cfg.heads != 0)
    TROUPE_INPUT_ERROR(
        "KV cache: bad configuration (layers %lld, K width %lld, V width %lld, heads %lld, "
        "block %lld, blocks %lld)",
        static_cast<long long>(cfg.n_layer), static_cast<long long>(cfg.k_width),
        static_cast<long long>(cfg.v_width), static_cast<long long>(cfg.heads),
        static_cast<long long>(cfg.block_size), static_cast<long long>(cfg.num_blocks));
  kd_ = cfg.k_width / cfg.heads;
  vd_ = cfg.v_width / cfg.heads;
  bytes_ = kv_pool_bytes(cfg);
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  const uint64_t available = model::available_memory_bytes();  // 0: unknown
  if (available > 0 && bytes_ > available)
    TROUPE_INPUT_ERROR(
        "KV cache: a pool of %lld blocks of %lld tokens over %lld layers needs %.2f GiB of %s "
        "values, more than the %.2f GiB of memory available (lower kv_blocks, or "
        "scheduler.max_sequences or max_model_len, which size an \"auto\" pool; f16 or bf16 "
        "values take half of f32's)",
        static_cast<long long>(cfg.num_blocks), static_cast<long long>(cfg.block_size),
        static_cast<long long>(cfg.n_layer), static_cast<double>(bytes_) / kGiB,
        std::string(kv_type_name(cfg.type)).c_str(), static_cast<double>(available) / kGiB);
  std::shared_ptr<uint8_t> mem = map_huge_pages(bytes_);
  if (!mem)
    TROUPE_INPUT_ERROR("KV cache: cannot map %.2f GiB: %s", static_cast<double>(bytes_) / kGiB,
                       std::strerror(errno));
  pool_ = std::move(mem);
}

void KvCache::store(int64_t layer, int32_t block, int64_t slot, int64_t at, const float* x,
                    int64_t n) {
  uint8_t* base = this->block(layer, block);
  for_each_run(slot, at, n, [&](int64_t place, int64_t i, int64_t len, int64_t step) {
    uint8_t* r = base + place * elem_bytes_;
    auto* f = reinterpret_cast<float*>(r);
    auto* h = reinterpret_cast<uint16_t*>(r);
    switch (cfg_.type) {
      case KvType::kF32:
        if (step == 1) {
          std::memcpy(r, x + i, static_cast<size_t>(len) * sizeof(float));
        } else {
          for (int64_t k = 0; k < len; ++k) f[k * step] = x[i + k];
        }
        break;
      case KvType::kF16:
        if (step == 1) {
          round_to_f16(x + i, h, len);
        } else {  // the same bits (round_to_f16 is the scalar conversion)
          for (int64_t k = 0; k < len; ++k) h[k * step] = model::fp32_to_fp16(x[i + k]);
        }
        break;
      case KvType::kBF16:
        for (int64_t k = 0; k < len; ++k) h[k * step] = model::fp32_to_bf16(x[i + k]);
        break;
    }
  });
}

void KvCache::load(int64_t layer, int32_t block, int64_t slot, int64_t at, int64_t n, float* out) {
  const uint8_t* base = this->block(layer, block);
  for_each_run(slot, at, n, [&](int64_t place, int64_t i, int64_t len, int64_t step) {
    const uint8_t* r = base + place * elem_bytes_;
    const auto* f = reinterpret_cast<const float*>(r);
    const auto* h = reinterpret_cast<const uint16_t*>(r);
    for (int64_t k = 0; k < len; ++k) {
      switch (cfg_.type) {
        case KvType::kF32:
          out[i + k] = f[k * step];
          break;
        case KvType::kF16:
          out[i + k] = model::fp16_to_fp32(h[k * step]);
          break;
        case KvType::kBF16:
          out[i + k] = model::bf16_to_fp32(h[k * step]);
          break;
      }
    }
  });
}

BlockAllocator::BlockAllocator(int64_t num_blocks) : total_(num_blocks) {
  free_.reserve(static_cast<size_t>(num_blocks));
  // Hand out low ids first: pop from the back.
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

bool BlockAllocator::allocate(int64_t n, std::vector<int32_t>* out) {
  if (n > num_free()) return false;
  for (int64_t i = 0; i < n; ++i) {
    out->push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void BlockAllocator::release(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    TROUPE_CHECK(b >= 0 && b < total_, "block id %d out of range", b);
    free_.push_back(b);
  }
}

}  // namespace troupe::compute
