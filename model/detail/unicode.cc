// UTF-8 helpers and class lookups over the generated tables in unicode_tables.cc.
#include "model/detail/unicode.h"

#include <algorithm>
#include <array>

namespace troupe::model::detail {

namespace {

constexpr uint32_t kMaxCodepoint = 0x10FFFF;
constexpr uint32_t kBmpSize = 0x10000;

uint16_t lookup_runs(uint32_t cp) {
  const uint32_t* begin = kCategoryRuns;
  const uint32_t* end = kCategoryRuns + kNumCategoryRuns;
  const uint32_t* it = std::upper_bound(begin, end, (cp << 8) | 0xFFu);
  uint16_t flags =
      it == begin ? static_cast<uint16_t>(kCpUndefined) : static_cast<uint16_t>(*(it - 1) & 0xFFu);
  if (std::binary_search(kWhiteSpace, kWhiteSpace + kNumWhiteSpace, cp)) flags |= kCpWhitespace;
  const uint32_t* lit =
      std::upper_bound(kLetterRuns, kLetterRuns + kNumLetterRuns, (cp << 8) | 0xFFu);
  const uint32_t letter = lit == kLetterRuns ? 0 : *(lit - 1) & 0xFFu;
  if (letter & 1u) flags |= kCpUpper;
  if (letter & 2u) flags |= kCpLower;
  if (letter & 4u) flags |= kCpHan;
  return flags;
}

// Flags of every BMP codepoint, built once: most text never leaves the BMP, and a table read is
// much cheaper than a binary search per character.
const std::vector<uint16_t>& bmp_flags() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(kBmpSize);
    for (uint32_t cp = 0; cp < kBmpSize; ++cp) t[cp] = lookup_runs(cp);
    return t;
  }();
  return table;
}

struct Gpt2Maps {
  std::array<std::string, 256> byte_to_utf8;
  std::array<int16_t, 324> cp_to_byte;  // the map's codepoints are all below 256 + 68
};

const Gpt2Maps& gpt2_maps() {
  static const Gpt2Maps maps = [] {
    Gpt2Maps m;
    m.cp_to_byte.fill(-1);
    // Printable Latin-1 bytes keep their codepoint; the other 68 bytes take 256, 257, ... in order.
    auto printable = [](int b) {
      return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    uint32_t next_extra = 256;
    for (int b = 0; b < 256; ++b) {
      uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : next_extra++;
      append_utf8(&m.byte_to_utf8[b], cp);
      m.cp_to_byte[cp] = static_cast<int16_t>(b);
    }
    return m;
  }();
  return maps;
}

bool is_cont(uint8_t b) { return (b & 0xC0) == 0x80; }

}  // namespace

uint16_t cp_flags(uint32_t cp) {
  if (cp < kBmpSize) return bmp_flags()[cp];
  if (cp > kMaxCodepoint) return kCpUndefined;
  return lookup_runs(cp);
}

uint32_t utf8_next(std::string_view text, size_t* pos) {
  const size_t i = *pos;
  const size_t n = text.size();
  const auto b = [&](size_t k) { return static_cast<uint8_t>(text[i + k]); };
  const uint8_t lead = b(0);
  if (lead < 0x80) {
    *pos = i + 1;
    return lead;
  }
  if ((lead & 0xE0) == 0xC0) {
    if (i + 1 < n && is_cont(b(1))) {
      *pos = i + 2;
      return (static_cast<uint32_t>(lead & 0x1F) << 6) | (b(1) & 0x3F);
    }
  } else if ((lead & 0xF0) == 0xE0) {
    if (i + 2 < n && is_cont(b(1)) && is_cont(b(2))) {
      *pos = i + 3;
      return (static_cast<uint32_t>(lead & 0x0F) << 12) |
             (static_cast<uint32_t>(b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    }
  } else if ((lead & 0xF8) == 0xF0) {
    if (i + 3 < n && is_cont(b(1)) && is_cont(b(2)) && is_cont(b(3))) {
      uint32_t cp = (static_cast<uint32_t>(lead & 0x07) << 18) |
                    (static_cast<uint32_t>(b(1) & 0x3F) << 12) |
                    (static_cast<uint32_t>(b(2) & 0x3F) << 6) | (b(3) & 0x3F);
      if (cp <= kMaxCodepoint) {
        *pos = i + 4;
        return cp;
      }
    }
  }
  *pos = i + 1;
  return kReplacementChar;
}

std::vector<uint32_t> utf8_to_codepoints(std::string_view text) {
  std::vector<uint32_t> cps;
  cps.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) cps.push_back(utf8_next(text, &pos));
  return cps;
}

void append_utf8(std::string* out, uint32_t cp) {
  if (cp <= 0x7F) {
    out->push_back(static_cast<char>(cp));
  } else if (cp <= 0x7FF) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp <= 0xFFFF) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp <= kMaxCodepoint) {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    append_utf8(out, kReplacementChar);
  }
}

int utf8_valid_prefix(std::string_view s) {
  if (s.empty()) return -1;
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t lead = b(0);
  if (lead < 0x80) return 1;
  size_t len = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    len = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    len = 3;
    if (lead == 0xE0) lo = 0xA0;  // no overlongs
    if (lead == 0xED) hi = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    len = 4;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
  } else {
    return 0;
  }
  for (size_t k = 1; k < len; ++k) {
    if (k >= s.size()) return -1;
    const uint8_t c = b(k);
    if (k == 1 ? (c < lo || c > hi) : !is_cont(c)) return 0;
  }
  return static_cast<int>(len);
}

std::string_view gpt2_byte_to_utf8(uint8_t byte) { return gpt2_maps().byte_to_utf8[byte]; }

int gpt2_codepoint_to_byte(uint32_t cp) {
  const auto& m = gpt2_maps().cp_to_byte;
  return cp < m.size() ? m[cp] : -1;
}

}  // namespace troupe::model::detail
