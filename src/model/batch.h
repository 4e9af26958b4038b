/* The fp32 forward pass over a batch of sequences whose KV lives in fixed-size pages.
 *
 * A step is a list of sequences, each contributing rows: one decode token, or a chunk of its
 * prompt. The rows of all sequences are stacked, so every matrix product of the model runs once
 * per step through its plan with m = total rows; only attention is per sequence, over that
 * sequence's own pages through its block table.
 *
 * Contract:
 * - Paged KV storage (nv_kv_pages): n_blocks blocks of block_size positions, each element an
 *   fp32, an fp16 (dtype; fp16 halves the memory and the bytes attention reads, as llama.cpp's
 *   default f16 cache does) or an int8 (q8: each position's keys, and its values, of one kv head
 *   share an fp32 scale; the element is int8 x scale). A block is one contiguous unit holding, for every layer, the keys
 *   then the values of its positions; the keys of a (block, layer) are stored transposed,
 *   [kv_dim][block_size] (element (t, i) at keys + i*block_size + t), so scores of consecutive
 *   positions vectorise; the values are [n_kv_heads][block_size][head_dim] (one head's values of
 *   a block are one contiguous run, read front to back). Keys of block b, layer l start at
 *   element b*block_elems + (l*2 + 0)*block_size*kv_dim, values at the same place with +1
 *   instead of +0; q8 blocks end with their scales (nv_kv_scales), after the int8 padded to 64
 *   bytes.
 *   Keeping a block's layers together lets a block be copied, hashed or written to disk as one
 *   range (the prefix cache builds on this). fp16 stores round to nearest and saturate at
 *   +-65504 (a key or value beyond fp16's range does not become infinite); q8 maps the largest
 *   finite magnitude to 127 and rounds to nearest (an infinity saturates, a NaN makes the scale
 *   NaN).
 * - Sequence i (nv_batch_seq) runs tokens[0..n) at positions pos..pos+n-1; its block table
 *   `blocks` maps position p to block blocks[p / block_size] and must cover 0..pos+n-1. The
 *   keys and values of positions < pos must already be in its blocks (written by earlier
 *   steps); this step writes those of pos..pos+n-1. Distinct sequences in one step must not
 *   write the same block (blocks shared read-only by several sequences are fine).
 * - With logits = k > 0, the logits of the sequence's last k rows are computed (1: the next
 *   token's; more: a speculative step's draft tokens checked at once); nv_batch_logits() /
 *   nv_batch_logits_at() return them until the next step.
 * - Arithmetic: every row goes through exactly the operations of nv_forward (forward.c) in the
 *   same order — the same RMSNorm, RoPE, left-to-right attention sums over positions 0..p and
 *   softmax — and plans compute each row of a product independently, so a sequence's logits do
 *   not depend on what else is in the batch, on how its prompt was chunked, or on which blocks
 *   hold it: with the scalar engine and fp32 pages they are bit-identical to nv_forward's. fp16
 *   pages differ from nv_forward only by the rounding of the stored keys and values (the sums
 *   are the same fp32 sums), and are still independent of the batch, the chunking and the blocks.
 *   q8 pages take the scales outside the sums (a score times its key's scale, an attention weight
 *   times its value's scale, the same multiply on every path): independent of them too.
 * - RoPE angles come from nv_rope_table, filled at nv_batch_state_init with run.c's float
 *   expressions (so the same cosf/sinf values); the per-row work and attention run on the thread
 *   pool (base/pool.h), split by rows and by (row, head), which changes no summation order.
 * - Adapters (nv_batch_state_set_adapters): a sequence's rows take its adapter's low-rank updates
 *   (model/adapters.h) after the products they adapt; rows of the base model (adapter 0) go
 *   through exactly the operations above, whatever adapters share their step.
 * - A state is used by one thread at a time. */
#ifndef NV_BATCH_H
#define NV_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "model/forward.h"
#include "model/model.h"

/* Element types of KV pages; the values are the codes block files record (serve/disk.h). */
typedef enum { NV_KV_F32 = 1, NV_KV_F16 = 2, NV_KV_Q8 = 3 } nv_kv_dtype;

/* Which of a model's layers a set of pages holds: all of them, or one side of split pages (serve's
 * --swa-cache window): the layers that see the whole context, or the sliding-window ones. */
typedef enum { NV_KV_LAYERS_ALL = 0, NV_KV_LAYERS_FULL = 1, NV_KV_LAYERS_WINDOWED = 2 } nv_kv_layers;

typedef struct nv_kv_pages {
    int block_size; /* positions per block */
    int n_blocks;
    int n_layers, kv_dim, n_kv_heads; /* n_layers: those held (the model's layers of that kind, in order) */
    nv_kv_layers held;
    nv_kv_dtype dtype;
    size_t block_elems; /* elements from one block to the next (q8: bytes, scales included) */
    void *data; /* per block, per held layer: keys [kv_dim][block_size], values [n_kv_heads][block_size][head_dim] */
    /* Split pages: on pages holding NV_KV_LAYERS_FULL, the pages of the windowed layers (set by the
     * owner; NULL otherwise). A sequence's windowed layers then read and write these through its
     * wblocks table. */
    const struct nv_kv_pages *windowed;
} nv_kv_pages;

/* "f32" / "f16" / "q8" (NULL for anything else), and back (0 when unknown). */
const char *nv_kv_dtype_name(nv_kv_dtype t);
nv_kv_dtype nv_kv_dtype_parse(const char *name);
/* Bytes of one stored key or value element (q8: its int8; the scales come on top). */
static inline size_t nv_kv_dtype_bytes(nv_kv_dtype t) { return t == NV_KV_F16 ? 2 : t == NV_KV_Q8 ? 1 : 4; }
/* Bytes of the keys and values of one block, all layers (q8: padded to 64 bytes; its fp32 scales
 * follow, one per layer, keys or values, kv head and position). */
static inline size_t nv_kv_elems_bytes(int n_layers, int block_size, int kv_dim, nv_kv_dtype t) {
    size_t b = (size_t)n_layers * 2 * (size_t)block_size * (size_t)kv_dim * nv_kv_dtype_bytes(t);
    return t == NV_KV_Q8 ? (b + 63) / 64 * 64 : b;
}
/* Bytes of one block: its keys and values, and with q8 their scales. */
static inline size_t nv_kv_geometry_bytes(int n_layers, int block_size, int kv_dim, int n_kv_heads, nv_kv_dtype t) {
    size_t scales = t == NV_KV_Q8 ? (size_t)n_layers * 2 * (size_t)n_kv_heads * (size_t)block_size * sizeof(float) : 0;
    return nv_kv_elems_bytes(n_layers, block_size, kv_dim, t) + scales;
}
/* The number of c's layers of that kind. */
int nv_kv_layers_count(const nv_config *c, nv_kv_layers held);
/* Bytes of one block holding every layer (nv_kv_block_bytes) or those of one kind. */
size_t nv_kv_block_bytes(const nv_config *c, int block_size, nv_kv_dtype t);
size_t nv_kv_block_bytes_of(const nv_config *c, int block_size, nv_kv_dtype t, nv_kv_layers held);
/* Split pages: the blocks of a sequence's ring of windowed-layer blocks when a step gives it at most
 * `rows` rows: the window behind the step's first row and the step's rows, so no row reads a block
 * the ring has reused. */
int nv_kv_ring_blocks(const nv_config *c, int rows, int block_size);
/* Pages of every layer (nv_kv_pages_init), or of one kind (NV_EINVAL when c has none of it). */
nv_err nv_kv_pages_init(nv_kv_pages *kv, const nv_config *c, int block_size, int n_blocks, nv_kv_dtype t);
nv_err nv_kv_pages_init_of(nv_kv_pages *kv, const nv_config *c, int block_size, int n_blocks, nv_kv_dtype t,
                           nv_kv_layers held);
void nv_kv_pages_free(nv_kv_pages *kv);
/* Element index of the keys of (block, layer); the values follow block_size * kv_dim later. `layer`
 * counts the layers the pages hold (on split pages: the model's layers of that kind before it). */
static inline size_t nv_kv_keys_at(const nv_kv_pages *kv, int block, int layer) {
    return (size_t)block * kv->block_elems + (size_t)layer * 2 * (size_t)kv->block_size * kv->kv_dim;
}
static inline size_t nv_kv_values_at(const nv_kv_pages *kv, int block, int layer) {
    return nv_kv_keys_at(kv, block, layer) + (size_t)kv->block_size * kv->kv_dim;
}
/* The bytes of a whole block (what the prefix cache copies and writes to disk). */
static inline void *nv_kv_block_data(const nv_kv_pages *kv, int block) {
    return (char *)kv->data + (size_t)block * kv->block_elems * nv_kv_dtype_bytes(kv->dtype);
}
/* q8 pages: the scales of (block, layer, keys (0) or values (1), kv head), one per position of the
 * block: a stored element is its int8 times its position's scale. */
static inline float *nv_kv_scales(const nv_kv_pages *kv, int block, int layer, int values, int head) {
    size_t at = nv_kv_elems_bytes(kv->n_layers, kv->block_size, kv->kv_dim, kv->dtype) +
                (((size_t)layer * 2 + (size_t)values) * (size_t)kv->n_kv_heads + (size_t)head) * (size_t)kv->block_size *
                    sizeof(float);
    return (float *)((char *)nv_kv_block_data(kv, block) + at);
}
/* Element i of the pages as fp32 (q8: times its scale; i inside a block's keys and values). */
float nv_kv_get(const nv_kv_pages *kv, size_t i);

typedef struct {
    const int *tokens; /* n ids */
    int n;             /* rows: 1 to decode, or a prompt chunk */
    int pos;           /* position of tokens[0] */
    const int *blocks; /* block table covering positions 0..pos+n-1 */
    int logits;        /* k: compute the logits of the last k rows (0: none) */
    const nv_adapter_mix *lora; /* the LoRA adapters its rows take, of the state's set (NULL or empty: the base model) */
    const int *wblocks; /* split pages (kv->windowed): the windowed layers' table into those pages, also
                           covering 0..pos+n-1; the entries of blocks wholly before the window of the
                           sequence's first row are never read, so a ring of blocks may repeat there
                           (every block from that window's start on must be distinct). NULL otherwise */
} nv_batch_seq;

typedef struct {
    int max_rows, max_seqs;
    nv_rows r;
    float *att;
    int *row_seq, *row_pos; /* [max_rows] */
    int *group_start;       /* [max_rows] first row of each attention group of a step */
    int *logit_row;         /* [max_seqs]: row of s->logits of sequence i's first logits row, -1 when none */
    float *logits;          /* [logits_cap][vocab] */
    int logits_cap;         /* rows s->logits holds (grown by a step that asks for more) */
    float *rope;            /* [seq_len][head_dim]: cos, sin of each position and pair */
    float *rope_swa;        /* the same for the windowed layers when their RoPE base differs, or NULL */
    int step_rows;          /* rows of the last step (0 before the first) */
    uint64_t rope_key; /* nv_config_rope_key of the config the table was made for */
    int head_dim, seq_len;
    /* adapters served per request (NULL: none) and their scratch */
    const nv_adapters *adapters;
    const nv_adapter_mix **row_mix; /* [max_rows] */
    nv_adapter_rows adapter_rows; /* the step's rows grouped, and the products' scratch */
} nv_batch_state;

/* Scratch for steps of at most max_rows stacked rows from at most max_seqs sequences. */
nv_err nv_batch_state_init(nv_batch_state *s, const nv_config *c, int max_rows, int max_seqs);
void nv_batch_state_free(nv_batch_state *s);
/* Lets the state's sequences take the adapters of set (model/adapters.h), which must outlive it;
 * a sequence's `lora` then names loaded ones, which the caller keeps pinned while it steps.
 * The scratch is sized for the set's max_rank. */
nv_err nv_batch_state_set_adapters(nv_batch_state *s, const nv_config *c, const nv_adapters *set);

/* Runs one step. Checks the shapes (rows, positions against the context, token ids, block ids
 * against the pages) before touching anything: NV_EINVAL / NV_ERANGE on a bad batch. */
nv_err nv_batch_forward(const nv_model *m, nv_batch_state *s, const nv_kv_pages *kv, const nv_batch_seq *seqs,
                        int n_seqs);

/* The logits of sequence i of the last step (NULL when it did not ask for them): those of the first
 * of the rows it asked for (its last row when it asked for one). */
static inline float *nv_batch_logits(const nv_batch_state *s, const nv_config *c, int i) {
    return s->logit_row[i] < 0 ? NULL : s->logits + (size_t)s->logit_row[i] * c->vocab_size;
}
/* The logits of the j-th of the rows sequence i asked for (0 <= j < its seqs[i].logits). */
static inline float *nv_batch_logits_at(const nv_batch_state *s, const nv_config *c, int i, int j) {
    return s->logit_row[i] < 0 ? NULL : s->logits + (size_t)(s->logit_row[i] + j) * c->vocab_size;
}

/* The logits of rows [row, row + count) of the last step (its sequences' rows stacked in order),
 * into out [count][vocab]: the final norm and classifier that give a sequence's last row its
 * logits, so the same bits. Valid until the next step. NV_EINVAL when the rows are not in it. */
nv_err nv_batch_row_logits(const nv_model *m, nv_batch_state *s, int row, int count, float *out);

#endif
