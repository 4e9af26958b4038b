/* nerve bench matmul | peak | cache | chain: the engines measured the way the seed measured its
 * accelerator (one product against peers, the compute unit's peak, the cache cliff, chained-op
 * utilization). Also the helpers the model benches share (bench.h).
 *
 * Timing everywhere: plans are built and inputs filled before the clock starts; one untimed
 * warm-up call, then calls until at least min_reps were made and min_s seconds passed; the figure
 * is the median call. Rows for engines that are off (and peers that cannot run) say ok:false and
 * why, so a table from a machine without AMX shows what was not measured.
 *
 * Peers (OpenBLAS cblas_sgemm, oneDNN bf16 and fp32 matmul with prepacked weights) run in a
 * separate program, build/peers/nerve-peer (bench/peers.c, `make bench-peers`), so that nerve
 * itself never links them; it is looked for beside this binary (DIR/peers/, DIR/../peers/). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/cpu.h"
#include "base/rng.h"
#include "base/timer.h"
#include "cli/bench.h"
#include "cli/cli.h"
#include "engine/engine.h"
#include "engine/peak.h"

/* ---------------------------------------------------------------- shared helpers */

int bench_thread_list(const bench_opts *o, int *out) {
    int cores = nv_cpu_probe()->cores;
    if (o->threads) {
        out[0] = o->threads;
        return 1;
    }
    out[0] = 1;
    if (cores > 1) {
        out[1] = cores;
        return 2;
    }
    return 1;
}

int bench_engine_wanted(const bench_opts *o, int e) {
    if (o->engine) return !strcmp(o->engine, nv_engine_name((nv_engine_id)e));
    return e != NV_ENGINE_SCALAR; /* the reference is measured only when asked for by name */
}

int bench_tokenizer_arg(const char *cmd, int argc, char **argv, const char **tok_path) {
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!(v = cli_value(cmd, argc, argv, &i))) return 2;
        if (!strcmp(argv[i - 1], "-z")) *tok_path = v;
        else return cli_error(cmd, 2, "unknown option '%s' (-z TOKENIZER)", argv[i - 1]);
    }
    return 0;
}

void row_fail(bench_row *r, const char *why) {
    size_t cap = sizeof r->json;
    if (r->jn < cap) {
        int w = snprintf(r->json + r->jn, cap - r->jn, ",\"ok\":false");
        if (w > 0) r->jn += (size_t)w < cap - r->jn ? (size_t)w : cap - r->jn - 1;
    }
    cap = sizeof r->text;
    if (r->tn < cap) {
        int w = snprintf(r->text + r->tn, cap - r->tn, " ok=false");
        if (w > 0) r->tn += (size_t)w < cap - r->tn ? (size_t)w : cap - r->tn - 1;
    }
    row_str(r, "why", why);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_median(void (*fn)(void *), void *ctx, int min_reps, double min_s, int *reps) {
    enum { MAX_REPS = 1000 };
    static double t[MAX_REPS];
    fn(ctx); /* warm-up */
    int n = 0;
    double start = nv_now();
    while (n < MAX_REPS && (n < min_reps || nv_now() - start < min_s)) {
        double t0 = nv_now();
        fn(ctx);
        t[n++] = nv_now() - t0;
    }
    qsort(t, (size_t)n, sizeof t[0], cmp_double);
    if (reps) *reps = n;
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

float *bench_rand(size_t count, float scale, unsigned long long seed) {
    float *v = malloc(count * sizeof(float) + 64);
    if (!v) return NULL;
    nv_rng r;
    nv_rng_seed(&r, seed);
    for (size_t i = 0; i < count; i++) v[i] = (2.0f * nv_rng_uniform(&r) - 1.0f) * scale;
    return v;
}

/* Sets the pool size for a row's thread count. */
static int use_threads(int threads) {
    if (nv_engines_init(NULL, threads) != NV_OK) return 0;
    return 1;
}

static void row_shape(bench_row *r, int m, int n, int k) {
    row_int(r, "m", m);
    row_int(r, "n", n);
    row_int(r, "k", k);
}

static void row_engine_off(bench_row *r, int e) {
    char why[256];
    snprintf(why, sizeof why, "engine %s is off: %s", nv_engine_name((nv_engine_id)e), nv_engine_why_off((nv_engine_id)e));
    row_fail(r, why);
}

/* ---------------------------------------------------------------- one plan, timed */

typedef struct {
    const nv_plan *p;
    const float *x;
    float *y;
    int m;
} run_ctx;

static void run_once(void *v) {
    run_ctx *c = v;
    nv_plan_run(c->p, c->x, c->m, c->y);
}

/* GFLOP/s of engine e on (m, n, k), or a negative value (out of memory). The weights stay alive
 * for the plan's life (the scalar plan reads them in place). */
static double time_plan(int e, int m, int n, int k, int min_reps, double min_s, double *ms, int *reps) {
    float *w = bench_rand((size_t)n * k, sqrtf(3.0f / (float)k), 7 + (uint64_t)n * 31 + (uint64_t)k);
    float *x = bench_rand((size_t)m * k, 1.0f, 11 + (uint64_t)m);
    float *y = malloc((size_t)m * n * sizeof(float) + 64);
    nv_plan *p = NULL;
    double g = -1;
    if (w && x && y && nv_plan_build(&p, (nv_engine_id)e, w, n, k) == NV_OK) {
        run_ctx c = {p, x, y, m};
        double s = bench_median(run_once, &c, min_reps, min_s, reps);
        *ms = s * 1e3;
        g = 2.0 * m * n * k / s / 1e9;
    }
    nv_plan_free(p);
    free(w);
    free(x);
    free(y);
    return g;
}

/* ---------------------------------------------------------------- peers */

typedef struct {
    int ok;
    double gflops;
    char impl[160], why[320], extra[400];
} peer_res;

/* Finds build/peers/nerve-peer beside this binary; 0 when absent. */
static int peer_path(char *buf, size_t cap) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return 0;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    snprintf(buf, cap, "%s/peers/nerve-peer", exe);
    if (access(buf, X_OK) == 0) return 1;
    snprintf(buf, cap, "%s/../peers/nerve-peer", exe);
    return access(buf, X_OK) == 0;
}

/* The value of "key":"..." or "key":number in one JSON line (no nesting); 0 when absent. */
static int json_field(const char *line, const char *key, char *out, size_t cap) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(line, pat);
    if (!p) return 0;
    p += strlen(pat);
    size_t n = 0;
    if (*p == '"') {
        for (p++; *p && *p != '"' && n + 1 < cap; p++) {
            if (*p == '\\' && p[1]) p++;
            out[n++] = *p;
        }
    } else {
        while (*p && *p != ',' && *p != '}' && n + 1 < cap) out[n++] = *p++;
    }
    out[n] = '\0';
    return 1;
}

/* Runs one peer over all shapes at one thread count; res[i] for shape i. */
static void peer_run(const char *peer, int threads, int nshapes, const int (*shapes)[3], int min_reps, double min_s,
                     peer_res *res) {
    char path[4200];
    for (int i = 0; i < nshapes; i++) {
        memset(&res[i], 0, sizeof res[i]);
        snprintf(res[i].why, sizeof res[i].why, "build/peers/nerve-peer not found beside the nerve binary "
                                                "(run scripts/deps.sh --bench && make bench-peers)");
    }
    if (!peer_path(path, sizeof path)) return;
    char cmd[8192];
    size_t n = (size_t)snprintf(cmd, sizeof cmd, "'%s' %s %d %d %g", path, peer, threads, min_reps, min_s);
    for (int i = 0; i < nshapes && n < sizeof cmd; i++)
        n += (size_t)snprintf(cmd + n, sizeof cmd - n, " %d,%d,%d", shapes[i][0], shapes[i][1], shapes[i][2]);
    if (n >= sizeof cmd - 8 || strchr(path, '\'')) return;
    snprintf(cmd + n, sizeof cmd - n, " 2>&1");
    for (int i = 0; i < nshapes; i++) snprintf(res[i].why, sizeof res[i].why, "nerve-peer %s printed no result for this shape", peer);
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    if (!p) return;
    char line[4096], v[400];
    while (fgets(line, sizeof line, p)) {
        int m = 0, nn = 0, k = 0;
        if (!json_field(line, "m", v, sizeof v) || !(m = atoi(v))) {
            /* a message from the peer (usage, a crash): keep it as the reason */
            char *nl = strchr(line, '\n');
            if (nl) *nl = '\0';
            for (int i = 0; i < nshapes; i++)
                if (!res[i].ok) snprintf(res[i].why, sizeof res[i].why, "nerve-peer: %.280s", line);
            continue;
        }
        if (json_field(line, "n", v, sizeof v)) nn = atoi(v);
        if (json_field(line, "k", v, sizeof v)) k = atoi(v);
        for (int i = 0; i < nshapes; i++) {
            if (shapes[i][0] != m || shapes[i][1] != nn || shapes[i][2] != k) continue;
            peer_res *r = &res[i];
            if (strstr(line, "\"ok\":true") && json_field(line, "gflops", v, sizeof v)) {
                r->ok = 1;
                r->gflops = strtod(v, NULL);
                json_field(line, "impl", r->impl, sizeof r->impl);
                char a[160] = "", b[160] = "";
                if (json_field(line, "isa", a, sizeof a)) {
                    json_field(line, "runtime", b, sizeof b);
                    snprintf(r->extra, sizeof r->extra, "isa=%s runtime=%s", a, b);
                } else if (json_field(line, "config", a, sizeof a)) {
                    snprintf(r->extra, sizeof r->extra, "%s", a);
                }
            } else if (!json_field(line, "why", r->why, sizeof r->why)) {
                snprintf(r->why, sizeof r->why, "nerve-peer failed without a reason");
            }
        }
    }
    int st = pclose(p);
    (void)st;
}

/* ---------------------------------------------------------------- matmul */

#define MM_ENGINES NV_ENGINE_COUNT
static const char *const peer_names[] = {"openblas", "onednn", "onednn-fp32", "onednn-int8"};
#define N_PEERS 4
#define PEER_INT8 3

/* The engine a peer's ratio is of: for the int8 peer the highest int8 engine on the ladder that was
 * measured (amx-int8, avx512-int8, avx2-int8); for the others amx-bf16 when measured, else the
 * fastest floating-point engine (-1: none measured). */
static int peer_ref(const double *g, int q) {
    if (q == PEER_INT8) {
        for (int e = MM_ENGINES - 1; e >= 0; e--)
            if (g[e] > 0 && nv_engine_int8((nv_engine_id)e)) return e;
        return -1;
    }
    if (g[NV_ENGINE_AMX_BF16] > 0) return NV_ENGINE_AMX_BF16;
    int ref = -1;
    for (int e = 0; e < MM_ENGINES; e++)
        if (g[e] > 0 && !nv_engine_int8((nv_engine_id)e) && (ref < 0 || g[e] > g[ref])) ref = e;
    return ref;
}

static const char *const target_text[] = {
    "amx-bf16 >= 60% of the tile peak at 256x2048x768",
    "amx-bf16 >= 1.5x onednn (bf16) at every M=256 shape",
    "amx-bf16 >= 2x onednn (bf16) at every M<=16 shape",
    "amx-int8 >= 1.6x amx-bf16 at every M=256 shape",
};

int bench_matmul(int argc, char **argv, const bench_opts *o) {
    int peers = 1, min_reps = o->quick ? 1 : 5;
    double min_s = o->quick ? 0.0 : 0.3, peak_s = o->quick ? 0.005 : 0.3;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--no-peers")) { peers = 0; continue; }
        if (!(v = cli_value("bench matmul", argc, argv, &i))) return 2;
        if (!strcmp(argv[i - 1], "--reps")) { if (!cli_int("bench matmul", "--reps", v, 1, 1000, &min_reps)) return 2; }
        else return cli_error("bench matmul", 2, "unknown option '%s' (--reps N, --no-peers)", argv[i - 1]);
    }
    static const int full[][3] = {{1, 768, 768},    {16, 768, 768},    {256, 768, 768},   {256, 2048, 768},
                                  {256, 768, 2048}, {256, 32000, 768}, {2048, 2048, 2048}};
    static const int quick[][3] = {{1, 64, 64}, {16, 96, 80}};
    const int (*shapes)[3] = o->quick ? quick : full;
    const int ns = o->quick ? 2 : 7;
    if (!use_threads(o->threads)) return cli_error("bench matmul", 1, "%s", nv_errmsg());
    int tl[2], nt = bench_thread_list(o, tl);
    static double g[2][7][MM_ENGINES];
    static peer_res pr[2][N_PEERS][7];
    for (int ti = 0; ti < nt; ti++) {
        const int T = tl[ti];
        if (!use_threads(T)) return cli_error("bench matmul", 1, "%s", nv_errmsg());
        double peak[MM_ENGINES] = {0};
        for (int e = 0; e < MM_ENGINES; e++) {
            nv_peak_unit u = nv_peak_unit_of(e);
            char why[256];
            if (u != NV_PEAK_COUNT && nv_peak_available(u, why, sizeof why) && bench_engine_wanted(o, e))
                peak[e] = nv_peak_run(u, T, peak_s) / 1e9;
        }
        if (peers)
            for (int q = 0; q < N_PEERS; q++) peer_run(peer_names[q], T, ns, shapes, min_reps, min_s, pr[ti][q]);
        for (int s = 0; s < ns; s++) {
            const int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
            for (int e = 0; e < MM_ENGINES; e++) {
                g[ti][s][e] = -1;
                if (!bench_engine_wanted(o, e)) continue;
                bench_row r;
                row_begin(&r, "matmul", nv_engine_name((nv_engine_id)e), T);
                row_shape(&r, m, n, k);
                if (!nv_engine_available((nv_engine_id)e)) {
                    row_engine_off(&r, e);
                    row_end(&r, o);
                    continue;
                }
                double ms = 0;
                int reps = 0;
                double gf = time_plan(e, m, n, k, min_reps, min_s, &ms, &reps);
                if (gf < 0) {
                    row_fail(&r, "out of memory");
                    row_end(&r, o);
                    continue;
                }
                g[ti][s][e] = gf;
                row_num(&r, "gflops", gf);
                row_num(&r, "ms", ms);
                row_int(&r, "reps", reps);
                if (peak[e] > 0) row_num(&r, "of_peak", gf / peak[e]);
                const nv_engine_id twin = nv_engine_bf16_of((nv_engine_id)e); /* an int8 engine against its bf16 one */
                if ((int)twin != e && g[ti][s][twin] > 0)
                    row_num(&r, twin == NV_ENGINE_AMX_BF16 ? "vs_amx_bf16" : "vs_avx512_bf16", gf / g[ti][s][twin]);
                row_end(&r, o);
            }
            if (!peers) continue;
            for (int q = 0; q < N_PEERS; q++) {
                const peer_res *p = &pr[ti][q][s];
                bench_row r;
                row_begin(&r, "matmul", peer_names[q], T);
                row_shape(&r, m, n, k);
                if (!p->ok) {
                    row_fail(&r, p->why);
                    row_end(&r, o);
                    continue;
                }
                row_num(&r, "gflops", p->gflops);
                const int ref = peer_ref(g[ti][s], q);
                if (ref >= 0) {
                    row_num(&r, "ratio_vs", g[ti][s][ref] / p->gflops);
                    row_str(&r, "ratio_of", nv_engine_name((nv_engine_id)ref));
                }
                row_str(&r, "impl", p->impl);
                if (p->extra[0]) row_str(&r, "peer_info", p->extra);
                row_end(&r, o);
            }
        }
        /* the speed targets of issue 3 item 8, read from this run */
        if (o->quick || o->engine) continue;
        for (int t = 0; t < 4; t++) {
            bench_row r;
            row_begin(&r, "matmul", t == 3 ? "amx-int8" : "amx-bf16", T);
            row_str(&r, "case", "target");
            row_str(&r, "target", target_text[t]);
            double value = INFINITY, need = t == 0 ? 0.6 : t == 1 ? 1.5 : t == 2 ? 2.0 : 1.6;
            char why[256] = "";
            if (g[ti][0][NV_ENGINE_AMX_BF16] <= 0) {
                snprintf(why, sizeof why, "amx-bf16 not measured: %s", nv_engine_why_off(NV_ENGINE_AMX_BF16));
            } else if (t == 0) {
                if (peak[NV_ENGINE_AMX_BF16] > 0) value = g[ti][3][NV_ENGINE_AMX_BF16] / peak[NV_ENGINE_AMX_BF16];
                else snprintf(why, sizeof why, "tile peak not measured");
            } else if (t == 3) {
                for (int s = 0; s < ns; s++)
                    if (shapes[s][0] == 256 && g[ti][s][NV_ENGINE_AMX_INT8] > 0)
                        value = fmin(value, g[ti][s][NV_ENGINE_AMX_INT8] / g[ti][s][NV_ENGINE_AMX_BF16]);
                if (!isfinite(value)) snprintf(why, sizeof why, "amx-int8 not measured: %s", nv_engine_why_off(NV_ENGINE_AMX_INT8));
            } else {
                for (int s = 0; s < ns; s++) {
                    int want = t == 1 ? shapes[s][0] == 256 : shapes[s][0] <= 16;
                    if (!want) continue;
                    if (!peers || !pr[ti][1][s].ok) {
                        snprintf(why, sizeof why, "onednn not measured: %s", peers ? pr[ti][1][s].why : "--no-peers");
                        break;
                    }
                    value = fmin(value, g[ti][s][NV_ENGINE_AMX_BF16] / pr[ti][1][s].gflops);
                }
            }
            if (why[0] || !isfinite(value)) {
                row_fail(&r, why[0] ? why : "not measured");
            } else {
                row_num(&r, "value", value);
                row_num(&r, "need", need);
                row_str(&r, "met", value >= need ? "yes" : "no");
            }
            row_end(&r, o);
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- peak */

int bench_peak(int argc, char **argv, const bench_opts *o) {
    double seconds = o->quick ? 0.005 : 0.5;
    size_t bw_bytes = o->quick ? (16u << 20) : (1024u << 20);
    for (int i = 1; i < argc; i++)
        return cli_error("bench peak", 2, "unknown option '%s'", argv[i]);
    if (!use_threads(o->threads)) return cli_error("bench peak", 1, "%s", nv_errmsg());
    int tl[2], nt = bench_thread_list(o, tl);
    for (int ti = 0; ti < nt; ti++) {
        const int T = tl[ti];
        for (int u = 0; u < NV_PEAK_COUNT; u++) {
            nv_peak_unit pu = (nv_peak_unit)u;
            bench_row r;
            row_begin(&r, "peak", nv_peak_engine(pu), T);
            row_str(&r, "instr", nv_peak_instr(pu));
            char why[256];
            if (!nv_peak_available(pu, why, sizeof why)) {
                row_fail(&r, why);
                row_end(&r, o);
                continue;
            }
            double ops = nv_peak_run(pu, T, seconds);
            if (ops <= 0) {
                row_fail(&r, "could not start the threads");
            } else if (nv_peak_is_int(pu)) {
                row_num(&r, "gops", ops / 1e9);
                row_num(&r, "tops", ops / 1e12);
                row_num(&r, "gops_per_core", ops / 1e9 / T);
            } else {
                row_num(&r, "gflops", ops / 1e9);
                row_num(&r, "tflops", ops / 1e12);
                row_num(&r, "gflops_per_core", ops / 1e9 / T);
            }
            row_end(&r, o);
        }
        bench_row r;
        row_begin(&r, "peak", "avx2", T);
        row_str(&r, "case", "read-bw");
        row_num(&r, "mb", (double)bw_bytes / (1 << 20));
        double bw = nv_mem_read_bw(bw_bytes, T, o->quick ? 1 : 5);
        if (bw <= 0) row_fail(&r, "out of memory");
        else row_num(&r, "gb_per_s", bw / 1e9);
        row_end(&r, o);
    }
    return 0;
}

/* ---------------------------------------------------------------- cache */

typedef struct {
    nv_plan **p;
    int count, passes, m;
    const float *x;
    float *y;
} cycle_ctx;

static void cycle_run(void *v) {
    cycle_ctx *c = v;
    for (int r = 0; r < c->passes; r++)
        for (int i = 0; i < c->count; i++) nv_plan_run(c->p[i], c->x, c->m, c->y);
}

int bench_cache(int argc, char **argv, const bench_opts *o) {
    int m = 16;
    const int k = 768;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!(v = cli_value("bench cache", argc, argv, &i))) return 2;
        if (!strcmp(argv[i - 1], "--m")) { if (!cli_int("bench cache", "--m", v, 1, 4096, &m)) return 2; }
        else return cli_error("bench cache", 2, "unknown option '%s' (--m ROWS)", argv[i - 1]);
    }
    static const double full_mb[] = {0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512};
    static const double quick_mb[] = {0.1, 0.5};
    const double *sizes = o->quick ? quick_mb : full_mb;
    const int nsz = o->quick ? 2 : (int)(sizeof full_mb / sizeof full_mb[0]);
    if (!use_threads(o->threads)) return cli_error("bench cache", 1, "%s", nv_errmsg());
    nv_engine_id e = NV_ENGINE_AMX_BF16;
    if (o->engine && nv_engine_parse(o->engine, &e) != NV_OK) return cli_error("bench cache", 2, "%s", nv_errmsg());
    if (!o->engine && !nv_engine_available(NV_ENGINE_AMX_BF16)) e = nv_engine_best_float();
    if (e == NV_ENGINE_SCALAR)
        return cli_error("bench cache", 2, "the scalar engine reads the caller's weights in place: no working set to grow");
    int tl[2], nt = bench_thread_list(o, tl);
    const int nmax = 1024;
    float *w = bench_rand((size_t)nmax * k, sqrtf(3.0f / k), 5), *x = bench_rand((size_t)m * k, 1.0f, 6);
    float *y = malloc((size_t)m * nmax * sizeof(float));
    if (!w || !x || !y) {
        free(w), free(x), free(y);
        return cli_error("bench cache", 1, "out of memory");
    }
    for (int ti = 0; ti < nt; ti++) {
        const int T = tl[ti];
        if (!use_threads(T)) return cli_error("bench cache", 1, "%s", nv_errmsg());
        for (int si = 0; si < nsz; si++) {
            const double want = sizes[si] * (1 << 20);
            bench_row r;
            row_begin(&r, "cache", nv_engine_name((nv_engine_id)e), T);
            row_int(&r, "m", m);
            row_int(&r, "k", k);
            if (!nv_engine_available((nv_engine_id)e)) {
                row_num(&r, "target_mb", sizes[si]);
                row_engine_off(&r, e);
                row_end(&r, o);
                continue;
            }
            /* one plan's weight bytes per output on this engine, from a probe plan */
            nv_plan *probe = NULL;
            if (nv_plan_build(&probe, (nv_engine_id)e, w, 64, k) != NV_OK) return cli_error("bench cache", 1, "%s", nv_errmsg());
            double per_out = (double)nv_plan_packed_bytes(probe) / 64;
            nv_plan_free(probe);
            /* up to nmax outputs: one plan; beyond, at least 8 plans, so the sizes step finely */
            int n_total = (int)(want / per_out), n = n_total, count = 1;
            if (n_total > nmax) {
                count = (n_total + nmax / 2) / nmax;
                if (count < 8) count = 8;
                n = n_total / count;
            }
            n = n < 32 ? 32 : n / 32 * 32;
            nv_plan **plans = calloc((size_t)count, sizeof *plans);
            int built = 0;
            for (; plans && built < count; built++)
                if (nv_plan_build(&plans[built], (nv_engine_id)e, w, n, k) != NV_OK) break;
            if (built < count) {
                for (int i = 0; i < built; i++) nv_plan_free(plans[i]);
                free(plans);
                row_num(&r, "target_mb", sizes[si]);
                row_fail(&r, "out of memory building the plans");
                row_end(&r, o);
                continue;
            }
            size_t bytes = 0;
            for (int i = 0; i < count; i++) bytes += nv_plan_packed_bytes(plans[i]);
            cycle_ctx c = {plans, count, 1, m, x, y};
            /* group passes so one timed call lasts at least about 2 ms */
            double t0 = nv_now();
            cycle_run(&c);
            double one = nv_now() - t0;
            if (!o->quick && one < 2e-3) c.passes = (int)(2e-3 / (one > 1e-7 ? one : 1e-7)) + 1;
            int reps = 0;
            double s = bench_median(cycle_run, &c, o->quick ? 1 : 5, o->quick ? 0.0 : 0.25, &reps);
            double per_pass = s / c.passes;
            row_int(&r, "n", n);
            row_int(&r, "plans", count);
            row_num(&r, "mb", (double)bytes / (1 << 20));
            row_num(&r, "gflops", 2.0 * m * n * k * count / per_pass / 1e9);
            row_num(&r, "weight_gb_per_s", (double)bytes / per_pass / 1e9);
            row_end(&r, o);
            for (int i = 0; i < count; i++) nv_plan_free(plans[i]);
            free(plans);
        }
    }
    free(w);
    free(x);
    free(y);
    return 0;
}

/* ---------------------------------------------------------------- chain */

typedef struct {
    nv_plan **p;
    int len, m;
    const float *x;
    float *a, *b;
} chain_ctx;

/* len plans back to back, each reading the previous one's output (x -> a -> b -> a ...): every
 * call starts from the same activations x, which are never overwritten. */
static void chain_run(void *v) {
    chain_ctx *c = v;
    const float *in = c->x;
    for (int i = 0; i < c->len; i++) {
        float *out = i & 1 ? c->b : c->a;
        nv_plan_run(c->p[i], in, c->m, out);
        in = out;
    }
}

int bench_chain(int argc, char **argv, const bench_opts *o) {
    int m = o->quick ? 16 : 256, d = 768, maxlen = o->quick ? 4 : 64;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!(v = cli_value("bench chain", argc, argv, &i))) return 2;
        if (!strcmp(argv[i - 1], "--m")) { if (!cli_int("bench chain", "--m", v, 1, 4096, &m)) return 2; }
        else if (!strcmp(argv[i - 1], "--max")) { if (!cli_int("bench chain", "--max", v, 1, 1024, &maxlen)) return 2; }
        else return cli_error("bench chain", 2, "unknown option '%s' (--m ROWS, --max PLANS)", argv[i - 1]);
    }
    if (o->quick) d = 128;
    if (!use_threads(o->threads)) return cli_error("bench chain", 1, "%s", nv_errmsg());
    int tl[2], nt = bench_thread_list(o, tl);
    int engines[NV_ENGINE_COUNT], ne = 0;
    for (int e = 0; e < NV_ENGINE_COUNT; e++)
        if (bench_engine_wanted(o, e)) engines[ne++] = e;
    float *w = bench_rand((size_t)d * d, sqrtf(3.0f / d), 9), *x = bench_rand((size_t)m * d, 1.0f, 10);
    float *a = malloc((size_t)m * d * sizeof(float)), *b = malloc((size_t)m * d * sizeof(float));
    nv_plan **plans = calloc((size_t)maxlen, sizeof *plans);
    if (!w || !x || !a || !b || !plans) return cli_error("bench chain", 1, "out of memory");
    for (int ei = 0; ei < ne; ei++) {
        const int e = engines[ei];
        int built = 0;
        if (nv_engine_available((nv_engine_id)e))
            for (; built < maxlen; built++) /* distinct packed copies, as distinct layers would have */
                if (nv_plan_build(&plans[built], (nv_engine_id)e, w, d, d) != NV_OK) break;
        for (int ti = 0; ti < nt; ti++) {
            const int T = tl[ti];
            if (!use_threads(T)) return cli_error("bench chain", 1, "%s", nv_errmsg());
            double single = 0;
            for (int len = 1; len <= maxlen; len *= 2) {
                bench_row r;
                row_begin(&r, "chain", nv_engine_name((nv_engine_id)e), T);
                row_int(&r, "ops", len);
                row_shape(&r, m, d, d);
                if (!nv_engine_available((nv_engine_id)e) || built < maxlen) {
                    if (!nv_engine_available((nv_engine_id)e)) row_engine_off(&r, e);
                    else row_fail(&r, "out of memory building the plans");
                    row_end(&r, o);
                    continue;
                }
                chain_ctx c = {plans, len, m, x, a, b};
                int reps = 0;
                double s = bench_median(chain_run, &c, o->quick ? 1 : 5, o->quick ? 0.0 : 0.3, &reps);
                double gf = 2.0 * m * d * d * len / s / 1e9;
                if (len == 1) single = gf;
                row_num(&r, "gflops", gf);
                row_num(&r, "us_per_op", s * 1e6 / len);
                row_num(&r, "frac", single > 0 ? gf / single : NAN);
                row_end(&r, o);
            }
        }
        for (int i = 0; i < built; i++) nv_plan_free(plans[i]);
    }
    free(plans);
    free(w);
    free(x);
    free(a);
    free(b);
    return 0;
}
