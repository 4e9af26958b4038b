/* Model core: llama2.c checkpoints (v0, v1, malformed), the fp32 forward pass, the sampler. */
#include <stdint.h>
#include <unistd.h>

#include "base/pool.h"
#include "base/rng.h"
#include "base/vmath.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/sampler.h"
#include "t.h"


/* Greedy decode of n steps from BOS, token by token (or one chunk for the prompt). */
static int greedy_tokens(const nv_model *m, int steps, int *out) {
    nv_state s;
    if (nv_state_init(&s, &m->config, 1, m->config.seq_len, 0) != NV_OK) return 0;
    int token = 1, n = 0;
    for (int pos = 0; pos < steps; pos++) {
        if (nv_forward(m, &s, &token, 1, pos) != NV_OK) break;
        token = nv_argmax(s.logits, m->config.vocab_size);
        out[n++] = token;
    }
    nv_state_free(&s);
    return n;
}

static void test_load_v0_stories260K(void) {
    const char *p = t_data("models/stories260K.bin");
    if (!p) return;
    nv_model m;
    nv_err e = nv_model_load(p, &m);
    T_CHECK(e == NV_OK, "%s", nv_errmsg());
    if (e) return;
    const nv_config *c = &m.config;
    T_CHECK(c->dim == 64 && c->hidden_dim == 172 && c->n_layers == 5 && c->n_heads == 8 && c->n_kv_heads == 4 &&
                c->vocab_size == 512 && c->seq_len == 512 && c->shared_classifier == 1 && c->head_dim == 8,
            "unexpected config dim=%d hidden=%d", c->dim, c->hidden_dim);
    nv_model_free(&m);
}

static void test_v1_roundtrip_and_exact_greedy(void) {
    const char *p = t_data("models/stories260K.bin");
    if (!p) return;
    nv_model a, b;
    if (nv_model_load(p, &a) != NV_OK) {
        T_CHECK(0, "%s", nv_errmsg());
        return;
    }
    const char *out = t_path("v1.bin");
    T_CHECK(nv_model_save_v1(&a, out) == NV_OK, "%s", nv_errmsg());
    nv_err e = nv_model_load(out, &b);
    T_CHECK(e == NV_OK, "%s", nv_errmsg());
    if (e) {
        nv_model_free(&a);
        return;
    }
    T_CHECK(b.n_params == a.n_params && memcmp(a.params, b.params, a.n_params * 4) == 0, "weights differ after v1 round trip");
    /* a RoPE theta or norm eps other than the ones a v1 reader assumes is refused, nothing written */
    b.config.rope_theta = 5e5f;
    T_CHECK(nv_model_save_v1(&b, t_path("theta.bin")) == NV_EUNSUPPORTED && strstr(nv_errmsg(), "theta 10000") &&
                access(t_path("theta.bin"), F_OK) != 0,
            "v1 save of a RoPE theta of 5e5 accepted");
    b.config.rope_theta = 10000.0f;
    T_CHECK(nv_model_build_plans(&a, NV_ENGINE_SCALAR) == NV_OK, "%s", nv_errmsg());
    T_CHECK(nv_model_build_plans(&b, NV_ENGINE_SCALAR) == NV_OK, "%s", nv_errmsg());
    int ta[64], tb[64];
    int na = greedy_tokens(&a, 64, ta), nb = greedy_tokens(&b, 64, tb);
    T_CHECK(na == 64 && nb == 64 && memcmp(ta, tb, sizeof ta) == 0, "v0 and v1 greedy tokens differ");
    nv_model_free(&a);
    nv_model_free(&b);
}

static void test_chunked_prefill_is_exact(void) {
    const char *p = t_data("models/stories260K.bin");
    if (!p) return;
    nv_model m;
    if (nv_model_load(p, &m) != NV_OK || nv_model_build_plans(&m, NV_ENGINE_SCALAR) != NV_OK) {
        T_CHECK(0, "%s", nv_errmsg());
        return;
    }
    int toks[40];
    for (int i = 0; i < 40; i++) toks[i] = (i * 37 + 11) % 512;
    toks[0] = 1;
    nv_state one, chunk;
    T_CHECK(nv_state_init(&one, &m.config, 1, 64, 0) == NV_OK, "%s", nv_errmsg());
    T_CHECK(nv_state_init(&chunk, &m.config, 16, 64, 1) == NV_OK, "%s", nv_errmsg());
    for (int pos = 0; pos < 40; pos++) nv_forward(&m, &one, &toks[pos], 1, pos);
    /* chunks of 16, 16, 8: every row's logits must equal the token-by-token ones bit for bit */
    int pos = 0, ok = 1;
    nv_state ref;
    nv_state_init(&ref, &m.config, 1, 64, 0);
    while (pos < 40) {
        int n = 40 - pos < 16 ? 40 - pos : 16;
        T_CHECK(nv_forward(&m, &chunk, toks + pos, n, pos) == NV_OK, "%s", nv_errmsg());
        for (int t = 0; t < n; t++) {
            nv_forward(&m, &ref, &toks[pos + t], 1, pos + t);
            if (memcmp(ref.logits, chunk.logits + (size_t)t * 512, 512 * 4) != 0) ok = 0;
        }
        pos += n;
    }
    T_CHECK(ok, "chunked logits differ from token-by-token logits");
    T_CHECK(memcmp(one.key_cache, chunk.key_cache, (size_t)5 * 64 * 32 * 4) == 0, "KV caches differ");
    /* out-of-range inputs are errors, not crashes */
    int bad = 512;
    T_CHECK(nv_forward(&m, &one, &bad, 1, 0) == NV_ERANGE, "token id out of range accepted");
    T_CHECK(nv_forward(&m, &one, toks, 1, 64) == NV_ERANGE, "position beyond the cache accepted");
    T_CHECK(nv_forward(&m, &one, toks, 2, 0) == NV_EINVAL, "chunk larger than the state accepted");
    nv_state_free(&one);
    nv_state_free(&chunk);
    nv_state_free(&ref);
    nv_model_free(&m);
}

/* GQA + separate head_dim + QK-norm + separate classifier: forward runs, is finite, chunk-exact. */
static void test_general_config_forward(void) {
    nv_config c = {48, 80, 2, 4, 2, 16, 97, 32, 10000.0f, 1e-5f, 0, 1, 0, {0}, 0, NV_CONFIG_PLAIN};
    nv_model m;
    T_CHECK(nv_model_alloc(&m, &c) == NV_OK, "%s", nv_errmsg());
    nv_model_init_random(&m, 7);
    for (int i = 0; i < 2 * 16; i++) m.w.q_norm[i] = 1.0f + 0.01f * (float)i;
    T_CHECK(nv_model_build_plans(&m, NV_ENGINE_SCALAR) == NV_OK, "%s", nv_errmsg());
    nv_state a, b;
    nv_state_init(&a, &c, 1, 32, 0);
    nv_state_init(&b, &c, 8, 32, 0);
    int toks[8] = {1, 5, 9, 33, 96, 0, 2, 50};
    for (int i = 0; i < 8; i++) nv_forward(&m, &a, &toks[i], 1, i);
    nv_forward(&m, &b, toks, 8, 0);
    int finite = 1;
    for (int i = 0; i < 97; i++) finite &= isfinite(a.logits[i]);
    T_CHECK(finite, "non-finite logits");
    T_CHECK(memcmp(a.logits, b.logits, 97 * 4) == 0, "chunked vs token-by-token differ with QK-norm/GQA");
    T_CHECK(m.w.wcls != m.w.tok_emb, "separate classifier expected");
    /* a shape llama2.c v1 cannot hold is refused, nothing written */
    T_CHECK(nv_model_save_v1(&m, t_path("qk.bin")) == NV_EUNSUPPORTED, "v1 save of QK-norm model accepted");
    T_CHECK(access(t_path("qk.bin"), F_OK) != 0, "file written for refused save");
    nv_state_free(&a);
    nv_state_free(&b);
    nv_model_free(&m);
}

/* Prompt rows attend in groups (each key transposed once for them, values swept 64 positions at a
 * time): with head sizes of 72 (64 + 8 dimensions) and 10 (8 + a scalar tail), GQA, 90 positions
 * in chunks of 16 and of 5, every row's logits equal the token-by-token ones bit for bit. */
static void test_chunked_attention_shapes(void) {
    static const int head_dims[] = {72, 10};
    for (size_t hi = 0; hi < sizeof head_dims / sizeof head_dims[0]; hi++) {
        const int hd = head_dims[hi];
        nv_config c = {64, 96, 2, 4, 2, hd, 61, 96, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
        nv_model m;
        T_CHECK(nv_model_alloc(&m, &c) == NV_OK, "%s", nv_errmsg());
        nv_model_init_random(&m, 11 + (uint64_t)hd);
        T_CHECK(nv_model_build_plans(&m, nv_engine_best_fp32()) == NV_OK, "%s", nv_errmsg());
        enum { N = 90 };
        int toks[N];
        for (int i = 0; i < N; i++) toks[i] = (i * 17 + 3) % 61;
        nv_state one;
        T_CHECK(nv_state_init(&one, &c, 1, 96, 0) == NV_OK, "%s", nv_errmsg());
        float *want = malloc(sizeof(float) * N * 61);
        for (int p = 0; want && p < N; p++) {
            nv_forward(&m, &one, &toks[p], 1, p);
            memcpy(want + (size_t)p * 61, one.logits, sizeof(float) * 61);
        }
        static const int chunks[] = {33, 32, 16, 5}; /* attention groups of 32 and of 1, 16 and 5 rows */
        for (size_t ci = 0; ci < sizeof chunks / sizeof chunks[0]; ci++) {
            const int chunk = chunks[ci];
            nv_state st;
            T_CHECK(nv_state_init(&st, &c, chunk, 96, 1) == NV_OK, "%s", nv_errmsg());
            int same = 1;
            for (int p = 0; want && p < N; p += chunk) {
                const int n = N - p < chunk ? N - p : chunk;
                T_CHECK(nv_forward(&m, &st, toks + p, n, p) == NV_OK, "%s", nv_errmsg());
                same &= memcmp(st.logits, want + (size_t)p * 61, sizeof(float) * n * 61) == 0;
            }
            T_CHECK(same, "head size %d, chunks of %d: logits differ from token-by-token", hd, chunk);
            nv_state_free(&st);
        }
        free(want);
        nv_state_free(&one);
        /* a state made for another head size or RoPE base is refused, not used with wrong angles */
        nv_config other = c;
        other.rope_theta = 500.0f;
        nv_state wrong;
        T_CHECK(nv_state_init(&wrong, &other, 4, 96, 0) == NV_OK, "%s", nv_errmsg());
        T_CHECK(nv_forward(&m, &wrong, toks, 4, 0) != NV_OK && strstr(nv_errmsg(), "another model"),
                "a state for another RoPE base was accepted");
        nv_state_free(&wrong);
        nv_model_free(&m);
    }
}

/* Sliding-window layers keep a ring of their window and a chunk (nv_state_init): the same logits, bit
 * for bit, as a state whose layers keep every position, token by token and in chunks (groups of 32
 * rows and single rows), far past the ring's wrap; a window of 50 (head size 10, not a multiple of 8)
 * on two layers of three, the third global. A step taken back within a chunk resumes exactly; one
 * before the ring's reach is refused (NV_ERANGE), and a run from position 0 starts over. */
static void test_window_ring(void) {
    nv_config c = {64, 96, 3, 4, 2, 10, 61, 600, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    c.swa_window = 50, c.swa_period = 3; /* layers 0 and 1 windowed, 2 global */
    nv_model m;
    T_CHECK(nv_model_alloc(&m, &c) == NV_OK, "%s", nv_errmsg());
    nv_model_init_random(&m, 29);
    T_CHECK(nv_model_build_plans(&m, nv_engine_best_fp32()) == NV_OK, "%s", nv_errmsg());
    enum { N = 500, V = 61 };
    int toks[N];
    for (int i = 0; i < N; i++) toks[i] = (i * 23 + 7) % V;
    nv_state full;
    T_CHECK(nv_state_init(&full, &c, 400, 600, 1) == NV_OK && !full.ring, "%s", nv_errmsg()); /* 2 x (50 + 400) > 600: no ring */
    float *want = malloc(sizeof(float) * N * V);
    for (int p = 0; want && p < N; p += 40) {
        const int n = N - p < 40 ? N - p : 40;
        T_CHECK(nv_forward(&m, &full, toks + p, n, p) == NV_OK, "%s", nv_errmsg());
        memcpy(want + (size_t)p * V, full.logits, sizeof(float) * n * V);
    }
    static const int chunks[] = {1, 33, 7};
    for (size_t ci = 0; want && ci < sizeof chunks / sizeof chunks[0]; ci++) {
        nv_state st;
        T_CHECK(nv_state_init(&st, &c, chunks[ci], 600, 1) == NV_OK && st.ring == 50 + chunks[ci], "%s", nv_errmsg());
        int same = 1;
        for (int p = 0; p < N; p += chunks[ci]) {
            const int n = N - p < chunks[ci] ? N - p : chunks[ci];
            T_CHECK(nv_forward(&m, &st, toks + p, n, p) == NV_OK, "%s", nv_errmsg());
            same &= !memcmp(st.logits, want + (size_t)p * V, sizeof(float) * n * V);
        }
        T_CHECK(same, "chunks of %d: a ring's logits differ from a full cache's", chunks[ci]);
        if (chunks[ci] == 33) {
            /* back within a chunk: the same logits; before the ring's reach: refused; from 0: again */
            const int back = N - 20;
            T_CHECK(nv_state_resumable(&st, back) && nv_forward(&m, &st, toks + back, 1, back) == NV_OK &&
                        !memcmp(st.logits, want + (size_t)back * V, sizeof(float) * V),
                    "a step back within a chunk");
            T_CHECK(!nv_state_resumable(&st, 100) && nv_forward(&m, &st, toks + 100, 1, 100) == NV_ERANGE &&
                        strstr(nv_errmsg(), "run again from position 0"),
                    "a step back past the ring: %s", nv_errmsg());
            T_CHECK(nv_forward(&m, &st, toks, 33, 0) == NV_OK && !memcmp(st.logits, want, sizeof(float) * 33 * V),
                    "from position 0 again");
        }
        nv_state_free(&st);
    }
    /* the memory: two windowed layers of 2 x (50 + 1) positions and one of 600, against 3 x 600 */
    nv_state small;
    T_CHECK(nv_state_init(&small, &c, 1, 600, 0) == NV_OK && small.layer_slots[0] == 102 && small.layer_slots[1] == 102 &&
                small.layer_slots[2] == 600 && small.layer_at[2] == (size_t)2 * 102 * 20,
            "ring slots %d %d %d", small.layer_slots[0], small.layer_slots[1], small.layer_slots[2]);
    nv_state_free(&small);
    free(want);
    nv_state_free(&full);
    nv_model_free(&m);
}

/* nv_softmax (8-lane max, exp and division) gives llama2.c's scalar loop's values bit for bit, on
 * rows whose spread passes expf's slow path (differences beyond -88), with NaN, and of every
 * length 1-40. */
static void test_softmax_matches_scalar(void) {
    uint64_t seed = 99;
    int same = 1;
    for (int size = 1; size <= 40; size++)
        for (int kind = 0; kind < 3; kind++) {
            float x[40], want[40];
            for (int i = 0; i < size; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                x[i] = (float)((double)(seed >> 40) / (double)(1ull << 24) - 0.5) * (kind == 1 ? 400.0f : 20.0f);
            }
            if (kind == 2 && size > 3) x[size / 2] = NAN;
            float mx = x[0], sum = 0.0f;
            for (int i = 1; i < size; i++)
                if (x[i] > mx) mx = x[i];
            for (int i = 0; i < size; i++) want[i] = expf(x[i] - mx), sum += want[i];
            for (int i = 0; i < size; i++) want[i] /= sum;
            nv_softmax(x, size);
            same &= memcmp(x, want, sizeof(float) * (size_t)size) == 0;
        }
    T_CHECK(same, "nv_softmax differs from the scalar loop");
}

/* nv_softmax_causal (eight rows' sums side by side) gives each row nv_softmax's values bit for bit:
 * blocks of 1-20 rows starting at 1-19 values, wide spreads, a NaN; the padding after each row is
 * neither read into its sum nor written. */
static void test_softmax_causal_matches_rows(void) {
    uint64_t seed = 5;
    int same = 1;
    const size_t ld = 64;
    for (int rows = 1; rows <= 20; rows++)
        for (int size0 = 1; size0 <= 19; size0 += 3) {
            float x[20 * 64], want[20 * 64];
            for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                x[i] = (float)((double)(seed >> 40) / (double)(1ull << 24) - 0.5) * (rows % 3 ? 30.0f : 300.0f);
            }
            if (rows == 13) x[3 * ld + 2] = NAN;
            memcpy(want, x, sizeof x);
            for (int g = 0; g < rows; g++) nv_softmax(want + (size_t)g * ld, size0 + g);
            nv_softmax_causal(x, ld, size0, rows);
            same &= memcmp(x, want, sizeof x) == 0;
        }
    T_CHECK(same, "nv_softmax_causal differs from nv_softmax row by row");
}

/* nv_silu_mul (8 lanes) gives run.c's scalar SwiGLU values bit for bit: inputs past expf's slow
 * path (|x| >= 88), signed zeros, infinities and NaN, and every length 1-40. */
static void test_silu_matches_scalar(void) {
    uint64_t seed = 7;
    int same = 1;
    for (int n = 1; n <= 40; n++)
        for (int kind = 0; kind < 3; kind++) {
            float h[40], g[40], want[40];
            for (int i = 0; i < n; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                h[i] = (float)((double)(seed >> 40) / (double)(1ull << 24) - 0.5) * (kind == 1 ? 400.0f : 24.0f);
                g[i] = (float)((double)(seed >> 20 & 0xfffff) / (double)(1 << 20) - 0.5) * 3.0f;
            }
            if (kind == 2) {
                const float odd[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 89.0f, -104.0f, 1e-30f};
                for (int i = 0; i < n && i < 8; i++) h[(i * 5) % n] = odd[i];
            }
            for (int i = 0; i < n; i++) {
                float val = h[i];
                val *= (1.0f / (1.0f + expf(-val)));
                val *= g[i];
                want[i] = val;
            }
            nv_silu_mul(h, g, n);
            same &= memcmp(h, want, sizeof(float) * (size_t)n) == 0;
        }
    T_CHECK(same, "nv_silu_mul differs from the scalar loop");
    if (!nv_expf_libm_matches()) printf("    (this libm's expf is not glibc's: the 8-lane path was not exercised)\n");
}

static void test_separate_classifier_v0_and_v1(void) {
    /* a tiny v0 file with negative vocab (separate classifier) built by hand */
    nv_config c = {16, 24, 1, 2, 2, 8, 11, 6, 10000.0f, 1e-5f, 0, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    nv_model m;
    nv_model_alloc(&m, &c);
    nv_model_init_random(&m, 3);
    const nv_weights *w = &m.w;
    int32_t hdr[7] = {16, 24, 1, 2, 2, -11, 6};
    const char *path = t_path("v0sep.bin");
    FILE *f = fopen(path, "wb");
    fwrite(hdr, 4, 7, f);
    struct {
        const float *p;
        size_t n;
    } parts[] = {{w->tok_emb, 11 * 16}, {w->rms_att, 16}, {w->wq, 256}, {w->wk, 256}, {w->wv, 256}, {w->wo, 256},
                 {w->rms_ffn, 16},      {w->w1, 384},     {w->w2, 384}, {w->w3, 384}, {w->rms_final, 16}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) fwrite(parts[i].p, 4, parts[i].n, f);
    float zeros[6 * 4] = {0};
    fwrite(zeros, 4, 6 * 4, f); /* freq tables: seq_len * head_dim/2, twice */
    fwrite(zeros, 4, 6 * 4, f);
    fwrite(w->wcls, 4, 11 * 16, f);
    fclose(f);
    nv_model l;
    nv_err e = nv_model_load(path, &l);
    T_CHECK(e == NV_OK, "%s", nv_errmsg());
    if (!e) {
        T_CHECK(!l.config.shared_classifier && l.config.vocab_size == 11, "v0 negative vocab not read as separate");
        T_CHECK(memcmp(l.params, m.params, m.n_params * 4) == 0, "v0 weights differ");
        T_CHECK(nv_model_save_v1(&l, t_path("v1sep.bin")) == NV_OK, "%s", nv_errmsg());
        nv_model v1;
        T_CHECK(nv_model_load(t_path("v1sep.bin"), &v1) == NV_OK, "%s", nv_errmsg());
        T_CHECK(!v1.config.shared_classifier && memcmp(v1.w.wcls, m.w.wcls, 11 * 16 * 4) == 0, "v1 classifier differs");
        nv_model_free(&v1);
        nv_model_free(&l);
    }
    nv_model_free(&m);
}

static void expect_refused(const char *name, const void *data, size_t len, nv_err want) {
    const char *path = t_write(name, data, len);
    nv_model m;
    nv_err e = nv_model_load(path, &m);
    T_CHECK(e == want, "%s: expected %s, got %s (%s)", name, nv_err_name(want), nv_err_name(e), nv_errmsg());
    T_CHECK(e == NV_OK || strlen(nv_errmsg()) > 0, "%s: no message", name);
    T_CHECK(e == NV_OK || strchr(nv_errmsg(), '\n') == NULL, "%s: message is not one line", name);
    if (e == NV_OK) nv_model_free(&m);
}

static void test_malformed_checkpoints_refused(void) {
    const char *p = t_data("models/stories260K.bin");
    if (!p) return;
    nv_mapped good;
    if (nv_file_map(p, &good) != NV_OK) return;
    uint8_t *buf = malloc(good.len + 64);
    memcpy(buf, good.data, good.len);
    /* truncated at several points: inside the header, inside the weights, one float short */
    expect_refused("empty.bin", buf, 0, NV_EFORMAT);
    expect_refused("trunc10.bin", buf, 10, NV_EFORMAT);
    expect_refused("trunc100.bin", buf, 100, NV_EFORMAT);
    expect_refused("trunc_half.bin", buf, good.len / 2, NV_EFORMAT);
    expect_refused("trunc_4.bin", buf, good.len - 4, NV_EFORMAT);
    expect_refused("extra.bin", buf, good.len + 8, NV_EFORMAT);
    /* garbage */
    uint8_t garbage[4096];
    uint64_t st = 99;
    for (size_t i = 0; i < sizeof garbage; i++) garbage[i] = (uint8_t)(nv_xorshift_u32(&st) >> 24);
    expect_refused("garbage.bin", garbage, sizeof garbage, NV_EFORMAT);
    /* absurd / inconsistent headers */
    int32_t h[7];
    memcpy(h, buf, sizeof h);
    int32_t bad[][7] = {{h[0], h[1], h[2], 7, h[4], h[5], h[6]},        /* dim not a multiple of heads */
                        {h[0], h[1], h[2], h[3], 3, h[5], h[6]},        /* heads not a multiple of kv heads */
                        {0x40000000, h[1], h[2], h[3], h[4], h[5], h[6]}, /* huge dim */
                        {h[0], h[1], -5, h[3], h[4], h[5], h[6]},        /* negative layers */
                        {h[0], h[1], h[2], h[3], h[4], INT32_MIN, h[6]}, /* vocab that cannot be negated */
                        {h[0], h[1], h[2], h[3], h[4], h[5], 0}};        /* no context */
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memcpy(buf, good.data, good.len);
        memcpy(buf, bad[i], sizeof bad[i]);
        char name[32];
        snprintf(name, sizeof name, "badhdr%zu.bin", i);
        expect_refused(name, buf, good.len, NV_EFORMAT);
    }
    /* v1 magic with an unknown version, and a v1 header with a bad flag */
    uint8_t v1[300] = {0};
    uint32_t magic = 0x616b3432;
    int32_t version = 2;
    memcpy(v1, &magic, 4);
    memcpy(v1 + 4, &version, 4);
    expect_refused("v2.bin", v1, sizeof v1, NV_EUNSUPPORTED);
    version = 1;
    memcpy(v1 + 4, &version, 4);
    memcpy(v1 + 8, h, sizeof h);
    v1[36] = 7;
    expect_refused("v1flag.bin", v1, sizeof v1, NV_EFORMAT);
    v1[36] = 1;
    expect_refused("v1short.bin", v1, sizeof v1, NV_EFORMAT);
    expect_refused("v1hdr.bin", v1, 30, NV_EFORMAT);
    free(buf);
    nv_file_unmap(&good);
    /* a directory and a missing file are i/o errors */
    nv_model m;
    T_CHECK(nv_model_load(t_tmpdir(), &m) == NV_EIO, "directory accepted");
    T_CHECK(nv_model_load(t_path("missing.bin"), &m) == NV_EIO, "missing file accepted");
}

/* logit_bias and OpenAI's penalties adjust the raw logits before sampling (greedy too). */
static void test_sampler_adjustments(void) {
    const float logits[4] = {3.0f, 2.5f, 1.0f, 0.0f};
    float l[4];
    nv_sampler s;
    T_CHECK(nv_sampler_init(&s, 4, 0.0f, 0.0f, 1) == NV_OK, "%s", nv_errmsg());
    /* a bias of -100 bans the greedy pick; +100 forces a token */
    int tok[2] = {0, 3};
    float bias[2] = {-100.0f, 0.0f};
    T_CHECK(nv_sampler_set_bias(&s, tok, bias, 2) == NV_OK, "%s", nv_errmsg());
    memcpy(l, logits, sizeof l);
    T_CHECK(nv_sample(&s, l) == 1, "a -100 bias did not ban token 0");
    bias[1] = 100.0f;
    nv_sampler_set_bias(&s, tok, bias, 2);
    memcpy(l, logits, sizeof l);
    T_CHECK(nv_sample(&s, l) == 3, "a +100 bias did not force token 3");
    T_CHECK(nv_sampler_set_bias(&s, (int[]){4}, (float[]){1.0f}, 1) == NV_ERANGE, "a token outside the vocabulary was accepted");
    nv_sampler_set_bias(&s, NULL, NULL, 0);
    /* frequency: each time token 0 is generated it loses 0.3 (3.0 -> 2.4 after two: 1 wins) */
    T_CHECK(nv_sampler_set_penalties(&s, 0.0f, 0.3f) == NV_OK, "%s", nv_errmsg());
    memcpy(l, logits, sizeof l);
    T_CHECK(nv_sample(&s, l) == 0, "no penalty before any token");
    nv_sampler_accept(&s, 0);
    memcpy(l, logits, sizeof l);
    T_CHECK(nv_sample(&s, l) == 0 && l[0] == 3.0f - 0.3f, "one occurrence: logit %g", l[0]);
    nv_sampler_accept(&s, 0);
    memcpy(l, logits, sizeof l);
    T_CHECK(nv_sample(&s, l) == 1, "two occurrences should hand the pick to token 1 (logit %g)", l[0]);
    /* presence: once per distinct token, however often */
    nv_sampler_set_penalties(&s, 1.0f, 0.0f);
    memcpy(l, logits, sizeof l);
    nv_sample(&s, l);
    T_CHECK(l[0] == 2.0f && l[1] == 2.5f, "presence: logits %g %g", l[0], l[1]);
    T_CHECK(nv_sampler_set_penalties(&s, NAN, 0.0f) == NV_EINVAL, "a NaN penalty was accepted");
    nv_sampler_free(&s);
    /* repetition (vLLM's): tokens of the prompt (0 and 2) and then of the answer: a positive logit
     * divided by 2, a negative one multiplied */
    T_CHECK(nv_sampler_init(&s, 4, 0.0f, 0.0f, 1) == NV_OK && nv_sampler_set_repetition(&s, 2.0f, (int[]){0, 2, 0}, 3) == NV_OK,
            "%s", nv_errmsg());
    const float rl[4] = {3.0f, 2.5f, -1.0f, 0.5f};
    memcpy(l, rl, sizeof l);
    T_CHECK(nv_sample(&s, l) == 1 && l[0] == 1.5f && l[1] == 2.5f && l[2] == -2.0f && l[3] == 0.5f,
            "repetition over the prompt: %g %g %g %g", l[0], l[1], l[2], l[3]);
    nv_sampler_accept(&s, 1);
    memcpy(l, rl, sizeof l);
    T_CHECK(nv_sample(&s, l) == 0 && l[1] == 1.25f, "repetition after a generated token: %g", l[1]);
    /* vLLM's order: the repetition penalty, then presence: token 3 (0.5, now present) -> 0.25 - 1 */
    T_CHECK(nv_sampler_set_penalties(&s, 1.0f, 0.0f) == NV_OK, "%s", nv_errmsg());
    nv_sampler_accept(&s, 3);
    memcpy(l, rl, sizeof l);
    nv_sample(&s, l);
    T_CHECK(l[3] == -0.75f, "repetition then presence: %g, want -0.75", l[3]);
    T_CHECK(nv_sampler_set_repetition(&s, 0.0f, NULL, 0) == NV_EINVAL && nv_sampler_set_repetition(&s, NAN, NULL, 0) == NV_EINVAL,
            "a repetition penalty <= 0 or NaN was accepted");
    nv_sampler_free(&s);
    /* llama.cpp's window (repeat_last_n 2) over the prompt [0, 2, 0] and the answer: a token in the last
       two loses the repetition penalty once, frequency x its count there and presence once; older
       ones nothing */
    static const int prompt[3] = {0, 2, 0};
    T_CHECK(nv_sampler_init(&s, 4, 0.0f, 0.0f, 1) == NV_OK && nv_sampler_set_repetition(&s, 2.0f, prompt, 3) == NV_OK &&
                nv_sampler_set_penalties(&s, 0.5f, 0.25f) == NV_OK && nv_sampler_set_penalty_window(&s, 2, prompt, 3) == NV_OK,
            "%s", nv_errmsg());
    memcpy(l, rl, sizeof l);
    T_CHECK(nv_sample(&s, l) == 1 && l[0] == 0.75f && l[1] == 2.5f && l[2] == -2.75f && l[3] == 0.5f, "window [2, 0]: %g %g %g %g", l[0],
            l[1], l[2], l[3]);
    nv_sampler_accept(&s, 1);
    memcpy(l, rl, sizeof l);
    T_CHECK(nv_sample(&s, l) == 0 && l[0] == 0.75f && l[1] == 0.5f && l[2] == -1.0f, "window [0, 1]: %g %g %g", l[0], l[1], l[2]);
    nv_sampler_accept(&s, 1);
    memcpy(l, rl, sizeof l);
    T_CHECK(nv_sample(&s, l) == 0 && l[0] == 3.0f && l[1] == 0.25f, "window [1, 1]: %g %g", l[0], l[1]);
    T_CHECK(nv_sampler_set_penalty_window(&s, -1, prompt, 3) == NV_OK, "%s", nv_errmsg()); /* all of it: [0, 2, 0] */
    memcpy(l, rl, sizeof l);
    nv_sample(&s, l);
    T_CHECK(l[0] == 1.5f - 0.5f - 0.5f && l[2] == -2.75f, "the whole history: %g %g", l[0], l[2]);
    T_CHECK(nv_sampler_set_penalty_window(&s, 0, prompt, 3) == NV_OK, "%s", nv_errmsg()); /* none */
    memcpy(l, rl, sizeof l);
    nv_sample(&s, l);
    T_CHECK(!memcmp(l, rl, sizeof l), "repeat_last_n 0 left a penalty");
    T_CHECK(nv_sampler_set_penalty_window(&s, -2, prompt, 3) == NV_EINVAL, "a window of -2 was accepted");
    nv_sampler_free(&s);
    /* llama.cpp's order over a window: the penalties, then DRY (token 1 followed the history's last
       token 0 before: DRY takes 1 from it after the repetition penalty halved it) */
    static const int rep_prompt[3] = {0, 1, 0};
    T_CHECK(nv_sampler_init(&s, 4, 0.0f, 0.0f, 1) == NV_OK && nv_sampler_set_repetition(&s, 2.0f, rep_prompt, 3) == NV_OK &&
                nv_sampler_set_penalty_window(&s, 64, rep_prompt, 3) == NV_OK &&
                nv_sampler_set_dry(&s, 1.0f, 1.0f, 1, -1, NULL, rep_prompt, 3) == NV_OK,
            "%s", nv_errmsg());
    memcpy(l, rl, sizeof l);
    nv_sample(&s, l);
    T_CHECK(l[1] == 2.5f / 2.0f - 1.0f, "the penalties, then DRY: %g, want %g", l[1], 2.5 / 2 - 1);
    nv_sampler_free(&s);
}

/* The tokens a sampler with llama.cpp's further filters draws from logits log(p) over 200 seeds, as a
 * bit set. */
static unsigned drawn(const float *p, int n, float typical, float sigma, float xtc_p, float xtc_t) {
    unsigned set = 0;
    for (int seed = 1; seed <= 200; seed++) {
        nv_sampler smp;
        float l[16];
        for (int i = 0; i < n; i++) l[i] = logf(p[i]);
        T_CHECK(nv_sampler_init(&smp, n, 1.0f, 1.0f, (uint64_t)seed * 7919) == NV_OK &&
                    nv_sampler_set_more(&smp, typical, sigma, xtc_p, xtc_t) == NV_OK,
                "%s", nv_errmsg());
        const int t = nv_sample(&smp, l);
        if (t >= 0 && t < 32) set |= 1u << t;
        nv_sampler_free(&smp);
    }
    return set;
}

/* typical_p keeps the tokens whose surprise is nearest the entropy (here not the likeliest one);
 * top_n_sigma the logits within n deviations of the largest; XTC removes the likely tokens but the
 * least likely of them; each off at its neutral value; bad values refused. */
static void test_sampler_llamacpp_filters(void) {
    const float p[4] = {0.5f, 0.2f, 0.2f, 0.1f};
    /* entropy 1.22 nats; surprises 0.69, 1.61, 1.61, 2.30: the two 0.2s are nearest, and reach 0.3 */
    T_CHECK(drawn(p, 4, 0.3f, -1, 0, 0.1f) == 0x6u, "typical 0.3 drew %#x, want tokens 1 and 2", drawn(p, 4, 0.3f, -1, 0, 0.1f));
    T_CHECK(drawn(p, 4, 1.0f, -1, 0, 0.1f) == 0xfu, "typical 1 (off) drew %#x", drawn(p, 4, 1.0f, -1, 0, 0.1f));
    const float q[8] = {0.6f, 0.3f, 0.02f, 0.02f, 0.02f, 0.02f, 0.01f, 0.01f};
    T_CHECK(drawn(q, 8, 1.0f, 0.5f, 0, 0.1f) == 0x3u, "top-n-sigma 0.5 drew %#x, want tokens 0 and 1", drawn(q, 8, 1.0f, 0.5f, 0, 0.1f));
    T_CHECK(drawn(q, 8, 1.0f, 0.01f, 0, 0.1f) == 0x1u, "top-n-sigma 0.01 drew %#x", drawn(q, 8, 1.0f, 0.01f, 0, 0.1f));
    const float x[4] = {0.5f, 0.3f, 0.15f, 0.05f};
    T_CHECK(drawn(x, 4, 1.0f, -1, 1.0f, 0.1f) == 0xcu, "XTC drew %#x, want tokens 2 and 3", drawn(x, 4, 1.0f, -1, 1.0f, 0.1f));
    T_CHECK((drawn(x, 4, 1.0f, -1, 1.0f, 0.6f) & 0x1u) != 0, "XTC with no token above its threshold removed the top one");
    /* off: the same tokens as a sampler without them, seed for seed */
    for (int seed = 1; seed <= 50; seed++) {
        nv_sampler a, b;
        float la[4], lb[4];
        for (int i = 0; i < 4; i++) la[i] = lb[i] = logf(x[i]);
        nv_sampler_init(&a, 4, 0.9f, 0.9f, (uint64_t)seed);
        nv_sampler_init(&b, 4, 0.9f, 0.9f, (uint64_t)seed);
        nv_sampler_set_more(&b, 1.0f, -1.0f, 0.0f, 0.1f);
        T_CHECK(nv_sample(&a, la) == nv_sample(&b, lb), "seed %d: neutral values changed the draw", seed);
        nv_sampler_free(&a);
        nv_sampler_free(&b);
    }
    /* Mirostat: a tiny target surprise keeps the likeliest token alone (both versions); a large one
       lets the others in, and mu follows the surprise drawn */
    const float z[8] = {0.3f, 0.2f, 0.15f, 0.1f, 0.1f, 0.05f, 0.05f, 0.05f};
    for (int v = 1; v <= 2; v++) {
        unsigned tiny = 0, wide = 0;
        for (int seed = 1; seed <= 100; seed++) {
            for (int k = 0; k < 2; k++) {
                nv_sampler m;
                float l[8];
                for (int i = 0; i < 8; i++) l[i] = logf(z[i]);
                nv_sampler_init(&m, 8, 1.0f, 1.0f, (uint64_t)seed * 31);
                T_CHECK(nv_sampler_set_mirostat(&m, v, k ? 8.0f : 0.01f, 0.1f) == NV_OK, "%s", nv_errmsg());
                const float mu0 = m.mirostat_mu;
                const int t = nv_sample(&m, l);
                if (k) wide |= 1u << t;
                else tiny |= 1u << t;
                T_CHECK(m.mirostat_mu != mu0 || t == 0, "mu stayed %g after drawing token %d", mu0, t);
                nv_sampler_free(&m);
            }
        }
        T_CHECK(tiny == 0x1u, "mirostat %d, tau 0.01: drew %#x, want token 0 alone", v, tiny);
        T_CHECK(__builtin_popcount(wide) >= 4, "mirostat %d, tau 8: drew only %#x", v, wide);
    }
    nv_sampler smp;
    nv_sampler_init(&smp, 4, 1.0f, 1.0f, 1);
    T_CHECK(nv_sampler_set_mirostat(&smp, 3, 5, 0.1f) != NV_OK && nv_sampler_set_mirostat(&smp, 2, -1, 0.1f) != NV_OK,
            "bad Mirostat settings accepted");
    T_CHECK(nv_sampler_set_more(&smp, 0.0f, -1, 0, 0.1f) != NV_OK && nv_sampler_set_more(&smp, 1.0f, -1, 1.5f, 0.1f) != NV_OK &&
                nv_sampler_set_more(&smp, 1.0f, NAN, 0, 0.1f) != NV_OK,
            "bad settings accepted");
    nv_sampler_free(&smp);
}

/* Dynamic temperature: each draw is the draw of a plain sampler at the temperature the entropy picks,
 * computed here from llama.cpp's formula (lo + (hi - lo) (H / ln n)^exponent); the most certain
 * distribution gets the lowest temperature; a range 0 changes nothing; bad settings are refused. */
static void test_sampler_dynatemp(void) {
    const float p[5] = {0.6f, 0.2f, 0.1f, 0.07f, 0.03f};
    double h = 0;
    for (int i = 0; i < 5; i++) h -= p[i] * log(p[i]);
    const float T = 1.0f, range = 0.6f, expo = 1.5f;
    const float want = (float)((T - range) + 2 * range * pow(h / log(5.0), expo));
    for (int seed = 1; seed <= 200; seed++) {
        nv_sampler d, f;
        float ld[5], lf[5];
        for (int i = 0; i < 5; i++) ld[i] = lf[i] = logf(p[i]);
        nv_sampler_init(&d, 5, T, 1.0f, (uint64_t)seed);
        nv_sampler_init(&f, 5, want, 1.0f, (uint64_t)seed);
        T_CHECK(nv_sampler_set_dynatemp(&d, range, expo) == NV_OK, "%s", nv_errmsg());
        T_CHECK(nv_sample(&d, ld) == nv_sample(&f, lf), "seed %d: not the draw at temperature %g", seed, (double)want);
        for (int i = 0; i < 5; i++) T_CHECK(fabsf(ld[i] - lf[i]) < 1e-6f, "seed %d: probabilities differ", seed);
        nv_sampler_free(&d);
        nv_sampler_free(&f);
    }
    /* a certain distribution: the temperature at the range's bottom (0 here: greedy) */
    nv_sampler c;
    float certain[3] = {30.0f, 0.0f, 0.0f};
    nv_sampler_init(&c, 3, 0.5f, 1.0f, 7);
    nv_sampler_set_dynatemp(&c, 0.5f, 1.0f);
    T_CHECK(nv_sample(&c, certain) == 0, "certain: not the top token");
    T_CHECK(nv_sampler_set_dynatemp(&c, -1.0f, 1.0f) != NV_OK && nv_sampler_set_dynatemp(&c, 1.0f, NAN) != NV_OK,
            "bad dynamic temperature accepted");
    nv_sampler_free(&c);
}

/* The DRY penalty a greedy draw leaves on each token of a 10-token vocabulary after history h (all
 * logits 0 before). */
static void dry_logits(const int *h, int n, float mult, float base, int allowed, int last_n, const unsigned char *breaker,
                       float *out) {
    nv_sampler smp;
    T_CHECK(nv_sampler_init(&smp, 10, 0.0f, 1.0f, 1) == NV_OK, "init");
    T_CHECK(nv_sampler_set_dry(&smp, mult, base, allowed, last_n, breaker, h, n - 1) == NV_OK, "%s", nv_errmsg());
    nv_sampler_accept(&smp, h[n - 1]); /* the last one accepted, as a generated token is */
    for (int i = 0; i < 10; i++) out[i] = 0.0f;
    nv_sample(&smp, out);
    nv_sampler_free(&smp);
}

/* DRY: the token that would repeat the run the history ends with loses multiplier x base^(length -
 * allowed), the longest run counting; shorter runs, runs across a breaker, and runs outside the
 * window cost nothing; a long repeat's penalty stays finite; bad settings are refused. */
static void test_sampler_dry(void) {
    float l[10];
    const int h1[] = {1, 2, 3, 1, 2};
    dry_logits(h1, 5, 1.0f, 2.0f, 2, -1, NULL, l);
    T_CHECK(l[3] == -1.0f && l[1] == 0.0f && l[2] == 0.0f, "[1 2 3 1 2]: 3 loses %g (want 1), 1 %g, 2 %g", -l[3], -l[1], -l[2]);
    const int h2[] = {1, 2, 3, 4, 1, 2, 3};
    dry_logits(h2, 7, 1.0f, 2.0f, 2, -1, NULL, l);
    T_CHECK(l[4] == -2.0f, "[1 2 3 4 1 2 3]: 4 loses %g (a run of 3: 2^1)", -l[4]);
    dry_logits(h2, 7, 0.5f, 2.0f, 4, -1, NULL, l);
    T_CHECK(l[4] == 0.0f, "a run of 3 under an allowed length of 4 costs %g", -l[4]);
    const int h3[] = {5, 5, 5, 5, 5, 5};
    dry_logits(h3, 6, 1.0f, 1.75f, 2, -1, NULL, l);
    T_CHECK(fabsf(l[5] + powf(1.75f, 3.0f)) < 1e-4f, "[5 x 6]: 5 loses %g (the run of 5 before the last: 1.75^3)", -l[5]);
    unsigned char br[10] = {0};
    br[5] = 1;
    const int h4[] = {1, 5, 2, 3, 1, 5, 2};
    dry_logits(h4, 7, 1.0f, 2.0f, 2, -1, br, l);
    T_CHECK(l[3] == 0.0f, "a run across a breaker costs %g", -l[3]);
    dry_logits(h1, 5, 1.0f, 2.0f, 2, -1, (const unsigned char[10]){0, 0, 1}, l);
    T_CHECK(l[3] == 0.0f, "after a breaker, nothing costs (3: %g)", -l[3]);
    const int h5[] = {1, 2, 3, 9, 9, 8, 9, 1, 2};
    dry_logits(h5, 9, 1.0f, 2.0f, 2, 4, NULL, l);
    T_CHECK(l[3] == 0.0f, "a run outside the window of 4 costs %g", -l[3]);
    dry_logits(h5, 9, 1.0f, 2.0f, 2, -1, NULL, l);
    T_CHECK(l[3] == -1.0f, "the same run inside the window costs %g", -l[3]);
    int h6[300];
    for (int i = 0; i < 300; i++) h6[i] = i % 2;
    dry_logits(h6, 300, 1.0f, 100.0f, 1, -1, NULL, l);
    T_CHECK(isfinite(l[0]) && l[0] < -1e20f, "a long repeat: %g", l[0]);
    nv_sampler smp;
    T_CHECK(nv_sampler_init(&smp, 10, 0.0f, 1.0f, 1) == NV_OK, "init");
    T_CHECK(nv_sampler_set_dry(&smp, -1.0f, 1.75f, 2, -1, NULL, NULL, 0) != NV_OK &&
                nv_sampler_set_dry(&smp, 1.0f, 0.5f, 2, -1, NULL, NULL, 0) != NV_OK &&
                nv_sampler_set_dry(&smp, 1.0f, 1.75f, 0, -1, NULL, NULL, 0) != NV_OK &&
                nv_sampler_set_dry(&smp, 1.0f, 1.75f, 2, -2, NULL, NULL, 0) != NV_OK,
            "bad DRY settings accepted");
    nv_sampler_free(&smp);
}

/* top-k and min-p: over many draws from 1,000 random logits, only the k most likely tokens (min-p:
 * only those at least min_p x the top probability) come out; top-k 1 is greedy at any temperature;
 * with top-p on as well, the nucleus is taken from what they kept; bad settings are refused. */
static void test_sampler_filters(void) {
    enum { V = 1000, DRAWS = 4000 };
    static float logits[V], l[V], probs[V];
    nv_rng rng;
    nv_rng_seed(&rng, 5);
    for (int i = 0; i < V; i++) logits[i] = 4.0f * nv_rng_uniform(&rng);
    memcpy(probs, logits, sizeof probs);
    nv_softmax(probs, V);
    /* the 10th largest probability and the largest */
    float sorted[V], pmax = 0;
    memcpy(sorted, probs, sizeof sorted);
    for (int i = 0; i < 10; i++)
        for (int j = i + 1; j < V; j++)
            if (sorted[j] > sorted[i]) {
                float t = sorted[i];
                sorted[i] = sorted[j];
                sorted[j] = t;
            }
    pmax = sorted[0];
    nv_sampler s;
    T_CHECK(nv_sampler_init(&s, V, 1.0f, 0.0f, 11) == NV_OK && nv_sampler_set_filters(&s, 10, 0.0f) == NV_OK, "%s", nv_errmsg());
    int outside = 0, distinct = 0, hits[V] = {0};
    for (int d = 0; d < DRAWS; d++) {
        memcpy(l, logits, sizeof l);
        int t = nv_sample(&s, l);
        outside += probs[t] < sorted[9];
        distinct += hits[t]++ == 0;
    }
    T_CHECK(outside == 0 && distinct == 10, "top-k 10: %d draws outside the top 10, %d distinct tokens", outside, distinct);
    nv_sampler_set_filters(&s, 0, 0.9f);
    outside = 0;
    for (int d = 0; d < DRAWS; d++) {
        memcpy(l, logits, sizeof l);
        int t = nv_sample(&s, l);
        outside += probs[t] < 0.9f * pmax;
    }
    T_CHECK(outside == 0, "min-p 0.9: %d draws below 0.9 x the top probability", outside);
    nv_sampler_set_filters(&s, 1, 0.0f);
    s.temperature = 1.7f;
    int greedy = 1;
    for (int d = 0; d < 200; d++) {
        memcpy(l, logits, sizeof l);
        greedy &= nv_sample(&s, l) == nv_argmax(logits, V);
    }
    T_CHECK(greedy, "top-k 1 is not greedy");
    /* top-k 10 then top-p 0.15: the nucleus is the most likely of those ten (each ~0.1 of them) */
    nv_sampler_set_filters(&s, 10, 0.0f);
    s.temperature = 1.0f;
    s.top_p = 0.15f;
    outside = 0;
    for (int d = 0; d < DRAWS; d++) {
        memcpy(l, logits, sizeof l);
        int t = nv_sample(&s, l);
        outside += probs[t] < sorted[1];
    }
    T_CHECK(outside == 0, "top-k 10, top-p 0.15: %d draws beyond the two most likely", outside);
    T_CHECK(nv_sampler_set_filters(&s, -1, 0.0f) == NV_EINVAL && nv_sampler_set_filters(&s, 0, 1.5f) == NV_EINVAL &&
                nv_sampler_set_filters(&s, 0, NAN) == NV_EINVAL,
            "bad top-k / min-p accepted");
    nv_sampler_free(&s);
}

/* Settings the API accepts that once read before the top-p scratch (found by fuzz/fuzz_api.c):
 * top_p below 1/vocab over near-uniform logits kept no candidate, and a temperature so small
 * that logits / T overflow made every probability NaN. */
static void test_sampler_extremes(void) {
    enum { V = 512 };
    float *l = malloc(V * sizeof *l);
    nv_sampler s;
    T_CHECK(nv_sampler_init(&s, V, 1.0f, 0.001f, 7) == NV_OK, "%s", nv_errmsg());
    for (int step = 0; step < 4; step++) {
        for (int i = 0; i < V; i++) l[i] = 0.0f;
        int t = nv_sample(&s, l);
        T_CHECK(t == 0, "top_p 0.001 over flat logits: token %d, expected the first top token", t);
    }
    nv_sampler_free(&s);
    const float logits[6] = {0.1f, 2.0f, -1.0f, 2.0f, 0.5f, 1.9f}, negative[3] = {-3.0f, -1.0f, -2.0f};
    const float tops[2] = {0.9f, 1.0f};
    for (int k = 0; k < 2; k++) {
        nv_sampler_init(&s, 6, 1e-40f, tops[k], 7);
        memcpy(l, logits, sizeof logits);
        T_CHECK(nv_sample(&s, l) == 1, "temperature 1e-40, top_p %g: not greedy", tops[k]);
        nv_sampler_free(&s);
        nv_sampler_init(&s, 3, 1e-40f, tops[k], 7);
        memcpy(l, negative, sizeof negative);
        T_CHECK(nv_sample(&s, l) == 1, "temperature 1e-40, negative logits, top_p %g: not greedy", tops[k]);
        nv_sampler_free(&s);
    }
    /* NaN logits (a malformed model's) give some token of the vocabulary */
    nv_sampler_init(&s, 6, 1.0f, 0.5f, 7);
    for (int i = 0; i < 6; i++) l[i] = NAN;
    int t = nv_sample(&s, l);
    T_CHECK(t >= 0 && t < 6, "NaN logits: token %d", t);
    nv_sampler_free(&s);
    free(l);
}

static void test_sampler(void) {
    float logits[6] = {0.1f, 2.0f, -1.0f, 2.0f, 0.5f, 1.9f};
    nv_sampler s;
    T_CHECK(nv_sampler_init(&s, 6, 0.0f, 0.9f, 1) == NV_OK, "%s", nv_errmsg());
    float l[6];
    memcpy(l, logits, sizeof l);
    T_CHECK(nv_sample(&s, l) == 1, "greedy must pick the first maximum");
    nv_sampler_free(&s);
    T_CHECK(nv_sampler_init(&s, 6, -1.0f, 0.9f, 1) == NV_EINVAL, "negative temperature accepted");
    T_CHECK(nv_sampler_init(&s, 6, 1.0f, 1.5f, 1) == NV_EINVAL, "top-p > 1 accepted");
    /* same seed -> same sequence; different seed -> a different one */
    int a[64], b[64], c[64];
    for (int r = 0; r < 3; r++) {
        nv_sampler_init(&s, 6, 1.0f, 0.0f, r == 2 ? 43 : 42);
        for (int i = 0; i < 64; i++) {
            memcpy(l, logits, sizeof l);
            (r == 0 ? a : r == 1 ? b : c)[i] = nv_sample(&s, l);
        }
        nv_sampler_free(&s);
    }
    T_CHECK(memcmp(a, b, sizeof a) == 0, "same seed gave different samples");
    T_CHECK(memcmp(a, c, sizeof a) != 0, "different seeds gave identical samples");
    /* frequencies follow softmax(logits / T) */
    int counts[6] = {0};
    const int N = 20000;
    nv_sampler_init(&s, 6, 0.7f, 0.0f, 5);
    for (int i = 0; i < N; i++) {
        memcpy(l, logits, sizeof l);
        counts[nv_sample(&s, l)]++;
    }
    nv_sampler_free(&s);
    memcpy(l, logits, sizeof l);
    for (int i = 0; i < 6; i++) l[i] /= 0.7f;
    nv_softmax(l, 6);
    for (int i = 0; i < 6; i++)
        T_CHECK(fabsf((float)counts[i] / N - l[i]) < 0.015f, "token %d: frequency %.3f vs probability %.3f", i,
                (float)counts[i] / N, l[i]);
    /* top-p 0.5 keeps only the nucleus: tokens 1, 3 (p ~0.3 each) and not the tail */
    nv_sampler_init(&s, 6, 1.0f, 0.5f, 9);
    int outside = 0;
    for (int i = 0; i < 2000; i++) {
        memcpy(l, logits, sizeof l);
        int t = nv_sample(&s, l);
        outside += !(t == 1 || t == 3);
    }
    nv_sampler_free(&s);
    T_CHECK(outside == 0, "%d samples outside the top-p nucleus", outside);
}

/* llama2.c's top-p draw (run.c's sample_topp), its candidates ordered most likely first and equal
 * ones by index (what its qsort, glibc's stable merge sort, gives them in index order). */
static int by_prob_then_index(const void *a, const void *b) {
    const nv_prob_index *x = a, *y = b;
    return x->prob > y->prob ? -1 : x->prob < y->prob ? 1 : (x->index > y->index) - (x->index < y->index);
}
static int reference_topp(const float *logits, int n, float topp, uint64_t *state, float *p, nv_prob_index *c) {
    memcpy(p, logits, (size_t)n * sizeof *p);
    nv_softmax(p, n);
    const float coin = nv_xorshift_f32(state), cutoff = (1.0f - topp) / (float)(n - 1);
    int n0 = 0;
    for (int i = 0; i < n; i++)
        if (p[i] >= cutoff) c[n0++] = (nv_prob_index){p[i], i};
    qsort(c, (size_t)n0, sizeof *c, by_prob_then_index);
    float cumulative = 0.0f;
    int last = n0 - 1;
    for (int i = 0; i < n0; i++)
        if ((cumulative += c[i].prob) > topp) {
            last = i;
            break;
        }
    float r = coin * cumulative, cdf = 0.0f;
    for (int i = 0; i <= last; i++)
        if (r < (cdf += c[i].prob)) return c[i].index;
    return c[last].index;
}

/* A long, nearly flat distribution full of ties: 50 levels a hundredth apart, every 997th token 3 above. */
static void long_flat_logits(float *logits, int n) {
    for (int i = 0; i < n; i++) logits[i] = (float)((i * 7919) % 50) * 0.01f + (i % 997 == 0 ? 3.0f : 0.0f);
}

/* Top-p over a long, nearly flat distribution full of ties (tens of thousands of candidates, sorted
 * by radix rather than qsort) draws llama2.c's tokens, seed for seed. */
static void test_sampler_topp_long(void) {
    const int n = 32000;
    float *logits = malloc(sizeof(float) * n), *l = malloc(sizeof(float) * n), *p = malloc(sizeof(float) * n);
    nv_prob_index *c = malloc(sizeof *c * (size_t)n);
    long_flat_logits(logits, n);
    nv_sampler s;
    T_CHECK(nv_sampler_init(&s, n, 1.0f, 0.9f, 77) == NV_OK, "%s", nv_errmsg());
    uint64_t state = 77;
    int differ = -1, distinct = 0, prev = -1;
    for (int t = 0; t < 120 && differ < 0; t++) {
        memcpy(l, logits, sizeof(float) * n);
        const int got = nv_sample(&s, l), want = reference_topp(logits, n, 0.9f, &state, p, c);
        if (got != want) differ = t;
        distinct += got != prev;
        prev = got;
    }
    T_CHECK(differ < 0, "draw %d differs from llama2.c's", differ);
    T_CHECK(distinct > 100, "only %d changes of token in 120 draws", distinct);
    nv_sampler_free(&s);
    free(logits), free(l), free(p), free(c);
}

/* Locally typical sampling over the same long distribution draws what the procedure gives with its
 * candidates ordered by distance from the entropy, equal ones by index (the stable qsort_r's order). */
static const float *typical_dist;
static int by_dist_then_index(const void *a, const void *b) {
    const nv_prob_index *x = a, *y = b;
    const float dx = typical_dist[x->index], dy = typical_dist[y->index];
    return dx < dy ? -1 : dx > dy ? 1 : (x->index > y->index) - (x->index < y->index);
}
static void test_sampler_typical_long(void) {
    const int n = 32000;
    float *logits = malloc(sizeof(float) * n), *l = malloc(sizeof(float) * n), *p = malloc(sizeof(float) * n),
          *dist = malloc(sizeof(float) * n);
    nv_prob_index *c = malloc(sizeof *c * (size_t)n);
    long_flat_logits(logits, n);
    nv_sampler s;
    T_CHECK(nv_sampler_init(&s, n, 1.0f, 1.0f, 99) == NV_OK && nv_sampler_set_more(&s, 0.5f, -1.0f, 0.0f, 0.1f) == NV_OK, "%s",
            nv_errmsg());
    uint64_t state = 99;
    int differ = -1;
    for (int t = 0; t < 40 && differ < 0; t++) {
        memcpy(l, logits, sizeof(float) * n);
        const int got = nv_sample(&s, l);
        memcpy(p, logits, sizeof(float) * n);
        nv_softmax(p, n);
        const float coin = nv_xorshift_f32(&state);
        double total = 0, ent = 0;
        for (int i = 0; i < n; i++) total += p[i];
        for (int i = 0; i < n; i++) ent -= p[i] / total * log(p[i] / total);
        for (int i = 0; i < n; i++) c[i] = (nv_prob_index){p[i], i}, dist[i] = (float)fabs(-log(p[i] / total) - ent);
        typical_dist = dist;
        qsort(c, (size_t)n, sizeof *c, by_dist_then_index);
        double cum = 0;
        int k = 0;
        while (k < n && (cum += c[k++].prob / total) < 0.5) {}
        float sum = 0.0f, cdf = 0.0f;
        for (int i = 0; i < k; i++) sum += c[i].prob;
        int want = c[k - 1].index;
        for (int i = 0; i < k; i++)
            if (coin * sum < (cdf += c[i].prob)) {
                want = c[i].index;
                break;
            }
        if (got != want) differ = t;
    }
    T_CHECK(differ < 0, "typical draw %d differs from the procedure's", differ);
    nv_sampler_free(&s);
    free(logits), free(l), free(p), free(dist), free(c);
}

/* A model whose fp32 block is twice this machine's memory (a 70B-shaped one: 280 GB) is address space
 * until written, as a quantized model's pending matrices are never written: it allocates, its
 * far ends take values, and it frees. */
static void test_weights_larger_than_memory(void) {
    if (t_sanitized()) {
        t_skip("sanitizer builds allocate the weights with calloc, which they watch");
        return;
    }
    nv_config c = {8192, 28672, 80, 64, 8, 128, 32000, 4096, 500000.0f, 1e-5f, 0, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    const double bytes = (double)nv_config_param_count(&c) * 4, mem = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (bytes < 2 * mem) {
        t_skip("this machine has more than half of 280 GB of memory");
        return;
    }
    nv_model m;
    T_CHECK(nv_model_alloc(&m, &c) == NV_OK, "%s", nv_errmsg());
    if (!m.params) return;
    m.w.rms_att[0] = 1.0f, m.params[m.n_params - 1] = 2.0f;
    T_CHECK(m.w.rms_att[0] == 1.0f && m.params[m.n_params - 1] == 2.0f && m.w.w2[12345] == 0.0f, "the far ends");
    nv_model_free(&m);
}

static void test_init_presets(void) {
    nv_config c;
    T_CHECK(nv_config_preset("stories15M", &c) == NV_OK && c.dim == 288 && c.n_layers == 6, "stories15M preset");
    T_CHECK(nv_config_preset("nope", &c) == NV_EINVAL, "unknown preset accepted");
    T_CHECK(nv_config_preset("stories110M", &c) == NV_OK && nv_config_param_count(&c) > 100000000ull &&
                nv_config_param_count(&c) < 120000000ull,
            "stories110M parameter count %llu", (unsigned long long)nv_config_param_count(&c));
    nv_config_preset("stories260K", &c);
    nv_model m, l;
    nv_model_alloc(&m, &c);
    nv_model_init_random(&m, 11);
    T_CHECK(nv_model_save_v1(&m, t_path("init.bin")) == NV_OK, "%s", nv_errmsg());
    T_CHECK(nv_model_load(t_path("init.bin"), &l) == NV_OK, "%s", nv_errmsg());
    T_CHECK(memcmp(l.params, m.params, m.n_params * 4) == 0, "init weights differ after reload");
    double sum2 = 0;
    for (int i = 0; i < 512 * 64; i++) sum2 += (double)m.w.tok_emb[i] * m.w.tok_emb[i];
    double std = sqrt(sum2 / (512 * 64));
    T_CHECK(std > 0.018 && std < 0.022, "embedding std %.4f, expected ~0.02", std);
    nv_model_free(&m);
    nv_model_free(&l);
}

/* nv_rng_jump(n) leaves the state n sequential draws leave; random initialisation draws its stream
 * in pieces from jumped states and gives exactly the sequential stream's values (the one order:
 * token embedding, wq, wk, wv, wo, w1, w2, w3, classifier), on one thread or two. */
static void test_rng_jump_and_parallel_init(void) {
    static const uint64_t steps[] = {0, 1, 2, 63, 64, 65, 1000, 123457};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        nv_rng a, b;
        nv_rng_seed(&a, 42 + i);
        b = a;
        for (uint64_t k = 0; k < steps[i]; k++) nv_xorshift_u32(&a.state);
        nv_rng_jump(&b, steps[i]);
        T_CHECK(a.state == b.state, "jump %llu", (unsigned long long)steps[i]);
    }
    nv_config c = {64, 96, 3, 4, 2, 16, 9000, 32, 10000.0f, 1e-5f, 0, 1, 0, {0}, 0, NV_CONFIG_PLAIN}; /* > 2^20 normals: drawn in pieces */
    nv_model m1, m2;
    T_CHECK(nv_model_alloc(&m1, &c) == NV_OK && nv_model_alloc(&m2, &c) == NV_OK, "%s", nv_errmsg());
    if (!m1.params || !m2.params) return;
    const int before = nv_pool_threads();
    nv_pool_init(1);
    nv_model_init_random(&m1, 5);
    nv_pool_init(2);
    nv_model_init_random(&m2, 5);
    nv_pool_init(before);
    T_CHECK(!memcmp(m1.params, m2.params, m1.n_params * 4), "initialisation depends on the thread count");
    nv_rng r;
    nv_rng_seed(&r, 5);
    const float std = 0.02f, res = 0.02f / sqrtf(6.0f);
    const struct {
        const float *p;
        size_t n;
        float std;
    } mats[] = {{m1.w.tok_emb, 9000 * 64, std}, {m1.w.wq, 3 * 64 * 64, std},   {m1.w.wk, 3 * 32 * 64, std},
                {m1.w.wv, 3 * 32 * 64, std},    {m1.w.wo, 3 * 64 * 64, res},   {m1.w.w1, 3 * 96 * 64, std},
                {m1.w.w2, 3 * 64 * 96, res},    {m1.w.w3, 3 * 96 * 64, std},   {m1.w.wcls, 9000 * 64, std}};
    size_t bad = 0, total = 0;
    for (size_t k = 0; k < sizeof mats / sizeof mats[0]; k++)
        for (size_t i = 0; i < mats[k].n; i++, total++) bad += mats[k].p[i] != mats[k].std * nv_rng_normal(&r);
    T_CHECK(bad == 0 && total > (1u << 20), "%zu of %zu values differ from the sequential stream", bad, total);
    nv_model_free(&m1);
    nv_model_free(&m2);
}

int main(void) {
    nv_engines_init("scalar", 1);
    T_RUN(test_load_v0_stories260K);
    T_RUN(test_v1_roundtrip_and_exact_greedy);
    T_RUN(test_chunked_prefill_is_exact);
    T_RUN(test_general_config_forward);
    T_RUN(test_chunked_attention_shapes);
    T_RUN(test_window_ring);
    T_RUN(test_softmax_matches_scalar);
    T_RUN(test_silu_matches_scalar);
    T_RUN(test_softmax_causal_matches_rows);
    T_RUN(test_separate_classifier_v0_and_v1);
    T_RUN(test_malformed_checkpoints_refused);
    T_RUN(test_sampler);
    T_RUN(test_sampler_topp_long);
    T_RUN(test_sampler_typical_long);
    T_RUN(test_sampler_adjustments);
    T_RUN(test_sampler_filters);
    T_RUN(test_sampler_dry);
    T_RUN(test_sampler_dynatemp);
    T_RUN(test_sampler_llamacpp_filters);
    T_RUN(test_sampler_extremes);
    T_RUN(test_init_presets);
    T_RUN(test_weights_larger_than_memory);
    T_RUN(test_rng_jump_and_parallel_init);
    return t_done();
}
