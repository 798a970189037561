// encoder_bench: where the image encoders run. A burst of N requests, each with a new picture
// (one token generated), goes to a three-node cluster on loopback (node daemons in this
// process, each with its own transport) under three layouts of [[encoder]]:
//   head        one instance on the head (what a plan without [[encoder]] gets), T threads
//   remote      one instance on node b, T threads: the same work plus the image and its rows
//               over the transport
//   spread      one instance on each of b and c with T/2 threads each (at least 1)
// It prints the wall time of the burst (median of --runs, a fresh cluster per run) and the
// encoder's own seconds from the status snapshot. The pipeline (one stage) runs on the head.
// Without --model/--mmproj it synthesizes a LLaVA-1.5-shaped pair into a temporary folder: the
// CLIP ViT-L/14-336 encoder (F16, as shipped) and a 4096-wide Llama decoder of one layer with
// a small FFN, so that the burst's time is the encoders'.
// Usage: encoder_bench [--model GGUF --mmproj GGUF] [--images N] [--threads T] [--runs N]
//                      [--layouts head,remote,spread]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <nlohmann/json.hpp>
#include <sys/socket.h>

#include "actors/cluster_client.h"
#include "actors/cluster_node.h"
#include "actors/plan.h"
#include "bench/detail/args.h"
#include "bench/detail/median.h"
#include "bench/detail/pictures.h"
#include "bench/detail/ports.h"
#include "model/synth.h"

namespace {

using namespace troupe;  // NOLINT(google-build-using-namespace): a benchmark's main file
using bench::median;
using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "encoder_bench: %s\n", why.c_str());
  std::exit(1);
}

// A loopback port nobody listens on now.
uint16_t free_port() {
  const uint16_t p = bench::free_loopback_port();
  if (p == 0) die("cannot find a free loopback port");
  return p;
}

struct Burst {
  double seconds = 0, encode_seconds = 0;
};

Burst run(const std::string& model, const std::string& mmproj, const std::string& layout,
          int threads, int images, int seed) {
  std::vector<uint16_t> ports = {free_port(), free_port(), free_port()};
  std::ostringstream t;
  t << "[model]\npath = \"" << model << "\"\nmmproj = \"" << mmproj << "\"\n"
    << "[cluster]\ntoken = \"bench\"\nhead = \"a\"\nucx_net_devices = \"lo\"\n";
  for (int i = 0; i < 3; ++i)
    t << "[[node]]\nname = \"" << static_cast<char>('a' + i)
      << "\"\naddress = \"127.0.0.1:" << ports[static_cast<size_t>(i)] << "\"\n";
  t << "[[stage]]\nnode = \"a\"\nthreads = " << threads << "\nkv_blocks = 256\n";
  const int half = std::max(1, threads / 2);
  if (layout == "head") {
    t << "[[encoder]]\nnode = \"a\"\nthreads = " << threads << "\n";
  } else if (layout == "remote") {
    t << "[[encoder]]\nnode = \"b\"\nthreads = " << threads << "\n";
  } else if (layout == "spread") {
    t << "[[encoder]]\nnode = \"b\"\nthreads = " << half << "\n";
    t << "[[encoder]]\nnode = \"c\"\nthreads = " << half << "\n";
  } else {
    die("unknown layout '" + layout + "' (head, remote or spread)");
  }
  t << "[scheduler]\nmax_sequences = " << std::max(images, 1) << "\nmax_model_len = 1024\n";
  auto plan = actors::parse_plan_string(t.str(), "encoder_bench.toml");
  if (!plan) die(plan.error().message);
  std::vector<std::unique_ptr<actors::ClusterNode>> nodes;
  for (const char* name : {"a", "b", "c"}) {
    actors::NodeOptions o;
    o.name = name;
    auto n = actors::ClusterNode::start(*plan, o);
    if (!n) die(n.error().message);
    nodes.push_back(std::move(*n));
  }
  if (auto s = nodes[0]->wait_ready(std::chrono::seconds(300)); !s) die(s.error().message);
  auto client = actors::ClusterClient::connect("127.0.0.1", ports[0], "bench");
  if (!client) die(client.error().message);
  std::vector<actors::GenerateRequest> reqs;
  for (int i = 0; i < images; ++i) {
    actors::GenerateRequest r;
    r.prompt = "USER: <__media__>\nWhat is in this picture? ASSISTANT:";
    r.image_files = std::make_shared<const std::vector<std::string>>(1, bench::picture(seed + i));
    r.max_tokens = 1;
    r.sampling.ignore_eos = true;
    reqs.push_back(std::move(r));
  }
  const auto t0 = Clock::now();
  const auto res = (*client)->generate_many(reqs);
  Burst out;
  out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  for (const auto& r : res)
    if (!r.ok()) die(layout + ": " + r.error);
  auto st = (*client)->status_json();
  if (!st) die(st.error().message);
  out.encode_seconds = nlohmann::json::parse(*st)["encoder"]["encode_seconds"].get<double>();
  client->reset();
  for (size_t i = nodes.size(); i-- > 0;) nodes[i].reset();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage =
      "usage: encoder_bench [--model GGUF --mmproj GGUF] [--images N] [--threads T] "
      "[--runs N] [--layouts head,remote,spread]";
  std::string model_path, mmproj_path, layouts = "head,remote,spread";
  int images = 4, threads = 2, runs = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool more = i + 1 < argc;
    if (a == "--model" && more) {
      model_path = argv[++i];
    } else if (a == "--mmproj" && more) {
      mmproj_path = argv[++i];
    } else if (a == "--images" && more) {
      images = static_cast<int>(bench::int_arg("encoder_bench", a, argv[++i], 1, 4096));
    } else if (a == "--threads" && more) {
      threads = static_cast<int>(bench::int_arg("encoder_bench", a, argv[++i], 1, 1024));
    } else if (a == "--runs" && more) {
      runs = static_cast<int>(bench::int_arg("encoder_bench", a, argv[++i], 1, 1000));
    } else if (a == "--layouts" && more) {
      layouts = argv[++i];
    } else if (a == "--help" || a == "-h") {
      std::printf("%s\n", usage.c_str());
      return 0;
    } else {
      bench::usage_error("encoder_bench", "unknown option or missing value '" + a + "'; " + usage);
    }
  }
  if (model_path.empty() != mmproj_path.empty()) die("give both --model and --mmproj, or neither");
  if (model_path.empty()) {
    const auto dir = std::filesystem::temp_directory_path() / "troupe_encoder_bench";
    std::filesystem::create_directories(dir);
    model_path = (dir / "llava-shaped-1layer.gguf").string();
    mmproj_path = (dir / "clip-l-336.gguf").string();
    model::SynthOptions so;
    so.n_embd = 4096;
    so.n_layer = 1;
    so.n_head = 32;
    so.n_head_kv = 32;
    so.n_ff = 256;
    so.dtype = model::GgmlType::kQ8_0;
    if (auto s = model::synth_model(so, model_path); !s) die(s.error().message);
    if (auto s = model::synth_mmproj(model::MmprojSynthOptions{}, mmproj_path); !s)
      die(s.error().message);
  }
  std::printf("%d new pictures at once, 1 token each; %s + %s; %d threads per layout; %u CPUs\n",
              images, std::filesystem::path(model_path).filename().c_str(),
              std::filesystem::path(mmproj_path).filename().c_str(), threads,
              std::thread::hardware_concurrency());
  std::vector<std::string> names;
  for (std::stringstream ss(layouts); ss.good();) {
    std::string l;
    std::getline(ss, l, ',');
    if (!l.empty()) names.push_back(l);
  }
  // Layouts alternate run by run, so that a neighbour's burst does not hit one layout only.
  std::vector<std::vector<double>> wall(names.size()), enc(names.size());
  for (int r = 0; r < runs; ++r)
    for (size_t k = 0; k < names.size(); ++k) {
      const Burst x = run(model_path, mmproj_path, names[k], threads, images, 100 * r);
      wall[k].push_back(x.seconds);
      enc[k].push_back(x.encode_seconds);
      std::printf("  run %d %-7s %7.3f s  (encoders busy %.3f s)\n", r + 1, names[k].c_str(),
                  x.seconds, x.encode_seconds);
      std::fflush(stdout);
    }
  std::printf("layout   burst s (median of %d)  images/s  encoders' own s\n", runs);
  for (size_t k = 0; k < names.size(); ++k)
    std::printf("%-8s %10.3f %18.2f %12.3f\n", names[k].c_str(), median(wall[k]),
                images / median(wall[k]), median(enc[k]));
  return 0;
}
