/* The Anthropic Messages API's JSON (POST /v1/messages and /v1/messages/count_tokens), served by
 * the same request machinery as the OpenAI API (no HTTP here).
 *
 * Contract:
 * - nv_anth_parse() checks a Messages request in Anthropic's terms (model and max_tokens required;
 *   messages of role user or assistant whose content is a string or a list of blocks: text,
 *   tool_use in the assistant's, tool_result in the user's; thinking blocks of earlier turns are
 *   dropped, as Anthropic's API drops them; images and documents are refused: the models read text;
 *   a top-level system prompt; stop_sequences; temperature 0..1, top_p, top_k; tools with an
 *   input_schema and tool_choice auto/any/tool/none with disable_parallel_tool_use; thinking
 *   "enabled" or "adaptive": with --reasoning-format, where the model reasons, it does so only when asked, as
 *   Anthropic's models do: Qwen3's switch off otherwise) and turns it into the OpenAI chat request
 *   the server already runs: tool_use and tool_result become tool_calls and tool messages, the
 *   system prompt a system message. A last message from the assistant is a prefill the answer
 *   continues (its text must not end in white space, as Anthropic's API requires). max_tokens is
 *   the most the answer may take: where the context ends sooner, the answer ends there with
 *   stop_reason "max_tokens" (clients send their own defaults, larger than a small model's
 *   context). Errors come back as nv_api_error; nv_anth_error_json writes Anthropic's shape
 *   {"type": "error", "error": {"type", "message"}} with the type its status maps to.
 * - Responses: a whole message {"id": "msg_...", "type": "message", "role": "assistant", "model",
 *   "content": [thinking?, text?, tool_use...], "stop_reason": end_turn | max_tokens |
 *   stop_sequence | tool_use, "stop_sequence", "usage": {"input_tokens" (not counting cache
 *   reads), "cache_read_input_tokens" (the prefix cache's), "cache_creation_input_tokens": 0,
 *   "output_tokens"}}, or its stream of server-sent events: message_start (sent once the prompt is
 *   in, so its usage has the prefix cache's share), ping, for each block
 *   content_block_start / _delta (text_delta, thinking_delta, input_json_delta) / _stop,
 *   message_delta (stop_reason, stop_sequence, usage), message_stop; an error event ends a stream
 *   that fails part way. */
#ifndef NV_SERVE_ANTHROPIC_H
#define NV_SERVE_ANTHROPIC_H

#include "serve/api.h"

/* What a response needs from its request after the request is gone. */
typedef struct {
    char id[48];
    char model[NV_API_MODEL_ID];
    char *stop[NV_MAX_STOP]; /* the request's stop_sequences, in req.stop's order (index < n_stop) */
    int n_stop;
} nv_anth_meta;

/* Parses a Messages body into out (an OpenAI chat request, out->stream set from 'stream') and
 * meta (its id and stop sequences, to free with nv_anth_meta_free); count_only: a count_tokens
 * body (no max_tokens, no length limit). Returns 0, or the error's status with err filled. */
int nv_anth_parse(const nv_api_ctx *ctx, const char *body, size_t len, int count_only, nv_api_request *out,
                  nv_anth_meta *meta, nv_api_error *err);
void nv_anth_meta_free(nv_anth_meta *m);
/* Anthropic's error type for an HTTP status (invalid_request_error, authentication_error, ...). */
const char *nv_anth_error_type(int status);
char *nv_anth_error_json(const nv_api_error *e);
/* stop_reason for how an answer ended; *stop_sequence the stop sequence that ended it or NULL. */
const char *nv_anth_stop_reason(const nv_anth_meta *m, nv_finish f, int stop_index, int n_calls, const char **stop_sequence);

/* The whole message. reasoning: the answer's think block (--reasoning-format), NULL or "" when none. */
typedef struct {
    const char *reasoning, *text;
    const nv_tool_call *calls;
    int n_calls;
    const char *stop_reason, *stop_sequence;
    int prompt_tokens, cached_tokens, output_tokens;
} nv_anth_answer;
char *nv_anth_message(const nv_anth_meta *m, const nv_anth_answer *a);
/* {"input_tokens": n} */
char *nv_anth_count_json(int input_tokens);
/* GET /v1/models (single 0) or /v1/models/{id} (single 1) as Anthropic's API answers them, for a
 * client that sends anthropic-version: {"data": [{"type": "model", "id", "display_name",
 * "created_at"}], "has_more": false, "first_id", "last_id"}, or the one model object. */
char *nv_anth_models(const nv_api_ctx *ctx, long created, const char *single);

/* A stream's events, appended to out as "event: NAME\ndata: JSON\n\n" (out->oom on failure). */
typedef struct {
    const nv_anth_meta *m;
    int open;  /* the block being written: 0 none, 1 text, 2 thinking */
    int index; /* the next block's index */
} nv_anth_stream;
/* message_start (its usage: the prompt's tokens, cached_tokens of them from the prefix cache) and a ping. */
void nv_anth_stream_start(nv_anth_stream *s, const nv_anth_meta *m, int prompt_tokens, int cached_tokens, nv_buf *out);
/* Text of the answer (thinking: of its think block), opening a block of that kind when needed. */
void nv_anth_stream_text(nv_anth_stream *s, int thinking, const char *text, nv_buf *out);
void nv_anth_stream_call(nv_anth_stream *s, const nv_tool_call *c, nv_buf *out);
void nv_anth_stream_end(nv_anth_stream *s, const nv_anth_answer *a, nv_buf *out);
void nv_anth_stream_error(const nv_api_error *e, nv_buf *out);

#endif
