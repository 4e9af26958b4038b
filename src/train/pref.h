/* Preference training's losses, one pair at a time: from the summed log-probabilities of its two
 * answers (the preferred first) over their target tokens, and for the losses that have one, a
 * reference model's (the starting model's: train.c computes them before the first step).
 *
 *   dpo    -log sigmoid(beta ((lp_c - ref_c) - (lp_r - ref_r)))            (Rafailov et al. 2023)
 *   ipo    ((m_c - mref_c) - (m_r - mref_r) - 1 / (2 beta))^2              (Azar et al. 2023)
 *   simpo  -log sigmoid(beta (m_c - m_r) - gamma)                          (Meng et al. 2024)
 *   orpo   -m_c - beta log sigmoid(log odds(m_c) - log odds(m_r))          (Hong et al. 2024)
 *
 * lp is an answer's summed log p, m its mean a token (lp / n, as TRL takes them for IPO, SimPO and
 * ORPO), odds(m) = e^m / (1 - e^m). sft_weight adds sft_weight x -m_c to any of them (RPO). The
 * gradient is the loss's derivative with respect to each lp: the backward gives each answer's
 * tokens that weight (nv_tmodel_backward_seq takes its negative, the weight of the cross-entropy). */
#ifndef NV_PREF_H
#define NV_PREF_H

#include "base/err.h"

typedef enum { NV_PREF_DPO, NV_PREF_IPO, NV_PREF_SIMPO, NV_PREF_ORPO, NV_PREF_COUNT } nv_pref_kind;

typedef struct {
    nv_pref_kind kind;
    float beta;       /* <= 0: the kind's default (nv_pref_default_beta) */
    float gamma;      /* SimPO's target margin */
    float sft_weight; /* >= 0 */
} nv_pref_opts;

nv_err nv_pref_kind_parse(const char *name, nv_pref_kind *out);
const char *nv_pref_kind_name(nv_pref_kind k);
/* TRL's defaults: 0.1 (DPO, IPO, ORPO's lambda), 2.0 (SimPO). */
float nv_pref_default_beta(nv_pref_kind k);
/* DPO and IPO compare with a reference; SimPO and ORPO need none. */
int nv_pref_needs_reference(nv_pref_kind k);

/* One pair's loss. lp[0], lp[1]: the preferred and the other answer's summed log p over n[0], n[1]
 * > 0 target tokens; ref likewise (read only where the kind needs one). grad[k] receives d loss /
 * d lp[k]; *margin (may be NULL) the difference of the two answers' rewards under this loss (> 0:
 * the pair preferred rightly; DPO's z, IPO's h, SimPO's beta (m_c - m_r), ORPO's log odds ratio). */
double nv_pref_pair(const nv_pref_opts *o, const double lp[2], const int n[2], const double ref[2], double grad[2],
                    double *margin);

#endif
