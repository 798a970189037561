// End-to-end tests of the `troupe` command: real processes, real model files. Bad input must
// give one line on stderr and a non-zero exit; good input the reference tokens and logits.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "compute/matmul.h"
#include "model/gguf_writer.h"
#include "tests/edited_model.h"
#include "tests/fp8_model.h"
#include "tests/int4_model.h"
#include "tests/llava_hf_twin.h"
#include "tests/test_support.h"

namespace troupe {
namespace {

namespace fs = std::filesystem;

using CliRun = testing::ProcessRun;

// A fresh folder per test process, removed at exit: a folder named after the process id alone
// could be a finished process's (ids come round), whose daemon logs a test would then read.
fs::path temp_dir() {
  static const testing::TempDir d;
  return d.path();
}

CliRun troupe(const std::vector<std::string>& args) {
  return testing::run_process(testing::binary_dir() + "/bin/troupe", args, temp_dir().string());
}

// A failure prints exactly one line that contains `what`, and exits non-zero.
void expect_one_line_error(const CliRun& r, const std::string& what) {
  EXPECT_NE(r.rc, 0);
  EXPECT_EQ(testing::count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find(what), std::string::npos) << "stderr: " << r.err;
}

TEST(Cli, BadInvocationsGiveOneLineErrors) {
  CliRun r = troupe({});
  EXPECT_EQ(r.rc, 2);
  expect_one_line_error(troupe({"frobnicate"}), "unknown command 'frobnicate'");
  expect_one_line_error(troupe({"generate", "--prompt", "hi"}), "missing required option --model");
  expect_one_line_error(troupe({"generate", "--model", "/nonexistent/m.gguf", "--prompt", "x"}),
                        "/nonexistent/m.gguf");
  expect_one_line_error(
      troupe({"generate", "--model", "x.gguf", "--max-tokens", "abc", "--prompt", "x"}),
      "--max-tokens must be an integer");
  expect_one_line_error(troupe({"generate", "--model", "x.gguf", "--bogus"}),
                        "unknown option --bogus");
  expect_one_line_error(
      troupe({"eval", "--model", "x.gguf", "--tokens", "1,x,3", "--logits-out", "/tmp/x"}),
      "'x' is not a token id");
  expect_one_line_error(
      troupe({"generate", "--model", "x.gguf", "--temperature", "-1", "--prompt", "x"}),
      "--temperature must be a number");
}

TEST(Cli, ThreadsTakesAutoOrACountAndRejectsTheRest) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string m = shared + "/models/stories260K/stories260K.gguf";
  auto gen = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {"generate",         "--model",      m,    "--prompt",
                                  "Once upon a time", "--max-tokens", "24", "--json"};
    a.insert(a.end(), extra.begin(), extra.end());
    return troupe(a);
  };
  // The default is auto; every thread count gives the same tokens (batch-invariant numerics).
  const CliRun one = gen({"--threads", "1"});
  ASSERT_EQ(one.rc, 0) << one.err;
  for (const auto& extra : std::vector<std::vector<std::string>>{
           {}, {"--threads", "auto"}, {"--threads", "3"}, {"--stages", "2", "--threads", "auto"}}) {
    const CliRun r = gen(extra);
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out).at("tokens"),
              nlohmann::json::parse(one.out).at("tokens"))
        << (extra.empty() ? "default" : extra.back());
  }
  for (const std::string bad : {"0", "two", "2000", "-1", ""})
    expect_one_line_error(
        gen({"--threads", bad}),
        "--threads must be an integer from 1 to 1024 or \"auto\", got '" + bad + "'");
}

// A stage placed on a GPU: without one (or without the CUDA backend) the run fails at start with
// one line saying so; with one, it generates.
TEST(Cli, GpuStageWithoutAGpuIsAClearError) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string plan = testing::binary_dir() + "/gpu-stage-plan.toml";
  {
    std::FILE* f = std::fopen(plan.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fprintf(f,
                 "[model]\npath = \"%s/models/stories260K/stories260K.gguf\"\n[[stage]]\ndevice = "
                 "\"cuda:0\"\n",
                 shared.c_str());
    std::fclose(f);
  }
  CliRun r =
      troupe({"generate", "--config", plan, "--prompt", "Once", "--max-tokens", "4", "--json"});
  if (r.rc == 0) {
    EXPECT_NE(r.out.find("\"tokens\""), std::string::npos) << r.out;
    return;
  }
  EXPECT_NE(r.err.find("stage 0 failed to start: stage 0: cuda:0: "), std::string::npos) << r.err;
  EXPECT_TRUE(r.err.find("no usable CUDA GPU") != std::string::npos ||
              r.err.find("no CUDA backend") != std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("unhandled exception"), std::string::npos) << r.err;
}

TEST(Cli, WeightStorageOptionIsChecked) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string m = shared + "/models/stories260K/stories260K.gguf";
  expect_one_line_error(troupe({"generate", "--model", m, "--prompt", "x", "--weights", "ram"}),
                        "--weights: expected \"map\", \"memory\" or \"auto\", got \"ram\"");
  // Every storage gives the same greedy tokens (auto, the default, copies this small model).
  CliRun a = troupe({"generate", "--model", m, "--prompt", "Once", "--max-tokens", "12", "--json",
                     "--weights", "map"});
  CliRun b = troupe({"generate", "--model", m, "--prompt", "Once", "--max-tokens", "12", "--json",
                     "--weights", "memory"});
  CliRun c = troupe({"generate", "--model", m, "--prompt", "Once", "--max-tokens", "12", "--json"});
  ASSERT_EQ(a.rc, 0) << a.err;
  ASSERT_EQ(b.rc, 0) << b.err;
  ASSERT_EQ(c.rc, 0) << c.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.out, c.out);
  EXPECT_EQ(c.err.find("file mapping"), std::string::npos) << c.err;
}

TEST(Cli, ClusterCommandsGiveOneLineErrors) {
  const fs::path conf = temp_dir() / "cluster.toml";
  std::ofstream(conf) << "[cluster]\ntoken = \"t\"\n[[node]]\nname = \"a\"\n"
                         "address = \"127.0.0.1:1\"\n";
  expect_one_line_error(troupe({"node", "--config", "/nonexistent/c.toml", "--name", "a"}),
                        "/nonexistent/c.toml");
  expect_one_line_error(troupe({"node", "--config", conf.string()}),
                        "missing required option --name");
  expect_one_line_error(troupe({"node", "--config", conf.string(), "--name", "zz"}),
                        "no [[node]] is named 'zz' (nodes: a)");
  expect_one_line_error(troupe({"serve", "--config", conf.string(), "--name", "b"}),
                        "'b' is not the head of this cluster");
  expect_one_line_error(
      troupe({"node", "--config", conf.string(), "--name", "a", "--fault", "explode:p=1"}),
      "unknown action 'explode'");
  expect_one_line_error(troupe({"status", "--head", "nohostport", "--token", "t"}),
                        "--head: expected HOST:PORT");
  expect_one_line_error(troupe({"status", "--head", "127.0.0.1:9"}), "no cluster token");
  expect_one_line_error(
      troupe({"generate", "--head", "127.0.0.1:9", "--token", "t", "--prompt", "x"}),
      "cannot reach the head at 127.0.0.1:9");
}

// A node daemon whose model file is missing or corrupt names it and exits 2. (Until session 54
// it crashed instead: the half-started node's destructor used a link it did not have yet.)
TEST(Cli, NodeWithABadModelFileSaysWhichAndExits) {
  const fs::path corrupt = temp_dir() / "node-corrupt.gguf";
  std::ofstream(corrupt, std::ios::binary) << "GGUF\x03";  // truncated header
  for (const std::string& model : {std::string("/nonexistent/m.gguf"), corrupt.string()}) {
    const fs::path conf = temp_dir() / "node-bad-model.toml";
    std::ofstream(conf) << "[model]\npath = \"" << model
                        << "\"\n[cluster]\ntoken = \"t\"\n[[node]]\nname = \"a\"\n"
                           "address = \"127.0.0.1:1\"\n";
    const auto r = troupe({"node", "--config", conf.string(), "--name", "a"});
    EXPECT_EQ(r.rc, 2) << r.err;
    expect_one_line_error(r,
                          model + (model == corrupt.string() ? ": truncated" : ": no such file"));
  }
}

// A plan that puts more on a node than its memory_limit_mb allows is refused when the node
// starts, naming the node, the limit and each actor's parts, before anything is loaded.
TEST(Cli, PlanOverANodesMemoryLimitIsRefusedAtStart) {
  TROUPE_SHARED_OR_SKIP(shared);
  const fs::path conf = temp_dir() / "over-limit.toml";
  std::ofstream(conf) << "[model]\npath = \"" << shared
                      << "/models/stories260K/stories260K.gguf\"\n"
                         "[cluster]\ntoken = \"t\"\nhead = \"a\"\n"
                         "[[node]]\nname = \"a\"\naddress = \"127.0.0.1:1\"\nmemory_limit_mb = 1\n"
                         "[[node]]\nname = \"b\"\naddress = \"127.0.0.1:2\"\n"
                         "[stages]\nkv_blocks = 256\n"
                         "[[stage]]\nlayers = [0, 3]\nnode = \"a\"\n"
                         "[[stage]]\nlayers = [3, 5]\nnode = \"b\"\n";
  // Every node of the cluster refuses it alike. (Without the check a daemon would wait for its
  // peers: --ready-timeout bounds that wait.)
  for (const char* name : {"a", "b"}) {
    const auto r = troupe({std::string(name) == "a" ? "serve" : "node", "--config", conf.string(),
                           "--name", name, "--ready-timeout", "5"});
    EXPECT_EQ(r.rc, 2) << r.err;
    expect_one_line_error(r, conf.string() + ": node 'a': the plan places ");
    EXPECT_NE(r.err.find("on it, over its memory_limit_mb = 1 (1.0 MB): stage 0 ("),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find(" of weights, "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(" of KV pool"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("stage 1"), std::string::npos) << r.err;  // b's stage is not a's
  }
}

TEST(Cli, CorruptModelFileIsNamed) {
  const fs::path p = temp_dir() / "corrupt.gguf";
  {
    std::ofstream f(p, std::ios::binary);
    f << "GGUF\x03";  // truncated header
  }
  expect_one_line_error(troupe({"generate", "--model", p.string(), "--prompt-tokens", "1"}),
                        p.string() + ": truncated");
  {
    std::ofstream f(p, std::ios::binary);
    f << "this is not a model file at all, just text";
  }
  expect_one_line_error(troupe({"inspect", p.string()}), "not a GGUF file");
}

TEST(Cli, GenerateJsonMatchesGoldenGreedyTokens) {
  TROUPE_SHARED_OR_SKIP(shared);
  const auto j = nlohmann::json::parse(
      testing::read_text_file(shared + "/golden/stories260K/once_upon_a_time/case.json"));
  const auto prompt = j.at("prompt_tokens").get<std::vector<int32_t>>();
  const auto greedy = j.at("greedy_tokens").get<std::vector<int32_t>>();
  std::string csv;
  for (int32_t t : prompt) csv += (csv.empty() ? "" : ",") + std::to_string(t);
  CliRun r = troupe({"generate", "--model", shared + "/models/stories260K/stories260K.gguf",
                     "--prompt-tokens", csv, "--max-tokens", std::to_string(greedy.size()),
                     "--json", "--ignore-eos"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto out = nlohmann::json::parse(r.out);
  EXPECT_EQ(out.at("prompt_tokens").get<std::vector<int32_t>>(), prompt);
  // Every recorded margin of this case is far above the tolerance bound, so all tokens must match.
  EXPECT_EQ(out.at("tokens").get<std::vector<int32_t>>(), greedy);
  EXPECT_FALSE(out.at("text").get<std::string>().empty());
}

// --grammar and --json-schema: the output is what they allow, alone and through the actor
// system (--stages 2) alike, token for token; bad grammar files are one-line errors.
TEST(Cli, GrammarAndJsonSchemaConstrainTheOutput) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string model = shared + "/models/stories260K/stories260K.gguf";
  const fs::path gbnf = temp_dir() / "hero.gbnf";
  std::ofstream(gbnf) << "root ::= \"{\\\"hero\\\": \\\"\" [A-Z] [a-z]{2,8} \"\\\"}\"\n";
  const fs::path schema = temp_dir() / "person.json";
  std::ofstream(schema) << R"({"type": "object", "properties": {"name": {"type": "string",
      "maxLength": 10}, "happy": {"type": "boolean"}}, "required": ["name", "happy"]})";
  for (int seed = 1; seed <= 3; ++seed) {
    CliRun r = troupe({"generate", "--model", model, "--prompt", "Once upon a time", "--grammar",
                       gbnf.string(), "--temperature", "0.9", "--seed", std::to_string(seed),
                       "--max-tokens", "40", "--json"});
    ASSERT_EQ(r.rc, 0) << r.err;
    const auto out = nlohmann::json::parse(r.out);
    const auto v = nlohmann::json::parse(out.at("text").get<std::string>());
    const std::string hero = v.at("hero").get<std::string>();
    EXPECT_TRUE(hero.size() >= 3 && hero.size() <= 9 && std::isupper(hero[0])) << hero;
  }
  std::vector<std::vector<int32_t>> runs;
  for (bool staged : {false, true}) {
    std::vector<std::string> args = {"generate",
                                     "--model",
                                     model,
                                     "--prompt",
                                     "Once upon a time",
                                     "--json-schema",
                                     schema.string(),
                                     "--temperature",
                                     "0.8",
                                     "--seed",
                                     "4",
                                     "--max-tokens",
                                     "80",
                                     "--json"};
    if (staged) args.insert(args.end(), {"--stages", "2"});
    CliRun r = troupe(args);
    ASSERT_EQ(r.rc, 0) << r.err;
    const auto out = nlohmann::json::parse(r.out);
    const auto v = nlohmann::json::parse(out.at("text").get<std::string>());
    EXPECT_TRUE(v.at("name").is_string() && v.at("happy").is_boolean() && v.size() == 2)
        << v.dump();
    runs.push_back(out.at("tokens").get<std::vector<int32_t>>());
  }
  EXPECT_EQ(runs[0], runs[1]);
  expect_one_line_error(
      troupe({"generate", "--model", model, "--prompt", "x", "--grammar", schema.string()}),
      "grammar line 1: expected a rule name");
  expect_one_line_error(
      troupe({"generate", "--model", model, "--prompt", "x", "--json-schema", gbnf.string()}),
      "is not JSON");
  expect_one_line_error(troupe({"generate", "--model", model, "--prompt", "x", "--grammar",
                                gbnf.string(), "--json-schema", schema.string()}),
                        "give one of --grammar and --json-schema");
  expect_one_line_error(
      troupe({"generate", "--model", model, "--prompt", "x", "--grammar", "/nonexistent.gbnf"}),
      "cannot read /nonexistent.gbnf");
  expect_one_line_error(troupe({"generate", "--model", model, "--prompt", "x", "--grammar",
                                gbnf.string(), "--ignore-eos"}),
                        "ignore_eos cannot be used with a grammar");
}

// An image prompt from the command line: the PNG, the mmproj and the text with its media
// marker give the reference's greedy tokens (llama.cpp libmtmd, golden/vlm).
TEST(Cli, ImagePromptGeneratesGoldenGreedyTokens) {
  TROUPE_SHARED_OR_SKIP(shared);
  for (const char* c : {"checker_50x40", "circles_64x64", "gradient_32x32"}) {
    SCOPED_TRACE(c);
    const std::string dir = shared + "/golden/vlm/llava-tiny__" + c + "__look";
    const auto j = nlohmann::json::parse(testing::read_text_file(dir + "/case.json"));
    const auto greedy = j.at("greedy_tokens").get<std::vector<int32_t>>();
    CliRun r = troupe({"generate", "--model", shared + "/models/synth/llava-tiny/model.gguf",
                       "--mmproj", shared + "/models/synth/llava-tiny/mmproj.gguf", "--image",
                       shared + "/golden/vlm/images/" + c + ".png", "--prompt",
                       j.at("prompt_text").get<std::string>(), "--max-tokens",
                       std::to_string(greedy.size()), "--json", "--ignore-eos"});
    ASSERT_EQ(r.rc, 0) << r.err;
    const auto out = nlohmann::json::parse(r.out);
    // Every recorded margin is far above the tolerance bound: all tokens must match.
    EXPECT_EQ(out.at("tokens").get<std::vector<int32_t>>(), greedy);
    const auto prompt = out.at("prompt_tokens").get<std::vector<int32_t>>();
    EXPECT_EQ(std::count(prompt.begin(), prompt.end(), -1), 16) << "image positions";
    // The same through the actor system: two pipeline stages, the image spliced by the first.
    CliRun staged =
        troupe({"generate", "--model", shared + "/models/synth/llava-tiny/model.gguf", "--mmproj",
                shared + "/models/synth/llava-tiny/mmproj.gguf", "--image",
                shared + "/golden/vlm/images/" + c + ".png", "--prompt",
                j.at("prompt_text").get<std::string>(), "--max-tokens",
                std::to_string(greedy.size()), "--json", "--ignore-eos", "--stages", "2"});
    ASSERT_EQ(staged.rc, 0) << staged.err;
    EXPECT_EQ(nlohmann::json::parse(staged.out).at("tokens").get<std::vector<int32_t>>(), greedy);
    // The same pair as one Hugging Face LLaVA directory, which is its own --mmproj.
    testing::TempDir hf;
    ASSERT_NO_FATAL_FAILURE(testing::write_llava_hf_twin(shared, hf));
    for (const char* stages : {"1", "2"}) {
      CliRun h = troupe(
          {"generate", "--model", hf.path(), "--image", shared + "/golden/vlm/images/" + c + ".png",
           "--prompt", j.at("prompt_text").get<std::string>(), "--max-tokens",
           std::to_string(greedy.size()), "--json", "--ignore-eos", "--stages", stages});
      ASSERT_EQ(h.rc, 0) << h.err;
      EXPECT_EQ(nlohmann::json::parse(h.out).at("tokens").get<std::vector<int32_t>>(), greedy)
          << "Hugging Face form, " << stages << " stage(s)";
    }
  }
}

// A Gemma 3 pair from troupe synth: the image is bracketed by <start_of_image>/<end_of_image>
// and prefilled as one non-causal step, alone and through two pipeline stages alike.
TEST(Cli, Gemma3ImagePromptRunsAloneAndStagedAlike) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string model = (temp_dir() / "g3.gguf").string();
  const std::string mmproj = (temp_dir() / "g3-mmproj.gguf").string();
  ASSERT_EQ(troupe({"synth", "--arch", "gemma3", "--out", model}).rc, 0);
  CliRun mm = troupe({"synth", "--arch",       "clip", "--projector", "gemma3", "--image-size",
                      "32",    "--patch-size", "4",    "--n-embd",    "64",     "--n-ff",
                      "128",   "--n-layer",    "2",    "--n-head",    "4",      "--proj-dim",
                      "128",   "--merge",      "2",    "--out",       mmproj});
  ASSERT_EQ(mm.rc, 0) << mm.err;
  std::vector<std::vector<int32_t>> outs;
  for (const char* stages : {"1", "2"}) {
    CliRun r =
        troupe({"generate", "--model", model, "--mmproj", mmproj, "--image",
                shared + "/golden/vlm/images/checker_50x40.png", "--prompt", "Look: <__media__> so",
                "--max-tokens", "6", "--json", "--ignore-eos", "--stages", stages});
    ASSERT_EQ(r.rc, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    const auto prompt = j.at("prompt_tokens").get<std::vector<int32_t>>();
    const auto first = std::find(prompt.begin(), prompt.end(), -1);
    ASSERT_NE(first, prompt.end());
    EXPECT_EQ(std::count(prompt.begin(), prompt.end(), -1), 16);  // (32 / 4 / 2)^2 rows
    EXPECT_NE(*(first - 1), -1);
    EXPECT_NE(*(first + 16), -1);
    EXPECT_NE(*(first - 1), *(first + 16)) << "start and end of image are different tokens";
    outs.push_back(j.at("tokens").get<std::vector<int32_t>>());
  }
  EXPECT_EQ(outs[0], outs[1]);
  EXPECT_EQ(outs[0].size(), 6u);
}

TEST(Cli, ImagePromptErrorsAreOneLine) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string model = shared + "/models/synth/llava-tiny/model.gguf";
  const std::string mmproj = shared + "/models/synth/llava-tiny/mmproj.gguf";
  const std::string png = shared + "/golden/vlm/images/circles_64x64.png";
  const fs::path text = temp_dir() / "not_an_image.png";
  {
    std::ofstream f(text);
    f << "hello";
  }
  expect_one_line_error(troupe({"generate", "--model", model, "--mmproj", mmproj, "--image",
                                text.string(), "--prompt", "x"}),
                        "not_an_image.png: unknown image format");
  expect_one_line_error(troupe({"generate", "--model", model, "--mmproj", mmproj, "--image",
                                "/nonexistent.png", "--prompt", "x"}),
                        "/nonexistent.png");
  expect_one_line_error(troupe({"generate", "--model", model, "--image", png, "--prompt", "x"}),
                        "--image needs a vision encoder: --mmproj FILE");
  // A Hugging Face directory is its own vision encoder only when it has a vision tower.
  expect_one_line_error(troupe({"generate", "--model", shared + "/models/hf/stories260K", "--image",
                                png, "--prompt", "x"}),
                        "'LlamaForCausalLM' has no vision tower troupe reads");
  expect_one_line_error(troupe({"generate", "--model", mmproj, "--prompt", "x"}),
                        "pass it with --mmproj");
  expect_one_line_error(troupe({"generate", "--model", model, "--mmproj", mmproj, "--image", png,
                                "--prompt", "<__media__> and <__media__>"}),
                        "2 image markers");
  expect_one_line_error(
      troupe({"generate", "--model", shared + "/models/stories260K/stories260K.gguf", "--mmproj",
              mmproj, "--image", png, "--prompt", "x"}),
      "do not belong together");
  expect_one_line_error(troupe({"generate", "--model", model, "--mmproj",
                                shared + "/models/tinygemma3-mmproj/mmproj-tinygemma3.gguf",
                                "--image", png, "--prompt", "x"}),
                        "no <start_of_image> / <end_of_image> tokens");
  expect_one_line_error(troupe({"generate", "--model", model, "--mmproj", mmproj, "--image", png,
                                "--prompt", "x", "--head", "127.0.0.1:9"}),
                        "--mmproj is not for a remote cluster");
  expect_one_line_error(troupe({"generate", "--image", text.string(), "--prompt", "x", "--head",
                                "127.0.0.1:9", "--token", "t"}),
                        "not_an_image.png: unknown image format");
  expect_one_line_error(
      troupe({"generate", "--model", model, "--image", png, "--prompt", "x", "--stages", "2"}),
      "--image needs a vision encoder: --mmproj FILE, or [model] mmproj in");
  expect_one_line_error(troupe({"generate", "--model", model, "--mmproj", mmproj, "--image", png,
                                "--prompt-tokens", "1,2", "--stages", "2"}),
                        "--image needs a text --prompt");
}

TEST(Cli, TextPromptTokenizesLikeReference) {
  TROUPE_SHARED_OR_SKIP(shared);
  const auto j = nlohmann::json::parse(
      testing::read_text_file(shared + "/golden/stories260K/once_upon_a_time/case.json"));
  CliRun r = troupe({"tokenize", "--model", shared + "/models/stories260K/stories260K.gguf",
                     "--text", j.at("prompt_text").get<std::string>()});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out).get<std::vector<int32_t>>(),
            j.at("prompt_tokens").get<std::vector<int32_t>>());
}

TEST(Cli, EvalWritesReferenceLogits) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string cd = shared + "/golden/mixtral-moe/the_little_dog";
  const auto j = nlohmann::json::parse(testing::read_text_file(cd + "/case.json"));
  auto toks = j.at("prompt_tokens").get<std::vector<int32_t>>();
  for (int32_t t : j.at("greedy_tokens").get<std::vector<int32_t>>()) toks.push_back(t);
  std::string csv;
  for (int32_t t : toks) csv += (csv.empty() ? "" : ",") + std::to_string(t);
  const fs::path out = temp_dir() / "logits.f32";
  CliRun r = troupe({"eval", "--model", shared + "/models/synth/mixtral-moe/model.gguf", "--tokens",
                     csv, "--logits-out", out.string(), "--threads", "2"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto got = testing::read_f32_file(out.string());
  const auto ref = testing::read_f32_file(cd + "/logits.f32");
  ASSERT_EQ(got.size(), ref.size());
  const size_t V = static_cast<size_t>(j.at("vocab").get<int>());
  for (size_t p = 0; p < toks.size(); ++p) {
    double mx = 0, d = 0;
    for (size_t i = 0; i < V; ++i) {
      mx = std::max(mx, std::fabs(static_cast<double>(ref[p * V + i])));
      d = std::max(d, std::fabs(static_cast<double>(got[p * V + i]) - ref[p * V + i]));
    }
    EXPECT_LE(d, 1e-4 * mx) << "position " << p;
  }
}

// --weights: eval reads the file mapping unless asked for a copy in memory, which tiles the
// matrices this CPU's kernels read fastest in tiles. Where this SIMD level tiles Q4_K and Q6_K
// (compute::tiled_weight_types: AVX-512 VNNI, AVX2), its kernels read the mapped rows with the
// tiles' arithmetic: the copy's logits are the mapped model's, bit for bit. A bad value is a
// one-line error.
TEST(Cli, EvalCopiedWeightsGiveTheMappedLogits) {
  const fs::path m = temp_dir() / "q4_k_m.gguf";
  CliRun s = troupe({"synth", "--arch", "llama", "--out", m.string(), "--n-embd", "256",
                     "--n-layer", "2", "--n-head", "4", "--n-head-kv", "2", "--n-ff", "512",
                     "--dtype", "q4_k_m", "--seed", "7"});
  ASSERT_EQ(s.rc, 0) << s.err;
  const std::string toks = "1,40,41,42,100,7,9,200,33,65,66,67";
  std::vector<float> logits[2];
  const char* storage[2] = {"map", "memory"};
  for (int i = 0; i < 2; ++i) {
    const fs::path out = temp_dir() / (std::string("w-") + storage[i] + ".f32");
    CliRun r = troupe({"eval", "--model", m.string(), "--tokens", toks, "--logits-out",
                       out.string(), "--weights", storage[i], "--threads", "2"});
    ASSERT_EQ(r.rc, 0) << r.err;
    logits[i] = testing::read_f32_file(out.string());
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  ASSERT_FALSE(logits[0].empty());
  // Elsewhere (the portable path, AVX-512 without VNNI) the copy keeps these in rows: the same
  // kernels, so the same bits as well.
  const model::TileTypes tiled = compute::tiled_weight_types();
  EXPECT_EQ(std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * sizeof(float)), 0)
      << compute::simd_level() << (tiled.has(model::GgmlType::kQ4_K) ? ", tiled" : ", rows")
      << ": the copied weights changed the logits";
  expect_one_line_error(troupe({"eval", "--model", m.string(), "--tokens", "1,2", "--logits-out",
                                (temp_dir() / "x.f32").string(), "--weights", "disk"}),
                        "--weights");
}

// --kv-type: generate and eval take f32, f16 or bf16; a half-precision cache changes the logits
// by its rounding only (within issue #2's F16 tolerance of the f32 cache's), generates alike
// alone and through pipeline stages, and a bad value or a remote cluster is a one-line error.
TEST(Cli, KvTypeOptionIsCheckedAndApplied) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string m = shared + "/models/stories260K/stories260K.gguf";
  const fs::path f32 = temp_dir() / "kv-f32.f32", f16 = temp_dir() / "kv-f16.f32";
  const std::string toks = "1,403,407,261,378,454,30,32,49,63,70,90,301,17,388,2";
  for (const auto& [type, out] : {std::pair{"f32", f32}, std::pair{"f16", f16}}) {
    CliRun r = troupe(
        {"eval", "--model", m, "--tokens", toks, "--logits-out", out.string(), "--kv-type", type});
    ASSERT_EQ(r.rc, 0) << r.err;
  }
  const auto a = testing::read_f32_file(f32.string()), b = testing::read_f32_file(f16.string());
  ASSERT_EQ(a.size(), b.size());
  double mx = 0, d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    mx = std::max(mx, std::fabs(static_cast<double>(a[i])));
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  EXPECT_GT(d, 0.0) << "f16 rounding changed nothing";
  EXPECT_LE(d, 1e-2 * mx);
  auto gen = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {"generate",         "--model",      m,    "--prompt",
                                  "Once upon a time", "--max-tokens", "24", "--json"};
    a.insert(a.end(), extra.begin(), extra.end());
    return troupe(a);
  };
  for (const char* type : {"f16", "bf16"}) {
    const CliRun alone = gen({"--kv-type", type});
    const CliRun staged = gen({"--kv-type", type, "--stages", "2"});
    ASSERT_EQ(alone.rc, 0) << alone.err;
    ASSERT_EQ(staged.rc, 0) << staged.err;
    EXPECT_EQ(nlohmann::json::parse(alone.out).at("tokens"),
              nlohmann::json::parse(staged.out).at("tokens"))
        << type;
  }
  for (const std::string bad : {"fp16", "F16", "", "int8"})
    expect_one_line_error(gen({"--kv-type", bad}),
                          "--kv-type must be f32, f16 or bf16, got '" + bad + "'");
  expect_one_line_error(
      troupe({"generate", "--head", "127.0.0.1:9", "--prompt", "x", "--kv-type", "f16"}),
      "--kv-type is not for a running cluster (--head)");
}

TEST(Cli, InspectDescribesModel) {
  TROUPE_SHARED_OR_SKIP(shared);
  CliRun r = troupe({"inspect", shared + "/models/synth/deepseek2/model.gguf"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("architecture: deepseek2 (mixture of experts)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MLA: q_lora 64, kv_lora 32"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("blk.0.attn_k_b.weight"), std::string::npos);
}

// A vision encoder's shape, from an mmproj GGUF and from a Hugging Face LLaVA directory alike
// (beside its language model there).
TEST(Cli, InspectDescribesVisionEncoders) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string line =
      "vision encoder: mlp projector, 2 of 2 blocks run, 32 px images in 8 px patches, width 64 "
      "(4 heads, ffn 128), 16 image tokens of width 128\n";
  CliRun g = troupe({"inspect", shared + "/models/synth/llava-tiny/mmproj.gguf"});
  ASSERT_EQ(g.rc, 0) << g.err;
  EXPECT_NE(g.out.find(line), std::string::npos) << g.out;
  testing::TempDir hf;
  ASSERT_NO_FATAL_FAILURE(testing::write_llava_hf_twin(shared, hf));
  CliRun h = troupe({"inspect", hf.path()});
  ASSERT_EQ(h.rc, 0) << h.err;
  EXPECT_NE(h.out.find(line), std::string::npos) << h.out;
  EXPECT_NE(h.out.find("architecture: llama"), std::string::npos) << h.out;
  // A text-only directory has no such line.
  CliRun t = troupe({"inspect", shared + "/models/hf/stories260K"});
  ASSERT_EQ(t.rc, 0) << t.err;
  EXPECT_EQ(t.out.find("vision encoder"), std::string::npos) << t.out;
}

TEST(Cli, InspectShowsRopeScaling) {
  TROUPE_SHARED_OR_SKIP(shared);
  testing::TempDir dir;
  const std::string path = testing::edited_gguf(
      dir, "yarn.gguf", shared + "/models/synth/deepseek2/model.gguf", [](model::GgufWriter& w) {
        w.set_string("deepseek2.rope.scaling.type", "yarn");
        w.set_f32("deepseek2.rope.scaling.factor", 40);
        w.set_u32("deepseek2.rope.scaling.original_context_length", 4096);
        w.set_f32("deepseek2.rope.scaling.yarn_log_multiplier", 0.1f);
      });
  CliRun r = troupe({"inspect", path});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("rope scaling yarn factor 40 (original context 4096, beta 32/1, cos/sin x "
                       "1), attention scale x 1.87"),
            std::string::npos)
      << r.out;
}

// Phi-3 from the command line: synthesized (Phi-4-mini's layout), described with both sets of
// LongRoPE factors, and run in one process and in two stages with the factors of the same
// context (a plan's max_model_len of 2048 and a generation of 2048 positions: the long ones).
// Sampled (temperature 1, seed 3), so that the short factors of an 11-position generation give
// other tokens (the sixth here), not only other logits.
TEST(Cli, Phi3SynthesizesInspectsAndGenerates) {
  const std::string path = (temp_dir() / "phi3.gguf").string();
  ASSERT_EQ(troupe({"synth", "--arch", "phi3", "--n-ctx", "4096", "--out", path}).rc, 0);
  CliRun r = troupe({"inspect", path});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("rope neox n_rot 12"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cos/sin x 1.09545"), std::string::npos)
      << r.out;  // sqrt(1 + ln 4 / ln 1024)
  EXPECT_NE(r.out.find("per-pair divisors 1..1.25, LongRoPE: long divisors 1..8.5 for a context "
                       "above 1024 positions"),
            std::string::npos)
      << r.out;
  auto gen = [&](const std::string& max_tokens, std::vector<std::string> extra) {
    std::vector<std::string> args = {"generate",      "--model", path,           "--prompt-tokens",
                                     "1,2,3",         "--json",  "--max-tokens", max_tokens,
                                     "--temperature", "1",       "--seed",       "3"};
    args.insert(args.end(), extra.begin(), extra.end());
    return troupe(args);
  };
  const CliRun staged = gen("8", {"--stages", "2"});  // max_model_len 2048 > 1024: long
  const CliRun alone = gen("2045", {});               // 3 + 2045 positions > 1024: long
  const CliRun short_alone = gen("8", {});            // 11 positions: short
  for (const CliRun* c : {&staged, &alone, &short_alone}) ASSERT_EQ(c->rc, 0) << c->err;
  const auto first8 = [](const CliRun& c) {
    std::vector<int> t = nlohmann::json::parse(c.out).at("tokens");
    t.resize(std::min<size_t>(t.size(), 8));
    return t;
  };
  ASSERT_EQ(first8(staged).size(), 8u);
  EXPECT_EQ(first8(staged), first8(alone));
  EXPECT_NE(first8(short_alone), first8(alone));
}

// Llama 4 from the command line: synthesized, described (its layer kinds and routing), run.
TEST(Cli, Llama4SynthesizesInspectsAndGenerates) {
  const std::string path = (temp_dir() / "llama4.gguf").string();
  CliRun s = troupe({"synth", "--arch", "llama4", "--n-layer", "8", "--out", path});
  ASSERT_EQ(s.rc, 0) << s.err;
  CliRun r = troupe({"inspect", path});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("architecture: llama4 (mixture of experts)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("attention layers: 6 in chunks of 8192; 2 without rope; 6 norm q/k "
                       "without weights; queries without rope x (1 + 0.1 ln(1 + floor((pos + 1) "
                       "/ 8192)))"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("4 of 8 layers MoE; the router's weight scales the expert's input"),
            std::string::npos)
      << r.out;
  CliRun g =
      troupe({"generate", "--model", path, "--prompt", "Once upon", "--max-tokens", "6", "--json"});
  ASSERT_EQ(g.rc, 0) << g.err;
  EXPECT_EQ(nlohmann::json::parse(g.out)["tokens"].size(), 6u) << g.out;
  expect_one_line_error(
      troupe({"synth", "--arch", "llama4", "--moe-layer-step", "9", "--out", path + ".bad"}),
      "--moe-layer-step must be between 1 and --n-layer");
  expect_one_line_error(
      troupe({"synth", "--arch", "gemma3", "--moe-layer-step", "2", "--out", path + ".bad"}),
      "--moe-layer-step does not apply to --arch gemma3");
}

TEST(Cli, Qwen3NextSynthesizesInspectsGeneratesAndEvaluates) {
  const std::string path = (temp_dir() / "qwen3next.gguf").string();
  CliRun s = troupe({"synth", "--arch", "qwen3next", "--n-layer", "8", "--out", path});
  ASSERT_EQ(s.rc, 0) << s.err;
  CliRun r = troupe({"inspect", path});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("architecture: qwen3next (mixture of experts)"), std::string::npos) << r.out;
  // Per sequence: 6 layers x (3 x 256 convolution inputs + 4 heads x 32 x 32) floats.
  EXPECT_NE(r.out.find("attention layers: 6 Gated DeltaNet (linear; 2 key heads of 32, 4 value "
                       "heads of 32, conv 4; a state of 114.00 KiB per sequence); 2 with a "
                       "sigmoid output gate"),
            std::string::npos)
      << r.out;
  CliRun g =
      troupe({"generate", "--model", path, "--prompt", "Once upon", "--max-tokens", "6", "--json"});
  ASSERT_EQ(g.rc, 0) << g.err;
  const nlohmann::json j = nlohmann::json::parse(g.out);
  EXPECT_EQ(j["tokens"].size(), 6u) << g.out;
  // Through the actor system with two stages, each keeping its layers' states: the same tokens.
  CliRun g2 = troupe({"generate", "--model", path, "--prompt", "Once upon", "--max-tokens", "6",
                      "--json", "--stages", "2"});
  ASSERT_EQ(g2.rc, 0) << g2.err;
  EXPECT_EQ(nlohmann::json::parse(g2.out)["tokens"], j["tokens"]) << g2.out;
  const std::string logits = (temp_dir() / "qwen3next.logits").string();
  CliRun e = troupe({"eval", "--model", path, "--tokens", "1,2,3,4,5", "--logits-out", logits});
  ASSERT_EQ(e.rc, 0) << e.err;
  EXPECT_EQ(std::filesystem::file_size(logits), 5u * 4u * 512u);
  // Qwen3.5 as llama.cpp converts it: its value heads tiled.
  const std::string q35 = (temp_dir() / "qwen35moe.gguf").string();
  ASSERT_EQ(troupe({"synth", "--arch", "qwen35moe", "--out", q35}).rc, 0);
  CliRun r35 = troupe({"inspect", q35});
  ASSERT_EQ(r35.rc, 0) << r35.err;
  EXPECT_NE(r35.out.find("architecture: qwen35moe (mixture of experts)"), std::string::npos)
      << r35.out;
  EXPECT_NE(r35.out.find("4 value heads of 32 in tiled order, conv 4"), std::string::npos)
      << r35.out;
  expect_one_line_error(
      troupe({"synth", "--arch", "qwen3next", "--linear-v-heads", "3", "--out", path + ".bad"}),
      "--linear-v-heads 3 is not a multiple of --linear-k-heads 2");
  expect_one_line_error(
      troupe({"synth", "--arch", "llama", "--linear-k-heads", "2", "--out", path + ".bad"}),
      "--linear-k-heads does not apply to --arch llama");
}

TEST(Cli, Fp8CheckpointInspectsAndGeneratesLikeItsExactTwin) {
  TROUPE_SHARED_OR_SKIP(shared);
  const testing::Fp8Copy copy(shared + "/models/hf/stories260K", 128, 128);
  CliRun r = troupe({"inspect", copy.fp8_path()});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("; f8_e4m3 (scale per 128 x 128): 36 ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("; f32: 11 ("), std::string::npos) << r.out;  // the norms
  const std::vector<std::string> gen = {"--prompt", "Once upon a time", "--max-tokens", "24",
                                        "--json"};
  auto args = [&](const std::string& model) {
    std::vector<std::string> a = {"generate", "--model", model};
    a.insert(a.end(), gen.begin(), gen.end());
    return a;
  };
  CliRun f = troupe(args(copy.fp8_path())), t = troupe(args(copy.twin_path()));
  ASSERT_EQ(f.rc, 0) << f.err;
  ASSERT_EQ(t.rc, 0) << t.err;
  EXPECT_EQ(nlohmann::json::parse(f.out).at("tokens"), nlohmann::json::parse(t.out).at("tokens"));
}

TEST(Cli, Int4CheckpointInspectsAndGeneratesLikeItsExactTwin) {
  TROUPE_SHARED_OR_SKIP(shared);
  const testing::Int4Copy copy(shared + "/models/hf/stories260K");
  CliRun r = troupe({"inspect", copy.int4_path()});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("; i4_packed (bf16 scale per 32 columns): " +
                       std::to_string(copy.quantized()) + " ("),
            std::string::npos)
      << r.out;
  auto args = [&](const std::string& model) {
    return std::vector<std::string>{"generate",         "--model",      model, "--prompt",
                                    "Once upon a time", "--max-tokens", "24",  "--json"};
  };
  CliRun q = troupe(args(copy.int4_path())), t = troupe(args(copy.twin_path()));
  ASSERT_EQ(q.rc, 0) << q.err;
  ASSERT_EQ(t.rc, 0) << t.err;
  EXPECT_EQ(nlohmann::json::parse(q.out).at("tokens"), nlohmann::json::parse(t.out).at("tokens"));
}

TEST(Cli, DemoSynthesizesAndGenerates) {
  const fs::path cache = temp_dir() / "cache";
  CliRun r = troupe({"demo", "--cache-dir", cache.string(), "--max-tokens", "8", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto out = nlohmann::json::parse(r.out);
  EXPECT_EQ(out.at("tokens").size(), 8u);
  EXPECT_TRUE(fs::exists(cache / "demo-llama-v1.gguf"));
  // A second run reuses the cached model and, with the same seed, gives the same tokens.
  CliRun r2 = troupe({"demo", "--cache-dir", cache.string(), "--max-tokens", "8", "--json"});
  ASSERT_EQ(r2.rc, 0) << r2.err;
  EXPECT_EQ(nlohmann::json::parse(r2.out).at("tokens"), out.at("tokens"));
}

}  // namespace
}  // namespace troupe
