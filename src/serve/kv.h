/* The paged KV cache's block pool: fixed-size blocks with reference counts, sized by a memory
 * budget.
 *
 * Contract:
 * - The pool owns the KV pages (model/batch.h) and, per block, a reference count, the token
 *   ids written at each of its positions and how many positions are filled. Together with the
 *   block's place in a sequence's chain this is everything a prefix cache needs to hash a
 *   full block by (model id, parent hash, tokens) and share it: a shared block is simply
 *   referenced by several block tables (nv_kv_ref), and returns to the free list when its last
 *   reference goes (nv_kv_unref).
 * - Admission never over-commits: a sequence first reserves every block it can ever need
 *   (nv_kv_reserve; refused when the free blocks not already promised are too few) and later
 *   takes them one by one as its positions reach them (nv_kv_alloc, which only hands out
 *   reserved blocks, so it cannot fail). Unused reservations are given back (nv_kv_unreserve).
 * - In use = blocks with a reference; free + in use = total; reserved <= free, always.
 * - Not thread-safe: the scheduler calls it under its own lock. */
#ifndef NV_SERVE_KV_H
#define NV_SERVE_KV_H

#include <stdint.h>

#include "model/batch.h"

typedef struct {
    nv_kv_pages pages;
    int block_size, n_blocks;
    size_t block_bytes;
    int32_t *refs;      /* [n_blocks] */
    int32_t *fill;      /* [n_blocks] positions written */
    int32_t *tokens;    /* [n_blocks][block_size] the token at each written position */
    int32_t *free_list; /* stack of free block ids */
    int n_free;
    int n_reserved;     /* free blocks promised to admitted sequences */
} nv_kv_pool;

/* Bytes one block of block_size positions takes for model config c (keys and values, all layers). */
size_t nv_kv_block_bytes(const nv_config *c, int block_size);
/* As many blocks as fit budget_bytes (at least one must fit; at most max_blocks when > 0). */
nv_err nv_kv_pool_init(nv_kv_pool *p, const nv_config *c, int block_size, uint64_t budget_bytes, int max_blocks);
void nv_kv_pool_free(nv_kv_pool *p);

/* Promises n free blocks; 1 on success, 0 (nothing changed) when fewer than n are unpromised. */
int nv_kv_reserve(nv_kv_pool *p, int n);
void nv_kv_unreserve(nv_kv_pool *p, int n);
/* Takes one reserved block: reference count 1, nothing filled. The caller holds a reservation. */
int32_t nv_kv_alloc(nv_kv_pool *p);
void nv_kv_ref(nv_kv_pool *p, int32_t block);
void nv_kv_unref(nv_kv_pool *p, int32_t block);
/* Records that position `off` of block holds token (fills the block up to off + 1). */
void nv_kv_record(nv_kv_pool *p, int32_t block, int off, int32_t token);

static inline int nv_kv_in_use(const nv_kv_pool *p) { return p->n_blocks - p->n_free; }
/* Blocks needed to hold positions 0..n_positions-1. */
static inline int nv_kv_blocks_for(const nv_kv_pool *p, long n_positions) {
    return (int)((n_positions + p->block_size - 1) / p->block_size);
}

#endif
