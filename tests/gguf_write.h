/* A synthetic GGUF model for tests and fuzz seeds: architecture `arch`, version 2 or 3 (64-bit
 * counts), dim 32, 1 layer, 2 heads of 16 with 1 KV head, hidden 32, 8 tokens, context 16, its
 * tensors in every type the loader converts (F32, F16, BF16, Q8_0) holding gw_value(k, i), which
 * each type stores exactly; with vocab, a SentencePiece vocabulary of 8 pieces. */
#ifndef NV_TEST_GGUF_WRITE_H
#define NV_TEST_GGUF_WRITE_H

#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"

static void gw_u32(nv_buf *w, uint32_t v) { nv_buf_append(w, &v, 4); }
static void gw_u64(nv_buf *w, uint64_t v) { nv_buf_append(w, &v, 8); }
static void gw_str(nv_buf *w, const char *s) {
    gw_u64(w, strlen(s));
    nv_buf_append(w, s, strlen(s));
}
static void gw_kv_u32(nv_buf *w, const char *k, uint32_t v) {
    gw_str(w, k);
    gw_u32(w, 4);
    gw_u32(w, v);
}

enum { GW_DIM = 32, GW_HID = 32, GW_HEADS = 2, GW_KVH = 1, GW_HD = 16, GW_VOCAB = 8, GW_CTX = 16 };
typedef struct {
    const char *name;
    uint32_t type;
    uint64_t d0, d1;
} gw_tensor;
static const gw_tensor gw_tensors[] = {
    {"token_embd.weight", 0, GW_DIM, GW_VOCAB},       {"output_norm.weight", 0, GW_DIM, 1},       {"blk.0.attn_norm.weight", 0, GW_DIM, 1},
    {"blk.0.attn_q.weight", 1, GW_DIM, GW_HEADS * GW_HD}, {"blk.0.attn_k.weight", 30, GW_DIM, GW_KVH * GW_HD}, {"blk.0.attn_v.weight", 8, GW_DIM, GW_KVH * GW_HD},
    {"blk.0.attn_output.weight", 0, GW_HEADS * GW_HD, GW_DIM}, {"blk.0.ffn_norm.weight", 0, GW_DIM, 1}, {"blk.0.ffn_gate.weight", 8, GW_DIM, GW_HID},
    {"blk.0.ffn_down.weight", 1, GW_HID, GW_DIM},      {"blk.0.ffn_up.weight", 0, GW_DIM, GW_HID}};
#define GW_NT (sizeof gw_tensors / sizeof gw_tensors[0])

static uint64_t gw_bytes(const gw_tensor *t) {
    uint64_t n = t->d0 * t->d1;
    return t->type == 0 ? 4 * n : t->type == 8 ? n / 32 * 34 : 2 * n;
}

/* value i of tensor k: small exact numbers so every type holds them exactly (Q8_0: scale 1/64) */
static float gw_value(int k, uint64_t i) { return (float)((int)((i * 7 + (uint64_t)k * 13) % 127) - 63) / 64.0f; }

/* Tests may set this: a linear RoPE scaling factor written as llama.rope.scaling.{type,factor}. */
static float gw_rope_scale;

/* chat_template: tokenizer.chat_template's text (needs vocab), or NULL for none */
static size_t gguf_write_model_ex(const char *path, const char *arch, uint32_t version, int vocab, const char *chat_template) {
    nv_buf w = {0};
    nv_buf_append(&w, "GGUF", 4);
    gw_u32(&w, version);
    gw_u64(&w, GW_NT);
    gw_u64(&w, (vocab ? (chat_template ? 12 : 11) : 8) + (gw_rope_scale != 0.0f ? 2 : 0));
    if (gw_rope_scale != 0.0f) {
        gw_str(&w, "llama.rope.scaling.type");
        gw_u32(&w, 8);
        gw_str(&w, "linear");
        gw_str(&w, "llama.rope.scaling.factor");
        gw_u32(&w, 6);
        nv_buf_append(&w, &gw_rope_scale, 4);
    }
    gw_str(&w, "general.architecture");
    gw_u32(&w, 8);
    gw_str(&w, arch);
    gw_kv_u32(&w, "llama.embedding_length", GW_DIM);
    gw_kv_u32(&w, "llama.feed_forward_length", GW_HID);
    gw_kv_u32(&w, "llama.block_count", 1);
    gw_kv_u32(&w, "llama.attention.head_count", GW_HEADS);
    gw_kv_u32(&w, "llama.attention.head_count_kv", GW_KVH);
    gw_kv_u32(&w, "llama.context_length", GW_CTX);
    if (vocab) { /* a SentencePiece vocabulary: <unk> <s> </s>, pieces with U+2581 for spaces */
        static const char *pieces[GW_VOCAB] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81" "a", "a", "\xe2\x96\x81" "ab", "b", "\xe2\x96\x81"};
        gw_str(&w, "tokenizer.ggml.model");
        gw_u32(&w, 8);
        gw_str(&w, "llama");
        gw_str(&w, "tokenizer.ggml.tokens");
        gw_u32(&w, 9);
        gw_u32(&w, 8);
        gw_u64(&w, GW_VOCAB);
        for (int i = 0; i < GW_VOCAB; i++) gw_str(&w, pieces[i]);
        if (chat_template) {
            gw_str(&w, "tokenizer.chat_template");
            gw_u32(&w, 8);
            gw_str(&w, chat_template);
        }
        gw_str(&w, "tokenizer.ggml.scores");
        gw_u32(&w, 9);
        gw_u32(&w, 6);
        gw_u64(&w, GW_VOCAB);
        for (int i = 0; i < GW_VOCAB; i++) {
            float sc = -0.5f * (float)i + 1.0f;
            nv_buf_append(&w, &sc, 4);
        }
    }
    gw_str(&w, "llama.attention.layer_norm_rms_epsilon");
    gw_u32(&w, 6);
    float eps = 1e-6f;
    nv_buf_append(&w, &eps, 4);
    uint64_t off = 0;
    for (size_t k = 0; k < GW_NT; k++) {
        gw_str(&w, gw_tensors[k].name);
        gw_u32(&w, gw_tensors[k].d1 == 1 ? 1 : 2);
        gw_u64(&w, gw_tensors[k].d0);
        if (gw_tensors[k].d1 != 1) gw_u64(&w, gw_tensors[k].d1);
        gw_u32(&w, gw_tensors[k].type);
        gw_u64(&w, off);
        off += (gw_bytes(&gw_tensors[k]) + 31) / 32 * 32;
    }
    while (w.len % 32) nv_buf_append(&w, "", 1);
    for (size_t k = 0; k < GW_NT; k++) {
        const gw_tensor *t = &gw_tensors[k];
        uint64_t n = t->d0 * t->d1;
        for (uint64_t i = 0; i < n; i++) {
            float v = gw_value((int)k, i);
            if (t->type == 0) nv_buf_append(&w, &v, 4);
            else if (t->type == 1) {
                uint16_t hbits = _cvtss_sh(v, 0);
                nv_buf_append(&w, &hbits, 2);
            } else if (t->type == 30) {
                uint32_t u;
                memcpy(&u, &v, 4);
                uint16_t hbits = (uint16_t)(u >> 16);
                nv_buf_append(&w, &hbits, 2);
            } else if (i % 32 == 0) {
                uint16_t scale = _cvtss_sh(1.0f / 64.0f, 0);
                nv_buf_append(&w, &scale, 2);
                for (int j = 0; j < 32; j++) {
                    int8_t q = (int8_t)(gw_value((int)k, i + (uint64_t)j) * 64.0f);
                    nv_buf_append(&w, &q, 1);
                }
            }
        }
        while (w.len % 32) nv_buf_append(&w, "", 1);
    }
    FILE *f = fopen(path, "wb");
    fwrite(w.data, 1, w.len, f);
    fclose(f);
    size_t n = w.len;
    nv_buf_free(&w);
    return n;
}

static size_t gguf_write_model(const char *path, const char *arch, uint32_t version, int vocab) {
    return gguf_write_model_ex(path, arch, version, vocab, NULL);
}

#endif
