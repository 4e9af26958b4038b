/* bf16 <-> fp32 in plain C (fp16's conversions are F16C's _cvtss_sh / _cvtsh_ss, part of the baseline). */
#ifndef NV_HALF_H
#define NV_HALF_H

#include <stdint.h>

/* fp32 -> bf16, round to nearest even (NaN stays NaN). */
static inline uint16_t nv_bf16_from_f32(float f) {
    union {
        float f;
        uint32_t u;
    } v = {f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}
/* bf16 -> fp32, exact: the bits shifted up. */
static inline float nv_f32_from_bf16(uint16_t h) {
    union {
        uint32_t u;
        float f;
    } v = {(uint32_t)h << 16};
    return v.f;
}

#endif
