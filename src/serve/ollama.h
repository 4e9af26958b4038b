/* Ollama's API (POST /api/chat and /api/generate, GET /api/tags, /api/ps, /api/version, POST
 * /api/show), served by the same request machinery as the OpenAI API, so the tools written for
 * Ollama talk to nerve unchanged; POST /api/embed (and /api/embeddings) as /v1/embeddings. No HTTP here.
 *
 * Contract:
 * - nv_olla_parse() turns a chat body ({model, messages, tools, format, options, stream, think,
 *   keep_alive}) into the OpenAI chat request the server runs, and a generate body ({model,
 *   prompt, suffix, system, format, options, stream, think, raw, keep_alive}) into a chat request of
 *   one user message (the model's template applied, as Ollama does), with raw into a completions
 *   request of the prompt as it is, or with a suffix into a completions request with OpenAI's
 *   suffix: the model's fill-in-the-middle form of prompt and suffix (a vocabulary without its
 *   markers is refused; system and raw do not go with it). stream defaults to true (Ollama's default). options: seed,
 *   num_predict (max_tokens as a ceiling: the answer ends where the context does; -1 and -2: no
 *   limit), temperature, top_k, top_p, min_p, typical_p, repeat_penalty (repetition_penalty),
 *   presence_penalty, frequency_penalty, mirostat, mirostat_tau, mirostat_eta, stop; the options
 *   that tune Ollama's runner and change no answer here (num_ctx, num_batch, num_thread, num_gpu,
 *   use_mmap, ...) are accepted and ignored. format: "json" (any JSON object) or a JSON schema.
 *   think: false turns a reasoning model's thinking off (Qwen3's switch). A message's tool_calls
 *   carry their arguments as a JSON object; a tool message answers the latest call (by tool_name
 *   when given). generate's context (the ids an earlier answer returned: the conversation so far)
 *   goes before the prompt's rendering, whose BOS is then left out (llama2's kept); with raw or a
 *   suffix it is refused. images (no model here reads them), template, and context and suffix on
 *   /api/chat are refused unless empty. A prompt (context included) that the context or the KV pool
 *   cannot hold with room for an answer is truncated as Ollama truncates, not refused: its first
 *   options.num_keep tokens (default 4) and its last, half of the room past those (nv_api_parse_opts).
 *   The model is named by its id, with or without Ollama's ":latest" tag. A chat
 *   without messages, or a generate without a prompt, loads the model: *load_only is set and
 *   nothing is parsed into out (nv_olla_loaded answers it).
 * - Answers (nv_olla_chunk, nv_olla_done): JSON objects, one a line when streamed
 *   (application/x-ndjson): {"model", "created_at" (RFC 3339, UTC), "message": {"role":
 *   "assistant", "content", "thinking"?, "tool_calls"?} (chat) or "response" and "thinking"?
 *   (generate), "done": false}; the last (or the whole answer) has "done": true, "done_reason"
 *   (stop, length), "total_duration", "load_duration" (0: the model is loaded at start),
 *   "prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration" (nanoseconds);
 *   generate through the template adds "context": the context it came with, then its system
 *   message, prompt and answer as nv_chat_render_history renders them (left out when that fails).
 * - Errors are {"error": MESSAGE} with the status (nv_olla_error_json). */
#ifndef NV_SERVE_OLLAMA_H
#define NV_SERVE_OLLAMA_H

#include "serve/api.h"

/* What a response needs from its request after the request is gone. */
typedef struct {
    char model[NV_API_MODEL_ID + 8]; /* the name as the request gave it (":latest" kept) */
    int chat;                        /* /api/chat, else /api/generate */
    int load_only;                   /* no messages or prompt: the model is only "loaded" */
    double t_arrival;
    /* /api/generate through the template: what its answer's context is made of (owned; NULL
       otherwise). context: the ids the request came with; system may be NULL. */
    const nv_api_ctx *ctx;
    char *system, *prompt;
    int no_think;       /* the prompt's thinking switch and effort, as the request was rendered */
    const char *effort;
    int *context, n_context;
    nv_buf streamed; /* a stream's content so far (the context needs the whole answer) */
} nv_olla_meta;
void nv_olla_meta_free(nv_olla_meta *m);

int nv_olla_parse(const nv_api_ctx *ctx, const char *body, size_t len, int chat, nv_api_request *out, nv_olla_meta *meta,
                  nv_api_error *err);
char *nv_olla_error_json(const nv_api_error *e);

/* New text of a streamed answer (thinking or content may be "" or NULL; calls completed with it). */
char *nv_olla_chunk(const nv_olla_meta *m, const char *thinking, const char *content, const nv_tool_call *calls, int n_calls);
typedef struct {
    const char *thinking, *content; /* the whole answer's, or "" for a stream's last object */
    const nv_tool_call *calls;
    int n_calls;
    nv_finish finish;
    int prompt_tokens, completion_tokens;
    double prompt_s, gen_s; /* from arrival to the first token, and from it to the last */
    const char *whole;      /* the whole answer's content, for generate's context */
} nv_olla_answer;
char *nv_olla_done(const nv_olla_meta *m, const nv_olla_answer *a);
/* The answer to a load-only request: done, done_reason "load". */
char *nv_olla_loaded(const nv_olla_meta *m);

/* POST /api/embed {model, input: a text or a list of them, truncate, dimensions, options, keep_alive}
 * (legacy: POST /api/embeddings {model, prompt}) as the embeddings request it stands for (the same
 * checks: an input past the context is refused, whatever truncate says; dimensions only the
 * model's width). The answer: {"model", "embeddings": [[...], ...], "total_duration",
 * "load_duration", "prompt_eval_count"} (legacy: {"embedding": [...]}), each vector of unit length. */
int nv_olla_embed_parse(const nv_api_ctx *ctx, const char *body, size_t len, int legacy, nv_api_embed *out, nv_olla_meta *meta,
                        nv_api_error *err);
char *nv_olla_embed_response(const nv_olla_meta *m, int legacy, const float *vecs, int n, int dim, int prompt_tokens);

/* GET /api/tags: the base model and each adapter as "ID:latest" with their details; GET /api/ps
 * the same as running models; POST /api/show {"model"} that model's details, parameters and
 * template name (404 for an unknown one); GET /api/version. started: the server's start time. */
typedef struct {
    long long n_params, file_bytes;
    const char *family;       /* the architecture, e.g. llama, qwen3 */
    const char *quantization; /* the weights' type, e.g. F32, Q8_0, Q4_K_M */
    const char *format;       /* gguf, safetensors, llama2.c */
} nv_olla_model_info;
char *nv_olla_tags(const nv_api_ctx *ctx, const nv_olla_model_info *info, long started, int running);
int nv_olla_show(const nv_api_ctx *ctx, const nv_olla_model_info *info, const char *body, size_t len, char **out,
                 nv_api_error *err);
char *nv_olla_version(void);

#endif
