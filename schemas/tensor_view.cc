// TensorView validation: dtype, shape and size checks for tensors read from messages.
#include "schemas/tensor_view.h"

#include <cstring>
#include <string>

#include "schemas/errc.h"

namespace troupe::schemas {
namespace {

std::string shape_str(std::span<const uint64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

std::string dims_str(std::initializer_list<int64_t> dims) {
  std::string out = "[";
  bool first = true;
  for (int64_t d : dims) {
    if (!first) out += ", ";
    first = false;
    out += d < 0 ? std::string("*") : std::to_string(d);
  }
  return out + "]";
}

Error fail(Errc e, std::string message) { return make_error(code(e), std::move(message)); }

}  // namespace

size_t dtype_size(TensorDtype dtype) {
  switch (dtype) {
    case TensorDtype::kF32:
      return 4;
    case TensorDtype::kF16:
      return 2;
    case TensorDtype::kBf16:
      return 2;
    case TensorDtype::kF64:
      return 8;
    case TensorDtype::kI8:
      return 1;
    case TensorDtype::kU8:
      return 1;
    case TensorDtype::kI16:
      return 2;
    case TensorDtype::kI32:
      return 4;
    case TensorDtype::kI64:
      return 8;
    case TensorDtype::kF8E4M3:
      return 1;
    case TensorDtype::kF8E5M2:
      return 1;
    case TensorDtype::kUnknown:
      return 0;
  }
  return 0;
}

const char* dtype_name(TensorDtype dtype) {
  switch (dtype) {
    case TensorDtype::kF32:
      return "f32";
    case TensorDtype::kF16:
      return "f16";
    case TensorDtype::kBf16:
      return "bf16";
    case TensorDtype::kF64:
      return "f64";
    case TensorDtype::kI8:
      return "i8";
    case TensorDtype::kU8:
      return "u8";
    case TensorDtype::kI16:
      return "i16";
    case TensorDtype::kI32:
      return "i32";
    case TensorDtype::kI64:
      return "i64";
    case TensorDtype::kF8E4M3:
      return "f8e4m3";
    case TensorDtype::kF8E5M2:
      return "f8e5m2";
    case TensorDtype::kUnknown:
      return "unknown";
  }
  return "unknown";
}

Result<TensorView> make_tensor_view(uint16_t dtype, std::span<const uint64_t> shape,
                                    std::span<const uint8_t> data, const TensorReadOptions& opts) {
  if (dtype == 0 || dtype > kMaxDtypeValue) {
    return fail(Errc::kUnknownDtype,
                dtype == 0 ? std::string("tensor dtype is unset (0)")
                           : strfmt("tensor dtype %u is unknown (this build knows 1..%u)",
                                    unsigned{dtype}, unsigned{kMaxDtypeValue}));
  }
  TensorView view;
  view.dtype_ = static_cast<TensorDtype>(dtype);
  const size_t elem = dtype_size(view.dtype_);
  if (shape.empty() || shape.size() > static_cast<size_t>(kMaxTensorRank)) {
    return fail(Errc::kBadShape,
                strfmt("tensor rank %zu is outside 1..%d", shape.size(), kMaxTensorRank));
  }
  // Element count and byte size without overflow: a peer may send any 64-bit dims.
  uint64_t n = 1;
  for (uint64_t d : shape) {
    if (d != 0 && n > UINT64_MAX / d) {
      return fail(Errc::kBadShape, "tensor shape " + shape_str(shape) + " overflows 64 bits");
    }
    n *= d;
  }
  if (n > UINT64_MAX / elem) {
    return fail(Errc::kBadShape, "tensor shape " + shape_str(shape) + " overflows 64 bits");
  }
  if (n * elem != data.size()) {
    return fail(Errc::kBadShape, strfmt("tensor %s %s needs %llu bytes, data has %zu",
                                        dtype_name(view.dtype_), shape_str(shape).c_str(),
                                        static_cast<unsigned long long>(n * elem), data.size()));
  }
  view.rank_ = static_cast<int>(shape.size());
  std::memcpy(view.dims_.data(), shape.data(), shape.size() * sizeof(uint64_t));
  view.num_elements_ = n;
  view.bytes_ = data;
  if (reinterpret_cast<uintptr_t>(data.data()) % elem != 0) {
    if (!opts.copy_if_misaligned) {
      return fail(
          Errc::kMisaligned,
          strfmt("tensor %s data at address %% %zu = %zu is not aligned to its %zu-byte "
                 "elements",
                 dtype_name(view.dtype_), elem,
                 static_cast<size_t>(reinterpret_cast<uintptr_t>(data.data()) % elem), elem));
    }
    // operator new[] aligns to at least alignof(max_align_t) (16), enough for every dtype.
    std::shared_ptr<uint8_t[]> copy(new uint8_t[data.size()]);
    std::memcpy(copy.get(), data.data(), data.size());
    view.bytes_ = {copy.get(), data.size()};
    view.owned_ = std::move(copy);
  }
  return view;
}

Status expect_tensor(const TensorView& tensor, std::initializer_list<TensorDtype> dtypes,
                     std::initializer_list<int64_t> dims, std::string_view what) {
  bool dtype_ok = dtypes.size() == 0;
  std::string want_dtypes;
  for (TensorDtype d : dtypes) {
    dtype_ok = dtype_ok || d == tensor.dtype();
    want_dtypes += (want_dtypes.empty() ? "" : "|") + std::string(dtype_name(d));
  }
  bool shape_ok = dims.size() == static_cast<size_t>(tensor.rank());
  for (size_t i = 0; shape_ok && i < dims.size(); ++i) {
    int64_t want = dims.begin()[i];
    shape_ok = want < 0 || static_cast<uint64_t>(want) == tensor.shape()[i];
  }
  if (dtype_ok && shape_ok) return Ok{};
  return fail(Errc::kShapeMismatch,
              strfmt("%.*s: expected %s %s, got %s %s", static_cast<int>(what.size()), what.data(),
                     want_dtypes.empty() ? "any" : want_dtypes.c_str(), dims_str(dims).c_str(),
                     dtype_name(tensor.dtype()), shape_str(tensor.shape()).c_str()));
}

}  // namespace troupe::schemas
