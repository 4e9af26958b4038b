/* libFuzzer harness: Hugging Face model folders (model/hf.c) from untrusted files.
 *
 * The input is a folder's config.json, a NUL byte, then its model.safetensors (no NUL: the whole
 * input is model.safetensors beside a fixed tiny config). A failure must carry one line of message
 * and leave nothing behind. On success: the config is valid, the model writes itself as a folder
 * again, which loads back to the same config and weights; a forward step on the scalar engine works.
 * The safetensors part is also read as a PEFT adapter (adapter_model.safetensors beside a fixed
 * adapter_config.json) of the default config's model: refused with a message, or a valid shape whose
 * values are finite, which writes itself again and reads back the same. */
#include <math.h>
#include <sys/stat.h>

#include "fuzz_util.h"
#include "model/forward.h"
#include "model/lora.h"
#include "model/hf.h"
#include "model/model.h"

#define FZ_MAX_INPUT (1u << 20)

/* what a config-less input is read with: fuzz/gen_seeds.c's tiny llama's */
static const char default_config[] =
    "{\"model_type\": \"llama\", \"hidden_size\": 8, \"intermediate_size\": 16, \"num_hidden_layers\": 1, "
    "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"vocab_size\": 16, \"max_position_embeddings\": 8, "
    "\"tie_word_embeddings\": true}";

static int write_file(const char *dir, const char *name, const void *data, size_t len) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    nv_iov part = {data, len};
    return nv_file_write_atomic(path, &part, 1) == NV_OK ? 0 : -1;
}

static void remove_folder(const char *dir) {
    static const char *const names[] = {"config.json",    "model.safetensors",     "generation_config.json", "tokenizer.json",
                                        "tokenizer_config.json", "adapter_config.json", "adapter_model.safetensors"};
    nv_remove_in_dir(dir, names, sizeof names / sizeof names[0]);
}

static int make_folder(const char *tag, char *dir, size_t cap) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, cap, "%s/nerve-fuzz-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", tag);
    return mkdtemp(dir) ? 0 : -1;
}

/* default_config's model, for the adapter reading */
static const nv_config adapter_model = {8, 16, 1, 2, 1, 4, 16, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};

static void check_peft(const void *st, size_t st_len) {
    static const char cfg[] = "{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 4}";
    char dir[512];
    if (make_folder("peft", dir, sizeof dir) != 0) return;
    if (write_file(dir, "adapter_config.json", cfg, strlen(cfg)) == 0 && write_file(dir, "adapter_model.safetensors", st, st_len) == 0) {
        nv_lora_shape s;
        float *p = NULL;
        fz_clear_error();
        nv_err e = nv_hf_load_lora(dir, &adapter_model, &s, &p);
        fz_check_error(e, "nv_hf_load_lora");
        FZ_CHECK(e == NV_OK || p == NULL, "a refused adapter left its block behind");
        if (e == NV_OK) {
            FZ_CHECK(nv_lora_validate(&adapter_model, &s) == NV_OK, "accepted adapter shape is invalid: %s", nv_errmsg());
            const uint64_t n = nv_lora_param_count(&adapter_model, &s);
            for (uint64_t i = 0; i < n; i++) FZ_CHECK(isfinite(p[i]), "adapter value %llu is not finite", (unsigned long long)i);
            char again[512];
            if (make_folder("peft-again", again, sizeof again) == 0) {
                nv_lora_shape s2;
                float *p2 = NULL;
                FZ_CHECK(nv_hf_save_lora(&adapter_model, &s, p, 0.0f, again) == NV_OK, "save: %s", nv_errmsg());
                FZ_CHECK(nv_hf_load_lora(again, &adapter_model, &s2, &p2) == NV_OK && !memcmp(&s, &s2, sizeof s) &&
                             !memcmp(p, p2, (size_t)n * sizeof(float)),
                         "the adapter changed in the round trip: %s", nv_errmsg());
                free(p2);
                remove_folder(again);
            }
            free(p);
        }
    }
    remove_folder(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    if (nv_engines_init("scalar", 1) != NV_OK) {
        fprintf(stderr, "fuzz_hf: %s\n", nv_errmsg());
        exit(1);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > FZ_MAX_INPUT) return -1;
    const uint8_t *nul = memchr(data, 0, size);
    const void *cfg = nul ? (const void *)data : default_config, *st = nul ? nul + 1 : data;
    const size_t cfg_len = nul ? (size_t)(nul - data) : strlen(default_config), st_len = nul ? size - cfg_len - 1 : size;
    check_peft(st, st_len);
    char dir[512], path[600];
    if (make_folder("hf", dir, sizeof dir) != 0) return 0;
    if (write_file(dir, "config.json", cfg, cfg_len) != 0 || write_file(dir, "model.safetensors", st, st_len) != 0) {
        remove_folder(dir);
        return 0;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    nv_model m;
    fz_clear_error();
    nv_err e = nv_model_load(path, &m);
    fz_check_error(e, "nv_model_load");
    if (e != NV_OK) {
        FZ_CHECK(m.params == NULL && m.plans == NULL, "a failed load left weights behind");
        remove_folder(dir);
        return 0;
    }
    FZ_CHECK(nv_config_validate(&m.config) == NV_OK, "loaded config is invalid: %s", nv_errmsg());
    /* for inference (F16 matrices kept as fp16 sources): the same config, and every weight it made
       the fp32 load's; a pending one's source holds exactly the fp32 load's values */
    nv_model q;
    fz_clear_error();
    e = nv_model_load_quantized(path, &q);
    fz_check_error(e, "nv_model_load_quantized");
    FZ_CHECK(e == NV_OK, "the quantized load fails where the fp32 one does not: %s", nv_errmsg());
    if (e == NV_OK) {
        FZ_CHECK(!memcmp(&q.config, &m.config, sizeof q.config) && q.n_params == m.n_params, "the quantized load's config differs");
        const size_t nt = nv_model_tensor_count(&m.config);
        nv_tensor_ref *tm = calloc(nt, sizeof *tm), *tq = calloc(nt, sizeof *tq);
        if (!tm || !tq) abort();
        nv_model_tensor_map(&m.config, &m.w, tm);
        nv_model_tensor_map(&q.config, &q.w, tq);
        for (size_t i = 0; i < nt; i++) { /* each tensor: made as the fp32 load's, or its fp16 sources (one an expert) hold them */
            const size_t n = (size_t)(tm[i].d0 * tm[i].d1);
            int pending = 0;
            for (int j = 0; q.quant && j < nv_model_plan_count(&q.config); j++) {
                char pn[64];
                int ex;
                nv_model_plan_tensor_name(&q.config, j, pn, sizeof pn, &ex);
                if (strcmp(pn, tm[i].name) || !q.quant[j].h) continue;
                float *made = malloc(n * sizeof *made);
                if (!made) abort();
                FZ_CHECK(q.quant[j].count == n, "%s: a source of %zu values for %zu", tm[i].name, q.quant[j].count, n);
                nv_qmatrix_fill_f32(&q.quant[j], made);
                FZ_CHECK(!memcmp(made, tm[i].p + (size_t)ex * n, n * sizeof *made), "%s: the fp16 source of expert %d is not the fp32 load's values",
                         tm[i].name, ex);
                free(made);
                pending |= q.quant[j].pending;
            }
            if (!pending)
                FZ_CHECK(!memcmp(tq[i].p, tm[i].p, (size_t)nv_tensor_rows(&tm[i]) * tm[i].d0 * sizeof(float)),
                         "%s: the quantized load made other weights", tm[i].name);
        }
        free(tm), free(tq);
        nv_model_free(&q);
    }
    nv_config read;
    FZ_CHECK(nv_model_read_config(path, &read) == NV_OK && !memcmp(&read, &m.config, sizeof read), "read_config differs from the load's");
    /* written as a folder again, a mixture of experts too: the same config and weights (refused only
       for RoPE factors and for RoPE on part of each head) */
    char again[512], again_cfg[600];
    if (make_folder("hf-again", again, sizeof again) == 0) {
        fz_clear_error();
        e = nv_hf_save(&m, NULL, again, NV_HF_F32, NULL);
        fz_check_error(e, "nv_hf_save");
        FZ_CHECK(e == NV_OK || (e == NV_EUNSUPPORTED && (m.config.n_rope_factors || m.config.rope_dim)), "save of a loaded folder: %s",
                 nv_errmsg());
        if (e == NV_OK) {
            snprintf(again_cfg, sizeof again_cfg, "%s/config.json", again);
            nv_model b;
            e = nv_model_load(again_cfg, &b);
            FZ_CHECK(e == NV_OK, "the folder written from a loaded one does not load: %s", nv_errmsg());
            FZ_CHECK(!memcmp(&b.config, &m.config, sizeof b.config) && b.n_params == m.n_params &&
                         !memcmp(b.params, m.params, (size_t)m.n_params * 4),
                     "config or weights changed in the round trip");
            nv_model_free(&b);
        }
        remove_folder(again);
    }
    fz_clear_error();
    FZ_CHECK(nv_model_build_plans(&m, NV_ENGINE_SCALAR) == NV_OK, "plans: %s", nv_errmsg());
    nv_state s;
    if (nv_state_init(&s, &m.config, 1, 2, 0) == NV_OK) {
        int tok = 1 % m.config.vocab_size;
        FZ_CHECK(nv_forward(&m, &s, &tok, 1, 0) == NV_OK, "forward: %s", nv_errmsg());
        nv_state_free(&s);
    }
    nv_model_free(&m);
    remove_folder(dir);
    return 0;
}
