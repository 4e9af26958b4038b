/* nerve bench train: training-step speed per engine on the stories shapes (or --model PRESET:
 * qwen3-0.6B's, gemma3-270m's), with PyTorch (CPU, fp32 and bf16 autocast) measured in the same run
 * on the same shape and batch (bench/torch_ref.py: llama's block, QK-norm, Gemma 3's block). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/cpu.h"
#include "base/file.h"
#include "base/rng.h"
#include "base/timer.h"
#include "cli/bench.h"
#include "cli/cli.h"
#include "engine/engine.h"
#include "engine/peak.h"
#include "train/optim.h"
#include "train/tmodel.h"

#define CMD "bench train"

/* Runs the PyTorch reference; returns ms/step or a negative value with why filled. */
static double torch_step_ms(const nv_config *c, int batch, int seq, int threads, int steps, const char *mode, char *why,
                            size_t cap) {
    char exe[4096], script[4300];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    snprintf(script, sizeof script, "%s/../bench/torch_ref.py", exe);
    if (!nv_file_exists(script)) snprintf(script, sizeof script, "%s/../../bench/torch_ref.py", exe);
    if (!nv_file_exists(script)) {
        snprintf(why, cap, "bench/torch_ref.py not found beside the binary");
        return -1;
    }
    /* Debian's interpreter, where python3-torch installs */
    const char *py = nv_file_exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "%s %s --dim %d --hidden %d --layers %d --heads %d --kv-heads %d --vocab %d --batch %d --seq %d "
             "--threads %d --steps %d --mode %s --head-dim %d --qk-norm %d --theta %g --gemma %d --window %d --window-period %d "
             "--theta-swa %g 2>&1",
             py, script, c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size, batch, seq,
             threads, steps, mode, c->head_dim, c->qk_norm, (double)c->rope_theta, c->ffn_gelu && c->post_norms, c->swa_window,
             c->swa_period, (double)c->rope_theta_swa);
    FILE *p = popen(cmd, "r");
    if (!p) {
        snprintf(why, cap, "cannot run %s", py);
        return -1;
    }
    char out[4096] = "";
    size_t got = fread(out, 1, sizeof out - 1, p);
    out[got] = '\0';
    pclose(p);
    const char *ms = strstr(out, "\"ms_per_step\":");
    if (strstr(out, "\"ok\": true") && ms) return strtod(ms + 14, NULL);
    const char *w = strstr(out, "\"why\": \"");
    if (w) {
        snprintf(why, cap, "%s", w + 8);
        char *q = strchr(why, '"');
        if (q) *q = '\0';
    } else {
        char *nl = strchr(out, '\n');
        if (nl) *nl = '\0';
        snprintf(why, cap, "peer failed: %.200s", out);
    }
    return -1;
}

int bench_train(int argc, char **argv, const bench_opts *o) {
    int batch = 4, seq = 256, steps = o->quick ? 1 : 3, peers = 1, lora_rank = 0, experts = 0, experts_used = 0;
    const char *only_model = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--no-peers")) { peers = 0; continue; }
        if (!(v = cli_value(CMD, argc, argv, &i))) return 2;
        if (!strcmp(argv[i - 1], "--batch")) { if (!cli_int(CMD, "--batch", v, 1, 4096, &batch)) return 2; }
        else if (!strcmp(argv[i - 1], "--seq")) { if (!cli_int(CMD, "--seq", v, 1, 1 << 16, &seq)) return 2; }
        else if (!strcmp(argv[i - 1], "--steps")) { if (!cli_int(CMD, "--steps", v, 1, 1000, &steps)) return 2; }
        else if (!strcmp(argv[i - 1], "--model")) only_model = v;
        else if (!strcmp(argv[i - 1], "--lora-rank")) { if (!cli_int(CMD, "--lora-rank", v, 1, 1024, &lora_rank)) return 2; }
        else if (!strcmp(argv[i - 1], "--experts")) { if (!cli_int(CMD, "--experts", v, 1, NV_MOE_MAX_EXPERTS, &experts)) return 2; }
        else if (!strcmp(argv[i - 1], "--experts-used")) { if (!cli_int(CMD, "--experts-used", v, 1, NV_MOE_MAX_EXPERTS, &experts_used)) return 2; }
        else return cli_error(CMD, 2, "unknown option '%s' (--batch, --seq, --steps, --model, --lora-rank, --experts, --experts-used, --no-peers)",
                              argv[i - 1]);
    }
    if (experts && lora_rank) return cli_error(CMD, 2, "--experts trains a mixture whole: drop --lora-rank");
    if (cli_experts(CMD, experts, &experts_used)) return 2;
    if (lora_rank || experts) peers = 0; /* the peers train whole dense models: no like-for-like ratio */
    if (nv_engines_init(NULL, o->threads) != NV_OK) return cli_error(CMD, 1, "%s", nv_errmsg());
    int threads = o->threads ? o->threads : nv_cpu_probe()->cores;
    const char *models_full[] = {"stories15M", "stories110M"}, *models_quick[] = {"stories260K"};
    const char **models = o->quick ? models_quick : models_full;
    int n_models = o->quick ? 1 : 2;
    if (only_model) models = &only_model, n_models = 1;
    for (int mi = 0; mi < n_models; mi++) {
        nv_config c;
        if (nv_config_preset(models[mi], &c) != NV_OK) return cli_error(CMD, 2, "%s", nv_errmsg());
        if (c.seq_len < seq) c.seq_len = seq;
        if (experts) c.n_experts = experts, c.n_experts_used = experts_used; /* a mixture of the shape's FFN */
        double best_tps = 0;
        const char *best_engine = "";
        for (int e = NV_ENGINE_COUNT - 1; e >= 0; e--) {
            nv_engine_id id = (nv_engine_id)e;
            if (!nv_engine_available(id)) continue;
            if (o->engine ? strcmp(o->engine, nv_engine_name(id)) != 0 : id == NV_ENGINE_SCALAR) continue;
            /* with --lora-rank: adapters on every matrix of a frozen (randomly initialised) model */
            const nv_lora_shape lora = {lora_rank, 2.0f * (float)lora_rank, NV_LORA_ALL};
            nv_model base = {0};
            if (lora_rank && nv_model_alloc(&base, &c) != NV_OK) return cli_error(CMD, 1, "%s", nv_errmsg());
            if (lora_rank) nv_model_init_random(&base, 1);
            nv_tmodel tm;
            const nv_err ie = nv_tmodel_init_lora(&tm, &c, lora_rank ? base.params : NULL, 1, batch, seq, id, &lora, NULL);
            if (ie != NV_OK) {
                nv_model_free(&base);
                return cli_error(CMD, 1, "%s", nv_errmsg());
            }
            nv_adamw opt;
            nv_adamw_opts ao;
            nv_adamw_defaults(&ao);
            nv_adamw_init(&opt, &ao, lora_rank ? NULL : &c, tm.n_train);
            int *in = malloc(sizeof(int) * (size_t)batch * seq), *tg = malloc(sizeof(int) * (size_t)batch * seq);
            uint64_t st = 42;
            for (int i = 0; i < batch * seq; i++) {
                in[i] = (int)(nv_xorshift_u32(&st) % (uint32_t)c.vocab_size);
                tg[i] = (int)(nv_xorshift_u32(&st) % (uint32_t)c.vocab_size);
            }
            double t0 = 0, attn0 = 0;
            for (int s = 0; s <= steps; s++) { /* step 0 warms up */
                if (s == 1) t0 = nv_now(), attn0 = tm.attn_seconds;
                nv_tmodel_forward(&tm, in, tg);
                nv_tmodel_backward(&tm, 1.0f);
                nv_tmodel_optimize(&tm, &opt, NULL);
            }
            double ms = (nv_now() - t0) * 1e3 / steps, tps = batch * seq / (ms / 1e3);
            bench_row r;
            row_begin(&r, "train", nv_engine_name(nv_model_engine(&tm.m)), threads);
            row_str(&r, "model", models[mi]);
            row_int(&r, "seq", seq);
            row_int(&r, "batch", batch);
            if (lora_rank) row_int(&r, "lora_rank", lora_rank);
            if (experts) row_int(&r, "experts", experts), row_int(&r, "experts_used", experts_used);
            row_num(&r, "ms_per_step", ms);
            row_num(&r, "ms_attention", (tm.attn_seconds - attn0) * 1e3 / steps);
            row_num(&r, "tokens_per_s", tps);
            double tflops = tm.flops_per_step / (ms / 1e3) / 1e12;
            row_num(&r, "tflops", tflops);
            /* against the peak of this engine's unit, measured now on all the threads */
            nv_peak_unit unit = nv_peak_unit_of(nv_engine_bf16_of(id)); /* int8 engines train on bf16 tiles */
            char pwhy[200];
            if (id != NV_ENGINE_SCALAR && nv_peak_available(unit, pwhy, sizeof pwhy)) {
                double peak = nv_peak_run(unit, threads, 0.3);
                if (peak > 0) {
                    row_num(&r, "peak_tflops", peak / 1e12);
                    row_num(&r, "peak_frac", tflops * 1e12 / peak);
                }
            }
            row_end(&r, o);
            if (tps > best_tps) best_tps = tps, best_engine = nv_engine_name(id);
            free(in);
            free(tg);
            nv_adamw_free(&opt);
            nv_tmodel_free(&tm);
            nv_model_free(&base); /* the frozen weights the adapters' model used in place */
        }
        /* the peer's model: llama's block, or Gemma 3's (what torch_ref.py writes; not caps, divisors or
           RoPE scaling) */
        const int gemma3 = c.ffn_gelu && c.post_norms && c.emb_scale != 0.0f;
        if (!peers || (nv_config_gemma_block(&c) && !gemma3) || c.logit_softcap != 0.0f || c.attn_softcap != 0.0f ||
            c.attn_div != 0.0f || c.n_rope_factors || c.qkv_bias || c.nope_period || nv_config_granite(&c) || c.rope_dim)
            continue;
        const char *modes[] = {"fp32", "bf16"}, *names[] = {"pytorch-fp32", "pytorch-bf16"};
        for (int k = 0; k < 2; k++) {
            char why[512] = "";
            double ms = torch_step_ms(&c, batch, seq, threads, o->quick ? 1 : 2, modes[k], why, sizeof why);
            bench_row r;
            row_begin(&r, "train", names[k], threads);
            row_str(&r, "model", models[mi]);
            row_int(&r, "seq", seq);
            row_int(&r, "batch", batch);
            if (ms > 0) {
                double tps = batch * seq / (ms / 1e3);
                row_num(&r, "ms_per_step", ms);
                row_num(&r, "tokens_per_s", tps);
                if (best_tps > 0) {
                    row_num(&r, "ratio_vs", best_tps / tps);
                    row_str(&r, "ratio_of", best_engine);
                }
            } else {
                r.jn += (size_t)snprintf(r.json + r.jn, sizeof r.json - r.jn, ",\"ok\":false");
                row_str(&r, "why", why);
            }
            row_end(&r, o);
        }
    }
    return 0;
}
