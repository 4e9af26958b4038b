/* OpenAI's Conversations API (/v1/conversations): conversations whose items a Responses request
 * (`conversation`) reads as its context and adds its input and output to when it finishes. No HTTP
 * here.
 *
 * Contract:
 * - A store keeps conversations in memory, safe to share between threads, up to cap bytes (their
 *   items' JSON): past it the least recently used go first, and a conversation alone past a quarter
 *   of cap takes no more items (400 on the Conversations routes; a response is answered and its
 *   items not added, with a warning in the log). Nothing survives a restart.
 * - Items are Responses input items (messages with role user, system, developer or assistant;
 *   function_call, function_call_output), checked as a request's input is and kept as the model is
 *   shown them (nv_resp_items_take): type, id (given or made: msg_..., fc_..., fco_...), role and text
 *   parts; reasoning items are not kept (never shown to the model again). An id appears once in a
 *   conversation.
 * - Objects: {"id": "conv_...", "object": "conversation", "created_at", "metadata"} (metadata: at
 *   most 16 string values, keys up to 64 characters, values up to 512); a list of items is OpenAI's
 *   {"object": "list", "data", "first_id", "last_id", "has_more"}. Errors are the OpenAI API's: 404
 *   not_found for an unknown conversation or item. */
#ifndef NV_SERVE_CONVERSATIONS_H
#define NV_SERVE_CONVERSATIONS_H

#include <stddef.h>

#include "serve/api.h"

typedef struct nv_conv_store nv_conv_store;
nv_err nv_conv_store_new(size_t cap, nv_conv_store **out);
void nv_conv_store_free(nv_conv_store *s);
void nv_conv_store_stats(nv_conv_store *s, size_t *count, size_t *bytes);

/* The routes: 0 with *out the JSON answer, or the error's status with err filled. body/len: the
 * request's JSON; limit, order, after: the list's query (NULL: absent). */
int nv_conv_create(nv_conv_store *s, const char *body, size_t len, char **out, nv_api_error *err);        /* POST /conversations */
int nv_conv_get(nv_conv_store *s, const char *id, char **out, nv_api_error *err);                          /* GET .../{id} */
int nv_conv_update(nv_conv_store *s, const char *id, const char *body, size_t len, char **out, nv_api_error *err); /* POST .../{id} */
int nv_conv_delete(nv_conv_store *s, const char *id, char **out, nv_api_error *err);                       /* DELETE .../{id} */
int nv_conv_items_add(nv_conv_store *s, const char *id, const char *body, size_t len, char **out, nv_api_error *err);
int nv_conv_items_list(nv_conv_store *s, const char *id, const char *limit, const char *order, const char *after, char **out,
                       nv_api_error *err);
int nv_conv_item_get(nv_conv_store *s, const char *id, const char *item, char **out, nv_api_error *err);
int nv_conv_item_delete(nv_conv_store *s, const char *id, const char *item, char **out, nv_api_error *err); /* answers the conversation */

/* For a Responses request: a copy of the conversation's items (*items), checked against the
 * request's own items (none of their ids may be in it already: 400 naming input); 0, or the error's
 * status (404 naming conversation when it is not kept). */
int nv_conv_context(nv_conv_store *s, const char *id, const cJSON *own, cJSON **items, nv_api_error *err);
/* The first id two of items share, copied to out (cap bytes): 1 when there is one, 0 none, -1 out of memory. */
int nv_items_duplicate_id(const cJSON *items, char *out, size_t cap);
/* Adds items (kept form, copied) at the end of conversation id: 1 when added, 0 when the
 * conversation is gone or full (a warning in the log). */
int nv_conv_append(nv_conv_store *s, const char *id, const cJSON *items);

#endif
