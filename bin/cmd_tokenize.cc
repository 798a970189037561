// `troupe tokenize` and `troupe detokenize`.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "bin/args.h"
#include "bin/commands.h"
#include "bin/common.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

namespace troupe::cli {

namespace {
// Tokenizing needs only the vocabulary: vocabulary-only GGUFs (no weights) must work too.
std::shared_ptr<const model::Tokenizer> load_tokenizer(const std::string& path) {
  if (path.size() > 5 && path.substr(path.size() - 5) == ".gguf") {
    auto g = model::GgufFile::open(path);
    if (!g) throw CliError(g.error().message);
    auto t = model::Tokenizer::from_gguf(**g);
    if (!t) throw CliError(t.error().message);
    return std::shared_ptr<const model::Tokenizer>(std::move(*t));
  }
  auto m = load_model_or_throw(path);
  if (!m->tokenizer) throw CliError(path + " has no vocabulary");
  return m->tokenizer;
}
}  // namespace

int cmd_tokenize(const Args& args) {
  ArgParser ap(args, {"model", "text"}, {"no-bos", "parse-special"});
  auto tok = load_tokenizer(ap.required("model"));
  const std::string text = ap.required("text");
  const auto ids = tok->encode(text, !ap.flag("no-bos"), ap.flag("parse-special"));
  std::printf("%s\n", nlohmann::json(ids).dump().c_str());
  return 0;
}

int cmd_detokenize(const Args& args) {
  ArgParser ap(args, {"model", "tokens"}, {});
  auto tok = load_tokenizer(ap.required("model"));
  const auto ids = parse_id_list(ap.required("tokens"), "--tokens");
  for (int32_t id : ids)
    if (id >= tok->n_vocab())
      throw CliError("token " + std::to_string(id) + " is outside the vocabulary (size " +
                     std::to_string(tok->n_vocab()) + ")");
  const std::string s = tok->decode(ids);
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::printf("\n");
  return 0;
}

}  // namespace troupe::cli
