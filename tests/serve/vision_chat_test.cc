// Chats with images over HTTP: the LLaVA-style pair of ../shared (llava-tiny and its mmproj),
// its GGUF copied with a Llama 2 chat template added, served by a one-node cluster whose head
// encodes images. A chat with an image_url part (a data: URL of a PNG) must give the tokens the
// cluster gives the template's text with the image marker and the same file submitted directly
// (that path is held to llama.cpp's reference elsewhere: tests/actors/cluster_images_test.cc).
#include <chrono>
#include <condition_variable>
#include <mutex>

#include <nlohmann/json.hpp>

#include "actors/cluster_node.h"
#include "actors/plan.h"
#include "serve/http_gateway.h"
#include "tests/cluster_test_util.h"
#include "tests/edited_model.h"
#include "tests/serve/http_client.h"
#include "tests/serve/served_cluster.h"
#include "tests/test_support.h"

namespace troupe::serve {
namespace {

using nlohmann::json;
using testing::http;
using namespace std::chrono_literals;

std::string base64(const std::string& bytes) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = (uint32_t(uint8_t(bytes[i])) << 16) |
                       (uint32_t(uint8_t(bytes[i + 1])) << 8) | uint8_t(bytes[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += k[(v >> s) & 63];
  }
  if (i < bytes.size()) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size()) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? k[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

class VisionChat : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string shared = troupe::testing::shared_dir();
    if (shared.empty()) return;
    dir_ = new troupe::testing::TempDir();
    const std::string pair = shared + "/models/synth/llava-tiny";
    testing::ServedSpec spec;
    spec.model = troupe::testing::edited_gguf(
        *dir_, "llava-chat.gguf", pair + "/model.gguf", [](model::GgufWriter& w) {
          // A Llama 2 style template of our own: [INST] user [/INST] answer </s>.
          w.set_string("tokenizer.chat_template",
                       "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}"
                       "{{ '[INST] ' + m.content | trim + ' [/INST]' }}{% else %}"
                       "{{ ' ' + m.content | trim + ' ' + eos_token }}{% endif %}{% endfor %}");
        });
    ASSERT_FALSE(spec.model.empty());
    spec.model_extra = "mmproj = \"" + pair + "/mmproj.gguf\"\n";
    spec.model_id = "llava";
    spec.max_sequences = 4;
    served_ = testing::ServedCluster::start(spec).release();
    if (served_) {
      node_ = served_->node.get();
      gateway_ = served_->gateway.get();
    }
  }
  static void TearDownTestSuite() {
    delete served_;
    served_ = nullptr;
    gateway_ = nullptr;
    node_ = nullptr;
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    TROUPE_SHARED_OR_SKIP(shared);
    ASSERT_NE(gateway_, nullptr) << "the cluster or its gateway did not start";
  }
  static json chat(const json& content, int want = 200) {
    json msg = json::object();
    msg["role"] = "user";
    msg["content"] = content;
    json body = {{"model", "llava"}, {"max_tokens", 8}, {"temperature", 0}};
    body["messages"] = json::array({msg});
    const auto a = http(gateway_->port(), "POST", "/v1/chat/completions", body.dump());
    EXPECT_EQ(a.status, want) << a.body;
    return json::parse(a.body, nullptr, false);
  }

  static inline troupe::testing::TempDir* dir_ = nullptr;
  static inline testing::ServedCluster* served_ = nullptr;
  static inline actors::ClusterNode* node_ = nullptr;
  static inline HttpGateway* gateway_ = nullptr;
};

TEST_F(VisionChat, AnImagePartIsTheImageFileBesideTheTemplatesText) {
  const std::string png = troupe::testing::read_text_file(troupe::testing::shared_dir() +
                                                          "/golden/vlm/images/checker_50x40.png");
  ASSERT_GT(png.size(), 50u);
  const json got = chat(
      {{{"type", "text"}, {"text", "Look at this picture: "}},
       {{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64," + base64(png)}}}},
       {{"type", "text"}, {"text", "\nOnce upon a time"}}});
  ASSERT_TRUE(got.contains("choices")) << got.dump();

  // The same through ClusterNode::submit: Llama 2's prompt with the marker, the file beside it.
  actors::GenerateRequest r;
  r.prompt = "<s>[INST] Look at this picture: <__media__>\nOnce upon a time [/INST]";
  r.add_bos = false;
  r.image_files = std::make_shared<const std::vector<std::string>>(1, png);
  r.max_tokens = 8;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  actors::GenerateResult want;
  actors::RequestCallbacks cb;
  cb.on_finish = [&](const actors::GenerateResult& res) {
    std::lock_guard<std::mutex> lk(mu);
    want = res;
    done = true;
    cv.notify_all();
  };
  ASSERT_TRUE(node_->submit(r, cb));
  std::unique_lock<std::mutex> lk(mu);
  ASSERT_TRUE(cv.wait_for(lk, 60s, [&] { return done; }));
  ASSERT_TRUE(want.ok()) << want.error;
  EXPECT_EQ(got["choices"][0]["message"]["content"], want.text);
  EXPECT_EQ(got["usage"]["prompt_tokens"], want.prompt_tokens.size());
  EXPECT_EQ(got["usage"]["completion_tokens"], want.tokens.size());
  // The image's rows are in the prompt: far more positions than its text's tokens.
  EXPECT_GT(want.prompt_tokens.size(), 40u);
}

TEST_F(VisionChat, BadImagesAreRefusedByName) {
  auto param_of = [](const json& j) { return j["error"]["param"].get<std::string>(); };
  EXPECT_EQ(param_of(chat({{{"type", "image_url"},
                            {"image_url", {{"url", "https://example.invalid/cat.png"}}}}},
                          400)),
            "messages[0].content[0]");
  EXPECT_EQ(param_of(chat({{{"type", "image_url"}, {"image_url", {{"url", "data:image/png,xyz"}}}}},
                          400)),
            "messages[0].content[0]");
  EXPECT_EQ(
      param_of(chat(
          {{{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64,@@@@"}}}}}, 400)),
      "messages[0].content[0]");
  // The marker written as text is refused: it would take the place of an image.
  EXPECT_EQ(param_of(chat("a <__media__> b", 400)), "messages[0].content");
  // Not a picture at all, or a PNG cut short: the decoder's message, naming the part.
  const json junk = chat({{{"type", "image_url"},
                           {"image_url", {{"url", "data:image/png;base64," + base64("hello")}}}}},
                         400);
  EXPECT_EQ(param_of(junk), "messages[0].content[0]");
  std::string png = troupe::testing::read_text_file(troupe::testing::shared_dir() +
                                                    "/golden/vlm/images/checker_50x40.png");
  png.resize(png.size() / 2);
  const json cut = chat(
      {{{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64," + base64(png)}}}}},
      400);
  EXPECT_EQ(cut["error"]["message"].get<std::string>().rfind("messages[0].content[0]", 0), 0u)
      << cut.dump();
}

}  // namespace
}  // namespace troupe::serve
