/* Training gradients: every parameter tensor's gradient from the fp32 path matches central
 * finite differences; the fast engines' gradients match fp32 within their precision. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/pool.h"
#include "base/rng.h"
#include "engine/engine.h"
#include "engine/kern.h"
#include "train/attention.h"
#include "train/optim.h"
#include "train/pref.h"
#include "train/tmodel.h"
#include "t.h"

typedef struct {
    const char *name;
    size_t off, n; /* offset into params, count */
} tensor;

static int tensors_of(const nv_tmodel *tm, tensor *out) {
    const nv_weights *w = &tm->m.w;
    const nv_config *c = &tm->m.config;
    size_t L = (size_t)c->n_layers, d = (size_t)c->dim, h = (size_t)c->hidden_dim, V = (size_t)c->vocab_size;
    size_t qd = (size_t)nv_config_q_dim(c), kvd = (size_t)nv_config_kv_dim(c), sets = (size_t)nv_config_ffn_sets(c);
    const float *base = tm->m.params;
    struct {
        const char *name;
        const float *p;
        size_t n;
    } all[] = {{"rms_att", w->rms_att, L * d}, {"rms_ffn", w->rms_ffn, L * d}, {"rms_final", w->rms_final, d},
               {"tok_emb", w->tok_emb, V * d},  {"wq", w->wq, L * qd * d},     {"wk", w->wk, L * kvd * d},
               {"wv", w->wv, L * kvd * d},      {"wo", w->wo, L * d * qd},     {"w1", w->w1, L * sets * h * d},
               {"w2", w->w2, L * sets * d * h}, {"w3", w->w3, L * sets * h * d},
               {"router", w->router, L * (size_t)c->n_experts * d},
               {"wcls", c->shared_classifier ? NULL : w->wcls, V * d},
               {"q_norm", w->q_norm, L * (size_t)nv_config_q_norm_len(c)}, {"k_norm", w->k_norm, L * (size_t)nv_config_k_norm_len(c)},
               {"bq", w->bq, L * qd}, {"bk", w->bk, L * kvd}, {"bv", w->bv, L * kvd},
               {"post_att", w->post_att, L * d}, {"post_ffn", w->post_ffn, L * d}};
    int n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i].p) out[n++] = (tensor){all[i].name, (size_t)(all[i].p - base), all[i].n};
    return n;
}

static void make_batch(int B, int T, int V, int *in, int *tg, uint64_t seed) {
    for (int i = 0; i < B * T; i++) {
        in[i] = (int)(nv_xorshift_u32(&seed) % (unsigned)V);
        tg[i] = (int)(nv_xorshift_u32(&seed) % (unsigned)V);
    }
}

/* Scales weights up from the 0.02 init so that every path carries a visible gradient. */
/* What perturb_init multiplies the initial weights by, and the finite differences' step: 12 and 1e-2
 * let the norms' and softmaxes' nonlinearity show. A model without norms before its branches (OLMo 2)
 * multiplies raw residual rows that large and bends within +-1e-2, so its test takes 4 and 1e-3. */
static float fd_weight_scale = 12.0f, fd_h = 1e-2f;

static void perturb_init(nv_tmodel *tm, uint64_t seed) {
    nv_rng r;
    nv_rng_seed(&r, seed);
    for (uint64_t i = 0; i < tm->m.n_params; i++) tm->m.params[i] *= fd_weight_scale;
    const nv_config *c = &tm->m.config;
    /* rms_att..rms_final are contiguous (OLMo 2: rms_final alone) */
    size_t nn = (c->no_pre_norms ? 0 : (size_t)c->n_layers * c->dim * 2) + c->dim;
    float *norms = c->no_pre_norms ? tm->m.w.rms_final : tm->m.w.rms_att;
    for (size_t i = 0; i < nn; i++) norms[i] = 1.0f + 0.3f * nv_rng_normal(&r);
    if (c->qk_norm == 1)
        for (int i = 0; i < c->n_layers * c->head_dim; i++) {
            tm->m.w.q_norm[i] = 1.0f + 0.3f * nv_rng_normal(&r);
            tm->m.w.k_norm[i] = 1.0f + 0.3f * nv_rng_normal(&r);
        }
    for (int i = 0; c->qk_norm == NV_QK_NORM_WHOLE && i < c->n_layers * nv_config_q_norm_len(c); i++) tm->m.w.q_norm[i] = 1.0f + 0.3f * nv_rng_normal(&r);
    for (int i = 0; c->qk_norm == NV_QK_NORM_WHOLE && i < c->n_layers * nv_config_k_norm_len(c); i++) tm->m.w.k_norm[i] = 1.0f + 0.3f * nv_rng_normal(&r);
    for (int i = 0; c->post_norms && i < c->n_layers * c->dim; i++) {
        tm->m.w.post_att[i] = 1.0f + 0.3f * nv_rng_normal(&r);
        tm->m.w.post_ffn[i] = 1.0f + 0.3f * nv_rng_normal(&r);
    }
    if (c->qkv_bias) {
        const int qd = nv_config_q_dim(c), kvd = nv_config_kv_dim(c);
        for (int i = 0; i < c->n_layers * qd; i++) tm->m.w.bq[i] = 0.5f * nv_rng_normal(&r);
        for (int i = 0; i < c->n_layers * kvd; i++) tm->m.w.bk[i] = 0.5f * nv_rng_normal(&r), tm->m.w.bv[i] = 0.5f * nv_rng_normal(&r);
    }
    nv_tmodel_refresh(tm);
}

/* The loss differentiated: the mean cross-entropy (pairs 0), or, with pairs > 0, the mean preference
 * loss of `pairs` pairs (rows 2i and 2i + 1 of the batch) against fixed reference log-probabilities;
 * its gradient then comes from nv_tmodel_backward_seq with nv_pref_pair's, as training takes it. */
typedef struct {
    int pairs;
    nv_pref_opts o;
    double ref[8];
} fd_loss;

static double loss_of(nv_tmodel *tm, const int *in, const int *tg, const fd_loss *l, float *seq_scale) {
    nv_tmodel_forward(tm, in, tg);
    if (!l || !l->pairs) /* a mixture's balance and z terms; distillation's objective */
        return (double)tm->objective + (double)tm->router_aux_coef * tm->router_aux + (double)tm->router_z_coef * tm->router_z;
    double logp[8], total = 0;
    nv_tmodel_seq_logp(tm, logp);
    for (int i = 0; i < l->pairs; i++) {
        double grad[2];
        int n[2] = {0, 0};
        for (int k = 0; k < 2; k++)
            for (int t = 0; t < tm->T; t++) n[k] += tg[(2 * i + k) * tm->T + t] >= 0;
        total += nv_pref_pair(&l->o, logp + 2 * i, n, l->ref + 2 * i, grad, NULL);
        for (int k = 0; seq_scale && k < 2; k++) seq_scale[2 * i + k] = (float)(-grad[k] / l->pairs);
    }
    return total / l->pairs;
}

/* ignore_every > 0: every ignore_every-th target is -1 (chat data's prompt tokens), which the loss
 * and its gradient skip; seg: packed documents (nv_tmodel_set_segments), or NULL; l: the loss (NULL:
 * the mean cross-entropy) */
static float fd_aux_coef, fd_z_coef; /* a mixture of experts' load-balancing and z-loss weights in the loss checked */
static float fd_dropout;              /* dropout on the residual branches in the loss checked (its mask fixed) */
static const float *fd_teacher;       /* distillation: a teacher's logits for the batch, with its weight and temperature */
static float fd_alpha, fd_temp;

/* 1 when the last forward routed every row as the one whose choices `sel` holds (a mixture of
   experts' loss jumps where a choice changes: a finite difference across one says nothing) */
static int same_routing(const nv_tmodel *tm, const int *sel, size_t n) {
    return !sel || !memcmp(tm->a.moe_sel, sel, n * sizeof(int));
}

static void check_fd_loss(const nv_config *c, int B, int T, int ignore_every, const int *seg, const fd_loss *l) {
    nv_tmodel tm;
    nv_err e = nv_tmodel_init(&tm, c, NULL, 5, B, T, NV_ENGINE_SCALAR);
    T_CHECK(e == NV_OK, "%s", nv_errmsg());
    if (e) return;
    perturb_init(&tm, 6);
    tm.router_aux_coef = fd_aux_coef, tm.router_z_coef = fd_z_coef;
    nv_tmodel_set_segments(&tm, seg);
    T_CHECK(nv_tmodel_set_dropout(&tm, fd_dropout, 0.0f, 99, 3) == NV_OK, "%s", nv_errmsg());
    T_CHECK(nv_tmodel_set_teacher(&tm, fd_teacher, fd_alpha, fd_temp) == NV_OK, "%s", nv_errmsg());
    int in[64], tg[64];
    make_batch(B, T, c->vocab_size, in, tg, 77);
    for (int i = 0; ignore_every > 0 && i < B * T; i++)
        if (i % ignore_every == 1) tg[i] = -1;
    nv_tmodel_zero_grad(&tm);
    float seq_scale[8];
    const double loss = loss_of(&tm, in, tg, l, seq_scale);
    T_CHECK(isfinite(loss) && loss > 0, "loss %f", loss);
    const size_t n_sel = (size_t)c->n_layers * B * T * c->n_experts_used;
    int *sel = c->n_experts ? malloc(n_sel * sizeof(int)) : NULL;
    if (sel) memcpy(sel, tm.a.moe_sel, n_sel * sizeof(int));
    if (l && l->pairs) nv_tmodel_backward_seq(&tm, seq_scale);
    else nv_tmodel_backward(&tm, 1.0f);
    tensor ts[20];
    int nt = tensors_of(&tm, ts);
    const float h = fd_h;
    int rerouted = 0, checked = 0;
    for (int ti = 0; ti < nt; ti++) {
        tensor *t = &ts[ti];
        /* the 4 largest gradients and 8 random entries */
        size_t pick[12];
        int np = 0;
        for (int rank = 0; rank < 4 && rank < (int)t->n; rank++) {
            size_t best = 0;
            float bv = -1;
            for (size_t i = 0; i < t->n; i++) {
                int used = 0;
                for (int j = 0; j < np; j++) used |= pick[j] == i;
                float g = fabsf(tm.grads[t->off + i]);
                if (!used && g > bv) bv = g, best = i;
            }
            pick[np++] = best;
        }
        uint64_t st = 1234 + (uint64_t)ti;
        while (np < 12) pick[np++] = nv_xorshift_u32(&st) % t->n;
        int bad = 0;
        float worst_an = 0, worst_fd = 0;
        for (int j = 0; j < np; j++) {
            float *p = &tm.m.params[t->off + pick[j]];
            float orig = *p;
            *p = orig + h;
            nv_tmodel_refresh(&tm);
            double lp = loss_of(&tm, in, tg, l, NULL);
            int same = same_routing(&tm, sel, n_sel);
            *p = orig - h;
            nv_tmodel_refresh(&tm);
            double lm = loss_of(&tm, in, tg, l, NULL);
            same &= same_routing(&tm, sel, n_sel);
            *p = orig;
            nv_tmodel_refresh(&tm);
            if (!same) { /* a choice flipped within +-h: the loss is not smooth there */
                rerouted++;
                continue;
            }
            checked++;
            float fd = (float)((lp - lm) / (2.0 * h)), an = tm.grads[t->off + pick[j]];
            if (fabsf(fd - an) > 3e-4f + 3e-2f * fabsf(an)) {
                bad++;
                worst_an = an, worst_fd = fd;
            }
        }
        T_CHECK(bad == 0, "%s: %d of %d entries differ (e.g. analytic %.6g vs finite difference %.6g)", t->name, bad, np,
                worst_an, worst_fd);
    }
    if (sel) printf("    %d experts, %d a token: %d entries checked, %d across a routing change\n", c->n_experts, c->n_experts_used, checked, rerouted);
    T_CHECK(rerouted * 4 <= checked, "%d entries' finite differences crossed a routing change, %d did not", rerouted, checked);
    free(sel);
    nv_tmodel_free(&tm);
}

static void check_fd_segments(const nv_config *c, int B, int T, int ignore_every, const int *seg) {
    check_fd_loss(c, B, T, ignore_every, seg, NULL);
}

static void check_fd(const nv_config *c, int B, int T) { check_fd_segments(c, B, T, 0, NULL); }

/* Preference training's gradients: the mean loss of two pairs (each answer's every third target
 * masked, as a prompt's are) against reference log-probabilities on either side of the model's, so
 * that one pair is preferred rightly and the other not, matches finite differences for each loss,
 * with and without the SFT term; and the losses' own values: DPO's log 2 where the model is its
 * reference, no overflow far either way, IPO's square, SimPO's and ORPO's closed forms. */
static void test_fd_preference(void) {
    nv_config c = {16, 24, 2, 4, 2, 4, 23, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    for (int k = 0; k < NV_PREF_COUNT; k++) {
        fd_loss l = {.pairs = 2, .o = {(nv_pref_kind)k, 0.5f, 0.3f, k == NV_PREF_DPO ? 0.0f : 0.7f}, .ref = {-40, -35, -30, -45}};
        check_fd_loss(&c, 4, 6, 3, NULL, &l);
    }
    const int n[2] = {2, 4};
    double g[2], margin;
    nv_pref_opts dpo = {NV_PREF_DPO, 0.1f, 0, 0}, ipo = {NV_PREF_IPO, 0.25f, 0, 0}, simpo = {NV_PREF_SIMPO, 0, 0.5f, 0};
    nv_pref_opts orpo = {NV_PREF_ORPO, 0, 0, 0};
    T_CHECK(fabs(nv_pref_pair(&dpo, (double[]){-3, -5}, n, (double[]){-3, -5}, g, &margin) - log(2.0)) < 1e-12 &&
                margin == 0 && fabs(g[0] + 0.05) < 1e-8 && fabs(g[1] - 0.05) < 1e-8,
            "DPO at the reference: loss log 2, margin 0, gradients -+beta / 2");
    dpo.beta = 1;
    const double far = nv_pref_pair(&dpo, (double[]){0, -1000}, n, (double[]){-500, -500}, g, &margin);
    T_CHECK(far >= 0 && far < 1e-12 && fabs(g[0]) < 1e-12 && margin == 1000, "DPO far right: %g %g", far, g[0]);
    const double wrong = nv_pref_pair(&dpo, (double[]){-1000, 0}, n, (double[]){-500, -500}, g, &margin);
    T_CHECK(fabs(wrong - 1000) < 1e-9 && fabs(g[0] + 1.0) < 1e-12, "DPO far wrong: %g %g", wrong, g[0]);
    /* IPO: h = (-2/2 - -4/2) - (-8/4 - -8/4) = 1; (1 - 1/(2 x 0.25))^2 = 1 */
    T_CHECK(fabs(nv_pref_pair(&ipo, (double[]){-2, -8}, n, (double[]){-4, -8}, g, &margin) - 1.0) < 1e-12 && margin == 1,
            "IPO's square");
    /* SimPO (beta 2 by default): 2 (-1 - -2) - 0.5 = 1.5 */
    T_CHECK(fabs(nv_pref_pair(&simpo, (double[]){-2, -8}, n, NULL, g, &margin) - log1p(exp(-1.5))) < 1e-12 && margin == 2,
            "SimPO's loss");
    /* ORPO (lambda 0.1): -m_c + 0.1 softplus(-(log odds(-1) - log odds(-2))) */
    const double lo = (-1 - log(1 - exp(-1.0))) - (-2 - log(1 - exp(-2.0)));
    T_CHECK(fabs(nv_pref_pair(&orpo, (double[]){-2, -8}, n, NULL, g, &margin) - (1 + 0.1 * log1p(exp(-lo)))) < 1e-8 &&
                fabs(margin - lo) < 1e-12,
            "ORPO's loss");
    /* an answer certain to the last bit: finite */
    const double sure = nv_pref_pair(&orpo, (double[]){0, -8}, n, NULL, g, &margin);
    T_CHECK(isfinite(sure) && isfinite(g[0]) && isfinite(g[1]), "ORPO at p = 1: %g %g %g", sure, g[0], g[1]);
    nv_pref_kind kind;
    T_CHECK(nv_pref_kind_parse("simpo", &kind) == NV_OK && kind == NV_PREF_SIMPO && nv_pref_kind_parse("kto", &kind) != NV_OK &&
                strstr(nv_errmsg(), "known: dpo, ipo, simpo, orpo"),
            "names");
}

/* Packed windows: each row attends to its own document alone. The gradient through the masked
 * attention matches finite differences; and a document's losses in a packed window (across
 * attention's blocks of rows) are the ones it has in a window of its own (RoPE sees only relative positions: equal to float rounding), where
 * without the documents they would not be. */
static void test_packed_documents(void) {
    nv_config c = {16, 24, 2, 4, 2, 4, 23, 16, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    const int seg[12] = {0, 0, 0, 3, 3, 3, 0, 0, 2, 2, 2, 5}; /* two windows of 6: [3 | 3] and [2 | 3 | 1] */
    check_fd_segments(&c, 2, 6, 0, seg);
    /* 50 + 60 rows: the second document starts in attention's first block of 64 rows and runs on
       into the second */
    nv_config big = {32, 64, 2, 4, 2, 8, 40, 128, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    enum { TA = 50, TB = 60, TW = TA + TB };
    nv_tmodel packed, alone;
    if (nv_tmodel_init(&packed, &big, NULL, 3, 1, TW, nv_engine_best_fp32()) != NV_OK ||
        nv_tmodel_init(&alone, &big, packed.m.params, 3, 1, TB, nv_engine_best_fp32()) != NV_OK) { /* fp32: bf16 rounds the two row sets apart */
        T_CHECK(0, "%s", nv_errmsg());
        return;
    }
    int in[TW], tg[TW], segs[TW], tg_b[TB];
    make_batch(1, TW, big.vocab_size, in, tg, 5);
    for (int t = 0; t < TW; t++) segs[t] = t < TA ? 0 : TA, tg[t] = t < TA ? -1 : tg[t];
    for (int t = 0; t < TB; t++) tg_b[t] = tg[TA + t];
    nv_tmodel_set_segments(&packed, segs);
    const float lp = nv_tmodel_forward(&packed, in, tg), la = nv_tmodel_forward(&alone, in + TA, tg_b);
    T_CHECK(fabsf(lp - la) <= 1e-5f * la, "document B's loss %.8g packed, %.8g alone", lp, la);
    /* the gradients of the two agree too (the second document's share of every weight) */
    nv_tmodel_backward(&packed, 1.0f);
    nv_tmodel_backward(&alone, 1.0f);
    double num = 0, den = 0;
    for (uint64_t i = 0; i < packed.m.n_params; i++) {
        const double d = (double)packed.grads[i] - alone.grads[i];
        num += d * d, den += (double)alone.grads[i] * alone.grads[i];
    }
    T_CHECK(den > 0 && sqrt(num / den) < 1e-4, "gradients packed vs alone differ by %.3g", sqrt(num / den));
    nv_tmodel_set_segments(&packed, NULL);
    const float lc = nv_tmodel_forward(&packed, in, tg);
    T_CHECK(fabsf(lc - la) > 1e-4f * la, "without documents the loss %.8g is still the lone one's %.8g", lc, la);
    /* the FLOPs counted: attention over the keys each row sees, its own document's (50 + 60 rows:
       50*51/2 + 60*61/2 key-rows a layer against 110*111/2 as one document), the products the same */
    const double per_key = 12.0 * big.n_heads * big.head_dim, L = big.n_layers;
    T_CHECK(packed.flops_key == per_key && packed.flops_per_step == nv_tmodel_step_flops(&packed, NULL) &&
                fabs(nv_tmodel_step_flops(&packed, NULL) - packed.flops_dense - per_key * L * (110.0 * 111 / 2)) < 1e-6 * packed.flops_per_step &&
                fabs(nv_tmodel_step_flops(&packed, segs) - packed.flops_dense - per_key * L * (50.0 * 51 / 2 + 60.0 * 61 / 2)) <
                    1e-6 * packed.flops_per_step,
            "step FLOPs: %.6g one document, %.6g packed, %.6g of products", nv_tmodel_step_flops(&packed, NULL),
            nv_tmodel_step_flops(&packed, segs), packed.flops_dense);
    nv_tmodel_free(&packed);
    nv_tmodel_free(&alone);
    /* a window of 3 on every other layer: a row sees at most 3 keys there (two windows of 8, the second
       two documents of 4: 36 + 20 key-rows in the global layer, 21 + 18 in the windowed one) */
    nv_config w = {16, 24, 2, 4, 2, 4, 23, 16, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    w.swa_window = 3, w.swa_period = 2;
    nv_tmodel tw;
    if (nv_tmodel_init(&tw, &w, NULL, 3, 2, 8, NV_ENGINE_SCALAR) != NV_OK) {
        T_CHECK(0, "%s", nv_errmsg());
        return;
    }
    const int wseg[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4};
    T_CHECK(fabs(nv_tmodel_step_flops(&tw, wseg) - tw.flops_dense - tw.flops_key * (56.0 + 39.0)) < 1e-9 * tw.flops_per_step &&
                fabs(tw.flops_per_step - tw.flops_dense - tw.flops_key * (72.0 + 42.0)) < 1e-9 * tw.flops_per_step,
            "windowed step FLOPs: %.6g packed, %.6g not", nv_tmodel_step_flops(&tw, wseg), tw.flops_per_step);
    nv_tmodel_free(&tw);
}

/* Targets of -1 (chat data's prompts and padding): the gradient is the masked loss's, and the loss
 * is the mean over the rows that have a target: the mean of each such row's loss taken alone. */
static void test_fd_ignored_targets(void) {
    nv_config c = {16, 24, 2, 4, 2, 4, 23, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    check_fd_segments(&c, 2, 5, 3, NULL);
    nv_tmodel tm;
    if (nv_tmodel_init(&tm, &c, NULL, 5, 2, 5, NV_ENGINE_SCALAR) != NV_OK) {
        T_CHECK(0, "%s", nv_errmsg());
        return;
    }
    int in[10], tg[10], one[10];
    make_batch(2, 5, c.vocab_size, in, tg, 78);
    for (int i = 0; i < 10; i += 3) tg[i] = -1;
    const float masked = nv_tmodel_forward(&tm, in, tg);
    T_CHECK(tm.n_targets == 6, "%d rows counted, not 6", tm.n_targets);
    double sum = 0;
    for (int r = 0; r < 10; r++) {
        if (tg[r] < 0) continue;
        for (int i = 0; i < 10; i++) one[i] = i == r ? tg[i] : -1;
        sum += nv_tmodel_forward(&tm, in, one);
        T_CHECK(tm.n_targets == 1, "row %d alone: %d rows counted", r, tm.n_targets);
    }
    T_CHECK(fabs(masked - sum / 6) < 1e-5 * fabs(masked), "masked loss %.7g, mean of the rows' %.7g", masked, sum / 6);
    for (int i = 0; i < 10; i++) one[i] = -1;
    T_CHECK(nv_tmodel_forward(&tm, in, one) == 0.0f && tm.n_targets == 0, "no targets: loss %g", tm.loss);
    nv_tmodel_backward(&tm, 1.0f);
    float worst = 0;
    for (uint64_t i = 0; i < tm.m.n_params; i++) worst = fmaxf(worst, fabsf(tm.grads[i]));
    T_CHECK(worst == 0.0f, "no targets, yet a gradient of %g", worst);
    nv_tmodel_free(&tm);
}

/* Distillation: the objective (1 - alpha) CE + alpha temp^2 KL(teacher || model) at temperature temp
 * matches finite differences (rows without a target skipped); its KL is the closed form's, zero
 * against the model's own logits shifted, and alpha 0 is the cross-entropy's gradient. */
static void test_fd_distill(void) {
    nv_config c = {16, 24, 2, 4, 2, 4, 23, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    const int B = 2, T = 5, V = c.vocab_size, BT = B * T;
    float teacher[2 * 5 * 23];
    nv_rng r;
    nv_rng_seed(&r, 31);
    for (int i = 0; i < BT * V; i++) teacher[i] = 3.0f * nv_rng_normal(&r);
    static const float settings[][2] = {{0.5f, 1.0f}, {0.7f, 2.5f}, {1.0f, 0.7f}};
    fd_teacher = teacher;
    for (int k = 0; k < 3; k++) {
        fd_alpha = settings[k][0], fd_temp = settings[k][1];
        check_fd_segments(&c, B, T, 3, NULL);
    }
    fd_teacher = NULL;
    nv_tmodel tm;
    if (nv_tmodel_init(&tm, &c, NULL, 5, B, T, NV_ENGINE_SCALAR) != NV_OK) {
        T_CHECK(0, "%s", nv_errmsg());
        return;
    }
    perturb_init(&tm, 6);
    int in[10], tg[10];
    make_batch(B, T, V, in, tg, 77);
    tg[4] = -1;
    /* the KL term against a closed form in double */
    nv_tmodel_forward(&tm, in, NULL);
    float own[2 * 5 * 23];
    memcpy(own, tm.a.logits, sizeof own);
    const float temp = 1.7f;
    T_CHECK(nv_tmodel_set_teacher(&tm, teacher, 0.4f, temp) == NV_OK, "%s", nv_errmsg());
    nv_tmodel_forward(&tm, in, tg);
    double kl = 0;
    int rows = 0;
    for (int row = 0; row < BT; row++) {
        if (tg[row] < 0) continue;
        double zq = 0, zr = 0, mq = -1e30, mr = -1e30;
        for (int i = 0; i < V; i++) mq = fmax(mq, own[row * V + i] / temp), mr = fmax(mr, teacher[row * V + i] / temp);
        for (int i = 0; i < V; i++) zq += exp(own[row * V + i] / temp - mq), zr += exp(teacher[row * V + i] / temp - mr);
        for (int i = 0; i < V; i++) {
            const double lr = teacher[row * V + i] / temp - mr - log(zr), lq = own[row * V + i] / temp - mq - log(zq);
            kl += exp(lr) * (lr - lq);
        }
        rows++;
    }
    kl /= rows;
    T_CHECK(fabs(tm.distill_kl - kl) < 1e-4 * kl && kl > 0.1, "KL %.7g, the closed form's %.7g", tm.distill_kl, kl);
    T_CHECK(fabs(tm.objective - (0.6 * tm.loss + 0.4 * temp * temp * kl)) < 1e-4 * tm.objective, "objective %g", tm.objective);
    /* against the model's own logits, shifted: no divergence */
    for (int i = 0; i < BT * V; i++) own[i] += 5.0f;
    nv_tmodel_set_teacher(&tm, own, 0.5f, 2.0f);
    nv_tmodel_forward(&tm, in, tg);
    T_CHECK(fabsf(tm.distill_kl) < 1e-5f, "KL against itself %g", tm.distill_kl);
    /* alpha 0: the cross-entropy and its gradient */
    nv_tmodel_set_teacher(&tm, teacher, 0.0f, 2.0f);
    nv_tmodel_zero_grad(&tm);
    const float l0 = nv_tmodel_forward(&tm, in, tg);
    nv_tmodel_backward(&tm, 1.0f);
    float *g0 = malloc(tm.m.n_params * sizeof(float));
    memcpy(g0, tm.grads, tm.m.n_params * sizeof(float));
    nv_tmodel_set_teacher(&tm, NULL, 0, 0);
    nv_tmodel_zero_grad(&tm);
    const float l1 = nv_tmodel_forward(&tm, in, tg);
    nv_tmodel_backward(&tm, 1.0f);
    float worst = 0, big = 0;
    for (uint64_t i = 0; i < tm.m.n_params; i++) worst = fmaxf(worst, fabsf(g0[i] - tm.grads[i])), big = fmaxf(big, fabsf(tm.grads[i]));
    T_CHECK(fabsf(l0 - l1) < 1e-5f * l1 && worst < 1e-4f * big, "alpha 0: loss %.7g vs %.7g, gradients %g apart (largest %g)", l0, l1,
            worst, big);
    free(g0);
    T_CHECK(nv_tmodel_set_teacher(&tm, teacher, 1.5f, 1.0f) == NV_EINVAL && nv_tmodel_set_teacher(&tm, teacher, 0.5f, 0.0f) == NV_EINVAL,
            "bad settings taken");
    nv_tmodel_free(&tm);
    c.logit_softcap = 30.0f;
    if (nv_tmodel_init(&tm, &c, NULL, 5, B, T, NV_ENGINE_SCALAR) == NV_OK) {
        T_CHECK(nv_tmodel_set_teacher(&tm, teacher, 0.5f, 1.0f) == NV_EINVAL, "a soft-capped model taken");
        nv_tmodel_free(&tm);
    }
}

static void test_fd_gqa_tied(void) {
    nv_config c = {16, 24, 2, 4, 2, 4, 23, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    check_fd(&c, 2, 5);
}

static void test_fd_separate_classifier_qknorm(void) {
    /* q_dim (2 x 8 = 16) differs from dim (12), one KV head shared by both query heads */
    nv_config c = {12, 20, 2, 2, 1, 8, 19, 8, 10000.0f, 1e-5f, 0, 1, 0, {0}, 0, NV_CONFIG_PLAIN};
    check_fd(&c, 2, 6);
}

/* qwen2: biases on the query, key and value projections (and, for their gradient through the
 * per-head norm, QK-norm on too, a combination no GGUF has but the layers allow) */
static void test_fd_qkv_bias(void) {
    nv_config c = {16, 24, 2, 4, 2, 4, 23, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 1, NV_CONFIG_PLAIN};
    check_fd(&c, 2, 5);
    nv_config n = {12, 20, 1, 2, 1, 8, 19, 8, 10000.0f, 1e-5f, 0, 1, 0, {0}, 1, NV_CONFIG_PLAIN};
    check_fd(&n, 2, 4);
}

/* A mixture of experts: 4 experts, 2 a token (and all 3 of 3, where no choice can flip), with the
 * load-balancing and z terms weighted so their gradients show, tied and separate classifiers, QK-norm. */
static void test_fd_moe(void) {
    fd_aux_coef = 0.5f, fd_z_coef = 0.25f;
    nv_config c = {16, 24, 2, 4, 2, 4, 23, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    c.n_experts = 4, c.n_experts_used = 2;
    check_fd(&c, 2, 5);
    nv_config q = {12, 20, 2, 2, 1, 8, 19, 8, 10000.0f, 1e-5f, 0, 1, 0, {0}, 0, NV_CONFIG_PLAIN};
    q.n_experts = 3, q.n_experts_used = 3;
    check_fd(&q, 2, 4);
    q.n_experts_used = 1; /* one expert a token: its weight is 1, the router learns from the balance term alone */
    check_fd(&q, 2, 6);
    fd_aux_coef = fd_z_coef = 0.0f;
    check_fd(&c, 1, 7);
}

/* SmolLM3's layers without RoPE (here the second of each two): their queries and keys unrotated */
static void test_fd_nope(void) {
    nv_config c = {16, 24, 2, 4, 2, 4, 23, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    c.nope_period = 2;
    check_fd(&c, 2, 5);
}

/* Partial rotation (Phi-4-mini's): RoPE on the first 4 of each head's 8 values, with QK-norm (its
 * weights over the whole head) and RoPE's attention factor; the rest pass through; LongRoPE's short
 * set below position 3, its long set past it */
static void test_fd_partial_rotary(void) {
    nv_config c = {16, 24, 2, 2, 1, 8, 23, 8, 10000.0f, 1e-5f, 1, 1, 0, {0}, 0, NV_CONFIG_PLAIN};
    c.rope_dim = 4, c.rope_attn = 1.2f;
    check_fd(&c, 2, 5);
    c.n_rope_factors = 2, c.longrope_orig = 3;
    c.rope_factors[0] = 1.5f, c.rope_factors[1] = 6.0f, c.rope_factors_short[0] = 1.1f, c.rope_factors_short[1] = 1.3f;
    check_fd(&c, 2, 6);
}

/* OLMo 2's block: no norms before the attention and the FFN, post-norms on both, QK-norm over the
 * whole query and key projections (GQA, a separate classifier); then OLMo 3's: a window of 3 on three
 * layers of four, their RoPE unscaled at their own base while the others' is linearly scaled. */
static void test_fd_olmo2(void) {
    nv_config c = {16, 24, 2, 4, 2, 4, 23, 8, 10000.0f, 1e-5f, 0, NV_QK_NORM_WHOLE, 0, {0}, 0, NV_CONFIG_PLAIN};
    c.post_norms = 1, c.no_pre_norms = 1;
    fd_weight_scale = 4.0f, fd_h = 1e-3f;
    check_fd(&c, 2, 6);
    c.n_layers = 4, c.swa_window = 3, c.swa_period = 4, c.rope_theta_swa = 500.0f;
    T_CHECK(nv_config_rope_linear(&c, 2.0f) == NV_OK, "%s", nv_errmsg());
    check_fd(&c, 2, 6);
    fd_weight_scale = 12.0f, fd_h = 1e-2f;
}

/* Ministral 3's block: llama's, YaRN, and the queries' attention temperature growing every 2 positions
 * of windows of 6 (so three factors, 1 among them) */
static void test_fd_mistral3(void) {
    nv_config c = {16, 24, 2, 4, 2, 4, 23, 8, 10000.0f, 1e-5f, 0, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    nv_rope_yarn y = {.factor = 4.0f, .orig_ctx = 2, .beta_fast = 32.0f, .beta_slow = 1.0f, .attn_factor = 1.0f};
    T_CHECK(nv_config_rope_yarn(&c, &y) == NV_OK, "%s", nv_errmsg());
    c.attn_temp_scale = 0.5f, c.attn_temp_len = 2;
    check_fd(&c, 2, 6);
}

/* c with Gemma's block: every part of Gemma 2 and 3's, the window (7) shorter than the tests' windows */
static nv_config with_gemma_block(nv_config c) {
    c.swa_window = 7, c.swa_period = 2, c.rope_theta_swa = 10000.0f, c.ffn_gelu = 1, c.post_norms = 1;
    c.emb_scale = sqrtf((float)c.dim), c.attn_div = 5.0f, c.logit_softcap = 10.0f, c.attn_softcap = 20.0f;
    return c;
}

/* Gemma's block: GELU gating, the embedding scaled, post-norms on both products, the scores divided by
 * their own divisor and soft-capped, the logits soft-capped, a sliding window of 3 on every other layer
 * (Gemma 2's pattern) over windows of 6; then Gemma 3's: QK-norm, no caps, the windowed layers with
 * their own RoPE base, every third layer global. Caps small enough that tanh bends. */
static void test_fd_gemma(void) {
    nv_config c = {16, 24, 2, 4, 2, 4, 23, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    c.swa_window = 3, c.swa_period = 2, c.ffn_gelu = 1, c.post_norms = 1, c.emb_scale = 4.0f, c.attn_div = 3.0f;
    c.attn_softcap = 2.0f, c.logit_softcap = 3.0f;
    check_fd(&c, 2, 6);
    nv_config g3 = {12, 20, 3, 2, 1, 8, 19, 8, 1000000.0f, 1e-6f, 1, 1, 0, {0}, 0, NV_CONFIG_PLAIN};
    g3.swa_window = 2, g3.swa_period = 3, g3.rope_theta_swa = 10000.0f, g3.ffn_gelu = 1, g3.post_norms = 1, g3.emb_scale = 3.4641016f;
    check_fd(&g3, 2, 5);
}

/* Granite's multipliers: embeddings x 6, scores x 0.3 (not / sqrt(head size)), each branch x 0.4 into
 * the residual, logits / 0.5 (a divisor under 1, so the logits' gradient grows); tied and separate
 * classifiers, and a mixture of experts (its weighted sum scaled too). */
static void test_fd_granite(void) {
    nv_config c = {16, 24, 2, 4, 2, 4, 23, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    nv_config_set_granite(&c, 6.0, 0.3, 0.4, 0.5);
    check_fd(&c, 2, 5);
    nv_config s = {12, 20, 2, 2, 1, 8, 19, 8, 10000.0f, 1e-5f, 0, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    nv_config_set_granite(&s, 1.0, 0.0, 1.7, 3.0); /* no embedding or score factor: the residual and logits alone */
    check_fd(&s, 2, 6);
    c.n_experts = 4, c.n_experts_used = 2;
    check_fd(&c, 2, 5);
}

static void test_fd_mha_separate(void) {
    nv_config c = {16, 32, 1, 2, 2, 8, 17, 8, 500.0f, 1e-5f, 0, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    check_fd(&c, 1, 7);
}

/* AdamW against an independent float loop over the same tensors (decay marked by name), five
 * updates with clipping active, bit for bit; the first update against its closed form
 * (m = (1-b1) g, v = (1-b2) g^2, so the step is lr * (g / (|g| + eps) + decay * p)); and the
 * schedule's warmup and cosine values. */
static void test_adamw_matches_reference(void) {
    nv_config c = {16, 24, 2, 4, 2, 4, 23, 8, 10000.0f, 1e-5f, 0, 0, 0, {0}, 0, NV_CONFIG_PLAIN}; /* separate classifier */
    for (int emb = 0; emb < 2; emb++) {
        nv_tmodel tm;
        if (nv_tmodel_init(&tm, &c, NULL, 3, 1, 4, NV_ENGINE_SCALAR) != NV_OK) {
            T_CHECK(0, "%s", nv_errmsg());
            return;
        }
        const size_t n = tm.m.n_params;
        nv_adamw_opts o;
        nv_adamw_defaults(&o);
        o.lr = 0.01f, o.warmup_steps = 2, o.total_steps = 6, o.grad_clip = 0.5f, o.decay_embeddings = emb;
        nv_adamw a;
        T_CHECK(nv_adamw_init(&a, &o, &c, n) == NV_OK, "init");
        float *p = malloc(n * sizeof(float)), *p0 = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
        float *m = calloc(n, sizeof(float)), *v = calloc(n, sizeof(float));
        uint8_t *decays = calloc(n, 1);
        tensor ts[20];
        int nt = tensors_of(&tm, ts);
        for (int i = 0; i < nt; i++) {
            int mat = ts[i].name[0] == 'w' || (emb && !strcmp(ts[i].name, "tok_emb"));
            memset(decays + ts[i].off, mat, ts[i].n);
        }
        memcpy(p, tm.m.params, n * sizeof(float));
        memcpy(p0, p, n * sizeof(float));
        nv_rng r;
        nv_rng_seed(&r, 77 + emb);
        int bad = 0;
        for (int step = 0; step < 5 && !bad; step++) {
            for (size_t i = 0; i < n; i++) g[i] = 0.05f * nv_rng_normal(&r);
            float lr = 0.0f;
            double norm = nv_adamw_step(&a, tm.m.params, g, &lr);
            double sq = 0.0;
            for (size_t i = 0; i < n; i++) sq += (double)g[i] * g[i];
            T_CHECK(fabs(norm - sqrt(sq)) <= 1e-12 * sqrt(sq) && norm > o.grad_clip, "norm %.17g vs %.17g", norm, sqrt(sq));
            float want_lr = step < 2 ? 0.01f * (float)(step + 1) / 2.0f
                                     : (float)(0.001 + 0.5 * 0.009 * (1.0 + cos(M_PI * (double)(step - 2) / 4.0)));
            T_CHECK(fabs(lr - want_lr) <= 1e-7f, "step %d: lr %.9g, want %.9g", step, lr, want_lr);
            float clip = (float)(o.grad_clip / norm), bc1 = 1.0f - powf(o.beta1, (float)(step + 1)),
                  bc2 = 1.0f - powf(o.beta2, (float)(step + 1));
            for (size_t i = 0; i < n; i++) {
                float gi = g[i] * clip;
                m[i] = o.beta1 * m[i] + (1.0f - o.beta1) * gi;
                v[i] = o.beta2 * v[i] + (1.0f - o.beta2) * gi * gi;
                float u = (m[i] * (1.0f / bc1)) / (sqrtf(v[i] * (1.0f / bc2)) + o.eps);
                if (decays[i]) u += o.weight_decay * p[i];
                p[i] -= lr * u;
                if (step == 0) {
                    double closed = p0[i] - (double)lr * ((double)gi / (fabs((double)gi) + o.eps) + (decays[i] ? o.weight_decay * (double)p0[i] : 0.0));
                    if (!(fabs(closed - p[i]) <= 1e-6 * (fabs(closed) + lr))) {
                        T_CHECK(0, "param %zu after one update: %.9g, closed form %.9g", i, p[i], closed);
                        bad = 1;
                        break;
                    }
                }
            }
            if (!bad && (memcmp(p, tm.m.params, n * sizeof(float)) || memcmp(m, a.m, n * sizeof(float)) ||
                         memcmp(v, a.v, n * sizeof(float)))) {
                T_CHECK(0, "decay_embeddings %d, update %d: params or moments differ from the reference loop", emb, step + 1);
                bad = 1;
            }
        }
        free(p), free(p0), free(g), free(m), free(v), free(decays);
        nv_adamw_free(&a);
        nv_tmodel_free(&tm);
    }
}

/* The schedules after a 10-step warmup over 100 steps to a floor of 0.1 x lr: cosine at its middle
 * halfway between lr and the floor, linear on its line, constant flat, wsd flat until the last 20
 * steps and then on a line to the floor; every one rises through the warmup alike. */
static void test_lr_schedules(void) {
    nv_adamw_opts o;
    nv_adamw_defaults(&o);
    o.lr = 1.0f, o.min_lr_frac = 0.1f, o.warmup_steps = 10, o.total_steps = 100;
    const struct {
        const char *name;
        long step;
        double want;
    } cases[] = {{"cosine", 55, 0.55}, {"cosine", 100, 0.1},  {"cosine", 10, 1.0},  {"linear", 55, 0.55},
                 {"linear", 32, 0.78}, {"linear", 100, 0.1},  {"constant", 99, 1.0}, {"wsd", 79, 1.0},
                 {"wsd", 80, 1.0},     {"wsd", 90, 0.55},     {"wsd", 99, 0.145},   {"wsd", 100, 0.1}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        T_CHECK(nv_lr_schedule_parse(cases[i].name, &o.schedule) == NV_OK, "%s", nv_errmsg());
        const double lr = nv_lr_at(&o, cases[i].step);
        T_CHECK(fabs(lr - cases[i].want) < 1e-6, "%s at step %ld: %.7f, want %.7f", cases[i].name, cases[i].step, lr, cases[i].want);
        T_CHECK(fabs(nv_lr_at(&o, 4) - 0.5) < 1e-7, "%s: warmup step 4 gives %.7f", cases[i].name, (double)nv_lr_at(&o, 4));
    }
    nv_lr_schedule s;
    T_CHECK(nv_lr_schedule_parse("step", &s) == NV_EINVAL && strstr(nv_errmsg(), "wsd"), "an unknown schedule: %s", nv_errmsg());
}

/* A forward without targets (evaluation) has no loss to differentiate: the backward leaves the
 * gradients as they are instead of reading targets that are not there. */
static void test_backward_needs_targets(void) {
    nv_config c = {16, 24, 2, 4, 2, 4, 23, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    nv_tmodel tm;
    if (nv_tmodel_init(&tm, &c, NULL, 4, 1, 6, NV_ENGINE_SCALAR) != NV_OK) {
        T_CHECK(0, "%s", nv_errmsg());
        return;
    }
    int in[6], tg[6];
    make_batch(1, 6, c.vocab_size, in, tg, 11);
    nv_tmodel_zero_grad(&tm);
    T_CHECK(nv_tmodel_forward(&tm, in, NULL) == 0.0f, "loss without targets");
    nv_tmodel_backward(&tm, 1.0f);
    int zero = 1;
    for (uint64_t i = 0; i < tm.m.n_params; i++) zero &= tm.grads[i] == 0.0f;
    T_CHECK(zero, "gradients changed by a backward without targets");
    /* after an update the gradients are spent: a backward without targets leaves zero ones, not the
       last step's for the next update to apply again */
    nv_adamw opt;
    nv_adamw_opts o;
    nv_adamw_defaults(&o);
    T_CHECK(nv_adamw_init(&opt, &o, &c, tm.m.n_params) == NV_OK, "adamw");
    nv_tmodel_forward(&tm, in, tg);
    nv_tmodel_backward(&tm, 1.0f);
    nv_tmodel_optimize(&tm, &opt, NULL);
    nv_tmodel_forward(&tm, in, NULL);
    nv_tmodel_backward(&tm, 1.0f);
    zero = 1;
    for (uint64_t i = 0; i < tm.m.n_params; i++) zero &= tm.grads[i] == 0.0f;
    T_CHECK(zero && nv_tmodel_optimize(&tm, &opt, NULL) == 0.0, "a backward without targets after an update left old gradients");
    nv_adamw_free(&opt);
    nv_tmodel_free(&tm);
}

/* Gradients on each fast engine vs the fp32 scalar path on the same batch, on the engines that are
 * on here and then on the emulated ones (so the AMX and AVX-512 paths are checked on any machine). */
static void engines_match_fp32_of(nv_config c, const char *label);

static void engines_match_fp32(const char *label) {
    const nv_config c = {64, 96, 2, 4, 2, 16, 97, 32, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    engines_match_fp32_of(c, label);
    nv_config moe = c;
    moe.n_experts = 4, moe.n_experts_used = 2;
    engines_match_fp32_of(moe, label);
    moe.n_experts_used = 4;
    engines_match_fp32_of(moe, label);
    engines_match_fp32_of(with_gemma_block(c), label);
}

static void engines_match_fp32_of(nv_config c, const char *label) {
    int B = 2, T = 16, in[32], tg[32];
    make_batch(B, T, c.vocab_size, in, tg, 5);
    nv_tmodel ref;
    if (nv_tmodel_init(&ref, &c, NULL, 9, B, T, NV_ENGINE_SCALAR) != NV_OK) {
        T_CHECK(0, "%s", nv_errmsg());
        return;
    }
    perturb_init(&ref, 3);
    const size_t n_sel = (size_t)c.n_layers * B * T * c.n_experts_used;
    ref.router_aux_coef = 0.1f;
    nv_tmodel_zero_grad(&ref);
    float lref = nv_tmodel_forward(&ref, in, tg);
    nv_tmodel_backward(&ref, 1.0f);
    int tested = 0;
    for (int e = 1; e < NV_ENGINE_COUNT; e++) {
        if (!nv_engine_available((nv_engine_id)e)) continue;
        /* a mixture choosing among its experts: a low-precision engine's rounding moves a few rows'
           choices (a row routed elsewhere has other gradients altogether), so those engines are
           compared where every expert is used */
        if (c.n_experts_used < c.n_experts && nv_engine_low_precision((nv_engine_id)e)) continue;
        nv_tmodel tm;
        if (nv_tmodel_init(&tm, &c, ref.m.params, 0, B, T, (nv_engine_id)e) != NV_OK) {
            T_CHECK(0, "%s", nv_errmsg());
            continue;
        }
        tested++;
        tm.router_aux_coef = ref.router_aux_coef;
        nv_tmodel_zero_grad(&tm);
        float l = nv_tmodel_forward(&tm, in, tg);
        nv_tmodel_backward(&tm, 1.0f);
        size_t rerouted = 0; /* rows whose set of experts differs from fp32's (the order may) */
        for (size_t r = 0; r < n_sel / (c.n_experts_used ? c.n_experts_used : 1) && c.n_experts; r++) {
            const int K = c.n_experts_used, *a = tm.a.moe_sel + r * K, *b = ref.a.moe_sel + r * K;
            int same = 1;
            for (int i = 0; i < K; i++) {
                int found = 0;
                for (int j = 0; j < K; j++) found |= a[i] == b[j];
                same &= found;
            }
            rerouted += !same;
        }
        T_CHECK(!rerouted, "%s%s: %zu rows' experts differ from fp32's", nv_engine_name((nv_engine_id)e), label, rerouted);
        /* fp32 engines: summation order only; bf16: relative error of a few 2^-8; int8: the forward's
           weights and activations rounded to 1/254 of their channel's or token's largest value
           (the backward differentiates that forward), ~0.1 at this width (dim 64) */
        int low_precision = nv_engine_low_precision((nv_engine_id)e);
        const double grad_tol = !low_precision ? 1e-4 : nv_engine_int8((nv_engine_id)e) ? 0.15 : 0.05;
        double num = 0, den = 0;
        for (uint64_t i = 0; i < ref.m.n_params; i++) {
            double dlt = (double)tm.grads[i] - ref.grads[i];
            num += dlt * dlt;
            den += (double)ref.grads[i] * ref.grads[i];
        }
        double rel = sqrt(num / (den + 1e-30));
        T_CHECK(rel < grad_tol, "%s%s: gradient relative L2 error %.3g", nv_engine_name((nv_engine_id)e), label, rel);
        T_CHECK(fabsf(l - lref) < (low_precision ? 0.02f : 1e-4f) * lref, "%s%s: loss %f vs fp32 %f",
                nv_engine_name((nv_engine_id)e), label, l, lref);
        printf("    %s%s: gradient relative L2 error %.3g\n", nv_engine_name((nv_engine_id)e), label, rel);
        nv_tmodel_free(&tm);
    }
    nv_tmodel_free(&ref);
    if (!tested) t_skip("no engine besides scalar on this machine");
}

static void test_engines_match_fp32(void) {
    engines_match_fp32("");
    nv_engines_set_emulation(1);
    nv_engines_reset();
    nv_engines_init(NULL, 0);
    nv_engines_set_emulation(0);
    engines_match_fp32(" (emulated)");
    nv_engines_reset();
    nv_engines_init(NULL, 0);
}

/* Two micro-batches of one window accumulated with scale 1/2 give the gradient of one batch of
 * both windows (the loss is a mean over windows). */
static void test_accumulation_equals_larger_batch(void) {
    nv_config c = {16, 24, 2, 4, 2, 4, 23, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    int T = 6, in[12], tg[12];
    make_batch(2, T, c.vocab_size, in, tg, 31);
    nv_tmodel big, small;
    if (nv_tmodel_init(&big, &c, NULL, 3, 2, T, NV_ENGINE_SCALAR) != NV_OK ||
        nv_tmodel_init(&small, &c, big.m.params, 0, 1, T, NV_ENGINE_SCALAR) != NV_OK) {
        T_CHECK(0, "%s", nv_errmsg());
        return;
    }
    perturb_init(&big, 4);
    memcpy(small.m.params, big.m.params, big.m.n_params * sizeof(float));
    nv_tmodel_refresh(&small);
    nv_tmodel_zero_grad(&big);
    float lb = nv_tmodel_forward(&big, in, tg);
    nv_tmodel_backward(&big, 1.0f);
    nv_tmodel_zero_grad(&small);
    float l0 = nv_tmodel_forward(&small, in, tg);
    nv_tmodel_backward(&small, 0.5f);
    float l1 = nv_tmodel_forward(&small, in + T, tg + T);
    nv_tmodel_backward(&small, 0.5f);
    T_CHECK(fabsf((l0 + l1) / 2 - lb) < 1e-5f * lb, "losses: (%f + %f) / 2 vs %f", l0, l1, lb);
    double num = 0, den = 0;
    for (uint64_t i = 0; i < big.m.n_params; i++) {
        double d = (double)big.grads[i] - small.grads[i];
        num += d * d;
        den += (double)big.grads[i] * big.grads[i];
    }
    T_CHECK(sqrt(num / (den + 1e-30)) < 1e-5, "accumulated gradient differs: relative L2 %.3g", sqrt(num / (den + 1e-30)));
    nv_tmodel_free(&big);
    nv_tmodel_free(&small);
}

/* The attention kernels against a plain double-precision reference, forward and backward, for
 * head sizes on each of their paths (not a multiple of 8; one to four vectors; several blocks of
 * 32), GQA, and lengths that are not multiples of 8 or of the backward's row blocks. */
static double rel_err(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
    return sqrt(num / (den + 1e-30));
}

static nv_engine_id attn_engine; /* the engine attention_case runs on */
static double attn_tol = 1e-5;    /* its bound on each relative L2 error */
static double attn_worst;         /* the largest error seen */
static int attn_window;            /* a sliding window over the case's layer, or 0 */
static float attn_cap, attn_div;  /* a soft cap on the scores, or 0; their divisor, or 0: sqrt(hd) */
static int attn_doc;               /* packed documents of this many rows each (the last one shorter), or 0: one */

static void attention_case(int H, int KVH, int hd, int B, int T) {
    nv_config c = {H * hd, 4, 1, H, KVH, hd, 8, T, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    c.swa_window = attn_window, c.attn_softcap = attn_cap, c.attn_div = attn_div;
    const double div = attn_div != 0.0f ? attn_div : sqrt((double)hd);
    size_t qn = (size_t)B * T * H * hd, kn = (size_t)B * T * KVH * hd, an = (size_t)B * H * T * 2;
    float *q = malloc(qn * 4), *k = malloc(kn * 4), *v = malloc(kn * 4), *dout = malloc(qn * 4), *out = malloc(qn * 4);
    float *att = calloc(an, 4), *dq = calloc(qn, 4), *dk = calloc(kn, 4), *dv = calloc(kn, 4);
    float *ws = malloc(nv_attention_workspace(&c, B, T) * 4);
    int *seg = attn_doc ? malloc((size_t)B * T * sizeof *seg) : NULL;
    for (int i = 0; seg && i < B * T; i++) seg[i] = i % T / attn_doc * attn_doc;
    double *rout = calloc(qn, 8), *rdq = calloc(qn, 8), *rdk = calloc(kn, 8), *rdv = calloc(kn, 8), *p = malloc(T * 8),
           *dp = malloc(T * 8);
    nv_rng r;
    nv_rng_seed(&r, 7 + hd + T);
    for (size_t i = 0; i < qn; i++) q[i] = nv_rng_normal(&r), dout[i] = nv_rng_normal(&r);
    for (size_t i = 0; i < kn; i++) k[i] = nv_rng_normal(&r), v[i] = nv_rng_normal(&r);
    nv_attention_forward(&c, attn_engine, B, T, 0, q, k, v, seg, att, out, ws);
    nv_attention_backward(&c, attn_engine, B, T, 0, q, k, v, seg, att, dout, dq, dk, dv, ws);
    const int qd = H * hd, kvd = KVH * hd;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                const float *qt = q + ((size_t)b * T + t) * qd + h * hd, *dt = dout + ((size_t)b * T + t) * qd + h * hd;
                const int ko = h / (H / KVH) * hd;
                double mx = -1e300, sum = 0, pdp = 0;
                int u0 = attn_window && t - attn_window + 1 > 0 ? t - attn_window + 1 : 0;
                if (attn_doc && t / attn_doc * attn_doc > u0) u0 = t / attn_doc * attn_doc;
                for (int u = u0; u <= t; u++) {
                    double sc = 0;
                    for (int i = 0; i < hd; i++) sc += (double)qt[i] * k[((size_t)b * T + u) * kvd + ko + i];
                    p[u] = sc / div;
                    if (attn_cap != 0.0f) p[u] = attn_cap * tanh(p[u] / attn_cap);
                    mx = p[u] > mx ? p[u] : mx;
                }
                for (int u = u0; u <= t; u++) sum += p[u] = exp(p[u] - mx);
                for (int u = u0; u <= t; u++) {
                    p[u] /= sum;
                    const float *vu = v + ((size_t)b * T + u) * kvd + ko;
                    dp[u] = 0;
                    for (int i = 0; i < hd; i++) {
                        rout[((size_t)b * T + t) * qd + h * hd + i] += p[u] * vu[i];
                        dp[u] += (double)dt[i] * vu[i];
                    }
                    pdp += p[u] * dp[u];
                }
                for (int u = u0; u <= t; u++) {
                    /* the capped score's slope: 1 - tanh^2, tanh recovered from the score itself */
                    double slope = 1;
                    if (attn_cap != 0.0f) {
                        double sc = 0;
                        for (int i = 0; i < hd; i++) sc += (double)qt[i] * k[((size_t)b * T + u) * kvd + ko + i];
                        const double th = tanh(sc / div / attn_cap);
                        slope = 1 - th * th;
                    }
                    double ds = p[u] * (dp[u] - pdp) / div * slope;
                    size_t row = ((size_t)b * T + u) * kvd + ko;
                    for (int i = 0; i < hd; i++) {
                        rdq[((size_t)b * T + t) * qd + h * hd + i] += ds * k[row + i];
                        rdk[row + i] += ds * qt[i];
                        rdv[row + i] += p[u] * dt[i];
                    }
                }
            }
    double e[4] = {rel_err(out, rout, qn), rel_err(dq, rdq, qn), rel_err(dk, rdk, kn), rel_err(dv, rdv, kn)};
    for (int i = 0; i < 4; i++) attn_worst = e[i] > attn_worst ? e[i] : attn_worst;
    T_CHECK(e[0] < attn_tol && e[1] < attn_tol && e[2] < attn_tol && e[3] < attn_tol,
            "%s H %d KVH %d hd %d B %d T %d window %d documents of %d: relative error out %.2g dq %.2g dk %.2g dv %.2g",
            nv_engine_name(attn_engine), H, KVH, hd, B, T, attn_window, attn_doc, e[0], e[1], e[2], e[3]);
    free(seg), free(q), free(k), free(v), free(dout), free(out), free(att), free(dq), free(dk), free(dv), free(ws);
    free(rout), free(rdq), free(rdk), free(rdv), free(p), free(dp);
}

static void attention_cases(void) {
    attention_case(4, 2, 12, 2, 37); /* head size not a multiple of 8 */
    attention_case(2, 2, 8, 1, 17);
    attention_case(4, 1, 32, 2, 70); /* the demo's head size; GQA 4:1 */
    attention_case(2, 1, 48, 1, 33);  /* 32 + 16 */
    attention_case(2, 2, 64, 1, 129);
    attention_case(2, 1, 128, 1, 40); /* Qwen3's */
    /* a sliding window shorter than a block and longer; a soft cap that bends (scores of a few units
       against a cap of 1.5) with its own divisor, alone and with a window */
    attn_window = 5, attention_case(4, 2, 12, 2, 37);
    attn_window = 70, attention_case(2, 1, 64, 1, 150);
    attn_window = 0, attn_cap = 1.5f, attn_div = 2.0f, attention_case(4, 2, 16, 2, 37);
    attn_window = 20, attention_case(2, 1, 32, 1, 90);
    /* the products skip the keys before a block's first row's window or document (a multiple of the
       packs' alignment): documents of 70 rows over blocks of 64, alone and with a window */
    attn_window = 0, attn_cap = 0.0f, attn_div = 0.0f, attn_doc = 70, attention_case(2, 1, 16, 2, 200);
    attn_window = 37, attention_case(4, 2, 12, 1, 150);
    attn_window = 0, attn_doc = 0;
}

static void test_attention_kernels(void) {
    attn_engine = nv_engine_best_fp32(), attn_tol = 1e-5;
    attention_cases();
}

/* On amx-bf16 (emulated here): q, k, v, the probabilities, dout and dS rounded to bf16 (relative
 * 2^-9 each) before fp32 sums: relative L2 errors of a few 2^-9 (about 4e-3 at most here), checked
 * against 1e-2. */
static void test_attention_kernels_amx_bf16(void) {
    nv_engines_set_emulation(1);
    nv_engines_reset();
    nv_engines_init(NULL, 0);
    nv_engines_set_emulation(0);
    T_CHECK(nv_engine_available(NV_ENGINE_AMX_BF16), "the emulated amx-bf16 engine is on");
    attn_engine = NV_ENGINE_AMX_BF16, attn_tol = 1e-2, attn_worst = 0;
    attention_cases();
    fprintf(stderr, "    largest relative L2 error on amx-bf16: %.3g\n", attn_worst);
    /* fp32 products would be within ~1e-6: larger errors show the tiles' bf16 operands were used */
    T_CHECK(attn_worst > 1e-4, "largest error %.3g: the products did not run in bf16", attn_worst);
    /* heads narrower than 32, which a tile would pad to 32 deep, run on the fp32 engine: its bound */
    attn_tol = 1e-5;
    attention_case(2, 2, 8, 1, 17);
    attention_case(4, 2, 12, 2, 37);
    nv_engines_reset();
    nv_engines_init(NULL, 0);
}

/* The loss and every gradient of one forward and backward are the same bits on one thread and on
 * two, on each engine that is on (and on the emulated ones): the norms' weight gradients are summed
 * per fixed chunk of rows, the element-wise passes and products do not depend on the split. Rows
 * (B x T = 70) leave partial chunks of the norms and partial tiles; QK-norm and biases on. */
static void threads_same_bits_of(nv_config c, const char *label);

static void threads_same_bits(const char *label) {
    const nv_config c = {40, 72, 2, 4, 2, 16, 61, 64, 10000.0f, 1e-5f, 0, 1, 0, {0}, 1, NV_CONFIG_PLAIN};
    threads_same_bits_of(c, label);
    nv_config moe = {40, 72, 2, 4, 2, 10, 61, 64, 10000.0f, 1e-5f, 0, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    moe.n_experts = 6, moe.n_experts_used = 2;
    threads_same_bits_of(moe, label);
    threads_same_bits_of(with_gemma_block(c), label);
}

static float same_bits_dropout; /* threads_same_bits_of's and recompute_case's dropout */

static void threads_same_bits_of(nv_config c, const char *label) {
    enum { B = 2, T = 35 };
    int in[B * T], tg[B * T];
    make_batch(B, T, c.vocab_size, in, tg, 11);
    const int before = nv_pool_threads();
    for (int e = 0; e < NV_ENGINE_COUNT; e++) {
        if (!nv_engine_available((nv_engine_id)e)) continue;
        float loss[2] = {0};
        float *grads[2] = {NULL, NULL};
        uint64_t n_params = 0;
        for (int t = 0; t < 2; t++) {
            nv_pool_init(t + 1);
            nv_tmodel tm;
            if (nv_tmodel_init(&tm, &c, NULL, 21, B, T, (nv_engine_id)e) != NV_OK) {
                T_CHECK(0, "%s", nv_errmsg());
                break;
            }
            perturb_init(&tm, 8);
            tm.router_aux_coef = 0.1f, tm.router_z_coef = 0.01f;
            nv_tmodel_set_dropout(&tm, same_bits_dropout, same_bits_dropout, 5, 70);
            nv_tmodel_zero_grad(&tm);
            loss[t] = nv_tmodel_forward(&tm, in, tg);
            nv_tmodel_backward(&tm, 1.0f);
            n_params = tm.m.n_params;
            grads[t] = malloc(n_params * sizeof(float));
            if (grads[t]) memcpy(grads[t], tm.grads, n_params * sizeof(float));
            nv_tmodel_free(&tm);
        }
        if (grads[0] && grads[1]) {
            T_CHECK(!memcmp(&loss[0], &loss[1], sizeof loss[0]), "%s%s: loss %.9g on 1 thread, %.9g on 2",
                    nv_engine_name((nv_engine_id)e), label, loss[0], loss[1]);
            uint64_t first = n_params;
            for (uint64_t i = 0; i < n_params && first == n_params; i++)
                if (memcmp(&grads[0][i], &grads[1][i], sizeof(float))) first = i;
            T_CHECK(first == n_params, "%s%s: gradient %llu is %.9g on 1 thread, %.9g on 2", nv_engine_name((nv_engine_id)e),
                    label, (unsigned long long)first, first < n_params ? grads[0][first] : 0.0f,
                    first < n_params ? grads[1][first] : 0.0f);
        }
        free(grads[0]);
        free(grads[1]);
    }
    nv_pool_init(before);
}

static void test_threads_same_bits(void) {
    threads_same_bits("");
    nv_engines_set_emulation(1);
    nv_engines_reset();
    nv_engines_init(NULL, 0);
    nv_engines_set_emulation(0);
    threads_same_bits(" (emulated)");
    nv_engines_reset();
    nv_engines_init(NULL, 0);
}

/* Activation checkpointing (--recompute): the loss and every gradient are the bits of the run that
 * keeps every layer's activations, on every engine, for a QK-norm model with biases, a model with
 * LoRA adapters, and packed windows; two backwards in a row (accumulation) too. */
static void recompute_case(const char *label, const nv_config *c, int lora_rank, const int *seg) {
    enum { B = 2, T = 35 };
    int in[B * T], tg[B * T];
    make_batch(B, T, c->vocab_size, in, tg, 13);
    nv_model base = {0};
    nv_lora_shape ls = {lora_rank, 2.0f * lora_rank, NV_LORA_ALL};
    if (lora_rank) {
        if (nv_model_alloc(&base, c) != NV_OK) {
            T_CHECK(0, "%s", nv_errmsg());
            return;
        }
        nv_model_init_random(&base, 4);
    }
    for (int e = 0; e < NV_ENGINE_COUNT; e++) {
        if (!nv_engine_available((nv_engine_id)e)) continue;
        float loss[2][2] = {{0}};
        float *grads[2] = {NULL, NULL};
        uint64_t n = 0;
        for (int r = 0; r < 2; r++) {
            nv_tmodel tm;
            if (nv_tmodel_init_ex(&tm, c, lora_rank ? base.params : NULL, 21, B, T, (nv_engine_id)e, lora_rank ? &ls : NULL,
                                  NULL, r) != NV_OK) {
                T_CHECK(0, "%s", nv_errmsg());
                break;
            }
            if (!lora_rank) perturb_init(&tm, 8);
            tm.router_aux_coef = 0.1f, tm.router_z_coef = 0.01f;
            nv_tmodel_set_segments(&tm, seg);
            nv_tmodel_set_dropout(&tm, same_bits_dropout, same_bits_dropout, 6, 0);
            nv_tmodel_zero_grad(&tm);
            for (int k = 0; k < 2; k++) { /* accumulated: the second backward adds to the first */
                loss[r][k] = nv_tmodel_forward(&tm, in, tg);
                nv_tmodel_backward(&tm, 0.5f);
            }
            n = tm.n_train;
            grads[r] = malloc(n * sizeof(float));
            if (grads[r]) memcpy(grads[r], tm.train_grads, n * sizeof(float));
            nv_tmodel_free(&tm);
        }
        if (grads[0] && grads[1]) {
            T_CHECK(!memcmp(loss[0], loss[1], sizeof loss[0]), "%s%s: loss %.9g kept, %.9g recomputed",
                    nv_engine_name((nv_engine_id)e), label, loss[0][1], loss[1][1]);
            uint64_t first = n;
            for (uint64_t i = 0; i < n && first == n; i++)
                if (memcmp(&grads[0][i], &grads[1][i], sizeof(float))) first = i;
            T_CHECK(first == n, "%s%s: gradient %llu is %.9g kept, %.9g recomputed", nv_engine_name((nv_engine_id)e), label,
                    (unsigned long long)first, first < n ? grads[0][first] : 0.0f, first < n ? grads[1][first] : 0.0f);
        }
        free(grads[0]);
        free(grads[1]);
    }
    nv_model_free(&base);
}

static void test_recompute_same_bits(void) {
    nv_config qk = {40, 72, 3, 4, 2, 16, 61, 64, 10000.0f, 1e-5f, 0, 1, 0, {0}, 1, NV_CONFIG_PLAIN};
    nv_config plain = {32, 64, 3, 4, 2, 8, 61, 64, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    int seg[70];
    for (int i = 0; i < 70; i++) seg[i] = i % 35 < 20 ? 0 : 20; /* two documents a window */
    recompute_case(" (QK-norm, biases)", &qk, 0, NULL);
    recompute_case(" (LoRA)", &plain, 4, NULL);
    recompute_case(" (packed)", &plain, 0, seg);
    nv_config moe = plain;
    moe.n_experts = 5, moe.n_experts_used = 2;
    recompute_case(" (mixture of experts)", &moe, 0, NULL);
    const nv_config gemma = with_gemma_block(plain);
    recompute_case(" (Gemma's block)", &gemma, 0, NULL);
    recompute_case(" (Gemma's block, LoRA)", &gemma, 4, seg);
    nv_engines_set_emulation(1); /* the tile engines' and the vector bf16 engine's logic in C */
    nv_engines_reset();
    nv_engines_init(NULL, 0);
    nv_engines_set_emulation(0);
    recompute_case(" (QK-norm, biases; emulated)", &qk, 0, NULL);
    nv_engines_reset();
    nv_engines_init(NULL, 0);
    /* the memory it saves: the activations of all layers but one */
    nv_config big = plain;
    big.n_layers = 12;
    const double kept = nv_tmodel_memory_bytes(&big, 4, 64, NULL, 0), again = nv_tmodel_memory_bytes(&big, 4, 64, NULL, 1);
    T_CHECK(again < kept, "memory %g kept, %g recomputed", kept, again);
}

/* The gradient norm is the square root of 64 fixed chunks' left-to-right double sums of squares,
 * added in chunk order: bit for bit, for lengths that leave the chunks unequal or empty, on one
 * thread or two. */
static void test_grad_norm_chunks(void) {
    static const uint64_t lens[] = {0, 1, 3, 63, 64, 65, 1000, 4099, 100003};
    float *g = malloc(100003 * sizeof(float));
    uint64_t seed = 77;
    for (int i = 0; i < 100003; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        g[i] = (float)((int64_t)(seed >> 20) % 200001 - 100000) * 1e-5f;
    }
    const int before = nv_pool_threads();
    for (int threads = 1; threads <= 2; threads++) {
        nv_pool_init(threads);
        for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
            const uint64_t n = lens[l];
            double total = 0.0;
            for (uint64_t c = 0; c < 64; c++) {
                double s = 0.0;
                for (uint64_t i = n * c / 64; i < n * (c + 1) / 64; i++) s += (double)g[i] * g[i];
                total += s;
            }
            const double want = sqrt(total), got = nv_grad_norm(g, n);
            T_CHECK(!memcmp(&want, &got, sizeof want), "n %llu, %d threads: %.17g, want %.17g", (unsigned long long)n, threads,
                    got, want);
        }
    }
    nv_pool_init(before);
    free(g);
}

/* nv_tmodel_optimize (update and refresh in one pass, by pieces) against nv_adamw_step followed by
 * nv_tmodel_refresh: the same parameters, moments and norm bit for bit over three steps, and plans
 * holding the same packed weights (the next forward gives the same logits bit for bit). The fused
 * model's backward writes over the gradients the last update spent; the other's adds to zeroed ones:
 * the same gradients (as floats: a zero sum's sign may differ), so no gradient escapes being
 * written. Shapes whose
 * matrices split into several pieces, with a last piece of rows that is not a whole packed unit, a
 * matrix wider than one piece (w2: k = 2100), tied and separate classifiers, QK-norm and biases
 * (gradients no product writes); every engine that is on, then the emulated avx512 and AMX ones. */
static void fused_case(const nv_config *c, nv_engine_id e) {
    enum { B = 2, T = 8 };
    int in[B * T], tg[B * T];
    make_batch(B, T, c->vocab_size, in, tg, 11);
    nv_tmodel a, b;
    if (nv_tmodel_init(&a, c, NULL, 3, B, T, e) != NV_OK || nv_tmodel_init(&b, c, a.m.params, 0, B, T, e) != NV_OK) {
        T_CHECK(0, "%s", nv_errmsg());
        return;
    }
    a.router_aux_coef = b.router_aux_coef = 0.01f;
    a.router_z_coef = b.router_z_coef = 0.001f;
    nv_adamw oa, ob;
    nv_adamw_opts o;
    nv_adamw_defaults(&o);
    o.lr = 1e-2f, o.total_steps = 10, o.grad_clip = 0.5f;
    T_CHECK(nv_adamw_init(&oa, &o, c, a.m.n_params) == NV_OK && nv_adamw_init(&ob, &o, c, b.m.n_params) == NV_OK, "adamw");
    const size_t bytes = (size_t)a.m.n_params * sizeof(float), lbytes = (size_t)B * T * c->vocab_size * sizeof(float);
    for (int step = 0; step < 3; step++) {
        nv_tmodel_zero_grad(&a);
        a.grads_held = 1; /* a sum of zero: the backward adds to it */
        nv_tmodel_forward(&a, in, tg);
        nv_tmodel_backward(&a, 1.0f);
        nv_tmodel_forward(&b, in, tg);
        nv_tmodel_backward(&b, 1.0f);
        uint64_t bad = b.m.n_params;
        for (uint64_t i = b.m.n_params; i-- > 0;)
            if (!(a.grads[i] == b.grads[i])) bad = i;
        T_CHECK(bad == b.m.n_params, "%s step %d: gradient %llu written %.9g, added to zero %.9g", nv_engine_name(e), step,
                (unsigned long long)bad, bad < b.m.n_params ? b.grads[bad] : 0.0f, bad < b.m.n_params ? a.grads[bad] : 0.0f);
        memcpy(b.grads, a.grads, bytes); /* the updates below then start from the same bits */
        float lra = 0, lrb = 0;
        const double na = nv_adamw_step(&oa, a.m.params, a.grads, &lra);
        nv_tmodel_refresh(&a);
        const double nb = nv_tmodel_optimize(&b, &ob, &lrb);
        T_CHECK(!memcmp(&na, &nb, sizeof na) && lra == lrb, "%s step %d: norm %.17g vs %.17g", nv_engine_name(e), step, na, nb);
        T_CHECK(!memcmp(a.m.params, b.m.params, bytes), "%s step %d: parameters differ", nv_engine_name(e), step);
        T_CHECK(!memcmp(oa.m, ob.m, bytes) && !memcmp(oa.v, ob.v, bytes), "%s step %d: moments differ", nv_engine_name(e), step);
        T_CHECK(!b.grads_held, "%s step %d: gradients still held after an update", nv_engine_name(e), step);
        const float la = nv_tmodel_forward(&a, in, tg), lb = nv_tmodel_forward(&b, in, tg);
        T_CHECK(!memcmp(&la, &lb, sizeof la) && !memcmp(a.a.logits, b.a.logits, lbytes),
                "%s step %d: the refreshed plans differ (loss %.9g vs %.9g)", nv_engine_name(e), step, la, lb);
    }
    nv_adamw_free(&oa);
    nv_adamw_free(&ob);
    nv_tmodel_free(&a);
    nv_tmodel_free(&b);
}

static void fused_cases(void) {
    /* classifier 1000 x 40: pieces of 816 rows (a whole number of 16- and 32-row units) then 184 */
    const nv_config tied = {40, 2100, 2, 4, 2, 10, 1000, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    const nv_config separate = {40, 72, 2, 4, 4, 10, 1000, 8, 10000.0f, 1e-5f, 0, 1, 0, {0}, 0, NV_CONFIG_PLAIN};
    const nv_config biases = {40, 72, 2, 4, 2, 10, 300, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 1, NV_CONFIG_PLAIN};
    /* a mixture of 24 experts, 2 a token, over 16 tokens: some experts get no row (their gradient
       must still be written) */
    nv_config moe = {40, 72, 2, 4, 2, 10, 300, 8, 10000.0f, 1e-5f, 0, 1, 0, {0}, 0, NV_CONFIG_PLAIN};
    moe.n_experts = 24, moe.n_experts_used = 2;
    for (int e = 0; e < NV_ENGINE_COUNT; e++)
        if (nv_engine_available((nv_engine_id)e)) {
            fused_case(&tied, (nv_engine_id)e);
            fused_case(&separate, (nv_engine_id)e);
            fused_case(&biases, (nv_engine_id)e);
            fused_case(&moe, (nv_engine_id)e);
        }
}

static void test_fused_optimizer_matches_two_passes(void) {
    fused_cases();
    nv_engines_set_emulation(1); /* the AVX-512 and AMX engines on their emulated kernels */
    nv_engines_reset();
    nv_engines_init(NULL, 0);
    nv_engines_set_emulation(0);
    fused_cases();
    nv_engines_reset();
    nv_engines_init(NULL, 0);
}

/* A gradient norm that is not finite (an infinity, then a NaN, among the gradients) skips the
 * update, fused or not: weights, moments and the packed copies stay as they were (the next forward
 * gives the same loss), the update still counts, and a finite step afterwards updates again. */
static void test_nonfinite_gradient_skips_update(void) {
    const nv_config c = {40, 72, 2, 4, 2, 10, 300, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    enum { B = 2, T = 8 };
    int in[B * T], tg[B * T];
    make_batch(B, T, c.vocab_size, in, tg, 5);
    nv_tmodel tm;
    if (nv_tmodel_init(&tm, &c, NULL, 9, B, T, nv_engine_best_float()) != NV_OK) {
        T_CHECK(0, "%s", nv_errmsg());
        return;
    }
    nv_adamw opt;
    nv_adamw_opts o;
    nv_adamw_defaults(&o);
    o.total_steps = 10;
    T_CHECK(nv_adamw_init(&opt, &o, &c, tm.m.n_params) == NV_OK, "adamw");
    const size_t bytes = (size_t)tm.m.n_params * sizeof(float);
    float *p0 = malloc(bytes), *m0 = malloc(bytes), *v0 = malloc(bytes);
    float lr;
    for (int round = 0; round < 2; round++) { /* a finite step first, so the moments are not zero */
        nv_tmodel_forward(&tm, in, tg);
        nv_tmodel_backward(&tm, 1.0f);
        nv_tmodel_optimize(&tm, &opt, &lr);
    }
    const float loss0 = nv_tmodel_forward(&tm, in, tg);
    nv_tmodel_backward(&tm, 1.0f);
    memcpy(p0, tm.m.params, bytes), memcpy(m0, opt.m, bytes), memcpy(v0, opt.v, bytes);
    tm.grads[tm.m.n_params / 2] = INFINITY;
    const long step0 = opt.step;
    double norm = nv_tmodel_optimize(&tm, &opt, &lr);
    T_CHECK(!isfinite(norm) && opt.step == step0 + 1, "fused: norm %g, step %ld after %ld", norm, opt.step, step0);
    T_CHECK(!memcmp(p0, tm.m.params, bytes) && !memcmp(m0, opt.m, bytes) && !memcmp(v0, opt.v, bytes),
            "fused: a skipped update changed the weights or moments");
    const float loss1 = nv_tmodel_forward(&tm, in, tg);
    T_CHECK(!memcmp(&loss0, &loss1, sizeof loss0), "the packed copies changed: loss %.9g then %.9g", loss0, loss1);
    nv_tmodel_backward(&tm, 1.0f);
    tm.grads[3] = NAN;
    norm = nv_adamw_step(&opt, tm.m.params, tm.grads, &lr);
    T_CHECK(isnan(norm) && !memcmp(p0, tm.m.params, bytes) && !memcmp(m0, opt.m, bytes) && !memcmp(v0, opt.v, bytes),
            "unfused: norm %g, or a skipped update changed the weights or moments", norm);
    tm.grads_held = 0; /* spent by that update */
    nv_tmodel_forward(&tm, in, tg);
    nv_tmodel_backward(&tm, 1.0f);
    norm = nv_tmodel_optimize(&tm, &opt, &lr);
    T_CHECK(isfinite(norm) && memcmp(p0, tm.m.params, bytes), "a finite step after skipped ones did not update");
    free(p0), free(m0), free(v0);
    nv_adamw_free(&opt);
    nv_tmodel_free(&tm);
}

/* Dropout: with its mask fixed, every gradient matches finite differences (a plain block, Gemma's
 * post-norms, Granite's multiplier, a mixture of experts); one or two threads and a recomputing
 * backward give the same bits; layer 0's attention output joins the residual stream dropped in
 * about p of its elements and the rest scaled by 1 / (1 - p); p 0 is the model without, bit for bit. */
static void test_dropout(void) {
    fd_dropout = 0.3f;
    nv_config c = {16, 24, 2, 4, 2, 4, 23, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    check_fd(&c, 2, 5);
    const nv_config gemma = with_gemma_block(c);
    fd_h = 3e-3f; /* its scaled embedding and soft caps bend within 1e-2 once the kept elements grow by 1 / (1 - p) */
    check_fd(&gemma, 2, 5);
    fd_h = 1e-2f;
    nv_config g = c;
    g.residual_scale = 0.22f;
    check_fd(&g, 2, 5);
    nv_config moe = c;
    moe.n_experts = 3, moe.n_experts_used = 3; /* every expert a token: no choice flips */
    check_fd(&moe, 2, 4);
    fd_dropout = 0.0f;

    same_bits_dropout = 0.25f;
    threads_same_bits(" (dropout)");
    nv_config plain = {32, 64, 3, 4, 2, 8, 61, 64, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    recompute_case(" (dropout)", &plain, 0, NULL);
    recompute_case(" (dropout, LoRA)", &plain, 4, NULL);
    same_bits_dropout = 0.0f;

    /* the mask's share and scale, against the same forward without dropout */
    enum { B = 2, T = 35 };
    const nv_config w = {64, 96, 2, 4, 2, 16, 61, 64, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    int in[B * T], tg[B * T];
    make_batch(B, T, w.vocab_size, in, tg, 17);
    nv_tmodel tm;
    if (nv_tmodel_init(&tm, &w, NULL, 21, B, T, nv_engine_best_fp32()) != NV_OK) {
        T_CHECK(0, "%s", nv_errmsg());
        return;
    }
    const size_t n = (size_t)B * T * w.dim;
    float *plain_x2 = malloc(n * sizeof(float));
    const float l0 = nv_tmodel_forward(&tm, in, tg);
    memcpy(plain_x2, tm.a.x2, n * sizeof(float));
    const float p = 0.3f;
    T_CHECK(nv_tmodel_set_dropout(&tm, p, 0.0f, 1234, 0) == NV_OK, "%s", nv_errmsg());
    const float lp = nv_tmodel_forward(&tm, in, tg);
    size_t dropped = 0, scaled = 0, considered = 0;
    for (size_t i = 0; i < n; i++) {
        const float branch = plain_x2[i] - tm.a.x[i], with = tm.a.x2[i] - tm.a.x[i]; /* x: the embedding, the same in both */
        if (fabsf(branch) < 1e-3f) continue;
        considered++;
        dropped += fabsf(with) <= 1e-6f * fabsf(branch) + 1e-7f;
        scaled += fabsf(with - branch / (1.0f - p)) <= 1e-4f * fabsf(branch) + 1e-6f;
    }
    const double share = (double)dropped / (double)considered;
    T_CHECK(considered > n / 2 && fabs(share - p) < 0.04 && dropped + scaled == considered,
            "of %zu elements %zu dropped (%.3f, p %.2f), %zu scaled by 1/(1-p)", considered, dropped, share, (double)p, scaled);
    T_CHECK(lp != l0, "the loss with dropout %g is the loss without", (double)lp);
    T_CHECK(nv_tmodel_set_dropout(&tm, 0.0f, 0.0f, 0, 0) == NV_OK && nv_tmodel_forward(&tm, in, tg) == l0, "p 0 is not the model without");
    T_CHECK(nv_tmodel_set_dropout(&tm, 1.0f, 0.0f, 0, 0) == NV_EINVAL && nv_tmodel_set_dropout(&tm, -0.1f, 0.0f, 0, 0) == NV_EINVAL &&
                nv_tmodel_set_dropout(&tm, NAN, 0.0f, 0, 0) == NV_EINVAL && nv_tmodel_set_dropout(&tm, 0.0f, 1.0f, 0, 0) == NV_EINVAL,
            "a probability outside [0, 1) was taken");
    free(plain_x2);
    nv_tmodel_free(&tm);
}

int main(void) {
    T_RUN(test_lr_schedules);
    nv_engines_init(NULL, 0);
    T_RUN(test_fd_gqa_tied);
    T_RUN(test_fd_separate_classifier_qknorm);
    T_RUN(test_fd_nope);
    T_RUN(test_fd_partial_rotary);
    T_RUN(test_fd_gemma);
    T_RUN(test_fd_olmo2);
    T_RUN(test_fd_mistral3);
    T_RUN(test_fd_granite);
    T_RUN(test_fd_mha_separate);
    T_RUN(test_fd_moe);
    T_RUN(test_fd_qkv_bias);
    T_RUN(test_fd_ignored_targets);
    T_RUN(test_fd_preference);
    T_RUN(test_fd_distill);
    T_RUN(test_packed_documents);
    T_RUN(test_accumulation_equals_larger_batch);
    T_RUN(test_engines_match_fp32);
    T_RUN(test_attention_kernels);
    T_RUN(test_attention_kernels_amx_bf16);
    T_RUN(test_adamw_matches_reference);
    T_RUN(test_backward_needs_targets);
    T_RUN(test_grad_norm_chunks);
    T_RUN(test_threads_same_bits);
    T_RUN(test_recompute_same_bits);
    T_RUN(test_dropout);
    T_RUN(test_fused_optimizer_matches_two_passes);
    T_RUN(test_nonfinite_gradient_skips_update);
    return t_done();
}
