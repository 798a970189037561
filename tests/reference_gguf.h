// GGUF access the float64 test references share (tests/gpt_oss_reference.h,
// tests/gemma3_reference.h): checked tensor lookup, rows as doubles, matrix-vector products. Only
// the GGUF container parser and model::dequantize_row; independent of troupe's loader and engine.
// Errors throw std::runtime_error starting "<who> reference: " and name the tensor.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/ggml_types.h"
#include "model/gguf.h"
#include "tests/reference_math.h"

namespace troupe::testing::refgguf {

using Gguf = model::GgufFile;
using Tensor = model::TensorInfo;
using refmath::Vec;

[[noreturn]] inline void fail(const std::string& who, const std::string& what) {
  throw std::runtime_error(who + " reference: " + what);
}

/// The tensor `name`, which must exist, have the ggml shape `ne` (innermost first; omitted
/// trailing dimensions are 1) and be F32 (`f32_only`) or a type model::dequantize_row reads in
/// whole blocks per row.
inline const Tensor& tensor(const Gguf& g, const std::string& name, const std::vector<int64_t>& ne,
                            const std::string& who, bool f32_only) {
  const Tensor* t = g.find_tensor(name);
  if (t == nullptr) fail(who, "missing tensor " + name);
  if (f32_only && t->type != model::GgmlType::kF32) fail(who, "tensor " + name + " is not F32");
  const auto traits = model::type_traits(static_cast<uint32_t>(t->type));
  if (!traits || !traits->supported)
    fail(who,
         "tensor " + name + " has type " + model::type_name(t->type) + ", which is not readable");
  bool same = true;
  for (size_t d = 0; d < 4; ++d) same = same && t->ne[d] == (d < ne.size() ? ne[d] : 1);
  if (!same) {
    std::string want = "[";
    for (size_t d = 0; d < ne.size(); ++d) want += (d ? ", " : "") + std::to_string(ne[d]);
    fail(who, "tensor " + name + " has shape " + t->shape_string() + ", the metadata implies " +
                  want + "]");
  }
  if (t->ne[0] % traits->block_elems != 0)
    fail(who, "tensor " + name + ": rows of " + std::to_string(t->ne[0]) + " are not whole " +
                  model::type_name(t->type) + " blocks");
  return *t;
}

/// Row r (ne[0] values, rows counted across all stacked matrices) of t, dequantized, as doubles.
inline Vec row(const Tensor& t, int64_t r, const std::string& who) {
  const int64_t n = t.ne[0];
  std::vector<float> f(static_cast<size_t>(n));
  const uint8_t* p = t.data + static_cast<size_t>(r * model::row_bytes(t.type, n));
  try {
    model::dequantize_row(t.type, p, f.data(), n);
  } catch (const std::exception& e) {
    fail(who, "tensor " + t.name + ": " + e.what());
  }
  return Vec(f.begin(), f.end());
}

/// W x for matrix m of w (ne [cols, rows, matrices]): y[r] = sum_c W[r][c] x[c].
inline Vec matvec(const Tensor& w, const Vec& x, const std::string& who, int64_t m = 0) {
  Vec out(static_cast<size_t>(w.ne[1]));
  for (int64_t r = 0; r < w.ne[1]; ++r) out[r] = refmath::dot(row(w, m * w.ne[1] + r, who), x);
  return out;
}

inline std::unique_ptr<Gguf> open_gguf(const std::string& path, const std::string& who) {
  auto opened = Gguf::open(path);
  if (!opened) fail(who, opened.error().message);
  return std::move(*opened);
}

}  // namespace troupe::testing::refgguf
