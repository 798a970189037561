// Matrix products of stored weights (any supported GgmlType) with f32 activations.
// Batch-invariant by contract: y[t][o] depends only on weight row o and activation row t, never
// on n_tok, on the thread count, or on which rows are computed together. Tests pin this.
// Kernels: AVX-512 (+VNNI), AVX2 or scalar, chosen once per process from the CPU (override:
// TROUPE_SIMD=scalar|avx2|avx512, see matmul.cc); different paths may differ in the last bits.
// F32/F16/BF16 weights multiply f32 activations with f32 FMA accumulation, and so do the
// scaled types (F8_E4M3, I4_PACKED, FP4_PACKED) and MXFP4, on their exact values (each output
// bit-identical to an F32 matrix holding them, on the same path). Q8_0, Q4_0, the
// K-quants (Q2_K-Q6_K), IQ4_NL and IQ4_XS multiply int8-quantized activations (scale per 32
// values, per 256 for 256-value blocks) with exact integer dot products: about 1e-3 relative
// error against f32 math. A NaN or infinity in an activation row makes that row's outputs
// non-finite.
// Thread safety: calls may run concurrently on different threads (scratch is per thread), each
// with its own pool or none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "model/model_spec.h"
#include "model/weight_tiles.h"

namespace troupe::compute {

class ThreadPool;

/// y[t * y_stride + o] = dot(W row o, x row t) for t < n_tok, o < w.rows().
/// x: f32 [n_tok, w.cols()] with row stride x_stride; y: f32 with row stride y_stride.
/// pool may be null (single-threaded); it is used for one run at a time (not reentrant).
/// Throws InputError for a weight type without kernels (the message names the tensor).
void matmul(const model::WeightView& w, const float* x, int64_t x_stride, int64_t n_tok, float* y,
            int64_t y_stride, ThreadPool* pool);

/// Convenience: dense rows, y_stride = w.rows(), x_stride = w.cols().
inline void matmul(const model::WeightView& w, const float* x, int64_t n_tok, float* y,
                   ThreadPool* pool) {
  matmul(w, x, w.cols(), n_tok, y, w.rows(), pool);
}

/// One of several products with the same input rows: y[t * y_stride + o] = dot(w row o, x row t).
struct MatmulTarget {
  const model::WeightView& w;
  float* y;
  int64_t y_stride;
};

/// Several matrices applied to the same x (q/k/v, gate/up): every output exactly as matmul()
/// computes it, with one hand-off to the pool and one preparation of x for the matrices of one
/// type, layout and width (matmul_many).
void matmul_shared(std::span<const MatmulTarget> targets, const float* x, int64_t x_stride,
                   int64_t n_tok, ThreadPool* pool);

/// One product of matmul_many: y[t * y_stride + o] = dot(w row o, x row t) for t < n_tok.
struct MatmulProduct {
  const model::WeightView* w;
  const float* x;
  int64_t x_stride;
  int64_t n_tok;
  float* y;
  int64_t y_stride;
};

/// Products with their own inputs (the experts of an MoE layer, each on its own tokens): every
/// output exactly as matmul() computes it, in one hand-off to the pool for all matrices of one
/// type and layout, so that the threads share out the rows of all of them at once (products
/// whose row tiles together are too few to share out, or one alone of its type, as matmul()).
/// A product whose input is the one before it (x, stride, token count and width: gate and up
/// of one expert) shares its prepared activations.
void matmul_many(std::span<const MatmulProduct> products, ThreadPool* pool);

/// Dequantizes row r of w into out[w.cols()] (embedding lookup). Any layout.
void get_row(const model::WeightView& w, int64_t r, float* out);

/// Whether this process's kernels read every tileable type (model::tileable) in 16-row tiles
/// (WeightLayout::kTiles16) fast (AVX-512 with VNNI), so that a weight copy for the CPU engine
/// should tile them (model::copy_weights_to_memory). Every kernel path reads tiles correctly (where
/// no SIMD tile kernel exists, the scalar one, slowly). Int8 types give the same bits on every
/// path; F16 and BF16 (whose kernels sum in each SIMD level's own order) give the AVX-512 row
/// kernels' bits at the AVX-512 levels and the scalar kernel's elsewhere.
bool weight_tiles_supported();

/// The weight types this process's kernels read fast in 16-row tiles, which a weight copy for
/// the CPU engine should tile (model::copy_weights_to_memory): every tileable type where
/// weight_tiles_supported() (AVX-512 VNNI); F16 and BF16 on AVX-512 without VNNI (their tile
/// kernels need none; the int8 types keep their rows there); with AVX2 only, the int8 types (Q4_0,
/// Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), whose tile kernels give the bits of every other
/// path's tiles (F16 and BF16 keep their rows and AVX2's row kernels); none on the scalar path.
/// For every type listed, the same level's kernels read the type's rows (a mapped file) with the
/// same arithmetic: a copy gives the bits of the mapped model.
model::TileTypes tiled_weight_types();

/// Which SIMD path the kernels dispatch to in this process ("avx512", "avx2", "scalar").
const char* simd_level();

}  // namespace troupe::compute
