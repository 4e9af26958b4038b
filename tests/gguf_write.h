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
#include "model/config.h"
#include "model/gguf.h"
#include "model/model.h"

static inline void gw_u32(nv_buf *w, uint32_t v) { nv_buf_append(w, &v, 4); }
static inline void gw_u64(nv_buf *w, uint64_t v) { nv_buf_append(w, &v, 8); }
static inline void gw_str(nv_buf *w, const char *s) {
    gw_u64(w, strlen(s));
    nv_buf_append(w, s, strlen(s));
}
static inline void gw_kv_u32(nv_buf *w, const char *k, uint32_t v) {
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

static inline uint64_t gw_bytes(const gw_tensor *t) {
    uint64_t n = t->d0 * t->d1;
    return t->type == 0 ? 4 * n : t->type == 8 ? n / 32 * 34 : 2 * n;
}

/* value i of tensor k: small exact numbers so every type holds them exactly (Q8_0: scale 1/64) */
static inline float gw_value(int k, uint64_t i) { return (float)((int)((i * 7 + (uint64_t)k * 13) % 127) - 63) / 64.0f; }

/* Tests may set this: a linear RoPE scaling factor written as llama.rope.scaling.{type,factor}. */
static float gw_rope_scale;
/* with a vocabulary: tokenizer.chat_template.rerank's text too (llama.cpp's named template), NULL: none */
static const char *gw_rerank_template;
/* a reranker's classification head too (cls.output.weight, F32): gw_cls_rows rows (up to 3), row r the token
 * embedding's row gw_cls_tokens[r] (Qwen3-Reranker's yes and no rows of a tied classifier); 0: none */
static int gw_cls_rows, gw_cls_tokens[3];
/* and with gw_cls_biased, cls.output.bias (F32): row r's bias r == 0 ? 1 : 0 */
static int gw_cls_biased;

/* chat_template: tokenizer.chat_template's text (needs vocab), or NULL for none */
static inline size_t gguf_write_model_ex(const char *path, const char *arch, uint32_t version, int vocab, const char *chat_template) {
    nv_buf w = {0};
    nv_buf_append(&w, "GGUF", 4);
    gw_u32(&w, version);
    gw_u64(&w, GW_NT + (gw_cls_rows > 0) + (gw_cls_rows > 0 && gw_cls_biased));
    gw_u64(&w, (vocab ? (chat_template ? 12 : 11) + (gw_rerank_template != NULL) : 8) + (gw_rope_scale != 0.0f ? 2 : 0));
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
        if (gw_rerank_template) {
            gw_str(&w, "tokenizer.chat_template.rerank");
            gw_u32(&w, 8);
            gw_str(&w, gw_rerank_template);
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
    if (gw_cls_rows > 0) {
        gw_str(&w, "cls.output.weight");
        gw_u32(&w, 2);
        gw_u64(&w, GW_DIM);
        gw_u64(&w, (uint64_t)gw_cls_rows);
        gw_u32(&w, 0);
        gw_u64(&w, off);
        off += ((uint64_t)gw_cls_rows * GW_DIM * 4 + 31) / 32 * 32;
        if (gw_cls_biased) {
            gw_str(&w, "cls.output.bias");
            gw_u32(&w, 1);
            gw_u64(&w, (uint64_t)gw_cls_rows);
            gw_u32(&w, 0);
            gw_u64(&w, off);
        }
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
    for (int r = 0; r < gw_cls_rows; r++)
        for (int j = 0; j < GW_DIM; j++) {
            const float v = gw_value(0, (uint64_t)gw_cls_tokens[r] * GW_DIM + (uint64_t)j); /* token_embd is tensor 0 */
            nv_buf_append(&w, &v, 4);
        }
    while (w.len % 32) nv_buf_append(&w, "", 1);
    for (int r = 0; gw_cls_rows > 0 && gw_cls_biased && r < gw_cls_rows; r++) {
        const float v = r == 0 ? 1.0f : 0.0f;
        nv_buf_append(&w, &v, 4);
    }
    FILE *f = fopen(path, "wb");
    fwrite(w.data, 1, w.len, f);
    fclose(f);
    size_t n = w.len;
    nv_buf_free(&w);
    return n;
}

static inline size_t gguf_write_model(const char *path, const char *arch, uint32_t version, int vocab) {
    return gguf_write_model_ex(path, arch, version, vocab, NULL);
}

/* Rewrites the llama file src as llama.cpp's phi3 (Phi-3's GGUF files) at dst: each layer's query,
 * key and value rows in one attn_qkv tensor and its gate and up rows in one ffn_up (the query's and
 * key's rows in the rotation order of pairs half a head apart), the block bytes as they are.
 * variant 1: attn_qkv without the value rows; 2, 3, 4: LongRoPE (Phi-3.5's) with attention factor
 * 1.25, its long divisors 1 + i / 2 and short ones 1 + i / 100 for pair i, the original context a
 * quarter of the model's (2: the long ones apply) or all of it (3: the short ones; 4: without them).
 * With c's partial rotation (Phi-4-mini's), rope.dimension_count says it, only those rows of a head
 * are reordered, and the divisors are one per rotated pair. */
/* w into path when ok (and w holds it all); frees w. Returns whether the file was written. */
static inline int gw_save(const char *path, nv_buf *w, int ok) {
    FILE *f = ok && !w->oom ? fopen(path, "wb") : NULL;
    ok = f && fwrite(w->data, 1, w->len, f) == w->len;
    if (f) ok = fclose(f) == 0 && ok;
    nv_buf_free(w);
    return ok;
}

static inline int gw_phi3_from(const char *src, const char *dst, const nv_config *c, int variant) {
    nv_gguf g;
    if (nv_gguf_open(src, &g) != NV_OK) return 0;
    enum { MAXT = 64 };
    struct {
        char name[64];
        uint32_t type, nd;
        uint64_t d0, d1, bytes;
        uint8_t *data;
    } o[MAXT];
    size_t n = 0;
    int ok = g.n_tensors + 2 <= MAXT;
    for (uint64_t i = 0; ok && i < g.n_tensors; i++) {
        const nv_gguf_tensor *t = &g.t[i];
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)t->name_len, t->name);
        int l = -1, at = 0;
        const int blk = sscanf(name, "blk.%d.%n", &l, &at) == 1 && at;
        if (blk && (!strcmp(name + at, "attn_k.weight") || !strcmp(name + at, "attn_v.weight") || !strcmp(name + at, "ffn_gate.weight")))
            continue; /* joined with attn_q's and ffn_up's */
        const char *parts[3] = {NULL, NULL, NULL};
        if (blk && !strcmp(name + at, "attn_q.weight")) parts[0] = "attn_q", parts[1] = "attn_k", parts[2] = variant == 1 ? NULL : "attn_v";
        else if (blk && !strcmp(name + at, "ffn_up.weight")) parts[0] = "ffn_gate", parts[1] = "ffn_up";
        snprintf(o[n].name, sizeof o[n].name, "%s", name);
        o[n].type = t->type, o[n].nd = t->n_dims, o[n].d0 = t->dims[0], o[n].d1 = t->dims[1];
        if (!parts[0]) {
            o[n].bytes = t->bytes;
            o[n].data = malloc(t->bytes);
            if (o[n].data) memcpy(o[n].data, t->data, t->bytes);
            ok = o[n++].data != NULL;
            continue;
        }
        snprintf(o[n].name, sizeof o[n].name, "blk.%d.%s.weight", l, parts[0][0] == 'a' ? "attn_qkv" : "ffn_up");
        o[n].d1 = 0, o[n].bytes = 0, o[n].data = NULL;
        for (int p = 0; ok && p < 3 && parts[p]; p++) {
            char pn[64];
            snprintf(pn, sizeof pn, "blk.%d.%s.weight", l, parts[p]);
            const nv_gguf_tensor *pt = nv_gguf_tensor_find(&g, pn);
            ok = pt && pt->type == t->type && pt->dims[0] == t->dims[0];
            uint8_t *grown = ok ? realloc(o[n].data, o[n].bytes + pt->bytes) : NULL;
            if (!(ok = ok && grown)) break;
            o[n].data = grown;
            memcpy(grown + o[n].bytes, pt->data, pt->bytes);
            if (p < 2 && parts[0][0] == 'a') /* query and key rows into phi3's rotation order */
                nv_rope_rows_reorder(grown + o[n].bytes, pt->bytes / pt->dims[1], p ? c->n_kv_heads : c->n_heads, c->head_dim, nv_config_rope_dim(c), 1);
            o[n].bytes += pt->bytes, o[n].d1 += pt->dims[1];
        }
        n++;
    }
    const int longrope = variant >= 2 && variant <= 4;
    for (int s = 0; ok && longrope && s < (variant == 4 ? 1 : 2); s++) { /* LongRoPE's divisors */
        snprintf(o[n].name, sizeof o[n].name, s ? "rope_factors_short.weight" : "rope_factors_long.weight");
        o[n].type = 0, o[n].nd = 1, o[n].d0 = (uint64_t)nv_config_rope_dim(c) / 2, o[n].d1 = 1, o[n].bytes = o[n].d0 * 4;
        float *f = calloc(o[n].d0, 4);
        for (uint64_t i = 0; f && i < o[n].d0; i++) f[i] = s ? 1.0f + (float)i / 100.0f : 1.0f + (float)i / 2.0f;
        o[n].data = (uint8_t *)f;
        ok = o[n++].data != NULL;
    }
    nv_gguf_close(&g);
    nv_buf w = {0};
    nv_buf_append(&w, "GGUF", 4);
    gw_u32(&w, 3);
    gw_u64(&w, n);
    gw_u64(&w, longrope ? 13 : 11);
    gw_str(&w, "general.architecture");
    gw_u32(&w, 8);
    gw_str(&w, "phi3");
    if (longrope) {
        gw_kv_u32(&w, "phi3.rope.scaling.original_context_length", (uint32_t)(variant == 2 ? c->seq_len / 4 : c->seq_len));
        const float attn = 1.25f;
        gw_str(&w, "phi3.rope.scaling.attn_factor");
        gw_u32(&w, 6);
        nv_buf_append(&w, &attn, 4);
    }
    gw_kv_u32(&w, "phi3.embedding_length", (uint32_t)c->dim);
    gw_kv_u32(&w, "phi3.feed_forward_length", (uint32_t)c->hidden_dim);
    gw_kv_u32(&w, "phi3.block_count", (uint32_t)c->n_layers);
    gw_kv_u32(&w, "phi3.attention.head_count", (uint32_t)c->n_heads);
    gw_kv_u32(&w, "phi3.attention.head_count_kv", (uint32_t)c->n_kv_heads);
    gw_kv_u32(&w, "phi3.context_length", (uint32_t)c->seq_len);
    gw_kv_u32(&w, "phi3.rope.dimension_count", (uint32_t)nv_config_rope_dim(c));
    gw_kv_u32(&w, "phi3.attention.sliding_window", (uint32_t)c->seq_len / 2 - 1); /* Phi-3-mini's 2047 of 4096 */
    const struct {
        const char *key;
        float v;
    } floats[] = {{"phi3.attention.layer_norm_rms_epsilon", c->norm_eps}, {"phi3.rope.freq_base", c->rope_theta}};
    for (int i = 0; i < 2; i++) {
        gw_str(&w, floats[i].key);
        gw_u32(&w, 6);
        nv_buf_append(&w, &floats[i].v, 4);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        gw_str(&w, o[i].name);
        gw_u32(&w, o[i].nd);
        gw_u64(&w, o[i].d0);
        if (o[i].nd > 1) gw_u64(&w, o[i].d1);
        gw_u32(&w, o[i].type);
        gw_u64(&w, off);
        off += (o[i].bytes + 31) / 32 * 32;
    }
    static const uint8_t zeros[32];
    nv_buf_append(&w, zeros, (32 - w.len % 32) % 32);
    for (size_t i = 0; i < n; i++) {
        nv_buf_append(&w, o[i].data, o[i].bytes);
        nv_buf_append(&w, zeros, (32 - o[i].bytes % 32) % 32);
        free(o[i].data);
    }
    return gw_save(dst, &w, ok);
}

/* A SentencePiece vocabulary of 12 pieces as a GGUF file of no tensors under architecture arch:
 * llama2.c's <unk> <s> </s> (unknown, control), "▁", "a", "b", "▁a" (the one merge), "c", then
 * the control tokens <|user|> (8), <|end|> (9), <|assistant|> (10) and <|endoftext|> (11, EOS);
 * space_prefix 0 or 1 written as tokenizer.ggml.add_space_prefix, -1 not. */
/* Tests may set this: gw_spm_vocab's file says tokenizer.ggml.add_bos_token false. */
static int gw_spm_no_bos;
static inline int gw_spm_vocab(const char *path, const char *arch, int space_prefix) {
    static const char *pieces[] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81", "a", "b", "\xe2\x96\x81" "a", "c",
                                   "<|user|>", "<|end|>", "<|assistant|>", "<|endoftext|>"};
    static const int32_t types[] = {2, 3, 3, 1, 1, 1, 1, 1, 3, 3, 3, 3};
    enum { N = 12 };
    nv_buf w = {0};
    nv_buf_append(&w, "GGUF", 4);
    gw_u32(&w, 3);
    gw_u64(&w, 0); /* tensors */
    gw_u64(&w, (space_prefix >= 0 ? 7 : 6) + (gw_spm_no_bos ? 1 : 0)); /* metadata */
    if (gw_spm_no_bos) gw_str(&w, "tokenizer.ggml.add_bos_token"), gw_u32(&w, 7), nv_buf_append(&w, &(uint8_t){0}, 1);
    if (space_prefix >= 0) {
        gw_str(&w, "tokenizer.ggml.add_space_prefix"), gw_u32(&w, 7);
        nv_buf_append(&w, &(uint8_t){(uint8_t)space_prefix}, 1);
    }
    gw_str(&w, "general.architecture"), gw_u32(&w, 8), gw_str(&w, arch);
    gw_str(&w, "tokenizer.ggml.model"), gw_u32(&w, 8), gw_str(&w, "llama");
    gw_str(&w, "tokenizer.ggml.tokens"), gw_u32(&w, 9), gw_u32(&w, 8), gw_u64(&w, N);
    for (int i = 0; i < N; i++) gw_str(&w, pieces[i]);
    gw_str(&w, "tokenizer.ggml.scores"), gw_u32(&w, 9), gw_u32(&w, 6), gw_u64(&w, N);
    for (int i = 0; i < N; i++) {
        const float sc = i == 6 ? 10.0f : -(float)i;
        nv_buf_append(&w, &sc, 4);
    }
    gw_str(&w, "tokenizer.ggml.token_type"), gw_u32(&w, 9), gw_u32(&w, 5), gw_u64(&w, N);
    nv_buf_append(&w, types, sizeof types);
    gw_str(&w, "tokenizer.ggml.eos_token_id"), gw_u32(&w, 4), gw_u32(&w, 11);
    return gw_save(path, &w, 1);
}

/* A vocabulary of Gemma's layout as a GGUF file of no tensors (arch gemma3): <pad> <eos> <bos> <unk>
 * (ids 0-3: control, unknown), <start_of_turn> <end_of_turn> (4, 5: user-defined), the 256 byte
 * tokens (6..261), then "▁", "a", "b", "▁a" (the one merge), "c" (262-266); BOS 2, EOS 1, <unk> 3,
 * no dummy prefix. */
#define GW_GEMMA_VOCAB 267
static inline int gw_gemma_vocab(const char *path) {
    static const char *head[] = {"<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"};
    static const char *tail[] = {"\xe2\x96\x81", "a", "b", "\xe2\x96\x81" "a", "c"};
    enum { N = GW_GEMMA_VOCAB };
    nv_buf w = {0};
    nv_buf_append(&w, "GGUF", 4);
    gw_u32(&w, 3);
    gw_u64(&w, 0); /* tensors */
    gw_u64(&w, 9); /* metadata */
    gw_str(&w, "general.architecture"), gw_u32(&w, 8), gw_str(&w, "gemma3");
    gw_str(&w, "tokenizer.ggml.model"), gw_u32(&w, 8), gw_str(&w, "llama");
    gw_str(&w, "tokenizer.ggml.tokens"), gw_u32(&w, 9), gw_u32(&w, 8), gw_u64(&w, N);
    for (int i = 0; i < N; i++) {
        char byte[8];
        snprintf(byte, sizeof byte, "<0x%02X>", (unsigned)(i - 6) & 255);
        gw_str(&w, i < 6 ? head[i] : i < 262 ? byte : tail[i - 262]);
    }
    gw_str(&w, "tokenizer.ggml.scores"), gw_u32(&w, 9), gw_u32(&w, 6), gw_u64(&w, N);
    for (int i = 0; i < N; i++) {
        const float sc = i == 265 ? 10.0f : -(float)i;
        nv_buf_append(&w, &sc, 4);
    }
    gw_str(&w, "tokenizer.ggml.token_type"), gw_u32(&w, 9), gw_u32(&w, 5), gw_u64(&w, N);
    for (int i = 0; i < N; i++) {
        const int32_t type = i == 3 ? 2 : i < 3 ? 3 : i < 6 ? 4 : i < 262 ? 6 : 1;
        nv_buf_append(&w, &type, 4);
    }
    gw_str(&w, "tokenizer.ggml.bos_token_id"), gw_u32(&w, 4), gw_u32(&w, 2);
    gw_str(&w, "tokenizer.ggml.eos_token_id"), gw_u32(&w, 4), gw_u32(&w, 1);
    gw_str(&w, "tokenizer.ggml.unknown_token_id"), gw_u32(&w, 4), gw_u32(&w, 3);
    gw_str(&w, "tokenizer.ggml.add_space_prefix"), gw_u32(&w, 7);
    nv_buf_append(&w, &(uint8_t){0}, 1);
    return gw_save(path, &w, 1);
}

#endif
