/* Peak loops and the read-bandwidth probe (see peak.h). The file is compiled for the project's
 * baseline (x86-64-v3); the AVX-512 and AMX loops sit in GCC target regions of their own and are
 * called only after nv_peak_available() found their engine on (probed, self-tested, not emulated). */
#include "engine/peak.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timer.h"
#include "engine/engine.h"
#include "engine/kern.h"

static const nv_engine_id unit_engine[NV_PEAK_COUNT] = {NV_ENGINE_AMX_BF16,    NV_ENGINE_AMX_INT8, NV_ENGINE_AVX512_INT8,
                                                        NV_ENGINE_AVX512_BF16, NV_ENGINE_AVX512,   NV_ENGINE_AVX2};
static const char *const unit_instr[NV_PEAK_COUNT] = {"tdpbf16ps",     "tdpbssd",         "vpdpbusd zmm",
                                                      "vdpbf16ps zmm", "vfmadd231ps zmm", "vfmadd231ps ymm"};
/* ops per loop iteration */
static const double unit_ops[NV_PEAK_COUNT] = {4.0 * 16 * 16 * 32 * 2, 4.0 * 16 * 16 * 64 * 2, 16.0 * 16 * 4 * 2,
                                               16.0 * 16 * 2 * 2,      16.0 * 16 * 2,           12.0 * 8 * 2};

nv_peak_unit nv_peak_unit_of(int engine) {
    for (int u = 0; u < NV_PEAK_COUNT; u++)
        if ((int)unit_engine[u] == engine) return (nv_peak_unit)u;
    return NV_PEAK_COUNT;
}

const char *nv_peak_engine(nv_peak_unit u) { return (unsigned)u < NV_PEAK_COUNT ? nv_engine_name(unit_engine[u]) : "?"; }
const char *nv_peak_instr(nv_peak_unit u) { return (unsigned)u < NV_PEAK_COUNT ? unit_instr[u] : "?"; }
int nv_peak_is_int(nv_peak_unit u) { return u == NV_PEAK_AMX_INT8 || u == NV_PEAK_AVX512_INT8; }

int nv_peak_available(nv_peak_unit u, char *why, size_t cap) {
    if ((unsigned)u >= NV_PEAK_COUNT) {
        snprintf(why, cap, "unknown unit");
        return 0;
    }
    nv_engine_id e = unit_engine[u];
    if (!nv_engine_available(e)) {
        snprintf(why, cap, "engine %s is off: %s", nv_engine_name(e), nv_engine_why_off(e));
        return 0;
    }
    if (e >= NV_ENGINE_AVX512 && nv_engines_emulated()) {
        snprintf(why, cap, "engine %s is emulated (test mode): no hardware to measure", nv_engine_name(e));
        return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------- the loops */

static double loop_avx2(long iters) {
    const __m256 mul = _mm256_set1_ps(0.999999f), add = _mm256_set1_ps(1e-3f);
    __m256 a0 = _mm256_set1_ps(0.0f), a1 = _mm256_set1_ps(0.1f), a2 = _mm256_set1_ps(0.2f), a3 = _mm256_set1_ps(0.3f),
           a4 = _mm256_set1_ps(0.4f), a5 = _mm256_set1_ps(0.5f), a6 = _mm256_set1_ps(0.6f), a7 = _mm256_set1_ps(0.7f),
           a8 = _mm256_set1_ps(0.8f), a9 = _mm256_set1_ps(0.9f), a10 = _mm256_set1_ps(1.0f), a11 = _mm256_set1_ps(1.1f);
    for (long i = 0; i < iters; i++) {
        a0 = _mm256_fmadd_ps(a0, mul, add);
        a1 = _mm256_fmadd_ps(a1, mul, add);
        a2 = _mm256_fmadd_ps(a2, mul, add);
        a3 = _mm256_fmadd_ps(a3, mul, add);
        a4 = _mm256_fmadd_ps(a4, mul, add);
        a5 = _mm256_fmadd_ps(a5, mul, add);
        a6 = _mm256_fmadd_ps(a6, mul, add);
        a7 = _mm256_fmadd_ps(a7, mul, add);
        a8 = _mm256_fmadd_ps(a8, mul, add);
        a9 = _mm256_fmadd_ps(a9, mul, add);
        a10 = _mm256_fmadd_ps(a10, mul, add);
        a11 = _mm256_fmadd_ps(a11, mul, add);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    float lanes[8];
    _mm256_storeu_ps(lanes, s);
    return lanes[0];
}

/* stmt once for each of j = 0..15, spelled out so the 16 accumulators stay in registers */
#define CHAINS16(stmt)                                                                                                 \
    do {                                                                                                               \
        _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++) { stmt; }                                                \
    } while (0)

#pragma GCC push_options
#pragma GCC target("avx512f")
static double loop_avx512(long iters) {
    const __m512 mul = _mm512_set1_ps(0.999999f), add = _mm512_set1_ps(1e-3f);
    __m512 a[16];
    for (int j = 0; j < 16; j++) a[j] = _mm512_set1_ps(0.1f * (float)j);
    /* 16 independent chains, unrolled so the accumulators stay in registers */
    for (long i = 0; i < iters; i++) CHAINS16(a[j] = _mm512_fmadd_ps(a[j], mul, add));
    __m512 s = a[0];
    for (int j = 1; j < 16; j++) s = _mm512_add_ps(s, a[j]);
    return _mm512_reduce_add_ps(s);
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512bf16")
/* 16 independent chains of vdpbf16ps on registers (the values do not change the unit's speed). */
static double loop_avx512_bf16(long iters) {
    const __m512i b = _mm512_set1_epi32(0x3f803f80); /* two bf16 ones */
    const __m512bh one = (__m512bh)b;
    __m512 a[16];
    for (int j = 0; j < 16; j++) a[j] = _mm512_set1_ps(0.1f * (float)j);
    for (long i = 0; i < iters; i++) CHAINS16(a[j] = _mm512_dpbf16_ps(a[j], one, one));
    __m512 s = a[0];
    for (int j = 1; j < 16; j++) s = _mm512_add_ps(s, a[j]);
    return _mm512_reduce_add_ps(s);
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vnni")
/* 16 independent chains of vpdpbusd on registers. */
static double loop_avx512_int8(long iters) {
    const __m512i b = _mm512_set1_epi8(1);
    __m512i a[16];
    for (int j = 0; j < 16; j++) a[j] = _mm512_set1_epi32(j);
    for (long i = 0; i < iters; i++) CHAINS16(a[j] = _mm512_dpbusd_epi32(a[j], b, b));
    __m512i s = a[0];
    for (int j = 1; j < 16; j++) s = _mm512_add_epi32(s, a[j]);
    return (double)_mm512_reduce_add_epi32(s);
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,amx-int8")
static void amx_configure(void) {
    nv_amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    __asm__ volatile("ldtilecfg %0" ::"m"(cfg)); /* the whole 64 bytes as operand (see kern_amx.c) */
}

/* Tiles 0..3 accumulate, 4 and 5 are A, 6 and 7 are B; all zero (the unit's speed does not depend
 * on the values). The result is stored so the loop has an observable effect. */
static double loop_amx(long iters, int int8) {
    amx_configure();
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    if (int8) {
        for (long i = 0; i < iters; i++) {
            _tile_dpbssd(0, 4, 6);
            _tile_dpbssd(1, 4, 7);
            _tile_dpbssd(2, 5, 6);
            _tile_dpbssd(3, 5, 7);
        }
    } else {
        for (long i = 0; i < iters; i++) {
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    float out[256] __attribute__((aligned(64)));
    __asm__ volatile("" ::: "memory");
    _tile_stored(0, out, 64);
    _tile_release();
    return out[0];
}
#pragma GCC pop_options

static double run_loop(nv_peak_unit u, long iters) {
    switch (u) {
    case NV_PEAK_AMX_BF16: return loop_amx(iters, 0);
    case NV_PEAK_AMX_INT8: return loop_amx(iters, 1);
    case NV_PEAK_AVX512_INT8: return loop_avx512_int8(iters);
    case NV_PEAK_AVX512_BF16: return loop_avx512_bf16(iters);
    case NV_PEAK_AVX512: return loop_avx512(iters);
    default: return loop_avx2(iters);
    }
}

/* ---------------------------------------------------------------- threads */

typedef struct {
    atomic_int *go; /* 1: start, -1: give up (a thread could not be started) */
    nv_peak_unit u;
    long iters;
    double t0, t1, sink;
} peak_arg;

static void *peak_thread(void *v) {
    peak_arg *a = v;
    int g;
    while ((g = atomic_load(a->go)) == 0) __builtin_ia32_pause();
    if (g < 0) return NULL;
    a->t0 = nv_now();
    a->sink = run_loop(a->u, a->iters);
    a->t1 = nv_now();
    return NULL;
}

static volatile double peak_sink;

double nv_peak_run(nv_peak_unit u, int threads, double seconds) {
    char why[256];
    if (!nv_peak_available(u, why, sizeof why) || threads < 1) return -1.0;
    /* calibrate on this thread: double the count until a run takes a tenth of the time asked */
    long iters = 1024;
    double t = 0;
    for (;;) {
        double t0 = nv_now();
        peak_sink = run_loop(u, iters);
        t = nv_now() - t0;
        if (t >= seconds * 0.1 || iters > (1L << 40)) break;
        iters *= 2;
    }
    if (t > 0) iters = (long)((double)iters * seconds / t) + 1;
    peak_arg *args = calloc((size_t)threads, sizeof *args);
    pthread_t *tid = calloc((size_t)threads, sizeof *tid);
    atomic_int go = 0;
    if (!args || !tid) {
        free(args);
        free(tid);
        return -1.0;
    }
    int started = 0;
    for (int i = 0; i < threads; i++) {
        args[i] = (peak_arg){.go = &go, .u = u, .iters = iters};
        if (pthread_create(&tid[i], NULL, peak_thread, &args[i]) != 0) break;
        started++;
    }
    atomic_store(&go, started == threads ? 1 : -1);
    for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
    double result = -1.0;
    if (started == threads) {
        double first = args[0].t0, last = args[0].t1;
        for (int i = 1; i < threads; i++) {
            if (args[i].t0 < first) first = args[i].t0;
            if (args[i].t1 > last) last = args[i].t1;
            peak_sink += args[i].sink;
        }
        if (last > first) result = unit_ops[u] * (double)iters * threads / (last - first);
    }
    free(args);
    free(tid);
    return result;
}

/* ---------------------------------------------------------------- read bandwidth */

typedef struct {
    const float *p;
    size_t count; /* floats, a multiple of 32 */
    int touch;
    double sum;
} bw_arg;

static void *bw_thread(void *v) {
    bw_arg *a = v;
    if (a->touch) {
        float *w = (float *)a->p;
        for (size_t i = 0; i < a->count; i++) w[i] = (float)(i & 1023) * 1e-3f;
        return NULL;
    }
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < a->count; i += 32) {
        s0 = _mm256_add_ps(s0, _mm256_load_ps(a->p + i));
        s1 = _mm256_add_ps(s1, _mm256_load_ps(a->p + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_load_ps(a->p + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_load_ps(a->p + i + 24));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    a->sum = lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
    return NULL;
}

static int bw_pass(const float *buf, size_t count, int threads, int touch, double *sum) {
    bw_arg args[256];
    pthread_t tid[256];
    if (threads > 256) threads = 256;
    size_t chunks = count / 32;
    int started = 0;
    for (int i = 0; i < threads; i++) {
        size_t c0 = chunks * (size_t)i / (size_t)threads, c1 = chunks * (size_t)(i + 1) / (size_t)threads;
        args[i] = (bw_arg){.p = buf + c0 * 32, .count = (c1 - c0) * 32, .touch = touch};
        if (i > 0 && pthread_create(&tid[i], NULL, bw_thread, &args[i]) != 0) break;
        started++;
    }
    if (started > 0) bw_thread(&args[0]);
    for (int i = 1; i < started; i++) pthread_join(tid[i], NULL);
    for (int i = 0; i < started; i++) *sum += args[i].sum;
    return started == threads;
}

double nv_mem_read_bw(size_t bytes, int threads, int passes) {
    if (threads < 1) threads = 1;
    if (passes < 1) passes = 1;
    size_t count = bytes / sizeof(float) / 32 * 32;
    if (count == 0) count = 32;
    float *buf = aligned_alloc(64, count * sizeof(float));
    if (!buf) return -1.0;
    double sum = 0, best = -1.0;
    bw_pass(buf, count, threads, 1, &sum); /* first touch, split as the reads are */
    for (int p = 0; p < passes; p++) {
        double t0 = nv_now();
        if (!bw_pass(buf, count, threads, 0, &sum)) break;
        double t = nv_now() - t0;
        if (t > 0 && count * sizeof(float) / t > best) best = (double)(count * sizeof(float)) / t;
    }
    peak_sink += sum;
    free(buf);
    return best;
}
