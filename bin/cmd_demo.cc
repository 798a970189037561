// `troupe demo`: synthesizes the built-in default model (random weights, built-in byte-level
// vocabulary) once into a cache folder, then streams a generation from it through the engine.
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <sys/stat.h>

#include "bin/args.h"
#include "bin/commands.h"
#include "model/synth.h"

namespace troupe::cli {

int cmd_demo(const Args& args) {
  ArgParser ap(args,
               {"prompt", "max-tokens", "threads", "arch", "cache-dir", "temperature", "seed"},
               {"json", "stats"});
  const std::string arch = ap.str("arch", "llama");
  std::string dir = ap.str("cache-dir");
  if (dir.empty()) {
    // env: TROUPE_CACHE_DIR — where the demo model is written (default ~/.cache/troupe).
    if (const char* e = std::getenv("TROUPE_CACHE_DIR"); e && *e) {
      dir = e;
    } else if (const char* h = std::getenv("HOME"); h && *h) {
      dir = std::string(h) + "/.cache/troupe";
    } else {
      dir = "/tmp/troupe-cache";
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw CliError("cannot create " + dir + ": " + ec.message());
  const std::string path = dir + "/demo-" + arch + "-v1.gguf";
  if (!std::filesystem::exists(path)) {
    model::SynthOptions o;
    o.arch = arch;
    o.name = "troupe-demo-" + arch;
    o.seed = 42;
    o.n_embd = 256;
    o.n_layer = 4;
    o.n_head = 8;
    if (arch != "deepseek2") o.n_head_kv = 4;  // MLA always has one latent KV head
    if (arch == "llama") o.n_ff = 768;
    const std::string tmp = path + ".tmp";
    auto s = model::synth_model_summary(o, tmp);
    if (!s) throw CliError(s.error().message);
    std::filesystem::rename(tmp, path, ec);
    if (ec) throw CliError("cannot move " + tmp + " to " + path + ": " + ec.message());
    std::fprintf(stderr, "demo model: %s -> %s\n", s->line().c_str(), path.c_str());
  }
  std::fprintf(stderr,
               "demo: random-weight %s model with the built-in vocabulary (the text is "
               "noise; run a real model with 'troupe generate --model PATH')\n",
               arch.c_str());
  Args gen = {"--model",       path,
              "--prompt",      ap.str("prompt", "Once upon a time"),
              "--max-tokens",  ap.str("max-tokens", "48"),
              "--threads",     ap.str("threads", "1"),
              "--temperature", ap.str("temperature", "0.8"),
              "--seed",        ap.str("seed", "1")};
  if (ap.flag("json")) gen.push_back("--json");
  if (ap.flag("stats")) gen.push_back("--stats");
  return cmd_generate(gen);
}

}  // namespace troupe::cli
