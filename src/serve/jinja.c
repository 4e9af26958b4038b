/* Jinja2 as chat templates use it (see jinja.h): a lexer that applies the whitespace rules, a
 * recursive-descent parser to a tree, and a tree walker over Python-like values. Every allocation
 * of a parse or a render lives in one arena freed at its end, and every error unwinds to the
 * entry point (longjmp), so no path in between cleans up. */
#include "serve/jinja.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/utf8.h"
#include "serve/tools.h"

/* A render's limits: work (nodes evaluated), nesting (parse depth, macro calls, values printed),
 * memory (the arena), and any one string or range. */
#define J_MAX_STEPS 5000000L
#define J_MAX_PARSE_DEPTH 200
#define J_MAX_EVAL_DEPTH 1000
#define J_MAX_CALL_DEPTH 64
#define J_MAX_VALUE_DEPTH 512
#define J_MAX_MEMORY ((size_t)256 << 20)
#define J_MAX_STRING ((size_t)16 << 20)
#define J_MAX_RANGE 1000000
#define J_MAX_RANGE_CALL 100000 /* range()'s, as transformers' sandbox (MAX_RANGE) */

/* ---- arena and errors ---- */

typedef struct jblock {
    struct jblock *next;
    size_t used, cap;
    max_align_t data[];
} jblock;

typedef struct {
    jblock *blocks;
    size_t total;
    long work;      /* steps: nodes evaluated, and scans and copies by their length (charge) */
    int depth;      /* the render's recursion: expressions, statements, macro calls */
    nv_buf *held;   /* a malloc'd buffer an error must free (sink_take's) */
    jmp_buf jb;
    nv_err code;
    int line;
    char msg[320];
} jctx;

static _Noreturn void __attribute__((format(printf, 3, 4))) jfail(jctx *c, nv_err code, const char *fmt, ...) {
    char m[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    for (char *p = m; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = ' '; /* one line, whatever the template's text */
    snprintf(c->msg, sizeof c->msg, "line %d: %s", c->line, m);
    c->code = code;
    longjmp(c->jb, 1);
}

/* work in steps: a byte scanned or copied is 1/64 of one, an element compared or visited one */
static void charge(jctx *c, size_t units) {
    c->work += (long)(units > (size_t)J_MAX_STEPS ? (size_t)J_MAX_STEPS : units);
    if (c->work > J_MAX_STEPS) jfail(c, NV_ERANGE, "the template ran past %ld steps", J_MAX_STEPS);
}
#define BYTES(n) ((size_t)(n) >> 6)

static void *jalloc(jctx *c, size_t n) {
    charge(c, BYTES(n));
    n = (n + 15) & ~(size_t)15;
    jblock *b = c->blocks;
    if (!b || b->cap - b->used < n) {
        const size_t cap = n > 65536 ? n : 65536;
        if (c->total + cap > J_MAX_MEMORY) jfail(c, NV_ERANGE, "the template used more than %zu MB", J_MAX_MEMORY >> 20);
        b = malloc(sizeof *b + cap);
        if (!b) jfail(c, NV_ENOMEM, "out of memory");
        b->cap = cap, b->used = 0, b->next = c->blocks;
        c->blocks = b;
        c->total += cap;
    }
    void *p = (char *)b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

static void jctx_free(jctx *c) {
    if (c->held) nv_buf_free(c->held), c->held = NULL;
    while (c->blocks) {
        jblock *n = c->blocks->next;
        free(c->blocks);
        c->blocks = n;
    }
}

/* ---- values ---- */

typedef struct {
    size_t n;
    unsigned char kt; /* 0: a string; a dict's key of another type: its jtype (key_of) */
    char s[];
} jstr;

typedef enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_MACRO, V_FUNC } jtype;

typedef struct jval jval;
typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jnode jnode;
typedef struct jmacro jmacro;

struct jval {
    jtype t;
    union {
        int64_t i;
        double f;
        const jstr *s;
        jlist *l;
        jdict *d;
        const jmacro *m;
        int fn;
    } u;
};

struct jlist {
    int n, cap;
    jval *v;
    int tuple; /* printed as Python prints a tuple */
};

struct jdict {
    int n, cap;
    const jstr **k;
    jval *v;
    int ns;      /* a namespace(): its attributes may be set */
    int *slot;   /* past DICT_INDEXED keys, an open-addressed index of them (entry + 1; 0: empty) */
    int n_slot;  /* its size, a power of two at least twice n */
};
#define DICT_INDEXED 16

static const jval UNDEF = {.t = V_UNDEF};
static const jval NONE = {.t = V_NONE};

static jval vbool(int b) { return (jval){.t = V_BOOL, .u.i = !!b}; }
static jval vint(int64_t i) { return (jval){.t = V_INT, .u.i = i}; }
static jval vfloat(double f) { return (jval){.t = V_FLOAT, .u.f = f}; }

static jstr *str_new(jctx *c, const char *s, size_t n) {
    if (n > J_MAX_STRING) jfail(c, NV_ERANGE, "a string past %zu MB", J_MAX_STRING >> 20);
    jstr *r = jalloc(c, sizeof *r + n + 1);
    r->n = n;
    r->kt = 0;
    if (n) memcpy(r->s, s, n);
    return r;
}
static jval vstr(jctx *c, const char *s, size_t n) { return (jval){.t = V_STR, .u.s = str_new(c, s, n)}; }
static jval vcstr(jctx *c, const char *s) { return vstr(c, s, strlen(s)); }

static jlist *list_new(jctx *c, int cap) {
    jlist *l = jalloc(c, sizeof *l);
    l->cap = cap > 4 ? cap : 4;
    l->v = jalloc(c, sizeof(jval) * (size_t)l->cap);
    return l;
}
static void list_push(jctx *c, jlist *l, jval v) {
    if (l->n == l->cap) {
        if (l->cap > J_MAX_RANGE) jfail(c, NV_ERANGE, "a list past %d items", J_MAX_RANGE);
        jval *nv = jalloc(c, sizeof(jval) * (size_t)l->cap * 2);
        memcpy(nv, l->v, sizeof(jval) * (size_t)l->n);
        l->v = nv, l->cap *= 2;
    }
    l->v[l->n++] = v;
}
static jval vlist(jlist *l) { return (jval){.t = V_LIST, .u.l = l}; }

static jdict *dict_new(jctx *c) {
    jdict *d = jalloc(c, sizeof *d);
    d->cap = 8;
    d->k = jalloc(c, sizeof *d->k * 8);
    d->v = jalloc(c, sizeof *d->v * 8);
    return d;
}
static size_t key_hash(const char *k, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)k[i]) * 1099511628211ull;
    return (size_t)h;
}

/* A key of the kind other (0: a string key; 1: a number's or none's, whose text key_of made) */
static int key_is(const jstr *k, int other, const char *s, size_t n) { return (k->kt != 0) == other && k->n == n && !memcmp(k->s, s, n); }

static int dict_find_kind(const jdict *d, int other, const char *k, size_t n) {
    if (d->slot) {
        for (size_t h = key_hash(k, n) & (size_t)(d->n_slot - 1);; h = (h + 1) & (size_t)(d->n_slot - 1)) {
            const int e = d->slot[h];
            if (!e) return -1;
            if (key_is(d->k[e - 1], other, k, n)) return e - 1;
        }
    }
    for (int i = 0; i < d->n; i++)
        if (key_is(d->k[i], other, k, n)) return i;
    return -1;
}
/* the string key k */
static int dict_find(const jdict *d, const char *k, size_t n) { return dict_find_kind(d, 0, k, n); }
static int dict_find_key(const jdict *d, const jstr *k) { return dict_find_kind(d, k->kt != 0, k->s, k->n); }
static void dict_slot(jdict *d, int i) {
    size_t h = key_hash(d->k[i]->s, d->k[i]->n) & (size_t)(d->n_slot - 1);
    while (d->slot[h]) h = (h + 1) & (size_t)(d->n_slot - 1);
    d->slot[h] = i + 1;
}

/* A key as the value it was (a string, or the number or none key_of made it from). Python's: 1,
 * 1.0 and True are one key, shown as the first of them that was set. */
static jval key_val(const jstr *k) {
    switch (k->kt) {
    case 0: return (jval){.t = V_STR, .u.s = k};
    case V_NONE: return NONE;
    case V_BOOL: return vbool(k->s[1] == '1');
    case V_INT: return vint(strtoll(k->s + 1, NULL, 10));
    default: return vfloat(strtod(k->s + 1, NULL));
    }
}

static void dict_clear(jdict *d) {
    d->n = 0;
    if (d->slot) memset(d->slot, 0, sizeof *d->slot * (size_t)d->n_slot);
}

static void dict_set(jctx *c, jdict *d, const jstr *k, jval v) {
    const int i = dict_find_key(d, k);
    if (i >= 0) {
        d->v[i] = v;
        return;
    }
    if (d->n == d->cap) {
        const jstr **nk = jalloc(c, sizeof *nk * (size_t)d->cap * 2);
        jval *nv = jalloc(c, sizeof *nv * (size_t)d->cap * 2);
        memcpy(nk, d->k, sizeof *nk * (size_t)d->n);
        memcpy(nv, d->v, sizeof *nv * (size_t)d->n);
        d->k = nk, d->v = nv, d->cap *= 2;
    }
    d->k[d->n] = k, d->v[d->n++] = v;
    if (d->n >= DICT_INDEXED && (!d->slot || 2 * d->n > d->n_slot)) { /* (re)build the index */
        int n_slot = 64;
        while (n_slot < 4 * d->n) n_slot *= 2;
        d->slot = jalloc(c, sizeof *d->slot * (size_t)n_slot);
        d->n_slot = n_slot;
        for (int i = 0; i < d->n; i++) dict_slot(d, i);
    } else if (d->slot)
        dict_slot(d, d->n - 1);
}
static void dict_setc(jctx *c, jdict *d, const char *k, jval v) {
    const int i = dict_find(d, k, strlen(k));
    if (i >= 0) d->v[i] = v;
    else dict_set(c, d, str_new(c, k, strlen(k)), v);
}

static jval of_json(jctx *c, const cJSON *j) {
    if (cJSON_IsBool(j)) return vbool(cJSON_IsTrue(j));
    if (nv_json_is_float(j)) return vfloat(j->valuedouble); /* written as a float (nv_json_mark_floats) */
    if (cJSON_IsNumber(j)) {
        const double d = j->valuedouble;
        return d == floor(d) && fabs(d) < 9007199254740992.0 ? vint((int64_t)d) : vfloat(d);
    }
    if (cJSON_IsString(j)) return vcstr(c, j->valuestring);
    if (cJSON_IsArray(j)) {
        jlist *l = list_new(c, cJSON_GetArraySize(j));
        for (const cJSON *e = j->child; e; e = e->next) list_push(c, l, of_json(c, e));
        return vlist(l);
    }
    if (cJSON_IsObject(j)) {
        jdict *d = dict_new(c);
        for (const cJSON *e = j->child; e; e = e->next) dict_setc(c, d, e->string ? e->string : "", of_json(c, e));
        return (jval){.t = V_DICT, .u.d = d};
    }
    return NONE;
}

/* ---- strings out: a growable sink in the arena ---- */

typedef struct {
    char *p;
    size_t n, cap;
} jsink;

static void sink_put(jctx *c, jsink *s, const char *p, size_t n) {
    if (s->n + n > J_MAX_STRING) jfail(c, NV_ERANGE, "output past %zu MB", J_MAX_STRING >> 20);
    if (s->n + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 256;
        while (cap < s->n + n + 1) cap *= 2;
        char *np = jalloc(c, cap);
        if (s->n) memcpy(np, s->p, s->n);
        s->p = np, s->cap = cap;
    }
    if (n) memcpy(s->p + s->n, p, n);
    s->n += n;
    s->p[s->n] = 0;
}
static void sink_puts(jctx *c, jsink *s, const char *p) { sink_put(c, s, p, strlen(p)); }
static jval sink_val(jctx *c, const jsink *s) { return vstr(c, s->p ? s->p : "", s->n); }

/* what one of tools.c's Python printers wrote into b, then b freed */
static void sink_take(jctx *c, jsink *s, nv_buf *b) {
    c->held = b; /* freed by jctx_free if what follows fails */
    if (b->oom) jfail(c, NV_ENOMEM, "out of memory");
    sink_put(c, s, b->data ? b->data : "", b->len);
    c->held = NULL;
    nv_buf_free(b);
}

static void put_float(jctx *c, jsink *s, double x) {
    nv_buf b = {0};
    nv_py_repr_float(&b, x);
    sink_take(c, s, &b);
}

static void put_repr(jctx *c, jsink *s, jval v, int depth);

/* str(v) as Python prints it; Jinja prints an undefined value as nothing. */
static void put_str(jctx *c, jsink *s, jval v, int depth) {
    char b[48];
    switch (v.t) {
    case V_UNDEF: return;
    case V_NONE: sink_puts(c, s, "None"); return;
    case V_BOOL: sink_puts(c, s, v.u.i ? "True" : "False"); return;
    case V_INT: snprintf(b, sizeof b, "%lld", (long long)v.u.i), sink_puts(c, s, b); return;
    case V_FLOAT: put_float(c, s, v.u.f); return;
    case V_STR: sink_put(c, s, v.u.s->s, v.u.s->n); return;
    case V_MACRO: sink_puts(c, s, "<macro>"); return;
    case V_FUNC: sink_puts(c, s, "<function>"); return;
    default: put_repr(c, s, v, depth);
    }
}

static void put_repr(jctx *c, jsink *s, jval v, int depth) {
    if (depth > J_MAX_VALUE_DEPTH) jfail(c, NV_ERANGE, "a value nested past %d levels", J_MAX_VALUE_DEPTH);
    if (v.t == V_UNDEF) return;
    if (v.t == V_STR) {
        nv_buf b = {0};
        nv_py_repr_str(&b, v.u.s->s);
        sink_take(c, s, &b);
    } else if (v.t == V_LIST) {
        sink_puts(c, s, v.u.l->tuple ? "(" : "[");
        for (int i = 0; i < v.u.l->n; i++) {
            if (i) sink_puts(c, s, ", ");
            put_repr(c, s, v.u.l->v[i], depth + 1);
        }
        sink_puts(c, s, !v.u.l->tuple ? "]" : v.u.l->n == 1 ? ",)" : ")");
    } else if (v.t == V_DICT) {
        sink_puts(c, s, "{");
        for (int i = 0; i < v.u.d->n; i++) {
            if (i) sink_puts(c, s, ", ");
            put_repr(c, s, key_val(v.u.d->k[i]), depth + 1);
            sink_puts(c, s, ": ");
            put_repr(c, s, v.u.d->v[i], depth + 1);
        }
        sink_puts(c, s, "}");
    } else
        put_str(c, s, v, depth);
}

typedef struct {
    int indent; /* < 0: none */
    const char *item_sep, *key_sep;
    int sort_keys;
    int ascii; /* ensure_ascii: what is not ASCII as \uXXXX (pairs of them past U+FFFF) */
} json_style;

static void put_json_str(jctx *c, jsink *s, const char *p, size_t n, int ascii) {
    sink_puts(c, s, "\"");
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        char e[16];
        size_t k = nv_json_escape((unsigned char)p[i], e), len = 1;
        uint32_t cp;
        if (!k && ascii && (unsigned char)p[i] >= 0x80 && (len = nv_utf8_get(p + i, p + n, &cp))) {
            if (cp < 0x10000) k = (size_t)snprintf(e, sizeof e, "\\u%04x", cp);
            else k = (size_t)snprintf(e, sizeof e, "\\u%04x\\u%04x", 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF));
        }
        if (!k) continue;
        sink_put(c, s, p + run, i - run);
        sink_put(c, s, e, k);
        i += len - 1;
        run = i + 1;
    }
    sink_put(c, s, p + run, n - run);
    sink_puts(c, s, "\"");
}

static void json_newline(jctx *c, jsink *s, const json_style *st, int level) {
    sink_puts(c, s, "\n");
    for (int i = 0; i < st->indent * level; i++) sink_puts(c, s, " ");
}

static int key_cmp(const void *a, const void *b) {
    const jstr *x = *(const jstr *const *)a, *y = *(const jstr *const *)b;
    if (x->kt && y->kt) { /* numbers' keys (put_json let no others through): by value */
        const jval p = key_val(x), q = key_val(y);
        if (p.t != V_FLOAT && q.t != V_FLOAT) return (p.u.i > q.u.i) - (p.u.i < q.u.i);
        const double u = p.t == V_FLOAT ? p.u.f : (double)p.u.i, v = q.t == V_FLOAT ? q.u.f : (double)q.u.i;
        return (u > v) - (u < v);
    }
    const int r = memcmp(x->s, y->s, x->n < y->n ? x->n : y->n);
    return r ? r : (x->n > y->n) - (x->n < y->n);
}

/* json.dumps(v, ensure_ascii=False, indent, separators, sort_keys), as transformers' tojson. */
static void put_json(jctx *c, jsink *s, jval v, const json_style *st, int level) {
    if (level > J_MAX_VALUE_DEPTH) jfail(c, NV_ERANGE, "a value nested past %d levels", J_MAX_VALUE_DEPTH);
    char b[48];
    switch (v.t) {
    case V_NONE: sink_puts(c, s, "null"); return;
    case V_BOOL: sink_puts(c, s, v.u.i ? "true" : "false"); return;
    case V_INT: snprintf(b, sizeof b, "%lld", (long long)v.u.i), sink_puts(c, s, b); return;
    case V_FLOAT:
        if (isnan(v.u.f)) sink_puts(c, s, "NaN");
        else if (isinf(v.u.f)) sink_puts(c, s, v.u.f < 0 ? "-Infinity" : "Infinity");
        else put_float(c, s, v.u.f);
        return;
    case V_STR: put_json_str(c, s, v.u.s->s, v.u.s->n, st->ascii); return;
    case V_LIST:
        if (!v.u.l->n) {
            sink_puts(c, s, "[]");
            return;
        }
        sink_puts(c, s, "[");
        for (int i = 0; i < v.u.l->n; i++) {
            if (i) sink_puts(c, s, st->item_sep);
            if (st->indent >= 0) json_newline(c, s, st, level + 1);
            put_json(c, s, v.u.l->v[i], st, level + 1);
        }
        if (st->indent >= 0) json_newline(c, s, st, level);
        sink_puts(c, s, "]");
        return;
    case V_DICT: {
        const jdict *d = v.u.d;
        if (!d->n) {
            sink_puts(c, s, "{}");
            return;
        }
        int *order = jalloc(c, sizeof *order * (size_t)d->n);
        for (int i = 0; i < d->n; i++) order[i] = i;
        for (int i = 1; st->sort_keys && i < d->n; i++) /* Python compares ints with floats, not with strings */
            if ((d->k[i]->kt == 0) != (d->k[0]->kt == 0) || d->k[i]->kt == V_NONE || d->k[0]->kt == V_NONE)
                jfail(c, NV_EFORMAT, "tojson: sort_keys with keys that do not compare");
        if (st->sort_keys) { /* the keys sorted (they are unique: any sort is Python's) */
            const jstr **keys = jalloc(c, sizeof *keys * (size_t)d->n);
            memcpy(keys, d->k, sizeof *keys * (size_t)d->n);
            qsort(keys, (size_t)d->n, sizeof *keys, key_cmp);
            for (int i = 0; i < d->n; i++) order[i] = dict_find_key(d, keys[i]);
        }
        sink_puts(c, s, "{");
        for (int i = 0; i < d->n; i++) {
            if (i) sink_puts(c, s, st->item_sep);
            if (st->indent >= 0) json_newline(c, s, st, level + 1);
            const jstr *k = d->k[order[i]];
            if (k->kt) { /* json.dumps's text of a number's or none's key */
                const jval kv = key_val(k);
                char text[64];
                if (kv.t == V_FLOAT) {
                    nv_buf b = {0};
                    nv_py_repr_float(&b, kv.u.f);
                    snprintf(text, sizeof text, "%s", b.data && !b.oom ? b.data : "nan");
                    nv_buf_free(&b);
                } else
                    snprintf(text, sizeof text, "%s", kv.t == V_NONE ? "null" : kv.t == V_BOOL ? (kv.u.i ? "true" : "false") : k->s + 1);
                put_json_str(c, s, text, strlen(text), st->ascii);
            } else
                put_json_str(c, s, k->s, k->n, st->ascii);
            sink_puts(c, s, st->key_sep);
            put_json(c, s, d->v[order[i]], st, level + 1);
        }
        if (st->indent >= 0) json_newline(c, s, st, level);
        sink_puts(c, s, "}");
        return;
    }
    default: jfail(c, NV_EFORMAT, "tojson: %s is not JSON serializable", v.t == V_UNDEF ? "an undefined value" : "a macro");
    }
}

/* ---- tokens ---- */

enum { T_EOF, T_TEXT, T_VBEG, T_VEND, T_BBEG, T_BEND, T_NAME, T_STR, T_INT, T_FLOAT, T_OP };
/* two-character operators; the others are their character */
enum { OP_EQ = 256, OP_NE, OP_LE, OP_GE, OP_FLOORDIV, OP_POW, OP_IN, OP_NOTIN };

typedef struct {
    int t, line, op;
    const jstr *s;
    int64_t i;
    double f;
} jtok;

typedef struct {
    jctx *c;
    const char *src;
    size_t n, pos;
    int line;
    jtok *v;
    int nt, cap;
} lexer;

static jtok *emit(lexer *L, int t) {
    if (L->nt == L->cap) {
        const int cap = L->cap ? L->cap * 2 : 256;
        jtok *nv = jalloc(L->c, sizeof *nv * (size_t)cap);
        if (L->nt) memcpy(nv, L->v, sizeof *nv * (size_t)L->nt);
        L->v = nv, L->cap = cap;
    }
    jtok *k = &L->v[L->nt++];
    memset(k, 0, sizeof *k);
    k->t = t, k->line = L->line;
    return k;
}

static int is_ws(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v'; }
static int is_name0(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }
static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }

static void count_lines(lexer *L, size_t from, size_t to) {
    for (size_t i = from; i < to; i++) L->line += L->src[i] == '\n';
}

/* A string literal's body, its escapes decoded as Python's unicode-escape does. */
static const jstr *lex_string(lexer *L) {
    const char q = L->src[L->pos++];
    jsink s = {0};
    while (1) {
        if (L->pos >= L->n) L->c->line = L->line, jfail(L->c, NV_EFORMAT, "a string literal is not closed");
        char ch = L->src[L->pos++];
        if (ch == q) break;
        if (ch == '\n') L->line++;
        if (ch != '\\' || L->pos >= L->n) {
            sink_put(L->c, &s, &ch, 1);
            continue;
        }
        ch = L->src[L->pos++];
        uint32_t cp = 0;
        int hex = 0;
        switch (ch) {
        case 'n': sink_puts(L->c, &s, "\n"); break;
        case 't': sink_puts(L->c, &s, "\t"); break;
        case 'r': sink_puts(L->c, &s, "\r"); break;
        case 'a': sink_puts(L->c, &s, "\a"); break;
        case 'b': sink_puts(L->c, &s, "\b"); break;
        case 'f': sink_puts(L->c, &s, "\f"); break;
        case 'v': sink_puts(L->c, &s, "\v"); break;
        case '\\': case '\'': case '"': sink_put(L->c, &s, &ch, 1); break;
        case '\n': L->line++; break; /* a line continued */
        case 'x': hex = 2; break;
        case 'u': hex = 4; break;
        case 'U': hex = 8; break;
        default:
            if (ch >= '0' && ch <= '7') {
                cp = (uint32_t)(ch - '0');
                for (int k = 0; k < 2 && L->pos < L->n && L->src[L->pos] >= '0' && L->src[L->pos] <= '7'; k++)
                    cp = cp * 8 + (uint32_t)(L->src[L->pos++] - '0');
                char u[4];
                sink_put(L->c, &s, u, nv_utf8_put(cp, u));
            } else {
                const char keep[2] = {'\\', ch};
                sink_put(L->c, &s, keep, 2);
            }
        }
        if (hex) {
            for (int k = 0; k < hex; k++) {
                const char h = L->pos < L->n ? L->src[L->pos++] : 0;
                const int d = is_digit(h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
                if (d < 0) L->c->line = L->line, jfail(L->c, NV_EFORMAT, "a bad \\%c escape in a string literal", ch);
                cp = cp * 16 + (uint32_t)d;
            }
            if (cp > 0x10FFFF) L->c->line = L->line, jfail(L->c, NV_EFORMAT, "a \\%c escape past U+10FFFF", ch);
            char u[4];
            sink_put(L->c, &s, u, nv_utf8_put(cp, u));
        }
    }
    return str_new(L->c, s.p ? s.p : "", s.n);
}

/* The tokens of one tag, up to its end; returns 1 when the end had '-' (strip what follows). */
static int lex_tag(lexer *L, int var) {
    int nest = 0; /* brackets open: a '}}' or '%}' inside them is not the tag's end */
    while (1) {
        while (L->pos < L->n && is_ws(L->src[L->pos])) L->line += L->src[L->pos++] == '\n';
        if (L->pos >= L->n) L->c->line = L->line, jfail(L->c, NV_EFORMAT, "a tag is not closed");
        const char *p = L->src + L->pos;
        const size_t left = L->n - L->pos;
        const char close = var ? '}' : '%';
        if (!nest && (p[0] == '-' || p[0] == '+') && left >= 3 && p[1] == close && p[2] == '}') {
            emit(L, var ? T_VEND : T_BEND);
            L->pos += 3;
            return p[0] == '-' ? 1 : 2; /* 2: '+', trim_blocks off */
        }
        if (!nest && left >= 2 && p[0] == close && p[1] == '}') {
            emit(L, var ? T_VEND : T_BEND);
            L->pos += 2;
            return 0;
        }
        if (is_name0(p[0])) {
            size_t k = 1;
            while (k < left && (is_name0(p[k]) || is_digit(p[k]))) k++;
            emit(L, T_NAME)->s = str_new(L->c, p, k);
            L->pos += k;
        } else if (is_digit(p[0])) {
            char *end;
            size_t k = 0;
            while (k < left && (is_digit(p[k]) || p[k] == '_')) k++;
            const int is_float = (k + 1 < left && p[k] == '.' && is_digit(p[k + 1])) || (k < left && (p[k] == 'e' || p[k] == 'E'));
            char num[64];
            size_t m = 0;
            if (is_float) {
                const double f = strtod(p, &end);
                jtok *t = emit(L, T_FLOAT);
                t->f = f;
                L->pos += (size_t)(end - p);
            } else {
                for (size_t i = 0; i < k && m < sizeof num - 1; i++)
                    if (p[i] != '_') num[m++] = p[i];
                num[m] = 0;
                jtok *t = emit(L, T_INT);
                t->i = strtoll(num, NULL, 10);
                L->pos += k;
            }
        } else if (p[0] == '\'' || p[0] == '"') {
            const int line = L->line;
            const jstr *s = lex_string(L);
            jtok *t = emit(L, T_STR);
            t->s = s, t->line = line;
        } else {
            int op = p[0];
            size_t k = 1;
            if (left >= 2) {
                if (p[0] == '=' && p[1] == '=') op = OP_EQ, k = 2;
                else if (p[0] == '!' && p[1] == '=') op = OP_NE, k = 2;
                else if (p[0] == '<' && p[1] == '=') op = OP_LE, k = 2;
                else if (p[0] == '>' && p[1] == '=') op = OP_GE, k = 2;
                else if (p[0] == '/' && p[1] == '/') op = OP_FLOORDIV, k = 2;
                else if (p[0] == '*' && p[1] == '*') op = OP_POW, k = 2;
            }
            if (k == 1 && !strchr("+-*/%~<>=()[]{},.:|", p[0]))
                L->c->line = L->line, jfail(L->c, NV_EFORMAT, "unexpected character '%c'", p[0]);
            emit(L, T_OP)->op = op;
            L->pos += k;
            if (op == '(' || op == '[' || op == '{') nest++;
            else if ((op == ')' || op == ']' || op == '}') && nest) nest--;
        }
    }
}

static void rstrip_ws(const char *s, size_t *n) {
    while (*n && is_ws(s[*n - 1])) (*n)--;
}

/* Splits the source into text and tags' tokens with trim_blocks and lstrip_blocks on. */
static void lex(lexer *L) {
    int strip_next = 0; /* the tag before ended with '-' */
    while (L->pos < L->n) {
        size_t start = L->pos, ts = start;
        while (ts + 1 < L->n && !(L->src[ts] == '{' && (L->src[ts + 1] == '{' || L->src[ts + 1] == '%' || L->src[ts + 1] == '#'))) ts++;
        if (ts + 1 >= L->n) ts = L->n;
        const int line_start = start == 0 || L->src[start - 1] == '\n';
        size_t a = start, b = ts;
        if (strip_next)
            while (a < b && is_ws(L->src[a])) a++;
        if (ts < L->n) {
            const char kind = L->src[ts + 1], ctrl = ts + 2 < L->n ? L->src[ts + 2] : 0;
            size_t len = b - a;
            if (ctrl == '-') rstrip_ws(L->src + a, &len);
            else if (kind != '{' && ctrl != '+') { /* lstrip_blocks: spaces and tabs before the tag on its line */
                size_t k = len;
                while (k && (L->src[a + k - 1] == ' ' || L->src[a + k - 1] == '\t')) k--;
                if ((k && L->src[a + k - 1] == '\n') || (!k && (a > start || line_start))) len = k;
            }
            b = a + len;
        }
        if (b > a) {
            jtok *t = emit(L, T_TEXT);
            t->s = str_new(L->c, L->src + a, b - a);
        }
        count_lines(L, start, ts);
        strip_next = 0;
        if (ts >= L->n) break;
        const char kind = L->src[ts + 1];
        L->pos = ts + 2;
        if (L->pos < L->n && (L->src[L->pos] == '-' || L->src[L->pos] == '+')) L->pos++;
        int end_ctrl;
        if (kind == '#') {
            const char *e = memmem(L->src + L->pos, L->n - L->pos, "#}", 2);
            if (!e) L->c->line = L->line, jfail(L->c, NV_EFORMAT, "a comment is not closed");
            const size_t at = (size_t)(e - L->src);
            end_ctrl = at > L->pos && L->src[at - 1] == '-' ? 1 : at > L->pos && L->src[at - 1] == '+' ? 2 : 0;
            count_lines(L, L->pos, at);
            L->pos = at + 2;
        } else {
            emit(L, kind == '{' ? T_VBEG : T_BBEG);
            end_ctrl = lex_tag(L, kind == '{');
        }
        if (end_ctrl == 1) strip_next = 1;
        else if (kind != '{' && end_ctrl == 0) { /* trim_blocks: the line break after a block tag */
            if (L->pos < L->n && L->src[L->pos] == '\n') L->pos++, L->line++;
        }
        /* {% raw %}: the text up to {% endraw %} as it is */
        if (kind == '%' && L->nt >= 3 && L->v[L->nt - 3].t == T_BBEG && L->v[L->nt - 2].t == T_NAME &&
            L->v[L->nt - 2].s->n == 3 && !memcmp(L->v[L->nt - 2].s->s, "raw", 3)) {
            L->nt -= 3;
            if (strip_next)
                while (L->pos < L->n && is_ws(L->src[L->pos])) L->line += L->src[L->pos++] == '\n';
            size_t k = L->pos;
            for (;; k++) {
                const char *e = k < L->n ? memmem(L->src + k, L->n - k, "{%", 2) : NULL;
                if (!e) L->c->line = L->line, jfail(L->c, NV_EFORMAT, "{%% raw %%} is not closed");
                k = (size_t)(e - L->src);
                size_t q = k + 2;
                const int minus = q < L->n && L->src[q] == '-';
                if (q < L->n && (L->src[q] == '-' || L->src[q] == '+')) q++;
                while (q < L->n && is_ws(L->src[q])) q++;
                if (L->n - q < 6 || memcmp(L->src + q, "endraw", 6)) continue;
                q += 6;
                while (q < L->n && is_ws(L->src[q])) q++;
                int end_minus = 0;
                if (q < L->n && (L->src[q] == '-' || L->src[q] == '+')) end_minus = L->src[q] == '-', q++;
                if (L->n - q < 2 || memcmp(L->src + q, "%}", 2)) continue;
                size_t len = k - L->pos;
                if (minus) rstrip_ws(L->src + L->pos, &len);
                if (len) emit(L, T_TEXT)->s = str_new(L->c, L->src + L->pos, len);
                count_lines(L, L->pos, q);
                L->pos = q + 2;
                strip_next = end_minus;
                if (!end_minus && L->pos < L->n && L->src[L->pos] == '\n') L->pos++, L->line++;
                break;
            }
        }
    }
    emit(L, T_EOF);
}

/* ---- the tree ---- */

enum {
    S_BODY, S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_MACRO, S_BREAK, S_CONTINUE, S_WITH, S_FILTERBLOCK, S_CALLBLOCK,
    E_LIT, E_NAME, E_ATTR, E_INDEX, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NOT, E_NEG, E_BIN, E_AND, E_OR, E_COND, E_LIST, E_DICT,
    E_BLOCK /* a filter block's text (S_FILTERBLOCK) */
};
#define OP_TUPLE 1 /* E_LIST's op: a tuple */

struct jnode {
    int kind, op, line, n, cap;
    const jstr *s;      /* name, text, attribute, filter or test */
    jnode **kid;        /* children (NULL where optional and absent) */
    const jstr **kw;    /* calls: the keyword of each argument, NULL for positional ones */
    const jstr **names; /* for's targets, set's target, a macro's parameters */
    int n_names;
    jval lit;
};

typedef struct {
    jctx *c;
    const jtok *t;
    int depth;
} parser;

static jnode *node(parser *P, int kind, int n) {
    jnode *x = jalloc(P->c, sizeof *x);
    x->kind = kind, x->line = P->t->line, x->n = n;
    if (n) x->kid = jalloc(P->c, sizeof *x->kid * (size_t)n);
    return x;
}

static void add_kid(parser *P, jnode *x, jnode *k, const jstr *kw) {
    if (x->n >= x->cap || !x->kw) { /* grown by doubling (a node made with n kids has no room yet) */
        const int cap = x->n < 4 ? 8 : 2 * x->n;
        jnode **nk = jalloc(P->c, sizeof *nk * (size_t)cap);
        const jstr **nw = jalloc(P->c, sizeof *nw * (size_t)cap);
        if (x->n) memcpy(nk, x->kid, sizeof *nk * (size_t)x->n);
        if (x->n && x->kw) memcpy(nw, x->kw, sizeof *nw * (size_t)x->n);
        x->kid = nk, x->kw = nw, x->cap = cap;
    }
    x->kid[x->n] = k, x->kw[x->n] = kw;
    x->n++;
}

static _Noreturn void perr(parser *P, const char *what) {
    P->c->line = P->t->line;
    const jtok *t = P->t;
    if (t->t == T_NAME || t->t == T_STR) jfail(P->c, NV_EFORMAT, "%s, found '%.40s'", what, t->s->s);
    if (t->t == T_OP) jfail(P->c, NV_EFORMAT, "%s, found '%c'", what, t->op < 256 ? t->op : '?');
    jfail(P->c, NV_EFORMAT, "%s, found %s", what,
          t->t == T_EOF ? "the end" : t->t == T_BEND || t->t == T_VEND ? "the tag's end" : t->t == T_TEXT ? "text" : "a number");
}

static int is_name(const jtok *t, const char *s) { return t->t == T_NAME && t->s->n == strlen(s) && !memcmp(t->s->s, s, t->s->n); }
static int is_op(const jtok *t, int op) { return t->t == T_OP && t->op == op; }
static void expect_op(parser *P, int op, const char *what) {
    if (!is_op(P->t, op)) perr(P, what);
    P->t++;
}
static const jstr *expect_name(parser *P, const char *what) {
    if (P->t->t != T_NAME) perr(P, what);
    return (P->t++)->s;
}
static void expect_end(parser *P) {
    if (P->t->t != T_BEND) perr(P, "expected the tag's end");
    P->t++;
}

static jnode *parse_expr(parser *P, int condexpr);
static jnode *parse_unary(parser *P, int with_filter);

static void enter(parser *P) {
    if (++P->depth > J_MAX_PARSE_DEPTH) P->c->line = P->t->line, jfail(P->c, NV_EFORMAT, "nested past %d levels", J_MAX_PARSE_DEPTH);
}

/* (args, kw=args) after the '(' */
static void parse_args(parser *P, jnode *call) {
    P->t++;
    while (!is_op(P->t, ')')) {
        const jstr *kw = NULL;
        if (P->t->t == T_NAME && is_op(P->t + 1, '=')) kw = P->t->s, P->t += 2;
        add_kid(P, call, parse_expr(P, 1), kw);
        if (!is_op(P->t, ',')) break;
        P->t++;
    }
    expect_op(P, ')', "expected ')' after the arguments");
}

static jnode *parse_primary(parser *P) {
    enter(P);
    const jtok *t = P->t;
    jnode *x;
    if (t->t == T_NAME) {
        x = node(P, E_LIT, 0);
        if (is_name(t, "true") || is_name(t, "True")) x->lit = vbool(1);
        else if (is_name(t, "false") || is_name(t, "False")) x->lit = vbool(0);
        else if (is_name(t, "none") || is_name(t, "None")) x->lit = NONE;
        else x->kind = E_NAME, x->s = t->s;
        P->t++;
    } else if (t->t == T_STR) {
        x = node(P, E_LIT, 0);
        jsink s = {0};
        for (; P->t->t == T_STR; P->t++) sink_put(P->c, &s, P->t->s->s, P->t->s->n); /* 'a' 'b' is 'ab' */
        x->lit = sink_val(P->c, &s);
    } else if (t->t == T_INT || t->t == T_FLOAT) {
        x = node(P, E_LIT, 0);
        x->lit = t->t == T_INT ? vint(t->i) : vfloat(t->f);
        P->t++;
    } else if (is_op(t, '(')) {
        P->t++;
        if (is_op(P->t, ')')) {
            P->t++;
            x = node(P, E_LIST, 0);
            x->op = OP_TUPLE;
        } else {
            x = parse_expr(P, 1);
            if (is_op(P->t, ',')) { /* a tuple: a list here */
                jnode *l = node(P, E_LIST, 0);
                l->op = OP_TUPLE;
                add_kid(P, l, x, NULL);
                while (is_op(P->t, ',')) {
                    P->t++;
                    if (is_op(P->t, ')')) break;
                    add_kid(P, l, parse_expr(P, 1), NULL);
                }
                x = l;
            }
            expect_op(P, ')', "expected ')'");
        }
    } else if (is_op(t, '[')) {
        P->t++;
        x = node(P, E_LIST, 0);
        while (!is_op(P->t, ']')) {
            add_kid(P, x, parse_expr(P, 1), NULL);
            if (!is_op(P->t, ',')) break;
            P->t++;
        }
        expect_op(P, ']', "expected ']'");
    } else if (is_op(t, '{')) {
        P->t++;
        x = node(P, E_DICT, 0);
        while (!is_op(P->t, '}')) {
            add_kid(P, x, parse_expr(P, 1), NULL);
            expect_op(P, ':', "expected ':' in a dict");
            add_kid(P, x, parse_expr(P, 1), NULL);
            if (!is_op(P->t, ',')) break;
            P->t++;
        }
        expect_op(P, '}', "expected '}'");
    } else
        perr(P, "expected an expression");
    P->depth--;
    return x;
}

static jnode *parse_call(parser *P, jnode *callee) {
    jnode *call = node(P, E_CALL, 0);
    add_kid(P, call, callee, NULL);
    parse_args(P, call);
    return call;
}

static jnode *parse_postfix(parser *P, jnode *x) {
    while (1) {
        if (is_op(P->t, '.')) {
            P->t++;
            jnode *a = node(P, E_ATTR, 1);
            a->kid[0] = x;
            if (P->t->t == T_INT) { /* x.0 */
                a->kind = E_INDEX, a->n = 2;
                jnode **k = jalloc(P->c, sizeof *k * 2);
                k[0] = x, k[1] = node(P, E_LIT, 0), k[1]->lit = vint(P->t->i);
                a->kid = k;
                P->t++;
            } else
                a->s = expect_name(P, "expected an attribute after '.'");
            x = a;
        } else if (is_op(P->t, '[')) {
            P->t++;
            jnode *parts[3] = {0};
            int colons = 0;
            for (int k = 0; k < 3; k++) {
                if (!is_op(P->t, ':') && !is_op(P->t, ']')) parts[k] = parse_expr(P, 1);
                if (!is_op(P->t, ':') || k == 2) break;
                P->t++, colons++;
            }
            expect_op(P, ']', "expected ']'");
            jnode *a = node(P, colons ? E_SLICE : E_INDEX, colons ? 4 : 2);
            a->kid[0] = x;
            if (!colons && !parts[0]) perr(P, "expected an index");
            for (int k = 0; k < (colons ? 3 : 1); k++) a->kid[1 + k] = parts[k];
            x = a;
        } else if (is_op(P->t, '(')) {
            x = parse_call(P, x);
        } else
            return x;
    }
}

static jnode *parse_filters(parser *P, jnode *x) {
    while (1) {
        if (is_op(P->t, '|')) {
            P->t++;
            jnode *f = node(P, E_FILTER, 0);
            f->s = expect_name(P, "expected a filter's name after '|'");
            add_kid(P, f, x, NULL);
            if (is_op(P->t, '(')) parse_args(P, f);
            x = f;
        } else if (is_name(P->t, "is")) {
            P->t++;
            jnode *f = node(P, E_TEST, 0);
            if (is_name(P->t, "not")) f->op = 1, P->t++;
            if (P->t->t == T_NAME) f->s = (P->t++)->s;
            else if (P->t->t == T_OP && (P->t->op == OP_EQ || P->t->op == OP_NE || P->t->op == '<' || P->t->op == '>' ||
                                         P->t->op == OP_LE || P->t->op == OP_GE)) {
                static const char *const sym[] = {"==", "!=", "<=", ">="};
                const int op = P->t->op;
                f->s = str_new(P->c, op == '<' ? "<" : op == '>' ? ">" : sym[op - OP_EQ], op == '<' || op == '>' ? 1 : 2);
                P->t++;
            } else
                perr(P, "expected a test's name after 'is'");
            add_kid(P, f, x, NULL);
            if (is_op(P->t, '(')) parse_args(P, f);
            else if ((P->t->t == T_NAME || P->t->t == T_STR || P->t->t == T_INT || P->t->t == T_FLOAT || is_op(P->t, '[') ||
                      is_op(P->t, '{')) &&
                     !is_name(P->t, "else") && !is_name(P->t, "or") && !is_name(P->t, "and") && !is_name(P->t, "is") &&
                     !is_name(P->t, "if") && !is_name(P->t, "in") && !is_name(P->t, "not"))
                add_kid(P, f, parse_postfix(P, parse_primary(P)), NULL);
            x = f;
        } else if (is_op(P->t, '(')) {
            x = parse_call(P, x);
        } else
            return x;
    }
}

static jnode *parse_unary(parser *P, int with_filter) {
    enter(P);
    jnode *x;
    if (is_op(P->t, '-') || is_op(P->t, '+')) {
        const int neg = P->t->op == '-';
        P->t++;
        jnode *a = parse_unary(P, 0);
        if (neg) {
            x = node(P, E_NEG, 1);
            x->kid[0] = a;
        } else
            x = a;
    } else
        x = parse_postfix(P, parse_primary(P));
    if (with_filter) x = parse_filters(P, x);
    P->depth--;
    return x;
}

static jnode *bin(parser *P, int op, jnode *a, jnode *b) {
    jnode *x = node(P, E_BIN, 2);
    x->op = op, x->kid[0] = a, x->kid[1] = b;
    return x;
}

/* the arithmetic operators' levels, loosest first, each left to right as Jinja's parser takes them
   (** too); below the last, a unary expression */
static const int level_ops[][4] = {{'+', '-'}, {'~'}, {'*', '/', OP_FLOORDIV, '%'}, {OP_POW}};
#define N_LEVELS (int)(sizeof level_ops / sizeof *level_ops)

static jnode *parse_level(parser *P, int level) {
    if (level == N_LEVELS) return parse_unary(P, 1);
    jnode *x = parse_level(P, level + 1);
    for (;;) {
        int op = 0;
        for (int k = 0; k < 4 && level_ops[level][k]; k++)
            if (is_op(P->t, level_ops[level][k])) op = level_ops[level][k];
        if (!op) return x;
        P->t++;
        x = bin(P, op, x, parse_level(P, level + 1));
    }
}
/* a < b, a in b, ...; chained as Python's: a < b < c is a < b and b < c */
static jnode *parse_compare(parser *P) {
    jnode *x = parse_level(P, 0), *chain = NULL;
    while (1) {
        const jtok *t = P->t;
        int op;
        if (t->t == T_OP && (t->op == OP_EQ || t->op == OP_NE || t->op == '<' || t->op == '>' || t->op == OP_LE || t->op == OP_GE))
            op = t->op, P->t++;
        else if (is_name(t, "in"))
            op = OP_IN, P->t++;
        else if (is_name(t, "not") && is_name(t + 1, "in"))
            op = OP_NOTIN, P->t += 2;
        else
            return chain ? chain : x;
        jnode *c = bin(P, op, x, parse_level(P, 0));
        if (chain) {
            jnode *a = node(P, E_AND, 2);
            a->kid[0] = chain, a->kid[1] = c;
            chain = a;
        } else
            chain = c;
        x = c->kid[1];
    }
}
static jnode *parse_not(parser *P) {
    if (!is_name(P->t, "not")) return parse_compare(P);
    enter(P);
    P->t++;
    jnode *x = node(P, E_NOT, 1);
    x->kid[0] = parse_not(P);
    P->depth--;
    return x;
}
/* a or b (and_ 0), a and b (and_ 1), left to right */
static jnode *parse_bool(parser *P, int and_) {
    jnode *x = and_ ? parse_not(P) : parse_bool(P, 1);
    while (is_name(P->t, and_ ? "and" : "or")) {
        P->t++;
        jnode *a = node(P, and_ ? E_AND : E_OR, 2);
        a->kid[0] = x, a->kid[1] = and_ ? parse_not(P) : parse_bool(P, 1);
        x = a;
    }
    return x;
}
/* condexpr 0: `a if b else c` is not read (a for loop's iterable, which an `if` filter may follow) */
static jnode *parse_expr(parser *P, int condexpr) {
    enter(P);
    jnode *x = parse_bool(P, 0);
    if (condexpr && is_name(P->t, "if")) {
        P->t++;
        jnode *c = node(P, E_COND, 3);
        c->kid[1] = x, c->kid[0] = parse_bool(P, 0);
        if (is_name(P->t, "else")) P->t++, c->kid[2] = parse_expr(P, 1);
        x = c;
    }
    P->depth--;
    return x;
}

/* Statements up to one of ends' tags (NULL-terminated; NULL: the template's end). Returns the body;
 * *which: the end tag found (its name consumed, the rest of its tag not). */
static jnode *parse_body(parser *P, const char *const *ends, const char **which);

/* names[0, nn) as x's names (for's targets, a macro's parameters, with's names), in the program's memory. */
static void keep_names(parser *P, jnode *x, const jstr *const *names, int nn) {
    x->names = jalloc(P->c, sizeof *x->names * (size_t)(nn ? nn : 1));
    memcpy(x->names, names, sizeof *names * (size_t)nn);
    x->n_names = nn;
}

/* A macro's parameters, the '(' read: names (with their defaults as x's kids, NULL where none) up to ')'. */
static void parse_params(parser *P, jnode *x) {
    const jstr *names[64];
    int nn = 0;
    while (!is_op(P->t, ')')) {
        if (nn == 64) perr(P, "too many parameters");
        names[nn++] = expect_name(P, "expected a parameter");
        jnode *def = NULL;
        if (is_op(P->t, '=')) P->t++, def = parse_expr(P, 1);
        add_kid(P, x, def, NULL);
        if (!is_op(P->t, ',')) break;
        P->t++;
    }
    expect_op(P, ')', "expected ')' after the parameters");
    keep_names(P, x, names, nn);
}

static jnode *parse_stmt(parser *P) {
    const jtok *t = P->t;
    const int line = t->line;
    if (t->t != T_NAME) perr(P, "expected a statement");
    P->t++;
    jnode *x;
    const char *which;
    if (is_name(t, "if")) {
        x = node(P, S_IF, 0);
        while (1) {
            add_kid(P, x, parse_expr(P, 1), NULL);
            expect_end(P);
            static const char *const ends[] = {"elif", "else", "endif", NULL};
            add_kid(P, x, parse_body(P, ends, &which), NULL);
            if (!strcmp(which, "elif")) continue;
            if (!strcmp(which, "else")) {
                expect_end(P);
                static const char *const end[] = {"endif", NULL};
                add_kid(P, x, parse_body(P, end, &which), NULL);
            }
            break;
        }
    } else if (is_name(t, "for")) {
        x = node(P, S_FOR, 4);
        const jstr *names[8];
        int nn = 0;
        do {
            if (nn == 8) perr(P, "too many loop targets");
            names[nn++] = expect_name(P, "expected a loop variable");
        } while (is_op(P->t, ',') && (P->t++, 1));
        keep_names(P, x, names, nn);
        if (!is_name(P->t, "in")) perr(P, "expected 'in' in a for loop");
        P->t++;
        x->kid[0] = parse_expr(P, 0);
        if (is_name(P->t, "if")) P->t++, x->kid[3] = parse_expr(P, 1);
        if (is_name(P->t, "recursive")) perr(P, "recursive loops are not supported");
        expect_end(P);
        static const char *const ends[] = {"else", "endfor", NULL};
        x->kid[1] = parse_body(P, ends, &which);
        if (!strcmp(which, "else")) {
            expect_end(P);
            static const char *const end[] = {"endfor", NULL};
            x->kid[2] = parse_body(P, end, &which);
        }
    } else if (is_name(t, "set")) {
        x = node(P, S_SET, 1);
        x->names = jalloc(P->c, sizeof *x->names);
        x->names[0] = expect_name(P, "expected a name to set");
        x->n_names = 1;
        if (is_op(P->t, '.')) P->t++, x->s = expect_name(P, "expected an attribute to set");
        if (is_op(P->t, '=')) {
            P->t++;
            x->kid[0] = parse_expr(P, 1);
        } else {
            if (x->s) perr(P, "expected '='");
            x->kind = S_SETBLOCK;
            expect_end(P);
            static const char *const end[] = {"endset", NULL};
            x->kid[0] = parse_body(P, end, &which);
        }
    } else if (is_name(t, "macro")) {
        x = node(P, S_MACRO, 0);
        x->s = expect_name(P, "expected a macro's name");
        expect_op(P, '(', "expected '(' after the macro's name");
        parse_params(P, x);
        expect_end(P);
        static const char *const end[] = {"endmacro", NULL};
        add_kid(P, x, parse_body(P, end, &which), NULL);
    } else if (is_name(t, "call")) { /* {% call[(params)] m(args) %}: m runs with caller, a macro of the body */
        x = node(P, S_CALLBLOCK, 2);
        jnode *m = node(P, S_MACRO, 0);
        m->s = str_new(P->c, "caller", 6);
        if (is_op(P->t, '(')) P->t++, parse_params(P, m);
        x->kid[0] = parse_expr(P, 1);
        if (x->kid[0]->kind != E_CALL) perr(P, "expected a macro's call after 'call'");
        expect_end(P);
        static const char *const end[] = {"endcall", NULL};
        add_kid(P, m, parse_body(P, end, &which), NULL);
        x->kid[1] = m;
    } else if (is_name(t, "filter")) { /* {% filter f(args) | g %}: the body's text through the filters */
        x = node(P, S_FILTERBLOCK, 2);
        jnode *f = node(P, E_FILTER, 0);
        f->s = expect_name(P, "expected a filter's name after 'filter'");
        jnode *text = node(P, E_BLOCK, 0);
        text->s = x->s = str_new(P->c, " block", 6); /* (a name no template can write) */
        add_kid(P, f, text, NULL);
        if (is_op(P->t, '(')) parse_args(P, f);
        x->kid[0] = parse_filters(P, f);
        expect_end(P);
        static const char *const end[] = {"endfilter", NULL};
        x->kid[1] = parse_body(P, end, &which);
    } else if (is_name(t, "with")) { /* {% with a = x, b = y %}: a scope of its own */
        x = node(P, S_WITH, 0);
        const jstr *names[64];
        int nn = 0;
        while (P->t->t == T_NAME) {
            if (nn == 64) perr(P, "too many names");
            names[nn++] = expect_name(P, "expected a name");
            expect_op(P, '=', "expected '=' after a name in 'with'");
            add_kid(P, x, parse_expr(P, 1), NULL);
            if (!is_op(P->t, ',')) break;
            P->t++;
        }
        keep_names(P, x, names, nn);
        expect_end(P);
        static const char *const end[] = {"endwith", NULL};
        add_kid(P, x, parse_body(P, end, &which), NULL);
    } else if (is_name(t, "break") || is_name(t, "continue")) {
        x = node(P, is_name(t, "break") ? S_BREAK : S_CONTINUE, 0);
    } else if (is_name(t, "generation")) { /* transformers' marker of the assistant's tokens: its body */
        expect_end(P);
        static const char *const end[] = {"endgeneration", NULL};
        x = parse_body(P, end, &which);
    } else {
        P->t--;
        perr(P, "unknown tag");
    }
    x->line = line;
    expect_end(P);
    return x;
}

static jnode *parse_body(parser *P, const char *const *ends, const char **which) {
    enter(P);
    jnode *body = node(P, S_BODY, 0);
    while (1) {
        const jtok *t = P->t;
        if (t->t == T_EOF) {
            if (ends) {
                int k = 0;
                while (ends[k + 1] && strncmp(ends[k], "end", 3)) k++;
                P->c->line = t->line;
                jfail(P->c, NV_EFORMAT, "missing {%% %s %%}", ends[k]);
            }
            break;
        }
        if (t->t == T_TEXT) {
            jnode *x = node(P, S_TEXT, 0);
            x->s = t->s;
            add_kid(P, body, x, NULL);
            P->t++;
        } else if (t->t == T_VBEG) {
            P->t++;
            jnode *x = node(P, S_OUT, 1);
            x->kid[0] = parse_expr(P, 1);
            if (P->t->t != T_VEND) perr(P, "expected '}}'");
            P->t++;
            add_kid(P, body, x, NULL);
        } else if (t->t == T_BBEG) {
            const jtok *name = t + 1;
            int end = -1;
            for (int i = 0; ends && ends[i]; i++)
                if (is_name(name, ends[i])) end = i;
            if (end >= 0) {
                *which = ends[end];
                P->t += 2;
                break;
            }
            P->t++;
            add_kid(P, body, parse_stmt(P), NULL);
        } else
            perr(P, "unexpected token");
    }
    P->depth--;
    return body;
}

struct nv_jinja {
    jctx c;
    jnode *body;
    const char *src; /* the text parsed, line breaks made "\n" */
};

nv_err nv_jinja_parse(const char *text, size_t n, nv_jinja **out) {
    *out = NULL;
    nv_jinja *j = calloc(1, sizeof *j);
    if (!j) return nv_fail(NV_ENOMEM, "out of memory");
    if (setjmp(j->c.jb)) {
        const nv_err e = nv_fail(j->c.code, "chat template: %s", j->c.msg);
        jctx_free(&j->c);
        free(j);
        return e;
    }
    /* as Jinja reads a source: every line break "\n", one at the very end dropped */
    char *src = jalloc(&j->c, n + 1);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (text[i] == '\r') {
            src[m++] = '\n';
            if (i + 1 < n && text[i + 1] == '\n') i++;
        } else
            src[m++] = text[i];
    }
    if (m && src[m - 1] == '\n') m--;
    src[m] = 0;
    j->src = src;
    lexer L = {.c = &j->c, .src = src, .n = m, .line = 1};
    lex(&L);
    parser P = {.c = &j->c, .t = L.v};
    j->body = parse_body(&P, NULL, NULL);
    *out = j;
    return NV_OK;
}

const char *nv_jinja_source(const nv_jinja *j) { return j ? j->src : NULL; }

void nv_jinja_free(nv_jinja *j) {
    if (!j) return;
    jctx_free(&j->c);
    free(j);
}

/* ---- rendering ---- */

typedef struct frame {
    jdict *vars;
    struct frame *parent;
} frame;

/* A macro as a value: its definition, and the scope it sees (NULL: the template's globals alone; a
 * call block's caller: the scope of the block, whose loop variables and sets its body reads). */
struct jmacro {
    const jnode *m;
    frame *scope;
};

typedef struct {
    jctx c;
    int calls;
    frame *root;
    jsink *out;
    frame *cur; /* the innermost scope */
} render;

enum { FN_RANGE = 1, FN_NAMESPACE, FN_DICT, FN_RAISE, FN_STRFTIME };

static void step(render *r, const jnode *x) {
    r->c.line = x->line;
    charge(&r->c, 1);
}

/* one level deeper in the render (leave() after): a template's nesting, however its tree leans */
static void enter_eval(render *r) {
    if (++r->c.depth > J_MAX_EVAL_DEPTH) jfail(&r->c, NV_ERANGE, "nested past %d levels", J_MAX_EVAL_DEPTH);
}
static void leave(render *r) { r->c.depth--; }

static const char *type_name(jval v) {
    static const char *const n[] = {"undefined", "none", "bool", "int", "float", "str", "list", "dict", "macro", "function"};
    return n[v.t];
}

/* v as a dict's key: a string as it is; a number's class ('i' for ints, bools and whole floats,
 * which Python takes for one key; 'f' other floats) and digits, or none's 'n', with its type */
static const jstr *key_of(jctx *c, jval v) {
    char text[40];
    if (v.t == V_STR) return v.u.s;
    if (v.t == V_BOOL || v.t == V_INT) snprintf(text, sizeof text, "i%lld", (long long)v.u.i);
    else if (v.t == V_FLOAT && v.u.f == floor(v.u.f) && v.u.f >= -0x1p63 && v.u.f < 0x1p63) snprintf(text, sizeof text, "i%lld", (long long)v.u.f);
    else if (v.t == V_FLOAT) snprintf(text, sizeof text, "f%.17g", v.u.f);
    else if (v.t == V_NONE) snprintf(text, sizeof text, "n");
    else jfail(c, NV_EFORMAT, "a %s cannot be a dict's key", type_name(v));
    jstr *k = str_new(c, text, strlen(text));
    k->kt = (unsigned char)v.t;
    return k;
}

static int truthy(jval v) {
    switch (v.t) {
    case V_UNDEF: case V_NONE: return 0;
    case V_BOOL: case V_INT: return v.u.i != 0;
    case V_FLOAT: return v.u.f != 0;
    case V_STR: return v.u.s->n != 0;
    case V_LIST: return v.u.l->n != 0;
    case V_DICT: return v.u.d->n != 0;
    default: return 1;
    }
}

static int is_num(jval v) { return v.t == V_INT || v.t == V_FLOAT || v.t == V_BOOL; }
static double num(jval v) { return v.t == V_FLOAT ? v.u.f : (double)v.u.i; }

static int equal(render *r, jval a, jval b, int depth) {
    if (depth > J_MAX_VALUE_DEPTH) jfail(&r->c, NV_ERANGE, "a value nested past %d levels", J_MAX_VALUE_DEPTH);
    charge(&r->c, 1);
    if (is_num(a) && is_num(b)) return a.t != V_FLOAT && b.t != V_FLOAT ? a.u.i == b.u.i : num(a) == num(b);
    if (a.t != b.t) return 0;
    switch (a.t) {
    case V_UNDEF: case V_NONE: return 1;
    case V_STR: return a.u.s->n == b.u.s->n && (charge(&r->c, BYTES(a.u.s->n)), !memcmp(a.u.s->s, b.u.s->s, a.u.s->n));
    case V_LIST:
        if (a.u.l->n != b.u.l->n || a.u.l->tuple != b.u.l->tuple) return 0;
        for (int i = 0; i < a.u.l->n; i++)
            if (!equal(r, a.u.l->v[i], b.u.l->v[i], depth + 1)) return 0;
        return 1;
    case V_DICT:
        if (a.u.d->n != b.u.d->n) return 0;
        for (int i = 0; i < a.u.d->n; i++) {
            const int k = dict_find_key(b.u.d, a.u.d->k[i]);
            if (k < 0 || !equal(r, a.u.d->v[i], b.u.d->v[k], depth + 1)) return 0;
        }
        return 1;
    case V_MACRO: return a.u.m->m == b.u.m->m;
    case V_FUNC: return a.u.fn == b.u.fn;
    default: return 0;
    }
}

/* <0, 0, >0 as Python orders numbers, strings and lists; anything else is an error */
static int order_at(render *r, jval a, jval b, int depth) {
    if (depth > J_MAX_VALUE_DEPTH) jfail(&r->c, NV_ERANGE, "a value nested past %d levels", J_MAX_VALUE_DEPTH);
    charge(&r->c, 1);
    if (is_num(a) && is_num(b)) {
        if (a.t != V_FLOAT && b.t != V_FLOAT) return (a.u.i > b.u.i) - (a.u.i < b.u.i);
        return (num(a) > num(b)) - (num(a) < num(b));
    }
    if (a.t == V_STR && b.t == V_STR) {
        const size_t n = a.u.s->n < b.u.s->n ? a.u.s->n : b.u.s->n;
        charge(&r->c, BYTES(n));
        const int k = memcmp(a.u.s->s, b.u.s->s, n);
        return k ? k : (a.u.s->n > b.u.s->n) - (a.u.s->n < b.u.s->n);
    }
    if (a.t == V_LIST && b.t == V_LIST) {
        for (int i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            if (!equal(r, a.u.l->v[i], b.u.l->v[i], depth + 1)) return order_at(r, a.u.l->v[i], b.u.l->v[i], depth + 1);
        }
        return (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
    }
    jfail(&r->c, NV_EFORMAT, "'<' not supported between %s and %s", type_name(a), type_name(b));
}
static int order(render *r, jval a, jval b) { return order_at(r, a, b, 0); }

static jval str_of(render *r, jval v) {
    if (v.t == V_STR) return v;
    jsink s = {0};
    put_str(&r->c, &s, v, 0);
    return sink_val(&r->c, &s);
}

static jval concat(render *r, const char *a, size_t na, const char *b, size_t nb) {
    if (na + nb > J_MAX_STRING) jfail(&r->c, NV_ERANGE, "a string past %zu MB", J_MAX_STRING >> 20);
    jstr *s = jalloc(&r->c, sizeof *s + na + nb + 1);
    memcpy(s->s, a, na);
    memcpy(s->s + na, b, nb);
    s->n = na + nb;
    return (jval){.t = V_STR, .u.s = s};
}

/* code points: their count, and the byte offset of each (off[n] = the length) */
static size_t cp_count(render *r, const jstr *s) {
    charge(&r->c, BYTES(s->n));
    size_t k = 0;
    for (size_t i = 0; i < s->n; i++) k += ((unsigned char)s->s[i] & 0xC0) != 0x80;
    return k;
}
static size_t *cp_offsets(render *r, const jstr *s, size_t *n) {
    *n = cp_count(r, s);
    size_t *off = jalloc(&r->c, sizeof *off * (*n + 1)), k = 0;
    for (size_t i = 0; i < s->n; i++)
        if (((unsigned char)s->s[i] & 0xC0) != 0x80) off[k++] = i;
    off[k] = s->n;
    return off;
}

/* a list of what iterating v gives: a list's items, a dict's keys, a string's characters */
static jlist *items_of(render *r, jval v, const char *what) {
    if (v.t == V_LIST) return v.u.l;
    if (v.t == V_UNDEF) return list_new(&r->c, 0);
    if (v.t == V_DICT) {
        jlist *l = list_new(&r->c, v.u.d->n);
        for (int i = 0; i < v.u.d->n; i++) list_push(&r->c, l, key_val(v.u.d->k[i]));
        return l;
    }
    if (v.t == V_STR) {
        size_t n;
        const size_t *off = cp_offsets(r, v.u.s, &n);
        jlist *l = list_new(&r->c, (int)(n > J_MAX_RANGE ? J_MAX_RANGE : n));
        for (size_t i = 0; i < n; i++) list_push(&r->c, l, vstr(&r->c, v.u.s->s + off[i], off[i + 1] - off[i]));
        return l;
    }
    jfail(&r->c, NV_EFORMAT, "%s: a %s is not iterable", what, type_name(v));
}

static jval get_attr(render *r, jval obj, const char *name, size_t n) {
    if (obj.t == V_UNDEF) jfail(&r->c, NV_EFORMAT, "'%.*s' of an undefined value", (int)n, name);
    if (obj.t == V_DICT) {
        const int i = dict_find(obj.u.d, name, n);
        return i < 0 ? UNDEF : obj.u.d->v[i];
    }
    return UNDEF;
}

static int64_t py_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }
static int py_space(unsigned char ch) { return is_ws((char)ch) || (ch >= 0x1c && ch <= 0x1f); }

/* Python's int(text, base): white space around, a sign, a prefix 0x/0o/0b that base allows (base 0:
 * as the prefix says, else 10; no leading zeros then), digits with single underscores between. */
static int py_int_text(const jstr *t, int base, int64_t *out) {
    const char *p = t->s, *e = t->s + t->n;
    while (p < e && py_space((unsigned char)*p)) p++;
    while (e > p && py_space((unsigned char)e[-1])) e--;
    int neg = 0;
    if (p < e && (*p == '+' || *p == '-')) neg = *p++ == '-';
    int b = base;
    if (e - p > 2 && p[0] == '0' && strchr("xXoObB", p[1])) {
        const int pb = p[1] == 'x' || p[1] == 'X' ? 16 : p[1] == 'o' || p[1] == 'O' ? 8 : 2;
        if (base == 0 || base == pb) b = pb, p += 2;
        if (p < e && *p == '_') p++; /* 0x_1f */
    }
    if (b == 0) {
        b = 10;
        for (const char *q = p; q + 1 < e && *q == '0'; q++) /* base 0 refuses 007 (not 000) */
            if (q[1] != '0' && q[1] != '_') return 0;
    }
    uint64_t v = 0;
    int digits = 0;
    for (; p < e; p++) {
        if (*p == '_' && digits && p + 1 < e && p[1] != '_') continue;
        const int d = *p >= '0' && *p <= '9' ? *p - '0' : *p >= 'a' && *p <= 'z' ? *p - 'a' + 10 : *p >= 'A' && *p <= 'Z' ? *p - 'A' + 10 : 99;
        if (d >= b) return 0;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)b) return 0;
        v = v * (uint64_t)b + (uint64_t)d, digits++;
    }
    if (!digits || v > (uint64_t)INT64_MAX + (uint64_t)neg) return 0;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 1;
}


static jval get_item(render *r, jval obj, jval key) {
    if (obj.t == V_UNDEF) jfail(&r->c, NV_EFORMAT, "an index of an undefined value");
    if (obj.t == V_DICT) {
        if (key.t == V_UNDEF || key.t == V_LIST || key.t == V_DICT || key.t == V_MACRO || key.t == V_FUNC) return UNDEF; /* (jinja2's: undefined) */
        const int i = dict_find_key(obj.u.d, key_of(&r->c, key));
        return i < 0 ? UNDEF : obj.u.d->v[i];
    }
    if ((obj.t == V_LIST || obj.t == V_STR) && (key.t == V_INT || key.t == V_BOOL)) {
        if (obj.t == V_LIST) {
            const int64_t i = py_index(key.u.i, obj.u.l->n);
            return i >= 0 && i < obj.u.l->n ? obj.u.l->v[i] : UNDEF;
        }
        const jstr *s = obj.u.s;
        const int64_t i = py_index(key.u.i, key.u.i < 0 ? (int64_t)cp_count(r, s) : 0);
        if (i < 0) return UNDEF;
        charge(&r->c, BYTES(s->n));
        int64_t k = -1; /* code points begun so far */
        for (size_t b = 0; b < s->n; b++) /* the i-th code point's bytes, found without a table */
            if (((unsigned char)s->s[b] & 0xC0) != 0x80 && ++k == i) {
                size_t e = b + 1;
                while (e < s->n && ((unsigned char)s->s[e] & 0xC0) == 0x80) e++;
                return vstr(&r->c, s->s + b, e - b);
            }
        return UNDEF;
    }
    return UNDEF;
}

static jval slice(render *r, jval obj, jval a, jval b, jval st) {
    int64_t step = 1;
    if (st.t == V_INT) step = st.u.i;
    else if (st.t != V_NONE && st.t != V_UNDEF) jfail(&r->c, NV_EFORMAT, "a slice's step must be an integer");
    if (!step) jfail(&r->c, NV_EFORMAT, "a slice's step cannot be zero");
    size_t n;
    const size_t *off = NULL;
    if (obj.t == V_LIST) n = (size_t)obj.u.l->n;
    else if (obj.t == V_STR) off = cp_offsets(r, obj.u.s, &n);
    else jfail(&r->c, NV_EFORMAT, "a %s cannot be sliced", type_name(obj));
    const int64_t L = (int64_t)n;
    int64_t lo, hi;
    for (int k = 0; k < 2; k++) {
        const jval v = k ? b : a;
        int64_t *o = k ? &hi : &lo;
        if (v.t == V_NONE || v.t == V_UNDEF) *o = step > 0 ? (k ? L : 0) : (k ? -1 : L - 1);
        else if (v.t == V_INT) {
            int64_t i = v.u.i;
            if (i < 0) i += L;
            if (step > 0) *o = i < 0 ? 0 : i > L ? L : i;
            else *o = i < 0 ? -1 : i >= L ? L - 1 : i;
        } else
            jfail(&r->c, NV_EFORMAT, "slice indices must be integers");
    }
    jlist *l = obj.t == V_LIST ? list_new(&r->c, 0) : NULL;
    if (l) l->tuple = obj.u.l->tuple;
    jsink s = {0};
    for (int64_t i = lo; step > 0 ? i < hi : i > hi;) {
        if (l) list_push(&r->c, l, obj.u.l->v[i]);
        else sink_put(&r->c, &s, obj.u.s->s + off[i], off[i + 1] - off[i]);
        if (step > 0 ? hi - i <= step : i - hi <= -step) break; /* (i += step could overflow) */
        i += step;
    }
    return l ? vlist(l) : sink_val(&r->c, &s);
}

static jval eval(render *r, const jnode *x);
static void exec_body(render *r, const jnode *body, frame *f, int *flow);

static jval lookup(frame *f, const jstr *name) {
    for (; f; f = f->parent) {
        const int i = dict_find(f->vars, name->s, name->n);
        if (i >= 0) return f->vars->v[i];
    }
    static const struct {
        const char *name;
        int fn;
    } fns[] = {{"range", FN_RANGE}, {"namespace", FN_NAMESPACE}, {"dict", FN_DICT}, {"raise_exception", FN_RAISE}, {"strftime_now", FN_STRFTIME}};
    for (size_t i = 0; i < sizeof fns / sizeof *fns; i++)
        if (strlen(fns[i].name) == name->n && !memcmp(fns[i].name, name->s, name->n)) return (jval){.t = V_FUNC, .u.fn = fns[i].fn};
    return UNDEF;
}

/* a call's evaluated arguments */
typedef struct {
    int n;
    jval *v;
    const jstr **kw;
} jargs;

static jargs eval_args(render *r, const jnode *x, int from) {
    jargs a = {.n = x->n - from};
    a.v = jalloc(&r->c, sizeof *a.v * (size_t)(a.n + 1));
    a.kw = jalloc(&r->c, sizeof *a.kw * (size_t)(a.n + 1));
    for (int i = 0; i < a.n; i++) a.v[i] = eval(r, x->kid[from + i]), a.kw[i] = x->kw ? x->kw[from + i] : NULL;
    return a;
}

/* argument `name` at position pos (after the subject), or fallback */
static jval arg(const jargs *a, int pos, const char *name, jval fallback) {
    int k = 0;
    for (int i = 0; i < a->n; i++) {
        if (a->kw[i]) {
            if (name && a->kw[i]->n == strlen(name) && !memcmp(a->kw[i]->s, name, a->kw[i]->n)) return a->v[i];
        } else if (k++ == pos)
            return a->v[i];
    }
    return fallback;
}

static int name_is(const jstr *s, const char *n) { return s->n == strlen(n) && !memcmp(s->s, n, s->n); }

static int64_t want_int(render *r, jval v, const char *what) {
    if (v.t != V_INT && v.t != V_BOOL) jfail(&r->c, NV_EFORMAT, "%s must be an integer, not a %s", what, type_name(v));
    return v.u.i;
}
static const jstr *want_str(render *r, jval v, const char *what) {
    if (v.t != V_STR) jfail(&r->c, NV_EFORMAT, "%s must be a string, not a %s", what, type_name(v));
    return v.u.s;
}

/* x op y for op + - *, an error past int64 (Python's integers do not overflow; these stop) */
static int64_t int_op(render *r, int op, int64_t x, int64_t y) {
    int64_t z;
    const int over = op == '+' ? __builtin_add_overflow(x, y, &z) : op == '-' ? __builtin_sub_overflow(x, y, &z) : __builtin_mul_overflow(x, y, &z);
    if (over) jfail(&r->c, NV_ERANGE, "an integer overflowed");
    return z;
}


/* the length of the white space character (Python's str.isspace) at p, before end; 0 if none */
static size_t space_at(const char *p, const char *end) {
    if (py_space((unsigned char)*p)) return 1;
    uint32_t cp;
    const size_t k = (unsigned char)*p >= 0x80 ? nv_utf8_get(p, end, &cp) : 0;
    return k && (cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
                 cp == 0x202F || cp == 0x205F || cp == 0x3000)
               ? k
               : 0;
}
/* the same for the character that ends at end, after start */
static size_t space_before(const char *start, const char *end) {
    const char *p = end - 1;
    while (p > start && end - p < 4 && ((unsigned char)*p & 0xC0) == 0x80) p--;
    return space_at(p, end) == (size_t)(end - p) ? (size_t)(end - p) : 0;
}

/* str.strip/lstrip/rstrip: whitespace, or the characters of chars (single bytes and whole code points) */
static jval strip(render *r, const jstr *s, jval chars, int left, int right) {
    size_t a = 0, b = s->n;
    const jstr *cs = chars.t == V_STR ? chars.u.s : NULL;
    if (chars.t != V_STR && chars.t != V_NONE && chars.t != V_UNDEF) jfail(&r->c, NV_EFORMAT, "strip's argument must be a string");
    if (cs) {
        while (left && a < b) {
            charge(&r->c, BYTES(cs->n) + 1);
            size_t k = 1;
            while (a + k < b && ((unsigned char)s->s[a + k] & 0xC0) == 0x80) k++;
            if (!memmem(cs->s, cs->n, s->s + a, k)) break;
            a += k;
        }
        while (right && b > a) {
            charge(&r->c, BYTES(cs->n) + 1);
            size_t k = 1;
            while (b - k > a && ((unsigned char)s->s[b - k] & 0xC0) == 0x80) k++;
            if (!memmem(cs->s, cs->n, s->s + b - k, k)) break;
            b -= k;
        }
    } else {
        for (size_t k; left && a < b && (k = space_at(s->s + a, s->s + b));) a += k;
        for (size_t k; right && b > a && (k = space_before(s->s + a, s->s + b));) b -= k;
    }
    return vstr(&r->c, s->s + a, b - a);
}

static jval replace(render *r, const jstr *s, const jstr *old, const jstr *new, int64_t count) {
    jsink o = {0};
    size_t i = 0;
    int64_t done = 0;
    if (!old->n) { /* Python: the new text between every character, and at both ends */
        size_t n;
        const size_t *off = cp_offsets(r, s, &n);
        for (size_t k = 0; k <= n; k++) {
            if (count < 0 || done < count) sink_put(&r->c, &o, new->s, new->n), done++;
            if (k < n) sink_put(&r->c, &o, s->s + off[k], off[k + 1] - off[k]);
        }
        return sink_val(&r->c, &o);
    }
    while (i < s->n) {
        const char *hit = (count < 0 || done < count) ? memmem(s->s + i, s->n - i, old->s, old->n) : NULL;
        if (!hit) break;
        sink_put(&r->c, &o, s->s + i, (size_t)(hit - s->s) - i);
        sink_put(&r->c, &o, new->s, new->n);
        i = (size_t)(hit - s->s) + old->n;
        done++;
    }
    sink_put(&r->c, &o, s->s + i, s->n - i);
    return sink_val(&r->c, &o);
}

static jval split(render *r, const jstr *s, jval sep, int64_t maxsplit) {
    jlist *l = list_new(&r->c, 4);
    size_t i = 0;
    if (sep.t == V_STR) {
        if (!sep.u.s->n) jfail(&r->c, NV_EFORMAT, "split: an empty separator");
        while (maxsplit < 0 || l->n < maxsplit) {
            const char *hit = memmem(s->s + i, s->n - i, sep.u.s->s, sep.u.s->n);
            if (!hit) break;
            list_push(&r->c, l, vstr(&r->c, s->s + i, (size_t)(hit - s->s) - i));
            i = (size_t)(hit - s->s) + sep.u.s->n;
        }
        list_push(&r->c, l, vstr(&r->c, s->s + i, s->n - i));
        return vlist(l);
    }
    if (sep.t != V_NONE && sep.t != V_UNDEF) jfail(&r->c, NV_EFORMAT, "split's separator must be a string");
    const char *end = s->s + s->n;
    while (1) { /* runs of white space; none at the ends (the rest past maxsplit keeps its end's) */
        for (size_t k; i < s->n && (k = space_at(s->s + i, end));) i += k;
        if (i >= s->n) break;
        if (maxsplit >= 0 && l->n >= maxsplit) {
            list_push(&r->c, l, vstr(&r->c, s->s + i, s->n - i));
            break;
        }
        size_t j = i;
        while (j < s->n && !space_at(s->s + j, end)) j++;
        list_push(&r->c, l, vstr(&r->c, s->s + i, j - i));
        i = j;
    }
    return vlist(l);
}

static jval case_map(render *r, const jstr *s, int mode) { /* 0 lower, 1 upper, 2 capitalize, 3 title (ASCII letters) */
    jstr *o = str_new(&r->c, s->s, s->n);
    int word = 0;
    for (size_t i = 0; i < o->n; i++) {
        char ch = o->s[i];
        const int alpha = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z');
        int up = mode == 1 || (mode == 2 && i == 0) || (mode == 3 && alpha && !word);
        if (up && ch >= 'a' && ch <= 'z') ch = (char)(ch - 32);
        else if (!up && ch >= 'A' && ch <= 'Z') ch = (char)(ch + 32);
        o->s[i] = ch;
        word = alpha || ((unsigned char)ch & 0x80) || is_digit(ch) || ch == '\'';
    }
    return (jval){.t = V_STR, .u.s = o};
}

static int starts_or_ends(render *r, const jstr *s, jval what, int end) {
    if (what.t == V_LIST) {
        for (int i = 0; i < what.u.l->n; i++)
            if (starts_or_ends(r, s, what.u.l->v[i], end)) return 1;
        return 0;
    }
    const jstr *p = want_str(r, what, end ? "endswith's argument" : "startswith's argument");
    return p->n <= s->n && !memcmp(s->s + (end ? s->n - p->n : 0), p->s, p->n);
}

static jval join(render *r, jlist *l, const jstr *sep) {
    jsink o = {0};
    for (int i = 0; i < l->n; i++) {
        if (i && sep) sink_put(&r->c, &o, sep->s, sep->n);
        put_str(&r->c, &o, l->v[i], 0);
    }
    return sink_val(&r->c, &o);
}

/* a dict's keys (what 0), values (1) or (key, value) tuples (2), in order */
static jval dict_entries(render *r, const jdict *d, int what) {
    jlist *l = list_new(&r->c, d->n);
    for (int i = 0; i < d->n; i++) {
        const jval k = key_val(d->k[i]);
        if (what == 2) {
            jlist *pair = list_new(&r->c, 2);
            pair->tuple = 1;
            list_push(&r->c, pair, k);
            list_push(&r->c, pair, d->v[i]);
            list_push(&r->c, l, vlist(pair));
        } else
            list_push(&r->c, l, what ? d->v[i] : k);
    }
    return vlist(l);
}

/* a string's, a dict's or a list's method */
static jval method(render *r, jval obj, const jstr *name, const jargs *a) {
    const jval a0 = arg(a, 0, NULL, UNDEF), a1 = arg(a, 1, NULL, UNDEF);
    if (obj.t == V_STR) {
        const jstr *s = obj.u.s;
        if (name_is(name, "strip")) return strip(r, s, a0, 1, 1);
        if (name_is(name, "lstrip")) return strip(r, s, a0, 1, 0);
        if (name_is(name, "rstrip")) return strip(r, s, a0, 0, 1);
        if (name_is(name, "split")) {
            const jval m = arg(a, 1, "maxsplit", vint(-1));
            return split(r, s, arg(a, 0, "sep", NONE), want_int(r, m, "maxsplit"));
        }
        if (name_is(name, "startswith") || name_is(name, "endswith")) {
            const jval from = arg(a, 1, "start", NONE), to = arg(a, 2, "end", NONE);
            const jstr *part = s;
            if (from.t != V_NONE || to.t != V_NONE) { /* s[start:end], as Python's str.startswith(prefix, start, end) */
                size_t n;
                const size_t *off = cp_offsets(r, s, &n);
                int64_t b = from.t == V_NONE ? 0 : py_index(want_int(r, from, "its start"), (int64_t)n);
                int64_t e = to.t == V_NONE ? (int64_t)n : py_index(want_int(r, to, "its end"), (int64_t)n);
                if (b > (int64_t)n) return vbool(0); /* (Python's: even for '') */
                b = b < 0 ? 0 : b;
                e = e < 0 ? 0 : e > (int64_t)n ? (int64_t)n : e;
                if (b > e) return vbool(0);
                part = str_new(&r->c, s->s + off[b], off[e] - off[b]);
            }
            return vbool(starts_or_ends(r, part, a0, name_is(name, "endswith")));
        }
        if (name_is(name, "lower")) return case_map(r, s, 0);
        if (name_is(name, "upper")) return case_map(r, s, 1);
        if (name_is(name, "capitalize")) return case_map(r, s, 2);
        if (name_is(name, "title")) return case_map(r, s, 3);
        if (name_is(name, "replace"))
            return replace(r, s, want_str(r, a0, "replace's first argument"), want_str(r, a1, "replace's second argument"),
                           a->n > 2 ? want_int(r, arg(a, 2, "count", vint(-1)), "replace's count") : -1);
        if (name_is(name, "find") || name_is(name, "rfind") || name_is(name, "count") || name_is(name, "index")) {
            const jstr *sub = want_str(r, a0, "its argument");
            charge(&r->c, BYTES(s->n) + 1);
            int64_t count = 0, at = -1;
            if (!sub->n) /* Python: the empty string is at every place, the end's too */
                count = (int64_t)cp_count(r, s) + 1, at = name_is(name, "rfind") ? (int64_t)s->n : 0;
            for (const char *p = s->s, *hit; sub->n && (hit = memmem(p, s->n - (size_t)(p - s->s), sub->s, sub->n)); p = hit + sub->n) {
                if (at < 0 || name_is(name, "rfind")) at = hit - s->s;
                count++;
                if (!name_is(name, "count") && !name_is(name, "rfind")) break;
                if (name_is(name, "rfind")) hit -= sub->n - 1; /* (overlapping: the last place it begins) */
            }
            if (name_is(name, "count")) return vint(count);
            if (at >= 0) { /* a byte offset: as code points */
                size_t k = 0;
                for (int64_t i = 0; i < at; i++) k += ((unsigned char)s->s[i] & 0xC0) != 0x80;
                at = (int64_t)k;
            } else if (name_is(name, "index"))
                jfail(&r->c, NV_EFORMAT, "index: substring not found");
            return vint(at);
        }
        if (name_is(name, "join")) return join(r, items_of(r, a0, "join"), s);
        if (name_is(name, "splitlines")) { /* Python's line boundaries; keepends keeps each line's */
            const int keep = truthy(arg(a, 0, "keepends", vbool(0)));
            jlist *l = list_new(&r->c, 4);
            charge(&r->c, BYTES(s->n));
            size_t i = 0;
            while (i < s->n) {
                size_t j = i, brk = 0;
                for (; j < s->n; j++) {
                    const unsigned char ch = (unsigned char)s->s[j], c1 = j + 1 < s->n ? (unsigned char)s->s[j + 1] : 0,
                                        c2 = j + 2 < s->n ? (unsigned char)s->s[j + 2] : 0;
                    if (ch == '\r') brk = c1 == '\n' ? 2 : 1;
                    else if (ch == '\n' || ch == '\v' || ch == '\f' || (ch >= 0x1c && ch <= 0x1e)) brk = 1;
                    else if (ch == 0xc2 && c1 == 0x85) brk = 2;                       /* U+0085 */
                    else if (ch == 0xe2 && c1 == 0x80 && (c2 == 0xa8 || c2 == 0xa9)) brk = 3; /* U+2028, U+2029 */
                    if (brk) break;
                }
                list_push(&r->c, l, vstr(&r->c, s->s + i, j - i + (keep ? brk : 0)));
                i = j + brk + !brk;
            }
            return vlist(l);
        }
        if (name_is(name, "removeprefix") || name_is(name, "removesuffix")) {
            const jstr *p = want_str(r, a0, "its argument");
            const int end = name_is(name, "removesuffix");
            if (starts_or_ends(r, s, a0, end)) return vstr(&r->c, s->s + (end ? 0 : p->n), s->n - p->n);
            return obj;
        }
        if (name_is(name, "isdigit") || name_is(name, "isalpha") || name_is(name, "isspace") || name_is(name, "isalnum") ||
            name_is(name, "isupper") || name_is(name, "islower")) {
            int ok = s->n > 0, cased = 0;
            for (size_t i = 0; i < s->n; i++) {
                const char ch = s->s[i];
                const int lo = ch >= 'a' && ch <= 'z', up = ch >= 'A' && ch <= 'Z';
                cased |= lo || up;
                if (name_is(name, "isdigit")) ok &= is_digit(ch);
                else if (name_is(name, "isalpha")) ok &= lo || up;
                else if (name_is(name, "isalnum")) ok &= lo || up || is_digit(ch);
                else if (name_is(name, "isspace")) ok &= py_space((unsigned char)ch);
                else if (name_is(name, "isupper")) ok &= !lo;
                else ok &= !up;
            }
            if (name_is(name, "isupper") || name_is(name, "islower")) ok = ok && cased;
            return vbool(ok);
        }
    } else if (obj.t == V_DICT) {
        const jdict *d = obj.u.d;
        if (name_is(name, "items")) return dict_entries(r, d, 2);
        if (name_is(name, "keys") || name_is(name, "values")) return dict_entries(r, d, name_is(name, "values"));
        if (name_is(name, "get")) {
            const jval v = get_item(r, obj, a0);
            return v.t == V_UNDEF ? arg(a, 1, "default", NONE) : v;
        }
        const int i = dict_find(d, name->s, name->n); /* a namespace's macro, or a dict's */
        if (i >= 0) return UNDEF;
    } else if (obj.t == V_LIST) {
        if (name_is(name, "append") || name_is(name, "pop") || name_is(name, "insert") || name_is(name, "extend") ||
            name_is(name, "remove") || name_is(name, "clear") || name_is(name, "sort") || name_is(name, "reverse"))
            jfail(&r->c, NV_EFORMAT, "list.%.*s: the template's values are immutable", (int)name->n, name->s);
        if (name_is(name, "index") || name_is(name, "count")) {
            int64_t count = 0, at = -1;
            for (int i = 0; i < obj.u.l->n; i++)
                if (equal(r, obj.u.l->v[i], a0, 0)) count++, at = at < 0 ? i : at;
            if (name_is(name, "count")) return vint(count);
            if (at < 0) jfail(&r->c, NV_EFORMAT, "list.index: not in the list");
            return vint(at);
        }
    }
    jfail(&r->c, NV_EFORMAT, "a %s has no method '%.*s'", type_name(obj), (int)name->n, name->s);
}

static jval call_macro(render *r, const jmacro *mc, const jargs *a, const jmacro *caller);

static jval call_fn(render *r, int fn, const jargs *a) {
    if (fn == FN_RANGE) {
        int64_t lo = 0, hi, st = 1;
        if (a->n == 1) hi = want_int(r, a->v[0], "range's argument");
        else if (a->n >= 2) {
            lo = want_int(r, a->v[0], "range's start"), hi = want_int(r, a->v[1], "range's stop");
            if (a->n > 2) st = want_int(r, a->v[2], "range's step");
        } else
            jfail(&r->c, NV_EFORMAT, "range: expected an argument");
        if (!st) jfail(&r->c, NV_EFORMAT, "range: the step cannot be zero");
        /* the count, in unsigned arithmetic: hi - lo may pass int64's range */
        const uint64_t span = st > 0 ? (hi > lo ? (uint64_t)hi - (uint64_t)lo : 0) : (lo > hi ? (uint64_t)lo - (uint64_t)hi : 0);
        const uint64_t each = st > 0 ? (uint64_t)st : (uint64_t)0 - (uint64_t)st, n = span / each + (span % each != 0);
        if (n > J_MAX_RANGE_CALL) jfail(&r->c, NV_ERANGE, "range past %d items", J_MAX_RANGE_CALL);
        jlist *l = list_new(&r->c, (int)n);
        for (int64_t i = 0; i < (int64_t)n; i++) list_push(&r->c, l, vint(lo + i * st));
        return vlist(l);
    }
    if (fn == FN_NAMESPACE || fn == FN_DICT) {
        jdict *d = dict_new(&r->c);
        d->ns = fn == FN_NAMESPACE;
        for (int i = 0; i < a->n; i++) {
            if (a->kw[i]) dict_set(&r->c, d, a->kw[i], a->v[i]);
            else if (a->v[i].t == V_DICT)
                for (int k = 0; k < a->v[i].u.d->n; k++) dict_set(&r->c, d, a->v[i].u.d->k[k], a->v[i].u.d->v[k]);
            else
                jfail(&r->c, NV_EFORMAT, "%s: expected keyword arguments", fn == FN_DICT ? "dict" : "namespace");
        }
        return (jval){.t = V_DICT, .u.d = d};
    }
    if (fn == FN_RAISE) {
        const jval m = str_of(r, a->n ? a->v[0] : UNDEF);
        jfail(&r->c, NV_EFORMAT, "raise_exception: %.200s", m.u.s->s);
    }
    /* FN_STRFTIME */
    const jstr *f = want_str(r, a->n ? a->v[0] : UNDEF, "strftime_now's format");
    const time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char buf[256];
    const size_t n = f->n < 128 ? strftime(buf, sizeof buf, f->s, &tm) : 0;
    return vstr(&r->c, buf, n);
}

static jval call_value(render *r, jval f, const jargs *a, const char *what) {
    if (f.t == V_MACRO) return call_macro(r, f.u.m, a, NULL);
    if (f.t == V_FUNC) return call_fn(r, f.u.fn, a);
    if (f.t == V_UNDEF) jfail(&r->c, NV_EFORMAT, "'%s' is undefined", what);
    jfail(&r->c, NV_EFORMAT, "'%s' is a %s, not callable", what, type_name(f));
}

/* v in seq: a substring, a dict's key, a list's item */
static int contains(render *r, jval seq, jval v) {
    if (seq.t == V_UNDEF) return 0; /* an undefined value iterates as nothing */
    if (seq.t == V_STR) {
        if (v.t != V_STR) jfail(&r->c, NV_EFORMAT, "'in <string>' requires a string, not a %s", type_name(v));
        charge(&r->c, BYTES(seq.u.s->n));
        return memmem(seq.u.s->s, seq.u.s->n, v.u.s->s, v.u.s->n) != NULL;
    }
    if (seq.t == V_DICT) return v.t != V_UNDEF && dict_find_key(seq.u.d, key_of(&r->c, v)) >= 0;
    if (seq.t == V_LIST) {
        for (int i = 0; i < seq.u.l->n; i++)
            if (equal(r, v, seq.u.l->v[i], 0)) return 1;
        return 0;
    }
    jfail(&r->c, NV_EFORMAT, "'in' a %s", type_name(seq));
}

/* the test named name of v (Jinja's builtin tests) */
static int test(render *r, const jstr *name, jval v, const jargs *a) {
    const jval a0 = arg(a, 0, NULL, UNDEF);
    if (name_is(name, "defined")) return v.t != V_UNDEF;
    if (name_is(name, "undefined")) return v.t == V_UNDEF;
    if (name_is(name, "none")) return v.t == V_NONE;
    if (name_is(name, "boolean")) return v.t == V_BOOL;
    if (name_is(name, "true")) return v.t == V_BOOL && v.u.i;
    if (name_is(name, "false")) return v.t == V_BOOL && !v.u.i;
    if (name_is(name, "integer")) return v.t == V_INT;
    if (name_is(name, "float")) return v.t == V_FLOAT;
    if (name_is(name, "number")) return is_num(v);
    if (name_is(name, "string")) return v.t == V_STR;
    if (name_is(name, "mapping")) return v.t == V_DICT;
    if (name_is(name, "iterable")) return v.t == V_LIST || v.t == V_DICT || v.t == V_STR || v.t == V_UNDEF;
    if (name_is(name, "sequence")) return v.t == V_LIST || v.t == V_DICT || v.t == V_STR;
    if (name_is(name, "callable")) return v.t == V_MACRO || v.t == V_FUNC;
    if (name_is(name, "odd") || name_is(name, "even")) return (want_int(r, v, "odd/even's value") % 2 != 0) == name_is(name, "odd");
    if (name_is(name, "divisibleby")) {
        const int64_t d = want_int(r, a0, "divisibleby's argument");
        return d && want_int(r, v, "divisibleby's value") % d == 0;
    }
    if (name_is(name, "sameas")) /* identity: the same object, or the same type and value */
        return v.t == a0.t && (v.t == V_LIST ? v.u.l == a0.u.l : v.t == V_DICT ? v.u.d == a0.u.d : equal(r, v, a0, 0));
    if (name_is(name, "eq") || name_is(name, "equalto") || name_is(name, "=="))
        return equal(r, v, a0, 0);
    if (name_is(name, "ne") || name_is(name, "!=")) return !equal(r, v, a0, 0);
    if (name_is(name, "lt") || name_is(name, "lessthan") || name_is(name, "<")) return order(r, v, a0) < 0;
    if (name_is(name, "le") || name_is(name, "<=")) return order(r, v, a0) <= 0;
    if (name_is(name, "gt") || name_is(name, "greaterthan") || name_is(name, ">")) return order(r, v, a0) > 0;
    if (name_is(name, "ge") || name_is(name, ">=")) return order(r, v, a0) >= 0;
    if (name_is(name, "in")) return contains(r, a0, v);
    if (name_is(name, "lower") || name_is(name, "upper")) {
        const jstr *s = want_str(r, v, "its value");
        for (size_t i = 0; i < s->n; i++)
            if ((name_is(name, "lower") && s->s[i] >= 'A' && s->s[i] <= 'Z') || (name_is(name, "upper") && s->s[i] >= 'a' && s->s[i] <= 'z'))
                return 0;
        return 1;
    }
    if (name_is(name, "escaped")) return 0;
    jfail(&r->c, NV_EFORMAT, "no test named '%.*s'", (int)name->n, name->s);
}

/* a dotted attribute path of v ("a.b"), as Jinja's attribute= arguments */
static jval attr_path(render *r, jval v, const jstr *path) {
    size_t i = 0;
    while (i <= path->n) {
        const char *dot = memchr(path->s + i, '.', path->n - i);
        const size_t e = dot ? (size_t)(dot - path->s) : path->n;
        if (v.t == V_UNDEF) return UNDEF;
        int all_digits = e > i;
        for (size_t k = i; k < e; k++) all_digits &= is_digit(path->s[k]);
        /* jinja2's: a part of digits is an int index (a dict's number key, never its string key '0') */
        v = all_digits && (v.t == V_LIST || v.t == V_DICT) && e - i < 19 ? get_item(r, v, vint(strtoll(path->s + i, NULL, 10)))
                                                                          : get_attr(r, v, path->s + i, e - i);
        i = e + 1;
    }
    return v;
}

static jval filter(render *r, const jstr *name, jval v, const jargs *a);

/* selectattr/rejectattr/select/reject: items kept when their test (or truthiness) is want */
static jval select_items(render *r, jval v, const jargs *a, int by_attr, int want) {
    jlist *in = items_of(r, v, "select"), *out = list_new(&r->c, in->n);
    const jstr *attr = by_attr ? want_str(r, arg(a, 0, NULL, UNDEF), "the attribute") : NULL;
    const int t0 = by_attr ? 1 : 0;
    const jval tname = arg(a, t0, NULL, UNDEF);
    jargs rest = {.n = 0, .v = a->v, .kw = a->kw};
    if (a->n > t0 + 1) rest.n = a->n - t0 - 1, rest.v = a->v + t0 + 1, rest.kw = a->kw + t0 + 1;
    for (int i = 0; i < in->n; i++) {
        const jval x = attr ? attr_path(r, in->v[i], attr) : in->v[i];
        const int ok = tname.t == V_UNDEF ? truthy(x) : test(r, want_str(r, tname, "the test's name"), x, &rest);
        if (ok == want) list_push(&r->c, out, in->v[i]);
    }
    return vlist(out);
}

static int sort_cmp(render *r, jval a, jval b, const jstr *attr, int case_sensitive) {
    if (attr) a = attr_path(r, a, attr), b = attr_path(r, b, attr);
    if (!case_sensitive && a.t == V_STR && b.t == V_STR) a = case_map(r, a.u.s, 0), b = case_map(r, b.u.s, 0);
    return order(r, a, b);
}

/* v[0..n) sorted by sort_cmp, stably (Python's sorted; reversed too), key0: by pairs' first items */
static void sort_values(render *r, jval *v, int n, const jstr *at, int cs, int rev, int key0) {
    jval *tmp = n > 1 ? jalloc(&r->c, sizeof *tmp * (size_t)n) : NULL;
    for (int w = 1; w < n; w *= 2) {
        for (int lo = 0; lo < n; lo += 2 * w) {
            const int mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                const int c = sort_cmp(r, key0 ? v[i].u.l->v[0] : v[i], key0 ? v[j].u.l->v[0] : v[j], at, cs);
                tmp[k++] = (rev ? -c : c) <= 0 ? v[i++] : v[j++];
            }
            while (i < mid) tmp[k++] = v[i++];
            while (j < hi) tmp[k++] = v[j++];
        }
        memcpy(v, tmp, sizeof *v * (size_t)n);
    }
}

static jval filter(render *r, const jstr *name, jval v, const jargs *a) {
    const jval a0 = arg(a, 0, NULL, UNDEF);
    if (name_is(name, "length") || name_is(name, "count")) {
        if (v.t == V_STR) return vint((int64_t)cp_count(r, v.u.s));
        if (v.t == V_LIST) return vint(v.u.l->n);
        if (v.t == V_DICT) return vint(v.u.d->n);
        if (v.t == V_UNDEF) return vint(0);
        jfail(&r->c, NV_EFORMAT, "length of a %s", type_name(v));
    }
    if (name_is(name, "trim")) return strip(r, str_of(r, v).u.s, arg(a, 0, "chars", NONE), 1, 1);
    if (name_is(name, "upper")) return case_map(r, str_of(r, v).u.s, 1);
    if (name_is(name, "lower")) return case_map(r, str_of(r, v).u.s, 0);
    if (name_is(name, "capitalize")) return case_map(r, str_of(r, v).u.s, 2);
    if (name_is(name, "title")) return case_map(r, str_of(r, v).u.s, 3);
    if (name_is(name, "string")) return str_of(r, v);
    if (name_is(name, "safe")) return v;
    if (name_is(name, "default") || name_is(name, "d")) {
        const int boolean = truthy(arg(a, 1, "boolean", vbool(0)));
        return (v.t == V_UNDEF || (boolean && !truthy(v))) ? arg(a, 0, "default_value", vcstr(&r->c, "")) : v;
    }
    if (name_is(name, "join")) {
        const jval attr = arg(a, 1, "attribute", UNDEF);
        jlist *l = items_of(r, v, "join");
        if (attr.t == V_STR) {
            jlist *m = list_new(&r->c, l->n);
            for (int i = 0; i < l->n; i++) list_push(&r->c, m, attr_path(r, l->v[i], attr.u.s));
            l = m;
        }
        const jval sep = arg(a, 0, "d", vcstr(&r->c, ""));
        return join(r, l, str_of(r, sep).u.s);
    }
    if (name_is(name, "first") || name_is(name, "last")) {
        jlist *l = items_of(r, v, name->s);
        return l->n ? l->v[name_is(name, "first") ? 0 : l->n - 1] : UNDEF;
    }
    if (name_is(name, "list")) {
        jlist *in = items_of(r, v, "list"), *out = list_new(&r->c, in->n);
        for (int i = 0; i < in->n; i++) list_push(&r->c, out, in->v[i]);
        return vlist(out);
    }
    if (name_is(name, "items") || name_is(name, "dictsort")) {
        if (v.t == V_UNDEF) return vlist(list_new(&r->c, 0));
        if (v.t != V_DICT) jfail(&r->c, NV_EFORMAT, "%s of a %s", name->s, type_name(v));
        jval l = dict_entries(r, v.u.d, 2);
        if (name_is(name, "dictsort")) {
            const int cs = truthy(arg(a, 0, "case_sensitive", vbool(0))), rev = truthy(arg(a, 2, "reverse", vbool(0)));
            sort_values(r, l.u.l->v, l.u.l->n, NULL, cs, rev, 1);
        }
        return l;
    }
    if (name_is(name, "selectattr") || name_is(name, "rejectattr")) return select_items(r, v, a, 1, name_is(name, "selectattr"));
    if (name_is(name, "select") || name_is(name, "reject")) return select_items(r, v, a, 0, name_is(name, "select"));
    if (name_is(name, "map")) {
        jlist *in = items_of(r, v, "map"), *out = list_new(&r->c, in->n);
        const jval attr = arg(a, -1, "attribute", UNDEF);
        if (attr.t != V_UNDEF) {
            const jval def = arg(a, -1, "default", UNDEF);
            for (int i = 0; i < in->n; i++) {
                jval x = attr_path(r, in->v[i], str_of(r, attr).u.s);
                list_push(&r->c, out, x.t == V_UNDEF ? def : x);
            }
        } else {
            const jstr *f = want_str(r, a0, "map's filter");
            jargs rest = {.n = a->n - 1, .v = a->v + 1, .kw = a->kw + 1};
            for (int i = 0; i < in->n; i++) list_push(&r->c, out, filter(r, f, in->v[i], &rest));
        }
        return vlist(out);
    }
    if (name_is(name, "replace")) {
        const jval cnt = arg(a, 2, "count", NONE);
        return replace(r, str_of(r, v).u.s, str_of(r, a0).u.s, str_of(r, arg(a, 1, NULL, UNDEF)).u.s,
                       cnt.t == V_NONE ? -1 : want_int(r, cnt, "replace's count"));
    }
    if (name_is(name, "tojson")) {
        /* transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
        json_style st = {.indent = -1, .item_sep = ", ", .key_sep = ": ", .ascii = truthy(arg(a, 0, "ensure_ascii", vbool(0)))};
        const jval ind = arg(a, 1, "indent", NONE);
        if (ind.t != V_NONE) st.indent = (int)want_int(r, ind, "tojson's indent"), st.item_sep = ",";
        if (st.indent > 64) st.indent = 64;
        const jval seps = arg(a, 2, "separators", NONE);
        if (seps.t == V_LIST && seps.u.l->n == 2)
            st.item_sep = want_str(r, seps.u.l->v[0], "a separator")->s, st.key_sep = want_str(r, seps.u.l->v[1], "a separator")->s;
        st.sort_keys = truthy(arg(a, 3, "sort_keys", vbool(0)));
        jsink s = {0};
        put_json(&r->c, &s, v, &st, 0);
        return sink_val(&r->c, &s);
    }
    if (name_is(name, "reverse")) {
        if (v.t == V_STR) return slice(r, v, NONE, NONE, vint(-1));
        jlist *in = items_of(r, v, "reverse"), *out = list_new(&r->c, in->n);
        for (int i = in->n - 1; i >= 0; i--) list_push(&r->c, out, in->v[i]);
        return vlist(out);
    }
    if (name_is(name, "sort") || name_is(name, "unique") || name_is(name, "min") || name_is(name, "max")) {
        const int is_sort = name_is(name, "sort");
        const int rev = is_sort && truthy(arg(a, 0, "reverse", vbool(0)));
        const int cs = truthy(arg(a, is_sort ? 1 : 0, "case_sensitive", vbool(0)));
        const jval attr = arg(a, is_sort ? 2 : 1, "attribute", UNDEF);
        const jstr *at = attr.t == V_STR ? attr.u.s : NULL;
        jlist *in = items_of(r, v, name->s), *out = list_new(&r->c, in->n);
        if (name_is(name, "unique")) {
            for (int i = 0; i < in->n; i++) {
                int seen = 0;
                for (int k = 0; k < out->n && !seen; k++) seen = sort_cmp(r, out->v[k], in->v[i], at, cs) == 0;
                if (!seen) list_push(&r->c, out, in->v[i]);
            }
            return vlist(out);
        }
        if (!is_sort) { /* the first least or greatest, as Python's min and max */
            jval best = in->n ? in->v[0] : UNDEF;
            for (int i = 1; i < in->n; i++) {
                const int c = sort_cmp(r, in->v[i], best, at, cs);
                if (name_is(name, "min") ? c < 0 : c > 0) best = in->v[i];
            }
            return best;
        }
        for (int i = 0; i < in->n; i++) list_push(&r->c, out, in->v[i]);
        sort_values(r, out->v, out->n, at, cs, rev, 0);
        return vlist(out);
    }
    if (name_is(name, "indent")) {
        const jval w = arg(a, 0, "width", vint(4));
        const int first = truthy(arg(a, 1, "first", vbool(0))), blank = truthy(arg(a, 2, "blank", vbool(0)));
        jsink pad = {0};
        if (w.t == V_STR) sink_put(&r->c, &pad, w.u.s->s, w.u.s->n);
        else
            for (int64_t i = 0, n = want_int(r, w, "indent's width"); i < n && i < 256; i++) sink_puts(&r->c, &pad, " ");
        const jstr *s = str_of(r, v).u.s;
        jsink o = {0};
        size_t i = 0;
        for (int line = 0; i <= s->n; line++) {
            const char *nl = memchr(s->s + i, '\n', s->n - i);
            const size_t e = nl ? (size_t)(nl - s->s) : s->n;
            if ((line || first) && (blank || e > i) && pad.n) sink_put(&r->c, &o, pad.p, pad.n);
            sink_put(&r->c, &o, s->s + i, e - i);
            if (!nl) break;
            sink_puts(&r->c, &o, "\n");
            i = e + 1;
        }
        return sink_val(&r->c, &o);
    }
    if (name_is(name, "escape") || name_is(name, "e") || name_is(name, "forceescape")) {
        const jstr *s = str_of(r, v).u.s;
        jsink o = {0};
        for (size_t i = 0; i < s->n; i++) {
            const char ch = s->s[i];
            sink_puts(&r->c, &o, ch == '&' ? "&amp;" : ch == '<' ? "&lt;" : ch == '>' ? "&gt;" : ch == '"' ? "&#34;" : ch == '\'' ? "&#39;" : (char[]){ch, 0});
        }
        return sink_val(&r->c, &o);
    }
    if (name_is(name, "abs")) {
        if (v.t == V_FLOAT) return vfloat(fabs(v.u.f));
        const int64_t i = want_int(r, v, "abs's value");
        return vint(int_op(r, '*', i, i < 0 ? -1 : 1));
    }
    if (name_is(name, "int")) {
        const jval def = arg(a, 0, "default", vint(0));
        const int64_t base = want_int(r, arg(a, 1, "base", vint(10)), "int's base"); /* (another: no text is a number) */
        if (v.t == V_INT || v.t == V_BOOL) return vint(v.u.i);
        if (v.t == V_FLOAT) return isfinite(v.u.f) && fabs(v.u.f) < 9e18 ? vint((int64_t)v.u.f) : def;
        if (v.t == V_STR) {
            int64_t got;
            if ((base == 0 || (base >= 2 && base <= 36)) && py_int_text(v.u.s, (int)base, &got)) return vint(got);
            /* int(float(text)): Python's float syntax (digits with single underscores between them, a point, an
               exponent; not C's hex, inf or nan) */
            char lit[64];
            size_t k = 0;
            const char *p = v.u.s->s, *e = v.u.s->s + v.u.s->n;
            while (p < e && py_space((unsigned char)*p)) p++;
            while (e > p && py_space((unsigned char)e[-1])) e--;
            for (const char *q = p; q < e && k + 1 < sizeof lit; q++) {
                if (*q == '_' && q > p && q + 1 < e && is_digit(q[-1]) && is_digit(q[1])) continue;
                if (!is_digit(*q) && !strchr("+-.eE", *q)) return def;
                lit[k++] = *q;
            }
            if (k == 0 || k + 1 >= sizeof lit) return def;
            lit[k] = 0;
            char *end;
            const double d = strtod(lit, &end);
            return end != lit && !*end && isfinite(d) && fabs(d) < 9e18 ? vint((int64_t)d) : def;
        }
        return def;
    }
    if (name_is(name, "float")) {
        if (is_num(v)) return vfloat(num(v));
        if (v.t == V_STR) {
            char *end;
            const double d = strtod(v.u.s->s, &end);
            if (end != v.u.s->s && !*end) return vfloat(d);
        }
        return arg(a, 0, "default", vfloat(0));
    }
    if (name_is(name, "round")) {
        const int64_t p = want_int(r, arg(a, 0, "precision", vint(0)), "round's precision");
        const jval m = arg(a, 1, "method", UNDEF);
        const int64_t pp = p > 15 ? 15 : p < -15 ? -15 : p;
        const double k = pow(10, (double)(pp < 0 ? -pp : pp)), x = pp < 0 ? num(is_num(v) ? v : vfloat(0)) / k : num(is_num(v) ? v : vfloat(0)) * k;
        const int common = !(m.t == V_STR && (name_is(m.u.s, "floor") || name_is(m.u.s, "ceil")));
        const double y = !common && name_is(m.u.s, "floor") ? floor(x) : !common ? ceil(x) : nearbyint(x);
        if (common && (v.t == V_INT || v.t == V_BOOL)) { /* Python's round(int, p): an int, half to even */
            if (p >= 0) return vint(v.u.i);
            if (p < -18) { /* 10^-p past any int64: 0, unless half of it is reached (then past int64 too) */
                if (p == -19 && (v.u.i >= 5000000000000000000ll || v.u.i <= -5000000000000000000ll))
                    jfail(&r->c, NV_ERANGE, "round: integer overflow");
                return vint(0);
            }
            int64_t m = 1;
            for (int64_t e = 0; e < -p; e++) m *= 10;
            const int64_t q = v.u.i / m, rem = v.u.i % m, half = m / 2;
            int64_t rq = q;
            if (rem > half || (rem == half && (q & 1))) rq = q + 1;
            else if (rem < -half || (rem == -half && (q & 1))) rq = q - 1;
            return vint(int_op(r, '*', rq, m));
        }
        return vfloat(pp < 0 ? y * k : y / k);
    }
    if (name_is(name, "sum")) {
        jlist *in = items_of(r, v, "sum");
        const jval attr = arg(a, 0, "attribute", UNDEF);
        jval acc = arg(a, 1, "start", vint(0));
        for (int i = 0; i < in->n; i++) {
            const jval x = attr.t == V_STR ? attr_path(r, in->v[i], attr.u.s) : in->v[i];
            if (!is_num(x) || !is_num(acc)) jfail(&r->c, NV_EFORMAT, "sum of a %s", type_name(x));
            acc = acc.t == V_FLOAT || x.t == V_FLOAT ? vfloat(num(acc) + num(x)) : vint(int_op(r, '+', acc.u.i, x.u.i));
        }
        return acc;
    }
    if (name_is(name, "wordcount")) return vint(split(r, str_of(r, v).u.s, NONE, -1).u.l->n);
    if (name_is(name, "center")) {
        const jstr *s = str_of(r, v).u.s;
        const int64_t w = want_int(r, arg(a, 0, "width", vint(80)), "center's width"), n = (int64_t)cp_count(r, s);
        if (w <= n) return (jval){.t = V_STR, .u.s = s};
        const int64_t left = (w - n) / 2 + ((w - n) & w & 1);
        jsink o = {0};
        for (int64_t i = 0; i < left && i < 4096; i++) sink_puts(&r->c, &o, " ");
        sink_put(&r->c, &o, s->s, s->n);
        for (int64_t i = 0; i < w - n - left && i < 4096; i++) sink_puts(&r->c, &o, " ");
        return sink_val(&r->c, &o);
    }
    jfail(&r->c, NV_EFORMAT, "no filter named '%.*s'", (int)name->n, name->s);
}


static jval repeat(render *r, jval s, int64_t n) {
    const int64_t each = s.t == V_LIST ? s.u.l->n : (int64_t)s.u.s->n, most = s.t == V_LIST ? J_MAX_RANGE : (int64_t)J_MAX_STRING;
    if (n <= 0 || !each) return s.t == V_LIST ? vlist(list_new(&r->c, 0)) : vstr(&r->c, "", 0);
    if (each > most / n) jfail(&r->c, NV_ERANGE, "%s", s.t == V_LIST ? "a list past its limit" : "a string past its limit (16 MB)");
    jsink o = {0};
    jlist *l = s.t == V_LIST ? list_new(&r->c, 0) : NULL;
    for (int64_t i = 0; i < n; i++) {
        if (l) {
            if ((int64_t)l->n + s.u.l->n > J_MAX_RANGE) jfail(&r->c, NV_ERANGE, "a list past %d items", J_MAX_RANGE);
            for (int k = 0; k < s.u.l->n; k++) list_push(&r->c, l, s.u.l->v[k]);
        } else
            sink_put(&r->c, &o, s.u.s->s, s.u.s->n);
    }
    return l ? vlist(l) : sink_val(&r->c, &o);
}

static jval binop(render *r, int op, jval a, jval b) {
    if (op == '~') {
        const jval x = str_of(r, a), y = str_of(r, b);
        return concat(r, x.u.s->s, x.u.s->n, y.u.s->s, y.u.s->n);
    }
    if (op == OP_EQ) return vbool(equal(r, a, b, 0));
    if (op == OP_NE) return vbool(!equal(r, a, b, 0));
    if (op == '<') return vbool(order(r, a, b) < 0);
    if (op == '>') return vbool(order(r, a, b) > 0);
    if (op == OP_LE) return vbool(order(r, a, b) <= 0);
    if (op == OP_GE) return vbool(order(r, a, b) >= 0);
    if (op == OP_IN || op == OP_NOTIN) return vbool(contains(r, b, a) == (op == OP_IN));
    if (op == '+') {
        if (a.t == V_STR && b.t == V_STR) return concat(r, a.u.s->s, a.u.s->n, b.u.s->s, b.u.s->n);
        if (a.t == V_LIST && b.t == V_LIST) {
            if (a.u.l->tuple != b.u.l->tuple)
                jfail(&r->c, NV_EFORMAT, "can only concatenate %s (not %s) to %s", a.u.l->tuple ? "tuple" : "list",
                      b.u.l->tuple ? "tuple" : "list", a.u.l->tuple ? "tuple" : "list");
            jlist *l = list_new(&r->c, a.u.l->n + b.u.l->n);
            l->tuple = a.u.l->tuple;
            for (int i = 0; i < a.u.l->n; i++) list_push(&r->c, l, a.u.l->v[i]);
            for (int i = 0; i < b.u.l->n; i++) list_push(&r->c, l, b.u.l->v[i]);
            return vlist(l);
        }
    }
    if (op == '*' && (a.t == V_STR || a.t == V_LIST) && (b.t == V_INT || b.t == V_BOOL)) return repeat(r, a, b.u.i);
    if (op == '*' && (b.t == V_STR || b.t == V_LIST) && (a.t == V_INT || a.t == V_BOOL)) return repeat(r, b, a.u.i);
    if (!is_num(a) || !is_num(b))
        jfail(&r->c, NV_EFORMAT, "unsupported operand types for '%s': %s and %s",
              op == OP_FLOORDIV ? "//" : op == OP_POW ? "**" : (char[]){(char)op, 0}, type_name(a), type_name(b));
    const int ints = a.t != V_FLOAT && b.t != V_FLOAT;
    const int64_t x = a.u.i, y = b.u.i;
    switch (op) {
    case '+': return ints ? vint(int_op(r, '+', x, y)) : vfloat(num(a) + num(b));
    case '-': return ints ? vint(int_op(r, '-', x, y)) : vfloat(num(a) - num(b));
    case '*': return ints ? vint(int_op(r, '*', x, y)) : vfloat(num(a) * num(b));
    case '/':
        if (num(b) == 0) jfail(&r->c, NV_EFORMAT, "division by zero");
        return vfloat(num(a) / num(b));
    case OP_FLOORDIV: case '%':
        if (num(b) == 0) jfail(&r->c, NV_EFORMAT, "division by zero");
        if (ints) {
            if (x == INT64_MIN && y == -1) jfail(&r->c, NV_ERANGE, "an integer overflowed");
            int64_t q = x / y, m = x % y;
            if (m && ((m < 0) != (y < 0))) q--, m += y;
            return vint(op == '%' ? m : q);
        } else {
            const double q = floor(num(a) / num(b));
            return vfloat(op == '%' ? num(a) - q * num(b) : q);
        }
    case OP_POW:
        if (ints && y >= 0) {
            int64_t p = 1;
            for (int64_t i = 0; i < y; i++) {
                p = int_op(r, '*', p, x);
                if (p == 0 || p == 1) break;
                if (p == -1) {
                    p = (y % 2) ? -1 : 1;
                    break;
                }
            }
            return vint(p);
        }
        return vfloat(pow(num(a), num(b)));
    }
    jfail(&r->c, NV_EFORMAT, "an unknown operator");
}

static frame *push_frame(render *r, frame *parent) {
    frame *f = jalloc(&r->c, sizeof *f);
    f->vars = dict_new(&r->c);
    f->parent = parent;
    return f;
}

static jval eval_node(render *r, const jnode *x) {
    step(r, x);
    switch (x->kind) {
    case E_LIT: return x->lit;
    case E_NAME:
    case E_BLOCK: return lookup(r->cur, x->s);
    case E_ATTR: return get_attr(r, eval(r, x->kid[0]), x->s->s, x->s->n);
    case E_INDEX: return get_item(r, eval(r, x->kid[0]), eval(r, x->kid[1]));
    case E_SLICE: {
        const jval o = eval(r, x->kid[0]);
        jval p[3];
        for (int k = 0; k < 3; k++) p[k] = x->kid[1 + k] ? eval(r, x->kid[1 + k]) : NONE;
        return slice(r, o, p[0], p[1], p[2]);
    }
    case E_CALL: {
        const jnode *f = x->kid[0];
        if (f->kind == E_ATTR) { /* a method, or a callable attribute */
            const jval obj = eval(r, f->kid[0]);
            const jargs a = eval_args(r, x, 1);
            const jval m = obj.t == V_DICT ? get_attr(r, obj, f->s->s, f->s->n) : UNDEF;
            if (m.t == V_MACRO || m.t == V_FUNC) return call_value(r, m, &a, f->s->s);
            if (obj.t == V_UNDEF) jfail(&r->c, NV_EFORMAT, "'%s' of an undefined value", f->s->s);
            return method(r, obj, f->s, &a);
        }
        const jval fn = eval(r, f);
        const jargs a = eval_args(r, x, 1);
        return call_value(r, fn, &a, f->kind == E_NAME ? f->s->s : "the expression");
    }
    case E_FILTER: {
        const jval v = eval(r, x->kid[0]);
        const jargs a = eval_args(r, x, 1);
        return filter(r, x->s, v, &a);
    }
    case E_TEST: {
        const jval v = eval(r, x->kid[0]);
        const jargs a = eval_args(r, x, 1);
        return vbool(test(r, x->s, v, &a) != x->op);
    }
    case E_NOT: return vbool(!truthy(eval(r, x->kid[0])));
    case E_NEG: {
        const jval v = eval(r, x->kid[0]);
        if (v.t == V_FLOAT) return vfloat(-v.u.f);
        if ((v.t == V_INT || v.t == V_BOOL) && v.u.i != INT64_MIN) return vint(-v.u.i);
        jfail(&r->c, NV_EFORMAT, "bad operand type for unary -: %s", type_name(v));
    }
    case E_BIN: {
        const jval a = eval(r, x->kid[0]), b = eval(r, x->kid[1]);
        r->c.line = x->line;
        return binop(r, x->op, a, b);
    }
    case E_AND: {
        const jval a = eval(r, x->kid[0]);
        return truthy(a) ? eval(r, x->kid[1]) : a;
    }
    case E_OR: {
        const jval a = eval(r, x->kid[0]);
        return truthy(a) ? a : eval(r, x->kid[1]);
    }
    case E_COND:
        if (truthy(eval(r, x->kid[0]))) return eval(r, x->kid[1]);
        return x->kid[2] ? eval(r, x->kid[2]) : UNDEF;
    case E_LIST: {
        jlist *l = list_new(&r->c, x->n);
        l->tuple = x->op == OP_TUPLE;
        for (int i = 0; i < x->n; i++) list_push(&r->c, l, eval(r, x->kid[i]));
        return vlist(l);
    }
    case E_DICT: {
        jdict *d = dict_new(&r->c);
        for (int i = 0; i + 1 < x->n; i += 2) {
            const jval k = eval(r, x->kid[i]);
            dict_set(&r->c, d, key_of(&r->c, k), eval(r, x->kid[i + 1]));
        }
        return (jval){.t = V_DICT, .u.d = d};
    }
    default: jfail(&r->c, NV_EFORMAT, "not an expression");
    }
}

static jval eval(render *r, const jnode *x) {
    enter_eval(r);
    const jval v = eval_node(r, x);
    leave(r);
    return v;
}

/* renders body into a new string in scope f; a break or continue stops it and is left in *flow */
static jval capture_flow(render *r, const jnode *body, frame *f, int *flow) {
    jsink s = {0}, *saved = r->out;
    r->out = &s;
    exec_body(r, body, f, flow);
    r->out = saved;
    return sink_val(&r->c, &s);
}

/* renders body into a new string in scope f */
static jval capture(render *r, const jnode *body, frame *f) {
    int flow = 0;
    return capture_flow(r, body, f, &flow);
}

/* caller: a call block's body as the macro's `caller` (NULL: none, and `caller` is undefined) */
static jval call_macro(render *r, const jmacro *mc, const jargs *a, const jmacro *caller) {
    if (++r->calls > J_MAX_CALL_DEPTH) jfail(&r->c, NV_ERANGE, "macros called %d deep", J_MAX_CALL_DEPTH);
    const jnode *m = mc->m;
    frame *f = push_frame(r, mc->scope ? mc->scope : r->root), *saved = r->cur;
    if (caller) dict_setc(&r->c, f->vars, "caller", (jval){.t = V_MACRO, .u.m = caller});
    else if (mc->scope) dict_setc(&r->c, f->vars, "caller", UNDEF); /* (a call block's body: not the caller of the macro around it) */
    int pos = 0;
    for (int i = 0; i < a->n; i++) {
        if (a->kw[i]) {
            int k = 0;
            while (k < m->n_names && !name_is(m->names[k], a->kw[i]->s)) k++;
            if (k == m->n_names) jfail(&r->c, NV_EFORMAT, "macro '%s' has no parameter '%s'", m->s->s, a->kw[i]->s);
            dict_set(&r->c, f->vars, m->names[k], a->v[i]);
        } else {
            if (pos >= m->n_names) jfail(&r->c, NV_EFORMAT, "macro '%s' takes %d arguments", m->s->s, m->n_names);
            dict_set(&r->c, f->vars, m->names[pos++], a->v[i]);
        }
    }
    r->cur = f;
    for (int k = 0; k < m->n_names; k++)
        if (dict_find(f->vars, m->names[k]->s, m->names[k]->n) < 0)
            dict_set(&r->c, f->vars, m->names[k], m->kid[k] ? eval(r, m->kid[k]) : UNDEF);
    const jval out = capture(r, m->kid[m->n_names], f);
    r->cur = saved;
    r->calls--;
    return out;
}

static void bind_targets(render *r, const jnode *x, frame *f, jval item) {
    if (x->n_names == 1) {
        dict_set(&r->c, f->vars, x->names[0], item);
        return;
    }
    if (item.t != V_LIST || item.u.l->n != x->n_names)
        jfail(&r->c, NV_EFORMAT, "cannot unpack a %s into %d loop variables", type_name(item), x->n_names);
    for (int k = 0; k < x->n_names; k++) dict_set(&r->c, f->vars, x->names[k], item.u.l->v[k]);
}

enum { FLOW_NONE = 0, FLOW_BREAK, FLOW_CONTINUE };

static void exec_for(render *r, const jnode *x) {
    jlist *items = items_of(r, eval(r, x->kid[0]), "for");
    frame *outer = r->cur;
    if (x->kid[3]) { /* the loop's if: the items it keeps, as loop.length counts them */
        jlist *kept = list_new(&r->c, items->n);
        for (int i = 0; i < items->n; i++) {
            frame *f = push_frame(r, outer);
            bind_targets(r, x, f, items->v[i]);
            r->cur = f;
            const int keep = truthy(eval(r, x->kid[3]));
            r->cur = outer;
            if (keep) list_push(&r->c, kept, items->v[i]);
        }
        items = kept;
    }
    frame *f = push_frame(r, outer); /* one scope and loop object for the loop, emptied each time round */
    jdict *loop = dict_new(&r->c);
    const jstr *loop_name = str_new(&r->c, "loop", 4);
    for (int i = 0; i < items->n; i++) {
        step(r, x);
        dict_clear(f->vars);
        const int n = items->n;
        dict_setc(&r->c, loop, "index", vint(i + 1));
        dict_setc(&r->c, loop, "index0", vint(i));
        dict_setc(&r->c, loop, "revindex", vint(n - i));
        dict_setc(&r->c, loop, "revindex0", vint(n - i - 1));
        dict_setc(&r->c, loop, "first", vbool(i == 0));
        dict_setc(&r->c, loop, "last", vbool(i == n - 1));
        dict_setc(&r->c, loop, "length", vint(n));
        dict_setc(&r->c, loop, "depth", vint(1));
        dict_setc(&r->c, loop, "depth0", vint(0));
        dict_setc(&r->c, loop, "previtem", i ? items->v[i - 1] : UNDEF);
        dict_setc(&r->c, loop, "nextitem", i + 1 < n ? items->v[i + 1] : UNDEF);
        dict_set(&r->c, f->vars, loop_name, (jval){.t = V_DICT, .u.d = loop});
        bind_targets(r, x, f, items->v[i]);
        int flow = FLOW_NONE;
        exec_body(r, x->kid[1], f, &flow);
        if (flow == FLOW_BREAK) break;
    }
    r->cur = outer;
    if (!items->n && x->kid[2]) {
        int flow = FLOW_NONE;
        exec_body(r, x->kid[2], push_frame(r, outer), &flow);
        r->cur = outer;
    }
}

/* runs body's statements in scope f; a break or continue stops it and is left in *flow */
static void exec_body(render *r, const jnode *body, frame *f, int *flow) {
    enter_eval(r);
    frame *saved = r->cur;
    r->cur = f;
    for (int i = 0; i < body->n && !*flow; i++) {
        const jnode *x = body->kid[i];
        step(r, x);
        switch (x->kind) {
        case S_TEXT: sink_put(&r->c, r->out, x->s->s, x->s->n); break;
        case S_OUT: {
            const jval v = eval(r, x->kid[0]);
            put_str(&r->c, r->out, v, 0);
            break;
        }
        case S_IF: {
            int k = 0;
            for (; k + 1 < x->n; k += 2)
                if (truthy(eval(r, x->kid[k]))) break;
            const jnode *b = k + 1 < x->n ? x->kid[k + 1] : k < x->n ? x->kid[k] : NULL; /* a branch, the else, or none */
            if (b) exec_body(r, b, f, flow);
            break;
        }
        case S_FOR: exec_for(r, x); break;
        case S_SET: {
            const jval v = eval(r, x->kid[0]);
            if (x->s) {
                const jval ns = lookup(f, x->names[0]);
                if (ns.t != V_DICT || !ns.u.d->ns)
                    jfail(&r->c, NV_EFORMAT, "cannot set '%s.%s': '%s' is not a namespace", x->names[0]->s, x->s->s, x->names[0]->s);
                dict_set(&r->c, ns.u.d, x->s, v);
            } else
                dict_set(&r->c, f->vars, x->names[0], v);
            break;
        }
        case S_SETBLOCK: dict_set(&r->c, f->vars, x->names[0], capture(r, x->kid[0], f)); break;
        case S_MACRO: {
            jmacro *mc = jalloc(&r->c, sizeof *mc);
            mc->m = x;
            dict_set(&r->c, f->vars, x->s, (jval){.t = V_MACRO, .u.m = mc});
            break;
        }
        case S_WITH: { /* the values from the scope around it, then the body in a scope of its own */
            frame *inner = push_frame(r, f);
            for (int k = 0; k < x->n_names; k++) dict_set(&r->c, inner->vars, x->names[k], eval(r, x->kid[k]));
            exec_body(r, x->kid[x->n_names], inner, flow);
            break;
        }
        case S_FILTERBLOCK: { /* (a break or continue in its body drops its text, as jinja2's) */
            frame *inner = push_frame(r, f);
            dict_set(&r->c, inner->vars, x->s, capture_flow(r, x->kid[1], inner, flow));
            r->cur = inner;
            if (!*flow) put_str(&r->c, r->out, eval(r, x->kid[0]), 0);
            break;
        }
        case S_CALLBLOCK: {
            const jnode *call = x->kid[0];
            const jval fn = eval(r, call->kid[0]);
            if (fn.t != V_MACRO) jfail(&r->c, NV_EFORMAT, "a call block calls a macro, not a %s", type_name(fn));
            const jargs a = eval_args(r, call, 1);
            jmacro *caller = jalloc(&r->c, sizeof *caller);
            caller->m = x->kid[1], caller->scope = f;
            put_str(&r->c, r->out, call_macro(r, fn.u.m, &a, caller), 0);
            break;
        }
        case S_BREAK: *flow = FLOW_BREAK; break;
        case S_CONTINUE: *flow = FLOW_CONTINUE; break;
        case S_BODY: exec_body(r, x, f, flow); break;
        default: jfail(&r->c, NV_EFORMAT, "not a statement");
        }
        r->cur = f;
    }
    r->cur = saved;
    leave(r);
}

nv_err nv_jinja_render(const nv_jinja *j, const cJSON *vars, nv_buf *out) {
    render *r = calloc(1, sizeof *r);
    if (!r) return nv_fail(NV_ENOMEM, "out of memory");
    if (setjmp(r->c.jb)) {
        const nv_err e = nv_fail(r->c.code, "chat template: %s", r->c.msg);
        jctx_free(&r->c);
        free(r);
        return e;
    }
    r->root = push_frame(r, NULL);
    for (const cJSON *v = vars ? vars->child : NULL; v; v = v->next)
        if (v->string) dict_setc(&r->c, r->root->vars, v->string, of_json(&r->c, v));
    jsink s = {0};
    r->out = &s;
    int flow = 0;
    exec_body(r, j->body, r->root, &flow);
    if (s.n) nv_buf_append(out, s.p, s.n);
    jctx_free(&r->c);
    free(r);
    return out->oom ? nv_fail(NV_ENOMEM, "out of memory") : NV_OK;
}
