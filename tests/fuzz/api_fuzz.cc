// libFuzzer entry for the HTTP API's request parser (serve/openai.cc): every byte of a request
// body comes from the network. Each input is parsed as a /v1/completions and as a
// /v1/chat/completions body against two served models: stories260K (no chat template) and a
// model on Phi-3's vocabulary with its chat template (../shared). Checks: parse_request either
// refuses with an error naming a status in 400..404 and a message, or gives choices whose prompt
// ids are in the vocabulary and whose prompt plus max_tokens fit max_model_len; the answers'
// JSON (whole, chunk, usage, logprobs) is then built from stand-in results. Needs ../shared (or
// $TROUPE_SHARED_DIR): without it the fuzzer stops at start with a message.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model/gguf.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "serve/openai.h"
#include "serve/reply_stream.h"
#include "serve/tool_calls.h"

namespace {

using troupe::model::GgufFile;
using troupe::model::Model;
using troupe::model::Tokenizer;
using namespace troupe::serve;

struct Served {
  std::unique_ptr<GgufFile> gguf;  // the tokenizer reads its metadata while it is built
  std::shared_ptr<Model> model;
  ServedModel served;
};
std::vector<Served>* g_served = nullptr;

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "api_fuzz: %s\n", what);
    std::abort();
  }
}

Served load(const std::string& path, bool with_template) {
  Served s;
  auto g = GgufFile::open(path);
  if (!g) {
    std::fprintf(stderr, "api_fuzz: %s: %s\n", path.c_str(), g.error().message.c_str());
    std::exit(1);
  }
  s.gguf = std::move(*g);
  auto tok = Tokenizer::from_gguf(*s.gguf);
  if (!tok) {
    std::fprintf(stderr, "api_fuzz: %s: %s\n", path.c_str(), tok.error().message.c_str());
    std::exit(1);
  }
  s.model = std::make_shared<Model>();
  s.model->path = path;
  s.model->spec.n_vocab = (*tok)->n_vocab();
  s.model->tokenizer = std::shared_ptr<const Tokenizer>(std::move(*tok));
  if (with_template) s.model->chat_template = s.gguf->get_string_or("tokenizer.chat_template", "");
  s.served.id = "m";
  s.served.model = s.model;
  s.served.max_model_len = 256;
  s.served.max_choices = 8;
  if (with_template)
    require(static_cast<bool>(set_chat_template(&s.served, s.model->chat_template)),
            "the vocabulary's chat template does not compile");
  return s;
}

void check(Endpoint ep, std::string_view body, const ServedModel& served) {
  ApiRequest req;
  ApiError err;
  if (!parse_request(ep, body, served, &req, &err)) {
    require(err.status >= 400 && err.status <= 404, "an error's status is not 400..404");
    require(!err.message.empty(), "an error without a message");
    require(!error_body(err).empty(), "no error body");
    return;
  }
  require(!req.choices.empty(), "no choices");
  require(static_cast<int64_t>(req.choices.size()) <= served.max_choices, "too many choices");
  const int64_t n_vocab = served.model->spec.n_vocab;
  std::vector<troupe::actors::GenerateResult> results;
  std::vector<std::vector<TokenLogprob>> logprobs;
  for (const auto& c : req.choices) {
    for (int32_t t : c.prompt_tokens)
      require(t >= 0 && t < n_vocab, "a prompt id outside the vocabulary");
    require(c.max_tokens >= 0, "negative max_tokens");
    if (!c.image_files)
      require(static_cast<int64_t>(c.prompt_tokens.size()) + c.max_tokens <= served.max_model_len,
              "prompt + max_tokens past max_model_len");
    troupe::actors::GenerateResult r;
    r.prompt_tokens = c.prompt_tokens;
    r.tokens = {1, 2};
    r.text = "x\xff";  // invalid UTF-8 must not break the JSON
    r.finish_reason = "length";
    results.push_back(r);
    std::vector<float> logits(static_cast<size_t>(n_vocab), 0.5f);
    logprobs.push_back({token_logprob(logits, 1, req.logprobs < 0 ? 0 : req.logprobs)});
  }
  require(!response_body(req, "id", 0, served.id, results, logprobs, served.model->tokenizer.get())
               .empty(),
          "no answer");
  require(!chunk_body(ep, "id", 0, served.id, 0, "x", true, "",
                      logprobs_json(ep, served.model->tokenizer.get(), logprobs[0], 0))
               .empty(),
          "no chunk");
  require(!usage_chunk_body(ep, "id", 0, served.id, results).empty(), "no usage chunk");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* env = std::getenv("TROUPE_SHARED_DIR");
  const std::string shared = env && *env ? env : "../shared";
  g_served = new std::vector<Served>();
  g_served->push_back(load(shared + "/models/stories260K/stories260K.gguf", false));
  g_served->push_back(load(shared + "/models/llama.cpp-vocab/ggml-vocab-phi-3.gguf", true));
  return 0;
}

// The input as a model's reply, in every tool-call format: a reply without calls is all content,
// and the streamed prefix never passes the reply or the first call.
void check_tool_parsers(std::string_view reply) {
  static const ToolParamTypes types = {{"f", {{"a", "integer"}, {"b", "string"}, {"c", "object"}}}};
  for (ToolFormat f :
       {ToolFormat::kHermes, ToolFormat::kLlama3Json, ToolFormat::kMistral, ToolFormat::kDeepseekV3,
        ToolFormat::kKimiK2, ToolFormat::kGlm45, ToolFormat::kQwen3Coder, ToolFormat::kSeedOss,
        ToolFormat::kMinimaxM2, ToolFormat::kPythonic, ToolFormat::kForcedCalls}) {
    const ParsedReply p = parse_tool_calls(f, reply, reply.size() % 2 ? &types : nullptr);
    if (p.calls.empty()) require(p.content == reply, "a reply without calls lost text");
    for (const ToolCall& c : p.calls) require(!c.name.empty(), "a tool call without a name");
    require(streamable_prefix(f, reply) <= reply.size(), "a streamed prefix past the reply");
  }
  // gpt-oss's harmony channels, whole and in pieces: the same split.
  ReplyFormat harmony;
  harmony.harmony = true;
  const ReplyStream::Split whole = ReplyStream::split(harmony, reply);
  ReplyStream pieces(harmony);
  std::string reasoning, content;
  for (size_t at = 0; at < reply.size(); at += 3) {
    const ReplyStream::Delta d = pieces.push(reply.substr(at, 3));
    reasoning += d.reasoning;
    content += d.content;
  }
  const ReplyStream::End end = pieces.finish();
  require(reasoning + end.rest.reasoning == whole.reasoning &&
              content + end.rest.content == whole.content && end.calls.size() == whole.calls.size(),
          "harmony replies split differently in pieces");
  for (const ToolCall& c : whole.calls) require(!c.name.empty(), "a harmony call without a name");
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (const Served& s : *g_served) {
    check(Endpoint::kCompletions, body, s.served);
    check(Endpoint::kChat, body, s.served);
  }
  check_tool_parsers(body);
  return 0;
}
