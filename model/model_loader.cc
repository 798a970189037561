// load_model(): dispatches a path to the GGUF or the Hugging Face reader and attaches the
// tokenizer.
#include <sys/stat.h>

#include "model/gguf.h"
#include "model/model.h"
#include "model/tokenizer.h"

namespace troupe::model {

Result<std::shared_ptr<const Model>> load_model(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Error{1, path + ": no such file or directory"};
  if (S_ISDIR(st.st_mode)) return load_hf_model(path);
  auto g = GgufFile::open(path);
  if (!g) return g.error();
  try {
    auto m = std::make_shared<Model>();
    m->path = path;
    m->format = "gguf";
    m->spec = spec_from_gguf(**g);
    if ((*g)->find("tokenizer.ggml.model")) {
      auto tok = Tokenizer::from_gguf(**g);
      if (!tok) return tok.error();
      m->tokenizer = std::shared_ptr<const Tokenizer>(std::move(*tok));
    }
    m->chat_template = (*g)->get_string_or("tokenizer.chat_template", "");
    m->storage.push_back(std::shared_ptr<const GgufFile>(std::move(*g)));
    return std::shared_ptr<const Model>(std::move(m));
  } catch (const std::exception& e) {
    return Error{1, e.what()};
  }
}

}  // namespace troupe::model
