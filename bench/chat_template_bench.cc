// chat_template_bench: how long a chat template takes to compile and to render a long
// conversation with model/chat_template.h, side by side with Python's jinja2 set up as
// transformers sets it up (tests/model/chat_templates/render_reference.py --repeat), which is what
// Python servers render with. Also checks both give the same text.
// Usage: chat_template_bench TEMPLATES_DIR [--turns N] [--runs R] [--no-python]
//   TEMPLATES_DIR: *.jinja files (and render_reference.py for the side-by-side; the checkout's
//   tests/model/chat_templates has both).
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/detail/median.h"
#include "model/chat_template.h"

namespace {

using nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A conversation of `turns` user/assistant pairs after a system message, each ~300 characters,
// and one tool (as agents send).
ordered_json conversation(int turns) {
  ordered_json msgs = ordered_json::array();
  msgs.push_back({{"role", "system"}, {"content", "You are a careful assistant. Answer briefly."}});
  const std::string filler =
      "Here is some context about the question, with numbers 1, 2.5 and 1e-05, quotes \"like "
      "these\", an apostrophe's worth, accents (café, naïve) and a little CJK (東京). ";
  for (int t = 0; t < turns; ++t) {
    msgs.push_back(
        {{"role", "user"}, {"content", "Question " + std::to_string(t) + ": " + filler}});
    if (t + 1 < turns)
      msgs.push_back(
          {{"role", "assistant"}, {"content", "Answer " + std::to_string(t) + ". " + filler}});
  }
  ordered_json tool = ordered_json::parse(R"({"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}})");
  return {{"messages", msgs},
          {"add_generation_prompt", true},
          {"bos_token", "<s>"},
          {"eos_token", "</s>"},
          {"tools", ordered_json::array({tool})}};
}

}  // namespace

int main(int argc, char** argv) {
  static const char* kUsage =
      "usage: chat_template_bench TEMPLATES_DIR [--turns N] [--runs R] [--no-python]\n";
  if (argc >= 2 && std::string(argv[1]) == "--help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string dir = argv[1];
  int turns = 32, runs = 50;
  bool python = true;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--turns" && i + 1 < argc)
      turns = std::atoi(argv[++i]);
    else if (a == "--runs" && i + 1 < argc)
      runs = std::atoi(argv[++i]);
    else if (a == "--no-python")
      python = false;
    else {
      std::fprintf(stderr, "chat_template_bench: unknown argument '%s' (--help)\n", a.c_str());
      return 2;
    }
  }
  if (turns < 1 || runs < 1) {
    std::fprintf(stderr, "chat_template_bench: --turns and --runs must be at least 1\n");
    return 2;
  }
  std::vector<std::string> files;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n.size() > 6 && n.compare(n.size() - 6, 6, ".jinja") == 0) files.push_back(n);
    }
    closedir(d);
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "chat_template_bench: no *.jinja in %s\n", dir.c_str());
    return 1;
  }
  const ordered_json ctx = conversation(turns);
  const std::string ctx_path = "/tmp/chat_template_bench_" + std::to_string(::getpid()) + ".json";
  {
    std::ofstream out(ctx_path);
    out << ordered_json::array({{{"name", "bench"}, {"context", ctx}}}).dump();
  }
  const std::string reference = dir + "/render_reference.py";
  if (python &&
      std::system(
          ("python3 -c 'import jinja2' >/dev/null 2>&1 && test -f '" + reference + "'").c_str()) !=
          0) {
    std::fprintf(stderr, "chat_template_bench: no python3 with jinja2 or no %s: troupe only\n",
                 reference.c_str());
    python = false;
  }
  std::printf("chat_template_bench: %d turns (%zu messages, 1 tool), median of %d renderings\n",
              turns, ctx["messages"].size(), runs);
  std::printf("%-26s %10s %10s %10s %12s %8s  %s\n", "template", "compile us", "render us",
              "out KB", "jinja2 us", "speed-up", "same text");
  int failures = 0;
  for (const std::string& f : files) {
    const std::string source = read_file(dir + "/" + f);
    std::vector<double> compile_us;
    for (int r = 0; r < 5; ++r) {
      const auto t0 = Clock::now();
      auto t = troupe::model::ChatTemplate::compile(source);
      compile_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      if (!t) {
        std::printf("%-26s does not compile: %s\n", f.c_str(), t.error().message.c_str());
        ++failures;
        break;
      }
    }
    auto t = troupe::model::ChatTemplate::compile(source);
    if (!t) continue;
    std::vector<double> render_us;
    std::string text;
    bool ok = true;
    for (int r = 0; r < runs && ok; ++r) {
      const auto t0 = Clock::now();
      auto out = t->render(ctx, 1785067200);
      render_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      ok = static_cast<bool>(out);
      if (out)
        text = std::move(*out);
      else
        std::printf("%-26s does not render this conversation: %s\n", f.c_str(),
                    out.error().message.c_str());
    }
    double py_us = 0;
    std::string same = "-";
    if (!ok && !python) continue;
    if (python) {
      const std::string cmd = "python3 '" + reference + "' '" + dir + "/" + f + "' '" + ctx_path +
                              "' --repeat " + std::to_string(runs);
      std::string out;
      if (FILE* p = popen(cmd.c_str(), "r")) {
        char buf[65536];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
        pclose(p);
      }
      const ordered_json ref = ordered_json::parse(out, nullptr, false);
      if (!ok) {
        // Where troupe refuses the conversation, jinja2 must too.
        const bool both = ref.is_array() && !ref.empty() && ref[0].contains("error");
        std::printf("%-26s %s\n", "",
                    both ? "(jinja2 refuses it too)" : "(jinja2 renders it: a bug)");
        if (!both) ++failures;
        continue;
      }
      if (ref.is_array() && !ref.empty() && ref[0].contains("seconds")) {
        py_us = ref[0]["seconds"].get<double>() * 1e6;
        same = ref[0]["text"] == text ? "yes" : "NO";
        if (same == "NO") ++failures;
      } else {
        same = "jinja2 failed";
      }
    }
    const double med = troupe::bench::median(render_us);
    std::printf("%-26s %10.1f %10.1f %10.1f %12.1f %7.1fx  %s\n", f.c_str(),
                troupe::bench::median(compile_us), med, static_cast<double>(text.size()) / 1024.0,
                py_us, py_us > 0 ? py_us / med : 0.0, same.c_str());
  }
  std::remove(ctx_path.c_str());
  return failures == 0 ? 0 : 1;
}
