/* The requests of a batch (serve/batchfile.h) sent to a server of this process's own (nerve serve's,
 * on 127.0.0.1 at a given port with a key of its own), `workers` at a time, so continuous batching
 * runs them together and each answer is exactly what the server gives that body alone. Shared by
 * `nerve batch` and the server's own Batch API (serve/batches.h).
 *
 * Contract: nv_batch_run blocks until every request of todo has its answer or the runner is
 * stopped; each answer is handed to on_result (under the runner's lock, so results never
 * interleave) as the batch output's line. A 429 (the server's queue full) is sent again, and a
 * request no answer came for up to three times.
 * nv_batch_run_stop(1): no request is sent after; those running finish and are handed over.
 * nv_batch_run_stop(2): those running are abandoned too (their connections shut, the server
 * cancels them) and never handed over. */
#ifndef NV_SERVE_BATCHRUN_H
#define NV_SERVE_BATCHRUN_H

#include <pthread.h>
#include <stdatomic.h>

#include "serve/batchfile.h"

#define NV_BATCH_MAX_WORKERS 1024

/* The answer to todo[k]: line (malloc'd, taken) its output line; status the HTTP status (0: no
 * answer came); ok 1 for a 2xx (Anthropic's: succeeded), whose usage[0], usage[1] are the prompt and
 * completion tokens. */
typedef void (*nv_batch_result_fn)(void *ctx, int k, char *line, int status, int ok, const double usage[2]);

typedef struct {
    /* the caller's */
    const nv_batch_set *set;
    const int *todo; /* indices into set */
    int n_todo;
    int port;
    float timeout_s; /* the server's request timeout (a connection waits that and a minute more; 0: none) */
    int workers;     /* requests at once (1..NV_BATCH_MAX_WORKERS) */
    nv_batch_result_fn on_result;
    void *ctx;
    /* the runner's */
    char auth[160]; /* the Authorization header line */
    pthread_mutex_t mu;
    int next_take;
    atomic_int stop;
    int fds[NV_BATCH_MAX_WORKERS];
} nv_batch_runner;

/* Sets up r for api_key (its other fields the caller's); nv_batch_runner_free ends it. */
void nv_batch_runner_init(nv_batch_runner *r, const char *api_key);
void nv_batch_runner_free(nv_batch_runner *r);
/* 0, or -1 when no thread could start (nothing was sent). */
int nv_batch_run(nv_batch_runner *r);
void nv_batch_run_stop(nv_batch_runner *r, int level);

/* The batch output's line for request r, answered (status > 0, body its text) or not (why); *ok: a
 * 2xx (Anthropic's: succeeded), whose usage goes to usage[2]; NULL when out of memory. */
char *nv_batch_result_line(const nv_batch_req *r, int status, const char *body, const char *why, int *ok, double usage[2]);

#endif
