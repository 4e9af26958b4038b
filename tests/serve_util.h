/* Server processes for the tests that drive the real `nerve serve`: start one on a free loopback
 * port (it prints the port it bound), stop it with SIGTERM, read its log, connect to it.
 * A small HTTP/1.1 client over plain sockets: http() sends one request and reads the whole answer.
 * Header-only like t.h; include after t.h. */
#ifndef NV_TEST_SERVE_UTIL_H
#define NV_TEST_SERVE_UTIL_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/net.h"
#include "t.h"

typedef struct {
    pid_t pid;
    int port;
    char log[600];
} server;

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static inline char *read_log(const server *s) {
    char *text = NULL;
    nv_file_read_all(s->log, &text, NULL);
    return text ? text : calloc(1, 1);
}

static inline void print_log(const server *s) {
    char *text = read_log(s);
    fprintf(stderr, "    --- server log (%s) ---\n%s    ---\n", s->log, text);
    free(text);
}

/* Starts `PRE exec env ENV nerve serve -m MODEL -z TOK --port 0 ARGS` (PRE and ENV may be NULL),
 * its stderr in NAME.log of the test's temporary folder, and waits up to wait_s for its
 * "listening on" line. Returns 1 with s->port set, or 0 after printing the log. */
static inline int server_spawn(server *s, const char *name, const char *pre, const char *env, const char *model,
                               const char *tok, const char *args, double wait_s) {
    memset(s, 0, sizeof *s);
    snprintf(s->log, sizeof s->log, "%s/%.300s.log", t_tmpdir(), name);
    unlink(s->log); /* a server started before under this name left its "listening on" line there */
    char cmd[8192];
    char ztok[4200] = ""; /* tok NULL: no -z (the server's default) */
    if (tok) snprintf(ztok, sizeof ztok, "-z '%s'", tok);
    snprintf(cmd, sizeof cmd, "%s exec env %s '%s' serve -m '%s' %s --port 0 %s 2>'%s' >/dev/null </dev/null",
             pre ? pre : "", env ? env : "NERVE_LOG=info", t_nerve_bin(), model, ztok, args, s->log);
    pid_t pid = fork();
    if (pid < 0) return 0;
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    s->pid = pid;
    for (double t0 = now_s(); now_s() - t0 < wait_s;) {
        char *text = read_log(s);
        const char *p = strstr(text, "listening on http://127.0.0.1:"), *ps = strstr(text, "listening on https://127.0.0.1:");
        if (p) s->port = atoi(p + strlen("listening on http://127.0.0.1:"));
        else if (ps) s->port = atoi(ps + strlen("listening on https://127.0.0.1:"));
        free(text);
        if (s->port > 0) return 1;
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            s->pid = 0;
            print_log(s);
            return 0;
        }
        sleep_ms(20);
    }
    print_log(s);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    s->pid = 0;
    return 0;
}

/* A server of model and tokenizer tok running the Jinja template text (written to the test's file),
 * with more flags (extra); its start line must hold note. 0 (a failed check) when it did not start. */
static inline int template_server(server *s, const char *name, const char *model, const char *tok, const char *file, const char *text,
                                  const char *extra, const char *note) {
    char flags[4600];
    snprintf(flags, sizeof flags, "--chat-template-file '%s' --jinja %s", t_write(file, text, strlen(text)), extra);
    if (!server_spawn(s, name, NULL, NULL, model, tok, flags, 30)) {
        T_CHECK(0, "the %s server did not start", name);
        return 0;
    }
    char *log = read_log(s);
    T_CHECK(log && strstr(log, note) != NULL, "%s: the start line: %s", name, log ? log : "");
    free(log);
    return 1;
}

/* SIGTERM, then waits up to wait_s for the exit; returns the exit code (-1 when it had to be killed). */
static inline int server_stop_within(server *s, double wait_s) {
    if (!s->pid) return -1;
    kill(s->pid, SIGTERM);
    int st = 0;
    for (double t0 = now_s(); now_s() - t0 < wait_s;) {
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
            s->pid = 0;
            int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
            if (rc != 0) print_log(s);
            return rc;
        }
        sleep_ms(20);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
    print_log(s);
    return -1;
}

/* A blocking TCP connection to 127.0.0.1:port with send/receive timeouts, or -1. */
static inline int connect_to_within(int port, int timeout_s) { return nv_loopback_connect(port, timeout_s); }

/* ---- the HTTP/1.1 client (base/net.h) ------------------------------------------------------------ */

typedef nv_http_answer resp;

static inline void resp_free(resp *r) { nv_http_answer_free(r); }
static inline int send_all(int fd, const char *p, size_t n) { return nv_send_all(fd, p, n); }
static inline char *build_request(const char *method, const char *path, const char *headers, const char *body, size_t *len) {
    return nv_http_request_text(method, path, headers, body, len);
}
static inline int parse_response(char *raw, size_t n, resp *r) { return nv_http_answer_parse(raw, n, r); }
static inline int read_all(int fd, char **out, size_t *n) { return nv_recv_all(fd, out, n); }

/* Sends raw bytes and reads the whole answer. */
static inline int http_raw(int port, const char *raw, size_t len, resp *r) {
    memset(r, 0, sizeof *r);
    int fd = connect_to_within(port, 60);
    if (fd < 0) return 0;
    char *buf = NULL;
    size_t n = 0;
    int ok = send_all(fd, raw, len);
    if (ok) { /* (read_all hands its buffer over even when nothing came) */
        ok = read_all(fd, &buf, &n) && parse_response(buf, n, r);
        free(buf);
    }
    close(fd);
    return ok;
}

static inline int http(int port, const char *method, const char *path, const char *headers, const char *body, resp *r) {
    return nv_loopback_http(port, 60, method, path, headers, body, r);
}

/* POST path with a JSON body: the answer parsed (NULL when none came or it is not JSON; the caller
 * deletes it), its status in *status (0 when no answer came). */
static inline cJSON *post_json_status(int port, const char *path, const char *body, int *status) {
    resp r;
    cJSON *root = NULL;
    *status = 0;
    if (http(port, "POST", path, NULL, body, &r)) *status = r.status, root = cJSON_Parse(r.body);
    resp_free(&r);
    return root;
}

/* The value of a metric line "name value" in the server's /metrics (exact name, labels included), or -1. */
static inline double metric(int port, const char *name) { return nv_loopback_metric(port, name); }

/* Waits up to 10 s until a metric of the server reads want; 0 when it did not. */
static inline int wait_metric(int port, const char *name, double want) {
    for (double t0 = now_s(); now_s() - t0 < 10; sleep_ms(10))
        if (metric(port, name) == want) return 1;
    return 0;
}

/* Waits up to 20 s until no request runs or waits and no KV block is in use or reserved, the SSD
 * writer's pins included (its queue empty); 0 when that did not come. */
static inline int wait_pool_idle(int port) {
    for (double t0 = now_s(); now_s() - t0 < 20; sleep_ms(20))
        if (metric(port, "nerve_running_sequences") == 0 && metric(port, "nerve_queue_depth") == 0 &&
            metric(port, "nerve_kv_blocks_in_use") == 0 && metric(port, "nerve_kv_blocks_reserved") == 0 &&
            metric(port, "nerve_prefix_disk_write_queue_depth") <= 0)
            return 1;
    return 0;
}

/* Serves model (with vocab, or the file's own vocabulary when NULL, and the extra serve flags) as
 * `name`, asks one chat turn "a" (3 tokens at temperature 0) and stops the server: the answer's
 * prompt_tokens, or -1 (the reason on stderr) when the server did not start, did not answer 200 with
 * a count, or did not exit 0. */
static inline int chat_prompt_tokens(const char *name, const char *model, const char *vocab, const char *flags) {
    server s;
    if (!server_spawn(&s, name, NULL, NULL, model, vocab, flags, 30)) {
        fprintf(stderr, "    %s: the server did not start\n", name);
        return -1;
    }
    resp r = {0};
    const char *count = NULL;
    if (http(s.port, "POST", "/v1/chat/completions", NULL,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"max_tokens\": 3, \"temperature\": 0}", &r) &&
        r.status == 200 && r.body)
        count = strstr(r.body, "\"prompt_tokens\":");
    int n = count ? atoi(count + 16) : -1;
    if (!count) fprintf(stderr, "    %s: status %d: %s\n", name, r.status, r.body ? r.body : "");
    resp_free(&r);
    if (server_stop_within(&s, 20) != 0) {
        fprintf(stderr, "    %s: the server did not exit 0\n", name);
        n = -1;
    }
    return n;
}

#endif
