// libFuzzer entry for the safetensors reader (model/safetensors.cc): the input is a whole file
// image. A rejected image is fine (its error must say something); an accepted one must have
// every tensor inside the image, of the byte size its dtype and shape say, and every byte is
// read. Built by tests/fuzz/CMakeLists.txt; run by scripts/fuzz-smoke.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "model/safetensors.h"

namespace {

volatile uint64_t g_sink = 0;

void require(bool ok) {
  if (!ok) std::abort();  // an accepted file breaks a documented invariant
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> bytes(data, size);
  auto f = troupe::model::SafetensorsFile::parse(bytes, "fuzz.safetensors");
  if (!f) {
    require(!f.error().message.empty());
    return 0;
  }
  uint64_t h = 0;
  for (const auto& [k, v] : (*f)->metadata()) h += k.size() + v.size();
  for (const auto& t : (*f)->tensors()) {
    require(t.data >= data && t.data + t.nbytes <= data + size);
    require((*f)->find(t.name) == &t);
    if (t.supported) {
      const int64_t n = t.num_elements();
      require(n >= 0 && static_cast<uint64_t>(troupe::model::row_bytes(t.type, n)) == t.nbytes);
    }
    for (uint64_t i = 0; i < t.nbytes; ++i) h = h * 31 + t.data[i];
    h += t.shape_string().size();
  }
  g_sink = g_sink + h;
  return 0;
}
