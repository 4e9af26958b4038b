/* The OpenAI API's JSON: request validation and response bodies (no HTTP here).
 *
 * Contract:
 * - nv_api_parse() checks a /v1/completions or /v1/chat/completions body completely before
 *   anything runs: JSON syntax, the type and range of every field it knows, the model name, the
 *   prompt's length against the context and the KV pool, and the features this server does not
 *   have (best_of, suffix, functions, ...: a clear 400 rather than a silent ignore). A response
 *   format or a tool_choice that requires a call becomes the request's grammar; tools under
 *   "auto" a lazy grammar that holds a call to the tools' schemas once it has begun.
 *   Unknown fields are ignored, as OpenAI's own server does. On failure it fills an
 *   nv_api_error with the HTTP status and the fields of OpenAI's error body
 *   {"error":{"message","type","param","code"}} and returns the status; on success it returns 0
 *   and the request's prompt ids and sampling parameters.
 * - Defaults: max_tokens 16 for completions (OpenAI's), the rest of the context for chat;
 *   either way capped by what one request can reserve in the KV pool. temperature 1, top_p 1,
 *   seed random. An explicit max_tokens that does not fit the context is a 400
 *   (context_length_exceeded), as OpenAI answers.
 * - Response builders return malloc'd JSON text (NULL when out of memory). */
#ifndef NV_SERVE_API_H
#define NV_SERVE_API_H

#include <stddef.h>

#include "serve/chat.h"
#include "serve/sched.h"
#include "serve/tools.h"

/* Bytes of a model id's copy in requests and responses (--alias takes up to 255). */
#define NV_API_MODEL_ID 256

typedef struct {
    int status;       /* HTTP status */
    const char *type; /* invalid_request_error, ... */
    const char *code; /* NULL -> null */
    char param[64];   /* "" -> null */
    char message[512];
} nv_api_error;

typedef struct {
    const char *model_id;
    const nv_tokenizer *tok;
    nv_chat_template tmpl;
    int seq_len, vocab_size;
    long capacity; /* positions one request can reserve */
    int think_tags; /* the tags the model's think blocks are in (NV_THINK_ANGLE, or 0, NV_THINK_BRACKET: Mistral's) */
    int reasoning; /* --reasoning-format deepseek: a chat answer's think block goes to reasoning_content */
    int think_budget; /* --reasoning-budget: the tokens a chat answer's think block may spend (-1: no limit) */
    const int *think_close; /* the tokens forced when they are spent (--reasoning-budget-message, then the tags' close) */
    int n_think_close;
    const char *reasoning_effort; /* --reasoning-effort: the templates' reasoning_effort where a request gives none (NULL: none) */
    int priority_sched; /* --scheduling-policy priority: requests' priority orders the queue (else a non-zero one is a 400) */
    int dim;       /* the model's width: an embedding's length */
    int trust_request_template; /* --trust-request-chat-template: a chat request's own chat_template is run (vLLM's) */
    int matryoshka; /* a Matryoshka embedding model (--matryoshka, or its folder says so): 'dimensions' cuts vectors */
    const int *mrl_dims; /* the widths it was trained at, which alone 'dimensions' may then name (n_mrl_dims; 0: any) */
    int n_mrl_dims;
    nv_adapters *adapters; /* LoRA adapters a request's 'model' may name (NULL: none) */
    const nv_jinja *jinja; /* the model's template, run (nv_chat_opts.jinja); NULL: tmpl's renderer */
    /* the form that template writes tool calls in (nv_chat_jinja_tool_style: XML, Mistral's [ARGS]), answers
       read and held so; NV_TOOLS_HERMES (0): tmpl's */
    nv_tool_style jinja_tools;
} nv_api_ctx;


#define NV_MAX_CHOICES 16

/* A request's tools, for reading calls out of its answers (outlives the request: the HTTP layer
 * takes it). */
typedef struct {
    nv_tool_style style;
    int n;
    char **names;
    cJSON *tools; /* XML style: the request's tools, whose schemas say how each parameter's text is read */
} nv_api_tools;
void nv_api_tools_free(nv_api_tools *t);

typedef struct {
    int chat, stream, include_usage, echo;
    /* chat: the answer's leading think block goes to reasoning_content (req.think_open: the prompt opened
       it); 0, or its tags (ctx's think_tags, never 0), what grammars and answers are read with */
    int reasoning;
    int lp_ids;    /* vLLM's return_tokens_as_token_ids */
    int prompt_lp; /* vLLM's prompt_logprobs: the response carries the prompt's records (req.prompt_top alternatives) */
    int no_think;  /* chat: the prompt was rendered with thinking off (nv_chat_opts') */
    const char *effort; /* chat: its reasoning effort (a static level name, nv_api_effort_level's), or NULL */
    int n; /* choices per prompt: that many sequences from each prompt */
    /* completions: prompts after the first (a list of several); prompts x n <= NV_MAX_CHOICES */
    int n_more;
    struct {
        int *ids;
        int n;
        char *echo_text;
    } more[NV_MAX_CHOICES - 1];
    nv_req_params req; /* prompt and stop strings point into this struct */
    char model[NV_API_MODEL_ID]; /* the model's id, as responses name it (a copy: an adapter may be removed meanwhile) */
    int *prompt_ids;
    int *pred_ids; /* prediction's tokens (req.prediction points to them), or NULL */
    char *echo_text; /* the prompt as text, when echo */
    char *stop_copy[NV_MAX_STOP];
    int *allowed;  /* allowed_token_ids, when given */
    int *stop_ids; /* stop_token_ids, when given */
    int *bad_tok, *bad_len; /* bad_words' token sequences, when given */
    int *bias_tok; /* logit_bias, when given */
    float *bias;
    unsigned char *dry_breaker; /* DRY's breaker tokens, when DRY is on [vocab] */
    nv_grammar *grammar; /* response_format's or tool_choice's, when given (req.grammar points to it) */
    /* the format the answer was asked in, kept for tools (a call, or the answer in the format) */
    cJSON *format_schema; /* a JSON schema's copy, or NULL */
    int format_object;    /* any JSON object (response_format json_object) */
    int format_text;      /* a regular expression, choices or a grammar: nothing that stands beside calls */
    nv_api_tools *tools; /* chat with tools (and tool_choice not "none"): read the answer for calls */
    nv_grammar *lazy_grammar; /* tool_choice "auto": a call, once begun, is held to the tools' schemas */
    char **tool_json;    /* each tool as the template prints it (while the prompt is rendered) */
} nv_api_request;

void nv_api_error_set(nv_api_error *e, int status, const char *type, const char *code, const char *param,
                      const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* {"error":{...}} */
char *nv_api_error_json(const nv_api_error *e);

int nv_api_parse(const nv_api_ctx *ctx, int chat, const char *body, size_t len, nv_api_request *out, nv_api_error *err);
typedef struct cJSON cJSON;
/* A field of a JSON object, NULL when absent or null ("not given"). */
const cJSON *nv_api_field(const cJSON *root, const char *key);
/* root printed on one line (NULL when out of memory), root deleted. */
char *nv_api_print_free(cJSON *root);
/* The body as a JSON object (the caller deletes it); NULL with a 400 in err when it is not one. */
cJSON *nv_api_body_object(const char *body, size_t len, nv_api_error *err);
/* nv_api_parse on a parsed body, with what differs between the APIs that share it. */
typedef struct {
    int max_stop;   /* stop strings a request may list (OpenAI: 4; at most NV_MAX_STOP - 1) */
    int count_only; /* the prompt alone (to count its tokens): its length is not checked against the
                       context, max_tokens is not set */
    int max_tokens_cap; /* max_tokens is a ceiling: past the room the context or the KV pool leaves,
                           the answer gets that room instead of a 400 */
    /* ids put before the prompt (Ollama's context: a conversation so far), checked with it against
       the context; the prompt's BOS left out after them as nv_chat_leading_bos says */
    const int *prefix;
    int n_prefix;
    /* Ollama's truncation (truncate set): a prompt that the context or the KV pool cannot hold with
       room for one answer token keeps its first `keep` tokens (at most half of what it may hold) and
       its last ones, half of the room past them, instead of a 400 */
    int truncate, keep;
} nv_api_parse_opts;
int nv_api_parse_json(const nv_api_ctx *ctx, int chat, const cJSON *root, const nv_api_parse_opts *o, nv_api_request *out,
                      nv_api_error *err);
/* A body in another API's shape (Anthropic's Messages, OpenAI's Responses): translate(in, chat,
 * arg, err) writes the chat request it stands for into the empty object chat (0, or the error's
 * status), which is then parsed as nv_api_parse_json parses a chat body. */
typedef int (*nv_api_translate)(const cJSON *in, cJSON *chat, void *arg, nv_api_error *err);
int nv_api_parse_translated(const nv_api_ctx *ctx, const char *body, size_t len, nv_api_translate translate, void *arg,
                            const nv_api_parse_opts *o, nv_api_request *out, nv_api_error *err);
/* For the translators: a 400 with the message (returns its status); field key of in copied to out
 * (as key, or as `as` when given) when given, after checking its JSON type: kind 'n' a number, 'i'
 * an integer, 'b' a boolean, 'j' anything (the range, and a 'j' field's shape, are the OpenAI
 * parser's to check). */
int nv_api_bad(nv_api_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int nv_api_copy_field(const cJSON *in, cJSON *out, const char *key, const char *as, char kind, nv_api_error *err);
/* The fill-in-the-middle markers of a code model's vocabulary (prefix, suffix, middle): Qwen2.5-Coder's,
 * StarCoder's or DeepSeek-Coder's; 0 when it has none. */
int nv_api_fim_tokens(const nv_tokenizer *tok, int ids[3]);
/* A boolean field key of root into *out (left as it is when absent): 0, or a 400's status. */
int nv_api_get_bool(const cJSON *root, const char *key, int *out, nv_api_error *err);
/* 'model', when given, must name the served model or one of its adapters (which joins *lora at
 * factor 1); the id goes to id. 'lora' (llama.cpp's [{"id", "scale"}], nv_api_lora_parse) then
 * gives adapters their factors; with neither, *lora is the server's applied set
 * (nv_adapters_applied). 0, or the error's status. */
int nv_api_check_model(const nv_api_ctx *ctx, const cJSON *root, nv_adapter_mix *lora, char id[NV_API_MODEL_ID],
                       nv_api_error *err);
/* The 500 of an allocation that failed, in err; returns its status. */
int nv_api_oom(nv_api_error *err);
/* A fresh random id: prefix and 24 hex digits (chatcmpl-..., msg_..., resp_...). */
void nv_api_new_id(char *out, size_t cap, const char *prefix);
/* A chat request's "messages" (NULL when absent): OpenAI's list of {role, content: a string or
 * text parts, an assistant's tool_calls}, checked as /v1/chat/completions checks them. The
 * messages point into msgs (keep it alive) and into texts; on failure err holds the 400 and
 * nothing is left to free. Also reads chat fine-tuning data (nerve train's .jsonl). */
typedef struct {
    nv_chat_msg *m;
    nv_buf *texts; /* each message's content text */
    int n;
} nv_api_messages;
int nv_api_messages_parse(const cJSON *msgs, nv_api_messages *out, nv_api_error *err);
void nv_api_messages_free(nv_api_messages *msgs);
/* A request's "tools" (NULL, null or [] when none: *n = 0) checked as /v1/chat/completions checks
 * them, as the chat template prints each tool in its style (nv_chat_opts.tools): *texts is malloc'd,
 * NULL-terminated, freed with nv_api_tool_texts_free. */
int nv_api_tool_texts(const cJSON *tools, nv_tool_style style, char ***texts, int *n, nv_api_error *err);
void nv_api_tool_texts_free(char **texts, int n);
/* POST /tokenize: {"content": TEXT, "add_special": false, "with_pieces": false} (llama.cpp's server)
 * or {"prompt": TEXT, "add_special_tokens": true} (vLLM's) -> {"tokens": [ids] (with_pieces:
 * [{"id", "piece"}]), "count", "max_model_len"}; special tokens' text in TEXT is parsed. The
 * response body goes to *out (malloc'd); returns 0 or the error's status. */
int nv_api_tokenize(const nv_api_ctx *ctx, const char *body, size_t len, char **out, nv_api_error *err);
/* A logprobs record's "token" (the piece as an answer shows it after prev, as valid UTF-8: a lone byte
 * of a longer character as U+FFFD; BOS and end tokens show nothing; special: a control token its own
 * text) and "bytes" (the piece's raw bytes), added to o; b is scratch the caller reuses. */
void nv_api_token_fields(cJSON *o, const nv_tokenizer *t, int prev, int tok, int special, nv_buf *b);
/* POST /apply-template (llama.cpp's): {"messages", "tools", "chat_template_kwargs",
 * "continue_final_message"} as a chat request has them -> {"prompt": TEXT}, the prompt the server
 * would feed the model as text (nv_chat_render_text), without running it. */
int nv_api_apply_template(const nv_api_ctx *ctx, const char *body, size_t len, char **out, nv_api_error *err);
/* POST /detokenize: {"tokens": [ids]} -> {"content": TEXT, "prompt": TEXT} (both servers' names;
 * BOS shows nothing; invalid UTF-8 from partial characters becomes U+FFFD). */
int nv_api_detokenize(const nv_api_ctx *ctx, const char *body, size_t len, char **out, nv_api_error *err);
void nv_api_request_free(nv_api_request *r);

typedef struct {
    char id[64];
    long created;
    char model[NV_API_MODEL_ID];
    int chat;
    /* logprobs: when lp_on, responses and chunks carry the records lps[0..n_lps) (set by the
     * caller before each one; NULL/0 gives an empty list) and lp_tok names their tokens;
     * text_offset is the completions shape's byte offset of the first record's text */
    int index; /* the choice a chunk belongs to */
    int lp_on;
    int lp_ids; /* return_tokens_as_token_ids: records name their tokens "token_id:N" */
    int lp_special; /* skip_special_tokens false: records show control tokens' texts, as the answer does */
    const nv_tokenizer *lp_tok;
    const nv_token_lp *lps;
    int n_lps;
    long text_offset;
    /* a request with a prediction: usage adds completion_tokens_details with its drafts taken and
       refused, summed over the choices (set by the caller before the response or usage chunk) */
    int pred, pred_accepted, pred_rejected;
    /* the chunk that finishes choice index: its status, for vLLM's stop_reason (NULL: null) */
    const nv_req_status *status;
} nv_api_meta;

/* Fills id ("cmpl-..." or "chatcmpl-...") and created; logprobs off. */
void nv_api_meta_init(nv_api_meta *m, int chat, const char *model);
/* The text offset after m's records (the next chunk's text_offset). */
long nv_api_text_advance(const nv_api_meta *m);
/* The whole (non-streamed) response. usage carries prompt_tokens_details.cached_tokens: the
 * prompt tokens served from the prefix cache (0 in nv_api_response). */
char *nv_api_response(const nv_api_meta *m, const char *text, const char *finish, int prompt_tokens,
                      int completion_tokens);
char *nv_api_response_cached(const nv_api_meta *m, const char *text, const char *finish, int prompt_tokens,
                             int completion_tokens, int cached_tokens);
/* The whole response with n choices (n > 1 requests); each choice's logprobs come from its own
 * lps (m->lp_on says whether to report them). */
typedef struct {
    const char *text, *finish;
    const nv_token_lp *lps;
    int n_lps;
    const char *reasoning; /* chat: message.reasoning_content, when not NULL */
    const nv_tool_call *calls; /* chat: message.tool_calls (content null when text is empty) */
    int n_calls;
    const nv_req_status *status; /* vLLM's stop_reason from its stop_text and stop_token (NULL: null) */
    /* vLLM's prompt_logprobs: the prompt's records (the first unscored), with top alternatives each; NULL:
       none (completions: the choice's "prompt_logprobs"; chat: the response's, from the first choice) */
    const nv_token_lp *plps;
    int n_plps, plp_top;
} nv_api_choice;
char *nv_api_response_choices(const nv_api_meta *m, const nv_api_choice *choices, int n, int prompt_tokens,
                              int completion_tokens, int cached_tokens);
/* One streamed chunk: text (may be "") and/or finish (NULL while running); role adds the chat
 * role delta; usage_null adds "usage":null (stream_options.include_usage). */
char *nv_api_chunk(const nv_api_meta *m, const char *text, int role, const char *finish, int usage_null);
/* A streamed chat chunk whose delta carries one tool call, whole, as tool_calls[0] with index k. */
char *nv_api_tool_call_chunk(const nv_api_meta *m, const nv_tool_call *call, int k, int usage_null);
/* OpenAI's reasoning effort levels (none, minimal, low, medium, high, xhigh): s's, NULL when s is none of them. */
const char *nv_api_effort_level(const char *s);
/* A streamed chat chunk whose delta is {"reasoning_content": text}. */
char *nv_api_reasoning_chunk(const nv_api_meta *m, const char *text, int usage_null);

/* The final usage chunk (choices: []). */
char *nv_api_usage_chunk(const nv_api_meta *m, int prompt_tokens, int completion_tokens, int cached_tokens);
/* GET /v1/models (the base model, then each adapter with its parent: vLLM's shape), or with single
 * the model of that id alone. */
char *nv_api_models(const nv_api_ctx *ctx, long created, const char *single);
/* The ids of the live adapters (at most NV_MAX_ADAPTERS), in slot order; returns how many. */
int nv_api_model_ids(const nv_api_ctx *ctx, char (*ids)[NV_ADAPTER_NAME_CAP]);
/* The model an id names (0 the base, else an adapter's number, its generation in *gen when given),
 * -1 when none. */
int nv_api_model_find(const nv_api_ctx *ctx, const char *id, unsigned *gen);
/* llama.cpp's LoRA list, [{"id": ID, "scale": S}, ...] (an id: an adapter's slot, from 0, as
 * GET /lora-adapters lists it; |S| at most NV_API_LORA_SCALE_MAX; a later entry of an id wins; 0
 * takes it out), into *out on top of what it holds; at most NV_MIX_ADAPTERS non-zero in the end.
 * 0, or a 400's status (param: the field the list is, NULL for a whole body). */
#define NV_API_LORA_SCALE_MAX 100
int nv_api_lora_parse(const nv_api_ctx *ctx, const cJSON *list, const char *param, nv_adapter_mix *out, nv_api_error *err);
/* llama.cpp's GET /lora-adapters: [{"id", "path", "scale"}] of the live adapters, with nerve's "name"
 * (the model id that names it); "scale" is its factor in requests that choose no adapter. */
char *nv_api_lora_list(const nv_api_ctx *ctx);
/* POST /lora-adapters: the body, a list as nv_api_lora_parse reads it, becomes those factors (an
 * adapter not listed: 0), all or nothing. 0, or a 400's status. */
int nv_api_lora_apply(const nv_api_ctx *ctx, const char *body, size_t len, nv_api_error *err);

/* /v1/embeddings: 'input' a string, a list of token ids, or a list of up to NV_MAX_EMBED_INPUTS of
 * those (strings are encoded with BOS, as prompts; empty ones refused); 'encoding_format' float or
 * base64; 'dimensions' only the model's width; 'model' as everywhere. Each input must fit the
 * context and the KV pool. */
#define NV_MAX_EMBED_INPUTS 256
typedef struct {
    int n;
    int **ids, *n_ids;
    int base64;
    int dims; /* 'dimensions' of a Matryoshka model below its width: the vectors cut to it (0: whole) */
    nv_adapter_mix lora; /* the adapters of 'model' and 'lora' (nv_api_check_model) */
    char model[NV_API_MODEL_ID]; /* the model's id, as responses name it (a copy: an adapter may be removed meanwhile) */
} nv_api_embed;
int nv_api_embed_parse(const nv_api_ctx *ctx, const char *body, size_t len, nv_api_embed *out, nv_api_error *err);
/* The same of a body already parsed (what the other APIs' embeddings translate theirs into). */
int nv_api_embed_parse_json(const nv_api_ctx *ctx, const cJSON *root, nv_api_embed *out, nv_api_error *err);
void nv_api_embed_free(nv_api_embed *e);
/* {"object":"list","data":[{"object":"embedding","index","embedding"}],"model","usage"} for n
 * vectors of ctx->dim floats (base64: each vector's little-endian float32 bytes). */
char *nv_api_embed_response(int dim, const char *model, const float *vecs, int n, int base64, int prompt_tokens);
/* Cuts n vectors of dim floats to their first dims, each made unit length again, in place (packed). */
void nv_api_embed_cut(float *vecs, int n, int dim, int dims);
const char *nv_api_finish_reason(nv_finish f);

#endif
