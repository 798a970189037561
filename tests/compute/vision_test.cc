// Vision-language golden tests: the vision encoders (LLaVA-style CLIP with an MLP projector, and
// Gemma 3's SigLIP-style encoder) against the reference's image embeddings, and a whole VLM
// prompt -- text, the image's embeddings, text -- against the reference's logits
// (../shared/golden/vlm, vlm-encoder; case.json says what each file holds).
#include "model/vision.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "compute/engine.h"
#include "compute/multimodal_prompt.h"
#include "compute/vision_encoder.h"
#include "model/image.h"
#include "model/model.h"
#include "model/synth.h"
#include "model/tokenizer.h"
#include "tests/compute/engine_test_util.h"
#include "tests/compute/golden_check.h"
#include "tests/llava_hf_twin.h"
#include "tests/test_support.h"

namespace troupe::compute {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string shared_path(const std::string& shared, std::string rel) {
  if (rel.rfind("shared/", 0) == 0) rel = rel.substr(7);
  return shared + "/" + rel;
}

std::vector<std::string> case_dirs(const std::string& root) {
  std::vector<std::string> out;
  if (!fs::exists(root)) return out;
  for (const auto& c : fs::directory_iterator(root))
    if (fs::exists(c.path() / "case.json")) out.push_back(c.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

/// max |got - ref| / max |ref|.
double rel_error(const std::vector<float>& got, const std::vector<float>& ref) {
  double mx = 0, d = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    mx = std::max(mx, std::fabs(static_cast<double>(ref[i])));
    d = std::max(d, std::fabs(static_cast<double>(got[i]) - ref[i]));
  }
  return d / mx;
}

std::unique_ptr<VisionEncoder> encoder_for(const std::string& path) {
  auto vm = model::load_vision_model(path);
  EXPECT_TRUE(vm) << vm.error().message;
  if (!vm) return nullptr;
  auto enc = VisionEncoder::create(*vm, 2);
  EXPECT_TRUE(enc) << enc.error().message;
  return enc ? std::move(*enc) : nullptr;
}

// Encodes the case's recorded encoder input and compares with its image embeddings.
void check_encoder(const std::string& dir, const std::string& shared, double tol) {
  const json j = json::parse(testing::read_text_file(dir + "/case.json"));
  auto enc = encoder_for(shared_path(shared, j.at("mmproj_file").get<std::string>()));
  ASSERT_TRUE(enc);
  const auto pixels = testing::read_f32_file(dir + "/preprocessed.f32");
  const auto ref = testing::read_f32_file(dir + "/image_embd.f32");
  ASSERT_EQ(static_cast<int64_t>(ref.size()),
            enc->spec().n_image_tokens() * enc->spec().n_embd_out);
  auto got = enc->encode(pixels);
  ASSERT_TRUE(got) << got.error().message;
  const double err = rel_error(*got, ref);
  std::printf("[golden] vision encoder %s (%s): max|d|/max|ref| = %.3g (tol %.0e)\n",
              fs::path(dir).filename().c_str(), model::projector_name(enc->spec().projector), err,
              tol);
  EXPECT_LE(err, tol);
  // The same from the PNG: decoding and preprocessing give the recorded input exactly.
  auto image = model::read_image_file(shared_path(shared, j.at("image_file").get<std::string>()));
  ASSERT_TRUE(image) << image.error().message;
  EXPECT_EQ(model::preprocess_image(*image, enc->spec().preprocess()), pixels);
  auto from_png = enc->encode(*image);
  ASSERT_TRUE(from_png) << from_png.error().message;
  EXPECT_TRUE(bit_equal(*from_png, *got));
}

TEST(VisionGolden, LlavaEncoderMatchesReference) {
  TROUPE_SHARED_OR_SKIP(shared);
  const auto dirs = case_dirs(shared + "/golden/vlm");
  ASSERT_EQ(dirs.size(), 3u);
  for (const auto& d : dirs) {
    SCOPED_TRACE(d);
    check_encoder(d, shared, 1e-4);
  }
}

// tinygemma3's matrices are Q8_0 (and F16): the reference rounds activations to 8 bits (and to
// f16) for those products, troupe only for the Q8_0 ones, hence the F16 tolerance.
TEST(VisionGolden, Gemma3EncoderMatchesReference) {
  TROUPE_SHARED_OR_SKIP(shared);
  const auto dirs = case_dirs(shared + "/golden/vlm-encoder/tinygemma3");
  ASSERT_EQ(dirs.size(), 3u);
  for (const auto& d : dirs) {
    SCOPED_TRACE(d);
    check_encoder(d, shared, 1e-2);
  }
}

// The prompt of a VLM case: its text chunks' tokens and kEmbedded at the image chunk's
// positions, whose rows are `image_embd`.
GoldenRun vlm_run(const json& j, const std::vector<float>& image_embd, int64_t n_embd) {
  GoldenRun r;
  for (const json& c : j.at("prompt_layout").at("chunks")) {
    if (c.at("type") == "text") {
      for (int32_t t : c.at("tokens").get<std::vector<int32_t>>()) r.prompt.push_back(t);
    } else {
      const int64_t n = c.at("n_tokens").get<int64_t>();
      EXPECT_EQ(static_cast<int64_t>(image_embd.size()), n * n_embd);
      r.prompt.insert(r.prompt.end(), static_cast<size_t>(n), SeqStep::kEmbedded);
      r.embd = image_embd;
    }
  }
  return r;
}

// The whole path of a request: the PNG decoded, preprocessed and encoded, the prompt text split
// at its media marker and tokenized around the image, then the reference's logits. `model_path`
// and `mmproj_path` ("" = the case's files) may name another form of the same pair.
void check_llava_prompts(const std::string& shared, const std::string& model_path = "",
                         const std::string& mmproj_path = "") {
  const auto dirs = case_dirs(shared + "/golden/vlm");
  ASSERT_EQ(dirs.size(), 3u);
  for (const auto& d : dirs) {
    SCOPED_TRACE(d);
    const json j = json::parse(testing::read_text_file(d + "/case.json"));
    auto loaded = model::load_model(model_path.empty()
                                        ? shared_path(shared, j.at("model_file").get<std::string>())
                                        : model_path);
    ASSERT_TRUE(loaded) << loaded.error().message;
    const std::shared_ptr<const model::Model> model = *loaded;
    auto enc = encoder_for(mmproj_path.empty()
                               ? shared_path(shared, j.at("mmproj_file").get<std::string>())
                               : mmproj_path);
    ASSERT_TRUE(enc);
    auto image = model::read_image_file(shared_path(shared, j.at("image_file").get<std::string>()));
    ASSERT_TRUE(image) << image.error().message;
    auto embd = enc->encode(*image);
    ASSERT_TRUE(embd) << embd.error().message;
    const double err = rel_error(*embd, testing::read_f32_file(d + "/image_embd.f32"));
    EXPECT_LE(err, 1e-4) << "image embeddings from the PNG";

    const std::vector<std::vector<float>> images = {*embd};
    auto prompt = build_multimodal_prompt(*model->tokenizer, j.at("prompt_text").get<std::string>(),
                                          images, enc->spec(), /*add_bos=*/true);
    ASSERT_TRUE(prompt) << prompt.error().message;
    GoldenRun r = vlm_run(j, *embd, model->spec.n_embd);
    EXPECT_EQ(prompt->tokens, r.prompt) << "the prompt's layout around the image";
    EXPECT_EQ(prompt->embd, r.embd);
    r.label = "vlm " + fs::path(d).filename().string() + (model_path.empty() ? "" : " (hf)");
    check_golden_run(model, j, d, 1e-4, r);
  }
}

TEST(VisionGolden, LlavaPromptFromPngMatchesReference) {
  TROUPE_SHARED_OR_SKIP(shared);
  check_llava_prompts(shared);
}

// The same pair in Hugging Face form (LlavaForConditionalGeneration, one directory for both
// halves, in each of transformers' two layouts) gives the reference's logits too.
TEST(VisionGolden, LlavaHuggingFaceFormMatchesReference) {
  TROUPE_SHARED_OR_SKIP(shared);
  for (auto layout : {testing::LlavaLayout::kBefore452, testing::LlavaLayout::kAfter452}) {
    testing::TempDir dir;
    ASSERT_NO_FATAL_FAILURE(testing::write_llava_hf_twin(shared, dir, layout));
    check_llava_prompts(shared, dir.path(), dir.path());
  }
}

// Chunked prefill across the image (text, part of the image, the rest) and a batch with a text
// sequence give the same bits as one chunk alone.
TEST(VisionGolden, ImagePositionsAreBatchAndChunkInvariant) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string dir = shared + "/golden/vlm/llava-tiny__circles_64x64__look";
  const json j = json::parse(testing::read_text_file(dir + "/case.json"));
  auto model = load_model_for_test(shared_path(shared, j.at("model_file").get<std::string>()));
  ASSERT_TRUE(model);
  auto enc = encoder_for(shared_path(shared, j.at("mmproj_file").get<std::string>()));
  ASSERT_TRUE(enc);
  auto embd = enc->encode(testing::read_f32_file(dir + "/preprocessed.f32"));
  ASSERT_TRUE(embd);
  const GoldenRun r = vlm_run(j, *embd, model->spec.n_embd);
  const int64_t E = model->spec.n_embd, n = static_cast<int64_t>(r.prompt.size());
  auto eng = Engine::create(model, EngineOptions{});
  ASSERT_TRUE(eng);
  auto last_logits = [&](const std::vector<int64_t>& cuts, bool with_other) {
    Sequence seq(**eng), other(**eng);
    EXPECT_TRUE(seq.reserve(n) && other.reserve(n));
    StepResult res;
    int64_t at = 0, row = 0;  // row: the next embedding row
    const std::vector<int32_t> text(r.prompt.begin(), r.prompt.begin() + 10);
    for (int64_t cut : cuts) {
      std::vector<SeqStep> steps(1);
      steps[0] =
          seq.next({r.prompt.data() + at, static_cast<size_t>(cut - at)}, SeqStep::Logits::kLast);
      const int64_t k =
          std::count(r.prompt.begin() + at, r.prompt.begin() + cut, SeqStep::kEmbedded);
      steps[0].embd = {r.embd.data() + row * E, static_cast<size_t>(k * E)};
      if (with_other) steps.push_back(other.next(text, SeqStep::Logits::kAll));
      const Status ok = (*eng)->step(steps, &res);
      EXPECT_TRUE(ok.has_value()) << ok.error().message;
      seq.advance(cut - at);
      if (with_other) other.advance(0);
      row += k;
      at = cut;
    }
    return std::vector<float>(res.row(0), res.row(0) + res.n_vocab);
  };
  const auto whole = last_logits({n}, false);
  EXPECT_TRUE(bit_equal(whole, last_logits({5, 20, 27, n}, false)));
  EXPECT_TRUE(bit_equal(whole, last_logits({n}, true)));
}

TEST(VisionPrompt, MarkerCountMustMatchImages) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto loaded = model::load_model(shared + "/models/synth/llava-tiny/model.gguf");
  ASSERT_TRUE(loaded) << loaded.error().message;
  const std::shared_ptr<const model::Model> model = *loaded;
  auto vm = model::load_vision_model(shared + "/models/synth/llava-tiny/mmproj.gguf");
  ASSERT_TRUE(vm) << vm.error().message;
  const model::VisionSpec& v = (*vm)->spec;
  const std::vector<std::vector<float>> one(
      1, std::vector<float>(static_cast<size_t>(v.n_image_tokens() * v.n_embd_out)));
  auto two =
      build_multimodal_prompt(*model->tokenizer, "a <__media__> b <__media__>", one, v, true);
  ASSERT_FALSE(two);
  EXPECT_NE(two.error().message.find("2 image markers"), std::string::npos) << two.error().message;
  // Without a marker the image comes first, after BOS.
  auto first = build_multimodal_prompt(*model->tokenizer, "Once", one, v, true);
  ASSERT_TRUE(first) << first.error().message;
  EXPECT_EQ(first->tokens[0], model->tokenizer->bos_id());
  EXPECT_EQ(first->tokens[1], SeqStep::kEmbedded);
  EXPECT_EQ(first->tokens[static_cast<size_t>(v.n_image_tokens())], SeqStep::kEmbedded);
  EXPECT_NE(first->tokens.back(), SeqStep::kEmbedded);
  // An image of the wrong size.
  const std::vector<std::vector<float>> bad(1, std::vector<float>(7));
  auto wrong = build_multimodal_prompt(*model->tokenizer, "<__media__>", bad, v, true);
  ASSERT_FALSE(wrong);
  EXPECT_NE(wrong.error().message.find("7 embedding values"), std::string::npos);
}

// Prefill steps: a non-causal image is one step of its own, whatever the chunk size; causal
// prompts are cut only by the chunk size.
TEST(VisionPrompt, PrefillChunksKeepNonCausalImagesWhole) {
  MultimodalPrompt p;
  const int32_t I = SeqStep::kEmbedded;
  p.tokens = {1, 2, 3, I, I, I, I, I, 4, 5, I, I, 6};
  p.images = {{3, 5}, {10, 2}};
  auto as_tuples = [](const std::vector<PrefillChunk>& cs) {
    std::vector<std::vector<int64_t>> out;
    for (const auto& c : cs) out.push_back({c.begin, c.end, c.row_begin, c.non_causal ? 1 : 0});
    return out;
  };
  using V = std::vector<std::vector<int64_t>>;
  EXPECT_EQ(as_tuples(prefill_chunks(p, 4)),
            (V{{0, 4, 0, 0}, {4, 8, 1, 0}, {8, 12, 5, 0}, {12, 13, 7, 0}}));
  p.non_causal_images = true;
  EXPECT_EQ(as_tuples(prefill_chunks(p, 4)),
            (V{{0, 3, 0, 0}, {3, 8, 0, 1}, {8, 10, 5, 0}, {10, 12, 5, 1}, {12, 13, 7, 0}}));
  EXPECT_EQ(as_tuples(prefill_chunks(p, 100)),
            (V{{0, 3, 0, 0}, {3, 8, 0, 1}, {8, 10, 5, 0}, {10, 12, 5, 1}, {12, 13, 7, 0}}));
}

// Synthetic encoders of both kinds (troupe synth --arch clip) load, give finite rows of the text
// model's width, and the same bits with 1 and 2 threads.
TEST(VisionEncoderSynth, BothProjectorsAreThreadInvariant) {
  testing::TempDir dir;
  for (const char* proj : {"mlp", "gemma3"}) {
    SCOPED_TRACE(proj);
    model::MmprojSynthOptions o;
    o.projector = proj;
    o.image_size = 48;
    o.patch_size = 8;
    o.n_embd = 64;
    o.n_ff = 96;
    o.n_layer = 3;
    o.n_layer_used = 2;
    o.n_head = 4;
    o.proj_dim = 80;
    o.merge = 2;
    o.dtype = model::GgmlType::kQ8_0;
    const std::string path = dir.file(std::string(proj) + ".gguf");
    ASSERT_TRUE(model::synth_mmproj(o, path).has_value());
    auto vm = model::load_vision_model(path);
    ASSERT_TRUE(vm) << vm.error().message;
    EXPECT_EQ((*vm)->spec.n_image_tokens(), std::string(proj) == "mlp" ? 36 : 9);
    model::Image img;
    img.width = 70;
    img.height = 50;
    for (int i = 0; i < img.width * img.height * 3; ++i)
      img.rgb.push_back(static_cast<uint8_t>((i * 37) % 251));
    std::vector<std::vector<float>> outs;
    for (int threads : {1, 2}) {
      auto enc = VisionEncoder::create(*vm, threads);
      ASSERT_TRUE(enc);
      auto e = (*enc)->encode(img);
      ASSERT_TRUE(e) << e.error().message;
      ASSERT_EQ(static_cast<int64_t>(e->size()), (*vm)->spec.n_image_tokens() * 80);
      for (float v : *e) ASSERT_TRUE(std::isfinite(v));
      outs.push_back(*e);
    }
    EXPECT_TRUE(bit_equal(outs[0], outs[1]));
  }
}

// The engine refuses embedded positions without their rows, or with too many.
TEST(VisionPrompt, EngineChecksEmbeddingRows) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto model = load_model_for_test(shared + "/models/synth/llava-tiny/model.gguf");
  ASSERT_TRUE(model);
  auto eng = Engine::create(model, EngineOptions{});
  ASSERT_TRUE(eng);
  Sequence seq(**eng);
  ASSERT_TRUE(seq.reserve(4));
  const std::vector<int32_t> toks = {1, SeqStep::kEmbedded, SeqStep::kEmbedded, 5};
  StepResult res;
  SeqStep st = seq.next(toks, SeqStep::Logits::kLast);
  Status s = (*eng)->step({&st, 1}, &res);
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.error().message.find("2 embedded positions"), std::string::npos) << s.error().message;
  const std::vector<float> rows(static_cast<size_t>(3 * model->spec.n_embd));
  st.embd = rows;
  s = (*eng)->step({&st, 1}, &res);
  ASSERT_FALSE(s.has_value());
  st.embd = {rows.data(), static_cast<size_t>(2 * model->spec.n_embd)};
  s = (*eng)->step({&st, 1}, &res);
  EXPECT_TRUE(s.has_value()) << s.error().message;
}

}  // namespace
}  // namespace troupe::compute
