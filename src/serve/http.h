/* The HTTP front of `nerve serve`, on libmicrohttpd: routes, authentication, CORS, the
 * OpenAI endpoints (whole responses and SSE streams), /health and /metrics.
 *
 * Contract:
 * - One thread per connection (libmicrohttpd's thread-per-connection mode with poll). A
 *   completion request is validated (serve/api.h), submitted to the scheduler and then waited
 *   for by its connection thread; while it waits, the thread checks every 100 ms whether the
 *   client has closed its socket and, if so, cancels the request (its KV blocks return to the
 *   pool at the scheduler's next iteration). A stream is a chunked response whose content
 *   callback blocks for the next text; a client that goes away mid-stream makes the write fail
 *   or the socket check fire, and the request is cancelled the same way.
 * - Routes: GET / (the chat page, serve/webui.h; never authenticated; off: 404), GET /health (never
 *   authenticated), GET /metrics, GET /v1/models,
 *   GET /v1/models/{id}, POST /v1/completions, POST /v1/chat/completions (also without the
 *   /v1 prefix), the other APIs' (docs/serving.md lists them all; with files, OpenAI's Files and
 *   Batch APIs and Anthropic's Message Batches, an upload streamed into the store as it comes, its
 *   key checked first); OPTIONS for CORS preflight when cors is on. Wrong method: 405; unknown path:
 *   404; every error carries OpenAI's body {"error":{"message","type","param","code"}}.
 * - With api_keys set (any of them), everything but /health and CORS preflights needs
 *   "Authorization: Bearer KEY" (compared in time independent of where the keys differ), else
 *   401. No CORS header is ever sent unless cors is on.
 * - A body larger than max_body is refused with 413 (at once when Content-Length says so).
 * - A full queue answers 429 with Retry-After; a stopping server answers 503. */
#ifndef NV_SERVE_HTTP_H
#define NV_SERVE_HTTP_H

#include <stddef.h>

#include "serve/api.h"
#include "serve/batches.h"
#include "serve/files.h"
#include "serve/finetune.h"
#include "serve/metrics.h"
#include "serve/ollama.h"
#include "serve/rerank.h"
#include "serve/sched.h"
#include "serve/uploads.h"

typedef struct {
    const char *host; /* numeric address or name to bind */
    int port;         /* 0: any free port (see nv_http_port) */
    const char *const *api_keys; /* any of them is accepted (none: no key needed) */
    int n_api_keys;
    int cors;
    int webui; /* GET / answers the chat page (serve/webui.h); else 404 */
    int quiet_access; /* each request's log line at debug level, not info (nerve batch's own server) */
    int background;   /* its requests queue behind every other (the Batch API's server of its own) */
    nv_olla_model_info olla; /* what Ollama's /api/tags and /api/show tell of the model */
    size_t max_body;
    double timeout_s; /* a request's limit (0: none) */
    const char *engine; /* shown in /metrics */
    int lora_updates;   /* /v1/load_lora_adapter and /v1/unload_lora_adapter are on (ctx->adapters must be set) */
    size_t responses_store; /* bytes of stored Responses (previous_response_id, GET /v1/responses/{id}); 0: none */
    nv_files *files;     /* OpenAI's Files API (/v1/files) on this store; NULL: off (404) */
    nv_ftjobs *ftjobs;   /* and its fine-tuning jobs API (/v1/fine_tuning/jobs); NULL: off (404) */
    nv_uploads *uploads; /* and its Uploads API (/v1/uploads: a file in parts); NULL: off (404) */
    const nv_rerank *rerank; /* /rerank, /v1/rerank, /v2/rerank, /score, /v1/score (NULL: they answer that this
                                server does not rerank) */
    nv_batches *batches; /* and its Batch API (/v1/batches), Anthropic's Message Batches (/v1/messages/batches) */
    const char *tls_key, *tls_cert; /* PEM text of the private key and its certificate chain: HTTPS (NULL: HTTP);
                                       kept by the caller until nv_http_stop */
} nv_http_opts;

typedef struct nv_http nv_http;

nv_err nv_http_start(nv_http **out, const nv_http_opts *o, nv_sched *s, nv_metrics *m, const nv_api_ctx *ctx);
int nv_http_port(const nv_http *h);
/* Requests received whose response has not been sent completely. */
int nv_http_active(nv_http *h);
/* Stops accepting connections; open ones are still served (new requests on them get 503). */
void nv_http_quiesce(nv_http *h);
/* Closes every connection, joins their threads and frees h. Requests must be finished first
 * (nv_sched_stop), so no connection thread is left waiting. */
void nv_http_stop(nv_http *h);

#endif
