// Every error path of the GGUF reader, one corruption per test, each asserting the message
// (LevelDB log_test style). Files are built byte by byte so each corruption is exact.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "tests/test_support.h"

namespace troupe::model {
namespace {

constexpr uint32_t kStr = 8, kArr = 9, kU32 = 4, kBool = 7, kF32Type = 6;

// Little-endian GGUF bytes, appended field by field.
class Bytes {
 public:
  Bytes& u8(uint8_t v) { return raw(&v, 1); }
  Bytes& u32(uint32_t v) { return raw(&v, 4); }
  Bytes& u64(uint64_t v) { return raw(&v, 8); }
  Bytes& f32(float v) { return raw(&v, 4); }
  Bytes& str(std::string_view s) {
    u64(s.size());
    return raw(s.data(), s.size());
  }
  Bytes& raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes_.insert(bytes_.end(), b, b + n);
    return *this;
  }
  Bytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    raw("GGUF", 4);
    u32(version);
    u64(n_tensors);
    return u64(n_kv);
  }
  Bytes& kv_u32(std::string_view key, uint32_t v) { return str(key).u32(kU32).u32(v); }
  Bytes& kv_str(std::string_view key, std::string_view v) { return str(key).u32(kStr).str(v); }
  // A tensor info: name, dims, type, offset.
  Bytes& tensor(std::string_view name, std::vector<uint64_t> ne, uint32_t type, uint64_t off) {
    str(name).u32(static_cast<uint32_t>(ne.size()));
    for (uint64_t n : ne) u64(n);
    return u32(type).u64(off);
  }
  Bytes& pad(size_t alignment = 32) {
    while (bytes_.size() % alignment != 0) bytes_.push_back(0);
    return *this;
  }
  Bytes& zeros(size_t n) {
    bytes_.insert(bytes_.end(), n, 0);
    return *this;
  }
  size_t size() const { return bytes_.size(); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

// The error message of parsing `b` (named "bad.gguf"); fails the test when it parses.
std::string parse_error(const std::vector<uint8_t>& b) {
  auto r = GgufFile::parse(b, "bad.gguf");
  EXPECT_FALSE(r.has_value()) << "parsed without error";
  return r.has_value() ? std::string() : r.error().message;
}
std::string parse_error(const Bytes& b) { return parse_error(b.bytes()); }

// A valid file: two metadata keys, one f32 tensor [8, 2].
Bytes valid_file() {
  Bytes b;
  b.header(1, 2).kv_str("general.architecture", "llama").kv_u32("llama.block_count", 1);
  b.tensor("w", {8, 2}, 0, 0).pad().zeros(64);
  return b;
}

TEST(GgufBadInput, ValidBaselineParses) {
  const Bytes b = valid_file();
  auto r = GgufFile::parse(b.bytes(), "ok.gguf");
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ((*r)->tensors().size(), 1u);
  EXPECT_EQ((*r)->find_tensor("w")->nbytes, 64u);
}

TEST(GgufBadInput, EmptyFile) {
  EXPECT_EQ(parse_error(std::vector<uint8_t>()),
            "bad.gguf: truncated at byte 0 reading magic (need 4 bytes, 0 left)");
}

TEST(GgufBadInput, BadMagic) {
  Bytes b;
  b.raw("GGUX", 4).u32(3).u64(0).u64(0);
  EXPECT_EQ(parse_error(b), "bad.gguf: not a GGUF file (bad magic 0x58554747)");
}

TEST(GgufBadInput, Version1) {
  Bytes b;
  b.header(0, 0, 1);
  EXPECT_EQ(parse_error(b), "bad.gguf: unsupported GGUF version 1 (troupe reads 2 and 3)");
}

TEST(GgufBadInput, Version4) {
  Bytes b;
  b.header(0, 0, 4);
  EXPECT_EQ(parse_error(b), "bad.gguf: unsupported GGUF version 4 (troupe reads 2 and 3)");
}

TEST(GgufBadInput, Version2IsAccepted) {
  Bytes b;
  b.header(0, 1, 2).kv_u32("a", 1);
  auto r = GgufFile::parse(b.bytes(), "v2.gguf");
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ((*r)->version(), 2u);
}

TEST(GgufBadInput, TruncatedInHeader) {
  Bytes b;
  b.raw("GGUF", 4).u32(3).u32(0);  // tensor count cut in half
  EXPECT_EQ(parse_error(b),
            "bad.gguf: truncated at byte 8 reading tensor count (need 8 bytes, 4 left)");
  Bytes c;
  c.raw("GGUF", 4).u32(3).u64(0);
  EXPECT_EQ(parse_error(c),
            "bad.gguf: truncated at byte 16 reading metadata count (need 8 bytes, 0 left)");
}

TEST(GgufBadInput, TruncatedInsideAKey) {
  Bytes b;
  b.header(0, 1).u64(20).raw("general.archi", 13);
  EXPECT_EQ(parse_error(b),
            "bad.gguf: truncated at byte 32 reading metadata key (need 20 bytes, 13 left)");
}

TEST(GgufBadInput, TruncatedInsideAValue) {
  Bytes b;
  b.header(0, 1).str("general.name").u32(kStr).u64(30).raw("synth", 5);
  EXPECT_EQ(parse_error(b),
            "bad.gguf: truncated at byte 56 reading string value (need 30 bytes, 5 left)");
}

TEST(GgufBadInput, TruncatedInsideAStringArray) {
  Bytes b;
  b.header(0, 1).str("tok").u32(kArr).u32(kStr).u64(3).str("x").str("yy").raw("\x01\0\0\0\0", 5);
  EXPECT_EQ(parse_error(b),
            "bad.gguf: truncated at byte 70 reading array string (need 8 bytes, 5 left)");
}

TEST(GgufBadInput, TruncatedInsideTensorInfos) {
  Bytes b;
  b.header(1, 1).kv_str("general.architecture", "llama-with-padding");
  b.str("w").u32(2).u64(8).u64(2);  // type and offset missing
  EXPECT_EQ(parse_error(b),
            "bad.gguf: truncated at byte 111 reading tensor type (need 4 bytes, 0 left)");
}

TEST(GgufBadInput, TruncatedBeforeDataSection) {
  Bytes b;
  b.header(1, 1).kv_str("general.architecture", "llama-with-padding").tensor("w", {8}, 0, 0);
  ASSERT_NE(b.size() % 32, 0u);
  EXPECT_EQ(parse_error(b), "bad.gguf: truncated: data section would start at byte 128 of 115");
}

TEST(GgufBadInput, TruncatedInsideDataSection) {
  Bytes b = valid_file();
  std::vector<uint8_t> cut = b.bytes();
  cut.resize(cut.size() - 1);
  EXPECT_EQ(parse_error(cut),
            "bad.gguf: tensor 'w' (f32, [8, 2], 64 bytes at data offset 0) extends past the end of "
            "the file (223 bytes)");
}

TEST(GgufBadInput, HugeMetadataCount) {
  Bytes b;
  b.header(0, uint64_t{1} << 60).kv_u32("a", 1);
  EXPECT_EQ(parse_error(b), "bad.gguf: metadata count 1152921504606846976 exceeds the file size");
}

TEST(GgufBadInput, HugeTensorCount) {
  Bytes b;
  b.header(~uint64_t{0}, 1).kv_u32("a", 1);
  EXPECT_EQ(parse_error(b), "bad.gguf: tensor count 18446744073709551615 exceeds the file size");
}

TEST(GgufBadInput, HugeNumericArrayLength) {
  Bytes b;
  b.header(0, 1).str("a").u32(kArr).u32(kU32).u64(uint64_t{1} << 62).u32(1);
  EXPECT_EQ(parse_error(b), "bad.gguf: key 'a': array of 4611686018427387904 u32 exceeds the file");
}

TEST(GgufBadInput, HugeStringArrayLength) {
  Bytes b;
  b.header(0, 1).str("tokens").u32(kArr).u32(kStr).u64(1000).str("a");
  EXPECT_EQ(parse_error(b), "bad.gguf: key 'tokens': array of 1000 strings exceeds the file");
}

TEST(GgufBadInput, HugeStringLength) {
  Bytes b;
  b.header(0, 1).u64(~uint64_t{0}).raw("key-bytes-follow", 16);
  EXPECT_EQ(parse_error(b),
            "bad.gguf: truncated at byte 32 reading metadata key (need 18446744073709551615 "
            "bytes, 16 left)");
}

TEST(GgufBadInput, EmptyKey) {
  Bytes b;
  b.header(0, 1).kv_u32("", 1).zeros(8);
  EXPECT_EQ(parse_error(b), "bad.gguf: metadata entry 0 has an empty key");
}

TEST(GgufBadInput, InvalidValueType) {
  Bytes b;
  b.header(0, 1).str("a").u32(13).u64(0);
  EXPECT_EQ(parse_error(b), "bad.gguf: key 'a' has invalid value type 13");
}

TEST(GgufBadInput, InvalidArrayElementType) {
  Bytes b;
  b.header(0, 1).str("a").u32(kArr).u32(0xffffffffu).u64(0);
  EXPECT_EQ(parse_error(b), "bad.gguf: key 'a': invalid array element type 4294967295");
}

TEST(GgufBadInput, NestedArray) {
  Bytes b;
  b.header(0, 1).str("a").u32(kArr).u32(kArr).u64(1).u32(kU32).u64(0);
  EXPECT_EQ(parse_error(b), "bad.gguf: key 'a': invalid array element type 9");
}

TEST(GgufBadInput, BoolValueTwo) {
  Bytes b;
  b.header(0, 1).str("flag").u32(kBool).u8(2).zeros(8);
  EXPECT_EQ(parse_error(b), "bad.gguf: key 'flag': bool value 2 is neither 0 nor 1");
}

TEST(GgufBadInput, BoolArrayElementTwo) {
  Bytes b;
  b.header(0, 1).str("flags").u32(kArr).u32(kBool).u64(3).u8(1).u8(0).u8(2);
  EXPECT_EQ(parse_error(b), "bad.gguf: key 'flags': bool element 2 is 2");
}

TEST(GgufBadInput, DuplicateKey) {
  Bytes b;
  b.header(0, 2).kv_u32("llama.block_count", 1).kv_u32("llama.block_count", 2);
  EXPECT_EQ(parse_error(b), "bad.gguf: duplicate metadata key 'llama.block_count'");
}

// A file with one metadata key (enough bytes for the count bounds) and the given tensor infos.
Bytes with_tensors(uint64_t n, const std::function<void(Bytes&)>& infos) {
  Bytes b;
  b.header(n, 1).kv_str("general.architecture", "llama-with-some-padding-bytes");
  infos(b);
  b.pad().zeros(256);
  return b;
}

TEST(GgufBadInput, DuplicateTensor) {
  Bytes b = with_tensors(2, [](Bytes& b) { b.tensor("w", {8}, 0, 0).tensor("w", {8}, 0, 32); });
  EXPECT_EQ(parse_error(b), "bad.gguf: duplicate tensor 'w'");
}

TEST(GgufBadInput, ZeroDims) {
  Bytes b = with_tensors(1, [](Bytes& b) { b.tensor("w", {}, 0, 0).zeros(32); });
  EXPECT_EQ(parse_error(b), "bad.gguf: tensor 'w' has 0 dimensions (1 to 4 allowed)");
}

TEST(GgufBadInput, FiveDims) {
  Bytes b = with_tensors(1, [](Bytes& b) { b.tensor("w", {1, 1, 1, 1, 1}, 0, 0); });
  EXPECT_EQ(parse_error(b), "bad.gguf: tensor 'w' has 5 dimensions (1 to 4 allowed)");
}

TEST(GgufBadInput, ZeroDimension) {
  Bytes b = with_tensors(1, [](Bytes& b) { b.tensor("w", {8, 0}, 0, 0); });
  EXPECT_EQ(parse_error(b), "bad.gguf: tensor 'w' dimension 1 is 0");
}

TEST(GgufBadInput, HugeDimension) {
  Bytes b = with_tensors(1, [](Bytes& b) { b.tensor("w", {(uint64_t{1} << 40) + 1}, 0, 0); });
  EXPECT_EQ(parse_error(b), "bad.gguf: tensor 'w' dimension 0 is 1099511627777");
}

TEST(GgufBadInput, ElementCountOverflow) {
  // Each dimension is allowed alone; their product (2^80, or 2^64 wrapped to 0) is not.
  Bytes b = with_tensors(1, [](Bytes& b) {
    b.tensor("w", {uint64_t{1} << 40, uint64_t{1} << 20, uint64_t{1} << 4}, 0, 0);
  });
  EXPECT_EQ(parse_error(b), "bad.gguf: tensor 'w' has too many elements");
}

TEST(GgufBadInput, UnknownTensorType) {
  Bytes b = with_tensors(1, [](Bytes& b) { b.tensor("w", {32}, 5, 0); });  // removed q4_2
  EXPECT_EQ(parse_error(b), "bad.gguf: tensor 'w' has unknown type id 5");
  Bytes c = with_tensors(1, [](Bytes& b) { b.tensor("w", {32}, 0x80000000u, 0); });
  EXPECT_EQ(parse_error(c), "bad.gguf: tensor 'w' has unknown type id 2147483648");
  // troupe's in-memory FP8 type (GgmlType::kF8_E4M3) is not a file type.
  Bytes d = with_tensors(1, [](Bytes& b) { b.tensor("w", {32}, 1000, 0); });
  EXPECT_EQ(parse_error(d), "bad.gguf: tensor 'w' has unknown type id 1000");
}

TEST(GgufBadInput, RowNotAMultipleOfTheBlockSize) {
  Bytes b = with_tensors(1, [](Bytes& b) { b.tensor("w", {33, 2}, 2, 0); });
  EXPECT_EQ(parse_error(b),
            "bad.gguf: tensor 'w' row of 33 elements is not a multiple of the q4_0 block size 32");
  Bytes c = with_tensors(1, [](Bytes& b) { b.tensor("k", {128}, 12, 0); });
  EXPECT_EQ(parse_error(c),
            "bad.gguf: tensor 'k' row of 128 elements is not a multiple of the q4_K block size "
            "256");
}

TEST(GgufBadInput, MisalignedOffset) {
  Bytes b = with_tensors(1, [](Bytes& b) { b.tensor("w", {8}, 0, 4); });
  EXPECT_EQ(parse_error(b), "bad.gguf: tensor 'w' offset 4 is not a multiple of the alignment 32");
}

TEST(GgufBadInput, TensorPastTheEndOfTheFile) {
  Bytes b = with_tensors(1, [](Bytes& b) { b.tensor("w", {8}, 0, 256); });
  EXPECT_EQ(parse_error(b),
            "bad.gguf: tensor 'w' (f32, [8], 32 bytes at data offset 256) extends past the end of "
            "the file (384 bytes)");
  // An offset near 2^64 must not wrap around the bounds check.
  Bytes c = with_tensors(1, [](Bytes& b) { b.tensor("w", {8}, 0, ~uint64_t{31}); });
  EXPECT_EQ(parse_error(c).find("bad.gguf: tensor 'w' (f32, [8], 32 bytes at data offset "
                                "18446744073709551584) extends past"),
            0u);
}

TEST(GgufBadInput, BadAlignmentValues) {
  for (uint32_t a : {0u, 1u, 2u, 3u, 4u, 48u, 2u << 20}) {
    Bytes b;
    b.header(0, 1).kv_u32("general.alignment", a);
    EXPECT_EQ(parse_error(b), "bad.gguf: general.alignment must be a power of two from 8 to 1 MiB")
        << a;
  }
  Bytes s;
  s.header(0, 1).kv_str("general.alignment", "32");
  EXPECT_EQ(parse_error(s), "bad.gguf: general.alignment must be a power of two from 8 to 1 MiB");
  Bytes n;
  n.header(0, 1).str("general.alignment").u32(5).u32(static_cast<uint32_t>(-32));  // i32 -32
  EXPECT_EQ(parse_error(n), "bad.gguf: general.alignment must be a power of two from 8 to 1 MiB");
  Bytes u;
  u.header(0, 1).str("general.alignment").u32(10).u64(~uint64_t{0} - 31);  // u64 2^64-32
  EXPECT_EQ(parse_error(u), "bad.gguf: general.alignment must be a power of two from 8 to 1 MiB");
}

TEST(GgufBadInput, CustomAlignmentIsHonoured) {
  Bytes b;
  b.header(1, 1).kv_u32("general.alignment", 64).tensor("w", {8}, 0, 0).pad(64).zeros(32);
  auto r = GgufFile::parse(b.bytes(), "a64.gguf");
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ((*r)->alignment(), 64u);
  EXPECT_EQ((*r)->data_offset(), 128u);
  Bytes c;
  c.header(1, 1).kv_u32("general.alignment", 64).tensor("w", {8}, 0, 32).pad(64).zeros(64);
  EXPECT_EQ(parse_error(c), "bad.gguf: tensor 'w' offset 32 is not a multiple of the alignment 64");
}

TEST(GgufBadInput, FloatArrayReadAsIntegerSaturates) {
  // array_i64 on f32/f64 elements that do not fit int64 (NaN, inf, 1e30) was undefined
  // behaviour (a float-to-int conversion out of range); it now saturates, NaN reads as 0.
  const float f[] = {std::numeric_limits<float>::quiet_NaN(), 1e30f, -1e30f,
                     std::numeric_limits<float>::infinity(), -7.9f};
  Bytes b;
  b.header(0, 1).str("a").u32(kArr).u32(kF32Type).u64(5).raw(f, sizeof(f));
  auto r = GgufFile::parse(b.bytes(), "f.gguf");
  ASSERT_TRUE(r.has_value()) << r.error().message;
  const GgufValue* v = (*r)->find("a");
  EXPECT_EQ(v->array_i64(0), 0);
  EXPECT_EQ(v->array_i64(1), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(v->array_i64(2), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(v->array_i64(3), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(v->array_i64(4), -7);
  EXPECT_TRUE(std::isnan(v->array_f64(0)));
}

TEST(GgufBadInput, OpenNamesThePathInErrors) {
  const std::string path = std::filesystem::temp_directory_path() /
                           ("troupe_bad_" + std::to_string(::getpid()) + ".gguf");
  {
    std::ofstream out(path, std::ios::binary);
    out.write("GGUF\x01\0\0\0", 8);
  }
  auto r = GgufFile::open(path);
  std::filesystem::remove(path);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().message, path + ": unsupported GGUF version 1 (troupe reads 2 and 3)");
  auto d = GgufFile::open(std::filesystem::temp_directory_path().string());
  ASSERT_FALSE(d.has_value());
  EXPECT_EQ(d.error().message,
            std::filesystem::temp_directory_path().string() + ": not a regular file");
}

TEST(GgufBadInput, EveryTruncationOfAValidFileFailsCleanly) {
  // A writer-made file with every metadata kind, cut at every byte: each prefix is rejected
  // with a message naming the file (and nothing crashes under the sanitizers).
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", 1);
  const std::vector<std::string> toks = {"a", "bc", "def"};
  w.set_string_array("tokenizer.ggml.tokens", toks);
  const std::vector<float> sc = {0.f, -1.f, 2.f};
  w.set_array_f32("tokenizer.ggml.scores", sc);
  w.set_bool("flag", true);
  const int64_t s[] = {32, 2};
  const std::vector<float> x(64, 0.5f);
  ASSERT_TRUE(w.add_tensor_f32("w", GgmlType::kQ8_0, s, x).has_value());
  const std::string path = std::filesystem::temp_directory_path() /
                           ("troupe_trunc_" + std::to_string(::getpid()) + ".gguf");
  ASSERT_TRUE(w.write(path).has_value());
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> full((std::istreambuf_iterator<char>(in)), {});
  std::filesystem::remove(path);
  auto ok = GgufFile::parse(full, "full.gguf");
  ASSERT_TRUE(ok.has_value()) << ok.error().message;
  // Cutting only the zero padding after the last tensor leaves a valid file.
  const TensorInfo& last = (*ok)->tensors().back();
  const size_t end = (*ok)->data_offset() + last.offset + last.nbytes;
  ASSERT_LE(end, full.size());
  for (size_t n = 0; n < end; ++n) {
    std::vector<uint8_t> cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    auto r = GgufFile::parse(cut, "cut.gguf");
    ASSERT_FALSE(r.has_value()) << "prefix of " << n << " bytes parsed";
    EXPECT_EQ(r.error().message.rfind("cut.gguf: ", 0), 0u) << r.error().message;
  }
}

}  // namespace
}  // namespace troupe::model
