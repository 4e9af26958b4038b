/* Training data loader: u16 (.bin) and u32 (.u32) shards and llm.c's, random windows from the training
 * split only, the cursor's determinism and resumption, validation batches, text files split
 * into BOS-led documents, the unigram baseline, and malformed inputs. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <unistd.h>
#include <zlib.h>

#include "model/tokenizer.h"
#include "serve/api.h"
#include "serve/chat.h"
#include "base/pool.h"
#include "t.h"
#include "train/data.h"


/* A u16 shard whose token i is first + i: every window shows where it came from. */
static const char *write_ramp_u16(const char *name, int n, int first) {
    uint16_t *v = malloc((size_t)n * sizeof *v);
    for (int i = 0; i < n; i++) v[i] = (uint16_t)(first + i);
    const char *p = t_write(name, v, (size_t)n * sizeof *v);
    free(v);
    return p;
}

static const char *write_ramp_u32(const char *name, int n, uint32_t first) {
    uint32_t *v = malloc((size_t)n * sizeof *v);
    for (int i = 0; i < n; i++) v[i] = first + (uint32_t)i;
    const char *p = t_write(name, v, (size_t)n * sizeof *v);
    free(v);
    return p;
}

/* llm.c's shard of n tokens first + i: its header (magic, version, the count; 256 int32s), then
 * uint16 tokens (magic 20240520, version 1) or uint32 ones (20240801, version 7); `missing` tokens left
 * off the end; version 0: its magic's. */
static const char *write_llmc(const char *name, int32_t magic, int version, int n, uint32_t first, int missing) {
    const size_t width = magic == 20240520 ? 2 : 4, bytes = 1024 + (size_t)(n - missing) * width;
    uint8_t *v = calloc(1, 1024 + (size_t)n * width);
    const int32_t head[3] = {magic, version ? version : magic == 20240520 ? 1 : 7, n};
    memcpy(v, head, sizeof head);
    for (int i = 0; i < n; i++) {
        const uint32_t t = first + (uint32_t)i;
        const uint16_t t16 = (uint16_t)t;
        memcpy(v + 1024 + (size_t)i * width, width == 2 ? (const void *)&t16 : (const void *)&t, width);
    }
    const char *p = t_write(name, v, bytes);
    free(v);
    return p;
}

static int open_ok(nv_dataset *ds, const char *const *paths, int n, const nv_tokenizer *tok, int vocab, float val) {
    nv_err e = nv_dataset_open(ds, paths, n, tok, vocab, val);
    T_CHECK(e == NV_OK, "open: %s", nv_errmsg());
    return e == NV_OK;
}

/* ---- shards and windows ------------------------------------------------------------------ */

static void test_u16_windows_from_training_split(void) {
    const char *p = write_ramp_u16("ramp.bin", 5000, 0);
    nv_dataset ds;
    if (!open_ok(&ds, &p, 1, NULL, 5000, 0.1f)) return;
    T_CHECK(ds.n_src == 1 && ds.src[0].width == 2 && ds.src[0].n_tokens == 5000, "width %d tokens %llu",
            ds.src[0].width, (unsigned long long)ds.src[0].n_tokens);
    T_CHECK(ds.train_tokens == 4500 && ds.val_tokens == 500, "split %llu/%llu", (unsigned long long)ds.train_tokens,
            (unsigned long long)ds.val_tokens);
    enum { B = 4, T = 16 };
    int in[B * T], tg[B * T], lo = 1 << 30, hi = -1;
    nv_data_cursor c;
    nv_data_cursor_init(&c, 7);
    for (int it = 0; it < 500; it++) {
        T_CHECK(nv_data_next_batch(&ds, &c, B, T, in, tg, NULL) == NV_OK, "%s", nv_errmsg());
        for (int b = 0; b < B; b++) {
            int s = in[b * T];
            lo = s < lo ? s : lo;
            hi = s > hi ? s : hi;
            for (int t = 0; t < T; t++) {
                T_CHECK(in[b * T + t] == s + t && tg[b * T + t] == s + t + 1, "window %d,%d not contiguous", it, b);
                if (t + 1 < T) T_CHECK(tg[b * T + t] == in[b * T + t + 1], "targets are not inputs shifted by one");
            }
            /* the last target is token s + T, which must lie in [0, 4500) */
            T_CHECK(s >= 0 && s + T < 4500, "window at %d reaches the held-out tail", s);
        }
    }
    T_CHECK(c.windows == 500 * B, "cursor counted %llu windows", (unsigned long long)c.windows);
    T_CHECK(lo < 100 && hi > 4400, "2000 windows starting only in [%d, %d]", lo, hi);
    nv_dataset_close(&ds);
}

static void test_u32_and_mixed_sources(void) {
    const char *paths[2] = {write_ramp_u32("big.u32", 3000, 70000), write_ramp_u16("small.bin", 1000, 10)};
    nv_dataset ds;
    if (!open_ok(&ds, paths, 2, NULL, 100000, 0.2f)) return;
    T_CHECK(ds.src[0].width == 4 && ds.src[0].n_tokens == 3000 && ds.src[1].width == 2 && ds.src[1].n_tokens == 1000,
            "widths %d %d", ds.src[0].width, ds.src[1].width);
    T_CHECK(nv_source_token(&ds.src[0], 2999) == 72999 && nv_source_token(&ds.src[1], 5) == 15, "token values");
    T_CHECK(ds.train_tokens == 2400 + 800 && ds.val_tokens == 600 + 200, "split");
    enum { B = 8, T = 32 };
    int in[B * T], tg[B * T], from_big = 0, from_small = 0;
    nv_data_cursor c;
    nv_data_cursor_init(&c, 123);
    for (int it = 0; it < 200; it++) {
        T_CHECK(nv_data_next_batch(&ds, &c, B, T, in, tg, NULL) == NV_OK, "%s", nv_errmsg());
        for (int b = 0; b < B; b++) {
            int s = in[b * T], big = s >= 70000;
            from_big += big;
            from_small += !big;
            int end = big ? 70000 + 2400 : 10 + 800; /* first held-out token */
            for (int t = 0; t < T; t++)
                T_CHECK(in[b * T + t] == s + t && tg[b * T + t] == s + t + 1, "a window mixes sources or skips");
            T_CHECK(s + T < end && s >= (big ? 70000 : 10), "window at %d leaves the training split", s);
        }
    }
    /* windows are drawn in proportion to the starts each source offers: 2368 vs 768 */
    T_CHECK(from_big > 2 * from_small && from_small > 200, "big %d small %d", from_big, from_small);
    nv_dataset_close(&ds);
    /* llm.c's shards (GPT-2's uint16 tokens, Llama 3's uint32 ones): the tokens after the header */
    const char *llmc[2] = {write_llmc("gpt2.bin", 20240520, 0, 2000, 50000, 0), write_llmc("llama3.bin", 20240801, 0, 1500, 90000, 0)};
    if (!open_ok(&ds, llmc, 2, NULL, 100000, 0.1f)) return;
    T_CHECK(ds.src[0].width == 2 && ds.src[0].n_tokens == 2000 && ds.src[1].width == 4 && ds.src[1].n_tokens == 1500, "llm.c: widths %d %d, %llu %llu tokens",
            ds.src[0].width, ds.src[1].width, (unsigned long long)ds.src[0].n_tokens, (unsigned long long)ds.src[1].n_tokens);
    T_CHECK(nv_source_token(&ds.src[0], 0) == 50000 && nv_source_token(&ds.src[0], 1999) == 51999 && nv_source_token(&ds.src[1], 0) == 90000 &&
                nv_source_token(&ds.src[1], 1499) == 91499,
            "llm.c: token values");
    nv_dataset_close(&ds);
}

/* A weighted mixture (nv_dataset_set_weights): windows come from each source in proportion to its
 * weight whatever its size, uniformly within it, every one inside its training split; weight 0 draws
 * none (and lets a source too short for a window stand); a weighted one too short is an error naming
 * it; the unigram baseline is the mixture's; bad weights are refused. */
static void test_weighted_sources(void) {
    const char *paths[3] = {write_ramp_u16("wbig.bin", 6000, 0), write_ramp_u16("wsmall.bin", 600, 10000),
                            write_ramp_u16("wtiny.bin", 20, 20000)};
    nv_dataset ds;
    if (!open_ok(&ds, paths, 3, NULL, 30000, 0.1f)) return;
    const float w[3] = {1, 3, 0};
    T_CHECK(nv_dataset_set_weights(&ds, w, 3) == NV_OK, "%s", nv_errmsg());
    enum { B = 8, T = 32 };
    int in[B * T], tg[B * T], from[3] = {0, 0, 0}, lo = 1 << 30, hi = 0;
    nv_data_cursor c;
    nv_data_cursor_init(&c, 5);
    for (int it = 0; it < 500; it++) {
        T_CHECK(nv_data_next_batch(&ds, &c, B, T, in, tg, NULL) == NV_OK, "%s", nv_errmsg());
        for (int b = 0; b < B; b++) {
            const int s = in[b * T], src = s >= 20000 ? 2 : s >= 10000 ? 1 : 0;
            from[src]++;
            const int end = src == 0 ? 5400 : 10000 + 540; /* the first held-out token */
            T_CHECK(s + T < end, "window at %d leaves the training split", s);
            for (int t = 0; t < T; t++) T_CHECK(in[b * T + t] == s + t && tg[b * T + t] == s + t + 1, "a window mixes sources");
            if (src == 1) lo = s < lo ? s : lo, hi = s > hi ? s : hi;
        }
    }
    /* 4000 windows, a quarter and three quarters (sizes alone would give the small one a tenth);
       binomial sd ~27 */
    T_CHECK(from[2] == 0 && abs(from[1] - 3000) < 150, "windows by source: %d %d %d", from[0], from[1], from[2]);
    T_CHECK(lo < 10030 && hi > 10480, "the small source's windows start only in [%d, %d]", lo, hi);
    /* the baseline: a quarter of uniform over 5400 tokens and three quarters of uniform over 540 */
    const double want = -(0.25 * log(0.25 / 5400) + 0.75 * log(0.75 / 540));
    T_CHECK(fabs(nv_dataset_unigram_loss(&ds, 30000) - want) < 1e-9, "unigram %.12f want %.12f", nv_dataset_unigram_loss(&ds, 30000), want);
    const float tiny[3] = {1, 1, 1};
    T_CHECK(nv_dataset_set_weights(&ds, tiny, 3) == NV_OK, "%s", nv_errmsg());
    T_CHECK(nv_data_next_batch(&ds, &c, B, T, in, tg, NULL) == NV_EINVAL && strstr(nv_errmsg(), "wtiny.bin"), "%s", nv_errmsg());
    const float bad[][3] = {{0, 0, 0}, {1, -1, 0}, {1, NAN, 0}, {INFINITY, 1, 0}};
    for (int i = 0; i < 4; i++) T_CHECK(nv_dataset_set_weights(&ds, bad[i], 3) == NV_EINVAL, "weights %d accepted", i);
    T_CHECK(nv_dataset_set_weights(&ds, w, 4) == NV_EINVAL && nv_dataset_set_weights(&ds, w, 0) == NV_EINVAL, "a count");
    nv_dataset_close(&ds);
}

static void test_cursor_deterministic_and_resumable(void) {
    const char *p = write_ramp_u16("det.bin", 20000, 0);
    nv_dataset ds;
    if (!open_ok(&ds, &p, 1, NULL, 20000, 0.05f)) return;
    enum { B = 3, T = 8, N = 50 };
    int a_in[N][B * T], a_tg[N][B * T], in[B * T], tg[B * T];
    nv_data_cursor c1, c2, saved;
    nv_data_cursor_init(&c1, 42);
    nv_data_cursor_init(&c2, 42);
    for (int i = 0; i < N; i++) nv_data_next_batch(&ds, &c1, B, T, a_in[i], a_tg[i], NULL);
    int same = 1;
    for (int i = 0; i < N; i++) {
        nv_data_next_batch(&ds, &c2, B, T, in, tg, NULL);
        same &= memcmp(in, a_in[i], sizeof in) == 0 && memcmp(tg, a_tg[i], sizeof tg) == 0;
        if (i == N / 2 - 1) saved = c2; /* what a checkpoint stores */
    }
    T_CHECK(same, "same seed, different batches");
    T_CHECK(memcmp(&c1, &c2, sizeof c1) == 0, "cursors differ after the same draws");
    /* resume from the saved cursor: the second half again */
    same = 1;
    for (int i = N / 2; i < N; i++) {
        nv_data_next_batch(&ds, &saved, B, T, in, tg, NULL);
        same &= memcmp(in, a_in[i], sizeof in) == 0;
    }
    T_CHECK(same && saved.windows == (uint64_t)N * B, "resumed cursor gives another stream");
    /* another seed, another stream */
    nv_data_cursor c3;
    nv_data_cursor_init(&c3, 43);
    nv_data_next_batch(&ds, &c3, B, T, in, tg, NULL);
    T_CHECK(memcmp(in, a_in[0], sizeof in) != 0, "seeds 42 and 43 gave the same first batch");
    /* seed 0 is usable */
    nv_data_cursor_init(&c3, 0);
    nv_data_next_batch(&ds, &c3, B, T, in, tg, NULL);
    nv_data_next_batch(&ds, &c3, B, T, a_in[0], tg, NULL);
    T_CHECK(memcmp(in, a_in[0], sizeof in) != 0, "seed 0 repeats itself");
    nv_dataset_close(&ds);
}

static void test_val_batches(void) {
    const char *p = write_ramp_u16("val.bin", 10000, 0);
    nv_dataset ds;
    if (!open_ok(&ds, &p, 1, NULL, 10000, 0.1f)) return;
    enum { B = 4, T = 32 };
    int in[B * T], tg[B * T], in2[B * T], tg2[B * T];
    /* the 1000-token tail holds (1000 - 1) / 32 = 31 windows; 40 batches go round it */
    int seen[31] = {0};
    for (int i = 0; i < 40; i++) {
        T_CHECK(nv_data_val_batch(&ds, i, B, T, in, tg) == 1, "no validation batch %d", i);
        T_CHECK(nv_data_val_batch(&ds, i, B, T, in2, tg2) == 1 && memcmp(in, in2, sizeof in) == 0 &&
                    memcmp(tg, tg2, sizeof tg) == 0, "batch %d is not deterministic", i);
        for (int b = 0; b < B; b++) {
            int s = in[b * T];
            T_CHECK(s >= 9000 && s + T <= 9999, "validation window at %d leaves the held-out tail", s);
            T_CHECK((s - 9000) % T == 0, "windows do not tile the tail: %d", s);
            if (s >= 9000 && (s - 9000) / T < 31) seen[(s - 9000) / T]++;
            for (int t = 0; t < T; t++) T_CHECK(in[b * T + t] == s + t && tg[b * T + t] == s + t + 1, "shift");
        }
    }
    for (int w = 0; w < 31; w++) T_CHECK(seen[w] > 0, "validation window %d never used", w);
    /* batches differ from one index to the next */
    nv_data_val_batch(&ds, 0, B, T, in, tg);
    nv_data_val_batch(&ds, 1, B, T, in2, tg2);
    T_CHECK(memcmp(in, in2, sizeof in) != 0, "batches 0 and 1 are equal");
    /* a tail too short for one window */
    T_CHECK(nv_data_val_batch(&ds, 0, 1, 1000, in, tg) == 0, "a 1001-token window fit in 1000 tokens");
    nv_dataset_close(&ds);
    if (!open_ok(&ds, &p, 1, NULL, 10000, 0.0f)) return;
    T_CHECK(ds.val_tokens == 0 && nv_data_val_batch(&ds, 0, B, T, in, tg) == 0, "no split, yet a validation batch");
    nv_dataset_close(&ds);
}

static void test_unigram_loss(void) {
    /* training split: 0 x4, 1 x2, 2 x1, 3 x1 (8 tokens); held-out tail: 9 x2, never counted */
    uint16_t v[10] = {0, 1, 0, 2, 0, 1, 3, 0, 9, 9};
    const char *p = t_write("uni.bin", v, sizeof v);
    nv_dataset ds;
    if (!open_ok(&ds, &p, 1, NULL, 10, 0.2f)) return;
    double want = -(0.5 * log(0.5) + 0.25 * log(0.25) + 2 * 0.125 * log(0.125)); /* 1.75 bits = 1.2130 nats */
    double got = nv_dataset_unigram_loss(&ds, 10);
    T_CHECK(fabs(got - want) < 1e-12, "unigram loss %.15f, want %.15f", got, want);
    nv_dataset_close(&ds);
    /* uniform over 4 tokens: ln 4 */
    uint16_t u[8] = {3, 2, 1, 0, 0, 1, 2, 3};
    p = t_write("uni4.bin", u, sizeof u);
    if (!open_ok(&ds, &p, 1, NULL, 4, 0.0f)) return;
    got = nv_dataset_unigram_loss(&ds, 4);
    T_CHECK(fabs(got - log(4.0)) < 1e-12, "uniform: %.15f", got);
    nv_dataset_close(&ds);
}

/* ---- malformed inputs -------------------------------------------------------------------- */

static void expect_open_fails(const char *path, const nv_tokenizer *tok, int vocab, nv_err want, const char *needle) {
    nv_dataset ds;
    nv_err e = nv_dataset_open(&ds, &path, 1, tok, vocab, 0.1f);
    T_CHECK(e == want, "%s: got %s (%s), want %s", path, nv_err_name(e), nv_errmsg(), nv_err_name(want));
    T_CHECK(strstr(nv_errmsg(), needle) != NULL, "%s: message '%s' lacks '%s'", path, nv_errmsg(), needle);
    T_CHECK(strchr(nv_errmsg(), '\n') == NULL, "message is not one line");
    T_CHECK(ds.src == NULL && ds.n_src == 0, "a failed open left sources behind");
    if (e == NV_OK) nv_dataset_close(&ds);
}

static void test_malformed_inputs(void) {
    uint16_t bad[6] = {1, 2, 3, 600, 4, 5};
    expect_open_fails(t_write("oov.bin", bad, sizeof bad), NULL, 512, NV_EFORMAT, "600");
    uint32_t bad32[3] = {1, 70000, 100000};
    expect_open_fails(t_write("oov.u32", bad32, sizeof bad32), NULL, 100000, NV_EFORMAT, "100000");
    expect_open_fails(t_write("odd.bin", "abc", 3), NULL, 512, NV_EFORMAT, "odd.bin");
    expect_open_fails(t_write("odd.u32", "abcdef", 6), NULL, 512, NV_EFORMAT, "4-byte");
    expect_open_fails(write_llmc("cut.bin", 20240520, 0, 1000, 10, 1), NULL, 60000, NV_EFORMAT, "llm.c shard of 1000");
    expect_open_fails(write_llmc("v1.bin", 20240801, 1, 1000, 10, 0), NULL, 60000, NV_EFORMAT, "version 1, not 7");
    expect_open_fails(t_path("missing.bin"), NULL, 512, NV_EIO, "missing.bin");
    expect_open_fails(t_path("missing.txt"), NULL, 512, NV_EINVAL, "tokenizer");
    expect_open_fails(t_tmpdir(), NULL, 512, NV_EINVAL, "tokenizer");
    /* a token that fits the tokenizer but not the model's vocabulary */
    const char *z = t_data("models/tok512.bin");
    if (z) {
        nv_tokenizer *tok = NULL;
        T_CHECK(nv_tokenizer_load(z, 0, &tok) == NV_OK, "%s", nv_errmsg());
        const char *txt = t_write("story.txt", "Once upon a time there was a cat.\n", 35);
        expect_open_fails(txt, tok, 300, NV_EFORMAT, "outside the vocabulary");
        expect_open_fails(t_path("missing.txt"), tok, 512, NV_EIO, "missing.txt");
        nv_tokenizer_free(tok);
    }
    /* the second of two paths is bad: nothing is kept */
    const char *two[2] = {write_ramp_u16("good.bin", 100, 0), t_path("missing.bin")};
    nv_dataset ds;
    T_CHECK(nv_dataset_open(&ds, two, 2, NULL, 512, 0.1f) == NV_EIO && ds.src == NULL, "second path missing");
    T_CHECK(nv_dataset_open(&ds, two, 0, NULL, 512, 0.1f) == NV_EINVAL, "no paths accepted");
    T_CHECK(nv_dataset_open(&ds, two, 1, NULL, 512, 1.0f) == NV_EINVAL, "val_frac 1 accepted");
    T_CHECK(nv_dataset_open(&ds, two, 1, NULL, 512, -0.1f) == NV_EINVAL, "val_frac -0.1 accepted");
    T_CHECK(nv_dataset_open(&ds, two, 1, NULL, 512, NAN) == NV_EINVAL, "val_frac NaN accepted");
    /* too short for a window: 100 tokens, 90 for training */
    if (open_ok(&ds, two, 1, NULL, 512, 0.1f)) {
        int in[128], tg[128];
        nv_data_cursor c;
        nv_data_cursor_init(&c, 1);
        T_CHECK(nv_data_next_batch(&ds, &c, 1, 89, in, tg, NULL) == NV_OK, "89+1 tokens fit in 90: %s", nv_errmsg());
        T_CHECK(in[0] == 0 && tg[88] == 89, "the only window");
        nv_err e = nv_data_next_batch(&ds, &c, 1, 90, in, tg, NULL);
        T_CHECK(e == NV_EINVAL && strstr(nv_errmsg(), "too short"), "90+1 tokens in 90: %s", nv_errmsg());
        nv_dataset_close(&ds);
    }
    /* an empty shard opens with no tokens and cannot give a window */
    const char *empty = t_write("empty.bin", "", 0);
    if (open_ok(&ds, &empty, 1, NULL, 512, 0.1f)) {
        int in[8], tg[8];
        nv_data_cursor c;
        nv_data_cursor_init(&c, 1);
        T_CHECK(ds.train_tokens == 0 && nv_data_next_batch(&ds, &c, 1, 4, in, tg, NULL) == NV_EINVAL, "empty shard");
        nv_dataset_close(&ds);
    }
}

/* ---- text files -------------------------------------------------------------------------- */

/* What the loader should produce: each document stripped of surrounding blanks and encoded
 * with BOS. */
typedef struct {
    int *ids;
    int n, cap, docs;
} expect_ids;

static void expect_doc(expect_ids *x, const nv_tokenizer *t, const char *doc);

/* The documents of text (modified) between separators sep, each without the white space around it,
 * encoded one after another: the reader's rule written out here. */
static void expect_split(expect_ids *x, const nv_tokenizer *t, char *text, const char *sep) {
    for (char *d = text;;) {
        char *end = strstr(d, sep);
        if (end) *end = '\0';
        while (*d == '\n' || *d == ' ' || *d == '\r') d++;
        size_t n = strlen(d);
        while (n && (d[n - 1] == '\n' || d[n - 1] == ' ' || d[n - 1] == '\r')) d[--n] = '\0';
        if (n) expect_doc(x, t, d);
        if (!end) break;
        d = end + strlen(sep);
    }
}

static void expect_doc(expect_ids *x, const nv_tokenizer *t, const char *doc) {
    int *ids, n;
    T_CHECK(nv_tokenizer_encode(t, doc, 1, 0, &ids, &n) == NV_OK, "%s", nv_errmsg());
    if (x->n + n > x->cap) {
        x->cap = 2 * (x->n + n);
        x->ids = realloc(x->ids, (size_t)x->cap * sizeof *x->ids);
    }
    memcpy(x->ids + x->n, ids, (size_t)n * sizeof *ids);
    x->n += n;
    x->docs++;
    free(ids);
}

static void check_text(const nv_tokenizer *t, const char *name, const char *text, const char *const *docs, int ndocs) {
    const char *p = t_write(name, text, strlen(text));
    expect_ids x = {0};
    for (int i = 0; i < ndocs; i++) expect_doc(&x, t, docs[i]);
    nv_dataset ds;
    if (!open_ok(&ds, &p, 1, t, 512, 0.0f)) {
        free(x.ids);
        return;
    }
    const nv_source *s = &ds.src[0];
    int bos = 0, same = (int)s->n_tokens == x.n;
    for (uint64_t i = 0; i < s->n_tokens; i++) {
        bos += nv_source_token(s, i) == NV_TOKEN_BOS;
        if (same && (int)nv_source_token(s, i) != x.ids[i]) same = 0;
    }
    T_CHECK(s->n_tokens > 0 && nv_source_token(s, 0) == NV_TOKEN_BOS, "%s: does not start with BOS", name);
    T_CHECK(bos == ndocs, "%s: %d documents, want %d", name, bos, ndocs);
    T_CHECK(same, "%s: %llu tokens differ from the %d expected", name, (unsigned long long)s->n_tokens, x.n);
    nv_dataset_close(&ds);
    free(x.ids);
}

/* The shared tok512 vocabulary, or NULL after marking the case skipped or failed. */
static nv_tokenizer *load_tok512(void) {
    const char *z = t_data("models/tok512.bin");
    nv_tokenizer *t = NULL;
    if (z && nv_tokenizer_load(z, 0, &t) != NV_OK) T_CHECK(0, "%s", nv_errmsg());
    return t;
}

/* A folder of text (--data DIR): its text files in the order of their paths, each read as that
 * file alone is (the tokens of the files given one by one, exactly), subfolders included; hidden
 * files and folders, symbolic links, binary files and the other data formats left out; a folder
 * with no text file is an error. */
static void test_text_folder(void) {
    nv_tokenizer *t = load_tok512();
    if (!t) return;
    char dir[600], cmd[8192];
    snprintf(dir, sizeof dir, "%s/notes", t_tmpdir());
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s/sub' '%s/.git' '%s/empty' && printf 'Once upon a time there was a cat.\\n\\nThe cat sat.\\n' > '%s/b.txt' "
             "&& printf 'Lily went to the park.\\n' > '%s/sub/a.md' && printf 'secret\\n' > '%s/.hidden.txt' && "
             "printf 'x\\000y' > '%s/bin.dat' && printf '{\"text\": \"a\"}\\n' > '%s/c.jsonl' && printf 'git\\n' > '%s/.git/HEAD' && "
             "ln -sf '%s/b.txt' '%s/link.txt'",
             dir, dir, dir, dir, dir, dir, dir, dir, dir, dir, dir);
    T_CHECK(system(cmd) == 0, "making %s", dir);
    char b[800], a[800];
    snprintf(b, sizeof b, "%s/b.txt", dir);
    snprintf(a, sizeof a, "%s/sub/a.md", dir);
    const char *one[1] = {dir}, *two[2] = {b, a}; /* "b.txt" sorts before "sub/a.md" */
    nv_dataset d1, d2;
    if (open_ok(&d1, one, 1, t, 512, 0.0f)) {
        if (open_ok(&d2, two, 2, t, 512, 0.0f)) {
            const uint64_t n = d2.src[0].n_tokens + d2.src[1].n_tokens;
            int same = d1.src[0].n_tokens == n && n > 10;
            for (uint64_t i = 0; same && i < n; i++) {
                const nv_source *s = i < d2.src[0].n_tokens ? &d2.src[0] : &d2.src[1];
                same = nv_source_token(&d1.src[0], i) == nv_source_token(s, i < d2.src[0].n_tokens ? i : i - d2.src[0].n_tokens);
            }
            T_CHECK(same, "the folder's %llu tokens are not its two text files' %llu", (unsigned long long)d1.src[0].n_tokens,
                    (unsigned long long)n);
            nv_dataset_close(&d2);
        }
        nv_dataset_close(&d1);
    }
    char empty[800];
    snprintf(empty, sizeof empty, "%s/empty", dir);
    const char *none[1] = {empty};
    T_CHECK(nv_dataset_open(&d1, none, 1, t, 512, 0.0f) == NV_EINVAL && strstr(nv_errmsg(), "holds no text file"), "%s", nv_errmsg());
    T_CHECK(nv_dataset_open(&d1, one, 1, NULL, 512, 0.0f) == NV_EINVAL && strstr(nv_errmsg(), "tokenizer"), "%s", nv_errmsg());
    nv_tokenizer_free(t);
}

/* path written as gzip (mode "wb", or "ab": another member after those there), n bytes of data. */
static const char *write_gz(const char *name, const char *mode, const void *data, size_t n) {
    const char *path = t_path(name);
    gzFile f = gzopen(path, mode);
    T_CHECK(f && gzwrite(f, data, (unsigned)n) == (int)n && gzclose(f) == Z_OK, "writing %s", path);
    return path;
}

/* Whether two sources hold the same tokens. */
static int same_tokens(const nv_source *a, const nv_source *b) {
    int same = a->n_tokens == b->n_tokens && a->n_tokens > 0;
    for (uint64_t i = 0; same && i < a->n_tokens; i++) same = nv_source_token(a, i) == nv_source_token(b, i);
    return same;
}

/* Data kept compressed: a ".gz" text, text JSON Lines, token shard, or a folder's text file reads as
 * the file it decompresses to; several members one after another (gzip -d's whole output); a
 * truncated one is refused. */
static void test_gzip_data(void) {
    nv_tokenizer *t = load_tok512();
    if (!t) return;
    static const char text[] = "Once upon a time there was a cat.\n\nThe cat sat on the mat. It was happy.\n";
    static const char jsonl[] = "{\"text\": \"Once upon a time there was a cat.\"}\n{\"text\": \"The cat sat.\"}\n";
    uint16_t shard[600];
    for (int i = 0; i < 600; i++) shard[i] = (uint16_t)(i % 500 + 3);
    const char *plain[3] = {t_write("story.txt", text, strlen(text)), t_write("lines.jsonl", jsonl, strlen(jsonl)),
                            t_write("ramp.bin", shard, sizeof shard)};
    const char *gz[3] = {write_gz("story.txt.gz", "wb", text, 20), write_gz("lines.jsonl.gz", "wb", jsonl, strlen(jsonl)),
                         write_gz("ramp.bin.gz", "wb", shard, sizeof shard)};
    write_gz("story.txt.gz", "ab", text + 20, strlen(text) - 20); /* (a second member: the rest) */
    nv_dataset a, b;
    if (open_ok(&a, plain, 3, t, 512, 0.0f)) {
        if (open_ok(&b, gz, 3, t, 512, 0.0f)) {
            for (int k = 0; k < 3; k++) T_CHECK(same_tokens(&a.src[k], &b.src[k]), "%s differs from %s", gz[k], plain[k]);
            T_CHECK(b.src[2].width == 2, "the shard's width: %d", b.src[2].width);
            nv_dataset_close(&b);
        }
        nv_dataset_close(&a);
    }
    /* a folder: the .gz text file read as its text (not left out as binary) */
    char dir[600], cmd[2000];
    snprintf(dir, sizeof dir, "%s/zipped", t_tmpdir());
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s' '%s/'", dir, gz[0], dir);
    T_CHECK(system(cmd) == 0, "making %s", dir);
    const char *folder[1] = {dir};
    if (open_ok(&b, folder, 1, t, 512, 0.0f)) {
        if (open_ok(&a, plain, 1, t, 512, 0.0f)) {
            T_CHECK(same_tokens(&a.src[0], &b.src[0]), "the folder's .gz text differs from the text");
            nv_dataset_close(&a);
        }
        nv_dataset_close(&b);
    }
    /* a truncated one */
    char *whole = NULL;
    size_t n = 0;
    T_CHECK(nv_file_read_all(gz[2], &whole, &n) == NV_OK && n > 30, "%s", nv_errmsg());
    if (whole) expect_open_fails(t_write("cut.bin.gz", whole, n - 12), NULL, 512, NV_EFORMAT, "not a whole gzip file");
    free(whole);
    nv_tokenizer_free(t);
}

static void test_text_documents(void) {
    nv_tokenizer *t = load_tok512();
    if (!t) return;
    /* blank lines separate documents; single line breaks stay inside one */
    const char *blank = "One day a cat sat on a mat.\nIt was happy.\n\nThe dog ran to the park.\n\n\n\n  A bird sang.  \n";
    const char *blank_docs[] = {"One day a cat sat on a mat.\nIt was happy.", "The dog ran to the park.", "A bird sang."};
    check_text(t, "blank.txt", blank, blank_docs, 3);
    /* no blank line: one document per line */
    const char *lines = "First story here.\nSecond one.\r\nThird, with no line break at the end";
    const char *line_docs[] = {"First story here.", "Second one.", "Third, with no line break at the end"};
    check_text(t, "lines.txt", lines, line_docs, 3);
    /* <|endoftext|> separates documents, with or without line breaks around it */
    const char *eot = "Tim had a red ball.\nHe liked it.<|endoftext|>\nSue had a kite.\n<|endoftext|><|endoftext|>Max ran."
                      "<|endoftext|>";
    const char *eot_docs[] = {"Tim had a red ball.\nHe liked it.", "Sue had a kite.", "Max ran."};
    check_text(t, "eot.txt", eot, eot_docs, 3);
    /* .jsonl of {"text": ...} lines (a dataset's export): each line's text one document, kept whole
       (its line breaks and markers inside it), blank lines skipped, other fields ignored */
    const char *jl = "{\"text\": \"One day a cat sat.\\nIt was happy.\", \"id\": 1}\n\n  {\"text\": \"  The dog ran.  \"}\r\n"
                     "{\"text\": \"caf\\u00e9 \\\"quoted\\\" a<|endoftext|>b\"}";
    const char *jl_docs[] = {"One day a cat sat.\nIt was happy.", "The dog ran.", "caf\xc3\xa9 \"quoted\" a<|endoftext|>b"};
    check_text(t, "docs.jsonl", jl, jl_docs, 3);
    static const struct {
        const char *text, *says;
    } bad_jl[] = {{"{\"text\": \"fine\"}\n{\"text\": 3}\n", "docs_bad.jsonl:2: not a JSON object with a \"text\" string"},
                  {"{\"text\": \"fine\"}\nnot json\n", "docs_bad.jsonl:2:"},
                  {"{\"text\": \"fine\"}\n{\"text\": \"x\"} and more\n", "docs_bad.jsonl:2:"}};
    for (size_t i = 0; i < sizeof bad_jl / sizeof bad_jl[0]; i++) {
        const char *bp = t_write("docs_bad.jsonl", bad_jl[i].text, strlen(bad_jl[i].text));
        nv_dataset ds;
        nv_err e = nv_dataset_open(&ds, &bp, 1, t, 512, 0.0f);
        T_CHECK(e == NV_EFORMAT && strstr(nv_errmsg(), bad_jl[i].says) && ds.src == NULL, "bad text lines %zu: %s", i, nv_errmsg());
    }
    T_CHECK(nv_data_jsonl_is_text(t_write("docs_probe.jsonl", "\n{\"text\": \"x\"}", 14)) &&
                !nv_data_jsonl_is_text(t_write("chat_probe.jsonl", "{\"messages\": [], \"text\": \"x\"}", 29)),
            "which .jsonl is text");

    /* the shared sample: five stories between <|endoftext|> markers, line breaks inside */
    const char *sp = t_data("corpus/tinystories_sample.txt");
    char *sample = NULL;
    if (sp && nv_file_read_all(sp, &sample, NULL) == NV_OK) {
        expect_ids x = {0};
        expect_split(&x, t, sample, "<|endoftext|>");
        T_CHECK(x.docs == 5, "the sample has %d stories", x.docs);
        nv_dataset ds;
        if (open_ok(&ds, &sp, 1, t, 512, 0.1f)) {
            const nv_source *s = &ds.src[0];
            int bos = 0, same = (int)s->n_tokens == x.n;
            for (uint64_t i = 0; i < s->n_tokens; i++) {
                bos += nv_source_token(s, i) == NV_TOKEN_BOS;
                if (same && (int)nv_source_token(s, i) != x.ids[i]) same = 0;
            }
            T_CHECK(bos == 5 && same, "sample: %d BOS, tokens %s", bos, same ? "equal" : "differ");
            T_CHECK(s->n_train == s->n_tokens - (uint64_t)((double)s->n_tokens * 0.1f), "split of text");
            /* windows over text come from the training split too */
            enum { B = 2, T = 64 };
            int in[B * T], tg[B * T];
            nv_data_cursor c;
            nv_data_cursor_init(&c, 5);
            for (int it = 0; it < 50; it++) {
                T_CHECK(nv_data_next_batch(&ds, &c, B, T, in, tg, NULL) == NV_OK, "%s", nv_errmsg());
                for (int i = 0; i + 1 < B * T; i++)
                    if ((i + 1) % T) T_CHECK(tg[i] == in[i + 1], "text window not shifted");
            }
            nv_dataset_close(&ds);
        }
        free(x.ids);
        free(sample);
    }
    /* an empty text file opens with no tokens */
    const char *empty = t_write("empty.txt", "", 0);
    nv_dataset ds;
    if (open_ok(&ds, &empty, 1, t, 512, 0.1f)) {
        T_CHECK(ds.train_tokens == 0 && ds.val_tokens == 0, "empty text has tokens");
        nv_dataset_close(&ds);
    }
    nv_tokenizer_free(t);
}

/* ---- chat data (.jsonl) ----------------------------------------------------------------------- */

/* Turn `turn` of source s holds the ids nv_chat_render_turn gives msgs (the last an answer), and its
 * targets are exactly the answer's: the prompt the server would feed (nv_chat_render_opts of the
 * messages before) is not trained on. */
static void check_turn_opts(const nv_source *s, uint64_t turn, const nv_tokenizer *tok, nv_chat_template tmpl,
                            const nv_chat_msg *msgs, int n, const nv_chat_opts *o) {
    int *ids = NULL, nids = 0, np = 0, *prompt = NULL, nprompt = 0;
    if (nv_chat_render_turn(tmpl, tok, msgs, n, o, &ids, &nids, &np) != NV_OK ||
        nv_chat_render_opts(tmpl, tok, msgs, n - 1, o, &prompt, &nprompt) != NV_OK) {
        T_CHECK(0, "render: %s", nv_errmsg());
        return;
    }
    T_CHECK(turn < s->n_starts, "turn %llu of %llu", (unsigned long long)turn, (unsigned long long)s->n_starts);
    if (turn >= s->n_starts) return;
    const uint64_t from = s->starts[turn], len = s->starts[turn + 1] - from;
    T_CHECK(len == (uint64_t)nids && np == nprompt && nids > nprompt, "%s turn %llu: %llu tokens, rendered %d with a prompt of %d (%d)",
            nv_chat_template_name(tmpl), (unsigned long long)turn, (unsigned long long)len, nids, np, nprompt);
    for (int i = 0; i < nids && (uint64_t)i < len; i++) {
        T_CHECK(nv_source_token(s, from + (uint64_t)i) == (uint32_t)ids[i], "%s turn %llu token %d differs",
                nv_chat_template_name(tmpl), (unsigned long long)turn, i);
        if (i < nprompt) T_CHECK(prompt[i] == ids[i], "the turn does not begin with the server's prompt");
        T_CHECK(s->trained[from + (uint64_t)i] == (i >= nprompt), "%s turn %llu token %d trained %d (prompt %d)",
                nv_chat_template_name(tmpl), (unsigned long long)turn, i, s->trained[from + (uint64_t)i], nprompt);
    }
    free(ids);
    free(prompt);
}

static void check_turn(const nv_source *s, uint64_t turn, const nv_tokenizer *tok, nv_chat_template tmpl,
                       const nv_chat_msg *msgs, int n) {
    const nv_chat_opts o = {0};
    check_turn_opts(s, turn, tok, tmpl, msgs, n, &o);
}

/* Prompt/completion lines (TRL's format): two strings are one text, BOS + prompt + completion + EOS,
 * whose completion tokens (and EOS) alone are trained; two lists of messages are a conversation
 * rendered with the template, the prompt's assistant messages not trained; kinds do not mix. */
static void test_prompt_completion_data(void) {
    nv_tokenizer *t = load_tok512();
    if (!t) return;
    const char *text = "{\"prompt\": \"Q: Where did the cat go?\\nA:\", \"completion\": \" To the park.\"}\n"
                       "{\"prompt\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello\"}, "
                       "{\"role\": \"user\", \"content\": \"Bye\"}], \"completion\": [{\"role\": \"assistant\", \"content\": \"See you\"}]}\n";
    const char *p = t_write("pc.jsonl", text, strlen(text));
    nv_dataset ds;
    if (!open_ok(&ds, &p, 1, t, 512, 0.0f)) return;
    const nv_source *s = &ds.src[0];
    T_CHECK(ds.chat && ds.templated && s->completions && s->n_starts == 2, "%d turns, chat %d templated %d", (int)s->n_starts, ds.chat,
            ds.templated);
    /* the text line: its ids are the whole text's, the prompt's own encoding untrained */
    int *whole = NULL, nw = 0, *prompt = NULL, np = 0;
    nv_tokenizer_encode(t, "Q: Where did the cat go?\nA: To the park.", 1, 1, &whole, &nw);
    nv_tokenizer_encode(t, "Q: Where did the cat go?\nA:", 1, 0, &prompt, &np);
    int same = s->n_starts == 2 && s->starts[1] - s->starts[0] == (uint64_t)nw, trained_ok = same;
    for (int i = 0; same && i < nw; i++) {
        same &= nv_source_token(s, (uint64_t)i) == (uint32_t)whole[i];
        trained_ok &= s->trained[i] == (i >= np);
    }
    T_CHECK(same && trained_ok && np < nw, "the text line: %d ids, prompt %d", nw, np);
    free(whole), free(prompt);
    /* the conversation: only "See you" (and what ends it) is trained, not the prompt's "Hello" */
    nv_buf answer = {0};
    for (uint64_t i = s->starts[1]; i < s->starts[2]; i++)
        if (s->trained[i]) nv_buf_puts(&answer, nv_tokenizer_decode(t, (int)nv_source_token(s, i - 1), (int)nv_source_token(s, i)));
    T_CHECK(answer.data && !strcmp(answer.data, "See you<|im_end|>"), "trained: '%s'", answer.data ? answer.data : "");
    nv_buf_free(&answer);
    nv_dataset_close(&ds);
    /* only prompt/completion text: no template to declare */
    const char *plain = "{\"prompt\": \"a\", \"completion\": \"b\"}\n";
    p = t_write("pc_plain.jsonl", plain, strlen(plain));
    if (open_ok(&ds, &p, 1, t, 512, 0.0f)) {
        T_CHECK(ds.chat && !ds.templated, "text prompt/completion declared a template");
        nv_dataset_close(&ds);
    }
    static const struct {
        const char *text, *says;
    } bad[] = {{"{\"prompt\": \"a\", \"completion\": 3}\n", "pc_bad.jsonl:1: 'prompt' and 'completion' must both be strings"},
               {"{\"prompt\": \"a\", \"completion\": \"\"}\n", "pc_bad.jsonl:1: the completion is empty"},
               {"{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n",
                "pc_bad.jsonl:2: a chat line in a file of prompt/completion lines"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *bp = t_write("pc_bad.jsonl", bad[i].text, strlen(bad[i].text));
        nv_err e = nv_dataset_open(&ds, &bp, 1, t, 512, 0.0f);
        T_CHECK(e != NV_OK && strstr(nv_errmsg(), bad[i].says) && ds.src == NULL, "bad %zu: %s", i, nv_errmsg());
    }
    nv_tokenizer_free(t);
}

static void test_chat_data(void) {
    nv_tokenizer *t = load_tok512();
    if (!t) return;
    /* five conversations: two answers, one with weight 0; content as text parts; a tool call and its result */
    const char *jsonl =
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be kind.\"}, {\"role\": \"user\", \"content\": \"Hi\"},"
        " {\"role\": \"assistant\", \"content\": \"Hello there.\"}, {\"role\": \"user\", \"content\": \"Why?\"},"
        " {\"role\": \"assistant\", \"content\": \"Because.\"}]}\n"
        "\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"A \"}, {\"type\": \"text\", \"text\": \"cat\"}]},"
        " {\"role\": \"assistant\", \"content\": \"Meow.\", \"weight\": 0}, {\"role\": \"user\", \"content\": \"Again\"},"
        " {\"role\": \"assistant\", \"content\": \"Purr.\", \"weight\": 1}]}\r\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}, {\"role\": \"assistant\", \"content\": null,"
        " \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": \"{}\"}}]},"
        " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"sunny\"}, {\"role\": \"assistant\", \"content\": \"Sunny.\"}]}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Four\"}, {\"role\": \"assistant\", \"content\": \"4\"}]}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Five\"}, {\"role\": \"assistant\", \"content\": \"5\"}]}\n"
        "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\"}}}],"
        " \"messages\": [{\"role\": \"user\", \"content\": \"Rain?\"}, {\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"c2\","
        " \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": \"{}\"}}]}]}";
    const char *p = t_write("chat.jsonl", jsonl, strlen(jsonl));
    const nv_chat_call call = {"get_weather", "{}", "c1"}, call2 = {"get_weather", "{}", "c2"};
    const nv_chat_msg c1[] = {{"system", "Be kind.", NULL, 0, NULL, NULL, NULL, 0}, {"user", "Hi", NULL, 0, NULL, NULL, NULL, 0}, {"assistant", "Hello there.", NULL, 0, NULL, NULL, NULL, 0},
                              {"user", "Why?", NULL, 0, NULL, NULL, NULL, 0}, {"assistant", "Because.", NULL, 0, NULL, NULL, NULL, 0}};
    const nv_chat_msg c2[] = {{"user", "A cat", NULL, 0, NULL, NULL, NULL, 0}, {"assistant", "Meow.", NULL, 0, NULL, NULL, NULL, 0}, {"user", "Again", NULL, 0, NULL, NULL, NULL, 0},
                              {"assistant", "Purr.", NULL, 0, NULL, NULL, NULL, 0}};
    const nv_chat_msg c3[] = {{"user", "Weather?", NULL, 0, NULL, NULL, NULL, 0}, {"assistant", "", &call, 1, NULL, NULL, NULL, 0}, {"tool", "sunny", NULL, 0, "c1", NULL, NULL, 0},
                              {"assistant", "Sunny.", NULL, 0, NULL, NULL, NULL, 0}};
    const nv_chat_msg c4[] = {{"user", "Four", NULL, 0, NULL, NULL, NULL, 0}, {"assistant", "4", NULL, 0, NULL, NULL, NULL, 0}};
    const nv_chat_msg c5[] = {{"user", "Five", NULL, 0, NULL, NULL, NULL, 0}, {"assistant", "5", NULL, 0, NULL, NULL, NULL, 0}};
    const nv_chat_msg c6[] = {{"user", "Rain?", NULL, 0, NULL, NULL, NULL, 0}, {"assistant", "", &call2, 1, NULL, NULL, NULL, 0}};
    const nv_chat_template all[] = {NV_CHAT_CHATML, NV_CHAT_LLAMA2, NV_CHAT_LLAMA3, NV_CHAT_PLAIN, NV_CHAT_DEEPSEEK, NV_CHAT_PHI3,
                                    NV_CHAT_GRANITE, NV_CHAT_MISTRAL, NV_CHAT_PHI4_MINI, NV_CHAT_PHI4, NV_CHAT_OLMO2, NV_CHAT_SMOLLM3};
    for (int k = 0; k < (int)(sizeof all / sizeof all[0]); k++) {
        nv_dataset ds;
        nv_err e = nv_dataset_open_chat(&ds, &p, 1, t, 512, 0.2f, all[k]);
        T_CHECK(e == NV_OK, "open: %s", nv_errmsg());
        if (e) continue;
        const nv_source *s = &ds.src[0];
        /* turns: c1's two answers, c2's weighted one (Meow is context), c3's two, c4's, c5's, c6's with its tools */
        T_CHECK(ds.chat && s->n_starts == 8, "%llu turns, not 8", (unsigned long long)s->n_starts);
        check_turn(s, 0, t, all[k], c1, 3);
        check_turn(s, 1, t, all[k], c1, 5);
        check_turn(s, 2, t, all[k], c2, 4);
        check_turn(s, 3, t, all[k], c3, 2);
        check_turn(s, 4, t, all[k], c3, 4);
        check_turn(s, 5, t, all[k], c4, 2);
        check_turn(s, 6, t, all[k], c5, 2);
        /* the answer as the server stops it: c1's "Because." and the template's end */
        static const char *const want[] = {"\nBecause.", "Because.<|im_end|>", " Because.", "Because.<|eot_id|>",
                                           "Because.<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "Because.<|end|>",
                                           "", "Because.<|end_of_text|>", " Because.", "Because.<|end|>", "Because.<|im_end|>", "Because.",
                                           "Because.<|im_end|>"};
        const int eos_ends = all[k] == NV_CHAT_PLAIN || all[k] == NV_CHAT_LLAMA2 || all[k] == NV_CHAT_MISTRAL || all[k] == NV_CHAT_OLMO2;
        char got[128] = "";
        uint64_t a0 = s->starts[1], a1 = s->starts[2];
        while (a0 < a1 && !s->trained[a0]) a0++;
        for (uint64_t j = a0; j < a1 - (uint64_t)eos_ends; j++) {
            const char *piece = nv_tokenizer_decode(t, (int)nv_source_token(s, j - 1), (int)nv_source_token(s, j));
            if (piece && strlen(got) + strlen(piece) < sizeof got) strcat(got, piece);
        }
        T_CHECK(!strcmp(got, want[all[k]]) && (!eos_ends || nv_source_token(s, a1 - 1) == (uint32_t)nv_tokenizer_eos(t)),
                "%s: the answer reads '%s'", nv_chat_template_name(all[k]), got);
        /* where the whole text is encoded at once, a turn is the next one's beginning: the answer the model
           learns is what the next prompt shows */
        if (all[k] == NV_CHAT_CHATML || all[k] == NV_CHAT_LLAMA3 || all[k] == NV_CHAT_DEEPSEEK || all[k] == NV_CHAT_PHI3 ||
            all[k] == NV_CHAT_GRANITE || all[k] == NV_CHAT_PHI4_MINI || all[k] == NV_CHAT_PHI4 || all[k] == NV_CHAT_SMOLLM3)
            for (uint64_t j = 0; j < s->starts[1] - s->starts[0]; j++)
                T_CHECK(nv_source_token(s, s->starts[0] + j) == nv_source_token(s, s->starts[1] + j),
                        "%s: turn 0 token %llu is not turn 1's", nv_chat_template_name(all[k]), (unsigned long long)j);
        /* the tool as the server shows it: Python's json.dumps style, indented for Llama 3 */
        const char *tool = all[k] == NV_CHAT_LLAMA3 || all[k] == NV_CHAT_GRANITE
                               ? "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n        "
                                 "\"parameters\": {\n            \"type\": \"object\"\n        }\n    }\n}"
                           : all[k] == NV_CHAT_PHI4_MINI /* its functions alone */
                               ? "{\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\"}}"
                               : "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\"}}}";
        /* (the tool as the server shows it: Phi-4-mini's, its function alone on one line) */
        const nv_chat_opts with_tools = {.tools = &tool, .n_tools = 1};
        check_turn_opts(s, 7, t, all[k], c6, 2, &with_tools);
        /* the last fifth of the conversations (one: c6) validates, whole */
        T_CHECK(s->n_train_starts == 7 && s->n_train == s->starts[7], "split at turn %llu",
                (unsigned long long)s->n_train_starts);
        /* training windows: whole turns of the training part, targets only on answers, padding after */
        enum { B = 2, T = 200 }; /* every turn whole: no window is two turns alike */
        int in[B * T], tg[B * T], answers = 0;
        nv_data_cursor c;
        nv_data_cursor_init(&c, 3);
        for (int it = 0; it < 40; it++) {
            T_CHECK(nv_data_next_batch(&ds, &c, B, T, in, tg, NULL) == NV_OK, "%s", nv_errmsg());
            for (int b = 0; b < B; b++) {
                uint64_t turn = s->n_starts; /* the training turn whose tokens (then padding 0) the inputs are */
                for (uint64_t u = 0; u < s->n_train_starts && turn == s->n_starts; u++) {
                    int same = 1;
                    for (int i = 0; i < T && same; i++) {
                        const uint64_t at = s->starts[u] + (uint64_t)i;
                        same = in[b * T + i] == (at + 1 < s->starts[u + 1] ? (int)nv_source_token(s, at) : 0);
                    }
                    if (same) turn = u;
                }
                T_CHECK(turn < s->n_train_starts, "a window that starts no training turn");
                if (turn >= s->n_train_starts) continue;
                const uint64_t from = s->starts[turn], len = s->starts[turn + 1] - from;
                for (int i = 0; i < T; i++) {
                    const int want_tg = (uint64_t)i + 1 < len && s->trained[from + (uint64_t)i + 1]
                                            ? (int)nv_source_token(s, from + (uint64_t)i + 1) : -1;
                    T_CHECK(tg[b * T + i] == want_tg, "turn %llu position %d: target %d, not %d", (unsigned long long)turn, i,
                            tg[b * T + i], want_tg);
                    answers += want_tg >= 0;
                }
            }
        }
        T_CHECK(answers > 0, "no answer tokens in the windows");
        /* packed: a window runs on into the training turns after its first, each from its BOS (whose
           target, the next turn's first token, is none) */
        ds.pack = 1;
        int packed = 0, seg[B * T];
        const uint64_t train_end = s->starts[s->n_train_starts];
        for (int it = 0; it < 40; it++) {
            T_CHECK(nv_data_next_batch(&ds, &c, B, T, in, tg, seg) == NV_OK, "%s", nv_errmsg());
            for (int b = 0; b < B; b++) {
                int found = 0;
                for (uint64_t u = 0; u < s->n_train_starts && !found; u++) {
                    int same = 1;
                    for (int i = 0; i < T && same; i++) {
                        const uint64_t p = s->starts[u] + (uint64_t)i;
                        const int want_in = p + 1 < train_end ? (int)nv_source_token(s, p) : 0;
                        const int want_tg = p + 1 < train_end && s->trained[p + 1] ? (int)nv_source_token(s, p + 1) : -1;
                        same = in[b * T + i] == want_in && tg[b * T + i] == want_tg;
                    }
                    found = same;
                    if (same) packed += s->starts[u + 1] - s->starts[u] < (uint64_t)T && u + 1 < s->n_train_starts;
                    /* each row's document: the latest training turn begun at or before it */
                    for (int i = 0; i < T && same; i++) {
                        uint64_t w = u;
                        while (w + 1 < s->n_train_starts && s->starts[w + 1] <= s->starts[u] + (uint64_t)i) w++;
                        T_CHECK(seg[b * T + i] == (int)(s->starts[w] - s->starts[u]), "window of turn %llu, row %d: document "
                                "start %d, not %d", (unsigned long long)u, i, seg[b * T + i], (int)(s->starts[w] - s->starts[u]));
                    }
                }
                T_CHECK(found, "a packed window is no run of training turns");
            }
        }
        T_CHECK(packed > 0, "no window held two turns");
        ds.pack = 0;
        /* validation: the held-out turn */
        T_CHECK(nv_data_val_batch(&ds, 0, 1, T, in, tg) && (uint32_t)in[0] == nv_source_token(s, s->starts[7]) &&
                    (uint32_t)in[5] == nv_source_token(s, s->starts[7] + 5),
                "validation window is not the held-out turn");
        /* the unigram baseline counts the answers' tokens only */
        T_CHECK(nv_dataset_unigram_loss(&ds, 512) > 0, "unigram baseline");
        nv_dataset_close(&ds);
    }
    /* malformed lines: one error naming the file and line, nothing opened */
    const struct {
        const char *text, *want;
    } bad[] = {
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}]}\nnot json\n", ":2: not a JSON object"},
        {"[1, 2]\n", ":1: not a JSON object"},
        {"{\"prompt\": \"a\"}\n", ":1: 'messages' is required"},
        {"{\"messages\": [{\"role\": \"robot\", \"content\": \"a\"}]}\n", ":1: 'messages[0].role' must be one of"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": 5}, {\"role\": \"assistant\", \"content\": \"b\"}]}\n", "content' must be a string"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}\n", ":1: no assistant message to train on"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\", \"weight\": 0}]}\n",
         ":1: no assistant message to train on"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\", \"weight\": 2}]}\n",
         ":1: 'messages[1].weight' must be 0 or 1"},
        {"{\"tools\": [{\"type\": \"code\"}], \"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
         "\"content\": \"b\"}]}\n", ":1: 'tools[0]' must be {\"type\": \"function\""},
        {"\n\n", ": no conversations"},
        {"{\"functions\": [], \"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}]}\n",
         ":1: the legacy 'functions' are not read"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"function_call\": {\"name\": \"f\"}}]}\n",
         ":1: 'messages[1].function_call' (legacy) is not read"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\"}]}\n",
         ":1: 'messages[1]' has neither content nor tool_calls"},
    };
    for (size_t i = 0; i <= sizeof bad / sizeof bad[0]; i++) {
        /* and, last, two answers in a row, which the llama2 template cannot show */
        const char *two = "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"},"
                          " {\"role\": \"assistant\", \"content\": \"c\"}]}\n";
        const int last = i == sizeof bad / sizeof bad[0];
        const char *bp = last ? t_write("bad.jsonl", two, strlen(two)) : t_write("bad.jsonl", bad[i].text, strlen(bad[i].text));
        const char *want_msg = last ? ":1: chat: the llama2 template cannot hold two assistant messages in a row" : bad[i].want;
        nv_dataset ds;
        nv_err e = nv_dataset_open_chat(&ds, &bp, 1, t, 512, 0.1f, last ? NV_CHAT_LLAMA2 : NV_CHAT_CHATML);
        T_CHECK(e != NV_OK && strstr(nv_errmsg(), "bad.jsonl") && strstr(nv_errmsg(), want_msg) && ds.src == NULL,
                "case %zu: '%s'", i, e ? nv_errmsg() : "accepted");
        if (!e) nv_dataset_close(&ds);
    }
    nv_tokenizer_free(t);
}

/* Preference data (OpenAI's preference fine-tuning format): each line is a pair of turns, the two
 * answers after the same conversation (its tools in the prompt as chat data's), the preferred first;
 * the split falls between pairs; a batch holds whole pairs, validation ones in order; malformed lines
 * and mixtures are refused with the file and line. */
static void test_preference_data(void) {
    nv_tokenizer *t = load_tok512();
    if (!t) return;
    nv_buf b = {0};
    for (int i = 0; i < 10; i++)
        nv_buf_printf(&b,
                      "{\"input\": {\"messages\": [%s{\"role\": \"user\", \"content\": \"Q%d\"}]%s}, \"preferred_output\": "
                      "[{\"role\": \"assistant\", \"content\": \"Good %d.\"}], \"non_preferred_output\": [{\"role\": "
                      "\"assistant\", \"content\": \"Bad.\"}]}\n",
                      i == 0 ? "{\"role\": \"system\", \"content\": \"Be kind.\"}, " : "", i,
                      i == 1 ? ", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}]" : "",
                      i);
    const char *p = t_write("pref.jsonl", b.data, b.len);
    nv_buf_free(&b);
    nv_dataset ds;
    nv_err e = nv_dataset_open_chat(&ds, &p, 1, t, 512, 0.2f, NV_CHAT_CHATML);
    T_CHECK(e == NV_OK, "open: %s", nv_errmsg());
    if (e) {
        nv_tokenizer_free(t);
        return;
    }
    const nv_source *s = &ds.src[0];
    T_CHECK(ds.pref && ds.chat && s->pairs && s->n_starts == 20 && s->n_train_starts == 16 && nv_data_pairs(&ds) == 10,
            "pref %d, %llu turns, %llu train", ds.pref, (unsigned long long)s->n_starts,
            (unsigned long long)s->n_train_starts);
    const nv_chat_msg p0[] = {{"system", "Be kind.", NULL, 0, NULL, NULL, NULL, 0}, {"user", "Q0", NULL, 0, NULL, NULL, NULL, 0}, {"assistant", "Good 0.", NULL, 0, NULL, NULL, NULL, 0}};
    const nv_chat_msg r0[] = {{"system", "Be kind.", NULL, 0, NULL, NULL, NULL, 0}, {"user", "Q0", NULL, 0, NULL, NULL, NULL, 0}, {"assistant", "Bad.", NULL, 0, NULL, NULL, NULL, 0}};
    check_turn(s, 0, t, NV_CHAT_CHATML, p0, 3);
    check_turn(s, 1, t, NV_CHAT_CHATML, r0, 3);
    const char *tool = "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}";
    char **texts = NULL;
    int n_texts = 0;
    nv_api_error err = {0};
    cJSON *tools = cJSON_Parse("[]");
    cJSON_AddItemToArray(tools, cJSON_Parse(tool));
    if (nv_api_tool_texts(tools, NV_TOOLS_HERMES, &texts, &n_texts, &err) == 0) {
        const nv_chat_opts o = {.tools = (const char *const *)texts, .n_tools = n_texts};
        const nv_chat_msg p1[] = {{"user", "Q1", NULL, 0, NULL, NULL, NULL, 0}, {"assistant", "Good 1.", NULL, 0, NULL, NULL, NULL, 0}};
        const nv_chat_msg r1[] = {{"user", "Q1", NULL, 0, NULL, NULL, NULL, 0}, {"assistant", "Bad.", NULL, 0, NULL, NULL, NULL, 0}};
        check_turn_opts(s, 2, t, NV_CHAT_CHATML, p1, 2, &o);
        check_turn_opts(s, 3, t, NV_CHAT_CHATML, r1, 2, &o);
        nv_api_tool_texts_free(texts, n_texts);
    }
    cJSON_Delete(tools);
    /* a pair's two windows, and batches of pairs */
    enum { T = 48, B = 6 };
    int in[B * T], tg[B * T], in2[2 * T], tg2[2 * T];
    uint64_t ids[B / 2];
    nv_data_cursor c;
    nv_data_cursor_init(&c, 5);
    int seen[10] = {0};
    for (int round = 0; round < 20; round++) {
        T_CHECK(nv_data_next_pairs(&ds, &c, B, T, in, tg, ids) == NV_OK, "next pairs: %s", nv_errmsg());
        for (int i = 0; i < B / 2; i++) {
            T_CHECK(ids[i] < 8, "training drew pair %llu, a validation one", (unsigned long long)ids[i]);
            if (ids[i] >= 10) continue;
            seen[ids[i]] = 1;
            nv_data_pair(&ds, ids[i], T, in2, tg2);
            T_CHECK(!memcmp(in2, in + 2 * i * T, sizeof in2) && !memcmp(tg2, tg + 2 * i * T, sizeof tg2),
                    "the batch's pair %d is not pair %llu's windows", i, (unsigned long long)ids[i]);
        }
    }
    for (int i = 0; i < 8; i++) T_CHECK(seen[i], "training pair %d never drawn in 60", i);
    T_CHECK(c.windows == 120, "windows counted %llu", (unsigned long long)c.windows);
    nv_data_pair(&ds, 3, T, in2, tg2); /* the prompt is the same, the answers differ */
    const uint64_t prompt = s->starts[6], plen = s->starts[7] - prompt;
    int first_c = -1, first_r = -1;
    for (int t2 = 0; t2 < T; t2++) {
        if (first_c < 0 && tg2[t2] >= 0) first_c = t2;
        if (first_r < 0 && tg2[T + t2] >= 0) first_r = t2;
    }
    T_CHECK(first_c == first_r && first_c > 0 && !memcmp(in2, in2 + T, (size_t)(first_c + 1) * sizeof(int)) && plen > 0,
            "the two answers of pair 3 start at %d and %d", first_c, first_r);
    T_CHECK(nv_data_next_pairs(&ds, &c, 5, T, in, tg, ids) != NV_OK && strstr(nv_errmsg(), "even batch"), "odd batch");
    T_CHECK(nv_data_val_pairs(&ds, 0, 4, T, in, tg, ids) && ids[0] == 8 && ids[1] == 9, "validation pairs %llu %llu",
            (unsigned long long)ids[0], (unsigned long long)ids[1]);
    T_CHECK(nv_data_val_pairs(&ds, 1, 4, T, in, tg, ids) && ids[0] == 8, "validation wraps to %llu", (unsigned long long)ids[0]);
    nv_data_pair(&ds, 10, T, in2, tg2); /* past the last: no target */
    int any = 0;
    for (int i = 0; i < 2 * T; i++) any |= tg2[i] >= 0;
    T_CHECK(!any, "a pair past the end has targets");
    nv_dataset_close(&ds);

    /* TRL's lines: strings, messages with a prompt, and two conversations sharing all but the answer;
       the same turns as OpenAI's format gives */
    const char *trl =
        "{\"prompt\": \"Q0\", \"chosen\": \"Good 0.\", \"rejected\": \"Bad.\"}\n"
        "{\"prompt\": [{\"role\": \"system\", \"content\": \"Be kind.\"}, {\"role\": \"user\", \"content\": \"Q0\"}],"
        " \"chosen\": [{\"role\": \"assistant\", \"content\": \"Good 0.\"}], \"rejected\": \"Bad.\"}\n"
        "{\"chosen\": [{\"role\": \"system\", \"content\": \"Be kind.\"}, {\"role\": \"user\", \"content\": \"Q0\"},"
        " {\"role\": \"assistant\", \"content\": \"Good 0.\"}], \"rejected\": [{\"role\": \"system\", \"content\": "
        "\"Be kind.\"}, {\"role\": \"user\", \"content\": \"Q0\"}, {\"role\": \"assistant\", \"content\": \"Bad.\"}]}\n";
    p = t_write("trl.jsonl", trl, strlen(trl));
    e = nv_dataset_open_chat(&ds, &p, 1, t, 512, 0.0f, NV_CHAT_LLAMA3);
    T_CHECK(e == NV_OK && ds.pref && ds.src[0].n_starts == 6, "TRL lines: %s", e ? nv_errmsg() : "not 3 pairs");
    if (e == NV_OK && ds.src[0].n_starts == 6) {
        const nv_chat_msg q0c[] = {{"user", "Q0", NULL, 0, NULL, NULL, NULL, 0}, {"assistant", "Good 0.", NULL, 0, NULL, NULL, NULL, 0}};
        const nv_chat_msg q0r[] = {{"user", "Q0", NULL, 0, NULL, NULL, NULL, 0}, {"assistant", "Bad.", NULL, 0, NULL, NULL, NULL, 0}};
        check_turn(&ds.src[0], 0, t, NV_CHAT_LLAMA3, q0c, 2);
        check_turn(&ds.src[0], 1, t, NV_CHAT_LLAMA3, q0r, 2);
        for (int k = 1; k < 3; k++) {
            check_turn(&ds.src[0], 2 * (uint64_t)k, t, NV_CHAT_LLAMA3, p0, 3);
            check_turn(&ds.src[0], 2 * (uint64_t)k + 1, t, NV_CHAT_LLAMA3, r0, 3);
        }
    }
    if (e == NV_OK) nv_dataset_close(&ds);
    /* a weighted mixture of the two files draws pairs by the weights, each a training pair of its file */
    const char *mix[2] = {t_path("pref.jsonl"), t_path("trl.jsonl")};
    e = nv_dataset_open_chat(&ds, mix, 2, t, 512, 0.2f, NV_CHAT_CHATML);
    T_CHECK(e == NV_OK && nv_data_pairs(&ds) == 13 && ds.src[1].n_train_starts == 6, "two files: %s", e ? nv_errmsg() : "pairs");
    for (int k = 0; e == NV_OK && k < 2; k++) {
        const float w[2] = {(float)(k == 0), (float)(k == 1)};
        T_CHECK(nv_dataset_set_weights(&ds, w, 2) == NV_OK, "%s", nv_errmsg());
        int drawn[13] = {0};
        for (int round = 0; round < 20; round++) {
            T_CHECK(nv_data_next_pairs(&ds, &c, B, T, in, tg, ids) == NV_OK, "weighted pairs: %s", nv_errmsg());
            for (int i = 0; i < B / 2; i++) drawn[ids[i] < 13 ? ids[i] : 0]++;
        }
        for (int id = 0; id < 13; id++) /* pref.jsonl's training pairs are 0-7, trl.jsonl's 10-12 */
            T_CHECK((drawn[id] > 0) == (k == 0 ? id < 8 : id >= 10), "weights %d,%d: pair %d drawn %d times", k == 0, k == 1, id, drawn[id]);
    }
    if (e == NV_OK) nv_dataset_close(&ds);

    /* refusals */
    const char *ok_line = "{\"input\": {\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}, \"preferred_output\": "
                          "[{\"role\": \"assistant\", \"content\": \"b\"}], \"non_preferred_output\": [{\"role\": "
                          "\"assistant\", \"content\": \"c\"}]}\n";
    const char *chat_line = "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}]}\n";
    char mixed[1024];
    snprintf(mixed, sizeof mixed, "%s%s", ok_line, chat_line);
    const struct {
        const char *text, *want;
    } bad[] = {
        {mixed, ":2: a chat line in a file of preference lines"},
        {"{\"preferred_output\": [{\"role\": \"assistant\", \"content\": \"b\"}], \"non_preferred_output\": []}\n",
         ":1: 'input' must be an object"},
        {"{\"input\": {\"messages\": []}, \"preferred_output\": [], \"non_preferred_output\": []}\n",
         ":1: 'input.messages' must be a non-empty array"},
        {"{\"input\": {\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}, \"preferred_output\": [{\"role\": \"assistant\", "
         "\"content\": \"b\"}]}\n", ":1: 'non_preferred_output' must be a list of one assistant message"},
        {"{\"input\": {\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}, \"preferred_output\": {\"role\": \"assistant\", "
         "\"content\": \"b\"}, \"non_preferred_output\": [{\"role\": \"assistant\", \"content\": \"c\"}]}\n",
         ":1: 'preferred_output' must be a list of one assistant message"},
        {"{\"input\": {\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}, \"preferred_output\": [{\"role\": \"user\", "
         "\"content\": \"b\"}], \"non_preferred_output\": [{\"role\": \"assistant\", \"content\": \"c\"}]}\n",
         ":1: 'preferred_output' must be a list of one assistant message"},
        {"{\"input\": {\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}, \"preferred_output\": [{\"role\": \"assistant\"}], "
         "\"non_preferred_output\": [{\"role\": \"assistant\", \"content\": \"c\"}]}\n",
         ":1: 'preferred_output (its answer)' has neither content nor tool_calls"},
        {"{\"input\": {\"messages\": [{\"role\": \"robot\", \"content\": \"a\"}]}, \"preferred_output\": [{\"role\": \"assistant\", "
         "\"content\": \"b\"}], \"non_preferred_output\": [{\"role\": \"assistant\", \"content\": \"c\"}]}\n",
         ":1: the conversation with 'preferred_output': 'messages[0].role' must be one of"},
        {"{\"input\": {\"functions\": [], \"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}, \"preferred_output\": "
         "[{\"role\": \"assistant\", \"content\": \"b\"}], \"non_preferred_output\": [{\"role\": \"assistant\", \"content\": \"c\"}]}\n",
         ":1: the legacy 'functions' are not read"},
        {"{\"chosen\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}], "
         "\"rejected\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"c\"}]}\n",
         ":1: without 'prompt', 'chosen' and 'rejected' must be the same conversation"},
        {"{\"chosen\": \"b\", \"rejected\": \"c\"}\n", ":1: 'chosen' must be a conversation ending in an assistant message"},
        {"{\"prompt\": 5, \"chosen\": \"b\", \"rejected\": \"c\"}\n", ":1: 'prompt' must be a string or a non-empty list"},
        {"{\"prompt\": \"a\", \"chosen\": \"b\"}\n", ":1: 'rejected' must be a string or a list of one assistant message"},
        {"{\"prompt\": \"a\", \"chosen\": [{\"role\": \"user\", \"content\": \"b\"}], \"rejected\": \"c\"}\n",
         ":1: 'chosen' must be a string or a list of one assistant message"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *bp = t_write("bad_pref.jsonl", bad[i].text, strlen(bad[i].text));
        e = nv_dataset_open_chat(&ds, &bp, 1, t, 512, 0.1f, NV_CHAT_CHATML);
        T_CHECK(e != NV_OK && strstr(nv_errmsg(), "bad_pref.jsonl") && strstr(nv_errmsg(), bad[i].want) && ds.src == NULL,
                "case %zu: '%s'", i, e ? nv_errmsg() : "accepted");
        if (!e) nv_dataset_close(&ds);
    }
    /* a file of pairs beside chat data: refused, the other file named */
    const char *both[2] = {t_write("pairs_ok.jsonl", ok_line, strlen(ok_line)), NULL};
    char first[700];
    snprintf(first, sizeof first, "%s", both[0]);
    both[0] = first;
    both[1] = t_write("chat_ok.jsonl", chat_line, strlen(chat_line));
    e = nv_dataset_open_chat(&ds, both, 2, t, 512, 0.0f, NV_CHAT_CHATML);
    T_CHECK(e != NV_OK && strstr(nv_errmsg(), "chat_ok.jsonl is not preference data") && ds.src == NULL, "mixed files: '%s'",
            e ? nv_errmsg() : "accepted");
    if (!e) nv_dataset_close(&ds);
    nv_tokenizer_free(t);
}

/* A long text is tokenized in groups of documents on the pool's threads: the tokens are those of
 * every document encoded one after another, whatever the thread count (the TinyStories validation
 * head's first 300 KB: hundreds of stories between blank lines). */
static void test_text_tokenized_in_groups(void) {
    nv_tokenizer *t = load_tok512();
    const char *vp = t_data("corpus/tinystories_valid_head.txt");
    char *text = NULL;
    size_t len = 0;
    if (!t || !vp || nv_file_read_all(vp, &text, &len) != NV_OK) {
        nv_tokenizer_free(t);
        return;
    }
    if (len > 300000) text[300000] = '\0';
    const char *path = t_write("long.txt", text, strlen(text));
    char file[700];
    snprintf(file, sizeof file, "%s", path);
    expect_ids x = {0};
    expect_split(&x, t, text, "\n\n"); /* the stories, between blank lines */
    T_CHECK(x.docs > 200, "only %d stories", x.docs);
    const char *paths[1] = {file};
    for (int threads = 1; threads <= 3; threads++) {
        T_CHECK(nv_pool_init(threads) == NV_OK, "pool");
        nv_dataset ds;
        if (!open_ok(&ds, paths, 1, t, 512, 0.0f)) continue;
        const nv_source *s = &ds.src[0];
        int same = (int)s->n_tokens == x.n;
        for (uint64_t i = 0; same && i < s->n_tokens; i++) same = (int)nv_source_token(s, i) == x.ids[i];
        T_CHECK(same, "%d threads: %llu tokens, the documents one by one give %d", threads, (unsigned long long)s->n_tokens, x.n);
        nv_dataset_close(&ds);
    }
    nv_pool_shutdown();
    free(x.ids);
    free(text);
    nv_tokenizer_free(t);
}

int main(void) {
    T_RUN(test_u16_windows_from_training_split);
    T_RUN(test_u32_and_mixed_sources);
    T_RUN(test_weighted_sources);
    T_RUN(test_cursor_deterministic_and_resumable);
    T_RUN(test_val_batches);
    T_RUN(test_unigram_loss);
    T_RUN(test_malformed_inputs);
    T_RUN(test_text_documents);
    T_RUN(test_text_folder);
    T_RUN(test_gzip_data);
    T_RUN(test_text_tokenized_in_groups);
    T_RUN(test_chat_data);
    T_RUN(test_prompt_completion_data);
    T_RUN(test_preference_data);
    return t_done();
}
