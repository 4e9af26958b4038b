/* nerve batch: a file of requests answered offline, as vLLM's run-batch and OpenAI's Batch API do.
 * The input is OpenAI's batch input (JSON Lines of {"custom_id", "method": "POST", "url", "body"});
 * every request goes to a server of this process's own (nerve serve's, on 127.0.0.1 at a free port
 * with a random key: cli_serve_run), `--parallel` at a time, so continuous batching runs them
 * together and each answer is exactly what `nerve serve` gives that body; the output is OpenAI's
 * batch output ({"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}),
 * a line per request in the input's order. The whole input is checked before the model loads. The
 * output is written to OUT.partial and renamed over OUT at the end or on SIGINT/SIGTERM (with the
 * requests answered by then), so an OUT is never half a line; --resume keeps the successful
 * answers an OUT holds and runs the rest. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/file.h"
#include "base/log.h"
#include "base/net.h"
#include "base/timer.h"
#include "cli/cli.h"
#include "serve/api.h"
#include "serve/batchfile.h"

#define CMD "batch"
#define MAX_WORKERS 1024


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
            "                       written whole at the end or on SIGINT/SIGTERM (F.partial until then)\n"
            "                       Or Anthropic's Message Batches: {\"custom_id\", \"params\": the /v1/messages request}\n"
            "                       lines, answered {\"custom_id\", \"result\": {\"type\": \"succeeded\", \"message\"} or\n"
            "                       {\"type\": \"errored\", \"error\"}} (a file holds one format)\n"
            "  --parallel N         requests sent at once (default: twice --max-batch, so a freed slot has one waiting)\n"
            "  --resume             F exists: keep its successful answers (status 2xx) and run the other requests\n"
            "                       (without it an existing F is refused)\n"
            "The requests run on a server of this process's own (127.0.0.1, a free port, a random key): every\n"
            "option of nerve serve but --host, --port, --api-key(-file), --ssl-* and --cors applies (see\n"
            "nerve serve --help). A request answered with an error status is written with it and counted; the\n"
            "exit status is 0 when every request was answered, 1 when the run failed, 130 when interrupted.\n");
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
    char *done; /* [set->n]: 1 where a 2xx answer is kept */
    FILE *out;  /* the kept lines are copied here */
    int kept, dropped;
} resume_ctx;

static int resume_line(void *ctx, char *line, int no) {
    resume_ctx *r = ctx;
    int at, ok;
    if (nv_batch_output_line(r->set, line, &at, &ok) != NV_OK)
        return cli_error(CMD, 1, "%s:%d: %s (--resume keeps the answers an output holds)", r->path, no, nv_errmsg());
    if (!ok || r->done[at]) {
        r->dropped++;
        return 0;
    }
    r->done[at] = 1, r->kept++;
    return fprintf(r->out, "%s\n", line) < 0 ? cli_error(CMD, 1, "cannot write: %s", strerror(errno)) : 0;
}

/* ---- running ---------------------------------------------------------------------------------------- */

typedef struct {
    const nv_batch_set *set;
    int parallel; /* 0: twice the server's --max-batch */
    int tty;
    /* the requests still to run: indices into set */
    int *todo, n_todo;
    char auth[128]; /* the Authorization header line */
    int port;
    float timeout;
    pthread_mutex_t mu;
    int next_take, next_write;
    char **results; /* [n_todo] output lines, NULL until answered (then freed once written) */
    FILE *out;
    int write_error;
    atomic_int stop; /* 1: take no more requests; 2: abandon those running */
    int fds[MAX_WORKERS];
    int answered, failed;
    double prompt_tokens, completion_tokens;
    double t0, last_shown;
} batch_run;

/* The prompt and completion tokens an answer's body reports (chat/completions and embeddings, or the
 * Responses API's input and output tokens) into usage[0], usage[1]. */
static void usage_of(const cJSON *body, double usage[2]) {
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(body, "usage");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens"), *c = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
    if (!p) p = cJSON_GetObjectItemCaseSensitive(u, "input_tokens");
    if (!c) c = cJSON_GetObjectItemCaseSensitive(u, "output_tokens");
    usage[0] = cJSON_IsNumber(p) ? p->valuedouble : 0.0;
    usage[1] = cJSON_IsNumber(c) ? c->valuedouble : 0.0;
}

/* The output line of request r, answered (status > 0, body its text) or not (why); *ok: a 2xx, whose
 * usage goes to usage; NULL when out of memory. */
static char *result_line(const nv_batch_req *r, int status, const char *body, const char *why, int *ok, double usage[2]) {
    cJSON *o = cJSON_CreateObject(), *ans = status > 0 ? cJSON_Parse(body) : NULL;
    if (r->anthropic) { /* Message Batches: {"custom_id", "result": {"type": "succeeded", "message"} or errored} */
        *ok = status >= 200 && status < 300 && ans;
        cJSON_AddStringToObject(o, "custom_id", r->custom_id);
        cJSON *res = cJSON_AddObjectToObject(o, "result");
        cJSON_AddStringToObject(res, "type", *ok ? "succeeded" : "errored");
        if (*ok) {
            usage_of(ans, usage);
            cJSON_AddItemToObject(res, "message", ans);
        } else { /* the server's Anthropic-shaped error's own object, or one saying what happened */
            cJSON *err = cJSON_DetachItemFromObjectCaseSensitive(ans, "error");
            if (!cJSON_IsObject(err)) {
                cJSON_Delete(err);
                err = cJSON_CreateObject();
                cJSON_AddStringToObject(err, "type", "api_error");
                cJSON_AddStringToObject(err, "message", status > 0 ? "the server's answer was not JSON" : why);
            }
            cJSON_AddItemToObject(res, "error", err);
            cJSON_Delete(ans);
        }
        char *line = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        return line;
    }
    char id[64], rid[64];
    nv_api_new_id(id, sizeof id, "batch_req_");
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "custom_id", r->custom_id);
    *ok = status >= 200 && status < 300;
    if (status > 0) {
        const cJSON *aid = cJSON_GetObjectItemCaseSensitive(ans, "id");
        if (cJSON_IsString(aid)) snprintf(rid, sizeof rid, "%.63s", aid->valuestring);
        else nv_api_new_id(rid, sizeof rid, "req_");
        if (*ok) usage_of(ans, usage);
        cJSON *resp = cJSON_AddObjectToObject(o, "response");
        cJSON_AddNumberToObject(resp, "status_code", status);
        cJSON_AddStringToObject(resp, "request_id", rid);
        if (ans) cJSON_AddItemToObject(resp, "body", ans);
        else cJSON_AddStringToObject(resp, "body", body); /* not JSON: kept as text */
        cJSON_AddNullToObject(o, "error");
    } else {
        cJSON_AddNullToObject(o, "response");
        cJSON *e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "code", "request_failed");
        cJSON_AddStringToObject(e, "message", why);
    }
    char *line = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return line;
}

/* Sends request r and waits for its whole answer; a 429 (the server's queue full) is sent again.
 * Returns its output line, or NULL when abandoned (a second signal) or out of memory. */
static char *run_one(batch_run *b, int w, const nv_batch_req *r, int *ok, double usage[2]) {
    for (int attempt = 0;; attempt++) {
        size_t len;
        char *req = nv_http_request_text("POST", r->url, b->auth, r->body, &len);
        if (!req) return NULL;
        const int fd = nv_loopback_connect(b->port, (int)b->timeout + 60);
        pthread_mutex_lock(&b->mu);
        const int abandoned = atomic_load(&b->stop) >= 2;
        if (!abandoned) b->fds[w] = fd;
        pthread_mutex_unlock(&b->mu);
        nv_http_answer a = {0};
        int got = 0;
        if (fd >= 0 && !abandoned && nv_send_all(fd, req, len)) {
            char *raw;
            size_t n;
            got = nv_recv_all(fd, &raw, &n) && nv_http_answer_parse(raw, n, &a);
            free(raw);
        }
        free(req);
        pthread_mutex_lock(&b->mu);
        b->fds[w] = -1;
        pthread_mutex_unlock(&b->mu);
        if (fd >= 0) close(fd);
        if (atomic_load(&b->stop) >= 2 || abandoned) {
            nv_http_answer_free(&a);
            return NULL;
        }
        if (got && a.status == 429 && !atomic_load(&b->stop)) { /* the queue is full: wait a little */
            nv_http_answer_free(&a);
            struct timespec ts = {0, (attempt < 20 ? 10 + attempt * 10 : 200) * 1000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        char *line = result_line(r, got ? a.status : 0, got ? a.body : "", got ? "" : "no answer came from the server", ok, usage);
        nv_http_answer_free(&a);
        return line;
    }
}

/* Writes the answered lines that follow the written ones in order (under mu); final: every
 * answered line, past those never answered. */
static void write_ready(batch_run *b, int final) {
    for (; b->next_write < b->n_todo; b->next_write++) {
        char *line = b->results[b->next_write];
        if (!line && !final) break;
        if (!line) continue;
        if (!b->write_error && fprintf(b->out, "%s\n", line) < 0) b->write_error = errno ? errno : EIO;
        free(line);
        b->results[b->next_write] = NULL;
    }
}

/* How far the batch is: a terminal's line redrawn twice a second, a log's (stderr not a terminal) a
 * line every 30 s (the summary ends either). */
static void show_progress(batch_run *b, int final) {
    const double now = nv_now(), dt = now - b->t0;
    if (final ? !b->tty : now - b->last_shown < (b->tty ? 0.5 : 30.0)) return;
    b->last_shown = now;
    fprintf(stderr, "%snerve batch: %d/%d answered (%d with an error), %.0f completion tokens/s%s", b->tty ? "\r" : "", b->answered,
            b->n_todo, b->failed, dt > 0 ? b->completion_tokens / dt : 0.0, final || !b->tty ? "\n" : "   ");
    fflush(stderr);
}

static void *worker_main(void *arg) {
    batch_run *b = ((void **)arg)[0];
    const int w = (int)(intptr_t)((void **)arg)[1];
    for (;;) {
        pthread_mutex_lock(&b->mu);
        if (atomic_load(&b->stop) || b->next_take >= b->n_todo) {
            pthread_mutex_unlock(&b->mu);
            break;
        }
        const int i = b->next_take++;
        pthread_mutex_unlock(&b->mu);
        int ok = 0;
        double usage[2] = {0, 0};
        char *line = run_one(b, w, &b->set->reqs[b->todo[i]], &ok, usage);
        pthread_mutex_lock(&b->mu);
        if (line) {
            b->results[i] = line;
            b->answered++;
            b->failed += !ok;
            b->prompt_tokens += usage[0], b->completion_tokens += usage[1];
            write_ready(b, 0);
            show_progress(b, 0);
        }
        pthread_mutex_unlock(&b->mu);
    }
    return NULL;
}

static int batch_job(void *ctx, int port, int max_batch, int max_queue, float timeout_s) {
    batch_run *b = ctx;
    b->port = port, b->timeout = timeout_s;
    int workers = b->parallel ? b->parallel : 2 * max_batch;
    if (workers > max_batch + max_queue) workers = max_batch + max_queue; /* more would only meet 429s */
    if (workers > b->n_todo) workers = b->n_todo;
    if (workers > MAX_WORKERS) workers = MAX_WORKERS;
    if (workers < 1) workers = 1;
    for (int w = 0; w < MAX_WORKERS; w++) b->fds[w] = -1;
    pthread_t th[MAX_WORKERS];
    void *args[MAX_WORKERS][2];
    int started = 0;
    b->t0 = b->last_shown = nv_now();
    for (int w = 0; w < workers; w++) {
        args[w][0] = b, args[w][1] = (void *)(intptr_t)w;
        if (pthread_create(&th[w], NULL, worker_main, args[w]) != 0) break;
        started++;
    }
    if (!started) return cli_error(CMD, 1, "cannot start a thread");
    for (int w = 0; w < started; w++) pthread_join(th[w], NULL);
    write_ready(b, 1);
    show_progress(b, 1);
    return 0;
}

static void batch_interrupt(void *ctx, int level) {
    batch_run *b = ctx;
    atomic_store(&b->stop, level);
    if (level == 1)
        fprintf(stderr, "\nnerve batch: interrupted: finishing the requests running (a second signal abandons them)\n");
    if (level < 2) return;
    pthread_mutex_lock(&b->mu);
    for (int w = 0; w < MAX_WORKERS; w++) /* the server sees each connection go and ends its request */
        if (b->fds[w] >= 0) shutdown(b->fds[w], SHUT_RDWR);
    pthread_mutex_unlock(&b->mu);
}

/* OUT.partial fsynced and renamed over OUT (its folder synced): 1, or 0 after saying why. */
static int commit_output(FILE *f, const char *tmp, const char *path) {
    int ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    if (ok && rename(tmp, path) != 0) ok = 0;
    if (!ok) {
        cli_error(CMD, 1, "cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        return 0;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, ".");
    FILE *d = fopen(dir, "r");
    if (d) fsync(fileno(d)), fclose(d);
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
        else if (!cli_int(CMD, a, v, 1, MAX_WORKERS, &parallel)) {
            free(pass);
            return 2;
        }
    }
    if (!in_path || !out_path) {
        free(pass);
        return cli_error(CMD, 2, "-i REQUESTS.jsonl and -o RESULTS.jsonl are required (see nerve batch --help)");
    }

    nv_batch_set set;
    char *in_text = NULL, *out_text = NULL, *done = NULL, tmp[4200];
    batch_run b = {.set = &set, .parallel = parallel, .tty = isatty(STDERR_FILENO)};
    int rc = 1;
    FILE *out = NULL;
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
    const int out_exists = nv_file_exists(out_path);
    if (out_exists && !resume) {
        cli_error(CMD, 1, "%s exists: --resume keeps its answers and runs the other requests, or choose another -o", out_path);
        goto end;
    }
    snprintf(tmp, sizeof tmp, "%s.partial", out_path);
    if (!(out = fopen(tmp, "w"))) {
        cli_error(CMD, 1, "cannot write %s: %s", tmp, strerror(errno));
        goto end;
    }
    resume_ctx rc_ctx = {.path = out_path, .set = &set, .done = done, .out = out};
    if (out_exists) {
        if (!cli_read_text(CMD, "-o", out_path, &out_text, NULL)) goto end;
        if (nv_batch_for_lines(out_text, resume_line, &rc_ctx) != 0) goto end;
        nv_info("batch: %s: %d answers kept, %d to run again", out_path, rc_ctx.kept, rc_ctx.dropped);
    }
    if (!(b.todo = malloc((size_t)set.n * sizeof *b.todo)) || !(b.results = calloc((size_t)set.n, sizeof *b.results))) goto end;
    for (int i = 0; i < set.n; i++)
        if (!done[i]) b.todo[b.n_todo++] = i;
    b.out = out;
    if (b.n_todo) {
        char key[64];
        nv_api_new_id(key, sizeof key, "nv-batch-");
        snprintf(b.auth, sizeof b.auth, "Authorization: Bearer %s\r\n", key);
        pthread_mutex_init(&b.mu, NULL);
        cli_serve_job job = {.cmd = CMD, .api_key = key, .ctx = &b, .run = batch_job, .interrupt = batch_interrupt};
        pass[n_pass] = NULL;
        rc = cli_serve_run(n_pass, pass, &job);
        pthread_mutex_destroy(&b.mu);
        explicit_bzero(key, sizeof key);
        explicit_bzero(b.auth, sizeof b.auth);
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
    const int missing = b.n_todo - b.answered;
    fprintf(stderr,
            "nerve batch: %d request%s answered (%d with an error) in %.1f s: %.0f prompt and %.0f completion tokens, "
            "%.0f completion tokens/s; %s%s\n",
            b.answered, b.answered == 1 ? "" : "s", b.failed, dt, b.prompt_tokens, b.completion_tokens,
            dt > 0 ? b.completion_tokens / dt : 0.0, out_path, rc_ctx.kept ? " (with the answers it held)" : "");
    if (missing > 0 && atomic_load(&b.stop)) {
        fprintf(stderr, "nerve batch: interrupted: %d request%s not run; --resume runs them\n", missing, missing == 1 ? "" : "s");
        rc = 130;
    } else if (missing > 0) {
        cli_error(CMD, 1, "%d requests were not answered; --resume runs them", missing);
        rc = 1;
    }
end:
    if (out) {
        fclose(out);
        unlink(tmp);
    }
    for (int i = 0; b.results && i < set.n; i++) free(b.results[i]);
    free(b.results);
    free(b.todo);
    free(done);
    free(in_text);
    free(out_text);
    nv_batch_set_free(&set);
    free(pass);
    return rc;
}
