/* LoRA adapters served per request: adapters loaded beside one base model and kept unmerged,
 * each adapted matrix as two engine plans (A, and B scaled by scale * alpha / rank), so one batched
 * step runs sequences of different adapters and of the base model together (vLLM's
 * --lora-modules; S-LoRA's unmerged serving). Merging (model/lora.h) is the one-adapter case.
 *
 * Contract:
 * - nv_adapters_add loads an adapter file (nv_gguf_load_lora: the base's architecture and shape)
 *   under a name and builds its plans on the engine the model's plans run on (the model's plans
 *   must be built). Adapter k (1..n) is set->v[k - 1]; 0 is the base model.
 * - A row of adapter k gets, for each matrix t its adapter targets, y += B'(A x) with B' =
 *   scale * (alpha / rank) * B: the merged model's product W' x up to the rounding of the two
 *   extra products (another order of sums, and on an int8 or bf16 engine their own quantisation
 *   of x and of A x). Rows of the base (0) are untouched: their results do not depend on which
 *   adapters share the step.
 * - Identity: each adapter's hash covers its rank, targets, alpha, scale and values; the prefix
 *   cache roots an adapter's block chains at it, so KV made under one adapter is never served to
 *   another or to the base. */
#ifndef NV_ADAPTERS_H
#define NV_ADAPTERS_H

#include <stdint.h>

#include "base/err.h"
#include "engine/engine.h"
#include "model/lora.h"
#include "model/model.h"

#define NV_MAX_ADAPTERS 64

typedef struct {
    char *name;
    char *path;
    nv_lora_shape shape;
    float scale;       /* the user's factor on top of alpha / rank (1 for --lora-modules) */
    nv_plan **a, **b;  /* [n_layers * NV_LAYER_MATRICES]: A (rank x in) and B' (out x rank); NULL where not targeted */
    float *w;          /* their weights, per layer and target A then B' (plans may read them in place) */
    uint64_t hash;     /* non-zero */
    uint64_t n_params; /* the adapter's floats */
} nv_adapter;

typedef struct {
    int n;
    nv_adapter *v;
    int n_layers;
    int max_rank;
    unsigned targets; /* union of the adapters' NV_LORA_* bits */
} nv_adapters;

/* Adds the adapter in path as `name` (1..63 characters). Refuses a name already in the set, more
 * than NV_MAX_ADAPTERS, a file that does not fit the model (one line, the file named). */
nv_err nv_adapters_add(nv_adapters *set, const nv_model *m, const char *name, const char *path, float scale);
void nv_adapters_free(nv_adapters *set);
/* The number (1..n) of the adapter called name, 0 when none is. */
int nv_adapters_find(const nv_adapters *set, const char *name);

/* One step's rows grouped by adapter: order lists the adapted rows, those of adapter 1 first (in
 * row order), then adapter 2's, ...; units cut each adapter's run of order into pieces of at most
 * NV_ADAPTER_UNIT rows, the pieces the pool shares out. Scratch for the products: x gathered in
 * that order (rows x the widest input), A x (rows x max_rank), B' A x (rows x the widest output). */
#define NV_ADAPTER_UNIT 64
typedef struct {
    int adapter, p0, p1; /* order[p0..p1) */
} nv_adapter_unit;
typedef struct {
    const nv_adapters *set;
    int n;      /* rows of the step */
    int *order; /* [n] */
    nv_adapter_unit *units; /* [n + NV_MAX_ADAPTERS] */
    int n_units;
    unsigned targets; /* the matrices some row's adapter targets */
    int max_rank;     /* the rank u was sized for (nv_batch_state_set_adapters) */
    float *gx, *u, *dy;
} nv_adapter_rows;

/* Floats of the three scratch buffers for max_rows rows of model c. */
void nv_adapter_scratch_sizes(const nv_config *c, const nv_adapters *set, int max_rows, size_t *gx, size_t *u, size_t *dy);
/* Groups n rows, row i taking adapter row_adapter[i] (0: none); r's buffers must be set. */
void nv_adapter_rows_group(nv_adapter_rows *r, const int *row_adapter, int n);
/* Whether any row's adapter targets matrix t (r may be NULL: none). */
static inline int nv_adapter_rows_target(const nv_adapter_rows *r, int t) { return r && (r->targets >> t & 1); }
/* y (n rows of `out` floats) += each row's adapter update of layer l's matrix t applied to its row
 * of x (n rows of `in` floats); rows of the base and of adapters that do not target t unchanged.
 * The units run on the pool, each one's two products in its own task (the small products of
 * decode rows cost no hand-off of their own); a row's result does not depend on the others. */
void nv_adapter_rows_add(const nv_adapter_rows *r, const nv_config *c, int l, int t, const float *x, float *y);

#endif
