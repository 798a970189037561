// The benchmark tools (bench/) run end to end on tiny inputs: every row they promise comes out
// with finite figures, and a bad option gets one line on stderr and exit code 2. All twelve but
// gpu_bench (a CUDA build's device check) run here. No figure is judged (the machines are noisy;
// docs/benchmarks.md holds the measurements): a tool that fails, hangs or leaves rows out is what
// these catch. engine_bench had failed at --prefill 4 --decode 2 --batch 16 (its KV pool was
// sized short), and matmul_bench had mapped a huge page per copy of a small matrix until it ran
// out of memory.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_support.h"

namespace troupe {
namespace {

testing::ProcessRun bench(const std::string& tool, const std::vector<std::string>& args) {
  static const testing::TempDir scratch;
  return testing::run_process(testing::binary_dir() + "/bench/" + tool, args, scratch.path());
}

std::vector<std::vector<std::string>> rows_of(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::vector<std::string> row;
    for (std::string w; words >> w;) row.push_back(w);
    rows.push_back(row);
  }
  return rows;
}

// `s` as a number that is finite and >= 0 (a timing or a rate, printed with few decimals: a tiny
// matrix's time may print as 0.000), or -1.
double number(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  return end != s.c_str() && *end == '\0' && std::isfinite(v) && v >= 0 ? v : -1;
}

void expect_usage_error(const testing::ProcessRun& r, const std::string& what) {
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_EQ(testing::count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find(what), std::string::npos) << "stderr: " << r.err;
}

// engine_bench's table: (threads, weights, phase) -> tokens/s, for the rows whose figure is a
// number > 0.
std::map<std::string, double> engine_rows(const std::string& out) {
  std::map<std::string, double> rows;
  for (const auto& r : rows_of(out)) {
    if (r.size() < 5 || (r[2].rfind("decode@", 0) != 0 && r[2] != "prefill")) continue;
    if (const double tps = number(r[3]); tps > 0) rows[r[0] + " " + r[1] + " " + r[2]] = tps;
  }
  return rows;
}

TEST(BenchTools, EngineBenchTimesEveryPhase) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string model = shared + "/models/stories260K/stories260K.gguf";
  const auto r = bench("engine_bench", {model, "--threads", "1,2", "--prefill", "4", "--decode",
                                        "2", "--batch", "16", "--runs", "1", "--weights", "both"});
  ASSERT_EQ(r.rc, 0) << r.err << r.out;
  const auto rows = engine_rows(r.out);
  for (const char* threads : {"1", "2"})
    for (const char* weights : {"map", "memory"})
      for (const char* phase : {"prefill", "decode@1", "decode@16"})
        EXPECT_EQ(rows.count(std::string(threads) + " " + weights + " " + phase), 1u)
            << threads << " threads, " << weights << ", " << phase << " missing:\n"
            << r.out;
  EXPECT_NE(r.out.find("weights read per decode token"), std::string::npos) << r.out;
}

// A Mixture-of-Experts model, KV stored as f16, and the packed-int4 and FP8 requantizations.
TEST(BenchTools, EngineBenchRunsMoeHalfKvAndInt4) {
  TROUPE_SHARED_OR_SKIP(shared);
  const auto moe =
      bench("engine_bench", {shared + "/models/synth/mixtral-moe/model.gguf", "--threads", "2",
                             "--prefill", "8", "--decode", "3", "--batch", "5", "--runs", "2",
                             "--weights", "memory", "--kv-type", "f16", "--context", "20"});
  ASSERT_EQ(moe.rc, 0) << moe.err << moe.out;
  auto rows = engine_rows(moe.out);
  for (const char* phase : {"prefill", "decode@1", "decode@5"})
    EXPECT_EQ(rows.count(std::string("2 memory ") + phase), 1u) << phase << ":\n" << moe.out;
  EXPECT_NE(moe.out.find("KV cache f16"), std::string::npos) << moe.out;

  // Requantized as a W4A16, an FP8 or an NVFP4 checkpoint loads; measured as loaded (map) and
  // as a copy.
  for (const std::string as : {"i4_packed", "f8_e4m3", "nvfp4"}) {
    const auto q =
        bench("engine_bench",
              {shared + "/models/stories260K/stories260K.gguf", "--threads", "1", "--prefill", "4",
               "--decode", "2", "--batch", "2", "--runs", "1", "--as", as, "--weights", "both"});
    ASSERT_EQ(q.rc, 0) << q.err << q.out;
    EXPECT_NE(q.out.find("to " + as), std::string::npos) << q.out;
    rows = engine_rows(q.out);
    for (const char* w : {"map", "memory"})
      for (const char* phase : {"prefill", "decode@1", "decode@2"})
        EXPECT_EQ(rows.count(std::string("1 ") + w + " " + phase), 1u) << phase << ":\n" << q.out;
  }
}

TEST(BenchTools, MatmulBenchTimesEveryType) {
  // Every type and layout it knows, on a small matrix and 1 MiB of copies: fast, but every
  // kernel's path through the bench.
  const auto r =
      bench("matmul_bench", {"--tokens", "2,16", "--shapes", "32x256", "--cold-mib", "1"});
  ASSERT_EQ(r.rc, 0) << r.err << r.out;
  const std::set<std::string> types = {
      "f32",         "f16",       "f16/t16",       "bf16",       "bf16/t16",       "f8_e4m3",
      "f8_e4m3/t16", "i4_packed", "i4_packed/t16", "q8_0",       "q4_0",           "q8_0/t16",
      "q4_0/t16",    "q4_1",      "q4_1/t16",      "q5_0",       "q5_0/t16",       "q5_1",
      "q5_1/t16",    "iq4_nl",    "mxfp4",         "fp4_packed", "fp4_packed/t16", "nvfp4",
      "nvfp4/t16",   "q2_K",      "q3_K",          "iq4_xs",     "q4_K",           "q4_K/t16",
      "q5_K",        "q5_K/t16",  "q6_K",          "q6_K/t16"};
  std::map<std::string, int> timed;  // type -> rows whose time and rate are numbers
  for (const auto& row : rows_of(r.out)) {
    if (row.size() < 7 || types.count(row[0]) == 0 || row[1] != "32x256") continue;
    if (number(row[4]) >= 0 && number(row[5]) >= 0) ++timed[row[0]];
  }
  for (const std::string& t : types)  // n_tok 1, 2, 16 with 1 and 2 threads
    EXPECT_EQ(timed[t], 6) << t << ":\n" << r.out;
  EXPECT_NE(r.out.find("memory read bandwidth:"), std::string::npos) << r.out;
}

TEST(BenchTools, AttentionMembwSamplerAndKvBlocksRun) {
  const auto att = bench("attention_bench", {"--context", "16,40", "--layers", "2", "--runs", "1",
                                             "--k-layout", "rows,dims"});
  ASSERT_EQ(att.rc, 0) << att.err << att.out;
  int att_rows = 0;
  for (const auto& row : rows_of(att.out))
    if (row.size() >= 5 && (row[0] == "f32" || row[0] == "f16" || row[0] == "bf16") &&
        number(row[3]) >= 0)
      ++att_rows;
  EXPECT_EQ(att_rows, 3 * 2 * 2) << att.out;  // kv types x key layouts x contexts

  const auto mla = bench("attention_bench", {"--context", "16", "--layers", "1", "--runs", "1",
                                             "--heads", "8", "--mla", "64,16", "--kv-type", "f16"});
  ASSERT_EQ(mla.rc, 0) << mla.err << mla.out;
  EXPECT_NE(mla.out.find("shape: MLA"), std::string::npos) << mla.out;

  const auto bw = bench("membw_bench", {"16", "5"});
  ASSERT_EQ(bw.rc, 0) << bw.err << bw.out;
  int bw_lines = 0;
  for (const auto& row : rows_of(bw.out)) {  // "read bandwidth, N thread(s): median X GB/s ..."
    const auto median = std::find(row.begin(), row.end(), "median");
    if (!row.empty() && row[0] == "read" && median != row.end() && median + 1 != row.end() &&
        number(*(median + 1)) > 0)
      ++bw_lines;
  }
  EXPECT_EQ(bw_lines, 2) << bw.out;

  const auto sampler = bench("sampler_bench", {});
  ASSERT_EQ(sampler.rc, 0) << sampler.err << sampler.out;
  EXPECT_NE(sampler.out.find("min-p 0.05:"), std::string::npos) << sampler.out;

  const auto kv = bench("kv_block_manager_bench", {});
  ASSERT_EQ(kv.rc, 0) << kv.err << kv.out;
  EXPECT_NE(kv.out.find("prefix hit rate"), std::string::npos) << kv.out;
}

// The lines of `text` that start with `prefix`.
int lines_starting(const std::string& text, const std::string& prefix) {
  int n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) n += line.rfind(prefix, 0) == 0;
  return n;
}

// The actor system in one process, daemons as processes, and the image encoders' placements.
TEST(BenchTools, ClusterBenchesRun) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string stories = shared + "/models/stories260K/stories260K.gguf";
  const auto cluster = bench("cluster_bench", {stories, "--gen", "4", "--prompt", "4",
                                               "--concurrency", "1,4", "--stages", "2"});
  ASSERT_EQ(cluster.rc, 0) << cluster.err << cluster.out;
  int cluster_rows = 0;
  for (const auto& row : rows_of(cluster.out))  // concurrency, tokens/s, wall s, ...
    if (row.size() >= 4 && (row[0] == "1" || row[0] == "4") && number(row[1]) > 0) ++cluster_rows;
  EXPECT_EQ(cluster_rows, 2) << cluster.out;
  EXPECT_NE(cluster.out.find("prefix cache on"), std::string::npos) << cluster.out;

  const auto multi =
      bench("multihost_bench", {stories, "--runs", "1", "--daemons", "2", "--concurrency", "1,4",
                                "--prompt", "8", "--gen", "8", "--timeout-s", "120"});
  ASSERT_EQ(multi.rc, 0) << multi.err << multi.out;
  EXPECT_EQ(lines_starting(multi.out, "| 2 daemons | 1 |"), 1) << multi.out;
  EXPECT_EQ(lines_starting(multi.out, "| 2 daemons | 4 |"), 1) << multi.out;

  const auto web = bench("http_bench", {stories, "--gen", "4", "--prompt", "4", "--concurrency",
                                        "1,3", "--rounds", "1"});
  ASSERT_EQ(web.rc, 0) << web.err << web.out;
  int web_rows = 0;
  for (const auto& row : rows_of(web.out))  // concurrency, tok/s direct, tok/s http, ...
    if (row.size() >= 7 && (row[0] == "1" || row[0] == "3") && number(row[1]) > 0 &&
        number(row[2]) > 0)
      ++web_rows;
  EXPECT_EQ(web_rows, 2) << web.out;

  const std::string llava = shared + "/models/synth/llava-tiny/";
  const auto enc = bench("encoder_bench", {"--model", llava + "model.gguf", "--mmproj",
                                           llava + "mmproj.gguf", "--runs", "1", "--images", "2"});
  ASSERT_EQ(enc.rc, 0) << enc.err << enc.out;
  int layouts = 0;
  for (const auto& row : rows_of(enc.out))  // layout, burst s, images/s, encoders' own s
    if (row.size() == 4 && (row[0] == "head" || row[0] == "remote" || row[0] == "spread") &&
        number(row[2]) > 0)
      ++layouts;
  EXPECT_EQ(layouts, 3) << enc.out;

  const auto chat = bench("image_chat_bench", {"--model", llava + "model.gguf", "--mmproj",
                                               llava + "mmproj.gguf", "--runs", "1"});
  ASSERT_EQ(chat.rc, 0) << chat.err << chat.out;
  EXPECT_EQ(lines_starting(chat.out, "  turn 1 (new picture)"), 1) << chat.out;
  EXPECT_EQ(lines_starting(chat.out, "  turn 2 / turn 1:"), 1) << chat.out;

  const auto vision = bench("vision_bench", {"--mmproj", llava + "mmproj.gguf", "--runs", "1"});
  ASSERT_EQ(vision.rc, 0) << vision.err << vision.out;
  EXPECT_EQ(lines_starting(vision.out, "  1 thread :"), 1) << vision.out;
  EXPECT_EQ(lines_starting(vision.out, "  2 threads:"), 1) << vision.out;
}

// UCX over TCP and shared memory between two processes, latency and bandwidth tables.
TEST(BenchTools, TransportBenchRuns) {
  const auto r = bench("transport_bench",
                       {"--reps", "1", "--round-trips", "10", "--bw-scale", "0.01", "--lat-sizes",
                        "8,4K", "--bw-sizes", "4K,64K", "--configs", "tcp,shm", "--no-perftest"});
  ASSERT_EQ(r.rc, 0) << r.err << r.out;
  for (const char* section :
       {"[tcp] latency", "[tcp] bandwidth", "[shm] latency", "[shm] bandwidth"})
    EXPECT_EQ(lines_starting(r.out, section), 1) << section << ":\n" << r.out;
  int rows = 0;
  for (const auto& row : rows_of(r.out))  // "| 8 B | 31.1 | ..."
    if (row.size() > 4 && row[0] == "|" && (row[2] == "B" || row[2] == "KiB") && number(row[4]) > 0)
      ++rows;
  EXPECT_EQ(rows, 8) << r.out;  // 2 sizes x (latency, bandwidth) x 2 configs
}

TEST(BenchTools, BadOptionsGiveOneLineErrors) {
  struct BadCall {
    const char* tool;
    std::vector<std::string> args;
    const char* what;  // in the one line on stderr
  };
  const BadCall calls[] = {
      {"engine_bench", {"m.gguf", "--prefill", "abc"}, "--prefill takes an integer in 1.."},
      {"engine_bench", {"m.gguf", "--threads", "1,,2"}, "--threads takes integers"},
      {"engine_bench", {"m.gguf", "--decode"}, "--decode needs a value"},
      {"engine_bench", {"m.gguf", "--frobnicate", "1"}, "unknown option '--frobnicate'"},
      {"engine_bench", {"--runs", "3"}, "usage: engine_bench MODEL"},
      {"engine_bench", {"m.gguf", "--as", "q4_0"}, "--as takes i4_packed, f8_e4m3 or nvfp4"},
      {"matmul_bench", {"--tokens", "0"}, "--tokens takes integers in 1..512"},
      {"matmul_bench", {"q9_9"}, "unknown type 'q9_9'"},
      {"matmul_bench", {"--shapes", "64x100"}, "--shapes wants ROWSxCOLS"},
      {"matmul_bench", {"--cold-mib", "-1"}, "--cold-mib takes an integer"},
      {"attention_bench", {"--mla", "512"}, "--mla takes LORA,ROPE"},
      {"attention_bench", {"--layers", "2x"}, "--layers takes an integer"},
      {"membw_bench", {"lots"}, "buffer_MiB takes an integer"},
      {"cluster_bench", {"m.gguf", "--concurrency", "1,four"}, "--concurrency takes integers"},
      {"cluster_bench", {"m.gguf", "--stages", "0"}, "--stages takes an integer in 1.."},
      {"encoder_bench", {"--images", "many"}, "--images takes an integer"},
      {"encoder_bench", {"--pictures", "3"}, "unknown option"},
      {"image_chat_bench", {"--layers", "-2"}, "--layers takes an integer"},
      {"vision_bench", {"--threads", "1,x"}, "--threads takes integers"},
      {"vision_bench", {"--frobnicate"}, "unknown option '--frobnicate'"},
      {"multihost_bench", {"m.gguf", "--gen", "lots"}, "--gen takes an integer"},
      {"multihost_bench", {"m.gguf", "--daemons", "2,99"}, "--daemons takes integers in 1..16"},
      {"multihost_bench", {"m.gguf", "--runs"}, "--runs needs a value"},
      {"transport_bench", {"--reps", "3x"}, "--reps takes an integer"},
      {"transport_bench", {"--bw-scale", "big"}, "--bw-scale takes a number"},
      {"transport_bench", {"--only", "latency"}, "--only takes lat or bw"},
      {"http_bench", {"m.gguf", "--rounds", "0"}, "--rounds takes an integer in 1.."},
      {"chat_template_bench", {"dir", "--turns", "0"}, "--turns and --runs must be at least 1"},
      {"grammar_bench", {"v.gguf", "--runs", "0"}, "--runs takes an integer >= 1"},
      {"grammar_bench", {}, "give at least one GGUF vocabulary"},
  };
  for (const BadCall& c : calls) {
    SCOPED_TRACE(c.tool);
    expect_usage_error(bench(c.tool, c.args), c.what);
  }
  const auto missing = bench("engine_bench", {"/nonexistent/m.gguf", "--runs", "1"});
  EXPECT_EQ(missing.rc, 1);
  EXPECT_NE(missing.err.find("/nonexistent/m.gguf"), std::string::npos) << missing.err;
  for (const char* tool :
       {"engine_bench", "matmul_bench", "attention_bench", "membw_bench", "cluster_bench",
        "encoder_bench", "image_chat_bench", "vision_bench", "multihost_bench", "transport_bench",
        "http_bench", "chat_template_bench", "grammar_bench"}) {
    const auto help = bench(tool, {"--help"});
    EXPECT_EQ(help.rc, 0) << tool;
    EXPECT_EQ(help.out.rfind(std::string("usage: ") + tool, 0), 0u) << tool << ": " << help.out;
  }
}

// Every template of tests/model/chat_templates compiled, rendered and timed, each text the same
// as jinja2's (the bench exits 1 otherwise).
TEST(BenchTools, ChatTemplateBenchRendersAsJinja2Does) {
  const auto r =
      bench("chat_template_bench",
            {testing::source_dir() + "/tests/model/chat_templates", "--turns", "3", "--runs", "2"});
  ASSERT_EQ(r.rc, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("chatml_tools.jinja"), std::string::npos) << r.out;
  // Without python's jinja2 it times troupe alone; CI has it (scripts/setup), so there the side
  // by side must run.
  const bool troupe_only = r.err.find("troupe only") != std::string::npos;
  if (std::getenv("CI") || testing::shared_required()) {
    EXPECT_FALSE(troupe_only) << r.err;
  }
  if (!troupe_only) {
    EXPECT_NE(r.out.find("yes"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find(" NO"), std::string::npos) << r.out;
  }
}

// Constrained decoding on a real vocabulary: the bench checks that the stage's way of building a
// mask (top masks and undecided tokens) gives the whole walk's mask at every state it times, and
// exits 1 otherwise.
TEST(BenchTools, GrammarBenchMasksAgree) {
  TROUPE_SHARED_OR_SKIP(shared);
  const auto r = bench("grammar_bench", {shared + "/models/llama.cpp-vocab/ggml-vocab-gpt-2.gguf",
                                         "--runs", "1", "--tokens", "30"});
  ASSERT_EQ(r.rc, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("inside a string"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("per token"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace troupe
