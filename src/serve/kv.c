#include "serve/kv.h"

#include <stdlib.h>
#include <string.h>

nv_err nv_kv_pool_init(nv_kv_pool *p, const nv_config *c, nv_kv_layers held, int block_size, nv_kv_dtype dtype,
                       uint64_t budget_bytes, int max_blocks) {
    memset(p, 0, sizeof *p);
    if (block_size < 1 || block_size > 4096)
        return nv_fail(NV_EINVAL, "KV block size %d is outside [1, 4096]", block_size);
    if (!nv_kv_dtype_name(dtype)) return nv_fail(NV_EINVAL, "unknown KV element type %d", (int)dtype);
    size_t bytes = nv_kv_block_bytes_of(c, block_size, dtype, held);
    uint64_t n = budget_bytes / bytes;
    if (n < 1)
        return nv_fail(NV_EINVAL, "a KV budget of %llu bytes holds no block (one block of %d positions is %zu bytes)",
                       (unsigned long long)budget_bytes, block_size, bytes);
    if (n > (1u << 30)) n = 1u << 30;
    if (max_blocks > 0 && n > (uint64_t)max_blocks) n = (uint64_t)max_blocks;
    NV_TRY(nv_kv_pages_init_of(&p->pages, c, block_size, (int)n, dtype, held));
    p->block_size = block_size;
    p->n_blocks = (int)n;
    p->block_bytes = bytes;
    p->refs = calloc(n, sizeof *p->refs);
    p->fill = calloc(n, sizeof *p->fill);
    p->tokens = calloc(n * (size_t)block_size, sizeof *p->tokens);
    p->free_list = calloc(n, sizeof *p->free_list);
    p->cached = calloc(n, sizeof *p->cached);
    p->lru_prev = calloc(n, sizeof *p->lru_prev);
    p->lru_next = calloc(n, sizeof *p->lru_next);
    if (!p->refs || !p->fill || !p->tokens || !p->free_list || !p->cached || !p->lru_prev || !p->lru_next) {
        nv_kv_pool_free(p);
        return nv_fail(NV_ENOMEM, "cannot allocate the KV block table of %llu blocks", (unsigned long long)n);
    }
    /* lowest ids on top of the stack, so a fresh pool hands out 0, 1, 2, ... */
    for (int i = 0; i < (int)n; i++) p->free_list[i] = (int32_t)(n - 1 - (uint64_t)i);
    p->n_free = (int)n;
    p->lru_head = p->lru_tail = -1;
    p->max_idle = (int)n;
    return NV_OK;
}

void nv_kv_pool_free(nv_kv_pool *p) {
    nv_kv_pages_free(&p->pages);
    free(p->refs);
    free(p->fill);
    free(p->tokens);
    free(p->free_list);
    free(p->cached);
    free(p->lru_prev);
    free(p->lru_next);
    memset(p, 0, sizeof *p);
}

/* ---- the idle list ---------------------------------------------------------------------------- */

static void lru_remove(nv_kv_pool *p, int32_t b) {
    int32_t pr = p->lru_prev[b], nx = p->lru_next[b];
    if (pr >= 0) p->lru_next[pr] = nx;
    else p->lru_head = nx;
    if (nx >= 0) p->lru_prev[nx] = pr;
    else p->lru_tail = pr;
    p->n_idle--;
}

static void lru_append(nv_kv_pool *p, int32_t b) {
    p->lru_prev[b] = p->lru_tail;
    p->lru_next[b] = -1;
    if (p->lru_tail >= 0) p->lru_next[p->lru_tail] = b;
    else p->lru_head = b;
    p->lru_tail = b;
    p->n_idle++;
}

/* The least recently used idle block goes back to the free list, forgotten by the cache. */
static void evict_one(nv_kv_pool *p) {
    int32_t b = p->lru_head;
    if (b < 0) return;
    lru_remove(p, b);
    p->cached[b] = 0;
    if (p->on_evict) p->on_evict(p->evict_ctx, b);
    p->fill[b] = 0;
    p->free_list[p->n_free++] = b;
    p->evictions++;
}

void nv_kv_set_max_idle(nv_kv_pool *p, int max_idle) {
    p->max_idle = max_idle < 0 ? 0 : max_idle;
    while (p->n_idle > p->max_idle) evict_one(p);
}

void nv_kv_set_cached(nv_kv_pool *p, int32_t b) {
    if (p->refs[b] > 0) p->cached[b] = 1;
}

/* ---- reservations and references ------------------------------------------------------------- */

int nv_kv_reserve(nv_kv_pool *p, int n) {
    if (n < 0 || n > nv_kv_available(p)) return 0;
    p->n_reserved += n;
    return 1;
}

void nv_kv_unreserve(nv_kv_pool *p, int n) {
    p->n_reserved -= n;
    if (p->n_reserved < 0) p->n_reserved = 0;
}

int32_t nv_kv_alloc(nv_kv_pool *p) {
    if (p->n_reserved < 1 || p->n_free + p->n_idle < 1) return -1; /* a caller bug: allocation without a reservation */
    if (p->n_free == 0) evict_one(p);
    p->n_reserved--;
    int32_t b = p->free_list[--p->n_free];
    p->refs[b] = 1;
    p->fill[b] = 0;
    p->cached[b] = 0;
    return b;
}

void nv_kv_ref(nv_kv_pool *p, int32_t b) {
    if (p->refs[b] == 0 && p->cached[b]) lru_remove(p, b);
    p->refs[b]++;
}

void nv_kv_unref(nv_kv_pool *p, int32_t b) {
    if (p->refs[b] <= 0) return;
    if (--p->refs[b] > 0) return;
    if (p->cached[b]) {
        lru_append(p, b);
        while (p->n_idle > p->max_idle) evict_one(p);
        return;
    }
    p->fill[b] = 0;
    p->free_list[p->n_free++] = b;
}

void nv_kv_record(nv_kv_pool *p, int32_t b, int off, int32_t token) {
    p->tokens[(size_t)b * p->block_size + off] = token;
    if (p->fill[b] < off + 1) p->fill[b] = off + 1;
}
