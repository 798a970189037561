// Tests of model/safetensors: the shared HF checkpoints (single file and sharded), and one test
// per kind of hostile input, each asserting the error names the file and the problem.
#include "model/safetensors.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/test_support.h"

namespace troupe::model {
namespace {

// An 8-byte little-endian length, the header text, then the data bytes.
std::string image(const std::string& header, const std::string& data = "") {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

using testing::TempDir;

// Opens `bytes` written to a file and returns the error message ("" when it opened).
std::string open_error(const std::string& bytes, std::string* path_out = nullptr) {
  TempDir dir;
  const std::string p = dir.write("bad.safetensors", bytes);
  if (path_out) *path_out = p;
  auto f = SafetensorsFile::open(p);
  return f ? std::string() : f.error().message;
}

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "message: " << (haystack)

const std::string k16Bytes(16, '\x01');

TEST(Safetensors, ReadsStories260K) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto f = SafetensorsFile::open(shared + "/models/hf/stories260K/model.safetensors");
  ASSERT_TRUE(f.has_value()) << f.error().message;
  const SafetensorsFile& st = **f;
  EXPECT_EQ(st.metadata().at("format"), "pt");
  const SafetensorsTensor* t = st.find("model.embed_tokens.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, "F32");
  EXPECT_TRUE(t->supported);
  EXPECT_EQ(t->type, GgmlType::kF32);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(t->nbytes, 512u * 64u * 4u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % 8, 0u);
  EXPECT_EQ(st.find("lm_head.weight"), nullptr);
  // 5 layers x 9 tensors + embeddings + final norm.
  EXPECT_EQ(st.tensors().size(), 47u);
  for (size_t i = 1; i < st.tensors().size(); ++i)
    EXPECT_LT(st.tensors()[i - 1].name, st.tensors()[i].name);
}

TEST(Safetensors, OpensShardedMixtralThroughIndex) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto s = SafetensorsSet::open_dir(shared + "/models/hf/mixtral-moe");
  ASSERT_TRUE(s.has_value()) << s.error().message;
  EXPECT_EQ((*s)->files().size(), 2u);
  EXPECT_EQ((*s)->tensors().size(), 49u + 78u);
  // Layer 1 spans both shards: experts 0-3 in the first, 4-7 in the second.
  const SafetensorsTensor* a = (*s)->find("model.layers.1.block_sparse_moe.experts.0.w1.weight");
  const SafetensorsTensor* b = (*s)->find("model.layers.1.block_sparse_moe.experts.7.w1.weight");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(*a->file, *b->file);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{32, 128}));
  uint64_t total = 0;
  for (const auto& [name, t] : (*s)->tensors()) total += t->nbytes;
  EXPECT_EQ(total, 2773504u);  // metadata.total_size of the index
}

TEST(Safetensors, OpensSingleFileDirectory) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto s = SafetensorsSet::open_dir(shared + "/models/hf/deepseek2");
  ASSERT_TRUE(s.has_value()) << s.error().message;
  EXPECT_EQ((*s)->files().size(), 1u);
  EXPECT_NE((*s)->find("model.layers.0.self_attn.kv_b_proj.weight"), nullptr);
}

TEST(Safetensors, ParsesHalfTypesAndFlagsOthers) {
  const std::string header =
      R"({"__metadata__":{"k":"v"},"a":{"dtype":"F16","shape":[2,2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[8,16]},)"
      R"("c":{"dtype":"I64","shape":[1],"data_offsets":[16,24]},)"
      R"("d":{"dtype":"F32","shape":[0,3],"data_offsets":[24,24]},)"
      R"("e":{"dtype":"F32","shape":[],"data_offsets":[24,28]}})";
  const std::string bytes = image(header, std::string(28, '\0'));
  auto f = SafetensorsFile::parse(
      std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), "mem");
  ASSERT_TRUE(f.has_value()) << f.error().message;
  EXPECT_EQ((*f)->metadata().at("k"), "v");
  EXPECT_EQ((*f)->find("a")->type, GgmlType::kF16);
  EXPECT_EQ((*f)->find("b")->type, GgmlType::kBF16);
  EXPECT_FALSE((*f)->find("c")->supported);
  EXPECT_EQ((*f)->find("c")->dtype, "I64");
  EXPECT_EQ((*f)->find("d")->nbytes, 0u);
  EXPECT_EQ((*f)->find("e")->num_elements(), 1);
}

TEST(Safetensors, MissingFileNamesThePath) {
  auto f = SafetensorsFile::open("/nonexistent/model.safetensors");
  ASSERT_FALSE(f.has_value());
  EXPECT_HAS(f.error().message, "/nonexistent/model.safetensors");
}

TEST(Safetensors, RejectsFileShorterThanLengthField) {
  std::string path;
  const std::string msg = open_error("abc", &path);
  EXPECT_HAS(msg, path);
  EXPECT_HAS(msg, "file too small (3 bytes)");
}

TEST(Safetensors, RejectsHeaderLengthBeyondFile) {
  std::string bytes = image("{}");
  bytes[0] = 100;  // claims 100 header bytes; 2 follow
  std::string path;
  const std::string msg = open_error(bytes, &path);
  EXPECT_HAS(msg, path);
  EXPECT_HAS(msg, "header length 100 exceeds the file size (2 bytes");
  std::string huge(8, '\xff');
  EXPECT_HAS(open_error(huge), "header length 18446744073709551615 exceeds the file size");
}

TEST(Safetensors, RejectsBadJson) {
  std::string path;
  const std::string msg = open_error(image(R"({"a": {"dtype": "F32",)"), &path);
  EXPECT_HAS(msg, path);
  EXPECT_HAS(msg, "header is not valid JSON");
}

TEST(Safetensors, RejectsNonObjectHeader) {
  EXPECT_HAS(open_error(image("[1, 2]")), "header is not a JSON object");
  EXPECT_HAS(open_error(image("")), "header is not a JSON object");
}

TEST(Safetensors, RejectsDeepNesting) {
  const std::string deep = "{\"a\":" + std::string(10000, '[') + std::string(10000, ']') + "}";
  EXPECT_HAS(open_error(image(deep)), "nests deeper than");
}

TEST(Safetensors, RejectsOffsetsOutOfRange) {
  const std::string h = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})";
  std::string path;
  const std::string msg = open_error(image(h, k16Bytes), &path);
  EXPECT_HAS(msg, path);
  EXPECT_HAS(msg, "tensor 'w': data_offsets [8, 24] out of range: the data buffer holds 16 bytes");
}

TEST(Safetensors, RejectsHugeOffsetsWithoutOverflow) {
  const std::string h =
      R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[18446744073709551600,18446744073709551615]}})";
  EXPECT_HAS(open_error(image(h, k16Bytes)), "out of range");
}

TEST(Safetensors, RejectsReversedOffsets) {
  const std::string h = R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})";
  EXPECT_HAS(open_error(image(h, k16Bytes)),
             "tensor 'w': data_offsets [8, 0] end before they begin");
}

TEST(Safetensors, RejectsOverlappingTensors) {
  const std::string h = R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
  std::string path;
  const std::string msg = open_error(image(h, k16Bytes), &path);
  EXPECT_HAS(msg, path);
  EXPECT_HAS(msg, "tensors 'a' [0, 12) and 'b' [8, 16) overlap");
}

TEST(Safetensors, RejectsShapeByteSizeMismatch) {
  const std::string h = R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,16]}})";
  std::string path;
  const std::string msg = open_error(image(h, k16Bytes), &path);
  EXPECT_HAS(msg, path);
  EXPECT_HAS(msg,
             "tensor 'w': shape [2, 3] of F32 needs 24 bytes but data_offsets [0, 16] span 16");
}

TEST(Safetensors, RejectsShapeOverflow) {
  const std::string h =
      R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})";
  EXPECT_HAS(open_error(image(h, k16Bytes)), "tensor 'w': shape [4294967296,4294967296] overflows");
}

TEST(Safetensors, RejectsNegativeOrFractionalShape) {
  EXPECT_HAS(
      open_error(image(R"({"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", k16Bytes)),
      "tensor 'w': shape entries must be non-negative integers, got -4");
  EXPECT_HAS(
      open_error(image(R"({"w":{"dtype":"F32","shape":[4.5],"data_offsets":[0,16]}})", k16Bytes)),
      "shape entries must be non-negative integers, got 4.5");
}

TEST(Safetensors, RejectsUnknownDtype) {
  std::string path;
  const std::string msg = open_error(
      image(R"({"w":{"dtype":"Q9","shape":[4],"data_offsets":[0,16]}})", k16Bytes), &path);
  EXPECT_HAS(msg, path);
  EXPECT_HAS(msg, "tensor 'w': unknown dtype 'Q9'");
}

TEST(Safetensors, RejectsMissingFields) {
  EXPECT_HAS(open_error(image(R"({"w":{"shape":[4],"data_offsets":[0,16]}})", k16Bytes)),
             "tensor 'w': missing or non-string \"dtype\"");
  EXPECT_HAS(open_error(image(R"({"w":{"dtype":"F32","data_offsets":[0,16]}})", k16Bytes)),
             "tensor 'w': missing or non-array \"shape\"");
  EXPECT_HAS(open_error(image(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0]}})", k16Bytes)),
             "tensor 'w': \"data_offsets\" must be an array [begin, end]");
  EXPECT_HAS(open_error(image(R"({"w":7})", k16Bytes)), "tensor 'w': entry is not a JSON object");
}

TEST(Safetensors, RejectsNonStringMetadata) {
  EXPECT_HAS(open_error(image(R"({"__metadata__":{"n":3}})")),
             "__metadata__ value 'n' is not a string");
  EXPECT_HAS(open_error(image(R"({"__metadata__":[]})")), "__metadata__ is not a JSON object");
}

// Single-byte corruptions of the first 2 KiB of a real header, and every truncation of the
// first KiB, must give a value or an error: never a crash or an out-of-bounds read (also run
// under ASan).
TEST(Safetensors, SurvivesCorruptedAndTruncatedHeaders) {
  TROUPE_SHARED_OR_SKIP(shared);
  std::ifstream in(shared + "/models/hf/stories260K/model.safetensors", std::ios::binary);
  std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(file.size(), 2048u);
  uint64_t header_len = 0;
  std::memcpy(&header_len, file.data(), 8);
  const size_t limit = std::min<size_t>(static_cast<size_t>(header_len) + 8, 2048);
  int opened = 0, failed = 0;
  std::string bytes = file;
  for (size_t i = 0; i < limit; ++i) {
    const char orig = bytes[i];
    for (char v : {'\0', '9', '"', '}', '\xff'}) {
      bytes[i] = v;
      auto f = SafetensorsFile::parse(
          std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), "fuzz");
      if (f) {
        ++opened;
        for (const SafetensorsTensor& t : (*f)->tensors()) {
          ASSERT_GE(t.data, reinterpret_cast<const uint8_t*>(bytes.data()));
          ASSERT_LE(t.data + t.nbytes,
                    reinterpret_cast<const uint8_t*>(bytes.data()) + bytes.size());
        }
      } else {
        ++failed;
        EXPECT_HAS(f.error().message, "fuzz");
      }
    }
    bytes[i] = orig;
  }
  for (size_t n = 0; n < 1024; ++n) {
    auto f = SafetensorsFile::parse(std::span(reinterpret_cast<const uint8_t*>(file.data()), n),
                                    "trunc");
    EXPECT_FALSE(f.has_value());
  }
  EXPECT_GT(failed, 0);
  EXPECT_GT(opened, 0);
}

// ---- sharded directories ----

std::string one_tensor(const std::string& name) {
  return image("{\"" + name + R"(":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", k16Bytes);
}

TEST(Safetensors, IndexOpensEachShardOnce) {
  TempDir dir;
  dir.write("s1.safetensors", one_tensor("a"));
  dir.write("s2.safetensors", image(R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                    R"("c":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                                    k16Bytes));
  dir.write("model.safetensors.index.json",
            R"({"metadata":{},"weight_map":{"a":"s1.safetensors","b":"s2.safetensors",)"
            R"("c":"s2.safetensors"}})");
  auto s = SafetensorsSet::open_dir(dir.path());
  ASSERT_TRUE(s.has_value()) << s.error().message;
  EXPECT_EQ((*s)->files().size(), 2u);
  EXPECT_EQ((*s)->tensors().size(), 3u);
  EXPECT_EQ(*(*s)->find("c")->file, dir.path() + "/s2.safetensors");
}

TEST(Safetensors, IndexRejectsMissingShard) {
  TempDir dir;
  dir.write("model.safetensors.index.json", R"({"weight_map":{"a":"gone.safetensors"}})");
  auto s = SafetensorsSet::open_dir(dir.path());
  ASSERT_FALSE(s.has_value());
  EXPECT_HAS(s.error().message, dir.path() + "/gone.safetensors: cannot open");
}

TEST(Safetensors, IndexRejectsTensorAbsentFromItsShard) {
  TempDir dir;
  dir.write("s1.safetensors", one_tensor("a"));
  dir.write("model.safetensors.index.json",
            R"({"weight_map":{"a":"s1.safetensors","z":"s1.safetensors"}})");
  auto s = SafetensorsSet::open_dir(dir.path());
  ASSERT_FALSE(s.has_value());
  EXPECT_HAS(s.error().message, "model.safetensors.index.json: weight_map places 'z' in");
  EXPECT_HAS(s.error().message, "s1.safetensors, which does not hold it");
}

TEST(Safetensors, IndexRejectsTensorInTwoShards) {
  TempDir dir;
  dir.write("s1.safetensors", one_tensor("a"));
  dir.write("s2.safetensors", one_tensor("a"));
  dir.write("model.safetensors.index.json",
            R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})");
  auto s = SafetensorsSet::open_dir(dir.path());
  ASSERT_FALSE(s.has_value());
  EXPECT_HAS(s.error().message, "tensor 'a' is also in");
}

TEST(Safetensors, IndexRejectsPathsOutsideTheDirectory) {
  TempDir dir;
  dir.write("model.safetensors.index.json", R"({"weight_map":{"a":"../x.safetensors"}})");
  auto s = SafetensorsSet::open_dir(dir.path());
  ASSERT_FALSE(s.has_value());
  EXPECT_HAS(s.error().message, "names '../x.safetensors', which is not a file inside");
  dir.write("model.safetensors.index.json", R"({"weight_map":{"a":"/etc/passwd"}})");
  EXPECT_FALSE(SafetensorsSet::open_dir(dir.path()).has_value());
}

TEST(Safetensors, IndexRejectsBadJsonAndMissingWeightMap) {
  TempDir dir;
  dir.write("model.safetensors.index.json", "{\"weight_map\": ");
  auto s = SafetensorsSet::open_dir(dir.path());
  ASSERT_FALSE(s.has_value());
  EXPECT_HAS(s.error().message, "model.safetensors.index.json: not valid JSON");
  dir.write("model.safetensors.index.json", R"({"metadata":{}})");
  s = SafetensorsSet::open_dir(dir.path());
  ASSERT_FALSE(s.has_value());
  EXPECT_HAS(s.error().message, "missing \"weight_map\" object");
  dir.write("model.safetensors.index.json", R"({"weight_map":{"a":5}})");
  s = SafetensorsSet::open_dir(dir.path());
  ASSERT_FALSE(s.has_value());
  EXPECT_HAS(s.error().message, "weight_map entry 'a' is not a file name");
}

TEST(Safetensors, DirectoryWithoutWeights) {
  TempDir dir;
  auto s = SafetensorsSet::open_dir(dir.path());
  ASSERT_FALSE(s.has_value());
  EXPECT_HAS(s.error().message, "no model.safetensors or model.safetensors.index.json");
}

}  // namespace
}  // namespace troupe::model
