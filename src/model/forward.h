/* The fp32 forward pass of one sequence with a KV cache, as small pure functions over plain
 * structs (llama2.c's run.c generalised to GQA, separate head_dim, QK-norm and chunks of tokens).
 *
 * nv_forward() runs tokens[0..n) at positions pos..pos+n-1, appending their keys and values to
 * the cache, and leaves the logits of the last token (or of every token) in s->logits. Every
 * matrix product goes through the model's plans; with the scalar engine the arithmetic is
 * exactly llama2.c's, so greedy decoding reproduces it byte for byte. Running a prompt as one
 * chunk or token by token gives identical results. */
#ifndef NV_FORWARD_H
#define NV_FORWARD_H

#include "model/adapters.h"
#include "model/model.h"

/* Activations of up to T token rows, kept by the single-sequence and the batched forward alike:
 * x the residual stream, xb/xb2 normalised input and attention output, hb/hb2 the FFN's hidden
 * rows, q/k/v the projections; a mixture of experts' also: moe_x/moe_y an expert's rows gathered
 * and its output [T][dim], moe_p the router's probabilities [T][n_experts], moe_w the chosen
 * experts' weights [T][n_experts_used], moe_sel who they are and moe_rows/moe_off the choices grouped by expert. */
typedef struct {
    float *x, *xb, *xb2, *hb, *hb2, *q, *k, *v;
    float *moe_x, *moe_y, *moe_p, *moe_w;
    int *moe_sel, *moe_rows, *moe_off; /* moe_rows [T][K] and moe_off [E+1]: nv_moe_group's order and off */
} nv_rows;

nv_err nv_rows_init(nv_rows *r, const nv_config *c, int T);
void nv_rows_free(nv_rows *r);

typedef struct {
    int max_tokens; /* tokens per forward chunk */
    int cache_len;  /* positions the KV cache holds */
    nv_rows r;
    float *att;         /* [n_heads][att_rows][cache_len]: scores of the rows a head attends at once */
    int att_rows;
    float *kt;          /* [n_heads][head_dim][16]: 16 positions of a head's keys, transposed */
    float *rope;        /* [cache_len][head_dim]: nv_rope_table's cos, sin of every position */
    float *rope_swa;    /* the same for the windowed layers when their RoPE base differs (nv_rope_of_layer), or NULL */
    int head_dim;       /* of the config the state (and its table) was made for */
    uint64_t rope_key;  /* nv_config_rope_key of the config the table was made for */
    float *logits;      /* [max_tokens][vocab] when all_logits, else [vocab] (grown by nv_forward_rows) */
    int all_logits;
    int logit_cap;      /* rows s->logits holds */
    float *key_cache;   /* per layer [n_kv_heads][layer_slots[l]][head_dim] from layer_at[l]: a head's keys are one run */
    float *value_cache; /* the same for the values */
    size_t *layer_at;   /* [L] */
    int *layer_slots;   /* [L] positions a kv head's run holds: cache_len, or a windowed layer's 2 * ring */
    int ring;           /* a windowed layer's positions kept (its window + max_tokens), or 0: all cache_len */
    int hi;             /* one past the last position written since a forward at position 0 (what the rings hold) */
} nv_state;

/* A state for chunks of up to max_tokens rows over positions 0..cache_len-1. The layers of a sliding
 * window keep only their last window + max_tokens positions (ring) when that is less than half of
 * cache_len: each key and value at slot p % ring and again at p % ring + ring, so that the ring's
 * worth of positions any row reads is one run whatever its first position, read in the same order
 * as a full cache (the same logits, bit for bit). */
nv_err nv_state_init(nv_state *s, const nv_config *c, int max_tokens, int cache_len, int all_logits);
void nv_state_free(nv_state *s);
/* 1 when a forward may start at position pos (a position at or before the last one written): with
 * rings, the windowed layers must still hold the window before pos: a forward at position 0 always
 * can; after one that wrote up to position hi - 1, pos >= hi - max_tokens - 1 (a speculative step's
 * rows taken back, a chat that continues). Else nv_forward fails (NV_ERANGE): run again from 0. */
int nv_state_resumable(const nv_state *s, int pos);

nv_err nv_forward(const nv_model *m, nv_state *s, const int *tokens, int n, int pos);
/* nv_forward, with the logits of the last `rows` rows (1..n) in s->logits [rows][vocab] whatever
 * all_logits says (a speculative step's drafts checked at once); the buffer grows when it must. */
nv_err nv_forward_rows(const nv_model *m, nv_state *s, const int *tokens, int n, int pos, int rows);

/* A logits buffer (*logits, *cap rows of vocab) made to hold at least rows rows, growing when it
 * must; NV_ENOMEM (nothing changed) when it cannot. Shared with the batched forward. */
nv_err nv_logits_reserve(float **logits, int *cap, int rows, int vocab);

/* The rest of layer l after attention, on n rows of r (shared with the batched forward): x += wo.xb,
 * then x += w2.(silu(w1.xn) * w3.xn) with xn = RMSNorm(x) (in a mixture of experts, the sum of the
 * chosen experts' outputs, each weighted); r->xb holds the attention output on entry, the rest is
 * scratch. With ad (NULL: none), the rows' adapters add their updates to wo's, w1's, w3's and w2's
 * products (before SwiGLU for w1 and w3, which then runs as a pass of its own). A row's result does
 * not depend on the other rows. */
void nv_layer_tail(const nv_model *m, int l, int n, nv_rows *r, const nv_adapter_rows *ad);

/* Building blocks, shared with training. */
/* A mixture of experts' routing of one row: p holds the router's E logits and becomes their softmax;
 * sel gets the K most probable experts, most probable first (ties to the lower index), and w their
 * probabilities renormalised to sum 1 (the softmax of the chosen logits alone). */
void nv_moe_route(float *p, int E, int K, int *sel, float *w);
/* gpt-oss's routing: the K largest logits of p (ties to the lower index), their weights a softmax over
 * those K alone. */
void nv_moe_route_chosen(const float *p, int E, int K, int *sel, float *w);
/* SwiGLU-OAI (gpt-oss's experts), g = min(g + bg, 7) sigmoid(1.702 min(g + bg, 7)) (clamp(u + bu, -7, 7) + 1)
 * over n values, ggml's formula. */
void nv_swiglu_oai(float *g, const float *u, const float *bg, const float *bu, int n);
/* n rows' K choices each (sel [n][K]) grouped by expert, by a counting sort: expert e's entries are
 * order[off[e] .. off[e+1]), each a row * K + choice, in row order; off has E + 1 entries; at (NULL:
 * not wanted) gets the inverse, each choice's place in order. */
void nv_moe_group(const int *sel, int n, int K, int E, int *off, int *order, int *at);
void nv_rmsnorm(float *o, const float *x, const float *weight, int size, float eps);
/* nv_rmsnorm of n rows of d (x and o d apart), on the thread pool when there are enough of them. */
void nv_rmsnorm_rows(float *o, const float *x, const float *weight, int n, int d, float eps);
/* What layer l's attention (ffn 0) or FFN (ffn 1) reads of n residual rows x: them normed by the
 * layer's weights, or as they are in OLMo 2's block (no norm before either). */
void nv_layer_input(const nv_model *m, int l, int ffn, float *o, const float *x, int n);
void nv_softmax(float *x, int size);
/* nv_softmax of each of rows rows ld apart, row g holding size0 + g values (size0 >= 1; a causal
 * block of query rows): the same values, eight rows' sums carried side by side. */
void nv_softmax_causal(float *x, size_t ld, int size0, int rows);
/* The same with a sink logit (gpt-oss's attention sinks): in each row's maximum and, after the row's
 * own terms, in its sum, weighing no value; -INFINITY: none (the same bits as without). */
void nv_softmax_sink(float *x, int size, float sink);
void nv_softmax_causal_sink(float *x, size_t ld, int size0, int rows, float sink);
/* h[i] = silu(h[i]) * g[i], run.c's expressions value for value (expf 8 lanes at a time with its bits). */
void nv_silu_mul(float *h, const float *g, int n);
/* RoPE: cs[pos][head_dim] = cos, sin of each position < npos and pair (2i, 2i+1), by run.c's float
 * expressions; nv_rope_apply rotates the pairs of every head of vec (n_heads x head_dim) by the
 * angles of one position's row of that table. */
void nv_rope_table(float *cs, const nv_config *c, int npos);
void nv_rope_apply(float *vec, int n_heads, int head_dim, const float *cs);
/* A table of npos positions allocated and filled: the windowed layers' (windowed: their own base,
 * unscaled; NULL without one, as when the model has none) or the others'. NULL when out of memory. */
float *nv_rope_table_new(const nv_config *c, int npos, int windowed);
/* The table layer l rotates by, or NULL when it does not rotate (SmolLM3's RoPE-less layers). */
static inline const float *nv_rope_of_layer(const nv_config *c, const float *rope, const float *rope_swa, int l) {
    return !nv_config_layer_roped(c, l) ? NULL : rope_swa && nv_config_layer_windowed(c, l) ? rope_swa : rope;
}
/* A token's embedding row into x (times the model's embedding scale when it has one). */
void nv_embed(const nv_model *m, int token, float *x);
/* The classifier's rows made final: divided by Granite's logit divisor, then the model's soft cap
 * (cap * tanh(logit / cap)), when it has them. */
void nv_logits_finish(const nv_config *c, float *logits, int rows);
/* A sliding window over rows of attention scores (ld apart, row g at position p0 + g): positions
 * from `from` up to p0 + g - window made -inf, so that the softmax gives them weight 0 (the rows
 * attend from `from` on, the first row's window or the start of its block). */
void nv_window_mask(float *att, size_t ld, int from, int p0, int rows, int window);
/* Gemma 2's soft cap on rows of attention scores (as nv_window_mask's rows): from `from` to each
 * row's own position, cap * tanh(score / cap). */
void nv_attn_softcap(float *att, size_t ld, int from, int p0, int rows, float cap);
/* h[i] = gelu(h[i]) * g[i], GELU's tanh form (Gemma's gating). */
void nv_gelu_mul(float *h, const float *g, int n);
/* One row's query, key and value of layer l after their projections: the biases (Qwen2), QK-norm
 * (Qwen3), then RoPE of the query and key heads by the angles cs of its position pos (none when cs
 * is NULL), then the query's attention temperature at pos (Ministral 3's) (shared by the
 * single-sequence and the batched forward). */
void nv_qkv_finish(const nv_model *m, int l, float *q, float *k, float *v, const float *cs, int pos);

#endif
