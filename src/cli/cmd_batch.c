/* nerve batch: a file of requests answered offline, as vLLM's run-batch and OpenAI's Batch API do.
 * The input is OpenAI's batch input (JSON Lines of {"custom_id", "method": "POST", "url", "body"});
 * every request goes to a server of this process's own (nerve serve's, on 127.0.0.1 at a free port
 * with a random key: cli_serve_run), `--parallel` at a time, so continuous batching runs them
 * together and each answer is exactly what `nerve serve` gives that body; the output is OpenAI's
 * batch output ({"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}),
 * a line per request in the input's order. The whole input is checked before the model loads. The
 * output is written to OUT.partial, a line as each answer comes (in order), and renamed over OUT at
 * the end or on SIGINT/SIGTERM/SIGHUP (with the requests answered by then), so an OUT is never half
 * a line; --resume keeps the successful answers an OUT holds, and those of an OUT.partial a run
 * killed outright left, and runs the rest. */
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log.h"
#include "base/net.h"
#include "base/timer.h"
#include "cli/cli.h"
#include "serve/api.h"
#include "serve/batchrun.h"

#define CMD "batch"


static void usage(FILE *f) {
    fprintf(f,
            "usage: nerve batch -m MODEL [-z TOKENIZER] -i REQUESTS.jsonl -o RESULTS.jsonl [--parallel N] [--resume]\n"
            "                   [nerve serve's model, engine, batching and cache options]\n"
            "  -i, --input-file F   OpenAI's batch input: a JSON object a line, {\"custom_id\": a unique string,\n"
            "                       \"method\": \"POST\", \"url\": one of /v1/chat/completions, /v1/completions,\n"
            "                       /v1/embeddings, /v1/responses, \"body\": the request}; checked whole first\n"
            "  -o, --output-file F  OpenAI's batch output, a line per request in the input's order: {\"id\",\n"
            "                       \"custom_id\", \"response\": {\"status_code\", \"request_id\", \"body\": the\n"
            "                       answer}, \"error\": null} (\"response\": null and an \"error\" when no answer came);\n"
            "                       written whole at the end or on SIGINT/SIGTERM/SIGHUP (F.partial until then,\n"
            "                       a line as each answer comes)\n"
            "                       Or Anthropic's Message Batches: {\"custom_id\", \"params\": the /v1/messages request}\n"
            "                       lines, answered {\"custom_id\", \"result\": {\"type\": \"succeeded\", \"message\"} or\n"
            "                       {\"type\": \"errored\", \"error\"}} (a file holds one format)\n"
            "  --parallel N         requests sent at once (default: twice --max-batch, so a freed slot has one waiting)\n"
            "  --resume             keep the successful answers (status 2xx) F holds, and F.partial (a run killed\n"
            "                       outright), and run the other requests (without it an existing F or F.partial\n"
            "                       is refused)\n"
            "The requests run on a server of this process's own (127.0.0.1, a free port, a random key): every\n"
            "option of nerve serve but --host, --port, --api-key(-file), --ssl-* and --cors applies (see\n"
            "nerve serve --help). A request answered with an error status is written with it and counted; the\n"
            "exit status is 0 when every request was answered, 1 when the run failed, 130 when interrupted.\n"
            "The same files run on a live server too: nerve serve --files-dir DIR answers OpenAI's Files and Batch\n"
            "APIs and Anthropic's Message Batches, a batch's requests queued behind interactive ones.\n");
}

typedef struct {
    const char *path;
    nv_batch_set *set;
    int errors;
} check_ctx;

/* One input line checked and, when well formed, added to the set; the first ten bad lines said. */
static int check_line(void *ctx, char *line, int no) {
    check_ctx *c = ctx;
    const nv_err e = nv_batch_add_line(c->set, line, no);
    if (e == NV_ENOMEM) return cli_error(CMD, 1, "%s: %s", c->path, nv_errmsg());
    if (e != NV_OK && ++c->errors <= 10) fprintf(stderr, "nerve " CMD ": %s:%d: %s\n", c->path, no, nv_errmsg());
    return 0;
}

/* ---- resuming: the answers a former output holds -------------------------------------------------- */

typedef struct {
    const char *path;
    const nv_batch_set *set;
    char *done;  /* [set->n]: 1 where a 2xx answer is kept */
    nv_buf kept_lines; /* the kept lines, each with its line break */
    int kept, dropped;
} resume_ctx;

static int resume_line(void *ctx, char *line, int no) {
    resume_ctx *r = ctx;
    int at, ok;
    if (nv_batch_output_line(r->set, line, &at, &ok) != NV_OK)
        return cli_error(CMD, 1, "%s:%d: %s (--resume keeps the answers an output holds)", r->path, no, nv_errmsg());
    if (r->done[at]) return 0; /* (answered already: a .partial holds the OUT answers its run kept) */
    if (!ok) {
        r->dropped++;
        return 0;
    }
    r->done[at] = 1, r->kept++;
    nv_buf_append(&r->kept_lines, line, strlen(line));
    nv_buf_append(&r->kept_lines, "\n", 1);
    return r->kept_lines.oom ? cli_error(CMD, 1, "out of memory") : 0;
}

/* ---- running ---------------------------------------------------------------------------------------- */

typedef struct {
    nv_batch_runner run;
    int parallel; /* 0: twice the server's --max-batch */
    int tty;
    int next_write;
    char **results; /* [n_todo] output lines, NULL until answered (then freed once written) */
    FILE *out;
    int write_error;
    int answered, failed;
    double prompt_tokens, completion_tokens;
    double t0, last_shown;
} batch_run;

/* Writes the answered lines that follow the written ones in order (under the runner's lock); final:
 * every answered line, past those never answered. */
static void write_ready(batch_run *b, int final) {
    int wrote = 0;
    for (; b->next_write < b->run.n_todo; b->next_write++) {
        char *line = b->results[b->next_write];
        if (!line && !final) break;
        if (!line) continue;
        if (!b->write_error && fprintf(b->out, "%s\n", line) < 0) b->write_error = errno ? errno : EIO;
        wrote = 1;
        free(line);
        b->results[b->next_write] = NULL;
    }
    /* in the file as they come: a run killed outright leaves them for --resume (OUT.partial) */
    if (wrote && !b->write_error && fflush(b->out) != 0) b->write_error = errno ? errno : EIO;
}

/* How far the batch is: a terminal's line redrawn twice a second, a log's (stderr not a terminal) a
 * line every 30 s (the summary ends either). */
static void show_progress(batch_run *b, int final) {
    const double now = nv_now(), dt = now - b->t0;
    if (final ? !b->tty : now - b->last_shown < (b->tty ? 0.5 : 30.0)) return;
    b->last_shown = now;
    fprintf(stderr, "%snerve batch: %d/%d answered (%d with an error), %.0f completion tokens/s%s", b->tty ? "\r" : "", b->answered,
            b->run.n_todo, b->failed, dt > 0 ? b->completion_tokens / dt : 0.0, final || !b->tty ? "\n" : "   ");
    fflush(stderr);
}

static void on_result(void *ctx, int k, char *line, int status, int ok, const double usage[2]) {
    (void)status;
    batch_run *b = ctx;
    b->results[k] = line;
    b->answered++;
    b->failed += !ok;
    b->prompt_tokens += usage[0], b->completion_tokens += usage[1];
    write_ready(b, 0);
    show_progress(b, 0);
}

static int batch_job(void *ctx, int port, int max_batch, int max_queue, float timeout_s) {
    batch_run *b = ctx;
    b->run.port = port, b->run.timeout_s = timeout_s;
    int workers = b->parallel ? b->parallel : 2 * max_batch;
    if (workers > max_batch + max_queue) workers = max_batch + max_queue; /* more would only meet 429s */
    b->run.workers = workers;
    b->t0 = b->last_shown = nv_now();
    if (nv_batch_run(&b->run) != 0) return cli_error(CMD, 1, "cannot start a thread");
    write_ready(b, 1);
    show_progress(b, 1);
    return 0;
}

static void batch_interrupt(void *ctx, int level) {
    batch_run *b = ctx;
    if (level == 1)
        fprintf(stderr, "\nnerve batch: interrupted: finishing the requests running (a second signal abandons them)\n");
    nv_batch_run_stop(&b->run, level);
}

/* OUT.partial fsynced and renamed over OUT (its folder synced): 1, or 0 after saying why. */
static int commit_output(FILE *f, const char *tmp, const char *path) {
    int ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    if (ok && rename(tmp, path) != 0) ok = 0;
    if (!ok) { /* (tmp holds the answers: --resume takes them) */
        cli_error(CMD, 1, "cannot write %s: %s (its answers wait in %s for --resume)", path, strerror(errno), tmp);
        return 0;
    }
    nv_file_sync_parent(path);
    return 1;
}

int cmd_batch(int argc, char **argv) {
    const char *in_path = NULL, *out_path = NULL;
    int parallel = 0, resume = 0;
    char **pass = calloc((size_t)argc + 1, sizeof *pass);
    if (!pass) return cli_error(CMD, 1, "out of memory");
    int n_pass = 0;
    pass[n_pass++] = argv[0];
    static const char *const not_here[] = {"--host",          "--port",         "--api-key",      "--api-key-file", "--ssl-key-file",
                                           "--ssl-cert-file", "--ssl-keyfile",  "--ssl-certfile", "--cors"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            free(pass);
            return 0;
        }
        for (size_t k = 0; k < sizeof not_here / sizeof *not_here; k++)
            if (!strcmp(a, not_here[k])) {
                free(pass);
                return cli_error(CMD, 2, "%s: the batch's server is this process's own (127.0.0.1, a free port, a random key)", a);
            }
        if (cli_switch(a, "--resume", &resume, 1)) continue;
        if (strcmp(a, "-i") && strcmp(a, "--input-file") && strcmp(a, "-o") && strcmp(a, "--output-file") && strcmp(a, "--parallel")) {
            pass[n_pass++] = argv[i]; /* nerve serve's, checked by it */
            continue;
        }
        if (!(v = cli_value(CMD, argc, argv, &i))) {
            free(pass);
            return 2;
        }
        if (!strcmp(a, "-i") || !strcmp(a, "--input-file")) in_path = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--output-file")) out_path = v;
        else if (!cli_int(CMD, a, v, 1, NV_BATCH_MAX_WORKERS, &parallel)) {
            free(pass);
            return 2;
        }
    }
    if (!in_path || !out_path) {
        free(pass);
        return cli_error(CMD, 2, "-i REQUESTS.jsonl and -o RESULTS.jsonl are required (see nerve batch --help)");
    }

    nv_batch_set set;
    char *in_text = NULL, *out_text = NULL, *partial_text = NULL, *done = NULL, tmp[4200];
    batch_run b = {.run = {.set = &set, .on_result = on_result}, .parallel = parallel, .tty = isatty(STDERR_FILENO)};
    int *todo = NULL;
    int rc = 1, partial_exists = 0;
    FILE *out = NULL;
    resume_ctx rc_ctx = {.set = &set};
    if (nv_batch_set_init(&set) != NV_OK) {
        free(pass);
        return cli_error(CMD, 1, "out of memory");
    }
    if (!cli_read_text(CMD, "-i", in_path, &in_text, NULL)) goto end; /* (a NUL byte refused) */
    check_ctx cc = {.path = in_path, .set = &set};
    if (nv_batch_for_lines(in_text, check_line, &cc) != 0) goto end;
    if (cc.errors) {
        if (cc.errors > 10) fprintf(stderr, "nerve " CMD ": %s: %d more lines like these\n", in_path, cc.errors - 10);
        cli_error(CMD, 1, "%s: %d of its lines are not requests of a batch; nothing was run", in_path, cc.errors);
        goto end;
    }
    if (!set.n) {
        cli_error(CMD, 1, "%s holds no requests", in_path);
        goto end;
    }
    if (!(done = calloc((size_t)set.n, 1))) goto end;
    rc_ctx.done = done;
    const int out_exists = nv_file_exists(out_path);
    snprintf(tmp, sizeof tmp, "%s.partial", out_path);
    partial_exists = nv_file_exists(tmp);
    if (out_exists && !resume) {
        cli_error(CMD, 1, "%s exists: --resume keeps its answers and runs the other requests, or choose another -o", out_path);
        goto end;
    }
    if (partial_exists && !resume) {
        cli_error(CMD, 1, "%s holds the answers of a run that did not end: --resume keeps them and runs the other requests (remove it to start afresh)",
                  tmp);
        goto end;
    }
    /* the answers kept: a stopped run's OUT.partial (its whole lines: the last may be cut), then OUT's */
    if (partial_exists) {
        if (!cli_read_text(CMD, "-o", tmp, &partial_text, NULL)) goto end;
        char *end_of_whole = strrchr(partial_text, '\n');
        *(end_of_whole ? end_of_whole + 1 : partial_text) = '\0';
        rc_ctx.path = tmp;
        if (nv_batch_for_lines(partial_text, resume_line, &rc_ctx) != 0) goto end;
    }
    if (out_exists) {
        if (!cli_read_text(CMD, "-o", out_path, &out_text, NULL)) goto end;
        rc_ctx.path = out_path;
        if (nv_batch_for_lines(out_text, resume_line, &rc_ctx) != 0) goto end;
    }
    if (out_exists || partial_exists)
        nv_info("batch: %s%s: %d answers kept, %d to run again", out_path, partial_exists ? " and its .partial" : "", rc_ctx.kept,
                rc_ctx.dropped);
    /* OUT.partial holds the kept answers (written whole: a run killed meanwhile finds it as it was),
       the new ones added as they come */
    if (partial_exists || rc_ctx.kept) {
        const nv_iov part = {rc_ctx.kept_lines.data ? rc_ctx.kept_lines.data : "", rc_ctx.kept_lines.len};
        if (nv_file_write_atomic(tmp, &part, 1) != NV_OK) {
            cli_error(CMD, 1, "%s", nv_errmsg());
            goto end;
        }
    }
    if (!(out = fopen(tmp, partial_exists || rc_ctx.kept ? "a" : "w"))) {
        cli_error(CMD, 1, "cannot write %s: %s", tmp, strerror(errno));
        goto end;
    }
    if (!(todo = malloc((size_t)set.n * sizeof *todo)) || !(b.results = calloc((size_t)set.n, sizeof *b.results))) goto end;
    for (int i = 0; i < set.n; i++)
        if (!done[i]) todo[b.run.n_todo++] = i;
    b.run.todo = todo, b.run.ctx = &b;
    b.out = out;
    if (b.run.n_todo) {
        char key[64];
        nv_api_new_id(key, sizeof key, "nv-batch-");
        nv_batch_runner_init(&b.run, key);
        cli_serve_job job = {.cmd = CMD, .api_key = key, .ctx = &b, .run = batch_job, .interrupt = batch_interrupt};
        pass[n_pass] = NULL;
        rc = cli_serve_run(n_pass, pass, &job);
        nv_batch_runner_free(&b.run);
        explicit_bzero(key, sizeof key);
        /* a server that did not start ran nothing: the former output stays as it was */
        if (!b.answered && rc != 0) goto end;
    } else
        nv_info("batch: every request of %s has its answer in %s", in_path, out_path);
    if (b.write_error) {
        cli_error(CMD, 1, "cannot write %s: %s", tmp, strerror(b.write_error));
        rc = 1;
        goto end;
    }
    const int ok_out = commit_output(out, tmp, out_path);
    out = NULL;
    if (!ok_out) {
        rc = 1;
        goto end;
    }
    const double dt = b.t0 > 0 ? nv_now() - b.t0 : 0;
    const int missing = b.run.n_todo - b.answered;
    fprintf(stderr,
            "nerve batch: %d request%s answered (%d with an error) in %.1f s: %.0f prompt and %.0f completion tokens, "
            "%.0f completion tokens/s; %s%s\n",
            b.answered, b.answered == 1 ? "" : "s", b.failed, dt, b.prompt_tokens, b.completion_tokens,
            dt > 0 ? b.completion_tokens / dt : 0.0, out_path, rc_ctx.kept ? " (with the answers it held)" : "");
    if (missing > 0 && atomic_load(&b.run.stop)) {
        fprintf(stderr, "nerve batch: interrupted: %d request%s not run; --resume runs them\n", missing, missing == 1 ? "" : "s");
        rc = 130;
    } else if (missing > 0) {
        cli_error(CMD, 1, "%d requests were not answered; --resume runs them", missing);
        rc = 1;
    }
end:
    if (out) {
        fclose(out);
        /* none answered: OUT.partial goes unless it was a killed run's (OUT keeps its own answers);
           else its answers wait there for --resume */
        if (!b.answered && !partial_exists) unlink(tmp);
    }
    nv_buf_free(&rc_ctx.kept_lines);
    free(partial_text);
    for (int i = 0; b.results && i < set.n; i++) free(b.results[i]);
    free(b.results);
    free(todo);
    free(done);
    free(in_text);
    free(out_text);
    nv_batch_set_free(&set);
    free(pass);
    return rc;
}
