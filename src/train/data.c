#include "train/data.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"

static int has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* Appends the tokens of one document (BOS first; EOS last instead for a vocabulary that prepends
 * no BOS, such as Qwen's, so documents stay apart) to a growing array. */
static nv_err append_doc(const nv_tokenizer *tok, const char *text, size_t len, uint32_t **arr, uint64_t *n,
                         uint64_t *cap) {
    while (len && (*text == '\n' || *text == ' ' || *text == '\r')) text++, len--;
    while (len && (text[len - 1] == '\n' || text[len - 1] == ' ' || text[len - 1] == '\r')) len--;
    if (!len) return NV_OK;
    char *doc = malloc(len + 1);
    if (!doc) return nv_fail(NV_ENOMEM, "out of memory");
    memcpy(doc, text, len);
    doc[len] = '\0';
    int *ids = NULL, nids = 0;
    nv_err e = nv_tokenizer_encode(tok, doc, 1, !nv_tokenizer_adds_bos(tok), &ids, &nids); /* no EOS id: nothing apart */
    free(doc);
    if (e) return e;
    if (*n + (uint64_t)nids > *cap) {
        uint64_t nc = (*cap ? *cap * 2 : 1 << 16);
        while (nc < *n + (uint64_t)nids) nc *= 2;
        uint32_t *na = realloc(*arr, nc * sizeof(uint32_t));
        if (!na) {
            free(ids);
            return nv_fail(NV_ENOMEM, "out of memory tokenizing text");
        }
        *arr = na;
        *cap = nc;
    }
    for (int i = 0; i < nids; i++) (*arr)[(*n)++] = (uint32_t)ids[i];
    free(ids);
    return NV_OK;
}

static nv_err load_text(nv_source *s, const nv_tokenizer *tok) {
    if (!tok) return nv_fail(NV_EINVAL, "%s: a text file needs a tokenizer (-z)", s->path);
    nv_mapped m;
    NV_TRY(nv_file_map(s->path, &m));
    const char *t = (const char *)m.data;
    size_t len = m.len;
    static const char eot[] = "<|endoftext|>";
    /* One document per line only when the file marks documents neither by blank lines nor by
     * <|endoftext|> (a marked story keeps its single line breaks). */
    int blank_lines = len && memmem(t, len, eot, sizeof eot - 1) != NULL;
    for (size_t i = 0; i + 1 < len && !blank_lines; i++) blank_lines = t[i] == '\n' && t[i + 1] == '\n';
    uint64_t cap = 0;
    size_t start = 0;
    nv_err e = NV_OK;
    for (size_t i = 0; i <= len && e == NV_OK; i++) {
        size_t cut = 0, skip = 0;
        if (i == len) cut = 1;
        else if (t[i] == '<' && len - i >= sizeof eot - 1 && memcmp(t + i, eot, sizeof eot - 1) == 0) cut = 1, skip = sizeof eot - 1;
        else if (t[i] == '\n' && (!blank_lines || (i + 1 < len && t[i + 1] == '\n'))) cut = 1, skip = 1;
        if (!cut) continue;
        e = append_doc(tok, t + start, i - start, &s->owned, &s->n_tokens, &cap);
        i += skip ? skip - 1 : 0;
        start = i + 1;
    }
    nv_file_unmap(&m);
    s->width = 4;
    return e;
}

nv_err nv_dataset_open(nv_dataset *ds, const char *const *paths, int n, const nv_tokenizer *tok, int vocab_size,
                       float val_frac) {
    memset(ds, 0, sizeof *ds);
    if (n < 1) return nv_fail(NV_EINVAL, "no training data given (--data PATH)");
    if (!(val_frac >= 0.0f && val_frac < 1.0f)) return nv_fail(NV_EINVAL, "validation fraction must be in [0, 1)");
    ds->src = calloc((size_t)n, sizeof *ds->src);
    if (!ds->src) return nv_fail(NV_ENOMEM, "out of memory");
    ds->n_src = n;
    for (int i = 0; i < n; i++) {
        nv_source *s = &ds->src[i];
        if (snprintf(s->path, sizeof s->path, "%s", paths[i]) >= (int)sizeof s->path) {
            nv_dataset_close(ds);
            return nv_fail(NV_EINVAL, "data path too long: %.80s...", paths[i]);
        }
        nv_err e;
        if (has_suffix(s->path, ".bin") || has_suffix(s->path, ".u32")) {
            s->width = has_suffix(s->path, ".u32") ? 4 : 2;
            e = nv_file_map(s->path, &s->map);
            if (!e && s->map.len % (size_t)s->width)
                e = nv_fail(NV_EFORMAT, "%s: %zu bytes is not a whole number of %d-byte tokens", s->path, s->map.len, s->width);
            if (!e) s->n_tokens = s->map.len / (size_t)s->width;
        } else {
            e = load_text(s, tok);
        }
        for (uint64_t j = 0; !e && j < s->n_tokens; j++)
            if (nv_source_token(s, j) >= (uint32_t)vocab_size)
                e = nv_fail(NV_EFORMAT, "%s: token %u at position %llu is outside the vocabulary of %d", s->path,
                            nv_source_token(s, j), (unsigned long long)j, vocab_size);
        if (e) {
            nv_dataset_close(ds);
            return e;
        }
        s->n_train = s->n_tokens - (uint64_t)((double)s->n_tokens * val_frac);
        ds->train_tokens += s->n_train;
        ds->val_tokens += s->n_tokens - s->n_train;
    }
    return NV_OK;
}

void nv_dataset_close(nv_dataset *ds) {
    for (int i = 0; i < ds->n_src; i++) {
        nv_file_unmap(&ds->src[i].map);
        free(ds->src[i].owned);
    }
    free(ds->src);
    memset(ds, 0, sizeof *ds);
}

void nv_data_cursor_init(nv_data_cursor *c, uint64_t seed) {
    nv_rng r;
    nv_rng_seed(&r, seed ^ 0x5eedda7aull);
    c->rng = r.state;
    c->windows = 0;
}

static uint64_t rand_below(uint64_t *state, uint64_t n) {
    uint64_t hi = nv_xorshift_u32(state), lo = nv_xorshift_u32(state);
    return ((hi << 32) | lo) % n;
}

nv_err nv_data_next_batch(const nv_dataset *ds, nv_data_cursor *c, int B, int T, int *inputs, int *targets) {
    /* starts available: each source offers n_train - T window starts */
    uint64_t total = 0;
    for (int i = 0; i < ds->n_src; i++)
        if (ds->src[i].n_train > (uint64_t)T) total += ds->src[i].n_train - (uint64_t)T;
    if (!total)
        return nv_fail(NV_EINVAL, "training data is too short for a window of %d tokens (have %llu)", T + 1,
                       (unsigned long long)ds->train_tokens);
    for (int b = 0; b < B; b++) {
        uint64_t r = rand_below(&c->rng, total);
        const nv_source *s = ds->src;
        for (int i = 0; i < ds->n_src; i++) {
            uint64_t starts = ds->src[i].n_train > (uint64_t)T ? ds->src[i].n_train - (uint64_t)T : 0;
            if (r < starts) {
                s = &ds->src[i];
                break;
            }
            r -= starts;
        }
        for (int t = 0; t < T; t++) {
            inputs[b * T + t] = (int)nv_source_token(s, r + (uint64_t)t);
            targets[b * T + t] = (int)nv_source_token(s, r + (uint64_t)t + 1);
        }
        c->windows++;
    }
    return NV_OK;
}

int nv_data_val_batch(const nv_dataset *ds, int i, int B, int T, int *inputs, int *targets) {
    /* windows tile each source's validation split, in order across sources */
    uint64_t total = 0;
    int ns = ds->n_src;
    uint64_t *per = calloc((size_t)ns, sizeof *per);
    if (!per) return 0;
    for (int s = 0; s < ns; s++) {
        uint64_t len = ds->src[s].n_tokens - ds->src[s].n_train;
        per[s] = len > (uint64_t)T ? (len - 1) / (uint64_t)T : 0;
        total += per[s];
    }
    if (!total) {
        free(per);
        return 0;
    }
    for (int b = 0; b < B; b++) {
        uint64_t w = ((uint64_t)i * B + b) % total;
        int s = 0;
        while (w >= per[s]) w -= per[s++];
        const nv_source *src = &ds->src[s];
        uint64_t start = src->n_train + w * (uint64_t)T;
        for (int t = 0; t < T; t++) {
            inputs[b * T + t] = (int)nv_source_token(src, start + (uint64_t)t);
            targets[b * T + t] = (int)nv_source_token(src, start + (uint64_t)t + 1);
        }
    }
    free(per);
    return 1;
}

double nv_dataset_unigram_loss(const nv_dataset *ds, int vocab_size) {
    double *cnt = calloc((size_t)vocab_size, sizeof(double));
    if (!cnt) return 0.0;
    double n = 0;
    for (int i = 0; i < ds->n_src; i++)
        for (uint64_t j = 0; j < ds->src[i].n_train; j++) {
            uint32_t t = nv_source_token(&ds->src[i], j);
            if (t < (uint32_t)vocab_size) cnt[t] += 1, n += 1;
        }
    double h = 0;
    for (int v = 0; v < vocab_size; v++)
        if (cnt[v] > 0) h -= cnt[v] / n * log(cnt[v] / n);
    free(cnt);
    return h;
}
