/* Importance matrices (llama.cpp's imatrix): for each weight matrix, the sum over the tokens of a
 * text of each input column's squared activation, so that quantization can keep most exact the
 * weights that meet the largest inputs. Collected while a model runs text (nv_imatrix_collect,
 * `nerve imatrix`), written and read as llama.cpp's imatrix GGUF (tensors NAME.in_sum2, F32 [k],
 * and NAME.counts, F32 [1]; general.type "imatrix", imatrix.datasets, imatrix.chunk_count,
 * imatrix.chunk_size) and read from its older .dat files too; `nerve export --imatrix` uses it. */
#ifndef NV_IMATRIX_H
#define NV_IMATRIX_H

#include "base/err.h"
#include "model/model.h"

typedef struct {
    char name[64]; /* the weight's GGUF tensor name, e.g. blk.0.attn_q.weight */
    int k;         /* input columns */
    double *sum2;  /* [k] sums of squared inputs */
    double count;  /* rows (tokens) summed */
} nv_imatrix_entry;

typedef struct nv_imatrix {
    nv_imatrix_entry *e;
    int n;
    int chunks, chunk_size;
    char **datasets; /* what it was collected on */
    int n_datasets;
} nv_imatrix;

/* An entry for each of m's plan matrices (built), each plan's observer set to add its inputs
 * (nv_plan_observe). The observers point into im: nv_imatrix_stop before im moves or is freed. */
nv_err nv_imatrix_collect(nv_imatrix *im, nv_model *m);
void nv_imatrix_stop(nv_model *m);
/* Adds the dataset name of len bytes (up to a NUL) to what im was collected on. */
nv_err nv_imatrix_add_dataset(nv_imatrix *im, const char *name, size_t len);
/* A new entry (zero sums) named by name_len bytes of name (no NUL, shorter than 64, not present
 * yet) with k columns (1..2^24); path names the source in errors. */
nv_err nv_imatrix_add_entry(nv_imatrix *im, const char *path, const char *name, size_t name_len, int64_t k, nv_imatrix_entry **out);
void nv_imatrix_free(nv_imatrix *im);

/* The entry of tensor `name`, NULL when there is none. */
const nv_imatrix_entry *nv_imatrix_find(const nv_imatrix *im, const char *name);
/* Its mean squared inputs, k floats into out; a column never seen (count 0) weighs 1. */
void nv_imatrix_means(const nv_imatrix_entry *e, float *out);

/* Writes im as llama.cpp's imatrix GGUF, atomically. */
nv_err nv_imatrix_save(const nv_imatrix *im, const char *path);
/* Reads an imatrix GGUF, or llama.cpp's older binary .dat (int32 entries; per entry a name, its
 * call count and values already divided into means and multiplied back by the call count; then
 * the last call and the dataset), every length and count checked. */
nv_err nv_imatrix_load(const char *path, nv_imatrix *im);

#endif
