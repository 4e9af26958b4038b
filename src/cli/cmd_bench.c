/* nerve bench <what>: dispatch and the shared row printer. */
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "cli/bench.h"
#include "cli/cli.h"
#include "engine/engine.h"

#define CMD "bench"

static const struct {
    const char *name;
    int (*fn)(int, char **, const bench_opts *);
    const char *help;
} benches[] = {
    {"train", bench_train, "ms/step, tokens/s and TFLOP/s of training steps, against PyTorch on the CPU"},
    {"matmul", bench_matmul, "GFLOP/s of one matmul plan per engine, against OpenBLAS and oneDNN (--no-peers)"},
    {"peak", bench_peak, "tile-unit and FMA peak per core and all cores, and memory read bandwidth"},
    {"cache", bench_cache, "plan throughput as the weight working set grows 0.1 -> 512 MB (--m ROWS)"},
    {"chain", bench_chain, "utilization as 1 -> 64 plans of 768x768 run back to back (--m ROWS, --max N)"},
    {"accuracy", bench_accuracy, "logit error and top-1 agreement of every engine against scalar (stories260K or --model; --kv-cache-dtype)"},
    {"generate", bench_generate, "prefill and decode tokens/s on a stories110M-shaped model, vs the bandwidth bound"},
    {"serve", bench_serve, "tokens/s, TTFT and inter-token latency of a real server with 1, 4, 16 streaming clients"},
    {"spec", bench_spec, "speculative decoding (prompt lookup, or --model-draft): tokens/s with and without drafts on a trained model, acceptance, identical texts"},
    {"preempt", bench_preempt, "preemption (TTFT of a request of a higher priority while long ones take every slot) and --kv-overcommit (tokens/s of requests ending before max_tokens), each against the server without"},
    {"prefix", bench_prefix, "TTFT of a 2,000-token shared prefix + 50 new tokens: cold, RAM hit, disk hit after a restart"},
    {"rerank", bench_rerank, "/v1/rerank documents/s of 32 documents after one query, with the prefix cache and without"},
    {"grammar", bench_grammar, "constrained decoding: the token mask per JSON state vs asking token by token (-z TOKENIZER)"},
    {"template", bench_template, "chat templates run as Jinja vs nerve's own renderers of them, per conversation length (-z TOKENIZER)"},
};

static void appendf(char *buf, size_t cap, size_t *n, const char *fmt, ...) {
    if (*n >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(buf + *n, cap - *n, fmt, ap);
    va_end(ap);
    if (w > 0) *n += (size_t)w < cap - *n ? (size_t)w : cap - *n - 1;
}

void row_begin(bench_row *r, const char *bench, const char *engine, int threads) {
    r->jn = r->tn = 0;
    r->json[0] = r->text[0] = '\0';
    appendf(r->json, sizeof r->json, &r->jn, "{\"bench\":\"%s\",\"engine\":\"%s\",\"threads\":%d", bench, engine, threads);
    appendf(r->text, sizeof r->text, &r->tn, "%-7s %-13s threads=%-2d", bench, engine, threads);
}

void row_int(bench_row *r, const char *key, long long v) {
    appendf(r->json, sizeof r->json, &r->jn, ",\"%s\":%lld", key, v);
    appendf(r->text, sizeof r->text, &r->tn, " %s=%lld", key, v);
}

void row_num(bench_row *r, const char *key, double v) {
    if (!isfinite(v)) {
        appendf(r->json, sizeof r->json, &r->jn, ",\"%s\":null", key);
        return;
    }
    appendf(r->json, sizeof r->json, &r->jn, ",\"%s\":%.6g", key, v);
    appendf(r->text, sizeof r->text, &r->tn, " %s=%.4g", key, v);
}

void row_str(bench_row *r, const char *key, const char *v) {
    appendf(r->json, sizeof r->json, &r->jn, ",\"%s\":\"", key);
    for (const char *p = v; *p; p++) {
        if (*p == '"' || *p == '\\') appendf(r->json, sizeof r->json, &r->jn, "\\%c", *p);
        else if ((unsigned char)*p < 0x20) appendf(r->json, sizeof r->json, &r->jn, " ");
        else appendf(r->json, sizeof r->json, &r->jn, "%c", *p);
    }
    appendf(r->json, sizeof r->json, &r->jn, "\"");
    appendf(r->text, sizeof r->text, &r->tn, " %s=%s", key, v);
}

void row_end(bench_row *r, const bench_opts *o) {
    if (o->json) printf("%s}\n", r->json);
    else printf("%s\n", r->text);
    fflush(stdout);
}

static void usage(FILE *f) {
    fprintf(f, "usage: nerve bench <what> [--json] [--threads N] [--engine E] [--quick] [options]\n\n");
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        fprintf(f, "  %-9s %s\n", benches[i].name, benches[i].help);
}

int cmd_bench(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    bench_opts o = {0};
    const char *name = argv[1];
    /* common flags are taken out; the rest goes to the subcommand (compacted in place after argv[1]) */
    int n = 2;
    char **rest = argv;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) o.json = 1;
        else if (!strcmp(argv[i], "--quick")) o.quick = 1;
        else if (!strcmp(argv[i], "--threads")) {
            const char *v = cli_value(CMD, argc, argv, &i);
            if (!v || !cli_int(CMD, "--threads", v, 1, 1024, &o.threads)) return 2;
        } else if (!strcmp(argv[i], "--engine")) {
            const char *v = cli_value(CMD, argc, argv, &i);
            nv_engine_id e;
            if (!v) return 2;
            if (nv_engine_parse(v, &e) != NV_OK) return cli_error(CMD, 2, "%s", nv_errmsg());
            o.engine = v;
        } else rest[n++] = argv[i];
    }
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        if (!strcmp(name, benches[i].name)) return benches[i].fn(n - 1, rest + 1, &o);
    return cli_error(CMD, 2, "unknown benchmark '%s' (see nerve bench --help)", name);
}
