// libFuzzer entry for the GGUF reader: parses the input with GgufFile::parse, then reads every
// metadata value (through the typed getters too) and every tensor byte, and checks the views
// stay inside the input. Built by tests/fuzz/CMakeLists.txt; run by scripts/fuzz-smoke.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <span>
#include <vector>

#include "model/ggml_types.h"
#include "model/gguf.h"

namespace {

using troupe::model::GgmlType;
using troupe::model::GgufFile;
using troupe::model::GgufType;
using troupe::model::GgufValue;
using troupe::model::TensorInfo;

// Folds values into a sink the optimiser cannot drop.
volatile uint64_t g_sink = 0;
void sink(uint64_t v) { g_sink = g_sink + v; }
void sink_bytes(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  uint64_t h = 0;
  for (size_t i = 0; i < n; ++i) h = h * 31 + b[i];
  sink(h);
}

void require(bool ok) {
  if (!ok) std::abort();  // an invariant of a successful parse is broken: report as a crash
}

void touch_value(const GgufFile& f, const std::string& key, const GgufValue& v) {
  sink(v.u ^ static_cast<uint64_t>(v.i) ^ static_cast<uint64_t>(v.f != 0));
  sink_bytes(v.str.data(), v.str.size());
  if (v.type == GgufType::kArray) {
    if (v.elem_type == GgufType::kString) {
      require(v.strings.size() == v.count);
      for (std::string_view s : v.strings) sink_bytes(s.data(), s.size());
    } else {
      for (uint64_t i = 0; i < v.count; ++i) {
        sink(static_cast<uint64_t>(v.array_i64(i)));
        const double d = v.array_f64(i);
        sink(d == d ? 1 : 0);
      }
    }
  }
  // Typed getters throw InputError on a type mismatch; that is their contract.
  try {
    sink(f.get_string(key).size());
  } catch (const std::exception&) {
  }
  try {
    sink(static_cast<uint64_t>(f.get_int(key)));
  } catch (const std::exception&) {
  }
  try {
    sink(f.get_float(key) > 0);
  } catch (const std::exception&) {
  }
  try {
    sink(f.get_bool(key));
  } catch (const std::exception&) {
  }
  require(f.find(key) == &v);
}

void touch_tensor(const GgufFile& f, const TensorInfo& t, const uint8_t* begin, size_t size) {
  require(t.data >= begin && t.nbytes <= size &&
          t.data - begin <= static_cast<ptrdiff_t>(size - t.nbytes));
  require(t.offset % f.alignment() == 0);
  require(t.n_dims >= 1 && t.n_dims <= 4 && t.num_elements() > 0);
  require(f.find_tensor(t.name) == &t);
  sink(t.shape_string().size());
  sink_bytes(t.data, t.nbytes);
  auto tr = troupe::model::type_traits(static_cast<uint32_t>(t.type));
  require(tr.has_value());
  // Dequantize the first row when troupe reads the type (bounded: at most 64 Ki elements).
  if (tr->supported && t.ne[0] <= (1 << 16)) {
    std::vector<float> row(static_cast<size_t>(t.ne[0]));
    troupe::model::dequantize_row(t.type, t.data, row.data(), t.ne[0]);
    sink_bytes(row.data(), row.size() * sizeof(float));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = GgufFile::parse(std::span<const uint8_t>(data, size), "fuzz.gguf");
  if (!r.has_value()) {
    require(!r.error().message.empty());
    return 0;
  }
  const GgufFile& f = **r;
  require(f.version() == 2 || f.version() == 3);
  require(f.alignment() > 0 && (f.alignment() & (f.alignment() - 1)) == 0);
  for (const auto& [key, value] : f.metadata()) touch_value(f, key, value);
  // The _or getters throw too when the key is present with another type.
  try {
    sink(static_cast<uint64_t>(f.get_int_or("general.alignment", 32)));
    sink(f.get_string_or("general.architecture", "").size());
  } catch (const std::exception&) {
  }
  for (const TensorInfo& t : f.tensors()) touch_tensor(f, t, data, size);
  return 0;
}
