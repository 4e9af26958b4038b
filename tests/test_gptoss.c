/* OpenAI's gpt-oss (GGUF architecture gpt-oss) and llama.cpp's MXFP4 type: the forward against a
 * reference written from ggml's definition in doubles (attention sinks in each softmax's maximum and
 * sum, the projections' and experts' biases, the router's softmax over its chosen logits, SwiGLU-OAI
 * with its clamps, a window on every other layer, YaRN), token by token and a whole prompt at once;
 * the GGUF form written and read back (its tensor names, F32 exactly, MXFP4_MOE's types); MXFP4
 * blocks decoded as ggml decodes them, and served from their own values; harmony's end-of-generation
 * tokens; and what has no place for gpt-oss refusing it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "model/hf.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "serve/prefix.h"
#include "train/tmodel.h"
#include "bpe_write.h"
#include "forward_ref.h"
#include "gptoss_model.h"
#include "serve_util.h"
#include "t.h"

enum { T = 12 };

/* The logits after each of toks[0..n), from ggml's gpt-oss graph, in doubles. */
static void reference_logits(const nv_model *m, const int *toks, int n, float *out) {
    const nv_config *c = &m->config;
    const nv_weights *w = &m->w;
    const int d = c->dim, hd = c->head_dim, H = c->n_heads, KV = c->n_kv_heads, qd = H * hd, kvd = KV * hd, h = c->hidden_dim;
    const int E = c->n_experts, K = c->n_experts_used;
    double *x = calloc((size_t)n * d, sizeof(double)), *xn = malloc(sizeof(double) * (size_t)qd), *att = malloc(sizeof(double) * (size_t)qd);
    double *q = malloc(sizeof(double) * (size_t)n * qd), *k = malloc(sizeof(double) * (size_t)n * kvd), *v = malloc(sizeof(double) * (size_t)n * kvd);
    double *y = malloc(sizeof(double) * (size_t)d), *g = malloc(sizeof(double) * (size_t)h), *u = malloc(sizeof(double) * (size_t)h);
    double *sc = malloc(sizeof(double) * (size_t)n), *logit = malloc(sizeof(double) * (size_t)E), *acc = malloc(sizeof(double) * (size_t)d);
    const double mscale = 1.0 + 0.1 * log(c->yarn.factor); /* YaRN's: every cos and sin */
    for (int t = 0; t < n; t++)
        for (int i = 0; i < d; i++) x[(size_t)t * d + i] = w->tok_emb[(size_t)toks[t] * d + i];
    for (int l = 0; l < c->n_layers; l++) {
        const int window = l % 2 == 0 ? c->swa_window : 0; /* layers 0, 2, ...: llama.cpp's set_swa_pattern(2) */
        for (int t = 0; t < n; t++) {
            t_ref_rmsnorm(xn, x + (size_t)t * d, w->rms_att + (size_t)l * d, d, c->norm_eps);
            t_ref_affine(q + (size_t)t * qd, w->wq + (size_t)l * qd * d, w->bq + (size_t)l * qd, xn, qd, d);
            t_ref_affine(k + (size_t)t * kvd, w->wk + (size_t)l * kvd * d, w->bk + (size_t)l * kvd, xn, kvd, d);
            t_ref_affine(v + (size_t)t * kvd, w->wv + (size_t)l * kvd * d, w->bv + (size_t)l * kvd, xn, kvd, d);
            for (int hh = 0; hh < H + KV; hh++) { /* RoPE on this project's pairs (2i, 2i + 1), YaRN's divisors */
                double *vec = hh < H ? q + (size_t)t * qd + (size_t)hh * hd : k + (size_t)t * kvd + (size_t)(hh - H) * hd;
                for (int i = 0; i < hd; i += 2) {
                    const double a = t * pow(c->rope_theta, -(double)i / hd) / c->rope_factors[i / 2], v0 = vec[i], v1 = vec[i + 1];
                    vec[i] = mscale * (v0 * cos(a) - v1 * sin(a));
                    vec[i + 1] = mscale * (v0 * sin(a) + v1 * cos(a));
                }
            }
        }
        for (int t = 0; t < n; t++) {
            const int lo = window && t - window + 1 > 0 ? t - window + 1 : 0;
            for (int hh = 0; hh < H; hh++) {
                const double *qh = q + (size_t)t * qd + (size_t)hh * hd, sink = w->sinks[(size_t)l * H + hh];
                const int kh = hh / (H / KV);
                double mx = sink, sum = 0; /* the sink in the maximum and the sum, weighing no value */
                for (int s = lo; s <= t; s++) {
                    double dot = 0;
                    for (int i = 0; i < hd; i++) dot += qh[i] * k[(size_t)s * kvd + (size_t)kh * hd + i];
                    sc[s] = dot / sqrt((double)hd);
                    mx = fmax(mx, sc[s]);
                }
                for (int s = lo; s <= t; s++) sum += sc[s] = exp(sc[s] - mx);
                sum += exp(sink - mx);
                for (int i = 0; i < hd; i++) {
                    double o = 0;
                    for (int s = lo; s <= t; s++) o += sc[s] / sum * v[(size_t)s * kvd + (size_t)kh * hd + i];
                    att[(size_t)hh * hd + i] = o;
                }
            }
            double *xt = x + (size_t)t * d;
            t_ref_affine(y, w->wo + (size_t)l * d * qd, w->bo + (size_t)l * d, att, d, qd);
            for (int i = 0; i < d; i++) xt[i] += y[i];
            t_ref_rmsnorm(xn, xt, w->rms_ffn + (size_t)l * d, d, c->norm_eps);
            /* the router: biased logits, the K largest, a softmax over those K */
            t_ref_affine(logit, w->router + (size_t)l * E * d, w->router_b + (size_t)l * E, xn, E, d);
            int sel[8];
            double wt[8], mxl = -INFINITY, wsum = 0;
            for (int j = 0; j < K; j++) {
                sel[j] = -1;
                for (int e = 0; e < E; e++) {
                    int taken = 0;
                    for (int i = 0; i < j; i++) taken |= sel[i] == e;
                    if (!taken && (sel[j] < 0 || logit[e] > logit[sel[j]])) sel[j] = e;
                }
                mxl = fmax(mxl, logit[sel[j]]);
            }
            for (int j = 0; j < K; j++) wsum += wt[j] = exp(logit[sel[j]] - mxl);
            memset(acc, 0, sizeof(double) * (size_t)d);
            for (int j = 0; j < K; j++) {
                const size_t e = (size_t)l * E + (size_t)sel[j];
                t_ref_affine(g, w->w1 + e * h * d, w->b1 + e * h, xn, h, d);
                t_ref_affine(u, w->w3 + e * h * d, w->b3 + e * h, xn, h, d);
                for (int i = 0; i < h; i++) { /* SwiGLU-OAI: the gate clamped above at 7, the up at +-7, plus 1 */
                    const double gg = fmin(g[i], 7.0), uu = fmax(-7.0, fmin(u[i], 7.0));
                    g[i] = gg / (1 + exp(-1.702 * gg)) * (uu + 1);
                }
                t_ref_affine(y, w->w2 + e * d * h, w->b2 + e * d, g, d, h);
                for (int i = 0; i < d; i++) acc[i] += wt[j] / wsum * y[i];
            }
            for (int i = 0; i < d; i++) xt[i] += acc[i];
        }
    }
    for (int t = 0; t < n; t++) {
        t_ref_rmsnorm(xn, x + (size_t)t * d, w->rms_final, d, c->norm_eps);
        for (int r = 0; r < c->vocab_size; r++) {
            double s = 0;
            for (int i = 0; i < d; i++) s += (double)w->wcls[(size_t)r * d + i] * xn[i];
            out[(size_t)t * c->vocab_size + r] = (float)s;
        }
    }
    free(x), free(xn), free(att), free(q), free(k), free(v), free(y), free(g), free(u), free(sc), free(logit), free(acc);
}

static void tokens(int *toks, int n, int vocab) {
    for (int t = 0; t < n; t++) toks[t] = (t * 37 + 11) % vocab;
}

/* Its parts matter: the reference's logits move when a sink, a bias or a clamp is taken away. */
static double without(nv_model *m, float *part, size_t n, float value, const int *toks, const float *ref) {
    float *keep = malloc(n * sizeof(float)), *alt = malloc((size_t)T * m->config.vocab_size * sizeof(float));
    memcpy(keep, part, n * sizeof(float));
    for (size_t i = 0; i < n; i++) part[i] = value;
    reference_logits(m, toks, T, alt);
    memcpy(part, keep, n * sizeof(float));
    const double gap = t_logit_gap(alt, ref, (size_t)T * m->config.vocab_size);
    free(keep), free(alt);
    return gap;
}

static void test_forward_matches_reference(void) {
    nv_model m;
    if (!gptoss_model(&m, 5)) return;
    const nv_config *c = &m.config;
    T_CHECK(nv_model_build_plans(&m, NV_ENGINE_SCALAR) == NV_OK, "%s", nv_errmsg());
    const size_t V = (size_t)c->vocab_size;
    int toks[T];
    tokens(toks, T, c->vocab_size);
    float *ref = malloc(T * V * sizeof(float)), *one = malloc(T * V * sizeof(float)), *all = malloc(T * V * sizeof(float));
    reference_logits(&m, toks, T, ref);
    T_CHECK(t_forward_logits(&m, toks, T, one), "%s", nv_errmsg());
    nv_state s;
    T_CHECK(nv_state_init(&s, c, T, c->seq_len, 1) == NV_OK && nv_forward(&m, &s, toks, T, 0) == NV_OK, "%s", nv_errmsg());
    memcpy(all, s.logits, T * V * sizeof(float));
    nv_state_free(&s);
    const double gap1 = t_logit_gap(one, ref, T * V), gap2 = t_logit_gap(all, ref, T * V);
    T_CHECK(gap1 < 1e-5 && gap2 < 1e-5, "token by token %.3g, the prompt at once %.3g of the largest logit from the reference", gap1, gap2);
    /* each part changes the answer (so the agreement above is about them) */
    const size_t L = (size_t)c->n_layers, E = (size_t)c->n_experts, h = (size_t)c->hidden_dim, d = (size_t)c->dim;
    const double g_sink = without(&m, m.w.sinks, L * c->n_heads, -INFINITY, toks, ref), g_bo = without(&m, m.w.bo, L * d, 0, toks, ref),
                 g_rb = without(&m, m.w.router_b, L * E, 0, toks, ref), g_b1 = without(&m, m.w.b1, L * E * h, 0, toks, ref),
                 g_b2 = without(&m, m.w.b2, L * E * d, 0, toks, ref), g_b3 = without(&m, m.w.b3, L * E * h, 0, toks, ref);
    T_CHECK(g_sink > 1e-3 && g_bo > 1e-3 && g_rb > 1e-4 && g_b1 > 1e-3 && g_b2 > 1e-4 && g_b3 > 1e-3,
            "a part that changes nothing: sinks %.3g, output bias %.3g, router bias %.3g, gate %.3g, down %.3g, up biases %.3g", g_sink, g_bo, g_rb,
            g_b1, g_b2, g_b3);
    /* the window: positions past it on the windowed layers see less than the whole prompt */
    const int window = c->swa_window;
    m.config.swa_window = 1000;
    T_CHECK(t_forward_logits(&m, toks, T, all), "%s", nv_errmsg());
    m.config.swa_window = window;
    int same = 0, moved = 0;
    for (int t = 0; t < T; t++) {
        const int differ = memcmp(one + (size_t)t * V, all + (size_t)t * V, V * sizeof(float)) != 0;
        same += t < window && !differ, moved += t >= window && differ;
    }
    T_CHECK(same == window && moved == T - window, "the window: %d positions inside it kept, %d after it moved", same, moved);
    /* the prefix cache tells the windows apart (what a position's keys and values saw) */
    const uint64_t id = nv_prefix_model_id(&m, 16, NV_KV_F16);
    m.config.swa_window = window + 1;
    const uint64_t id_wider = nv_prefix_model_id(&m, 16, NV_KV_F16);
    m.config.swa_window = window, m.config.swa_period = 3;
    const uint64_t id_period = nv_prefix_model_id(&m, 16, NV_KV_F16);
    m.config.swa_period = 2;
    T_CHECK(id != id_wider && id != id_period && id == nv_prefix_model_id(&m, 16, NV_KV_F16), "the prefix cache's identity of the window");
    /* the fastest engine (bf16 or int8 products) stays near */
    const nv_engine_id fast = nv_engine_best();
    nv_model_free_plans(&m);
    T_CHECK(nv_model_build_plans(&m, fast) == NV_OK && t_forward_logits(&m, toks, T, all), "%s", nv_errmsg());
    const double gap3 = t_logit_gap(all, ref, T * V);
    T_CHECK(gap3 < (nv_engine_low_precision(fast) ? 5e-2 : 1e-5), "%s: %.3g of the largest logit from the reference", nv_engine_name(fast), gap3);
    free(ref), free(one), free(all);
    nv_model_free(&m);
}

static const nv_gguf_tensor *tensor(const nv_gguf *g, const char *name) { return nv_gguf_tensor_find(g, name); }

/* The relative RMS error of a against b. */
static double rel_rms(const float *a, const float *b, size_t n) {
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), s += (double)b[i] * b[i];
    return s > 0 ? sqrt(e / s) : 0;
}

/* Written as GGUF gpt-oss and read back: the same config and weights (F32), llama.cpp's names and
 * keys; MXFP4_MOE: the experts in MXFP4, the other matrices Q8_0, biases and sinks F32, file type 38,
 * and the model served from those blocks as from the same values in fp32. */
static void test_gguf_round_trip(void) {
    nv_model m, r;
    if (!gptoss_model(&m, 9)) return;
    /* a router of its usual size: with gptoss_model's (x 50, for batches whose rows must choose apart) an
       int8 engine's rounding of the attention's output flips choices, moving logits wholesale */
    for (int i = 0; i < m.config.n_layers * m.config.n_experts * m.config.dim; i++) m.w.router[i] /= 50.0f;
    const char *f32 = t_path("oss.gguf");
    T_CHECK(nv_gguf_save(&m, NULL, "oss", f32, NV_GGUF_F32, NULL, NULL) == NV_OK, "%s", nv_errmsg());
    nv_gguf g;
    T_CHECK(nv_gguf_open(f32, &g) == NV_OK, "%s", nv_errmsg());
    size_t an = 0;
    const char *arch = nv_gguf_string(&g, "general.architecture", &an);
    T_CHECK(arch && an == 7 && !memcmp(arch, "gpt-oss", 7) && nv_gguf_find(&g, "gpt-oss.expert_feed_forward_length") &&
                nv_gguf_find(&g, "gpt-oss.attention.sliding_window") && nv_gguf_find(&g, "gpt-oss.rope.scaling.factor"),
            "architecture and keys");
    static const char *const names[] = {"blk.0.attn_sinks.weight",    "blk.0.attn_output.bias",     "blk.0.post_attention_norm.weight",
                                        "blk.0.ffn_gate_inp.bias",    "blk.0.ffn_gate_exps.bias",   "blk.0.ffn_up_exps.bias",
                                        "blk.0.ffn_down_exps.bias",   "blk.2.ffn_down_exps.weight", "blk.1.attn_q.bias",
                                        "output.weight"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) T_CHECK(tensor(&g, names[i]) != NULL, "no %s", names[i]);
    const nv_gguf_tensor *gb = tensor(&g, "blk.0.ffn_gate_exps.bias");
    T_CHECK(gb && gb->n_dims == 2 && gb->dims[0] == 64 && gb->dims[1] == 4 && !tensor(&g, "blk.0.ffn_norm.weight"), "shapes and names");
    nv_gguf_close(&g);
    T_CHECK(nv_model_load(f32, &r) == NV_OK && r.config.gpt_oss && r.config.swa_window == 5 && r.config.swa_period == 2 &&
                r.n_params == m.n_params && !memcmp(r.params, m.params, m.n_params * sizeof(float)),
            "read back: %s", nv_errmsg());
    nv_model_free(&r);
    /* MXFP4_MOE */
    const char *mx = t_path("oss-mxfp4.gguf");
    T_CHECK(nv_gguf_save(&m, NULL, "oss", mx, NV_GGUF_MXFP4_MOE, NULL, NULL) == NV_OK && nv_gguf_open(mx, &g) == NV_OK, "%s", nv_errmsg());
    const nv_gguf_tensor *ge = tensor(&g, "blk.1.ffn_gate_exps.weight"), *wq = tensor(&g, "blk.1.attn_q.weight"), *sk = tensor(&g, "blk.1.attn_sinks.weight"),
                         *eb = tensor(&g, "blk.1.ffn_up_exps.bias"), *rt = tensor(&g, "blk.1.ffn_gate_inp.weight");
    const nv_gguf_kv *ft = nv_gguf_find(&g, "general.file_type");
    uint32_t ftv = 0;
    if (ft) memcpy(&ftv, ft->val, 4);
    T_CHECK(ge && ge->type == 39 && wq && wq->type == 8 && sk && sk->type == 0 && eb && eb->type == 0 && rt && rt->type == 0 && ftv == 38,
            "MXFP4_MOE's types: experts %u, attn_q %u, sinks %u, bias %u, router %u, file type %u", ge ? ge->type : 99, wq ? wq->type : 99,
            sk ? sk->type : 99, eb ? eb->type : 99, rt ? rt->type : 99, ftv);
    nv_gguf_close(&g);
    /* the blocks' own values: fp32 plans over them (a full load) against plans made from the blocks */
    nv_model full, quant;
    T_CHECK(nv_model_load(mx, &full) == NV_OK && nv_model_load_quantized(mx, &quant) == NV_OK, "%s", nv_errmsg());
    /* the values: FP4 experts within what 16 levels a block allow (~11% here), Q8_0 within 1%, the rest exact */
    const size_t L = (size_t)m.config.n_layers, E = (size_t)m.config.n_experts, h = (size_t)m.config.hidden_dim, d = (size_t)m.config.dim;
    const double e_w1 = rel_rms(full.w.w1, m.w.w1, L * E * h * d), e_w2 = rel_rms(full.w.w2, m.w.w2, L * E * h * d),
                 e_wq = rel_rms(full.w.wq, m.w.wq, L * d * d), e_b1 = rel_rms(full.w.b1, m.w.b1, L * E * h),
                 e_sk = rel_rms(full.w.sinks, m.w.sinks, L * m.config.n_heads), e_rt = rel_rms(full.w.router, m.w.router, L * E * d);
    T_CHECK(e_w1 > 0.03 && e_w1 < 0.15 && e_w2 > 0.03 && e_w2 < 0.15 && e_wq > 1e-4 && e_wq < 0.01 && e_b1 == 0 && e_sk == 0 && e_rt == 0,
            "MXFP4_MOE's errors: w1 %.3g, w2 %.3g, wq %.3g, gate bias %.3g, sinks %.3g, router %.3g", e_w1, e_w2, e_wq, e_b1, e_sk, e_rt);
    const size_t V = (size_t)m.config.vocab_size;
    int toks[T];
    tokens(toks, T, m.config.vocab_size);
    float *a = malloc(T * V * sizeof(float)), *b = malloc(T * V * sizeof(float));
    const nv_engine_id e = nv_engine_best_fp32();
    T_CHECK(nv_model_build_plans(&full, e) == NV_OK && nv_model_build_plans(&quant, e) == NV_OK && t_forward_logits(&full, toks, T, a) &&
                t_forward_logits(&quant, toks, T, b),
            "%s", nv_errmsg());
    T_CHECK(!memcmp(a, b, T * V * sizeof(float)), "%s: block-quantized plans differ from fp32 plans of the same values", nv_engine_name(e));
    /* on an int8 engine the blocks stay their values (FP4 indices looked up), the activations quantized per block */
    const nv_engine_id lo = nv_engine_best();
    nv_model_free_plans(&quant);
    T_CHECK(nv_model_build_plans(&quant, lo) == NV_OK && t_forward_logits(&quant, toks, T, b), "%s", nv_errmsg());
    const double lo_gap = t_logit_gap(b, a, T * V);
    T_CHECK(lo_gap < (nv_engine_low_precision(lo) ? 5e-2 : 1e-6), "%s over the blocks: %.3g of the largest logit from fp32 plans", nv_engine_name(lo),
            lo_gap);
    free(a), free(b);
    nv_model_free(&full), nv_model_free(&quant);
    nv_model_free(&m);
}

/* MXFP4 blocks decoded as ggml's dequantize_row_mxfp4: value j the low nibble of byte j, j + 16 the
 * high one, each kvalues_mxfp4[index] x 2^(e - 128) (e = 0 a denormal scale, exact). */
static void test_mxfp4_blocks(void) {
    static const float kv[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    const uint8_t exps[] = {130, 127, 0, 1, 200};
    for (size_t xi = 0; xi < sizeof exps; xi++) {
        uint8_t blk[17];
        blk[0] = exps[xi];
        for (int j = 0; j < 16; j++) blk[1 + j] = (uint8_t)(j | ((15 - j) << 4));
        float y[32];
        T_CHECK(nv_gguf_dequant(39, blk, 32, y) == NV_OK, "%s", nv_errmsg());
        const float d = ldexpf(1.0f, (int)exps[xi] - 128);
        int ok = 1;
        for (int j = 0; j < 16; j++) ok &= y[j] == kv[j] * d && y[j + 16] == kv[15 - j] * d;
        T_CHECK(ok, "e %u: y[1] %g (want %g), y[16] %g (want %g)", exps[xi], (double)y[1], (double)(kv[1] * d), (double)y[16], (double)(kv[15] * d));
    }
}

/* harmony: an answer goes on past a message's <|end|> and ends at <|return|> or <|call|>; the
 * messages' markers are text of the answer (where the chat parser reads channels). */
static void test_harmony_tokens(void) {
    const char *path = t_path("harmony.gguf");
    const vocab_opts o = {.pre = "gpt-4o", .bos = -1, .eos = -1, .add_bos = -1, .drop_byte = -1, .fim = 5};
    T_CHECK(write_vocab(path, &o) == 0, "write %s", path);
    nv_tokenizer *tok = NULL;
    T_CHECK(nv_tokenizer_load(path, 0, &tok) == NV_OK, "%s", nv_errmsg());
    if (!tok) return;
    const int start = nv_tokenizer_lookup(tok, "<|start|>"), channel = nv_tokenizer_lookup(tok, "<|channel|>"),
              end = nv_tokenizer_lookup(tok, "<|end|>"), ret = nv_tokenizer_lookup(tok, "<|return|>"), call = nv_tokenizer_lookup(tok, "<|call|>");
    T_CHECK(start >= 0 && channel >= 0 && end >= 0 && ret >= 0 && call >= 0, "the markers' ids");
    T_CHECK(nv_tokenizer_is_eog(tok, ret) && nv_tokenizer_is_eog(tok, call) && !nv_tokenizer_is_eog(tok, end) && !nv_tokenizer_is_eog(tok, channel),
            "end of generation: <|return|> %d, <|call|> %d, <|end|> %d", nv_tokenizer_is_eog(tok, ret), nv_tokenizer_is_eog(tok, call),
            nv_tokenizer_is_eog(tok, end));
    const char *ch = nv_tokenizer_decode(tok, 0, channel), *en = nv_tokenizer_decode(tok, 0, end);
    T_CHECK(ch && !strcmp(ch, "<|channel|>") && en && !strcmp(en, "<|end|>"), "the markers as text: '%s', '%s'", ch ? ch : "", en ? en : "");
    int *ids = NULL, n = 0;
    T_CHECK(nv_tokenizer_encode(tok, "<|start|>a<|channel|>final<|message|>x<|end|>", 0, 0, &ids, &n) == NV_OK && n >= 6 && ids[0] == start &&
                ids[n - 1] == end,
            "the markers in a prompt: %d ids", n);
    free(ids);
    nv_tokenizer_free(tok);
}

/* Served with a harmony vocabulary and a harmony-style template (the channels' markers and its
 * generation prompt): a response format's JSON comes in the final channel and reaches content alone,
 * a required tool call reaches tool_calls, and the answers end at <|return|>. */
static void test_serve_harmony(void) {
    const char *vocab = t_path("harmony-vocab.gguf"), *model = t_path("harmony-oss.gguf");
    const vocab_opts o = {.pre = "gpt-4o", .bos = -1, .eos = N_TOKENS + 4 /* <|return|> */, .add_bos = -1, .drop_byte = -1, .fim = 5};
    nv_tokenizer *tok = NULL;
    nv_model m;
    T_CHECK(write_vocab(vocab, &o) == 0 && nv_tokenizer_load(vocab, 0, &tok) == NV_OK, "%s", nv_errmsg());
    if (!tok || !gptoss_model_of(&m, 13, nv_tokenizer_vocab_size(tok))) return;
    /* (a few lines in harmony's shape, not gpt-oss's own template: its channels named, the assistant's prompt open) */
    static const char tmpl[] = "{#- channels: <|channel|>analysis, commentary, final -#}"
                               "{%- for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor -%}"
                               "{%- if add_generation_prompt %}<|start|>assistant{% endif -%}";
    T_CHECK(nv_gguf_save(&m, tok, "oss", model, NV_GGUF_F32, tmpl, NULL) == NV_OK, "%s", nv_errmsg());
    nv_tokenizer_free(tok);
    nv_model_free(&m);
    server s;
    if (!server_spawn(&s, "harmony", NULL, NULL, model, NULL, "--engine scalar", 30)) {
        T_CHECK(0, "the server did not start");
        return;
    }
    int status = 0;
    cJSON *r = post_json_status(s.port, "/v1/chat/completions",
                                "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":150,\"temperature\":0,\"thinking_token_budget\":5,"
                                "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":\"object\","
                                "\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"],\"additionalProperties\":false}}}}",
                                &status);
    const cJSON *ch = r ? cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0) : NULL, *msg = cJSON_GetObjectItem(ch, "message");
    const char *content = cJSON_GetStringValue(cJSON_GetObjectItem(msg, "content")), *fin = cJSON_GetStringValue(cJSON_GetObjectItem(ch, "finish_reason"));
    cJSON *json = content ? cJSON_Parse(content) : NULL;
    T_CHECK(status == 200 && json && cJSON_IsNumber(cJSON_GetObjectItem(json, "a")) && !strstr(content, "<|") && fin && !strcmp(fin, "stop"),
            "a response format: %d, content '%s', finish %s", status, content ? content : "", fin ? fin : "");
    cJSON_Delete(json);
    cJSON_Delete(r);
    r = post_json_status(s.port, "/v1/chat/completions",
                         "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"}],\"max_tokens\":220,\"temperature\":0,\"thinking_token_budget\":5,\"tool_choice\":\"required\","
                         "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
                         "\"properties\":{},\"additionalProperties\":false}}}]}",
                         &status);
    ch = r ? cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0) : NULL, msg = cJSON_GetObjectItem(ch, "message");
    const cJSON *call = cJSON_GetArrayItem(cJSON_GetObjectItem(msg, "tool_calls"), 0);
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(call, "function"), "name"));
    T_CHECK(status == 200 && name && !strcmp(name, "get_weather"), "a required tool call: %d, %s", status, r ? cJSON_PrintUnformatted(r) : "");
    cJSON_Delete(r);
    T_CHECK(server_stop_within(&s, 10) == 0, "the server's exit");
}

/* What has no place for gpt-oss refuses it: training, llama2.c's format, Hugging Face folders. */
static void test_refusals(void) {
    nv_model m;
    if (!gptoss_model(&m, 4)) return;
    nv_tmodel tm;
    T_CHECK(nv_tmodel_init(&tm, &m.config, m.params, 1, 1, 8, NV_ENGINE_SCALAR) == NV_EUNSUPPORTED && strstr(nv_errmsg(), "gpt-oss"),
            "training: %s", nv_errmsg());
    T_CHECK(nv_model_save_v1(&m, t_path("oss.bin")) == NV_EUNSUPPORTED && strstr(nv_errmsg(), "gpt-oss"), "llama2.c: %s", nv_errmsg());
    char dir[700];
    snprintf(dir, sizeof dir, "%s/oss_hf", t_tmpdir());
    T_CHECK(nv_hf_save(&m, NULL, dir, NV_HF_F32, NULL) == NV_EUNSUPPORTED && strstr(nv_errmsg(), "gpt-oss"), "Hugging Face: %s", nv_errmsg());
    nv_model_free(&m);
}

int main(void) {
    nv_engines_init(NULL, 0);
    T_RUN(test_forward_matches_reference);
    T_RUN(test_gguf_round_trip);
    T_RUN(test_mxfp4_blocks);
    T_RUN(test_harmony_tokens);
    T_RUN(test_refusals);
    T_RUN(test_serve_harmony);
    return t_done();
}
