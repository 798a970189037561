// Weights copied into huge-page memory (model::copy_weights_to_memory): the engine gives
// bit-identical logits from the copy, the copied views really moved out of the file mapping,
// and a partial copy moves exactly the views inside the given ranges.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include <gtest/gtest.h>

#include "compute/engine.h"
#include "model/model.h"
#include "tests/compute/engine_test_util.h"
#include "tests/test_support.h"

namespace troupe::compute {
namespace {

std::vector<float> logits_of(std::shared_ptr<const model::Model> m,
                             const std::vector<int32_t>& toks) {
  EngineOptions o;
  o.max_tokens_in_cache = 256;
  auto eng = Engine::create(m, o);
  EXPECT_TRUE(eng.has_value());
  if (!eng) return {};
  Sequence seq(**eng);
  EXPECT_TRUE(seq.reserve(static_cast<int64_t>(toks.size())));
  SeqStep st = seq.next(toks, SeqStep::Logits::kAll);
  StepResult r;
  EXPECT_TRUE((*eng)->step({&st, 1}, &r).has_value());
  return r.logits;
}

// Whether p lies in the span of the file mapping's weights (from the first to the last byte
// of any view of the mapped model).
bool inside(const uint8_t* p, const model::Model& mapped) {
  const uint8_t* lo = nullptr;
  const uint8_t* hi = nullptr;
  model::for_each_weight(mapped.spec, [&](const model::WeightView& w) {
    if (!w.present()) return;
    if (!lo || w.data < lo) lo = w.data;
    if (!hi || w.data + w.nbytes() > hi) hi = w.data + w.nbytes();
  });
  return p >= lo && p < hi;
}

class WeightsInMemory : public ::testing::TestWithParam<const char*> {};

TEST_P(WeightsInMemory, EngineLogitsAreBitIdentical) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto loaded = model::load_model(shared + "/" + GetParam());  // a GGUF file or an HF directory
  ASSERT_TRUE(loaded.has_value()) << loaded.error().message;
  auto mapped = *loaded;
  auto copied = model::copy_weights_to_memory(mapped, {}, 2);
  ASSERT_TRUE(copied.has_value()) << copied.error().message;
  int moved = 0, present = 0;
  model::for_each_weight((*copied)->spec, [&](const model::WeightView& w) {
    if (!w.present()) return;
    ++present;
    moved += !inside(w.data, *mapped);
  });
  EXPECT_GT(present, 0);
  EXPECT_EQ(moved, present) << "every present view should point into the copy";
  std::mt19937 rng(7);
  std::vector<int32_t> toks(23);
  for (auto& t : toks)
    t = static_cast<int32_t>(rng() % static_cast<uint32_t>(mapped->spec.n_vocab));
  const auto a = logits_of(mapped, toks), b = logits_of(*copied, toks);
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Models, WeightsInMemory,
    ::testing::Values("models/stories260K/stories260K.gguf", "models/synth/mixtral-moe/model.gguf",
                      "models/synth/deepseek2/model.gguf", "models/hf/mixtral-moe"),
    [](const auto& info) { return troupe::testing::model_param_name(info.param); });

TEST(WeightsInMemory, PartialCopyMovesOnlyViewsInsideTheRanges) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto mapped = load_model_for_test(shared + "/models/stories260K/stories260K.gguf");
  ASSERT_TRUE(mapped);
  const auto& L0 = mapped->spec.layers.at(0);
  std::vector<std::span<const uint8_t>> ranges = {{L0.wq.data, L0.wq.nbytes()},
                                                  {L0.ffn_down.data, L0.ffn_down.nbytes()}};
  auto copied = model::copy_weights_to_memory(mapped, ranges, 1);
  ASSERT_TRUE(copied.has_value()) << copied.error().message;
  const auto& C0 = (*copied)->spec.layers.at(0);
  EXPECT_FALSE(inside(C0.wq.data, *mapped));
  EXPECT_FALSE(inside(C0.ffn_down.data, *mapped));
  EXPECT_EQ(std::memcmp(C0.wq.data, L0.wq.data, L0.wq.nbytes()), 0);
  EXPECT_EQ(std::memcmp(C0.ffn_down.data, L0.ffn_down.data, L0.ffn_down.nbytes()), 0);
  EXPECT_TRUE(inside(C0.wk.data, *mapped));
  EXPECT_TRUE(inside((*copied)->spec.token_embd.data, *mapped));
  EXPECT_TRUE(inside((*copied)->spec.layers.at(1).wq.data, *mapped));
  EXPECT_EQ(model::weight_copy_bytes(*mapped, ranges), L0.wq.nbytes() + L0.ffn_down.nbytes());
  EXPECT_TRUE(model::parse_weight_storage("memory").has_value());
  auto bad = model::parse_weight_storage("ram");
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("\"ram\""), std::string::npos);
}

// A re-placement (actors/node_place.cc) copies from the model its actors computed with: views
// already in an earlier copy stay there (that copy is kept alive), only views still in the
// mapping move, and only they count as bytes to copy.
TEST(WeightsInMemory, CopyFromACopyMovesOnlyViewsStillInTheMapping) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto mapped = load_model_for_test(shared + "/models/stories260K/stories260K.gguf");
  ASSERT_TRUE(mapped);
  const auto& L0 = mapped->spec.layers.at(0);
  const auto& L1 = mapped->spec.layers.at(1);
  std::vector<std::span<const uint8_t>> first = {{L0.wq.data, L0.wq.nbytes()}};
  auto made = model::copy_weights_to_memory(mapped, first, 1);
  ASSERT_TRUE(made.has_value()) << made.error().message;
  std::shared_ptr<const model::Model> once = std::move(*made);
  std::vector<std::span<const uint8_t>> both = {{L0.wq.data, L0.wq.nbytes()},
                                                {L1.wq.data, L1.wq.nbytes()}};
  EXPECT_EQ(model::weight_copy_bytes(*once, both), L1.wq.nbytes());
  auto twice = model::copy_weights_to_memory(once, both, 1);
  ASSERT_TRUE(twice.has_value()) << twice.error().message;
  EXPECT_EQ((*twice)->spec.layers.at(0).wq.data, once->spec.layers.at(0).wq.data);
  EXPECT_FALSE(inside((*twice)->spec.layers.at(1).wq.data, *mapped));
  EXPECT_EQ(std::memcmp((*twice)->spec.layers.at(1).wq.data, L1.wq.data, L1.wq.nbytes()), 0);
  once.reset();  // the second copy keeps the first one's buffer alive
  EXPECT_EQ(std::memcmp((*twice)->spec.layers.at(0).wq.data, L0.wq.data, L0.wq.nbytes()), 0);
}

// The copy reads the mapped file itself, not whatever its path names now: a model file
// replaced on disk after it was mapped (here by a rename, as a download tool would) must not
// leak the new file's bytes into the running model. Two guards each catch this alone (checked
// by disabling them): /proc/self/maps marks the old file "(deleted)", and the inode differs.
TEST(WeightsInMemory, ACopyReadsTheMappedFileEvenIfItsPathNowNamesAnother) {
  TROUPE_SHARED_OR_SKIP(shared);
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("troupe_wm_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path path = dir / "model.gguf";
  fs::copy_file(shared + "/models/stories260K/stories260K.gguf", path);
  auto mapped = load_model_for_test(path.string());
  ASSERT_TRUE(mapped);
  // Another file of the same size, every byte different, renamed over the path.
  {
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (char& c : bytes) c = static_cast<char>(~c);
    std::ofstream(dir / "other.gguf", std::ios::binary) << bytes;
  }
  fs::rename(dir / "other.gguf", path);
  auto copied = model::copy_weights_to_memory(mapped, {}, 2);
  ASSERT_TRUE(copied.has_value()) << copied.error().message;
  // Compare view by view with the mapping (still the old file's bytes).
  std::vector<const model::WeightView*> a, b;
  model::for_each_weight(mapped->spec, [&](const model::WeightView& w) { a.push_back(&w); });
  model::for_each_weight((*copied)->spec, [&](const model::WeightView& w) { b.push_back(&w); });
  ASSERT_EQ(a.size(), b.size());
  int present = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i]->present()) continue;
    ++present;
    EXPECT_FALSE(inside(b[i]->data, *mapped)) << a[i]->name;
    ASSERT_EQ(std::memcmp(a[i]->data, b[i]->data, a[i]->nbytes()), 0) << a[i]->name;
  }
  EXPECT_GT(present, 0);
  fs::remove_all(dir);
}

// Where the weights go: "auto" copies only with room to spare, "memory" refuses a copy that
// cannot fit (instead of the out-of-memory killer), "map" never copies.
TEST(WeightStorage, AutoCopiesOnlyWithRoomToSpareAndMemoryRefusesWhatCannotFit) {
  using model::WeightStorage;
  constexpr uint64_t kGiB = uint64_t{1} << 30;
  std::string why;
  auto pick = [&](WeightStorage r, uint64_t bytes, uint64_t avail) {
    why.clear();
    return model::choose_weight_storage(r, bytes, avail, &why);
  };
  EXPECT_EQ(*pick(WeightStorage::kAuto, kGiB, 4 * kGiB), WeightStorage::kMemory);
  EXPECT_EQ(*pick(WeightStorage::kAuto, 3 * kGiB, 4 * kGiB), WeightStorage::kMemory);  // 1 GiB left
  EXPECT_EQ(*pick(WeightStorage::kAuto, 3 * kGiB + 1, 4 * kGiB), WeightStorage::kMap);
  EXPECT_NE(why.find("would leave less than 1073.7 MB of the 4295.0 MB available"),
            std::string::npos)
      << why;
  EXPECT_EQ(*pick(WeightStorage::kAuto, 90 * kGiB, 100 * kGiB), WeightStorage::kMemory);  // 10 %
  EXPECT_EQ(*pick(WeightStorage::kAuto, 90 * kGiB + 1, 100 * kGiB), WeightStorage::kMap);
  EXPECT_EQ(*pick(WeightStorage::kAuto, 1, 0), WeightStorage::kMap);  // unknown: do not copy
  EXPECT_NE(why.find("could not be read"), std::string::npos) << why;
  EXPECT_EQ(*pick(WeightStorage::kMemory, 3 * kGiB, 4 * kGiB), WeightStorage::kMemory);
  EXPECT_EQ(*pick(WeightStorage::kMemory, 3 * kGiB, 0), WeightStorage::kMemory);
  auto too_big = pick(WeightStorage::kMemory, 5 * kGiB, 4 * kGiB);
  ASSERT_FALSE(too_big.has_value());
  EXPECT_NE(too_big.error().message.find("5368.7 MB of weights does not fit in the 4295.0 MB"),
            std::string::npos)
      << too_big.error().message;
  EXPECT_EQ(*pick(WeightStorage::kMap, 1, 100 * kGiB), WeightStorage::kMap);
  EXPECT_EQ(*model::parse_weight_storage("auto"), WeightStorage::kAuto);
  // This machine's figure is readable and plausible (Linux: /proc/meminfo).
  const uint64_t avail = model::available_memory_bytes();
  EXPECT_GT(avail, uint64_t{16} << 20);
  EXPECT_LT(avail, uint64_t{1} << 50);
}

}  // namespace
}  // namespace troupe::compute
