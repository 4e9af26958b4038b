/* Minimal test harness shared by every test program.
 *
 * A test program is a main() that calls T_RUN(case_fn) for each case. Inside a case, T_CHECK
 * records a failure (and keeps going), t_skip() marks the case skipped with a reason. Each case
 * prints one line ("ok", "FAIL", "skipped: reason"); the program ends with the machine-readable
 * line "@@ RESULT passed failed skipped" that tests/run.sh adds up, and exits non-zero on failure.
 * t_data() finds files in ../shared/data through the one helper the program itself uses. */
#ifndef NV_TEST_H
#define NV_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "base/file.h"

static int t_passed, t_failed, t_skipped;
static int t_case_failed, t_case_skipped;
static char t_skip_reason[4400];

#define T_CHECK(cond, ...)                                              \
    do {                                                                \
        if (!(cond)) {                                                  \
            t_case_failed++;                                            \
            if (t_case_failed <= 5) {                                   \
                fprintf(stderr, "    %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
                fprintf(stderr, __VA_ARGS__);                           \
                fputc('\n', stderr);                                    \
            }                                                           \
        }                                                               \
    } while (0)

static inline void t_skip(const char *reason) {
    t_case_skipped = 1;
    snprintf(t_skip_reason, sizeof t_skip_reason, "%s", reason);
}

/* Path of rel inside the shared data folder, or NULL after marking the case skipped. */
static inline const char *t_data(const char *rel) {
    static char bufs[8][4096];
    static int next;
    char *b = bufs[next++ & 7];
    if (!nv_data_path(rel, b, sizeof bufs[0])) {
        char why[600];
        snprintf(why, sizeof why, "no ../shared/data/%.400s (set NERVE_DATA to its folder)", rel);
        t_skip(why);
        return NULL;
    }
    return b;
}

static inline void t_run(const char *name, void (*fn)(void)) {
    const char *only = getenv("NERVE_TEST_ONLY"); /* a developer's filter: the cases whose names contain it */
    if (only && *only && !strstr(name, only)) return;
    t_case_failed = 0;
    t_case_skipped = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    fn();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    /* a case's seconds, where they are worth reading: what keeps the suite within its time */
    const double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    char took[32] = "";
    if (secs >= 1.0) snprintf(took, sizeof took, " (%.1f s)", secs);
    if (t_case_failed) {
        t_failed++;
        printf("  FAIL     %s%s\n", name, took);
    } else if (t_case_skipped) {
        t_skipped++;
        printf("  skipped: %s: %s\n", name, t_skip_reason);
    } else {
        t_passed++;
        printf("  ok       %s%s\n", name, took);
    }
    fflush(stdout);
}
#define T_RUN(fn) t_run(#fn, fn)

/* 1 in the sanitizer build (the suite's second pass). A case whose checks need a model to learn
 * something over a long run trains a few steps there instead: the same code under ASan and UBSan,
 * with the checks that do not depend on the run's length; the release pass checks what it learned. */
static inline int t_sanitized(void) {
#ifdef __SANITIZE_ADDRESS__
    return 1;
#else
    return 0;
#endif
}

/* The nerve binary under test (set by tests/run.sh). */
static inline const char *t_nerve_bin(void) {
    const char *b = getenv("NERVE_BIN");
    return b && *b ? b : "build/nerve";
}

/* A private temporary folder for this test program, made on first use, removed by t_done(). */
static char t_tmp[128];
static inline const char *t_tmpdir(void) {
    if (!t_tmp[0]) {
        snprintf(t_tmp, sizeof t_tmp, "/tmp/nerve-test-XXXXXX");
        if (!mkdtemp(t_tmp)) {
            fprintf(stderr, "cannot create a temporary folder\n");
            exit(1);
        }
    }
    return t_tmp;
}

/* name inside the temporary folder (eight rotating buffers). */
static inline const char *t_path(const char *name) {
    static char bufs[8][640];
    static int next;
    char *b = bufs[next++ & 7];
    snprintf(b, sizeof bufs[0], "%s/%.500s", t_tmpdir(), name);
    return b;
}

/* Writes data to name in the temporary folder; returns its path. */
static inline const char *t_write(const char *name, const void *data, size_t len) {
    const char *p = t_path(name);
    FILE *f = fopen(p, "wb");
    T_CHECK(f != NULL, "cannot create %s", p);
    if (!f) return p;
    if (len) fwrite(data, 1, len, f);
    fclose(f);
    return p;
}

/* 1 when the files a and b both read and hold the same bytes. */
static inline int t_same_files(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    const int same = nv_file_read_all(a, &x, &nx) == NV_OK && nv_file_read_all(b, &y, &ny) == NV_OK && nx == ny &&
                     !memcmp(x, y, nx);
    free(x);
    free(y);
    return same;
}

/* Runs `nerve ARGS` (ARGS already shell-quoted) with stdin read from the file in; t_out and t_err
 * then hold its stdout and stderr. Returns the exit code (128 when it did not exit normally). */
static char *t_out, *t_err;
static inline int t_nerve_stdin(const char *args, const char *in) {
    char cmd[8192], out[700], err[700];
    snprintf(out, sizeof out, "%s/nerve.stdout", t_tmpdir()); /* not t_path: callers hold its buffers */
    snprintf(err, sizeof err, "%s/nerve.stderr", t_tmpdir());
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>%s <%s", t_nerve_bin(), args, out, err, in);
    int st = system(cmd);
    free(t_out);
    free(t_err);
    t_out = t_err = NULL;
    nv_file_read_all(out, &t_out, NULL);
    nv_file_read_all(err, &t_err, NULL);
    if (!t_out) t_out = calloc(1, 1);
    if (!t_err) t_err = calloc(1, 1);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* The same with no input. */
static inline int t_nerve(const char *args) { return t_nerve_stdin(args, "/dev/null"); }

static inline int t_done(void) {
    free(t_out);
    free(t_err);
    if (t_tmp[0]) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", t_tmp);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", t_tmp);
    }
    printf("@@ RESULT %d %d %d\n", t_passed, t_failed, t_skipped);
    return t_failed ? 1 : 0;
}

static inline int t_close(float a, float b, float rel, float abs_tol) {
    return fabsf(a - b) <= abs_tol + rel * fabsf(b);
}

#endif
