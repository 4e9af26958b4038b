#include "train/train.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/cpu.h"
#include "base/file.h"
#include "base/hash.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/pool.h"
#include "base/timer.h"
#include "engine/peak.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "model/hf.h"
#include "model/sampler.h"
#include "train/ckpt.h"
#include "train/dist.h"
#include "train/tmodel.h"

volatile int nv_train_stop_requested;

/* What the model writes now: after BOS and the prompt, up to o->sample_tokens tokens sampled as
 * `nerve generate` does by default (temperature 1, top-p 0.9; seeded by the run's seed and the
 * step), through its training plans with a KV cache of its own. Neither the weights nor the data
 * cursor are touched, so a run with samples trains exactly as one without. */
static void write_sample(const nv_train_opts *o, nv_model *m, long step, FILE *out, int quiet) {
    const nv_tokenizer *tok = o->tokenizer;
    const nv_config *c = &m->config;
    int *ids = NULL, n = 0;
    nv_state st = {0};
    nv_sampler smp = {0};
    nv_buf text = {0};
    nv_err e = nv_tokenizer_encode(tok, o->sample_prompt ? o->sample_prompt : "", 1, 0, &ids, &n);
    if (e == NV_OK && n == 0) e = nv_fail(NV_EINVAL, "an empty prompt and a vocabulary without BOS: give --sample-prompt");
    const int total = n + o->sample_tokens < c->seq_len ? n + o->sample_tokens : c->seq_len;
    if (e == NV_OK && n >= total) e = nv_fail(NV_EINVAL, "the sample's prompt fills the model's context");
    if (e == NV_OK) e = nv_state_init(&st, c, 64, total, 0);
    if (e == NV_OK) e = nv_sampler_init(&smp, c->vocab_size, 1.0f, 0.9f, o->seed * 0x9E3779B97F4A7C15ull + (uint64_t)step + 1);
    for (int pos = 0; e == NV_OK && pos < n; pos += 64) e = nv_forward(m, &st, ids + pos, n - pos < 64 ? n - pos : 64, pos);
    if (o->sample_prompt) nv_buf_puts(&text, o->sample_prompt);
    for (int pos = n, prev = ids ? ids[n - 1] : 0; e == NV_OK && pos < total; pos++) {
        const int next = nv_sample(&smp, st.logits);
        if (nv_tokenizer_ends_text(tok, next)) break; /* where generate stops */
        const char *piece = nv_tokenizer_decode(tok, prev, next);
        if (nv_tokenizer_piece_shown(tok, piece)) nv_buf_puts(&text, piece);
        prev = next;
        if (pos + 1 < total) e = nv_forward(m, &st, &next, 1, pos);
    }
    if (e != NV_OK) nv_warn("step %ld: no sample: %s", step, nv_errmsg());
    else if (!text.oom) {
        const char *s = text.data ? text.data : "";
        fprintf(out, "step %ld:\n%s\n\n", step, s);
        fflush(out);
        if (!quiet) fprintf(stderr, "sample at step %ld: %s\n", step, s);
    }
    nv_buf_free(&text);
    nv_sampler_free(&smp);
    nv_state_free(&st);
    free(ids);
}

static void on_stop_signal(int sig) {
    (void)sig;
    nv_train_stop_requested = 1;
}

void nv_train_defaults(nv_train_opts *o) {
    memset(o, 0, sizeof *o);
    o->batch = 8;
    o->seq = 256;
    o->accum = 1;
    o->steps = 1000;
    o->seed = 1337;
    nv_adamw_defaults(&o->adamw);
    o->adamw.lr = 5e-4f;
    o->adamw.warmup_steps = 100;
    o->eval_every = 100;
    o->sample_tokens = 64;
    o->eval_batches = 8;
    o->ckpt_every = 500;
    o->out_dir = "runs/train";
    o->engine = NV_ENGINE_SCALAR;
    o->pref = (nv_pref_opts){.kind = NV_PREF_DPO, .gamma = 0.5f};
    o->router_aux_coef = 0.01f; /* Switch Transformer's */
    o->distill_alpha = 0.5f;
    o->distill_temp = 1.0f;
}

typedef struct {
    int n, cap;
    float *step, *loss;
} series;

static void series_add(series *s, float step, float loss) {
    if (s->n == s->cap) {
        int nc = s->cap ? s->cap * 2 : 256;
        float *a = realloc(s->step, (size_t)nc * sizeof(float)), *b = NULL;
        if (a) s->step = a;
        b = realloc(s->loss, (size_t)nc * sizeof(float));
        if (b) s->loss = b;
        if (!a || !b) return;
        s->cap = nc;
    }
    s->step[s->n] = step;
    s->loss[s->n] = loss;
    s->n++;
}

/* A self-contained SVG of the training and validation loss against the step, written whole (the
   one before stays when it cannot be). */
static void write_svg(const char *path, const series *tr, const series *va, int total_steps) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return;
    const double W = 800, H = 420, L = 60, R = 20, T = 30, B = 50;
    double lo = INFINITY, hi = -INFINITY;
    const series *all[2] = {tr, va};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < all[k]->n; i++) {
            if (all[k]->loss[i] < lo) lo = all[k]->loss[i];
            if (all[k]->loss[i] > hi) hi = all[k]->loss[i];
        }
    if (!(hi > lo)) lo = 0, hi = lo + 1;
    double pad = (hi - lo) * 0.05;
    lo -= pad, hi += pad;
    double xs = (W - L - R) / (total_steps > 0 ? total_steps : 1), ys = (H - T - B) / (hi - lo);
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%.0f\" y=\"18\" font-size=\"14\">nerve train: loss</text>\n", L);
    for (int i = 0; i <= 5; i++) {
        double v = lo + (hi - lo) * i / 5, y = H - B - (v - lo) * ys;
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, y, W - R, y);
        fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n", L - 6, y + 4, v);
    }
    for (int i = 0; i <= 4; i++) {
        double s = (double)total_steps * i / 4, x = L + s * xs;
        fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%.0f</text>\n", x, H - B + 18, s);
    }
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">step</text>\n", (W + L) / 2, H - 12);
    const char *colors[2] = {"#1f77b4", "#ff7f0e"}, *names[2] = {"train", "validation"};
    for (int k = 0; k < 2; k++) {
        if (!all[k]->n) continue;
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", colors[k]);
        for (int i = 0; i < all[k]->n; i++)
            fprintf(f, "%.1f,%.1f ", L + all[k]->step[i] * xs, H - B - (all[k]->loss[i] - lo) * ys);
        fprintf(f, "\"/>\n");
        fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" fill=\"%s\">%s</text>\n", W - R - 90, T + 16.0 * k, colors[k], names[k]);
    }
    fprintf(f, "</svg>\n");
    if (fclose(f) == 0 && nv_file_write_atomic(path, &(nv_iov){text, len}, 1) != NV_OK) nv_warn("loss curve not written: %s", nv_errmsg());
    free(text);
}

/* Keeps the metrics lines of steps <= last_step (a resumed run rewrites what came after) and
 * reloads them into the loss series. */
static void metrics_restore(const char *path, long last_step, series *tr, series *va) {
    char *text = NULL;
    size_t len = 0, kept = 0;
    if (nv_file_read_all(path, &text, &len) != NV_OK) return;
    /* the lines kept are moved down in place (a line never moves past where it was read), then
       written whole: a run killed meanwhile finds the file as it was, not cut short */
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (!next) break; /* a line the run was killed while writing */
        *next++ = '\0';
        long step = 0;
        float loss = 0, val = 0;
        const char *p = strstr(line, "\"step\":");
        if (!p || sscanf(p, "\"step\":%ld", &step) != 1 || step > last_step) continue;
        if ((p = strstr(line, "\"loss\":")) && sscanf(p, "\"loss\":%f", &loss) == 1) series_add(tr, (float)step, loss);
        if ((p = strstr(line, "\"val_loss\":")) && sscanf(p, "\"val_loss\":%f", &val) == 1) series_add(va, (float)step, val);
        const size_t n = strlen(line);
        memmove(text + kept, line, n);
        kept += n;
        text[kept++] = '\n';
    }
    if (kept != len && nv_file_write_atomic(path, &(nv_iov){text, kept}, 1) != NV_OK)
        nv_warn("training: %s keeps the lines past step %ld: %s", path, last_step, nv_errmsg());
    free(text);
}

/* The length a micro-batch of `windows` chat turns of T (inputs in, targets tg) needs: its furthest
   target's row + 1, rounded up to 16 (at least 16, at most T); its windows' rows moved to that stride
   in place. The rows cut are padding after each turn's end (no target): causal attention keeps them
   out of every row before them, so the turns' losses and gradients are the ones whole windows give,
   but for the order of sums over rows. */
static int trimmed_windows(int *in, int *tg, int windows, int T) {
    int last = 0;
    for (int b = 0; b < windows; b++)
        for (int t = T - 1; t >= last; t--)
            if (tg[(size_t)b * T + t] >= 0) {
                last = t + 1;
                break;
            }
    const int T2 = last < 16 ? 16 : (last + 15) / 16 * 16;
    if (T2 >= T) return T;
    for (int b = 1; b < windows; b++) {
        memmove(in + (size_t)b * T2, in + (size_t)b * T, (size_t)T2 * sizeof *in);
        memmove(tg + (size_t)b * T2, tg + (size_t)b * T, (size_t)T2 * sizeof *tg);
    }
    return T2;
}

/* Before a forward of the job's `windows` windows of T at in/tg (every process's, B = tm->B each):
   with trim, cut after their furthest answer (trimmed_windows); the model set to the length run
   (into *run); where this process's rows start. */
static size_t windows_to_run(nv_tmodel *tm, int *in, int *tg, int windows, int T, int trim, int *run) {
    *run = trim ? trimmed_windows(in, tg, windows, T) : T;
    nv_tmodel_set_length(tm, *run);
    return (size_t)nv_dist_rank() * tm->B * *run;
}

/* The validation loss over `batches` batches of B = tm->B x world windows (every process draws the
   same ones and evaluates its rows), averaged over the job, and the share of its targets the model
   ranks first (token accuracy) in *acc. With batches < 0, every validation window once (the last
   batch's windows past them without targets), the loss a mean over every target. With trim (chat
   turns), each batch runs only as far as its furthest answer, as training's micro-batches do. */
static float eval_val(nv_tmodel *tm, const nv_dataset *ds, int batches, int *in, int *tg, int trim, double *acc) {
    const int world = nv_dist_size(), B = tm->B * world, T = tm->T, full = batches < 0;
    const uint64_t windows = nv_data_val_windows(ds, T), count = full ? (windows + (uint64_t)B - 1) / (uint64_t)B : (uint64_t)batches;
    double sum[3] = {0, 0, 0}; /* the losses (summed over targets: chat data, full), the targets, those ranked first */
    int n = 0;
    nv_tmodel_set_segments(tm, NULL); /* validation windows hold one turn each */
    for (uint64_t i = 0; i < count; i++) {
        if (!nv_data_val_batch(ds, i, B, T, in, tg)) break;
        for (uint64_t b = windows - i * (uint64_t)B; full && b < (uint64_t)B; b++) /* (a wrapped window, seen already) */
            for (int t = 0; t < T; t++) tg[b * T + t] = -1;
        int run;
        const size_t mine = windows_to_run(tm, in, tg, B, T, trim, &run);
        const float l = nv_tmodel_forward(tm, in + mine, tg + mine);
        sum[0] += ds->chat || full ? (double)l * tm->n_targets : l;
        sum[1] += tm->n_targets;
        sum[2] += tm->n_correct;
        n++;
    }
    nv_tmodel_set_length(tm, T);
    nv_dist_sum_f64(sum, 3);
    *acc = sum[1] > 0 ? sum[2] / sum[1] : NAN;
    if (ds->chat || full) return sum[1] > 0 ? (float)(sum[0] / sum[1]) : NAN;
    return n ? (float)(sum[0] / world / n) : NAN;
}

/* Preference training. Rows 2i and 2i + 1 of a batch are pair ids[i]'s preferred and other answer;
   ref[2p], ref[2p + 1] the reference's log-probabilities of pair p's two. */
enum { PREF_LOSS, PREF_CORRECT, PREF_MARGIN, PREF_CHOICE, PREF_PAIRS, PREF_SUMS };

/* A pair's two answers' target counts into n; it counts (1) when both have a target in their
   windows (a prompt can fill one). */
static int pair_targets(const int *tg, int T, int n[2]) {
    n[0] = n[1] = 0;
    for (int t = 0; t < T; t++) n[0] += tg[t] >= 0, n[1] += tg[T + t] >= 0;
    return n[0] > 0 && n[1] > 0;
}

/* The losses of the pairs of tm's last forward (targets tg, its rows) added into sums, with how many
   it prefers rightly by the loss's rewards (PREF_CORRECT) and by its own likelihood a token
   (PREF_CHOICE: what the model would choose); with seq_scale, each sequence's weight for the backward
   of the step's mean loss (1 / step_pairs a pair). */
static void pref_losses(const nv_tmodel *tm, const int *tg, const uint64_t *ids, const double *ref,
                        const nv_pref_opts *po, double step_pairs, float *seq_scale, double sums[PREF_SUMS]) {
    double logp[tm->B];
    nv_tmodel_seq_logp(tm, logp);
    for (int i = 0; i < tm->B / 2; i++) {
        double grad[2] = {0, 0}, margin = 0;
        int n[2];
        const int counts = pair_targets(tg + (size_t)2 * i * tm->T, tm->T, n);
        if (counts) {
            const double r[2] = {ref ? ref[2 * ids[i]] : 0, ref ? ref[2 * ids[i] + 1] : 0};
            sums[PREF_LOSS] += nv_pref_pair(po, logp + 2 * i, n, r, grad, &margin);
            sums[PREF_CORRECT] += margin > 0;
            sums[PREF_MARGIN] += margin;
            sums[PREF_CHOICE] += logp[2 * i] / n[0] > logp[2 * i + 1] / n[1];
            sums[PREF_PAIRS] += 1;
        }
        if (seq_scale) /* the backward's weights are the cross-entropy's: -d loss / d log p */
            for (int k = 0; k < 2; k++) seq_scale[2 * i + k] = (float)(-grad[k] / step_pairs);
    }
}

/* The reference log-probabilities of every pair (training and validation) under the model tm holds
   now, tm->B windows at a time in pair order (the same batches, so the same bits, every time); the
   processes of a job take every world-th batch and add up what they found. */
static nv_err pref_reference(nv_tmodel *tm, const nv_dataset *ds, double **out) {
    const uint64_t pairs = nv_data_pairs(ds), per = (uint64_t)tm->B / 2;
    const size_t bt = (size_t)tm->B * tm->T;
    double *ref = calloc((size_t)(2 * pairs + 1), sizeof(double)), logp[tm->B];
    int *in = malloc(bt * sizeof(int)), *tg = malloc(bt * sizeof(int));
    if (!ref || !in || !tg) {
        free(ref), free(in), free(tg);
        return nv_fail(NV_ENOMEM, "out of memory for the reference log-probabilities of %llu pairs",
                       (unsigned long long)pairs);
    }
    const double t0 = nv_now();
    nv_tmodel_set_segments(tm, NULL);
    const uint64_t rank = (uint64_t)nv_dist_rank(), world = (uint64_t)nv_dist_size();
    for (uint64_t p = rank * per; p < pairs; p += per * world) {
        for (uint64_t i = 0; i < per; i++) nv_data_pair(ds, p + i, tm->T, in + 2 * i * tm->T, tg + 2 * i * tm->T);
        nv_tmodel_forward(tm, in, tg);
        nv_tmodel_seq_logp(tm, logp);
        for (uint64_t i = 0; i < per && p + i < pairs; i++) ref[2 * (p + i)] = logp[2 * i], ref[2 * (p + i) + 1] = logp[2 * i + 1];
    }
    nv_dist_sum_f64(ref, (size_t)(2 * pairs)); /* each pair's from the one process that scored it, zeros elsewhere */
    nv_info("preference data: the starting model's log-probabilities of %llu pairs' answers, the reference, in %.1f s",
            (unsigned long long)pairs, nv_now() - t0);
    free(in), free(tg);
    tm->inputs = tm->targets = NULL; /* they were these buffers */
    *out = ref;
    return NV_OK;
}

/* The validation pairs' mean loss over `batches` batches (every process draws the same and scores its
   rows), and the fractions preferred rightly by the loss's rewards and by the model's likelihood into
   acc[0], acc[1]. */
static float eval_pref(nv_tmodel *tm, const nv_dataset *ds, int batches, int *in, int *tg, uint64_t *ids,
                       const double *ref, const nv_pref_opts *po, double acc[2]) {
    const int world = nv_dist_size();
    const size_t mine = (size_t)nv_dist_rank() * tm->B * tm->T;
    double sums[PREF_SUMS] = {0};
    nv_tmodel_set_segments(tm, NULL);
    for (int i = 0; i < batches; i++) {
        if (!nv_data_val_pairs(ds, i, tm->B * world, tm->T, in, tg, ids)) break;
        nv_tmodel_forward(tm, in + mine, tg + mine);
        pref_losses(tm, tg + mine, ids + mine / (2 * (size_t)tm->T), ref, po, 1, NULL, sums);
    }
    nv_dist_sum_f64(sums, PREF_SUMS);
    acc[0] = sums[PREF_PAIRS] > 0 ? sums[PREF_CORRECT] / sums[PREF_PAIRS] : NAN;
    acc[1] = sums[PREF_PAIRS] > 0 ? sums[PREF_CHOICE] / sums[PREF_PAIRS] : NAN;
    return sums[PREF_PAIRS] > 0 ? (float)(sums[PREF_LOSS] / sums[PREF_PAIRS]) : NAN;
}

/* The multiple-choice tasks' accuracies (acc, acc_norm: the best summed log-probability, the best a
   token) under the model as it stands, on process 0 (the others hold the same weights); NAN without
   tasks, elsewhere, or when none could be scored. */
static void eval_choice(const nv_train_opts *o, const nv_model *m, double acc[2]) {
    acc[0] = acc[1] = NAN;
    if (!o->eval_choice) return;
    nv_choice_result r;
    if (nv_dist_rank() == 0) {
        if (nv_choice_score(m, o->tokenizer, o->eval_choice, o->eval_choice_tasks, &r, NULL) != NV_OK)
            nv_warn("multiple-choice evaluation failed: %s", nv_errmsg());
        else if (r.tasks)
            acc[0] = (double)r.right_sum / r.tasks, acc[1] = (double)r.right_mean / r.tasks;
    }
    /* every process follows them for --best-metric (--early-stop must stop them all at one step) */
    if (nv_dist_size() > 1) nv_dist_bcast(acc, 2 * sizeof *acc);
}

/* A number for metrics.jsonl: JSON has no NaN or infinity, so those are null. */
static void json_num(FILE *f, const char *key, double v) {
    if (isfinite(v)) fprintf(f, ",\"%s\":%.9g", key, v);
    else fprintf(f, ",\"%s\":null", key);
}

/* One evaluation: the validation loss and token accuracy, preference data's accuracies (by the loss's
   rewards, by the model's own choice), the multiple-choice tasks' (acc, acc_norm) and --full-eval's
   loss and token accuracy over the whole validation split; NAN where there are none. */
typedef struct {
    float val;
    double acc, pref[2], mc[2], full[2];
} eval_figures;

#define NO_EVAL ((eval_figures){NAN, NAN, {NAN, NAN}, {NAN, NAN}, {NAN, NAN}})

static eval_figures evaluate(nv_tmodel *tm, const nv_train_opts *o, const nv_dataset *ds, int *in, int *tg, uint64_t *ids,
                             const double *ref, int trim) {
    eval_figures f = NO_EVAL;
    f.val = ds->pref ? eval_pref(tm, ds, o->eval_batches, in, tg, ids, ref, &o->pref, f.pref)
                     : eval_val(tm, ds, o->eval_batches, in, tg, trim, &f.acc);
    eval_choice(o, &tm->m, f.mc);
    return f;
}

/* Its figures into metrics.jsonl's line, those it has. */
static void json_evals(FILE *f, const eval_figures *e) {
    if (!isnan(e->val)) json_num(f, "val_loss", e->val);
    if (!isnan(e->acc)) json_num(f, "val_token_acc", e->acc);
    if (!isnan(e->pref[0])) json_num(f, "val_reward_acc", e->pref[0]), json_num(f, "val_choice_acc", e->pref[1]);
    if (!isnan(e->mc[1])) json_num(f, "mc_acc", e->mc[0]), json_num(f, "mc_acc_norm", e->mc[1]);
    if (!isnan(e->full[0])) json_num(f, "full_val_loss", e->full[0]), json_num(f, "full_val_token_acc", e->full[1]);
}

/* The latest figures of each kind, for the progress line. */
static void keep_evals(eval_figures *last, const eval_figures *e) {
    if (!isnan(e->val)) last->val = e->val, last->acc = e->acc;
    if (!isnan(e->pref[0])) last->pref[0] = e->pref[0], last->pref[1] = e->pref[1];
    if (!isnan(e->mc[1])) last->mc[0] = e->mc[0], last->mc[1] = e->mc[1];
}

static const char *const best_metric_names[NV_BEST_COUNT] = {"val_loss",    "val_reward_acc", "val_choice_acc",
                                                             "mc_acc",      "mc_acc_norm",    "val_token_acc"};
/* as the messages say them */
static const char *const best_metric_words[NV_BEST_COUNT] = {"validation loss",          "held-out reward accuracy",
                                                             "held-out choice accuracy", "multiple-choice accuracy",
                                                             "multiple-choice accuracy (acc_norm)", "held-out token accuracy"};

int nv_best_metric_parse(const char *name) {
    for (int i = 0; i < NV_BEST_COUNT; i++)
        if (!strcmp(name, best_metric_names[i])) return i;
    return -1;
}

/* An evaluation's figure for metric m (NaN when it has none). */
static double best_metric_of(const eval_figures *e, nv_best_metric m) {
    switch (m) {
    case NV_BEST_REWARD_ACC: return e->pref[0];
    case NV_BEST_CHOICE_ACC: return e->pref[1];
    case NV_BEST_MC_ACC: return e->mc[0];
    case NV_BEST_MC_ACC_NORM: return e->mc[1];
    case NV_BEST_TOKEN_ACC: return e->acc;
    default: return e->val;
    }
}

/* The best evaluation so far by --best-metric and where (--save-best, --early-stop; kept in
   checkpoints). */
typedef struct {
    float val; /* the metric's value; NaN: none yet */
    long step;
    int since; /* evaluations after it, none better */
} best_eval;

/* 1 when val (step's) is the best so far (the lowest loss, the highest accuracy), which it becomes;
   else one more evaluation since. */
static int best_eval_note(best_eval *b, float val, long step, nv_best_metric m) {
    if (isnan(val)) return 0;
    if (isnan(b->val) || (m == NV_BEST_VAL_LOSS ? val < b->val : val > b->val)) {
        *b = (best_eval){val, step, 0};
        return 1;
    }
    b->since++;
    return 0;
}

/* Passes over the training data that `windows` drawn windows make, one pass being per_pass of them
   (nv_data_epoch_windows). */
static double epochs_of(uint64_t windows, double per_pass) { return per_pass > 0 ? (double)windows / per_pass : 0.0; }

static void fmt_duration(char *buf, size_t cap, double s) {
    if (s < 0 || !isfinite(s)) snprintf(buf, cap, "?");
    else if (s < 60) snprintf(buf, cap, "%.0fs", s);
    else if (s < 3600) snprintf(buf, cap, "%dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(buf, cap, "%dh%02dm", (int)s / 3600, ((int)s % 3600) / 60);
}

/* The tokenizer into the run folder as tokenizer.bin: copied, or from a GGUF file (a whole model,
 * maybe gigabytes: only its vocabulary is read) the vocabulary in tokenizer.bin's format, or, for a
 * vocabulary that format cannot hold (byte-level, or SentencePiece with special tokens, EOS or a
 * white-space rule of its own), as a vocab-only GGUF file (the loaders know a file by its
 * contents, not its name). */
static nv_err copy_tokenizer(const char *from, const char *to) {
    nv_mapped m;
    NV_TRY(nv_file_map(from, &m));
    uint8_t *conv = NULL;
    size_t len = m.len;
    const void *data = m.data;
    nv_err e = NV_OK;
    if (nv_gguf_is(m.data, m.len)) {
        nv_tokenizer *tok = NULL;
        if ((e = nv_tokenizer_load(from, 0, &tok)) == NV_OK && !nv_tokenizer_llama2c_form(tok)) {
            e = nv_gguf_save_vocab(tok, to);
            nv_tokenizer_free(tok);
            nv_file_unmap(&m);
            return e;
        }
        nv_tokenizer_free(tok);
        if (e == NV_OK) e = nv_gguf_tokenizer_bytes(from, &conv, &len);
        data = conv;
    }
    if (e == NV_OK) {
        nv_iov part = {data, len};
        e = nv_file_write_atomic(to, &part, 1);
    }
    free(conv);
    nv_file_unmap(&m);
    return e;
}

/* The run folder's chat_template file: the template's name on its first line, "packed" on the
 * second when the run packed its windows (--pack). 0 when there is none. */
static int read_chat_template(const char *dir, char *name, size_t cap, int *packed) {
    char path[4200], *text = NULL;
    snprintf(path, sizeof path, "%s%schat_template", dir, *dir ? "/" : "");
    if (!nv_file_exists(path) || nv_file_read_all(path, &text, NULL) != NV_OK) return 0;
    const size_t n = strcspn(text, "\r\n");
    snprintf(name, cap, "%.*s", (int)n, text);
    if (packed) *packed = !strncmp(text + n + strspn(text + n, "\r\n"), "packed", 6);
    free(text);
    return 1;
}

int nv_train_chat_template(const char *dir, char *name, size_t cap) { return read_chat_template(dir, name, cap, NULL); }

char *nv_train_chat_template_jinja(const char *dir) {
    char name[16], path[4200], *text = NULL;
    if (!read_chat_template(dir, name, sizeof name, NULL) || strcmp(name, "jinja") != 0) return NULL;
    snprintf(path, sizeof path, "%s%schat_template.jinja", dir, *dir ? "/" : "");
    if (nv_file_read_all(path, &text, NULL) != NV_OK) return NULL;
    return text;
}

/* What identifies the frozen weights a LoRA run adapts (its checkpoint keeps it; save_merged checks
   the weights it merges into against it). */
static uint64_t base_hash(const nv_train_opts *o) {
    return o->init_params ? nv_hash64(o->init_params, nv_config_param_count(&o->config) * sizeof(float), 7) : 0;
}

/* What a checkpoint records of the model a run starts from: the base's hash, and the adapters'
   start (--lora-init) with it, part of the model a preference loss compares with. */
static uint64_t start_hash(const nv_train_opts *o, uint64_t base) {
    return o->lora_init ? base ^ nv_hash64(o->lora_init, nv_lora_param_count(&o->config, &o->lora) * sizeof(float), 11) : base;
}

/* Refuses to overwrite a run without --resume, and a checkpoint written with other settings. */
static nv_err check_resume(const nv_train_opts *o, int pack, uint64_t bhash, const char *ckpt_path, nv_ckpt *ck) {
    if (!o->resume && nv_file_exists(ckpt_path))
        return nv_fail(NV_EINVAL, "%s already holds a checkpoint: pass --resume to continue it, or choose another --out",
                       o->out_dir);
    if (!o->resume) return NV_OK;
    /* a chat run goes on with the template it learned (the checkpoint's data hash does not see it) */
    char had[33];
    int packed = 0;
    if (o->chat_template && read_chat_template(o->out_dir, had, sizeof had, &packed)) {
        if (!strcmp(had, "jinja")) { /* the same Jinja text, byte for byte */
            char *text = nv_train_chat_template_jinja(o->out_dir);
            const int same = text && o->chat_template_jinja && !strcmp(text, o->chat_template_jinja);
            free(text);
            if (!same)
                return nv_fail(NV_EINVAL, "%s was trained with another chat template, run as Jinja (%s/chat_template.jinja): resume with "
                                          "--chat-template-file %s/chat_template.jinja --jinja",
                               o->out_dir, o->out_dir, o->out_dir);
        } else if (strcmp(had, o->chat_template) != 0)
            return nv_fail(NV_EINVAL, "%s was trained with the %s chat template: resume with --chat-template %s", o->out_dir,
                           had, had);
        /* the windows' makeup is part of where the data stands */
        if (packed != pack)
            return nv_fail(NV_EINVAL, "%s was trained %s --pack: resume %s it", o->out_dir, packed ? "with" : "without",
                           packed ? "with" : "without");
    }
    NV_TRY(nv_ckpt_load(ckpt_path, ck));
    nv_config kc;
    nv_ckpt_header_get_config(&ck->h, &kc);
    if (memcmp(&kc, &o->config, sizeof kc) != 0 || ck->h.batch != o->batch || ck->h.seq != o->seq ||
        ck->h.accum != o->accum || ck->h.seed != o->seed) {
        nv_ckpt_close(ck);
        return nv_fail(NV_EINVAL, "%s was written by a run with other settings: resume with the same model, "
                                  "--batch, --seq, --accum and --seed", ckpt_path);
    }
    const int lora = o->lora.rank > 0;
    if (ck->h.lora_rank != (lora ? o->lora.rank : 0) ||
        (lora && (ck->h.lora_targets != o->lora.targets || ck->h.lora_alpha != o->lora.alpha))) {
        char targets[64] = "";
        if (ck->h.lora_rank)
            nv_fail(NV_EINVAL, "%s holds LoRA adapters of rank %d, alpha %g on %s: resume with the same --lora-rank, "
                               "--lora-alpha and --lora-targets",
                    ckpt_path, (int)ck->h.lora_rank, (double)ck->h.lora_alpha,
                    nv_lora_targets_text(ck->h.lora_targets, targets, sizeof targets));
        else
            nv_fail(NV_EINVAL, "%s holds the training of the whole model: resume without --lora-rank", ckpt_path);
        nv_ckpt_close(ck);
        return NV_EINVAL;
    }
    if ((lora || bhash) && ck->h.base_hash != bhash) {
        nv_ckpt_close(ck);
        return nv_fail(NV_EINVAL, "%s %s other weights than --init-from's%s: resume with the model the run started from",
                       ckpt_path, lora ? "adapts" : "was trained against", o->lora_init ? " with --lora-init's adapters" : "");
    }
    /* its best so far is by its own metric, which this run must follow (a file without a best follows any) */
    if (!isnan(ck->h.best_val_loss) && ck->h.best_metric != (int32_t)o->best_metric) {
        const int32_t was = ck->h.best_metric;
        const long at = (long)ck->h.best_step;
        nv_ckpt_close(ck);
        return nv_fail(NV_EINVAL, "%s kept its best by --best-metric %s (at step %ld): resume with the same", ckpt_path,
                       was >= 0 && was < NV_BEST_COUNT ? best_metric_names[was] : "(unknown)", at);
    }
    return NV_OK;
}

/* What process 0 sends the others at the start: where the run stands. */
typedef struct {
    long step;
    int64_t tokens_seen;
    nv_data_cursor cur;
    best_eval best;
    long budget_steps; /* the length --time-budget decided (0: none yet) */
} run_state;

/* The processes of a job must train the same model on the same data with the same settings, or
   their gradients would be summed into nonsense: each hashes what it was given, and all refuse to
   start unless the hashes agree. (The data are compared by their sizes and the tokens at a few
   places, not read whole.) */
static nv_err agree_on_setup(const nv_train_opts *o, const nv_dataset *ds) {
    uint64_t h = nv_hash64(&o->config, sizeof o->config, 1);
    const long settings[] = {o->batch, o->seq, o->accum, o->steps, o->eval_every, o->eval_batches, o->resume, ds->pack,
                             o->lora.rank, (long)o->lora.targets, ds->pref, o->early_stop, (long)o->best_metric,
                             (long)(o->time_budget_s * 1e3), o->full_eval};
    h = nv_hash64(settings, sizeof settings, h);
    h = nv_hash64(&o->seed, sizeof o->seed, h);
    h = nv_hash64(&o->adamw, sizeof o->adamw, h);
    h = nv_hash64(&o->lora.alpha, sizeof o->lora.alpha, h);
    h = nv_hash64(&o->pref, sizeof o->pref, h);
    if (o->init_params) h = nv_hash64(o->init_params, nv_config_param_count(&o->config) * sizeof(float), h);
    if (o->lora_init) h = nv_hash64(o->lora_init, nv_lora_param_count(&o->config, &o->lora) * sizeof(float), h);
    if (ds->weights) h = nv_hash64(ds->weights, (size_t)ds->n_src * sizeof(double), h);
    if (o->teacher) { /* the teacher's shape and size, and how it is weighed */
        const float kd[2] = {o->distill_alpha, o->distill_temp};
        h = nv_hash64(&o->teacher->config, sizeof o->teacher->config, h);
        h = nv_hash64(&o->teacher->n_params, sizeof o->teacher->n_params, h);
        h = nv_hash64(kd, sizeof kd, h);
    }
    for (int i = 0; i < ds->n_src; i++) {
        const nv_source *s = &ds->src[i];
        uint64_t probe[10] = {s->n_tokens, s->n_train};
        for (int k = 0; k < 8 && s->n_tokens; k++) probe[2 + k] = nv_source_token(s, s->n_tokens / 8 * k);
        h = nv_hash64(probe, sizeof probe, h);
    }
    const long mine = (long)(h >> 1); /* positive: max(h) == -max(-h) when all agree */
    if (nv_dist_max(mine) != -nv_dist_max(-mine))
        return nv_fail(NV_EINVAL, "the %d processes of this job were not given the same model, data and settings: start "
                                  "them all with the same arguments and files", nv_dist_size());
    return NV_OK;
}

static int failed_together;

int nv_train_failed_together(void) { return failed_together; }

/* An error every process of a job reached at the same point (they agreed on it, or it follows from
   what they agreed on): they can all leave cleanly. */
static nv_err together(nv_err e) {
    failed_together = nv_dist_size() > 1;
    return e;
}

/* The run's model files: model.bin, model.gguf. */
static void model_paths(const char *dir, char *bin, char *gguf, size_t cap) {
    snprintf(bin, cap, "%s/model.bin", dir);
    snprintf(gguf, cap, "%s/model.gguf", dir);
}

static void remove_models(const char *dir) {
    char bin[4200], gguf[4200];
    model_paths(dir, bin, gguf, sizeof bin);
    unlink(bin);
    unlink(gguf);
}

/* The run's weights as model.bin (llama2.c v1), or model.gguf for the shapes that format cannot
   hold (QK-norm, other head sizes, RoPE base: GGUF, with the vocabulary and chat template the folder
   holds, as llama.cpp needs); the other kind, an earlier run's, is removed so it is not taken for
   this one; named after the run's folder run_dir. path: the file's name, written or not. */
static nv_err save_model(const nv_model *m, const char *dir, const char *run_dir, char path[4200]) {
    char bin[4200], gguf[4200];
    model_paths(dir, bin, gguf, sizeof bin);
    const int v1 = nv_config_fits_v1(&m->config);
    snprintf(path, 4200, "%s", v1 ? bin : gguf);
    nv_err saved;
    if (v1) {
        saved = nv_model_save_v1(m, bin);
    } else {
        char name[256], tok_path[4200];
        nv_path_name(run_dir, name, sizeof name); /* as `nerve serve` names the run */
        snprintf(tok_path, sizeof tok_path, "%s/tokenizer.bin", dir);
        nv_tokenizer *tok = NULL;
        if (nv_file_exists(tok_path) && nv_tokenizer_load(tok_path, m->config.vocab_size, &tok) != NV_OK) {
            nv_warn("%s is written without a vocabulary (give -z the tokenizer to generate or serve it with): %s does not load: %s", gguf,
                    tok_path, nv_errmsg());
            tok = NULL;
        }
        char tmpl_name[64];
        nv_chat_template tmpl;
        char *own = nv_chat_jinja_marked(nv_train_chat_template_jinja(dir)); /* a chat run's template travels with its model */
        const char *jinja = own ? own
                            : nv_train_chat_template(dir, tmpl_name, sizeof tmpl_name) && nv_chat_template_parse(tmpl_name, &tmpl) == NV_OK
                                ? nv_chat_template_jinja(tmpl)
                                : NULL;
        saved = nv_gguf_save(m, tok, name, gguf, NV_GGUF_F32, jinja, NULL);
        free(own);
        nv_tokenizer_free(tok);
    }
    if (saved == NV_OK) unlink(v1 ? gguf : bin);
    return saved;
}

/* What a folder needs beside its model for `nerve serve -m DIR`: the chat template it chats with
   (none after a run on text: an earlier chat run's is removed) and a copy of the tokenizer. */
static void write_serving_files(const char *dir, const nv_train_opts *o, const nv_dataset *ds) {
    char path[4200];
    int named = 1; /* chat_template may name jinja: its text is written first */
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    if (o->chat_template && o->chat_template_jinja) {
        nv_iov part = {o->chat_template_jinja, strlen(o->chat_template_jinja)};
        if (nv_file_write_atomic(path, &part, 1) != NV_OK) nv_warn("could not write %s: %s", path, nv_errmsg()), named = 0;
    } else {
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/chat_template", dir);
    if (o->chat_template && named) {
        char line[64];
        snprintf(line, sizeof line, "%s\n%s", o->chat_template, ds->pack ? "packed\n" : "");
        nv_iov part = {line, strlen(line)};
        if (nv_file_write_atomic(path, &part, 1) != NV_OK) nv_warn("could not write %s: %s", path, nv_errmsg());
    } else {
        unlink(path);
    }
    if (o->tokenizer_path) {
        snprintf(path, sizeof path, "%s/tokenizer.bin", dir);
        if (strcmp(o->tokenizer_path, path) != 0 && copy_tokenizer(o->tokenizer_path, path) != NV_OK)
            nv_warn("could not copy the tokenizer into %s: %s", dir, nv_errmsg());
    }
}

/* The files a run writes into a model folder of its own (best/, step-N/), removed when a new run
   starts in the folder (an earlier run's are not this one's). */
static void clear_model_dir(const char *dir) {
    static const char *const names[] = {"model.bin", "model.gguf", "adapter.gguf", "adapter_model.safetensors",
                                        "adapter_config.json", "tokenizer.bin", "chat_template", "chat_template.jinja"};
    nv_remove_in_dir(dir, names, sizeof names / sizeof names[0]);
}

/* The weights as they stand into dir (best/, step-N/): the model, or a LoRA run's adapters
   (adapter.gguf and PEFT's files). */
static nv_err save_weights(nv_tmodel *tm, const nv_train_opts *o, const char *dir) {
    char path[4200];
    nv_err e;
    if (o->lora.rank > 0) {
        remove_models(dir); /* (best/'s are merged from the best adapters at the run's end: save_best_merged) */
        snprintf(path, sizeof path, "%s/adapter.gguf", dir);
        e = nv_gguf_save_lora(&o->config, &o->lora, tm->lora_params, path);
        if (e == NV_OK) e = nv_hf_save_lora(&o->config, &o->lora, tm->lora_params, o->lora_dropout, dir);
    } else {
        e = save_model(&tm->m, dir, o->out_dir, path);
    }
    if (e != NV_OK) nv_warn("%s not written: %s", path, nv_errmsg());
    return e;
}

/* The step of a run folder's folder named step-N (--save-every's: N written as a step is), else -1. */
static long snapshot_step(const char *dir, const char *name) {
    if (strncmp(name, "step-", 5) != 0 || name[5] < '1' || name[5] > '9') return -1; /* (no step 0, no leading zeros) */
    char *end, path[4300];
    errno = 0;
    const long n = strtol(name + 5, &end, 10);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return *end || errno || !nv_file_is_dir(path) ? -1 : n;
}

static int cmp_long(const void *a, const void *b) {
    const long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* Every step-N/ folder's step, ascending (malloc'd, *n of them; NULL with 0 when none or unreadable). */
static long *list_snapshots(const char *run_dir, int *n) {
    long *steps = NULL;
    int cap = 0;
    *n = 0;
    DIR *d = opendir(run_dir);
    for (struct dirent *de; d && (de = readdir(d));) {
        const long step = snapshot_step(run_dir, de->d_name);
        if (step < 0) continue;
        if (*n == cap) {
            long *grown = realloc(steps, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *steps);
            if (!grown) break;
            steps = grown;
        }
        steps[(*n)++] = step;
    }
    if (d) closedir(d);
    if (*n) qsort(steps, (size_t)*n, sizeof *steps, cmp_long);
    return steps;
}

int nv_train_snapshots(const char *run_dir, long *steps, int cap) {
    int n;
    long *all = list_snapshots(run_dir, &n);
    const int from = n > cap ? n - cap : 0; /* the newest cap */
    for (int i = from; i < n; i++) steps[i - from] = all[i];
    free(all);
    return n - from;
}

static void remove_model_dir(const char *dir) {
    clear_model_dir(dir);
    if (rmdir(dir) != 0 && errno != ENOENT) nv_warn("could not remove %s: %s", dir, strerror(errno));
}

void nv_train_remove_snapshot(const char *run_dir, long step) {
    char path[4300];
    snprintf(path, sizeof path, "%s/step-%ld", run_dir, step);
    remove_model_dir(path);
}

/* The run folder's step-N/ folders past step `past` (-1: all), and of the others all but the newest
   keep (0: no limit); and any a stopped run left half written (.step-N.part). */
static void prune_snapshots(const char *out_dir, long past, int keep) {
    char path[4300];
    DIR *d = opendir(out_dir);
    for (struct dirent *de; d && (de = readdir(d));)
        if ((!strncmp(de->d_name, ".step-", 6) && strstr(de->d_name, ".part")) || !strcmp(de->d_name, ".best.part")) {
            snprintf(path, sizeof path, "%s/%s", out_dir, de->d_name);
            remove_model_dir(path);
        }
    if (d) closedir(d);
    int n;
    long *steps = list_snapshots(out_dir, &n);
    int kept = 0;
    for (int i = n - 1; i >= 0; i--) {
        if (steps[i] <= past && (keep <= 0 || kept < keep)) {
            kept++;
            continue;
        }
        nv_train_remove_snapshot(out_dir, steps[i]);
    }
    free(steps);
}

/* What a run refuses before it touches anything: every process checks the same settings alike. */
static nv_err check_settings(const nv_train_opts *o, const nv_dataset *ds, int world) {
    const nv_config *c = &o->config;
    if (o->batch < 1 || o->seq < 1 || o->accum < 1 || o->steps < 1)
        return nv_fail(NV_EINVAL, "batch, seq, accum and steps must be positive");
    if (o->seq > c->seq_len) return nv_fail(NV_EINVAL, "--seq %d exceeds the model's context %d", o->seq, c->seq_len);
    if (c->n_experts && ds->pref) /* the balance term has no share in the preference losses' gradient */
        return nv_fail(NV_EUNSUPPORTED, "preference training of a mixture-of-experts model is not supported (train "
                                        "it on text, prompt/completion or chat data)");
    if (!(o->router_aux_coef >= 0.0f) || !isfinite(o->router_aux_coef) || !(o->router_z_coef >= 0.0f) || !isfinite(o->router_z_coef))
        return nv_fail(NV_EINVAL, "--router-aux-coef %g, --router-z-coef %g: want finite values >= 0",
                       (double)o->router_aux_coef, (double)o->router_z_coef);
    if (c->qk_norm && c->qkv_bias) /* no format could hold the trained model */
        return nv_fail(NV_EUNSUPPORTED, "a model with both QK-norm and projection biases cannot be trained (no format "
                                        "writes it)");
    if (o->batch % world)
        return nv_fail(NV_EINVAL, "--batch %d does not split evenly over %d processes: make it a multiple of %d", o->batch,
                       world, world);
    if (o->teacher) {
        const nv_config *tc = &o->teacher->config;
        if (ds->pref) return nv_fail(NV_EINVAL, "--teacher does not go with preference data (a pair's loss has no teacher's share)");
        if (tc->vocab_size != c->vocab_size)
            return nv_fail(NV_EINVAL, "--teacher: its vocabulary has %d tokens, the model's %d: a teacher must share the "
                                      "model's tokens", tc->vocab_size, c->vocab_size);
        if (tc->seq_len < o->seq)
            return nv_fail(NV_EINVAL, "--teacher: its context of %d is shorter than --seq %d", tc->seq_len, o->seq);
        if (!(o->distill_alpha >= 0.0f && o->distill_alpha <= 1.0f) || !(o->distill_temp > 0.0f) || !isfinite(o->distill_temp))
            return nv_fail(NV_EINVAL, "--distill-alpha %g, --distill-temp %g: want an alpha in [0, 1] and a positive temperature",
                           (double)o->distill_alpha, (double)o->distill_temp);
        if (c->logit_softcap != 0.0f)
            return nv_fail(NV_EUNSUPPORTED, "--teacher: a model whose logits are soft-capped (Gemma 2's shape) is not supported");
    }
    const int lora = o->lora.rank > 0, pref = ds->pref;
    if (lora && !o->init_params) return nv_fail(NV_EINVAL, "LoRA trains adapters on a model: give it with --init-from");
    if (lora) NV_TRY(nv_lora_validate(c, &o->lora));
    if (o->lora_init && !lora) return nv_fail(NV_EINVAL, "adapters to start from go with a LoRA run");
    if (o->save_limit < 0 || o->save_every < NV_TRAIN_SAVE_EPOCH || (o->save_limit > 0 && !o->save_every))
        return nv_fail(NV_EINVAL, "--save-limit %d, --save-every %d: want a count >= 1 of the step-N folders --save-every writes",
                       o->save_limit, o->save_every);
    if (pref && !o->init_params)
        return nv_fail(NV_EINVAL, "preference training improves an existing model: give it with --init-from");
    if (pref && (o->batch / world) % 2)
        return nv_fail(NV_EINVAL, "preference pairs are two windows each: --batch must be even%s",
                       world > 1 ? " on every process (a multiple of twice the processes)" : "");
    if (pref && !(isfinite(o->pref.beta) && o->pref.kind < NV_PREF_COUNT && isfinite(o->pref.gamma) &&
                  o->pref.sft_weight >= 0 && isfinite(o->pref.sft_weight)))
        return nv_fail(NV_EINVAL, "the preference loss's settings must be finite, its SFT weight not negative");
    if (pref && ds->pack) return nv_fail(NV_EINVAL, "preference pairs are not packed: leave out --pack");
    if (o->early_stop < 0) return nv_fail(NV_EINVAL, "--early-stop %d: want a count of evaluations >= 1", o->early_stop);
    const nv_best_metric bm = o->best_metric;
    if ((unsigned)bm >= NV_BEST_COUNT) return nv_fail(NV_EINVAL, "unknown best metric %d", (int)bm);
    if (bm != NV_BEST_VAL_LOSS && !o->save_best && o->early_stop <= 0)
        return nv_fail(NV_EINVAL, "--best-metric goes with --save-best or --early-stop");
    const int held_out = bm == NV_BEST_VAL_LOSS || bm == NV_BEST_REWARD_ACC || bm == NV_BEST_CHOICE_ACC || bm == NV_BEST_TOKEN_ACC;
    if ((o->save_best || o->early_stop > 0) && held_out && (o->eval_every <= 0 || ds->val_tokens == 0))
        return nv_fail(NV_EINVAL, "--save-best and --early-stop follow the %s: give held-out data (--val-frac or --val-data) "
                                  "and --eval-every N",
                       best_metric_words[bm]);
    if ((bm == NV_BEST_REWARD_ACC || bm == NV_BEST_CHOICE_ACC) && !pref)
        return nv_fail(NV_EINVAL, "--best-metric %s is preference data's: this run's data are not pairs", best_metric_names[bm]);
    if (o->full_eval && (pref || ds->val_tokens == 0))
        return nv_fail(NV_EINVAL, "--full-eval scores the whole validation split: %s",
                       pref ? "preference pairs are scored by their rewards at every --eval-every" : "give held-out data (--val-frac or --val-data)");
    if (bm == NV_BEST_TOKEN_ACC && pref)
        return nv_fail(NV_EINVAL, "--best-metric val_token_acc: preference pairs are scored by their rewards (val_reward_acc)");
    if ((bm == NV_BEST_MC_ACC || bm == NV_BEST_MC_ACC_NORM) && (!o->eval_choice || o->eval_every <= 0))
        return nv_fail(NV_EINVAL, "--best-metric %s is the multiple-choice tasks': give --eval-choice FILE and --eval-every N",
                       best_metric_names[bm]);
    /* starting weights with a NaN or an infinity would only ever skip their updates */
    if (!o->resume && o->init_params) {
        const uint64_t n = nv_config_param_count(c);
        for (uint64_t i = 0; i < n; i++)
            if (!isfinite(o->init_params[i]))
                return nv_fail(NV_EFORMAT, "the starting weights hold a value that is not finite (parameter %llu of %llu): "
                                           "a model to fine-tune must be finite",
                               (unsigned long long)i, (unsigned long long)n);
    }
    return NV_OK;
}

/* nv_tmodel_init_ex's flags for this run: --recompute, and a LoRA run gives its frozen matrices' fp32
   pages back where they can be had again for the merges (o->init_file_backed, o->reload_init). */
static int tmodel_flags(const nv_train_opts *o) {
    const int release = o->lora.rank > 0 && (o->init_file_backed || o->reload_init);
    return (o->recompute ? NV_TMODEL_RECOMPUTE : 0) | (release ? NV_TMODEL_RELEASE_BASE : 0);
}

/* A run that cannot fit this machine's memory is refused before it allocates (and before the kernel
   kills it part way through setup), on every machine of the job if on any. need: what this
   machine's processes take. */
static nv_err check_memory(const nv_train_opts *o, double *need) {
    const int lora = o->lora.rank > 0;
    *need = (nv_tmodel_memory_bytes(&o->config, o->batch / nv_dist_size(), o->seq, &o->lora, tmodel_flags(o)) +
             (o->teacher ? 4.0 * o->batch / nv_dist_size() * o->seq * o->config.vocab_size : 0.0)) * /* its logits */
            nv_dist_local_size();
    const double have = (double)nv_cpu_probe()->mem_total_bytes;
    const int too_big_here = have > 0 && *need > have;
    if (!nv_dist_max(too_big_here)) return NV_OK;
    if (!too_big_here)
        return nv_fail(NV_ENOMEM, "another machine of this job has too little memory for its processes' share of the "
                                  "training: lower --batch or --seq");
    return nv_fail(NV_ENOMEM, "training needs about %.1f GB (weights, %s, packed weights and the activations of %d x %d "
                              "tokens%s) and this machine has %.1f GB: lower --batch or --seq%s%s",
                   *need / 1e9, lora ? "the adapters and their state" : "gradients, AdamW state", o->batch, o->seq,
                   nv_dist_local_size() > 1 ? ", over its processes" : "", have / 1e9,
                   o->recompute ? "" : ", recompute the activations (--recompute)",
                   lora ? "" : ", or train LoRA adapters (--lora-rank)");
}

/* Everything a run holds from its setup to its end. Data parallel: each of the job's processes
   takes batch / world of every micro-batch's windows; process 0 ("lead") owns the run folder and
   the console. */
typedef struct {
    const nv_train_opts *o; /* opts: the caller's, with the length --time-budget decides */
    nv_train_opts opts;
    int length_decided;     /* --time-budget: opts.steps is the decided length */
    double t_first_eval;    /* seconds the evaluation before the first step took (0: none) */
    const nv_dataset *ds;
    int world, lead, local_batch, lora, pref, with_ref, save_best_on, quiet, tty;
    size_t bt;   /* tokens of a micro-batch, every process's */
    int trim;    /* chat turns one a window: micro-batches cut after their furthest answer (trimmed_windows) */
    uint64_t bhash; /* what identifies the frozen weights a LoRA run adapts, or the reference a DPO/IPO run compares with */
    uint64_t shash; /* bhash with --lora-init's adapters: what the checkpoint records */
    int have_tm;
    nv_tmodel tm;
    nv_adamw opt;
    nv_data_cursor cur;
    double *ref; /* DPO, IPO: the reference's log-probabilities, two a pair */
    nv_state tstate;   /* distillation: the teacher's forward state, and its logits for a micro-batch's rows */
    int have_tstate;
    float *tlogits;
    /* a step's batches: every process draws the whole batch's windows (the data cursor stays the same
       everywhere) and trains on its rows */
    int *in, *tg, *seg;  /* seg: packed, where each row's turn starts */
    uint64_t *pair_ids;  /* preference data: each window pair's number */
    float *seq_scale;    /* and each local sequence's weight for the backward */
    FILE *metrics, *samples;
    series tr, va;
    best_eval best;
    eval_figures last_eval; /* the latest of each kind, for the progress line */
    long step0;
    int64_t tokens_seen;
    float last_loss;
    double epoch_windows; /* windows a pass over the training data takes */
    char procs[64];       /* " x N processes (...)" */
    int adapters_behind;  /* LoRA: the latest checkpoint's adapters were not written (adapter.gguf is an older one's, or none) */
    char best_dir[4200], ckpt_path[4200], metrics_path[4200], svg_path[4200], adapter_path[4200], samples_path[4200];
} train_run;

/* The run's length from here on: total steps, the LR schedule over them, and the default warmup (a
   tenth of them at most) where the warmup was not given. */
static void set_length(train_run *r, long total) {
    r->opts.steps = (int)total;
    r->opt.o.total_steps = (int)total;
    if (r->opts.warmup_auto && r->opt.o.warmup_steps > total / 10) r->opt.o.warmup_steps = (int)(total / 10);
    r->opts.adamw.warmup_steps = r->opt.o.warmup_steps;
}

/* --time-budget plans again at 30%, 45%, 60%, 75% and 90% of the budget, each time from the steps since
   the plan before: a machine that slows down (or speeds up) part way moves the end of the schedule, not
   the end of the budget. */
#define NV_TRAIN_BUDGET_REPLANS 5
static double budget_replan_at(int replans) { return 0.3 + 0.15 * replans; }

/* --time-budget: the steps that fit what is left of it (done steps so far, `elapsed` seconds since the
   run's start) at per_step seconds a step (its wall time: progress and metrics included) and
   per_eval more for the evaluations; process 0's figures for every process. `again`: a later plan,
   which corrects the one before by the steps since (logged when the length moves). */
static void decide_length(train_run *r, long done, double elapsed, double per_step, double per_eval, int again) {
    const nv_train_opts *o = r->o;
    const double left = o->time_budget_s - elapsed;
    long total = done + (left > 0 ? (long)(left / (per_step + per_eval)) : 0);
    if (total > NV_TRAIN_BUDGET_STEPS) total = NV_TRAIN_BUDGET_STEPS;
    if (r->world > 1) nv_dist_bcast(&total, sizeof total);
    const long before = r->opts.steps;
    set_length(r, total);
    r->length_decided = 1;
    if (!r->lead || (again && total == before)) return;
    if (r->tty) fprintf(stderr, "\n");
    if (again)
        nv_info("--time-budget %gs: %ld steps, planned again %.1f s in (%.3g ms a step since, evaluations included)",
                o->time_budget_s, total, elapsed, per_step * 1e3);
    else
        nv_info("--time-budget %gs: %ld steps (%.3g ms a step%s after %.1f s; warmup %d)", o->time_budget_s, total,
                per_step * 1e3, per_eval > 0 ? " and the evaluations" : "", elapsed, r->opt.o.warmup_steps);
}

/* --time-budget has not decided the run's length yet. */
static int length_pending(const train_run *r) { return r->o->time_budget_s > 0 && !r->length_decided; }

/* "N", or "~N" while --time-budget has not decided the length (N: the budget's worth at the rate so
   far, or "?" before any step). */
static const char *steps_text(const train_run *r, long step, double elapsed, char *buf, size_t cap) {
    if (!length_pending(r)) snprintf(buf, cap, "%d", r->o->steps);
    else if (step <= r->step0 || elapsed <= 0) snprintf(buf, cap, "?");
    else snprintf(buf, cap, "~%.0f", (double)r->step0 + (double)(step - r->step0) * r->o->time_budget_s / elapsed);
    return buf;
}

/* One step's figures. */
typedef struct {
    double loss, router[2]; /* a mixture's balance and z-loss, the micro-batches' means */
    double kl;              /* distillation: the KL term's mean over the micro-batches */
    double t_teacher;       /* and the teacher's forwards' seconds (counted in t_forward too) */
    double psums[PREF_SUMS], flops;
    long targets, pairs; /* chat data's answer tokens, preference data's pairs with answers */
    double tok[2];       /* the targets the model ranked first, of all the step's targets (token accuracy) */
    long run_tokens;     /* the window rows run (chat turns: cut after each micro-batch's furthest answer) */
    double t_forward, t_backward, t_wait, t_optimizer, t_step;
    double elapsed; /* seconds since this process's run started, at the step's end */
    float lr;
    double gnorm;
    int no_targets, skipped;
    eval_figures ev;
} step_figures;

/* Sums over the steps this process ran, for the efficiency report. */
typedef struct {
    long steps;
    double forward, backward, optimizer, wait, step, flops, teacher;
    uint64_t windows0; /* the data cursor's windows when the run (or its resumption) began */
} run_totals;

/* The model, the optimizer and where the data stands: new, or from the checkpoint ck that process 0
   verified (closed here); then process 0's on every process. */
static nv_err run_setup(train_run *r, nv_ckpt *ck) {
    const nv_train_opts *o = r->o;
    const nv_config *c = &o->config;
    nv_err e;
    /* a LoRA run's checkpoint holds the adapters; the frozen weights are --init-from's. Preference
       training scores its pairs with the starting model first, then takes up the checkpoint's. */
    const float *resumed = o->resume && r->lead && !r->pref ? ck->params : NULL;
    const int flags = tmodel_flags(o);
    if (r->lora)
        e = nv_tmodel_init_ex(&r->tm, c, o->init_params, o->seed, r->local_batch, o->seq, o->engine, &o->lora,
                              resumed ? resumed : o->lora_init, flags);
    else
        e = nv_tmodel_init_ex(&r->tm, c, resumed ? resumed : o->init_params, o->seed, r->local_batch, o->seq, o->engine,
                              NULL, NULL, flags);
    if (e) return e;
    r->have_tm = 1;
    r->tm.router_aux_coef = c->n_experts && !r->lora ? o->router_aux_coef : 0.0f; /* adapters: the router is frozen */
    r->tm.router_z_coef = c->n_experts && !r->lora ? o->router_z_coef : 0.0f;
    if (o->teacher) { /* a micro-batch's logits, made by the teacher before each forward */
        NV_TRY(nv_state_init(&r->tstate, &o->teacher->config, o->seq, o->seq, 1));
        r->have_tstate = 1;
        if (!(r->tlogits = malloc((size_t)r->local_batch * o->seq * c->vocab_size * sizeof(float))))
            return nv_fail(NV_ENOMEM, "out of memory for the teacher's logits");
        NV_TRY(nv_tmodel_set_teacher(&r->tm, r->tlogits, o->distill_alpha, o->distill_temp));
    }
    if (r->with_ref) NV_TRY(pref_reference(&r->tm, r->ds, &r->ref));
    if (r->pref && o->resume && r->lead) {
        memcpy(r->tm.train_params, ck->params, (size_t)r->tm.n_train * sizeof(float));
        nv_tmodel_refresh(&r->tm);
    }
    nv_adamw_opts ao = o->adamw;
    ao.total_steps = o->steps;
    NV_TRY(nv_adamw_init(&r->opt, &ao, r->lora ? NULL : c, r->tm.n_train));
    nv_data_cursor_init(&r->cur, o->seed);
    r->best = (best_eval){NAN, 0, 0};
    if (o->resume && r->lead) {
        r->best = (best_eval){ck->h.best_val_loss, (long)ck->h.best_step, ck->h.evals_since_best};
        memcpy(r->opt.m, ck->m, (size_t)r->tm.n_train * sizeof(float));
        memcpy(r->opt.v, ck->v, (size_t)r->tm.n_train * sizeof(float));
        r->opt.step = (long)ck->h.step;
        r->step0 = (long)ck->h.step;
        r->tokens_seen = ck->h.tokens_seen;
        r->cur.rng = ck->h.data_rng;
        r->cur.windows = ck->h.data_windows;
        if (o->time_budget_s > 0 && ck->h.budget_steps > 0) set_length(r, (long)ck->h.budget_steps), r->length_decided = 1;
        nv_ckpt_close(ck);
        metrics_restore(r->metrics_path, r->step0, &r->tr, &r->va);
        nv_info("resuming %s at step %ld of %d", r->ckpt_path, r->step0, o->steps);
    } else if (r->lead) {
        FILE *f = fopen(r->metrics_path, "w");
        if (f) fclose(f);
    }
    if (r->world > 1) { /* every process starts from process 0's weights and state: identical from here on */
        run_state st = {r->step0, r->tokens_seen, r->cur, r->best, r->length_decided ? r->opts.steps : 0};
        nv_dist_bcast(&st, sizeof st);
        r->step0 = st.step, r->tokens_seen = st.tokens_seen, r->cur = st.cur, r->best = st.best;
        if (st.budget_steps > 0) set_length(r, st.budget_steps), r->length_decided = 1;
        r->opt.step = r->step0;
        nv_dist_bcast(r->tm.train_params, (size_t)r->tm.n_train * sizeof(float));
        if (o->resume) { /* a new run's moments are zeros everywhere */
            nv_dist_bcast(r->opt.m, (size_t)r->tm.n_train * sizeof(float));
            nv_dist_bcast(r->opt.v, (size_t)r->tm.n_train * sizeof(float));
        }
        if (!r->lead) nv_tmodel_refresh(&r->tm);
    }
    return NV_OK;
}

/* The step's batches and the metrics and samples files. */
static nv_err run_open_files(train_run *r) {
    const nv_train_opts *o = r->o;
    const size_t n = r->bt * o->accum;
    r->in = malloc(n * sizeof(int));
    r->tg = malloc(n * sizeof(int));
    r->seg = r->ds->pack ? malloc(n * sizeof(int)) : NULL;
    r->pair_ids = r->pref ? malloc((size_t)o->batch / 2 * o->accum * sizeof(uint64_t)) : NULL;
    r->seq_scale = r->pref ? malloc((size_t)r->local_batch * sizeof(float)) : NULL;
    if (!r->in || !r->tg || (r->ds->pack && !r->seg) || (r->pref && (!r->pair_ids || !r->seq_scale)))
        return nv_fail(NV_ENOMEM, "cannot allocate the step's batches");
    if (!r->lead) return NV_OK;
    r->metrics = fopen(r->metrics_path, "a");
    if (!r->metrics) return nv_fail(NV_EIO, "cannot open %s", r->metrics_path);
    /* a new run's samples start afresh; a resumed one's go on after its earlier ones */
    if (o->sample_every > 0 && !(r->samples = fopen(r->samples_path, o->resume ? "a" : "w")))
        return nv_fail(NV_EIO, "cannot open %s", r->samples_path);
    return NV_OK;
}

static void run_free(train_run *r) {
    if (r->metrics) fclose(r->metrics);
    if (r->samples) fclose(r->samples);
    free(r->in);
    free(r->tg);
    free(r->seg);
    free(r->pair_ids);
    free(r->seq_scale);
    free(r->ref);
    if (r->have_tstate) nv_state_free(&r->tstate);
    free(r->tlogits);
    free(r->tr.step);
    free(r->tr.loss);
    free(r->va.step);
    free(r->va.loss);
    nv_adamw_free(&r->opt);
    if (r->have_tm) nv_tmodel_free(&r->tm);
}

/* The weights as they stand into the model folder dir (best/, step-N/), whole or not at all: written
   with the files serving them into part, which is then renamed over dir; a failure leaves dir as it was. */
static nv_err save_folder(train_run *r, const char *part, const char *dir) {
    const nv_train_opts *o = r->o;
    remove_model_dir(part);
    nv_err e = nv_mkdirs(part);
    if (e == NV_OK) write_serving_files(part, o, r->ds); /* (first: a GGUF model takes its vocabulary and template from them) */
    if (e == NV_OK) e = save_weights(&r->tm, o, part);
    if (e == NV_OK) {
        /* the folder it replaces swapped out whole (at no moment is there none), then removed */
        int rc;
        if (!nv_file_is_dir(dir)) rc = rename(part, dir);
        else if ((rc = renameat2(AT_FDCWD, part, AT_FDCWD, dir, RENAME_EXCHANGE)) != 0 && errno == EINVAL) {
            remove_model_dir(dir); /* (a file system without the exchange: removed, then renamed) */
            rc = rename(part, dir);
        }
        if (rc != 0) e = nv_fail(NV_EIO, "cannot rename %s to %s: %s", part, dir, strerror(errno));
    }
    remove_model_dir(part); /* (the folder replaced, or the one that failed) */
    return e;
}

/* An evaluation: its figures kept for the progress line, and best/ written when its validation loss
   is the lowest so far. */
static eval_figures run_evaluate(train_run *r, long step) {
    const eval_figures ev = evaluate(&r->tm, r->o, r->ds, r->in, r->tg, r->pair_ids, r->ref, r->trim);
    keep_evals(&r->last_eval, &ev);
    const best_eval before = r->best;
    if (best_eval_note(&r->best, (float)best_metric_of(&ev, r->o->best_metric), step, r->o->best_metric) && r->save_best_on) {
        nv_err e = NV_OK;
        if (r->lead) {
            char part[4300];
            snprintf(part, sizeof part, "%s/.best.part", r->o->out_dir);
            if (r->tty) fprintf(stderr, "\r\033[K"); /* a warning would land in the progress line */
            if ((e = save_folder(r, part, r->best_dir)) != NV_OK)
                nv_warn("best/ keeps the weights of step %ld: those of step %ld are not saved: %s", before.step, step, nv_errmsg());
        }
        /* best/ holds what it held: so do the figures that name it (the checkpoint's, the run's last words;
           --early-stop counts the evaluation as one without a better model) */
        if (nv_dist_max(e != NV_OK)) r->best = (best_eval){before.val, before.step, before.since + 1};
    }
    return ev;
}

/* metrics.jsonl's lines so far onto the disk; one that cannot be written (a full disk) is said once,
   and the run goes on (its checkpoints are what a resume needs). */
static void metrics_flush(const train_run *r) {
    static int said;
    if ((fflush(r->metrics) != 0 || ferror(r->metrics)) && !said++)
        nv_warn("%s: cannot write (%s): the run goes on, its metrics from here on may be missing", r->metrics_path, strerror(errno));
}

/* The starting point of the validation curve (fine-tuning shows its gain against it). */
static void run_first_eval(train_run *r) {
    const double t0 = nv_now();
    const eval_figures e0 = run_evaluate(r, 0);
    r->t_first_eval = nv_now() - t0;
    if (!isfinite(e0.val) || !r->lead) return;
    fprintf(r->metrics, "{\"step\":0");
    json_evals(r->metrics, &e0);
    fprintf(r->metrics, "}\n");
    metrics_flush(r);
    series_add(&r->va, 0.0f, e0.val);
    if (r->quiet) return;
    char total[32];
    steps_text(r, 0, 0, total, sizeof total);
    if (isnan(e0.mc[1])) fprintf(stderr, "step 0/%s | val %.4f\n", total, e0.val);
    else fprintf(stderr, "step 0/%s | val %.4f | mc %.2f%%\n", total, e0.val, 100 * e0.mc[1]);
}

/* The teacher's logits for this process's windows of a micro-batch (in: their tokens; seg: a packed
   window's documents, each then run from position 0 as the model sees it alone), into r->tlogits. */
static nv_err teacher_logits(train_run *r, const int *in, const int *seg) {
    const nv_model *t = r->o->teacher;
    const int T = r->o->seq, V = t->config.vocab_size;
    for (int b = 0; b < r->local_batch; b++)
        for (int s0 = 0; s0 < T;) {
            int s1 = s0 + 1;
            while (s1 < T && !(seg && seg[b * T + s1] == s1)) s1++; /* a document starts where its row is its start */
            NV_TRY(nv_forward_rows(t, &r->tstate, in + b * T + s0, s1 - s0, 0, s1 - s0));
            memcpy(r->tlogits + ((size_t)b * T + s0) * V, r->tstate.logits, (size_t)(s1 - s0) * V * sizeof(float));
            s0 = s1;
        }
    return NV_OK;
}

/* A step's gradient, summed over its micro-batches and the job's processes, and its loss: the
   windows first (with chat data the loss is the mean over the step's targets, whose count every
   process knows from the windows: it draws all of them), then forward and backward for each. */
static nv_err step_gradients(train_run *r, step_figures *f, long step) {
    const nv_train_opts *o = r->o;
    const nv_dataset *ds = r->ds;
    const size_t bt = r->bt, pairs_a = (size_t)o->batch / 2; /* preference data: a micro-batch's pairs */
    for (int a = 0; a < o->accum; a++)
        NV_TRY(r->pref ? nv_data_next_pairs(ds, &r->cur, o->batch, o->seq, r->in + a * bt, r->tg + a * bt, r->pair_ids + a * pairs_a)
                       : nv_data_next_batch(ds, &r->cur, o->batch, o->seq, r->in + a * bt, r->tg + a * bt,
                                            r->seg ? r->seg + a * bt : NULL));
    for (size_t i = 0; ds->chat && i < bt * o->accum; i++) f->targets += r->tg[i] >= 0;
    for (size_t i = 0; r->pref && i < pairs_a * o->accum; i++) {
        int n[2];
        f->pairs += pair_targets(r->tg + 2 * i * o->seq, o->seq, n);
    }
    for (int a = 0; a < o->accum; a++) {
        double ta = nv_now();
        int T;
        const size_t mine = windows_to_run(&r->tm, r->in + a * bt, r->tg + a * bt, o->batch, o->seq, r->trim, &T);
        f->run_tokens += (long)o->batch * T;
        const int *seg = r->seg ? r->seg + a * bt + mine : NULL;
        const int *tg = r->tg + a * bt + mine;
        nv_tmodel_set_segments(&r->tm, seg); /* packed turns attend to themselves */
        f->flops += nv_tmodel_step_flops(&r->tm, seg);
        const int dropping = o->dropout > 0.0f || o->lora_dropout > 0.0f;
        if (dropping) { /* this micro-batch's masks, whichever process holds its rows */
            const uint64_t at[3] = {o->seed, (uint64_t)step, (uint64_t)a};
            NV_TRY(nv_tmodel_set_dropout(&r->tm, o->dropout, o->lora_dropout, nv_hash64(at, sizeof at, 0x64726f70), mine));
        }
        if (o->teacher) {
            const double tt = nv_now();
            NV_TRY(teacher_logits(r, r->in + a * bt + mine, seg));
            f->t_teacher += nv_now() - tt;
        }
        const float l = nv_tmodel_forward(&r->tm, r->in + a * bt + mine, tg);
        f->kl += r->tm.distill_kl / (double)o->accum;
        f->tok[0] += r->tm.n_correct, f->tok[1] += r->tm.n_targets;
        if (dropping) nv_tmodel_set_dropout(&r->tm, 0.0f, 0.0f, 0, 0); /* evaluation and samples see the whole model */
        f->router[0] += r->tm.router_aux / (double)o->accum;
        f->router[1] += r->tm.router_z / (double)o->accum;
        double tb0 = nv_now();
        if (r->pref) { /* the mean of the step's pairs' losses: each pair's answers weighted by its own */
            pref_losses(&r->tm, tg, r->pair_ids + a * pairs_a + mine / (2 * (size_t)o->seq), r->ref, &o->pref,
                        f->pairs ? (double)f->pairs : 1.0, r->seq_scale, f->psums);
            nv_tmodel_backward_seq(&r->tm, r->seq_scale);
        } else if (ds->chat) { /* each micro-batch's share of the step's targets */
            f->loss += (double)l * r->tm.n_targets;
            nv_tmodel_backward(&r->tm, f->targets ? (float)((double)r->tm.n_targets / (double)f->targets) : 0.0f);
        } else {
            f->loss += l;
            nv_tmodel_backward(&r->tm, 1.0f / (float)(o->accum * r->world));
        }
        f->t_forward += tb0 - ta;
        f->t_backward += nv_now() - tb0;
        nv_tmodel_set_length(&r->tm, o->seq); /* (evaluations and samples: whole windows) */
    }
    if (!ds->chat) f->loss /= o->accum;
    /* the job's gradient: the sum of every process's (each already divided by the processes) */
    double tw0 = nv_now();
    if (r->world > 1) {
        nv_dist_sum_f32(r->tm.train_grads, r->tm.n_train);
        nv_dist_sum_f64(r->pref ? f->psums : &f->loss, r->pref ? PREF_SUMS : 1);
        nv_dist_sum_f64(&f->flops, 1);
        nv_dist_sum_f64(f->tok, 2);
        if (!ds->chat) f->loss /= r->world;
        if (o->teacher) {
            nv_dist_sum_f64(&f->kl, 1);
            f->kl /= r->world;
        }
        if (o->config.n_experts) {
            nv_dist_sum_f64(f->router, 2);
            f->router[0] /= r->world, f->router[1] /= r->world;
        }
    }
    if (r->pref) f->loss = f->psums[PREF_PAIRS] > 0 ? f->psums[PREF_LOSS] / f->psums[PREF_PAIRS] : NAN;
    else if (ds->chat) f->loss = f->targets ? f->loss / (double)f->targets : NAN;
    f->t_wait = nv_now() - tw0;
    return NV_OK;
}

/* The optimizer's step: the packed engine copies follow the master weights in the same pass; plans
   are not rebuilt; a gradient norm that is not finite leaves everything as it was (the update is
   skipped). A chat step whose windows hold no answer token has nothing to learn: AdamW's momentum
   and decay alone would still move the weights, so it is skipped too (counted, as the schedule goes
   on). */
static void step_update(train_run *r, step_figures *f) {
    double t0 = nv_now();
    f->no_targets = r->ds->chat && (r->pref ? f->pairs == 0 : f->targets == 0);
    if (f->no_targets) {
        f->lr = nv_adamw_count(&r->opt);
        r->tm.grads_held = 0;
    } else {
        f->gnorm = nv_tmodel_optimize(&r->tm, &r->opt, &f->lr);
    }
    f->skipped = !isfinite(f->gnorm) || f->no_targets;
    f->t_optimizer = nv_now() - t0;
}

/* The step's line of metrics.jsonl. */
static void write_metrics(const train_run *r, long step, const step_figures *f) {
    FILE *m = r->metrics;
    const double dt = f->t_step;
    fprintf(m, "{\"step\":%ld,\"total_steps\":%d", step, r->opt.o.total_steps);
    json_num(m, "loss", f->loss);
    if (!r->pref && f->tok[1] > 0) json_num(m, "token_acc", f->tok[0] / f->tok[1]);
    fprintf(m, ",\"lr\":%.6g", f->lr);
    json_num(m, "epoch", epochs_of(r->cur.windows, r->epoch_windows));
    json_num(m, "grad_norm", f->gnorm);
    if (r->o->teacher) json_num(m, "distill_kl", f->kl);
    if (r->o->config.n_experts) { /* router_aux 1 when the experts share the tokens evenly */
        json_num(m, "router_aux", f->router[0]);
        json_num(m, "router_z", f->router[1]);
    }
    if (r->pref && f->psums[PREF_PAIRS] > 0) { /* how often, and by how much, the model prefers the preferred */
        json_num(m, "reward_acc", f->psums[PREF_CORRECT] / f->psums[PREF_PAIRS]);
        json_num(m, "reward_margin", f->psums[PREF_MARGIN] / f->psums[PREF_PAIRS]);
    }
    fprintf(m,
            ",\"tokens_per_s\":%.1f,\"ms_per_step\":%.2f,\"ms_forward\":%.2f,\"ms_backward\":%.2f,"
            "\"ms_optimizer\":%.2f,\"ms_wait\":%.2f,\"tflops\":%.4f,\"tokens\":%lld,\"plan_builds\":%ld",
            (double)r->bt * r->o->accum / dt, dt * 1e3, f->t_forward * 1e3, f->t_backward * 1e3, f->t_optimizer * 1e3,
            f->t_wait * 1e3, f->flops / dt / 1e12, (long long)r->tokens_seen, nv_plan_builds());
    fprintf(m, ",\"run_tokens\":%ld", f->run_tokens);
    if (r->o->teacher) fprintf(m, ",\"ms_teacher\":%.2f", f->t_teacher * 1e3);
    fprintf(m, ",\"elapsed_s\":%.3f", f->elapsed);
    if (r->world > 1) fprintf(m, ",\"processes\":%d", r->world);
    if (f->skipped) fprintf(m, ",\"skipped\":true");
    json_evals(m, &f->ev);
    fprintf(m, "}\n");
    metrics_flush(r);
}

/* The live progress line (on a terminal rewritten in place; else every tenth step, the last and
   those evaluated), with avg the mean seconds of this run's steps. */
static void show_progress(const train_run *r, long step, const step_figures *f, double avg, int last) {
    const nv_train_opts *o = r->o;
    const eval_figures *le = &r->last_eval;
    const double dt = f->t_step;
    char eta[32], vbuf[64] = "", total[32];
    fmt_duration(eta, sizeof eta, length_pending(r) ? fmax(0, o->time_budget_s - f->elapsed) : avg * (o->steps - step));
    steps_text(r, step, f->elapsed, total, sizeof total);
    if (!isnan(le->val)) snprintf(vbuf, sizeof vbuf, " | val %.4f", le->val);
    if (!isnan(le->pref[0])) /* preference data: the validation pairs the model prefers rightly */
        snprintf(vbuf + strlen(vbuf), sizeof vbuf - strlen(vbuf), " (acc %.2f)", le->pref[0]);
    if (!isnan(le->mc[1])) snprintf(vbuf + strlen(vbuf), sizeof vbuf - strlen(vbuf), " | mc %.2f%%", 100 * le->mc[1]);
    char kl[48] = "", teach[48] = "";
    if (o->teacher) {
        snprintf(kl, sizeof kl, " (kl %.4f)", f->kl);
        snprintf(teach, sizeof teach, " incl. teacher %.0f", f->t_teacher * 1e3);
    }
    char line[600];
    snprintf(line, sizeof line,
             "step %ld/%s (epoch %.2f) | loss %.4f%s%s | lr %.2e | %.0f tok/s | %.0f ms/step (fwd %.0f%s, bwd %.0f, opt %.0f, "
             "wait %.0f) | %.3f TFLOP/s | ETA %s",
             step, total, epochs_of(r->cur.windows, r->epoch_windows), f->loss, kl, vbuf, f->lr,
             (double)r->bt * o->accum / dt, dt * 1e3, f->t_forward * 1e3, teach, f->t_backward * 1e3, f->t_optimizer * 1e3,
             f->t_wait * 1e3, f->flops / dt / 1e12, eta);
    if (r->tty) fprintf(stderr, "\r\033[K%s", line);
    else if (!r->quiet && (last || step % 10 == 0 || !isnan(f->ev.val))) fprintf(stderr, "%s\n", line);
}

/* --save-every: the weights after step into the run folder's step-N/ (save_folder, through
   .step-N.part), then the oldest past --save-limit removed; a failure is a warning and the run goes on. */
static void save_snapshot(train_run *r, long step) {
    const nv_train_opts *o = r->o;
    char part[4300], dir[4300];
    snprintf(part, sizeof part, "%s/.step-%ld.part", o->out_dir, step);
    snprintf(dir, sizeof dir, "%s/step-%ld", o->out_dir, step);
    if (save_folder(r, part, dir) != NV_OK) {
        nv_warn("the weights of step %ld are not saved: %s", step, nv_errmsg());
        return;
    }
    if (o->save_limit > 0) prune_snapshots(o->out_dir, step, o->save_limit);
}

/* The checkpoint, atomically, with a LoRA run's adapters beside it and the loss curve. */
static nv_err save_checkpoint(train_run *r) {
    const nv_train_opts *o = r->o;
    nv_ckpt_header h;
    memset(&h, 0, sizeof h);
    nv_ckpt_header_set_config(&h, &o->config);
    h.step = r->opt.step;
    h.tokens_seen = r->tokens_seen;
    h.data_rng = r->cur.rng;
    h.data_windows = r->cur.windows;
    h.n_params = r->tm.n_train;
    h.base_hash = r->shash; /* 0 unless LoRA or a preference loss with a reference */
    if (r->lora) {
        h.lora_rank = o->lora.rank;
        h.lora_targets = o->lora.targets;
        h.lora_alpha = o->lora.alpha;
    }
    h.batch = o->batch;
    h.seq = o->seq;
    h.accum = o->accum;
    h.seed = o->seed;
    h.last_loss = r->last_loss;
    h.last_val_loss = r->last_eval.val;
    h.best_step = r->best.step;
    h.best_val_loss = r->best.val;
    h.best_metric = (int32_t)r->o->best_metric;
    h.evals_since_best = r->best.since;
    h.budget_steps = r->length_decided ? o->steps : 0;
    NV_TRY(nv_ckpt_save(r->ckpt_path, &h, r->tm.train_params, r->opt.m, r->opt.v));
    /* the adapters as llama.cpp reads them, and as PEFT does (adapter_config.json and
       adapter_model.safetensors in the run folder), with every checkpoint (a run that dies before
       its end still leaves the ones its checkpoint holds, to use with --lora) */
    r->adapters_behind = r->lora && nv_gguf_save_lora(&o->config, &o->lora, r->tm.lora_params, r->adapter_path) != NV_OK;
    if (r->adapters_behind) nv_warn("%s not written: %s", r->adapter_path, nv_errmsg());
    if (r->lora && nv_hf_save_lora(&o->config, &o->lora, r->tm.lora_params, o->lora_dropout, o->out_dir) != NV_OK)
        nv_warn("%s/adapter_model.safetensors not written: %s", o->out_dir, nv_errmsg());
    write_svg(r->svg_path, &r->tr, &r->va, o->steps);
    return NV_OK;
}

/* A LoRA run's model: the frozen weights with adapters p merged, written into dir (path: its name).
   The weights are a copy of init_params, or where the run gave their fp32 pages back (the training
   plans held them), the starting model made again (o->reload_init); the copy is freed after. */
static nv_err save_merged(const train_run *r, const float *p, const char *dir, char path[4200]) {
    const nv_train_opts *o = r->o;
    nv_model m = {0};
    nv_err e;
    if (r->tm.base_released && !o->init_file_backed) {
        e = o->reload_init(o->reload_ctx, &m);
        if (e == NV_OK) e = nv_model_own_params(&m);
    } else { /* (the pages given back of a file's mapping read the file again) */
        e = nv_model_alloc(&m, &o->config);
        const size_t n = e == NV_OK ? (size_t)m.n_params : 0, chunk = (size_t)16 << 20;
        for (size_t at = 0; at < n; at += chunk) { /* a file's pages go again once copied: held once */
            const size_t bytes = (n - at < chunk ? n - at : chunk) * sizeof(float);
            memcpy(m.params + at, o->init_params + at, bytes);
            if (o->init_file_backed) nv_mem_release(o->init_params + at, bytes);
        }
    }
    if (e == NV_OK && (r->tm.base_released || o->init_file_backed) &&
        (m.n_params != r->tm.m.n_params || nv_hash64(m.params, (size_t)m.n_params * sizeof(float), 7) != r->bhash))
        e = nv_fail(NV_EINVAL, "the starting model read again is not the one the run adapted (was its file changed?)");
    if (e == NV_OK) {
        nv_lora_merge(&m, &o->lora, p, 1.0f);
        e = save_model(&m, dir, o->out_dir, path);
    }
    nv_model_free(&m);
    return e;
}

/* A LoRA run's best/ gets a model too, as its folder gets one: best/adapter.gguf (written at the best
   evaluation, perhaps by an earlier session of a resumed run) merged into the frozen weights, so
   best/ generates and serves without --lora. */
static void save_best_merged(const train_run *r) {
    const nv_train_opts *o = r->o;
    char adapter[4300], path[4200];
    snprintf(adapter, sizeof adapter, "%s/adapter.gguf", r->best_dir);
    nv_lora_shape s;
    float *p = NULL;
    nv_err e = nv_gguf_load_lora(adapter, &o->config, &s, &p);
    if (e == NV_OK && (s.rank != o->lora.rank || s.targets != o->lora.targets || s.alpha != o->lora.alpha))
        e = nv_fail(NV_EFORMAT, "%s does not hold this run's adapters", adapter);
    if (e == NV_OK) e = save_merged(r, p, r->best_dir, path);
    free(p);
    if (e != NV_OK) nv_warn("the best model is not written (%s): use the base with --lora %s", nv_errmsg(), adapter);
}

/* The weights as they stand, ready for `nerve generate`, however the run ended; a LoRA run's
   adapters alone (for llama.cpp's --lora, or nerve's) and merged into the model (the training model
   is done with: its plans go first, and a copy of its frozen weights takes the update). */
/* The run's model (a LoRA run's merged with its adapters, unless --no-merge) into the run folder, and
   best/'s merged model; an error when the model is not written (its stale files removed: the checkpoint
   stays, from which nerve export writes it). */
static nv_err save_final(train_run *r) {
    char path[4200];
    nv_err e, failed = NV_OK;
    if (r->lora && r->adapters_behind) { /* (an earlier checkpoint's adapters must not pass for the run's) */
        unlink(r->adapter_path);
        return nv_fail(NV_EIO, "%s is not written: the checkpoint %s holds the adapters (nerve export %s -o FILE writes the merged model)",
                       r->adapter_path, r->ckpt_path, r->o->out_dir);
    }
    if (r->lora) { /* adapter.gguf was written with the last checkpoint */
        if (nv_file_exists(r->adapter_path)) nv_info("wrote %s", r->adapter_path);
        nv_model_free_plans(&r->tm.m);
        if (r->o->lora_no_merge) { /* the adapters alone (an earlier session's merged model would not go with them) */
            remove_models(r->o->out_dir);
            e = NV_EINVAL; /* (no model written, none to say) */
        } else if ((e = save_merged(r, r->tm.lora_params, r->o->out_dir, path)) != NV_OK) {
            /* never the base under the merged model's name: export and serve refuse a missing one */
            remove_models(r->o->out_dir);
            failed = nv_fail(e, "the merged model is not written (%s): the adapters are in %s (use them on the base with --lora)",
                             nv_errmsg(), r->adapter_path);
        }
    } else {
        unlink(r->adapter_path); /* an earlier run's, which would not go with this model */
        if ((e = save_model(&r->tm.m, r->o->out_dir, r->o->out_dir, path)) != NV_OK) {
            remove_models(r->o->out_dir); /* (an earlier session's would pass for this one's) */
            failed = nv_fail(e, "%s is not written (%s): the checkpoint %s holds the weights (nerve export %s -o FILE)", path, nv_errmsg(),
                             r->ckpt_path, r->o->out_dir);
        }
    }
    if (e == NV_OK) nv_info("wrote %s", path);
    if (r->save_best_on && !isnan(r->best.val)) {
        if (r->lora && e == NV_OK) save_best_merged(r);
        nv_info("best %s %.4f, at step %ld: %s", best_metric_words[r->o->best_metric], (double)r->best.val, r->best.step, r->best_dir);
    }
    return failed;
}

/* The end-of-run report: where the time went, the fraction of the engine's peak (measured now with
   the same threads, by every process at once, summed), plan builds and peak memory. */
static void report_efficiency(const train_run *r, const run_totals *t, nv_engine_id used, double wall,
                              long builds_after_setup) {
    const double n = (double)t->steps, achieved = t->flops / t->step;
    nv_peak_unit unit = nv_peak_unit_of(nv_engine_bf16_of(used)); /* int8 engines train on bf16 tiles */
    char why[160], peak_text[96] = "";
    double peak = 0;
    nv_dist_max(0); /* the processes measure together, once process 0 has saved */
    if (unit != NV_PEAK_COUNT && nv_peak_available(unit, why, sizeof why)) peak = nv_peak_run(unit, nv_pool_threads(), 0.2);
    const int same_unit = nv_dist_max(unit) == -nv_dist_max(-(long)unit); /* machines of one kind */
    nv_dist_sum_f64(&peak, 1);
    if (peak > 0 && same_unit)
        snprintf(peak_text, sizeof peak_text, " = %.0f%% of the %.2f TFLOP/s %s peak measured now", 100 * achieved / peak,
                 peak / 1e12, nv_peak_instr(unit));
    /* the process's peak resident memory, what a run at this batch and window needs on this box */
    struct rusage ru;
    char mem_text[48] = "";
    if (!getrusage(RUSAGE_SELF, &ru) && ru.ru_maxrss > 0)
        snprintf(mem_text, sizeof mem_text, "; peak memory %.2f GB%s", (double)ru.ru_maxrss * 1024.0 / 1e9,
                 r->world > 1 ? " a process" : "");
    if (!r->lead) return;
    char teacher_text[64] = "";
    if (r->o->teacher) snprintf(teacher_text, sizeof teacher_text, ", the teacher's %.1f of it", 1e3 * t->teacher / n);
    fprintf(stderr,
            "nerve: efficiency: %ld steps (%.2f epochs) in %.1f s, %.0f tokens/s, %.1f ms/step = forward %.1f (%.0f%%%s) + "
            "backward %.1f (%.0f%%) + optimizer %.1f (%.0f%%) + waiting %.1f (%.0f%%); %.3f TFLOP/s achieved on %s%s%s; %ld "
            "plans built at setup, %ld since%s\n",
            t->steps, epochs_of(r->cur.windows - t->windows0, r->epoch_windows), wall, (double)r->bt * r->o->accum * n / t->step,
            1e3 * t->step / n, 1e3 * t->forward / n, 100 * t->forward / t->step, teacher_text, 1e3 * t->backward / n,
            100 * t->backward / t->step, 1e3 * t->optimizer / n, 100 * t->optimizer / t->step, 1e3 * t->wait / n,
            100 * t->wait / t->step, achieved / 1e12, nv_engine_name(used), r->procs, peak_text, builds_after_setup,
            nv_plan_builds() - builds_after_setup, mem_text);
}

/* The startup line: what is trained, on what, how. */
static void announce(const train_run *r, double need) {
    const nv_train_opts *o = r->o;
    char what[160];
    if (r->lora) {
        char targets[64];
        snprintf(what, sizeof what, "LoRA adapters (rank %d, alpha %g, on %s: %.2fM parameters) of a frozen %.2fM-parameter model",
                 o->lora.rank, (double)o->lora.alpha, nv_lora_targets_text(o->lora.targets, targets, sizeof targets),
                 (double)r->tm.n_train / 1e6, (double)r->tm.m.n_params / 1e6);
    } else {
        snprintf(what, sizeof what, "%.2fM parameters", (double)r->tm.m.n_params / 1e6);
    }
    char length[64];
    if (length_pending(r)) snprintf(length, sizeof length, "the steps %g s takes", o->time_budget_s);
    else snprintf(length, sizeof length, "%d steps", o->steps);
    nv_info("training %s on %s%s: %s of %d x %d tokens x %d accumulation (%.2f GFLOP/step, about %.2f GB of memory)",
            what, nv_engine_name(nv_model_engine(&r->tm.m)), r->procs, length, o->batch, o->seq, o->accum,
            r->tm.flops_per_step * r->world * o->accum / 1e9, need / 1e9);
}

nv_err nv_train_run(const nv_train_opts *o, const nv_dataset *ds) {
    /* every check after the agreement on the settings fails on all processes alike */
    failed_together = 0;
    train_run run = {0}, *r = &run;
    run.opts = *o;
    o = r->o = &run.opts;
    r->ds = ds;
    r->world = nv_dist_size();
    r->lead = nv_dist_rank() == 0;
    nv_err e = NV_OK;
    if (r->world > 1 && (e = agree_on_setup(o, ds))) return together(e);
    if ((e = check_settings(o, ds, r->world))) return together(e);
    r->local_batch = o->batch / r->world;
    r->lora = o->lora.rank > 0;
    r->pref = ds->pref;
    r->with_ref = r->pref && nv_pref_needs_reference(o->pref.kind);
    r->save_best_on = o->save_best || o->early_stop > 0;
    r->bt = (size_t)o->batch * o->seq;
    /* chat turns one a window, padded after their ends: a micro-batch runs only as far as its furthest
       answer (the same length on every process: each draws all the windows); a test hook runs whole
       windows, to compare */
    r->trim = ds->chat && !ds->pack && !r->pref && !o->teacher && !o->config.n_experts && !getenv("NERVE_TEST_WHOLE_WINDOWS");
    /* (a mixture's balance losses are means over every row of the windows, padding included) */
    r->quiet = o->quiet || !r->lead;
    r->tty = isatty(STDERR_FILENO) && !r->quiet;
    r->last_eval = NO_EVAL;
    if (r->world > 1)
        snprintf(r->procs, sizeof r->procs, " x %d processes (%d thread%s each)", r->world, nv_pool_threads(),
                 nv_pool_threads() == 1 ? "" : "s");
    snprintf(r->best_dir, sizeof r->best_dir, "%s/best", o->out_dir);
    snprintf(r->adapter_path, sizeof r->adapter_path, "%s/adapter.gguf", o->out_dir);
    snprintf(r->ckpt_path, sizeof r->ckpt_path, "%s/ckpt.bin", o->out_dir);
    snprintf(r->metrics_path, sizeof r->metrics_path, "%s/metrics.jsonl", o->out_dir);
    snprintf(r->svg_path, sizeof r->svg_path, "%s/loss.svg", o->out_dir);
    snprintf(r->samples_path, sizeof r->samples_path, "%s/samples.txt", o->out_dir);
    if (r->lead) e = nv_mkdirs(o->out_dir);
    if (nv_dist_max(e != NV_OK)) return together(e ? e : nv_fail(NV_EIO, "process 0 could not make %s", o->out_dir));
    /* Resume state is verified in full before anything is allocated or written (by process 0, which
       sends it to the others: only its machine needs the run folder). */
    nv_ckpt ck = {0};
    r->bhash = r->lora || r->with_ref ? base_hash(o) : 0;
    r->shash = r->lora || r->with_ref ? start_hash(o, r->bhash) : 0;
    if (r->lead) e = check_resume(o, ds->pack, r->shash, r->ckpt_path, &ck);
    if (nv_dist_max(e != NV_OK)) {
        nv_ckpt_close(&ck);
        return together(e ? e : nv_fail(NV_EINVAL, "process 0 could not start the run (its message says why)"));
    }
    double need;
    if ((e = check_memory(o, &need))) {
        nv_ckpt_close(&ck);
        return together(e);
    }
    e = run_setup(r, &ck);
    nv_ckpt_close(&ck);
    /* only now that the run starts (one refused leaves the folder as it was): an earlier run's best/
       and step-N/ go; a resumed run's step-N/ past its checkpoint (a run killed after writing them)
       go, as its metrics past it do */
    if (e == NV_OK && r->lead && !o->resume) clear_model_dir(r->best_dir);
    if (e == NV_OK && r->lead) prune_snapshots(o->out_dir, o->resume ? r->step0 : -1, o->save_limit);
    if (e == NV_OK && r->lead && r->save_best_on) e = nv_mkdirs(r->best_dir);
    if (nv_dist_max(e != NV_OK) && e == NV_OK) e = nv_fail(NV_EIO, "process 0 could not make %s", r->best_dir);
    if (e) {
        run_free(r);
        return e;
    }
    if (r->lead) write_serving_files(o->out_dir, o, ds);
    if (r->lead && r->save_best_on) write_serving_files(r->best_dir, o, ds);
    if ((e = run_open_files(r))) {
        run_free(r);
        return e;
    }
    struct sigaction sa, old_int, old_term, old_usr1;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    /* mpirun passes SIGUSR1 on to every process at once, where its Ctrl-C sends SIGTERM a second late
       and SIGKILL a second after that: the way to stop a job that checkpoints slowly */
    sigaction(SIGUSR1, &sa, &old_usr1);
    nv_train_stop_requested = 0;

    const long builds_after_setup = nv_plan_builds();
    const double t_start = nv_now();
    /* passes over the training data: the windows drawn so far against one pass's (the cursor's count,
       so a resumed run goes on counting) */
    r->epoch_windows = nv_data_epoch_windows(ds, o->seq);
    run_totals tot = {0};
    tot.windows0 = r->cur.windows;
    if (r->lead) announce(r, need);
    if (!o->resume && o->eval_every > 0) run_first_eval(r);
    /* test hooks: a pause after each step, so a test can interrupt a tiny run part way reliably; a NaN
       gradient from a given step on, so a test can watch the run stop as diverged */
    const char *delay_env = getenv("NERVE_TEST_STEP_DELAY_MS"), *nan_env = getenv("NERVE_TEST_NAN_GRAD_FROM");
    const int step_delay_ms = delay_env ? atoi(delay_env) : 0;
    /* "MS@S": the pause only from S seconds into the run, so a test can slow a run down part way */
    const char *delay_from = delay_env ? strchr(delay_env, '@') : NULL;
    const double step_delay_from_s = delay_from ? atof(delay_from + 1) : 0;
    const long nan_from = nan_env ? atol(nan_env) : 0;
    int skip_streak = 0; /* updates skipped in a row for a gradient norm that was not finite */
    long last_good = -1; /* the last step of this run whose update was made */
    char diverged_msg[4600] = "";
    /* --time-budget: when this run's first step ended (the plan times the ones after it), and the step
       and time of the latest plan, which the next corrects by the rate since (a run resumed with its
       length decided keeps it) */
    double t_first_done = 0, t_planned = 0;
    long planned_at = 0;
    int replans = r->length_decided ? NV_TRAIN_BUDGET_REPLANS : 0;
    long step0 = r->step0;
    if (o->early_stop > 0 && r->best.since >= o->early_stop) { /* resumed after stopping early: as a finished run */
        if (r->lead)
            nv_info("%s stopped early at step %ld (the %s was best at step %ld): nothing to do; a higher --early-stop trains "
                    "on",
                    r->ckpt_path, r->step0, best_metric_words[o->best_metric], r->best.step);
        step0 = o->steps;
    }
    for (long step = step0; step < o->steps; step++) {
        const double t0 = nv_now();
        const uint64_t windows_before = r->cur.windows;
        step_figures f = {0};
        f.ev = NO_EVAL;
        if ((e = step_gradients(r, &f, step))) break;
        if (nan_from > 0 && step + 1 >= nan_from) r->tm.train_grads[0] = NAN;
        step_update(r, &f);
        if (!f.no_targets) skip_streak = f.skipped ? skip_streak + 1 : 0;
        if (!f.skipped) last_good = step + 1;
        const int diverged = skip_streak >= NV_TRAIN_DIVERGED_STEPS;
        f.t_step = nv_now() - t0;
        r->tokens_seen += (int64_t)r->bt * o->accum;
        tot.forward += f.t_forward, tot.backward += f.t_backward, tot.optimizer += f.t_optimizer, tot.wait += f.t_wait;
        tot.teacher += f.t_teacher;
        tot.step += f.t_step, tot.flops += f.flops;
        tot.steps++;
        if (tot.steps == 1) t_first_done = nv_now();
        if (length_pending(r) && tot.steps >= 5 &&
            nv_dist_max(nv_now() - t_start >= 0.05 * o->time_budget_s)) {
            decide_length(r, step + 1, nv_now() - t_start, (nv_now() - t_first_done) / (double)(tot.steps - 1),
                          o->eval_every > 0 ? r->t_first_eval / o->eval_every : 0, 0);
            planned_at = step + 1, t_planned = nv_now();
        } else if (planned_at && replans < NV_TRAIN_BUDGET_REPLANS &&
                   nv_dist_max(nv_now() - t_start >= budget_replan_at(replans) * o->time_budget_s)) {
            decide_length(r, step + 1, nv_now() - t_start, (nv_now() - t_planned) / (double)(step + 1 - planned_at), 0, 1);
            replans++;
            planned_at = step + 1, t_planned = nv_now();
        }
        r->last_loss = (float)f.loss;
        const int last = step + 1 == o->steps;
        /* the step that ends a pass over the training data */
        const int epoch_end = r->epoch_windows > 0 && floor((double)r->cur.windows / r->epoch_windows) >
                                                          floor((double)windows_before / r->epoch_windows);
        if (o->eval_every > 0 && ((step + 1) % o->eval_every == 0 || last)) f.ev = run_evaluate(r, step + 1);
        if (o->full_eval && (epoch_end || last))
            f.ev.full[0] = eval_val(&r->tm, r->ds, -1, r->in, r->tg, r->trim, &f.ev.full[1]);
        /* no better evaluation in --early-stop evaluations */
        const int early = o->early_stop > 0 && !isnan(best_metric_of(&f.ev, o->best_metric)) && r->best.since >= o->early_stop;
        f.elapsed = nv_now() - t_start;
        if (r->lead) write_metrics(r, step + 1, &f);
        if (isfinite(f.loss)) series_add(&r->tr, (float)(step + 1), (float)f.loss);
        if (isfinite(f.ev.val)) series_add(&r->va, (float)(step + 1), f.ev.val);
        show_progress(r, step + 1, &f, tot.step / tot.steps, last);
        if (r->samples && ((step + 1) % o->sample_every == 0 || last)) {
            if (r->tty) fprintf(stderr, "\n"); /* the step's line stays above its sample */
            write_sample(o, &r->tm.m, step + 1, r->samples, r->quiet);
        }
        if (f.skipped && r->lead) {
            if (r->tty) fprintf(stderr, "\n");
            if (f.no_targets)
                nv_warn("step %ld: no answer token in this step's windows (their prompts fill them): update skipped; "
                        "raise --seq",
                        step + 1);
            else
                nv_warn("step %ld: the gradient norm is %g: update skipped, weights and optimizer state unchanged", step + 1,
                        f.gnorm);
        }
        if (step_delay_ms > 0 && nv_now() - t_start >= step_delay_from_s) {
            struct timespec ts = {step_delay_ms / 1000, (long)(step_delay_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
        /* a signal or the time limit on any process stops them all, after the same step */
        const int stop = (int)nv_dist_max(diverged || early || nv_train_stop_requested ||
                                          (o->time_limit_s > 0 && nv_now() - t_start >= o->time_limit_s));
        /* --save-every's weights (before the checkpoint: a run stopped between the two writes them again) */
        if (r->lead && !last && !diverged &&
            (o->save_every == NV_TRAIN_SAVE_EPOCH ? epoch_end : o->save_every > 0 && (step + 1) % o->save_every == 0))
            save_snapshot(r, step + 1);
        if (r->lead && (last || stop || (o->ckpt_every > 0 && (step + 1) % o->ckpt_every == 0)) &&
            (e = save_checkpoint(r)))
            break;
        if (diverged) { /* reported once the model is saved (whose own errors must not replace this) */
            char good[64];
            if (last_good > 0) snprintf(good, sizeof good, "step %ld, the last good update", last_good);
            else snprintf(good, sizeof good, "step %ld, where this run started", r->step0);
            snprintf(diverged_msg, sizeof diverged_msg,
                     "training diverged: the gradient norm was not finite for %d steps in a row (to step %ld), whose updates "
                     "were skipped; %.4199s holds the weights of %s: lower --lr, or check the data",
                     skip_streak, step + 1, r->ckpt_path, good);
            break;
        }
        if (stop && !last) {
            if (r->tty) fprintf(stderr, "\n");
            if (r->lead && early)
                nv_info("stopped early at step %ld: the %s has not gone %s %.4f (step %ld) in %d evaluations; checkpoint saved "
                        "to %s",
                        step + 1, best_metric_words[o->best_metric], o->best_metric == NV_BEST_VAL_LOSS ? "below" : "above",
                        (double)r->best.val, r->best.step, r->best.since, r->ckpt_path);
            else if (r->lead)
                nv_info("stopped at step %ld: checkpoint saved to %s (continue with --resume)", step + 1, r->ckpt_path);
            break;
        }
    }
    if (e == NV_OK) {
        if (r->tty) fprintf(stderr, "\n");
        const nv_engine_id used = nv_model_engine(&r->tm.m); /* before a LoRA run's merge frees the plans */
        const nv_err saved = tot.steps > 0 && r->lead ? save_final(r) : NV_OK;
        char saved_msg[1200] = "";
        if (saved != NV_OK) snprintf(saved_msg, sizeof saved_msg, "%s", nv_errmsg());
        if (tot.steps > 0) report_efficiency(r, &tot, used, nv_now() - t_start, builds_after_setup);
        /* the others leave only once process 0 has saved everything (a process that exits early could
           make the launcher end the job under it), and fail with it when it could not */
        const int save_failed = (int)nv_dist_max(saved != NV_OK);
        if (diverged_msg[0]) e = together(nv_fail(NV_ERANGE, "%s", diverged_msg));
        else if (save_failed) e = together(saved != NV_OK ? nv_fail(saved, "%s", saved_msg) : nv_fail(NV_EIO, "process 0 could not write the model"));
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGUSR1, &old_usr1, NULL);
    run_free(r);
    return e;
}
