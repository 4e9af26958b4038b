/* OpenAI's Responses API's JSON (POST /v1/responses), served by the chat request machinery (no
 * HTTP here).
 *
 * Contract:
 * - nv_resp_parse() checks a Responses request and turns it into the chat request
 *   /v1/chat/completions runs: `instructions` becomes the system message; `input` is a string
 *   (one user message) or a list of items: messages (role user, system, developer or assistant;
 *   content a string or input_text / output_text parts), function_call items (an assistant's
 *   tool_calls; consecutive ones, and those right after an assistant message, join that turn),
 *   function_call_output items (tool messages) and reasoning items (dropped: earlier turns' thinking
 *   is not shown again); images, files and references to stored items are refused. Fields:
 *   max_output_tokens (a ceiling: past the room the context leaves, the answer gets that room and
 *   the response is "incomplete"), temperature, top_p, stream, tools (function tools, flat:
 *   {"type": "function", "name", "description", "parameters"}; error params are the Responses
 *   request's names), tool_choice, parallel_tool_calls,
 *   text.format (text, json_object, json_schema: structured outputs), reasoning.effort ("none" or
 *   "minimal" turns a reasoning model's thinking off), metadata and user (echoed), store (default
 *   true) and previous_response_id. With a store (nv_resp_store, `serve --responses-store`), a
 *   finished response (completed or incomplete) is kept unless store is false, and
 *   previous_response_id continues one: the model sees the items it saw then, its output, and this
 *   request's input, under this request's instructions (OpenAI's rule: the earlier instructions are
 *   not carried over); an id not kept is a 400 previous_response_not_found. Without a store,
 *   previous_response_id is refused and store answered false. background (with a store) runs the
 *   request in the server (serve/http.c keeps it as it goes and streams its events); conversation
 *   (an id or {"id"}; not with previous_response_id) puts that conversation's items before the
 *   input, and a response that finishes (completed or incomplete) adds its input and output items
 *   to it. Errors are the OpenAI API's.
 * - Responses: {"id": "resp_...", "object": "response", "created_at", "status": "completed" or
 *   "incomplete" (with incomplete_details.reason "max_output_tokens"), "model", "output": [a
 *   reasoning item (--reasoning-format), a message item with one output_text part, a function_call
 *   item per call], "usage": {"input_tokens", "input_tokens_details": {"cached_tokens"},
 *   "output_tokens", "output_tokens_details": {"reasoning_tokens"}, "total_tokens"}, and the
 *   request's configuration echoed (instructions, max_output_tokens, temperature, top_p, tools,
 *   tool_choice, parallel_tool_calls, text, reasoning, metadata, user, ...)}.
 * - Streamed: events "event: TYPE\ndata: {"type": TYPE, "sequence_number": n, ...}" in OpenAI's
 *   order: response.created, response.in_progress, per output item response.output_item.added,
 *   its parts and deltas (response.content_part.added, response.output_text.delta / .done,
 *   response.content_part.done; response.reasoning_text.delta / .done;
 *   response.function_call_arguments.delta / .done), response.output_item.done, and at the end
 *   response.completed or response.incomplete with the whole response (the one a whole request
 *   gets); response.failed when the request fails part way (the open item closed "incomplete").
 *   Hosted tools (web_search, file_search, local_shell, ...) are left out of the request with a
 *   warning in the log: only function tools run here. */
#ifndef NV_SERVE_RESPONSES_H
#define NV_SERVE_RESPONSES_H

#include "serve/api.h"
#include "serve/conversations.h"

/* Stored responses: in memory, at most cap bytes (the oldest dropped first), safe to share between
 * threads. Texts given to put are taken. */
typedef struct nv_resp_store nv_resp_store;
nv_err nv_resp_store_new(size_t cap, nv_resp_store **out);
void nv_resp_store_free(nv_resp_store *s);
/* response: the response object's JSON; context: the items the model saw before its output (a JSON
 * list); input: the request's own input items, with ids (a JSON list). */
/* 1 when it was kept, 0 when it was not (over a quarter of cap, or out of memory). */
int nv_resp_store_put(nv_resp_store *s, const char *id, char *response, char *context, char *input);
/* Copies of what is kept for id (NULL pointers: not wanted): 1, 0 when none is, -1 out of memory. */
int nv_resp_store_copy(nv_resp_store *s, const char *id, char **response, char **context, char **input);
int nv_resp_store_delete(nv_resp_store *s, const char *id); /* 1 when it was kept */
void nv_resp_store_stats(nv_resp_store *s, size_t *count, size_t *bytes);

/* GET /v1/responses/{id}, DELETE /v1/responses/{id} ({"id", "object": "response", "deleted": true})
 * and GET /v1/responses/{id}/input_items (OpenAI's list: limit 1-100, default 20; order "asc" or
 * "desc", the default; after an item id), answered from the store (NULL: none). 0 with *out the
 * JSON, or the error's status (404 for an id not kept). */
int nv_resp_get(nv_resp_store *s, const char *id, char **out, nv_api_error *err);
int nv_resp_delete(nv_resp_store *s, const char *id, char **out, nv_api_error *err);
int nv_resp_input_items(nv_resp_store *s, const char *id, const char *limit, const char *order, const char *after, char **out,
                        nv_api_error *err);

typedef struct {
    char id[48];  /* resp_... */
    long created;
    char model[NV_API_MODEL_ID];
    cJSON *echo; /* the request's configuration, as every response object repeats it */
    nv_resp_store *keep; /* where the finished response is kept (NULL: it is not) */
    cJSON *context;      /* the items the model sees: the previous response's and this input */
    cJSON *input;        /* this request's input items, with ids */
    int background;      /* background: true (kept: keep is set) */
    nv_conv_store *convs; /* the conversation's store when the request names one (its items then context's first) */
    char conversation[48];
} nv_resp_meta;

/* Parses a Responses body into out (a chat request; out->stream from 'stream') and meta (free
 * with nv_resp_meta_free); store (NULL: none) holds the responses previous_response_id names and
 * keeps this one. Returns 0, or the error's status with err filled. */
int nv_resp_parse(const nv_api_ctx *ctx, nv_resp_store *store, nv_conv_store *convs, const char *body, size_t len,
                  nv_api_request *out, nv_resp_meta *meta, nv_api_error *err);

/* POST /v1/responses/input_tokens: the prompt tokens the request body (a Responses request) would
 * have, truncation included, its length not checked against the context: {"object":
 * "response.input_tokens", "input_tokens"}. 0 with *out, or the error's status. */
int nv_resp_input_tokens(const nv_api_ctx *ctx, nv_resp_store *store, nv_conv_store *convs, const char *body, size_t len, char **out,
                         nv_api_error *err);

/* items (a JSON list of input items; param: their name in errors, "items" -> "items[2].content")
 * checked as a request's input is, into *out as a stored response keeps them (each with its type and
 * an id, given or made; reasoning items left out). 0 or the error's status. */
int nv_resp_items_take(const cJSON *items, const char *param, cJSON **out, nv_api_error *err);
/* OpenAI's page of a list of items (taken): limit (text, 1-100, default 20), order "asc" or "desc"
 * (the default), after an item's id (owner: what holds them, for its error). 0 with *out, or the
 * error's status. */
int nv_resp_item_page(cJSON *items, const char *limit, const char *order, const char *after, const char *owner, char **out,
                      nv_api_error *err);
/* The same of a list it leaves as it is (only the page is copied: a conversation's, under its lock). */
int nv_resp_item_page_of(const cJSON *items, const char *limit, const char *order, const char *after, const char *owner, char **out,
                         nv_api_error *err);
void nv_resp_meta_free(nv_resp_meta *m);

typedef struct {
    const char *reasoning, *text; /* reasoning NULL or "": none */
    const nv_tool_call *calls;
    int n_calls;
    int incomplete; /* the answer ran out of room (max_output_tokens or the context) */
    int prompt_tokens, cached_tokens, output_tokens;
} nv_resp_answer;
/* The whole response (kept in m->keep when there is one; *kept, when kept is not NULL, says whether
 * it was: one too large for the store is not). */
char *nv_resp_response(const nv_resp_meta *m, const nv_resp_answer *a, int *kept);
/* A response without an answer (kept as nv_resp_response keeps one): a background response
 * "queued" or "in_progress", or ended "cancelled" or "failed" (e: its error, NULL or status 0 for
 * none). */
char *nv_resp_unfinished(const nv_resp_meta *m, const char *status, const nv_api_error *e, int *kept);

/* The event stream, appended to out (out->oom on failure). */
typedef struct {
    const nv_resp_meta *m;
    int seq;     /* the next event's sequence_number */
    int open;    /* the item being written: 0 none, 1 message, 2 reasoning */
    int index;   /* its output_index (the next item's when none is open) */
    int answered; /* a message or a call has begun (else the end adds an empty message) */
    nv_buf text; /* its text so far, for its .done events */
    cJSON *items; /* the items done, for the final response */
} nv_resp_stream;
/* response.created, then response.in_progress; a background response's: response.created and
 * response.queued (status "queued"), its response.in_progress sent by nv_resp_stream_running when
 * its request begins. */
void nv_resp_stream_start(nv_resp_stream *s, const nv_resp_meta *m, nv_buf *out);
void nv_resp_stream_running(nv_resp_stream *s, nv_buf *out);
void nv_resp_stream_text(nv_resp_stream *s, int reasoning, const char *text, nv_buf *out);
void nv_resp_stream_call(nv_resp_stream *s, const nv_tool_call *c, nv_buf *out);
/* Closes what is open and sends response.completed (or .incomplete), the response kept as
 * nv_resp_response keeps it (*kept as there); a holds the usage (its text and calls were streamed
 * already). */
void nv_resp_stream_end(nv_resp_stream *s, const nv_resp_answer *a, nv_buf *out, int *kept);
/* Closes what is open ("incomplete") and sends response.failed with the response's status "failed"
 * (e: its error) or "cancelled" (e NULL; error null); a background response's is kept (*kept, when
 * kept is not NULL, says whether it was). */
void nv_resp_stream_fail(nv_resp_stream *s, const char *status, const nv_api_error *e, nv_buf *out, int *kept);
void nv_resp_stream_free(nv_resp_stream *s);

#endif
