// Standard base64 (RFC 4648) decoding. Users: model/tokenizer_tiktoken.cc (tiktoken.model
// files), serve/openai.cc (images in data: URLs). Pure function, header-only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace troupe {

/// Decodes `in` ('=' padding, length a multiple of 4) into *out; false on any other character,
/// a bad length or data after padding.
inline bool base64_decode(std::string_view in, std::string* out) {
  out->clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  out->reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = in[i + static_cast<size_t>(k)];
      if (c == '=' && last && k >= 2) {
        v[k] = 0;
        ++pad;
      } else {
        if (pad > 0) return false;  // data after padding
        v[k] = value(c);
        if (v[k] < 0) return false;
      }
    }
    const uint32_t w = static_cast<uint32_t>(v[0] << 18 | v[1] << 12 | v[2] << 6 | v[3]);
    out->push_back(static_cast<char>(w >> 16));
    if (pad < 2) out->push_back(static_cast<char>(w >> 8 & 0xff));
    if (pad < 1) out->push_back(static_cast<char>(w & 0xff));
  }
  return true;
}

}  // namespace troupe
