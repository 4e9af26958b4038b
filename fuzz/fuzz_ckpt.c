/* libFuzzer harness: nv_ckpt_load on untrusted training checkpoints.
 *
 * Each input is tried twice: as it is, and, when its length is the one its header's n_params
 * implies, with the trailing checksum recomputed (as src/train/ckpt.c chains it), so that the
 * fuzzer also reaches what follows the checksum test instead of stopping at it. A failure must
 * carry one line of message and leave nothing mapped. On success the harness checks the
 * header's config is valid and implies n_params, the three arrays lie inside the mapping, and
 * does what `nerve export` does: writes the weights as a llama2.c v1 model (refused only for
 * shapes v1 cannot hold) and loads that back, which must give the same weights; a LoRA run's
 * checkpoint (version 2 on) instead must hold exactly its shape's adapters. Version 1 and 2 files
 * (120- and 144-byte headers) are read too; version 3 adds the RoPE scaling (1216 bytes), version 4
 * the layers without RoPE (1224), version 5 the Gemma family's block (1264), version 6 Granite's
 * multipliers (1272), version 7 partial rotation (in a field version 6 reserved), version 8
 * LongRoPE's short set, version 9 OLMo 2's block (in a field version 8 reserved, and QK-norm 2),
 * version 10 the best validation loss (2320), version 11 the length --time-budget decided (2328),
 * version 12 Ministral 3's attention temperature and the mistral3 name (2344); an older header must read none of the later fields, an accepted best must lie within the run, and a
 * decided length must be none or at least the steps done. */
#include <math.h>
#include <stddef.h>

#include "base/hash.h"
#include "fuzz_util.h"
#include "model/lora.h"
#include "model/model.h"
#include "train/ckpt.h"

#define FZ_MAX_INPUT (1u << 20)
#define FZ_PREFIX 16 /* magic, version, header size */
#define FZ_V1_HEADER 120u /* version 1's header: the fields before the LoRA ones */
#define FZ_V2_HEADER 144u /* version 2's: before the RoPE factors */
#define FZ_V3_HEADER 1216u /* version 3's: before the layers without RoPE */
#define FZ_V4_HEADER 1224u /* version 4's: before the Gemma block */
#define FZ_V5_HEADER 1264u /* version 5's: before Granite's multipliers */
#define FZ_V7_HEADER 1272u /* versions 6 and 7: before LongRoPE's short set */
#define FZ_V9_HEADER 2304u /* versions 8 and 9: before the best validation loss */
#define FZ_V10_HEADER 2320u /* version 10: before the decided length */
#define FZ_V11_HEADER 2328u /* version 11: before the attention temperature */

static int known_header(uint32_t hb) {
    return hb == FZ_V1_HEADER || hb == FZ_V2_HEADER || hb == FZ_V3_HEADER || hb == FZ_V4_HEADER || hb == FZ_V5_HEADER ||
           hb == FZ_V7_HEADER || hb == FZ_V9_HEADER || hb == FZ_V10_HEADER || hb == FZ_V11_HEADER || hb == sizeof(nv_ckpt_header);
}

static volatile float sink;

/* The header size the file gives (version 1's to 4's: the loader took no other). */
static uint32_t header_bytes(const nv_ckpt *c) {
    uint32_t hb;
    memcpy(&hb, c->map.data + 12, 4);
    return hb;
}

static void check_array(const nv_ckpt *c, const float *p, const char *name) {
    uint64_t n = c->h.n_params;
    const uint8_t *b = (const uint8_t *)p;
    FZ_CHECK(b >= c->map.data + FZ_PREFIX + header_bytes(c) && b + n * 4 <= c->map.data + c->map.len - 8,
             "%s lies outside the file", name);
    if (n) sink += p[0] + p[n - 1];
}

static void check_export(const nv_ckpt *ck) {
    nv_model m;
    memset(&m, 0, sizeof m);
    nv_ckpt_header_get_config(&ck->h, &m.config);
    m.params = (float *)ck->params;
    m.n_params = ck->h.n_params;
    char path[512];
    if (fz_temp_name("ckpt-v1", path, sizeof path) != 0) return;
    const nv_config *c = &m.config;
    int fits = fz_fits_v1(c);
    fz_clear_error();
    nv_err e = nv_model_save_v1(&m, path);
    fz_check_error(e, "nv_model_save_v1");
    FZ_CHECK(fits ? e == NV_OK : e == NV_EUNSUPPORTED, "export of a valid checkpoint: %s (%s)", nv_err_name(e),
             nv_errmsg());
    if (e != NV_OK) return;
    nv_model b;
    e = nv_model_load(path, &b);
    unlink(path);
    FZ_CHECK(e == NV_OK, "the exported model does not load: %s", nv_errmsg());
    FZ_CHECK(b.config.dim == c->dim && b.config.n_layers == c->n_layers && b.config.vocab_size == c->vocab_size &&
                 b.config.n_kv_heads == c->n_kv_heads && b.config.seq_len == c->seq_len &&
                 b.config.shared_classifier == (c->shared_classifier != 0),
             "exported config differs");
    FZ_CHECK(b.n_params == m.n_params && memcmp(b.params, m.params, (size_t)m.n_params * 4) == 0,
             "exported weights differ");
    nv_model_free(&b);
}

static nv_err load_ckpt(const char *path, void *out) { return nv_ckpt_load(path, out); }

static void try_load(const uint8_t *data, size_t size) {
    nv_ckpt ck;
    int rc = fz_load_bytes("ckpt", data, size, load_ckpt, &ck, "nv_ckpt_load");
    if (rc < 0) return;
    if (rc != NV_OK) {
        FZ_CHECK(ck.map.data == NULL && ck.params == NULL, "failed load left state behind");
        return;
    }
    nv_config c;
    nv_ckpt_header_get_config(&ck.h, &c);
    FZ_CHECK(nv_config_validate(&c) == NV_OK, "accepted config is invalid: %s", nv_errmsg());
    const uint32_t hb = header_bytes(&ck);
    FZ_CHECK(known_header(hb), "header of %u bytes accepted", hb);
    FZ_CHECK(hb != FZ_V1_HEADER || ck.h.lora_rank == 0, "a version 1 header read LoRA fields");
    FZ_CHECK(hb >= FZ_V3_HEADER || (ck.h.n_rope_factors == 0 && ck.h.yarn_factor == 0), "an older header read RoPE fields");
    FZ_CHECK(hb >= FZ_V4_HEADER || ck.h.nope_period == 0, "an older header read the layers without RoPE");
    FZ_CHECK(hb >= FZ_V5_HEADER || (!ck.h.swa_window && !ck.h.post_norms && !ck.h.ffn_gelu && ck.h.emb_scale == 0.0f),
             "an older header read the Gemma block");
    FZ_CHECK(hb >= FZ_V7_HEADER || (ck.h.residual_scale == 0.0f && ck.h.logit_div == 0.0f), "an older header read Granite's multipliers");
    uint32_t version;
    memcpy(&version, ck.map.data + 8, 4);
    FZ_CHECK(version >= 7 || ck.h.rope_dim == 0, "a version %u header read partial rotation", version);
    FZ_CHECK(hb >= FZ_V9_HEADER || ck.h.longrope_orig == 0, "an older header read LongRoPE's short set");
    FZ_CHECK(version >= 10 || (isnan(ck.h.best_val_loss) && ck.h.best_step == 0 && ck.h.evals_since_best == 0),
             "a version %u header read a best validation loss", version);
    FZ_CHECK(ck.h.best_step >= 0 && ck.h.best_step <= ck.h.step && ck.h.evals_since_best >= 0 && !isinf(ck.h.best_val_loss),
             "a best validation loss out of range accepted");
    FZ_CHECK(version >= 9 || (ck.h.no_pre_norms == 0 && ck.h.qk_norm <= 1), "a version %u header read OLMo 2's block", version);
    FZ_CHECK(version >= 11 || ck.h.budget_steps == 0, "a version %u header read a decided length", version);
    FZ_CHECK(version >= 12 || (ck.h.attn_temp_scale == 0.0f && ck.h.attn_temp_len == 0 && !ck.h.arch_mistral3), "a version %u header read an attention temperature",
             version);
    FZ_CHECK(ck.h.budget_steps == 0 || (ck.h.budget_steps >= ck.h.step && ck.h.budget_steps <= INT32_MAX),
             "a decided length of %lld at step %lld accepted", (long long)ck.h.budget_steps, (long long)ck.h.step);
    const nv_lora_shape lora = {ck.h.lora_rank, ck.h.lora_alpha, ck.h.lora_targets};
    FZ_CHECK(!lora.rank || nv_lora_validate(&c, &lora) == NV_OK, "accepted LoRA shape is invalid: %s", nv_errmsg());
    FZ_CHECK(ck.h.n_params == (lora.rank ? nv_lora_param_count(&c, &lora) : nv_config_param_count(&c)),
             "n_params does not match the config");
    FZ_CHECK(ck.map.len == FZ_PREFIX + hb + 12 * ck.h.n_params + 8, "file of %zu bytes accepted", ck.map.len);
    check_array(&ck, ck.params, "params");
    check_array(&ck, ck.m, "adam m");
    check_array(&ck, ck.v, "adam v");
    if (!lora.rank) check_export(&ck); /* adapters are not a model: export takes the run's merged one */
    nv_ckpt_close(&ck);
    FZ_CHECK(ck.map.data == NULL, "close left the mapping");
}

/* The checksum ckpt.c expects, chained part by part in file order; 0 when the length does not
 * match the header's n_params (nothing to fix). */
static int fix_checksum(uint8_t *buf, size_t size) {
    if (size < FZ_PREFIX) return 0;
    uint32_t hb;
    memcpy(&hb, buf + 12, 4);
    if (!known_header(hb)) return 0;
    size_t hdr = FZ_PREFIX + hb;
    if (size < hdr + 8) return 0;
    uint64_t n;
    memcpy(&n, buf + FZ_PREFIX + offsetof(nv_ckpt_header, n_params), 8);
    if (n > FZ_MAX_INPUT || size != hdr + 12 * n + 8) return 0;
    uint64_t sum = nv_checksum64(buf, 8, 0);
    sum = nv_checksum64(buf + 8, 4, sum);
    sum = nv_checksum64(buf + 12, 4, sum);
    sum = nv_checksum64(buf + FZ_PREFIX, hb, sum);
    for (int k = 0; k < 3; k++) sum = nv_checksum64(buf + hdr + (size_t)k * n * 4, (size_t)n * 4, sum);
    if (memcmp(buf + size - 8, &sum, 8) == 0) return 0;
    memcpy(buf + size - 8, &sum, 8);
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > FZ_MAX_INPUT) return -1;
    try_load(data, size);
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    if (fix_checksum(copy, size)) try_load(copy, size);
    free(copy);
    return 0;
}
