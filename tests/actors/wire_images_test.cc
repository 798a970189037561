// Tests of the image messages of actors/detail/wire.h (actors/wire_images.cc): EncodeImage and
// EncodedImage round trips that compare every field, what the encoders refuse, one test per kind
// of malformed input (each asserting the error names the problem), and a byte-flip loop.
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include "actors/detail/wire.h"
#include "schemas/encoder.capnp.h"
#include "schemas/errc.h"
#include "schemas/frame.h"
#include "tests/actors/wire_test_util.h"

namespace troupe::actors::detail {
namespace {

constexpr uint64_t kEpoch = 7;
constexpr int64_t kRows = 4;  // tokens per image
constexpr int64_t kEmbd = 8;
// The head's encoder front sends as the instance it addresses; the instance answers as itself.
const SendInfo kHead{.sender = {.node = 1, .role = ActorRole::kEncoder, .index = 1}, .seq = 11};
const SendInfo kEncoderNode{.sender = {.node = 3, .role = ActorRole::kEncoder, .index = 1},
                            .seq = 12};

using testing::Bytes;
using testing::expect_error;
using testing::flip_bytes;
using testing::mutate;
using testing::schema;
using testing::wire;

Bytes frame_of(const Result<WireFrame>& f) {
  EXPECT_TRUE(f) << (f ? "" : f.error().message);
  return f ? f->flatten() : Bytes{};
}

// ---- EncodeImage: head -> encoder node ----

std::shared_ptr<const std::string> image_bytes(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 37 + 5) & 0xff);  // NULs too
  return std::make_shared<const std::string>(std::move(s));
}

ImageJobWire make_job() {
  ImageJobWire j;
  j.job_id = 42;
  j.encoder = 1;
  j.image = image_bytes(300);
  j.what = "image 2";
  return j;
}

EncodeImageLimits encode_limits() {
  EncodeImageLimits l;
  l.num_encoders = 2;
  l.expected_epoch = kEpoch;
  return l;
}

Bytes valid_encode_image() { return frame_of(encode_encode_image(make_job(), kEpoch, kHead)); }

TEST(WireEncodeImage, RoundTripKeepsEveryField) {
  const ImageJobWire j = make_job();
  auto d = decode_encode_image(valid_encode_image(), encode_limits());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->header.cluster_epoch, kEpoch);
  EXPECT_EQ(d->header.sender, kHead.sender);
  EXPECT_EQ(d->header.seq, kHead.seq);
  EXPECT_EQ(d->job.job_id, 42u);
  EXPECT_EQ(d->job.encoder, 1u);
  ASSERT_NE(d->job.image, nullptr);
  EXPECT_EQ(*d->job.image, *j.image);  // byte for byte, NULs included
  EXPECT_NE(d->job.image.get(), j.image.get());
  EXPECT_EQ(d->job.what, "image 2");
}

TEST(WireEncodeImage, WhatIsCutTo64BytesAndLosesControlCharacters) {
  ImageJobWire j = make_job();
  j.what = std::string(100, 'w');
  auto d = decode_encode_image(frame_of(encode_encode_image(j, kEpoch, kHead)), encode_limits());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->job.what, std::string(kMaxImageWhatBytes, 'w'));
  // A peer that does not cut it: the decoder cuts it too.
  Bytes long_what = mutate<schemas::EncodeImage>(valid_encode_image(), [](auto root) {
    const std::string w(200, 'x');
    root.setWhat(capnp::Text::Reader(w.data(), w.size()));
  });
  d = decode_encode_image(long_what, encode_limits());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->job.what, std::string(kMaxImageWhatBytes, 'x'));
  // The name ends up in one-line error messages: control characters become spaces.
  Bytes control = mutate<schemas::EncodeImage>(valid_encode_image(), [](auto root) {
    const std::string w = std::string("img\n2\r\t\x1b[31m") + '\x7f' + "!";
    root.setWhat(capnp::Text::Reader(w.data(), w.size()));
  });
  d = decode_encode_image(control, encode_limits());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->job.what, "img 2   [31m !");
}

TEST(WireEncodeImage, EncodeRefusesJobIdZeroAndEmptyImages) {
  ImageJobWire j = make_job();
  j.job_id = 0;
  expect_error(encode_encode_image(j, kEpoch, kHead), wire(WireErrc::kUnencodable),
               "encode_encode_image: job id 0 is unset");
  j = make_job();
  j.image = std::make_shared<const std::string>();
  expect_error(encode_encode_image(j, kEpoch, kHead), wire(WireErrc::kUnencodable),
               "encode_encode_image: an image of 0 bytes, expected 1 to 33554432");
  j.image = nullptr;
  expect_error(encode_encode_image(j, kEpoch, kHead), wire(WireErrc::kUnencodable),
               "an image of 0 bytes");
  j = make_job();
  expect_error(encode_encode_image(j, 0, kHead), wire(WireErrc::kUnencodable),
               "encode_encode_image: epoch 0 is unset");
}

TEST(WireEncodeImage, RejectsJobIdZero) {
  Bytes zero =
      mutate<schemas::EncodeImage>(valid_encode_image(), [](auto root) { root.setJobId(0); });
  expect_error(decode_encode_image(zero, encode_limits()), wire(WireErrc::kInvalid),
               "EncodeImage.jobId: 0 is invalid");
}

TEST(WireEncodeImage, RejectsEncoderIndexOutOfThePlacement) {
  EncodeImageLimits lim = encode_limits();
  lim.num_encoders = 1;  // the job names encoder 1
  expect_error(decode_encode_image(valid_encode_image(), lim), wire(WireErrc::kInvalid),
               "EncodeImage.encoder: 1, the placement has 1 encoders");
  lim.num_encoders = 0;  // no placement yet
  expect_error(decode_encode_image(valid_encode_image(), lim), wire(WireErrc::kInvalid),
               "EncodeImage.encoder: 1, the placement has 0 encoders");
}

TEST(WireEncodeImage, RejectsEmptyOrOversizedImages) {
  Bytes empty =
      mutate<schemas::EncodeImage>(valid_encode_image(), [](auto root) { root.initImage(0); });
  expect_error(decode_encode_image(empty, encode_limits()), wire(WireErrc::kInvalid),
               "EncodeImage.image: 0 bytes, expected 1 to 33554432");
  Bytes absent =
      mutate<schemas::EncodeImage>(valid_encode_image(), [](auto root) { root.disownImage(); });
  expect_error(decode_encode_image(absent, encode_limits()), wire(WireErrc::kInvalid),
               "EncodeImage.image: 0 bytes");
  EncodeImageLimits lim = encode_limits();
  lim.max_image_bytes = 299;  // the image has 300
  expect_error(decode_encode_image(valid_encode_image(), lim), wire(WireErrc::kTooLong),
               "EncodeImage.image: 300 bytes, expected 1 to 299");
  lim.max_image_bytes = 300;
  EXPECT_TRUE(decode_encode_image(valid_encode_image(), lim));
}

TEST(WireEncodeImage, RejectsStaleEpochTruncationAndOversizedFrames) {
  EncodeImageLimits lim = encode_limits();
  lim.expected_epoch = kEpoch + 1;
  expect_error(decode_encode_image(valid_encode_image(), lim), schema(schemas::Errc::kStaleEpoch),
               "EncodeImage.header: message from epoch 7, receiver is in epoch 8");
  Bytes cut = valid_encode_image();
  cut.resize(cut.size() - 8);
  auto d = decode_encode_image(cut, encode_limits());
  ASSERT_FALSE(d);
  EXPECT_FALSE(d.error().message.empty());
  lim = encode_limits();
  lim.max_frame_bytes = 64;
  d = decode_encode_image(valid_encode_image(), lim);
  ASSERT_FALSE(d);
  EXPECT_FALSE(d.error().message.empty());
}

// ---- EncodedImage: encoder node -> head ----

std::shared_ptr<const std::vector<float>> make_rows(int64_t n_rows = kRows) {
  auto r = std::make_shared<std::vector<float>>(static_cast<size_t>(n_rows * kEmbd));
  for (size_t i = 0; i < r->size(); ++i) (*r)[i] = 0.25f * static_cast<float>(i) - 3.0f;
  return r;
}

ImageRowsWire make_answer() {
  ImageRowsWire r;
  r.job_id = 42;
  r.rows = make_rows();
  r.seconds = 0.375;
  return r;
}

EncodedImageLimits encoded_limits() {
  EncodedImageLimits l;
  l.n_rows = kRows;
  l.n_embd = kEmbd;
  l.expected_epoch = kEpoch;
  return l;
}

Bytes valid_encoded_image() {
  return frame_of(encode_encoded_image(make_answer(), kRows, kEmbd, kEpoch, kEncoderNode));
}

Bytes error_answer(bool retry) {
  ImageRowsWire r = make_answer();
  r.rows = nullptr;
  r.error = "image 2: not a PNG or JPEG file";
  r.retry = retry;
  return frame_of(encode_encoded_image(r, kRows, kEmbd, kEpoch, kEncoderNode));
}

TEST(WireEncodedImage, RowsRoundTrip) {
  const ImageRowsWire r = make_answer();
  auto d = decode_encoded_image(valid_encoded_image(), encoded_limits());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->header.cluster_epoch, kEpoch);
  EXPECT_EQ(d->header.sender, kEncoderNode.sender);
  EXPECT_EQ(d->header.seq, kEncoderNode.seq);
  EXPECT_EQ(d->job_id, 42u);
  EXPECT_EQ(d->rows, *r.rows);
  EXPECT_TRUE(d->error.empty());
  EXPECT_FALSE(d->retry);
  EXPECT_NEAR(d->seconds, 0.375, 1e-9);
}

TEST(WireEncodedImage, ErrorRoundTripsWithItsRetryFlag) {
  for (bool retry : {false, true}) {
    SCOPED_TRACE(retry);
    auto d = decode_encoded_image(error_answer(retry), encoded_limits());
    ASSERT_TRUE(d) << d.error().message;
    EXPECT_EQ(d->job_id, 42u);
    EXPECT_EQ(d->error, "image 2: not a PNG or JPEG file");
    EXPECT_EQ(d->retry, retry);
    EXPECT_TRUE(d->rows.empty());
    EXPECT_NEAR(d->seconds, 0.375, 1e-9);
    // The flag travels as ErrorReport.code kImageRetry (0: the image's own fault).
    const Bytes bytes = error_answer(retry);
    auto r = schemas::read_frame(bytes, size_t{1} << 20);
    ASSERT_TRUE(r);
    auto root = (*r)->getRoot<schemas::EncodedImage>();
    EXPECT_FALSE(root.hasRows());
    EXPECT_EQ(root.getError().getCode(), retry ? kImageRetry : 0);
  }
  // A long message is cut to the 1 KiB the schema allows.
  ImageRowsWire r = make_answer();
  r.rows = nullptr;
  r.error = std::string(5000, 'x');
  auto d = decode_encoded_image(
      frame_of(encode_encoded_image(r, kRows, kEmbd, kEpoch, kEncoderNode)), encoded_limits());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->error.size(), kMaxErrorBytes);
}

TEST(WireEncodedImage, EncodeRefusesRowsOfTheWrongSizeAndJobIdZero) {
  ImageRowsWire r = make_answer();
  r.rows = make_rows(kRows - 1);
  expect_error(encode_encoded_image(r, kRows, kEmbd, kEpoch, kEncoderNode),
               wire(WireErrc::kUnencodable), "encode_encoded_image: 24 values, expected 4 x 8");
  r.rows = nullptr;
  expect_error(encode_encoded_image(r, kRows, kEmbd, kEpoch, kEncoderNode),
               wire(WireErrc::kUnencodable), "encode_encoded_image: 0 values, expected 4 x 8");
  r = make_answer();
  r.job_id = 0;
  expect_error(encode_encoded_image(r, kRows, kEmbd, kEpoch, kEncoderNode),
               wire(WireErrc::kUnencodable), "encode_encoded_image: job id 0 is unset");
}

TEST(WireEncodedImage, RejectsRowsOfTheWrongShape) {
  EncodedImageLimits lim = encoded_limits();
  lim.n_rows = kRows + 1;
  expect_error(decode_encoded_image(valid_encoded_image(), lim),
               schema(schemas::Errc::kShapeMismatch),
               "EncodedImage.rows: expected f32 [5, 8], got f32 [4, 8]");
  lim = encoded_limits();
  lim.n_embd = kEmbd * 2;
  expect_error(decode_encoded_image(valid_encoded_image(), lim),
               schema(schemas::Errc::kShapeMismatch),
               "EncodedImage.rows: expected f32 [4, 16], got f32 [4, 8]");
  // [4, 9] with 32 floats of data: the tensor itself is inconsistent.
  Bytes shape = mutate<schemas::EncodedImage>(
      valid_encoded_image(), [](auto root) { root.getRows().getShape().set(1, kEmbd + 1); });
  expect_error(decode_encoded_image(shape, encoded_limits()), schema(schemas::Errc::kBadShape),
               "EncodedImage.rows:");
  expect_error(decode_encoded_image(valid_encoded_image(), {.n_rows = 0, .n_embd = kEmbd}),
               wire(WireErrc::kInvalid), "decode_encoded_image: n_rows and n_embd must be >= 1");
}

TEST(WireEncodedImage, RejectsValuesThatAreNotFinite) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    SCOPED_TRACE(bad);
    Bytes frame = mutate<schemas::EncodedImage>(valid_encoded_image(), [bad](auto root) {
      auto data = root.getRows().getData();
      std::memcpy(data.begin() + 13 * sizeof(float), &bad, sizeof(float));
    });
    expect_error(decode_encoded_image(frame, encoded_limits()), wire(WireErrc::kInvalid),
                 "EncodedImage.rows: value 13 is not finite");
  }
}

TEST(WireEncodedImage, EncodeRefusesRowsThatAreNotFiniteAndPeekStillFindsTheJob) {
  // An encoder whose rows are not finite does not send them (the node answers with an error).
  const Bytes good = valid_encoded_image();
  auto d = decode_encoded_image(good, encoded_limits());
  ASSERT_TRUE(d) << d.error().message;
  auto rows = std::make_shared<std::vector<float>>(d->rows);
  (*rows)[5] = std::numeric_limits<float>::quiet_NaN();
  ImageRowsWire r{d->job_id, rows, "", false, 0.0};
  SendInfo send{{3, ActorRole::kEncoder, 0}, 1, 0};
  auto f = encode_encoded_image(r, kRows, kEmbd, kEpoch, send);
  ASSERT_FALSE(f);
  EXPECT_EQ(f.error().code, code(WireErrc::kUnencodable));
  EXPECT_NE(f.error().message.find("value 5 of the rows is not finite"), std::string::npos)
      << f.error().message;
  // An answer the head cannot decode still names its job, so that the job ends with the reason.
  Bytes bad = mutate<schemas::EncodedImage>(good, [](auto root) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(root.getRows().getData().begin(), &nan, sizeof nan);
  });
  ASSERT_FALSE(decode_encoded_image(bad, encoded_limits()));
  uint64_t job = 0;
  ASSERT_TRUE(peek_encoded_image(bad, size_t{1} << 30, &job));
  EXPECT_EQ(job, d->job_id);
}

TEST(WireEncodedImage, AReceiptCarriesNeitherRowsNorAnError) {
  ImageRowsWire r;
  r.job_id = 9;
  r.accepted = true;
  SendInfo send{{3, ActorRole::kEncoder, 0}, 1, 0};
  auto f = encode_encoded_image(r, kRows, kEmbd, kEpoch, send);
  ASSERT_TRUE(f) << f.error().message;
  auto d = decode_encoded_image(f->flatten(), encoded_limits());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_TRUE(d->accepted);
  EXPECT_EQ(d->job_id, 9u);
  EXPECT_TRUE(d->rows.empty());
  EXPECT_TRUE(d->error.empty());
  // An answer with rows or an error is not a receipt, and a receipt with either is refused.
  auto full = decode_encoded_image(valid_encoded_image(), encoded_limits());
  ASSERT_TRUE(full);
  EXPECT_FALSE(full->accepted);
  Bytes both = mutate<schemas::EncodedImage>(valid_encoded_image(),
                                             [](auto root) { root.setAccepted(true); });
  expect_error(decode_encoded_image(both, encoded_limits()), wire(WireErrc::kInvalid),
               "EncodedImage: a receipt with rows or an error");
}

TEST(WireEncodedImage, RejectsRowsWithAnErrorAndNeitherRowsNorError) {
  Bytes both = mutate<schemas::EncodedImage>(
      valid_encoded_image(), [](auto root) { root.initError().setMessage("boom"); });
  expect_error(decode_encoded_image(both, encoded_limits()), wire(WireErrc::kInvalid),
               "EncodedImage: an error with rows, expected none");
  Bytes neither =
      mutate<schemas::EncodedImage>(valid_encoded_image(), [](auto root) { root.disownRows(); });
  expect_error(decode_encoded_image(neither, encoded_limits()), wire(WireErrc::kInvalid),
               "EncodedImage.rows: absent without an error");
  Bytes zero =
      mutate<schemas::EncodedImage>(valid_encoded_image(), [](auto root) { root.setJobId(0); });
  expect_error(decode_encoded_image(zero, encoded_limits()), wire(WireErrc::kInvalid),
               "EncodedImage.jobId: 0 is invalid");
}

TEST(WireEncodedImage, RejectsStaleEpoch) {
  EncodedImageLimits lim = encoded_limits();
  lim.expected_epoch = kEpoch + 1;
  expect_error(decode_encoded_image(valid_encoded_image(), lim), schema(schemas::Errc::kStaleEpoch),
               "EncodedImage.header: message from epoch 7, receiver is in epoch 8");
}

TEST(WireEncodedImage, PeekNamesTheSendingInstanceWithoutReadingRows) {
  auto h = peek_encoded_image(valid_encoded_image());
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(h->sender, kEncoderNode.sender);
  EXPECT_EQ(h->sender.index, 1u);
  EXPECT_EQ(h->cluster_epoch, kEpoch);
  // Rows it cannot decode do not matter to routing; the full decode refuses them later.
  Bytes nan = mutate<schemas::EncodedImage>(valid_encoded_image(), [](auto root) {
    const float bad = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(root.getRows().getData().begin(), &bad, sizeof(float));
  });
  h = peek_encoded_image(nan);
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(h->sender.index, 1u);
  h = peek_encoded_image(error_answer(true));
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(h->sender.index, 1u);
}

TEST(WireEncodedImage, PeekRefusesASenderThatIsNotAnEncoder) {
  const SendInfo stage{.sender = {.node = 3, .role = ActorRole::kStage, .index = 1}, .seq = 12};
  Bytes f = frame_of(encode_encoded_image(make_answer(), kRows, kEmbd, kEpoch, stage));
  expect_error(peek_encoded_image(f), wire(WireErrc::kInvalid),
               "EncodedImage.header: the sender is not an encoder");
  Bytes no_seq = mutate<schemas::EncodedImage>(valid_encoded_image(),
                                               [](auto root) { root.getHeader().setSeq(0); });
  expect_error(peek_encoded_image(no_seq), schema(schemas::Errc::kBadHeader),
               "header seq is unset");
  auto cut = valid_encoded_image();
  cut.resize(16);
  auto h = peek_encoded_image(cut);
  ASSERT_FALSE(h);
  EXPECT_FALSE(h.error().message.empty());
  h = peek_encoded_image(valid_encoded_image(), 64);  // over max_frame_bytes
  ASSERT_FALSE(h);
  EXPECT_FALSE(h.error().message.empty());
}

// ---- Byte flips: decoding must never crash (run under ASan) ----

TEST(WireImageFuzz, FlippedBytesNeverCrashTheDecoders) {
  flip_bytes(valid_encode_image(), 1000, 1,
             [](const Bytes& b) { return decode_encode_image(b, encode_limits()); });
  flip_bytes(valid_encoded_image(), 1000, 2,
             [](const Bytes& b) { return decode_encoded_image(b, encoded_limits()); });
  flip_bytes(error_answer(true), 1000, 3,
             [](const Bytes& b) { return decode_encoded_image(b, encoded_limits()); });
  flip_bytes(valid_encoded_image(), 1000, 4, [](const Bytes& b) { return peek_encoded_image(b); });
}

}  // namespace
}  // namespace troupe::actors::detail
