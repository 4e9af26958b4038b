#include "model/imatrix.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "model/gguf.h"

/* The observer: each row's squared inputs added to its matrix's sums (on the calling thread, before
 * the product; O(m k) beside the product's O(m k n)). */
static void observe(void *ctx, const float *x, int m, int k) {
    const nv_imatrix_obs *o = ctx;
    nv_imatrix_entry *e = &o->im->e[o->e];
    if (k != e->k) return;
    double *sum2 = e->sum2 + (size_t)o->mat * (size_t)k;
    for (int r = 0; r < m; r++) {
        const float *row = x + (size_t)r * k;
        for (int j = 0; j < k; j++) sum2[j] += (double)row[j] * row[j];
    }
    e->count[o->mat] += m;
}

nv_err nv_imatrix_collect(nv_imatrix *im, nv_model *m) {
    memset(im, 0, sizeof *im);
    if (!m->plans || !m->cls_plan) return nv_fail(NV_EINVAL, "imatrix: the model's plans are not built");
    const nv_config *c = &m->config;
    const int total = nv_model_plan_count(c), dense = c->n_layers * NV_LAYER_MATRICES;
    if (!(im->obs = calloc((size_t)total, sizeof *im->obs))) return nv_fail(NV_ENOMEM, "out of memory");
    for (int i = 0; i < total; i++) {
        nv_plan *p = nv_model_plan(m, i);
        if (!p) continue;
        char name[sizeof im->e[0].name];
        int expert;
        nv_model_plan_tensor_name(c, i, name, sizeof name, &expert);
        /* an expert's matrix is one of its layer's stacked tensor's: that entry's, made at expert 0 */
        const nv_imatrix_entry *had = expert ? nv_imatrix_find(im, name) : NULL;
        nv_imatrix_entry *e;
        nv_err err = had ? NV_OK : nv_imatrix_add_entry(im, "imatrix", name, strlen(name), nv_plan_k(p), i > dense ? c->n_experts : 1, &e);
        if (err != NV_OK) {
            nv_imatrix_free(im);
            return err;
        }
        const int at = had ? (int)(had - im->e) : im->n - 1;
        im->obs[im->n_obs] = (nv_imatrix_obs){at, expert, im};
        nv_plan_observe(p, observe, &im->obs[im->n_obs++]);
    }
    return NV_OK;
}

void nv_imatrix_stop(nv_model *m) {
    if (!m->plans || !m->cls_plan) return;
    for (int i = 0; i < nv_model_plan_count(&m->config); i++) {
        nv_plan *p = nv_model_plan(m, i);
        if (p) nv_plan_observe(p, NULL, NULL);
    }
}

nv_err nv_imatrix_add_dataset(nv_imatrix *im, const char *name, size_t len) {
    char **grown = realloc(im->datasets, (size_t)(im->n_datasets + 1) * sizeof *grown);
    if (!grown) return nv_fail(NV_ENOMEM, "out of memory");
    im->datasets = grown;
    if (!(grown[im->n_datasets] = strndup(name, len))) return nv_fail(NV_ENOMEM, "out of memory");
    im->n_datasets++;
    return NV_OK;
}

void nv_imatrix_free(nv_imatrix *im) {
    for (int i = 0; i < im->n; i++) {
        free(im->e[i].sum2);
        free(im->e[i].count);
    }
    free(im->e);
    free(im->obs);
    for (int i = 0; i < im->n_datasets; i++) free(im->datasets[i]);
    free(im->datasets);
    memset(im, 0, sizeof *im);
}

const nv_imatrix_entry *nv_imatrix_find(const nv_imatrix *im, const char *name) {
    for (int i = 0; im && i < im->n; i++)
        if (!strcmp(im->e[i].name, name)) return &im->e[i];
    return NULL;
}

void nv_imatrix_means(const nv_imatrix_entry *e, float *out) {
    for (int m = 0; m < e->n_mat; m++)
        for (size_t j = (size_t)m * e->k; j < (size_t)(m + 1) * e->k; j++)
            out[j] = e->count[m] > 0 ? (float)(e->sum2[j] / e->count[m]) : 1.0f;
}

nv_err nv_imatrix_add_entry(nv_imatrix *im, const char *path, const char *name, size_t name_len, int64_t k, int64_t n_mat,
                            nv_imatrix_entry **out) {
    int printable = name_len > 0 && name_len < sizeof im->e[0].name;
    for (size_t i = 0; printable && i < name_len; i++) printable = (unsigned char)name[i] >= 0x20 && name[i] != 0x7f;
    if (!printable) /* names go into messages: a tensor name is printable text */
        return nv_fail(NV_EFORMAT, "%s: an entry's name is empty, longer than %zu bytes or holds a control byte", path,
                       sizeof im->e[0].name - 1);
    if (n_mat < 1 || n_mat > NV_MOE_MAX_EXPERTS)
        return nv_fail(NV_EFORMAT, "%s: an entry of %lld matrices (1..%d)", path, (long long)n_mat, NV_MOE_MAX_EXPERTS);
    if (k < 1 || k > (1 << 24) || k * n_mat > (1 << 24))
        return nv_fail(NV_EFORMAT, "%s: an entry of %lld x %lld values (1..16777216)", path, (long long)k, (long long)n_mat);
    nv_imatrix_entry *grown = realloc(im->e, (size_t)(im->n + 1) * sizeof *grown);
    if (!grown) return nv_fail(NV_ENOMEM, "out of memory");
    im->e = grown;
    nv_imatrix_entry *e = &im->e[im->n];
    memset(e, 0, sizeof *e);
    memcpy(e->name, name, name_len);
    if (nv_imatrix_find(im, e->name)) return nv_fail(NV_EFORMAT, "%s: entry '%s' appears twice", path, e->name);
    e->k = (int)k;
    e->n_mat = (int)n_mat;
    e->sum2 = calloc((size_t)(k * n_mat), sizeof *e->sum2);
    e->count = calloc((size_t)n_mat, sizeof *e->count);
    if (!e->sum2 || !e->count) {
        free(e->sum2);
        free(e->count);
        return nv_fail(NV_ENOMEM, "out of memory");
    }
    im->n++;
    *out = e;
    return NV_OK;
}

nv_err nv_imatrix_merge(nv_imatrix *dst, const nv_imatrix *src, const char *path) {
    for (int i = 0; i < src->n; i++) {
        const nv_imatrix_entry *a = &src->e[i];
        nv_imatrix_entry *b = (nv_imatrix_entry *)nv_imatrix_find(dst, a->name);
        if (!b) NV_TRY(nv_imatrix_add_entry(dst, path, a->name, strlen(a->name), a->k, a->n_mat, &b));
        else if (b->k != a->k || b->n_mat != a->n_mat)
            return nv_fail(NV_EINVAL, "%s: entry '%s' is %d x %d columns here and %d x %d before: collected on another model", path,
                           a->name, a->k, a->n_mat, b->k, b->n_mat);
        for (size_t j = 0; j < (size_t)a->k * (size_t)a->n_mat; j++) b->sum2[j] += a->sum2[j];
        for (int m = 0; m < a->n_mat; m++) b->count[m] += a->count[m];
    }
    for (int i = 0; i < src->n_datasets; i++) NV_TRY(nv_imatrix_add_dataset(dst, src->datasets[i], strlen(src->datasets[i])));
    dst->chunks += src->chunks;
    if (!dst->chunk_size) dst->chunk_size = src->chunk_size;
    return NV_OK;
}

static nv_err load_dat(const char *path, const nv_mapped *map, nv_imatrix *im) {
    nv_reader r = nv_reader_make(map->data, map->len, path);
    int32_t n_entries;
    NV_TRY(nv_read_i32(&r, &n_entries, "entry count"));
    if (n_entries < 1 || n_entries > 100000) return nv_fail(NV_EFORMAT, "%s: %d entries (1..100000)", path, n_entries);
    for (int i = 0; i < n_entries; i++) {
        int32_t len, ncall, nval;
        const void *name, *vals;
        NV_TRY(nv_read_i32(&r, &len, "name length"));
        if (len < 1 || len > 4096) return nv_fail(NV_EFORMAT, "%s: entry %d's name is %d bytes", path, i, len);
        NV_TRY(nv_read_view(&r, &name, (size_t)len, "name"));
        NV_TRY(nv_read_i32(&r, &ncall, "call count"));
        NV_TRY(nv_read_i32(&r, &nval, "value count"));
        if (ncall < 1) return nv_fail(NV_EFORMAT, "%s: entry %d was collected over %d calls", path, i, ncall);
        nv_imatrix_entry *e;
        NV_TRY(nv_imatrix_add_entry(im, path, name, (size_t)len, nval, 1, &e)); /* a mixture's: its experts' values in a row */
        NV_TRY(nv_read_view(&r, &vals, (size_t)nval * sizeof(float), "values"));
        for (int j = 0; j < nval; j++) {
            float v;
            memcpy(&v, (const uint8_t *)vals + (size_t)j * 4, 4);
            if (!isfinite(v) || v < 0) return nv_fail(NV_EFORMAT, "%s: entry '%s' holds %g (finite, >= 0)", path, e->name, (double)v);
            e->sum2[j] = v; /* mean x ncall: the means come back over the calls */
        }
        e->count[0] = ncall;
    }
    int32_t last_call, dlen; /* optional */
    if (nv_reader_left(&r) == 0) return NV_OK;
    NV_TRY(nv_read_i32(&r, &last_call, "last call"));
    NV_TRY(nv_read_i32(&r, &dlen, "dataset length"));
    const void *ds;
    if (dlen < 0 || dlen > 65536) return nv_fail(NV_EFORMAT, "%s: the dataset name is %d bytes", path, dlen);
    NV_TRY(nv_read_view(&r, &ds, (size_t)dlen, "dataset"));
    im->chunks = last_call > 0 ? last_call : 0;
    nv_err e = dlen ? nv_imatrix_add_dataset(im, ds, (size_t)dlen) : NV_OK;
    if (e == NV_OK && nv_reader_left(&r)) e = nv_fail(NV_EFORMAT, "%s: %zu bytes after the dataset", path, nv_reader_left(&r));
    return e;
}

nv_err nv_imatrix_load(const char *path, nv_imatrix *im) {
    memset(im, 0, sizeof *im);
    nv_mapped map;
    NV_TRY(nv_file_map(path, &map));
    const int gguf = nv_gguf_is(map.data, map.len);
    nv_err e = gguf ? NV_OK : load_dat(path, &map, im);
    nv_file_unmap(&map);
    if (gguf) e = nv_gguf_load_imatrix(path, im);
    if (e == NV_OK && im->n == 0) e = nv_fail(NV_EFORMAT, "%s: no importance matrix entries", path);
    if (e != NV_OK) nv_imatrix_free(im);
    return e;
}

nv_err nv_imatrix_save(const nv_imatrix *im, const char *path) { return nv_gguf_save_imatrix(im, path); }
