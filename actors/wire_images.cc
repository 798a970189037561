// Wire codec of the image messages: EncodeImage (the head's image file for an encoder instance on
// another node) and EncodedImage (its rows back). Same rules as wire.cc: every frame hostile,
// sizes checked before anything is copied (actors/detail/wire.h).
#include <cmath>
#include <string>

#include "actors/detail/wire.h"
#include "actors/detail/wire_internal.h"
#include "schemas/encoder.capnp.h"

namespace troupe::actors::detail {

using schemas::TensorDtype;
using wire_internal::build_frame;
using wire_internal::check_send;
using wire_internal::decode_frame;
using wire_internal::fail;
using wire_internal::in_field;
using wire_internal::read_error;
using wire_internal::read_wire_header;
using wire_internal::to_ns;
using wire_internal::write_error;
using wire_internal::write_f32;
using wire_internal::write_header;

Result<WireFrame> encode_encode_image(const ImageJobWire& job, uint64_t epoch,
                                      const SendInfo& send) {
  const char* what = "encode_encode_image";
  if (auto st = check_send(epoch, send, what); !st) return st.error();
  if (job.job_id == 0)
    return fail(WireErrc::kUnencodable, "encode_encode_image: job id 0 is unset");
  if (!job.image || job.image->empty() || job.image->size() > kMaxImageFileBytes)
    return fail(WireErrc::kUnencodable,
                strfmt("encode_encode_image: an image of %zu bytes, expected 1 to %zu",
                       job.image ? job.image->size() : size_t{0}, kMaxImageFileBytes));
  return build_frame<schemas::EncodeImage>(
      what, [&](schemas::EncodeImage::Builder root, WireFrame::Impl&) -> Status {
        write_header(root.initHeader(), epoch, send);
        root.setJobId(job.job_id);
        root.setEncoder(job.encoder);
        root.setImage(
            kj::arrayPtr(reinterpret_cast<const kj::byte*>(job.image->data()), job.image->size()));
        const std::string w = job.what.substr(0, kMaxImageWhatBytes);
        root.setWhat(capnp::Text::Reader(w.data(), w.size()));
        return Ok{};
      });
}

Result<DecodedEncodeImage> decode_encode_image(std::span<const uint8_t> frame,
                                               const EncodeImageLimits& lim) {
  return decode_frame<schemas::EncodeImage, DecodedEncodeImage>(
      frame, lim.max_frame_bytes, "EncodeImage",
      [&](schemas::EncodeImage::Reader root) -> Result<DecodedEncodeImage> {
        DecodedEncodeImage d;
        auto header = read_wire_header(root.getHeader(), lim.expected_epoch, "EncodeImage");
        if (!header) return header.error();
        d.header = *header;
        d.job.job_id = root.getJobId();
        if (d.job.job_id == 0) return fail(WireErrc::kInvalid, "EncodeImage.jobId: 0 is invalid");
        d.job.encoder = root.getEncoder();
        if (d.job.encoder >= lim.num_encoders)
          return fail(WireErrc::kInvalid,
                      strfmt("EncodeImage.encoder: %u, the placement has %u encoders",
                             d.job.encoder, lim.num_encoders));
        auto image = root.getImage();
        if (image.size() == 0 || image.size() > lim.max_image_bytes)
          return fail(image.size() == 0 ? WireErrc::kInvalid : WireErrc::kTooLong,
                      strfmt("EncodeImage.image: %zu bytes, expected 1 to %zu", image.size(),
                             lim.max_image_bytes));
        d.job.image = std::make_shared<const std::string>(
            reinterpret_cast<const char*>(image.begin()), image.size());
        auto w = root.getWhat();
        d.job.what.assign(w.cStr(), std::min<size_t>(w.size(), kMaxImageWhatBytes));
        for (char& c : d.job.what)  // it ends up in one-line error messages
          if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
        return d;
      });
}

Result<WireFrame> encode_encoded_image(const ImageRowsWire& r, int64_t n_rows, int64_t n_embd,
                                       uint64_t epoch, const SendInfo& send) {
  const char* what = "encode_encoded_image";
  if (auto st = check_send(epoch, send, what); !st) return st.error();
  if (r.job_id == 0) return fail(WireErrc::kUnencodable, "encode_encoded_image: job id 0 is unset");
  if (r.accepted)
    return build_frame<schemas::EncodedImage>(
        what, [&](schemas::EncodedImage::Builder root, WireFrame::Impl&) -> Status {
          write_header(root.initHeader(), epoch, send);
          root.setJobId(r.job_id);
          root.setAccepted(true);
          return Ok{};
        });
  const bool failed = !r.error.empty();
  if (!failed && (n_rows < 1 || n_embd < 1 || !r.rows ||
                  r.rows->size() != static_cast<size_t>(n_rows * n_embd)))
    return fail(WireErrc::kUnencodable,
                strfmt("encode_encoded_image: %zu values, expected %lld x %lld",
                       r.rows ? r.rows->size() : size_t{0}, static_cast<long long>(n_rows),
                       static_cast<long long>(n_embd)));
  if (!failed)
    for (size_t i = 0; i < r.rows->size(); ++i)
      if (!std::isfinite((*r.rows)[i]))
        return fail(WireErrc::kUnencodable,
                    strfmt("encode_encoded_image: value %zu of the rows is not finite", i));
  return build_frame<schemas::EncodedImage>(
      what, [&](schemas::EncodedImage::Builder root, WireFrame::Impl& impl) -> Status {
        write_header(root.initHeader(), epoch, send);
        root.setJobId(r.job_id);
        root.setEncodeNs(to_ns(r.seconds));
        if (failed) {
          auto e = root.initError();
          write_error(e, r.error);
          if (r.retry) e.setCode(kImageRetry);
          return Ok{};
        }
        if (auto st = write_f32(root.initRows(), *r.rows, static_cast<uint64_t>(n_rows), n_embd);
            !st)
          return in_field("encode_encoded_image: rows", st.error());
        impl.payload = r.rows;
        return Ok{};
      });
}

Result<WireHeader> peek_encoded_image(std::span<const uint8_t> frame, size_t max_frame_bytes,
                                      uint64_t* job_id) {
  if (job_id) *job_id = 0;
  return decode_frame<schemas::EncodedImage, WireHeader>(
      frame, max_frame_bytes, "EncodedImage",
      [&](schemas::EncodedImage::Reader root) -> Result<WireHeader> {
        if (job_id) *job_id = root.getJobId();
        auto header = read_wire_header(root.getHeader(), 0, "EncodedImage");
        if (!header) return header.error();
        if (header->sender.role != ActorRole::kEncoder)
          return fail(WireErrc::kInvalid, "EncodedImage.header: the sender is not an encoder");
        return *header;
      });
}

Result<DecodedEncodedImage> decode_encoded_image(std::span<const uint8_t> frame,
                                                 const EncodedImageLimits& lim) {
  if (lim.n_rows < 1 || lim.n_embd < 1)
    return fail(WireErrc::kInvalid, "decode_encoded_image: n_rows and n_embd must be >= 1");
  return decode_frame<schemas::EncodedImage, DecodedEncodedImage>(
      frame, lim.max_frame_bytes, "EncodedImage",
      [&](schemas::EncodedImage::Reader root) -> Result<DecodedEncodedImage> {
        DecodedEncodedImage d;
        auto header = read_wire_header(root.getHeader(), lim.expected_epoch, "EncodedImage");
        if (!header) return header.error();
        d.header = *header;
        d.job_id = root.getJobId();
        if (d.job_id == 0) return fail(WireErrc::kInvalid, "EncodedImage.jobId: 0 is invalid");
        d.seconds = static_cast<double>(root.getEncodeNs()) * 1e-9;
        if (root.getAccepted()) {
          if (root.hasError() || root.hasRows())
            return fail(WireErrc::kInvalid, "EncodedImage: a receipt with rows or an error");
          d.accepted = true;
          return d;
        }
        if (root.hasError()) {
          if (root.hasRows())
            return fail(WireErrc::kInvalid, "EncodedImage: an error with rows, expected none");
          d.error = read_error(root.getError());
          d.retry = root.getError().getCode() == kImageRetry;
          return d;
        }
        if (!root.hasRows())
          return fail(WireErrc::kInvalid, "EncodedImage.rows: absent without an error");
        auto v = schemas::read_tensor(root.getRows());
        if (!v) return in_field("EncodedImage.rows", v.error());
        if (auto st = schemas::expect_tensor(*v, {TensorDtype::kF32}, {lim.n_rows, lim.n_embd},
                                             "EncodedImage.rows");
            !st)
          return st.error();
        auto rows = v->as<float>();
        for (size_t i = 0; i < rows.size(); ++i)
          if (!std::isfinite(rows[i]))
            return fail(WireErrc::kInvalid,
                        strfmt("EncodedImage.rows: value %zu is not finite", i));
        d.rows.assign(rows.begin(), rows.end());
        return d;
      });
}

}  // namespace troupe::actors::detail
