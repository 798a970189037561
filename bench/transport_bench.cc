// transport_bench: transport::Transport between two processes on 127.0.0.1 (this binary re-runs
// itself with --serve as the echo/sink server), side by side with ucx_perftest's UCP
// active-message tests (ucp_am_lat, ucp_am_bw) on the same UCX transports and sizes.
// Usage: transport_bench [--reps N] [--configs tcp,shm,shm+peer,pull] [--no-perftest] [--quick] ...
// (--help lists every flag). Prints markdown tables: ours, perftest's, and their ratio.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <sys/wait.h>

#include "bench/detail/args.h"
#include "bench/detail/transport_bench_procs.h"
#include "transport/transport.h"

namespace {

namespace tp = troupe::transport;
using namespace troupe::bench;

constexpr const char* kTool = "transport_bench";

// Message types of the bench protocol (client -> server unless noted).
constexpr uint64_t kPing = 0x7462'0001;     // echoed back as is
constexpr uint64_t kBwStart = 0x7462'0002;  // {total, ack_every}: resets the sink's counters,
                                            // answered by a kBwAck {0, 0, cpu_ns}
constexpr uint64_t kBwData = 0x7462'0003;   // counted, then dropped
// server -> client: {messages, bytes} so far and the server's process CPU time (ns)
constexpr uint64_t kBwAck = 0x7462'0004;
constexpr const char* kToken = "transport-bench-token";

// One way of linking the two processes: our options and perftest's equivalent.
struct LinkConfig {
  const char* name;
  const char* tls;  // TransportOptions::tls and UCX_TLS for perftest
  tp::ErrorMode mode;
  bool perftest_err;  // perftest -e (endpoints with error handling, i.e. PEER)
  bool pull = false;  // TransportOptions::same_host_pull (the two processes share this host)
  const char* perftest_tls = nullptr;  // UCX_TLS for perftest when not `tls`
};
constexpr LinkConfig kConfigs[] = {
    {"tcp", "tcp", tp::ErrorMode::kPeer, true},
    {"shm", "shm,tcp,self", tp::ErrorMode::kNone, false},      // NONE: shared memory allowed
    {"shm+peer", "shm,tcp,self", tp::ErrorMode::kPeer, true},  // PEER (the default) excludes shm
    // The default between daemons of one host: TCP with PEER, large messages by same-host pull;
    // against perftest over UCX's shared memory without error handling (its fastest, unsafe).
    {"pull", "tcp", tp::ErrorMode::kPeer, false, true, "shm,tcp,self"},
};

struct Flags {
  int reps = 5;  // latency repetitions (bandwidth: reps / 2 + 1, at least 3)
  int lat_round_trips = 2000;
  double bw_scale = 1.0;              // multiplies the bytes streamed per bandwidth run
  uint64_t window_bytes = 64u << 20;  // bandwidth: at most this much unacknowledged
  bool perftest = true;
  std::string perftest_path = "ucx_perftest";
  std::vector<std::string> configs = {"tcp", "shm"};
  int spin_us = 200;   // latency: the busy-poll setting compared with spin=0
  int bw_spin_us = 0;  // bandwidth: the transport's default (sleep on the event fd)
  bool latency = true, bandwidth = true;  // --only lat|bw
  std::vector<size_t> lat_sizes = {8, 64, 1024, 4096, 65536};
  std::vector<size_t> bw_sizes = {8,      32,     128,      512,      2048,      8192,     32768,
                                  131072, 524288, 1u << 20, 4u << 20, 16u << 20, 64u << 20};
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string size_str(size_t n) {
  if (n >= (1u << 20) && n % (1u << 20) == 0) return std::to_string(n >> 20) + " MiB";
  if (n >= 1024 && n % 1024 == 0) return std::to_string(n >> 10) + " KiB";
  return std::to_string(n) + " B";
}

tp::TransportOptions link_options(const LinkConfig& c, const std::string& name, int spin_us,
                                  bool listen) {
  tp::TransportOptions o;
  o.node_name = name;
  o.cluster_token = kToken;
  o.listen_host = listen ? "127.0.0.1" : "";
  o.tls = c.tls;
  o.net_devices = "lo";  // else UCX adds a rail over eth0 (DEPENDENCIES.md §4)
  o.error_mode = c.mode;
  o.same_host_pull = c.pull;
  o.spin = std::chrono::microseconds(spin_us);
  // env: TROUPE_BENCH_NO_CHECKSUM=1 — measure without payload checksums (both processes see it).
  const char* nc = std::getenv("TROUPE_BENCH_NO_CHECKSUM");
  o.checksum_payloads = !(nc && std::string(nc) == "1");
  // env: TROUPE_BENCH_POLL_US=N — TransportOptions::poll_in_flight in both processes (0: sleep
  // at once, as the transport did before it polled during transfers).
  if (const char* poll = std::getenv("TROUPE_BENCH_POLL_US"))
    o.poll_in_flight = std::chrono::microseconds(std::atoi(poll));
  return o;
}

// --- the server (--serve): echoes pings, counts streamed data and acknowledges it -------------

// CPU time (user + system) of this whole process so far, in ns: both the transport's progress
// thread and the caller's, so that a run's cost per message does not depend on other jobs.
uint64_t process_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

struct Sink {
  uint64_t total = 0, ack_every = 1, messages = 0, bytes = 0;
};

void send_words(tp::Transport& t, tp::PeerId peer, uint64_t type, std::vector<uint64_t> v) {
  (void)t.send(peer, tp::copy_message(type, {reinterpret_cast<const uint8_t*>(v.data()),
                                             v.size() * sizeof(uint64_t)}));
}

int serve(const LinkConfig& c, int spin_us) {
  tp::Transport* self = nullptr;
  Sink sink;  // progress thread only
  auto handler = [&](tp::Message&& m) {
    if (m.type == kPing) {
      tp::OutMessage out;  // zero copy: the reply points into the received storage
      out.type = kPing;
      out.parts.push_back(m.data());
      out.keep_alive = m.storage;
      (void)self->send(m.peer, std::move(out));
    } else if (m.type == kBwStart && m.size_bytes == 16) {
      sink = Sink{m.storage[0], std::max<uint64_t>(1, m.storage[1]), 0, 0};
      send_words(*self, m.peer, kBwAck, {0, 0, process_cpu_ns()});
    } else if (m.type == kBwData) {
      ++sink.messages;
      sink.bytes += m.size_bytes;
      if (sink.messages % sink.ack_every == 0 || sink.messages == sink.total)
        send_words(*self, m.peer, kBwAck, {sink.messages, sink.bytes, process_cpu_ns()});
    }
  };
  auto t = tp::Transport::start(link_options(c, "bench-server", spin_us, true), handler);
  if (!t) {
    std::fprintf(stderr, "transport_bench --serve: %s\n", t.error().message.c_str());
    return 1;
  }
  self = t->get();
  std::printf("PORT %u\n", static_cast<unsigned>((*t)->port()));
  std::fflush(stdout);
  char buf[64];
  while (read(STDIN_FILENO, buf, sizeof(buf)) > 0) {
  }  // until the parent closes our stdin (or dies)
  return 0;
}

// --- the client -------------------------------------------------------------------------------

// The bandwidth test's source buffer, filled with `fill`. From 1 MiB up it is 2 MiB-aligned with
// transparent huge pages asked for, like ucx_perftest's (UCX maps it): over shared memory the
// receiver's kernel pins the sender's pages for every message, and 4 KiB pages made that pinning
// cost a fifth of the receiver's time.
std::shared_ptr<uint8_t[]> send_buffer(size_t size, uint8_t fill) {
  constexpr size_t kHuge = size_t{2} << 20;
  uint8_t* p = nullptr;
  if (size >= (size_t{1} << 20)) {
    const size_t rounded = (size + kHuge - 1) / kHuge * kHuge;
    p = static_cast<uint8_t*>(std::aligned_alloc(kHuge, rounded));
    if (p) madvise(p, rounded, MADV_HUGEPAGE);
  } else {
    p = static_cast<uint8_t*>(std::malloc(std::max<size_t>(size, 1)));
  }
  if (!p) return nullptr;
  std::memset(p, fill, size);
  return std::shared_ptr<uint8_t[]>(p, [](uint8_t* q) { std::free(q); });
}

// The client's side of one link: a transport connected to a fresh server process.
class Link {
 public:
  // Starts a server process and connects to it; nullptr (and *err) on failure.
  static std::unique_ptr<Link> open(const LinkConfig& c, int spin_us, std::string* err);
  ~Link();
  // One-way latency (round trip / 2) in us: {p50 of all round trips, median of the reps' means}.
  std::optional<std::pair<double, double>> latency(size_t size, int reps, int round_trips);
  // Medians over `reps` runs of `count` messages of `size` bytes.
  struct Bandwidth {
    double bytes_s = 0;
    double send_cpu_us = 0, recv_cpu_us = 0;  // CPU per message, each process as a whole
  };
  std::optional<Bandwidth> bandwidth(size_t size, uint64_t count, int reps, uint64_t window_bytes);

 private:
  void on_message(tp::Message&& m);
  bool wait(std::unique_lock<std::mutex>& lk, const std::function<bool()>& pred);

  Child server_;
  std::unique_ptr<tp::Transport> t_;
  tp::PeerId peer_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  // Latency state (written by the progress thread while a run is on).
  std::shared_ptr<std::vector<uint8_t>> ping_;
  int pings_left_ = 0;
  Clock::time_point ping_sent_;
  std::vector<double> rtt_us_;
  // Bandwidth state.
  uint64_t acked_ = 0, acked_bytes_ = 0, acked_cpu_ns_ = 0;
  uint64_t num_acks_ = 0;
};

std::unique_ptr<Link> Link::open(const LinkConfig& c, int spin_us, std::string* err) {
  const std::vector<std::string> argv = {"/proc/self/exe", "--serve", c.name, "--spin-us",
                                         std::to_string(spin_us)};
  auto child = spawn(argv, {}, /*pipe_stdin=*/true);
  if (!child) {
    *err = "cannot start the server process";
    return nullptr;
  }
  auto link = std::make_unique<Link>();
  link->server_ = *child;
  std::string out;
  const bool ok = read_until(
      link->server_, &out, [](const std::string& s) { return s.find('\n') != std::string::npos; },
      Clock::now() + 20s);
  unsigned port = 0;
  if (!ok || std::sscanf(out.c_str(), "PORT %u", &port) != 1 || port == 0) {
    *err = "the server process did not start (see its error above)";
    return nullptr;
  }
  auto t = tp::Transport::start(link_options(c, "bench-client", spin_us, false),
                                [l = link.get()](tp::Message&& m) { l->on_message(std::move(m)); });
  if (!t) {
    *err = t.error().message;
    return nullptr;
  }
  link->t_ = std::move(*t);
  auto p = link->t_->connect("127.0.0.1", static_cast<uint16_t>(port), 10s);
  if (!p) {
    *err = p.error().message;
    return nullptr;
  }
  link->peer_ = *p;
  return link;
}

Link::~Link() {
  t_.reset();
  if (server_.pid > 0) finish(server_, Clock::now() + 10s);
}

void Link::on_message(tp::Message&& m) {
  if (m.type == kPing) {
    const auto now = Clock::now();
    std::lock_guard<std::mutex> lk(mu_);
    rtt_us_.push_back(std::chrono::duration<double, std::micro>(now - ping_sent_).count());
    if (--pings_left_ > 0) {
      tp::OutMessage out;
      out.type = kPing;
      out.parts.push_back({ping_->data(), ping_->size()});
      out.keep_alive = ping_;
      ping_sent_ = Clock::now();
      (void)t_->send(peer_, std::move(out));
    } else {
      cv_.notify_all();
    }
  } else if (m.type == kBwAck && m.size_bytes == 24) {
    std::lock_guard<std::mutex> lk(mu_);
    acked_ = m.storage[0];
    acked_bytes_ = m.storage[1];
    acked_cpu_ns_ = m.storage[2];
    ++num_acks_;
    cv_.notify_all();
  }
}

bool Link::wait(std::unique_lock<std::mutex>& lk, const std::function<bool()>& pred) {
  if (cv_.wait_for(lk, 60s, pred)) return true;
  std::fprintf(stderr, "transport_bench: no answer from the server within 60 s\n");
  return false;
}

std::optional<std::pair<double, double>> Link::latency(size_t size, int reps, int round_trips) {
  ping_ = std::make_shared<std::vector<uint8_t>>(size, uint8_t{0x5a});
  std::vector<double> all, means;
  for (int r = -1; r < reps; ++r) {  // r = -1: warm-up
    std::unique_lock<std::mutex> lk(mu_);
    rtt_us_.clear();
    pings_left_ = r < 0 ? std::max(50, round_trips / 10) : round_trips;
    const auto t0 = Clock::now();
    ping_sent_ = t0;
    tp::OutMessage out;
    out.type = kPing;
    out.parts.push_back({ping_->data(), ping_->size()});
    out.keep_alive = ping_;
    if (!t_->send(peer_, std::move(out))) return std::nullopt;
    if (!wait(lk, [&] { return pings_left_ == 0; })) return std::nullopt;
    if (r < 0) continue;
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    means.push_back(us / round_trips / 2);
    for (double v : rtt_us_) all.push_back(v / 2);
  }
  return std::make_pair(median(all), median(means));
}

std::optional<Link::Bandwidth> Link::bandwidth(size_t size, uint64_t count, int reps,
                                               uint64_t window_bytes) {
  auto data = send_buffer(size, uint8_t{0xa5});
  if (!data) return std::nullopt;
  // Window: keep up to window_bytes (2..1024 messages) queued, acknowledged every quarter of it.
  const uint64_t window = std::clamp<uint64_t>(window_bytes / size, 2, 1024);
  const uint64_t ack_every = std::max<uint64_t>(1, window / 4);
  std::vector<double> rates, send_cpu, recv_cpu;
  // r = -1: a warm-up, as perftest's -w: the receiver's first messages of a size fault in its
  // pooled buffers (several 64 MiB at ~1 GB/s here), which only the first run should pay.
  for (int r = -1; r < reps; ++r) {
    uint64_t recv_cpu0 = 0;
    {
      // The server answers the start with its CPU time: wait for it, so that what the server
      // spends on this run is measured from here (its handler may run late in a burst).
      std::unique_lock<std::mutex> lk(mu_);
      acked_ = acked_bytes_ = acked_cpu_ns_ = num_acks_ = 0;
      send_words(*t_, peer_, kBwStart, {count, ack_every});
      if (!wait(lk, [&] { return num_acks_ > 0; })) return std::nullopt;
      recv_cpu0 = acked_cpu_ns_;
    }
    const auto t0 = Clock::now();
    const uint64_t cpu0 = process_cpu_ns();
    for (uint64_t sent = 0; sent < count; ++sent) {
      {
        std::unique_lock<std::mutex> lk(mu_);
        if (sent - acked_ >= window && !wait(lk, [&] { return sent - acked_ < window; }))
          return std::nullopt;
      }
      tp::OutMessage out;
      out.type = kBwData;
      out.parts.push_back({data.get(), size});
      out.keep_alive = data;
      if (!t_->send(peer_, std::move(out))) return std::nullopt;
    }
    std::unique_lock<std::mutex> lk(mu_);
    if (!wait(lk, [&] { return acked_ == count; })) return std::nullopt;
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r < 0) continue;
    send_cpu.push_back(static_cast<double>(process_cpu_ns() - cpu0) / 1e3 / count);
    recv_cpu.push_back(static_cast<double>(acked_cpu_ns_ - recv_cpu0) / 1e3 / count);
    if (acked_bytes_ != count * size)
      std::fprintf(stderr, "transport_bench: server counted %llu bytes, expected %llu\n",
                   static_cast<unsigned long long>(acked_bytes_),
                   static_cast<unsigned long long>(count * size));
    rates.push_back(static_cast<double>(count * size) / s);
  }
  return Bandwidth{median(rates), median(send_cpu), median(recv_cpu)};
}

// --- the tables -------------------------------------------------------------------------------

std::string ratio_str(std::optional<double> num, std::optional<double> den) {
  if (!num || !den || *den <= 0) return "-";
  char b[32];
  std::snprintf(b, sizeof(b), "%.2f", *num / *den);
  return b;
}

std::string num_str(std::optional<double> v, const char* fmt) {
  if (!v) return "-";
  char b[32];
  std::snprintf(b, sizeof(b), fmt, *v);
  return b;
}

// Bytes/s as MB/s, with 3 significant digits.
std::string mb_str(std::optional<double> bytes_s) {
  if (!bytes_s) return "-";
  const double mb = *bytes_s / 1e6;
  char b[32];
  std::snprintf(b, sizeof(b), mb >= 100 ? "%.0f" : mb >= 10 ? "%.1f" : "%.2f", mb);
  return b;
}

void latency_table(const LinkConfig& c, const Flags& f, Perftest* pt) {
  std::printf("\n[%s] latency, one-way us (round trip / 2); ours: %d reps x %d round trips\n",
              c.name, f.reps, f.lat_round_trips);
  std::printf(
      "| size | ours spin=0 p50 | (mean) | ours spin=%dus p50 | (mean) | perftest p50 | "
      "(avg) | spin/perftest p50 |\n|---|---|---|---|---|---|---|---|\n",
      f.spin_us);
  std::vector<std::vector<std::optional<std::pair<double, double>>>> ours(2);
  for (int s = 0; s < 2; ++s) {
    std::string err;
    auto l = Link::open(c, s == 0 ? 0 : f.spin_us, &err);
    if (!l) {
      std::printf("cannot open the link: %s\n", err.c_str());
      return;
    }
    for (size_t size : f.lat_sizes) ours[s].push_back(l->latency(size, f.reps, f.lat_round_trips));
  }
  for (size_t i = 0; i < f.lat_sizes.size(); ++i) {
    std::optional<PerftestResult> p;
    if (pt)
      p = pt->run(c.perftest_tls ? c.perftest_tls : c.tls, c.perftest_err, "ucp_am_lat",
                  f.lat_sizes[i], 10 * f.lat_round_trips);
    auto first = [](auto& o) { return o ? std::optional<double>(o->first) : std::nullopt; };
    auto second = [](auto& o) { return o ? std::optional<double>(o->second) : std::nullopt; };
    const auto pp50 = p ? std::optional<double>(p->lat_p50_us) : std::nullopt;
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s |\n", size_str(f.lat_sizes[i]).c_str(),
                num_str(first(ours[0][i]), "%.1f").c_str(),
                num_str(second(ours[0][i]), "%.1f").c_str(),
                num_str(first(ours[1][i]), "%.1f").c_str(),
                num_str(second(ours[1][i]), "%.1f").c_str(), num_str(pp50, "%.1f").c_str(),
                num_str(p ? std::optional<double>(p->lat_avg_us) : std::nullopt, "%.1f").c_str(),
                ratio_str(first(ours[1][i]), pp50).c_str());
    std::fflush(stdout);
  }
}

void bandwidth_table(const LinkConfig& c, const Flags& f, Perftest* pt, int spin_us) {
  const int reps = std::max(3, f.reps / 2 + 1);
  std::printf(
      "\n[%s] bandwidth, one-way streaming, MB/s (1e6); ours: spin=%dus, poll_in_flight=%lldus, "
      "median of %d\n",
      c.name, spin_us,
      static_cast<long long>(link_options(c, "x", spin_us, false).poll_in_flight.count()), reps);
  std::printf(
      "| size | ours | perftest | ours/perftest | target (>= 90%% at >= 1 MiB) | "
      "ours us/msg | CPU us/msg sender | receiver |\n"
      "|---|---|---|---|---|---|---|---|\n");
  std::string err;
  auto l = Link::open(c, spin_us, &err);
  if (!l) {
    std::printf("cannot open the link: %s\n", err.c_str());
    return;
  }
  for (size_t size : f.bw_sizes) {
    // ~64 MiB per run (at least 4 and at most 100k messages) keeps a run under ~0.1-0.5 s.
    const auto bytes = static_cast<uint64_t>(f.bw_scale * (64u << 20));
    const uint64_t count = std::clamp<uint64_t>(bytes / size, 4, 100000);
    const auto bw = l->bandwidth(size, count, reps, f.window_bytes);
    const auto ours = bw ? std::optional<double>(bw->bytes_s) : std::nullopt;
    std::optional<PerftestResult> p;
    if (pt)
      p = pt->run(c.perftest_tls ? c.perftest_tls : c.tls, c.perftest_err, "ucp_am_bw", size,
                  std::max<uint64_t>(count, 8));
    const auto pbw = p ? std::optional<double>(p->bw_bytes_s) : std::nullopt;
    std::string verdict = "";
    if (size >= (1u << 20) && ours && pbw) verdict = *ours >= 0.9 * *pbw ? "met" : "BELOW";
    auto cpu = [&](double Link::Bandwidth::*field) {
      return num_str(bw ? std::optional<double>((*bw).*field) : std::nullopt, "%.1f");
    };
    const auto wall_us =
        ours ? std::optional<double>(static_cast<double>(size) / *ours * 1e6) : std::nullopt;
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s |\n", size_str(size).c_str(),
                mb_str(ours).c_str(), mb_str(pbw).c_str(), ratio_str(ours, pbw).c_str(),
                verdict.c_str(), num_str(wall_us, "%.1f").c_str(),
                cpu(&Link::Bandwidth::send_cpu_us).c_str(),
                cpu(&Link::Bandwidth::recv_cpu_us).c_str());
    std::fflush(stdout);
  }
}

const LinkConfig* find_config(const std::string& name) {
  for (const auto& c : kConfigs)
    if (name == c.name) return &c;
  return nullptr;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string w; std::getline(in, w, ',');)
    if (!w.empty()) out.push_back(w);
  return out;
}

// "8,64K,1M" -> bytes; an empty list on a bad entry.
std::vector<size_t> parse_sizes(const std::string& s) {
  std::vector<size_t> out;
  for (const auto& w : split(s)) {
    char* end = nullptr;
    size_t v = std::strtoull(w.c_str(), &end, 10);
    if (*end == 'K' || *end == 'k') v <<= 10, ++end;
    if (*end == 'M' || *end == 'm') v <<= 20, ++end;
    if (*end != '\0' || v == 0 || v > (1u << 30)) return {};
    out.push_back(v);
  }
  return out;
}

void print_header(const Flags& f, bool perftest) {
#ifdef NDEBUG
  const char* build = "release (NDEBUG)";
#else
  const char* build = "DEBUG (asserts on): numbers are not representative";
#endif
  std::string cpu = run_capture("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2");
  std::string ucx = run_capture("ucx_info -v 2>/dev/null | head -1");
  std::string load = run_capture("cut -d' ' -f1-3 /proc/loadavg");
  for (auto* s : {&cpu, &ucx, &load})
    while (!s->empty() && (s->back() == '\n' || s->front() == ' '))
      s->back() == '\n' ? s->pop_back() : (void)s->erase(0, 1);
  std::printf(
      "transport_bench: troupe transport (UCP active messages) vs ucx_perftest, "
      "127.0.0.1, UCX_NET_DEVICES=lo; build %s\n",
      build);
  std::printf("machine: %u cores (%s), load average %s; UCX: %s\n",
              std::thread::hardware_concurrency(), cpu.c_str(), load.c_str(),
              ucx.empty() ? "ucx_info not found" : ucx.c_str());
  if (perftest)
    std::printf(
        "perftest: %s, tests ucp_am_lat / ucp_am_bw (UCP active messages, polling); "
        "'-e' (error handling) where our error mode is PEER\n",
        f.perftest_path.c_str());
  else
    std::printf("perftest: not run (%s); our numbers only\n",
                f.perftest ? "ucx_perftest not found: install ucx-utils" : "--no-perftest");
}

int usage(FILE* out = stderr) {
  std::fprintf(out,
               "usage: transport_bench [--reps N (5)] [--round-trips N (2000)] [--bw-scale X (1)]\n"
               "         [--configs tcp,shm,shm+peer,pull (tcp,shm)] [--spin-us N (200)]\n"
               "         [--bw-spin-us N (0)] [--lat-sizes 8,64,1K,4K,64K] [--bw-sizes 8,...,64M] "
               "[--window-mib N (64)]\n"
               "         [--only lat|bw] [--no-perftest] [--perftest PATH] [--quick]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--serve" && has_value) {
      const LinkConfig* c = find_config(argv[++i]);
      int spin = 0;
      if (i + 2 < argc && std::string(argv[i + 1]) == "--spin-us")
        spin = static_cast<int>(int_arg(kTool, "--spin-us", argv[i + 2], 0, 1000000));
      return c ? serve(*c, spin) : 2;
    } else if (a == "--reps" && has_value) {
      f.reps = static_cast<int>(int_arg(kTool, a, argv[++i], 1, 1000));
    } else if (a == "--round-trips" && has_value) {
      f.lat_round_trips = static_cast<int>(int_arg(kTool, a, argv[++i], 10, 100000000));
    } else if (a == "--bw-scale" && has_value) {
      f.bw_scale = double_arg(kTool, a, argv[++i], 0.01, 1000);
    } else if (a == "--window-mib" && has_value) {
      f.window_bytes =
          static_cast<uint64_t>(double_arg(kTool, a, argv[++i], 0.001, 65536) * (1 << 20));
    } else if ((a == "--lat-sizes" || a == "--bw-sizes") && has_value) {
      auto& list = a == "--lat-sizes" ? f.lat_sizes : f.bw_sizes;
      list = parse_sizes(argv[++i]);
      if (list.empty()) return usage();
    } else if (a == "--configs" && has_value) {
      f.configs = split(argv[++i]);
    } else if (a == "--spin-us" && has_value) {
      f.spin_us = static_cast<int>(int_arg(kTool, a, argv[++i], 0, 1000000));
    } else if (a == "--bw-spin-us" && has_value) {
      f.bw_spin_us = static_cast<int>(int_arg(kTool, a, argv[++i], 0, 1000000));
    } else if (a == "--perftest" && has_value) {
      f.perftest_path = argv[++i];
    } else if (a == "--only" && has_value) {
      const std::string what = argv[++i];
      if (what != "lat" && what != "bw")
        usage_error(kTool, "--only takes lat or bw, got '" + what + "'");
      f.latency = what == "lat";
      f.bandwidth = what == "bw";
    } else if (a == "--no-perftest") {
      f.perftest = false;
    } else if (a == "--quick") {
      f.reps = 3;
      f.lat_round_trips = 500;
      f.bw_scale = 0.25;
    } else if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    } else {
      std::fprintf(stderr, "transport_bench: unknown option or missing value '%s'\n", a.c_str());
      return usage();
    }
  }
  for (const auto& name : f.configs)
    if (!find_config(name)) {
      std::fprintf(stderr, "transport_bench: unknown config '%s'\n", name.c_str());
      return usage();
    }
  const bool perftest = f.perftest && in_path(f.perftest_path);
  print_header(f, perftest);
  Perftest pt(f.perftest_path);
  const auto t0 = Clock::now();
  for (const auto& name : f.configs) {
    const LinkConfig& c = *find_config(name);
    if (f.latency) latency_table(c, f, perftest ? &pt : nullptr);
    if (f.bandwidth) bandwidth_table(c, f, perftest ? &pt : nullptr, f.bw_spin_us);
  }
  std::printf("\ntotal %.0f s\n", std::chrono::duration<double>(Clock::now() - t0).count());
  return 0;
}
