/* What this CPU offers, probed at run time (the binary is built for x86-64-v3 and dispatches).
 *
 * A feature counts only when CPUID reports it AND the OS enables its register state (XCR0):
 * AVX-512 needs opmask/ZMM state, AMX needs XTILECFG/XTILEDATA and, on Linux, the per-process
 * permission granted by arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA). nv_cpu_probe() asks
 * for that permission once and records the answer. */
#ifndef NV_CPU_H
#define NV_CPU_H

typedef struct {
    char model[64];
    int cores;               /* logical CPUs this process may use */
    unsigned long long mem_total_bytes;
    int avx2, fma, f16c, avx_vnni; /* avx_vnni: the VEX (256-bit) VPDPBUSD, with or without AVX-512 */
    int avx512f, avx512bw, avx512vl, avx512_bf16, avx512_vnni;
    int amx_tile, amx_bf16, amx_int8;
    int os_avx, os_avx512, os_amx; /* XCR0 enables the state */
    int amx_permission;            /* the kernel granted XTILEDATA to this process */
    char amx_why[128];             /* why AMX is unusable, "" when usable */
} nv_cpu_info;

/* Probes once; later calls return the same answer. */
const nv_cpu_info *nv_cpu_probe(void);

static inline int nv_cpu_has_avx2(const nv_cpu_info *c) { return c->avx2 && c->fma && c->os_avx; }
static inline int nv_cpu_has_avx_vnni(const nv_cpu_info *c) { return nv_cpu_has_avx2(c) && c->avx_vnni; }
static inline int nv_cpu_has_avx512(const nv_cpu_info *c) {
    return c->avx512f && c->avx512bw && c->avx512vl && c->os_avx512;
}
static inline int nv_cpu_has_amx_bf16(const nv_cpu_info *c) {
    return c->amx_tile && c->amx_bf16 && c->os_amx && c->amx_permission;
}
static inline int nv_cpu_has_amx_int8(const nv_cpu_info *c) {
    return c->amx_tile && c->amx_int8 && c->os_amx && c->amx_permission;
}

#endif
