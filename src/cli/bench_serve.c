/* nerve bench serve / nerve bench prefix: end-to-end serving figures from a real server.
 *
 * Both start `nerve serve` (this very binary) as a child process on a loopback port, on a model
 * made for the purpose by `nerve init` (stories110M shape, 4096-token context; --quick: the
 * stories260K shape) in a temporary folder, and drive it with streamed requests from a small
 * HTTP client written here over plain sockets: time to first token (TTFT) is from sending the
 * request to the first generated text, inter-token latency (ITL) the gaps between streamed text
 * events. Prompts are random token ids (the weights are random too: speed does not depend on
 * either).
 *
 * serve:  N concurrent clients x M requests each, for N = 1, 4, 16: one row per N with
 *         tokens_per_s (completion tokens / wall time, prefill included), decode_tokens_per_s
 *         (N x the median per-request decode rate, (tokens - 1) / (last - first token)),
 *         ttft_ms_p50/p99, itl_ms_p50/p99, and ratio_vs: decode_tokens_per_s against N = 1
 *         (target: >= 6 at N = 16). --kv-cache-dtype and --kv-memory go to the server.
 * prefix: TTFT of a shared prefix plus new tokens, one row per case: cold (first sight), ram
 *         (the same prefix again), disk (again, after a server restart, with the block files
 *         dropped from the page cache so they are read from the device); ratio_vs = the case's
 *         TTFT / cold's (targets: ram <= 0.05, disk <= 0.10). */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/cpu.h"
#include "base/net.h"
#include "base/file.h"
#include "base/rng.h"
#include "base/timer.h"
#include "cli/bench.h"
#include "cli/cli.h"
#include "model/batch.h"
#include "model/gguf.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/sampler.h"
#include "model/tokenizer.h"

/* ---- the child server -------------------------------------------------------------------------- */

typedef struct {
    pid_t pid;
    int port;
    char engine[64];
    char log[4200];
} child;

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static int self_exe(char *buf, size_t cap) {
    ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
    if (n <= 0) return 0;
    buf[n] = '\0';
    return 1;
}

/* Runs argv (NULL-terminated) with output to log; returns the exit code (-1 when it did not run). */
static int run_wait(char *const *argv, const char *log) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644), in = open("/dev/null", O_RDONLY);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
        if (in >= 0) dup2(in, 0);
        execv(argv[0], argv);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Starts `nerve serve -m model -z tok --port 0 args...` and waits for its start line. */
static int child_start(child *c, const char *exe, const char *model, const char *tok, char **args, int n_args,
                       const char *log, char *why, size_t cap) {
    memset(c, 0, sizeof *c);
    snprintf(c->log, sizeof c->log, "%s", log);
    unlink(log);
    char *argv[64];
    int k = 0;
    argv[k++] = (char *)exe;
    argv[k++] = "serve";
    argv[k++] = "-m";
    argv[k++] = (char *)model;
    argv[k++] = "-z";
    argv[k++] = (char *)tok;
    argv[k++] = "--port";
    argv[k++] = "0";
    for (int i = 0; i < n_args && k < 63; i++) argv[k++] = args[i];
    argv[k] = NULL;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, cap, "fork: %s", strerror(errno));
        return 0;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* the server goes when the bench goes */
        if (getppid() != parent) _exit(1);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644), in = open("/dev/null", O_RDONLY);
        if (fd >= 0) dup2(fd, 2);
        if (in >= 0) dup2(in, 0), dup2(in, 1);
        setenv("NERVE_LOG", "warn", 1); /* no access lines */
        execv(exe, argv);
        _exit(127);
    }
    c->pid = pid;
    for (double t0 = nv_now(); nv_now() - t0 < 900;) {
        char *text = NULL;
        if (nv_file_read_all(log, &text, NULL) == NV_OK && text) {
            const char *p = strstr(text, "listening on http://127.0.0.1:");
            if (p) c->port = atoi(p + strlen("listening on http://127.0.0.1:"));
            const char *e = strstr(text, "engine ");
            if (e) sscanf(e + 7, "%63[^,)]", c->engine);
        }
        free(text);
        if (c->port > 0) return 1;
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            c->pid = 0;
            char *t = NULL;
            nv_file_read_all(log, &t, NULL);
            snprintf(why, cap, "the server did not start: %.300s", t ? t : "");
            free(t);
            return 0;
        }
        sleep_s(0.05);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    c->pid = 0;
    snprintf(why, cap, "the server did not start within 900 s");
    return 0;
}

/* SIGTERM and wait (the SSD writer finishes its queue); 0 on a clean exit. */
static int child_stop(child *c) {
    if (!c->pid) return -1;
    kill(c->pid, SIGTERM);
    for (double t0 = nv_now(); nv_now() - t0 < 120; sleep_s(0.02)) {
        int st;
        if (waitpid(c->pid, &st, WNOHANG) == c->pid) {
            c->pid = 0;
            return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
        }
    }
    kill(c->pid, SIGKILL);
    waitpid(c->pid, NULL, 0);
    c->pid = 0;
    return -1;
}

/* ---- the HTTP client ------------------------------------------------------------------------------ */

/* a request as base/net.h writes it, sent whole */
static int send_req(int fd, const char *method, const char *path, const char *body) {
    size_t len;
    char *req = nv_http_request_text(method, path, NULL, body, &len);
    const int ok = req && nv_send_all(fd, req, len);
    free(req);
    return ok;
}

typedef struct {
    char *p;
    size_t len, cap;
} gbuf;

static int gb_add(gbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 8192;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return 0;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 1;
}

/* One streamed request's timings (and its text, when text is set). */
typedef struct {
    int status, tokens, cached, done;
    double t_send, t_first, t_last; /* t_first 0: no text came */
    double *gaps;
    int n_gaps, cap_gaps;
    gbuf *text;
} sresult;

static void on_event(sresult *r, const char *data, double now) {
    if (!strcmp(data, "[DONE]")) {
        r->done = 1;
        return;
    }
    cJSON *root = cJSON_Parse(data);
    if (!root) return;
    const cJSON *ch = cJSON_GetObjectItem(root, "choices"), *c0 = cJSON_GetArrayItem(ch, 0);
    const cJSON *t = c0 ? cJSON_GetObjectItem(c0, "text") : NULL;
    const cJSON *f = c0 ? cJSON_GetObjectItem(c0, "finish_reason") : NULL;
    int text = cJSON_IsString(t) && t->valuestring[0];
    if (text && r->text) gb_add(r->text, t->valuestring, strlen(t->valuestring));
    if (text || (cJSON_IsString(f) && !r->t_first)) { /* a token (or the end of a stream without text) */
        if (!r->t_first) r->t_first = now;
        else if (text) {
            if (r->n_gaps == r->cap_gaps) {
                int cap = r->cap_gaps ? r->cap_gaps * 2 : 256;
                double *g = realloc(r->gaps, (size_t)cap * sizeof *g);
                if (g) r->gaps = g, r->cap_gaps = cap;
            }
            if (r->n_gaps < r->cap_gaps) r->gaps[r->n_gaps++] = now - r->t_last;
        }
        if (text) r->t_last = now;
    }
    const cJSON *u = cJSON_GetObjectItem(root, "usage");
    if (cJSON_IsObject(u)) {
        const cJSON *ct = cJSON_GetObjectItem(u, "completion_tokens");
        const cJSON *cached = cJSON_GetObjectItem(cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens");
        if (cJSON_IsNumber(ct)) r->tokens = ct->valueint;
        if (cJSON_IsNumber(cached)) r->cached = cached->valueint;
    }
    cJSON_Delete(root);
}

/* POSTs a streamed completion and times its events as they arrive (chunked transfer decoded on
 * the fly). 1 when the stream ended with [DONE]. */
static int stream_post(int port, const char *body, sresult *r) {
    gbuf *text = r->text;
    memset(r, 0, sizeof *r);
    r->text = text;
    int fd = nv_loopback_connect(port, 900);
    if (fd < 0) return 0;
    r->t_send = nv_now();
    if (!send_req(fd, "POST", "/v1/completions", body)) {
        close(fd);
        return 0;
    }
    gbuf raw = {0}, sse = {0};
    size_t rp = 0, sp = 0, left = 0;
    int in_body = 0, chunked = 0, want_size = 1, want_crlf = 0;
    char buf[65536];
    for (;;) {
        ssize_t k = recv(fd, buf, sizeof buf, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        double now = nv_now();
        if (!gb_add(&raw, buf, (size_t)k)) break;
        if (!in_body) {
            char *sep = strstr(raw.p, "\r\n\r\n");
            if (!sep) continue;
            *sep = '\0';
            sscanf(raw.p, "HTTP/1.%*d %d", &r->status);
            chunked = strcasestr(raw.p, "Transfer-Encoding: chunked") != NULL;
            rp = (size_t)(sep - raw.p) + 4;
            in_body = 1;
        }
        /* body bytes raw[rp..) -> sse */
        while (rp < raw.len) {
            if (!chunked) {
                gb_add(&sse, raw.p + rp, raw.len - rp);
                rp = raw.len;
            } else if (want_crlf) {
                if (raw.len - rp < 2) break;
                rp += 2;
                want_crlf = 0;
                want_size = 1;
            } else if (want_size) {
                char *crlf = strstr(raw.p + rp, "\r\n");
                if (!crlf) break;
                left = strtoul(raw.p + rp, NULL, 16);
                rp = (size_t)(crlf - raw.p) + 2;
                want_size = 0;
                if (left == 0) rp = raw.len; /* the last chunk */
            } else {
                size_t n = raw.len - rp < left ? raw.len - rp : left;
                gb_add(&sse, raw.p + rp, n);
                rp += n;
                left -= n;
                if (!left) want_crlf = 1;
            }
        }
        /* complete events */
        for (char *e; sse.p && (e = strstr(sse.p + sp, "\n\n"));) {
            *e = '\0';
            if (!strncmp(sse.p + sp, "data: ", 6)) on_event(r, sse.p + sp + 6, now);
            sp = (size_t)(e - sse.p) + 2;
        }
    }
    close(fd);
    if (r->status != 200 && raw.p && !r->status) sscanf(raw.p, "HTTP/1.%*d %d", &r->status);
    free(raw.p);
    free(sse.p);
    return r->status == 200 && r->done;
}

/* ---- helpers -------------------------------------------------------------------------------------- */

/* {"prompt":[ids],"max_tokens":k,...,"stream":true} with n random ids after BOS. */
/* A streamed completion of ids; head NULL, or the fields that choose its model or adapters
 * ("\"model\":\"lora1\"," or a "lora" list, with the comma): none, the server's base model. */
static char *prompt_body(const int *ids, int n, int max_tokens, uint64_t seed, const char *head) {
    size_t cap = (size_t)n * 8 + 640;
    char *b = malloc(cap);
    if (!b) return NULL;
    size_t len = (size_t)snprintf(b, cap, "{%.200s\"prompt\":[", head ? head : "");
    for (int i = 0; i < n; i++) len += (size_t)snprintf(b + len, cap - len, i ? ",%d" : "%d", ids[i]);
    snprintf(b + len, cap - len,
             "],\"max_tokens\":%d,\"temperature\":1,\"seed\":%llu,\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true}}",
             max_tokens, (unsigned long long)seed);
    return b;
}

static void random_ids(int *ids, int n, int vocab, uint64_t seed) {
    uint64_t st = seed * 0x9E3779B97F4A7C15ull + 1;
    ids[0] = 1; /* BOS */
    for (int i = 1; i < n; i++) ids[i] = 3 + (int)(nv_xorshift_u32(&st) % (uint32_t)(vocab - 3));
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of v[0..n) (sorted in place); NAN when empty. */
static double pct(double *v, int n, double p) {
    if (n <= 0) return 0.0 / 0.0;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    int i = (int)(p * n + 0.999999) - 1;
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb, (void)flag, (void)f;
    remove(p);
    return 0;
}

static void rm_tree(const char *dir) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

typedef struct {
    char dir[512];
    char model[700], tok[4096], exe[4096];
    int vocab;
} setup;

/* A temporary folder with a fresh model of the preset (or the given one) and its tokenizer. */
static int bench_setup(setup *s, const bench_opts *o, const char *model, const char *tok, int seq_len, char *why,
                       size_t cap) {
    memset(s, 0, sizeof *s);
    if (!self_exe(s->exe, sizeof s->exe)) {
        snprintf(why, cap, "cannot find this program's path");
        return 0;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(s->dir, sizeof s->dir, "%s/nerve-bench-serve-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(s->dir)) {
        snprintf(why, cap, "cannot create a temporary folder: %s", strerror(errno));
        return 0;
    }
    const char *preset = o->quick ? "stories260K" : "stories110M";
    if (tok) snprintf(s->tok, sizeof s->tok, "%s", tok);
    else if (!nv_data_path(o->quick ? "models/tok512.bin" : "tokenizers/tokenizer.bin", s->tok, sizeof s->tok)) {
        snprintf(why, cap, "tokenizer %.400s not found in the shared data (pass -z)", s->tok);
        return 0;
    }
    if (model) {
        snprintf(s->model, sizeof s->model, "%s", model);
    } else {
        snprintf(s->model, sizeof s->model, "%s/model.bin", s->dir);
        char seq[16], log[700];
        snprintf(seq, sizeof seq, "%d", seq_len);
        snprintf(log, sizeof log, "%s/init.log", s->dir);
        char *argv[] = {s->exe, "init", "--preset", (char *)preset, "--seq-len", seq, "-o", s->model, NULL};
        if (run_wait(argv, log) != 0) {
            char *t = NULL;
            nv_file_read_all(log, &t, NULL);
            snprintf(why, cap, "nerve init failed: %.300s", t ? t : "");
            free(t);
            return 0;
        }
    }
    nv_config mc; /* the vocabulary size, from any model file the server reads (llama2.c, GGUF) */
    if (nv_model_read_config(s->model, &mc) != NV_OK) {
        snprintf(why, cap, "%s", nv_errmsg());
        return 0;
    }
    s->vocab = mc.vocab_size;
    if (s->vocab < 16) {
        snprintf(why, cap, "cannot read the vocabulary size of %s", s->model);
        return 0;
    }
    return 1;
}

static void add_arg(char **args, int *n, const char *a) { args[(*n)++] = (char *)a; }

/* The server's arguments every bench adds: threads, engine. */
static void common_args(char **args, int *n, const bench_opts *o, char *threads_buf) {
    if (o->threads) {
        snprintf(threads_buf, 16, "%d", o->threads);
        add_arg(args, n, "--threads");
        add_arg(args, n, threads_buf);
    }
    if (o->engine) {
        add_arg(args, n, "--engine");
        add_arg(args, n, o->engine);
    }
}

static void fail_row(const char *bench, const char *why, const bench_opts *o, int threads) {
    bench_row r;
    row_begin(&r, bench, "nerve", threads);
    r.jn += (size_t)snprintf(r.json + r.jn, sizeof r.json - r.jn, ",\"ok\":false");
    row_str(&r, "why", why);
    row_end(&r, o);
}

/* --clients 1,4,16: up to 8 counts of 1..max into clients; 0 after printing why. */
static int parse_clients(const char *cmd, const char *v, int max, int clients[8], int *n) {
    *n = 0;
    for (const char *p = v; *p && *n < 8;) {
        char *end;
        long c = strtol(p, &end, 10);
        if (end == p || c < 1 || c > max || (*end && *end != ','))
            return !cli_error(cmd, 2, "--clients expects a list like 1,4,16 (each 1 to %d)", max);
        clients[(*n)++] = (int)c;
        p = *end == ',' ? end + 1 : end;
    }
    return 1;
}

/* ---- bench serve ---------------------------------------------------------------------------------- */

typedef struct {
    int port, requests, prompt, tokens, vocab, client;
    sresult *res; /* [requests] */
    int ok;
    const char *head; /* the fields choosing its requests' model or adapters (prompt_body's; NULL: none) */
} client_job;

static void *client_main(void *arg) {
    client_job *j = arg;
    int *ids = malloc((size_t)j->prompt * sizeof *ids);
    j->ok = ids != NULL;
    for (int i = 0; ids && i < j->requests; i++) {
        uint64_t seed = (uint64_t)j->client * 1000 + (uint64_t)i + 17;
        random_ids(ids, j->prompt, j->vocab, seed);
        char *body = prompt_body(ids, j->prompt, j->tokens, seed, j->head);
        if (!body || !stream_post(j->port, body, &j->res[i])) j->ok = 0;
        free(body);
    }
    free(ids);
    return NULL;
}

/* n clients (client_main) started together: the wall time until the last ends, and whether every
 * request succeeded. */
typedef struct {
    client_job *jobs;
    int n, ok;
    double wall;
} clients_run;

static void *run_clients(void *arg) {
    clients_run *cr = arg;
    pthread_t *th = calloc((size_t)cr->n, sizeof *th);
    cr->ok = th != NULL;
    double t0 = nv_now();
    for (int c = 0; th && c < cr->n; c++) pthread_create(&th[c], NULL, client_main, &cr->jobs[c]);
    for (int c = 0; th && c < cr->n; c++) pthread_join(th[c], NULL), cr->ok &= cr->jobs[c].ok;
    cr->wall = nv_now() - t0;
    free(th);
    return NULL;
}

/* The clients' results, freed. */
static void free_clients(client_job *jobs, int n) {
    for (int c = 0; c < n; c++) {
        for (int i = 0; i < jobs[c].requests; i++) free(jobs[c].res[i].gaps);
        free(jobs[c].res);
    }
}

#define MAX_BENCH_ADAPTERS 16

typedef struct {
    const child *srv;
    const setup *su;
    const bench_opts *o;
    int threads, requests, prompt, tokens;
    const char *kv_dtype;
} serve_run;

/* n concurrent clients, each sending its requests one after another, client c's choosing its model or
 * adapters by heads[c % n_heads] (prompt_body's; none when n_heads is 0); one row, ratio_vs the decode
 * rate against ref (0: none; negative: its own). Returns the row's decode_tokens_per_s, negative when
 * a request failed. */
static double serve_row(const serve_run *sr, int n, const char *const *heads, int n_heads, const char *label, double ref,
                        const char *ratio_of) {
    client_job *jobs = calloc((size_t)n, sizeof *jobs);
    const int requests = sr->requests;
    for (int c = 0; c < n; c++)
        jobs[c] = (client_job){sr->srv->port, requests, sr->prompt, sr->tokens, sr->su->vocab, c + 100 * n,
                               calloc((size_t)requests, sizeof(sresult)), 0, n_heads ? heads[c % n_heads] : NULL};
    clients_run cr = {jobs, n, 0, 0};
    run_clients(&cr);
    const int all = cr.ok;
    const double wall = cr.wall;
    int n_req = n * requests, n_gaps = 0;
    long total_tokens = 0;
    for (int c = 0; c < n; c++)
        for (int i = 0; i < requests; i++) n_gaps += jobs[c].res[i].n_gaps;
    double *ttft = calloc((size_t)n_req, sizeof *ttft), *rate = calloc((size_t)n_req, sizeof *rate);
    double *gaps = calloc((size_t)(n_gaps ? n_gaps : 1), sizeof *gaps);
    int nt = 0, nr = 0, ng = 0;
    for (int c = 0; c < n; c++)
        for (int i = 0; i < requests; i++) {
            sresult *r = &jobs[c].res[i];
            total_tokens += r->tokens;
            if (r->t_first > 0) ttft[nt++] = r->t_first - r->t_send;
            if (r->tokens > 1 && r->t_last > r->t_first) rate[nr++] = (r->tokens - 1) / (r->t_last - r->t_first);
            for (int g = 0; g < r->n_gaps; g++) gaps[ng++] = r->gaps[g];
        }
    double decode = n * pct(rate, nr, 0.5);
    bench_row row;
    row_begin(&row, "serve", sr->srv->engine[0] ? sr->srv->engine : "nerve", sr->threads);
    row_str(&row, "model", label);
    row_str(&row, "kv_dtype", sr->kv_dtype);
    row_int(&row, "clients", n);
    row_int(&row, "requests", n_req);
    row_int(&row, "prompt", sr->prompt);
    row_int(&row, "max_tokens", sr->tokens);
    if (!all) {
        row.jn += (size_t)snprintf(row.json + row.jn, sizeof row.json - row.jn, ",\"ok\":false");
        row_str(&row, "why", "a request failed");
    }
    row_int(&row, "completion_tokens", total_tokens);
    row_num(&row, "tokens_per_s", total_tokens / wall);
    row_num(&row, "decode_tokens_per_s", decode);
    row_num(&row, "ttft_ms_p50", pct(ttft, nt, 0.5) * 1e3);
    row_num(&row, "ttft_ms_p99", pct(ttft, nt, 0.99) * 1e3);
    row_num(&row, "itl_ms_p50", pct(gaps, ng, 0.5) * 1e3);
    row_num(&row, "itl_ms_p99", pct(gaps, ng, 0.99) * 1e3);
    if (ref < 0) ref = decode;
    if (ref > 0) {
        row_num(&row, "ratio_vs", decode / ref);
        row_str(&row, "ratio_of", ratio_of);
    }
    row_end(&row, sr->o);
    free_clients(jobs, n);
    free(jobs);
    free(ttft);
    free(rate);
    free(gaps);
    return all ? decode : -1;
}

/* k random adapters (rank r, every matrix, B small and not zero) for the model in su, written
 * into its folder as lora1.gguf...; their names (lora1...) in names[k] and their --lora-modules
 * words in words[k] (NAME=PATH). */
static int write_bench_adapters(const setup *su, int k, int r, char names[][16], char words[][800], char *why, size_t cap) {
    nv_config c;
    if (nv_model_read_config(su->model, &c) != NV_OK) {
        snprintf(why, cap, "%s", nv_errmsg());
        return 0;
    }
    const nv_lora_shape s = {r, 2.0f * (float)r, NV_LORA_ALL};
    if (nv_lora_validate(&c, &s) != NV_OK) {
        snprintf(why, cap, "%s", nv_errmsg());
        return 0;
    }
    const uint64_t n = nv_lora_param_count(&c, &s);
    float *p = malloc((size_t)n * sizeof(float));
    if (!p) {
        snprintf(why, cap, "out of memory for the adapters");
        return 0;
    }
    int ok = 1;
    for (int i = 0; i < k && ok; i++) {
        nv_lora_init_nonzero(&c, &s, p, (uint64_t)i + 1, 0.01f);
        char path[700];
        snprintf(path, sizeof path, "%s/lora%d.gguf", su->dir, i + 1);
        snprintf(names[i], 16, "lora%d", i + 1);
        snprintf(words[i], 800, "%.15s=%.700s", names[i], path);
        if (nv_gguf_save_lora(&c, &s, p, path) != NV_OK) {
            snprintf(why, cap, "%s", nv_errmsg());
            ok = 0;
        }
    }
    free(p);
    return ok;
}

int bench_serve(int argc, char **argv, const bench_opts *o) {
    const char *CMD = "bench serve", *model = NULL, *tok = NULL;
    int requests = 2, prompt = o->quick ? 8 : 32, tokens = o->quick ? 16 : 128;
    int clients[8] = {1, 4, 16}, n_clients = 3, lora_rank = 0, n_adapters = 4;
    const char *kv_dtype = "f16", *kv_memory = NULL, *swa_cache = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!(v = cli_value(CMD, argc, argv, &i))) return 2;
        if (!strcmp(a, "--requests")) { if (!cli_int(CMD, a, v, 1, 1000, &requests)) return 2; }
        else if (!strcmp(a, "--prompt")) { if (!cli_int(CMD, a, v, 2, 100000, &prompt)) return 2; }
        else if (!strcmp(a, "--tokens")) { if (!cli_int(CMD, a, v, 1, 100000, &tokens)) return 2; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "-z")) tok = v;
        else if (!strcmp(a, "--kv-memory")) kv_memory = v; /* checked by the server */
        else if (!strcmp(a, "--swa-cache")) swa_cache = v; /* checked by the server */
        else if (!strcmp(a, "--lora-rank")) { if (!cli_int(CMD, a, v, 1, 1024, &lora_rank)) return 2; }
        else if (!strcmp(a, "--adapters")) { if (!cli_int(CMD, a, v, 1, MAX_BENCH_ADAPTERS, &n_adapters)) return 2; }
        else if (!strcmp(a, "--kv-cache-dtype")) {
            nv_kv_dtype t;
            if (!cli_kv_dtype(CMD, a, v, &t)) return 2;
            kv_dtype = v;
        } else if (!strcmp(a, "--clients")) {
            if (!parse_clients(CMD, v, 256, clients, &n_clients)) return 2;
        } else
            return cli_error(CMD, 2,
                             "unknown option '%s' (--clients LIST, --requests M, --prompt N, --tokens N, -m MODEL, -z TOK, "
                             "--kv-cache-dtype T, --kv-memory SIZE, --swa-cache auto|full|window, --lora-rank R, --adapters K)",
                             a);
    }
    int threads = o->threads ? o->threads : nv_cpu_probe()->cores, max_clients = 1;
    for (int i = 0; i < n_clients; i++) max_clients = clients[i] > max_clients ? clients[i] : max_clients;
    char why[1024] = "";
    setup su;
    static char words[MAX_BENCH_ADAPTERS][800], adapter_names[MAX_BENCH_ADAPTERS][16];
    if (!bench_setup(&su, o, model, tok, o->quick ? 512 : 4096, why, sizeof why) ||
        (lora_rank && !write_bench_adapters(&su, n_adapters, lora_rank, adapter_names, words, why, sizeof why))) {
        fail_row("serve", why, o, threads);
        if (su.dir[0]) rm_tree(su.dir);
        return 1;
    }
    char *args[32 + 2 * MAX_BENCH_ADAPTERS], kvdir[700], mb[16], th[16], log[700];
    int na = 0;
    snprintf(kvdir, sizeof kvdir, "%s/kv", su.dir);
    snprintf(mb, sizeof mb, "%d", max_clients);
    snprintf(log, sizeof log, "%s/serve.log", su.dir);
    add_arg(args, &na, "--max-batch");
    add_arg(args, &na, mb);
    add_arg(args, &na, "--kv-cache-dir");
    add_arg(args, &na, kvdir);
    add_arg(args, &na, "--kv-cache-dtype");
    add_arg(args, &na, kv_dtype);
    if (kv_memory) {
        add_arg(args, &na, "--kv-memory");
        add_arg(args, &na, kv_memory);
    }
    if (swa_cache) {
        add_arg(args, &na, "--swa-cache");
        add_arg(args, &na, swa_cache);
    }
    char rank_arg[16];
    snprintf(rank_arg, sizeof rank_arg, "%d", lora_rank);
    if (lora_rank) {
        add_arg(args, &na, "--max-lora-rank");
        add_arg(args, &na, rank_arg);
    }
    for (int i = 0; lora_rank && i < n_adapters; i++) {
        add_arg(args, &na, "--lora-modules");
        add_arg(args, &na, words[i]);
    }
    common_args(args, &na, o, th);
    child srv;
    if (!child_start(&srv, su.exe, su.model, su.tok, args, na, log, why, sizeof why)) {
        fail_row("serve", why, o, threads);
        rm_tree(su.dir);
        return 1;
    }
    const char *model_name = o->quick ? "stories260K" : "stories110M";
    if (model) model_name = model;
    /* warm-up: the weights paged in, the first step's allocations done */
    {
        client_job w = {srv.port, 1, prompt, tokens < 4 ? tokens : 4, su.vocab, 999, calloc(1, sizeof(sresult)), 0, NULL};
        client_main(&w);
        free(w.res[0].gaps);
        free(w.res);
    }
    const serve_run sr = {&srv, &su, o, threads, requests, prompt, tokens, kv_dtype};
    /* each client names one adapter as its model; or mixes two at 0.5 each with a lora list */
    static char named[MAX_BENCH_ADAPTERS][64], mixed[MAX_BENCH_ADAPTERS][96];
    const char *by_name[MAX_BENCH_ADAPTERS], *by_list[MAX_BENCH_ADAPTERS];
    for (int i = 0; i < n_adapters; i++) {
        snprintf(named[i], sizeof named[i], "\"model\":\"%s\",", adapter_names[i]);
        snprintf(mixed[i], sizeof mixed[i], "\"lora\":[{\"id\":%d,\"scale\":0.5},{\"id\":%d,\"scale\":0.5}],", i,
                 (i + 1) % n_adapters);
        by_name[i] = named[i], by_list[i] = mixed[i];
    }
    char label[600], mix_label[600];
    snprintf(label, sizeof label, "%.400s + %d LoRA adapters of rank %d (the clients' requests spread over them)", model_name,
             n_adapters, lora_rank);
    snprintf(mix_label, sizeof mix_label, "%.400s + %d LoRA adapters of rank %d, two at 0.5 each per request (lora lists)", model_name,
             n_adapters, lora_rank);
    int rc = 0;
    double base_decode = 0;
    for (int ci = 0; ci < n_clients; ci++) {
        const int n = clients[ci];
        const double d = serve_row(&sr, n, NULL, 0, model_name, ci == 0 && n == 1 ? -1 : base_decode, "clients=1 decode_tokens_per_s");
        if (d < 0) rc = 1;
        if (ci == 0 && n == 1) base_decode = d > 0 ? d : 0;
        /* the same clients, each naming an adapter: the cost of serving them unmerged */
        if (lora_rank && serve_row(&sr, n, by_name, n_adapters, label, d > 0 ? d : 0,
                                   "the base model's decode_tokens_per_s, same clients") < 0)
            rc = 1;
        if (lora_rank && n_adapters > 1 &&
            serve_row(&sr, n, by_list, n_adapters, mix_label, d > 0 ? d : 0, "the base model's decode_tokens_per_s, same clients") < 0)
            rc = 1;
    }
    if (child_stop(&srv) != 0) rc = 1;
    rm_tree(su.dir);
    return rc;
}

/* ---- bench prefix --------------------------------------------------------------------------------- */

/* Drops the block files from the page cache (written back first), so a restart reads the device. */
static void drop_page_cache(const char *root) {
    DIR *d = opendir(root);
    for (struct dirent *de; d && (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        char sub[1200];
        snprintf(sub, sizeof sub, "%s/%s", root, de->d_name);
        DIR *m = opendir(sub);
        for (struct dirent *f; m && (f = readdir(m));) {
            if (f->d_name[0] == '.') continue;
            char p[1500];
            snprintf(p, sizeof p, "%s/%s", sub, f->d_name);
            int fd = open(p, O_RDONLY);
            if (fd < 0) continue;
            fdatasync(fd);
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
        }
        if (m) closedir(m);
    }
    if (d) closedir(d);
}

/* TTFT of one request (max_tokens 1) of ids; cached tokens in *cached. Negative on failure. */
static double ttft_of(int port, const int *ids, int n, int *cached) {
    char *body = prompt_body(ids, n, 1, 7, NULL);
    sresult r = {0};
    int ok = body && stream_post(port, body, &r);
    free(body);
    free(r.gaps);
    *cached = r.cached;
    return ok && r.t_first > 0 ? r.t_first - r.t_send : -1;
}

int bench_prefix(int argc, char **argv, const bench_opts *o) {
    const char *CMD = "bench prefix", *model = NULL, *tok = NULL;
    int prefix = o->quick ? 400 : 2000, fresh = o->quick ? 20 : 50, reps = o->quick ? 2 : 3, keep_cache = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (cli_switch(a, "--keep-page-cache", &keep_cache, 1)) continue;
        if (!(v = cli_value(CMD, argc, argv, &i))) return 2;
        if (!strcmp(a, "--prefix")) { if (!cli_int(CMD, a, v, 16, 1 << 20, &prefix)) return 2; }
        else if (!strcmp(a, "--new")) { if (!cli_int(CMD, a, v, 1, 1 << 20, &fresh)) return 2; }
        else if (!strcmp(a, "--reps")) { if (!cli_int(CMD, a, v, 1, 100, &reps)) return 2; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "-z")) tok = v;
        else
            return cli_error(CMD, 2, "unknown option '%s' (--prefix N, --new N, --reps R, --keep-page-cache, -m MODEL, -z TOK)", a);
    }
    int threads = o->threads ? o->threads : nv_cpu_probe()->cores;
    int n = prefix + fresh, seq_len = 1024;
    while (seq_len < n + 2) seq_len *= 2;
    if (!o->quick && seq_len < 4096) seq_len = 4096;
    char why[1024] = "";
    setup su;
    if (!bench_setup(&su, o, model, tok, seq_len, why, sizeof why)) {
        fail_row("prefix", why, o, threads);
        if (su.dir[0]) rm_tree(su.dir);
        return 1;
    }
    const char *model_name = model ? model : o->quick ? "stories260K" : "stories110M";
    char *args[32], kvdir[700], th[16], log[700];
    int na = 0;
    snprintf(kvdir, sizeof kvdir, "%s/kv", su.dir);
    add_arg(args, &na, "--kv-cache-dir");
    add_arg(args, &na, kvdir);
    common_args(args, &na, o, th);
    int *ids = malloc((size_t)n * sizeof *ids), *warm = malloc(64 * sizeof *warm);
    double *t_cold = calloc((size_t)reps, sizeof(double)), *t_ram = calloc((size_t)reps, sizeof(double));
    double *t_disk = calloc((size_t)reps, sizeof(double));
    int cached[3] = {1 << 30, 1 << 30, 1 << 30}, cold_cached = 0, rc = 0, c;
    child srv;
    snprintf(log, sizeof log, "%s/serve1.log", su.dir);
    if (!ids || !warm || !t_cold || !t_ram || !t_disk) {
        snprintf(why, sizeof why, "out of memory");
        goto fail;
    }
    for (int phase = 0; phase < 2; phase++) {
        if (phase == 1) snprintf(log, sizeof log, "%s/serve2.log", su.dir);
        if (!child_start(&srv, su.exe, su.model, su.tok, args, na, log, why, sizeof why)) goto fail;
        random_ids(warm, 64, su.vocab, 999 + (uint64_t)phase); /* warm-up, sharing nothing */
        if (ttft_of(srv.port, warm, 64, &c) < 0) {
            snprintf(why, sizeof why, "the warm-up request failed");
            child_stop(&srv);
            goto fail;
        }
        for (int r = 0; r < reps; r++) {
            random_ids(ids, prefix, su.vocab, 100 + (uint64_t)r); /* the shared prefix */
            /* new tokens: a different tail per case */
            for (int k = 0; k < (phase == 0 ? 2 : 1); k++) {
                int tail_seed = phase == 0 ? k : 2;
                uint64_t st = (uint64_t)(r * 10 + tail_seed + 1) * 0x2545F4914F6CDD1Dull;
                for (int i = prefix; i < n; i++) ids[i] = 3 + (int)(nv_xorshift_u32(&st) % (uint32_t)(su.vocab - 3));
                double t = ttft_of(srv.port, ids, n, &c);
                if (t < 0) {
                    snprintf(why, sizeof why, "a request failed");
                    child_stop(&srv);
                    goto fail;
                }
                int cs = phase == 0 ? k : 2;
                (cs == 0 ? t_cold : cs == 1 ? t_ram : t_disk)[r] = t;
                if (cs == 0) cold_cached += c;
                else if (c < cached[cs]) cached[cs] = c;
            }
        }
        if (phase == 0) { /* every block on disk before the restart */
            for (double t0 = nv_now(); nv_now() - t0 < 600 && nv_loopback_metric(srv.port, "nerve_prefix_disk_write_queue_depth") != 0;)
                sleep_s(0.05);
        }
        if (child_stop(&srv) != 0) {
            snprintf(why, sizeof why, "the server did not stop cleanly");
            goto fail;
        }
        if (phase == 0 && !keep_cache) drop_page_cache(kvdir);
    }
    const char *names[3] = {"cold", "ram", "disk"};
    double *times[3] = {t_cold, t_ram, t_disk}, cold = pct(t_cold, reps, 0.5) * 1e3;
    const double targets[3] = {0, 0.05, 0.10};
    for (int k = 0; k < 3; k++) {
        double ms = pct(times[k], reps, 0.5) * 1e3;
        bench_row row;
        row_begin(&row, "prefix", srv.engine[0] ? srv.engine : "nerve", threads);
        row_str(&row, "model", model_name);
        row_str(&row, "case", names[k]);
        row_int(&row, "seq", n);
        row_int(&row, "prefix", prefix);
        row_int(&row, "reps", reps);
        row_int(&row, "cached_tokens", k == 0 ? cold_cached / reps : cached[k]);
        row_num(&row, "ttft_ms_p50", ms);
        row_num(&row, "ttft_ms_p99", pct(times[k], reps, 0.99) * 1e3);
        if (k > 0) {
            row_num(&row, "ratio_vs", ms / cold);
            row_str(&row, "ratio_of", "cold");
            row_num(&row, "target_ratio", targets[k]);
        }
        if (k == 2) row_str(&row, "page_cache", keep_cache ? "kept" : "dropped");
        row_end(&row, o);
    }
    goto done;
fail:
    fail_row("prefix", why, o, threads);
    rc = 1;
done:
    free(ids);
    free(warm);
    free(t_cold);
    free(t_ram);
    free(t_disk);
    rm_tree(su.dir);
    return rc;
}

/* ---- bench preempt -------------------------------------------------------------------------------- */

/* The case `priority`: two long streams of priority 5 take --max-batch 2; once both run, one of
 * priority 0 (16 tokens) arrives. Its TTFT and the long ones' wall time, with preemption or not. */
typedef struct {
    double ttft, urgent_s, long_s, preemptions;
    int ok;
} priority_run;

static int run_priority(const setup *su, const bench_opts *o, int tokens, int preempt, priority_run *out, char *why, size_t cap) {
    char *args[32], th[16], log[700];
    int na = 0;
    add_arg(args, &na, "--max-batch");
    add_arg(args, &na, "2");
    add_arg(args, &na, "--scheduling-policy");
    add_arg(args, &na, "priority");
    if (!preempt) add_arg(args, &na, "--no-preemption");
    common_args(args, &na, o, th);
    snprintf(log, sizeof log, "%s/preempt-%d.log", su->dir, preempt);
    child srv;
    if (!child_start(&srv, su->exe, su->model, su->tok, args, na, log, why, cap)) return 0;
    client_job jobs[2];
    for (int c = 0; c < 2; c++)
        jobs[c] = (client_job){srv.port, 1, 16, tokens, su->vocab, c, calloc(1, sizeof(sresult)), 0, "\"priority\":5,\"ignore_eos\":true,"};
    pthread_t lt;
    clients_run longs = {jobs, 2, 0, 0};
    pthread_create(&lt, NULL, run_clients, &longs);
    for (double t0 = nv_now(); nv_now() - t0 < 60 && nv_loopback_metric(srv.port, "nerve_running_sequences") < 2;) sleep_s(0.005);
    int ids[16];
    random_ids(ids, 16, su->vocab, 4242);
    char *body = prompt_body(ids, 16, 16, 4242, "\"priority\":0,");
    sresult u = {0};
    const int u_ok = body && stream_post(srv.port, body, &u);
    free(body);
    pthread_join(lt, NULL);
    out->ttft = u.t_first > 0 ? u.t_first - u.t_send : 0;
    out->urgent_s = u.t_last > 0 ? u.t_last - u.t_send : 0;
    out->long_s = longs.wall;
    out->preemptions = nv_loopback_metric(srv.port, "nerve_preemptions_total");
    out->ok = u_ok && longs.ok;
    free(u.gaps);
    free_clients(jobs, 2);
    if (child_stop(&srv) != 0) {
        snprintf(why, cap, "the server did not stop cleanly");
        return 0;
    }
    return 1;
}

/* The case `overcommit`: n requests at once, each asking max_tokens `tokens` but ending well before
 * (the EOS token's logit raised: an eighth of them on flat logits), on a KV pool that holds two requests'
 * prompt and max_tokens: the wall time and tokens/s, reserving every request's room or overcommitting. */
static int run_overcommit(const setup *su, const bench_opts *o, int n, int tokens, const char *kv, const char *head,
                          int overcommit, long *out_tokens, double *wall, double *preemptions, char *why, size_t cap) {
    char *args[32], th[16], log[700], mb[16];
    int na = 0;
    snprintf(mb, sizeof mb, "%d", n);
    add_arg(args, &na, "--max-batch");
    add_arg(args, &na, mb);
    add_arg(args, &na, "--kv-memory");
    add_arg(args, &na, kv);
    if (overcommit) add_arg(args, &na, "--kv-overcommit");
    common_args(args, &na, o, th);
    snprintf(log, sizeof log, "%s/overcommit-%d.log", su->dir, overcommit);
    child srv;
    if (!child_start(&srv, su->exe, su->model, su->tok, args, na, log, why, cap)) return 0;
    client_job jobs[64];
    for (int c = 0; c < n; c++) jobs[c] = (client_job){srv.port, 1, 16, tokens, su->vocab, 500 + c, calloc(1, sizeof(sresult)), 0, head};
    clients_run cr = {jobs, n, 0, 0};
    run_clients(&cr);
    const int ok = cr.ok;
    *wall = cr.wall;
    *out_tokens = 0;
    for (int c = 0; c < n; c++) *out_tokens += jobs[c].res[0].tokens;
    *preemptions = nv_loopback_metric(srv.port, "nerve_preemptions_total");
    free_clients(jobs, n);
    if (child_stop(&srv) != 0 || !ok) {
        snprintf(why, cap, ok ? "the server did not stop cleanly" : "a request failed");
        return 0;
    }
    return 1;
}

int bench_preempt(int argc, char **argv, const bench_opts *o) {
    const char *CMD = "bench preempt", *model = NULL, *tok = NULL;
    int tokens = o->quick ? 400 : 1024, clients = o->quick ? 4 : 8;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!(v = cli_value(CMD, argc, argv, &i))) return 2;
        if (!strcmp(a, "--tokens")) { if (!cli_int(CMD, a, v, 32, 1 << 16, &tokens)) return 2; }
        else if (!strcmp(a, "--clients")) { if (!cli_int(CMD, a, v, 2, 64, &clients)) return 2; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "-z")) tok = v;
        else return cli_error(CMD, 2, "unknown option '%s' (--tokens N, --clients N, -m MODEL, -z TOK)", a);
    }
    const int threads = o->threads ? o->threads : nv_cpu_probe()->cores;
    int seq_len = 512;
    while (seq_len < tokens + 32) seq_len *= 2;
    char why[1024] = "";
    setup su;
    nv_config mc;
    nv_tokenizer *t = NULL;
    int rc = 1;
    if (!bench_setup(&su, o, model, tok, seq_len, why, sizeof why) || nv_model_read_config(su.model, &mc) != NV_OK ||
        nv_tokenizer_load(su.tok, 0, &t) != NV_OK) {
        if (!why[0]) snprintf(why, sizeof why, "%s", nv_errmsg());
        fail_row("preempt", why, o, threads);
        if (su.dir[0]) rm_tree(su.dir);
        return 1;
    }
    if (tokens + 17 > mc.seq_len) tokens = mc.seq_len - 17; /* (a given model's context) */
    if (tokens < 32 || nv_tokenizer_eos(t) < 0) {
        snprintf(why, sizeof why, tokens < 32 ? "the model's context of %d is too short" : "the tokenizer has no EOS token", mc.seq_len);
        goto fail;
    }
    const char *model_name = model ? model : o->quick ? "stories260K" : "stories110M";
    priority_run pr[2] = {{0}};
    long oc_tokens[2] = {0};
    double oc_wall[2] = {0}, oc_pre[2] = {0};
    /* the pool: two requests' prompt and max_tokens; EOS raised so that answers end after tokens / 8 on
       average, as exp(bias) / (vocabulary + exp(bias)) = 8 / tokens on a random model's near-flat logits */
    char kv[32], head[96];
    const long blocks = (16 + tokens + 15) / 16;
    snprintf(kv, sizeof kv, "%llu", (unsigned long long)(2 * blocks) * nv_kv_block_bytes(&mc, 16, NV_KV_F16));
    snprintf(head, sizeof head, "\"logit_bias\":{\"%d\":%.2f},", nv_tokenizer_eos(t), log(8.0 / tokens * mc.vocab_size));
    for (int mode = 0; mode < 2; mode++) /* (without first, then with) */
        if (!run_priority(&su, o, tokens, mode, &pr[mode], why, sizeof why) ||
            !run_overcommit(&su, o, clients, tokens, kv, head, mode, &oc_tokens[mode], &oc_wall[mode], &oc_pre[mode], why, sizeof why))
            goto fail;
    for (int mode = 0; mode < 2; mode++) {
        bench_row row;
        row_begin(&row, "preempt", "nerve", threads);
        row_str(&row, "model", model_name);
        row_str(&row, "case", "priority");
        row_str(&row, "mode", mode ? "preemption" : "no-preemption");
        if (!pr[mode].ok) row.jn += (size_t)snprintf(row.json + row.jn, sizeof row.json - row.jn, ",\"ok\":false");
        row_int(&row, "max_tokens", tokens);
        row_num(&row, "ttft_ms", pr[mode].ttft * 1e3);
        row_num(&row, "urgent_ms", pr[mode].urgent_s * 1e3);
        row_num(&row, "long_s", pr[mode].long_s);
        row_num(&row, "preemptions", pr[mode].preemptions);
        if (mode && pr[0].ttft > 0) {
            row_num(&row, "ratio_vs", pr[1].ttft / pr[0].ttft);
            row_str(&row, "ratio_of", "no-preemption ttft_ms");
        }
        row_end(&row, o);
    }
    for (int mode = 0; mode < 2; mode++) {
        bench_row row;
        row_begin(&row, "preempt", "nerve", threads);
        row_str(&row, "model", model_name);
        row_str(&row, "case", "overcommit");
        row_str(&row, "mode", mode ? "kv-overcommit" : "reserve");
        row_int(&row, "clients", clients);
        row_int(&row, "max_tokens", tokens);
        row_str(&row, "kv_memory", kv);
        row_int(&row, "completion_tokens", oc_tokens[mode]);
        row_num(&row, "wall_s", oc_wall[mode]);
        row_num(&row, "tokens_per_s", oc_tokens[mode] / oc_wall[mode]);
        row_num(&row, "preemptions", oc_pre[mode]);
        if (mode && oc_tokens[0] > 0) {
            row_num(&row, "ratio_vs", (oc_tokens[1] / oc_wall[1]) / (oc_tokens[0] / oc_wall[0]));
            row_str(&row, "ratio_of", "reserve tokens_per_s");
        }
        row_end(&row, o);
    }
    rc = 0;
    goto done;
fail:
    fail_row("preempt", why, o, threads);
done:
    nv_tokenizer_free(t);
    rm_tree(su.dir);
    return rc;
}

/* ---- bench spec ----------------------------------------------------------------------------------- */

/* Speculative decoding by prompt lookup: the same story prompts, greedy and sampled, sent to two
 * servers of the same model, one without drafts and one with --spec-tokens K, alternately (the
 * same minutes for both); tokens/s of each, the drafts' acceptance, tokens per step, and whether
 * every text was identical (it must be: drafts change how many steps, never which tokens). A
 * trained model is needed for the figures to mean anything (drafts are only accepted where the
 * model repeats what it read or wrote): by default the shared stories260K. With --model-draft the
 * drafts come from that model instead (speculative decoding by a draft model). The case `predicted`
 * is greedy with each request's answer from the server without drafts, one word in PRED_EDIT
 * changed, as its prediction (OpenAI's Predicted Outputs: an editor's file with a few edits). */
static const char *const spec_prompts[] = {"Once upon a time",  "Lily and Ben",  "The dog",     "One day, a little",
                                           "Tom had a big red", "The sun was",   "A cat named", "She wanted to"};
#define N_SPEC_PROMPTS 8

#define PRED_EDIT 25

/* text with every PRED_EDIT-th word (from the 12th) replaced (malloc'd; NULL when out of memory). */
static char *edited_words(const char *text) {
    gbuf b = {0};
    int word = 0, ok = gb_add(&b, "", 0);
    for (const char *p = text; *p;) {
        const char *e = p;
        while (*e && *e != ' ') e++;
        ok &= word++ % PRED_EDIT == 12 ? gb_add(&b, "purple", 6) : gb_add(&b, p, (size_t)(e - p));
        if (*e) ok &= gb_add(&b, " ", 1), e++;
        p = e;
    }
    if (!ok) free(b.p);
    return ok ? b.p : NULL;
}

typedef struct {
    int port, requests, tokens, client;
    double temperature;
    gbuf *texts;        /* [requests] */
    const gbuf *preds;  /* [requests] the texts to predict edited versions of, or NULL */
    long completion;
    int ok;
} spec_job;

static void *spec_client(void *arg) {
    spec_job *j = arg;
    j->ok = 1;
    for (int i = 0; i < j->requests; i++) {
        int k = (j->client * j->requests + i) % N_SPEC_PROMPTS;
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "prompt", spec_prompts[k]);
        cJSON_AddNumberToObject(b, "max_tokens", j->tokens);
        cJSON_AddNumberToObject(b, "temperature", j->temperature);
        cJSON_AddNumberToObject(b, "seed", 1000 + j->client * 37 + i);
        cJSON_AddTrueToObject(b, "stream");
        cJSON_AddTrueToObject(cJSON_AddObjectToObject(b, "stream_options"), "include_usage");
        char *pred = j->preds && j->preds[i].p ? edited_words(j->preds[i].p) : NULL;
        if (pred) {
            cJSON *p = cJSON_AddObjectToObject(b, "prediction");
            cJSON_AddStringToObject(p, "type", "content");
            cJSON_AddStringToObject(p, "content", pred);
        }
        char *body = cJSON_PrintUnformatted(b);
        cJSON_Delete(b);
        free(pred);
        sresult r = {.text = &j->texts[i]};
        if (!body || !stream_post(j->port, body, &r)) j->ok = 0;
        free(body);
        j->completion += r.tokens;
        free(r.gaps);
    }
    return NULL;
}

/* n clients x requests on port (preds: NULL, or texts to predict as texts is laid out); the wall
 * time, texts in texts[n][requests]. */
static double spec_round(int port, int n, int requests, int tokens, double temperature, const gbuf *preds, gbuf *texts,
                         long *completion, int *ok) {
    spec_job jobs[64];
    pthread_t th[64];
    double t0 = nv_now();
    for (int c = 0; c < n; c++) {
        jobs[c] = (spec_job){port, requests, tokens, c, temperature, texts + (size_t)c * requests,
                             preds ? preds + (size_t)c * requests : NULL, 0, 0};
        pthread_create(&th[c], NULL, spec_client, &jobs[c]);
    }
    *completion = 0;
    for (int c = 0; c < n; c++) {
        pthread_join(th[c], NULL);
        *completion += jobs[c].completion;
        *ok &= jobs[c].ok;
    }
    return nv_now() - t0;
}

int bench_spec(int argc, char **argv, const bench_opts *o) {
    const char *CMD = "bench spec", *model = NULL, *tok = NULL, *draft = NULL, *draft_engine = NULL, *p_min = NULL;
    int tokens = o->quick ? 48 : 200, k = 8, requests = o->quick ? 1 : 2, rounds = o->quick ? 1 : 2;
    int clients[8] = {1, 4}, n_clients = o->quick ? 1 : 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!(v = cli_value(CMD, argc, argv, &i))) return 2;
        if (!strcmp(a, "--tokens")) { if (!cli_int(CMD, a, v, 1, 100000, &tokens)) return 2; }
        else if (!strcmp(a, "--spec-tokens")) { if (!cli_int(CMD, a, v, 1, NV_MAX_SPEC, &k)) return 2; }
        else if (!strcmp(a, "--requests")) { if (!cli_int(CMD, a, v, 1, 100, &requests)) return 2; }
        else if (!strcmp(a, "--rounds")) { if (!cli_int(CMD, a, v, 1, 100, &rounds)) return 2; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "-z")) tok = v;
        else if (!strcmp(a, "--model-draft") || !strcmp(a, "-md")) draft = v;
        else if (!strcmp(a, "--draft-engine")) draft_engine = v;
        else if (!strcmp(a, "--draft-p-min")) {
            float p;
            if (!cli_float(CMD, a, v, 0, 1, &p)) return 2;
            p_min = v;
        }
        else if (!strcmp(a, "--clients")) {
            if (!parse_clients(CMD, v, 64, clients, &n_clients)) return 2;
        } else
            return cli_error(CMD, 2, "unknown option '%s' (--clients LIST, --requests M, --tokens N, --spec-tokens K, --rounds R, "
                                     "-m MODEL, -z TOK, --model-draft MODEL, --draft-engine E, --draft-p-min P)", a);
    }
    if ((draft_engine || p_min) && !draft) return cli_error(CMD, 2, "--draft-engine and --draft-p-min need --model-draft");
    int threads = o->threads ? o->threads : nv_cpu_probe()->cores, max_clients = 1;
    for (int i = 0; i < n_clients; i++) max_clients = clients[i] > max_clients ? clients[i] : max_clients;
    char why[1024] = "", shared_model[4096], shared_tok[4096];
    if (!model) { /* a trained model: the shared stories260K */
        if (!nv_data_path("models/stories260K.bin", shared_model, sizeof shared_model) ||
            (!tok && !nv_data_path("models/tok512.bin", shared_tok, sizeof shared_tok))) {
            fail_row("spec", "models/stories260K.bin and models/tok512.bin not found in the shared data (pass -m and -z)", o, threads);
            return 1;
        }
        model = shared_model;
        if (!tok) tok = shared_tok;
    }
    setup su;
    if (!bench_setup(&su, o, model, tok, 0, why, sizeof why)) {
        fail_row("spec", why, o, threads);
        if (su.dir[0]) rm_tree(su.dir);
        return 1;
    }
    char mb[16], th[16], ks[16], log_off[700], log_on[700];
    snprintf(mb, sizeof mb, "%d", max_clients);
    snprintf(ks, sizeof ks, "%d", k);
    snprintf(log_off, sizeof log_off, "%s/serve-off.log", su.dir);
    snprintf(log_on, sizeof log_on, "%s/serve-on.log", su.dir);
    char *args[32];
    int na = 0;
    add_arg(args, &na, "--max-batch");
    add_arg(args, &na, mb);
    add_arg(args, &na, "--no-prefix-cache"); /* the same prompts again: every round prefills them */
    common_args(args, &na, o, th);
    int na_off = na;
    add_arg(args, &na, "--spec-tokens");
    add_arg(args, &na, ks);
    if (draft) {
        add_arg(args, &na, "--model-draft");
        add_arg(args, &na, draft);
    }
    if (draft_engine) {
        add_arg(args, &na, "--draft-engine");
        add_arg(args, &na, draft_engine);
    }
    if (p_min) {
        add_arg(args, &na, "--draft-p-min");
        add_arg(args, &na, p_min);
    }
    child off, on;
    if (!child_start(&off, su.exe, su.model, su.tok, args, na_off, log_off, why, sizeof why)) {
        fail_row("spec", why, o, threads);
        rm_tree(su.dir);
        return 1;
    }
    if (!child_start(&on, su.exe, su.model, su.tok, args, na, log_on, why, sizeof why)) {
        fail_row("spec", why, o, threads);
        child_stop(&off);
        rm_tree(su.dir);
        return 1;
    }
    char model_name[256];
    nv_path_name(su.model, model_name, sizeof model_name);
    int rc = 0;
    static const struct {
        const char *name;
        double temperature;
        int predicted;
    } cases[] = {{"greedy", 0.0, 0}, {"sampled", 0.8, 0}, {"predicted", 0.0, 1}};
    for (int ci = 0; ci < 3; ci++)
        for (int cl = 0; cl < n_clients; cl++) {
            int n = clients[cl], ok = 1, identical = 1;
            size_t nt = (size_t)n * requests;
            double wall[2] = {0, 0}, steps[2] = {0, 0}, drafted = 0, accepted = 0;
            long done[2] = {0, 0};
            gbuf *prev = NULL; /* the texts without drafts, this round */
            for (int round = 0; round < rounds; round++)
                for (int side = 0; side < 2; side++) { /* off, then on: the same minutes for both */
                    child *srv = side ? &on : &off;
                    gbuf *texts = calloc(nt, sizeof *texts);
                    double s0 = nv_loopback_metric(srv->port, "nerve_steps_total"), d0 = nv_loopback_metric(srv->port, "nerve_spec_draft_tokens_total");
                    double a0 = nv_loopback_metric(srv->port, "nerve_spec_accepted_tokens_total");
                    long completion = 0;
                    const gbuf *preds = side && cases[ci].predicted ? prev : NULL;
                    wall[side] += spec_round(srv->port, n, requests, tokens, cases[ci].temperature, preds, texts, &completion, &ok);
                    done[side] += completion;
                    steps[side] += nv_loopback_metric(srv->port, "nerve_steps_total") - s0;
                    if (side) {
                        drafted += nv_loopback_metric(srv->port, "nerve_spec_draft_tokens_total") - d0;
                        accepted += nv_loopback_metric(srv->port, "nerve_spec_accepted_tokens_total") - a0;
                    }
                    if (!side) prev = texts;
                    else {
                        for (size_t t = 0; t < nt; t++)
                            if ((prev[t].p == NULL) != (texts[t].p == NULL) || (prev[t].p && strcmp(prev[t].p, texts[t].p)))
                                identical = 0;
                        for (size_t t = 0; t < nt; t++) free(prev[t].p), free(texts[t].p);
                        free(prev);
                        free(texts);
                    }
                }
            bench_row row;
            row_begin(&row, "spec", on.engine[0] ? on.engine : "nerve", threads);
            row_str(&row, "model", model_name);
            row_str(&row, "case", cases[ci].name);
            row_int(&row, "clients", n);
            row_int(&row, "requests", (long long)nt * rounds);
            row_int(&row, "max_tokens", tokens);
            row_int(&row, "spec_tokens", k);
            if (draft) {
                char draft_name[256];
                nv_path_name(draft, draft_name, sizeof draft_name);
                row_str(&row, "draft", draft_name);
                row_num(&row, "draft_p_min", p_min ? atof(p_min) : 0.75); /* serve's default */
            }
            if (!ok || !identical) {
                row.jn += (size_t)snprintf(row.json + row.jn, sizeof row.json - row.jn, ",\"ok\":false");
                row_str(&row, "why", !ok ? "a request failed" : "a text differs with drafts");
                rc = 1;
            }
            row_int(&row, "completion_tokens", done[1]);
            row_num(&row, "tokens_per_s", done[1] / wall[1]);
            row_num(&row, "tokens_per_s_no_drafts", done[0] / wall[0]);
            row_num(&row, "tokens_per_step", steps[1] > 0 ? done[1] / steps[1] : 0);
            row_num(&row, "tokens_per_step_no_drafts", steps[0] > 0 ? done[0] / steps[0] : 0);
            row_num(&row, "acceptance", drafted > 0 ? accepted / drafted : 0);
            row.jn += (size_t)snprintf(row.json + row.jn, sizeof row.json - row.jn, ",\"identical\":%s", identical ? "true" : "false");
            row_num(&row, "ratio_vs", (done[1] / wall[1]) / (done[0] / wall[0]));
            row_str(&row, "ratio_of", "tokens_per_s / tokens_per_s_no_drafts");
            row_end(&row, o);
        }
    if (child_stop(&on) != 0) rc = 1;
    if (child_stop(&off) != 0) rc = 1;
    rm_tree(su.dir);
    return rc;
}

/* ---- bench rerank ---------------------------------------------------------------------------------- */

/* A rerank body: a query of qw words and docs documents of dw words each, drawn from a small list
 * by seed (the words' tokens are what the model reads; its judgment does not matter here). */
static char *rerank_body(int qw, int docs, int dw, uint64_t seed) {
    static const char *const words[] = {"the", "cat", "dog", "ran", "park", "ball", "little", "girl", "boy", "happy", "sad",
                                        "tree", "house", "mom", "dad", "play", "sun", "rain", "big", "small", "red", "blue", "friend", "toy"};
    const uint32_t nw = sizeof words / sizeof *words;
    uint64_t st = seed * 0x2545F4914F6CDD1Dull + 1;
    nv_buf b = {0};
    nv_buf_puts(&b, "{\"query\": \"");
    for (int i = 0; i < qw; i++) nv_buf_printf(&b, "%s%s", i ? " " : "", words[nv_xorshift_u32(&st) % nw]);
    nv_buf_puts(&b, "\", \"return_documents\": false, \"documents\": [");
    for (int d = 0; d < docs; d++) {
        nv_buf_puts(&b, d ? ", \"" : "\"");
        for (int i = 0; i < dw; i++) nv_buf_printf(&b, "%s%s", i ? " " : "", words[nv_xorshift_u32(&st) % nw]);
        nv_buf_puts(&b, "\"");
    }
    nv_buf_puts(&b, "]}");
    if (b.oom) {
        nv_buf_free(&b);
        return NULL;
    }
    return nv_buf_take(&b);
}

/* Seconds one /v1/rerank of body took, its prompt tokens in *tokens; negative on failure. */
static double rerank_once(int port, const char *body, long *tokens) {
    nv_http_answer a;
    const double t0 = nv_now();
    const int ok = nv_loopback_http(port, 3600, "POST", "/v1/rerank", NULL, body, &a) && a.status == 200 && a.body;
    const double t = nv_now() - t0;
    const char *u = ok ? strstr(a.body, "\"prompt_tokens\":") : NULL;
    *tokens = u ? atol(u + 16) : 0;
    nv_http_answer_free(&a);
    return u ? t : -1;
}

/* Reranking: one request of D documents after one query, as a retrieval pipeline sends it, on a
 * server with the prefix cache (the first pair alone, the others reading the query's blocks from
 * it) and one without (every pair computed whole), the same bodies alternately; documents/s and
 * prompt tokens/s of each, and the ratio. */
int bench_rerank(int argc, char **argv, const bench_opts *o) {
    const char *CMD = "bench rerank", *model = NULL, *tok = NULL;
    int docs = o->quick ? 8 : 32, qw = 80, dw = 120, reps = o->quick ? 1 : 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!(v = cli_value(CMD, argc, argv, &i))) return 2;
        if (!strcmp(a, "--docs")) { if (!cli_int(CMD, a, v, 1, 1000, &docs)) return 2; }
        else if (!strcmp(a, "--query-words")) { if (!cli_int(CMD, a, v, 1, 2000, &qw)) return 2; }
        else if (!strcmp(a, "--doc-words")) { if (!cli_int(CMD, a, v, 1, 2000, &dw)) return 2; }
        else if (!strcmp(a, "--reps")) { if (!cli_int(CMD, a, v, 1, 100, &reps)) return 2; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "-z")) tok = v;
        else return cli_error(CMD, 2, "unknown option '%s' (--docs N, --query-words N, --doc-words N, --reps R, -m MODEL, -z TOK)", a);
    }
    const int threads = o->threads ? o->threads : nv_cpu_probe()->cores;
    int seq_len = 1024;
    while (seq_len < 4 * (qw + dw) + 64) seq_len *= 2;
    char why[1024] = "", tmpl[700], log[700], th[16];
    setup su;
    child srv[2] = {{0}, {0}};
    char *bodies[101] = {0};
    double t[2] = {0, 0};
    long tokens[2] = {0, 0};
    int rc = 0;
    if (!bench_setup(&su, o, model, tok, seq_len, why, sizeof why)) goto fail;
    /* a short prompt of the query and the document; "the" and "a", one token in every vocabulary here */
    snprintf(tmpl, sizeof tmpl, "%s/rerank.txt", su.dir);
    FILE *f = fopen(tmpl, "w");
    if (!f || fputs("{query}\n{document}\nRelevant:", f) < 0 || fclose(f) != 0) {
        snprintf(why, sizeof why, "cannot write %s", tmpl);
        goto fail;
    }
    for (int k = 0; k < 2; k++) {
        char *args[32];
        int na = 0;
        add_arg(args, &na, "--rerank-template");
        add_arg(args, &na, tmpl);
        add_arg(args, &na, "--rerank-tokens");
        add_arg(args, &na, "the,a");
        add_arg(args, &na, "--kv-disk-cache");
        add_arg(args, &na, "0");
        if (k) add_arg(args, &na, "--no-prefix-cache");
        common_args(args, &na, o, th);
        snprintf(log, sizeof log, "%s/serve%d.log", su.dir, k);
        if (!child_start(&srv[k], su.exe, su.model, su.tok, args, na, log, why, sizeof why)) goto fail;
    }
    for (int r = 0; r <= reps; r++) /* body 0 warms both servers up */
        if (!(bodies[r] = rerank_body(r ? qw : 8, r ? docs : 2, r ? dw : 8, (uint64_t)r + 1))) {
            snprintf(why, sizeof why, "out of memory");
            goto fail;
        }
    for (int r = 0; r <= reps; r++)
        for (int k = 0; k < 2; k++) { /* the same body on each server, alternately: the same minutes for both */
            long n = 0;
            const double s = rerank_once(srv[k].port, bodies[r], &n);
            if (s < 0) {
                snprintf(why, sizeof why, "a rerank request failed");
                goto fail;
            }
            if (r) t[k] += s, tokens[k] += n;
        }
    for (int k = 0; k < 2; k++) {
        bench_row row;
        row_begin(&row, "rerank", srv[k].engine[0] ? srv[k].engine : "nerve", threads);
        row_str(&row, "model", model ? model : o->quick ? "stories260K" : "stories110M");
        row_str(&row, "case", k ? "no-prefix-cache" : "prefix-cache");
        row_int(&row, "docs", docs);
        row_int(&row, "reps", reps);
        row_num(&row, "prompt_tokens_per_request", (double)tokens[k] / reps);
        row_num(&row, "ms_per_request", t[k] / reps * 1e3);
        row_num(&row, "docs_per_s", docs * reps / t[k]);
        row_num(&row, "prompt_tokens_per_s", tokens[k] / t[k]);
        if (!k) {
            row_num(&row, "ratio_vs", t[0] / t[1]);
            row_num(&row, "speedup", t[1] / t[0]);
            row_str(&row, "ratio_of", "no-prefix-cache");
        }
        row_end(&row, o);
    }
    goto done;
fail:
    fail_row("rerank", why, o, threads);
    rc = 1;
done:
    for (int k = 0; k < 2; k++)
        if (srv[k].pid) child_stop(&srv[k]);
    for (int r = 0; r <= 100; r++) free(bodies[r]);
    if (su.dir[0]) rm_tree(su.dir);
    return rc;
}
