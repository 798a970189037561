// Tensor and Header helpers over the generated message types (see tensor_codec.h).
#include "schemas/tensor_codec.h"

#include <array>
#include <cstring>
#include <string>
#include <utility>

#include <capnp/message.h>
#include <capnp/orphan.h>

namespace troupe::schemas {
namespace {

// TensorDtype mirrors the schema's DType value for value.
static_assert(static_cast<uint16_t>(DType::UNKNOWN) == uint16_t(TensorDtype::kUnknown));
static_assert(static_cast<uint16_t>(DType::F32) == uint16_t(TensorDtype::kF32));
static_assert(static_cast<uint16_t>(DType::F16) == uint16_t(TensorDtype::kF16));
static_assert(static_cast<uint16_t>(DType::BF16) == uint16_t(TensorDtype::kBf16));
static_assert(static_cast<uint16_t>(DType::F64) == uint16_t(TensorDtype::kF64));
static_assert(static_cast<uint16_t>(DType::I8) == uint16_t(TensorDtype::kI8));
static_assert(static_cast<uint16_t>(DType::U8) == uint16_t(TensorDtype::kU8));
static_assert(static_cast<uint16_t>(DType::I16) == uint16_t(TensorDtype::kI16));
static_assert(static_cast<uint16_t>(DType::I32) == uint16_t(TensorDtype::kI32));
static_assert(static_cast<uint16_t>(DType::I64) == uint16_t(TensorDtype::kI64));
static_assert(static_cast<uint16_t>(DType::F8E4M3) == uint16_t(TensorDtype::kF8E4M3));
static_assert(static_cast<uint16_t>(DType::F8E5M2) == uint16_t(TensorDtype::kF8E5M2));
static_assert(static_cast<uint16_t>(DType::F8E5M2) == kMaxDtypeValue,
              "a DType was added to common.capnp: add it to TensorDtype too");

// The last Role enumerant this build knows.
constexpr uint16_t kMaxRoleValue = static_cast<uint16_t>(Role::GATEWAY);

Error fail(Errc e, std::string message) { return make_error(code(e), std::move(message)); }

void write_meta(Tensor::Builder dst, TensorDtype dtype, std::span<const uint64_t> shape) {
  dst.setDtype(static_cast<DType>(dtype));
  auto list = dst.initShape(static_cast<unsigned>(shape.size()));
  for (size_t i = 0; i < shape.size(); ++i) list.set(static_cast<unsigned>(i), shape[i]);
}

}  // namespace

Status set_tensor_external(Tensor::Builder dst, TensorDtype dtype, std::span<const uint64_t> shape,
                           std::span<const uint8_t> data, size_t readable_bytes) {
  TensorReadOptions strict;
  strict.copy_if_misaligned = false;
  Result<TensorView> check = make_tensor_view(static_cast<uint16_t>(dtype), shape, data, strict);
  if (!check) return check.error();
  const auto addr = reinterpret_cast<uintptr_t>(data.data());
  if (addr % sizeof(capnp::word) != 0) {
    return fail(Errc::kMisaligned,
                strfmt("external tensor data at address %% 8 = %zu is not 8-byte aligned; "
                       "Cap'n Proto segments are word arrays (use set_tensor_copy)",
                       static_cast<size_t>(addr % sizeof(capnp::word))));
  }
  const size_t padded = (data.size() + 7) / 8 * 8;
  const size_t readable = readable_bytes == 0 ? data.size() : readable_bytes;
  if (readable < padded) {
    return fail(Errc::kMisaligned,
                strfmt("external tensor data of %zu bytes needs %zu readable bytes (a whole "
                       "number of words), buffer has %zu; pad it or use set_tensor_copy",
                       data.size(), padded, readable));
  }
  try {
    write_meta(dst, dtype, shape);
    if (!data.empty()) {
      auto orphanage = capnp::Orphanage::getForMessageContaining(dst);
      dst.adoptData(orphanage.referenceExternalData(capnp::Data::Reader(data.data(), data.size())));
    }
    return Ok{};
  } catch (const kj::Exception& e) {
    return malformed_error("Tensor (external)", e);
  }
}

Status set_tensor_copy(Tensor::Builder dst, TensorDtype dtype, std::span<const uint64_t> shape,
                       std::span<const uint8_t> data) {
  Result<TensorView> check = make_tensor_view(static_cast<uint16_t>(dtype), shape, data);
  if (!check) return check.error();
  try {
    write_meta(dst, dtype, shape);
    auto out = dst.initData(static_cast<unsigned>(data.size()));
    if (!data.empty()) std::memcpy(out.begin(), data.data(), data.size());
    return Ok{};
  } catch (const kj::Exception& e) {
    return malformed_error("Tensor (copy)", e);
  }
}

Result<TensorView> read_tensor(Tensor::Reader src, const TensorReadOptions& opts) {
  return guard("Tensor", [&]() -> Result<TensorView> {
    if (src.hasBulk() && src.getBulk().getTransferId() != 0) {
      return fail(Errc::kBulkPayload,
                  strfmt("tensor payload is bulk transfer %llu (%llu bytes), not inline; validate "
                         "the received bytes with make_tensor_view()",
                         static_cast<unsigned long long>(src.getBulk().getTransferId()),
                         static_cast<unsigned long long>(src.getBulk().getSizeBytes())));
    }
    auto list = src.getShape();
    if (list.size() == 0 || list.size() > static_cast<unsigned>(kMaxTensorRank)) {
      return fail(Errc::kBadShape,
                  strfmt("tensor rank %u is outside 1..%d", list.size(), kMaxTensorRank));
    }
    std::array<uint64_t, kMaxTensorRank> dims{};
    for (unsigned i = 0; i < list.size(); ++i) dims[i] = list[i];
    auto data = src.getData();
    return make_tensor_view(static_cast<uint16_t>(src.getDtype()), {dims.data(), list.size()},
                            {data.begin(), data.size()}, opts);
  });
}

void set_header(Header::Builder dst, const HeaderFields& fields) {
  dst.setClusterEpoch(fields.cluster_epoch);
  dst.setSeq(fields.seq);
  auto sender = dst.initSender();
  sender.setNode(fields.node);
  sender.setRole(fields.role);
  sender.setIndex(fields.index);
}

Result<HeaderFields> read_header(Header::Reader src, uint64_t expected_epoch) {
  return guard("Header", [&]() -> Result<HeaderFields> {
    HeaderFields f;
    f.cluster_epoch = src.getClusterEpoch();
    f.seq = src.getSeq();
    auto sender = src.getSender();
    f.node = sender.getNode();
    f.role = sender.getRole();
    f.index = sender.getIndex();
    const auto role = static_cast<uint16_t>(f.role);
    if (f.seq == 0) return fail(Errc::kBadHeader, "header seq is unset (0)");
    if (role == 0 || role > kMaxRoleValue) {
      return fail(Errc::kBadHeader, strfmt("header sender role %u is invalid (this build knows "
                                           "1..%u)",
                                           unsigned{role}, unsigned{kMaxRoleValue}));
    }
    if (expected_epoch == 0) return f;
    if (f.cluster_epoch == 0) return fail(Errc::kBadHeader, "header cluster epoch is unset (0)");
    if (f.cluster_epoch < expected_epoch) {
      return fail(Errc::kStaleEpoch,
                  strfmt("message from epoch %llu, receiver is in epoch %llu: stale",
                         static_cast<unsigned long long>(f.cluster_epoch),
                         static_cast<unsigned long long>(expected_epoch)));
    }
    if (f.cluster_epoch > expected_epoch) {
      return fail(Errc::kFutureEpoch,
                  strfmt("message from epoch %llu, receiver is in epoch %llu: receiver is behind",
                         static_cast<unsigned long long>(f.cluster_epoch),
                         static_cast<unsigned long long>(expected_epoch)));
    }
    return f;
  });
}

Error malformed_error(std::string_view what, const kj::Exception& e) {
  return fail(Errc::kMalformed,
              std::string(what) + ": malformed message: " + e.getDescription().cStr());
}

}  // namespace troupe::schemas
