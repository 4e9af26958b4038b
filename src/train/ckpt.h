/* Training checkpoints: weights, AdamW state, step, data cursor and run identity in one file.
 *
 *   "NVCKPT01"  8-byte magic
 *   uint32      format version (12; versions 1 to 11, whose headers end earlier, are read)
 *   uint32      header bytes (sizeof nv_ckpt_header; 120, 144, 1216, 1224, 1264 in versions 1 to 5, 1272 in 6 and 7,
 *               2304 in 8 and 9, 2320 in 10, 2328 in 11)
 *   header      config, counters, cursor, n_params, batch/seq/accum/seed of the run, LoRA shape
 *   fp32        params[n], adam m[n], adam v[n] (a LoRA run's: the adapters')
 *   uint64      checksum of everything before it
 *
 * Written atomically (temporary file, fsync, rename), so an interrupted write leaves the
 * previous checkpoint in place. Reading checks the magic, version, header size, that the config
 * is valid and implies n_params, the exact file length and the checksum, before anything is used:
 * a truncated or corrupted file is refused with one clear error. */
#ifndef NV_CKPT_H
#define NV_CKPT_H

#include <stdint.h>

#include "base/err.h"
#include "base/file.h"
#include "model/config.h"

typedef struct {
    int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, head_dim, vocab_size, seq_len, shared_classifier, qk_norm;
    float rope_theta, norm_eps;
    int64_t step;        /* optimizer updates done */
    int64_t tokens_seen;
    uint64_t data_rng, data_windows;
    uint64_t n_params;
    int32_t batch, seq, accum, qkv_bias; /* qkv_bias: was a reserved 0, so older files read as none */
    uint64_t seed;
    float last_loss, last_val_loss;
    /* version 2: a LoRA run's adapters (lora_rank 0: the whole model). Then n_params counts the
       adapters' floats, which are what params, m and v hold, and base_hash identifies the frozen
       weights they adapt (--init-from's), which a resume must give again. */
    int32_t lora_rank;
    uint32_t lora_targets;
    float lora_alpha;
    int32_t n_experts; /* a mixture of experts (was a reserved 0, so older files read as dense) */
    uint64_t base_hash;
    /* version 3: the RoPE frequency divisors (Llama 3.1+'s, linear scaling's, YaRN's blend) and
       YaRN's parameters, as nv_config holds them; older files read as none */
    int32_t n_rope_factors;
    float rope_factors[NV_ROPE_FACTORS_MAX];
    float yarn_factor, yarn_beta_fast, yarn_beta_slow, yarn_attn_factor;
    int32_t yarn_orig_ctx, yarn_no_truncate;
    float llama3_factor, llama3_low_freq_factor, llama3_high_freq_factor; /* the rule behind Llama 3.1's divisors */
    int32_t llama3_orig_ctx, n_experts_used; /* n_experts_used: was a reserved 0 */
    /* version 4: SmolLM3's layers without RoPE (nv_config.nope_period); older files read as none */
    int32_t nope_period;
    int32_t best_metric; /* nv_train_opts.best_metric of the best below (a reserved 0 before: val_loss) */
    /* version 5: the Gemma family's block (nv_config's fields of the same names); older files read as
       llama's */
    int32_t swa_window, swa_period;
    float rope_theta_swa;
    int32_t ffn_gelu, post_norms;
    float emb_scale, attn_div, logit_softcap, attn_softcap;
    int32_t rope_dim; /* version 7: partial rotation (nv_config's; a reserved 0 before, read as none) */
    /* version 6: Granite's residual multiplier and logit divisor (nv_config's); older files read as none */
    float residual_scale, logit_div;
    /* version 8: LongRoPE's short set and where it ends (nv_config's); older files read as none */
    int32_t longrope_orig;
    int32_t no_pre_norms; /* version 9: OLMo 2's block (nv_config's; a reserved 0 before, read as llama's) */
    float rope_factors_short[NV_ROPE_FACTORS_MAX];
    /* version 10: the lowest validation loss so far and where (nerve train --save-best, --early-stop);
       older files read as none (NaN) */
    int64_t best_step;
    float best_val_loss;      /* NaN: no evaluation yet */
    int32_t evals_since_best; /* evaluations after best_step, none lower */
    /* version 11: the run's length in steps as --time-budget decided it (0: not decided, or a run of
       --steps; older files read as 0) */
    int64_t budget_steps;
    /* version 12: Ministral 3's attention temperature (nv_config's); older files read as none */
    float attn_temp_scale;
    int32_t attn_temp_len;
    int32_t arch_mistral3, reserved_v12; /* nv_config's; a reserved 0 */
} nv_ckpt_header;

void nv_ckpt_header_set_config(nv_ckpt_header *h, const nv_config *c);
void nv_ckpt_header_get_config(const nv_ckpt_header *h, nv_config *c);

nv_err nv_ckpt_save(const char *path, const nv_ckpt_header *h, const float *params, const float *m, const float *v);

/* Maps and verifies path; on success the three arrays point into the mapping (unmap when done). */
typedef struct {
    nv_ckpt_header h;
    nv_mapped map;
    const float *params, *m, *v;
} nv_ckpt;
nv_err nv_ckpt_load(const char *path, nv_ckpt *out);
void nv_ckpt_close(nv_ckpt *c);

uint64_t nv_checksum64(const void *data, size_t len, uint64_t seed);

#endif
