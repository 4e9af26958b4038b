/* Peak loops: what the compute units and memory of this machine can do at best, measured the
 * way the seed measured its accelerator (a compute-only loop on registers), so that nerve bench
 * can report matmul figures as a fraction of a peak measured in the same run.
 *
 *   amx-bf16  tdpbf16ps on tile registers only: 4 independent 16x16 fp32 accumulators fed by two
 *             A and two B tiles (16 x 64 bytes), no loads or stores in the loop;
 *             16 x 16 x 32 x 2 = 16384 FLOP per instruction.
 *   amx-int8  the same loop with tdpbssd: 16 x 16 x 64 x 2 = 32768 integer ops per instruction.
 *   avx512-int8  16 independent zmm accumulators, one vpdpbusd each per iteration: 16 lanes x 4
 *             products = 128 integer ops per instruction.
 *   avx512-bf16  16 independent zmm accumulators, one vdpbf16ps each per iteration: 16 lanes x 2
 *             products = 64 FLOP per instruction.
 *   avx512    16 independent zmm accumulators, one vfmadd per accumulator per iteration (fp32).
 *   avx2      12 independent ymm accumulators, likewise.
 *
 * Each unit is measured only when the engine probe (nv_engines_init) says its engine is on and
 * is not emulated; the AMX and AVX-512 loops are compiled for their targets alone (GCC target
 * pragmas) and never reached otherwise. The AMX loop configures the tile registers on the thread
 * that runs it and releases them at the end, as kern_amx.c does. nv_peak_run starts `threads`
 * threads of its own (not the pool: each runs the same fixed count of iterations, released
 * together), and divides the total work by the wall time from the first start to the last end.
 *
 * nv_mem_read_bw sums a buffer of `bytes` (touched first, in parallel) with AVX2 loads split over
 * `threads` threads and returns the best of `passes` passes in bytes per second. */
#ifndef NV_PEAK_H
#define NV_PEAK_H

#include <stddef.h>

typedef enum {
    NV_PEAK_AMX_BF16 = 0,
    NV_PEAK_AMX_INT8,
    NV_PEAK_AVX512_INT8,
    NV_PEAK_AVX512_BF16,
    NV_PEAK_AVX512,
    NV_PEAK_AVX2,
    NV_PEAK_COUNT
} nv_peak_unit;

/* The engine whose unit this is ("amx-bf16", "amx-int8", "avx512-int8", "avx512-bf16", "avx512", "avx2"). */
const char *nv_peak_engine(nv_peak_unit u);
/* The peak unit an engine's products run on (NV_PEAK_COUNT for scalar; an int8 engine's training
 * products run on bf16 tiles, but its forward on int8: the int8 unit). */
nv_peak_unit nv_peak_unit_of(int engine);
/* The instruction the loop runs ("tdpbf16ps", "tdpbssd", "vpdpbusd zmm", "vdpbf16ps zmm", "vfmadd231ps zmm",
 * "vfmadd231ps ymm"). */
const char *nv_peak_instr(nv_peak_unit u);
/* 1 when the unit counts integer ops (amx-int8, avx512-int8), 0 for FLOP. */
int nv_peak_is_int(nv_peak_unit u);
/* 1 when the loop may run here (needs nv_engines_init first); else 0 with the reason in why. */
int nv_peak_available(nv_peak_unit u, char *why, size_t cap);
/* Ops per second over all threads (FLOP/s, or OP/s for the int8 units), each thread running for about
 * `seconds`; a negative value when the unit is unavailable or threads could not start. */
double nv_peak_run(nv_peak_unit u, int threads, double seconds);

/* Read bandwidth in bytes per second (best of passes); a negative value when out of memory. */
double nv_mem_read_bw(size_t bytes, int threads, int passes);

#endif
