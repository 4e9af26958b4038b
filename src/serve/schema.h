/* Structured outputs: JSON schemas compiled into byte grammars (model/grammar.h) whose sentences
 * are exactly the JSON texts the schema accepts, so constrained decoding can only write those.
 *
 * Contract:
 * - Supported: type (one or a list), properties with required (members in the order the schema
 *   lists them; optional ones may be left out; no members beyond those listed), an object
 *   without properties (any members, or additionalProperties: SCHEMA for every value), items,
 *   tuples (prefixItems then items, or a list of items then additionalItems),
 *   minItems/maxItems, minLength/maxLength (in characters), enum, const, anyOf/oneOf (oneOf as
 *   anyOf), allOf of one schema, $ref to "#" or a JSON pointer into the document ($defs,
 *   definitions; recursion allowed), minimum/maximum and exclusive bounds on integers, and whole
 *   ones on numbers (a bounded number is written without an exponent), format
 *   date, time, date-time and uuid, pattern (an ECMAScript regular expression: see
 *   docs/serving.md for the subset); annotations (title, description, default, examples,
 *   $schema, $id, $comment, deprecated, readOnly, writeOnly) are ignored. Anything else —
 *   bounds on numbers that are not whole, multipleOf, uniqueItems, other formats,
 *   additionalProperties beside properties — is refused (NV_EUNSUPPORTED) with one line naming
 *   the keyword, rather than silently not enforced. A malformed schema is NV_EINVAL.
 * - The JSON written: between tokens and before the value (not after it) nothing, one space, or
 *   a newline and at most 20 spaces or tabs (llama.cpp's rule: compact or indented JSON, and a
 *   model cannot wander off into blank lines); integers have at most 16 digits, fractions at
 *   most 16, exponents at most 3; strings are valid UTF-8 with JSON's escapes. */
#ifndef NV_SERVE_SCHEMA_H
#define NV_SERVE_SCHEMA_H

#include <cjson/cJSON.h>

#include "model/grammar.h"

/* The grammar of the JSON texts schema accepts (schema: an object or a boolean). */
nv_err nv_schema_grammar(const cJSON *schema, nv_grammar **out);
/* Any JSON object (response_format {"type": "json_object"}). */
nv_err nv_json_object_grammar(nv_grammar **out);
/* Either of those (json_object: any object, schema unused); think (0, or the tags: NV_THINK_ANGLE,
 * NV_THINK_BRACKET): a reasoning model's "<think>...</think>" block may come first (any text in which
 * "</think>" does not occur, then a newline or not), and the JSON follows it. */
nv_err nv_schema_grammar_ex(const cJSON *schema, int json_object, int think, nv_grammar **out);
/* vLLM's guided_regex: the texts the whole of pattern matches (the ECMAScript subset 'pattern'
 * takes: docs/serving.md), each character written as its UTF-8 bytes; '^' and '$' at the ends
 * change nothing. think as above. */
nv_err nv_regex_grammar(const char *pattern, int think, nv_grammar **out);
/* vLLM's guided_choice: exactly one of the n strings. */
nv_err nv_choice_grammar(const char *const *choices, int n, int think, nv_grammar **out);
/* A reasoning model's block before the answer, as a rule of b: nothing, or the open tag ("<think>",
 * "[THINK]": nv_think_tags_of(tags)), any text in which its close does not occur, the close and a
 * newline or not. */
int nv_think_block_rule(nv_gbuild *b, int tags);
/* prefix, a JSON text schema accepts, suffix; with sep (not NULL) any number more after sep, and
 * one newline after the last. No other white space outside the JSON. */
nv_err nv_schema_grammar_framed(const cJSON *schema, const char *prefix, const char *suffix, const char *sep,
                                nv_grammar **out);

/* How a template writes tool calls: prefix {"name": NAME, ARGS_KEY: ARGS} suffix, framed as
 * nv_schema_grammar_framed does (sep: more calls); item_sep (not NULL): one frame holds a list of
 * calls, each after the first preceded by item_sep (Granite's <|tool_call|>[A, B]). xml: a call is
 * instead <function=NAME>\n, each parameter as <parameter=KEY>\nVALUE\n</parameter>\n, then
 * </function> (Qwen3-Coder's form; args_key unused): the properties in the schema's order, those not
 * required left out or not, a string VALUE written as it is (its enum, const, pattern (a match anywhere
 * in it), format and lengths held; one held to a pattern, format or lengths has no '<'), any other as
 * its JSON text (no '<' in its strings but as \u003c), a parameter that admits strings and other
 * values (or whose schema does not say) as any text in which "</parameter>" does not occur, where its
 * schema names types alone (else refused); under
 * skip_bad a tool left out is still callable, with any parameters. */
typedef struct {
    const char *args_key, *prefix, *suffix, *sep, *item_sep;
    int xml;
    const char *name_args; /* not NULL: a call is instead NAME name_args ARGS (Mistral's NAME[ARGS]{...}; args_key unused) */
    const char *call_id;   /* with name_args, not NULL: NAME call_id ID name_args ARGS, ID NV_MISTRAL_ID_LEN letters and
                              digits (Mistral's NAME[CALL_ID]ID[ARGS]{...}: the model names its own call) */
} nv_call_frame;

/* The kinds of JSON value schema admits (its type, "number" holding "integer"; enum or const
 * values; the union of its anyOf or oneOf branches, what all its allOf ones admit; its $ref's target
 * in doc), as bits; 0 when it does not say (any value), or when the walk goes past 16 levels or
 * 4096 schemas (an untrusted schema's branches could multiply without end). */
enum { NV_KIND_STRING = 1, NV_KIND_NUMBER = 2, NV_KIND_INTEGER = 4, NV_KIND_BOOLEAN = 8, NV_KIND_NULL = 16, NV_KIND_OBJECT = 32, NV_KIND_ARRAY = 64 };
unsigned nv_schema_kinds(const cJSON *schema, const cJSON *doc);
/* The kind of the value v, as those bits (a whole number: NUMBER and INTEGER). */
unsigned nv_json_kinds(const cJSON *v);

/* Tool calls as frame writes them for one of tools (an OpenAI tools list; only: just that one),
 * ARGS as the tool's "parameters" schema says (its $ref pointing into its own parameters; none:
 * any object), after a think block as nv_schema_grammar_ex's when think. answer (not NULL), or
 * answer_object: the calls or, instead of them, an answer in JSON that answer's schema accepts
 * (answer_object: any object), as nv_schema_grammar_ex's (response_format beside tools: the model
 * calls, or answers in the format). skip_bad: a tool whose parameters cannot be compiled is not held
 * to them (its calls take any arguments), with a warning (an error when no tool is held); otherwise
 * its error is returned, naming the tool. */
nv_err nv_tool_calls_grammar(const cJSON *tools, const char *only, const nv_call_frame *frame, int skip_bad, int think,
                             const cJSON *answer, int answer_object, nv_grammar **out);

#endif
