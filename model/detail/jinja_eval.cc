// Rendering a parsed Jinja Program (model/detail/jinja.h): scopes as jinja2 has them (a loop's
// body gets a fresh scope each iteration, so `set` inside it does not leak; namespaces carry state
// out; a macro sees its arguments and the template's top level), expressions, and the global
// functions transformers gives chat templates. Pure; one Renderer per render.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <exception>

#include "model/detail/jinja.h"
#include "model/detail/unicode.h"

namespace troupe::model::detail {
namespace {

[[noreturn]] void fail(std::string message) { throw JinjaError{std::move(message), false}; }

// Python's floor division and modulo on integers.
int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t floor_mod(int64_t a, int64_t b) {
  int64_t m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

struct BreakSignal {};
struct ContinueSignal {};

class Render final : public Renderer {
 public:
  Render(const Dict& globals, int64_t now_unix, const RenderLimits& limits)
      : globals_(globals), now_(now_unix), limits_(limits) {
    frames_.emplace_back();
    add_builtins();
  }

  std::string run(const Body& body) {
    std::string out;
    exec(body, &out);
    return out;
  }

  Value call(const Value& fn, Args& args) override {
    if (!fn.is_callable()) {
      if (fn.is_undefined()) fail("'" + std::get<Undefined>(fn.v).name + "' is undefined");
      fail("'" + type_name(fn) + "' object is not callable");
    }
    return fn.callable().fn(*this, args);
  }

 private:
  struct Frame {
    std::vector<std::pair<std::string, Value>> vars;
    bool barrier = false;  // a macro's frame: the caller's locals are not visible past it
    Value* find(std::string_view name) {
      for (auto& [k, v] : vars)
        if (k == name) return &v;
      return nullptr;
    }
    void set(const std::string& name, Value v) {
      if (Value* x = find(name))
        *x = std::move(v);
      else
        vars.emplace_back(name, std::move(v));
    }
  };

  void step() {
    if (++steps_ > limits_.max_steps)
      fail("the template ran past " + std::to_string(limits_.max_steps) + " steps");
  }

  Value lookup(const std::string& name) {
    for (size_t i = frames_.size(); i-- > 0;) {
      if (Value* v = frames_[i].find(name)) return *v;
      if (frames_[i].barrier) {
        if (Value* v = frames_[0].find(name)) return *v;
        break;
      }
    }
    if (const Value* v = globals_.find(name)) return *v;
    for (const auto& [k, v] : builtins_)
      if (k == name) return v;
    return Value::undefined(name);
  }

  // ---- statements ----

  void emit(std::string* out, std::string_view s) {
    if (out->size() + s.size() > limits_.max_output_bytes)
      fail("the template's output passed " + std::to_string(limits_.max_output_bytes) + " bytes");
    out->append(s);
  }

  void exec(const Body& body, std::string* out) {
    for (const auto& n : body) exec(*n, out);
  }

  void exec(const Node& n, std::string* out) {
    step();
    line_ = n.line;
    switch (n.kind) {
      case Node::kText:
        emit(out, n.text);
        return;
      case Node::kOutput:
        emit(out, to_str(eval(*n.expr)));
        return;
      case Node::kIf:
        for (size_t i = 0; i < n.conds.size(); ++i)
          if (truthy(eval(*n.conds[i]))) return exec(n.bodies[i], out);
        if (n.bodies.size() > n.conds.size()) exec(n.bodies.back(), out);
        return;
      case Node::kFor:
        return exec_for(n, out);
      case Node::kSet:
        return exec_set(n, eval(*n.expr));
      case Node::kSetBlock: {
        std::string text;
        exec(n.bodies[0], &text);
        frames_.back().set(n.targets[0], Value(std::move(text)));
        return;
      }
      case Node::kMacro:
        frames_.back().set(n.text, make_macro(n));
        return;
      case Node::kBreak:
        throw BreakSignal{};
      case Node::kContinue:
        throw ContinueSignal{};
      case Node::kFilterBlock: {
        std::string text;
        exec(n.bodies[0], &text);
        frames_.emplace_back();
        frames_.back().set("\x01", Value(std::move(text)));
        Value v = eval(*n.expr);
        frames_.pop_back();
        emit(out, to_str(v));
        return;
      }
      case Node::kGeneration:
        exec(n.bodies[0], out);
        return;
    }
  }

  void exec_set(const Node& n, Value v) {
    if (!n.attr.empty()) {
      Value ns = lookup(n.targets[0]);
      if (!ns.is_dict() || !ns.dict().is_namespace)
        fail("cannot set attribute '" + n.attr + "' of '" + n.targets[0] +
             "': it is not a namespace");
      ns.dict().set(n.attr, std::move(v));
      return;
    }
    bind_targets(n, v, "names");
  }

  Value make_loop(const List& items, size_t i) {
    auto loop = std::make_shared<Dict>();
    const auto len = static_cast<int64_t>(items.size());
    const auto idx = static_cast<int64_t>(i);
    loop->items = {{"index0", Value(idx)},
                   {"index", Value(idx + 1)},
                   {"revindex0", Value(len - idx - 1)},
                   {"revindex", Value(len - idx)},
                   {"first", Value(i == 0)},
                   {"last", Value(idx == len - 1)},
                   {"length", Value(len)},
                   {"depth", Value(1)},
                   {"depth0", Value(0)}};
    if (i > 0) loop->items.emplace_back("previtem", items[i - 1]);
    if (idx + 1 < len) loop->items.emplace_back("nextitem", items[i + 1]);
    auto cycle = std::make_shared<Callable>();
    cycle->name = "loop.cycle";
    cycle->fn = [i](Renderer&, Args& a) -> Value {
      if (a.pos.empty()) fail("loop.cycle() needs at least one value");
      return a.pos[i % a.pos.size()];
    };
    loop->items.emplace_back("cycle", Value(std::shared_ptr<const Callable>(std::move(cycle))));
    return Value(std::move(loop));
  }

  // Sets n's targets in the innermost scope: one takes `item`, several unpack it (`what` names
  // them in the error: "names", "loop variables").
  void bind_targets(const Node& n, const Value& item, const char* what) {
    if (n.targets.size() == 1) {
      frames_.back().set(n.targets[0], item);
      return;
    }
    List parts = iterate(item);
    if (parts.size() != n.targets.size())
      fail("cannot unpack " + std::to_string(parts.size()) + " values into " +
           std::to_string(n.targets.size()) + " " + what);
    for (size_t k = 0; k < parts.size(); ++k) frames_.back().set(n.targets[k], parts[k]);
  }

  void exec_for(const Node& n, std::string* out) {
    const Value seq = eval(*n.expr);
    if (!seq.is_undefined() && !seq.is_list() && !seq.is_dict() && !seq.is_string())
      fail("'" + type_name(seq) + "' object is not iterable");
    // A list is iterated in place (it never changes); strings and dicts give their items.
    std::shared_ptr<const List> shared =
        seq.is_list() ? std::get<6>(seq.v) : std::make_shared<const List>(iterate(seq));
    const List* all = shared.get();
    List kept;
    if (n.cond) {  // `for x in xs if c`: the loop sees only the items that pass
      for (const Value& item : *all) {
        frames_.emplace_back();
        bind_targets(n, item, "loop variables");
        const bool keep = truthy(eval(*n.cond));
        frames_.pop_back();
        if (keep) kept.push_back(item);
      }
      all = &kept;
    }
    const List& items = *all;
    if (items.empty()) {
      if (n.bodies.size() > 1) exec(n.bodies[1], out);
      return;
    }
    for (size_t i = 0; i < items.size(); ++i) {
      frames_.emplace_back();
      struct Pop {
        std::vector<Frame>* f;
        ~Pop() { f->pop_back(); }
      } pop{&frames_};
      frames_.back().set("loop", make_loop(items, i));
      bind_targets(n, items[i], "loop variables");
      try {
        exec(n.bodies[0], out);
      } catch (const BreakSignal&) {
        break;
      } catch (const ContinueSignal&) {
        continue;
      }
    }
  }

  Value make_macro(const Node& n) {
    auto c = std::make_shared<Callable>();
    c->name = n.text;
    const Node* def = &n;
    c->fn = [def](Renderer& r, Args& a) -> Value {
      return static_cast<Render&>(r).call_macro(*def, a);
    };
    return Value(std::shared_ptr<const Callable>(std::move(c)));
  }

  Value call_macro(const Node& def, Args& a) {
    if (a.pos.size() > def.params.size())
      fail("macro '" + def.text + "' takes " + std::to_string(def.params.size()) +
           " arguments, got " + std::to_string(a.pos.size()));
    if (frames_.size() > 100) fail("macros call each other too deeply");
    Frame f;
    f.barrier = true;
    std::vector<Value> values(def.params.size());
    std::vector<bool> given(def.params.size(), false);
    for (size_t i = 0; i < a.pos.size(); ++i) {
      values[i] = a.pos[i];
      given[i] = true;
    }
    for (auto& [k, v] : a.kw) {
      size_t i = 0;
      while (i < def.params.size() && def.params[i].name != k) ++i;
      if (i == def.params.size()) fail("macro '" + def.text + "' has no argument '" + k + "'");
      values[i] = v;
      given[i] = true;
    }
    frames_.push_back(std::move(f));
    struct Pop {
      std::vector<Frame>* f;
      ~Pop() { f->pop_back(); }
    } pop{&frames_};
    for (size_t i = 0; i < def.params.size(); ++i) {
      if (!given[i])
        values[i] = def.params[i].default_value ? eval(*def.params[i].default_value)
                                                : Value::undefined(def.params[i].name);
      frames_.back().set(def.params[i].name, values[i]);
    }
    std::string text;
    exec(def.bodies[0], &text);
    return Value(std::move(text));
  }

  // ---- expressions ----

  Args eval_args(const Expr& e, size_t first) {
    Args a;
    for (size_t i = first; i < e.args.size(); ++i) a.pos.push_back(eval(*e.args[i]));
    for (const auto& [k, v] : e.kwargs) a.kw.emplace_back(k, eval(*v));
    return a;
  }

  Value eval(const Expr& e) {
    step();
    switch (e.kind) {
      case Expr::kLiteral:
        return e.value;
      case Expr::kName:
        return lookup(e.name);
      case Expr::kList:
      case Expr::kTuple: {
        List l;
        for (const auto& x : e.args) l.push_back(eval(*x));
        return e.kind == Expr::kTuple ? Value::tuple(std::move(l)) : Value(std::move(l));
      }
      case Expr::kDict: {
        auto d = std::make_shared<Dict>();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k = eval(*e.args[i]);
          d->set_key(k, eval(*e.args[i + 1]));
        }
        return Value(std::move(d));
      }
      case Expr::kAttr:
        return get_attr(eval(*e.args[0]), e.name);
      case Expr::kItem:
        return get_item(eval(*e.args[0]), eval(*e.args[1]));
      case Expr::kSlice:
        return eval_slice(e);
      case Expr::kCall: {
        Value fn = eval(*e.args[0]);
        Args a = eval_args(e, 1);
        return call(fn, a);
      }
      case Expr::kFilter: {
        Value input = eval(*e.args[0]);
        Args a = eval_args(e, 1);
        return apply_filter(*this, e.name, input, a);
      }
      case Expr::kTest: {
        if (!has_test(e.name)) fail("no test named '" + e.name + "'");
        Value input = eval(*e.args[0]);
        Args a = eval_args(e, 1);
        return Value(apply_test(*this, e.name, input, a) != e.negated);
      }
      case Expr::kNeg:
      case Expr::kPos: {
        Value v = eval(*e.args[0]);
        if (!v.is_number())
          fail("bad operand type for unary " + std::string(e.kind == Expr::kNeg ? "-" : "+") +
               ": '" + type_name(v) + "'");
        if (e.kind == Expr::kPos) return v.is_bool() ? Value(v.as_int()) : v;
        if (!v.is_float() && v.as_int() == INT64_MIN) fail("integer overflow in unary -");
        return v.is_float() ? Value(-v.as_double()) : Value(-v.as_int());
      }
      case Expr::kNot:
        return Value(!truthy(eval(*e.args[0])));
      case Expr::kAnd: {
        Value l = eval(*e.args[0]);
        return truthy(l) ? eval(*e.args[1]) : l;
      }
      case Expr::kOr: {
        Value l = eval(*e.args[0]);
        return truthy(l) ? l : eval(*e.args[1]);
      }
      case Expr::kBinary:
        return binary(e.name, eval(*e.args[0]), eval(*e.args[1]));
      case Expr::kCompare:
        return eval_compare(e);
      case Expr::kCond:
        if (truthy(eval(*e.args[0]))) return eval(*e.args[1]);
        return e.args[2] ? eval(*e.args[2]) : Value::undefined("(else)");
    }
    return Value();
  }

  Value eval_compare(const Expr& e) {
    Value left = eval(*e.args[0]);
    for (size_t i = 0; i < e.ops.size(); ++i) {
      Value right = eval(*e.args[i + 1]);
      const std::string& op = e.ops[i];
      bool r;
      if (op == "==")
        r = equals(left, right);
      else if (op == "!=")
        r = !equals(left, right);
      else if (op == "<")
        r = less(left, right);
      else if (op == ">")
        r = less(right, left);
      else if (op == "<=")
        r = !less(right, left);
      else if (op == ">=")
        r = !less(left, right);
      else
        r = contains(right, left) == (op == "in");
      if (!r) return Value(false);
      left = std::move(right);
    }
    return Value(true);
  }

  static bool contains(const Value& container, const Value& item) {
    if (container.is_string()) {
      if (!item.is_string())
        fail("'in <string>' requires a string as the left operand, not " + type_name(item));
      return container.str().find(item.str()) != std::string::npos;
    }
    if (container.is_dict()) {
      if (item.is_list() || item.is_dict()) fail("unhashable type: '" + type_name(item) + "'");
      return container.dict().find(dict_key(item)) != nullptr;
    }
    if (container.is_list()) {
      for (const Value& x : container.list())
        if (equals(x, item)) return true;
      return false;
    }
    if (container.is_undefined()) return false;
    fail("argument of type '" + type_name(container) + "' is not iterable");
  }

  static Value repeat(const Value& seq, int64_t n) {
    if (seq.is_string()) {
      std::string s;
      for (int64_t i = 0; i < n; ++i) {
        if (s.size() > (size_t{1} << 26)) fail("a string repeated past 64 MiB");
        s += seq.str();
      }
      return Value(std::move(s));
    }
    List l;
    for (int64_t i = 0; i < n; ++i) {
      if (l.size() > 1'000'000) fail("a list repeated past a million items");
      l.insert(l.end(), seq.list().begin(), seq.list().end());
    }
    return Value(std::move(l));
  }

  static Value binary(const std::string& op, const Value& a, const Value& b) {
    if (op == "~") return Value(to_str(a) + to_str(b));
    if (a.is_undefined() || b.is_undefined())
      fail("'" + std::get<Undefined>((a.is_undefined() ? a : b).v).name + "' is undefined");
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Value(a.str() + b.str());
      if (a.is_list() && b.is_list()) {
        List l = a.list();
        l.insert(l.end(), b.list().begin(), b.list().end());
        return Value(std::move(l));
      }
    }
    if (op == "*") {
      if ((a.is_string() || a.is_list()) && b.is_int()) return repeat(a, b.as_int());
      if (a.is_int() && (b.is_string() || b.is_list())) return repeat(b, a.as_int());
    }
    if (op == "%" && a.is_string()) return Value(percent_format(a.str(), b));
    if (!a.is_number() || !b.is_number())
      fail("unsupported operand types for " + op + ": '" + type_name(a) + "' and '" + type_name(b) +
           "'");
    const bool ints = a.is_int() && b.is_int();
    if (op == "/") {
      if (b.as_double() == 0) fail("division by zero");
      return Value(a.as_double() / b.as_double());
    }
    if (ints) {
      // Python's integers do not overflow; ours are 64-bit and say so where they would.
      const int64_t x = a.as_int(), y = b.as_int();
      int64_t r = 0;
      bool over = false;
      if (op == "+")
        over = __builtin_add_overflow(x, y, &r);
      else if (op == "-")
        over = __builtin_sub_overflow(x, y, &r);
      else if (op == "*")
        over = __builtin_mul_overflow(x, y, &r);
      else if ((op == "//" || op == "%") && y == 0)
        fail("integer division or modulo by zero");
      else if (op == "//" || op == "%") {
        if (x == INT64_MIN && y == -1)
          over = op == "//";
        else
          r = op == "//" ? floor_div(x, y) : floor_mod(x, y);
      } else if (op == "**") {
        if (y < 0) return Value(std::pow(static_cast<double>(x), static_cast<double>(y)));
        r = 1;
        for (int64_t i = 0; i < y && !over; ++i) {
          over = __builtin_mul_overflow(r, x, &r);
          if (r == 0 || r == 1) break;  // 0 and 1 stay; -1 alternates (below)
        }
        if (!over && x == -1) r = (y % 2 == 0) ? 1 : -1;
      }
      if (over) fail("integer overflow in " + op + " (integers are 64-bit here)");
      return Value(r);
    }
    const double x = a.as_double(), y = b.as_double();
    if (op == "+") return Value(x + y);
    if (op == "-") return Value(x - y);
    if (op == "*") return Value(x * y);
    if (op == "**") return Value(std::pow(x, y));
    if (y == 0) fail("float division by zero");
    if (op == "//") return Value(std::floor(x / y));
    return Value(x - std::floor(x / y) * y);  // %
  }

  // 'text %s' % value (or a tuple of values): %s, %d, %i, %r and %%.
  static std::string percent_format(const std::string& fmt, const Value& arg) {
    List args = arg.is_list() ? arg.list() : List{arg};
    std::string out;
    size_t k = 0;
    for (size_t i = 0; i < fmt.size(); ++i) {
      if (fmt[i] != '%' || i + 1 >= fmt.size()) {
        out.push_back(fmt[i]);
        continue;
      }
      const char c = fmt[++i];
      if (c == '%') {
        out.push_back('%');
        continue;
      }
      if (k >= args.size()) fail("not enough arguments for format string");
      const Value& v = args[k++];
      if (c == 's')
        out += to_str(v);
      else if (c == 'r')
        out += py_repr(v);
      else if ((c == 'd' || c == 'i') && v.is_int())
        out += std::to_string(v.as_int());
      else if ((c == 'd' || c == 'i') && v.is_float() && std::fabs(v.as_double()) < 9.2e18)
        out += std::to_string(static_cast<int64_t>(v.as_double()));
      else
        fail(std::string("unsupported format character '") + c + "'");
    }
    if (k != args.size()) fail("not all arguments converted during string formatting");
    return out;
  }

  static int64_t slice_index(const Value& v, int64_t len, int64_t dflt) {
    if (v.is_undefined() || v.is_none()) return dflt;
    if (!v.is_int()) fail("slice indices must be integers or None");
    int64_t i = v.as_int();
    return i < 0 ? i + len : i;
  }

  Value eval_slice(const Expr& e) {
    Value seq = eval(*e.args[0]);
    auto part = [&](int k) { return e.args[k] ? eval(*e.args[k]) : Value(None{}); };
    const Value start_v = part(1), stop_v = part(2), step_v = part(3);
    if (seq.is_undefined()) fail("'" + std::get<Undefined>(seq.v).name + "' is undefined");
    if (!seq.is_list() && !seq.is_string())
      fail("'" + type_name(seq) + "' object is not subscriptable");
    // Strings slice by characters (code points), as Python's str does: their byte offsets.
    std::vector<size_t> offsets;
    if (seq.is_string()) {
      const std::string& str = seq.str();
      for (size_t i = 0; i < str.size();) {
        offsets.push_back(i);
        i += utf8_len_from_lead(static_cast<uint8_t>(str[i]));
      }
      offsets.push_back(str.size());
    }
    const auto len = static_cast<int64_t>(seq.is_list() ? seq.list().size() : offsets.size() - 1);
    int64_t step = step_v.is_none() ? 1 : (step_v.is_int() ? step_v.as_int() : 0);
    if (step == 0) fail("slice step cannot be zero");
    std::vector<int64_t> picked;
    if (step > 0) {
      const int64_t lo = std::clamp<int64_t>(slice_index(start_v, len, 0), 0, len);
      const int64_t hi = std::clamp<int64_t>(slice_index(stop_v, len, len), 0, len);
      for (int64_t i = lo; i < hi; i += step) picked.push_back(i);
    } else {
      const int64_t lo = std::clamp<int64_t>(slice_index(start_v, len, len - 1), -1, len - 1);
      const int64_t hi =
          stop_v.is_none() ? -1 : std::clamp<int64_t>(slice_index(stop_v, len, -1), -1, len - 1);
      for (int64_t i = lo; i > hi; i += step) picked.push_back(i);
    }
    if (seq.is_list()) {
      List out;
      out.reserve(picked.size());
      for (int64_t i : picked) out.push_back(seq.list()[static_cast<size_t>(i)]);
      return Value(std::move(out));
    }
    const std::string& str = seq.str();
    std::string out;
    if (step == 1 && !picked.empty())
      return Value(str.substr(offsets[static_cast<size_t>(picked.front())],
                              offsets[static_cast<size_t>(picked.back()) + 1] -
                                  offsets[static_cast<size_t>(picked.front())]));
    for (int64_t i : picked) {
      const auto k = static_cast<size_t>(i);
      out.append(str, offsets[k], offsets[k + 1] - offsets[k]);
    }
    return Value(std::move(out));
  }

  // ---- globals ----

  void add_function(const std::string& name, std::function<Value(Renderer&, Args&)> fn) {
    auto c = std::make_shared<Callable>();
    c->name = name;
    c->fn = std::move(fn);
    builtins_.emplace_back(name, Value(std::shared_ptr<const Callable>(std::move(c))));
  }

  void add_builtins() {
    add_function("range", [](Renderer&, Args& a) -> Value {
      if (a.pos.empty() || a.pos.size() > 3) fail("range() takes 1 to 3 arguments");
      for (const Value& v : a.pos)
        if (!v.is_int()) fail("range() takes integers, got " + type_name(v));
      int64_t start = 0, stop, step = 1;
      if (a.pos.size() == 1) {
        stop = a.pos[0].as_int();
      } else {
        start = a.pos[0].as_int();
        stop = a.pos[1].as_int();
        if (a.pos.size() == 3) step = a.pos[2].as_int();
      }
      if (step == 0) fail("range() arg 3 must not be zero");
      List l;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (l.size() >= 1'000'000) fail("range() of more than a million items");
        l.push_back(Value(i));
      }
      return Value(std::move(l));
    });
    // namespace(...) and dict(...): from dicts and keyword arguments.
    for (const bool ns : {true, false})
      add_function(ns ? "namespace" : "dict", [ns](Renderer&, Args& a) -> Value {
        auto d = std::make_shared<Dict>();
        d->is_namespace = ns;
        for (const Value& p : a.pos) {
          if (!p.is_dict())
            fail(std::string(ns ? "namespace" : "dict") + "() takes a dict or keyword arguments");
          for (const auto& [k, v] : p.dict().items) d->set_key(p.dict().key_value(k), v);
        }
        for (auto& [k, v] : a.kw) d->set(k, v);
        return Value(std::move(d));
      });
    add_function("raise_exception", [](Renderer&, Args& a) -> Value {
      throw JinjaError{a.pos.empty() ? std::string() : to_str(a.pos[0]), true};
    });
    const int64_t now = now_;
    add_function("strftime_now", [now](Renderer&, Args& a) -> Value {
      if (a.pos.size() != 1 || !a.pos[0].is_string()) fail("strftime_now() takes a format string");
      const std::time_t t = static_cast<std::time_t>(now);
      std::tm tm{};
      gmtime_r(&t, &tm);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof buf, a.pos[0].str().c_str(), &tm);
      return Value(std::string(buf, n));
    });
  }

  const Dict& globals_;
  int64_t now_;
  RenderLimits limits_;
  std::vector<Frame> frames_;
  std::vector<std::pair<std::string, Value>> builtins_;
  int64_t steps_ = 0;

 public:
  int line_ = 0;
};

}  // namespace

Result<std::string> render_jinja(const Program& program, const Dict& globals, int64_t now_unix,
                                 const RenderLimits& limits) {
  Render r(globals, now_unix, limits);
  try {
    return r.run(program.body);
  } catch (const JinjaError& e) {
    if (e.raised) return make_error(1, e.message);
    return make_error(0, "line " + std::to_string(r.line_) + ": " + e.message);
  } catch (const std::exception& e) {  // a bug of ours: an error, never a crash of the server
    return make_error(0, "line " + std::to_string(r.line_) + ": internal error: " + e.what());
  } catch (const BreakSignal&) {
    return make_error(0, "'break' outside a loop");
  } catch (const ContinueSignal&) {
    return make_error(0, "'continue' outside a loop");
  }
}

}  // namespace troupe::model::detail
