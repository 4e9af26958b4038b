/* GGUF models and vocabularies: the real files in ../shared/data (stories260K as GGUF v1 gives
 * the very weights and vocabulary of the llama2.c files; a v3 F16 model loads and runs), a
 * synthetic v3 file with every supported tensor type converted exactly, and malformed files
 * (every truncation, bad versions, types, shapes, offsets, architectures) refused with a clear
 * error. */
#include <immintrin.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "model/hf.h"
#include "serve/chat.h"
#include "model/imatrix.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "serve/prefix.h"
#include "train/ckpt.h"
#include "gguf_write.h"
#include "serve_util.h"
#include "forward_ref.h"
#include "t.h"

/* m as a model of config c with random weights (seed); 0, reported, when it cannot be allocated. */
static int random_model(nv_model *m, const nv_config *c, uint64_t seed) {
    T_CHECK(nv_model_alloc(m, c) == NV_OK, "%s", nv_errmsg());
    if (!m->params) return 0;
    nv_model_init_random(m, seed);
    return 1;
}

static void test_stories260k_gguf_equals_bin(void) {
    const char *gp = t_data("gguf/tinyllamas-stories-260k-f32.gguf"), *bp = t_data("models/stories260K.bin");
    if (!gp || !bp) return;
    nv_model g, b;
    T_CHECK(nv_model_load(gp, &g) == NV_OK, "%s", nv_errmsg());
    T_CHECK(nv_model_load(bp, &b) == NV_OK, "%s", nv_errmsg());
    const nv_config *x = &g.config, *y = &b.config;
    T_CHECK(x->dim == y->dim && x->hidden_dim == y->hidden_dim && x->n_layers == y->n_layers && x->n_heads == y->n_heads &&
                x->n_kv_heads == y->n_kv_heads && x->head_dim == y->head_dim && x->vocab_size == y->vocab_size &&
                x->seq_len == y->seq_len && x->rope_theta == y->rope_theta && x->norm_eps == y->norm_eps,
            "config differs: dim %d/%d layers %d/%d vocab %d/%d seq %d/%d eps %g/%g", x->dim, y->dim, x->n_layers,
            y->n_layers, x->vocab_size, y->vocab_size, x->seq_len, y->seq_len, (double)x->norm_eps, (double)y->norm_eps);
    size_t L = (size_t)x->n_layers, d = (size_t)x->dim, h = (size_t)x->hidden_dim, V = (size_t)x->vocab_size;
    size_t qd = (size_t)nv_config_q_dim(x), kvd = (size_t)nv_config_kv_dim(x);
    struct {
        const char *name;
        const float *a, *b;
        size_t n;
    } parts[] = {{"tok_emb", g.w.tok_emb, b.w.tok_emb, V * d}, {"rms_att", g.w.rms_att, b.w.rms_att, L * d},
                 {"rms_ffn", g.w.rms_ffn, b.w.rms_ffn, L * d}, {"rms_final", g.w.rms_final, b.w.rms_final, d},
                 {"wq", g.w.wq, b.w.wq, L * qd * d},          {"wk", g.w.wk, b.w.wk, L * kvd * d},
                 {"wv", g.w.wv, b.w.wv, L * kvd * d},          {"wo", g.w.wo, b.w.wo, L * d * qd},
                 {"w1", g.w.w1, b.w.w1, L * h * d},            {"w2", g.w.w2, b.w.w2, L * d * h},
                 {"w3", g.w.w3, b.w.w3, L * h * d},            {"wcls", g.w.wcls, b.w.wcls, V * d}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        T_CHECK(memcmp(parts[i].a, parts[i].b, parts[i].n * 4) == 0, "%s differs from the llama2.c file's", parts[i].name);
    nv_model_free(&g);
    nv_model_free(&b);

    /* its vocabulary is tok512, piece for piece (BOS/EOS written "\n<s>\n"/"\n</s>\n" as llama2.c's) */
    nv_tokenizer *tg = NULL, *tb = NULL;
    T_CHECK(nv_tokenizer_load(gp, 0, &tg) == NV_OK, "%s", nv_errmsg());
    T_CHECK(nv_tokenizer_load(t_data("models/tok512.bin"), 0, &tb) == NV_OK, "%s", nv_errmsg());
    if (!tg || !tb) return;
    int n = nv_tokenizer_vocab_size(tg), bad = 0;
    T_CHECK(n == nv_tokenizer_vocab_size(tb), "vocabulary %d vs %d", n, nv_tokenizer_vocab_size(tb));
    for (int i = 0; i < n; i++)
        bad += strcmp(nv_tokenizer_piece(tg, i), nv_tokenizer_piece(tb, i)) != 0 || nv_tokenizer_score(tg, i) != nv_tokenizer_score(tb, i);
    T_CHECK(bad == 0, "%d pieces or scores differ", bad);
    nv_tokenizer_free(tg);
    nv_tokenizer_free(tb);
}

/* llama-2-tiny-random: GGUF v3, F16 matrices and F32 norms, 32000 tokens: loads, converts, runs. */
static void test_tiny_random_v3_f16(void) {
    const char *p = t_data("gguf/llama-2-tiny-random.gguf");
    if (!p) return;
    nv_model m;
    T_CHECK(nv_model_load(p, &m) == NV_OK, "%s", nv_errmsg());
    if (!m.params) return;
    T_CHECK(m.config.dim == 8 && m.config.n_layers == 1 && m.config.vocab_size == 32000, "config: dim %d layers %d vocab %d",
            m.config.dim, m.config.n_layers, m.config.vocab_size);
    nv_gguf g;
    T_CHECK(nv_gguf_open(p, &g) == NV_OK, "%s", nv_errmsg());
    const nv_gguf_tensor *t = nv_gguf_tensor_find(&g, "blk.0.attn_q.weight");
    T_CHECK(t && t->type == 1, "attn_q is not F16");
    int same = 1;
    for (uint64_t i = 0; t && i < t->dims[0] * t->dims[1]; i++) {
        uint16_t hbits;
        memcpy(&hbits, t->data + 2 * i, 2);
        same &= m.w.wq[i] == _cvtsh_ss(hbits);
    }
    T_CHECK(same, "F16 weights not converted exactly");
    nv_gguf_close(&g);
    nv_state s;
    int toks[3] = {1, 15043, 3186};
    T_CHECK(nv_model_build_plans(&m, NV_ENGINE_SCALAR) == NV_OK && nv_state_init(&s, &m.config, 3, 8, 0) == NV_OK &&
                nv_forward(&m, &s, toks, 3, 0) == NV_OK,
            "%s", nv_errmsg());
    int finite = 1;
    for (int i = 0; i < m.config.vocab_size; i++) finite &= isfinite(s.logits[i]);
    T_CHECK(finite, "non-finite logits");
    nv_state_free(&s);
    nv_model_free(&m);
    nv_tokenizer *tok = NULL;
    T_CHECK(nv_tokenizer_load(p, 32000, &tok) == NV_OK, "%s", nv_errmsg());
    nv_tokenizer_free(tok);
}

static void test_synthetic_types(void) {
    const char *p = t_path("synthetic.gguf");
    gguf_write_model(p, "llama", 3, 0);
    nv_model m;
    T_CHECK(nv_model_load(p, &m) == NV_OK, "%s", nv_errmsg());
    if (!m.params) return;
    T_CHECK(m.config.dim == GW_DIM && m.config.n_kv_heads == GW_KVH && m.config.head_dim == GW_HD && m.config.vocab_size == GW_VOCAB &&
                m.config.norm_eps == 1e-6f && m.config.shared_classifier && m.config.rope_theta == 10000.0f,
            "config");
    const float *dst[GW_NT] = {m.w.tok_emb, m.w.rms_final, m.w.rms_att, m.w.wq, m.w.wk, m.w.wv, m.w.wo,
                            m.w.rms_ffn, m.w.w1,       m.w.w2,        m.w.w3};
    for (size_t k = 0; k < GW_NT; k++) {
        int bad = 0;
        for (uint64_t i = 0; i < gw_tensors[k].d0 * gw_tensors[k].d1; i++) bad += dst[k][i] != gw_value((int)k, i);
        T_CHECK(bad == 0, "%s (type %u): %d values differ", gw_tensors[k].name, gw_tensors[k].type, bad);
    }
    nv_model_free(&m);
    /* with a vocabulary: U+2581 is a space, the scores are kept */
    gguf_write_model(p, "llama", 2, 1);
    nv_tokenizer *t = NULL;
    T_CHECK(nv_tokenizer_load(p, GW_VOCAB, &t) == NV_OK, "%s", nv_errmsg());
    if (!t) return;
    T_CHECK(!strcmp(nv_tokenizer_piece(t, 5), " ab") && nv_tokenizer_score(t, 5) == -1.5f, "piece 5 '%s'", nv_tokenizer_piece(t, 5));
    int *ids = NULL, n = 0;
    T_CHECK(nv_tokenizer_encode(t, "ab", 1, 0, &ids, &n) == NV_OK && n == 2 && ids[1] == 5, "encode 'ab': %d ids", n);
    free(ids);
    nv_tokenizer_free(t);
}

/* The quantized types against values worked out by hand from llama.cpp's block layouts. */
static void put_half(uint8_t *p, float f) {
    uint16_t h = _cvtss_sh(f, 0);
    memcpy(p, &h, 2);
}

static void test_quant_blocks(void) {
    uint8_t b[256];
    float y[256];
    /* Q4_0: d 0.5; byte j: value j in the low nibble, 15 - j in the high one; minus 8 */
    memset(b, 0, sizeof b);
    put_half(b, 0.5f);
    for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(j | (15 - j) << 4);
    T_CHECK(nv_gguf_dequant(2, b, 32, y) == NV_OK && y[0] == -4.0f && y[3] == -2.5f && y[16] == 3.5f && y[31] == -4.0f,
            "Q4_0: %g %g %g %g", (double)y[0], (double)y[3], (double)y[16], (double)y[31]);
    /* Q4_1: d 0.25, m 1 */
    put_half(b, 0.25f);
    put_half(b + 2, 1.0f);
    for (int j = 0; j < 16; j++) b[4 + j] = (uint8_t)(j | (15 - j) << 4);
    T_CHECK(nv_gguf_dequant(3, b, 32, y) == NV_OK && y[0] == 1.0f && y[5] == 2.25f && y[16] == 4.75f, "Q4_1: %g %g %g",
            (double)y[0], (double)y[5], (double)y[16]);
    /* Q5_0: d 1, fifth bits 0x80000001 (value 0 and value 31), nibbles j / 0; minus 16 */
    memset(b, 0, sizeof b);
    put_half(b, 1.0f);
    uint32_t qh = 0x80000001u;
    memcpy(b + 2, &qh, 4);
    for (int j = 0; j < 16; j++) b[6 + j] = (uint8_t)j;
    T_CHECK(nv_gguf_dequant(6, b, 32, y) == NV_OK && y[0] == 0.0f && y[1] == -15.0f && y[16] == -16.0f && y[31] == 0.0f,
            "Q5_0: %g %g %g %g", (double)y[0], (double)y[1], (double)y[16], (double)y[31]);
    /* Q5_1: d 2, m -3 */
    put_half(b, 2.0f);
    put_half(b + 2, -3.0f);
    memcpy(b + 4, &qh, 4);
    for (int j = 0; j < 16; j++) b[8 + j] = (uint8_t)j;
    T_CHECK(nv_gguf_dequant(7, b, 32, y) == NV_OK && y[0] == 29.0f && y[2] == 1.0f && y[31] == 29.0f, "Q5_1: %g %g %g",
            (double)y[0], (double)y[2], (double)y[31]);
    /* Q4_K: d 1, dmin 0.5; sub-block scales/mins 1/5 2/6 3/7 4/8 (bytes 0-7), then 17/2 2/3 3/4
     * 4/5 (bytes 8-11 with byte 0's top bits adding 16 to the fifth scale); nibbles i % 16 / 15 - i % 16 */
    memset(b, 0, sizeof b);
    put_half(b, 1.0f);
    put_half(b + 2, 0.5f);
    const uint8_t sc[12] = {0x41, 2, 3, 4, 5, 6, 7, 8, 0x21, 0x32, 0x43, 0x54};
    memcpy(b + 4, sc, 12);
    for (int i = 0; i < 128; i++) b[16 + i] = (uint8_t)((i % 16) | (15 - i % 16) << 4);
    T_CHECK(nv_gguf_dequant(12, b, 256, y) == NV_OK && y[0] == -2.5f && y[32] == 27.0f && y[128] == -1.0f && y[129] == 16.0f &&
                y[255] == 4.0f * 0.0f - 2.5f,
            "Q4_K: %g %g %g %g %g", (double)y[0], (double)y[32], (double)y[128], (double)y[129], (double)y[255]);
    /* Q5_K: the same, with fifth bits for value 0 (bit 0 of byte 0) and value 32 (bit 1 of byte 0) */
    memset(b, 0, sizeof b);
    put_half(b, 1.0f);
    put_half(b + 2, 0.5f);
    memcpy(b + 4, sc, 12);
    b[16] = 0x3;
    for (int i = 0; i < 128; i++) b[48 + i] = (uint8_t)((i % 16) | (15 - i % 16) << 4);
    T_CHECK(nv_gguf_dequant(13, b, 256, y) == NV_OK && y[0] == 13.5f && y[32] == 59.0f && y[1] == -1.5f, "Q5_K: %g %g %g",
            (double)y[0], (double)y[32], (double)y[1]);
    /* Q6_K: low nibbles i % 16, high pairs of value 0's group 0/1/2/3 (byte 0xE4), scales 1..16, d 1; minus 32 */
    memset(b, 0, sizeof b);
    for (int i = 0; i < 128; i++) b[i] = (uint8_t)(i % 16);
    b[128] = 0xE4;
    for (int i = 0; i < 16; i++) b[192 + i] = (uint8_t)(i + 1);
    put_half(b + 208, 1.0f);
    T_CHECK(nv_gguf_dequant(14, b, 256, y) == NV_OK && y[0] == -32.0f && y[17] == -62.0f && y[32] == -48.0f && y[64] == 0.0f &&
                y[96] == 112.0f && y[128] == -288.0f,
            "Q6_K: %g %g %g %g %g %g", (double)y[0], (double)y[17], (double)y[32], (double)y[64], (double)y[96], (double)y[128]);
    T_CHECK(nv_gguf_dequant(12, b, 100, y) == NV_EUNSUPPORTED && nv_gguf_dequant(16, b, 256, y) == NV_EUNSUPPORTED &&
                strstr(nv_errmsg(), "IQ2_XXS"),
            "partial blocks or IQ2_XXS accepted, or not named: %s", nv_errmsg());
    /* Q3_K: d 0.5, every scale 32 + 2 = 34 (low nibbles 2 in bytes 0..7, high pairs 0b10 in bytes 8..11),
     * values' two bits 3 (qs 0xFF), third bit set for value 0 only: 7 - 4 = 3 there, 3 - 4 = -1 elsewhere */
    memset(b, 0, sizeof b);
    memset(b + 32, 0xFF, 64);
    b[0] = 1;
    for (int j = 0; j < 8; j++) b[96 + j] = 0x22;
    for (int j = 8; j < 12; j++) b[96 + j] = 0xAA;
    put_half(b + 108, 0.5f);
    T_CHECK(nv_gguf_dequant(11, b, 256, y) == NV_OK && y[0] == 3.0f && y[1] == -1.0f && y[255] == -1.0f,
            "Q3_K: %g %g %g", (double)y[0], (double)y[1], (double)y[255]);
}

/* llama.cpp's reference dequantizers of the 2- and 3-bit k-quants and the IQ4 types, written here in
 * their own loop order (by half of 128, by shift, by 16), against the loader's on random blocks: the
 * same floats. */
static float ref_half(const uint8_t *p) { return _cvtsh_ss((uint16_t)(p[0] | p[1] << 8)); }
static const int8_t ref_iq4[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static void ref_q2_k(const uint8_t *b, float *y) {
    const float d = ref_half(b + 80), min = ref_half(b + 82);
    const uint8_t *q = b + 16;
    int is = 0;
    for (int n = 0; n < 256; n += 128, q += 32)
        for (int shift = 0; shift < 8; shift += 2)
            for (int part = 0; part < 2; part++) {
                const uint8_t sc = b[is++];
                const float dl = d * (float)(sc & 0xF), ml = min * (float)(sc >> 4);
                for (int l = 0; l < 16; l++) *y++ = dl * (float)((q[l + 16 * part] >> shift) & 3) - ml;
            }
}

static void ref_q3_k(const uint8_t *b, float *y) {
    const uint8_t *hm = b, *q = b + 32, *raw = b + 96;
    const float d = ref_half(b + 108);
    int8_t sc[16];
    for (int j = 0; j < 16; j++) { /* the 32-bit shuffle of the reference, one byte at a time */
        const int low = (raw[j % 8] >> (j < 8 ? 0 : 4)) & 0xF, high = (raw[8 + j % 4] >> (2 * (j / 4))) & 3;
        sc[j] = (int8_t)((low | high << 4) - 32);
    }
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < 256; n += 128, q += 32)
        for (int shift = 0; shift < 8; shift += 2, m = (uint8_t)(m << 1))
            for (int part = 0; part < 2; part++) {
                const float dl = d * (float)sc[is++];
                for (int l = 0; l < 16; l++)
                    *y++ = dl * (float)((int8_t)((q[l + 16 * part] >> shift) & 3) - ((hm[l + 16 * part] & m) ? 0 : 4));
            }
}

static void ref_iq4_nl(const uint8_t *b, float *y) {
    const float d = ref_half(b);
    for (int j = 0; j < 16; j++) y[j] = d * (float)ref_iq4[b[2 + j] & 0xF], y[j + 16] = d * (float)ref_iq4[b[2 + j] >> 4];
}

static void ref_iq4_xs(const uint8_t *b, float *y) {
    const float d = ref_half(b);
    const uint16_t scales_h = (uint16_t)(b[2] | b[3] << 8);
    const uint8_t *qs = b + 8;
    for (int ib = 0; ib < 8; ib++, y += 32, qs += 16) {
        const int ls = ((b[4 + ib / 2] >> 4 * (ib % 2)) & 0xF) | ((scales_h >> 2 * ib) & 3) << 4;
        const float dl = d * (float)(ls - 32);
        for (int j = 0; j < 16; j++) y[j] = dl * (float)ref_iq4[qs[j] & 0xF], y[j + 16] = dl * (float)ref_iq4[qs[j] >> 4];
    }
}

static void test_quant_blocks_random(void) {
    static const struct {
        uint32_t type;
        int values, bytes, d_at, dmin_at;
        void (*ref)(const uint8_t *, float *);
        const char *name;
    } k[] = {{10, 256, 84, 80, 82, ref_q2_k, "Q2_K"},
             {11, 256, 110, 108, -1, ref_q3_k, "Q3_K"},
             {20, 32, 18, 0, -1, ref_iq4_nl, "IQ4_NL"},
             {23, 256, 136, 0, -1, ref_iq4_xs, "IQ4_XS"}};
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (size_t t = 0; t < sizeof k / sizeof k[0]; t++) {
        int bad = -1;
        char why[160] = "";
        for (int trial = 0; trial < 64 && bad < 0; trial++) {
            uint8_t b[3 * 136];
            float want[3 * 256], got[3 * 256];
            for (size_t i = 0; i < sizeof b; i++) b[i] = (uint8_t)((rng = rng * 6364136223846793005ull + 1442695040888963407ull) >> 56);
            for (int blk = 0; blk < 3; blk++) { /* finite scales, some tiny (fp16 subnormals), one zero */
                uint8_t *p = b + blk * k[t].bytes;
                const float dv = trial == 0 && blk == 0 ? 0.0f : ldexpf((float)(p[1] % 64) - 32.0f, -(p[0] % 24));
                put_half(p + k[t].d_at, dv);
                if (k[t].dmin_at >= 0) put_half(p + k[t].dmin_at, ldexpf((float)(p[2] % 64), -(p[3] % 24)));
                k[t].ref(p, want + blk * k[t].values);
            }
            if (nv_gguf_dequant(k[t].type, b, (uint64_t)(3 * k[t].values), got) != NV_OK) {
                bad = 0;
                snprintf(why, sizeof why, "%s", nv_errmsg());
            }
            for (int i = 0; i < 3 * k[t].values && bad < 0; i++)
                if (want[i] != got[i]) { /* a zero's sign aside (Q3_K's offset form adds -4s to 0 * q) */
                    bad = i;
                    snprintf(why, sizeof why, "value %d of trial %d: %g, the reference %g", i, trial, (double)got[i], (double)want[i]);
                }
        }
        T_CHECK(bad < 0, "%s differs from the reference dequantizer: %s", k[t].name, why);
    }
}

/* A copy of the synthetic file with len bytes of it, and bytes at off replaced. */
static const char *variant(const char *src, size_t len, size_t off, const void *bytes, size_t n) {
    char *data;
    size_t size;
    if (nv_file_read_all(src, &data, &size) != NV_OK) return NULL;
    if (n && off + n <= size) memcpy(data + off, bytes, n);
    const char *p = t_path("variant.gguf");
    FILE *f = fopen(p, "wb");
    fwrite(data, 1, len < size ? len : size, f);
    fclose(f);
    free(data);
    return p;
}

static size_t find(const char *path, const char *needle) {
    char *data;
    size_t size;
    if (nv_file_read_all(path, &data, &size) != NV_OK) return 0;
    size_t at = 0;
    for (size_t i = 0; i + strlen(needle) <= size; i++)
        if (!memcmp(data + i, needle, strlen(needle))) {
            at = i;
            break;
        }
    free(data);
    return at;
}

static void expect(const char *p, nv_err want, const char *what) {
    nv_model m;
    nv_err e = nv_model_load(p, &m);
    T_CHECK(e == want, "%s: %s (%s)", what, nv_err_name(e), nv_errmsg());
    if (e == NV_OK) nv_model_free(&m);
    T_CHECK(e == NV_OK || (strlen(nv_errmsg()) > 10 && !strchr(nv_errmsg(), '\n')), "%s: message '%s'", what, nv_errmsg());
}

static void test_malformed(void) {
    char src[4200];
    snprintf(src, sizeof src, "%s", t_path("good.gguf"));
    size_t size = gguf_write_model(src, "llama", 3, 0);
    /* every truncation is refused */
    int bad = 0;
    for (size_t len = 0; len < size; len += len < 600 ? 1 : 61) {
        nv_model m;
        const char *p = variant(src, len, 0, NULL, 0);
        nv_err e = nv_model_load(p, &m);
        if (e != NV_EFORMAT) {
            if (bad++ < 3) T_CHECK(0, "truncated to %zu of %zu bytes: %s (%s)", len, size, nv_err_name(e), nv_errmsg());
            if (e == NV_OK) nv_model_free(&m);
        }
    }
    T_CHECK(bad == 0, "%d truncations not refused", bad);
    uint32_t v9 = 9, q2k = 10, two = 2;
    uint64_t huge = 1ull << 50;
    expect(variant(src, size, 4, &v9, 4), NV_EUNSUPPORTED, "version 9");
    expect(variant(src, size, 8, &huge, 8), NV_EFORMAT, "absurd tensor count");
    size_t at = find(src, "blk.0.attn_q.weight") + strlen("blk.0.attn_q.weight"), at0 = at;
    expect(variant(src, size, at + 4 + 16, &q2k, 4), NV_EUNSUPPORTED, "a Q2_K tensor");
    expect(variant(src, size, at + 4 + 8, &two, 4), NV_EFORMAT, "a wrongly shaped tensor");
    expect(variant(src, size, at + 4 + 16 + 4, &huge, 8), NV_EFORMAT, "a tensor past the end");
    uint64_t odd = 8;
    expect(variant(src, size, at + 4 + 16 + 4, &odd, 8), NV_EFORMAT, "a misaligned tensor");
    at = find(src, "llama.block_count");
    expect(variant(src, size, at, "xlama", 5), NV_EFORMAT, "block_count missing");
    expect(variant(src, size, at + strlen("llama.block_count"), (uint32_t[]){9}, 4), NV_EFORMAT, "an array where a number was");
    uint64_t zero = 0;
    expect(variant(src, size, at0 + 4 + 16 + 4, &zero, 8), NV_EFORMAT, "two tensors on the same bytes");
    size_t k_at = find(src, "blk.0.attn_k.weight");
    expect(variant(src, size, k_at, "blk.0.attn_q.weight", 19), NV_EFORMAT, "a tensor name twice");
    expect(variant(src, size, k_at, "blk.0.attn_k.w.bias", 19), NV_EUNSUPPORTED, "a bias tensor");
    gw_rope_scale = -4.0f;
    gguf_write_model(t_path("scaled.gguf"), "llama", 3, 0);
    gw_rope_scale = 0.0f;
    expect(t_path("scaled.gguf"), NV_EFORMAT, "rope.scaling.factor -4 is out of range");
    gguf_write_model(t_path("arch.gguf"), "mamba", 3, 0);
    expect(t_path("arch.gguf"), NV_EUNSUPPORTED, "architecture mamba");
    nv_tokenizer *t = NULL;
    T_CHECK(nv_tokenizer_load(src, 0, &t) == NV_EFORMAT, "a GGUF file without a vocabulary: %s", nv_errmsg());
}

/* A GGUF model is a starting point for training: its run folder gets a tokenizer.bin (the
 * vocabulary converted, not the GGUF file) and a model.bin that generate reads. */
static void test_finetune_from_gguf(void) {
    const char *gp = t_data("gguf/tinyllamas-stories-260k-f32.gguf"), *data = t_data("corpus/tinystories_valid_head.txt");
    if (!gp || !data) return;
    char args[4200], dir[700];
    snprintf(dir, sizeof dir, "%s/ft-gguf", t_tmpdir());
    snprintf(args, sizeof args, "train --init-from %s -z %s --data %s --steps 2 --batch 2 --seq 32 --quiet --out %s", gp, gp,
             data, dir);
    T_CHECK(t_nerve(args) == 0, "fine-tune from GGUF failed");
    char tp[800];
    snprintf(tp, sizeof tp, "%s/tokenizer.bin", dir);
    char *bytes = NULL;
    size_t len = 0;
    T_CHECK(nv_file_read_all(tp, &bytes, &len) == NV_OK && !nv_gguf_is(bytes, len), "tokenizer.bin is not in tokenizer.bin format");
    free(bytes);
    snprintf(args, sizeof args, "generate -m %s -p 'Once upon' -n 8 -t 0", dir);
    T_CHECK(t_nerve(args) == 0, "generate from the run folder failed");
}

/* nerve export to GGUF: stories260K and tok512 written as one GGUF file read back give the same
 * weights, the same vocabulary and llama2.c's greedy text; a run folder exports with its own. */
static void test_export_roundtrip(void) {
    const char *bp = t_data("models/stories260K.bin"), *tp = t_data("models/tok512.bin");
    const char *want = t_data("models/stories260K_greedy200.expected.txt");
    if (!bp || !tp || !want) return;
    char out[700], args[4200];
    snprintf(out, sizeof out, "%s/exported.gguf", t_tmpdir());
    snprintf(args, sizeof args, "export %s -z %s -o %s", bp, tp, out);
    T_CHECK(t_nerve(args) == 0, "export failed: %s", t_err);
    nv_model a, b;
    T_CHECK(nv_model_load(bp, &a) == NV_OK && nv_model_load(out, &b) == NV_OK, "%s", nv_errmsg());
    if (!a.params || !b.params) return;
    T_CHECK(a.n_params == b.n_params && !memcmp(a.params, b.params, a.n_params * 4) && !memcmp(&a.config, &b.config, sizeof a.config),
            "weights or config changed in the GGUF round trip");
    nv_model_free(&a);
    nv_model_free(&b);
    nv_tokenizer *ta = NULL, *tb = NULL;
    T_CHECK(nv_tokenizer_load(tp, 0, &ta) == NV_OK && nv_tokenizer_load(out, 0, &tb) == NV_OK, "%s", nv_errmsg());
    int bad = !ta || !tb || nv_tokenizer_vocab_size(ta) != nv_tokenizer_vocab_size(tb);
    for (int i = 0; !bad && i < nv_tokenizer_vocab_size(ta); i++)
        bad += strcmp(nv_tokenizer_piece(ta, i), nv_tokenizer_piece(tb, i)) || nv_tokenizer_score(ta, i) != nv_tokenizer_score(tb, i);
    T_CHECK(!bad, "the vocabulary changed in the GGUF round trip");
    nv_tokenizer_free(ta);
    nv_tokenizer_free(tb);
    char *gold = NULL;
    nv_file_read_all(want, &gold, NULL);
    snprintf(args, sizeof args, "generate -m %s -t 0 -n 200", out);
    T_CHECK(t_nerve(args) == 0 && gold && !strcmp(t_out, gold), "greedy text from the exported file differs:\n%s", t_out);
    free(gold);
    /* a run folder (test_finetune_from_gguf's) exports with its tokenizer.bin */
    char dir[700];
    snprintf(dir, sizeof dir, "%s/ft-gguf", t_tmpdir());
    snprintf(args, sizeof args, "export %s -o %s/run.gguf", dir, t_tmpdir());
    T_CHECK(t_nerve(args) == 0, "export of a run folder failed: %s", t_err);
    snprintf(args, sizeof args, "generate -m %s/run.gguf -p 'Once upon' -n 8 -t 0", t_tmpdir());
    T_CHECK(t_nerve(args) == 0, "the run folder's GGUF does not generate: %s", t_err);
}

/* `nerve export --type q8_0|q4_0|f16|bf16` writes llama.cpp's Q8_0 (values within 0.6 of a step of
 * the fp32 ones), Q4_0 (within a step: the value of largest magnitude is exact, its opposite clamps
 * to 7 steps), F16 or BF16 (every matrix, within half an fp16 or bf16 ulp); loading it keeps the
 * matrices as int8, 4-bit, fp16 or bf16 values for avx2/avx512 plans, which give exactly the logits
 * of fp32 plans over the dequantized weights, and stay close to the fp32 model's (Q4_0 less so: 16
 * levels). bits: 4, 8, 16 or NV_QBITS_BF16. */
/* Of n positions' logits (v each), how many pick the same top token in a as in b; *moved the largest
 * |a - b|, *largest the largest |a|. */
static int logits_agree(const float *a, const float *b, int n, size_t v, double *moved, double *largest) {
    int agree = 0;
    *moved = *largest = 0;
    for (int p = 0; p < n; p++) {
        const float *x = a + (size_t)p * v, *y = b + (size_t)p * v;
        size_t ix = 0, iy = 0;
        for (size_t i = 0; i < v; i++) {
            ix = x[i] > x[ix] ? i : ix, iy = y[i] > y[iy] ? i : iy;
            *moved = fmax(*moved, fabs((double)x[i] - y[i]));
            *largest = fmax(*largest, fabs((double)x[i]));
        }
        agree += ix == iy;
    }
    return agree;
}

static void export_and_quantized_plans(const char *type, int bits) {
    const int half = bits >= 16;
    /* half an ulp, relative to the largest value: fp16 keeps 10 stored significand bits, bf16 7 */
    const double half_ulp = bits == 16 ? 1.0 / 2048 : 1.0 / 256;
    const char *bp = t_data("models/stories260K.bin"), *tp = t_data("models/tok512.bin");
    if (!bp || !tp) return;
    char out[700], args[4200];
    snprintf(out, sizeof out, "%s/%s.gguf", t_tmpdir(), type);
    snprintf(args, sizeof args, "export %s -z %s -o %s --type %s", bp, tp, out, type);
    T_CHECK(t_nerve(args) == 0, "export failed: %s", t_err);
    snprintf(args, sizeof args, "export %s -o %s/%s.bin --type %s", bp, t_tmpdir(), type, type);
    T_CHECK(t_nerve(args) == 2 && strstr(t_err, "GGUF"), "%s to a llama2.c file: %s", type, t_err);
    snprintf(args, sizeof args, "export %s -o %s/iq2.gguf --type iq2_xxs", bp, t_tmpdir());
    T_CHECK(t_nerve(args) == 2 && strstr(t_err, "--type"), "unknown type: %s", t_err);
    nv_gguf g; /* general.file_type is llama.cpp's file type: MOSTLY_F16 1, MOSTLY_Q4_0 2, MOSTLY_Q8_0 7, MOSTLY_BF16 32 */
    if (nv_gguf_open(out, &g) == NV_OK) {
        const nv_gguf_kv *ft = nv_gguf_find(&g, "general.file_type");
        uint32_t v = 0;
        if (ft && ft->type == 4) memcpy(&v, ft->val, 4); /* GGUF value type 4: uint32 */
        T_CHECK(ft && ft->type == 4 && v == (uint32_t)(bits == 16 ? 1 : bits == NV_QBITS_BF16 ? 32 : bits == 4 ? 2 : 7),
                "%s: general.file_type %u", type, v);
        nv_gguf_close(&g);
    } else {
        T_CHECK(0, "%s", nv_errmsg());
    }
    nv_model b, q, f;
    T_CHECK(nv_model_load(bp, &b) == NV_OK && nv_model_load(out, &q) == NV_OK && nv_model_load(out, &f) == NV_OK, "%s",
            nv_errmsg());
    if (!b.params || !q.params || !f.params) return;
    const nv_config *c = &b.config;
    /* every matrix whose rows are whole blocks is quantized: each value within 0.6 steps (Q8_0) or
       1.05 steps (Q4_0) of its block's, the step being its largest magnitude / 127 or / 8 */
    double worst = 0;
    for (uint64_t i = 0; i < b.n_params; i++) worst = fmax(worst, fabs((double)b.params[i] - q.params[i]));
    float amax = 0;
    for (uint64_t i = 0; i < b.n_params; i++) amax = fmaxf(amax, fabsf(b.params[i]));
    const double bound = half ? amax * half_ulp + 0x1p-24 : bits == 8 ? 0.6 * amax / 127 : 1.05 * amax / 8;
    T_CHECK(worst > 0 && worst <= bound, "%s moved a weight by %g (largest weight %g)", type, worst, (double)amax);
    const size_t wq_len = (size_t)nv_config_q_dim(&b.config) * b.config.dim; /* and per block of wq */
    for (size_t b0 = 0; b0 + 32 <= wq_len; b0 += 32) {
        float bmax = 0, bworst = 0;
        for (int j = 0; j < 32; j++) bmax = fmaxf(bmax, fabsf(b.w.wq[b0 + j]));
        for (int j = 0; j < 32; j++) bworst = fmaxf(bworst, fabsf(b.w.wq[b0 + j] - q.w.wq[b0 + j]));
        if (bworst > (half ? bmax * (float)half_ulp + 0x1p-24f : bits == 8 ? 0.6f * bmax / 127 : 1.05f * bmax / 8)) {
            T_CHECK(0, "%s: block %zu of wq moved by %g (its largest %g)", type, b0 / 32, (double)bworst, (double)bmax);
            break;
        }
    }
    /* kept as the file's blocks (no arrays until a plan is built), and what they make */
    T_CHECK(q.quant && q.quant[0].raw && !q.quant[0].q && !q.quant[0].h && (q.quant[5].raw != NULL) == half, "%s: raw sources", type);
    T_CHECK(q.quant && nv_qmatrix_materialize(&q.quant[0]) == NV_OK && nv_qmatrix_materialize(&q.quant[5]) == NV_OK, "%s", nv_errmsg());
    if (half)
        T_CHECK(q.quant && q.quant[0].h && !q.quant[0].q && q.quant[5].h && q.quant[0].h_bf16 == (bits == NV_QBITS_BF16),
                "%s sources: wq and w2 kept as they are", type);
    else
        T_CHECK(q.quant && q.quant[0].q && q.quant[0].qb == 32 && !q.quant[0].o == (bits == 8) && !q.quant[5].q,
                "%s sources: wq kept (with offsets for Q4_0), w2 (rows of 172, not whole blocks) F32", type);
    /* f: the same file with its quantized sources dropped, so fp32 plans over the same floats */
    for (int i = 0; f.quant && i <= c->n_layers * NV_LAYER_MATRICES; i++)
        free(f.quant[i].q), free(f.quant[i].s), free(f.quant[i].o), free(f.quant[i].h);
    free(f.quant);
    f.quant = NULL;
    nv_engines_init(NULL, 0); /* probed before the best engine is asked for (this test may run first) */
    const nv_engine_id e = nv_engine_best_fp32();
    T_CHECK(nv_model_build_plans(&b, e) == NV_OK && nv_model_build_plans(&q, e) == NV_OK && nv_model_build_plans(&f, e) == NV_OK,
            "%s", nv_errmsg());
    const int cls_bits = bits == 4 ? 8 : bits; /* Q4_0's classifier is Q6_K, as llama.cpp's: Q8_0 for these rows of 64 */
    if (e != NV_ENGINE_SCALAR)
        T_CHECK(nv_plan_quantized(q.plans[0].wq) == bits && nv_plan_quantized(q.plans[0].w2) == (half ? bits : 0) &&
                    nv_plan_quantized(q.cls_plan) == cls_bits && !nv_plan_quantized(f.plans[0].wq),
                "which plans are block-quantized, with how many bits");
    enum { N = 40 };
    int toks[N];
    for (int i = 0; i < N; i++) toks[i] = i ? 3 + (i * 7919) % (c->vocab_size - 3) : 1;
    const size_t V = (size_t)c->vocab_size;
    float *lb = malloc(N * V * 4), *lq = malloc(N * V * 4), *lf = malloc(N * V * 4);
    T_CHECK(lb && lq && lf && t_forward_logits(&b, toks, N, lb) && t_forward_logits(&q, toks, N, lq) && t_forward_logits(&f, toks, N, lf), "forward");
    T_CHECK(!memcmp(lq, lf, N * V * 4), "block-quantized plans differ from fp32 plans over the same weights");
    double dmax, lmax;
    const int agree = logits_agree(lb, lq, N, V, &dmax, &lmax);
    T_CHECK(bits >= 8 ? agree >= N * 9 / 10 && dmax < 0.05 * lmax : agree >= N / 2 && dmax < 0.5 * lmax,
            "%s against fp32: top-1 %d of %d, logits moved %g (largest %g)", type, agree, N, dmax, lmax);
    if (getenv("T_VERBOSE")) printf("    %s against fp32: top-1 %d of %d, logits moved %g (largest %g)\n", type, agree, N, dmax, lmax);

    /* loaded for inference (generate, serve): the quantized matrices get no fp32 copy unless a plan
       needs one, and the logits are the same */
    const size_t wq_n = (size_t)nv_config_q_dim(c) * c->dim;
    for (int variant = 0; variant < 3; variant++) {
        nv_model z;
        T_CHECK(nv_model_load_quantized(out, &z) == NV_OK, "%s", nv_errmsg());
        if (!z.params) break;
        int zero = 1;
        for (size_t i = 0; i < wq_n; i++) zero &= z.w.wq[i] == 0.0f;
        T_CHECK(zero && z.quant && z.quant[0].pending && z.quant[5].pending == half,
                "wq made up front, or w2 (F32 unless F16 or BF16) pending");
        if (variant == 0) { /* the fast engine: block-quantized plans, wq never made */
            uint64_t id = nv_prefix_model_id(&z, 16, NV_KV_F16);
            { /* the prefix cache tells models apart by their quantized matrices too: a file with one byte of wo's other */
                char *bytes = NULL;
                size_t len = 0;
                const size_t at = z.n_source_maps ? (size_t)(z.quant[3].raw - z.source_maps[0].data) + 7 : SIZE_MAX;
                T_CHECK(z.quant[3].raw && nv_file_read_all(out, &bytes, &len) == NV_OK && at < len, "wo's raw blocks");
                if (bytes && at < len) {
                    bytes[at] ^= 1;
                    nv_model y;
                    T_CHECK(nv_model_load_quantized(t_write("flipped.gguf", bytes, len), &y) == NV_OK, "%s", nv_errmsg());
                    T_CHECK(y.quant && nv_prefix_model_id(&y, 16, NV_KV_F16) != id, "a pending matrix is not part of the model identity");
                    nv_model_free(&y);
                }
                free(bytes);
            }
            if (half) { /* and the same 16-bit values read as fp16 or as bf16 are other weights */
                z.quant[3].h_bf16 ^= 1;
                T_CHECK(nv_prefix_model_id(&z, 16, NV_KV_F16) != id, "fp16 and bf16 sources of the same bits are one model");
                z.quant[3].h_bf16 ^= 1;
            }
            float *lz = malloc(N * V * 4);
            T_CHECK(nv_model_build_plans(&z, e) == NV_OK && lz && t_forward_logits(&z, toks, N, lz) && !memcmp(lz, lq, N * V * 4),
                    "logits differ when loaded for inference");
            free(lz);
            zero = 1;
            for (size_t i = 0; e != NV_ENGINE_SCALAR && i < wq_n; i++) zero &= z.w.wq[i] == 0.0f;
            T_CHECK(zero, "fp32 weights made although the plans are block-quantized");
            const nv_engine_id lo = nv_engine_best(); /* int8 or bf16 where this CPU has one */
            if (half && nv_engine_low_precision(lo)) {
                /* those engines make their own form of fp16 and bf16 values, one matrix at a time: the
                   model's fp32 weights stay unmade, and the logits are those of the same floats */
                float *lo_z = malloc(N * V * 4), *lo_f = malloc(N * V * 4);
                T_CHECK(nv_model_build_plans(&z, lo) == NV_OK && nv_model_build_plans(&f, lo) == NV_OK && lo_z && lo_f &&
                            !nv_plan_quantized(z.plans[0].wq) && nv_plan_engine(z.plans[0].wq) == lo &&
                            t_forward_logits(&z, toks, N, lo_z) && t_forward_logits(&f, toks, N, lo_f) && !memcmp(lo_z, lo_f, N * V * 4),
                        "%s on %s: logits differ from the same floats' (%s)", type, nv_engine_name(lo), nv_errmsg());
                zero = 1;
                for (size_t i = 0; i < wq_n; i++) zero &= z.w.wq[i] == 0.0f;
                T_CHECK(zero && z.quant[0].pending, "%s on %s: the fp32 weights were made for good", type, nv_engine_name(lo));
                free(lo_z), free(lo_f);
            }
            if (!half && nv_engine_int8(lo) && !nv_engine_int8_blocks(lo)) {
                /* plain AVX2: the int8 engine's block-quantized plans are the exact fp32 loop's */
                float *lo_z = malloc(N * V * 4);
                T_CHECK(nv_model_build_plans(&z, lo) == NV_OK && lo_z && nv_plan_quantized(z.plans[0].wq) == bits &&
                            !nv_engine_int8(nv_plan_engine(z.plans[0].wq)) && t_forward_logits(&z, toks, N, lo_z) && !memcmp(lo_z, lq, N * V * 4),
                        "%s on %s without a block loop: plans or logits differ from the fp32 engine's (%s)", type, nv_engine_name(lo), nv_errmsg());
                free(lo_z);
            } else if (!half && nv_engine_int8(lo)) {
                /* an int8 engine multiplies the block-quantized values by activations quantized per
                   block, the classifier's too: close to the fp32 plans over the same values */
                float *lo_z = malloc(N * V * 4);
                const int planned = nv_model_build_plans(&z, lo) == NV_OK && lo_z && nv_plan_quantized(z.plans[0].wq) == bits &&
                                    nv_engine_int8(nv_plan_engine(z.plans[0].wq)) && nv_plan_quantized(z.cls_plan) == cls_bits &&
                                    nv_engine_int8(nv_plan_engine(z.cls_plan)) && t_forward_logits(&z, toks, N, lo_z);
                T_CHECK(planned, "%s on %s: plans (%s)", type, nv_engine_name(lo), nv_errmsg());
                double moved = 0, largest = 0;
                const int same = planned ? logits_agree(lq, lo_z, N, V, &moved, &largest) : 0;
                T_CHECK(!planned || (same >= N * 9 / 10 && moved > 0 && moved < 0.05 * largest),
                        "%s on %s against fp32 plans of the same values: top-1 %d of %d, logits moved %g (largest %g)", type,
                        nv_engine_name(lo), same, N, moved, largest);
                if (getenv("T_VERBOSE"))
                    printf("    %s on %s against fp32 plans of the same values: top-1 %d of %d, logits moved %g (largest %g)\n", type,
                           nv_engine_name(lo), same, N, moved, largest);
                free(lo_z);
            }
        } else if (variant == 1) { /* the scalar engine reads fp32 weights: made exactly as a full load's */
            T_CHECK(nv_model_build_plans(&z, NV_ENGINE_SCALAR) == NV_OK && !z.quant[0].pending &&
                        !memcmp(z.w.wq, q.w.wq, wq_n * 4),
                    "fp32 weights made for the scalar engine differ from a full load's");
        } else { /* sources dropped before an fp32 plan needed them: a clear error, not zeros */
            nv_model_drop_quant_sources(&z);
            T_CHECK(nv_model_build_plans(&z, NV_ENGINE_SCALAR) == NV_EINVAL && strstr(nv_errmsg(), "dropped"),
                    "planning with dropped pending weights: %s", nv_errmsg());
        }
        nv_model_free(&z);
    }
    free(lb), free(lq), free(lf);
    nv_model_free(&b);
    nv_model_free(&q);
    nv_model_free(&f);
}
static void test_q8_0_export_and_quantized_plans(void) { export_and_quantized_plans("q8_0", 8); }

/* The Q4_0 writer on a block whose answer is known: the value of largest magnitude (-8) sets the
 * scale (1) and comes back exact, values round half up to a level (x + 8.5 truncated), a value past
 * +7 clamps to 7, and the second 16 values are the high nibbles (a swap would move them). */
static void test_q4_0_writer_known_block(void) {
    const char *bp = t_data("models/stories260K.bin");
    if (!bp) return;
    nv_model m;
    T_CHECK(nv_model_load(bp, &m) == NV_OK, "%s", nv_errmsg());
    if (!m.params) return;
    static const float x[32] = {-8, -7, 7, 0.4f, 0.5f, -0.5f, -0.6f, 7.9f, 3.25f, -3.5f, 1, 2, 3, 4, 5, 6,
                                -1, -2, -3, -4, -5, -6, 0, 0.49f, 6.5f, -7.5f, 1.5f, 2.5f, -2.5f, 0.1f, -0.1f, 5.5f};
    static const float want[32] = {-8, -7, 7, 0, 1, 0, -1, 7, 3, -3, 1, 2, 3, 4, 5, 6,
                                   -1, -2, -3, -4, -5, -6, 0, 0, 7, -7, 2, 3, -2, 0, 0, 6};
    memcpy(m.w.wq, x, sizeof x);
    const char *p = t_path("known_q4.gguf");
    T_CHECK(nv_gguf_save(&m, NULL, "known", p, NV_GGUF_Q4_0, NULL, NULL) == NV_OK, "%s", nv_errmsg());
    nv_model r;
    T_CHECK(nv_model_load(p, &r) == NV_OK, "%s", nv_errmsg());
    if (r.params)
        for (int j = 0; j < 32; j++) T_CHECK(r.w.wq[j] == want[j], "value %d: %g written, %g read back, want %g", j, (double)x[j], (double)r.w.wq[j], (double)want[j]);
    nv_model_free(&r);
    nv_model_free(&m);
}
static void test_q4_0_export_and_quantized_plans(void) { export_and_quantized_plans("q4_0", 4); }
static void test_f16_export_and_half_plans(void) { export_and_quantized_plans("f16", 16); }
static void test_bf16_export_and_half_plans(void) { export_and_quantized_plans("bf16", NV_QBITS_BF16); }

/* The k-quant writers (Q6_K, the Q4_K_M mix) and Q5_0 on a model whose rows are whole super-blocks
 * of 256: each tensor gets the type llama.cpp's Q4_K_M rule gives it (Q6_K for the classifier and
 * for attn_v / ffn_down in layers 0, 3, 6 and 7 of 8, Q4_K elsewhere), the file type says which
 * mix, and rows that are not whole super-blocks fall back (stories260K's rows of 64: Q4_K to Q5_0,
 * Q6_K to Q8_0; of 172, not whole blocks either: F32); read back, the weights' error is what the bits allow and
 * ordered by them (Q8_0 < Q6_K < Q5_0 < Q4_K < Q4_0, relative RMS); and block-quantized plans over
 * the sources give exactly the logits of fp32 plans over the dequantized weights. */
static double rel_rms(const float *a, const float *b, size_t n) {
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), s += (double)a[i] * a[i];
    return s > 0 ? sqrt(e / s) : 0;
}

static void test_kquant_writers(void) {
    nv_config c = {256, 512, 8, 4, 1, 64, 300, 64, 10000.0f, 1e-5f, 0, 0, 0, {0}, 0, NV_CONFIG_PLAIN}; /* kv heads 1: attn_k/v rows of 256, wo rows of 256 */
    nv_model m;
    if (!random_model(&m, &c, 21)) return;
    static const struct {
        const char *name;
        uint32_t type, file_type;
        double bound;
    } kinds[] = {{"q8_0", NV_GGUF_Q8_0, 7, 0.01},     {"q6_k", NV_GGUF_Q6_K, 18, 0.03},     {"q5_k_m", NV_GGUF_Q5_K, 17, 0.045},
                 {"q5_0", NV_GGUF_Q5_0, 8, 0.05},     {"q4_k_m", NV_GGUF_Q4_K, 15, 0.08},   {"q4_0", NV_GGUF_Q4_0, 2, 0.13},
                 {"q3_k_m", NV_GGUF_Q3_K, 12, 0.2},   {"q2_k", NV_GGUF_Q2_K, 10, 0.4},      {"iq4_xs", NV_GGUF_IQ4_XS, 30, 0.1},
                 {"iq4_nl", NV_GGUF_IQ4_NL, 25, 0.1},   {"q5_k_s", NV_GGUF_Q5_K_S, 16, 0.045}, {"q4_k_s", NV_GGUF_Q4_K_S, 14, 0.08},
                 {"q3_k_s", NV_GGUF_Q3_K_S, 11, 0.2},   {"q3_k_l", NV_GGUF_Q3_K_L, 13, 0.2},   {"q5_1", NV_GGUF_Q5_1, 9, 0.05},
                 {"q4_1", NV_GGUF_Q4_1, 3, 0.11}};
    enum { ORDERED = 8 }; /* the first eight: fewer bits, more error */
    enum { KINDS = (int)(sizeof kinds / sizeof kinds[0]) };
    double err_w1[KINDS] = {0}, err_emb[KINDS] = {0};
    for (int k = 0; k < KINDS; k++) {
        char path[700];
        snprintf(path, sizeof path, "%s/kq-%s.gguf", t_tmpdir(), kinds[k].name);
        T_CHECK(nv_gguf_save(&m, NULL, "kq", path, kinds[k].type, NULL, NULL) == NV_OK, "%s: %s", kinds[k].name, nv_errmsg());
        nv_gguf g;
        if (nv_gguf_open(path, &g) != NV_OK) {
            T_CHECK(0, "%s", nv_errmsg());
            continue;
        }
        const nv_gguf_kv *ft = nv_gguf_find(&g, "general.file_type");
        uint32_t v = 0;
        if (ft && ft->type == 4) memcpy(&v, ft->val, 4);
        T_CHECK(v == kinds[k].file_type, "%s: general.file_type %u", kinds[k].name, v);
        const int pure = kinds[k].type == NV_GGUF_Q8_0 || kinds[k].type == NV_GGUF_Q6_K || kinds[k].type == NV_GGUF_Q5_0 ||
                         kinds[k].type == NV_GGUF_Q4_0 || kinds[k].type == NV_GGUF_Q5_1 || kinds[k].type == NV_GGUF_Q4_1;
        if (!pure) {
            /* a mix: 12 Q4_K or 13 Q5_K, 14 Q6_K, 10 Q2_K, 11 Q3_K, 20 IQ4_NL, 23 IQ4_XS. llama.cpp's
             * rules for 8 layers and 4 query heads per key head (attn_v: Q6_K in layers 0, 3, 6, 7
             * under Q4_K_M/Q5_K_M, Q5_K in 0-1 then Q4_K under Q3_K_M, Q4_K under Q2_K, Q5_K under
             * the IQ4s; ffn_down: the same as attn_v under Q4_K_M/Q5_K_M, Q4_K under Q3_K_M, Q3_K
             * under Q2_K, Q5_K in layer 0 under the IQ4s; attn_output: Q4_K under Q3_K_M, Q3_K under Q2_K) */
            /* the _S and _L mixes (writer codes past 0xFF): Q5_K_S all Q5_K; Q4_K_S Q5_K for attn_v in
               layers 0-3 and ffn_down in layer 0; Q3_K_S all Q3_K; Q3_K_L Q5_K for attn_v, ffn_down and
               attn_output */
            const uint32_t code = kinds[k].type, sl_base = code == NV_GGUF_Q5_K_S ? 13u : code == NV_GGUF_Q4_K_S ? 12u : 11u;
            const uint32_t base = code > 0xFFu ? sl_base : code; /* else the writer's code is the mix's base tensor type */
            const int km = code == 12u || code == 13u, q3 = code == 11u, q2 = code == 10u; /* else IQ4_NL (20) or IQ4_XS (23) */
            for (int l = 0; l < 8; l++) {
                char name[64];
                const int more = l == 0 || l == 3 || l == 6 || l == 7;
                uint32_t want_v = km ? (more ? 14u : base) : q3 ? (l < 2 ? 13u : 12u) : q2 ? 12u : 13u;
                uint32_t want_d = km ? (more ? 14u : base) : q3 ? 12u : q2 ? 11u : l == 0 ? 13u : base;
                uint32_t want_o = q3 ? 12u : q2 ? 11u : base;
                if (code > 0xFFu) {
                    const int l3 = code == NV_GGUF_Q3_K_L, k4 = code == NV_GGUF_Q4_K_S;
                    want_v = l3 || (k4 && l < 4) ? 13u : base;
                    want_d = l3 || (k4 && l < 1) ? 13u : base;
                    want_o = l3 ? 13u : base;
                }
                snprintf(name, sizeof name, "blk.%d.attn_v.weight", l);
                const nv_gguf_tensor *tv = nv_gguf_tensor_find(&g, name);
                snprintf(name, sizeof name, "blk.%d.ffn_down.weight", l);
                const nv_gguf_tensor *td = nv_gguf_tensor_find(&g, name);
                snprintf(name, sizeof name, "blk.%d.attn_q.weight", l);
                const nv_gguf_tensor *tq = nv_gguf_tensor_find(&g, name);
                snprintf(name, sizeof name, "blk.%d.attn_output.weight", l);
                const nv_gguf_tensor *to = nv_gguf_tensor_find(&g, name);
                T_CHECK(tv && tv->type == want_v && td && td->type == want_d && tq && tq->type == base && to && to->type == want_o,
                        "%s layer %d: attn_v %u, ffn_down %u, attn_q %u, attn_output %u", kinds[k].name, l, tv ? tv->type : 99,
                        td ? td->type : 99, tq ? tq->type : 99, to ? to->type : 99);
            }
            const nv_gguf_tensor *to = nv_gguf_tensor_find(&g, "output.weight"), *te = nv_gguf_tensor_find(&g, "token_embd.weight");
            const nv_gguf_tensor *tn = nv_gguf_tensor_find(&g, "blk.2.attn_norm.weight");
            T_CHECK(to && to->type == 14u && te && te->type == base && tn && tn->type == 0u, "%s: output %u, token_embd %u, norm %u",
                    kinds[k].name, to ? to->type : 99, te ? te->type : 99, tn ? tn->type : 99);
        }
        if (kinds[k].type == NV_GGUF_Q5_1 || kinds[k].type == NV_GGUF_Q4_1 || kinds[k].type == NV_GGUF_Q5_0 ||
            kinds[k].type == NV_GGUF_Q4_0) { /* every matrix (24, 20, 22 or 18 bytes a block) but the classifier: Q6_K */
            const nv_gguf_tensor *tw = nv_gguf_tensor_find(&g, "blk.4.ffn_up.weight"), *to = nv_gguf_tensor_find(&g, "output.weight");
            const nv_gguf_tensor *te = nv_gguf_tensor_find(&g, "token_embd.weight");
            const uint32_t ty = kinds[k].type;
            const uint64_t per = ty == NV_GGUF_Q5_1 ? 24 : ty == NV_GGUF_Q4_1 ? 20 : ty == NV_GGUF_Q5_0 ? 22 : 18;
            T_CHECK(tw && tw->type == ty && tw->bytes == 512ull * 256 / 32 * per && to && to->type == 14u && te && te->type == ty,
                    "%s: ffn_up type %u, %llu bytes; output type %u, token_embd %u", kinds[k].name, tw ? tw->type : 99,
                    tw ? (unsigned long long)tw->bytes : 0ull, to ? to->type : 99, te ? te->type : 99);
        }
        if (kinds[k].type == NV_GGUF_Q6_K) {
            const nv_gguf_tensor *tw = nv_gguf_tensor_find(&g, "blk.4.ffn_up.weight");
            T_CHECK(tw && tw->type == 14u && tw->bytes == 512ull * 256 / 256 * 210, "Q6_K ffn_up: type %u, %llu bytes",
                    tw ? tw->type : 99, tw ? (unsigned long long)tw->bytes : 0ull);
        }
        nv_gguf_close(&g);
        nv_model r;
        T_CHECK(nv_model_load(path, &r) == NV_OK, "%s: %s", kinds[k].name, nv_errmsg());
        if (!r.params) continue;
        const size_t nw1 = (size_t)c.n_layers * c.hidden_dim * c.dim;
        err_w1[k] = rel_rms(m.w.w1, r.w.w1, nw1);
        err_emb[k] = rel_rms(m.w.tok_emb, r.w.tok_emb, (size_t)c.vocab_size * c.dim);
        T_CHECK(err_w1[k] > 0 && err_w1[k] < kinds[k].bound && err_emb[k] > 0 && err_emb[k] < kinds[k].bound,
                "%s: relative RMS error %g (w1), %g (token_embd)", kinds[k].name, err_w1[k], err_emb[k]);
        if (getenv("T_VERBOSE")) printf("    %s: relative RMS error w1 %.5f, token_embd %.5f\n", kinds[k].name, err_w1[k], err_emb[k]);
        /* the block-quantized plans of the file against fp32 plans over its dequantized weights */
        nv_model z;
        const nv_engine_id e = nv_engine_best_fp32();
        if (e != NV_ENGINE_SCALAR && nv_model_load_quantized(path, &z) == NV_OK) {
            enum { N = 12 };
            int toks[N];
            for (int i = 0; i < N; i++) toks[i] = (i * 37 + 1) % c.vocab_size;
            float *lz = malloc(N * 300 * 4), *lr = malloc(N * 300 * 4);
            T_CHECK(nv_model_build_plans(&z, e) == NV_OK && nv_plan_quantized(z.plans[2].w1) > 0 && nv_model_build_plans(&r, e) == NV_OK &&
                        lz && lr && t_forward_logits(&z, toks, N, lz) && t_forward_logits(&r, toks, N, lr) && !memcmp(lz, lr, N * 300 * 4),
                    "%s: block-quantized plans differ from fp32 plans over the same weights", kinds[k].name);
            nv_engines_init(NULL, 0);
            const nv_engine_id lo = nv_engine_best();
            if (nv_engine_int8_blocks(lo) && lz && lr) { /* (plain AVX2's int8 engine runs these plans as e does: checked above) */
                /* an int8 engine: the same values times activations quantized per block, every type
                   of every mix (2- to 8-bit values, offsets folded or kept, blocks of 16 and 32) */
                double moved = 0, largest = 0;
                T_CHECK(nv_model_build_plans(&z, lo) == NV_OK && nv_engine_int8(nv_plan_engine(z.plans[2].w1)) &&
                            t_forward_logits(&z, toks, N, lz),
                        "%s on %s: %s", kinds[k].name, nv_engine_name(lo), nv_errmsg());
                const int same = logits_agree(lr, lz, N, 300, &moved, &largest);
                T_CHECK(same >= N - 1 && moved < 0.05 * largest, "%s on %s against fp32 plans of the same values: top-1 %d of %d, logits moved %g (largest %g)",
                        kinds[k].name, nv_engine_name(lo), same, N, moved, largest);
                if (getenv("T_VERBOSE"))
                    printf("    %s on %s: top-1 %d of %d, logits moved %g (largest %g)\n", kinds[k].name, nv_engine_name(lo), same, N, moved, largest);
            }
            free(lz), free(lr);
            nv_model_free(&z);
        }
        nv_model_free(&r);
    }
    int ordered = 1;
    for (int k = 1; k < ORDERED; k++) ordered &= err_w1[k - 1] < err_w1[k];
    T_CHECK(ordered, "errors not ordered by bits: %g %g %g %g %g %g %g %g", err_w1[0], err_w1[1], err_w1[2], err_w1[3], err_w1[4],
            err_w1[5], err_w1[6], err_w1[7]);
    /* the IQ4 types' uneven levels fit these bell-shaped weights better than Q4_0's even ones */
    T_CHECK(err_w1[8] < err_w1[5] && err_w1[9] < err_w1[5], "IQ4_XS %g, IQ4_NL %g against Q4_0 %g", err_w1[8], err_w1[9], err_w1[5]);
    /* --pure: every matrix the mix's own type, the classifier and the raised layers too, under the
       mix's file type */
    static const struct {
        uint32_t type, tensor, file_type;
    } pures[] = {{NV_GGUF_Q4_K, 12u, 15}, {NV_GGUF_Q3_K_L, 11u, 13}, {NV_GGUF_Q4_0, 2u, 2}};
    for (size_t k = 0; k < sizeof pures / sizeof pures[0]; k++) {
        const char *path = t_path("kq-pure.gguf");
        nv_gguf g;
        if (nv_gguf_save(&m, NULL, "kq", path, pures[k].type | NV_GGUF_PURE, NULL, NULL) != NV_OK || nv_gguf_open(path, &g) != NV_OK) {
            T_CHECK(0, "%s", nv_errmsg());
            continue;
        }
        const char *names[] = {"output.weight", "token_embd.weight", "blk.0.attn_v.weight", "blk.0.ffn_down.weight", "blk.5.attn_output.weight"};
        for (size_t n = 0; n < sizeof names / sizeof names[0]; n++) {
            const nv_gguf_tensor *t = nv_gguf_tensor_find(&g, names[n]);
            T_CHECK(t && t->type == pures[k].tensor, "pure %u: %s %u", pures[k].type, names[n], t ? t->type : 99);
        }
        const nv_gguf_kv *ft = nv_gguf_find(&g, "general.file_type");
        uint32_t v = 0;
        if (ft && ft->type == 4) memcpy(&v, ft->val, 4);
        T_CHECK(v == pures[k].file_type, "pure %u: general.file_type %u", pures[k].type, v);
        nv_gguf_close(&g);
    }
    /* with an importance matrix, Q4_0 and Q5_0 give the first eighth's ffn_down (layer 0 of 8) Q4_1
       and Q5_1, as llama.cpp's guard does; the other layers keep the type */
    nv_imatrix im = {0};
    nv_imatrix_entry *ie;
    char iname[64];
    for (int l = 0; l < c.n_layers; l++) {
        snprintf(iname, sizeof iname, "blk.%d.ffn_down.weight", l);
        T_CHECK(nv_imatrix_add_entry(&im, "t", iname, strlen(iname), c.hidden_dim, 1, &ie) == NV_OK, "%s", nv_errmsg());
        for (int j = 0; j < c.hidden_dim; j++) ie->sum2[j] = 1.0 + (j % 7);
        ie->count[0] = 1;
    }
    static const uint32_t guarded[][2] = {{NV_GGUF_Q4_0, 3u}, {NV_GGUF_Q5_0, 7u}};
    for (int k = 0; k < 2; k++) {
        const char *path = t_path("kq-guard.gguf");
        nv_gguf g;
        if (nv_gguf_save(&m, NULL, "kq", path, guarded[k][0], NULL, &im) != NV_OK || nv_gguf_open(path, &g) != NV_OK) {
            T_CHECK(0, "%s", nv_errmsg());
            continue;
        }
        const nv_gguf_tensor *d0 = nv_gguf_tensor_find(&g, "blk.0.ffn_down.weight"), *d1 = nv_gguf_tensor_find(&g, "blk.1.ffn_down.weight");
        T_CHECK(d0 && d0->type == guarded[k][1] && d1 && d1->type == guarded[k][0], "type %u with an imatrix: ffn_down %u, then %u",
                guarded[k][0], d0 ? d0->type : 99, d1 ? d1->type : 99);
        nv_gguf_close(&g);
    }
    nv_imatrix_free(&im);
    nv_model_free(&m);
    const char *bp = t_data("models/stories260K.bin");
    nv_model s;
    if (!bp || nv_model_load(bp, &s) != NV_OK) return;
    const char *path = t_path("kq-260k.gguf");
    nv_gguf g;
    T_CHECK(nv_gguf_save(&s, NULL, "kq", path, NV_GGUF_Q4_K, NULL, NULL) == NV_OK && nv_gguf_open(path, &g) == NV_OK, "%s", nv_errmsg());
    const nv_gguf_tensor *tq = nv_gguf_tensor_find(&g, "blk.1.attn_q.weight"), *tv = nv_gguf_tensor_find(&g, "blk.4.attn_v.weight");
    const nv_gguf_tensor *te = nv_gguf_tensor_find(&g, "token_embd.weight"), *td = nv_gguf_tensor_find(&g, "blk.1.ffn_down.weight");
    T_CHECK(tq && tq->type == 6u && tv && tv->type == 8u && te && te->type == 8u && td && td->type == 0u,
            "fallbacks: attn_q %u (Q5_0), attn_v of layer 4 of 5 %u (Q8_0), the tied token_embd %u (Q8_0), ffn_down %u (F32)",
            tq ? tq->type : 99, tv ? tv->type : 99, te ? te->type : 99, td ? td->type : 99);
    nv_gguf_close(&g);
    path = t_path("kq5-260k.gguf"); /* Q5_K falls back to Q5_1 */
    T_CHECK(nv_gguf_save(&s, NULL, "kq", path, NV_GGUF_Q5_K, NULL, NULL) == NV_OK && nv_gguf_open(path, &g) == NV_OK, "%s", nv_errmsg());
    tq = nv_gguf_tensor_find(&g, "blk.1.attn_q.weight");
    T_CHECK(tq && tq->type == 7u, "Q5_K's fallback: attn_q %u (Q5_1)", tq ? tq->type : 99);
    nv_gguf_close(&g);
    nv_model r5;
    if (nv_model_load(path, &r5) == NV_OK) { /* Q5_1 within a step of 32 levels over each block's range */
        const size_t nq = (size_t)nv_config_q_dim(&s.config) * s.config.dim;
        int within = 1;
        for (size_t b0 = 0; b0 + 32 <= nq && within; b0 += 32) {
            float lo = s.w.wq[b0], hi = lo;
            for (int j = 1; j < 32; j++) lo = fminf(lo, s.w.wq[b0 + j]), hi = fmaxf(hi, s.w.wq[b0 + j]);
            for (int j = 0; j < 32; j++) within &= fabsf(s.w.wq[b0 + j] - r5.w.wq[b0 + j]) <= 0.51f * (hi - lo) / 31 + 1e-3f * (hi - lo);
        }
        T_CHECK(within, "Q5_1 values beyond half a step");
        nv_model_free(&r5);
    } else {
        T_CHECK(0, "%s", nv_errmsg());
    }
    nv_model_free(&s);
    /* nerve export --type q4_k_m / q6_k (any case) and the _S/_L mixes, and the file generates */
    const char *tp = t_data("models/tok512.bin");
    static const char *const types[] = {"q4_k_m", "Q6_K", "q5_0", "q5_k_m", "q4_k_s", "Q3_K_L", "q4_1"};
    for (int k = 0; tp && k < 7; k++) {
        char args[4200], out[700];
        snprintf(out, sizeof out, "%s/kq-cli-%d.gguf", t_tmpdir(), k);
        snprintf(args, sizeof args, "export %s -z %s -o %s --type %s", bp, tp, out, types[k]);
        T_CHECK(t_nerve(args) == 0, "export --type %s: %s", types[k], t_err);
        snprintf(args, sizeof args, "generate -m %s -n 24 -t 0", out);
        T_CHECK(t_nerve(args) == 0 && strlen(t_out) > 20, "generate from a %s file: %s", types[k], t_err);
        char want[32] = ", file type "; /* nerve info names the mix as llama.cpp does */
        for (size_t j = 0, at = strlen(want); types[k][j] && at + 1 < sizeof want; j++) want[at++] = (char)toupper((unsigned char)types[k][j]), want[at] = 0;
        snprintf(args, sizeof args, "info -m %s", out);
        T_CHECK(t_nerve(args) == 0 && strstr(t_out, want), "info of a %s file: %s", types[k], t_out);
    }
    /* --pure from the CLI: the classifier (the tied embedding) in Q4_0 too; refused beside an
       unquantized or non-GGUF output */
    if (!tp) return;
    char args[4200], out[700];
    snprintf(out, sizeof out, "%s/kq-cli-pure.gguf", t_tmpdir());
    snprintf(args, sizeof args, "export %s -z %s -o %s --type q4_0 --pure", bp, tp, out);
    T_CHECK(t_nerve(args) == 0, "export --pure: %s", t_err);
    nv_gguf g2;
    if (nv_gguf_open(out, &g2) == NV_OK) {
        const nv_gguf_tensor *te = nv_gguf_tensor_find(&g2, "token_embd.weight");
        T_CHECK(te && te->type == 2u, "--pure: token_embd %u", te ? te->type : 99);
        nv_gguf_close(&g2);
    }
    snprintf(args, sizeof args, "export %s -z %s -o %s --type f16 --pure", bp, tp, out);
    T_CHECK(t_nerve(args) == 2 && strstr(t_err, "--pure"), "--pure with f16: %s", t_err);
    snprintf(args, sizeof args, "export %s -z %s -o %s/kq-pure-hf/ --type bf16 --pure", bp, tp, t_tmpdir());
    T_CHECK(t_nerve(args) == 2 && strstr(t_err, "--pure"), "--pure to a Hugging Face folder: %s", t_err);
}

/* nerve serve runs the chat template a GGUF model declares as Jinja, its markers naming the stops and
 * the tool calls' form, unless the template would lose what nerve's renderer of the template they name
 * keeps (a system message, tools, calls and results; a generation prompt that opens a think block) or
 * --no-jinja says so (then that renderer; one of nerve's own templates exactly: its renderer), unless
 * --chat-template says otherwise. */
static void test_serve_declared_template(void) {
    struct {
        const char *tmpl, *args, *want;
    } cases[] = {{"{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}", "", "chat template chatml"},
                 {"{{ bos_token }}[INST] {{ m.content }} [/INST]", "", "chat template llama2"},
                 {"{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}", "--no-jinja", "chat template chatml,"},
                 /* recognised but not runnable: the renderer, with a warning */
                 {"{% for m in messages %}<|im_start|>{{ m.role }", "", "chatml renderer instead"},
                 /* none nerve knows: run as Jinja; one that does not parse: plain, with a warning */
                 {"{{ m.content }}", "", "chat template the model's own, run as Jinja"},
                 {"{{ m.content ", "", "chat template plain"},
                 {"{{bos_token}}{{ns.system_prompt}}{{'<\xef\xbd\x9c" "User\xef\xbd\x9c>' + message['content']}}{{'<\xef\xbd\x9c"
                  "Assistant\xef\xbd\x9c>' + content}}", "", "chat template deepseek (reasoning to reasoning_content)"},
                 {"<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>", "--reasoning-format none", "chat template deepseek, KV"},
                 {"<|im_start|>", "--chat-template llama2", "chat template llama2"},
                 /* Phi-3-mini-4k-instruct's own */
                 {"{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + "
                  "'<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
                  "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}"
                  "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}",
                  "", "chat template phi3"},
                 /* Phi-4-mini-instruct's own */
                 {"{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and message['tools'] is not "
                  "none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + message['tools'] + '<|/tool|>' + "
                  "'<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% endif %}{% endfor %}"
                  "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}",
                  "", "chat template phi4-mini"},
                 /* Phi-4's own */
                 {"{% for message in messages %}{% if (message['role'] == 'system') %}{{'<|im_start|>system<|im_sep|>' + "
                  "message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'user') %}{{'<|im_start|>user<|im_sep|>' + "
                  "message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'assistant') %}{{'<|im_start|>assistant<|im_sep|>' + "
                  "message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ "
                  "'<|im_start|>assistant<|im_sep|>' }}{% endif %}",
                  "", "chat template phi4,"},
                 /* SmolLM3's (the lines of its system turn that tell it) */
                 {"{{- \"<|im_start|>system\\n\" -}}{{- \"## Metadata\\n\\n\" -}}{{- \"Knowledge Cutoff Date: June 2025\\n\" -}}"
                  "{{- \"Reasoning Mode: \" + reasoning_mode + \"\\n\\n\" -}}", "", "chat template smollm3"},
                 /* OLMo-2-1124-13B-Instruct's own (Tulu 3's): Phi-3's roles without <|end|> */
                 {"{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}{{ '<|system|>\n' + message['content'] + "
                  "'\n' }}{% elif message['role'] == 'user' %}{{ '<|user|>\n' + message['content'] + '\n' }}{% elif message['role'] == "
                  "'assistant' %}{% if not loop.last %}{{ '<|assistant|>\n'  + message['content'] + eos_token + '\n' }}{% else %}{{ "
                  "'<|assistant|>\n'  + message['content'] + eos_token }}{% endif %}{% endif %}{% if loop.last and add_generation_prompt "
                  "%}{{ '<|assistant|>\n' }}{% endif %}{% endfor %}",
                  "", "chat template olmo2"},
                 /* GLM's: OLMo 2's role markers, but a prompt and calls of its own: none nerve knows */
                 {"[gMASK]<sop>{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>", "", "run as Jinja, KV"},
                 /* exactly nerve's own template: its renderer (its ChatML shows Qwen3's switch, but a run trained on
                    it does not think: answers not read for reasoning) */
                 {NULL, "", "chat template chatml,"},
                 /* a ChatML template that shows a system message, tools, calls and results: run as it is written */
                 {"{%- if tools %}<|im_start|>system\n{{ tools | tojson }}<|im_end|>\n{% endif %}{%- for m in messages %}<|im_start|>"
                  "{{ m.role }}\n{{ m.content or '' }}{% for c in m.tool_calls or [] %}{{ c.function | tojson }}{% endfor %}<|im_end|>\n"
                  "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
                  "", "run as Jinja (stops and tool calls as chatml)"},
                 /* the same opening a think block in its generation prompt: run as written too, its answers read as
                    starting in the block */
                 {"{%- if tools %}<|im_start|>system\n{{ tools | tojson }}<|im_end|>\n{% endif %}{%- for m in messages %}<|im_start|>"
                  "{{ m.role }}\n{{ m.content or '' }}{% for c in m.tool_calls or [] %}{{ c.function | tojson }}{% endfor %}<|im_end|>\n"
                  "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}",
                  "", "run as Jinja (stops and tool calls as chatml) (reasoning to reasoning_content)"},
                 /* a Gemma-marked one that refuses a system message: Gemma's renderer (which folds it into the first turn) */
                 {"{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
                  "<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}<start_of_turn>model\n",
                  "", "takes no system message: nerve's gemma renderer instead"},
                 /* --jinja runs it all the same */
                 {"{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
                  "<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}<start_of_turn>model\n",
                  "--jinja", "run as Jinja (stops and tool calls as gemma)"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *p = t_path("chat.gguf");
        gguf_write_model_ex(p, "llama", 3, 1, cases[i].tmpl ? cases[i].tmpl : nv_chat_template_jinja(NV_CHAT_CHATML));
        server s;
        char args[200], name[32];
        snprintf(args, sizeof args, "--no-prefix-cache %s", cases[i].args);
        snprintf(name, sizeof name, "gguf-serve-%zu", i); /* a log of its own: the start waits for its line */
        T_CHECK(server_spawn(&s, name, NULL, NULL, p, NULL, args, 30), "server %zu did not start", i);
        char *log = read_log(&s);
        T_CHECK(log && strstr(log, cases[i].want), "case %zu: no '%s' in:\n%s", i, cases[i].want, log ? log : "");
        free(log);
        T_CHECK(server_stop_within(&s, 20) == 0, "server %zu did not exit 0", i);
    }
}

/* A model with QK-norm (GQA, RoPE base 1e6) is written as
 * llama.cpp's qwen3 architecture: its query and key rows in qwen3's RoPE order (pairs half a head
 * apart), checked here against an independent rotation of that kind; read back, every weight is
 * the same bit for bit; its Q8_0 export read for inference (quantized sources reordered, fp32
 * weights pending) gives the logits of the same file read in full. */
/* Largest difference between this project's heads (pairs 2i, 2i + 1) and a reference in the
 * qwen layout (pairs i, i + hd/2). */
static double neox_diff(const float *ours, const double *ref, int heads, int hd) {
    double worst = 0;
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < hd / 2; i++)
            for (int e = 0; e < 2; e++) worst = fmax(worst, fabs(ours[h * hd + 2 * i + e] - ref[h * hd + i + e * hd / 2]));
    return worst;
}

/* path read back gives m's config and weights. */
static void expect_same_model(const char *path, const nv_model *m, const char *what) {
    nv_model b;
    T_CHECK(nv_model_load(path, &b) == NV_OK, "%s", nv_errmsg());
    if (!b.params) return;
    T_CHECK(!memcmp(&b.config, &m->config, sizeof b.config) && b.n_params == m->n_params &&
                !memcmp(b.params, m->params, m->n_params * 4),
            "config or weights changed in the %s round trip", what);
    nv_model_free(&b);
}

static void test_qwen3_roundtrip(void) {
    nv_config c = {64, 80, 2, 4, 2, 16, 97, 64, 1000000.0f, 1e-6f, 0, 1, 0, {0}, 0, NV_CONFIG_PLAIN}; /* rows of 64: whole Q8_0 blocks */
    nv_model m;
    if (!random_model(&m, &c, 11)) return;
    const int L = c.n_layers, hd = c.head_dim, d = c.dim;
    for (int i = 0; i < L * hd; i++) m.w.q_norm[i] = 1.0f + 0.01f * (float)i, m.w.k_norm[i] = 0.5f + 0.02f * (float)(i % 7);
    char out[700], q8[700];
    snprintf(out, sizeof out, "%s/qwen3.gguf", t_tmpdir());
    snprintf(q8, sizeof q8, "%s/qwen3-q8.gguf", t_tmpdir());
    T_CHECK(nv_gguf_save(&m, NULL, "qk", out, NV_GGUF_F32, NULL, NULL) == NV_OK && nv_gguf_save(&m, NULL, "qk", q8, NV_GGUF_Q8_0, NULL, NULL) == NV_OK,
            "%s", nv_errmsg());
    nv_gguf g;
    if (nv_gguf_open(out, &g) == NV_OK) {
        size_t n = 0;
        const char *arch = nv_gguf_string(&g, "general.architecture", &n);
        T_CHECK(arch && n == 5 && !memcmp(arch, "qwen3", 5), "architecture");
        const nv_gguf_tensor *tq = nv_gguf_tensor_find(&g, "blk.1.attn_q.weight"), *tn = nv_gguf_tensor_find(&g, "blk.1.attn_q_norm.weight");
        const nv_gguf_tensor *tk = nv_gguf_tensor_find(&g, "blk.1.attn_k.weight");
        T_CHECK(tq && tn && tk && nv_gguf_tensor_find(&g, "blk.0.attn_k_norm.weight"), "qwen3 tensors missing");
        if (tq && tn && tk) {
            /* one query and key at position 37 of layer 1: the file's weights, QK-norm, then RoPE on pairs
               (i, i + hd/2) in double precision; this project's weights and path on pairs (2i, 2i + 1) */
            float x[64], qf[64], kf[32], cs[16];
            for (int j = 0; j < d; j++) x[j] = sinf(0.37f * (float)j);
            const float *wq = (const float *)tq->data, *wk = (const float *)tk->data, *qn = (const float *)tn->data;
            const float *kn = (const float *)nv_gguf_tensor_find(&g, "blk.1.attn_k_norm.weight")->data;
            double ref_q[64], ref_k[32];
            for (int side = 0; side < 2; side++) {
                const int heads = side ? c.n_kv_heads : c.n_heads;
                const float *w = side ? wk : wq, *nw = side ? kn : qn;
                double *r = side ? ref_k : ref_q;
                for (int h = 0; h < heads; h++) {
                    double v[16], ss = 0;
                    for (int i = 0; i < hd; i++) {
                        v[i] = 0;
                        for (int j = 0; j < d; j++) v[i] += (double)w[(size_t)(h * hd + i) * d + j] * x[j];
                        ss += v[i] * v[i];
                    }
                    const double inv = 1.0 / sqrt(ss / hd + (double)c.norm_eps);
                    for (int i = 0; i < hd; i++) v[i] *= inv * nw[i];
                    for (int i = 0; i < hd / 2; i++) {
                        const double a = 37.0 * pow((double)c.rope_theta, -2.0 * i / hd), c0 = cos(a), s0 = sin(a);
                        r[h * hd + i] = v[i] * c0 - v[i + hd / 2] * s0;
                        r[h * hd + i + hd / 2] = v[i] * s0 + v[i + hd / 2] * c0;
                    }
                }
            }
            for (int o = 0; o < 64; o++) {
                qf[o] = 0;
                for (int j = 0; j < d; j++) qf[o] += m.w.wq[((size_t)1 * 64 + o) * d + j] * x[j];
            }
            for (int o = 0; o < 32; o++) {
                kf[o] = 0;
                for (int j = 0; j < d; j++) kf[o] += m.w.wk[((size_t)1 * 32 + o) * d + j] * x[j];
            }
            float table[38 * 16];
            nv_rope_table(table, &c, 38);
            memcpy(cs, table + 37 * 16, sizeof cs);
            float vf[32] = {0};
            nv_qkv_finish(&m, 1, qf, kf, vf, cs, 37);
            const double worst = fmax(neox_diff(qf, ref_q, c.n_heads, hd), neox_diff(kf, ref_k, c.n_kv_heads, hd));
            T_CHECK(worst < 1e-4, "the file's rows under qwen3's RoPE differ from this project's by %g", worst);
        }
        nv_gguf_close(&g);
    } else {
        T_CHECK(0, "%s", nv_errmsg());
    }
    expect_same_model(out, &m, "qwen3");
    /* Q8_0: read for inference (sources reordered, fp32 pending) and read in full give the same logits */
    nv_model zq, zf;
    T_CHECK(nv_model_load_quantized(q8, &zq) == NV_OK && nv_model_load(q8, &zf) == NV_OK, "%s", nv_errmsg());
    if (zq.params && zf.params) {
        for (int i = 0; zf.quant && i <= c.n_layers * NV_LAYER_MATRICES; i++)
            free(zf.quant[i].q), free(zf.quant[i].s), free(zf.quant[i].o), free(zf.quant[i].h);
        free(zf.quant);
        zf.quant = NULL;
        const nv_engine_id e = nv_engine_best_fp32();
        enum { N = 20 };
        int toks[N];
        for (int i = 0; i < N; i++) toks[i] = (i * 31 + 1) % c.vocab_size;
        float *lq = malloc(N * 97 * 4), *lf = malloc(N * 97 * 4), *lm = malloc(N * 97 * 4);
        T_CHECK(nv_model_build_plans(&zq, e) == NV_OK && nv_model_build_plans(&zf, e) == NV_OK && nv_model_build_plans(&m, e) == NV_OK,
                "%s", nv_errmsg());
        T_CHECK(lq && lf && lm && t_forward_logits(&zq, toks, N, lq) && t_forward_logits(&zf, toks, N, lf) &&
                    t_forward_logits(&m, toks, N, lm),
                "forward");
        if (lq && lf && lm) {
            T_CHECK(!memcmp(lq, lf, N * 97 * 4), "Q8_0 qwen3 read for inference differs from the full read");
            double dmax = 0, lmax = 0;
            for (int i = 0; i < N * 97; i++) dmax = fmax(dmax, fabs((double)lm[i] - lf[i])), lmax = fmax(lmax, fabs((double)lm[i]));
            T_CHECK(dmax < 0.05 * lmax, "Q8_0 qwen3 logits moved %g (largest %g)", dmax, lmax);
        }
        free(lq), free(lf), free(lm);
    }
    nv_model_free(&zq);
    nv_model_free(&zf);
    nv_model_free(&m);
}

/* Llama 3.1+'s RoPE frequency factors (a rope_freqs tensor): written and read back with the
 * weights, the angles divided pair by pair (against double precision), used by the forward pass,
 * refused where they cannot be held or when malformed. */
static void test_rope_factors(void) {
    gguf_write_model(t_path("plain.gguf"), "llama", 3, 1);
    nv_model m;
    T_CHECK(nv_model_load(t_path("plain.gguf"), &m) == NV_OK, "%s", nv_errmsg());
    if (!m.params) return;
    const int hd = m.config.head_dim, half = hd / 2;
    T_CHECK(m.config.n_rope_factors == 0, "no factors without the tensor");
    /* linear scaling (llama.rope.scaling.type linear, factor 4): every frequency divided by 4, the
       same logits as a rope_freqs tensor of 4s */
    gw_rope_scale = 4.0f;
    gguf_write_model(t_path("linear.gguf"), "llama", 3, 1);
    gw_rope_scale = 0.0f;
    nv_model lin;
    T_CHECK(nv_model_load(t_path("linear.gguf"), &lin) == NV_OK, "%s", nv_errmsg());
    if (lin.params) {
        int fours = lin.config.n_rope_factors == half;
        for (int i = 0; fours && i < half; i++) fours = lin.config.rope_factors[i] == 4.0f;
        T_CHECK(fours, "linear scaling by 4: %d factors", lin.config.n_rope_factors);
        nv_model as_tensor;
        nv_model_alloc(&as_tensor, &m.config);
        memcpy(as_tensor.params, m.params, m.n_params * sizeof(float));
        as_tensor.config.n_rope_factors = half;
        for (int i = 0; i < half; i++) as_tensor.config.rope_factors[i] = 4.0f;
        T_CHECK(nv_gguf_save(&as_tensor, NULL, "fours", t_path("fours.gguf"), NV_GGUF_F32, NULL, NULL) == NV_OK, "%s", nv_errmsg());
        nv_model fours_m;
        T_CHECK(nv_model_load(t_path("fours.gguf"), &fours_m) == NV_OK, "%s", nv_errmsg());
        const int toks[3] = {1, 5, 7};
        nv_state s1, s2;
        if (fours_m.params && nv_model_build_plans(&lin, NV_ENGINE_SCALAR) == NV_OK &&
            nv_model_build_plans(&fours_m, NV_ENGINE_SCALAR) == NV_OK && nv_state_init(&s1, &lin.config, 4, GW_CTX, 0) == NV_OK &&
            nv_state_init(&s2, &fours_m.config, 4, GW_CTX, 0) == NV_OK) {
            const int r1 = nv_forward(&lin, &s1, toks, 3, 0), r2 = nv_forward(&fours_m, &s2, toks, 3, 0);
            T_CHECK(r1 == NV_OK && r2 == NV_OK &&
                        !memcmp(s1.logits, s2.logits, (size_t)lin.config.vocab_size * sizeof(float)),
                    "linear scaling differs from its rope_freqs form");
            nv_state_free(&s1);
            nv_state_free(&s2);
        }
        nv_model_free(&fours_m);
        nv_model_free(&as_tensor);
        nv_model_free(&lin);
    }
    nv_state plain_state;
    T_CHECK(nv_state_init(&plain_state, &m.config, 4, GW_CTX, 0) == NV_OK, "%s", nv_errmsg());
    m.config.n_rope_factors = half;
    for (int i = 0; i < half; i++) m.config.rope_factors[i] = i < half / 2 ? 1.0f : 1.0f + 7.0f * (float)i / (float)half;
    T_CHECK(nv_gguf_save(&m, NULL, "factors", t_path("factors.gguf"), NV_GGUF_F32, NULL, NULL) == NV_OK, "%s", nv_errmsg());
    nv_gguf g;
    if (nv_gguf_open(t_path("factors.gguf"), &g) == NV_OK) {
        const nv_gguf_tensor *t = nv_gguf_tensor_find(&g, "rope_freqs.weight");
        T_CHECK(t && t->type == 0 && t->n_dims == 1 && t->dims[0] == (uint64_t)half &&
                    !memcmp(t->data, m.config.rope_factors, (size_t)half * 4),
                "the file holds rope_freqs.weight as F32 [%d]", half);
        nv_gguf_close(&g);
    }
    nv_model b;
    T_CHECK(nv_model_load(t_path("factors.gguf"), &b) == NV_OK, "%s", nv_errmsg());
    if (b.params) {
        T_CHECK(b.config.n_rope_factors == half && !memcmp(b.config.rope_factors, m.config.rope_factors, (size_t)half * 4),
                "factors read back");
        float table[GW_CTX * 64];
        nv_rope_table(table, &b.config, GW_CTX);
        double worst = 0;
        for (int pos = 0; pos < GW_CTX; pos++)
            for (int i = 0; i < half; i++) {
                const double a = pos * pow((double)b.config.rope_theta, -2.0 * i / hd) / b.config.rope_factors[i];
                worst = fmax(worst, fabs(table[pos * hd + 2 * i] - cos(a)));
                worst = fmax(worst, fabs(table[pos * hd + 2 * i + 1] - sin(a)));
            }
        T_CHECK(worst < 1e-5, "angles off by %g", worst);
        /* the forward pass rotates by them: other logits than without, and a state made for the
           unscaled model is refused */
        nv_state st;
        T_CHECK(nv_model_build_plans(&b, NV_ENGINE_SCALAR) == NV_OK && nv_state_init(&st, &b.config, 4, GW_CTX, 0) == NV_OK,
                "%s", nv_errmsg());
        T_CHECK(nv_forward(&b, &plain_state, (const int[]){1}, 1, 0) == NV_EINVAL, "a state for other angles refused");
        T_CHECK(nv_model_build_plans(&m, NV_ENGINE_SCALAR) == NV_OK, "%s", nv_errmsg());
        m.config.n_rope_factors = 0;
        int toks[3] = {1, 3, 5}, differ = 0;
        for (int p = 0; p < 3; p++) {
            T_CHECK(nv_forward(&b, &st, &toks[p], 1, p) == NV_OK && nv_forward(&m, &plain_state, &toks[p], 1, p) == NV_OK, "%s",
                    nv_errmsg());
            if (p == 0) T_CHECK(!memcmp(st.logits, plain_state.logits, GW_VOCAB * 4), "position 0 does not rotate");
            else differ |= memcmp(st.logits, plain_state.logits, GW_VOCAB * 4) != 0;
        }
        T_CHECK(differ, "the factors change the logits past position 0");
        nv_state_free(&st);
        T_CHECK(nv_model_save_v1(&b, t_path("factors.bin")) == NV_EUNSUPPORTED && !nv_config_fits_v1(&b.config),
                "llama2.c v1 cannot hold them");
        nv_model_free(&b);
    }
    nv_state_free(&plain_state);
    /* malformed: one factor short, or a factor that is not positive */
    const char *src = t_path("factors.gguf");
    size_t size = 0;
    char *bytes = NULL;
    nv_file_read_all(src, &bytes, &size);
    size_t at = find(src, "rope_freqs.weight") + strlen("rope_freqs.weight");
    expect(variant(src, size, at + 4, (uint64_t[]){(uint64_t)half - 1}, 8), NV_EFORMAT, "rope_freqs one short");
    m.config.n_rope_factors = half;
    m.config.rope_factors[1] = 0.0f;
    T_CHECK(nv_config_validate(&m.config) == NV_EFORMAT, "a zero factor refused");
    m.config.rope_factors[1] = 1.0f;
    m.config.n_rope_factors = half - 1;
    T_CHECK(nv_config_validate(&m.config) == NV_EFORMAT, "a count other than head_dim / 2 refused");
    free(bytes);
    nv_model_free(&m);
}

/* qwen2: llama with biases on the query, key and value projections, rotating halves of a head like
 * qwen3. Written and read back (rows and biases reordered both ways) with the same weights; one
 * token's query, key and value at position 37 as the file's tensors give them in double precision
 * (projection + bias, then rotation of pairs (i, i + hd/2)) against this project's path; llama2.c
 * export refuses the model; fine-tuning it trains the biases and writes a qwen2 model.gguf. */
static void test_qwen2_bias(void) {
    nv_config c = {64, 80, 2, 4, 2, 16, 97, 64, 1000000.0f, 1e-6f, 1, 0, 0, {0}, 1, NV_CONFIG_PLAIN};
    nv_model m;
    if (!random_model(&m, &c, 12)) return;
    const int L = c.n_layers, hd = c.head_dim, d = c.dim, qd = nv_config_q_dim(&c), kvd = nv_config_kv_dim(&c);
    for (int i = 0; i < L * qd; i++) m.w.bq[i] = 0.1f * sinf(0.7f * (float)i);
    for (int i = 0; i < L * kvd; i++) m.w.bk[i] = 0.1f * cosf(0.3f * (float)i), m.w.bv[i] = 0.05f * (float)(i % 5);
    char out[700];
    snprintf(out, sizeof out, "%s/qwen2.gguf", t_tmpdir());
    T_CHECK(nv_gguf_save(&m, NULL, "q2", out, NV_GGUF_F32, NULL, NULL) == NV_OK, "%s", nv_errmsg());
    nv_gguf g;
    if (nv_gguf_open(out, &g) == NV_OK) {
        size_t n = 0;
        const char *arch = nv_gguf_string(&g, "general.architecture", &n);
        T_CHECK(arch && n == 5 && !memcmp(arch, "qwen2", 5) && nv_gguf_find(&g, "qwen2.embedding_length"), "architecture");
        const nv_gguf_tensor *tq = nv_gguf_tensor_find(&g, "blk.1.attn_q.weight"), *tk = nv_gguf_tensor_find(&g, "blk.1.attn_k.weight");
        const nv_gguf_tensor *tv = nv_gguf_tensor_find(&g, "blk.1.attn_v.weight"), *bq = nv_gguf_tensor_find(&g, "blk.1.attn_q.bias");
        const nv_gguf_tensor *bk = nv_gguf_tensor_find(&g, "blk.1.attn_k.bias"), *bv = nv_gguf_tensor_find(&g, "blk.1.attn_v.bias");
        T_CHECK(tq && tk && tv && bq && bk && bv && bq->dims[0] == (uint64_t)qd && bk->dims[0] == (uint64_t)kvd, "qwen2 tensors");
        if (tq && tk && tv && bq && bk && bv) {
            float x[64], qf[64], kf[32], vf[32], cs[16];
            for (int j = 0; j < d; j++) x[j] = cosf(0.23f * (float)j);
            double ref_q[64], ref_k[32], ref_v[32];
            const struct {
                const nv_gguf_tensor *w, *b;
                int heads, rotate;
                double *r;
            } sides[] = {{tq, bq, c.n_heads, 1, ref_q}, {tk, bk, c.n_kv_heads, 1, ref_k}, {tv, bv, c.n_kv_heads, 0, ref_v}};
            for (int sd = 0; sd < 3; sd++) {
                const float *w = (const float *)sides[sd].w->data, *b = (const float *)sides[sd].b->data;
                for (int h = 0; h < sides[sd].heads; h++) {
                    double v[16];
                    for (int i = 0; i < hd; i++) {
                        v[i] = b[h * hd + i];
                        for (int j = 0; j < d; j++) v[i] += (double)w[(size_t)(h * hd + i) * d + j] * x[j];
                    }
                    for (int i = 0; i < hd / 2; i++) {
                        const double a = 37.0 * pow((double)c.rope_theta, -2.0 * i / hd), c0 = sides[sd].rotate ? cos(a) : 1,
                                     s0 = sides[sd].rotate ? sin(a) : 0;
                        sides[sd].r[h * hd + i] = v[i] * c0 - v[i + hd / 2] * s0;
                        sides[sd].r[h * hd + i + hd / 2] = v[i] * s0 + v[i + hd / 2] * c0;
                    }
                }
            }
            for (int o = 0; o < qd; o++) {
                qf[o] = 0;
                for (int j = 0; j < d; j++) qf[o] += m.w.wq[((size_t)qd + o) * d + j] * x[j];
            }
            for (int o = 0; o < kvd; o++) {
                kf[o] = vf[o] = 0;
                for (int j = 0; j < d; j++) kf[o] += m.w.wk[((size_t)kvd + o) * d + j] * x[j], vf[o] += m.w.wv[((size_t)kvd + o) * d + j] * x[j];
            }
            float table[38 * 16];
            nv_rope_table(table, &c, 38);
            memcpy(cs, table + 37 * 16, sizeof cs);
            nv_qkv_finish(&m, 1, qf, kf, vf, cs, 37);
            double worst = fmax(neox_diff(qf, ref_q, c.n_heads, hd), neox_diff(kf, ref_k, c.n_kv_heads, hd));
            for (int o = 0; o < kvd; o++) worst = fmax(worst, fabs(vf[o] - ref_v[o]));
            T_CHECK(worst < 1e-4, "the file's projections and biases under qwen2's RoPE differ from this project's by %g", worst);
        }
        nv_gguf_close(&g);
    } else {
        T_CHECK(0, "%s", nv_errmsg());
    }
    expect_same_model(out, &m, "qwen2");
    T_CHECK(nv_model_save_v1(&m, t_path("qwen2.bin")) == NV_EUNSUPPORTED, "llama2.c v1 cannot hold biases");
    /* a llama2.c shard of token ids within the vocabulary */
    FILE *f = fopen(t_path("q2.bin"), "wb");
    for (int i = 0; f && i < 4096; i++) fwrite(&(uint16_t){(uint16_t)(i * 7 % 97)}, 2, 1, f);
    if (f) fclose(f);
    char args[4200];
    /* fine-tuning it: the biases learn, the run ends with a qwen2 model.gguf */
    snprintf(args, sizeof args, "train --init-from %s --data %s --steps 3 --batch 2 --seq 8 --lr 1e-2 --quiet --out %s/q2run", out,
             t_path("q2.bin"), t_tmpdir());
    T_CHECK(t_nerve(args) == 0, "fine-tuning a qwen2 model: %s", t_err);
    char trained[800];
    snprintf(trained, sizeof trained, "%s/q2run/model.gguf", t_tmpdir());
    nv_model tr;
    T_CHECK(nv_model_load(trained, &tr) == NV_OK, "%s", nv_errmsg());
    if (tr.params) {
        T_CHECK(tr.config.qkv_bias && memcmp(tr.w.bq, m.w.bq, (size_t)L * qd * 4) && memcmp(tr.w.bv, m.w.bv, (size_t)L * kvd * 4),
                "the trained model has biases, changed by training");
        nv_model_free(&tr);
    }
    nv_model_free(&m);
}

/* phi3 files (Phi-3-mini and -medium): a model written as llama and rewritten as phi3 (fused
 * tensors, qwen's rotation order) reads back as the very same model in F32, Q8_0 and Q6_K (every
 * fp32 weight the same bits), and read for inference from its quantized sources (int8 plans, the
 * fused tensors' rows taken in place) gives the llama file's logits bit for bit; a fused tensor
 * of the wrong size is refused with one line. */
static void test_phi3(void) {
    nv_config c = {256, 256, 2, 4, 2, 64, 97, 64, 10000.0f, 1e-5f, 0, 0, 0, {0}, 0, NV_CONFIG_PLAIN}; /* rows of a Q6_K super-block */
    nv_model m;
    if (!random_model(&m, &c, 21)) return;
    nv_engines_init(NULL, 0); /* probed before the best engine is asked for (this test may run alone) */
    const struct {
        uint32_t type;
        const char *name;
    } types[] = {{NV_GGUF_F32, "f32"}, {NV_GGUF_Q8_0, "q8_0"}, {NV_GGUF_Q6_K, "q6_k"}};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        char src[700], dst[700];
        snprintf(src, sizeof src, "%s/phi3-src-%s.gguf", t_tmpdir(), types[ti].name);
        snprintf(dst, sizeof dst, "%s/phi3-%s.gguf", t_tmpdir(), types[ti].name);
        T_CHECK(nv_gguf_save(&m, NULL, "p3", src, types[ti].type, NULL, NULL) == NV_OK, "%s", nv_errmsg());
        T_CHECK(gw_phi3_from(src, dst, &c, 0), "%s: writing the phi3 file", types[ti].name);
        nv_model a, b;
        T_CHECK(nv_model_load(src, &a) == NV_OK && nv_model_load(dst, &b) == NV_OK, "%s: %s", types[ti].name, nv_errmsg());
        if (a.params && b.params)
            T_CHECK(!memcmp(&a.config, &b.config, sizeof a.config) && a.n_params == b.n_params && !memcmp(a.params, b.params, a.n_params * 4),
                    "%s: the phi3 file's config or weights differ from the llama file's", types[ti].name);
        nv_model_free(&a);
        nv_model_free(&b);
        T_CHECK(nv_model_load_quantized(src, &a) == NV_OK && nv_model_load_quantized(dst, &b) == NV_OK, "%s: %s", types[ti].name,
                nv_errmsg());
        if (a.params && b.params) {
            const nv_engine_id e = nv_engine_best();
            enum { N = 12 };
            int toks[N];
            for (int i = 0; i < N; i++) toks[i] = (i * 37 + 5) % c.vocab_size;
            float *la = malloc(N * 97 * 4), *lb = malloc(N * 97 * 4);
            T_CHECK(nv_model_build_plans(&a, e) == NV_OK && nv_model_build_plans(&b, e) == NV_OK, "%s", nv_errmsg());
            T_CHECK(la && lb && t_forward_logits(&a, toks, N, la) && t_forward_logits(&b, toks, N, lb), "forward");
            if (la && lb) T_CHECK(!memcmp(la, lb, N * 97 * 4), "%s on %s: the phi3 file's logits differ from the llama file's", types[ti].name, nv_engine_name(e));
            free(la), free(lb);
        }
        nv_model_free(&a);
        nv_model_free(&b);
    }
    const char *src = t_path("phi3-src-q8_0.gguf"), *bad = t_path("phi3-bad.gguf");
    nv_model x;
    T_CHECK(gw_phi3_from(src, bad, &c, 1), "writing a phi3 file without value rows");
    T_CHECK(nv_model_load(bad, &x) == NV_EFORMAT && strstr(nv_errmsg(), "attn_qkv") && strstr(nv_errmsg(), "expected 512 rows"),
            "a short attn_qkv: %s", nv_errmsg());
    nv_model_free(&m);
}

/* Phi-3.5's LongRoPE (tests/gguf_write.h's variants): the short divisors below the original context
 * and, when the model's context goes past it, the long ones there (variant 2; variant 3's context is
 * the original one: the short set alone), and the attention factor on every cos and sin, against
 * double precision; a sequence within the original context turns as a model of the short set alone;
 * applied (the logits move from the plain model's); exported as GGUF (phi3 with both sets when there
 * are two; else llama: a rope_freqs tensor and rope.scaling.attn_factor, which llama.cpp applies to
 * any model) it reads back with the same config and logits; a checkpoint header keeps it all; a
 * context that needs the missing set is refused. */
static void test_phi3_longrope(void) {
    nv_config c = {64, 64, 1, 4, 2, 16, 97, 64, 10000.0f, 1e-5f, 0, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    nv_model m;
    if (!random_model(&m, &c, 22)) return;
    char src[700]; /* t_path's buffers rotate */
    snprintf(src, sizeof src, "%s", t_path("lr-src.gguf"));
    T_CHECK(nv_gguf_save(&m, NULL, "lr", src, NV_GGUF_F32, NULL, NULL) == NV_OK, "%s", nv_errmsg());
    enum { N = 12 };
    int toks[N];
    for (int i = 0; i < N; i++) toks[i] = (i * 29 + 3) % c.vocab_size;
    float *plain = malloc(N * 97 * 4), *la = malloc(N * 97 * 4), *lb = malloc(N * 97 * 4);
    const nv_engine_id e = nv_engine_best_fp32();
    T_CHECK(plain && la && lb && nv_model_build_plans(&m, e) == NV_OK && t_forward_logits(&m, toks, N, plain), "%s", nv_errmsg());
    for (int variant = 2; variant <= 3 && plain && la && lb; variant++) {
        const char *dst = t_path("lr.gguf");
        nv_model a, b;
        T_CHECK(gw_phi3_from(src, dst, &c, variant), "writing LongRoPE variant %d", variant);
        T_CHECK(nv_model_load(dst, &a) == NV_OK, "variant %d: %s", variant, nv_errmsg());
        if (!a.params) continue;
        const nv_config *ac = &a.config;
        int factors = ac->n_rope_factors == 8 && ac->rope_attn == 1.25f;
        for (int i = 0; factors && i < 8; i++) factors = ac->rope_factors[i] == (variant == 2 ? 1.0f + (float)i / 2.0f : 1.0f + (float)i / 100.0f);
        T_CHECK(factors, "variant %d: %d factors, attention factor %g", variant, ac->n_rope_factors, (double)ac->rope_attn);
        float table[38 * 16];
        nv_rope_table(table, ac, 38);
        double worst = 0;
        for (int i = 0; i < 8; i++) {
            const double f = variant == 2 ? 1.0 + i / 2.0 : 1.0 + i / 100.0, angle = 37.0 * pow(10000.0, -2.0 * i / 16) / f;
            worst = fmax(worst, fmax(fabs(table[37 * 16 + 2 * i] - 1.25 * cos(angle)), fabs(table[37 * 16 + 2 * i + 1] - 1.25 * sin(angle))));
        }
        T_CHECK(worst < 1e-5, "variant %d: the rotation differs from double precision by %g", variant, worst);
        /* below the original context (16 in variant 2) the short set: the first 16 positions turn as a
           model of the short divisors alone, which is all variant 3 has */
        T_CHECK(ac->longrope_orig == (variant == 2 ? 16 : 0), "variant %d: the short set ends at %d", variant, ac->longrope_orig);
        worst = 0;
        for (int i = 0; i < 8; i++) {
            const double angle = 9.0 * pow(10000.0, -2.0 * i / 16) / (1.0 + i / 100.0);
            worst = fmax(worst, fmax(fabs(table[9 * 16 + 2 * i] - 1.25 * cos(angle)), fabs(table[9 * 16 + 2 * i + 1] - 1.25 * sin(angle))));
        }
        T_CHECK(worst < 1e-5, "variant %d: position 9 does not turn by the short set (%g)", variant, worst);
        T_CHECK(nv_model_build_plans(&a, e) == NV_OK && t_forward_logits(&a, toks, N, la) && memcmp(la, plain, N * 97 * 4),
                "variant %d: LongRoPE left the logits as they were", variant);
        if (variant == 2) { /* a sequence within the original context: the logits of the short set alone */
            nv_model s1;
            T_CHECK(nv_model_load(dst, &s1) == NV_OK, "%s", nv_errmsg());
            memcpy(s1.config.rope_factors, s1.config.rope_factors_short, sizeof s1.config.rope_factors);
            s1.config.longrope_orig = 0;
            memset(s1.config.rope_factors_short, 0, sizeof s1.config.rope_factors_short);
            T_CHECK(nv_model_build_plans(&s1, e) == NV_OK && t_forward_logits(&s1, toks, N, lb) && !memcmp(la, lb, N * 97 * 4),
                    "the first %d positions differ from the short set's", N);
            nv_model_free(&s1);
        }
        char args[900];
        snprintf(args, sizeof args, "info -m %s", dst);
        T_CHECK(t_nerve(args) == 0 && strstr(t_out, "rope:     theta 10000, 8 frequency divisors 1..") && strstr(t_out, "cos and sin x 1.25") &&
                    (variant != 2 || strstr(t_out, "(1..1.07 below position 16)")),
                "variant %d: nerve info says: %s", variant, t_out);
        const char *out = t_path("lr-export.gguf");
        T_CHECK(nv_gguf_save(&a, NULL, "lr", out, NV_GGUF_F32, NULL, NULL) == NV_OK && nv_model_load(out, &b) == NV_OK, "%s", nv_errmsg());
        if (b.params) {
            T_CHECK(!memcmp(&b.config, ac, sizeof b.config), "variant %d: the export's config differs", variant);
            T_CHECK(nv_model_build_plans(&b, e) == NV_OK && t_forward_logits(&b, toks, N, lb) && !memcmp(la, lb, N * 97 * 4),
                    "variant %d: the export's logits differ", variant);
            nv_model_free(&b);
        }
        nv_ckpt_header h;
        nv_config back;
        memset(&h, 0, sizeof h);
        nv_ckpt_header_set_config(&h, ac);
        nv_ckpt_header_get_config(&h, &back);
        T_CHECK(!memcmp(&back, ac, sizeof back), "variant %d: a checkpoint header does not keep the config", variant);
        nv_model_free(&a);
    }
    /* the attention factor alone (any model's rope.scaling.attn_factor): GGUF keeps it, llama2.c cannot */
    m.config.rope_attn = 1.125f;
    nv_model y;
    T_CHECK(nv_gguf_save(&m, NULL, "attn", t_path("attn.gguf"), NV_GGUF_F32, NULL, NULL) == NV_OK &&
                nv_model_load(t_path("attn.gguf"), &y) == NV_OK && y.config.rope_attn == 1.125f && !y.config.n_rope_factors,
            "the attention factor alone: %s", nv_errmsg());
    nv_model_free(&y);
    T_CHECK(nv_model_save_v1(&m, t_path("attn.bin")) == NV_EUNSUPPORTED && strstr(nv_errmsg(), "attention factor"), "%s", nv_errmsg());
    m.config.rope_attn = 0.0f;
    nv_model x;
    T_CHECK(gw_phi3_from(src, t_path("lr-bad.gguf"), &c, 4), "writing LongRoPE without short factors");
    T_CHECK(nv_model_load(t_path("lr-bad.gguf"), &x) == NV_EFORMAT && strstr(nv_errmsg(), "rope_factors_short.weight"), "%s", nv_errmsg());
    free(plain), free(la), free(lb);
    nv_model_free(&m);
}

/* nv_rope_rows_reorder against the definition: transformers' rotate_half turns values (i, i + rot/2)
 * of the first rot of a head, this project's RoPE values (2i, 2i + 1); the rest of a head stays. */
static void test_rope_rows_order(void) {
    uint8_t rows[2][16];
    for (int i = 0; i < 16; i++) rows[0][i] = rows[1][i] = (uint8_t)i;
    T_CHECK(nv_rope_rows_reorder(rows[0], 1, 2, 8, 4, 1) == NV_OK && nv_rope_rows_reorder(rows[1], 1, 2, 8, 8, 1) == NV_OK, "%s", nv_errmsg());
    static const uint8_t part[16] = {0, 2, 1, 3, 4, 5, 6, 7, 8, 10, 9, 11, 12, 13, 14, 15};
    static const uint8_t whole[16] = {0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15};
    T_CHECK(!memcmp(rows[0], part, 16) && !memcmp(rows[1], whole, 16), "half order: %d %d %d %d | %d %d %d %d", rows[0][0], rows[0][1],
            rows[0][2], rows[0][3], rows[1][0], rows[1][1], rows[1][2], rows[1][3]);
    T_CHECK(nv_rope_rows_reorder(rows[0], 1, 2, 8, 4, 0) == NV_OK && nv_rope_rows_reorder(rows[1], 1, 2, 8, 8, 0) == NV_OK, "back");
    for (int i = 0; i < 16; i++) T_CHECK(rows[0][i] == i && rows[1][i] == i, "row %d back at %d, %d", i, rows[0][i], rows[1][i]);
}

/* Phi-4-mini's partial rotation in a phi3 file (rope.dimension_count 12 of a head of 16, LongRoPE's
 * six divisors): the model reads back with the first 12 query and key rows of a head in this
 * project's order and the rest as they were (every fp32 weight the llama file's, in F32 and Q8_0),
 * its RoPE table turns those pairs alone (the others cos 1 and sin 0, untempered), read for inference
 * from its Q8_0 source it gives the llama file's model's logits under the same config bit for bit;
 * exported as GGUF it is phi3 again (fused tensors, the divisors as both LongRoPE sets) and reads back
 * as the same model (Q8_0: the same blocks), with a SentencePiece vocabulary only if it has Phi-3's
 * white-space rule (which the architecture implies); as a Hugging Face folder it is Phi-3's and reads
 * back the same; llama2.c's format refuses it and a checkpoint header keeps it. */
static void test_phi4_mini(void) {
    nv_config c = {64, 64, 2, 4, 2, 16, 97, 64, 10000.0f, 1e-5f, 0, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    nv_model m;
    if (!random_model(&m, &c, 23)) return;
    nv_engines_init(NULL, 0); /* probed before the best engine is asked for (this test may run alone) */
    nv_config pc = c; /* what the phi3 file says */
    pc.rope_dim = 12;
    const uint32_t types[2] = {NV_GGUF_F32, NV_GGUF_Q8_0};
    enum { N = 12 };
    int toks[N];
    for (int i = 0; i < N; i++) toks[i] = (i * 31 + 7) % c.vocab_size;
    for (int ti = 0; ti < 2; ti++) {
        char src[700], dst[700];
        snprintf(src, sizeof src, "%s/p4-src-%d.gguf", t_tmpdir(), ti);
        snprintf(dst, sizeof dst, "%s/p4-%d.gguf", t_tmpdir(), ti);
        T_CHECK(nv_gguf_save(&m, NULL, "p4", src, types[ti], NULL, NULL) == NV_OK && gw_phi3_from(src, dst, &pc, 2), "%s", nv_errmsg());
        nv_model a, b;
        T_CHECK(nv_model_load(src, &a) == NV_OK && nv_model_load(dst, &b) == NV_OK, "type %d: %s", ti, nv_errmsg());
        if (!a.params || !b.params) return;
        const nv_config *bc = &b.config;
        int factors = bc->rope_dim == 12 && bc->n_rope_factors == 6 && bc->rope_attn == 1.25f;
        for (int i = 0; factors && i < 6; i++) factors = bc->rope_factors[i] == 1.0f + (float)i / 2.0f;
        T_CHECK(factors, "type %d: RoPE on %d values, %d divisors, attention factor %g", ti, bc->rope_dim, bc->n_rope_factors, (double)bc->rope_attn);
        T_CHECK(a.n_params == b.n_params && !memcmp(a.params, b.params, a.n_params * 4), "type %d: the phi3 file's weights differ", ti);
        if (ti == 1) { /* both files written: the Q8_0 one read to fp32 */
            float table[30 * 16];
            nv_rope_table(table, bc, 30);
            double worst = 0;
            for (int i = 0; i < 8; i++) {
                const double angle = 29.0 * pow(10000.0, -2.0 * i / 12) / (1.0 + i / 2.0);
                const double want_c = i < 6 ? 1.25 * cos(angle) : 1.0, want_s = i < 6 ? 1.25 * sin(angle) : 0.0;
                worst = fmax(worst, fmax(fabs(table[29 * 16 + 2 * i] - want_c), fabs(table[29 * 16 + 2 * i + 1] - want_s)));
            }
            T_CHECK(worst < 1e-5, "the rotation differs from double precision by %g", worst);
            /* written back as phi3 (fused, both LongRoPE sets the one it runs), F32 and Q8_0: the same
               model; a Q8_0 file's blocks are the ones the rewritten Q8_0 file holds */
            for (int wt = 0; wt < 2; wt++) {
                char out[700];
                snprintf(out, sizeof out, "%s/p4-out-%d.gguf", t_tmpdir(), wt);
                nv_model r;
                T_CHECK(nv_gguf_save(&b, NULL, "p4", out, types[wt], NULL, NULL) == NV_OK && nv_model_load(out, &r) == NV_OK, "%s", nv_errmsg());
                nv_gguf g;
                T_CHECK(nv_gguf_open(out, &g) == NV_OK, "%s", nv_errmsg());
                const nv_gguf_tensor *qkv = nv_gguf_tensor_find(&g, "blk.1.attn_qkv.weight"), *up = nv_gguf_tensor_find(&g, "blk.1.ffn_up.weight");
                T_CHECK(qkv && up && qkv->dims[1] == 128 && up->dims[1] == 128 && !nv_gguf_tensor_find(&g, "blk.1.attn_q.weight") &&
                            !nv_gguf_tensor_find(&g, "blk.1.ffn_gate.weight") && nv_gguf_tensor_find(&g, "rope_factors_short.weight"),
                        "the file's tensors are not phi3's");
                if (wt == 1 && qkv) { /* the same blocks as the phi3 file made from llama's Q8_0 */
                    nv_gguf h;
                    char q8[700];
                    snprintf(q8, sizeof q8, "%s/p4-1.gguf", t_tmpdir());
                    T_CHECK(nv_gguf_open(q8, &h) == NV_OK, "%s", nv_errmsg());
                    const nv_gguf_tensor *hq = nv_gguf_tensor_find(&h, "blk.1.attn_qkv.weight");
                    T_CHECK(hq && hq->bytes == qkv->bytes && !memcmp(hq->data, qkv->data, qkv->bytes), "attn_qkv's Q8_0 blocks differ");
                    nv_gguf_close(&h);
                }
                nv_gguf_close(&g);
                if (r.params)
                    T_CHECK(!memcmp(&r.config, bc, sizeof r.config) && (wt || !memcmp(r.params, b.params, b.n_params * 4)),
                            "type %d: the phi3 export reads back as another model", wt);
                nv_model_free(&r);
            }
            /* a Hugging Face folder: Phi-3's (fused projections, partial_rotary_factor, LongRoPE's
               sets and attention factor), the same model back; llama2.c has no form for it */
            nv_model hm;
            char hf[700];
            snprintf(hf, sizeof hf, "%s/p4-hf/config.json", t_tmpdir());
            T_CHECK(nv_hf_save(&b, NULL, t_path("p4-hf"), NV_HF_F32, NULL) == NV_OK && nv_model_load(hf, &hm) == NV_OK, "%s", nv_errmsg());
            if (hm.params)
                T_CHECK(!memcmp(&hm.config, bc, sizeof hm.config) && !memcmp(hm.params, b.params, b.n_params * 4),
                        "the folder reads back as another model (RoPE on %d values, %d divisors, attention %g)", hm.config.rope_dim,
                        hm.config.n_rope_factors, (double)hm.config.rope_attn);
            nv_model_free(&hm);
            T_CHECK(nv_model_save_v1(&b, t_path("p4.bin")) == NV_EUNSUPPORTED, "llama2.c took it");
            nv_ckpt_header h;
            nv_config back;
            memset(&h, 0, sizeof h);
            nv_ckpt_header_set_config(&h, bc);
            nv_ckpt_header_get_config(&h, &back);
            T_CHECK(!memcmp(&back, bc, sizeof back), "a checkpoint header does not keep the config");
            char args[900];
            snprintf(args, sizeof args, "info -m %s", dst);
            T_CHECK(t_nerve(args) == 0 && strstr(t_out, "rope:     theta 10000 on 12 of each head's 16 values, 6 frequency divisors 1..3.5"),
                    "nerve info says: %s", t_out);
        }
        nv_model_free(&a);
        nv_model_free(&b);
        if (ti == 0) continue;
        /* the Q8_0 sources, their query and key rows put back in order as the plans are built */
        T_CHECK(nv_model_load_quantized(src, &a) == NV_OK && nv_model_load_quantized(dst, &b) == NV_OK, "%s", nv_errmsg());
        if (!a.params || !b.params) return;
        const nv_config keep = a.config;
        a.config = b.config; /* the llama file's weights under the phi3 file's RoPE */
        const nv_engine_id e = nv_engine_best();
        float *la = malloc(N * 97 * 4), *lb = malloc(N * 97 * 4);
        T_CHECK(la && lb && nv_model_build_plans(&a, e) == NV_OK && nv_model_build_plans(&b, e) == NV_OK && t_forward_logits(&a, toks, N, la) &&
                    t_forward_logits(&b, toks, N, lb),
                "%s", nv_errmsg());
        if (la && lb) T_CHECK(!memcmp(la, lb, N * 97 * 4), "on %s: the phi3 file's logits differ from the llama file's", nv_engine_name(e));
        free(la), free(lb);
        a.config = keep;
        nv_model_free(&a);
        nv_model_free(&b);
    }
    nv_model_free(&m);
    /* beside a SentencePiece vocabulary: the phi3 file says Phi-3's white-space rule, so one whose
       special tokens lack it is refused, one with it written and read back with it */
    nv_config vc = pc;
    vc.vocab_size = 12;
    nv_model vm;
    if (!random_model(&vm, &vc, 24)) return;
    nv_tokenizer *plain = NULL, *phi = NULL, *back = NULL;
    char vocab[700], out[700];
    snprintf(vocab, sizeof vocab, "%s/p4-vocab-llama.gguf", t_tmpdir());
    T_CHECK(gw_spm_vocab(vocab, "llama", -1) && nv_tokenizer_load(vocab, 12, &plain) == NV_OK, "%s", nv_errmsg());
    snprintf(vocab, sizeof vocab, "%s/p4-vocab-phi3.gguf", t_tmpdir());
    T_CHECK(gw_spm_vocab(vocab, "phi3", -1) && nv_tokenizer_load(vocab, 12, &phi) == NV_OK, "%s", nv_errmsg());
    snprintf(out, sizeof out, "%s/p4-vocab-model.gguf", t_tmpdir());
    if (plain && phi) {
        T_CHECK(nv_gguf_save(&vm, plain, "p4", out, NV_GGUF_F32, NULL, NULL) == NV_EUNSUPPORTED && strstr(nv_errmsg(), "white-space rule"),
                "a vocabulary without Phi-3's rule: %s", nv_errmsg());
        T_CHECK(nv_gguf_save(&vm, phi, "p4", out, NV_GGUF_F32, NULL, NULL) == NV_OK && nv_tokenizer_load(out, 12, &back) == NV_OK &&
                    nv_tokenizer_strips_after_special(back),
                "Phi-3's vocabulary: %s", nv_errmsg());
    }
    nv_tokenizer_free(plain), nv_tokenizer_free(phi), nv_tokenizer_free(back);
    nv_model_free(&vm);
}

/* A Phi-3 served end to end: a phi3 file and a SentencePiece vocabulary with Phi-3's control tokens
 * (tests/gguf_write.h) behind `nerve serve --chat-template phi3`: a chat request's prompt is BOS,
 * <|user|>, "▁a", <|end|>, <|assistant|> (the markers as their ids, the line breaks after them
 * taken by them), five tokens where the text read as text would be far more, and the answer runs. */
static void test_phi3_serve(void) {
    nv_config c = {64, 64, 1, 4, 2, 16, 12, 64, 10000.0f, 1e-5f, 0, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    nv_model m;
    if (!random_model(&m, &c, 23)) return;
    char src[700], model[700], vocab[700];
    snprintf(src, sizeof src, "%s", t_path("p3s-src.gguf"));
    snprintf(model, sizeof model, "%s", t_path("p3s.gguf"));
    snprintf(vocab, sizeof vocab, "%s", t_path("p3s-vocab.gguf"));
    T_CHECK(nv_gguf_save(&m, NULL, "p3s", src, NV_GGUF_F32, NULL, NULL) == NV_OK && gw_phi3_from(src, model, &c, 0) &&
                gw_spm_vocab(vocab, "phi3", -1),
            "writing the model and vocabulary: %s", nv_errmsg());
    nv_model_free(&m);
    const int n = chat_prompt_tokens("phi3-serve", model, vocab, "--chat-template phi3 --no-prefix-cache");
    T_CHECK(n == 5, "%d prompt tokens", n);
}

/* llama-gguf-split's files: a Q8_0 model written in three files by tensor count and in several by
 * size loads from its first file to the very weights, and to the very logits on block-quantized
 * plans over the raw blocks (which stay in every file's mapping), as the model in one file; the
 * later files hold llama.cpp's three split keys alone; every file is written or none; a missing,
 * swapped or miscounted file, a later file given first and a renamed first are refused naming why. */
static long file_size(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fclose(f);
    return n;
}

static int read_at(const char *path, long at, void *out, size_t n) {
    FILE *f = fopen(path, "rb");
    const int ok = f && fseek(f, at, SEEK_SET) == 0 && fread(out, 1, n, f) == n;
    if (f) fclose(f);
    return ok;
}

static int copy_file(const char *from, const char *to) {
    char *data = NULL;
    size_t n = 0;
    if (nv_file_read_all(from, &data, &n) != NV_OK) return 0;
    FILE *f = fopen(to, "wb");
    const int ok = f && fwrite(data, 1, n, f) == n;
    if (f) fclose(f);
    free(data);
    return ok;
}

static void split_logits(const char *path, float *out, int n, int *ok) {
    static const int toks[] = {1, 400, 23, 87, 302, 11, 9, 250};
    nv_model q;
    *ok = nv_model_load_quantized(path, &q) == NV_OK && nv_model_build_plans(&q, nv_engine_best()) == NV_OK &&
          t_forward_logits(&q, toks, n, out);
    T_CHECK(*ok, "%s: %s", path, nv_errmsg());
    nv_model_free(&q);
}

static void test_split_files(void) {
    const char *bp = t_data("models/stories260K.bin");
    if (!bp) return;
    nv_engines_init(NULL, 0); /* probed before the best engine is asked for (this test may run alone) */
    nv_model m, a, b;
    T_CHECK(nv_model_load(bp, &m) == NV_OK, "%s", nv_errmsg());
    if (!m.params) return;
    char one[700], base[700], f[3][720], moved[760];
    snprintf(one, sizeof one, "%s", t_path("one.gguf"));
    snprintf(base, sizeof base, "%s", t_path("split.gguf"));
    nv_gguf_split by_count = {0, 20, 0};
    T_CHECK(nv_gguf_save(&m, NULL, "s", one, NV_GGUF_Q8_0, NULL, NULL) == NV_OK &&
                nv_gguf_save_split(&m, NULL, "s", base, NV_GGUF_Q8_0, NULL, NULL, &by_count) == NV_OK && by_count.n_files == 3,
            "%s: %d files", nv_errmsg(), by_count.n_files);
    for (int k = 0; k < 3; k++) T_CHECK(nv_gguf_split_name(base, k, 3, f[k], sizeof f[k]) == NV_OK && file_size(f[k]) > 0, "%s", f[k]);
    T_CHECK(strstr(f[1], "/split-00002-of-00003.gguf") != NULL && file_size(base) < 0, "named %s", f[1]);
    /* the later files: the split keys alone, their tensors in order (20, 20, then 7 of stories260K's 47) */
    uint64_t head[3][2];
    for (int k = 0; k < 3; k++) T_CHECK(read_at(f[k], 8, head[k], 16), "%s", f[k]);
    T_CHECK(head[0][0] == 20 && head[1][0] == 20 && head[2][0] == 7 && head[1][1] == 3 && head[2][1] == 3 && head[0][1] > 10,
            "tensors %llu %llu %llu, metadata %llu %llu %llu", (unsigned long long)head[0][0], (unsigned long long)head[1][0],
            (unsigned long long)head[2][0], (unsigned long long)head[0][1], (unsigned long long)head[1][1], (unsigned long long)head[2][1]);
    nv_gguf g;
    size_t n = 0;
    T_CHECK(nv_gguf_open(f[0], &g) == NV_OK && g.n_tensors == 47 && g.n_shards == 2 &&
                nv_gguf_file_bytes(&g) == (uint64_t)(file_size(f[0]) + file_size(f[1]) + file_size(f[2])) &&
                nv_gguf_tensor_find(&g, "output_norm.weight") && nv_gguf_string(&g, "general.architecture", &n),
            "%s", nv_errmsg());
    nv_gguf_close(&g);
    T_CHECK(nv_model_load(one, &a) == NV_OK && nv_model_load(f[0], &b) == NV_OK && a.n_params == b.n_params &&
                !memcmp(a.params, b.params, a.n_params * 4),
            "the split model's weights differ from the one file's: %s", nv_errmsg());
    nv_model_free(&a), nv_model_free(&b);
    enum { N = 8, V = 512 };
    float *la = malloc(N * V * 4), *lb = malloc(N * V * 4);
    int oka = 0, okb = 0;
    if (la && lb) split_logits(one, la, N, &oka), split_logits(f[0], lb, N, &okb);
    T_CHECK(oka && okb && !memcmp(la, lb, N * V * 4), "quantized plans over the split files: other logits");
    free(la), free(lb);
    /* by size: every file at most the limit of tensor data (the later ones' header is a few hundred
       bytes), unless one tensor alone passes it */
    char sized[700];
    snprintf(sized, sizeof sized, "%s", t_path("sized.gguf"));
    nv_gguf_split by_size = {40000, 0, 0};
    T_CHECK(nv_gguf_save_split(&m, NULL, "s", sized, NV_GGUF_Q8_0, NULL, NULL, &by_size) == NV_OK && by_size.n_files >= 4,
            "%s: %d files", nv_errmsg(), by_size.n_files);
    for (int k = 1; k < by_size.n_files; k++) {
        char p[720];
        uint64_t nt = 0;
        T_CHECK(nv_gguf_split_name(sized, k, by_size.n_files, p, sizeof p) == NV_OK && read_at(p, 8, &nt, 8) &&
                    (file_size(p) <= 40000 + 2048 || nt == 1),
                "%s: %ld bytes, %llu tensors", p, file_size(p), (unsigned long long)nt);
    }
    char first_sized[720];
    T_CHECK(nv_gguf_split_name(sized, 0, by_size.n_files, first_sized, sizeof first_sized) == NV_OK &&
                nv_model_load(first_sized, &b) == NV_OK && b.n_params == m.n_params,
            "%s", nv_errmsg());
    nv_model_free(&b);
    /* refusals, each naming what is wrong */
    T_CHECK(nv_model_load(f[1], &b) == NV_EINVAL && strstr(nv_errmsg(), "split 2 of 3: load the first") && strstr(nv_errmsg(), "split-00001-of-00003.gguf"),
            "the second file given: %s", nv_errmsg());
    snprintf(moved, sizeof moved, "%s.away", f[2]);
    T_CHECK(rename(f[2], moved) == 0 && nv_model_load(f[0], &b) != NV_OK && strstr(nv_errmsg(), "split 3 of 3") &&
                strstr(nv_errmsg(), "split-00003-of-00003.gguf"),
            "a missing file: %s", nv_errmsg());
    rename(moved, f[2]);
    const char *renamed = t_path("renamed.gguf");
    T_CHECK(copy_file(f[0], renamed) && nv_model_load(renamed, &b) == NV_EFORMAT && strstr(nv_errmsg(), "cannot be found"),
            "a renamed first file: %s", nv_errmsg());
    snprintf(moved, sizeof moved, "%s.kept", f[1]);
    T_CHECK(rename(f[1], moved) == 0 && copy_file(f[2], f[1]) && nv_model_load(f[0], &b) == NV_EFORMAT &&
                strstr(nv_errmsg(), "says it is split 3 of 3"),
            "a file in another's place: %s", nv_errmsg());
    rename(moved, f[1]);
    /* split.tensors.count one short */
    char *data = NULL;
    T_CHECK(nv_file_read_all(f[0], &data, &n) == NV_OK, "%s", nv_errmsg());
    char *key = data ? memmem(data, n, "split.tensors.count", 19) : NULL;
    T_CHECK(key != NULL, "no split.tensors.count in the first file");
    if (key) {
        int32_t v;
        memcpy(&v, key + 19 + 4, 4);
        T_CHECK(v == 47, "split.tensors.count %d", v);
        v = 46;
        memcpy(key + 19 + 4, &v, 4);
        const char *bad = t_write("counted-00001-of-00003.gguf", data, n);
        T_CHECK(copy_file(f[1], t_path("counted-00002-of-00003.gguf")) && copy_file(f[2], t_path("counted-00003-of-00003.gguf")) &&
                    nv_model_load(bad, &b) == NV_EFORMAT && strstr(nv_errmsg(), "says 46 tensors"),
                "a miscounted set: %s", nv_errmsg());
        key[6] = 'X'; /* no split.tensors.count at all */
        t_write("counted-00001-of-00003.gguf", data, n);
        T_CHECK(nv_model_load(bad, &b) == NV_EFORMAT && strstr(nv_errmsg(), "without split.tensors.count"), "no count: %s", nv_errmsg());
    }
    free(data);
    /* all or none: the second file cannot be made (a folder at its temporary name), so the first,
       written already, never replaces the old one and leaves no temporary file */
    char tmp2[800], tmp1[800], *before = NULL, *after = NULL;
    size_t nb = 0, na = 0;
    snprintf(tmp2, sizeof tmp2, "%s.tmp.%ld", f[1], (long)getpid());
    snprintf(tmp1, sizeof tmp1, "%s.tmp.%ld", f[0], (long)getpid());
    nv_file_read_all(f[0], &before, &nb);
    nv_model_init_random(&m, 7);
    T_CHECK(mkdir(tmp2, 0700) == 0 && nv_gguf_save_split(&m, NULL, "s", base, NV_GGUF_Q8_0, NULL, NULL, &by_count) == NV_EIO,
            "a split set written with one file unwritable: %s", nv_errmsg());
    nv_file_read_all(f[0], &after, &na);
    T_CHECK(before && after && nb == na && !memcmp(before, after, nb) && access(tmp1, F_OK) != 0,
            "the first file replaced or its temporary file left (%zu, %zu bytes)", nb, na);
    free(before), free(after);
    rmdir(tmp2);
    nv_model_free(&m);
}

/* A SentencePiece vocabulary that adds no BOS still gives BOS alone for a text of no tokens when it
 * is asked for, as a byte-level one does (a model needs something to condition on; fuzz_tokenizer's
 * property), and no BOS before a text that has tokens. */
static void test_spm_empty_text_bos(void) {
    const char *vocab = t_path("spm_no_bos.gguf");
    nv_tokenizer *tok = NULL;
    gw_spm_no_bos = 1;
    T_CHECK(gw_spm_vocab(vocab, "llama", -1) && nv_tokenizer_load(vocab, 12, &tok) == NV_OK, "%s", nv_errmsg());
    gw_spm_no_bos = 0;
    if (!tok) return;
    int *ids = NULL, n = 0;
    T_CHECK(nv_tokenizer_encode(tok, "", 1, 0, &ids, &n) == NV_OK && n == 1 && ids[0] == nv_tokenizer_bos(tok), "empty text: %d ids", n);
    free(ids);
    T_CHECK(nv_tokenizer_encode(tok, "a", 1, 0, &ids, &n) == NV_OK && n >= 1 && ids[0] != nv_tokenizer_bos(tok), "a text: BOS added (%d ids)", n);
    free(ids);
    nv_tokenizer_free(tok);
}

int main(void) {
    T_RUN(test_stories260k_gguf_equals_bin);
    T_RUN(test_tiny_random_v3_f16);
    T_RUN(test_synthetic_types);
    T_RUN(test_quant_blocks);
    T_RUN(test_quant_blocks_random);
    T_RUN(test_malformed);
    T_RUN(test_finetune_from_gguf);
    T_RUN(test_export_roundtrip);
    T_RUN(test_q8_0_export_and_quantized_plans);
    T_RUN(test_q4_0_export_and_quantized_plans);
    T_RUN(test_q4_0_writer_known_block);
    T_RUN(test_kquant_writers);
    T_RUN(test_f16_export_and_half_plans);
    T_RUN(test_bf16_export_and_half_plans);
    T_RUN(test_serve_declared_template);
    T_RUN(test_qwen3_roundtrip);
    T_RUN(test_rope_factors);
    T_RUN(test_qwen2_bias);
    T_RUN(test_phi3);
    T_RUN(test_phi3_longrope);
    T_RUN(test_rope_rows_order);
    T_RUN(test_phi4_mini);
    T_RUN(test_phi3_serve);
    T_RUN(test_split_files);
    T_RUN(test_spm_empty_text_bos);
    return t_done();
}
