// Helpers of the wire codec tests (wire_test.cc, wire_images_test.cc, control_wire_test.cc):
// breaking a valid frame on purpose and checking the error a decoder gives for it.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include "actors/detail/wire.h"
#include "schemas/errc.h"
#include "schemas/frame.h"

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "text: " << (text)

namespace troupe::actors::detail::testing {

using Bytes = std::vector<uint8_t>;

// Reads a valid frame into a builder, lets `edit` break it, and frames the result again.
template <class T, class Edit>
Bytes mutate(const Bytes& frame, Edit edit) {
  auto r = schemas::read_frame(frame, size_t{1} << 30);
  EXPECT_TRUE(r);
  capnp::MallocMessageBuilder mb;
  mb.setRoot((*r)->getRoot<T>());
  edit(mb.getRoot<T>());
  auto words = schemas::to_frame(mb);
  auto b = words.asBytes();
  return Bytes(b.begin(), b.end());
}

// The decoder failed with `code`, its one-line message containing `text`.
template <class T>
void expect_error(const Result<T>& r, int code, const std::string& text) {
  ASSERT_FALSE(r.has_value()) << "expected an error containing: " << text;
  EXPECT_EQ(r.error().code, code) << r.error().message;
  EXPECT_CONTAINS(r.error().message, text);
  EXPECT_EQ(r.error().message.find('\n'), std::string::npos) << "one line: " << r.error().message;
}

// Flips 1-4 random bytes of `valid` `iterations` times: decode must never crash (run under
// ASan), and every rejection is a one-line message; some flips must be rejected.
template <class Decode>
void flip_bytes(const Bytes& valid, int iterations, uint32_t seed, Decode decode) {
  std::mt19937 gen(seed);
  int accepted = 0;
  for (int it = 0; it < iterations; ++it) {
    Bytes frame = valid;
    const int flips = 1 + static_cast<int>(gen() % 4);
    for (int k = 0; k < flips; ++k)
      frame[gen() % frame.size()] ^= static_cast<uint8_t>(1 + gen() % 255);
    auto r = decode(frame);
    if (r) {
      ++accepted;  // a flip inside a payload or an unchecked field is still a valid message
    } else {
      EXPECT_FALSE(r.error().message.empty());
      EXPECT_EQ(r.error().message.find('\n'), std::string::npos) << r.error().message;
    }
  }
  EXPECT_LT(accepted, iterations);
}

inline int wire(WireErrc e) { return code(e); }
inline int schema(schemas::Errc e) { return schemas::code(e); }

}  // namespace troupe::actors::detail::testing
