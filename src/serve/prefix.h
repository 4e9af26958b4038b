/* The prefix cache's identities and its RAM tier: full KV blocks keyed by a hash chain, shared
 * between sequences by reference count, kept after their last sequence ends while the pool has
 * room.
 *
 * Contract:
 * - Model identity (nv_prefix_model_id): a 64-bit hash of everything the keys and values of a
 *   position depend on besides the tokens: the weights' content (hashed once at start), the
 *   config, the KV element type (fp32 or fp16) and layout (keys transposed per block), the block size, layers
 *   and kv_dim, the engine each plan runs on (engines round differently) and a version of the
 *   forward arithmetic (NV_PREFIX_NUMERICS, bumped whenever a change could alter a single
 *   bit of KV). Two servers share cached KV only when all of these agree, so a hit is exact.
 * - Block identity (nv_prefix_chain): hash(model identity, parent block's hash, the block's
 *   block_size token ids); the first block's parent is 0, or for a sequence served with a LoRA
 *   adapter the adapter's identity (model/adapters.h: its KV is its own). A block's hash therefore
 *   names the whole prefix up to its end.
 * - Only FULL blocks are cached, and a sequence never writes to a position below its own
 *   length, so a cached block never changes while it is cached: sequences that share it append
 *   their new tokens to blocks of their own.
 * - The RAM tier is the pool itself (serve/kv.h): nv_prefix_insert() indexes a full block and
 *   marks it cached; when no sequence references it any more it stays in the pool, idle, on the
 *   pool's LRU list (at most max_idle blocks: --kv-ram-cache), until the pool needs the memory
 *   and evicts it (the index entry goes with it, through the pool's on_evict).
 * - Lookups compare what the hash stands for: the cached block's own token ids and its parent
 *   hash must equal the request's, so a 64-bit collision between two different blocks cannot
 *   hand out wrong keys and values (the parent chain itself rests on the hash).
 * - Not thread-safe: used by the scheduler under its lock. */
#ifndef NV_SERVE_PREFIX_H
#define NV_SERVE_PREFIX_H

#include <stdint.h>

#include "base/hash.h"
#include "model/model.h"
#include "serve/kv.h"

/* Bump when the forward pass's arithmetic changes in a way that could change KV bits. */
#define NV_PREFIX_NUMERICS 2u /* 2: engines named in the identity (avx512-bf16 moved the AMX ids) */

typedef struct {
    uint64_t model_id;
    int block_size;
    nv_map64 index;    /* block hash -> pool block */
    uint64_t *hash;    /* [n_blocks] the chain hash of a cached block */
    uint64_t *parent;  /* [n_blocks] its parent's */
    nv_kv_pool *pool;
} nv_prefix;

/* Model identity for KV blocks of block_size positions (hashes the weights: ~memory speed). */
uint64_t nv_prefix_model_id(const nv_model *m, int block_size, nv_kv_dtype dtype);
/* The chain hash of a block holding tokens[0..n) after the block whose hash is parent. */
uint64_t nv_prefix_chain(uint64_t model_id, uint64_t parent, const int *tokens, int n);

/* An empty RAM tier over pool (takes the pool's on_evict hook). */
nv_err nv_prefix_init(nv_prefix *c, nv_kv_pool *pool, uint64_t model_id);
void nv_prefix_free(nv_prefix *c);

/* The cached block with this hash whose tokens and parent match, or -1. */
int32_t nv_prefix_find(const nv_prefix *c, uint64_t hash, uint64_t parent, const int *tokens);
/* Indexes the full, referenced block b as (hash, parent): 1 when indexed, 0 when another block
 * already holds this hash (b stays private) or on out of memory. */
int nv_prefix_insert(nv_prefix *c, int32_t b, uint64_t hash, uint64_t parent);
/* Blocks indexed (referenced or idle). */
static inline int nv_prefix_blocks(const nv_prefix *c) { return (int)c->index.n; }

#endif
