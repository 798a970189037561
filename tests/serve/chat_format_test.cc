// Chat prompt families (serve/chat_format.h): detection from templates, each family's rendering
// against the text its reference template writes (written out by hand here from those
// templates), the refusals, and Phi-3's real template and vocabulary from ../shared.
#include "serve/chat_format.h"

#include <gtest/gtest.h>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tests/test_support.h"

namespace troupe::serve {
namespace {

const std::vector<ChatMessage> kTalk = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", " Hello! "}, {"user", "Sky colour?"}};

std::string render(ChatFormat f, const std::vector<ChatMessage>& m) {
  auto r = render_chat(f, m);
  EXPECT_TRUE(r) << r.error().message;
  return r ? *r : "";
}

TEST(ChatFormat, DetectsFamiliesByTheirControlTexts) {
  EXPECT_EQ(detect_chat_format(""), ChatFormat::kNone);
  EXPECT_EQ(detect_chat_format("{{ messages }}"), ChatFormat::kNone);
  EXPECT_EQ(detect_chat_format("{{'<|im_start|>' + m.role}}"), ChatFormat::kChatMl);
  EXPECT_EQ(detect_chat_format("<|start_header_id|>{{r}}<|end_header_id|>"), ChatFormat::kLlama3);
  EXPECT_EQ(detect_chat_format("[INST] <<SYS>>"), ChatFormat::kLlama2);
  EXPECT_EQ(detect_chat_format("{{ '[INST] ' + c + ' [/INST]' }}"), ChatFormat::kMistral);
  EXPECT_EQ(detect_chat_format("<start_of_turn>model"), ChatFormat::kGemma);
  EXPECT_EQ(detect_chat_format("{{'<｜User｜>' + c}}"), ChatFormat::kDeepseek);
  EXPECT_EQ(detect_chat_format("<|user|>\n{{c}}<|end|>\n<|assistant|>"), ChatFormat::kPhi3);
  EXPECT_EQ(chat_format_name(ChatFormat::kGemma), "gemma");
}

TEST(ChatFormat, RendersEachFamilyAsItsTemplateDoes) {
  EXPECT_EQ(render(ChatFormat::kChatMl, kTalk),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n Hello! <|im_end|>\n<|im_start|>user\nSky colour?<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(render(ChatFormat::kLlama3, kTalk),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nSky colour?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(render(ChatFormat::kLlama2, kTalk),
            "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s>"
            "<s>[INST] Sky colour? [/INST]");
  EXPECT_EQ(render(ChatFormat::kGemma, kTalk),
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
            "<start_of_turn>model\nHello!<end_of_turn>\n"
            "<start_of_turn>user\nSky colour?<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(render(ChatFormat::kDeepseek, kTalk),
            "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜> Hello! "
            "<｜end▁of▁sentence｜><｜User｜>Sky colour?<｜Assistant｜>");
  const std::vector<ChatMessage> no_system(kTalk.begin() + 1, kTalk.end());
  EXPECT_EQ(render(ChatFormat::kMistral, no_system),
            "<s>[INST] Hi [/INST] Hello! </s>[INST] Sky colour? [/INST]");
  EXPECT_EQ(render(ChatFormat::kPhi3, no_system),
            "<s><|user|>\nHi<|end|>\n<|assistant|>\n Hello! <|end|>\n<|user|>\nSky colour?<|end|>\n"
            "<|assistant|>\n");
  // "developer" is OpenAI's newer name for the system role.
  EXPECT_EQ(render(ChatFormat::kChatMl, {{"developer", "D"}, {"user", "U"}}),
            "<|im_start|>system\nD<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatFormat, RefusesWhatTheTemplateWouldRejectOrDrop) {
  auto why = [](ChatFormat f, const std::vector<ChatMessage>& m) {
    auto r = render_chat(f, m);
    EXPECT_FALSE(r);
    return r ? std::string() : r.error().message;
  };
  EXPECT_NE(why(ChatFormat::kChatMl, {}).find("messages is empty"), std::string::npos);
  EXPECT_NE(why(ChatFormat::kChatMl, {{"tool", "x"}}).find("messages[0]: role 'tool'"),
            std::string::npos);
  EXPECT_NE(why(ChatFormat::kLlama2, {{"user", "a"}, {"user", "b"}})
                .find("messages[1]: role 'user' where 'assistant' is due"),
            std::string::npos);
  EXPECT_NE(why(ChatFormat::kGemma, {{"user", "a"}, {"assistant", "b"}})
                .find("the last message must be the user's"),
            std::string::npos);
  EXPECT_NE(why(ChatFormat::kMistral, {{"system", "s"}, {"user", "u"}})
                .find("no place for a system message"),
            std::string::npos);
  EXPECT_NE(why(ChatFormat::kPhi3, {{"system", "s"}, {"user", "u"}})
                .find("no place for a system message"),
            std::string::npos);
  EXPECT_NE(why(ChatFormat::kNone, {{"user", "u"}}).find("no chat template"), std::string::npos);
}

TEST(ChatFormat, Phi3sOwnTemplateAndVocabulary) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto g = model::GgufFile::open(shared + "/models/llama.cpp-vocab/ggml-vocab-phi-3.gguf");
  ASSERT_TRUE(g) << g.error().message;
  const std::string tmpl = (*g)->get_string_or("tokenizer.chat_template", "");
  ASSERT_EQ(detect_chat_format(tmpl), ChatFormat::kPhi3) << tmpl;
  auto tok = model::Tokenizer::from_gguf(**g);
  ASSERT_TRUE(tok) << tok.error().message;
  for (std::string_view t : chat_format_tokens(ChatFormat::kPhi3))
    EXPECT_GE((*tok)->find_token(t), 0) << t;
  const std::string text = render(ChatFormat::kPhi3, {{"user", "Hi"}});
  const auto ids = (*tok)->encode(text, false, true);
  // <s>, <|user|>, the text, <|end|>, <|assistant|>: the control texts each one token.
  ASSERT_GE(ids.size(), 5u);
  EXPECT_EQ(ids[0], (*tok)->find_token("<s>"));
  EXPECT_EQ(ids[1], (*tok)->find_token("<|user|>"));
  int ends = 0, assistants = 0;
  for (int32_t id : ids) {
    ends += id == (*tok)->find_token("<|end|>");
    assistants += id == (*tok)->find_token("<|assistant|>");
  }
  EXPECT_EQ(ends, 1);
  EXPECT_EQ(assistants, 1);
}

}  // namespace
}  // namespace troupe::serve
