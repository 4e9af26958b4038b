/* Fast non-cryptographic 64-bit hashes, and a small map keyed by 64-bit hashes.
 *
 * Contract:
 * - nv_checksum64(data, len, seed): word-at-a-time multiply-xorshift hash; chaining calls
 *   (seed = the previous result) hashes a concatenation part by part. Its values are part of the
 *   training checkpoint format (train/ckpt.c) and never change.
 * - nv_hash64(data, len, seed): the same mixing over four independent lanes of 32-byte stripes,
 *   folded at the end, so it runs near memory speed on large buffers (KV blocks, model weights).
 *   Its values are part of the KV block file format (serve/disk.h) and never change.
 * - Neither is cryptographic: they detect torn, truncated and corrupted data and tell contents
 *   apart; callers that share data by hash also compare what they can (serve/prefix.h compares
 *   the block's tokens).
 * - nv_map64: uint64 key -> int32 value (>= 0), open addressing with linear probing and
 *   backward-shift deletion; grows as needed (put fails only when out of memory). Not
 *   thread-safe. */
#ifndef NV_HASH_H
#define NV_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

uint64_t nv_checksum64(const void *data, size_t len, uint64_t seed);
uint64_t nv_hash64(const void *data, size_t len, uint64_t seed);

typedef struct {
    uint64_t *keys;
    int32_t *vals; /* -1: empty slot */
    size_t cap;    /* a power of two, or 0 */
    size_t n;
} nv_map64;

nv_err nv_map64_init(nv_map64 *m, size_t expected);
void nv_map64_free(nv_map64 *m);
/* The value stored for key, or -1. */
int32_t nv_map64_get(const nv_map64 *m, uint64_t key);
/* Inserts or replaces (val >= 0). */
nv_err nv_map64_put(nv_map64 *m, uint64_t key, int32_t val);
/* 1 when key was present (and is now removed), 0 otherwise. */
int nv_map64_del(nv_map64 *m, uint64_t key);

#endif
