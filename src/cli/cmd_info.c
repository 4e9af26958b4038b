/* nerve info: the CPU, its run-time features, and which engines are on (and why not); with -m, what
 * a model file is (its shape, size and, for GGUF, its tensor types). */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/cpu.h"
#include "cli/cli.h"
#include "engine/engine.h"
#include "model/batch.h"
#include "model/gguf.h"
#include "model/model.h"
#include "train/dist.h"

#define CMD "info"

/* A GGUF file's tensors by type: count, values and bytes each, and the bits per value over all; 0
 * when path is not a GGUF file. */
static int gguf_types(const char *path, uint64_t file_bytes) {
    nv_gguf g;
    if (nv_gguf_open(path, &g) != NV_OK) return 0;
    size_t arch_len = 0, name_len = 0;
    const char *arch = nv_gguf_string(&g, "general.architecture", &arch_len), *name = nv_gguf_string(&g, "general.name", &name_len);
    char shown[128];
    printf("format:   GGUF v%u, architecture %s", g.version, arch ? nv_gguf_shown(arch, arch_len, shown, sizeof shown) : "?");
    if (name) printf(", name \"%s\"", nv_gguf_shown(name, name_len, shown, sizeof shown));
    const nv_gguf_kv *ft = nv_gguf_find(&g, "general.file_type");
    if (ft && (ft->type == 4 || ft->type == 5)) { /* uint32 as llama.cpp writes it, or int32 */
        uint32_t v;
        memcpy(&v, ft->val, 4);
        const char *fname = nv_gguf_file_type_name(v);
        if (fname) printf(", file type %s", fname);
        else printf(", file type %u", v);
    }
    printf("\n");
    enum { TYPES = 64 };
    uint64_t count[TYPES] = {0}, values[TYPES] = {0}, bytes[TYPES] = {0}, all_values = 0, all_bytes = 0;
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        const nv_gguf_tensor *t = &g.t[i];
        uint64_t n = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) n *= t->dims[d];
        const uint32_t ty = t->type < TYPES ? t->type : TYPES - 1;
        count[ty]++, values[ty] += n, bytes[ty] += t->bytes;
        all_values += n, all_bytes += t->bytes;
    }
    printf("tensors:  %llu, %.2f MB of %.2f MB, %.2f bits per value\n", (unsigned long long)g.n_tensors, (double)all_bytes / 1e6,
           (double)file_bytes / 1e6, all_values ? 8.0 * (double)all_bytes / (double)all_values : 0.0);
    for (uint32_t ty = 0; ty < TYPES; ty++)
        if (count[ty])
            printf("  %-8s %4llu tensors, %12llu values, %9.2f MB, %5.2f bits per value\n", ty < TYPES - 1 ? nv_gguf_type_name(ty) : "?",
                   (unsigned long long)count[ty], (unsigned long long)values[ty], (double)bytes[ty] / 1e6,
                   values[ty] ? 8.0 * (double)bytes[ty] / (double)values[ty] : 0.0);
    nv_gguf_close(&g);
    return 1;
}

/* bytes as "512 bytes", "3.0 KiB", "24.0 MiB" or "1.50 GiB" */
static const char *fmt_bytes(double b, char *buf, size_t cap) {
    if (b < 1024) snprintf(buf, cap, "%.0f bytes", b);
    else if (b < 1048576.0) snprintf(buf, cap, "%.1f KiB", b / 1024);
    else if (b < 1073741824.0) snprintf(buf, cap, "%.1f MiB", b / 1048576.0);
    else snprintf(buf, cap, "%.2f GiB", b / 1073741824.0);
    return buf;
}

/* What serve's KV cache takes (its default fp16 pages): a position of every layer and the whole
   context; and on split pages (--swa-cache window), a position of the whole-context layers and a
   sequence's ring of windowed-layer blocks at the default blocks of 16 and prompt chunks of 512. */
static void print_kv_sizes(const nv_config *c) {
    enum { BLOCK = 16, CHUNK = 512 };
    char a[32], b[32], d[32], e[32];
    const double all = (double)nv_kv_block_bytes(c, 1, NV_KV_F16);
    printf("kv:       f16 %s a position (the context of %d: %s)", fmt_bytes(all, a, sizeof a), c->seq_len,
           fmt_bytes(all * c->seq_len, b, sizeof b));
    if (nv_kv_layers_count(c, NV_KV_LAYERS_WINDOWED) && nv_kv_layers_count(c, NV_KV_LAYERS_FULL)) {
        const double whole = (double)nv_kv_block_bytes_of(c, 1, NV_KV_F16, NV_KV_LAYERS_FULL);
        long ring = nv_kv_ring_blocks(c, CHUNK, BLOCK), blocks = (c->seq_len + BLOCK - 1) / BLOCK;
        if (ring > blocks) ring = blocks;
        printf("; split (serve --swa-cache window): %s a position (%s) and a ring of %s a sequence (blocks of %d, chunks of %d)",
               fmt_bytes(whole, d, sizeof d), fmt_bytes(whole * c->seq_len, e, sizeof e),
               fmt_bytes((double)ring * (double)nv_kv_block_bytes_of(c, BLOCK, NV_KV_F16, NV_KV_LAYERS_WINDOWED), a, sizeof a),
               BLOCK, CHUNK);
    }
    printf("\n");
}

/* nerve info -m MODEL: the shape the loader reads and the file's size; for GGUF, its types. */
static int model_info(const char *path) {
    nv_model m;
    if (nv_model_load_quantized(path, &m) != NV_OK) return cli_error(CMD, 1, "%s", nv_errmsg());
    const nv_config *c = &m.config;
    struct stat st;
    const uint64_t file_bytes = stat(path, &st) == 0 && S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
    printf("model:    %s\n", path);
    printf("shape:    dim %d, layers %d, heads %d/%d x %d, hidden %d, vocab %d, context %d", c->dim, c->n_layers, c->n_heads,
           c->n_kv_heads, c->head_dim, c->hidden_dim, c->vocab_size, c->seq_len);
    if (c->n_experts) printf(", experts %d of %d", c->n_experts_used, c->n_experts);
    printf("%s%s\n", c->qk_norm == NV_QK_NORM_WHOLE ? ", QK-norm over whole projections" : c->qk_norm ? ", QK-norm" : "",
           c->qkv_bias ? ", q/k/v biases" : "");
    printf("rope:     theta %g", (double)c->rope_theta); /* what sets the angles: scaling, divisors, temperature */
    if (c->rope_dim) printf(" on %d of each head's %d values", c->rope_dim, c->head_dim);
    if (c->yarn.factor != 0.0f) printf(", YaRN factor %g from a context of %d", (double)c->yarn.factor, c->yarn.orig_ctx);
    else if (c->llama3.factor != 0.0f) printf(", Llama 3.1's factor %g from a context of %d", (double)c->llama3.factor, c->llama3.orig_ctx);
    if (c->n_rope_factors) {
        float lo = c->rope_factors[0], hi = lo;
        for (int i = 1; i < c->n_rope_factors; i++) lo = fminf(lo, c->rope_factors[i]), hi = fmaxf(hi, c->rope_factors[i]);
        printf(", %d frequency divisors %g..%g", c->n_rope_factors, (double)lo, (double)hi);
        if (c->longrope_orig) { /* LongRoPE's short set */
            lo = hi = c->rope_factors_short[0];
            for (int i = 1; i < c->n_rope_factors; i++) lo = fminf(lo, c->rope_factors_short[i]), hi = fmaxf(hi, c->rope_factors_short[i]);
            printf(" (%g..%g below position %d)", (double)lo, (double)hi, c->longrope_orig);
        }
    }
    if (nv_config_rope_mscale(c) != 1.0f) printf(", cos and sin x %g", (double)nv_config_rope_mscale(c));
    if (c->rope_theta_swa != 0.0f) printf("; windowed layers theta %g, unscaled", (double)c->rope_theta_swa);
    if (c->nope_period) printf("; none in the last layer of every %d", c->nope_period);
    printf("\n");
    if (c->swa_window) printf("window:   %d positions in %d of %d layers\n", c->swa_window, nv_config_windowed_layers(c), c->n_layers);
    if (c->no_pre_norms) printf("block:    OLMo 2's: RMSNorm after the attention and the FFN, none before\n");
    else if (nv_config_gemma_block(c)) { /* Gemma's block */
        printf("block:    %s%s, embeddings x %g, scores / %g", c->ffn_gelu ? "GELU gating" : "SwiGLU", c->post_norms ? ", post-norms" : "",
               (double)nv_config_emb_scale(c), (double)nv_config_attn_div(c));
        if (c->attn_softcap != 0.0f) printf(" soft-capped at %g", (double)c->attn_softcap);
        if (c->logit_softcap != 0.0f) printf(", logits soft-capped at %g", (double)c->logit_softcap);
        printf("\n");
    }
    if (nv_config_granite(c)) /* Granite's multipliers */
        printf("block:    embeddings x %g, scores / %g, branches x %g into the residual, logits / %g\n",
               (double)nv_config_emb_scale(c), (double)nv_config_attn_div(c), (double)nv_config_residual_scale(c),
               (double)nv_config_logit_div(c));
    printf("params:   %.2f M\n", (double)nv_config_param_count(c) / 1e6);
    print_kv_sizes(c);
    nv_model_free(&m);
    if (file_bytes && !gguf_types(path, file_bytes)) printf("file:     %.2f MB\n", (double)file_bytes / 1e6);
    return 0;
}

int cmd_info(int argc, char **argv) {
    const char *model = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: nerve info [-m MODEL]\n  prints the CPU, its instruction-set features and the engines found;\n"
                   "  with -m, what MODEL is instead: its shape, parameters, size and, for GGUF, its tensor types\n"
                   "  (count, values, megabytes and bits per value of each)\n");
            return 0;
        }
        if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) {
            const char *v = cli_value(CMD, argc, argv, &i);
            if (!v) return 2;
            model = v;
            continue;
        }
        return cli_error(CMD, 2, "unknown option '%s'", argv[i]);
    }
    if (model) { /* a run folder or a Hugging Face folder: the model file in it */
        cli_paths paths;
        const char *tok = NULL;
        cli_model_paths(&model, &tok, &paths);
        return model_info(model);
    }
    const nv_cpu_info *c = nv_cpu_probe();
    printf("cpu:      %s\n", c->model);
    printf("cores:    %d\n", c->cores);
    printf("memory:   %.1f GiB\n", (double)c->mem_total_bytes / (1024.0 * 1024 * 1024));
    printf("features:");
    struct {
        const char *name;
        int on;
    } f[] = {{"AVX2", c->avx2 && c->os_avx},   {"FMA", c->fma},
             {"AVX-512F", c->avx512f && c->os_avx512}, {"AVX512-BF16", c->avx512_bf16 && c->os_avx512},
             {"AVX512-VNNI", c->avx512_vnni && c->os_avx512}, {"AVX-VNNI", c->avx_vnni && c->os_avx},
             {"AMX-TILE", c->amx_tile},         {"AMX-BF16", c->amx_bf16},
             {"AMX-INT8", c->amx_int8}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) printf(" %s%s", f[i].on ? "+" : "-", f[i].name);
    printf("\n");
    if (c->amx_tile)
        printf("amx:      tile permission %s%s%s\n", c->amx_permission ? "granted" : "not granted",
               c->amx_why[0] ? ": " : "", c->amx_why);
    else
        printf("amx:      not available: %s\n", c->amx_why);
    if (nv_engines_init(NULL, 0) != NV_OK) return cli_error(CMD, 1, "%s", nv_errmsg());
    printf("engines:\n");
    for (int e = 0; e < NV_ENGINE_COUNT; e++) {
        if (nv_engine_available((nv_engine_id)e)) printf("  %-12s on\n", nv_engine_name((nv_engine_id)e));
        else printf("  %-12s off: %s\n", nv_engine_name((nv_engine_id)e), nv_engine_why_off((nv_engine_id)e));
    }
    printf("best:     %s (serve's default; train: %s, generate: %s)\n", nv_engine_name(nv_engine_best()),
           nv_engine_name(nv_engine_best_float()), nv_engine_name(nv_engine_best_fp32()));
    printf("train:    %s\n", nv_dist_built_in() ? "data parallel over processes with OpenMPI (mpirun -np N nerve train ...)"
                                                   : "one process (built without OpenMPI: install libopenmpi-dev and rebuild "
                                                     "for mpirun -np N nerve train)");
    char machine[512], path[4200];
    cli_tune_machine(machine, sizeof machine);
    const int tuned = cli_tune_count(machine, path, sizeof path);
    if (tuned > 0) printf("tune:     %d model%s tuned for this machine and these engines (%s)\n", tuned, tuned > 1 ? "s" : "", path);
    else if (tuned == 0) printf("tune:     no model tuned for this machine yet (nerve tune -m MODEL)\n");
    else if (path[0]) printf("tune:     the tune file %s cannot be read (a file that does not parse: nerve tune keeps it as .bad and writes a new one)\n", path);
    else printf("tune:     no place for a tune file (set NERVE_TUNE_FILE, XDG_CACHE_HOME or HOME)\n");
    return 0;
}
