// Helpers of the wire codec tests (wire_test.cc, control_wire_test.cc): breaking a valid frame
// on purpose and checking the error a decoder gives for it.
#pragma once

#include <cstdint>
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

inline int wire(WireErrc e) { return code(e); }
inline int schema(schemas::Errc e) { return schemas::code(e); }

}  // namespace troupe::actors::detail::testing
