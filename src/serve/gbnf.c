/* GBNF (llama.cpp's grammar format) to byte grammars: see gbnf.h. A recursive-descent parser that
 * writes each element as a rule of the builder as it reads it. */
#include "serve/gbnf.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "serve/schema.h"

#define MAX_COUNT 1000  /* {n,m} bounds: each optional repetition is a rule */
#define MAX_DEPTH 64    /* nested groups */
#define MAX_CLASS 4096  /* ranges in one class */
/* An untrusted grammar is bounded before it is built: its text, its named rules (names are found by
 * a scan, and nullability settles in up to one pass per rule), and the builder's elements as they
 * grow ({0,1000} makes a thousand rules of a few bytes of text). */
#define MAX_TEXT (64 << 10)
#define MAX_NAMES 4096

typedef struct {
    char name[64];
    int id, defined;
    const char *first_use; /* where it was first referred to, for the error */
} gname;

typedef struct {
    nv_gbuild *b;
    const char *text, *p;
    gname *names;
    int n, cap, depth;
    nv_err err;
} gp;

/* Records the first error, at the parser's position, and returns 0. */
static int gp_fail_at(gp *g, const char *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int gp_fail_at(gp *g, const char *at, const char *fmt, ...) {
    if (g->err != NV_OK) return 0;
    int line = 1, col = 1;
    for (const char *s = g->text; s < at; s++) *s == '\n' ? (line++, col = 1) : col++;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    g->err = nv_fail(NV_EINVAL, "line %d, column %d: %s", line, col, msg);
    return 0;
}
#define gp_fail(g, ...) gp_fail_at(g, (g)->p, __VA_ARGS__)

/* c as a message shows it: itself when printable ASCII, else \xHH (a message is one line). */
static const char *printable(unsigned char c, char out[8]) {
    if (c >= 0x20 && c < 0x7F) snprintf(out, 8, "%c", c);
    else snprintf(out, 8, "\\x%02X", c);
    return out;
}

static int word_char(char c) { return isalnum((unsigned char)c) || c == '-' || c == '_'; }

/* Spaces, tabs and comments; newlines too when newline_ok. */
static void skip_space(gp *g, int newline_ok) {
    for (;;) {
        const char c = *g->p;
        if (c == ' ' || c == '\t') g->p++;
        else if (c == '#')
            while (*g->p && *g->p != '\n') g->p++;
        else if (newline_ok && (c == '\n' || c == '\r')) g->p++;
        else return;
    }
}

/* The rule id of a name, reserved on first sight. */
static int name_id(gp *g, const char *s, size_t n) {
    for (int i = 0; i < g->n; i++)
        if (strlen(g->names[i].name) == n && !memcmp(g->names[i].name, s, n)) return i;
    if (n >= sizeof g->names[0].name) return gp_fail_at(g, s, "a rule name longer than 63 characters"), -1;
    if (g->n == MAX_NAMES) return gp_fail_at(g, s, "more than %d rule names", MAX_NAMES), -1;
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 32;
        gname *p = realloc(g->names, (size_t)cap * sizeof *p);
        if (!p) return g->err = nv_fail(NV_ENOMEM, "out of memory"), -1;
        g->names = p, g->cap = cap;
    }
    gname *e = &g->names[g->n];
    memset(e, 0, sizeof *e);
    memcpy(e->name, s, n);
    e->id = nv_gbuild_reserve(g->b);
    e->first_use = s;
    return g->n++;
}

static int hex_digits(gp *g, int n, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < n; i++, g->p++) {
        if (!isxdigit((unsigned char)*g->p)) return gp_fail(g, "\\x, \\u and \\U take %d hex digits", n);
        v = v * 16 + (uint32_t)(isdigit((unsigned char)*g->p) ? *g->p - '0' : tolower((unsigned char)*g->p) - 'a' + 10);
    }
    *out = v;
    return 1;
}

/* One character of a literal or class: an escape or a UTF-8 code point. */
static int parse_char(gp *g, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)g->p;
    if (*u == '\\') {
        g->p += 2;
        switch (u[1]) {
        case 'x': return hex_digits(g, 2, cp);
        case 'u': return hex_digits(g, 4, cp) && (*cp < 0xD800 || *cp > 0xDFFF || gp_fail(g, "a surrogate code point"));
        case 'U': return hex_digits(g, 8, cp) && (*cp <= 0x10FFFF || gp_fail(g, "a code point past U+10FFFF")) &&
                         (*cp < 0xD800 || *cp > 0xDFFF || gp_fail(g, "a surrogate code point"));
        case 't': *cp = '\t'; return 1;
        case 'n': *cp = '\n'; return 1;
        case 'r': *cp = '\r'; return 1;
        case '\\': case '"': case '[': case ']': case '-': case '^': case '/': *cp = u[1]; return 1;
        default: {
            char shown[8];
            g->p -= 2;
            return gp_fail(g, "an unknown escape '\\%s'", printable(u[1], shown));
        }
        }
    }
    const size_t n = nv_utf8_get(g->p, NULL, cp);
    if (!n) return gp_fail(g, "not UTF-8 text");
    g->p += n;
    return 1;
}

/* "..." as a rule of its bytes. */
static int parse_literal(gp *g) {
    const char *open = g->p++;
    nv_gbody body = {0};
    char buf[4];
    while (*g->p != '"') {
        uint32_t cp;
        if (!*g->p || *g->p == '\n') return nv_gbody_free(&body), gp_fail_at(g, open, "a '\"' without its closing '\"'");
        if (!parse_char(g, &cp)) return nv_gbody_free(&body), 0;
        nv_gbody_lit(g->b, &body, buf, nv_utf8_put(cp, buf));
    }
    g->p++;
    return nv_gbuild_add(g->b, &body);
}

/* [...] or [^...] as a rule matching one code point. */
static int parse_class(gp *g) {
    const char *open = g->p++;
    const int negate = *g->p == '^';
    if (negate) g->p++;
    uint32_t(*r)[2] = malloc(MAX_CLASS * sizeof *r);
    if (!r) return g->err = nv_fail(NV_ENOMEM, "out of memory"), 0;
    int n = 0;
    while (*g->p != ']') {
        if (!*g->p || *g->p == '\n') return free(r), gp_fail_at(g, open, "a '[' without its ']'");
        if (n == MAX_CLASS) return free(r), gp_fail(g, "a class of more than %d ranges", MAX_CLASS);
        uint32_t lo, hi;
        if (!parse_char(g, &lo)) return free(r), 0;
        hi = lo;
        if (*g->p == '-' && g->p[1] && g->p[1] != ']' && g->p[1] != '\n') {
            g->p++;
            if (!parse_char(g, &hi)) return free(r), 0;
            if (hi < lo) return free(r), gp_fail(g, "a class range that runs backwards");
        }
        r[n][0] = lo, r[n][1] = hi, n++;
    }
    g->p++;
    int id = nv_gbuild_codepoints(g->b, (const uint32_t(*)[2])r, n, negate);
    free(r);
    return id;
}

static long count(gp *g) {
    char *end;
    long v = strtol(g->p, &end, 10);
    if (end == g->p || v < 0 || v > MAX_COUNT) return gp_fail(g, "a repetition count from 0 to %d", MAX_COUNT), -1;
    g->p = end;
    return v;
}

static int parse_alternates(gp *g, int nested);

/* One element, then its repetition if any, as a rule. */
static int parse_element(gp *g, int nested) {
    int atom;
    const char c = *g->p;
    if (c == '"') atom = parse_literal(g);
    else if (c == '[') atom = parse_class(g);
    else if (c == '.') {
        g->p++;
        atom = nv_gbuild_codepoints(g->b, NULL, 0, 1);
    } else if (c == '(') {
        const char *open = g->p++;
        if (++g->depth > MAX_DEPTH) return gp_fail(g, "groups nested deeper than %d", MAX_DEPTH);
        skip_space(g, 1);
        atom = parse_alternates(g, 1);
        g->depth--;
        if (g->err != NV_OK) return 0;
        if (*g->p != ')') return gp_fail_at(g, open, "a '(' without its ')'");
        g->p++;
    } else if (word_char(c)) {
        const char *s = g->p;
        while (word_char(*g->p)) g->p++;
        const int k = name_id(g, s, (size_t)(g->p - s));
        atom = k >= 0 ? g->names[k].id : 0;
    } else {
        char shown[8];
        return gp_fail(g, "expected an element (\"literal\", [class], ., a rule name or a group), found '%s'", printable(c, shown));
    }
    if (g->err != NV_OK) return 0;
    skip_space(g, nested);
    long min = -1, max = -1;
    if (*g->p == '*') min = 0, g->p++;
    else if (*g->p == '+') min = 1, g->p++;
    else if (*g->p == '?') min = 0, max = 1, g->p++;
    else if (*g->p == '{') {
        g->p++;
        skip_space(g, nested);
        if ((min = count(g)) < 0) return 0;
        skip_space(g, nested);
        max = min;
        if (*g->p == ',') {
            g->p++;
            skip_space(g, nested);
            max = *g->p == '}' ? -1 : count(g);
            if (g->err != NV_OK) return 0;
            if (max >= 0 && max < min) return gp_fail(g, "a repetition {n,m} with m below n");
            skip_space(g, nested);
        }
        if (*g->p != '}') return gp_fail(g, "a '{' without its '}'");
        g->p++;
    } else return atom;
    skip_space(g, nested);
    return nv_gbuild_repeat(g->b, atom, min, max);
}

/* Alternatives separated by '|'; a sequence ends at '|', ')', the end, or (not nested) a line's end. */
static int parse_alternates(gp *g, int nested) {
    nv_gbody body = {0};
    for (int first = 1;; first = 0) {
        if (!first) nv_gbody_alt(&body);
        while (*g->p && *g->p != '|' && *g->p != ')' && *g->p != '\n' && *g->p != '\r' && g->err == NV_OK) {
            const int e = parse_element(g, nested);
            if (g->err == NV_OK) nv_gbody_ref(&body, e);
            if (g->err == NV_OK && nv_gbuild_size(g->b) > NV_GRAMMAR_MAX_ELEMS)
                gp_fail(g, "the grammar grows past %d elements (long or many counted repetitions)", NV_GRAMMAR_MAX_ELEMS);
            skip_space(g, nested);
        }
        if (g->err != NV_OK) break;
        if (*g->p != '|') break;
        g->p++;
        skip_space(g, 1);
    }
    if (g->err != NV_OK) {
        nv_gbody_free(&body);
        return 0;
    }
    return nv_gbuild_add(g->b, &body);
}

nv_err nv_gbnf_grammar(const char *text, int think, nv_grammar **out) {
    *out = NULL;
    gp g = {.text = text, .p = text};
    if (strlen(text) > MAX_TEXT) return nv_fail(NV_EINVAL, "a grammar longer than %d bytes is not supported", MAX_TEXT);
    if (!(g.b = nv_gbuild_new())) return nv_fail(NV_ENOMEM, "out of memory");
    for (skip_space(&g, 1); *g.p && g.err == NV_OK; skip_space(&g, 1)) {
        const char *s = g.p;
        while (word_char(*g.p)) g.p++;
        if (g.p == s) {
            gp_fail(&g, "expected a rule name");
            break;
        }
        const int k = name_id(&g, s, (size_t)(g.p - s));
        if (k < 0) break;
        if (g.names[k].defined) {
            gp_fail_at(&g, s, "rule '%s' is defined twice", g.names[k].name);
            break;
        }
        skip_space(&g, 0);
        if (strncmp(g.p, "::=", 3)) {
            gp_fail(&g, "expected '::=' after the rule name '%s'", g.names[k].name);
            break;
        }
        g.p += 3;
        skip_space(&g, 1);
        const int body = parse_alternates(&g, 0);
        if (g.err != NV_OK) break;
        if (*g.p == ')') {
            gp_fail(&g, "a ')' without its '('");
            break;
        }
        g.names[k].defined = 1;
        nv_gbuild_name(g.b, g.names[k].id, g.names[k].name);
        nv_gbuild_name(g.b, body, g.names[k].name);
        nv_gbody ref = {0};
        nv_gbody_ref(&ref, body);
        nv_gbuild_define(g.b, g.names[k].id, &ref);
    }
    int root = -1;
    for (int i = 0; i < g.n && g.err == NV_OK; i++) {
        if (!g.names[i].defined) gp_fail_at(&g, g.names[i].first_use, "rule '%s' is used but not defined", g.names[i].name);
        if (!strcmp(g.names[i].name, "root")) root = g.names[i].id;
    }
    if (g.err == NV_OK && root < 0) g.err = nv_fail(NV_EINVAL, "no rule named 'root' (the grammar's texts are root's)");
    free(g.names);
    if (g.err != NV_OK) {
        nv_gbuild_free(g.b);
        return g.err;
    }
    if (think) {
        nv_gbody body = {0};
        nv_gbody_ref(&body, nv_think_block_rule(g.b, think));
        nv_gbody_ref(&body, root);
        root = nv_gbuild_add(g.b, &body);
    }
    return nv_gbuild_finish(g.b, root, out);
}
