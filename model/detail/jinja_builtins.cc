// Jinja's built-ins for model/detail/jinja.h: Python's printing (str, repr, json.dumps as
// transformers' tojson calls it), comparison, attribute and item lookup with the string and dict
// methods templates call, filters and tests. Pure.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstring>

#include "model/detail/jinja.h"
#include "model/detail/unicode.h"

namespace troupe::model::detail {
namespace {

[[noreturn]] void fail(std::string message) { throw JinjaError{std::move(message), false}; }

// A float's integer part, as Python's int(); an error for nan, inf and values past 64 bits.
int64_t float_to_int(double d) {
  if (!(std::fabs(d) < 9.2e18))
    fail("cannot convert the float " + std::to_string(d) + " to a 64-bit integer");
  return static_cast<int64_t>(d);
}

[[noreturn]] void undefined_error(const Value& v) {
  fail("'" + std::get<Undefined>(v.v).name + "' is undefined");
}

// Python's repr of a float: the shortest digits that read back, in fixed notation for decimal
// exponents -4..15 (with ".0" when integral), else as 1.5e-07 / 1e+16.
std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string s(buf, r.ptr);
  const size_t e = s.find('e');
  std::string mant = s.substr(0, e);
  const int exp = std::stoi(s.substr(e + 1));
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits.push_back(c);
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exp) + 1) + "." +
            digits.substr(static_cast<size_t>(exp) + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += eb;
  }
  return neg ? "-" + out : out;
}

// Python's repr of a str: single quotes unless the text has ' and no ".
std::string string_repr(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c == static_cast<unsigned char>(q)) {
          out.push_back('\\');
          out.push_back(static_cast<char>(c));
        } else if (c < 0x20 || c == 0x7f) {
          char b[8];
          std::snprintf(b, sizeof b, "\\x%02x", c);
          out += b;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out.push_back(q);
  return out;
}

void json_string(const std::string& s, const JsonStyle& st, std::string* out) {
  out->push_back('"');
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80 && st.ensure_ascii) {
      // \uXXXX, as surrogate pairs past the BMP (Python's ensure_ascii).
      const size_t n = utf8_len_from_lead(c);
      uint32_t cp = n == 2 ? c & 0x1Fu : n == 3 ? c & 0x0Fu : n == 4 ? c & 0x07u : c;
      for (size_t k = 1; k < n && i + k < s.size(); ++k)
        cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3Fu);
      i += n - 1;
      char b[16];
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
      } else {
        std::snprintf(b, sizeof b, "\\u%04x", cp);
      }
      *out += b;
      continue;
    }
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          *out += b;
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

void json_value(const Value& v, const JsonStyle& st, int level, std::string* out) {
  if (level > 200) fail("tojson: a value nested too deeply");
  const int indent = st.indent;
  auto newline = [&](int lvl) {
    out->push_back('\n');
    out->append(static_cast<size_t>(indent * lvl), ' ');
  };
  const std::string& item_sep = st.item_sep;
  if (v.is_undefined()) fail("Object of type Undefined is not JSON serializable");
  if (v.is_none()) {
    *out += "null";
  } else if (v.is_bool()) {
    *out += std::get<bool>(v.v) ? "true" : "false";
  } else if (v.is_int()) {
    *out += std::to_string(v.as_int());
  } else if (v.is_float()) {
    const double d = v.as_double();
    *out += std::isnan(d)   ? "NaN"
            : std::isinf(d) ? (d < 0 ? "-Infinity" : "Infinity")
                            : float_repr(d);
  } else if (v.is_string()) {
    json_string(v.str(), st, out);
  } else if (v.is_list()) {
    const List& l = v.list();
    if (l.empty()) {
      *out += "[]";
      return;
    }
    out->push_back('[');
    for (size_t i = 0; i < l.size(); ++i) {
      if (i) *out += item_sep;
      if (indent >= 0) newline(level + 1);
      json_value(l[i], st, level + 1, out);
    }
    if (indent >= 0) newline(level);
    out->push_back(']');
  } else if (v.is_dict()) {
    std::vector<const std::pair<std::string, Value>*> items;
    for (const auto& kv : v.dict().items) items.push_back(&kv);
    if (st.sort_keys)
      std::stable_sort(items.begin(), items.end(),
                       [](auto* a, auto* b) { return a->first < b->first; });
    if (items.empty()) {
      *out += "{}";
      return;
    }
    out->push_back('{');
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) *out += item_sep;
      if (indent >= 0) newline(level + 1);
      // json.dumps writes other keys as strings: 1 -> "1", True -> "true", None -> "null".
      const Value key = v.dict().key_value(items[i]->first);
      json_string(key.is_string() ? key.str()
                  : key.is_bool() ? (std::get<bool>(key.v) ? "true" : "false")
                  : key.is_none() ? "null"
                                  : py_repr(key),
                  st, out);
      *out += st.key_sep;
      json_value(items[i]->second, st, level + 1, out);
    }
    if (indent >= 0) newline(level);
    out->push_back('}');
  } else {
    fail("Object of type function is not JSON serializable");
  }
}

// Code points of a UTF-8 string, each as its bytes (Python's str iterates characters).
// The number of code points of a UTF-8 string (Python's len of a str).
size_t count_chars(const std::string& s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); i += utf8_len_from_lead(static_cast<uint8_t>(s[i]))) ++n;
  return n;
}

List characters(const std::string& s) {
  List out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = std::min(utf8_len_from_lead(static_cast<uint8_t>(s[i])), s.size() - i);
    out.push_back(Value(s.substr(i, n)));
    i += n;
  }
  return out;
}

bool is_py_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string strip_chars(const std::string& s, const Value* chars, bool left, bool right) {
  auto strip = [&](char c) {
    if (!chars || chars->is_none()) return is_py_space(c);
    return chars->str().find(c) != std::string::npos;
  };
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && strip(s[b])) ++b;
  if (right)
    while (e > b && strip(s[e - 1])) --e;
  return s.substr(b, e - b);
}

// The other case of code point `cp` (upper: to upper case), for ASCII, Latin-1, Latin
// Extended-A, Greek and Cyrillic; other scripts keep theirs. 0: unchanged.
uint32_t other_case(uint32_t cp, bool upper) {
  auto span = [&](uint32_t lo_upper, uint32_t hi_upper, uint32_t delta) -> uint32_t {
    if (upper && cp >= lo_upper + delta && cp <= hi_upper + delta) return cp - delta;
    if (!upper && cp >= lo_upper && cp <= hi_upper) return cp + delta;
    return 0;
  };
  if (cp < 0x80) return span('A', 'Z', 32);
  if (cp == 0xD7 || cp == 0xF7) return 0;
  if (cp >= 0xC0 && cp <= 0xFE) return span(0xC0, 0xDE, 32);
  if (cp == 0xFF) return upper ? 0x178 : 0;
  if (cp == 0x178) return upper ? 0 : 0xFF;
  if (cp >= 0x100 && cp <= 0x17F) {
    if (cp == 0x130 || cp == 0x131 || cp == 0x138 || cp == 0x149 || cp == 0x17F) return 0;
    // Pairs start on even code points, except 0x139..0x148 and 0x179..0x17E (odd).
    const bool odd_pairs = (cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E);
    const bool is_upper = odd_pairs ? (cp & 1) == 1 : (cp & 1) == 0;
    if (upper == is_upper) return 0;
    return upper ? cp - 1 : cp + 1;
  }
  if (cp >= 0x391 && cp <= 0x3C9) {
    if (cp == 0x3A2) return 0;
    if (cp == 0x3C2) return upper ? 0x3A3 : 0;  // final sigma
    return span(0x391, 0x3A9, 32);
  }
  if (cp >= 0x400 && cp <= 0x45F) {
    if (uint32_t r = span(0x410, 0x42F, 32)) return r;
    return span(0x400, 0x40F, 0x50);
  }
  return 0;
}

// Python's str.upper()/lower() for the scripts other_case knows (and upper("ß") = "SS").
std::string change_case(const std::string& s, bool upper) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(upper ? std::toupper(c) : std::tolower(c)));
      ++i;
      continue;
    }
    if ((c >> 5) == 6 && i + 1 < s.size()) {
      const uint32_t cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
      if (upper && cp == 0xDF) {
        out += "SS";
      } else if (const uint32_t o = other_case(cp, upper)) {
        append_utf8(&out, o);
      } else {
        out.append(s, i, 2);
      }
      i += 2;
      continue;
    }
    out.push_back(static_cast<char>(c));
    ++i;
  }
  return out;
}

std::string lower(const std::string& s) { return change_case(s, false); }
std::string upper(const std::string& s) { return change_case(s, true); }
bool is_alpha(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; }

// Python's str.title(): a letter after a non-letter is upper case, the others lower.
std::string py_title(const std::string& s) {
  std::string out = s;
  bool prev_letter = false;
  for (char& c : out) {
    if (is_alpha(c)) {
      c = static_cast<char>(prev_letter ? std::tolower(static_cast<unsigned char>(c))
                                        : std::toupper(static_cast<unsigned char>(c)));
      prev_letter = true;
    } else {
      prev_letter = false;
    }
  }
  return out;
}

// jinja2's title filter: a word starts after whitespace or one of - ( { [ <.
std::string jinja_title(const std::string& s) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    const bool sep = is_py_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      start = true;
      continue;
    }
    c = static_cast<char>(start ? std::toupper(static_cast<unsigned char>(c))
                                : std::tolower(static_cast<unsigned char>(c)));
    start = false;
  }
  return out;
}

std::string capitalize(const std::string& s) {
  std::string out = lower(s);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to,
                        int64_t count) {
  if (from.empty()) {
    std::string out;
    int64_t n = 0;
    List cs = characters(s);
    for (const Value& c : cs) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      out += c.str();
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  std::string out;
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t at = s.find(from, pos);
    if (at == std::string::npos) break;
    out.append(s, pos, at - pos);
    out += to;
    pos = at + from.size();
    ++n;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

List split(const std::string& s, const Value* sep, int64_t maxsplit) {
  List out;
  if (!sep || sep->is_none()) {
    size_t i = 0;
    while (true) {
      while (i < s.size() && is_py_space(s[i])) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        size_t e = s.size();
        while (e > i && is_py_space(s[e - 1])) --e;
        out.push_back(Value(s.substr(i, e - i)));
        break;
      }
      size_t j = i;
      while (j < s.size() && !is_py_space(s[j])) ++j;
      out.push_back(Value(s.substr(i, j - i)));
      i = j;
    }
    return out;
  }
  if (!sep->is_string()) fail("split(): the separator must be a string");
  const std::string& d = sep->str();
  if (d.empty()) fail("empty separator");
  size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    const size_t at = s.find(d, pos);
    if (at == std::string::npos) break;
    out.push_back(Value(s.substr(pos, at - pos)));
    pos = at + d.size();
  }
  out.push_back(Value(s.substr(pos)));
  return out;
}

const Value* arg(Args& a, size_t i, const char* name) {
  if (i < a.pos.size()) return &a.pos[i];
  for (auto& [k, v] : a.kw)
    if (k == name) return &v;
  return nullptr;
}

std::string str_arg(Args& a, size_t i, const char* name, const char* fn) {
  const Value* v = arg(a, i, name);
  if (!v || !v->is_string()) fail(std::string(fn) + "() needs a string argument '" + name + "'");
  return v->str();
}

int64_t int_arg(Args& a, size_t i, const char* name, int64_t dflt) {
  const Value* v = arg(a, i, name);
  if (!v || v->is_none()) return dflt;
  if (!v->is_int()) fail(std::string("'") + name + "' must be an integer");
  return v->as_int();
}

Value make_method(std::string name, std::function<Value(Args&)> fn) {
  auto c = std::make_shared<Callable>();
  c->name = std::move(name);
  c->fn = [fn = std::move(fn)](Renderer&, Args& a) { return fn(a); };
  return Value(std::shared_ptr<const Callable>(std::move(c)));
}

bool prefix_test(const std::string& s, const Value& p, bool starts) {
  auto one = [&](const Value& x) {
    if (!x.is_string()) fail("startswith/endswith take a string or a tuple of strings");
    const std::string& t = x.str();
    if (t.size() > s.size()) return false;
    return starts ? s.compare(0, t.size(), t) == 0
                  : s.compare(s.size() - t.size(), t.size(), t) == 0;
  };
  if (p.is_list()) {
    for (const Value& x : p.list())
      if (one(x)) return true;
    return false;
  }
  return one(p);
}

Value string_method(const std::string& s, const std::string& name) {
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return make_method(name, [s, name](Args& a) {
      const Value* c = arg(a, 0, "chars");
      return Value(strip_chars(s, c, name != "rstrip", name != "lstrip"));
    });
  if (name == "split")
    return make_method(name, [s](Args& a) {
      return Value(split(s, arg(a, 0, "sep"), int_arg(a, 1, "maxsplit", -1)));
    });
  if (name == "splitlines")
    return make_method(name, [s](Args&) {
      List out;
      size_t pos = 0;
      while (pos < s.size()) {
        size_t e = s.find_first_of("\r\n", pos);
        if (e == std::string::npos) {
          out.push_back(Value(s.substr(pos)));
          break;
        }
        out.push_back(Value(s.substr(pos, e - pos)));
        pos = e + (s[e] == '\r' && e + 1 < s.size() && s[e + 1] == '\n' ? 2 : 1);
      }
      return Value(std::move(out));
    });
  if (name == "startswith" || name == "endswith")
    return make_method(name, [s, name](Args& a) {
      const Value* p = arg(a, 0, "prefix");
      if (!p) fail(name + "() takes an argument");
      return Value(prefix_test(s, *p, name == "startswith"));
    });
  if (name == "upper") return make_method(name, [s](Args&) { return Value(upper(s)); });
  if (name == "lower") return make_method(name, [s](Args&) { return Value(lower(s)); });
  if (name == "title") return make_method(name, [s](Args&) { return Value(py_title(s)); });
  if (name == "capitalize") return make_method(name, [s](Args&) { return Value(capitalize(s)); });
  if (name == "replace")
    return make_method(name, [s](Args& a) {
      return Value(replace_all(s, str_arg(a, 0, "old", "replace"), str_arg(a, 1, "new", "replace"),
                               int_arg(a, 2, "count", -1)));
    });
  if (name == "find" || name == "rfind" || name == "index" || name == "count")
    return make_method(name, [s, name](Args& a) {
      const std::string sub = str_arg(a, 0, "sub", name.c_str());
      if (name == "count") {
        if (sub.empty()) return Value(static_cast<int64_t>(count_chars(s) + 1));
        int64_t n = 0;
        for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
        return Value(n);
      }
      const size_t p = name == "rfind" ? s.rfind(sub) : s.find(sub);
      if (p == std::string::npos) {
        if (name == "index") fail("substring not found");
        return Value(int64_t{-1});
      }
      return Value(static_cast<int64_t>(count_chars(s.substr(0, p))));
    });
  if (name == "join")
    return make_method(name, [s](Args& a) {
      const Value* l = arg(a, 0, "iterable");
      if (!l) fail("join() takes an argument");
      std::string out;
      bool first = true;
      for (const Value& x : iterate(*l)) {
        if (!x.is_string()) fail("join(): expected str, got " + type_name(x));
        if (!first) out += s;
        out += x.str();
        first = false;
      }
      return Value(std::move(out));
    });
  if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum" ||
      name == "islower" || name == "isupper")
    return make_method(name, [s, name](Args&) {
      if (s.empty()) return Value(false);
      bool cased = false;
      for (unsigned char c : s) {
        bool ok = true;
        if (name == "isdigit")
          ok = std::isdigit(c);
        else if (name == "isalpha")
          ok = std::isalpha(c);
        else if (name == "isspace")
          ok = is_py_space(static_cast<char>(c));
        else if (name == "isalnum")
          ok = std::isalnum(c);
        else if (name == "islower")
          ok = !std::isupper(c), cased |= std::islower(c) != 0;
        else
          ok = !std::islower(c), cased |= std::isupper(c) != 0;
        if (!ok) return Value(false);
      }
      return Value(name == "islower" || name == "isupper" ? cased : true);
    });
  if (name == "format")
    return make_method(name, [s](Args& a) {
      // '{}' and '{0}' placeholders with positional arguments.
      std::string out;
      size_t next = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '{' && i + 1 < s.size() && s[i + 1] == '{') {
          out.push_back('{');
          ++i;
        } else if (s[i] == '}' && i + 1 < s.size() && s[i + 1] == '}') {
          out.push_back('}');
          ++i;
        } else if (s[i] == '{') {
          const size_t e = s.find('}', i);
          if (e == std::string::npos) fail("format(): a '{' is not closed");
          const std::string field = s.substr(i + 1, e - i - 1);
          const Value* v = nullptr;
          if (field.empty()) {
            v = next < a.pos.size() ? &a.pos[next++] : nullptr;
          } else if (std::isdigit(static_cast<unsigned char>(field[0]))) {
            const size_t k = std::stoul(field);
            v = k < a.pos.size() ? &a.pos[k] : nullptr;
          } else {
            for (auto& [kk, vv] : a.kw)
              if (kk == field) v = &vv;
          }
          if (!v) fail("format(): no argument for {" + field + "}");
          out += to_str(*v);
          i = e;
        } else {
          out.push_back(s[i]);
        }
      }
      return Value(std::move(out));
    });
  return Value::undefined(name);
}

Value dict_method(const Value& d, const std::string& name) {
  if (name == "items")
    return make_method(name, [d](Args&) {
      List out;
      for (const auto& [k, v] : d.dict().items)
        out.push_back(Value::tuple(List{d.dict().key_value(k), v}));
      return Value(std::move(out));
    });
  if (name == "keys")
    return make_method(name, [d](Args&) {
      List out;
      for (const auto& kv : d.dict().items) out.push_back(d.dict().key_value(kv.first));
      return Value(std::move(out));
    });
  if (name == "values")
    return make_method(name, [d](Args&) {
      List out;
      for (const auto& kv : d.dict().items) out.push_back(kv.second);
      return Value(std::move(out));
    });
  if (name == "get")
    return make_method(name, [d](Args& a) {
      if (a.pos.empty()) fail("get() takes a key");
      const Value* v = a.pos[0].is_string() ? d.dict().find(a.pos[0].str()) : nullptr;
      if (v) return *v;
      return a.pos.size() > 1 ? a.pos[1] : Value(None{});
    });
  if (name == "update" || name == "pop" || name == "setdefault" || name == "clear" ||
      name == "popitem")
    return make_method(name, [name](Args&) -> Value {
      fail("dict." + name + "() is not allowed: the template's values are immutable");
    });
  return Value::undefined(name);
}

Value list_method(const Value& l, const std::string& name) {
  if (name == "index" || name == "count")
    return make_method(name, [l, name](Args& a) {
      if (a.pos.empty()) fail(name + "() takes an argument");
      int64_t n = 0, i = 0;
      for (const Value& x : l.list()) {
        if (equals(x, a.pos[0])) {
          if (name == "index") return Value(i);
          ++n;
        }
        ++i;
      }
      if (name == "index") fail("the value is not in the list");
      return Value(n);
    });
  if (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
      name == "remove" || name == "sort" || name == "reverse" || name == "clear")
    return make_method(name, [name](Args&) -> Value {
      fail("list." + name + "() is not allowed: the template's values are immutable");
    });
  return Value::undefined(name);
}

bool is_dict_method(const std::string& n) {
  for (const char* m : {"items", "keys", "values", "get", "update", "pop", "setdefault", "clear",
                        "popitem", "copy"})
    if (n == m) return true;
  return false;
}

}  // namespace

bool truthy(const Value& v) {
  switch (v.v.index()) {
    case 0:
    case 1:
      return false;
    case 2:
      return std::get<bool>(v.v);
    case 3:
      return std::get<int64_t>(v.v) != 0;
    case 4:
      return std::get<double>(v.v) != 0;
    case 5:
      return !v.str().empty();
    case 6:
      return !v.list().empty();
    case 7:
      return !v.dict().items.empty();
    default:
      return true;
  }
}

std::string to_str(const Value& v) {
  if (v.is_undefined()) return "";
  if (v.is_string()) return v.str();
  return py_repr(v);
}

std::string py_repr(const Value& v) {
  switch (v.v.index()) {
    case 0:
      return "";
    case 1:
      return "None";
    case 2:
      return std::get<bool>(v.v) ? "True" : "False";
    case 3:
      return std::to_string(std::get<int64_t>(v.v));
    case 4:
      return float_repr(std::get<double>(v.v));
    case 5:
      return string_repr(v.str());
    case 6: {
      std::string out = v.is_tuple ? "(" : "[";
      bool first = true;
      for (const Value& x : v.list()) {
        if (!first) out += ", ";
        out += py_repr(x);
        first = false;
      }
      if (v.is_tuple && v.list().size() == 1) out += ",";
      return out + (v.is_tuple ? ")" : "]");
    }
    case 7: {
      if (v.dict().is_namespace) return "<Namespace>";
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : v.dict().items) {
        if (!first) out += ", ";
        out += py_repr(v.dict().key_value(k)) + ": " + py_repr(x);
        first = false;
      }
      return out + "}";
    }
    default:
      return "<function " + v.callable().name + ">";
  }
}

std::string to_json(const Value& v, const JsonStyle& style) {
  std::string out;
  json_value(v, style, 0, &out);
  return out;
}

std::string type_name(const Value& v) {
  static const char* const kNames[] = {"Undefined", "NoneType", "bool", "int",     "float",
                                       "str",       "list",     "dict", "function"};
  if (v.is_dict() && v.dict().is_namespace) return "Namespace";
  return kNames[v.v.index()];
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.v.index() != b.v.index()) return false;
  switch (a.v.index()) {
    case 0:
    case 1:
      return true;
    case 5:
      return a.str() == b.str();
    case 6: {
      const List &x = a.list(), &y = b.list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equals(x[i], y[i])) return false;
      return true;
    }
    case 7: {
      const Dict &x = a.dict(), &y = b.dict();
      if (&x == &y) return true;
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* w = y.find(k);
        if (!w || !equals(v, *w)) return false;
      }
      return true;
    }
    default:
      return &a.callable() == &b.callable();
  }
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();
  if (a.is_list() && b.is_list()) {
    const List &x = a.list(), &y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (less(x[i], y[i])) return true;
      if (less(y[i], x[i])) return false;
    }
    return x.size() < y.size();
  }
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  fail("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

List iterate(const Value& v) {
  if (v.is_list()) return v.list();
  if (v.is_string()) return characters(v.str());
  if (v.is_dict()) {
    List keys;
    for (const auto& kv : v.dict().items) keys.push_back(v.dict().key_value(kv.first));
    return keys;
  }
  if (v.is_undefined()) return {};
  fail("'" + type_name(v) + "' object is not iterable");
}

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.is_dict()) {
    if (!obj.dict().is_namespace && is_dict_method(name)) return dict_method(obj, name);
    if (const Value* v = obj.dict().find(name)) return *v;
    return Value::undefined(name);
  }
  if (obj.is_string()) return string_method(obj.str(), name);
  if (obj.is_list()) return list_method(obj, name);
  return Value::undefined(name);
}

std::string dict_key(const Value& key) {
  if (key.is_string()) return key.str();
  if (key.is_float() && key.as_double() == std::floor(key.as_double()) &&
      std::fabs(key.as_double()) < 9e15)
    return "\x02" + std::to_string(static_cast<int64_t>(key.as_double()));
  if (key.is_int()) return "\x02" + std::to_string(key.as_int());  // True is 1, as in Python
  if (key.is_float() || key.is_none()) return "\x02" + py_repr(key);
  fail("unhashable type: '" + type_name(key) + "'");
}

void Dict::set_key(const Value& key, Value value) {
  const std::string k = dict_key(key);
  if (!key.is_string()) {
    bool known = false;
    for (const auto& ok : other_keys) known = known || ok.first == k;
    if (!known) other_keys.emplace_back(k, key);
  }
  set(k, std::move(value));
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.is_dict()) {
    if (key.is_list() || key.is_dict()) fail("unhashable type: '" + type_name(key) + "'");
    if (const Value* v =
            key.is_string() ? obj.dict().find(key.str()) : obj.dict().find(dict_key(key)))
      return *v;
    return Value::undefined(to_str(key));
  }
  if (obj.is_list() || obj.is_string()) {
    if (!key.is_int()) {
      if (key.is_string()) return get_attr(obj, key.str());
      fail("indices must be integers, not " + type_name(key));
    }
    const List chars = obj.is_string() ? characters(obj.str()) : List{};
    const List& items = obj.is_list() ? obj.list() : chars;
    int64_t i = key.as_int();
    const auto n = static_cast<int64_t>(items.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined("[" + std::to_string(key.as_int()) + "]");
    return items[static_cast<size_t>(i)];
  }
  return Value::undefined(py_repr(key));
}

// ---- filters ----

namespace {

Value attribute_path(const Value& item, const std::string& path) {
  Value v = item;
  size_t pos = 0;
  while (true) {
    const size_t dot = path.find('.', pos);
    const std::string part =
        path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    if (!part.empty() && part.size() < 18 && std::all_of(part.begin(), part.end(), ::isdigit))
      v = get_item(v, Value(static_cast<int64_t>(std::stoll(part))));
    else
      v = get_item(v, Value(part));
    if (dot == std::string::npos || v.is_undefined()) return v;
    pos = dot + 1;
  }
}

// select/reject/selectattr/rejectattr: the items whose test (default: truthiness) is `keep`.
Value select_items(Renderer& r, const Value& input, Args& a, bool by_attr, bool keep) {
  size_t k = 0;
  std::string attr;
  if (by_attr) {
    if (a.pos.empty() || !a.pos[0].is_string())
      fail("selectattr/rejectattr need an attribute name");
    attr = a.pos[0].str();
    k = 1;
  }
  std::string test;
  Args targs;
  if (a.pos.size() > k) {
    if (!a.pos[k].is_string()) fail("select: the test's name must be a string");
    test = a.pos[k].str();
    targs.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(k + 1), a.pos.end());
    if (!has_test(test)) fail("no test named '" + test + "'");
  }
  List out;
  for (const Value& item : iterate(input)) {
    const Value v = by_attr ? attribute_path(item, attr) : item;
    Args copy = targs;
    const bool pass = test.empty() ? truthy(v) : apply_test(r, test, v, copy);
    if (pass == keep) out.push_back(item);
  }
  return Value(std::move(out));
}

Value sort_items(const Value& input, Args& a) {
  List items = iterate(input);
  const Value* rev = arg(a, 0, "reverse");
  const Value* cs = arg(a, 1, "case_sensitive");
  const Value* at = arg(a, 2, "attribute");
  const bool reverse = rev && truthy(*rev);
  const bool case_sensitive = cs && truthy(*cs);
  auto key = [&](const Value& v) {
    Value k = at && at->is_string() ? attribute_path(v, at->str()) : v;
    if (!case_sensitive && k.is_string()) return Value(lower(k.str()));
    return k;
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return reverse ? less(key(y), key(x)) : less(key(x), key(y));
  });
  return Value(std::move(items));
}

std::string indent_text(const std::string& s, Args& a) {
  const Value* w = arg(a, 0, "width");
  const Value* first_v = arg(a, 1, "first");
  const Value* blank_v = arg(a, 2, "blank");
  const std::string pad =
      w && w->is_string()
          ? w->str()
          : std::string(static_cast<size_t>(w && w->is_int() ? w->as_int() : 4), ' ');
  const bool first = first_v && truthy(*first_v);
  const bool blank = blank_v && truthy(*blank_v);
  std::string out;
  size_t pos = 0;
  bool first_line = true;
  while (pos <= s.size()) {
    size_t e = s.find('\n', pos);
    const bool last = e == std::string::npos;
    const std::string line = s.substr(pos, last ? std::string::npos : e - pos);
    if ((first_line ? first : true) && (blank || !line.empty())) out += pad;
    out += line;
    if (last) break;
    out.push_back('\n');
    pos = e + 1;
    first_line = false;
  }
  return out;
}

}  // namespace

Value apply_filter(Renderer& r, const std::string& name, const Value& in, Args& a) {
  auto need_str = [&](const Value& v) -> std::string {
    if (v.is_undefined()) return "";
    return to_str(v);
  };
  if (name == "tojson") {
    // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
    JsonStyle st;
    const Value* ea = arg(a, 0, "ensure_ascii");
    const Value* ind = arg(a, 1, "indent");
    const Value* sep = arg(a, 2, "separators");
    const Value* sk = arg(a, 3, "sort_keys");
    st.ensure_ascii = ea && truthy(*ea);
    st.indent = ind && ind->is_int() ? static_cast<int>(ind->as_int()) : -1;
    if (st.indent >= 0) st.item_sep = ",";
    if (sep && sep->is_list()) {
      if (sep->list().size() != 2 || !sep->list()[0].is_string() || !sep->list()[1].is_string())
        fail("tojson: separators must be two strings");
      st.item_sep = sep->list()[0].str();
      st.key_sep = sep->list()[1].str();
    }
    st.sort_keys = sk && truthy(*sk);
    return Value(to_json(in, st));
  }
  if (name == "trim") return Value(strip_chars(need_str(in), arg(a, 0, "chars"), true, true));
  if (name == "length" || name == "count") {
    if (in.is_string()) return Value(static_cast<int64_t>(count_chars(in.str())));
    if (in.is_list() || in.is_dict() || in.is_undefined())
      return Value(static_cast<int64_t>(iterate(in).size()));
    fail("object of type '" + type_name(in) + "' has no len()");
  }
  if (name == "string") return Value(to_str(in));
  if (name == "lower") return Value(lower(need_str(in)));
  if (name == "upper") return Value(upper(need_str(in)));
  if (name == "capitalize") return Value(capitalize(need_str(in)));
  if (name == "title") return Value(jinja_title(need_str(in)));
  if (name == "safe" || name == "e" || name == "escape" || name == "forceescape") {
    if (name == "safe") return in;
    std::string s = need_str(in), out;
    for (char c : s) {
      switch (c) {
        case '&':
          out += "&amp;";
          break;
        case '<':
          out += "&lt;";
          break;
        case '>':
          out += "&gt;";
          break;
        case '"':
          out += "&#34;";
          break;
        case '\'':
          out += "&#39;";
          break;
        default:
          out.push_back(c);
      }
    }
    return Value(std::move(out));
  }
  if (name == "replace") {
    return Value(replace_all(need_str(in), to_str(a.pos.size() > 0 ? a.pos[0] : Value("")),
                             to_str(a.pos.size() > 1 ? a.pos[1] : Value("")),
                             int_arg(a, 2, "count", -1)));
  }
  if (name == "default" || name == "d") {
    const Value* b = arg(a, 1, "boolean");
    const bool boolean = b && truthy(*b);
    if (in.is_undefined() || (boolean && !truthy(in))) return a.pos.empty() ? Value("") : a.pos[0];
    return in;
  }
  if (name == "first" || name == "last") {
    List items = iterate(in);
    if (items.empty()) return Value::undefined(name);
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    const Value* sep = arg(a, 0, "d");
    const Value* attr = arg(a, 1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& x : iterate(in)) {
      if (!first) out += sep ? to_str(*sep) : "";
      out += to_str(attr && attr->is_string() ? attribute_path(x, attr->str()) : x);
      first = false;
    }
    return Value(std::move(out));
  }
  if (name == "list") return Value(iterate(in));
  if (name == "items") {
    if (in.is_undefined()) return Value(List{});
    if (!in.is_dict()) fail("items: expected a dict, got " + type_name(in));
    List out;
    for (const auto& [k, v] : in.dict().items)
      out.push_back(Value::tuple(List{in.dict().key_value(k), v}));
    return Value(std::move(out));
  }
  if (name == "dictsort") {
    if (!in.is_dict()) fail("dictsort: expected a dict, got " + type_name(in));
    List out;
    for (const auto& [k, v] : in.dict().items)
      out.push_back(Value::tuple(List{in.dict().key_value(k), v}));
    // dictsort(case_sensitive=False, by='key', reverse=False)
    const Value* cs = arg(a, 0, "case_sensitive");
    const Value* by = arg(a, 1, "by");
    const Value* rev = arg(a, 2, "reverse");
    const size_t part = by && by->is_string() && by->str() == "value" ? 1 : 0;
    const bool case_sensitive = cs && truthy(*cs), reverse = rev && truthy(*rev);
    auto key = [&](const Value& item) {
      const Value& k = item.list()[part];
      return !case_sensitive && k.is_string() ? Value(lower(k.str())) : k;
    };
    std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
      return reverse ? less(key(y), key(x)) : less(key(x), key(y));
    });
    return Value(std::move(out));
  }
  if (name == "map") {
    List out;
    const Value* attr = arg(a, 99, "attribute");
    const Value* dflt = arg(a, 99, "default");
    for (const Value& x : iterate(in)) {
      if (attr) {
        Value v = attribute_path(x, to_str(*attr));
        out.push_back(v.is_undefined() && dflt ? *dflt : v);
      } else {
        if (a.pos.empty() || !a.pos[0].is_string()) fail("map: give a filter name or attribute=");
        Args rest;
        rest.pos.assign(a.pos.begin() + 1, a.pos.end());
        out.push_back(apply_filter(r, a.pos[0].str(), x, rest));
      }
    }
    return Value(std::move(out));
  }
  if (name == "select") return select_items(r, in, a, false, true);
  if (name == "reject") return select_items(r, in, a, false, false);
  if (name == "selectattr") return select_items(r, in, a, true, true);
  if (name == "rejectattr") return select_items(r, in, a, true, false);
  if (name == "unique") {
    const Value* cs = arg(a, 0, "case_sensitive");
    const Value* at = arg(a, 1, "attribute");
    const bool case_sensitive = cs && truthy(*cs);
    auto key = [&](const Value& v) {
      Value k = at && at->is_string() ? attribute_path(v, at->str()) : v;
      return !case_sensitive && k.is_string() ? Value(lower(k.str())) : k;
    };
    List out, keys;
    for (const Value& x : iterate(in)) {
      const Value kx = key(x);
      bool seen = false;
      for (const Value& y : keys) seen = seen || equals(y, kx);
      if (!seen) {
        out.push_back(x);
        keys.push_back(kx);
      }
    }
    return Value(std::move(out));
  }
  if (name == "sort") return sort_items(in, a);
  if (name == "reverse") {
    if (in.is_string()) {
      List cs = characters(in.str());
      std::string out;
      for (size_t i = cs.size(); i-- > 0;) out += cs[i].str();
      return Value(std::move(out));
    }
    List items = iterate(in);
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "int") {
    if (in.is_int()) return Value(in.as_int());
    if (in.is_float()) return Value(float_to_int(in.as_double()));
    if (in.is_string()) {
      const std::string s = strip_chars(in.str(), nullptr, true, true);
      char* end = nullptr;
      const long long v = std::strtoll(s.c_str(), &end, 10);
      if (!s.empty() && end && *end == '\0') return Value(static_cast<int64_t>(v));
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end && *end == '\0') return Value(float_to_int(d));
    }
    return a.pos.empty() ? Value(int64_t{0}) : a.pos[0];
  }
  if (name == "float") {
    if (in.is_number()) return Value(in.as_double());
    if (in.is_string()) {
      const std::string s = strip_chars(in.str(), nullptr, true, true);
      char* end = nullptr;
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end && *end == '\0') return Value(d);
    }
    return a.pos.empty() ? Value(0.0) : a.pos[0];
  }
  if (name == "abs") {
    if (!in.is_number()) fail("bad operand type for abs(): '" + type_name(in) + "'");
    if (!in.is_float() && in.as_int() == INT64_MIN) fail("integer overflow in abs()");
    return in.is_float() ? Value(std::fabs(in.as_double()))
                         : Value(static_cast<int64_t>(std::llabs(in.as_int())));
  }
  if (name == "round") {
    const int64_t prec = int_arg(a, 0, "precision", 0);
    const Value* m = arg(a, 1, "method");
    const std::string method = m && m->is_string() ? m->str() : "common";
    if (!in.is_number()) fail("round: expected a number, got " + type_name(in));
    if (method == "common" && in.is_int() && prec >= 0) return Value(in.as_int());
    if (method == "common" && prec >= 0 && prec < 300) {
      // Python rounds the exact binary value to `prec` decimals, halves to even: as printf does.
      char buf[400];
      std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(prec), in.as_double());
      return Value(std::strtod(buf, nullptr));
    }
    const double scale = std::pow(10.0, static_cast<double>(prec));
    const double x = in.as_double() * scale;
    // Python's round() goes half to even; ceil and floor as named.
    const double y = method == "ceil"    ? std::ceil(x)
                     : method == "floor" ? std::floor(x)
                                         : std::nearbyint(x);
    return Value(y / scale);
  }
  if (name == "sum") {
    Value total(int64_t{0});
    const Value* attr = arg(a, 0, "attribute");
    for (const Value& x : iterate(in)) {
      const Value v = attr && attr->is_string() ? attribute_path(x, attr->str()) : x;
      if (!v.is_number()) fail("sum: cannot add '" + type_name(v) + "'");
      total = total.is_float() || v.is_float() ? Value(total.as_double() + v.as_double())
                                               : Value(total.as_int() + v.as_int());
    }
    return total;
  }
  if (name == "min" || name == "max") {
    List items = iterate(in);
    if (items.empty()) return Value::undefined(name);
    Value best = items[0];
    for (const Value& x : items)
      if (name == "min" ? less(x, best) : less(best, x)) best = x;
    return best;
  }
  if (name == "indent") return Value(indent_text(need_str(in), a));
  if (name == "wordcount")
    return Value(static_cast<int64_t>(split(need_str(in), nullptr, -1).size()));
  if (name == "center") {
    const int64_t width = int_arg(a, 0, "width", 80);
    std::string s = need_str(in);
    const auto len = static_cast<int64_t>(count_chars(s));
    if (len >= width) return Value(s);
    const int64_t total = width - len;
    const int64_t left = total / 2 + (total & width & 1);
    return Value(std::string(static_cast<size_t>(left), ' ') + s +
                 std::string(static_cast<size_t>(total - left), ' '));
  }
  if (name == "attr") {
    if (a.pos.empty() || !a.pos[0].is_string()) fail("attr: give an attribute name");
    return get_attr(in, a.pos[0].str());
  }
  if (name == "batch" || name == "slice") fail("the '" + name + "' filter is not supported");
  fail("no filter named '" + name + "'");
}

// ---- tests ----

bool has_test(const std::string& name) {
  static const char* const kTests[] = {
      "defined",     "undefined", "none",        "string",  "number",   "integer",  "float",
      "boolean",     "true",      "false",       "mapping", "iterable", "sequence", "callable",
      "odd",         "even",      "divisibleby", "eq",      "equalto",  "==",       "ne",
      "!=",          "lt",        "lessthan",    "<",       "le",       "<=",       "gt",
      "greaterthan", ">",         "ge",          ">=",      "in",       "lower",    "upper",
      "sameas",      "escaped",   "filter",      "test"};
  for (const char* t : kTests)
    if (name == t) return true;
  return false;
}

bool apply_test(Renderer&, const std::string& name, const Value& v, Args& a) {
  auto other = [&]() -> const Value& {
    if (a.pos.empty()) fail("the test '" + name + "' needs an argument");
    return a.pos[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int() && !v.is_bool();
  if (name == "float") return v.is_float();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && std::get<bool>(v.v);
  if (name == "false") return v.is_bool() && !std::get<bool>(v.v);
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string();
  if (name == "callable") return v.is_callable();
  if (name == "odd" || name == "even") {
    if (!v.is_int()) fail("the test '" + name + "' needs an integer, got " + type_name(v));
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    const Value& d = other();
    if (!v.is_int() || !d.is_int() || d.as_int() == 0) fail("divisibleby needs non-zero integers");
    return v.as_int() % d.as_int() == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, other());
  if (name == "ne" || name == "!=") return !equals(v, other());
  if (name == "lt" || name == "lessthan" || name == "<") return less(v, other());
  if (name == "le" || name == "<=") return !less(other(), v);
  if (name == "gt" || name == "greaterthan" || name == ">") return less(other(), v);
  if (name == "ge" || name == ">=") return !less(v, other());
  if (name == "in") {
    const Value& c = other();
    if (c.is_string()) return v.is_string() && c.str().find(v.str()) != std::string::npos;
    if (c.is_dict()) return !v.is_list() && !v.is_dict() && c.dict().find(dict_key(v));
    for (const Value& x : iterate(c))
      if (equals(x, v)) return true;
    return false;
  }
  if (name == "lower") return v.is_string() && lower(v.str()) == v.str();
  if (name == "upper") return v.is_string() && upper(v.str()) == v.str();
  if (name == "sameas") {
    const Value& o = other();
    if (v.v.index() != o.v.index()) return false;
    if (v.is_none() || v.is_undefined()) return true;
    if (v.is_bool()) return std::get<bool>(v.v) == std::get<bool>(o.v);
    if (v.is_list()) return std::get<6>(v.v) == std::get<6>(o.v);
    if (v.is_dict()) return std::get<7>(v.v) == std::get<7>(o.v);
    if (v.is_callable()) return std::get<8>(v.v) == std::get<8>(o.v);
    return equals(v, o);
  }
  if (name == "escaped") return false;
  if (name == "filter" || name == "test") return v.is_string();
  fail("no test named '" + name + "'");
}

}  // namespace troupe::model::detail
