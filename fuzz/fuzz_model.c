/* libFuzzer harness: nv_model_load on untrusted llama2.c checkpoints (legacy v0 and v1).
 *
 * The input is the checkpoint file. A failure must carry one line of message. On success the
 * harness checks what src/model/model.h promises: the config is valid, n_params is the
 * config's count, every tensor lies inside the parameter block (and its first and last values
 * are read, so ASan sees a v0 copy that is too short), a v1 file is exactly header + weights;
 * then it writes the model as v1 and loads it back, which must give the same config and
 * weights; loads it as generate and serve do (a GGUF file's quantized matrices pending), whose
 * scalar plans must make exactly the same fp32 weights; and runs what `nerve generate` does next:
 * scalar plans and two forward steps (the KV cache capped at 4 positions), which must succeed,
 * while an out-of-range token and a position past the cache must be refused. Every input is also
 * read as a LoRA adapter (GGUF) and as an importance matrix (GGUF or llama.cpp's .dat). */
#include <math.h>

#include "fuzz_util.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "model/imatrix.h"
#include "model/lora.h"
#include "model/model.h"

/* Inputs above this are skipped: a model that big only makes the fuzzer allocate. */
#define FZ_MAX_INPUT (1u << 20)

static volatile float sink;

/* [p, p + n) must lie inside the block [base, base + total). */
static void check_part(const nv_model *m, const float *p, uint64_t n, const char *name) {
    if (n == 0) return;
    FZ_CHECK(p != NULL, "%s is NULL", name);
    FZ_CHECK(p >= m->params && (uint64_t)(p - m->params) + n <= m->n_params,
             "%s [%td, +%llu) lies outside the %llu parameters", name, p - m->params, (unsigned long long)n,
             (unsigned long long)m->n_params);
    sink += p[0] + p[n - 1];
}

static void check_model(const nv_model *m, size_t file_len, int v1, int gguf) {
    const nv_config *c = &m->config;
    fz_clear_error();
    FZ_CHECK(nv_config_validate(c) == NV_OK, "loaded config is invalid: %s", nv_errmsg());
    FZ_CHECK(m->n_params == nv_config_param_count(c), "n_params %llu, config implies %llu",
             (unsigned long long)m->n_params, (unsigned long long)nv_config_param_count(c));
    if (!gguf) /* llama2.c's formats imply the head size; GGUF says it (attention.key_length) */
        FZ_CHECK(c->head_dim * c->n_heads == c->dim && !c->qk_norm, "llama2.c head_dim %d x %d heads != dim %d, or QK-norm",
                 c->head_dim, c->n_heads, c->dim);
    if (v1) FZ_CHECK(file_len == 256 + m->n_params * 4, "v1 file of %zu bytes accepted for %llu parameters", file_len,
                     (unsigned long long)m->n_params);
    uint64_t d = (uint64_t)c->dim, h = (uint64_t)c->hidden_dim * (uint64_t)nv_config_ffn_sets(c), L = (uint64_t)c->n_layers;
    uint64_t q = (uint64_t)nv_config_q_dim(c), kv = (uint64_t)nv_config_kv_dim(c), v = (uint64_t)c->vocab_size;
    const nv_weights *w = &m->w;
    FZ_CHECK((w->rms_att == NULL) == (c->no_pre_norms != 0) && (w->rms_ffn == NULL) == (c->no_pre_norms != 0),
             "norms before the branches where the config has none, or none where it has them");
    check_part(m, w->rms_att, c->no_pre_norms ? 0 : L * d, "rms_att");
    check_part(m, w->rms_ffn, c->no_pre_norms ? 0 : L * d, "rms_ffn");
    check_part(m, w->rms_final, d, "rms_final");
    check_part(m, w->tok_emb, v * d, "tok_emb");
    check_part(m, w->wq, L * q * d, "wq");
    check_part(m, w->wk, L * kv * d, "wk");
    check_part(m, w->wv, L * kv * d, "wv");
    check_part(m, w->wo, L * d * q, "wo");
    check_part(m, w->w1, L * h * d, "w1");
    check_part(m, w->w2, L * d * h, "w2");
    check_part(m, w->w3, L * h * d, "w3");
    check_part(m, w->wcls, v * d, "wcls");
    check_part(m, w->router, L * (uint64_t)c->n_experts * d, "router");
    FZ_CHECK((w->router != NULL) == (c->n_experts > 0), "a router without experts, or experts without one");
    if (c->qk_norm) {
        check_part(m, w->q_norm, L * (uint64_t)nv_config_q_norm_len(c), "q_norm");
        check_part(m, w->k_norm, L * (uint64_t)nv_config_k_norm_len(c), "k_norm");
    }
    FZ_CHECK((w->wcls == w->tok_emb) == (c->shared_classifier != 0), "classifier sharing does not match the flag");
}

/* Save as llama2.c v1 or as GGUF, load again: the same config and weights. Refused exactly for
 * what the format cannot say: v1 has no QK-norm, no head size other than dim / heads, no theta or
 * epsilon other than 10000 and 1e-5, no RoPE frequency factors, no projection biases and none of
 * Gemma 3's parts (a GGUF model may have them); GGUF holds every shape the loader takes (QK-norm as
 * the qwen3 architecture, biases as qwen2, Gemma's block as gemma3). */
static void check_resave(const nv_model *m, int gguf) {
    const char *what = gguf ? "GGUF" : "v1";
    char path[512];
    if (fz_temp_name(gguf ? "model-gguf" : "model-v1", path, sizeof path) != 0) return;
    fz_clear_error();
    nv_err e = gguf ? nv_gguf_save(m, NULL, "fuzz", path, NV_GGUF_F32, NULL, NULL) : nv_model_save_v1(m, path);
    fz_check_error(e, gguf ? "nv_gguf_save" : "nv_model_save_v1");
    int fits = gguf ? 1 : fz_fits_v1(&m->config);
    FZ_CHECK(fits ? e == NV_OK : e == NV_EUNSUPPORTED, "%s export of a loaded model: %s (%s)", what, nv_err_name(e), nv_errmsg());
    if (e != NV_OK) {
        unlink(path);
        return;
    }
    nv_model b;
    e = nv_model_load(path, &b);
    unlink(path);
    FZ_CHECK(e == NV_OK, "the %s copy of a loaded model does not load: %s", what, nv_errmsg());
    FZ_CHECK(memcmp(&b.config, &m->config, sizeof b.config) == 0, "config changed in the %s round trip", what);
    FZ_CHECK(b.n_params == m->n_params && memcmp(b.params, m->params, (size_t)m->n_params * 4) == 0,
             "weights changed in the %s round trip", what);
    nv_model_free(&b);
}

/* Plans on the scalar engine and a forward pass of BOS then EOS. */
static void check_forward(nv_model *m) {
    const nv_config *c = &m->config;
    fz_clear_error();
    nv_err e = nv_model_build_plans(m, NV_ENGINE_SCALAR);
    FZ_CHECK(e == NV_OK, "plans for a loaded model: %s", nv_errmsg());
    int cache = c->seq_len < 4 ? c->seq_len : 4;
    nv_state s;
    e = nv_state_init(&s, c, 1, cache, 0);
    FZ_CHECK(e == NV_OK, "state for a loaded model: %s", nv_errmsg());
    int toks[2] = {1 % c->vocab_size, 2 % c->vocab_size}; /* BOS, EOS */
    for (int pos = 0; pos < 2 && pos < cache; pos++) {
        e = nv_forward(m, &s, &toks[pos], 1, pos);
        FZ_CHECK(e == NV_OK, "forward at %d: %s", pos, nv_errmsg());
        for (int i = 0; i < c->vocab_size; i++) sink += s.logits[i];
    }
    int bad = c->vocab_size;
    FZ_CHECK(nv_forward(m, &s, &bad, 1, 0) == NV_ERANGE, "token %d accepted", bad);
    FZ_CHECK(nv_forward(m, &s, toks, 1, cache) == NV_ERANGE, "position %d past the cache accepted", cache);
    nv_state_free(&s);
}

static nv_err load_model(const char *path, void *out) { return nv_model_load(path, out); }

/* The model shape adapters are read against: tests/gguf_write.h's (the seeds' adapter is for it). */
static const nv_config adapter_config = {32, 32, 1, 2, 1, 16, 8, 16, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
typedef struct {
    nv_lora_shape s;
    float *p;
} adapter;
static nv_err load_adapter(const char *path, void *out) {
    adapter *a = out;
    return nv_gguf_load_lora(path, &adapter_config, &a->s, &a->p);
}

/* A GGUF input read as a LoRA adapter (what --lora does): refused with one line, or a valid shape
 * whose every value is finite, which merges into a model of that shape. */
static void check_adapter(const uint8_t *data, size_t size) {
    adapter a = {{0}, NULL};
    const int rc = fz_load_bytes("adapter", data, size, load_adapter, &a, "nv_gguf_load_lora");
    if (rc != NV_OK) {
        FZ_CHECK(rc < 0 || a.p == NULL, "a refused adapter left its block behind");
        return;
    }
    FZ_CHECK(nv_lora_validate(&adapter_config, &a.s) == NV_OK, "accepted adapter shape is invalid: %s", nv_errmsg());
    const uint64_t n = nv_lora_param_count(&adapter_config, &a.s);
    for (uint64_t i = 0; i < n; i++) FZ_CHECK(isfinite(a.p[i]), "adapter value %llu is not finite", (unsigned long long)i);
    nv_model m;
    if (nv_model_alloc(&m, &adapter_config) == NV_OK) {
        nv_lora_merge(&m, &a.s, a.p, 1.0f);
        nv_model_free(&m);
    }
    free(a.p);
}
static nv_err load_imatrix(const char *path, void *out) { return nv_imatrix_load(path, out); }

/* Any input read as an importance matrix (export --imatrix: an imatrix GGUF or llama.cpp's .dat):
 * refused with one line and nothing left behind, or entries of 1..2^24 columns with distinct
 * names, finite sums >= 0 and a count >= 0, whose means are finite; saved and read back, the same. */
static void check_imatrix(const uint8_t *data, size_t size) {
    nv_imatrix im;
    const int rc = fz_load_bytes("imatrix", data, size, load_imatrix, &im, "nv_imatrix_load");
    if (rc != NV_OK) {
        FZ_CHECK(rc < 0 || (im.e == NULL && im.n == 0), "a refused importance matrix left entries behind");
        return;
    }
    FZ_CHECK(im.n >= 1, "an importance matrix without entries accepted");
    for (int i = 0; i < im.n; i++) {
        const nv_imatrix_entry *e = &im.e[i];
        FZ_CHECK(e->k >= 1 && e->n_mat >= 1 && (int64_t)e->k * e->n_mat <= (1 << 24) && strlen(e->name) > 0 &&
                     nv_imatrix_find(&im, e->name) == e,
                 "entry %d: '%s', %d x %d columns", i, e->name, e->k, e->n_mat);
        for (int m = 0; m < e->n_mat; m++) FZ_CHECK(e->count[m] == 0 || e->count[m] >= 1, "%s: count %g", e->name, e->count[m]);
        const size_t nv = (size_t)e->k * (size_t)e->n_mat;
        float *mean = malloc(nv * sizeof *mean);
        if (!mean) continue;
        nv_imatrix_means(e, mean);
        for (size_t j = 0; j < nv; j++) FZ_CHECK(isfinite(e->sum2[j]) && e->sum2[j] >= 0 && isfinite(mean[j]), "%s[%zu] = %g", e->name, j, e->sum2[j]);
        free(mean);
    }
    char path[512];
    if (fz_write_temp("imatrix-out", (const uint8_t *)"", 0, path, sizeof path) == 0) {
        nv_imatrix back;
        fz_clear_error();
        FZ_CHECK(nv_imatrix_save(&im, path) == NV_OK && nv_imatrix_load(path, &back) == NV_OK && back.n == im.n,
                 "an importance matrix saved does not read back: %s", nv_errmsg());
        for (int i = 0; i < back.n && i < im.n; i++) {
            const nv_imatrix_entry *a = &im.e[i], *b = nv_imatrix_find(&back, a->name);
            int same = b && b->k == a->k && b->n_mat == a->n_mat;
            for (int m = 0; same && m < a->n_mat; m++) same = b->count[m] == (double)(float)a->count[m];
            FZ_CHECK(same, "entry '%s' read back otherwise", a->name);
        }
        nv_imatrix_free(&back);
        unlink(path);
    }
    nv_imatrix_free(&im);
}

static nv_err load_quantized(const char *path, void *out) { return nv_model_load_quantized(path, out); }

/* The inference load of the same bytes (GGUF quantized matrices left pending): it loads whenever
 * the full load does, and scalar plans make exactly the full load's fp32 weights. */
static void check_quantized(const nv_model *m, const uint8_t *data, size_t size) {
    nv_model z;
    int rc = fz_load_bytes("model-q", data, size, load_quantized, &z, "nv_model_load_quantized");
    if (rc < 0) return;
    FZ_CHECK(rc == NV_OK, "the inference load fails where the full load succeeded: %s", nv_errmsg());
    fz_clear_error();
    FZ_CHECK(nv_model_build_plans(&z, NV_ENGINE_SCALAR) == NV_OK, "plans after the inference load: %s", nv_errmsg());
    FZ_CHECK(z.n_params == m->n_params && memcmp(z.params, m->params, (size_t)m->n_params * 4) == 0,
             "fp32 weights made from pending matrices differ from the full load's");
    /* the int8 engine's plans of the same sources (block-quantized matrices multiplied by integer dot
       products, the rest W8A8) build and run a token (values unchecked: the weights are arbitrary) */
    const nv_engine_id e8 = nv_engine_best();
    if (nv_engine_int8(e8)) {
        FZ_CHECK(nv_model_build_plans(&z, e8) == NV_OK, "%s plans: %s", nv_engine_name(e8), nv_errmsg());
        nv_state s;
        if (nv_state_init(&s, &z.config, 1, 1, 0) == NV_OK) {
            int tok = 1 % z.config.vocab_size;
            FZ_CHECK(nv_forward(&z, &s, &tok, 1, 0) == NV_OK, "forward on %s: %s", nv_engine_name(e8), nv_errmsg());
            for (int i = 0; i < z.config.vocab_size; i++) sink += s.logits[i];
            nv_state_free(&s);
        }
    }
    nv_model_free(&z);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    /* scalar, and an int8 engine where the CPU has one (check_quantized) */
    if (nv_engines_init("scalar,avx512-int8,avx2-int8", 1) != NV_OK) {
        fprintf(stderr, "fuzz_model: %s\n", nv_errmsg());
        exit(1);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > FZ_MAX_INPUT) return -1; /* not added to the corpus */
    if (size >= 4 && memcmp(data, "GGUF", 4) == 0) check_adapter(data, size);
    check_imatrix(data, size);
    nv_model m;
    int rc = fz_load_bytes("model", data, size, load_model, &m, "nv_model_load");
    if (rc < 0) return 0;
    if (rc != NV_OK) {
        /* a failed load leaves nothing behind */
        FZ_CHECK(m.params == NULL && m.mapped.data == NULL && m.plans == NULL, "failed load left state behind");
        return 0;
    }
    int v1 = size >= 4 && memcmp(data, "24ka", 4) == 0; /* "ak42" little-endian */
    check_model(&m, size, v1, size >= 4 && memcmp(data, "GGUF", 4) == 0);
    check_resave(&m, 0);
    check_resave(&m, 1);
    check_quantized(&m, data, size);
    check_forward(&m);
    nv_model_free(&m);
    return 0;
}
