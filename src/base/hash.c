#include "base/hash.h"

#include <stdlib.h>
#include <string.h>

#define K0 0x9E3779B97F4A7C15ull
#define K1 0xBF58476D1CE4E5B9ull
#define K2 0x94D049BB133111EBull

/* Word-at-a-time multiply-rotate hash: detects torn and corrupted files at memory speed. */
uint64_t nv_checksum64(const void *data, size_t len, uint64_t h) {
    const uint8_t *p = data;
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ (w * K0)) * K1;
        h ^= h >> 29;
        p += 8;
        len -= 8;
    }
    while (len--) h = (h ^ *p++) * K2;
    return h ^ (h >> 31);
}

static inline uint64_t lane(uint64_t h, const uint8_t *p) {
    uint64_t w;
    memcpy(&w, p, 8);
    h = (h ^ (w * K0)) * K1;
    return h ^ (h >> 29);
}

uint64_t nv_hash64(const void *data, size_t len, uint64_t seed) {
    const uint8_t *p = data;
    uint64_t a = seed ^ K0, b = seed ^ K1, c = seed ^ K2, d = ~seed, total = len;
    while (len >= 32) {
        a = lane(a, p);
        b = lane(b, p + 8);
        c = lane(c, p + 16);
        d = lane(d, p + 24);
        p += 32;
        len -= 32;
    }
    uint64_t h = a;
    h = (h ^ (b * K0)) * K1;
    h ^= h >> 29;
    h = (h ^ (c * K0)) * K1;
    h ^= h >> 29;
    h = (h ^ (d * K0)) * K1;
    h ^= h >> 29;
    h ^= total * K2;
    return nv_checksum64(p, len, h);
}

/* ---- the map ------------------------------------------------------------------------------- */

static inline size_t slot_of(const nv_map64 *m, uint64_t key) {
    uint64_t x = key * K0;
    return (size_t)(x ^ (x >> 32)) & (m->cap - 1);
}

static nv_err map_alloc(nv_map64 *m, size_t cap) {
    m->keys = malloc(cap * sizeof *m->keys);
    m->vals = malloc(cap * sizeof *m->vals);
    if (!m->keys || !m->vals) {
        free(m->keys);
        free(m->vals);
        m->keys = NULL;
        m->vals = NULL;
        return nv_fail(NV_ENOMEM, "hash map: out of memory (%zu slots)", cap);
    }
    for (size_t i = 0; i < cap; i++) m->vals[i] = -1;
    m->cap = cap;
    m->n = 0;
    return NV_OK;
}

nv_err nv_map64_init(nv_map64 *m, size_t expected) {
    memset(m, 0, sizeof *m);
    size_t cap = 16;
    while (cap < expected * 2 && cap < ((size_t)1 << 40)) cap *= 2;
    return map_alloc(m, cap);
}

void nv_map64_free(nv_map64 *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

int32_t nv_map64_get(const nv_map64 *m, uint64_t key) {
    if (!m->cap) return -1;
    for (size_t i = slot_of(m, key);; i = (i + 1) & (m->cap - 1)) {
        if (m->vals[i] < 0) return -1;
        if (m->keys[i] == key) return m->vals[i];
    }
}

static void put_nogrow(nv_map64 *m, uint64_t key, int32_t val) {
    for (size_t i = slot_of(m, key);; i = (i + 1) & (m->cap - 1)) {
        if (m->vals[i] < 0) {
            m->keys[i] = key;
            m->vals[i] = val;
            m->n++;
            return;
        }
        if (m->keys[i] == key) {
            m->vals[i] = val;
            return;
        }
    }
}

nv_err nv_map64_put(nv_map64 *m, uint64_t key, int32_t val) {
    if (val < 0) return nv_fail(NV_EINVAL, "hash map: negative value");
    if (!m->cap || (m->n + 1) * 2 > m->cap) {
        nv_map64 old = *m;
        NV_TRY(map_alloc(m, old.cap ? old.cap * 2 : 16));
        for (size_t i = 0; i < old.cap; i++)
            if (old.vals[i] >= 0) put_nogrow(m, old.keys[i], old.vals[i]);
        free(old.keys);
        free(old.vals);
    }
    put_nogrow(m, key, val);
    return NV_OK;
}

int nv_map64_del(nv_map64 *m, uint64_t key) {
    if (!m->cap) return 0;
    size_t mask = m->cap - 1, i = slot_of(m, key);
    for (;; i = (i + 1) & mask) {
        if (m->vals[i] < 0) return 0;
        if (m->keys[i] == key) break;
    }
    /* backward-shift: move later members of the probe run into the hole */
    size_t hole = i;
    for (size_t j = (i + 1) & mask; m->vals[j] >= 0; j = (j + 1) & mask) {
        size_t home = slot_of(m, m->keys[j]);
        /* j may move to hole when home is not cyclically in (hole, j] */
        int stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (stays) continue;
        m->keys[hole] = m->keys[j];
        m->vals[hole] = m->vals[j];
        hole = j;
    }
    m->vals[hole] = -1;
    m->n--;
    return 1;
}
