/* llama.cpp's native server API (POST /completion, /infill and /embedding), served by the same request
 * machinery as the OpenAI API: the editor plugins and scripts written for llama-server (llama.vim,
 * llama.vscode, its examples) talk to nerve unchanged. No HTTP here.
 *
 * Contract:
 * - nv_lcpp_parse() turns a native body into the OpenAI completions request the server runs:
 *   n_predict (-1 or absent: until the end of the context; 0: the prompt only, which warms the
 *   prefix cache as llama.vim does) becomes max_tokens as a ceiling (the answer ends at the
 *   context rather than being refused), repeat_penalty repetition_penalty, logit_bias's list form
 *   [[id, bias | false], ...] the object form, a negative seed a random one; llama-server's
 *   sampling defaults apply when absent (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05).
 *   prompt is a string or a list of token ids. Fields of llama-server's that change nothing here
 *   (cache_prompt: the prefix cache is always on; id_slot; samplers; n_keep; t_max_*_ms;
 *   timings_per_token; ...) are accepted; tfs_z, which nerve does not have, is refused unless at its
 *   neutral value. n_probs N (0..20) asks for each generated token's probability and its N likeliest
 *   alternatives (the model's, before the samplers: /v1/completions' logprobs); post_sampling_probs
 *   gives them as probabilities instead of log-probabilities. Everything else is what
 *   /v1/completions takes (stop, grammar, json_schema, top_k, min_p, DRY, XTC, ignore_eos, ...).
 * - /infill (infill set): input_prefix, input_suffix, input_extra [{filename, text}], prompt:
 *   the model's fill-in-the-middle form, [BOS] [extra] PRE prefix SUF suffix MID prompt, with
 *   llama.cpp's repo-level form for the extra chunks where the vocabulary has <|repo_name|> and
 *   <|file_sep|> (Qwen2.5-Coder): "<|repo_name|>myproject\n", "<|file_sep|>NAME\nTEXT" per chunk,
 *   "<|file_sep|>filename\n"; otherwise their texts go first, as they are. When it does not fit
 *   the context with room for the answer (n_predict, at most a quarter of the context; a quarter
 *   when unlimited), the extra chunks go first, then the prefix's start, then the suffix's end
 *   ("truncated": true). A vocabulary without fill-in-the-middle tokens is a 400.
 * - Responses: {"index", "content", "tokens": [], "id_slot": 0, "stop": true, "model",
 *   "tokens_predicted", "tokens_evaluated", "generation_settings", "prompt", "has_new_line",
 *   "truncated", "stop_type": eos | word | limit, "stopping_word", "tokens_cached", "timings":
 *   {prompt_n, prompt_ms, prompt_per_token_ms, prompt_per_second, predicted_n, predicted_ms,
 *   predicted_per_token_ms, predicted_per_second}} (prompt_ms: from arrival to the first token,
 *   queueing included); with n_probs, "completion_probabilities": [{"id", "token", "bytes",
 *   "logprob", "top_logprobs": [{"id", "token", "bytes", "logprob"}, ...]}] a token ("prob" and
 *   "top_probs" with post_sampling_probs), in a stream each event with its tokens'; streamed, "data: " events {"index", "content", "tokens", "stop": false,
 *   "id_slot", "tokens_predicted", "tokens_evaluated"} and a last one with the whole response and
 *   empty content, no [DONE] (llama-server's shape). Errors keep the OpenAI error body. */
#ifndef NV_SERVE_LLAMACPP_H
#define NV_SERVE_LLAMACPP_H

#include "serve/api.h"
#include "serve/sched.h"

/* What a response needs from its request after the request is gone. */
typedef struct {
    char model[NV_API_MODEL_ID];
    int n_predict;     /* as asked (-1: none) */
    int prompt_only;   /* n_predict 0: no text comes back */
    int truncated;     /* /infill trimmed its input to fit */
    int n_probs;       /* alternatives a token in completion_probabilities (0: none asked) */
    int post_probs;    /* post_sampling_probs: probabilities, not log-probabilities */
    double temperature, top_p, min_p;
    long long top_k, seed;
    char *prompt;      /* a text prompt as given (NULL: ids, or /infill) */
    char *stop[NV_MAX_STOP];
    int n_stop;
} nv_lcpp_meta;

int nv_lcpp_parse(const nv_api_ctx *ctx, const char *body, size_t len, int infill, nv_api_request *out, nv_lcpp_meta *meta,
                  nv_api_error *err);
void nv_lcpp_meta_free(nv_lcpp_meta *m);

typedef struct {
    const char *content;
    nv_finish finish;
    int stop_index; /* the stop string that ended it, or -1 */
    int prompt_tokens, completion_tokens, cached_tokens;
    double prompt_s, gen_s; /* from arrival to the first token, and from it to the last */
    const nv_token_lp *lps; /* the generated tokens' records (n_probs), n_lps of them */
    int n_lps;
    const nv_tokenizer *tok;
} nv_lcpp_answer;

/* The whole response (a stream's last event, with empty content). */
char *nv_lcpp_response(const nv_lcpp_meta *m, const nv_lcpp_answer *a);
/* A stream's event for new text (and, with n_probs, the records of its n_lps tokens). */
char *nv_lcpp_chunk(const nv_lcpp_meta *m, const char *content, int predicted, int evaluated, const nv_token_lp *lps, int n_lps,
                    const nv_tokenizer *tok);
/* GET /props (public, as llama-server's): {"default_generation_settings": {"n_ctx", "params": the
 * defaults above, n_predict -1}, "total_slots": sequences a step, "model_alias", "chat_template":
 * the template's name, "modalities": {"vision": false, "audio": false}, "build_info"}. */
char *nv_lcpp_props(const nv_api_ctx *ctx, int slots);

/* GET /slots (llama-server's): max_batch slots, the n running sequences first ({"id", "n_ctx",
 * "speculative", "is_processing": true, "id_task", "n_past", "n_prompt_tokens",
 * "n_prompt_tokens_processed", "n_prompt_tokens_cache", "params": {n_predict, temperature, top_k,
 * top_p, min_p, seed}, "next_token": [{"has_next_token", "has_new_line", "n_remain", "n_decoded"}]}),
 * then the idle ones ({"id", "n_ctx", "speculative", "is_processing": false, "id_task": -1}). */
char *nv_lcpp_slots(const nv_api_ctx *ctx, const nv_slot *run, int n, int max_batch, int speculative);

/* POST /embedding (llama-server's native embeddings): {"content" (or "input"): a text, token ids, or
 * a list of those, "embd_normalize": N} into the embeddings request the OpenAI parser checks (its
 * limits, 'model', 'lora'). The vectors are the pooled ones scaled as llama.cpp's embd_normalize
 * says: 2 (the default) unit length, 1 taxicab, 0 the largest magnitude at 32760 (int16's range),
 * N > 2 the N-norm; -1 (none) is refused: nerve normalises in the pooling, so the raw length is
 * gone. 0, or the error's status. */
int nv_lcpp_embed_parse(const nv_api_ctx *ctx, const char *body, size_t len, nv_api_embed *out, int *normalize, nv_api_error *err);
/* [{"index": i, "embedding": [[...]]}]: n pooled unit vectors of dim floats, scaled by normalize. */
char *nv_lcpp_embed_response(const float *vecs, int n, int dim, int normalize);

#endif
