/* OpenAI's Batch API on the server itself (`nerve serve --files-dir DIR`): POST /v1/batches takes an
 * uploaded file of requests (serve/files.h, purpose "batch"; the lines of serve/batchfile.h, every
 * url the batch's endpoint), and a thread of the server's runs them, one batch at a time, through
 * a server of its own on 127.0.0.1 whose requests queue behind everyone else's (serve/batchrun.h),
 * so the answers are exactly what the API gives each body, and interactive requests go first.
 *
 * Contract:
 * - A batch is DIR/ID.json (its Batch object and order; ids "batch_" and 24 hex digits), written
 *   atomically at each change of status; its answers so far are appended to DIR/ID.output.partial
 *   (2xx) and DIR/ID.errors.partial (the rest) as they come. A server stopped part way keeps the
 *   batch in_progress: started again, it keeps every whole line of those (a torn last one dropped)
 *   and runs the requests that have none; a request cut by the shutdown itself (503, or no answer)
 *   is not written, so it runs again.
 * - validating -> in_progress -> finalizing -> completed, or failed (the input has bad lines: errors
 *   lists them with their line numbers, nothing runs), cancelling -> cancelled (POST .../cancel: no
 *   more requests start, those running finish), expired (past expires_at, 24 h after creation:
 *   the requests not run get an error line each, code batch_expired). At the end the partials
 *   become files of the store (purpose batch_output; an empty one none): output_file_id and
 *   error_file_id.
 * - Anthropic's Message Batches run the same way, their requests given inline and kept in
 *   DIR/ID.input.jsonl; their results one file (succeeded, errored, and canceled or expired for
 *   those never run).
 * - Every function is safe from any thread. */
#ifndef NV_SERVE_BATCHES_H
#define NV_SERVE_BATCHES_H

#include <stddef.h>

#include "serve/api.h"
#include "serve/files.h"

typedef struct nv_batches nv_batches;

/* The batches DIR (the files' folder) holds, for files. */
nv_err nv_batches_open(nv_batches **out, nv_files *files);
/* Starts the thread that runs them against the server at 127.0.0.1:port (requests need api_key),
 * workers requests at once, each waited for up to timeout_s and a minute. */
nv_err nv_batches_start(nv_batches *b, int port, const char *api_key, int workers, float timeout_s);
/* The server is stopping: level 1, no request starts after (those running finish); 2, those running
 * are abandoned too. The batch stays in_progress for the next start. */
void nv_batches_stop(nv_batches *b, int level);
/* Joins the thread (after nv_batches_stop) and frees b. */
void nv_batches_close(nv_batches *b);

/* How many batches are in each status: names[i] and counts[i] for the i < the returned number
 * (at most cap) of statuses. */
int nv_batches_counts(nv_batches *b, const char **names, int *counts, int cap);

/* The endpoints: 0 with the JSON answer in *out (malloc'd), else the error in e (its status).
 * anthropic: Anthropic's Message Batches (/v1/messages/batches: msgbatch_ ids, MessageBatch objects,
 * whose results_url is base + /v1/messages/batches/ID/results), else OpenAI's (/v1/batches); each
 * sees its own batches only. */
int nv_batches_create(nv_batches *b, const char *body, size_t len, char **out, nv_api_error *e);
/* {"requests": [{"custom_id", "params"}...]}: each checked as nerve batch checks a Message Batches
 * line (400 naming the first bad one), kept in DIR/ID.input.jsonl. */
int nv_batches_create_anthropic(nv_batches *b, const char *body, size_t len, const char *base, char **out, nv_api_error *e);
int nv_batches_get(nv_batches *b, int anthropic, const char *id, const char *base, char **out, nv_api_error *e);
int nv_batches_cancel(nv_batches *b, int anthropic, const char *id, const char *base, char **out, nv_api_error *e);
/* Whether a batch that has not ended reads file_id (its input: deleting it then is refused). */
int nv_batches_uses(nv_batches *b, const char *file_id);
/* Newest first: after an id the older ones, before an id the newer ones nearest it (NULL: from the
 * newest), at most limit. */
int nv_batches_list(nv_batches *b, int anthropic, int limit, const char *after, const char *before, const char *base, char **out,
                    nv_api_error *e);
/* Anthropic's: an ended batch, its requests and results removed. */
int nv_batches_delete(nv_batches *b, const char *id, char **out, nv_api_error *e);
/* Anthropic's results (an ended batch's, a line per request in the order they ended: succeeded,
 * errored, canceled or expired): *fd open on them (the caller closes it; -1: none), *bytes. */
int nv_batches_results(nv_batches *b, const char *id, int *fd, long long *bytes, nv_api_error *e);

#endif
