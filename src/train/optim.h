/* AdamW with decoupled weight decay, global-norm gradient clipping, and the learning-rate
 * schedule: linear warmup, then to a floor (min_lr_frac x lr) by a cosine (the default), a straight
 * line, not at all (constant), or warmup-stable-decay (wsd: the full rate until the last decay_frac
 * of the steps, then a straight line to the floor, as MiniCPM and SmolLM train).
 *
 * Decay applies per parameter through a mask: matrices decay; norms and embeddings do not unless
 * asked (decay_embeddings). The state (m, v, step) is what a checkpoint saves. */
#ifndef NV_OPTIM_H
#define NV_OPTIM_H

#include <stdint.h>

#include "base/err.h"
#include "model/config.h"

typedef enum { NV_LR_COSINE = 0, NV_LR_LINEAR, NV_LR_CONSTANT, NV_LR_WSD } nv_lr_schedule;

typedef struct {
    float lr, min_lr_frac, beta1, beta2, eps, weight_decay, grad_clip;
    int warmup_steps, total_steps;
    int decay_embeddings;
    nv_lr_schedule schedule;
    float decay_frac; /* wsd: the share of the steps spent decaying */
} nv_adamw_opts;

/* "cosine", "linear", "constant" or "wsd". */
nv_err nv_lr_schedule_parse(const char *name, nv_lr_schedule *out);

typedef struct {
    nv_adamw_opts o;
    uint64_t n;
    float *m, *v;
    uint8_t *decay; /* [n] 1 where weight decay applies */
    long step;      /* updates done */
} nv_adamw;

void nv_adamw_defaults(nv_adamw_opts *o);
/* c gives the layout of a whole model's block (decay on its matrices); NULL: every parameter is a
 * matrix's (adapters), all decay. */
nv_err nv_adamw_init(nv_adamw *a, const nv_adamw_opts *o, const nv_config *c, uint64_t n_params);
void nv_adamw_free(nv_adamw *a);
/* Learning rate for update number step (0-based). */
float nv_lr_at(const nv_adamw_opts *o, long step);
/* L2 norm of the gradient vector. */
double nv_grad_norm(const float *g, uint64_t n);
/* One update of params from grads (clipped to grad_clip by global norm when > 0).
 * Returns the pre-clip gradient norm; *lr_out receives the rate used. A norm that is not finite
 * (a NaN or an infinity among the gradients) skips the update: params, m and v are left as they
 * are (it still counts as an update, so the schedule and a resumed run go on alike). */
double nv_adamw_step(nv_adamw *a, float *params, const float *grads, float *lr_out);

/* The same update in pieces, for a caller that does more with each piece while it is in cache
 * (nv_tmodel_optimize refreshes packed weights): nv_adamw_begin takes the gradient norm, the clip
 * factor and the rate and counts the update; then nv_adamw_range over pieces [lo, hi) that cover
 * 0..n-1 once, in any order and on any threads. Every value gets exactly nv_adamw_step's bits. */
typedef struct {
    double norm;
    float clip, lr, bc1, bc2;
    int skip; /* the norm is not finite: no nv_adamw_range for this update */
} nv_adamw_update;
nv_adamw_update nv_adamw_begin(nv_adamw *a, const float *grads);
/* Counts an update, made or skipped (the schedule and the bias correction go on), and returns its
 * rate: what nv_adamw_begin does first; alone, for an update the caller skips. */
float nv_adamw_count(nv_adamw *a);
void nv_adamw_range(const nv_adamw *a, const nv_adamw_update *u, float *params, const float *grads, uint64_t lo,
                    uint64_t hi);

#endif
