#include "serve/prefix.h"

#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(int) == 4, "token ids are hashed as 32-bit integers");

static uint64_t mix_u64(uint64_t h, uint64_t v) { return nv_checksum64(&v, sizeof v, h); }

static uint64_t mix_f32(uint64_t h, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return mix_u64(h, u);
}

/* The engine by name, not by its place on the ladder (which grows as engines are added). */
static uint64_t mix_plan(uint64_t h, const nv_plan *p) {
    const char *name = p ? nv_engine_name(nv_plan_engine(p)) : "";
    return nv_checksum64(name, strlen(name), mix_u64(h, p != NULL));
}

uint64_t nv_prefix_model_id(const nv_model *m, int block_size, nv_kv_dtype dtype) {
    const nv_config *c = &m->config;
    static const char tag[] = "nerve kv prefix cache";
    uint64_t h = nv_checksum64(tag, sizeof tag - 1, 0);
    h = mix_u64(h, NV_PREFIX_NUMERICS);
    h = mix_u64(h, (uint64_t)dtype);
    h = mix_u64(h, 2); /* layout: per block, per layer, keys [kv_dim][block] then values [kv_heads][block][head_dim] */
    h = mix_u64(h, (uint64_t)block_size);
    /* the config, field by field (the context length does not change a position's KV) */
    int fields[] = {c->dim,        c->hidden_dim, c->n_layers,          c->n_heads, c->n_kv_heads,
                    c->head_dim,   c->vocab_size, c->shared_classifier, c->qk_norm, nv_config_kv_dim(c),
                    c->qkv_bias,   c->n_experts,  c->n_experts_used};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) h = mix_u64(h, (uint64_t)(uint32_t)fields[i]);
    h = mix_u64(h, nv_config_rope_key(c));
    h = mix_f32(h, c->norm_eps);
    if (c->no_pre_norms) h = mix_u64(h, 0x6f6c6d6f32); /* OLMo 2's block ("olmo2"; its QK-norm is qk_norm's value above) */
    if (nv_config_gemma_block(c)) { /* Gemma's block, OLMo 3's window (mixed only where present: other models' keys stay as they were) */
        const int gemma[] = {c->swa_window, c->swa_period, c->ffn_gelu, c->post_norms};
        for (size_t i = 0; i < sizeof gemma / sizeof gemma[0]; i++) h = mix_u64(h, (uint64_t)(uint32_t)gemma[i]);
        h = mix_f32(mix_f32(mix_f32(h, c->emb_scale), c->attn_div), c->attn_softcap);
    }
    if (c->gpt_oss) /* gpt-oss's block: its window decides what a position's KV saw */
        h = mix_u64(mix_u64(mix_u64(h, 0x6770746f7373), (uint64_t)(uint32_t)c->swa_window), (uint64_t)(uint32_t)c->swa_period);
    if (c->attn_temp_scale != 0.0f) /* Ministral 3's query temperature: the later layers' KV past its length depend on it */
        h = mix_u64(mix_f32(h, c->attn_temp_scale), (uint64_t)(uint32_t)c->attn_temp_len);
    if (nv_config_granite(c)) /* Granite's multipliers (its logit divisor changes no KV, but is cheap to mix) */
        h = mix_f32(mix_f32(mix_f32(mix_f32(h, c->emb_scale), c->attn_div), c->residual_scale), c->logit_div);
    /* the engine of every plan: engines round differently */
    for (int l = 0; m->plans && l < c->n_layers; l++) {
        const nv_layer_plans *lp = &m->plans[l];
        const nv_plan *ps[] = {lp->wq, lp->wk, lp->wv, lp->wo, lp->w1, lp->w2, lp->w3};
        for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) h = mix_plan(h, ps[i]);
        h = mix_plan(h, lp->router);
        for (int i = 0; lp->experts && i < 3 * c->n_experts; i++) h = mix_plan(h, lp->experts[i]);
    }
    h = mix_plan(h, m->cls_plan);
    /* the weights' content: the fp32 block, and the block-quantized sources (the only form of a
       matrix whose fp32 weights are pending) */
    h = mix_u64(h, m->n_params);
    return mix_u64(nv_model_weights_hash(m, h), nv_model_sources_hash(m));
}

uint64_t nv_prefix_chain(uint64_t model_id, uint64_t parent, const int *tokens, int n) {
    uint64_t h = mix_u64(model_id, parent);
    h = mix_u64(h, (uint64_t)n);
    h = nv_checksum64(tokens, (size_t)n * sizeof(int), h);
    return h ? h : 1; /* 0 is "no parent" */
}

static void on_evict(void *ctx, int32_t b) {
    nv_prefix *c = ctx;
    if (nv_map64_get(&c->index, c->hash[b]) == b) nv_map64_del(&c->index, c->hash[b]);
}

nv_err nv_prefix_init(nv_prefix *c, nv_kv_pool *pool, uint64_t model_id) {
    memset(c, 0, sizeof *c);
    c->model_id = model_id;
    c->block_size = pool->block_size;
    c->pool = pool;
    c->hash = calloc((size_t)pool->n_blocks, sizeof *c->hash);
    c->parent = calloc((size_t)pool->n_blocks, sizeof *c->parent);
    if (!c->hash || !c->parent || nv_map64_init(&c->index, (size_t)pool->n_blocks) != NV_OK) {
        nv_prefix_free(c);
        return nv_fail(NV_ENOMEM, "prefix cache: out of memory");
    }
    pool->on_evict = on_evict;
    pool->evict_ctx = c;
    return NV_OK;
}

void nv_prefix_free(nv_prefix *c) {
    if (c->pool && c->pool->evict_ctx == c) {
        c->pool->on_evict = NULL;
        c->pool->evict_ctx = NULL;
    }
    nv_map64_free(&c->index);
    free(c->hash);
    free(c->parent);
    memset(c, 0, sizeof *c);
}

int32_t nv_prefix_find(const nv_prefix *c, uint64_t hash, uint64_t parent, const int *tokens) {
    int32_t b = nv_map64_get(&c->index, hash);
    if (b < 0) return -1;
    const nv_kv_pool *p = c->pool;
    int B = c->block_size;
    if (!p->cached[b] || p->fill[b] != B || c->hash[b] != hash || c->parent[b] != parent) return -1;
    if (memcmp(p->tokens + (size_t)b * B, tokens, (size_t)B * sizeof(int)) != 0) return -1;
    return b;
}

int nv_prefix_insert(nv_prefix *c, int32_t b, uint64_t hash, uint64_t parent) {
    nv_kv_pool *p = c->pool;
    if (p->cached[b] || p->refs[b] < 1 || p->fill[b] != c->block_size) return 0;
    if (nv_map64_get(&c->index, hash) >= 0) return 0;
    if (nv_map64_put(&c->index, hash, b) != NV_OK) return 0;
    c->hash[b] = hash;
    c->parent[b] = parent;
    nv_kv_set_cached(p, b);
    return 1;
}
