/* Jinja2 templates as models' chat templates are written, run: the language Hugging Face's
 * apply_chat_template renders (transformers' environment: trim_blocks and lstrip_blocks on, loop
 * controls, an immutable sandbox, tojson as json.dumps with ensure_ascii false and keys unsorted,
 * raise_exception(message), strftime_now(format)).
 *
 * The language: text, {{ expr }}, {% stmt %}, {# comment #}, whitespace control (- and +);
 * if/elif/else, for (loop.*, tuple targets, an if filter, else, break, continue), set (a name, a
 * namespace's attribute, or a block), macro (positional and keyword arguments, defaults), raw,
 * generation (rendered as its body); literals (strings, integers, floats, true/false/none in either
 * case, lists, tuples, dicts), attributes and subscripts (negative indices, slices), calls,
 * filters, tests, arithmetic (+ - * / // % **), ~, comparisons, in, and/or/not, a if b else c.
 * Values behave as Python's (truthiness, str() and repr() of lists and dicts, code-point string
 * lengths and slices). What a template calls that is not listed in jinja.c is an error that names it.
 *
 * Every template is untrusted (a model file carries it): parse and render fail with a message
 * naming the line, and a render stops at limits of work, nesting and memory instead of running away. */
#ifndef NV_SERVE_JINJA_H
#define NV_SERVE_JINJA_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "base/buf.h"
#include "base/err.h"

typedef struct nv_jinja nv_jinja;

/* Parses text (n bytes). NV_EFORMAT with "line N: ..." when it is not a template. */
nv_err nv_jinja_parse(const char *text, size_t n, nv_jinja **out);
/* Renders with vars (a JSON object: its members are the template's variables; NULL: none),
 * appending to out. NV_EFORMAT naming the line on an error in the template (raise_exception's
 * message among them), NV_ERANGE past the limits; out then holds what it had. */
nv_err nv_jinja_render(const nv_jinja *j, const cJSON *vars, nv_buf *out);
/* The text it was parsed from (line breaks made "\n"; a last one dropped), NUL-terminated; NULL for NULL. */
const char *nv_jinja_source(const nv_jinja *j);
void nv_jinja_free(nv_jinja *j);

#endif
