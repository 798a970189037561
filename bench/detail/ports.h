// A loopback TCP port free a moment ago, for the bench tools that start node daemons (they bind
// it; losing the race shows as a start failure). Header-only.
#pragma once

#include <unistd.h>

#include <cstdint>

#include <netinet/in.h>
#include <sys/socket.h>

namespace troupe::bench {

/// The port, or 0 when none could be had.
inline uint16_t free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  return ok ? ntohs(a.sin_port) : 0;
}

}  // namespace troupe::bench
