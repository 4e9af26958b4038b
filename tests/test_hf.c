/* Hugging Face model folders (model/hf.c): config.json, safetensors weights and tokenizer.json,
 * read and written. The layout checks read the files here independently (the safetensors header
 * parsed in this file, transformers' query/key row order written out from its definition:
 * convert_llama_weights_to_hf's permute puts row 2i of a head at i and row 2i + 1 at hd/2 + i). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "engine/engine.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "model/hf.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "t.h"
#include "bpe_write.h"

/* A fresh folder in the temporary folder. */
static const char *folder(const char *name) {
    static char bufs[16][700];
    static int next;
    char *p = bufs[next++ & 15];
    snprintf(p, sizeof bufs[0], "%s", t_path(name));
    char cmd[800];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
    T_CHECK(system(cmd) == 0, "rm");
    T_CHECK(nv_mkdirs(p) == NV_OK, "mkdir %s", p);
    return p;
}

static char *slurp(const char *dir, const char *name, size_t *len) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *text = NULL;
    size_t n = 0;
    T_CHECK(nv_file_read_all(path, &text, &n) == NV_OK, "read %s: %s", path, nv_errmsg());
    if (len) *len = n;
    return text;
}

static void put(const char *dir, const char *name, const void *data, size_t len) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    T_CHECK(f != NULL, "create %s", path);
    if (!f) return;
    if (len) fwrite(data, 1, len, f);
    fclose(f);
}

static void put_text(const char *dir, const char *name, const char *text) { put(dir, name, text, strlen(text)); }


static void copy_file(const char *from_dir, const char *to_dir, const char *name) {
    size_t n;
    char *d = slurp(from_dir, name, &n);
    if (d) put(to_dir, name, d, n);
    free(d);
}

/* The safetensors file of dir: its header (parsed) and the data after it. */
typedef struct {
    char *file;
    size_t len;
    cJSON *hdr;
    const uint8_t *data;
} st_file;

static int st_read(const char *dir, const char *name, st_file *s) {
    memset(s, 0, sizeof *s);
    s->file = slurp(dir, name, &s->len);
    if (!s->file || s->len < 8) return 0;
    uint64_t hl;
    memcpy(&hl, s->file, 8);
    if (hl > s->len - 8) return 0;
    s->hdr = cJSON_ParseWithLength(s->file + 8, (size_t)hl);
    s->data = (const uint8_t *)s->file + 8 + hl;
    return s->hdr != NULL && (8 + hl) % 8 == 0; /* the data 8-byte aligned, as the format asks */
}

static void st_free(st_file *s) {
    cJSON_Delete(s->hdr);
    free(s->file);
}

/* Tensor name's F32 values (its element count in *n), NULL when absent or not F32. */
static const float *st_f32(const st_file *s, const char *name, int *rows, int *cols) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s->hdr, name);
    if (!t || strcmp(cJSON_GetObjectItem(t, "dtype")->valuestring, "F32")) return NULL;
    const cJSON *shape = cJSON_GetObjectItem(t, "shape"), *off = cJSON_GetObjectItem(t, "data_offsets");
    *rows = cJSON_GetArrayItem(shape, 0)->valueint;
    *cols = cJSON_GetArraySize(shape) > 1 ? cJSON_GetArrayItem(shape, 1)->valueint : 1;
    return (const float *)(s->data + (size_t)cJSON_GetArrayItem(off, 0)->valuedouble);
}

/* hf rows (heads x hd) are w's rows in transformers' order. */
static int rows_permuted(const float *hf, const float *w, int heads, int hd, int cols) {
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < hd / 2; i++)
            for (int half = 0; half < 2; half++) {
                const float *a = hf + ((size_t)h * hd + (size_t)(half * hd / 2 + i)) * cols;
                const float *b = w + ((size_t)h * hd + (size_t)(2 * i + half)) * cols;
                if (memcmp(a, b, (size_t)cols * 4)) return 0;
            }
    return 1;
}

static const char *export_260k(const char *dir, const char *type) {
    const char *m = t_data("models/stories260K.bin"), *z = t_data("models/tok512.bin");
    if (!m || !z) return NULL;
    char args[2400];
    snprintf(args, sizeof args, "export %s -z %s -o %s/ --type %s", m, z, dir, type);
    T_CHECK(t_nerve(args) == 0, "export: %s", t_err);
    return m;
}

/* `nerve export -o DIR/`: stories260K as transformers lays it out, and its greedy text from the folder. */
static void test_export_layout_and_golden(void) {
    const char *dir = folder("s260");
    const char *bin = export_260k(dir, "f32");
    const char *gold_path = t_data("models/stories260K_greedy200.expected.txt");
    if (!bin || !gold_path) return;
    nv_model m;
    T_CHECK(nv_model_load(bin, &m) == NV_OK, "%s", nv_errmsg());
    st_file s;
    T_CHECK(st_read(dir, "model.safetensors", &s), "model.safetensors unreadable or unaligned");
    const nv_config *c = &m.config;
    T_CHECK(cJSON_GetArraySize(s.hdr) == 1 + 2 + 9 * c->n_layers, "%d entries", cJSON_GetArraySize(s.hdr));
    T_CHECK(!strcmp(cJSON_GetObjectItem(cJSON_GetObjectItem(s.hdr, "__metadata__"), "format")->valuestring, "pt"), "format");
    T_CHECK(!cJSON_GetObjectItem(s.hdr, "lm_head.weight"), "a tied model has no lm_head");
    int r = 0, k = 0;
    const size_t d = (size_t)c->dim, hd = (size_t)c->head_dim, kvd = (size_t)c->n_kv_heads * hd;
    for (int l = 0; l < c->n_layers; l++) {
        char name[96];
        snprintf(name, sizeof name, "model.layers.%d.self_attn.q_proj.weight", l);
        const float *q = st_f32(&s, name, &r, &k);
        T_CHECK(q && r == c->dim && k == c->dim && rows_permuted(q, m.w.wq + l * d * d, c->n_heads, c->head_dim, c->dim),
                "%s is not wq in transformers' row order", name);
        snprintf(name, sizeof name, "model.layers.%d.self_attn.k_proj.weight", l);
        const float *kk = st_f32(&s, name, &r, &k);
        T_CHECK(kk && r == (int)kvd && k == c->dim && rows_permuted(kk, m.w.wk + l * kvd * d, c->n_kv_heads, c->head_dim, c->dim),
                "%s is not wk in transformers' row order", name);
        snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj.weight", l);
        const float *down = st_f32(&s, name, &r, &k);
        T_CHECK(down && r == c->dim && k == c->hidden_dim && !memcmp(down, m.w.w2 + l * d * c->hidden_dim, d * c->hidden_dim * 4),
                "%s", name);
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        const float *norm = st_f32(&s, name, &r, &k);
        T_CHECK(norm && r == c->dim && k == 1 && !memcmp(norm, m.w.rms_att + l * d, d * 4), "%s", name);
    }
    const float *emb = st_f32(&s, "model.embed_tokens.weight", &r, &k);
    T_CHECK(emb && r == c->vocab_size && k == c->dim && !memcmp(emb, m.w.tok_emb, (size_t)c->vocab_size * d * 4), "embedding");
    st_free(&s);
    char *cfg_text = slurp(dir, "config.json", NULL);
    cJSON *cfg = cJSON_Parse(cfg_text);
    T_CHECK(cfg && cJSON_GetObjectItem(cfg, "num_key_value_heads")->valueint == c->n_kv_heads &&
                cJSON_GetObjectItem(cfg, "head_dim")->valueint == c->head_dim &&
                cJSON_IsTrue(cJSON_GetObjectItem(cfg, "tie_word_embeddings")) &&
                !strcmp(cJSON_GetObjectItem(cfg, "model_type")->valuestring, "llama") &&
                cJSON_GetObjectItem(cfg, "rms_norm_eps")->valuedouble == 1e-5,
            "config.json: %s", cfg_text);
    cJSON_Delete(cfg);
    free(cfg_text);
    /* read back: the same weights, bit for bit; the folder and its config.json both name it */
    nv_model back;
    char cfg_path[700];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    T_CHECK(nv_model_load(cfg_path, &back) == NV_OK, "%s", nv_errmsg());
    T_CHECK(back.n_params == m.n_params && !memcmp(back.params, m.params, m.n_params * 4) &&
                !memcmp(&back.config, &m.config, sizeof m.config),
            "weights or config differ after the round trip");
    nv_model_free(&back);
    nv_model_free(&m);
    char *gold = NULL, args[1400];
    nv_file_read_all(gold_path, &gold, NULL);
    for (int form = 0; form < 2; form++) {
        snprintf(args, sizeof args, "generate -m %s%s -n 200 -t 0", dir, form ? "/config.json" : "");
        T_CHECK(t_nerve(args) == 0 && gold && !strcmp(t_out, gold), "greedy text from the folder differs: %s%s", t_out, t_err);
    }
    free(gold);
}

/* An export into a folder that held a model: the earlier model's files this one does not write go
 * (a shard index, a template file, a SentencePiece model, and without -z its tokenizer); one that
 * fails part way leaves no config.json, so the folder is no model rather than the earlier config
 * beside new weights. */
static void test_export_over_a_model(void) {
    const char *dir = folder("over");
    const char *bin = export_260k(dir, "f32");
    if (!bin) return;
    char path[800], args[2400];
    static const char *const stale[] = {"model.safetensors.index.json", "chat_template.jinja", "tokenizer.model"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, stale[i]);
        FILE *f = fopen(path, "w");
        if (f) fputs("{}", f), fclose(f);
    }
    snprintf(args, sizeof args, "export %s -o %s/ --type bf16", bin, dir);
    T_CHECK(t_nerve(args) == 0, "export without -z: %s", t_err);
    static const char *const gone[] = {"model.safetensors.index.json", "chat_template.jinja", "tokenizer.model", "tokenizer.json",
                                       "tokenizer_config.json"};
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, gone[i]);
        T_CHECK(!nv_file_exists(path), "%s is left beside the new weights", gone[i]);
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    T_CHECK(nv_file_exists(path), "no config.json");
    snprintf(path, sizeof path, "%s/tokenizer_config.json/x", dir); /* a name the export cannot write */
    T_CHECK(nv_mkdirs(path) == NV_OK, "%s", path);
    snprintf(args, sizeof args, "export %s -z %s -o %s/ --type f32", bin, t_data("models/tok512.bin"), dir);
    T_CHECK(t_nerve(args) == 1, "an export that cannot write its tokenizer's config: %s", t_err);
    snprintf(path, sizeof path, "%s/config.json", dir);
    T_CHECK(!nv_file_exists(path), "a failed export left the earlier config.json beside its weights");
}

/* bf16 and f16 weights: each value the nearest of its type to the fp32 one. */
static void test_half_types(void) {
    const char *types[] = {"bf16", "f16"};
    for (int ti = 0; ti < 2; ti++) {
        const char *dir = folder(types[ti]);
        const char *bin = export_260k(dir, types[ti]);
        if (!bin) return;
        nv_model m, back;
        char cfg_path[700];
        snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
        T_CHECK(nv_model_load(bin, &m) == NV_OK && nv_model_load(cfg_path, &back) == NV_OK, "%s", nv_errmsg());
        if (!back.params) return;
        const double half_ulp = ti == 0 ? 1.0 / 256 : 1.0 / 2048; /* relative: 7 or 10 stored significand bits */
        uint64_t bad = 0, inexact = 0;
        for (uint64_t i = 0; i < m.n_params; i++) {
            const double a = m.params[i], b = back.params[i];
            if (fabs(a - b) > fabs(a) * half_ulp && fabs(a) > 6.2e-5) bad++;
            inexact += a != b;
        }
        T_CHECK(bad == 0 && inexact > 0, "%s: %llu values beyond rounding (%llu inexact)", types[ti], (unsigned long long)bad,
                (unsigned long long)inexact);
        /* loaded for inference, an F16 or BF16 folder keeps its matrices as they are, plan sources
           (their fp32 values unmade), and its logits are the fp32 load's to the bit on an fp32 engine */
        nv_model q;
        T_CHECK(nv_model_load_quantized(cfg_path, &q) == NV_OK, "%s", nv_errmsg());
        if (q.params) {
            const int bf16 = ti == 0, cls = q.config.n_layers * NV_LAYER_MATRICES;
            T_CHECK(q.quant && q.quant[0].h && q.quant[0].h_bf16 == bf16 && q.quant[0].pending && q.quant[cls].h &&
                        !q.quant[cls].pending,
                    "%s: plan sources %p", types[ti], (void *)q.quant);
            nv_engines_init(NULL, 1);
            const nv_engine_id eng = nv_engine_available(NV_ENGINE_AVX512) ? NV_ENGINE_AVX512 : NV_ENGINE_AVX2;
            const int toks[4] = {1, 403, 407, 261};
            nv_state s1, s2;
            if (nv_model_build_plans(&q, eng) == NV_OK && nv_model_build_plans(&back, eng) == NV_OK &&
                nv_state_init(&s1, &q.config, 4, 8, 0) == NV_OK && nv_state_init(&s2, &back.config, 4, 8, 0) == NV_OK) {
                T_CHECK(nv_plan_quantized(q.plans[0].wq) == (bf16 ? NV_QBITS_BF16 : 16) && !nv_plan_quantized(back.plans[0].wq),
                        "%s: plans of %d bits", types[ti], nv_plan_quantized(q.plans[0].wq));
                T_CHECK(nv_forward(&q, &s1, toks, 4, 0) == NV_OK && nv_forward(&back, &s2, toks, 4, 0) == NV_OK &&
                            !memcmp(s1.logits, s2.logits, (size_t)q.config.vocab_size * sizeof(float)),
                        "%s: logits from plan sources differ", types[ti]);
                nv_state_free(&s1);
                nv_state_free(&s2);
            } else {
                T_CHECK(0, "%s", nv_errmsg());
            }
            nv_model_free(&q);
        }
        nv_model_free(&m);
        nv_model_free(&back);
    }
}

/* A random model of config c with its norms, QK-norm weights and biases random too. */
static void random_model(const nv_config *c, nv_model *m) {
    T_CHECK(nv_model_alloc(m, c) == NV_OK, "%s", nv_errmsg());
    nv_model_init_random(m, 7);
    uint32_t x = 12345;
    for (uint64_t i = 0; i < m->n_params; i++) {
        x = x * 1664525u + 1013904223u;
        if (m->params[i] == 1.0f) m->params[i] = 1.0f + (float)(x >> 8) / (float)(1u << 24) - 0.5f;
    }
    const size_t L = (size_t)c->n_layers, qd = (size_t)nv_config_q_dim(c), kvd = (size_t)nv_config_kv_dim(c);
    if (c->qkv_bias)
        for (size_t i = 0; i < L * (qd + 2 * kvd); i++) m->w.bq[i] = (float)i * 0.001f - 0.3f; /* bq, bk, bv are adjacent */
}

/* Qwen3 (QK-norm, heads wider than dim / heads, GQA, an untied classifier) and Qwen2 (biases) shapes
 * written and read back bit for bit; their query rows and biases in transformers' order. */
static void test_qwen_shapes(void) {
    nv_config q3 = {.dim = 64, .hidden_dim = 96, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .head_dim = 32, .vocab_size = 300,
                    .seq_len = 128, .rope_theta = 1000000.0f, .norm_eps = 1e-6f, .qk_norm = 1};
    nv_config q2 = {.dim = 48, .hidden_dim = 64, .n_layers = 2, .n_heads = 6, .n_kv_heads = 2, .head_dim = 8, .vocab_size = 260,
                    .seq_len = 64, .rope_theta = 10000.0f, .norm_eps = 1e-6f, .shared_classifier = 1, .qkv_bias = 1};
    const nv_config *cs[] = {&q3, &q2};
    for (int k = 0; k < 2; k++) {
        const nv_config *c = cs[k];
        nv_model m, back;
        random_model(c, &m);
        const char *dir = folder(k ? "qwen2" : "qwen3");
        T_CHECK(nv_hf_save(&m, NULL, dir, NV_HF_F32, NULL) == NV_OK, "%s", nv_errmsg());
        char cfg_path[700];
        snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
        T_CHECK(nv_model_load(cfg_path, &back) == NV_OK, "%s", nv_errmsg());
        T_CHECK(back.params && back.n_params == m.n_params && !memcmp(back.params, m.params, m.n_params * 4) &&
                    !memcmp(&back.config, &m.config, sizeof m.config),
                "%s: weights or config differ after the round trip", k ? "qwen2" : "qwen3");
        st_file s;
        T_CHECK(st_read(dir, "model.safetensors", &s), "header");
        int r, cc;
        const float *q = st_f32(&s, "model.layers.1.self_attn.q_proj.weight", &r, &cc);
        const size_t qd = (size_t)nv_config_q_dim(c);
        T_CHECK(q && rows_permuted(q, m.w.wq + qd * c->dim, c->n_heads, c->head_dim, c->dim), "q_proj's rows");
        if (c->qk_norm) {
            const float *qn = st_f32(&s, "model.layers.1.self_attn.q_norm.weight", &r, &cc);
            T_CHECK(qn && r == c->head_dim && rows_permuted(qn, m.w.q_norm + c->head_dim, 1, c->head_dim, 1), "q_norm's order");
            T_CHECK(st_f32(&s, "lm_head.weight", &r, &cc) != NULL, "an untied model has lm_head");
        } else {
            const float *bq = st_f32(&s, "model.layers.1.self_attn.q_proj.bias", &r, &cc);
            const float *bv = st_f32(&s, "model.layers.0.self_attn.v_proj.bias", &r, &cc);
            T_CHECK(bq && rows_permuted(bq, m.w.bq + qd, c->n_heads, c->head_dim, 1), "q_proj.bias's order");
            T_CHECK(bv && !memcmp(bv, m.w.bv, (size_t)nv_config_kv_dim(c) * 4), "v_proj.bias");
        }
        char *cfg_text = slurp(dir, "config.json", NULL);
        T_CHECK(cfg_text && strstr(cfg_text, k ? "\"qwen2\"" : "\"qwen3\""), "model_type: %s", cfg_text);
        free(cfg_text);
        st_free(&s);
        nv_model_free(&back);
        nv_model_free(&m);
    }
}

static int put_spliced(const char *dir, const char *name, const char *text, const char *from, const char *to);

/* The safetensors of dir rewritten as Phi-3 keeps them: each layer's q_proj, k_proj and v_proj rows
 * in one self_attn.qkv_proj, its gate_proj and up_proj rows in one mlp.gate_up_proj (F32). */
static int phi3_weights(const char *dir, int n_layers) {
    st_file s;
    if (!st_read(dir, "model.safetensors", &s)) return 0;
    nv_buf hdr = {0}, body = {0};
    nv_buf_puts(&hdr, "{");
    int ok = 1, first = 1;
    /* every tensor but the ones fused, as it was; then the fused ones */
    for (const cJSON *t = s.hdr->child; t && ok; t = t->next) {
        if (!strcmp(t->string, "__metadata__") ||
            (strstr(t->string, "_proj.weight") && !strstr(t->string, "o_proj") && !strstr(t->string, "down_proj")))
            continue;
        int r, c;
        const float *v = st_f32(&s, t->string, &r, &c);
        ok = v != NULL;
        const int vec = cJSON_GetArraySize(cJSON_GetObjectItem(t, "shape")) == 1;
        if (vec) nv_buf_printf(&hdr, "%s\"%s\": {\"dtype\": \"F32\", \"shape\": [%d], ", first ? "" : ", ", t->string, r);
        else nv_buf_printf(&hdr, "%s\"%s\": {\"dtype\": \"F32\", \"shape\": [%d, %d], ", first ? "" : ", ", t->string, r, c);
        nv_buf_printf(&hdr, "\"data_offsets\": [%zu, %zu]}", body.len, body.len + (size_t)r * c * 4);
        if (v) nv_buf_append(&body, v, (size_t)r * c * 4);
        first = 0;
    }
    static const char *const fused[2][4] = {{"self_attn.qkv_proj", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"},
                                            {"mlp.gate_up_proj", "mlp.gate_proj", "mlp.up_proj", NULL}};
    for (int l = 0; l < n_layers && ok; l++)
        for (int f = 0; f < 2 && ok; f++) {
            size_t start = body.len;
            int rows = 0, cols = 0;
            for (int p = 1; p < 4 && fused[f][p] && ok; p++) {
                char name[128];
                snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, fused[f][p]);
                int r, c;
                const float *v = st_f32(&s, name, &r, &c);
                ok = v != NULL;
                if (v) nv_buf_append(&body, v, (size_t)r * c * 4), rows += r, cols = c;
            }
            nv_buf_printf(&hdr, ", \"model.layers.%d.%s.weight\": {\"dtype\": \"F32\", \"shape\": [%d, %d], \"data_offsets\": [%zu, %zu]}",
                          l, fused[f][0], rows, cols, start, body.len);
        }
    nv_buf_puts(&hdr, "}");
    while (hdr.len % 8) nv_buf_puts(&hdr, " ");
    const uint64_t hl = hdr.len;
    nv_buf file = {0};
    nv_buf_append(&file, &hl, 8);
    nv_buf_append(&file, hdr.data, hdr.len);
    nv_buf_append(&file, body.data, body.len);
    ok = ok && !file.oom;
    if (ok) put(dir, "model.safetensors", file.data, file.len);
    nv_buf_free(&hdr), nv_buf_free(&body), nv_buf_free(&file);
    st_free(&s);
    return ok;
}

/* Phi-3 folders (model_type phi3): the query, key and value rows fused in qkv_proj, the gate and up
 * rows in gate_up_proj, read as the llama folder they were made from (config and weights the same
 * bits; Phi-3-mini's sliding window not applied, as llama.cpp runs it); LongRoPE's divisors (long
 * past the original context, else short) and attention factor; RoPE on part of a head (Phi-4-mini:
 * its rows in order, an odd count refused), a fused tensor missing or of another size refused; nerve
 * writes such a model as Phi-3's folder and reads it back the same. */
static void test_phi3_folder(void) {
    nv_config c = {.dim = 64, .hidden_dim = 96, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16, .vocab_size = 97,
                   .seq_len = 256, .rope_theta = 10000.0f, .norm_eps = 1e-5f};
    nv_model m, back;
    random_model(&c, &m);
    const char *dir = folder("phi3");
    char cfg_path[700];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    T_CHECK(nv_hf_save(&m, NULL, dir, NV_HF_F32, NULL) == NV_OK && phi3_weights(dir, c.n_layers), "%s", nv_errmsg());
    char *llama = slurp(dir, "config.json", NULL);
    T_CHECK(put_spliced(dir, "config.json", llama, "\"LlamaForCausalLM\"",
                        "\"Phi3ForCausalLM\"], \"sliding_window\": 47, \"original_max_position_embeddings\": 64, \"partial_rotary_factor\": 1.0, "
                        "\"x\": [0"),
            "config");
    char *phi3 = slurp(dir, "config.json", NULL);
    T_CHECK(put_spliced(dir, "config.json", phi3, "\"llama\"", "\"phi3\""), "model_type");
    free(phi3);
    phi3 = slurp(dir, "config.json", NULL);
    T_CHECK(nv_model_load(cfg_path, &back) == NV_OK, "%s", nv_errmsg());
    T_CHECK(back.params && back.n_params == m.n_params && !memcmp(back.params, m.params, m.n_params * 4) &&
                !memcmp(&back.config, &m.config, sizeof m.config),
            "phi3: weights or config differ from the llama folder's");
    nv_model_free(&back);
    char args[900];
    snprintf(args, sizeof args, "info -m %s", dir); /* the folder itself names the model */
    T_CHECK(t_nerve(args) == 0 && strstr(t_out, "shape:    dim 64, layers 2, heads 4/2 x 16, hidden 96, vocab 97, context 256"),
            "info: %s%s", t_out, t_err);
    /* LongRoPE: the context (256) past the original (64): long_factor, sqrt(1 + ln 4 / ln 64) on every cos and sin */
    char rs[1024] = "\"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [";
    for (int i = 0; i < 8; i++) snprintf(rs + strlen(rs), sizeof rs - strlen(rs), "%s%g", i ? ", " : "", 1.0 + i / 100.0);
    strcat(rs, "], \"long_factor\": [");
    for (int i = 0; i < 8; i++) snprintf(rs + strlen(rs), sizeof rs - strlen(rs), "%s%g", i ? ", " : "", 1.0 + i / 2.0);
    strcat(rs, "]}");
    nv_config lc;
    T_CHECK(put_spliced(dir, "config.json", phi3, "\"rope_scaling\":\tnull", rs) && nv_model_read_config(cfg_path, &lc) == NV_OK,
            "%s", nv_errmsg());
    int factors = lc.n_rope_factors == 8 && lc.rope_attn == (float)sqrt(1 + log(4.0) / log(64.0));
    for (int i = 0; factors && i < 8; i++) factors = lc.rope_factors[i] == (float)(1.0 + i / 2.0);
    T_CHECK(factors, "longrope: %d factors, the first %g, attention %g", lc.n_rope_factors, (double)lc.rope_factors[0], (double)lc.rope_attn);
    char *lr = slurp(dir, "config.json", NULL); /* the context within the original: short_factor, no attention factor */
    T_CHECK(put_spliced(dir, "config.json", lr, "\"original_max_position_embeddings\": 64", "\"original_max_position_embeddings\": 256") &&
                nv_model_read_config(cfg_path, &lc) == NV_OK && lc.n_rope_factors == 8 && lc.rope_factors[1] == 1.01f && lc.rope_attn == 0.0f,
            "longrope within the original context: %s", nv_errmsg());
    free(lr);
    /* Phi-4-mini's RoPE on three quarters of a head: 12 of 16 values, their rows (i, i + 6) in this
       project's order, the last 4 of each query and key head as the folder has them */
    T_CHECK(put_spliced(dir, "config.json", phi3, "\"partial_rotary_factor\": 1.0", "\"partial_rotary_factor\": 0.75") &&
                nv_model_load(cfg_path, &back) == NV_OK && back.config.rope_dim == 12,
            "partial rotary: %s", nv_errmsg());
    nv_model want;
    T_CHECK(nv_model_alloc(&want, &m.config) == NV_OK, "%s", nv_errmsg());
    memcpy(want.params, m.params, m.n_params * 4);
    T_CHECK(nv_model_qk_reorder(&want, 1) == NV_OK, "%s", nv_errmsg()); /* the folder's rows */
    want.config.rope_dim = 12;
    T_CHECK(nv_model_qk_reorder(&want, 0) == NV_OK, "%s", nv_errmsg());
    T_CHECK(back.params && !memcmp(back.params, want.params, m.n_params * 4), "partial rotary: the rows are not where RoPE turns them");
    nv_model_free(&want);
    nv_model_free(&back);
    static const struct {
        const char *factor, *says;
    } odd_rot[] = {{"0.7", "rotates 11 of a head's 16"}, {"1.5", "out of range"}, {"0", "out of range"}};
    for (int i = 0; i < 3; i++) {
        char to[64];
        snprintf(to, sizeof to, "\"partial_rotary_factor\": %s", odd_rot[i].factor);
        T_CHECK(put_spliced(dir, "config.json", phi3, "\"partial_rotary_factor\": 1.0", to) && nv_model_read_config(cfg_path, &lc) == NV_EFORMAT &&
                    strstr(nv_errmsg(), odd_rot[i].says),
                "partial_rotary_factor %s: %s", odd_rot[i].factor, nv_errmsg());
    }
    /* a layer's qkv_proj one row short of the three it holds; the llama names under phi3 */
    put(dir, "config.json", phi3, strlen(phi3));
    T_CHECK(nv_hf_save(&m, NULL, dir, NV_HF_F32, NULL) == NV_OK, "%s", nv_errmsg());
    put(dir, "config.json", phi3, strlen(phi3));
    T_CHECK(nv_model_read_config(cfg_path, &lc) == NV_EFORMAT && strstr(nv_errmsg(), "'model.layers.0.self_attn.qkv_proj.weight' is missing"),
            "llama's tensors under phi3: %s", nv_errmsg());
    c.n_kv_heads = 4; /* qkv_proj then holds 64 + 2 x 64 rows, the file 64 + 2 x 32 */
    char *wider = NULL;
    T_CHECK(phi3_weights(dir, c.n_layers), "rewrite");
    size_t wl = strlen(phi3);
    wider = malloc(wl + 1);
    memcpy(wider, phi3, wl + 1);
    char *kv = strstr(wider, "\"num_key_value_heads\":\t2");
    if (kv) kv[strlen("\"num_key_value_heads\":\t")] = '4';
    put(dir, "config.json", wider, wl);
    T_CHECK(kv && nv_model_read_config(cfg_path, &lc) == NV_EFORMAT &&
                strstr(nv_errmsg(), "'model.layers.0.self_attn.qkv_proj.weight' is not of shape [192, 64]"),
            "a short qkv_proj: %s", nv_errmsg());
    free(wider);
    free(phi3);
    free(llama);
    /* nerve writes LongRoPE's divisors and attention factor (and RoPE on part of a head) as Phi-3's
       folder: fused projections, both sets the one it runs; it reads back as the same model */
    for (int partial = 0; partial < 2; partial++) {
        nv_model w;
        nv_config wc = m.config;
        wc.rope_dim = partial ? 12 : 0;
        wc.n_rope_factors = partial ? 6 : 8, wc.rope_attn = 1.25f;
        for (int i = 0; i < wc.n_rope_factors; i++) wc.rope_factors[i] = 1.0f + (float)i / 2.0f;
        T_CHECK(nv_model_alloc(&w, &wc) == NV_OK, "%s", nv_errmsg());
        memcpy(w.params, m.params, m.n_params * 4);
        const char *out = folder(partial ? "phi4-out" : "phi3-out");
        snprintf(cfg_path, sizeof cfg_path, "%s/config.json", out);
        T_CHECK(nv_hf_save(&w, NULL, out, NV_HF_F32, NULL) == NV_OK && nv_model_load(cfg_path, &back) == NV_OK, "%s", nv_errmsg());
        T_CHECK(back.params && !memcmp(&back.config, &wc, sizeof wc) && !memcmp(back.params, w.params, m.n_params * 4),
                "partial %d: the written folder reads back as another model", partial);
        nv_model_free(&back);
        size_t st_len = 0;
        char *cfg = slurp(out, "config.json", NULL), *file = slurp(out, "model.safetensors", &st_len), *st = NULL;
        uint64_t hl = 0; /* the safetensors header: its length, then its JSON */
        if (file && st_len >= 8) memcpy(&hl, file, 8);
        if (file && hl <= st_len - 8 && (st = malloc(hl + 1))) memcpy(st, file + 8, hl), st[hl] = 0;
        free(file);
        T_CHECK(cfg && strstr(cfg, "\"Phi3ForCausalLM\"") && strstr(cfg, "\"longrope\"") && st &&
                    strstr(st, "model.layers.1.self_attn.qkv_proj.weight") && strstr(st, "model.layers.1.mlp.gate_up_proj.weight") &&
                    !strstr(st, "q_proj") && !strstr(st, "mlp.up_proj"),
                "partial %d: not Phi-3's folder", partial);
        free(cfg), free(st);
        nv_model_free(&w);
    }
    nv_model_free(&m);
}

/* An added token marked rstrip (Phi-3's tokenizer.json marks its special tokens so) gives the
 * tokenizer Phi-3's rule, special tokens taking the white space after them; a folder written from
 * it marks them again but <unk>, <s> and <|endoftext|>, and reads back with the rule. */
static void test_rstrip_tokens(void) {
    const char *dir = folder("rstrip");
    if (!export_260k(dir, "f32")) return;
    char path[800], args[2400];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    nv_tokenizer *t = NULL;
    T_CHECK(nv_tokenizer_load(path, 0, &t) == NV_OK && !nv_tokenizer_strips_after_special(t), "%s", nv_errmsg());
    if (t) nv_tokenizer_free(t), t = NULL;
    char *tj = slurp(dir, "tokenizer.json", NULL);
    T_CHECK(put_spliced(dir, "tokenizer.json", tj, "\"rstrip\":\tfalse", "\"rstrip\":\ttrue"), "splice");
    free(tj);
    T_CHECK(nv_tokenizer_load(path, 0, &t) == NV_OK && nv_tokenizer_strips_after_special(t), "%s", nv_errmsg());
    if (t) nv_tokenizer_free(t);
    const char *out = folder("rstrip-out");
    snprintf(args, sizeof args, "export %s -z %s -o %s/", t_data("models/stories260K.bin"), path, out);
    T_CHECK(t_nerve(args) == 0, "export: %s", t_err);
    char *written = slurp(out, "tokenizer.json", NULL);
    const char *eos = written ? strstr(written, "\"content\":\t\"</s>\"") : NULL, *unk = written ? strstr(written, "\"content\":\t\"<unk>\"") : NULL;
    const char *eos_strip = eos ? strstr(eos, "\"rstrip\":\t") : NULL, *unk_strip = unk ? strstr(unk, "\"rstrip\":\t") : NULL;
    static const char yes[] = "\"rstrip\":\ttrue", no[] = "\"rstrip\":\tfalse";
    T_CHECK(eos_strip && !strncmp(eos_strip, yes, sizeof yes - 1) && unk_strip && !strncmp(unk_strip, no, sizeof no - 1),
            "the written tokenizer.json's rstrip flags: %s", written ? written : "");
    free(written);
    snprintf(path, sizeof path, "%s/tokenizer.json", out);
    T_CHECK(nv_tokenizer_load(path, 0, &t) == NV_OK && nv_tokenizer_strips_after_special(t), "written back: %s", nv_errmsg());
    if (t) nv_tokenizer_free(t);
}

/* The weights split over two shards named by model.safetensors.index.json read as one file's; an
 * index naming a file outside the folder, or a tensor its file lacks, is refused. */
static void test_shards(void) {
    const char *src = folder("shard-src");
    const char *bin = export_260k(src, "f32");
    if (!bin) return;
    st_file s;
    T_CHECK(st_read(src, "model.safetensors", &s), "header");
    const char *dir = folder("sharded");
    copy_file(src, dir, "config.json");
    cJSON *index = cJSON_CreateObject(), *map = cJSON_AddObjectToObject(index, "weight_map");
    for (int part = 0; part < 2; part++) {
        cJSON *h = cJSON_CreateObject();
        nv_buf data = {0};
        int i = 0;
        for (cJSON *t = s.hdr->child; t; t = t->next, i++) {
            if (!strcmp(t->string, "__metadata__") || i % 2 != part) continue;
            cJSON *off = cJSON_GetObjectItem(t, "data_offsets");
            const size_t b = (size_t)cJSON_GetArrayItem(off, 0)->valuedouble, e = (size_t)cJSON_GetArrayItem(off, 1)->valuedouble;
            cJSON *nt = cJSON_Duplicate(t, 1);
            const double no[2] = {(double)data.len, (double)(data.len + e - b)};
            cJSON_ReplaceItemInObject(nt, "data_offsets", cJSON_CreateDoubleArray(no, 2));
            cJSON_AddItemToObject(h, t->string, nt);
            nv_buf_append(&data, s.data + b, e - b);
            char file[64];
            snprintf(file, sizeof file, "model-0000%d-of-00002.safetensors", part + 1);
            cJSON_AddStringToObject(map, t->string, file);
        }
        char *ht = cJSON_PrintUnformatted(h);
        const uint64_t hl = strlen(ht);
        nv_buf f = {0};
        nv_buf_append(&f, &hl, 8);
        nv_buf_append(&f, ht, hl);
        nv_buf_append(&f, data.data, data.len);
        char file[64];
        snprintf(file, sizeof file, "model-0000%d-of-00002.safetensors", part + 1);
        put(dir, file, f.data, f.len);
        nv_buf_free(&f);
        nv_buf_free(&data);
        free(ht);
        cJSON_Delete(h);
    }
    char *it = cJSON_Print(index);
    put_text(dir, "model.safetensors.index.json", it);
    free(it);
    nv_model m, back;
    char cfg_path[700];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    T_CHECK(nv_model_load(bin, &m) == NV_OK, "%s", nv_errmsg());
    T_CHECK(nv_model_load(cfg_path, &back) == NV_OK, "%s", nv_errmsg());
    T_CHECK(back.params && !memcmp(back.params, m.params, m.n_params * 4), "sharded weights differ");
    nv_model_free(&back);
    /* an index naming ../x, and one naming a tensor its file does not hold */
    cJSON_ReplaceItemInObject(map, "model.norm.weight", cJSON_CreateString("../model-00001-of-00002.safetensors"));
    it = cJSON_Print(index);
    put_text(dir, "model.safetensors.index.json", it);
    free(it);
    T_CHECK(nv_model_load(cfg_path, &back) == NV_EFORMAT && strstr(nv_errmsg(), "names no file of this folder"), "%s", nv_errmsg());
    cJSON_ReplaceItemInObject(map, "model.norm.weight", cJSON_CreateString("model-00001-of-00002.safetensors"));
    cJSON_AddStringToObject(map, "model.extra.weight", "model-00001-of-00002.safetensors");
    it = cJSON_Print(index);
    put_text(dir, "model.safetensors.index.json", it);
    free(it);
    T_CHECK(nv_model_load(cfg_path, &back) == NV_EFORMAT && strstr(nv_errmsg(), "model.extra.weight"), "%s", nv_errmsg());
    cJSON_Delete(index);
    nv_model_free(&m);
    st_free(&s);
}

/* Pieces of text the tokenizers are compared on: the corpus's first lines and awkward ones. */
static int texts(const char **out, int cap, char **corpus) {
    static const char *awkward[] = {"", " ", "  ", "Hello world", "a\n\nb", "\ttabs\t", "1 12 123 1234", "Ünïcödé façade",
                                    "日本語", "emoji 👍🏽", "<s>x</s>", "<|im_start|>user\nHi<|im_end|>\n", "'s 'S I'll"};
    int n = 0;
    for (size_t i = 0; i < sizeof awkward / sizeof awkward[0] && n < cap; i++) out[n++] = awkward[i];
    const char *cp = t_data("corpus/tinystories_valid_head.txt");
    if (cp && nv_file_read_all(cp, corpus, NULL) == NV_OK)
        for (char *line = strtok(*corpus, "\n"); line && n < cap; line = strtok(NULL, "\n")) out[n++] = line;
    return n;
}

static int same_ids(const nv_tokenizer *a, const nv_tokenizer *b, const char *text) {
    int *x = NULL, *y = NULL, nx = 0, ny = 0;
    int same = nv_tokenizer_encode(a, text, 1, 0, &x, &nx) == NV_OK && nv_tokenizer_encode(b, text, 1, 0, &y, &ny) == NV_OK &&
               nx == ny && !memcmp(x, y, (size_t)nx * sizeof *x);
    for (int i = 0; same && i < nx; i++) same = !strcmp(nv_tokenizer_decode(a, i ? x[i - 1] : -1, x[i]), nv_tokenizer_decode(b, i ? y[i - 1] : -1, y[i]));
    free(x);
    free(y);
    return same;
}

/* tokenizer.json written from a llama2.c vocabulary (merges from its scores) and from a byte-level
 * one encodes and decodes as the vocabulary it came from. */
static void test_tokenizer_roundtrip(void) {
    const char *dir = folder("tok512");
    if (!export_260k(dir, "f32")) return;
    const char *z = t_data("models/tok512.bin");
    char json[700], *corpus = NULL;
    snprintf(json, sizeof json, "%s/tokenizer.json", dir);
    nv_tokenizer *a = NULL, *b = NULL;
    T_CHECK(nv_tokenizer_load(z, 0, &a) == NV_OK && nv_tokenizer_load(json, 0, &b) == NV_OK, "%s", nv_errmsg());
    const char *tx[300];
    const int n = texts(tx, 300, &corpus);
    int bad = 0;
    for (int i = 0; a && b && i < n; i++) bad += !same_ids(a, b, tx[i]);
    T_CHECK(n > 100 && bad == 0, "%d of %d texts encode differently", bad, n);
    T_CHECK(b && nv_tokenizer_bos(b) == 1 && nv_tokenizer_eos(b) == 2 && nv_tokenizer_adds_bos(b), "BOS/EOS");
    nv_tokenizer_free(a);
    nv_tokenizer_free(b);
    a = b = NULL;
    /* byte-level: Qwen2's split without BOS, Llama 3's with it, SmolLM's digits, GPT-2's, GPT-4o's, OLMo 2's, Tekken's,
       DeepSeek's several splits in a row (LLM's, Coder's, V3's) */
    const vocab_opts opts[] = {{"qwen2", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 1},
                               {"llama-bpe", ID_ENDOFTEXT, ID_IM_END, 1, -1, 0, 0, 0},
                               {"smollm", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0},
                               {"gpt-2", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0},
                               {"gpt-4o", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0},
                               {"dbrx", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0},
                               {"tekken", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0},
                               {"deepseek-llm", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0},
                               {"deepseek-coder", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0},
                               {"deepseek-v3", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0}};
    static const char *const native[] = {"\"Split\"", "\"ignore_merges\":\ttrue", "\"Digits\"", "\"use_regex\":\ttrue", "\\\\p{Lu}\\\\p{Lt}",
                                         "\"ignore_merges\":\tfalse", "\\\\p{M}]*|\\\\p{N}|", "\"\\\\s+$\"", "\"\\\\s?\\\\p{P}+\"",
                                         "\"\\\\p{N}{1,3}\""};
    for (int k = 0; k < 10; k++) {
        char gguf[700];
        snprintf(gguf, sizeof gguf, "%s/vocab%d.gguf", t_tmpdir(), k);
        T_CHECK(write_vocab(gguf, &opts[k]) == 0, "write %s", gguf);
        T_CHECK(nv_tokenizer_load(gguf, 0, &a) == NV_OK, "%s", nv_errmsg());
        if (!a) return;
        nv_config c = {.dim = 16, .hidden_dim = 32, .n_layers = 1, .n_heads = 2, .n_kv_heads = 2, .head_dim = 8,
                       .vocab_size = nv_tokenizer_vocab_size(a), .seq_len = 32, .rope_theta = 10000.0f, .norm_eps = 1e-5f,
                       .shared_classifier = 1};
        nv_model m;
        T_CHECK(nv_model_alloc(&m, &c) == NV_OK, "%s", nv_errmsg());
        const char *bd = folder(opts[k].pre);
        T_CHECK(nv_hf_save(&m, a, bd, NV_HF_BF16, NULL) == NV_OK, "%s", nv_errmsg());
        char *written = slurp(bd, "tokenizer.json", NULL); /* the split in the family's own form */
        T_CHECK(written && strstr(written, native[k]), "%s: no %s in its pre_tokenizer", opts[k].pre, native[k]);
        free(written);
        snprintf(json, sizeof json, "%s/tokenizer.json", bd);
        T_CHECK(nv_tokenizer_load(json, 0, &b) == NV_OK, "%s", nv_errmsg());
        bad = 0;
        for (int i = 0; b && i < n; i++) bad += !same_ids(a, b, tx[i]);
        T_CHECK(b && bad == 0, "%s: %d of %d texts encode differently", opts[k].pre, bad, n);
        nv_bpe_view bv; /* Llama 3's split read back as llama-bpe or (ignore_merges false) dbrx */
        T_CHECK(b && nv_tokenizer_bpe_view(b, &bv) && !strcmp(bv.pre, opts[k].pre) && same_ids(a, b, " there"), "%s read back as %s",
                opts[k].pre, b && nv_tokenizer_bpe_view(b, &bv) ? bv.pre : "?");
        /* (Qwen2's with EOS after each input, an embedding model's: its template puts it there alone) */
        T_CHECK(b && nv_tokenizer_adds_eos(a) == (k == 0) && nv_tokenizer_adds_eos(b) == (k == 0), "%s: add_eos %d, read back %d", opts[k].pre,
                nv_tokenizer_adds_eos(a), b ? nv_tokenizer_adds_eos(b) : -1);
        if (k == 9 && b) { /* DeepSeek-V3's own files say "no normalizer" as an empty Sequence */
            char *text = slurp(bd, "tokenizer.json", NULL);
            if (put_spliced(bd, "tokenizer.json", text, "\"normalizer\":\tnull", "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": []}")) {
                nv_tokenizer *e = NULL;
                T_CHECK(nv_tokenizer_load(json, 0, &e) == NV_OK, "an empty normalizer Sequence: %s", nv_errmsg());
                int diff = 0;
                for (int i = 0; e && i < n; i++) diff += !same_ids(a, e, tx[i]);
                T_CHECK(e && diff == 0, "%d texts differ", diff);
                nv_tokenizer_free(e);
            }
            free(text);
        }
        if (k == 0 && b) { /* ids past the tokenizer's, up to config.json's vocab_size: [PADn], and left out again on writing */
            const char *padded = folder("bpe-padded"), *again = folder("bpe-padded-again");
            copy_file(bd, padded, "tokenizer.json");
            copy_file(bd, padded, "tokenizer_config.json");
            char cfg_text[64];
            snprintf(cfg_text, sizeof cfg_text, "{\"vocab_size\": %d}", c.vocab_size + 5);
            put_text(padded, "config.json", cfg_text);
            nv_tokenizer *p = NULL, *q = NULL;
            snprintf(json, sizeof json, "%s/tokenizer.json", padded);
            T_CHECK(nv_tokenizer_load(json, 0, &p) == NV_OK, "%s", nv_errmsg());
            T_CHECK(p && nv_tokenizer_vocab_size(p) == c.vocab_size + 5 && !strncmp(nv_tokenizer_piece(p, c.vocab_size + 4), "[PAD", 4),
                    "padded to %d", p ? nv_tokenizer_vocab_size(p) : -1);
            nv_model pm;
            nv_config pc = c;
            pc.vocab_size += 5;
            T_CHECK(nv_model_alloc(&pm, &pc) == NV_OK && p && nv_hf_save(&pm, p, again, NV_HF_F32, NULL) == NV_OK, "%s", nv_errmsg());
            char *written = slurp(again, "tokenizer.json", NULL), tail[32];
            snprintf(tail, sizeof tail, "\"[PAD%d]\"", c.vocab_size);
            T_CHECK(written && !strstr(written, tail), "the padding is written out");
            free(written);
            snprintf(json, sizeof json, "%s/tokenizer.json", again);
            T_CHECK(nv_tokenizer_load(json, 0, &q) == NV_OK && nv_tokenizer_vocab_size(q) == pc.vocab_size && same_ids(q, a, "the 12 cats"),
                    "%s", nv_errmsg());
            nv_model_free(&pm);
            nv_tokenizer_free(p);
            nv_tokenizer_free(q);
            /* Qwen's NFC normalizer: a decomposed accent encodes as the composed one (U+0958 stays
               decomposed: a composition exclusion), and the normalizer is written out again */
            const char *nfc = folder("bpe-nfc"), *nfc_again = folder("bpe-nfc-again");
            char *tj = slurp(bd, "tokenizer.json", NULL);
            if (put_spliced(nfc, "tokenizer.json", tj, "\"normalizer\":\tnull", "\"normalizer\": {\"type\": \"NFC\"}")) {
                snprintf(json, sizeof json, "%s/tokenizer.json", nfc);
                T_CHECK(nv_tokenizer_load(json, 0, &p) == NV_OK, "%s", nv_errmsg());
                T_CHECK(p && same_ids(p, a, "caf\xc3\xa9 \xe0\xa4\x95\xe0\xa4\xbc the 12 cats"), "NFC text encodes as it did");
                int *x = NULL, *y = NULL, nx = 0, ny = 0;
                T_CHECK(p && nv_tokenizer_encode(p, "cafe\xcc\x81 \xe0\xa5\x98", 0, 0, &x, &nx) == NV_OK &&
                            nv_tokenizer_encode(a, "caf\xc3\xa9 \xe0\xa4\x95\xe0\xa4\xbc", 0, 0, &y, &ny) == NV_OK && nx == ny &&
                            !memcmp(x, y, (size_t)nx * sizeof *x) && !same_ids(a, p, "cafe\xcc\x81"),
                        "NFC: a decomposed accent is not encoded as the composed one");
                free(x);
                free(y);
                nv_model pm2;
                T_CHECK(nv_model_alloc(&pm2, &c) == NV_OK && p && nv_hf_save(&pm2, p, nfc_again, NV_HF_F32, NULL) == NV_OK, "%s",
                        nv_errmsg());
                char *w2 = slurp(nfc_again, "tokenizer.json", NULL);
                T_CHECK(w2 && strstr(w2, "\"NFC\""), "the NFC normalizer is not written out");
                free(w2);
                nv_model_free(&pm2);
                nv_tokenizer_free(p);
                p = NULL;
            }
            free(tj);
        }
        T_CHECK(b && nv_tokenizer_bos(b) == nv_tokenizer_bos(a) && nv_tokenizer_eos(b) == nv_tokenizer_eos(a) &&
                    nv_tokenizer_adds_bos(b) == nv_tokenizer_adds_bos(a),
                "%s: BOS %d/%d EOS %d/%d adds %d/%d", opts[k].pre, b ? nv_tokenizer_bos(b) : -9, nv_tokenizer_bos(a),
                b ? nv_tokenizer_eos(b) : -9, nv_tokenizer_eos(a), b ? nv_tokenizer_adds_bos(b) : -9, nv_tokenizer_adds_bos(a));
        nv_model_free(&m);
        nv_tokenizer_free(a);
        nv_tokenizer_free(b);
        a = b = NULL;
    }
    free(corpus);
}

/* A file's text from -> to, and the error (and words of its message) that must follow. */
typedef struct {
    const char *from, *to;
    nv_err want;
    const char *says;
} text_edit;

/* text with its first `from` replaced by `to`, written as dir/name; 0 when text lacks `from`. */
static int put_spliced(const char *dir, const char *name, const char *text, const char *from, const char *to) {
    const char *at = text ? strstr(text, from) : NULL;
    T_CHECK(at != NULL, "'%s' not in %s", from, name);
    if (!at) return 0;
    nv_buf b = {0};
    nv_buf_append(&b, text, (size_t)(at - text));
    nv_buf_append(&b, to, strlen(to));
    nv_buf_append(&b, at + strlen(from), strlen(at + strlen(from)));
    put(dir, name, b.data, b.len);
    nv_buf_free(&b);
    return 1;
}

/* One config.json field changed (JSON text spliced over the exported one) and its answer. */
static nv_err load_with(const char *dir, const char *from, const char *to, nv_config *c) {
    char *text = slurp(t_path("cfg-src"), "config.json", NULL);
    const int spliced = put_spliced(dir, "config.json", text, from, to);
    free(text);
    if (!spliced) return NV_OK;
    char cfg_path[700];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    return nv_model_read_config(cfg_path, c);
}

static nv_err load_with(const char *dir, const char *from, const char *to, nv_config *c);

/* YaRN (transformers' rope_type yarn): the divisors from its definition, computed here in double;
 * the attention factor (0.1 ln(factor) + 1, or mscale / mscale_all_dim's ratio, or given); the
 * table's cos and sin multiplied by it; written back to config.json and to GGUF (llama.cpp's
 * rope.scaling keys, no rope_freqs tensor) and read back the same, with the same logits. */
static void test_yarn(const char *dir) {
    nv_config c;
    T_CHECK(load_with(dir, "\"rope_scaling\":\tnull",
                      "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 128}", &c) == NV_OK,
            "%s", nv_errmsg());
    const int half = c.head_dim / 2;
    T_CHECK(c.n_rope_factors == half && c.yarn.factor == 4.0f && c.yarn.orig_ctx == 128 &&
                fabs(c.yarn.attn_factor - (0.1 * log(4.0) + 1)) < 1e-6,
            "yarn: %d factors, factor %g, attention %g", c.n_rope_factors, (double)c.yarn.factor, (double)c.yarn.attn_factor);
    /* transformers' find_correction_range(32, 1, head_dim, theta, 128), truncated, and its linear ramp */
    const double lo = fmax(0, floor(c.head_dim * log(128 / (32 * 2 * M_PI)) / (2 * log(10000.0)))),
                 hi = fmin(c.head_dim - 1, ceil(c.head_dim * log(128 / (1 * 2 * M_PI)) / (2 * log(10000.0))));
    int kept = 0, divided = 0;
    for (int i = 0; i < half; i++) {
        const double ramp = fmin(1, fmax(0, (i - lo) / (hi == lo ? 0.001 : hi - lo))), extrap = 1 - ramp;
        const double inv = 1 / pow(10000.0, 2.0 * i / c.head_dim), blended = inv / 4 * (1 - extrap) + inv * extrap;
        T_CHECK(fabs(c.rope_factors[i] - inv / blended) < 1e-5 * (inv / blended), "pair %d: divisor %g, want %g", i,
                (double)c.rope_factors[i], inv / blended);
        kept += c.rope_factors[i] == 1.0f, divided += c.rope_factors[i] == 4.0f;
    }
    T_CHECK(kept && divided && kept + divided < half, "the ramp keeps %d pairs and divides %d of %d", kept, divided, half);
    float *cs = malloc(sizeof(float) * 3 * (size_t)c.head_dim);
    if (cs) {
        nv_rope_table(cs, &c, 3);
        const float f1 = 1.0f / powf(c.rope_theta, 2.0f / (float)c.head_dim) / c.rope_factors[1];
        T_CHECK(cs[0] == c.yarn.attn_factor && cs[1] == 0 && cs[2 * c.head_dim + 2] == cosf(2 * f1) * c.yarn.attn_factor,
                "the table's cos and sin are not multiplied by the attention factor: %g", (double)cs[0]);
        free(cs);
    }
    nv_config d;
    T_CHECK(load_with(dir, "\"rope_scaling\":\tnull",
                      "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0, \"mscale\": 1.0, \"mscale_all_dim\": 0.5}", &d) == NV_OK &&
                fabs(d.yarn.attn_factor - (0.1 * log(4.0) + 1) / (0.05 * log(4.0) + 1)) < 1e-6 && d.yarn.orig_ctx == d.seq_len,
            "yarn with mscale and mscale_all_dim: %g, original context %d: %s", (double)d.yarn.attn_factor, d.yarn.orig_ctx, nv_errmsg());
    T_CHECK(load_with(dir, "\"rope_scaling\":\tnull",
                      "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 2.0, \"attention_factor\": 0.75, \"truncate\": false}",
                      &d) == NV_OK &&
                d.yarn.attn_factor == 0.75f && d.yarn.no_truncate,
            "yarn with its attention factor and no truncation: %s", nv_errmsg());
    /* written back: config.json and GGUF, each read back the same, the same logits */
    nv_model m;
    if (nv_model_alloc(&m, &c) != NV_OK) return;
    nv_model_init_random(&m, 3);
    const char *out = folder("yarn-out");
    char cfg[700], gg[700];
    snprintf(cfg, sizeof cfg, "%s/config.json", out);
    snprintf(gg, sizeof gg, "%s/yarn.gguf", out);
    nv_model a, b;
    T_CHECK(nv_hf_save(&m, NULL, out, NV_HF_F32, NULL) == NV_OK && nv_model_load(cfg, &a) == NV_OK &&
                nv_gguf_save(&m, NULL, "yarn", gg, NV_GGUF_F32, NULL, NULL) == NV_OK && nv_model_load(gg, &b) == NV_OK,
            "%s", nv_errmsg());
    nv_gguf g;
    if (nv_gguf_open(gg, &g) == NV_OK) {
        size_t n = 0;
        const char *type = nv_gguf_string(&g, "llama.rope.scaling.type", &n);
        T_CHECK(type && n == 4 && !memcmp(type, "yarn", 4) && !nv_gguf_tensor_find(&g, "rope_freqs.weight"), "the GGUF's YaRN keys");
        nv_gguf_close(&g);
    }
    const int toks[4] = {1, 403, 407, 261};
    for (int which = 0; which < 2; which++) {
        nv_model *r = which ? &b : &a;
        if (!r->params) continue;
        T_CHECK(!memcmp(r->config.rope_factors, c.rope_factors, sizeof(float) * (size_t)half) &&
                    r->config.yarn.attn_factor == c.yarn.attn_factor && r->config.yarn.orig_ctx == 128,
                "%s: YaRN read back otherwise (attention %g)", which ? "GGUF" : "config.json", (double)r->config.yarn.attn_factor);
        nv_state s1, s2;
        if (nv_model_build_plans(&m, NV_ENGINE_SCALAR) == NV_OK && nv_model_build_plans(r, NV_ENGINE_SCALAR) == NV_OK &&
            nv_state_init(&s1, &c, 4, 8, 0) == NV_OK && nv_state_init(&s2, &r->config, 4, 8, 0) == NV_OK) {
            T_CHECK(nv_forward(&m, &s1, toks, 4, 0) == NV_OK && nv_forward(r, &s2, toks, 4, 0) == NV_OK &&
                        !memcmp(s1.logits, s2.logits, sizeof(float) * (size_t)c.vocab_size),
                    "%s: other logits", which ? "GGUF" : "config.json");
            nv_state_free(&s1);
            nv_state_free(&s2);
        }
        nv_model_free(r);
    }
    /* a GGUF file's YaRN without its original context is refused */
    char *bytes = NULL;
    size_t len = 0;
    if (nv_file_read_all(gg, &bytes, &len) == NV_OK) {
        char *at = memmem(bytes, len, "original_context_length", 23);
        if (at) at[22] = 'X';
        nv_model bad;
        T_CHECK(at && nv_model_load(t_write("yarn-bad.gguf", bytes, len), &bad) == NV_EFORMAT && strstr(nv_errmsg(), "original_context_length"),
                "YaRN without its original context: %s", nv_errmsg());
        free(bytes);
    }
    /* an unrounded ramp has no GGUF form */
    m.config.yarn.no_truncate = 1;
    T_CHECK(nv_gguf_save(&m, NULL, "yarn", gg, NV_GGUF_F32, NULL, NULL) == NV_EUNSUPPORTED, "truncate false written to GGUF");
    nv_model_free(&m);
}

/* config.json: what is refused, and Llama 3.1's RoPE scaling and Mistral's window as they are meant. */
static void test_config(void) {
    const char *src = folder("cfg-src");
    if (!export_260k(src, "f32")) return;
    const char *dir = folder("cfg");
    copy_file(src, dir, "model.safetensors");
    nv_config c;
    static const text_edit bad[] = {
        {"\"llama\"", "\"gpt2\"", NV_EUNSUPPORTED, "model type 'gpt2'"},
        {"\"silu\"", "\"gelu\"", NV_EUNSUPPORTED, "hidden_act"},
        {"\"hidden_size\":\t64", "\"hidden_size\":\t\"64\"", NV_EFORMAT, "'hidden_size' is not a whole number"},
        {"\"hidden_size\":\t64,", "", NV_EFORMAT, "'hidden_size' is missing"},
        {"\"num_attention_heads\":\t8", "\"num_attention_heads\":\t0", NV_EFORMAT, "num_attention_heads"},
        {"\"hidden_size\":\t64", "\"hidden_size\":\t64.5", NV_EFORMAT, "whole number"},
        {"\"rope_scaling\":\tnull", "\"rope_scaling\":\t{\"rope_type\": \"dynamic\", \"factor\": 4}", NV_EUNSUPPORTED, "'dynamic'"},
        {"\"rope_scaling\":\tnull", "\"rope_scaling\":\t{\"rope_type\": \"yarn\", \"factor\": 0.5}", NV_EFORMAT, "yarn factor"},
        {"\"rope_scaling\":\tnull", "\"rope_scaling\":\t{\"rope_type\": \"yarn\", \"factor\": 4, \"beta_fast\": 1, \"beta_slow\": 32}",
         NV_EFORMAT, "betas"},
        {"\"attention_bias\":\tfalse", "\"attention_bias\":\ttrue", NV_EUNSUPPORTED, "attention output biases"},
        {"\"attention_bias\":\tfalse", "\"attention_bias\":\tfalse, \"mlp_bias\": true", NV_EUNSUPPORTED, "feed-forward"},
        {"\"vocab_size\":\t512", "\"vocab_size\":\t513", NV_EFORMAT, "model.embed_tokens.weight"},
        {"\"intermediate_size\":\t172", "\"intermediate_size\":\t171", NV_EFORMAT, "mlp.gate_proj.weight' is not of shape"},
        {"\"tie_word_embeddings\":\ttrue", "\"tie_word_embeddings\":\tfalse", NV_OK, NULL}, /* no lm_head: tied all the same */
        {"{", "[", NV_EFORMAT, "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        nv_err e = load_with(dir, bad[i].from, bad[i].to, &c);
        T_CHECK(e == bad[i].want && (!bad[i].says || strstr(nv_errmsg(), bad[i].says)), "%s -> %s: %d %s", bad[i].from, bad[i].to,
                e, nv_errmsg());
    }
    /* Llama 3.1's rule, computed here from its definition */
    T_CHECK(load_with(dir, "\"rope_scaling\":\tnull",
                      "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                      "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 64}",
                      &c) == NV_OK,
            "%s", nv_errmsg());
    int scaled = 0, kept = 0;
    T_CHECK(c.n_rope_factors == c.head_dim / 2, "%d factors", c.n_rope_factors);
    for (int i = 0; i < c.n_rope_factors; i++) {
        const double freq = 1.0 / pow(10000.0, 2.0 * i / c.head_dim), wavelen = 2 * M_PI / freq;
        double want = wavelen < 64 / 4.0 ? 1 : wavelen > 64 / 1.0 ? 8 : 0;
        if (want == 0) {
            const double smooth = (64 / wavelen - 1) / (4 - 1);
            want = 1 / ((1 - smooth) / 8 + smooth);
        }
        T_CHECK(fabs(c.rope_factors[i] - want) < 1e-5 * want, "factor %d: %g, want %g", i, (double)c.rope_factors[i], want);
        scaled += want == 8;
        kept += want == 1;
    }
    T_CHECK(scaled && kept, "the test's scaling leaves some frequencies alone and divides others (%d, %d)", scaled, kept);
    nv_model l3m; /* written back as the rule it was read as, which gives the same divisors */
    if (nv_model_alloc(&l3m, &c) == NV_OK) {
        const char *l3 = folder("llama3-out");
        char l3_cfg[700];
        snprintf(l3_cfg, sizeof l3_cfg, "%s/config.json", l3);
        nv_config back;
        T_CHECK(nv_hf_save(&l3m, NULL, l3, NV_HF_F32, NULL) == NV_OK && nv_model_read_config(l3_cfg, &back) == NV_OK &&
                    !memcmp(back.rope_factors, c.rope_factors, sizeof c.rope_factors) && back.llama3.factor == 8.0f &&
                    back.llama3.high_freq_factor == 4.0f && back.llama3.orig_ctx == 64,
                "llama3 scaling written back: %s", nv_errmsg());
        nv_model_free(&l3m);
    }
    /* linear scaling: every frequency divided by its factor */
    T_CHECK(load_with(dir, "\"rope_scaling\":\tnull", "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.5}", &c) == NV_OK &&
                c.n_rope_factors == c.head_dim / 2 && c.rope_factors[0] == 2.5f && c.rope_factors[c.n_rope_factors - 1] == 2.5f,
            "linear: %s", nv_errmsg());
    nv_model lm;
    if (nv_model_alloc(&lm, &c) == NV_OK) { /* written back as linear scaling */
        const char *lin = folder("linear-out");
        char lin_cfg[700];
        snprintf(lin_cfg, sizeof lin_cfg, "%s/config.json", lin);
        nv_model_init_random(&lm, 7);
        nv_model back; /* the same model: config, and weights in llama's separate tensors */
        T_CHECK(nv_hf_save(&lm, NULL, lin, NV_HF_F32, NULL) == NV_OK && nv_model_load(lin_cfg, &back) == NV_OK &&
                    !memcmp(&back.config, &lm.config, sizeof back.config) && !memcmp(back.params, lm.params, lm.n_params * 4),
                "linear scaling written back: %s", nv_errmsg());
        nv_model_free(&back);
        nv_model_free(&lm);
    }
    T_CHECK(load_with(dir, "\"rope_scaling\":\tnull", "\"rope_scaling\": {\"type\": \"linear\", \"factor\": -1}", &c) == NV_EFORMAT,
            "a negative linear factor");
    test_yarn(dir);
    /* a Mistral window shorter than the context caps it; a Qwen2 one counts only when used */
    T_CHECK(load_with(dir, "\"llama\"", "\"mistral\", \"sliding_window\": 100", &c) == NV_OK && c.seq_len == 100, "%d", c.seq_len);
    T_CHECK(load_with(dir, "\"llama\"", "\"mistral\", \"sliding_window\": null", &c) == NV_OK && c.seq_len == 512, "%d", c.seq_len);
    T_CHECK(load_with(dir, "\"llama\"", "\"qwen2\", \"attention_bias\": true, \"sliding_window\": 0", &c) == NV_EFORMAT &&
                strstr(nv_errmsg(), "self_attn.q_proj.bias"),
            "a qwen2 config over a llama's weights: %s", nv_errmsg());
}

/* Malformed weight files: each refused with a message, nothing read out of bounds. */
static void test_malformed_safetensors(void) {
    const char *src = folder("st-src");
    if (!export_260k(src, "f32")) return;
    size_t len;
    char *good = slurp(src, "model.safetensors", &len);
    if (!good) return;
    uint64_t hl;
    memcpy(&hl, good, 8);
    const char *dir = folder("st");
    copy_file(src, dir, "config.json");
    char cfg_path[700];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    nv_model m;
    /* truncated anywhere: header, data */
    const size_t cuts[] = {0, 4, 8, 8 + (size_t)hl / 2, 8 + (size_t)hl, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        put(dir, "model.safetensors", good, cuts[i]);
        T_CHECK(nv_model_load(cfg_path, &m) == NV_EFORMAT, "cut at %zu: %s", cuts[i], nv_errmsg());
    }
    /* a header length past the file */
    char *bad = malloc(len);
    memcpy(bad, good, len);
    const uint64_t huge = (uint64_t)len;
    memcpy(bad, &huge, 8);
    put(dir, "model.safetensors", bad, len);
    T_CHECK(nv_model_load(cfg_path, &m) == NV_EFORMAT && strstr(nv_errmsg(), "not a safetensors file"), "%s", nv_errmsg());
    /* header edits of the same length: a dtype, an offset, a name */
    static const text_edit edits[] = {
        {"\"F32\"", "\"I32\"", NV_EUNSUPPORTED, "I32"},
        {"\"F32\"", "\"Q32\"", NV_EFORMAT, "unknown dtype"},
        {"model.norm.weight", "model.norm.weighx", NV_EFORMAT, "'model.norm.weight' is missing"},
        {"\"model.embed_tokens.weight\"", "\"model.embed_tokens.weighs\"", NV_EFORMAT, "missing"},
        {"\"data_offsets\":[0,", "\"data_offsets\":[4,", NV_EFORMAT, "spans"},
        {"\"shape\":[64]", "\"shape\":[65]", NV_EFORMAT, "spans"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        memcpy(bad, good, len);
        char *at = memmem(bad + 8, (size_t)hl, edits[i].from, strlen(edits[i].from));
        T_CHECK(at && strlen(edits[i].from) == strlen(edits[i].to), "'%s' not in the header", edits[i].from);
        if (!at) continue;
        memcpy(at, edits[i].to, strlen(edits[i].to));
        put(dir, "model.safetensors", bad, len);
        nv_err e = nv_model_load(cfg_path, &m);
        T_CHECK(e == edits[i].want && strstr(nv_errmsg(), edits[i].says), "%s -> %s: %d %s", edits[i].from, edits[i].to, e, nv_errmsg());
        if (e == NV_OK) nv_model_free(&m);
    }
    /* a tensor the model has no place for is refused; old checkpoints' inv_freq buffers are not */
    const char *extras[] = {"model.layers.0.mlp.gate_proj.bias", "model.layers.0.self_attn.rotary_emb.inv_freq"};
    for (int k = 0; k < 2; k++) {
        cJSON *h = cJSON_ParseWithLength(good + 8, (size_t)hl);
        cJSON *t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "dtype", "F32");
        const double shape[1] = {4}, off[2] = {0, 16};
        cJSON_AddItemToObject(t, "shape", cJSON_CreateDoubleArray(shape, 1));
        cJSON_AddItemToObject(t, "data_offsets", cJSON_CreateDoubleArray(off, 2));
        cJSON_AddItemToObject(h, extras[k], t);
        char *ht = cJSON_PrintUnformatted(h);
        const uint64_t nl = strlen(ht);
        nv_buf f = {0};
        nv_buf_append(&f, &nl, 8);
        nv_buf_append(&f, ht, nl);
        nv_buf_append(&f, good + 8 + hl, len - 8 - (size_t)hl);
        put(dir, "model.safetensors", f.data, f.len);
        nv_err e = nv_model_load(cfg_path, &m);
        T_CHECK(k ? e == NV_OK : e == NV_EUNSUPPORTED && strstr(nv_errmsg(), "has no place"), "%s: %d %s", extras[k], e, nv_errmsg());
        if (e == NV_OK) nv_model_free(&m);
        nv_buf_free(&f);
        free(ht);
        cJSON_Delete(h);
    }
    /* no weights at all */
    char path[800];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    T_CHECK(nv_model_load(cfg_path, &m) == NV_EFORMAT && strstr(nv_errmsg(), "no model.safetensors"), "%s", nv_errmsg());
    free(bad);
    free(good);
}

/* tokenizer.json variants refused with a message. */
static void test_malformed_tokenizer(void) {
    const char *dir = folder("badtok");
    static const struct {
        const char *json;
        nv_err want;
        const char *says;
    } cases[] = {
        {"{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", NV_EUNSUPPORTED, "'Unigram'"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0, \"c\": 1, \"d\": 2}, \"merges\": []}}", NV_EFORMAT, "two tokens"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}", NV_EFORMAT, "whole number"},
        /* one id far past the others: millions of unnamed ids refused, not made (a slow load the fuzzer found) */
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 9000000}, \"merges\": []}}", NV_EFORMAT,
         "8999998 of its 9000001 token ids name no token"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2}, \"merges\": [3]}}", NV_EFORMAT, "merge"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2}, \"merges\": []}, \"added_tokens\": [{\"id\": 1}]}",
         NV_EFORMAT, "no content"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2}, \"merges\": []}, \"pre_tokenizer\": {\"type\": "
         "\"Digits\"}}",
         NV_EUNSUPPORTED, "'Digits'"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2}, \"merges\": []}, \"pre_tokenizer\": {\"type\": "
         "\"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\w+\"}}, {\"type\": \"ByteLevel\", "
         "\"use_regex\": false}]}}",
         NV_EUNSUPPORTED, "not one this project knows"},
        /* a split that drops its matches, or keeps them with the text before: not the isolated pieces DeepSeek's splits make */
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2}, \"merges\": []}, \"pre_tokenizer\": {\"type\": "
         "\"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{N}{1,3}\"}, \"behavior\": \"Removed\"}, "
         "{\"type\": \"ByteLevel\", \"use_regex\": false}]}}",
         NV_EUNSUPPORTED, "pre-tokenizer 'Split' is not supported"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2}, \"merges\": []}, \"pre_tokenizer\": {\"type\": "
         "\"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{N}{1,3}\"}, \"behavior\": \"Isolated\", "
         "\"invert\": true}, {\"type\": \"ByteLevel\", \"use_regex\": false}]}}",
         NV_EUNSUPPORTED, "pre-tokenizer 'Split' is not supported"},
        /* DeepSeek-V3's first two splits without its third: a sequence this project does not know */
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2}, \"merges\": []}, \"pre_tokenizer\": {\"type\": "
         "\"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{N}{1,3}\"}, \"behavior\": \"Isolated\"}, "
         "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+\"}, \"behavior\": \"Isolated\"}, "
         "{\"type\": \"ByteLevel\", \"use_regex\": false}]}}",
         NV_EUNSUPPORTED, "(and those after it) is not one this project knows"},
        {"{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"unk_token\": \"b\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2}, "
         "\"merges\": []}}",
         NV_EUNSUPPORTED, "needs 0, 1, 2"},
        {"{\"model\": {\"type\": \"BPE\", \"unk_token\": \"zz\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2}, \"merges\": []}}", NV_EFORMAT,
         "'zz' is not in the vocabulary"},
        {"{\"model\": 3", NV_EFORMAT, "not a JSON object"},
        /* text handling this project does not do is refused, not ignored */
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2}, \"merges\": []}, \"normalizer\": {\"type\": "
         "\"Sequence\", \"normalizers\": [{\"type\": \"NFKC\"}, {\"type\": \"Lowercase\"}]}}",
         NV_EUNSUPPORTED, "normalizer 'NFKC+Lowercase'"},
        /* a name with a line break: the message stays one line */
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2}, \"merges\": []}, \"normalizer\": {\"type\": "
         "\"Sequence\", \"normalizers\": [{\"type\": \"Prepend\"}, {\"type\": \"Rep\\nlace\"}]}}",
         NV_EUNSUPPORTED, "normalizer 'Prepend+Rep?lace'"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2}, \"merges\": []}, \"pre_tokenizer\": {\"type\": "
         "\"ByteLevel\", \"add_prefix_space\": true}}",
         NV_EUNSUPPORTED, "add_prefix_space"},
        {"{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"unk_token\": \"a\", \"vocab\": {\"a\": 0, \"<s>\": 1, \"</s>\": 2}, "
         "\"merges\": []}}",
         NV_EUNSUPPORTED, "normalizer 'none' with pre-tokenizer 'none' is not SentencePiece's"},
        {"{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"unk_token\": \"a\", \"vocab\": {\"a\": 0, \"<s>\": 1, \"</s>\": 2}, "
         "\"merges\": []}, \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\u2581\", \"prepend_scheme\": \"never\"}}",
         NV_EUNSUPPORTED, "pre-tokenizer 'Metaspace'"},
        {"{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"unk_token\": \"a\", \"vocab\": {\"a\": 0, \"<s>\": 1, \"</s>\": 2}, "
         "\"merges\": []}, \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\u2581\", \"prepend_scheme\": \"first\"}}",
         NV_OK, ""},
    };
    char path[800];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        put_text(dir, "tokenizer.json", cases[i].json);
        nv_tokenizer *t = NULL;
        nv_err e = nv_tokenizer_load(path, 0, &t);
        T_CHECK(e == cases[i].want && strstr(nv_errmsg(), cases[i].says) && !strchr(nv_errmsg(), '\n'), "case %zu: %d %s", i, e,
                nv_errmsg());
        nv_tokenizer_free(t);
    }
    /* tokenizer_config.json's chat template: a string, or the default of a list */
    put_text(dir, "tokenizer_config.json", "{\"chat_template\": \"{{'<|im_start|>' + m}}\"}");
    char *tmpl = nv_hf_chat_template(path);
    T_CHECK(tmpl && !strcmp(tmpl, "{{'<|im_start|>' + m}}"), "%s", tmpl ? tmpl : "(none)");
    free(tmpl);
    put_text(dir, "tokenizer_config.json",
             "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"x\"}, {\"name\": \"default\", \"template\": \"[INST]\"}]}");
    tmpl = nv_hf_chat_template(path);
    T_CHECK(tmpl && !strcmp(tmpl, "[INST]"), "%s", tmpl ? tmpl : "(none)");
    free(tmpl);
}

/* The CLI: serve declares the folder's template and names the model after the folder; train
 * fine-tunes a folder with its own tokenizer; export refuses what a folder cannot hold. */
static void test_cli(void) {
    const char *dir = folder("cli");
    if (!export_260k(dir, "f32")) return;
    char args[2400];
    snprintf(args, sizeof args, "export %s -o %s/again/ --type q8_0", dir, t_tmpdir());
    T_CHECK(t_nerve(args) == 2 && strstr(t_err, "f32, bf16 or f16"), "%s", t_err);
    snprintf(args, sizeof args, "export %s -o %s/x.bin --type bf16", dir, t_tmpdir());
    T_CHECK(t_nerve(args) == 2 && strstr(t_err, "--type bf16"), "%s", t_err);
    /* a folder exports to GGUF with its tokenizer.json's vocabulary, and the GGUF file's greedy text is the folder's */
    snprintf(args, sizeof args, "export %s -o %s/fromhf.gguf", dir, t_tmpdir());
    T_CHECK(t_nerve(args) == 0, "%s", t_err);
    snprintf(args, sizeof args, "generate -m %s/fromhf.gguf -n 40 -t 0", t_tmpdir());
    T_CHECK(t_nerve(args) == 0, "%s", t_err);
    char *from_gguf = strdup(t_out);
    snprintf(args, sizeof args, "generate -m %s -n 40 -t 0", dir);
    T_CHECK(t_nerve(args) == 0 && !strcmp(t_out, from_gguf), "%s vs %s", t_out, from_gguf);
    free(from_gguf);
    /* fine-tuning the folder: its tokenizer.json is the default -z */
    const char *text = t_data("corpus/tinystories_valid_head.txt");
    if (!text) return;
    snprintf(args, sizeof args, "train --init-from %s --data %s --steps 3 --batch 2 --seq 32 --out %s/run --val-frac 0", dir, text,
             t_tmpdir());
    T_CHECK(t_nerve(args) == 0, "%s", t_err);
}

/* PEFT adapters: written and read back bit for bit (llama and qwen3 shapes), B's query rows in
 * transformers' order, the same outputs as the GGUF form of the same adapter, rsLoRA's scale, a
 * LoRA run's folder as --lora, and what is refused. */
static void test_peft_lora(void) {
    const char *bin = t_data("models/stories260K.bin"), *z = t_data("models/tok512.bin");
    const char *text = t_data("corpus/tinystories_valid_head.txt");
    if (!bin || !z || !text) return;
    nv_model m;
    T_CHECK(nv_model_load(bin, &m) == NV_OK, "%s", nv_errmsg());
    const nv_config *c = &m.config;
    nv_lora_shape s = {4, 8.0f, NV_LORA_ALL}, back_s;
    float *p = malloc(nv_lora_param_count(c, &s) * sizeof(float)), *back = NULL;
    nv_lora_init_nonzero(c, &s, p, 3, 0.05f);
    const char *dir = folder("peft");
    T_CHECK(nv_hf_save_lora(c, &s, p, 0.05f, dir) == NV_OK, "%s", nv_errmsg());
    T_CHECK(nv_lora_load(dir, c, &back_s, &back) == NV_OK, "%s", nv_errmsg());
    T_CHECK(back && !memcmp(&back_s, &s, sizeof s) && !memcmp(back, p, nv_lora_param_count(c, &s) * sizeof(float)),
            "the adapter changed in the round trip");
    free(back);
    back = NULL;
    /* the file as PEFT lays it out: A as it is, B = (B^T)^T with its query rows in transformers' order */
    st_file f;
    T_CHECK(st_read(dir, "adapter_model.safetensors", &f), "header");
    int r, k;
    const float *a = st_f32(&f, "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight", &r, &k);
    const float *b = st_f32(&f, "base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight", &r, &k);
    const float *mine = p + nv_lora_offset(c, &s, 1, 0);
    float *bm = malloc((size_t)c->dim * 4 * sizeof(float));
    for (int o = 0; o < c->dim; o++)
        for (int q = 0; q < 4; q++) bm[o * 4 + q] = mine[4 * c->dim + q * c->dim + o];
    T_CHECK(a && !memcmp(a, mine, (size_t)4 * c->dim * 4), "lora_A");
    T_CHECK(b && r == c->dim && k == 4 && rows_permuted(b, bm, c->n_heads, c->head_dim, 4), "lora_B's rows");
    free(bm);
    st_free(&f);
    char *cfg = slurp(dir, "adapter_config.json", NULL);
    T_CHECK(cfg && strstr(cfg, "\"LORA\"") && strstr(cfg, "\"q_proj\"") && strstr(cfg, "\"down_proj\""), "%s", cfg);
    cJSON *cj = cfg ? cJSON_Parse(cfg) : NULL;
    const cJSON *ld = cJSON_GetObjectItemCaseSensitive(cj, "lora_dropout");
    T_CHECK(cJSON_IsNumber(ld) && ld->valuedouble == 0.05, "lora_dropout: %s", cfg);
    cJSON_Delete(cj);
    free(cfg);
    /* the GGUF form of the same adapter gives the same perplexity, by the folder, its config or its weights */
    char gguf[700], args[2400], *want = NULL;
    snprintf(gguf, sizeof gguf, "%s/same.gguf", t_tmpdir());
    T_CHECK(nv_gguf_save_lora(c, &s, p, gguf) == NV_OK, "%s", nv_errmsg());
    const char *forms[] = {gguf, "", "/adapter_config.json", "/adapter_model.safetensors"};
    for (int i = 0; i < 4; i++) {
        snprintf(args, sizeof args, "perplexity -m %s -z %s -f %s --chunks 2 --ctx 128 --json --lora %s%s", bin, z, text,
                 i ? dir : "", forms[i]);
        T_CHECK(t_nerve(args) == 0, "%s", t_err);
        char *nll = strstr(t_out, "\"nll\"");
        if (!i) want = nll ? strndup(nll, 30) : NULL;
        else T_CHECK(nll && want && !strncmp(nll, want, 30), "--lora %s%s: %.40s, the GGUF file's %.30s", dir, forms[i], nll ? nll : "?",
                     want ? want : "?");
    }
    free(want);
    /* rsLoRA: alpha / sqrt(r) */
    cfg = slurp(dir, "adapter_config.json", NULL);
    char *at = cfg ? strstr(cfg, "\"use_rslora\":\tfalse") : NULL;
    T_CHECK(at != NULL, "use_rslora");
    if (at) {
        memcpy(at + strlen("\"use_rslora\":\t"), "true ", 5);
        put_text(dir, "adapter_config.json", cfg);
        T_CHECK(nv_lora_load(dir, c, &back_s, &back) == NV_OK && fabsf(back_s.alpha - 16.0f) < 1e-5f, "rsLoRA alpha %g",
                (double)back_s.alpha);
        free(back);
        back = NULL;
    }
    free(cfg);
    /* refused */
    static const text_edit bad[] = {
        {"\"use_dora\":\tfalse", "\"use_dora\":\ttrue", NV_EUNSUPPORTED, "DoRA"},
        {"\"bias\":\t\"none\"", "\"bias\":\t\"all\"", NV_EUNSUPPORTED, "biases"},
        {"\"r\":\t4", "\"r\":\t8", NV_EFORMAT, "r = 8"},
        {"\"LORA\"", "\"IA3\"", NV_EUNSUPPORTED, "peft_type 'IA3'"},
        {"\"inference_mode\":\ttrue", "\"inference_mode\":\ttrue, \"modules_to_save\": [\"lm_head\"]", NV_EUNSUPPORTED, "modules_to_save"},
    };
    char *good = slurp(dir, "adapter_config.json", NULL);
    for (size_t i = 0; good && i < sizeof bad / sizeof bad[0]; i++) {
        if (!put_spliced(dir, "adapter_config.json", good, bad[i].from, bad[i].to)) continue;
        nv_err e = nv_lora_load(dir, c, &back_s, &back);
        T_CHECK(e == bad[i].want && strstr(nv_errmsg(), bad[i].says) && !back, "%s: %d %s", bad[i].to, e, nv_errmsg());
        free(back);
        back = NULL;
    }
    free(good);
    nv_model_free(&m);
    free(p);
    /* a Qwen3 shape (QK-norm, wide heads, GQA) round trips too */
    nv_config q3 = {.dim = 64, .hidden_dim = 96, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .head_dim = 32, .vocab_size = 300,
                    .seq_len = 128, .rope_theta = 1000000.0f, .norm_eps = 1e-6f, .qk_norm = 1};
    nv_lora_shape s3 = {8, 16.0f, NV_LORA_Q | NV_LORA_K | NV_LORA_DOWN};
    p = malloc(nv_lora_param_count(&q3, &s3) * sizeof(float));
    nv_lora_init_nonzero(&q3, &s3, p, 5, 0.1f);
    const char *d3 = folder("peft-qwen3");
    T_CHECK(nv_hf_save_lora(&q3, &s3, p, 0.0f, d3) == NV_OK && nv_lora_load(d3, &q3, &back_s, &back) == NV_OK, "%s", nv_errmsg());
    T_CHECK(back && !memcmp(&back_s, &s3, sizeof s3) && !memcmp(back, p, nv_lora_param_count(&q3, &s3) * sizeof(float)),
            "the qwen3 adapter changed in the round trip");
    free(back);
    free(p);
    /* a LoRA run leaves its adapters in PEFT's form too: --lora RUN_DIR is --lora RUN_DIR/adapter.gguf */
    snprintf(args, sizeof args, "train --init-from %s -z %s --data %s --lora-rank 4 --lr 0.01 --steps 3 --batch 2 --seq 32 --val-frac 0 --out %s/lora-run",
             bin, z, text, t_tmpdir());
    T_CHECK(t_nerve(args) == 0, "%s", t_err);
    char *with_gguf = NULL;
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "generate -m %s -z %s -n 60 -t 0 --lora %s/lora-run%s", bin, z, t_tmpdir(), i ? "" : "/adapter.gguf");
        T_CHECK(t_nerve(args) == 0, "%s", t_err);
        if (!i) with_gguf = strdup(t_out);
        else T_CHECK(with_gguf && !strcmp(t_out, with_gguf), "the run folder's PEFT adapter generates otherwise: %s", t_out);
    }
    free(with_gguf);
}

int main(void) {
    T_RUN(test_export_layout_and_golden);
    T_RUN(test_export_over_a_model);
    T_RUN(test_half_types);
    T_RUN(test_qwen_shapes);
    T_RUN(test_shards);
    T_RUN(test_phi3_folder);
    T_RUN(test_rstrip_tokens);
    T_RUN(test_tokenizer_roundtrip);
    T_RUN(test_config);
    T_RUN(test_malformed_safetensors);
    T_RUN(test_malformed_tokenizer);
    T_RUN(test_cli);
    T_RUN(test_peft_lora);
    return t_done();
}
