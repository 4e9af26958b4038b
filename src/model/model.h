/* A Llama-family model: config, fp32 weights, and the engine plans built over them.
 *
 * Weights are a struct of pointers into one fp32 block, in the order of llama2.c's version-1
 * export (per-layer norms, final norm, embedding, wq, wk, wv, wo, w1, w2, w3 for all layers,
 * then the classifier when not shared, then Qwen3 q/k norms). The block is either a read-only
 * mapping of a checkpoint (v1: used in place) or owned memory (v0 files, whose order differs, and
 * freshly initialised models).
 *
 * Loaders check every size against the file length before reading anything, and validate the
 * config (nv_config_validate). A truncated, garbage or wrong-magic file is NV_EFORMAT. */
#ifndef NV_MODEL_H
#define NV_MODEL_H

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/file.h"
#include "base/half.h"
#include "engine/engine.h"
#include "model/config.h"

typedef struct {
    float *rms_att;   /* [L][dim] */
    float *rms_ffn;   /* [L][dim] */
    float *rms_final; /* [dim] */
    float *tok_emb;   /* [vocab][dim] */
    float *wq;        /* [L][q_dim][dim] */
    float *wk;        /* [L][kv_dim][dim] */
    float *wv;        /* [L][kv_dim][dim] */
    float *wo;        /* [L][dim][q_dim] */
    float *w1;        /* [L][E][hidden][dim] gate (E experts, 1 for a dense model) */
    float *w2;        /* [L][E][dim][hidden] down */
    float *w3;        /* [L][E][hidden][dim] up */
    float *wcls;      /* [vocab][dim]; == tok_emb when shared */
    float *q_norm;    /* [L][head_dim] (qk_norm only) */
    float *k_norm;    /* [L][head_dim] (qk_norm only) */
    float *bq;        /* [L][q_dim] (qkv_bias only) */
    float *bk;        /* [L][kv_dim] (qkv_bias only) */
    float *bv;        /* [L][kv_dim] (qkv_bias only) */
    float *router;    /* [L][n_experts][dim] (a mixture of experts only) */
    float *post_att;  /* [L][dim] (post_norms only) */
    float *post_ffn;  /* [L][dim] (post_norms only) */
    /* gpt-oss only (nv_config.gpt_oss): */
    float *sinks;     /* [L][n_heads] attention sink logits */
    float *bo;        /* [L][dim] output projection bias */
    float *router_b;  /* [L][n_experts] */
    float *b1;        /* [L][E][hidden] gate biases */
    float *b2;        /* [L][E][dim] down biases */
    float *b3;        /* [L][E][hidden] up biases */
} nv_weights;

typedef struct {
    nv_plan *wq, *wk, *wv, *wo, *w1, *w2, *w3; /* w1, w2, w3 NULL in a mixture of experts */
    nv_plan *router;                           /* the router's logits (exact fp32), or NULL */
    nv_plan **experts;                         /* [n_experts][3]: gate, down, up; or NULL */
} nv_layer_plans;

/* The block-quantized source of a plan matrix (a GGUF file's quantized tensor; see nv_qweights),
 * or, for an F16 or BF16 tensor, its values in h (bf16 when h_bf16; q, s, o NULL). */
typedef struct {
    int8_t *q;
    float *s, *o;
    int qb;
    uint16_t *h;
    int h_bf16;
    const int8_t *lut; /* NULL, or q's values are indices into these 16 (nv_qweights.lut: IQ4_NL, IQ4_XS, MXFP4) */
    int sub;           /* 0, or the k-quants' integer form of s and o beside them (nv_qweights.sub ...) */
    int8_t *sub_s, *sub_o;
    float *sup_s, *sup_o;
    size_t count;      /* values (rows x columns, rows whole blocks) */
    int pending;  /* its fp32 weights in params are not made yet (nv_model_load_quantized) */
    /* A GGUF file's matrix is kept as its blocks, raw (raw_bytes of ggml type raw_type, in the file's
       mapping: nv_model.source_maps), and made into q, s, o or h only while a plan is built from it
       (nv_qmatrix_materialize, then nv_qmatrix_release), so a loaded model holds its plans and not
       also every matrix decomposed; raw_heads, raw_hd, raw_rot: query or key rows to put in this
       project's RoPE order on the way (0: none; raw_rot of each head's raw_hd rows rotated). */
    const uint8_t *raw;
    size_t raw_bytes;
    uint32_t raw_type;
    int raw_heads, raw_hd, raw_rot;
} nv_qmatrix;

/* The fp32 weights of n values of a block-quantized matrix whose rows are whole blocks:
 * y = (float)q * s, then + o (a separate add), q looked up in lut first when there is one: the one
 * formula of every quantized type. */
static inline void nv_qmatrix_to_f32(const int8_t *q, const int8_t *lut, const float *s, const float *o, int qb, size_t n, float *y) {
    for (size_t i = 0; i < n; i++) {
        const float v = (float)(lut ? lut[q[i] & 15] : q[i]) * s[i / (size_t)qb];
        y[i] = o ? v + o[i / (size_t)qb] : v;
    }
}
/* Frees a source's arrays (q, s, o, h and the integer form), leaving its raw blocks. */
static inline void nv_qmatrix_free_arrays(nv_qmatrix *qm) {
    free(qm->q), free(qm->s), free(qm->o), free(qm->h), free(qm->sub_s), free(qm->sub_o), free(qm->sup_s), free(qm->sup_o);
    qm->q = NULL, qm->s = qm->o = NULL, qm->h = NULL, qm->sub = 0;
    qm->sub_s = qm->sub_o = NULL, qm->sup_s = qm->sup_o = NULL;
}

/* The fp32 weights of a plan matrix's source (its count values): fp16 or bf16 converted exactly, or
 * the block-quantized formula. */
static inline void nv_qmatrix_fill_f32(const nv_qmatrix *qm, float *y) {
    if (qm->h && qm->h_bf16)
        for (size_t i = 0; i < qm->count; i++) y[i] = nv_f32_from_bf16(qm->h[i]);
    else if (qm->h)
        for (size_t i = 0; i < qm->count; i++) y[i] = _cvtsh_ss(qm->h[i]);
    else
        nv_qmatrix_to_f32(qm->q, qm->lut, qm->s, qm->o, qm->qb, qm->count, y);
}

/* Plan matrices per layer in nv_model.quant, then the classifier at n_layers * NV_LAYER_MATRICES,
 * then, in a mixture of experts (whose layers leave w1, w2, w3 empty), each layer's experts' gate,
 * down and up matrices. */
#define NV_LAYER_MATRICES 7
static inline int nv_model_plan_count(const nv_config *c) {
    return c->n_layers * NV_LAYER_MATRICES + 1 + c->n_layers * c->n_experts * 3;
}
/* The plan matrix of expert e's part k (0 gate, 1 down, 2 up) in layer l. */
static inline int nv_model_expert_plan(const nv_config *c, int l, int e, int k) {
    return c->n_layers * NV_LAYER_MATRICES + 1 + (l * c->n_experts + e) * 3 + k;
}
/* Its inverse: expert plan matrix i's (past the classifier) layer, expert and part. */
static inline void nv_model_expert_of(const nv_config *c, int i, int *l, int *e, int *k) {
    const int x = i - c->n_layers * NV_LAYER_MATRICES - 1, E = c->n_experts > 0 ? c->n_experts : 1;
    *l = x / 3 / E, *e = x / 3 % E, *k = x % 3;
}

/* An embedding's pooling of the final norm's rows (llama.cpp's numbers: pooling_type): the mean
 * of them, the first (CLS) or the last (a decoder embedding model's: Qwen3-Embedding's). */
typedef enum { NV_POOLING_DEFAULT = 0, NV_POOLING_MEAN = 1, NV_POOLING_CLS = 2, NV_POOLING_LAST = 3 } nv_pooling;
/* The pooling "mean", "cls" or "last" names (-1 for another name). */
int nv_pooling_of(const char *name);

#define NV_MRL_DIMS 32 /* the most Matryoshka widths a model lists */

typedef struct {
    nv_config config;
    nv_weights w;
    float *params;        /* the whole block (owned or inside `mapped`) */
    uint64_t n_params;
    int params_owned;
    nv_mapped mapped;     /* the checkpoint mapping, when weights are used in place */
    nv_mapped *source_maps; /* a GGUF file's mappings (a split model's: each file's) while its matrices' raw blocks are plan sources */
    int n_source_maps;
    nv_engine_id engine;  /* engine the plans were asked for */
    nv_layer_plans *plans; /* [L], NULL until nv_model_build_plans */
    nv_plan *cls_plan;
    /* nv_model_plan_count entries ([L][NV_LAYER_MATRICES], the classifier, experts): block-quantized
       or 16-bit sources kept from a GGUF file or a folder (entries with neither raw, q nor h have
       none), or NULL. Plans on
       avx2/avx512 are built from them (kept as int8, the same bits as fp32 plans on w);
       nv_model_drop_quant_sources frees them once the plans are built. */
    nv_qmatrix *quant;
    /* Set by the callers that build plans once (generate, serve, chat, perplexity): each matrix's
       source is freed as soon as its plan holds it, so sources and plans never all sit in memory
       together (nv_model_drop_quant_sources at the end, matrix by matrix). */
    int drop_sources;
    /* Set by training with frozen weights (LoRA): a matrix's fp32 pages are given back
       (nv_mem_release) once its plan packs its own copy of it (every engine but scalar), so the
       weights are held once, as the plans, not twice; the token embedding (read row by row) stays.
       released counts the matrices let go: their fp32 values must not be read after (zeros, where
       the block is not a file's mapping). */
    int release_floats, released;
    uint64_t sources_hash; /* nv_model_sources_hash's, recorded before a source is dropped */
    int sources_hashed;
    /* A GGUF reranker's classification head (llama.cpp's cls.output.weight and .bias: Qwen3-Reranker's
       "yes" and "no" rows of its classifier), on the final norm's output: [n_cls_head][dim] then
       n_cls_head biases (zero without cls.output.bias); NULL: none */
    float *cls_head;
    int n_cls_head;
    /* How the file says an embedding pools a prompt's rows (nv_pooling: a GGUF's {arch}.pooling_type,
       a sentence-transformers folder's 1_Pooling); NV_POOLING_DEFAULT where it does not */
    int pooling;
    /* the folder says its embeddings may be cut to fewer dimensions (Matryoshka representation learning:
       config.json's is_matryoshka, or matryoshka_dimensions: the widths it was trained at, which alone
       a request may then ask, n_mrl_dims of them; 0: any) */
    int matryoshka;
    int mrl_dims[NV_MRL_DIMS];
    int n_mrl_dims;
} nv_model;

/* Points w at the parts of a params block laid out in version-1 order. */
void nv_weights_point(nv_weights *w, const nv_config *c, float *params);

/* Makes the weights writable: a model used in place from its file's read-only mapping gets a copy
 * of its own (the mapping released). */
nv_err nv_model_own_params(nv_model *m);
/* Frees the plans (nv_model_free and nv_model_build_plans call it). */
void nv_model_free_plans(nv_model *m);

/* Loads a llama2.c checkpoint: legacy v0 (7 int header, negative vocab = separate classifier)
 * or version 1 ("ak42" magic, fp32). */
nv_err nv_model_load(const char *path, nv_model *m);
/* For inference (generate, serve): as nv_model_load, but a GGUF file's quantized plan matrices
 * (not the token embedding) get no fp32 copy up front — their values in params stay zero, marked
 * pending, and nv_model_build_plans makes them only for a plan that cannot run block-quantized.
 * Such a model is for plans only: export, training and direct reads of m->w need nv_model_load. */
nv_err nv_model_load_quantized(const char *path, nv_model *m);
/* The config of a model file (llama2.c or GGUF) without converting its weights. */
nv_err nv_model_read_config(const char *path, nv_config *c);
/* A model with freshly allocated, zeroed weights of config c. */
nv_err nv_model_alloc(nv_model *m, const nv_config *c);
/* Random initialisation (normal(0, 0.02), residual projections scaled by 1/sqrt(2L), norms 1). */
void nv_model_init_random(nv_model *m, uint64_t seed);
/* Sparse upcycling: out (allocated) is the dense model made a mixture of `experts` experts, `used` a
 * token, each expert a copy of its layer's FFN and the routers normal(0, 0.02) from seed; every
 * other weight as it was. Its experts being equal, it computes what the dense model does (up to the
 * rounding of the weighted sum) until training sets them apart. */
nv_err nv_model_upcycle(const nv_model *dense, int experts, int used, uint64_t seed, nv_model *out);
/* Writes m as a llama2.c version-1 checkpoint, atomically (refused unless nv_config_fits_v1). */
nv_err nv_model_save_v1(const nv_model *m, const char *path);
/* 1 when llama2.c's version-1 format holds this shape: no QK-norm, head_dim x heads = dim, RoPE theta
 * 10000 and norm eps 1e-5 (the format has no field for them); otherwise GGUF does. */
int nv_config_fits_v1(const nv_config *c);
/* Builds one plan per weight matrix on engine e (falling down the ladder where e is off); a matrix
 * with a block-quantized source gets a block-quantized plan where the engine takes one. Plans built
 * before (on another engine) are freed first. */
nv_err nv_model_build_plans(nv_model *m, nv_engine_id e);
/* The built plan of plan matrix i (nv_model_plan_count's order); NULL for a mixture's empty dense
 * FFN slots. */
nv_plan *nv_model_plan(const nv_model *m, int i);
/* The engine the model's products run on once its plans are built: the layers' (the FFN down
 * projection and the classifier stay on bf16 tiles under an int8 engine), for messages and labels. */
nv_engine_id nv_model_engine(const nv_model *m);
/* Frees the block-quantized sources (m->quant) once the plans are built: the plans hold their own
 * packed copy. Later plan builds are then fp32, and fail for a matrix still pending. */
void nv_model_drop_quant_sources(nv_model *m);
/* A hash of the sources' contents (what a prefix cache keys a model's weights by): computed, or
   the one recorded before drop_sources dropped any. */
uint64_t nv_model_sources_hash(const nv_model *m);
/* A hash of the fp32 weights that are made (a pending matrix's are not: its source stands for it,
   and its never-written zeros are not read), from seed. */
uint64_t nv_model_weights_hash(const nv_model *m, uint64_t seed);
/* The same for one matrix's source (its fp32 weights then stand alone, e.g. after a LoRA merge). */
void nv_qmatrix_drop(nv_qmatrix *qm);
/* A raw source made into its q, s, o (or h) arrays (nothing to do when it has them or is not raw),
   and those freed again, the raw blocks kept (gguf.c, which reads the types). */
nv_err nv_qmatrix_materialize(nv_qmatrix *qm);
void nv_qmatrix_release(nv_qmatrix *qm);
/* What a source is, made or raw: {0 none, qb of int8 blocks, -1 fp16, -2 bf16; offsets; 4-bit values
 * (2: 4-bit indices into a table)}. */
void nv_qmatrix_kind(const nv_qmatrix *qm, int kind[3]);
void nv_model_free(nv_model *m);

#endif
