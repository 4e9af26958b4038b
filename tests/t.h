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
    t_case_failed = 0;
    t_case_skipped = 0;
    fn();
    if (t_case_failed) {
        t_failed++;
        printf("  FAIL     %s\n", name);
    } else if (t_case_skipped) {
        t_skipped++;
        printf("  skipped: %s: %s\n", name, t_skip_reason);
    } else {
        t_passed++;
        printf("  ok       %s\n", name);
    }
    fflush(stdout);
}
#define T_RUN(fn) t_run(#fn, fn)

static inline int t_done(void) {
    printf("@@ RESULT %d %d %d\n", t_passed, t_failed, t_skipped);
    return t_failed ? 1 : 0;
}

/* The nerve binary under test (set by tests/run.sh). */
static inline const char *t_nerve_bin(void) {
    const char *b = getenv("NERVE_BIN");
    return b && *b ? b : "build/nerve";
}

static inline int t_close(float a, float b, float rel, float abs_tol) {
    return fabsf(a - b) <= abs_tol + rel * fabsf(b);
}

#endif
