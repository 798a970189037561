// Tests of actors/detail/link.h's name table: which link carries a node's messages when two
// nodes connected to each other at once, and what happens when links close.
#include "actors/detail/link.h"

#include <gtest/gtest.h>

namespace troupe::actors::detail {
namespace {

TEST(Link, TheFirstLinkToANodeCarriesItsMessages) {
  Link link(1);
  EXPECT_EQ(link.peer_of("node-b"), 0u);
  link.add_peer("node-b", 7);  // it connected here
  link.add_peer("node-b", 9);  // our own connect to it completed later
  link.add_peer("node-b", 7);  // told again: no change
  EXPECT_EQ(link.peer_of("node-b"), 7u);
  link.add_peer("node-c", 9);  // one link, two names (a node renamed on restart): both kept
  EXPECT_EQ(link.peer_of("node-c"), 9u);
}

TEST(Link, AStandbyLinkTakesOverWhenTheCarrierCloses) {
  Link link(1);
  link.add_peer("node-b", 7);
  link.add_peer("node-b", 9);
  link.add_peer("node-c", 4);
  link.drop_peer(9);  // the standby closes: nothing changes for senders
  EXPECT_EQ(link.peer_of("node-b"), 7u);
  link.add_peer("node-b", 9);
  link.drop_peer(7);  // the carrier closes: the standby takes over
  EXPECT_EQ(link.peer_of("node-b"), 9u);
  link.drop_peer(9);
  EXPECT_EQ(link.peer_of("node-b"), 0u);  // no link left
  EXPECT_EQ(link.peer_of("node-c"), 4u);  // other nodes untouched
  link.drop_peer(12345);                  // an unknown link: nothing happens
  EXPECT_EQ(link.peer_of("node-c"), 4u);
}

}  // namespace
}  // namespace troupe::actors::detail
