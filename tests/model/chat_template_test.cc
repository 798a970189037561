// Chat templates (model/chat_template.h) against Python's jinja2 set up as transformers sets it
// up (tests/model/chat_templates/render_reference.py, run here): every template in
// tests/model/chat_templates/ and the real Phi-3 template of ../shared, rendered with every
// conversation of contexts.json, must give jinja2's text byte for byte, or fail where jinja2
// fails (with raise_exception's own message). Also: syntax errors name their line, limits hold.
#include "model/chat_template.h"

#include <dirent.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "tests/test_support.h"

namespace troupe::model {
namespace {

using nlohmann::ordered_json;

constexpr int64_t kNow = 1785067200;  // strftime_now's time in both renderers

std::string templates_dir() { return testing::source_dir() + "/tests/model/chat_templates"; }

// A python3 with jinja2, or "" (the test then fails in CI, where scripts/setup installs
// python3-jinja2, and skips elsewhere).
std::string python_with_jinja() {
  for (const char* py : {"python3", "/usr/bin/python3"}) {
    const std::string cmd = std::string(py) + " -c 'import jinja2' >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return py;
  }
  return "";
}

#define PYTHON_OR_SKIP(py)                                                                      \
  const std::string py = python_with_jinja();                                                   \
  if (py.empty()) {                                                                             \
    if (std::getenv("CI") || testing::shared_required())                                        \
      FAIL() << "python3 with jinja2 is required here (scripts/setup installs python3-jinja2)"; \
    GTEST_SKIP() << "no python3 with jinja2: the reference renderer cannot run; skipping";      \
  }

std::vector<std::string> files_in(const std::string& dir, const std::string& suffix) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n.size() > suffix.size() &&
          n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
        out.push_back(dir + "/" + n);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Renders `template_path` with every context of `contexts_path` in both renderers and compares.
// Returns the number of renderings that succeeded in the reference.
int compare_with_reference(const std::string& py, const std::string& template_path,
                           const std::string& source, const std::string& contexts_path) {
  testing::TempDir tmp;
  auto run = testing::run_process(py,
                                  {templates_dir() + "/render_reference.py", template_path,
                                   contexts_path, "--now", std::to_string(kNow)},
                                  tmp.path());
  EXPECT_EQ(run.rc, 0) << run.err;
  if (run.rc != 0) return 0;
  const ordered_json ref = ordered_json::parse(run.out);
  const ordered_json contexts = ordered_json::parse(testing::read_text_file(contexts_path));
  EXPECT_EQ(ref.size(), contexts.size());
  auto compiled = ChatTemplate::compile(source);
  int ok = 0;
  for (size_t i = 0; i < contexts.size() && i < ref.size(); ++i) {
    const std::string what =
        template_path + " with '" + contexts[i]["name"].get<std::string>() + "'";
    const ordered_json& want = ref[i];
    if (!compiled) {
      EXPECT_TRUE(want.contains("error")) << what << ": ours does not compile ("
                                          << compiled.error().message << "), jinja2 renders it";
      continue;
    }
    auto got = compiled->render(contexts[i]["context"], kNow);
    if (want.contains("text")) {
      ++ok;
      if (!got) {
        ADD_FAILURE() << what << ": jinja2 renders it, ours fails: " << got.error().message;
        continue;
      }
      EXPECT_EQ(*got, want["text"].get<std::string>()) << what;
    } else {
      EXPECT_FALSE(got) << what << ": jinja2 fails (" << want["error"] << "), ours renders:\n"
                        << (got ? *got : "");
      if (!got && got.error().code == static_cast<int>(TemplateErrc::kRaised)) {
        EXPECT_EQ(got.error().message, want["error"].get<std::string>()) << what;
      }
    }
  }
  return ok;
}

TEST(ChatTemplate, RendersEveryTemplateAsJinja2Does) {
  PYTHON_OR_SKIP(py);
  const auto templates = files_in(templates_dir(), ".jinja");
  ASSERT_GE(templates.size(), 8u) << templates_dir();
  for (const std::string& t : templates) {
    const int rendered = compare_with_reference(py, t, testing::read_text_file(t),
                                                templates_dir() + "/contexts.json");
    EXPECT_GT(rendered, 0) << t << ": jinja2 rendered none of the conversations";
  }
}

// Templates of real models kept outside the repository (a folder of *.jinja named by
// $TROUPE_EXTRA_CHAT_TEMPLATES), for checking the interpreter on them by hand.
TEST(ChatTemplate, RendersExtraTemplatesAsJinja2Does) {
  const char* dir = std::getenv("TROUPE_EXTRA_CHAT_TEMPLATES");
  if (!dir) GTEST_SKIP() << "TROUPE_EXTRA_CHAT_TEMPLATES is not set: no extra templates to check";
  PYTHON_OR_SKIP(py);
  for (const std::string& t : files_in(dir, ".jinja"))
    compare_with_reference(py, t, testing::read_text_file(t), templates_dir() + "/contexts.json");
}

TEST(ChatTemplate, RendersPhi3sRealTemplateAsJinja2Does) {
  TROUPE_SHARED_OR_SKIP(shared);
  PYTHON_OR_SKIP(py);
  auto g = GgufFile::open(shared + "/models/llama.cpp-vocab/ggml-vocab-phi-3.gguf");
  ASSERT_TRUE(g) << g.error().message;
  const std::string source = (*g)->get_string_or("tokenizer.chat_template", "");
  ASSERT_FALSE(source.empty());
  testing::TempDir tmp;
  const std::string path = tmp.write("phi3.jinja", source);
  EXPECT_GT(compare_with_reference(py, path, source, templates_dir() + "/contexts.json"), 0);
}

std::string render(const std::string& source, const ordered_json& ctx = ordered_json::object(),
                   ChatTemplateLimits limits = {}) {
  auto t = ChatTemplate::compile(source);
  if (!t) return "compile error: " + t.error().message;
  auto r = t->render(ctx, kNow, limits);
  return r ? *r : "error: " + r.error().message;
}

TEST(ChatTemplate, SyntaxErrorsNameTheLine) {
  EXPECT_EQ(render("a\n{% if x %}\nb"),
            "compile error: chat template line 3: missing '{% endif %}'");
  EXPECT_EQ(render("{{ 1 + }}"), "compile error: chat template line 1: an expression is missing");
  EXPECT_EQ(render("x\n\n{% endfor %}"),
            "compile error: chat template line 3: unexpected 'endfor'");
  EXPECT_EQ(render("{% include 'x' %}"),
            "compile error: chat template line 1: unknown or unsupported tag 'include'");
  EXPECT_EQ(render("{{ 'abc }}"), "compile error: chat template line 1: a string is not closed");
  EXPECT_EQ(render("{# never closed"),
            "compile error: chat template line 1: a comment is not closed");
  EXPECT_EQ(render("{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}"),
            "compile error: chat template line 1: an expression is nested too deeply");
}

TEST(ChatTemplate, RuntimeErrorsNameTheLineAndRaiseExceptionItsMessage) {
  EXPECT_EQ(render("\n{{ 1 + 'a' }}"),
            "error: chat template line 2: unsupported operand types for +: 'int' and 'str'");
  EXPECT_EQ(render("{{ x | nosuch }}"), "error: chat template line 1: no filter named 'nosuch'");
  EXPECT_EQ(render("{{ messages.x }}"), "error: chat template line 1: 'messages' is undefined");
  auto t = ChatTemplate::compile("{{ raise_exception('Roles must alternate') }}");
  ASSERT_TRUE(t);
  auto r = t->render(ordered_json::object(), kNow);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, static_cast<int>(TemplateErrc::kRaised));
  EXPECT_EQ(r.error().message, "Roles must alternate");
  EXPECT_EQ(render("{{ 9223372036854775807 + 1 }}"),
            "error: chat template line 1: integer overflow in + (integers are 64-bit here)");
  EXPECT_EQ(render("{{ 2 ** 64 }}"),
            "error: chat template line 1: integer overflow in ** (integers are 64-bit here)");
  EXPECT_EQ(render("{{ (1e300 * 1e300) | int }}").substr(0, 50),
            "error: chat template line 1: cannot convert the fl");
  EXPECT_EQ(render("{% set xs = [1] %}{{ xs.append(2) }}"),
            "error: chat template line 1: list.append() is not allowed: the template's values "
            "are immutable");
}

TEST(ChatTemplate, LimitsStopTemplatesThatDoNotEnd) {
  ChatTemplateLimits small;
  small.max_steps = 10'000;
  EXPECT_EQ(
      render("{% for i in range(100000) %}{{ i }}{% endfor %}", ordered_json::object(), small),
      "error: chat template line 1: the template ran past 10000 steps");
  small = {};
  small.max_output_bytes = 1000;
  EXPECT_EQ(
      render("{% for i in range(1000) %}xxxxxxxxxx{% endfor %}", ordered_json::object(), small),
      "error: chat template line 1: the template's output passed 1000 bytes");
  EXPECT_EQ(render("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}"),
            "error: chat template line 1: macros call each other too deeply");
}

}  // namespace
}  // namespace troupe::model
