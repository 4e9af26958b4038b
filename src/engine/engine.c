#include "engine/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

static const char *const engine_names[NV_ENGINE_COUNT] = {"scalar", "avx2", "avx512", "amx-bf16", "amx-int8"};

static int engines_ready;
static int engine_on[NV_ENGINE_COUNT];
static char engine_why[NV_ENGINE_COUNT][160];
static long plan_build_count;

struct nv_plan {
    nv_engine_id engine;
    int n, k;
    const float *w; /* scalar: the caller's weights, read in place */
};

const char *nv_engine_name(nv_engine_id e) { return (unsigned)e < NV_ENGINE_COUNT ? engine_names[e] : "?"; }

nv_err nv_engine_parse(const char *name, nv_engine_id *out) {
    for (int i = 0; i < NV_ENGINE_COUNT; i++)
        if (strcmp(name, engine_names[i]) == 0) {
            *out = (nv_engine_id)i;
            return NV_OK;
        }
    return nv_fail(NV_EINVAL, "unknown engine '%s' (known: scalar, avx2, avx512, amx-bf16, amx-int8)", name);
}

static void engine_latch(nv_engine_id e, const char *why) {
    engine_on[e] = 0;
    snprintf(engine_why[e], sizeof engine_why[e], "%s", why);
}

nv_err nv_engines_init(const char *allow, int threads) {
    (void)threads;
    if (engines_ready) return NV_OK;
    if (!allow) allow = getenv("NERVE_ENGINES");
    int allowed[NV_ENGINE_COUNT];
    for (int i = 0; i < NV_ENGINE_COUNT; i++) allowed[i] = !allow || !*allow;
    if (allow && *allow) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", allow);
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            nv_engine_id e = NV_ENGINE_SCALAR;
            NV_TRY(nv_engine_parse(tok, &e));
            allowed[e] = 1;
        }
    }
    engine_on[NV_ENGINE_SCALAR] = 1; /* the reference is always present, even when not allowed */
    for (int i = 1; i < NV_ENGINE_COUNT; i++) {
        if (!allowed[i]) engine_latch((nv_engine_id)i, "excluded by NERVE_ENGINES/--engine");
        else engine_latch((nv_engine_id)i, "not built in this version");
    }
    engines_ready = 1;
    return NV_OK;
}

int nv_engine_available(nv_engine_id e) { return (unsigned)e < NV_ENGINE_COUNT && engine_on[e]; }
const char *nv_engine_why_off(nv_engine_id e) { return (unsigned)e < NV_ENGINE_COUNT ? engine_why[e] : "?"; }

nv_engine_id nv_engine_next_down(nv_engine_id e) { return e == NV_ENGINE_SCALAR ? e : (nv_engine_id)(e - 1); }

nv_engine_id nv_engine_best(void) {
    for (int e = NV_ENGINE_COUNT - 1; e > 0; e--)
        if (engine_on[e]) return (nv_engine_id)e;
    return NV_ENGINE_SCALAR;
}

nv_err nv_plan_build(nv_plan **out, nv_engine_id want, const float *w, int n, int k) {
    if (n <= 0 || k <= 0) return nv_fail(NV_EINVAL, "plan: bad shape %d x %d", n, k);
    if (!engines_ready) NV_TRY(nv_engines_init(NULL, 0));
    nv_engine_id e = want;
    while (!nv_engine_available(e)) e = nv_engine_next_down(e);
    nv_plan *p = calloc(1, sizeof *p);
    if (!p) return nv_fail(NV_ENOMEM, "plan: out of memory");
    p->engine = e;
    p->n = n;
    p->k = k;
    p->w = w;
    plan_build_count++;
    *out = p;
    return NV_OK;
}

void nv_plan_refresh(nv_plan *p, const float *w) { p->w = w; }

/* Left-to-right fp32 sums, the exact arithmetic of llama2.c's matmul. */
static void scalar_run(const nv_plan *p, const float *x, int m, float *y) {
    const int n = p->n, k = p->k;
    for (int r = 0; r < m; r++) {
        const float *xr = x + (size_t)r * k;
        float *yr = y + (size_t)r * n;
        for (int i = 0; i < n; i++) {
            const float *wi = p->w + (size_t)i * k;
            float val = 0.0f;
            for (int j = 0; j < k; j++) val += wi[j] * xr[j];
            yr[i] = val;
        }
    }
}

void nv_plan_run(const nv_plan *p, const float *x, int m, float *y) { scalar_run(p, x, m, y); }
nv_engine_id nv_plan_engine(const nv_plan *p) { return p->engine; }
int nv_plan_n(const nv_plan *p) { return p->n; }
int nv_plan_k(const nv_plan *p) { return p->k; }
void nv_plan_free(nv_plan *p) { free(p); }
long nv_plan_builds(void) { return plan_build_count; }
