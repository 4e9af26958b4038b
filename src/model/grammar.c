/* Constrained decoding over a byte grammar (see grammar.h). */
#include "model/grammar.h"

#include "base/timer.h"
#include "base/utf8.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* An element: its type in the top two bits, its argument below. */
enum { EL_SET = 0u, EL_REF = 1u, EL_ALT = 2u, EL_END = 3u };
#define EL(type, arg) (((uint32_t)(type) << 30) | (uint32_t)(arg))
#define EL_TYPE(e) ((e) >> 30)
#define EL_ARG(e) ((e) & 0x3FFFFFFFu)
#define NONE UINT32_MAX

struct nv_gbuild {
    nv_gbody *rules; /* each rule's body, while building */
    int *defined;
    char **names; /* rules named for messages (nv_gbuild_name), else NULL */
    int n_rules;
    size_t cap_rules;
    uint8_t (*sets)[32];
    int n_sets;
    size_t cap_sets;
    int *set_slot; /* open addressing over the sets (index + 1), cap_slots a power of two */
    int cap_slots;
    int byte_set[256]; /* the set holding just that byte, -1 until made */
    int oom;
    long n_elems;
};

struct nv_grammar {
    _Atomic int refs;
    uint32_t *el;        /* every rule's alternatives, each ended by EL_ALT or EL_END */
    uint32_t *alt;       /* where each alternative starts, rule by rule */
    uint32_t *alt_first; /* rule r's alternatives: alt[alt_first[r] .. alt_first[r + 1]) */
    uint8_t (*sets)[32];
    int n_rules, n_sets;
    uint32_t root;
};

/* ---- building ---- */

/* Room for need elements of elem bytes at *p (*cap of them now), doubling from 16. */
static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 1;
    size_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return 0;
    *p = q;
    *cap = c;
    return 1;
}

nv_gbuild *nv_gbuild_new(void) {
    nv_gbuild *b = calloc(1, sizeof *b);
    if (b) memset(b->byte_set, -1, sizeof b->byte_set);
    return b;
}

void nv_gbody_free(nv_gbody *body) {
    free(body->e);
    memset(body, 0, sizeof *body);
}

void nv_gbuild_free(nv_gbuild *b) {
    if (!b) return;
    for (int i = 0; i < b->n_rules; i++) nv_gbody_free(&b->rules[i]);
    free(b->rules);
    free(b->defined);
    for (int i = 0; b->names && i < b->n_rules; i++) free(b->names[i]);
    free(b->names);
    free(b->sets);
    free(b->set_slot);
    free(b);
}

int nv_gbuild_reserve(nv_gbuild *b) {
    const size_t had = b->cap_rules;
    if (b->oom || !grow((void **)&b->rules, &b->cap_rules, (size_t)b->n_rules + 1, sizeof *b->rules)) {
        b->oom = 1;
        return 0;
    }
    if (b->cap_rules != had || !b->defined) { /* the side arrays follow the rules' capacity when it grows */
        int *d = realloc(b->defined, b->cap_rules * sizeof *d);
        if (d) b->defined = d;
        char **nm = d ? realloc(b->names, b->cap_rules * sizeof *nm) : NULL;
        if (!nm) {
            b->oom = 1;
            return 0;
        }
        b->names = nm;
    }
    memset(&b->rules[b->n_rules], 0, sizeof b->rules[0]);
    b->defined[b->n_rules] = 0;
    b->names[b->n_rules] = NULL;
    return b->n_rules++;
}

int nv_gbuild_define(nv_gbuild *b, int id, nv_gbody *body) {
    if (b->oom || body->oom || id < 0 || id >= b->n_rules || b->defined[id]) {
        b->oom |= body->oom;
        nv_gbody_free(body);
        return id;
    }
    b->rules[id] = *body;
    b->defined[id] = 1;
    b->n_elems += body->n + 1;
    memset(body, 0, sizeof *body);
    return id;
}

int nv_gbuild_add(nv_gbuild *b, nv_gbody *body) { return nv_gbuild_define(b, nv_gbuild_reserve(b), body); }

void nv_gbuild_name(nv_gbuild *b, int id, const char *name) {
    if (b->oom || id < 0 || id >= b->n_rules) return;
    free(b->names[id]);
    if (!(b->names[id] = strdup(name))) b->oom = 1;
}

long nv_gbuild_size(const nv_gbuild *b) { return b->oom ? NV_GRAMMAR_MAX_ELEMS + 1L : b->n_elems; }

void nv_gbuild_seal(nv_gbuild *b) {
    static const uint8_t none[32] = {0};
    for (int r = 0; r < b->n_rules; r++)
        if (!b->defined[r]) {
            nv_gbody body = {0};
            nv_gbody_set(b, &body, none);
            nv_gbuild_define(b, r, &body);
        }
}

static void body_push(nv_gbody *body, uint32_t e) {
    if (body->oom) return;
    if (!grow((void **)&body->e, &body->cap, (size_t)body->n + 1, sizeof *body->e)) {
        body->oom = 1;
        return;
    }
    body->e[body->n++] = e;
}

static uint32_t set_hash(const uint8_t bits[32]) {
    uint32_t h = 2166136261u;
    for (int i = 0; i < 32; i++) h = (h ^ bits[i]) * 16777619u;
    return h;
}

/* The id of a byte set, found through a hash table (a grammar from many patterns has many sets). */
static int set_id(nv_gbuild *b, const uint8_t bits[32]) {
    if (b->oom) return 0;
    if ((b->n_sets + 1) * 2 > b->cap_slots) { /* grow and re-place */
        int cap = b->cap_slots ? b->cap_slots * 2 : 256;
        int *slot = calloc((size_t)cap, sizeof *slot);
        if (!slot) return b->oom = 1, 0;
        for (int i = 0; i < b->n_sets; i++) {
            uint32_t k = set_hash(b->sets[i]) & (uint32_t)(cap - 1);
            while (slot[k]) k = (k + 1) & (uint32_t)(cap - 1);
            slot[k] = i + 1;
        }
        free(b->set_slot);
        b->set_slot = slot;
        b->cap_slots = cap;
    }
    uint32_t k = set_hash(bits) & (uint32_t)(b->cap_slots - 1);
    for (; b->set_slot[k]; k = (k + 1) & (uint32_t)(b->cap_slots - 1))
        if (!memcmp(b->sets[b->set_slot[k] - 1], bits, 32)) return b->set_slot[k] - 1;
    if (!grow((void **)&b->sets, &b->cap_sets, (size_t)b->n_sets + 1, sizeof *b->sets)) {
        b->oom = 1;
        return 0;
    }
    memcpy(b->sets[b->n_sets], bits, 32);
    b->set_slot[k] = b->n_sets + 1;
    return b->n_sets++;
}

void nv_gbody_set(nv_gbuild *b, nv_gbody *body, const uint8_t bits[32]) { body_push(body, EL(EL_SET, set_id(b, bits))); }

void nv_gbody_range(nv_gbuild *b, nv_gbody *body, unsigned lo, unsigned hi) {
    uint8_t bits[32] = {0};
    for (unsigned c = lo; c <= hi && c < 256; c++) bits[c >> 3] |= (uint8_t)(1u << (c & 7));
    nv_gbody_set(b, body, bits);
}

void nv_gbody_chars(nv_gbuild *b, nv_gbody *body, const char *chars) {
    uint8_t bits[32] = {0};
    for (const unsigned char *p = (const unsigned char *)chars; *p; p++) bits[*p >> 3] |= (uint8_t)(1u << (*p & 7));
    nv_gbody_set(b, body, bits);
}

void nv_gbody_lit(nv_gbuild *b, nv_gbody *body, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned c = (unsigned char)s[i];
        if (b->byte_set[c] < 0) {
            uint8_t bits[32] = {0};
            bits[c >> 3] = (uint8_t)(1u << (c & 7));
            b->byte_set[c] = set_id(b, bits);
        }
        body_push(body, EL(EL_SET, b->byte_set[c]));
    }
}

void nv_gbody_ref(nv_gbody *body, int rule) { body_push(body, EL(EL_REF, rule)); }
void nv_gbody_alt(nv_gbody *body) { body_push(body, EL(EL_ALT, 0)); }

/* Rules that derive the empty string, to a fixed point. */
int nv_gbuild_repeat(nv_gbuild *b, int item, long min, long max) {
    nv_gbody body = {0};
    int tail;
    if (max < 0) { /* star ::= | item star */
        tail = nv_gbuild_reserve(b);
        nv_gbody_alt(&body);
        nv_gbody_ref(&body, item);
        nv_gbody_ref(&body, tail);
        nv_gbuild_define(b, tail, &body);
    } else { /* opt_k ::= | item opt_(k-1) */
        tail = nv_gbuild_add(b, &body);
        for (long k = 1; k <= max - min; k++) {
            nv_gbody_alt(&body);
            nv_gbody_ref(&body, item);
            nv_gbody_ref(&body, tail);
            tail = nv_gbuild_add(b, &body);
        }
    }
    for (long k = 0; k < min; k++) nv_gbody_ref(&body, item);
    nv_gbody_ref(&body, tail);
    return nv_gbuild_add(b, &body);
}

/* The code points [lo, hi] as alternatives of byte ranges, one per position: the range is cut where
 * the encoding's length changes and where a continuation byte would not run over its whole span
 * (the utf8-ranges construction), so each piece is a product of byte ranges. */
static void utf8_span(nv_gbuild *b, nv_gbody *body, int *first, uint32_t lo, uint32_t hi) {
    if (lo > hi) return;
    static const uint32_t ends[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= ends[i] && hi > ends[i]) {
            utf8_span(b, body, first, lo, ends[i]);
            utf8_span(b, body, first, ends[i] + 1, hi);
            return;
        }
    char a[4], z[4];
    const int n = (int)nv_utf8_put(lo, a);
    nv_utf8_put(hi, z);
    for (int i = 1; i < n; i++) {
        const uint32_t m = (1u << (6 * i)) - 1; /* the bits of the last i bytes */
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_span(b, body, first, lo, lo | m);
                utf8_span(b, body, first, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                utf8_span(b, body, first, lo, (hi & ~m) - 1);
                utf8_span(b, body, first, hi & ~m, hi);
                return;
            }
        }
    }
    if (!*first) nv_gbody_alt(body);
    *first = 0;
    for (int i = 0; i < n; i++) nv_gbody_range(b, body, (unsigned char)a[i], (unsigned char)z[i]);
}

static int cmp_range(const void *x, const void *y) {
    const uint32_t *a = x, *b = y;
    return a[0] < b[0] ? -1 : a[0] > b[0];
}

int nv_gbuild_codepoints(nv_gbuild *b, const uint32_t (*ranges)[2], int n, int negate) {
    /* sorted and merged, then (negated) the gaps; surrogates cut out */
    uint32_t(*r)[2] = malloc(((size_t)n + 2) * sizeof *r), (*keep)[2] = malloc(((size_t)n + 2) * sizeof *keep);
    nv_gbody body = {0};
    if (!r || !keep) {
        free(r), free(keep);
        b->oom = 1;
        return nv_gbuild_add(b, &body);
    }
    int m = 0;
    for (int i = 0; i < n; i++)
        if (ranges[i][0] <= ranges[i][1] && ranges[i][0] <= 0x10FFFF)
            r[m][0] = ranges[i][0], r[m][1] = ranges[i][1] > 0x10FFFF ? 0x10FFFF : ranges[i][1], m++;
    qsort(r, (size_t)m, sizeof *r, cmp_range);
    int k = 0;
    for (int i = 0; i < m; i++) {
        if (k && r[i][0] <= keep[k - 1][1] + 1) {
            if (r[i][1] > keep[k - 1][1]) keep[k - 1][1] = r[i][1];
        } else keep[k][0] = r[i][0], keep[k][1] = r[i][1], k++;
    }
    if (negate) {
        int g = 0;
        uint32_t next = 0;
        for (int i = 0; i < k; i++) {
            if (keep[i][0] > next) r[g][0] = next, r[g][1] = keep[i][0] - 1, g++;
            next = keep[i][1] + 1;
        }
        if (next <= 0x10FFFF) r[g][0] = next, r[g][1] = 0x10FFFF, g++;
        memcpy(keep, r, (size_t)g * sizeof *r);
        k = g;
    }
    int first = 1;
    for (int i = 0; i < k; i++) {
        const uint32_t lo = keep[i][0], hi = keep[i][1];
        if (hi < 0xD800 || lo > 0xDFFF) utf8_span(b, &body, &first, lo, hi);
        else {
            if (lo < 0xD800) utf8_span(b, &body, &first, lo, 0xD7FF);
            if (hi > 0xDFFF) utf8_span(b, &body, &first, 0xE000, hi);
        }
    }
    free(r), free(keep);
    if (first) { /* nothing: an empty byte set, which no byte passes */
        uint8_t none[32] = {0};
        nv_gbody_set(b, &body, none);
    }
    return nv_gbuild_add(b, &body);
}

static void find_nullable(const nv_grammar *g, uint8_t *nullable) {
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < g->n_rules; r++) {
            if (nullable[r]) continue;
            for (uint32_t a = g->alt_first[r]; a < g->alt_first[r + 1] && !nullable[r]; a++) {
                uint32_t p = g->alt[a];
                while (EL_TYPE(g->el[p]) == EL_REF && nullable[EL_ARG(g->el[p])]) p++;
                if (EL_TYPE(g->el[p]) == EL_ALT || EL_TYPE(g->el[p]) == EL_END) nullable[r] = changed = 1;
            }
        }
    }
}

/* The rules r may call before consuming a byte, written to out (at most n_rules + 1 of them). */
static int left_calls(const nv_grammar *g, const uint8_t *nullable, int r, uint32_t *out) {
    int n = 0;
    for (uint32_t a = g->alt_first[r]; a < g->alt_first[r + 1]; a++)
        for (uint32_t p = g->alt[a]; EL_TYPE(g->el[p]) == EL_REF; p++) {
            out[n++] = EL_ARG(g->el[p]);
            if (!nullable[EL_ARG(g->el[p])]) break;
        }
    return n;
}

/* 1 when some rule reaches itself without consuming a byte (an iterative depth-first search). */
static int left_recursive(const nv_grammar *g, int *which) {
    int R = g->n_rules;
    uint8_t *nullable = calloc((size_t)R, 1), *color = calloc((size_t)R, 1);
    /* the search's stack: (rule, next edge) with each rule's edges listed in edges[] */
    uint32_t *edge_first = malloc(((size_t)R + 1) * sizeof *edge_first);
    size_t cap_edges = 0;
    for (int r = 0; r < R; r++)
        for (uint32_t a = g->alt_first[r]; a < g->alt_first[r + 1]; a++)
            for (uint32_t p = g->alt[a]; EL_TYPE(g->el[p]) == EL_REF; p++) cap_edges++;
    uint32_t *edges = malloc((cap_edges + 1) * sizeof *edges);
    uint32_t *stack = malloc(((size_t)R + 1) * 2 * sizeof *stack);
    int found = -1;
    if (!nullable || !color || !edge_first || !edges || !stack) {
        found = -2;
        goto out;
    }
    find_nullable(g, nullable);
    size_t ne = 0;
    for (int r = 0; r < R; r++) {
        edge_first[r] = (uint32_t)ne;
        ne += (size_t)left_calls(g, nullable, r, edges + ne);
    }
    edge_first[R] = (uint32_t)ne;
    for (int s = 0; s < R && found < 0; s++) {
        if (color[s]) continue;
        int sp = 0;
        stack[0] = (uint32_t)s;
        stack[1] = edge_first[s];
        color[s] = 1;
        sp = 1;
        while (sp > 0 && found < 0) {
            uint32_t r = stack[2 * (sp - 1)], *e = &stack[2 * (sp - 1) + 1];
            if (*e == edge_first[r + 1]) {
                color[r] = 2;
                sp--;
                continue;
            }
            uint32_t c = edges[(*e)++];
            if (color[c] == 1) found = (int)c;
            else if (color[c] == 0) {
                color[c] = 1;
                stack[2 * sp] = c;
                stack[2 * sp + 1] = edge_first[c];
                sp++;
            }
        }
    }
out:
    free(nullable);
    free(color);
    free(edge_first);
    free(edges);
    free(stack);
    if (found >= 0) *which = found;
    return found;
}

nv_err nv_gbuild_finish(nv_gbuild *b, int root, nv_grammar **out) {
    *out = NULL;
    nv_err e = NV_OK;
    nv_grammar *g = NULL;
    if (b->oom) {
        e = nv_fail(NV_ENOMEM, "out of memory building a grammar");
        goto done;
    }
    if (root < 0 || root >= b->n_rules) {
        e = nv_fail(NV_EINVAL, "the grammar has no root rule");
        goto done;
    }
    if (b->n_elems > NV_GRAMMAR_MAX_ELEMS) {
        e = nv_fail(NV_EINVAL, "the grammar is too large (%ld elements; at most %d)", b->n_elems, NV_GRAMMAR_MAX_ELEMS);
        goto done;
    }
    size_t n_alt = 0;
    for (int r = 0; r < b->n_rules; r++) {
        if (!b->defined[r]) {
            e = nv_fail(NV_EINVAL, "grammar rule %d is used but never defined", r);
            goto done;
        }
        n_alt++;
        for (int i = 0; i < b->rules[r].n; i++) {
            uint32_t x = b->rules[r].e[i];
            if (EL_TYPE(x) == EL_ALT) n_alt++;
            if (EL_TYPE(x) == EL_REF && EL_ARG(x) >= (uint32_t)b->n_rules) {
                e = nv_fail(NV_EINVAL, "grammar rule %d refers to rule %u, which does not exist", r, EL_ARG(x));
                goto done;
            }
        }
    }
    g = calloc(1, sizeof *g);
    if (!g || !(g->el = malloc((size_t)b->n_elems * sizeof *g->el)) || !(g->alt = malloc(n_alt * sizeof *g->alt)) ||
        !(g->alt_first = malloc(((size_t)b->n_rules + 1) * sizeof *g->alt_first)) ||
        !(g->sets = malloc(((size_t)b->n_sets + 1) * 32))) {
        e = nv_fail(NV_ENOMEM, "out of memory building a grammar");
        goto done;
    }
    atomic_init(&g->refs, 1);
    g->n_rules = b->n_rules;
    g->n_sets = b->n_sets;
    if (b->n_sets) memcpy(g->sets, b->sets, (size_t)b->n_sets * 32);
    uint32_t p = 0, a = 0;
    for (int r = 0; r < b->n_rules; r++) {
        g->alt_first[r] = a;
        g->alt[a++] = p;
        for (int i = 0; i < b->rules[r].n; i++) {
            uint32_t x = b->rules[r].e[i];
            g->el[p++] = x;
            if (EL_TYPE(x) == EL_ALT) g->alt[a++] = p;
        }
        g->el[p++] = EL(EL_END, 0);
    }
    g->alt_first[b->n_rules] = a;
    g->root = (uint32_t)root;
    int which = 0, lr = left_recursive(g, &which);
    if (lr == -2) {
        e = nv_fail(NV_ENOMEM, "out of memory checking a grammar");
    } else if (lr >= 0) {
        if (b->names[which]) /* before b is freed */
            e = nv_fail(NV_EINVAL, "rule '%s' reaches itself before reading anything (left recursion)", b->names[which]);
        else
            e = nv_fail(NV_EINVAL, "the grammar is left-recursive (a rule reaches itself before reading anything, as a repetition "
                                   "of something that can match nothing does)");
    }
done:
    nv_gbuild_free(b);
    if (e != NV_OK) {
        nv_grammar_unref(g);
        return e;
    }
    *out = g;
    return NV_OK;
}

nv_grammar *nv_grammar_ref(nv_grammar *g) {
    if (g) atomic_fetch_add(&g->refs, 1);
    return g;
}

void nv_grammar_unref(nv_grammar *g) {
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1) return;
    free(g->el);
    free(g->alt);
    free(g->alt_first);
    free(g->sets);
    free(g);
}

/* ---- matching ---- */

/* A parse stack's frame: the element to match next and the frame to return to. Frames are
 * only ever appended, so a frame's parent always has a smaller index, and stacks share tails. */
typedef struct {
    uint32_t pos, parent;
} gframe;

struct nv_gmatch {
    nv_grammar *g;
    gframe *fr;
    uint32_t n_fr, compact_at;
    size_t cap_fr;
    /* heads: stacks whose top is a byte set, as (pos, parent) pairs. hb holds the current
     * state's heads first (n_cur of them), then those of continuations being tried. */
    gframe *hb;
    size_t n_hb, cap_hb;
    size_t n_cur;
    int accepted; /* the current state includes an empty stack: the sentence may end here */
    gframe *work;
    size_t cap_work;
    /* past HSET_FROM heads in one batch, repeats are found by hashing instead of a scan: the
     * table holds (index in hb + 1) of the batch's heads */
    uint32_t *hset;
    /* frames are shared (hash-consed): one (pos, parent) is one frame, so equal parse states have
     * equal heads, which lets the mask walk reuse what one state does after a byte */
    uint32_t *fset;
    uint32_t fset_used;
    int fset_failed;
    /* the mask walk's states: each distinct set of heads met in one walk, interned, with the state
     * each byte leads to (a deterministic automaton built as the walk needs it) */
    struct walk_state *ws;
    uint32_t n_ws, cap_ws;
    int32_t *trans;      /* [cap_ws * 256]: (state << 1 | sentence whole) after the byte, -1 not known */
    gframe *ws_heads;    /* the states' heads */
    size_t n_ws_heads, cap_ws_heads;
    uint64_t *ws_index;  /* hash of heads -> walk generation << 32 | state + 1 */
    uint32_t ws_gen;
    int oom;
};

#define FSET_SIZE (1u << 16)
#define EXPAND_BUDGET (1L << 18) /* work items one expansion may take */
#define MAX_FRAMES (1u << 24)    /* frames one matcher may hold (128 MiB) */

#ifndef NV_GRAMMAR_WS_MAX
#define NV_GRAMMAR_WS_MAX 4096u /* states one walk may intern (past them, the rest of the walk goes raw) */
#endif
#define WS_MAX NV_GRAMMAR_WS_MAX /* a power of two */
#define WS_INDEX (2 * WS_MAX)

struct walk_state {
    uint32_t off, n;  /* its heads: ws_heads[off, off + n) */
    uint64_t next[4]; /* the bytes they accept */
};

#define HSET_FROM 32
#define HSET_SIZE (4 * NV_GRAMMAR_MAX_STACKS) /* a power of two */

static inline uint32_t head_hash(gframe h) { return (h.pos * 0x9E3779B1u ^ h.parent * 0x85EBCA77u) & (HSET_SIZE - 1); }

/* Finds h among the batch's heads in the table, or adds index i for it; 1 when it was there. */
static int hset_find_or_add(nv_gmatch *m, gframe h, size_t i) {
    for (uint32_t k = head_hash(h);; k = (k + 1) & (HSET_SIZE - 1)) {
        uint32_t e = m->hset[k];
        if (!e) {
            m->hset[k] = (uint32_t)i + 1;
            return 0;
        }
        if (m->hb[e - 1].pos == h.pos && m->hb[e - 1].parent == h.parent) return 1;
    }
}

static inline uint32_t frame_hash(uint32_t pos, uint32_t parent) {
    return (pos * 0x9E3779B1u + parent * 0x85EBCA77u + (parent >> 16)) & (FSET_SIZE - 1);
}

static int push_frame(nv_gmatch *m, uint32_t pos, uint32_t parent, uint32_t *idx) {
    /* the same frame already made (and not since dropped) is reused; the table is a cache: an
     * entry whose frame was truncated away or replaced is just passed over */
    if (!m->fset && !m->fset_failed && !(m->fset = calloc(FSET_SIZE, sizeof *m->fset))) m->fset_failed = 1; /* works without it */
    uint32_t slot = UINT32_MAX;
    if (m->fset) {
        if (m->fset_used > FSET_SIZE / 2) {
            memset(m->fset, 0, FSET_SIZE * sizeof *m->fset);
            m->fset_used = 0;
        }
        for (uint32_t k = frame_hash(pos, parent);; k = (k + 1) & (FSET_SIZE - 1)) {
            uint32_t e = m->fset[k];
            if (!e) {
                if (slot == UINT32_MAX) slot = k;
                break;
            }
            uint32_t f = e - 1;
            int live = f < m->n_fr;
            if (live && m->fr[f].pos == pos && m->fr[f].parent == parent) {
                *idx = f;
                return 1;
            }
            if (!live && slot == UINT32_MAX) slot = k; /* a dead entry's place may be taken */
        }
    }
    if (m->n_fr >= MAX_FRAMES) return m->oom = 1, 0;
    if (!grow((void **)&m->fr, &m->cap_fr, (size_t)m->n_fr + 1, sizeof *m->fr)) return m->oom = 1, 0;
    m->fr[m->n_fr] = (gframe){pos, parent};
    *idx = m->n_fr++;
    if (slot != UINT32_MAX) {
        if (!m->fset[slot]) m->fset_used++;
        m->fset[slot] = *idx + 1;
    }
    return 1;
}

/* Room for n more heads in hb. */
static int reserve_heads(nv_gmatch *m, size_t n) {
    return grow((void **)&m->hb, &m->cap_hb, m->n_hb + n, sizeof *m->hb) ? 1 : (m->oom = 1, 0);
}

static int push_head(nv_gmatch *m, size_t base, gframe h) {
    const size_t cnt = m->n_hb - base;
    if (cnt < HSET_FROM) {
        for (size_t i = base; i < m->n_hb; i++)
            if (m->hb[i].pos == h.pos && m->hb[i].parent == h.parent) return 1;
    } else {
        if (!m->hset && !(m->hset = malloc(HSET_SIZE * sizeof *m->hset))) return m->oom = 1, 0;
        if (cnt == HSET_FROM) { /* the batch just grew past the scan: index it */
            memset(m->hset, 0, HSET_SIZE * sizeof *m->hset);
            for (size_t i = base; i < m->n_hb; i++) hset_find_or_add(m, m->hb[i], i);
        }
        if (cnt >= NV_GRAMMAR_MAX_STACKS) return 1; /* narrow rather than explode */
        if (hset_find_or_add(m, h, m->n_hb)) return 1;
    }
    if (cnt >= NV_GRAMMAR_MAX_STACKS) return 1; /* narrow rather than explode */
    if (!reserve_heads(m, 1)) return 0;
    m->hb[m->n_hb++] = h;
    return 1;
}

/* Every stack reachable from (pos, parent) without consuming a byte: heads appended after base,
 * *acc set when one empties. A work list instead of recursion (alternatives pushed in reverse
 * so heads come out in the grammar's order). */
static void expand(nv_gmatch *m, uint32_t pos, uint32_t parent, size_t base, int *acc) {
    const nv_grammar *g = m->g;
    size_t nw = 0;
    if (!grow((void **)&m->work, &m->cap_work, 1, sizeof *m->work)) {
        m->oom = 1;
        return;
    }
    m->work[nw++] = (gframe){pos, parent};
    long steps = 0;
    while (nw && !m->oom) {
        if (++steps > EXPAND_BUDGET) { /* a grammar this ambiguous fails the step rather than stall it */
            m->oom = 1;
            break;
        }
        gframe w = m->work[--nw];
        for (;;) {
            uint32_t e = g->el[w.pos];
            uint32_t t = EL_TYPE(e);
            if (t == EL_ALT || t == EL_END) {
                if (w.parent == NONE) {
                    *acc = 1;
                    break;
                }
                w = m->fr[w.parent];
                continue;
            }
            if (t == EL_SET) {
                push_head(m, base, w);
                break;
            }
            /* a reference: continue after it once the rule is done (tail calls keep no frame) */
            uint32_t r = EL_ARG(e), next = w.pos + 1, cont = w.parent;
            uint32_t nt = EL_TYPE(g->el[next]);
            if (nt != EL_ALT && nt != EL_END && !push_frame(m, next, w.parent, &cont)) break;
            uint32_t a0 = g->alt_first[r], a1 = g->alt_first[r + 1];
            if (!grow((void **)&m->work, &m->cap_work, nw + (a1 - a0), sizeof *m->work)) {
                m->oom = 1;
                break;
            }
            for (uint32_t a = a1; a-- > a0;) m->work[nw++] = (gframe){g->alt[a], cont};
            break;
        }
    }
}

static inline int set_has(const nv_grammar *g, uint32_t pos, unsigned c) {
    return (g->sets[EL_ARG(g->el[pos])][c >> 3] >> (c & 7)) & 1;
}

/* The heads after byte c from the heads hb[from, from + n): appended at the end of hb. */
static size_t advance(nv_gmatch *m, size_t from, size_t n, unsigned c, int *acc) {
    size_t base = m->n_hb;
    *acc = 0;
    for (size_t i = 0; i < n && !m->oom; i++) {
        gframe h = m->hb[from + i];
        if (set_has(m->g, h.pos, c)) expand(m, h.pos + 1, h.parent, base, acc);
    }
    return m->n_hb - base;
}

nv_gmatch *nv_gmatch_new(nv_grammar *g) {
    nv_gmatch *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->g = nv_grammar_ref(g);
    m->compact_at = 4096;
    /* the root's alternatives, returning nowhere */
    uint32_t cont = NONE;
    for (uint32_t a = g->alt_first[g->root]; a < g->alt_first[g->root + 1]; a++) expand(m, g->alt[a], cont, 0, &m->accepted);
    m->n_cur = m->n_hb;
    if (m->oom) {
        nv_gmatch_free(m);
        return NULL;
    }
    return m;
}

void nv_gmatch_free(nv_gmatch *m) {
    if (!m) return;
    nv_grammar_unref(m->g);
    free(m->fr);
    free(m->hb);
    free(m->work);
    free(m->hset);
    free(m->fset);
    free(m->ws);
    free(m->trans);
    free(m->ws_heads);
    free(m->ws_index);
    free(m);
}

/* Keeps only the frames the current heads reach (their parents come first, so one pass). */
static void compact(nv_gmatch *m) {
    uint32_t *map = malloc((size_t)m->n_fr * sizeof *map);
    if (!map) return; /* keep growing instead */
    memset(map, 0xFF, (size_t)m->n_fr * sizeof *map);
    const uint32_t KEEP = NONE - 1;
    for (size_t i = 0; i < m->n_cur; i++)
        for (uint32_t p = m->hb[i].parent; p != NONE && map[p] == NONE; p = m->fr[p].parent) map[p] = KEEP;
    uint32_t n = 0;
    for (uint32_t i = 0; i < m->n_fr; i++) {
        if (map[i] != KEEP) continue;
        gframe f = m->fr[i];
        m->fr[n] = (gframe){f.pos, f.parent == NONE ? NONE : map[f.parent]};
        map[i] = n++;
    }
    for (size_t i = 0; i < m->n_cur; i++)
        if (m->hb[i].parent != NONE) m->hb[i].parent = map[m->hb[i].parent];
    free(map);
    m->n_fr = n;
    m->compact_at = n * 2 > 4096 ? n * 2 : 4096;
    if (m->fset) { /* indices moved */
        memset(m->fset, 0, FSET_SIZE * sizeof *m->fset);
        m->fset_used = 0;
    }
}

/* Runs bytes from the current state; on success the final heads are hb[*from, *from + *n). */
static int run_bytes(nv_gmatch *m, const char *bytes, size_t len, size_t *from, size_t *n, int *acc) {
    *from = 0;
    *n = m->n_cur;
    *acc = m->accepted;
    if (len == 0) return 1;
    for (size_t i = 0; i < len; i++) {
        if (*n == 0) return 0; /* the sentence ended, nothing may follow */
        size_t base = m->n_hb;
        *n = advance(m, *from, *n, (unsigned char)bytes[i], acc);
        *from = base;
        if (m->oom) return -1;
        if (*n == 0 && !*acc) return 0;
    }
    return 1;
}

int nv_gmatch_try(nv_gmatch *m, const char *bytes, size_t n) {
    uint32_t fr_mark = m->n_fr;
    size_t from, cnt;
    int acc;
    int ok = run_bytes(m, bytes, n, &from, &cnt, &acc);
    m->n_fr = fr_mark;
    m->n_hb = m->n_cur;
    m->oom = 0;
    return ok == 1;
}

int nv_gmatch_feed(nv_gmatch *m, const char *bytes, size_t n) {
    uint32_t fr_mark = m->n_fr;
    size_t from, cnt;
    int acc;
    int ok = run_bytes(m, bytes, n, &from, &cnt, &acc);
    if (ok != 1) {
        m->n_fr = fr_mark;
        m->n_hb = m->n_cur;
        m->oom = 0;
        return ok;
    }
    if (cnt) memmove(m->hb, m->hb + from, cnt * sizeof *m->hb); /* none left: hb may be NULL */
    m->n_hb = m->n_cur = cnt;
    m->accepted = acc;
    if (m->n_fr > m->compact_at) compact(m);
    return 1;
}

int nv_gmatch_done(const nv_gmatch *m) { return m->accepted; }
int nv_gmatch_finished(const nv_gmatch *m) { return m->accepted && m->n_cur == 0; }

/* ---- the token mask ---- */

typedef struct {
    uint32_t first_child, next_sibling, first_tok;
    uint8_t byte;
} trie_node;

struct nv_gtrie {
    trie_node *node;
    uint32_t n_node;
    int32_t *tok_next; /* tokens with the same text, chained */
    int *eog;          /* the end-of-generation tokens */
    int n_eog, vocab;
};

void nv_gtrie_free(nv_gtrie *tr) {
    if (!tr) return;
    free(tr->node);
    free(tr->tok_next);
    free(tr->eog);
    free(tr);
}

nv_err nv_gtrie_build(const nv_tokenizer *t, nv_gtrie **out) {
    *out = NULL;
    int V = nv_tokenizer_vocab_size(t);
    nv_gtrie *tr = calloc(1, sizeof *tr);
    uint32_t cap = 1024;
    if (!tr || !(tr->node = malloc(cap * sizeof *tr->node)) || !(tr->tok_next = malloc((size_t)V * sizeof *tr->tok_next)) ||
        !(tr->eog = malloc((size_t)V * sizeof *tr->eog)))
        goto oom;
    tr->vocab = V;
    tr->node[0] = (trie_node){0, 0, NONE, 0};
    tr->n_node = 1;
    for (int v = 0; v < V; v++) {
        tr->tok_next[v] = -1;
        if (nv_tokenizer_is_eog(t, v)) {
            tr->eog[tr->n_eog++] = v;
            continue;
        }
        /* any token but BOS before it: SentencePiece drops a leading space only after BOS */
        const char *s = nv_tokenizer_decode(t, NV_TOKEN_EOS, v);
        if (!s || !*s) continue;
        uint32_t cur = 0;
        for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
            uint32_t c = tr->node[cur].first_child;
            while (c && tr->node[c].byte != *p) c = tr->node[c].next_sibling;
            if (!c) {
                if (tr->n_node == cap) {
                    if (cap >= NONE / 4) goto oom;
                    trie_node *q = realloc(tr->node, (size_t)cap * 2 * sizeof *q);
                    if (!q) goto oom;
                    tr->node = q;
                    cap *= 2;
                }
                c = tr->n_node++;
                tr->node[c] = (trie_node){0, tr->node[cur].first_child, NONE, *p};
                tr->node[cur].first_child = c;
            }
            cur = c;
        }
        tr->tok_next[v] = tr->node[cur].first_tok == NONE ? -1 : (int32_t)tr->node[cur].first_tok;
        tr->node[cur].first_tok = (uint32_t)v;
    }
    /* lay the nodes out in depth-first order, each node's children together and in byte order,
     * so the mask walk reads memory forwards */
    uint32_t *order = malloc((size_t)tr->n_node * sizeof *order), *stack = malloc((size_t)tr->n_node * sizeof *stack);
    trie_node *laid = malloc((size_t)tr->n_node * sizeof *laid);
    if (!order || !stack || !laid) {
        free(order), free(stack), free(laid);
        goto oom;
    }
    uint32_t n_order = 0, sp = 0;
    stack[sp++] = 0;
    while (sp) {
        uint32_t v = stack[--sp];
        order[n_order++] = v;
        uint32_t kids[256], nk = 0;
        for (uint32_t c = tr->node[v].first_child; c; c = tr->node[c].next_sibling) kids[nk++] = c;
        for (uint32_t a = 1; a < nk; a++) /* byte order */
            for (uint32_t b = a; b > 0 && tr->node[kids[b - 1]].byte > tr->node[kids[b]].byte; b--) {
                uint32_t t = kids[b];
                kids[b] = kids[b - 1];
                kids[b - 1] = t;
            }
        /* relinked in that order (they were linked in the order they were inserted) */
        tr->node[v].first_child = nk ? kids[0] : 0;
        for (uint32_t a = 0; a < nk; a++) tr->node[kids[a]].next_sibling = a + 1 < nk ? kids[a + 1] : 0;
        for (uint32_t a = nk; a-- > 0;) stack[sp++] = kids[a]; /* the smallest byte on top */
    }
    for (uint32_t i = 0; i < n_order; i++) stack[order[i]] = i; /* stack: old index -> new */
    for (uint32_t i = 0; i < n_order; i++) {
        trie_node x = tr->node[order[i]];
        x.first_child = x.first_child ? stack[x.first_child] : 0;
        x.next_sibling = x.next_sibling ? stack[x.next_sibling] : 0;
        laid[i] = x;
    }
    free(tr->node);
    tr->node = laid;
    free(order);
    free(stack);
    *out = tr;
    return NV_OK;
oom:
    nv_gtrie_free(tr);
    return nv_fail(NV_ENOMEM, "out of memory building the token trie");
}

typedef struct {
    nv_gmatch *m;
    const nv_gtrie *tr;
    uint8_t *allowed;
    int n_allowed;
} mask_walk;

static uint64_t heads_hash(const gframe *h, size_t n) {
    uint64_t x = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) x = (x ^ (((uint64_t)h[i].pos << 32) | h[i].parent)) * 0x100000001b3ull;
    return x;
}

/* The bytes any of the heads h[0, n) accepts. */
static void heads_bytes(const nv_gmatch *m, const gframe *h, size_t n, uint64_t next[4]) {
    next[0] = next[1] = next[2] = next[3] = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t set[4];
        memcpy(set, m->g->sets[EL_ARG(m->g->el[h[i].pos])], sizeof set);
        for (int k = 0; k < 4; k++) next[k] |= set[k];
    }
}

/* The walk's state for the heads h[0, n) (made if new); -1 when the walk has no room for more. */
static int intern_state(nv_gmatch *m, const gframe *h, size_t n) {
    uint64_t hh = heads_hash(h, n);
    uint32_t k = (uint32_t)((hh * 0xff51afd7ed558ccdull) >> 40) & (WS_INDEX - 1);
    for (uint32_t probes = 0; (uint32_t)(m->ws_index[k] >> 32) == m->ws_gen; k = (k + 1) & (WS_INDEX - 1)) {
        if (++probes > WS_INDEX) return -1; /* (never: the index is at most half full) */
        const uint32_t id = (uint32_t)m->ws_index[k] - 1;
        const struct walk_state *st = &m->ws[id];
        if (st->n == n && !memcmp(m->ws_heads + st->off, h, n * sizeof *h)) return (int)id;
    }
    if (m->n_ws == WS_MAX) return -1;
    if (m->n_ws == m->cap_ws) {
        uint32_t cap = m->cap_ws ? m->cap_ws * 2 : 64;
        struct walk_state *w = realloc(m->ws, cap * sizeof *w);
        if (w) m->ws = w;
        int32_t *t = w ? realloc(m->trans, (size_t)cap * 256 * sizeof *t) : NULL;
        if (!t) return -1;
        m->trans = t;
        m->cap_ws = cap;
    }
    if (!grow((void **)&m->ws_heads, &m->cap_ws_heads, m->n_ws_heads + n, sizeof *m->ws_heads)) return -1;
    struct walk_state *st = &m->ws[m->n_ws];
    st->off = (uint32_t)m->n_ws_heads;
    st->n = (uint32_t)n;
    memcpy(m->ws_heads + m->n_ws_heads, h, n * sizeof *h);
    m->n_ws_heads += n;
    heads_bytes(m, h, n, st->next);
    memset(m->trans + (size_t)m->n_ws * 256, 0xFF, 256 * sizeof *m->trans);
    m->ws_index[k] = (uint64_t)m->ws_gen << 32 | (m->n_ws + 1);
    return (int)m->n_ws++;
}

static void mark_tokens(mask_walk *w, const trie_node *cn) {
    for (uint32_t v = cn->first_tok; v != NONE; v = w->tr->tok_next[v] < 0 ? NONE : (uint32_t)w->tr->tok_next[v]) {
        w->allowed[v] = 1;
        w->n_allowed++;
    }
}

/* Marks node's subtree from the heads hb[from, from + n), without states (the walk's room for
 * them ran out). */
static void mask_node_raw(mask_walk *w, uint32_t node, size_t from, size_t n) {
    nv_gmatch *m = w->m;
    uint64_t next[4];
    heads_bytes(m, m->hb + from, n, next);
    for (uint32_t c = w->tr->node[node].first_child; c && !m->oom; c = w->tr->node[c].next_sibling) {
        const trie_node *cn = &w->tr->node[c];
        if (!((next[cn->byte >> 6] >> (cn->byte & 63)) & 1)) continue;
        size_t hb_mark = m->n_hb;
        int acc;
        size_t k = advance(m, from, n, cn->byte, &acc);
        if (k || acc) mark_tokens(w, cn);
        if (k && cn->first_child) mask_node_raw(w, c, hb_mark, k);
        m->n_hb = hb_mark;
    }
}

/* Marks node's subtree from walk state sid. Each (state, byte) is advanced once per walk: the
 * trie's nodes are many, the states a JSON grammar passes through few (inside a string, the state
 * after every plain character is the state before it). The frames an advance makes stay for the
 * whole walk, since states refer to them. */
static void mask_node(mask_walk *w, uint32_t node, int sid) {
    nv_gmatch *m = w->m;
    for (uint32_t c = w->tr->node[node].first_child; c && !m->oom; c = w->tr->node[c].next_sibling) {
        const trie_node *cn = &w->tr->node[c];
        if (!((m->ws[sid].next[cn->byte >> 6] >> (cn->byte & 63)) & 1)) continue; /* (bit b of byte b/8, little-endian words) */
        int32_t t = m->trans[(size_t)sid * 256 + cn->byte];
        if (t < 0) { /* not yet known: advance the state's heads once */
            size_t from = m->n_hb, n = m->ws[sid].n;
            if (!reserve_heads(m, n)) return;
            memcpy(m->hb + from, m->ws_heads + m->ws[sid].off, n * sizeof *m->hb);
            m->n_hb += n;
            int acc;
            size_t k = advance(m, from, n, cn->byte, &acc);
            int next = m->oom ? -1 : intern_state(m, m->hb + from + n, k);
            if (next < 0) { /* no room: this subtree the raw way */
                if (k || acc) mark_tokens(w, cn);
                if (k && cn->first_child && !m->oom) mask_node_raw(w, c, from + n, k);
                m->n_hb = from;
                continue;
            }
            m->n_hb = from;
            t = m->trans[(size_t)sid * 256 + cn->byte] = next << 1 | (acc != 0);
        }
        const int next = t >> 1;
        if (m->ws[next].n || (t & 1)) mark_tokens(w, cn);
        if (m->ws[next].n && cn->first_child) mask_node(w, c, next);
    }
}

int nv_gmatch_mask(nv_gmatch *m, const nv_gtrie *tr, uint8_t *allowed) {
    memset(allowed, 0, (size_t)tr->vocab);
    mask_walk w = {m, tr, allowed, 0};
    if (m->accepted)
        for (int i = 0; i < tr->n_eog; i++) allowed[tr->eog[i]] = 1, w.n_allowed++;
    const uint32_t fr_mark = m->n_fr;
    m->n_ws = 0; /* this walk's states: none yet */
    m->n_ws_heads = 0;
    if (!m->ws_index && !(m->ws_index = calloc(WS_INDEX, sizeof *m->ws_index))) m->oom = 1;
    if (++m->ws_gen == 0) { /* wrapped: entries of an old walk could pass for this one's */
        if (m->ws_index) memset(m->ws_index, 0, WS_INDEX * sizeof *m->ws_index);
        m->ws_gen = 1;
    }
    int root = m->oom ? -1 : intern_state(m, m->hb, m->n_cur);
    if (root >= 0) mask_node(&w, 0, root);
    else if (!m->oom) mask_node_raw(&w, 0, 0, m->n_cur);
    int oom = m->oom;
    m->n_fr = fr_mark;
    m->n_hb = m->n_cur;
    m->oom = 0;
    return oom ? -1 : w.n_allowed;
}

/* Token tok after prev against the grammar: tried, or fed when commit. */
static int token_step(nv_gmatch *m, const nv_tokenizer *t, int prev, int tok, int commit) {
    if (nv_tokenizer_is_eog(t, tok)) return m->accepted;
    const char *s = nv_tokenizer_decode(t, prev, tok);
    if (!s || !*s) return 0; /* no text: no progress, never allowed */
    return commit ? nv_gmatch_feed(m, s, strlen(s)) == 1 : nv_gmatch_try(m, s, strlen(s));
}

int nv_gmatch_allows(nv_gmatch *m, const nv_tokenizer *t, int prev, int tok) { return token_step(m, t, prev, tok, 0); }
int nv_gmatch_accept(nv_gmatch *m, const nv_tokenizer *t, int prev, int tok) { return token_step(m, t, prev, tok, 1); }

/* ---- sampling inside a grammar ---- */

nv_err nv_gsampler_init(nv_gsampler *g, nv_grammar *grammar, int vocab) {
    memset(g, 0, sizeof *g);
    g->vocab = vocab;
    if (!(g->m = nv_gmatch_new(grammar)) || !(g->logits = malloc((size_t)vocab * sizeof *g->logits)) ||
        !(g->mask = malloc((size_t)vocab))) {
        nv_gsampler_free(g);
        return nv_fail(NV_ENOMEM, "out of memory for a grammar");
    }
    return NV_OK;
}

void nv_gsampler_free(nv_gsampler *g) {
    nv_gmatch_free(g->m);
    free(g->logits);
    free(g->mask);
    memset(g, 0, sizeof *g);
}

int nv_gsample(nv_gsampler *g, const nv_gtrie *tr, const nv_tokenizer *t, nv_sampler *s, int prev, float *logits) {
    const int n = g->vocab;
    memcpy(g->logits, logits, (size_t)n * sizeof *logits);
    const float mu = s->mirostat_mu; /* Mirostat's bound follows the token kept, not a refused draw */
    int tok = nv_sample(s, logits);
    g->draws++;
    if (!nv_gmatch_allows(g->m, t, prev, tok)) {
        s->mirostat_mu = mu;
        double t0 = nv_now();
        int k = nv_gmatch_mask(g->m, tr, g->mask);
        g->masks++;
        g->mask_s += nv_now() - t0;
        for (int v = 0; v < n; v++)
            if (!g->mask[v]) g->logits[v] = -INFINITY;
        tok = k > 0 ? nv_sample(s, g->logits) : -1;
        /* the mask holds texts as they follow any token but BOS, and a draw's rounding may land
         * on a zero-probability token: check, and fall back to the best allowed one */
        while (k > 0 && (tok < 0 || !g->mask[tok] || !nv_gmatch_allows(g->m, t, prev, tok))) {
            if (tok >= 0 && g->mask[tok]) g->mask[tok] = 0, k--;
            tok = -1;
            for (int v = 0; v < n; v++)
                if (g->mask[v] && (tok < 0 || g->logits[v] > g->logits[tok])) tok = v;
        }
        if (k <= 0) return -1;
    }
    return nv_gmatch_accept(g->m, t, prev, tok) ? tok : -1; /* refused only when out of memory */
}

/* ---- lazy grammars ---- */

nv_err nv_glazy_init(nv_glazy *z, nv_grammar *g, const char *trigger, int at_start) {
    memset(z, 0, sizeof *z);
    if (!trigger || !*trigger) return nv_fail(NV_EINVAL, "a lazy grammar needs a trigger");
    if (!(z->trigger = strdup(trigger))) return nv_fail(NV_ENOMEM, "out of memory");
    z->g = nv_grammar_ref(g);
    z->at_start = at_start;
    return NV_OK;
}

void nv_glazy_free(nv_glazy *z) {
    nv_grammar_unref(z->g);
    free(z->trigger);
    nv_buf_free(&z->tail);
    nv_think_free(&z->thk);
    memset(z, 0, sizeof *z);
}

static int is_blank(char ch) { return ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t'; }

int nv_glazy_step(nv_glazy *z, nv_gsampler *gs, int vocab, const char *piece) {
    if (!piece || !*piece) return 0;
    if (z->at_start && z->seen && !z->tail.len) return 0; /* decided: it did not start the text */
    if (z->think) nv_think_feed(&z->thk, piece, strlen(piece), 0, NULL, &z->tail); /* a leading think block is passed over */
    else nv_buf_puts(&z->tail, piece);
    if (z->tail.oom || z->thk.hold.oom) return -1;
    const size_t tl = strlen(z->trigger);
    if (z->at_start) {
        if (!z->seen) { /* the text's first non-blank byte */
            size_t b = 0;
            while (b < z->tail.len && is_blank(z->tail.data[b])) b++;
            nv_buf_consume(&z->tail, b);
            if (!z->tail.len) return 0;
            z->seen = 1;
        }
        size_t n = z->tail.len < tl ? z->tail.len : tl;
        if (memcmp(z->tail.data, z->trigger, n)) { /* not the trigger: free for good */
            nv_buf_consume(&z->tail, z->tail.len);
            return 0;
        }
        if (z->tail.len < tl) return 0; /* so far a beginning of it */
    } else {
        const char *hit = z->tail.len ? memmem(z->tail.data, z->tail.len, z->trigger, tl) : NULL;
        if (!hit) { /* keep only what may still begin the trigger */
            if (z->tail.len >= tl) nv_buf_consume(&z->tail, z->tail.len - (tl - 1));
            return 0;
        }
        nv_buf_consume(&z->tail, (size_t)(hit - z->tail.data));
    }
    int on = 0;
    if (nv_gsampler_init(gs, z->g, vocab) != NV_OK) on = -1;
    else if (nv_gmatch_feed(gs->m, z->tail.data, z->tail.len) == 1) on = 1;
    else nv_gsampler_free(gs);
    nv_buf_consume(&z->tail, z->tail.len);
    if (z->at_start) z->seen = 1; /* once: a text starts only once */
    return on;
}
