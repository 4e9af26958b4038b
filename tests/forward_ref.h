/* Reference logits for tests: a sequence run alone through nv_forward, one position at a time. */
#ifndef NV_TEST_FORWARD_REF_H
#define NV_TEST_FORWARD_REF_H

#include <string.h>

#include "model/forward.h"
#include "model/model.h"

/* Logits after each of toks[0..n) into out[n][vocab]; 0 on failure. */
static inline int t_forward_logits(const nv_model *m, const int *toks, int n, float *out) {
    nv_state s;
    if (nv_state_init(&s, &m->config, 1, m->config.seq_len, 0) != NV_OK) return 0;
    int ok = 1;
    for (int p = 0; p < n && ok; p++) {
        ok = nv_forward(m, &s, toks + p, 1, p) == NV_OK;
        memcpy(out + (size_t)p * m->config.vocab_size, s.logits, (size_t)m->config.vocab_size * sizeof(float));
    }
    nv_state_free(&s);
    return ok;
}

#endif
