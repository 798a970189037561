// Constrained decoding across node daemons in this process (loopback): stage 0 on the head a,
// stage 1 (the last, which masks the logits with the request's grammar) on node b, so every
// step's grammar and reply tokens cross the wire. Replies are sentences of their grammar,
// identical to the single-process actor system's, rebuilt exactly after the last stage restarts;
// a grammar that cannot go on ends its own sequence with finish reason "error".
#include <chrono>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/cluster_client.h"
#include "actors/cluster_node.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "tests/actors/cluster_nodes.h"
#include "tests/cluster_test_util.h"
#include "tests/test_support.h"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;
using namespace testing_nodes;

// Two capitals, a dash, three digits, a colour; then only an end-of-generation token fits.
constexpr const char* kPlateGrammar = "root ::= [A-Z]{2} \"-\" [0-9]{3} (\" red\" | \" green\")\n";
const std::regex kPlate("[A-Z]{2}-[0-9]{3} (red|green)");
// Each reply takes well under a second; a sequence whose end is lost fails after this.
constexpr auto kTimeout = 30s;

// The cluster of this file's tests and the model its requests are tokenized with.
struct TwoNodes {
  std::string path;
  std::shared_ptr<const model::Model> model;
  std::vector<uint16_t> ports;
  Nodes n;
  std::unique_ptr<ClusterClient> client;
};

// Starts nodes a and b with stories260K's two stages on them in that order, and checks that the
// head's snapshot places the last stage on b (remote from the head's scheduler).
void start_two_nodes(const std::string& shared, TwoNodes* c) {
  c->path = shared + "/models/stories260K/stories260K.gguf";
  auto m = model::load_model(c->path);
  ASSERT_TRUE(m) << m.error().message;
  c->model = *m;
  ASSERT_NE(c->model->tokenizer, nullptr);
  ASSERT_NO_FATAL_FAILURE(
      c->n.start(parse(cluster_toml(c->path, {{"a", "b"}, {}}, &c->ports, "t", 2)), 2));
  auto client = ClusterClient::connect("127.0.0.1", c->ports[0], "t");
  ASSERT_TRUE(client) << client.error().message;
  c->client = std::move(*client);
  auto st = c->client->status_json();
  ASSERT_TRUE(st) << st.error().message;
  const auto j = nlohmann::json::parse(*st);
  ASSERT_TRUE(j["serving"].get<bool>()) << *st;
  std::set<std::string> actors;
  for (const auto& a : j["actors"]) actors.insert(a["name"].get<std::string>());
  EXPECT_EQ(actors, (std::set<std::string>{"stage/0@a", "stage/1@b"})) << *st;
}

GenerateRequest plate_request(const model::Tokenizer& tok, float temperature, uint64_t seed) {
  GenerateRequest r;
  r.prompt_tokens = tok.encode("Once upon a time", /*add_special=*/true);
  r.max_tokens = 30;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  r.sampling.grammar = kPlateGrammar;
  return r;
}

// Seeded draws at temperature 1, then greedy.
std::vector<GenerateRequest> plate_requests(const model::Tokenizer& tok) {
  std::vector<GenerateRequest> reqs;
  for (uint64_t seed : {1, 2, 3, 4, 5}) reqs.push_back(plate_request(tok, 1.0f, seed));
  reqs.push_back(plate_request(tok, 0.0f, 9));
  return reqs;
}

// The bytes the grammar saw: every generated token's piece.
std::string pieces(const model::Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += tok.token_to_piece(id);
  return s;
}

// `r` is a whole sentence of the plate grammar, ended by an end-of-generation token.
void expect_plate(const model::Tokenizer& tok, const GenerateResult& r, size_t idx) {
  ASSERT_TRUE(r.ok()) << "request " << idx << ": " << r.error;
  const std::string s = pieces(tok, r.tokens);
  EXPECT_TRUE(std::regex_match(s, kPlate)) << "request " << idx << ": '" << s << "'";
  EXPECT_TRUE(std::regex_match(r.text, kPlate)) << "request " << idx << ": '" << r.text << "'";
  EXPECT_EQ(r.finish_reason, "stop") << "request " << idx << ": '" << s << "'";
}

TEST(ClusterGrammar, RepliesAcrossNodesAreSentencesOfTheGrammar) {
  TROUPE_SHARED_OR_SKIP(shared);
  TwoNodes c;
  ASSERT_NO_FATAL_FAILURE(start_two_nodes(shared, &c));
  const model::Tokenizer& tok = *c.model->tokenizer;
  const auto reqs = plate_requests(tok);
  const auto got = c.client->generate_many(reqs, 0, nullptr, kTimeout);
  ASSERT_EQ(got.size(), reqs.size());
  std::set<std::vector<int32_t>> sampled;
  for (size_t i = 0; i < got.size(); ++i) {
    expect_plate(tok, got[i], i);
    if (reqs[i].sampling.temperature > 0) sampled.insert(got[i].tokens);
  }
  // The seeds draw different plates: the grammar masks the draw, it does not pick the reply.
  EXPECT_GE(sampled.size(), 2u);
  // Greedy again, alone: the same tokens.
  const auto again = c.client->generate_many({reqs.back()}, 0, nullptr, kTimeout);
  ASSERT_EQ(again.size(), 1u);
  expect_plate(tok, again[0], 0);
  EXPECT_EQ(again[0].tokens, got.back().tokens);
}

TEST(ClusterGrammar, RepliesAcrossNodesEqualTheSingleProcessOnes) {
  TROUPE_SHARED_OR_SKIP(shared);
  TwoNodes c;
  ASSERT_NO_FATAL_FAILURE(start_two_nodes(shared, &c));
  auto reqs = plate_requests(*c.model->tokenizer);
  for (auto& r : reqs) r.return_logits = true;
  const auto want = testing::local_results(c.path, reqs);
  ASSERT_EQ(want.size(), reqs.size());
  for (size_t i = 0; i < want.size(); ++i) expect_plate(*c.model->tokenizer, want[i], i);
  const auto got = c.client->generate_many(reqs, 0, nullptr, kTimeout);
  testing::expect_same(got, want);  // tokens and (unmasked) logits, bit for bit
  for (size_t i = 0; i < got.size() && i < want.size(); ++i)
    EXPECT_EQ(got[i].finish_reason, want[i].finish_reason) << "request " << i;
}

// The remote last stage throws mid-generation: node b restarts it with no matchers, which it
// rebuilds from the reply tokens each step carries; the replies equal the fault-free ones.
TEST(ClusterGrammar, RestartedRemoteLastStageRebuildsMatchersFromReplyTokens) {
  TROUPE_SHARED_OR_SKIP(shared);
  TwoNodes c;
  ASSERT_NO_FATAL_FAILURE(start_two_nodes(shared, &c));
  const auto reqs = plate_requests(*c.model->tokenizer);
  const auto want = testing::local_results(c.path, reqs);
  ASSERT_EQ(want.size(), reqs.size());
  int num_pieces = 0;
  bool injected = false;
  const auto got = c.client->generate_many(
      reqs, 0,
      [&](size_t, const std::string&, int32_t) {
        // Every sequence is past its first token by now (one piece per sequence per step).
        if (++num_pieces == static_cast<int>(2 * reqs.size()))
          injected = static_cast<bool>(c.n.nodes[1]->inject_fault("stage/1"));
      },
      kTimeout);
  EXPECT_TRUE(injected);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    expect_plate(*c.model->tokenizer, got[i], i);
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
  }
}

// Grammars that cannot go on end their own sequence with finish reason "error" and the stage's
// message; the step's other sequence finishes as if alone.
TEST(ClusterGrammar, GrammarThatCannotGoOnEndsOnlyItsSequence) {
  TROUPE_SHARED_OR_SKIP(shared);
  TwoNodes c;
  ASSERT_NO_FATAL_FAILURE(start_two_nodes(shared, &c));
  const model::Tokenizer& tok = *c.model->tokenizer;
  std::vector<GenerateRequest> reqs = {plate_request(tok, 1.0f, 3), plate_request(tok, 1.0f, 3),
                                       plate_request(tok, 1.0f, 3)};
  reqs[1].sampling.grammar = "root ::= \"x\" missing\n";         // does not compile
  reqs[2].sampling.grammar = "root ::= [^\\x00-\\U0010FFFF]\n";  // an empty class: no sentence
  const auto alone = c.client->generate_many({reqs[0]}, 0, nullptr, kTimeout);
  const auto got = c.client->generate_many(reqs, 0, nullptr, kTimeout);
  ASSERT_EQ(got.size(), 3u);
  ASSERT_EQ(alone.size(), 1u);
  expect_plate(tok, got[0], 0);
  EXPECT_EQ(got[0].tokens, alone[0].tokens);
  EXPECT_EQ(got[1].finish_reason, "error");
  EXPECT_NE(got[1].error.find("rule 'missing' is used but not defined"), std::string::npos)
      << got[1].error;
  EXPECT_TRUE(got[1].tokens.empty());
  EXPECT_EQ(got[2].finish_reason, "error");
  EXPECT_NE(got[2].error.find("the grammar allows no token of the vocabulary"), std::string::npos)
      << got[2].error;
  EXPECT_TRUE(got[2].tokens.empty());
}

}  // namespace
}  // namespace troupe::actors
