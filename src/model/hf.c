#include "model/hf.h"

#include <cjson/cJSON.h>
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "base/log.h"

#define HF_MAX_SHARDS 256
#define HF_PATH 4200

/* ---- paths and JSON files ------------------------------------------------------------------ */

/* The file `name` in the folder of path. */
static const char *sibling(const char *path, const char *name, char *buf, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (slash) snprintf(buf, cap, "%.*s/%s", (int)(slash - path), path, name);
    else snprintf(buf, cap, "%s", name);
    return buf;
}

int nv_hf_is_model(const char *path) {
    const char *slash = strrchr(path, '/');
    return !strcmp(slash ? slash + 1 : path, "config.json");
}

int nv_hf_is_json(const void *data, size_t len) {
    const unsigned char *p = data;
    size_t i = 0;
    if (len >= 3 && p[0] == 0xEF && p[1] == 0xBB && p[2] == 0xBF) i = 3; /* a byte order mark */
    while (i < len && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r')) i++;
    return i < len && p[i] == '{';
}

/* A JSON object from path; with optional, a missing file is *out NULL. */
static nv_err json_file(const char *path, int optional, cJSON **out) {
    *out = NULL;
    if (optional && !nv_file_exists(path)) return NV_OK;
    char *text;
    size_t len;
    NV_TRY(nv_file_read_all(path, &text, &len));
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return nv_fail(NV_EFORMAT, "%s: not a JSON object", path);
    }
    *out = j;
    return NV_OK;
}

static const cJSON *field(const cJSON *o, const char *key) { return cJSON_GetObjectItemCaseSensitive(o, key); }
static int absent(const cJSON *v) { return !v || cJSON_IsNull(v); }

/* A whole number in [lo, hi] at key (dflt when absent; required: absent is an error). */
static nv_err get_whole(const char *path, const cJSON *o, const char *key, int64_t dflt, int required, int64_t lo, int64_t hi,
                        int64_t *out) {
    const cJSON *v = field(o, key);
    if (absent(v)) {
        if (required) return nv_fail(NV_EFORMAT, "%s: '%s' is missing", path, key);
        *out = dflt;
        return NV_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < (double)lo || v->valuedouble > (double)hi)
        return nv_fail(NV_EFORMAT, "%s: '%s' is not a whole number in [%lld, %lld]", path, key, (long long)lo, (long long)hi);
    *out = (int64_t)v->valuedouble;
    return NV_OK;
}

static nv_err get_real(const char *path, const cJSON *o, const char *key, double dflt, double *out) {
    const cJSON *v = field(o, key);
    if (absent(v)) {
        *out = dflt;
        return NV_OK;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return nv_fail(NV_EFORMAT, "%s: '%s' is not a number", path, key);
    *out = v->valuedouble;
    return NV_OK;
}

/* A bool at key: 1/0, dflt when absent. */
static nv_err get_flag(const char *path, const cJSON *o, const char *key, int dflt, int *out) {
    const cJSON *v = field(o, key);
    if (absent(v)) *out = dflt;
    else if (cJSON_IsBool(v)) *out = cJSON_IsTrue(v);
    else return nv_fail(NV_EFORMAT, "%s: '%s' is not true or false", path, key);
    return NV_OK;
}

static const char *str_of(const cJSON *v) { return cJSON_IsString(v) ? v->valuestring : NULL; }

/* ---- config.json ----------------------------------------------------------------------------- */

/* transformers' YaRN: factor, original_max_position_embeddings (default the model's context),
 * beta_fast and beta_slow (32, 1), truncate (true), and the attention factor: attention_factor when
 * given, else mscale / mscale_all_dim's ratio of 0.1 m ln(factor) + 1 when both are, else
 * 0.1 ln(factor) + 1. */
static nv_err yarn_params(const char *path, const cJSON *rs, int64_t ctx, nv_config *c) {
    double factor, orig, fast, slow, attn, ms, ms_all;
    int truncate;
    NV_TRY(get_real(path, rs, "factor", 0.0, &factor));
    NV_TRY(get_real(path, rs, "original_max_position_embeddings", (double)ctx, &orig));
    NV_TRY(get_real(path, rs, "beta_fast", 32.0, &fast));
    NV_TRY(get_real(path, rs, "beta_slow", 1.0, &slow));
    NV_TRY(get_real(path, rs, "attention_factor", 0.0, &attn));
    NV_TRY(get_real(path, rs, "mscale", 0.0, &ms));
    NV_TRY(get_real(path, rs, "mscale_all_dim", 0.0, &ms_all));
    NV_TRY(get_flag(path, rs, "truncate", 1, &truncate));
    if (!(factor >= 1 && factor < 1e6) || !(orig >= 1 && orig <= (1 << 30)) || orig != floor(orig) || attn < 0)
        return nv_fail(NV_EFORMAT, "%s: rope_scaling's yarn factor %g or original_max_position_embeddings %g is out of range", path,
                       factor, orig);
    if (attn == 0 && ms > 0 && ms_all > 0) {
        const double l = factor <= 1 ? 0 : log(factor);
        attn = (0.1 * ms * l + 1) / (0.1 * ms_all * l + 1);
    }
    const nv_rope_yarn y = {(float)factor, (int)orig, (float)fast, (float)slow, (float)attn, !truncate};
    if (nv_config_rope_yarn(c, &y) != NV_OK) return nv_fail(NV_EFORMAT, "%s: rope_scaling: %s", path, nv_errmsg());
    return NV_OK;
}

/* Llama 3.1's rule for the rotation frequencies (what llama.cpp's converter stores as
 * rope_freqs): long wavelengths divided by factor, short ones kept, a smooth blend between. */
static nv_err llama3_factors(const char *path, const cJSON *rs, nv_config *c) {
    double factor, low, high, old_ctx;
    NV_TRY(get_real(path, rs, "factor", 8.0, &factor));
    NV_TRY(get_real(path, rs, "low_freq_factor", 1.0, &low));
    NV_TRY(get_real(path, rs, "high_freq_factor", 4.0, &high));
    NV_TRY(get_real(path, rs, "original_max_position_embeddings", 8192.0, &old_ctx));
    if (!(factor > 0 && factor < 1e6) || low <= 0 || high <= low || !(old_ctx >= 1 && old_ctx <= (1 << 30)) || old_ctx != floor(old_ctx))
        return nv_fail(NV_EFORMAT, "%s: rope_scaling's llama3 factors are out of range", path);
    if (nv_config_rope_pairs_fit(c) != NV_OK) return nv_fail(NV_EUNSUPPORTED, "%s: %s", path, nv_errmsg());
    const double low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
    const int rot = nv_config_rope_dim(c);
    c->n_rope_factors = rot / 2;
    for (int i = 0; i < c->n_rope_factors; i++) {
        const float freq = 1.0f / powf(c->rope_theta, (float)(2 * i) / (float)rot);
        const double wavelen = 2 * M_PI / freq;
        double f;
        if (wavelen < high_wavelen) f = 1.0;
        else if (wavelen > low_wavelen) f = factor;
        else {
            const double smooth = (old_ctx / wavelen - low) / (high - low);
            f = 1.0 / ((1 - smooth) / factor + smooth);
        }
        c->rope_factors[i] = (float)f;
    }
    c->llama3 = (nv_rope_llama3){(float)factor, (float)low, (float)high, (int)old_ctx};
    return NV_OK;
}

/* Phi-3's LongRoPE (rope_scaling type longrope; "su" in early folders): a divisor per rotated pair,
 * short_factor below original_max_position_embeddings and, when the model's context goes past it,
 * long_factor there (nv_config.longrope_orig; as the GGUF reader reads them), and every cos and sin
 * times attention_factor, by default sqrt(1 + ln(s) / ln(original)) for s = context / original > 1
 * (transformers' and llama.cpp's). */
static nv_err longrope_factors(const char *path, const cJSON *j, const cJSON *rs, nv_config *c) {
    int64_t orig;
    const char *key = "original_max_position_embeddings";
    NV_TRY(get_whole(path, absent(field(j, key)) ? rs : j, key, c->seq_len, 0, 1, 1 << 30, &orig));
    const int n = nv_config_rope_dim(c) / 2; /* one per rotated pair (Phi-4-mini: 48 for 96 of 128 values) */
    if (nv_config_rope_pairs_fit(c) != NV_OK) return nv_fail(NV_EUNSUPPORTED, "%s: %s", path, nv_errmsg());
    const int both = c->seq_len > orig;
    for (int k = 0; k <= both; k++) { /* short, then long */
        const char *set = k ? "long_factor" : "short_factor";
        const cJSON *list = field(rs, set), *f;
        if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) != n)
            return nv_fail(NV_EFORMAT, "%s: rope_scaling's %s is not a list of %d factors", path, set, n);
        int i = 0;
        cJSON_ArrayForEach(f, list) {
            if (!cJSON_IsNumber(f) || !(f->valuedouble > 0 && f->valuedouble < 1e6))
                return nv_fail(NV_EFORMAT, "%s: rope_scaling's %s[%d] is out of range", path, set, i);
            c->rope_factors[i++] = (float)f->valuedouble;
        }
        if (both && !k) memcpy(c->rope_factors_short, c->rope_factors, sizeof c->rope_factors_short);
    }
    c->n_rope_factors = n;
    c->longrope_orig = both ? (int)orig : 0;
    const double scale = (double)c->seq_len / (double)orig;
    double attn = scale > 1 ? sqrt(1 + log(scale) / log((double)orig)) : 1.0;
    if (!absent(field(rs, "attention_factor"))) NV_TRY(get_real(path, rs, "attention_factor", 1.0, &attn));
    if (!(attn > 0 && attn < 1e3)) return nv_fail(NV_EFORMAT, "%s: LongRoPE's attention factor %g is out of range", path, attn);
    if ((float)attn != 1.0f) c->rope_attn = (float)attn;
    return NV_OK;
}

/* A soft cap at key: its value (> 0), 0 for null, dflt when the key is missing. */
static nv_err get_cap(const char *path, const cJSON *j, const char *key, double dflt, float *out) {
    const cJSON *v = field(j, key);
    double cap = dflt;
    if (v && !cJSON_IsNull(v)) NV_TRY(get_real(path, j, key, dflt, &cap));
    else if (v) cap = 0;
    if (!(cap >= 0 && cap < 1e6)) return nv_fail(NV_EFORMAT, "%s: '%s' is out of range", path, key);
    *out = (float)cap;
    return NV_OK;
}

/* The period of a per-layer list whose layers are `other`, then one `last` (Gemma's layer_types,
 * SmolLM3's no_rope_layers), as nv_config keeps such patterns: the layer after the first `last`
 * entry, checked against each of the first n entries; 0 when none is `last`, -1 when the list is
 * not such a pattern. */
static int list_period(const cJSON *list, int n, int (*last)(const cJSON *), int (*other)(const cJSON *)) {
    int period = 0;
    for (int l = 0; l < n && !period; l++)
        if (last(cJSON_GetArrayItem(list, l))) period = l + 1;
    for (int l = 0; l < n; l++)
        if (!(period && l % period == period - 1 ? last : other)(cJSON_GetArrayItem(list, l))) return -1;
    return period;
}

static int named(const cJSON *v, const char *name) { return str_of(v) && !strcmp(str_of(v), name); }
static int full_layer(const cJSON *v) { return named(v, "full_attention"); }
static int sliding_layer(const cJSON *v) { return named(v, "sliding_attention"); }
/* no_rope_layers' flags: 1 where the layer rotates */
static int unroped_layer(const cJSON *v) { return cJSON_IsNumber(v) && v->valuedouble == 0; }
static int roped_layer(const cJSON *v) { return cJSON_IsNumber(v) && v->valuedouble == 1; }

/* The period of the sliding window's layers that layer_types names, into *period (unchanged when
 * there is none). */
static nv_err layer_types_period(const char *path, const cJSON *j, int layers, int64_t *period) {
    const cJSON *types = field(j, "layer_types");
    if (absent(types)) return NV_OK;
    if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != layers)
        return nv_fail(NV_EFORMAT, "%s: 'layer_types' is not a list of %d layer types", path, layers);
    if ((*period = list_period(types, layers, full_layer, sliding_layer)) < 0)
        return nv_fail(NV_EUNSUPPORTED, "%s: layer_types is not a repeating pattern of sliding layers, then one full", path);
    return NV_OK;
}

/* The Gemma family's block from config.json (transformers' names; generation gen 1, 2, 3): GELU,
 * embeddings times sqrt(hidden_size); Gemma 2 and 3: post-norms, the scores divided by
 * sqrt(query_pre_attn_scalar), a sliding window on the layers layer_types names (by default Gemma
 * 2's every other, from the first; Gemma 3's five of every sliding_window_pattern = 6), as
 * nv_config's period form; Gemma 2's soft caps (30 and 50 when missing, none when null); Gemma 3:
 * the windowed layers' RoPE base rope_local_base_freq (10000), the logits' cap when given. */
static nv_err gemma_block(const char *path, const cJSON *j, int gen, nv_config *c) {
    nv_config_gemma(c, gen);
    if (gen == 1) return NV_OK;
    int64_t window, period = gen == 2 ? 2 : 6, qpas;
    NV_TRY(get_whole(path, j, "sliding_window", 4096, 0, 1, 1 << 30, &window));
    NV_TRY(get_whole(path, j, "query_pre_attn_scalar", c->head_dim, 0, 1, 1 << 30, &qpas));
    if (gen == 3) NV_TRY(get_whole(path, j, "sliding_window_pattern", 6, 0, 1, 1 << 20, &period));
    NV_TRY(layer_types_period(path, j, c->n_layers, &period));
    c->swa_window = (int)window;
    c->swa_period = (int)period;
    if (qpas != c->head_dim) c->attn_div = sqrtf((float)qpas);
    if (gen == 3) {
        double local;
        NV_TRY(get_real(path, j, "rope_local_base_freq", 10000.0, &local));
        if (!(local > 0)) return nv_fail(NV_EFORMAT, "%s: 'rope_local_base_freq' is out of range", path);
        c->rope_theta_swa = (float)local;
    }
    NV_TRY(get_cap(path, j, "final_logit_softcapping", gen == 2 ? 30.0 : 0.0, &c->logit_softcap));
    return get_cap(path, j, "attn_logit_softcapping", gen == 2 ? 50.0 : 0.0, &c->attn_softcap);
}

/* OLMo 2's block (olmo2, olmo3: generation gen): no norm before the attention and the FFN, their
 * outputs normed (post_attention_layernorm, post_feedforward_layernorm), QK-norm over the whole query
 * and key projections; OLMo 3's sliding window on the layers layer_types names (by default three of
 * every four), their RoPE the model's base without its scaling. */
static nv_err olmo_block(const char *path, const cJSON *j, int gen, nv_config *c) {
    c->qk_norm = NV_QK_NORM_WHOLE, c->post_norms = 1, c->no_pre_norms = 1;
    if (gen == 2) return NV_OK;
    int64_t window, period = 4;
    NV_TRY(get_whole(path, j, "sliding_window", 4096, 0, 1, 1 << 30, &window));
    NV_TRY(layer_types_period(path, j, c->n_layers, &period));
    c->swa_window = (int)window, c->swa_period = (int)period, c->rope_theta_swa = c->rope_theta;
    return NV_OK;
}

/* SmolLM3's layers without RoPE as nv_config's period: no_rope_layers (1: the layer rotates, 0: it
 * does not; transformers' name says the opposite of its values) must be a 0 every period-th layer
 * and 1 elsewhere; without it, no_rope_layer_interval (4) is that period. */
static nv_err smollm3_nope(const char *path, const cJSON *j, nv_config *c) {
    int64_t period;
    NV_TRY(get_whole(path, j, "no_rope_layer_interval", 4, 0, 1, 1 << 20, &period));
    const cJSON *list = field(j, "no_rope_layers");
    if (!absent(list)) {
        if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) < c->n_layers)
            return nv_fail(NV_EFORMAT, "%s: 'no_rope_layers' is not a list of %d flags", path, c->n_layers);
        if ((period = list_period(list, c->n_layers, unroped_layer, roped_layer)) < 0)
            return nv_fail(NV_EUNSUPPORTED, "%s: no_rope_layers is not a repeating pattern of rotated layers, then one without", path);
    }
    c->nope_period = (int)period;
    return NV_OK;
}

/* Granite's multipliers (transformers' names, each 1 when missing): the scores are multiplied by
 * attention_multiplier (not divided by sqrt(head_dim)), the embeddings by embedding_multiplier, each
 * branch by residual_multiplier before it joins the residual, and the logits divided by logits_scaling. */
static nv_err granite_scales(const char *path, const cJSON *j, nv_config *c) {
    static const char *const keys[4] = {"embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling"};
    double m[4];
    for (int i = 0; i < 4; i++) {
        NV_TRY(get_real(path, j, keys[i], 1.0, &m[i]));
        if (!(m[i] > 0 && m[i] < 1e6)) return nv_fail(NV_EFORMAT, "%s: '%s' is out of range (0, 1e6)", path, keys[i]);
    }
    nv_config_set_granite(c, m[0], m[1], m[2], m[3]);
    return NV_OK;
}

/* How a folder keeps its tensors beyond llama's names: a mixture's experts as Mixtral's
 * (block_sparse_moe.experts.E.w1/w2/w3; else Qwen3-MoE's mlp.experts.E.*), fused per layer
 * (GraniteMoe's), the attention's and FFN's projections fused (Phi-3's): st_unfuse. */
enum { HF_MIXTRAL_NAMES = 1, HF_FUSED_EXPERTS = 2, HF_FUSED_PROJ = 4 };

/* The config of config.json j; *tied says whether the classifier is the embedding, *kept how the
 * tensors are kept (HF_MIXTRAL_NAMES, ...). */
static nv_err config_of(const char *path, const cJSON *j, nv_config *c, int *tied, int *kept) {
    memset(c, 0, sizeof *c);
    const char *type = str_of(field(j, "model_type"));
    if (!type) {
        const cJSON *arch = field(j, "architectures");
        const char *a = cJSON_IsArray(arch) ? str_of(cJSON_GetArrayItem(arch, 0)) : NULL;
        type = !a                                  ? NULL
               : !strcmp(a, "LlamaForCausalLM")   ? "llama"
               : !strcmp(a, "MistralForCausalLM") ? "mistral"
               : !strcmp(a, "Qwen2ForCausalLM")   ? "qwen2"
               : !strcmp(a, "Qwen3ForCausalLM")   ? "qwen3"
               : !strcmp(a, "MixtralForCausalLM") ? "mixtral"
               : !strcmp(a, "Qwen3MoeForCausalLM") ? "qwen3_moe"
               : !strcmp(a, "SmolLM3ForCausalLM") ? "smollm3"
               : !strcmp(a, "GraniteForCausalLM") ? "granite"
               : !strcmp(a, "GraniteMoeForCausalLM") ? "granitemoe"
               : !strcmp(a, "Phi3ForCausalLM")    ? "phi3"
               : !strcmp(a, "Olmo2ForCausalLM")   ? "olmo2"
               : !strcmp(a, "Olmo3ForCausalLM")   ? "olmo3"
                                                  : a;
    }
    if (!type) return nv_fail(NV_EFORMAT, "%s: neither 'model_type' nor 'architectures' names the model", path);
    const int mix = !strcmp(type, "mixtral"), qwen3_moe = !strcmp(type, "qwen3_moe");
    const int llama = !strcmp(type, "llama"), mistral = !strcmp(type, "mistral") || mix, qwen2 = !strcmp(type, "qwen2"),
              qwen3 = !strcmp(type, "qwen3") || qwen3_moe;
    const int gemma = !strcmp(type, "gemma") ? 1 : !strcmp(type, "gemma2") ? 2 : !strcmp(type, "gemma3_text") ? 3 : 0;
    const int smollm3 = !strcmp(type, "smollm3"); /* llama's block, some layers without RoPE */
    const int granitemoe = !strcmp(type, "granitemoe"); /* Granite's block with experts, fused per layer */
    const int granite = !strcmp(type, "granite") || granitemoe; /* llama's block with four multipliers */
    const int phi3 = !strcmp(type, "phi3"); /* llama's block, its projections fused */
    const int olmo = !strcmp(type, "olmo2") ? 2 : !strcmp(type, "olmo3") ? 3 : 0; /* norms after the branches, not before */
    char shown[128];
    if (!strcmp(type, "gemma3")) /* the vision-language folder: its text model nests in text_config, its weights under language_model */
        return nv_fail(NV_EUNSUPPORTED, "%s: Gemma 3's vision-language folder (model_type gemma3) is not read: its text model's GGUF "
                                        "file is, or a gemma3_text folder (270M, 1B)", path);
    if (!llama && !mistral && !qwen2 && !qwen3 && !gemma && !smollm3 && !granite && !phi3 && !olmo)
        return nv_fail(NV_EUNSUPPORTED,
                       "%s: model type '%s' is not supported (llama, mistral, mixtral, qwen2, qwen3, qwen3_moe, gemma, gemma2, gemma3_text, "
                       "smollm3, granite, granitemoe, phi3, olmo2, olmo3)",
                       path, nv_gguf_shown(type, strlen(type), shown, sizeof shown));
    *kept = mix ? HF_MIXTRAL_NAMES : granitemoe ? HF_MIXTRAL_NAMES | HF_FUSED_EXPERTS : phi3 ? HF_FUSED_PROJ : 0;
    /* Gemma's GELU is the tanh form (gelu_pytorch_tanh; Gemma 1's "gelu" runs as that too, in
       transformers and llama.cpp), named hidden_activation (hidden_act in Gemma 1's folders) */
    const char *act_key = gemma && !absent(field(j, "hidden_activation")) ? "hidden_activation" : "hidden_act";
    const char *act = str_of(field(j, act_key));
    if (absent(field(j, act_key)) ? 0
        : !act ? 1
        : gemma ? strcmp(act, "gelu_pytorch_tanh") && strcmp(act, "gelu") && strcmp(act, "gelu_new")
                : strcmp(act, "silu"))
        return nv_fail(NV_EUNSUPPORTED, "%s: %s '%s' is not supported (%s)", path, act_key,
                       act ? nv_gguf_shown(act, strlen(act), shown, sizeof shown) : "?", gemma ? "gelu_pytorch_tanh" : "silu");
    double rotary = 1.0; /* Phi-4-mini rotates three quarters of each head (a phi3 folder; transformers' llama would not) */
    NV_TRY(get_real(path, j, "partial_rotary_factor", 1.0, &rotary));
    if (rotary != 1.0 && !phi3)
        return nv_fail(NV_EUNSUPPORTED, "%s: RoPE on part of each head (partial_rotary_factor %g) outside a phi3 model", path, rotary);
    if (!(rotary > 0.0 && rotary <= 1.0)) return nv_fail(NV_EFORMAT, "%s: partial_rotary_factor %g is out of range (0, 1]", path, rotary);
    const int64_t lim = 1 << 30;
    int64_t dim, hidden, layers, heads, kv_heads, head_dim, vocab, ctx;
    NV_TRY(get_whole(path, j, "hidden_size", 0, 1, 1, lim, &dim));
    /* a mixture of experts: Mixtral's and GraniteMoe's experts are intermediate_size wide, Qwen3-MoE's
       moe_intermediate_size; all renormalise the chosen experts' weights (GraniteMoe takes the softmax
       of the chosen logits, the same; Qwen3-MoE when norm_topk_prob says so: refused otherwise) */
    int64_t experts = 0, used = 0;
    if (mix || qwen3_moe || granitemoe) {
        NV_TRY(get_whole(path, j, qwen3_moe ? "num_experts" : "num_local_experts", 0, 1, 1, 1024, &experts));
        NV_TRY(get_whole(path, j, "num_experts_per_tok", 0, 1, 1, experts, &used));
    }
    if (qwen3_moe) {
        int norm = 0;
        int64_t step;
        const cJSON *dense = field(j, "mlp_only_layers");
        NV_TRY(get_flag(path, j, "norm_topk_prob", 0, &norm));
        NV_TRY(get_whole(path, j, "decoder_sparse_step", 1, 0, 1, lim, &step));
        if (!norm || step != 1 || (!absent(dense) && (!cJSON_IsArray(dense) || cJSON_GetArraySize(dense) > 0)))
            return nv_fail(NV_EUNSUPPORTED, "%s: experts' weights not renormalised (norm_topk_prob false) or dense layers among the "
                                            "experts' (decoder_sparse_step, mlp_only_layers) are not supported", path);
    }
    NV_TRY(get_whole(path, j, qwen3_moe ? "moe_intermediate_size" : "intermediate_size", 0, 1, 1, lim, &hidden));
    NV_TRY(get_whole(path, j, "num_hidden_layers", 0, 1, 1, lim, &layers));
    NV_TRY(get_whole(path, j, "num_attention_heads", 0, 1, 1, lim, &heads));
    NV_TRY(get_whole(path, j, "num_key_value_heads", heads, 0, 1, lim, &kv_heads));
    if (dim % heads && absent(field(j, "head_dim")))
        return nv_fail(NV_EFORMAT, "%s: hidden_size %lld is not a multiple of num_attention_heads %lld", path, (long long)dim,
                       (long long)heads);
    NV_TRY(get_whole(path, j, "head_dim", dim / heads, 0, 1, lim, &head_dim));
    NV_TRY(get_whole(path, j, "vocab_size", 0, 1, 1, lim, &vocab));
    NV_TRY(get_whole(path, j, "max_position_embeddings", 2048, 0, 1, lim, &ctx));
    int bias = 0, mlp_bias = 0, tie = 0;
    NV_TRY(get_flag(path, j, "attention_bias", 0, &bias));
    NV_TRY(get_flag(path, j, "mlp_bias", 0, &mlp_bias));
    NV_TRY(get_flag(path, j, "tie_word_embeddings", gemma || smollm3, &tie)); /* transformers ties Gemma's and SmolLM3's by default */
    if ((bias && !qwen2) || mlp_bias)
        return nv_fail(NV_EUNSUPPORTED, "%s: %s biases are not supported (Qwen2's query, key and value biases are)", path,
                       mlp_bias ? "feed-forward" : "attention output");
    /* rope_theta at the top (transformers 4), or inside rope_parameters (transformers 5) */
    const cJSON *rp = field(j, "rope_parameters");
    const cJSON *rs = !absent(field(j, "rope_scaling")) ? field(j, "rope_scaling") : cJSON_IsObject(rp) ? rp : NULL;
    double theta, eps;
    NV_TRY(get_real(path, absent(field(j, "rope_theta")) && cJSON_IsObject(rp) ? rp : j, "rope_theta", 10000.0, &theta));
    NV_TRY(get_real(path, j, "rms_norm_eps", 1e-6, &eps));
    if (theta <= 0 || eps <= 0 || eps >= 1) return nv_fail(NV_EFORMAT, "%s: rope_theta or rms_norm_eps is out of range", path);
    c->dim = (int)dim;
    c->hidden_dim = (int)hidden;
    c->n_layers = (int)layers;
    c->n_heads = (int)heads;
    c->n_kv_heads = (int)kv_heads;
    c->head_dim = (int)head_dim;
    const int rot = (int)(head_dim * rotary); /* transformers' int(head_dim * partial_rotary_factor) */
    if (rot < 2 || rot % 2) return nv_fail(NV_EFORMAT, "%s: partial_rotary_factor %g rotates %d of a head's %lld values (want an even count)",
                                           path, rotary, rot, (long long)head_dim);
    c->rope_dim = rot < head_dim ? rot : 0;
    c->vocab_size = (int)vocab;
    c->seq_len = (int)ctx;
    c->rope_theta = (float)theta;
    c->norm_eps = (float)eps;
    c->qk_norm = qwen3; /* and Gemma 3's: gemma_block */
    c->qkv_bias = qwen2;
    if (gemma) NV_TRY(gemma_block(path, j, gemma, c));
    if (smollm3) NV_TRY(smollm3_nope(path, j, c));
    if (granite) NV_TRY(granite_scales(path, j, c));
    if (olmo) NV_TRY(olmo_block(path, j, olmo, c));
    c->n_experts = (int)experts;
    c->n_experts_used = (int)used;
    if (rs && !cJSON_IsObject(rs)) return nv_fail(NV_EFORMAT, "%s: rope_scaling is not an object", path);
    const char *rtype = rs ? str_of(field(rs, "rope_type")) : NULL;
    if (rs && !rtype) rtype = str_of(field(rs, "type"));
    if (rtype && !strcmp(rtype, "llama3")) NV_TRY(llama3_factors(path, rs, c));
    else if (rtype && !strcmp(rtype, "linear")) { /* positions divided by factor */
        double factor;
        NV_TRY(get_real(path, rs, "factor", 0.0, &factor));
        if (!(factor > 0 && factor < 1e6)) return nv_fail(NV_EFORMAT, "%s: rope_scaling's linear factor is out of range", path);
        NV_TRY(nv_config_rope_linear(c, (float)factor));
    } else if (rtype && !strcmp(rtype, "yarn")) NV_TRY(yarn_params(path, rs, ctx, c));
    else if (rtype && phi3 && (!strcmp(rtype, "longrope") || !strcmp(rtype, "su"))) NV_TRY(longrope_factors(path, j, rs, c));
    else if (rtype && strcmp(rtype, "default"))
        return nv_fail(NV_EUNSUPPORTED, "%s: RoPE scaling '%s' is not supported (llama3's, linear and yarn are; Phi-3's longrope)", path,
                       nv_gguf_shown(rtype, strlen(rtype), shown, sizeof shown));
    else if (rs && !rtype)
        return nv_fail(NV_EFORMAT, "%s: rope_scaling names no rope_type", path);
    /* a sliding window no shorter than the context attends to everything: cap the context there */
    int window_on = mistral || llama; /* (Gemma's window is its own: gemma_block) */
    if (qwen2 || qwen3 || smollm3) NV_TRY(get_flag(path, j, "use_sliding_window", 0, &window_on));
    int64_t window;
    NV_TRY(get_whole(path, j, "sliding_window", 0, 0, 0, INT64_C(1) << 40, &window));
    if (phi3 && window > 0 && window < c->seq_len) /* as llama.cpp runs phi3 (a warning there too) */
        nv_warn("%s: the model's sliding window of %lld tokens is not applied: attention sees the whole context of %d, as "
                "llama.cpp runs phi3", path, (long long)window, c->seq_len);
    if (window_on && window > 0 && window < c->seq_len) {
        nv_info("%s: attention over a sliding window of %lld tokens: the context is capped there", path, (long long)window);
        c->seq_len = (int)window;
    }
    *tied = tie;
    return NV_OK;
}

/* ---- safetensors ------------------------------------------------------------------------------ */

enum { ST_F32, ST_F16, ST_BF16, ST_OTHER };

typedef struct {
    const char *name; /* in its file's parsed header */
    int dtype;
    const char *dtype_name;
    int ndim;
    uint64_t shape[8];
    const uint8_t *data;
    uint64_t bytes;
    int used;
} st_tensor;

typedef struct {
    nv_mapped map[HF_MAX_SHARDS];
    cJSON *hdr[HF_MAX_SHARDS];
    int n_files;
    st_tensor *t;
    size_t n, cap;
    char *view_names; /* the names of views into fused tensors (st_unfuse), HF_VIEW_NAME bytes each */
} st_set;

#define HF_VIEW_NAME 96

static void st_close(st_set *s) {
    for (int i = 0; i < s->n_files; i++) {
        nv_file_unmap(&s->map[i]);
        cJSON_Delete(s->hdr[i]);
    }
    free(s->t);
    free(s->view_names);
    memset(s, 0, sizeof *s);
}

static st_tensor *st_find(st_set *s, const char *name) {
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->t[i].name, name)) return &s->t[i];
    return NULL;
}

static int dtype_of(const char *d, uint64_t *size) {
    static const struct {
        const char *name;
        int size;
    } sizes[] = {{"F64", 8}, {"I64", 8}, {"U64", 8}, {"I32", 4}, {"U32", 4}, {"I16", 2}, {"U16", 2},
                 {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
    *size = 0;
    if (!strcmp(d, "F32")) return *size = 4, ST_F32;
    if (!strcmp(d, "F16")) return *size = 2, ST_F16;
    if (!strcmp(d, "BF16")) return *size = 2, ST_BF16;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (!strcmp(d, sizes[i].name)) return *size = (uint64_t)sizes[i].size, ST_OTHER;
    return -1;
}

static nv_err st_add(st_set *s, const st_tensor *t) {
    if (s->n == s->cap) {
        const size_t cap = s->cap ? 2 * s->cap : 64;
        st_tensor *nt = realloc(s->t, cap * sizeof *nt);
        if (!nt) return nv_fail(NV_ENOMEM, "out of memory");
        s->t = nt;
        s->cap = cap;
    }
    s->t[s->n++] = *t;
    return NV_OK;
}

/* One .safetensors file: an 8-byte little-endian header length, the JSON header naming each
 * tensor's dtype, shape and [begin, end) within the data that follows. */
static nv_err st_open_file(st_set *s, const char *path) {
    if (s->n_files == HF_MAX_SHARDS) return nv_fail(NV_EUNSUPPORTED, "%s: more than %d weight files", path, HF_MAX_SHARDS);
    nv_mapped *m = &s->map[s->n_files];
    NV_TRY(nv_file_map(path, m));
    s->n_files++;
    uint64_t hl = 0;
    if (m->len >= 8) memcpy(&hl, m->data, 8);
    if (m->len < 8 || hl > m->len - 8 || hl > (UINT64_C(1) << 28))
        return nv_fail(NV_EFORMAT, "%s: not a safetensors file (its header length is %llu of %zu bytes)", path,
                       (unsigned long long)hl, m->len);
    cJSON *h = s->hdr[s->n_files - 1] = cJSON_ParseWithLength((const char *)m->data + 8, (size_t)hl);
    if (!cJSON_IsObject(h)) return nv_fail(NV_EFORMAT, "%s: the safetensors header is not a JSON object", path);
    const uint8_t *data = m->data + 8 + hl;
    const uint64_t data_len = m->len - 8 - hl;
    char shown[128];
    for (const cJSON *e = h->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) continue;
        const char *nm = nv_gguf_shown(e->string, strlen(e->string), shown, sizeof shown);
        const char *dt = str_of(field(e, "dtype"));
        const cJSON *shape = field(e, "shape"), *off = field(e, "data_offsets");
        if (!cJSON_IsObject(e) || !dt || !cJSON_IsArray(shape) || !cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 ||
            cJSON_GetArraySize(shape) > 8)
            return nv_fail(NV_EFORMAT, "%s: tensor '%s' lacks a dtype, a shape (at most 8 sizes) or two data_offsets", path, nm);
        st_tensor t = {.name = e->string, .dtype_name = dt, .ndim = cJSON_GetArraySize(shape)};
        uint64_t esize, numel = 1;
        if ((t.dtype = dtype_of(dt, &esize)) < 0)
            return nv_fail(NV_EFORMAT, "%s: tensor '%s' has an unknown dtype", path, nm);
        for (int i = 0; i < t.ndim; i++) {
            const cJSON *d = cJSON_GetArrayItem(shape, i);
            if (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble > 9e15 || d->valuedouble != floor(d->valuedouble))
                return nv_fail(NV_EFORMAT, "%s: tensor '%s' has a size that is not a whole number", path, nm);
            t.shape[i] = (uint64_t)d->valuedouble;
            if (t.shape[i] && numel > (UINT64_C(1) << 50) / t.shape[i])
                return nv_fail(NV_EFORMAT, "%s: tensor '%s' is too large", path, nm);
            numel *= t.shape[i];
        }
        const cJSON *b = cJSON_GetArrayItem(off, 0), *en = cJSON_GetArrayItem(off, 1);
        if (!cJSON_IsNumber(b) || !cJSON_IsNumber(en) || b->valuedouble < 0 || en->valuedouble < b->valuedouble ||
            en->valuedouble > (double)data_len || b->valuedouble != floor(b->valuedouble) || en->valuedouble != floor(en->valuedouble))
            return nv_fail(NV_EFORMAT, "%s: tensor '%s' has data_offsets outside the file's %llu data bytes", path, nm,
                           (unsigned long long)data_len);
        t.data = data + (uint64_t)b->valuedouble;
        t.bytes = (uint64_t)en->valuedouble - (uint64_t)b->valuedouble;
        if (t.bytes != numel * esize)
            return nv_fail(NV_EFORMAT, "%s: tensor '%s' spans %llu bytes, its shape and dtype %llu", path, nm,
                           (unsigned long long)t.bytes, (unsigned long long)(numel * esize));
        if (st_find(s, t.name)) return nv_fail(NV_EFORMAT, "%s: tensor '%s' is stored twice", path, nm);
        NV_TRY(st_add(s, &t));
    }
    return NV_OK;
}

/* A tensor a folder keeps fused per layer and the tensors it holds, as consecutive blocks of rows
 * (per expert when stacked: [experts, rows, cols]): model.layers.L.FUSED.weight holds
 * model.layers.L.PART.weight, or model.layers.L.STACK.experts.E.PART.weight, for each part. */
typedef struct {
    const char *fused, *stack;
    uint64_t rows[3], cols; /* each part's rows (0: no more parts) */
    const char *part[3];
} st_fusion;

/* The fused tensors of config c's folder as the separate ones they hold (views into the same bytes,
 * so a 16-bit one stays 16-bit), which the rest of the reader takes as it takes any: GraniteMoe's
 * experts (block_sparse_moe.input_linear: each expert's gate rows, then its up rows, as transformers
 * chunks them; output_linear; router.layer), Phi-3's projections (self_attn.qkv_proj: the query's
 * rows, the key's, the value's; mlp.gate_up_proj: the gate's, then the up projection's). */
static nv_err st_unfuse(st_set *s, const char *dir, const nv_config *c, int kept) {
    const uint64_t E = (uint64_t)c->n_experts, H = (uint64_t)c->hidden_dim, D = (uint64_t)c->dim;
    const uint64_t qd = (uint64_t)nv_config_q_dim(c), kvd = (uint64_t)nv_config_kv_dim(c);
    const st_fusion experts[3] = {{"block_sparse_moe.input_linear", "block_sparse_moe", {H, H}, D, {"w1", "w3"}},
                                  {"block_sparse_moe.output_linear", "block_sparse_moe", {D}, H, {"w2"}},
                                  {"block_sparse_moe.router.layer", NULL, {E}, D, {"block_sparse_moe.gate"}}},
                      projections[2] = {{"self_attn.qkv_proj", NULL, {qd, kvd, kvd}, D,
                                         {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}},
                                        {"mlp.gate_up_proj", NULL, {H, H}, D, {"mlp.gate_proj", "mlp.up_proj"}}};
    const st_fusion *fu = kept & HF_FUSED_EXPERTS ? experts : projections;
    const int nf = kept & HF_FUSED_EXPERTS ? 3 : 2;
    size_t n_views = 0;
    for (int f = 0; f < nf; f++)
        for (int p = 0; p < 3 && fu[f].rows[p]; p++) n_views += fu[f].stack ? (size_t)E : 1;
    n_views *= (size_t)c->n_layers;
    if (!(s->view_names = malloc(n_views * HF_VIEW_NAME))) return nv_fail(NV_ENOMEM, "out of memory");
    size_t v = 0;
    for (int l = 0; l < c->n_layers; l++)
        for (int f = 0; f < nf; f++) {
            const int stacked = fu[f].stack != NULL;
            uint64_t rows = 0;
            for (int p = 0; p < 3; p++) rows += fu[f].rows[p];
            char name[HF_VIEW_NAME], shape[64];
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, fu[f].fused);
            snprintf(shape, sizeof shape, "[%s%llu, %llu]", stacked ? "experts, " : "", (unsigned long long)rows,
                     (unsigned long long)fu[f].cols);
            st_tensor *t = st_find(s, name);
            if (!t) return nv_fail(NV_EFORMAT, "%s: tensor '%s' is missing", dir, name);
            if (t->ndim != 2 + stacked || (stacked && t->shape[0] != E) || t->shape[stacked] != rows || t->shape[stacked + 1] != fu[f].cols)
                return nv_fail(NV_EFORMAT, "%s: tensor '%s' is not of shape %s", dir, name, shape);
            if (t->dtype == ST_OTHER)
                return nv_fail(NV_EUNSUPPORTED, "%s: tensor '%s' is %s (F32, F16 and BF16 are read)", dir, name, t->dtype_name);
            t->used = 1;
            const st_tensor whole = *t; /* (adding views may move the set's table) */
            const uint64_t esize = whole.dtype == ST_F32 ? 4 : 2;
            for (uint64_t e = 0; e < (stacked ? E : 1); e++)
                for (uint64_t p = 0, row = 0; p < 3 && fu[f].rows[p]; row += fu[f].rows[p++]) {
                    char *vn = s->view_names + v++ * HF_VIEW_NAME;
                    if (stacked)
                        snprintf(vn, HF_VIEW_NAME, "model.layers.%d.%s.experts.%llu.%s.weight", l, fu[f].stack, (unsigned long long)e,
                                 fu[f].part[p]);
                    else snprintf(vn, HF_VIEW_NAME, "model.layers.%d.%s.weight", l, fu[f].part[p]);
                    if (st_find(s, vn)) return nv_fail(NV_EFORMAT, "%s: tensor '%s' is stored fused and on its own", dir, vn);
                    const st_tensor view = {.name = vn, .dtype = whole.dtype, .dtype_name = whole.dtype_name, .ndim = 2,
                                            .shape = {fu[f].rows[p], fu[f].cols},
                                            .data = whole.data + (e * rows + row) * fu[f].cols * esize,
                                            .bytes = fu[f].rows[p] * fu[f].cols * esize};
                    NV_TRY(st_add(s, &view));
                }
        }
    return NV_OK;
}

/* model.safetensors, or every shard model.safetensors.index.json's weight_map names. */
static nv_err st_open_model(st_set *s, const char *config_path) {
    char path[HF_PATH];
    if (nv_file_exists(sibling(config_path, "model.safetensors", path, sizeof path))) return st_open_file(s, path);
    cJSON *index;
    sibling(config_path, "model.safetensors.index.json", path, sizeof path);
    if (!nv_file_exists(path))
        return nv_fail(NV_EFORMAT, "%s: no model.safetensors or model.safetensors.index.json beside it (PyTorch .bin weights "
                                   "are not read)", config_path);
    NV_TRY(json_file(path, 0, &index));
    const cJSON *map = field(index, "weight_map");
    nv_err e = cJSON_IsObject(map) ? NV_OK : nv_fail(NV_EFORMAT, "%s: 'weight_map' is not an object", path);
    const char *done[HF_MAX_SHARDS];
    int n_done = 0;
    for (const cJSON *w = map ? map->child : NULL; w && e == NV_OK; w = w->next) {
        const char *f = str_of(w);
        char shown[128];
        if (!f || !*f || strchr(f, '/') || f[0] == '.') {
            e = nv_fail(NV_EFORMAT, "%s: tensor '%s' names no file of this folder", path,
                        nv_gguf_shown(w->string, strlen(w->string), shown, sizeof shown));
            break;
        }
        int seen = 0;
        for (int i = 0; i < n_done && !seen; i++) seen = !strcmp(done[i], f);
        if (seen) continue;
        if (n_done == HF_MAX_SHARDS) {
            e = nv_fail(NV_EUNSUPPORTED, "%s: more than %d weight files", path, HF_MAX_SHARDS);
            break;
        }
        done[n_done++] = f;
        char shard[HF_PATH];
        e = st_open_file(s, sibling(config_path, f, shard, sizeof shard));
    }
    for (const cJSON *w = map ? map->child : NULL; w && e == NV_OK; w = w->next)
        if (!st_find(s, w->string)) {
            char shown[128];
            e = nv_fail(NV_EFORMAT, "%s: tensor '%s' is not in the file weight_map names", path,
                        nv_gguf_shown(w->string, strlen(w->string), shown, sizeof shown));
        }
    cJSON_Delete(index);
    return e;
}

/* How a folder names its tensors beyond llama's: Mixtral's experts (else Qwen3-MoE's), Gemma 2 and
 * 3's four norms a layer (post_attention_layernorm is the attention's post-norm there, the FFN's
 * input norm pre_feedforward_layernorm). */
enum { HF_MIXTRAL = 1, HF_POST_NORMS = 2 };

/* transformers' name of a tensor named the llama.cpp way (nv_model_tensor_map's); of an expert
 * tensor, expert e's; style: HF_ bits. */
static void hf_name(const char *gguf_name, int e, int style, char *out, size_t cap) {
    const int mixtral = style & HF_MIXTRAL;
    static const struct {
        const char *gg, *hf;
    } top[] = {{"token_embd.weight", "model.embed_tokens.weight"}, {"output_norm.weight", "model.norm.weight"},
               {"output.weight", "lm_head.weight"}},
      part[] = {{"attn_norm.weight", "input_layernorm.weight"},   {"attn_q.weight", "self_attn.q_proj.weight"},
                {"attn_k.weight", "self_attn.k_proj.weight"},     {"attn_v.weight", "self_attn.v_proj.weight"},
                {"attn_output.weight", "self_attn.o_proj.weight"}, {"ffn_norm.weight", "post_attention_layernorm.weight"},
                {"ffn_gate.weight", "mlp.gate_proj.weight"},       {"ffn_down.weight", "mlp.down_proj.weight"},
                {"ffn_up.weight", "mlp.up_proj.weight"},           {"attn_q_norm.weight", "self_attn.q_norm.weight"},
                {"attn_k_norm.weight", "self_attn.k_norm.weight"}, {"attn_q.bias", "self_attn.q_proj.bias"},
                {"attn_k.bias", "self_attn.k_proj.bias"},         {"attn_v.bias", "self_attn.v_proj.bias"}};
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if (!strcmp(gguf_name, top[i].gg)) {
            snprintf(out, cap, "%s", top[i].hf);
            return;
        }
    int layer = 0, at = 0;
    sscanf(gguf_name, "blk.%d.%n", &layer, &at);
    static const char *const exps[3][3] = {{"ffn_gate_exps.weight", "w1", "gate_proj"},
                                           {"ffn_down_exps.weight", "w2", "down_proj"},
                                           {"ffn_up_exps.weight", "w3", "up_proj"}};
    const char *moe = mixtral ? "block_sparse_moe" : "mlp";
    if (at && !strcmp(gguf_name + at, "ffn_gate_inp.weight")) {
        snprintf(out, cap, "model.layers.%d.%s.gate.weight", layer, moe);
        return;
    }
    for (size_t i = 0; at && i < 3; i++)
        if (!strcmp(gguf_name + at, exps[i][0])) {
            snprintf(out, cap, "model.layers.%d.%s.experts.%d.%s.weight", layer, moe, e, exps[i][mixtral ? 1 : 2]);
            return;
        }
    static const struct {
        const char *gg, *hf;
    } post[] = {{"ffn_norm.weight", "pre_feedforward_layernorm.weight"},
                {"post_attention_norm.weight", "post_attention_layernorm.weight"},
                {"post_ffw_norm.weight", "post_feedforward_layernorm.weight"}};
    for (size_t i = 0; at && (style & HF_POST_NORMS) && i < sizeof post / sizeof post[0]; i++)
        if (!strcmp(gguf_name + at, post[i].gg)) {
            snprintf(out, cap, "model.layers.%d.%s", layer, post[i].hf);
            return;
        }
    for (size_t i = 0; at && i < sizeof part / sizeof part[0]; i++)
        if (!strcmp(gguf_name + at, part[i].gg)) {
            snprintf(out, cap, "model.layers.%d.%s", layer, part[i].hf);
            return;
        }
    snprintf(out, cap, "%s", gguf_name); /* not reached: every name of the map is above */
}

/* The n values of an F32, F16 or BF16 tensor as fp32. */
static void st_convert(const st_tensor *t, uint64_t n, float *dst) {
    if (t->dtype == ST_F32) memcpy(dst, t->data, (size_t)n * 4);
    else
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, t->data + 2 * i, 2);
            dst[i] = t->dtype == ST_F16 ? _cvtsh_ss(h) : nv_f32_from_bf16(h);
        }
}

/* Tensor `name` checked against shape [d1, d0] (a vector: [d0]) and converted into dst when given. */
static nv_err st_take(st_set *s, const char *dir, const char *name, uint64_t d0, uint64_t d1, float *dst) {
    st_tensor *t = st_find(s, name);
    if (!t) return nv_fail(NV_EFORMAT, "%s: tensor '%s' is missing", dir, name);
    const int vec = d1 == 1;
    if (t->ndim != (vec ? 1 : 2) || t->shape[0] != (vec ? d0 : d1) || (!vec && t->shape[1] != d0)) {
        if (vec) return nv_fail(NV_EFORMAT, "%s: tensor '%s' is not of shape [%llu]", dir, name, (unsigned long long)d0);
        return nv_fail(NV_EFORMAT, "%s: tensor '%s' is not of shape [%llu, %llu]", dir, name, (unsigned long long)d1,
                       (unsigned long long)d0);
    }
    if (t->dtype == ST_OTHER)
        return nv_fail(NV_EUNSUPPORTED, "%s: tensor '%s' is %s (F32, F16 and BF16 are read)", dir, name, t->dtype_name);
    t->used = 1;
    if (dst) st_convert(t, d0 * d1, dst);
    return NV_OK;
}

/* quantized loads (generate, serve): the F16 and BF16 plan matrices as fp16 and bf16 plan sources,
   their fp32 values left unmade (pending), as a GGUF file's F16 and BF16 tensors are kept. */
static nv_err half_sources(st_set *s, nv_model *m, int style) {
    const nv_config *c = &m->config;
    const int count = nv_model_plan_count(c);
    for (int i = 0; i < count; i++) {
        char gg[64], name[96];
        int expert;
        nv_model_plan_tensor_name(c, i, gg, sizeof gg, &expert);
        hf_name(gg, expert, style, name, sizeof name);
        const st_tensor *t = st_find(s, name);
        if (t && (t->dtype == ST_F16 || t->dtype == ST_BF16)) { /* checked before */
            NV_TRY(nv_model_keep_half(m, i, t->data, (size_t)(t->bytes / 2), t->dtype == ST_BF16, 1));
            nv_file_release(t->data, (size_t)t->bytes); /* copied: the file's pages need not stay */
        }
    }
    return NV_OK;
}

/* Whether tensor t is one of a Gemma model's norms, which transformers keeps as w - 1. */
static int gemma_norm(const nv_config *c, const nv_tensor_ref *t) {
    const size_t n = strlen(t->name);
    return c->emb_scale != 0.0f && c->ffn_gelu && t->d1 == 1 && t->p && n > 11 && !strcmp(t->name + n - 11, "norm.weight");
}

/* config.json's is_matryoshka and matryoshka_dimensions (sentence-transformers', vLLM's) into m:
 * what only embeddings read is warned of, not refused, when malformed (the model serves text
 * either way). */
static void folder_matryoshka(const char *config_path, const cJSON *cfg, nv_model *m) {
    const cJSON *is = field(cfg, "is_matryoshka"), *dims = field(cfg, "matryoshka_dimensions");
    const int n = cJSON_IsArray(dims) ? cJSON_GetArraySize(dims) : 0;
    int ok = (absent(is) || cJSON_IsBool(is)) && (absent(dims) || (cJSON_IsArray(dims) && n <= NV_MRL_DIMS));
    for (int i = 0; ok && i < n; i++) {
        const cJSON *d = cJSON_GetArrayItem(dims, i);
        ok = cJSON_IsNumber(d) && d->valuedouble == floor(d->valuedouble) && d->valuedouble >= 1 && d->valuedouble <= m->config.dim;
        if (ok) m->mrl_dims[i] = (int)d->valuedouble;
    }
    if (ok) {
        m->matryoshka = cJSON_IsTrue(is) || n > 0;
        m->n_mrl_dims = n;
    } else {
        nv_warn("%s: its is_matryoshka or matryoshka_dimensions (up to %d widths of 1 to %d) is malformed: ignored", config_path, NV_MRL_DIMS,
                m->config.dim);
    }
}

/* The config, and with m the weights, of the model config_path names (m NULL: checked only). */
static nv_err hf_load(const char *config_path, nv_config *c, nv_model *m, int quantized) {
    cJSON *cfg;
    NV_TRY(json_file(config_path, 0, &cfg));
    int tied = 0, kept = 0;
    st_set set = {0};
    nv_tensor_ref *t = NULL;
    nv_err e = config_of(config_path, cfg, c, &tied, &kept);
    const int style = (kept & HF_MIXTRAL_NAMES ? HF_MIXTRAL : 0) | (c->post_norms ? HF_POST_NORMS : 0);
    if (e == NV_OK) e = st_open_model(&set, config_path);
    if (e == NV_OK && (kept & (HF_FUSED_EXPERTS | HF_FUSED_PROJ))) e = st_unfuse(&set, config_path, c, kept);
    st_tensor *head = e == NV_OK ? st_find(&set, "lm_head.weight") : NULL;
    c->shared_classifier = tied || !head;
    if (head && tied) head->used = 1; /* transformers ties the two and ignores it as well */
    if (e == NV_OK) e = nv_config_validate(c);
    const size_t nt = nv_model_tensor_count(c);
    if (e == NV_OK && !(t = calloc(nt, sizeof *t))) e = nv_fail(NV_ENOMEM, "out of memory");
    char name[96];
    if (e == NV_OK) { /* everything checked before any weight memory is taken */
        nv_model_tensor_map(c, NULL, t);
        for (size_t i = 0; i < nt && e == NV_OK; i++) /* an expert tensor: one per expert */
            for (uint64_t x = 0; x < (t[i].d2 ? t[i].d2 : 1) && e == NV_OK; x++) {
                hf_name(t[i].name, (int)x, style, name, sizeof name);
                e = st_take(&set, config_path, name, t[i].d0, t[i].d1, NULL);
            }
        for (size_t i = 0; i < set.n && e == NV_OK; i++) {
            const char *nm = set.t[i].name;
            const size_t nl = strlen(nm);
            if (!set.t[i].used && !(nl >= 19 && !strcmp(nm + nl - 19, "rotary_emb.inv_freq"))) {
                char shown[128];
                e = nv_fail(NV_EUNSUPPORTED, "%s: tensor '%s' has no place in this model", config_path,
                            nv_gguf_shown(nm, nl, shown, sizeof shown));
            }
        }
    }
    if (e == NV_OK && m) {
        if ((e = nv_model_alloc(m, c)) == NV_OK) {
            nv_model_tensor_map(c, &m->w, t);
            if (quantized) e = half_sources(&set, m, style);
            for (size_t i = 0; i < nt && e == NV_OK; i++) {
                const int pending = nv_model_pending(m, t[i].name);
                for (uint64_t x = 0; x < (t[i].d2 ? t[i].d2 : 1) && e == NV_OK; x++) {
                    hf_name(t[i].name, (int)x, style, name, sizeof name);
                    e = st_take(&set, config_path, name, t[i].d0, t[i].d1, pending ? NULL : t[i].p + x * t[i].d0 * t[i].d1);
                }
                if (gemma_norm(c, &t[i])) /* Gemma's RMSNorms scale by 1 + w: the weight the others multiply by */
                    for (uint64_t x = 0; x < t[i].d0; x++) t[i].p[x] += 1.0f;
            }
            if (e == NV_OK) e = nv_model_qk_reorder(m, 0);
            if (e == NV_OK) folder_matryoshka(config_path, cfg, m);
            if (e != NV_OK) nv_model_free(m);
        }
    }
    cJSON_Delete(cfg);
    free(t);
    st_close(&set);
    return e;
}

nv_err nv_hf_read_config(const char *config_path, nv_config *c) { return hf_load(config_path, c, NULL, 0); }

nv_err nv_hf_check_config(const char *config_path) {
    cJSON *cfg;
    NV_TRY(json_file(config_path, 0, &cfg));
    nv_config c;
    int tied = 0, kept = 0;
    const nv_err e = config_of(config_path, cfg, &c, &tied, &kept);
    cJSON_Delete(cfg);
    return e;
}

/* A sentence-transformers folder's pooling (1_Pooling/config.json's mode): the mean, the first
 * token or the last; none said leaves the server's default. Max and weighted pooling are refused:
 * an embedding pooled otherwise would be silently wrong. */
static nv_err folder_pooling(const char *config_path, int *out) {
    char p[HF_PATH];
    cJSON *pc;
    *out = NV_POOLING_DEFAULT;
    NV_TRY(json_file(sibling(config_path, "1_Pooling/config.json", p, sizeof p), 1, &pc));
    static const struct {
        const char *key;
        int pooling;
    } modes[] = {{"pooling_mode_mean_tokens", NV_POOLING_MEAN}, {"pooling_mode_cls_token", NV_POOLING_CLS},
                 {"pooling_mode_lasttoken", NV_POOLING_LAST}, {"pooling_mode_max_tokens", -1},
                 {"pooling_mode_mean_sqrt_len_tokens", -1}, {"pooling_mode_weightedmean_tokens", -1}};
    nv_err e = NV_OK;
    for (size_t i = 0; pc && e == NV_OK && i < sizeof modes / sizeof modes[0]; i++) {
        int yes = 0;
        e = get_flag(p, pc, modes[i].key, 0, &yes);
        if (e == NV_OK && yes && (modes[i].pooling < 0 || *out != NV_POOLING_DEFAULT))
            e = nv_fail(NV_EUNSUPPORTED, "%s: '%s' is not supported (one of mean, CLS or the last token)", p, modes[i].key);
        else if (e == NV_OK && yes) *out = modes[i].pooling;
    }
    int with_prompt = 1; /* an instruction prompt left out of the mean: the server cannot tell it from the text */
    if (e == NV_OK) e = get_flag(p, pc, "include_prompt", 1, &with_prompt);
    if (e == NV_OK && !with_prompt && *out == NV_POOLING_MEAN)
        nv_warn("%s: its mean leaves out an instruction prompt (include_prompt false); served embeddings pool every token", p);
    cJSON_Delete(pc);
    return e;
}

nv_err nv_hf_load_model(const char *config_path, nv_model *m, int quantized) {
    memset(m, 0, sizeof *m);
    nv_config c;
    int pooling;
    NV_TRY(folder_pooling(config_path, &pooling));
    NV_TRY(hf_load(config_path, &c, m, quantized));
    m->pooling = pooling;
    return NV_OK;
}

/* ---- tokenizer.json ----------------------------------------------------------------------------- */

/* Strings to their lowest id, by open addressing. */
typedef struct {
    const char *const *s;
    const int *len;
    int32_t *slot; /* id + 1, 0 empty */
    uint32_t mask;
} str_index;

static uint32_t str_hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

static int index_find(const str_index *x, const char *s, size_t n) {
    for (uint32_t i = str_hash(s, n) & x->mask;; i = (i + 1) & x->mask) {
        const int32_t id = x->slot[i] - 1;
        if (id < 0) return -1;
        if ((size_t)x->len[id] == n && !memcmp(x->s[id], s, n)) return id;
    }
}

static nv_err index_build(str_index *x, const char *const *s, const int *len, int n) {
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)n) cap *= 2;
    *x = (str_index){s, len, calloc(cap, sizeof(int32_t)), cap - 1};
    if (!x->slot) return nv_fail(NV_ENOMEM, "out of memory for the vocabulary's index");
    for (int id = 0; id < n; id++) {
        if (index_find(x, s[id], (size_t)len[id]) >= 0) continue; /* the lowest id keeps a repeated string */
        uint32_t i = str_hash(s[id], (size_t)len[id]) & x->mask;
        while (x->slot[i]) i = (i + 1) & x->mask;
        x->slot[i] = id + 1;
    }
    return NV_OK;
}

/* A special token's text in tokenizer_config.json: a string, or {"content": ...}. */
static const char *special_text(const cJSON *cfg, const char *key) {
    const cJSON *v = field(cfg, key);
    return cJSON_IsObject(v) ? str_of(field(v, "content")) : str_of(v);
}

/* The first special token of a TemplateProcessing post-processor (also inside a Sequence):
 * the BOS it prepends. */
static const char *template_end(const cJSON *pp, int last) {
    const char *type = str_of(field(pp, "type"));
    if (!type) return NULL;
    if (!strcmp(type, "Sequence")) {
        const cJSON *each;
        cJSON_ArrayForEach(each, field(pp, "processors")) {
            const char *b = template_end(each, last);
            if (b) return b;
        }
        return NULL;
    }
    if (strcmp(type, "TemplateProcessing")) return NULL;
    const cJSON *single = field(pp, "single");
    const cJSON *end = cJSON_GetArrayItem(single, last ? cJSON_GetArraySize(single) - 1 : 0);
    return str_of(field(field(end, "SpecialToken"), "id"));
}
static const char *template_bos(const cJSON *pp) { return template_end(pp, 0); }
/* The special token the template puts after a text (Qwen3-Embedding's <|endoftext|>), or NULL. */
static const char *template_eos(const cJSON *pp) { return template_end(pp, 1); }

/* A normalizer or pre-tokenizer's type (a Sequence's members in order, joined by '+'), shown in
 * out (nv_gguf_shown: one line of printable ASCII). */
static const char *chain_of(const cJSON *o, const char *list_key, const char *member_key, char *out, size_t cap) {
    const char *type = str_of(field(o, "type"));
    char chain[256] = "";
    if (!type || strcmp(type, "Sequence")) {
        snprintf(chain, sizeof chain, "%s", type ? type : "?");
    } else {
        size_t at = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, field(o, list_key)) {
            const char *t = str_of(field(e, member_key));
            at += (size_t)snprintf(chain + at, at < sizeof chain ? sizeof chain - at : 0, "%s%.40s", at ? "+" : "", t ? t : "?");
            if (at >= sizeof chain) break;
        }
    }
    return nv_gguf_shown(chain, strnlen(chain, sizeof chain), out, cap);
}

static int is_type(const cJSON *o, const char *type) {
    const char *t = str_of(field(o, "type"));
    return t && !strcmp(t, type);
}

/* A byte-level tokenizer's normalizer: none, or Unicode NFC (Qwen2/Qwen3's), which sets *nfc. */
static nv_err byte_level_norm(const char *path, const cJSON *norm, int *nfc) {
    *nfc = 0;
    /* (an empty Sequence is none: DeepSeek-V3's) */
    if (absent(norm) || (is_type(norm, "Sequence") && cJSON_IsArray(field(norm, "normalizers")) &&
                         cJSON_GetArraySize(field(norm, "normalizers")) == 0))
        return NV_OK;
    const cJSON *only = norm;
    if (is_type(norm, "Sequence") && cJSON_GetArraySize(field(norm, "normalizers")) == 1)
        only = cJSON_GetArrayItem(field(norm, "normalizers"), 0);
    if (is_type(only, "NFC")) return *nfc = 1, NV_OK;
    char shown[256];
    return nv_fail(NV_EUNSUPPORTED, "%s: normalizer '%s' is not supported with a byte-level vocabulary (none, or NFC)", path,
                   chain_of(norm, "normalizers", "type", shown, sizeof shown));
}

/* Whether o is a Replace of " " by U+2581 (SentencePiece's word boundary). */
static int space_to_meta(const cJSON *o) {
    const char *from = str_of(field(field(o, "pattern"), "String")), *to = str_of(field(o, "content"));
    return is_type(o, "Replace") && from && !strcmp(from, " ") && to && !strcmp(to, "\xe2\x96\x81");
}

/* A byte-fallback (SentencePiece-style) tokenizer's text handling must be SentencePiece's, which
 * this project's encoder does: spaces as U+2581 and, with *prefix, a space before the text. With
 * one, spelled either as Llama 2's normalizer (Prepend, then Replace) without a pre-tokenizer, or
 * as a Metaspace pre-tokenizer that prepends and does not split, without a normalizer; without
 * (Gemma's), the Replace alone, with no pre-tokenizer or a Split at " " (a no-op after it). */
static nv_err spm_text_rules(const char *path, const cJSON *norm, const cJSON *pre, int *prefix) {
    static const char meta[] = "\xe2\x96\x81";
    const cJSON *list = field(norm, "normalizers");
    const cJSON *prepend = cJSON_GetArrayItem(list, 0), *replace = cJSON_GetArrayItem(list, 1);
    const int legacy = is_type(norm, "Sequence") && cJSON_GetArraySize(list) == 2 && is_type(prepend, "Prepend") &&
                       str_of(field(prepend, "prepend")) && !strcmp(str_of(field(prepend, "prepend")), meta) && space_to_meta(replace);
    *prefix = 1;
    if (legacy && absent(pre)) return NV_OK;
    const char *split_at = str_of(field(field(pre, "pattern"), "String"));
    if (space_to_meta(norm) && (absent(pre) || (is_type(pre, "Split") && split_at && !strcmp(split_at, " "))))
        return *prefix = 0, NV_OK;
    const char *scheme = str_of(field(pre, "prepend_scheme")), *rep = str_of(field(pre, "replacement"));
    const cJSON *add = field(pre, "add_prefix_space"); /* the older spelling of prepend_scheme */
    const int metaspace = is_type(pre, "Metaspace") && rep && !strcmp(rep, meta) && !cJSON_IsTrue(field(pre, "split")) &&
                          (scheme ? !strcmp(scheme, "first") || !strcmp(scheme, "always") : !cJSON_IsFalse(add));
    if (metaspace && absent(norm)) return NV_OK;
    char sn[256], sp[256];
    return nv_fail(NV_EUNSUPPORTED,
                   "%s: normalizer '%s' with pre-tokenizer '%s' is not SentencePiece's text handling (Llama 2's Prepend and "
                   "Replace normalizer, a Metaspace pre-tokenizer that prepends and does not split, or Gemma's Replace alone)",
                   path, absent(norm) ? "none" : chain_of(norm, "normalizers", "type", sn, sizeof sn),
                   absent(pre) ? "none" : chain_of(pre, "pretokenizers", "type", sp, sizeof sp));
}

/* Which split a byte-level tokenizer.json's pre_tokenizer makes, as llama.cpp names it. */
static nv_err byte_level_pre(const char *path, const cJSON *pt, char *pre, size_t cap) {
    const char *re[NV_BPE_MAX_SPLITS], *type = str_of(field(pt, "type"));
    int byte_level = 0, bl_regex = 0, n = 0, digits = 0, n_re = 0;
    const cJSON *single[1] = {pt}, *each = NULL;
    const int seq = type && !strcmp(type, "Sequence");
    const cJSON *list = seq ? field(pt, "pretokenizers") : NULL;
    for (int i = 0;; i++) {
        each = seq ? cJSON_GetArrayItem(list, i) : i == 0 ? single[0] : NULL;
        if (!each) break;
        n++;
        const char *t = str_of(field(each, "type"));
        char shown[128];
        const char *behavior = str_of(field(each, "behavior"));
        if (t && !strcmp(t, "Split") && str_of(field(field(each, "pattern"), "Regex")) && !byte_level && !digits &&
            n_re < NV_BPE_MAX_SPLITS && (!behavior || !strcmp(behavior, "Isolated")) && !cJSON_IsTrue(field(each, "invert")))
            re[n_re++] = str_of(field(field(each, "pattern"), "Regex")); /* (several: DeepSeek's, each splitting the pieces before) */
        else if (t && !strcmp(t, "ByteLevel") && !byte_level) {
            byte_level = 1;
            NV_TRY(get_flag(path, each, "use_regex", 1, &bl_regex));
            if (cJSON_IsTrue(field(each, "add_prefix_space")))
                return nv_fail(NV_EUNSUPPORTED, "%s: a ByteLevel pre-tokenizer with add_prefix_space is not supported", path);
        } else if (t && !strcmp(t, "Digits") && cJSON_IsTrue(field(each, "individual_digits")) && !byte_level && !n_re && !digits)
            digits = 1; /* every digit a piece, before the byte-level split (SmolLM, StarCoder) */
        else
            return nv_fail(NV_EUNSUPPORTED, "%s: pre-tokenizer '%s' is not supported (Split regexes, isolating their matches, then "
                                            "ByteLevel; ByteLevel; or individual Digits then ByteLevel)",
                           path, t ? nv_gguf_shown(t, strlen(t), shown, sizeof shown) : "?");
    }
    const char *name = NULL;
    if (byte_level && !n_re && bl_regex) name = digits ? "smollm" : "gpt-2";
    else if (byte_level && n_re && !bl_regex && !digits) name = nv_bpe_pre_of_splits(re, n_re);
    if (!name) {
        char shown[128];
        return nv_fail(NV_EUNSUPPORTED,
                       "%s: the pre-tokenizer's split %s%s is not one this project knows (Llama 3's, Qwen2's, GPT-2's, SmolLM's, GPT-4o's, "
                       "Tekken's, DeepSeek LLM's, DeepSeek-Coder's, DeepSeek-V3's)",
                       path, n_re ? nv_gguf_shown(re[0], strlen(re[0]), shown, sizeof shown) : "(none)", n_re > 1 ? " (and those after it)" : "");
    }
    snprintf(pre, cap, "%s", name);
    return NV_OK;
}

/* A token id from the tokenizer's text for it (NULL: -1). */
static nv_err id_of(const char *path, const str_index *x, const char *text, const char *what, int *id) {
    *id = -1;
    if (!text) return NV_OK;
    if ((*id = index_find(x, text, strlen(text))) < 0) {
        char shown[128];
        return nv_fail(NV_EFORMAT, "%s: the %s token '%s' is not in the vocabulary", path, what,
                       nv_gguf_shown(text, strlen(text), shown, sizeof shown));
    }
    return NV_OK;
}

/* Every id of a vocabulary entry or added token: whole, in [0, 2^24). */
static nv_err token_id(const char *path, const cJSON *v, int *id) {
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= (double)(1 << 24) || v->valuedouble != floor(v->valuedouble))
        return nv_fail(NV_EFORMAT, "%s: a token id is not a whole number in [0, 2^24)", path);
    *id = (int)v->valuedouble;
    return NV_OK;
}

void nv_hf_vocab_free(nv_hf_vocab *v) {
    nv_gguf_bpe_free(&v->bpe);
    free(v->spm);
    free(v->arena);
    cJSON_Delete(v->json);
    cJSON_Delete(v->cfg);
    memset(v, 0, sizeof *v);
}

static nv_err vocab_read(const char *path, nv_hf_vocab *v) {
    cJSON *root, *cfg, *mcfg;
    char p[HF_PATH], shown[128];
    NV_TRY(json_file(path, 0, &root));
    v->json = root;
    NV_TRY(json_file(sibling(path, "tokenizer_config.json", p, sizeof p), 1, &cfg));
    v->cfg = cfg;
    int64_t model_vocab = 0; /* config.json's vocab_size: ids past the tokenizer's become [PADn] */
    if (json_file(sibling(path, "config.json", p, sizeof p), 1, &mcfg) == NV_OK && mcfg) {
        if (get_whole(path, mcfg, "vocab_size", 0, 0, 1, 1 << 24, &model_vocab) != NV_OK) model_vocab = 0;
        cJSON_Delete(mcfg);
    }
    const cJSON *model = field(root, "model"), *vocab = field(model, "vocab"), *merges = field(model, "merges");
    const cJSON *added = field(root, "added_tokens");
    const char *type = str_of(field(model, "type"));
    if (!type || strcmp(type, "BPE"))
        return nv_fail(NV_EUNSUPPORTED, "%s: tokenizer model '%s' is not supported (BPE)", path,
                       type ? nv_gguf_shown(type, strlen(type), shown, sizeof shown) : "(none)");
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges) || (added && !cJSON_IsArray(added) && !cJSON_IsNull(added)))
        return nv_fail(NV_EFORMAT, "%s: model.vocab is not an object, model.merges or added_tokens not a list", path);
    int byte_fallback = 0;
    NV_TRY(get_flag(path, model, "byte_fallback", 0, &byte_fallback));
    /* the ids: the vocabulary's, the added tokens', and config.json's size */
    int n = (int)model_vocab, id;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        NV_TRY(token_id(path, e, &id));
        if (id >= n) n = id + 1;
    }
    cJSON_ArrayForEach(e, added) {
        NV_TRY(token_id(path, field(e, "id"), &id));
        if (!str_of(field(e, "content"))) return nv_fail(NV_EFORMAT, "%s: added token %d has no content", path, id);
        if (id >= n) n = id + 1;
    }
    if (n < 3) return nv_fail(NV_EFORMAT, "%s: %d tokens", path, n);
    nv_gguf_bpe *b = &v->bpe;
    b->n_tokens = n;
    b->tok = calloc((size_t)n, sizeof *b->tok);
    b->tok_len = calloc((size_t)n, sizeof *b->tok_len);
    b->tok_type = malloc((size_t)n * sizeof *b->tok_type);
    if (!b->tok || !b->tok_len || !b->tok_type) return nv_fail(NV_ENOMEM, "%s: out of memory for %d tokens", path, n);
    cJSON_ArrayForEach(e, vocab) {
        token_id(path, e, &id);
        if (b->tok[id]) return nv_fail(NV_EFORMAT, "%s: id %d is given to two tokens", path, id);
        b->tok[id] = e->string;
        b->tok_type[id] = 1;
    }
    cJSON_ArrayForEach(e, added) {
        token_id(path, field(e, "id"), &id);
        const char *content = str_of(field(e, "content"));
        if (b->tok[id] && strcmp(b->tok[id], content))
            return nv_fail(NV_EFORMAT, "%s: added token %d is another token in the vocabulary", path, id);
        b->tok[id] = content;
        b->tok_type[id] = cJSON_IsTrue(field(e, "special")) ? 3 : 4; /* control, user-defined */
        v->rstrip |= cJSON_IsTrue(field(e, "rstrip"));
    }
    /* room for [PADn] names and for merges given as pairs */
    size_t arena = 0;
    for (int i = 0; i < n; i++) arena += b->tok[i] ? 0 : 24;
    /* a model pads its vocabulary by a few ids (Qwen2.5's 271, OLMo 2's 74): ids mostly unnamed are
       a broken file, not millions of [PADn] tokens to make */
    const int unnamed = (int)(arena / 24);
    if (unnamed > 4096 && unnamed > n - unnamed)
        return nv_fail(NV_EFORMAT, "%s: %d of its %d token ids name no token (the largest id, or config.json's vocab_size, is far past the "
                                   "vocabulary)", path, unnamed, n);
    cJSON_ArrayForEach(e, merges) {
        if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && str_of(cJSON_GetArrayItem(e, 0)) && str_of(cJSON_GetArrayItem(e, 1)))
            arena += strlen(cJSON_GetArrayItem(e, 0)->valuestring) + strlen(cJSON_GetArrayItem(e, 1)->valuestring) + 2;
        else if (!cJSON_IsString(e))
            return nv_fail(NV_EFORMAT, "%s: a merge is neither \"left right\" nor a pair of strings", path);
    }
    char *at = v->arena = malloc(arena ? arena : 1);
    if (!at) return nv_fail(NV_ENOMEM, "%s: out of memory", path);
    for (int i = 0; i < n; i++) {
        if (!b->tok[i]) {
            b->tok[i] = at;
            at += snprintf(at, 24, "[PAD%d]", i) + 1;
            b->tok_type[i] = 5; /* unused */
        }
        b->tok_len[i] = (int)strlen(b->tok[i]);
    }
    b->n_merges = cJSON_GetArraySize(merges);
    b->merge = malloc((size_t)(b->n_merges ? b->n_merges : 1) * sizeof *b->merge);
    b->merge_len = malloc((size_t)(b->n_merges ? b->n_merges : 1) * sizeof *b->merge_len);
    if (!b->merge || !b->merge_len) return nv_fail(NV_ENOMEM, "%s: out of memory for the merges", path);
    int r = 0;
    cJSON_ArrayForEach(e, merges) {
        if (cJSON_IsString(e)) b->merge[r] = e->valuestring;
        else {
            b->merge[r] = at;
            at += sprintf(at, "%s %s", cJSON_GetArrayItem(e, 0)->valuestring, cJSON_GetArrayItem(e, 1)->valuestring) + 1;
        }
        b->merge_len[r] = (int)strlen(b->merge[r]);
        r++;
    }
    str_index x;
    NV_TRY(index_build(&x, b->tok, b->tok_len, n));
    nv_err err = id_of(path, &x, str_of(field(model, "unk_token")), "unknown", &b->unk);
    const char *bos_text = special_text(cfg, "bos_token"), *pp_bos = template_bos(field(root, "post_processor"));
    if (err == NV_OK) err = id_of(path, &x, bos_text ? bos_text : pp_bos, "BOS", &b->bos);
    if (err == NV_OK) err = id_of(path, &x, special_text(cfg, "eos_token"), "EOS", &b->eos);
    if (err == NV_OK) err = get_flag(path, cfg, "add_bos_token", pp_bos ? 1 : -1, &b->add_bos);
    b->eot = b->eom = -1;
    /* a template that ends a text with a special token: the vocabulary adds it as EOS, unless the
       config says otherwise (llama.cpp's reading: one other than eos_token becomes EOS, and eos_token
       the end of a turn) */
    const char *pp_eos = template_eos(field(root, "post_processor"));
    const int end_id = pp_eos ? index_find(&x, pp_eos, strlen(pp_eos)) : -1, ends = end_id >= 0 && end_id != b->bos;
    if (err == NV_OK) err = get_flag(path, cfg, "add_eos_token", ends, &b->add_eos);
    if (err == NV_OK && b->add_eos && ends && end_id != b->eos) {
        if (b->eos >= 0) b->eot = b->eos;
        b->eos = end_id;
    }
    if (err == NV_OK && !byte_fallback) {
        v->byte_level = 1;
        err = byte_level_norm(path, field(root, "normalizer"), &v->nfc);
        if (err == NV_OK) err = byte_level_pre(path, field(root, "pre_tokenizer"), b->pre, sizeof b->pre);
        /* Llama 3's split with the merges applied to whole pieces too: llama.cpp's name for it (OLMo 2's) */
        if (err == NV_OK && nv_bpe_pre_ignores_merges(b->pre) && strcmp(b->pre, "tekken") && cJSON_IsFalse(field(model, "ignore_merges")))
            snprintf(b->pre, sizeof b->pre, "dbrx");
    } else if (err == NV_OK) {
        /* SentencePiece-style: this project's encoder merges by score, so the merge of rank r
           scores its piece -r (the first merge making a piece counts); other pieces never merge */
        const int bos = b->bos >= 0 ? b->bos : index_find(&x, "<s>", 3), eos = b->eos >= 0 ? b->eos : index_find(&x, "</s>", 4);
        /* llama's ids (llama2.c's form), or another layout (Gemma's: <pad>, <eos>, <bos>, <unk>, then the
           byte tokens) whose ids, types and byte tokens the tokenizer keeps (v->typed) */
        int bytes = 0;
        for (int i = 0; i < n; i++)
            if (nv_byte_piece(b->tok[i], (size_t)b->tok_len[i]) >= 0) b->tok_type[i] = 6, bytes++;
        v->typed = !(b->unk == 0 && bos == 1 && eos == 2);
        if (v->typed && (b->bos < 0 || b->eos < 0 || b->unk < 0 || !bytes))
            err = nv_fail(NV_EUNSUPPORTED, "%s: <unk>, BOS, EOS are ids %d, %d, %d; a byte-fallback tokenizer needs 0, 1, 2, or all three "
                                           "named and its byte tokens spelled <0xXX> (Gemma's)", path, b->unk, bos, eos);
        int prefix = 1;
        if (err == NV_OK) err = spm_text_rules(path, field(root, "normalizer"), field(root, "pre_tokenizer"), &prefix);
        b->add_space = prefix;
        float *score = malloc((size_t)n * sizeof *score);
        size_t *plen = malloc((size_t)n * sizeof *plen);
        if (err == NV_OK && (!score || !plen)) err = nv_fail(NV_ENOMEM, "%s: out of memory", path);
        for (int i = 0; err == NV_OK && i < n; i++) score[i] = -1e30f, plen[i] = (size_t)b->tok_len[i];
        char *cat = err == NV_OK ? malloc((size_t)1 << 16) : NULL;
        for (int k = 0; cat && k < b->n_merges; k++) {
            const char *sp = memchr(b->merge[k], ' ', (size_t)b->merge_len[k]);
            const size_t ll = sp ? (size_t)(sp - b->merge[k]) : 0, rl = sp ? (size_t)b->merge_len[k] - ll - 1 : 0;
            if (!sp || ll + rl >= ((size_t)1 << 16)) continue;
            memcpy(cat, b->merge[k], ll);
            memcpy(cat + ll, sp + 1, rl);
            const int t = index_find(&x, cat, ll + rl);
            if (t >= 0 && score[t] == -1e30f) score[t] = -(float)k;
        }
        if (err == NV_OK && !cat) err = nv_fail(NV_ENOMEM, "%s: out of memory", path);
        if (err == NV_OK) err = nv_spm_bytes(path, n, b->tok, plen, score, !v->typed, &v->spm, &v->spm_len);
        free(cat);
        free(score);
        free(plen);
    }
    free(x.slot);
    return err;
}

nv_err nv_hf_vocab_read(const char *path, nv_hf_vocab *v) {
    memset(v, 0, sizeof *v);
    nv_err e = vocab_read(path, v);
    if (e != NV_OK) nv_hf_vocab_free(v);
    return e;
}

char *nv_hf_chat_template(const char *path) {
    char p[HF_PATH];
    cJSON *cfg;
    if (json_file(sibling(path, "tokenizer_config.json", p, sizeof p), 1, &cfg) != NV_OK || !cfg) return NULL;
    const cJSON *t = field(cfg, "chat_template"), *each;
    const char *text = str_of(t);
    if (cJSON_IsArray(t)) /* named templates: the default one */
        cJSON_ArrayForEach(each, t) {
            const char *name = str_of(field(each, "name"));
            if (name && !strcmp(name, "default")) text = str_of(field(each, "template"));
        }
    char *out = text ? strdup(text) : NULL;
    cJSON_Delete(cfg);
    return out;
}

/* ---- writing a folder --------------------------------------------------------------------------- */

/* A float as JSON shows it best: its shortest decimal that reads back as the same float. */
static double shortest(float f) {
    char b[32];
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(b, sizeof b, "%.*g", digits, (double)f);
        if ((float)strtod(b, NULL) == f) break;
    }
    return strtod(b, NULL);
}

static nv_err write_json(const char *dir, const char *name, const cJSON *j) {
    char path[HF_PATH];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *text = cJSON_Print(j);
    if (!text) return nv_fail(NV_ENOMEM, "out of memory for %s", path);
    const nv_iov parts[2] = {{text, strlen(text)}, {"\n", 1}};
    nv_err e = nv_file_write_atomic(path, parts, 2);
    free(text);
    return e;
}

/* An embedding model's pooling as sentence-transformers keeps it (folder_pooling reads it back):
 * modules.json (the model, its pooling, unit length) and 1_Pooling/config.json. */
static nv_err write_pooling(const char *dir, int pooling, int dim) {
    char sub[HF_PATH];
    snprintf(sub, sizeof sub, "%s/1_Pooling", dir);
    NV_TRY(nv_mkdirs(sub));
    static const char *const types[][2] = {{"", "Transformer"}, {"1_Pooling", "Pooling"}, {"2_Normalize", "Normalize"}};
    cJSON *mods = cJSON_CreateArray(), *pc = cJSON_CreateObject();
    for (int i = 0; i < 3; i++) {
        cJSON *o = cJSON_CreateObject();
        char name[2] = {(char)('0' + i), 0}, type[64];
        snprintf(type, sizeof type, "sentence_transformers.models.%s", types[i][1]);
        cJSON_AddNumberToObject(o, "idx", i);
        cJSON_AddStringToObject(o, "name", name);
        cJSON_AddStringToObject(o, "path", types[i][0]);
        cJSON_AddStringToObject(o, "type", type);
        cJSON_AddItemToArray(mods, o);
    }
    cJSON_AddNumberToObject(pc, "word_embedding_dimension", dim);
    cJSON_AddBoolToObject(pc, "pooling_mode_cls_token", pooling == NV_POOLING_CLS);
    cJSON_AddBoolToObject(pc, "pooling_mode_mean_tokens", pooling == NV_POOLING_MEAN);
    cJSON_AddBoolToObject(pc, "pooling_mode_lasttoken", pooling == NV_POOLING_LAST);
    nv_err e = write_json(dir, "modules.json", mods);
    if (e == NV_OK) e = write_json(dir, "1_Pooling/config.json", pc);
    cJSON_Delete(mods);
    cJSON_Delete(pc);
    return e;
}

/* A piece as tokenizer.json spells it: a llama2.c piece's spaces as U+2581, its BOS/EOS plainly. */
static char *spelled(const nv_tokenizer *tok, int id, int spm) {
    const char *p = nv_tokenizer_special_text(tok, id);
    size_t n = 0;
    for (const char *q = p; *q; q++) n += spm && *q == ' ' ? 3 : 1;
    char *out = malloc(n + 1), *o = out;
    if (!out) return NULL;
    for (const char *q = p; *q; q++)
        if (spm && *q == ' ') memcpy(o, "\xE2\x96\x81", 3), o += 3;
        else *o++ = *q;
    *o = 0;
    return out;
}

/* rstrip: the token takes the white space after it (nv_tokenizer_strips_after) */
static cJSON *added_token(int id, const char *content, int special, int rstrip) {
    cJSON *a = cJSON_CreateObject();
    cJSON_AddNumberToObject(a, "id", id);
    cJSON_AddStringToObject(a, "content", content);
    cJSON_AddBoolToObject(a, "single_word", 0);
    cJSON_AddBoolToObject(a, "lstrip", 0);
    cJSON_AddBoolToObject(a, "rstrip", rstrip);
    cJSON_AddBoolToObject(a, "normalized", 0);
    cJSON_AddBoolToObject(a, "special", special);
    return a;
}

/* {"type": type, key: value...} for the pipeline's small parts. */
static cJSON *typed(const char *type) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    return o;
}

/* A post-processor putting bos before a text and eos after it (transformers' TemplateProcessing);
 * either NULL for none. */
static cJSON *end_template(const char *bos, int bos_id, const char *eos, int eos_id) {
    cJSON *pp = typed("TemplateProcessing"), *single = cJSON_AddArrayToObject(pp, "single"), *pair = cJSON_AddArrayToObject(pp, "pair");
    for (int k = 0; k < 2; k++) {
        cJSON *list = k ? pair : single;
        for (int part = 0; part < (k ? 2 : 1); part++)
            for (int item = 0; item < 3; item++) {
                const char *special = item == 0 ? bos : item == 2 ? eos : NULL;
                if (item != 1 && !special) continue;
                cJSON *o = cJSON_CreateObject(), *in = cJSON_AddObjectToObject(o, item == 1 ? "Sequence" : "SpecialToken");
                cJSON_AddStringToObject(in, "id", item == 1 ? (part ? "B" : "A") : special);
                cJSON_AddNumberToObject(in, "type_id", part);
                cJSON_AddItemToArray(list, o);
            }
    }
    cJSON *sp = cJSON_AddObjectToObject(pp, "special_tokens");
    for (int item = 0; item < 2; item++) {
        const char *special = item ? eos : bos;
        if (!special || cJSON_GetObjectItemCaseSensitive(sp, special)) continue;
        cJSON *b = cJSON_AddObjectToObject(sp, special);
        cJSON_AddStringToObject(b, "id", special);
        cJSON_AddItemToObject(b, "ids", cJSON_CreateIntArray(item ? &eos_id : &bos_id, 1));
        cJSON_AddItemToArray(cJSON_AddArrayToObject(b, "tokens"), cJSON_CreateString(special));
    }
    return pp;
}

typedef struct {
    float score;
    int piece, left, right;
} spm_merge;

static int merge_order(const void *a, const void *b) {
    const spm_merge *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    if (x->piece != y->piece) return x->piece < y->piece ? -1 : 1;
    return x->left < y->left ? -1 : x->left > y->left;
}

static int is_byte_piece(const char *p) { return strlen(p) == 6 && !strncmp(p, "<0x", 3) && p[5] == '>'; }

/* A llama2.c vocabulary's merges: every split of a piece into two pieces (neither <unk>, BOS, EOS
 * nor a byte), best-scored piece first. */
/* Whether token id can be a merge's result or part: a normal piece (typed 1, or untyped past
 * llama2.c's three specials), not a byte token. */
static int mergeable(const nv_tokenizer *tok, int id) {
    const int type = nv_tokenizer_type(tok, id);
    return id >= 3 && (type == 0 || type == 1) && !is_byte_piece(nv_tokenizer_piece(tok, id));
}

static nv_err spm_merges(const nv_tokenizer *tok, spm_merge **out, int *count) {
    const int n = nv_tokenizer_vocab_size(tok);
    int cap = 1024, k = 0;
    spm_merge *m = malloc((size_t)cap * sizeof *m);
    char buf[1024];
    for (int id = 3; m && id < n; id++) {
        const char *p = nv_tokenizer_piece(tok, id);
        const size_t len = strlen(p);
        if (!mergeable(tok, id) || len >= sizeof buf) continue;
        for (size_t cut = 1; cut < len; cut++) {
            if (((uint8_t)p[cut] & 0xC0) == 0x80) continue; /* inside a character */
            memcpy(buf, p, cut);
            buf[cut] = 0;
            const int l = nv_tokenizer_lookup(tok, buf), r = nv_tokenizer_lookup(tok, p + cut);
            if (l < 0 || r < 0 || !mergeable(tok, l) || !mergeable(tok, r)) continue;
            if (k == cap) {
                spm_merge *g = realloc(m, (size_t)(cap *= 2) * sizeof *m);
                if (!g) break;
                m = g;
            }
            m[k++] = (spm_merge){nv_tokenizer_score(tok, id), id, l, r};
        }
    }
    if (!m || k == cap) {
        free(m);
        return nv_fail(NV_ENOMEM, "out of memory for the merges");
    }
    qsort(m, (size_t)k, sizeof *m, merge_order);
    *out = m;
    *count = k;
    return NV_OK;
}

/* tokenizer.json and tokenizer_config.json of tok. */
static nv_err tokenizer_files(const nv_tokenizer *tok, const nv_config *c, cJSON **tj_out, cJSON **tc_out) {
    nv_bpe_view bv;
    const int byte_level = nv_tokenizer_bpe_view(tok, &bv), spm = !byte_level, n = nv_tokenizer_vocab_size(tok);
    const int bos = nv_tokenizer_bos(tok), eos = nv_tokenizer_eos(tok), add_bos = nv_tokenizer_adds_bos(tok) && bos >= 0,
              add_eos = nv_tokenizer_adds_eos(tok);
    cJSON *tj = cJSON_CreateObject(), *tc = cJSON_CreateObject();
    *tj_out = tj;
    *tc_out = tc;
    cJSON_AddStringToObject(tj, "version", "1.0");
    cJSON_AddNullToObject(tj, "truncation");
    cJSON_AddNullToObject(tj, "padding");
    cJSON *added = cJSON_AddArrayToObject(tj, "added_tokens");
    cJSON *model = typed("BPE"), *vocab = cJSON_CreateObject(), *merges = cJSON_CreateArray();
    char **text = calloc((size_t)n, sizeof *text);
    if (!text) return nv_fail(NV_ENOMEM, "out of memory");
    nv_err e = NV_OK;
    for (int i = 0; i < n && e == NV_OK; i++)
        if (!(text[i] = spelled(tok, i, spm))) e = nv_fail(NV_ENOMEM, "out of memory");
    /* unused tokens at the end (a GGUF file's padding to the model's vocabulary) are left out, as
       the models' own tokenizer.json files leave them: config.json's vocab_size brings them back */
    int end = n;
    while (byte_level && end > 0 && bv.type[end - 1] == 5) end--;
    const int unk = nv_tokenizer_unk(tok);
    for (int i = 0; i < end && e == NV_OK; i++) {
        cJSON_AddNumberToObject(vocab, text[i], i);
        /* a SentencePiece vocabulary's types when it has them (GGUF's: 2 unknown, 3 control, 4
           user-defined), else llama2.c's three specials */
        int type = byte_level ? bv.type[i] : nv_tokenizer_type(tok, i);
        if (!byte_level && !type) type = i <= NV_TOKEN_EOS ? 3 : 1;
        if (!byte_level && type == 2) type = 3;
        if (type == 3 || type == 4)
            cJSON_AddItemToArray(added, added_token(i, text[i], type == 3, nv_tokenizer_strips_after(tok, i)));
    }
    if (e == NV_OK && byte_level) {
        for (int k = 0; k < bv.n_merges; k++) {
            char *pair = malloc(strlen(text[bv.merge_pair[2 * k]]) + strlen(text[bv.merge_pair[2 * k + 1]]) + 2);
            if (!pair) {
                e = nv_fail(NV_ENOMEM, "out of memory");
                break;
            }
            sprintf(pair, "%s %s", text[bv.merge_pair[2 * k]], text[bv.merge_pair[2 * k + 1]]);
            cJSON_AddItemToArray(merges, cJSON_CreateString(pair));
            free(pair);
        }
        /* the split as the model families write it: Llama 3's, Qwen2's, GPT-4o's, Tekken's and DeepSeek's
           regexes, then bytes; SmolLM's single digits, then GPT-2's regex inside ByteLevel; GPT-2's alone */
        const nv_bpe_splits *sp = nv_bpe_splits_of_pre(bv.pre);
        const int own_regex = sp != nv_bpe_splits_of_pre("gpt-2") && sp != nv_bpe_splits_of_pre("smollm");
        cJSON *pt = typed("Sequence"), *list = cJSON_AddArrayToObject(pt, "pretokenizers");
        for (int k = 0; own_regex && k < sp->n; k++) {
            cJSON *split = typed("Split");
            cJSON_AddStringToObject(cJSON_AddObjectToObject(split, "pattern"), "Regex", sp->re[k]);
            cJSON_AddStringToObject(split, "behavior", "Isolated");
            cJSON_AddBoolToObject(split, "invert", 0);
            cJSON_AddItemToArray(list, split);
        }
        if (sp == nv_bpe_splits_of_pre("smollm")) {
            cJSON *digits = typed("Digits");
            cJSON_AddBoolToObject(digits, "individual_digits", 1);
            cJSON_AddItemToArray(list, digits);
        }
        cJSON *bl = typed("ByteLevel");
        cJSON_AddBoolToObject(bl, "add_prefix_space", 0);
        cJSON_AddBoolToObject(bl, "trim_offsets", 1);
        cJSON_AddBoolToObject(bl, "use_regex", !own_regex);
        cJSON_AddItemToArray(list, bl);
        if (bv.nfc) cJSON_AddItemToObject(tj, "normalizer", typed("NFC"));
        else cJSON_AddNullToObject(tj, "normalizer");
        cJSON_AddItemToObject(tj, "pre_tokenizer", pt);
        if (add_bos || add_eos)
            cJSON_AddItemToObject(tj, "post_processor", end_template(add_bos ? text[bos] : NULL, bos, add_eos ? text[eos] : NULL, eos));
        else cJSON_AddNullToObject(tj, "post_processor");
        cJSON *dec = typed("ByteLevel");
        cJSON_AddBoolToObject(dec, "add_prefix_space", 1);
        cJSON_AddBoolToObject(dec, "trim_offsets", 1);
        cJSON_AddBoolToObject(dec, "use_regex", 1);
        cJSON_AddItemToObject(tj, "decoder", dec);
        cJSON_AddNullToObject(model, "unk_token");
        cJSON_AddBoolToObject(model, "byte_fallback", 0);
        cJSON_AddBoolToObject(model, "ignore_merges", nv_bpe_pre_ignores_merges(bv.pre));
    } else if (e == NV_OK) {
        spm_merge *m = NULL;
        int nm = 0;
        if ((e = spm_merges(tok, &m, &nm)) == NV_OK)
            for (int k = 0; k < nm; k++) {
                char *pair = malloc(strlen(text[m[k].left]) + strlen(text[m[k].right]) + 2);
                if (!pair) {
                    e = nv_fail(NV_ENOMEM, "out of memory");
                    break;
                }
                sprintf(pair, "%s %s", text[m[k].left], text[m[k].right]);
                cJSON_AddItemToArray(merges, cJSON_CreateString(pair));
                free(pair);
            }
        free(m);
        /* Llama 2's pipeline: a leading U+2581 (the dummy prefix: not Gemma's) and spaces as U+2581;
           bytes decoded by fallback; the prefix's space stripped again */
        const int prefix = nv_tokenizer_space_prefix(tok);
        cJSON *rep = typed("Replace");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(rep, "pattern"), "String", " ");
        cJSON_AddStringToObject(rep, "content", "\xE2\x96\x81");
        if (prefix) {
            cJSON *norm = typed("Sequence"), *nl = cJSON_AddArrayToObject(norm, "normalizers"), *pre = typed("Prepend");
            cJSON_AddStringToObject(pre, "prepend", "\xE2\x96\x81");
            cJSON_AddItemToArray(nl, pre);
            cJSON_AddItemToArray(nl, rep);
            cJSON_AddItemToObject(tj, "normalizer", norm);
        } else {
            cJSON_AddItemToObject(tj, "normalizer", rep);
        }
        cJSON_AddNullToObject(tj, "pre_tokenizer");
        if (add_bos || add_eos)
            cJSON_AddItemToObject(tj, "post_processor", end_template(add_bos ? text[bos] : NULL, bos, add_eos ? text[eos] : NULL, eos));
        else cJSON_AddNullToObject(tj, "post_processor");
        cJSON *dec = typed("Sequence"), *dl = cJSON_AddArrayToObject(dec, "decoders"), *drep = typed("Replace");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(drep, "pattern"), "String", "\xE2\x96\x81");
        cJSON_AddStringToObject(drep, "content", " ");
        cJSON_AddItemToArray(dl, drep);
        cJSON_AddItemToArray(dl, typed("ByteFallback"));
        cJSON_AddItemToArray(dl, typed("Fuse"));
        if (prefix) {
            cJSON *strip = typed("Strip");
            cJSON_AddStringToObject(strip, "content", " ");
            cJSON_AddNumberToObject(strip, "start", 1);
            cJSON_AddNumberToObject(strip, "stop", 0);
            cJSON_AddItemToArray(dl, strip);
        }
        cJSON_AddItemToObject(tj, "decoder", dec);
        cJSON_AddStringToObject(model, "unk_token", text[unk >= 0 ? unk : 0]);
        cJSON_AddBoolToObject(model, "fuse_unk", 1);
        cJSON_AddBoolToObject(model, "byte_fallback", 1);
    }
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", merges);
    cJSON_AddItemToObject(tj, "model", model);
    cJSON_AddBoolToObject(tc, "add_bos_token", add_bos);
    cJSON_AddBoolToObject(tc, "add_eos_token", add_eos);
    if (bos >= 0 && e == NV_OK) cJSON_AddStringToObject(tc, "bos_token", text[bos]);
    else cJSON_AddNullToObject(tc, "bos_token");
    if (eos >= 0 && e == NV_OK) cJSON_AddStringToObject(tc, "eos_token", text[eos]);
    else cJSON_AddNullToObject(tc, "eos_token");
    if (spm && e == NV_OK) cJSON_AddStringToObject(tc, "unk_token", text[unk >= 0 ? unk : 0]);
    cJSON_AddBoolToObject(tc, "clean_up_tokenization_spaces", 0);
    cJSON_AddNumberToObject(tc, "model_max_length", c->seq_len);
    /* Llama's class adds its own prefix handling: a vocabulary without the prefix (Gemma's) takes the
       plain class, which runs tokenizer.json as written */
    cJSON_AddStringToObject(tc, "tokenizer_class", spm && nv_tokenizer_space_prefix(tok) ? "LlamaTokenizerFast" : "PreTrainedTokenizerFast");
    for (int i = 0; i < n; i++) free(text[i]);
    free(text);
    return e;
}

/* A tensor to write: its name, [rows, cols] (cols 0: a vector of rows) and fp32 values p; or one
 * gathered from parts (n_parts > 0): a stack [stack, rows, cols] (GraniteMoe's fused experts) or a
 * fused matrix (Phi-3's qkv_proj, gate_up_proj; stack 0), whose rows (a stack's slice k's) are
 * each part's (k-th block of) part_rows[j] rows in turn. */
typedef struct {
    char name[128];
    uint64_t rows, cols;
    const float *p;
    uint64_t stack;
    int n_parts;
    const float *part[3];
    uint64_t part_rows[3];
} st_out;

/* A gathered tensor's values in order, malloc'd (NULL when out of memory). */
static float *st_gather(const st_out *t) {
    const uint64_t slices = t->stack ? t->stack : 1, cl = t->cols;
    float *flat = malloc((size_t)(slices * t->rows * cl) * sizeof *flat), *at = flat;
    for (uint64_t k = 0; flat && k < slices; k++)
        for (int j = 0; j < t->n_parts; j++) {
            const uint64_t n = t->part_rows[j] * cl;
            memcpy(at, t->part[j] + k * n, (size_t)n * sizeof *flat);
            at += n;
        }
    return flat;
}

/* n tensors as one safetensors file at path, in dtype, atomically. */
static nv_err st_write(const char *path, const st_out *t, size_t n, nv_hf_dtype dtype) {
    void **conv = calloc(n ? n : 1, sizeof *conv);
    nv_iov *parts = calloc(n + 2, sizeof *parts);
    cJSON *h = cJSON_CreateObject();
    nv_err e = conv && parts ? NV_OK : nv_fail(NV_ENOMEM, "out of memory");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(h, "__metadata__"), "format", "pt");
    const size_t esize = dtype == NV_HF_F32 ? 4 : 2;
    uint64_t off = 0;
    for (size_t i = 0; i < n && e == NV_OK; i++) {
        const int stacked = t[i].stack > 0;
        const uint64_t count = (stacked ? t[i].stack : 1) * t[i].rows * (t[i].cols ? t[i].cols : 1);
        cJSON *o = cJSON_AddObjectToObject(h, t[i].name);
        cJSON_AddStringToObject(o, "dtype", dtype == NV_HF_F32 ? "F32" : dtype == NV_HF_BF16 ? "BF16" : "F16");
        const double shape[3] = {(double)t[i].stack, (double)t[i].rows, (double)t[i].cols},
                     offs[2] = {(double)off, (double)(off + count * esize)};
        cJSON_AddItemToObject(o, "shape", cJSON_CreateDoubleArray(shape + !stacked, stacked ? 3 : t[i].cols ? 2 : 1));
        cJSON_AddItemToObject(o, "data_offsets", cJSON_CreateDoubleArray(offs, 2));
        off += count * esize;
        float *flat = t[i].n_parts ? st_gather(&t[i]) : NULL;
        const float *src = t[i].n_parts ? flat : t[i].p;
        if (t[i].n_parts && !flat) {
            e = nv_fail(NV_ENOMEM, "out of memory");
            break;
        }
        if (dtype == NV_HF_F32) {
            conv[i] = flat;
            parts[i + 2] = (nv_iov){src, (size_t)count * 4};
            continue;
        }
        uint16_t *half = conv[i] = malloc((size_t)count * 2);
        for (uint64_t k = 0; half && k < count; k++)
            half[k] = dtype == NV_HF_BF16 ? nv_bf16_from_f32(src[k]) : _cvtss_sh(src[k], _MM_FROUND_TO_NEAREST_INT);
        free(flat);
        if (!half) {
            e = nv_fail(NV_ENOMEM, "out of memory");
            break;
        }
        parts[i + 2] = (nv_iov){half, (size_t)count * 2};
    }
    char *text = e == NV_OK ? cJSON_PrintUnformatted(h) : NULL;
    if (e == NV_OK && !text) e = nv_fail(NV_ENOMEM, "out of memory");
    if (e == NV_OK) {
        /* the header padded with spaces so that the data starts 8-byte aligned */
        const size_t tl = strlen(text), hl = (tl + 7) / 8 * 8;
        char *padded = malloc(hl);
        uint64_t hl64 = hl;
        if (!padded) e = nv_fail(NV_ENOMEM, "out of memory");
        else {
            memcpy(padded, text, tl);
            memset(padded + tl, ' ', hl - tl);
            parts[0] = (nv_iov){&hl64, 8};
            parts[1] = (nv_iov){padded, hl};
            e = nv_file_write_atomic(path, parts, (int)n + 2);
            free(padded);
        }
    }
    free(text);
    cJSON_Delete(h);
    for (size_t i = 0; conv && i < n; i++) free(conv[i]);
    free(conv);
    free(parts);
    return e;
}

/* GraniteMoe's fused form of tensor t[i] into *o (when o is given): one tensor for a layer's gate
 * projections (input_linear: with its up projections), down projections (output_linear) or router
 * (router.layer); none for its up projections (inside input_linear); -1 for a tensor that is none of
 * these. */
static int fused_expert_out(const nv_tensor_ref *t, size_t nt, size_t i, st_out *o) {
    int layer = 0, at = 0;
    sscanf(t[i].name, "blk.%d.%n", &layer, &at);
    const char *part = t[i].name + at;
    if (!at) return -1;
    if (!strcmp(part, "ffn_up_exps.weight")) return 0;
    const int gate = !strcmp(part, "ffn_gate_exps.weight"), down = !strcmp(part, "ffn_down_exps.weight");
    if (!gate && !down && strcmp(part, "ffn_gate_inp.weight")) return -1;
    if (!o) return 1;
    memset(o, 0, sizeof *o);
    snprintf(o->name, sizeof o->name, "model.layers.%d.block_sparse_moe.%s.weight", layer,
             gate ? "input_linear" : down ? "output_linear" : "router.layer");
    o->rows = t[i].d1, o->cols = t[i].d0, o->stack = t[i].d2;
    o->n_parts = 1, o->part[0] = t[i].p, o->part_rows[0] = t[i].d1;
    char up[64];
    snprintf(up, sizeof up, "blk.%d.ffn_up_exps.weight", layer);
    for (size_t k = 0; gate && k < nt; k++)
        if (!strcmp(t[k].name, up)) o->part[1] = t[k].p, o->part_rows[1] = t[k].d1, o->rows += t[k].d1, o->n_parts = 2;
    return 1;
}

/* m's tensors as model.safetensors in dir; phi3: Phi-3's fused projections. */
static nv_err write_weights(const nv_model *m, const char *dir, nv_hf_dtype dtype, int phi3) {
    const nv_config *c = &m->config;
    nv_model view;
    float *qk = NULL;
    NV_TRY(nv_model_half_view(m, &view, &qk));
    size_t nt = nv_model_tensor_count(c);
    nv_tensor_ref *t = calloc(nt, sizeof *t);
    nv_tensor_parts *tp = calloc(nt, sizeof *tp);
    size_t no = 0;
    if (t && tp) nt = nv_tensor_parts_of(t, tp, nv_model_tensor_map(c, &view.w, t), phi3);
    const int fused = c->n_experts && nv_config_granite(c); /* GraniteMoe's experts: fused per layer */
    for (size_t i = 0; t && i < nt; i++) { /* a stacked expert tensor: a tensor per expert, or fused */
        const int f = fused ? fused_expert_out(t, nt, i, NULL) : -1;
        no += f >= 0 ? (size_t)f : t[i].d2 ? t[i].d2 : 1;
    }
    st_out *o = calloc(no ? no : 1, sizeof *o);
    nv_err e = t && tp && o ? NV_OK : nv_fail(NV_ENOMEM, "out of memory");
    /* Gemma's norms as transformers keeps them, w - 1 (its RMSNorm scales by 1 + w) */
    size_t norm_floats = 0;
    for (size_t i = 0; t && i < nt; i++) norm_floats += gemma_norm(c, &t[i]) ? t[i].d0 : 0;
    float *norms = norm_floats ? malloc(norm_floats * sizeof(float)) : NULL;
    if (e == NV_OK && norm_floats && !norms) e = nv_fail(NV_ENOMEM, "out of memory");
    if (e == NV_OK) {
        /* Mixtral's expert names (Qwen3-MoE's with QK-norm); Gemma 2 and 3's four norms a layer */
        const int style = (c->n_experts && !c->qk_norm ? HF_MIXTRAL : 0) | (c->post_norms ? HF_POST_NORMS : 0);
        size_t at = 0;
        float *nrm = norms;
        for (size_t i = 0; i < nt; i++) {
            const int f = fused ? fused_expert_out(t, nt, i, &o[at]) : -1;
            if (f >= 0) {
                at += (size_t)f;
                continue;
            }
            if (tp[i].n > 1) { /* Phi-3's fused projections */
                int layer = 0;
                sscanf(t[i].name, "blk.%d.", &layer);
                snprintf(o[at].name, sizeof o[at].name, "model.layers.%d.%s.weight", layer,
                         strstr(t[i].name, "attn_qkv") ? "self_attn.qkv_proj" : "mlp.gate_up_proj");
                o[at].rows = t[i].d1, o[at].cols = t[i].d0, o[at].n_parts = tp[i].n;
                memcpy(o[at].part, tp[i].p, sizeof o[at].part), memcpy(o[at].part_rows, tp[i].rows, sizeof o[at].part_rows);
                at++;
                continue;
            }
            for (uint64_t x = 0; x < (t[i].d2 ? t[i].d2 : 1); x++, at++) {
                hf_name(t[i].name, (int)x, style, o[at].name, sizeof o[at].name);
                o[at].rows = t[i].d1 == 1 ? t[i].d0 : t[i].d1;
                o[at].cols = t[i].d1 == 1 ? 0 : t[i].d0;
                o[at].p = t[i].p + x * t[i].d1 * t[i].d0;
                if (gemma_norm(c, &t[i])) {
                    for (uint64_t u = 0; u < t[i].d0; u++) nrm[u] = t[i].p[u] - 1.0f;
                    o[at].p = nrm;
                    nrm += t[i].d0;
                }
            }
        }
        char path[HF_PATH];
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        e = st_write(path, o, no, dtype);
    }
    free(norms);
    free(o);
    free(t);
    free(tp);
    free(qk);
    return e;
}

/* Each layer's attention as transformers' layer_types names it (list_period reads it back). */
static void add_layer_types(cJSON *cfg, const nv_config *c) {
    cJSON *types = cJSON_AddArrayToObject(cfg, "layer_types");
    for (int l = 0; l < c->n_layers; l++)
        cJSON_AddItemToArray(types, cJSON_CreateString(nv_config_layer_window(c, l) ? "sliding_attention" : "full_attention"));
}

/* The Gemma block of generation gen as transformers' config names it (gemma_block reads it back):
 * GELU's name, the window and its layers (layer_types, and Gemma 3's period and RoPE base), the
 * scores' divisor squared, the soft caps (null: none). */
static void gemma_fields(cJSON *cfg, const nv_config *c, int gen) {
    cJSON_AddStringToObject(cfg, "hidden_activation", "gelu_pytorch_tanh");
    if (gen == 1) return;
    const float div = c->attn_div != 0.0f ? c->attn_div : sqrtf((float)c->head_dim);
    cJSON_AddNumberToObject(cfg, "query_pre_attn_scalar", (double)lrintf(div * div));
    cJSON_AddNumberToObject(cfg, "sliding_window", c->swa_window);
    if (!(gen == 3 && c->swa_period > c->n_layers)) add_layer_types(cfg, c); /* (no full layer: Gemma 3's period alone says it) */
    if (gen == 3) {
        cJSON_AddNumberToObject(cfg, "sliding_window_pattern", c->swa_period);
        cJSON_AddNumberToObject(cfg, "rope_local_base_freq", shortest(c->rope_theta_swa));
    }
    const float caps[2] = {c->logit_softcap, c->attn_softcap};
    static const char *const cap_key[2] = {"final_logit_softcapping", "attn_logit_softcapping"};
    for (int i = 0; i < 2; i++)
        if (caps[i] != 0.0f) cJSON_AddNumberToObject(cfg, cap_key[i], shortest(caps[i]));
        else cJSON_AddNullToObject(cfg, cap_key[i]);
}

nv_err nv_hf_save(const nv_model *m, const nv_tokenizer *tok, const char *dir, nv_hf_dtype dtype, const char *chat_template) {
    const nv_config *c = &m->config;
    if (c->gpt_oss) /* transformers' GptOss folder fuses gate and up and keeps MXFP4 blocks of its own layout */
        return nv_fail(NV_EUNSUPPORTED, "%s: gpt-oss is not written as a Hugging Face folder (export GGUF instead)", dir);
    const int yarn = c->yarn.factor != 0.0f, llama3 = c->llama3.factor != 0.0f; /* their parameters, not their divisors */
    int linear = c->n_rope_factors > 0 && !yarn && !llama3; /* one divisor for every frequency: linear scaling by it */
    for (int i = 1; linear && i < c->n_rope_factors; i++) linear &= c->rope_factors[i] == c->rope_factors[0];
    /* Phi-3's folder (fused projections, write_weights) for llama's block with RoPE on part of each
       head or other per-pair divisors: LongRoPE's two sets, both the one nerve runs */
    const int phi3 = nv_config_phi3_form(c, 1) && (c->rope_dim || c->longrope_orig || !linear);
    linear &= !phi3;
    if (c->n_rope_factors && !linear && !yarn && !llama3 && !phi3)
        return nv_fail(NV_EUNSUPPORTED, "%s: RoPE frequency factors beside this model's other parts have no form in config.json (export GGUF instead)",
                       dir);
    if (c->rope_attn != 0.0f && !(phi3 && c->n_rope_factors)) /* transformers' only carrier of it: longrope's */
        return nv_fail(NV_EUNSUPPORTED, "%s: RoPE's attention factor without LongRoPE's divisors has no form in config.json (export GGUF instead)",
                       dir);
    if (c->attn_temp_scale != 0.0f)
        return nv_fail(NV_EUNSUPPORTED, "%s: Ministral 3's attention temperature is not written to config.json (export GGUF instead)", dir);
    if (c->qk_norm && c->qkv_bias) return nv_fail(NV_EUNSUPPORTED, "%s: no model type has both QK-norm and projection biases", dir);
    if (c->rope_dim && !phi3) /* transformers reads partial_rotary_factor in phi3's folders */
        return nv_fail(NV_EUNSUPPORTED, "%s: RoPE on %d of each head's %d values beside this model's other parts has no form in config.json "
                                        "(export GGUF instead)",
                       dir, c->rope_dim, c->head_dim);
    if (c->n_experts && c->qkv_bias) return nv_fail(NV_EUNSUPPORTED, "%s: no model type has experts and projection biases", dir);
    if (tok && nv_tokenizer_vocab_size(tok) != c->vocab_size)
        return nv_fail(NV_EINVAL, "%s: the tokenizer has %d tokens, the model %d", dir, nv_tokenizer_vocab_size(tok), c->vocab_size);
    const int moe = c->n_experts > 0, gemma = c->ffn_gelu ? (c->qk_norm ? 3 : c->post_norms ? 2 : 1) : 0;
    const int olmo = !gemma && nv_config_olmo2_block(c) ? (c->swa_window ? 3 : 2) : 0; /* OLMo 2, OLMo 3 with its window */
    /* a mixture: Mixtral, or Qwen3-MoE with QK-norm (every layer's experts, weights renormalised);
       the Gemma generations; SmolLM3 (layers without RoPE) */
    static const char *const gemma_type[][2] = {{"gemma", "GemmaForCausalLM"}, {"gemma2", "Gemma2ForCausalLM"},
                                                {"gemma3_text", "Gemma3ForCausalLM"}};
    const int granite = nv_config_granite(c); /* with experts: GraniteMoe (write_weights fuses them) */
    const char *type = gemma ? gemma_type[gemma - 1][0] : olmo ? (olmo == 3 ? "olmo3" : "olmo2")
                       : c->nope_period ? "smollm3" : granite ? (moe ? "granitemoe" : "granite")
                       : moe ? (c->qk_norm ? "qwen3_moe" : "mixtral")
                       : phi3 ? "phi3"
                       : c->qk_norm ? "qwen3" : c->qkv_bias ? "qwen2" : "llama";
    const char *cls = gemma ? gemma_type[gemma - 1][1] : olmo ? (olmo == 3 ? "Olmo3ForCausalLM" : "Olmo2ForCausalLM")
                      : c->nope_period ? "SmolLM3ForCausalLM"
                      : granite ? (moe ? "GraniteMoeForCausalLM" : "GraniteForCausalLM")
                      : moe ? (c->qk_norm ? "Qwen3MoeForCausalLM" : "MixtralForCausalLM")
                      : phi3 ? "Phi3ForCausalLM"
                      : c->qk_norm ? "Qwen3ForCausalLM" : c->qkv_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
    cJSON *cfg = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(cfg, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString(cls));
    cJSON_AddStringToObject(cfg, "model_type", type);
    cJSON_AddNumberToObject(cfg, "hidden_size", c->dim);
    cJSON_AddNumberToObject(cfg, "intermediate_size", c->hidden_dim);
    if (moe) {
        cJSON_AddNumberToObject(cfg, c->qk_norm ? "num_experts" : "num_local_experts", c->n_experts);
        cJSON_AddNumberToObject(cfg, "num_experts_per_tok", c->n_experts_used);
        if (c->qk_norm) {
            cJSON_AddNumberToObject(cfg, "moe_intermediate_size", c->hidden_dim);
            cJSON_AddBoolToObject(cfg, "norm_topk_prob", 1);
            cJSON_AddNumberToObject(cfg, "decoder_sparse_step", 1);
            cJSON_AddArrayToObject(cfg, "mlp_only_layers");
        }
        cJSON_AddBoolToObject(cfg, "output_router_logits", 0);
    }
    cJSON_AddNumberToObject(cfg, "num_hidden_layers", c->n_layers);
    cJSON_AddNumberToObject(cfg, "num_attention_heads", c->n_heads);
    cJSON_AddNumberToObject(cfg, "num_key_value_heads", c->n_kv_heads);
    cJSON_AddNumberToObject(cfg, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(cfg, "max_position_embeddings", c->seq_len);
    cJSON_AddNumberToObject(cfg, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(cfg, "rms_norm_eps", shortest(c->norm_eps));
    cJSON_AddNumberToObject(cfg, "rope_theta", shortest(c->rope_theta));
    if (linear) {
        cJSON *rs = cJSON_AddObjectToObject(cfg, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "linear");
        cJSON_AddNumberToObject(rs, "factor", c->rope_factors[0]);
    } else if (yarn) {
        cJSON *rs = cJSON_AddObjectToObject(cfg, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "yarn");
        cJSON_AddNumberToObject(rs, "factor", shortest(c->yarn.factor));
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings", c->yarn.orig_ctx);
        cJSON_AddNumberToObject(rs, "beta_fast", shortest(c->yarn.beta_fast));
        cJSON_AddNumberToObject(rs, "beta_slow", shortest(c->yarn.beta_slow));
        cJSON_AddNumberToObject(rs, "attention_factor", shortest(c->yarn.attn_factor));
        if (c->yarn.no_truncate) cJSON_AddBoolToObject(rs, "truncate", 0);
    } else if (llama3) {
        cJSON *rs = cJSON_AddObjectToObject(cfg, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "llama3");
        cJSON_AddNumberToObject(rs, "factor", shortest(c->llama3.factor));
        cJSON_AddNumberToObject(rs, "low_freq_factor", shortest(c->llama3.low_freq_factor));
        cJSON_AddNumberToObject(rs, "high_freq_factor", shortest(c->llama3.high_freq_factor));
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings", c->llama3.orig_ctx);
    } else if (phi3 && c->n_rope_factors) { /* longrope_factors reads it back: LongRoPE's two sets, or one set as both */
        cJSON *rs = cJSON_AddObjectToObject(cfg, "rope_scaling");
        cJSON_AddStringToObject(rs, "type", "longrope");
        for (int set = 0; set < 2; set++) {
            const float *f = set && c->longrope_orig ? c->rope_factors_short : c->rope_factors;
            cJSON *list = cJSON_AddArrayToObject(rs, set ? "short_factor" : "long_factor");
            for (int i = 0; i < c->n_rope_factors; i++) cJSON_AddItemToArray(list, cJSON_CreateNumber(shortest(f[i])));
        }
        cJSON_AddNumberToObject(rs, "attention_factor", c->rope_attn != 0.0f ? shortest(c->rope_attn) : 1.0);
        /* where the short set ends; with one set, the whole context (so it is the one read) */
        cJSON_AddNumberToObject(cfg, "original_max_position_embeddings", c->longrope_orig ? c->longrope_orig : c->seq_len);
    } else {
        cJSON_AddNullToObject(cfg, "rope_scaling");
    }
    if (c->rope_dim) { /* a factor whose int(head_dim x factor) is the count again (transformers' rounding) */
        double f = (double)c->rope_dim / c->head_dim;
        if ((int)(c->head_dim * f) != c->rope_dim) f = nextafter(f, 1.0);
        cJSON_AddNumberToObject(cfg, "partial_rotary_factor", f);
    }
    cJSON_AddStringToObject(cfg, "hidden_act", gemma ? "gelu_pytorch_tanh" : "silu");
    if (gemma) gemma_fields(cfg, c, gemma);
    if (olmo == 3) { /* olmo_block reads them back */
        cJSON_AddNumberToObject(cfg, "sliding_window", c->swa_window);
        add_layer_types(cfg, c);
    }
    if (c->nope_period) { /* both forms: transformers reads the list, other readers the interval */
        if (c->nope_period <= c->n_layers) { /* (no layer without RoPE: the interval alone says it) */
            cJSON *list = cJSON_AddArrayToObject(cfg, "no_rope_layers");
            for (int l = 0; l < c->n_layers; l++) cJSON_AddItemToArray(list, cJSON_CreateNumber(nv_config_layer_roped(c, l)));
        }
        cJSON_AddNumberToObject(cfg, "no_rope_layer_interval", c->nope_period);
        cJSON_AddBoolToObject(cfg, "use_sliding_window", 0);
    }
    if (granite) { /* granite_scales reads them back; the score factor is a double whose inverse is the divisor again */
        cJSON_AddNumberToObject(cfg, "embedding_multiplier", shortest(nv_config_emb_scale(c)));
        cJSON_AddNumberToObject(cfg, "attention_multiplier", 1.0 / nv_config_attn_div(c));
        cJSON_AddNumberToObject(cfg, "residual_multiplier", shortest(nv_config_residual_scale(c)));
        cJSON_AddNumberToObject(cfg, "logits_scaling", shortest(nv_config_logit_div(c)));
        cJSON_AddBoolToObject(cfg, "mlp_bias", 0);
    }
    cJSON_AddBoolToObject(cfg, "tie_word_embeddings", c->shared_classifier);
    if (m->matryoshka) cJSON_AddBoolToObject(cfg, "is_matryoshka", 1); /* (its embeddings may be cut: folder_matryoshka reads it) */
    if (m->n_mrl_dims) cJSON_AddItemToObject(cfg, "matryoshka_dimensions", cJSON_CreateIntArray(m->mrl_dims, m->n_mrl_dims));
    if (!c->qkv_bias) cJSON_AddBoolToObject(cfg, "attention_bias", 0);
    cJSON_AddNumberToObject(cfg, "initializer_range", 0.02);
    cJSON_AddBoolToObject(cfg, "use_cache", 1);
    cJSON_AddStringToObject(cfg, "torch_dtype", dtype == NV_HF_F32 ? "float32" : dtype == NV_HF_BF16 ? "bfloat16" : "float16");
    /* what config.json says must read back as this model: else no folder is written */
    nv_config back;
    int tied = 0, kept = 0;
    nv_err said = config_of(dir, cfg, &back, &tied, &kept);
    back.shared_classifier = tied;
    if (said != NV_OK || memcmp(&back, c, sizeof back)) {
        char why[256];
        snprintf(why, sizeof why, "%s", said != NV_OK ? nv_errmsg() : "");
        cJSON_Delete(cfg);
        return nv_fail(NV_EUNSUPPORTED, "%s: this model's config has no form in config.json that reads back the same (export GGUF instead)%s%s",
                       dir, *why ? ": " : "", why);
    }
    nv_err made = nv_mkdirs(dir);
    if (made != NV_OK) {
        cJSON_Delete(cfg);
        return made;
    }
    cJSON *gen = cJSON_CreateObject();
    const int bos = tok ? nv_tokenizer_bos(tok) : -1, eos = tok ? nv_tokenizer_eos(tok) : -1;
    if (bos >= 0) cJSON_AddNumberToObject(cfg, "bos_token_id", bos), cJSON_AddNumberToObject(gen, "bos_token_id", bos);
    if (eos >= 0) cJSON_AddNumberToObject(cfg, "eos_token_id", eos), cJSON_AddNumberToObject(gen, "eos_token_id", eos);
    cJSON *tj = NULL, *tc = NULL;
    /* the folder is no model until this one is whole in it (config.json last): an export that fails
       part way leaves no earlier config.json beside these weights; an earlier model's files this export
       does not write, which would go with these weights, go */
    static const char *const stale[] = {"config.json",    "model.safetensors.index.json", "chat_template.jinja",
                                        "chat_template.json", "tokenizer.model", "special_tokens_map.json",
                                        "added_tokens.json", "modules.json", "1_Pooling/config.json"},
                             *const stale_tok[] = {"tokenizer.json", "tokenizer_config.json"}; /* (written with -z) */
    nv_unlink_in_dir(dir, stale, sizeof stale / sizeof *stale);
    if (!tok) nv_unlink_in_dir(dir, stale_tok, sizeof stale_tok / sizeof *stale_tok);
    nv_err e = write_weights(m, dir, dtype, phi3);
    if (e == NV_OK && tok) e = tokenizer_files(tok, c, &tj, &tc);
    if (e == NV_OK && tok && chat_template && !cJSON_AddStringToObject(tc, "chat_template", chat_template))
        e = nv_fail(NV_ENOMEM, "out of memory");
    if (e == NV_OK && tok) e = write_json(dir, "tokenizer.json", tj);
    if (e == NV_OK && tok) e = write_json(dir, "tokenizer_config.json", tc);
    if (e == NV_OK) e = write_json(dir, "generation_config.json", gen);
    if (e == NV_OK && m->pooling) e = write_pooling(dir, m->pooling, c->dim);
    if (e == NV_OK) e = write_json(dir, "config.json", cfg); /* last: a folder is a model once it is there */
    cJSON_Delete(cfg);
    cJSON_Delete(gen);
    cJSON_Delete(tj);
    cJSON_Delete(tc);
    return e;
}

/* ---- PEFT LoRA adapters: adapter_config.json + adapter_model.safetensors ------------------------ */

/* transformers' module of each adapted matrix, in the plan order (q, k, v, o, gate, down, up). */
static const char *const lora_module[NV_LAYER_MATRICES] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                           "self_attn.o_proj", "mlp.gate_proj",    "mlp.down_proj",
                                                           "mlp.up_proj"};

/* The adapter folder's adapter_config.json from path (the folder, its config or its weights). */
static void peft_config_path(const char *path, char *out, size_t cap) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) snprintf(out, cap, "%s/adapter_config.json", path);
    else sibling(path, "adapter_config.json", out, cap);
}

int nv_hf_is_lora(const char *path) {
    struct stat st;
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    const size_t bl = strlen(base);
    if (!(stat(path, &st) == 0 && S_ISDIR(st.st_mode)) && strcmp(base, "adapter_config.json") &&
        !(bl > 12 && !strcmp(base + bl - 12, ".safetensors")))
        return 0; /* any other file (a GGUF adapter) is read as what it is */
    char cfg[HF_PATH];
    peft_config_path(path, cfg, sizeof cfg);
    return nv_file_exists(cfg);
}

/* "base_model.model.model.layers.N.<module>.lora_A.weight": layer, matrix and half (0 A, 1 B). */
static int peft_tensor_of(const char *name, const nv_config *c, int *l, int *t, int *half) {
    int at = 0;
    if (sscanf(name, "base_model.model.model.layers.%d.%n", l, &at) != 1 || !at || *l < 0 || *l >= c->n_layers) return 0;
    for (int k = 0; k < NV_LAYER_MATRICES; k++) {
        const size_t ml = strlen(lora_module[k]);
        if (strncmp(name + at, lora_module[k], ml)) continue;
        const char *rest = name + at + ml;
        if (!strcmp(rest, ".lora_A.weight") || !strcmp(rest, ".lora_B.weight")) {
            *t = k;
            *half = rest[6] == 'B';
            return 1;
        }
    }
    return 0;
}

static nv_err peft_config(const char *path, const cJSON *j, float *alpha, int *rslora, int64_t *r) {
    const char *type = str_of(field(j, "peft_type"));
    char shown[128];
    if (type && strcmp(type, "LORA"))
        return nv_fail(NV_EUNSUPPORTED, "%s: peft_type '%s': only LoRA adapters are read", path,
                       nv_gguf_shown(type, strlen(type), shown, sizeof shown));
    int dora = 0, fan = 0;
    NV_TRY(get_flag(path, j, "use_dora", 0, &dora));
    NV_TRY(get_flag(path, j, "fan_in_fan_out", 0, &fan));
    NV_TRY(get_flag(path, j, "use_rslora", 0, rslora));
    const char *bias = str_of(field(j, "bias"));
    const cJSON *save = field(j, "modules_to_save"), *rp = field(j, "rank_pattern"), *ap = field(j, "alpha_pattern");
    if (dora || fan || (bias && strcmp(bias, "none")) || (cJSON_IsArray(save) && cJSON_GetArraySize(save)) ||
        (cJSON_IsObject(rp) && rp->child) || (cJSON_IsObject(ap) && ap->child))
        return nv_fail(NV_EUNSUPPORTED, "%s: %s is not supported (plain LoRA of the attention and FFN matrices is)", path,
                       dora ? "DoRA (use_dora)" : fan ? "fan_in_fan_out" : bias && strcmp(bias, "none") ? "training biases"
                       : cJSON_IsArray(save) && cJSON_GetArraySize(save) ? "modules_to_save"
                                                                            : "a rank or alpha per module");
    double a;
    NV_TRY(get_whole(path, j, "r", 8, 0, 1, 1024, r));
    NV_TRY(get_real(path, j, "lora_alpha", 8.0, &a));
    if (!(a > 0 && a <= 1e6)) return nv_fail(NV_EFORMAT, "%s: lora_alpha %g is out of range", path, a);
    *alpha = (float)a;
    return NV_OK;
}

nv_err nv_hf_load_lora(const char *path, const nv_config *c, nv_lora_shape *s, float **out) {
    *out = NULL;
    memset(s, 0, sizeof *s);
    char cfg_path[HF_PATH], st_path[HF_PATH], shown[128];
    peft_config_path(path, cfg_path, sizeof cfg_path);
    cJSON *j;
    NV_TRY(json_file(cfg_path, 0, &j));
    float alpha = 0;
    int rslora = 0;
    int64_t r = 0;
    nv_err e = peft_config(cfg_path, j, &alpha, &rslora, &r);
    cJSON_Delete(j);
    st_set set = {0};
    const int L = c->n_layers;
    st_tensor **pair = calloc((size_t)L * NV_LAYER_MATRICES * 2, sizeof *pair);
    if (e == NV_OK && !pair) e = nv_fail(NV_ENOMEM, "out of memory");
    if (e == NV_OK) e = st_open_file(&set, sibling(cfg_path, "adapter_model.safetensors", st_path, sizeof st_path));
    for (size_t i = 0; i < set.n && e == NV_OK; i++) {
        st_tensor *x = &set.t[i];
        int l, t, half, out_dim, in_dim;
        if (!peft_tensor_of(x->name, c, &l, &t, &half)) {
            e = nv_fail(NV_EUNSUPPORTED, "%s: tensor '%s' is not a LoRA A or B of a layer's attention or FFN matrix of this model",
                        st_path, nv_gguf_shown(x->name, strlen(x->name), shown, sizeof shown));
            break;
        }
        nv_lora_dims(c, t, &out_dim, &in_dim);
        const uint64_t rank = half ? x->shape[1] : x->shape[0];
        if (x->ndim != 2 || x->shape[half ? 0 : 1] != (uint64_t)(half ? out_dim : in_dim) || rank != (uint64_t)r ||
            x->dtype == ST_OTHER) {
            e = nv_fail(NV_EFORMAT, "%s: tensor '%s' is not [r, %d] (lora_A) or [%d, r] (lora_B) in F32, F16 or BF16, r = %lld",
                        st_path, nv_gguf_shown(x->name, strlen(x->name), shown, sizeof shown), in_dim, out_dim, (long long)r);
            break;
        }
        pair[(l * NV_LAYER_MATRICES + t) * 2 + half] = x;
        s->targets |= 1u << t;
    }
    for (int i = 0; i < L * NV_LAYER_MATRICES && e == NV_OK; i++)
        if (!pair[2 * i] != !pair[2 * i + 1])
            e = nv_fail(NV_EFORMAT, "%s: layer %d's %s has lora_%c without lora_%c", st_path, i / NV_LAYER_MATRICES,
                        lora_module[i % NV_LAYER_MATRICES], pair[2 * i] ? 'A' : 'B', pair[2 * i] ? 'B' : 'A');
    if (e == NV_OK && !s->targets) e = nv_fail(NV_EFORMAT, "%s: the adapter holds no tensors", st_path);
    s->rank = (int)r;
    s->alpha = rslora ? alpha * sqrtf((float)r) : alpha; /* rsLoRA scales by alpha / sqrt(r) */
    if (e == NV_OK) e = nv_lora_validate(c, s);
    const uint64_t n = e == NV_OK ? nv_lora_param_count(c, s) : 0;
    float *p = NULL, *b = NULL;
    if (e == NV_OK) {
        p = calloc((size_t)n, sizeof(float));
        b = malloc((size_t)r * (size_t)(c->dim + c->hidden_dim + nv_config_q_dim(c)) * sizeof(float));
        if (!p || !b) e = nv_fail(NV_ENOMEM, "out of memory for the adapter");
    }
    for (int l = 0; l < L && e == NV_OK; l++)
        for (int t = 0; t < NV_LAYER_MATRICES && e == NV_OK; t++) {
            st_tensor *const *ab = &pair[(l * NV_LAYER_MATRICES + t) * 2];
            if (!ab[0]) continue; /* adapted in other layers: zeros, no change here */
            int out_dim, in_dim;
            nv_lora_dims(c, t, &out_dim, &in_dim);
            float *a = p + nv_lora_offset(c, s, l, t);
            st_convert(ab[0], (uint64_t)r * (uint64_t)in_dim, a);
            st_convert(ab[1], (uint64_t)r * (uint64_t)out_dim, b);
            /* B's query and key rows in transformers' RoPE order, then transposed into B^T */
            e = nv_lora_b_rows_reorder(c, t, b, r, 0);
            for (int o = 0; o < out_dim; o++)
                for (int k = 0; k < r; k++) a[(size_t)r * in_dim + (size_t)k * out_dim + o] = b[(size_t)o * r + k];
        }
    for (uint64_t i = 0; i < n && e == NV_OK; i++)
        if (!isfinite(p[i])) e = nv_fail(NV_EFORMAT, "%s: the adapter holds a value that is not finite", st_path);
    free(b);
    free(pair);
    st_close(&set);
    if (e != NV_OK) {
        free(p);
        memset(s, 0, sizeof *s);
        return e;
    }
    *out = p;
    return NV_OK;
}

nv_err nv_hf_save_lora(const nv_config *c, const nv_lora_shape *s, const float *p, float lora_dropout, const char *dir) {
    NV_TRY(nv_lora_validate(c, s));
    const int r = s->rank, L = c->n_layers;
    int n_targets = 0;
    for (int t = 0; t < NV_LAYER_MATRICES; t++) n_targets += (s->targets >> t) & 1;
    const size_t nt = (size_t)L * (size_t)n_targets * 2;
    st_out *o = calloc(nt, sizeof *o);
    float *b = malloc((size_t)nv_lora_param_count(c, s) * sizeof(float)); /* every B, untransposed */
    nv_err e = o && b ? nv_mkdirs(dir) : nv_fail(NV_ENOMEM, "out of memory");
    if (e == NV_OK) /* (written last, as config.json is: no earlier adapters' config beside these weights) */
        nv_unlink_in_dir(dir, (const char *const[]){"adapter_config.json"}, 1);
    size_t k = 0, at = 0;
    for (int l = 0; l < L && e == NV_OK; l++)
        for (int t = 0; t < NV_LAYER_MATRICES && e == NV_OK; t++) {
            if (!((s->targets >> t) & 1)) continue;
            int out_dim, in_dim;
            nv_lora_dims(c, t, &out_dim, &in_dim);
            const float *a = p + nv_lora_offset(c, s, l, t), *bt = a + (size_t)r * in_dim;
            float *bl = b + at;
            at += (size_t)out_dim * r;
            for (int oo = 0; oo < out_dim; oo++)
                for (int q = 0; q < r; q++) bl[(size_t)oo * r + q] = bt[(size_t)q * out_dim + oo];
            e = nv_lora_b_rows_reorder(c, t, bl, r, 1);
            for (int half = 0; half < 2; half++, k++) {
                snprintf(o[k].name, sizeof o[k].name, "base_model.model.model.layers.%d.%s.lora_%c.weight", l, lora_module[t],
                         half ? 'B' : 'A');
                o[k].rows = half ? (uint64_t)out_dim : (uint64_t)r;
                o[k].cols = half ? (uint64_t)r : (uint64_t)in_dim;
                o[k].p = half ? bl : a;
            }
        }
    char path[HF_PATH];
    if (e == NV_OK) e = st_write(strcat(strcpy(path, dir), "/adapter_model.safetensors"), o, k, NV_HF_F32);
    if (e == NV_OK) {
        cJSON *j = cJSON_CreateObject(), *targets = cJSON_CreateArray();
        cJSON_AddStringToObject(j, "peft_type", "LORA");
        cJSON_AddStringToObject(j, "task_type", "CAUSAL_LM");
        cJSON_AddNumberToObject(j, "r", r);
        cJSON_AddNumberToObject(j, "lora_alpha", shortest(s->alpha));
        cJSON_AddNumberToObject(j, "lora_dropout", shortest(lora_dropout));
        cJSON_AddStringToObject(j, "bias", "none");
        cJSON_AddBoolToObject(j, "fan_in_fan_out", 0);
        cJSON_AddBoolToObject(j, "use_rslora", 0);
        cJSON_AddBoolToObject(j, "use_dora", 0);
        cJSON_AddBoolToObject(j, "inference_mode", 1);
        for (int t = 0; t < NV_LAYER_MATRICES; t++)
            if ((s->targets >> t) & 1) cJSON_AddItemToArray(targets, cJSON_CreateString(strchr(lora_module[t], '.') + 1));
        cJSON_AddItemToObject(j, "target_modules", targets);
        e = write_json(dir, "adapter_config.json", j);
        cJSON_Delete(j);
    }
    free(o);
    free(b);
    return e;
}

nv_err nv_lora_load(const char *path, const nv_config *c, nv_lora_shape *s, float **params) {
    return nv_hf_is_lora(path) ? nv_hf_load_lora(path, c, s, params) : nv_gguf_load_lora(path, c, s, params);
}
