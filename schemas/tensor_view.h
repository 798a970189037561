// TensorView: a validated, read-only view of a tensor that arrived in a message: dtype, shape,
// and the bytes in place in the receive buffer (or an owned copy when they were misaligned).
// Users: actors/ and transport/ (built by schemas/tensor_codec.h from a Tensor field), and any
// code a view is handed to. No Cap'n Proto types here, so any folder may include it.
// Thread safety: a TensorView is immutable; copies share the owned bytes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string_view>

#include "base/check.h"
#include "base/result.h"

namespace troupe::schemas {

/// Element types; the numbers are those of `DType` in schemas/common.capnp (checked in
/// tensor_codec.cc). Grow at the end only.
enum class TensorDtype : uint16_t {
  kUnknown = 0,  // never valid
  kF32 = 1,
  kF16 = 2,
  kBf16 = 3,
  kF64 = 4,
  kI8 = 5,
  kU8 = 6,
  kI16 = 7,
  kI32 = 8,
  kI64 = 9,
  kF8E4M3 = 10,
  kF8E5M2 = 11,
};

/// The largest raw dtype value this build knows.
inline constexpr uint16_t kMaxDtypeValue = 11;
/// Tensors have rank 1..kMaxTensorRank.
inline constexpr int kMaxTensorRank = 8;

/// Bytes per element; 0 for kUnknown and for values this build does not know.
size_t dtype_size(TensorDtype dtype);
/// "f32", "bf16", ...; "unknown" for kUnknown and values this build does not know.
const char* dtype_name(TensorDtype dtype);

struct TensorReadOptions {
  /// Data not aligned to its element size: true copies it into an owned, aligned buffer (the
  /// view's copied() is then true); false fails with Errc::kMisaligned. Data read from a frame
  /// that read_frame() accepted is always 8-byte aligned, so this only matters for other sources.
  bool copy_if_misaligned = true;
};

class TensorView {
 public:
  TensorView() = default;

  TensorDtype dtype() const { return dtype_; }
  int rank() const { return rank_; }
  /// Dimensions, outermost first, in elements.
  std::span<const uint64_t> shape() const { return {dims_.data(), static_cast<size_t>(rank_)}; }
  /// REQUIRES: 0 <= i < rank() (checked).
  uint64_t dim(int i) const {
    TROUPE_CHECK(i >= 0 && i < rank_, "dim %d of a rank-%d tensor", i, rank_);
    return dims_[static_cast<size_t>(i)];
  }
  uint64_t num_elements() const { return num_elements_; }
  /// num_elements() * dtype_size(dtype()) bytes, aligned to the element size.
  std::span<const uint8_t> bytes() const { return bytes_; }
  /// True when bytes() is an owned copy rather than a view into the message.
  bool copied() const { return owned_ != nullptr; }

  /// The data as elements of T. REQUIRES: sizeof(T) == dtype_size(dtype()) (checked); pick T to
  /// match the dtype (float for kF32, uint16_t for kF16/kBf16, ...).
  template <class T>
  std::span<const T> as() const {
    TROUPE_CHECK(sizeof(T) == dtype_size(dtype_), "as<T>() with sizeof(T)=%zu on a %s tensor",
                 sizeof(T), dtype_name(dtype_));
    return {reinterpret_cast<const T*>(bytes_.data()), static_cast<size_t>(num_elements_)};
  }

 private:
  friend Result<TensorView> make_tensor_view(uint16_t, std::span<const uint64_t>,
                                             std::span<const uint8_t>, const TensorReadOptions&);
  TensorDtype dtype_ = TensorDtype::kUnknown;
  int rank_ = 0;
  std::array<uint64_t, kMaxTensorRank> dims_{};
  uint64_t num_elements_ = 0;
  std::span<const uint8_t> bytes_;
  std::shared_ptr<const uint8_t[]> owned_;  // set when the bytes were copied out
};

/// Validates a tensor's parts and returns a view of them.
/// dtype: raw value off the wire; kUnknown or > kMaxDtypeValue fails with Errc::kUnknownDtype.
/// shape: rank 1..kMaxTensorRank, product without overflow, else Errc::kBadShape.
/// data: exactly product(shape) * dtype_size bytes (else Errc::kBadShape) and aligned to the
/// element size (else copied or Errc::kMisaligned, per opts).
/// The view references `data` unless copied: `data` must outlive it.
Result<TensorView> make_tensor_view(uint16_t dtype, std::span<const uint64_t> shape,
                                    std::span<const uint8_t> data,
                                    const TensorReadOptions& opts = {});

/// Checks a valid view against what the receiver expects: dtype one of `dtypes` (empty: any)
/// and shape equal to `dims`, where -1 matches any size. Fails with Errc::kShapeMismatch naming
/// `what` (e.g. "BatchDescriptor.hidden"), the expected and the actual dtype and shape.
Status expect_tensor(const TensorView& tensor, std::initializer_list<TensorDtype> dtypes,
                     std::initializer_list<int64_t> dims, std::string_view what);

}  // namespace troupe::schemas
