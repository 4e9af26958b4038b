#include "model/tokenizer.h"

#include <ctype.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"

/* Longest max_token_length header we believe; Llama's is 27, and anything near this is a
 * corrupt or foreign file rather than a vocabulary. */
#define TOK_MAX_HEADER_LEN 65536
/* run.c's merge threshold: its best_score starts at this float and a pair must beat it. */
#define TOK_MERGE_FLOOR (-1e10f)

struct nv_tokenizer {
    int n;
    int max_len;          /* longest piece (as a C string): pairs longer than this never match */
    int header_max_len;   /* the file's max_token_length, kept for diagnostics */
    char *arena;          /* every piece, NUL-terminated, back to back */
    size_t *off;          /* piece i starts at arena + off[i] */
    int *len;             /* strlen of piece i */
    float *score;
    uint32_t *hash;       /* hash of piece i, checked before comparing bytes */
    int *table;           /* open addressing over ids, -1 = empty */
    uint32_t mask;
    char byte_pieces[512]; /* "b\0" for every byte b: decode's answer for <0xXX> pieces */
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
    t->header_max_len = header;

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
    nv_err e = tok_build(path, &m, vocab_size, t);
    nv_file_unmap(&m);
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

/* A merge candidate: the adjacent pair (left, right) whose concatenation is piece id. It is
 * stale unless both nodes still hold tokens lt, rt and are still neighbours. */
typedef struct {
    float score;
    int left, right, lt, rt, id;
} tok_cand;

typedef struct {
    tok_cand *a;
    size_t n, cap;
} tok_heap;

/* run.c picks the highest score and, among equal scores, the leftmost pair. Merges only
 * remove right-hand nodes, so node indices stay in text order and "leftmost" is "lowest
 * left index". Scores here are never NaN (filtered on push), so this is a strict order. */
static inline int tok_before(const tok_cand *x, const tok_cand *y) {
    return x->score > y->score || (x->score == y->score && x->left < y->left);
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
        size_t p = (i - 1) / 2;
        if (!tok_before(&c, &h->a[p])) break;
        h->a[i] = h->a[p];
        i = p;
    }
    h->a[i] = c;
    return 0;
}

static tok_cand tok_heap_pop(tok_heap *h) {
    tok_cand top = h->a[0], last = h->a[--h->n];
    size_t i = 0, n = h->n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && tok_before(&h->a[c + 1], &h->a[c])) c++;
        if (!tok_before(&h->a[c], &last)) break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (n) h->a[i] = last;
    return top;
}

/* Pushes the pair (l, r) if its concatenation is a piece that run.c would merge. */
static int tok_offer(const nv_tokenizer *t, tok_heap *h, const int *tok, int l, int r) {
    if (l < 0 || r < 0) return 0;
    int a = tok[l], b = tok[r];
    int id = tok_lookup2(t, tok_piece(t, a), t->len[a], tok_piece(t, b), t->len[b]);
    if (id < 0 || !(t->score[id] > TOK_MERGE_FLOOR)) return 0;
    tok_cand c = {t->score[id], l, r, a, b, id};
    return tok_heap_push(h, c);
}

/* Greedy merging over tok[0..n) in place; returns the new count or -1 on allocation failure. */
static int tok_merge(const nv_tokenizer *t, int *tok, int n) {
    if (n < 2) return n;
    int *next = malloc((size_t)n * sizeof *next), *prev = malloc((size_t)n * sizeof *prev);
    tok_heap h = {0};
    int result = -1;
    if (!next || !prev) goto done;
    for (int i = 0; i < n; i++) {
        prev[i] = i - 1;
        next[i] = i + 1 < n ? i + 1 : -1;
    }
    for (int i = 0; i + 1 < n; i++)
        if (tok_offer(t, &h, tok, i, i + 1) != 0) goto done;
    while (h.n) {
        tok_cand c = tok_heap_pop(&h);
        int l = c.left, r = c.right;
        if (tok[l] != c.lt || next[l] != r || tok[r] != c.rt) continue; /* stale */
        tok[l] = c.id;
        tok[r] = -1;
        next[l] = next[r];
        if (next[r] >= 0) prev[next[r]] = l;
        if (tok_offer(t, &h, tok, prev[l], l) != 0 || tok_offer(t, &h, tok, l, next[l]) != 0) goto done;
    }
    /* Node 0 is never removed (only right-hand nodes are), so the list starts there. */
    int m = 0;
    for (int i = 0; i >= 0; i = next[i]) tok[m++] = tok[i];
    result = m;
done:
    free(next);
    free(prev);
    free(h.a);
    return result;
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
