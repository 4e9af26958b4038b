/* Mixtures of experts (Mixtral as GGUF llama, Qwen3-MoE as qwen3moe): a layer's FFN against a direct
 * computation in double (routing, renormalised weights, each chosen expert's SwiGLU); a model whose
 * experts are all one dense FFN gives the dense model's logits; a prompt run at once gives exactly
 * the logits of running it token by token; the GGUF form (llama.cpp's tensor names, shapes and keys)
 * read back to the same logits, quantized exports giving the logits of their dequantized weights to
 * the bit; malformed files and the paths that have no mixture form refused. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/file.h"
#include "base/half.h"
#include "base/rng.h"
#include "engine/engine.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "model/imatrix.h"
#include "model/hf.h"
#include "model/lora.h"
#include "model/model.h"
#include "forward_ref.h"
#include "moe_write.h"
#include "t.h"

/* dim 64, hidden 64, 2 layers, 4 heads (2 kv) of 16, vocab 61, context 32; E experts, K used */
static nv_config moe_config(int E, int K, int qk_norm) {
    nv_config c = {64, 64, 2, 4, 2, 16, 61, 32, 10000.0f, 1e-5f, 0, qk_norm, 0, {0}, 0, NV_CONFIG_PLAIN};
    c.n_experts = E;
    c.n_experts_used = K;
    return c;
}

/* A random model whose router is strong enough that rows choose different experts. */
static int moe_model(nv_model *m, const nv_config *c, uint64_t seed) {
    if (nv_model_alloc(m, c) != NV_OK) return 0;
    nv_model_init_random(m, seed);
    for (size_t i = 0; i < (size_t)c->n_layers * c->n_experts * c->dim; i++) m->w.router[i] *= 60.0f;
    if (c->qk_norm)
        for (int i = 0; i < c->n_layers * c->head_dim; i++) m->w.q_norm[i] = 0.8f + 0.02f * (float)i, m->w.k_norm[i] = 1.2f - 0.01f * (float)i;
    return 1;
}

static double silu(double v) { return v / (1.0 + exp(-v)); }

/* y[n] = W[n][k] . x in double */
static void matvec(const float *w, const double *x, int n, int k, double *y) {
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int j = 0; j < k; j++) s += (double)w[(size_t)i * k + j] * x[j];
        y[i] = s;
    }
}

/* nv_layer_tail on rows of random activations against the layer computed here in double; *routes
 * counts the distinct expert sets the rows chose. */
static double layer_error(const nv_model *m, int l, int T, int *routes) {
    const nv_config *c = &m->config;
    const int d = c->dim, h = c->hidden_dim, q = nv_config_q_dim(c), E = c->n_experts, K = c->n_experts_used;
    nv_rows r;
    if (nv_rows_init(&r, c, T) != NV_OK) return INFINITY;
    nv_rng rng;
    nv_rng_seed(&rng, 99 + (uint64_t)l);
    float *x0 = malloc((size_t)T * d * sizeof(float)), *att = malloc((size_t)T * q * sizeof(float));
    for (int i = 0; i < T * d; i++) x0[i] = r.x[i] = nv_rng_normal(&rng);
    for (int i = 0; i < T * q; i++) att[i] = r.xb[i] = 0.5f * nv_rng_normal(&rng);
    nv_layer_tail(m, l, T, &r, NULL);
    double worst = 0, *x = malloc((size_t)d * sizeof(double)), *xn = malloc((size_t)d * sizeof(double)),
           *a = malloc((size_t)q * sizeof(double)), *g = malloc((size_t)h * sizeof(double)), *u = malloc((size_t)h * sizeof(double)),
           *y = malloc((size_t)d * sizeof(double)), *p = malloc((size_t)E * sizeof(double)), *out = malloc((size_t)d * sizeof(double));
    unsigned seen[64];
    int n_seen = 0;
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < q; i++) a[i] = att[(size_t)t * q + i];
        matvec(m->w.wo + (size_t)l * d * q, a, d, q, y);
        double ss = 0;
        for (int i = 0; i < d; i++) x[i] = x0[(size_t)t * d + i] + y[i], ss += x[i] * x[i];
        const double inv = 1 / sqrt(ss / d + c->norm_eps);
        for (int i = 0; i < d; i++) xn[i] = x[i] * inv * m->w.rms_ffn[(size_t)l * d + i];
        matvec(m->w.router + (size_t)l * E * d, xn, E, d, p);
        double mx = p[0], sum = 0, chosen_sum = 0;
        for (int e = 1; e < E; e++) mx = fmax(mx, p[e]);
        for (int e = 0; e < E; e++) sum += p[e] = exp(p[e] - mx);
        int chosen[16];
        unsigned set = 0;
        for (int j = 0; j < K; j++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (!(set >> e & 1) && (best < 0 || p[e] > p[best])) best = e;
            chosen[j] = best, set |= 1u << best, chosen_sum += p[best] / sum;
        }
        int known = 0;
        for (int i = 0; i < n_seen; i++) known |= seen[i] == set;
        if (!known && n_seen < 64) seen[n_seen++] = set;
        memcpy(out, x, (size_t)d * sizeof(double));
        for (int j = 0; j < K; j++) {
            const size_t at = (size_t)l * E + (size_t)chosen[j];
            matvec(m->w.w1 + at * h * d, xn, h, d, g);
            matvec(m->w.w3 + at * h * d, xn, h, d, u);
            for (int i = 0; i < h; i++) g[i] = silu(g[i]) * u[i];
            matvec(m->w.w2 + at * d * h, g, d, h, y);
            const double wt = p[chosen[j]] / sum / chosen_sum;
            for (int i = 0; i < d; i++) out[i] += wt * y[i];
        }
        for (int i = 0; i < d; i++) worst = fmax(worst, fabs(r.x[(size_t)t * d + i] - out[i]) / (1 + fabs(out[i])));
    }
    *routes = n_seen;
    free(x0), free(att), free(x), free(xn), free(a), free(g), free(u), free(y), free(p), free(out);
    nv_rows_free(&r);
    return worst;
}

static void test_layer_matches_direct(void) {
    nv_engines_init(NULL, 0);
    const nv_config c = moe_config(6, 2, 0);
    nv_model m;
    T_CHECK(moe_model(&m, &c, 3), "%s", nv_errmsg());
    const nv_engine_id engines[2] = {NV_ENGINE_SCALAR, nv_engine_best_fp32()};
    for (int i = 0; i < 2; i++) {
        T_CHECK(nv_model_build_plans(&m, engines[i]) == NV_OK, "%s", nv_errmsg());
        for (int l = 0; l < c.n_layers; l++) {
            int routes = 0;
            const double err = layer_error(&m, l, 9, &routes);
            T_CHECK(err < 2e-5, "%s layer %d: error %g", nv_engine_name(engines[i]), l, err);
            T_CHECK(routes >= 3, "%s layer %d: the rows chose only %d expert sets", nv_engine_name(engines[i]), l, routes);
        }
    }
    /* every expert used: the weights are the whole softmax */
    nv_model all;
    const nv_config ca = moe_config(3, 3, 1);
    T_CHECK(moe_model(&all, &ca, 5) && nv_model_build_plans(&all, nv_engine_best_fp32()) == NV_OK, "%s", nv_errmsg());
    int routes = 0;
    const double err = layer_error(&all, 1, 4, &routes);
    T_CHECK(err < 2e-5 && routes == 1, "all experts: error %g, %d sets", err, routes);
    nv_model_free(&all);
    nv_model_free(&m);
}

/* Experts that are all one dense FFN: whatever the router says, the weighted sum is that FFN. */
static void test_identical_experts_are_dense(void) {
    nv_engines_init(NULL, 0);
    const nv_config mc = moe_config(4, 2, 0);
    nv_config dc = mc;
    dc.n_experts = dc.n_experts_used = 0;
    nv_model moe, dense;
    T_CHECK(moe_model(&moe, &mc, 7) && nv_model_alloc(&dense, &dc) == NV_OK, "%s", nv_errmsg());
    nv_model_init_random(&dense, 8);
    const nv_weights *mw = &moe.w, *dw = &dense.w;
    const size_t d = (size_t)mc.dim, h = (size_t)mc.hidden_dim, q = (size_t)nv_config_q_dim(&mc), kv = (size_t)nv_config_kv_dim(&mc),
                 L = (size_t)mc.n_layers, V = (size_t)mc.vocab_size;
    memcpy(mw->tok_emb, dw->tok_emb, V * d * sizeof(float));
    memcpy(mw->wcls, dw->wcls, V * d * sizeof(float));
    memcpy(mw->wq, dw->wq, L * q * d * sizeof(float));
    memcpy(mw->wk, dw->wk, L * kv * d * sizeof(float));
    memcpy(mw->wv, dw->wv, L * kv * d * sizeof(float));
    memcpy(mw->wo, dw->wo, L * d * q * sizeof(float));
    for (size_t l = 0; l < L; l++)
        for (size_t e = 0; e < 4; e++) {
            const size_t at = (l * 4 + e) * h * d;
            memcpy(mw->w1 + at, dw->w1 + l * h * d, h * d * sizeof(float));
            memcpy(mw->w2 + at, dw->w2 + l * h * d, h * d * sizeof(float));
            memcpy(mw->w3 + at, dw->w3 + l * h * d, h * d * sizeof(float));
        }
    T_CHECK(nv_model_build_plans(&moe, nv_engine_best_fp32()) == NV_OK && nv_model_build_plans(&dense, nv_engine_best_fp32()) == NV_OK,
            "%s", nv_errmsg());
    const int toks[10] = {1, 5, 9, 33, 2, 60, 17, 17, 40, 3};
    float *a = malloc(10 * V * sizeof(float)), *b = malloc(10 * V * sizeof(float));
    T_CHECK(t_forward_logits(&moe, toks, 10, a) && t_forward_logits(&dense, toks, 10, b), "%s", nv_errmsg());
    int bad = 0;
    for (size_t i = 0; i < 10 * V; i++) bad += !t_close(a[i], b[i], 1e-4f, 1e-5f);
    T_CHECK(bad == 0, "%d logits differ from the dense model's", bad);
    free(a), free(b);
    nv_model_free(&moe);
    nv_model_free(&dense);
}

/* A prompt at once (the experts on gathered rows) and token by token: the same bits. */
static void test_chunk_equals_tokens(void) {
    nv_engines_init(NULL, 0);
    const nv_config c = moe_config(5, 2, 1);
    nv_model m;
    T_CHECK(moe_model(&m, &c, 11), "%s", nv_errmsg());
    const int n = 12, V = c.vocab_size, toks[12] = {1, 44, 3, 8, 8, 21, 50, 2, 13, 34, 55, 0};
    const nv_engine_id engines[2] = {NV_ENGINE_SCALAR, nv_engine_best()};
    for (int i = 0; i < 2; i++) {
        T_CHECK(nv_model_build_plans(&m, engines[i]) == NV_OK, "%s", nv_errmsg());
        float *ref = malloc((size_t)n * V * sizeof(float));
        nv_state s;
        T_CHECK(t_forward_logits(&m, toks, n, ref) && nv_state_init(&s, &c, n, c.seq_len, 1) == NV_OK, "%s", nv_errmsg());
        T_CHECK(nv_forward(&m, &s, toks, n, 0) == NV_OK, "%s", nv_errmsg());
        T_CHECK(!memcmp(s.logits, ref, (size_t)n * V * sizeof(float)), "%s: the chunk's logits differ", nv_engine_name(engines[i]));
        nv_state_free(&s);
        free(ref);
    }
    nv_model_free(&m);
}

static uint64_t kv_u32_of(const nv_gguf *g, const char *key) {
    const nv_gguf_kv *kv = nv_gguf_find(g, key);
    uint32_t v = 0;
    if (kv && kv->type == 4) memcpy(&v, kv->val, 4);
    return kv ? v : UINT64_MAX;
}

/* Logits of the file loaded for inference (each expert's slice of its tensor kept as its plan's
 * source) and of the whole tensors made fp32 (fp32 plans), both on engine e: equal to the bit on the
 * fp32 engines (within 5% on the others), and within tol of ref when given. */
static void check_file(const char *path, nv_engine_id e, const float *ref, float tol, const char *what) {
    nv_model a, b;
    T_CHECK(nv_model_load_quantized(path, &a) == NV_OK && nv_model_load(path, &b) == NV_OK, "%s: %s", what, nv_errmsg());
    if (!a.params || !b.params) return;
    /* a quantized or 16-bit expert's fp32 weights are never made for inference (the plans take its source) */
    const size_t hd = (size_t)a.config.hidden_dim * a.config.dim;
    const nv_qmatrix *src = a.quant ? &a.quant[nv_model_expert_plan(&a.config, 1, 1, 2)] : NULL;
    if (src && src->raw) {
        int made = 0;
        for (size_t i = 0; i < hd * a.config.n_experts; i++) made += a.w.w3[hd * a.config.n_experts + i] != 0.0f;
        T_CHECK(src->pending && !made, "%s: %d fp32 weights of layer 1's up experts made", what, made);
    }
    nv_model_drop_quant_sources(&b);
    T_CHECK(nv_model_build_plans(&a, e) == NV_OK && nv_model_build_plans(&b, e) == NV_OK, "%s", nv_errmsg());
    const int n = 8, V = a.config.vocab_size, toks[8] = {1, 7, 30, 2, 59, 11, 11, 4};
    float *la = malloc((size_t)n * V * sizeof(float)), *lb = malloc((size_t)n * V * sizeof(float));
    T_CHECK(t_forward_logits(&a, toks, n, la) && t_forward_logits(&b, toks, n, lb), "%s", nv_errmsg());
    int bad = 0;
    /* (the int8 and bf16 engines run block-quantized sources on the fp32 kernels, and fp32 weights in their own form) */
    const int exact = !nv_engine_low_precision(nv_model_engine(&a)) && !nv_engine_low_precision(nv_model_engine(&b));
    if (exact)
        bad = memcmp(la, lb, (size_t)n * V * sizeof(float)) != 0;
    else
        for (int i = 0; i < n * V; i++) bad += !t_close(la[i], lb[i], 0.05f, 0.05f);
    T_CHECK(bad == 0, "%s on %s and %s: the kept sources give other logits than their fp32 weights", what,
            nv_engine_name(nv_model_engine(&a)), nv_engine_name(nv_model_engine(&b)));
    bad = 0;
    for (int i = 0; ref && i < n * V; i++) bad += !t_close(la[i], ref[i], tol, tol);
    T_CHECK(bad == 0, "%s: %d logits beyond %g of the model's", what, bad, (double)tol);
    free(la), free(lb);
    nv_model_free(&a);
    nv_model_free(&b);
}

static void test_gguf_round_trip(void) {
    nv_engines_init(NULL, 0);
    for (int qk = 0; qk < 2; qk++) {
        const nv_config c = moe_config(4, 2, qk);
        nv_model m;
        T_CHECK(moe_model(&m, &c, 21 + (uint64_t)qk) && nv_model_build_plans(&m, nv_engine_best_fp32()) == NV_OK, "%s", nv_errmsg());
        const int n = 8, V = c.vocab_size, toks[8] = {1, 7, 30, 2, 59, 11, 11, 4};
        float *ref = malloc((size_t)n * V * sizeof(float));
        T_CHECK(t_forward_logits(&m, toks, n, ref), "%s", nv_errmsg());
        const char *f32 = t_path(qk ? "qwen3moe-f32.gguf" : "mixtral-f32.gguf");
        T_CHECK(nv_gguf_save(&m, NULL, "moe", f32, NV_GGUF_F32, NULL, NULL) == NV_OK, "%s", nv_errmsg());
        /* llama.cpp's layout: one tensor per layer and part, [in, out, experts]; the router [dim, experts] */
        nv_gguf g;
        T_CHECK(nv_gguf_open(f32, &g) == NV_OK, "%s", nv_errmsg());
        size_t an = 0;
        const char *arch = nv_gguf_string(&g, "general.architecture", &an), *ak = qk ? "qwen3moe" : "llama";
        char key[64];
        T_CHECK(arch && an == strlen(ak) && !memcmp(arch, ak, an), "architecture %.*s", (int)an, arch ? arch : "");
        snprintf(key, sizeof key, "%s.expert_count", ak);
        T_CHECK(kv_u32_of(&g, key) == 4, "%s", key);
        snprintf(key, sizeof key, "%s.expert_used_count", ak);
        T_CHECK(kv_u32_of(&g, key) == 2, "%s", key);
        snprintf(key, sizeof key, "%s.expert_feed_forward_length", ak);
        T_CHECK(kv_u32_of(&g, key) == (qk ? 64u : UINT64_MAX), "%s", key);
        const nv_gguf_tensor *gate = nv_gguf_tensor_find(&g, "blk.1.ffn_gate_exps.weight"),
                             *down = nv_gguf_tensor_find(&g, "blk.1.ffn_down_exps.weight"),
                             *router = nv_gguf_tensor_find(&g, "blk.1.ffn_gate_inp.weight");
        T_CHECK(gate && gate->n_dims == 3 && gate->dims[0] == 64 && gate->dims[1] == 64 && gate->dims[2] == 4, "ffn_gate_exps");
        T_CHECK(down && down->n_dims == 3 && down->dims[2] == 4, "ffn_down_exps");
        T_CHECK(router && router->n_dims == 2 && router->dims[0] == 64 && router->dims[1] == 4 && router->type == 0, "ffn_gate_inp");
        T_CHECK(!nv_gguf_tensor_find(&g, "blk.0.ffn_gate.weight"), "a dense FFN tensor written");
        nv_gguf_close(&g);
        check_file(f32, nv_engine_best_fp32(), ref, 0.0f, "F32");
        /* quantized: every expert's slice of the tensor becomes its plan's source */
        const uint32_t types[3] = {NV_GGUF_Q8_0, NV_GGUF_Q4_0, NV_GGUF_BF16};
        const char *names[3] = {"q8_0.gguf", "q4_0.gguf", "bf16.gguf"};
        const float tols[3] = {0.05f, 0.5f, 0.1f};
        for (int t = 0; t < 3; t++) {
            const char *p = t_path(names[t]);
            T_CHECK(nv_gguf_save(&m, NULL, "moe", p, types[t], NULL, NULL) == NV_OK, "%s", nv_errmsg());
            T_CHECK(nv_gguf_open(p, &g) == NV_OK, "%s", nv_errmsg());
            router = nv_gguf_tensor_find(&g, "blk.0.ffn_gate_inp.weight");
            gate = nv_gguf_tensor_find(&g, "blk.0.ffn_up_exps.weight");
            T_CHECK(router && router->type == 0 && gate && gate->type != 0, "%s: router type %u, experts type %u", names[t],
                    router ? router->type : 99, gate ? gate->type : 99);
            nv_gguf_close(&g);
            check_file(p, nv_engine_best_fp32(), ref, tols[t], names[t]);
            check_file(p, nv_engine_best(), NULL, 0, names[t]);
        }
        free(ref);
        nv_model_free(&m);
    }
}

/* Replaces the first `from` in a file with `to` (the same length). */
static int patch(const char *src, const char *dst, const void *from, const void *to, size_t n) {
    char *data;
    size_t len;
    if (nv_file_read_all(src, &data, &len) != NV_OK) return 0;
    int done = 0;
    for (size_t i = 0; i + n <= len && !done; i++)
        if (!memcmp(data + i, from, n)) memcpy(data + i, to, n), done = 1;
    t_write(dst, data, len);
    free(data);
    return done;
}

static void test_refusals(void) {
    nv_engines_init(NULL, 0);
    const nv_config c = moe_config(4, 2, 0);
    nv_model m;
    T_CHECK(moe_model(&m, &c, 31), "%s", nv_errmsg());
    const char *good = t_path("good.gguf");
    T_CHECK(nv_gguf_save(&m, NULL, "moe", good, NV_GGUF_F32, NULL, NULL) == NV_OK, "%s", nv_errmsg());
    /* config: used beyond the experts, used without experts */
    nv_config bad = c;
    bad.n_experts_used = 5;
    T_CHECK(nv_config_validate(&bad) == NV_EFORMAT, "used > experts accepted");
    bad.n_experts = 0;
    bad.n_experts_used = 1;
    T_CHECK(nv_config_validate(&bad) == NV_EFORMAT, "used without experts accepted");
    /* the file: used count past the experts; an expert tensor of another shape; old per-expert tensors */
    const char key[] = "llama.expert_used_count";
    char want[sizeof key + 8], to[sizeof key + 8];
    memcpy(want, key, sizeof key - 1), memcpy(to, key, sizeof key - 1);
    const uint32_t str_type = 4, two = 2, nine = 9;
    memcpy(want + sizeof key - 1, &str_type, 4), memcpy(want + sizeof key + 3, &two, 4);
    memcpy(to + sizeof key - 1, &str_type, 4), memcpy(to + sizeof key + 3, &nine, 4);
    nv_model r;
    T_CHECK(patch(good, "used9.gguf", want, to, sizeof key + 7), "key not found");
    T_CHECK(nv_model_load(t_path("used9.gguf"), &r) == NV_EFORMAT && strstr(nv_errmsg(), "experts"), "%s", nv_errmsg());
    T_CHECK(patch(good, "noexp.gguf", "llama.expert_count", "llama.expert_cxunt", 18), "key not found");
    T_CHECK(nv_model_load(t_path("noexp.gguf"), &r) == NV_EFORMAT && strstr(nv_errmsg(), "without experts"), "%s", nv_errmsg());
    T_CHECK(patch(good, "shape.gguf", "blk.1.ffn_down_exps.weight", "blk.1.ffn_gate_exps.weight", 26), "tensor not found");
    T_CHECK(nv_model_load(t_path("shape.gguf"), &r) != NV_OK, "a second ffn_gate_exps accepted");
    const nv_config cq = moe_config(4, 2, 1);
    nv_model mq;
    T_CHECK(moe_model(&mq, &cq, 32), "%s", nv_errmsg());
    const char *qgood = t_path("qgood.gguf");
    T_CHECK(nv_gguf_save(&mq, NULL, "moe", qgood, NV_GGUF_F32, NULL, NULL) == NV_OK, "%s", nv_errmsg());
    T_CHECK(patch(qgood, "qnoexp.gguf", "qwen3moe.expert_count", "qwen3moe.expert_cxunt", 21), "key not found");
    T_CHECK(nv_model_load(t_path("qnoexp.gguf"), &r) == NV_EFORMAT && strstr(nv_errmsg(), "expert_count"), "%s", nv_errmsg());
    nv_model_free(&mq);
    /* formats and features without a mixture form */
    T_CHECK(nv_model_save_v1(&m, t_path("m.bin")) == NV_EUNSUPPORTED, "llama2.c v1 written");
    nv_model biased = m; /* no model type has experts and Qwen2's biases */
    biased.config.qkv_bias = 1;
    T_CHECK(nv_hf_save(&biased, NULL, t_path("hf/"), NV_HF_F32, NULL) == NV_EUNSUPPORTED && !nv_file_exists(t_path("hf")),
            "a Hugging Face folder of experts and biases written");
    const nv_lora_shape ls = {4, 8.0f, NV_LORA_Q}, lf = {4, 8.0f, NV_LORA_Q | NV_LORA_DOWN};
    T_CHECK(nv_lora_validate(&c, &ls) == NV_OK, "%s", nv_errmsg()); /* the attention's adapters */
    T_CHECK(nv_lora_validate(&c, &lf) == NV_EUNSUPPORTED, "LoRA on the experts accepted");
    nv_model_free(&m);
    /* the CLI: generate, train, imatrix and a Hugging Face export take it */
    const char *tok = t_data("models/tok512.bin"), *text = t_data("corpus/tinystories_sample.txt");
    if (!tok || !text) return;
    char args[2048];
    snprintf(args, sizeof args, "generate -m %s -z %s -n 12 -t 0", good, tok);
    T_CHECK(t_nerve(args) != 0, "a vocabulary of another size accepted");
    nv_config c512 = moe_config(4, 2, 0); /* tok512's vocabulary, the classifier the embedding */
    c512.vocab_size = 512;
    c512.shared_classifier = 1;
    nv_model big;
    T_CHECK(moe_model(&big, &c512, 33), "%s", nv_errmsg());
    char g512[640]; /* kept: t_path's buffers are reused */
    snprintf(g512, sizeof g512, "%s", t_path("v512.gguf"));
    T_CHECK(nv_gguf_save(&big, NULL, "moe", g512, NV_GGUF_Q8_0, NULL, NULL) == NV_OK, "%s", nv_errmsg());
    nv_model_free(&big);
    snprintf(args, sizeof args, "generate -m %s -z %s -n 12 -t 0 -p Once", g512, tok);
    T_CHECK(t_nerve(args) == 0 && !strncmp(t_out, "Once", 4), "%s", t_err);
    snprintf(args, sizeof args, "perplexity -m %s -z %s -f %s --ctx 32", g512, tok, text);
    T_CHECK(t_nerve(args) == 0 && strstr(t_out, "Final estimate: PPL"), "%s", t_err);
    /* fine-tuning it from the Q8_0 file (the experts made fp32 to train) */
    snprintf(args, sizeof args, "train --init-from %s -z %s --data %s --steps 2 --batch 1 --seq 16 --quiet --out %s", g512, tok,
             text, t_path("run"));
    T_CHECK(t_nerve(args) == 0, "%s", t_err);
    nv_config rc;
    snprintf(args, sizeof args, "%s/model.gguf", t_path("run"));
    T_CHECK(nv_model_read_config(args, &rc) == NV_OK && rc.n_experts == 4 && rc.n_experts_used == 2, "%s", nv_errmsg());
    /* an importance matrix of it (an entry per stacked expert tensor), and a requantization with it */
    snprintf(args, sizeof args, "imatrix -m %s -z %s -f %s --ctx 32 --chunks 4 -o %s", g512, tok, text, t_path("im.gguf"));
    T_CHECK(t_nerve(args) == 0, "%s", t_err);
    nv_imatrix im;
    if (nv_imatrix_load(t_path("im.gguf"), &im) == NV_OK) {
        const nv_imatrix_entry *ue = nv_imatrix_find(&im, "blk.1.ffn_up_exps.weight");
        T_CHECK(ue && ue->n_mat == 4 && ue->count[0] + ue->count[1] + ue->count[2] + ue->count[3] == 4 * 32 * 2,
                "the up experts' entry: %d matrices", ue ? ue->n_mat : 0);
        nv_imatrix_free(&im);
    } else {
        T_CHECK(0, "%s", nv_errmsg());
    }
    snprintf(args, sizeof args, "export %s -o %s -z %s --type q4_k_m --imatrix %s", g512, t_path("imq.gguf"), tok, t_path("im.gguf"));
    T_CHECK(t_nerve(args) == 0, "%s", t_err);
    snprintf(args, sizeof args, "export %s -o %s -z %s", g512, t_path("hfout/"), tok);
    T_CHECK(t_nerve(args) == 0, "%s", t_err);
    snprintf(args, sizeof args, "generate -m %s -n 12 -t 0 -p Once", t_path("hfout"));
    T_CHECK(t_nerve(args) == 0 && !strncmp(t_out, "Once", 4), "the exported folder: %s", t_err);
    snprintf(args, sizeof args, "export %s -o %s -z %s --type q4_k_m", g512, t_path("requant.gguf"), tok);
    T_CHECK(t_nerve(args) == 0, "%s", t_err);
    /* nerve init makes one of a preset's shape (GGUF only) */
    snprintf(args, sizeof args, "init --preset stories260K --experts 4 --experts-used 2 -o %s", t_path("init.gguf"));
    T_CHECK(t_nerve(args) == 0 && strstr(t_err, "4 experts, 2 a token"), "%s", t_err);
    nv_config ic;
    T_CHECK(nv_model_read_config(t_path("init.gguf"), &ic) == NV_OK && ic.n_experts == 4 && ic.n_experts_used == 2 && ic.hidden_dim == 172,
            "%s", nv_errmsg());
    snprintf(args, sizeof args, "init --preset stories260K --experts 4 -o %s", t_path("init.bin"));
    T_CHECK(t_nerve(args) == 1 && strstr(t_err, "name the output .gguf"), "%s", t_err);
    snprintf(args, sizeof args, "init --preset stories260K --experts 4 --experts-used 5 -o %s", t_path("init5.gguf"));
    T_CHECK(t_nerve(args) == 2, "%s", t_err);
}

/* The model as a transformers folder, its experts kept as layout says (moe_write.h); 0 on failure. */
static int write_hf(const nv_model *m, const char *dir, int layout, int bf16) {
    nv_buf b = {0};
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const int ok = moe_safetensors(m, layout, bf16, &b);
    FILE *f = ok ? fopen(path, "wb") : NULL;
    const int written = f && fwrite(b.data, 1, b.len, f) == b.len;
    if (f) fclose(f);
    nv_buf_free(&b);
    return written;
}

static void put_config(const char *dir, const char *json) {
    char path[700];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (f) fputs(json, f), fclose(f);
}

/* Mixtral and Qwen3-MoE folders as transformers saves them: the same logits as the model they were
 * written from (F32), BF16 experts kept as bf16 per expert, what is not run refused. */
static void test_hf_folders(void) {
    nv_engines_init(NULL, 0);
    static const char *const configs[2] = {
        "{\"model_type\": \"mixtral\", \"architectures\": [\"MixtralForCausalLM\"], \"hidden_size\": 64, \"intermediate_size\": 64, "
        "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 61, "
        "\"max_position_embeddings\": 32, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"num_local_experts\": 4, "
        "\"num_experts_per_tok\": 2, \"tie_word_embeddings\": false, \"hidden_act\": \"silu\", \"sliding_window\": null}",
        "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 64, \"intermediate_size\": 6144, \"moe_intermediate_size\": 64, "
        "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, \"vocab_size\": 61, "
        "\"max_position_embeddings\": 32, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"num_experts\": 4, "
        "\"num_experts_per_tok\": 2, \"norm_topk_prob\": true, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [], "
        "\"tie_word_embeddings\": false, \"use_sliding_window\": false}"};
    for (int qk = 0; qk < 2; qk++) {
        const nv_config c = moe_config(4, 2, qk);
        nv_model m;
        T_CHECK(moe_model(&m, &c, 41 + (uint64_t)qk) && nv_model_build_plans(&m, nv_engine_best_fp32()) == NV_OK, "%s", nv_errmsg());
        const int n = 8, V = c.vocab_size, toks[8] = {1, 7, 30, 2, 59, 11, 11, 4};
        float *ref = malloc((size_t)n * V * sizeof(float));
        T_CHECK(t_forward_logits(&m, toks, n, ref), "%s", nv_errmsg());
        const char *dir = t_path(qk ? "qwen3moe" : "mixtral"), *bdir = t_path(qk ? "qwen3moe-bf16" : "mixtral-bf16");
        char cmd[1500];
        snprintf(cmd, sizeof cmd, "mkdir -p '%s' '%s'", dir, bdir);
        T_CHECK(system(cmd) == 0 && write_hf(&m, dir, !qk, 0) && write_hf(&m, bdir, !qk, 1), "cannot write the folders");
        char generated[2048]; /* the BF16 folder's config as moe_write.h writes one (fuzz seeds too) */
        moe_hf_config(&c, !qk, generated, sizeof generated);
        put_config(dir, configs[qk]);
        put_config(bdir, generated);
        char cj[700], bcj[700];
        snprintf(cj, sizeof cj, "%s/config.json", dir);
        snprintf(bcj, sizeof bcj, "%s/config.json", bdir);
        nv_config rc;
        T_CHECK(nv_model_read_config(cj, &rc) == NV_OK && rc.n_experts == 4 && rc.n_experts_used == 2 && rc.hidden_dim == 64 &&
                    rc.qk_norm == qk,
                "%s", nv_errmsg());
        check_file(cj, nv_engine_best_fp32(), ref, 0.0f, qk ? "qwen3_moe F32" : "mixtral F32");
        check_file(bcj, nv_engine_best_fp32(), ref, 0.1f, qk ? "qwen3_moe BF16" : "mixtral BF16");
        /* written by nerve (nv_hf_save, as `nerve export -o DIR/`): read back the same */
        char out[640], bout[640];
        snprintf(out, sizeof out, "%s", t_path(qk ? "qwen3moe-out" : "mixtral-out"));
        snprintf(bout, sizeof bout, "%s", t_path(qk ? "qwen3moe-out-bf16" : "mixtral-out-bf16"));
        T_CHECK(nv_hf_save(&m, NULL, out, NV_HF_F32, NULL) == NV_OK && nv_hf_save(&m, NULL, bout, NV_HF_BF16, NULL) == NV_OK, "%s",
                nv_errmsg());
        snprintf(cj, sizeof cj, "%s/config.json", out);
        snprintf(bcj, sizeof bcj, "%s/config.json", bout);
        char *text = NULL;
        cJSON *j = nv_file_read_all(cj, &text, NULL) == NV_OK ? cJSON_Parse(text) : NULL;
        const cJSON *mt = cJSON_GetObjectItem(j, "model_type"), *used = cJSON_GetObjectItem(j, "num_experts_per_tok"),
                    *ne = cJSON_GetObjectItem(j, qk ? "num_experts" : "num_local_experts");
        T_CHECK(cJSON_IsString(mt) && !strcmp(mt->valuestring, qk ? "qwen3_moe" : "mixtral") && cJSON_IsNumber(used) &&
                    used->valuedouble == 2 && cJSON_IsNumber(ne) && ne->valuedouble == 4,
                "config.json: %s", text ? text : nv_errmsg());
        cJSON_Delete(j);
        free(text);
        check_file(cj, nv_engine_best_fp32(), ref, 0.0f, qk ? "qwen3_moe F32 written" : "mixtral F32 written");
        check_file(bcj, nv_engine_best_fp32(), ref, 0.1f, qk ? "qwen3_moe BF16 written" : "mixtral BF16 written");
        free(ref);
        nv_model_free(&m);
    }
    /* Qwen3-MoE without renormalised weights, or with dense layers: refused */
    const char *dir = t_path("qwen3moe");
    char cj[700];
    snprintf(cj, sizeof cj, "%s/config.json", dir);
    static const char *const from[3] = {"\"norm_topk_prob\": true", "\"decoder_sparse_step\": 1", "\"mlp_only_layers\": []"};
    static const char *const to[3] = {"\"norm_topk_prob\": false", "\"decoder_sparse_step\": 2", "\"mlp_only_layers\": [1]"};
    for (int i = 0; i < 3; i++) {
        char cfg[2048];
        const char *at = strstr(configs[1], from[i]);
        snprintf(cfg, sizeof cfg, "%.*s%s%s", (int)(at - configs[1]), configs[1], to[i], at + strlen(from[i]));
        put_config(dir, cfg);
        nv_config rc;
        T_CHECK(nv_model_read_config(cj, &rc) == NV_EUNSUPPORTED && strstr(nv_errmsg(), "renormalised"), "%s: %s", to[i], nv_errmsg());
    }
}

/* GraniteMoe folders: the experts fused per layer (input_linear: each expert's gate rows, then its up
 * rows; output_linear; router.layer), Granite's four multipliers: the same logits as the model they
 * were written from (F32; BF16 within its rounding), written back by nerve in that form; a fused
 * tensor missing or of another shape refused with its name. */
static void test_granitemoe_folders(void) {
    nv_engines_init(NULL, 0);
    nv_config c = moe_config(4, 2, 0);
    nv_config_set_granite(&c, 3.0, 0.2, 0.5, 2.0);
    nv_model m;
    T_CHECK(moe_model(&m, &c, 43) && nv_model_build_plans(&m, nv_engine_best_fp32()) == NV_OK, "%s", nv_errmsg());
    if (!m.params) return;
    const int n = 8, toks[8] = {1, 7, 30, 2, 59, 11, 11, 4};
    float *ref = malloc((size_t)n * c.vocab_size * sizeof(float));
    T_CHECK(t_forward_logits(&m, toks, n, ref), "%s", nv_errmsg());
    const char *dir = t_path("granitemoe"), *bdir = t_path("granitemoe-bf16");
    char cmd[1500], cfg[2048], cj[700], bcj[700];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' '%s'", dir, bdir);
    T_CHECK(system(cmd) == 0 && write_hf(&m, dir, MOE_GRANITE, 0) && write_hf(&m, bdir, MOE_GRANITE, 1), "cannot write the folders");
    moe_hf_config(&c, MOE_GRANITE, cfg, sizeof cfg);
    put_config(dir, cfg);
    put_config(bdir, cfg);
    snprintf(cj, sizeof cj, "%s/config.json", dir);
    snprintf(bcj, sizeof bcj, "%s/config.json", bdir);
    nv_config rc;
    T_CHECK(nv_model_read_config(cj, &rc) == NV_OK && !memcmp(&rc, &c, sizeof c), "granitemoe config: %s", nv_errmsg());
    check_file(cj, nv_engine_best_fp32(), ref, 0.0f, "granitemoe F32");
    check_file(bcj, nv_engine_best_fp32(), ref, 0.1f, "granitemoe BF16");
    /* written by nerve: granitemoe, its experts fused again */
    char out[640], bout[640], st[700];
    snprintf(out, sizeof out, "%s", t_path("granitemoe-out"));
    snprintf(bout, sizeof bout, "%s", t_path("granitemoe-out-bf16"));
    T_CHECK(nv_hf_save(&m, NULL, out, NV_HF_F32, NULL) == NV_OK && nv_hf_save(&m, NULL, bout, NV_HF_BF16, NULL) == NV_OK, "%s",
            nv_errmsg());
    snprintf(cj, sizeof cj, "%s/config.json", out);
    snprintf(bcj, sizeof bcj, "%s/config.json", bout);
    snprintf(st, sizeof st, "%s/model.safetensors", out);
    char *text = NULL, *weights = NULL;
    cJSON *j = nv_file_read_all(cj, &text, NULL) == NV_OK ? cJSON_Parse(text) : NULL;
    const cJSON *mt = cJSON_GetObjectItem(j, "model_type"), *ne = cJSON_GetObjectItem(j, "num_local_experts");
    T_CHECK(cJSON_IsString(mt) && !strcmp(mt->valuestring, "granitemoe") && cJSON_IsNumber(ne) && ne->valuedouble == 4,
            "config.json: %s", text ? text : nv_errmsg());
    T_CHECK(nv_file_read_all(st, &weights, NULL) == NV_OK && weights &&
                strstr(weights + 8, "\"model.layers.1.block_sparse_moe.input_linear.weight\":{\"dtype\":\"F32\",\"shape\":[4,128,64]") &&
                strstr(weights + 8, "\"model.layers.1.block_sparse_moe.output_linear.weight\":{\"dtype\":\"F32\",\"shape\":[4,64,64]") &&
                strstr(weights + 8, "\"model.layers.0.block_sparse_moe.router.layer.weight\":{\"dtype\":\"F32\",\"shape\":[4,64]") &&
                !strstr(weights + 8, "experts."),
            "the written experts are not fused");
    cJSON_Delete(j);
    free(text);
    free(weights);
    check_file(cj, nv_engine_best_fp32(), ref, 0.0f, "granitemoe F32 written");
    check_file(bcj, nv_engine_best_fp32(), ref, 0.1f, "granitemoe BF16 written");
    /* refused, naming the fused tensor: one missing (a folder of another layout), one of another shape */
    snprintf(cj, sizeof cj, "%s/config.json", dir);
    T_CHECK(write_hf(&m, dir, MOE_MIXTRAL, 0) && nv_model_read_config(cj, &rc) == NV_EFORMAT &&
                strstr(nv_errmsg(), "'model.layers.0.block_sparse_moe.input_linear.weight' is missing"),
            "per-expert tensors under granitemoe: %s", nv_errmsg());
    c.hidden_dim = 32;
    moe_hf_config(&c, MOE_GRANITE, cfg, sizeof cfg);
    put_config(dir, cfg);
    T_CHECK(write_hf(&m, dir, MOE_GRANITE, 0) && nv_model_read_config(cj, &rc) == NV_EFORMAT &&
                strstr(nv_errmsg(), "input_linear.weight' is not of shape [experts, 64, 64]"),
            "another width: %s", nv_errmsg());
    free(ref);
    nv_model_free(&m);
}

int main(void) {
    T_RUN(test_layer_matches_direct);
    T_RUN(test_identical_experts_are_dense);
    T_RUN(test_chunk_equals_tokens);
    T_RUN(test_gguf_round_trip);
    T_RUN(test_hf_folders);
    T_RUN(test_granitemoe_folders);
    T_RUN(test_refusals);
    return t_done();
}
