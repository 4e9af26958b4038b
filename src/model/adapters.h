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
 * - A mix (nv_adapter_mix, llama.cpp's per-request `lora` list) gives a sequence up to
 *   NV_MIX_ADAPTERS adapters, each with its own factor f: its rows get y += f B'(A x) of each, in
 *   the mix's order (ascending numbers), one adapter after the other (waves), so a row's result is
 *   the same whatever other rows share the step. A factor of 1 is the adapter alone, bit for bit.
 * - Identity: each adapter's hash covers its rank, targets, alpha, scale and values; the prefix
 *   cache roots an adapter's block chains at it, so KV made under one adapter is never served to
 *   another or to the base (a file loaded again after removal gets its blocks back). A mix's
 *   identity (nv_adapters_mix_root) is its one adapter's when that has factor 1, else a hash of its
 *   adapters' identities and factors. */
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
    float applied; /* its factor in requests that choose no adapter (llama.cpp's POST /lora-adapters; 0: none) */
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

/* The adapters one sequence runs with: numbers 1..NV_MAX_ADAPTERS, ascending and distinct, each
 * with a non-zero finite factor and the generation it was looked up at (n 0: the base model). */
#define NV_MIX_ADAPTERS 8
typedef struct {
    int n;
    int k[NV_MIX_ADAPTERS];
    float factor[NV_MIX_ADAPTERS];
    unsigned gen[NV_MIX_ADAPTERS];
} nv_adapter_mix;
/* Gives adapter k (of generation gen) the factor f in m, in its place among the others; f 0
 * takes it out. NV_ERANGE (m unchanged) when m already holds NV_MIX_ADAPTERS others. */
nv_err nv_adapter_mix_set(nv_adapter_mix *m, int k, unsigned gen, float f);
/* m's index of adapter k, -1 when m does not hold it. */
int nv_adapter_mix_find(const nv_adapter_mix *m, int k);
/* NV_EINVAL unless m is a mix as described (n 0..NV_MIX_ADAPTERS, numbers ascending in range,
 * factors finite and non-zero): callers that did not build m with nv_adapter_mix_set check it. */
nv_err nv_adapter_mix_check(const nv_adapter_mix *m);

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
/* How many adapters are live (a request may name them; set may be NULL: 0). */
int nv_adapters_live_count(nv_adapters *set);
/* Whether adapter k is live, with its generation in *gen when gen is given (set may be NULL). */
int nv_adapters_live(nv_adapters *set, int k, unsigned *gen);
/* Pins every adapter of m (nv_adapters_pin), or none (0) when one cannot be; unpins them. */
int nv_adapters_pin_mix(nv_adapters *set, const nv_adapter_mix *m);
void nv_adapters_unpin_mix(nv_adapters *set, const nv_adapter_mix *m);
/* The prefix cache's root of m's sequences (0 for the base model); m's adapters pinned. */
uint64_t nv_adapters_mix_root(const nv_adapters *set, const nv_adapter_mix *m);
/* The live adapters with a non-zero `applied` factor as a mix (requests that choose none run with it). */
void nv_adapters_applied(nv_adapters *set, nv_adapter_mix *out);
/* Sets the applied factors from m: each adapter of m gets its factor, every other one 0; all or
 * nothing (every adapter of m still live at its generation, else nothing changes: 0). */
int nv_adapters_apply(nv_adapters *set, const nv_adapter_mix *m);
/* fn(arg, k, adapter k) for each live adapter, in slot order, under the set's lock (fn must not call
 * into the set). */
void nv_adapters_each(nv_adapters *set, void (*fn)(void *arg, int k, const nv_adapter *a), void *arg);
/* The live adapters' names, in slot order, into names (at most cap), and their numbers into
 * numbers when given; returns how many. */
int nv_adapters_names(nv_adapters *set, char (*names)[NV_ADAPTER_NAME_CAP], int *numbers, int cap);

/* One step's rows grouped by adapter, wave by wave: wave w holds each row's w-th adapter (of its
 * mix). A wave's order lists its rows, those of adapter 1 first (in row order), then adapter 2's,
 * ..., with each one's factor; units cut each adapter's run of order into pieces of at most
 * NV_ADAPTER_UNIT rows, the pieces the pool shares out (a wave's units touch distinct rows). Scratch
 * for the products, shared by the waves: x gathered in order (rows x the widest input), A x (rows x
 * max_rank), B' A x (rows x the widest output). */
#define NV_ADAPTER_UNIT 64
typedef struct {
    int adapter, p0, p1; /* order[p0..p1) */
} nv_adapter_unit;
typedef struct {
    int *order;     /* [rows] */
    float *factor;  /* [rows]: the factor of order[p]'s row */
    nv_adapter_unit *units; /* [rows + NV_MAX_ADAPTERS] */
    int n_units;
} nv_adapter_wave;
typedef struct {
    const nv_adapters *set;
    int n, n_waves;
    nv_adapter_wave wave[NV_MIX_ADAPTERS];
    unsigned targets; /* the matrices some row's adapter targets */
    float *gx, *u, *dy;
} nv_adapter_rows;

/* Buffers for steps of up to max_rows rows of model c under set's adapters; r zeroed by free. */
nv_err nv_adapter_rows_init(nv_adapter_rows *r, const nv_config *c, const nv_adapters *set, int max_rows);
void nv_adapter_rows_free(nv_adapter_rows *r);
/* Groups n rows, row i taking the mix row_mix[i] (NULL or empty: none; its adapters pinned).
 * Reads only the pinned adapters (not the set's lock). */
void nv_adapter_rows_group(nv_adapter_rows *r, const nv_adapter_mix *const *row_mix, int n);
/* Whether any row's adapter targets matrix t (r may be NULL: none). */
static inline int nv_adapter_rows_target(const nv_adapter_rows *r, int t) { return r && (r->targets >> t & 1); }
/* y (n rows of `out` floats) += each row's adapters' updates of layer l's matrix t applied to its
 * row of x (n rows of `in` floats), each times its factor, wave after wave; rows of the base and of
 * adapters that do not target t unchanged. A wave's units run on the pool, each one's two products
 * in its own task (the small products of decode rows cost no hand-off of their own); a row's
 * result does not depend on the others. */
void nv_adapter_rows_add(const nv_adapter_rows *r, const nv_config *c, int l, int t, const float *x, float *y);

#endif
