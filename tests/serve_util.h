/* Server processes for the tests that drive the real `nerve serve`: start one on a free loopback
 * port (it prints the port it bound), stop it with SIGTERM, read its log, connect to it.
 * Header-only like t.h; include after t.h. */
#ifndef NV_TEST_SERVE_UTIL_H
#define NV_TEST_SERVE_UTIL_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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
        const char *p = strstr(text, "listening on http://127.0.0.1:");
        if (p) s->port = atoi(p + strlen("listening on http://127.0.0.1:"));
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

#endif
