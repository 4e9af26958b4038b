/* Reference logits for tests: a sequence run alone through nv_forward, one position at a time. */
#ifndef NV_TEST_FORWARD_REF_H
#define NV_TEST_FORWARD_REF_H

#include <math.h>
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

/* References in doubles, straight from the definitions: RMSNorm of x (n values) by weights w into o,
 * and y[rows] = W[rows][cols] . x (+ b, when given). */
static inline void t_ref_rmsnorm(double *o, const double *x, const float *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) o[i] = x[i] * r * w[i];
}

static inline void t_ref_affine(double *y, const float *W, const float *b, const double *x, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        double s = b ? b[r] : 0;
        for (int k = 0; k < cols; k++) s += (double)W[(size_t)r * cols + k] * x[k];
        y[r] = s;
    }
}

/* The largest difference between two sets of count logits, over the largest of b's (a NaN is the worst). */
static inline double t_logit_gap(const float *a, const float *b, size_t count) {
    double worst = 0, scale = 1e-30;
    for (size_t i = 0; i < count; i++) {
        const double dlt = fabs((double)a[i] - b[i]);
        worst = dlt > worst || dlt != dlt ? dlt : worst;
        scale = fmax(scale, fabs((double)b[i]));
    }
    return worst / scale;
}

#endif
