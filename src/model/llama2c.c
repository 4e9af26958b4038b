/* llama2.c checkpoints: reading v0/v1, writing v1, and random initialisation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "base/mem.h"
#include "base/pool.h"
#include "base/rng.h"
#include "model/gguf.h"
#include "model/hf.h"
#include "model/model.h"

#define V1_MAGIC 0x616b3432u /* "ak42" */
#define V1_HEADER_BYTES 256

/* Number of fp32 values of each part, in version-1 order. */
typedef struct {
    uint64_t rms_att, rms_ffn, rms_final, tok_emb, wq, wk, wv, wo, w1, w2, w3, wcls, q_norm, k_norm, bq, bkv, router, post_norm;
    uint64_t sinks, bo, router_b, b13, b2; /* gpt-oss's */
} part_sizes;

static part_sizes sizes_of(const nv_config *c) {
    uint64_t d = (uint64_t)c->dim, h = (uint64_t)c->hidden_dim, L = (uint64_t)c->n_layers;
    uint64_t q = (uint64_t)nv_config_q_dim(c), kv = (uint64_t)nv_config_kv_dim(c);
    part_sizes s = {0};
    s.rms_att = c->no_pre_norms ? 0 : L * d;
    s.rms_ffn = s.rms_att;
    s.rms_final = d;
    s.tok_emb = (uint64_t)c->vocab_size * d;
    s.wq = L * q * d;
    s.wk = L * kv * d;
    s.wv = L * kv * d;
    s.wo = L * d * q;
    const uint64_t sets = (uint64_t)nv_config_ffn_sets(c); /* experts */
    s.w1 = L * sets * h * d;
    s.w2 = L * sets * d * h;
    s.w3 = L * sets * h * d;
    s.wcls = c->shared_classifier ? 0 : (uint64_t)c->vocab_size * d;
    s.q_norm = c->qk_norm ? L * (uint64_t)nv_config_q_norm_len(c) : 0;
    s.k_norm = c->qk_norm ? L * (uint64_t)nv_config_k_norm_len(c) : 0;
    s.bq = c->qkv_bias ? L * q : 0;
    s.bkv = c->qkv_bias ? L * kv : 0;
    s.router = L * (uint64_t)c->n_experts * d;
    s.post_norm = c->post_norms ? L * d : 0;
    if (c->gpt_oss) {
        const uint64_t E = (uint64_t)c->n_experts;
        s.sinks = L * (uint64_t)c->n_heads, s.bo = L * d, s.router_b = L * E, s.b13 = L * E * h, s.b2 = L * E * d;
    }
    return s;
}

void nv_weights_point(nv_weights *w, const nv_config *c, float *p) {
    part_sizes s = sizes_of(c);
    w->rms_att = c->no_pre_norms ? NULL : p, p += s.rms_att;
    w->rms_ffn = c->no_pre_norms ? NULL : p, p += s.rms_ffn;
    w->rms_final = p, p += s.rms_final;
    w->tok_emb = p, p += s.tok_emb;
    w->wq = p, p += s.wq;
    w->wk = p, p += s.wk;
    w->wv = p, p += s.wv;
    w->wo = p, p += s.wo;
    w->w1 = p, p += s.w1;
    w->w2 = p, p += s.w2;
    w->w3 = p, p += s.w3;
    w->wcls = c->shared_classifier ? w->tok_emb : p;
    p += s.wcls;
    w->q_norm = c->qk_norm ? p : NULL;
    p += s.q_norm;
    w->k_norm = c->qk_norm ? p : NULL;
    p += s.k_norm;
    w->bq = c->qkv_bias ? p : NULL;
    p += s.bq;
    w->bk = c->qkv_bias ? p : NULL;
    p += s.bkv;
    w->bv = c->qkv_bias ? p : NULL;
    p += s.bkv;
    w->router = c->n_experts ? p : NULL;
    p += s.router;
    w->post_att = c->post_norms ? p : NULL;
    p += s.post_norm;
    w->post_ffn = c->post_norms ? p : NULL;
    p += s.post_norm;
    float **oai[] = {&w->sinks, &w->bo, &w->router_b, &w->b1, &w->b2, &w->b3};
    const uint64_t oai_n[] = {s.sinks, s.bo, s.router_b, s.b13, s.b2, s.b13};
    for (int i = 0; i < 6; i++) *oai[i] = c->gpt_oss ? p : NULL, p += oai_n[i];
}

static nv_err alloc_params(nv_model *m) {
    m->n_params = nv_config_param_count(&m->config);
    if (m->n_params > (SIZE_MAX / 4) / 2) return nv_fail(NV_ENOMEM, "model too large");
    m->params = nv_reserve_zeroed((size_t)m->n_params * sizeof(float)); /* pending matrices' parts never written */
    if (!m->params)
        return nv_fail(NV_ENOMEM, "cannot allocate %.1f MB for the weights", (double)m->n_params * 4 / 1e6);
    m->params_owned = 1;
    nv_weights_point(&m->w, &m->config, m->params);
    return NV_OK;
}

static const char *const pooling_names[] = {[NV_POOLING_MEAN] = "mean", [NV_POOLING_CLS] = "cls", [NV_POOLING_LAST] = "last"};

int nv_pooling_of(const char *name) {
    for (int p = NV_POOLING_MEAN; p <= NV_POOLING_LAST; p++)
        if (!strcmp(name, pooling_names[p])) return p;
    return -1;
}

nv_err nv_model_alloc(nv_model *m, const nv_config *c) {
    memset(m, 0, sizeof *m);
    NV_TRY(nv_config_validate(c));
    m->config = *c;
    return alloc_params(m);
}

/* Copies n floats from the reader (v0 layout differs from ours, so v0 is copied). */
static nv_err read_part(nv_reader *r, float *dst, uint64_t n, const char *name) {
    return nv_read_bytes(r, dst, (size_t)n * sizeof(float), name);
}

static nv_err load_v0(nv_model *m, nv_reader *r, const int32_t hdr[7]) {
    nv_config *c = &m->config;
    /* v0 stores two unused RoPE tables (seq_len x head_dim/2 each) before the classifier. */
    part_sizes s = sizes_of(c);
    uint64_t freq = (uint64_t)c->seq_len * (uint64_t)(c->head_dim / 2);
    uint64_t want = s.tok_emb + s.rms_att + s.wq + s.wk + s.wv + s.wo + s.rms_ffn + s.w1 + s.w2 + s.w3 +
                    s.rms_final + 2 * freq + s.wcls;
    uint64_t have = nv_reader_left(r);
    if (have != want * 4)
        return nv_fail(NV_EFORMAT,
                       "%s: llama2.c v0 checkpoint (dim %d, layers %d, vocab %d) needs %llu bytes of weights, file has %llu",
                       r->what, hdr[0], hdr[2], abs(hdr[5]), (unsigned long long)(want * 4),
                       (unsigned long long)have);
    NV_TRY(alloc_params(m));
    nv_weights *w = &m->w;
    NV_TRY(read_part(r, w->tok_emb, s.tok_emb, "token embedding"));
    NV_TRY(read_part(r, w->rms_att, s.rms_att, "attention norms"));
    NV_TRY(read_part(r, w->wq, s.wq, "wq"));
    NV_TRY(read_part(r, w->wk, s.wk, "wk"));
    NV_TRY(read_part(r, w->wv, s.wv, "wv"));
    NV_TRY(read_part(r, w->wo, s.wo, "wo"));
    NV_TRY(read_part(r, w->rms_ffn, s.rms_ffn, "ffn norms"));
    NV_TRY(read_part(r, w->w1, s.w1, "w1"));
    NV_TRY(read_part(r, w->w2, s.w2, "w2"));
    NV_TRY(read_part(r, w->w3, s.w3, "w3"));
    NV_TRY(read_part(r, w->rms_final, s.rms_final, "final norm"));
    const void *skip;
    NV_TRY(nv_read_view(r, &skip, (size_t)(2 * freq * 4), "rope tables"));
    if (!c->shared_classifier) NV_TRY(read_part(r, w->wcls, s.wcls, "classifier"));
    return NV_OK;
}

static void config_from_header(nv_config *c, const int32_t h[7], int shared) {
    memset(c, 0, sizeof *c);
    c->dim = h[0];
    c->hidden_dim = h[1];
    c->n_layers = h[2];
    c->n_heads = h[3];
    c->n_kv_heads = h[4];
    c->vocab_size = h[5];
    c->seq_len = h[6];
    c->head_dim = c->n_heads > 0 && c->dim % c->n_heads == 0 ? c->dim / c->n_heads : 0;
    c->rope_theta = 10000.0f;
    c->norm_eps = 1e-5f;
    c->shared_classifier = shared;
    c->qk_norm = 0;
}

static nv_err check_header(const nv_config *c, const char *path) {
    if (c->n_heads <= 0 || c->dim <= 0 || c->dim % c->n_heads != 0)
        return nv_fail(NV_EFORMAT, "%s: not a llama2.c checkpoint (dim %d is not a multiple of n_heads %d)", path,
                       c->dim, c->n_heads);
    nv_err e = nv_config_validate(c);
    if (e != NV_OK) {
        return nv_fail(e, "%s: not a valid llama2.c checkpoint: %s", path, nv_errmsg());
    }
    return NV_OK;
}

static nv_err load_any(const char *path, nv_model *m, int quantized);

nv_err nv_model_load(const char *path, nv_model *m) { return load_any(path, m, 0); }
nv_err nv_model_load_quantized(const char *path, nv_model *m) { return load_any(path, m, 1); }

static nv_err load_any(const char *path, nv_model *m, int quantized) {
    memset(m, 0, sizeof *m);
    if (nv_hf_is_model(path)) return nv_hf_load_model(path, m, quantized);
    nv_mapped map;
    NV_TRY(nv_file_map(path, &map));
    if (nv_gguf_is(map.data, map.len)) {
        nv_file_unmap(&map);
        return quantized ? nv_gguf_load_model_quantized(path, m) : nv_gguf_load_model(path, m);
    }
    nv_reader r = nv_reader_make(map.data, map.len, path);
    nv_err e;
    uint32_t magic = 0;
    if (map.len < 28) {
        e = nv_fail(NV_EFORMAT, "%s: too short (%zu bytes) to be a llama2.c checkpoint", path, map.len);
        goto fail;
    }
    memcpy(&magic, map.data, 4);
    int32_t hdr[7];
    if (magic == V1_MAGIC) {
        int32_t version;
        uint8_t shared;
        nv_read_u32(&r, &magic, "magic");
        if ((e = nv_read_i32(&r, &version, "version")) != NV_OK) goto fail;
        if (version != 1) {
            e = nv_fail(NV_EUNSUPPORTED, "%s: llama2.c checkpoint version %d is not supported (only 0 and 1: fp32)",
                        path, version);
            goto fail;
        }
        for (int i = 0; i < 7; i++)
            if ((e = nv_read_i32(&r, &hdr[i], "header")) != NV_OK) goto fail;
        if ((e = nv_read_u8(&r, &shared, "shared-classifier flag")) != NV_OK) goto fail;
        if (shared > 1) {
            e = nv_fail(NV_EFORMAT, "%s: bad shared-classifier flag %u", path, shared);
            goto fail;
        }
        config_from_header(&m->config, hdr, shared);
        if ((e = check_header(&m->config, path)) != NV_OK) goto fail;
        if (map.len < V1_HEADER_BYTES) {
            e = nv_fail(NV_EFORMAT, "%s: truncated header", path);
            goto fail;
        }
        r.pos = V1_HEADER_BYTES;
        m->n_params = nv_config_param_count(&m->config);
        if ((uint64_t)nv_reader_left(&r) != m->n_params * 4) {
            e = nv_fail(NV_EFORMAT, "%s: llama2.c v1 checkpoint needs %llu bytes of weights, file has %zu", path,
                        (unsigned long long)(m->n_params * 4), nv_reader_left(&r));
            goto fail;
        }
        /* The mapping is private and read-only; weights are used in place. */
        m->params = (float *)(map.data + V1_HEADER_BYTES);
        m->mapped = map;
        nv_weights_point(&m->w, &m->config, m->params);
        return NV_OK;
    }
    for (int i = 0; i < 7; i++) nv_read_i32(&r, &hdr[i], "header");
    int shared = hdr[5] > 0;
    if (hdr[5] < 0) hdr[5] = hdr[5] == INT32_MIN ? 0 : -hdr[5];
    config_from_header(&m->config, hdr, shared);
    if ((e = check_header(&m->config, path)) != NV_OK) goto fail;
    if ((e = load_v0(m, &r, hdr)) != NV_OK) goto fail;
    nv_file_unmap(&map);
    return NV_OK;
fail:
    nv_file_unmap(&map);
    if (m->params_owned) nv_reserve_free(m->params, (size_t)m->n_params * sizeof(float));
    memset(m, 0, sizeof *m);
    return e;
}

typedef struct {
    float *p;
    uint64_t n;
    float std;
} init_mat;

#define INIT_PIECES 16 /* pieces of the normal stream drawn in parallel (any number gives the same values) */

typedef struct {
    const init_mat *mats;
    uint64_t total, piece;           /* normals in all, per piece */
    uint64_t starts[INIT_PIECES];    /* the generator's state where each piece begins */
} init_job;

/* Piece `task` of the stream of normals that fills the matrices one after another. */
static void init_task(void *ctx, int task, int n_tasks) {
    (void)n_tasks;
    const init_job *j = ctx;
    uint64_t g = (uint64_t)task * j->piece, end = g + j->piece < j->total ? g + j->piece : j->total, base = 0;
    nv_rng rng = {j->starts[task]};
    int k = 0;
    for (; g < end; g++) {
        while (g - base >= j->mats[k].n) base += j->mats[k++].n; /* next matrix (skipping empty ones) */
        j->mats[k].p[g - base] = j->mats[k].std * nv_rng_normal(&rng);
    }
}

void nv_model_init_random(nv_model *m, uint64_t seed) {
    const nv_config *c = &m->config;
    part_sizes s = sizes_of(c);
    nv_rng rng;
    nv_rng_seed(&rng, seed);
    float std = 0.02f, std_res = 0.02f / sqrtf(2.0f * (float)c->n_layers);
    nv_weights *w = &m->w;
    for (uint64_t i = 0; i < s.rms_att; i++) w->rms_att[i] = 1.0f;
    for (uint64_t i = 0; i < s.rms_ffn; i++) w->rms_ffn[i] = 1.0f;
    for (uint64_t i = 0; i < s.rms_final; i++) w->rms_final[i] = 1.0f;
    for (uint64_t i = 0; i < s.q_norm; i++) w->q_norm[i] = 1.0f;
    for (uint64_t i = 0; i < s.k_norm; i++) w->k_norm[i] = 1.0f;
    for (uint64_t i = 0; i < s.post_norm; i++) w->post_att[i] = w->post_ffn[i] = 1.0f;
    const init_mat mats[] = {{w->tok_emb, s.tok_emb, std}, {w->wq, s.wq, std},      {w->wk, s.wk, std},
                             {w->wv, s.wv, std},           {w->wo, s.wo, std_res},  {w->w1, s.w1, std},
                             {w->w2, s.w2, std_res},       {w->w3, s.w3, std},      {w->wcls, s.wcls, std},
                             {w->router, s.router, std}};
    /* one stream of normals (two draws each) through the matrices in this order; its pieces start
       where the generator would be after the pieces before them, so the values do not depend on
       how many threads draw them */
    init_job j = {.mats = mats};
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) j.total += mats[i].n;
    const int pieces = j.total < ((uint64_t)1 << 20) ? 1 : INIT_PIECES;
    j.piece = (j.total + (uint64_t)pieces - 1) / (uint64_t)pieces;
    for (int i = 0; i < pieces; i++) {
        j.starts[i] = rng.state;
        nv_rng_jump(&rng, 2 * j.piece);
    }
    nv_pool_run(init_task, &j, pieces);
}

nv_err nv_model_upcycle(const nv_model *dense, int experts, int used, uint64_t seed, nv_model *out) {
    memset(out, 0, sizeof *out);
    if (dense->config.n_experts) return nv_fail(NV_EINVAL, "the model is a mixture of experts already");
    nv_config c = dense->config;
    c.n_experts = experts, c.n_experts_used = used;
    NV_TRY(nv_config_validate(&c));
    NV_TRY(nv_model_alloc(out, &c));
    const size_t nd = nv_model_tensor_count(&dense->config), nm = nv_model_tensor_count(&c);
    nv_tensor_ref *td = malloc(nd * sizeof *td), *tm = malloc(nm * sizeof *tm);
    nv_err e = td && tm ? NV_OK : nv_fail(NV_ENOMEM, "out of memory");
    if (e == NV_OK) {
        nv_model_tensor_map(&dense->config, &dense->w, td);
        nv_model_tensor_map(&c, &out->w, tm);
    }
    nv_rng rng;
    nv_rng_seed(&rng, seed);
    for (size_t i = 0; i < nm && e == NV_OK; i++) {
        const uint64_t n = tm[i].d0 * tm[i].d1; /* one expert's, or the tensor's */
        if (strstr(tm[i].name, ".ffn_gate_inp.")) { /* the router: small random logits, as a new model's */
            for (uint64_t k = 0; k < n; k++) tm[i].p[k] = 0.02f * nv_rng_normal(&rng);
            continue;
        }
        char want[64]; /* an expert tensor's source: the dense FFN matrix (blk.N.ffn_up_exps -> blk.N.ffn_up) */
        const char *exps = strstr(tm[i].name, "_exps.");
        snprintf(want, sizeof want, "%.*s%s", exps ? (int)(exps - tm[i].name) : (int)strlen(tm[i].name), tm[i].name, exps ? exps + 5 : "");
        const nv_tensor_ref *src = NULL;
        for (size_t k = 0; k < nd && !src; k++)
            if (!strcmp(td[k].name, want)) src = &td[k];
        if (!src || src->d0 * src->d1 != n) {
            e = nv_fail(NV_EINVAL, "upcycling: no tensor %s of %llu values in the dense model", want, (unsigned long long)n);
            break;
        }
        for (uint64_t x = 0; x < (tm[i].d2 ? tm[i].d2 : 1); x++) memcpy(tm[i].p + x * n, src->p, (size_t)n * sizeof(float));
    }
    free(td);
    free(tm);
    if (e != NV_OK) nv_model_free(out);
    return e;
}

int nv_config_fits_v1(const nv_config *c) {
    return !c->qk_norm && c->head_dim * c->n_heads == c->dim && c->rope_theta == 10000.0f && c->norm_eps == 1e-5f &&
           !c->n_rope_factors && !c->rope_attn && !c->qkv_bias && !c->n_experts && !nv_config_gemma_block(c) && !c->nope_period &&
           !nv_config_granite(c) && !c->rope_dim && c->attn_temp_scale == 0.0f;
}

nv_err nv_model_save_v1(const nv_model *m, const char *path) {
    const nv_config *c = &m->config;
    if (c->gpt_oss)
        return nv_fail(NV_EUNSUPPORTED, "%s: llama2.c v1 has no place for gpt-oss's sinks and biases (GGUF has: name the output .gguf)", path);
    if (nv_config_olmo2_block(c))
        return nv_fail(NV_EUNSUPPORTED, "%s: llama2.c v1 has no place for %s (GGUF has: name the output .gguf)", path, nv_config_olmo2_block(c));
    if (nv_config_gemma_block(c))
        return nv_fail(NV_EUNSUPPORTED, "%s: llama2.c v1 has no place for %s (GGUF has: name the output .gguf)", path, nv_config_gemma_block(c));
    if (nv_config_granite(c))
        return nv_fail(NV_EUNSUPPORTED, "%s: llama2.c v1 has no place for %s (GGUF has: name the output .gguf)", path, nv_config_granite_block(c));
    if (c->nope_period) return nv_fail(NV_EUNSUPPORTED, "%s: llama2.c v1 has no layers without RoPE (GGUF has: name the output .gguf)", path);
    if (c->attn_temp_scale != 0.0f)
        return nv_fail(NV_EUNSUPPORTED, "%s: llama2.c v1 has no attention temperature (GGUF has: name the output .gguf)", path);
    if (c->rope_dim) return nv_fail(NV_EUNSUPPORTED, "%s: llama2.c v1 rotates whole heads (this model %d of %d values)", path, c->rope_dim, c->head_dim);
    if (c->qk_norm || c->head_dim * c->n_heads != c->dim)
        return nv_fail(NV_EUNSUPPORTED, "%s: llama2.c v1 cannot hold this shape (head_dim %d x %d heads != dim %d%s; GGUF can: name the output .gguf)",
                       path, c->head_dim, c->n_heads, c->dim, c->qk_norm ? ", QK-norm" : "");
    /* the format has no field for them: a reader assumes llama2.c's */
    if (c->rope_theta != 10000.0f || c->norm_eps != 1e-5f)
        return nv_fail(NV_EUNSUPPORTED, "%s: llama2.c v1 implies RoPE theta 10000 and norm eps 1e-5 (this model: %g, %g; GGUF says them: name the output .gguf)", path,
                       c->rope_theta, c->norm_eps);
    if (c->n_rope_factors || c->rope_attn || c->qkv_bias || c->n_experts)
        return nv_fail(NV_EUNSUPPORTED, "%s: llama2.c v1 has no %s (GGUF has: name the output .gguf)", path,
                       c->qkv_bias ? "projection biases" : c->n_experts ? "mixture of experts"
                       : c->n_rope_factors ? "RoPE frequency factors" : "RoPE attention factor");
    uint8_t hdr[V1_HEADER_BYTES] = {0};
    uint32_t magic = V1_MAGIC;
    int32_t version = 1;
    int32_t p[7] = {c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size, c->seq_len};
    memcpy(hdr, &magic, 4);
    memcpy(hdr + 4, &version, 4);
    memcpy(hdr + 8, p, sizeof p);
    hdr[36] = (uint8_t)(c->shared_classifier ? 1 : 0);
    nv_iov parts[2] = {{hdr, sizeof hdr}, {m->params, (size_t)m->n_params * sizeof(float)}};
    return nv_file_write_atomic(path, parts, 2);
}

/* A buffer for pending weights made for a plan's build alone. */
typedef struct {
    float *p;
    size_t cap; /* floats */
} scratch;

/* Matrix idx's plan from its source qm (NULL: none): block-quantized when the source is and the
 * engine takes it; else built from fp32 weights: while they are still pending, made into a buffer
 * for the build alone (the plan packs its own copy, so the model never holds them: a bf16 model on
 * the bf16 or int8 engines stays at its plans' size), or into the model for good when the plan
 * reads them in place (scalar). */
static nv_err plan_from(nv_qmatrix *qm, int idx, nv_plan **out, nv_engine_id e, float *w, int n, int k, scratch *tmp) {
    if (qm && (qm->q || qm->h)) {
        const nv_qweights qw = {qm->q,   qm->s,     qm->o,     qm->qb,    qm->h,    qm->h_bf16,
                                qm->lut, qm->sub, qm->sub_s, qm->sub_o, qm->sup_s, qm->sup_o};
        nv_err err = nv_plan_build_quant(out, e, &qw, n, k);
        if (err != NV_EUNSUPPORTED) return err;
        const size_t count = (size_t)n * k;
        if (qm->pending && tmp->cap < count) { /* one buffer for every matrix: grown, never faulted in again */
            free(tmp->p);
            tmp->cap = (tmp->p = malloc(count * sizeof(float))) ? count : 0;
        }
        if (qm->pending && tmp->p) {
            nv_qmatrix_fill_f32(qm, tmp->p);
            err = nv_plan_build(out, e, tmp->p, n, k);
            if (err != NV_OK || nv_plan_engine(*out) != NV_ENGINE_SCALAR) return err;
            nv_plan_free(*out); /* the scalar engine multiplies by the caller's floats: made below for good */
            *out = NULL;
        }
        if (qm->pending) {
            nv_qmatrix_fill_f32(qm, w);
            qm->pending = 0;
        }
    }
    if (qm && qm->pending)
        return nv_fail(NV_EINVAL, "plan %d: its quantized weights were dropped before an fp32 plan needed them", idx);
    return nv_plan_build(out, e, w, n, k);
}

/* plan_from with matrix idx's source, which goes once the plan holds it when m->drop_sources. */
static nv_err build_plan(nv_model *m, int idx, nv_plan **out, nv_engine_id e, float *w, int n, int k, scratch *tmp) {
    nv_qmatrix *qm = m->quant ? &m->quant[idx] : NULL;
    nv_err err = qm ? nv_qmatrix_materialize(qm) : NV_OK; /* a raw source's arrays, for this build alone */
    /* a block-quantized matrix runs on the int8 engine whatever its place: its activations are
       quantized per block of 16 or 32 (as llama.cpp's), not per token, so no channel's outliers
       flatten a whole row (the reason the down projection and classifier otherwise stay bf16) */
    if (qm && qm->q && nv_engine_int8(m->engine)) e = m->engine;
    if (err == NV_OK) err = plan_from(qm, idx, out, e, w, n, k, tmp);
    if (err == NV_OK && m->release_floats && w != m->w.tok_emb && nv_plan_engine(*out) != NV_ENGINE_SCALAR) {
        nv_mem_release(w, (size_t)n * k * sizeof(float));
        m->released++;
    }
    if (qm && err == NV_OK && m->drop_sources) nv_qmatrix_drop(qm);
    else if (qm) nv_qmatrix_release(qm);
    return err;
}

nv_engine_id nv_model_engine(const nv_model *m) {
    if (m->plans && m->config.n_layers > 0 && m->plans[0].wq) return nv_plan_engine(m->plans[0].wq);
    return m->cls_plan ? nv_plan_engine(m->cls_plan) : m->engine;
}

uint64_t nv_model_sources_hash(const nv_model *m) {
    if (m->sources_hashed) return m->sources_hash;
    uint64_t h = 0x736f7572636573ull;
    for (int i = 0; m->quant && i < nv_model_plan_count(&m->config); i++) {
        const nv_qmatrix *qm = &m->quant[i];
        if (qm->raw) { /* its blocks as the file has them (and how they are read) */
            const uint32_t how[4] = {(uint32_t)i, qm->raw_type, (uint32_t)qm->h_bf16, (uint32_t)qm->raw_heads};
            h = nv_hash64(qm->raw, qm->raw_bytes, nv_hash64(how, sizeof how, h));
            continue;
        }
        if (qm->h) {
            h = nv_hash64(&i, sizeof i, h ^ (uint64_t)qm->h_bf16);
            h = nv_hash64(qm->h, qm->count * sizeof(uint16_t), h);
        }
        if (!qm->q) continue;
        const size_t blocks = qm->count / (size_t)qm->qb;
        h = nv_hash64(&i, sizeof i, h);
        if (qm->lut) h = nv_hash64(qm->lut, 16, h);
        h = nv_hash64(qm->q, qm->count, h);
        h = nv_hash64(qm->s, blocks * sizeof(float), h);
        if (qm->o) h = nv_hash64(qm->o, blocks * sizeof(float), h);
    }
    return h;
}

uint64_t nv_model_weights_hash(const nv_model *m, uint64_t seed) {
    const size_t nt = nv_model_tensor_count(&m->config);
    nv_tensor_ref *t = malloc(nt * sizeof *t);
    if (!t) return nv_hash64(m->params, (size_t)m->n_params * sizeof(float), seed); /* all of it, zeros read */
    nv_model_tensor_map(&m->config, &m->w, t);
    uint64_t h = seed;
    for (size_t i = 0; i < nt; i++)
        if (!nv_model_pending(m, t[i].name)) h = nv_hash64(t[i].p, (size_t)(nv_tensor_rows(&t[i]) * t[i].d0) * sizeof(float), h);
    free(t);
    return h;
}

nv_err nv_model_build_plans(nv_model *m, nv_engine_id e) {
    const nv_config *c = &m->config;
    if (m->drop_sources && !m->sources_hashed) { /* what they held, before the first goes */
        m->sources_hash = nv_model_sources_hash(m);
        m->sources_hashed = 1;
    }
    if (m->released) return nv_fail(NV_EINVAL, "plans: the model's fp32 matrices were given back when its plans were built");
    int d = c->dim, q = nv_config_q_dim(c), kv = nv_config_kv_dim(c), h = c->hidden_dim;
    nv_model_free_plans(m); /* built again: on another engine */
    m->plans = calloc((size_t)c->n_layers, sizeof *m->plans);
    if (!m->plans) return nv_fail(NV_ENOMEM, "out of memory");
    m->engine = e;
    /* W8A8 everywhere loses too much at the FFN down projection, whose input (the SwiGLU
     * product) has outlier channels that a per-token int8 scale flattens; like llama.cpp's
     * mixed quantisations, that matrix and the classifier stay on bf16 tiles under the int8 engines. */
    nv_engine_id sensitive = nv_engine_bf16_of(e);
    scratch tmp = {NULL, 0};
    nv_err err = NV_OK;
    for (int l = 0; l < c->n_layers && err == NV_OK; l++) {
        nv_layer_plans *lp = &m->plans[l];
        const int i = l * NV_LAYER_MATRICES;
        if (err == NV_OK) err = build_plan(m, i + 0, &lp->wq, e, m->w.wq + (size_t)l * q * d, q, d, &tmp);
        if (err == NV_OK) err = build_plan(m, i + 1, &lp->wk, e, m->w.wk + (size_t)l * kv * d, kv, d, &tmp);
        if (err == NV_OK) err = build_plan(m, i + 2, &lp->wv, e, m->w.wv + (size_t)l * kv * d, kv, d, &tmp);
        if (err == NV_OK) err = build_plan(m, i + 3, &lp->wo, e, m->w.wo + (size_t)l * d * q, d, q, &tmp);
        if (c->n_experts) { /* the router exact: which experts run must not turn on an engine's rounding */
            const size_t E = (size_t)c->n_experts, hd = (size_t)h * d;
            if (err == NV_OK) err = nv_plan_build(&lp->router, nv_engine_low_precision(e) ? nv_engine_best_fp32() : e, m->w.router + (size_t)l * E * d, (int)E, d);
            if (err == NV_OK && !(lp->experts = calloc(E * 3, sizeof *lp->experts))) err = nv_fail(NV_ENOMEM, "out of memory");
            for (size_t x = 0; x < E && err == NV_OK; x++) {
                const size_t at = (size_t)l * E + x;
                nv_plan **ep = &lp->experts[3 * x];
                err = build_plan(m, nv_model_expert_plan(c, l, (int)x, 0), &ep[0], e, m->w.w1 + at * hd, h, d, &tmp);
                if (err == NV_OK) err = build_plan(m, nv_model_expert_plan(c, l, (int)x, 1), &ep[1], sensitive, m->w.w2 + at * hd, d, h, &tmp);
                if (err == NV_OK) err = build_plan(m, nv_model_expert_plan(c, l, (int)x, 2), &ep[2], e, m->w.w3 + at * hd, h, d, &tmp);
            }
            continue;
        }
        if (err == NV_OK) err = build_plan(m, i + 4, &lp->w1, e, m->w.w1 + (size_t)l * h * d, h, d, &tmp);
        if (err == NV_OK) err = build_plan(m, i + 5, &lp->w2, sensitive, m->w.w2 + (size_t)l * d * h, d, h, &tmp);
        if (err == NV_OK) err = build_plan(m, i + 6, &lp->w3, e, m->w.w3 + (size_t)l * h * d, h, d, &tmp);
    }
    if (err == NV_OK) err = build_plan(m, c->n_layers * NV_LAYER_MATRICES, &m->cls_plan, sensitive, m->w.wcls, c->vocab_size, d, &tmp);
    free(tmp.p);
    return err;
}

nv_plan *nv_model_plan(const nv_model *m, int i) {
    const nv_config *c = &m->config;
    const int dense = c->n_layers * NV_LAYER_MATRICES;
    if (i == dense) return m->cls_plan;
    if (i > dense) {
        int l, x, k;
        nv_model_expert_of(c, i, &l, &x, &k);
        return m->plans[l].experts[3 * x + k];
    }
    const nv_layer_plans *lp = &m->plans[i / NV_LAYER_MATRICES];
    nv_plan *const ps[NV_LAYER_MATRICES] = {lp->wq, lp->wk, lp->wv, lp->wo, lp->w1, lp->w2, lp->w3};
    return ps[i % NV_LAYER_MATRICES];
}

nv_err nv_model_read_config(const char *path, nv_config *c) {
    if (nv_hf_is_model(path)) return nv_hf_read_config(path, c);
    nv_mapped map;
    NV_TRY(nv_file_map(path, &map));
    const int gguf = nv_gguf_is(map.data, map.len);
    nv_file_unmap(&map);
    if (gguf) return nv_gguf_read_config(path, c);
    nv_model m; /* a v1 file is mapped in place: cheap */
    NV_TRY(nv_model_load(path, &m));
    *c = m.config;
    nv_model_free(&m);
    return NV_OK;
}

void nv_qmatrix_drop(nv_qmatrix *qm) {
    qm->raw = NULL;
    nv_qmatrix_free_arrays(qm); /* `pending` stays: those fp32 weights can no longer be made */
}

void nv_model_drop_quant_sources(nv_model *m) {
    for (int i = 0; m->quant && i < nv_model_plan_count(&m->config); i++) nv_qmatrix_drop(&m->quant[i]);
    for (int i = 0; i < m->n_source_maps; i++) nv_file_unmap(&m->source_maps[i]); /* no raw source points into them any more */
    free(m->source_maps);
    m->source_maps = NULL;
    m->n_source_maps = 0;
}

void nv_model_free_plans(nv_model *m) {
    if (m->plans) {
        for (int l = 0; l < m->config.n_layers; l++) {
            nv_layer_plans *lp = &m->plans[l];
            nv_plan *all[] = {lp->wq, lp->wk, lp->wv, lp->wo, lp->w1, lp->w2, lp->w3, lp->router};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
                if (all[i]) nv_plan_free(all[i]);
            for (int i = 0; lp->experts && i < 3 * m->config.n_experts; i++)
                if (lp->experts[i]) nv_plan_free(lp->experts[i]);
            free(lp->experts);
        }
        free(m->plans);
        m->plans = NULL;
    }
    if (m->cls_plan) nv_plan_free(m->cls_plan);
    m->cls_plan = NULL;
}

nv_err nv_model_own_params(nv_model *m) {
    if (m->params_owned) return NV_OK;
    float *p = nv_reserve_zeroed((size_t)m->n_params * sizeof(float));
    if (!p) return nv_fail(NV_ENOMEM, "cannot allocate %.1f MB for a copy of the weights", (double)m->n_params * 4 / 1e6);
    memcpy(p, m->params, (size_t)m->n_params * sizeof(float));
    m->params = p;
    m->params_owned = 1;
    nv_weights_point(&m->w, &m->config, p);
    nv_file_unmap(&m->mapped);
    return NV_OK;
}

void nv_model_free(nv_model *m) {
    nv_model_free_plans(m);
    nv_model_drop_quant_sources(m);
    free(m->quant);
    if (m->params_owned) nv_reserve_free(m->params, (size_t)m->n_params * sizeof(float));
    nv_file_unmap(&m->mapped);
    free(m->cls_head);
    memset(m, 0, sizeof *m);
}
