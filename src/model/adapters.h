/* LoRA adapters served per request: adapters loaded beside one base model and kept unmerged,
 * each adapted matrix as two engine plans (A, and B scaled by scale * alpha / rank), so one batched
 * step runs sequences of different adapters and of the base model together (vLLM's
 * --lora-modules; S-LoRA's unmerged serving). Merging (model/lora.h) is the one-adapter case.
 *
 * Contract:
 * - A set has NV_MAX_ADAPTERS slots; adapter k (1..NV_MAX_ADAPTERS) is set->v[k - 1], 0 is the
 *   base model. nv_adapters_add loads an adapter file (nv_gguf_load_lora: the base's
 *   architecture and shape; rank at most the set's max_rank) under a name into a free slot and
 *   builds its plans on the engine the model's plans run on (which must be built); the file is
 *   read and the plans built outside the set's lock, so requests go on meanwhile.
 * - Adding and removing may happen while the set serves (loading at run time): the set's lock
 *   guards names, states and reference counts. A request pins its adapter (nv_adapters_pin, by
 *   number and generation, so a slot taken by another adapter since the name was looked up is
 *   refused) for as long as it exists; nv_adapters_remove hides the name at once and frees the
 *   adapter when its last request unpins it. A slot is reused only once freed, so the plans of a
 *   pinned adapter never change under a running step. A slot's name is an array inside it: a
 *   pointer to it stays valid memory.
 * - A row of adapter k gets, for each matrix t its adapter targets, y += B'(A x) with B' =
 *   scale * (alpha / rank) * B: the merged model's product W' x up to the rounding of the two
 *   extra products (another order of sums, and on an int8 or bf16 engine their own quantisation
 *   of x and of A x). Rows of the base (0) are untouched: their results do not depend on which
 *   adapters share the step.
 * - Identity: each adapter's hash covers its rank, targets, alpha, scale and values; the prefix
 *   cache roots an adapter's block chains at it, so KV made under one adapter is never served to
 *   another or to the base (a file loaded again after removal gets its blocks back). */
#ifndef NV_ADAPTERS_H
#define NV_ADAPTERS_H

#include <pthread.h>
#include <stdint.h>

#include "base/err.h"
#include "engine/engine.h"
#include "model/lora.h"
#include "model/model.h"

#define NV_MAX_ADAPTERS 64
#define NV_ADAPTER_NAME_CAP 128 /* a name's bytes and its NUL (a fine-tuned model's id: ft:BASE:local:SUFFIX:ID) */

enum { NV_ADAPTER_FREE = 0, NV_ADAPTER_LOADING, NV_ADAPTER_LIVE, NV_ADAPTER_REMOVED };

typedef struct {
    char name[NV_ADAPTER_NAME_CAP];
    char *path;
    nv_lora_shape shape;
    float scale;       /* the user's factor on top of alpha / rank (1 for --lora-modules) */
    nv_plan **a, **b;  /* [n_layers * NV_LAYER_MATRICES]: A (rank x in) and B' (out x rank); NULL where not targeted */
    float *w;          /* their weights, per layer and target A then B' (plans may read them in place) */
    uint64_t hash;     /* non-zero */
    uint64_t n_params; /* the adapter's floats */
    /* under the set's lock */
    int state;    /* NV_ADAPTER_* */
    int refs;     /* requests that pinned it */
    unsigned gen; /* bumped whenever the slot takes an adapter */
} nv_adapter;

typedef struct {
    pthread_mutex_t mu;
    int n_layers;
    int max_rank; /* the largest rank the set takes (what serving's scratch is sized for) */
    int live;     /* adapters a request may name */
    nv_adapter v[NV_MAX_ADAPTERS];
} nv_adapters;

/* An empty set that takes adapters of rank 1..max_rank. */
void nv_adapters_init(nv_adapters *set, int max_rank);
/* Removes every adapter (none may be pinned) and the lock. */
void nv_adapters_free(nv_adapters *set);
/* NV_OK for a name an adapter may take: 1..NV_ADAPTER_NAME_CAP - 1 bytes, no control characters (it is logged and
 * printed in responses). */
nv_err nv_adapters_check_name(const char *name);
/* Adds the adapter in path as `name` (nv_adapters_check_name). Refuses a name already in the set, a full
 * set, a rank above max_rank, a file that does not fit the model (one line, the file named), a
 * scaled B that is not finite. */
nv_err nv_adapters_add(nv_adapters *set, const nv_model *m, const char *name, const char *path, float scale);
/* Hides the adapter called name (NV_EINVAL when no live one is) and frees it now or when its last
 * request unpins it. */
nv_err nv_adapters_remove(nv_adapters *set, const char *name);
/* The number (1..NV_MAX_ADAPTERS) of the live adapter called name, 0 when none is (set may be
 * NULL); its generation in *gen when gen is given. */
int nv_adapters_find(nv_adapters *set, const char *name, unsigned *gen);
/* Pins adapter k for a request when it is still of generation gen and live, or removed but held by
 * other pins (a request that named it before its removal) (1), else 0. */
int nv_adapters_pin(nv_adapters *set, int k, unsigned gen);
void nv_adapters_unpin(nv_adapters *set, int k);
/* The live adapters' names, in slot order, into names (at most cap), and their numbers into
 * numbers when given; returns how many. */
int nv_adapters_names(nv_adapters *set, char (*names)[NV_ADAPTER_NAME_CAP], int *numbers, int cap);

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
    float *gx, *u, *dy;
} nv_adapter_rows;

/* Floats of the three scratch buffers for max_rows rows of model c. */
void nv_adapter_scratch_sizes(const nv_config *c, const nv_adapters *set, int max_rows, size_t *gx, size_t *u, size_t *dy);
/* Groups n rows, row i taking adapter row_adapter[i] (0: none; the others pinned); r's buffers
 * must be set. Reads only the pinned adapters (not the set's lock). */
void nv_adapter_rows_group(nv_adapter_rows *r, const int *row_adapter, int n);
/* Whether any row's adapter targets matrix t (r may be NULL: none). */
static inline int nv_adapter_rows_target(const nv_adapter_rows *r, int t) { return r && (r->targets >> t & 1); }
/* y (n rows of `out` floats) += each row's adapter update of layer l's matrix t applied to its row
 * of x (n rows of `in` floats); rows of the base and of adapters that do not target t unchanged.
 * The units run on the pool, each one's two products in its own task (the small products of
 * decode rows cost no hand-off of their own); a row's result does not depend on the others. */
void nv_adapter_rows_add(const nv_adapter_rows *r, const nv_config *c, int l, int t, const float *x, float *y);

#endif
