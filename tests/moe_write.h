/* A mixture of experts written as transformers saves one (tests and fuzz seeds): Mixtral's,
 * Qwen3-MoE's or GraniteMoe's tensor names, query and key rows in transformers' order, F32 or BF16,
 * and the config.json that goes with them. */
#ifndef NV_TEST_MOE_WRITE_H
#define NV_TEST_MOE_WRITE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/half.h"
#include "model/gguf.h"
#include "model/model.h"

/* How the experts are kept: Qwen3-MoE's mlp.experts.E.gate_proj/down_proj/up_proj, Mixtral's
 * block_sparse_moe.experts.E.w1/w2/w3, GraniteMoe's fused block_sparse_moe.input_linear [E, 2 hidden,
 * dim] (each expert's gate rows, then its up rows), output_linear [E, dim, hidden], router.layer. */
enum { MOE_QWEN3 = 0, MOE_MIXTRAL = 1, MOE_GRANITE = 2 };

/* The model's safetensors bytes into *out, its experts kept as layout says; 0 on failure. */
static int moe_safetensors(const nv_model *m, int layout, int bf16, nv_buf *out) {
    const nv_config *c = &m->config;
    nv_model view;
    float *copy;
    if (nv_model_half_view(m, &view, &copy) != NV_OK) return 0;
    const nv_weights *w = &view.w;
    const size_t d = (size_t)c->dim, h = (size_t)c->hidden_dim, q = (size_t)nv_config_q_dim(c), kv = (size_t)nv_config_kv_dim(c),
                 E = (size_t)c->n_experts, hd = (size_t)c->head_dim;
    enum { MAX = 512 };
    static char names[MAX][128];
    size_t rows[MAX], cols[MAX], stack[MAX];
    const float *data[MAX];
    float *fused[64]; /* GraniteMoe's input_linear of each layer */
    int n = 0, n_fused = 0;
    const int mixtral = layout != MOE_QWEN3;
#define ADD3(st, r, cl, ptr, ...) \
    if (n < MAX) snprintf(names[n], sizeof names[n], __VA_ARGS__), stack[n] = (st), rows[n] = (r), cols[n] = (cl), data[n++] = (ptr)
#define ADD(r, cl, ptr, ...) ADD3(0, r, cl, ptr, __VA_ARGS__)
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
        if (layout == MOE_GRANITE) {
            float *in = n_fused < 64 ? malloc(E * 2 * h * d * sizeof *in) : NULL;
            if (!in) break;
            fused[n_fused++] = in;
            for (size_t e = 0; e < E; e++) {
                memcpy(in + e * 2 * h * d, w->w1 + ((size_t)l * E + e) * h * d, h * d * sizeof *in);
                memcpy(in + (e * 2 + 1) * h * d, w->w3 + ((size_t)l * E + e) * h * d, h * d * sizeof *in);
            }
            ADD(E, d, w->router + l * E * d, "model.layers.%d.block_sparse_moe.router.layer.weight", l);
            ADD3(E, 2 * h, d, in, "model.layers.%d.block_sparse_moe.input_linear.weight", l);
            ADD3(E, d, h, w->w2 + (size_t)l * E * h * d, "model.layers.%d.block_sparse_moe.output_linear.weight", l);
            continue;
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
#undef ADD3
    nv_buf hdr = {0}, body = {0};
    nv_buf_append(&hdr, "{", 1);
    for (int i = 0; i < n; i++) {
        const size_t count = (stack[i] ? stack[i] : 1) * (rows[i] ? rows[i] : 1) * cols[i], bytes = count * (bf16 ? 2 : 4);
        char shape[64], entry[400];
        if (stack[i]) snprintf(shape, sizeof shape, "[%zu, %zu, %zu]", stack[i], rows[i], cols[i]);
        else if (rows[i]) snprintf(shape, sizeof shape, "[%zu, %zu]", rows[i], cols[i]);
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
    const int ok = !hdr.oom && !body.oom && !out->oom && n < MAX && (layout != MOE_GRANITE || n_fused == c->n_layers);
    nv_buf_free(&hdr);
    nv_buf_free(&body);
    for (int i = 0; i < n_fused; i++) free(fused[i]);
    free(copy);
    return ok;
}

/* Its config.json (the experts' weights renormalised, every layer a mixture; GraniteMoe's four
 * multipliers). */
static void moe_hf_config(const nv_config *c, int layout, char *out, size_t cap) {
    const int mixtral = layout != MOE_QWEN3;
    char extra[512];
    if (layout == MOE_GRANITE)
        snprintf(extra, sizeof extra,
                 ", \"embedding_multiplier\": %.9g, \"attention_multiplier\": %.17g, \"residual_multiplier\": %.9g, "
                 "\"logits_scaling\": %.9g",
                 (double)nv_config_emb_scale(c), 1.0 / (double)nv_config_attn_div(c), (double)nv_config_residual_scale(c),
                 (double)nv_config_logit_div(c));
    else
        snprintf(extra, sizeof extra, "%s",
                 mixtral ? ", \"sliding_window\": null" : ", \"norm_topk_prob\": true, \"decoder_sparse_step\": 1, \"mlp_only_layers\": []");
    snprintf(out, cap,
             "{\"model_type\": \"%s\", \"hidden_size\": %d, \"%s\": %d, \"num_hidden_layers\": %d, "
             "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, \"vocab_size\": %d, "
             "\"max_position_embeddings\": %d, \"rms_norm_eps\": %g, \"rope_theta\": %g, \"%s\": %d, "
             "\"num_experts_per_tok\": %d, \"tie_word_embeddings\": %s, \"hidden_act\": \"silu\"%s}",
             layout == MOE_GRANITE ? "granitemoe" : mixtral ? "mixtral" : "qwen3_moe", c->dim,
             mixtral ? "intermediate_size" : "moe_intermediate_size", c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads,
             c->head_dim, c->vocab_size, c->seq_len, (double)c->norm_eps, (double)c->rope_theta,
             mixtral ? "num_local_experts" : "num_experts", c->n_experts, c->n_experts_used, c->shared_classifier ? "true" : "false",
             extra);
}

#endif
