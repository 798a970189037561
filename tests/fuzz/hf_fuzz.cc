// libFuzzer entry for the Hugging Face model readers (model/hf_model.cc, and the vision tower's
// model/hf_vision.cc) on hostile config.json files: the first byte picks one of ../shared's model
// directories (dense, Mixtral sharded, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3-style) or the LLaVA twin
// of its synthetic vision-language pair (tests/llava_hf_twin.h), the rest replaces its
// config.json; the weights and tokenizer files stay the real ones (linked into, or written to, a
// scratch directory). A refused config is fine (its error must name the directory); an accepted
// one must give a spec whose tensors have the shapes it states. Needs ../shared (or
// $TROUPE_SHARED_DIR): without it the fuzzer stops at start with exit status 77 (scripts/fuzz-smoke
// then skips it, or fails in CI).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/vision.h"
#include "tests/llava_hf_twin.h"

namespace fs = std::filesystem;

namespace {

std::vector<std::string>* g_dirs = nullptr;  // scratch copies, one per model
std::string* g_root = nullptr;
volatile uint64_t g_sink = 0;

void require(bool ok) {
  if (!ok) std::abort();
}

void remove_scratch() {
  std::error_code ec;
  if (g_root) fs::remove_all(*g_root, ec);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* env = std::getenv("TROUPE_SHARED_DIR");
  const fs::path hf = fs::path(env && *env ? env : "../shared") / "models/hf";
  if (!fs::exists(hf / "stories260K/config.json")) {
    std::fprintf(stderr, "hf_fuzz: %s not found (set TROUPE_SHARED_DIR)\n", hf.c_str());
    std::exit(77);
  }
  g_root = new std::string(
      (fs::temp_directory_path() / ("troupe-hf-fuzz-" + std::to_string(::getpid()))).string());
  g_dirs = new std::vector<std::string>();
  std::atexit(remove_scratch);
  for (const char* name : {"stories260K", "mixtral-moe", "qwen2moe", "qwen3moe", "deepseek2"}) {
    const fs::path dir = fs::path(*g_root) / name;
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(hf / name))
      if (e.path().filename() != "config.json")
        fs::create_symlink(fs::absolute(e.path()), dir / e.path().filename());
    g_dirs->push_back(dir.string());
  }
  const fs::path llava = fs::path(*g_root) / "llava";
  fs::create_directories(llava);
  const std::string error = troupe::testing::llava_hf_twin_files(
      (hf / "../..").lexically_normal().string(), llava.string());
  if (!error.empty()) {
    std::fprintf(stderr, "hf_fuzz: cannot write the LLaVA twin: %s\n", error.c_str());
    std::exit(1);
  }
  g_dirs->push_back(llava.string());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string& dir = (*g_dirs)[data[0] % g_dirs->size()];
  {
    std::ofstream out(dir + "/config.json", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data + 1), static_cast<std::streamsize>(size - 1));
  }
  if (auto v = troupe::model::load_vision_model(dir); !v) {
    require(v.error().message.find(dir) != std::string::npos);
  } else {
    const auto& s = (*v)->spec;
    require(s.n_embd >= 1 && s.n_embd_out >= 1 &&
            s.n_layer_run <= static_cast<int64_t>(s.layers.size()));
    require(s.patch_w.rows() == s.n_embd && s.pos_embd.rows() == s.n_pos());
    require(s.mm0_w.present() && s.mm2_w.rows() == s.n_embd_out);
  }
  auto m = troupe::model::load_hf_model(dir);
  if (!m) {
    require(m.error().message.find(dir) != std::string::npos);
    return 0;
  }
  const auto& s = (*m)->spec;
  require(s.n_layer >= 1 && s.n_embd >= 1 && s.n_vocab >= 1);
  require(static_cast<int64_t>(s.layers.size()) == s.n_layer);
  require(s.token_embd.present() && s.token_embd.cols() == s.n_embd);
  for (const auto& L : s.layers)
    if (L.wo.present()) require(L.wo.rows() == s.n_embd);
  g_sink = g_sink + static_cast<uint64_t>(s.n_layer + s.n_embd);
  return 0;
}
