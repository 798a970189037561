// Reads a llama.cpp mmproj GGUF (general.architecture "clip") into a VisionSpec: the keys and
// tensor names of llama.cpp's clip loader, checked shape by shape.
#include "model/vision.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <sys/stat.h>

#include "base/check.h"
#include "model/detail/vision_weights.h"
#include "model/gguf.h"
#include "model/model.h"

namespace troupe::model {

const char* projector_name(Projector p) {
  switch (p) {
    case Projector::kMlp:
      return "mlp";
    case Projector::kGemma3:
      return "gemma3";
  }
  return "?";
}

int64_t VisionSpec::n_image_tokens() const {
  if (projector == Projector::kGemma3) {
    const int64_t side = patches_per_side() / merge;
    return side * side;
  }
  return n_patches();
}

ImagePreprocess VisionSpec::preprocess() const {
  ImagePreprocess p;
  p.image_size = static_cast<int32_t>(image_size);
  p.mean = mean;
  p.std = std;
  if (projector == Projector::kGemma3) {
    // llama.cpp resizes Gemma 3's images bilinearly and pads with black.
    p.resize = ImagePreprocess::Resize::kBilinear;
    p.pad_rgb = {0, 0, 0};
  } else {
    // LLaVA: bicubic, padded with the colour llama.cpp fixes for its LLaVA-style projectors
    // (CLIP's mean colour in 8 bits, whatever the file's mean).
    p.resize = ImagePreprocess::Resize::kBicubic;
    p.pad_rgb = {122, 116, 104};
  }
  return p;
}

namespace {

long long ll(int64_t v) { return static_cast<long long>(v); }

class VisionLoader {
 public:
  explicit VisionLoader(const GgufFile& g) : g_(g), path_(g.path().c_str()) {}

  VisionSpec build(std::vector<std::shared_ptr<const void>>* storage) {
    VisionSpec s;
    read_hparams(&s);
    read_encoder(&s);
    read_projector(&s, storage);
    return s;
  }

 private:
  int64_t positive(const char* key, int64_t max) const {
    const int64_t v = g_.get_int(key);
    if (v <= 0 || v > max)
      TROUPE_INPUT_ERROR("%s: %s = %lld is outside 1..%lld", path_, key, ll(v), ll(max));
    return v;
  }

  std::array<float, 3> triple(const char* key) const {
    const GgufValue* v = g_.find(key);
    if (!v) TROUPE_INPUT_ERROR("%s: missing metadata key '%s'", path_, key);
    if (v->type != GgufType::kArray || v->count != 3 || v->elem_type != GgufType::kF32)
      TROUPE_INPUT_ERROR("%s: %s must be an array of 3 float32 values", path_, key);
    std::array<float, 3> out{};
    for (int c = 0; c < 3; ++c) {
      out[c] = static_cast<float>(v->array_f64(c));
      if (!std::isfinite(out[c])) TROUPE_INPUT_ERROR("%s: %s holds a non-finite value", path_, key);
    }
    return out;
  }

  void read_hparams(VisionSpec* s) const {
    if (g_.get_string("general.architecture") != "clip")
      TROUPE_INPUT_ERROR("%s: not a vision encoder (general.architecture is '%s', expected 'clip')",
                         path_, g_.get_string("general.architecture").c_str());
    if (!g_.get_bool_or("clip.has_vision_encoder", false))
      TROUPE_INPUT_ERROR("%s: the file has no vision encoder (clip.has_vision_encoder)", path_);
    const std::string proj = g_.get_string_or("clip.projector_type", "");
    if (proj == "mlp") {
      s->projector = Projector::kMlp;
    } else if (proj == "gemma3") {
      s->projector = Projector::kGemma3;
    } else {
      TROUPE_INPUT_ERROR("%s: projector type '%s' is not supported (troupe runs mlp, gemma3)",
                         path_, proj.c_str());
    }
    // LLaVA-1.6 cuts an image into tiles by these grids and merges them back ("anyres"); one
    // resized image would give another answer than llama.cpp's, so such files are refused.
    if (g_.find("clip.vision.image_grid_pinpoints") != nullptr)
      TROUPE_INPUT_ERROR("%s: LLaVA-1.6 tiling (clip.vision.image_grid_pinpoints) is not supported",
                         path_);
    const bool gelu = g_.get_bool_or("clip.use_gelu", false);
    const bool silu = g_.get_bool_or("clip.use_silu", false);
    if (gelu && silu) TROUPE_INPUT_ERROR("%s: both clip.use_gelu and clip.use_silu are set", path_);
    s->act = gelu ? VisionAct::kGelu : silu ? VisionAct::kSilu : VisionAct::kGeluQuick;
    s->image_size = positive("clip.vision.image_size", 8192);
    s->patch_size = positive("clip.vision.patch_size", 1024);
    if (s->image_size % s->patch_size != 0)
      TROUPE_INPUT_ERROR("%s: image size %lld is not a multiple of the patch size %lld", path_,
                         ll(s->image_size), ll(s->patch_size));
    s->n_embd = positive("clip.vision.embedding_length", 1 << 16);
    s->n_ff = positive("clip.vision.feed_forward_length", 1 << 18);
    s->n_head = positive("clip.vision.attention.head_count", 1024);
    if (s->n_embd % s->n_head != 0)
      TROUPE_INPUT_ERROR("%s: width %lld is not a multiple of the head count %lld", path_,
                         ll(s->n_embd), ll(s->n_head));
    s->eps = static_cast<float>(g_.get_float("clip.vision.attention.layer_norm_epsilon"));
    if (!(s->eps > 0.0f && s->eps < 1.0f))
      TROUPE_INPUT_ERROR("%s: layer_norm_epsilon %g is outside (0, 1)", path_,
                         static_cast<double>(s->eps));
    s->mean = triple("clip.vision.image_mean");
    s->std = triple("clip.vision.image_std");
    for (float v : s->std)
      if (!(v > 0.0f)) TROUPE_INPUT_ERROR("%s: clip.vision.image_std must be positive", path_);
    s->merge = g_.get_int_or("clip.vision.projector.scale_factor", 1);
    if (s->merge <= 0 || s->patches_per_side() % s->merge != 0)
      TROUPE_INPUT_ERROR("%s: projector scale factor %lld does not divide the %lld patches a side",
                         path_, ll(s->merge), ll(s->patches_per_side()));
  }

  // The ViT blocks that run and the states the projector reads (llama.cpp's rule: the deepest
  // listed feature layer, else all blocks but the last for a LLaVA projector; all for Gemma 3).
  void feature_layers(VisionSpec* s, int64_t n_layer) const {
    if (s->projector == Projector::kGemma3) {
      s->n_layer_run = n_layer;
      return;
    }
    const GgufValue* f = g_.find("clip.vision.feature_layer");
    if (f) {
      if (f->type != GgufType::kArray || !integer_type(f->elem_type) || f->count == 0 ||
          f->count > 16)
        TROUPE_INPUT_ERROR("%s: clip.vision.feature_layer must be an array of 1 to 16 integers",
                           path_);
      for (uint64_t i = 0; i < f->count; ++i) {
        const int64_t l = f->array_i64(i);
        if (l < 0 || l > n_layer)
          TROUPE_INPUT_ERROR("%s: feature layer %lld is outside 0..%lld", path_, ll(l),
                             ll(n_layer));
        s->feature_layers.push_back(l);
      }
      std::sort(s->feature_layers.begin(), s->feature_layers.end());
      s->feature_layers.erase(std::unique(s->feature_layers.begin(), s->feature_layers.end()),
                              s->feature_layers.end());
      s->n_layer_run = s->feature_layers.back();
    } else {
      s->n_layer_run = n_layer - 1;
    }
  }

  void read_encoder(VisionSpec* s) const {
    const int64_t E = s->n_embd, P = s->patch_size;
    s->patch_w = req("v.patch_embd.weight", P, P, 3 * E);
    if (!is_float(s->patch_w.type))
      TROUPE_INPUT_ERROR("%s: v.patch_embd.weight has type %s (expected f32, f16 or bf16)", path_,
                         type_name(s->patch_w.type).c_str());
    s->patch_w.ne[0] = 3 * P * P;  // one row per output channel: [3][P][P] inputs
    s->patch_w.ne[1] = E;
    s->patch_w.ne[2] = 1;
    s->patch_b = opt("v.patch_embd.bias", E, 1);
    s->class_embd = opt("v.class_embd", E, 1);
    if (s->projector == Projector::kMlp && !s->class_embd.present())
      TROUPE_INPUT_ERROR("%s: an mlp projector needs the class token 'v.class_embd'", path_);
    s->pos_embd = req("v.position_embd.weight", E, s->n_pos());
    s->pre_ln_w = opt("v.pre_ln.weight", E, 1);
    s->pre_ln_b = opt("v.pre_ln.bias", E, 1);
    s->post_ln_w = opt("v.post_ln.weight", E, 1);
    s->post_ln_b = opt("v.post_ln.bias", E, 1);
    int64_t n_layer = 0;
    while (g_.find_tensor("v.blk." + std::to_string(n_layer) + ".ln1.weight")) ++n_layer;
    const int64_t declared = positive("clip.vision.block_count", 1024);
    if (n_layer != declared)
      TROUPE_INPUT_ERROR("%s: clip.vision.block_count is %lld but the file has %lld blocks", path_,
                         ll(declared), ll(n_layer));
    for (int64_t il = 0; il < n_layer; ++il) s->layers.push_back(layer(*s, il));
    feature_layers(s, n_layer);
  }

  VisionLayer layer(const VisionSpec& s, int64_t il) const {
    const std::string b = "v.blk." + std::to_string(il) + ".";
    const int64_t E = s.n_embd, F = s.n_ff;
    if (g_.find_tensor(b + "ffn_gate.weight"))
      TROUPE_INPUT_ERROR("%s: '%sffn_gate.weight': gated vision FFNs are not supported", path_,
                         b.c_str());
    VisionLayer L;
    L.ln1_w = req(b + "ln1.weight", E, 1);
    L.ln1_b = opt(b + "ln1.bias", E, 1);
    L.q_w = req(b + "attn_q.weight", E, E);
    L.q_b = opt(b + "attn_q.bias", E, 1);
    L.k_w = req(b + "attn_k.weight", E, E);
    L.k_b = opt(b + "attn_k.bias", E, 1);
    L.v_w = req(b + "attn_v.weight", E, E);
    L.v_b = opt(b + "attn_v.bias", E, 1);
    L.o_w = req(b + "attn_out.weight", E, E);
    L.o_b = opt(b + "attn_out.bias", E, 1);
    L.ln2_w = req(b + "ln2.weight", E, 1);
    L.ln2_b = opt(b + "ln2.bias", E, 1);
    L.up_w = req(b + "ffn_up.weight", E, F);
    L.up_b = opt(b + "ffn_up.bias", F, 1);
    L.down_w = req(b + "ffn_down.weight", F, E);
    L.down_b = opt(b + "ffn_down.bias", E, 1);
    return L;
  }

  // The text model's width is the projector's output (as llama.cpp reads it):
  // clip.vision.projection_dim is CLIP's own projection (768 in LLaVA 1.5's files), unused here.
  int64_t output_width(const char* name, int dim) const {
    const TensorInfo* t = g_.find_tensor(name);
    if (!t) TROUPE_INPUT_ERROR("%s: missing tensor '%s'", path_, name);
    if (t->ne[dim] <= 0 || t->ne[dim] > (int64_t{1} << 18))
      TROUPE_INPUT_ERROR("%s: tensor '%s' has shape %s", path_, name, t->shape_string().c_str());
    return t->ne[dim];
  }

  void read_projector(VisionSpec* s, std::vector<std::shared_ptr<const void>>* storage) const {
    if (s->projector == Projector::kMlp) {
      const int64_t width =
          s->n_embd * std::max<int64_t>(1, static_cast<int64_t>(s->feature_layers.size()));
      const int64_t hidden = output_width("mm.0.weight", 1);
      const bool two = g_.find_tensor("mm.2.weight") != nullptr;
      const int64_t out = two ? output_width("mm.2.weight", 1) : hidden;
      s->n_embd_out = out;
      s->mm0_w = req("mm.0.weight", width, two ? hidden : out);
      s->mm0_b = opt("mm.0.bias", s->mm0_w.rows(), 1);
      if (two) {
        s->mm2_w = req("mm.2.weight", hidden, out);
        s->mm2_b = opt("mm.2.bias", out, 1);
      }
      return;
    }
    s->soft_emb_norm_w = req("mm.soft_emb_norm.weight", s->n_embd, 1);
    s->n_embd_out = output_width("mm.input_projection.weight", 0);
    // Stored as x @ W ([n_embd rows][out columns]); the kernels want one row per output.
    const WeightView w = req("mm.input_projection.weight", s->n_embd_out, s->n_embd);
    s->input_proj = transposed(w, storage);
  }

  WeightView transposed(const WeightView& w, std::vector<std::shared_ptr<const void>>* st) const {
    if (!is_float(w.type))
      TROUPE_INPUT_ERROR("%s: tensor '%s' has type %s (expected f32, f16 or bf16)", path_,
                         w.name.c_str(), type_name(w.type).c_str());
    return detail::transposed_copy(w, st);
  }

  static bool integer_type(GgufType t) {
    return t != GgufType::kF32 && t != GgufType::kF64 && t != GgufType::kBool &&
           t != GgufType::kString && t != GgufType::kArray;
  }
  static bool is_float(GgmlType t) {
    return t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16;
  }

  WeightView req(const std::string& name, int64_t cols, int64_t rows) const {
    const TensorInfo* t = g_.find_tensor(name);
    if (!t) TROUPE_INPUT_ERROR("%s: missing tensor '%s'", path_, name.c_str());
    return checked(*t, cols, rows);
  }
  WeightView req(const std::string& name, int64_t c0, int64_t c1, int64_t rest) const {
    const TensorInfo* t = g_.find_tensor(name);
    if (!t) TROUPE_INPUT_ERROR("%s: missing tensor '%s'", path_, name.c_str());
    WeightView v = view_of(*t);
    if (v.ne[0] != c0 || v.ne[1] != c1 || v.ne[2] != rest)
      TROUPE_INPUT_ERROR("%s: tensor '%s' has shape %s, expected %lld x %lld x %lld values", path_,
                         name.c_str(), t->shape_string().c_str(), ll(c0), ll(c1), ll(rest));
    return v;
  }
  WeightView opt(const std::string& name, int64_t cols, int64_t rows) const {
    const TensorInfo* t = g_.find_tensor(name);
    return t ? checked(*t, cols, rows) : WeightView{};
  }
  WeightView checked(const TensorInfo& t, int64_t cols, int64_t rows) const {
    WeightView v = view_of(t);
    if (v.ne[0] != cols || v.ne[1] != rows || v.ne[2] != 1)
      TROUPE_INPUT_ERROR("%s: tensor '%s' has shape %s, expected [%lld, %lld]", path_,
                         t.name.c_str(), t.shape_string().c_str(), ll(cols), ll(rows));
    const auto tr = type_traits(static_cast<uint32_t>(v.type));
    if (!tr || !tr->supported)
      TROUPE_INPUT_ERROR("%s: tensor '%s' has type %s, which troupe cannot compute with", path_,
                         t.name.c_str(), type_name(v.type).c_str());
    // Vectors (norms, biases, embeddings added row by row) are read as floats.
    if (rows == 1 && v.type != GgmlType::kF32)
      TROUPE_INPUT_ERROR("%s: tensor '%s' has type %s (expected f32)", path_, t.name.c_str(),
                         type_name(v.type).c_str());
    return v;
  }

  const GgufFile& g_;
  const char* path_;
};

}  // namespace

namespace detail {

WeightView transposed_copy(const WeightView& w, std::vector<std::shared_ptr<const void>>* storage) {
  const int64_t rows = w.rows(), cols = w.cols();
  const size_t es = w.type == GgmlType::kF32 ? 4 : 2;
  auto buf = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(rows * cols) * es);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      std::memcpy(buf->data() + static_cast<size_t>(c * rows + r) * es,
                  w.data + static_cast<size_t>(r * cols + c) * es, es);
  WeightView t = w;
  t.ne[0] = rows;
  t.ne[1] = cols;
  t.data = buf->data();
  storage->push_back(buf);
  return t;
}

}  // namespace detail

Result<std::shared_ptr<const VisionModel>> load_vision_model(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return load_hf_vision_model(path);
  auto g = GgufFile::open(path);
  if (!g) return g.error();
  try {
    auto m = std::make_shared<VisionModel>();
    m->path = path;
    m->spec = VisionLoader(**g).build(&m->storage);
    m->storage.push_back(std::shared_ptr<const GgufFile>(std::move(*g)));
    return std::shared_ptr<const VisionModel>(std::move(m));
  } catch (const InputError& e) {
    return Error{1, e.what()};
  }
}

}  // namespace troupe::model
