// Tests of serve/json_schema.h: each schema's grammar is compiled (compute/grammar.h) and matched
// against JSON texts the schema accepts and texts it rejects, keyword by keyword; numeric ranges
// against an arithmetic oracle; and every refused keyword's error text with its JSON pointer.
#include "serve/json_schema.h"

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "compute/grammar.h"

namespace troupe::serve {
namespace {

using json = nlohmann::ordered_json;

std::shared_ptr<const compute::Grammar> grammar_of(const json& schema) {
  auto text = json_schema_grammar(schema);
  EXPECT_TRUE(text.has_value()) << (text ? "" : text.error().message);
  if (!text) return nullptr;
  auto g = compute::Grammar::compile(*text);
  EXPECT_TRUE(g.has_value()) << (g ? "" : g.error().message) << "\n" << *text;
  return g ? *g : nullptr;
}

bool matches(const std::shared_ptr<const compute::Grammar>& g, std::string_view text) {
  compute::GrammarMatcher m(g);
  return m.accept_bytes(text) && m.can_end();
}

// Every text in `valid` is a sentence of the schema's grammar (and JSON, else the test is wrong);
// none in `invalid` is.
void expect_language(const json& schema, const std::vector<std::string>& valid,
                     const std::vector<std::string>& invalid) {
  auto g = grammar_of(schema);
  ASSERT_TRUE(g) << schema.dump();
  const std::string text = *json_schema_grammar(schema);
  for (const auto& v : valid) {
    EXPECT_TRUE(json::accept(v)) << "not JSON (test bug): " << v;
    EXPECT_TRUE(matches(g, v)) << "rejected valid: " << v << "\nschema: " << schema.dump() << "\n"
                               << text;
  }
  for (const auto& v : invalid) {
    EXPECT_FALSE(matches(g, v)) << "accepted invalid: " << v << "\nschema: " << schema.dump()
                                << "\n"
                                << text;
  }
}

std::string error_of(const json& schema, const JsonGrammarOptions& opt = {}) {
  auto r = json_schema_grammar(schema, opt);
  return r ? "(no error)" : r.error().message;
}

int code_of(const json& schema, const JsonGrammarOptions& opt = {}) {
  auto r = json_schema_grammar(schema, opt);
  return r ? 0 : r.error().code;
}

TEST(JsonSchema, PrimitiveTypes) {
  expect_language({{"type", "string"}}, {R"("")", R"("abc")"}, {"abc", "1", "null", R"("a)"});
  expect_language({{"type", "integer"}}, {"0", "-0", "7", "-12", "1234567890123"},
                  {"01", "1.0", "1e3", "+1", "-", "", "\"1\"", "1 "});
  expect_language({{"type", "number"}}, {"0", "-0.5", "3.25", "1e10", "1E+2", "-2.5e-3", "10"},
                  {".5", "1.", "01", "1e", "--1", "0x10", "NaN", "Infinity"});
  expect_language({{"type", "boolean"}}, {"true", "false"}, {"True", "1", "\"true\"", "nul"});
  expect_language({{"type", "null"}}, {"null"}, {"Null", "0", "\"\"", "nil"});
  expect_language({{"type", json::array({"string", "null"})}}, {"null", R"("x")"},
                  {"0", "false", "[]"});
  expect_language({{"type", json::array({"integer", "boolean"})}}, {"3", "true"}, {"3.5", "null"});
}

TEST(JsonSchema, StringsAcceptEscapesAndUnicodeButNoControls) {
  expect_language(
      {{"type", "string"}},
      {R"("a\"b")", R"("back\\slash")", R"("\/\b\f\n\r\t")", R"("\u00e9\u0000")",
       R"("\uD83D\uDE00")", "\"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\"", R"("'single' quotes")",
       "\"\x7F\""},
      {"\"a\nb\"", "\"tab\there\"", R"("\x41")", R"("\a")", R"("\u12")", R"("\uD83D")",
       R"("\uDE00\uD83D")", R"("unterminated)", R"("a"b")", "\"\xC3\"", "\"\xED\xA0\x80\""});
}

TEST(JsonSchema, StringLengthCountsCharactersNotBytes) {
  const json schema = {{"type", "string"}, {"minLength", 2}, {"maxLength", 3}};
  expect_language(schema,
                  {R"("ab")", R"("abc")", "\"\xC3\xA9\xE2\x82\xAC\"", R"("\n\t")",
                   R"("a\uD83D\uDE00")", "\"\xF0\x9F\x98\x80\xF0\x9F\x98\x80\xF0\x9F\x98\x80\""},
                  {R"("a")", R"("")", R"("abcd")", R"("\n\t\r\b")", "\"\xF0\x9F\x98\x80\""});
  expect_language({{"type", "string"}, {"maxLength", 0}}, {R"("")"}, {R"("a")"});
  expect_language({{"type", "string"}, {"minLength", 5}}, {R"("abcde")", R"("abcdefghijkl")"},
                  {R"("abcd")"});
}

TEST(JsonSchema, PropertiesInSchemaOrderWithRequiredAndOptional) {
  const json schema = json::parse(R"({
    "type": "object",
    "properties": {
      "id": {"type": "integer"},
      "name": {"type": "string"},
      "email": {"type": "string"},
      "admin": {"type": "boolean"}
    },
    "required": ["name", "admin"]
  })");
  expect_language(schema,
                  {R"({"name":"a","admin":true})", R"({"id":1,"name":"a","admin":false})",
                   R"({"id":1,"name":"a","email":"e","admin":true})",
                   R"({"name":"a","email":"e","admin":true})"},
                  {
                      R"({"id":1,"admin":true})",                 // missing required
                      R"({"name":"a"})",                          // missing required
                      R"({"admin":true,"name":"a"})",             // out of order
                      R"({"name":"a","id":1,"admin":true})",      // out of order
                      R"({"name":"a","admin":true,"extra":1})",   // not declared
                      R"({"name":"a","name":"b","admin":true})",  // repeated
                      R"({"name":1,"admin":true})",               // wrong type
                      R"({"name":"a","admin":true,})",            // trailing comma
                      R"({,"name":"a","admin":true})",            // leading comma
                      R"({"name":"a" "admin":true})",             // missing comma
                      R"({})",
                      "[]",
                      "null",
                  });
}

TEST(JsonSchema, AllOptionalPropertiesAllowTheEmptyObject) {
  const json schema = json::parse(R"({"type": "object", "properties": {
      "a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}}})");
  expect_language(schema,
                  {"{}", "{ }", R"({"a":1})", R"({"b":2})", R"({"c":3})", R"({"a":1,"c":3})",
                   R"({"a":1,"b":2,"c":3})", R"({"b":2,"c":3})"},
                  {R"({"c":3,"a":1})", R"({"d":4})", R"({"a":1,})", R"({,})"});
  // No properties at all: only the empty object (no additional properties by default).
  expect_language({{"type", "object"}}, {"{}", "{ }"}, {R"({"a":1})", "[]", "{\n}"});
}

TEST(JsonSchema, ManyOptionalPropertiesKeepTheGrammarLinear) {
  json props = json::object();
  for (int i = 0; i < 300; ++i) props["p" + std::to_string(i)] = {{"type", "integer"}};
  const json schema = {{"type", "object"}, {"properties", props}};
  auto text = json_schema_grammar(schema);
  ASSERT_TRUE(text.has_value()) << text.error().message;
  EXPECT_LT(text->size(), size_t{300 * 200}) << "grammar grows faster than the properties";
  auto g = grammar_of(schema);
  ASSERT_TRUE(g);
  std::string every_third = "{", all = "{";
  for (int i = 0; i < 300; ++i) {
    const std::string kv = "\"p" + std::to_string(i) + "\":" + std::to_string(i);
    if (i % 3 == 0) every_third += (every_third.size() > 1 ? "," : "") + kv;
    all += (all.size() > 1 ? "," : "") + kv;
  }
  EXPECT_TRUE(matches(g, every_third + "}"));
  EXPECT_TRUE(matches(g, all + "}"));
  EXPECT_FALSE(matches(g, R"({"p5":1,"p4":1})"));
}

TEST(JsonSchema, AdditionalPropertiesFollowTheDeclaredOnes) {
  const json any_extra = json::parse(R"({"type": "object",
      "properties": {"a": {"type": "integer"}}, "required": ["a"],
      "additionalProperties": true})");
  expect_language(any_extra,
                  {R"({"a":1})", R"({"a":1,"x":[1,{"y":null}],"z":"s"})", R"({"a":1,"a2":{}})"},
                  {R"({"x":1,"a":1})", R"({"x":1})", R"({"a":1,"x"})", R"({"a":1,1:2})"});
  const json typed_extra = json::parse(R"({"type": "object",
      "properties": {"a": {"type": "integer"}},
      "additionalProperties": {"type": "string"}})");
  expect_language(typed_extra, {"{}", R"({"a":1})", R"({"a":1,"x":"s"})", R"({"x":"s","y":"t"})"},
                  {R"({"a":1,"x":2})", R"({"x":"s","a":1})"});
  // Only additional properties (a map).
  expect_language({{"type", "object"}, {"additionalProperties", {{"type", "boolean"}}}},
                  {"{}", R"({"k":true})", R"({"k":true,"j":false})"}, {R"({"k":1})"});
  expect_language(json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}},
                                  "additionalProperties": false})"),
                  {"{}", R"({"a":1})"}, {R"({"a":1,"b":2})"});
}

TEST(JsonSchema, PropertyWithSchemaFalseMayNotAppear) {
  expect_language(json::parse(R"({"type": "object",
                                  "properties": {"a": {"type": "integer"}, "b": false}})"),
                  {"{}", R"({"a":1})"}, {R"({"a":1,"b":2})", R"({"b":null})"});
}

TEST(JsonSchema, MinAndMaxPropertiesWhenImpliedByTheSchema) {
  expect_language(json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"},
      "b": {"type": "integer"}}, "required": ["a"], "minProperties": 1, "maxProperties": 2})"),
                  {R"({"a":1})", R"({"a":1,"b":2})"}, {"{}"});
}

TEST(JsonSchema, NestedObjects) {
  const json schema = json::parse(R"({"type": "object", "properties": {
      "user": {"type": "object", "properties": {
          "name": {"type": "string"},
          "address": {"type": "object", "properties": {
              "city": {"type": "string"}, "zip": {"type": "string"}}, "required": ["city"]}},
        "required": ["name", "address"]},
      "count": {"type": "integer"}}, "required": ["user"]})");
  expect_language(
      schema,
      {R"({"user":{"name":"n","address":{"city":"c"}}})",
       R"({"user":{"name":"n","address":{"city":"c","zip":"z"}},"count":2})"},
      {R"({"user":{"name":"n","address":{}}})", R"({"user":{"name":"n","address":{"zip":"z"}}})",
       R"({"user":{"name":"n"}})", R"({"user":{"name":"n","address":{"city":"c"},"x":1}})",
       R"({"user":{"name":"n","address":{"city":3}}})"});
}

TEST(JsonSchema, ArrayItemsWithMinAndMaxItems) {
  expect_language({{"type", "array"}, {"items", {{"type", "integer"}}}},
                  {"[]", "[1]", "[1,2,3]", "[ 1, 2 ]"}, {"[1,]", "[,]", "[\"a\"]", "[1 2]", "{}"});
  expect_language(
      {{"type", "array"}, {"items", {{"type", "integer"}}}, {"minItems", 2}, {"maxItems", 4}},
      {"[1,2]", "[1,2,3]", "[1,2,3,4]"}, {"[]", "[1]", "[1,2,3,4,5]"});
  expect_language({{"type", "array"}, {"items", {{"type", "string"}}}, {"minItems", 1}},
                  {R"(["a"])", R"(["a","b","c","d","e","f"])"}, {"[]"});
  expect_language({{"type", "array"}, {"maxItems", 0}}, {"[]"}, {"[1]"});
  // No items keyword: any values.
  expect_language({{"type", "array"}}, {"[]", R"([1,"a",null,[{}]])"}, {"[1,]"});
}

TEST(JsonSchema, LargeMinItemsWithoutMaxStaysSmall) {
  const json schema = {{"type", "array"}, {"items", {{"type", "integer"}}}, {"minItems", 500}};
  auto g = grammar_of(schema);
  ASSERT_TRUE(g);
  EXPECT_LT(g->num_elements(), size_t{20000});
  std::string a = "[0", b;
  for (int i = 1; i < 499; ++i) a += "," + std::to_string(i);
  EXPECT_FALSE(matches(g, a + "]"));  // 499 items
  EXPECT_TRUE(matches(g, a + ",7]"));
  EXPECT_TRUE(matches(g, a + ",7,8,9]"));
}

TEST(JsonSchema, TuplesWithPrefixItems) {
  // Strict: no items past the tuple unless `items` allows them.
  expect_language({{"type", "array"},
                   {"prefixItems", json::array({{{"type", "string"}}, {{"type", "integer"}}})}},
                  {"[]", R"(["a"])", R"(["a",1])"}, {R"(["a",1,2])", "[1]", R"([1,"a"])"});
  expect_language({{"type", "array"},
                   {"prefixItems", json::array({{{"type", "string"}}, {{"type", "integer"}}})},
                   {"items", {{"type", "boolean"}}},
                   {"minItems", 2}},
                  {R"(["a",1])", R"(["a",1,true,false])"},
                  {R"(["a"])", R"(["a",1,2])", R"(["a",1,true,"b"])"});
  // Draft 4 spelling: items as an array, additionalItems.
  expect_language({{"type", "array"},
                   {"items", json::array({{{"type", "null"}}})},
                   {"additionalItems", {{"type", "integer"}}},
                   {"maxItems", 3}},
                  {"[]", "[null]", "[null,1,2]"}, {"[1]", "[null,1,2,3]"});
}

TEST(JsonSchema, EnumAndConstAreCompactLiterals) {
  expect_language(
      {{"enum", json::array({"red", "gr\"een", 3, nullptr, json::array({1, 2}), {{"k", "v"}}})}},
      {R"("red")", R"("gr\"een")", "3", "null", "[1,2]", R"({"k":"v"})"},
      {R"("blue")", R"("re")", "4", "3.0", "[1, 2]", R"({"k": "v"})", R"("Red")"});
  expect_language({{"const", "only"}}, {R"("only")"}, {R"("onl")", R"("only2")"});
  expect_language({{"const", "\xC3\xA9t\xC3\xA9\n"}}, {"\"\xC3\xA9t\xC3\xA9\\n\""}, {"\"ete\\n\""});
  // type filters the values.
  expect_language({{"type", "string"}, {"enum", json::array({"a", 1, "b"})}}, {R"("a")", R"("b")"},
                  {"1"});
  expect_language({{"type", "integer"}, {"enum", json::array({1, 2.0, 2.5})}}, {"1", "2.0"},
                  {"2.5", "2"});
}

TEST(JsonSchema, RecursiveRefsBuildATree) {
  const json schema = json::parse(R"({
    "$defs": {"node": {"type": "object", "properties": {
        "value": {"type": "integer"},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["value"]}},
    "$ref": "#/$defs/node"})");
  expect_language(schema,
                  {R"({"value":1})", R"({"value":1,"children":[]})",
                   R"({"value":1,"children":[{"value":2},{"value":3,"children":[{"value":4}]}]})"},
                  {R"({"value":1,"children":[{}]})", R"({"value":1,"children":[{"value":"x"}]})",
                   R"({"children":[]})"});
  // Deep nesting matches (the stack grows with the input).
  std::string deep, close;
  for (int i = 0; i < 200; ++i) {
    deep += R"({"value":1,"children":[)";
    close += "]}";
  }
  EXPECT_TRUE(matches(grammar_of(schema), deep + R"({"value":0})" + close));
  // `definitions` and a reference to the root itself.
  expect_language(json::parse(R"({"type": "object", "properties": {
      "name": {"$ref": "#/definitions/name"}, "next": {"$ref": "#"}},
      "definitions": {"name": {"type": "string", "maxLength": 2}}})"),
                  {"{}", R"({"name":"ab","next":{"next":{"name":"c"}}})"},
                  {R"({"next":{"name":"abc"}})", R"({"next":null})"});
}

TEST(JsonSchema, AnyOfAndOneOfAreAlternatives) {
  expect_language({{"anyOf", json::array({{{"type", "string"}}, {{"type", "integer"}}})}},
                  {R"("a")", "1"}, {"1.5", "null", "true"});
  const json one_of = json::parse(R"({"oneOf": [
      {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
       "required": ["kind", "r"]},
      {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "number"}},
       "required": ["kind", "side"]}]})");
  expect_language(one_of, {R"({"kind":"circle","r":1.5})", R"({"kind":"square","side":2})"},
                  {R"({"kind":"circle","side":2})", R"({"kind":"square","r":1})"});
}

TEST(JsonSchema, AllOfWithOneMemberAndAnnotationsAreIgnored) {
  expect_language(json::parse(R"({"allOf": [{"type": "integer"}], "description": "d",
      "title": "t", "default": 3, "examples": [1], "$comment": "c", "deprecated": false,
      "readOnly": true, "x-custom": 1})"),
                  {"3"}, {"\"3\""});
}

TEST(JsonSchema, NullableAddsNull) {
  expect_language({{"type", "string"}, {"nullable", true}}, {"null", R"("a")"}, {"1"});
  expect_language(json::parse(R"({"$defs": {"p": {"type": "integer"}},
      "type": "object", "properties": {"x": {"$ref": "#/$defs/p", "nullable": true}},
      "required": ["x"]})"),
                  {R"({"x":null})", R"({"x":1})"}, {R"({"x":"1"})"});
  expect_language({{"enum", json::array({"a"})}, {"nullable", true}}, {"null", R"("a")"}, {"1"});
  expect_language({{"type", "string"}, {"nullable", false}}, {R"("a")"}, {"null"});
}

TEST(JsonSchema, AbsentTypeMeansAnyValueNarrowedByKeywords) {
  expect_language(json::object(), {"1", "\"s\"", "null", "true", "[1,{}]", R"({"a":[]})"},
                  {"", "nul", "[1,]", "{\"a\"}"});
  expect_language(true, {"1", "{}"}, {"x"});
  // properties alone means an object; minLength alone a string.
  expect_language(json::parse(R"({"properties": {"a": {"type": "integer"}}})"),
                  {"{}", R"({"a":1})"}, {"1", "\"a\"", "[]"});
  expect_language({{"minLength", 1}}, {R"("a")"}, {"1", R"("")"});
}

TEST(JsonSchema, WhitespaceIsBoundedBetweenTokensOnly) {
  const json schema = json::parse(R"({"type": "object", "properties": {
      "a": {"type": "array", "items": {"type": "integer"}}, "b": {"type": "string"}}})");
  // The default: at most one space between tokens, no newlines.
  expect_language(schema, {"{\"a\":[1,2],\"b\":\"x\"}", "{ \"a\" : [ 1 , 2 ] , \"b\" : \"x\" }"},
                  {" {}", "{} ", "{  \"b\":\"x\"}", "{\n\"b\":\"x\"}", "{\t\"b\":\"x\"}"});
  // Pretty-printed: one newline, then up to max_indent spaces or tabs.
  JsonGrammarOptions pretty;
  pretty.max_indent = 20;
  auto text = json_schema_grammar(schema, pretty);
  ASSERT_TRUE(text.has_value());
  auto g = compute::Grammar::compile(*text);
  ASSERT_TRUE(g.has_value()) << g.error().message;
  for (const std::string& ok :
       std::vector<std::string>{"{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": \"x\"\n}",
                                "{\"a\" : [ 1 , 2 ] , \"b\" :\"x\" }", "{\n\t\"b\":\t\"x\"}",
                                "{" + std::string(20, ' ') + "\"b\":\"x\"}"}) {
    EXPECT_TRUE(matches(*g, ok)) << ok;
  }
  for (const std::string& bad :
       std::vector<std::string>{" {}", "{} ", "{}\n", "{\n\n\"b\":\"x\"}", "{ \n\"b\":\"x\"}",
                                "{" + std::string(21, ' ') + "\"b\":\"x\"}", "{\r\n\"b\":\"x\"}"}) {
    EXPECT_FALSE(matches(*g, bad)) << bad;
  }
}

// Integer ranges against arithmetic: every integer in [-250, 250] is a sentence exactly when it is
// within the bounds.
TEST(JsonSchema, IntegerBoundsMatchArithmetic) {
  struct Case {
    json bounds;
    long lo, hi;  // inclusive, within [-1000, 1000] standing for unbounded
  };
  const Case cases[] = {
      {{{"minimum", 0}}, 0, 1000},
      {{{"minimum", 1}}, 1, 1000},
      {{{"minimum", 17}}, 17, 1000},
      {{{"minimum", -37}}, -37, 1000},
      {{{"maximum", 99}}, -1000, 99},
      {{{"maximum", -5}}, -1000, -5},
      {{{"minimum", -37}, {"maximum", 142}}, -37, 142},
      {{{"minimum", 5}, {"maximum", 5}}, 5, 5},
      {{{"minimum", 10}, {"maximum", 199}}, 10, 199},
      {{{"minimum", -200}, {"maximum", -101}}, -200, -101},
      {{{"exclusiveMinimum", 0}, {"exclusiveMaximum", 100}}, 1, 99},
      {{{"minimum", 0}, {"exclusiveMinimum", true}}, 1, 1000},  // draft 4
      {{{"minimum", 1.5}, {"maximum", 7.9}}, 2, 7},
      {{{"exclusiveMinimum", 1.5}, {"exclusiveMaximum", 8}}, 2, 7},
      {{{"minimum", 3}, {"exclusiveMinimum", 3}}, 4, 1000},  // the stricter
  };
  for (const auto& c : cases) {
    json schema = c.bounds;
    schema["type"] = "integer";
    SCOPED_TRACE(schema.dump());
    auto g = grammar_of(schema);
    ASSERT_TRUE(g);
    for (long v = -250; v <= 250; ++v) {
      ASSERT_EQ(matches(g, std::to_string(v)), v >= c.lo && v <= c.hi) << v;
    }
    EXPECT_EQ(matches(g, "123456789"), c.hi == 1000);
    EXPECT_EQ(matches(g, "-123456789"), c.lo == -1000);
    EXPECT_FALSE(matches(g, "007"));
    EXPECT_FALSE(matches(g, "7.0"));
  }
}

// Number ranges (whole-number bounds) against arithmetic on assorted texts.
TEST(JsonSchema, NumberBoundsMatchArithmetic) {
  const char* texts[] = {"-100",  "-12.5", "-10",   "-10.0", "-9.99", "-1",  "-0.5",
                         "-0",    "-0.0",  "0",     "0.0",   "0.001", "0.5", "1",
                         "1.0",   "1.00",  "1.01",  "2",     "9.5",   "10",  "10.000",
                         "10.01", "11",    "99.99", "100",   "1234.5"};
  struct Case {
    json bounds;
    double lo, hi;
    bool lo_excl, hi_excl;
  };
  const double inf = INFINITY;
  const Case cases[] = {
      {{{"minimum", 0}}, 0, inf, false, false},
      {{{"exclusiveMinimum", 0}}, 0, inf, true, false},
      {{{"minimum", 0}, {"maximum", 1}}, 0, 1, false, false},
      {{{"minimum", -10}, {"exclusiveMaximum", 10}}, -10, 10, false, true},
      {{{"exclusiveMinimum", -10}, {"maximum", 10}}, -10, 10, true, false},
      {{{"maximum", 0}}, -inf, 0, false, false},
      {{{"exclusiveMaximum", 0}}, -inf, 0, false, true},
      {{{"exclusiveMinimum", 1}, {"exclusiveMaximum", 2}}, 1, 2, true, true},
      {{{"minimum", 1}, {"maximum", 1}}, 1, 1, false, false},
      {{{"minimum", -1}, {"maximum", 100}}, -1, 100, false, false},
  };
  for (const auto& c : cases) {
    json schema = c.bounds;
    schema["type"] = "number";
    SCOPED_TRACE(schema.dump());
    auto g = grammar_of(schema);
    ASSERT_TRUE(g);
    for (const char* t : texts) {
      const double v = std::strtod(t, nullptr);
      const bool in = (c.lo_excl ? v > c.lo : v >= c.lo) && (c.hi_excl ? v < c.hi : v <= c.hi);
      EXPECT_EQ(matches(g, t), in) << t;
    }
    EXPECT_FALSE(matches(g, "1e0"));  // bounded numbers are written without exponent
    EXPECT_FALSE(matches(g, "00.5"));
  }
}

TEST(JsonSchema, StringFormats) {
  auto fmt = [](const char* f) { return json{{"type", "string"}, {"format", f}}; };
  expect_language(fmt("date"), {R"("2024-02-29")", R"("1999-12-31")", R"("2024-04-30")"},
                  {R"("2024-13-01")", R"("2024-04-31")", R"("2024-02-30")", R"("2024-1-01")",
                   R"("2024-00-10")", R"("2024-01-00")", R"("24-01-01")"});
  expect_language(fmt("time"), {R"("23:59:60Z")", R"("00:00:00.123+05:30")", R"("12:30:00z")"},
                  {R"("24:00:00Z")", R"("12:60:00Z")", R"("12:00:00")", R"("12:00Z")"});
  expect_language(fmt("date-time"), {R"("2024-01-15T10:20:30Z")", R"("2024-01-15t10:20:30-08:00")"},
                  {R"("2024-01-15 10:20:30Z")", R"("2024-01-15")"});
  expect_language(
      fmt("uuid"), {R"("123e4567-e89b-12d3-a456-426614174000")"},
      {R"("123e4567e89b12d3a456426614174000")", R"("123e4567-e89b-12d3-a456-42661417400g")"});
  expect_language(fmt("ipv4"), {R"("192.168.0.1")", R"("255.255.255.255")", R"("0.0.0.0")"},
                  {R"("256.1.1.1")", R"("01.1.1.1")", R"("1.1.1")"});
  expect_language(fmt("email"), {R"("a.b+c@example.com")", R"("x@sub.example-1.org")"},
                  {R"("a@b")", R"("@example.com")", R"("a..b@example.com")", R"("a@-x.com")",
                   R"("a b@example.com")"});
}

// Every text made from a valid one by deleting a byte or inserting one: those the grammar accepts.
std::vector<std::string> accepted_mutations(const std::shared_ptr<const compute::Grammar>& g,
                                            const std::string& doc) {
  const std::string inserts = "{}[]\",:019.-eE ab\\\n";
  std::vector<std::string> out;
  for (size_t i = 0; i <= doc.size(); ++i) {
    std::vector<std::string> cands;
    if (i < doc.size()) cands.push_back(doc.substr(0, i) + doc.substr(i + 1));
    for (char c : inserts) cands.push_back(doc.substr(0, i) + c + doc.substr(i));
    for (auto& c : cands) {
      if (matches(g, c)) out.push_back(std::move(c));
    }
  }
  return out;
}

// The other direction of the keyword tests: what the grammar lets through near valid documents
// is JSON the schema accepts (checked here by hand), never something it refuses.
TEST(JsonSchema, AcceptedMutationsStillSatisfyTheSchema) {
  const json schema = json::parse(R"({"type": "object", "properties": {
      "id": {"type": "integer", "minimum": 1, "maximum": 999},
      "name": {"type": "string", "minLength": 1, "maxLength": 8},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
      "score": {"type": "number", "minimum": 0, "maximum": 1}},
    "required": ["id", "name"]})");
  auto satisfies = [](const json& d) {
    if (!d.is_object() || !d.contains("id") || !d.contains("name")) return false;
    const std::vector<std::string> order = {"id", "name", "tags", "score"};
    size_t at = 0;
    for (const auto& [k, v] : d.items()) {
      while (at < order.size() && order[at] != k) ++at;
      if (at == order.size()) return false;  // undeclared or out of order
    }
    const json& id = d["id"];
    if (!id.is_number_integer() || id.get<int64_t>() < 1 || id.get<int64_t>() > 999) return false;
    if (!d["name"].is_string()) return false;
    size_t chars = 0;
    for (unsigned char c : d["name"].get<std::string>()) chars += (c & 0xC0) != 0x80;
    if (chars < 1 || chars > 8) return false;
    if (d.contains("tags")) {
      if (!d["tags"].is_array() || d["tags"].size() > 3) return false;
      for (const auto& t : d["tags"]) {
        if (t != "a" && t != "b") return false;
      }
    }
    if (d.contains("score")) {
      const json& sc = d["score"];
      if (!sc.is_number() || sc.get<double>() < 0 || sc.get<double>() > 1) return false;
    }
    return true;
  };
  auto g = grammar_of(schema);
  ASSERT_TRUE(g);
  size_t num_accepted = 0;
  for (const std::string doc :
       {R"({"id":1,"name":"x"})", R"({"id":999,"name":"abcdefgh","tags":["a","b"],"score":0.5})",
        R"({"id":10,"name":"\u00e9\n","score":1})", "{ \"id\": 5, \"name\": \"n\" }"}) {
    ASSERT_TRUE(matches(g, doc)) << doc;
    for (const auto& m : accepted_mutations(g, doc)) {
      ++num_accepted;
      ASSERT_TRUE(json::accept(m)) << "not JSON: " << m;
      ASSERT_TRUE(satisfies(json::parse(m))) << "violates the schema: " << m;
    }
  }
  EXPECT_GT(num_accepted, 50u);  // the check saw work
}

TEST(JsonSchema, UnsupportedKeywordsNameTheirPath) {
  EXPECT_EQ(error_of(json::parse(R"({"type": "object", "properties": {"age": {"type": "integer",
      "multipleOf": 5}}})")),
            "schema at /properties/age/multipleOf: keyword 'multipleOf' is not supported");
  EXPECT_EQ(code_of({{"multipleOf", 5}}), static_cast<int>(JsonSchemaErrc::kUnsupported));
  EXPECT_EQ(error_of({{"type", "string"}, {"pattern", "^a+$"}}),
            "schema at /pattern: keyword 'pattern' is not supported");
  EXPECT_EQ(error_of(json::parse(R"({"type": "array", "items": {"not": {"type": "null"}}})")),
            "schema at /items/not: keyword 'not' is not supported");
  EXPECT_EQ(error_of({{"type", "array"}, {"uniqueItems", true}}),
            "schema at /uniqueItems: keyword 'uniqueItems' true is not supported");
  EXPECT_EQ(error_of({{"type", "string"}, {"format", "hostname"}}),
            "schema at /format: format 'hostname' is not supported (date, time, date-time, uuid, "
            "ipv4, email are)");
  EXPECT_EQ(error_of({{"allOf", json::array({{{"type", "string"}}, {{"minLength", 1}}})}}),
            "schema at /allOf: allOf with 2 members is not supported (only one)");
  EXPECT_EQ(error_of({{"type", "string"}, {"anyOf", json::array({{{"minLength", 1}}})}}),
            "schema at /anyOf: keyword 'anyOf' alongside 'type' is not supported");
  EXPECT_EQ(error_of({{"enum", json::array({"a"})}, {"maxLength", 3}}),
            "schema at /maxLength: keyword 'maxLength' alongside 'enum' is not supported");
  EXPECT_EQ(error_of({{"$ref", "https://example.com/s.json"}}),
            "schema at /$ref: $ref 'https://example.com/s.json' is not supported (only local "
            "references: #, #/$defs/Name)");
  EXPECT_EQ(error_of({{"type", "number"}, {"minimum", 0.5}}),
            "schema at /minimum: minimum 0.5 on a number is not supported (only whole-number "
            "bounds are)");
  EXPECT_EQ(error_of(json::parse(R"({"type": "object", "properties": {"a": {}},
      "minProperties": 1})")),
            "schema at /minProperties: minProperties 1 above the 0 required properties is not "
            "supported");
  EXPECT_EQ(error_of(json::parse(R"({"type": "object", "properties": {"a": {}, "b": {}},
      "maxProperties": 1})")),
            "schema at /maxProperties: maxProperties 1 below the number of properties that may "
            "appear is not supported");
  EXPECT_EQ(error_of(json::parse(R"({"type": "object", "properties": {"a": {}},
      "required": ["b"]})")),
            "schema at /required/0: required property 'b' is not declared in properties (not "
            "supported)");
  EXPECT_EQ(error_of({{"type", "string"}, {"format", "date"}, {"maxLength", 10}}),
            "schema at /maxLength: keyword 'maxLength' alongside 'format' is not supported");
  // Keys with '/' and '~' are escaped in the pointer.
  EXPECT_EQ(error_of(json::parse(R"({"properties": {"a/b~c": {"if": {}}}})")),
            "schema at /properties/a~1b~0c/if: keyword 'if' is not supported");
  // Inside a $defs target the path is the target's.
  EXPECT_EQ(error_of(json::parse(R"({"$defs": {"x": {"dependentRequired": {}}},
      "$ref": "#/$defs/x"})")),
            "schema at /$defs/x/dependentRequired: keyword 'dependentRequired' is not supported");
}

TEST(JsonSchema, MalformedSchemasNameTheirPath) {
  EXPECT_EQ(error_of({{"type", "strin"}}), "schema at /type: unknown type \"strin\"");
  EXPECT_EQ(code_of({{"type", "strin"}}), static_cast<int>(JsonSchemaErrc::kMalformed));
  EXPECT_EQ(error_of({{"type", "array"}, {"minItems", -1}}),
            "schema at /minItems: minItems must be a non-negative integer");
  EXPECT_EQ(error_of({{"type", "array"}, {"minItems", 3}, {"maxItems", 2}}),
            "schema at /: no array has at least 3 and at most 2 items");
  EXPECT_EQ(error_of({{"$ref", "#/$defs/missing"}}),
            "schema at /$ref: $ref '#/$defs/missing' does not resolve");
  EXPECT_EQ(error_of(false), "schema at /: schema false accepts no value");
  EXPECT_EQ(error_of(json::array()), "schema at /: a schema is an object or a boolean, not array");
  EXPECT_EQ(error_of({{"type", "integer"}, {"minimum", 5}, {"maximum", 4}}),
            "schema at /: no integer is within the bounds");
  EXPECT_EQ(error_of({{"anyOf", json::array()}}),
            "schema at /anyOf: anyOf must be a non-empty array");
  EXPECT_EQ(error_of({{"type", "string"}, {"enum", json::array({1, 2})}}),
            "schema at /enum: no value of enum has the schema's type");
  EXPECT_EQ(error_of({{"type", "object"}, {"properties", json::array()}}),
            "schema at /properties: properties must be an object");
}

TEST(JsonSchema, LimitsAreErrors) {
  json deep = {{"type", "integer"}};
  for (int i = 0; i < 70; ++i) deep = {{"type", "array"}, {"items", deep}};
  EXPECT_NE(error_of(deep).find("nested deeper than the limit of 64"), std::string::npos)
      << error_of(deep);
  EXPECT_EQ(code_of(deep), static_cast<int>(JsonSchemaErrc::kTooLarge));
  json wide = json::object();
  for (int i = 0; i < 50; ++i) wide["p" + std::to_string(i)] = {{"type", "object"}};
  JsonGrammarOptions few;
  few.max_rules = 20;
  EXPECT_NE(error_of({{"type", "object"}, {"properties", wide}}, few)
                .find("the grammar needs more than the limit of 20 rules"),
            std::string::npos);
  EXPECT_EQ(error_of({{"type", "array"}, {"maxItems", 5000}}),
            "schema at /maxItems: maxItems 5000 is above the limit of 1000");
  // A $ref that loops without consuming input compiles to left recursion, which the grammar
  // compiler refuses (it is no JSON value).
  auto text = json_schema_grammar(json::parse(R"({"$defs": {"a": {"$ref": "#/$defs/a"}},
      "$ref": "#/$defs/a"})"));
  ASSERT_TRUE(text.has_value());
  EXPECT_FALSE(compute::Grammar::compile(*text).has_value());
}

TEST(JsonSchema, ObjectGrammarAcceptsAnyObjectOnly) {
  auto g = compute::Grammar::compile(json_object_grammar());
  ASSERT_TRUE(g.has_value()) << g.error().message << "\n" << json_object_grammar();
  for (const char* ok : {"{}", R"({"a":1})", R"({"a":{"b":[1,2,{"c":null}]},"d":"e\u00e9"})",
                         "{ \"x\": [true, false], \"y\": -1.5e3 }", R"({"a":1,"a":2})"}) {
    EXPECT_TRUE(matches(*g, ok)) << ok;
  }
  for (const char* bad : {"[]", "1", "\"s\"", "null", R"({"a"})", R"({"a":1,})", R"({a:1})",
                          R"({"a":01})", R"({'a':1})", R"({"a":1}})", " {}", "{"}) {
    EXPECT_FALSE(matches(*g, bad)) << bad;
  }
  for (const auto& m :
       accepted_mutations(*g, R"({"a":[1,-2.5e3,{"b":"c\n"}],"d":null,"e":true})")) {
    ASSERT_TRUE(json::accept(m)) << m;
    ASSERT_TRUE(json::parse(m).is_object()) << m;
  }
}

}  // namespace
}  // namespace troupe::serve
