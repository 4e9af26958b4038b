#include "model/tokenizer.h"

#include <ctype.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "model/gguf.h"

/* Longest max_token_length header we believe; Llama's is 27, and anything near this is a
 * corrupt or foreign file rather than a vocabulary. */
#define TOK_MAX_HEADER_LEN 65536
/* run.c's merge threshold: its best_score starts at this float and a pair must beat it. */
#define TOK_MERGE_FLOOR (-1e10f)

struct nv_tokenizer {
    int n;
    int max_len;          /* longest piece (as a C string): pairs longer than this never match */
    char *arena;          /* every piece, NUL-terminated, back to back */
    size_t *off;          /* piece i starts at arena + off[i] */
    int *len;             /* strlen of piece i */
    float *score;
    uint32_t *hash;       /* hash of piece i, checked before comparing bytes */
    int *table;           /* open addressing over ids, -1 = empty */
    uint32_t mask;
    char byte_pieces[512]; /* "b\0" for every byte b: decode's answer for <0xXX> pieces */
    uint8_t bigram[256 * 256 / 8]; /* bit (x,y) set: some piece has byte y right after byte x */
};

/* FNV-1a, continued across calls so a pair can be hashed without concatenating it. */
#define TOK_HASH_INIT 2166136261u
static uint32_t tok_hash(uint32_t h, const char *s, int n) {
    for (int i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 16777619u;
    }
    return h;
}

static inline const char *tok_piece(const nv_tokenizer *t, int id) { return t->arena + t->off[id]; }

/* Id of the string a (la bytes) followed by b (lb bytes), or -1. */
static int tok_lookup2(const nv_tokenizer *t, const char *a, int la, const char *b, int lb) {
    if (la + lb > t->max_len) return -1;
    uint32_t h = tok_hash(tok_hash(TOK_HASH_INIT, a, la), b, lb);
    for (uint32_t i = h & t->mask;; i = (i + 1) & t->mask) {
        int id = t->table[i];
        if (id < 0) return -1;
        if (t->hash[id] == h && t->len[id] == la + lb) {
            const char *p = tok_piece(t, id);
            if (memcmp(p, a, (size_t)la) == 0 && memcmp(p + la, b, (size_t)lb) == 0) return id;
        }
    }
}

int nv_tokenizer_lookup(const nv_tokenizer *t, const char *str) {
    size_t n = strlen(str);
    if (n > (size_t)t->max_len) return -1;
    return tok_lookup2(t, str, (int)n, "", 0);
}

/* Re-fails a reader error with the token index in front, keeping the reader's detail. */
static nv_err tok_entry_fail(nv_err e, int index) {
    char detail[768];
    snprintf(detail, sizeof detail, "%s", nv_errmsg());
    return nv_fail(e, "%s (token %d)", detail, index);
}

/* Reads one entry; *piece points into the mapping. */
static nv_err tok_read_entry(nv_reader *r, int index, float *score, const void **piece, int32_t *len) {
    nv_err e;
    if ((e = nv_read_f32(r, score, "token score")) != NV_OK) return tok_entry_fail(e, index);
    if ((e = nv_read_i32(r, len, "token length")) != NV_OK) return tok_entry_fail(e, index);
    if (*len < 0)
        return nv_fail(NV_EFORMAT, "%s: token %d has negative length %d at offset %zu", r->what,
                       index, (int)*len, r->pos - 4);
    if ((e = nv_read_view(r, piece, (size_t)*len, "token bytes")) != NV_OK)
        return tok_entry_fail(e, index);
    return NV_OK;
}

void nv_tokenizer_free(nv_tokenizer *t) {
    if (!t) return;
    free(t->arena);
    free(t->off);
    free(t->len);
    free(t->score);
    free(t->hash);
    free(t->table);
    free(t);
}

static nv_err tok_build(const char *path, const nv_mapped *m, int vocab_size, nv_tokenizer *t) {
    nv_reader r = nv_reader_make(m->data, m->len, path);
    int32_t header;
    if (m->len == 0) return nv_fail(NV_EFORMAT, "%s: empty file, not a tokenizer", path);
    NV_TRY(nv_read_i32(&r, &header, "max_token_length"));
    if (header <= 0 || header > TOK_MAX_HEADER_LEN)
        return nv_fail(NV_EFORMAT, "%s: max_token_length %d is not in 1..%d; not a tokenizer.bin",
                       path, (int)header, TOK_MAX_HEADER_LEN);

    /* Pass 1: validate every entry and size the arrays. */
    size_t body = r.pos, arena_len = 0;
    int count = 0;
    while (vocab_size > 0 ? count < vocab_size : nv_reader_left(&r) > 0) {
        float s;
        const void *p;
        int32_t len;
        if (count == INT_MAX) return nv_fail(NV_EFORMAT, "%s: too many tokens", path);
        NV_TRY(tok_read_entry(&r, count, &s, &p, &len));
        arena_len += (size_t)len + 1;
        count++;
    }
    if (count < 3)
        return nv_fail(NV_EFORMAT, "%s: %d tokens; a vocabulary needs at least <unk>, <s>, </s>",
                       path, count);
    t->n = count;

    size_t cap = 1;
    while (cap < 2 * (size_t)count) cap <<= 1;
    if (cap > UINT32_MAX) return nv_fail(NV_ENOMEM, "%s: vocabulary too large", path);
    t->arena = malloc(arena_len);
    t->off = malloc((size_t)count * sizeof *t->off);
    t->len = malloc((size_t)count * sizeof *t->len);
    t->score = malloc((size_t)count * sizeof *t->score);
    t->hash = malloc((size_t)count * sizeof *t->hash);
    t->table = malloc(cap * sizeof *t->table);
    if (!t->arena || !t->off || !t->len || !t->score || !t->hash || !t->table)
        return nv_fail(NV_ENOMEM, "%s: out of memory for %d tokens", path, count);
    t->mask = (uint32_t)(cap - 1);
    memset(t->table, 0xff, cap * sizeof *t->table);

    /* Pass 2: copy the pieces and index them; the first of equal strings keeps the slot. */
    r.pos = body;
    size_t at = 0;
    for (int i = 0; i < count; i++) {
        const void *p;
        int32_t len;
        NV_TRY(tok_read_entry(&r, i, &t->score[i], &p, &len));
        memcpy(t->arena + at, p, (size_t)len);
        t->arena[at + (size_t)len] = '\0';
        t->off[i] = at;
        /* run.c treats pieces as C strings; an embedded NUL ends the piece. */
        size_t sl = strlen(t->arena + at);
        if (sl > INT_MAX / 2) return nv_fail(NV_EFORMAT, "%s: token %d is too long", path, i);
        t->len[i] = (int)sl;
        if (t->len[i] > t->max_len) t->max_len = t->len[i];
        at += (size_t)len + 1;
    }
    for (int i = 0; i < count; i++) {
        const char *p = tok_piece(t, i);
        uint32_t h = tok_hash(TOK_HASH_INIT, p, t->len[i]);
        t->hash[i] = h;
        uint32_t j = h & t->mask;
        for (; t->table[j] >= 0; j = (j + 1) & t->mask) {
            int o = t->table[j];
            if (t->hash[o] == h && t->len[o] == t->len[i] && memcmp(tok_piece(t, o), p, (size_t)t->len[i]) == 0)
                break;
        }
        if (t->table[j] < 0) t->table[j] = i;
    }
    for (int i = 0; i < count; i++) {
        const unsigned char *p = (const unsigned char *)tok_piece(t, i);
        for (int j = 1; j < t->len[i]; j++) {
            unsigned bg = (unsigned)p[j - 1] << 8 | p[j];
            t->bigram[bg >> 3] |= (uint8_t)(1u << (bg & 7));
        }
    }
    for (int b = 0; b < 256; b++) {
        t->byte_pieces[2 * b] = (char)b;
        t->byte_pieces[2 * b + 1] = '\0';
    }
    return NV_OK;
}

nv_err nv_tokenizer_load(const char *path, int vocab_size, nv_tokenizer **out) {
    *out = NULL;
    if (vocab_size < 0) return nv_fail(NV_EINVAL, "%s: negative vocab_size %d", path, vocab_size);
    nv_mapped m;
    NV_TRY(nv_file_map(path, &m));
    nv_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        nv_file_unmap(&m);
        return nv_fail(NV_ENOMEM, "out of memory");
    }
    nv_err e;
    if (nv_gguf_is(m.data, m.len)) { /* a GGUF file's vocabulary, as tokenizer.bin bytes */
        nv_file_unmap(&m);
        uint8_t *bytes = NULL;
        size_t len = 0;
        e = nv_gguf_tokenizer_bytes(path, &bytes, &len);
        if (e == NV_OK) e = tok_build(path, &(nv_mapped){bytes, len}, vocab_size, t);
        free(bytes);
    } else {
        e = tok_build(path, &m, vocab_size, t);
        nv_file_unmap(&m);
    }
    if (e != NV_OK) {
        nv_tokenizer_free(t);
        return e;
    }
    *out = t;
    return NV_OK;
}

int nv_tokenizer_vocab_size(const nv_tokenizer *t) { return t->n; }

const char *nv_tokenizer_piece(const nv_tokenizer *t, int id) {
    return id >= 0 && id < t->n ? tok_piece(t, id) : NULL;
}

float nv_tokenizer_score(const nv_tokenizer *t, int id) {
    return id >= 0 && id < t->n ? t->score[id] : 0.0f;
}

/* run.c's byte fallback is id b+3; a vocabulary too small for that gets <unk> instead of an
 * id past its end. */
static int tok_byte_id(const nv_tokenizer *t, unsigned char b) {
    return (int)b + 3 < t->n ? (int)b + 3 : NV_TOKEN_UNK;
}

/* A merge candidate: the pair starting at node `left` merges into piece `id`. key orders
 * candidates the way run.c picks them: higher score first, then the leftmost pair (merges only
 * remove right-hand nodes, so node indices stay in text order). The candidate is stale once
 * the pair at `left` has changed, which bumps gen[left]. */
typedef struct {
    uint64_t key; /* ordered score bits << 32 | ~left */
    uint32_t gen;
    int32_t id;
} tok_cand;

/* Maps a non-NaN float to an unsigned key with the same order; -0 and +0 are equal, as they
 * are to run.c's '>'. */
static inline uint32_t tok_score_key(float f) {
    if (f == 0.0f) f = 0.0f;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

static inline int tok_cand_left(const tok_cand *c) { return (int)~(uint32_t)c->key; }

/* A 4-ary max-heap on key: shallower than a binary heap, so fewer cache misses. */
typedef struct {
    tok_cand *a;
    size_t n, cap;
} tok_heap;

static void tok_heap_down(tok_heap *h, size_t i) {
    tok_cand x = h->a[i];
    for (;;) {
        size_t c = 4 * i + 1, best = c;
        if (c >= h->n) break;
        size_t end = c + 4 < h->n ? c + 4 : h->n;
        for (size_t j = c + 1; j < end; j++)
            if (h->a[j].key > h->a[best].key) best = j;
        if (h->a[best].key <= x.key) break;
        h->a[i] = h->a[best];
        i = best;
    }
    h->a[i] = x;
}

static int tok_heap_push(tok_heap *h, tok_cand c) {
    if (h->n == h->cap) {
        size_t nc = h->cap ? 2 * h->cap : 64;
        tok_cand *na = realloc(h->a, nc * sizeof *na);
        if (!na) return -1;
        h->a = na;
        h->cap = nc;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 4;
        if (h->a[p].key >= c.key) break;
        h->a[i] = h->a[p];
        i = p;
    }
    h->a[i] = c;
    return 0;
}

static tok_cand tok_heap_pop(tok_heap *h) {
    tok_cand top = h->a[0];
    h->a[0] = h->a[--h->n];
    if (h->n) tok_heap_down(h, 0);
    return top;
}

/* One token of the sequence being merged. The fields sit together because the merge loop
 * visits nodes in score order, i.e. at random places in the text: one cache miss, not four. */
typedef struct {
    int tok, next, prev;
    uint32_t gen; /* bumped whenever the pair starting here changes */
} tok_node;

/* The candidate for the pair (l, r) if its concatenation is a piece run.c would merge. */
static int tok_pair(const nv_tokenizer *t, const tok_node *nd, int l, int r, tok_cand *c) {
    int a = nd[l].tok, b = nd[r].tok;
    int id = tok_lookup2(t, tok_piece(t, a), t->len[a], tok_piece(t, b), t->len[b]);
    if (id < 0 || !(t->score[id] > TOK_MERGE_FLOOR)) return 0;
    c->key = (uint64_t)tok_score_key(t->score[id]) << 32 | (uint32_t)~(uint32_t)l;
    c->gen = nd[l].gen;
    c->id = id;
    return 1;
}

static int tok_offer(const nv_tokenizer *t, tok_heap *h, const tok_node *nd, int l, int r) {
    tok_cand c;
    if (l < 0 || r < 0 || !tok_pair(t, nd, l, r, &c)) return 0;
    return tok_heap_push(h, c);
}

/* Run.c's greedy loop over the nodes [s, e), which no merge can leave. */
static int tok_merge_span(const nv_tokenizer *t, tok_node *nd, tok_heap *h, int s, int e) {
    h->n = 0;
    for (int i = s; i + 1 < e; i++)
        if (tok_pair(t, nd, i, i + 1, &h->a[h->n])) h->n++;
    for (size_t i = h->n / 4 + 1; i-- > 0;)
        if (i < h->n) tok_heap_down(h, i);
    while (h->n) {
        tok_cand c = tok_heap_pop(h);
        int l = tok_cand_left(&c);
        if (nd[l].gen != c.gen) continue; /* stale */
        int r = nd[l].next, p = nd[l].prev, rn = nd[r].next;
        nd[l].tok = c.id;
        nd[l].next = rn;
        if (rn >= 0) nd[rn].prev = l;
        /* The pairs starting at l and at p changed; r is gone. */
        nd[l].gen++;
        nd[r].gen++;
        if (p >= 0) nd[p].gen++;
        if (tok_offer(t, h, nd, p, l) != 0 || tok_offer(t, h, nd, l, rn) != 0) return -1;
    }
    return 0;
}

/* Whether no merge can ever join the token holding initial token a (at its end) with the one
 * holding initial token b (at its start). A merged token's piece is the concatenation of the
 * initial pieces it covers, so such a merge would make a piece containing a's last byte
 * followed by b's first byte; if no piece has that byte pair, the two sides are independent. */
static int tok_cut(const nv_tokenizer *t, int a, int b) {
    if (t->len[a] == 0 || t->len[b] == 0) return 0;
    unsigned bg = (unsigned)(unsigned char)tok_piece(t, a)[t->len[a] - 1] << 8 | (unsigned char)tok_piece(t, b)[0];
    return !(t->bigram[bg >> 3] >> (bg & 7) & 1);
}

/* Greedy merging over tok[0..n) in place; returns the new count or -1 on allocation failure.
 * The sequence is split where tok_cut() proves no merge can cross, and each span is merged on
 * its own: run.c's global order restricted to a span is that span's own greedy order (the
 * best pair overall is the best, and leftmost among equals, within its span), so the result
 * is identical, while the heap and nodes stay small and in cache. */
static int tok_merge(const nv_tokenizer *t, int *tok, int n) {
    if (n < 2) return n;
    tok_node *nd = malloc((size_t)n * sizeof *nd);
    tok_heap h = {malloc((size_t)n * sizeof(tok_cand)), 0, (size_t)n};
    int m = -1;
    if (!nd || !h.a) goto done;
    m = 0;
    for (int s = 0, e; s < n; s = e) {
        for (e = s + 1; e < n && !tok_cut(t, tok[e - 1], tok[e]); e++) {
        }
        for (int i = s; i < e; i++) nd[i] = (tok_node){tok[i], i + 1 < e ? i + 1 : -1, i > s ? i - 1 : -1, 0};
        if (tok_merge_span(t, nd, &h, s, e) != 0) {
            m = -1;
            goto done;
        }
        /* Node s is never removed (only right-hand nodes are), so the span starts there.
         * Writing at m <= s leaves tok[e..] untouched for the next spans. */
        for (int i = s; i >= 0; i = nd[i].next) tok[m++] = nd[i].tok;
    }
done:
    free(nd);
    free(h.a);
    return m;
}

nv_err nv_tokenizer_encode(const nv_tokenizer *t, const char *text, int bos, int eos, int **tokens,
                           int *n_tokens) {
    *tokens = NULL;
    *n_tokens = 0;
    if (!text) return nv_fail(NV_EINVAL, "cannot encode NULL text");
    size_t tl = strlen(text);
    if (tl > (size_t)INT_MAX - 3) return nv_fail(NV_ERANGE, "text of %zu bytes is too long to encode", tl);
    /* Each byte yields at most one token; plus BOS, the dummy prefix and EOS. */
    int *tok = malloc((tl + 3) * sizeof *tok);
    if (!tok) return nv_fail(NV_ENOMEM, "out of memory encoding %zu bytes", tl);
    int n = 0;
    if (bos) tok[n++] = NV_TOKEN_BOS;
    /* add_dummy_prefix: SentencePiece prepends a space to non-empty text. */
    if (text[0] != '\0') {
        int id = nv_tokenizer_lookup(t, " ");
        tok[n++] = id >= 0 ? id : tok_byte_id(t, ' ');
    }
    /* run.c's UTF-8 walk, byte for byte: a chunk is a non-continuation byte plus the
     * continuation bytes after it, cut at 4 bytes; stray continuation bytes form chunks of
     * their own, also at most 4. A chunk not in the vocabulary falls back to its bytes. */
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < tl;) {
        size_t k = 1;
        while (k < 4 && (s[i + k] & 0xC0) == 0x80) k++;
        int id = k <= (size_t)t->max_len ? tok_lookup2(t, text + i, (int)k, "", 0) : -1;
        if (id >= 0) {
            tok[n++] = id;
        } else {
            for (size_t j = 0; j < k; j++) tok[n++] = tok_byte_id(t, s[i + j]);
        }
        i += k;
    }
    int m = tok_merge(t, tok, n);
    if (m < 0) {
        free(tok);
        return nv_fail(NV_ENOMEM, "out of memory encoding %zu bytes", tl);
    }
    n = m;
    if (eos) tok[n++] = NV_TOKEN_EOS;
    *tokens = tok;
    *n_tokens = n;
    return NV_OK;
}

const char *nv_tokenizer_decode(const nv_tokenizer *t, int prev_token, int token) {
    if (token < 0 || token >= t->n) return NULL;
    const char *p = tok_piece(t, token);
    /* SentencePiece's decoder drops the dummy prefix's space after BOS (llama2.c PR #89). */
    if (prev_token == NV_TOKEN_BOS && p[0] == ' ') p++;
    /* Same test as run.c (sscanf, so the same lenient matches), gated to stay cheap. */
    if (p[0] == '<' && p[1] == '0' && p[2] == 'x') {
        unsigned char b;
        if (sscanf(p, "<0x%02hhX>", &b) == 1) p = t->byte_pieces + 2 * (int)b;
    }
    return p;
}

int nv_piece_printable(const char *piece) {
    if (!piece || piece[0] == '\0') return 0;
    if (piece[1] == '\0') {
        unsigned char b = (unsigned char)piece[0];
        if (!(isprint(b) || isspace(b))) return 0;
    }
    return 1;
}

nv_err nv_tokenizer_load_for_model(const char *path, int vocab_size, nv_tokenizer **out) {
    NV_TRY(nv_tokenizer_load(path, 0, out));
    if (nv_tokenizer_vocab_size(*out) == vocab_size) return NV_OK;
    nv_err e = nv_fail(NV_EFORMAT, "%s has %d tokens but the model's vocabulary is %d: pass the model's tokenizer with -z",
                       path, nv_tokenizer_vocab_size(*out), vocab_size);
    nv_tokenizer_free(*out);
    *out = NULL;
    return e;
}
