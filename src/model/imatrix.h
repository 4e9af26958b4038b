/* Importance matrices (llama.cpp's imatrix): for each weight matrix, the sum over the tokens of a
 * text of each input column's squared activation, so that quantization can keep most exact the
 * weights that meet the largest inputs. Collected while a model runs text (nv_imatrix_collect,
 * `nerve imatrix`), written and read as llama.cpp's imatrix GGUF (tensors NAME.in_sum2, F32 [k, n],
 * and NAME.counts, F32 [1, n], n 1 or, for a mixture's stacked expert tensor, one per expert, each
 * expert summed over the tokens that chose it; general.type "imatrix", imatrix.datasets,
 * imatrix.chunk_count, imatrix.chunk_size) and read from its older .dat files too; `nerve export
 * --imatrix` uses it. */
#ifndef NV_IMATRIX_H
#define NV_IMATRIX_H

#include "base/err.h"
#include "model/model.h"

typedef struct {
    char name[64]; /* the weight's GGUF tensor name, e.g. blk.0.attn_q.weight */
    int k;         /* input columns of one matrix */
    int n_mat;     /* matrices: 1, or the experts of a mixture's stacked tensor (blk.N.ffn_up_exps.weight) */
    double *sum2;  /* [n_mat][k] sums of squared inputs */
    double *count; /* [n_mat] rows (tokens) each matrix summed */
} nv_imatrix_entry;

/* Where a plan's observer adds its inputs: matrix mat of entry e (nv_imatrix_collect's). */
typedef struct {
    int e, mat;
    struct nv_imatrix *im;
} nv_imatrix_obs;

typedef struct nv_imatrix {
    nv_imatrix_entry *e;
    int n;
    int chunks, chunk_size;
    char **datasets; /* what it was collected on */
    int n_datasets;
    nv_imatrix_obs *obs; /* one per observed plan (collecting only) */
    int n_obs;
} nv_imatrix;

/* An entry for each of m's plan matrices (built), each plan's observer set to add its inputs
 * (nv_plan_observe). The observers point into im: nv_imatrix_stop before im moves or is freed. */
nv_err nv_imatrix_collect(nv_imatrix *im, nv_model *m);
void nv_imatrix_stop(nv_model *m);
/* Adds the dataset name of len bytes (up to a NUL) to what im was collected on. */
nv_err nv_imatrix_add_dataset(nv_imatrix *im, const char *name, size_t len);
/* A new entry (zero sums and counts) named by name_len bytes of name (no NUL, shorter than 64, not
 * present yet) of n_mat matrices (1..NV_MOE_MAX_EXPERTS) with k columns each (k x n_mat at most
 * 2^24); path names the source in errors. The pointer is good until the next entry is added. */
nv_err nv_imatrix_add_entry(nv_imatrix *im, const char *path, const char *name, size_t name_len, int64_t k, int64_t n_mat,
                            nv_imatrix_entry **out);
void nv_imatrix_free(nv_imatrix *im);

/* The entry of tensor `name`, NULL when there is none. */
const nv_imatrix_entry *nv_imatrix_find(const nv_imatrix *im, const char *name);
/* Its mean squared inputs, k x n_mat floats into out (matrix by matrix); a matrix never seen (count
 * 0: an expert no token chose) weighs every column 1. */
void nv_imatrix_means(const nv_imatrix_entry *e, float *out);

/* Adds src's sums and counts into dst's entries of the same names (entries dst lacks are added;
 * one of another shape is an error naming path, src's file), its datasets after dst's and its
 * chunks to dst's: llama-imatrix's --in-file, several collections as one. */
nv_err nv_imatrix_merge(nv_imatrix *dst, const nv_imatrix *src, const char *path);
/* Writes im as llama.cpp's imatrix GGUF, atomically. */
nv_err nv_imatrix_save(const nv_imatrix *im, const char *path);
/* Reads an imatrix GGUF, or llama.cpp's older binary .dat (int32 entries; per entry a name, its
 * call count and values already divided into means and multiplied back by the call count; then
 * the last call and the dataset), every length and count checked. */
nv_err nv_imatrix_load(const char *path, nv_imatrix *im);

#endif
