// JSON Schema -> GBNF (serve/json_schema.h): one walk over the schema that writes a rule per
// composite schema (objects, arrays, unions, $ref targets) and adds JSON's lexical rules (ws,
// string, number, ...) once, on first use. Errors are thrown as SchemaError inside and returned
// as troupe::Error by json_schema_grammar.
#include "serve/json_schema.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe::serve {
namespace {

using json = nlohmann::ordered_json;

struct SchemaError {
  JsonSchemaErrc code;
  std::string path;  // JSON pointer of the offending keyword
  std::string what;
};

[[noreturn]] void fail(JsonSchemaErrc code, const std::string& path, std::string what) {
  throw SchemaError{code, path, std::move(what)};
}

// Keywords that constrain values and that the grammar cannot enforce.
constexpr std::string_view kUnsupported[] = {
    "pattern",
    "patternProperties",
    "multipleOf",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "minContains",
    "maxContains",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "$dynamicRef",
    "$recursiveRef",
};
constexpr std::string_view kCombinators[] = {"$ref", "anyOf", "oneOf", "allOf"};

// JSON value kinds, as a bit set. kInt is a subset of kNum.
enum Kind : unsigned {
  kNull = 1,
  kBool = 2,
  kInt = 4,
  kNum = 8,
  kStr = 16,
  kArr = 32,
  kObj = 64,
  kAllKinds = 127,
};

// The kind a type-specific keyword applies to; 0 for the rest.
unsigned kind_of_keyword(std::string_view k) {
  static const std::map<std::string_view, unsigned> kKeywords = {
      {"properties", kObj},    {"required", kObj},         {"additionalProperties", kObj},
      {"minProperties", kObj}, {"maxProperties", kObj},    {"items", kArr},
      {"prefixItems", kArr},   {"additionalItems", kArr},  {"minItems", kArr},
      {"maxItems", kArr},      {"uniqueItems", kArr},      {"minLength", kStr},
      {"maxLength", kStr},     {"format", kStr},           {"minimum", kNum},
      {"maximum", kNum},       {"exclusiveMinimum", kNum}, {"exclusiveMaximum", kNum},
  };
  auto it = kKeywords.find(k);
  return it == kKeywords.end() ? 0 : it->second;
}

// The kinds a `type` keyword (one name or a list) names.
unsigned type_kinds(const json& type, const std::string& path) {
  static const std::map<std::string, unsigned> kNames = {
      {"null", kNull},  {"boolean", kBool}, {"integer", kInt}, {"number", kNum},
      {"string", kStr}, {"array", kArr},    {"object", kObj}};
  unsigned kinds = 0;
  for (const auto& name : type.is_array() ? type : json::array({type})) {
    auto it = name.is_string() ? kNames.find(name.get<std::string>()) : kNames.end();
    if (it == kNames.end()) {
      fail(JsonSchemaErrc::kMalformed, path, "unknown type " + name.dump());
    }
    kinds |= it->second;
  }
  if (kinds == 0) fail(JsonSchemaErrc::kMalformed, path, "an empty type list");
  return kinds;
}

bool contains(const auto& list, std::string_view k) {
  return std::find(std::begin(list), std::end(list), k) != std::end(list);
}

std::string escape_pointer(std::string_view key) {  // RFC 6901: ~ -> ~0, / -> ~1
  std::string out;
  for (char c : key) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return out;
}

std::string child(const std::string& path, std::string_view key) {
  return path + "/" + escape_pointer(key);
}

// A GBNF literal matching exactly `bytes`.
std::string literal(std::string_view bytes) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out = "\"";
  for (char c : bytes) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (u < 0x20 || u == 0x7F) {
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Compact JSON text; invalid UTF-8 in a string is a malformed schema.
std::string compact(const json& v, const std::string& path) {
  try {
    return v.dump(-1, ' ', false, json::error_handler_t::strict);
  } catch (const json::exception& e) {
    fail(JsonSchemaErrc::kMalformed, path,
         std::string("cannot write the value as JSON: ") + e.what());
  }
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

// `parts` joined by spaces, skipping empty ones: a GBNF sequence.
std::string seq(std::initializer_list<std::string> parts) {
  std::vector<std::string> kept;
  for (const auto& p : parts) {
    if (!p.empty()) kept.push_back(p);
  }
  return join(kept, " ");
}

// Where the GBNF primary starting at `i` ends (a name, literal, class or group, without postfix).
size_t primary_end(std::string_view e, size_t i) {
  if (i >= e.size()) return i;
  if (e[i] == '"' || e[i] == '[') {
    const char close = e[i] == '"' ? '"' : ']';
    for (++i; i < e.size() && e[i] != close; ++i) {
      if (e[i] == '\\') ++i;
    }
    return i + 1;
  }
  if (e[i] == '(') {
    int depth = 0;
    while (i < e.size()) {
      if (e[i] == '"' || e[i] == '[') {
        i = primary_end(e, i);
        continue;
      }
      if (e[i] == '(') ++depth;
      if (e[i] == ')' && --depth == 0) return i + 1;
      ++i;
    }
    return i;
  }
  while (i < e.size() &&
         (std::isalnum(static_cast<unsigned char>(e[i])) || e[i] == '-' || e[i] == '_')) {
    ++i;
  }
  return i;
}

// An expression that can stand as one element of a sequence or take a postfix operator.
bool is_atom(std::string_view e) { return !e.empty() && primary_end(e, 0) == e.size(); }

std::string group(const std::vector<std::string>& alts) {
  if (alts.size() == 1 && is_atom(alts[0])) return alts[0];
  return "( " + join(alts, " | ") + " )";
}

// Unbounded ends of a range. NOTE: sentinels rather than std::optional, which g++ 12 -O2 reports
// as maybe-uninitialized when built from a conditional expression.
constexpr int64_t kNoMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kNoMin = std::numeric_limits<int64_t>::min();

// atom{lo,hi} (hi == kNoMax: unbounded) in the dialect's shortest spelling; "" for {0,0}.
std::string repeat(const std::string& atom, int64_t lo, int64_t hi) {
  if (hi == kNoMax) {
    if (lo == 0) return atom + "*";
    if (lo == 1) return atom + "+";
    return atom + "{" + std::to_string(lo) + ",}";
  }
  if (hi == 0) return "";
  if (lo == hi) return lo == 1 ? atom : atom + "{" + std::to_string(lo) + "}";
  if (lo == 0 && hi == 1) return atom + "?";
  return atom + "{" + std::to_string(lo) + "," + std::to_string(hi) + "}";
}

std::string sanitize(std::string_view hint) {
  std::string out;
  for (char c : hint.substr(0, 48)) {
    out += std::isalnum(static_cast<unsigned char>(c)) || c == '_' ? c : '-';
  }
  return out;
}

// ---- decimal ranges (integers and bounded numbers) ----

std::string digits(char lo, char hi) {
  if (lo == hi) return literal(std::string(1, lo));
  return std::string("[") + lo + "-" + hi + "]";
}
std::string any_digits(size_t n) { return n == 1 ? "[0-9]" : "[0-9]{" + std::to_string(n) + "}"; }

// Digit strings s of a.size() digits (leading zeros allowed) with a <= s <= b.
std::string same_length_range(const std::string& a, const std::string& b) {
  size_t k = 0;
  while (k < a.size() && a[k] == b[k]) ++k;
  if (k == a.size()) return a.empty() ? "" : literal(a);
  const size_t rest = a.size() - k - 1;
  const std::string ra = a.substr(k + 1), rb = b.substr(k + 1);
  const bool a_lowest = ra == std::string(rest, '0'), b_highest = rb == std::string(rest, '9');
  std::vector<std::string> alts;
  if (!a_lowest)
    alts.push_back(seq({digits(a[k], a[k]), same_length_range(ra, std::string(rest, '9'))}));
  const char mid_lo = a_lowest ? a[k] : char(a[k] + 1), mid_hi = b_highest ? b[k] : char(b[k] - 1);
  if (mid_lo <= mid_hi) alts.push_back(seq({digits(mid_lo, mid_hi), rest ? any_digits(rest) : ""}));
  if (!b_highest)
    alts.push_back(seq({digits(b[k], b[k]), same_length_range(std::string(rest, '0'), rb)}));
  return seq({k ? literal(a.substr(0, k)) : "", group(alts)});
}

// Decimal integers without leading zeros in [lo, hi] (hi == kNoMax: unbounded).
// REQUIRES 0 <= lo <= hi.
std::string natural_range(int64_t lo, int64_t hi) {
  const std::string slo = std::to_string(lo);
  std::vector<std::string> alts;
  if (hi == kNoMax) {
    alts.push_back(same_length_range(slo, std::string(slo.size(), '9')));
    alts.push_back("[1-9] " + any_digits(slo.size()) + " [0-9]*");
    return group(alts);
  }
  const std::string shi = std::to_string(hi);
  for (size_t n = slo.size(); n <= shi.size(); ++n) {
    const std::string a = n == slo.size() ? slo : "1" + std::string(n - 1, '0');
    const std::string b = n == shi.size() ? shi : std::string(n, '9');
    alts.push_back(same_length_range(a, b));
  }
  return group(alts);
}

// Integers in [lo, hi] (kNoMin, kNoMax: unbounded) as JSON writes them ("-0" is there when 0 is).
std::vector<std::string> integer_range(int64_t lo, int64_t hi) {
  std::vector<std::string> alts;
  const int64_t plo = std::max<int64_t>(lo, 0);
  if (hi >= plo) alts.push_back(natural_range(plo, hi));
  if (lo <= 0) {  // "-" m: m >= -hi (or 0), m <= -lo
    const int64_t mlo = hi < 0 ? -hi : 0, mhi = lo == kNoMin ? kNoMax : -lo;
    if (mhi >= mlo) alts.push_back("\"-\" " + natural_range(mlo, mhi));
  }
  return alts;
}

// One end of a number's range: v (kNoMin or kNoMax when absent), exclusive or not.
struct Bound {
  int64_t v;
  bool exclusive;
};

// Unsigned decimal numbers without exponent whose value m satisfies lo <(=) m <(=) hi.
// REQUIRES lo.v >= 0.
void number_magnitudes(Bound lo, Bound hi, std::vector<std::string>* alts,
                       const std::string& sign) {
  const bool bounded = hi.v != kNoMax;
  const int64_t first = lo.exclusive ? lo.v + 1 : lo.v;  // whole parts with any fraction
  if (!bounded || hi.v - 1 >= first) {
    alts->push_back(
        seq({sign, natural_range(first, bounded ? hi.v - 1 : kNoMax), R"(( "." [0-9]+ )?)"}));
  }
  if (lo.exclusive && (!bounded || lo.v < hi.v)) {  // lo.x with x > 0
    alts->push_back(seq({sign, literal(std::to_string(lo.v)), R"("." [0-9]* [1-9] [0-9]*)"}));
  }
  if (bounded && !hi.exclusive && hi.v >= 0 && (hi.v > lo.v || (hi.v == lo.v && !lo.exclusive))) {
    alts->push_back(seq({sign, literal(std::to_string(hi.v)), R"(( "." "0"+ )?)"}));
  }
}

std::vector<std::string> number_range(Bound lo, Bound hi) {
  std::vector<std::string> alts;
  // Texts without a sign: m >= max(lo, 0), m <= hi.
  if (hi.v >= 0) number_magnitudes(lo.v >= 0 ? lo : Bound{0, false}, hi, &alts, "");
  // Texts with "-": value -m, so m >= -hi (or 0) and m <= -lo.
  if (lo.v <= 0) {
    const Bound mlo = hi.v <= 0 ? Bound{-hi.v, hi.exclusive} : Bound{0, false};
    const Bound mhi = lo.v == kNoMin ? Bound{kNoMax, false} : Bound{-lo.v, lo.exclusive};
    number_magnitudes(mlo, mhi, &alts, "\"-\"");
  }
  return alts;
}

// ---- the converter ----

class Converter {
 public:
  Converter(const json& root, const JsonGrammarOptions& opt) : root_(root), opt_(opt) {}

  std::string convert() {
    reserve("root", "");
    refs_[""] = "root";
    define_reserved("root", alternatives(root_, "", "root", 0));
    return emit();
  }

  std::string any_object() {
    reserve("root", "");
    define_reserved("root", lex("object"));
    return emit();
  }

 private:
  struct Rule {
    std::string name, body;
  };

  std::string emit() const {
    std::string out;
    for (const auto& r : rules_) out += r.name + " ::= " + r.body + "\n";
    if (out.size() > opt_.max_grammar_bytes) {
      fail(JsonSchemaErrc::kTooLarge, "",
           "the grammar is " + std::to_string(out.size()) + " bytes, above the limit of " +
               std::to_string(opt_.max_grammar_bytes));
    }
    return out;
  }

  // A fresh rule name from `hint`, its body still empty.
  std::string reserve(const std::string& hint, const std::string& path) {
    if (rules_.size() >= opt_.max_rules) {
      fail(JsonSchemaErrc::kTooLarge, path,
           "the grammar needs more than the limit of " + std::to_string(opt_.max_rules) + " rules");
    }
    std::string name = sanitize(hint);
    for (int i = 2; index_.count(name); ++i) name = sanitize(hint) + "-" + std::to_string(i);
    index_[name] = rules_.size();
    rules_.push_back({name, ""});
    return name;
  }

  void define_reserved(const std::string& name, std::string body) {
    by_body_.emplace(body, name);
    rules_[index_.at(name)].body = std::move(body);
  }

  // A rule with `body`: an existing one with the same body, or a new one named after `hint`.
  std::string define(const std::string& hint, std::string body, const std::string& path) {
    auto it = by_body_.find(body);
    if (it != by_body_.end()) return it->second;
    std::string name = reserve(hint, path);
    define_reserved(name, std::move(body));
    return name;
  }

  std::string lex(const std::string& name);
  std::string lex_body(const std::string& name);

  // An atom (a rule name, a literal or a group) for the values `s` accepts.
  std::string visit(const json& s, const std::string& path, const std::string& hint, int depth) {
    std::string body = alternatives(s, path, hint, depth);
    // Short atoms stay inline; longer bodies get a rule, written once however often it is used.
    if (is_atom(body) && (body.size() <= 40 || index_.count(body))) return body;
    return define(hint, std::move(body), path);
  }

  std::string alternatives(const json& s, const std::string& path, const std::string& hint,
                           int depth);
  std::string combinator(const json& s, const std::string& key, const std::string& path,
                         const std::string& hint, int depth);
  std::string reference(const json& ref, const std::string& path, int depth);
  std::string enumeration(const json& s, const std::string& path, bool nullable);
  std::string object_body(const json& s, const std::string& path, const std::string& hint,
                          int depth);
  std::string array_body(const json& s, const std::string& path, const std::string& hint,
                         int depth);
  std::string string_body(const json& s, const std::string& path);
  std::string number_body(const json& s, const std::string& path, bool integer);
  int64_t count(const json& s, const char* key, const std::string& path, int64_t absent);
  Bound bound(const json& s, const std::string& path, bool lower, bool integer);

  const json& root_;
  const JsonGrammarOptions& opt_;
  std::vector<Rule> rules_;                     // rules_[0] is root
  std::map<std::string, size_t> index_;         // name -> rules_ index
  std::map<std::string, std::string> by_body_;  // body -> name, to share identical rules
  std::map<std::string, std::string> refs_;     // $ref JSON pointer -> its rule
};

// JSON's lexical rules, each added once with the rules it uses.
std::string Converter::lex(const std::string& name) {
  if (index_.count(name)) return name;
  reserve(name, "");
  define_reserved(name, lex_body(name));
  return name;
}

std::string Converter::lex_body(const std::string& n) {
  // Bounded, so that a model cannot spend its tokens on whitespace: one optional space, or
  // (max_indent > 0) one optional newline and up to max_indent spaces or tabs.
  if (n == "ws") {
    return opt_.max_indent > 0 ? R"("\n"? [ \t]{0,)" + std::to_string(opt_.max_indent) + "}"
                               : R"(" "?)";
  }
  if (n == "value") {
    return join(
        {lex("object"), lex("array"), lex("string"), lex("number"), lex("boolean"), lex("null")},
        " | ");
  }
  if (n == "object") {
    return R"("{" )" + lex("ws") + " ( " + lex("member") + R"( ( ws "," ws member )* ws )? "}")";
  }
  if (n == "member") return lex("string") + R"( ws ":" ws )" + lex("value");
  if (n == "array") {
    return R"("[" )" + lex("ws") + " ( " + lex("value") + R"( ( ws "," ws value )* ws )? "]")";
  }
  if (n == "string") return R"("\"" )" + lex("char") + R"(* "\"")";
  // A JSON string's character: anything but '"', '\' and controls, or an escape. A \u escape of
  // a surrogate must be a high-low pair (one code point, as minLength/maxLength count it).
  if (n == "char") {
    lex("hex");
    return R"([^"\\\x00-\x1F] | "\\" ["\\/bfnrt])"
           R"( | "\\u" ( [0-9a-cA-Ce-fE-F] hex{3} | [dD] [0-7] hex{2} ))"
           R"( | "\\u" [dD] [89abAB] hex{2} "\\u" [dD] [c-fC-F] hex{2})";
  }
  if (n == "hex") return "[0-9a-fA-F]";
  if (n == "number") {
    return lex("integer") + R"( ( "." [0-9]+ )? ( [eE] [+\-]? [0-9]+ )?)";
  }
  if (n == "integer") return R"("-"? ( "0" | [1-9] [0-9]* ))";
  if (n == "boolean") return R"("true" | "false")";
  if (n == "null") return R"("null")";
  if (n == "date") {
    lex("day");
    return R"([0-9]{4} "-" ( ( "0" [13578] | "1" [02] ) "-" ( day | "3" [01] ))"
           R"( | ( "0" [469] | "11" ) "-" ( day | "30" ) | "02" "-" day ))";
  }
  if (n == "day") return R"("0" [1-9] | [12] [0-9])";
  if (n == "time") {
    return R"(( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" ( [0-5] [0-9] | "60" ))"
           R"( ( "." [0-9]+ )? ( [zZ] | [+\-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))";
  }
  if (n == "date-time") return lex("date") + " [tT] " + lex("time");
  if (n == "uuid") {
    lex("hex");
    return R"(hex{8} "-" hex{4} "-" hex{4} "-" hex{4} "-" hex{12})";
  }
  if (n == "ipv4") return lex("ipv4-octet") + R"( ( "." ipv4-octet ){3})";
  if (n == "ipv4-octet") {
    return R"("25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9])";
  }
  if (n == "email") {
    return lex("email-atom") + R"( ( "." email-atom )* "@" )" + lex("email-label") +
           R"( ( "." email-label )+)";
  }
  if (n == "email-atom") return R"([A-Za-z0-9!#$%&'*+/=?^_`{|}~\-]+)";
  if (n == "email-label") return R"([A-Za-z0-9] ( [A-Za-z0-9\-]* [A-Za-z0-9] )?)";
  TROUPE_CHECK(false, "no lexical rule '%s'", n.c_str());
  return "";
}

std::string Converter::alternatives(const json& s, const std::string& path, const std::string& hint,
                                    int depth) {
  if (depth > opt_.max_depth) {
    fail(JsonSchemaErrc::kTooLarge, path,
         "nested deeper than the limit of " + std::to_string(opt_.max_depth));
  }
  if (s.is_boolean()) {
    if (s.get<bool>()) return lex("value");
    fail(JsonSchemaErrc::kMalformed, path, "schema false accepts no value");
  }
  if (!s.is_object()) {
    fail(JsonSchemaErrc::kMalformed, path,
         std::string("a schema is an object or a boolean, not ") + s.type_name());
  }
  // The first unsupported keyword, then the first combination this converter cannot intersect.
  std::string comb;
  for (const auto& [k, v] : s.items()) {
    if (contains(kUnsupported, k) || (k == "uniqueItems" && v == true)) {
      fail(JsonSchemaErrc::kUnsupported, child(path, k),
           "keyword '" + k + (k == "uniqueItems" ? "' true" : "'") + " is not supported");
    }
  }
  for (const auto& [k, v] : s.items()) {
    const bool constrains = contains(kCombinators, k) || k == "type" || k == "enum" ||
                            k == "const" || kind_of_keyword(k) != 0;
    if (!constrains || (k == "uniqueItems" && v == false)) continue;
    if (!comb.empty() && (contains(kCombinators, comb) || contains(kCombinators, k))) {
      fail(JsonSchemaErrc::kUnsupported, child(path, k),
           "keyword '" + k + "' alongside '" + comb + "' is not supported");
    }
    if (comb.empty()) comb = k;
  }
  bool nullable = false;
  if (s.contains("nullable")) {
    if (!s["nullable"].is_boolean()) {
      fail(JsonSchemaErrc::kMalformed, child(path, "nullable"), "nullable must be a boolean");
    }
    nullable = s["nullable"].get<bool>();
  }
  if (contains(kCombinators, comb)) {
    std::string body = combinator(s, comb, path, hint, depth);
    return nullable ? body + " | " + lex("null") : body;
  }
  if (s.contains("enum") || s.contains("const")) return enumeration(s, path, nullable);

  unsigned kinds = 0;
  bool keywords = false;  // type-specific keywords present
  for (const auto& [k, v] : s.items()) keywords |= kind_of_keyword(k) != 0;
  if (s.contains("type")) {
    kinds = type_kinds(s["type"], child(path, "type"));
  } else {
    for (const auto& [k, v] : s.items()) kinds |= k == "uniqueItems" ? 0 : kind_of_keyword(k);
    if (kinds == 0) kinds = kAllKinds;
  }
  if (nullable) kinds |= kNull;
  if ((kinds | kInt) == kAllKinds && !keywords) return lex("value");

  std::vector<std::string> alts;
  if (kinds & kObj) alts.push_back(object_body(s, path, hint, depth));
  if (kinds & kArr) alts.push_back(array_body(s, path, hint, depth));
  if (kinds & kStr) alts.push_back(string_body(s, path));
  if (kinds & (kNum | kInt)) alts.push_back(number_body(s, path, !(kinds & kNum)));
  if (kinds & kBool) alts.push_back(lex("boolean"));
  if (kinds & kNull) alts.push_back(lex("null"));
  return join(alts, " | ");
}

std::string Converter::combinator(const json& s, const std::string& key, const std::string& path,
                                  const std::string& hint, int depth) {
  const std::string at = child(path, key);
  if (key == "$ref") return reference(s[key], at, depth);
  const json& members = s[key];
  if (!members.is_array() || members.empty()) {
    fail(JsonSchemaErrc::kMalformed, at, key + " must be a non-empty array");
  }
  if (key == "allOf") {
    if (members.size() != 1) {
      fail(JsonSchemaErrc::kUnsupported, at,
           "allOf with " + std::to_string(members.size()) + " members is not supported (only one)");
    }
    return alternatives(members[0], child(at, "0"), hint, depth + 1);
  }
  std::vector<std::string> alts;
  for (size_t i = 0; i < members.size(); ++i) {
    std::string a =
        visit(members[i], child(at, std::to_string(i)), hint + "-" + std::to_string(i), depth + 1);
    if (std::find(alts.begin(), alts.end(), a) == alts.end()) alts.push_back(std::move(a));
  }
  return join(alts, " | ");
}

std::string Converter::reference(const json& ref, const std::string& path, int depth) {
  if (!ref.is_string()) fail(JsonSchemaErrc::kMalformed, path, "$ref must be a string");
  const std::string r = ref.get<std::string>();
  if (r.empty() || r[0] != '#') {
    fail(JsonSchemaErrc::kUnsupported, path,
         "$ref '" + r + "' is not supported (only local references: #, #/$defs/Name)");
  }
  const std::string pointer = r.substr(1);
  if (auto it = refs_.find(pointer); it != refs_.end()) return it->second;
  const json* target = nullptr;
  try {
    target = &root_.at(json::json_pointer(pointer));
  } catch (const json::exception&) {
    fail(JsonSchemaErrc::kMalformed, path, "$ref '" + r + "' does not resolve");
  }
  const std::string last = pointer.substr(pointer.rfind('/') + 1);
  const std::string name = reserve("def-" + last, path);
  refs_[pointer] = name;
  define_reserved(name, alternatives(*target, pointer, name, depth + 1));
  return name;
}

bool of_kinds(const json& v, unsigned kinds) {
  switch (v.type()) {
    case json::value_t::null:
      return kinds & kNull;
    case json::value_t::boolean:
      return kinds & kBool;
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return kinds & (kInt | kNum);
    case json::value_t::number_float: {
      const double d = v.get<double>();
      return (kinds & kNum) || ((kinds & kInt) && std::floor(d) == d);
    }
    case json::value_t::string:
      return kinds & kStr;
    case json::value_t::array:
      return kinds & kArr;
    case json::value_t::object:
      return kinds & kObj;
    default:
      return false;
  }
}

std::string Converter::enumeration(const json& s, const std::string& path, bool nullable) {
  const char* key = s.contains("const") ? "const" : "enum";
  const std::string at = child(path, key);
  if (s.contains("const") && s.contains("enum")) {
    fail(JsonSchemaErrc::kUnsupported, child(path, "enum"),
         "keyword 'enum' alongside 'const' is not supported");
  }
  for (const auto& [k, v] : s.items()) {
    if (kind_of_keyword(k) != 0) {
      fail(JsonSchemaErrc::kUnsupported, child(path, k),
           "keyword '" + k + "' alongside '" + key + "' is not supported");
    }
  }
  std::vector<json> values;
  if (s.contains("const")) {
    values.push_back(s["const"]);
  } else if (!s["enum"].is_array() || s["enum"].empty()) {
    fail(JsonSchemaErrc::kMalformed, at, "enum must be a non-empty array");
  } else {
    values.assign(s["enum"].begin(), s["enum"].end());
  }
  const unsigned kinds =
      s.contains("type") ? type_kinds(s["type"], child(path, "type")) : kAllKinds;
  std::vector<std::string> alts;
  auto add = [&](std::string lit) {
    if (std::find(alts.begin(), alts.end(), lit) == alts.end()) alts.push_back(std::move(lit));
  };
  for (size_t i = 0; i < values.size(); ++i) {
    if (of_kinds(values[i], kinds)) add(literal(compact(values[i], at)));
  }
  if (nullable) add(lex("null"));
  if (alts.empty())
    fail(JsonSchemaErrc::kMalformed, at,
         std::string("no value of ") + key + " has the schema's type");
  return join(alts, " | ");
}

// A count keyword (minItems, maxLength, ...): a non-negative integer not above max_repeat (a
// bounded repetition is expanded into copies), or `absent`.
int64_t Converter::count(const json& s, const char* key, const std::string& path, int64_t absent) {
  if (!s.contains(key)) return absent;
  const json& v = s[key];
  const std::string at = child(path, key);
  const bool whole = v.is_number_integer() ||
                     (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  if (!whole || v.get<double>() < 0) {
    fail(JsonSchemaErrc::kMalformed, at, std::string(key) + " must be a non-negative integer");
  }
  if (v.get<double>() > static_cast<double>(opt_.max_repeat)) {
    fail(JsonSchemaErrc::kTooLarge, at,
         std::string(key) + " " + compact(v, at) + " is above the limit of " +
             std::to_string(opt_.max_repeat));
  }
  return static_cast<int64_t>(v.get<double>());
}

// The names `required` lists, each one a declared property (an undeclared one would have to come
// from additionalProperties, which this converter does not track).
std::vector<std::string> required_names(const json& s, const json& props, const std::string& path) {
  std::vector<std::string> required;
  if (!s.contains("required")) return required;
  const json& req = s["required"];
  if (!req.is_array()) {
    fail(JsonSchemaErrc::kMalformed, child(path, "required"), "required must be an array");
  }
  for (size_t i = 0; i < req.size(); ++i) {
    const std::string at = child(child(path, "required"), std::to_string(i));
    if (!req[i].is_string()) fail(JsonSchemaErrc::kMalformed, at, "a required name is a string");
    const std::string name = req[i].get<std::string>();
    if (!props.contains(name)) {
      fail(JsonSchemaErrc::kUnsupported, at,
           "required property '" + name + "' is not declared in properties (not supported)");
    }
    if (props[name] == false) {
      fail(JsonSchemaErrc::kMalformed, at, "required property '" + name + "' has schema false");
    }
    required.push_back(name);
  }
  return required;
}

std::string Converter::object_body(const json& s, const std::string& path, const std::string& hint,
                                   int depth) {
  static const json kEmpty = json::object();
  const json& props = s.contains("properties") ? s["properties"] : kEmpty;
  if (!props.is_object()) {
    fail(JsonSchemaErrc::kMalformed, child(path, "properties"), "properties must be an object");
  }
  const std::vector<std::string> required = required_names(s, props, path);
  // Extra members: their value's atom, or "" for none.
  std::string extra_value;
  if (s.contains("additionalProperties")) {
    const json& ap = s["additionalProperties"];
    if (ap != false) {
      extra_value = visit(ap, child(path, "additionalProperties"), hint + "-additional", depth + 1);
    }
  }
  // Declared members in order; a property with schema false may not appear at all.
  struct Member {
    std::string key, kv;
    bool required;
  };
  std::vector<Member> members;
  for (const auto& [key, sub] : props.items()) {
    if (sub == false) continue;
    const std::string value =
        visit(sub, child(child(path, "properties"), key), hint + "-" + key, depth + 1);
    const bool req = std::find(required.begin(), required.end(), key) != required.end();
    members.push_back({key, seq({literal(compact(json(key), path)), R"(ws ":" ws)", value}), req});
  }
  lex("ws");
  const int64_t num_required = static_cast<int64_t>(required.size());
  if (const int64_t lo = count(s, "minProperties", path, 0); lo > num_required) {
    fail(JsonSchemaErrc::kUnsupported, child(path, "minProperties"),
         "minProperties " + std::to_string(lo) + " above the " + std::to_string(num_required) +
             " required properties is not supported");
  }
  if (const int64_t hi = count(s, "maxProperties", path, kNoMax);
      hi != kNoMax && (!extra_value.empty() || hi < static_cast<int64_t>(members.size()))) {
    fail(JsonSchemaErrc::kUnsupported, child(path, "maxProperties"),
         "maxProperties " + std::to_string(hi) +
             " below the number of properties that may appear is not supported");
  }
  const std::string extra =
      extra_value.empty() ? "" : seq({lex("string"), R"(ws ":" ws)", extra_value});
  // next[j]: one or more members, the first being member j or (member j being optional) a later
  // one; next[p]: the additional members. After a member the grammar asks once for `ws ","` and
  // then which member comes next, so both the rules and the matcher's open choices stay linear
  // in the number of properties.
  const size_t p = members.size();
  std::vector<std::string> next(p + 1);
  if (!extra.empty()) {
    next[p] =
        define(hint + "-additional-members", seq({extra, R"(( ws "," ws )" + extra + " )*"}), path);
  }
  bool required_later = false;  // a required member after j
  for (size_t j = p; j-- > 0;) {
    const std::string& rest = next[j + 1];
    std::string after;  // what may follow member j
    if (!rest.empty()) {
      after = required_later ? R"(ws "," ws )" + rest : R"(( ws "," ws )" + rest + " )?";
    }
    std::string body = seq({members[j].kv, after});
    if (!members[j].required && !rest.empty()) body += " | " + rest;
    next[j] = define(hint + "-from-" + members[j].key, std::move(body), path);
    required_later |= members[j].required;
  }
  if (next[0].empty()) return R"("{" ws "}")";
  if (required_later) return R"("{" ws )" + next[0] + R"( ws "}")";
  return R"("{" ws ( )" + next[0] + R"( ws )? "}")";
}

std::string Converter::array_body(const json& s, const std::string& path, const std::string& hint,
                                  int depth) {
  // The tuple part (prefixItems, or draft 4's array `items`) and the schema of the items after it.
  std::vector<std::string> prefix;
  std::string prefix_key, rest_key = "items";
  if (s.contains("prefixItems")) {
    prefix_key = "prefixItems";
  } else if (s.contains("items") && s["items"].is_array()) {
    prefix_key = "items";
    rest_key = "additionalItems";
  }
  if (!prefix_key.empty()) {
    const json& tuple = s[prefix_key];
    if (!tuple.is_array()) {
      fail(JsonSchemaErrc::kMalformed, child(path, prefix_key), prefix_key + " must be an array");
    }
    for (size_t i = 0; i < tuple.size(); ++i) {
      prefix.push_back(visit(tuple[i], child(child(path, prefix_key), std::to_string(i)),
                             hint + "-" + std::to_string(i), depth + 1));
    }
  }
  std::string rest;  // "" when no further items may follow
  if (s.contains(rest_key)) {
    if (s[rest_key] != false) {
      rest = visit(s[rest_key], child(path, rest_key), hint + "-item", depth + 1);
    }
  } else if (prefix_key.empty()) {
    rest = lex("value");
  }
  const auto p = static_cast<int64_t>(prefix.size());
  const int64_t lo = count(s, "minItems", path, 0);
  int64_t hi = count(s, "maxItems", path, kNoMax);
  if (rest.empty()) hi = std::min(hi, p);
  if (lo > hi) {
    fail(JsonSchemaErrc::kMalformed, path,
         "no array has at least " + std::to_string(lo) + " and at most " + std::to_string(hi) +
             " items");
  }
  lex("ws");
  if (hi == 0) return R"("[" ws "]")";
  // The items from index i on, item i present; later ones optional past minItems.
  std::string items;
  for (int64_t i = hi == kNoMax ? p : std::min(p, hi - 1); i >= 0; --i) {
    const std::string sep = i == 0 ? "" : R"(ws "," ws)";
    std::string text;
    if (i == p) {  // the rest: items - p more, at least one
      const std::string more = R"(( ws "," ws )" + rest + " )";
      const int64_t extra_hi = hi == kNoMax ? kNoMax : hi - p - 1;
      text = seq({sep, rest, repeat(more, std::max<int64_t>(lo - p, 1) - 1, extra_hi)});
    } else {
      const std::string later = items.empty() ? "" : i + 1 < lo ? items : "( " + items + " )?";
      text = seq({sep, prefix[i], later});
    }
    items = std::move(text);
  }
  if (lo >= 1) return R"("[" ws )" + items + R"( ws "]")";
  return R"("[" ws ( )" + items + R"( ws )? "]")";
}

std::string Converter::string_body(const json& s, const std::string& path) {
  const std::string quote = R"("\"")";
  if (s.contains("format")) {
    const std::string at = child(path, "format");
    for (const char* k : {"minLength", "maxLength"}) {
      if (s.contains(k)) {
        fail(JsonSchemaErrc::kUnsupported, child(path, k),
             std::string("keyword '") + k + "' alongside 'format' is not supported");
      }
    }
    static const char* const kFormats[] = {"date", "time", "date-time", "uuid", "ipv4", "email"};
    const json& f = s["format"];
    if (!f.is_string()) fail(JsonSchemaErrc::kMalformed, at, "format must be a string");
    if (!contains(kFormats, f.get<std::string>())) {
      fail(JsonSchemaErrc::kUnsupported, at,
           "format '" + f.get<std::string>() +
               "' is not supported (date, time, date-time, uuid, ipv4, email are)");
    }
    return seq({quote, lex(f.get<std::string>()), quote});
  }
  const int64_t lo = count(s, "minLength", path, 0), hi = count(s, "maxLength", path, kNoMax);
  if (lo > hi) {
    fail(JsonSchemaErrc::kMalformed, path,
         "no string has at least " + std::to_string(lo) + " and at most " + std::to_string(hi) +
             " characters");
  }
  if (lo == 0 && hi == kNoMax) return lex("string");
  return seq({quote, repeat(lex("char"), lo, hi), quote});
}

// The lower (or upper) bound of minimum/exclusiveMinimum (maximum/exclusiveMaximum), the stricter
// of the two; draft 4's boolean exclusiveMinimum makes minimum exclusive. For integers a bound is
// rounded inward to an inclusive whole number; for numbers it must be whole. Absent: kNoMin
// (lower) or kNoMax.
Bound Converter::bound(const json& s, const std::string& path, bool lower, bool integer) {
  const std::string inc = lower ? "minimum" : "maximum";
  const std::string exc = lower ? "exclusiveMinimum" : "exclusiveMaximum";
  struct Raw {
    double v;
    bool exclusive;
    std::string key;
  };
  Raw best{0, false, ""};  // key "": none yet
  auto consider = [&](const std::string& key, bool exclusive) {
    const json& v = s[key];
    if (!v.is_number()) {
      fail(JsonSchemaErrc::kMalformed, child(path, key), key + " must be a number");
    }
    const Raw r{v.get<double>(), exclusive, key};
    const bool stricter =
        best.key.empty() || (lower ? r.v > best.v : r.v < best.v) || (r.v == best.v && exclusive);
    if (stricter) best = r;
  };
  const bool draft4 = s.contains(exc) && s[exc].is_boolean();
  if (s.contains(inc)) consider(inc, draft4 && s[exc].get<bool>());
  if (draft4 && s[exc].get<bool>() && !s.contains(inc)) {
    fail(JsonSchemaErrc::kMalformed, child(path, exc), exc + " true without " + inc);
  }
  if (s.contains(exc) && !draft4) consider(exc, true);
  if (best.key.empty()) return Bound{lower ? kNoMin : kNoMax, false};
  const std::string at = child(path, best.key);
  if (!(std::fabs(best.v) <= 1e15)) {
    fail(JsonSchemaErrc::kUnsupported, at, best.key + " beyond 1e15 is not supported");
  }
  if (integer) {
    double v = lower ? (best.exclusive ? std::floor(best.v) + 1 : std::ceil(best.v))
                     : (best.exclusive ? std::ceil(best.v) - 1 : std::floor(best.v));
    return Bound{static_cast<int64_t>(v), false};
  }
  if (std::floor(best.v) != best.v) {
    fail(JsonSchemaErrc::kUnsupported, at,
         best.key + " " + compact(s[best.key], at) +
             " on a number is not supported (only whole-number bounds are)");
  }
  return Bound{static_cast<int64_t>(best.v), best.exclusive};
}

std::string Converter::number_body(const json& s, const std::string& path, bool integer) {
  const Bound lo = bound(s, path, true, integer), hi = bound(s, path, false, integer);
  if (lo.v == kNoMin && hi.v == kNoMax) return lex(integer ? "integer" : "number");
  const std::vector<std::string> alts = integer ? integer_range(lo.v, hi.v) : number_range(lo, hi);
  if (alts.empty()) {
    fail(JsonSchemaErrc::kMalformed, path,
         std::string("no ") + (integer ? "integer" : "number") + " is within the bounds");
  }
  return group(alts);
}

}  // namespace

Result<std::string> json_schema_grammar(const nlohmann::ordered_json& schema,
                                        const JsonGrammarOptions& opt) {
  try {
    return Converter(schema, opt).convert();
  } catch (const SchemaError& e) {
    return make_error(static_cast<int>(e.code),
                      "schema at " + (e.path.empty() ? std::string("/") : e.path) + ": " + e.what);
  } catch (const nlohmann::json::exception& e) {
    return make_error(static_cast<int>(JsonSchemaErrc::kMalformed),
                      std::string("schema: ") + e.what());
  }
}

std::string json_object_grammar() {
  static const json kNone;
  static const JsonGrammarOptions kDefaults;
  return Converter(kNone, kDefaults).any_object();
}

}  // namespace troupe::serve
