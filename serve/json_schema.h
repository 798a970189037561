// JSON Schema -> GBNF (compute/grammar.h's dialect): the grammar a request's reply must follow
// for OpenAI `response_format` json_schema / json_object and forced tool calls. Used by
// serve/openai*.cc; pure functions, safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "base/result.h"

namespace troupe::serve {

/// Error codes of json_schema_grammar (troupe::Error::code). Numbers are pinned.
enum class JsonSchemaErrc : uint8_t {
  /// A keyword (or a combination of keywords) this converter cannot enforce exactly.
  kUnsupported = 1,
  /// A keyword's value is not what JSON Schema allows (a negative minItems, a type name that
  /// does not exist, a $ref that does not resolve) or no JSON value can satisfy the schema.
  kMalformed = 2,
  /// The schema passes a JsonGrammarOptions limit.
  kTooLarge = 3,
};

struct JsonGrammarOptions {
  int max_depth = 64;         // nested schemas (properties, items, anyOf, $ref chains)
  size_t max_rules = 10000;   // rules in the grammar
  int64_t max_repeat = 1000;  // minItems/maxItems/minLength/maxLength above this: refused
  /// Whitespace between tokens. 0 (the default): at most one space, as JSON written compactly
  /// or with a space after ',' and ':' (a small model given newlines and indents loops on them
  /// until max_tokens). > 0: pretty-printed, at most one newline then up to this many spaces or
  /// tabs.
  int max_indent = 0;
  size_t max_grammar_bytes = 1 << 20;  // the grammar's text (compute::GrammarLimits' default)
};

/// GBNF (start rule `root`) whose sentences are JSON texts that `schema` accepts, written
/// compactly or with bounded whitespace (JsonGrammarOptions::max_indent): between two tokens at
/// most one space, or one newline followed by up to `max_indent` spaces or tabs; none before the
/// value or after it. The subset:
///  - type (one name or a list); without type, any value, narrowed to the kinds that type-specific
///    keywords present name (`properties` alone means an object).
///  - enum, const: any JSON values, matched as their compact text (nlohmann's dump: `1.5`, not
///    `1.50`; keys in the schema's order); `type` beside them filters the values.
///  - object: properties, written in the schema's order; required; additionalProperties (false,
///    true or a schema; extra members follow the declared ones, any string key). NOTE: absent
///    additionalProperties means none (strict, as OpenAI strict mode and xgrammar do).
///    minProperties/maxProperties only when the rest of the schema already implies them.
///  - array: items, prefixItems (or draft-4 array `items` + additionalItems), minItems, maxItems.
///    NOTE: a tuple (prefixItems) without `items` allows no further items (strict), while an
///    array without either allows any items. uniqueItems: false only.
///  - string: minLength, maxLength (in code points; a \u escape pair for one is one);
///    format "date" (February 29 in any year), "time" and "date-time" (RFC 3339), "uuid",
///    "ipv4", "email" (dot-atom local part, a dotted domain name). Other formats are refused.
///  - integer: digits without fraction or exponent (`1.0` is not written). number: JSON's syntax.
///    minimum/maximum/exclusiveMinimum/exclusiveMaximum (draft 4's boolean form too): exact for
///    integers; for numbers when the bounds are whole numbers, and the grammar then writes no
///    exponent.
///  - anyOf; oneOf, read as anyOf (a grammar cannot enforce that exactly one member matches);
///    allOf with one member; $ref to a local JSON pointer (`#`, `#/$defs/Name`,
///    `#/definitions/Name`), recursion allowed: each referenced schema becomes one rule;
///    nullable: true (OpenAPI) adds null. These combine only with annotations and nullable.
///  - Ignored: annotations (title, description, examples, default, $schema, $id, $comment,
///    deprecated, readOnly, writeOnly, ...), $defs/definitions themselves, and keywords JSON Schema
///    does not define (as the standard says).
/// Refused, with JsonSchemaErrc::kUnsupported: pattern, patternProperties, multipleOf, not,
/// if/then/else, contains, uniqueItems: true, dependent*, propertyNames, unevaluated*, remote
/// $refs, and any constraint above that cannot be enforced exactly. Every sentence of the grammar
/// satisfies the schema (but for oneOf's exclusivity and February 29); some valid documents in
/// other spellings (`1e2` for an integer, `"\u0041"` for a const "A") are not sentences. Takes an
/// ordered_json (what serve/ parses request bodies into) because the order of `properties` is the
/// order the reply writes them in; a nlohmann::json converts implicitly, with its keys sorted. Rule
/// names follow the schema's paths (root-address-city, def-Node). Errors name the JSON pointer of
/// the offending keyword ("/" is the root): "schema at /properties/age/multipleOf: keyword
/// 'multipleOf' is not supported".
Result<std::string> json_schema_grammar(const nlohmann::ordered_json& schema,
                                        const JsonGrammarOptions& opt = {});

/// GBNF for any JSON object (response_format json_object), whitespace as above.
std::string json_object_grammar();

}  // namespace troupe::serve
