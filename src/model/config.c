#include "model/config.h"

#include <math.h>
#include <string.h>

#include "base/hash.h"

/* Generous bounds: large enough for any Llama-family model we can run, small enough that
 * products of two or three fields fit in 64 bits with room to spare. */
#define MAX_WIDTH (1 << 17)
#define MAX_LAYERS 1024
#define MAX_VOCAB (1 << 22)
#define MAX_SEQ (1 << 22)

/* YaRN's parameters in range; attn_factor 0 passes with default_attn (nv_config_rope_yarn then
 * computes it). */
static int yarn_in_range(const nv_rope_yarn *y, int default_attn) {
    return y->factor >= 1.0f && y->factor < 1e6f && y->orig_ctx >= 1 && y->beta_fast > y->beta_slow && y->beta_slow > 0.0f &&
           isfinite(y->beta_fast) && (y->attn_factor > 0.0f || (default_attn && y->attn_factor == 0.0f)) && y->attn_factor < 1e3f;
}

static nv_err yarn_range_fail(const nv_rope_yarn *y, const char *where) {
    return nv_fail(NV_EFORMAT, "%sYaRN's factor %g (1..1e6), original context %d, betas %g > %g > 0 or attention factor %g is out of range",
                   where, (double)y->factor, y->orig_ctx, (double)y->beta_fast, (double)y->beta_slow, (double)y->attn_factor);
}

nv_err nv_config_validate(const nv_config *c) {
#define BOUND(field, lo, hi)                                                                    \
    if (c->field < (lo) || c->field > (hi))                                                     \
        return nv_fail(NV_EFORMAT, "model config: " #field " = %d is outside [%d, %d]", c->field, \
                       (int)(lo), (int)(hi));
    BOUND(dim, 1, MAX_WIDTH);
    BOUND(hidden_dim, 1, MAX_WIDTH * 8);
    BOUND(n_layers, 1, MAX_LAYERS);
    BOUND(n_heads, 1, 4096);
    BOUND(n_kv_heads, 1, 4096);
    BOUND(head_dim, 2, 4096);
    BOUND(vocab_size, 1, MAX_VOCAB);
    BOUND(seq_len, 1, MAX_SEQ);
#undef BOUND
    if (c->n_heads % c->n_kv_heads != 0)
        return nv_fail(NV_EFORMAT, "model config: n_heads %d is not a multiple of n_kv_heads %d", c->n_heads,
                       c->n_kv_heads);
    if (c->head_dim % 2 != 0)
        return nv_fail(NV_EFORMAT, "model config: head_dim %d is odd (RoPE rotates pairs)", c->head_dim);
    if ((int64_t)c->n_heads * c->head_dim > MAX_WIDTH)
        return nv_fail(NV_EFORMAT, "model config: n_heads * head_dim is too large");
    if (!(c->rope_theta > 0.0f) || !isfinite(c->rope_theta))
        return nv_fail(NV_EFORMAT, "model config: rope theta must be positive");
    if (!(c->norm_eps > 0.0f) || !(c->norm_eps < 1.0f))
        return nv_fail(NV_EFORMAT, "model config: norm epsilon must be in (0, 1)");
    if (c->qkv_bias != 0 && c->qkv_bias != 1) return nv_fail(NV_EFORMAT, "model config: qkv_bias must be 0 or 1");
    if (c->qk_norm < 0 || c->qk_norm > NV_QK_NORM_WHOLE)
        return nv_fail(NV_EFORMAT, "model config: qk_norm must be 0, 1 (per head) or 2 (whole projections)");
    /* partial rotation names fewer values than the head's (the whole head is 0: one form of each config) */
    if (c->rope_dim != 0 && (c->rope_dim < 2 || c->rope_dim >= c->head_dim || c->rope_dim % 2 != 0))
        return nv_fail(NV_EFORMAT, "model config: RoPE on %d of a head's %d values (want an even count below it, or 0 for all)", c->rope_dim,
                       c->head_dim);
    const int pairs = nv_config_rope_dim(c) / 2;
    if (c->n_rope_factors != 0 && (c->n_rope_factors != pairs || c->n_rope_factors > NV_ROPE_FACTORS_MAX))
        return nv_fail(NV_EFORMAT, "model config: %d RoPE frequency factors for %d rotated values (want none or one per pair, at most %d)",
                       c->n_rope_factors, 2 * pairs, NV_ROPE_FACTORS_MAX);
    for (int i = 0; i < c->n_rope_factors; i++)
        if (!(c->rope_factors[i] > 0.0f) || !isfinite(c->rope_factors[i]) || (c->longrope_orig && !(c->rope_factors_short[i] > 0.0f)) ||
            !isfinite(c->rope_factors_short[i]))
            return nv_fail(NV_EFORMAT, "model config: RoPE frequency factor %d is %g (short set %g); they must be positive", i,
                           c->rope_factors[i], c->rope_factors_short[i]);
    if (c->longrope_orig < 0 || c->longrope_orig > MAX_SEQ ||
        (c->longrope_orig && (!c->n_rope_factors || c->yarn.factor != 0.0f || c->llama3.factor != 0.0f)))
        return nv_fail(NV_EFORMAT, "model config: LongRoPE's original context %d is out of range, or has no divisors or other scaling",
                       c->longrope_orig);
    if (c->n_experts != 0 && (c->n_experts < 1 || c->n_experts > NV_MOE_MAX_EXPERTS || c->n_experts_used < 1 || c->n_experts_used > c->n_experts))
        return nv_fail(NV_EFORMAT, "model config: %d experts, %d used per token (want 1..%d experts, 1..all of them used)", c->n_experts,
                       c->n_experts_used, NV_MOE_MAX_EXPERTS);
    if (c->n_experts == 0 && c->n_experts_used != 0)
        return nv_fail(NV_EFORMAT, "model config: %d experts used per token without experts", c->n_experts_used);
    const nv_rope_yarn *y = &c->yarn;
    if (y->factor != 0.0f && (!yarn_in_range(y, 0) || c->n_rope_factors != pairs)) return yarn_range_fail(y, "model config: ");
    const nv_rope_llama3 *l3 = &c->llama3;
    if (l3->factor != 0.0f && (!(l3->factor > 0.0f && l3->factor < 1e6f) || !(l3->low_freq_factor > 0.0f) ||
                               !(l3->high_freq_factor > l3->low_freq_factor) || !isfinite(l3->high_freq_factor) || l3->orig_ctx < 1 ||
                               c->n_rope_factors != pairs || y->factor != 0.0f))
        return nv_fail(NV_EFORMAT, "model config: Llama 3.1's RoPE rule (factor %g, low %g, high %g, original context %d) is out of range",
                       (double)l3->factor, (double)l3->low_freq_factor, (double)l3->high_freq_factor, l3->orig_ctx);
    if (c->rope_attn != 0.0f && (!(c->rope_attn > 0.0f && c->rope_attn < 1e3f) || y->factor != 0.0f))
        return nv_fail(NV_EFORMAT, "model config: RoPE's attention factor %g is out of range (0, 1000) or beside YaRN's", (double)c->rope_attn);
    if (c->swa_window < 0 || c->swa_window > MAX_SEQ || c->swa_period < 0 || c->swa_period > MAX_LAYERS ||
        (!c->swa_window && (c->swa_period || c->rope_theta_swa != 0.0f)) || !(c->rope_theta_swa >= 0.0f) || !isfinite(c->rope_theta_swa))
        return nv_fail(NV_EFORMAT, "model config: sliding window %d, period %d, RoPE base %g are out of range", c->swa_window,
                       c->swa_period, (double)c->rope_theta_swa);
    if ((c->ffn_gelu != 0 && c->ffn_gelu != 1) || (c->post_norms != 0 && c->post_norms != 1))
        return nv_fail(NV_EFORMAT, "model config: ffn_gelu and post_norms must be 0 or 1");
    if (c->post_norms && c->n_experts) return nv_fail(NV_EFORMAT, "model config: post-norms beside a mixture of experts");
    if ((c->no_pre_norms != 0 && c->no_pre_norms != 1) || (c->no_pre_norms && !c->post_norms))
        return nv_fail(NV_EFORMAT, "model config: no_pre_norms must be 0 or 1, and 1 only beside post-norms");
    if (c->nope_period < 0 || c->nope_period > MAX_LAYERS)
        return nv_fail(NV_EFORMAT, "model config: a RoPE-less layer every %d is out of range", c->nope_period);
    if (c->arch_mistral3 != 0 && c->arch_mistral3 != 1) return nv_fail(NV_EFORMAT, "model config: arch_mistral3 must be 0 or 1");
    if (c->gpt_oss != 0 && (c->gpt_oss != 1 || !c->n_experts || !c->qkv_bias || c->shared_classifier || c->post_norms || c->qk_norm))
        return nv_fail(NV_EFORMAT, "model config: gpt-oss's block goes with a mixture of experts, projection biases and its own classifier, "
                                   "without post-norms or QK-norm");
    if (!(c->attn_temp_scale >= 0.0f && c->attn_temp_scale <= 10.0f) || (c->attn_temp_scale != 0.0f && (c->attn_temp_len < 1 || c->attn_temp_len > (1 << 30))))
        return nv_fail(NV_EFORMAT, "model config: the attention temperature %g over %d positions is out of range", (double)c->attn_temp_scale,
                       c->attn_temp_len);
    const float scales[] = {c->emb_scale, c->attn_div, c->logit_softcap, c->attn_softcap, c->residual_scale, c->logit_div};
    for (int i = 0; i < 6; i++)
        if (!(scales[i] >= 0.0f && scales[i] < 1e6f))
            return nv_fail(NV_EFORMAT,
                           "model config: embedding scale %g, attention divisor %g, logit caps %g, %g, residual scale %g or logit divisor %g "
                           "are out of range [0, 1e6)",
                           (double)c->emb_scale, (double)c->attn_div, (double)c->logit_softcap, (double)c->attn_softcap,
                           (double)c->residual_scale, (double)c->logit_div);
    return NV_OK;
}

float nv_config_attn_div(const nv_config *c) { return c->attn_div != 0.0f ? c->attn_div : sqrtf((float)c->head_dim); }

const char *nv_config_gemma_block(const nv_config *c) {
    const int scales = !nv_config_granite(c) && (c->emb_scale != 0.0f || c->attn_div != 0.0f); /* Granite's own otherwise */
    if ((c->swa_window && !c->gpt_oss) || c->ffn_gelu || c->post_norms || scales || c->logit_softcap != 0.0f || c->attn_softcap != 0.0f)
        return "Gemma's block (GELU gating, scaled embeddings; Gemma 2 and 3's sliding attention window, post-norms, soft caps)";
    return NULL;
}

const char *nv_config_olmo2_block(const nv_config *c) {
    return c->no_pre_norms || c->qk_norm == NV_QK_NORM_WHOLE
               ? "OLMo 2's block (RMSNorm after the attention and the FFN instead of before, QK-norm over whole projections)"
               : NULL;
}

const char *nv_config_granite_block(const nv_config *c) {
    return nv_config_granite(c) ? "Granite's multipliers (embeddings, attention scores, residual branches, logits)" : NULL;
}

void nv_config_set_granite(nv_config *c, double embedding, double attention, double residual, double logits) {
    c->emb_scale = embedding == 1.0 ? 0.0f : (float)embedding;
    const float div = attention != 0.0 ? (float)(1.0 / attention) : 0.0f; /* a double's inverse: the float divisor it was written from */
    c->attn_div = div == sqrtf((float)c->head_dim) ? 0.0f : div;
    c->residual_scale = (float)residual;
    c->logit_div = (float)logits;
}

void nv_config_gemma(nv_config *c, int gen) {
    c->ffn_gelu = 1;
    c->emb_scale = sqrtf((float)c->dim);
    c->post_norms = gen >= 2;
    c->qk_norm = gen == 3;
}

double nv_yarn_mscale(double factor) { return factor <= 1 ? 1.0 : 0.1 * log(factor) + 1.0; }

/* The pair index at which a rotation makes `turns` turns over ctx positions (transformers'
 * find_correction_dim). */
static double yarn_dim(double turns, int head_dim, double theta, int ctx) {
    return head_dim * log(ctx / (turns * 2 * M_PI)) / (2 * log(theta));
}

nv_err nv_config_rope_yarn(nv_config *c, const nv_rope_yarn *y) {
    if (c->n_rope_factors) return nv_fail(NV_EUNSUPPORTED, "YaRN over other RoPE frequency factors is not supported");
    const int rot = nv_config_rope_dim(c); /* transformers' YaRN ramp spans the rotated values */
    NV_TRY(nv_config_rope_pairs_fit(c));
    if (!yarn_in_range(y, 1)) return yarn_range_fail(y, "");
    double lo = yarn_dim(y->beta_fast, rot, c->rope_theta, y->orig_ctx);
    double hi = yarn_dim(y->beta_slow, rot, c->rope_theta, y->orig_ctx);
    if (!y->no_truncate) lo = floor(lo), hi = ceil(hi);
    lo = fmax(lo, 0), hi = fmin(hi, rot - 1);
    if (lo == hi) hi += 0.001;
    c->n_rope_factors = rot / 2;
    for (int i = 0; i < c->n_rope_factors; i++) {
        /* the share of the frequency kept as it is: 1 for the fast pairs, 0 for the slow ones */
        const double keep = 1 - fmin(1, fmax(0, (i - lo) / (hi - lo)));
        c->rope_factors[i] = (float)(1 / ((1 - keep) / y->factor + keep));
    }
    c->yarn = *y;
    if (y->attn_factor == 0.0f) c->yarn.attn_factor = (float)nv_yarn_mscale(y->factor);
    return NV_OK;
}

nv_err nv_config_rope_pairs_fit(const nv_config *c) {
    if (nv_config_rope_dim(c) / 2 > NV_ROPE_FACTORS_MAX)
        return nv_fail(NV_EUNSUPPORTED, "RoPE frequency factors for %d rotated values (at most %d)", nv_config_rope_dim(c),
                       2 * NV_ROPE_FACTORS_MAX);
    return NV_OK;
}

nv_err nv_config_rope_linear(nv_config *c, float factor) {
    NV_TRY(nv_config_rope_pairs_fit(c));
    if (!c->n_rope_factors) {
        c->n_rope_factors = nv_config_rope_dim(c) / 2;
        for (int i = 0; i < c->n_rope_factors; i++) c->rope_factors[i] = 1.0f;
    }
    for (int i = 0; i < c->n_rope_factors; i++) c->rope_factors[i] *= factor;
    return NV_OK;
}

float nv_config_rope_mscale(const nv_config *c) {
    return c->yarn.factor != 0.0f ? c->yarn.attn_factor : c->rope_attn != 0.0f ? c->rope_attn : 1.0f;
}

uint64_t nv_config_rope_key(const nv_config *c) {
    uint64_t h = nv_checksum64(&c->rope_theta, sizeof c->rope_theta, (uint64_t)c->head_dim);
    const float mscale = nv_config_rope_mscale(c);
    if (mscale != 1.0f) h = nv_checksum64(&mscale, sizeof mscale, h);
    if (c->rope_theta_swa != 0.0f) h = nv_checksum64(&c->rope_theta_swa, sizeof c->rope_theta_swa, h ^ (uint64_t)c->swa_period << 32);
    if (c->nope_period) h = nv_checksum64(&c->nope_period, sizeof c->nope_period, h);
    if (c->rope_dim) h = nv_checksum64(&c->rope_dim, sizeof c->rope_dim, h);
    if (c->longrope_orig) /* the short set and where it ends */
        h = nv_checksum64(c->rope_factors_short, (size_t)c->n_rope_factors * sizeof(float), h ^ (uint64_t)c->longrope_orig << 20);
    return nv_checksum64(c->rope_factors, (size_t)c->n_rope_factors * sizeof(float), h ^ (uint64_t)c->n_rope_factors);
}

uint64_t nv_config_param_count(const nv_config *c) {
    uint64_t d = (uint64_t)c->dim, h = (uint64_t)c->hidden_dim, L = (uint64_t)c->n_layers;
    uint64_t q = (uint64_t)nv_config_q_dim(c), kv = (uint64_t)nv_config_kv_dim(c);
    /* a mixture of experts: each expert's three matrices and the router's row per expert */
    uint64_t per_layer = d * q + 2 * d * kv + q * d + 3 * d * h * (uint64_t)nv_config_ffn_sets(c) + (uint64_t)c->n_experts * d;
    if (!c->no_pre_norms) per_layer += 2 * d;
    if (c->qk_norm) per_layer += (uint64_t)nv_config_q_norm_len(c) + (uint64_t)nv_config_k_norm_len(c);
    if (c->qkv_bias) per_layer += q + 2 * kv;
    if (c->post_norms) per_layer += 2 * d;
    if (c->gpt_oss) per_layer += (uint64_t)c->n_heads + d + (uint64_t)c->n_experts * (1 + 2 * h + d); /* sinks, biases */
    uint64_t total = (uint64_t)c->vocab_size * d + L * per_layer + d;
    if (!c->shared_classifier) total += (uint64_t)c->vocab_size * d;
    return total;
}

typedef struct {
    const char *name;
    nv_config c;
} preset;

static const preset presets[] = {
    {"stories260K", {64, 172, 5, 8, 4, 8, 512, 512, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN}},
    {"stories15M", {288, 768, 6, 6, 6, 48, 32000, 256, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN}},
    {"stories42M", {512, 1376, 8, 8, 8, 64, 32000, 1024, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN}},
    {"stories110M", {768, 2048, 12, 12, 12, 64, 32000, 1024, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN}},
    {"qwen3-0.6B", {1024, 3072, 28, 16, 8, 128, 151936, 4096, 1000000.0f, 1e-6f, 1, 1, 0, {0}, 0, NV_CONFIG_PLAIN}},
    /* Gemma 3 270M's shape (its embedding scale, sqrt(dim), set below) */
    {"gemma3-270m", {640, 2048, 18, 4, 1, 256, 262144, 32768, 1000000.0f, 1e-6f, 1, 1, 0, {0}, 0, {0, 0, 0, 0, 0, 0}, {0, 0, 0, 0}, 0, 0, 0,
                     512, 6, 10000.0f, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, {0}, 0, 0, 0, 0, 0}},
};

nv_err nv_config_preset(const char *name, nv_config *c) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(name, presets[i].name) == 0) {
            *c = presets[i].c;
            if (c->ffn_gelu) nv_config_gemma(c, 3); /* gemma3-270m: its embedding scale */
            return NV_OK;
        }
    return nv_fail(NV_EINVAL, "unknown preset '%s' (known: %s)", name, nv_config_preset_names());
}

const char *nv_config_preset_names(void) { return "stories260K, stories15M, stories42M, stories110M, qwen3-0.6B, gemma3-270m"; }
