#include "serve/kv.h"

#include <stdlib.h>
#include <string.h>

size_t nv_kv_block_bytes(const nv_config *c, int block_size) { return nv_kv_block_floats(c, block_size) * sizeof(float); }

nv_err nv_kv_pool_init(nv_kv_pool *p, const nv_config *c, int block_size, uint64_t budget_bytes, int max_blocks) {
    memset(p, 0, sizeof *p);
    if (block_size < 1 || block_size > 4096)
        return nv_fail(NV_EINVAL, "KV block size %d is outside [1, 4096]", block_size);
    size_t bytes = nv_kv_block_bytes(c, block_size);
    uint64_t n = budget_bytes / bytes;
    if (n < 1)
        return nv_fail(NV_EINVAL, "a KV budget of %llu bytes holds no block (one block of %d positions is %zu bytes)",
                       (unsigned long long)budget_bytes, block_size, bytes);
    if (n > (1u << 30)) n = 1u << 30;
    if (max_blocks > 0 && n > (uint64_t)max_blocks) n = (uint64_t)max_blocks;
    NV_TRY(nv_kv_pages_init(&p->pages, c, block_size, (int)n));
    p->block_size = block_size;
    p->n_blocks = (int)n;
    p->block_bytes = bytes;
    p->refs = calloc(n, sizeof *p->refs);
    p->fill = calloc(n, sizeof *p->fill);
    p->tokens = calloc(n * (size_t)block_size, sizeof *p->tokens);
    p->free_list = calloc(n, sizeof *p->free_list);
    if (!p->refs || !p->fill || !p->tokens || !p->free_list) {
        nv_kv_pool_free(p);
        return nv_fail(NV_ENOMEM, "cannot allocate the KV block table of %llu blocks", (unsigned long long)n);
    }
    /* lowest ids on top of the stack, so a fresh pool hands out 0, 1, 2, ... */
    for (int i = 0; i < (int)n; i++) p->free_list[i] = (int32_t)(n - 1 - (uint64_t)i);
    p->n_free = (int)n;
    return NV_OK;
}

void nv_kv_pool_free(nv_kv_pool *p) {
    nv_kv_pages_free(&p->pages);
    free(p->refs);
    free(p->fill);
    free(p->tokens);
    free(p->free_list);
    memset(p, 0, sizeof *p);
}

int nv_kv_reserve(nv_kv_pool *p, int n) {
    if (n < 0 || n > p->n_free - p->n_reserved) return 0;
    p->n_reserved += n;
    return 1;
}

void nv_kv_unreserve(nv_kv_pool *p, int n) {
    p->n_reserved -= n;
    if (p->n_reserved < 0) p->n_reserved = 0;
}

int32_t nv_kv_alloc(nv_kv_pool *p) {
    if (p->n_reserved < 1 || p->n_free < 1) return -1; /* a caller bug: allocation without a reservation */
    p->n_reserved--;
    int32_t b = p->free_list[--p->n_free];
    p->refs[b] = 1;
    p->fill[b] = 0;
    return b;
}

void nv_kv_ref(nv_kv_pool *p, int32_t b) { p->refs[b]++; }

void nv_kv_unref(nv_kv_pool *p, int32_t b) {
    if (p->refs[b] <= 0) return;
    if (--p->refs[b] == 0) {
        p->fill[b] = 0;
        p->free_list[p->n_free++] = b;
    }
}

void nv_kv_record(nv_kv_pool *p, int32_t b, int off, int32_t token) {
    p->tokens[(size_t)b * p->block_size + off] = token;
    if (p->fill[b] < off + 1) p->fill[b] = off + 1;
}
