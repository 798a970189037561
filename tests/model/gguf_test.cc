#include "model/gguf.h"

#include "tests/test_support.h"

namespace troupe::model {
namespace {

TEST(GgufFile, ReadsStories260K) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto f = GgufFile::open(shared + "/models/stories260K/stories260K.gguf");
  ASSERT_TRUE(f.has_value()) << f.error().message;
  EXPECT_EQ((*f)->get_string("general.architecture"), "llama");
  const TensorInfo* t = (*f)->find_tensor("token_embd.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->ne[1], 512);
}

TEST(GgufFile, MissingFileNamesThePath) {
  auto f = GgufFile::open("/nonexistent/model.gguf");
  ASSERT_FALSE(f.has_value());
  EXPECT_NE(f.error().message.find("/nonexistent/model.gguf"), std::string::npos);
}

}  // namespace
}  // namespace troupe::model
