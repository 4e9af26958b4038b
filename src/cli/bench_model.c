/* nerve bench accuracy | generate: the engines measured on whole models.
 *
 * accuracy  every engine against scalar on stories260K (or --model FILE|RUN_DIR with -z), teacher-
 *           forced over 512 positions of a tokenized TinyStories text: max and mean absolute logit
 *           error and the rate at which the top-1 token agrees with scalar's fp32 forward; with
 *           --kv-cache-dtype, each engine runs the batched forward over paged KV of that type.
 * generate  prefill tokens/s (prompts of 256 and 2048 tokens, fed through nv_forward in chunks of
 *           256) and single-stream decode tokens/s on a stories110M-shaped model with a 4096-token
 *           context, randomly initialised in memory (speed does not depend on the weights' values),
 *           per engine, 1 thread and all cores; a read-bandwidth probe in the same run gives the
 *           decode bound (bandwidth / weight bytes per token, the plans' packed bytes summed) and
 *           the fraction of it reached. --case NAME runs one case (prefill2048 takes minutes per
 *           engine while attention in nv_forward is serial). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "base/file.h"
#include "base/rng.h"
#include "base/timer.h"
#include "cli/bench.h"
#include "cli/cli.h"
#include "engine/engine.h"
#include "engine/peak.h"
#include "model/batch.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/sampler.h"
#include "model/tokenizer.h"

/* The weight bytes one token reads: of a mixture's experts, the share it uses. */
static size_t model_weight_bytes(const nv_model *m) {
    const nv_config *c = &m->config;
    size_t b = nv_plan_packed_bytes(m->cls_plan);
    for (int l = 0; l < c->n_layers; l++) {
        const nv_layer_plans *lp = &m->plans[l];
        const nv_plan *all[] = {lp->wq, lp->wk, lp->wv, lp->wo, lp->w1, lp->w2, lp->w3, lp->router};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) b += all[i] ? nv_plan_packed_bytes(all[i]) : 0;
        size_t experts = 0;
        for (int i = 0; lp->experts && i < 3 * c->n_experts; i++) experts += nv_plan_packed_bytes(lp->experts[i]);
        if (c->n_experts) b += experts / (size_t)c->n_experts * (size_t)c->n_experts_used;
    }
    return b;
}

/* ---------------------------------------------------------------- accuracy */

/* Logits of every position of ids[0..n) (teacher forcing), in chunks of 64: through nv_forward
 * (its fp32 cache) when kv is 0, else through the batched forward over paged KV of that type (as
 * `nerve serve` keeps it). */
static nv_err all_logits(const nv_model *m, const int *ids, int n, nv_kv_dtype kv, float *out) {
    const int chunk = 64, V = m->config.vocab_size;
    if (kv) {
        const int block = 16, n_blocks = (n + block - 1) / block;
        nv_kv_pages pages;
        nv_batch_state bs;
        int *table = malloc((size_t)n_blocks * sizeof(int));
        if (!table) return nv_fail(NV_ENOMEM, "out of memory");
        for (int b = 0; b < n_blocks; b++) table[b] = b;
        nv_err err = nv_kv_pages_init(&pages, &m->config, block, n_blocks, kv);
        if (err == NV_OK && (err = nv_batch_state_init(&bs, &m->config, chunk, 1)) != NV_OK) nv_kv_pages_free(&pages);
        if (err != NV_OK) {
            free(table);
            return err;
        }
        for (int pos = 0; pos < n && err == NV_OK; pos += chunk) {
            int len = n - pos < chunk ? n - pos : chunk;
            nv_batch_seq q = {ids + pos, len, pos, table, len, 0, NULL};
            err = nv_batch_forward(m, &bs, &pages, &q, 1);
            for (int t = 0; t < len && err == NV_OK; t++)
                memcpy(out + (size_t)(pos + t) * V, nv_batch_logits_at(&bs, &m->config, 0, t), (size_t)V * sizeof(float));
        }
        nv_batch_state_free(&bs);
        nv_kv_pages_free(&pages);
        free(table);
        return err;
    }
    nv_state s;
    NV_TRY(nv_state_init(&s, &m->config, chunk, n, 1));
    nv_err err = NV_OK;
    for (int pos = 0; pos < n && err == NV_OK; pos += chunk) {
        int len = n - pos < chunk ? n - pos : chunk;
        err = nv_forward(m, &s, ids + pos, len, pos);
        if (err == NV_OK) memcpy(out + (size_t)pos * V, s.logits, (size_t)len * V * sizeof(float));
    }
    nv_state_free(&s);
    return err;
}

static void accuracy_fail_rows(const bench_opts *o, int threads, const char *model, nv_kv_dtype kv, const char *why) {
    for (int e = 0; e < NV_ENGINE_COUNT; e++) {
        if (!bench_engine_wanted(o, e)) continue;
        bench_row r;
        row_begin(&r, "accuracy", nv_engine_name((nv_engine_id)e), threads);
        row_str(&r, "model", model);
        row_str(&r, "kv_dtype", kv ? nv_kv_dtype_name(kv) : "f32");
        row_str(&r, "kv_path", kv ? "paged" : "forward");
        row_fail(&r, why);
        row_end(&r, o);
    }
}

int bench_accuracy(int argc, char **argv, const bench_opts *o) {
    int positions = o->quick ? 64 : 512;
    nv_kv_dtype kv = (nv_kv_dtype)0;
    const char *model_arg = NULL, *tok_arg = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!(v = cli_value("bench accuracy", argc, argv, &i))) return 2;
        if (!strcmp(argv[i - 1], "--positions")) {
            if (!cli_int("bench accuracy", "--positions", v, 1, 1 << 20, &positions)) return 2;
        } else if (!strcmp(argv[i - 1], "--model") || !strcmp(argv[i - 1], "-m")) {
            model_arg = v;
        } else if (!strcmp(argv[i - 1], "-z")) {
            tok_arg = v;
        } else if (!strcmp(argv[i - 1], "--kv-cache-dtype")) {
            if (!cli_kv_dtype("bench accuracy", argv[i - 1], v, &kv)) return 2;
        } else
            return cli_error("bench accuracy", 2, "unknown option '%s' (--positions N, --kv-cache-dtype T, --model FILE|RUN_DIR, -z TOKENIZER)", argv[i - 1]);
    }
    if (nv_engines_init(NULL, o->threads) != NV_OK) return cli_error("bench accuracy", 1, "%s", nv_errmsg());
    const int threads = o->threads ? o->threads : nv_cpu_probe()->cores;
    char mpath[4096], tpath[4096], cpath[4096], why[4400];
    /* stories260K and its tokenizer unless --model (a file or a run folder, whose tokenizer.bin it
     * takes unless -z) names another; the text is always the shared TinyStories validation head */
    const char *label = model_arg ? model_arg : "stories260K";
    const char *rel[3] = {"models/stories260K.bin", "models/tok512.bin", "corpus/tinystories_valid_head.txt"};
    char *paths[3] = {mpath, tpath, cpath};
    for (int i = model_arg ? 2 : 0; i < 3; i++)
        if (!nv_data_path(rel[i], paths[i], sizeof mpath)) {
            snprintf(why, sizeof why, "no ../shared/data/%s (set NERVE_DATA to its folder)", rel[i]);
            accuracy_fail_rows(o, threads, label, kv, why);
            return 0;
        }
    if (model_arg) {
        cli_paths found;
        const char *mp = model_arg, *tp = tok_arg;
        cli_model_paths(&mp, &tp, &found);
        snprintf(mpath, sizeof mpath, "%s", mp);
        snprintf(tpath, sizeof tpath, "%s", tp);
    } else if (tok_arg)
        snprintf(tpath, sizeof tpath, "%s", tok_arg);
    nv_model m;
    if (nv_model_load(mpath, &m) != NV_OK) return cli_error("bench accuracy", 1, "%s", nv_errmsg());
    nv_tokenizer *tok = NULL;
    char *text = NULL;
    size_t tlen = 0;
    int *ids = NULL, nids = 0;
    float *ref = NULL, *got = NULL;
    int rc = 0;
    if (nv_tokenizer_load(tpath, m.config.vocab_size, &tok) != NV_OK || nv_file_read_all(cpath, &text, &tlen) != NV_OK) {
        rc = cli_error("bench accuracy", 1, "%s", nv_errmsg());
        goto out;
    }
    /* the first stories are plenty for 512 tokens: cut at a line end near 32 KB */
    if (tlen > 32768) {
        char *nl = memchr(text + 32768, '\n', tlen - 32768);
        if (nl) *nl = '\0';
    }
    if (nv_tokenizer_encode(tok, text, 1, 0, &ids, &nids) != NV_OK) {
        rc = cli_error("bench accuracy", 1, "%s", nv_errmsg());
        goto out;
    }
    if (positions > nids) positions = nids;
    if (positions > m.config.seq_len) positions = m.config.seq_len;
    const int V = m.config.vocab_size;
    ref = malloc((size_t)positions * V * sizeof(float));
    got = malloc((size_t)positions * V * sizeof(float));
    if (!ref || !got) {
        rc = cli_error("bench accuracy", 1, "out of memory");
        goto out;
    }
    if (nv_model_build_plans(&m, NV_ENGINE_SCALAR) != NV_OK || all_logits(&m, ids, positions, (nv_kv_dtype)0, ref) != NV_OK) {
        rc = cli_error("bench accuracy", 1, "%s", nv_errmsg());
        goto out;
    }
    double ref_max = 0;
    for (size_t i = 0; i < (size_t)positions * V; i++) ref_max = fmax(ref_max, fabs(ref[i]));
    for (int e = 0; e < NV_ENGINE_COUNT; e++) {
        if (!bench_engine_wanted(o, e)) continue;
        bench_row r;
        row_begin(&r, "accuracy", nv_engine_name((nv_engine_id)e), threads);
        row_str(&r, "model", label);
        row_int(&r, "seq", positions);
        row_str(&r, "kv_dtype", kv ? nv_kv_dtype_name(kv) : "f32");
        row_str(&r, "kv_path", kv ? "paged" : "forward");
        if (!nv_engine_available((nv_engine_id)e)) {
            snprintf(why, sizeof why, "engine %s is off: %s", nv_engine_name((nv_engine_id)e), nv_engine_why_off((nv_engine_id)e));
            row_fail(&r, why);
            row_end(&r, o);
            continue;
        }
        if (nv_model_build_plans(&m, (nv_engine_id)e) != NV_OK || all_logits(&m, ids, positions, kv, got) != NV_OK) {
            row_fail(&r, nv_errmsg());
            row_end(&r, o);
            continue;
        }
        double maxe = 0, sum = 0;
        int agree = 0;
        for (int p = 0; p < positions; p++) {
            const float *a = ref + (size_t)p * V, *b = got + (size_t)p * V;
            for (int j = 0; j < V; j++) {
                double d = fabs((double)a[j] - (double)b[j]);
                maxe = d > maxe ? d : maxe;
                sum += d;
            }
            agree += nv_argmax(a, V) == nv_argmax(b, V);
        }
        row_num(&r, "max_abs_err", maxe);
        row_num(&r, "mean_abs_err", sum / ((double)positions * V));
        row_num(&r, "top1_agree", (double)agree / positions);
        row_int(&r, "top1_differ", positions - agree);
        row_num(&r, "max_abs_logit", ref_max);
        row_end(&r, o);
    }
out:
    free(ref);
    free(got);
    free(ids);
    free(text);
    nv_tokenizer_free(tok);
    nv_model_free(&m);
    return rc;
}

/* ---------------------------------------------------------------- generate */

/* FLOP of forwarding n tokens at positions pos.. (matmuls, attention scores and sums, and the
 * classifier for the rows that get logits). */
static double forward_flops(const nv_config *c, int n, int pos, int cls_rows) {
    double d = c->dim, q = nv_config_q_dim(c), kv = nv_config_kv_dim(c), h = c->hidden_dim;
    /* a mixture of experts: the experts a token uses, and the router */
    const double ffn_sets = c->n_experts ? c->n_experts_used : 1;
    double per_tok = c->n_layers * (2.0 * d * (q + 2 * kv) + 2.0 * q * d + 6.0 * d * h * ffn_sets + 2.0 * d * c->n_experts);
    double ctx = 0, ctx_window = 0; /* sum over the n queries of the positions they attend to (in a sliding window's layers) */
    for (int t = 0; t < n; t++) ctx += pos + t + 1, ctx_window += c->swa_window && pos + t + 1 > c->swa_window ? c->swa_window : pos + t + 1;
    const int windowed = nv_config_windowed_layers(c);
    double att = 4.0 * c->n_heads * c->head_dim * ((c->n_layers - windowed) * ctx + windowed * ctx_window);
    return per_tok * n + att + 2.0 * d * c->vocab_size * cls_rows;
}

typedef struct {
    int ok;
    double s;
} timed;

double bench_prefill_s(const nv_model *m, nv_state *s, const int *prompt, int n, int chunk) {
    double t0 = nv_now();
    for (int pos = 0; pos < n; pos += chunk)
        if (nv_forward(m, s, prompt + pos, n - pos < chunk ? n - pos : chunk, pos) != NV_OK) return -1;
    return nv_now() - t0;
}

static timed prefill(const nv_model *m, nv_state *s, const int *prompt, int n, int chunk) {
    const double sec = bench_prefill_s(m, s, prompt, n, chunk);
    return (timed){sec >= 0, sec};
}

int bench_generate(int argc, char **argv, const bench_opts *o) {
    const char *preset = o->quick ? "stories260K" : "stories110M", *only_case = NULL;
    int chunk = o->quick ? 16 : 256, steps = o->quick ? 4 : 64, prompt_decode = 16;
    int lens[2] = {256, 2048};
    if (o->quick) lens[0] = 32, lens[1] = 64;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!(v = cli_value("bench generate", argc, argv, &i))) return 2;
        if (!strcmp(argv[i - 1], "--steps")) { if (!cli_int("bench generate", "--steps", v, 1, 4096, &steps)) return 2; }
        else if (!strcmp(argv[i - 1], "--chunk")) { if (!cli_int("bench generate", "--chunk", v, 1, 4096, &chunk)) return 2; }
        else if (!strcmp(argv[i - 1], "--model")) preset = v;
        else if (!strcmp(argv[i - 1], "--case")) only_case = v;
        else return cli_error("bench generate", 2, "unknown option '%s' (--steps N, --chunk N, --model PRESET|FILE, --case NAME)", argv[i - 1]);
    }
    if (only_case && strcmp(only_case, "prefill256") && strcmp(only_case, "prefill2048") && strcmp(only_case, "decode"))
        return cli_error("bench generate", 2, "unknown case '%s' (prefill256, prefill2048, decode)", only_case);
    nv_config c;
    nv_model m;
    /* a preset (random weights, context 4096), or a model file as it is (a GGUF file's quantized
       matrices then run from block-quantized plans where the engine has them) */
    if (nv_engines_init(NULL, o->threads) != NV_OK) return cli_error("bench generate", 1, "%s", nv_errmsg());
    const int from_file = nv_config_preset(preset, &c) != NV_OK;
    if (from_file) {
        /* as generate and serve load it: fp32 copies of quantized matrices only where a plan needs one */
        if (nv_model_load_quantized(preset, &m) != NV_OK)
            return cli_error("bench generate", 1, "--model %s is neither a preset nor a model file: %s", preset, nv_errmsg());
        c = m.config;
        if (c.seq_len <= prompt_decode) {
            nv_model_free(&m);
            return cli_error("bench generate", 1, "%s: a context of %d positions leaves no room to decode after a %d-token prompt",
                             preset, c.seq_len, prompt_decode);
        }
    } else {
        c.seq_len = o->quick ? c.seq_len : 4096;
    }
    if (lens[1] > c.seq_len) lens[1] = c.seq_len;
    if (lens[0] > lens[1]) lens[0] = lens[1];
    if (prompt_decode + steps > c.seq_len) steps = c.seq_len - prompt_decode;
    if (!from_file) {
        if (nv_model_alloc(&m, &c) != NV_OK) return cli_error("bench generate", 1, "%s", nv_errmsg());
        nv_model_init_random(&m, 1234);
    }
    const int cache_len = lens[1] > prompt_decode + steps ? lens[1] : prompt_decode + steps;
    int *prompt = malloc(sizeof(int) * (size_t)cache_len);
    if (!prompt) {
        nv_model_free(&m);
        return cli_error("bench generate", 1, "out of memory");
    }
    uint64_t st = 99;
    for (int i = 0; i < cache_len; i++) prompt[i] = (int)(nv_xorshift_u32(&st) % (uint32_t)c.vocab_size);
    const size_t bw_bytes = o->quick ? (16u << 20) : (1024u << 20);
    const char *cases[3] = {"prefill256", "prefill2048", "decode"};
    int tl[2], nt = bench_thread_list(o, tl);
    int rc = 0;
    for (int ti = 0; ti < nt && !rc; ti++) {
        const int T = tl[ti];
        if (nv_engines_init(NULL, T) != NV_OK) {
            rc = cli_error("bench generate", 1, "%s", nv_errmsg());
            break;
        }
        double bw = nv_mem_read_bw(bw_bytes, T, o->quick ? 1 : 5);
        bench_row r;
        row_begin(&r, "generate", "avx2", T);
        row_str(&r, "case", "read-bw");
        row_num(&r, "mb", (double)bw_bytes / (1 << 20));
        if (bw > 0) row_num(&r, "gb_per_s", bw / 1e9);
        else row_fail(&r, "out of memory");
        row_end(&r, o);
        for (int e = 0; e < NV_ENGINE_COUNT; e++) {
            if (!bench_engine_wanted(o, e)) continue;
            const char *en = nv_engine_name((nv_engine_id)e);
            char why[320] = "";
            nv_state s;
            int have_state = 0;
            if (!nv_engine_available((nv_engine_id)e)) {
                snprintf(why, sizeof why, "engine %s is off: %s", en, nv_engine_why_off((nv_engine_id)e));
            } else {
                if (nv_model_build_plans(&m, (nv_engine_id)e) != NV_OK ||
                    nv_state_init(&s, &c, chunk, cache_len, 0) != NV_OK)
                    snprintf(why, sizeof why, "%s", nv_errmsg());
                else have_state = 1;
            }
            const size_t wbytes = have_state ? model_weight_bytes(&m) : 0;
            for (int ci = 0; ci < 3; ci++) {
                if (only_case && strcmp(only_case, cases[ci])) continue;
                row_begin(&r, "generate", en, T);
                row_str(&r, "case", cases[ci]);
                row_str(&r, "model", preset);
                row_str(&r, "weights", from_file ? "from the file" : "random init in memory");
                int seq = ci < 2 ? lens[ci] : steps;
                row_int(&r, "seq", seq);
                if (!have_state) {
                    row_fail(&r, why);
                    row_end(&r, o);
                    continue;
                }
                if (ci < 2) {
                    /* the short prompt twice (median of 3 would cost minutes on one core); keep the faster */
                    timed t = prefill(&m, &s, prompt, seq, chunk);
                    if (t.ok && ci == 0 && !o->quick) {
                        timed t2 = prefill(&m, &s, prompt, seq, chunk);
                        if (t2.ok && t2.s < t.s) t = t2;
                    }
                    if (!t.ok) {
                        row_fail(&r, nv_errmsg());
                    } else {
                        row_num(&r, "tokens_per_s", seq / t.s);
                        row_num(&r, "ms", t.s * 1e3);
                        row_num(&r, "gflops", forward_flops(&c, seq, 0, 1) / t.s / 1e9);
                    }
                    row_end(&r, o);
                    continue;
                }
                /* decode: a short prompt, then one token at a time (greedy) */
                timed t = prefill(&m, &s, prompt, prompt_decode, chunk);
                int tokv = nv_argmax(s.logits, c.vocab_size);
                double t0 = nv_now();
                int done = 0;
                for (; t.ok && done < steps; done++) {
                    if (nv_forward(&m, &s, &tokv, 1, prompt_decode + done) != NV_OK) break;
                    tokv = nv_argmax(s.logits, c.vocab_size);
                }
                double sec = nv_now() - t0;
                if (done < steps) {
                    row_fail(&r, nv_errmsg());
                    row_end(&r, o);
                    continue;
                }
                double tps = steps / sec;
                row_num(&r, "tokens_per_s", tps);
                row_num(&r, "ms_per_token", sec * 1e3 / steps);
                row_num(&r, "weight_mb", (double)wbytes / (1 << 20));
                row_num(&r, "gb_per_s", tps * (double)wbytes / 1e9);
                if (bw > 0) {
                    row_num(&r, "bound_tokens_per_s", bw / (double)wbytes);
                    row_num(&r, "of_bound", tps / (bw / (double)wbytes));
                }
                row_end(&r, o);
            }
            if (have_state) nv_state_free(&s);
        }
    }
    nv_model_free(&m);
    free(prompt);
    return rc;
}
