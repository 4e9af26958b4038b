/* Importance matrices: what the plans' observers collect against a direct computation, the imatrix
 * GGUF and llama.cpp's older .dat read back, malformed files refused, the quantizers fitted to an
 * importance (a smaller weighted error on every kind that takes one), and `nerve imatrix` + `nerve
 * export --imatrix` end to end (a smaller KL divergence from the fp32 model than without). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "model/imatrix.h"
#include "t.h"

/* The sums collected over a forward pass of a few tokens: attn_q's are the squares of RMSNorm(the
 * embedding) summed over the tokens, attn_k and attn_v see the same inputs, ffn_gate and ffn_up
 * too; the classifier sees the rows that reach it; nothing is added once stopped. */
static void test_collect_matches_direct(void) {
    const char *mp = t_data("models/stories260K.bin");
    if (!mp) return;
    nv_model m;
    T_CHECK(nv_model_load(mp, &m) == NV_OK, "%s", nv_errmsg());
    if (!m.params) return;
    nv_engines_init(NULL, 0);
    nv_imatrix im;
    nv_state s;
    const nv_config *c = &m.config;
    const int toks[5] = {1, 403, 407, 261, 30};
    T_CHECK(nv_model_build_plans(&m, nv_engine_best_fp32()) == NV_OK && nv_imatrix_collect(&im, &m) == NV_OK &&
                nv_state_init(&s, c, 8, 16, 0) == NV_OK,
            "%s", nv_errmsg());
    if (!im.e) return;
    T_CHECK(im.n == c->n_layers * NV_LAYER_MATRICES + 1, "%d entries", im.n);
    T_CHECK(nv_forward(&m, &s, toks, 5, 0) == NV_OK, "%s", nv_errmsg());
    const nv_imatrix_entry *q = nv_imatrix_find(&im, "blk.0.attn_q.weight"), *k = nv_imatrix_find(&im, "blk.0.attn_k.weight"),
                           *v = nv_imatrix_find(&im, "blk.0.attn_v.weight"), *g = nv_imatrix_find(&im, "blk.2.ffn_gate.weight"),
                           *u = nv_imatrix_find(&im, "blk.2.ffn_up.weight"), *d = nv_imatrix_find(&im, "blk.4.ffn_down.weight"),
                           *cls = nv_imatrix_find(&im, "token_embd.weight"); /* stories260K's classifier is its embedding */
    T_CHECK(q && k && v && g && u && d && cls, "entries missing");
    if (!q || !k || !v || !g || !u || !d || !cls) return;
    T_CHECK(q->count[0] == 5 && d->count[0] == 5 && cls->count[0] == 1 && d->k == c->hidden_dim && q->k == c->dim && q->n_mat == 1,
            "counts %g %g %g, widths %d %d", q->count[0], d->count[0], cls->count[0], d->k, q->k);
    double worst = 0;
    for (int j = 0; j < c->dim; j++) {
        double want = 0;
        for (int t = 0; t < 5; t++) {
            float xn[64];
            nv_rmsnorm(xn, m.w.tok_emb + (size_t)toks[t] * c->dim, m.w.rms_att, c->dim, c->norm_eps);
            want += (double)xn[j] * xn[j];
        }
        worst = fmax(worst, fabs(q->sum2[j] - want) / fmax(want, 1e-12));
    }
    T_CHECK(worst < 1e-5, "attn_q's sums differ from the squared normalized embeddings by %g", worst);
    T_CHECK(!memcmp(q->sum2, k->sum2, (size_t)q->k * sizeof(double)) && !memcmp(q->sum2, v->sum2, (size_t)q->k * sizeof(double)) &&
                !memcmp(g->sum2, u->sum2, (size_t)g->k * sizeof(double)),
            "products of the same input collected different sums");
    nv_imatrix_stop(&m);
    T_CHECK(nv_forward(&m, &s, toks, 3, 5) == NV_OK && q->count[0] == 5, "collected after stopping: %g", q->count[0]);
    nv_state_free(&s);
    nv_imatrix_free(&im);
    nv_model_free(&m);
}

/* Saved and loaded back (sums in fp32, counts, chunks, datasets); llama.cpp's .dat read as means
 * times calls; malformed files refused with a message. */
static void test_files(void) {
    nv_imatrix im = {0}, back;
    nv_imatrix_entry *e;
    T_CHECK(nv_imatrix_add_entry(&im, "t", "blk.0.attn_q.weight", 19, 3, 1, &e) == NV_OK, "%s", nv_errmsg());
    e->sum2[0] = 1.5, e->sum2[1] = 0, e->sum2[2] = 1e6 / 3, e->count[0] = 12;
    T_CHECK(nv_imatrix_add_entry(&im, "t", "output.weight", 13, 40, 1, &e) == NV_OK, "%s", nv_errmsg());
    for (int j = 0; j < 40; j++) e->sum2[j] = j * 0.25;
    e->count[0] = 7;
    T_CHECK(nv_imatrix_add_entry(&im, "t", "output.weight", 13, 4, 1, &e) != NV_OK, "a name taken twice");
    nv_imatrix_add_dataset(&im, "a.txt", 5);
    nv_imatrix_add_dataset(&im, "b.txt", 5);
    im.chunks = 9, im.chunk_size = 512;
    const char *p = t_path("im.gguf");
    T_CHECK(nv_imatrix_save(&im, p) == NV_OK && nv_imatrix_load(p, &back) == NV_OK, "%s", nv_errmsg());
    if (back.e) {
        T_CHECK(back.n == 2 && back.chunks == 9 && back.chunk_size == 512 && back.n_datasets == 2 && !strcmp(back.datasets[1], "b.txt"),
                "read back: %d entries, %d chunks of %d, %d datasets", back.n, back.chunks, back.chunk_size, back.n_datasets);
        for (int i = 0; i < im.n; i++) {
            const nv_imatrix_entry *a = &im.e[i], *b = nv_imatrix_find(&back, a->name);
            int same = b && b->k == a->k && b->n_mat == a->n_mat;
            for (int m = 0; same && m < a->n_mat; m++) same = b->count[m] == a->count[m];
            for (int j = 0; same && j < a->k * a->n_mat; j++) same = b->sum2[j] == (double)(float)a->sum2[j];
            T_CHECK(same, "%s differs read back", a->name);
        }
        float means[3];
        nv_imatrix_means(&back.e[0], means);
        T_CHECK(means[0] == 1.5f / 12 && means[1] == 0, "means %g %g", (double)means[0], (double)means[1]);
    }
    nv_imatrix_free(&back);
    /* a count between 0 and 1 would make the means overflow (found by fuzz_model): refused */
    im.e[1].count[0] = 1e-30;
    T_CHECK(nv_imatrix_save(&im, p) == NV_OK && nv_imatrix_load(p, &back) == NV_EFORMAT && strstr(nv_errmsg(), "counts"),
            "a count of 1e-30 read: %s", nv_errmsg());
    im.e[1].count[0] = 7;

    /* llama.cpp's .dat: entries, each name, ncall, nval, values (means x ncall); then last call and dataset */
    unsigned char dat[256];
    size_t n = 0;
#define PUT(v, size) (memcpy(dat + n, (v), (size)), n += (size))
    const int32_t one = 1, len = 13, ncall = 4, nval = 2, last = 4, dlen = 3;
    const float vals[2] = {8.0f, 2.0f};
    PUT(&one, 4), PUT(&len, 4), PUT("output.weight", 13), PUT(&ncall, 4), PUT(&nval, 4), PUT(vals, 8);
    const size_t entries_end = n;
    PUT(&last, 4), PUT(&dlen, 4), PUT("abc", 3);
    T_CHECK(nv_imatrix_load(t_write("old.dat", dat, n), &back) == NV_OK, "%s", nv_errmsg());
    if (back.e) {
        float m2[2];
        nv_imatrix_means(&back.e[0], m2);
        T_CHECK(back.n == 1 && m2[0] == 2.0f && m2[1] == 0.5f && back.chunks == 4 && back.n_datasets == 1 && !strcmp(back.datasets[0], "abc"),
                "the .dat file read as %g %g over %d chunks", (double)m2[0], (double)m2[1], back.chunks);
    }
    nv_imatrix_free(&back);
    T_CHECK(nv_imatrix_load(t_write("old2.dat", dat, entries_end), &back) == NV_OK && back.n == 1, "a .dat without its dataset: %s",
            nv_errmsg());
    nv_imatrix_free(&back);
    /* every truncation of the .dat and of the GGUF is refused, never read past */
    char *gg = NULL;
    size_t gl = 0;
    nv_file_read_all(p, &gg, &gl);
    for (size_t cut = 0; cut < entries_end; cut++)
        if (nv_imatrix_load(t_write("cut.dat", dat, cut), &back) == NV_OK) {
            T_CHECK(0, ".dat cut at %zu read", cut);
            nv_imatrix_free(&back);
        }
    for (size_t cut = 0; gg && cut + 28 < gl; cut += 7) /* the last 28 bytes pad the last count: not data */
        if (nv_imatrix_load(t_write("cut.gguf", gg, cut), &back) == NV_OK) {
            T_CHECK(0, "imatrix GGUF cut at %zu of %zu read", cut, gl);
            nv_imatrix_free(&back);
        }
    free(gg);
    /* values that are not sums of squares, and a name with a NUL */
    const float bad[2] = {NAN, -1.0f};
    for (int b = 0; b < 2; b++) {
        memcpy(dat + 4 + 4 + 13 + 4 + 4, &bad[b], 4);
        T_CHECK(nv_imatrix_load(t_write("bad.dat", dat, entries_end), &back) != NV_OK && strstr(nv_errmsg(), "finite"), "%g read: %s",
                (double)bad[b], nv_errmsg());
    }
    memcpy(dat + 4 + 4 + 13 + 4 + 4, vals, 4);
    dat[4 + 4 + 3] = 0;
    T_CHECK(nv_imatrix_load(t_write("nul.dat", dat, entries_end), &back) != NV_OK, "a name with a NUL read");
    dat[4 + 4 + 3] = '\n'; /* names go into messages: one line each (found by fuzz_model) */
    T_CHECK(nv_imatrix_load(t_write("nl.dat", dat, entries_end), &back) != NV_OK && !strchr(nv_errmsg(), '\n'), "a name with a newline: %s",
            nv_errmsg());
    /* a model GGUF is not an importance matrix */
    const char *model_gguf = t_data("gguf/tinyllamas-stories-260k-f32.gguf");
    if (model_gguf) T_CHECK(nv_imatrix_load(model_gguf, &back) != NV_OK, "a model read as an importance matrix");
    /* nor one whose general.type holds a newline: the message stays one line (found by fuzz_model) */
    static const char type_nl[] = "GGUF\3\0\0\0\0\0\0\0\0\0\0\0\1\0\0\0\0\0\0\0\14\0\0\0\0\0\0\0general.type\10\0\0\0"
                                  "\3\0\0\0\0\0\0\0i\nx";
    T_CHECK(nv_imatrix_load(t_write("type_nl.gguf", type_nl, sizeof type_nl - 1), &back) == NV_EFORMAT && strstr(nv_errmsg(), "general.type") &&
                !strchr(nv_errmsg(), '\n'),
            "%s", nv_errmsg());
    nv_imatrix_free(&im);
#undef PUT
}

/* On a model whose rows are whole super-blocks, each kind that takes an importance (Q4_0, Q5_0, Q4_K,
 * Q5_K, Q6_K) written with a strongly uneven one has a smaller error weighted by it than without. */
static void test_weighted_quantizers(void) {
    nv_config c = {256, 512, 2, 4, 1, 64, 300, 64, 10000.0f, 1e-5f, 0, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    nv_model m;
    T_CHECK(nv_model_alloc(&m, &c) == NV_OK, "%s", nv_errmsg());
    if (!m.params) return;
    nv_model_init_random(&m, 5);
    nv_imatrix im = {0};
    uint64_t x = 99;
    for (int i = 0; i < c.n_layers * NV_LAYER_MATRICES + 1; i++) {
        char name[64];
        nv_model_plan_tensor_name(&c, i, name, sizeof name, NULL);
        nv_imatrix_entry *e;
        const int k = i < c.n_layers * NV_LAYER_MATRICES && i % NV_LAYER_MATRICES == 5 ? c.hidden_dim : c.dim;
        T_CHECK(nv_imatrix_add_entry(&im, "t", name, strlen(name), k, 1, &e) == NV_OK, "%s", nv_errmsg());
        for (int j = 0; j < k; j++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            e->sum2[j] = exp(((double)(x >> 11) / 9007199254740992.0 - 0.5) * 8); /* e^-4 .. e^4 */
        }
        e->count[0] = 1;
    }
    static const struct {
        const char *name;
        uint32_t type;
    } kinds[] = {{"q4_0", NV_GGUF_Q4_0}, {"q5_0", NV_GGUF_Q5_0}, {"q4_k_m", NV_GGUF_Q4_K}, {"q5_k_m", NV_GGUF_Q5_K}, {"q6_k", NV_GGUF_Q6_K}};
    const nv_imatrix_entry *we = nv_imatrix_find(&im, "blk.1.ffn_up.weight");
    for (size_t ki = 0; ki < sizeof kinds / sizeof kinds[0] && we; ki++) {
        double err[2] = {0, 0};
        for (int with = 0; with < 2; with++) {
            char path[700];
            snprintf(path, sizeof path, "%s/w-%s-%d.gguf", t_tmpdir(), kinds[ki].name, with);
            nv_model r;
            T_CHECK(nv_gguf_save(&m, NULL, "w", path, kinds[ki].type, NULL, with ? &im : NULL) == NV_OK && nv_model_load(path, &r) == NV_OK,
                    "%s: %s", kinds[ki].name, nv_errmsg());
            if (!r.params) continue;
            const size_t off = (size_t)c.hidden_dim * c.dim; /* layer 1's w3 (ffn_up): rows of dim */
            for (size_t i = 0; i < off; i++) {
                const double d = (double)m.w.w3[off + i] - r.w.w3[off + i];
                err[with] += we->sum2[i % (size_t)c.dim] * d * d;
            }
            nv_model_free(&r);
        }
        T_CHECK(err[1] < err[0], "%s: weighted error %g with the importance, %g without", kinds[ki].name, err[1], err[0]);
        if (getenv("T_VERBOSE")) printf("    %s: weighted error %.4g with, %.4g without\n", kinds[ki].name, err[1], err[0]);
    }
    /* an entry of another width: refused before anything is written */
    nv_imatrix_entry *e0 = (nv_imatrix_entry *)nv_imatrix_find(&im, "blk.0.attn_q.weight");
    e0->k = 128;
    const char *bad = t_path("w-bad.gguf");
    T_CHECK(nv_gguf_save(&m, NULL, "w", bad, NV_GGUF_Q4_0, NULL, &im) == NV_EINVAL && strstr(nv_errmsg(), "another model") &&
                !nv_file_exists(bad),
            "an importance of 128 columns for rows of 256: %s", nv_errmsg());
    e0->k = c.dim;
    nv_imatrix_free(&im);
    nv_model_free(&m);
}

/* Layer 0's up experts' error in file path against m, each expert weighted by imp's importances of
 * that expert (k x E), into err[E]. */
static void expert_errors(const nv_model *m, const char *path, const double *imp, double *err) {
    const nv_config *c = &m->config;
    nv_model r;
    T_CHECK(nv_model_load(path, &r) == NV_OK, "%s", nv_errmsg());
    const size_t hd = (size_t)c->hidden_dim * c->dim;
    for (int x = 0; x < c->n_experts; x++) {
        err[x] = 0;
        for (size_t i = 0; r.params && i < hd; i++) {
            const double d = (double)m->w.w3[x * hd + i] - r.w.w3[x * hd + i];
            err[x] += imp[(size_t)x * c->dim + i % (size_t)c->dim] * d * d;
        }
    }
    nv_model_free(&r);
}

/* A mixture of experts (4 experts, 2 a token): one entry per stacked expert tensor of one sum per
 * expert, over the tokens that chose it (gate's and up's alike, the counts those the router's choices
 * give and adding to tokens x 2), no entry for the router, read back with its counts; an export
 * weighs each expert's rows by its own importances: each expert's weighted error is below both the
 * plain export's and one weighing every expert by expert 0's. */
static void test_mixture(void) {
    nv_config c = {256, 256, 1, 4, 2, 64, 300, 64, 10000.0f, 1e-5f, 0, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    c.n_experts = 4, c.n_experts_used = 2;
    nv_model m;
    T_CHECK(nv_model_alloc(&m, &c) == NV_OK, "%s", nv_errmsg());
    if (!m.params) return;
    nv_model_init_random(&m, 5);
    nv_imatrix im;
    nv_state s;
    enum { N = 9 };
    const int toks[N] = {1, 40, 7, 261, 30, 99, 5, 17, 280};
    T_CHECK(nv_model_build_plans(&m, nv_engine_best_fp32()) == NV_OK && nv_imatrix_collect(&im, &m) == NV_OK &&
                nv_state_init(&s, &c, N, 16, 0) == NV_OK && nv_forward(&m, &s, toks, N, 0) == NV_OK,
            "%s", nv_errmsg());
    nv_imatrix_stop(&m);
    const nv_imatrix_entry *g = nv_imatrix_find(&im, "blk.0.ffn_gate_exps.weight"), *u = nv_imatrix_find(&im, "blk.0.ffn_up_exps.weight"),
                           *d = nv_imatrix_find(&im, "blk.0.ffn_down_exps.weight");
    T_CHECK(im.n == 8 && g && u && d && !nv_imatrix_find(&im, "blk.0.ffn_gate.weight") && !nv_imatrix_find(&im, "blk.0.ffn_gate_inp.weight"),
            "%d entries", im.n);
    if (g && u && d) {
        T_CHECK(g->n_mat == 4 && d->n_mat == 4 && g->k == c.dim && d->k == c.hidden_dim, "%d x %d, %d x %d", g->k, g->n_mat, d->k, d->n_mat);
        double total = 0;
        for (int x = 0; x < 4; x++) {
            int chose = 0;
            for (int i = 0; i < N * 2; i++) chose += s.r.moe_sel[i] == x;
            T_CHECK(g->count[x] == chose && u->count[x] == chose && d->count[x] == chose, "expert %d: counts %g %g %g, chosen %d", x,
                    g->count[x], u->count[x], d->count[x], chose);
            total += g->count[x];
        }
        T_CHECK(total == N * 2 && !memcmp(g->sum2, u->sum2, (size_t)g->k * 4 * sizeof(double)), "%g choices, or gate's sums differ from up's",
                total);
    }
    const char *p = t_path("moe.imatrix.gguf");
    nv_imatrix back;
    T_CHECK(nv_imatrix_save(&im, p) == NV_OK && nv_imatrix_load(p, &back) == NV_OK, "%s", nv_errmsg());
    const nv_imatrix_entry *b = back.e ? nv_imatrix_find(&back, "blk.0.ffn_down_exps.weight") : NULL;
    T_CHECK(b && d && b->n_mat == 4 && b->k == d->k && !memcmp(b->count, d->count, 4 * sizeof(double)), "read back otherwise");
    nv_imatrix_free(&back);
    nv_state_free(&s);
    nv_imatrix_free(&im);

    /* uneven importances, a pattern of its own per expert, for layer 0's up experts */
    nv_imatrix per = {0}, first = {0};
    nv_imatrix_entry *e;
    T_CHECK(nv_imatrix_add_entry(&per, "t", "blk.0.ffn_up_exps.weight", 24, c.dim, 4, &e) == NV_OK, "%s", nv_errmsg());
    uint64_t x = 7;
    for (int j = 0; j < c.dim * 4; j++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        e->sum2[j] = exp(((double)(x >> 11) / 9007199254740992.0 - 0.5) * 8);
    }
    for (int k = 0; k < 4; k++) e->count[k] = 1;
    nv_imatrix_entry *f;
    T_CHECK(nv_imatrix_add_entry(&first, "t", "blk.0.ffn_up_exps.weight", 24, c.dim, 1, &f) == NV_OK, "%s", nv_errmsg());
    memcpy(f->sum2, e->sum2, (size_t)c.dim * sizeof(double)); /* expert 0's, for all */
    f->count[0] = 1;
    const char *none = t_path("moe-q4.gguf"), *own = t_path("moe-q4-own.gguf"), *zero = t_path("moe-q4-first.gguf");
    T_CHECK(nv_gguf_save(&m, NULL, "m", none, NV_GGUF_Q4_0, NULL, NULL) == NV_OK &&
                nv_gguf_save(&m, NULL, "m", own, NV_GGUF_Q4_0, NULL, &per) == NV_OK &&
                nv_gguf_save(&m, NULL, "m", zero, NV_GGUF_Q4_0, NULL, &first) == NV_OK,
            "%s", nv_errmsg());
    double en[4], eo[4], ez[4];
    expert_errors(&m, none, e->sum2, en);
    expert_errors(&m, own, e->sum2, eo);
    expert_errors(&m, zero, e->sum2, ez);
    for (int k = 0; k < 4; k++) {
        T_CHECK(eo[k] < en[k] && (k == 0 ? eo[k] == ez[k] : eo[k] < ez[k]),
                "expert %d: weighted error %g with its importances, %g without, %g with expert 0's", k, eo[k], en[k], ez[k]);
        if (getenv("T_VERBOSE")) printf("    expert %d: %.4g own, %.4g none, %.4g expert 0's\n", k, eo[k], en[k], ez[k]);
    }
    /* llama.cpp's .dat holds an entry as one row of every expert's columns: the same file */
    nv_imatrix dat = {0};
    T_CHECK(nv_imatrix_add_entry(&dat, "t", "blk.0.ffn_up_exps.weight", 24, c.dim * 4, 1, &f) == NV_OK, "%s", nv_errmsg());
    memcpy(f->sum2, per.e[0].sum2, (size_t)c.dim * 4 * sizeof(double));
    f->count[0] = 1;
    const char *flat = t_path("moe-q4-dat.gguf");
    T_CHECK(nv_gguf_save(&m, NULL, "m", flat, NV_GGUF_Q4_0, NULL, &dat) == NV_OK, "%s", nv_errmsg());
    char *fa = NULL, *fb = NULL;
    size_t la = 0, lb = 0;
    T_CHECK(nv_file_read_all(own, &fa, &la) == NV_OK && nv_file_read_all(flat, &fb, &lb) == NV_OK && la == lb && !memcmp(fa, fb, la),
            "the .dat form's export differs from the per-expert entry's");
    free(fa), free(fb);
    nv_imatrix_free(&dat);
    /* an entry of three experts for a tensor of four: made for another model */
    nv_imatrix three = {0};
    T_CHECK(nv_imatrix_add_entry(&three, "t", "blk.0.ffn_up_exps.weight", 24, c.dim, 3, &e) == NV_OK, "%s", nv_errmsg());
    T_CHECK(nv_gguf_save(&m, NULL, "m", t_path("moe-bad.gguf"), NV_GGUF_Q4_0, NULL, &three) == NV_EINVAL &&
                strstr(nv_errmsg(), "another model"),
            "%s", nv_errmsg());
    nv_imatrix_free(&three);
    nv_imatrix_free(&per);
    nv_imatrix_free(&first);
    nv_model_free(&m);
}

/* The mean KL divergence `nerve perplexity --kl-base` prints for model q against base. */
static double kld(const char *q, const char *base, const char *text) {
    char args[4200];
    snprintf(args, sizeof args, "perplexity -m %s --kl-base %s -f %s --chunks 12 --ctx 256", q, base, text);
    if (t_nerve(args) != 0) return -1;
    const char *at = strstr(t_out, "Mean    KLD:");
    return at ? atof(at + 12) : -1;
}

/* nerve imatrix on a text, then nerve export --imatrix: the file says what it was made with, and
 * its KL divergence from the fp32 model on another text is smaller than the plain export's. */
static void test_cli(void) {
    const char *mp = t_data("models/stories260K.bin"), *tp = t_data("models/tok512.bin"),
               *train = t_data("corpus/tinystories_train_first1000.txt"), *valid = t_data("corpus/tinystories_valid_head.txt");
    if (!mp || !tp || !train || !valid) return;
    char args[4200], im[700], plain[700], with[700];
    snprintf(im, sizeof im, "%s", t_path("cli.imatrix.gguf"));
    snprintf(plain, sizeof plain, "%s", t_path("plain-q4_0.gguf"));
    snprintf(with, sizeof with, "%s", t_path("im-q4_0.gguf"));
    snprintf(args, sizeof args, "imatrix -m %s -z %s -f %s --chunks 30 --ctx 256 -o %s", mp, tp, train, im);
    T_CHECK(t_nerve(args) == 0 && strstr(t_err, "36 matrices") && strstr(t_out, "Final estimate: PPL"), "%s", t_err);
    snprintf(args, sizeof args, "export %s -z %s -o %s --type q4_0", mp, tp, plain);
    T_CHECK(t_nerve(args) == 0, "%s", t_err);
    snprintf(args, sizeof args, "export %s -z %s -o %s --type q4_0 --imatrix %s", mp, tp, with, im);
    T_CHECK(t_nerve(args) == 0, "%s", t_err);
    nv_gguf g;
    if (nv_gguf_open(with, &g) == NV_OK) {
        const nv_gguf_kv *kv = nv_gguf_find(&g, "quantize.imatrix.entries_count");
        int32_t used = 0;
        if (kv) memcpy(&used, kv->val, 4);
        /* ffn_down's rows of 172 stay F32; the classifier's Q6_K falls back to Q8_0, which takes none */
        T_CHECK(used == 30, "quantize.imatrix.entries_count %d, not the 30 quantized matrices that take one", used);
        nv_gguf_close(&g);
    }
    const double k_plain = kld(plain, mp, valid), k_with = kld(with, mp, valid);
    T_CHECK(k_plain > 0 && k_with > 0 && k_with < k_plain, "KL divergence %g with the importance matrix, %g without", k_with, k_plain);
    if (getenv("T_VERBOSE")) printf("    q4_0 KLD on the validation text: %.5f with, %.5f without\n", k_with, k_plain);
    /* refusals: not a quantized GGUF output; a chat file; an importance matrix that is not one */
    snprintf(args, sizeof args, "export %s -o %s --type f16 --imatrix %s", mp, t_path("x.gguf"), im);
    T_CHECK(t_nerve(args) == 2 && strstr(t_err, "--imatrix"), "%s", t_err);
    snprintf(args, sizeof args, "export %s -o %s --type q4_0 --imatrix %s", mp, t_path("y.gguf"), tp);
    T_CHECK(t_nerve(args) == 1 && strstr(t_err, "--imatrix") && !nv_file_exists(t_path("y.gguf")), "%s", t_err);
    snprintf(args, sizeof args, "export %s -z %s -o %s --type q8_0 --imatrix %s", mp, tp, t_path("z.gguf"), im);
    T_CHECK(t_nerve(args) == 0 && strstr(t_err, "Q8_0 takes no importance"), "%s", t_err);
    snprintf(args, sizeof args, "imatrix -m %s -z %s --kl-base %s", mp, tp, mp);
    T_CHECK(t_nerve(args) == 2, "imatrix --kl-base: %s", t_err);
    snprintf(args, sizeof args, "imatrix -m %s -z %s --ctx 100000 -o %s", mp, tp, t_path("never.gguf"));
    T_CHECK(t_nerve(args) == 1 && strstr(t_err, "nerve imatrix:") && !nv_file_exists(t_path("never.gguf")), "%s", t_err);
    snprintf(args, sizeof args, "imatrix --help");
    T_CHECK(t_nerve(args) == 0 && strstr(t_out, "-o FILE"), "%s", t_out);

    /* --in-file: a collection on the validation text added to the one before (sums and counts, chunks,
       datasets); without -m, files combined alone (one twice: every sum and count doubled) */
    char more[700], twice[700];
    snprintf(more, sizeof more, "%s", t_path("more.imatrix.gguf"));
    snprintf(twice, sizeof twice, "%s", t_path("twice.imatrix.gguf"));
    snprintf(args, sizeof args, "imatrix -m %s -z %s -f %s --chunks 5 --ctx 256 --in-file %s -o %s", mp, tp, valid, im, more);
    T_CHECK(t_nerve(args) == 0 && strstr(t_err, "35 chunks"), "%s", t_err);
    snprintf(args, sizeof args, "imatrix --in-file %s --in-file %s -o %s", im, im, twice);
    T_CHECK(t_nerve(args) == 0 && strstr(t_err, "60 chunks of 256 tokens"), "%s", t_err);
    nv_imatrix a, b, t;
    if (nv_imatrix_load(im, &a) == NV_OK) {
        if (nv_imatrix_load(more, &b) == NV_OK) {
            const nv_imatrix_entry *qa = nv_imatrix_find(&a, "blk.0.attn_q.weight"), *qb = nv_imatrix_find(&b, "blk.0.attn_q.weight");
            T_CHECK(qa && qb && qb->count[0] == qa->count[0] + 5 * 256 && b.n_datasets == 2 && b.chunks == 35,
                    "added: %g rows (had %g), %d datasets", qb ? qb->count[0] : 0, qa ? qa->count[0] : 0, b.n_datasets);
            nv_imatrix_free(&b);
        }
        if (nv_imatrix_load(twice, &t) == NV_OK) {
            int same = t.n == a.n;
            for (int i = 0; same && i < a.n; i++) {
                const nv_imatrix_entry *x = &a.e[i], *y = nv_imatrix_find(&t, x->name);
                same = y && y->count[0] == 2 * x->count[0];
                for (int j = 0; same && j < x->k; j++) same = y->sum2[j] == (double)(float)(2 * x->sum2[j]);
            }
            T_CHECK(same, "one file combined with itself is not every sum and count doubled");
            nv_imatrix_free(&t);
        }
        nv_imatrix_free(&a);
    }
    /* refused: an entry of another shape (another model's), -f without a model */
    nv_imatrix other = {0};
    nv_imatrix_entry *oe;
    T_CHECK(nv_imatrix_add_entry(&other, "t", "blk.0.attn_q.weight", 19, 32, 1, &oe) == NV_OK && nv_imatrix_save(&other, t_path("other.gguf")) == NV_OK,
            "%s", nv_errmsg());
    nv_imatrix_free(&other);
    snprintf(args, sizeof args, "imatrix --in-file %s --in-file %s -o %s", im, t_path("other.gguf"), t_path("never2.gguf"));
    T_CHECK(t_nerve(args) == 1 && strstr(t_err, "another model") && !nv_file_exists(t_path("never2.gguf")), "%s", t_err);
    snprintf(args, sizeof args, "imatrix --in-file %s -f %s", im, valid);
    T_CHECK(t_nerve(args) == 2 && strstr(t_err, "combined alone"), "%s", t_err);
}

int main(void) {
    T_RUN(test_collect_matches_direct);
    T_RUN(test_files);
    T_RUN(test_weighted_quantizers);
    T_RUN(test_mixture);
    T_RUN(test_cli);
    return t_done();
}
