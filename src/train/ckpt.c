#include "train/ckpt.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h" /* nv_checksum64, the file's checksum */
#include "model/lora.h"

static const char CKPT_MAGIC[8] = {'N', 'V', 'C', 'K', 'P', 'T', '0', '1'};
#define CKPT_VERSION 12u
/* version 1's header: the fields before the LoRA ones; version 2's: before the RoPE ones; version 3's:
 * before the layers without RoPE; version 4's: before the Gemma block's; version 5's: before Granite's;
 * version 6's and 7's: before LongRoPE's short set, rope_dim a reserved 0 in 6 (version 7 gives it
 * partial rotation, which version 6 readers would have run as whole); version 8's is version 9's
 * size, its no_pre_norms a reserved 0 (version 9 gives it OLMo 2's block, and QK-norm 2, which
 * version 8 readers refuse); version 9's: before the best validation loss; version 10's: before
 * the length --time-budget decided; version 11's: before the attention temperature */
#define CKPT_V1_HEADER offsetof(nv_ckpt_header, lora_rank)
#define CKPT_V2_HEADER offsetof(nv_ckpt_header, n_rope_factors)
#define CKPT_V3_HEADER offsetof(nv_ckpt_header, nope_period)
#define CKPT_V4_HEADER offsetof(nv_ckpt_header, swa_window)
#define CKPT_V5_HEADER offsetof(nv_ckpt_header, residual_scale)
#define CKPT_V7_HEADER offsetof(nv_ckpt_header, longrope_orig)
#define CKPT_V9_HEADER offsetof(nv_ckpt_header, best_step)
#define CKPT_V10_HEADER offsetof(nv_ckpt_header, budget_steps)
#define CKPT_V11_HEADER offsetof(nv_ckpt_header, attn_temp_scale)
_Static_assert(offsetof(nv_ckpt_header, lora_rank) == 120, "version 1's header is 120 bytes");
_Static_assert(offsetof(nv_ckpt_header, n_rope_factors) == 144, "version 2's header is 144 bytes");
_Static_assert(offsetof(nv_ckpt_header, nope_period) == 1216, "version 3's header is 1216 bytes");
_Static_assert(offsetof(nv_ckpt_header, swa_window) == 1224, "version 4's header is 1224 bytes");
_Static_assert(offsetof(nv_ckpt_header, residual_scale) == 1264, "version 5's header is 1264 bytes");
_Static_assert(offsetof(nv_ckpt_header, longrope_orig) == 1272, "versions 6 and 7's header is 1272 bytes");
_Static_assert(CKPT_V9_HEADER == 2304, "versions 8 and 9's header is 2304 bytes");
_Static_assert(CKPT_V10_HEADER == 2320, "version 10's header is 2320 bytes");
_Static_assert(CKPT_V11_HEADER == 2328, "version 11's header is 2328 bytes");
_Static_assert(sizeof(nv_ckpt_header) == 2344, "version 12's header is 2344 bytes (docs/formats.md)");

void nv_ckpt_header_set_config(nv_ckpt_header *h, const nv_config *c) {
    h->dim = c->dim;
    h->hidden_dim = c->hidden_dim;
    h->n_layers = c->n_layers;
    h->n_heads = c->n_heads;
    h->n_kv_heads = c->n_kv_heads;
    h->head_dim = c->head_dim;
    h->vocab_size = c->vocab_size;
    h->seq_len = c->seq_len;
    h->shared_classifier = c->shared_classifier;
    h->qk_norm = c->qk_norm;
    h->qkv_bias = c->qkv_bias;
    h->n_experts = c->n_experts;
    h->n_experts_used = c->n_experts_used;
    h->nope_period = c->nope_period;
    h->swa_window = c->swa_window, h->swa_period = c->swa_period, h->rope_theta_swa = c->rope_theta_swa;
    h->ffn_gelu = c->ffn_gelu, h->post_norms = c->post_norms, h->emb_scale = c->emb_scale, h->attn_div = c->attn_div;
    h->logit_softcap = c->logit_softcap, h->attn_softcap = c->attn_softcap;
    h->residual_scale = c->residual_scale, h->logit_div = c->logit_div;
    h->rope_dim = c->rope_dim;
    h->longrope_orig = c->longrope_orig;
    h->no_pre_norms = c->no_pre_norms;
    h->attn_temp_scale = c->attn_temp_scale, h->attn_temp_len = c->attn_temp_len, h->arch_mistral3 = c->arch_mistral3;
    memcpy(h->rope_factors_short, c->rope_factors_short, sizeof h->rope_factors_short);
    h->rope_theta = c->rope_theta;
    h->norm_eps = c->norm_eps;
    h->n_rope_factors = c->n_rope_factors;
    memcpy(h->rope_factors, c->rope_factors, sizeof h->rope_factors);
    h->yarn_factor = c->yarn.factor, h->yarn_beta_fast = c->yarn.beta_fast, h->yarn_beta_slow = c->yarn.beta_slow;
    /* without YaRN its attention factor's field carries rope_attn (0 in older files: none) */
    h->yarn_attn_factor = c->yarn.factor != 0.0f ? c->yarn.attn_factor : c->rope_attn;
    h->yarn_orig_ctx = c->yarn.orig_ctx, h->yarn_no_truncate = c->yarn.no_truncate;
    h->llama3_factor = c->llama3.factor, h->llama3_low_freq_factor = c->llama3.low_freq_factor;
    h->llama3_high_freq_factor = c->llama3.high_freq_factor, h->llama3_orig_ctx = c->llama3.orig_ctx;
}

void nv_ckpt_header_get_config(const nv_ckpt_header *h, nv_config *c) {
    memset(c, 0, sizeof *c);
    c->dim = h->dim;
    c->hidden_dim = h->hidden_dim;
    c->n_layers = h->n_layers;
    c->n_heads = h->n_heads;
    c->n_kv_heads = h->n_kv_heads;
    c->head_dim = h->head_dim;
    c->vocab_size = h->vocab_size;
    c->seq_len = h->seq_len;
    c->shared_classifier = h->shared_classifier;
    c->qk_norm = h->qk_norm;
    c->qkv_bias = h->qkv_bias;
    c->n_experts = h->n_experts;
    c->n_experts_used = h->n_experts_used;
    c->nope_period = h->nope_period;
    c->swa_window = h->swa_window, c->swa_period = h->swa_period, c->rope_theta_swa = h->rope_theta_swa;
    c->ffn_gelu = h->ffn_gelu, c->post_norms = h->post_norms, c->emb_scale = h->emb_scale, c->attn_div = h->attn_div;
    c->logit_softcap = h->logit_softcap, c->attn_softcap = h->attn_softcap;
    c->residual_scale = h->residual_scale, c->logit_div = h->logit_div;
    c->rope_dim = h->rope_dim;
    c->longrope_orig = h->longrope_orig;
    c->no_pre_norms = h->no_pre_norms;
    c->attn_temp_scale = h->attn_temp_scale, c->attn_temp_len = h->attn_temp_len, c->arch_mistral3 = h->arch_mistral3;
    memcpy(c->rope_factors_short, h->rope_factors_short, sizeof c->rope_factors_short);
    c->rope_theta = h->rope_theta;
    c->norm_eps = h->norm_eps;
    c->n_rope_factors = h->n_rope_factors;
    memcpy(c->rope_factors, h->rope_factors, sizeof c->rope_factors);
    c->yarn = (nv_rope_yarn){h->yarn_factor, h->yarn_orig_ctx, h->yarn_beta_fast, h->yarn_beta_slow, h->yarn_attn_factor,
                             h->yarn_no_truncate};
    if (h->yarn_factor == 0.0f) c->yarn.attn_factor = 0.0f, c->rope_attn = h->yarn_attn_factor;
    c->llama3 = (nv_rope_llama3){h->llama3_factor, h->llama3_low_freq_factor, h->llama3_high_freq_factor, h->llama3_orig_ctx};
}

/* The checksum of a checkpoint's parts, hashed part by part in file order (h: the header's hbytes
 * bytes; n_params floats each of params, m, v). */
static uint64_t ckpt_sum(uint32_t version, uint32_t hbytes, const void *h, uint64_t n_params, const float *params,
                         const float *m, const float *v) {
    size_t n = (size_t)n_params * sizeof(float);
    uint64_t sum = nv_checksum64(CKPT_MAGIC, 8, 0);
    sum = nv_checksum64(&version, 4, sum);
    sum = nv_checksum64(&hbytes, 4, sum);
    sum = nv_checksum64(h, hbytes, sum);
    sum = nv_checksum64(params, n, sum);
    sum = nv_checksum64(m, n, sum);
    return nv_checksum64(v, n, sum);
}

nv_err nv_ckpt_save(const char *path, const nv_ckpt_header *h, const float *params, const float *m, const float *v) {
    uint32_t version = CKPT_VERSION, hbytes = (uint32_t)sizeof *h;
    size_t n = (size_t)h->n_params * sizeof(float);
    uint64_t sum = ckpt_sum(version, hbytes, h, h->n_params, params, m, v);
    nv_iov parts[] = {{CKPT_MAGIC, 8}, {&version, 4}, {&hbytes, 4}, {h, sizeof *h},
                      {params, n},     {m, n},        {v, n},       {&sum, 8}};
    return nv_file_write_atomic(path, parts, 8);
}

nv_err nv_ckpt_load(const char *path, nv_ckpt *out) {
    memset(out, 0, sizeof *out);
    nv_mapped map;
    NV_TRY(nv_file_map(path, &map));
    nv_reader r = nv_reader_make(map.data, map.len, path);
    nv_err e;
    char magic[8];
    uint32_t version, hbytes;
    if ((e = nv_read_bytes(&r, magic, 8, "magic")) || memcmp(magic, CKPT_MAGIC, 8) != 0) {
        e = nv_fail(NV_EFORMAT, "%s: not a nerve training checkpoint (bad magic)", path);
        goto fail;
    }
    if ((e = nv_read_u32(&r, &version, "version"))) goto fail;
    if (version < 1 || version > CKPT_VERSION) {
        e = nv_fail(NV_EUNSUPPORTED, "%s: checkpoint format version %u is not supported (this build reads 1 to %u)", path,
                    version, CKPT_VERSION);
        goto fail;
    }
    if ((e = nv_read_u32(&r, &hbytes, "header size"))) goto fail;
    const size_t want_h = version == 1 ? CKPT_V1_HEADER : version == 2 ? CKPT_V2_HEADER : version == 3 ? CKPT_V3_HEADER
                          : version == 4 ? CKPT_V4_HEADER : version == 5 ? CKPT_V5_HEADER : version <= 7 ? CKPT_V7_HEADER
                          : version <= 9 ? CKPT_V9_HEADER : version == 10 ? CKPT_V10_HEADER : version == 11 ? CKPT_V11_HEADER : sizeof out->h;
    if (hbytes != want_h) {
        e = nv_fail(NV_EFORMAT, "%s: header size %u, expected %zu", path, hbytes, want_h);
        goto fail;
    }
    if ((e = nv_read_bytes(&r, &out->h, want_h, "header"))) goto fail; /* older versions: the later fields stay 0 */
    if (version < 7) out->h.rope_dim = 0; /* reserved then */
    if (version < 9) out->h.no_pre_norms = 0;
    if (version < 10) out->h.best_val_loss = NAN; /* no best known */
    if (out->h.budget_steps < 0 || (out->h.budget_steps > 0 && out->h.budget_steps < out->h.step) || out->h.budget_steps > INT32_MAX) {
        e = nv_fail(NV_EFORMAT, "%s: a decided length of %lld steps at step %lld: out of range", path, (long long)out->h.budget_steps,
                    (long long)out->h.step);
        goto fail;
    }
    if (out->h.best_step < 0 || out->h.best_step > out->h.step || out->h.evals_since_best < 0 ||
        (!isnan(out->h.best_val_loss) && !isfinite(out->h.best_val_loss))) {
        e = nv_fail(NV_EFORMAT, "%s: best validation loss %g at step %lld, %d evaluations since: out of range (step %lld)", path,
                    (double)out->h.best_val_loss, (long long)out->h.best_step, (int)out->h.evals_since_best, (long long)out->h.step);
        goto fail;
    }
    if (out->h.n_rope_factors < 0 || out->h.n_rope_factors > NV_ROPE_FACTORS_MAX || out->h.yarn_no_truncate < 0 ||
        out->h.yarn_no_truncate > 1) {
        e = nv_fail(NV_EFORMAT, "%s: %d RoPE frequency factors (at most %d), or YaRN's truncation flag %d", path, (int)out->h.n_rope_factors,
                    NV_ROPE_FACTORS_MAX, (int)out->h.yarn_no_truncate);
        goto fail;
    }
    if ((out->h.shared_classifier != 0 && out->h.shared_classifier != 1) || (out->h.qk_norm < 0 || out->h.qk_norm > (version < 9 ? 1 : NV_QK_NORM_WHOLE)) ||
        (out->h.qkv_bias != 0 && out->h.qkv_bias != 1)) {
        e = nv_fail(NV_EFORMAT, "%s: header flags (shared classifier %d, QK-norm %d, biases %d) must be 0 or 1 (QK-norm: 2 from version 9)", path,
                    (int)out->h.shared_classifier, (int)out->h.qk_norm, (int)out->h.qkv_bias);
        goto fail;
    }
    nv_config c;
    nv_ckpt_header_get_config(&out->h, &c);
    if ((e = nv_config_validate(&c))) {
        e = nv_fail(NV_EFORMAT, "%s: %s", path, nv_errmsg());
        goto fail;
    }
    const nv_lora_shape lora = {out->h.lora_rank, out->h.lora_alpha, out->h.lora_targets};
    if (lora.rank && (e = nv_lora_validate(&c, &lora))) {
        e = nv_fail(NV_EFORMAT, "%s: %s", path, nv_errmsg());
        goto fail;
    }
    if (out->h.n_params != (out->h.lora_rank ? nv_lora_param_count(&c, &lora) : nv_config_param_count(&c))) {
        e = nv_fail(NV_EFORMAT, "%s: parameter count %llu does not match its config", path,
                    (unsigned long long)out->h.n_params);
        goto fail;
    }
    size_t n = (size_t)out->h.n_params * sizeof(float);
    if (nv_reader_left(&r) != 3 * n + 8) {
        e = nv_fail(NV_EFORMAT, "%s: truncated or oversized: %zu bytes of state, expected %zu", path,
                    nv_reader_left(&r), 3 * n + 8);
        goto fail;
    }
    const float *params = (const float *)(map.data + r.pos);
    uint64_t want;
    memcpy(&want, map.data + map.len - 8, 8);
    /* the header as the file holds it (a reserved field an older version left is cleared in out->h) */
    if (want != ckpt_sum(version, hbytes, map.data + 16, out->h.n_params, params, params + out->h.n_params, params + 2 * out->h.n_params)) {
        e = nv_fail(NV_EFORMAT, "%s: checksum mismatch: the checkpoint is corrupted", path);
        goto fail;
    }
    out->params = params;
    out->m = out->params + out->h.n_params;
    out->v = out->m + out->h.n_params;
    out->map = map;
    return NV_OK;
fail:
    nv_file_unmap(&map);
    return e;
}

void nv_ckpt_close(nv_ckpt *c) {
    nv_file_unmap(&c->map);
    memset(c, 0, sizeof *c);
}
