/* Writes the fuzzers' seed corpus (make fuzz-seeds): tiny valid inputs of every format, a few
 * kilobytes each, so that mutation starts from the structure the parsers expect.
 *
 *   gen_seeds DIR   writes DIR/{model,tokenizer,hf,ckpt,api,chat,gbnf,choice,jinja}/... (GGUF seeds through tests/gguf_write.h) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "model/imatrix.h"
#include "serve/chat.h"
#include "model/model.h"
#include "base/buf.h"
#include "train/ckpt.h"
#include "../tests/gguf_write.h"
#include "../tests/bpe_write.h"
#include "../tests/moe_write.h"
#include "model/gguf.h"
#include "model/lora.h"
#include "model/hf.h"

static const char *root;

/* DIR/sub/name, with DIR/sub created. */
static const char *seed_path(const char *sub, const char *name) {
    static char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/%s", root, sub);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (nv_mkdirs(dir) != NV_OK) {
        fprintf(stderr, "gen_seeds: %s\n", nv_errmsg());
        exit(1);
    }
    return path;
}

static void check(nv_err e) {
    if (e == NV_OK) return;
    fprintf(stderr, "gen_seeds: %s\n", nv_errmsg());
    exit(1);
}

/* A model of config c with random weights (seed) as the project's GGUF writer writes it, of tensor type type. */
static void random_gguf(const nv_config *c, uint64_t seed, const char *name, uint32_t type) {
    nv_model m;
    check(nv_model_alloc(&m, c));
    nv_model_init_random(&m, seed);
    check(nv_gguf_save(&m, NULL, "seed", seed_path("model", name), type, NULL, NULL));
    nv_model_free(&m);
}

static void put(const char *sub, const char *name, const void *data, size_t len) {
    nv_iov part = {data, len};
    check(nv_file_write_atomic(seed_path(sub, name), &part, 1));
}

static void put_buf(const char *sub, const char *name, const nv_buf *b) {
    if (b->oom) check(nv_fail(NV_ENOMEM, "out of memory"));
    put(sub, name, b->data, b->len);
}

static void add(nv_buf *b, const void *d, size_t n) { nv_buf_append(b, d, n); }
static void add_i32(nv_buf *b, int32_t v) { add(b, &v, 4); }

/* ---- models: llama2.c v1 (shared / separate classifier) and v0 ------------------------------ */

static void model_v0(const nv_model *m, const char *name) {
    const nv_config *c = &m->config;
    const nv_weights *w = &m->w;
    nv_buf b = {0};
    int32_t hdr[7] = {c->dim,     c->hidden_dim,
                      c->n_layers, c->n_heads,
                      c->n_kv_heads, c->shared_classifier ? c->vocab_size : -c->vocab_size,
                      c->seq_len};
    add(&b, hdr, sizeof hdr);
    size_t L = (size_t)c->n_layers, d = (size_t)c->dim, h = (size_t)c->hidden_dim;
    size_t q = (size_t)nv_config_q_dim(c), kv = (size_t)nv_config_kv_dim(c), v = (size_t)c->vocab_size;
    add(&b, w->tok_emb, v * d * 4);
    add(&b, w->rms_att, L * d * 4);
    add(&b, w->wq, L * q * d * 4);
    add(&b, w->wk, L * kv * d * 4);
    add(&b, w->wv, L * kv * d * 4);
    add(&b, w->wo, L * d * q * 4);
    add(&b, w->rms_ffn, L * d * 4);
    add(&b, w->w1, L * h * d * 4);
    add(&b, w->w2, L * d * h * 4);
    add(&b, w->w3, L * h * d * 4);
    add(&b, w->rms_final, d * 4);
    size_t freq = (size_t)c->seq_len * (size_t)(c->head_dim / 2) * 2;
    float *zeros = calloc(freq, 4);
    add(&b, zeros, freq * 4);
    free(zeros);
    if (!c->shared_classifier) add(&b, w->wcls, v * d * 4);
    put_buf("model", name, &b);
    nv_buf_free(&b);
}

static void models(void) {
    /* dim 8, hidden 16, 2 heads of 4, 1 KV head (GQA), vocab 16, context 8 */
    nv_config c = {8, 16, 1, 2, 1, 4, 16, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    for (int shared = 1; shared >= 0; shared--) {
        c.shared_classifier = shared;
        c.n_layers = shared ? 1 : 2;
        nv_model m;
        check(nv_model_alloc(&m, &c));
        nv_model_init_random(&m, 7);
        check(nv_model_save_v1(&m, seed_path("model", shared ? "v1_dim8_shared.bin" : "v1_dim8_sep.bin")));
        model_v0(&m, shared ? "v0_dim8_shared.bin" : "v0_dim8_sep.bin");
        nv_model_free(&m);
    }
    /* GGUF: every tensor type the loader converts, and a vocabulary (the tokenizer fuzzer's too) */
    gguf_write_model(seed_path("model", "v3_types.gguf"), "llama", 3, 0);
    gguf_write_model(seed_path("model", "v2_vocab.gguf"), "llama", 2, 1);
    gguf_write_model(seed_path("tokenizer", "v2_vocab.gguf"), "llama", 2, 1);
    /* byte-level BPE vocabularies: Qwen's split without BOS, Llama 3's with it */
    check(write_vocab(seed_path("tokenizer", "bpe_qwen2.gguf"), &(vocab_opts){"qwen2", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0}) ? NV_EIO : NV_OK);
    check(write_vocab(seed_path("tokenizer", "bpe_llama3.gguf"), &(vocab_opts){"llama-bpe", ID_ENDOFTEXT, ID_IM_END, 1, -1, 0, 0, 0}) ? NV_EIO : NV_OK);
    check(write_vocab(seed_path("tokenizer", "bpe_gpt4o.gguf"), &(vocab_opts){"gpt-4o", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0}) ? NV_EIO : NV_OK);
    /* qwen3: QK-norm, head size 6 (not dim / heads), RoPE base 1e6; written by the project's writer */
    nv_config q = {8, 16, 1, 2, 1, 6, 16, 8, 1000000.0f, 1e-6f, 1, 1, 0, {0}, 0, NV_CONFIG_PLAIN};
    random_gguf(&q, 9, "v3_qwen3.gguf", NV_GGUF_F32);
    nv_model m;
    /* qwen2: projection biases; Llama 3.1-style RoPE frequency factors on a llama model */
    nv_config q2 = {8, 16, 1, 2, 1, 4, 16, 8, 1000000.0f, 1e-6f, 1, 0, 0, {0}, 1, NV_CONFIG_PLAIN};
    check(nv_model_alloc(&m, &q2));
    nv_model_init_random(&m, 10);
    for (int i = 0; i < 8; i++) m.w.bq[i] = 0.1f * (float)i;
    check(nv_gguf_save(&m, NULL, "seed", seed_path("model", "v3_qwen2.gguf"), NV_GGUF_F32, NULL, NULL));
    nv_model_free(&m);
    /* gpt-oss: sinks, biased experts, a window on every other layer; its experts MXFP4, the rest Q8_0 */
    nv_config oss = {32, 32, 2, 2, 1, 16, 16, 16, 10000.0f, 1e-5f, 0, 0, 0, {0}, 1, NV_CONFIG_PLAIN};
    oss.n_experts = 2, oss.n_experts_used = 1, oss.gpt_oss = 1, oss.swa_window = 4, oss.swa_period = 2;
    check(nv_model_alloc(&m, &oss));
    nv_model_init_random(&m, 12);
    for (int i = 0; i < 4; i++) m.w.sinks[i] = 0.5f * (float)i;
    check(nv_gguf_save(&m, NULL, "seed", seed_path("model", "v3_gpt_oss.gguf"), NV_GGUF_MXFP4_MOE, NULL, NULL));
    nv_model_free(&m);
    /* phi3: fused attn_qkv and gate-up ffn_up (rewritten from a llama file), a separate classifier;
       and a SentencePiece vocabulary with control tokens under phi3 (their text parsed, white space
       after them dropped) */
    nv_config p3 = {8, 16, 1, 2, 1, 4, 16, 8, 10000.0f, 1e-5f, 0, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    check(nv_model_alloc(&m, &p3));
    nv_model_init_random(&m, 12);
    char phi3_src[4200]; /* seed_path's buffer is one */
    snprintf(phi3_src, sizeof phi3_src, "%s", seed_path("model", "phi3_src.tmp"));
    check(nv_gguf_save(&m, NULL, "seed", phi3_src, NV_GGUF_F32, NULL, NULL));
    check(gw_phi3_from(phi3_src, seed_path("model", "v3_phi3.gguf"), &p3, 0) ? NV_OK : NV_EIO);
    check(gw_phi3_from(phi3_src, seed_path("model", "v3_phi3_longrope.gguf"), &p3, 2) ? NV_OK : NV_EIO); /* Phi-3.5's RoPE */
    nv_config p4 = p3; /* Phi-4-mini's: RoPE on 2 of each head's 4 values, LongRoPE's divisor for that pair */
    p4.rope_dim = 2;
    check(gw_phi3_from(phi3_src, seed_path("model", "v3_phi4_mini.gguf"), &p4, 2) ? NV_OK : NV_EIO);
    remove(phi3_src);
    nv_model_free(&m);
    check(gw_spm_vocab(seed_path("tokenizer", "spm_phi3.gguf"), "phi3", -1) ? NV_OK : NV_EIO);
    /* gemma3: a sliding window over five layers in six with its RoPE base, GELU, post-norms, scaled
       embeddings, soft-capped logits (7 layers: both kinds); and Gemma's vocabulary layout (BOS 2,
       EOS 1, <unk> 3, byte tokens after the specials, no dummy prefix) */
    nv_config g3 = {8, 16, 7, 2, 1, 4, 16, 8, 1000000.0f, 1e-6f, 1, 1, 0, {0}, 0, NV_CONFIG_PLAIN};
    g3.swa_window = 3, g3.swa_period = 6, g3.rope_theta_swa = 10000.0f, g3.ffn_gelu = g3.post_norms = 1;
    g3.emb_scale = sqrtf(8.0f), g3.logit_softcap = 30.0f;
    random_gguf(&g3, 13, "v3_gemma3.gguf", NV_GGUF_F32);
    /* gemma2: every other layer windowed, scores and logits soft-capped, no QK-norm */
    nv_config g2 = {8, 16, 2, 2, 1, 4, 16, 8, 10000.0f, 1e-6f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    g2.swa_window = 3, g2.swa_period = 2, g2.ffn_gelu = g2.post_norms = 1;
    g2.emb_scale = sqrtf(8.0f), g2.logit_softcap = 30.0f, g2.attn_softcap = 50.0f;
    random_gguf(&g2, 14, "v3_gemma2.gguf", NV_GGUF_F32);
    /* smollm3: every fourth layer without RoPE */
    nv_config s3 = {8, 16, 4, 2, 1, 4, 16, 8, 10000.0f, 1e-6f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    s3.nope_period = 4;
    random_gguf(&s3, 15, "v3_smollm3.gguf", NV_GGUF_F32);
    /* granite and granitemoe: llama's block (and experts) with the four multipliers */
    nv_config gr = {8, 16, 2, 2, 1, 4, 16, 8, 10000.0f, 1e-6f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    nv_config_set_granite(&gr, 12.0, 0.1, 0.22, 8.0);
    random_gguf(&gr, 16, "v3_granite.gguf", NV_GGUF_F32);
    gr.n_experts = 3, gr.n_experts_used = 2;
    random_gguf(&gr, 17, "v3_granitemoe.gguf", NV_GGUF_F32);
    /* olmo2: norms after the branches only, QK-norm over whole projections; OLMo 3's window on three
       layers of four (its flags per layer) with their own RoPE base */
    nv_config ol = {8, 16, 4, 2, 1, 4, 16, 8, 500000.0f, 1e-6f, 0, NV_QK_NORM_WHOLE, 0, {0}, 0, NV_CONFIG_PLAIN};
    ol.post_norms = ol.no_pre_norms = 1, ol.swa_window = 3, ol.swa_period = 4, ol.rope_theta_swa = 500000.0f;
    random_gguf(&ol, 18, "v3_olmo3.gguf", NV_GGUF_F32);
    /* mistral3 (Ministral 3): YaRN with its log multiplier, the queries' attention temperature */
    nv_config m3 = {8, 16, 2, 2, 1, 4, 16, 8, 1e6f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    check(nv_config_rope_yarn(&m3, &(nv_rope_yarn){.factor = 4.0f, .orig_ctx = 2, .beta_fast = 32.0f, .beta_slow = 1.0f, .attn_factor = 1.0f}));
    m3.attn_temp_scale = 0.1f, m3.attn_temp_len = 2;
    random_gguf(&m3, 19, "v3_mistral3.gguf", NV_GGUF_F32);
    check(write_vocab(seed_path("tokenizer", "bpe_tekken_think.gguf"), &(vocab_opts){"tekken", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 3, 0}) ? NV_EIO : NV_OK);
    check(write_vocab(seed_path("tokenizer", "bpe_dbrx.gguf"), &(vocab_opts){"dbrx", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0}) ? NV_EIO : NV_OK);
    check(write_vocab(seed_path("tokenizer", "bpe_deepseek_llm.gguf"), &(vocab_opts){"deepseek-llm", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0}) ? NV_EIO : NV_OK);
    check(write_vocab(seed_path("tokenizer", "bpe_deepseek_coder.gguf"), &(vocab_opts){"deepseek-coder", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0}) ? NV_EIO : NV_OK);
    check(gw_gemma_vocab(seed_path("tokenizer", "spm_gemma.gguf")) ? NV_OK : NV_EIO);
    nv_config lf = {8, 16, 1, 2, 2, 4, 16, 8, 500000.0f, 1e-5f, 1, 0, 2, {1.0f, 8.0f}, 0, NV_CONFIG_PLAIN};
    random_gguf(&lf, 11, "v3_rope_freqs.gguf", NV_GGUF_F32);
    /* mixtures of experts: Mixtral as llama (F16 experts: a source per expert's slice), qwen3moe */
    nv_config me = {8, 16, 1, 2, 1, 4, 16, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    me.n_experts = 3;
    me.n_experts_used = 2;
    for (int qk = 0; qk < 2; qk++) {
        me.qk_norm = qk;
        random_gguf(&me, 12, qk ? "v3_qwen3moe.gguf" : "v3_moe_f16.gguf", qk ? NV_GGUF_F32 : NV_GGUF_F16);
    }
}

/* ---- Hugging Face folders: config.json, NUL, model.safetensors (fuzz_hf's input) --------------- */

/* m (and tok) written as a folder; its config.json and model.safetensors as one seed, or the
 * safetensors alone (read with fuzz_hf's default config); its tokenizer.json a tokenizer seed. */
/* A Phi-3 folder (config.json, its NUL, model.safetensors in F32): each layer's query, key and value
 * rows in qkv_proj, its gate and up rows in gate_up_proj, LongRoPE's two sets of factors; with
 * partial, Phi-4-mini's RoPE on half of each head (one factor a set). */
static void phi3_seed(int partial) {
    const nv_config c = {8, 16, 2, 2, 1, 4, 16, 32, 10000.0f, 1e-5f, 0, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    nv_model m;
    check(nv_model_alloc(&m, &c));
    nv_model_init_random(&m, 14);
    const nv_weights *w = &m.w;
    const size_t d = 8, h = 16, q = 8, kv = 4, V = 16;
    nv_buf b = {0}, hdr = {0}, body = {0};
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"Phi3ForCausalLM\"], \"model_type\": \"phi3\", \"hidden_size\": 8, \"intermediate_size\": 16, "
             "\"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"vocab_size\": 16, "
             "\"max_position_embeddings\": 32, \"original_max_position_embeddings\": 8, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, "
             "\"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1.0%s], \"long_factor\": [2.0%s]}, "
             "\"sliding_window\": 7, \"partial_rotary_factor\": %s, \"tie_word_embeddings\": false, \"hidden_act\": \"silu\"}",
             partial ? "" : ", 1.5", partial ? "" : ", 3.5", partial ? "0.5" : "1.0");
    add(&b, cfg, strlen(cfg) + 1);
    nv_buf_puts(&hdr, "{");
    for (int l = -1; l < 2; l++) { /* the model's own tensors, then each layer's */
        /* name, rows, cols (0: a vector), then up to three sources of rows (their counts) */
        const struct {
            const char *name;
            size_t rows, cols;
            const float *p[3];
            size_t r[3];
        } top[] = {{"model.embed_tokens", V, d, {w->tok_emb}, {V}}, {"lm_head", V, d, {w->wcls}, {V}},
                   {"model.norm", d, 0, {w->rms_final}, {d}}},
          layer[] = {{"input_layernorm", d, 0, {w->rms_att + l * d}, {d}},
                     {"post_attention_layernorm", d, 0, {w->rms_ffn + l * d}, {d}},
                     {"self_attn.qkv_proj", q + 2 * kv, d, {w->wq + l * q * d, w->wk + l * kv * d, w->wv + l * kv * d}, {q, kv, kv}},
                     {"self_attn.o_proj", d, q, {w->wo + l * d * q}, {d}},
                     {"mlp.gate_up_proj", 2 * h, d, {w->w1 + l * h * d, w->w3 + l * h * d}, {h, h}},
                     {"mlp.down_proj", d, h, {w->w2 + l * d * h}, {d}}},
          *ts = l < 0 ? top : layer;
        const size_t nt = l < 0 ? sizeof top / sizeof top[0] : sizeof layer / sizeof layer[0];
        for (size_t i = 0; i < nt; i++) {
            char name[128], shape[48];
            if (l < 0) snprintf(name, sizeof name, "%s.weight", ts[i].name);
            else snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, ts[i].name);
            if (ts[i].cols) snprintf(shape, sizeof shape, "[%zu, %zu]", ts[i].rows, ts[i].cols);
            else snprintf(shape, sizeof shape, "[%zu]", ts[i].rows);
            const size_t cols = ts[i].cols ? ts[i].cols : 1;
            nv_buf_printf(&hdr, "%s\"%s\": {\"dtype\": \"F32\", \"shape\": %s, \"data_offsets\": [%zu, %zu]}", body.len ? ", " : "", name,
                          shape, body.len, body.len + ts[i].rows * cols * 4);
            for (int k = 0; k < 3 && ts[i].p[k]; k++) add(&body, ts[i].p[k], ts[i].r[k] * cols * 4);
        }
    }
    nv_buf_puts(&hdr, "}");
    while (hdr.len % 8) nv_buf_puts(&hdr, " ");
    const uint64_t hl = hdr.len;
    add(&b, &hl, 8);
    add(&b, hdr.data, hdr.len);
    add(&b, body.data, body.len);
    check(b.oom || hdr.oom || body.oom ? NV_ENOMEM : NV_OK);
    put_buf("hf", partial ? "phi4_mini.hf" : "phi3_longrope.hf", &b);
    nv_buf_free(&b), nv_buf_free(&hdr), nv_buf_free(&body);
    nv_model_free(&m);
}

static void hf_seed(const nv_model *m, const nv_tokenizer *tok, const char *name, int with_config, nv_hf_dtype dtype) {
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/hf-tmp", root);
    check(nv_hf_save(m, tok, dir, dtype, NULL));
    char *cfg = NULL, *st = NULL, *tj = NULL;
    size_t cl = 0, sl = 0, tl = 0;
    snprintf(path, sizeof path, "%s/config.json", dir);
    check(nv_file_read_all(path, &cfg, &cl));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    check(nv_file_read_all(path, &st, &sl));
    nv_buf b = {0};
    if (with_config) {
        add(&b, cfg, cl);
        add(&b, "", 1);
    }
    add(&b, st, sl);
    put_buf("hf", name, &b);
    nv_buf_free(&b);
    if (tok) {
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        check(nv_file_read_all(path, &tj, &tl));
        char tname[128];
        snprintf(tname, sizeof tname, "%.100s.tokenizer.json", name);
        put("tokenizer", tname, tj, tl);
    }
    free(cfg);
    free(st);
    free(tj);
    const char *files[] = {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

static void hf(void) {
    /* fuzz_hf's default config: dim 8, hidden 16, 2 heads of 4, 1 KV head, vocab 16, context 8, tied */
    nv_config c = {8, 16, 1, 2, 1, 4, 16, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    nv_model m;
    check(nv_model_alloc(&m, &c));
    nv_model_init_random(&m, 7);
    hf_seed(&m, NULL, "llama_weights_only.safetensors", 0, NV_HF_F32);
    hf_seed(&m, NULL, "llama.hf", 1, NV_HF_F32);
    hf_seed(&m, NULL, "llama_f16.hf", 1, NV_HF_F16); /* F16 matrices: fp16 plan sources for inference */
    nv_model_free(&m);
    /* Qwen3 (QK-norm, head size 6, an untied classifier) and Qwen2 (biases) */
    nv_config q3 = {8, 16, 1, 2, 1, 6, 16, 8, 1000000.0f, 1e-6f, 0, 1, 0, {0}, 0, NV_CONFIG_PLAIN};
    check(nv_model_alloc(&m, &q3));
    nv_model_init_random(&m, 9);
    hf_seed(&m, NULL, "qwen3.hf", 1, NV_HF_F32);
    hf_seed(&m, NULL, "qwen3_f16.hf", 1, NV_HF_F16); /* its query/key sources reordered too */
    nv_model_free(&m);
    nv_config q2 = {8, 16, 1, 2, 1, 4, 16, 8, 1000000.0f, 1e-6f, 1, 0, 0, {0}, 1, NV_CONFIG_PLAIN};
    check(nv_model_alloc(&m, &q2));
    nv_model_init_random(&m, 10);
    hf_seed(&m, NULL, "qwen2.hf", 1, NV_HF_F32);
    nv_model_free(&m);
    /* Gemma 3 (its config.json block: layer_types, the caps, the norms as w - 1) and SmolLM3
       (no_rope_layers), two layers each */
    nv_config g3 = {8, 16, 2, 2, 1, 4, 16, 8, 1000000.0f, 1e-6f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    nv_config_gemma(&g3, 3);
    g3.swa_window = 4, g3.swa_period = 2, g3.rope_theta_swa = 10000.0f, g3.logit_softcap = 30.0f;
    check(nv_model_alloc(&m, &g3));
    nv_model_init_random(&m, 11);
    hf_seed(&m, NULL, "gemma3.hf", 1, NV_HF_F32);
    nv_model_free(&m);
    nv_config s3 = {8, 16, 2, 2, 1, 4, 16, 8, 1000000.0f, 1e-6f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    s3.nope_period = 2;
    check(nv_model_alloc(&m, &s3));
    nv_model_init_random(&m, 12);
    hf_seed(&m, NULL, "smollm3.hf", 1, NV_HF_F32);
    nv_model_free(&m);
    phi3_seed(0);
    phi3_seed(1);
    nv_config gr = {8, 16, 2, 2, 1, 4, 16, 8, 10000.0f, 1e-6f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    nv_config_set_granite(&gr, 12.0, 0.1, 0.22, 8.0); /* granite: its four multipliers in config.json */
    check(nv_model_alloc(&m, &gr));
    nv_model_init_random(&m, 13);
    hf_seed(&m, NULL, "granite.hf", 1, NV_HF_F32);
    /* mixtures of experts, as transformers writes Mixtral's (F32), Qwen3-MoE's (BF16) and GraniteMoe's
       (F32, its experts fused) */
    for (int layout = MOE_QWEN3; layout <= MOE_GRANITE; layout++) {
        nv_config mc = {8, 16, 1, 2, 1, 4, 16, 8, 10000.0f, 1e-5f, 0, layout == MOE_QWEN3, 0, {0}, 0, NV_CONFIG_PLAIN};
        mc.n_experts = 3;
        mc.n_experts_used = 2;
        if (layout == MOE_GRANITE) nv_config_set_granite(&mc, 12.0, 0.1, 0.22, 8.0);
        nv_model mm;
        check(nv_model_alloc(&mm, &mc));
        nv_model_init_random(&mm, 13);
        char cfg[2048];
        moe_hf_config(&mc, layout, cfg, sizeof cfg);
        nv_buf b = {0};
        add(&b, cfg, strlen(cfg) + 1); /* its NUL: the safetensors follow */
        check(moe_safetensors(&mm, layout, layout == MOE_QWEN3, &b) ? NV_OK : NV_ENOMEM);
        put_buf("hf", layout == MOE_QWEN3 ? "qwen3moe_bf16.hf" : layout == MOE_MIXTRAL ? "mixtral.hf" : "granitemoe.hf", &b);
        nv_buf_free(&b);
        nv_model_free(&mm);
    }
    nv_model_free(&m);
    /* a PEFT adapter of the default config's model (fuzz_hf reads every input as one too) */
    check(nv_model_alloc(&m, &c));
    nv_lora_shape ls = {2, 4.0f, NV_LORA_Q | NV_LORA_K | NV_LORA_DOWN};
    float *lp = malloc(nv_lora_param_count(&c, &ls) * sizeof(float));
    if (!lp) check(nv_fail(NV_ENOMEM, "out of memory"));
    nv_lora_init_nonzero(&c, &ls, lp, 5, 0.1f);
    char adir[4096], apath[4200];
    snprintf(adir, sizeof adir, "%s/peft-tmp", root);
    check(nv_hf_save_lora(&c, &ls, lp, 0.0f, adir));
    char *st = NULL;
    size_t sl = 0;
    snprintf(apath, sizeof apath, "%s/adapter_model.safetensors", adir);
    check(nv_file_read_all(apath, &st, &sl));
    put("hf", "peft_adapter.safetensors", st, sl);
    unlink(apath);
    snprintf(apath, sizeof apath, "%s/adapter_config.json", adir);
    unlink(apath);
    rmdir(adir);
    free(st);
    free(lp);
    nv_model_free(&m);
    /* the byte-level and the byte-fallback tokenizer.json forms, over the tokenizer seeds' vocabularies */
    const char *vocabs[] = {"bpe_qwen2.gguf", "bpe_llama3.gguf", "bytes_and_merges.bin", "bpe_deepseek_coder.gguf"};
    for (size_t i = 0; i < sizeof vocabs / sizeof vocabs[0]; i++) {
        char vp[4200];
        snprintf(vp, sizeof vp, "%s", seed_path("tokenizer", vocabs[i]));
        nv_tokenizer *tok;
        check(nv_tokenizer_load(vp, 0, &tok));
        nv_config t = {8, 16, 1, 2, 1, 4, nv_tokenizer_vocab_size(tok), 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
        check(nv_model_alloc(&m, &t));
        char name[64];
        snprintf(name, sizeof name, "vocab_%zu.hf", i);
        hf_seed(&m, tok, name, 1, NV_HF_F32);
        nv_model_free(&m);
        nv_tokenizer_free(tok);
    }
}

/* ---- tokenizers --------------------------------------------------------------------------------- */

static void add_piece(nv_buf *b, const char *s, size_t len, float score) {
    add(b, &score, 4);
    add_i32(b, (int32_t)len);
    add(b, s, len);
}

static void tokenizers(void) {
    /* <unk>, <s>, </s>, the byte tokens, then merges for a few English words */
    static const char *merges[] = {" ",  "e",  "t",  "o",   "n",   " t",   "he",   " the", "on",   "ce",    " a",
                                   "in", "im", " O", " On", "Onc", " Once", " u",  "up",   " upon", " time", "\xc3\xa9",
                                   "<|", "|>", "im_", "<|im_start|>", "<|im_end|>", "[INST]", "[/INST]"};
    nv_buf b = {0};
    add_i32(&b, 12);
    add_piece(&b, "<unk>", 5, 0);
    add_piece(&b, "\n<s>\n", 5, 0);
    add_piece(&b, "\n</s>\n", 6, 0);
    for (int i = 0; i < 256; i++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", i);
        add_piece(&b, s, 6, 0);
    }
    for (size_t i = 0; i < sizeof merges / sizeof merges[0]; i++)
        add_piece(&b, merges[i], strlen(merges[i]), -(float)i);
    put_buf("tokenizer", "bytes_and_merges.bin", &b);

    /* no byte tokens; an embedded NUL, a duplicate, an empty piece, a long piece */
    b.len = 0;
    add_i32(&b, 4);
    add_piece(&b, "<unk>", 5, 0);
    add_piece(&b, "<s>", 3, 0);
    add_piece(&b, "</s>", 4, 0);
    add_piece(&b, " ", 1, -1);
    add_piece(&b, "a", 1, -2);
    add_piece(&b, "ab\0c", 4, -3);
    add_piece(&b, "a", 1, 5);
    add_piece(&b, "", 0, 1);
    add_piece(&b, " aaaaaaaa", 9, -4);
    add_piece(&b, "<0x41>", 6, -5);
    put_buf("tokenizer", "odd_pieces.bin", &b);
    nv_buf_free(&b);
}

/* ---- training checkpoints ------------------------------------------------------------------------ */

static void ckpts(void) {
    nv_config cs[] = {{8, 16, 1, 2, 1, 4, 16, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN},  /* llama2.c shape */
                      {8, 12, 1, 2, 2, 6, 10, 8, 1e6f, 1e-6f, 0, 1, 0, {0}, 0, NV_CONFIG_PLAIN},     /* Qwen3-like: head_dim 6, QK-norm */
                      {8, 12, 1, 2, 1, 4, 10, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN},  /* a mixture: below */
                      {8, 12, 2, 2, 1, 4, 10, 8, 1e6f, 1e-6f, 1, 1, 0, {0}, 0, NV_CONFIG_PLAIN},      /* Gemma 3's block: below */
                      {8, 12, 2, 2, 1, 4, 10, 8, 1e6f, 1e-6f, 0, NV_QK_NORM_WHOLE, 0, {0}, 0, NV_CONFIG_PLAIN}}; /* OLMo 2's: below */
    cs[2].n_experts = 3, cs[2].n_experts_used = 2;
    cs[2].attn_temp_scale = 0.1f, cs[2].attn_temp_len = 4; /* and Ministral 3's attention temperature (version 12) */
    cs[3].swa_window = 4, cs[3].swa_period = 2, cs[3].rope_theta_swa = 10000.0f, cs[3].ffn_gelu = 1, cs[3].post_norms = 1;
    cs[3].emb_scale = 2.828427f, cs[3].logit_softcap = 30.0f;
    cs[4].post_norms = cs[4].no_pre_norms = 1;
    static const char *const names[] = {"dim8.ckpt", "qk_norm.ckpt", "moe.ckpt", "gemma.ckpt", "olmo2.ckpt"};
    for (int i = 0; i < 5; i++) {
        nv_model m;
        check(nv_model_alloc(&m, &cs[i]));
        nv_model_init_random(&m, 11 + (uint64_t)i);
        nv_ckpt_header h;
        memset(&h, 0, sizeof h);
        nv_ckpt_header_set_config(&h, &cs[i]);
        h.step = 3;
        h.tokens_seen = 96;
        h.data_rng = 12345;
        h.data_windows = 7;
        h.n_params = m.n_params;
        h.batch = 4;
        h.seq = 8;
        h.accum = 1;
        h.seed = 42;
        h.last_loss = 2.5f;
        h.last_val_loss = 2.75f;
        h.best_step = 2, h.best_val_loss = 2.7f, h.evals_since_best = 1, h.budget_steps = i == 3 ? 40 : 0;
        /* adam m and v: the weights scaled, so the three arrays differ */
        float *mo = malloc(m.n_params * 4), *vo = malloc(m.n_params * 4);
        if (!mo || !vo) exit(1);
        for (uint64_t j = 0; j < m.n_params; j++) {
            mo[j] = 0.1f * m.params[j];
            vo[j] = m.params[j] * m.params[j];
        }
        check(nv_ckpt_save(seed_path("ckpt", names[i]), &h, m.params, mo, vo));
        free(mo);
        free(vo);
        nv_model_free(&m);
    }
    /* a LoRA run's: rank 2 adapters on q and down of the first shape (their state is n floats each) */
    const nv_lora_shape ls = {2, 4.0f, NV_LORA_Q | NV_LORA_DOWN};
    const uint64_t n = nv_lora_param_count(&cs[0], &ls);
    float *p = calloc((size_t)(3 * n), sizeof(float));
    if (!p) exit(1);
    nv_lora_init(&cs[0], &ls, p, 5);
    nv_ckpt_header h;
    memset(&h, 0, sizeof h);
    nv_ckpt_header_set_config(&h, &cs[0]);
    h.step = 2, h.n_params = n, h.batch = 4, h.seq = 8, h.accum = 1, h.seed = 42;
    h.lora_rank = ls.rank, h.lora_alpha = ls.alpha, h.lora_targets = ls.targets, h.base_hash = 77;
    h.best_val_loss = NAN; /* no evaluation yet */
    check(nv_ckpt_save(seed_path("ckpt", "lora.ckpt"), &h, p, p + n, p + 2 * n));
    free(p);
}

/* ---- LoRA adapters: for fuzz_model's adapter shape (tests/gguf_write.h's model) ---------------------- */

static void adapters(void) {
    const nv_config c = {GW_DIM, GW_HID, 1, GW_HEADS, GW_KVH, GW_HD, GW_VOCAB, GW_CTX, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    const nv_lora_shape ls = {2, 4.0f, NV_LORA_ALL};
    float *p = calloc((size_t)nv_lora_param_count(&c, &ls), sizeof(float));
    if (!p) exit(1);
    nv_lora_init(&c, &ls, p, 3);
    for (uint64_t i = 0; i < nv_lora_param_count(&c, &ls); i++) p[i] += 0.01f * (float)(i % 7);
    check(nv_gguf_save_lora(&c, &ls, p, seed_path("model", "adapter.gguf")));
    free(p);
}

/* ---- importance matrices (fuzz_model reads every input as one too) ---------------------------------- */

static void imatrices(void) {
    nv_imatrix im = {0};
    nv_imatrix_entry *e;
    check(nv_imatrix_add_entry(&im, "seed", "blk.0.attn_q.weight", 19, 8, 1, &e));
    for (int j = 0; j < 8; j++) e->sum2[j] = 0.5 * j;
    e->count[0] = 16;
    check(nv_imatrix_add_entry(&im, "seed", "output.weight", 13, 4, 1, &e));
    e->count[0] = 0; /* never seen: weighs 1 */
    /* a mixture's stacked expert tensor: three experts, the last never chosen */
    check(nv_imatrix_add_entry(&im, "seed", "blk.0.ffn_up_exps.weight", 24, 4, 3, &e));
    for (int j = 0; j < 8; j++) e->sum2[j] = 0.25 * (j + 1);
    e->count[0] = 5, e->count[1] = 2;
    check(nv_imatrix_add_dataset(&im, "seed.txt", 8));
    im.chunks = 2, im.chunk_size = 8;
    check(nv_imatrix_save(&im, seed_path("model", "imatrix.gguf")));
    nv_imatrix_free(&im);
    /* llama.cpp's .dat: one entry of 2 values over 4 calls, then the last call and the dataset */
    static const uint8_t dat[] = {1, 0, 0, 0, 13, 0, 0, 0, 'o', 'u', 't', 'p', 'u', 't', '.', 'w', 'e', 'i', 'g', 'h', 't',
                                  4, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0x41, 0, 0, 0, 0x40, 4, 0, 0, 0, 3, 0, 0, 0, 'a', 'b', 'c'};
    FILE *f = fopen(seed_path("model", "imatrix.dat"), "wb");
    if (!f || fwrite(dat, 1, sizeof dat, f) != sizeof dat || fclose(f) != 0) exit(1);
}

/* ---- API bodies ------------------------------------------------------------------------------------ */

static void api(void) {
    static const char *bodies[][2] = {
        {"completion.json", "{\"model\":\"stories260K\",\"prompt\":\"Once upon a time\",\"max_tokens\":32,"
                            "\"temperature\":0.8,\"top_p\":0.9,\"seed\":7,\"stop\":[\"\\n\",\"The end\"]}"},
        {"completion_ids.json", "{\"prompt\":[1,403,407,261,378],\"echo\":true,\"stream\":true,"
                                "\"stream_options\":{\"include_usage\":true}}"},
        {"completion_list.json", "{\"prompt\":[\"Lily \\u00e9\\ud83d\\ude00\"],\"n\":1,\"logprobs\":null,"
                                 "\"presence_penalty\":0,\"user\":\"u\",\"suffix\":\"\"}"},
        {"chat.json", "{\"model\":\"stories260K\",\"messages\":[{\"role\":\"system\",\"content\":\"Be kind.\"},"
                      "{\"role\":\"user\",\"content\":\"Hi there\"},{\"role\":\"assistant\",\"content\":\"Hello!\"},"
                      "{\"role\":\"user\",\"content\":\"Tell a story\"}],\"max_completion_tokens\":20}"},
        {"chat_parts.json", "{\"messages\":[{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\"A\"},"
                            "{\"type\":\"text\",\"text\":\"B\"}]},{\"role\":\"user\",\"content\":\"  x  \"},"
                            "{\"role\":\"assistant\",\"content\":null}],\"stop\":\"END\",\"response_format\":"
                            "{\"type\":\"text\"},\"tools\":[],\"logit_bias\":{}}"},
        {"penalties.json", "{\"prompt\":\"Once upon\",\"presence_penalty\":0.5,\"frequency_penalty\":-1.25,"
                           "\"logit_bias\":{\"35\":-100,\"400\":5.5},\"temperature\":0.7,\"top_p\":0.5}"},
        /* both once read before the sampler's top-p scratch (docs/fuzzing.md) */
        {"tiny_top_p.json", "{\"prompt\":\"a\",\"top_p\":0.001}"},
        {"tiny_temperature.json", "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"temperature\":1e-40,"
                                  "\"top_p\":0.5}"},
        {"bad_fields.json", "{\"prompt\":\"a\",\"n\":2,\"top_p\":0,\"max_tokens\":1e9,\"best_of\":3}"},
        /* /tokenize and /detokenize bodies (the harness reads every body as those too) */
        {"tokenize.json", "{\"content\":\"Once upon a time\",\"add_special\":true,\"with_pieces\":true}"},
        {"detokenize.json", "{\"tokens\":[1,403,407,261,378]}"},
        /* structured outputs: schemas compiled into grammars, which the harness then steps */
        {"schema.json", "{\"prompt\":\"a\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\","
                        "\"schema\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},"
                        "\"age\":{\"type\":\"integer\",\"minimum\":-5,\"maximum\":130},\"at\":{\"type\":\"string\",\"format\":"
                        "\"date-time\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",1,null]},\"minItems\":1,"
                        "\"maxItems\":3},\"any\":true,\"n\":{\"type\":[\"number\",\"null\"]}},\"required\":[\"name\"],"
                        "\"additionalProperties\":false}}}}"},
        {"schema_refs.json", "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"json_schema\":{\"$defs\":{\"t\":"
                             "{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"k\":{\"$ref\":\"#/$defs/t\"}}},{\"const\":\"x\"},"
                             "{\"type\":\"string\",\"format\":\"uuid\"}]}},\"$ref\":\"#/$defs/t\"}}"},
        /* tools: rendered by the templates, a call required by a grammar, and a conversation with results */
        {"tools.json", "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"Hi\"},"
                       "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
                       "\"function\":{\"name\":\"play\",\"arguments\":\"{\\\"toy\\\":\\\"car\\\"}\"}}]},{\"role\":\"tool\","
                       "\"tool_call_id\":\"call_1\",\"content\":\"ok\"}],\"tools\":[{\"type\":\"function\",\"function\":"
                       "{\"name\":\"play\",\"description\":\"d\",\"parameters\":{\"type\":\"object\",\"properties\":"
                       "{\"toy\":{\"enum\":[\"ball\",\"car\"]}},\"required\":[\"toy\"]}}}],\"tool_choice\":\"required\","
                       "\"parallel_tool_calls\":false}"},
        {"tool_answer.txt", "Sure.\n<tool_call>\n{\"name\": \"play\", \"arguments\": {\"toy\": \"ball\"}}\n</tool_call>\n"
                            "<tool_call>{\"name\":\"a\",\"arguments\":\"{}\"}</tool_call> {\"name\": \"a\", \"parameters\": {}}"},
        {"tool_answer_granite.txt", "Let me see. <|tool_call|>[{\"name\": \"play\", \"arguments\": {\"toy\": \"ball\"}}, "
                                    "{\"name\":\"a\",\"arguments\":\"{}\"}]"},
        {"pattern.json", "{\"prompt\":\"a\",\"json_schema\":{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"string\","
                         "\"pattern\":\"^(?:[A-Z]\\\\d{2,3}|x[^\\\"\\\\\\\\]+?)*\\\\.(a|b)?$\"},\"q\":{\"type\":\"string\","
                         "\"pattern\":\"\\\\u00e9\\\\s\\\\W.\"}},\"required\":[\"p\",\"q\"]}}"},
        {"json_object.json", "{\"prompt\":\"a\",\"response_format\":{\"type\":\"json_object\"},\"guided_json\":null}"},
        /* Anthropic's /v1/messages (the harness reads every body as one): blocks, tools, a prefill */
        {"messages.json", "{\"model\":\"stories260K\",\"max_tokens\":64,\"system\":[{\"type\":\"text\",\"text\":\"Be kind.\"}],"
                          "\"stop_sequences\":[\"END\"],\"temperature\":0.5,\"top_k\":5,\"thinking\":{\"type\":\"disabled\"},"
                          "\"tools\":[{\"name\":\"play\",\"description\":\"d\",\"input_schema\":{\"type\":\"object\","
                          "\"properties\":{\"toy\":{\"enum\":[\"ball\",\"car\"]}},\"required\":[\"toy\"]}}],\"tool_choice\":"
                          "{\"type\":\"any\",\"disable_parallel_tool_use\":true},\"messages\":[{\"role\":\"user\",\"content\":"
                          "[{\"type\":\"text\",\"text\":\"Hi\"}]},{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\","
                          "\"thinking\":\"t\",\"signature\":\"s\"},{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"play\","
                          "\"input\":{\"toy\":\"car\"}}]},{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
                          "\"tool_use_id\":\"toolu_1\",\"content\":[{\"type\":\"text\",\"text\":\"ok\"}],\"is_error\":false},"
                          "{\"type\":\"text\",\"text\":\"More\"}]}]}"},
        /* OpenAI's /v1/responses: items of every kind, flat tools, a schema */
        {"responses.json", "{\"model\":\"stories260K\",\"instructions\":\"Be kind.\",\"max_output_tokens\":64,\"input\":["
                           "{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"Hi\"}]},{\"type\":\"reasoning\","
                           "\"id\":\"rs_1\",\"summary\":[]},{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"play\","
                           "\"arguments\":\"{}\"},{\"type\":\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"ok\"}],"
                           "\"tools\":[{\"type\":\"function\",\"name\":\"play\",\"parameters\":{\"type\":\"object\",\"properties\":"
                           "{\"toy\":{\"enum\":[\"ball\"]}}}}],\"tool_choice\":{\"type\":\"function\",\"name\":\"play\"},"
                           "\"reasoning\":{\"effort\":\"none\"},\"stream\":true}"},
        {"responses_format.json", "{\"input\":\"Once\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"k\","
                                  "\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}},\"strict\":true}}}"},
        {"messages_prefill.json", "{\"model\":\"stories260K\",\"max_tokens\":100000,\"stream\":true,\"messages\":"
                                  "[{\"role\":\"user\",\"content\":\"Once\"},{\"role\":\"assistant\",\"content\":\"upon a\"}]}"},
        /* Ollama's /api/chat (a call and its answer, options, a schema) and /api/generate (raw; a context) */
        {"ollama_chat.json", "{\"model\":\"stories260K:latest\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},"
                             "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"play\","
                             "\"arguments\":{\"toy\":\"ball\"}}}]},{\"role\":\"tool\",\"content\":\"ok\",\"tool_name\":\"play\"}],"
                             "\"format\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}},\"think\":false,"
                             "\"options\":{\"num_predict\":32,\"temperature\":0.5,\"repeat_penalty\":1.1,\"stop\":[\"\\n\"],\"num_ctx\":4096}}"},
        {"ollama_generate.json", "{\"model\":\"stories260K\",\"prompt\":\"Once upon\",\"raw\":true,\"stream\":false,"
                                 "\"format\":\"json\",\"options\":{\"num_predict\":-1,\"seed\":7,\"top_k\":40}}"},
        {"ollama_context.json", "{\"model\":\"stories260K\",\"system\":\"Tell stories.\",\"prompt\":\"And then?\","
                                "\"context\":[1,403,407,261,378],\"think\":false}"},
        /* /v1/rerank, /v2/rerank and /v1/score (every body is parsed as each), a message's name and reasoning */
        {"rerank.json", "{\"model\":\"stories260K\",\"query\":\"Who was sad?\",\"documents\":[\"Tom was sad.\",{\"text\":\"A dog.\"}],"
                        "\"top_n\":1,\"return_documents\":true,\"max_tokens_per_doc\":3}"},
        {"score.json", "{\"text_1\":[\"q\"],\"text_2\":[\"a\",\"b\"]}"},
        {"rerank_tei.json", "{\"query\":\"q\",\"texts\":[\"a\",\"b\"],\"return_text\":true,\"raw_scores\":false}"},
        {"chat_reasoning.json", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"name\":\"ann\"},{\"role\":\"assistant\","
                                "\"content\":\"y\",\"reasoning_content\":\"hmm\"},{\"role\":\"user\",\"content\":\"z\"}],"
                                "\"add_generation_prompt\":false}"},
        /* reasoning (format, budget, effort) and vLLM's token filters */
        {"chat_think_budget.json", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_format\":\"deepseek\","
                                   "\"thinking_token_budget\":3,\"reasoning_effort\":\"high\",\"response_format\":{\"type\":\"json_object\"}}"},
        {"token_filters.json", "{\"prompt\":\"Once\",\"max_tokens\":4,\"allowed_token_ids\":[300,301],\"bad_words\":[\"girl\",\" a b\"],"
                               "\"logprobs\":1,\"return_tokens_as_token_ids\":true,\"stop_token_ids\":[2,13],\"include_stop_str_in_output\":true,"
                               "\"skip_special_tokens\":false,\"truncate_prompt_tokens\":2,\"priority\":-3}"},
        /* tools whose calls the Jinja pass holds to the XML form: strings as they are, a pattern, lengths, a
           reference, a number, an object; an answer that is such a call, read back by the XML parser */
        {"tools_xml.json", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\",\"tools\":["
                           "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
                           "\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":8},\"code\":{\"$ref\":\"#/$defs/c\"},"
                           "\"days\":{\"type\":\"integer\",\"minimum\":1},\"o\":{\"type\":\"object\"},\"n\":{\"type\":[\"string\",\"null\"]}},"
                           "\"required\":[\"city\"],\"$defs\":{\"c\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}$\"}}}}}],"
                           "\"content\":\"<tool_call>\\n<function=get_weather>\\n<parameter=city>\\nOslo\\n</parameter>\\n"
                           "<parameter=days>\\n3\\n</parameter>\\n</function>\\n</tool_call>\"}"},
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++)
        put("api", bodies[i][0], bodies[i][1], strlen(bodies[i][1]));
}

/* nerve train's chat data: conversations with a system message, two answers (one of weight 0),
   text parts, tools with a call and its result; one that is cut short; preference pairs;
   prompt/completion lines; {"text"} lines */
static void chat(void) {
    static const char *const files[][2] = {
        {"two_turns.jsonl",
         "{\"messages\":[{\"role\":\"system\",\"content\":\"Be kind.\"},{\"role\":\"user\",\"content\":\"Hi\"},"
         "{\"role\":\"assistant\",\"content\":\"Hello.\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\","
         "\"text\":\"Why?\"}]},{\"role\":\"assistant\",\"content\":\"Because.\",\"weight\":1}]}\n"
         "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"b\",\"weight\":0},"
         "{\"role\":\"user\",\"content\":\"c\"},{\"role\":\"assistant\",\"content\":\"d\"}]}\n"},
        {"tools.jsonl",
         "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"play\",\"parameters\":{\"type\":\"object\"}}}],"
         "\"messages\":[{\"role\":\"user\",\"content\":\"Play?\"},{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\","
         "\"type\":\"function\",\"function\":{\"name\":\"play\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\","
         "\"content\":\"ok\"},{\"role\":\"assistant\",\"content\":\"Done.\"}]}\r\n"},
        {"five.jsonl", /* enough conversations that the split holds some out */
         "{\"messages\":[{\"role\":\"user\",\"content\":\"1\"},{\"role\":\"assistant\",\"content\":\"one\"}]}\n"
         "{\"messages\":[{\"role\":\"user\",\"content\":\"2\"},{\"role\":\"assistant\",\"content\":\"two\"}]}\n"
         "{\"messages\":[{\"role\":\"user\",\"content\":\"3\"},{\"role\":\"assistant\",\"content\":\"\"}]}\n"
         "{\"messages\":[{\"role\":\"user\",\"content\":\"4\"},{\"role\":\"assistant\",\"content\":\"four\"}]}\n"
         "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"assistant\",\"content\":\"five\"}]}\n"},
        {"cut.jsonl", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"y\"}]}\n"
                      "{\"messages\":[{\"role\":\"user\""},        {"pref_openai.jsonl", /* preference pairs, OpenAI's format: tools, a call as the preferred answer */
         "{\"input\": {\"messages\": [{\"role\": \"system\", \"content\": \"Be kind.\"}, {\"role\": \"user\", \"content\": \"Hi\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}]}, \"preferred_output\": [{\"role\": \"assistant\", \"content\": \"Hello.\"}], \"non_preferred_output\": [{\"role\": \"assistant\", \"content\": \"Go.\"}]}\n"
         "{\"input\": {\"messages\": [{\"role\": \"user\", \"content\": \"Rain?\"}]}, \"preferred_output\": [{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}]}], \"non_preferred_output\": [{\"role\": \"assistant\", \"content\": \"No idea.\"}]}\n"},
        {"pref_trl.jsonl", /* TRL's: strings, messages, two conversations */
         "{\"prompt\": \"Q\", \"chosen\": \"Yes.\", \"rejected\": \"No.\"}\n"
         "{\"prompt\": [{\"role\": \"user\", \"content\": \"Q\"}], \"chosen\": [{\"role\": \"assistant\", \"content\": \"Yes.\"}], \"rejected\": \"No.\"}\n"
         "{\"chosen\": [{\"role\": \"user\", \"content\": \"Q\"}, {\"role\": \"assistant\", \"content\": \"Yes.\"}], \"rejected\": [{\"role\": \"user\", \"content\": \"Q\"}, {\"role\": \"assistant\", \"content\": \"No.\"}]}\n"},
        {"prompt_completion.jsonl", /* TRL's prompt-completion: strings, and message lists */
         "{\"prompt\": \"Q: Where?\\nA:\", \"completion\": \" Home.\"}\n"
         "{\"prompt\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello\"}, {\"role\": \"user\", \"content\": \"Bye\"}], \"completion\": [{\"role\": \"assistant\", \"content\": \"See you.\"}]}\n"},
        {"text_lines.jsonl", "{\"text\": \"Once upon a time.\\nThe end.\", \"id\": 1}\n{\"text\": \"A cat sat.\"}\n"},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) put("chat", files[i][0], files[i][1], strlen(files[i][1]));
}

/* multiple-choice tasks: llama.cpp's HellaSwag text, and JSON Lines under each of the field names */
static void choice(void) {
    static const char *const files[][2] = {
        {"hellaswag.txt", "Tim went to the park. He saw a dog.\n1\nThe sky fell.\nThe dog ran to him.\nHe ate a car.\nSoup.\n"
                          "Sue had a red ball.\n0\nShe threw it high.\nThe moon sang.\nIt was Tuesday\n \n"},
        {"choices.jsonl",
         "{\"activity_label\":\"Park\",\"ctx\":\"Tim went out.\",\"endings\":[\"He ran.\",\"Blue.\"],\"label\":\"0\"}\n"
         "{\"question\":\"What is red?\",\"choices\":[\"a ball\",\"the sky\",\"grass\"],\"answer\":\"A\"}\n"
         "{\"prompt\":\"Once upon a time\",\"options\":[\" there was a cat.\",\" the end\"],\"gold\":0}\n"},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) put("choice", files[i][0], files[i][1], strlen(files[i][1]));
}

/* nerve batch's files: an input of each endpoint (a body with a number cJSON would print otherwise, an
 * escaped "body" key, a CRLF line, a blank one), one with bad lines, and an output to resume from */
static void batch(void) {
    static const char *const files[][2] = {
        {"input.jsonl",
         "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"m\","
         "\"messages\":[{\"role\":\"user\",\"content\":\"Hi {\\\"x\\\"}\"}],\"seed\":18446744073709551615}}\n"
         "{\"custom_id\":\"b\",\"method\":\"POST\",\"url\":\"/completions\",\"body\":{\"prompt\":[1,2,3],\"max_tokens\":4}}\r\n"
         "\n"
         "{\"custom_id\":\"c\",\"method\":\"POST\",\"url\":\"/v1/embeddings\",\"\\u0062ody\":{\"input\":\"x\"}}\n"
         "{ \"body\" : {\"input\":\"y\",\"max_output_tokens\":2.50e1} , \"custom_id\":\"d\",\"url\":\"/v1/responses\",\"method\":\"POST\"}\n"},
        {"bad.jsonl",
         "{\"custom_id\":\"a\",\"method\":\"GET\",\"url\":\"/v1/completions\",\"body\":{}}\nnot json\n"
         "{\"custom_id\":\"b\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"stream\":true}}\n"
         "{\"custom_id\":\"c\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}} tail\n"
         "{\"custom_id\":\"c\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}}\n"
         "{\"custom_id\":\"c\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}}\n"},
        {"anthropic.jsonl",
         "{\"custom_id\":\"m\",\"params\":{\"model\":\"x\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}}\n"
         "{\"custom_id\":\"m\",\"result\":{\"type\":\"succeeded\",\"message\":{}}}\n"
         "{\"custom_id\":\"n\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}}\n"},
        {"output.jsonl",
         "{\"custom_id\":\"x\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}}\n"
         "{\"id\":\"batch_req_1\",\"custom_id\":\"x\",\"response\":{\"status_code\":200,\"request_id\":\"r\",\"body\":{}},\"error\":null}\n"
         "{\"id\":\"batch_req_2\",\"custom_id\":\"x\",\"response\":null,\"error\":{\"code\":\"request_failed\",\"message\":\"m\"}}\n"},
        {"multipart.txt", /* an upload's body (boundary XyZb): near misses, the end, an epilogue */
         "--XyZb\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--XyZb\r\nContent-Disposition: form-data; "
         "name=\"file\"; filename=\"f\"\r\n\r\n{\"a\":1} --XyZb- -XyZb-- --XyZ--\r\n--XyZb--\r\n\r\nepilogue --XyZb--"},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) put("batch", files[i][0], files[i][1], strlen(files[i][1]));
}

/* grammars as text: the first byte picks GBNF (0), a regex (1) or choices (2), +128 a think block */
static void gbnf(void) {
    static const char *const files[][2] = {
        {"expr.gbnf", "\000root ::= expr\nexpr ::= term ([-+*/] term)*  # ops\nterm ::= [0-9]+ | \"(\" expr \")\"\n"},
        {"classes.gbnf", "\000root ::= [^\"\\\\\\n]{1,3} (\n  \"\\u00e9\" | [\xce\xb1-\xcf\x89] |\n .)? \"!\"*\n"},
        {"think.gbnf", "\200root ::= \"yes\" | \"no\"\n"},
        {"phone.re", "\001[0-9]{3}-[0-9]{4}"},
        {"alt.re", "\001^(ab|a)(?:c|bcd)?\\d*[^x-z]$"},
        {"colors.txt", "\002red\ngreen\ngreenish\n"},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) put("gbnf", files[i][0], files[i][1], 1 + strlen(files[i][1] + 1));
}

/* chat templates: nerve's own Jinja forms (what a GGUF file or a folder carries), and the language's corners */
static void jinja(void) {
    char name[64];
    for (int t = NV_CHAT_PLAIN; t <= NV_CHAT_SMOLLM3; t++) {
        snprintf(name, sizeof name, "%s.jinja", nv_chat_template_name((nv_chat_template)t));
        const char *text = nv_chat_template_jinja((nv_chat_template)t);
        put("jinja", name, text, strlen(text));
    }
    static const char *const files[][2] = {
        {"macro.jinja", "{% macro m(a, b='x') %}{{ a ~ b }}{% endmacro %}{% for k, v in {'p': 1}.items() %}{{ m(k, b=v) }}{% endfor %}"},
        {"loop.jinja", "{%- for m in messages if m.role != 'system' -%}\n  {{ loop.index }}{{ m.content[1:] | trim | upper }}"
                       "{% if loop.last %}{% break %}{% endif %}\n{%- else %}none{% endfor %}{# c #}{% raw %}{{ x }}{% endraw %}"},
        {"filters.jinja", "{{ tools | tojson(indent=2) }}{{ messages | map(attribute='role') | unique | sort | join(',') }}"
                          "{{ messages[2].tool_calls | selectattr('id', 'defined') | list | length }}{{ (n ** 3) // 2 % 5 }}"
                          "{{ ns }}{% set ns = namespace(x=[1, 2][::-1]) %}{{ ns.x | string }}{{ raise_exception('no') if n > 9 }}"},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) put("jinja", files[i][0], files[i][1], strlen(files[i][1]));
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: gen_seeds DIR\n");
        return 2;
    }
    root = argv[1];
    models();
    tokenizers();
    hf();
    ckpts();
    adapters();
    imatrices();
    batch();
    api();
    chat();
    choice();
    gbnf();
    jinja();
    return 0;
}
