// Vision-language clusters of node daemons in this process (tests/actors/cluster_nodes.h): images
// encoded on the head or on the nodes their [[encoder]] tables name, re-placed with their node,
// sent again when a message or an answer is lost, dropped when no survivor has room; the tokens
// and logits stay the single-process engine's.
#include <chrono>
#include <filesystem>
#include <functional>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/cluster_client.h"
#include "actors/detail/control_wire.h"
#include "model/synth.h"
#include "model/vision.h"
#include "tests/actors/cluster_nodes.h"
#include "tests/actors/solo_reference.h"
#include "tests/image_writers.h"
#include "tests/llava_hf_twin.h"
#include "tests/test_support.h"
#include "transport/fault.h"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;
using namespace testing_nodes;

// A cluster TOML (cluster_toml) for the synthetic LLaVA pair of shared/, with its mmproj; `extra`
// ([[encoder]] tables, ...) goes at the end.
std::string llava_toml(const std::string& shared, const Layout& l, std::vector<uint16_t>* ports,
                       size_t num_nodes = 3, const std::string& extra = "") {
  const std::string dir = shared + "/models/synth/llava-tiny/";
  std::string t = cluster_toml(dir + "model.gguf", l, ports, "test-token", num_nodes);
  t.insert(t.find("[cluster]"), "mmproj = \"" + dir + "mmproj.gguf\"\n");
  return t + extra;
}

// Polls the head's status every 100 ms until `done` holds for a snapshot, up to 30 s (a hang
// guard, not a timing check); *raw gets the last snapshot read.
bool wait_for_status(ClusterClient& c, const std::function<bool(const nlohmann::json&)>& done,
                     std::string* raw) {
  for (int i = 0; i < 300; ++i) {
    std::this_thread::sleep_for(100ms);
    auto st = c.status_json();
    if (!st) continue;
    *raw = *st;
    if (done(nlohmann::json::parse(*st))) return true;
  }
  return false;
}

// The names of the actors a serving cluster's snapshot shows running (none while not serving).
std::set<std::string> running_actors(const nlohmann::json& j) {
  std::set<std::string> out;
  if (!j["serving"].get<bool>()) return out;
  for (const auto& a : j["actors"])
    if (a["state"] == "running") out.insert(a["name"].get<std::string>());
  return out;
}

// For each golden picture named (golden/vlm/images/NAME.png): a request asking what is in it (6
// tokens), and the single-process engine's result for it on the pair `l`.
void picture_workload(const std::string& shared, const Llava& l,
                      const std::vector<const char*>& images, std::vector<GenerateRequest>* reqs,
                      std::vector<Reference>* refs) {
  const std::string text = "USER: <__media__>\nWhat is in the picture? ASSISTANT:";
  for (const char* img : images) {
    const std::string png = shared + "/golden/vlm/images/" + img + ".png";
    refs->push_back(solo(*l.m, reference_prompt(**l.m, **l.enc, text, {png}), 6));
    reqs->push_back(file_request(text, {image_file(png)}, 6));
  }
}

// A vision-language pair: the head encodes the images clients send ([model] mmproj), stages on
// the other two nodes splice them; tokens and logits equal the single-process engine's.
TEST(ClusterNode, ImagesSentToTheHeadAreEncodedThereWithIdenticalOutput) {
  TROUPE_SHARED_OR_SKIP(shared);
  Llava l;
  ASSERT_NO_FATAL_FAILURE(load_llava(shared, &l));
  std::vector<GenerateRequest> reqs;
  std::vector<Reference> refs;
  picture_workload(shared, l, {"circles_64x64", "checker_50x40"}, &reqs, &refs);
  GenerateRequest bad = reqs[0];
  bad.image_files = std::make_shared<const std::vector<std::string>>(1, "GIF89a");
  reqs.push_back(bad);

  std::vector<uint16_t> ports;
  Nodes n;
  n.start(parse(llava_toml(shared, {{"b", "c"}, {}}, &ports)), 3);
  auto client = ClusterClient::connect("127.0.0.1", ports[0], "test-token");
  ASSERT_TRUE(client) << client.error().message;
  const auto res = (*client)->generate_many(reqs);
  for (size_t i = 0; i < refs.size(); ++i)
    expect_identical(res[i], refs[i], "request " + std::to_string(i));
  EXPECT_FALSE(res[2].ok());
  EXPECT_NE(res[2].error.find("image 1: unknown image format"), std::string::npos) << res[2].error;
  // The head's start-up shows the encoder's loading as a phase of its own.
  auto st = (*client)->status_json();
  ASSERT_TRUE(st) << st.error().message;
  const auto j = nlohmann::json::parse(*st);
  bool phase = false;
  for (const auto& p : j["phases"]) phase |= p["node"] == "a" && p["name"] == "load vision encoder";
  EXPECT_TRUE(phase) << *st;
  // And its encoder's counts: three requests, one refused; two images encoded.
  const auto& e = j["encoder"];
  EXPECT_EQ(e["mmproj"], "mmproj.gguf") << *st;
  EXPECT_EQ(e["requests"], 3) << *st;
  EXPECT_EQ(e["failed"], 1) << *st;
  EXPECT_EQ(e["encoded"], 2) << *st;
  EXPECT_EQ(e["cache_entries"], 2) << *st;
}

// Image encoders placed on other nodes ([[encoder]] on b and c, none on the head): the head's
// front sends each image to one of them and lays the prompts out; tokens and logits equal the
// single-process engine's. Node c leaves: only its encoder is re-placed (the pipeline keeps
// running), and new images are encoded there with the same output.
TEST(ClusterNode, ImagesAreEncodedWhereTheirEncodersArePlacedAndFollowAReplacement) {
  TROUPE_SHARED_OR_SKIP(shared);
  Llava l;
  ASSERT_NO_FATAL_FAILURE(load_llava(shared, &l));
  std::vector<GenerateRequest> reqs, later;
  std::vector<Reference> refs, later_refs;
  picture_workload(shared, l, {"circles_64x64", "checker_50x40"}, &reqs, &refs);
  picture_workload(shared, l, {"gradient_32x32"}, &later, &later_refs);

  std::vector<uint16_t> ports;
  Nodes n;
  n.start(parse(llava_toml(
              shared, {{"a", "b"}, {}}, &ports, 3,
              "[[encoder]]\nnode = \"b\"\nthreads = 1\n[[encoder]]\nnode = \"c\"\nthreads = 1\n")),
          3);
  auto client = ClusterClient::connect("127.0.0.1", ports[0], "test-token");
  ASSERT_TRUE(client) << client.error().message;
  auto res = (*client)->generate_many(reqs);
  for (size_t i = 0; i < refs.size(); ++i)
    expect_identical(res[i], refs[i], "request " + std::to_string(i));
  auto first = (*client)->status_json();
  ASSERT_TRUE(first) << first.error().message;
  std::string raw = *first;
  const auto placed = running_actors(nlohmann::json::parse(raw));
  EXPECT_TRUE(placed.count("encoder/0@b") && placed.count("encoder/1@c")) << raw;
  EXPECT_EQ(nlohmann::json::parse(raw)["encoder"]["encoded"], 2) << raw;
  // The nodes of the instances load the encoder as a start-up phase of their own.
  std::set<std::string> loaded;
  const auto snapshot = nlohmann::json::parse(raw);
  for (const auto& p : snapshot["phases"])
    if (p["name"] == "load vision encoder") loaded.insert(p["node"].get<std::string>());
  EXPECT_EQ(loaded, (std::set<std::string>{"a", "b", "c"})) << raw;

  n.nodes[2]->leave("test");
  const bool moved = wait_for_status(
      **client,
      [](const nlohmann::json& j) {
        const auto on = running_actors(j);
        return on.count("encoder/0@b") && on.count("encoder/1@a");
      },
      &raw);
  ASSERT_TRUE(moved) << "encoder 1 was not re-placed on a: " << raw;
  // Only the encoder moved: the stages kept running (no node started its actors again, as a
  // re-placement of the pipeline would), and a took the instance without reloading the mmproj.
  {
    const auto j = nlohmann::json::parse(raw);
    std::map<std::string, int> starts, loads;
    for (const auto& p : j["phases"]) {
      if (p["name"] == "start actors") ++starts[p["node"].get<std::string>()];
      if (p["name"] == "load vision encoder") ++loads[p["node"].get<std::string>()];
    }
    EXPECT_EQ(starts["a"], 1) << raw;
    EXPECT_EQ(starts["b"], 1) << raw;
    EXPECT_EQ(loads["a"], 1) << raw;
    EXPECT_EQ(j["placement_version"], 2) << raw;
  }
  // Both instances take jobs again: two new images at once (the second is the first's file with
  // bytes after its end: another digest, the same picture), one to each, and a cached one.
  later.push_back(later[0]);
  later.back().image_files = std::make_shared<const std::vector<std::string>>(
      1, (*later[0].image_files)[0] + std::string(16, '\0'));
  later_refs.push_back(later_refs[0]);
  later.push_back(reqs[0]);
  later_refs.push_back(refs[0]);
  res = (*client)->generate_many(later);
  for (size_t i = 0; i < later_refs.size(); ++i)
    expect_identical(res[i], later_refs[i], "after the re-placement, request " + std::to_string(i));
  auto st = (*client)->status_json();
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_EQ(nlohmann::json::parse(*st)["encoder"]["encoded"], 4) << *st;
  for (size_t i = n.nodes.size(); i-- > 0;) n.nodes[i].reset();
}

// One image request on stages at a, the encoder at b, where node `on`'s first message matching
// `drop` is lost: the head sends the image again once, and the output is the single-process
// engine's.
void expect_one_lost_message_retried(const std::string& on, transport::FaultRule drop,
                                     const char* image) {
  TROUPE_SHARED_OR_SKIP(shared);
  Llava l;
  ASSERT_NO_FATAL_FAILURE(load_llava(shared, &l));
  std::vector<GenerateRequest> reqs;
  std::vector<Reference> refs;
  picture_workload(shared, l, {image}, &reqs, &refs);
  std::vector<uint16_t> ports;
  const std::string t =
      llava_toml(shared, {{"a"}, {}}, &ports, 2, "[[encoder]]\nnode = \"b\"\nthreads = 1\n");
  Nodes n;
  drop.action = transport::FaultAction::kDrop;
  drop.max_count = 1;
  n.tweak = [&](NodeOptions& o) {
    if (o.name == on) o.faults = {drop};
  };
  n.start(parse(t), 2);
  auto client = ClusterClient::connect("127.0.0.1", ports[0], "test-token");
  ASSERT_TRUE(client) << client.error().message;
  const auto res = (*client)->generate_many(reqs);
  expect_identical(res[0], refs[0], "the image sent again");
  auto st = (*client)->status_json();
  ASSERT_TRUE(st) << st.error().message;
  const auto enc = nlohmann::json::parse(*st)["encoder"];
  EXPECT_EQ(enc["encoded"], 1) << *st;  // the front saw one answer
  EXPECT_EQ(enc["retried"], 1) << *st;
  for (size_t i = n.nodes.size(); i-- > 0;) n.nodes[i].reset();
}

// A LLaVA checkpoint in Hugging Face form (one directory: the plan's model and mmproj) served by
// three daemons: stages on b and c read the decoder from it, the encoder on c its vision tower;
// the output is the single-process engine's on the same directory.
TEST(ClusterNode, AHuggingFaceLlavaDirectoryServesImagesAcrossNodes) {
  TROUPE_SHARED_OR_SKIP(shared);
  testing::TempDir hf;
  ASSERT_NO_FATAL_FAILURE(testing::write_llava_hf_twin(shared, hf));
  Llava l;
  ASSERT_NO_FATAL_FAILURE(load_llava(shared, &l, hf.path(), hf.path()));
  std::vector<GenerateRequest> reqs;
  std::vector<Reference> refs;
  picture_workload(shared, l, {"circles_64x64", "checker_50x40"}, &reqs, &refs);
  std::vector<uint16_t> ports;
  std::string t = cluster_toml(hf.path(), {{"b", "c"}, {}}, &ports, "test-token", 3);
  t.insert(t.find("[cluster]"), "mmproj = \"" + hf.path() + "\"\n");
  t += "[[encoder]]\nnode = \"c\"\nthreads = 1\n";
  Nodes n;
  n.start(parse(t), 3);
  auto client = ClusterClient::connect("127.0.0.1", ports[0], "test-token");
  ASSERT_TRUE(client) << client.error().message;
  const auto res = (*client)->generate_many(reqs);
  for (size_t i = 0; i < refs.size(); ++i)
    expect_identical(res[i], refs[i], "request " + std::to_string(i));
  auto st = (*client)->status_json();
  ASSERT_TRUE(st) << st.error().message;
  const auto j = nlohmann::json::parse(*st);
  EXPECT_TRUE(running_actors(j).count("encoder/0@c")) << *st;
  EXPECT_EQ(j["encoder"]["encoded"], 2) << *st;
  for (size_t i = n.nodes.size(); i-- > 0;) n.nodes[i].reset();
}

// The head's first EncodeImage to the encoder's node is lost: no receipt comes within a lease
// (1 s here), and the head sends the image again.
TEST(ClusterNode, ALostImageIsSentAgainAndTheOutputIsUnchanged) {
  transport::FaultRule drop;
  drop.peer = "b";
  drop.type = detail::type_id(detail::ControlMsg::kEncodeImage);
  expect_one_lost_message_retried("a", drop, "checker_50x40");
}

// b's first answer with rows (8 KiB; its receipts are far smaller) is lost on the way. b repeats
// the receipt every heartbeat while it holds the image and stops once it answered; the head
// hears nothing more of the job for a lease and sends it again.
TEST(ClusterNode, ALostImageAnswerIsNoticedAndTheImageSentAgain) {
  transport::FaultRule drop;
  drop.peer = "a";
  drop.type = detail::type_id(detail::ControlMsg::kEncodedImage);
  drop.min_bytes = 2048;
  expect_one_lost_message_retried("b", drop, "circles_64x64");
}

// A cluster TOML of llava-tiny's language model with a vision encoder far heavier than its own
// (~0.4 s per 224-pixel picture on one thread here), written into `dir`; `nodes` daemons, stages
// on a, `extra` ([[encoder]] tables) at the end.
std::string heavy_llava_toml(const std::string& shared, const testing::TempDir& dir,
                             std::vector<uint16_t>* ports, size_t nodes, const std::string& extra) {
  model::MmprojSynthOptions o;
  o.image_size = 224;  // 256 image tokens per picture
  o.n_layer = 8;
  o.n_layer_used = 0;
  o.proj_dim = 128;  // llava-tiny's width
  const std::string mmproj = dir.file("heavy-mmproj.gguf");
  const Status made = model::synth_mmproj(o, mmproj);
  EXPECT_TRUE(made) << made.error().message;
  std::string t = llava_toml(shared, {{"a"}, {}}, ports, nodes, extra);
  const auto at = t.find("mmproj = \"");
  t.replace(at, t.find('\n', at) - at, "mmproj = \"" + mmproj + "\"");
  t.replace(t.find("max_model_len = 256"), 19, "max_model_len = 512");
  t.replace(t.find("kv_blocks = 64"), 14, "kv_blocks = 256");
  return t;
}

// `count` different 48 x 48 pictures written into `dir`, one request each.
std::vector<GenerateRequest> picture_requests(const testing::TempDir& dir, int count) {
  std::vector<GenerateRequest> reqs;
  for (int k = 0; k < count; ++k) {
    std::vector<uint8_t> rgb(48 * 48 * 3);
    for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(i * (k + 3) + 17 * k);
    const std::string png =
        dir.write("p" + std::to_string(k) + ".png", testing::encode_rgb_png(48, 48, rgb));
    reqs.push_back(file_request("USER: <__media__>\nWhat? ASSISTANT:", {image_file(png)}, 2));
  }
  return reqs;
}

// Six different pictures for one instance (1 thread) of the heavy encoder: the last waits
// seconds at b, several leases (1 s). b's repeated receipts keep every job alive, so none is
// taken for lost and sent again.
TEST(ClusterNode, ImagesThatWaitLongerThanALeaseAreNotSentAgain) {
  TROUPE_SHARED_OR_SKIP(shared);
  testing::TempDir dir;
  std::vector<uint16_t> ports;
  const std::string t =
      heavy_llava_toml(shared, dir, &ports, 2, "[[encoder]]\nnode = \"b\"\nthreads = 1\n");
  Nodes n;
  n.start(parse(t), 2);
  auto client = ClusterClient::connect("127.0.0.1", ports[0], "test-token");
  ASSERT_TRUE(client) << client.error().message;
  const auto started = std::chrono::steady_clock::now();
  const auto res = (*client)->generate_many(picture_requests(dir, 6));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  for (const auto& r : res) EXPECT_TRUE(r.ok()) << r.error;
  auto st = (*client)->status_json();
  ASSERT_TRUE(st) << st.error().message;
  const auto enc = nlohmann::json::parse(*st)["encoder"];
  EXPECT_EQ(enc["encoded"], 6) << *st;
  EXPECT_EQ(enc["retried"], 0) << *st;
  // Not a timing check: it says whether the test still tests something (the last image must
  // have waited at b for longer than the 1 s lease).
  std::printf("six pictures encoded one after the other in %.1f s\n", took);
  for (size_t i = n.nodes.size(); i-- > 0;) n.nodes[i].reset();
}

// Four pictures for two instances of the heavy encoder (b and c, 1 thread each: two images in
// hand each). c leaves while they encode: only encoder/1 is re-placed, and encoder/0 stays on b
// with its images, which are not sent again; at most c's two are.
TEST(ClusterNode, AnEncoderThatStaysKeepsItsImagesThroughAReplacement) {
  TROUPE_SHARED_OR_SKIP(shared);
  testing::TempDir dir;
  std::vector<uint16_t> ports;
  const std::string t = heavy_llava_toml(
      shared, dir, &ports, 3,
      "[[encoder]]\nnode = \"b\"\nthreads = 1\n[[encoder]]\nnode = \"c\"\nthreads = 1\n");
  Nodes n;
  n.start(parse(t), 3);
  auto client = ClusterClient::connect("127.0.0.1", ports[0], "test-token");
  ASSERT_TRUE(client) << client.error().message;
  const auto reqs = picture_requests(dir, 4);
  auto running = std::async(std::launch::async, [&] { return (*client)->generate_many(reqs); });
  // Each instance holds its two images by now (its first takes ~0.4 s); a hang guard, not a
  // timing check: later, c's images may be done and only fewer are sent again.
  std::this_thread::sleep_for(200ms);
  n.nodes[2]->leave("test");
  const auto res = running.get();
  for (const auto& r : res) EXPECT_TRUE(r.ok()) << r.error;
  auto st = (*client)->status_json();
  ASSERT_TRUE(st) << st.error().message;
  const auto j = nlohmann::json::parse(*st);
  EXPECT_EQ(j["encoder"]["encoded"], 4) << *st;
  EXPECT_LE(j["encoder"]["retried"].get<int>(), 2) << *st;
  EXPECT_TRUE(running_actors(j).count("encoder/0@b")) << *st;
  for (size_t i = n.nodes.size(); i-- > 0;) n.nodes[i].reset();
}

// The only image encoder's node (b) leaves and the survivor has no room for it (a's limit holds
// its stages, rounded up to a MiB, and the encoder's weights need more than that MiB): the
// encoder is dropped, text requests go on at once, and a request with an image fails at once
// saying why.
TEST(ClusterNode, AnEncoderWithNoRoomIsDroppedAndTextKeepsBeingServed) {
  TROUPE_SHARED_OR_SKIP(shared);
  std::vector<uint16_t> ports;
  std::string t =
      llava_toml(shared, {{"a", "a"}, {}}, &ports, 2, "[[encoder]]\nnode = \"b\"\nthreads = 1\n");
  // A KV pool that leaves a's last MiB with less room than the encoder's weights need.
  const uint64_t encoder =
      model::vision_weight_bytes(shared + "/models/synth/llava-tiny/mmproj.gguf");
  ASSERT_GT(encoder, 0u);
  const std::string pool = "kv_blocks = 64\n";
  const size_t at = t.find(pool);
  ASSERT_NE(at, std::string::npos);
  uint64_t slack = 0;
  for (int blocks = 64; blocks < 512; ++blocks) {
    t.replace(at, t.find('\n', at) + 1 - at, "kv_blocks = " + std::to_string(blocks) + "\n");
    const uint64_t need = placed_bytes(t, "a");
    slack = (uint64_t{static_cast<uint64_t>(fitting_limit_mb(t, "a"))} << 20) - need;
    if (slack < encoder) break;
  }
  ASSERT_LT(slack, encoder);
  const std::string a = "name = \"a\"\n";
  t.insert(t.find(a) + a.size(),
           "memory_limit_mb = " + std::to_string(fitting_limit_mb(t, "a")) + "\n");
  Nodes n;
  ASSERT_NO_FATAL_FAILURE(n.start(parse(t), 2));
  auto client = ClusterClient::connect("127.0.0.1", ports[0], "test-token");
  ASSERT_TRUE(client) << client.error().message;
  const std::string png = shared + "/golden/vlm/images/circles_64x64.png";
  const auto image = file_request("USER: <__media__>\nWhat? ASSISTANT:", {image_file(png)}, 4);
  ASSERT_TRUE((*client)->generate_many({image})[0].ok());
  n.nodes[1]->leave("test");
  std::string raw;
  const bool dropped = wait_for_status(
      **client,
      [](const nlohmann::json& j) {
        bool none = j["placement_version"] == 2 && j["serving"].get<bool>();
        for (const auto& a : j["actors"])
          none &= a["name"].get<std::string>().rfind("encoder/", 0) != 0;
        return none;
      },
      &raw);
  ASSERT_TRUE(dropped) << raw;
  GenerateRequest text;
  text.prompt = "Once upon a time";
  text.max_tokens = 4;
  const auto res = (*client)->generate_many({text, image});
  EXPECT_TRUE(res[0].ok()) << res[0].error;
  EXPECT_FALSE(res[1].ok());
  EXPECT_NE(res[1].error.find("the cluster has no image encoder now"), std::string::npos)
      << res[1].error;
  for (size_t i = n.nodes.size(); i-- > 0;) n.nodes[i].reset();
}

TEST(ClusterNode, HeadRefusesAVisionEncoderThatDoesNotFitItsModel) {
  TROUPE_SHARED_OR_SKIP(shared);
  std::vector<uint16_t> ports;
  std::string toml =
      cluster_toml(shared + "/models/stories260K/stories260K.gguf", {{"a"}, {}}, &ports, "t", 1);
  toml.insert(toml.find("[cluster]"),
              "mmproj = \"" + shared + "/models/synth/llava-tiny/mmproj.gguf\"\n");
  NodeOptions o;
  o.name = "a";
  auto head = ClusterNode::start(parse(toml), o);
  ASSERT_FALSE(head);
  EXPECT_NE(head.error().message.find("[model] mmproj: the vision encoder gives rows of"),
            std::string::npos)
      << head.error().message;
}

}  // namespace
}  // namespace troupe::actors
