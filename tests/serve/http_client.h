// A minimal HTTP/1.1 client for the gateway's tests (tests/serve/): one request per connection
// over a plain POSIX socket, the answer read to its end (Content-Length, chunked, or close).
// Deliberately not Beast: the tests check the server's bytes with code that does not share it.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

namespace troupe::serve::testing {

struct HttpAnswer {
  int status = 0;                              // 0: no answer (connection failed)
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;                            // de-chunked
  /// The data: lines of a text/event-stream body, in order.
  std::vector<std::string> events() const {
    std::vector<std::string> out;
    size_t at = 0;
    while (at < body.size()) {
      size_t nl = body.find('\n', at);
      if (nl == std::string::npos) nl = body.size();
      const std::string line = body.substr(at, nl - at);
      if (line.rfind("data: ", 0) == 0) out.push_back(line.substr(6));
      at = nl + 1;
    }
    return out;
  }
};

inline int connect_loopback(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline bool send_all(int fd, const std::string& s) {
  size_t at = 0;
  while (at < s.size()) {
    const ssize_t n = ::send(fd, s.data() + at, s.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return false;
    at += static_cast<size_t>(n);
  }
  return true;
}

/// Reads until the server closes (or the socket's receive timeout), then closes `fd`.
inline std::string read_all(int fd) {
  std::string out;
  char buf[65536];
  while (true) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

/// Sends raw bytes and reads until the server closes.
inline std::string raw_exchange(uint16_t port, const std::string& request) {
  const int fd = connect_loopback(port);
  if (fd < 0) return "";
  send_all(fd, request);
  return read_all(fd);
}

inline HttpAnswer parse_answer(const std::string& raw) {
  HttpAnswer a;
  const size_t end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || end == std::string::npos) return a;
  a.status = std::stoi(raw.substr(9, 3));
  size_t at = raw.find("\r\n") + 2;
  while (at < end) {
    const size_t nl = raw.find("\r\n", at);
    const std::string line = raw.substr(at, nl - at);
    const size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string name = line.substr(0, colon);
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      size_t v = colon + 1;
      while (v < line.size() && line[v] == ' ') ++v;
      a.headers[name] = line.substr(v);
    }
    at = nl + 2;
  }
  std::string body = raw.substr(end + 4);
  if (a.headers["transfer-encoding"] == "chunked") {
    std::string out;
    size_t p = 0;
    while (p < body.size()) {
      const size_t nl = body.find("\r\n", p);
      if (nl == std::string::npos) break;
      const size_t len = std::stoul(body.substr(p, nl - p), nullptr, 16);
      if (len == 0) break;
      out += body.substr(nl + 2, len);
      p = nl + 2 + len + 2;
    }
    body = out;
  }
  a.body = body;
  return a;
}

/// A request's bytes, with "Connection: close"; `headers` are extra lines ("Name: value"); a POST
/// (or a body) is sent as JSON.
inline std::string request_text(const std::string& method, const std::string& target,
                                const std::string& body = "",
                                const std::vector<std::string>& headers = {}) {
  std::string req = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  for (const auto& h : headers) req += h + "\r\n";
  if (!body.empty() || method == "POST")
    req +=
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  return req + "\r\n" + body;
}

/// Sends `request` on a new connection; the socket to read the answer from, or -1.
inline int send_request(uint16_t port, const std::string& request) {
  const int fd = connect_loopback(port);
  if (fd >= 0 && !send_all(fd, request)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// One request, its answer read to the end.
inline HttpAnswer http(uint16_t port, const std::string& method, const std::string& target,
                       const std::string& body = "", const std::vector<std::string>& headers = {}) {
  return parse_answer(raw_exchange(port, request_text(method, target, body, headers)));
}

}  // namespace troupe::serve::testing
