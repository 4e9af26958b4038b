#include "model/bpe_train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A run of characters longer than this is counted as several words: it bounds the work of
 * re-reading one word during a merge (pieces are capped far below it anyway). */
#define BPE_MAX_WORD 64
#define BPE_EOT "<|endoftext|>"
#define BPE_EOT_LEN 13

enum { CL_SPACE, CL_LETTER, CL_DIGIT, CL_OTHER };

/* ---- small helpers ---------------------------------------------------------------------- */

static int bpe_grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 16;
    while (nc < need) nc *= 2;
    void *np = realloc(*p, nc * elem);
    if (!np) return -1;
    *p = np;
    *cap = nc;
    return 0;
}
#define GROW(arr, cap, need) bpe_grow((void **)&(arr), &(cap), (need), sizeof *(arr))

static inline uint64_t bpe_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t bpe_hash_bytes(const uint8_t *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    return bpe_mix(h);
}

static uint64_t bpe_hash_ids(const int *s, int n) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)s[i]) * 1099511628211ull;
    return bpe_mix(h);
}

/* An open-addressing index of ints (-1 empty) whose keys live elsewhere. */
typedef struct {
    int *slot;
    size_t mask, used;
} bpe_index;

static int bpe_index_init(bpe_index *x, size_t want) {
    size_t cap = 64;
    while (cap < 2 * want) cap <<= 1;
    x->slot = malloc(cap * sizeof *x->slot);
    if (!x->slot) return -1;
    memset(x->slot, 0xff, cap * sizeof *x->slot);
    x->mask = cap - 1;
    x->used = 0;
    return 0;
}

/* Length in bytes of the encoder's chunk at s[0..n): a byte plus the continuation bytes after
 * it, at most 4 (run.c's UTF-8 walk). */
static inline int bpe_chunk(const uint8_t *s, size_t n) {
    int k = 1;
    while (k < 4 && (size_t)k < n && (s[k] & 0xC0) == 0x80) k++;
    return k;
}

/* Whether a chunk is one well-formed UTF-8 code point other than NUL: only those may get a
 * piece (an ill-formed chunk is left to the byte fallback). */
static int bpe_valid_cp(const uint8_t *s, int n) {
    uint8_t c = s[0];
    if (n == 1) return c != 0 && c < 0x80;
    if (n == 2) return c >= 0xC2 && c <= 0xDF;
    if (n == 3) {
        if (c < 0xE0 || c > 0xEF) return 0;
        if (c == 0xE0 && s[1] < 0xA0) return 0; /* overlong */
        if (c == 0xED && s[1] >= 0xA0) return 0; /* surrogate */
        return 1;
    }
    if (c < 0xF0 || c > 0xF4) return 0;
    if (c == 0xF0 && s[1] < 0x90) return 0;
    if (c == 0xF4 && s[1] >= 0x90) return 0;
    return 1;
}

static int bpe_class(const uint8_t *s, int n) {
    if (n == 1) {
        uint8_t c = s[0];
        if (c == ' ') return CL_SPACE;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '\'') return CL_LETTER;
        if (c >= '0' && c <= '9') return CL_DIGIT;
        return CL_OTHER;
    }
    uint32_t cp = s[0] & (0x7F >> n);
    for (int i = 1; i < n; i++) cp = cp << 6 | (s[i] & 0x3F);
    if (cp <= 0xBF || cp == 0xD7 || cp == 0xF7) return CL_OTHER; /* C1 controls, Latin-1 signs */
    if (cp >= 0x2000 && cp <= 0x206F && cp != 0x2019) return CL_OTHER; /* general punctuation */
    if ((cp >= 0x3000 && cp <= 0x303F) || (cp >= 0xFF00 && cp <= 0xFF0F)) return CL_OTHER;
    return CL_LETTER;
}

/* Whether a learned piece would break encode/decode: one starting with "<0x" (also after the
 * space the decoder strips after BOS) reads as a byte token, and a proper prefix or suffix of
 * a reserved piece could be joined with another piece into that reserved piece. */
static int bpe_pat(const uint8_t *s, int n, const char *pat, int off) {
    for (int i = 0; i < n; i++) {
        char p = pat[off + i];
        uint8_t c = s[i];
        if (p == '#' ? !((c >= '0' && c <= '9') || (c >= 'A' && c <= 'F')) : c != (uint8_t)p) return 0;
    }
    return 1;
}

static int bpe_forbidden(const uint8_t *s, int n) {
    if (n >= 3 && memcmp(s, "<0x", 3) == 0) return 1;
    if (n >= 4 && memcmp(s, " <0x", 4) == 0) return 1;
    static const char *const reserved[] = {"<unk>", "<0x##>"};
    for (size_t r = 0; r < sizeof reserved / sizeof reserved[0]; r++) {
        int L = (int)strlen(reserved[r]);
        if (n >= 2 && n < L && (bpe_pat(s, n, reserved[r], 0) || bpe_pat(s, n, reserved[r], L - n))) return 1;
    }
    return 0;
}

typedef struct bpe bpe;

/* ---- trainer state ---------------------------------------------------------------------- */

typedef struct {
    uint64_t key; /* chunk bytes, little-endian, | length << 32 */
    uint64_t count;
    int id; /* piece id, or -1 when left to the byte fallback */
    int cls;
} bpe_char;

typedef struct {
    int a, b;
    int64_t count;
    int64_t old;  /* count before the current merge touched it */
    int *list;    /* words that hold or held this pair (may repeat or be stale) */
    int nl, cl;
    int stamp;    /* merge number that last touched it */
    int banned;
} bpe_pair;

typedef struct {
    int64_t count;
    int a, b;
} bpe_heap_ent;

struct bpe {
    nv_bpe_opts o;
    /* characters */
    bpe_char *chars;
    size_t nchars, chars_cap;
    bpe_index char_ix;
    uint64_t char_total, line_bytes;
    int space_id;
    /* words: symbols back to back, in first-seen order */
    int *sym;
    size_t nsym, sym_cap;
    size_t *woff;
    int *wlen;
    uint64_t *wcnt;
    uint64_t *whash;
    int *wstamp;
    size_t nw, w_cap;
    bpe_index word_ix;
    /* pieces from id 259: bytes, length, code points */
    uint8_t *arena;
    size_t narena, arena_cap;
    size_t *poff;
    int *plen, *pcps;
    size_t piece_cap;
    int ntok;
    int first_learned;
    bpe_index piece_ix; /* learned pieces by string */
    /* pairs */
    bpe_pair *pairs;
    size_t npairs, pairs_cap;
    bpe_index pair_ix;
    int *touched;
    size_t ntouched, touched_cap;
    bpe_heap_ent *heap;
    size_t nheap, heap_cap;
    int ascii_ix[128]; /* character index of each ASCII byte, -1 until seen */
};

/* ---- indexes ---------------------------------------------------------------------------- */

typedef uint64_t (*bpe_hash_fn)(const bpe *b, int item);

static uint64_t char_key(const uint8_t *s, int n) {
    uint64_t k = (uint64_t)n << 32;
    for (int i = 0; i < n; i++) k |= (uint64_t)s[i] << (8 * i);
    return k;
}
static uint64_t hash_char(const bpe *b, int i) { return bpe_mix(b->chars[i].key); }
static uint64_t hash_word(const bpe *b, int i) { return b->whash[i]; }
static uint64_t hash_piece(const bpe *b, int i) { return bpe_hash_bytes(b->arena + b->poff[i], (size_t)b->plen[i]); }
static inline uint64_t pair_hash(int a, int c) { return bpe_mix((uint64_t)(uint32_t)a << 32 | (uint32_t)c); }
static uint64_t hash_pair(const bpe *b, int i) { return pair_hash(b->pairs[i].a, b->pairs[i].b); }

/* Adds item (known to be absent) under hash h, doubling the table when half full. */
static int bpe_index_add(bpe *b, bpe_index *x, uint64_t h, int item, bpe_hash_fn fn) {
    if (2 * (x->used + 1) > x->mask + 1) {
        size_t cap = 2 * (x->mask + 1);
        int *ns = malloc(cap * sizeof *ns);
        if (!ns) return -1;
        memset(ns, 0xff, cap * sizeof *ns);
        for (size_t i = 0; i <= x->mask; i++) {
            int it = x->slot[i];
            if (it < 0) continue;
            size_t j = fn(b, it) & (cap - 1);
            while (ns[j] >= 0) j = (j + 1) & (cap - 1);
            ns[j] = it;
        }
        free(x->slot);
        x->slot = ns;
        x->mask = cap - 1;
    }
    size_t j = h & x->mask;
    while (x->slot[j] >= 0) j = (j + 1) & x->mask;
    x->slot[j] = item;
    x->used++;
    return 0;
}

static int char_find(const bpe *b, uint64_t key) {
    for (size_t j = bpe_mix(key) & b->char_ix.mask;; j = (j + 1) & b->char_ix.mask) {
        int it = b->char_ix.slot[j];
        if (it < 0 || b->chars[it].key == key) return it;
    }
}

static int pair_find(const bpe *b, int a, int c) {
    for (size_t j = pair_hash(a, c) & b->pair_ix.mask;; j = (j + 1) & b->pair_ix.mask) {
        int it = b->pair_ix.slot[j];
        if (it < 0 || (b->pairs[it].a == a && b->pairs[it].b == c)) return it;
    }
}

static int piece_find(const bpe *b, const uint8_t *s, int n) {
    for (size_t j = bpe_hash_bytes(s, (size_t)n) & b->piece_ix.mask;; j = (j + 1) & b->piece_ix.mask) {
        int it = b->piece_ix.slot[j];
        if (it < 0 || (b->plen[it] == n && memcmp(b->arena + b->poff[it], s, (size_t)n) == 0)) return it;
    }
}

/* ---- pass 1: characters ----------------------------------------------------------------- */

static nv_err char_add(bpe *b, const uint8_t *s, int n) {
    b->char_total++;
    if (n == 1 && s[0] < 128 && b->ascii_ix[s[0]] >= 0) {
        b->chars[b->ascii_ix[s[0]]].count++;
        return NV_OK;
    }
    uint64_t key = char_key(s, n);
    int i = char_find(b, key);
    if (i < 0) {
        if (GROW(b->chars, b->chars_cap, b->nchars + 1) != 0) return nv_fail(NV_ENOMEM, "out of memory counting characters");
        i = (int)b->nchars++;
        b->chars[i] = (bpe_char){key, 0, -1, bpe_class(s, n)};
        if (bpe_index_add(b, &b->char_ix, bpe_mix(key), i, hash_char) != 0)
            return nv_fail(NV_ENOMEM, "out of memory counting characters");
        if (n == 1 && s[0] < 128) b->ascii_ix[s[0]] = i;
    }
    b->chars[i].count++;
    return NV_OK;
}

static nv_err count_line(bpe *b, const uint8_t *s, size_t n, int sep) {
    if (n) {
        b->line_bytes += n;
        NV_TRY(char_add(b, (const uint8_t *)" ", 1)); /* the dummy prefix */
    }
    for (size_t i = 0; i < n;) {
        int k = bpe_chunk(s + i, n - i);
        NV_TRY(char_add(b, s + i, k));
        i += (size_t)k;
    }
    if (sep) {
        uint8_t c = (uint8_t)sep;
        NV_TRY(char_add(b, &c, 1));
    }
    return NV_OK;
}

/* ---- pass 2: words ---------------------------------------------------------------------- */

static nv_err word_flush(bpe *b, const int *w, int n) {
    if (n < 2) return NV_OK;
    uint64_t h = bpe_hash_ids(w, n);
    for (size_t j = h & b->word_ix.mask;; j = (j + 1) & b->word_ix.mask) {
        int it = b->word_ix.slot[j];
        if (it < 0) break;
        if (b->whash[it] == h && b->wlen[it] == n && memcmp(b->sym + b->woff[it], w, (size_t)n * sizeof *w) == 0) {
            b->wcnt[it]++;
            return NV_OK;
        }
    }
    if (GROW(b->sym, b->sym_cap, b->nsym + (size_t)n) != 0) return nv_fail(NV_ENOMEM, "out of memory counting words");
    size_t need = b->nw + 1, cap = b->w_cap;
    if (need > cap) {
        size_t c1 = cap, c2 = cap, c3 = cap, c4 = cap;
        if (GROW(b->woff, c1, need) || GROW(b->wlen, c2, need) || GROW(b->wcnt, c3, need) || GROW(b->whash, c4, need))
            return nv_fail(NV_ENOMEM, "out of memory counting words");
        b->w_cap = c1;
    }
    size_t i = b->nw++;
    b->woff[i] = b->nsym;
    b->wlen[i] = n;
    b->wcnt[i] = 1;
    b->whash[i] = h;
    memcpy(b->sym + b->nsym, w, (size_t)n * sizeof *w);
    b->nsym += (size_t)n;
    if (bpe_index_add(b, &b->word_ix, h, (int)i, hash_word) != 0) return nv_fail(NV_ENOMEM, "out of memory counting words");
    return NV_OK;
}

static nv_err words_line(bpe *b, const uint8_t *s, size_t n) {
    if (!n) return NV_OK;
    int w[BPE_MAX_WORD], len = 0, last = CL_SPACE;
    w[len++] = b->space_id; /* the dummy prefix starts the first word */
    for (size_t i = 0; i < n;) {
        int k = bpe_chunk(s + i, n - i), ci;
        if (k == 1 && s[i] < 128) ci = b->ascii_ix[s[i]];
        else ci = char_find(b, char_key(s + i, k));
        i += (size_t)k;
        int id = ci >= 0 ? b->chars[ci].id : -1;
        if (id < 0) { /* byte fallback: nothing merges across it */
            NV_TRY(word_flush(b, w, len));
            len = 0;
            continue;
        }
        int cl = b->chars[ci].cls;
        if (len > 0) {
            int cont;
            if (cl == CL_SPACE) cont = 0;
            else if (len == 1 && last == CL_SPACE) cont = 1; /* " " + the word it leads */
            else if (cl == CL_DIGIT || last == CL_DIGIT) cont = 0;
            else cont = cl == last;
            if (!cont || len == BPE_MAX_WORD) {
                NV_TRY(word_flush(b, w, len));
                len = 0;
            }
        }
        w[len++] = id;
        last = cl;
    }
    return word_flush(b, w, len);
}

/* Calls count_line (pass 0) or words_line (pass 1) for every line of every text. Lines end at
 * "\n", "\r" (both counted as characters) and "<|endoftext|>" (dropped). */
static nv_err scan(bpe *b, const nv_iov *texts, int n_texts, int pass) {
    for (int t = 0; t < n_texts; t++) {
        const uint8_t *p = texts[t].ptr;
        size_t len = texts[t].len, start = 0;
        if (!len) continue;
        for (size_t i = 0; i <= len; i++) {
            size_t skip = 0;
            int sep = 0;
            if (i < len) {
                if (p[i] == '\n' || p[i] == '\r') sep = p[i], skip = 1;
                else if (p[i] == '<' && len - i >= BPE_EOT_LEN && memcmp(p + i, BPE_EOT, BPE_EOT_LEN) == 0) skip = BPE_EOT_LEN;
                else continue;
            }
            NV_TRY(pass == 0 ? count_line(b, p + start, i - start, sep) : words_line(b, p + start, i - start));
            if (skip) i += skip - 1;
            start = i + 1;
        }
    }
    return NV_OK;
}

/* ---- characters kept -------------------------------------------------------------------- */

typedef struct {
    uint64_t count, key;
    int index;
} bpe_rank;

/* Most frequent first; equal counts by the characters' bytes, shorter first on a tie. */
static int rank_cmp(const void *x, const void *y) {
    const bpe_rank *a = x, *c = y;
    if (a->count != c->count) return a->count > c->count ? -1 : 1;
    int la = (int)(a->key >> 32), lc = (int)(c->key >> 32);
    for (int i = 0; i < la && i < lc; i++) {
        int ba = (int)(a->key >> (8 * i)) & 0xff, bc = (int)(c->key >> (8 * i)) & 0xff;
        if (ba != bc) return ba - bc;
    }
    return la - lc;
}

/* Grows the piece arrays to hold id. */
static int piece_room(bpe *b, int id) {
    size_t need = (size_t)id + 1, cap = b->piece_cap;
    if (need <= cap) return 0;
    size_t c1 = cap, c2 = cap, c3 = cap;
    if (GROW(b->poff, c1, need) || GROW(b->plen, c2, need) || GROW(b->pcps, c3, need)) return -1;
    b->piece_cap = c1;
    return 0;
}

static int arena_room(bpe *b, size_t n) { return GROW(b->arena, b->arena_cap, b->narena + n); }

/* Picks the characters that get a piece, gives them ids from 259 and checks the vocab size. */
static nv_err select_chars(bpe *b) {
    bpe_rank *r = malloc((b->nchars ? b->nchars : 1) * sizeof *r);
    if (!r) return nv_fail(NV_ENOMEM, "out of memory ranking characters");
    for (size_t i = 0; i < b->nchars; i++) r[i] = (bpe_rank){b->chars[i].count, b->chars[i].key, (int)i};
    qsort(r, b->nchars, sizeof *r, rank_cmp);
    double want = b->o.char_coverage * (double)b->char_total, cum = 0;
    int id = NV_BPE_RESERVED;
    nv_err e = NV_OK;
    for (size_t i = 0; i < b->nchars && e == NV_OK; i++) {
        bpe_char *c = &b->chars[r[i].index];
        uint8_t s[4];
        int n = (int)(c->key >> 32);
        for (int j = 0; j < n; j++) s[j] = (uint8_t)(c->key >> (8 * j));
        int space = n == 1 && s[0] == ' ';
        if (!bpe_valid_cp(s, n) || (!space && cum >= want && id > NV_BPE_RESERVED)) continue;
        cum += (double)c->count;
        if (piece_room(b, id) != 0 || arena_room(b, (size_t)n) != 0) e = nv_fail(NV_ENOMEM, "out of memory");
        if (e) break;
        c->id = id;
        b->poff[id] = b->narena;
        b->plen[id] = n;
        b->pcps[id] = 1;
        memcpy(b->arena + b->narena, s, (size_t)n);
        b->narena += (size_t)n;
        if (space) b->space_id = id;
        id++;
    }
    free(r);
    if (e) return e;
    b->ntok = b->first_learned = id;
    int kept = id - NV_BPE_RESERVED;
    if (b->o.vocab_size < id)
        return nv_fail(NV_ERANGE, "vocabulary size %d is too small: 259 reserved tokens + %d characters kept from the text need at least %d",
                       b->o.vocab_size, kept, id);
    return NV_OK;
}

/* ---- pairs and the heap ----------------------------------------------------------------- */

/* Higher count first, then lower left id, then lower right id. */
static inline int heap_before(const bpe_heap_ent *x, const bpe_heap_ent *y) {
    if (x->count != y->count) return x->count > y->count;
    if (x->a != y->a) return x->a < y->a;
    return x->b < y->b;
}

static int heap_push(bpe *b, bpe_heap_ent e) {
    if (GROW(b->heap, b->heap_cap, b->nheap + 1) != 0) return -1;
    size_t i = b->nheap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_before(&e, &b->heap[p])) break;
        b->heap[i] = b->heap[p];
        i = p;
    }
    b->heap[i] = e;
    return 0;
}

static bpe_heap_ent heap_pop(bpe *b) {
    bpe_heap_ent top = b->heap[0], x = b->heap[--b->nheap];
    size_t i = 0, n = b->nheap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_before(&b->heap[c + 1], &b->heap[c])) c++;
        if (!heap_before(&b->heap[c], &x)) break;
        b->heap[i] = b->heap[c];
        i = c;
    }
    if (n) b->heap[i] = x;
    return top;
}

/* Adds delta to the count of pair (a, c); when w >= 0 records that word w holds it. */
static int pair_add(bpe *b, int a, int c, int64_t delta, int w, int stamp) {
    int pi = pair_find(b, a, c);
    if (pi < 0) {
        if (GROW(b->pairs, b->pairs_cap, b->npairs + 1) != 0) return -1;
        pi = (int)b->npairs++;
        b->pairs[pi] = (bpe_pair){.a = a, .b = c, .stamp = -1};
        if (bpe_index_add(b, &b->pair_ix, pair_hash(a, c), pi, hash_pair) != 0) return -1;
    }
    bpe_pair *p = &b->pairs[pi];
    if (p->stamp != stamp) {
        if (GROW(b->touched, b->touched_cap, b->ntouched + 1) != 0) return -1;
        b->touched[b->ntouched++] = pi;
        p->stamp = stamp;
        p->old = p->count;
    }
    p->count += delta;
    if (w >= 0 && (p->nl == 0 || p->list[p->nl - 1] != w)) {
        if (p->nl == p->cl) {
            int nc = p->cl ? 2 * p->cl : 4;
            int *nlist = realloc(p->list, (size_t)nc * sizeof *nlist);
            if (!nlist) return -1;
            p->list = nlist;
            p->cl = nc;
        }
        p->list[p->nl++] = w;
    }
    return 0;
}

/* Offers every pair whose count changed to the heap (stale entries are skipped when popped). */
static int flush_touched(bpe *b) {
    for (size_t i = 0; i < b->ntouched; i++) {
        bpe_pair *p = &b->pairs[b->touched[i]];
        if (p->count != p->old && p->count >= b->o.min_pair_count && !p->banned)
            if (heap_push(b, (bpe_heap_ent){p->count, p->a, p->b}) != 0) return -1;
    }
    b->ntouched = 0;
    return 0;
}

/* Replaces (a, c) by id m in every word that holds it, updating the pair counts. */
static int apply_merge(bpe *b, int pi, int m, int stamp) {
    int a = b->pairs[pi].a, c = b->pairs[pi].b;
    int *list = b->pairs[pi].list, nl = b->pairs[pi].nl;
    b->pairs[pi].list = NULL;
    b->pairs[pi].nl = b->pairs[pi].cl = 0;
    int rc = 0;
    for (int li = 0; li < nl && rc == 0; li++) {
        int w = list[li];
        if (b->wstamp[w] == stamp) continue;
        b->wstamp[w] = stamp;
        int *s = b->sym + b->woff[w], n = b->wlen[w], found = 0;
        for (int i = 0; i + 1 < n && !found; i++) found = s[i] == a && s[i + 1] == c;
        if (!found) continue;
        int64_t cnt = (int64_t)b->wcnt[w];
        for (int i = 0; i + 1 < n && rc == 0; i++) rc = pair_add(b, s[i], s[i + 1], -cnt, -1, stamp);
        int j = 0;
        for (int i = 0; i < n;) {
            if (i + 1 < n && s[i] == a && s[i + 1] == c) {
                s[j++] = m;
                i += 2;
            } else {
                s[j++] = s[i++];
            }
        }
        b->wlen[w] = j;
        for (int i = 0; i + 1 < j && rc == 0; i++)
            rc = pair_add(b, s[i], s[i + 1], cnt, s[i] == m || s[i + 1] == m ? w : -1, stamp);
    }
    free(list);
    return rc;
}

static nv_err learn(bpe *b) {
    b->wstamp = calloc(b->nw ? b->nw : 1, sizeof *b->wstamp);
    if (!b->wstamp || bpe_index_init(&b->pair_ix, 4 * b->nw) != 0 || bpe_index_init(&b->piece_ix, 1024) != 0)
        return nv_fail(NV_ENOMEM, "out of memory counting pairs");
    for (size_t w = 0; w < b->nw; w++) {
        const int *s = b->sym + b->woff[w];
        for (int i = 0; i + 1 < b->wlen[w]; i++)
            if (pair_add(b, s[i], s[i + 1], (int64_t)b->wcnt[w], (int)w, 0) != 0)
                return nv_fail(NV_ENOMEM, "out of memory counting pairs");
    }
    if (flush_touched(b) != 0) return nv_fail(NV_ENOMEM, "out of memory counting pairs");
    int stamp = 0;
    while (b->ntok < b->o.vocab_size && b->nheap) {
        bpe_heap_ent e = heap_pop(b);
        int pi = pair_find(b, e.a, e.b);
        if (pi < 0 || b->pairs[pi].banned || b->pairs[pi].count != e.count) continue; /* stale */
        if (e.count < b->o.min_pair_count) break;
        int la = b->plen[e.a], lb = b->plen[e.b];
        if (b->pcps[e.a] + b->pcps[e.b] > b->o.max_piece_chars) {
            b->pairs[pi].banned = 1;
            continue;
        }
        if (arena_room(b, (size_t)(la + lb)) != 0 || piece_room(b, b->ntok) != 0) return nv_fail(NV_ENOMEM, "out of memory");
        uint8_t *cat = b->arena + b->narena;
        memcpy(cat, b->arena + b->poff[e.a], (size_t)la);
        memcpy(cat + la, b->arena + b->poff[e.b], (size_t)lb);
        if (bpe_forbidden(cat, la + lb)) {
            b->pairs[pi].banned = 1;
            continue;
        }
        int m = piece_find(b, cat, la + lb);
        if (m < 0) {
            m = b->ntok++;
            b->poff[m] = b->narena;
            b->plen[m] = la + lb;
            b->pcps[m] = b->pcps[e.a] + b->pcps[e.b];
            b->narena += (size_t)(la + lb);
            if (bpe_index_add(b, &b->piece_ix, bpe_hash_bytes(cat, (size_t)(la + lb)), m, hash_piece) != 0)
                return nv_fail(NV_ENOMEM, "out of memory");
        }
        stamp++;
        if (apply_merge(b, pi, m, stamp) != 0 || flush_touched(b) != 0) return nv_fail(NV_ENOMEM, "out of memory merging pairs");
    }
    return NV_OK;
}

/* ---- output ----------------------------------------------------------------------------- */

static void put_entry(uint8_t **at, float score, const void *s, int n) {
    int32_t len = n;
    memcpy(*at, &score, 4);
    memcpy(*at + 4, &len, 4);
    memcpy(*at + 8, s, (size_t)n);
    *at += 8 + (size_t)n;
}

static nv_err serialize(const bpe *b, nv_bpe_result *out) {
    static const char *const special[3] = {"<unk>", "\n<s>\n", "\n</s>\n"};
    size_t total = 4;
    int32_t max_len = 6; /* "<0xFF>", "\n</s>\n" */
    for (int i = 0; i < 3; i++) total += 8 + strlen(special[i]);
    total += 256 * (8 + 6);
    for (int id = NV_BPE_RESERVED; id < b->ntok; id++) {
        total += 8 + (size_t)b->plen[id];
        if (b->plen[id] > max_len) max_len = b->plen[id];
    }
    uint8_t *buf = malloc(total), *at = buf;
    if (!buf) return nv_fail(NV_ENOMEM, "out of memory writing the vocabulary");
    memcpy(at, &max_len, 4);
    at += 4;
    for (int i = 0; i < 3; i++) put_entry(&at, 0.0f, special[i], (int)strlen(special[i]));
    for (int v = 0; v < 256; v++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", v);
        put_entry(&at, 0.0f, s, 6);
    }
    int learned = b->ntok - b->first_learned;
    for (int id = NV_BPE_RESERVED; id < b->ntok; id++) {
        float score = id < b->first_learned ? -(float)(learned + (id - NV_BPE_RESERVED)) : -(float)(id - b->first_learned);
        put_entry(&at, score, b->arena + b->poff[id], b->plen[id]);
    }
    out->data = buf;
    out->len = total;
    out->n_tokens = b->ntok;
    out->n_chars = b->first_learned - NV_BPE_RESERVED;
    out->n_learned = learned;
    out->n_dropped = (int)b->nchars - out->n_chars;
    out->n_words = b->nw;
    return NV_OK;
}

static void bpe_free(bpe *b) {
    free(b->chars);
    free(b->char_ix.slot);
    free(b->sym);
    free(b->woff);
    free(b->wlen);
    free(b->wcnt);
    free(b->whash);
    free(b->wstamp);
    free(b->word_ix.slot);
    free(b->arena);
    free(b->poff);
    free(b->plen);
    free(b->pcps);
    free(b->piece_ix.slot);
    for (size_t i = 0; i < b->npairs; i++) free(b->pairs[i].list);
    free(b->pairs);
    free(b->pair_ix.slot);
    free(b->touched);
    free(b->heap);
}

static nv_err train(bpe *b, const nv_iov *texts, int n_texts, nv_bpe_result *out) {
    if (bpe_index_init(&b->char_ix, 256) != 0 || bpe_index_init(&b->word_ix, 1 << 14) != 0)
        return nv_fail(NV_ENOMEM, "out of memory");
    NV_TRY(scan(b, texts, n_texts, 0));
    if (!b->line_bytes) return nv_fail(NV_EINVAL, "no text to train on: the input is empty (or only line breaks)");
    NV_TRY(select_chars(b));
    NV_TRY(scan(b, texts, n_texts, 1));
    free(b->word_ix.slot);
    b->word_ix.slot = NULL;
    free(b->whash);
    b->whash = NULL;
    NV_TRY(learn(b));
    return serialize(b, out);
}

nv_err nv_bpe_train(const nv_iov *texts, int n_texts, const nv_bpe_opts *opts, nv_bpe_result *out) {
    memset(out, 0, sizeof *out);
    if (n_texts < 0 || (n_texts > 0 && !texts)) return nv_fail(NV_EINVAL, "bad text list");
    bpe b;
    memset(&b, 0, sizeof b);
    b.o = *opts;
    if (b.o.char_coverage == 0) b.o.char_coverage = 0.9995;
    if (b.o.max_piece_chars == 0) b.o.max_piece_chars = 16;
    if (b.o.min_pair_count == 0) b.o.min_pair_count = 2;
    if (b.o.vocab_size < NV_BPE_RESERVED || b.o.vocab_size > NV_BPE_MAX_VOCAB)
        return nv_fail(NV_ERANGE, "vocabulary size %d is outside [%d, %d]", b.o.vocab_size, NV_BPE_RESERVED, NV_BPE_MAX_VOCAB);
    if (!(b.o.char_coverage > 0 && b.o.char_coverage <= 1)) return nv_fail(NV_EINVAL, "character coverage must be in (0, 1]");
    if (b.o.max_piece_chars < 2 || b.o.min_pair_count < 1) return nv_fail(NV_EINVAL, "bad piece length or pair count limit");
    for (int i = 0; i < 128; i++) b.ascii_ix[i] = -1;
    b.space_id = -1;
    for (int i = 0; i < n_texts; i++) out->n_bytes += texts[i].len;
    uint64_t n_bytes = out->n_bytes;
    nv_err e = train(&b, texts, n_texts, out);
    bpe_free(&b);
    if (e != NV_OK) {
        nv_bpe_result_free(out);
        return e;
    }
    out->n_bytes = n_bytes;
    return NV_OK;
}

void nv_bpe_result_free(nv_bpe_result *r) {
    free(r->data);
    memset(r, 0, sizeof *r);
}
