#include "serve/api.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "base/log.h"
#include "base/rng.h"
#include "base/timer.h"
#include "base/utf8.h"
#include "serve/gbnf.h"
#include "serve/schema.h"

#define E400 400, "invalid_request_error"

void nv_api_error_set(nv_api_error *e, int status, const char *type, const char *code, const char *param,
                      const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

char *nv_api_error_json(const nv_api_error *e) {
    cJSON *root = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(root, "error");
    nv_buf msg = {0};
    nv_utf8_sanitize(&msg, e->message, strlen(e->message)); /* messages may quote the client's bytes */
    cJSON_AddStringToObject(o, "message", msg.data ? msg.data : "");
    cJSON_AddStringToObject(o, "type", e->type ? e->type : "invalid_request_error");
    if (e->param[0]) cJSON_AddStringToObject(o, "param", e->param);
    else cJSON_AddNullToObject(o, "param");
    if (e->code) cJSON_AddStringToObject(o, "code", e->code);
    else cJSON_AddNullToObject(o, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    nv_buf_free(&msg);
    return s;
}

/* ---- field readers: absent and null read as "not given" ---------------------------------- */

const cJSON *nv_api_field(const cJSON *root, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}


char *nv_api_print_free(cJSON *root) {
    char *s = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return s;
}


static int get_number(const cJSON *root, const char *key, double lo, double hi, double *out, int *given,
                      nv_api_error *err) {
    const cJSON *v = nv_api_field(root, key);
    *given = v != NULL;
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
        nv_api_error_set(err, E400, NULL, key, "'%s' must be a number", key);
        return err->status;
    }
    if (v->valuedouble < lo || v->valuedouble > hi) {
        nv_api_error_set(err, E400, NULL, key, "'%s' must be between %g and %g (got %g)", key, lo, hi, v->valuedouble);
        return err->status;
    }
    *out = v->valuedouble;
    return 0;
}

static int get_int(const cJSON *root, const char *key, double lo, double hi, long long *out, int *given,
                   nv_api_error *err) {
    const cJSON *v = nv_api_field(root, key);
    *given = v != NULL;
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble != floor(v->valuedouble)) {
        nv_api_error_set(err, E400, NULL, key, "'%s' must be an integer", key);
        return err->status;
    }
    if (v->valuedouble < lo || v->valuedouble > hi) {
        nv_api_error_set(err, E400, NULL, key, "'%s' must be between %.0f and %.0f (got %.0f)", key, lo, hi,
                         v->valuedouble);
        return err->status;
    }
    *out = (long long)v->valuedouble;
    return 0;
}

int nv_api_get_bool(const cJSON *root, const char *key, int *out, nv_api_error *err) {
    const cJSON *v = nv_api_field(root, key);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) {
        nv_api_error_set(err, E400, NULL, key, "'%s' must be a boolean", key);
        return err->status;
    }
    *out = cJSON_IsTrue(v);
    return 0;
}

#define MAX_LOGIT_BIAS 1024

#define MAX_DRY_BREAKERS 32

/* llama.cpp's samplers' fields (its server takes them on every endpoint): typical_p, top_n_sigma,
 * XTC's, dynamic temperature's, Mirostat's, and DRY's: dry_multiplier (0: off), dry_base, dry_allowed_length,
 * dry_penalty_last_n (-1: the whole context, 0: off) and dry_sequence_breakers (strings; a token whose
 * text holds one ends a repeat; default llama.cpp's). */
static int llamacpp_samplers(const nv_api_ctx *ctx, const cJSON *root, nv_api_request *out, nv_api_error *err) {
    double mult = 0, base = 1.75, allowed = 2, last_n = -1;
    int given, rc;
    /* llama.cpp's other samplers: typical_p (1: off), top_n_sigma (<= 0: off), XTC (probability 0: off) */
    double typical = 1, sigma = -1, xtc_p = 0, xtc_t = 0.1;
    if ((rc = get_number(root, "typical_p", 0.0001, 1, &typical, &given, err))) return rc;
    if ((rc = get_number(root, "top_n_sigma", -1, 1000, &sigma, &given, err))) return rc;
    if ((rc = get_number(root, "xtc_probability", 0, 1, &xtc_p, &given, err))) return rc;
    if ((rc = get_number(root, "xtc_threshold", 0, 1, &xtc_t, &given, err))) return rc;
    out->req.typical_p = (float)typical;
    out->req.top_n_sigma = (float)sigma;
    out->req.xtc_probability = (float)xtc_p;
    out->req.xtc_threshold = (float)xtc_t;
    /* dynamic temperature: range 0 (off), exponent 1 */
    double dt_range = 0, dt_exp = 1;
    if ((rc = get_number(root, "dynatemp_range", 0, 100, &dt_range, &given, err))) return rc;
    if ((rc = get_number(root, "dynatemp_exponent", 0, 100, &dt_exp, &given, err))) return rc;
    out->req.dynatemp_range = (float)dt_range;
    out->req.dynatemp_exponent = (float)dt_exp;
    /* Mirostat: 0 (off), 1 or 2, its target surprise tau (5) and learning rate eta (0.1) */
    long long miro = 0;
    double tau = 5, eta = 0.1;
    if ((rc = get_int(root, "mirostat", 0, 2, &miro, &given, err))) return rc;
    if ((rc = get_number(root, "mirostat_tau", 0, 100, &tau, &given, err))) return rc;
    if ((rc = get_number(root, "mirostat_eta", 0, 1, &eta, &given, err))) return rc;
    out->req.mirostat = (int)miro;
    out->req.mirostat_tau = (float)tau;
    out->req.mirostat_eta = (float)eta;
    if ((rc = get_number(root, "dry_multiplier", 0, 1000, &mult, &given, err))) return rc;
    if ((rc = get_number(root, "dry_base", 1, 100, &base, &given, err))) return rc;
    if ((rc = get_number(root, "dry_allowed_length", 1, 64, &allowed, &given, err))) return rc;
    if ((rc = get_number(root, "dry_penalty_last_n", -1, 1e9, &last_n, &given, err))) return rc;
    if (allowed != floor(allowed) || last_n != floor(last_n)) {
        nv_api_error_set(err, E400, NULL, allowed != floor(allowed) ? "dry_allowed_length" : "dry_penalty_last_n",
                         "'%s' must be an integer", allowed != floor(allowed) ? "dry_allowed_length" : "dry_penalty_last_n");
        return err->status;
    }
    const cJSON *br = nv_api_field(root, "dry_sequence_breakers");
    const char *strs[MAX_DRY_BREAKERS];
    int n = -1; /* llama.cpp's default breakers */
    if (br) {
        if (!cJSON_IsArray(br) || cJSON_GetArraySize(br) > MAX_DRY_BREAKERS) {
            nv_api_error_set(err, E400, NULL, "dry_sequence_breakers", "'dry_sequence_breakers' must be a list of at most %d "
                             "strings", MAX_DRY_BREAKERS);
            return err->status;
        }
        n = 0;
        for (const cJSON *e = br->child; e; e = e->next) {
            if (!cJSON_IsString(e) || strlen(e->valuestring) > 64) {
                nv_api_error_set(err, E400, NULL, "dry_sequence_breakers", "'dry_sequence_breakers' must hold strings of at "
                                 "most 64 bytes");
                return err->status;
            }
            strs[n++] = e->valuestring;
        }
    }
    out->req.dry_multiplier = (float)mult;
    out->req.dry_base = (float)base;
    out->req.dry_allowed_length = (int)allowed;
    out->req.dry_last_n = (int)last_n;
    if (mult == 0 || last_n == 0 || !ctx->tok) return 0;
    if (!(out->dry_breaker = nv_dry_breakers(ctx->tok, ctx->vocab_size, strs, n))) return nv_api_oom(err);
    out->req.dry_breaker = out->dry_breaker;
    return 0;
}

/* presence_penalty, frequency_penalty (-2..2), repetition_penalty (0.001..10, 1 off), logit_bias
 * ({"token id": -100..100, ...}) and llama.cpp's samplers' fields. */
static int logit_adjustments(const nv_api_ctx *ctx, const cJSON *root, nv_api_request *out, nv_api_error *err) {
    double presence = 0, frequency = 0;
    int given, rc;
    if ((rc = llamacpp_samplers(ctx, root, out, err))) return rc;
    if ((rc = get_number(root, "presence_penalty", -2, 2, &presence, &given, err))) return rc;
    if ((rc = get_number(root, "frequency_penalty", -2, 2, &frequency, &given, err))) return rc;
    out->req.presence_penalty = (float)presence;
    out->req.frequency_penalty = (float)frequency;
    /* vLLM's repetition_penalty (0.001..10, as generate's flag; 1 is off) */
    double repetition = 1;
    if ((rc = get_number(root, "repetition_penalty", 0.001, 10, &repetition, &given, err))) return rc;
    out->req.repetition_penalty = (float)repetition;
    /* llama.cpp's repeat_last_n: the three penalties over the last N tokens of the prompt and the
       answer (-1: all of them; 0: none); absent, OpenAI's and vLLM's over the whole texts */
    long long last_n = 0;
    if ((rc = get_int(root, "repeat_last_n", -1, 1e9, &last_n, &given, err))) return rc;
    out->req.penalty_window = given;
    out->req.penalty_last_n = (int)last_n;
    const cJSON *lb = nv_api_field(root, "logit_bias");
    if (!lb) return 0;
    if (!cJSON_IsObject(lb)) {
        nv_api_error_set(err, E400, NULL, "logit_bias", "'logit_bias' must be an object mapping token ids to biases");
        return err->status;
    }
    int n = cJSON_GetArraySize(lb);
    if (n > MAX_LOGIT_BIAS) {
        nv_api_error_set(err, E400, NULL, "logit_bias", "'logit_bias' holds %d tokens; at most %d", n, MAX_LOGIT_BIAS);
        return err->status;
    }
    if (n == 0) return 0;
    out->bias_tok = malloc((size_t)n * sizeof *out->bias_tok);
    out->bias = malloc((size_t)n * sizeof *out->bias);
    if (!out->bias_tok || !out->bias) {
        return nv_api_oom(err);
    }
    int i = 0;
    for (const cJSON *e = lb->child; e; e = e->next, i++) {
        char *end = NULL;
        errno = 0;
        long id = e->string && e->string[0] ? strtol(e->string, &end, 10) : -1;
        if (!end || *end || errno || id < 0 || id >= ctx->vocab_size) {
            nv_api_error_set(err, E400, NULL, "logit_bias", "'logit_bias': '%.40s' is not a token id of this model (0..%d)",
                             e->string ? e->string : "", ctx->vocab_size - 1);
            return err->status;
        }
        if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble) || e->valuedouble < -100 || e->valuedouble > 100) {
            nv_api_error_set(err, E400, NULL, "logit_bias", "'logit_bias': the bias of token %ld must be a number between -100 and 100", id);
            return err->status;
        }
        out->bias_tok[i] = (int)id;
        out->bias[i] = (float)e->valuedouble;
    }
    out->req.bias_tok = out->bias_tok;
    out->req.bias = out->bias;
    out->req.n_bias = n;
    return 0;
}

/* vLLM's allowed_token_ids (a list of the vocabulary's ids: only those are sampled) and bad_words
 * (strings whose tokens the answer may not complete: each as written after its leading white space,
 * and after one space, as vLLM tokenizes them, so a word is banned at the text's start and inside it). */
#define MAX_BAD_WORDS 128
static int read_ids(const cJSON *arr, const char *param, int vocab, int *ids, nv_api_error *err);
static int token_filters(const nv_api_ctx *ctx, const cJSON *root, nv_api_request *out, nv_api_error *err) {
    const cJSON *allowed = nv_api_field(root, "allowed_token_ids"), *bad = nv_api_field(root, "bad_words");
    if (allowed) {
        const int n = cJSON_IsArray(allowed) ? cJSON_GetArraySize(allowed) : 0;
        if (n < 1 || n > ctx->vocab_size) {
            nv_api_error_set(err, E400, NULL, "allowed_token_ids", "'allowed_token_ids' must be a list of 1 to %d token ids", ctx->vocab_size);
            return err->status;
        }
        if (!(out->allowed = malloc((size_t)n * sizeof *out->allowed))) return nv_api_oom(err);
        int i = 0;
        for (const cJSON *e = allowed->child; e; e = e->next, i++) {
            if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 || e->valuedouble >= ctx->vocab_size) {
                nv_api_error_set(err, E400, NULL, "allowed_token_ids", "'allowed_token_ids[%d]' is not a token id of this model (0..%d)", i,
                                 ctx->vocab_size - 1);
                return err->status;
            }
            out->allowed[i] = (int)e->valuedouble;
        }
        out->req.allowed = out->allowed;
        out->req.n_allowed = n;
    }
    if (!bad) return 0;
    const int n = cJSON_IsArray(bad) ? cJSON_GetArraySize(bad) : -1;
    if (n < 0 || n > MAX_BAD_WORDS) {
        nv_api_error_set(err, E400, NULL, "bad_words", "'bad_words' must be a list of at most %d strings", MAX_BAD_WORDS);
        return err->status;
    }
    nv_ids toks = {0}, lens = {0};
    int i = 0, rc = 0;
    for (const cJSON *e = bad->child; e && !rc; e = e->next, i++) {
        const char *w = cJSON_GetStringValue(e);
        while (w && (*w == ' ' || *w == '\t' || *w == '\n' || *w == '\r')) w++;
        if (!w || !*w || strlen(w) > 256) {
            nv_api_error_set(err, E400, NULL, "bad_words", "'bad_words[%d]' must be a string of 1 to 256 bytes besides leading white space", i);
            rc = err->status;
            break;
        }
        int first_len = 0, first_tok = -1;
        for (int spaced = 0; spaced < 2 && !rc; spaced++) {
            char text[260];
            snprintf(text, sizeof text, "%s%s", spaced ? " " : "", w);
            int *ids = NULL, k = 0;
            if (nv_tokenizer_encode(ctx->tok, text, 0, 0, &ids, &k) != NV_OK) {
                rc = nv_api_oom(err);
                break;
            }
            /* the spaced form only where the space makes a word of its own (vLLM's rule) */
            if (k > 0 && (!spaced || (ids[0] != first_tok && k == first_len))) {
                if (nv_ids_push(&toks, ids, k) != NV_OK || nv_ids_push(&lens, &k, 1) != NV_OK) rc = nv_api_oom(err);
                if (!spaced) first_len = k, first_tok = ids[0];
            }
            free(ids);
        }
    }
    if (!rc && lens.n) {
        out->bad_tok = toks.v, out->bad_len = lens.v;
        out->req.bad_tok = toks.v, out->req.bad_len = lens.v, out->req.n_bad = lens.n;
        int left = !out->req.n_allowed; /* an allowed token that no word of one token bans */
        for (int a = 0; !left && a < out->req.n_allowed; a++) {
            left = 1;
            for (int k = 0, at = 0; left && k < lens.n; at += lens.v[k], k++) left = !(lens.v[k] == 1 && toks.v[at] == out->allowed[a]);
        }
        if (!left) {
            nv_api_error_set(err, E400, NULL, "bad_words", "'bad_words' ban every token 'allowed_token_ids' allows");
            return err->status;
        }
        return 0;
    }
    free(toks.v);
    free(lens.v);
    return rc;
}

/* vLLM's stop_token_ids (ending the answer as end tokens do), include_stop_str_in_output,
 * skip_special_tokens and priority (with --scheduling-policy priority; a non-zero one otherwise is a
 * 400, as vLLM answers: a client may not jump the queue unless the server says so). */
static int vllm_ending_and_priority(const nv_api_ctx *ctx, const cJSON *root, nv_api_request *out, nv_api_error *err) {
    const cJSON *stops = nv_api_field(root, "stop_token_ids");
    if (stops) {
        const int n = cJSON_IsArray(stops) ? cJSON_GetArraySize(stops) : -1;
        if (n < 0 || n > 64) {
            nv_api_error_set(err, E400, NULL, "stop_token_ids", "'stop_token_ids' must be a list of at most 64 token ids");
            return err->status;
        }
        if (n && !(out->stop_ids = malloc((size_t)n * sizeof *out->stop_ids))) return nv_api_oom(err);
        if (n && read_ids(stops, "stop_token_ids", ctx->vocab_size, out->stop_ids, err)) return err->status;
        out->req.stop_ids = out->stop_ids;
        out->req.n_stop_ids = n;
    }
    int skip = 1, rc, given;
    if ((rc = nv_api_get_bool(root, "include_stop_str_in_output", &out->req.include_stop, err)) ||
        (rc = nv_api_get_bool(root, "skip_special_tokens", &skip, err)))
        return rc;
    out->req.keep_special = !skip;
    long long priority = 0;
    if ((rc = get_int(root, "priority", -1e9, 1e9, &priority, &given, err))) return rc;
    if (priority && !ctx->priority_sched) {
        nv_api_error_set(err, E400, NULL, "priority", "'priority' needs the server's priority scheduling (--scheduling-policy priority)");
        return err->status;
    }
    out->req.priority = (int)priority;
    return 0;
}

/* chat: logprobs (bool) and top_logprobs (0..20, with logprobs); completions: logprobs (0..20, the
 * alternatives per token, as vLLM takes it (OpenAI's stops at 5); null or absent: none). */
static int parse_logprobs(const cJSON *root, int chat, nv_api_request *out, nv_api_error *err) {
    long long k = 0;
    int given = 0, rc;
    if (chat) {
        if ((rc = nv_api_get_bool(root, "logprobs", &out->req.logprobs, err))) return rc;
        if ((rc = get_int(root, "top_logprobs", 0, NV_MAX_TOP_LOGPROBS, &k, &given, err))) return rc;
        if (given && !out->req.logprobs) {
            nv_api_error_set(err, E400, NULL, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
            return err->status;
        }
    } else {
        if ((rc = get_int(root, "logprobs", 0, NV_MAX_TOP_LOGPROBS, &k, &given, err))) return rc;
        out->req.logprobs = given;
    }
    out->req.top_logprobs = (int)k;
    return 0;
}

/* vLLM's prompt_logprobs: each prompt token's log-probability and its k likeliest alternatives
 * (0..20), whole responses only (as vLLM's). With echo's prompt records they must agree. */
static int parse_prompt_logprobs(const cJSON *root, nv_api_request *out, nv_api_error *err) {
    long long k = 0;
    int given, rc;
    if ((rc = get_int(root, "prompt_logprobs", 0, NV_MAX_TOP_LOGPROBS, &k, &given, err)) || !given) return rc;
    if (out->stream) {
        nv_api_error_set(err, E400, NULL, "prompt_logprobs", "'prompt_logprobs' is not available when streaming");
        return err->status;
    }
    if (out->req.prompt_logprobs && k != out->req.top_logprobs) { /* (one set of records serves both) */
        nv_api_error_set(err, E400, NULL, "prompt_logprobs", "'prompt_logprobs' must equal 'logprobs' with 'echo'");
        return err->status;
    }
    out->prompt_lp = 1;
    out->req.prompt_logprobs = 1;
    out->req.prompt_top = (int)k;
    return 0;
}

/* A field this server does not implement: fine when absent, null or at its neutral value. */
static int unsupported(const cJSON *root, const char *key, nv_api_error *err) {
    const cJSON *v = nv_api_field(root, key);
    if (!v) return 0;
    int neutral = 0;
    if (!strcmp(key, "best_of")) {
        neutral = cJSON_IsNumber(v) && v->valuedouble == 1;
    } else if (!strcmp(key, "suffix")) {
        neutral = cJSON_IsString(v) && !v->valuestring[0];
    } else if (!strcmp(key, "tools") || !strcmp(key, "functions")) {
        neutral = cJSON_IsArray(v) && !v->child;
    } else if (!strcmp(key, "modalities")) { /* text alone is what every answer is */
        neutral = cJSON_IsArray(v);
        for (const cJSON *m = neutral ? v->child : NULL; m; m = m->next) neutral &= cJSON_IsString(m) && !strcmp(m->valuestring, "text");
    }
    if (!neutral) {
        nv_api_error_set(err, E400, "unsupported_parameter", key, "'%s' is not supported by this server", key);
        return err->status;
    }
    return 0;
}

/* ---- prompts --------------------------------------------------------------------------------- */

/* (A token's piece as an answer or an echoed prompt shows it: nv_tokenizer_answer_piece, after BOS
 * without its leading space.) */

/* A piece as a JSON string: valid UTF-8 (a lone byte of a longer character becomes U+FFFD), in b,
 * which the caller reuses. */
static const char *json_piece(const char *piece, nv_buf *b) {
    b->len = 0;
    nv_utf8_sanitize(b, piece, strlen(piece));
    return b->data ? b->data : "";
}

static const char *token_text(const nv_tokenizer *t, int prev, int tok, int special, nv_buf *b) {
    return json_piece(nv_tokenizer_answer_piece(t, prev, tok, special), b);
}

void nv_api_token_fields(cJSON *o, const nv_tokenizer *t, int prev, int tok, int special, nv_buf *b) {
    cJSON_AddStringToObject(o, "token", token_text(t, prev, tok, special, b));
    const char *piece = nv_tokenizer_answer_piece(t, prev, tok, special);
    cJSON *bytes = cJSON_AddArrayToObject(o, "bytes");
    for (size_t i = 0; piece[i]; i++) cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)piece[i]));
}

/* The text ids[0..n) spell, as valid UTF-8 (the first follows BOS); malloc'd, NULL when out of memory. */
static char *ids_text(const nv_tokenizer *t, const int *ids, int n) {
    nv_buf b = {0}, s = {0};
    for (int j = 0; j < n; j++) nv_buf_puts(&b, nv_tokenizer_answer_piece(t, j ? ids[j - 1] : nv_tokenizer_bos(t), ids[j], 0));
    nv_utf8_sanitize(&s, b.data ? b.data : "", b.len);
    const int oom = b.oom || s.oom;
    nv_buf_free(&b);
    if (oom) nv_buf_free(&s);
    return oom ? NULL : nv_buf_take(&s);
}

/* The token ids of a JSON list into ids[0..) (room for all): each an integer in [0, vocab). */
static int read_ids(const cJSON *arr, const char *param, int vocab, int *ids, nv_api_error *err) {
    int i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 || e->valuedouble >= vocab) {
            nv_api_error_set(err, E400, NULL, param, "token id at '%s[%d]' must be an integer in [0, %d)", param, i, vocab);
            return err->status;
        }
        ids[i] = (int)e->valuedouble;
    }
    return 0;
}

static int prompt_from_ids(const nv_api_ctx *ctx, const cJSON *arr, nv_api_request *out, nv_api_error *err) {
    int n = cJSON_GetArraySize(arr);
    if (n < 1) {
        nv_api_error_set(err, E400, NULL, "prompt", "'prompt' must not be an empty list of token ids");
        return err->status;
    }
    if (n > ctx->seq_len) {
        nv_api_error_set(err, E400, "context_length_exceeded", "prompt",
                         "This model's maximum context length is %d tokens, but the prompt has %d", ctx->seq_len, n);
        return err->status;
    }
    out->prompt_ids = malloc((size_t)n * sizeof(int));
    if (!out->prompt_ids) {
        return nv_api_oom(err);
    }
    if (read_ids(arr, "prompt", ctx->vocab_size, out->prompt_ids, err)) return err->status;
    out->req.n_prompt = n;
    if (out->echo) out->echo_text = ids_text(ctx->tok, out->prompt_ids, n);
    return 0;
}

static int prompt_from_text(const nv_api_ctx *ctx, const char *text, const char *param, nv_api_request *out,
                            nv_api_error *err) {
    if (nv_tokenizer_encode(ctx->tok, text, 1, 0, &out->prompt_ids, &out->req.n_prompt) != NV_OK) {
        nv_api_error_set(err, 500, "server_error", NULL, param, "cannot tokenize the prompt: %s", nv_errmsg());
        return err->status;
    }
    if (out->req.n_prompt == 0) {
        nv_api_error_set(err, E400, NULL, param, "'%s' gives no tokens (this vocabulary has no BOS to start from)", param);
        return err->status;
    }
    if (out->echo) {
        nv_buf s = {0};
        nv_utf8_sanitize(&s, text, strlen(text));
        out->echo_text = nv_buf_take(&s);
    }
    return 0;
}

int nv_api_fim_tokens(const nv_tokenizer *tok, int ids[3]) {
    static const char *const sets[][3] = {
        {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"},
        {"<fim_prefix>", "<fim_suffix>", "<fim_middle>"},
        {"<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", "<\xef\xbd\x9c" "fim\xe2\x96\x81hole\xef\xbd\x9c>",
         "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>"}, /* <｜fim▁begin｜> ... */
    };
    for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++) {
        int k = 0;
        while (k < 3 && (ids[k] = nv_tokenizer_lookup(tok, sets[s][k])) >= 0) k++;
        if (k == 3) return 1;
    }
    return 0;
}

/* OpenAI's suffix (as Ollama serves it): the answer fills the gap between prompt and suffix, asked
 * in the model's fill-in-the-middle form, prefix-suffix-middle: [BOS] PRE prompt SUF suffix MID. */
static int prompt_fill_in(const nv_api_ctx *ctx, const char *prefix, const char *suffix, nv_api_request *out, nv_api_error *err) {
    int fim[3], *a = NULL, *b = NULL, na = 0, nb = 0;
    if (!nv_api_fim_tokens(ctx->tok, fim)) {
        nv_api_error_set(err, E400, NULL, "suffix",
                         "'suffix' needs a code model with fill-in-the-middle tokens (<|fim_prefix|>, <fim_prefix> or "
                         "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>); this vocabulary has none");
        return err->status;
    }
    if (nv_tokenizer_encode(ctx->tok, prefix, 0, 0, &a, &na) != NV_OK || nv_tokenizer_encode(ctx->tok, suffix, 0, 0, &b, &nb) != NV_OK) {
        free(a);
        nv_api_error_set(err, 500, "server_error", NULL, "prompt", "cannot tokenize the prompt: %s", nv_errmsg());
        return err->status;
    }
    const int bos = nv_tokenizer_adds_bos(ctx->tok) && nv_tokenizer_bos(ctx->tok) >= 0, n = bos + 3 + na + nb;
    if (!(out->prompt_ids = malloc((size_t)n * sizeof(int)))) {
        free(a), free(b);
        return nv_api_oom(err);
    }
    int k = 0;
    if (bos) out->prompt_ids[k++] = nv_tokenizer_bos(ctx->tok);
    out->prompt_ids[k++] = fim[0];
    for (int i = 0; i < na; i++) out->prompt_ids[k++] = a[i];
    out->prompt_ids[k++] = fim[1];
    for (int i = 0; i < nb; i++) out->prompt_ids[k++] = b[i];
    out->prompt_ids[k++] = fim[2];
    out->req.n_prompt = k;
    free(a), free(b);
    if (out->echo) {
        nv_buf s = {0};
        nv_utf8_sanitize(&s, prefix, strlen(prefix));
        out->echo_text = nv_buf_take(&s);
    }
    return 0;
}

static int parse_prompt(const nv_api_ctx *ctx, const cJSON *root, nv_api_request *out, nv_api_error *err) {
    const cJSON *p = nv_api_field(root, "prompt"), *suffix = nv_api_field(root, "suffix");
    if (!p) {
        nv_api_error_set(err, E400, "missing_required_parameter", "prompt", "'prompt' is required");
        return err->status;
    }
    if (suffix && !cJSON_IsString(suffix)) {
        nv_api_error_set(err, E400, NULL, "suffix", "'suffix' must be a string");
        return err->status;
    }
    if (suffix && *suffix->valuestring) {
        if (!cJSON_IsString(p)) {
            nv_api_error_set(err, E400, NULL, "prompt", "with 'suffix', 'prompt' must be one string (the text before the gap)");
            return err->status;
        }
        return prompt_fill_in(ctx, p->valuestring, suffix->valuestring, out, err);
    }
    if (cJSON_IsString(p)) return prompt_from_text(ctx, p->valuestring, "prompt", out, err);
    if (cJSON_IsArray(p)) {
        const cJSON *first = p->child;
        if (first && cJSON_IsNumber(first)) return prompt_from_ids(ctx, p, out, err);
        int n = cJSON_GetArraySize(p);
        if (n > NV_MAX_CHOICES) {
            nv_api_error_set(err, E400, NULL, "prompt", "'prompt' lists %d prompts; at most %d", n, NV_MAX_CHOICES);
            return err->status;
        }
        /* several prompts: the first fills the request, the others its list of more */
        int i = 0;
        for (const cJSON *e = first; e; e = e->next, i++) {
            nv_api_request one;
            memset(&one, 0, sizeof one);
            one.echo = out->echo;
            nv_api_request *dst = i == 0 ? out : &one;
            int rc;
            if (cJSON_IsString(e)) rc = prompt_from_text(ctx, e->valuestring, "prompt", dst, err);
            else if (cJSON_IsArray(e) && e->child && cJSON_IsNumber(e->child)) rc = prompt_from_ids(ctx, e, dst, err);
            else {
                nv_api_error_set(err, E400, NULL, "prompt",
                                 "'prompt[%d]' must be a string or a list of token ids (all prompts of one kind)", i);
                rc = err->status;
            }
            if (i > 0) {
                out->more[i - 1].ids = one.prompt_ids;
                out->more[i - 1].n = one.req.n_prompt;
                out->more[i - 1].echo_text = one.echo_text;
                out->n_more = i;
            }
            if (rc) return rc;
        }
        if (i > 0) return 0;
    }
    nv_api_error_set(err, E400, NULL, "prompt", "'prompt' must be a string, a list of token ids, or a list of those");
    return err->status;
}

void nv_api_tools_free(nv_api_tools *t) {
    if (!t) return;
    for (int i = 0; i < t->n; i++) free(t->names[i]);
    free(t->names);
    cJSON_Delete(t->tools);
    free(t);
}

static int valid_tool_name(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n > 64) return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' || *s == '-'))
            return 0;
    return 1;
}

/* A tool's function name (parse_tools has checked that it is one). */
static const char *tool_name(const cJSON *tool) {
    return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tool, "function"), "name")->valuestring;
}

/* The grammar of tool calls: Hermes: <tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>,
 * with parallel more after newlines (XML: <tool_call>\n<function=NAME>\n...</function>\n</tool_call>); Llama 3: {"name": NAME, "parameters": ARGS}; Granite:
 * <|tool_call|>[{"name": NAME, "arguments": ARGS}], Mistral: [TOOL_CALLS] [{...}], with parallel
 * more in the list. ARGS follows the tool's parameters schema. */
static nv_err calls_grammar(const cJSON *tools, const char *only, nv_tool_style style, int parallel, int skip_bad,
                            int think, const nv_api_request *format, nv_grammar **out) {
    const int list = style == NV_TOOLS_GRANITE || style == NV_TOOLS_PHI4_MINI || style == NV_TOOLS_MISTRAL;
    const nv_call_frame frame = style == NV_TOOLS_LLAMA3 ? (nv_call_frame){.args_key = "parameters", .prefix = "", .suffix = ""}
                                : list ? (nv_call_frame){.args_key = "arguments",
                                                         .prefix = style == NV_TOOLS_MISTRAL ? NV_MISTRAL_CALLS : NV_GRANITE_CALLS,
                                                         .suffix = "]",
                                                         .item_sep = parallel ? ", " : NULL} /* one list */
                                : nv_tool_style_mistral_args(style) /* [TOOL_CALLS]NAME[[CALL_ID]ID][ARGS]{...}, more right after */
                                    ? (nv_call_frame){.prefix = NV_MISTRAL_TOOL_CALLS, .suffix = "", .sep = parallel ? "" : NULL,
                                                      .name_args = NV_MISTRAL_ARGS,
                                                      .call_id = style == NV_TOOLS_MISTRAL_CALL_ID ? NV_MISTRAL_CALL_ID : NULL}
                                       : (nv_call_frame){.args_key = "arguments",
                                                         .prefix = "<tool_call>\n",
                                                         .suffix = "\n</tool_call>",
                                                         .sep = parallel ? "\n" : NULL,
                                                         .xml = style == NV_TOOLS_XML};
    return nv_tool_calls_grammar(tools, only, &frame, skip_bad, think, format ? format->format_schema : NULL,
                                 format && format->format_object, out);
}

/* tools, tool_choice, parallel_tool_calls (chat): the tools go into the prompt through the
 * template, the answer is read for calls, and "required" or a named function constrains it. */
/* 'tools' (a non-empty list): each {"type": "function", "function": {"name", "description",
   "parameters"}}, names unique. */
static int check_tools(const cJSON *tools, nv_api_error *err) {
    if (!cJSON_IsArray(tools) || cJSON_GetArraySize(tools) > NV_MAX_TOOLS) {
        nv_api_error_set(err, E400, NULL, "tools", "'tools' must be a list of at most %d tools", NV_MAX_TOOLS);
        return err->status;
    }
    int i = 0;
    for (const cJSON *t = tools->child; t; t = t->next, i++) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type"), *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name"), *desc = cJSON_GetObjectItemCaseSensitive(fn, "description");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        if (!cJSON_IsObject(t) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsObject(fn)) {
            nv_api_error_set(err, E400, NULL, "tools", "'tools[%d]' must be {\"type\": \"function\", \"function\": {...}}", i);
            return err->status;
        }
        if (!cJSON_IsString(name) || !valid_tool_name(name->valuestring)) {
            nv_api_error_set(err, E400, NULL, "tools",
                             "'tools[%d].function.name' must be 1 to 64 letters, digits, underscores or dashes", i);
            return err->status;
        }
        if ((desc && !cJSON_IsString(desc) && !cJSON_IsNull(desc)) || (params && !cJSON_IsObject(params) && !cJSON_IsNull(params))) {
            nv_api_error_set(err, E400, NULL, "tools",
                             "'tools[%d].function': 'description' must be a string and 'parameters' a JSON schema object", i);
            return err->status;
        }
        for (const cJSON *u = tools->child; u != t; u = u->next)
            if (!strcmp(tool_name(u), name->valuestring)) {
                nv_api_error_set(err, E400, NULL, "tools", "two tools are named '%s'", name->valuestring);
                return err->status;
            }
    }
    return 0;
}

/* A tool as the chat template prints it (Python's json.dumps style: one line for Hermes and Mistral,
   indented by 4 for Llama 3 and Granite; Phi-4-mini's: its function alone, on one line), malloc'd. */
static char *tool_text(const cJSON *tool, nv_tool_style style) {
    nv_buf b = {0};
    if (style == NV_TOOLS_PHI4_MINI) tool = cJSON_GetObjectItemCaseSensitive(tool, "function"); /* its functions alone */
    nv_py_json(&b, tool, style == NV_TOOLS_HERMES || style == NV_TOOLS_MISTRAL || style == NV_TOOLS_PHI4_MINI ? 0 : 4);
    return nv_buf_take(&b);
}

int nv_api_tool_texts(const cJSON *tools, nv_tool_style style, char ***texts, int *n, nv_api_error *err) {
    *texts = NULL;
    *n = 0;
    if (!tools || cJSON_IsNull(tools) || (cJSON_IsArray(tools) && !tools->child)) return 0;
    int rc = check_tools(tools, err);
    if (rc) return rc;
    const int count = cJSON_GetArraySize(tools);
    char **t = calloc((size_t)count + 1, sizeof *t);
    int k = 0;
    for (const cJSON *tool = tools->child; t && tool; tool = tool->next, k++)
        if (!(t[k] = tool_text(tool, style))) break;
    if (!t || k < count) {
        nv_api_tool_texts_free(t, k);
        return nv_api_oom(err);
    }
    *texts = t;
    *n = count;
    return 0;
}

void nv_api_tool_texts_free(char **texts, int n) {
    for (int i = 0; texts && i < n; i++) free(texts[i]);
    free(texts);
}

static int parse_tools(const nv_api_ctx *ctx, const cJSON *root, nv_api_request *out, nv_api_error *err) {
    const cJSON *tools = nv_api_field(root, "tools"), *choice = nv_api_field(root, "tool_choice");
    int parallel = 1, rc;
    if ((rc = nv_api_get_bool(root, "parallel_tool_calls", &parallel, err))) return rc;
    if (!tools || (cJSON_IsArray(tools) && !tools->child)) {
        if (choice && !(cJSON_IsString(choice) && !strcmp(choice->valuestring, "none"))) {
            nv_api_error_set(err, E400, NULL, "tool_choice", "'tool_choice' is only allowed when 'tools' are given");
            return err->status;
        }
        return 0;
    }
    if ((rc = check_tools(tools, err))) return rc;
    static const char bad_choice[] =
        "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}";
    const char *only = NULL;
    int required = 0;
    if (choice && cJSON_IsString(choice) && !strcmp(choice->valuestring, "none")) return 0; /* not even shown */
    if (out->grammar && out->format_text) {
        nv_api_error_set(err, E400, NULL, "tools",
                         "a regular expression, choices or a grammar together with 'tools' is not supported: they would leave "
                         "no room for a call (a JSON 'response_format' is; or set 'tool_choice' to 'none')");
        return err->status;
    }
    if (choice && cJSON_IsString(choice)) {
        required = !strcmp(choice->valuestring, "required");
        if (!required && strcmp(choice->valuestring, "auto")) {
            nv_api_error_set(err, E400, NULL, "tool_choice", "%s", bad_choice);
            return err->status;
        }
    } else if (choice) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(choice, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsObject(choice) || !cJSON_IsString(name)) {
            nv_api_error_set(err, E400, NULL, "tool_choice", "%s", bad_choice);
            return err->status;
        }
        for (const cJSON *t = tools->child; t && !only; t = t->next)
            if (!strcmp(tool_name(t), name->valuestring)) only = tool_name(t);
        if (!only) {
            nv_api_error_set(err, E400, NULL, "tool_choice", "'tool_choice' names '%.64s', which is not among 'tools'",
                             name->valuestring);
            return err->status;
        }
    }
    const nv_tool_style style = ctx->jinja_tools ? ctx->jinja_tools : nv_chat_tool_style(ctx->tmpl);
    int n = cJSON_GetArraySize(tools);
    nv_api_tools *at = calloc(1, sizeof *at);
    if (!at || !(at->names = calloc((size_t)n, sizeof *at->names)) || !(out->tool_json = calloc((size_t)n + 1, sizeof(char *)))) {
        nv_api_tools_free(at);
        return nv_api_oom(err);
    }
    out->tools = at;
    at->style = style;
    if (style == NV_TOOLS_XML && !(at->tools = cJSON_Duplicate(tools, 1))) return nv_api_oom(err); /* values read by their schemas */
    int i = 0;
    for (const cJSON *t = tools->child; t; t = t->next, i++) {
        out->tool_json[i] = tool_text(t, nv_chat_tool_text_style(ctx->tmpl, ctx->jinja));
        at->names[i] = strdup(tool_name(t));
        at->n = i + 1;
        if (!out->tool_json[i] || !at->names[i]) {
            return nv_api_oom(err);
        }
    }
    /* an answer format (response_format): a turn that must call leaves it for a later turn; under auto
       the answer is a call or, instead, the answer in the format, from its first byte */
    const int format = out->grammar != NULL;
    const int rest_of_answer = style != NV_TOOLS_HERMES && style != NV_TOOLS_XML; /* the calls end the answer */
    nv_grammar_unref(out->grammar);
    out->grammar = out->req.grammar = NULL;
    if (required || only || format) {
        nv_err e = calls_grammar(tools, only, style, parallel && !only, 0, out->reasoning, required || only ? NULL : out,
                                 &out->grammar);
        if (e != NV_OK) {
            nv_api_error_set(err, e == NV_ENOMEM ? 500 : 400, e == NV_ENOMEM ? "server_error" : "invalid_request_error", NULL,
                             "tools", "the calls cannot be held to the tools' schemas: %s", nv_errmsg());
            return err->status;
        }
        out->req.grammar = out->grammar;
    } else if (calls_grammar(tools, NULL, style, rest_of_answer && parallel, 1, 0, NULL, &out->lazy_grammar) == NV_OK) {
        /* auto: the answer is free, but a call, once begun, follows the schemas (a schema the
         * grammar cannot take leaves the calls unconstrained: they are still read); where the calls
         * are the rest of the answer, the grammar holds them all (parallel ones too) */
        out->req.lazy_grammar = out->lazy_grammar;
        out->req.lazy_trigger = style == NV_TOOLS_LLAMA3    ? "{"
                                : style == NV_TOOLS_GRANITE || style == NV_TOOLS_PHI4_MINI ? NV_GRANITE_TOOL_CALL
                                : style == NV_TOOLS_MISTRAL || nv_tool_style_mistral_args(style) ? NV_MISTRAL_TOOL_CALLS
                                                            : "<tool_call>";
        out->req.lazy_at_start = style == NV_TOOLS_LLAMA3;
        /* Llama 3's call is the whole answer, Granite's and Mistral's calls the rest of it */
        out->req.lazy_ends = rest_of_answer || !parallel;
        out->req.lazy_think = out->reasoning; /* a call begins after the model's think block */
    }
    return 0;
}

/* The text of a content field (name: how errors call it, param: their param): a string, or a list of
 * {"type":"text","text":...} parts. */
static int content_text(const cJSON *content, const char *param, const char *name, nv_buf *text, nv_api_error *err) {
    if (cJSON_IsString(content)) {
        nv_buf_puts(text, content->valuestring);
        return 0;
    }
    if (cJSON_IsArray(content)) {
        for (const cJSON *part = content->child; part; part = part->next) {
            const cJSON *type = cJSON_IsObject(part) ? cJSON_GetObjectItemCaseSensitive(part, "type") : NULL;
            const cJSON *t = cJSON_IsObject(part) ? cJSON_GetObjectItemCaseSensitive(part, "text") : NULL;
            if (!type || !cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 || !t || !cJSON_IsString(t)) {
                nv_api_error_set(err, E400, NULL, param,
                                 "'%s' parts must be {\"type\": \"text\", \"text\": string} (this model reads text only)",
                                 name);
                return err->status;
            }
            nv_buf_puts(text, t->valuestring);
        }
        return 0;
    }
    nv_api_error_set(err, E400, NULL, param, "'%s' must be a string or a list of text parts", name);
    return err->status;
}

/* OpenAI's Predicted Outputs: {"type": "content", "content": a string or text parts}, the text the
 * answer is expected to be, encoded as the answer's tokens (no BOS); cut at the context's length,
 * past which no answer reaches. */
static int parse_prediction(const nv_api_ctx *ctx, const cJSON *root, nv_api_request *out, nv_api_error *err) {
    const cJSON *p = nv_api_field(root, "prediction");
    if (!p) return 0;
    const cJSON *type = cJSON_IsObject(p) ? cJSON_GetObjectItemCaseSensitive(p, "type") : NULL;
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "content") != 0) {
        nv_api_error_set(err, E400, NULL, "prediction", "'prediction' must be {\"type\": \"content\", \"content\": text}");
        return err->status;
    }
    const cJSON *content = nv_api_field(p, "content");
    if (!content) {
        nv_api_error_set(err, E400, "missing_required_parameter", "prediction", "'prediction.content' is required");
        return err->status;
    }
    nv_buf text = {0};
    int rc = content_text(content, "prediction", "prediction.content", &text, err);
    if (!rc && text.oom) rc = nv_api_oom(err);
    if (!rc && text.len) {
        if (nv_tokenizer_encode(ctx->tok, text.data, 0, 0, &out->pred_ids, &out->req.n_prediction) != NV_OK) {
            nv_api_error_set(err, 500, "server_error", NULL, "prediction", "cannot tokenize the prediction: %s", nv_errmsg());
            rc = err->status;
        } else {
            if (out->req.n_prediction > ctx->seq_len) out->req.n_prediction = ctx->seq_len;
            out->req.prediction = out->pred_ids;
        }
    }
    nv_buf_free(&text);
    return rc;
}

/* An assistant message's tool_calls: [{"id", "type": "function", "function": {"name", "arguments": JSON
 * text}}], pointing into the request's JSON (m->calls is freed by the caller). */
static int message_calls(const cJSON *msg, int i, nv_chat_msg *m, nv_api_error *err) {
    const cJSON *calls = nv_api_field(msg, "tool_calls");
    if (!calls || (cJSON_IsArray(calls) && !calls->child)) return 0;
    int n = cJSON_GetArraySize(calls);
    nv_chat_call *c = cJSON_IsArray(calls) && n <= NV_MAX_TOOLS ? calloc((size_t)n, sizeof *c) : NULL;
    if (!c) {
        nv_api_error_set(err, E400, NULL, "messages", "'messages[%d].tool_calls' must be a list of at most %d calls", i,
                         NV_MAX_TOOLS);
        return err->status;
    }
    m->calls = c;
    m->n_calls = n;
    int k = 0;
    for (const cJSON *call = calls->child; call; call = call->next, k++) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name"), *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (!cJSON_IsObject(call) || !cJSON_IsString(name) || !valid_tool_name(name->valuestring) || !cJSON_IsString(args)) {
            nv_api_error_set(err, E400, NULL, "messages",
                             "'messages[%d].tool_calls[%d]' must be {\"type\": \"function\", \"function\": {\"name\": NAME, "
                             "\"arguments\": JSON text}}",
                             i, k);
            return err->status;
        }
        c[k].name = name->valuestring;
        c[k].arguments = args->valuestring;
        c[k].id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(call, "id"));
    }
    return 0;
}

int nv_api_messages_parse(const cJSON *msgs, nv_api_messages *out, nv_api_error *err) {
    memset(out, 0, sizeof *out);
    if (!msgs) {
        nv_api_error_set(err, E400, "missing_required_parameter", "messages", "'messages' is required");
        return err->status;
    }
    if (!cJSON_IsArray(msgs)) {
        nv_api_error_set(err, E400, NULL, "messages", "'messages' must be a list of messages");
        return err->status;
    }
    int n = cJSON_GetArraySize(msgs);
    if (n < 1) {
        nv_api_error_set(err, E400, NULL, "messages", "'messages' must contain at least one message");
        return err->status;
    }
    nv_chat_msg *m = out->m = calloc((size_t)n, sizeof *m);
    nv_buf *texts = out->texts = calloc((size_t)n, sizeof *texts);
    out->n = n;
    int rc = 0, i = 0;
    if (!m || !texts) {
        rc = nv_api_oom(err);
    }
    for (const cJSON *msg = msgs->child; msg && !rc; msg = msg->next, i++) {
        const cJSON *role = cJSON_IsObject(msg) ? cJSON_GetObjectItemCaseSensitive(msg, "role") : NULL;
        if (!cJSON_IsObject(msg)) {
            nv_api_error_set(err, E400, NULL, "messages", "'messages[%d]' must be an object", i);
            rc = err->status;
        } else if (!role || !cJSON_IsString(role)) {
            nv_api_error_set(err, E400, NULL, "messages", "'messages[%d].role' is required and must be a string", i);
            rc = err->status;
        } else if (!nv_chat_role_known(role->valuestring)) {
            nv_api_error_set(err, E400, NULL, "messages",
                             "'messages[%d].role' must be one of system, developer, user, assistant, tool, function (got "
                             "'%.64s')",
                             i,
                             role->valuestring);
            rc = err->status;
        } else {
            const cJSON *content = nv_api_field(msg, "content");
            if (!content) {
                if (strcmp(role->valuestring, "assistant") != 0) {
                    nv_api_error_set(err, E400, "missing_required_parameter", "messages",
                                     "'messages[%d].content' is required", i);
                    rc = err->status;
                }
            } else {
                char name[48];
                snprintf(name, sizeof name, "messages[%d].content", i);
                rc = content_text(content, "messages", name, &texts[i], err);
                m[i].text_given = 1; /* ("" as sent: not none) */
            }
            m[i].role = role->valuestring;
            m[i].tool_call_id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(msg, "tool_call_id"));
            /* a participant's name, and an assistant's earlier reasoning (vLLM's reasoning_content; its newer
               reasoning too): what templates run as Jinja see of them */
            const cJSON *name = nv_api_field(msg, "name"), *why = nv_api_field(msg, "reasoning_content");
            if (!why) why = nv_api_field(msg, "reasoning");
            if (!rc && name && !cJSON_IsString(name))
                nv_api_error_set(err, E400, NULL, "messages", "'messages[%d].name' must be a string", i), rc = err->status;
            if (!rc && why && !cJSON_IsString(why))
                nv_api_error_set(err, E400, NULL, "messages", "'messages[%d].%s' must be a string", i, why->string), rc = err->status;
            m[i].name = cJSON_GetStringValue(name);
            m[i].reasoning = cJSON_GetStringValue(why);
            if (!rc && !strcmp(role->valuestring, "assistant")) rc = message_calls(msg, i, &m[i], err);
        }
    }
    for (int j = 0; j < n && !rc; j++) {
        if (texts[j].oom) {
            rc = nv_api_oom(err);
        }
        m[j].content = texts[j].data ? texts[j].data : "";
    }
    if (rc) nv_api_messages_free(out);
    return rc;
}

void nv_api_messages_free(nv_api_messages *msgs) {
    for (int j = 0; msgs->texts && j < msgs->n; j++) nv_buf_free(&msgs->texts[j]);
    free(msgs->texts);
    for (int j = 0; msgs->m && j < msgs->n; j++) free((void *)msgs->m[j].calls);
    free(msgs->m);
    memset(msgs, 0, sizeof *msgs);
}

/* A rendering's failure: the model's Jinja template refusing the messages (its raise_exception, an
 * error or a limit) is the request's 400, anything else the server's 500. */
static void template_error(nv_err e, nv_api_error *err) {
    if (e == NV_EINVAL) nv_api_error_set(err, E400, NULL, "messages", "%s", nv_errmsg());
    else nv_api_error_set(err, 500, "server_error", NULL, "messages", "cannot apply the chat template: %s", nv_errmsg());
}

/* A chat request's reasoning: how its answer is read (llama.cpp's reasoning_format: none, deepseek, or
 * auto, the server's choice) and the budget of its think block (vLLM's thinking_token_budget,
 * llama.cpp's thinking_budget_tokens, -1 for none; the server's --reasoning-budget where neither is
 * given). */
static int parse_reasoning(const nv_api_ctx *ctx, const cJSON *root, nv_api_request *out, nv_api_error *err) {
    const cJSON *fmt = nv_api_field(root, "reasoning_format");
    out->reasoning = ctx->reasoning;
    if (fmt) {
        const char *f = cJSON_GetStringValue(fmt);
        if (!f || (strcmp(f, "none") && strcmp(f, "deepseek") && strcmp(f, "auto"))) {
            nv_api_error_set(err, E400, NULL, "reasoning_format", "'reasoning_format' must be 'none', 'deepseek' or 'auto'");
            return err->status;
        }
        if (strcmp(f, "auto")) out->reasoning = !strcmp(f, "deepseek");
    }
    out->req.think_tags = ctx->think_tags ? ctx->think_tags : NV_THINK_ANGLE;
    if (out->reasoning) out->reasoning = out->req.think_tags;
    static const char *const names[] = {"thinking_token_budget", "thinking_budget_tokens"};
    long long budget = ctx->think_budget;
    for (int k = 0, given, rc, seen = 0; k < 2; k++) {
        if ((rc = get_int(root, names[k], -1, 1e9, &budget, &given, err))) return rc; /* -1: no limit */
        if (given && seen++) {
            nv_api_error_set(err, E400, NULL, names[k], "give one of 'thinking_token_budget' and 'thinking_budget_tokens'");
            return err->status;
        }
    }
    out->req.think_budget = ctx->n_think_close && budget >= 0 ? (int)budget : -1;
    out->req.think_close = ctx->think_close;
    out->req.n_think_close = ctx->n_think_close;
    return 0;
}

const char *nv_api_effort_level(const char *s) {
    static const char *const levels[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
    for (size_t k = 0; s && k < sizeof levels / sizeof *levels; k++)
        if (!strcmp(s, levels[k])) return levels[k];
    return NULL;
}

/* OpenAI's reasoning_effort (the server's --reasoning-effort where not given) into *effort (NULL: none);
 * a 400 in err when it is not a level. */
static int reasoning_effort(const nv_api_ctx *ctx, const cJSON *root, const char **effort, nv_api_error *err) {
    const cJSON *v = nv_api_field(root, "reasoning_effort");
    *effort = ctx->reasoning_effort;
    if (!v) return 0;
    if ((*effort = nv_api_effort_level(cJSON_GetStringValue(v)))) return 0;
    nv_api_error_set(err, E400, NULL, "reasoning_effort", "'reasoning_effort' must be one of none, minimal, low, medium, high, xhigh");
    return err->status;
}

/* The rendering's options a chat request sets besides its tools: vLLM's chat_template_kwargs
 * ({"enable_thinking": false} turns Qwen3's reasoning off), reasoning_effort (the template's variable
 * of that name, as vLLM and llama.cpp pass it: gpt-oss's reads it; a kwarg of that name wins) and
 * continue_final_message (the last message, an assistant's answer begun, is continued). A request
 * whose answer is read for reasoning (rq: its reasoning and budget) has thinking off (enable_thinking
 * false) where the effort is "none" or "minimal" or the budget is 0, unless the kwargs'
 * enable_thinking says otherwise. */
static int chat_opts(const nv_api_ctx *ctx, const cJSON *root, const nv_api_messages *msgs, const nv_api_request *rq, nv_chat_opts *o,
                     nv_api_error *err) {
    const cJSON *kw = nv_api_field(root, "chat_template_kwargs");
    const char *effort = NULL;
    int cont = 0, gen = 1, rc = 0;
    if (kw && !cJSON_IsObject(kw)) {
        nv_api_error_set(err, E400, NULL, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        return err->status;
    }
    if ((rc = reasoning_effort(ctx, root, &effort, err))) return rc;
    const char *shown = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(kw, "reasoning_effort"));
    if (!shown) shown = effort;
    int thinking = !rq->reasoning || (!(shown && (!strcmp(shown, "none") || !strcmp(shown, "minimal"))) && rq->req.think_budget != 0);
    if (kw && (rc = nv_api_get_bool(kw, "enable_thinking", &thinking, err))) return rc;
    if ((rc = nv_api_get_bool(root, "continue_final_message", &cont, err))) return rc;
    if ((rc = nv_api_get_bool(root, "add_generation_prompt", &gen, err))) return rc; /* vLLM's and llama.cpp's */
    const nv_chat_msg *last = &msgs->m[msgs->n - 1];
    if (cont && (strcmp(last->role, "assistant") != 0 || last->n_calls)) {
        nv_api_error_set(err, E400, NULL, "continue_final_message",
                         "'continue_final_message' needs the last message to be the assistant's text to continue");
        return err->status;
    }
    o->no_think = !thinking;
    o->effort = effort;
    o->continue_final = cont;
    o->no_gen_prompt = !gen;
    o->kwargs = kw;
    return 0;
}

/* vLLM's request-side template fields: chat_template, a Jinja text run for this request alone (only
 * with --trust-request-chat-template: a client then picks the text the model reads), and documents,
 * the template's 'documents' (RAG templates read them: Command R's, Granite's). The parsed template
 * goes to o->jinja and *own (the caller frees it), a copy of the kwargs with the documents to o->kwargs
 * and *own_kw (the caller deletes it); both NULL when not given. Stops and tool calls stay the server
 * template's. */
static int request_template(const nv_api_ctx *ctx, const cJSON *root, nv_chat_opts *o, nv_jinja **own, cJSON **own_kw, nv_api_error *err) {
    const cJSON *tt = nv_api_field(root, "chat_template"), *docs = nv_api_field(root, "documents");
    *own = NULL, *own_kw = NULL;
    if (tt && !ctx->trust_request_template) {
        nv_api_error_set(err, E400, NULL, "chat_template",
                         "this server runs its own chat template: a request's 'chat_template' needs --trust-request-chat-template");
        return err->status;
    }
    if (tt && !cJSON_IsString(tt)) {
        nv_api_error_set(err, E400, NULL, "chat_template", "'chat_template' must be a string");
        return err->status;
    }
    if (tt && nv_jinja_parse(tt->valuestring, strlen(tt->valuestring), own) != NV_OK) {
        nv_api_error_set(err, E400, NULL, "chat_template", "'chat_template': %s", nv_errmsg());
        return err->status;
    }
    if (*own) o->jinja = *own;
    if (!docs) return 0;
    if (!cJSON_IsArray(docs)) {
        nv_api_error_set(err, E400, NULL, "documents", "'documents' must be a list");
        return err->status;
    }
    if (!o->jinja) {
        nv_api_error_set(err, E400, NULL, "documents", "'documents' needs a chat template run as Jinja (this server's is %s)",
                         nv_chat_template_name(ctx->tmpl));
        return err->status;
    }
    if (!(*own_kw = o->kwargs ? cJSON_Duplicate(o->kwargs, 1) : cJSON_CreateObject()) ||
        !cJSON_AddItemToObject(*own_kw, "documents", cJSON_Duplicate(docs, 1)))
        return nv_api_oom(err);
    o->kwargs = *own_kw;
    return 0;
}

static int parse_messages(const nv_api_ctx *ctx, const cJSON *root, nv_api_request *out, nv_api_error *err) {
    nv_api_messages msgs;
    int rc = nv_api_messages_parse(nv_api_field(root, "messages"), &msgs, err);
    if (rc) return rc;
    const nv_chat_msg *m = msgs.m;
    const int n = msgs.n;
    nv_chat_opts opts = {.tools = (const char *const *)out->tool_json, .n_tools = out->tools ? out->tools->n : 0, .jinja = ctx->jinja};
    nv_jinja *own = NULL;
    cJSON *own_kw = NULL;
    rc = chat_opts(ctx, root, &msgs, out, &opts, err);
    if (!rc) rc = request_template(ctx, root, &opts, &own, &own_kw, err);
    out->no_think = opts.no_think, out->effort = opts.effort; /* (Ollama's context renders the turn again) */
    nv_err e = NV_OK;
    if (!rc && (e = nv_chat_render_opts(ctx->tmpl, ctx->tok, m, n, &opts, &out->prompt_ids, &out->req.n_prompt)) != NV_OK) {
        template_error(e, err);
        rc = err->status;
    } else if (!rc && out->req.n_prompt == 0) {
        nv_api_error_set(err, E400, NULL, "messages", "'messages' give no tokens (this vocabulary has no BOS to start from)");
        rc = err->status;
    }
    /* a generation prompt that opens the think block (DeepSeek-R1's later templates): the answer starts in it */
    if (!rc) out->req.think_open = nv_think_opened(ctx->tok, ctx->think_tags, out->prompt_ids, out->req.n_prompt);
    nv_api_messages_free(&msgs);
    nv_jinja_free(own);
    cJSON_Delete(own_kw);
    return rc;
}

/* The prompt after the ids of po->prefix (its BOS left out after them, llama2's kept). */
static int put_prefix(const nv_api_ctx *ctx, const nv_api_parse_opts *po, nv_api_request *out, nv_api_error *err) {
    const int *p = out->prompt_ids;
    int n = out->req.n_prompt;
    if (nv_chat_leading_bos(ctx->tmpl, ctx->tok, p, n)) p++, n--;
    int *ids = malloc(((size_t)po->n_prefix + (size_t)n) * sizeof *ids);
    if (!ids) return nv_api_oom(err);
    memcpy(ids, po->prefix, (size_t)po->n_prefix * sizeof *ids);
    if (n) memcpy(ids + po->n_prefix, p, (size_t)n * sizeof *ids);
    free(out->prompt_ids);
    out->prompt_ids = ids;
    out->req.n_prompt = po->n_prefix + n;
    return 0;
}

/* Ollama's truncation (nv_api_parse_opts.truncate): the prompt's first keep tokens and its last ones,
 * when it does not fit with room for an answer; half of that room past the kept ones is left to the
 * answer (llama.cpp's server drops whole halves likewise). */
static void truncate_prompt(const nv_api_ctx *ctx, int keep, nv_api_request *out) {
    const long hold = ctx->capacity < ctx->seq_len - 1 ? ctx->capacity : ctx->seq_len - 1; /* the longest prompt that fits */
    const int n = out->req.n_prompt;
    if (n <= hold || hold < 2) return; /* (a pool of one position: refused below) */
    if (keep > hold / 2) keep = (int)(hold / 2);
    const int tail = (int)((hold - keep) / 2);
    memmove(out->prompt_ids + keep, out->prompt_ids + n - tail, (size_t)tail * sizeof *out->prompt_ids);
    out->req.n_prompt = keep + tail;
    nv_info("serve: a prompt of %d tokens is cut to %d (its first %d and its last %d), as Ollama truncates", n, keep + tail, keep,
            tail);
}

/* vLLM's truncate_prompt_tokens: a prompt (each of a list) keeps only its last k tokens (-1: as many as
 * the context holds, less one for the answer). */
static int truncate_prompt_tokens(const nv_api_ctx *ctx, const cJSON *root, nv_api_request *out, nv_api_error *err) {
    long long k = 0;
    int given, rc;
    if ((rc = get_int(root, "truncate_prompt_tokens", -1, 1e9, &k, &given, err)) || !given) return rc;
    if (k == 0 || k > ctx->seq_len) {
        nv_api_error_set(err, E400, NULL, "truncate_prompt_tokens", "'truncate_prompt_tokens' must be 1 to the context's %d tokens (or -1: as many as fit)",
                         ctx->seq_len);
        return err->status;
    }
    const cJSON *suffix = nv_api_field(root, "suffix");
    if (out->echo || (cJSON_IsString(suffix) && suffix->valuestring[0])) { /* (a fill-in's markers are at the prompt's start) */
        nv_api_error_set(err, E400, NULL, "truncate_prompt_tokens", "'truncate_prompt_tokens' cannot be combined with '%s'", out->echo ? "echo" : "suffix");
        return err->status;
    }
    const long fits = ctx->capacity < ctx->seq_len - 1 ? ctx->capacity : ctx->seq_len - 1; /* the longest prompt the server takes */
    if (k < 0 || k > fits) k = fits;
    for (int i = -1; i < out->n_more; i++) {
        int *ids = i < 0 ? out->prompt_ids : out->more[i].ids, *n = i < 0 ? &out->req.n_prompt : &out->more[i].n;
        if (*n > k) memmove(ids, ids + *n - k, (size_t)k * sizeof *ids), *n = (int)k;
    }
    return 0;
}

static int parse_stop(const cJSON *root, int max_stop, nv_api_request *out, nv_api_error *err) {
    const cJSON *s = nv_api_field(root, "stop");
    if (!s) return 0;
    const cJSON *one = s, *list = NULL;
    if (cJSON_IsArray(s)) {
        list = s;
        one = NULL;
        if (cJSON_GetArraySize(s) > max_stop) {
            nv_api_error_set(err, E400, NULL, "stop", "'stop' may list at most %d strings", max_stop);
            return err->status;
        }
    }
    int k = 0;
    for (const cJSON *e = list ? list->child : one; e; e = list ? e->next : NULL) {
        if (!cJSON_IsString(e)) {
            nv_api_error_set(err, E400, NULL, "stop", "'stop' must be a string or a list of strings");
            return err->status;
        }
        if (strlen(e->valuestring) > NV_MAX_STOP_BYTES) {
            nv_api_error_set(err, E400, NULL, "stop", "stop strings may be at most %d bytes long", NV_MAX_STOP_BYTES);
            return err->status;
        }
        if (!e->valuestring[0]) continue;
        if (!(out->stop_copy[k] = strdup(e->valuestring))) {
            return nv_api_oom(err);
        }
        out->req.stop[k] = out->stop_copy[k];
        k++;
    }
    out->req.n_stop = k;
    return 0;
}

/* A grammar from a text: kind "grammar" (GBNF), "regex" or "choice" (a list of strings); param
 * names the field in errors. */
static int text_grammar(const cJSON *v, const char *kind, const char *param, int think, nv_grammar **g, nv_api_error *err) {
    nv_err e;
    if (!strcmp(kind, "choice")) {
        const int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0;
        const char **list = n ? malloc((size_t)n * sizeof *list) : NULL;
        if (n && !list) return nv_api_oom(err);
        int k = 0;
        for (const cJSON *it = n ? v->child : NULL; it && cJSON_IsString(it); it = it->next) list[k++] = it->valuestring;
        if (!n || k < n) {
            free(list);
            nv_api_error_set(err, E400, NULL, param, "'%s' must be a non-empty list of strings", param);
            return err->status;
        }
        e = nv_choice_grammar(list, n, think, g);
        free(list);
    } else {
        if (!cJSON_IsString(v)) {
            nv_api_error_set(err, E400, NULL, param, "'%s' must be a string", param);
            return err->status;
        }
        e = !strcmp(kind, "regex") ? nv_regex_grammar(v->valuestring, think, g) : nv_gbnf_grammar(v->valuestring, think, g);
    }
    if (e == NV_ENOMEM) return nv_api_oom(err);
    if (e != NV_OK) {
        nv_api_error_set(err, E400, NULL, param, "invalid '%s': %s", param, nv_errmsg());
        return err->status;
    }
    return 0;
}

/* The fields beside response_format that constrain the answer: llama.cpp's grammar (GBNF), vLLM's
 * guided_grammar, guided_regex, guided_choice, and its structured_outputs object. */
static const char *const text_fields[] = {"grammar", "guided_grammar", "guided_regex", "guided_choice", "structured_outputs"};
static const char *const text_kinds[] = {"grammar", "grammar", "regex", "choice", NULL};

/* vLLM's structured_outputs: {"json" | "regex" | "choice" | "grammar" | "json_object": ...}, one of them. */
static int structured_outputs(const cJSON *so, int think, nv_grammar **g, nv_api_error *err) {
    static const char *const keys[] = {"json", "regex", "choice", "grammar", "json_object", "structural_tag"};
    const char *given = NULL;
    const cJSON *v = NULL;
    if (!cJSON_IsObject(so)) {
        nv_api_error_set(err, E400, NULL, "structured_outputs", "'structured_outputs' must be an object");
        return err->status;
    }
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
        const cJSON *x = nv_api_field(so, keys[k]);
        if (!x || (!strcmp(keys[k], "json_object") && cJSON_IsFalse(x))) continue;
        if (given) {
            nv_api_error_set(err, E400, NULL, "structured_outputs", "'structured_outputs' takes one of json, regex, choice, grammar and json_object");
            return err->status;
        }
        given = keys[k], v = x;
    }
    char param[48];
    snprintf(param, sizeof param, "structured_outputs.%s", given ? given : "");
    if (!given) {
        nv_api_error_set(err, E400, NULL, "structured_outputs", "'structured_outputs' takes one of json, regex, choice, grammar and json_object");
        return err->status;
    }
    if (!strcmp(given, "structural_tag")) {
        nv_api_error_set(err, E400, NULL, param, "'structured_outputs.structural_tag' is not supported");
        return err->status;
    }
    if (strcmp(given, "json") && strcmp(given, "json_object")) return text_grammar(v, given, param, think, g, err);
    cJSON *parsed = cJSON_IsString(v) && !strcmp(given, "json") ? cJSON_Parse(v->valuestring) : NULL;
    if (cJSON_IsString(v) && !strcmp(given, "json") && !parsed) {
        nv_api_error_set(err, E400, NULL, param, "'%s' is not valid JSON", param);
        return err->status;
    }
    nv_err e = !strcmp(given, "json_object") ? nv_schema_grammar_ex(NULL, 1, think, g) : nv_schema_grammar_ex(parsed ? parsed : v, 0, think, g);
    cJSON_Delete(parsed);
    if (e == NV_ENOMEM) return nv_api_oom(err);
    if (e != NV_OK) {
        nv_api_error_set(err, E400, NULL, param, "invalid JSON schema: %s", nv_errmsg());
        return err->status;
    }
    return 0;
}

/* Structured outputs: OpenAI's response_format {"type": "json_object"} or {"type": "json_schema",
 * "json_schema": {"name", "schema", "strict"}}, and the same schema as llama.cpp's server
 * ("json_schema": SCHEMA) or vLLM's ("guided_json": SCHEMA or its JSON text) take it; or one of
 * text_fields. */
static int parse_response_format(int chat, const cJSON *root, nv_api_request *out, nv_api_error *err) {
    const int think = chat ? out->reasoning : 0; /* --reasoning-format: the answer follows the think block (in its tags) */
    const cJSON *rf = nv_api_field(root, "response_format"), *llama = nv_api_field(root, "json_schema"), *vllm = nv_api_field(root, "guided_json");
    const char *rf_type = cJSON_GetStringValue(cJSON_IsObject(rf) ? cJSON_GetObjectItemCaseSensitive(rf, "type") : NULL);
    const char *given[8];
    int n_given = 0, text = -1;
    if (rf && !(rf_type && !strcmp(rf_type, "text"))) given[n_given++] = "response_format";
    if (llama) given[n_given++] = "json_schema";
    if (vllm) given[n_given++] = "guided_json";
    for (int k = 0; k < 5; k++)
        if (nv_api_field(root, text_fields[k])) given[n_given++] = text_fields[k], text = k;
    if (n_given > 1) {
        nv_api_error_set(err, E400, NULL, given[0], "give one of '%s' and '%s' (one way to constrain the answer)", given[0], given[1]);
        return err->status;
    }
    if (text >= 0) {
        const cJSON *v = nv_api_field(root, text_fields[text]);
        int rc = text_kinds[text] ? text_grammar(v, text_kinds[text], text_fields[text], think, &out->grammar, err)
                                  : structured_outputs(v, think, &out->grammar, err);
        if (!rc) out->req.grammar = out->grammar;
        out->format_text = 1;
        return rc;
    }
    const cJSON *schema = llama ? llama : vllm;
    const char *param = llama ? "json_schema" : "guided_json";
    cJSON *parsed = NULL;
    nv_err e = NV_OK;
    if (rf) {
        const cJSON *type = cJSON_IsObject(rf) ? cJSON_GetObjectItemCaseSensitive(rf, "type") : NULL;
        if (!cJSON_IsString(type)) {
            nv_api_error_set(err, E400, NULL, "response_format", "'response_format' must be an object with a 'type'");
            return err->status;
        }
        if (!strcmp(type->valuestring, "text")) return 0;
        if (!strcmp(type->valuestring, "json_object")) {
            e = nv_schema_grammar_ex(NULL, 1, think, &out->grammar);
            out->format_object = 1;
        } else if (!strcmp(type->valuestring, "json_schema")) {
            const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
            const cJSON *name = cJSON_IsObject(js) ? cJSON_GetObjectItemCaseSensitive(js, "name") : NULL;
            if (!cJSON_IsObject(js) || (name && !cJSON_IsString(name))) {
                nv_api_error_set(err, E400, NULL, "response_format.json_schema",
                                 "'response_format.json_schema' must be an object {\"name\": string, \"schema\": object}");
                return err->status;
            }
            schema = nv_api_field(js, "schema");
            param = "response_format.json_schema.schema";
            if (!schema && !(schema = parsed = cJSON_CreateTrue())) { /* no schema: any JSON value */
                return nv_api_oom(err);
            }
        } else {
            nv_api_error_set(err, E400, NULL, "response_format.type",
                             "'response_format.type' must be 'text', 'json_object' or 'json_schema', not '%.40s'",
                             type->valuestring);
            return err->status;
        }
    } else if (cJSON_IsString(vllm)) {
        if (!(schema = parsed = cJSON_Parse(vllm->valuestring))) {
            nv_api_error_set(err, E400, NULL, "guided_json", "'guided_json' is not valid JSON");
            return err->status;
        }
    }
    if (schema && !out->grammar && e == NV_OK) e = nv_schema_grammar_ex(schema, 0, think, &out->grammar);
    if (schema && e == NV_OK && !(out->format_schema = cJSON_Duplicate(schema, 1))) e = NV_ENOMEM;
    cJSON_Delete(parsed);
    if (e == NV_ENOMEM) {
        return nv_api_oom(err);
    }
    if (e != NV_OK) {
        nv_api_error_set(err, E400, NULL, param, "invalid JSON schema: %s", nv_errmsg());
        return err->status;
    }
    out->req.grammar = out->grammar;
    return 0;
}

int nv_api_model_find(const nv_api_ctx *ctx, const char *id, unsigned *gen) {
    if (!strcmp(id, ctx->model_id)) return 0;
    const int k = nv_adapters_find(ctx->adapters, id, gen);
    return k ? k : -1;
}

int nv_api_lora_parse(const nv_api_ctx *ctx, const cJSON *list, const char *param, nv_adapter_mix *out, nv_api_error *err) {
    const char *what = param ? "'lora'" : "The request body";
    if (!cJSON_IsArray(list)) {
        nv_api_error_set(err, E400, NULL, param, "%s must be an array of objects with 'id' and 'scale' fields", what);
        return err->status;
    }
    /* each slot's factor, the list's later entries over earlier ones and over what out holds (the
       model's adapter); the mix is made of the non-zero ones at the end */
    float factor[NV_MAX_ADAPTERS] = {0};
    unsigned gen[NV_MAX_ADAPTERS] = {0};
    for (int i = 0; i < out->n; i++) factor[out->k[i] - 1] = out->factor[i], gen[out->k[i] - 1] = out->gen[i];
    int i = 0;
    for (const cJSON *e = list->child; e; e = e->next, i++) {
        const cJSON *id = cJSON_IsObject(e) ? nv_api_field(e, "id") : NULL, *scale = cJSON_IsObject(e) ? nv_api_field(e, "scale") : NULL;
        if (!cJSON_IsNumber(id) || !cJSON_IsNumber(scale) || id->valuedouble != floor(id->valuedouble)) {
            nv_api_error_set(err, E400, NULL, param, "%s[%d] must be an object with an integer 'id' and a number 'scale'", what, i);
            return err->status;
        }
        const double k = id->valuedouble + 1; /* ids are slots from 0, adapters' numbers from 1 */
        if (k < 1 || k > NV_MAX_ADAPTERS || !nv_adapters_live(ctx->adapters, (int)k, &gen[(int)k - 1])) {
            nv_api_error_set(err, E400, NULL, param, "%s[%d]: invalid adapter id %.0f (GET /lora-adapters lists them)", what, i,
                             id->valuedouble);
            return err->status;
        }
        if (!(fabs(scale->valuedouble) <= NV_API_LORA_SCALE_MAX)) {
            nv_api_error_set(err, E400, NULL, param, "%s[%d]: 'scale' must be from %d to %d", what, i, -NV_API_LORA_SCALE_MAX,
                             NV_API_LORA_SCALE_MAX);
            return err->status;
        }
        /* a scale below float's normal range is 0 (no subnormal factors in the step) */
        factor[(int)k - 1] = fabs(scale->valuedouble) < FLT_MIN ? 0.0f : (float)scale->valuedouble;
    }
    nv_adapter_mix mix = {0};
    for (int k = 1; k <= NV_MAX_ADAPTERS; k++)
        if (factor[k - 1] != 0.0f && nv_adapter_mix_set(&mix, k, gen[k - 1], factor[k - 1]) != NV_OK) {
            nv_api_error_set(err, E400, NULL, param, "At most %d LoRA adapters at once (the model's included) may have a non-zero scale",
                             NV_MIX_ADAPTERS);
            return err->status;
        }
    *out = mix;
    return 0;
}

int nv_api_check_model(const nv_api_ctx *ctx, const cJSON *root, nv_adapter_mix *lora, char id[NV_API_MODEL_ID], nv_api_error *err) {
    const cJSON *model = nv_api_field(root, "model"), *list = nv_api_field(root, "lora");
    lora->n = 0;
    snprintf(id, NV_API_MODEL_ID, "%s", ctx->model_id);
    if (model && !cJSON_IsString(model)) {
        nv_api_error_set(err, E400, NULL, "model", "'model' must be a string");
        return err->status;
    }
    unsigned gen = 0;
    const int k = model ? nv_api_model_find(ctx, model->valuestring, &gen) : 0;
    if (k < 0) {
        nv_api_error_set(err, 404, "invalid_request_error", "model_not_found", "model",
                         "The model '%.200s' does not exist (this server has '%.200s'%s)", model->valuestring,
                         ctx->model_id, ctx->adapters ? " and its adapters: see /v1/models" : "");
        return err->status;
    }
    if (k) {
        snprintf(id, NV_API_MODEL_ID, "%s", model->valuestring); /* an adapter's id is under 64 bytes */
        nv_adapter_mix_set(lora, k, gen, 1.0f);
    }
    /* llama.cpp's list: the adapters it names at their scales (the model's own at 1 unless listed);
       without it and without an adapter as the model, the server's (POST /lora-adapters) */
    if (list) return nv_api_lora_parse(ctx, list, "lora", lora, err);
    if (!k) nv_adapters_applied(ctx->adapters, lora);
    return 0;
}

static int parse_root(const nv_api_ctx *ctx, int chat, const cJSON *root, const nv_api_parse_opts *po, nv_api_request *out,
                      nv_api_error *err) {
    int rc, given;
    if ((rc = nv_api_check_model(ctx, root, &out->req.lora, out->model, err))) return rc;
    if ((rc = nv_api_get_bool(root, "stream", &out->stream, err))) return rc;
    const cJSON *so = nv_api_field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) {
            nv_api_error_set(err, E400, NULL, "stream_options", "'stream_options' must be an object");
            return err->status;
        }
        if (!out->stream) {
            nv_api_error_set(err, E400, NULL, "stream_options", "'stream_options' is only allowed when 'stream' is true");
            return err->status;
        }
        if ((rc = nv_api_get_bool(so, "include_usage", &out->include_usage, err))) {
            snprintf(err->param, sizeof err->param, "stream_options.include_usage");
            return rc;
        }
    }
    long long n = 1;
    if ((rc = get_int(root, "n", 1, NV_MAX_CHOICES, &n, &given, err))) return rc;
    out->n = (int)n;
    double t = 1.0, p = 1.0;
    if ((rc = get_number(root, "temperature", 0, 2, &t, &given, err))) return rc;
    if ((rc = get_number(root, "top_p", 0, 1, &p, &given, err))) return rc;
    out->req.temperature = (float)t;
    /* 0 (OpenAI's range is [0, 1]) and a positive top_p below float's range keep only the most likely
       token, as any tiny one does */
    out->req.top_p = (float)p > 0 ? (float)p : FLT_MIN;
    /* vLLM's and llama.cpp's extensions: top_k (-1 and 0 are off, as in either) and min_p */
    long long top_k = 0;
    double min_p = 0;
    if ((rc = get_int(root, "top_k", -1, 1e9, &top_k, &given, err))) return rc;
    if ((rc = get_number(root, "min_p", 0, 1, &min_p, &given, err))) return rc;
    out->req.top_k = top_k > 0 && top_k < ctx->vocab_size ? (int)top_k : 0; /* the whole vocabulary is off */
    out->req.min_p = (float)min_p;
    long long seed = 0;
    if ((rc = get_int(root, "seed", -9.2e18, 9.2e18, &seed, &given, err))) return rc;
    if (given) {
        out->req.seed = (uint64_t)seed;
    } else {
        static _Atomic uint64_t counter;
        nv_rng r;
        nv_rng_seed(&r, (uint64_t)time(NULL) ^ ((uint64_t)(nv_now() * 1e9) << 7) ^ atomic_fetch_add(&counter, 1) * 0x9E37ull);
        out->req.seed = r.state;
    }
    if ((rc = logit_adjustments(ctx, root, out, err))) return rc;
    if ((rc = token_filters(ctx, root, out, err)) || (rc = vllm_ending_and_priority(ctx, root, out, err))) return rc;
    if ((rc = parse_logprobs(root, chat, out, err))) return rc;
    if ((rc = nv_api_get_bool(root, "return_tokens_as_token_ids", &out->lp_ids, err))) return rc;
    const char *bad[] = {"best_of", "functions", "tools"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0] - (chat ? 1 : 0); i++) /* chat takes tools */
        if ((rc = unsupported(root, bad[i], err))) return rc;
    if (chat && (rc = unsupported(root, "suffix", err))) return rc; /* completions fill in between (parse_prompt) */
    /* OpenAI's fields for what no model here does: spoken answers, web search */
    const char *other[] = {"modalities", "audio", "web_search_options"};
    for (size_t i = 0; chat && i < sizeof other / sizeof other[0]; i++)
        if ((rc = unsupported(root, other[i], err))) return rc;
    const cJSON *user = nv_api_field(root, "user");
    if (user && !cJSON_IsString(user)) {
        nv_api_error_set(err, E400, NULL, "user", "'user' must be a string");
        return err->status;
    }
    if (!chat && (rc = nv_api_get_bool(root, "echo", &out->echo, err))) return rc;
    out->req.prompt_logprobs = out->echo && out->req.logprobs; /* the echoed prompt's tokens get theirs too */
    if ((rc = parse_prompt_logprobs(root, out, err))) return rc;
    if ((rc = parse_stop(root, po->max_stop, out, err))) return rc;
    out->req.n_own_stop = out->req.n_stop; /* the template's end of turn, added below, is the server's */
    out->req.think_budget = -1;
    if (chat && (rc = parse_reasoning(ctx, root, out, err))) return rc;
    if ((rc = parse_response_format(chat, root, out, err))) return rc;
    if (chat && (rc = parse_tools(ctx, root, out, err))) return rc;
    if (chat) {
        const char *ts = nv_chat_template_stop(ctx->tmpl);
        if (ts && out->req.n_stop < NV_MAX_STOP) {
            if (!(out->stop_copy[out->req.n_stop] = strdup(ts))) {
                return nv_api_oom(err);
            }
            out->req.stop[out->req.n_stop] = out->stop_copy[out->req.n_stop];
            out->req.n_stop++;
        }
    }

    long long max_tokens = 0, mct = 0;
    int mt_given = 0, mct_given = 0, unlimited = 0;
    /* -1: no limit but the context's, as llama.cpp's server reads it (its web UI sends it) */
    const cJSON *mt = nv_api_field(root, "max_tokens");
    if (cJSON_IsNumber(mt) && mt->valuedouble == -1) unlimited = 1;
    /* 0 with echo: the prompt alone (with logprobs, scored), as OpenAI's legacy completions allow */
    else if ((rc = get_int(root, "max_tokens", out->echo ? 0 : 1, 1e9, &max_tokens, &mt_given, err))) return rc;
    if (chat && (rc = get_int(root, "max_completion_tokens", 1, 1e9, &mct, &mct_given, err))) return rc;
    const char *mt_param = "max_tokens";
    if (mct_given) {
        max_tokens = mct;
        mt_given = 1;
        mt_param = "max_completion_tokens";
    }

    if ((rc = chat ? parse_messages(ctx, root, out, err) : parse_prompt(ctx, root, out, err))) return rc;
    if (po->n_prefix && (rc = put_prefix(ctx, po, out, err))) return rc;
    if (po->count_only) return 0;
    if (po->truncate) truncate_prompt(ctx, po->keep, out);
    if ((rc = truncate_prompt_tokens(ctx, root, out, err))) return rc;
    if ((rc = parse_prediction(ctx, root, out, err))) return rc;
    const char *pp = chat ? "messages" : "prompt";
    long np = out->req.n_prompt; /* the longest prompt sets the room every one of them has */
    for (int i = 0; i < out->n_more; i++)
        if (out->more[i].n > np) np = out->more[i].n;
    if ((long)(out->n_more + 1) * out->n > NV_MAX_CHOICES) {
        nv_api_error_set(err, E400, NULL, "n", "%d prompts x n %d = %d choices; at most %d", out->n_more + 1, out->n,
                         (out->n_more + 1) * out->n, NV_MAX_CHOICES);
        return err->status;
    }
    if (np >= ctx->seq_len) {
        nv_api_error_set(err, E400, "context_length_exceeded", pp,
                         "This model's maximum context length is %d tokens, but the prompt has %ld tokens", ctx->seq_len,
                         np);
        return err->status;
    }
    if (np > ctx->capacity) {
        nv_api_error_set(err, E400, "context_length_exceeded", pp,
                         "The prompt has %ld tokens but the server's KV cache holds at most %ld per request "
                         "(raise --kv-memory)",
                         np, ctx->capacity);
        return err->status;
    }
    long room = ctx->seq_len - np, pool_room = ctx->capacity - np + 1;
    if (mt_given && po->max_tokens_cap) { /* a ceiling, not a demand: the room there is, at most that */
        if (max_tokens > room) max_tokens = room;
        if (max_tokens > pool_room) max_tokens = pool_room;
    } else if (mt_given) {
        if (np + max_tokens > ctx->seq_len) {
            nv_api_error_set(err, E400, "context_length_exceeded", mt_param,
                             "This model's maximum context length is %d tokens. However, you requested %lld tokens "
                             "(%ld in the prompt, %lld for the completion)",
                             ctx->seq_len, np + max_tokens, np, max_tokens);
            return err->status;
        }
        if (max_tokens > pool_room) {
            nv_api_error_set(err, E400, "context_length_exceeded", mt_param,
                             "%ld prompt tokens + %lld completion tokens do not fit the server's KV cache, which holds "
                             "at most %ld positions per request (raise --kv-memory)",
                             np, max_tokens, ctx->capacity);
            return err->status;
        }
    } else {
        max_tokens = chat || unlimited ? room : 16;
        if (max_tokens > room) max_tokens = room;
        if (max_tokens > pool_room) max_tokens = pool_room;
    }
    out->req.max_tokens = (int)max_tokens;
    /* vLLM's ignore_eos and min_tokens: end-of-generation tokens do not end the answer (ever / before
     * min_tokens tokens). Not with a grammar: its sentence may end only on one of them. */
    long long min_tokens = 0;
    int mint_given = 0;
    if ((rc = nv_api_get_bool(root, "ignore_eos", &out->req.ignore_eos, err))) return rc;
    if ((rc = get_int(root, "min_tokens", 0, 1e9, &min_tokens, &mint_given, err))) return rc;
    if (min_tokens > max_tokens) {
        nv_api_error_set(err, E400, NULL, "min_tokens", "'min_tokens' (%lld) must be at most the answer's %lld tokens",
                         min_tokens, max_tokens);
        return err->status;
    }
    if ((out->req.ignore_eos || min_tokens) && (out->req.grammar || out->req.lazy_grammar)) {
        nv_api_error_set(err, E400, NULL, out->req.ignore_eos ? "ignore_eos" : "min_tokens",
                         "'%s' cannot be combined with structured outputs or tools", out->req.ignore_eos ? "ignore_eos" : "min_tokens");
        return err->status;
    }
    out->req.min_tokens = (int)min_tokens;
    if (min_tokens && out->req.n_allowed) { /* min_tokens with only end (or stop) tokens allowed: nothing to sample */
        int other = 0;
        for (int a = 0; a < out->req.n_allowed && !other; a++) {
            other = !nv_tokenizer_is_eog(ctx->tok, out->allowed[a]);
            for (int k = 0; other && k < out->req.n_stop_ids; k++) other = out->allowed[a] != out->stop_ids[k];
        }
        if (!other) {
            nv_api_error_set(err, E400, NULL, "min_tokens", "'min_tokens' needs 'allowed_token_ids' to allow a token that does not end the answer");
            return err->status;
        }
    }
    out->req.prompt = out->prompt_ids;
    out->req.vocab_size = ctx->vocab_size;
    return 0;
}

/* 1 when the JSON text has the escape \u0000: cJSON writes it as a NUL that ends the C string
 * there, so whatever followed in that string would be dropped without a word. */
static int has_nul_escape(const char *body, size_t len) {
    for (size_t i = 0; i + 6 <= len; i++) {
        if (body[i] != '\\') continue;
        size_t j = i; /* a run of backslashes: the odd ones escape */
        while (j < len && body[j] == '\\') j++;
        if ((j - i) % 2 == 1 && j + 5 <= len && (body[j] == 'u' || body[j] == 'U') && !memcmp(body + j + 1, "0000", 4)) return 1;
        i = j - 1;
    }
    return 0;
}

/* The body as JSON of any kind (NULL with err set when it is none). */
static cJSON *body_json(const char *body, size_t len, const char *expected, nv_api_error *err) {
    if (body && !nv_utf8_valid(body, len)) { /* (JSON text is UTF-8: its strings come back in answers as they came) */
        nv_api_error_set(err, E400, "invalid_json", NULL, "We could not parse the JSON body of your request: it is not valid UTF-8");
        return NULL;
    }
    if (body && has_nul_escape(body, len)) {
        nv_api_error_set(err, E400, "invalid_json", NULL, "The request holds the escape \\u0000: NUL characters are not supported");
        return NULL;
    }
    /* (a tool's schema or a call's arguments then show 1.0 as written) */
    cJSON *root = body && len ? nv_json_parse_whole(body, len) : NULL;
    if (!root)
        nv_api_error_set(err, E400, "invalid_json", NULL,
                         len ? "We could not parse the JSON body of your request: it is not valid JSON"
                             : "The request body is empty: send %s", expected);
    return root;
}

cJSON *nv_api_body_object(const char *body, size_t len, nv_api_error *err) {
    cJSON *root = body_json(body, len, "a JSON object", err);
    if (root && !cJSON_IsObject(root)) {
        nv_api_error_set(err, E400, "invalid_json", NULL, "The request body must be a JSON object");
        cJSON_Delete(root);
        root = NULL;
    }
    return root;
}

int nv_api_lora_apply(const nv_api_ctx *ctx, const char *body, size_t len, nv_api_error *err) {
    memset(err, 0, sizeof *err);
    cJSON *root = body_json(body, len, "a JSON array of {\"id\", \"scale\"}", err);
    if (!root) return err->status;
    nv_adapter_mix mix = {0};
    int rc = nv_api_lora_parse(ctx, root, NULL, &mix, err);
    if (!rc && ctx->adapters && !nv_adapters_apply(ctx->adapters, &mix)) /* unloaded since the list was read */
        nv_api_error_set(err, E400, NULL, NULL, "A LoRA adapter of the list was removed meanwhile: nothing was changed"), rc = err->status;
    cJSON_Delete(root);
    return rc;
}

static void lora_entry(void *arg, int k, const nv_adapter *a) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return;
    cJSON_AddNumberToObject(o, "id", k - 1);
    cJSON_AddStringToObject(o, "path", a->path);
    cJSON_AddNumberToObject(o, "scale", a->applied);
    cJSON_AddStringToObject(o, "name", a->name);
    cJSON_AddItemToArray(arg, o);
}

char *nv_api_lora_list(const nv_api_ctx *ctx) {
    cJSON *list = cJSON_CreateArray();
    if (list && ctx->adapters) nv_adapters_each(ctx->adapters, lora_entry, list);
    return nv_api_print_free(list);
}

int nv_api_parse_json(const nv_api_ctx *ctx, int chat, const cJSON *root, const nv_api_parse_opts *o, nv_api_request *out,
                      nv_api_error *err) {
    memset(out, 0, sizeof *out);
    memset(err, 0, sizeof *err);
    out->chat = chat;
    int rc = parse_root(ctx, chat, root, o, out, err);
    if (rc) nv_api_request_free(out);
    return rc;
}

int nv_api_oom(nv_api_error *err) {
    nv_api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
    return err->status;
}

int nv_api_bad(nv_api_error *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char msg[sizeof err->message];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    nv_api_error_set(err, E400, NULL, NULL, "%s", msg);
    return err->status;
}

int nv_api_copy_field(const cJSON *in, cJSON *out, const char *key, const char *as, char kind, nv_api_error *err) {
    const cJSON *v = nv_api_field(in, key);
    if (!v) return 0;
    /* an integer: finite and whole (no cast of an out-of-range double); its range is the OpenAI parser's to check */
    int ok = kind == 'j' || (kind == 'b' ? cJSON_IsBool(v)
                                         : cJSON_IsNumber(v) && (kind == 'n' || (isfinite(v->valuedouble) && v->valuedouble == floor(v->valuedouble))));
    if (!ok) return nv_api_bad(err, "%s: must be %s", key, kind == 'b' ? "a boolean" : kind == 'n' ? "a number" : "an integer");
    cJSON *copy = cJSON_Duplicate(v, kind == 'j');
    if (!copy) return nv_api_oom(err);
    cJSON_AddItemToObject(out, as ? as : key, copy);
    return 0;
}

int nv_api_parse_translated(const nv_api_ctx *ctx, const char *body, size_t len, nv_api_translate translate, void *arg,
                            const nv_api_parse_opts *o, nv_api_request *out, nv_api_error *err) {
    memset(out, 0, sizeof *out);
    memset(err, 0, sizeof *err);
    cJSON *in = nv_api_body_object(body, len, err);
    if (!in) return err->status;
    cJSON *chat = cJSON_CreateObject();
    int rc = chat ? translate(in, chat, arg, err) : nv_api_oom(err);
    cJSON_Delete(in);
    if (!rc) rc = nv_api_parse_json(ctx, 1, chat, o, out, err);
    cJSON_Delete(chat);
    return rc;
}

int nv_api_parse(const nv_api_ctx *ctx, int chat, const char *body, size_t len, nv_api_request *out, nv_api_error *err) {
    cJSON *root = nv_api_body_object(body, len, err);
    if (!root) {
        memset(out, 0, sizeof *out);
        return err->status;
    }
    const nv_api_parse_opts o = {.max_stop = 4}; /* OpenAI's limit */
    int rc = nv_api_parse_json(ctx, chat, root, &o, out, err);
    cJSON_Delete(root);
    return rc;
}


/* The most ids one /tokenize answer or /detokenize request holds: a response's JSON grows with it,
 * and a server thread per connection builds one (about 250 bytes an id with pieces). */
#define MAX_TOKENIZE_IDS (1 << 18)

int nv_api_tokenize(const nv_api_ctx *ctx, const char *body, size_t len, char **out, nv_api_error *err) {
    *out = NULL;
    memset(err, 0, sizeof *err);
    cJSON *root = nv_api_body_object(body, len, err);
    if (!root) return err->status;
    /* llama.cpp's server names the text "content" (specials off by default), vLLM's "prompt" (on) */
    const cJSON *content = nv_api_field(root, "content"), *prompt = nv_api_field(root, "prompt");
    const cJSON *text = content ? content : prompt;
    const char *key = content ? "content" : "prompt";
    int add_special = !content, with_pieces = 0, rc = 0;
    if (!text) {
        nv_api_error_set(err, E400, "missing_required_parameter", "content", "'content' (or 'prompt') is required");
        rc = err->status;
    } else if (!cJSON_IsString(text)) {
        nv_api_error_set(err, E400, NULL, key, "'%s' must be a string", key);
        rc = err->status;
    } else if (!(rc = nv_api_get_bool(root, content ? "add_special" : "add_special_tokens", &add_special, err))) {
        rc = nv_api_get_bool(root, "with_pieces", &with_pieces, err);
    }
    int *ids = NULL, n = 0;
    if (!rc && nv_tokenizer_encode(ctx->tok, text->valuestring, add_special, 0, &ids, &n) != NV_OK) {
        nv_api_error_set(err, 500, "server_error", NULL, key, "cannot tokenize: %s", nv_errmsg());
        rc = err->status;
    }
    cJSON_Delete(root);
    if (!rc && n > MAX_TOKENIZE_IDS) {
        nv_api_error_set(err, E400, NULL, key, "the text gives %d tokens, more than the %d one request may", n, MAX_TOKENIZE_IDS);
        rc = err->status;
    }
    if (rc) {
        free(ids);
        return rc;
    }
    cJSON *res = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(res, "tokens");
    nv_buf piece = {0};
    for (int i = 0; i < n; i++) {
        if (!with_pieces) {
            cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
            continue;
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id", ids[i]);
        const int prev = i ? ids[i - 1] : nv_tokenizer_bos(ctx->tok); /* every token as decoded but BOS */
        const char *dec = ids[i] == nv_tokenizer_bos(ctx->tok) ? "" : nv_tokenizer_decode(ctx->tok, prev, ids[i]);
        cJSON_AddStringToObject(o, "piece", json_piece(dec ? dec : "", &piece));
        cJSON_AddItemToArray(arr, o);
    }
    nv_buf_free(&piece);
    cJSON_AddNumberToObject(res, "count", n);
    cJSON_AddNumberToObject(res, "max_model_len", ctx->seq_len);
    free(ids);
    *out = nv_api_print_free(res);
    return 0;
}

int nv_api_apply_template(const nv_api_ctx *ctx, const char *body, size_t len, char **out, nv_api_error *err) {
    *out = NULL;
    memset(err, 0, sizeof *err);
    cJSON *root = nv_api_body_object(body, len, err);
    if (!root) return err->status;
    nv_api_messages msgs;
    char **tools = NULL;
    int n_tools = 0, rc = nv_api_messages_parse(nv_api_field(root, "messages"), &msgs, err);
    if (rc) {
        cJSON_Delete(root);
        return rc;
    }
    nv_chat_opts opts = {.jinja = ctx->jinja};
    nv_api_request as_chat = {0}; /* the prompt a chat request of this body is given */
    nv_jinja *own = NULL;
    cJSON *own_kw = NULL;
    if (!(rc = parse_reasoning(ctx, root, &as_chat, err)) && !(rc = chat_opts(ctx, root, &msgs, &as_chat, &opts, err)) &&
        !(rc = request_template(ctx, root, &opts, &own, &own_kw, err)))
        rc = nv_api_tool_texts(nv_api_field(root, "tools"), nv_chat_tool_text_style(ctx->tmpl, ctx->jinja), &tools, &n_tools, err);
    opts.tools = (const char *const *)tools;
    opts.n_tools = n_tools;
    nv_buf text = {0};
    nv_err e = NV_OK;
    if (!rc && (e = nv_chat_render_text(ctx->tmpl, ctx->tok, msgs.m, msgs.n, &opts, &text)) != NV_OK) {
        template_error(e, err);
        rc = err->status;
    }
    nv_api_tool_texts_free(tools, n_tools);
    nv_api_messages_free(&msgs);
    nv_jinja_free(own);
    cJSON_Delete(own_kw);
    cJSON_Delete(root);
    if (!rc) {
        cJSON *res = cJSON_CreateObject();
        cJSON_AddStringToObject(res, "prompt", text.data ? text.data : "");
        *out = nv_api_print_free(res);
    }
    nv_buf_free(&text);
    return rc;
}

int nv_api_detokenize(const nv_api_ctx *ctx, const char *body, size_t len, char **out, nv_api_error *err) {
    *out = NULL;
    memset(err, 0, sizeof *err);
    cJSON *root = nv_api_body_object(body, len, err);
    if (!root) return err->status;
    const cJSON *toks = nv_api_field(root, "tokens");
    int rc = 0;
    if (!toks) {
        nv_api_error_set(err, E400, "missing_required_parameter", "tokens", "'tokens' is required");
        rc = err->status;
    } else if (!cJSON_IsArray(toks)) {
        nv_api_error_set(err, E400, NULL, "tokens", "'tokens' must be a list of token ids");
        rc = err->status;
    } else if (cJSON_GetArraySize(toks) > MAX_TOKENIZE_IDS) {
        nv_api_error_set(err, E400, NULL, "tokens", "'tokens' holds more than the %d ids one request may", MAX_TOKENIZE_IDS);
        rc = err->status;
    }
    const int n = rc ? 0 : cJSON_GetArraySize(toks);
    int *ids = rc ? NULL : malloc((size_t)(n ? n : 1) * sizeof *ids);
    if (!rc && !ids) {
        rc = nv_api_oom(err);
    }
    if (!rc) rc = read_ids(toks, "tokens", ctx->vocab_size, ids, err);
    cJSON_Delete(root);
    char *text = rc ? NULL : ids_text(ctx->tok, ids, n);
    free(ids);
    if (rc) return rc;
    if (!text) {
        return nv_api_oom(err);
    }
    cJSON *res = cJSON_CreateObject();
    cJSON_AddStringToObject(res, "content", text); /* llama.cpp's name */
    cJSON_AddStringToObject(res, "prompt", text);  /* vLLM's */
    free(text);
    *out = nv_api_print_free(res);
    return 0;
}

void nv_api_request_free(nv_api_request *r) {
    free(r->prompt_ids);
    free(r->pred_ids);
    for (int i = 0; i < r->n_more; i++) free(r->more[i].ids), free(r->more[i].echo_text);
    free(r->bias_tok);
    free(r->allowed);
    free(r->stop_ids);
    free(r->bad_tok);
    free(r->bad_len);
    free(r->dry_breaker);
    free(r->bias);
    free(r->echo_text);
    for (int i = 0; i < NV_MAX_STOP; i++) free(r->stop_copy[i]);
    nv_grammar_unref(r->grammar);
    nv_grammar_unref(r->lazy_grammar);
    cJSON_Delete(r->format_schema);
    nv_api_tools_free(r->tools);
    for (int i = 0; r->tool_json && r->tool_json[i]; i++) free(r->tool_json[i]);
    free(r->tool_json);
    memset(r, 0, sizeof *r);
}

/* ---- responses --------------------------------------------------------------------------------- */

/* Ids are keys to stored responses (GET/DELETE /v1/responses/{id}): 96 bits from the kernel's random
 * source, so one client cannot guess another's; the clock and a counter only if it fails. */
void nv_api_new_id(char *out, size_t cap, const char *prefix) {
    uint64_t a = 0, b = 0;
    uint8_t bytes[12];
    if (getrandom(bytes, sizeof bytes, 0) == (ssize_t)sizeof bytes) {
        memcpy(&a, bytes, 8);
        uint32_t lo;
        memcpy(&lo, bytes + 8, 4);
        b = lo;
    } else {
        static _Atomic uint64_t counter;
        nv_rng r;
        nv_rng_seed(&r, ((uint64_t)(nv_now() * 1e9)) ^ (atomic_fetch_add(&counter, 1) << 40) ^ (uint64_t)time(NULL));
        a = r.state;
        nv_rng_seed(&r, a);
        b = r.state & 0xffffffffu;
    }
    snprintf(out, cap, "%s%016llx%08llx", prefix, (unsigned long long)a, (unsigned long long)b);
}

void nv_api_meta_init(nv_api_meta *m, int chat, const char *model) {
    memset(m, 0, sizeof *m);
    nv_api_new_id(m->id, sizeof m->id, chat ? "chatcmpl-" : "cmpl-");
    m->created = (long)time(NULL);
    snprintf(m->model, sizeof m->model, "%s", model);
    m->chat = chat;
}

const char *nv_api_finish_reason(nv_finish f) { return f == NV_FINISH_STOP ? "stop" : "length"; }

static cJSON *envelope(const nv_api_meta *m, const char *object) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", m->id);
    cJSON_AddStringToObject(root, "object", object);
    cJSON_AddNumberToObject(root, "created", (double)m->created);
    cJSON_AddStringToObject(root, "model", m->model);
    return root;
}

static void add_usage(cJSON *root, const nv_api_meta *m, int prompt_tokens, int completion_tokens, int cached_tokens) {
    cJSON *u = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", prompt_tokens + completion_tokens);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", cached_tokens);
    if (!m->pred) return;
    d = cJSON_AddObjectToObject(u, "completion_tokens_details");
    cJSON_AddNumberToObject(d, "accepted_prediction_tokens", m->pred_accepted);
    cJSON_AddNumberToObject(d, "rejected_prediction_tokens", m->pred_rejected);
}



/* A record's token as responses name it: its text, or with return_tokens_as_token_ids "token_id:N"
 * (vLLM's: texts that are not whole characters, or equal for two tokens, stay apart). */
static const char *lp_name(const nv_api_meta *m, int prev, int tok, nv_buf *b) {
    if (!m->lp_ids) return token_text(m->lp_tok, prev, tok, m->lp_special, b);
    b->len = 0;
    nv_buf_printf(b, "token_id:%d", tok);
    return b->data ? b->data : "";
}

/* {"token", "logprob", "bytes"} of the chat shape (bytes: the piece's raw bytes). */
static cJSON *chat_token(const nv_api_meta *m, int prev, int tok, float logprob, nv_buf *b) {
    cJSON *o = cJSON_CreateObject();
    nv_api_token_fields(o, m->lp_tok, prev, tok, m->lp_special, b);
    if (m->lp_ids) cJSON_ReplaceItemInObjectCaseSensitive(o, "token", cJSON_CreateString(lp_name(m, prev, tok, b)));
    cJSON_AddNumberToObject(o, "logprob", logprob);
    return o;
}

/* choice.logprobs: null, or the records m->lps in OpenAI's chat or completions shape. */
static void add_logprobs(cJSON *c, const nv_api_meta *m) {
    if (!m->lp_on) {
        cJSON_AddNullToObject(c, "logprobs");
        return;
    }
    cJSON *lp = cJSON_AddObjectToObject(c, "logprobs");
    nv_buf b = {0};
    if (m->chat) {
        cJSON *content = cJSON_AddArrayToObject(lp, "content");
        for (int i = 0; i < m->n_lps; i++) {
            const nv_token_lp *t = &m->lps[i];
            cJSON *e = chat_token(m, t->prev, t->tok, t->logprob, &b);
            cJSON_AddItemToArray(content, e);
            cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
            for (int j = 0; j < t->n_top; j++) cJSON_AddItemToArray(tops, chat_token(m, t->prev, t->top_tok[j], t->top_lp[j], &b));
        }
    } else {
        cJSON *tokens = cJSON_AddArrayToObject(lp, "tokens"), *lps = cJSON_AddArrayToObject(lp, "token_logprobs");
        cJSON *tops = cJSON_AddArrayToObject(lp, "top_logprobs"), *offs = cJSON_AddArrayToObject(lp, "text_offset");
        long off = m->text_offset;
        for (int i = 0; i < m->n_lps; i++) {
            const nv_token_lp *t = &m->lps[i];
            cJSON_AddItemToArray(tokens, cJSON_CreateString(lp_name(m, t->prev, t->tok, &b)));
            cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
            off += (long)strlen(nv_tokenizer_answer_piece(m->lp_tok, t->prev, t->tok, m->lp_special));
            if (t->unscored) { /* an echoed prompt's first token */
                cJSON_AddItemToArray(lps, cJSON_CreateNull());
                cJSON_AddItemToArray(tops, cJSON_CreateNull());
                continue;
            }
            cJSON_AddItemToArray(lps, cJSON_CreateNumber(t->logprob));
            cJSON *alt = cJSON_CreateObject();
            for (int j = 0; j < t->n_top; j++) {
                const char *key = lp_name(m, t->prev, t->top_tok[j], &b);
                if (!cJSON_GetObjectItemCaseSensitive(alt, key)) cJSON_AddNumberToObject(alt, key, t->top_lp[j]);
            }
            cJSON_AddItemToArray(tops, alt);
        }
    }
    nv_buf_free(&b);
}

long nv_api_text_advance(const nv_api_meta *m) {
    long off = m->text_offset;
    for (int i = 0; i < m->n_lps; i++) off += (long)strlen(nv_tokenizer_answer_piece(m->lp_tok, m->lps[i].prev, m->lps[i].tok, m->lp_special));
    return off;
}

char *nv_api_response(const nv_api_meta *m, const char *text, const char *finish, int prompt_tokens,
                      int completion_tokens) {
    return nv_api_response_cached(m, text, finish, prompt_tokens, completion_tokens, 0);
}

char *nv_api_response_cached(const nv_api_meta *m, const char *text, const char *finish, int prompt_tokens,
                             int completion_tokens, int cached_tokens) {
    nv_api_choice one = {.text = text, .finish = finish, .lps = m->lps, .n_lps = m->n_lps};
    return nv_api_response_choices(m, &one, 1, prompt_tokens, completion_tokens, cached_tokens);
}

/* {"id", "type": "function", "function": {"name", "arguments"}}, with "index" in a stream (k >= 0). */
static cJSON *tool_call_json(const nv_tool_call *call, int k) {
    cJSON *c = cJSON_CreateObject();
    if (k >= 0) cJSON_AddNumberToObject(c, "index", k);
    cJSON_AddStringToObject(c, "id", call->id);
    cJSON_AddStringToObject(c, "type", "function");
    cJSON *fn = cJSON_AddObjectToObject(c, "function");
    cJSON_AddStringToObject(fn, "name", call->name);
    cJSON_AddStringToObject(fn, "arguments", call->arguments);
    return c;
}

/* vLLM's stop_reason beside finish_reason: the request's own stop string that ended the answer, or
 * the token (stop_token_ids', or an end token other than the vocabulary's EOS); null for EOS, the
 * template's end of turn, a limit. */
static void add_stop_reason(cJSON *c, const nv_req_status *st) {
    if (st && st->finish == NV_FINISH_STOP && st->stop_text[0]) cJSON_AddStringToObject(c, "stop_reason", st->stop_text);
    else if (st && st->finish == NV_FINISH_STOP && st->stop_token >= 0) cJSON_AddNumberToObject(c, "stop_reason", st->stop_token);
    else cJSON_AddNullToObject(c, "stop_reason");
}

/* vLLM's prompt_logprobs: [null, {"<id>": {"logprob", "rank", "decoded_token"}, ...}, ...], each prompt
 * token first, then its top alternatives (each id once; an alternative's rank its place among them). */
static cJSON *prompt_logprobs_json(const nv_api_meta *m, const nv_api_choice *ch) {
    cJSON *list = cJSON_CreateArray();
    nv_buf b = {0};
    char id[16];
    for (int i = 0; i < ch->n_plps; i++) {
        const nv_token_lp *t = &ch->plps[i];
        if (t->unscored) {
            cJSON_AddItemToArray(list, cJSON_CreateNull());
            continue;
        }
        cJSON *o = cJSON_CreateObject();
        const int n_top = t->n_top < ch->plp_top ? t->n_top : ch->plp_top;
        for (int j = -1; j < n_top; j++) {
            const int tok = j < 0 ? t->tok : t->top_tok[j];
            snprintf(id, sizeof id, "%d", tok);
            if (j >= 0 && tok == t->tok) continue;
            cJSON *e = cJSON_AddObjectToObject(o, id);
            cJSON_AddNumberToObject(e, "logprob", j < 0 ? t->logprob : t->top_lp[j]);
            cJSON_AddNumberToObject(e, "rank", j < 0 ? t->rank : j + 1);
            cJSON_AddStringToObject(e, "decoded_token", lp_name(m, t->prev, tok, &b));
        }
        cJSON_AddItemToArray(list, o);
    }
    nv_buf_free(&b);
    return list;
}

char *nv_api_response_choices(const nv_api_meta *m, const nv_api_choice *ch, int n, int prompt_tokens,
                              int completion_tokens, int cached_tokens) {
    cJSON *root = envelope(m, m->chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    for (int i = 0; i < n; i++) {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddItemToArray(choices, c);
        cJSON_AddNumberToObject(c, "index", i);
        if (m->chat) {
            cJSON *msg = cJSON_AddObjectToObject(c, "message");
            cJSON_AddStringToObject(msg, "role", "assistant");
            if (ch[i].n_calls && !*ch[i].text) cJSON_AddNullToObject(msg, "content");
            else cJSON_AddStringToObject(msg, "content", ch[i].text);
            if (ch[i].reasoning) cJSON_AddStringToObject(msg, "reasoning_content", ch[i].reasoning);
            if (ch[i].n_calls) {
                cJSON *calls = cJSON_AddArrayToObject(msg, "tool_calls");
                for (int k = 0; k < ch[i].n_calls; k++) cJSON_AddItemToArray(calls, tool_call_json(&ch[i].calls[k], -1));
            }
        } else {
            cJSON_AddStringToObject(c, "text", ch[i].text);
        }
        nv_api_meta mi = *m;
        mi.lps = ch[i].lps;
        mi.n_lps = ch[i].n_lps;
        mi.text_offset = 0;
        add_logprobs(c, &mi);
        cJSON_AddStringToObject(c, "finish_reason", ch[i].finish);
        add_stop_reason(c, ch[i].status);
        if (!m->chat && ch[i].plps) cJSON_AddItemToObject(c, "prompt_logprobs", prompt_logprobs_json(m, &ch[i]));
    }
    if (m->chat && n > 0 && ch[0].plps) cJSON_AddItemToObject(root, "prompt_logprobs", prompt_logprobs_json(m, &ch[0]));
    add_usage(root, m, prompt_tokens, completion_tokens, cached_tokens);
    return nv_api_print_free(root);
}

char *nv_api_chunk(const nv_api_meta *m, const char *text, int role, const char *finish, int usage_null) {
    cJSON *root = envelope(m, m->chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", m->index);
    if (m->chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        if (text && (role || *text || !finish)) cJSON_AddStringToObject(d, "content", text);
    } else {
        cJSON_AddStringToObject(c, "text", text ? text : "");
    }
    add_logprobs(c, m);
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    if (finish) add_stop_reason(c, m->status);
    if (usage_null) cJSON_AddNullToObject(root, "usage");
    return nv_api_print_free(root);
}

char *nv_api_tool_call_chunk(const nv_api_meta *m, const nv_tool_call *call, int k, int usage_null) {
    cJSON *root = envelope(m, "chat.completion.chunk");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", m->index);
    cJSON *calls = cJSON_AddArrayToObject(cJSON_AddObjectToObject(c, "delta"), "tool_calls");
    cJSON_AddItemToArray(calls, tool_call_json(call, k));
    cJSON_AddNullToObject(c, "finish_reason");
    if (usage_null) cJSON_AddNullToObject(root, "usage");
    return nv_api_print_free(root);
}

char *nv_api_reasoning_chunk(const nv_api_meta *m, const char *text, int usage_null) {
    cJSON *root = envelope(m, "chat.completion.chunk");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", m->index);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(c, "delta"), "reasoning_content", text);
    add_logprobs(c, m);
    cJSON_AddNullToObject(c, "finish_reason");
    if (usage_null) cJSON_AddNullToObject(root, "usage");
    return nv_api_print_free(root);
}



char *nv_api_usage_chunk(const nv_api_meta *m, int prompt_tokens, int completion_tokens, int cached_tokens) {
    cJSON *root = envelope(m, m->chat ? "chat.completion.chunk" : "text_completion");
    cJSON_AddArrayToObject(root, "choices");
    add_usage(root, m, prompt_tokens, completion_tokens, cached_tokens);
    return nv_api_print_free(root);
}

/* adapter: an adapter's id (its parent is the base model), NULL for the base model */
static cJSON *model_object(const nv_api_ctx *ctx, long created, const char *adapter) {
    cJSON *mo = cJSON_CreateObject();
    cJSON_AddStringToObject(mo, "id", adapter ? adapter : ctx->model_id);
    cJSON_AddStringToObject(mo, "object", "model");
    cJSON_AddNumberToObject(mo, "created", (double)created);
    cJSON_AddStringToObject(mo, "owned_by", "nerve");
    if (adapter) cJSON_AddStringToObject(mo, "parent", ctx->model_id); /* an adapter names its base, as vLLM's do */
    else cJSON_AddNullToObject(mo, "parent");
    /* vLLM's: the model the id serves, and the context a request may fill (clients size prompts by it) */
    cJSON_AddStringToObject(mo, "root", ctx->model_id);
    cJSON_AddNumberToObject(mo, "max_model_len", ctx->seq_len);
    return mo;
}

int nv_api_model_ids(const nv_api_ctx *ctx, char (*ids)[NV_ADAPTER_NAME_CAP]) {
    return ctx->adapters ? nv_adapters_names(ctx->adapters, ids, NULL, NV_MAX_ADAPTERS) : 0;
}

char *nv_api_models(const nv_api_ctx *ctx, long created, const char *single) {
    if (single) return nv_api_print_free(model_object(ctx, created, strcmp(single, ctx->model_id) ? single : NULL));
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    char ids[NV_MAX_ADAPTERS][NV_ADAPTER_NAME_CAP];
    const int n = nv_api_model_ids(ctx, ids);
    cJSON_AddItemToArray(data, model_object(ctx, created, NULL));
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(data, model_object(ctx, created, ids[i]));
    return nv_api_print_free(root);
}

/* ---- embeddings ------------------------------------------------------------------------------- */

void nv_api_embed_free(nv_api_embed *e) {
    for (int i = 0; i < e->n; i++) free(e->ids[i]);
    free(e->ids);
    free(e->n_ids);
    memset(e, 0, sizeof *e);
}

/* One input (a string, or a list of token ids) into e->ids[i]; its index for the messages. */
static int embed_input(const nv_api_ctx *ctx, const cJSON *in, int i, int listed, nv_api_embed *e, nv_api_error *err) {
    char param[32];
    snprintf(param, sizeof param, listed ? "input[%d]" : "input", i);
    int n = 0;
    if (cJSON_IsString(in)) {
        if (!*in->valuestring) {
            nv_api_error_set(err, E400, NULL, "input", "'%s' must not be empty", param);
            return err->status;
        }
        /* (an embedding model's vocabulary may end each input with EOS: its last-token pooling reads it) */
        if (nv_tokenizer_encode(ctx->tok, in->valuestring, 1, nv_tokenizer_adds_eos(ctx->tok), &e->ids[i], &n) != NV_OK) {
            nv_api_error_set(err, 500, "server_error", NULL, "input", "cannot tokenize '%s': %s", param, nv_errmsg());
            return err->status;
        }
    } else if (cJSON_IsArray(in) && in->child && cJSON_IsNumber(in->child)) {
        n = cJSON_GetArraySize(in);
        if (n <= ctx->seq_len) {
            if (!(e->ids[i] = malloc((size_t)n * sizeof(int)))) {
                return nv_api_oom(err);
            }
            if (read_ids(in, param, ctx->vocab_size, e->ids[i], err)) return err->status;
        }
    } else {
        nv_api_error_set(err, E400, NULL, "input", "'%s' must be a string or a non-empty list of token ids", param);
        return err->status;
    }
    e->n_ids[i] = n;
    if (n > ctx->seq_len || n > ctx->capacity) {
        nv_api_error_set(err, E400, "context_length_exceeded", "input",
                         "This model's maximum context length is %d tokens (%ld fit the KV pool), but '%s' has %d", ctx->seq_len,
                         ctx->capacity, param, n);
        return err->status;
    }
    if (n == 0) {
        nv_api_error_set(err, E400, NULL, "input", "'%s' gives no tokens", param);
        return err->status;
    }
    return 0;
}

int nv_api_embed_parse(const nv_api_ctx *ctx, const char *body, size_t len, nv_api_embed *out, nv_api_error *err) {
    memset(out, 0, sizeof *out);
    memset(err, 0, sizeof *err);
    cJSON *root = nv_api_body_object(body, len, err);
    if (!root) return err->status;
    const int rc = nv_api_embed_parse_json(ctx, root, out, err);
    cJSON_Delete(root);
    return rc;
}

int nv_api_embed_parse_json(const nv_api_ctx *ctx, const cJSON *root, nv_api_embed *out, nv_api_error *err) {
    memset(out, 0, sizeof *out);
    memset(err, 0, sizeof *err);
    int rc = nv_api_check_model(ctx, root, &out->lora, out->model, err);
    const cJSON *input = nv_api_field(root, "input"), *fmt = nv_api_field(root, "encoding_format"), *dims = nv_api_field(root, "dimensions");
    if (!rc && !input) nv_api_error_set(err, E400, "missing_required_parameter", "input", "'input' is required"), rc = err->status;
    if (!rc && fmt && !(cJSON_IsString(fmt) && (!strcmp(fmt->valuestring, "float") || !strcmp(fmt->valuestring, "base64"))))
        nv_api_error_set(err, E400, NULL, "encoding_format", "'encoding_format' must be \"float\" or \"base64\""), rc = err->status;
    /* (a Matryoshka model's vectors are cut to it, as OpenAI's text-embedding-3 are; another model's are whole) */
    int trained = !ctx->n_mrl_dims; /* a width the model was trained at */
    for (int i = 0; dims && i < ctx->n_mrl_dims; i++) trained |= cJSON_IsNumber(dims) && dims->valuedouble == ctx->mrl_dims[i];
    if (!rc && dims && !(cJSON_IsNumber(dims) && dims->valuedouble == ctx->dim) &&
        !(ctx->matryoshka && trained && cJSON_IsNumber(dims) && dims->valuedouble == floor(dims->valuedouble) && dims->valuedouble >= 1 &&
          dims->valuedouble < ctx->dim))
        nv_api_error_set(err, E400, "unsupported_value", "dimensions",
                         !ctx->matryoshka ? "This model's embeddings have %d dimensions and it is not a Matryoshka model (serve --matryoshka): "
                                            "'dimensions' may only be %d"
                         : ctx->n_mrl_dims ? "'dimensions' must be one of the widths the model lists (matryoshka_dimensions) or %d"
                                           : "'dimensions' must be a whole number from 1 to %d (this model's embeddings' width)",
                         ctx->dim, ctx->dim),
            rc = err->status;
    out->dims = !rc && dims && dims->valuedouble < ctx->dim ? (int)dims->valuedouble : 0;
    out->base64 = !rc && fmt && !strcmp(fmt->valuestring, "base64");
    /* a string, a list of ids, or a list of those */
    const int listed = !rc && cJSON_IsArray(input) && !(input->child && cJSON_IsNumber(input->child));
    const int n = rc ? 0 : listed ? cJSON_GetArraySize(input) : 1;
    if (!rc && listed && (n < 1 || n > NV_MAX_EMBED_INPUTS))
        nv_api_error_set(err, E400, NULL, "input", "'input' must list 1 to %d inputs, not %d", NV_MAX_EMBED_INPUTS, n),
            rc = err->status;
    if (!rc && (!(out->ids = calloc((size_t)n, sizeof *out->ids)) || !(out->n_ids = calloc((size_t)n, sizeof *out->n_ids))))
        rc = nv_api_oom(err);
    if (!rc) out->n = n;
    int i = 0;
    for (const cJSON *e = listed ? input->child : input; !rc && e && i < n; e = listed ? e->next : NULL, i++)
        rc = embed_input(ctx, e, i, listed, out, err);
    if (rc) nv_api_embed_free(out);
    return rc;
}

/* RFC 4648 base64 of n bytes, appended to b. */
static void base64_put(nv_buf *b, const unsigned char *p, size_t n) {
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < n; i += 3) {
        const unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        const char q[4] = {a[v >> 18 & 63], a[v >> 12 & 63], i + 1 < n ? a[v >> 6 & 63] : '=', i + 2 < n ? a[v & 63] : '='};
        nv_buf_append(b, q, 4);
    }
}

/* Written straight into one buffer rather than a cJSON tree: 256 inputs of a wide model are
 * millions of numbers. %.9g gives back every float32 exactly. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "base64 embeddings are the floats' little-endian bytes");
void nv_api_embed_cut(float *vecs, int n, int dim, int dims) {
    for (int i = 0; i < n; i++) {
        const float *v = vecs + (size_t)i * dim;
        float *to = vecs + (size_t)i * dims;
        double norm = 0;
        for (int j = 0; j < dims; j++) norm += (double)v[j] * v[j];
        norm = sqrt(norm);
        for (int j = 0; j < dims; j++) to[j] = (float)(norm > 0 ? v[j] / norm : 0.0);
    }
}

char *nv_api_embed_response(int dim, const char *model, const float *vecs, int n, int base64, int prompt_tokens) {
    nv_buf b = {0};
    nv_buf_puts(&b, "{\"object\":\"list\",\"data\":[");
    for (int i = 0; i < n; i++) {
        const float *v = vecs + (size_t)i * dim;
        nv_buf_printf(&b, "%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":", i ? "," : "", i);
        if (base64) { /* the little-endian float32 bytes, as OpenAI's clients decode them */
            nv_buf_puts(&b, "\"");
            base64_put(&b, (const unsigned char *)v, (size_t)dim * sizeof(float));
            nv_buf_puts(&b, "\"}");
        } else {
            nv_buf_puts(&b, "[");
            for (int j = 0; j < dim; j++) nv_buf_printf(&b, j ? ",%.9g" : "%.9g", (double)v[j]);
            nv_buf_puts(&b, "]}");
        }
    }
    nv_buf_puts(&b, "],\"model\":");
    nv_json_string(&b, model);
    nv_buf_printf(&b, ",\"usage\":{\"prompt_tokens\":%d,\"total_tokens\":%d}}", prompt_tokens, prompt_tokens);
    if (b.oom) {
        nv_buf_free(&b);
        return NULL;
    }
    return nv_buf_take(&b);
}
