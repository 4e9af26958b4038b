/* The AMX engines' tile loops on the real tile unit. This file alone is compiled with the AMX target
 * (the pragma below); engine.c calls it only after nv_cpu_probe() found AMX-TILE/BF16/INT8 in CPUID,
 * the tile state enabled in XCR0 and the XTILEDATA permission granted, and after its self-test.
 * The loops themselves live in kern_amx_tmpl.h and also run here on emulated tiles
 * (kern_amx_emu.c), which checks every tile operation against the ISA's shape rules.
 *
 * GCC's AMX intrinsics are inline asm: ldtilecfg only declares 8 bytes of its operand as read and
 * tileloadd declares no memory input at all, hence our own ldtilecfg with the whole 64-byte config
 * as operand and a compiler memory barrier before the first tile load of every call. */
#pragma GCC target("amx-tile,amx-bf16,amx-int8")
#include <immintrin.h>
#include <string.h>

#include "engine/kern.h"

static inline void amx_ldtilecfg(const nv_amx_cfg *cfg) { __asm__ volatile("ldtilecfg %0" ::"m"(*cfg)); }

#define AP(name) amxhw_##name
#define TCFG(cfg) amx_ldtilecfg(cfg)
#define TZERO(t) _tile_zero(t)
#define TLOAD(t, p, stride) _tile_loadd(t, p, stride)
#define TSTORE(t, p, stride) _tile_stored(t, p, stride)
#define TDPBF16(c, a, b) _tile_dpbf16ps(c, a, b)
#define TDPBSSD(c, a, b) _tile_dpbssd(c, a, b)
#define TRELEASE() _tile_release()

#include "engine/kern_amx_tmpl.h"

const nv_kern_amx nv_kern_amx_hw = {"amx", amxhw_bf16_gemm, amxhw_int8_gemm, 0, NULL, 0};
