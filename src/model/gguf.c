#include "model/gguf.h"

#include <ctype.h>
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/pool.h"
#include "model/imatrix.h"

enum { GG_U8, GG_I8, GG_U16, GG_I16, GG_U32, GG_I32, GG_F32, GG_BOOL, GG_STR, GG_ARR, GG_U64, GG_I64, GG_F64 };
enum { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8, T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12,
       T_Q5_K = 13, T_Q6_K = 14, T_IQ4_NL = 20, T_IQ4_XS = 23, T_BF16 = 30, T_MXFP4 = 39 };
#define SUPPORTED_TYPES "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4"
#define QK 32   /* values per block of the simple types */
#define QK_K 256 /* values per super-block of the k-quants */
#define MAX_ALIGN (1u << 20)
#define MAX_TENSORS (1u << 20) /* a 1,000-layer model has ~9,000 */

int nv_gguf_is(const void *data, size_t len) { return len >= 4 && memcmp(data, "GGUF", 4) == 0; }

const char *nv_gguf_shown(const char *s, size_t n, char *out, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < n && i < 100 && k + 1 < cap; i++) out[k++] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
    out[k] = '\0';
    return out;
}

/* ---- the parser ---------------------------------------------------------------------------- */

typedef struct {
    nv_reader r;
    int wide; /* version >= 2: counts, lengths and dimensions are 64-bit */
} gg_cursor;

static nv_err rd_count(gg_cursor *c, uint64_t *v, const char *field) {
    if (c->wide) return nv_read_u64(&c->r, v, field);
    uint32_t u;
    NV_TRY(nv_read_u32(&c->r, &u, field));
    *v = u;
    return NV_OK;
}

static nv_err rd_string(gg_cursor *c, const char **s, size_t *len, const char *field) {
    uint64_t n;
    NV_TRY(rd_count(c, &n, field));
    if (n > nv_reader_left(&c->r))
        return nv_fail(NV_EFORMAT, "%s: %s of %llu bytes runs past the end of the file", c->r.what, field,
                       (unsigned long long)n);
    const void *p;
    NV_TRY(nv_read_view(&c->r, &p, (size_t)n, field));
    *s = p;
    *len = (size_t)n;
    return NV_OK;
}

static size_t scalar_size(uint32_t type) {
    switch (type) {
    case GG_U8: case GG_I8: case GG_BOOL: return 1;
    case GG_U16: case GG_I16: return 2;
    case GG_U32: case GG_I32: case GG_F32: return 4;
    case GG_U64: case GG_I64: case GG_F64: return 8;
    default: return 0;
    }
}

/* Skips one value of type (not an array) and checks it is inside the file. */
static nv_err skip_value(gg_cursor *c, uint32_t type, const char *key) {
    if (type == GG_STR) {
        const char *s;
        size_t n;
        return rd_string(c, &s, &n, key);
    }
    size_t sz = scalar_size(type);
    if (!sz) return nv_fail(NV_EFORMAT, "%s: metadata '%s' has unknown type %u", c->r.what, key, type);
    const void *p;
    return nv_read_view(&c->r, &p, sz, key);
}

static nv_err parse_kv(gg_cursor *c, nv_gguf_kv *kv) {
    NV_TRY(rd_string(c, &kv->key, &kv->key_len, "metadata key"));
    char key[128];
    nv_gguf_shown(kv->key, kv->key_len, key, sizeof key);
    NV_TRY(nv_read_u32(&c->r, &kv->type, key));
    if (kv->type != GG_ARR) {
        kv->val = c->r.p + c->r.pos;
        return skip_value(c, kv->type, key);
    }
    NV_TRY(nv_read_u32(&c->r, &kv->elem, key));
    NV_TRY(rd_count(c, &kv->count, key));
    if (kv->elem == GG_ARR) return nv_fail(NV_EFORMAT, "%s: metadata '%s' nests arrays", c->r.what, key);
    size_t sz = scalar_size(kv->elem);
    if (kv->elem != GG_STR && !sz) return nv_fail(NV_EFORMAT, "%s: metadata '%s' has unknown element type %u", c->r.what, key, kv->elem);
    /* each element takes at least one byte (a string at least its length field) */
    if (kv->count > nv_reader_left(&c->r))
        return nv_fail(NV_EFORMAT, "%s: metadata '%s' claims %llu elements, more than the file holds", c->r.what, key,
                       (unsigned long long)kv->count);
    kv->val = c->r.p + c->r.pos;
    if (kv->elem != GG_STR) {
        const void *p;
        return nv_read_view(&c->r, &p, (size_t)kv->count * sz, key);
    }
    for (uint64_t i = 0; i < kv->count; i++) NV_TRY(skip_value(c, GG_STR, key));
    return NV_OK;
}

/* Values per block and bytes per block of a type this loader converts; 0 for any other. */
static int block_of(uint32_t type, uint64_t *bytes) {
    static const struct {
        uint32_t type;
        int values, bytes;
    } k[] = {{T_F32, 1, 4},      {T_F16, 1, 2},      {T_BF16, 1, 2},      {T_Q4_0, QK, 18},     {T_Q4_1, QK, 20},
             {T_Q5_0, QK, 22},   {T_Q5_1, QK, 24},   {T_Q8_0, QK, 34},    {T_Q4_K, QK_K, 144}, {T_Q5_K, QK_K, 176},
             {T_Q6_K, QK_K, 210}, {T_Q2_K, QK_K, 84}, {T_Q3_K, QK_K, 110}, {T_IQ4_NL, QK, 18}, {T_IQ4_XS, QK_K, 136},
             {T_MXFP4, QK, 17}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (k[i].type == type) {
            *bytes = (uint64_t)k[i].bytes;
            return k[i].values;
        }
    return 0;
}

/* Bytes of a tensor of n values of type, or 0 (a type not converted, or rows that do not fill
 * their blocks). */
static uint64_t tensor_bytes(uint32_t type, uint64_t n, uint64_t row) {
    uint64_t bb = 0;
    int per = block_of(type, &bb);
    return per && row % (uint64_t)per == 0 ? n / (uint64_t)per * bb : 0;
}

const char *nv_gguf_type_name(uint32_t type) {
    static const char *names[] = {"F32",     "F16",    "Q4_0",  "Q4_1",   "?",     "?",     "Q5_0",  "Q5_1",   "Q8_0",  "Q8_1",
                                  "Q2_K",    "Q3_K",   "Q4_K",  "Q5_K",   "Q6_K",  "Q8_K",  "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",
                                  "IQ4_NL",  "IQ3_S",  "IQ2_S", "IQ4_XS", "I8",    "I16",   "I32",   "I64",    "F64",   "IQ1_M",
                                  "BF16",    "?",      "?",     "?",      "TQ1_0", "TQ2_0", "?",     "?",      "?",     "MXFP4"};
    return type < sizeof names / sizeof names[0] ? names[type] : "?";
}

static nv_err parse_tensor(gg_cursor *c, nv_gguf_tensor *t, uint64_t *offset) {
    NV_TRY(rd_string(c, &t->name, &t->name_len, "tensor name"));
    char name[128];
    nv_gguf_shown(t->name, t->name_len, name, sizeof name);
    NV_TRY(nv_read_u32(&c->r, &t->n_dims, name));
    if (t->n_dims < 1 || t->n_dims > 4)
        return nv_fail(NV_EFORMAT, "%s: tensor '%s' has %u dimensions (1 to 4 supported)", c->r.what, name, t->n_dims);
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        NV_TRY(rd_count(c, &t->dims[d], name));
        if (t->dims[d] == 0 || t->dims[d] > (1ull << 32) || n > (1ull << 40) / t->dims[d])
            return nv_fail(NV_EFORMAT, "%s: tensor '%s' has an absurd shape", c->r.what, name);
        n *= t->dims[d];
    }
    for (uint32_t d = t->n_dims; d < 4; d++) t->dims[d] = 1;
    NV_TRY(nv_read_u32(&c->r, &t->type, name));
    NV_TRY(nv_read_u64(&c->r, offset, name));
    t->bytes = tensor_bytes(t->type, n, t->dims[0]);
    return NV_OK;
}

static int by_data(const void *a, const void *b) {
    const nv_gguf_tensor *x = *(const nv_gguf_tensor *const *)a, *y = *(const nv_gguf_tensor *const *)b;
    return x->data < y->data ? -1 : x->data > y->data;
}

static int by_name(const void *a, const void *b) {
    const nv_gguf_tensor *x = *(const nv_gguf_tensor *const *)a, *y = *(const nv_gguf_tensor *const *)b;
    int c = memcmp(x->name, y->name, x->name_len < y->name_len ? x->name_len : y->name_len);
    return c ? c : (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

/* Tensors own their bytes and their names: no two share data (else a small file could expand
 * into any amount of fp32) and no name repeats. */
static nv_err check_disjoint(const nv_gguf *g) {
    if (g->n_tensors < 2) return NV_OK;
    const nv_gguf_tensor **v = malloc((size_t)g->n_tensors * sizeof *v);
    if (!v) return nv_fail(NV_ENOMEM, "%s: out of memory for the GGUF directory", g->path);
    for (uint64_t i = 0; i < g->n_tensors; i++) v[i] = &g->t[i];
    nv_err e = NV_OK;
    qsort(v, (size_t)g->n_tensors, sizeof *v, by_data);
    for (uint64_t i = 1; i < g->n_tensors && e == NV_OK; i++)
        if (v[i - 1]->data + v[i - 1]->bytes > v[i]->data) {
            char a[128], b[128];
            e = nv_fail(NV_EFORMAT, "%s: tensors '%s' and '%s' overlap", g->path, nv_gguf_shown(v[i - 1]->name, v[i - 1]->name_len, a, sizeof a),
                        nv_gguf_shown(v[i]->name, v[i]->name_len, b, sizeof b));
        }
    qsort(v, (size_t)g->n_tensors, sizeof *v, by_name);
    for (uint64_t i = 1; i < g->n_tensors && e == NV_OK; i++)
        if (by_name(&v[i - 1], &v[i]) == 0) {
            char a[128];
            e = nv_fail(NV_EFORMAT, "%s: tensor '%s' appears twice", g->path, nv_gguf_shown(v[i]->name, v[i]->name_len, a, sizeof a));
        }
    free(v);
    return e;
}

void nv_gguf_close(nv_gguf *g) {
    free(g->kv);
    free(g->t);
    nv_file_unmap(&g->map);
    for (uint32_t i = 0; i < g->n_shards; i++) nv_file_unmap(&g->shards[i]);
    free(g->shards);
    memset(g, 0, sizeof *g);
}

/* One file: its header, metadata and tensor directory (the tensors' names not yet checked against
 * each other: a split model's are checked across its files). */
static nv_err open_one(const char *path, nv_gguf *g) {
    memset(g, 0, sizeof *g);
    NV_TRY(nv_file_map(path, &g->map));
    g->path = path;
    gg_cursor c = {nv_reader_make(g->map.data, g->map.len, path), 0};
    nv_err e;
    uint64_t *offsets = NULL;
    if (!nv_gguf_is(g->map.data, g->map.len)) {
        e = nv_fail(NV_EFORMAT, "%s: not a GGUF file", path);
        goto fail;
    }
    c.r.pos = 4;
    if ((e = nv_read_u32(&c.r, &g->version, "version")) != NV_OK) goto fail;
    if (g->version < 1 || g->version > 3) {
        e = nv_fail(NV_EUNSUPPORTED, "%s: GGUF version %u (1 to 3 supported)", path, g->version);
        goto fail;
    }
    c.wide = g->version >= 2;
    if ((e = rd_count(&c, &g->n_tensors, "tensor count")) != NV_OK || (e = rd_count(&c, &g->n_kv, "metadata count")) != NV_OK)
        goto fail;
    if (g->n_tensors > MAX_TENSORS || g->n_tensors > g->map.len / 8 || g->n_kv > g->map.len / 8) {
        e = nv_fail(NV_EFORMAT, "%s: %llu tensors and %llu metadata entries cannot fit a file of %zu bytes", path,
                    (unsigned long long)g->n_tensors, (unsigned long long)g->n_kv, g->map.len);
        goto fail;
    }
    g->kv = calloc((size_t)g->n_kv + 1, sizeof *g->kv);
    g->t = calloc((size_t)g->n_tensors + 1, sizeof *g->t);
    offsets = calloc((size_t)g->n_tensors + 1, sizeof *offsets);
    if (!g->kv || !g->t || !offsets) {
        e = nv_fail(NV_ENOMEM, "%s: out of memory for the GGUF directory", path);
        goto fail;
    }
    for (uint64_t i = 0; i < g->n_kv; i++)
        if ((e = parse_kv(&c, &g->kv[i])) != NV_OK) goto fail;
    uint64_t align = 32;
    const nv_gguf_kv *a = nv_gguf_find(g, "general.alignment");
    if (a) {
        uint32_t v = 0;
        if (a->type == GG_U32) memcpy(&v, a->val, 4);
        if (v == 0 || v > MAX_ALIGN || (v & (v - 1))) {
            e = nv_fail(NV_EFORMAT, "%s: general.alignment must be a power of two up to %u", path, MAX_ALIGN);
            goto fail;
        }
        align = v;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if ((e = parse_tensor(&c, &g->t[i], &offsets[i])) != NV_OK) goto fail;
    uint64_t base = (c.r.pos + align - 1) / align * align;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        nv_gguf_tensor *t = &g->t[i];
        if (offsets[i] % align || base + offsets[i] < base || offsets[i] > g->map.len || t->bytes > g->map.len ||
            base + offsets[i] + t->bytes > g->map.len) {
            char name[128];
            e = nv_fail(NV_EFORMAT, "%s: tensor '%s' lies outside the file or off its alignment", path,
                        nv_gguf_shown(t->name, t->name_len, name, sizeof name));
            goto fail;
        }
        t->data = g->map.data + base + offsets[i];
    }
    free(offsets);
    return NV_OK;
fail:
    free(offsets);
    nv_gguf_close(g);
    return e;
}

static nv_err get_int(const nv_gguf *g, const char *key, int64_t dflt, int64_t *out);

/* llama.cpp's split files (llama-gguf-split's): PREFIX-00001-of-0000N.gguf holds the metadata and
 * split.count N, each file split.no (from 0), the first also split.tensors.count. */
int nv_gguf_split_no(const char *path, int *count) {
    const size_t n = strlen(path);
    if (n < 20) return 0;
    const char *t = path + n - 20; /* "-00001-of-00003.gguf" */
    if (t[0] != '-' || memcmp(t + 6, "-of-", 4) || strcmp(t + 15, ".gguf")) return 0;
    int no = 0, cnt = 0;
    for (int i = 0; i < 5; i++) {
        if (!isdigit((unsigned char)t[1 + i]) || !isdigit((unsigned char)t[10 + i])) return 0;
        no = no * 10 + (t[1 + i] - '0'), cnt = cnt * 10 + (t[10 + i] - '0');
    }
    if (no < 1 || no > cnt) return 0;
    *count = cnt;
    return no;
}

/* path's length without its split suffix (PREFIX-0000K-of-0000N.gguf) or, not split, its ".gguf". */
static size_t split_prefix(const char *path) {
    const size_t n = strlen(path);
    int cnt;
    return nv_gguf_split_no(path, &cnt) ? n - 20 : n >= 5 && !strcmp(path + n - 5, ".gguf") ? n - 5 : n;
}

nv_err nv_gguf_split_name(const char *path, int no, int n, char *out, size_t cap) {
    const size_t pl = split_prefix(path);
    const int w = snprintf(out, cap, "%.*s-%05d-of-%05d.gguf", (int)pl, path, no + 1, n);
    return w > 0 && (size_t)w < cap ? NV_OK : nv_fail(NV_ERANGE, "%s: the split file's name is too long", path);
}

/* The other files of a split model opened, their tensors joined to g's (their metadata, llama.cpp's
 * too, is the first file's alone). */
static nv_err open_splits(nv_gguf *g) {
    int64_t n = 0, no = 0, total = 0;
    if (!nv_gguf_find(g, "split.count")) return NV_OK;
    NV_TRY(get_int(g, "split.count", 0, &n));
    NV_TRY(get_int(g, "split.no", 0, &no));
    if (n < 1 || n > 65535 || no < 0 || no >= n)
        return nv_fail(NV_EFORMAT, "%s: split.no %lld of split.count %lld", g->path, (long long)no, (long long)n);
    if (n == 1) return NV_OK;
    int named_n = 0;
    const int named = nv_gguf_split_no(g->path, &named_n) == no + 1 && named_n == n;
    const size_t cap = strlen(g->path) + 32;
    char *name = malloc(cap);
    if (!name) return nv_fail(NV_ENOMEM, "out of memory");
    nv_err e = NV_OK;
    if (no != 0 && named && nv_gguf_split_name(g->path, 0, (int)n, name, cap) == NV_OK)
        e = nv_fail(NV_EINVAL, "%s is split %lld of %lld: load the first, %s", g->path, (long long)no + 1, (long long)n, name);
    else if (no != 0)
        e = nv_fail(NV_EINVAL, "%s is split %lld of %lld of a model: load the first split", g->path, (long long)no + 1, (long long)n);
    else if (!named)
        e = nv_fail(NV_EFORMAT, "%s: the first of %lld split files, but not named PREFIX-00001-of-%05d.gguf, so the others cannot be found",
                    g->path, (long long)n, (int)n);
    else if (!nv_gguf_find(g, "split.tensors.count"))
        e = nv_fail(NV_EFORMAT, "%s: the first of %lld split files without split.tensors.count", g->path, (long long)n);
    else if ((e = get_int(g, "split.tensors.count", -1, &total)) == NV_OK && !(g->shards = calloc((size_t)n - 1, sizeof *g->shards)))
        e = nv_fail(NV_ENOMEM, "out of memory");
    for (int64_t i = 1; i < n && e == NV_OK; i++) {
        nv_gguf_split_name(g->path, (int)i, (int)n, name, cap); /* (fits: the same length as the first's) */
        nv_gguf s;
        if ((e = open_one(name, &s)) != NV_OK) {
            e = nv_fail(e, "%s: split %lld of %lld: %s", g->path, (long long)i + 1, (long long)n, nv_errmsg());
            break;
        }
        int64_t sno = -1, sn = -1;
        if ((e = get_int(&s, "split.no", -1, &sno)) != NV_OK || (e = get_int(&s, "split.count", -1, &sn)) != NV_OK)
            e = nv_fail(NV_EFORMAT, "%s: %s", g->path, nv_errmsg());
        else if (sno != i || sn != n)
            e = nv_fail(NV_EFORMAT, "%s: says it is split %lld of %lld, where %s's split %lld of %lld belongs", name, (long long)sno + 1,
                        (long long)sn, g->path, (long long)i + 1, (long long)n);
        else if (g->n_tensors + s.n_tensors > MAX_TENSORS)
            e = nv_fail(NV_EFORMAT, "%s: more than %u tensors", g->path, MAX_TENSORS);
        nv_gguf_tensor *t = e == NV_OK ? realloc(g->t, (size_t)(g->n_tensors + s.n_tensors + 1) * sizeof *t) : NULL;
        if (e == NV_OK && !t) e = nv_fail(NV_ENOMEM, "out of memory for the GGUF directory");
        if (e == NV_OK) { /* its tensors point into its mapping, which g keeps */
            g->t = t;
            memcpy(g->t + g->n_tensors, s.t, (size_t)s.n_tensors * sizeof *t);
            g->n_tensors += s.n_tensors;
            g->shards[g->n_shards++] = s.map;
            s.map = (nv_mapped){0};
        }
        nv_gguf_close(&s);
    }
    free(name);
    if (e == NV_OK && (uint64_t)total != g->n_tensors)
        e = nv_fail(NV_EFORMAT, "%s: split.tensors.count says %lld tensors, its %lld files hold %llu", g->path, (long long)total, (long long)n,
                    (unsigned long long)g->n_tensors);
    return e;
}

nv_err nv_gguf_open(const char *path, nv_gguf *g) {
    NV_TRY(open_one(path, g));
    nv_err e = open_splits(g);
    if (e == NV_OK) e = check_disjoint(g);
    if (e != NV_OK) nv_gguf_close(g);
    return e;
}

uint64_t nv_gguf_file_bytes(const nv_gguf *g) {
    uint64_t n = g->map.len;
    for (uint32_t i = 0; i < g->n_shards; i++) n += g->shards[i].len;
    return n;
}

static int name_is(const char *s, size_t n, const char *want) { return strlen(want) == n && memcmp(s, want, n) == 0; }

const nv_gguf_kv *nv_gguf_find(const nv_gguf *g, const char *key) {
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (name_is(g->kv[i].key, g->kv[i].key_len, key)) return &g->kv[i];
    return NULL;
}

const nv_gguf_tensor *nv_gguf_tensor_find(const nv_gguf *g, const char *name) {
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (name_is(g->t[i].name, g->t[i].name_len, name)) return &g->t[i];
    return NULL;
}

/* An integer value (any integer type) of key into *out; absent: dflt, or an error when dflt < 0. */
static nv_err get_int(const nv_gguf *g, const char *key, int64_t dflt, int64_t *out) {
    const nv_gguf_kv *kv = nv_gguf_find(g, key);
    if (!kv) {
        if (dflt < 0) return nv_fail(NV_EFORMAT, "%s: metadata '%s' is missing", g->path, key);
        *out = dflt;
        return NV_OK;
    }
    int64_t v;
    switch (kv->type) {
    case GG_U8: v = *kv->val; break;
    case GG_I8: v = (int8_t)*kv->val; break;
    case GG_U16: { uint16_t x; memcpy(&x, kv->val, 2); v = x; break; }
    case GG_I16: { int16_t x; memcpy(&x, kv->val, 2); v = x; break; }
    case GG_U32: { uint32_t x; memcpy(&x, kv->val, 4); v = x; break; }
    case GG_I32: { int32_t x; memcpy(&x, kv->val, 4); v = x; break; }
    case GG_U64: { uint64_t x; memcpy(&x, kv->val, 8); v = x > INT64_MAX ? INT64_MAX : (int64_t)x; break; }
    case GG_I64: memcpy(&v, kv->val, 8); break;
    default: return nv_fail(NV_EFORMAT, "%s: metadata '%s' is not an integer", g->path, key);
    }
    *out = v;
    return NV_OK;
}

static nv_err get_float(const nv_gguf *g, const char *key, float dflt, float *out) {
    const nv_gguf_kv *kv = nv_gguf_find(g, key);
    if (!kv) {
        *out = dflt;
        return NV_OK;
    }
    if (kv->type == GG_F32) memcpy(out, kv->val, 4);
    else if (kv->type == GG_F64) {
        double d;
        memcpy(&d, kv->val, 8);
        *out = (float)d;
    } else
        return nv_fail(NV_EFORMAT, "%s: metadata '%s' is not a number", g->path, key);
    return NV_OK;
}

const char *nv_gguf_string(const nv_gguf *g, const char *key, size_t *len) {
    const nv_gguf_kv *kv = nv_gguf_find(g, key);
    if (!kv || kv->type != GG_STR) return NULL;
    gg_cursor c = {nv_reader_make(kv->val, (size_t)(g->map.data + g->map.len - kv->val), g->path), g->version >= 2};
    const char *s = NULL;
    if (rd_string(&c, &s, len, key) != NV_OK) return NULL; /* cannot happen: checked at open */
    return s;
}

/* ---- the model ----------------------------------------------------------------------------- */

static float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

static float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_to_f32(h);
}

/* Its inverse for the writer: f rounded to the nearest fp16 (beyond +-65504: infinite). */
static void put_half(uint8_t *p, float f) {
    const uint16_t h = (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
    memcpy(p, &h, 2);
}
/* f as put_half stores it. */
static float as_half(float f) { return f16_to_f32((uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)); }

/* The 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block's 12 packed bytes. */
static void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* The block-quantized form of a quantized type (engine.h nv_qweights): values q as int8, and per
 * qb values a scale s and, for the types with a minimum, an offset o, with y = (float)q * s, then
 * + o. Every type here decomposes into it exactly, with the floats llama.cpp's reference
 * dequantizers compute; 0 for a type that is not quantized. */
static int quant_form(uint32_t type, int *qb, int *offset) {
    *qb = type == T_Q6_K || type == T_Q2_K || type == T_Q3_K ? 16 : 32;
    *offset = type == T_Q4_0 || type == T_Q4_1 || type == T_Q5_0 || type == T_Q5_1 || type == T_Q4_K || type == T_Q5_K ||
              type == T_Q2_K || type == T_Q3_K;
    return type == T_Q8_0 || type == T_Q6_K || type == T_IQ4_NL || type == T_IQ4_XS || type == T_MXFP4 || *offset;
}

/* IQ4_NL's and IQ4_XS's 16 values, spaced to fit the weights' distribution rather than evenly */
static const int8_t iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
/* MXFP4's: FP4 (E2M1) values doubled, ggml's kvalues_mxfp4 (the scale is halved to match) */
static const int8_t mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
/* The table a type's decomposed values index (nv_qmatrix.lut), or NULL when they are values. */
static const int8_t *quant_lut(uint32_t type) {
    return type == T_IQ4_NL || type == T_IQ4_XS ? iq4_values : type == T_MXFP4 ? mxfp4_values : NULL;
}

/* The k-quants' super-blocks: the sub-blocks (of quant_form's qb) of one of block_of's blocks, whose
 * scales are each an integer times one float of the block (and offsets, with *mins, another
 * integer times another float); 0 for the other types. */
static int quant_super(uint32_t type, int *mins) {
    *mins = type == T_Q4_K || type == T_Q5_K || type == T_Q2_K;
    return type == T_Q4_K || type == T_Q5_K || type == T_IQ4_XS ? 8 : type == T_Q2_K || type == T_Q3_K || type == T_Q6_K ? 16 : 0;
}

/* A super-block's integer form (nv_qmatrix.sub_s ...): its sub-blocks' integer scales sc and
 * offsets mn, its float scale *d and offset factor *dm, with s[j] == *d * sc[j] and o[j] == *dm *
 * mn[j] exactly; fields NULL where not wanted. */
typedef struct {
    int8_t *sc, *mn;
    float *d, *dm;
} super_out;

/* One block of a quantized type (block_of's values) into q, and its sub-blocks' s and, for the
 * types with an offset (quant_form), o; with sup (the types quant_super names), its integer form too. */
static void decompose_block(uint32_t type, const uint8_t *b, int8_t *q, float *s, float *o, const super_out *sup) {
    switch (type) {
    case T_Q4_0:
    case T_Q4_1: { /* d [, m], 16 bytes: value j in the low nibble of byte j, j + 16 in its high one */
        s[0] = half_at(b);
        o[0] = type == T_Q4_1 ? half_at(b + 2) : -8.0f * s[0];
        const uint8_t *qs = b + (type == T_Q4_1 ? 4 : 2);
        for (int j = 0; j < QK / 2; j++) {
            q[j] = (int8_t)(qs[j] & 0xF);
            q[j + QK / 2] = (int8_t)(qs[j] >> 4);
        }
        break;
    }
    case T_Q5_0:
    case T_Q5_1: { /* as Q4 with a fifth bit per value from a 32-bit mask (bit j for value j) */
        const int one = type == T_Q5_1;
        s[0] = half_at(b);
        o[0] = one ? half_at(b + 2) : -16.0f * s[0];
        uint32_t qh;
        memcpy(&qh, b + (one ? 4 : 2), 4);
        const uint8_t *qs = b + (one ? 8 : 6);
        for (int j = 0; j < QK / 2; j++) {
            q[j] = (int8_t)((qs[j] & 0xF) | (((qh >> j) & 1) << 4));
            q[j + QK / 2] = (int8_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
        }
        break;
    }
    case T_Q8_0:
        s[0] = half_at(b);
        memcpy(q, b + 2, QK);
        break;
    case T_Q4_K:
    case T_Q5_K: { /* d, dmin, 12 bytes of 6-bit scales/mins for 8 sub-blocks of 32 [, 32 bytes of fifth bits], 128 bytes of nibbles */
        const int five = type == T_Q5_K;
        const float d = half_at(b), dmin = half_at(b + 2);
        const uint8_t *sc = b + 4, *qh = b + 16, *qs = b + (five ? 48 : 16);
        if (sup) *sup->d = d, *sup->dm = -dmin; /* -(dmin*m) == (-dmin)*m: rounding is symmetric */
        for (int c = 0; c < 4; c++, qs += 32) { /* 64 values: sub-blocks 2c (low nibbles) and 2c + 1 (high) */
            for (int h = 0; h < 2; h++) { /* value d*sc*q - dmin*m: scale d*sc, offset -(dmin*m) */
                int sv, mv;
                scale_min_k4(2 * c + h, sc, &sv, &mv);
                s[2 * c + h] = d * (float)sv;
                o[2 * c + h] = -(dmin * (float)mv);
                if (sup) sup->sc[2 * c + h] = (int8_t)sv, sup->mn[2 * c + h] = (int8_t)mv;
            }
            for (int l = 0; l < 32; l++) {
                int lo = qs[l] & 0xF, hi = qs[l] >> 4;
                if (five) {
                    lo += (qh[l] >> (2 * c)) & 1 ? 16 : 0;
                    hi += (qh[l] >> (2 * c + 1)) & 1 ? 16 : 0;
                }
                q[64 * c + l] = (int8_t)lo;
                q[64 * c + 32 + l] = (int8_t)hi;
            }
        }
        break;
    }
    case T_Q2_K: { /* 16 bytes of a 4-bit scale and min per 16 values, 64 of 2-bit values, d, dmin */
        const uint8_t *sc = b, *qs = b + 16;
        const float d = half_at(b + 80), dmin = half_at(b + 82);
        if (sup) *sup->d = d, *sup->dm = -dmin;
        for (int j = 0; j < 16; j++) { /* value d*sc*q - dmin*m */
            s[j] = d * (float)(sc[j] & 0xF);
            o[j] = -(dmin * (float)(sc[j] >> 4));
            if (sup) sup->sc[j] = (int8_t)(sc[j] & 0xF), sup->mn[j] = (int8_t)(sc[j] >> 4);
        }
        for (int i = 0; i < QK_K; i++) /* each half of 128: value i in bits 2j of byte i % 32, j = i % 128 / 32 */
            q[i] = (int8_t)((qs[32 * (i / 128) + i % 32] >> (2 * (i % 128 / 32))) & 3);
        break;
    }
    case T_Q3_K: { /* 32 bytes of third bits, 64 of 2-bit values, 12 of 6-bit scales (one per 16 values), d */
        const uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
        const float d = half_at(b + 108);
        for (int j = 0; j < 16; j++) { /* scale j: 4 low bits in a nibble of bytes 0..7, 2 high bits in bytes 8..11 */
            const int lo = j < 8 ? sc[j] & 0xF : sc[j - 8] >> 4, hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
            s[j] = d * (float)((lo | hi << 4) - 32);
            o[j] = -4.0f * s[j]; /* c times the scale: folds into the integer sums, no integer form */
            if (sup) sup->sc[j] = (int8_t)((lo | hi << 4) - 32);
        }
        if (sup) *sup->d = d;
        /* the value is its two bits, + 4 when its third bit is set, - 4: stored as 0..7 with the -4 in
         * the offset (exact: (q + 4) s - 4 s is llama.cpp's d*sc*q in fp32) */
        for (int i = 0; i < QK_K; i++) {
            const int h = i / 128, j = i % 128 / 32, l = i % 32;
            q[i] = (int8_t)(((qs[32 * h + l] >> (2 * j)) & 3) | ((hm[l] >> (4 * h + j)) & 1) << 2);
        }
        break;
    }
    case T_IQ4_NL: /* d, 16 bytes of indices into iq4_values (kept as indices: quant_lut), laid out as Q4_0's */
        s[0] = half_at(b);
        for (int j = 0; j < QK / 2; j++) {
            q[j] = (int8_t)(b[2 + j] & 0xF);
            q[j + QK / 2] = (int8_t)(b[2 + j] >> 4);
        }
        break;
    case T_MXFP4: /* an E8M0 exponent e (the scale 2^(e - 128), exact in fp32 down to e 0), then indices into mxfp4_values as Q4_0's */
        s[0] = ldexpf(1.0f, (int)b[0] - 128);
        for (int j = 0; j < QK / 2; j++) {
            q[j] = (int8_t)(b[1 + j] & 0xF);
            q[j + QK / 2] = (int8_t)(b[1 + j] >> 4);
        }
        break;
    case T_IQ4_XS: { /* d, 16 bits of scales' high pairs, 4 bytes of their low nibbles, 8 IQ4_NL-like sub-blocks of 32 */
        const float d = half_at(b);
        const unsigned high = (unsigned)b[2] | (unsigned)b[3] << 8;
        const uint8_t *low = b + 4, *qs = b + 8;
        for (int j = 0; j < 8; j++, qs += 16) {
            const int ls = ((low[j / 2] >> (4 * (j % 2))) & 0xF) | (int)((high >> (2 * j)) & 3) << 4;
            s[j] = d * (float)(ls - 32);
            if (sup) sup->sc[j] = (int8_t)(ls - 32), *sup->d = d;
            for (int l = 0; l < 16; l++) {
                q[32 * j + l] = (int8_t)(qs[l] & 0xF);
                q[32 * j + 16 + l] = (int8_t)(qs[l] >> 4);
            }
        }
        break;
    }
    case T_Q6_K: { /* 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales (one per 16 values), d */
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        const float d = half_at(b + 208);
        for (int i = 0; i < 16; i++) s[i] = d * (float)sc[i];
        if (sup) memcpy(sup->sc, sc, 16), *sup->d = d;
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, q += 128)
            for (int l = 0; l < 32; l++) {
                q[l] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
                q[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                q[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                q[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
        break;
    }
    }
}

/* One block of a quantized type into y (block_of's values): its decomposition, multiplied out. */
static void dequant_block(uint32_t type, const uint8_t *b, float *y) {
    int8_t q[QK_K];
    float s[QK_K / 16], o[QK_K / 16];
    int qb, offset;
    uint64_t bytes;
    const int per = block_of(type, &bytes);
    quant_form(type, &qb, &offset);
    decompose_block(type, b, q, s, o, NULL);
    nv_qmatrix_to_f32(q, quant_lut(type), s, offset ? o : NULL, qb, (size_t)per, y);
}

/* Converts tensor t (n values) into dst. */
static void to_f32(const nv_gguf_tensor *t, float *dst, uint64_t n) {
    const uint8_t *p = t->data;
    switch (t->type) {
    case T_F32: memcpy(dst, p, (size_t)n * 4); break;
    case T_F16:
    case T_BF16:
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = t->type == T_F16 ? f16_to_f32(h) : nv_f32_from_bf16(h);
        }
        break;
    default: {
        uint64_t bb = 0;
        const int per = block_of(t->type, &bb);
        for (uint64_t i = 0; i < n / (uint64_t)per; i++) dequant_block(t->type, p + i * bb, dst + i * (uint64_t)per);
        break;
    }
    }
}

/* Rows [row0, row0 + rows) of a 2-D tensor as a tensor of their own (whole rows are whole blocks). */
static nv_err row_view(const nv_gguf *g, const nv_gguf_tensor *t, const char *name, uint64_t row0, uint64_t rows, uint64_t total,
                       nv_gguf_tensor *view) {
    if (t->dims[1] != total || t->dims[2] != 1 || t->dims[3] != 1)
        return nv_fail(NV_EFORMAT, "%s: tensor '%.*s' is [%llu, %llu, %llu, %llu], expected %llu rows holding '%s'", g->path,
                       (int)(t->name_len < 64 ? t->name_len : 64), t->name, (unsigned long long)t->dims[0],
                       (unsigned long long)t->dims[1], (unsigned long long)t->dims[2], (unsigned long long)t->dims[3],
                       (unsigned long long)total, name);
    *view = *t;
    if (!t->bytes) return NV_OK; /* a type not loaded: take says so */
    const uint64_t row_bytes = t->bytes / total;
    view->dims[1] = rows;
    view->data = t->data + row0 * row_bytes;
    view->bytes = rows * row_bytes;
    return NV_OK;
}

/* A tensor of this project's layout as the file holds it (*t NULL when it is not there): itself,
 * or its rows of a fused one, phi3's: a layer's attn_qkv holds the query's rows, then the key's,
 * then the value's; its ffn_up (with no ffn_gate) the gate's rows, then the up projection's. */
static nv_err tensor_rows(const nv_gguf *g, const nv_config *c, const char *name, nv_gguf_tensor *view, const nv_gguf_tensor **t) {
    *t = nv_gguf_tensor_find(g, name);
    int l = -1, at = 0;
    if (!c || sscanf(name, "blk.%d.%n", &l, &at) != 1 || !at) return NV_OK;
    const char *part = name + at;
    const int q = !strcmp(part, "attn_q.weight"), k = !strcmp(part, "attn_k.weight"), v = !strcmp(part, "attn_v.weight");
    const int gate = !strcmp(part, "ffn_gate.weight"), up = !strcmp(part, "ffn_up.weight");
    char fused[64];
    const uint64_t qd = (uint64_t)nv_config_q_dim(c), kvd = (uint64_t)nv_config_kv_dim(c), h = (uint64_t)c->hidden_dim;
    if ((q || k || v) && !*t) {
        snprintf(fused, sizeof fused, "blk.%d.attn_qkv.weight", l);
        const nv_gguf_tensor *f = nv_gguf_tensor_find(g, fused);
        if (!f) return NV_OK;
        NV_TRY(row_view(g, f, name, q ? 0 : k ? qd : qd + kvd, q ? qd : kvd, qd + 2 * kvd, view));
        *t = view;
    } else if (gate || up) {
        snprintf(fused, sizeof fused, "blk.%d.ffn_gate.weight", l);
        if (nv_gguf_tensor_find(g, fused)) return NV_OK; /* separate: as they are */
        snprintf(fused, sizeof fused, "blk.%d.ffn_up.weight", l);
        const nv_gguf_tensor *f = nv_gguf_tensor_find(g, fused);
        if (!f || f->dims[1] != 2 * h) return NV_OK; /* not fused: take says what is missing or misshapen */
        NV_TRY(row_view(g, f, name, up ? h : 0, h, 2 * h, view));
        *t = view;
    }
    return NV_OK;
}

/* Finds name (in the file or fused there, tensor_rows; c NULL: in the file) with the shape [d0] or
 * [d0, d1] (dims[0] fastest) and a type this loader converts; with dst, converts it there. */
static nv_err take(const nv_gguf *g, const nv_config *c, const char *name, uint64_t d0, uint64_t d1, uint64_t d2, float *dst) {
    nv_gguf_tensor view;
    const nv_gguf_tensor *t;
    NV_TRY(tensor_rows(g, c, name, &view, &t));
    if (!t) return nv_fail(NV_EFORMAT, "%s: tensor '%s' is missing", g->path, name);
    if (!t->bytes) return nv_fail(NV_EUNSUPPORTED, "%s: tensor '%s' has type %s (%u) or rows that do not fill its blocks; supported: " SUPPORTED_TYPES, g->path, name,
                                  nv_gguf_type_name(t->type), t->type);
    uint64_t want[4] = {d0, d1, d2 ? d2 : 1, 1};
    for (int i = 0; i < 4; i++)
        if (t->dims[i] != want[i])
            return nv_fail(NV_EFORMAT, "%s: tensor '%s' is [%llu, %llu, %llu, %llu], expected [%llu, %llu, %llu]", g->path, name,
                           (unsigned long long)t->dims[0], (unsigned long long)t->dims[1], (unsigned long long)t->dims[2],
                           (unsigned long long)t->dims[3], (unsigned long long)d0, (unsigned long long)d1, (unsigned long long)want[2]);
    if (dst) {
        to_f32(t, dst, d0 * d1 * want[2]);
        nv_file_release(t->data, (size_t)t->bytes);
    }
    return NV_OK;
}

nv_err nv_gguf_dequant(uint32_t type, const void *data, uint64_t n, float *out) {
    if (!tensor_bytes(type, n, n))
        return nv_fail(NV_EUNSUPPORTED, "GGUF type %s (%u) with %llu values: not converted", nv_gguf_type_name(type), type,
                       (unsigned long long)n);
    nv_gguf_tensor t = {.type = type, .data = data};
    to_f32(&t, out, n);
    return NV_OK;
}

/* The architectures read and written: llama (RoPE on pairs of consecutive head values, as
 * llama2.c), qwen3 (llama with RMSNorm on each query and key head before RoPE) and qwen2 (llama
 * with biases on the query, key and value projections). llama.cpp's qwen2/qwen3 rotate pairs half
 * a head apart, so their query and key rows are stored in that order and reordered on the way in
 * and out. Read only: phi3 (Phi-3, Phi-3.5: llama with the rotation of qwen's, its query, key and
 * value rows in one tensor per layer and its gate and up rows in another; written back as llama). */
static const char *arch_name(int qk_norm, int qkv_bias, int experts) {
    return qk_norm ? (experts ? "qwen3moe" : "qwen3") : qkv_bias ? "qwen2" : "llama";
}
/* Whether c's RoPE divisors, if any, are one factor (linear scaling, which the Gemma family's and
 * SmolLM3's files say by rope.scaling.factor: llama.cpp reads no divisors tensor for them). */
static int linear_only(const nv_config *c) {
    int uniform = c->llama3.factor == 0.0f;
    for (int i = 1; i < c->n_rope_factors; i++) uniform &= c->rope_factors[i] == c->rope_factors[0];
    return uniform;
}
/* llama.cpp's rule for the Gemma family's score divisor: the largest models (Gemma 2 27B: 46 layers,
 * Gemma 3 27B: 62) scale queries by their width per head, not their head size (0: sqrt(head size)). */
static float gemma_attn_div(const char *arch, int layers, int dim, int heads) {
    return (!strcmp(arch, "gemma2") && layers == 46) || (!strcmp(arch, "gemma3") && layers == 62) ? sqrtf((float)(dim / heads)) : 0.0f;
}
/* The Gemma architecture of a config with GELU gating: gemma3 (post-norms and QK-norm), gemma2
 * (post-norms), gemma. */
static const char *gemma_arch(const nv_config *c) { return c->post_norms ? (c->qk_norm ? "gemma3" : "gemma2") : "gemma"; }
/* The Gemma family as llama.cpp runs it, on c of architecture arch (gemma, gemma2, gemma3) with the
 * sliding window and soft caps its file gives. Gemma 3: five layers of the window (their RoPE base
 * 10000, unscaled) then one of the whole context, QK-norm, logits capped when it gives a cap. Gemma 2:
 * every other layer windowed, scores and logits capped. Gemma: neither. All: GELU gating, scaled
 * embeddings, the score divisor's rule; post-norms but in Gemma 1. */
static void gemma_rules(nv_config *c, const char *arch, int window, float softcap, float attn_softcap) {
    const int g3 = !strcmp(arch, "gemma3"), g2 = !strcmp(arch, "gemma2");
    nv_config_gemma(c, g3 ? 3 : g2 ? 2 : 1);
    c->attn_div = gemma_attn_div(arch, c->n_layers, c->dim, c->n_heads);
    c->logit_softcap = g2 || g3 ? softcap : 0.0f;
    c->attn_softcap = g2 ? attn_softcap : 0.0f;
    c->swa_window = g2 || g3 ? window : 0;
    c->swa_period = c->swa_window ? (g3 ? 6 : 2) : 0;
    c->rope_theta_swa = c->swa_window && g3 ? 10000.0f : 0.0f;
}
/* Whether c is what config_of makes of a file of its Gemma architecture (so that one written reads
 * back the same): gemma_rules change nothing, and no part the architecture lacks is there. */
static int gemma_form(const nv_config *c) {
    const char *arch = gemma_arch(c);
    nv_config ruled = *c;
    gemma_rules(&ruled, arch, c->swa_window, c->logit_softcap, c->attn_softcap);
    const int g2 = !strcmp(arch, "gemma2"); /* its file cannot say "no window" or "no cap" (llama.cpp's defaults then) */
    return !memcmp(&ruled, c, sizeof ruled) && (!g2 || (c->swa_window > 0 && c->attn_softcap > 0.0f && c->logit_softcap > 0.0f)) &&
           !c->qkv_bias && !c->n_experts && linear_only(c) && c->yarn.factor == 0.0f && !c->nope_period && !nv_config_olmo2_block(c);
}
int nv_config_phi3_form(const nv_config *c, int folder) {
    return (c->rope_dim || c->longrope_orig || (folder && c->n_rope_factors)) && !c->qk_norm && !c->qkv_bias && !c->n_experts && !nv_config_gemma_block(c) &&
           !c->nope_period && !nv_config_granite(c) && c->yarn.factor == 0.0f && c->llama3.factor == 0.0f;
}
/* phi3 in a GGUF file: LongRoPE's two sets, or the one divisors as both. */
static int phi3_form(const nv_config *c) { return nv_config_phi3_form(c, 0); }
/* Whether the architecture c is written as rotates pairs half a head apart (llama.cpp's NEOX order:
 * its query and key rows are reordered on the way in and out). */
static int half_rotation(const nv_config *c) { return c->qk_norm || c->qkv_bias || c->ffn_gelu || phi3_form(c); }
/* Whether c is what config_of makes of a smollm3 file: llama's block, every fourth layer without RoPE. */
static int smollm3_form(const nv_config *c) {
    return c->nope_period == 4 && !c->qk_norm && !c->qkv_bias && !c->n_experts && !nv_config_gemma_block(c) &&
           (c->yarn.factor != 0.0f || linear_only(c));
}
/* The float factor whose inverse (as nv_config_set_granite takes it) is the divisor div again: the
 * nearest to 1 / div, or a neighbour of it when that one's inverse rounds elsewhere. */
static float inverse_f32(float div) {
    const float near = (float)(1.0 / div);
    const float tries[3] = {near, nextafterf(near, 0.0f), nextafterf(near, INFINITY)};
    for (int i = 0; i < 3; i++)
        if ((float)(1.0 / tries[i]) == div) return tries[i];
    return near;
}
/* Whether c is what config_of makes of a granite or granitemoe file: llama's block (a mixture of
 * experts or not) with Granite's multipliers and nothing of the others'. */
static int granite_form(const nv_config *c) {
    return nv_config_granite(c) && !c->qk_norm && !c->qkv_bias && !nv_config_gemma_block(c) && !c->nope_period;
}
/* Whether c is what config_of makes of an olmo2 file: OLMo 2's block (QK-norm over the whole
 * projections, norms after the attention and the FFN only), OLMo 3's window over the layers of a
 * period with their own RoPE base, and otherwise llama's parts alone. */
static int olmo2_form(const nv_config *c) {
    return c->no_pre_norms && c->post_norms && c->qk_norm == NV_QK_NORM_WHOLE && !c->qkv_bias && !c->n_experts && !c->ffn_gelu &&
           c->emb_scale == 0.0f && c->attn_div == 0.0f && c->logit_softcap == 0.0f && c->attn_softcap == 0.0f && !c->nope_period &&
           !nv_config_granite(c) && !c->rope_dim && !c->longrope_orig && (c->yarn.factor != 0.0f || linear_only(c)) &&
           (!c->swa_window || c->rope_theta_swa != 0.0f);
}
/* Whether c is written as mistral3: read as one, or with Ministral 3's attention temperature. */
static int mistral3_form(const nv_config *c) { return c->arch_mistral3 || c->attn_temp_scale != 0.0f; }
static const char *arch_of(const nv_config *c) {
    return c->gpt_oss                 ? "gpt-oss"
           : nv_config_granite(c)      ? (c->n_experts ? "granitemoe" : "granite")
           : nv_config_olmo2_block(c) ? "olmo2"
           : c->ffn_gelu              ? gemma_arch(c)
           : c->nope_period           ? "smollm3"
           : phi3_form(c)             ? "phi3"
           : mistral3_form(c)         ? "mistral3"
                                      : arch_name(c->qk_norm, c->qkv_bias, c->n_experts);
}

/* "<arch>.<suffix>" into buf. */
static const char *akey(char *buf, size_t cap, const char *arch, const char *suffix) {
    snprintf(buf, cap, "%s.%s", arch, suffix);
    return buf;
}

/* A sliding window's layers as llama.cpp reads key (get_key_or_arr): a period n (layer l windowed
 * when l % n < n - 1; 0: every layer), dflt when absent, or a flag per layer, which must be such a
 * period (nv_config.swa_period) to be run. */
static nv_err swa_pattern(const nv_gguf *g, const char *key, int dflt, int64_t layers, int *period) {
    const nv_gguf_kv *kv = nv_gguf_find(g, key);
    if (!kv || kv->type != GG_ARR) {
        int64_t p;
        NV_TRY(get_int(g, key, dflt, &p));
        if (p < 0 || p > 1024) return nv_fail(NV_EFORMAT, "%s: %s %lld is out of range", g->path, key, (long long)p);
        *period = (int)p;
        return NV_OK;
    }
    if (kv->elem != GG_BOOL || kv->count != (uint64_t)layers)
        return nv_fail(NV_EFORMAT, "%s: %s is not a flag for each of the %lld layers", g->path, key, (long long)layers);
    int64_t p = 0; /* the first layer of the whole context ends the period */
    while (p < layers && kv->val[p]) p++;
    p = p < layers ? p + 1 : 0;
    for (int64_t l = 0; l < layers; l++)
        if ((kv->val[l] != 0) != (p == 0 || l % p < p - 1))
            return nv_fail(NV_EUNSUPPORTED, "%s: %s does not repeat windowed layers, then one of the whole context", g->path, key);
    *period = (int)p;
    return NV_OK;
}

static nv_err config_of(const nv_gguf *g, nv_config *c, int *neox) {
    size_t n = 0;
    const char *arch_s = nv_gguf_string(g, "general.architecture", &n);
    if (!arch_s) return nv_fail(NV_EFORMAT, "%s: general.architecture is missing", g->path);
    char shown_arch[128], k[96];
    const int qwen3moe = name_is(arch_s, n, "qwen3moe"), qwen3 = qwen3moe || name_is(arch_s, n, "qwen3"),
              mistral3 = name_is(arch_s, n, "mistral3"), /* Ministral 3's: llama's block, its own YaRN and attention temperature */
              qwen2 = name_is(arch_s, n, "qwen2"), llama = mistral3 || name_is(arch_s, n, "llama"), phi3 = name_is(arch_s, n, "phi3"),
              gemma3 = name_is(arch_s, n, "gemma3"), gemma2 = name_is(arch_s, n, "gemma2"), gemma1 = name_is(arch_s, n, "gemma"),
              gemma = gemma1 || gemma2 || gemma3, smollm3 = name_is(arch_s, n, "smollm3"),
              granitemoe = name_is(arch_s, n, "granitemoe"), granite = granitemoe || name_is(arch_s, n, "granite"),
              olmo2 = name_is(arch_s, n, "olmo2"), gptoss = name_is(arch_s, n, "gpt-oss");
    if (!llama && !qwen3 && !qwen2 && !phi3 && !gemma && !smollm3 && !granite && !olmo2 && !gptoss)
        return nv_fail(NV_EUNSUPPORTED,
                       "%s: architecture '%s' is not supported (llama, mistral3, qwen2, qwen3, qwen3moe, phi3, gemma, gemma2, gemma3, smollm3, "
                       "granite, granitemoe, olmo2 or gpt-oss)",
                       g->path, nv_gguf_shown(arch_s, n, shown_arch, sizeof shown_arch));
    const char *arch = phi3 ? "phi3" : gemma3 ? "gemma3" : gemma2 ? "gemma2" : gemma1 ? "gemma" : smollm3 ? "smollm3"
                       : granitemoe ? "granitemoe" : granite ? "granite" : olmo2 ? "olmo2" : mistral3 ? "mistral3"
                       : gptoss ? "gpt-oss" : arch_name(qwen3, qwen2, qwen3moe);
    if (neox) *neox = qwen3 || qwen2 || phi3 || gemma || olmo2 || gptoss;
    int64_t dim, hidden, layers, heads, kv_heads, ctx, head_dim, v_dim, rot;
    NV_TRY(get_int(g, akey(k, sizeof k, arch, "embedding_length"), -1, &dim));
    /* a mixture of experts (Mixtral as llama, qwen3moe): as llama.cpp runs them, softmax routing whose
       chosen weights are renormalised; what else it has (shared experts, other gating) is refused */
    int64_t experts = 0, used = 0, shared = 0, gating = 1, dense_first = 0;
    if (llama || qwen3moe || granitemoe || gptoss) {
        NV_TRY(get_int(g, akey(k, sizeof k, arch, "expert_count"), 0, &experts));
        NV_TRY(get_int(g, akey(k, sizeof k, arch, "expert_used_count"), 0, &used));
        NV_TRY(get_int(g, akey(k, sizeof k, arch, "expert_shared_count"), 0, &shared));
        NV_TRY(get_int(g, akey(k, sizeof k, arch, "expert_gating_func"), 1, &gating));
        NV_TRY(get_int(g, akey(k, sizeof k, arch, "leading_dense_block_count"), 0, &dense_first));
    }
    if ((qwen3moe || granitemoe || gptoss) && experts == 0) return nv_fail(NV_EFORMAT, "%s: a %s model without %s.expert_count", g->path, arch, arch);
    if (granitemoe) { /* GraniteMoeShared's shared expert, beside the routed ones */
        int64_t shared_ff = 0;
        NV_TRY(get_int(g, "granitemoe.expert_shared_feed_forward_length", 0, &shared_ff));
        if (shared_ff || nv_gguf_tensor_find(g, "blk.0.ffn_gate_shexp.weight")) shared = 1;
    }
    if (experts < 0 || experts > 1024 || (experts && (used < 1 || used > experts)))
        return nv_fail(NV_EFORMAT, "%s: %lld experts with %lld used per token (1..1024 experts, 1..all of them used)", g->path,
                       (long long)experts, (long long)used);
    if (experts && (shared || gating != 1 || dense_first))
        return nv_fail(NV_EUNSUPPORTED, "%s: shared experts, dense leading layers or gating other than softmax are not supported", g->path);
    if (experts && nv_gguf_tensor_find(g, "blk.0.ffn_gate.0.weight"))
        return nv_fail(NV_EUNSUPPORTED, "%s: the experts are separate tensors (blk.N.ffn_gate.E.weight, an older conversion); "
                                        "convert the model again for one tensor per layer (ffn_gate_exps)", g->path);
    NV_TRY(get_int(g, akey(k, sizeof k, arch, "feed_forward_length"), experts && (qwen3moe || gptoss) ? 0 : -1, &hidden));
    if (qwen3moe || gptoss) { /* its experts' own width (llama.cpp: else the dense width over the experts used) */
        int64_t per_expert = 0;
        NV_TRY(get_int(g, akey(k, sizeof k, arch, "expert_feed_forward_length"), 0, &per_expert));
        hidden = per_expert ? per_expert : used ? hidden / used : 0;
    }
    NV_TRY(get_int(g, akey(k, sizeof k, arch, "block_count"), -1, &layers));
    NV_TRY(get_int(g, akey(k, sizeof k, arch, "attention.head_count"), -1, &heads));
    NV_TRY(get_int(g, akey(k, sizeof k, arch, "attention.head_count_kv"), heads, &kv_heads));
    NV_TRY(get_int(g, akey(k, sizeof k, arch, "context_length"), -1, &ctx));
    NV_TRY(get_int(g, akey(k, sizeof k, arch, "attention.key_length"), 0, &head_dim));
    if (head_dim == 0) { /* the head size defaults to embedding_length / head_count */
        if (heads <= 0 || dim <= 0 || dim % heads)
            return nv_fail(NV_EFORMAT, "%s: embedding_length %lld is not a multiple of head_count %lld", g->path,
                           (long long)dim, (long long)heads);
        head_dim = dim / heads;
    }
    NV_TRY(get_int(g, akey(k, sizeof k, arch, "attention.value_length"), head_dim, &v_dim));
    if (v_dim != head_dim)
        return nv_fail(NV_EUNSUPPORTED, "%s: value heads of %lld differ from key heads of %lld", g->path, (long long)v_dim,
                       (long long)head_dim);
    NV_TRY(get_int(g, akey(k, sizeof k, arch, "rope.dimension_count"), head_dim, &rot));
    if (rot < 2 || rot > head_dim || rot % 2) /* partial rotation (Phi-4-mini: 96 of 128) */
        return nv_fail(NV_EFORMAT, "%s: rotary dimension %lld for a head of %lld (want an even count up to it)", g->path, (long long)rot,
                       (long long)head_dim);
    /* RoPE scaling: linear (positions divided by the factor; a factor without a type is linear, as
     * llama.cpp reads it) is every frequency's divisor; YaRN as llama.cpp runs it (its attention
     * factor times 0.1 ln(factor) + 1); the rest are refused rather than run with the wrong
     * positions. Llama 3.1+'s per-frequency divisors (the rope_freqs tensor) too. */
    size_t sl = 0;
    const char *scaling = nv_gguf_string(g, akey(k, sizeof k, arch, "rope.scaling.type"), &sl);
    float factor = 1.0f;
    NV_TRY(get_float(g, akey(k, sizeof k, arch, "rope.scaling.factor"), 1.0f, &factor));
    const int yarn = scaling && name_is(scaling, sl, "yarn");
    if (scaling && !name_is(scaling, sl, "none") && !name_is(scaling, sl, "linear") && !yarn)
        return nv_fail(NV_EUNSUPPORTED, "%s: the model scales RoPE (%s.rope.scaling.type %s), which is not supported (linear and yarn are)",
                       g->path, arch, nv_gguf_shown(scaling, sl < 32 ? sl : 32, shown_arch, sizeof shown_arch));
    nv_rope_yarn y = {0};
    if (yarn) {
        int64_t orig = 0;
        float attn = 1.0f, log_mul = 0.0f;
        NV_TRY(get_int(g, akey(k, sizeof k, arch, "rope.scaling.original_context_length"), -1, &orig));
        NV_TRY(get_float(g, akey(k, sizeof k, arch, "rope.scaling.attn_factor"), 1.0f, &attn));
        NV_TRY(get_float(g, akey(k, sizeof k, arch, "rope.scaling.yarn_beta_fast"), 32.0f, &y.beta_fast));
        NV_TRY(get_float(g, akey(k, sizeof k, arch, "rope.scaling.yarn_beta_slow"), 1.0f, &y.beta_slow));
        NV_TRY(get_float(g, akey(k, sizeof k, arch, "rope.scaling.yarn_log_multiplier"), 0.0f, &log_mul));
        if (log_mul != 0.0f && !mistral3)
            return nv_fail(NV_EUNSUPPORTED, "%s: YaRN with a log multiplier (DeepSeek's attention scaling) is not supported", g->path);
        if (orig < 1 || orig > (1 << 30) || !(attn > 0.0f && attn < 1e3f) || !(log_mul >= 0.0f && log_mul < 1e3f))
            return nv_fail(NV_EFORMAT, "%s: YaRN's original context %lld, attention factor %g or log multiplier %g is out of range", g->path,
                           (long long)orig, (double)attn, (double)log_mul);
        y.factor = factor, y.orig_ctx = (int)orig;
        /* mistral3's multiplier is transformers' mscale_all_dim, which divides YaRN's own: 1 (Ministral 3's) leaves the
           cos and sin unscaled, as transformers and llama.cpp run it */
        y.attn_factor = (float)(attn * nv_yarn_mscale(factor) / (mistral3 ? 0.1 * log_mul * log(factor > 1.0f ? factor : 1.0f) + 1.0 : 1.0));
    }
    const int linear = !yarn && factor != 1.0f && factor != 0.0f; /* llama.cpp divides by the factor whatever the type says */
    if (linear && !(factor > 0.0f && factor < 1e6f))
        return nv_fail(NV_EFORMAT, "%s: %s.rope.scaling.factor %g is out of range", g->path, arch, (double)factor);
    /* outside YaRN, rope.scaling.attn_factor multiplies every cos and sin (llama.cpp does so for any model) */
    float rope_attn = 1.0f;
    if (!yarn) NV_TRY(get_float(g, akey(k, sizeof k, arch, "rope.scaling.attn_factor"), 1.0f, &rope_attn));
    if (!(rope_attn > 0.0f && rope_attn < 1e3f))
        return nv_fail(NV_EFORMAT, "%s: %s.rope.scaling.attn_factor %g is out of range", g->path, arch, (double)rope_attn);
    /* Phi-3's LongRoPE (the 128k models, Phi-3.5, Phi-4-mini): a divisor per frequency for positions
       past the original context and another for the rest (nv_config.longrope_orig) */
    const int longrope = nv_gguf_tensor_find(g, "rope_factors_long.weight") || nv_gguf_tensor_find(g, "rope_factors_short.weight");
    if (mistral3 && (rot < head_dim || longrope)) /* as llama.cpp's mistral3: whole heads, no LongRoPE */
        return nv_fail(NV_EUNSUPPORTED, "%s: mistral3 with RoPE on %lld of %lld values%s is not supported", g->path, (long long)rot,
                       (long long)head_dim, longrope ? " or LongRoPE's factors" : "");
    int64_t longrope_orig = 0;
    if (longrope && !phi3)
        return nv_fail(NV_EUNSUPPORTED, "%s: LongRoPE's factors (rope_factors_long/short) outside a phi3 model", g->path);
    if (longrope && (yarn || linear || nv_gguf_tensor_find(g, "rope_freqs.weight")))
        return nv_fail(NV_EUNSUPPORTED, "%s: LongRoPE beside other RoPE scaling", g->path);
    if (longrope) NV_TRY(get_int(g, akey(k, sizeof k, arch, "rope.scaling.original_context_length"), ctx, &longrope_orig));
    if (phi3) { /* as llama.cpp runs phi3: its sliding window is not applied (a warning there too) */
        int64_t window = 0;
        NV_TRY(get_int(g, "phi3.attention.sliding_window", 0, &window));
        if (window > 0 && window < ctx)
            nv_warn("%s: the model's sliding window of %lld tokens is not applied: attention sees the whole context of %lld, "
                    "as llama.cpp runs phi3", g->path, (long long)window, (long long)ctx);
    }
    /* Granite's multipliers (llama.cpp's keys; a missing one is neutral, a score factor of 0 the default) */
    float granite_m[4] = {1.0f, 0.0f, 1.0f, 1.0f};
    static const char *const granite_keys[4] = {"embedding_scale", "attention.scale", "residual_scale", "logit_scale"};
    for (int i = 0; granite && i < 4; i++) {
        NV_TRY(get_float(g, akey(k, sizeof k, arch, granite_keys[i]), granite_m[i], &granite_m[i]));
        if (!(granite_m[i] >= 0.0f && granite_m[i] < 1e6f) || (i != 1 && granite_m[i] == 0.0f))
            return nv_fail(NV_EFORMAT, "%s: %s.%s %g is out of range", g->path, arch, granite_keys[i], (double)granite_m[i]);
    }
    /* The Gemma family's window and caps (gemma_rules): Gemma 2's 4096, 30 and 50 (llama.cpp's) unless
       the file says */
    int64_t window = 0;
    float softcap = 0.0f, attn_softcap = 0.0f;
    if (gemma2 || gemma3) {
        NV_TRY(get_int(g, akey(k, sizeof k, arch, "attention.sliding_window"), gemma2 ? 4096 : 0, &window));
        NV_TRY(get_float(g, akey(k, sizeof k, arch, "final_logit_softcapping"), gemma2 ? 30.0f : 0.0f, &softcap));
        if (gemma2) NV_TRY(get_float(g, "gemma2.attn_logit_softcapping", 50.0f, &attn_softcap));
        if (window < 0 || window > (1 << 30) || !(softcap >= 0.0f && softcap < 1e6f) || !(attn_softcap >= 0.0f && attn_softcap < 1e6f) ||
            (gemma2 && !(attn_softcap > 0.0f && softcap > 0.0f && window > 0)))
            return nv_fail(NV_EFORMAT, "%s: %s's sliding window %lld or soft caps %g, %g are out of range", g->path, arch, (long long)window,
                           (double)softcap, (double)attn_softcap);
    }
    /* gpt-oss: a window (128) in every other layer from the first, as llama.cpp's set_swa_pattern(2),
       with the same RoPE (its YaRN) as the others */
    int64_t oss_window = 0;
    int oss_period = 0;
    if (gptoss) {
        float base_swa = 0.0f, base = 0.0f;
        NV_TRY(get_int(g, "gpt-oss.attention.sliding_window", -1, &oss_window));
        if (oss_window < 1 || oss_window > (1 << 30))
            return nv_fail(NV_EFORMAT, "%s: gpt-oss's sliding window %lld is out of range", g->path, (long long)oss_window);
        NV_TRY(swa_pattern(g, "gpt-oss.attention.sliding_window_pattern", 2, layers, &oss_period));
        NV_TRY(get_float(g, "gpt-oss.rope.freq_base", 10000.0f, &base));
        NV_TRY(get_float(g, "gpt-oss.rope.freq_base_swa", base, &base_swa));
        if (base_swa != base)
            return nv_fail(NV_EUNSUPPORTED, "%s: gpt-oss with another RoPE base in its windowed layers (%g, the others' %g)", g->path,
                           (double)base_swa, (double)base);
    }
    /* OLMo 3 (olmo2 with a window): its layers as llama.cpp's set_swa_pattern names them, their RoPE
       base rope.freq_base_swa (else the model's) without the others' scaling */
    int64_t olmo_window = 0;
    int olmo_period = 0;
    float olmo_theta_swa = 0.0f;
    if (olmo2) {
        NV_TRY(get_int(g, "olmo2.attention.sliding_window", 0, &olmo_window));
        if (olmo_window < 0 || olmo_window > (1 << 30))
            return nv_fail(NV_EFORMAT, "%s: olmo2's sliding window %lld is out of range", g->path, (long long)olmo_window);
        if (olmo_window) NV_TRY(swa_pattern(g, "olmo2.attention.sliding_window_pattern", 4, layers, &olmo_period));
        if (olmo_window) NV_TRY(get_float(g, "olmo2.rope.freq_base_swa", 0.0f, &olmo_theta_swa));
    }
    const nv_gguf_tensor *emb = nv_gguf_tensor_find(g, "token_embd.weight");
    if (!emb) return nv_fail(NV_EFORMAT, "%s: tensor 'token_embd.weight' is missing", g->path);
    const int64_t lim = 1 << 30;
    if (dim > lim || hidden > lim || layers > lim || heads > lim || kv_heads > lim || ctx > lim || head_dim > lim ||
        emb->dims[1] > (uint64_t)lim || dim < 1 || heads < 1 || hidden < 1 || layers < 1 || kv_heads < 1 || ctx < 1 || head_dim < 1)
        return nv_fail(NV_EFORMAT, "%s: model dimensions out of range", g->path);
    /* tensors this model has no place for would be dropped silently: refuse the ones that change it */
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const char *nm = g->t[i].name;
        const size_t nl = g->t[i].name_len;
        const int qkv_bias = (qwen2 || gptoss) && nl > 16 && !memcmp(nm, "blk.", 4) &&
                             (!memcmp(nm + nl - 12, ".attn_q.bias", 12) || !memcmp(nm + nl - 12, ".attn_k.bias", 12) ||
                              !memcmp(nm + nl - 12, ".attn_v.bias", 12));
        const int cls_bias = nl == 15 && !memcmp(nm, "cls.output.bias", 15); /* a reranker's head's (take_cls_head) */
        /* its output's, router's and experts' (nv_model_tensor_map's names) */
        const int oss_bias = gptoss && nl > 16 && !memcmp(nm, "blk.", 4) &&
                             (!memcmp(nm + nl - 17, ".attn_output.bias", 17) || (nl > 19 && !memcmp(nm + nl - 19, ".ffn_gate_exps.bias", 19)) ||
                              (nl > 18 && (!memcmp(nm + nl - 18, ".ffn_gate_inp.bias", 18) || !memcmp(nm + nl - 17, ".ffn_up_exps.bias", 17) ||
                                           !memcmp(nm + nl - 19, ".ffn_down_exps.bias", 19))));
        if (nl > 5 && !memcmp(nm + nl - 5, ".bias", 5) && !qkv_bias && !cls_bias && !oss_bias)
            return nv_fail(NV_EUNSUPPORTED, "%s: tensor '%s' is a bias, which this model does not have", g->path,
                           nv_gguf_shown(nm, nl, shown_arch, sizeof shown_arch));
    }
    memset(c, 0, sizeof *c);
    c->dim = (int)dim;
    c->hidden_dim = (int)hidden;
    c->n_layers = (int)layers;
    c->n_heads = (int)heads;
    c->n_kv_heads = (int)kv_heads;
    c->head_dim = (int)head_dim;
    c->rope_dim = rot < head_dim ? (int)rot : 0;
    c->vocab_size = (int)emb->dims[1];
    c->seq_len = (int)ctx;
    NV_TRY(get_float(g, akey(k, sizeof k, arch, "rope.freq_base"), 10000.0f, &c->rope_theta));
    NV_TRY(get_float(g, akey(k, sizeof k, arch, "attention.layer_norm_rms_epsilon"), 1e-5f, &c->norm_eps));
    c->shared_classifier = nv_gguf_tensor_find(g, "output.weight") == NULL;
    c->qk_norm = qwen3; /* gemma3's: gemma_rules */
    c->qkv_bias = qwen2 || gptoss;
    if (gptoss) c->gpt_oss = 1, c->swa_window = (int)oss_window, c->swa_period = oss_period;
    if (smollm3) c->nope_period = 4; /* llama.cpp's SmolLM3: every fourth layer without RoPE (no key says it) */
    if (mistral3) { /* the queries' temperature, over YaRN's original context (else the context) unless the file says another length */
        int64_t temp_len = 0;
        c->arch_mistral3 = 1;
        NV_TRY(get_float(g, "mistral3.attention.temperature_scale", 0.0f, &c->attn_temp_scale));
        NV_TRY(get_int(g, "mistral3.attention.temperature_length", yarn ? y.orig_ctx : ctx, &temp_len));
        if (c->attn_temp_scale != 0.0f && (temp_len < 1 || temp_len > (1 << 30)))
            return nv_fail(NV_EFORMAT, "%s: mistral3's attention temperature over %lld positions is out of range", g->path, (long long)temp_len);
        c->attn_temp_len = c->attn_temp_scale != 0.0f ? (int)temp_len : 0;
    }
    if (gemma) gemma_rules(c, arch, (int)window, softcap, attn_softcap);
    if (granite) nv_config_set_granite(c, granite_m[0], granite_m[1], granite_m[2], granite_m[3]);
    if (olmo2) {
        c->qk_norm = NV_QK_NORM_WHOLE, c->post_norms = 1, c->no_pre_norms = 1;
        c->swa_window = (int)olmo_window, c->swa_period = olmo_period;
        c->rope_theta_swa = olmo_window ? (olmo_theta_swa != 0.0f ? olmo_theta_swa : c->rope_theta) : 0.0f;
    }
    c->n_experts = (int)experts;
    c->n_experts_used = (int)used;
    /* a divisor per pair: Llama 3.1+'s rope_freqs, or LongRoPE's: the short set below the original
       context, the long one past it when the model's context reaches there (the two refused together
       above) */
    const char *divisors = nv_gguf_tensor_find(g, "rope_freqs.weight") ? "rope_freqs.weight" : NULL;
    const int both = longrope && ctx > longrope_orig && longrope_orig > 0;
    for (int set = 0; longrope && set <= both; set++) {
        divisors = set ? "rope_factors_long.weight" : "rope_factors_short.weight";
        if (!nv_gguf_tensor_find(g, divisors))
            return nv_fail(NV_EFORMAT, "%s: LongRoPE's '%s' is missing (a context of %lld, the original %lld)", g->path, divisors,
                           (long long)ctx, (long long)longrope_orig);
    }
    if (divisors) {
        if (nv_config_rope_pairs_fit(c) != NV_OK) return nv_fail(NV_EUNSUPPORTED, "%s: %s", g->path, nv_errmsg());
        c->n_rope_factors = nv_config_rope_dim(c) / 2;
        NV_TRY(take(g, NULL, divisors, (uint64_t)c->n_rope_factors, 1, 0, c->rope_factors));
        if (both) NV_TRY(take(g, NULL, "rope_factors_short.weight", (uint64_t)c->n_rope_factors, 1, 0, c->rope_factors_short));
        if (both) c->longrope_orig = (int)longrope_orig;
    }
    if (rope_attn != 1.0f) c->rope_attn = rope_attn;
    if (linear) NV_TRY(nv_config_rope_linear(c, factor));
    if (yarn && nv_config_rope_yarn(c, &y) != NV_OK) return nv_fail(NV_EFORMAT, "%s: %s", g->path, nv_errmsg());
    return nv_config_validate(c);
}

size_t nv_model_tensor_count(const nv_config *c) {
    return 2 + (c->shared_classifier ? 0 : 1) +
           ((c->no_pre_norms ? 7 : 9) + (c->qk_norm ? 2 : 0) + (c->qkv_bias ? 3 : 0) + (c->n_experts ? 1 : 0) + (c->post_norms ? 2 : 0) +
            (c->gpt_oss ? 6 : 0)) *
               (size_t)c->n_layers;
}

size_t nv_model_tensor_map(const nv_config *c, const nv_weights *w, nv_tensor_ref *t) {
    const uint64_t d = (uint64_t)c->dim, h = (uint64_t)c->hidden_dim, V = (uint64_t)c->vocab_size;
    const uint64_t qd = (uint64_t)nv_config_q_dim(c), kvd = (uint64_t)nv_config_kv_dim(c);
    const uint64_t E = (uint64_t)nv_config_ffn_sets(c);
    const int moe = c->n_experts > 0;
    size_t k = 0;
#define AT(field, off) (w ? w->field + (off) : NULL)
#define ADD(...) (snprintf(t[k].name, sizeof t[k].name, __VA_ARGS__), k++)
    t[k] = (nv_tensor_ref){.d0 = d, .d1 = V, .p = AT(tok_emb, 0)}, ADD("token_embd.weight");
    t[k] = (nv_tensor_ref){.d0 = d, .d1 = 1, .p = AT(rms_final, 0)}, ADD("output_norm.weight");
    if (!c->shared_classifier) t[k] = (nv_tensor_ref){.d0 = d, .d1 = V, .p = AT(wcls, 0)}, ADD("output.weight");
    for (uint64_t l = 0; l < (uint64_t)c->n_layers; l++) {
        const struct {
            const char *name;
            uint64_t d0, d1;
            float *p;
        } parts[] = {{"attn_norm", d, 1, c->no_pre_norms ? NULL : AT(rms_att, l * d)}, {"attn_q", d, qd, AT(wq, l * qd * d)},
                     {"attn_k", d, kvd, AT(wk, l * kvd * d)},    {"attn_v", d, kvd, AT(wv, l * kvd * d)},
                     {"attn_output", qd, d, AT(wo, l * d * qd)}, {"ffn_norm", d, 1, c->no_pre_norms ? NULL : AT(rms_ffn, l * d)},
                     {"ffn_gate", d, h, AT(w1, l * E * h * d)},  {"ffn_down", h, d, AT(w2, l * E * d * h)},
                     {"ffn_up", d, h, AT(w3, l * E * h * d)}};
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) { /* a mixture's FFN: all experts in one */
            if (c->no_pre_norms && (i == 0 || i == 5)) continue; /* OLMo 2: no attn_norm, ffn_norm */
            t[k] = (nv_tensor_ref){.d0 = parts[i].d0, .d1 = parts[i].d1, .p = parts[i].p, .d2 = i >= 6 && moe ? E : 0};
            /* gpt-oss names the FFN's norm after the attention it follows */
            ADD("blk.%llu.%s%s.weight", (unsigned long long)l, i == 5 && c->gpt_oss ? "post_attention_norm" : parts[i].name,
                i >= 6 && moe ? "_exps" : "");
        }
        if (c->gpt_oss) { /* its sinks and biases (an expert's bias a row of its layer's [E] rows) */
            const uint64_t H = (uint64_t)c->n_heads;
            t[k] = (nv_tensor_ref){.d0 = H, .d1 = 1, .p = AT(sinks, l * H)}, ADD("blk.%llu.attn_sinks.weight", (unsigned long long)l);
            t[k] = (nv_tensor_ref){.d0 = d, .d1 = 1, .p = AT(bo, l * d)}, ADD("blk.%llu.attn_output.bias", (unsigned long long)l);
            t[k] = (nv_tensor_ref){.d0 = E, .d1 = 1, .p = AT(router_b, l * E)}, ADD("blk.%llu.ffn_gate_inp.bias", (unsigned long long)l);
            t[k] = (nv_tensor_ref){.d0 = h, .d1 = E, .p = AT(b1, l * E * h)}, ADD("blk.%llu.ffn_gate_exps.bias", (unsigned long long)l);
            t[k] = (nv_tensor_ref){.d0 = d, .d1 = E, .p = AT(b2, l * E * d)}, ADD("blk.%llu.ffn_down_exps.bias", (unsigned long long)l);
            t[k] = (nv_tensor_ref){.d0 = h, .d1 = E, .p = AT(b3, l * E * h)}, ADD("blk.%llu.ffn_up_exps.bias", (unsigned long long)l);
        }
        if (moe) t[k] = (nv_tensor_ref){.d0 = d, .d1 = E, .p = AT(router, l * E * d)}, ADD("blk.%llu.ffn_gate_inp.weight", (unsigned long long)l);
        if (c->qk_norm) { /* a head's weights, or (OLMo 2) the whole projection's */
            const uint64_t qn = (uint64_t)nv_config_q_norm_len(c), kn = (uint64_t)nv_config_k_norm_len(c);
            t[k] = (nv_tensor_ref){.d0 = qn, .d1 = 1, .p = AT(q_norm, l * qn)}, ADD("blk.%llu.attn_q_norm.weight", (unsigned long long)l);
            t[k] = (nv_tensor_ref){.d0 = kn, .d1 = 1, .p = AT(k_norm, l * kn)}, ADD("blk.%llu.attn_k_norm.weight", (unsigned long long)l);
        }
        if (c->qkv_bias) {
            t[k] = (nv_tensor_ref){.d0 = qd, .d1 = 1, .p = AT(bq, l * qd)}, ADD("blk.%llu.attn_q.bias", (unsigned long long)l);
            t[k] = (nv_tensor_ref){.d0 = kvd, .d1 = 1, .p = AT(bk, l * kvd)}, ADD("blk.%llu.attn_k.bias", (unsigned long long)l);
            t[k] = (nv_tensor_ref){.d0 = kvd, .d1 = 1, .p = AT(bv, l * kvd)}, ADD("blk.%llu.attn_v.bias", (unsigned long long)l);
        }
        if (c->post_norms) {
            t[k] = (nv_tensor_ref){.d0 = d, .d1 = 1, .p = AT(post_att, l * d)}, ADD("blk.%llu.post_attention_norm.weight", (unsigned long long)l);
            t[k] = (nv_tensor_ref){.d0 = d, .d1 = 1, .p = AT(post_ffn, l * d)}, ADD("blk.%llu.post_ffw_norm.weight", (unsigned long long)l);
        }
    }
#undef ADD
#undef AT
    return k;
}

/* llama.cpp's names of a layer's plan matrices, in plan order. */
static const char *const layer_parts[NV_LAYER_MATRICES] = {"attn_q",   "attn_k",   "attn_v", "attn_output",
                                                           "ffn_gate", "ffn_down", "ffn_up"};

/* The tensor name of plan matrix i (nv_model.quant's order). */
void nv_model_plan_tensor_name(const nv_config *c, int i, char *name, size_t cap, int *expert) {
    const int dense = c->n_layers * NV_LAYER_MATRICES;
    if (expert) *expert = 0;
    if (i < dense) {
        snprintf(name, cap, "blk.%d.%s.weight", i / NV_LAYER_MATRICES, layer_parts[i % NV_LAYER_MATRICES]);
    } else if (i == dense) {
        snprintf(name, cap, "%s", c->shared_classifier ? "token_embd.weight" : "output.weight");
    } else { /* an expert's, after the classifier */
        int l, x, k;
        nv_model_expert_of(c, i, &l, &x, &k);
        snprintf(name, cap, "blk.%d.%s_exps.weight", l, layer_parts[4 + k]);
        if (expert) *expert = x;
    }
}

/* The plan matrix a tensor name is (of an expert tensor, its first expert's: they are pending
 * together), or -1: nv_model_plan_tensor_name backwards, without a walk over a mixture's thousands. */
static int plan_of_name(const nv_config *c, const char *name) {
    const int dense = c->n_layers * NV_LAYER_MATRICES;
    if (!strcmp(name, c->shared_classifier ? "token_embd.weight" : "output.weight")) return dense;
    int l = -1, at = 0;
    if (sscanf(name, "blk.%d.%n", &l, &at) != 1 || !at || l < 0 || l >= c->n_layers) return -1;
    const size_t n = strlen(name + at);
    for (int p = 0; p < NV_LAYER_MATRICES; p++) {
        const size_t pl = strlen(layer_parts[p]);
        if (n < pl || memcmp(name + at, layer_parts[p], pl)) continue;
        if (!strcmp(name + at + pl, ".weight")) return l * NV_LAYER_MATRICES + p;
        if (p >= 4 && c->n_experts && !strcmp(name + at + pl, "_exps.weight")) return nv_model_expert_plan(c, l, 0, p - 4);
    }
    return -1;
}

int nv_model_pending(const nv_model *m, const char *name) {
    const int i = m && m->quant ? plan_of_name(&m->config, name) : -1;
    return i >= 0 && m->quant[i].pending;
}

/* Every tensor of the model, checked (m NULL) or converted into m's weights (but those pending). */
static nv_err take_all(const nv_gguf *g, const nv_config *c, nv_model *m) {
    nv_tensor_ref *t = calloc(nv_model_tensor_count(c), sizeof *t);
    if (!t) return nv_fail(NV_ENOMEM, "out of memory");
    size_t n = nv_model_tensor_map(c, m ? &m->w : NULL, t);
    nv_err e = NV_OK;
    for (size_t i = 0; i < n && e == NV_OK; i++) e = take(g, c, t[i].name, t[i].d0, t[i].d1, t[i].d2, nv_model_pending(m, t[i].name) ? NULL : t[i].p);
    free(t);
    return e;
}

/* Whether a plan matrix's fp32 weights are left unmade when the load asks for pending ones: never
 * the token embedding's, which lookups read. */
static int source_pending(const char *name, int pending) { return pending && strcmp(name, "token_embd.weight") != 0; }

nv_err nv_model_keep_half(nv_model *m, int i, const void *h, size_t n, int bf16, int pending) {
    const int count = nv_model_plan_count(&m->config);
    if (!m->quant && !(m->quant = calloc((size_t)count, sizeof *m->quant))) return nv_fail(NV_ENOMEM, "out of memory");
    char name[64];
    nv_model_plan_tensor_name(&m->config, i, name, sizeof name, NULL);
    nv_qmatrix *qm = &m->quant[i];
    qm->count = n;
    qm->pending = source_pending(name, pending);
    if (!(qm->h = malloc(n * sizeof(uint16_t)))) return nv_fail(NV_ENOMEM, "out of memory for %s's values", name);
    memcpy(qm->h, h, n * sizeof(uint16_t));
    qm->h_bf16 = bf16;
    return NV_OK;
}

/* The quantized and 16-bit plan matrices of the file as raw sources in m->quant (their blocks in the
 * mapping, made into engine.h's nv_qweights form only while a plan is built); with pending, marked
 * so that take_all leaves their fp32 values unmade (never the token embedding, which lookups read). */
static nv_err take_quant(const nv_gguf *g, nv_model *m, int pending) {
    const nv_config *c = &m->config;
    const int count = nv_model_plan_count(c);
    for (int i = 0; i < count; i++) {
        char name[64];
        int expert;
        nv_model_plan_tensor_name(c, i, name, sizeof name, &expert);
        nv_gguf_tensor view;
        const nv_gguf_tensor *t; /* present and of a loaded type: checked before */
        NV_TRY(tensor_rows(g, c, name, &view, &t));
        int qb, offset;
        if (!t || (!quant_form(t->type, &qb, &offset) && t->type != T_F16 && t->type != T_BF16)) continue;
        const uint64_t n = t->dims[0] * t->dims[1]; /* an expert's slice of its layer's tensor: whole rows, whole blocks */
        const uint64_t bytes = t->bytes / (t->dims[2] ? t->dims[2] : 1); /* of one expert's slice (the whole tensor's else) */
        if (!m->quant && !(m->quant = calloc((size_t)count, sizeof *m->quant))) return nv_fail(NV_ENOMEM, "out of memory");
        nv_qmatrix *qm = &m->quant[i];
        const int half = t->type == T_F16 || t->type == T_BF16; /* fp16 and bf16 plans: the values as they are */
        qm->count = (size_t)n;
        qm->pending = source_pending(name, pending);
        qm->qb = half ? 0 : qb;
        qm->h_bf16 = t->type == T_BF16;
        qm->raw = (const uint8_t *)t->data + (uint64_t)expert * bytes;
        qm->raw_bytes = (size_t)bytes;
        qm->raw_type = t->type;
    }
    return NV_OK;
}

static nv_err qmatrix_reorder(nv_qmatrix *qm, int cols, int heads, int hd, int rot, int to_half);

nv_err nv_qmatrix_materialize(nv_qmatrix *qm) {
    if (!qm->raw || qm->q || qm->h) return NV_OK;
    const size_t n = qm->count;
    if (qm->raw_type == T_F16 || qm->raw_type == T_BF16) {
        if (!(qm->h = malloc(n * sizeof(uint16_t)))) return nv_fail(NV_ENOMEM, "out of memory for a matrix's 16-bit values");
        memcpy(qm->h, qm->raw, n * sizeof(uint16_t));
    } else {
        int qb, offset;
        uint64_t bb = 0;
        quant_form(qm->raw_type, &qb, &offset);
        const uint64_t per = (uint64_t)block_of(qm->raw_type, &bb), nb = n / (uint64_t)qb;
        int mins;
        const int sub = quant_super(qm->raw_type, &mins);
        qm->q = malloc(n);
        qm->s = malloc((size_t)nb * sizeof(float));
        qm->o = offset ? malloc((size_t)nb * sizeof(float)) : NULL;
        if (sub) { /* the k-quants' integer form beside: an int8 engine's plan keeps it */
            qm->sub = sub;
            qm->sub_s = malloc((size_t)nb);
            qm->sup_s = malloc((size_t)(n / per) * sizeof(float));
            qm->sub_o = mins ? malloc((size_t)nb) : NULL;
            qm->sup_o = mins ? malloc((size_t)(n / per) * sizeof(float)) : NULL;
        }
        if (!qm->q || !qm->s || (offset && !qm->o) || (sub && (!qm->sub_s || !qm->sup_s || (mins && (!qm->sub_o || !qm->sup_o))))) {
            nv_qmatrix_release(qm);
            return nv_fail(NV_ENOMEM, "out of memory for a matrix's quantized values");
        }
        qm->lut = quant_lut(qm->raw_type);
        for (uint64_t b = 0; b < n / per; b++) { /* o is written only for the types with an offset */
            const uint64_t at = b * per / (uint64_t)qb;
            const super_out so = sub ? (super_out){qm->sub_s + at, mins ? qm->sub_o + at : NULL, qm->sup_s + b, mins ? qm->sup_o + b : NULL}
                                     : (super_out){0}; /* no arithmetic on the absent arrays */
            decompose_block(qm->raw_type, qm->raw + b * bb, qm->q + b * per, qm->s + at, offset ? qm->o + at : NULL, sub ? &so : NULL);
        }
    }
    nv_file_release(qm->raw, qm->raw_bytes); /* read: the file's pages need not stay */
    /* a query or key matrix: in this project's RoPE order (the arrays exist now, so they are reordered) */
    const nv_err e = qm->raw_heads ? qmatrix_reorder(qm, (int)(n / ((size_t)qm->raw_heads * (size_t)qm->raw_hd)), qm->raw_heads, qm->raw_hd, qm->raw_rot, 0)
                                   : NV_OK;
    if (e != NV_OK) nv_qmatrix_release(qm);
    return e;
}

void nv_qmatrix_kind(const nv_qmatrix *qm, int kind[3]) {
    int qb = 0, offset = 0;
    const int raw = qm->raw && !qm->q && !qm->h, t = (int)qm->raw_type;
    const int half = qm->h || (raw && (t == T_F16 || t == T_BF16)), quant = qm->q || (raw && quant_form(qm->raw_type, &qb, &offset));
    kind[0] = half ? -1 - qm->h_bf16 : quant ? qm->qb : 0;
    kind[1] = qm->q ? qm->o != NULL : raw && offset;
    /* a raw source's 4 bits from its type (the values of Q4_0, Q4_1, Q4_K, Q2_K and Q3_K are 0..15 by construction) */
    kind[2] = qm->lut || (raw && quant_lut(qm->raw_type)) ? 2 /* 4-bit indices into a table */
              : qm->q ? nv_qweights_four_bit(qm->q, qm->count)
                      : raw && (t == T_Q4_0 || t == T_Q4_1 || t == T_Q4_K || t == T_Q2_K || t == T_Q3_K);
}

void nv_qmatrix_release(nv_qmatrix *qm) {
    if (!qm->raw) return; /* arrays that are the only form of the matrix stay */
    nv_qmatrix_free_arrays(qm);
}

/* Reorders the rows of each head of a matrix (heads x hd rows of row_bytes) between this project's
 * RoPE order, which rotates rows (2i, 2i + 1), and the order of qwen3 files, which rotate rows
 * (i, i + rot/2), among the first rot rows of a head (all hd but with partial rotation; the rest stay):
 * to_half moves row 2i to i and row 2i + 1 to i + rot/2, else back. The attention scores are the same
 * either way (q and k reordered alike; QK-norm's weights with them). */
nv_err nv_rope_rows_reorder(void *base, size_t row_bytes, int heads, int hd, int rot, int to_half) {
    if (!base) return NV_OK;
    uint8_t *tmp = malloc((size_t)rot * row_bytes);
    if (!tmp) return nv_fail(NV_ENOMEM, "out of memory");
    for (int h = 0; h < heads; h++) {
        uint8_t *head = (uint8_t *)base + (size_t)h * hd * row_bytes;
        memcpy(tmp, head, (size_t)rot * row_bytes);
        for (int i = 0; i < rot / 2; i++)
            for (int e = 0; e < 2; e++) {
                const size_t pair = (size_t)(2 * i + e), half = (size_t)(i + e * (rot / 2));
                memcpy(head + (to_half ? half : pair) * row_bytes, tmp + (to_half ? pair : half) * row_bytes, row_bytes);
            }
    }
    free(tmp);
    return NV_OK;
}

/* A block-quantized or fp16 source of heads x hd rows, reordered as nv_rope_rows_reorder. */
static nv_err qmatrix_reorder(nv_qmatrix *qm, int cols, int heads, int hd, int rot, int to_half) {
    if (qm->raw && !qm->q && !qm->h && !to_half) { /* raw blocks: reordered whenever they are made into arrays */
        qm->raw_heads = heads, qm->raw_hd = hd, qm->raw_rot = rot;
        return NV_OK;
    }
    if (qm->h) return nv_rope_rows_reorder(qm->h, (size_t)cols * sizeof(uint16_t), heads, hd, rot, to_half);
    if (!qm->q) return NV_OK;
    const size_t blocks = (size_t)(cols / qm->qb), scales = blocks * sizeof(float);
    NV_TRY(nv_rope_rows_reorder(qm->q, (size_t)cols, heads, hd, rot, to_half));
    NV_TRY(nv_rope_rows_reorder(qm->s, scales, heads, hd, rot, to_half));
    NV_TRY(nv_rope_rows_reorder(qm->o, scales, heads, hd, rot, to_half));
    if (!qm->sub) return NV_OK; /* the integer form: rows of blocks' bytes, and of floats per super-block */
    NV_TRY(nv_rope_rows_reorder(qm->sub_s, blocks, heads, hd, rot, to_half));
    NV_TRY(nv_rope_rows_reorder(qm->sub_o, blocks, heads, hd, rot, to_half));
    const size_t supers = blocks / (size_t)qm->sub * sizeof(float);
    NV_TRY(nv_rope_rows_reorder(qm->sup_s, supers, heads, hd, rot, to_half));
    return nv_rope_rows_reorder(qm->sup_o, supers, heads, hd, rot, to_half);
}

/* The fp32 weights unless pending, and the quantized sources. */
nv_err nv_model_qk_reorder(nv_model *m, int to_half) {
    const nv_config *c = &m->config;
    const int d = c->dim, hd = c->head_dim, rot = nv_config_rope_dim(c), qd = nv_config_q_dim(c), kvd = nv_config_kv_dim(c);
    for (int l = 0; l < c->n_layers; l++) {
        nv_qmatrix *qq = m->quant ? &m->quant[l * NV_LAYER_MATRICES + 0] : NULL;
        nv_qmatrix *qk = m->quant ? &m->quant[l * NV_LAYER_MATRICES + 1] : NULL;
        if (!qq || !qq->pending) NV_TRY(nv_rope_rows_reorder(m->w.wq + (size_t)l * qd * d, (size_t)d * 4, c->n_heads, hd, rot, to_half));
        if (!qk || !qk->pending) NV_TRY(nv_rope_rows_reorder(m->w.wk + (size_t)l * kvd * d, (size_t)d * 4, c->n_kv_heads, hd, rot, to_half));
        if (qq) NV_TRY(qmatrix_reorder(qq, d, c->n_heads, hd, rot, to_half));
        if (qk) NV_TRY(qmatrix_reorder(qk, d, c->n_kv_heads, hd, rot, to_half));
        if (c->qk_norm) { /* a head's weights, or every head's (OLMo 2) */
            const int qn = nv_config_q_norm_len(c), kn = nv_config_k_norm_len(c);
            NV_TRY(nv_rope_rows_reorder(m->w.q_norm + (size_t)l * qn, 4, qn / hd, hd, rot, to_half));
            NV_TRY(nv_rope_rows_reorder(m->w.k_norm + (size_t)l * kn, 4, kn / hd, hd, rot, to_half));
        }
        if (c->qkv_bias) {
            NV_TRY(nv_rope_rows_reorder(m->w.bq + (size_t)l * qd, 4, c->n_heads, hd, rot, to_half));
            NV_TRY(nv_rope_rows_reorder(m->w.bk + (size_t)l * kvd, 4, c->n_kv_heads, hd, rot, to_half));
        }
    }
    return NV_OK;
}

nv_err nv_gguf_read_config(const char *path, nv_config *c) {
    nv_gguf g;
    NV_TRY(nv_gguf_open(path, &g));
    nv_err e = config_of(&g, c, NULL);
    nv_gguf_close(&g);
    return e;
}

/* llama.cpp's classification head of a reranker (cls.output.weight [dim][rows], cls.output.bias
 * [rows]), as fp32 in m->cls_head; none is NV_OK. */
#define MAX_CLS_ROWS 64
static nv_err take_cls_head(const nv_gguf *g, nv_model *m) {
    const nv_gguf_tensor *w = nv_gguf_tensor_find(g, "cls.output.weight"), *b = nv_gguf_tensor_find(g, "cls.output.bias");
    if (!w) return b ? nv_fail(NV_EFORMAT, "%s: cls.output.bias without cls.output.weight", g->path) : NV_OK;
    const int d = m->config.dim;
    const uint64_t rows = w->n_dims == 1 ? 1 : w->dims[1];
    if (w->n_dims > 2 || w->dims[0] != (uint64_t)d || rows < 1)
        return nv_fail(NV_EFORMAT, "%s: cls.output.weight is not [%d][rows]", g->path, d);
    if (rows > MAX_CLS_ROWS) { /* a classifier of many labels: not a reranker's; the language model loads */
        nv_warn("%s: its classification head (cls.output) has %llu outputs: ignored", g->path, (unsigned long long)rows);
        return NV_OK;
    }
    if (b && (b->n_dims != 1 || b->dims[0] != rows))
        return nv_fail(NV_EFORMAT, "%s: cls.output.bias does not have cls.output.weight's %d rows", g->path, (int)rows);
    if (!w->bytes || (b && !b->bytes))
        return nv_fail(NV_EUNSUPPORTED, "%s: cls.output has type %s: not converted", g->path, nv_gguf_type_name(w->bytes ? b->type : w->type));
    float *head = calloc(rows * (uint64_t)(d + 1), sizeof *head);
    if (!head) return nv_fail(NV_ENOMEM, "out of memory for the classification head");
    nv_err e = nv_gguf_dequant(w->type, w->data, rows * (uint64_t)d, head);
    if (e == NV_OK && b) e = nv_gguf_dequant(b->type, b->data, rows, head + rows * (uint64_t)d);
    if (e != NV_OK) {
        free(head);
        return nv_fail(NV_EFORMAT, "%s: cls.output: %s", g->path, nv_errmsg());
    }
    m->cls_head = head;
    m->n_cls_head = (int)rows;
    return NV_OK;
}

/* {arch}.pooling_type (llama.cpp's numbers): mean, the first row or the last in m->pooling; none (0),
 * rank (4) and unspecified (-1) leave the server's default. */
static nv_err take_pooling(const nv_gguf *g, nv_model *m) {
    size_t an = 0;
    const char *arch = nv_gguf_string(g, "general.architecture", &an);
    char key[96];
    snprintf(key, sizeof key, "%.*s.pooling_type", (int)(an < 64 ? an : 64), arch ? arch : "");
    if (!arch || !nv_gguf_find(g, key)) return NV_OK;
    int64_t v;
    NV_TRY(get_int(g, key, 0, &v));
    /* (a later kind is no reason to refuse the model: embeddings then pool as --pooling or the mean) */
    if (v < -1 || v > 4) nv_warn("%s: its pooling_type %lld is not one nerve knows (-1 to 4): ignored", g->path, (long long)v);
    m->pooling = v >= NV_POOLING_MEAN && v <= NV_POOLING_LAST ? (int)v : NV_POOLING_DEFAULT;
    return NV_OK;
}

static nv_err load_model(const char *path, nv_model *m, int pending) {
    memset(m, 0, sizeof *m);
    nv_gguf g;
    NV_TRY(nv_gguf_open(path, &g));
    nv_config c;
    /* the whole model is checked before any weight memory is taken (the fp32 block is zeroed
       memory: what is never written, pending matrices, is never touched) */
    int neox = 0;
    nv_err e = config_of(&g, &c, &neox);
    if (e == NV_OK) e = take_all(&g, &c, NULL);
    if (e == NV_OK) e = nv_model_alloc(m, &c);
    if (e == NV_OK && ((e = take_quant(&g, m, pending)) != NV_OK || (e = take_all(&g, &c, m)) != NV_OK ||
                       (neox && (e = nv_model_qk_reorder(m, 0)) != NV_OK) || (e = take_cls_head(&g, m)) != NV_OK ||
                       (e = take_pooling(&g, m)) != NV_OK))
        nv_model_free(m);
    if (e == NV_OK && m->quant) { /* the raw sources point into the mappings: the model keeps them */
        if (!(m->source_maps = malloc((1 + (size_t)g.n_shards) * sizeof *m->source_maps))) {
            nv_model_free(m);
            e = nv_fail(NV_ENOMEM, "out of memory");
        } else {
            m->source_maps[m->n_source_maps++] = g.map;
            for (uint32_t i = 0; i < g.n_shards; i++) m->source_maps[m->n_source_maps++] = g.shards[i];
            g.map = (nv_mapped){0};
            g.n_shards = 0;
        }
    }
    nv_gguf_close(&g);
    return e;
}

nv_err nv_gguf_load_model(const char *path, nv_model *m) { return load_model(path, m, 0); }
nv_err nv_gguf_load_model_quantized(const char *path, nv_model *m) { return load_model(path, m, 1); }

/* ---- the tokenizer ------------------------------------------------------------------------- */

int nv_gguf_has_vocab(const char *path) {
    nv_gguf g;
    if (nv_gguf_open(path, &g) != NV_OK) return 0;
    int yes = nv_gguf_find(&g, "tokenizer.ggml.tokens") != NULL;
    nv_gguf_close(&g);
    return yes;
}

nv_err nv_gguf_tokenizer_bytes(const char *path, uint8_t **out, size_t *len) {
    *out = NULL;
    *len = 0;
    nv_gguf g;
    NV_TRY(nv_gguf_open(path, &g));
    nv_err e = NV_OK;
    size_t n = 0;
    const char *model = nv_gguf_string(&g, "tokenizer.ggml.model", &n);
    const nv_gguf_kv *toks = nv_gguf_find(&g, "tokenizer.ggml.tokens"), *scores = nv_gguf_find(&g, "tokenizer.ggml.scores");
    int64_t bos = 1;
    if (!model || !toks) e = nv_fail(NV_EFORMAT, "%s: no tokenizer in this GGUF file (tokenizer.ggml.model/tokens)", path);
    else if (!name_is(model, n, "llama")) {
        char sm[128];
        e = nv_fail(NV_EUNSUPPORTED, "%s: tokenizer '%s' has no llama2.c tokenizer.bin form (llama's SentencePiece only)", path,
                    nv_gguf_shown(model, n, sm, sizeof sm));
    }
    else if (toks->type != GG_ARR || toks->elem != GG_STR || toks->count < 3 || toks->count > (1u << 24))
        e = nv_fail(NV_EFORMAT, "%s: tokenizer.ggml.tokens is not a list of 3 to 2^24 strings", path);
    else if (scores && (scores->type != GG_ARR || scores->elem != GG_F32 || scores->count != toks->count))
        e = nv_fail(NV_EFORMAT, "%s: tokenizer.ggml.scores is not one float per token", path);
    else e = get_int(&g, "tokenizer.ggml.bos_token_id", 1, &bos);
    if (e != NV_OK) {
        nv_gguf_close(&g);
        return e;
    }
    const int n_tok = (int)toks->count;
    const char **piece = malloc((size_t)n_tok * sizeof *piece);
    size_t *plen = malloc((size_t)n_tok * sizeof *plen);
    float *score = calloc((size_t)n_tok, sizeof *score);
    if (!piece || !plen || !score) e = nv_fail(NV_ENOMEM, "%s: out of memory for the vocabulary", path);
    gg_cursor c = {nv_reader_make(toks->val, (size_t)(g.map.data + g.map.len - toks->val), path), g.version >= 2};
    for (int i = 0; e == NV_OK && i < n_tok; i++) {
        rd_string(&c, &piece[i], &plen[i], "token"); /* checked at open */
        if (scores) memcpy(&score[i], scores->val + 4 * (size_t)i, 4);
    }
    /* llama's ids (BOS 1) in llama2.c's form; another layout (Gemma's) keeps its pieces, its types say what is special */
    if (e == NV_OK) e = nv_spm_bytes(path, n_tok, piece, plen, score, bos == NV_TOKEN_BOS, out, len);
    free(piece);
    free(plen);
    free(score);
    nv_gguf_close(&g);
    return e;
}

nv_err nv_spm_bytes(const char *path, int n, const char *const *piece, const size_t *plen, const float *score, int llama2c_ids,
                    uint8_t **out, size_t *len) {
    /* llama2.c's layout: int32 max length, then per token float score, int32 length, bytes */
    size_t total = 4;
    for (int i = 0; i < n; i++) total += 8 + (plen[i] > 7 ? plen[i] : 7); /* room for BOS/EOS written as "\n</s>\n" */
    uint8_t *buf = malloc(total), *p = buf + 4;
    if (!buf) return nv_fail(NV_ENOMEM, "%s: out of memory for the vocabulary", path);
    int32_t longest = 1;
    for (int i = 0; i < n; i++) {
        const char *s = piece[i];
        size_t sl = plen[i];
        if (llama2c_ids && (i == NV_TOKEN_BOS || i == NV_TOKEN_EOS)) { /* as llama2.c's export writes them: no text can spell them */
            s = i == NV_TOKEN_BOS ? "\n<s>\n" : "\n</s>\n";
            sl = strlen(s);
        }
        memcpy(p, &score[i], 4);
        uint8_t *dst = p + 8;
        size_t k = 0;
        for (size_t j = 0; j < sl; j++) {
            if (j + 2 < sl && (uint8_t)s[j] == 0xE2 && (uint8_t)s[j + 1] == 0x96 && (uint8_t)s[j + 2] == 0x81) {
                dst[k++] = ' '; /* SentencePiece's word boundary */
                j += 2;
            } else
                dst[k++] = (uint8_t)s[j];
        }
        int32_t kl = (int32_t)k;
        memcpy(p + 4, &kl, 4);
        if (kl > longest) longest = kl;
        p += 8 + k;
    }
    if (longest > 65536) longest = 65536; /* the header is a hint; longer pieces still load */
    memcpy(buf, &longest, 4);
    *out = buf;
    *len = (size_t)(p - buf);
    return NV_OK;
}

const char *nv_gguf_vocab_model(const nv_gguf *g, char *out, size_t cap) {
    size_t n = 0;
    const char *model = nv_gguf_string(g, "tokenizer.ggml.model", &n);
    if (!model || !cap) return NULL;
    size_t k = n < cap - 1 ? n : cap - 1;
    memcpy(out, model, k);
    out[k] = '\0';
    return out;
}

/* The strings of a string array as pointers into the mapping; *out is allocated here. */
static nv_err str_array(const nv_gguf *g, const nv_gguf_kv *kv, const char *key, uint64_t max, const char ***out,
                        int **lens, int *count) {
    if (kv->type != GG_ARR || kv->elem != GG_STR || kv->count > max)
        return nv_fail(NV_EFORMAT, "%s: %s is not a list of at most %llu strings", g->path, key, (unsigned long long)max);
    const char **s = malloc((kv->count ? kv->count : 1) * sizeof *s);
    int *l = malloc((kv->count ? kv->count : 1) * sizeof *l);
    if (!s || !l) {
        free(s);
        free(l);
        return nv_fail(NV_ENOMEM, "%s: out of memory for %s", g->path, key);
    }
    gg_cursor c = {nv_reader_make(kv->val, (size_t)(g->map.data + g->map.len - kv->val), g->path), g->version >= 2};
    for (uint64_t i = 0; i < kv->count; i++) {
        size_t sl = 0;
        rd_string(&c, &s[i], &sl, key); /* checked at open */
        if (sl > 65536) {
            free(s);
            free(l);
            return nv_fail(NV_EFORMAT, "%s: %s[%llu] is %zu bytes long", g->path, key, (unsigned long long)i, sl);
        }
        l[i] = (int)sl;
    }
    *out = s;
    *lens = l;
    *count = (int)kv->count;
    return NV_OK;
}

/* An optional token id: absent or negative is -1; past the vocabulary too, with a warning (as
 * llama.cpp ignores such ids: files that mean "none" write -1 as an unsigned value). */
static nv_err get_token_id(const nv_gguf *g, const char *key, int n_tokens, int *out) {
    int64_t v;
    NV_TRY(get_int(g, key, INT64_MAX, &v));
    *out = -1;
    if (v == INT64_MAX || v < 0) return NV_OK;
    if (v >= n_tokens) nv_warn("%s: %s is %lld but the vocabulary has %d tokens; ignored", g->path, key, (long long)v, n_tokens);
    else *out = (int)v;
    return NV_OK;
}

static nv_err get_bool(const nv_gguf *g, const char *key, int dflt, int *out) {
    const nv_gguf_kv *kv = nv_gguf_find(g, key);
    if (!kv) {
        *out = dflt;
        return NV_OK;
    }
    if (kv->type != GG_BOOL) return nv_fail(NV_EFORMAT, "%s: metadata '%s' is not a boolean", g->path, key);
    *out = *kv->val != 0;
    return NV_OK;
}

static nv_err vocab_meta(const nv_gguf *g, nv_gguf_bpe *v);

void nv_gguf_bpe_free(nv_gguf_bpe *v) {
    free(v->tok);
    free(v->tok_len);
    free(v->tok_type);
    free(v->merge);
    free(v->merge_len);
    memset(v, 0, sizeof *v);
}

nv_err nv_gguf_bpe_vocab(const nv_gguf *g, nv_gguf_bpe *v) {
    memset(v, 0, sizeof *v);
    const nv_gguf_kv *toks = nv_gguf_find(g, "tokenizer.ggml.tokens"), *merges = nv_gguf_find(g, "tokenizer.ggml.merges");
    if (!toks || !merges)
        return nv_fail(NV_EFORMAT, "%s: a gpt2 (byte-level BPE) vocabulary needs tokenizer.ggml.tokens and tokenizer.ggml.merges",
                       g->path);
    nv_err e = str_array(g, toks, "tokenizer.ggml.tokens", 1u << 24, &v->tok, &v->tok_len, &v->n_tokens);
    if (e == NV_OK && v->n_tokens < 256)
        e = nv_fail(NV_EFORMAT, "%s: %d tokens; a byte-level BPE vocabulary has at least the 256 bytes", g->path, v->n_tokens);
    if (e == NV_OK) e = str_array(g, merges, "tokenizer.ggml.merges", 1u << 24, &v->merge, &v->merge_len, &v->n_merges);
    if (e == NV_OK) e = vocab_meta(g, v);
    if (e != NV_OK) nv_gguf_bpe_free(v);
    return e;
}

nv_err nv_gguf_spm_meta(const nv_gguf *g, nv_gguf_bpe *v) {
    memset(v, 0, sizeof *v);
    const nv_gguf_kv *toks = nv_gguf_find(g, "tokenizer.ggml.tokens");
    if (!toks || toks->type != GG_ARR || toks->count > (1u << 24))
        return nv_fail(NV_EFORMAT, "%s: tokenizer.ggml.tokens is not a list of at most 2^24 strings", g->path);
    v->n_tokens = (int)toks->count;
    const nv_err e = vocab_meta(g, v);
    if (e != NV_OK) nv_gguf_bpe_free(v);
    return e;
}

/* The token types (normal where absent), the special ids and add_bos of a vocabulary of
 * v->n_tokens. */
static nv_err vocab_meta(const nv_gguf *g, nv_gguf_bpe *v) {
    const nv_gguf_kv *types = nv_gguf_find(g, "tokenizer.ggml.token_type");
    nv_err e = NV_OK;
    if (!(v->tok_type = malloc((size_t)(v->n_tokens ? v->n_tokens : 1) * sizeof *v->tok_type)))
        e = nv_fail(NV_ENOMEM, "%s: out of memory for the token types", g->path);
    if (e == NV_OK) {
        if (types && (types->type != GG_ARR || types->elem != GG_I32 || types->count != (uint64_t)v->n_tokens))
            e = nv_fail(NV_EFORMAT, "%s: tokenizer.ggml.token_type is not one int32 per token", g->path);
        for (int i = 0; e == NV_OK && i < v->n_tokens; i++) {
            int32_t t = 1; /* normal */
            if (types) memcpy(&t, types->val + 4 * (size_t)i, 4);
            v->tok_type[i] = t;
        }
    }
    size_t pn = 0;
    const char *pre = nv_gguf_string(g, "tokenizer.ggml.pre", &pn);
    if (pre) snprintf(v->pre, sizeof v->pre, "%.*s", (int)(pn < sizeof v->pre ? pn : sizeof v->pre - 1), pre);
    if (e == NV_OK) e = get_token_id(g, "tokenizer.ggml.bos_token_id", v->n_tokens, &v->bos);
    if (e == NV_OK) e = get_token_id(g, "tokenizer.ggml.eos_token_id", v->n_tokens, &v->eos);
    if (e == NV_OK) e = get_token_id(g, "tokenizer.ggml.eot_token_id", v->n_tokens, &v->eot);
    if (e == NV_OK) e = get_token_id(g, "tokenizer.ggml.eom_token_id", v->n_tokens, &v->eom);
    if (e == NV_OK) e = get_token_id(g, "tokenizer.ggml.unknown_token_id", v->n_tokens, &v->unk);
    if (e == NV_OK) e = get_bool(g, "tokenizer.ggml.add_bos_token", -1, &v->add_bos);
    if (e == NV_OK) e = get_bool(g, "tokenizer.ggml.add_eos_token", -1, &v->add_eos);
    if (e == NV_OK) e = get_bool(g, "tokenizer.ggml.add_space_prefix", -1, &v->add_space);
    return e;
}

/* ---- the writer ---------------------------------------------------------------------------- */

static void ob_u32(nv_buf *b, uint32_t v) { nv_buf_append(b, &v, 4); }
static void ob_u64(nv_buf *b, uint64_t v) { nv_buf_append(b, &v, 8); }
static void ob_str(nv_buf *b, const char *s, size_t n) {
    ob_u64(b, n);
    nv_buf_append(b, s, n);
}
static void ob_key(nv_buf *b, const char *key, uint32_t type) {
    ob_str(b, key, strlen(key));
    ob_u32(b, type);
}
static void kv_u32(nv_buf *b, const char *key, uint32_t v) {
    ob_key(b, key, GG_U32);
    ob_u32(b, v);
}
static void kv_i32(nv_buf *b, const char *key, int32_t v) {
    ob_key(b, key, GG_I32);
    nv_buf_append(b, &v, 4);
}
static void kv_f32(nv_buf *b, const char *key, float v) {
    ob_key(b, key, GG_F32);
    nv_buf_append(b, &v, 4);
}
static void kv_bool(nv_buf *b, const char *key, int v) {
    ob_key(b, key, GG_BOOL);
    nv_buf_append(b, &(uint8_t){(uint8_t)(v != 0)}, 1);
}
static void kv_str(nv_buf *b, const char *key, const char *v) {
    ob_key(b, key, GG_STR);
    ob_str(b, v, strlen(v));
}

/* A version 3 header with n_tensors; returns where its metadata count goes (filled in later) and
 * writes general.architecture, the first metadata value. */
static size_t ob_header(nv_buf *b, uint64_t n_tensors, const char *arch) {
    nv_buf_append(b, "GGUF", 4);
    ob_u32(b, 3);
    ob_u64(b, n_tensors);
    const size_t kv_at = b->len;
    ob_u64(b, 0);
    kv_str(b, "general.architecture", arch);
    return kv_at;
}

/* tokenizer.ggml.add_eos_token where the vocabulary adds EOS (an embedding model's): how many keys, 0 or 1. */
static int kv_add_eos(nv_buf *b, const nv_tokenizer *tok) {
    if (!nv_tokenizer_adds_eos(tok)) return 0;
    kv_bool(b, "tokenizer.ggml.add_eos_token", 1);
    return 1;
}

/* A byte-level vocabulary as it was read: pieces, types, merges "A B" in rank order, the
 * pre-tokenizer's name and the special ids. */
static int vocab_kvs_bpe(nv_buf *b, const nv_tokenizer *tok, const nv_bpe_view *v) {
    const int n = nv_tokenizer_vocab_size(tok);
    int count = 5; /* model, tokens, token_type, merges, add_bos_token; then pre and the ids present */
    kv_str(b, "tokenizer.ggml.model", "gpt2");
    if (v->pre[0]) { /* as read: a file that named none gets none */
        kv_str(b, "tokenizer.ggml.pre", v->pre);
        count++;
    }
    ob_key(b, "tokenizer.ggml.tokens", GG_ARR);
    ob_u32(b, GG_STR);
    ob_u64(b, (uint64_t)n);
    for (int i = 0; i < n; i++) ob_str(b, nv_tokenizer_piece(tok, i), strlen(nv_tokenizer_piece(tok, i)));
    ob_key(b, "tokenizer.ggml.token_type", GG_ARR);
    ob_u32(b, GG_I32);
    ob_u64(b, (uint64_t)n);
    for (int i = 0; i < n; i++) {
        int32_t type = v->type[i];
        nv_buf_append(b, &type, 4);
    }
    ob_key(b, "tokenizer.ggml.merges", GG_ARR);
    ob_u32(b, GG_STR);
    ob_u64(b, (uint64_t)v->n_merges);
    for (int r = 0; r < v->n_merges; r++) {
        const char *l = nv_tokenizer_piece(tok, v->merge_pair[2 * r]), *rt = nv_tokenizer_piece(tok, v->merge_pair[2 * r + 1]);
        ob_u64(b, strlen(l) + 1 + strlen(rt));
        nv_buf_append(b, l, strlen(l));
        nv_buf_append(b, " ", 1);
        nv_buf_append(b, rt, strlen(rt));
    }
    const struct {
        const char *key;
        int id;
    } ids[] = {{"tokenizer.ggml.bos_token_id", v->bos}, {"tokenizer.ggml.eos_token_id", v->eos},
               {"tokenizer.ggml.eot_token_id", v->eot}, {"tokenizer.ggml.eom_token_id", v->eom}};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if (ids[i].id >= 0) {
            kv_u32(b, ids[i].key, (uint32_t)ids[i].id);
            count++;
        }
    kv_bool(b, "tokenizer.ggml.add_bos_token", v->add_bos != 0);
    count += kv_add_eos(b, tok);
    return count;
}

/* The vocabulary as GGUF's SentencePiece arrays: pieces with U+2581 for spaces, scores, types
 * (a byte-level one as its own arrays). */
static int vocab_kvs(nv_buf *b, const nv_tokenizer *tok) {
    nv_bpe_view v;
    if (nv_tokenizer_bpe_view(tok, &v)) return vocab_kvs_bpe(b, tok, &v);
    const int n = nv_tokenizer_vocab_size(tok);
    kv_str(b, "tokenizer.ggml.model", "llama");
    ob_key(b, "tokenizer.ggml.tokens", GG_ARR);
    ob_u32(b, GG_STR);
    ob_u64(b, (uint64_t)n);
    for (int i = 0; i < n; i++) {
        const char *p = nv_tokenizer_special_text(tok, i);
        size_t len = 0;
        for (const char *q = p; *q; q++) len += *q == ' ' ? 3 : 1;
        ob_u64(b, len);
        for (const char *q = p; *q; q++) nv_buf_append(b, *q == ' ' ? "\xe2\x96\x81" : q, *q == ' ' ? 3 : 1);
    }
    ob_key(b, "tokenizer.ggml.scores", GG_ARR);
    ob_u32(b, GG_F32);
    ob_u64(b, (uint64_t)n);
    for (int i = 0; i < n; i++) {
        float s = nv_tokenizer_score(tok, i);
        nv_buf_append(b, &s, 4);
    }
    ob_key(b, "tokenizer.ggml.token_type", GG_ARR); /* 1 normal, 2 unknown, 3 control, 6 byte */
    ob_u32(b, GG_I32);
    ob_u64(b, (uint64_t)n);
    for (int i = 0; i < n; i++) {
        const char *p = nv_tokenizer_piece(tok, i);
        int32_t type = nv_tokenizer_type(tok, i); /* the file's own, else llama2.c's layout */
        if (!type) type = i == NV_TOKEN_UNK ? 2 : i <= NV_TOKEN_EOS ? 3 : nv_byte_piece(p, strlen(p)) >= 0 ? 6 : 1;
        nv_buf_append(b, &type, 4);
    }
    kv_u32(b, "tokenizer.ggml.unknown_token_id", (uint32_t)nv_tokenizer_unk(tok));
    kv_u32(b, "tokenizer.ggml.bos_token_id", (uint32_t)nv_tokenizer_bos(tok));
    kv_u32(b, "tokenizer.ggml.eos_token_id", (uint32_t)nv_tokenizer_eos(tok));
    int count = 7;
    if (!nv_tokenizer_space_prefix(tok)) { /* SentencePiece's dummy prefix off, as the vocabulary read said */
        kv_bool(b, "tokenizer.ggml.add_space_prefix", 0);
        count++;
    }
    count += kv_add_eos(b, tok);
    return count;
}

/* x (n values, n a multiple of 32) as Q8_0 blocks, as llama.cpp's quantize_row_q8_0_ref. */
static void quantize_q8_0(const float *x, uint64_t n, uint64_t d0, const float *imp, uint8_t *out) {
    (void)d0, (void)imp; /* as llama.cpp's: Q8_0 takes no importance */
    for (uint64_t b = 0; b < n / QK; b++, x += QK, out += 34) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        put_half(out, d);
        for (int j = 0; j < QK; j++) { /* clamped: a non-finite or vanishing block must not overflow int8 */
            const float v = x[j] * id;
            out[2 + j] = (uint8_t)(int8_t)roundf(v != v ? 0.0f : fminf(127.0f, fmaxf(-127.0f, v)));
        }
    }
}

static void quantize_sym_weighted(const float *x, uint64_t n, uint64_t d0, const float *imp, uint8_t *out, int five);

/* A block's QK values (0..15, or 0..31 with five) as Q4_0's nibbles after its scale (value j low,
 * j + 16 high), or Q5_0's: their fifth bits in a 32-bit mask, then the nibbles. */
static void pack_q4_q5(const int *q, uint8_t *out, int five) {
    uint32_t qh = 0;
    uint8_t *qs = out + (five ? 6 : 2);
    for (int j = 0; j < QK / 2; j++) {
        qs[j] = (uint8_t)((q[j] & 0xF) | (q[j + QK / 2] & 0xF) << 4);
        qh |= (uint32_t)(q[j] >> 4) << j | (uint32_t)(q[j + QK / 2] >> 4) << (j + 16);
    }
    if (five) memcpy(out + 2, &qh, 4);
}

/* x (n values, n a multiple of 32) as Q4_0 blocks, as llama.cpp's quantize_row_q4_0_ref; with an
 * importance per column (imp, rows of d0), each block's scale fitted to it instead. */
static void quantize_q4_0(const float *x, uint64_t n, uint64_t d0, const float *imp, uint8_t *out) {
    if (imp) {
        quantize_sym_weighted(x, n, d0, imp, out, 0);
        return;
    }
    for (uint64_t b = 0; b < n / QK; b++, x += QK, out += 18) {
        float amax = 0.0f, max = 0.0f; /* the value of largest magnitude, with its sign */
        for (int j = 0; j < QK; j++)
            if (amax < fabsf(x[j])) amax = fabsf(x[j]), max = x[j];
        const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        put_half(out, d);
        int q[QK];
        for (int j = 0; j < QK; j++) { /* clamped before the cast, as quantize_q8_0 */
            const float v = x[j] * id + 8.5f;
            q[j] = v != v ? 8 : (int)fminf(15.0f, fmaxf(0.0f, v));
        }
        pack_q4_q5(q, out, 0);
    }
}

/* x (n values, n a multiple of 32) as Q5_0 blocks, as llama.cpp's quantize_row_q5_0_ref: scale
 * -(the value of largest magnitude)/16, values 0..31 around 16, the fifth bits in a 32-bit mask (with
 * imp, fitted as quantize_q4_0's). */
static void quantize_q5_0(const float *x, uint64_t n, uint64_t d0, const float *imp, uint8_t *out) {
    if (imp) {
        quantize_sym_weighted(x, n, d0, imp, out, 1);
        return;
    }
    for (uint64_t b = 0; b < n / QK; b++, x += QK, out += 22) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK; j++)
            if (amax < fabsf(x[j])) amax = fabsf(x[j]), max = x[j];
        const float d = max / -16.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        put_half(out, d);
        int q[QK];
        for (int j = 0; j < QK; j++) {
            const float v = x[j] * id + 16.5f;
            q[j] = v != v ? 16 : (int)fminf(31.0f, fmaxf(0.0f, v));
        }
        pack_q4_q5(q, out, 1);
    }
}

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }
/* Nearest integer of a finite float (a NaN or infinity: 0). */
static inline int near_int(float v) {
    if (fabsf(v) < 1e9f) return (int)lrintf(v); /* the fits' inner loops: no libm call for the common case */
    return isfinite(v) ? (v > 0 ? 1000000000 : -1000000000) : 0;
}

/* The k-quants' sub-block fits. Each value weighs av + |x| (av: the root mean square of its
 * super-block), so the large values a product is most sensitive to are kept best; candidate scales
 * around the range's are tried, each refined by least squares, and the smallest weighted error
 * wins. With a minimum (Q4_K): x ~ a*q - m, q in 0..nmax, a >= 0, m >= 0 (the range always holds 0);
 * returns a and m. */
static void fit_scale_min(const float *x, const float *w, int n, int nmax, float *a_out, float *m_out) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]);
    if (lo > 0) lo = 0;
    if (!(hi > lo)) { /* constant (or not finite) */
        *a_out = 0;
        *m_out = isfinite(lo) ? -lo : 0;
        return;
    }
    float best_a = (hi - lo) / (float)nmax, best_c = lo, best_err = INFINITY;
    for (int step = 0; step <= 20; step++) {
        const float is = ((float)nmax - 1.0f + 0.1f * (float)step) / (hi - lo);
        double sw = 0, sl = 0, sl2 = 0, sx = 0, sxl = 0;
        for (int i = 0; i < n; i++) {
            const int l = clampi(near_int(is * (x[i] - lo)), 0, nmax);
            sw += w[i], sl += w[i] * l, sl2 += w[i] * l * l, sx += w[i] * x[i], sxl += w[i] * x[i] * l;
        }
        const double det = sw * sl2 - sl * sl;
        if (det <= 0) continue;
        double a = (sw * sxl - sx * sl) / det, c = (sl2 * sx - sl * sxl) / det;
        if (c > 0) c = 0, a = sl2 > 0 ? sxl / sl2 : 0;
        if (a <= 0) continue;
        double err = 0;
        for (int i = 0; i < n; i++) {
            const int l = clampi(near_int((float)((x[i] - c) / a)), 0, nmax);
            const double e = a * l + c - x[i];
            err += w[i] * e * e;
        }
        if (err < best_err) best_err = (float)err, best_a = (float)a, best_c = (float)c;
    }
    *a_out = best_a;
    *m_out = -best_c;
}

/* Symmetric (Q6_K): x ~ a*q, q in -nmax..nmax-1 (a of either sign); returns a. */
static float fit_scale(const float *x, const float *w, int n, int nmax) {
    float amax = 0, max = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]), max = x[i];
    if (!(amax > 0) || !isfinite(amax)) return 0;
    float best_a = max / -(float)nmax, best_err = INFINITY;
    for (int step = -9; step <= 9; step++) {
        const float is = -((float)nmax + 0.1f * (float)step) / max;
        double sxl = 0, sl2 = 0;
        for (int i = 0; i < n; i++) {
            const int l = clampi(near_int(is * x[i]), -nmax, nmax - 1);
            sxl += w[i] * x[i] * l, sl2 += w[i] * l * l;
        }
        if (sl2 <= 0) continue;
        const double a = sxl / sl2;
        double err = 0;
        for (int i = 0; i < n; i++) {
            const int l = clampi(near_int((float)(x[i] / a)), -nmax, nmax - 1);
            const double e = a * l - x[i];
            err += w[i] * e * e;
        }
        if (err < best_err) best_err = (float)err, best_a = (float)a;
    }
    return best_a;
}

/* The weights of a super-block's values (fit_scale_min, fit_scale): av + |x|, or with an importance
 * per column imp[i] * sqrt(2 av^2 + x^2) (llama.cpp's rule for Q4_K with an imatrix). */
static void kquant_weights(const float *x, const float *imp, float *w) {
    double ss = 0;
    for (int i = 0; i < QK_K; i++) ss += (double)x[i] * x[i];
    const float av = isfinite(ss) ? (float)sqrt(ss / QK_K) : 0;
    for (int i = 0; i < QK_K; i++)
        w[i] = !isfinite(x[i]) ? 0 : imp ? imp[i] * sqrtf(2 * av * av + x[i] * x[i]) : av + fabsf(x[i]);
}

/* Q4_0 (five 0) or Q5_0 blocks whose scales are fitted to the importance of each column (imp, rows
 * of d0 values): each value weighs imp * sqrt(sigma2 + x^2), sigma2 its row's mean square (llama.cpp's
 * rule), and the scale of least weighted error among candidates around the range's (fit_scale) wins;
 * the values are then rounded against the scale as stored. */
static void quantize_sym_weighted(const float *x, uint64_t n, uint64_t d0, const float *imp, uint8_t *out, int five) {
    const int nmax = five ? 16 : 8, bytes = five ? 22 : 18;
    float w[QK];
    for (uint64_t r = 0; r < n / d0; r++) {
        const float *row = x + r * d0;
        double ss = 0;
        for (uint64_t j = 0; j < d0; j++) ss += isfinite(row[j]) ? (double)row[j] * row[j] : 0;
        const float sigma2 = (float)(ss / (double)d0);
        for (uint64_t b = 0; b < d0 / QK; b++, out += bytes) {
            const float *xb = row + b * QK, *ib = imp + b * QK;
            for (int j = 0; j < QK; j++) w[j] = isfinite(xb[j]) ? ib[j] * sqrtf(sigma2 + xb[j] * xb[j]) : 0;
            put_half(out, fit_scale(xb, w, QK, nmax));
            const float d = half_at(out);
            int q[QK];
            for (int j = 0; j < QK; j++) q[j] = nmax + (d != 0 ? clampi(near_int(xb[j] / d), -nmax, nmax - 1) : 0);
            pack_q4_q5(q, out, five);
        }
    }
}

/* A super-block's sub-block scales and minimums (subs sub-blocks of QK_K / subs values 0..nmax,
 * fitted by fit_scale_min to its values weighing w), stored as integers ls, lm in 0..levels of the
 * fp16 d and dmin (the largest of each over levels) put at dp and mp; then in L the values against
 * the scales as stored. */
static void unsigned_sub_scales(const float *x, const float *w, int subs, int nmax, int levels, uint8_t *ls, uint8_t *lm,
                                uint8_t *dp, uint8_t *mp, uint8_t *L) {
    const int size = QK_K / subs;
    float sc[16], mn[16], max_sc = 0, max_mn = 0;
    for (int j = 0; j < subs; j++) {
        fit_scale_min(x + size * j, w + size * j, size, nmax, &sc[j], &mn[j]);
        max_sc = fmaxf(max_sc, sc[j]), max_mn = fmaxf(max_mn, mn[j]);
    }
    const float isc = max_sc > 0 ? (float)levels / max_sc : 0, imn = max_mn > 0 ? (float)levels / max_mn : 0;
    for (int j = 0; j < subs; j++)
        ls[j] = (uint8_t)clampi(near_int(isc * sc[j]), 0, levels), lm[j] = (uint8_t)clampi(near_int(imn * mn[j]), 0, levels);
    put_half(dp, max_sc / (float)levels);
    put_half(mp, max_mn / (float)levels);
    const float d = half_at(dp), dmin = half_at(mp);
    for (int j = 0; j < subs; j++) {
        const float a = d * (float)ls[j], m = dmin * (float)lm[j];
        for (int i = 0; i < size; i++)
            L[size * j + i] = (uint8_t)(a > 0 ? clampi(near_int((x[size * j + i] + m) / a), 0, nmax) : 0);
    }
}

/* x (n values, n a multiple of 256) as Q4_K (five 0) or Q5_K super-blocks: 8 sub-blocks of 32, each
 * a 6-bit scale and min of the fp16 d and dmin (the largest of them over 63), values 0..15 (Q5_K:
 * 0..31, the fifth bits in 32 bytes before the nibbles; the decoder: decompose_block). */
static void quantize_qk(const float *x, uint64_t n, uint64_t d0, const float *imp, uint8_t *out, int five) {
    const int nmax = five ? 31 : 15, bytes = five ? 176 : 144;
    float w[QK_K];
    for (uint64_t b = 0; b < n / QK_K; b++, x += QK_K, out += bytes) {
        uint8_t *q = out + 4, ls[8], lm[8], L[QK_K];
        kquant_weights(x, imp ? imp + b * QK_K % d0 : NULL, w);
        unsigned_sub_scales(x, w, 8, nmax, 63, ls, lm, out, out + 2, L);
        memset(q, 0, 12);
        for (int j = 0; j < 8; j++) {
            if (j < 4) { /* scale_min_k4's packing */
                q[j] |= ls[j], q[j + 4] |= lm[j];
            } else {
                q[j + 4] = (uint8_t)((ls[j] & 0xF) | (lm[j] & 0xF) << 4);
                q[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
                q[j] |= (uint8_t)((lm[j] >> 4) << 6);
            }
        }
        uint8_t *qh = out + 16, *qs = out + (five ? 48 : 16);
        if (five) memset(qh, 0, 32);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                const int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
                qs[32 * c + l] = (uint8_t)((lo & 0xF) | (hi & 0xF) << 4);
                if (five) qh[l] |= (uint8_t)((lo >> 4) << (2 * c) | (hi >> 4) << (2 * c + 1));
            }
    }
}
static void quantize_q4_k(const float *x, uint64_t n, uint64_t d0, const float *imp, uint8_t *out) { quantize_qk(x, n, d0, imp, out, 0); }
static void quantize_q5_k(const float *x, uint64_t n, uint64_t d0, const float *imp, uint8_t *out) { quantize_qk(x, n, d0, imp, out, 1); }

/* x (n values, n a multiple of 32) as Q5_1 blocks (five) or Q4_1 ones, as llama.cpp's
 * quantize_row_q5_1_ref / q4_1_ref: scale (max - min)/31 (/15) and the minimum, values 0..31 (0..15)
 * from it (Q5_1: the fallback of Q5_K); with an importance per column (imp, rows of d0), the scale
 * and minimum fitted to it as the k-quants' (fit_scale_min). */
static void quantize_asym(const float *x, uint64_t n, uint64_t d0, const float *imp, uint8_t *out, int five) {
    float w[QK];
    const int top = five ? 31 : 15, qs = five ? 8 : 4; /* the largest value; where the nibbles start */
    for (uint64_t b = 0; b < n / QK; b++, x += QK, out += five ? 24 : 20) {
        float lo = x[0], hi = x[0];
        for (int j = 1; j < QK; j++) lo = fminf(lo, x[j]), hi = fmaxf(hi, x[j]);
        float d = (hi - lo) / (float)top, id = d != 0.0f ? 1.0f / d : 0.0f;
        if (imp) {
            const float *ib = imp + b * QK % d0;
            double ss = 0;
            for (int j = 0; j < QK; j++) ss += isfinite(x[j]) ? (double)x[j] * x[j] : 0;
            for (int j = 0; j < QK; j++) w[j] = isfinite(x[j]) ? ib[j] * sqrtf((float)(ss / QK) + x[j] * x[j]) : 0;
            float a, m;
            fit_scale_min(x, w, QK, top, &a, &m);
            d = as_half(a), lo = as_half(-m), id = d != 0.0f ? 1.0f / d : 0.0f; /* the values against the scale as stored */
        }
        put_half(out, d);
        put_half(out + 2, lo);
        uint32_t qh = 0;
        for (int j = 0; j < QK / 2; j++) {
            const float v0 = (x[j] - lo) * id + 0.5f, v1 = (x[j + QK / 2] - lo) * id + 0.5f;
            const int q0 = v0 != v0 ? 0 : (int)fminf((float)top, fmaxf(0.0f, v0)), q1 = v1 != v1 ? 0 : (int)fminf((float)top, fmaxf(0.0f, v1));
            out[qs + j] = (uint8_t)((q0 & 0xF) | (q1 & 0xF) << 4);
            qh |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + 16);
        }
        if (five) memcpy(out + 4, &qh, 4);
    }
}

static void quantize_q5_1(const float *x, uint64_t n, uint64_t d0, const float *imp, uint8_t *out) { quantize_asym(x, n, d0, imp, out, 1); }
static void quantize_q4_1(const float *x, uint64_t n, uint64_t d0, const float *imp, uint8_t *out) { quantize_asym(x, n, d0, imp, out, 0); }

/* The index of the IQ4 value nearest v (the lower one at a tie; a NaN: 0), by bisection of the
 * sorted table: the export's fits ask this for every value of every candidate scale. */
static int iq4_nearest(float v) {
    int lo = 0, hi = 15;
    if (!(v > (float)iq4_values[0])) return 0;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (v < (float)iq4_values[mid]) hi = mid;
        else lo = mid;
    }
    return v - (float)iq4_values[lo] <= (float)iq4_values[hi] - v ? lo : hi;
}

/* The scale a of x ~ a * iq4_values[L] (n values weighing w) among candidates that map the value
 * of largest magnitude near either end of the table, each refined by least squares; 0 for an
 * all-zero (or not finite) block. */
static float fit_iq4(const float *x, const float *w, int n) {
    float amax = 0, max = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]), max = x[i];
    if (!(amax > 0) || !isfinite(amax)) return 0;
    float best_a = max / (float)iq4_values[0];
    double best = -1;
    for (int step = -7; step <= 7; step++)
        for (int end = 0; end < 2; end++) { /* the largest value toward -127 or toward 113 */
            const float is = ((float)(end ? iq4_values[15] : iq4_values[0]) + (float)step) / max;
            double sqx = 0, sq2 = 0;
            for (int i = 0; i < n; i++) {
                const float q = (float)iq4_values[iq4_nearest(is * x[i])];
                sqx += w[i] * q * x[i], sq2 += w[i] * q * q;
            }
            if (sq2 > 0 && sqx * sqx / sq2 > best) best = sqx * sqx / sq2, best_a = (float)(sqx / sq2);
        }
    return best_a;
}

/* A super-block's signed sub-block scales (16 sub-blocks of 16 fitted by fit_scale with nmax, or
 * with nmax 0, 8 of 32 by fit_iq4), each to its values weighing w, stored as integers ls in
 * -levels..levels-1 of one fp16 d (the largest scale over -levels) put at dp; returns d as stored. */
static float signed_sub_scales(const float *x, const float *w, int nmax, int levels, int *ls, uint8_t *dp) {
    const int subs = nmax ? 16 : 8, size = QK_K / subs;
    float sc[16], max_sc = 0, amax = 0;
    for (int j = 0; j < subs; j++) {
        sc[j] = nmax ? fit_scale(x + size * j, w + size * j, size, nmax) : fit_iq4(x + size * j, w + size * j, size);
        if (fabsf(sc[j]) > amax) amax = fabsf(sc[j]), max_sc = sc[j];
    }
    const float isc = amax > 0 ? -(float)levels / max_sc : 0;
    for (int j = 0; j < subs; j++) ls[j] = clampi(near_int(isc * sc[j]), -levels, levels - 1);
    put_half(dp, isc != 0 ? 1.0f / isc : 0.0f);
    return half_at(dp);
}

/* A super-block's values -nmax..nmax-1 (16 sub-blocks of 16) against their scales d * ls as stored, + nmax. */
static void signed_values(const float *x, float d, const int *ls, int nmax, uint8_t *L) {
    for (int j = 0; j < 16; j++) {
        const float a = d * (float)ls[j];
        for (int i = 0; i < 16; i++) L[16 * j + i] = (uint8_t)(nmax + (a != 0 ? clampi(near_int(x[16 * j + i] / a), -nmax, nmax - 1) : 0));
    }
}

/* x (n values, n a multiple of 256) as Q6_K super-blocks: 16 sub-blocks of 16, each an int8 scale
 * of the fp16 d, values -32..31 stored as 0..63 in low nibbles and high bit pairs. */
static void quantize_q6_k(const float *x, uint64_t n, uint64_t d0, const float *imp, uint8_t *out) {
    float w[QK_K];
    for (uint64_t b = 0; b < n / QK_K; b++, x += QK_K, out += 210) {
        int ls[16];
        uint8_t L[QK_K];
        kquant_weights(x, imp ? imp + b * QK_K % d0 : NULL, w);
        const float d = signed_sub_scales(x, w, 32, 128, ls, out + 208);
        for (int j = 0; j < 16; j++) out[192 + j] = (uint8_t)(int8_t)ls[j];
        signed_values(x, d, ls, 32, L);
        uint8_t *ql = out, *qh = out + 128;
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *v = L + 128 * h;
                ql[64 * h + l] = (uint8_t)((v[l] & 0xF) | (v[l + 64] & 0xF) << 4);
                ql[64 * h + l + 32] = (uint8_t)((v[l + 32] & 0xF) | (v[l + 96] & 0xF) << 4);
                qh[32 * h + l] = (uint8_t)(v[l] >> 4 | (v[l + 32] >> 4) << 2 | (v[l + 64] >> 4) << 4 | (v[l + 96] >> 4) << 6);
            }
    }
}

/* A super-block's 2-bit values (Q2_K) or 3-bit ones (Q3_K) into their bytes: value i's two low bits
 * in bits 2j of byte i % 32 of its half of 128 (j = i % 128 / 32); Q3_K's third bits (hm) in bit
 * i / 32 of byte i % 32 of hm. */
static void pack_low_k(const uint8_t *L, uint8_t *qs, uint8_t *hm) {
    if (hm) memset(hm, 0, 32);
    memset(qs, 0, 64);
    for (int i = 0; i < QK_K; i++) {
        qs[32 * (i / 128) + i % 32] |= (uint8_t)((L[i] & 3) << (2 * (i % 128 / 32)));
        if (hm) hm[i % 32] |= (uint8_t)((L[i] >> 2) << (i / 32));
    }
}

/* x (n values, n a multiple of 256) as Q2_K super-blocks: 16 sub-blocks of 16, each a 4-bit scale
 * and min of the fp16 d and dmin (the largest of them over 15), values 0..3. */
static void quantize_q2_k(const float *x, uint64_t n, uint64_t d0, const float *imp, uint8_t *out) {
    float w[QK_K];
    for (uint64_t b = 0; b < n / QK_K; b++, x += QK_K, out += 84) {
        uint8_t ls[16], lm[16], L[QK_K];
        kquant_weights(x, imp ? imp + b * QK_K % d0 : NULL, w);
        unsigned_sub_scales(x, w, 16, 3, 15, ls, lm, out + 80, out + 82, L);
        for (int j = 0; j < 16; j++) out[j] = (uint8_t)(ls[j] | lm[j] << 4);
        pack_low_k(L, out + 16, NULL);
    }
}

/* x (n values, n a multiple of 256) as Q3_K super-blocks: 16 sub-blocks of 16, each a 6-bit signed
 * scale of the fp16 d, values -4..3 (two bits and a third bit per value). */
static void quantize_q3_k(const float *x, uint64_t n, uint64_t d0, const float *imp, uint8_t *out) {
    float w[QK_K];
    for (uint64_t b = 0; b < n / QK_K; b++, x += QK_K, out += 110) {
        int ls[16];
        uint8_t L[QK_K], *scales = out + 96;
        kquant_weights(x, imp ? imp + b * QK_K % d0 : NULL, w);
        const float d = signed_sub_scales(x, w, 4, 32, ls, out + 108);
        memset(scales, 0, 12);
        for (int j = 0; j < 16; j++) { /* decompose_block's packing: low nibbles in bytes 0..7, high pairs in 8..11 */
            const int l = ls[j] + 32;
            scales[j % 8] |= (uint8_t)((l & 0xF) << (j < 8 ? 0 : 4));
            scales[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
        }
        signed_values(x, d, ls, 4, L);
        pack_low_k(L, out + 32, out);
    }
}

/* The weights of a block's values for fit_iq4: with an importance per column imp[i] * sqrt(sigma2 +
 * x^2) (sigma2: the mean square of the values around), else x^2 (as llama.cpp's IQ4 quantizers). */
static void iq4_weights(const float *x, const float *imp, int n, float sigma2, float *w) {
    for (int i = 0; i < n; i++) w[i] = !isfinite(x[i]) ? 0 : imp ? imp[i] * sqrtf(sigma2 + x[i] * x[i]) : x[i] * x[i];
}

static float mean_square(const float *x, uint64_t n) {
    double ss = 0;
    for (uint64_t i = 0; i < n; i++) ss += isfinite(x[i]) ? (double)x[i] * x[i] : 0;
    return (float)(ss / (double)n);
}

/* 32 values against the scale d as stored, two indices to a byte as Q4_0's nibbles. */
static void pack_iq4(const float *x, float d, uint8_t *qs) {
    const float id = d != 0 ? 1.0f / d : 0;
    for (int j = 0; j < QK / 2; j++)
        qs[j] = (uint8_t)(iq4_nearest(x[j] * id) | iq4_nearest(x[j + QK / 2] * id) << 4);
}

/* x (n values, n a multiple of 32) as IQ4_NL blocks: an fp16 scale and 32 indices into iq4_values. */
static void quantize_iq4_nl(const float *x, uint64_t n, uint64_t d0, const float *imp, uint8_t *out) {
    float w[QK];
    for (uint64_t r = 0; r < n / d0; r++) {
        const float *row = x + r * d0, sigma2 = mean_square(row, d0);
        for (uint64_t b = 0; b < d0 / QK; b++, out += 18) {
            iq4_weights(row + b * QK, imp ? imp + b * QK : NULL, QK, sigma2, w);
            put_half(out, fit_iq4(row + b * QK, w, QK));
            pack_iq4(row + b * QK, half_at(out), out + 2);
        }
    }
}

/* x (n values, n a multiple of 256) as IQ4_XS super-blocks: 8 sub-blocks of 32 indices into
 * iq4_values, each a 6-bit signed scale of the fp16 d (low nibbles in 4 bytes, high pairs in 16 bits). */
static void quantize_iq4_xs(const float *x, uint64_t n, uint64_t d0, const float *imp, uint8_t *out) {
    float w[QK_K];
    for (uint64_t b = 0; b < n / QK_K; b++, x += QK_K, out += 136) {
        int ls[16];
        iq4_weights(x, imp ? imp + b * QK_K % d0 : NULL, QK_K, 2 * mean_square(x, QK_K), w);
        const float d = signed_sub_scales(x, w, 0, 32, ls, out);
        unsigned high = 0;
        memset(out + 4, 0, 4);
        for (int j = 0; j < 8; j++) {
            const int l = ls[j] + 32;
            out[4 + j / 2] |= (uint8_t)((l & 0xF) << (4 * (j % 2)));
            high |= (unsigned)(l >> 4) << (2 * j);
            pack_iq4(x + 32 * j, d * (float)ls[j], out + 8 + 16 * j);
        }
        out[2] = (uint8_t)high, out[3] = (uint8_t)(high >> 8);
    }
}

/* x as MXFP4 blocks, as ggml's reference quantizer makes them: the exponent e = floor(log2 max|x|) + 125
 * (the scale 2^(e - 128) puts the largest value between 8 and 16 of it: 12 the most a value holds),
 * each value the nearest of mxfp4_values (the lower index on a tie). */
static int mxfp4_nearest(float v) {
    int best = 0;
    for (int i = 1; i < 16; i++)
        if (fabsf(v - (float)mxfp4_values[i]) < fabsf(v - (float)mxfp4_values[best])) best = i;
    return best;
}

static void quantize_mxfp4(const float *x, uint64_t n, uint64_t d0, const float *imp, uint8_t *out) {
    (void)d0, (void)imp;
    for (uint64_t blk = 0; blk < n / QK; blk++, x += QK, out += 17) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax; /* (NaN: ignored) */
        const int e = amax > 0.0f && isfinite(amax) ? clampi((int)floorf(log2f(amax)) - 2 + 127, 0, 254) : 0;
        const float d = ldexpf(1.0f, e - 128);
        out[0] = (uint8_t)e;
        for (int j = 0; j < QK / 2; j++) out[1 + j] = (uint8_t)(mxfp4_nearest(x[j] / d) | mxfp4_nearest(x[j + QK / 2] / d) << 4);
    }
}

/* x (n values) as F16. */
static void quantize_f16(const float *x, uint64_t n, uint64_t d0, const float *imp, uint8_t *out) {
    (void)d0, (void)imp;
    for (uint64_t v = 0; v < n; v++) put_half(out + 2 * v, x[v]);
}

/* x (n values) as BF16 (round to nearest even: fp32's range, 8 significand bits). */
static void quantize_bf16(const float *x, uint64_t n, uint64_t d0, const float *imp, uint8_t *out) {
    (void)d0, (void)imp;
    for (uint64_t v = 0; v < n; v++) {
        const uint16_t h = nv_bf16_from_f32(x[v]);
        memcpy(out + 2 * v, &h, 2);
    }
}

/* The type a tensor gets in a file of `type` (the writer's codes; NV_GGUF_Q4_K and the others of a
 * mix are llama.cpp's mixes, llama_tensor_get_type's rules for a dense model): vectors stay F32;
 * every quantized type but Q8_0 gives Q6_K to the classifier (the token embedding when it is the
 * classifier too); with an importance matrix, Q4_0 and Q5_0 give Q4_1 and Q5_1 to ffn_down in the
 * first eighth of the layers;
 * Q4_K_M and Q5_K_M give Q6_K to attn_v and ffn_down in the first and last eighth of the layers and
 * every third between; Q3_K_M gives attn_v Q5_K in the first two layers and Q4_K after, ffn_down
 * Q5_K in the first sixteenth and Q4_K after, attn_output Q4_K; Q2_K gives attn_v Q4_K with four or
 * more query heads per key head (Q3_K with fewer), ffn_down and attn_output Q3_K; IQ4_NL and IQ4_XS
 * give attn_v Q5_K with four or more query heads per key head and, without an importance matrix,
 * ffn_down Q5_K in the first eighth; Q3_K_S is Q3_K and Q5_K_S Q5_K throughout; Q3_K_L gives attn_v,
 * attn_output and ffn_down Q5_K; Q4_K_S gives attn_v Q5_K in the first four layers and ffn_down in
 * the first eighth. A k-quant whose rows are not whole super-blocks of 256 falls
 * back as llama.cpp's does (Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0, Q2_K, Q3_K and IQ4_XS to
 * IQ4_NL), a block type whose rows are not whole blocks of 32 to F32. pure: none of those rules but
 * the fallbacks. */
static uint32_t tensor_type(const nv_config *c, const nv_tensor_ref *t, uint32_t type, int has_imatrix, int pure) {
    /* a mixture's router stays F32, as llama.cpp keeps it: its logits choose the experts; so do
       gpt-oss's biases (the experts' are [E] rows) and sinks */
    if (type == NV_GGUF_F32 || t->d1 == 1 || strstr(t->name, ".ffn_gate_inp.") || strstr(t->name, ".bias")) return T_F32;
    if (type == NV_GGUF_MXFP4_MOE) /* llama.cpp's MXFP4_MOE: the experts in MXFP4, the other matrices Q8_0 */
        return t->d0 % QK ? T_F32 : strstr(t->name, "_exps.weight") ? T_MXFP4 : T_Q8_0;
    if (type == NV_GGUF_F16) return T_F16;
    if (type == NV_GGUF_BF16) return T_BF16;
    unsigned layer = 0;
    char part[32] = "";
    const int L = c->n_layers, in_layer = sscanf(t->name, "blk.%u.%31[a-z_]", &layer, part) == 2, i = (int)layer;
    const int attn_v = in_layer && !strcmp(part, "attn_v"), attn_out = in_layer && !strcmp(part, "attn_output");
    const int ffn_down = in_layer && (!strcmp(part, "ffn_down") || !strcmp(part, "ffn_down_exps"));
    const int more_bits = i < L / 8 || i >= 7 * L / 8 || (i - L / 8) % 3 == 2, gqa4 = c->n_heads >= 4 * c->n_kv_heads;
    if (pure) { /* the mix's own type for every matrix (llama-quantize --pure) */
        type = type == NV_GGUF_Q3_K_S || type == NV_GGUF_Q3_K_L ? T_Q3_K
               : type == NV_GGUF_Q4_K_S                         ? T_Q4_K
               : type == NV_GGUF_Q5_K_S                         ? T_Q5_K
                                                                : type; /* the others' codes are their types */
    } else if (!strcmp(t->name, "output.weight") || (c->shared_classifier && !strcmp(t->name, "token_embd.weight"))) {
        if (type != NV_GGUF_Q8_0) type = T_Q6_K;
    } else if ((type == NV_GGUF_Q4_0 || type == NV_GGUF_Q5_0) && has_imatrix) {
        /* llama.cpp's guard for the first eighth's ffn_down, whose blocks Q4_0 and Q5_0 fit badly even
           with an importance matrix */
        if (ffn_down && i < L / 8) type = type == NV_GGUF_Q4_0 ? T_Q4_1 : T_Q5_1;
    } else if (type == NV_GGUF_Q4_K || type == NV_GGUF_Q5_K) {
        type = (attn_v || ffn_down) && more_bits ? T_Q6_K : type == NV_GGUF_Q4_K ? T_Q4_K : T_Q5_K;
    } else if (type == NV_GGUF_Q3_K) {
        type = attn_v ? (i < 2 ? T_Q5_K : T_Q4_K) : ffn_down ? (i < L / 16 ? T_Q5_K : T_Q4_K) : attn_out ? T_Q4_K : T_Q3_K;
    } else if (type == NV_GGUF_Q3_K_S || type == NV_GGUF_Q3_K_L) {
        type = type == NV_GGUF_Q3_K_L && (attn_v || attn_out || ffn_down) ? T_Q5_K : T_Q3_K;
    } else if (type == NV_GGUF_Q4_K_S) {
        type = (attn_v && i < 4) || (ffn_down && i < L / 8) ? T_Q5_K : T_Q4_K;
    } else if (type == NV_GGUF_Q5_K_S) {
        type = T_Q5_K;
    } else if (type == NV_GGUF_Q2_K) {
        type = attn_v ? (gqa4 ? T_Q4_K : T_Q3_K) : ffn_down || attn_out ? T_Q3_K : T_Q2_K;
    } else if (type == NV_GGUF_IQ4_NL || type == NV_GGUF_IQ4_XS) {
        if ((attn_v && gqa4) || (ffn_down && i < L / 8 && !has_imatrix)) type = T_Q5_K;
    }
    if ((type == T_Q2_K || type == T_Q3_K || type == T_Q4_K || type == T_Q5_K || type == T_Q6_K || type == T_IQ4_XS) && t->d0 % QK_K)
        type = type == T_Q4_K ? T_Q5_0 : type == T_Q5_K ? T_Q5_1 : type == T_Q6_K ? T_Q8_0 : T_IQ4_NL;
    return t->d0 % QK ? T_F32 : type;
}

nv_err nv_model_half_view(const nv_model *m, nv_model *view, float **copy) {
    const nv_config *c = &m->config;
    *view = (nv_model){.config = *c, .w = m->w};
    const size_t L = (size_t)c->n_layers, d = (size_t)c->dim;
    const size_t qd = (size_t)nv_config_q_dim(c), kvd = (size_t)nv_config_kv_dim(c), nq = L * qd * d, nk = L * kvd * d;
    const size_t qn = c->qk_norm ? L * (size_t)nv_config_q_norm_len(c) : 0, kn = c->qk_norm ? L * (size_t)nv_config_k_norm_len(c) : 0;
    const size_t extra = qn + kn + (c->qkv_bias ? L * (qd + kvd) : 0);
    float *p = *copy = malloc((nq + nk + extra) * sizeof(float));
    if (!p) return nv_fail(NV_ENOMEM, "out of memory for a copy of the query and key weights");
    view->w.wq = memcpy(p, m->w.wq, nq * sizeof(float));
    view->w.wk = memcpy(p += nq, m->w.wk, nk * sizeof(float));
    p += nk;
    if (c->qk_norm) {
        view->w.q_norm = memcpy(p, m->w.q_norm, qn * sizeof(float));
        view->w.k_norm = memcpy(p += qn, m->w.k_norm, kn * sizeof(float));
        p += kn;
    }
    if (c->qkv_bias) {
        view->w.bq = memcpy(p, m->w.bq, L * qd * sizeof(float));
        view->w.bk = memcpy(p + L * qd, m->w.bk, L * kvd * sizeof(float));
    }
    nv_err e = nv_model_qk_reorder(view, 1);
    if (e != NV_OK) {
        free(*copy);
        *copy = NULL;
    }
    return e;
}

/* 1 for the tensor types whose quantizers take an importance per column. */
static int takes_importance(uint32_t tt) {
    return tt == T_Q4_0 || tt == T_Q4_1 || tt == T_Q5_0 || tt == T_Q5_1 || tt == T_Q2_K || tt == T_Q3_K || tt == T_Q4_K || tt == T_Q5_K ||
           tt == T_Q6_K || tt == T_IQ4_NL || tt == T_IQ4_XS;
}

typedef void (*quantize_fn)(const float *, uint64_t, uint64_t, const float *, uint8_t *);

/* One slice of a tensor quantized over the thread pool: its rows split into runs of whole rows
 * (every quantizer's blocks and importances restart with a row), so the bytes are those of one
 * call over the slice. */
typedef struct {
    quantize_fn quantize;
    const float *x, *imp;
    uint64_t rows, d0, row_bytes;
    uint8_t *out;
} quantize_job;

static void quantize_rows_task(void *vc, int task, int n_tasks) {
    const quantize_job *j = vc;
    const uint64_t r0 = j->rows * (uint64_t)task / (uint64_t)n_tasks, r1 = j->rows * (uint64_t)(task + 1) / (uint64_t)n_tasks;
    if (r1 > r0) j->quantize(j->x + r0 * j->d0, (r1 - r0) * j->d0, j->d0, j->imp, j->out + r0 * j->row_bytes);
}

/* 1 when entry en can weigh tensor t's quantization: its columns are t's rows, and it holds one matrix
 * or one per expert of a stacked expert tensor (or, read from llama.cpp's .dat, where an entry is one
 * row of every expert's columns, all of them in one). */
static int imatrix_fits(const nv_imatrix_entry *en, const nv_tensor_ref *t) {
    const uint64_t experts = t->d2 ? t->d2 : 1;
    if ((uint64_t)en->k == t->d0) return en->n_mat == 1 || (uint64_t)en->n_mat == experts;
    return experts > 1 && en->n_mat == 1 && (uint64_t)en->k == t->d0 * experts;
}

size_t nv_tensor_parts_of(nv_tensor_ref *t, nv_tensor_parts *tp, size_t n, int phi3) {
    for (size_t i = 0; i < n; i++) tp[i] = (nv_tensor_parts){{t[i].p}, {nv_tensor_rows(&t[i])}, 1, ""};
    if (!phi3) return n;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned layer = 0;
        char part[32] = "";
        const int in_layer = sscanf(t[i].name, "blk.%u.%31[a-z_]", &layer, part) == 2;
        const int qkv = in_layer && !strcmp(part, "attn_q"), gate = in_layer && !strcmp(part, "ffn_gate");
        if (in_layer && !strcmp(part, "ffn_up")) continue; /* joined to ffn_gate's */
        t[k] = t[i], tp[k] = tp[i];
        if (qkv || gate) { /* map order: attn_q, attn_k, attn_v; ffn_gate, ffn_down, ffn_up */
            const size_t with[2] = {qkv ? i + 1 : i + 2, qkv ? i + 2 : 0};
            snprintf(tp[k].first, sizeof tp[k].first, "%s", t[i].name);
            for (int j = 0; j < (qkv ? 2 : 1); j++) {
                tp[k].p[tp[k].n] = t[with[j]].p, tp[k].rows[tp[k].n++] = t[with[j]].d1;
                t[k].d1 += t[with[j]].d1;
            }
            snprintf(t[k].name, sizeof t[k].name, "blk.%u.%s.weight", layer, qkv ? "attn_qkv" : "ffn_up");
            if (qkv) i += 2;
        }
        k++;
    }
    return k;
}

/* The importance matrix's entry for tensor t (phi3's fused ones: under their own name, else their first part's). */
static const nv_imatrix_entry *tensor_importance(const nv_imatrix *im, const nv_tensor_ref *t, const nv_tensor_parts *tp) {
    const nv_imatrix_entry *en = nv_imatrix_find(im, t->name);
    return en || !tp->first[0] ? en : nv_imatrix_find(im, tp->first);
}

/* The file of split no (from 0) of n (malloc'd): path itself when not split, else llama-gguf-split's
 * name of it (nv_gguf_split_name). */
static char *split_path(const char *path, const nv_gguf_split *split, int no, int n) {
    if (!split) return strdup(path);
    const size_t cap = strlen(path) + 32;
    char *out = malloc(cap);
    if (out && nv_gguf_split_name(path, no, n, out, cap) != NV_OK) free(out), out = NULL;
    return out;
}

static void kv_u16(nv_buf *b, const char *key, uint16_t v) {
    ob_key(b, key, GG_U16);
    nv_buf_append(b, &v, 2);
}

nv_err nv_gguf_save(const nv_model *m, const nv_tokenizer *tok, const char *name, const char *path, uint32_t type,
                    const char *chat_template, const struct nv_imatrix *imatrix) {
    return nv_gguf_save_split(m, tok, name, path, type, chat_template, imatrix, NULL);
}

nv_err nv_gguf_save_split(const nv_model *m, const nv_tokenizer *tok, const char *name, const char *path, uint32_t type,
                          const char *chat_template, const struct nv_imatrix *imatrix, nv_gguf_split *split) {
    const nv_config *c = &m->config;
    const int pure = (type & NV_GGUF_PURE) != 0;
    type &= ~NV_GGUF_PURE;
    if (type != NV_GGUF_F32 && type != NV_GGUF_F16 && type != NV_GGUF_BF16 && type != NV_GGUF_Q8_0 && type != NV_GGUF_Q4_0 &&
        type != NV_GGUF_Q5_0 && type != NV_GGUF_Q4_K && type != NV_GGUF_Q5_K && type != NV_GGUF_Q6_K && type != NV_GGUF_Q3_K &&
        type != NV_GGUF_Q2_K && type != NV_GGUF_IQ4_NL && type != NV_GGUF_IQ4_XS && type != NV_GGUF_Q3_K_S && type != NV_GGUF_Q3_K_L &&
        type != NV_GGUF_Q4_K_S && type != NV_GGUF_Q5_K_S && type != NV_GGUF_Q4_1 && type != NV_GGUF_Q5_1 && type != NV_GGUF_MXFP4_MOE)
        return nv_fail(NV_EUNSUPPORTED,
                       "%s: GGUF tensor type %u is not written (F32, F16, BF16, Q8_0, Q6_K, Q5_K_M, Q5_K_S, Q5_1, Q5_0, Q4_K_M, Q4_K_S, Q4_1, Q4_0, "
                       "IQ4_XS, IQ4_NL, Q3_K_L, Q3_K_M, Q3_K_S, Q2_K or MXFP4_MOE)",
                       path, type);
    if (type == NV_GGUF_MXFP4_MOE && !c->n_experts)
        return nv_fail(NV_EINVAL, "%s: MXFP4_MOE quantizes a mixture's experts: this model has none", path);
    if (tok && nv_tokenizer_vocab_size(tok) != c->vocab_size)
        return nv_fail(NV_EINVAL, "%s: the tokenizer has %d tokens, the model %d", path, nv_tokenizer_vocab_size(tok), c->vocab_size);
    if (c->qk_norm && c->qkv_bias)
        return nv_fail(NV_EUNSUPPORTED, "%s: no GGUF architecture has both QK-norm and projection biases", path);
    const int gemma = c->ffn_gelu; /* written only as the loader reads its Gemma architecture back */
    const int olmo2 = nv_config_olmo2_block(c) != NULL;
    if ((nv_config_gemma_block(c) || c->nope_period || nv_config_granite(c) || olmo2) &&
        !(nv_config_granite(c) ? granite_form(c) : olmo2 ? olmo2_form(c) : gemma ? gemma_form(c) : smollm3_form(c)))
        return nv_fail(NV_EUNSUPPORTED,
                       "%s: not written: no GGUF architecture holds this model's mix of the Gemma family's, SmolLM3's, Granite's or OLMo 2's parts",
                       path);
    if (mistral3_form(c) && (c->qk_norm || c->qkv_bias || nv_config_gemma_block(c) || c->nope_period || nv_config_granite(c) || olmo2 ||
                             phi3_form(c) || c->rope_dim || c->longrope_orig))
        return nv_fail(NV_EUNSUPPORTED, "%s: not written: mistral3 (Ministral 3's attention temperature) beside this model's other parts has no "
                                        "GGUF architecture", path);
    if (phi3_form(c) && tok && !nv_tokenizer_strips_after_special(tok) && nv_tokenizer_strip_rule_matters(tok)) /* the reader's rule for phi3 */
        return nv_fail(NV_EUNSUPPORTED, "%s: not written: a phi3 file's SentencePiece vocabulary takes Phi-3's white-space rule after its "
                                        "special tokens, which this one does not have (write the model without it)", path);
    if (c->longrope_orig && !phi3_form(c))
        return nv_fail(NV_EUNSUPPORTED, "%s: not written: LongRoPE's two sets beside this model's other parts have no GGUF architecture", path);
    if (c->rope_dim && !half_rotation(c)) /* llama.cpp refuses a llama file whose rope.dimension_count is not the head's */
        return nv_fail(NV_EUNSUPPORTED,
                       "%s: not written: RoPE on %d of each head's %d values beside this model's other parts has no GGUF architecture", path,
                       c->rope_dim, c->head_dim);
    /* qwen3/qwen2/gemma: the query and key rows (and QK-norm weights, query and key biases) in that
     * architecture's RoPE order, in copies */
    nv_model qw;
    float *qk_copy = NULL;
    if (half_rotation(c)) NV_TRY(nv_model_half_view(m, &qw, &qk_copy));
    else qw = (nv_model){.config = *c, .w = m->w};
    const int yarn = c->yarn.factor != 0.0f; /* its keys, not its divisors, as llama.cpp reads it */
    if (yarn && c->yarn.no_truncate) {
        free(qk_copy);
        return nv_fail(NV_EUNSUPPORTED, "%s: YaRN without rounding its ramp (transformers' truncate false) has no GGUF form", path);
    }
    /* the Gemma family's, SmolLM3's and OLMo 2's RoPE scaling is linear, a factor (llama.cpp reads no divisors tensor for them) */
    const int factor_only = (gemma || c->nope_period || olmo2) && c->n_rope_factors && !yarn, phi3 = phi3_form(c);
    const int divisors = c->n_rope_factors > 0 && !yarn && !factor_only ? 1 + phi3 : 0; /* phi3: long and short */
    size_t nt = nv_model_tensor_count(c) + (size_t)divisors;
    nv_tensor_ref *t = calloc(nt, sizeof *t);
    nv_tensor_parts *tp = calloc(nt, sizeof *tp);
    if (!t || !tp) {
        free(t), free(tp), free(qk_copy);
        return nv_fail(NV_ENOMEM, "out of memory");
    }
    const size_t nw = nv_tensor_parts_of(t, tp, nv_model_tensor_map(c, &qw.w, t), phi3);
    nt = nw + (size_t)divisors;
    /* Llama 3.1+'s frequency divisors, as llama.cpp stores them; phi3: LongRoPE's long and short sets
       (the one set as both when there is one) */
    static const char *const divisor_names[2][2] = {{"rope_freqs.weight", ""}, {"rope_factors_long.weight", "rope_factors_short.weight"}};
    for (int set = 0; set < divisors; set++) {
        float *f = (float *)(set && c->longrope_orig ? c->rope_factors_short : c->rope_factors);
        t[nw + (size_t)set] = (nv_tensor_ref){"", (uint64_t)c->n_rope_factors, 1, f, 0};
        snprintf(t[nw + (size_t)set].name, sizeof t[nw].name, "%s", divisor_names[phi3][set]);
        tp[nw + (size_t)set] = (nv_tensor_parts){{f}, {1}, 1, ""};
    }
    const char *arch = arch_of(c);
    char k[96];
    nv_buf b = {0};
    const size_t kv_at = ob_header(&b, nt, arch);
    uint64_t n_kv = 14;
    kv_str(&b, "general.name", name);
    /* llama.cpp's file types (not the tensor types): ALL_F32 0, MOSTLY_F16 1, MOSTLY_Q4_0 2, MOSTLY_Q8_0 7,
       MOSTLY_Q4_1 3, MOSTLY_Q5_0 8, MOSTLY_Q5_1 9, MOSTLY_Q2_K 10, MOSTLY_Q3_K_M 12, MOSTLY_Q4_K_M 15, MOSTLY_Q5_K_M 17, MOSTLY_Q6_K 18,
       MOSTLY_IQ4_NL 25, MOSTLY_IQ4_XS 30, MOSTLY_BF16 32; the _S and _L mixes' codes end in theirs */
    kv_u32(&b, "general.file_type",
           type > 0xFFu             ? type & 0xFFu
           : type == NV_GGUF_BF16     ? 32
           : type == NV_GGUF_Q3_K   ? 12
           : type == NV_GGUF_IQ4_NL ? 25
           : type == NV_GGUF_IQ4_XS ? 30
           : type == NV_GGUF_Q8_0 ? 7
           : type == NV_GGUF_Q5_0 ? 8
           : type == NV_GGUF_Q5_1 ? 9
           : type == NV_GGUF_Q4_K ? 15
           : type == NV_GGUF_Q5_K ? 17
           : type == NV_GGUF_Q6_K ? 18
                                  : type);
    kv_u32(&b, akey(k, sizeof k, arch, "context_length"), (uint32_t)c->seq_len);
    kv_u32(&b, akey(k, sizeof k, arch, "embedding_length"), (uint32_t)c->dim);
    kv_u32(&b, akey(k, sizeof k, arch, "block_count"), (uint32_t)c->n_layers);
    kv_u32(&b, akey(k, sizeof k, arch, "feed_forward_length"), (uint32_t)c->hidden_dim);
    if (c->n_experts) { /* qwen3moe's experts have a width of their own (llama's: feed_forward_length) */
        kv_u32(&b, akey(k, sizeof k, arch, "expert_count"), (uint32_t)c->n_experts);
        kv_u32(&b, akey(k, sizeof k, arch, "expert_used_count"), (uint32_t)c->n_experts_used);
        if (c->qk_norm || c->gpt_oss) kv_u32(&b, akey(k, sizeof k, arch, "expert_feed_forward_length"), (uint32_t)c->hidden_dim), n_kv++;
        n_kv += 2;
    }
    kv_u32(&b, akey(k, sizeof k, arch, "rope.dimension_count"), (uint32_t)nv_config_rope_dim(c));
    kv_u32(&b, akey(k, sizeof k, arch, "attention.head_count"), (uint32_t)c->n_heads);
    kv_u32(&b, akey(k, sizeof k, arch, "attention.head_count_kv"), (uint32_t)c->n_kv_heads);
    kv_u32(&b, akey(k, sizeof k, arch, "attention.key_length"), (uint32_t)c->head_dim);
    kv_u32(&b, akey(k, sizeof k, arch, "attention.value_length"), (uint32_t)c->head_dim);
    kv_f32(&b, akey(k, sizeof k, arch, "attention.layer_norm_rms_epsilon"), c->norm_eps);
    kv_f32(&b, akey(k, sizeof k, arch, "rope.freq_base"), c->rope_theta);
    if (c->rope_attn != 0.0f && !yarn) kv_f32(&b, akey(k, sizeof k, arch, "rope.scaling.attn_factor"), c->rope_attn), n_kv++;
    if (divisors == 2) /* where the short set ends (the whole context when the two are one) */
        kv_u32(&b, akey(k, sizeof k, arch, "rope.scaling.original_context_length"),
               (uint32_t)(c->longrope_orig ? c->longrope_orig : c->seq_len)), n_kv++;
    if (factor_only) {
        kv_str(&b, akey(k, sizeof k, arch, "rope.scaling.type"), "linear");
        kv_f32(&b, akey(k, sizeof k, arch, "rope.scaling.factor"), c->rope_factors[0]);
        n_kv += 2;
    }
    if (c->swa_window) kv_u32(&b, akey(k, sizeof k, arch, "attention.sliding_window"), (uint32_t)c->swa_window), n_kv++;
    if (c->gpt_oss && c->swa_period != 2) /* (llama.cpp's default period, 2, goes unsaid) */
        kv_u32(&b, akey(k, sizeof k, arch, "attention.sliding_window_pattern"), (uint32_t)c->swa_period), n_kv++;
    if (c->swa_window && olmo2) { /* OLMo 3's layers, a flag each as llama.cpp's converter writes them, and their RoPE base */
        ob_key(&b, akey(k, sizeof k, arch, "attention.sliding_window_pattern"), GG_ARR);
        ob_u32(&b, GG_BOOL);
        ob_u64(&b, (uint64_t)c->n_layers);
        for (int l = 0; l < c->n_layers; l++) nv_buf_append(&b, &(uint8_t){(uint8_t)nv_config_layer_windowed(c, l)}, 1);
        kv_f32(&b, akey(k, sizeof k, arch, "rope.freq_base_swa"), c->rope_theta_swa);
        n_kv += 2;
    }
    if (c->logit_softcap != 0.0f) kv_f32(&b, akey(k, sizeof k, arch, "final_logit_softcapping"), c->logit_softcap), n_kv++;
    if (c->attn_softcap != 0.0f) kv_f32(&b, akey(k, sizeof k, arch, "attn_logit_softcapping"), c->attn_softcap), n_kv++;
    if (nv_config_granite(c)) { /* all four, as llama.cpp asks for them; none as 1 (the score factor: 0, its default) */
        kv_f32(&b, akey(k, sizeof k, arch, "embedding_scale"), nv_config_emb_scale(c));
        kv_f32(&b, akey(k, sizeof k, arch, "attention.scale"), c->attn_div != 0.0f ? inverse_f32(c->attn_div) : 0.0f);
        kv_f32(&b, akey(k, sizeof k, arch, "residual_scale"), nv_config_residual_scale(c));
        kv_f32(&b, akey(k, sizeof k, arch, "logit_scale"), nv_config_logit_div(c));
        n_kv += 4;
    }
    if (yarn) {
        kv_str(&b, akey(k, sizeof k, arch, "rope.scaling.type"), "yarn");
        kv_f32(&b, akey(k, sizeof k, arch, "rope.scaling.factor"), c->yarn.factor);
        kv_u32(&b, akey(k, sizeof k, arch, "rope.scaling.original_context_length"), (uint32_t)c->yarn.orig_ctx);
        /* llama.cpp multiplies it back, but in mistral3 divides it again by the log multiplier's (1 here): the factor itself */
        const int mistral3 = mistral3_form(c);
        const double attn = c->yarn.attn_factor / (mistral3 ? 1.0 : nv_yarn_mscale(c->yarn.factor));
        kv_f32(&b, akey(k, sizeof k, arch, "rope.scaling.attn_factor"), !mistral3 && fabs(attn - 1) < 1e-6 ? 1.0f : (float)attn);
        kv_f32(&b, akey(k, sizeof k, arch, "rope.scaling.yarn_beta_fast"), c->yarn.beta_fast);
        kv_f32(&b, akey(k, sizeof k, arch, "rope.scaling.yarn_beta_slow"), c->yarn.beta_slow);
        if (mistral3) kv_f32(&b, akey(k, sizeof k, arch, "rope.scaling.yarn_log_multiplier"), 1.0f), n_kv++;
        n_kv += 6;
    }
    if (c->attn_temp_scale != 0.0f) {
        kv_f32(&b, "mistral3.attention.temperature_scale", c->attn_temp_scale);
        kv_u32(&b, "mistral3.attention.temperature_length", (uint32_t)c->attn_temp_len);
        n_kv += 2;
    }
    if (m->pooling) kv_u32(&b, akey(k, sizeof k, arch, "pooling_type"), (uint32_t)m->pooling), n_kv++;
    if (tok) n_kv += (uint64_t)vocab_kvs(&b, tok);
    if (chat_template) kv_str(&b, "tokenizer.chat_template", chat_template), n_kv++;
    /* an importance matrix: each entry a quantized matrix uses must have its row's width (checked
       before anything is written), and the file says what it was quantized with, as llama.cpp's do */
    int used = 0;
    nv_err e = NV_OK;
    for (size_t i = 0; imatrix && i < nt && e == NV_OK; i++) {
        if (!takes_importance(tensor_type(c, &t[i], type, 1, pure))) continue;
        const nv_imatrix_entry *en = tensor_importance(imatrix, &t[i], &tp[i]);
        /* an embedding that is not the classifier is looked up, never multiplied: no entry expected */
        if (!en) {
            if (c->shared_classifier || strcmp(t[i].name, "token_embd.weight"))
                nv_warn("%s: the importance matrix has no entry for %s: quantized without one", path, t[i].name);
        } else if (!imatrix_fits(en, &t[i]))
            e = nv_fail(NV_EINVAL, "%s: the importance matrix's %s has %d x %d columns, the tensor's %llu x %llu: it was made for another model",
                        path, t[i].name, en->k, en->n_mat, (unsigned long long)t[i].d0, (unsigned long long)(t[i].d2 ? t[i].d2 : 1));
        else used++;
    }
    if (used) {
        kv_str(&b, "quantize.imatrix.dataset", imatrix->n_datasets ? imatrix->datasets[0] : "");
        kv_i32(&b, "quantize.imatrix.entries_count", used);
        kv_i32(&b, "quantize.imatrix.chunks_count", imatrix->chunks);
        n_kv += 3;
    }
    /* matrices in the type asked where their rows are whole blocks; vectors (norms) stay F32 */
    uint8_t **qdata = calloc(nt, sizeof *qdata);
    uint64_t *bytes = calloc(nt, sizeof *bytes);
    uint32_t *types = calloc(nt, sizeof *types);
    float *imp = NULL; /* the entry's means, for the most an entry has */
    uint64_t imp_cap = 0;
    int oom = !qdata || !bytes || !types;
    for (size_t i = 0; i < nt && !oom && e == NV_OK; i++) {
        const uint64_t n = t[i].d0 * nv_tensor_rows(&t[i]);
        const uint32_t tt = types[i] = tensor_type(c, &t[i], type, imatrix != NULL, pure);
        const int quant = tt != T_F32;
        bytes[i] = tensor_bytes(tt, n, t[i].d0);
        const nv_imatrix_entry *en = imatrix && takes_importance(tt) ? tensor_importance(imatrix, &t[i], &tp[i]) : NULL;
        const uint64_t n_imp = en ? (uint64_t)en->k * (uint64_t)en->n_mat : 0;
        if (n_imp > imp_cap) {
            free(imp);
            imp_cap = (imp = malloc((size_t)n_imp * sizeof *imp)) ? n_imp : 0;
        }
        if ((en && !imp) || (quant && !(qdata[i] = malloc((size_t)bytes[i])))) oom = 1;
        else if (en) nv_imatrix_means(en, imp);
        if (quant && qdata[i]) {
            const quantize_fn quantize =
                tt == T_F16    ? quantize_f16
                : tt == T_BF16 ? quantize_bf16
                : tt == T_Q8_0 ? quantize_q8_0
                : tt == T_Q5_0 ? quantize_q5_0
                : tt == T_Q4_K ? quantize_q4_k
                : tt == T_Q5_K ? quantize_q5_k
                : tt == T_Q5_1 ? quantize_q5_1
                : tt == T_Q4_1 ? quantize_q4_1
                : tt == T_Q6_K ? quantize_q6_k
                : tt == T_Q2_K ? quantize_q2_k
                : tt == T_Q3_K ? quantize_q3_k
                : tt == T_IQ4_NL ? quantize_iq4_nl
                : tt == T_MXFP4 ? quantize_mxfp4
                : tt == T_IQ4_XS ? quantize_iq4_xs
                               : quantize_q4_0;
            /* a stacked expert tensor: each expert's rows with its own importances (or all with the
               one matrix's, as llama.cpp takes an entry collected without experts); a fused one: each
               part's rows where they sit in it (rows are quantized alone, so the parts join as one) */
            const uint64_t slices = t[i].d2 ? t[i].d2 : 1, per = n / slices, per_bytes = bytes[i] / slices;
            const uint64_t row_bytes = per_bytes / (per / t[i].d0);
            uint8_t *at = qdata[i];
            for (int part = 0; part < tp[i].n; part++)
                for (uint64_t x = 0; x < (tp[i].n > 1 ? 1 : slices); x++) {
                    const uint64_t rows = tp[i].n > 1 ? tp[i].rows[part] : per / t[i].d0;
                    const quantize_job job = {quantize, tp[i].p[part] + x * per, en ? imp + (n_imp > t[i].d0 ? x * t[i].d0 : 0) : NULL,
                                              rows, t[i].d0, row_bytes, at};
                    const uint64_t tasks = job.rows < 64 ? job.rows : 64;
                    nv_pool_run(quantize_rows_task, (void *)&job, (int)(tasks ? tasks : 1));
                    at += rows * row_bytes;
                }
        }
    }
    /* the files: one, or llama-gguf-split's, each starting a new one where the last would pass a limit */
    size_t *first = calloc(nt + 2, sizeof *first); /* split k's tensors: [first[k], first[k + 1]) */
    int n_files = 0;
    if (!first) oom = 1;
    else {
        n_files = 1; /* (first[0] is 0) */
        for (size_t i = 0, count = 0, sum = 0; i < nt; i++) {
            const uint64_t padded = (bytes[i] + 31) / 32 * 32;
            if (split && count && ((split->max_tensors && count >= split->max_tensors) || (split->max_bytes && sum + padded > split->max_bytes)))
                first[n_files++] = i, count = sum = 0;
            count++, sum += padded;
        }
        first[n_files] = nt; /* the last file's end */
    }
    if (e == NV_OK && n_files > 65535) e = nv_fail(NV_EINVAL, "%s: %d split files: llama.cpp reads at most 65535", path, n_files);
    if (split) split->n_files = n_files;
    /* header (the first file's holding the metadata), the file's tensors' directory, then each tensor
       and its padding; the files written together, atomically */
    static const uint8_t zeros[32];
    nv_buf *head = calloc((size_t)n_files, sizeof *head);
    nv_iov *parts = calloc(4 * nt + (size_t)n_files, sizeof *parts);
    nv_file_out *files = calloc((size_t)n_files, sizeof *files);
    char **names = calloc((size_t)n_files, sizeof *names);
    if (e == NV_OK && (b.oom || oom || !head || !parts || !files || !names)) e = nv_fail(NV_ENOMEM, "out of memory");
    int np = 0;
    for (int k = 0; k < n_files && e == NV_OK; k++) {
        const size_t lo = first[k], hi = first[k + 1];
        nv_buf *h = k ? &head[k] : &b;
        if (k) {
            nv_buf_append(h, "GGUF", 4);
            ob_u32(h, 3);
            ob_u64(h, hi - lo);
            ob_u64(h, 3);
        } else
            memcpy(b.data + 8, &(uint64_t){hi - lo}, 8);
        if (split) {
            kv_u16(h, "split.no", (uint16_t)k);
            kv_u16(h, "split.count", (uint16_t)n_files);
            kv_i32(h, "split.tensors.count", (int32_t)nt);
            if (!k) n_kv += 3;
        }
        if (!k && !b.oom) memcpy(b.data + kv_at, &n_kv, 8);
        for (size_t i = lo, off = 0; i < hi; off += (bytes[i] + 31) / 32 * 32, i++) {
            ob_str(h, t[i].name, strlen(t[i].name));
            ob_u32(h, t[i].d2 ? 3 : t[i].d1 == 1 ? 1 : 2);
            ob_u64(h, t[i].d0);
            if (t[i].d1 != 1 || t[i].d2) ob_u64(h, t[i].d1);
            if (t[i].d2) ob_u64(h, t[i].d2);
            ob_u32(h, types[i]);
            ob_u64(h, off);
        }
        nv_buf_append(h, zeros, (32 - h->len % 32) % 32);
        if (h->oom || !(names[k] = split_path(path, split, k, n_files))) {
            e = nv_fail(NV_ENOMEM, "out of memory");
            break;
        }
        files[k] = (nv_file_out){names[k], parts + np, 0};
        parts[np++] = (nv_iov){h->data, h->len};
        for (size_t i = lo; i < hi; i++) {
            if (qdata[i]) parts[np++] = (nv_iov){qdata[i], (size_t)bytes[i]};
            else /* F32: each part's floats as they are (one part but in phi3's fused tensors) */
                for (int part = 0; part < tp[i].n; part++)
                    parts[np++] = (nv_iov){tp[i].p[part], (size_t)(tp[i].n > 1 ? tp[i].rows[part] * t[i].d0 * 4 : bytes[i])};
            if (bytes[i] % 32) parts[np++] = (nv_iov){zeros, 32 - bytes[i] % 32};
        }
        files[k].n = (int)(parts + np - files[k].parts);
    }
    if (e == NV_OK) e = nv_file_write_atomic_set(files, n_files);
    for (int k = 0; names && k < n_files; k++) free(names[k]);
    for (int k = 1; head && k < n_files; k++) nv_buf_free(&head[k]);
    free(names);
    free(files);
    free(head);
    free(first);
    for (size_t i = 0; qdata && i < nt; i++) free(qdata[i]);
    free(qdata);
    free(bytes);
    free(types);
    free(imp);
    free(parts);
    nv_buf_free(&b);
    free(t);
    free(tp);
    free(qk_copy);
    return e;
}

nv_err nv_gguf_save_vocab(const nv_tokenizer *tok, const char *path) {
    nv_buf b = {0};
    /* a Phi-3's vocabulary says so by its architecture, for its white-space rule */
    const size_t kv_at = ob_header(&b, 0, nv_tokenizer_strips_after_special(tok) ? "phi3" : "llama");
    uint64_t n_kv = 1 + (uint64_t)vocab_kvs(&b, tok);
    if (!b.oom) memcpy(b.data + kv_at, &n_kv, 8);
    nv_err e = b.oom ? nv_fail(NV_ENOMEM, "out of memory") : nv_file_write_atomic(path, &(nv_iov){b.data, b.len}, 1);
    nv_buf_free(&b);
    return e;
}

/* ---- LoRA adapters --------------------------------------------------------------------------- */

/* B (out x rank, a file's order) from the trainable block's B^T (rank x out), or back (to_bt). */
static void lora_transpose(float *b, float *bt, int out, int rank, int to_bt) {
    for (int o = 0; o < out; o++)
        for (int r = 0; r < rank; r++) {
            if (to_bt) bt[(size_t)r * out + o] = b[(size_t)o * rank + r];
            else b[(size_t)o * rank + r] = bt[(size_t)r * out + o];
        }
}

/* qwen2/qwen3/gemma files keep the query and key rows in their RoPE order: so do the rows of B
 * that update them. */
nv_err nv_lora_b_rows_reorder(const nv_config *c, int t, float *b, int rank, int to_half) {
    if (t > 1) return NV_OK;
    return nv_rope_rows_reorder(b, (size_t)rank * sizeof(float), t == 0 ? c->n_heads : c->n_kv_heads, c->head_dim, nv_config_rope_dim(c), to_half);
}

static nv_err lora_b_reorder(const nv_config *c, int t, float *b, int rank, int to_half) {
    return half_rotation(c) ? nv_lora_b_rows_reorder(c, t, b, rank, to_half) : NV_OK;
}

nv_err nv_gguf_save_lora(const nv_config *c, const nv_lora_shape *s, const float *p, const char *path) {
    NV_TRY(nv_lora_validate(c, s));
    const int r = s->rank;
    size_t pairs = 0;
    for (int t = 0; t < NV_LAYER_MATRICES; t++) pairs += (s->targets >> t) & 1;
    pairs *= (size_t)c->n_layers;
    const uint64_t n = nv_lora_param_count(c, s);
    float *data = malloc((size_t)n * sizeof(float)); /* A and B of each pair, in file order */
    nv_iov *parts = calloc(4 * pairs + 1, sizeof *parts);
    nv_buf b = {0};
    nv_err e = NV_OK;
    if (!data || !parts) {
        e = nv_fail(NV_ENOMEM, "out of memory");
        goto done;
    }
    const size_t kv_at = ob_header(&b, 2 * pairs, arch_of(c));
    kv_str(&b, "general.type", "adapter");
    kv_str(&b, "adapter.type", "lora");
    kv_f32(&b, "adapter.lora.alpha", s->alpha);
    const uint64_t n_kv = 4;
    if (!b.oom) memcpy(b.data + kv_at, &n_kv, 8);
    uint64_t off = 0, at = 0;
    static const uint8_t zeros[32];
    size_t np = 1;
    for (int l = 0; l < c->n_layers && e == NV_OK; l++)
        for (int t = 0; t < NV_LAYER_MATRICES && e == NV_OK; t++) {
            if (!(s->targets & (1u << t))) continue;
            int out, in;
            nv_lora_dims(c, t, &out, &in);
            const float *a = p + nv_lora_offset(c, s, l, t);
            float *fa = data + at, *fb = fa + (size_t)r * in;
            memcpy(fa, a, (size_t)r * in * sizeof(float));
            lora_transpose(fb, (float *)a + (size_t)r * in, out, r, 0);
            if ((e = lora_b_reorder(c, t, fb, r, 1))) break;
            at += (uint64_t)r * (uint64_t)(in + out);
            for (int half = 0; half < 2; half++) {
                char name[96];
                snprintf(name, sizeof name, "blk.%d.%s.weight.lora_%c", l, layer_parts[t], half ? 'b' : 'a');
                const uint64_t bytes = (uint64_t)r * (uint64_t)(half ? out : in) * 4;
                ob_str(&b, name, strlen(name));
                ob_u32(&b, 2);
                ob_u64(&b, half ? (uint64_t)r : (uint64_t)in); /* a: [in, rank]; b: [rank, out] */
                ob_u64(&b, half ? (uint64_t)out : (uint64_t)r);
                ob_u32(&b, T_F32);
                ob_u64(&b, off);
                off += (bytes + 31) / 32 * 32;
                parts[np++] = (nv_iov){half ? fb : fa, (size_t)bytes};
                if (bytes % 32) parts[np++] = (nv_iov){zeros, 32 - bytes % 32};
            }
        }
    if (e != NV_OK) goto done;
    nv_buf_append(&b, zeros, (32 - b.len % 32) % 32);
    if (b.oom) {
        e = nv_fail(NV_ENOMEM, "out of memory");
        goto done;
    }
    parts[0] = (nv_iov){b.data, b.len};
    e = nv_file_write_atomic(path, parts, (int)np);
done:
    nv_buf_free(&b);
    free(parts);
    free(data);
    return e;
}

/* A tensor name "blk.N.<part>.weight.lora_a|b": layer, matrix and half; 0 when it is not one. */
static int lora_tensor_of(const nv_gguf_tensor *x, const nv_config *c, int *l, int *t, int *half) {
    char name[128];
    if (x->name_len >= sizeof name || memchr(x->name, 0, x->name_len)) return 0; /* a NUL would cut it short */
    memcpy(name, x->name, x->name_len);
    name[x->name_len] = 0;
    const size_t n = x->name_len;
    if (n < 7 || (strcmp(name + n - 7, ".lora_a") && strcmp(name + n - 7, ".lora_b"))) return 0;
    *half = name[n - 1] == 'b';
    name[n - 7] = 0;
    if (strncmp(name, "blk.", 4) != 0 || name[4] < '0' || name[4] > '9') return 0;
    char *end;
    const long layer = strtol(name + 4, &end, 10);
    if (layer < 0 || layer >= c->n_layers || *end != '.') return 0;
    for (int u = 0; u < NV_LAYER_MATRICES; u++) {
        char want[96];
        snprintf(want, sizeof want, "blk.%ld.%s.weight", layer, layer_parts[u]);
        if (!strcmp(name, want)) {
            *l = (int)layer;
            *t = u;
            return 1;
        }
    }
    return 0;
}

nv_err nv_gguf_load_lora(const char *path, const nv_config *c, nv_lora_shape *s, float **out) {
    *out = NULL;
    memset(s, 0, sizeof *s);
    nv_gguf g;
    NV_TRY(nv_gguf_open(path, &g));
    nv_err e = NV_OK;
    char shown[128];
    const char *want_arch = arch_of(c);
    size_t tlen = 0, alen = 0, arlen = 0;
    const char *type = nv_gguf_string(&g, "general.type", &tlen);
    const char *atype = nv_gguf_string(&g, "adapter.type", &alen);
    const char *arch = nv_gguf_string(&g, "general.architecture", &arlen);
    float alpha = 0;
    const int L = c->n_layers;
    unsigned char *seen = calloc((size_t)L * NV_LAYER_MATRICES, 1); /* bit 1: a, bit 2: b */
    const nv_gguf_tensor **half_of = calloc((size_t)L * NV_LAYER_MATRICES * 2, sizeof *half_of); /* the tensors checked */
    if (!seen || !half_of) e = nv_fail(NV_ENOMEM, "out of memory");
    else if (!type || !name_is(type, tlen, "adapter"))
        e = nv_fail(NV_EFORMAT, "%s: not an adapter (general.type is %s)", path, type ? nv_gguf_shown(type, tlen, shown, sizeof shown) : "missing");
    else if (!atype || !name_is(atype, alen, "lora"))
        e = nv_fail(NV_EUNSUPPORTED, "%s: adapter.type is %s: only LoRA adapters are read", path,
                    atype ? nv_gguf_shown(atype, alen, shown, sizeof shown) : "missing");
    else if (!arch || !name_is(arch, arlen, want_arch))
        e = nv_fail(NV_EINVAL, "%s: an adapter for architecture %s, the model is %s", path,
                    arch ? nv_gguf_shown(arch, arlen, shown, sizeof shown) : "(none)", want_arch);
    else if ((e = get_float(&g, "adapter.lora.alpha", 0.0f, &alpha)) == NV_OK && (!isfinite(alpha) || alpha < 0))
        e = nv_fail(NV_EFORMAT, "%s: adapter.lora.alpha %g is not a non-negative number", path, (double)alpha);
    /* every tensor is half of a pair over a layer's matrix, of one rank, in a type the loader converts */
    for (uint64_t i = 0; i < g.n_tensors && e == NV_OK; i++) {
        const nv_gguf_tensor *x = &g.t[i];
        int l, t, half, out_dim, in_dim;
        if (!lora_tensor_of(x, c, &l, &t, &half)) {
            e = nv_fail(NV_EUNSUPPORTED, "%s: tensor '%s' is not an adapter of a layer's attention or FFN matrix of this "
                                         "model (blk.N.attn_q.weight.lora_a, ...): not applied",
                        path, nv_gguf_shown(x->name, x->name_len, shown, sizeof shown));
            break;
        }
        nv_lora_dims(c, t, &out_dim, &in_dim);
        const uint64_t rank = half ? x->dims[0] : x->dims[1];
        if (x->n_dims != 2 || x->dims[half ? 1 : 0] != (uint64_t)(half ? out_dim : in_dim) || rank < 1 || rank > 1024 ||
            (s->rank && rank != (uint64_t)s->rank)) {
            e = nv_fail(NV_EFORMAT, "%s: tensor '%s' is [%llu, %llu], expected [%d, rank] for lora_a or [rank, %d] for lora_b, "
                                    "one rank (1 to 1024) in the whole file",
                        path, nv_gguf_shown(x->name, x->name_len, shown, sizeof shown), (unsigned long long)x->dims[0],
                        (unsigned long long)x->dims[1], in_dim, out_dim);
            break;
        }
        if (!x->bytes) {
            e = nv_fail(NV_EUNSUPPORTED, "%s: tensor '%s' has type %s (%u) or rows that do not fill its blocks; supported: " SUPPORTED_TYPES,
                        path, nv_gguf_shown(x->name, x->name_len, shown, sizeof shown), nv_gguf_type_name(x->type), x->type);
            break;
        }
        unsigned char *mark = &seen[l * NV_LAYER_MATRICES + t];
        if (*mark & (1 << half)) {
            e = nv_fail(NV_EFORMAT, "%s: tensor '%s' appears twice", path, nv_gguf_shown(x->name, x->name_len, shown, sizeof shown));
            break;
        }
        *mark |= (unsigned char)(1 << half);
        half_of[(l * NV_LAYER_MATRICES + t) * 2 + half] = x;
        s->rank = (int)rank;
        s->targets |= 1u << t;
    }
    for (int i = 0; i < L * NV_LAYER_MATRICES && e == NV_OK; i++)
        if (seen[i] == 1 || seen[i] == 2)
            e = nv_fail(NV_EFORMAT, "%s: blk.%d.%s.weight has lora_%c without lora_%c", path, i / NV_LAYER_MATRICES,
                        layer_parts[i % NV_LAYER_MATRICES], seen[i] == 1 ? 'a' : 'b', seen[i] == 1 ? 'b' : 'a');
    if (e == NV_OK && !s->targets) e = nv_fail(NV_EFORMAT, "%s: the adapter holds no tensors", path);
    /* llama.cpp: an adapter without alpha is scaled by the user's scale alone */
    s->alpha = alpha > 0 ? alpha : (float)s->rank;
    if (e == NV_OK) e = nv_lora_validate(c, s);
    float *p = NULL, *b = NULL;
    const uint64_t n = e == NV_OK ? nv_lora_param_count(c, s) : 0;
    if (e == NV_OK) {
        p = nv_calloc_large((size_t)n, sizeof(float));
        b = malloc((size_t)s->rank * (size_t)(c->dim + c->hidden_dim + nv_config_q_dim(c)) * sizeof(float)); /* any B */
        if (!p || !b) e = nv_fail(NV_ENOMEM, "out of memory for the adapter");
    }
    for (int l = 0; l < L && e == NV_OK; l++)
        for (int t = 0; t < NV_LAYER_MATRICES && e == NV_OK; t++) {
            if (!seen[l * NV_LAYER_MATRICES + t]) continue; /* targeted in other layers: zeros, no change here */
            int out_dim, in_dim;
            nv_lora_dims(c, t, &out_dim, &in_dim);
            float *a = p + nv_lora_offset(c, s, l, t);
            const nv_gguf_tensor *const *pair = &half_of[(l * NV_LAYER_MATRICES + t) * 2];
            to_f32(pair[0], a, (uint64_t)s->rank * (uint64_t)in_dim);
            to_f32(pair[1], b, (uint64_t)s->rank * (uint64_t)out_dim);
            if ((e = lora_b_reorder(c, t, b, s->rank, 0))) break;
            lora_transpose(b, a + (size_t)s->rank * in_dim, out_dim, s->rank, 1);
        }
    for (uint64_t i = 0; i < n && e == NV_OK; i++)
        if (!isfinite(p[i])) e = nv_fail(NV_EFORMAT, "%s: the adapter holds a value that is not finite", path);
    free(b);
    free(seen);
    free(half_of);
    nv_gguf_close(&g);
    if (e != NV_OK) {
        free(p);
        memset(s, 0, sizeof *s);
        return e;
    }
    *out = p;
    return NV_OK;
}

/* ---- importance matrices (imatrix.h) -------------------------------------------------------- */

nv_err nv_gguf_save_imatrix(const struct nv_imatrix *im, const char *path) {
    nv_buf b = {0};
    nv_buf_append(&b, "GGUF", 4);
    ob_u32(&b, 3);
    ob_u64(&b, 2 * (uint64_t)im->n);
    ob_u64(&b, 4);
    kv_str(&b, "general.type", "imatrix");
    ob_key(&b, "imatrix.datasets", GG_ARR);
    ob_u32(&b, GG_STR);
    ob_u64(&b, (uint64_t)im->n_datasets);
    for (int i = 0; i < im->n_datasets; i++) ob_str(&b, im->datasets[i], strlen(im->datasets[i]));
    kv_u32(&b, "imatrix.chunk_count", (uint32_t)im->chunks);
    kv_u32(&b, "imatrix.chunk_size", (uint32_t)im->chunk_size);
    /* per entry NAME.in_sum2 [k, n_mat] and NAME.counts [1, n_mat], F32, each aligned to 32 bytes */
    uint64_t off = 0;
    for (int i = 0; i < im->n; i++)
        for (int half = 0; half < 2; half++) {
            char name[96];
            snprintf(name, sizeof name, "%s.%s", im->e[i].name, half ? "counts" : "in_sum2");
            const uint64_t d0 = half ? 1 : (uint64_t)im->e[i].k, d1 = (uint64_t)im->e[i].n_mat;
            ob_str(&b, name, strlen(name));
            ob_u32(&b, 2);
            ob_u64(&b, d0);
            ob_u64(&b, d1);
            ob_u32(&b, T_F32);
            ob_u64(&b, off);
            off += (d0 * d1 * 4 + 31) / 32 * 32;
        }
    static const uint8_t zeros[32];
    nv_buf_append(&b, zeros, (32 - b.len % 32) % 32);
    const size_t head = b.len;
    for (int i = 0; i < im->n; i++) {
        const nv_imatrix_entry *e = &im->e[i];
        const size_t n = (size_t)e->k * (size_t)e->n_mat;
        for (size_t j = 0; j < n; j++) {
            const float v = (float)e->sum2[j];
            nv_buf_append(&b, &v, 4);
        }
        nv_buf_append(&b, zeros, (32 - n * 4 % 32) % 32);
        for (int m = 0; m < e->n_mat; m++) {
            const float count = (float)e->count[m];
            nv_buf_append(&b, &count, 4);
        }
        nv_buf_append(&b, zeros, (32 - (size_t)e->n_mat * 4 % 32) % 32);
    }
    nv_err err = b.oom || b.len - head != off ? nv_fail(NV_ENOMEM, "out of memory") : NV_OK;
    if (err == NV_OK) {
        const nv_iov part = {b.data, b.len};
        err = nv_file_write_atomic(path, &part, 1);
    }
    nv_buf_free(&b);
    return err;
}

/* The values of t when it is F32 of dims [n] or [n, m] (*n and *m set; m 1 for [n]), else NULL. */
static const float *imatrix_values(const nv_gguf_tensor *t, uint64_t *n, uint64_t *m) {
    if (!t || t->type != T_F32 || t->n_dims < 1 || t->n_dims > 2) return NULL;
    *n = t->dims[0];
    *m = t->n_dims == 2 ? t->dims[1] : 1;
    return (const float *)t->data;
}

nv_err nv_gguf_load_imatrix(const char *path, struct nv_imatrix *im) {
    nv_gguf g;
    NV_TRY(nv_gguf_open(path, &g));
    nv_err e = NV_OK;
    size_t tlen = 0;
    const char *type = nv_gguf_string(&g, "general.type", &tlen);
    int64_t chunks = 0, chunk_size = 0;
    char shown[128]; /* the file's own text, escaped: one line whatever it holds */
    if (type && (tlen != 7 || memcmp(type, "imatrix", 7)))
        e = nv_fail(NV_EFORMAT, "%s: a GGUF file of general.type '%s', not an importance matrix", path,
                    nv_gguf_shown(type, tlen, shown, sizeof shown));
    if (e == NV_OK && (e = get_int(&g, "imatrix.chunk_count", 0, &chunks)) == NV_OK)
        e = get_int(&g, "imatrix.chunk_size", 0, &chunk_size);
    im->chunks = chunks > 0 && chunks < INT32_MAX ? (int)chunks : 0;
    im->chunk_size = chunk_size > 0 && chunk_size < INT32_MAX ? (int)chunk_size : 0;
    const nv_gguf_kv *ds = nv_gguf_find(&g, "imatrix.datasets");
    if (e == NV_OK && ds && ds->type == GG_ARR && ds->elem == GG_STR) {
        gg_cursor c = {nv_reader_make(ds->val, (size_t)(g.map.data + g.map.len - ds->val), path), g.version >= 2};
        for (uint64_t i = 0; i < ds->count && i < 1024 && e == NV_OK; i++) {
            const char *s;
            size_t len;
            rd_string(&c, &s, &len, "dataset"); /* checked at open */
            e = nv_imatrix_add_dataset(im, s, len < 4096 ? len : 4096);
        }
    }
    for (uint64_t i = 0; i < g.n_tensors && e == NV_OK; i++) {
        const nv_gguf_tensor *t = &g.t[i];
        static const char suffix[] = ".in_sum2";
        const size_t sl = sizeof suffix - 1;
        if (t->name_len > sl && !memcmp(t->name + t->name_len - sl, suffix, sl)) {
            char name[160], counts_name[176];
            const size_t nl = t->name_len - sl;
            if (nl >= sizeof name || memchr(t->name, 0, nl)) {
                e = nv_fail(NV_EFORMAT, "%s: a tensor name of %zu bytes", path, t->name_len);
                break;
            }
            memcpy(name, t->name, nl);
            name[nl] = 0;
            snprintf(counts_name, sizeof counts_name, "%s.counts", name);
            uint64_t k = 0, n_mat = 0, one = 0, nc = 0;
            const float *sums = imatrix_values(t, &k, &n_mat),
                        *count = imatrix_values(nv_gguf_tensor_find(&g, counts_name), &one, &nc);
            if (!sums || !count || one != 1 || nc != n_mat) {
                e = nv_fail(NV_EFORMAT, "%s: entry '%s' is not F32 sums [k, n] with F32 counts [1, n]", path,
                            nv_gguf_shown(name, nl, shown, sizeof shown));
                break;
            }
            nv_imatrix_entry *en;
            if ((e = nv_imatrix_add_entry(im, path, name, nl, (int64_t)k, (int64_t)n_mat, &en)) != NV_OK) break;
            for (uint64_t m = 0; m < n_mat && e == NV_OK; m++) {
                float cv;
                memcpy(&cv, (const uint8_t *)count + 4 * m, 4);
                /* a count is of tokens: 0 (never seen) or at least 1, so that every mean stays finite */
                if (!isfinite(cv) || cv < 0 || (cv > 0 && cv < 1))
                    e = nv_fail(NV_EFORMAT, "%s: entry '%s' counts %g rows (0, or 1 and more)", path, name, (double)cv);
                en->count[m] = cv;
            }
            for (uint64_t j = 0; j < k * n_mat && e == NV_OK; j++) {
                float v;
                memcpy(&v, (const uint8_t *)sums + 4 * j, 4);
                if (!isfinite(v) || v < 0) e = nv_fail(NV_EFORMAT, "%s: entry '%s' holds %g (finite, >= 0)", path, name, (double)v);
                en->sum2[j] = v;
            }
        }
    }
    nv_gguf_close(&g);
    return e;
}

const char *nv_gguf_file_type_name(uint32_t ft) {
    static const char *const names[] = {
        [0] = "F32",      [1] = "F16",     [2] = "Q4_0",    [3] = "Q4_1",    [7] = "Q8_0",    [8] = "Q5_0",   [9] = "Q5_1",
        [10] = "Q2_K",    [11] = "Q3_K_S", [12] = "Q3_K_M", [13] = "Q3_K_L", [14] = "Q4_K_S", [15] = "Q4_K_M",
        [16] = "Q5_K_S",  [17] = "Q5_K_M", [18] = "Q6_K",   [19] = "IQ2_XXS", [20] = "IQ2_XS", [21] = "Q2_K_S",
        [22] = "IQ3_XS",  [23] = "IQ3_XXS", [24] = "IQ1_S", [25] = "IQ4_NL", [26] = "IQ3_S",  [27] = "IQ3_M",
        [28] = "IQ2_S",   [29] = "IQ2_M",  [30] = "IQ4_XS", [31] = "IQ1_M",  [32] = "BF16",   [36] = "TQ1_0",
        [37] = "TQ2_0",   [38] = "MXFP4_MOE"};
    return ft < sizeof names / sizeof names[0] ? names[ft] : NULL;
}
