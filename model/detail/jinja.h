// The Jinja interpreter behind model/chat_template.h: values, the parsed template (nodes and
// expressions), the parser and the renderer. It follows Python jinja2 as Hugging Face transformers
// configures it for chat templates (trim_blocks, lstrip_blocks, loop controls, an immutable
// sandbox, Python's repr and json.dumps for printed values). Pure; a parsed Program is immutable
// and may be rendered from any number of threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "base/result.h"

namespace troupe::model::detail {

struct Value;
struct Dict;
struct Callable;
using List = std::vector<Value>;

struct Undefined {
  std::string name;  // what was looked up, for the error when it is used
};
struct None {};

/// A Jinja value. Lists and dicts are shared and never changed once built (the immutable
/// sandbox), except a namespace's attributes.
struct Value {
  // Strings are shared, not copied, as values move through scopes and lists.
  std::variant<Undefined, None, bool, int64_t, double, std::shared_ptr<const std::string>,
               std::shared_ptr<const List>, std::shared_ptr<Dict>, std::shared_ptr<const Callable>>
      v;
  bool is_tuple = false;

  Value() = default;
  Value(None n) : v(n) {}                                                         // NOLINT
  Value(bool b) : v(b) {}                                                         // NOLINT
  Value(int64_t i) : v(i) {}                                                      // NOLINT
  Value(int i) : v(static_cast<int64_t>(i)) {}                                    // NOLINT
  Value(double d) : v(d) {}                                                       // NOLINT
  Value(std::string s) : v(std::make_shared<const std::string>(std::move(s))) {}  // NOLINT
  Value(const char* s) : Value(std::string(s)) {}                                 // NOLINT
  Value(List l) : v(std::make_shared<const List>(std::move(l))) {}                // NOLINT
  Value(std::shared_ptr<Dict> d) : v(std::move(d)) {}                             // NOLINT
  Value(std::shared_ptr<const Callable> c) : v(std::move(c)) {}                   // NOLINT
  /// A tuple: a list that prints as (a, b).
  static Value tuple(List l) {
    Value x(std::move(l));
    x.is_tuple = true;
    return x;
  }
  static Value undefined(std::string name) {
    Value x;
    x.v = Undefined{std::move(name)};
    return x;
  }

  bool is_undefined() const { return v.index() == 0; }
  bool is_none() const { return v.index() == 1; }
  bool is_bool() const { return v.index() == 2; }
  bool is_int() const { return v.index() == 3 || v.index() == 2; }  // Python: bool is an int
  bool is_float() const { return v.index() == 4; }
  bool is_number() const { return is_int() || is_float(); }
  bool is_string() const { return v.index() == 5; }
  bool is_list() const { return v.index() == 6; }
  bool is_dict() const { return v.index() == 7; }
  bool is_callable() const { return v.index() == 8; }

  const std::string& str() const { return *std::get<5>(v); }
  const List& list() const { return *std::get<6>(v); }
  Dict& dict() const { return *std::get<7>(v); }
  const Callable& callable() const { return *std::get<8>(v); }
  int64_t as_int() const { return v.index() == 2 ? (std::get<2>(v) ? 1 : 0) : std::get<3>(v); }
  double as_double() const { return is_float() ? std::get<4>(v) : static_cast<double>(as_int()); }
};

/// A dict keeps its keys in insertion order (Python's). String keys are kept as they are; other
/// keys (numbers, booleans, None) under an encoded form ("\x02" + the number), the originals in
/// `other_keys`.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  std::vector<std::pair<std::string, Value>> other_keys;
  bool is_namespace = false;  // namespace(): its attributes may be set
  const Value* find(std::string_view key) const {
    for (const auto& [k, v] : items)
      if (k == key) return &v;
    return nullptr;
  }
  void set(const std::string& key, Value value) {
    for (auto& [k, v] : items)
      if (k == key) {
        v = std::move(value);
        return;
      }
    items.emplace_back(key, std::move(value));
  }
  /// The key as the template sees it.
  Value key_value(const std::string& key) const {
    if (key.empty() || key[0] != '\x02') return Value(key);
    for (const auto& [k, v] : other_keys)
      if (k == key) return v;
    return Value(key);
  }
  /// Sets a value under any hashable key (throws JinjaError for a list or dict).
  void set_key(const Value& key, Value value);
};

/// The form a key is stored under in a Dict (throws JinjaError for an unhashable key).
std::string dict_key(const Value& key);

class Renderer;

/// Arguments of a call: positional, then keyword.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

/// A function: a built-in (range, namespace, a bound string method, ...) or a macro.
struct Callable {
  std::string name;
  std::function<Value(Renderer&, Args&)> fn;
};

/// Raised inside the renderer; render() turns it into an Error. `raised` marks
/// raise_exception's, whose message is the template's own.
struct JinjaError {
  std::string message;
  bool raised = false;
};

// ---- Parsed templates ----

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum Kind {
    kLiteral,  // value
    kName,     // name
    kList,     // args
    kTuple,    // args (a tuple is a list here)
    kDict,     // args: key, value, key, value, ...
    kAttr,     // args[0] . name
    kItem,     // args[0] [ args[1] ]
    kSlice,    // args[0] [ args[1] : args[2] : args[3] ] (null: absent)
    kCall,     // args[0] ( args[1..], kwargs )
    kFilter,   // args[0] | name ( args[1..], kwargs )
    kTest,     // args[0] is [not] name ( args[1..] )
    kNeg,      // - args[0]
    kPos,      // + args[0]
    kNot,      // not args[0]
    kBinary,   // args[0] name args[1]: + - * / // % ** ~
    kAnd,
    kOr,
    kCompare,  // args[0] ops[0] args[1] ops[1] args[2] ...
    kCond,     // args[1] if args[0] else args[2] (args[2] null: undefined)
  };
  Kind kind = kLiteral;
  int line = 0;
  Value value;
  std::string name;
  bool negated = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: required (undefined when not given)
};

struct Node {
  enum Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // conds[i] -> bodies[i]; bodies.back() is else when bodies > conds
    kFor,       // for targets in expr [if cond]: bodies[0]; else bodies[1]
    kSet,       // targets = expr (target "ns.attr" sets a namespace attribute)
    kSetBlock,  // {% set target %}bodies[0]{% endset %}
    kMacro,     // name(params): bodies[0]
    kBreak,
    kContinue,
    kFilterBlock,  // {% filter expr %}: expr is a kFilter over a placeholder, bodies[0]
    kGeneration,   // {% generation %}: bodies[0], rendered as is
  };
  Kind kind = kText;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  std::vector<std::string> targets;
  std::string attr;  // kSet on a namespace: targets[0].attr
  std::vector<MacroParam> params;
};

struct Program {
  Body body;
};

/// Parses a template's source. Errors name the line: "line 3: unexpected 'endfor'".
Result<std::shared_ptr<const Program>> parse_jinja(std::string_view source);

/// Bounds on one rendering, against templates that loop without end.
struct RenderLimits {
  size_t max_output_bytes = size_t{64} << 20;
  int64_t max_steps = 50'000'000;  // nodes and expressions evaluated
};

/// Renders `program` with `globals` (messages, add_generation_prompt, special tokens, tools, ...)
/// and the built-in functions. `now_unix`: strftime_now's time (seconds since the epoch, UTC).
Result<std::string> render_jinja(const Program& program, const Dict& globals, int64_t now_unix,
                                 const RenderLimits& limits);

// ---- Built-ins (jinja_builtins.cc), used by the renderer ----

/// Python truthiness.
bool truthy(const Value& v);
/// str(v) as Jinja prints it: Python's str, "" for undefined.
std::string to_str(const Value& v);
/// Python's repr(v).
std::string py_repr(const Value& v);
/// json.dumps's options.
struct JsonStyle {
  int indent = -1;  // <0: one line
  bool sort_keys = false;
  bool ensure_ascii = false;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
};
/// json.dumps(v, ...) as Python writes it.
std::string to_json(const Value& v, const JsonStyle& style);
/// Python ==.
bool equals(const Value& a, const Value& b);
/// Python <, for numbers, strings and lists; throws JinjaError for others.
bool less(const Value& a, const Value& b);
/// a[key] / a.key as Jinja looks them up (undefined when absent).
Value get_item(const Value& obj, const Value& key);
Value get_attr(const Value& obj, const std::string& name);
/// Items to iterate: a list's, a string's characters, a dict's keys; undefined: none.
List iterate(const Value& v);
/// The name's type, for errors: "int", "str", "list", ...
std::string type_name(const Value& v);
/// A filter or test by name; throws JinjaError for an unknown name.
Value apply_filter(Renderer& r, const std::string& name, const Value& input, Args& args);
bool apply_test(Renderer& r, const std::string& name, const Value& input, Args& args);
bool has_test(const std::string& name);

/// The renderer's services that built-ins need (calling a function or macro).
class Renderer {
 public:
  virtual ~Renderer() = default;
  virtual Value call(const Value& fn, Args& args) = 0;
};

}  // namespace troupe::model::detail
