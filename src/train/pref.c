#include "train/pref.h"

#include <math.h>
#include <string.h>

static const char *const names[NV_PREF_COUNT] = {"dpo", "ipo", "simpo", "orpo"};

nv_err nv_pref_kind_parse(const char *name, nv_pref_kind *out) {
    for (int k = 0; k < NV_PREF_COUNT; k++)
        if (!strcmp(name, names[k])) {
            *out = (nv_pref_kind)k;
            return NV_OK;
        }
    return nv_fail(NV_EINVAL, "unknown preference loss '%s' (known: dpo, ipo, simpo, orpo)", name);
}

const char *nv_pref_kind_name(nv_pref_kind k) { return k < NV_PREF_COUNT ? names[k] : "?"; }

float nv_pref_default_beta(nv_pref_kind k) { return k == NV_PREF_SIMPO ? 2.0f : 0.1f; }

int nv_pref_needs_reference(nv_pref_kind k) { return k == NV_PREF_DPO || k == NV_PREF_IPO; }

/* -log sigmoid(z), without overflow either way */
static double softplus_neg(double z) { return (z > 0 ? 0.0 : -z) + log1p(exp(-fabs(z))); }

static double sigmoid_neg(double z) { return 1.0 / (1.0 + exp(z)); } /* sigmoid(-z) */

/* log(e^m / (1 - e^m)) of a mean log p m < 0, and its derivative 1 / (1 - e^m); an answer certain to
   the last bit (m = 0) is taken as m = -1e-9, where the odds are finite */
static double log_odds(double m, double *d) {
    if (m > -1e-9) m = -1e-9;
    const double one_minus = -expm1(m); /* 1 - e^m, exact for m near 0 */
    *d = 1.0 / one_minus;
    return m - log(one_minus);
}

double nv_pref_pair(const nv_pref_opts *o, const double lp[2], const int n[2], const double ref[2], double grad[2],
                    double *margin) {
    const double beta = o->beta > 0 ? o->beta : nv_pref_default_beta(o->kind);
    const double m_c = lp[0] / n[0], m_r = lp[1] / n[1];
    double loss = 0, z = 0;
    switch (o->kind) {
    case NV_PREF_DPO: {
        z = beta * ((lp[0] - ref[0]) - (lp[1] - ref[1]));
        loss = softplus_neg(z);
        const double dz = -sigmoid_neg(z) * beta;
        grad[0] = dz, grad[1] = -dz;
        break;
    }
    case NV_PREF_IPO: {
        z = (m_c - ref[0] / n[0]) - (m_r - ref[1] / n[1]);
        const double d = z - 1.0 / (2.0 * beta);
        loss = d * d;
        grad[0] = 2.0 * d / n[0], grad[1] = -2.0 * d / n[1];
        break;
    }
    case NV_PREF_SIMPO: {
        z = beta * (m_c - m_r);
        loss = softplus_neg(z - o->gamma);
        const double dz = -sigmoid_neg(z - o->gamma) * beta;
        grad[0] = dz / n[0], grad[1] = -dz / n[1];
        break;
    }
    case NV_PREF_ORPO:
    default: {
        double d_c, d_r;
        z = log_odds(m_c, &d_c) - log_odds(m_r, &d_r);
        loss = -m_c + beta * softplus_neg(z);
        const double dz = -beta * sigmoid_neg(z);
        grad[0] = -1.0 / n[0] + dz * d_c / n[0], grad[1] = -dz * d_r / n[1];
        break;
    }
    }
    if (o->sft_weight > 0) {
        loss -= o->sft_weight * m_c;
        grad[0] -= o->sft_weight / n[0];
    }
    if (margin) *margin = z;
    return loss;
}
