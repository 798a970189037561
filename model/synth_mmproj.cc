// synth_mmproj: random-weight vision encoders in llama.cpp's clip GGUF conventions (the keys and
// tensor names model/vision.cc reads), for tests, benchmarks and `troupe synth --arch clip`.
#include <cmath>
#include <string>
#include <vector>

#include "base/check.h"
#include "model/detail/synth_random.h"
#include "model/gguf_writer.h"
#include "model/synth.h"

namespace troupe::model {

namespace {

// One tensor's values: mean + sd * normal, row by row from the tensor's own stream.
struct Fill {
  float mean = 0, sd = 0;
};

class MmprojWriter {
 public:
  MmprojWriter(const MmprojSynthOptions& o, GgufWriter& w) : o_(o), w_(w) {}

  void tensor(const std::string& name, std::vector<int64_t> shape, Fill f, GgmlType type) {
    const uint64_t seed = detail::hash_name(name) ^ (o_.seed * 0x9e3779b97f4a7c15ull);
    const int64_t ne0 = shape[0];
    const int64_t rb = row_bytes(type, ne0);
    TensorFill fill = [seed, ne0, rb, f, type](int64_t row0, int64_t rows, uint8_t* dst) {
      std::vector<float> buf(static_cast<size_t>(ne0));
      for (int64_t r = 0; r < rows; ++r) {
        uint64_t s = seed ^ (static_cast<uint64_t>(row0 + r) * 0xd1b54a32d192ed03ull);
        detail::splitmix64(s);
        for (float& v : buf) v = f.mean + f.sd * detail::normalish(detail::splitmix64(s));
        quantize_row(type, buf.data(), dst + r * rb, ne0);
      }
    };
    Status st = w_.add_tensor(name, type, shape, std::move(fill));
    if (!st) TROUPE_INPUT_ERROR("%s", st.error().message.c_str());
  }
  // A matrix [cols inputs, rows outputs] scaled to keep activations near unit size.
  // Rows that do not fill whole blocks of a quantized type are stored as f16.
  void matrix(const std::string& name, int64_t cols, int64_t rows) {
    const auto tr = type_traits(static_cast<uint32_t>(o_.dtype));
    const GgmlType type = cols % tr->block_elems == 0 ? o_.dtype : GgmlType::kF16;
    tensor(name, {cols, rows}, {0.f, 1.f / std::sqrt(static_cast<float>(cols))}, type);
  }
  void vec(const std::string& name, int64_t n, Fill f) { tensor(name, {n}, f, GgmlType::kF32); }
  void norm(const std::string& name, int64_t n) {
    vec(name + ".weight", n, {1.f, 0.05f});
    vec(name + ".bias", n, {0.f, 0.02f});
  }

  void block(int64_t il) {
    const std::string b = "v.blk." + std::to_string(il) + ".";
    const int64_t E = o_.n_embd, F = o_.n_ff;
    norm(b + "ln1", E);
    for (const char* m : {"attn_q", "attn_k", "attn_v", "attn_out"}) {
      matrix(b + m + ".weight", E, E);
      vec(b + m + ".bias", E, {0.f, 0.02f});
    }
    norm(b + "ln2", E);
    matrix(b + "ffn_up.weight", E, F);
    vec(b + "ffn_up.bias", F, {0.f, 0.02f});
    matrix(b + "ffn_down.weight", F, E);
    vec(b + "ffn_down.bias", E, {0.f, 0.02f});
  }

 private:
  const MmprojSynthOptions& o_;
  GgufWriter& w_;
};

void check(const MmprojSynthOptions& o) {
  if (o.projector != "mlp" && o.projector != "gemma3")
    TROUPE_INPUT_ERROR("synth clip: projector '%s' (expected mlp or gemma3)", o.projector.c_str());
  if (o.patch_size <= 0 || o.image_size <= 0 || o.image_size % o.patch_size != 0)
    TROUPE_INPUT_ERROR("synth clip: image size %lld is not a positive multiple of patch %lld",
                       static_cast<long long>(o.image_size), static_cast<long long>(o.patch_size));
  if (o.n_head <= 0 || o.n_embd % o.n_head != 0 || o.n_ff <= 0 || o.n_layer <= 0 || o.proj_dim <= 0)
    TROUPE_INPUT_ERROR("synth clip: bad width, heads, FFN, layer count or projection width");
  if (o.merge <= 0 || (o.image_size / o.patch_size) % o.merge != 0)
    TROUPE_INPUT_ERROR("synth clip: merge %lld does not divide the patches a side",
                       static_cast<long long>(o.merge));
  if (o.n_layer_used < 0 || o.n_layer_used > o.n_layer)
    TROUPE_INPUT_ERROR("synth clip: n_layer_used %lld outside 0..%lld",
                       static_cast<long long>(o.n_layer_used), static_cast<long long>(o.n_layer));
}

void write_keys(const MmprojSynthOptions& o, GgufWriter& w) {
  const bool mlp = o.projector == "mlp";
  w.set_string("general.architecture", "clip");
  w.set_string("general.type", "clip-vision");
  w.set_string("general.name", "synth-mmproj-" + o.projector);
  w.set_bool("clip.has_vision_encoder", true);
  w.set_bool("clip.has_llava_projector", mlp);
  w.set_string("clip.projector_type", o.projector);
  w.set_bool("clip.use_gelu", true);
  w.set_u32("clip.vision.image_size", static_cast<uint32_t>(o.image_size));
  w.set_u32("clip.vision.patch_size", static_cast<uint32_t>(o.patch_size));
  w.set_u32("clip.vision.embedding_length", static_cast<uint32_t>(o.n_embd));
  w.set_u32("clip.vision.feed_forward_length", static_cast<uint32_t>(o.n_ff));
  w.set_u32("clip.vision.block_count", static_cast<uint32_t>(o.n_layer));
  w.set_u32("clip.vision.projection_dim", static_cast<uint32_t>(o.proj_dim));
  w.set_u32("clip.vision.attention.head_count", static_cast<uint32_t>(o.n_head));
  w.set_f32("clip.vision.attention.layer_norm_epsilon", mlp ? 1e-5f : 1e-6f);
  const float clip_mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
  const float clip_std[3] = {0.26862954f, 0.26130258f, 0.27577711f};
  const float half[3] = {0.5f, 0.5f, 0.5f};
  w.set_array_f32("clip.vision.image_mean", mlp ? clip_mean : half);
  w.set_array_f32("clip.vision.image_std", mlp ? clip_std : half);
  if (mlp) {
    const int32_t f[1] = {static_cast<int32_t>(o.n_layer_used ? o.n_layer_used : o.n_layer)};
    w.set_array_i32("clip.vision.feature_layer", f);
  } else {
    w.set_u32("clip.vision.projector.scale_factor", static_cast<uint32_t>(o.merge));
  }
}

}  // namespace

Status synth_mmproj(const MmprojSynthOptions& o, const std::string& out_path) {
  try {
    check(o);
    GgufWriter w;
    write_keys(o, w);
    MmprojWriter t(o, w);
    const bool mlp = o.projector == "mlp";
    const int64_t E = o.n_embd, P = o.patch_size, side = o.image_size / o.patch_size;
    const GgmlType patch_type = o.dtype == GgmlType::kF32 ? GgmlType::kF32 : GgmlType::kF16;
    t.tensor("v.patch_embd.weight", {P, P, 3, E},
             {0.f, 1.f / std::sqrt(static_cast<float>(3 * P * P))}, patch_type);
    if (mlp) {
      t.vec("v.class_embd", E, {0.f, 0.1f});
    } else {
      t.vec("v.patch_embd.bias", E, {0.f, 0.02f});
    }
    t.tensor("v.position_embd.weight", {E, side * side + (mlp ? 1 : 0)}, {0.f, 0.1f},
             GgmlType::kF32);
    if (mlp) t.norm("v.pre_ln", E);
    for (int64_t il = 0; il < o.n_layer; ++il) t.block(il);
    if (mlp) {
      t.matrix("mm.0.weight", E, o.proj_dim);
      t.vec("mm.0.bias", o.proj_dim, {0.f, 0.02f});
      t.matrix("mm.2.weight", o.proj_dim, o.proj_dim);
      t.vec("mm.2.bias", o.proj_dim, {0.f, 0.02f});
    } else {
      t.norm("v.post_ln", E);
      t.vec("mm.soft_emb_norm.weight", E, {1.f, 0.05f});
      // Stored as x @ W: ne [proj_dim, n_embd], as llama.cpp's Gemma 3 files have it.
      t.tensor("mm.input_projection.weight", {o.proj_dim, E},
               {0.f, 1.f / std::sqrt(static_cast<float>(E))},
               o.dtype == GgmlType::kF32 ? GgmlType::kF32 : GgmlType::kF16);
    }
    return w.write(out_path);
  } catch (const std::exception& e) {
    return Error{1, e.what()};
  }
}

}  // namespace troupe::model
