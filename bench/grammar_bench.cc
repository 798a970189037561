// grammar_bench: what constrained decoding costs per token on real vocabularies. For a JSON
// schema's grammar (serve/json_schema.h) it times (1) a token mask built cold at four states of a
// reply (before the object, inside a string, inside a number, before a key) and (2) whole replies
// drawn from random logits under the grammar with compute/grammar_sampling.h (mask cache on),
// side by side with the same draws unconstrained. Medians of --runs.
// Usage: grammar_bench VOCAB.gguf... [--runs R] [--tokens N] [--frames F]
//   --frames: the parse-stack nodes a cached top mask is keyed by (GrammarSampling's top_frames)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/detail/median.h"
#include "compute/grammar.h"
#include "compute/grammar_sampling.h"
#include "compute/sampler.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "serve/json_schema.h"

namespace {

using namespace troupe;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "grammar_bench: %s (usage: grammar_bench VOCAB.gguf... [--runs R] [--tokens N] "
               "[--frames F])\n",
               why);
  std::exit(2);
}

[[noreturn]] void fail(const std::string& why) {
  std::fprintf(stderr, "grammar_bench: %s\n", why.c_str());
  std::exit(1);
}

const char* kSchema = R"({"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 40},
  "age": {"type": "integer", "minimum": 0, "maximum": 150},
  "email": {"type": "string", "format": "email"},
  "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
  "address": {"type": "object", "properties": {"city": {"type": "string"},
              "zip": {"type": "string", "maxLength": 10}}, "required": ["city"]}},
  "required": ["name", "age"]})";

// Random logits from a fixed generator, a different row per step.
struct Logits {
  uint64_t s = 0x243F6A8885A308D3ull;
  std::vector<float> row;
  const std::vector<float>& next(size_t n) {
    row.resize(n);
    for (float& v : row) {
      s ^= s << 13;
      s ^= s >> 7;
      s ^= s << 17;
      v = static_cast<float>(s >> 40) * (8.0f / 16777216.0f);
    }
    return row;
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> vocabs;
  int runs = 5;
  int64_t tokens = 200;
  int frames = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help") {
      std::printf("usage: grammar_bench VOCAB.gguf... [--runs R] [--tokens N] [--frames F]\n");
      return 0;
    }
    if (a == "--runs" || a == "--tokens" || a == "--frames") {
      if (i + 1 >= argc) usage((a + " needs a value").c_str());
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (*end || v < 1) usage((a + " takes an integer >= 1").c_str());
      if (a == "--runs")
        runs = static_cast<int>(v);
      else if (a == "--frames")
        frames = static_cast<int>(v);
      else
        tokens = v;
    } else if (a.rfind("--", 0) == 0) {
      usage(("unknown option '" + a + "'").c_str());
    } else {
      vocabs.push_back(a);
    }
  }
  if (vocabs.empty()) usage("give at least one GGUF vocabulary");
  auto gbnf = serve::json_schema_grammar(nlohmann::ordered_json::parse(kSchema));
  if (!gbnf) fail(gbnf.error().message);
  auto grammar = compute::Grammar::compile(*gbnf);
  if (!grammar) fail(grammar.error().message);
  std::printf("grammar_bench: a 5-property JSON schema (%zu grammar rules), medians of %d runs\n",
              (*grammar)->num_rules(), runs);
  for (const auto& path : vocabs) {
    auto file = model::GgufFile::open(path);
    if (!file) {
      std::fprintf(stderr, "grammar_bench: %s\n", file.error().message.c_str());
      return 1;
    }
    auto tok = model::Tokenizer::from_gguf(**file);
    if (!tok) {
      std::fprintf(stderr, "grammar_bench: %s: %s\n", path.c_str(), tok.error().message.c_str());
      return 1;
    }
    auto t0 = Clock::now();
    auto vocab = compute::TokenVocab::of(**tok);
    const double vocab_ms = ms_since(t0);
    const char* base = std::strrchr(path.c_str(), '/');
    std::printf("\n%s: %d tokens (vocabulary sorted for the walk in %.1f ms)\n",
                base ? base + 1 : path.c_str(), vocab->size(), vocab_ms);
    // (1) Cold masks at four states.
    struct State {
      const char* what;
      const char* prefix;
    };
    const State states[] = {{"before the object", ""},
                            {"inside a string", "{\"name\": \"Ada Love"},
                            {"inside a number", "{\"name\": \"Ada\", \"age\": 3"},
                            {"before a key", "{\"name\": \"Ada\", \"age\": 36, "}};
    std::vector<uint8_t> mask;
    std::printf("  %-18s %8s %14s %14s %10s %16s\n", "mask built cold", "allowed", "whole walk ms",
                "top mask ms", "undecided", "undecided ms");
    for (const State& s : states) {
      compute::GrammarMatcher m(*grammar);
      if (!m.accept_bytes(s.prefix)) fail("a bench state is outside the grammar");
      std::vector<double> whole, top_ms, rest_ms;
      int64_t allowed = 0;
      std::vector<int32_t> undecided;
      for (int r = 0; r < runs; ++r) {
        t0 = Clock::now();
        allowed = m.fill_mask(*vocab, &mask);
        if (allowed < 0) fail("a mask needs more parse states than the grammar's limit");
        whole.push_back(ms_since(t0));
        // As GrammarSampling builds it: the union of the stacks' top masks, then the undecided.
        t0 = Clock::now();
        std::vector<uint8_t> u(static_cast<size_t>(vocab->size()), 0);
        undecided.clear();
        for (size_t i = 0; i < m.num_stacks(); ++i) {
          compute::GrammarMatcher::TopMask top;
          if (!m.fill_top_mask(*vocab, i, frames, &top))
            fail("a top mask needs more parse states than the grammar's limit");
          for (size_t t = 0; t < u.size(); ++t) u[t] |= top.allowed[t];
          undecided.insert(undecided.end(), top.undecided.begin(), top.undecided.end());
        }
        top_ms.push_back(ms_since(t0));
        std::sort(undecided.begin(), undecided.end());
        undecided.erase(std::unique(undecided.begin(), undecided.end()), undecided.end());
        undecided.erase(
            std::remove_if(undecided.begin(), undecided.end(),
                           [&](int32_t oi) { return u[size_t(vocab->order()[size_t(oi)])] != 0; }),
            undecided.end());
        t0 = Clock::now();
        m.fill_mask_of(*vocab, undecided, &u);
        rest_ms.push_back(ms_since(t0));
        if (m.can_end())
          for (int32_t id : vocab->eog()) u[size_t(id)] = 1;
        if (u != mask) fail("the top masks and the undecided tokens disagree with the whole walk");
      }
      std::printf("  %-18s %8lld %14.3f %14.3f %10zu %16.3f\n", s.what,
                  static_cast<long long>(allowed), bench::median(whole), bench::median(top_ms),
                  undecided.size(), bench::median(rest_ms));
    }
    // (2) Whole replies: per-token time of constrained and unconstrained draws from the same
    // random rows, temperature 0.8 and greedy.
    for (float temperature : {0.8f, 0.0f}) {
      std::vector<double> free_ms, constrained_ms;
      compute::GrammarSamplingStats stats;
      int64_t drawn = 0, ended = 0;
      for (int r = 0; r < runs; ++r) {
        compute::SamplingParams p;
        p.temperature = temperature;
        p.seed = 7 + static_cast<uint64_t>(r);
        p.grammar = *gbnf;
        compute::GrammarSampling gs(vocab, size_t{64} << 20, frames);  // fresh: pays its misses
        compute::Sampler constrained(p), free(p);
        Logits rows, rows2;
        std::vector<int32_t> output;
        double c_ms = 0, f_ms = 0;
        int64_t n = 0;
        for (; n < tokens; ++n) {
          const auto& row = rows.next(static_cast<size_t>(vocab->size()));
          t0 = Clock::now();
          auto t = gs.sample(1, p, output, constrained, row, {});
          c_ms += ms_since(t0);
          if (!t) fail(t.error().message);
          const auto& row2 = rows2.next(static_cast<size_t>(vocab->size()));
          t0 = Clock::now();
          (void)free.sample(row2, {});
          f_ms += ms_since(t0);
          output.push_back(*t);
          if (vocab->is_eog(*t)) {
            ++ended;
            ++n;
            break;
          }
        }
        drawn += n;
        constrained_ms.push_back(c_ms / double(n));
        free_ms.push_back(f_ms / double(n));
        const auto& s = gs.stats();
        stats.masks_built += s.masks_built;
        stats.mask_hits += s.mask_hits;
        stats.greedy_fast += s.greedy_fast;
        stats.undecided += s.undecided;
      }
      const double c = bench::median(constrained_ms), f = bench::median(free_ms);
      std::printf(
          "  replies at temperature %.1f: %lld tokens in %d runs (%lld ended), per token "
          "%.3f ms constrained vs %.3f ms free (x%.1f); top masks built %lld, from the "
          "cache %lld, undecided tokens checked %lld, greedy tokens the grammar allowed "
          "as drawn %lld\n",
          temperature, static_cast<long long>(drawn), runs, static_cast<long long>(ended), c, f,
          f > 0 ? c / f : 0.0, static_cast<long long>(stats.masks_built),
          static_cast<long long>(stats.mask_hits), static_cast<long long>(stats.undecided),
          static_cast<long long>(stats.greedy_fast));
    }
  }
  return 0;
}
