/* Engines and matmul plans.
 *
 * An engine is one way of computing a matrix product: scalar (fp32 reference, always present),
 * avx2 (fp32 FMA), avx512 (fp32), amx-bf16 (bf16 operands, fp32 accumulate/output) and amx-int8
 * (W8A8: int8 weights with per-output-channel scales, activations quantised per row at run time,
 * int32 accumulate, fp32 output). nv_engines_init() probes each once (CPUID, XCR0, the AMX
 * permission request, then a small product checked against scalar); a failure latches the engine
 * off with one log line giving the reason. NERVE_ENGINES (or the `allow` argument) restricts the
 * set so every fallback is testable on any machine.
 *
 * A plan is a weight matrix W (n outputs x k inputs, row-major fp32, the Linear layout of
 * llama2.c and PyTorch) packed once into an engine's layout. nv_plan_run computes
 * y[m x n] = x[m x k] . W^T for any m; nv_plan_refresh() rewrites the packed copy from new fp32
 * weights without rebuilding (the dynamic-weights rule). A plan asked for an engine that is off
 * falls down the ladder amx-int8 -> amx-bf16 -> avx512 -> avx2 -> scalar.
 * The scalar engine sums each dot product left to right in fp32, exactly as llama2.c's run.c,
 * and reads the caller's weights in place (the caller keeps them alive for the plan's life).
 *
 * Plans run on the shared thread pool (nv_pool), split over output channels. */
#ifndef NV_ENGINE_H
#define NV_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

typedef enum {
    NV_ENGINE_SCALAR = 0,
    NV_ENGINE_AVX2,
    NV_ENGINE_AVX512,
    NV_ENGINE_AMX_BF16,
    NV_ENGINE_AMX_INT8,
    NV_ENGINE_COUNT
} nv_engine_id;

/* Probes every engine once (idempotent). allow: comma-separated engine names, or NULL to use
 * $NERVE_ENGINES, or all when that is unset. threads <= 0 means one per online core. */
nv_err nv_engines_init(const char *allow, int threads);
int nv_engine_available(nv_engine_id e);
const char *nv_engine_name(nv_engine_id e);
/* Why an engine is off ("" when it is on). */
const char *nv_engine_why_off(nv_engine_id e);
/* The fastest available engine for fp32-accurate work, and for any work. */
nv_engine_id nv_engine_best(void);
nv_err nv_engine_parse(const char *name, nv_engine_id *out);
/* The next rung down the ladder from e (scalar stays scalar). */
nv_engine_id nv_engine_next_down(nv_engine_id e);

typedef struct nv_plan nv_plan;

nv_err nv_plan_build(nv_plan **out, nv_engine_id want, const float *w, int n, int k);
void nv_plan_refresh(nv_plan *p, const float *w);
/* y[m x n] = x[m x k] . W^T */
void nv_plan_run(const nv_plan *p, const float *x, int m, float *y);
nv_engine_id nv_plan_engine(const nv_plan *p);
int nv_plan_n(const nv_plan *p);
int nv_plan_k(const nv_plan *p);
void nv_plan_free(nv_plan *p);
/* Total plans built in this process (training checks this stays constant after step 1). */
long nv_plan_builds(void);

#endif
