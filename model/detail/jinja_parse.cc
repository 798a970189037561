// Jinja source -> Program (model/detail/jinja.h): the lexer, with the whitespace rules of
// transformers' environment (trim_blocks, lstrip_blocks, '-' and '+' markers), and a
// recursive-descent parser with jinja2's operator precedence. Pure.
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "model/detail/jinja.h"
#include "model/detail/unicode.h"

namespace troupe::model::detail {
namespace {

constexpr int kMaxDepth = 200;  // nesting of expressions and blocks, against stack exhaustion

struct SyntaxError {
  int line;
  std::string message;
};

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

struct Token {
  enum Type { kName, kInt, kFloat, kString, kOp, kEnd } type = kEnd;
  std::string text;  // a string's decoded value; a name; an operator
  int64_t i = 0;
  double f = 0;
  int line = 0;
};

// One piece of the template: literal text, {{ ... }} or {% ... %}, with its tokens.
struct Item {
  enum Kind { kText, kOutput, kTag } kind = kText;
  std::string text;
  std::vector<Token> tokens;  // ends with kEnd
  int line = 0;
};

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  explicit Lexer(std::string_view src) : s_(src) {}

  std::vector<Item> run() {
    std::vector<Item> items;
    size_t pos = 0;
    while (pos < s_.size()) {
      const size_t at = next_tag(pos);
      std::string text(s_.substr(pos, (at == std::string_view::npos ? s_.size() : at) - pos));
      if (at == std::string_view::npos) {
        push_text(&items, std::move(text), pos);
        break;
      }
      const char kind = s_[at + 1];
      const char marker = at + 2 < s_.size() ? s_[at + 2] : '\0';
      if (marker == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (kind != '{' && marker != '+') {
        lstrip(&text, pos);
      }
      push_text(&items, std::move(text), pos);
      size_t p = at + 2 + (marker == '-' || marker == '+' ? 1 : 0);
      const int line = line_at(at);
      if (kind == '#') {
        const size_t end = s_.find("#}", p);
        if (end == std::string_view::npos) throw SyntaxError{line, "a comment is not closed"};
        pos = after_close(end + 2, end > p && s_[end - 1] == '-', true,
                          end > p && s_[end - 1] == '+');
        continue;
      }
      Item item;
      item.kind = kind == '{' ? Item::kOutput : Item::kTag;
      item.line = line;
      const char* close = kind == '{' ? "}}" : "%}";
      bool strip_after = false, keep_newline = false;
      p = lex_tokens(p, close, &item.tokens, &strip_after, &keep_newline);
      pos = after_close(p, strip_after, kind == '%', keep_newline);
      if (item.kind == Item::kTag && item.tokens.size() == 2 &&
          item.tokens[0].type == Token::kName && item.tokens[0].text == "raw") {
        pos = raw_block(pos, &items, line);
        continue;
      }
      items.push_back(std::move(item));
    }
    return items;
  }

 private:
  size_t next_tag(size_t from) const {
    for (size_t i = s_.find('{', from); i != std::string_view::npos; i = s_.find('{', i + 1))
      if (i + 1 < s_.size() && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) return i;
    return std::string_view::npos;
  }

  int line_at(size_t pos) {
    while (line_pos_ < pos) {
      if (s_[line_pos_] == '\n') ++line_;
      ++line_pos_;
    }
    return line_;
  }

  void push_text(std::vector<Item>* items, std::string text, size_t pos) {
    if (text.empty()) return;
    Item it;
    it.kind = Item::kText;
    it.text = std::move(text);
    it.line = line_at(pos);
    items->push_back(std::move(it));
  }

  // lstrip_blocks: spaces and tabs before a block or comment tag on its own line go.
  void lstrip(std::string* text, size_t data_start) const {
    const size_t nl = text->rfind('\n');
    const size_t from = nl == std::string::npos ? 0 : nl + 1;
    const bool line_starting = data_start == 0 || s_[data_start - 1] == '\n';
    if (from == 0 && !line_starting) return;
    for (size_t i = from; i < text->size(); ++i)
      if ((*text)[i] != ' ' && (*text)[i] != '\t') return;
    text->resize(from);
  }

  // After a tag's closing: '-' strips the whitespace that follows; trim_blocks drops one newline
  // after a block or comment tag (not after '+').
  size_t after_close(size_t pos, bool strip, bool block, bool keep_newline) const {
    if (strip) {
      while (pos < s_.size() && is_space(s_[pos])) ++pos;
    } else if (block && !keep_newline && pos < s_.size() && s_[pos] == '\n') {
      ++pos;
    }
    return pos;
  }

  // {% raw %}...{% endraw %}: the text between, literally.
  size_t raw_block(size_t pos, std::vector<Item>* items, int line) {
    for (size_t i = s_.find("{%", pos); i != std::string_view::npos; i = s_.find("{%", i + 2)) {
      size_t p = i + 2;
      const bool minus = p < s_.size() && s_[p] == '-';
      if (p < s_.size() && (s_[p] == '-' || s_[p] == '+')) ++p;
      while (p < s_.size() && is_space(s_[p])) ++p;
      if (s_.substr(p, 6) != "endraw") continue;
      p += 6;
      while (p < s_.size() && is_space(s_[p])) ++p;
      bool strip_after = false;
      if (p < s_.size() && (s_[p] == '-' || s_[p] == '+')) strip_after = s_[p++] == '-';
      if (s_.substr(p, 2) != "%}") continue;
      std::string text(s_.substr(pos, i - pos));
      if (minus)
        while (!text.empty() && is_space(text.back())) text.pop_back();
      push_text(items, std::move(text), pos);
      return after_close(p + 2, strip_after, true, false);
    }
    throw SyntaxError{line, "{% raw %} is not closed by {% endraw %}"};
  }

  // The tokens of one {{ }} or {% %} from `pos` to its closing `close`; returns the position after
  // the closing.
  size_t lex_tokens(size_t pos, const char* close, std::vector<Token>* out, bool* strip_after,
                    bool* keep_newline) {
    int depth = 0;  // brackets: '}}' inside a dict literal is not the end
    while (true) {
      while (pos < s_.size() && is_space(s_[pos])) ++pos;
      if (pos >= s_.size()) throw SyntaxError{line_at(pos), std::string("missing '") + close + "'"};
      const int line = line_at(pos);
      if (depth == 0) {
        for (char m : {'-', '+', '\0'}) {
          const size_t q = pos + (m ? 1 : 0);
          if ((m == 0 || s_[pos] == m) && s_.substr(q, 2) == close) {
            *strip_after = m == '-';
            *keep_newline = m == '+';
            Token end;
            end.line = line;
            out->push_back(end);
            return q + 2;
          }
        }
      }
      Token t;
      t.line = line;
      const char c = s_[pos];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos;
        while (e < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '_'))
          ++e;
        t.type = Token::kName;
        t.text = std::string(s_.substr(pos, e - pos));
        pos = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        pos = lex_number(pos, &t);
      } else if (c == '\'' || c == '"') {
        pos = lex_string(pos, &t);
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                           "/",  "%",  "~",  "<",  ">",  "=",  ".", ",", ":",
                                           "|",  "(",  ")",  "[",  "]",  "{",  "}"};
        const char* op = nullptr;
        for (const char* o : kOps)
          if (s_.substr(pos, std::strlen(o)) == o) {
            op = o;
            break;
          }
        if (!op) throw SyntaxError{line, std::string("unexpected character '") + c + "'"};
        t.type = Token::kOp;
        t.text = op;
        pos += t.text.size();
        if (t.text == "(" || t.text == "[" || t.text == "{") ++depth;
        if ((t.text == ")" || t.text == "]" || t.text == "}") && depth > 0) --depth;
      }
      out->push_back(std::move(t));
    }
  }

  size_t lex_number(size_t pos, Token* t) {
    size_t e = pos;
    auto digits = [&] {
      while (e < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[e])) || s_[e] == '_'))
        ++e;
    };
    digits();
    bool is_float = false;
    if (e + 1 < s_.size() && s_[e] == '.' && std::isdigit(static_cast<unsigned char>(s_[e + 1]))) {
      is_float = true;
      ++e;
      digits();
    }
    if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
      size_t q = e + 1;
      if (q < s_.size() && (s_[q] == '+' || s_[q] == '-')) ++q;
      if (q < s_.size() && std::isdigit(static_cast<unsigned char>(s_[q]))) {
        is_float = true;
        e = q;
        digits();
      }
    }
    std::string text;
    for (size_t i = pos; i < e; ++i)
      if (s_[i] != '_') text.push_back(s_[i]);
    if (is_float) {
      t->type = Token::kFloat;
      t->f = std::strtod(text.c_str(), nullptr);
    } else {
      t->type = Token::kInt;
      errno = 0;
      t->i = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) throw SyntaxError{t->line, "the integer " + text + " is too large"};
    }
    return e;
  }

  // A quoted string with Python's escapes (\n, \t, \\, \', \", \xHH, \uXXXX, \UXXXXXXXX);
  // an unknown escape stays as written.
  size_t lex_string(size_t pos, Token* t) {
    const char q = s_[pos++];
    std::string v;
    while (true) {
      if (pos >= s_.size()) throw SyntaxError{t->line, "a string is not closed"};
      const char c = s_[pos];
      if (c == q) {
        ++pos;
        break;
      }
      if (c != '\\' || pos + 1 >= s_.size()) {
        v.push_back(c);
        ++pos;
        continue;
      }
      const char e = s_[pos + 1];
      pos += 2;
      switch (e) {
        case 'n':
          v.push_back('\n');
          break;
        case 't':
          v.push_back('\t');
          break;
        case 'r':
          v.push_back('\r');
          break;
        case '0':
          v.push_back('\0');
          break;
        case 'a':
          v.push_back('\a');
          break;
        case 'b':
          v.push_back('\b');
          break;
        case 'f':
          v.push_back('\f');
          break;
        case 'v':
          v.push_back('\v');
          break;
        case '\\':
          v.push_back('\\');
          break;
        case '\'':
          v.push_back('\'');
          break;
        case '"':
          v.push_back('"');
          break;
        case '\n':
          break;
        case 'x':
        case 'u':
        case 'U': {
          const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          bool ok = pos + n <= s_.size();
          for (int k = 0; ok && k < n; ++k) {
            const int d = hex_digit(s_[pos + k]);
            ok = d >= 0;
            cp = cp * 16 + static_cast<uint32_t>(d < 0 ? 0 : d);
          }
          if (!ok || cp > 0x10FFFF)
            throw SyntaxError{t->line, "a bad \\" + std::string(1, e) + " escape"};
          append_utf8(&v, cp);
          pos += n;
          break;
        }
        default:
          v.push_back('\\');
          v.push_back(e);
      }
    }
    t->type = Token::kString;
    t->text = std::move(v);
    return pos;
  }

  std::string_view s_;
  size_t line_pos_ = 0;
  int line_ = 1;
};

// ---- Parser ----

class Parser {
 public:
  explicit Parser(std::vector<Item> items) : items_(std::move(items)) {}

  Body parse_all() {
    Body body = parse_body({});
    if (at_ < items_.size())
      throw SyntaxError{items_[at_].line, "unexpected '" + tag_name(items_[at_]) + "'"};
    return body;
  }

 private:
  static std::string tag_name(const Item& it) {
    return it.tokens.empty() || it.tokens[0].type != Token::kName ? "" : it.tokens[0].text;
  }

  // Items until a tag named in `ends` (left unconsumed) or the end.
  Body parse_body(std::initializer_list<const char*> ends) {
    if (++depth_ > kMaxDepth) throw SyntaxError{line(), "blocks are nested too deeply"};
    Body body;
    while (at_ < items_.size()) {
      const Item& it = items_[at_];
      if (it.kind == Item::kTag) {
        const std::string name = tag_name(it);
        for (const char* e : ends)
          if (name == e) {
            --depth_;
            return body;
          }
      }
      body.push_back(parse_item());
    }
    if (ends.size() > 0)
      throw SyntaxError{items_.empty() ? 1 : items_.back().line,
                        std::string("missing '{% ") + *(ends.end() - 1) + " %}'"};
    --depth_;
    return body;
  }

  int line() const { return at_ < items_.size() ? items_[at_].line : 0; }

  std::unique_ptr<Node> parse_item() {
    Item& it = items_[at_++];
    auto node = std::make_unique<Node>();
    node->line = it.line;
    if (it.kind == Item::kText) {
      node->kind = Node::kText;
      node->text = std::move(it.text);
      return node;
    }
    toks_ = &it.tokens;
    tp_ = 0;
    if (it.kind == Item::kOutput) {
      node->kind = Node::kOutput;
      node->expr = parse_expression();
      expect_end();
      return node;
    }
    const Token& t = next();
    if (t.type != Token::kName) throw SyntaxError{t.line, "a tag must start with its name"};
    const std::string name = t.text;
    if (name == "if") return parse_if(std::move(node));
    if (name == "for") return parse_for(std::move(node));
    if (name == "set") return parse_set(std::move(node));
    if (name == "macro") return parse_macro(std::move(node));
    if (name == "break" || name == "continue") {
      node->kind = name == "break" ? Node::kBreak : Node::kContinue;
      expect_end();
      return node;
    }
    if (name == "filter") {
      node->kind = Node::kFilterBlock;
      auto placeholder = std::make_unique<Expr>();
      placeholder->kind = Expr::kName;
      placeholder->name = "\x01";  // the block's text, bound by the renderer
      node->expr = parse_filters(std::move(placeholder), /*first_needs_pipe=*/false);
      expect_end();
      node->bodies.push_back(parse_body({"endfilter"}));
      end_tag("endfilter");
      return node;
    }
    if (name == "generation") {
      node->kind = Node::kGeneration;
      expect_end();
      node->bodies.push_back(parse_body({"endgeneration"}));
      end_tag("endgeneration");
      return node;
    }
    if (name.rfind("end", 0) == 0 || name == "elif" || name == "else")
      throw SyntaxError{t.line, "unexpected '" + name + "'"};
    throw SyntaxError{t.line, "unknown or unsupported tag '" + name + "'"};
  }

  void end_tag(const char* name) {
    ++at_;  // parse_body stopped at it
    toks_ = &items_[at_ - 1].tokens;
    tp_ = 1;
    expect_end();
    (void)name;
  }

  std::unique_ptr<Node> parse_if(std::unique_ptr<Node> node) {
    node->kind = Node::kIf;
    node->conds.push_back(parse_expression());
    expect_end();
    while (true) {
      node->bodies.push_back(parse_body({"elif", "else", "endif"}));
      Item& it = items_[at_++];
      toks_ = &it.tokens;
      tp_ = 1;
      const std::string name = tag_name(it);
      if (name == "elif") {
        node->conds.push_back(parse_expression());
        expect_end();
        continue;
      }
      expect_end();
      if (name == "else") {
        node->bodies.push_back(parse_body({"endif"}));
        end_tag("endif");
      }
      return node;
    }
  }

  std::unique_ptr<Node> parse_for(std::unique_ptr<Node> node) {
    node->kind = Node::kFor;
    do {
      const Token& t = next();
      if (t.type != Token::kName) throw SyntaxError{t.line, "for: expected a loop variable"};
      node->targets.push_back(t.text);
    } while (skip_op(","));
    if (!skip_name("in")) throw SyntaxError{peek().line, "for: expected 'in'"};
    node->expr = parse_or_no_cond();  // 'if' after the iterable filters the loop
    if (skip_name("if")) node->cond = parse_expression();
    if (skip_name("recursive")) throw SyntaxError{peek().line, "recursive loops are not supported"};
    expect_end();
    node->bodies.push_back(parse_body({"else", "endfor"}));
    if (tag_name(items_[at_]) == "else") {
      end_tag("else");
      node->bodies.push_back(parse_body({"endfor"}));
    }
    end_tag("endfor");
    return node;
  }

  std::unique_ptr<Node> parse_set(std::unique_ptr<Node> node) {
    const Token& t = next();
    if (t.type != Token::kName) throw SyntaxError{t.line, "set: expected a name"};
    node->targets.push_back(t.text);
    if (skip_op(".")) {
      const Token& a = next();
      if (a.type != Token::kName) throw SyntaxError{a.line, "set: expected an attribute name"};
      node->attr = a.text;
    } else {
      while (skip_op(",")) {
        const Token& n = next();
        if (n.type != Token::kName) throw SyntaxError{n.line, "set: expected a name"};
        node->targets.push_back(n.text);
      }
    }
    if (peek().type == Token::kEnd && node->attr.empty() && node->targets.size() == 1) {
      node->kind = Node::kSetBlock;
      expect_end();
      node->bodies.push_back(parse_body({"endset"}));
      end_tag("endset");
      return node;
    }
    node->kind = Node::kSet;
    if (!skip_op("=")) throw SyntaxError{peek().line, "set: expected '='"};
    node->expr = parse_tuple_or_expression();
    expect_end();
    return node;
  }

  std::unique_ptr<Node> parse_macro(std::unique_ptr<Node> node) {
    node->kind = Node::kMacro;
    const Token& t = next();
    if (t.type != Token::kName) throw SyntaxError{t.line, "macro: expected a name"};
    node->text = t.text;
    if (!skip_op("(")) throw SyntaxError{peek().line, "macro: expected '('"};
    while (!skip_op(")")) {
      if (!node->params.empty() && !skip_op(","))
        throw SyntaxError{peek().line, "macro: expected ',' or ')'"};
      const Token& p = next();
      if (p.type != Token::kName) throw SyntaxError{p.line, "macro: expected a parameter name"};
      MacroParam mp;
      mp.name = p.text;
      if (skip_op("=")) mp.default_value = parse_expression();
      node->params.push_back(std::move(mp));
    }
    expect_end();
    node->bodies.push_back(parse_body({"endmacro"}));
    end_tag("endmacro");
    return node;
  }

  // ---- expressions ----

  const Token& peek(size_t k = 0) const {
    const size_t i = std::min(tp_ + k, toks_->size() - 1);
    return (*toks_)[i];
  }
  const Token& next() {
    const Token& t = peek();
    if (tp_ < toks_->size() - 1) ++tp_;
    return t;
  }
  bool is_op(const char* op, size_t k = 0) const {
    return peek(k).type == Token::kOp && peek(k).text == op;
  }
  bool is_name(const char* name, size_t k = 0) const {
    return peek(k).type == Token::kName && peek(k).text == name;
  }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op))
      throw SyntaxError{peek().line, std::string("expected '") + op + "', got " + describe(peek())};
  }
  void expect_end() {
    if (peek().type != Token::kEnd)
      throw SyntaxError{peek().line, "unexpected " + describe(peek())};
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Token::kEnd:
        return "the end of the tag";
      case Token::kString:
        return "a string";
      case Token::kInt:
      case Token::kFloat:
        return "a number";
      default:
        return "'" + t.text + "'";
    }
  }

  ExprPtr make(Expr::Kind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  struct DepthGuard {
    explicit DepthGuard(Parser* p) : p(p) {
      if (++p->depth_ > kMaxDepth)
        throw SyntaxError{p->peek().line, "an expression is nested too deeply"};
    }
    ~DepthGuard() { --p->depth_; }
    Parser* p;
  };

  // a, b (a tuple without brackets), as `set a = 1, 2` allows.
  ExprPtr parse_tuple_or_expression() {
    ExprPtr first = parse_expression();
    if (!is_op(",")) return first;
    auto t = make(Expr::kTuple, first->line);
    t->args.push_back(std::move(first));
    while (skip_op(",")) {
      if (peek().type == Token::kEnd) break;
      t->args.push_back(parse_expression());
    }
    return t;
  }

  ExprPtr parse_expression() {
    DepthGuard g(this);
    ExprPtr e = parse_or();
    while (is_name("if")) {
      next();
      auto c = make(Expr::kCond, e->line);
      c->args.push_back(parse_or());
      c->args.push_back(std::move(e));
      if (skip_name("else"))
        c->args.push_back(parse_expression());
      else
        c->args.push_back(nullptr);
      e = std::move(c);
    }
    return e;
  }
  ExprPtr parse_or_no_cond() {
    DepthGuard g(this);
    return parse_or();
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (skip_name("or")) {
      auto o = make(Expr::kOr, e->line);
      o->args.push_back(std::move(e));
      o->args.push_back(parse_and());
      e = std::move(o);
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (skip_name("and")) {
      auto a = make(Expr::kAnd, e->line);
      a->args.push_back(std::move(e));
      a->args.push_back(parse_not());
      e = std::move(a);
    }
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      const int line = next().line;
      DepthGuard g(this);
      auto n = make(Expr::kNot, line);
      n->args.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (peek().type == Token::kOp &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == ">" ||
           peek().text == "<=" || peek().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::kCompare, first->line);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr binary(ExprPtr l, const std::string& op, ExprPtr r) {
    auto b = make(Expr::kBinary, l->line);
    b->name = op;
    b->args.push_back(std::move(l));
    b->args.push_back(std::move(r));
    return b;
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = next().text;
      e = binary(std::move(e), op, parse_concat());
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (skip_op("~")) e = binary(std::move(e), "~", parse_math2());
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = next().text;
      e = binary(std::move(e), op, parse_pow());
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (skip_op("**")) e = binary(std::move(e), "**", parse_unary(true));
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    DepthGuard g(this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      e = make(t.text == "-" ? Expr::kNeg : Expr::kPos, t.line);
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filters(std::move(e), true);
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = next();
    switch (t.type) {
      case Token::kName: {
        auto e = make(Expr::kLiteral, t.line);
        if (t.text == "true" || t.text == "True") {
          e->value = Value(true);
        } else if (t.text == "false" || t.text == "False") {
          e->value = Value(false);
        } else if (t.text == "none" || t.text == "None") {
          e->value = Value(None{});
        } else {
          e->kind = Expr::kName;
          e->name = t.text;
        }
        return e;
      }
      case Token::kString: {
        std::string s = t.text;
        while (peek().type == Token::kString) s += next().text;  // adjacent strings join
        auto e = make(Expr::kLiteral, t.line);
        e->value = Value(std::move(s));
        return e;
      }
      case Token::kInt: {
        auto e = make(Expr::kLiteral, t.line);
        e->value = Value(t.i);
        return e;
      }
      case Token::kFloat: {
        auto e = make(Expr::kLiteral, t.line);
        e->value = Value(t.f);
        return e;
      }
      case Token::kEnd:
        throw SyntaxError{t.line, "an expression is missing"};
      case Token::kOp:
        break;
    }
    const int line = t.line;
    if (t.text == "(") {
      if (skip_op(")")) return make(Expr::kTuple, line);
      ExprPtr e = parse_expression();
      if (skip_op(")")) return e;
      auto tup = make(Expr::kTuple, line);
      tup->args.push_back(std::move(e));
      while (skip_op(",")) {
        if (is_op(")")) break;
        tup->args.push_back(parse_expression());
      }
      expect_op(")");
      return tup;
    }
    if (t.text == "[") {
      auto l = make(Expr::kList, line);
      while (!skip_op("]")) {
        if (!l->args.empty()) {
          expect_op(",");
          if (skip_op("]")) break;
        }
        l->args.push_back(parse_expression());
      }
      return l;
    }
    if (t.text == "{") {
      auto d = make(Expr::kDict, line);
      while (!skip_op("}")) {
        if (!d->args.empty()) {
          expect_op(",");
          if (skip_op("}")) break;
        }
        d->args.push_back(parse_expression());
        expect_op(":");
        d->args.push_back(parse_expression());
      }
      return d;
    }
    throw SyntaxError{line, "unexpected '" + t.text + "'"};
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        next();
        const Token& n = next();
        auto a = make(Expr::kAttr, n.line);
        if (n.type == Token::kName) {
          a->name = n.text;
        } else if (n.type == Token::kInt) {
          a->kind = Expr::kItem;  // x.0 is x[0]
          auto idx = make(Expr::kLiteral, n.line);
          idx->value = Value(n.i);
          a->args.push_back(std::move(e));
          a->args.push_back(std::move(idx));
          e = std::move(a);
          continue;
        } else {
          throw SyntaxError{n.line, "expected an attribute name after '.'"};
        }
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr e) {
    const int line = next().line;
    ExprPtr parts[3];
    int n = 0;
    bool slice = false;
    while (true) {
      if (is_op(":")) {
        next();
        slice = true;
        if (++n > 2) throw SyntaxError{line, "a slice has at most two ':'"};
        continue;
      }
      if (is_op("]")) break;
      if (parts[n]) throw SyntaxError{line, "expected ':' or ']' in a subscript"};
      parts[n] = parse_expression();
    }
    next();
    if (!slice) {
      if (!parts[0]) throw SyntaxError{line, "an empty subscript"};
      auto it = make(Expr::kItem, line);
      it->args.push_back(std::move(e));
      it->args.push_back(std::move(parts[0]));
      return it;
    }
    auto s = make(Expr::kSlice, line);
    s->args.push_back(std::move(e));
    for (auto& p : parts) s->args.push_back(std::move(p));
    return s;
  }

  // ( args ), after the callee; positional then name=value.
  void parse_args(Expr* e) {
    expect_op("(");
    bool first = true;
    while (!skip_op(")")) {
      if (!first) {
        expect_op(",");
        if (skip_op(")")) break;
      }
      first = false;
      if (peek().type == Token::kName && is_op("=", 1)) {
        std::string key = next().text;
        next();
        e->kwargs.emplace_back(std::move(key), parse_expression());
      } else {
        if (!e->kwargs.empty())
          throw SyntaxError{peek().line, "a positional argument after a keyword argument"};
        e->args.push_back(parse_expression());
      }
    }
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto c = make(Expr::kCall, callee->line);
    c->args.push_back(std::move(callee));
    parse_args(c.get());
    return c;
  }

  // | filter(args) ... and `is [not] test args`, after a unary expression.
  ExprPtr parse_filters(ExprPtr e, bool first_needs_pipe) {
    bool need_pipe = first_needs_pipe;
    while (true) {
      if (!need_pipe || is_op("|")) {
        if (need_pipe) next();
        need_pipe = true;
        const Token& n = next();
        if (n.type != Token::kName) throw SyntaxError{n.line, "expected a filter name"};
        std::string name = n.text;
        while (is_op(".") && peek(1).type == Token::kName) {
          next();
          name += "." + next().text;
        }
        auto f = make(Expr::kFilter, n.line);
        f->name = name;
        f->args.push_back(std::move(e));
        if (is_op("(")) parse_args(f.get());
        e = parse_postfix(std::move(f));
      } else if (is_name("is")) {
        const int line = next().line;
        auto t = make(Expr::kTest, line);
        t->negated = skip_name("not");
        const Token& n = next();
        if (n.type != Token::kName) throw SyntaxError{n.line, "expected a test name after 'is'"};
        t->name = n.text == "none" || n.text == "None"     ? "none"
                  : n.text == "true" || n.text == "True"   ? "true"
                  : n.text == "false" || n.text == "False" ? "false"
                                                           : n.text;
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          parse_args(t.get());
        } else if (starts_test_argument()) {
          ExprPtr arg = parse_primary();
          t->args.push_back(parse_postfix(std::move(arg)));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }
  bool starts_test_argument() const {
    const Token& t = peek();
    if (t.type == Token::kString || t.type == Token::kInt || t.type == Token::kFloat) return true;
    if (t.type == Token::kOp) return t.text == "[" || t.text == "{";
    if (t.type != Token::kName) return false;
    for (const char* kw : {"else", "or", "and", "if", "in", "not", "is"})
      if (t.text == kw) return false;
    return true;
  }

  std::vector<Item> items_;
  size_t at_ = 0;
  const std::vector<Token>* toks_ = nullptr;
  size_t tp_ = 0;
  int depth_ = 0;
};

}  // namespace

Result<std::shared_ptr<const Program>> parse_jinja(std::string_view source) {
  // As jinja2 reads a template: every newline sequence becomes '\n', and one trailing newline
  // is dropped (keep_trailing_newline is off).
  std::string text;
  text.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      text.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      text.push_back(source[i]);
    }
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  try {
    Parser parser(Lexer(text).run());
    auto p = std::make_shared<Program>();
    p->body = parser.parse_all();
    return std::shared_ptr<const Program>(std::move(p));
  } catch (const SyntaxError& e) {
    return make_error(0, "line " + std::to_string(e.line) + ": " + e.message);
  }
}

}  // namespace troupe::model::detail
