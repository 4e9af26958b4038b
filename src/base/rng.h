/* Seeded pseudo-random numbers.
 * nv_xorshift_u32/f32 are llama2.c's sampler generator (xorshift64*, upper 32 bits), kept
 * bit-exact so a seed gives the same text as llama2.c. nv_rng adds normals for initialisation. */
#ifndef NV_RNG_H
#define NV_RNG_H

#include <math.h>
#include <stdint.h>

static inline uint32_t nv_xorshift_u32(uint64_t *state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}
/* Uniform in [0, 1). */
static inline float nv_xorshift_f32(uint64_t *state) { return (float)(nv_xorshift_u32(state) >> 8) / 16777216.0f; }

typedef struct {
    uint64_t state;
} nv_rng;

static inline void nv_rng_seed(nv_rng *r, uint64_t seed) {
    /* splitmix64 of the seed: any seed, including 0, gives a usable xorshift state */
    uint64_t z = seed + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    r->state = (z ^ (z >> 31)) | 1;
}
static inline float nv_rng_uniform(nv_rng *r) { return nv_xorshift_f32(&r->state); }
/* Advances r by n draws of nv_xorshift_u32 (n states) in O(log n): xorshift64 is linear over
 * GF(2), so n steps are one 64 x 64 bit matrix, made by squaring. The state afterwards is exactly
 * the one n sequential draws leave, so a stream can be cut into pieces drawn in parallel. */
void nv_rng_jump(nv_rng *r, uint64_t n);
/* Standard normal by Box-Muller (two uniform draws). */
static inline float nv_rng_normal(nv_rng *r) {
    float u1 = nv_rng_uniform(r), u2 = nv_rng_uniform(r);
    if (u1 < 1e-12f) u1 = 1e-12f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

#endif
