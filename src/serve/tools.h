/* Tool calling: the tools' JSON as chat templates print it, and the model's tool calls taken out
 * of its answer (whole or as it streams).
 *
 * Contract:
 * - nv_py_json() prints a JSON value as Python's json.dumps(ensure_ascii=False) does, which is
 *   what the models' own templates (tojson) feed them: ", " and ": " on one line, or indented;
 *   nv_py_repr() as Python's repr (SmolLM3's templates print tools with `| string`).
 * - nv_tool_parser takes the answer's text in pieces and gives back the content and the calls:
 *   Hermes style (every template but llama3 and granite): each <tool_call>JSON</tool_call> block whose
 *   JSON is {"name": one of the request's tools, "arguments": object (or its JSON text)} becomes
 *   a call; white space around the blocks is dropped; a block that does not parse, or names an
 *   unknown tool, stays in the content as written. An unclosed block at the end is a call if
 *   what it holds parses. Llama 3 style: an answer that is one JSON object {"name", "parameters"
 *   (or "arguments")} is a call; anything else is content. Granite style: the text after
 *   "<|tool_call|>" to the end of the answer is a JSON list of calls {"name", "arguments"} (one
 *   object is a list of one; an empty list is no call), the text before it content without its
 *   trailing white space; a list with anything else in it stays content as written (Phi-4-mini's
 *   style too: its closing <|/tool_call|> is a control token that prints nothing). Mistral style:
 *   the same after "[TOOL_CALLS]" (each call's "id" ignored). Mistral's later style (MISTRAL_ARGS):
 *   after the first "[TOOL_CALLS]" to the end, NAME[ARGS]{...} calls (or NAME[CALL_ID]ID[ARGS]{...}, the
 *   model's ID the call's id where it is 9 letters and digits), each further one after its own
 *   "[TOOL_CALLS]" (white space between), all calls of known tools or none. XML style (Qwen3-Coder's): Hermes's
 *   blocks, each holding <function=NAME>\n(<parameter=KEY>\nVALUE\n</parameter>\n)*</function> (or
 *   Hermes's JSON); a VALUE is read as its parameter's schema admits (nv_schema_kinds): a string as
 *   written where only strings are (or the schema does not say), else the JSON value it is when of
 *   an admitted kind (booleans and null also as Python writes them, in any case), else a string (a
 *   quoted text is never unwrapped); a parameter written twice is the last; a block may hold several
 *   functions, and values may hold </tool_call>; functions without their <tool_call> are read as
 *   calls too (vLLM's fallback). Text that
 *   may still turn out to be a call is held back until it is decided, so streamed content never
 *   has to be taken back.
 * - Calls get ids "call_" + 24 random letters and digits (Mistral style: 9 letters and digits, which
 *   its template requires). Arguments are compact JSON text. */
#ifndef NV_SERVE_TOOLS_H
#define NV_SERVE_TOOLS_H

#include <cjson/cJSON.h>

#include "base/buf.h"
#include "model/think.h"
#include "serve/chat.h"

#define NV_MAX_TOOLS 128

/* 1 when id (n bytes) is a Mistral call's id: NV_MISTRAL_ID_LEN ASCII letters and digits (its
 * templates refuse any other). */
int nv_tool_mistral_id(const char *id, size_t n);
void nv_py_json(nv_buf *b, const cJSON *v, int indent);
/* json, parsed from text[0..n): each number written as a float (3.0, 1e3) keeps its literal in
 * valuestring (cJSON keeps only the value; its type stays a number, which cJSON_Delete frees with it),
 * so that what is printed for a template (nv_py_json, a template run as Jinja) shows 3.0 as
 * json.loads keeps it. Numbers come in the tree's order as in the text's. */
void nv_json_mark_floats(cJSON *json, const char *text, size_t n);
/* The JSON value that is all of text[0..n) but white space (cJSON alone stops at the value's end and
 * takes the rest for nothing), its floats marked (nv_json_mark_floats); NULL when it is not one. */
cJSON *nv_json_parse_whole(const char *text, size_t n);
/* 1 when v is a number nv_json_mark_floats marked as written as a float. */
int nv_json_is_float(const cJSON *v);
/* v as Python's repr prints what json.loads makes of it (str(dict): single-quoted strings, True,
 * False, None; whole numbers as ints), which a Jinja template run by Python writes for `v | string`
 * (SmolLM3's xml_tools). */
void nv_py_repr(nv_buf *b, const cJSON *v);
/* Python's repr of a str (s, NUL-terminated UTF-8) and of a float. */
void nv_py_repr_str(nv_buf *b, const char *s);
void nv_py_repr_float(nv_buf *b, double v);
/* The JSON escape of byte c into out ('"', '\\', control characters; \n style where there is one,
 * else \u00XX), its length; 0 when c is written as itself. */
size_t nv_json_escape(unsigned c, char out[8]);
/* s as a JSON string, quotes included, appended to b (bytes past ASCII as they are). */
void nv_json_string(nv_buf *b, const char *s);

typedef struct {
    char id[32];
    char *name;
    char *arguments;
} nv_tool_call;

void nv_tool_calls_free(nv_tool_call *calls, int n);

typedef struct {
    nv_tool_style style;
    const char *const *names; /* the request's tools (borrowed) */
    int n_names;
    const cJSON *tools; /* XML style: the request's tools list, whose schemas say how values are read (borrowed; NULL: all strings) */
    nv_buf hold; /* text not yet decided */
    nv_buf ws;   /* the blank before a block being read (dropped if it is a call) */
    int state;
    int after_call; /* white space after a call is dropped */
    int bare;       /* XML style: the call being read came without its <tool_call> */
    int n_calls;
} nv_tool_parser;

/* Feeds the next n bytes of the answer (final: the answer is complete): content to *content,
 * each call completed to *calls (grown with realloc; *n_calls counts them). Returns 0, or -1 when
 * out of memory. */
int nv_tool_parser_feed(nv_tool_parser *p, const char *s, size_t n, int final, nv_buf *content, nv_tool_call **calls,
                        int *n_calls);
void nv_tool_parser_free(nv_tool_parser *p);

#endif
