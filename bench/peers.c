/* nerve-peer: the matmul peers `nerve bench matmul` measures against, in a separate program so
 * that the nerve binary never links OpenBLAS or oneDNN. Built by `make bench-peers` (after
 * `scripts/deps.sh --bench`) into build/peers/nerve-peer, with whichever of the two libraries is
 * installed (HAVE_OPENBLAS, HAVE_DNNL).
 *
 *   nerve-peer PEER THREADS MIN_REPS MIN_SECONDS M,N,K [M,N,K ...]
 *     PEER: openblas      cblas_sgemm (fp32), as installed: OPENBLAS_CORETYPE is never set, the
 *                         core OpenBLAS picked is reported
 *           onednn        oneDNN bf16 matmul: weights reordered once (outside the timed loop)
 *                         into the layout the primitive asks for (format_tag any); the fp32
 *                         activations are converted to bf16 by a reorder INSIDE the timed loop,
 *                         as nerve's amx-bf16 plan converts them inside every call; fp32 output
 *           onednn-fp32   oneDNN fp32 matmul with prepacked weights (the like-for-like peer of
 *                         nerve's fp32 engines)
 *           onednn-int8   oneDNN int8 matmul (s8 activations x s8 weights, int32 sums, fp32
 *                         output scaled per output channel): weights quantised per output channel
 *                         and reordered once outside the timed loop; the fp32 activations
 *                         quantised to s8 by a reorder INSIDE it, with one scale found beforehand
 *                         (oneDNN 2.x has no per-row dynamic quantisation; nerve's int8 plans find
 *                         each row's scale in every call, a pass oneDNN is spared)
 *
 * Every shape computes y[M x N] = x[M x K] . W^T with W N x K row-major (nerve's plan layout).
 * One JSON object per shape on stdout: {"peer","m","n","k","threads","ok":true,"gflops",
 * "ms","reps","impl",...} or {"ok":false,"why"}. Timing: one warm-up call, then calls until at
 * least MIN_REPS were made and MIN_SECONDS passed (at most 1000); the figure is the median.
 *
 * Threads: OpenBLAS (Debian's pthread build) through openblas_set_num_threads; Debian's oneDNN is
 * built on OpenMP (libgomp), which reads OMP_NUM_THREADS when it loads, so the program re-executes
 * itself once with OMP_NUM_THREADS=THREADS when that is not already the environment. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef HAVE_OPENBLAS
#include <cblas.h>
#endif
#ifdef HAVE_DNNL
#include <dnnl.h>
#endif

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void json_str(const char *key, const char *v) {
    printf(",\"%s\":\"", key);
    for (const char *p = v ? v : ""; *p; p++) {
        if (*p == '"' || *p == '\\') printf("\\%c", *p);
        else if ((unsigned char)*p < 0x20) putchar(' ');
        else putchar(*p);
    }
    putchar('"');
}

static void begin(const char *peer, int m, int n, int k, int threads) {
    printf("{\"peer\":\"%s\",\"m\":%d,\"n\":%d,\"k\":%d,\"threads\":%d", peer, m, n, k, threads);
}

static void fail(const char *why) {
    printf(",\"ok\":false");
    json_str("why", why);
    printf("}\n");
    fflush(stdout);
}

static float *rand_buf(size_t count, uint64_t seed) {
    float *v = malloc(count * sizeof(float) + 64);
    if (!v) return NULL;
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < count; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        v[i] = (float)((double)(s >> 40) / (double)(1 << 24) - 0.5);
    }
    return v;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Times fn(ctx) as described at the top; returns the median seconds and the count. */
static double time_median(void (*fn)(void *), void *ctx, int min_reps, double min_s, int *reps) {
    static double t[1000];
    fn(ctx); /* warm-up */
    int n = 0;
    double start = now();
    while (n < 1000 && (n < min_reps || now() - start < min_s)) {
        double t0 = now();
        fn(ctx);
        t[n++] = now() - t0;
    }
    qsort(t, (size_t)n, sizeof t[0], cmp_double);
    *reps = n;
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

#ifdef HAVE_OPENBLAS
typedef struct {
    int m, n, k;
    const float *x, *w;
    float *y;
} blas_ctx;

static void blas_call(void *v) {
    blas_ctx *c = v;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c->m, c->n, c->k, 1.0f, c->x, c->k, c->w, c->k, 0.0f, c->y, c->n);
}

static void run_openblas(int m, int n, int k, int threads, int min_reps, double min_s) {
    begin("openblas", m, n, k, threads);
    openblas_set_num_threads(threads);
    blas_ctx c = {m, n, k, rand_buf((size_t)m * k, 1), rand_buf((size_t)n * k, 2), malloc((size_t)m * n * sizeof(float))};
    if (!c.x || !c.w || !c.y) {
        fail("out of memory");
    } else {
        int reps = 0;
        double s = time_median(blas_call, &c, min_reps, min_s, &reps);
        printf(",\"ok\":true,\"gflops\":%.6g,\"ms\":%.6g,\"reps\":%d", 2.0 * m * n * k / s / 1e9, s * 1e3, reps);
        json_str("impl", openblas_get_corename());
        json_str("config", openblas_get_config());
        printf(",\"blas_threads\":%d}\n", openblas_get_num_threads());
        fflush(stdout);
    }
    free((void *)c.x);
    free((void *)c.w);
    free(c.y);
}
#endif

#ifdef HAVE_DNNL
typedef struct {
    dnnl_stream_t stream;
    dnnl_primitive_t mm, src_reorder; /* src_reorder: fp32 -> bf16 or s8 (NULL for fp32) */
    dnnl_memory_t src_f32, src, wei, dst;
} dnnl_ctx;

static void dnnl_call(void *v) {
    dnnl_ctx *c = v;
    if (c->src_reorder) {
        dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, c->src_f32}, {DNNL_ARG_TO, c->src}};
        dnnl_primitive_execute(c->src_reorder, c->stream, 2, ra);
    }
    dnnl_exec_arg_t a[3] = {{DNNL_ARG_SRC, c->src}, {DNNL_ARG_WEIGHTS, c->wei}, {DNNL_ARG_DST, c->dst}};
    dnnl_primitive_execute(c->mm, c->stream, 3, a);
    dnnl_stream_wait(c->stream);
}

static const char *isa_name(dnnl_cpu_isa_t isa) {
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
    }
}

#define DNNL_TRY(call, what)                                                                                           \
    do {                                                                                                               \
        dnnl_status_t st_ = (call);                                                                                    \
        if (st_ != dnnl_success) {                                                                                     \
            snprintf(why, sizeof why, "%s failed (dnnl status %d%s%s)", what, (int)st_,                                \
                     st_ == dnnl_unimplemented ? ": unimplemented for this CPU, whose best oneDNN ISA is " : "",       \
                     st_ == dnnl_unimplemented ? isa_name(dnnl_get_effective_cpu_isa()) : "");                         \
            goto out;                                                                                                  \
        }                                                                                                              \
    } while (0)

/* The oneDNN peers: fp32, bf16 or int8 operands. */
typedef enum { DNNL_FP32, DNNL_BF16, DNNL_INT8 } dnnl_kind;

static float max_abs(const float *v, size_t count) {
    float a = 0.0f;
    for (size_t i = 0; i < count; i++) a = v[i] > a ? v[i] : -v[i] > a ? -v[i] : a;
    return a;
}

static void run_onednn(dnnl_kind kind, int m, int n, int k, int threads, int min_reps, double min_s) {
    const char *peer = kind == DNNL_BF16 ? "onednn" : kind == DNNL_INT8 ? "onednn-int8" : "onednn-fp32";
    begin(peer, m, n, k, threads);
    char why[256] = "";
    dnnl_engine_t eng = NULL;
    dnnl_ctx c = {0};
    dnnl_primitive_desc_t pd = NULL, rpd = NULL, wpd = NULL;
    dnnl_primitive_t wre = NULL;
    dnnl_memory_t wuser = NULL;
    dnnl_primitive_attr_t mm_attr = NULL, x_attr = NULL;
    float *x = rand_buf((size_t)m * k, 1), *w = rand_buf((size_t)n * k, 2);
    float *wq = malloc(sizeof(float) * n), *yq = malloc(sizeof(float) * n); /* int8: per-channel scales */
    int8_t *w8 = kind == DNNL_INT8 ? malloc((size_t)n * k) : NULL; /* int8: the quantised weights */
    const dnnl_data_type_t dt = kind == DNNL_BF16 ? dnnl_bf16 : kind == DNNL_INT8 ? dnnl_s8 : dnnl_f32;
    const int lowp = kind != DNNL_FP32;
    if (!x || !w || !wq || !yq || (kind == DNNL_INT8 && !w8)) {
        snprintf(why, sizeof why, "out of memory");
        goto out;
    }
    if (kind == DNNL_INT8) { /* scales as nerve's: 127 / max|.| per weight row, one for x */
        const float xq = 127.0f / max_abs(x, (size_t)m * k);
        for (int j = 0; j < n; j++) { /* quantised here: oneDNN 2.6 reorders s8 weights but not with per-channel scales */
            wq[j] = 127.0f / max_abs(w + (size_t)j * k, (size_t)k);
            yq[j] = 1.0f / (xq * wq[j]);
            for (int kk = 0; kk < k; kk++) {
                const float v = w[(size_t)j * k + kk] * wq[j];
                w8[(size_t)j * k + kk] = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : (int)(v < 0 ? v - 0.5f : v + 0.5f));
            }
        }
        DNNL_TRY(dnnl_primitive_attr_create(&mm_attr), "attr");
        DNNL_TRY(dnnl_primitive_attr_set_output_scales(mm_attr, n, 1 << 1, yq), "matmul output scales");
        DNNL_TRY(dnnl_primitive_attr_create(&x_attr), "attr");
        DNNL_TRY(dnnl_primitive_attr_set_output_scales(x_attr, 1, 0, &xq), "activation scale");
    }
    DNNL_TRY(dnnl_engine_create(&eng, dnnl_cpu, 0), "dnnl_engine_create");
    DNNL_TRY(dnnl_stream_create(&c.stream, eng, dnnl_stream_default_flags), "dnnl_stream_create");
    dnnl_dims_t sdims = {m, k}, wdims = {k, n}, ddims = {m, n};
    dnnl_memory_desc_t src_md, src_f32_md, wei_any, wei_user_md, dst_md;
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&src_md, 2, sdims, dt, dnnl_ab), "src desc");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&src_f32_md, 2, sdims, dnnl_f32, dnnl_ab), "src desc");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&wei_any, 2, wdims, dt, dnnl_format_tag_any), "weights desc");
    /* W is n x k row-major: the k x n weights in "ba" (transposed) order */
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&wei_user_md, 2, wdims, kind == DNNL_INT8 ? dnnl_s8 : dnnl_f32, dnnl_ba), "weights desc");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&dst_md, 2, ddims, dnnl_f32, dnnl_ab), "dst desc");
    dnnl_matmul_desc_t md;
    DNNL_TRY(dnnl_matmul_desc_init(&md, &src_md, &wei_any, NULL, &dst_md), "dnnl_matmul_desc_init");
    DNNL_TRY(dnnl_primitive_desc_create(&pd, &md, mm_attr, eng, NULL), "matmul primitive descriptor");
    const char *impl = NULL;
    DNNL_TRY(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl), "impl query");
    const dnnl_memory_desc_t *wei_md = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    DNNL_TRY(dnnl_primitive_create(&c.mm, pd), "matmul primitive");
    /* weights: reorder once into the primitive's layout (prepacked), outside the timed loop */
    DNNL_TRY(dnnl_memory_create(&wuser, &wei_user_md, eng, w8 ? (void *)w8 : (void *)w), "weights memory");
    DNNL_TRY(dnnl_memory_create(&c.wei, wei_md, eng, DNNL_MEMORY_ALLOCATE), "packed weights memory");
    DNNL_TRY(dnnl_reorder_primitive_desc_create(&wpd, &wei_user_md, eng, wei_md, eng, NULL), "weights reorder");
    DNNL_TRY(dnnl_primitive_create(&wre, wpd), "weights reorder");
    dnnl_exec_arg_t wa[2] = {{DNNL_ARG_FROM, wuser}, {DNNL_ARG_TO, c.wei}};
    DNNL_TRY(dnnl_primitive_execute(wre, c.stream, 2, wa), "weights reorder");
    DNNL_TRY(dnnl_stream_wait(c.stream), "weights reorder");
    if (lowp) {
        DNNL_TRY(dnnl_memory_create(&c.src_f32, &src_f32_md, eng, x), "src memory");
        DNNL_TRY(dnnl_memory_create(&c.src, &src_md, eng, DNNL_MEMORY_ALLOCATE), "bf16/s8 src memory");
        DNNL_TRY(dnnl_reorder_primitive_desc_create(&rpd, &src_f32_md, eng, &src_md, eng, x_attr), "src reorder");
        DNNL_TRY(dnnl_primitive_create(&c.src_reorder, rpd), "src reorder");
    } else {
        DNNL_TRY(dnnl_memory_create(&c.src, &src_md, eng, x), "src memory");
    }
    DNNL_TRY(dnnl_memory_create(&c.dst, &dst_md, eng, DNNL_MEMORY_ALLOCATE), "dst memory");
    int reps = 0;
    double s = time_median(dnnl_call, &c, min_reps, min_s, &reps);
    printf(",\"ok\":true,\"gflops\":%.6g,\"ms\":%.6g,\"reps\":%d", 2.0 * m * n * k / s / 1e9, s * 1e3, reps);
    json_str("impl", impl);
    json_str("isa", isa_name(dnnl_get_effective_cpu_isa()));
    const dnnl_version_t *v = dnnl_version();
    char ver[64];
    snprintf(ver, sizeof ver, "%d.%d.%d", v->major, v->minor, v->patch);
    json_str("version", ver);
    json_str("runtime", v->cpu_runtime == DNNL_RUNTIME_OMP ? "openmp" : v->cpu_runtime == DNNL_RUNTIME_TBB ? "tbb" : "other");
    json_str("src_conversion", kind == DNNL_BF16   ? "fp32->bf16 reorder inside the timed loop"
                               : kind == DNNL_INT8 ? "fp32->s8 reorder (one scale found beforehand) inside the timed loop"
                                                   : "none (fp32)");
    printf("}\n");
    fflush(stdout);
out:
    if (why[0]) fail(why);
    if (wre) dnnl_primitive_destroy(wre);
    if (c.src_reorder) dnnl_primitive_destroy(c.src_reorder);
    if (c.mm) dnnl_primitive_destroy(c.mm);
    if (wpd) dnnl_primitive_desc_destroy(wpd);
    if (rpd) dnnl_primitive_desc_destroy(rpd);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (wuser) dnnl_memory_destroy(wuser);
    if (c.wei) dnnl_memory_destroy(c.wei);
    if (c.src) dnnl_memory_destroy(c.src);
    if (c.src_f32) dnnl_memory_destroy(c.src_f32);
    if (c.dst) dnnl_memory_destroy(c.dst);
    if (c.stream) dnnl_stream_destroy(c.stream);
    if (eng) dnnl_engine_destroy(eng);
    if (mm_attr) dnnl_primitive_attr_destroy(mm_attr);
    if (x_attr) dnnl_primitive_attr_destroy(x_attr);
    free(x);
    free(w);
    free(wq);
    free(yq);
    free(w8);
}
#endif

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: nerve-peer openblas|onednn|onednn-fp32|onednn-int8 THREADS MIN_REPS MIN_SECONDS M,N,K [M,N,K ...]\n");
        return 2;
    }
    const char *peer = argv[1];
    int threads = atoi(argv[2]), min_reps = atoi(argv[3]);
    double min_s = atof(argv[4]);
    if (threads < 1 || threads > 1024 || min_reps < 1 || min_s < 0) {
        fprintf(stderr, "nerve-peer: bad THREADS, MIN_REPS or MIN_SECONDS\n");
        return 2;
    }
    /* OpenMP reads OMP_NUM_THREADS once, when libgomp loads: set it and start again */
    const char *omp = getenv("OMP_NUM_THREADS");
    if (!omp || atoi(omp) != threads) {
        char v[16];
        snprintf(v, sizeof v, "%d", threads);
        setenv("OMP_NUM_THREADS", v, 1);
        execv("/proc/self/exe", argv);
        fprintf(stderr, "nerve-peer: cannot re-execute itself: %s\n", strerror(errno));
        return 1;
    }
    int known = !strcmp(peer, "openblas") || !strcmp(peer, "onednn") || !strcmp(peer, "onednn-fp32") || !strcmp(peer, "onednn-int8");
    if (!known) {
        fprintf(stderr, "nerve-peer: unknown peer '%s'\n", peer);
        return 2;
    }
    for (int i = 5; i < argc; i++) {
        int m, n, k;
        if (sscanf(argv[i], "%d,%d,%d", &m, &n, &k) != 3 || m < 1 || n < 1 || k < 1 || m > 65536 || n > 1 << 20 ||
            k > 65536) {
            fprintf(stderr, "nerve-peer: bad shape '%s' (M,N,K)\n", argv[i]);
            return 2;
        }
        if (!strcmp(peer, "openblas")) {
#ifdef HAVE_OPENBLAS
            run_openblas(m, n, k, threads, min_reps, min_s);
#else
            begin(peer, m, n, k, threads);
            fail("nerve-peer was built without OpenBLAS (run scripts/deps.sh --bench && make bench-peers)");
#endif
        } else {
#ifdef HAVE_DNNL
            run_onednn(!strcmp(peer, "onednn") ? DNNL_BF16 : !strcmp(peer, "onednn-int8") ? DNNL_INT8 : DNNL_FP32, m, n, k,
                       threads, min_reps, min_s);
#else
            begin(peer, m, n, k, threads);
            fail("nerve-peer was built without oneDNN (run scripts/deps.sh --bench && make bench-peers)");
#endif
        }
    }
    return 0;
}
