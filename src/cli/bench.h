/* nerve bench: measured figures, side by side with peers measured in the same run.
 *
 * Each subcommand prints a readable table, or with --json one JSON object per measured row
 * (JSON Lines) with the fields of ../shared/design.md "Benchmarks": bench, engine, threads, the
 * shape fields that apply, the figures that apply, and ok:false with why for a peer that could
 * not be measured. */
#ifndef NV_BENCH_H
#define NV_BENCH_H

#include <stdio.h>

#include "model/forward.h"
#include "model/model.h"

typedef struct {
    int json;
    int threads;    /* 0 = every core */
    int quick;      /* fewer repeats and smaller shapes, for tests */
    const char *engine; /* restrict to one engine, or NULL */
} bench_opts;

/* One result row: fields are appended with the row_* helpers, then row_end prints it. */
typedef struct {
    char json[2048];
    char text[1024];
    size_t jn, tn;
} bench_row;

void row_begin(bench_row *r, const char *bench, const char *engine, int threads);
void row_int(bench_row *r, const char *key, long long v);
void row_num(bench_row *r, const char *key, double v);
void row_str(bench_row *r, const char *key, const char *v);
void row_end(bench_row *r, const bench_opts *o);

int bench_train(int argc, char **argv, const bench_opts *o);
int bench_matmul(int argc, char **argv, const bench_opts *o);   /* bench_engine.c */
int bench_peak(int argc, char **argv, const bench_opts *o);
int bench_cache(int argc, char **argv, const bench_opts *o);
int bench_chain(int argc, char **argv, const bench_opts *o);
int bench_accuracy(int argc, char **argv, const bench_opts *o); /* bench_model.c */
int bench_generate(int argc, char **argv, const bench_opts *o);
int bench_serve(int argc, char **argv, const bench_opts *o);  /* bench_serve.c */
int bench_prefix(int argc, char **argv, const bench_opts *o);
int bench_preempt(int argc, char **argv, const bench_opts *o);
int bench_rerank(int argc, char **argv, const bench_opts *o);
int bench_spec(int argc, char **argv, const bench_opts *o);   /* bench_serve.c */
int bench_grammar(int argc, char **argv, const bench_opts *o); /* bench_grammar.c */
int bench_template(int argc, char **argv, const bench_opts *o); /* bench_template.c */

/* Helpers of the engine and model benches (bench_engine.c). */
/* The thread counts to measure: --threads N alone, else 1 and every core. Returns how many. */
int bench_thread_list(const bench_opts *o, int *out);
/* Whether engine e (an nv_engine_id) gets rows: --engine E alone, else every engine but scalar. */
int bench_engine_wanted(const bench_opts *o, int e);
/* A bench's one option, -z TOKENIZER, into *tok_path (left as it was when absent): 0, or the exit code. */
int bench_tokenizer_arg(const char *cmd, int argc, char **argv, const char **tok_path);
/* Appends ok:false and why to a row. */
void row_fail(bench_row *r, const char *why);
/* Median seconds of fn(ctx) after one warm-up call, over at least min_reps calls and min_s seconds
 * (at most 1000 calls); *reps gets the count (may be NULL). */
double bench_median(void (*fn)(void *), void *ctx, int min_reps, double min_s, int *reps);
/* Seconds to prefill prompt[0..n) into s in chunks from position 0, -1 when a forward fails
 * (bench_model.c; nerve tune times its prefills with it too). */
double bench_prefill_s(const nv_model *m, nv_state *s, const int *prompt, int n, int chunk);
/* count uniform values in [-scale, scale) from seed (caller frees), NULL when out of memory. */
float *bench_rand(size_t count, float scale, unsigned long long seed);

#endif
