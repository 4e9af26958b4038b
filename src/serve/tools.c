/* Tool calling (see tools.h). */
#include "serve/tools.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unictype.h>

#include "base/rng.h"
#include "base/timer.h"
#include "base/utf8.h"
#include "serve/schema.h"

/* ---- Python's json.dumps ---- */

size_t nv_json_escape(unsigned c, char out[8]) {
    switch (c) {
    case '"': return (size_t)snprintf(out, 8, "\\\"");
    case '\\': return (size_t)snprintf(out, 8, "\\\\");
    case '\n': return (size_t)snprintf(out, 8, "\\n");
    case '\r': return (size_t)snprintf(out, 8, "\\r");
    case '\t': return (size_t)snprintf(out, 8, "\\t");
    case '\b': return (size_t)snprintf(out, 8, "\\b");
    case '\f': return (size_t)snprintf(out, 8, "\\f");
    default: return c < 0x20 ? (size_t)snprintf(out, 8, "\\u%04x", c) : 0;
    }
}

void nv_json_string(nv_buf *b, const char *s) {
    nv_buf_puts(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        size_t n = nv_json_escape(*p, esc);
        if (n) nv_buf_append(b, esc, n);
        else nv_buf_append(b, p, 1);
    }
    nv_buf_puts(b, "\"");
}

static void py_newline(nv_buf *b, int indent, int depth) {
    nv_buf_puts(b, "\n");
    for (int i = 0; i < indent * depth; i++) nv_buf_puts(b, " ");
}

static void py_value(nv_buf *b, const cJSON *v, int indent, int depth) {
    if (cJSON_IsObject(v) || cJSON_IsArray(v)) {
        int obj = cJSON_IsObject(v);
        nv_buf_puts(b, obj ? "{" : "[");
        for (const cJSON *c = v->child; c; c = c->next) {
            if (c != v->child) nv_buf_puts(b, indent ? "," : ", ");
            if (indent) py_newline(b, indent, depth + 1);
            if (obj) {
                nv_json_string(b, c->string);
                nv_buf_puts(b, ": ");
            }
            py_value(b, c, indent, depth + 1);
        }
        if (indent && v->child) py_newline(b, indent, depth);
        nv_buf_puts(b, obj ? "}" : "]");
    } else if (cJSON_IsString(v)) {
        nv_json_string(b, v->valuestring);
    } else if (nv_json_is_float(v) && isfinite(v->valuedouble)) {
        nv_py_repr_float(b, v->valuedouble); /* 1.0 as json.dumps prints it (cJSON would print 1) */
    } else {
        char *t = cJSON_PrintUnformatted(v); /* numbers, true, false, null */
        if (!t) b->oom = 1;
        else nv_buf_puts(b, t);
        cJSON_free(t);
    }
}

void nv_py_json(nv_buf *b, const cJSON *v, int indent) { py_value(b, v, indent, 0); }

/* The next number literal of JSON text in [*p, end) (outside strings): its start and length; 0 at the end. */
static int next_number(const char **p, const char *end, const char **start, size_t *len) {
    for (const char *s = *p; s < end; s++) {
        if (*s == '"') { /* a string: to its closing quote */
            for (s++; s < end && *s != '"'; s++)
                if (*s == '\\' && s + 1 < end) s++;
            if (s >= end) break;
            continue;
        }
        if (*s == '-' || (*s >= '0' && *s <= '9')) {
            const char *e = s;
            while (e < end && *e && strchr("+-0123456789.eE", *e)) e++;
            *start = s, *len = (size_t)(e - s), *p = e;
            return 1;
        }
    }
    return 0;
}

static void mark_floats(cJSON *json, const char **p, const char *end) {
    for (cJSON *c = json ? json->child : NULL; c; c = c->next) {
        if (cJSON_IsNumber(c)) {
            const char *at;
            size_t n;
            if (!next_number(p, end, &at, &n)) return;
            if ((memchr(at, '.', n) || memchr(at, 'e', n) || memchr(at, 'E', n)) && !c->valuestring)
                c->valuestring = strndup(at, n); /* (no memory: printed as cJSON has it) */
        } else
            mark_floats(c, p, end);
    }
}

void nv_json_mark_floats(cJSON *json, const char *text, size_t n) {
    const char *p = text;
    if (json && text && (cJSON_IsObject(json) || cJSON_IsArray(json))) mark_floats(json, &p, text + n);
}

int nv_json_is_float(const cJSON *v) { return cJSON_IsNumber(v) && v->valuestring; }

/* ---- Python's repr: what `value | string` prints in a Jinja template that Python runs
 * (transformers, vLLM), the form SmolLM3's template gives each of its xml_tools ---- */

/* Whether Python's str.isprintable() holds for code point cp: outside Unicode's Other (Cc Cf Cs Co
   Cn) and Separator (Zl Zp Zs) categories, or the ASCII space. */
static int py_printable(uint32_t cp) {
    return cp == ' ' || (!uc_is_general_category((ucs4_t)cp, UC_CATEGORY_C) && !uc_is_general_category((ucs4_t)cp, UC_CATEGORY_Z));
}

/* A str: single quotes unless it holds one and no double quote; backslash escapes for that quote,
   the backslash and \n \r \t, and \xhh \uhhhh \Uhhhhhhhh for what is not printable (a byte that is
   not UTF-8, which the API refuses before, as \xhh). */
void nv_py_repr_str(nv_buf *b, const char *s) {
    const char q = strchr(s, '\'') && !strchr(s, '"') ? '"' : '\'';
    nv_buf_append(b, &q, 1);
    for (size_t i = 0, n = strlen(s), k; i < n; i += k) {
        uint32_t c;
        if (!(k = nv_utf8_get(s + i, s + n, &c))) {
            nv_buf_printf(b, "\\x%02x", (unsigned char)s[i]);
            k = 1;
        } else if (c == '\\' || c == (uint32_t)q) {
            nv_buf_printf(b, "\\%c", (char)c);
        } else if (c == '\n' || c == '\r' || c == '\t') {
            nv_buf_puts(b, c == '\n' ? "\\n" : c == '\r' ? "\\r" : "\\t");
        } else if (py_printable(c)) {
            nv_buf_append(b, s + i, k);
        } else {
            nv_buf_printf(b, c < 0x100 ? "\\x%02x" : c < 0x10000 ? "\\u%04x" : "\\U%08x", (unsigned)c);
        }
    }
    nv_buf_append(b, &q, 1);
}

/* A float as Python's repr: the shortest digits that read back as v, positional for decimal
   exponents -4 to 15 (with ".0" when whole), else d.ddde+XX. */
void nv_py_repr_float(nv_buf *b, double v) {
    if (isinf(v) || isnan(v)) { /* json.loads reads a literal out of range as inf */
        nv_buf_puts(b, isnan(v) ? "nan" : v < 0 ? "-inf" : "inf");
        return;
    }
    char e[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, v);
        if (strtod(e, NULL) == v) break;
    }
    /* e is [-]d[.ddd]e[+-]XX: its digits without the point and trailing zeros, and the exponent */
    const char *at = e;
    if (*at == '-') nv_buf_puts(b, "-"), at++;
    char digits[24];
    int nd = 0;
    for (; *at != 'e'; at++)
        if (*at != '.') digits[nd++] = *at;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    const int x = atoi(at + 1);
    if (x < -4 || x >= 16) {
        nv_buf_append(b, digits, 1);
        if (nd > 1) nv_buf_puts(b, "."), nv_buf_append(b, digits + 1, (size_t)nd - 1);
        nv_buf_printf(b, "e%c%02d", x < 0 ? '-' : '+', abs(x));
    } else if (x < 0) {
        nv_buf_puts(b, "0.");
        for (int i = 0; i < -x - 1; i++) nv_buf_puts(b, "0");
        nv_buf_append(b, digits, (size_t)nd);
    } else {
        for (int i = 0; i <= x; i++) nv_buf_append(b, i < nd ? digits + i : "0", 1);
        nv_buf_puts(b, ".");
        if (nd > x + 1) nv_buf_append(b, digits + x + 1, (size_t)(nd - x - 1));
        else nv_buf_puts(b, "0");
    }
}

static void py_repr(nv_buf *b, const cJSON *v) {
    if (cJSON_IsObject(v) || cJSON_IsArray(v)) {
        const int obj = cJSON_IsObject(v);
        nv_buf_puts(b, obj ? "{" : "[");
        for (const cJSON *c = v->child; c; c = c->next) {
            if (c != v->child) nv_buf_puts(b, ", ");
            if (obj) {
                nv_py_repr_str(b, c->string);
                nv_buf_puts(b, ": ");
            }
            py_repr(b, c);
        }
        nv_buf_puts(b, obj ? "}" : "]");
    } else if (cJSON_IsString(v)) {
        nv_py_repr_str(b, v->valuestring);
    } else if (cJSON_IsNumber(v)) {
        /* whole values within 2^53 as ints: cJSON keeps no literal, and json.loads makes ints of the
           literals without a point or an exponent that such values mostly come from */
        const double d = v->valuedouble;
        if (d == floor(d) && fabs(d) < 0x1p53) nv_buf_printf(b, "%.0f", d == 0 ? 0.0 : d);
        else nv_py_repr_float(b, d);
    } else {
        nv_buf_puts(b, cJSON_IsTrue(v) ? "True" : cJSON_IsFalse(v) ? "False" : "None");
    }
}

void nv_py_repr(nv_buf *b, const cJSON *v) { py_repr(b, v); }

/* ---- calls ---- */

void nv_tool_calls_free(nv_tool_call *calls, int n) {
    for (int i = 0; i < n; i++) free(calls[i].name), free(calls[i].arguments);
    free(calls);
}

/* OpenAI's form, "call_" and 24 letters and digits; Mistral's, 9 letters and digits (its template
   takes no other). */
static void call_id(char *out, nv_tool_style style) {
    static _Atomic uint64_t counter;
    static const char digits[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    nv_rng r;
    nv_rng_seed(&r, ((uint64_t)(nv_now() * 1e9) << 9) ^ atomic_fetch_add(&counter, 1) * 0x9E3779B97F4A7C15ull);
    const int mistral = style == NV_TOOLS_MISTRAL || nv_tool_style_mistral_args(style), at = mistral ? 0 : 5,
              n = mistral ? NV_MISTRAL_ID_LEN : 24;
    memcpy(out, "call_", (size_t)at);
    for (int i = 0; i < n; i++) out[at + i] = digits[nv_xorshift_u32(&r.state) % 62];
    out[at + n] = '\0';
}

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

cJSON *nv_json_parse_whole(const char *text, size_t n) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, n, &end, 0);
    while (j && end && end < text + n && is_ws(*end)) end++;
    if (j && end != text + n) {
        cJSON_Delete(j);
        j = NULL;
    }
    nv_json_mark_floats(j, text, n);
    return j;
}

int nv_tool_mistral_id(const char *id, size_t n) {
    if (n != NV_MISTRAL_ID_LEN) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((id[i] >= 'a' && id[i] <= 'z') || (id[i] >= 'A' && id[i] <= 'Z') || (id[i] >= '0' && id[i] <= '9'))) return 0;
    return 1;
}

/* *out: a call of the tool name (n bytes) with args (NULL: none) as compact JSON text and a new id,
 * or the model's own (id, id_n bytes) where it wrote a Mistral one; 1, or -1 when out of memory. */
static int make_call_id(nv_tool_style style, const char *name, size_t n, const cJSON *args, const char *id, size_t id_n,
                        nv_tool_call *out) {
    memset(out, 0, sizeof *out);
    if (id && nv_tool_mistral_id(id, id_n)) memcpy(out->id, id, id_n), out->id[id_n] = '\0';
    else call_id(out->id, style);
    out->name = strndup(name, n);
    out->arguments = args ? cJSON_PrintUnformatted(args) : strdup("{}");
    if (out->name && out->arguments) return 1;
    free(out->name);
    free(out->arguments);
    return -1;
}

static int make_call(nv_tool_style style, const char *name, size_t n, const cJSON *args, nv_tool_call *out) {
    return make_call_id(style, name, n, args, NULL, 0, out);
}

/* 1 when name (n bytes) is one of the request's tools. */
static int known_tool(const nv_tool_parser *p, const char *name, size_t n) {
    for (int i = 0; i < p->n_names; i++)
        if (strlen(p->names[i]) == n && !memcmp(p->names[i], name, n)) return 1;
    return 0;
}

/* A call from its JSON: {"name": a known tool, ARGS: object or its JSON text}; 1 when it is one,
 * -1 when out of memory. */
static int call_of_json(const nv_tool_parser *p, const cJSON *j, nv_tool_call *out) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(j, "arguments");
    if (!args && p->style == NV_TOOLS_LLAMA3) args = cJSON_GetObjectItemCaseSensitive(j, "parameters");
    const int known = cJSON_IsString(name) && known_tool(p, name->valuestring, strlen(name->valuestring));
    cJSON *parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
    const cJSON *obj = parsed ? parsed : args;
    int ok = cJSON_IsObject(j) && known && (!args || cJSON_IsObject(obj));
    if (ok) ok = make_call(p->style, name->valuestring, strlen(name->valuestring), obj, out);
    cJSON_Delete(parsed);
    return ok;
}

/* Appends c (taken: freed when out of memory, -1). */
static int add_call(nv_tool_call **calls, int *n, const nv_tool_call *c) {
    nv_tool_call *v = realloc(*calls, (size_t)(*n + 1) * sizeof *v);
    if (!v) {
        free(c->name);
        free(c->arguments);
        return -1;
    }
    *calls = v;
    v[(*n)++] = *c;
    return 0;
}

/* Drops the last made calls (a list or block that turned out not to be calls). */
static void take_back(nv_tool_call *calls, int *n_calls, int made) {
    for (int i = *n_calls - made; i < *n_calls; i++) free(calls[i].name), free(calls[i].arguments);
    *n_calls -= made;
}

/* ---- calls written as XML (Qwen3-Coder's) ---- */

/* The parameters schema of the request's tool named name (NULL: none given). */
static const cJSON *tool_params(const nv_tool_parser *p, const char *name, size_t n) {
    for (const cJSON *t = p->tools ? p->tools->child : NULL; t; t = t->next) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const char *tn = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(fn, "name"));
        if (tn && strlen(tn) == n && !memcmp(tn, name, n)) return cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    }
    return NULL;
}

/* A parameter's text (s, n bytes) as the value its schema (in params) admits: a string as it is
 * where only strings are admitted or the schema does not say; else the value the text is, when its
 * kind is admitted (JSON's; "true"/"false" in any case for a boolean, "null"/"None" in any case for
 * null, as Python's str() writes them in a conversation's earlier calls); else the text as a string.
 * A string is always the text as written, never a JSON string literal unwrapped. */
static cJSON *xml_value(const cJSON *schema, const cJSON *params, const char *s, size_t n) {
    const unsigned kinds = schema ? nv_schema_kinds(schema, params) : 0;
    if (kinds && kinds != NV_KIND_STRING) {
        if ((kinds & NV_KIND_BOOLEAN) && ((n == 4 && !strncasecmp(s, "true", 4)) || (n == 5 && !strncasecmp(s, "false", 5))))
            return cJSON_CreateBool(n == 4);
        if ((kinds & NV_KIND_NULL) && ((n == 4 && !strncasecmp(s, "null", 4)) || (n == 4 && !strncasecmp(s, "none", 4))))
            return cJSON_CreateNull();
        cJSON *v = nv_json_parse_whole(s, n);
        if (v && !cJSON_IsString(v) && (nv_json_kinds(v) & kinds)) return v; /* (a string is the text itself) */
        cJSON_Delete(v);
    }
    char *text = strndup(s, n);
    cJSON *v = text ? cJSON_CreateString(text) : NULL;
    free(text);
    return v;
}

static const char *skip_ws(const char *s, const char *end) {
    while (s < end && is_ws(*s)) s++;
    return s;
}

static int starts(const char *s, const char *end, const char *lit) {
    size_t n = strlen(lit);
    return (size_t)(end - s) >= n && !memcmp(s, lit, n);
}

static const char *find(const char *s, const char *end, const char *lit) { return memmem(s, (size_t)(end - s), lit, strlen(lit)); }

/* Where a parameter's value that begins at v ends: the first "</parameter>" after it (*after: past
 * it), since a value may hold "<parameter=" or "</function>" (the grammar lets it); one never closed
 * ends at the next "<parameter=", "</function>" or the end (*after: there). vLLM ends every value at
 * the first of the three, which a value holding either text breaks. */
static const char *value_end(const char *v, const char *end, const char **after) {
    const char *close = find(v, end, "</parameter>");
    if (close) return *after = close + 12, close;
    const char *e = end, *np = find(v, end, "<parameter="), *fe = find(v, end, "</function>");
    if (np && np < e) e = np;
    if (fe && fe < e) e = fe;
    return *after = e, e;
}

/* In a block of calls written as XML (s, n bytes after <tool_call>): where its </tool_call> is, read
 * past the functions and values (which may hold that text); NULL while the text so far cannot say
 * (final: the first after where the reading stops, or NULL). */
static const char *xml_block_end(const char *s, size_t n, int final) {
    const char *p = s, *end = s + n;
    for (;;) {
        p = skip_ws(p, end);
        if (starts(p, end, "</tool_call>")) return p;
        if (starts(p, end, "</function>")) {
            p += 11;
            continue;
        }
        const int fn = starts(p, end, "<function="), par = starts(p, end, "<parameter=");
        const char *gt = fn || par ? memchr(p, '>', (size_t)(end - p)) : NULL;
        const char *close = par && gt ? find(gt, end, "</parameter>") : NULL;
        if (fn && gt) p = gt + 1;
        else if (close) p = close + 12;
        else if (!final && (fn || par)) return NULL; /* more may come that decides */
        else return find(p, end, "</tool_call>");
    }
}

static int could_become(const char *s, const char *end, const char *lit) {
    return (size_t)(end - s) < strlen(lit) && !memcmp(s, lit, (size_t)(end - s));
}

/* A call written as XML without its <tool_call> (s, n bytes from "<function="; vLLM reads these too):
 * where it ends, past its </function>; NULL while the text so far cannot say (final: NULL, the rest
 * is the call). */
static const char *xml_bare_end(const char *s, size_t n, int final) {
    const char *p = s, *end = s + n, *gt = memchr(s, '>', n);
    if (!gt) return NULL;
    for (p = gt + 1;;) {
        p = skip_ws(p, end);
        const char *close = starts(p, end, "<parameter=") ? find(p, end, "</parameter>") : NULL;
        if (close) p = close + 12;
        else if (starts(p, end, "</function>")) return p + 11;
        else if (!final && (starts(p, end, "<parameter=") || could_become(p, end, "<parameter=") || could_become(p, end, "</function>")))
            return NULL;
        else return final && p == end ? NULL : p; /* its </function> left out: it ends here */
    }
}

/* The calls of a block written as XML (text, n bytes inside <tool_call>...</tool_call>): one or more
 * <function=NAME>\n(<parameter=KEY>\nVALUE\n</parameter>\n)*</function> with white space around
 * (one line break at each end of a value is the form's, not the value's; a parameter written twice is
 * the last; an unclosed function ends at the next or at the block's end); all of them calls of
 * known tools, added to *calls, or none: 1, 0 (not calls), -1 (out of memory). */
static int xml_calls(nv_tool_parser *p, const char *text, size_t n, nv_tool_call **calls, int *n_calls) {
    const char *s = skip_ws(text, text + n), *end = text + n;
    int ok = starts(s, end, "<function="), made = 0;
    while (ok > 0 && s < end) {
        s += 10;
        const char *gt = memchr(s, '>', (size_t)(end - s));
        if (!gt || gt == s || memchr(s, '\n', (size_t)(gt - s))) {
            ok = 0;
            break;
        }
        const char *name = s;
        const size_t name_n = (size_t)(gt - s);
        const int known = known_tool(p, name, name_n);
        const cJSON *params = tool_params(p, name, name_n), *props = cJSON_GetObjectItemCaseSensitive(params, "properties");
        const cJSON *add = cJSON_GetObjectItemCaseSensitive(params, "additionalProperties");
        cJSON *args = known ? cJSON_CreateObject() : NULL;
        ok = !known ? 0 : args ? 1 : -1;
        for (s = gt + 1; ok > 0;) {
            s = skip_ws(s, end);
            if (starts(s, end, "</function>")) {
                s = skip_ws(s + 11, end);
                break;
            }
            if (s == end || starts(s, end, "<function=")) break; /* its </function> left out */
            if (!starts(s, end, "<parameter=")) {
                ok = 0;
                break;
            }
            s += 11;
            const char *kgt = memchr(s, '>', (size_t)(end - s));
            if (!kgt || kgt == s || memchr(s, '\n', (size_t)(kgt - s))) {
                ok = 0;
                break;
            }
            const char *v = kgt + 1, *next, *ve = value_end(v, end, &next);
            if (v < ve && *v == '\n') v++;
            if (ve > v && ve[-1] == '\n') ve--;
            char *key = strndup(s, (size_t)(kgt - s));
            const cJSON *schema = key ? cJSON_GetObjectItemCaseSensitive(props, key) : NULL;
            cJSON *value = key ? xml_value(schema ? schema : cJSON_IsObject(add) ? add : NULL, params, v, (size_t)(ve - v)) : NULL;
            if (!value) ok = -1;
            else if (cJSON_GetObjectItemCaseSensitive(args, key)) { /* the last one written */
                if (!cJSON_ReplaceItemInObjectCaseSensitive(args, key, value)) cJSON_Delete(value), ok = -1;
            } else if (!cJSON_AddItemToObject(args, key, value))
                cJSON_Delete(value), ok = -1;
            free(key);
            s = next;
        }
        nv_tool_call c;
        if (ok > 0) ok = make_call(p->style, name, name_n, args, &c);
        if (ok > 0 && add_call(calls, n_calls, &c) < 0) ok = -1;
        made += ok > 0;
        cJSON_Delete(args);
        if (ok > 0 && s < end && !starts(s, end, "<function=")) ok = 0; /* text after the calls */
    }
    if (ok <= 0) take_back(*calls, n_calls, made);
    else p->n_calls += made - 1; /* the caller counts one */
    return ok;
}

/* A call from JSON text (only white space may follow it). */
static int parse_call(const nv_tool_parser *p, const char *text, size_t n, nv_tool_call *out) {
    cJSON *j = nv_json_parse_whole(text, n);
    int ok = call_of_json(p, j, out);
    cJSON_Delete(j);
    return ok;
}

enum { OUTSIDE = 0, IN_CALL, DECIDING, PLAIN };

static int feed_hermes(nv_tool_parser *p, int final, nv_buf *content, nv_tool_call **calls, int *n_calls) {
    static const char open[] = "<tool_call>", close[] = "</tool_call>";
    const char *h = p->hold.data ? p->hold.data : "";
    size_t len = p->hold.len, used = 0;
    int rc = 0;
    for (;;) {
        const char *s = h + used;
        size_t left = len - used;
        if (p->after_call) { /* the white space between calls, or after the last */
            while (left && is_ws(*s)) s++, left--, used++;
            if (!left) break;
            p->after_call = 0;
        }
        if (p->state == OUTSIDE) {
            const char *at = memmem(s, left, open, sizeof open - 1);
            const char *bare = p->style == NV_TOOLS_XML ? memmem(s, left, "<function=", 10) : NULL; /* a call without its tag */
            p->bare = bare && (!at || bare < at);
            if (p->bare) at = bare;
            if (at) {
                size_t k = (size_t)(at - s), keep = k;
                while (keep && is_ws(s[keep - 1])) keep--; /* the white space before a call goes... */
                nv_buf_append(content, s, keep);
                nv_buf_append(&p->ws, s + keep, k - keep); /* ...unless the block turns out not to be one */
                used += k + (p->bare ? 0 : sizeof open - 1);
                p->state = IN_CALL;
                continue;
            }
            /* hold back what may still begin a call: a piece of the tag, and white space before it */
            size_t part = nv_partial_tag(s, left, open);
            if (p->style == NV_TOOLS_XML && nv_partial_tag(s, left, "<function=") > part) part = nv_partial_tag(s, left, "<function=");
            size_t keep = final ? left : left - part;
            size_t emit = keep;
            if (!final || p->n_calls)
                while (emit && is_ws(s[emit - 1])) emit--;
            if (emit && p->ws.len) nv_buf_append(content, p->ws.data, p->ws.len); /* blank held before text */
            nv_buf_consume(&p->ws, emit ? p->ws.len : 0);
            nv_buf_append(content, s, emit);
            used += emit;
            break;
        }
        /* IN_CALL */
        const char *first = skip_ws(s, s + left);
        const int xml = p->style == NV_TOOLS_XML && (first == s + left || *first != '{'); /* else Hermes's JSON */
        const char *end = p->bare ? xml_bare_end(s, left, final) : xml ? xml_block_end(s, left, final) : memmem(s, left, close, sizeof close - 1);
        if (!end && !final) break;
        size_t body = end ? (size_t)(end - s) : left;
        const size_t closing = end && !p->bare ? sizeof close - 1 : 0; /* a bare call's end is its own */
        nv_tool_call c;
        int ok = xml ? xml_calls(p, s, body, calls, n_calls) : parse_call(p, s, body, &c);
        if (!xml && ok > 0 && add_call(calls, n_calls, &c) < 0) ok = -1;
        if (ok < 0) {
            rc = -1;
            break;
        }
        if (ok) {
            p->n_calls++;
            p->after_call = 1;
            nv_buf_consume(&p->ws, p->ws.len);
        } else { /* not a call after all: the block as it was written, with the blank before it */
            nv_buf_append(content, p->ws.data ? p->ws.data : "", p->ws.len);
            nv_buf_consume(&p->ws, p->ws.len);
            if (!p->bare) nv_buf_append(content, open, sizeof open - 1);
            nv_buf_append(content, s, body);
            nv_buf_append(content, close, closing);
        }
        used += body + closing;
        p->state = OUTSIDE;
        if (!end) break;
    }
    nv_buf_consume(&p->hold, used);
    return rc;
}

static int feed_llama3(nv_tool_parser *p, int final, nv_buf *content, nv_tool_call **calls, int *n_calls) {
    const char *h = p->hold.data ? p->hold.data : "";
    size_t len = p->hold.len, ws = 0;
    if (p->state == OUTSIDE) { /* the first character decides: '{' may be a call */
        while (ws < len && is_ws(h[ws])) ws++;
        if (ws == len && !final) return 0;
        p->state = ws < len && h[ws] == '{' ? DECIDING : PLAIN;
    }
    if (p->state == PLAIN) {
        nv_buf_append(content, h, len);
        nv_buf_consume(&p->hold, len);
        return 0;
    }
    if (!final) return 0;
    nv_tool_call c;
    int ok = parse_call(p, h, len, &c);
    if (ok > 0 && add_call(calls, n_calls, &c) < 0) return -1;
    if (ok < 0) return -1;
    if (ok) p->n_calls++;
    else nv_buf_append(content, h, len);
    nv_buf_consume(&p->hold, len);
    return 0;
}

/* The calls after Granite's or Mistral's marker: a JSON list of calls (or one call); every element
 * must be one, else none is (1: calls added, 0: not calls, -1: out of memory). */
static int listed_calls(nv_tool_parser *p, const char *text, size_t n, nv_tool_call **calls, int *n_calls) {
    cJSON *j = nv_json_parse_whole(text, n);
    int ok = j != NULL, made = 0;
    for (const cJSON *e = cJSON_IsArray(j) ? j->child : j; ok > 0 && e; e = e->next) {
        nv_tool_call c;
        ok = call_of_json(p, e, &c);
        if (ok > 0 && add_call(calls, n_calls, &c) < 0) ok = -1;
        made += ok > 0;
    }
    if (ok <= 0) take_back(*calls, n_calls, made);
    else p->n_calls += made;
    cJSON_Delete(j);
    return ok;
}

/* Mistral's later calls after their first [TOOL_CALLS] (text, n bytes): NAME[ARGS]{...} or
 * NAME[CALL_ID]ID[ARGS]{...} (the model's ID kept where it is a Mistral id not given to an earlier
 * call of the answer: the next turn's template writes it again, and a result names its call by it;
 * an ID holding another marker is no call), each further one after its own [TOOL_CALLS], white
 * space between; every one a call of a known tool with an object, else none is (1, 0, -1 as
 * listed_calls). */
static int args_calls(nv_tool_parser *p, const char *text, size_t n, nv_tool_call **calls, int *n_calls) {
    const char *s = text, *end = text + n;
    int ok = 1, made = 0;
    while (ok > 0) {
        const char *a = find(s, end, NV_MISTRAL_ARGS), *j_end = NULL;
        const char *j = a ? a + strlen(NV_MISTRAL_ARGS) : NULL;
        const char *id = a ? find(s, a, NV_MISTRAL_CALL_ID) : NULL, *name_end = id ? id : a;
        if (id) id += strlen(NV_MISTRAL_CALL_ID);
        size_t id_n = id ? (size_t)(a - id) : 0;
        if (id && memchr(id, '[', id_n)) { /* [TOOL_CALLS] or [CALL_ID] again before [ARGS]: not calls */
            ok = 0;
            break;
        }
        for (int k = 0; id && k < *n_calls; k++)
            if (strlen((*calls)[k].id) == id_n && !memcmp((*calls)[k].id, id, id_n)) id = NULL, id_n = 0; /* a new one */
        cJSON *args = a && known_tool(p, s, (size_t)(name_end - s)) ? cJSON_ParseWithLengthOpts(j, (size_t)(end - j), &j_end, 0) : NULL;
        nv_tool_call c;
        ok = cJSON_IsObject(args) ? make_call_id(p->style, s, (size_t)(name_end - s), args, id, id_n, &c) : 0;
        if (ok > 0 && add_call(calls, n_calls, &c) < 0) ok = -1;
        made += ok > 0;
        cJSON_Delete(args);
        if (ok <= 0) break;
        s = skip_ws(j_end, end);
        if (s == end) break;
        if (starts(s, end, NV_MISTRAL_TOOL_CALLS)) s += strlen(NV_MISTRAL_TOOL_CALLS);
        else ok = 0; /* text after the calls */
    }
    if (ok <= 0) take_back(*calls, n_calls, made);
    else p->n_calls += made;
    return ok;
}

/* Granite's, Mistral's: the answer's text, then the marker (tag) and its calls, which read reads, to
 * the end of the answer. */
static int feed_list(nv_tool_parser *p, const char *tag, int (*read)(nv_tool_parser *, const char *, size_t, nv_tool_call **, int *),
                     int final, nv_buf *content, nv_tool_call **calls, int *n_calls) {
    const size_t tag_len = strlen(tag);
    const char *h = p->hold.data ? p->hold.data : "";
    size_t len = p->hold.len;
    if (p->state == OUTSIDE) {
        const char *at = memmem(h, len, tag, tag_len);
        size_t k = at ? (size_t)(at - h) : final ? len : len - nv_partial_tag(h, len, tag), keep = k;
        if (at || !final) /* the white space before a call goes (held back while one may come) */
            while (keep && is_ws(h[keep - 1])) keep--;
        nv_buf_append(content, h, keep);
        if (!at) {
            nv_buf_consume(&p->hold, keep);
            return 0;
        }
        nv_buf_append(&p->ws, h + keep, k - keep);
        nv_buf_consume(&p->hold, k + tag_len);
        p->state = IN_CALL;
    }
    if (!final) return 0;
    h = p->hold.data ? p->hold.data : "";
    len = p->hold.len;
    int ok = read(p, h, len, calls, n_calls);
    if (ok < 0) return -1;
    if (!ok) { /* not calls after all: as written, with the blank before the marker */
        nv_buf_append(content, p->ws.data ? p->ws.data : "", p->ws.len);
        nv_buf_puts(content, tag);
        nv_buf_append(content, h, len);
    }
    nv_buf_consume(&p->ws, p->ws.len);
    nv_buf_consume(&p->hold, len);
    p->state = OUTSIDE;
    return 0;
}

int nv_tool_parser_feed(nv_tool_parser *p, const char *s, size_t n, int final, nv_buf *content, nv_tool_call **calls,
                        int *n_calls) {
    nv_buf_append(&p->hold, s, n);
    if (p->hold.oom) return -1;
    int rc = p->style == NV_TOOLS_LLAMA3    ? feed_llama3(p, final, content, calls, n_calls)
             : p->style == NV_TOOLS_GRANITE || p->style == NV_TOOLS_PHI4_MINI ? feed_list(p, NV_GRANITE_TOOL_CALL, listed_calls, final, content, calls, n_calls)
             : p->style == NV_TOOLS_MISTRAL ? feed_list(p, NV_MISTRAL_TOOL_CALLS, listed_calls, final, content, calls, n_calls)
             : nv_tool_style_mistral_args(p->style) ? feed_list(p, NV_MISTRAL_TOOL_CALLS, args_calls, final, content, calls, n_calls)
                                            : feed_hermes(p, final, content, calls, n_calls);
    return rc < 0 || content->oom ? -1 : 0;
}

void nv_tool_parser_free(nv_tool_parser *p) {
    nv_buf_free(&p->hold);
    nv_buf_free(&p->ws);
    memset(p, 0, sizeof *p);
}
