// UTF-8 decoding/encoding with llama.cpp's lenient rules, Unicode class lookups (generated tables
// in unicode_tables.cc) and the GPT-2 byte<->character map. Used by the tokenizers, the chat
// templates' interpreter (model/detail/jinja*.cc) and the grammar compiler (compute/grammar.cc).
// All functions are pure or read immutable tables; any thread may call them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::model::detail {

/// Class flags of a codepoint: exactly one general-category bit, plus kCpWhitespace, and for
/// letters at most one of kCpUpper / kCpLower (neither: Lm or Lo), plus kCpHan for the Han script.
enum CpFlags : uint16_t {
  kCpUndefined = 1,     // Cn, or past U+10FFFF
  kCpNumber = 2,        // \p{N}
  kCpLetter = 4,        // \p{L}
  kCpSeparator = 8,     // \p{Z}
  kCpMark = 16,         // \p{M}
  kCpPunctuation = 32,  // \p{P}
  kCpSymbol = 64,       // \p{S}
  kCpControl = 128,     // \p{C} other than Cn
  kCpWhitespace = 256,  // the White_Space property (regex \s)
  kCpUpper = 512,       // \p{Lu} or \p{Lt}
  kCpLower = 1024,      // \p{Ll}
  kCpHan = 2048,        // \p{Han} (the Script property)
};

constexpr uint32_t kReplacementChar = 0xFFFD;

/// Flags of a codepoint (never 0).
uint16_t cp_flags(uint32_t cp);
inline bool cp_is_whitespace(uint32_t cp) { return (cp_flags(cp) & kCpWhitespace) != 0; }

/// Length of the UTF-8 sequence a lead byte announces, judged by its high nibble only
/// (continuation bytes count 1), as llama.cpp's symbol splitters do.
inline size_t utf8_len_from_lead(uint8_t lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

/// Decodes UTF-8 leniently: a malformed byte becomes U+FFFD and decoding resumes at the next byte.
/// Overlong forms and surrogates are accepted (as llama.cpp does); values past U+10FFFF are not.
std::vector<uint32_t> utf8_to_codepoints(std::string_view text);
/// Decodes one codepoint at text[*pos], advancing *pos; returns U+FFFD for a malformed byte.
uint32_t utf8_next(std::string_view text, size_t* pos);
void append_utf8(std::string* out, uint32_t cp);

/// Length of a valid UTF-8 sequence at the start of `s`, 0 when it is malformed, or -1 when `s`
/// is a proper prefix of a sequence that more bytes could complete. Strict (no
/// overlongs/surrogates).
int utf8_valid_prefix(std::string_view s);

// Generated tables (unicode_tables.cc): class runs as (first codepoint << 8) | flags, sorted, and
// the sorted White_Space codepoints.
extern const uint32_t kCategoryRuns[];
extern const size_t kNumCategoryRuns;
extern const uint32_t kWhiteSpace[];
extern const size_t kNumWhiteSpace;
// Letter sub-class and Han runs as (first codepoint << 8) | (1: Lu/Lt, 2: Ll, 4: Han), sorted.
extern const uint32_t kLetterRuns[];
extern const size_t kNumLetterRuns;

/// GPT-2's reversible byte -> printable character map (as UTF-8) and its inverse (-1: not a byte).
std::string_view gpt2_byte_to_utf8(uint8_t byte);
int gpt2_codepoint_to_byte(uint32_t cp);

}  // namespace troupe::model::detail
