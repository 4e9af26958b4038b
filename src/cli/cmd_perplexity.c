/* nerve perplexity: how well a model predicts a text (llama.cpp's llama-perplexity: chunks of
 * --ctx tokens, each starting at BOS, the second half of each scored so every scored token sees at
 * least half a context), and with --kl-base how far its next-token distributions are from a
 * reference model's on the same tokens: a quantized export, an int8 engine or an adapter against
 * the model they came from, in one run (no file of logits in between). nerve imatrix runs the same
 * chunks to collect an importance matrix (llama.cpp's llama-imatrix) for `nerve export --imatrix`. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/cpu.h"
#include "base/log.h"
#include "base/timer.h"
#include "model/choice.h"
#include "cli/cli.h"
#include "cli/hub.h"
#include "model/forward.h"
#include "model/imatrix.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "train/data.h"

#define CMD "perplexity"
#define ROWS 64       /* tokens per forward pass, as generate's prefill */
#define MAX_FILES 64
#define DEFAULT_CTX 512 /* llama.cpp's customary context for perplexity; the model's when shorter */

static void usage(FILE *f) {
    fprintf(f,
            "usage: nerve perplexity -m MODEL [-z TOKENIZER] [-f FILE...] [--ctx N] [--chunks N] [--val-frac F]\n"
            "                        [--engine E] [--threads N] [--lora ADAPTER] [--lora-scaled ADAPTER SCALE]\n"
            "                        [--kl-base MODEL [--kl-base-engine E]] [--json]\n"
            "       nerve perplexity -m MODEL [-z TOKENIZER] --multiple-choice FILE [--tasks N] [--engine E] [--json]\n"
            CLI_HUB_USAGE
            "  -m MODEL      llama2.c checkpoint, GGUF file, `nerve train` run folder or Hugging Face folder\n"
            "  -z TOKENIZER  as generate's (the run folder's, the GGUF file's own, a Hugging Face folder's tokenizer.json,\n"
            "                else the shared tokenizer.bin)\n"
            "  -f FILE       text (tokenized with -z; documents split at blank lines, each from BOS, as nerve train\n"
            "                reads it) or token shards (.bin uint16, .u32 uint32); several are read in order\n"
            "                (also --data; default: corpus/tinystories_valid_head.txt in the shared data)\n"
            "  --ctx N       tokens per chunk (default: 512, or the model's context when shorter); each chunk\n"
            "                starts at BOS and the predictions of its second half are scored\n"
            "  --chunks N    score at most N chunks (default: every whole chunk of the text)\n"
            "  --val-frac F  score only the last F of each file: the part `nerve train --val-frac F` held out\n"
            "                Chat data (.jsonl: conversations, or prompt/completion lines) is scored as training\n"
            "                validates it: each turn from its start, its answer tokens alone\n"
            "  --chat-template T  chat data's template (default: the model's own, as nerve train's, else chatml)\n"
            "  --chat-template-file F, --jinja  a Jinja template, run as nerve train and serve run them\n"
            "  --engine E    the engine (default: the fastest exact fp32 one, as generate)\n"
            "  --threads N   threads for the engines (default: one per core)\n"
            "  --lora ADAPTER, --lora-scaled ADAPTER SCALE\n"
            "                adapters merged into MODEL at load, as generate's\n"
            "  --kl-base MODEL\n"
            "                also run MODEL (same vocabulary) on the same tokens and report the KL divergence of\n"
            "                this model's next-token distributions from its, how often their top tokens agree, and\n"
            "                the two perplexities (llama.cpp's --kl-divergence statistics)\n"
            "  --kl-base-engine E\n"
            "                the reference's engine (default: the fastest exact fp32 one)\n"
            "  --multiple-choice FILE\n"
            "                accuracy on multiple-choice tasks instead: llama.cpp's HellaSwag text (6 lines a task),\n"
            "                or JSON Lines ({\"ctx\"|\"context\"|\"prompt\"|\"question\", \"endings\"|\"choices\",\n"
            "                \"label\"|\"answer\"}); each choice scored by the log-probability of its tokens after\n"
            "                the context, summed (acc) and a token (acc_norm, llama.cpp's HellaSwag score)\n"
            "  --tasks N     score the first N tasks\n"
            "  --json        print the results as one JSON object\n");
}

static void imatrix_usage(FILE *f) {
    fprintf(f,
            "usage: nerve imatrix -m MODEL [-z TOKENIZER] [-f FILE...] [--ctx N] [--chunks N] [--val-frac F]\n"
            "                     [--engine E] [--threads N] [--lora ADAPTER] [--in-file IMATRIX...] [-o FILE]\n"
            "       nerve imatrix --in-file IMATRIX --in-file IMATRIX... [-o FILE]\n"
            "  runs MODEL over a text in chunks, as nerve perplexity does (and prints its perplexity), summing\n"
            "  for every weight matrix the square of each input column over all the tokens: an importance matrix\n"
            "  (llama.cpp's imatrix), for `nerve export --type q4_k_m|q4_0|... --imatrix FILE` to keep best\n"
            "  the weights that meet the largest inputs\n"
            "  -o FILE       where it goes (default imatrix.gguf): llama.cpp's imatrix GGUF, which its\n"
            "                llama-quantize --imatrix also reads\n"
            "  --in-file F   an importance matrix collected before (GGUF or llama.cpp's .dat) added to this\n"
            "                one, sums and counts (llama-imatrix's --in-file); without -m, the files are\n"
            "                combined alone\n"
            "  -m, -z, -f, --ctx, --chunks, --val-frac, --engine, --threads, --lora: as nerve perplexity's\n"
            "                (text only: no chat data); a few hundred chunks of text like the model's are plenty\n");
}

/* Adds each of the n importance matrices in files to im (nv_imatrix_merge); 0, or an exit code. */
static int imatrix_add_files(const char *cmd, nv_imatrix *im, const char *const *files, int n) {
    for (int i = 0; i < n; i++) {
        nv_imatrix in;
        if (nv_imatrix_load(files[i], &in) != NV_OK) return cli_error(cmd, 1, "%s", nv_errmsg());
        const nv_err e = nv_imatrix_merge(im, &in, files[i]);
        nv_imatrix_free(&in);
        if (e != NV_OK) return cli_error(cmd, 1, "%s", nv_errmsg());
    }
    return 0;
}

static void imatrix_wrote(const char *path, const nv_imatrix *im) {
    fprintf(stderr, "nerve imatrix: wrote %s (%d matrices, %d chunk%s of %d tokens)\n", path, im->n, im->chunks,
            im->chunks == 1 ? "" : "s", im->chunk_size);
}

/* nerve imatrix --in-file A --in-file B ... without a model: the files combined into out. */
static int imatrix_combine(const char *cmd, const char *const *files, int n, const char *out) {
    nv_imatrix im = {0};
    int rc = imatrix_add_files(cmd, &im, files, n);
    if (rc == 0 && nv_imatrix_save(&im, out) != NV_OK) rc = cli_error(cmd, 1, "%s", nv_errmsg());
    if (rc == 0) imatrix_wrote(out, &im);
    nv_imatrix_free(&im);
    return rc;
}

/* A running mean and variance (Welford), and the standard error of the mean as llama.cpp gives it. */
typedef struct {
    uint64_t n;
    double mean, m2;
} moments;

static void mom_add(moments *m, double x) {
    m->n++;
    const double d = x - m->mean;
    m->mean += d / (double)m->n;
    m->m2 += d * (x - m->mean);
}

static double mom_err(const moments *m) { return m->n > 1 ? sqrt(m->m2 / ((double)m->n * (double)(m->n - 1))) : 0.0; }

static double mom_rms(const moments *m) { return m->n ? sqrt(m->mean * m->mean + m->m2 / (double)m->n) : 0.0; }

/* One model being scored: its weights on their engine and the single-sequence state a chunk runs in. */
typedef struct {
    const char *path;
    nv_model m;
    nv_state s;
    nv_engine_id engine;
    double seconds; /* in forward passes */
    moments nll;    /* -log p(next token) of every scored position */
} scored_model;

static void scored_free(scored_model *sm) {
    nv_state_free(&sm->s);
    nv_model_free(&sm->m);
}

/* Loads a model and builds its plans; the state comes once the context is known (scored_ready). */
static nv_err scored_open(scored_model *sm, const char *path, const cli_loras *loras, nv_engine_id engine) {
    sm->path = path;
    sm->engine = engine;
    NV_TRY(cli_load_model(path, loras, 1, &sm->m));
    sm->m.drop_sources = 1; /* built once: each source goes as its plan takes it */
    nv_err e = nv_model_build_plans(&sm->m, engine);
    if (e != NV_OK) {
        scored_free(sm);
        return e;
    }
    nv_model_drop_quant_sources(&sm->m); /* the plans hold their own copy */
    return NV_OK;
}

static nv_err scored_ready(scored_model *sm, int ctx) {
    if (ctx > sm->m.config.seq_len)
        return nv_fail(NV_EINVAL, "%s: --ctx %d is longer than the model's context of %d", sm->path, ctx, sm->m.config.seq_len);
    return nv_state_init(&sm->s, &sm->m.config, ROWS, ctx, 0);
}

/* The token stream: every source's range [lo, hi) in order, read a chunk at a time. */
typedef struct {
    const nv_dataset *ds;
    double val_frac;
    uint64_t total;
} stream;

static uint64_t src_lo(const stream *st, const nv_source *s) { return st->val_frac > 0 ? s->n_train : 0; }

static void stream_read(const stream *st, uint64_t at, int n, int *out) {
    int k = 0;
    for (int i = 0; i < st->ds->n_src && k < n; i++) {
        const nv_source *s = &st->ds->src[i];
        const uint64_t lo = src_lo(st, s), len = s->n_tokens - lo;
        if (at >= len) {
            at -= len;
            continue;
        }
        for (uint64_t j = lo + at; j < s->n_tokens && k < n; j++) out[k++] = (int)nv_source_token(s, j);
        at = 0;
    }
}

/* The forward passes of one chunk on one model: its logits for positions [lo, hi) land in rows[0..]
 * (a pass whose positions are all before lo asks for one row and drops it; with all_rows every
 * row is run through the classifier, so that an importance matrix sees them all). */
static nv_err chunk_pass(scored_model *sm, const int *tok, int start, int n, int lo, int all_rows, int *rows_out) {
    const int want_from = lo > start ? lo : start;
    const int rows = all_rows ? n : want_from < start + n ? start + n - want_from : 1;
    const double t0 = nv_now();
    nv_err e = nv_forward_rows(&sm->m, &sm->s, tok + start, n, start, rows);
    sm->seconds += nv_now() - t0;
    *rows_out = all_rows || want_from < start + n ? rows : 0;
    return e;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The value below which a fraction q of the sorted values lie (linear between neighbours). */
static double quantile(const double *v, uint64_t n, double q) {
    if (!n) return 0;
    const double at = q * (double)(n - 1);
    const uint64_t i = (uint64_t)at;
    return i + 1 < n ? v[i] + (at - (double)i) * (v[i + 1] - v[i]) : v[n - 1];
}

/* What --kl-base adds: per scored position the KL divergence of this model's distribution from the
 * reference's, the change in the correct token's probability, whether the top tokens agree, and the
 * co-moment of the two models' log-likelihoods (their correlation; the moments themselves are the
 * models' nll). */
typedef struct {
    double *kld;
    uint64_t n, cap;
    moments kl, dp, same, diff; /* diff: -log p_q + log p_base */
    double cxy;
} kl_stats;

/* One scored position of both models: their nll (nq, nb), and what --kl-base adds. */
static nv_err kl_add(kl_stats *k, moments *nq_all, moments *nb_all, const float *lq, const float *lb, int V, int target) {
    const double zq = nv_logits_logz(lq, V), zb = nv_logits_logz(lb, V);
    double kld = 0;
    for (int i = 0; i < V; i++) {
        const double lpb = (double)lb[i] - zb;
        kld += exp(lpb) * (lpb - ((double)lq[i] - zq));
    }
    if (k->n == k->cap) {
        uint64_t cap = k->cap ? 2 * k->cap : 4096;
        double *p = realloc(k->kld, cap * sizeof *p);
        if (!p) return nv_fail(NV_ENOMEM, "out of memory");
        k->kld = p, k->cap = cap;
    }
    k->kld[k->n++] = kld;
    mom_add(&k->kl, kld);
    const double nq = zq - lq[target], nb = zb - lb[target];
    mom_add(&k->dp, exp(-nq) - exp(-nb));
    mom_add(&k->same, nv_argmax(lq, V) == nv_argmax(lb, V) ? 1.0 : 0.0);
    mom_add(&k->diff, nq - nb);
    const double dx = nq - nq_all->mean; /* the bivariate Welford update, before the means move */
    mom_add(nq_all, nq);
    mom_add(nb_all, nb);
    k->cxy += dx * (nb - nb_all->mean);
    return NV_OK;
}

static double kl_cor(const kl_stats *k, const moments *nq_all, const moments *nb_all) {
    const double den = sqrt(nq_all->m2 * nb_all->m2);
    return den > 0 ? k->cxy / den : 1.0;
}

static const double kl_quantiles[] = {0.999, 0.99, 0.5, 0.10, 0.05, 0.01};
static const char *const kl_quantile_names[] = {"99.9%", "99.0%", "Median", "10.0%", "5.0%", "1.0%"};
static const char *const kl_quantile_keys[] = {"p99_9", "p99", "median", "p10", "p5", "p1"};

static void print_text(const scored_model *q, const scored_model *b, const kl_stats *k) {
    const double ppl = exp(q->nll.mean);
    if (!b) {
        printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, ppl * mom_err(&q->nll));
        return;
    }
    const double pplb = exp(b->nll.mean), ratio = exp(k->diff.mean);
    printf("====== Perplexity statistics ======\n");
    printf("Mean PPL(Q)                   : %10.6f +/- %10.6f\n", ppl, ppl * mom_err(&q->nll));
    printf("Mean PPL(base)                : %10.6f +/- %10.6f\n", pplb, pplb * mom_err(&b->nll));
    printf("Cor(ln(PPL(Q)), ln(PPL(base))): %6.2f%%\n", 100 * kl_cor(k, &q->nll, &b->nll));
    printf("Mean ln(PPL(Q)/PPL(base))     : %10.6f +/- %10.6f\n", k->diff.mean, mom_err(&k->diff));
    printf("Mean PPL(Q)/PPL(base)         : %10.6f +/- %10.6f\n", ratio, ratio * mom_err(&k->diff));
    printf("\n====== KL divergence statistics ======\n");
    printf("Mean    KLD: %10.6f +/- %10.6f\n", k->kl.mean, mom_err(&k->kl));
    printf("Maximum KLD: %10.6f\n", k->kld[k->n - 1]);
    for (size_t i = 0; i < sizeof kl_quantiles / sizeof *kl_quantiles; i++)
        printf("%-7s KLD: %10.6f\n", kl_quantile_names[i], quantile(k->kld, k->n, kl_quantiles[i]));
    printf("Minimum KLD: %10.6f\n", k->kld[0]);
    printf("\n====== Token probability statistics ======\n");
    printf("Mean    dp: %8.3f +/- %6.3f %%\n", 100 * k->dp.mean, 100 * mom_err(&k->dp));
    printf("RMS     dp: %8.3f %%\n", 100 * mom_rms(&k->dp));
    printf("Same top p: %8.3f +/- %6.3f %%\n", 100 * k->same.mean, 100 * mom_err(&k->same));
}

static void json_model(cJSON *o, const scored_model *sm, double tokens) {
    const double ppl = exp(sm->nll.mean);
    cJSON_AddStringToObject(o, "model", sm->path);
    cJSON_AddStringToObject(o, "engine", nv_engine_name(sm->engine));
    cJSON_AddNumberToObject(o, "ppl", ppl);
    cJSON_AddNumberToObject(o, "ppl_err", ppl * mom_err(&sm->nll));
    cJSON_AddNumberToObject(o, "nll", sm->nll.mean);
    cJSON_AddNumberToObject(o, "seconds", sm->seconds);
    cJSON_AddNumberToObject(o, "tokens_per_s", sm->seconds > 0 ? tokens / sm->seconds : 0);
}

static int print_json(const scored_model *q, const scored_model *b, const kl_stats *k, int ctx, int chunks, int threads) {
    cJSON *o = cJSON_CreateObject();
    json_model(o, q, (double)chunks * ctx);
    cJSON_AddNumberToObject(o, "ctx", ctx);
    cJSON_AddNumberToObject(o, "chunks", chunks);
    cJSON_AddNumberToObject(o, "scored", (double)q->nll.n);
    cJSON_AddNumberToObject(o, "threads", threads);
    if (b) {
        cJSON *base = cJSON_AddObjectToObject(o, "base");
        json_model(base, b, (double)chunks * ctx);
        cJSON_AddNumberToObject(o, "ln_ppl_ratio", k->diff.mean);
        cJSON_AddNumberToObject(o, "ln_ppl_ratio_err", mom_err(&k->diff));
        cJSON_AddNumberToObject(o, "ppl_cor", kl_cor(k, &q->nll, &b->nll));
        cJSON *kl = cJSON_AddObjectToObject(o, "kld");
        cJSON_AddNumberToObject(kl, "mean", k->kl.mean);
        cJSON_AddNumberToObject(kl, "err", mom_err(&k->kl));
        cJSON_AddNumberToObject(kl, "max", k->kld[k->n - 1]);
        for (size_t i = 0; i < sizeof kl_quantiles / sizeof *kl_quantiles; i++)
            cJSON_AddNumberToObject(kl, kl_quantile_keys[i], quantile(k->kld, k->n, kl_quantiles[i]));
        cJSON_AddNumberToObject(kl, "min", k->kld[0]);
        cJSON *dp = cJSON_AddObjectToObject(o, "delta_p");
        cJSON_AddNumberToObject(dp, "mean", k->dp.mean);
        cJSON_AddNumberToObject(dp, "err", mom_err(&k->dp));
        cJSON_AddNumberToObject(dp, "rms", mom_rms(&k->dp));
        cJSON_AddNumberToObject(o, "same_top", k->same.mean);
        cJSON_AddNumberToObject(o, "same_top_err", mom_err(&k->same));
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s) return cli_error(CMD, 1, "out of memory");
    printf("%s\n", s);
    free(s);
    return 0;
}

static void choice_progress(const nv_choice_result *r, int done, int total) {
    if (done % 100 && done != total) return;
    fprintf(stderr, "[%d] %.2f%%%s", done, r->tasks ? 100.0 * r->right_mean / r->tasks : 0.0, done == total ? "\n" : ", ");
    fflush(stderr);
}

/* The standard error of an accuracy over n tasks, in percent. */
static double acc_err(int right, int n) {
    const double p = n ? (double)right / n : 0;
    return n > 1 ? 100.0 * sqrt(p * (1 - p) / (n - 1)) : 0.0;
}

static int multiple_choice(const char *model_path, const char *tok_path, const cli_loras *loras, const char *engine_name,
                           int threads, const char *choice_path, int max_tasks, int json) {
    cli_paths paths;
    cli_model_paths(&model_path, &tok_path, &paths);
    nv_engine_id engine;
    const int erc = cli_engine(CMD, engine_name, threads, CLI_ENGINE_FP32, &engine);
    if (erc) return erc;
    nv_choice_set set = {0};
    if (nv_choice_load(choice_path, &set) != NV_OK) return cli_error(CMD, 1, "%s", nv_errmsg());
    scored_model q = {0};
    nv_tokenizer *tok = NULL;
    nv_choice_result r;
    int rc = 1;
    if (scored_open(&q, model_path, loras, engine) != NV_OK ||
        nv_tokenizer_load_for_model(tok_path, q.m.config.vocab_size, &tok) != NV_OK) {
        cli_error(CMD, 1, "%s", nv_errmsg());
        goto done;
    }
    const int total = max_tasks && max_tasks < set.n ? max_tasks : set.n;
    fprintf(stderr, "nerve perplexity: %s on %s: %d multiple-choice task%s of %s; accuracy a token so far:\n", model_path,
            nv_engine_name(engine), total, total == 1 ? "" : "s", choice_path);
    if (nv_choice_score(&q.m, tok, &set, max_tasks, &r, choice_progress) != NV_OK) {
        cli_error(CMD, 1, "%s", nv_errmsg());
        goto done;
    }
    if (!r.tasks) {
        cli_error(CMD, 1, "none of the %d tasks could be scored: each has a choice longer than the model's context of %d "
                          "tokens, or one with no token of its own", total, q.m.config.seq_len);
        goto done;
    }
    const double acc = 100.0 * r.right_sum / r.tasks, acc_norm = 100.0 * r.right_mean / r.tasks;
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "model", model_path);
        cJSON_AddStringToObject(o, "engine", nv_engine_name(engine));
        cJSON_AddStringToObject(o, "file", choice_path);
        cJSON_AddNumberToObject(o, "tasks", r.tasks);
        cJSON_AddNumberToObject(o, "skipped", r.skipped);
        cJSON_AddNumberToObject(o, "acc", acc);
        cJSON_AddNumberToObject(o, "acc_err", acc_err(r.right_sum, r.tasks));
        cJSON_AddNumberToObject(o, "acc_norm", acc_norm);
        cJSON_AddNumberToObject(o, "acc_norm_err", acc_err(r.right_mean, r.tasks));
        cJSON_AddNumberToObject(o, "tokens_per_s", r.seconds > 0 ? r.tokens / r.seconds : 0);
        char *s = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (!s) {
            cli_error(CMD, 1, "out of memory");
            goto done;
        }
        printf("%s\n", s);
        free(s);
    } else {
        printf("tasks     %d (%d skipped: a choice past the context, or with no token of its own)\n", r.tasks, r.skipped);
        printf("acc       %.2f%% +- %.2f (the best summed log-probability)\n", acc, acc_err(r.right_sum, r.tasks));
        printf("acc_norm  %.2f%% +- %.2f (the best log-probability a token, llama.cpp's HellaSwag score)\n", acc_norm,
               acc_err(r.right_mean, r.tasks));
    }
    fprintf(stderr, "nerve perplexity: %.1f tokens/s, %.1f s\n", r.seconds > 0 ? r.tokens / r.seconds : 0.0, r.seconds);
    rc = 0;
done:
    scored_free(&q);
    if (tok) nv_tokenizer_free(tok);
    nv_choice_free(&set);
    return rc;
}

/* Chat data (.jsonl: conversations, or prompt/completion lines) scored as training validates it:
   each turn rendered with the template and run from its start, the answers' tokens alone scored
   (their -log p given everything before them in the turn); with val_frac, the held-out turns only. */
static int chat_score(const char *model_path, const char *tok_path, const cli_loras *loras, nv_engine_id engine,
                      const char *const *files, int n_files, float val_frac, nv_chat_template tmpl, const nv_jinja *jinja, int threads,
                      int json) {
    scored_model q = {0};
    nv_tokenizer *tok = NULL;
    nv_dataset ds = {0};
    int *tokens = NULL, rc = 1;
    if (scored_open(&q, model_path, loras, engine) != NV_OK) return cli_error(CMD, 1, "%s", nv_errmsg());
    const nv_config c = q.m.config;
    if (nv_tokenizer_load_for_model(tok_path, c.vocab_size, &tok) != NV_OK ||
        nv_dataset_open_jinja(&ds, files, n_files, tok, c.vocab_size, val_frac, tmpl, jinja) != NV_OK || scored_ready(&q, c.seq_len) != NV_OK) {
        cli_error(CMD, 1, "%s", nv_errmsg());
        goto done;
    }
    if (ds.pref) {
        cli_error(CMD, 1, "preference pairs are not scored here (a turn of each answer would count both)");
        goto done;
    }
    if (!(tokens = malloc((size_t)c.seq_len * sizeof *tokens))) {
        cli_error(CMD, 1, "out of memory");
        goto done;
    }
    const int V = c.vocab_size;
    uint64_t turns = 0, skipped = 0;
    for (int i = 0; i < ds.n_src; i++) {
        const nv_source *s = &ds.src[i];
        for (uint64_t t = val_frac > 0 ? s->n_train_starts : 0; s->starts && t < s->n_starts; t++) {
            const uint64_t from = s->starts[t], len = s->starts[t + 1] - from;
            if (len > (uint64_t)c.seq_len) { /* past the model's context: no whole answer to score */
                skipped++;
                continue;
            }
            for (uint64_t j = 0; j < len; j++) tokens[j] = (int)nv_source_token(s, from + j);
            for (int start = 0; start < (int)len; start += ROWS) {
                const int n = (int)len - start < ROWS ? (int)len - start : ROWS;
                int rows = 0;
                if (chunk_pass(&q, tokens, start, n, start, 0, &rows) != NV_OK) {
                    cli_error(CMD, 1, "%s", nv_errmsg());
                    goto done;
                }
                for (int r = 0; r < rows; r++) { /* position start + r predicts the token after it */
                    const int p = start + r;
                    if (p + 1 >= (int)len || !s->trained[from + (uint64_t)p + 1]) continue;
                    const float *l = q.s.logits + (size_t)r * V;
                    mom_add(&q.nll, nv_logits_logz(l, V) - l[tokens[p + 1]]);
                }
            }
            turns++;
        }
    }
    if (!q.nll.n) {
        cli_error(CMD, 1, "no answer token to score (%llu turns longer than the model's context of %d)", (unsigned long long)skipped,
                  c.seq_len);
        goto done;
    }
    if (!isfinite(q.nll.mean)) {
        cli_error(CMD, 1, "the log-likelihood is not finite: the model gives logits that are not numbers");
        goto done;
    }
    fprintf(stderr, "nerve perplexity: %llu answers, %llu answer tokens scored", (unsigned long long)turns, (unsigned long long)q.nll.n);
    if (ds.templated) fprintf(stderr, ", rendered with the %s template", jinja ? "jinja" : nv_chat_template_name(tmpl));
    if (skipped) fprintf(stderr, "; %llu longer than the context of %d left out", (unsigned long long)skipped, c.seq_len);
    fprintf(stderr, "\n");
    if (json) {
        cJSON *o = cJSON_CreateObject();
        json_model(o, &q, (double)q.nll.n);
        cJSON_AddNumberToObject(o, "answers", (double)turns);
        cJSON_AddNumberToObject(o, "scored", (double)q.nll.n);
        cJSON_AddNumberToObject(o, "skipped", (double)skipped);
        cJSON_AddNumberToObject(o, "threads", threads);
        char *text = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (!text) {
            cli_error(CMD, 1, "out of memory");
            goto done;
        }
        printf("%s\n", text);
        free(text);
    } else {
        print_text(&q, NULL, NULL);
    }
    rc = 0;
done:
    free(tokens);
    nv_dataset_close(&ds);
    if (tok) nv_tokenizer_free(tok);
    scored_free(&q);
    return rc;
}

/* nerve perplexity, or with imatrix_mode nerve imatrix (-o FILE; text chunks only). */
static int perplexity_main(int argc, char **argv, int imatrix_mode) {
    const char *model_path = NULL, *tok_path = NULL, *engine_name = NULL, *base_path = NULL, *base_engine_name = NULL;
    const char *imatrix_out = "imatrix.gguf", *cmd = imatrix_mode ? "imatrix" : CMD; /* errors name the command run */
    const char *files[MAX_FILES], *in_files[MAX_FILES];
    const char *choice_path = NULL, *template_name = NULL;
    int n_files = 0, n_in = 0, ctx = 0, max_chunks = 0, threads = 0, json = 0, max_tasks = 0, run_jinja = -1;
    const char *template_file = NULL;
    float val_frac = 0;
    cli_loras loras = {0};
    cli_hub_ref hub = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            (imatrix_mode ? imatrix_usage : usage)(stdout);
            return 0;
        }
        if (!strcmp(a, "--json") && !imatrix_mode) {
            json = 1;
            continue;
        }
        if (!imatrix_mode && cli_jinja_flag(a, &run_jinja)) continue;
        const int lf = cli_lora_flag(cmd, argc, argv, &i, &loras);
        if (lf < 0) return 2;
        if (lf) continue;
        const int hf = cli_hub_flag(cmd, argc, argv, &i, &hub);
        if (hf < 0) return 2;
        if (hf) continue;
        if (!(v = cli_value(cmd, argc, argv, &i))) return 2;
        if (!strcmp(a, "-m")) model_path = v;
        else if (!strcmp(a, "-z")) tok_path = v;
        else if (!strcmp(a, "-o") && imatrix_mode) imatrix_out = v;
        else if (!strcmp(a, "--in-file") && imatrix_mode) {
            if (n_in == MAX_FILES) return cli_error(cmd, 2, "at most %d --in-file files", MAX_FILES);
            in_files[n_in++] = v;
        }
        else if (!strcmp(a, "-f") || !strcmp(a, "--data")) {
            if (n_files == MAX_FILES) return cli_error(cmd, 2, "at most %d files", MAX_FILES);
            files[n_files++] = v;
        } else if (!strcmp(a, "--ctx") || !strcmp(a, "-c")) { if (!cli_int(cmd, a, v, 4, 1 << 20, &ctx)) return 2; }
        else if (!strcmp(a, "--chunks")) { if (!cli_int(cmd, a, v, 1, 1 << 30, &max_chunks)) return 2; }
        else if (!strcmp(a, "--val-frac")) {
            if (!cli_float(cmd, a, v, 0, 0.99, &val_frac)) return 2;
        } else if (!strcmp(a, "--engine")) engine_name = v;
        else if (!strcmp(a, "--kl-base")) base_path = v;
        else if (!strcmp(a, "--multiple-choice")) choice_path = v;
        else if (!strcmp(a, "--tasks")) { if (!cli_int(cmd, a, v, 1, 1 << 30, &max_tasks)) return 2; }
        else if (!strcmp(a, "--kl-base-engine")) base_engine_name = v;
        else if (!strcmp(a, "--chat-template")) template_name = v;
        else if (!strcmp(a, "--chat-template-file") && !imatrix_mode) template_file = v;
        else if (!strcmp(a, "--threads")) { if (!cli_int(cmd, a, v, 1, 1024, &threads)) return 2; }
        else return cli_error(cmd, 2, "unknown option '%s' (see nerve %s --help)", a, cmd);
    }
    if (imatrix_mode && !model_path && n_in) { /* importance matrices combined, no model run */
        if (n_files || ctx || max_chunks || val_frac > 0 || engine_name || threads || loras.n)
            return cli_error(cmd, 2, "without -m the --in-file files are combined alone: -f, --ctx, --chunks, --val-frac, "
                                     "--engine, --threads and --lora need the model");
        return imatrix_combine(cmd, in_files, n_in, imatrix_out);
    }
    if (!model_path && !hub.repo) return cli_error(cmd, 2, "-m MODEL (or -hf USER/NAME) is required (see nerve %s --help)", cmd);
    if (imatrix_mode && (base_path || base_engine_name || choice_path || max_tasks || template_name))
        return cli_error(cmd, 2, "--kl-base, --multiple-choice, --tasks and --chat-template are nerve perplexity's");
    if (base_engine_name && !base_path) return cli_error(cmd, 2, "--kl-base-engine needs --kl-base MODEL");
    if (max_tasks && !choice_path) return cli_error(cmd, 2, "--tasks goes with --multiple-choice FILE");
    if (choice_path && (n_files || ctx || max_chunks || val_frac > 0 || base_path))
        return cli_error(cmd, 2, "--multiple-choice scores its own tasks: -f, --ctx, --chunks, --val-frac and --kl-base "
                                 "do not go with it");
    char hub_path[4400];
    const int hub_rc = cli_hub_fetch(cmd, &hub, &model_path, hub_path, sizeof hub_path);
    if (hub_rc) return hub_rc;
    if (choice_path) return multiple_choice(model_path, tok_path, &loras, engine_name, threads, choice_path, max_tasks, json);
    char default_text[4096];
    if (!n_files) {
        if (!nv_data_path("corpus/tinystories_valid_head.txt", default_text, sizeof default_text))
            return cli_error(cmd, 2, "no text to score: give -f FILE (the default, corpus/tinystories_valid_head.txt in the shared data, is not there)");
        files[n_files++] = default_text;
    }
    int chat_files = 0;
    for (int i = 0; i < n_files; i++) chat_files += nv_data_jsonl_is_turns(files[i]);
    if (chat_files && chat_files != n_files)
        return cli_error(cmd, 2, "chat data (.jsonl) is scored by its answers, text by chunks: give one kind or the other");
    if (chat_files && imatrix_mode) return cli_error(cmd, 2, "an importance matrix is collected on text, not chat data (.jsonl)");
    if (chat_files && (ctx || max_chunks || base_path))
        return cli_error(cmd, 2, "chat data is scored a turn at a time: --ctx, --chunks and --kl-base do not go with it");
    if ((template_name || template_file || run_jinja >= 0) && !chat_files)
        return cli_error(cmd, 2, "%s goes with chat data (.jsonl)", template_name ? "--chat-template" : template_file ? "--chat-template-file" : run_jinja ? "--jinja" : "--no-jinja");
    nv_chat_template tmpl = NV_CHAT_CHATML; /* as nerve train's default */
    const int trc = cli_template_flags(cmd, template_name, template_file, &tmpl);
    if (trc) return trc;
    cli_paths paths, base_paths;
    cli_model_paths(&model_path, &tok_path, &paths);
    nv_engine_id engine, base_engine = NV_ENGINE_SCALAR;
    int erc = cli_engine(cmd, engine_name, threads, CLI_ENGINE_FP32, &engine);
    if (erc) return erc;
    if (chat_files) { /* the model's own template, as train renders it (run as Jinja when nerve has no renderer of it) */
        nv_jinja *jinja = NULL;
        int rc = cli_chat_template(cmd, model_path, template_name, template_file, run_jinja, &tmpl, &jinja, NULL);
        if (!rc)
            rc = chat_score(model_path, tok_path, &loras, engine, files, n_files, val_frac, tmpl, jinja, threads ? threads : nv_cpu_probe()->cores,
                            json);
        nv_jinja_free(jinja);
        return rc;
    }
    if (base_path) {
        const char *unused_tok = "";
        cli_model_paths(&base_path, &unused_tok, &base_paths);
        if ((erc = cli_engine(cmd, base_engine_name, threads, CLI_ENGINE_FP32, &base_engine))) return erc;
    }

    scored_model q = {0}, b = {0};
    nv_tokenizer *tok = NULL;
    nv_dataset ds = {0};
    kl_stats k = {0};
    nv_imatrix im = {0};
    int *tokens = NULL, rc = 1;
    if (scored_open(&q, model_path, &loras, engine) != NV_OK ||
        (base_path && scored_open(&b, base_path, NULL, base_engine) != NV_OK) ||
        (imatrix_mode && nv_imatrix_collect(&im, &q.m) != NV_OK)) {
        cli_error(cmd, 1, "%s", nv_errmsg());
        scored_free(&q);
        return 1;
    }
    const nv_config c = q.m.config;
    if (!ctx) ctx = c.seq_len < DEFAULT_CTX ? c.seq_len : DEFAULT_CTX;
    if (nv_tokenizer_load_for_model(tok_path, c.vocab_size, &tok) != NV_OK ||
        nv_dataset_open(&ds, files, n_files, tok, c.vocab_size, val_frac) != NV_OK) {
        cli_error(cmd, 1, "%s", nv_errmsg());
        goto done;
    }
    stream st = {&ds, val_frac, 0};
    for (int i = 0; i < ds.n_src; i++) st.total += ds.src[i].n_tokens - src_lo(&st, &ds.src[i]);
    if (st.total < (uint64_t)ctx) {
        cli_error(cmd, 1, "%llu tokens to score%s: a chunk needs %d (give more text or a smaller --ctx)",
                  (unsigned long long)st.total, val_frac > 0 ? " in the held-out part" : "", ctx);
        goto done;
    }
    uint64_t chunks64 = st.total / (uint64_t)ctx;
    if (max_chunks && chunks64 > (uint64_t)max_chunks) chunks64 = (uint64_t)max_chunks;
    const int chunks = chunks64 > (1u << 30) ? 1 << 30 : (int)chunks64;
    if (scored_ready(&q, ctx) != NV_OK || (base_path && scored_ready(&b, ctx) != NV_OK)) {
        cli_error(cmd, 1, "%s", nv_errmsg());
        goto done;
    }
    if (base_path && b.m.config.vocab_size != c.vocab_size) {
        cli_error(cmd, 1, "--kl-base %s has a vocabulary of %d tokens, %s one of %d: they do not predict the same tokens",
                  base_path, b.m.config.vocab_size, model_path, c.vocab_size);
        goto done;
    }
    if (!(tokens = malloc((size_t)ctx * sizeof *tokens))) {
        cli_error(cmd, 1, "out of memory");
        goto done;
    }
    const int first = ctx / 2, V = c.vocab_size, bos = nv_tokenizer_bos(tok);
    const int pool_threads = threads ? threads : nv_cpu_probe()->cores;
    fprintf(stderr, "nerve perplexity: %s on %s, %d thread%s: %d chunk%s of %d tokens, the last %d predictions of each scored\n",
            model_path, nv_engine_name(engine), pool_threads, pool_threads == 1 ? "" : "s", chunks, chunks == 1 ? "" : "s",
            ctx, ctx - 1 - first);
    const double t_start = nv_now();
    for (int ch = 0; ch < chunks; ch++) {
        stream_read(&st, (uint64_t)ch * ctx, ctx, tokens);
        if (bos >= 0 && nv_tokenizer_adds_bos(tok)) tokens[0] = bos; /* as llama.cpp: every chunk starts a sequence */
        for (int start = 0; start < ctx; start += ROWS) {
            const int n = ctx - start < ROWS ? ctx - start : ROWS;
            int rows = 0, base_rows = 0;
            if (chunk_pass(&q, tokens, start, n, first, imatrix_mode, &rows) != NV_OK ||
                (base_path && chunk_pass(&b, tokens, start, n, first, 0, &base_rows) != NV_OK)) {
                cli_error(cmd, 1, "%s", nv_errmsg());
                goto done;
            }
            /* row r is position start + n - rows + r, predicting the token after it; the last
               position's successor is outside the chunk */
            for (int r = 0; r < rows; r++) {
                const int p = start + n - rows + r;
                if (p >= ctx - 1) break;
                if (p < first) continue; /* run for the importance matrix alone */
                const float *lq = q.s.logits + (size_t)r * V;
                if (!base_path) {
                    mom_add(&q.nll, nv_logits_logz(lq, V) - lq[tokens[p + 1]]);
                    continue;
                }
                if (kl_add(&k, &q.nll, &b.nll, lq, b.s.logits + (size_t)r * V, V, tokens[p + 1]) != NV_OK) {
                    cli_error(cmd, 1, "%s", nv_errmsg());
                    goto done;
                }
            }
        }
        if (ch == 0 && chunks > 1) {
            const double per = nv_now() - t_start;
            fprintf(stderr, "nerve perplexity: %.2f s a chunk, about %.0f s for all %d\n", per, per * chunks, chunks);
        }
        fprintf(stderr, "[%d]%.4f%s", ch + 1, exp(q.nll.mean), ch + 1 == chunks ? "\n" : ",");
        fflush(stderr);
    }
    if (!isfinite(q.nll.mean) || (base_path && !isfinite(b.nll.mean))) {
        cli_error(cmd, 1, "the log-likelihood is not finite: a model gives logits that are not numbers");
        goto done;
    }
    if (base_path) qsort(k.kld, k.n, sizeof *k.kld, cmp_double);
    if (json) rc = print_json(&q, base_path ? &b : NULL, &k, ctx, chunks, pool_threads);
    else {
        print_text(&q, base_path ? &b : NULL, &k);
        rc = 0;
    }
    fprintf(stderr, "nerve perplexity: %.1f tokens/s%s\n", q.seconds > 0 ? (double)chunks * ctx / q.seconds : 0.0,
            base_path ? " (the model's forward passes; the reference's apart)" : "");
    if (imatrix_mode) {
        nv_imatrix_stop(&q.m);
        im.chunks = chunks, im.chunk_size = ctx;
        for (int i = 0; i < n_files && rc == 0; i++)
            if (nv_imatrix_add_dataset(&im, files[i], strlen(files[i])) != NV_OK) rc = cli_error(cmd, 1, "%s", nv_errmsg());
        if (rc == 0) rc = imatrix_add_files(cmd, &im, in_files, n_in);
        if (rc == 0 && nv_imatrix_save(&im, imatrix_out) != NV_OK) rc = cli_error(cmd, 1, "%s", nv_errmsg());
        if (rc == 0) imatrix_wrote(imatrix_out, &im);
    }
done:
    nv_imatrix_stop(&q.m);
    nv_imatrix_free(&im);
    free(tokens);
    free(k.kld);
    scored_free(&q);
    scored_free(&b);
    nv_dataset_close(&ds);
    if (tok) nv_tokenizer_free(tok);
    return rc;
}

int cmd_perplexity(int argc, char **argv) { return perplexity_main(argc, argv, 0); }
int cmd_imatrix(int argc, char **argv) { return perplexity_main(argc, argv, 1); }
