/* Model configuration for the Llama family, and the named presets.
 *
 * head_dim is dim / n_heads for llama2.c checkpoints; Qwen3-style models set it separately
 * (q_dim = n_heads * head_dim may differ from dim). nv_config_validate() is the single gate every
 * loader passes a config through: it bounds every field so that later size arithmetic cannot
 * overflow and every division is exact. */
#ifndef NV_CONFIG_H
#define NV_CONFIG_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

#define NV_ROPE_FACTORS_MAX 256 /* head sizes up to 512 */

/* YaRN's RoPE scaling, as transformers' rope_type "yarn" and llama.cpp's rope.scaling.type yarn
 * define it: the rotation frequencies blended between interpolated (divided by factor) and kept,
 * by a ramp over the pairs whose wavelengths fit orig_ctx between beta_fast and beta_slow turns,
 * and every cos and sin multiplied by attn_factor (the attention temperature). factor 0: none. */
typedef struct {
    float factor;
    int orig_ctx;
    float beta_fast, beta_slow;
    float attn_factor; /* the multiplier itself: 0.1 ln(factor) + 1 unless the model says otherwise */
    int no_truncate;   /* transformers' truncate false: the ramp's ends not rounded to whole pairs */
} nv_rope_yarn;
/* Llama 3.1's rule (transformers' rope_type "llama3"), kept beside the divisors it gives so that
 * config.json can say it again: factor 0 when the model has none (a GGUF file's rope_freqs tensor
 * gives the divisors alone). */
typedef struct {
    float factor, low_freq_factor, high_freq_factor;
    int orig_ctx;
} nv_rope_llama3;
/* nv_config's fields after qkv_bias left empty (no RoPE scaling, no experts), for positional
 * nv_config initializers */
#define NV_CONFIG_PLAIN {0, 0, 0, 0, 0, 0}, {0, 0, 0, 0}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, {0}, 0, 0, 0, 0, 0

typedef struct {
    int dim;          /* residual stream width */
    int hidden_dim;   /* SwiGLU inner width */
    int n_layers;
    int n_heads;      /* query heads */
    int n_kv_heads;   /* key/value heads (GQA when < n_heads) */
    int head_dim;     /* per-head width */
    int vocab_size;
    int seq_len;      /* maximum context */
    float rope_theta;
    float norm_eps;
    int shared_classifier; /* classifier weights are the token embedding */
    /* RMSNorm on the queries and keys before RoPE: 1 on each head (Qwen3, Gemma 3), NV_QK_NORM_WHOLE
     * on the whole query and key projections, a weight per value (OLMo 2); 0: none */
    int qk_norm;
    /* Llama 3.1+'s RoPE scaling (a GGUF file's rope_freqs tensor): 0, or head_dim / 2 divisors of the
     * rotation frequencies, one per pair */
    int n_rope_factors;
    float rope_factors[NV_ROPE_FACTORS_MAX];
    int qkv_bias; /* Qwen2: biases added to the query, key and value projections */
    nv_rope_yarn yarn; /* with YaRN, rope_factors are the divisors its blend gives (made by nv_config_rope_yarn) */
    nv_rope_llama3 llama3; /* with Llama 3.1's rule read from config.json, rope_factors are its divisors */
    /* A mixture of experts (Mixtral, Qwen3-MoE): every layer's FFN is n_experts SwiGLU experts of
     * hidden_dim, of which a router (softmax over its logits) picks the n_experts_used most probable
     * per token; their outputs are summed weighted by those probabilities renormalised to sum 1.
     * n_experts 0: the dense FFN. */
    int n_experts, n_experts_used; /* at most NV_MOE_MAX_EXPERTS */
    /* Every cos and sin multiplied by this outside YaRN (a GGUF file's rope.scaling.attn_factor, as
     * llama.cpp applies it to any model: Phi-3's LongRoPE, whose divisors are rope_factors); 0: 1 */
    float rope_attn;
    /* The Gemma family's departures from the Llama block (GGUF archs gemma, gemma2, gemma3), each 0
     * when absent. A sliding
     * window: in a windowed layer a query sees the swa_window positions up to and including its own
     * (llama.cpp's standard window); with swa_period, layer l sees the whole context when
     * l % swa_period == swa_period - 1 (Gemma 3: five windowed layers, then one global), else every
     * layer is windowed. rope_theta_swa: the windowed layers' RoPE base, without the others'
     * scaling. */
    int swa_window, swa_period;
    float rope_theta_swa;
    int ffn_gelu;        /* the FFN's gate through GELU (tanh form) instead of SiLU */
    int post_norms;      /* RMSNorm (weights post_att, post_ffn) on the attention's and the FFN's outputs before the residual */
    float emb_scale;     /* token embeddings multiplied by it on the way in (Gemma: sqrt(dim)) */
    float attn_div;      /* attention scores divided by it instead of sqrt(head_dim) */
    float logit_softcap; /* logits made cap * tanh(logits / cap) */
    float attn_softcap;  /* attention scores made cap * tanh(score / cap) before the softmax (Gemma 2) */
    /* SmolLM3's layers without RoPE: layer l rotates no query or key when (l + 1) % nope_period == 0
     * (every fourth); 0: every layer rotates */
    int nope_period;
    /* Granite's multipliers (GGUF granite and granitemoe, transformers' granite): the attention's and
     * the FFN's outputs multiplied by residual_scale before they join the residual stream, the logits
     * divided by logit_div; 0: neither. Its embedding multiplier is emb_scale, its attention
     * multiplier 1 / attn_div. */
    float residual_scale, logit_div;
    /* RoPE on the first rope_dim values of each query and key head, the rest passed through as they
     * are (transformers' partial_rotary_factor, a GGUF file's rope.dimension_count: Phi-4-mini rotates
     * 96 of 128); 0: the whole head. Frequency divisors are one per rotated pair. */
    int rope_dim;
    /* LongRoPE's two sets (Phi-3-128k, Phi-3.5, Phi-4-mini) when the context is past the original
     * one: positions below longrope_orig turn by these short divisors, the rest by rope_factors (the
     * long ones), as transformers and vLLM turn every sequence that fits the original context; 0:
     * rope_factors everywhere. */
    int longrope_orig;
    float rope_factors_short[NV_ROPE_FACTORS_MAX];
    /* OLMo 2's block: no RMSNorm before the attention and the FFN, which read the residual stream as
     * it is (post_norms then norm their outputs); 0: llama's norms before each */
    int no_pre_norms;
    /* Ministral 3's attention temperature (llama.cpp's mistral3 attention.temperature_scale,
     * transformers' llama_4_scaling_beta): a query at position p is multiplied by
     * 1 + attn_temp_scale * ln(1 + floor(p / attn_temp_len)), exactly 1 before attn_temp_len; 0: none */
    float attn_temp_scale;
    int attn_temp_len;
    /* 1: the model came as GGUF architecture mistral3 (Ministral 3, and Mistral Small 3.x and Magistral
     * as llama.cpp now converts them), which it is written back as, with or without the temperature */
    int arch_mistral3;
    /* OpenAI's gpt-oss block (GGUF architecture gpt-oss), with qkv_bias and a mixture of experts: a
     * learned sink logit per attention head (in each softmax's max and sum, weighing no value), a bias
     * on the output projection, the router's and every expert's biases (gate, up, down), the router's
     * softmax over the chosen experts' logits alone, and SwiGLU-OAI: min(g, 7) sigmoid(1.702 min(g, 7))
     * (clamp(u, -7, 7) + 1). 0: none of it */
    int gpt_oss;
} nv_config;

#define NV_QK_NORM_WHOLE 2

static inline int nv_config_q_dim(const nv_config *c) { return c->n_heads * c->head_dim; }
static inline int nv_config_kv_dim(const nv_config *c) { return c->n_kv_heads * c->head_dim; }
/* How many values QK-norm normalises together (and its weights per layer): a head, or the whole
 * query or key projection (OLMo 2). */
static inline int nv_config_q_norm_len(const nv_config *c) { return c->qk_norm == NV_QK_NORM_WHOLE ? nv_config_q_dim(c) : c->head_dim; }
static inline int nv_config_k_norm_len(const nv_config *c) { return c->qk_norm == NV_QK_NORM_WHOLE ? nv_config_kv_dim(c) : c->head_dim; }
/* How many values of each query and key head RoPE rotates (all but with partial rotation). */
static inline int nv_config_rope_dim(const nv_config *c) { return c->rope_dim ? c->rope_dim : c->head_dim; }
/* Whether layer l attends through the sliding window. */
static inline int nv_config_layer_windowed(const nv_config *c, int l) {
    return c->swa_window > 0 && (c->swa_period == 0 || l % c->swa_period != c->swa_period - 1);
}
/* Layer l's sliding window, or 0 when it sees the whole context. */
static inline int nv_config_layer_window(const nv_config *c, int l) { return nv_config_layer_windowed(c, l) ? c->swa_window : 0; }
/* The first position a query at position p sees through a window of `window` positions (0: none,
 * every position from 0). */
static inline int nv_window_start(int window, int p) { return window && p - window + 1 > 0 ? p - window + 1 : 0; }
/* How many layers attend through the sliding window. */
static inline int nv_config_windowed_layers(const nv_config *c) {
    int n = 0;
    for (int l = 0; l < c->n_layers; l++) n += nv_config_layer_windowed(c, l);
    return n;
}
/* Whether layer l rotates its queries and keys (SmolLM3's every fourth does not). */
static inline int nv_config_layer_roped(const nv_config *c, int l) { return !c->nope_period || (l + 1) % c->nope_period != 0; }
/* What Ministral 3's attention temperature multiplies a query at position p by (1 without it). */
static inline float nv_config_attn_temp(const nv_config *c, int p) {
    return c->attn_temp_scale != 0.0f ? 1.0f + c->attn_temp_scale * logf(1.0f + (float)(p / c->attn_temp_len)) : 1.0f;
}
/* Whether c has Granite's residual or logit multipliers. */
static inline int nv_config_granite(const nv_config *c) { return c->residual_scale != 0.0f || c->logit_div != 0.0f; }
/* What each branch is multiplied by before it joins the residual stream (1 but in Granite). */
static inline float nv_config_residual_scale(const nv_config *c) { return c->residual_scale != 0.0f ? c->residual_scale : 1.0f; }
/* What the logits are divided by (1 but in Granite). */
static inline float nv_config_logit_div(const nv_config *c) { return c->logit_div != 0.0f ? c->logit_div : 1.0f; }
/* What token embeddings are multiplied by (1 but in Gemma and Granite). */
static inline float nv_config_emb_scale(const nv_config *c) { return c->emb_scale != 0.0f ? c->emb_scale : 1.0f; }
/* What attention scores are divided by: sqrt(head_dim) unless the model says otherwise. */
float nv_config_attn_div(const nv_config *c);
/* NULL, or the Gemma family's parts the model has, named: the llama2.c writer refuses them with this
 * (GGUF and Hugging Face folders write the architectures that hold them). A Granite model's scaled
 * embeddings and score divisor are its own (nv_config_granite_block), not Gemma's. */
const char *nv_config_gemma_block(const nv_config *c);
/* NULL, or OLMo 2's parts named when c has them: no norms before the attention and the FFN, QK-norm
 * over whole projections (the llama2.c writer refuses them with this). */
const char *nv_config_olmo2_block(const nv_config *c);
/* Granite's four multipliers, as its files give them (attention: the scores' factor, 0 for none), on c:
 * an embedding factor of 1 and a score factor of 1 / sqrt(head_dim) are stored as none, so that a
 * file written from c reads back as c. */
void nv_config_set_granite(nv_config *c, double embedding, double attention, double residual, double logits);
/* NULL, or Granite's multipliers named, when c has them (the llama2.c writer refuses them too). */
const char *nv_config_granite_block(const nv_config *c);
/* The block every Gemma generation gen (1, 2, 3) has, on c: GELU gating, embeddings times sqrt(dim);
 * post-norms from Gemma 2, QK-norm in Gemma 3. Its window, divisor and caps are the file's to say. */
void nv_config_gemma(nv_config *c, int gen);

nv_err nv_config_validate(const nv_config *c);
/* A key of what sets RoPE's angles (theta, head size, frequency factors): states made for one
 * config keep it to refuse a model that rotates differently. */
/* Whether c's rotated pairs fit the table of frequency divisors (an error saying so, or NV_OK). */
nv_err nv_config_rope_pairs_fit(const nv_config *c);
/* Linear RoPE scaling (positions divided by factor): every frequency's divisor multiplied by it
 * (all of them factor when there were none). */
nv_err nv_config_rope_linear(nv_config *c, float factor);
/* YaRN scaling (y->attn_factor 0: transformers' default, 0.1 ln(factor) + 1): the divisors of its
 * blend into rope_factors and y kept in c->yarn (refused over other RoPE factors). */
nv_err nv_config_rope_yarn(nv_config *c, const nv_rope_yarn *y);
/* transformers' and llama.cpp's YaRN attention multiplier for a factor: 0.1 ln(factor) + 1 (1 when factor <= 1). */
double nv_yarn_mscale(double factor);
uint64_t nv_config_rope_key(const nv_config *c);
/* What every cos and sin of RoPE is multiplied by: YaRN's attention factor, else rope_attn, else 1. */
float nv_config_rope_mscale(const nv_config *c);
/* The most experts a layer may have (and so use per token). */
#define NV_MOE_MAX_EXPERTS 1024
#define NV_MOE_MAX_USED NV_MOE_MAX_EXPERTS

/* The FFN matrices of a layer: n_experts sets of w1, w2, w3 (one for a dense model). */
static inline int nv_config_ffn_sets(const nv_config *c) { return c->n_experts > 0 ? c->n_experts : 1; }
/* Number of fp32 parameters (the classifier counted once when shared). */
uint64_t nv_config_param_count(const nv_config *c);

/* Fills c with a named preset (stories260K, stories15M, stories42M, stories110M, qwen3-0.6B, gemma3-270m). */
nv_err nv_config_preset(const char *name, nv_config *c);
/* Comma-separated preset names, for usage messages. */
const char *nv_config_preset_names(void);

#endif
