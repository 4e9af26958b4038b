/* A mixture of experts written as transformers saves one (tests and fuzz seeds): Mixtral's or
 * Qwen3-MoE's tensor names, query and key rows in transformers' order, F32 or BF16, and the
 * config.json that goes with them. */
#ifndef NV_TEST_MOE_WRITE_H
#define NV_TEST_MOE_WRITE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/half.h"
#include "model/gguf.h"
#include "model/model.h"

/* The model's safetensors bytes into *out (Mixtral's experts as block_sparse_moe.experts.E.w1/w2/w3,
 * Qwen3-MoE's as mlp.experts.E.gate_proj/down_proj/up_proj); 0 on failure. */
static int moe_safetensors(const nv_model *m, int mixtral, int bf16, nv_buf *out) {
    const nv_config *c = &m->config;
    nv_model view;
    float *copy;
    if (nv_model_half_view(m, &view, &copy) != NV_OK) return 0;
    const nv_weights *w = &view.w;
    const size_t d = (size_t)c->dim, h = (size_t)c->hidden_dim, q = (size_t)nv_config_q_dim(c), kv = (size_t)nv_config_kv_dim(c),
                 E = (size_t)c->n_experts, hd = (size_t)c->head_dim;
    enum { MAX = 512 };
    static char names[MAX][128];
    size_t rows[MAX], cols[MAX];
    const float *data[MAX];
    int n = 0;
#define ADD(r, cl, ptr, ...) \
    if (n < MAX) snprintf(names[n], sizeof names[n], __VA_ARGS__), rows[n] = (r), cols[n] = (cl), data[n++] = (ptr)
    ADD(c->vocab_size, d, w->tok_emb, "model.embed_tokens.weight");
    if (!c->shared_classifier) ADD(c->vocab_size, d, w->wcls, "lm_head.weight");
    ADD(0, d, w->rms_final, "model.norm.weight");
    const char *moe = mixtral ? "block_sparse_moe" : "mlp";
    for (int l = 0; l < c->n_layers; l++) {
        ADD(0, d, w->rms_att + l * d, "model.layers.%d.input_layernorm.weight", l);
        ADD(0, d, w->rms_ffn + l * d, "model.layers.%d.post_attention_layernorm.weight", l);
        ADD(q, d, w->wq + l * q * d, "model.layers.%d.self_attn.q_proj.weight", l);
        ADD(kv, d, w->wk + l * kv * d, "model.layers.%d.self_attn.k_proj.weight", l);
        ADD(kv, d, w->wv + l * kv * d, "model.layers.%d.self_attn.v_proj.weight", l);
        ADD(d, q, w->wo + l * d * q, "model.layers.%d.self_attn.o_proj.weight", l);
        if (c->qk_norm) {
            ADD(0, hd, w->q_norm + l * hd, "model.layers.%d.self_attn.q_norm.weight", l);
            ADD(0, hd, w->k_norm + l * hd, "model.layers.%d.self_attn.k_norm.weight", l);
        }
        ADD(E, d, w->router + l * E * d, "model.layers.%d.%s.gate.weight", l, moe);
        for (size_t e = 0; e < E; e++) {
            const size_t at = ((size_t)l * E + e) * h * d;
            ADD(h, d, w->w1 + at, "model.layers.%d.%s.experts.%zu.%s.weight", l, moe, e, mixtral ? "w1" : "gate_proj");
            ADD(d, h, w->w2 + at, "model.layers.%d.%s.experts.%zu.%s.weight", l, moe, e, mixtral ? "w2" : "down_proj");
            ADD(h, d, w->w3 + at, "model.layers.%d.%s.experts.%zu.%s.weight", l, moe, e, mixtral ? "w3" : "up_proj");
        }
    }
#undef ADD
    nv_buf hdr = {0}, body = {0};
    nv_buf_append(&hdr, "{", 1);
    for (int i = 0; i < n; i++) {
        const size_t count = (rows[i] ? rows[i] : 1) * cols[i], bytes = count * (bf16 ? 2 : 4);
        char shape[64], entry[400];
        if (rows[i]) snprintf(shape, sizeof shape, "[%zu, %zu]", rows[i], cols[i]);
        else snprintf(shape, sizeof shape, "[%zu]", cols[i]);
        snprintf(entry, sizeof entry, "%s\"%s\": {\"dtype\": \"%s\", \"shape\": %s, \"data_offsets\": [%zu, %zu]}", i ? ", " : "",
                 names[i], bf16 ? "BF16" : "F32", shape, body.len, body.len + bytes);
        nv_buf_append(&hdr, entry, strlen(entry));
        for (size_t j = 0; j < count; j++) {
            const uint16_t b = nv_bf16_from_f32(data[i][j]);
            nv_buf_append(&body, bf16 ? (const void *)&b : (const void *)&data[i][j], bf16 ? 2 : 4);
        }
    }
    nv_buf_append(&hdr, "}", 1);
    const uint64_t hl = hdr.len;
    nv_buf_append(out, &hl, 8);
    nv_buf_append(out, hdr.data, hdr.len);
    nv_buf_append(out, body.data, body.len);
    const int ok = !hdr.oom && !body.oom && !out->oom && n < MAX;
    nv_buf_free(&hdr);
    nv_buf_free(&body);
    free(copy);
    return ok;
}

/* Its config.json (the experts' weights renormalised, every layer a mixture). */
static void moe_hf_config(const nv_config *c, int mixtral, char *out, size_t cap) {
    snprintf(out, cap,
             "{\"model_type\": \"%s\", \"hidden_size\": %d, \"%s\": %d, \"num_hidden_layers\": %d, "
             "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, \"vocab_size\": %d, "
             "\"max_position_embeddings\": %d, \"rms_norm_eps\": %g, \"rope_theta\": %g, \"%s\": %d, "
             "\"num_experts_per_tok\": %d, \"tie_word_embeddings\": %s, \"hidden_act\": \"silu\"%s}",
             mixtral ? "mixtral" : "qwen3_moe", c->dim, mixtral ? "intermediate_size" : "moe_intermediate_size", c->hidden_dim,
             c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, c->vocab_size, c->seq_len, (double)c->norm_eps,
             (double)c->rope_theta, mixtral ? "num_local_experts" : "num_experts", c->n_experts, c->n_experts_used,
             c->shared_classifier ? "true" : "false",
             mixtral ? ", \"sliding_window\": null" : ", \"norm_topk_prob\": true, \"decoder_sparse_step\": 1, \"mlp_only_layers\": []");
}

#endif
