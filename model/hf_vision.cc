// Hugging Face vision towers -> VisionSpec: LlavaForConditionalGeneration (a CLIP ViT and the
// two-layer "mlp" projector of LLaVA 1.5) and Gemma3ForConditionalGeneration (a SigLIP ViT, k x k
// pooling, soft-embedding norm and projection), read from config.json, preprocessor_config.json
// and the safetensors of the model directory, so that a released checkpoint runs as it is,
// without a separate mmproj file. The spec is the one llama.cpp's converter would write for the
// same checkpoint, so both forms compute the same rows. LLaVA:
// - The ViT runs the blocks up to vision_feature_layer (hidden_states[-2] by default: all but the
//   last); post_layernorm is not applied (LLaVA reads hidden states, which precede it).
// - hidden_act "gelu" and the projector's GELU are computed as llama.cpp computes GELU (its tanh
//   form, through f16), as for a GGUF mmproj; "quick_gelu" (CLIP's) is exact.
// - Images are fitted and padded to a square as llama.cpp does for LLaVA (the LLaVA 1.5 training
//   recipe), not centre-cropped as transformers' CLIPImageProcessor does; the mean and standard
//   deviation come from preprocessor_config.json.
// Gemma 3: every block and post_layernorm; the pooling from mm_tokens_per_image; the norm's
// weight + 1 (Gemma's norms multiply by 1 + w); images resized bilinearly and padded as llama.cpp
// does. Norms, biases and the class token become f32 copies; matrices stay views of the mapping
// (Gemma 3's projection a transposed copy: one row per output).
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include "base/check.h"
#include "model/detail/hf_config.h"
#include "model/detail/vision_weights.h"
#include "model/ggml_types.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/vision.h"

namespace troupe::model {

namespace {

using nlohmann::json;

long long ll(int64_t v) { return static_cast<long long>(v); }

// transformers' OPENAI_CLIP_MEAN / OPENAI_CLIP_STD, CLIPImageProcessor's defaults.
constexpr std::array<float, 3> kClipMean = {0.48145466f, 0.4578275f, 0.40821073f};
constexpr std::array<float, 3> kClipStd = {0.26862954f, 0.26130258f, 0.27577711f};

class HfVisionLoader {
 public:
  HfVisionLoader(const SafetensorsSet& st, const json& config, const json& pre, std::string path,
                 std::vector<std::shared_ptr<const void>>* storage)
      : st_(st), config_(config), pre_(pre), path_(std::move(path)), storage_(storage) {}

  VisionSpec build() {
    const std::string arch = architecture();
    VisionSpec s;
    if (arch == "LlavaForConditionalGeneration") {
      s.projector = Projector::kMlp;
    } else if (arch == "Gemma3ForConditionalGeneration") {
      s.projector = Projector::kGemma3;
    } else {
      fail(
          strfmt("'%s' has no vision tower troupe reads (it reads LlavaForConditionalGeneration "
                 "and Gemma3ForConditionalGeneration)",
                 arch.c_str()));
    }
    read_vision_config(&s);
    const bool after =
        st_.find("model.vision_tower.vision_model.embeddings.patch_embedding.weight");
    tower_ = after ? "model.vision_tower.vision_model." : "vision_tower.vision_model.";
    projector_ = after ? "model.multi_modal_projector." : "multi_modal_projector.";
    read_encoder(&s);
    if (s.projector == Projector::kMlp)
      read_mlp_projector(&s);
    else
      read_gemma3_projector(&s);
    return s;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw InputError(path_ + ": " + what); }

  std::string architecture() const {
    auto a = config_.find("architectures");
    if (a == config_.end() || !a->is_array() || a->empty() || !(*a)[0].is_string())
      fail("missing \"architectures\" (a list of class names)");
    return (*a)[0].get<std::string>();
  }

  // config[key] as an integer in [lo, hi], or `def` when absent.
  int64_t integer(const json& j, const char* key, int64_t def, int64_t lo, int64_t hi) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return def;
    if (!it->is_number_integer()) fail(strfmt("\"%s\" must be an integer", key));
    const int64_t v = it->get<int64_t>();
    if (v < lo || v > hi)
      fail(strfmt("\"%s\" = %lld is outside %lld..%lld", key, ll(v), ll(lo), ll(hi)));
    return v;
  }
  std::string text(const json& j, const char* key, const char* def) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return def;
    if (!it->is_string()) fail(strfmt("\"%s\" must be a string", key));
    return it->get<std::string>();
  }

  VisionAct activation(const std::string& name, const char* key) const {
    if (name == "quick_gelu") return VisionAct::kGeluQuick;
    if (name == "gelu" || name == "gelu_pytorch_tanh") return VisionAct::kGelu;
    if (name == "silu") return VisionAct::kSilu;
    fail(strfmt("%s \"%s\" is not supported (quick_gelu, gelu, gelu_pytorch_tanh, silu)", key,
                name.c_str()));
  }

  std::array<float, 3> triple(const char* key, std::array<float, 3> def) const {
    auto it = pre_.find(key);
    if (it == pre_.end() || it->is_null()) return def;
    if (!it->is_array() || it->size() != 3)
      fail(strfmt("preprocessor_config.json: \"%s\" must be a list of 3 numbers", key));
    std::array<float, 3> out{};
    for (size_t c = 0; c < 3; ++c) {
      if (!(*it)[c].is_number())
        fail(strfmt("preprocessor_config.json: \"%s\" must be a list of 3 numbers", key));
      out[c] = (*it)[c].get<float>();
    }
    return out;
  }

  void read_vision_config(VisionSpec* s) {
    auto vc = config_.find("vision_config");
    if (vc == config_.end() || !vc->is_object()) fail("missing \"vision_config\"");
    const bool clip = s->projector == Projector::kMlp;
    const char* want = clip ? "clip_vision_model" : "siglip_vision_model";
    const std::string type = text(*vc, "model_type", want);
    if (type != want)
      fail(strfmt("vision_config.model_type '%s' is not supported (troupe reads %s here)",
                  type.c_str(), want));
    // CLIPVisionConfig's or SiglipVisionConfig's defaults, for the keys a config leaves out.
    s->n_embd = integer(*vc, "hidden_size", 768, 1, 1 << 16);
    s->n_ff = integer(*vc, "intermediate_size", 3072, 1, 1 << 18);
    s->n_head = integer(*vc, "num_attention_heads", 12, 1, 1024);
    n_layer_ = integer(*vc, "num_hidden_layers", 12, 1, 1024);
    s->image_size = integer(*vc, "image_size", 224, 1, 8192);
    s->patch_size = integer(*vc, "patch_size", clip ? 32 : 16, 1, 1024);
    if (s->image_size % s->patch_size != 0)
      fail(strfmt("image size %lld is not a multiple of the patch size %lld", ll(s->image_size),
                  ll(s->patch_size)));
    if (s->n_embd % s->n_head != 0)
      fail(strfmt("width %lld is not a multiple of the head count %lld", ll(s->n_embd),
                  ll(s->n_head)));
    s->act = activation(text(*vc, "hidden_act", clip ? "quick_gelu" : "gelu_pytorch_tanh"),
                        "vision_config.hidden_act");
    auto eps = vc->find("layer_norm_eps");
    s->eps = eps == vc->end() || eps->is_null() ? (clip ? 1e-5f : 1e-6f)
             : eps->is_number()                 ? eps->get<float>()
                                                : -1.0f;
    if (!(s->eps > 0.0f && s->eps < 1.0f))
      fail("vision_config.layer_norm_eps must be a number in (0, 1)");
    if (!clip) return read_gemma3_config(s);
    // LLaVA's own keys.
    const std::string strategy = text(config_, "vision_feature_select_strategy", "default");
    if (strategy != "default")
      fail(strfmt(
          "vision_feature_select_strategy '%s' is not supported (troupe drops the class token: "
          "'default')",
          strategy.c_str()));
    const std::string proj_act = text(config_, "projector_hidden_act", "gelu");
    if (activation(proj_act, "projector_hidden_act") != VisionAct::kGelu)
      fail(strfmt("projector_hidden_act '%s' is not supported (gelu)", proj_act.c_str()));
    feature_layers(s);
    s->mean = triple("image_mean", kClipMean);
    s->std = triple("image_std", kClipStd);
    for (float v : s->std)
      if (!(v > 0.0f)) fail("preprocessor_config.json: image_std must be positive");
  }

  // Gemma 3: every block and post_layernorm run; the projector pools the patches k x k down to
  // mm_tokens_per_image (a square).
  void read_gemma3_config(VisionSpec* s) {
    s->n_layer_run = n_layer_;
    const int64_t tokens = integer(config_, "mm_tokens_per_image", 256, 1, 1 << 20);
    int64_t side = 1;
    while ((side + 1) * (side + 1) <= tokens) ++side;
    if (side * side != tokens || s->patches_per_side() % side != 0)
      fail(
          strfmt("mm_tokens_per_image %lld is not the square of a divisor of the %lld patches a "
                 "side",
                 ll(tokens), ll(s->patches_per_side())));
    s->merge = s->patches_per_side() / side;
    s->mean = triple("image_mean", {0.5f, 0.5f, 0.5f});
    s->std = triple("image_std", {0.5f, 0.5f, 0.5f});
    for (float v : s->std)
      if (!(v > 0.0f)) fail("preprocessor_config.json: image_std must be positive");
  }

  // vision_feature_layer: an index into hidden_states (0: the embeddings, i: block i's output;
  // negative from the end), or a list of them concatenated along the width.
  void feature_layers(VisionSpec* s) {
    std::vector<int64_t> layers;
    auto f = config_.find("vision_feature_layer");
    const auto index = [&](const json& v) {
      if (!v.is_number_integer()) fail("vision_feature_layer must be an integer or a list of them");
      int64_t l = v.get<int64_t>();
      if (l < 0) l += n_layer_ + 1;
      if (l < 0 || l > n_layer_)
        fail(strfmt("vision_feature_layer %lld is outside the %lld hidden states",
                    ll(v.get<int64_t>()), ll(n_layer_ + 1)));
      return l;
    };
    if (f == config_.end() || f->is_null()) {
      layers.push_back(n_layer_ - 1);  // transformers' default, -2
    } else if (f->is_array()) {
      if (f->empty() || f->size() > 16) fail("vision_feature_layer lists 1 to 16 layers");
      for (const json& v : *f) layers.push_back(index(v));
      for (size_t i = 1; i < layers.size(); ++i)
        if (layers[i] <= layers[i - 1])
          fail("vision_feature_layer must list its layers in increasing order");
    } else {
      layers.push_back(index(*f));
    }
    s->n_layer_run = layers.back();
    if (layers.size() > 1) s->feature_layers = layers;
  }

  const SafetensorsTensor& find(const std::string& name, const std::vector<int64_t>& shape) const {
    const SafetensorsTensor* t = st_.find(name);
    if (!t) fail(strfmt("missing tensor '%s'", name.c_str()));
    if (t->shape != shape) {
      std::string want = "[";
      for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
      fail(strfmt("tensor '%s' has shape %s, expected %s]", name.c_str(), t->shape_string().c_str(),
                  want.c_str()));
    }
    if (!t->supported ||
        (t->type != GgmlType::kF32 && t->type != GgmlType::kF16 && t->type != GgmlType::kBF16))
      fail(strfmt("tensor '%s' has type %s (expected F32, F16 or BF16)", name.c_str(),
                  t->dtype.c_str()));
    return *t;
  }

  static WeightView view(const std::string& name, GgmlType type, int64_t cols, int64_t rows,
                         const uint8_t* data) {
    WeightView v;
    v.name = name;
    v.type = type;
    v.ne[0] = cols;
    v.ne[1] = rows;
    v.ne[2] = 1;
    v.data = data;
    return v;
  }

  // A matrix [rows, cols] as stored (a copy only where the data is misaligned for its type).
  WeightView matrix(const std::string& name, int64_t rows, int64_t cols) {
    const SafetensorsTensor& t = find(name, {rows, cols});
    return view(name, t.type, cols, rows, aligned(t));
  }
  const uint8_t* aligned(const SafetensorsTensor& t) {
    const size_t es = t.type == GgmlType::kF32 ? 4 : 2;
    if (reinterpret_cast<uintptr_t>(t.data) % es == 0) return t.data;
    auto copy = std::make_shared<std::vector<uint8_t>>(t.data, t.data + t.nbytes);
    storage_->push_back(copy);
    return copy->data();
  }

  // A vector of n values as f32 (norms, biases, the class token), `add` added to each.
  WeightView vec(const std::string& name, int64_t n, float add = 0.0f) {
    const SafetensorsTensor& t = find(name, {n});
    auto out = std::make_shared<std::vector<float>>(static_cast<size_t>(n));
    dequantize_view_row(view(name, t.type, n, 1, t.data), 0, out->data());
    if (add != 0.0f)
      for (float& x : *out) x += add;
    storage_->push_back(out);
    return view(name, GgmlType::kF32, n, 1, reinterpret_cast<const uint8_t*>(out->data()));
  }
  WeightView opt_vec(const std::string& name, int64_t n) {
    return st_.find(name) ? vec(name, n) : WeightView{};
  }

  void read_encoder(VisionSpec* s) {
    const int64_t E = s->n_embd, P = s->patch_size;
    const std::string e = tower_ + "embeddings.";
    const SafetensorsTensor& patch = find(e + "patch_embedding.weight", {E, 3, P, P});
    s->patch_w = view(patch.name, patch.type, 3 * P * P, E, aligned(patch));
    s->patch_b = opt_vec(e + "patch_embedding.bias", E);
    if (s->projector == Projector::kMlp) {
      s->class_embd = vec(e + "class_embedding", E);
      s->pre_ln_w = opt_vec(tower_ + "pre_layrnorm.weight", E);  // (sic: transformers' name)
      s->pre_ln_b = opt_vec(tower_ + "pre_layrnorm.bias", E);
    } else {
      s->post_ln_w = vec(tower_ + "post_layernorm.weight", E);
      s->post_ln_b = opt_vec(tower_ + "post_layernorm.bias", E);
    }
    s->pos_embd = matrix(e + "position_embedding.weight", s->n_pos(), E);
    for (int64_t il = 0; il < n_layer_; ++il) s->layers.push_back(layer(*s, il));
    if (st_.find(tower_ + "encoder.layers." + std::to_string(n_layer_) + ".layer_norm1.weight"))
      fail(strfmt("the checkpoint has more ViT blocks than vision_config.num_hidden_layers = %lld",
                  ll(n_layer_)));
  }

  VisionLayer layer(const VisionSpec& s, int64_t il) {
    const std::string b = tower_ + "encoder.layers." + std::to_string(il) + ".";
    const int64_t E = s.n_embd, F = s.n_ff;
    VisionLayer L;
    L.ln1_w = vec(b + "layer_norm1.weight", E);
    L.ln1_b = opt_vec(b + "layer_norm1.bias", E);
    L.q_w = matrix(b + "self_attn.q_proj.weight", E, E);
    L.q_b = opt_vec(b + "self_attn.q_proj.bias", E);
    L.k_w = matrix(b + "self_attn.k_proj.weight", E, E);
    L.k_b = opt_vec(b + "self_attn.k_proj.bias", E);
    L.v_w = matrix(b + "self_attn.v_proj.weight", E, E);
    L.v_b = opt_vec(b + "self_attn.v_proj.bias", E);
    L.o_w = matrix(b + "self_attn.out_proj.weight", E, E);
    L.o_b = opt_vec(b + "self_attn.out_proj.bias", E);
    L.ln2_w = vec(b + "layer_norm2.weight", E);
    L.ln2_b = opt_vec(b + "layer_norm2.bias", E);
    L.up_w = matrix(b + "mlp.fc1.weight", F, E);
    L.up_b = opt_vec(b + "mlp.fc1.bias", F);
    L.down_w = matrix(b + "mlp.fc2.weight", E, F);
    L.down_b = opt_vec(b + "mlp.fc2.bias", E);
    return L;
  }

  // Gemma 3: mm_soft_emb_norm (Gemma's RMS norm multiplies by 1 + w: stored + 1, as llama.cpp's
  // converter does) and mm_input_projection_weight, stored for x @ W ([n_embd, text width]).
  void read_gemma3_projector(VisionSpec* s) {
    const std::string norm = projector_ + "mm_soft_emb_norm.weight";
    const std::string proj = projector_ + "mm_input_projection_weight";
    s->soft_emb_norm_w = vec(norm, s->n_embd, 1.0f);
    const SafetensorsTensor* p = st_.find(proj);
    if (!p) fail(strfmt("missing tensor '%s'", proj.c_str()));
    if (p->shape.size() != 2 || p->shape[1] <= 0 || p->shape[1] > (int64_t{1} << 18))
      fail(strfmt("tensor '%s' has shape %s, expected [%lld, text width]", proj.c_str(),
                  p->shape_string().c_str(), ll(s->n_embd)));
    s->n_embd_out = p->shape[1];
    s->input_proj = detail::transposed_copy(matrix(proj, s->n_embd, s->n_embd_out), storage_);
  }

  void read_mlp_projector(VisionSpec* s) {
    const int64_t width =
        s->n_embd * std::max<int64_t>(1, static_cast<int64_t>(s->feature_layers.size()));
    const std::string w1 = projector_ + "linear_1.weight", w2 = projector_ + "linear_2.weight";
    const SafetensorsTensor* l1 = st_.find(w1);
    const SafetensorsTensor* l2 = st_.find(w2);
    if (!l1 || !l2) fail(strfmt("missing tensor '%s'", (l1 ? w2 : w1).c_str()));
    if (l1->shape.size() != 2 || l2->shape.size() != 2 || l1->shape[0] <= 0 ||
        l1->shape[0] > (int64_t{1} << 18) || l2->shape[0] <= 0 || l2->shape[0] > (int64_t{1} << 18))
      fail(strfmt("projector tensors '%s' %s and '%s' %s are not two linear maps", w1.c_str(),
                  l1->shape_string().c_str(), w2.c_str(), l2->shape_string().c_str()));
    const int64_t hidden = l1->shape[0];
    s->n_embd_out = l2->shape[0];
    s->mm0_w = matrix(w1, hidden, width);
    s->mm0_b = opt_vec(projector_ + "linear_1.bias", hidden);
    s->mm2_w = matrix(w2, s->n_embd_out, hidden);
    s->mm2_b = opt_vec(projector_ + "linear_2.bias", s->n_embd_out);
  }

  const SafetensorsSet& st_;
  const json& config_;
  const json& pre_;
  const std::string path_;
  std::vector<std::shared_ptr<const void>>* storage_;
  int64_t n_layer_ = 0;
  std::string tower_, projector_;
};

}  // namespace

bool hf_names_multimodal_model(const std::string& dir) {
  try {
    const json config = detail::read_json_file(dir + "/config.json");
    auto a = config.find("architectures");
    if (a == config.end() || !a->is_array() || a->empty() || !(*a)[0].is_string()) return false;
    return (*a)[0].get<std::string>().ends_with("ForConditionalGeneration");
  } catch (const std::exception&) {
    return false;
  }
}

uint64_t vision_weight_bytes(const std::string& path) {
  struct stat sb {};
  if (::stat(path.c_str(), &sb) != 0) return 0;
  if (!S_ISDIR(sb.st_mode)) return static_cast<uint64_t>(sb.st_size);
  auto st = SafetensorsSet::open_dir(path);
  if (!st) return 0;
  uint64_t n = 0;
  for (const auto& [name, t] : (*st)->tensors())
    for (const char* part : {"vision_tower.", "multi_modal_projector."})
      if (name.rfind(part, 0) == 0 || name.rfind(std::string("model.") + part, 0) == 0)
        n += t->nbytes;
  return n;
}

Result<std::shared_ptr<const VisionModel>> load_hf_vision_model(const std::string& dir) {
  try {
    const std::string config_path = dir + "/config.json";
    if (!detail::file_exists(config_path))
      return Error{1, dir + ": not a Hugging Face model directory (no config.json)"};
    const json config = detail::read_json_file(config_path);
    const std::string pre_path = dir + "/preprocessor_config.json";
    const json pre =
        detail::file_exists(pre_path) ? detail::read_json_file(pre_path) : json::object();
    if (!pre.is_object()) return Error{1, pre_path + ": not a JSON object"};
    auto st = SafetensorsSet::open_dir(dir);
    if (!st) return st.error();
    auto m = std::make_shared<VisionModel>();
    m->path = dir;
    m->spec = HfVisionLoader(**st, config, pre, config_path, &m->storage).build();
    m->storage.push_back(std::shared_ptr<const SafetensorsSet>(std::move(*st)));
    return std::shared_ptr<const VisionModel>(std::move(m));
  } catch (const std::exception& e) {
    return Error{1, e.what()};
  }
}

}  // namespace troupe::model
