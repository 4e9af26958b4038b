/* Token sampling: greedy, temperature, top-p, with llama2.c's generator and procedure, so the
 * same seed and settings pick the same tokens as llama2.c's run.c. */
#ifndef NV_SAMPLER_H
#define NV_SAMPLER_H

#include <stdint.h>

#include "base/err.h"

typedef struct {
    float prob;
    int index;
} nv_prob_index;

typedef struct {
    int vocab_size;
    float temperature; /* 0 = greedy */
    float top_p;       /* <= 0 or >= 1 disables nucleus sampling */
    uint64_t rng_state;
    nv_prob_index *probindex; /* scratch for top-p */
} nv_sampler;

nv_err nv_sampler_init(nv_sampler *s, int vocab_size, float temperature, float top_p, uint64_t seed);
void nv_sampler_free(nv_sampler *s);
/* Picks the next token; modifies logits in place (scaled and softmaxed when temperature > 0). */
int nv_sample(nv_sampler *s, float *logits);
int nv_argmax(const float *v, int n);

#endif
