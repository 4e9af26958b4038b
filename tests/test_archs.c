/* Architectures beyond llama's block, for inference. The Gemma family (GGUF gemma, gemma2, gemma3):
 * GELU gating, embeddings times sqrt(dim); Gemma 2 and 3's sliding window (Gemma 3's windowed layers
 * with their own RoPE base), RMSNorm after the attention and after the FFN, soft-capped logits (and
 * Gemma 2's soft-capped scores); Gemma's vocabulary layout (BOS 2, EOS 1, byte tokens past the
 * specials, no dummy prefix) and chat template. SmolLM3 (smollm3): llama's block with every fourth
 * layer unrotated. Granite (granite, granitemoe): llama's block with embeddings, scores, each branch
 * into the residual and the logits scaled by multipliers of its own. Ministral 3 (mistral3): llama's
 * block, YaRN, the queries scaled by a temperature growing with their position. Partial rotation (Phi-4-mini's
 * RoPE on the first values of each head only, written as phi3; and beside Qwen2's biases, as qwen2). The forward (token by token and a whole prompt at once) is checked against a
 * plain reference written here from the definition; a GGUF file written and read back gives the
 * same config and logits; the formats without these parts refuse a Gemma model; training's forward
 * gives the reference's loss, and both fine-tune and are written back as their own architecture. */
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "model/forward.h"
#include "model/gguf.h"
#include "model/hf.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "base/buf.h"
#include "train/tmodel.h"
#include "serve/chat.h"
#include "forward_ref.h"
#include "gguf_write.h"
#include "serve_util.h"
#include "t.h"

#define T 24 /* positions: several windows' worth */

/* A small config of Gemma generation `gen` (1, 2, 3), SmolLM3's block (gen 4), Granite's (gen 5) or partial
 * rotation (gen 8: 10 of 16 values, LongRoPE's attention factor, query, key and value biases; gen 9:
 * Phi-4-mini's, llama's block with LongRoPE's divisors, one per rotated pair): GQA, head size 16
 * (q_dim 64 != dim 32), linearly scaled RoPE (as Gemma 3 4B+). Gemma: GELU, scaled embeddings.
 * Gemma 2 and 3: post-norms, a window of 5 with every second layer global (the loaders' patterns:
 * Gemma 2's every other layer, Gemma 3's five of six: nv_config.swa_period), soft-capped logits;
 * Gemma 2: soft-capped scores; Gemma 3: QK-norm, the windowed layers' own RoPE base. SmolLM3: the
 * fourth layer unrotated. Granite: its four multipliers (a score factor that is no power of two). */
static nv_config gemma_config(int gen) {
    nv_config c = {32, 48, 4, 4, 2, 16, 67, 64, 1000000.0f, 1e-6f, 1, gen == 3, 0, {0}, 0, NV_CONFIG_PLAIN};
    if (gen == 12) { /* Ministral 3 (mistral3): llama's block, YaRN whose cos and sin keep their size, the queries' temperature from position 8 */
        nv_rope_yarn y = {.factor = 4.0f, .orig_ctx = 8, .beta_fast = 32.0f, .beta_slow = 1.0f, .attn_factor = 1.0f};
        T_CHECK(nv_config_rope_yarn(&c, &y) == NV_OK, "%s", nv_errmsg());
        c.attn_temp_scale = 3.0f, c.attn_temp_len = 8, c.arch_mistral3 = 1; /* (large: the queries change by 3x and more) */
        return c;
    }
    if (gen >= 10) { /* OLMo 2: norms after the branches only, QK-norm over whole projections; OLMo 3: its window too */
        c.qk_norm = NV_QK_NORM_WHOLE, c.post_norms = 1, c.no_pre_norms = 1, c.shared_classifier = 0;
        if (gen == 11) c.swa_window = 5, c.swa_period = 2, c.rope_theta_swa = c.rope_theta;
        nv_config_rope_linear(&c, 2.0f);
        return c;
    }
    if (gen == 4 || gen == 5 || gen >= 8) {
        if (gen == 4) c.nope_period = 4;
        else if (gen >= 8) c.rope_dim = 10, c.rope_attn = 1.25f, c.qkv_bias = gen == 8; /* the divisors below: one per rotated pair */
        else nv_config_set_granite(&c, 12.0, 0.1, 0.22, 8.0);
        nv_config_rope_linear(&c, 2.0f);
        for (int i = 0; gen == 9 && i < c.n_rope_factors; i++) c.rope_factors[i] = 1.0f + 0.5f * (float)i; /* LongRoPE's, uneven */
        return c;
    }
    c.ffn_gelu = 1;
    c.emb_scale = sqrtf(32.0f);
    if (gen >= 2) c.post_norms = 1, c.swa_window = 5, c.swa_period = 2, c.logit_softcap = 3.0f;
    if (gen == 2) c.attn_softcap = 0.5f; /* small enough to bend this model's scores */
    if (gen == 3) c.rope_theta_swa = 10000.0f;
    nv_config_rope_linear(&c, 2.0f);
    return c;
}

/* A model of c with random weights and norms that are not all ones. */
static int gemma_model(nv_model *m, const nv_config *c, uint64_t seed) {
    T_CHECK(nv_model_alloc(m, c) == NV_OK, "%s", nv_errmsg());
    if (!m->params) return 0;
    nv_model_init_random(m, seed);
    const int L = c->n_layers, d = c->dim;
    nv_weights *w = &m->w;
    for (int i = 0; i < L * d; i++) {
        if (w->rms_att) w->rms_att[i] = 0.8f + 0.01f * (float)(i % 37), w->rms_ffn[i] = 1.2f - 0.01f * (float)(i % 29);
        if (c->post_norms) w->post_att[i] = 0.5f + 0.02f * (float)(i % 31), w->post_ffn[i] = 0.7f + 0.015f * (float)(i % 23);
    }
    for (int i = 0; c->qk_norm && i < L * nv_config_q_norm_len(c); i++) w->q_norm[i] = 0.6f + 0.05f * (float)(i % 13);
    for (int i = 0; c->qk_norm && i < L * nv_config_k_norm_len(c); i++) w->k_norm[i] = 1.4f - 0.04f * (float)(i % 11);
    for (int i = 0; c->qkv_bias && i < L * nv_config_q_dim(c); i++) w->bq[i] = 0.05f * (float)(i % 17 - 8);
    for (int i = 0; c->qkv_bias && i < L * nv_config_kv_dim(c); i++) w->bk[i] = 0.04f * (float)(i % 13 - 6), w->bv[i] = 0.03f * (float)(i % 11 - 5);
    for (int i = 0; i < c->vocab_size * d; i++) w->tok_emb[i] *= 20.0f; /* logits large enough for the cap to bend */
    return 1;
}

/* The model's logits after each of toks[0..n), straight from the definition, in doubles. */
static void reference_logits(const nv_model *m, const int *toks, int n, float *out) {
    const nv_config *c = &m->config;
    const nv_weights *w = &m->w;
    const int d = c->dim, hd = c->head_dim, H = c->n_heads, KV = c->n_kv_heads, qd = H * hd, kvd = KV * hd, h = c->hidden_dim;
    double *x = calloc((size_t)n * d, sizeof(double)), *xn = malloc(sizeof(double) * (size_t)(d > qd ? d : qd));
    double *q = malloc(sizeof(double) * (size_t)n * qd), *k = malloc(sizeof(double) * (size_t)n * kvd), *v = malloc(sizeof(double) * (size_t)n * kvd);
    double *att = malloc(sizeof(double) * (size_t)qd), *y = malloc(sizeof(double) * (size_t)(d > h ? d : h)), *g = malloc(sizeof(double) * (size_t)h),
           *u = malloc(sizeof(double) * (size_t)h), *sc = malloc(sizeof(double) * (size_t)n);
    for (int t = 0; t < n; t++)
        for (int i = 0; i < d; i++) x[(size_t)t * d + i] = (double)w->tok_emb[(size_t)toks[t] * d + i] * (c->emb_scale != 0.0f ? c->emb_scale : 1);
    const double rs = c->residual_scale != 0.0f ? c->residual_scale : 1, ldiv = c->logit_div != 0.0f ? c->logit_div : 1;
    for (int l = 0; l < c->n_layers; l++) {
        const int windowed = c->swa_window && l % c->swa_period != c->swa_period - 1, own_base = windowed && c->rope_theta_swa != 0.0f;
        for (int t = 0; t < n; t++) {
            if (c->no_pre_norms) memcpy(xn, x + (size_t)t * d, (size_t)d * sizeof(double)); /* OLMo 2: no norm before */
            else t_ref_rmsnorm(xn, x + (size_t)t * d, w->rms_att + (size_t)l * d, d, c->norm_eps);
            t_ref_affine(q + (size_t)t * qd, w->wq + (size_t)l * qd * d, NULL, xn, qd, d);
            t_ref_affine(k + (size_t)t * kvd, w->wk + (size_t)l * kvd * d, NULL, xn, kvd, d);
            t_ref_affine(v + (size_t)t * kvd, w->wv + (size_t)l * kvd * d, NULL, xn, kvd, d);
            for (int i = 0; c->qkv_bias && i < qd; i++) q[(size_t)t * qd + i] += w->bq[(size_t)l * qd + i];
            for (int i = 0; c->qkv_bias && i < kvd; i++)
                k[(size_t)t * kvd + i] += w->bk[(size_t)l * kvd + i], v[(size_t)t * kvd + i] += w->bv[(size_t)l * kvd + i];
            /* RoPE on the first rot values of a head (partial rotation), every cos and sin times ms */
            const int rot = c->rope_dim ? c->rope_dim : hd;
            const double ms = c->rope_attn != 0.0f ? c->rope_attn : 1.0;
            if (c->qk_norm == NV_QK_NORM_WHOLE) { /* OLMo 2: over the whole projections */
                t_ref_rmsnorm(q + (size_t)t * qd, q + (size_t)t * qd, w->q_norm + (size_t)l * qd, qd, c->norm_eps);
                t_ref_rmsnorm(k + (size_t)t * kvd, k + (size_t)t * kvd, w->k_norm + (size_t)l * kvd, kvd, c->norm_eps);
            }
            for (int hh = 0; hh < H + KV; hh++) { /* QK-norm per head, then RoPE on pairs (2i, 2i+1) */
                double *vec = hh < H ? q + (size_t)t * qd + (size_t)hh * hd : k + (size_t)t * kvd + (size_t)(hh - H) * hd;
                if (c->qk_norm == 1) t_ref_rmsnorm(vec, vec, (hh < H ? w->q_norm : w->k_norm) + (size_t)l * hd, hd, c->norm_eps);
                for (int i = 0; i < rot && (!c->nope_period || (l + 1) % c->nope_period); i += 2) {
                    const double theta = own_base ? c->rope_theta_swa : c->rope_theta;
                    const double div = own_base ? 1.0 : c->rope_factors[i / 2];
                    const double a = t * pow(theta, -(double)i / rot) / div, v0 = vec[i], v1 = vec[i + 1];
                    vec[i] = ms * (v0 * cos(a) - v1 * sin(a));
                    vec[i + 1] = ms * (v0 * sin(a) + v1 * cos(a));
                }
                /* Ministral 3's queries: times 1 + beta ln(1 + floor(t / length)) */
                for (int i = 0; hh < H && c->attn_temp_scale != 0.0f && i < hd; i++) vec[i] *= 1.0 + c->attn_temp_scale * log(1.0 + floor((double)t / c->attn_temp_len));
            }
        }
        for (int t = 0; t < n; t++) {
            const int lo = windowed && t - c->swa_window + 1 > 0 ? t - c->swa_window + 1 : 0;
            for (int hh = 0; hh < H; hh++) {
                const double *qh = q + (size_t)t * qd + (size_t)hh * hd;
                const int kh = hh / (H / KV);
                double mx = -INFINITY, sum = 0;
                for (int s = lo; s <= t; s++) {
                    double dot = 0;
                    for (int i = 0; i < hd; i++) dot += qh[i] * k[(size_t)s * kvd + (size_t)kh * hd + i];
                    sc[s] = dot / nv_config_attn_div(c);
                    if (c->attn_softcap != 0.0f) sc[s] = c->attn_softcap * tanh(sc[s] / c->attn_softcap);
                    mx = fmax(mx, sc[s]);
                }
                for (int s = lo; s <= t; s++) sum += sc[s] = exp(sc[s] - mx);
                for (int i = 0; i < hd; i++) {
                    double o = 0;
                    for (int s = lo; s <= t; s++) o += sc[s] / sum * v[(size_t)s * kvd + (size_t)kh * hd + i];
                    att[(size_t)hh * hd + i] = o;
                }
            }
            double *xt = x + (size_t)t * d;
            t_ref_affine(y, w->wo + (size_t)l * d * qd, NULL, att, d, qd);
            if (c->post_norms) t_ref_rmsnorm(y, y, w->post_att + (size_t)l * d, d, c->norm_eps);
            for (int i = 0; i < d; i++) xt[i] += rs * y[i];
            if (c->no_pre_norms) memcpy(xn, xt, (size_t)d * sizeof(double));
            else t_ref_rmsnorm(xn, xt, w->rms_ffn + (size_t)l * d, d, c->norm_eps);
            t_ref_affine(g, w->w1 + (size_t)l * h * d, NULL, xn, h, d);
            t_ref_affine(u, w->w3 + (size_t)l * h * d, NULL, xn, h, d);
            for (int i = 0; i < h; i++) /* GELU, tanh form; else SiLU */
                g[i] = (c->ffn_gelu ? 0.5 * g[i] * (1 + tanh(sqrt(2 / M_PI) * (g[i] + 0.044715 * g[i] * g[i] * g[i]))) : g[i] / (1 + exp(-g[i]))) * u[i];
            t_ref_affine(y, w->w2 + (size_t)l * d * h, NULL, g, d, h);
            if (c->post_norms) t_ref_rmsnorm(y, y, w->post_ffn + (size_t)l * d, d, c->norm_eps);
            for (int i = 0; i < d; i++) xt[i] += rs * y[i];
        }
    }
    for (int t = 0; t < n; t++) {
        t_ref_rmsnorm(xn, x + (size_t)t * d, w->rms_final, d, c->norm_eps);
        for (int r = 0; r < c->vocab_size; r++) {
            double s = 0;
            for (int i = 0; i < d; i++) s += (double)w->wcls[(size_t)r * d + i] * xn[i];
            s /= ldiv;
            out[(size_t)t * c->vocab_size + r] = (float)(c->logit_softcap != 0.0f ? c->logit_softcap * tanh(s / c->logit_softcap) : s);
        }
    }
    free(x), free(xn), free(q), free(k), free(v), free(att), free(y), free(g), free(u), free(sc);
}

static void tokens(int *toks, int n, int vocab) {
    for (int t = 0; t < n; t++) toks[t] = (t * 37 + 11) % vocab;
}

static void forward_matches_reference(int gen) {
    nv_config c = gemma_config(gen);
    nv_model m;
    if (!gemma_model(&m, &c, 5)) return;
    T_CHECK(nv_model_build_plans(&m, NV_ENGINE_SCALAR) == NV_OK, "%s", nv_errmsg());
    const size_t V = (size_t)c.vocab_size;
    int toks[T];
    tokens(toks, T, c.vocab_size);
    float *ref = malloc(T * V * sizeof(float)), *one = malloc(T * V * sizeof(float)), *all = malloc(T * V * sizeof(float));
    reference_logits(&m, toks, T, ref);
    /* one position at a time (the decode path) and the whole prompt at once (rows attending together) */
    T_CHECK(t_forward_logits(&m, toks, T, one), "%s", nv_errmsg());
    nv_state s;
    T_CHECK(nv_state_init(&s, &c, T, c.seq_len, 1) == NV_OK && nv_forward(&m, &s, toks, T, 0) == NV_OK, "%s", nv_errmsg());
    memcpy(all, s.logits, T * V * sizeof(float));
    nv_state_free(&s);
    double gap1 = t_logit_gap(one, ref, T * V), gap2 = t_logit_gap(all, ref, T * V);
    T_CHECK(gap1 < 1e-5 && gap2 < 1e-5, "kind %d: token by token %.3g, the prompt at once %.3g of the largest logit from the reference", gen,
            gap1, gap2);
    if (!c.swa_window) {
        free(ref), free(one), free(all);
        nv_model_free(&m);
        return;
    }
    /* the window alone matters: wider than the prompt, the positions within the first window keep
       their logits bit for bit and every later one moves */
    m.config.swa_window = 1000;
    T_CHECK(t_forward_logits(&m, toks, T, all), "%s", nv_errmsg());
    m.config = c;
    int same = 0, moved = 0;
    for (int t = 0; t < T; t++) {
        const int differ = memcmp(one + t * V, all + t * V, V * sizeof(float)) != 0;
        same += t < c.swa_window && !differ;
        moved += t >= c.swa_window && differ;
    }
    T_CHECK(same == c.swa_window && moved == T - c.swa_window, "kind %d: %d of %d positions inside the window kept, %d of %d after it moved",
            gen, same, c.swa_window, moved, T - c.swa_window);
    free(ref), free(one), free(all);
    nv_model_free(&m);
}

/* The kinds the tests below run: the Gemma generations, SmolLM3, Granite, partial rotation, OLMo 2 and 3, Ministral 3. */
static const int kinds[] = {1, 2, 3, 4, 5, 8, 9, 10, 11, 12};
#define N_KINDS (int)(sizeof kinds / sizeof kinds[0])

static void test_forward_matches_reference(void) {
    for (int i = 0; i < N_KINDS; i++) forward_matches_reference(kinds[i]);
}

/* 1 when the GGUF file at path names architecture arch. */
static int gguf_arch_is(const char *path, const char *arch) {
    nv_gguf g;
    if (nv_gguf_open(path, &g) != NV_OK) return 0;
    size_t an = 0;
    const char *a_s = nv_gguf_string(&g, "general.architecture", &an);
    const int same = a_s && an == strlen(arch) && !memcmp(a_s, arch, an);
    nv_gguf_close(&g);
    return same;
}

/* 1 when the GGUF file at path names generation gen's architecture. */
static int written_as(const char *path, int gen) {
    static const char *const arch[] = {"", "gemma", "gemma2", "gemma3", "smollm3", "granite", "", "", "qwen2", "phi3", "olmo2", "olmo2", "mistral3"};
    return gguf_arch_is(path, arch[gen]);
}

/* A file written as gemma, gemma2 or gemma3 reads back the same model: the same config and the same
 * logits, bit for bit (the query and key rows go to llama.cpp's rotation order and back); block-
 * quantized, close. */
static void gguf_round_trip(int gen) {
    nv_config c = gemma_config(gen);
    if (gen == 3) c.swa_period = 6; /* the loader's pattern: five windowed layers, then one global */
    nv_model m;
    if (!gemma_model(&m, &c, 7)) return;
    T_CHECK(nv_model_build_plans(&m, NV_ENGINE_SCALAR) == NV_OK, "%s", nv_errmsg());
    char path[700], q8[700];
    snprintf(path, sizeof path, "%s", t_path("g.gguf"));
    snprintf(q8, sizeof q8, "%s", t_path("g-q8.gguf"));
    T_CHECK(nv_gguf_save(&m, NULL, "g", path, NV_GGUF_F32, NULL, NULL) == NV_OK, "kind %d: %s", gen, nv_errmsg());
    T_CHECK(nv_gguf_save(&m, NULL, "g", q8, NV_GGUF_Q8_0, NULL, NULL) == NV_OK, "kind %d: %s", gen, nv_errmsg());
    T_CHECK(written_as(path, gen), "kind %d written as another architecture", gen);
    nv_model r, rq;
    T_CHECK(nv_model_load(path, &r) == NV_OK, "%s", nv_errmsg());
    T_CHECK(!memcmp(&r.config, &c, sizeof c), "kind %d: the config read back differs (window %d period %d theta %g caps %g %g)", gen,
            r.config.swa_window, r.config.swa_period, (double)r.config.rope_theta_swa, (double)r.config.logit_softcap,
            (double)r.config.attn_softcap);
    T_CHECK(nv_model_build_plans(&r, NV_ENGINE_SCALAR) == NV_OK, "%s", nv_errmsg());
    const size_t V = (size_t)c.vocab_size;
    int toks[T];
    tokens(toks, T, c.vocab_size);
    float *a = malloc(T * V * sizeof(float)), *b = malloc(T * V * sizeof(float)), *ref = malloc(T * V * sizeof(float));
    T_CHECK(t_forward_logits(&m, toks, T, a) && t_forward_logits(&r, toks, T, b), "%s", nv_errmsg());
    T_CHECK(!memcmp(a, b, T * V * sizeof(float)), "kind %d: the file's logits differ from the model's", gen);
    reference_logits(&m, toks, T, ref);
    T_CHECK(t_logit_gap(a, ref, T * V) < 1e-5, "kind %d (the loader's pattern): %.3g from the reference", gen, t_logit_gap(a, ref, T * V));
    if (gen == 11) { /* OLMo 3's flags per layer (as llama.cpp's converter writes them): another period read, an irregular list refused */
        char *bytes = NULL;
        size_t len = 0;
        static const char key[] = "olmo2.attention.sliding_window_pattern";
        T_CHECK(nv_file_read_all(path, &bytes, &len) == NV_OK, "%s", nv_errmsg());
        char *at = bytes ? memmem(bytes, len, key, sizeof key - 1) : NULL;
        uint8_t *flags = at ? (uint8_t *)at + sizeof key - 1 + 4 + 4 + 8 : NULL; /* the array's type, element type, count */
        T_CHECK(flags && flags[0] == 1 && flags[1] == 0 && flags[2] == 1 && flags[3] == 0, "the flags written");
        if (flags) {
            nv_config pc;
            flags[1] = 1; /* windowed, windowed, windowed, whole: a period of 4 */
            T_CHECK(nv_model_read_config(t_write("olmo3-p4.gguf", bytes, len), &pc) == NV_OK && pc.swa_period == 4, "period 4: %s", nv_errmsg());
            flags[0] = 0, flags[1] = 0; /* whole, whole, windowed, whole */
            T_CHECK(nv_model_read_config(t_write("olmo3-odd.gguf", bytes, len), &pc) == NV_EUNSUPPORTED && strstr(nv_errmsg(), "does not repeat"),
                    "an irregular list: %s", nv_errmsg());
        }
        free(bytes);
    }
    if (gen == 12) { /* Ministral 3's files as llama.cpp converts them: no temperature length (YaRN's original context), the
                        log multiplier 1 (the cos and sin unscaled); another multiplier scales them as transformers does */
        char *bytes = NULL;
        size_t len = 0;
        static const char key[] = "mistral3.attention.temperature_length", mul[] = "mistral3.rope.scaling.yarn_log_multiplier";
        T_CHECK(nv_file_read_all(path, &bytes, &len) == NV_OK, "%s", nv_errmsg());
        char *at = bytes ? memmem(bytes, len, key, sizeof key - 1) : NULL, *m_at = bytes ? memmem(bytes, len, mul, sizeof mul - 1) : NULL;
        T_CHECK(at && m_at, "the temperature's length and the log multiplier written");
        static const char rot_key[] = "mistral3.rope.dimension_count";
        char *rot_at = bytes ? memmem(bytes, len, rot_key, sizeof rot_key - 1) : NULL;
        if (rot_at) { /* RoPE on half of each head: llama.cpp's mistral3 refuses it, and so does nerve */
            nv_config pc;
            const uint32_t half = (uint32_t)c.head_dim / 2;
            memcpy(rot_at + sizeof rot_key - 1 + 4, &half, 4);
            T_CHECK(nv_model_read_config(t_write("m3-rot.gguf", bytes, len), &pc) == NV_EUNSUPPORTED && strstr(nv_errmsg(), "mistral3 with RoPE on"),
                    "mistral3 with partial rotation: %s", nv_errmsg());
            const uint32_t whole = (uint32_t)c.head_dim;
            memcpy(rot_at + sizeof rot_key - 1 + 4, &whole, 4);
        }
        if (at && m_at) {
            nv_config pc;
            at[sizeof key - 2] = 'X'; /* another key: the length left out */
            T_CHECK(nv_model_read_config(t_write("m3-nolen.gguf", bytes, len), &pc) == NV_OK && !memcmp(&pc, &c, sizeof c),
                    "the length from YaRN's original context: %s (%d)", nv_errmsg(), pc.attn_temp_len);
            float half = 0.5f; /* transformers' mscale_all_dim 0.5: 1 + 0.1 ln 4 over 1 + 0.05 ln 4 */
            memcpy(m_at + sizeof mul - 1 + 4, &half, 4);
            T_CHECK(nv_model_read_config(t_write("m3-mul.gguf", bytes, len), &pc) == NV_OK &&
                        fabs(pc.yarn.attn_factor - (1 + 0.1 * log(4.0)) / (1 + 0.05 * log(4.0))) < 1e-6,
                    "a log multiplier of 0.5: %g", (double)pc.yarn.attn_factor);
            const float near_one = 1.0000005f; /* a factor a hair under 1 is written as it is, not as 1 */
            memcpy(m_at + sizeof mul - 1 + 4, &near_one, 4);
            nv_model near = m;
            nv_config again;
            T_CHECK(nv_model_read_config(t_write("m3-near.gguf", bytes, len), &near.config) == NV_OK && near.config.yarn.attn_factor != 1.0f,
                    "a log multiplier of 1.0000005: %s", nv_errmsg());
            T_CHECK(nv_gguf_save(&near, NULL, "m3", t_path("m3-near2.gguf"), NV_GGUF_F32, NULL, NULL) == NV_OK &&
                        nv_model_read_config(t_path("m3-near2.gguf"), &again) == NV_OK && again.yarn.attn_factor == near.config.yarn.attn_factor,
                    "the factor %.9g written back as %.9g", (double)near.config.yarn.attn_factor, (double)again.yarn.attn_factor);
        }
        free(bytes);
        char args[800];
        snprintf(args, sizeof args, "info -m '%s'", path);
        T_CHECK(t_nerve(args) == 0 && strstr(t_out, "queries x 1 + 3 ln(1 + floor(position / 8))") && strstr(t_out, "YaRN factor 4"),
                "info: %s%s", t_out, t_err);
    }
    T_CHECK(nv_model_load_quantized(q8, &rq) == NV_OK && nv_model_build_plans(&rq, nv_engine_best()) == NV_OK, "%s", nv_errmsg());
    T_CHECK(t_forward_logits(&rq, toks, T, b) && t_logit_gap(b, a, T * V) < 0.05, "kind %d Q8_0: %.3g from fp32", gen, t_logit_gap(b, a, T * V));
    free(a), free(b), free(ref);
    nv_model_free(&r);
    nv_model_free(&rq);
    nv_model_free(&m);
}

/* A mixture of experts with Granite's multipliers is written as granitemoe and reads back as itself,
 * bit for bit; inference's mixture (its weighted sum scaled into the residual as a dense FFN's) gives
 * training's logits. */
static void granitemoe_round_trip(void) {
    nv_config c = gemma_config(5);
    c.n_experts = 4, c.n_experts_used = 2, c.logit_div = 1.0f; /* logits large enough to tell the residual's scaling */
    nv_model m, r;
    if (!gemma_model(&m, &c, 19)) return;
    for (uint64_t i = 0; i < m.n_params; i++) m.params[i] *= 6.0f; /* the experts' share of the residual well above rounding */
    T_CHECK(nv_model_build_plans(&m, NV_ENGINE_SCALAR) == NV_OK, "%s", nv_errmsg());
    char path[700];
    snprintf(path, sizeof path, "%s", t_path("gmoe.gguf"));
    T_CHECK(nv_gguf_save(&m, NULL, "gmoe", path, NV_GGUF_F32, NULL, NULL) == NV_OK, "%s", nv_errmsg());
    T_CHECK(gguf_arch_is(path, "granitemoe"), "written as another architecture");
    T_CHECK(nv_model_load(path, &r) == NV_OK && !memcmp(&r.config, &c, sizeof c), "granitemoe read back: %s", nv_errmsg());
    T_CHECK(nv_model_build_plans(&r, NV_ENGINE_SCALAR) == NV_OK, "%s", nv_errmsg());
    const size_t V = (size_t)c.vocab_size;
    int toks[T];
    tokens(toks, T, c.vocab_size);
    float *a = malloc(T * V * sizeof(float)), *b = malloc(T * V * sizeof(float));
    T_CHECK(t_forward_logits(&m, toks, T, a) && t_forward_logits(&r, toks, T, b) && !memcmp(a, b, T * V * sizeof(float)),
            "granitemoe's logits differ from the model's");
    /* inference's mixture (forward.c) against training's (tmodel.c): the same logits (no divisor here) */
    nv_tmodel tm;
    T_CHECK(nv_tmodel_init(&tm, &c, m.params, 0, 1, T, NV_ENGINE_SCALAR) == NV_OK, "%s", nv_errmsg());
    nv_tmodel_forward(&tm, toks, NULL);
    const double gap = t_logit_gap(tm.a.logits, a, T * V);
    T_CHECK(gap < 1e-5, "granitemoe: training's logits are %.3g from inference's", gap);
    nv_tmodel_free(&tm);
    free(a), free(b);
    nv_model_free(&r);
    nv_model_free(&m);
}

/* mistral3 without the temperature or YaRN (Mistral Small 3.x and Magistral as llama.cpp now converts
 * them: llama's block under that name) reads as llama's block and is written back under its name. */
static void mistral3_plain_round_trip(void) {
    nv_config c = {32, 48, 2, 4, 2, 16, 67, 64, 1000000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    c.arch_mistral3 = 1;
    nv_model m, r;
    if (!gemma_model(&m, &c, 23)) return;
    char path[700];
    snprintf(path, sizeof path, "%s", t_path("m3plain.gguf"));
    T_CHECK(nv_gguf_save(&m, NULL, "m3", path, NV_GGUF_F32, NULL, NULL) == NV_OK && gguf_arch_is(path, "mistral3"), "%s", nv_errmsg());
    T_CHECK(nv_model_load(path, &r) == NV_OK && !memcmp(&r.config, &c, sizeof c), "mistral3 read back: %s", nv_errmsg());
    nv_model_free(&r);
    nv_model_free(&m);
}

static void test_gguf_round_trip(void) {
    for (int i = 0; i < N_KINDS; i++) gguf_round_trip(kinds[i]);
    granitemoe_round_trip();
    mistral3_plain_round_trip();
}

/* What has no place for these parts says so: llama2.c's format, a Hugging Face folder, a GGUF file
 * of a mix no architecture holds, training; nerve info shows them. */
static void test_refusals_and_info(void) {
    nv_config c = gemma_config(3);
    c.swa_period = 6;
    nv_model m;
    if (!gemma_model(&m, &c, 9)) return;
    T_CHECK(!nv_config_fits_v1(&c) && nv_model_save_v1(&m, t_path("g.bin")) == NV_EUNSUPPORTED, "llama2.c v1 took it");
    nv_model gr = m; /* Granite's multipliers have no place there either */
    gr.config = gemma_config(5);
    T_CHECK(!nv_config_fits_v1(&gr.config) && nv_model_save_v1(&gr, t_path("gr.bin")) == NV_EUNSUPPORTED &&
                strstr(nv_errmsg(), "Granite's multipliers"),
            "llama2.c v1 took Granite: %s", nv_errmsg());
    nv_model m3 = m; /* nor Ministral 3's attention temperature, which a folder of nerve's would not say */
    m3.config = gemma_config(12);
    T_CHECK(!nv_config_fits_v1(&m3.config) && nv_model_save_v1(&m3, t_path("m3.bin")) == NV_EUNSUPPORTED &&
                nv_hf_save(&m3, NULL, t_path("m3hf"), NV_HF_F32, NULL) == NV_EUNSUPPORTED &&
                strstr(nv_errmsg(), "attention temperature"),
            "llama2.c v1 or a folder took Ministral 3's temperature: %s", nv_errmsg());
    nv_config v1_shape = {32, 48, 2, 4, 2, 8, 67, 64, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    T_CHECK(nv_config_fits_v1(&v1_shape), "llama2.c v1's shape");
    v1_shape.attn_temp_scale = 0.1f, v1_shape.attn_temp_len = 8; /* (a run would pick model.bin for it) */
    T_CHECK(!nv_config_fits_v1(&v1_shape), "llama2.c v1 said to fit Ministral 3's temperature");
    m3.config.qk_norm = 1; /* nor a GGUF architecture beside QK-norm */
    T_CHECK(nv_gguf_save(&m3, NULL, "m3", t_path("m3q.gguf"), NV_GGUF_F32, NULL, NULL) == NV_EUNSUPPORTED && strstr(nv_errmsg(), "temperature"),
            "the temperature beside QK-norm was written: %s", nv_errmsg());
    nv_model g1 = m; /* Gemma 1's config.json has no window */
    g1.config = gemma_config(1);
    g1.config.swa_window = 5;
    T_CHECK(nv_hf_save(&g1, NULL, t_path("ghf"), NV_HF_F32, NULL) == NV_EUNSUPPORTED && strstr(nv_errmsg(), "reads back the same"),
            "a Hugging Face folder took Gemma 1 with a window: %s", nv_errmsg());
    struct stat st;
    T_CHECK(stat(t_path("ghf"), &st) != 0, "the refused folder was made");
    char path[700];
    snprintf(path, sizeof path, "%s", t_path("g3i.gguf"));
    T_CHECK(nv_gguf_save(&m, NULL, "g3", path, NV_GGUF_F32, NULL, NULL) == NV_OK, "%s", nv_errmsg());
    nv_model odd = m; /* a window on a block that is not Gemma's */
    odd.config.swa_period = 3;
    T_CHECK(nv_gguf_save(&odd, NULL, "odd", t_path("odd.gguf"), NV_GGUF_F32, NULL, NULL) == NV_EUNSUPPORTED, "an odd mix was written");
    nv_model_free(&m);
    char args[1600];
    snprintf(args, sizeof args, "info -m '%s'", path);
    T_CHECK(t_nerve(args) == 0 && strstr(t_out, "window:   5 positions in 4 of 4 layers") && strstr(t_out, "GELU gating, post-norms") &&
                strstr(t_out, "windowed layers theta 10000"),
            "info: %s%s", t_out, t_err);
}

/* Training's forward (its own attention, norms, GELU and caps, on whole windows) gives the mean
 * cross-entropy of the reference's logits, for each generation, two windows a batch. */
static void training_forward_matches(int gen) {
    nv_config c = gemma_config(gen);
    nv_model m;
    if (!gemma_model(&m, &c, 13)) return;
    const int V = c.vocab_size;
    int in[2 * T], tg[2 * T];
    for (int i = 0; i < 2 * T; i++) in[i] = (i * 29 + 5) % V, tg[i] = (i * 13 + 3) % V;
    double want = 0;
    float *ref = malloc((size_t)T * V * sizeof(float));
    for (int b = 0; b < 2; b++) {
        reference_logits(&m, in + b * T, T, ref);
        for (int t = 0; t < T; t++) {
            const float *row = ref + (size_t)t * V;
            double mx = row[0], sum = 0;
            for (int i = 1; i < V; i++) mx = fmax(mx, row[i]);
            for (int i = 0; i < V; i++) sum += exp(row[i] - mx);
            want += (mx + log(sum) - row[tg[b * T + t]]) / (2 * T);
        }
    }
    nv_tmodel tm;
    T_CHECK(nv_tmodel_init(&tm, &c, m.params, 0, 2, T, NV_ENGINE_SCALAR) == NV_OK, "%s", nv_errmsg());
    const double got = nv_tmodel_forward(&tm, in, tg);
    T_CHECK(fabs(got - want) < 1e-5 * want, "kind %d: training's loss %.8g, the reference's %.8g", gen, got, want);
    nv_tmodel_free(&tm);
    free(ref);
    nv_model_free(&m);
}

static void test_training_forward_matches(void) {
    for (int i = 0; i < N_KINDS; i++) training_forward_matches(kinds[i]);
}

/* A folder (made if missing) holding gw_gemma_vocab's vocabulary as transformers' GemmaConverter
 * writes tokenizer.json (BPE with byte fallback, the one merge, spaces replaced by U+2581 and no
 * dummy prefix, the turn markers special) with its tokenizer_config.json; returns its path. */
static const char *hf_gemma_tokenizer(const char *name) {
    static char dir[640];
    snprintf(dir, sizeof dir, "%s", t_path(name));
    mkdir(dir, 0755);
    static const char *const head[] = {"<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"};
    static const char *const tail[] = {"\xe2\x96\x81", "a", "b", "\xe2\x96\x81" "a", "c"};
    nv_buf j = {0};
    nv_buf_printf(&j, "{\"version\": \"1.0\", \"added_tokens\": [");
    for (int i = 0; i < 6; i++)
        nv_buf_printf(&j, "%s{\"id\": %d, \"content\": \"%s\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
                          "\"normalized\": false, \"special\": true}", i ? ", " : "", i, head[i]);
    nv_buf_printf(&j, "], \"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\xe2\x96\x81\"}, "
                      "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": \"MergedWithPrevious\", "
                      "\"invert\": false}, \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": "
                      "{\"id\": \"<bos>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}]}, "
                      "\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"byte_fallback\": true, \"vocab\": {");
    for (int i = 0; i < GW_GEMMA_VOCAB; i++) {
        char byte[8];
        snprintf(byte, sizeof byte, "<0x%02X>", (unsigned)(i - 6) & 255);
        nv_buf_printf(&j, "%s\"%s\": %d", i ? ", " : "", i < 6 ? head[i] : i < 262 ? byte : tail[i - 262], i);
    }
    nv_buf_printf(&j, "}, \"merges\": [\"\xe2\x96\x81 a\"]}}");
    char file[700];
    snprintf(file, sizeof file, "%s/tokenizer.json", name);
    t_write(file, j.data, j.len);
    nv_buf_free(&j);
    static const char cfg[] = "{\"bos_token\": \"<bos>\", \"eos_token\": \"<eos>\", \"unk_token\": \"<unk>\", \"pad_token\": \"<pad>\", "
                              "\"add_bos_token\": true, \"add_eos_token\": false, \"tokenizer_class\": \"GemmaTokenizer\"}";
    snprintf(file, sizeof file, "%s/tokenizer_config.json", name);
    t_write(file, cfg, strlen(cfg));
    return dir;
}

/* transformers' name of a Gemma model's tensor named the llama.cpp way (Gemma 2 and 3's four norms a
 * layer with post-norms: the FFN's input norm is pre_feedforward_layernorm there, and
 * post_attention_layernorm the attention's post-norm). */
static void gemma_hf_name(const char *gg, int post_norms, char *out, size_t cap) {
    static const char *const map[][2] = {
        {"token_embd.weight", "model.embed_tokens.weight"}, {"output_norm.weight", "model.norm.weight"},
        {"attn_norm.weight", "input_layernorm.weight"},      {"attn_q.weight", "self_attn.q_proj.weight"},
        {"attn_k.weight", "self_attn.k_proj.weight"},        {"attn_v.weight", "self_attn.v_proj.weight"},
        {"attn_output.weight", "self_attn.o_proj.weight"},   {"ffn_gate.weight", "mlp.gate_proj.weight"},
        {"ffn_down.weight", "mlp.down_proj.weight"},         {"ffn_up.weight", "mlp.up_proj.weight"},
        {"attn_q_norm.weight", "self_attn.q_norm.weight"},   {"attn_k_norm.weight", "self_attn.k_norm.weight"},
        {"post_attention_norm.weight", "post_attention_layernorm.weight"},
        {"post_ffw_norm.weight", "post_feedforward_layernorm.weight"}};
    int layer = -1, at = 0;
    sscanf(gg, "blk.%d.%n", &layer, &at);
    const char *part = at ? gg + at : gg;
    if (!strcmp(part, "ffn_norm.weight")) {
        snprintf(out, cap, "model.layers.%d.%s", layer, post_norms ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight");
        return;
    }
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(part, map[i][0])) {
            if (at) snprintf(out, cap, "model.layers.%d.%s", layer, map[i][1]);
            else snprintf(out, cap, "%s", map[i][1]);
            return;
        }
    snprintf(out, cap, "?%s", gg);
}

/* m as transformers keeps a Gemma model in folder dir: config.json (cfg), model.safetensors in F32
 * with transformers' names, the query and key rows in its rotate-half order, every norm as w - 1. */
static void hf_gemma_weights(const nv_model *m, const char *dir, const char *cfg) {
    char file[800];
    snprintf(file, sizeof file, "%s/config.json", dir);
    FILE *f = fopen(file, "wb");
    if (f) fputs(cfg, f), fclose(f);
    nv_model h;
    if (nv_model_alloc(&h, &m->config) != NV_OK) return;
    memcpy(h.params, m->params, (size_t)m->n_params * sizeof(float));
    T_CHECK(nv_model_qk_reorder(&h, 1) == NV_OK, "%s", nv_errmsg());
    const size_t nt = nv_model_tensor_count(&m->config);
    nv_tensor_ref *t = calloc(nt, sizeof *t);
    nv_model_tensor_map(&m->config, &h.w, t);
    nv_buf hdr = {0};
    uint64_t off = 0;
    nv_buf_printf(&hdr, "{");
    for (size_t i = 0; i < nt; i++) {
        char name[128];
        gemma_hf_name(t[i].name, m->config.post_norms, name, sizeof name);
        const uint64_t n = t[i].d0 * t[i].d1;
        if (t[i].d1 == 1)
            for (uint64_t x = 0; x < n && strstr(name, "norm"); x++) t[i].p[x] -= 1.0f;
        if (t[i].d1 == 1) nv_buf_printf(&hdr, "%s\"%s\": {\"dtype\": \"F32\", \"shape\": [%llu], ", i ? ", " : "", name, (unsigned long long)t[i].d0);
        else
            nv_buf_printf(&hdr, "%s\"%s\": {\"dtype\": \"F32\", \"shape\": [%llu, %llu], ", i ? ", " : "", name,
                          (unsigned long long)t[i].d1, (unsigned long long)t[i].d0);
        nv_buf_printf(&hdr, "\"data_offsets\": [%llu, %llu]}", (unsigned long long)off, (unsigned long long)(off + 4 * n));
        off += 4 * n;
    }
    nv_buf_printf(&hdr, "}");
    while (hdr.len % 8) nv_buf_append(&hdr, " ", 1);
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    f = fopen(file, "wb");
    const uint64_t hl = hdr.len;
    if (f) {
        fwrite(&hl, 8, 1, f), fwrite(hdr.data, 1, hdr.len, f);
        for (size_t i = 0; i < nt; i++) fwrite(t[i].p, sizeof(float), t[i].d0 * t[i].d1, f);
        fclose(f);
    }
    nv_buf_free(&hdr);
    free(t);
    nv_model_free(&h);
}

/* The folder whose config.json is at path reads as model m: its config exactly, its logits within
 * 1e-5 (the F32 norms' w - 1 and back). */
static void folder_is_model(const char *path, const nv_model *m, int kind) {
    const nv_config *c = &m->config;
    nv_model r;
    T_CHECK(nv_model_load(path, &r) == NV_OK, "kind %d: %s", kind, nv_errmsg());
    if (!r.params) return;
    T_CHECK(!memcmp(&r.config, c, sizeof *c), "kind %d: the folder's config differs (window %d period %d theta %g caps %g %g div %g)", kind,
            r.config.swa_window, r.config.swa_period, (double)r.config.rope_theta_swa, (double)r.config.logit_softcap,
            (double)r.config.attn_softcap, (double)r.config.attn_div);
    T_CHECK(nv_model_build_plans(&r, NV_ENGINE_SCALAR) == NV_OK, "%s", nv_errmsg());
    const size_t V = (size_t)c->vocab_size;
    int toks[T];
    tokens(toks, T, c->vocab_size);
    float *a = malloc(T * V * sizeof(float)), *b = malloc(T * V * sizeof(float));
    T_CHECK(t_forward_logits(m, toks, T, a) && t_forward_logits(&r, toks, T, b), "%s", nv_errmsg());
    T_CHECK(t_logit_gap(b, a, T * V) < 1e-5, "kind %d: the folder's logits are %.3g from the model's", kind, t_logit_gap(b, a, T * V));
    free(a), free(b);
    nv_model_free(&r);
}

/* A Gemma folder as transformers writes it (gemma, gemma2, gemma3_text) reads as the model it holds:
 * the config nerve's GGUF reader gives, logits within rounding (the norms' w - 1 and back) of the
 * model's; with the vocabulary's tokenizer.json beside it, nerve generate runs it. */
static void hf_folder(int gen) {
    nv_config c = gemma_config(gen);
    c.vocab_size = GW_GEMMA_VOCAB;
    if (gen == 3) c.n_layers = 6, c.swa_period = 6; /* five windowed layers, then a global one */
    nv_model m;
    if (!gemma_model(&m, &c, 17)) return;
    T_CHECK(nv_model_build_plans(&m, NV_ENGINE_SCALAR) == NV_OK, "%s", nv_errmsg());
    char name[32], cfg[2048];
    snprintf(name, sizeof name, "gemma%d-hf", gen);
    const char *dir = hf_gemma_tokenizer(name);
    static const char *const type[] = {"", "gemma", "gemma2", "gemma3_text"};
    int at = snprintf(cfg, sizeof cfg,
                      "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", \"hidden_size\": 32, \"intermediate_size\": 48, "
                      "\"num_hidden_layers\": %d, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, "
                      "\"vocab_size\": %d, \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, "
                      "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0}, \"bos_token_id\": 2, \"eos_token_id\": 1, "
                      "\"pad_token_id\": 0, \"torch_dtype\": \"float32\"",
                      gen == 1 ? "GemmaForCausalLM" : gen == 2 ? "Gemma2ForCausalLM" : "Gemma3ForCausalLM", type[gen], c.n_layers, c.vocab_size);
    if (gen == 1) at += snprintf(cfg + at, sizeof cfg - (size_t)at, ", \"hidden_act\": \"gelu\"}");
    if (gen == 2)
        at += snprintf(cfg + at, sizeof cfg - (size_t)at,
                       ", \"hidden_activation\": \"gelu_pytorch_tanh\", \"query_pre_attn_scalar\": 16, \"sliding_window\": 5, "
                       "\"final_logit_softcapping\": 3.0, \"attn_logit_softcapping\": 0.5}");
    if (gen == 3)
        at += snprintf(cfg + at, sizeof cfg - (size_t)at,
                       ", \"hidden_activation\": \"gelu_pytorch_tanh\", \"query_pre_attn_scalar\": 16, \"sliding_window\": 5, "
                       "\"rope_local_base_freq\": 10000.0, \"final_logit_softcapping\": 3.0, \"attn_logit_softcapping\": null, "
                       "\"layer_types\": [\"sliding_attention\", \"sliding_attention\", \"sliding_attention\", \"sliding_attention\", "
                       "\"sliding_attention\", \"full_attention\"]}");
    hf_gemma_weights(&m, dir, cfg);
    char path[800];
    snprintf(path, sizeof path, "%s/config.json", dir);
    folder_is_model(path, &m, gen);
    nv_model_free(&m);
    char args[1200];
    snprintf(args, sizeof args, "generate -m '%s' -n 6 -t 0 -p 'a b'", dir);
    T_CHECK(t_nerve(args) == 0, "kind %d: generate from the folder: %s", gen, t_err);
    if (gen != 3) return;
    const char *text = t_data("corpus/tinystories_valid_head.txt"); /* fine-tuned from the folder, written back as gemma3 */
    char run[700], out[800];
    snprintf(run, sizeof run, "%s", t_path("gemma3-hf-run"));
    snprintf(out, sizeof out, "%s/model.gguf", run);
    snprintf(args, sizeof args, "train --init-from '%s' --data '%s' --steps 2 --batch 1 --seq 16 --quiet --out '%s'", dir, text ? text : "", run);
    T_CHECK(!text || (t_nerve(args) == 0 && written_as(out, 3)), "train from the folder: %s", t_err);
    /* refused, one line each: the vision-language folder, layer types that are not a period */
    static const struct {
        const char *from, *to, *says;
    } bad[] = {{"\"gemma3_text\"", "\"gemma3\"", "vision-language"},
               {"[\"sliding_attention\"", "[\"full_attention\"", "repeating pattern"},
               {"\"gelu_pytorch_tanh\"", "\"relu\"", "hidden_activation 'relu'"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char odd[2048];
        const char *hit = strstr(cfg, bad[i].from);
        snprintf(odd, sizeof odd, "%.*s%s%s", (int)(hit - cfg), cfg, bad[i].to, hit + strlen(bad[i].from));
        FILE *f = fopen(path, "wb");
        if (f) fputs(odd, f), fclose(f);
        nv_config oc;
        const nv_err e = nv_model_read_config(path, &oc);
        T_CHECK(e != NV_OK && strstr(nv_errmsg(), bad[i].says) && !strchr(nv_errmsg(), '\n'), "case %zu: %s", i, nv_errmsg());
    }
}

static void test_hf_folder(void) {
    for (int gen = 1; gen <= 3; gen++) hf_folder(gen);
}

/* nerve's own folder of each (gemma, gemma2, gemma3_text, smollm3, granite; Gemma 3 whose period is
 * longer than its layers, said by sliding_window_pattern alone; SmolLM3 whose interval is longer than
 * its layers, said by no_rope_layer_interval alone) reads back, through the reader
 * tested above against transformers' layout, as the same config and logits (F32; the norms'
 * w - 1 and back within rounding); `nerve export MODEL.gguf -o DIR/` writes it too. */
static void hf_written(int gen) {
    nv_config c = gemma_config(gen == 6 ? 3 : gen == 7 ? 4 : gen);
    if (gen == 6) c.swa_period = 6;
    if (gen == 7) c.nope_period = 5; /* every layer rotates: a list of flags would say interval 0 */
    nv_model m;
    if (!gemma_model(&m, &c, 23)) return;
    T_CHECK(nv_model_build_plans(&m, NV_ENGINE_SCALAR) == NV_OK, "%s", nv_errmsg());
    char name[32], dir[700], path[800];
    snprintf(name, sizeof name, "written%d", gen);
    snprintf(dir, sizeof dir, "%s", t_path(name));
    snprintf(path, sizeof path, "%s/config.json", dir);
    T_CHECK(nv_hf_save(&m, NULL, dir, NV_HF_F32, NULL) == NV_OK, "kind %d: %s", gen, nv_errmsg());
    folder_is_model(path, &m, gen);
    if (gen >= 10) { /* transformers' Olmo2/Olmo3 layout: no input_layernorm, the two post-norms, QK-norm over whole projections */
        char st[800], *text = NULL, *cfg_text = NULL;
        size_t len = 0;
        snprintf(st, sizeof st, "%s/model.safetensors", dir);
        uint64_t hl = 0;
        T_CHECK(nv_file_read_all(st, &text, &len) == NV_OK && len > 8 && nv_file_read_all(path, &cfg_text, NULL) == NV_OK, "%s", nv_errmsg());
        if (text && len > 8) memcpy(&hl, text, 8);
        cJSON *h = text && hl && hl <= len - 8 ? cJSON_ParseWithLength(text + 8, (size_t)hl) : NULL, *cfg = cfg_text ? cJSON_Parse(cfg_text) : NULL;
        const cJSON *qn = cJSON_GetObjectItem(cJSON_GetObjectItem(h, "model.layers.0.self_attn.q_norm.weight"), "shape");
        const cJSON *kn = cJSON_GetObjectItem(cJSON_GetObjectItem(h, "model.layers.0.self_attn.k_norm.weight"), "shape");
        T_CHECK(h && cJSON_GetArraySize(qn) == 1 && cJSON_GetArrayItem(qn, 0)->valueint == nv_config_q_dim(&c) &&
                    cJSON_GetArrayItem(kn, 0)->valueint == nv_config_kv_dim(&c) &&
                    cJSON_GetObjectItem(h, "model.layers.3.post_attention_layernorm.weight") &&
                    cJSON_GetObjectItem(h, "model.layers.3.post_feedforward_layernorm.weight") &&
                    !cJSON_GetObjectItem(h, "model.layers.0.input_layernorm.weight") &&
                    !cJSON_GetObjectItem(h, "model.layers.0.pre_feedforward_layernorm.weight"),
                "kind %d: the folder's tensors are not transformers' Olmo names", gen);
        const cJSON *type = cJSON_GetObjectItem(cfg, "model_type");
        T_CHECK(cJSON_IsString(type) && !strcmp(type->valuestring, gen == 10 ? "olmo2" : "olmo3") &&
                    (gen == 10 || cJSON_GetArraySize(cJSON_GetObjectItem(cfg, "layer_types")) == c.n_layers),
                "kind %d: config.json %s", gen, cfg_text ? cfg_text : "");
        cJSON_Delete(h), cJSON_Delete(cfg);
        free(text), free(cfg_text);
        char args[1600];
        snprintf(args, sizeof args, "info -m '%s'", path);
        T_CHECK(t_nerve(args) == 0 && strstr(t_out, "QK-norm over whole projections") &&
                    strstr(t_out, "block:    OLMo 2's: RMSNorm after the attention and the FFN, none before") &&
                    (gen == 10 || strstr(t_out, "window:   5 positions in 2 of 4 layers")) &&
                    /* serve's fp16 cache: 2 x 32 values of 2 bytes a layer; split, the ring is the context's 4 blocks */
                    strstr(t_out, gen == 10 ? "kv:       f16 512 bytes a position (the context of 64: 32.0 KiB)\n"
                                            : "kv:       f16 512 bytes a position (the context of 64: 32.0 KiB); split (serve "
                                              "--swa-cache window): 256 bytes a position (16.0 KiB) and a ring of 16.0 KiB a sequence"),
                "info: %s%s", t_out, t_err);
    }
    if (gen == 4) { /* SmolLM3's forms: the list alone (its released config.json), the interval alone; a list that is not a period */
        char *text = NULL;
        T_CHECK(nv_file_read_all(path, &text, NULL) == NV_OK, "%s", nv_errmsg());
        cJSON *j = text ? cJSON_Parse(text) : NULL;
        free(text);
        for (int form = 0; j && form < 3; form++) {
            cJSON *o = cJSON_Duplicate(j, 1);
            if (form == 0) cJSON_DeleteItemFromObject(o, "no_rope_layer_interval");
            if (form == 1) cJSON_DeleteItemFromObject(o, "no_rope_layers");
            if (form == 2) cJSON_ReplaceItemInArray(cJSON_GetObjectItem(o, "no_rope_layers"), 0, cJSON_CreateNumber(0)); /* 0 1 1 0 */
            char *out = cJSON_PrintUnformatted(o);
            char rel[64];
            snprintf(rel, sizeof rel, "%s/config.json", name);
            t_write(rel, out, strlen(out));
            free(out);
            cJSON_Delete(o);
            nv_config rc;
            const nv_err e = nv_model_read_config(path, &rc);
            if (form < 2) T_CHECK(e == NV_OK && !memcmp(&rc, &c, sizeof c), "form %d: %s", form, e ? nv_errmsg() : "another config");
            else T_CHECK(e != NV_OK && strstr(nv_errmsg(), "no_rope_layers is not a repeating pattern"), "an irregular list: %s", nv_errmsg());
        }
        cJSON_Delete(j);
    }
    if (gen == 5) { /* Granite's keys as transformers' GraniteConfig names them */
        char *text = NULL;
        T_CHECK(nv_file_read_all(path, &text, NULL) == NV_OK, "%s", nv_errmsg());
        cJSON *j = text ? cJSON_Parse(text) : NULL;
        static const char *const key[4] = {"embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling"};
        static const double want[4] = {12.0, 0.1, 0.22, 8.0};
        const cJSON *type = cJSON_GetObjectItem(j, "model_type");
        T_CHECK(cJSON_IsString(type) && !strcmp(type->valuestring, "granite"), "granite's model_type: %s", text ? text : "");
        for (int i = 0; i < 4; i++) {
            const cJSON *v = cJSON_GetObjectItem(j, key[i]);
            T_CHECK(cJSON_IsNumber(v) && fabs(v->valuedouble - want[i]) < 1e-6 * want[i], "granite's %s: %g", key[i],
                    cJSON_IsNumber(v) ? v->valuedouble : -1.0);
        }
        cJSON_Delete(j);
        free(text);
        char args[1600];
        snprintf(args, sizeof args, "info -m '%s'", path);
        T_CHECK(t_nerve(args) == 0 && strstr(t_out, "block:    embeddings x 12, scores / 10, branches x 0.22 into the residual, logits / 8"),
                "info: %s%s", t_out, t_err);
    }
    if (gen == 6) { /* the command: a GGUF file to a folder */
        char gguf[700], out[700], args[1600];
        snprintf(gguf, sizeof gguf, "%s", t_path("written3.gguf"));
        snprintf(out, sizeof out, "%s", t_path("written3-cli"));
        T_CHECK(nv_gguf_save(&m, NULL, "w3", gguf, NV_GGUF_F32, NULL, NULL) == NV_OK, "%s", nv_errmsg());
        snprintf(args, sizeof args, "export '%s' -o '%s/'", gguf, out);
        T_CHECK(t_nerve(args) == 0, "export: %s", t_err);
        snprintf(args, sizeof args, "info -m '%s/config.json'", out);
        T_CHECK(t_nerve(args) == 0 && strstr(t_out, "window:   5 positions in 4 of 4 layers") && strstr(t_out, "windowed layers theta 10000") &&
                    strstr(t_out, "GELU gating, post-norms"),
                "info: %s%s", t_out, t_err);
    }
    nv_model_free(&m);
}

static void test_hf_written(void) {
    for (int gen = 1; gen <= 7; gen++) hf_written(gen);
    hf_written(10);
    hf_written(11);
}

/* Gemma's vocabulary layout: BOS 2 opens the text, no dummy prefix, specials cut the text, bytes
 * fall back to their own tokens wherever they sit, <end_of_turn> ends generation and prints nothing;
 * written back as GGUF it keeps every id. */
static void test_vocabulary(void) {
    char path[700], copy[700], hf[700], ours[720], ours_dir[700];
    snprintf(path, sizeof path, "%s", t_path("gemma-vocab.gguf"));
    snprintf(copy, sizeof copy, "%s", t_path("gemma-vocab-copy.gguf"));
    snprintf(hf, sizeof hf, "%s/tokenizer.json", hf_gemma_tokenizer("gemma-vocab-hf"));
    snprintf(ours_dir, sizeof ours_dir, "%s", t_path("gemma-vocab-ours"));
    snprintf(ours, sizeof ours, "%s/tokenizer.json", ours_dir);
    T_CHECK(gw_gemma_vocab(path), "writing the vocabulary");
    static const int want[] = {2, 4, 263, 262, 264, 6 + '\n', 6 + 0xC3, 6 + 0xA9, 5, 1};
    const int nw = (int)(sizeof want / sizeof want[0]);
    /* the file, nerve's GGUF copy, the same vocabulary as transformers writes it, and as nerve writes
       it beside a model's folder */
    for (int pass = 0; pass < 4; pass++) {
        nv_tokenizer *t = NULL;
        const char *const from[4] = {path, copy, hf, ours};
        T_CHECK(nv_tokenizer_load(from[pass], 0, &t) == NV_OK, "pass %d: %s", pass, nv_errmsg());
        if (!t) return;
        int *ids = NULL, n = 0;
        T_CHECK(nv_tokenizer_encode(t, "<start_of_turn>a b\n\xc3\xa9<end_of_turn>", 1, 1, &ids, &n) == NV_OK, "%s", nv_errmsg());
        int same = n == nw;
        for (int i = 0; same && i < n; i++) same = ids[i] == want[i];
        T_CHECK(same, "pass %d: %d tokens: %d %d %d %d %d %d", pass, n, n > 0 ? ids[0] : -1, n > 1 ? ids[1] : -1, n > 2 ? ids[2] : -1,
                n > 3 ? ids[3] : -1, n > 4 ? ids[4] : -1, n > 5 ? ids[5] : -1);
        free(ids);
        T_CHECK(nv_tokenizer_bos(t) == 2 && nv_tokenizer_eos(t) == 1 && nv_tokenizer_unk(t) == 3 && !nv_tokenizer_llama2c_form(t) &&
                    !nv_tokenizer_space_prefix(t),
                "pass %d: ids %d %d %d", pass, nv_tokenizer_bos(t), nv_tokenizer_eos(t), nv_tokenizer_unk(t));
        T_CHECK(nv_tokenizer_is_eog(t, 1) && nv_tokenizer_is_eog(t, 5) && !nv_tokenizer_is_eog(t, 2) && !nv_tokenizer_is_eog(t, 4),
                "pass %d: what ends generation", pass);
        T_CHECK(!strcmp(nv_tokenizer_decode(t, 2, 263), "a") && !strcmp(nv_tokenizer_decode(t, 263, 265), " a") &&
                    !strcmp(nv_tokenizer_decode(t, 263, 5), "") && !strcmp(nv_tokenizer_decode(t, 5, 2), "") &&
                    !strcmp(nv_tokenizer_decode(t, 2, 6 + 0xC3), "\xc3") && !strcmp(nv_tokenizer_special_text(t, 2), "<bos>"),
                "pass %d: decoding", pass);
        /* the template's prompt: BOS, then the turns with their markers as single tokens */
        nv_chat_msg msgs[2] = {{.role = "system", .content = "c"}, {.role = "user", .content = " a "}};
        nv_buf text = {0};
        T_CHECK(nv_chat_render_text(NV_CHAT_GEMMA, t, msgs, 2, &(nv_chat_opts){0}, &text) == NV_OK && text.data &&
                    !strcmp(text.data, "<bos><start_of_turn>user\nc\n\na<end_of_turn>\n<start_of_turn>model\n"),
                "pass %d: rendered %s", pass, text.data ? text.data : "(none)");
        nv_buf_free(&text);
        if (!pass) T_CHECK(nv_gguf_save_vocab(t, copy) == NV_OK, "%s", nv_errmsg());
        nv_config c = gemma_config(3);
        c.vocab_size = GW_GEMMA_VOCAB;
        nv_model m;
        if (!pass && gemma_model(&m, &c, 5)) {
            T_CHECK(nv_hf_save(&m, t, ours_dir, NV_HF_BF16, nv_chat_template_jinja(NV_CHAT_GEMMA)) == NV_OK, "%s", nv_errmsg());
            nv_model_free(&m);
        }
        nv_tokenizer_free(t);
    }
}

/* A SentencePiece vocabulary without token types keeps llama2.c's byte ids (b + 3): only a vocabulary
 * that marks its byte tokens has them looked up by piece. (This 8-piece vocabulary's id 4 is "a": after
 * "b" no merge takes it.) */
static void test_untyped_vocabulary_bytes(void) {
    const char *p = t_path("untyped.gguf");
    T_CHECK(gguf_write_model(p, "llama", 3, 1) > 0, "writing %s", p);
    nv_tokenizer *t = NULL;
    int *ids = NULL, n = 0;
    T_CHECK(nv_tokenizer_load(p, 0, &t) == NV_OK && nv_tokenizer_encode(t, "b\x01", 0, 0, &ids, &n) == NV_OK, "%s", nv_errmsg());
    T_CHECK(n >= 1 && ids[n - 1] == 1 + 3, "byte 1 became id %d", n >= 1 ? ids[n - 1] : -1);
    free(ids);
    if (t) nv_tokenizer_free(t);
}

/* A gemma3 model with its vocabulary and template in one file, served: the chat prompt is Gemma's. */
static void test_serve(void) {
    char vocab[700], model[700];
    snprintf(vocab, sizeof vocab, "%s", t_path("gs-vocab.gguf"));
    snprintf(model, sizeof model, "%s", t_path("gs.gguf"));
    nv_config c = gemma_config(3);
    c.swa_period = 6, c.vocab_size = GW_GEMMA_VOCAB;
    nv_model m;
    nv_tokenizer *t = NULL;
    T_CHECK(gw_gemma_vocab(vocab) && nv_tokenizer_load(vocab, 0, &t) == NV_OK, "%s", nv_errmsg());
    if (!t || !gemma_model(&m, &c, 3)) return;
    T_CHECK(nv_gguf_save(&m, t, "gs", model, NV_GGUF_Q8_0, nv_chat_template_jinja(NV_CHAT_GEMMA), NULL) == NV_OK, "%s", nv_errmsg());
    nv_tokenizer_free(t);
    nv_model_free(&m);
    /* BOS, <start_of_turn>, "user" (4 bytes), a line break, "a", <end_of_turn>, a line break, <start_of_turn>,
       "model" (5 bytes), a line break: 17 */
    const int n = chat_prompt_tokens("gemma-serve", model, NULL, "--no-prefix-cache");
    T_CHECK(n == 17, "%d prompt tokens", n);
}

/* A completion of the served model at temperature 0 with its log-probabilities (prompt: a JSON
 * value, a string or a list of token ids): the text and the logprobs object printed, or NULL (the
 * status and body on stderr unless a 400) when it was not a 200; its prompt and cached tokens. */
static char *greedy_completion_with(int port, const char *prompt, int max_tokens, const char *more, int *prompt_tokens, int *cached,
                                    int *status) {
    nv_buf body = {0};
    nv_buf_printf(&body, "{\"prompt\": %s, \"max_tokens\": %d, \"temperature\": 0, \"logprobs\": 2%s}", prompt, max_tokens, more);
    resp r = {0};
    char *out = NULL;
    *status = body.data && http(port, "POST", "/v1/completions", NULL, body.data, &r) ? r.status : -1;
    free(body.data);
    cJSON *j = r.status == 200 && r.body ? cJSON_Parse(r.body) : NULL;
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), *u = cJSON_GetObjectItem(j, "usage");
    const cJSON *text = cJSON_GetObjectItem(ch, "text"), *lps = cJSON_GetObjectItem(ch, "logprobs");
    const cJSON *pt = cJSON_GetObjectItem(u, "prompt_tokens");
    const cJSON *ct = cJSON_GetObjectItem(cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens");
    if (cJSON_IsString(text) && lps && cJSON_IsNumber(pt)) {
        char *l = cJSON_PrintUnformatted(lps);
        nv_buf b = {0};
        nv_buf_printf(&b, "%s\n%s", text->valuestring, l ? l : "");
        free(l);
        out = b.data;
        *prompt_tokens = pt->valueint;
        *cached = cJSON_IsNumber(ct) ? ct->valueint : 0;
    } else if (r.status != 400) {
        fprintf(stderr, "    status %d: %s\n", r.status, r.body ? r.body : "");
    }
    cJSON_Delete(j);
    resp_free(&r);
    return out;
}

static char *greedy_completion(int port, const char *prompt, int max_tokens, int *prompt_tokens, int *cached, int *status) {
    return greedy_completion_with(port, prompt, max_tokens, "", prompt_tokens, cached, status);
}

/* A JSON list of n token ids of the test vocabulary, the same for the same seed. */
static void token_lists(char *out, size_t cap, int n, unsigned seed, int n_more, unsigned seed_more) {
    size_t at = (size_t)snprintf(out, cap, "[1");
    for (int i = 1; i < n + n_more && at < cap; i++) {
        unsigned *sd = i < n ? &seed : &seed_more;
        *sd = *sd * 1103515245u + 12345u;
        at += (size_t)snprintf(out + at, cap - at, ",%u", 3 + (*sd >> 8) % (GW_GEMMA_VOCAB - 3));
    }
    if (at < cap) snprintf(out + at, cap - at, "]");
}

static void token_list(char *out, size_t cap, int n, unsigned seed) { token_lists(out, cap, n, seed, 0, 0); }

/* --swa-cache window: a Gemma 3-shaped model (a window of 5 on five layers of six) serves a prompt of
 * many windows through rings of 6 blocks of 4 positions, with exactly the tokens and
 * log-probabilities of every position kept; a budget too small for every position of every layer
 * still holds it, whole-context layers beside windowed rings; and a prompt that continues a finished
 * one reuses its prefix through the ring it left (a checkpoint), with the same answer again. */
/* A Gemma 3-shaped model with its vocabulary (a window of 5 on five layers of six, a context of 512)
 * in model; 0 on failure. */
static int window_model(char *model, size_t cap) {
    char vocab[700];
    snprintf(vocab, sizeof vocab, "%s", t_path("gw-vocab.gguf"));
    snprintf(model, cap, "%s", t_path("gw.gguf"));
    nv_config c = gemma_config(3);
    c.vocab_size = GW_GEMMA_VOCAB, c.seq_len = 512, c.n_layers = 6, c.swa_period = 6; /* Gemma 3's pattern: the last layer global */
    nv_model m;
    nv_tokenizer *t = NULL;
    T_CHECK(gw_gemma_vocab(vocab) && nv_tokenizer_load(vocab, 0, &t) == NV_OK, "%s", nv_errmsg());
    if (!t || !gemma_model(&m, &c, 5)) {
        if (t) nv_tokenizer_free(t);
        return 0;
    }
    const int ok = nv_gguf_save(&m, t, "gw", model, NV_GGUF_F32, NULL, NULL) == NV_OK;
    T_CHECK(ok, "%s", nv_errmsg());
    nv_tokenizer_free(t);
    nv_model_free(&m);
    return ok;
}

static void test_serve_window_cache(void) {
    char model[700];
    if (!window_model(model, sizeof model)) return;
    /* prompts: a long text, then the same again (its answer is longer than a ring reaches back:
       the snapshot at its prompt's end serves it); 61 token ids, then the same 61 and 50 more (a
       conversation's next turn); a third of 70 others */
    enum { LONG, AGAIN, FIRST, NEXT, OTHER, N_PROMPTS };
    static char prompts[N_PROMPTS][1600];
    char text[400] = "";
    for (int i = 0; i < 30; i++) strcat(text, i % 3 ? "abc def " : "ghi jk ");
    snprintf(prompts[LONG], sizeof prompts[LONG], "\"%s\"", text);
    snprintf(prompts[AGAIN], sizeof prompts[AGAIN], "%s", prompts[LONG]);
    token_list(prompts[FIRST], sizeof prompts[FIRST], 61, 7);
    token_list(prompts[NEXT], sizeof prompts[NEXT], 111, 7);
    token_list(prompts[OTHER], sizeof prompts[OTHER], 70, 99);
    /* f16 blocks of 4 positions: 3 KB with every layer, 512 bytes for the global layer, 2.5 KB for the
       windowed ones; 128K holds 168 positions of every layer, fewer than the long prompt and answer's;
       split, three rings of 6 blocks (45 KB: two running sequences' and one kept) and 166 blocks of the
       global layer (664 positions) */
    /* (the SSD tier: its own test; rings sized for steps of 16 rows, not a prediction's 17) */
    const char *common = "--kv-block 4 --prefill-chunk 16 --max-batch 2 --kv-disk-cache 0 --prediction-tokens 0";
    /* the windowed server also drafts by prompt lookup: rows past the sequence's position enter its ring */
    /* (auto, the default, is window where the budget cannot hold the context of 512 with every layer) */
    static const char *const modes[] = {"--kv-memory 128K --swa-cache full --no-prefix-cache", "--kv-memory 128K --spec-tokens 4",
                                        "--no-prefix-cache"};
    char *got[3][N_PROMPTS] = {{NULL}};
    int n_prompt[3][N_PROMPTS] = {{0}}, cached[3][N_PROMPTS] = {{0}}, status[3][N_PROMPTS] = {{0}};
    for (int k = 0; k < 3; k++) {
        server sv;
        char flags[300], name[32];
        snprintf(flags, sizeof flags, "%s %s", common, modes[k]);
        snprintf(name, sizeof name, "gw-%d", k);
        if (!server_spawn(&sv, name, NULL, NULL, model, NULL, flags, 30)) {
            T_CHECK(0, "the server did not start with %s", flags);
            continue;
        }
        for (int q = 0; q < N_PROMPTS; q++)
            got[k][q] = greedy_completion(sv.port, prompts[q], q == FIRST ? 1 : 40, &n_prompt[k][q], &cached[k][q], &status[k][q]);
        char *log = read_log(&sv);
        if (k != 1) T_CHECK(!strstr(log, "windowed layers' KV"), "%s: full pages reported split", flags);
        if (k == 0)
            T_CHECK(status[0][LONG] == 400 && status[0][AGAIN] == 400, "every position of every layer: a request past the pool answered %d",
                    status[0][LONG]);
        if (k == 1) {
            T_CHECK(strstr(log, "windowed layers' KV 18 blocks") && strstr(log, "windowed-layer checkpoints") &&
                        strstr(log, "would not fit --kv-memory"),
                    "the split pool was not reported:\n%s", log);
            T_CHECK(got[1][LONG] && n_prompt[1][LONG] > 200, "window: %d prompt tokens, status %d", n_prompt[1][LONG], status[1][LONG]);
            /* the next turn continued the first from its last full block; the other prompt took the room of
               the least recently used ring, so two are kept */
            T_CHECK(cached[1][NEXT] == 60 && cached[1][FIRST] == 0 && cached[1][OTHER] == 0, "cached tokens %d, %d, %d",
                    cached[1][FIRST], cached[1][NEXT], cached[1][OTHER]);
            /* the same prompt again: every full block but the last position's, from the snapshot */
            T_CHECK(cached[1][LONG] == 0 && cached[1][AGAIN] == (n_prompt[1][LONG] - 1) / 4 * 4, "the long prompt again: %d of %d tokens cached",
                    cached[1][AGAIN], n_prompt[1][AGAIN]);
            T_CHECK(metric(sv.port, "nerve_kv_window_blocks_total") == 18 && metric(sv.port, "nerve_kv_window_blocks_in_use") == 0 &&
                        metric(sv.port, "nerve_kv_window_blocks_reserved") == 0 && metric(sv.port, "nerve_kv_window_blocks_kept") > 0 &&
                        metric(sv.port, "nerve_kv_window_blocks_kept") <= 18 &&
                        metric(sv.port, "nerve_kv_blocks_in_use") == 0,
                    "after the requests: windowed blocks in use %g, reserved %g, kept %g", metric(sv.port, "nerve_kv_window_blocks_in_use"),
                    metric(sv.port, "nerve_kv_window_blocks_reserved"), metric(sv.port, "nerve_kv_window_blocks_kept"));
        }
        free(log);
        T_CHECK(server_stop_within(&sv, 20) == 0, "the server (%s) did not exit 0", flags);
    }
    /* every answer as the server that keeps every position of every layer and no cache gives it */
    for (int q = 0; q < N_PROMPTS; q++) {
        T_CHECK(got[2][q] && got[1][q] && n_prompt[2][q] == n_prompt[1][q] && !strcmp(got[2][q], got[1][q]),
                "prompt %d: the windowed rings changed the answer or its log-probabilities:\n  full:   %.300s\n  window: %.300s", q,
                got[2][q] ? got[2][q] : "-", got[1][q] ? got[1][q] : "-");
        if (q != LONG && q != AGAIN)
            T_CHECK(got[0][q] && !strcmp(got[0][q], got[2][q]), "prompt %d: a smaller pool changed the answer", q);
        for (int k = 0; k < 3; k++) free(got[k][q]);
    }
}

/* --swa-cache window, prompts that share a long beginning and go on differently (a system prompt and
 * tools, then each request's own text): no checkpoint holds the window where the shared part ends, so
 * the second prompt runs whole, and leaves one there; the third continues from it. Every answer is the
 * one a server without the cache and with every position of every layer gives. */
static void test_serve_window_shared_prefix(void) {
    char model[700];
    if (!window_model(model, sizeof model)) return;
    enum { N = 3 };
    static char prompts[N][1600];
    for (int q = 0; q < N; q++) token_lists(prompts[q], sizeof prompts[q], 45, 7, 40, 200 + (unsigned)q);
    static const char *const modes[] = {"--swa-cache window", "--swa-cache full --no-prefix-cache"};
    char *got[2][N] = {{NULL}};
    int cached[2][N] = {{0}};
    for (int k = 0; k < 2; k++) {
        server sv;
        char flags[300], name[32];
        snprintf(flags, sizeof flags, "--kv-block 4 --prefill-chunk 16 --max-batch 2 --kv-disk-cache 0 %s", modes[k]);
        snprintf(name, sizeof name, "gws-%d", k);
        if (!server_spawn(&sv, name, NULL, NULL, model, NULL, flags, 30)) {
            T_CHECK(0, "the server did not start with %s", flags);
            continue;
        }
        for (int q = 0; q < N; q++) {
            int n = 0, status = 0;
            got[k][q] = greedy_completion(sv.port, prompts[q], 6, &n, &cached[k][q], &status);
            T_CHECK(got[k][q] && n == 85, "%s, prompt %d: status %d, %d prompt tokens", flags, q, status, n);
        }
        T_CHECK(server_stop_within(&sv, 20) == 0, "the server (%s) did not exit 0", flags);
    }
    /* the shared 45 tokens: 11 whole blocks of 4 */
    T_CHECK(cached[0][0] == 0 && cached[0][1] == 0 && cached[0][2] == 44, "cached tokens %d, %d, %d (44 for the third)", cached[0][0],
            cached[0][1], cached[0][2]);
    for (int q = 0; q < N; q++) {
        T_CHECK(got[0][q] && got[1][q] && !strcmp(got[0][q], got[1][q]),
                "prompt %d: the answer or its log-probabilities differ:\n  full:   %.300s\n  window: %.300s", q, got[1][q] ? got[1][q] : "-",
                got[0][q] ? got[0][q] : "-");
        free(got[0][q]), free(got[1][q]);
    }
}

/* Greedy answers (text and log-probabilities) to prompts[0..n) of a server started with flags
 * (NULL prompts skipped), each request's cached tokens in cached; 0 when it did not start. */
static int window_answers(const char *model, const char *name, const char *flags, const char *const *prompts, int n, int tokens,
                          char **got, int *cached) {
    server sv;
    if (!server_spawn(&sv, name, NULL, NULL, model, NULL, flags, 30)) {
        T_CHECK(0, "the server did not start with %s", flags);
        return 0;
    }
    for (int q = 0; q < n; q++) {
        int np = 0, status = 0;
        if (prompts[q]) got[q] = greedy_completion(sv.port, prompts[q], tokens, &np, &cached[q], &status);
    }
    T_CHECK(server_stop_within(&sv, 20) == 0, "the server (%s) did not exit 0", flags);
    return 1;
}

/* --swa-cache window: a sequence that continued a checkpoint holds in its ring only the window it
 * copied and the blocks it ran; the checkpoint its ring then becomes claims no more (a prompt sharing
 * only the beginning before that window is not served from the blocks it never wrote). */
static void test_serve_window_resumed_ring(void) {
    char model[700];
    if (!window_model(model, sizeof model)) return;
    static char prompts[3][1600];
    token_list(prompts[0], sizeof prompts[0], 20, 41);           /* W */
    token_lists(prompts[1], sizeof prompts[1], 16, 41, 5, 42);   /* X: W's first 16 tokens, then others */
    token_lists(prompts[2], sizeof prompts[2], 8, 41, 12, 43);   /* Y: W's first 8 */
    const char *const ps[3] = {prompts[0], prompts[1], prompts[2]};
    char *got[2][3] = {{NULL}};
    int cached[2][3] = {{0}};
    /* one sequence at a time: three checkpoints are kept, so W's ring is gone when Y comes */
    window_answers(model, "gwr-window", "--kv-block 4 --prefill-chunk 16 --max-batch 1 --kv-disk-cache 0 --swa-cache window", ps, 3, 4,
                   got[0], cached[0]);
    window_answers(model, "gwr-full", "--kv-block 4 --prefill-chunk 16 --swa-cache full --no-prefix-cache", ps, 3, 4, got[1], cached[1]);
    T_CHECK(cached[0][1] == 16, "X continued W's prompt checkpoint with %d tokens, not 16", cached[0][1]);
    for (int q = 0; q < 3; q++) {
        T_CHECK(got[0][q] && got[1][q] && !strcmp(got[0][q], got[1][q]), "request %d (%d tokens cached): %.200s\n    against %.200s", q,
                cached[0][q], got[0][q] ? got[0][q] : "-", got[1][q] ? got[1][q] : "-");
        free(got[0][q]), free(got[1][q]);
    }
    /* a budget of one ring (18K: 6 windowed blocks, 6 of the global layer; steps of at most 16 rows, so no
       prediction's 17): W's ring, kept, is all the room X's ring could take; X runs whole rather than wait
       for it (for ever: nothing else frees it) */
    static char small[2][400];
    token_list(small[0], sizeof small[0], 20, 51);
    token_lists(small[1], sizeof small[1], 16, 51, 4, 52);
    const char *const sp[2] = {small[0], small[1]};
    char *one[2][2] = {{NULL}};
    int c1[2][2] = {{0}};
    window_answers(model, "gwr-one", "--kv-block 4 --prefill-chunk 16 --max-batch 1 --kv-disk-cache 0 --kv-memory 18K --timeout 10 "
                   "--swa-cache window --prediction-tokens 0", sp, 2, 4, one[0], c1[0]);
    window_answers(model, "gwr-one-full", "--kv-block 4 --prefill-chunk 16 --swa-cache full --no-prefix-cache", sp, 2, 4, one[1], c1[1]);
    for (int q = 0; q < 2; q++) {
        T_CHECK(one[0][q] && one[1][q] && !strcmp(one[0][q], one[1][q]), "one ring, request %d: %.200s\n    against %.200s", q,
                one[0][q] ? one[0][q] : "-", one[1][q] ? one[1][q] : "-");
        free(one[0][q]), free(one[1][q]);
    }
}

/* The .kvb files of the SSD tier's directory under root whose name ends with suffix ("-full",
 * "-windowed"): their paths (at most cap) into names; how many. */
static int tier_files(const char *root, const char *suffix, char names[][800], int cap) {
    DIR *d = opendir(root);
    int n = 0;
    for (struct dirent *de; d && (de = readdir(d));) {
        const size_t l = strlen(de->d_name), sl = strlen(suffix);
        if (l <= sl || strcmp(de->d_name + l - sl, suffix) != 0) continue;
        char sub[800];
        snprintf(sub, sizeof sub, "%s/%s", root, de->d_name);
        DIR *f = opendir(sub);
        for (struct dirent *fe; f && (fe = readdir(f));)
            if (strstr(fe->d_name, ".kvb") && n < cap && strlen(sub) + strlen(fe->d_name) + 2 <= 800) {
                memcpy(names[n], sub, strlen(sub));
                names[n][strlen(sub)] = '/';
                memcpy(names[n] + strlen(sub) + 1, fe->d_name, strlen(fe->d_name) + 1);
                n++;
            }
        if (f) closedir(f);
    }
    if (d) closedir(d);
    return n;
}

/* --swa-cache window with the SSD tier: each block's two sides (the whole-context layers' and the
 * windowed ones') in parts of their own; after a restart a prompt is served from disk, its window
 * read into its ring, and a prompt sharing its beginning from the whole-context blocks in RAM and a
 * window from disk; windowed files corrupted on disk: the prompt runs whole. Every answer is the one a
 * server without the cache and with every position of every layer gives. */
static void test_serve_window_disk(void) {
    char model[700];
    if (!window_model(model, sizeof model)) return;
    static char p1[1600], p2[1600];
    token_list(p1, sizeof p1, 120, 31);
    token_lists(p2, sizeof p2, 80, 31, 40, 77);
    const char *dir = t_path("gw-kvdisk");
    char flags[1200];
    snprintf(flags, sizeof flags, "--kv-block 4 --prefill-chunk 16 --max-batch 2 --swa-cache window --kv-cache-dir '%s'", dir);
    const char *const both[2] = {p1, p2};
    char *want[2] = {NULL}, *first[1] = {NULL}, *again[2] = {NULL}, *after[1] = {NULL};
    int wc[2] = {0}, c0[1] = {0}, c1[2] = {0}, c2[1] = {0};
    window_answers(model, "gwd-full", "--kv-block 4 --prefill-chunk 16 --swa-cache full --no-prefix-cache", both, 2, 6, want, wc);
    window_answers(model, "gwd-1", flags, both, 1, 6, first, c0);
    static char files[2][256][800];
    const int nf = tier_files(dir, "-full", files[0], 256), nw = tier_files(dir, "-windowed", files[1], 256);
    /* 120 tokens and 5 generated: 30 whole blocks, every one of which was written (the ring still held it) */
    T_CHECK(nf >= 29 && nw >= 29, "%d whole-context and %d windowed block files", nf, nw);
    window_answers(model, "gwd-2", flags, both, 2, 6, again, c1);
    T_CHECK(c0[0] == 0 && c1[0] == 116 && c1[1] == 80, "tokens from the cache: %d, after the restart %d and %d (116, 80)", c0[0], c1[0],
            c1[1]);
    for (int i = 0; i < nw; i++) { /* every windowed file's payload corrupted */
        int fd = open(files[1][i], O_RDWR);
        char c = 0;
        if (fd >= 0 && pread(fd, &c, 1, 80 + 16 + 7) == 1) {
            c ^= 0x10;
            T_CHECK(pwrite(fd, &c, 1, 80 + 16 + 7) == 1, "corrupt %s", files[1][i]);
        }
        if (fd >= 0) close(fd);
    }
    window_answers(model, "gwd-3", flags, both, 1, 6, after, c2);
    T_CHECK(c2[0] == 0, "with its windows corrupted, %d tokens came from the cache", c2[0]);
    const char *got[4] = {first[0], again[0], again[1], after[0]}, *ref[4] = {want[0], want[0], want[1], want[0]};
    for (int i = 0; i < 4; i++)
        T_CHECK(got[i] && ref[i] && !strcmp(got[i], ref[i]), "answer %d: %.200s\n    against %.200s", i, got[i] ? got[i] : "-",
                ref[i] ? ref[i] : "-");
    free(want[0]), free(want[1]), free(first[0]), free(again[0]), free(again[1]), free(after[0]);
}

/* One client's requests, in order, and what came back. */
enum { WC_CLIENTS = 4, WC_EACH = 3 };
/* the first answer is one token: what follows its prompt in the second is not that answer, and the
   ring reaches back only about a prefill chunk past its window */
static const int wc_tokens[WC_EACH] = {1, 12, 17};
typedef struct {
    int port;
    const char *prompt[WC_EACH];
    char *got[WC_EACH];
} wc_client;

static void *wc_client_main(void *arg) {
    wc_client *w = arg;
    for (int q = 0; q < WC_EACH; q++) {
        int n = 0, cached = 0, status = 0;
        w->got[q] = greedy_completion(w->port, w->prompt[q], wc_tokens[q], &n, &cached, &status);
    }
    return NULL;
}

/* --swa-cache window under concurrency: four clients at once, three requests each (a prompt, the
 * same prompt continued, another), through two sequences at a time, so requests queue for rings and
 * checkpoints are evicted while others are made and resumed, with a draft model (the model itself)
 * proposing tokens; every answer is the one a server
 * without the cache and with every position of every layer gives the same prompt alone, and
 * afterwards no block is taken but the kept checkpoints. */
static void test_serve_window_cache_concurrent(void) {
    char model[700];
    if (!window_model(model, sizeof model)) return;
    static char prompts[WC_CLIENTS][WC_EACH][1600];
    char *want[WC_CLIENTS][WC_EACH] = {{NULL}};
    wc_client w[WC_CLIENTS];
    for (int i = 0; i < WC_CLIENTS; i++) {
        token_list(prompts[i][0], sizeof prompts[i][0], 50 + 13 * i, 11 + (unsigned)i);
        token_list(prompts[i][1], sizeof prompts[i][1], 90 + 13 * i, 11 + (unsigned)i); /* the first continued */
        token_list(prompts[i][2], sizeof prompts[i][2], 30 + 7 * i, 50 + (unsigned)i);
        for (int q = 0; q < WC_EACH; q++) w[i].prompt[q] = prompts[i][q], w[i].got[q] = NULL;
    }
    server sv;
    if (server_spawn(&sv, "gwc-full", NULL, NULL, model, NULL, "--kv-block 4 --prefill-chunk 8 --swa-cache full --no-prefix-cache", 30)) {
        for (int i = 0; i < WC_CLIENTS; i++)
            for (int q = 0; q < WC_EACH; q++) {
                int n = 0, cached = 0, status = 0;
                want[i][q] = greedy_completion(sv.port, prompts[i][q], wc_tokens[q], &n, &cached, &status);
            }
        T_CHECK(server_stop_within(&sv, 20) == 0, "the reference server did not exit 0");
    }
    /* the model drafts for itself: its draft's keys and values sit on full pages under the pool's block
       ids; then with the SSD tier, and the same again after a restart (prefixes read from disk while
       other sequences run) */
    char flags[3][1400];
    for (int k = 0; k < 3; k++)
        snprintf(flags[k], sizeof flags[k], "--kv-block 4 --prefill-chunk 8 --max-batch 2 %s --swa-cache window --model-draft '%s' --spec-tokens 3",
                 k ? "" : "--kv-disk-cache 0", model);
    for (int k = 1; k < 3; k++)
        snprintf(flags[k] + strlen(flags[k]), sizeof flags[k] - strlen(flags[k]), " --kv-cache-dir '%s'", t_path("gwc-kvdisk"));
    for (int k = 0; k < 3; k++) {
        char name[32];
        snprintf(name, sizeof name, "gwc-window-%d", k); /* (a log of its own: a new server's is not the last one's) */
        if (!server_spawn(&sv, name, NULL, NULL, model, NULL, flags[k], 30)) {
            T_CHECK(0, "the windowed server did not start with %s", flags[k]);
            continue;
        }
        pthread_t th[WC_CLIENTS];
        for (int i = 0; i < WC_CLIENTS; i++) {
            w[i].port = sv.port;
            pthread_create(&th[i], NULL, wc_client_main, &w[i]);
        }
        for (int i = 0; i < WC_CLIENTS; i++) pthread_join(th[i], NULL);
        const double from_cache = metric(sv.port, "nerve_prefix_cached_tokens_total");
        T_CHECK(wait_pool_idle(sv.port), "%s: the pool's blocks were not all back within 20 s (the SSD writer's included)", flags[k]);
        T_CHECK(metric(sv.port, "nerve_kv_window_blocks_in_use") == 0 && metric(sv.port, "nerve_kv_window_blocks_reserved") == 0 &&
                    metric(sv.port, "nerve_kv_blocks_in_use") == 0 && metric(sv.port, "nerve_kv_blocks_reserved") == 0 &&
                    metric(sv.port, "nerve_kv_window_blocks_kept") > 0 &&
                    metric(sv.port, "nerve_kv_window_blocks_kept") <= metric(sv.port, "nerve_kv_window_blocks_total"),
                "%s, after the clients: windowed blocks in use %g, kept %g of %g, %g prompt tokens from the cache", flags[k],
                metric(sv.port, "nerve_kv_window_blocks_in_use"), metric(sv.port, "nerve_kv_window_blocks_kept"),
                metric(sv.port, "nerve_kv_window_blocks_total"), from_cache);
        /* after the restart every first prompt is on disk */
        if (k == 2) T_CHECK(from_cache >= 4 * 48, "after the restart %g prompt tokens from the cache", from_cache);
        if (k == 0) { /* with two sequences running, a new ring takes a checkpoint's room: under this load few
                         of them live long enough to be continued; alone, the first prompt and its continuation again */
            int n = 0, cached[2] = {0, 0}, status = 0;
            for (int q = 0; q < 2; q++) free(greedy_completion(sv.port, prompts[0][q], wc_tokens[q], &n, &cached[q], &status));
            T_CHECK(cached[1] == 48, "the continued prompt took %d tokens from the cache, not 48", cached[1]);
        }
        if (getenv("T_VERBOSE")) printf("    %s: %g prompt tokens from the cache\n", k == 0 ? "RAM" : k == 1 ? "SSD tier" : "restarted", from_cache);
        if (server_stop_within(&sv, 20) != 0) {
            T_CHECK(0, "the windowed server (%s) did not exit 0", flags[k]);
            print_log(&sv);
        }
        int same = 0;
        for (int i = 0; i < WC_CLIENTS; i++)
            for (int q = 0; q < WC_EACH; q++) {
                const int ok = want[i][q] && w[i].got[q] && !strcmp(want[i][q], w[i].got[q]);
                T_CHECK(ok, "%s: client %d, request %d: %.200s\n    against %.200s", flags[k], i, q, w[i].got[q] ? w[i].got[q] : "-",
                        want[i][q] ? want[i][q] : "-");
                same += ok;
                free(w[i].got[q]);
                w[i].got[q] = NULL;
            }
        T_CHECK(same == WC_CLIENTS * WC_EACH, "%d of %d answers as the reference's", same, WC_CLIENTS * WC_EACH);
    }
    for (int i = 0; i < WC_CLIENTS; i++)
        for (int q = 0; q < WC_EACH; q++) free(want[i][q]);
}

/* The first and the mean of the last three losses in a run's metrics.jsonl. */
static int first_last_loss(const char *run, double *first, double *last) {
    char path[800], *text = NULL;
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    if (nv_file_read_all(path, &text, NULL) != NV_OK) return 0;
    double l[64];
    int n = 0;
    for (const char *p = text; n < 64 && (p = strstr(p, "\"loss\":")) != NULL; p += 7) l[n++] = atof(p + 7);
    free(text);
    if (n < 4) return 0;
    *first = l[0], *last = (l[n - 1] + l[n - 2] + l[n - 3]) / 3;
    return 1;
}

/* Gemma 2, Gemma 3, SmolLM3, Granite, partial rotation, OLMo 2 and 3 fine-tune (their backward:
 * tests/test_train_grad.c): the loss falls, and the run writes the model back as its own architecture
 * with its config unchanged, which then generates; Gemma 3, Granite, partial rotation and OLMo 2 take
 * LoRA adapters too. */
static void finetune(int gen) {
    const char *tok = t_data("models/tok512.bin"), *text = t_data("corpus/tinystories_valid_head.txt");
    if (!tok || !text) return;
    nv_config c = gemma_config(gen);
    c.vocab_size = 512;
    if (gen == 3) c.swa_period = 6; /* the loader's pattern */
    if (gen == 5) c.logit_div = 1.25f; /* logits divided by 8 learn too slowly for 12 steps of this model */
    nv_model m;
    if (!gemma_model(&m, &c, 11)) return;
    char model[700], run[700], out[800], args[3000], name[32];
    snprintf(name, sizeof name, "ft%d.gguf", gen);
    snprintf(model, sizeof model, "%s", t_path(name));
    snprintf(name, sizeof name, "ft%d-run", gen);
    snprintf(run, sizeof run, "%s", t_path(name));
    snprintf(out, sizeof out, "%s/model.gguf", run);
    T_CHECK(nv_gguf_save(&m, NULL, "ft", model, NV_GGUF_F32, NULL, NULL) == NV_OK, "%s", nv_errmsg());
    nv_model_free(&m);
    /* OLMo's untied classifier starts at the uniform loss, its branches normed: a faster rate for 12 steps */
    snprintf(args, sizeof args, "train --init-from '%s' -z '%s' --data '%s' --steps 12 --batch 2 --seq 24 --lr %s --quiet --out '%s'",
             model, tok, text, gen >= 10 ? "1e-2" : "3e-3", run);
    T_CHECK(t_nerve(args) == 0, "kind %d: train: %s", gen, t_err);
    double first = 0, last = 0;
    T_CHECK(first_last_loss(run, &first, &last) && last < first - 0.5, "kind %d: loss %.4g, then %.4g", gen, first, last);
    printf("    kind %d: loss %.3f, after 12 steps %.3f\n", gen, first, last);
    T_CHECK(written_as(out, gen), "kind %d: the run wrote another architecture", gen);
    nv_config back;
    T_CHECK(nv_model_read_config(out, &back) == NV_OK && !memcmp(&back, &c, sizeof c), "kind %d: the run's model has another config: %s",
            gen, nv_errmsg());
    snprintf(args, sizeof args, "generate -m '%s' -z '%s' -n 8 -t 0 -p Once", out, tok);
    T_CHECK(t_nerve(args) == 0 && t_out[0], "kind %d: generate from the run's model: %s", gen, t_err);
    if (gen != 3 && gen != 5 && gen != 8 && gen != 10 && gen != 12) return;
    snprintf(args, sizeof args,
             "train --init-from '%s' -z '%s' --data '%s' --steps 6 --batch 2 --seq 24 --lr 3e-3 --lora-rank 4 --quiet --out '%s-lora'", model,
             tok, text, run);
    T_CHECK(t_nerve(args) == 0, "LoRA on kind %d: %s", gen, t_err);
    snprintf(args, sizeof args, "generate -m '%s' -z '%s' --lora '%s-lora/adapter.gguf' -n 8 -t 0 -p Once", model, tok, run);
    T_CHECK(t_nerve(args) == 0 && t_out[0], "generate with the kind %d adapter: %s", gen, t_err);
}

static void test_finetune(void) {
    for (int i = 1; i < N_KINDS; i++) finetune(kinds[i]);
}

/* A greedy request run from a thread (greedy_completion_with's answer), and when it ended. */
typedef struct {
    int port, max_tokens;
    const char *prompt, *more;
    char *got;
    double t_done;
} wp_job;

static void *wp_job_main(void *arg) {
    wp_job *j = arg;
    int n = 0, cached = 0, status = 0;
    j->got = greedy_completion_with(j->port, j->prompt, j->max_tokens, j->more, &n, &cached, &status);
    j->t_done = now_s();
    return NULL;
}

/* Runs a, then (once it has run after_ms) b beside it, and waits for both. */
static void wp_run_pair(int port, wp_job *a, wp_job *b, int after_ms) {
    pthread_t ta, tb;
    a->port = b->port = port;
    pthread_create(&ta, NULL, wp_job_main, a);
    wait_metric(port, "nerve_running_sequences", 1);
    sleep_ms(after_ms);
    pthread_create(&tb, NULL, wp_job_main, b);
    pthread_join(tb, NULL);
    pthread_join(ta, NULL);
}

/* Preemption on split pages (--swa-cache window): a running sequence sent back to the queue keeps its
 * ring as a checkpoint and, once admitted again, goes on from it (or from the SSD tier's two parts,
 * or computes its positions again without a prefix cache); --kv-overcommit grows the whole-context
 * layers' blocks as on full pages. Every answer, log-probabilities included, is the one a server
 * with every position of every layer gives it alone. */
static void test_serve_window_preemption(void) {
    char model[700];
    if (!window_model(model, sizeof model)) return;
    char low_prompt[1600], high_prompt[400];
    token_list(low_prompt, sizeof low_prompt, 41, 5);
    token_list(high_prompt, sizeof high_prompt, 9, 23);
    char low_prompt_short[400];
    token_list(low_prompt_short, sizeof low_prompt_short, 9, 5);
    enum { LOW_TOKENS = 90, HIGH_TOKENS = 6, SHORT_TOKENS = 14, RING_TOKENS = 15 };
    char *want_low = NULL, *want_high = NULL, *want_short = NULL, *want_ring = NULL;
    server sv;
    if (!server_spawn(&sv, "gwp-full", NULL, NULL, model, NULL, "--kv-block 4 --prefill-chunk 16 --swa-cache full --no-prefix-cache", 30)) {
        T_CHECK(0, "the reference server did not start");
        return;
    }
    int n = 0, cached = 0, status = 0;
    want_low = greedy_completion(sv.port, low_prompt, LOW_TOKENS, &n, &cached, &status);
    want_high = greedy_completion(sv.port, high_prompt, HIGH_TOKENS, &n, &cached, &status);
    want_short = greedy_completion(sv.port, high_prompt, SHORT_TOKENS, &n, &cached, &status);
    want_ring = greedy_completion(sv.port, low_prompt_short, RING_TOKENS, &n, &cached, &status);
    T_CHECK(server_stop_within(&sv, 20) == 0 && want_low && want_high && want_short && want_ring, "the reference server failed");
    /* the only sequence, preempted by a lower priority value: its ring kept in RAM (a checkpoint), read
       back from the SSD tier (no RAM cache: both parts from disk), or no prefix cache at all */
    /* (and with drafts by prompt lookup, whose rows past a sequence's position enter its ring) */
    char flags[4][1200];
    const char *common = "--kv-block 4 --prefill-chunk 16 --max-batch 1 --swa-cache window --scheduling-policy priority";
    snprintf(flags[0], sizeof flags[0], "%s --kv-disk-cache 0", common);
    snprintf(flags[1], sizeof flags[1], "%s --kv-ram-cache 0 --kv-cache-dir '%s'", common, t_path("gwp-kvdisk"));
    snprintf(flags[2], sizeof flags[2], "%s --no-prefix-cache", common);
    snprintf(flags[3], sizeof flags[3], "%s --kv-disk-cache 0 --spec-tokens 4", common);
    for (int k = 0; k < 4; k++) {
        char name[32];
        snprintf(name, sizeof name, "gwp-window-%d", k);
        if (!server_spawn(&sv, name, NULL, "NERVE_LOG=debug NERVE_TEST_STEP_DELAY_MS=15", model, NULL, flags[k], 30)) {
            T_CHECK(0, "the windowed server did not start with %s", flags[k]);
            continue;
        }
        wp_job low = {.prompt = low_prompt, .max_tokens = LOW_TOKENS, .more = ", \"priority\": 3"},
               high = {.prompt = high_prompt, .max_tokens = HIGH_TOKENS, .more = ", \"priority\": -1"};
        wp_run_pair(sv.port, &low, &high, k == 3 ? 100 : 500); /* (drafts make the answer quick) */
        T_CHECK(metric(sv.port, "nerve_preemptions_total") == 1 && high.t_done < low.t_done, "%s: %g preemptions", flags[k],
                metric(sv.port, "nerve_preemptions_total"));
        T_CHECK(low.got && !strcmp(low.got, want_low), "%s: the preempted answer: %.300s\n    against %.300s", flags[k],
                low.got ? low.got : "-", want_low);
        T_CHECK(high.got && !strcmp(high.got, want_high), "%s: the urgent answer differs", flags[k]);
        T_CHECK(wait_pool_idle(sv.port) && metric(sv.port, "nerve_kv_window_blocks_in_use") == 0 &&
                    metric(sv.port, "nerve_kv_window_blocks_reserved") == 0,
                "%s: blocks still held", flags[k]);
        char *log = read_log(&sv);
        /* at least its prompt's positions from the checkpoint (k 0) or from disk (k 1) */
        const char *back = strstr(log, "back: ");
        if (!back) print_log(&sv);
        int ram = -1, all = 0, disk = -1;
        if (back) sscanf(back, "back: %d of its %d positions found in the prefix cache (%d on disk)", &ram, &all, &disk);
        /* (with drafts it is preempted early, when its prompt may still be running: any way back will do) */
        T_CHECK(k == 3 || (k == 0 ? ram >= 40 && disk == 0 : k == 1 ? ram == 0 && disk >= 40 : ram == 0 && disk == 0), "%s: how it came back: %.200s",
                flags[k], back ? back : "(not logged)");
        free(log);
        free(low.got), free(high.got);
        T_CHECK(server_stop_within(&sv, 20) == 0, "the windowed server (%s) did not exit 0", flags[k]);
    }
    /* --kv-overcommit: two of them at once though the whole-context layers' 39 blocks hold one's prompt
       and max_tokens (35 blocks) only; the later goes back when the pool runs short */
    if (server_spawn(&sv, "gwp-overcommit", NULL, "NERVE_TEST_STEP_DELAY_MS=15", model, NULL,
                     "--kv-block 4 --prefill-chunk 16 --max-batch 2 --swa-cache window --kv-memory 72K --kv-overcommit --kv-disk-cache 0",
                     30)) {
        T_CHECK(metric(sv.port, "nerve_kv_blocks_total") == 39, "%g blocks", metric(sv.port, "nerve_kv_blocks_total"));
        wp_job first = {.prompt = low_prompt, .max_tokens = LOW_TOKENS, .more = ""}, second = first;
        wp_run_pair(sv.port, &first, &second, 100);
        T_CHECK(first.got && second.got && !strcmp(first.got, want_low) && !strcmp(second.got, want_low),
                "overcommitted: %.200s\n    %.200s\n    against %.200s", first.got ? first.got : "-", second.got ? second.got : "-", want_low);
        T_CHECK(metric(sv.port, "nerve_preemptions_total") >= 1 && first.t_done < second.t_done, "overcommitted: %g preemptions",
                metric(sv.port, "nerve_preemptions_total"));
        T_CHECK(wait_pool_idle(sv.port), "overcommitted: blocks still held");
        free(first.got), free(second.got);
        T_CHECK(server_stop_within(&sv, 20) == 0, "the overcommitted server did not exit 0");
    } else {
        T_CHECK(0, "the overcommitted server did not start");
    }
    /* room in the windowed layers' pool alone: rings for three of the four sequences (--kv-memory 60K:
       20 blocks, 20 of the whole-context layers'), three running, each ring 6 blocks; a fourth of a
       lower priority value whose whole-context blocks fit preempts one for its ring */
    if (server_spawn(&sv, "gwp-rings", NULL, "NERVE_TEST_STEP_DELAY_MS=40", model, NULL,
                     "--kv-block 4 --prefill-chunk 16 --max-batch 4 --swa-cache window --kv-memory 60K --kv-disk-cache 0 "
                     "--scheduling-policy priority",
                     30)) {
        T_CHECK(metric(sv.port, "nerve_kv_window_blocks_total") == 20 && metric(sv.port, "nerve_kv_blocks_total") == 20, "%g and %g blocks",
                metric(sv.port, "nerve_kv_window_blocks_total"), metric(sv.port, "nerve_kv_blocks_total"));
        wp_job lows[3], high = {.port = sv.port, .prompt = high_prompt, .max_tokens = SHORT_TOKENS, .more = ", \"priority\": -1"};
        pthread_t tl[3], th;
        for (int i = 0; i < 3; i++) {
            lows[i] = (wp_job){.port = sv.port, .prompt = low_prompt_short, .max_tokens = RING_TOKENS, .more = ", \"priority\": 3"};
            pthread_create(&tl[i], NULL, wp_job_main, &lows[i]);
            T_CHECK(wait_metric(sv.port, "nerve_running_sequences", i + 1), "low %d did not start", i);
        }
        pthread_create(&th, NULL, wp_job_main, &high);
        pthread_join(th, NULL);
        int same = 0, later = 0;
        for (int i = 0; i < 3; i++) {
            pthread_join(tl[i], NULL);
            same += lows[i].got && !strcmp(lows[i].got, want_ring);
            later += lows[i].t_done > high.t_done;
            free(lows[i].got);
        }
        T_CHECK(high.got && !strcmp(high.got, want_short) && same == 3, "rings: the urgent answer %s, %d of 3 others as alone",
                high.got ? "differs" : "failed", same);
        T_CHECK(metric(sv.port, "nerve_preemptions_total") == 1 && later >= 1, "rings: %g preemptions, %d done after the urgent one",
                metric(sv.port, "nerve_preemptions_total"), later);
        free(high.got);
        T_CHECK(server_stop_within(&sv, 20) == 0, "the rings' server did not exit 0");
    } else {
        T_CHECK(0, "the rings' server did not start");
    }
    free(want_low), free(want_high), free(want_short), free(want_ring);
}

int main(void) {
    T_RUN(test_forward_matches_reference);
    T_RUN(test_gguf_round_trip);
    T_RUN(test_refusals_and_info);
    T_RUN(test_vocabulary);
    T_RUN(test_untyped_vocabulary_bytes);
    T_RUN(test_hf_folder);
    T_RUN(test_hf_written);
    T_RUN(test_serve);
    T_RUN(test_serve_window_cache);
    T_RUN(test_serve_window_shared_prefix);
    T_RUN(test_serve_window_resumed_ring);
    T_RUN(test_serve_window_disk);
    T_RUN(test_serve_window_cache_concurrent);
    T_RUN(test_serve_window_preemption);
    T_RUN(test_training_forward_matches);
    T_RUN(test_finetune);
    return t_done();
}
