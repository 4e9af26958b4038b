#include "train/tmodel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/pool.h"
#include "base/timer.h"
#include "base/vmath.h"
#include "model/forward.h"
#include "train/attention.h"

/* ---- layout ---------------------------------------------------------------------------- */

typedef struct {
    float *rope_cos, *rope_sin; /* [T][head_dim/2] */
    float *swa_cos, *swa_sin;   /* the windowed layers' own (rope_theta_swa), else empty */
    float *dpost;               /* post-norms: the gradient of a product before its norm [BT][d] */
    float *dres;                /* Granite: a branch's gradient, the residual's times its multiplier [BT][d] */
    float *dx, *dx2, *dxn, *dq, *dk, *dv, *dao, *dh1, *dh3, *dhg, *datt;
    float *xg, *dyg, *dxg, *dz; /* a mixture of experts: the rows gathered per expert, their output's and
                                   input's gradients [BT*K][d], the router logits' gradient [BT][E] */
    float *normp; /* the norms' weight gradients per chunk of rows (nv_rmsnorm_backward) */
} scratch_ptrs;

/* The layers whose activations are kept: all, or one slot when they are recomputed in the backward;
   layer l's are in slot act_slot(tm, l). */
static int kept_layers(const nv_config *c, int recompute) { return recompute ? 1 : c->n_layers; }
static int act_slot(const nv_tmodel *tm, int l) { return tm->recompute ? 0 : l; }

/* kept: kept_layers'; the residual stream entering each layer is kept for all of them */
static size_t acts_layout(const nv_config *c, int B, int T, int kept, nv_acts *a, float *base) {
    size_t BT = (size_t)B * T, L = (size_t)kept, d = (size_t)c->dim, h = (size_t)c->hidden_dim;
    size_t qd = (size_t)nv_config_q_dim(c), kvd = (size_t)nv_config_kv_dim(c);
    size_t H = (size_t)c->n_heads, V = (size_t)c->vocab_size;
    size_t qk = c->qk_norm ? 1 : 0, post = c->post_norms ? 1 : 0, lcap = c->logit_softcap != 0.0f ? 1 : 0;
    size_t pre = c->no_pre_norms ? 0 : 1; /* OLMo 2: the branches read the residual rows themselves */
    /* QK-norm's statistics per row: one per head, or one for the whole projection (OLMo 2) */
    size_t qgroups = qd / (size_t)nv_config_q_norm_len(c), kgroups = kvd / (size_t)nv_config_k_norm_len(c);
    /* a mixture of experts: the FFN's hidden rows are per (token, chosen expert) */
    const size_t E = (size_t)c->n_experts, K = E ? (size_t)c->n_experts_used : 0, hr = BT * (E ? K : 1);
    float *sel, *order, *at, *off; /* int parts (4 bytes a value, as a float's) */
    struct {
        float **p;
        size_t n;
    } parts[] = {
        {&a->x, ((size_t)c->n_layers + 1) * BT * d}, {&a->xn1, pre * L * BT * d}, {&a->rstd1, pre * L * BT},
        {&a->qraw, qk * L * BT * qd}, {&a->kraw, qk * L * BT * kvd}, {&a->qrstd, qk * L * BT * qgroups},
        {&a->krstd, qk * L * BT * kgroups}, {&a->q, L * BT * qd}, {&a->k, L * BT * kvd}, {&a->v, L * BT * kvd},
        {&a->att_stats, L * (size_t)B * H * T * 2}, {&a->ao, L * BT * qd}, {&a->x2, L * BT * d},
        {&a->ya, post * L * BT * d}, {&a->rstd_pa, post * L * BT}, {&a->yf, post * L * BT * d}, {&a->rstd_pf, post * L * BT},
        {&a->lmax, lcap * BT},
        {&a->xn2, pre * L * BT * d}, {&a->rstd2, pre * L * BT}, {&a->h1, L * hr * h}, {&a->h3, L * hr * h},
        {&a->hg, L * hr * h}, {&a->xnf, BT * d}, {&a->rstdf, BT}, {&a->logits, BT * V},
        {&a->pscale, BT}, {&a->nll, BT}, {&a->moe_p, L * BT * E}, {&a->moe_w, L * BT * K}, {&a->moe_lse, E ? L * BT : 0},
        {&a->moe_y, L * BT * K * d}, {&sel, L * BT * K}, {&order, L * BT * K}, {&at, L * BT * K},
        {&off, E ? L * (E + 1) : 0},
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (base) *parts[i].p = parts[i].n ? base + total : NULL;
        total += (parts[i].n + 15) & ~(size_t)15; /* keep every part 64-byte aligned */
    }
    if (base) a->moe_sel = (int *)sel, a->moe_order = (int *)order, a->moe_at = (int *)at, a->moe_off = (int *)off;
    return total;
}

static size_t scratch_layout(const nv_config *c, int B, int T, scratch_ptrs *out, float *base) {
    scratch_ptrs dummy, *s = out ? out : &dummy;
    size_t BT = (size_t)B * T, d = (size_t)c->dim, h = (size_t)c->hidden_dim;
    size_t qd = (size_t)nv_config_q_dim(c), kvd = (size_t)nv_config_kv_dim(c), half = (size_t)c->head_dim / 2;
    const size_t E = (size_t)c->n_experts, hr = BT * (E ? (size_t)c->n_experts_used : 1), gr = E ? hr : 0;
    size_t wide = qd > d ? qd : d, swa = c->rope_theta_swa != 0.0f ? (size_t)T * half : 0;
    size_t normp = nv_rmsnorm_partials(BT, d), headp = 0;
    if (c->qk_norm) { /* per head, or over the whole projections */
        const size_t qn = (size_t)nv_config_q_norm_len(c), kn = (size_t)nv_config_k_norm_len(c);
        const size_t qp = nv_rmsnorm_partials(BT * (qd / qn), qn), kp = nv_rmsnorm_partials(BT * (kvd / kn), kn);
        headp = qp > kp ? qp : kp;
    }
    struct {
        float **p;
        size_t n;
    } parts[] = {{&s->rope_cos, (size_t)T * half}, {&s->rope_sin, (size_t)T * half}, {&s->swa_cos, swa}, {&s->swa_sin, swa},
                 {&s->dpost, c->post_norms ? BT * d : 0}, {&s->dres, c->residual_scale != 0.0f ? BT * d : 0}, {&s->dx, BT * d},
                 {&s->dx2, BT * d}, {&s->dxn, BT * wide}, {&s->dq, BT * qd}, {&s->dk, BT * kvd},
                 {&s->dv, BT * kvd}, {&s->dao, BT * qd}, {&s->dh1, hr * h}, {&s->dh3, hr * h},
                 {&s->dhg, hr * h}, {&s->datt, nv_attention_workspace(c, B, T)}, {&s->normp, normp > headp ? normp : headp},
                 {&s->xg, gr * d}, {&s->dyg, gr * d}, {&s->dxg, gr * d}, {&s->dz, BT * E}};
    size_t total = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (base) *parts[i].p = base + total;
        total += (parts[i].n + 15) & ~(size_t)15;
    }
    return total;
}

static scratch_ptrs scratch_of(const nv_tmodel *tm) {
    scratch_ptrs s; /* (laid out for T_cap, where the RoPE tables were filled, whatever the windows' length) */
    scratch_layout(&tm->m.config, tm->B, tm->T_cap, &s, tm->scratch);
    return s;
}

/* Floats of the adapters' kept activations (all seven matrices' slots, targeted or not). */
static size_t lora_us_floats(const nv_config *c, int B, int T, int rank) {
    return (size_t)c->n_layers * NV_LAYER_MATRICES * (size_t)B * (size_t)T * (size_t)rank;
}

double nv_tmodel_memory_bytes(const nv_config *c, int B, int T, const nv_lora_shape *lora, int flags) {
    const double n = (double)nv_config_param_count(c);
    const double acts = 4.0 * ((double)acts_layout(c, B, T, kept_layers(c, flags & NV_TMODEL_RECOMPUTE), &(nv_acts){0}, NULL) +
                               (double)scratch_layout(c, B, T, NULL, NULL));
    /* weights, gradients, AdamW's two moments, the plans' packed copies (bf16 tiles and dx's
       transposed tiles, or fp32 panels: about 4 bytes a weight), activations and scratch */
    if (!lora || lora->rank <= 0) return 20.0 * n + acts;
    /* adapters: the frozen weights (the caller's, used in place: given back where released but the
       token embedding) and their plans; the adapters' weights, gradients, moments and plans, and their
       activations */
    const double na = (double)nv_lora_param_count(c, lora), emb = (double)c->vocab_size * c->dim;
    const double base = flags & NV_TMODEL_RELEASE_BASE ? 4.0 * n + 4.0 * emb : 8.0 * n;
    return base + 20.0 * na + acts + 4.0 * (double)lora_us_floats(c, B, T, lora->rank + 1);
}

static nv_plan *lora_plan(const nv_tmodel *tm, int l, int t, int half) {
    return tm->lora_plans ? tm->lora_plans[((size_t)l * NV_LAYER_MATRICES + (size_t)t) * 2 + (size_t)half] : NULL;
}

/* Builds the adapters' state (tm->lora set): block, gradients, activations and a plan per half. */
static nv_err lora_setup(nv_tmodel *tm, const float *lora_init, uint64_t seed, nv_engine_id engine) {
    const nv_config *c = &tm->m.config;
    const nv_lora_shape *s = &tm->lora;
    NV_TRY(nv_lora_validate(c, s));
    const uint64_t n = nv_lora_param_count(c, s);
    const size_t BT = (size_t)tm->B * (size_t)tm->T;
    tm->lora_params = nv_calloc_large((size_t)n, sizeof(float));
    tm->lora_grads = nv_calloc_large((size_t)n, sizeof(float));
    tm->lora_us = nv_calloc_large(lora_us_floats(c, tm->B, tm->T, s->rank), sizeof(float));
    tm->lora_du = nv_calloc_large(BT * (size_t)s->rank, sizeof(float));
    /* the frozen norms' weight gradients, dropped: as wide as the widest norm (OLMo 2's QK-norm: a whole projection) */
    tm->sink = calloc((size_t)(c->dim + nv_config_q_norm_len(c) + nv_config_k_norm_len(c)), sizeof(float));
    tm->lora_plans = calloc((size_t)c->n_layers * NV_LAYER_MATRICES * 2, sizeof *tm->lora_plans);
    if (!tm->lora_params || !tm->lora_grads || !tm->lora_us || !tm->lora_du || !tm->sink || !tm->lora_plans)
        return nv_fail(NV_ENOMEM, "cannot allocate the LoRA adapters");
    if (lora_init) memcpy(tm->lora_params, lora_init, (size_t)n * sizeof(float));
    else nv_lora_init(c, s, tm->lora_params, seed);
    for (int l = 0; l < c->n_layers; l++)
        for (int t = 0; t < NV_LAYER_MATRICES; t++) {
            if (!(s->targets & (1u << t))) continue;
            int out, in;
            nv_lora_dims(c, t, &out, &in);
            const float *a = tm->lora_params + nv_lora_offset(c, s, l, t);
            nv_plan **pp = &tm->lora_plans[((size_t)l * NV_LAYER_MATRICES + (size_t)t) * 2];
            NV_TRY(nv_plan_build(&pp[0], engine, a, s->rank, in));
            NV_TRY(nv_plan_build(&pp[1], engine, a + (size_t)s->rank * in, s->rank, out));
        }
    tm->train_params = tm->lora_params;
    tm->train_grads = tm->lora_grads;
    tm->n_train = n;
    return NV_OK;
}

static void lora_refresh(nv_tmodel *tm) {
    const nv_config *c = &tm->m.config;
    for (int l = 0; l < c->n_layers && tm->lora_plans; l++)
        for (int t = 0; t < NV_LAYER_MATRICES; t++) {
            if (!lora_plan(tm, l, t, 0)) continue;
            int out, in;
            nv_lora_dims(c, t, &out, &in);
            const float *a = tm->lora_params + nv_lora_offset(c, &tm->lora, l, t);
            nv_plan_refresh(lora_plan(tm, l, t, 0), a);
            nv_plan_refresh(lora_plan(tm, l, t, 1), a + (size_t)tm->lora.rank * in);
        }
}

static float *lora_us_of(const nv_tmodel *tm, int l, int t) {
    return tm->lora_us + ((size_t)l * NV_LAYER_MATRICES + (size_t)t) * (size_t)tm->B * tm->T * (size_t)tm->lora.rank;
}

/* y[r] *= k for n floats */
static void scale_floats(float *y, size_t n, float k) {
    for (size_t i = 0; i < n; i++) y[i] *= k;
}

/* y += s (x A^T) B^T for layer l's matrix t when it has an adapter (s = alpha / rank); s x A^T is
 * kept for the backward. y += u B^T runs as the B^T plan's dx-style product. */
static const float *lora_dropped_input(const nv_tmodel *tm, int l, int t, const float *x, int in);
static void lora_dx_add(const nv_tmodel *tm, int l, int t, const nv_plan *pa, const float *du, int in, float *dx);

static void lora_forward(nv_tmodel *tm, int l, int t, const float *x, float *y) {
    nv_plan *pa = lora_plan(tm, l, t, 0);
    if (!pa) return;
    const int BT = tm->B * tm->T;
    int out, in;
    nv_lora_dims(&tm->m.config, t, &out, &in);
    float *us = lora_us_of(tm, l, t);
    nv_plan_run(pa, lora_dropped_input(tm, l, t, x, in), BT, us);
    scale_floats(us, (size_t)BT * tm->lora.rank, tm->lora.alpha / (float)tm->lora.rank);
    nv_plan_run_dx_add(lora_plan(tm, l, t, 1), us, BT, y);
}

/* The adapter of layer l's matrix t (input x, output gradient dy), when it has one: with
 * du = s dy B, dA (+)= du^T x, dB^T (+)= (s x A^T)^T dy, and dx += du A (x and du A through the
 * adapters' dropout, where it is on). */
static void lora_backward(nv_tmodel *tm, nv_engine_id e, int l, int t, const float *x, const float *dy, float *dx, int acc) {
    nv_plan *pa = lora_plan(tm, l, t, 0);
    if (!pa) return;
    const int BT = tm->B * tm->T, r = tm->lora.rank;
    int out, in;
    nv_lora_dims(&tm->m.config, t, &out, &in);
    float *du = tm->lora_du, *ga = tm->lora_grads + nv_lora_offset(&tm->m.config, &tm->lora, l, t);
    nv_plan_run(lora_plan(tm, l, t, 1), dy, BT, du);
    scale_floats(du, (size_t)BT * r, tm->lora.alpha / (float)r);
    nv_gemm_dw(e, du, lora_dropped_input(tm, l, t, x, in), BT, r, in, ga, acc);
    nv_gemm_dw(e, lora_us_of(tm, l, t), dy, BT, r, out, ga + (size_t)r * in, acc);
    lora_dx_add(tm, l, t, pa, du, in, dx);
}

nv_err nv_tmodel_init(nv_tmodel *tm, const nv_config *c, const float *init, uint64_t seed, int B, int T,
                      nv_engine_id engine) {
    return nv_tmodel_init_ex(tm, c, init, seed, B, T, engine, NULL, NULL, 0);
}

nv_err nv_tmodel_init_lora(nv_tmodel *tm, const nv_config *c, const float *init, uint64_t seed, int B, int T,
                           nv_engine_id engine, const nv_lora_shape *lora, const float *lora_init) {
    return nv_tmodel_init_ex(tm, c, init, seed, B, T, engine, lora, lora_init, 0);
}

nv_err nv_tmodel_init_ex(nv_tmodel *tm, const nv_config *c, const float *init, uint64_t seed, int B, int T,
                         nv_engine_id engine, const nv_lora_shape *lora, const float *lora_init, int flags) {
    memset(tm, 0, sizeof *tm);
    if (c->gpt_oss) /* its sinks, biased experts and SwiGLU-OAI have no backward here */
        return nv_fail(NV_EUNSUPPORTED, "training gpt-oss is not supported (its attention sinks and biased experts are served, not trained)");
    tm->recompute = (flags & NV_TMODEL_RECOMPUTE) != 0;
    if (B < 1 || T < 1 || T > c->seq_len)
        return nv_fail(NV_EINVAL, "batch %d x sequence %d does not fit the model's context of %d", B, T, c->seq_len);
    if ((long long)B * T > (1 << 26)) /* row indices are ints; 67M tokens a step is far past any memory here */
        return nv_fail(NV_EINVAL, "batch %d x sequence %d is %lld tokens a step: at most %d", B, T, (long long)B * T, 1 << 26);
    const int adapters = lora && lora->rank > 0;
    if (adapters && !init) return nv_fail(NV_EINVAL, "LoRA adapts a model: give the weights to start from");
    if (adapters) { /* the frozen weights are read where the caller keeps them: no copy of the model */
        NV_TRY(nv_config_validate(c));
        tm->m.config = *c;
        tm->m.params = (float *)init; /* never written: the base gets no update (not owned: not freed) */
        tm->m.n_params = nv_config_param_count(c);
        nv_weights_point(&tm->m.w, c, tm->m.params);
    } else {
        NV_TRY(nv_model_alloc(&tm->m, c));
        if (init) memcpy(tm->m.params, init, (size_t)tm->m.n_params * sizeof(float));
        else nv_model_init_random(&tm->m, seed);
    }
    tm->B = B;
    tm->T = tm->T_cap = T;
    if (!adapters) tm->grads = nv_calloc_large((size_t)tm->m.n_params, sizeof(float));
    const int kept = kept_layers(c, tm->recompute);
    size_t na = acts_layout(c, B, T, kept, &tm->a, NULL), ns = scratch_layout(c, B, T, NULL, NULL);
    tm->act_mem = nv_alloc_large(64, na * sizeof(float), 1);
    tm->scratch = nv_alloc_large(64, ns * sizeof(float), 1);
    if ((!adapters && !tm->grads) || !tm->act_mem || !tm->scratch) {
        nv_tmodel_free(tm);
        return nv_fail(NV_ENOMEM, "cannot allocate %.0f MB of activations for batch %d x %d",
                       (double)(na + ns) * 4 / 1e6, B, T);
    }
    memset(tm->act_mem, 0, na * sizeof(float));
    memset(tm->scratch, 0, ns * sizeof(float));
    acts_layout(c, B, T, kept, &tm->a, tm->act_mem);
    if (!adapters) {
        nv_weights_point(&tm->g, c, tm->grads);
        tm->train_params = tm->m.params;
        tm->train_grads = tm->grads;
        tm->n_train = tm->m.n_params;
    }
    scratch_ptrs s = scratch_of(tm);
    /* inference's angles (nv_rope_table_new), so training and inference rotate identically, split
     * into the cos and sin rows rope_rows reads; Gemma 3's windowed layers have their own */
    const int half = c->head_dim / 2;
    for (int windowed = 0; windowed <= (c->rope_theta_swa != 0.0f); windowed++) {
        float *cs = nv_rope_table_new(c, T, windowed);
        if (!cs) {
            nv_tmodel_free(tm);
            return nv_fail(NV_ENOMEM, "cannot allocate the RoPE table");
        }
        float *cosv = windowed ? s.swa_cos : s.rope_cos, *sinv = windowed ? s.swa_sin : s.rope_sin;
        for (size_t i = 0; i < (size_t)T * half; i++) {
            cosv[i] = cs[2 * i];
            sinv[i] = cs[2 * i + 1];
        }
        free(cs);
    }
    tm->m.release_floats = adapters && (flags & NV_TMODEL_RELEASE_BASE);
    nv_err e = nv_model_build_plans(&tm->m, engine);
    tm->base_released = tm->m.released > 0;
    if (e == NV_OK && adapters) {
        tm->lora = *lora;
        e = lora_setup(tm, lora_init, seed, nv_plan_engine(tm->m.cls_plan));
    }
    if (e != NV_OK) {
        nv_tmodel_free(tm);
        return e;
    }
    double BT = (double)B * T, d = c->dim, qd = nv_config_q_dim(c), kvd = nv_config_kv_dim(c);
    /* a mixture of experts: the experts a token uses, and the router */
    const double ffn_sets = c->n_experts ? c->n_experts_used : 1;
    double per_token = c->n_layers * (d * qd * 2 + d * kvd * 2 + 3 * d * c->hidden_dim * ffn_sets + d * c->n_experts) +
                       d * c->vocab_size;
    /* forward 2, backward's dx 2 and dW 2 FLOPs a weight a token; frozen weights have no dW, and
       an adapter's r (in + out) weights run 3 products forward and backward */
    const double lora_per_token = adapters ? (double)nv_lora_param_count(c, lora) : 0.0;
    tm->flops_dense = (adapters ? 4.0 : 6.0) * BT * per_token + 6.0 * BT * lora_per_token;
    /* QK^T and AV, 2 FLOPs a head dimension each, forward and the backward's two of each */
    tm->flops_key = 3.0 * 2.0 * 2.0 * c->n_heads * c->head_dim;
    tm->flops_per_step = nv_tmodel_step_flops(tm, NULL);
    return NV_OK;
}

double nv_tmodel_step_flops(const nv_tmodel *tm, const int *seg) {
    const nv_config *c = &tm->m.config;
    const int T = tm->T, W = c->swa_window, windowed = nv_config_windowed_layers(c);
    /* the keys row r sees: its document's rows up to itself, at most W in a windowed layer */
    double all = 0.0, in_window = 0.0;
    for (int r = 0; r < tm->B * T; r++) {
        const int seen = r % T - (seg ? seg[r] : 0) + 1;
        all += seen;
        in_window += seen < W ? seen : W;
    }
    /* (flops_dense is of T_cap rows a window: shorter windows run their share of it) */
    return tm->flops_dense * T / tm->T_cap + tm->flops_key * ((c->n_layers - windowed) * all + windowed * in_window);
}

void nv_tmodel_free(nv_tmodel *tm) {
    for (size_t i = 0; tm->lora_plans && i < (size_t)tm->m.config.n_layers * NV_LAYER_MATRICES * 2; i++)
        if (tm->lora_plans[i]) nv_plan_free(tm->lora_plans[i]);
    free(tm->lora_plans);
    free(tm->lora_params);
    free(tm->lora_grads);
    free(tm->lora_us);
    free(tm->lora_du);
    free(tm->sink);
    free(tm->drop_buf);
    free(tm->lora_xd);
    nv_model_free(&tm->m);
    free(tm->grads);
    free(tm->act_mem);
    free(tm->scratch);
    memset(tm, 0, sizeof *tm);
}

void nv_tmodel_zero_grad(nv_tmodel *tm) {
    memset(tm->train_grads, 0, (size_t)tm->n_train * sizeof(float));
    tm->grads_held = 0;
}

/* A matrix a plan holds: its place in params, its plan, rows x k. */
typedef struct {
    uint64_t off, n;
    nv_plan *plan;
    int rows, k;
} opt_matrix;

/* The matrices the plans hold: nv_model_plan_count's (the layers' seven, the classifier, then a
 * mixture's experts), then each layer's router in a mixture of experts. */
static int plan_matrix_count(const nv_config *c) { return nv_model_plan_count(c) + (c->n_experts ? c->n_layers : 0); }

/* Matrix i of plan_matrix_count: layer i / 7's wq, wk, wv, wo, w1, w2, w3 (the last three without a
 * plan in a mixture of experts), the classifier (its plan holds wcls, which is tok_emb itself when
 * shared), then expert e of layer l's gate, down and up at nv_model_expert_plan, then the routers. */
static opt_matrix plan_matrix(const nv_tmodel *tm, int i) {
    const nv_config *c = &tm->m.config;
    const nv_weights *w = &tm->m.w;
    const uint64_t d = (uint64_t)c->dim, q = (uint64_t)nv_config_q_dim(c), kv = (uint64_t)nv_config_kv_dim(c),
                   h = (uint64_t)c->hidden_dim, V = (uint64_t)c->vocab_size, E = (uint64_t)c->n_experts;
    const int L = c->n_layers, experts_at = L * NV_LAYER_MATRICES + 1;
    if (i >= experts_at) { /* a mixture's experts, then its routers */
        const int x = i - experts_at;
        if (x >= 3 * L * (int)E) {
            const int l = x - 3 * L * (int)E;
            return (opt_matrix){(uint64_t)(w->router + l * E * d - tm->m.params), E * d, tm->m.plans[l].router, (int)E, (int)d};
        }
        int l, e, part;
        nv_model_expert_of(c, i, &l, &e, &part);
        const uint64_t at = ((uint64_t)l * E + (uint64_t)e) * h * d;
        const float *p = (part == 0 ? w->w1 : part == 1 ? w->w2 : w->w3) + at;
        return (opt_matrix){(uint64_t)(p - tm->m.params), h * d, nv_model_plan(&tm->m, i), part == 1 ? (int)d : (int)h,
                            part == 1 ? (int)h : (int)d};
    }
    const int l = i / 7;
    if (l >= L) return (opt_matrix){(uint64_t)(w->wcls - tm->m.params), V * d, tm->m.cls_plan, (int)V, (int)d};
    const struct {
        const float *p;
        uint64_t rows, cols;
    } m[7] = {{w->wq + l * q * d, q, d}, {w->wk + l * kv * d, kv, d}, {w->wv + l * kv * d, kv, d}, {w->wo + l * d * q, d, q},
              {w->w1 + l * h * d, h, d}, {w->w2 + l * d * h, d, h},   {w->w3 + l * h * d, h, d}};
    const int j = i % 7;
    return (opt_matrix){(uint64_t)(m[j].p - tm->m.params), m[j].rows * m[j].cols, nv_model_plan(&tm->m, i), (int)m[j].rows,
                        (int)m[j].cols};
}

void nv_tmodel_refresh(nv_tmodel *tm) {
    /* adapters: the base is frozen, its plans already what its weights are (which may be given back) */
    for (int i = 0; !tm->lora_params && i < plan_matrix_count(&tm->m.config); i++) {
        const opt_matrix mt = plan_matrix(tm, i);
        if (mt.plan) nv_plan_refresh(mt.plan, tm->m.params + mt.off);
    }
    lora_refresh(tm);
}

/* A piece of the fused optimizer pass: params [lo, hi), and when plan is set, rows r0..r1-1 of the
 * matrix at w whose packed copy the plan holds. */
typedef struct {
    uint64_t lo, hi;
    nv_plan *plan;
    const float *w;
    int r0, r1;
} opt_piece;

typedef struct {
    nv_tmodel *tm;
    const nv_adamw *a;
    const nv_adamw_update *u;
    const opt_piece *pieces;
} opt_job;

#define OPT_PIECE_FLOATS 32768 /* each of params, grads, m, v: 128 KiB, all four in L2 together */

static void opt_task(void *ctx, int task, int n_tasks) {
    (void)n_tasks;
    const opt_job *j = ctx;
    const opt_piece *pc = &j->pieces[task];
    nv_adamw_range(j->a, j->u, j->tm->m.params, j->tm->grads, pc->lo, pc->hi);
    if (pc->plan) nv_plan_refresh_rows(pc->plan, pc->w, pc->r0, pc->r1);
}

static int matrix_cmp(const void *x, const void *y) {
    const opt_matrix *a = x, *b = y;
    return a->off < b->off ? -1 : a->off > b->off;
}

/* The matrices with a plan sorted by place (malloc'd; NULL when out of memory). */
static opt_matrix *sorted_matrices(const nv_tmodel *tm, int *count) {
    const int all = plan_matrix_count(&tm->m.config);
    opt_matrix *mats = malloc(sizeof *mats * (size_t)all);
    if (!mats) return NULL;
    int k = 0;
    for (int i = 0; i < all; i++)
        if ((mats[k] = plan_matrix(tm, i)).plan) k++;
    qsort(mats, (size_t)k, sizeof *mats, matrix_cmp);
    *count = k;
    return mats;
}

/* Before a backward that writes the gradients (nothing held): zero those no weight-gradient product
 * writes whole (norm weights, biases, an embedding apart from the classifier), as the backward adds
 * to them. */
static void zero_unwritten_grads(nv_tmodel *tm) {
    int count;
    opt_matrix *mats = sorted_matrices(tm, &count);
    if (!mats) { /* out of memory for the list: all of them */
        nv_tmodel_zero_grad(tm);
        return;
    }
    uint64_t pos = 0;
    for (int i = 0; i <= count; i++) {
        const uint64_t end = i < count ? mats[i].off : tm->m.n_params;
        if (end > pos) memset(tm->grads + pos, 0, (size_t)(end - pos) * sizeof(float));
        if (i < count && mats[i].off + mats[i].n > pos) pos = mats[i].off + mats[i].n;
    }
    free(mats);
}

/* Pieces covering [lo, hi) without a plan, written to out when it is not NULL; returns count plus
 * their number. */
static size_t plain_pieces(opt_piece *out, size_t count, uint64_t lo, uint64_t hi) {
    for (uint64_t p = lo; p < hi; p += OPT_PIECE_FLOATS, count++)
        if (out) out[count] = (opt_piece){p, hi - p < OPT_PIECE_FLOATS ? hi : p + OPT_PIECE_FLOATS, NULL, NULL, 0, 0};
    return count;
}

/* The pieces of the whole parameter block (mats sorted by place), into out when it is not NULL;
 * returns their number. A matrix's pieces are whole packed units of rows. */
static size_t all_pieces(opt_piece *out, const opt_matrix *mats, int count, const float *base, uint64_t n_params) {
    size_t np = 0;
    uint64_t pos = 0;
    for (int i = 0; i < count; i++) {
        const opt_matrix *mt = &mats[i];
        np = plain_pieces(out, np, pos, mt->off);
        const int unit = nv_plan_row_unit(mt->plan);
        int rows = OPT_PIECE_FLOATS / mt->k / unit * unit;
        if (rows < unit) rows = unit;
        for (int r0 = 0; r0 < mt->rows; r0 += rows, np++) {
            const int r1 = mt->rows - r0 < rows ? mt->rows : r0 + rows;
            if (out)
                out[np] = (opt_piece){mt->off + (uint64_t)r0 * mt->k, mt->off + (uint64_t)r1 * mt->k, mt->plan, base + mt->off,
                                      r0, r1};
        }
        pos = mt->off + mt->n;
    }
    return plain_pieces(out, np, pos, n_params);
}

/* Without memory for the piece list: the update, then the refresh (the same bits). */
static double optimize_two_pass(nv_tmodel *tm, nv_adamw *opt, float *lr_out) {
    const double norm = nv_adamw_step(opt, tm->m.params, tm->grads, lr_out);
    nv_tmodel_refresh(tm);
    tm->grads_held = 0;
    return norm;
}

double nv_tmodel_optimize(nv_tmodel *tm, nv_adamw *opt, float *lr_out) {
    if (tm->lora.rank > 0) { /* the adapters alone: small, then their plans rewritten */
        const double norm = nv_adamw_step(opt, tm->lora_params, tm->lora_grads, lr_out);
        if (isfinite(norm)) lora_refresh(tm);
        tm->grads_held = 0;
        return norm;
    }
    const float *base = tm->m.params;
    int k;
    opt_matrix *mats = sorted_matrices(tm, &k);
    if (!mats) return optimize_two_pass(tm, opt, lr_out);
    const size_t np = all_pieces(NULL, mats, k, base, tm->m.n_params);
    opt_piece *pieces = np <= INT32_MAX ? malloc(sizeof *pieces * np) : NULL;
    if (!pieces) {
        free(mats);
        return optimize_two_pass(tm, opt, lr_out);
    }
    all_pieces(pieces, mats, k, base, tm->m.n_params);
    const nv_adamw_update u = nv_adamw_begin(opt, tm->grads);
    opt_job j = {tm, opt, &u, pieces};
    if (!u.skip) nv_pool_run(opt_task, &j, (int)np); /* skipped: the weights and their packed copies stay */
    tm->grads_held = 0; /* spent: the next backward writes them */
    free(pieces);
    free(mats);
    if (lr_out) *lr_out = u.lr;
    return u.norm;
}

/* ---- layers ----------------------------------------------------------------------------- */

/* Tasks for a pass split into pieces (pieces >= 1): two per thread at most, so a thread held up
 * elsewhere leaves little for the others to wait on. */
static int pool_tasks(size_t pieces) {
    const size_t most = 2 * (size_t)nv_pool_threads();
    return (int)(pieces < most ? pieces : most);
}

/* Norms run on the pool in fixed chunks of NORM_ROWS rows: each row's arithmetic is its own, and the
 * weight gradient, a sum over rows, is summed per chunk and the chunks added in order, so the bits do
 * not depend on the threads. */
#define NORM_ROWS 32

size_t nv_rmsnorm_partials(size_t rows, size_t n) { return (rows + NORM_ROWS - 1) / NORM_ROWS * n; }

typedef struct {
    float *out, *rstd, *dx, *part;
    const float *x, *w, *dout, *rstd_in;
    int rows, n;
    float eps;
} norm_job;

/* The end of chunk task's rows (it starts at task * NORM_ROWS). */
static int norm_chunk_end(const norm_job *j, int task) {
    return (task + 1) * NORM_ROWS < j->rows ? (task + 1) * NORM_ROWS : j->rows;
}

/* sum of a[j] * b[j] (* c[j] when c is not NULL) over 8 lanes, then the lanes in order */
static float dot8(const float *a, const float *b, const float *c, int n) {
    __m256 acc = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8) {
        __m256 p = _mm256_mul_ps(nv_load8_n(a + j, n - j), nv_load8_n(b + j, n - j));
        if (c) p = _mm256_mul_ps(p, nv_load8_n(c + j, n - j));
        acc = _mm256_add_ps(acc, p);
    }
    return nv_hsum256(acc);
}

static void norm_forward_task(void *ctx, int task, int n_tasks) {
    (void)n_tasks;
    const norm_job *j = ctx;
    const int n = j->n, r1 = norm_chunk_end(j, task);
    for (int r = task * NORM_ROWS; r < r1; r++) {
        const float *xr = j->x + (size_t)r * n;
        float *o = j->out + (size_t)r * n;
        const float s = 1.0f / sqrtf(dot8(xr, xr, NULL, n) / (float)n + j->eps);
        j->rstd[r] = s;
        const __m256 vs = _mm256_set1_ps(s);
        for (int i = 0; i < n; i += 8)
            nv_store8_n(o + i, _mm256_mul_ps(nv_load8_n(j->w + i, n - i), _mm256_mul_ps(vs, nv_load8_n(xr + i, n - i))), n - i);
    }
}

void nv_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int rows, int n, float eps) {
    norm_job j = {.out = out, .rstd = rstd, .x = x, .w = w, .rows = rows, .n = n, .eps = eps};
    nv_pool_run(norm_forward_task, &j, (rows + NORM_ROWS - 1) / NORM_ROWS);
}

/* dx += s w dout - (s^3 / n) (w . dout . x) x per row; the chunk's sum of dout x s into its partial */
static void norm_backward_task(void *ctx, int task, int n_tasks) {
    (void)n_tasks;
    const norm_job *j = ctx;
    const int n = j->n, r1 = norm_chunk_end(j, task);
    float *part = j->part + (size_t)task * n;
    memset(part, 0, (size_t)n * sizeof(float));
    for (int r = task * NORM_ROWS; r < r1; r++) {
        const float *xr = j->x + (size_t)r * n, *dr = j->dout + (size_t)r * n;
        float *dxr = j->dx + (size_t)r * n;
        const float s = j->rstd_in[r], coef = dot8(j->w, dr, xr, n) * s * s * s / (float)n;
        const __m256 vs = _mm256_set1_ps(s), vc = _mm256_set1_ps(coef);
        for (int i = 0; i < n; i += 8) {
            const __m256 x8 = nv_load8_n(xr + i, n - i), d8 = nv_load8_n(dr + i, n - i);
            nv_store8_n(part + i, _mm256_add_ps(nv_load8_n(part + i, n - i), _mm256_mul_ps(_mm256_mul_ps(d8, x8), vs)), n - i);
            const __m256 g = _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(vs, nv_load8_n(j->w + i, n - i)), d8), _mm256_mul_ps(vc, x8));
            nv_store8_n(dxr + i, _mm256_add_ps(nv_load8_n(dxr + i, n - i), g), n - i);
        }
    }
}

typedef struct {
    float *dw;
    const float *part;
    int chunks, n;
} norm_sum_job;

/* dw[i] += the chunks' partials in chunk order, for a range of columns */
static void norm_sum_task(void *ctx, int task, int n_tasks) {
    const norm_sum_job *j = ctx;
    const int i0 = (int)((long)j->n * task / n_tasks), i1 = (int)((long)j->n * (task + 1) / n_tasks);
    for (int c = 0; c < j->chunks; c++)
        for (int i = i0; i < i1; i++) j->dw[i] += j->part[(size_t)c * j->n + i];
}

void nv_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
                         int rows, int n, float *part) {
    norm_job j = {.dx = dx, .part = part, .x = x, .w = w, .dout = dout, .rstd_in = rstd, .rows = rows, .n = n};
    const int chunks = (rows + NORM_ROWS - 1) / NORM_ROWS;
    nv_pool_run(norm_backward_task, &j, chunks);
    norm_sum_job sj = {dw, part, chunks, n};
    nv_pool_run(norm_sum_task, &sj, pool_tasks((size_t)n / 256 + 1));
}

typedef struct {
    float *v;
    int rows, T, n_heads, hd;
    const float *cosv, *sinv;
    float sign;
} rope_job;

/* Rotates each head's pairs of rows r0..r1-1 by +angle (sign 1) or -angle (sign -1, the backward). */
static void rope_range(const rope_job *j, int r0, int r1) {
    float *v = j->v;
    const int T = j->T, n_heads = j->n_heads, hd = j->hd, half = hd / 2;
    const float *cosv = j->cosv, *sinv = j->sinv, sign = j->sign;
    for (int r = r0; r < r1; r++) {
        int t = r % T;
        const float *cr = cosv + (size_t)t * half, *sr = sinv + (size_t)t * half;
        for (int h = 0; h < n_heads; h++) {
            float *p = v + (size_t)r * n_heads * hd + (size_t)h * hd;
            for (int i = 0; i < half; i++) {
                float fc = cr[i], fs = sign * sr[i];
                float v0 = p[2 * i], v1 = p[2 * i + 1];
                p[2 * i] = v0 * fc - v1 * fs;
                p[2 * i + 1] = v0 * fs + v1 * fc;
            }
        }
    }
}

static void rope_task(void *ctx, int task, int n_tasks) {
    const rope_job *j = ctx;
    rope_range(j, (int)((long)j->rows * task / n_tasks), (int)((long)j->rows * (task + 1) / n_tasks));
}

static void rope_rows(float *v, int rows, int T, int n_heads, int hd, const float *cosv, const float *sinv, float sign) {
    rope_job j = {v, rows, T, n_heads, hd, cosv, sinv, sign};
    nv_pool_run(rope_task, &j, pool_tasks((size_t)rows));
}

/* Per-head RMSNorm (QK-norm): rows*n_heads vectors of hd. */
static void headnorm_forward(float *out, float *rstd, const float *x, const float *w, int rows, int n_heads, int hd,
                             float eps) {
    nv_rmsnorm_forward(out, rstd, x, w, rows * n_heads, hd, eps);
}

/* Dropout on a residual branch (nv_tmodel_set_dropout): element (row, col) of a [rows][d] array is
 * kept when a hash of the site's key (the micro-batch's and the branch's), the row's number in the
 * whole batch and the column is at or above thresh, and then scaled by inv = 1 / (1 - p). */
typedef struct {
    uint32_t key, thresh, row0;
    int d;
    float inv;
} drop_site;

static inline uint32_t mix32(uint32_t h) { /* murmur3's finalizer */
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    return h ^ (h >> 16);
}
static inline uint32_t drop_row_hash(const drop_site *ds, size_t row) { return mix32(ds->key ^ mix32((uint32_t)(ds->row0 + row) * 0x9e3779b1u)); }
static inline float drop_mult(const drop_site *ds, uint32_t row_hash, int col) {
    return mix32(row_hash + (uint32_t)col * 0x27d4eb2fu) >= ds->thresh ? ds->inv : 0.0f;
}
/* drop_mult of columns col..col+7 of the row whose hash is rh, on 8 lanes (the same integer steps). */
static inline __m256 drop_mults_row(const drop_site *ds, uint32_t rh, int col) {
    const __m256i c = _mm256_add_epi32(_mm256_set1_epi32(col), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i h = _mm256_add_epi32(_mm256_set1_epi32((int)rh), _mm256_mullo_epi32(c, _mm256_set1_epi32((int)0x27d4eb2fu)));
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
    h = _mm256_mullo_epi32(h, _mm256_set1_epi32((int)0x85ebca6bu));
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
    h = _mm256_mullo_epi32(h, _mm256_set1_epi32((int)0xc2b2ae35u));
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
    const __m256i keep = _mm256_cmpeq_epi32(_mm256_max_epu32(h, _mm256_set1_epi32((int)ds->thresh)), h); /* h >= thresh */
    return _mm256_and_ps(_mm256_castsi256_ps(keep), _mm256_set1_ps(ds->inv));
}

/* Where a pass over the site's array stands: its row (and that row's hash) and column. */
typedef struct {
    size_t row;
    int col;
    uint32_t rh;
} drop_cursor;

static drop_cursor drop_cursor_at(const drop_site *ds, size_t i) {
    const size_t row = i / (size_t)ds->d;
    return (drop_cursor){row, (int)(i - row * (size_t)ds->d), drop_row_hash(ds, row)};
}

/* The multipliers (0 or inv) of the next n <= 8 elements, the cursor moved past them. */
static inline __m256 drop_next8(const drop_site *ds, drop_cursor *at, int n) {
    if (at->col + n <= ds->d) {
        const __m256 m = drop_mults_row(ds, at->rh, at->col);
        if ((at->col += n) == ds->d) at->col = 0, at->rh = drop_row_hash(ds, ++at->row);
        return m;
    }
    float m[8] = {0}; /* the row ends among them */
    for (int k = 0; k < n; k++) {
        m[k] = drop_mult(ds, at->rh, at->col);
        if (++at->col == ds->d) at->col = 0, at->rh = drop_row_hash(ds, ++at->row);
    }
    return _mm256_loadu_ps(m);
}

/* Element-wise passes (SwiGLU and its backward, residual adds), 8 lanes at a time, a range's last
 * lanes through masked loads: every element is the same operations wherever a range starts or ends,
 * so the pool's fixed ranges and a product's epilogue blocks give the same bits. */
typedef enum { EW_SWIGLU, EW_SWIGLU_BACK, EW_GEGLU, EW_GEGLU_BACK, EW_SCALE_ADD, EW_SCALE } ew_kind;

/* GELU's tanh form as inference writes it: gelu(x) = x s, s = 1 / (1 + e^(k x (1 + a x^2))) (the
 * sigmoid of 2 sqrt(2/pi) (x + a x^3)); *dz, when asked, is ds/dx: s (1 - s) times that argument's slope. */
static inline __m256 gelu_sigmoid(__m256 x, __m256 *dz) {
    const __m256 one = _mm256_set1_ps(1.0f), k = _mm256_set1_ps(-2.0f * 0.7978845608f), a = _mm256_set1_ps(0.044715f);
    const __m256 xx = _mm256_mul_ps(x, x);
    const __m256 sg = _mm256_div_ps(one, _mm256_add_ps(one, nv_exp256(_mm256_mul_ps(_mm256_mul_ps(k, x), _mm256_fmadd_ps(a, xx, one)))));
    if (dz) /* d(-k x (1 + a x^2))/dx = -k (1 + 3 a x^2) */
        *dz = _mm256_mul_ps(_mm256_mul_ps(sg, _mm256_sub_ps(one, sg)),
                            _mm256_mul_ps(_mm256_sub_ps(_mm256_setzero_ps(), k), _mm256_fmadd_ps(_mm256_set1_ps(3.0f * 0.044715f), xx, one)));
    return sg;
}
typedef struct {
    ew_kind kind;
    size_t n;
    float *out, *out2;
    const float *a, *b, *c;
    float s; /* EW_SCALE_ADD, EW_SCALE */
    const drop_site *drop; /* EW_SCALE_ADD, EW_SCALE: a times the site's dropout multipliers first, or NULL */
} ew_job;

static void ew_range(const ew_job *j, size_t i0, size_t i1) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    drop_cursor at = j->drop && i0 < i1 ? drop_cursor_at(j->drop, i0) : (drop_cursor){0, 0, 0};
    for (size_t i = i0; i < i1; i += 8) {
        const int n = i1 - i < 8 ? (int)(i1 - i) : 8;
        __m256 a = nv_load8_n(j->a + i, n);
        const __m256 b = nv_load8_n(j->b + i, n);
        if (j->drop) a = _mm256_mul_ps(a, drop_next8(j->drop, &at, n));
        switch (j->kind) {
        case EW_SWIGLU: /* out = silu(a) * b */
            nv_store8_n(j->out + i, _mm256_mul_ps(_mm256_div_ps(a, _mm256_add_ps(one, nv_exp256(_mm256_sub_ps(zero, a)))), b), n);
            break;
        case EW_SWIGLU_BACK: { /* a = h1, b = h3, c = d(out): out = dh1, out2 = dh3 */
            const __m256 g = nv_load8_n(j->c + i, n);
            const __m256 sg = _mm256_div_ps(one, _mm256_add_ps(one, nv_exp256(_mm256_sub_ps(zero, a))));
            nv_store8_n(j->out2 + i, _mm256_mul_ps(g, _mm256_mul_ps(a, sg)), n);
            const __m256 dsilu = _mm256_mul_ps(sg, _mm256_add_ps(one, _mm256_mul_ps(a, _mm256_sub_ps(one, sg))));
            nv_store8_n(j->out + i, _mm256_mul_ps(_mm256_mul_ps(g, b), dsilu), n);
            break;
        }
        case EW_GEGLU: /* out = gelu(a) * b */
            nv_store8_n(j->out + i, _mm256_mul_ps(_mm256_mul_ps(a, gelu_sigmoid(a, NULL)), b), n);
            break;
        case EW_GEGLU_BACK: { /* as EW_SWIGLU_BACK's: d gelu/dx = s + x ds/dx */
            const __m256 g = nv_load8_n(j->c + i, n);
            __m256 dsg;
            const __m256 sg = gelu_sigmoid(a, &dsg);
            nv_store8_n(j->out2 + i, _mm256_mul_ps(g, _mm256_mul_ps(a, sg)), n);
            nv_store8_n(j->out + i, _mm256_mul_ps(_mm256_mul_ps(g, b), _mm256_fmadd_ps(a, dsg, sg)), n);
            break;
        }
        case EW_SCALE_ADD: /* out = s a + b, as inference's residual adds it (no fused multiply-add; s 1: a + b exactly) */
            nv_store8_n(j->out + i, _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(j->s), a), b), n);
            break;
        case EW_SCALE: /* out = s a */
            nv_store8_n(j->out + i, _mm256_mul_ps(_mm256_set1_ps(j->s), a), n);
            break;
        }
    }
}

/* The pass as a product's epilogue: its pointers at row 0, rows of stride elements. */
typedef struct {
    ew_job j;
    size_t stride;
} ew_rows;

static void ew_epilogue(void *ctx, int r0, int r1, int c0, int c1) {
    const ew_rows *e = ctx;
    for (int r = r0; r < r1; r++) ew_range(&e->j, (size_t)r * e->stride + c0, (size_t)r * e->stride + c1);
}

static void ew_task(void *ctx, int task, int n_tasks) {
    const ew_job *j = ctx;
    size_t blocks = (j->n + 7) / 8; /* ranges start on 8-element boundaries */
    size_t i0 = blocks * (size_t)task / (size_t)n_tasks * 8, i1 = blocks * (size_t)(task + 1) / (size_t)n_tasks * 8;
    ew_range(j, i0, i1 < j->n ? i1 : j->n);
}

static void ew_run(ew_job j) {
    nv_pool_run(ew_task, &j, pool_tasks(j.n / 16384 + 1));
}

#define CE_TASKS 64
typedef struct {
    float *logits, *pscale, *nll, *lmax;
    const int *targets;
    int V, rows, T;
    float cap;               /* a soft cap on the logits (Gemma 2, 3), or 0 */
    float div;               /* the product's logits divided by it first (nv_config_logit_div: Granite's, else 1) */
    float dscale;            /* dlogits_task */
    const float *seq_scale;  /* dlogits_task: [rows / T] per sequence instead of dscale, or NULL */
    const float *teacher;    /* distillation: the teacher's logits [rows][V] (the rows' gradients made by the forward) */
    float alpha, temp;
    double kl[CE_TASKS];
    double partial[CE_TASKS];
    int counted[CE_TASKS];
    int correct[CE_TASKS]; /* rows whose target's logit is the row's largest */
} ce_job;

/* A soft-capped row (z the product's logits): logits cap * tanh(z / cap), whose tanh stays in lg for
 * the backward (the exps are made again from it there, the same operations: the same bits), the row's
 * max in lmax, 1/sum in pscale; returns -log p(target), and in *top whether the target's logit is the
 * largest. */
static float capped_nll(ce_job *j, int r, float *lg, int *top) {
    const int V = j->V;
    const __m256 vin = _mm256_set1_ps(1.0f / j->cap), vcap = _mm256_set1_ps(j->cap);
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    for (int i = 0; i < V; i += 8) {
        const int n = V - i < 8 ? V - i : 8;
        const __m256 t = nv_tanh256(_mm256_mul_ps(nv_load8_n(lg + i, n), vin));
        nv_store8_n(lg + i, t, n);
        const __m256 x = _mm256_mul_ps(vcap, t);
        vmax = _mm256_max_ps(vmax, n == 8 ? x : _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), x, _mm256_castsi256_ps(nv_lane_mask8(n))));
    }
    const float maxv = nv_hmax256(vmax);
    const __m256 vm = _mm256_set1_ps(maxv);
    __m256 vsum = _mm256_setzero_ps();
    for (int i = 0; i < V; i += 8) {
        const int n = V - i < 8 ? V - i : 8;
        const __m256 e = nv_exp256(_mm256_fmsub_ps(vcap, nv_load8_n(lg + i, n), vm));
        vsum = _mm256_add_ps(vsum, n == 8 ? e : _mm256_and_ps(e, _mm256_castsi256_ps(nv_lane_mask8(n))));
    }
    const float inv = 1.0f / nv_hsum256(vsum);
    j->lmax[r] = maxv;
    j->pscale[r] = inv;
    *top = j->cap * lg[j->targets[r]] >= maxv;
    /* the target's exp as the backward makes it */
    float e_t[8];
    _mm256_storeu_ps(e_t, nv_exp256(_mm256_fmsub_ps(vcap, _mm256_set1_ps(lg[j->targets[r]]), vm)));
    return (float)-log((double)(e_t[0] * inv) + 1e-30);
}

/* A distilled row (lg the product's logits z, the teacher's t): its objective's gradient, (1 - alpha) *
 * (p - onehot(target)) + alpha * temp * (q - r) with p = softmax(z), q and r the softmaxes of z / temp
 * and t / temp, in place of z, for the backward to scale; returns -log p(target), KL(r || q) in *kl,
 * whether z's largest is the target's in *top. */
static float distill_row(const ce_job *j, int r, float *lg, double *kl, int *top) {
    const int V = j->V, target = j->targets[r];
    const float *t = j->teacher + (size_t)r * V;
    const float it = 1.0f / j->temp, a = j->alpha;
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 vzm = ninf, vtm = ninf;
    for (int i = 0; i < V; i += 8) {
        const int n = V - i < 8 ? V - i : 8;
        const __m256 m = _mm256_castsi256_ps(nv_lane_mask8(n));
        vzm = _mm256_max_ps(vzm, _mm256_blendv_ps(ninf, nv_load8_n(lg + i, n), m));
        vtm = _mm256_max_ps(vtm, _mm256_blendv_ps(ninf, nv_load8_n(t + i, n), m));
    }
    const __m256 zm = _mm256_set1_ps(nv_hmax256(vzm)), tm_ = _mm256_set1_ps(nv_hmax256(vtm)), vit = _mm256_set1_ps(it);
    __m256 sp = _mm256_setzero_ps(), sq = sp, sr = sp;
    for (int i = 0; i < V; i += 8) {
        const int n = V - i < 8 ? V - i : 8;
        const __m256 m = _mm256_castsi256_ps(nv_lane_mask8(n));
        const __m256 dz = _mm256_sub_ps(nv_load8_n(lg + i, n), zm), dt = _mm256_sub_ps(nv_load8_n(t + i, n), tm_);
        sp = _mm256_add_ps(sp, _mm256_and_ps(nv_exp256(dz), m));
        sq = _mm256_add_ps(sq, _mm256_and_ps(nv_exp256(_mm256_mul_ps(dz, vit)), m));
        sr = _mm256_add_ps(sr, _mm256_and_ps(nv_exp256(_mm256_mul_ps(dt, vit)), m));
    }
    const float sum_p = nv_hsum256(sp), sum_q = nv_hsum256(sq), sum_r = nv_hsum256(sr);
    const float nll = -(lg[target] - _mm256_cvtss_f32(zm) - logf(sum_p));
    *top = lg[target] >= _mm256_cvtss_f32(zm);
    const __m256 ip = _mm256_set1_ps((1.0f - a) / sum_p), iq = _mm256_set1_ps(a * j->temp / sum_q), ir = _mm256_set1_ps(1.0f / sum_r),
                 air = _mm256_set1_ps(a * j->temp / sum_r), lz = _mm256_set1_ps(logf(sum_q) - logf(sum_r));
    __m256 vkl = _mm256_setzero_ps();
    for (int i = 0; i < V; i += 8) {
        const int n = V - i < 8 ? V - i : 8;
        const __m256 m = _mm256_castsi256_ps(nv_lane_mask8(n));
        const __m256 dz = _mm256_sub_ps(nv_load8_n(lg + i, n), zm), dt = _mm256_sub_ps(nv_load8_n(t + i, n), tm_);
        const __m256 er = nv_exp256(_mm256_mul_ps(dt, vit));
        /* g = (1 - a) p + a temp q - a temp r */
        const __m256 g = _mm256_fnmadd_ps(er, air, _mm256_fmadd_ps(nv_exp256(_mm256_mul_ps(dz, vit)), iq, _mm256_mul_ps(nv_exp256(dz), ip)));
        nv_store8_n(lg + i, g, n);
        /* r (log r - log q) = r ((dt - dz) / temp + log sum_q - log sum_r) */
        vkl = _mm256_add_ps(vkl, _mm256_and_ps(_mm256_mul_ps(_mm256_mul_ps(er, ir), _mm256_fmadd_ps(_mm256_sub_ps(dt, dz), vit, lz)), m));
    }
    lg[target] -= 1.0f - a;
    *kl = nv_hsum256(vkl);
    return nll;
}

/* The softmax's exps in place (their scale to probabilities in pscale, applied by the backward's one
 * pass over the logits) and the summed -log p(target) of a contiguous block of rows. A row whose
 * target is negative has none: it is skipped and not counted. */
static void cross_entropy_task(void *ctx, int task, int n_tasks) {
    ce_job *j = ctx;
    int r0 = (int)((long)j->rows * task / n_tasks), r1 = (int)((long)j->rows * (task + 1) / n_tasks);
    double total = 0.0, kl_total = 0.0;
    int counted = 0, correct = 0;
    for (int r = r0; r < r1; r++) {
        j->nll[r] = 0.0f;
        if (j->targets[r] < 0) continue;
        counted++;
        float *lg = j->logits + (size_t)r * j->V;
        if (j->div != 1.0f) /* as inference: nv_logits_finish */
            for (int i = 0; i < j->V; i++) lg[i] /= j->div;
        int top;
        if (j->teacher) {
            double kl;
            total += j->nll[r] = distill_row(j, r, lg, &kl, &top);
            kl_total += kl;
            correct += top;
            continue;
        }
        if (j->cap != 0.0f) {
            total += j->nll[r] = capped_nll(j, r, lg, &top);
            correct += top;
            continue;
        }
        const int V = j->V, V8 = V & ~7;
        __m256 vmax = _mm256_set1_ps(-INFINITY);
        for (int i = 0; i < V8; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(lg + i));
        float maxv = nv_hmax256(vmax);
        for (int i = V8; i < V; i++)
            if (lg[i] > maxv) maxv = lg[i];
        correct += lg[j->targets[r]] >= maxv;
        const __m256 vm = _mm256_set1_ps(maxv);
        __m256 vsum = _mm256_setzero_ps();
        for (int i = 0; i < V8; i += 8) {
            __m256 e = nv_exp256(_mm256_sub_ps(_mm256_loadu_ps(lg + i), vm));
            _mm256_storeu_ps(lg + i, e);
            vsum = _mm256_add_ps(vsum, e);
        }
        float sum = nv_hsum256(vsum);
        for (int i = V8; i < V; i++) {
            lg[i] = expf(lg[i] - maxv);
            sum += lg[i];
        }
        const float inv = 1.0f / sum;
        j->pscale[r] = inv;
        const double nll = -log((double)(lg[j->targets[r]] * inv) + 1e-30);
        j->nll[r] = (float)nll;
        total += nll;
    }
    j->partial[task] = total;
    j->kl[task] = kl_total;
    j->counted[task] = counted;
    j->correct[task] = correct;
}

/* A soft-capped row's dlogits from its tanh values t: (p - onehot(target)) * dscale * (1 - t^2), p's
 * exps made as capped_nll made them. */
static void capped_dlogits(const ce_job *j, int r, float *lg, float dscale) {
    const int V = j->V, target = j->targets[r];
    const __m256 vcap = _mm256_set1_ps(j->cap), vm = _mm256_set1_ps(j->lmax[r]), one = _mm256_set1_ps(1.0f);
    const __m256 vps = _mm256_set1_ps(j->pscale[r] * dscale);
    const float t_target = lg[target];
    for (int i = 0; i < V; i += 8) {
        const int n = V - i < 8 ? V - i : 8;
        const __m256 t = nv_load8_n(lg + i, n);
        const __m256 p = _mm256_mul_ps(nv_exp256(_mm256_fmsub_ps(vcap, t, vm)), vps);
        nv_store8_n(lg + i, _mm256_mul_ps(p, _mm256_fnmadd_ps(t, t, one)), n);
    }
    lg[target] -= dscale * (1.0f - t_target * t_target);
}

/* dlogits = (p - onehot(target)) * dscale, p = exp * pscale, in place over a block of rows. */
static void dlogits_task(void *ctx, int task, int n_tasks) {
    ce_job *j = ctx;
    int r0 = (int)((long)j->rows * task / n_tasks), r1 = (int)((long)j->rows * (task + 1) / n_tasks);
    for (int r = r0; r < r1; r++) {
        float *lg = j->logits + (size_t)r * j->V;
        /* the divisor's share: d(product's logit) = d(logit) / div */
        const float dscale = (j->seq_scale ? j->seq_scale[r / j->T] : j->dscale) / j->div;
        const __m256 vd = _mm256_set1_ps(dscale);
        if (j->targets[r] < 0) { /* no target: no gradient */
            memset(lg, 0, (size_t)j->V * sizeof(float));
            continue;
        }
        if (j->teacher) { /* the forward made the row's gradient: scaled only */
            for (int i = 0; i < j->V; i++) lg[i] *= dscale;
            continue;
        }
        if (j->cap != 0.0f) {
            capped_dlogits(j, r, lg, dscale);
            continue;
        }
        const float inv = j->pscale[r], e_target = lg[j->targets[r]];
        const __m256 vs = _mm256_set1_ps(inv);
        int i = 0;
        for (; i + 8 <= j->V; i += 8) _mm256_storeu_ps(lg + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(lg + i), vs), vd));
        for (; i < j->V; i++) lg[i] = lg[i] * inv * dscale;
        lg[j->targets[r]] = (e_target * inv - 1.0f) * dscale;
    }
}

/* y[r] += b for each of rows rows of n (the projections' biases) */
static void add_bias_rows(float *y, const float *b, int rows, int n) {
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < n; i++) y[(size_t)r * n + i] += b[i];
}

/* g += the column sums of d (rows x n): a bias's gradient */
static void add_col_sums(float *g, const float *d, int rows, int n) {
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < n; i++) g[i] += d[(size_t)r * n + i];
}

/* ---- a mixture of experts' FFN ------------------------------------------------------------ */

/* Layer slot j's routing and grouped rows. */
typedef struct {
    float *p, *w, *y, *h1, *h3, *hg, *lse;
    int *sel, *order, *at, *off;
} moe_slot;

static moe_slot moe_slot_of(const nv_tmodel *tm, int j) {
    const nv_config *c = &tm->m.config;
    const size_t BT = (size_t)tm->B * tm->T, E = (size_t)c->n_experts, K = (size_t)c->n_experts_used;
    const size_t rows = BT * K, h = (size_t)c->hidden_dim;
    const nv_acts *a = &tm->a;
    return (moe_slot){a->moe_p + j * BT * E, a->moe_w + j * rows, a->moe_y + j * rows * c->dim, a->h1 + j * rows * h,
                      a->h3 + j * rows * h, a->hg + j * rows * h, a->moe_lse + j * BT, a->moe_sel + j * rows,
                      a->moe_order + j * rows, a->moe_at + j * rows, a->moe_off + j * (E + 1)};
}

/* xg's grouped rows: each the input row xn of its token */
static void moe_gather_inputs(const moe_slot *v, int rows, int K, int d, const float *xn, float *xg) {
    for (int at = 0; at < rows; at++) memcpy(xg + (size_t)at * d, xn + (size_t)(v->order[at] / K) * d, (size_t)d * sizeof(float));
}

/* Row r's choices in expert order (so a row sums its experts' outputs in the order inference does). */
static void choices_by_expert(const int *sel, int K, int *idx) {
    for (int k = 0; k < K; k++) idx[k] = k;
    for (int k = 1; k < K; k++)
        for (int i = k; i > 0 && sel[idx[i]] < sel[idx[i - 1]]; i--) {
            const int t = idx[i];
            idx[i] = idx[i - 1];
            idx[i - 1] = t;
        }
}

typedef struct {
    const nv_tmodel *tm;
    moe_slot v;
    const float *x2, *dx; /* combine: the residual; backward: the layer output's gradient */
    const drop_site *drop; /* combine: the FFN branch's dropout, or NULL */
    float *out;           /* combine: the layer's output; backward: the gradient of the FFN's input */
    const float *dxg;     /* backward's gather: each grouped row's input gradient */
    float *dyg, *dz;
    const float *aux_g;   /* [E]: the load-balancing loss's gradient with respect to each probability */
    float z_scale;        /* the z-loss's gradient with respect to a row's lse, over its lse (0: none) */
} moe_job;

static int task_rows(int rows, int task, int n_tasks) { return (int)((long)rows * task / n_tasks); }

/* out[r] = x2[r] + sum of row r's chosen experts' outputs, each weighted (the sum times Granite's multiplier). */
static void moe_combine_task(void *ctx, int task, int n_tasks) {
    const moe_job *j = ctx;
    const nv_config *c = &j->tm->m.config;
    const int BT = j->tm->B * j->tm->T, K = c->n_experts_used, d = c->dim;
    int idx[NV_MOE_MAX_USED];
    for (int r = task_rows(BT, task, n_tasks); r < task_rows(BT, task + 1, n_tasks); r++) {
        float *o = j->out + (size_t)r * d;
        const float *x2 = j->x2 + (size_t)r * d;
        for (int i = 0; i < d; i++) o[i] = 0.0f;
        choices_by_expert(j->v.sel + (size_t)r * K, K, idx);
        for (int k = 0; k < K; k++) {
            const int rk = r * K + idx[k];
            const float wt = j->v.w[rk], *y = j->v.y + (size_t)j->v.at[rk] * d;
            for (int i = 0; i < d; i++) o[i] += wt * y[i];
        }
        const float rs = nv_config_residual_scale(c);
        if (j->drop) {
            const uint32_t rh = drop_row_hash(j->drop, (size_t)r);
            for (int i = 0; i < d; i++) o[i] *= drop_mult(j->drop, rh, i);
        }
        for (int i = 0; i < d; i++) o[i] = rs * o[i] + x2[i];
    }
}

/* The FFN of layer l (its activations in slot j) on the normalised rows xn2: the router's softmax and
 * each row's K experts (nv_moe_route, as inference), the rows grouped by expert (nv_moe_group, as
 * inference), each expert's SwiGLU once on its rows, and with out, out = x2 + each row's weighted sum. The
 * experts' outputs are kept (the weights' gradients need them), so a recomputing backward runs all of it. */
static void moe_forward(nv_tmodel *tm, int l, int j, const scratch_ptrs *s, const float *xn2, const float *x2, float *out,
                        const drop_site *drop) {
    const nv_config *c = &tm->m.config;
    const nv_layer_plans *lp = &tm->m.plans[l];
    const int BT = tm->B * tm->T, d = c->dim, hid = c->hidden_dim, E = c->n_experts, K = c->n_experts_used;
    const moe_slot v = moe_slot_of(tm, j);
    nv_plan_run(lp->router, xn2, BT, v.p);
    double z = 0.0;
    for (int r = 0; r < BT; r++) {
        const float *zr = v.p + (size_t)r * E;
        float most = zr[0];
        double sum = 0.0;
        for (int e = 1; e < E; e++) most = zr[e] > most ? zr[e] : most;
        for (int e = 0; e < E; e++) sum += exp((double)zr[e] - most);
        v.lse[r] = (float)(most + log(sum)); /* for the z-loss, before the logits become probabilities */
        z += (double)v.lse[r] * v.lse[r];
        nv_moe_route(v.p + (size_t)r * E, E, K, v.sel + (size_t)r * K, v.w + (size_t)r * K);
    }
    nv_moe_group(v.sel, BT, K, E, v.off, v.order, v.at);
    moe_gather_inputs(&v, BT * K, K, d, xn2, s->xg);
    for (int e = 0; e < E; e++) {
        const int r0 = v.off[e], cnt = v.off[e + 1] - r0;
        if (!cnt) continue;
        nv_plan *const *ep = &lp->experts[3 * e];
        float *h1 = v.h1 + (size_t)r0 * hid, *h3 = v.h3 + (size_t)r0 * hid, *hg = v.hg + (size_t)r0 * hid;
        ew_rows glu = {{.kind = EW_SWIGLU, .out = hg, .a = h1, .b = h3}, (size_t)hid};
        nv_plan_run_group((const nv_plan *const[]){ep[0], ep[2]}, 2, s->xg + (size_t)r0 * d, cnt, (float *const[]){h1, h3},
                          ew_epilogue, &glu);
        nv_plan_run(ep[1], hg, cnt, v.y + (size_t)r0 * d);
    }
    if (!out) return;
    moe_job mj = {.tm = tm, .v = v, .x2 = x2, .out = out, .drop = drop};
    nv_pool_run(moe_combine_task, &mj, pool_tasks((size_t)BT));
    /* the load-balancing loss: (E / K) sum_e f_e P_e, f_e = count_e / BT, P_e = mean p_e */
    double aux = 0.0;
    for (int e = 0; e < E; e++) {
        double pe = 0.0;
        for (int r = 0; r < BT; r++) pe += v.p[(size_t)r * E + e];
        aux += (double)(v.off[e + 1] - v.off[e]) / BT * (pe / BT);
    }
    tm->router_aux += (float)(aux * E / K / c->n_layers);
    tm->router_z += (float)(z / BT / c->n_layers);
}

/* Each row's share of the backward before the experts: its grouped rows' output gradients (weight *
 * dx) and the router logits' gradient dz: through the renormalised weights (the softmax of the chosen
 * logits: dz_k = w_k (dw_k - sum_i w_i dw_i), dw_k = dx . y_k) and, with aux_g, through the full
 * softmax from the load-balancing loss. */
static void moe_route_back_task(void *ctx, int task, int n_tasks) {
    const moe_job *j = ctx;
    const nv_config *c = &j->tm->m.config;
    const int BT = j->tm->B * j->tm->T, K = c->n_experts_used, E = c->n_experts, d = c->dim;
    float dw[NV_MOE_MAX_USED];
    for (int r = task_rows(BT, task, n_tasks); r < task_rows(BT, task + 1, n_tasks); r++) {
        const float *dx = j->dx + (size_t)r * d, *w = j->v.w + (size_t)r * K, *p = j->v.p + (size_t)r * E;
        const int *sel = j->v.sel + (size_t)r * K;
        float *dz = j->dz + (size_t)r * E, wdw = 0.0f;
        for (int k = 0; k < K; k++) {
            const int at = j->v.at[r * K + k];
            const float *y = j->v.y + (size_t)at * d;
            float *dy = j->dyg + (size_t)at * d, dot = 0.0f;
            for (int i = 0; i < d; i++) {
                dy[i] = w[k] * dx[i];
                dot += dx[i] * y[i];
            }
            dw[k] = dot;
            wdw += w[k] * dot;
        }
        float pg = 0.0f;
        for (int e = 0; e < E; e++) pg += j->aux_g ? p[e] * j->aux_g[e] : 0.0f;
        const float zg = j->z_scale * j->v.lse[r]; /* d z-loss / d logit e = zg * p[e] */
        for (int e = 0; e < E; e++) dz[e] = (j->aux_g ? p[e] * (j->aux_g[e] - pg) : 0.0f) + zg * p[e];
        for (int k = 0; k < K; k++) dz[sel[k]] += w[k] * (dw[k] - wdw);
    }
}

/* out[r] = the sum of row r's grouped rows' input gradients (in choice order). */
static void moe_gather_task(void *ctx, int task, int n_tasks) {
    const moe_job *j = ctx;
    const nv_config *c = &j->tm->m.config;
    const int BT = j->tm->B * j->tm->T, K = c->n_experts_used, d = c->dim;
    for (int r = task_rows(BT, task, n_tasks); r < task_rows(BT, task + 1, n_tasks); r++) {
        float *o = j->out + (size_t)r * d;
        memcpy(o, j->dxg + (size_t)j->v.at[r * K] * d, (size_t)d * sizeof(float));
        for (int k = 1; k < K; k++) {
            const float *g = j->dxg + (size_t)j->v.at[r * K + k] * d;
            for (int i = 0; i < d; i++) o[i] += g[i];
        }
    }
}

/* The backward of moe_forward (layer l, slot j) from dx, the gradient of its output: dxn gets the
 * gradient of its input xn2, and the experts' and the router's weight gradients are added (acc) or
 * written (none when frozen: adapters on the attention train instead). aux_scale: the
 * load-balancing loss's weight times the step's gradient scale (0: none); z_scale the z-loss's. */
static void moe_backward(nv_tmodel *tm, int l, int j, const scratch_ptrs *s, const float *xn2, const float *dx, float *dxn,
                         float aux_scale, float z_scale, nv_engine_id eng, int acc, int frozen) {
    const nv_config *c = &tm->m.config;
    const nv_layer_plans *lp = &tm->m.plans[l];
    const int BT = tm->B * tm->T, d = c->dim, hid = c->hidden_dim, E = c->n_experts, K = c->n_experts_used;
    const moe_slot v = moe_slot_of(tm, j);
    const size_t hd = (size_t)hid * d;
    moe_gather_inputs(&v, BT * K, K, d, xn2, s->xg); /* again: the scratch is shared */
    /* d aux / d p[r][e] = (E / K) count_e / BT^2, over the mean of the layers */
    float aux_g[NV_MOE_MAX_EXPERTS];
    for (int e = 0; e < E; e++)
        aux_g[e] = aux_scale * (float)((double)E / K * (v.off[e + 1] - v.off[e]) / ((double)BT * BT) / c->n_layers);
    /* d z-loss / d lse[r] = 2 lse[r] / BT, over the mean of the layers */
    moe_job mj = {.tm = tm, .v = v, .dx = dx, .out = dxn, .dxg = s->dxg, .dyg = s->dyg, .dz = s->dz,
                  .aux_g = aux_scale != 0.0f ? aux_g : NULL, .z_scale = (float)(2.0 * z_scale / BT / c->n_layers)};
    nv_pool_run(moe_route_back_task, &mj, pool_tasks((size_t)BT));
    nv_weights *g = &tm->g;
    for (int e = 0; e < E; e++) { /* down: the SwiGLU product's gradient and w2's */
        const int r0 = v.off[e], cnt = v.off[e + 1] - r0;
        float *gw2 = frozen ? NULL : g->w2 + ((size_t)l * E + e) * hd;
        if (!cnt) { /* no row chose it: no gradient (written as zeros when nothing is held) */
            if (!acc && !frozen) {
                memset(gw2, 0, hd * sizeof(float));
                memset(g->w1 + ((size_t)l * E + e) * hd, 0, hd * sizeof(float));
                memset(g->w3 + ((size_t)l * E + e) * hd, 0, hd * sizeof(float));
            }
            continue;
        }
        nv_plan_run_dx(lp->experts[3 * e + 1], s->dyg + (size_t)r0 * d, cnt, s->dhg + (size_t)r0 * hid);
        if (!frozen) nv_gemm_dw(eng, s->dyg + (size_t)r0 * d, v.hg + (size_t)r0 * hid, cnt, d, hid, gw2, acc);
    }
    const size_t hn = (size_t)BT * K * hid;
    ew_run((ew_job){.kind = EW_SWIGLU_BACK, .n = hn, .out = s->dh1, .out2 = s->dh3, .a = v.h1, .b = v.h3, .c = s->dhg});
    for (int e = 0; e < E; e++) { /* gate and up */
        const int r0 = v.off[e], cnt = v.off[e + 1] - r0;
        if (!cnt) continue;
        float *dh1 = s->dh1 + (size_t)r0 * hid, *dh3 = s->dh3 + (size_t)r0 * hid, *dxg = s->dxg + (size_t)r0 * d;
        nv_plan_run_dx(lp->experts[3 * e], dh1, cnt, dxg);
        nv_plan_run_dx_add(lp->experts[3 * e + 2], dh3, cnt, dxg);
        if (!frozen)
            nv_gemm_dw_group(eng, (const float *const[]){dh1, dh3}, (const int[]){hid, hid}, 2, s->xg + (size_t)r0 * d, cnt,
                             d, (float *const[]){g->w1 + ((size_t)l * E + e) * hd, g->w3 + ((size_t)l * E + e) * hd}, acc);
    }
    nv_pool_run(moe_gather_task, &mj, pool_tasks((size_t)BT));
    /* the router: its input's gradient added, its weights' from dz */
    nv_plan_run_dx_add(lp->router, s->dz, BT, dxn);
    if (!frozen) nv_gemm_dw(nv_plan_engine(lp->router), s->dz, xn2, BT, E, d, g->router + (size_t)l * E * d, acc);
}

/* A branch y joining the residual x: out = x + rs drop(y) (rs, Granite's multiplier: 1 but there; drop
   the site's dropout, or NULL; out may be y). */
static ew_job residual_job(float *out, const float *y, const float *x, float rs, size_t n, const drop_site *drop) {
    return (ew_job){.kind = EW_SCALE_ADD, .n = n, .out = out, .a = y, .b = x, .s = rs, .drop = drop};
}

/* A post-norm: out = x + rs drop(rmsnorm(y) * w), y's statistics into rstd. */
static void post_norm_add(float *out, float *rstd, const float *y, const float *w, const float *x, int rows, int d, float eps, float rs,
                          const drop_site *drop) {
    nv_rmsnorm_forward(out, rstd, y, w, rows, d, eps);
    ew_run(residual_job(out, out, x, rs, (size_t)rows * d, drop));
}

/* A dropout site of the last forward (its backward's) with probability p over rows of d, its own
   hash site mixed into the micro-batch's key; NULL when p is 0. */
static const drop_site *site_of(const nv_tmodel *tm, float p, uint32_t site, int d, drop_site *ds) {
    if (p <= 0.0f) return NULL;
    const double t = (double)p * 4294967296.0;
    *ds = (drop_site){.key = mix32(tm->drop_key_fwd ^ site),
                      .thresh = t >= 4294967295.0 ? 0xffffffffu : (uint32_t)t,
                      .row0 = tm->drop_row0_fwd,
                      .d = d,
                      .inv = 1.0f / (1.0f - p)};
    return ds;
}

/* Layer l's attention (ffn 0) or FFN (1) branch's dropout, or NULL without. */
static const drop_site *drop_site_of(const nv_tmodel *tm, int l, int ffn, drop_site *ds) {
    return site_of(tm, tm->drop_p_fwd, mix32((uint32_t)(2 * l + ffn + 1) * 0x632be5abu), tm->m.config.dim, ds);
}

/* The dropout of layer l's matrix t's adapter, on its input of in a row, or NULL without. */
static const drop_site *lora_site_of(const nv_tmodel *tm, int l, int t, int in, drop_site *ds) {
    return site_of(tm, tm->lora_drop_p_fwd, mix32((uint32_t)(l * NV_LAYER_MATRICES + t + 1) * 0x2545f491u), in, ds);
}

/* The input of layer l's matrix t's adapter, in of them a row: x, or with the adapters' dropout x
   masked into tm->lora_xd (its mask the same in the forward and the backward). */
static const float *lora_dropped_input(const nv_tmodel *tm, int l, int t, const float *x, int in) {
    drop_site ds;
    const drop_site *drop = lora_site_of(tm, l, t, in, &ds);
    if (!drop) return x;
    ew_run((ew_job){.kind = EW_SCALE, .n = (size_t)tm->B * tm->T * in, .out = tm->lora_xd, .a = x, .b = x, .s = 1.0f, .drop = drop});
    return tm->lora_xd;
}

/* dx += du A through the adapter's dropout (du A masked as its input was), into the values dx holds. */
static void lora_dx_add(const nv_tmodel *tm, int l, int t, const nv_plan *pa, const float *du, int in, float *dx) {
    drop_site ds;
    const drop_site *drop = lora_site_of(tm, l, t, in, &ds);
    const int BT = tm->B * tm->T;
    if (!drop) {
        nv_plan_run_dx_add(pa, du, BT, dx);
        return;
    }
    nv_plan_run_dx(pa, du, BT, tm->lora_xd);
    ew_run(residual_job(dx, tm->lora_xd, dx, 1.0f, (size_t)BT * in, drop));
}

/* ---- whole model ----------------------------------------------------------------------- */

void nv_tmodel_set_segments(nv_tmodel *tm, const int *seg) { tm->seg = seg; }

void nv_tmodel_set_length(nv_tmodel *tm, int T) { tm->T = T >= 1 && T <= tm->T_cap ? T : tm->T_cap; }

nv_err nv_tmodel_set_dropout(nv_tmodel *tm, float p, float p_lora, uint64_t key, uint64_t row0) {
    if (!(p >= 0.0f && p < 1.0f)) return nv_fail(NV_EINVAL, "dropout %g: a probability in [0, 1)", (double)p);
    if (!(p_lora >= 0.0f && p_lora < 1.0f)) return nv_fail(NV_EINVAL, "LoRA dropout %g: a probability in [0, 1)", (double)p_lora);
    const nv_config *c = &tm->m.config;
    const size_t BT = (size_t)tm->B * tm->T_cap; /* (made once, for the longest windows) */
    size_t widest = (size_t)c->dim;
    if ((size_t)nv_config_q_dim(c) > widest) widest = (size_t)nv_config_q_dim(c);
    if ((size_t)c->hidden_dim > widest) widest = (size_t)c->hidden_dim;
    if (p > 0.0f && !tm->drop_buf && !(tm->drop_buf = nv_alloc_large(64, BT * c->dim * sizeof(float), 1)))
        return nv_fail(NV_ENOMEM, "out of memory for dropout's gradient buffer");
    if (p_lora > 0.0f && tm->lora_params && !tm->lora_xd && !(tm->lora_xd = nv_alloc_large(64, BT * widest * sizeof(float), 1)))
        return nv_fail(NV_ENOMEM, "out of memory for the adapters' dropout buffer");
    tm->drop_p = p;
    tm->lora_drop_p = tm->lora_params ? p_lora : 0.0f;
    tm->drop_key = (uint32_t)(key ^ key >> 32);
    tm->drop_row0 = (uint32_t)row0;
    return NV_OK;
}

#define LAYER(ptr, l, per) ((ptr) + (size_t)(l) * (per))
/* LAYER of a part a model may not have (OLMo 2's pre-norms): NULL then */
#define LAYER_OR_NULL(ptr, l, per) ((ptr) ? LAYER(ptr, l, per) : NULL)

/* The rows activation slot j's branch reads: its normed copy in xn (slots of rows x d) when a norm w
   comes before the branch, x itself when none does (w NULL: OLMo 2). */
static float *branch_input(float *xn, int j, float *x, const float *w, int rows, int d) {
    return w ? LAYER(xn, j, (size_t)rows * d) : x;
}

/* A branch's input (branch_input), x's rows normed by w first (statistics into rstd's slot j). */
static float *pre_norm_forward(float *xn, float *rstd, int j, float *x, const float *w, int rows, int d, float eps) {
    float *in = branch_input(xn, j, x, w, rows, d);
    if (w) nv_rmsnorm_forward(in, LAYER(rstd, j, rows), x, w, rows, d, eps);
    return in;
}

/* Back through pre_norm_forward: dx = dres + what dxn gives x through the norm (through none: dxn). */
static void pre_norm_back(float *dx, const float *dres, float *dw, const float *dxn, const float *x, const float *w, const float *rstd,
                          int rows, int d, float *normp) {
    if (!w) {
        ew_run(residual_job(dx, dxn, dres, 1.0f, (size_t)rows * d, NULL));
        return;
    }
    memcpy(dx, dres, (size_t)rows * d * sizeof(float));
    nv_rmsnorm_backward(dx, dw, dxn, x, w, rstd, rows, d, normp);
}

/* Rotates layer l's queries and keys (sign 1) or their gradients back (-1) with the layer's table:
   none for SmolLM3's unrotated layers, the windowed layers' own when they have one; and scales the
   queries (or their gradients, by the same factor) by Ministral 3's attention temperature of their
   positions in the window. */
static void rope_layer(const nv_tmodel *tm, int l, const scratch_ptrs *s, float *q, float *k, float sign) {
    const nv_config *c = &tm->m.config;
    const int qd = nv_config_q_dim(c);
    for (int r = 0; c->attn_temp_scale != 0.0f && r < tm->B * tm->T; r++) {
        const float temp = nv_config_attn_temp(c, r % tm->T);
        for (int i = 0; temp != 1.0f && i < qd; i++) q[(size_t)r * qd + i] *= temp;
    }
    const float *cosv = nv_rope_of_layer(c, s->rope_cos, c->rope_theta_swa != 0.0f ? s->swa_cos : NULL, l);
    if (!cosv) return;
    const float *sinv = cosv == s->swa_cos ? s->swa_sin : s->rope_sin;
    const int BT = tm->B * tm->T;
    rope_rows(q, BT, tm->T, c->n_heads, c->head_dim, cosv, sinv, sign);
    rope_rows(k, BT, tm->T, c->n_kv_heads, c->head_dim, cosv, sinv, sign);
}

/* Layer l's forward from its input x[l]: its activations into slot j of the kept ones (l, or 0 when
   they are recomputed in the backward), and with with_out its output x[l + 1]. The same operations
   every time, so a recomputed layer's activations are the forward's, bit for bit. */
static void layer_forward(nv_tmodel *tm, int l, const scratch_ptrs *s, int with_out) {
    const nv_config *c = &tm->m.config;
    const nv_weights *w = &tm->m.w;
    nv_acts *a = &tm->a;
    const int j = act_slot(tm, l);
    int B = tm->B, T = tm->T, BT = B * T, d = c->dim, hid = c->hidden_dim;
    int qd = nv_config_q_dim(c), kvd = nv_config_kv_dim(c), H = c->n_heads;
    size_t sd = (size_t)BT * d, sq = (size_t)BT * qd, skv = (size_t)BT * kvd, sh = (size_t)BT * hid;
    const nv_layer_plans *lp = &tm->m.plans[l];
    float *x = LAYER(a->x, l, sd), *q = LAYER(a->q, j, sq), *k = LAYER(a->k, j, skv);
    float *v = LAYER(a->v, j, skv), *ao = LAYER(a->ao, j, sq), *x2 = LAYER(a->x2, j, sd);
    float *h1 = LAYER(a->h1, j, sh), *h3 = LAYER(a->h3, j, sh), *hg = LAYER(a->hg, j, sh);
    float *att_stats = LAYER(a->att_stats, j, (size_t)B * H * T * 2), *xout = LAYER(a->x, l + 1, sd);

    float *xn1 = pre_norm_forward(a->xn1, a->rstd1, j, x, LAYER_OR_NULL(w->rms_att, l, d), BT, d, c->norm_eps);
    /* q, k and v in one job (xn1 made bf16 once on the tile engines); with QK-norm the raw
       projections, normed per head below */
    float *qo = c->qk_norm ? LAYER(a->qraw, j, sq) : q, *ko = c->qk_norm ? LAYER(a->kraw, j, skv) : k;
    nv_plan_run_group((const nv_plan *const[]){lp->wq, lp->wk, lp->wv}, 3, xn1, BT, (float *const[]){qo, ko, v}, NULL,
                      NULL);
    lora_forward(tm, l, 0, xn1, qo);
    lora_forward(tm, l, 1, xn1, ko);
    lora_forward(tm, l, 2, xn1, v);
    if (c->qkv_bias) {
        add_bias_rows(qo, w->bq + (size_t)l * qd, BT, qd);
        add_bias_rows(ko, w->bk + (size_t)l * kvd, BT, kvd);
        add_bias_rows(v, w->bv + (size_t)l * kvd, BT, kvd);
    }
    if (c->qk_norm) { /* per head, or (OLMo 2) over the whole projection */
        const int qn = nv_config_q_norm_len(c), kn = nv_config_k_norm_len(c);
        headnorm_forward(q, LAYER(a->qrstd, j, (size_t)BT * (qd / qn)), qo, w->q_norm + (size_t)l * qn, BT, qd / qn, qn, c->norm_eps);
        headnorm_forward(k, LAYER(a->krstd, j, (size_t)BT * (kvd / kn)), ko, w->k_norm + (size_t)l * kn, BT, kvd / kn, kn, c->norm_eps);
    }
    rope_layer(tm, l, s, q, k, 1.0f);
    const double ta = nv_now();
    nv_attention_forward(c, nv_plan_engine(tm->m.cls_plan), B, T, l, q, k, v, tm->seg_fwd, att_stats, ao, s->datt);
    tm->attn_seconds += nv_now() - ta;
    /* each product's element-wise follow-up in the same job, on the block's own thread; with
       post-norms (Gemma 2, 3) the product is normed first, then added; with Granite's multiplier and
       an adapter, the adapter's update joins the product before it is scaled and added */
    const int post = c->post_norms;
    const float rs = nv_config_residual_scale(c);
    float *ya = post ? LAYER(a->ya, j, sd) : x2, *yf = post ? LAYER(a->yf, j, sd) : xout;
    const int late1 = !post && rs != 1.0f && lora_plan(tm, l, 3, 0), late2 = !post && rs != 1.0f && lora_plan(tm, l, 5, 0);
    drop_site da, df;
    const drop_site *drop_a = drop_site_of(tm, l, 0, &da), *drop_f = drop_site_of(tm, l, 1, &df);
    ew_rows res1 = {residual_job(x2, x2, x, rs, sd, drop_a), (size_t)d};
    nv_plan_run_group((const nv_plan *const[]){lp->wo}, 1, ao, BT, (float *const[]){ya}, post || late1 ? NULL : ew_epilogue, &res1);
    lora_forward(tm, l, 3, ao, ya);
    if (post) post_norm_add(x2, LAYER(a->rstd_pa, j, BT), ya, w->post_att + (size_t)l * d, x, BT, d, c->norm_eps, rs, drop_a);
    if (late1) ew_run(res1.j);
    float *xn2 = pre_norm_forward(a->xn2, a->rstd2, j, x2, LAYER_OR_NULL(w->rms_ffn, l, d), BT, d, c->norm_eps);
    if (c->n_experts) { /* adapters: on the attention alone (nv_lora_validate) */
        moe_forward(tm, l, j, s, xn2, x2, with_out ? xout : NULL, drop_f);
        return;
    }
    ew_rows glu = {{.kind = c->ffn_gelu ? EW_GEGLU : EW_SWIGLU, .n = sh, .out = hg, .a = h1, .b = h3}, (size_t)hid}; /* n: for ew_run */
    if (lora_plan(tm, l, 4, 0) || lora_plan(tm, l, 6, 0)) { /* adapters change gate and up before SwiGLU */
        nv_plan_run_group((const nv_plan *const[]){lp->w1, lp->w3}, 2, xn2, BT, (float *const[]){h1, h3}, NULL, NULL);
        lora_forward(tm, l, 4, xn2, h1);
        lora_forward(tm, l, 6, xn2, h3);
        ew_run(glu.j);
    } else {
        nv_plan_run_group((const nv_plan *const[]){lp->w1, lp->w3}, 2, xn2, BT, (float *const[]){h1, h3}, ew_epilogue, &glu);
    }
    /* recomputed for the backward: the layer's output is kept already (a post-norm's statistics are
       not: it runs to the end, writing the output's same bits again) */
    if (!with_out && !post) return;
    ew_rows res2 = {residual_job(xout, xout, x2, rs, sd, drop_f), (size_t)d};
    nv_plan_run_group((const nv_plan *const[]){lp->w2}, 1, hg, BT, (float *const[]){yf}, post || late2 ? NULL : ew_epilogue, &res2);
    lora_forward(tm, l, 5, hg, yf);
    if (post) post_norm_add(xout, LAYER(a->rstd_pf, j, BT), yf, w->post_ffn + (size_t)l * d, x2, BT, d, c->norm_eps, rs, drop_f);
    if (late2) ew_run(res2.j);
}

float nv_tmodel_forward(nv_tmodel *tm, const int *inputs, const int *targets) {
    const nv_config *c = &tm->m.config;
    const nv_weights *w = &tm->m.w;
    nv_acts *a = &tm->a;
    scratch_ptrs s = scratch_of(tm);
    const int BT = tm->B * tm->T, d = c->dim, V = c->vocab_size;
    const size_t sd = (size_t)BT * d;
    tm->inputs = inputs;
    tm->targets = targets;
    tm->seg_fwd = tm->seg;
    tm->drop_p_fwd = tm->drop_p, tm->lora_drop_p_fwd = tm->lora_drop_p, tm->drop_key_fwd = tm->drop_key, tm->drop_row0_fwd = tm->drop_row0;
    tm->router_aux = tm->router_z = 0.0f; /* the mixture's layers add theirs */

    for (int r = 0; r < BT; r++) nv_embed(&tm->m, inputs[r], a->x + (size_t)r * d); /* Gemma's scaled by sqrt(dim) */
    for (int l = 0; l < c->n_layers; l++) layer_forward(tm, l, &s, 1);
    nv_rmsnorm_forward(a->xnf, a->rstdf, LAYER(a->x, c->n_layers, sd), w->rms_final, BT, d, c->norm_eps);
    nv_plan_run(tm->m.cls_plan, a->xnf, BT, a->logits);
    if (!targets) return 0.0f;
    /* cross-entropy; the logits become the softmax's exps for the backward */
    ce_job cj = {.logits = a->logits, .pscale = a->pscale, .nll = a->nll, .lmax = a->lmax, .targets = targets, .V = V, .rows = BT,
                 .cap = c->logit_softcap, .div = nv_config_logit_div(c), .teacher = tm->teacher, .alpha = tm->distill_alpha,
                 .temp = tm->distill_temp};
    int n_tasks = BT < CE_TASKS ? BT : CE_TASKS;
    nv_pool_run(cross_entropy_task, &cj, n_tasks);
    double total = 0.0, kl = 0.0;
    int counted = 0, correct = 0;
    for (int i = 0; i < n_tasks; i++) /* fixed order: deterministic */
        total += cj.partial[i], kl += cj.kl[i], counted += cj.counted[i], correct += cj.correct[i];
    tm->n_targets = counted;
    tm->n_correct = correct;
    tm->loss = counted ? (float)(total / counted) : 0.0f;
    tm->distill_kl = counted && tm->teacher ? (float)(kl / counted) : 0.0f;
    tm->objective = tm->teacher ? (1.0f - tm->distill_alpha) * tm->loss + tm->distill_alpha * tm->distill_temp * tm->distill_temp * tm->distill_kl
                                : tm->loss;
    tm->teacher_fwd = tm->teacher;
    return tm->loss;
}

nv_err nv_tmodel_set_teacher(nv_tmodel *tm, const float *teacher, float alpha, float temp) {
    if (teacher && (!(alpha >= 0.0f && alpha <= 1.0f) || !(temp > 0.0f) || !isfinite(temp)))
        return nv_fail(NV_EINVAL, "distillation: alpha must be in [0, 1] and the temperature positive (not %g, %g)", (double)alpha,
                       (double)temp);
    if (teacher && tm->m.config.logit_softcap != 0.0f)
        return nv_fail(NV_EINVAL, "distillation: a model whose logits are soft-capped (Gemma 2's shape) is not supported");
    tm->teacher = teacher, tm->distill_alpha = alpha, tm->distill_temp = temp;
    return NV_OK;
}

void nv_tmodel_seq_logp(const nv_tmodel *tm, double *out) {
    for (int b = 0; b < tm->B; b++) {
        double sum = 0.0;
        for (int t = 0; t < tm->T; t++) sum -= tm->a.nll[(size_t)b * tm->T + t]; /* 0 where no target */
        out[b] = sum;
    }
}

static void backward(nv_tmodel *tm, float grad_scale, const float *seq_scale);

void nv_tmodel_backward(nv_tmodel *tm, float grad_scale) { backward(tm, grad_scale, NULL); }

void nv_tmodel_backward_seq(nv_tmodel *tm, const float *seq_scale) { backward(tm, 0.0f, seq_scale); }

/* A post-norm's backward (out = x + rmsnorm(y) * w): the gradient of the product y before its norm,
   from dy, the norm's output's, into s->dpost (returned); w's gradient added to dw. */
static const float *post_norm_back(const nv_tmodel *tm, const scratch_ptrs *s, float *dw, const float *dy, const float *y,
                                   const float *w, const float *rstd) {
    const int BT = tm->B * tm->T, d = tm->m.config.dim;
    memset(s->dpost, 0, (size_t)BT * d * sizeof(float));
    nv_rmsnorm_backward(s->dpost, dw, dy, y, w, rstd, BT, d, s->normp);
    return s->dpost;
}

/* The gradient of a branch's output from the residual's, dx: dx itself, or with Granite's multiplier rs
   dx times rs, in s->dres (returned); with the branch's dropout, its multipliers too, in tm->drop_buf. */
static const float *branch_grad(const nv_tmodel *tm, const scratch_ptrs *s, const float *dx, float rs, size_t n, int l, int ffn) {
    drop_site ds;
    const drop_site *drop = drop_site_of(tm, l, ffn, &ds);
    if (rs == 1.0f && !drop) return dx;
    float *out = drop ? tm->drop_buf : s->dres;
    ew_run((ew_job){.kind = EW_SCALE, .n = n, .out = out, .a = dx, .b = dx, .s = rs, .drop = drop});
    return out;
}

static void backward(nv_tmodel *tm, float grad_scale, const float *seq_scale) {
    const nv_config *c = &tm->m.config;
    const nv_weights *w = &tm->m.w;
    nv_weights *g = &tm->g;
    nv_acts *a = &tm->a;
    scratch_ptrs s = scratch_of(tm);
    if (!tm->targets) { /* the forward computed no loss: nothing to differentiate */
        nv_warn("training: backward without a forward that had targets; gradients left as they are");
        if (!tm->grads_held) { /* spent ones are zero as far as the next update is concerned */
            nv_tmodel_zero_grad(tm);
            tm->grads_held = 1;
        }
        return;
    }
    nv_engine_id e = nv_plan_engine(tm->m.cls_plan);
    int B = tm->B, T = tm->T, BT = B * T, d = c->dim, hid = c->hidden_dim, V = c->vocab_size;
    /* the weight-gradient products add to the gradients held, or, with none held since the last
       update, write them (no pass clearing them first, no reading zeros back) */
    const int acc = tm->grads_held, frozen = tm->lora.rank > 0;
    if (!acc && !frozen) zero_unwritten_grads(tm); /* adapters: every gradient is a product's, written whole */
    /* a frozen model's norms still pass their gradient back; their own weights' is dropped */
#define NORM_DW(p) (frozen ? tm->sink : (p))
    int qd = nv_config_q_dim(c), kvd = nv_config_kv_dim(c), H = c->n_heads;
    size_t sd = (size_t)BT * d, sq = (size_t)BT * qd, skv = (size_t)BT * kvd, sh = (size_t)BT * hid;
    const float rs = nv_config_residual_scale(c);

    /* dlogits = (p - onehot) * scale / (rows with a target), in place */
    ce_job dj = {.logits = a->logits, .pscale = a->pscale, .lmax = a->lmax, .targets = tm->targets, .V = V, .rows = BT, .T = T,
                 .cap = c->logit_softcap, .div = nv_config_logit_div(c),
                 .dscale = tm->n_targets ? grad_scale / (float)tm->n_targets : 0.0f, .seq_scale = seq_scale,
                 .teacher = tm->teacher_fwd};
    nv_pool_run(dlogits_task, &dj, BT < CE_TASKS ? BT : CE_TASKS);
    nv_plan_run_dx(tm->m.cls_plan, a->logits, BT, s.dxn);
    if (!frozen) nv_gemm_dw(e, a->logits, a->xnf, BT, V, d, g->wcls, acc); /* == g->tok_emb when shared */
    memset(s.dx, 0, sd * sizeof(float));
    nv_rmsnorm_backward(s.dx, NORM_DW(g->rms_final), s.dxn, LAYER(a->x, c->n_layers, sd), w->rms_final, a->rstdf, BT, d, s.normp);

    for (int l = c->n_layers - 1; l >= 0; l--) {
        const nv_layer_plans *lp = &tm->m.plans[l];
        const int j = act_slot(tm, l);
        if (tm->recompute) layer_forward(tm, l, &s, 0);
        float *x = LAYER(a->x, l, sd), *q = LAYER(a->q, j, sq), *k = LAYER(a->k, j, skv);
        float *v = LAYER(a->v, j, skv), *ao = LAYER(a->ao, j, sq), *x2 = LAYER(a->x2, j, sd);
        const float *w_att = LAYER_OR_NULL(w->rms_att, l, d), *w_ffn = LAYER_OR_NULL(w->rms_ffn, l, d);
        float *xn1 = branch_input(a->xn1, j, x, w_att, BT, d), *xn2 = branch_input(a->xn2, j, x2, w_ffn, BT, d);
        float *h1 = LAYER(a->h1, j, sh), *h3 = LAYER(a->h3, j, sh), *hg = LAYER(a->hg, j, sh);
        const float *att_stats = LAYER(a->att_stats, j, (size_t)B * H * T * 2);
        size_t wq_n = (size_t)qd * d, wkv_n = (size_t)kvd * d, wo_n = (size_t)d * qd, wf_n = (size_t)hid * d;

        /* FFN: x_out = x2 + W2 . (silu(W1 xn2) * W3 xn2) (gelu with ffn_gelu; the product normed first
           with post-norms; times Granite's multiplier), or a mixture's weighted sum of such */
        const float *dffn_out = branch_grad(tm, &s, s.dx, rs, sd, l, 1);
        const float *dffn = c->post_norms ? post_norm_back(tm, &s, NORM_DW(g->post_ffn + (size_t)l * d), dffn_out, LAYER(a->yf, j, sd),
                                                           w->post_ffn + (size_t)l * d, LAYER(a->rstd_pf, j, BT))
                                          : dffn_out;
        if (c->n_experts) {
            moe_backward(tm, l, j, &s, xn2, dffn, s.dxn, seq_scale ? 0.0f : grad_scale * tm->router_aux_coef,
                         seq_scale ? 0.0f : grad_scale * tm->router_z_coef, e, acc, frozen);
        } else {
            nv_plan_run_dx(lp->w2, dffn, BT, s.dhg);
            if (!frozen) nv_gemm_dw(e, dffn, hg, BT, d, hid, g->w2 + (size_t)l * wf_n, acc);
            lora_backward(tm, e, l, 5, hg, dffn, s.dhg, acc);
            ew_run((ew_job){.kind = c->ffn_gelu ? EW_GEGLU_BACK : EW_SWIGLU_BACK, .n = sh, .out = s.dh1, .out2 = s.dh3, .a = h1, .b = h3,
                            .c = s.dhg});
            nv_plan_run_dx(lp->w1, s.dh1, BT, s.dxn);
            nv_plan_run_dx_add(lp->w3, s.dh3, BT, s.dxn);
            if (!frozen)
                nv_gemm_dw_group(e, (const float *const[]){s.dh1, s.dh3}, (const int[]){hid, hid}, 2, xn2, BT, d,
                                 (float *const[]){g->w1 + (size_t)l * wf_n, g->w3 + (size_t)l * wf_n}, acc);
            lora_backward(tm, e, l, 4, xn2, s.dh1, s.dxn, acc);
            lora_backward(tm, e, l, 6, xn2, s.dh3, s.dxn, acc);
        }
        pre_norm_back(s.dx2, s.dx, NORM_DW(LAYER_OR_NULL(g->rms_ffn, l, d)), s.dxn, x2, w_ffn, LAYER_OR_NULL(a->rstd2, j, BT), BT, d, s.normp);

        /* attention: x2 = x + Wo . attn(q, k, v) (the product normed first with post-norms; times
           Granite's multiplier) */
        const float *dattn_out = branch_grad(tm, &s, s.dx2, rs, sd, l, 0);
        const float *dattn = c->post_norms ? post_norm_back(tm, &s, NORM_DW(g->post_att + (size_t)l * d), dattn_out, LAYER(a->ya, j, sd),
                                                            w->post_att + (size_t)l * d, LAYER(a->rstd_pa, j, BT))
                                           : dattn_out;
        nv_plan_run_dx(lp->wo, dattn, BT, s.dao);
        if (!frozen) nv_gemm_dw(e, dattn, ao, BT, d, qd, g->wo + (size_t)l * wo_n, acc);
        lora_backward(tm, e, l, 3, ao, dattn, s.dao, acc);
        memset(s.dq, 0, sq * sizeof(float));
        memset(s.dk, 0, skv * sizeof(float));
        memset(s.dv, 0, skv * sizeof(float));
        const double ta = nv_now();
        nv_attention_backward(c, e, B, T, l, q, k, v, tm->seg_fwd, att_stats, s.dao, s.dq, s.dk, s.dv, s.datt);
        tm->attn_seconds += nv_now() - ta;
        rope_layer(tm, l, &s, s.dq, s.dk, -1.0f);
        const float *dq_in = s.dq, *dk_in = s.dk;
        if (c->qk_norm) {
            /* back through the per-head norms into the raw projections (dao is free now) */
            float *dqraw = s.dao, *dkraw = s.dxn;
            memset(dqraw, 0, sq * sizeof(float));
            memset(dkraw, 0, skv * sizeof(float));
            const int qn = nv_config_q_norm_len(c), kn = nv_config_k_norm_len(c), qrows = BT * (qd / qn), krows = BT * (kvd / kn);
            nv_rmsnorm_backward(dqraw, NORM_DW(g->q_norm + (size_t)l * qn), s.dq, LAYER(a->qraw, j, sq), w->q_norm + (size_t)l * qn,
                                LAYER(a->qrstd, j, (size_t)qrows), qrows, qn, s.normp);
            nv_rmsnorm_backward(dkraw, NORM_DW(g->k_norm + (size_t)l * kn), s.dk, LAYER(a->kraw, j, skv), w->k_norm + (size_t)l * kn,
                                LAYER(a->krstd, j, (size_t)krows), krows, kn, s.normp);
            memcpy(s.dq, dqraw, sq * sizeof(float));
            memcpy(s.dk, dkraw, skv * sizeof(float));
        }
        if (c->qkv_bias && !frozen) { /* the biases were added to the projections' outputs */
            add_col_sums(g->bq + (size_t)l * qd, dq_in, BT, qd);
            add_col_sums(g->bk + (size_t)l * kvd, dk_in, BT, kvd);
            add_col_sums(g->bv + (size_t)l * kvd, s.dv, BT, kvd);
        }
        nv_plan_run_dx(lp->wq, dq_in, BT, s.dxn);
        nv_plan_run_dx_add(lp->wk, dk_in, BT, s.dxn);
        nv_plan_run_dx_add(lp->wv, s.dv, BT, s.dxn);
        if (!frozen)
            nv_gemm_dw_group(e, (const float *const[]){dq_in, dk_in, s.dv}, (const int[]){qd, kvd, kvd}, 3, xn1, BT, d,
                             (float *const[]){g->wq + (size_t)l * wq_n, g->wk + (size_t)l * wkv_n, g->wv + (size_t)l * wkv_n},
                             acc);
        lora_backward(tm, e, l, 0, xn1, dq_in, s.dxn, acc);
        lora_backward(tm, e, l, 1, xn1, dk_in, s.dxn, acc);
        lora_backward(tm, e, l, 2, xn1, s.dv, s.dxn, acc);
        pre_norm_back(s.dx, s.dx2, NORM_DW(LAYER_OR_NULL(g->rms_att, l, d)), s.dxn, x, w_att, LAYER_OR_NULL(a->rstd1, j, BT), BT, d, s.normp);
    }
#undef NORM_DW
    const float emb_scale = nv_config_emb_scale(c);
    for (int r = 0; r < BT && !frozen; r++) {
        float *ge = g->tok_emb + (size_t)tm->inputs[r] * d;
        const float *dxr = s.dx + (size_t)r * d;
        for (int j = 0; j < d; j++) ge[j] += emb_scale * dxr[j];
    }
    tm->grads_held = 1;
}
