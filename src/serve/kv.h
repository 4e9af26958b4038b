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
 * - Reservations: a sequence first reserves the blocks it will need (nv_kv_reserve; refused when
 *   the free blocks not already promised are too few; the scheduler reserves every block a
 *   request can ever need at admission, or with its overcommit the blocks a step will reach
 *   before the step) and takes them one by one as its positions reach them (nv_kv_alloc, which
 *   only hands out reserved blocks, so it cannot fail). Unused reservations are given back
 *   (nv_kv_unreserve).
 * - Cached blocks (the prefix cache's RAM tier, serve/prefix.h): a full block the prefix cache
 *   has indexed is marked cached (nv_kv_set_cached). When its last reference goes it does not
 *   return to the free list but becomes *idle*: still holding its keys and values, on an LRU
 *   list, ready to be shared again by nv_kv_ref (which takes it off the list). Idle blocks are
 *   memory the pool can always reclaim: reservations count free + idle blocks, and
 *   nv_kv_alloc evicts the least recently used idle block when the free list is empty (calling
 *   on_evict so the cache forgets it). At most max_idle blocks stay idle; beyond that the least
 *   recently used is evicted at once. Reviving an idle block (nv_kv_ref at reference count 0)
 *   uses one unit of nv_kv_available(): a caller that revives k idle blocks and reserves n must
 *   first check nv_kv_available() >= n + k.
 * - Accounting: free + idle + in use = total (in use = blocks with a reference);
 *   reserved <= free + idle, always.
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
    int n_reserved;     /* free or idle blocks promised to admitted sequences */
    /* cached blocks (the prefix cache's RAM tier) */
    uint8_t *cached;            /* [n_blocks] 1: indexed by the prefix cache */
    int32_t *lru_prev, *lru_next; /* [n_blocks] the idle list, least recently used first */
    int32_t lru_head, lru_tail;
    int n_idle;                 /* cached blocks with no reference */
    int max_idle;               /* most idle blocks kept (the RAM tier's budget); n_blocks after init */
    void (*on_evict)(void *ctx, int32_t block); /* a cached block is being reused */
    void *evict_ctx;
    uint64_t evictions;
} nv_kv_pool;

/* As many blocks of dtype elements, holding the `held` layers of c, as fit budget_bytes (at least one
 * must fit; at most max_blocks when > 0). A block's bytes: nv_kv_block_bytes_of (model/batch.h). */
nv_err nv_kv_pool_init(nv_kv_pool *p, const nv_config *c, nv_kv_layers held, int block_size, nv_kv_dtype dtype,
                       uint64_t budget_bytes, int max_blocks);
void nv_kv_pool_free(nv_kv_pool *p);

/* Promises n free or idle blocks; 1 on success, 0 (nothing changed) when fewer than n are unpromised. */
int nv_kv_reserve(nv_kv_pool *p, int n);
void nv_kv_unreserve(nv_kv_pool *p, int n);
/* Takes one reserved block: reference count 1, nothing filled, not cached (evicting the least
 * recently used idle block when the free list is empty). The caller holds a reservation. */
int32_t nv_kv_alloc(nv_kv_pool *p);
/* One more reference (an idle block leaves the idle list). */
void nv_kv_ref(nv_kv_pool *p, int32_t block);
/* One reference less; at 0 the block goes to the free list, or to the idle list when cached. */
void nv_kv_unref(nv_kv_pool *p, int32_t block);
/* Marks a referenced block as indexed by the prefix cache. */
void nv_kv_set_cached(nv_kv_pool *p, int32_t block);
/* Sets the idle budget, evicting the least recently used idle blocks beyond it. */
void nv_kv_set_max_idle(nv_kv_pool *p, int max_idle);
/* Records that position `off` of block holds token (fills the block up to off + 1). */
void nv_kv_record(nv_kv_pool *p, int32_t block, int off, int32_t token);

static inline int nv_kv_in_use(const nv_kv_pool *p) { return p->n_blocks - p->n_free - p->n_idle; }
/* Blocks a new reservation (or a revival of an idle block) can still take. */
static inline int nv_kv_available(const nv_kv_pool *p) { return p->n_free + p->n_idle - p->n_reserved; }
/* Blocks needed to hold positions 0..n_positions-1. */
static inline int nv_kv_blocks_for(const nv_kv_pool *p, long n_positions) {
    return (int)((n_positions + p->block_size - 1) / p->block_size);
}

#endif
