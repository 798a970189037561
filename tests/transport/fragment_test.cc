// Malformed data frames from an authenticated peer, sent raw (detail/testing.h): fragments out of
// sequence, past their message's end, of another message, a message that stops short, bad or
// truncated headers, forged keys, sizes over the limit. Each must be counted and dropped, logged
// where the transport logs, and leave the link working with no receive slot or buffer held
// (LevelDB's log_test.cc: one test per error path).
#include <chrono>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "tests/transport/transport_test_util.h"
#include "transport/detail/checksum.h"
#include "transport/detail/testing.h"

namespace troupe::transport {
namespace {

using namespace std::chrono_literals;
using detail::RawAm;
using detail::RawFrame;
using detail::TransportTesting;
using Protocol = RawFrame::Protocol;

constexpr size_t kMiB = size_t{1} << 20;
constexpr uint64_t kFollowUpType = 1000;

RawFrame frame(uint64_t type, size_t total_bytes, size_t offset, size_t payload_bytes,
               Protocol protocol = Protocol::kAuto) {
  RawFrame f;
  f.type = type;
  f.total_bytes = total_bytes;
  f.offset = offset;
  f.payload = pattern(payload_bytes, static_cast<uint32_t>(offset + 1));
  f.protocol = protocol;
  return f;
}

// A pair whose `a` sends raw frames to `b`, with b's stderr captured from the first frame on.
struct RawPair : Pair {
  bool capturing = false;
  std::string log;

  void send(const RawFrame& f) {
    if (!capturing) testing::internal::CaptureStderr();
    capturing = true;
    auto st = TransportTesting::send_raw_frame(*a, b_from_a, f);
    ASSERT_TRUE(st) << st.error().message;
  }
  LinkStats link() { return b->stats().links.at(0); }

  // The link still works after the bad frames: a small message and a 5 MiB one (fragments by
  // rendezvous, so receive slots must have come back) arrive intact and in order, and then
  // nothing is left in b's receive bookkeeping. Stops the stderr capture into `log`.
  void expect_link_still_works() {
    const size_t before = b_in.count();
    const auto small = pattern(100, 1), large = pattern(5 * kMiB, 2);
    ASSERT_TRUE(a->send(b_from_a, copy_message(kFollowUpType, small)));
    ASSERT_TRUE(a->send(b_from_a, copy_message(kFollowUpType + 1, large)));
    const bool arrived = b_in.wait_messages(before + 2);
    if (capturing) log = testing::internal::GetCapturedStderr();
    capturing = false;
    ASSERT_TRUE(arrived) << "the link stalled after the malformed frames; log:\n" << log;
    {
      std::lock_guard<std::mutex> lk(b_in.mu);
      ASSERT_EQ(b_in.msgs.size(), before + 2);
      EXPECT_EQ(b_in.msgs[before].type, kFollowUpType);
      EXPECT_TRUE(std::equal(small.begin(), small.end(), b_in.msgs[before].data().begin()));
      EXPECT_EQ(b_in.msgs[before + 1].type, kFollowUpType + 1);
      ASSERT_EQ(b_in.msgs[before + 1].size_bytes, large.size());
      EXPECT_TRUE(std::equal(large.begin(), large.end(), b_in.msgs[before + 1].data().begin()));
    }
    // A dropped fragment's receive may still finish after the delivery: wait for it, bounded.
    detail::ReceiveState s;
    for (int i = 0; i < 200; ++i) {
      s = TransportTesting::receive_state(*b);
      if (s.rndv_waiting + s.rndv_in_flight + s.rndv_bytes_in_flight + s.inbox_messages +
              s.assembling ==
          0)
        break;
      std::this_thread::sleep_for(10ms);
    }
    EXPECT_EQ(s.rndv_waiting, 0u);
    EXPECT_EQ(s.rndv_in_flight, 0u);
    EXPECT_EQ(s.rndv_bytes_in_flight, 0u);
    EXPECT_EQ(s.inbox_messages, 0u);
    EXPECT_EQ(s.assembling, 0u);
  }
  void expect_logged(const std::string& text) {
    EXPECT_NE(log.find(text), std::string::npos) << "log lacks '" << text << "':\n" << log;
  }
};

TEST(TransportFragments, RawWellFormedFragmentsAreDelivered) {
  // The control: raw frames as the transport itself sends them make one message, no count.
  RawPair p;
  p.start();
  const auto whole = pattern(2 * kMiB, 3);
  for (size_t off : {size_t{0}, kMiB}) {
    RawFrame f = frame(9, whole.size(), off, 0);
    f.payload.assign(whole.begin() + off, whole.begin() + off + kMiB);
    p.send(f);
  }
  ASSERT_TRUE(p.b_in.wait_messages(1));
  EXPECT_EQ(p.b_in.msgs[0].type, 9u);
  EXPECT_TRUE(std::equal(whole.begin(), whole.end(), p.b_in.msgs[0].data().begin()));
  p.expect_link_still_works();
  EXPECT_EQ(p.link().malformed, 0u);
  EXPECT_EQ(p.link().messages_received, 3u);
}

// A fragmented message whose checksum follows in a trailer (as the transport sends them):
// fragments with sum 1, the last with 2, then a header-only trailer with the sum.
struct Trailed {
  std::vector<uint8_t> whole = pattern(2 * kMiB, 5);
  void send_fragments(RawPair& p, uint64_t type = 9) const {
    for (size_t off : {size_t{0}, kMiB}) {
      RawFrame f = frame(type, whole.size(), off, 0);
      f.payload.assign(whole.begin() + off, whole.begin() + off + kMiB);
      f.sum = off == 0 ? 1 : 2;
      p.send(f);
    }
  }
  RawFrame trailer(uint64_t type = 9) const {
    RawFrame t = frame(type, whole.size(), whole.size(), 0, Protocol::kEager);
    t.am = RawAm::kSum;
    t.sum = detail::checksum(whole) | 1;
    return t;
  }
};

TEST(TransportFragments, MessageWaitsForItsChecksumTrailerThenIsDelivered) {
  RawPair p;
  p.start();
  Trailed m;
  m.send_fragments(p);
  // Every byte is there, but not the sum: nothing may be delivered yet.
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(p.b_in.count(), 0u);
  EXPECT_EQ(TransportTesting::receive_state(*p.b).inbox_messages, 1u);
  p.send(m.trailer());
  ASSERT_TRUE(p.b_in.wait_messages(1));
  EXPECT_EQ(p.b_in.msgs[0].type, 9u);
  EXPECT_TRUE(std::equal(m.whole.begin(), m.whole.end(), p.b_in.msgs[0].data().begin()));
  p.expect_link_still_works();
  EXPECT_EQ(p.link().malformed, 0u);
  EXPECT_EQ(p.link().corrupted, 0u);
}

TEST(TransportFragments, TrailerWithAnotherSumDropsItsMessageAsCorrupted) {
  RawPair p;
  p.start();
  Trailed m;
  m.send_fragments(p);
  RawFrame t = m.trailer();
  t.sum ^= 2;  // still odd, not the sum
  p.send(t);
  p.expect_link_still_works();
  EXPECT_EQ(p.link().corrupted, 1u);
  EXPECT_EQ(p.link().messages_received, 2u);  // the follow-ups only
  p.expect_logged("message (type 9, 2097152 bytes): payload checksum mismatch");
}

TEST(TransportFragments, TrailerForNoMessageIsMalformed) {
  RawPair p;
  p.start();
  p.send(Trailed{}.trailer());
  p.expect_link_still_works();
  EXPECT_EQ(p.link().malformed, 1u);
  EXPECT_EQ(p.link().messages_received, 2u);
  p.expect_logged("checksum trailer (type 9, 2097152 bytes) for no message waiting for one");
}

TEST(TransportFragments, TrailerThatDoesNotMatchItsMessageDropsIt) {
  RawPair p;
  p.start();
  Trailed m;
  m.send_fragments(p);
  p.send(m.trailer(/*type=*/10));
  p.expect_link_still_works();
  EXPECT_EQ(p.link().malformed, 1u);
  EXPECT_EQ(p.link().messages_received, 2u);
  p.expect_logged("message (type 9, 2097152 bytes): its checksum trailer did not match it");
}

TEST(TransportFragments, FragmentWithoutItsStartIsDropped) {
  RawPair p;
  p.start();
  p.send(frame(9, 2 * kMiB, kMiB, kMiB));                  // rendezvous
  p.send(frame(9, 64, 8, 8, Protocol::kEager));            // eager
  p.send(frame(9, 2 * kMiB, kMiB, 64, Protocol::kEager));  // eager, short
  p.expect_link_still_works();
  EXPECT_EQ(p.link().malformed, 3u);
  EXPECT_EQ(p.link().messages_received, 2u);  // the follow-ups only
  p.expect_logged("fragment out of sequence (type 9, offset 1048576 of 2097152 bytes)");
  p.expect_logged("fragment out of sequence (type 9, offset 8 of 64 bytes)");
  p.expect_logged("from 'node-a'");
}

// A fragment that does not continue the message in progress is dropped, and so is that message:
// the stray fragment counts once, the message it broke once.
void expect_sequence_broken(const RawFrame& second) {
  RawPair p;
  p.start();
  p.send(frame(9, 3 * kMiB, 0, kMiB));
  p.send(second);
  p.expect_link_still_works();
  EXPECT_EQ(p.link().malformed, 2u);
  EXPECT_EQ(p.link().messages_received, 2u);
  p.expect_logged("fragment out of sequence (type " + std::to_string(second.type) + ", offset " +
                  std::to_string(second.offset) + " of " + std::to_string(second.total_bytes) +
                  " bytes)");
  p.expect_logged("message (type 9, 3145728 bytes): a fragment out of sequence interrupted it");
}

TEST(TransportFragments, FragmentThatSkipsAheadBreaksItsMessage) {
  expect_sequence_broken(frame(9, 3 * kMiB, 2 * kMiB, kMiB));
}

TEST(TransportFragments, FragmentThatGoesBackBreaksItsMessage) {
  expect_sequence_broken(frame(9, 3 * kMiB, 8, kMiB, Protocol::kEager));
}

TEST(TransportFragments, FragmentOfAnotherTypeBreaksTheMessage) {
  expect_sequence_broken(frame(10, 3 * kMiB, kMiB, kMiB));
}

TEST(TransportFragments, FragmentOfAnotherSizeBreaksTheMessage) {
  expect_sequence_broken(frame(9, 4 * kMiB, kMiB, kMiB));
}

TEST(TransportFragments, FragmentPastTheAnnouncedEndDropsItsMessage) {
  RawPair p;
  p.start();
  p.send(frame(9, 3 * kMiB / 2, 0, kMiB));
  p.send(frame(9, 3 * kMiB / 2, kMiB, kMiB));  // 512 KiB too long
  p.expect_link_still_works();
  EXPECT_EQ(p.link().malformed, 1u);
  EXPECT_EQ(p.link().messages_received, 2u);
  p.expect_logged("message (type 9, 1572864 bytes): a fragment past its end");
}

TEST(TransportFragments, SingleFragmentLongerThanItsTotalIsDropped) {
  RawPair p;
  p.start();
  p.send(frame(9, 100, 0, 200, Protocol::kEager));
  p.send(frame(11, 100, 0, 200 * 1024, Protocol::kRendezvous));
  p.expect_link_still_works();
  EXPECT_EQ(p.link().malformed, 2u);
  p.expect_logged("message (type 9, 100 bytes): a fragment past its end");
  p.expect_logged("message (type 11, 100 bytes): a fragment past its end");
}

TEST(TransportFragments, MessageThatStopsShortIsDroppedWhenTheNextBegins) {
  RawPair p;
  p.start();
  p.send(frame(9, 3 * kMiB, 0, kMiB));
  p.send(frame(9, 3 * kMiB, kMiB, kMiB));  // the last fragment never comes
  p.expect_link_still_works();
  EXPECT_EQ(p.link().malformed, 1u);
  EXPECT_EQ(p.link().messages_received, 2u);
  p.expect_logged("message (type 9, 3145728 bytes): it stopped short: the next message began");
}

TEST(TransportFragments, TotalOverTheLimitIsCountedOnceAsOversized) {
  auto bo = options("node-b");
  bo.max_message_bytes = 6 * kMiB;
  RawPair p;
  p.start(options("node-a"), bo);
  p.send(frame(9, 6 * kMiB + 8, 0, kMiB));
  p.send(frame(9, 6 * kMiB + 8, kMiB, kMiB));  // the rest of it: dropped, not counted again
  p.send(frame(9, UINT64_MAX, 0, 64, Protocol::kEager));
  p.expect_link_still_works();
  EXPECT_EQ(p.link().oversized, 2u);
  EXPECT_EQ(p.link().malformed, 0u);
  EXPECT_EQ(p.link().messages_received, 2u);
}

TEST(TransportFragments, BadMagicOrVersionOnTheLinkIsMalformed) {
  RawPair p;
  p.start();
  RawFrame bad_magic = frame(9, 64, 0, 64, Protocol::kEager);
  bad_magic.magic = 0x12345678;
  RawFrame old_version = frame(9, 64, 0, 64, Protocol::kEager);
  old_version.version = 4;
  RawFrame rndv_version = frame(9, kMiB, 0, kMiB, Protocol::kRendezvous);
  rndv_version.version = 99;  // a future one
  for (const auto& f : {bad_magic, old_version, rndv_version}) p.send(f);
  p.expect_link_still_works();
  EXPECT_EQ(p.link().malformed, 3u);
  EXPECT_EQ(p.b->stats().unauthenticated_dropped, 0u);
  p.expect_logged("bad frame header (56 bytes)");
}

TEST(TransportFragments, TruncatedOrLongHeaderThatNamesTheLinkIsMalformed) {
  RawPair p;
  p.start();
  RawFrame truncated = frame(9, 64, 0, 64, Protocol::kEager);
  truncated.header_bytes = 40;  // up to the key: the link is known, the sizes are not
  RawFrame longer = frame(9, 64, 0, 64, Protocol::kEager);
  longer.header_bytes = 64;
  p.send(truncated);
  p.send(longer);
  p.expect_link_still_works();
  EXPECT_EQ(p.link().malformed, 2u);
  p.expect_logged("bad frame header (40 bytes)");
  p.expect_logged("bad frame header (64 bytes)");
}

TEST(TransportFragments, HeaderTooShortToNameALinkIsUnauthenticated) {
  RawPair p;
  p.start();
  RawFrame f = frame(9, 64, 0, 64, Protocol::kEager);
  for (size_t n : {size_t{0}, size_t{8}, size_t{39}}) {
    f.header_bytes = n;
    p.send(f);
  }
  p.expect_link_still_works();
  EXPECT_EQ(p.b->stats().unauthenticated_dropped, 3u);
  EXPECT_EQ(p.link().malformed, 0u);
}

TEST(TransportFragments, ForgedKeyIsUnauthenticatedNotTheLinks) {
  RawPair p;
  p.start();
  RawFrame f = frame(9, kMiB, 0, kMiB);
  f.key = 0x0123456789abcdef;
  p.send(f);
  f.payload.resize(64);
  f.total_bytes = 64;
  p.send(f);
  p.expect_link_still_works();
  EXPECT_EQ(p.b->stats().unauthenticated_dropped, 2u);
  EXPECT_EQ(p.link().malformed, 0u);
  EXPECT_EQ(p.link().messages_received, 2u);
}

TEST(TransportFragments, ManyMalformedFramesAreCountedButLoggedRateLimited) {
  RawPair p;
  p.start();
  constexpr int kFrames = 30;
  for (int i = 0; i < kFrames; ++i) p.send(frame(9, 64, 8, 8, Protocol::kEager));
  p.expect_link_still_works();
  EXPECT_EQ(p.link().malformed, static_cast<uint64_t>(kFrames));
  size_t lines = 0;
  for (size_t at = 0; (at = p.log.find("fragment out of sequence", at)) != std::string::npos; ++at)
    ++lines;
  EXPECT_EQ(lines, 8u);  // the first 8; the next is the 1000th
}

}  // namespace
}  // namespace troupe::transport
