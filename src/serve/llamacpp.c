#include "serve/llamacpp.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"

#define E400 400, "invalid_request_error"

void nv_lcpp_meta_free(nv_lcpp_meta *m) {
    free(m->prompt);
    for (int i = 0; i < m->n_stop; i++) free(m->stop[i]);
    memset(m, 0, sizeof *m);
}

/* llama-server's sampling defaults, which apply where a request does not say (its penalties, then,
   over the last 64 tokens of the prompt and the answer) */
static const struct {
    const char *key;
    double v;
} defaults[] = {{"temperature", 0.8}, {"top_k", 40}, {"top_p", 0.95}, {"min_p", 0.05}, {"repeat_last_n", 64}};

/* llama-server's fields that change nothing here (see the header), accepted and dropped. */
static const char *const ignored[] = {"cache_prompt", "id_slot", "samplers", "n_keep", "t_max_prompt_ms", "t_max_predict_ms",
                                      "n_indent", "return_tokens", "timings_per_token", "response_fields",
                                      "n_discard", "min_keep", "penalize_nl",
                                      "return_progress", "n_cmpl"};
/* Samplers nerve does not have: fine at their neutral value only. */
static const struct {
    const char *key;
    double neutral;
} neutral[] = {{"tfs_z", 1}};
/* DRY's fields, typical_p, top_n_sigma, XTC's, dynatemp's and Mirostat's pass on to the request as they are (the
   OpenAI endpoints read them: api.c). */

/* Every member named key out of o (a body may give a key twice; the parser would then read the next). */
static void drop(cJSON *o, const char *key) {
    while (cJSON_GetObjectItemCaseSensitive(o, key)) cJSON_DeleteItemFromObjectCaseSensitive(o, key);
}

static void put_number(cJSON *q, const char *key, double v) {
    drop(q, key);
    cJSON_AddNumberToObject(q, key, v);
}

/* logit_bias's list form [[id or text, bias or false], ...] as the object form {id: bias} (false:
 * never, -100; a text: each of its tokens). */
static int bias_object(const nv_api_ctx *ctx, const cJSON *list, cJSON *q, nv_api_error *err) {
    cJSON *obj = cJSON_CreateObject();
    if (!obj) return nv_api_oom(err);
    int i = 0;
    for (const cJSON *e = list->child; e; e = e->next, i++) {
        const cJSON *k = cJSON_GetArrayItem(e, 0), *v = cJSON_GetArrayItem(e, 1);
        if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2 || !(cJSON_IsNumber(k) || cJSON_IsString(k)) ||
            !(cJSON_IsNumber(v) || cJSON_IsFalse(v))) {
            cJSON_Delete(obj);
            nv_api_error_set(err, E400, NULL, "logit_bias",
                             "'logit_bias[%d]' must be a pair [token id or text, bias or false]", i);
            return err->status;
        }
        const double bias = cJSON_IsFalse(v) ? -100.0 : v->valuedouble;
        int *ids = NULL, n = 0, one = (int)k->valuedouble;
        if (cJSON_IsString(k) && nv_tokenizer_encode(ctx->tok, k->valuestring, 0, 0, &ids, &n) != NV_OK) {
            cJSON_Delete(obj);
            nv_api_error_set(err, 500, "server_error", NULL, "logit_bias", "cannot tokenize a logit_bias text: %s", nv_errmsg());
            return err->status;
        }
        if (cJSON_IsNumber(k)) ids = &one, n = 1;
        for (int j = 0; j < n; j++) { /* the object form's checks (an id in the vocabulary) come after */
            char key[32];
            snprintf(key, sizeof key, "%d", ids[j]);
            drop(obj, key);
            cJSON_AddNumberToObject(obj, key, bias);
        }
        if (ids != &one) free(ids);
    }
    drop(q, "logit_bias");
    cJSON_AddItemToObject(q, "logit_bias", obj);
    return 0;
}

/* A string field of an /infill body ("" when absent). */
static int infill_text(const cJSON *in, const char *key, const char **out, nv_api_error *err) {
    const cJSON *v = nv_api_field(in, key);
    if (v && !cJSON_IsString(v)) {
        nv_api_error_set(err, E400, NULL, key, "'%s' must be a string", key);
        return err->status;
    }
    *out = v ? v->valuestring : "";
    return 0;
}

/* /infill's prompt as token ids into q's "prompt" (see the header). */
static int infill_prompt(const nv_api_ctx *ctx, const cJSON *in, cJSON *q, nv_lcpp_meta *meta, nv_api_error *err) {
    const char *prefix, *suffix, *prompt;
    int rc, fim[3];
    if ((rc = infill_text(in, "input_prefix", &prefix, err)) || (rc = infill_text(in, "input_suffix", &suffix, err)) ||
        (rc = infill_text(in, "prompt", &prompt, err)))
        return rc;
    const cJSON *extra = nv_api_field(in, "input_extra");
    if (!extra) extra = nv_api_field(in, "extra_context"); /* its first name */
    if (extra && !cJSON_IsArray(extra)) {
        nv_api_error_set(err, E400, NULL, "input_extra", "'input_extra' must be a list of {\"filename\", \"text\"}");
        return err->status;
    }
    if (!nv_api_fim_tokens(ctx->tok, fim)) {
        nv_api_error_set(err, E400, NULL, NULL,
                         "/infill needs a code model with fill-in-the-middle tokens (<|fim_prefix|>, <fim_prefix> or "
                         "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>); this vocabulary has none");
        return err->status;
    }
    const int rep = nv_tokenizer_lookup(ctx->tok, "<|repo_name|>"), sep = nv_tokenizer_lookup(ctx->tok, "<|file_sep|>");
    nv_ids ex = {0}, pre = {0}, suf = {0}, mid = {0};
    nv_err e = NV_OK;
    int i = 0;
    if (rep >= 0 && sep >= 0) { /* the repo-level form */
        e = nv_ids_push(&ex, &rep, 1);
        if (e == NV_OK) e = nv_tokenizer_encode_into(ctx->tok, "myproject\n", 0, 0, &ex);
    }
    for (const cJSON *c = extra ? extra->child : NULL; c && e == NV_OK; c = c->next, i++) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(c, "filename"), *text = cJSON_GetObjectItemCaseSensitive(c, "text");
        if (!cJSON_IsObject(c) || (name && !cJSON_IsString(name)) || !cJSON_IsString(text)) {
            free(ex.v);
            nv_api_error_set(err, E400, NULL, "input_extra", "'input_extra[%d]' must be {\"filename\": string, \"text\": string}", i);
            return err->status;
        }
        if (rep >= 0 && sep >= 0) {
            nv_buf b = {0};
            nv_buf_printf(&b, "%s\n%s", name ? name->valuestring : "", text->valuestring);
            e = b.oom ? nv_fail(NV_ENOMEM, "out of memory") : nv_ids_push(&ex, &sep, 1);
            if (e == NV_OK) e = nv_tokenizer_encode_into(ctx->tok, b.data, 0, 0, &ex);
            nv_buf_free(&b);
        } else {
            e = nv_tokenizer_encode_into(ctx->tok, text->valuestring, 0, 0, &ex);
        }
    }
    if (rep >= 0 && sep >= 0 && e == NV_OK) {
        e = nv_ids_push(&ex, &sep, 1);
        if (e == NV_OK) e = nv_tokenizer_encode_into(ctx->tok, "filename\n", 0, 0, &ex);
    }
    if (e == NV_OK) e = nv_tokenizer_encode_into(ctx->tok, prefix, 0, 0, &pre);
    if (e == NV_OK) e = nv_tokenizer_encode_into(ctx->tok, suffix, 0, 0, &suf);
    if (e == NV_OK) e = nv_tokenizer_encode_into(ctx->tok, prompt, 0, 0, &mid);
    int rcode = 0;
    if (e != NV_OK) {
        rcode = e == NV_ENOMEM ? nv_api_oom(err)
                               : (nv_api_error_set(err, 500, "server_error", NULL, NULL, "cannot tokenize the input: %s", nv_errmsg()),
                                  err->status);
    } else {
        /* room for the answer: what n_predict asks, at most a quarter of the context (a quarter when unlimited) */
        const int bos = nv_tokenizer_adds_bos(ctx->tok) && nv_tokenizer_bos(ctx->tok) >= 0;
        const int quarter = ctx->seq_len / 4, room = meta->n_predict < 0 || meta->n_predict > quarter ? quarter : meta->n_predict;
        int over = bos + 3 + ex.n + pre.n + suf.n + mid.n - (ctx->seq_len - room), ex0 = 0, pre0 = 0;
        if (over > 0) meta->truncated = 1;
        if (over > 0) { /* the extra context's start first, then the prefix's start, then the suffix's end */
            ex0 = over < ex.n ? over : ex.n;
            over -= ex0;
            pre0 = over < pre.n ? over : pre.n;
            over -= pre0;
            suf.n -= over < suf.n ? over : suf.n;
        }
        cJSON *arr = cJSON_CreateArray();
        const int bos_id = nv_tokenizer_bos(ctx->tok);
        if (arr && bos) cJSON_AddItemToArray(arr, cJSON_CreateNumber(bos_id));
        for (int k = ex0; arr && k < ex.n; k++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(ex.v[k]));
        if (arr) cJSON_AddItemToArray(arr, cJSON_CreateNumber(fim[0]));
        for (int k = pre0; arr && k < pre.n; k++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(pre.v[k]));
        if (arr) cJSON_AddItemToArray(arr, cJSON_CreateNumber(fim[1]));
        for (int k = 0; arr && k < suf.n; k++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(suf.v[k]));
        if (arr) cJSON_AddItemToArray(arr, cJSON_CreateNumber(fim[2]));
        for (int k = 0; arr && k < mid.n; k++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(mid.v[k]));
        drop(q, "prompt");
        if (!arr || !cJSON_AddItemToObject(q, "prompt", arr)) rcode = (cJSON_Delete(arr), nv_api_oom(err));
    }
    free(ex.v), free(pre.v), free(suf.v), free(mid.v);
    return rcode;
}

/* The native request in in, as the OpenAI completions request q (a copy of it) stands for it. */
static int translate(const nv_api_ctx *ctx, const cJSON *in, cJSON *q, int infill, nv_lcpp_meta *meta, nv_api_error *err) {
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++) drop(q, ignored[i]);
    for (size_t i = 0; i < sizeof neutral / sizeof neutral[0]; i++) {
        const cJSON *v = nv_api_field(in, neutral[i].key);
        if (v && !(cJSON_IsNumber(v) && v->valuedouble == neutral[i].neutral)) {
            nv_api_error_set(err, E400, "unsupported_parameter", neutral[i].key, "'%s' is not supported by this server (only %g, which is off)",
                             neutral[i].key, neutral[i].neutral);
            return err->status;
        }
        drop(q, neutral[i].key);
    }
    /* n_probs: the generated tokens' probabilities, as /v1/completions' logprobs */
    const cJSON *probs = nv_api_field(in, "n_probs"), *post = nv_api_field(in, "post_sampling_probs");
    if (probs && (!cJSON_IsNumber(probs) || probs->valuedouble != floor(probs->valuedouble) || probs->valuedouble < 0 ||
                  probs->valuedouble > NV_MAX_TOP_LOGPROBS)) {
        nv_api_error_set(err, E400, NULL, "n_probs", "'n_probs' must be an integer from 0 to %d", NV_MAX_TOP_LOGPROBS);
        return err->status;
    }
    if (post && !cJSON_IsBool(post) && !cJSON_IsNull(post)) {
        nv_api_error_set(err, E400, NULL, "post_sampling_probs", "'post_sampling_probs' must be true or false");
        return err->status;
    }
    meta->n_probs = probs ? (int)probs->valuedouble : 0;
    meta->post_probs = cJSON_IsTrue(post);
    drop(q, "n_probs");
    drop(q, "post_sampling_probs");
    drop(q, "logprobs");
    if (meta->n_probs > 0) put_number(q, "logprobs", meta->n_probs);
    const cJSON *np = nv_api_field(in, "n_predict");
    if (np && (!cJSON_IsNumber(np) || np->valuedouble != floor(np->valuedouble) || np->valuedouble < -1 || np->valuedouble > 1e9)) {
        nv_api_error_set(err, E400, NULL, "n_predict", "'n_predict' must be -1 (no limit), 0 (the prompt only) or a positive integer");
        return err->status;
    }
    meta->n_predict = np ? (int)np->valuedouble : -1;
    drop(q, "n_predict");
    drop(q, "prompt_logprobs"); /* (vLLM's: this API has no place for them) */
    if (meta->n_predict == 0) { /* the prompt alone (it then stays in the prefix cache) */
        meta->prompt_only = 1;
        put_number(q, "max_tokens", 0);
        drop(q, "echo");
        cJSON_AddTrueToObject(q, "echo");
        drop(q, "stream");
    } else {
        put_number(q, "max_tokens", meta->n_predict > 0 ? meta->n_predict : ctx->seq_len); /* a ceiling (max_tokens_cap) */
    }
    const cJSON *rp = nv_api_field(in, "repeat_penalty");
    if (rp && !nv_api_field(in, "repetition_penalty")) cJSON_AddItemToObject(q, "repetition_penalty", cJSON_Duplicate(rp, 1));
    drop(q, "repeat_penalty");
    const cJSON *seed = nv_api_field(in, "seed");
    meta->seed = -1;
    if (seed && cJSON_IsNumber(seed) && seed->valuedouble < 0) drop(q, "seed"); /* -1: random */
    else if (seed && cJSON_IsNumber(seed)) meta->seed = (long long)seed->valuedouble;
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
        if (!nv_api_field(in, defaults[i].key)) put_number(q, defaults[i].key, defaults[i].v);
    const cJSON *lb = nv_api_field(in, "logit_bias");
    int rc;
    if (lb && cJSON_IsArray(lb) && (rc = bias_object(ctx, lb, q, err))) return rc;
    const cJSON *p = nv_api_field(in, "prompt");
    if (infill) return infill_prompt(ctx, in, q, meta, err);
    if (cJSON_IsArray(p))
        for (const cJSON *e = p->child; e; e = e->next)
            if (!cJSON_IsNumber(e)) {
                nv_api_error_set(err, E400, NULL, "prompt",
                                 "'prompt' must be a string or a list of token ids here (several prompts: /v1/completions)");
                return err->status;
            }
    if (cJSON_IsString(p) && !(meta->prompt = strdup(p->valuestring))) return nv_api_oom(err);
    return 0;
}

static double num_or(const cJSON *q, const char *key, double otherwise) {
    const cJSON *v = nv_api_field(q, key);
    return cJSON_IsNumber(v) ? v->valuedouble : otherwise;
}

int nv_lcpp_parse(const nv_api_ctx *ctx, const char *body, size_t len, int infill, nv_api_request *out, nv_lcpp_meta *meta,
                  nv_api_error *err) {
    memset(meta, 0, sizeof *meta);
    cJSON *in = nv_api_body_object(body, len, err);
    if (!in) return err->status;
    cJSON *q = cJSON_Duplicate(in, 1);
    int rc = q ? translate(ctx, in, q, infill, meta, err) : nv_api_oom(err), parsed = 0;
    if (!rc) {
        const nv_api_parse_opts o = {.max_stop = NV_MAX_STOP - 1, .max_tokens_cap = 1};
        rc = nv_api_parse_json(ctx, 0, q, &o, out, err);
        parsed = !rc;
    }
    cJSON_Delete(in);
    if (!rc) { /* the settings as the request gave them (the sampler's floats print with float's noise) */
        snprintf(meta->model, sizeof meta->model, "%s", out->model);
        meta->temperature = num_or(q, "temperature", out->req.temperature), meta->top_p = num_or(q, "top_p", out->req.top_p);
        meta->min_p = num_or(q, "min_p", out->req.min_p), meta->top_k = (long long)num_or(q, "top_k", out->req.top_k);
        for (int i = 0; i < out->req.n_stop; i++)
            if ((meta->stop[meta->n_stop] = strdup(out->req.stop[i])) != NULL) meta->n_stop++;
        if (meta->n_stop != out->req.n_stop) rc = nv_api_oom(err);
    }
    cJSON_Delete(q);
    if (rc) {
        if (parsed) nv_api_request_free(out);
        nv_lcpp_meta_free(meta);
    }
    return rc;
}

/* {"id", "token", "bytes", "logprob" | "prob"} of one token after prev. */
static cJSON *prob_record(const nv_lcpp_meta *m, const nv_tokenizer *tok, int prev, int id, float logprob, nv_buf *b) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", id);
    nv_api_token_fields(o, tok, prev, id, 0, b);
    if (m->post_probs) cJSON_AddNumberToObject(o, "prob", exp((double)logprob));
    else cJSON_AddNumberToObject(o, "logprob", logprob);
    return o;
}

/* completion_probabilities: a record a generated token, its alternatives within. */
static void add_probabilities(cJSON *root, const nv_lcpp_meta *m, const nv_token_lp *lps, int n, const nv_tokenizer *tok) {
    if (m->n_probs <= 0 || !tok) return;
    cJSON *arr = cJSON_AddArrayToObject(root, "completion_probabilities");
    nv_buf b = {0};
    for (int i = 0; i < n; i++) {
        const nv_token_lp *t = &lps[i];
        if (t->unscored) continue;
        cJSON *e = prob_record(m, tok, t->prev, t->tok, t->logprob, &b);
        cJSON *tops = cJSON_AddArrayToObject(e, m->post_probs ? "top_probs" : "top_logprobs");
        for (int j = 0; j < t->n_top; j++) cJSON_AddItemToArray(tops, prob_record(m, tok, t->prev, t->top_tok[j], t->top_lp[j], &b));
        cJSON_AddItemToArray(arr, e);
    }
    nv_buf_free(&b);
}

static void add_timings(cJSON *root, const nv_lcpp_answer *a) {
    cJSON *t = cJSON_AddObjectToObject(root, "timings");
    const int pn = a->prompt_tokens - a->cached_tokens, gn = a->completion_tokens;
    const double pms = a->prompt_s * 1e3, gms = a->gen_s * 1e3;
    cJSON_AddNumberToObject(t, "prompt_n", pn);
    cJSON_AddNumberToObject(t, "prompt_ms", pms);
    cJSON_AddNumberToObject(t, "prompt_per_token_ms", pn > 0 ? pms / pn : 0);
    cJSON_AddNumberToObject(t, "prompt_per_second", pms > 0 ? pn / a->prompt_s : 0);
    cJSON_AddNumberToObject(t, "predicted_n", gn);
    cJSON_AddNumberToObject(t, "predicted_ms", gms);
    /* the time after the first token covers the rest of them */
    cJSON_AddNumberToObject(t, "predicted_per_token_ms", gn > 1 ? gms / (gn - 1) : 0);
    cJSON_AddNumberToObject(t, "predicted_per_second", gn > 1 && a->gen_s > 0 ? (gn - 1) / a->gen_s : 0);
}

char *nv_lcpp_response(const nv_lcpp_meta *m, const nv_lcpp_answer *a) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    const char *content = a->content ? a->content : "";
    const int word = a->finish == NV_FINISH_STOP && a->stop_index >= 0 && a->stop_index < m->n_stop;
    cJSON_AddNumberToObject(root, "index", 0);
    cJSON_AddStringToObject(root, "content", content);
    cJSON_AddArrayToObject(root, "tokens");
    cJSON_AddNumberToObject(root, "id_slot", 0);
    cJSON_AddTrueToObject(root, "stop");
    cJSON_AddStringToObject(root, "model", m->model);
    cJSON_AddNumberToObject(root, "tokens_predicted", a->completion_tokens);
    cJSON_AddNumberToObject(root, "tokens_evaluated", a->prompt_tokens);
    cJSON *gs = cJSON_AddObjectToObject(root, "generation_settings");
    cJSON_AddNumberToObject(gs, "n_predict", m->n_predict);
    cJSON_AddNumberToObject(gs, "temperature", m->temperature);
    cJSON_AddNumberToObject(gs, "top_k", (double)m->top_k);
    cJSON_AddNumberToObject(gs, "top_p", m->top_p);
    cJSON_AddNumberToObject(gs, "min_p", m->min_p);
    cJSON_AddNumberToObject(gs, "seed", (double)m->seed);
    cJSON *stop = cJSON_AddArrayToObject(gs, "stop");
    for (int i = 0; i < m->n_stop; i++) cJSON_AddItemToArray(stop, cJSON_CreateString(m->stop[i]));
    cJSON_AddStringToObject(root, "prompt", m->prompt ? m->prompt : "");
    cJSON_AddBoolToObject(root, "has_new_line", strchr(content, '\n') != NULL);
    cJSON_AddBoolToObject(root, "truncated", m->truncated);
    cJSON_AddStringToObject(root, "stop_type", word ? "word" : a->finish == NV_FINISH_STOP ? "eos" : "limit");
    cJSON_AddStringToObject(root, "stopping_word", word ? m->stop[a->stop_index] : "");
    cJSON_AddNumberToObject(root, "tokens_cached", a->cached_tokens);
    add_probabilities(root, m, a->lps, a->n_lps, a->tok);
    add_timings(root, a);
    return nv_api_print_free(root);
}

char *nv_lcpp_chunk(const nv_lcpp_meta *m, const char *content, int predicted, int evaluated, const nv_token_lp *lps, int n_lps,
                    const nv_tokenizer *tok) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON_AddNumberToObject(root, "index", 0);
    cJSON_AddStringToObject(root, "content", content);
    cJSON_AddArrayToObject(root, "tokens");
    cJSON_AddFalseToObject(root, "stop");
    cJSON_AddNumberToObject(root, "id_slot", 0);
    cJSON_AddNumberToObject(root, "tokens_predicted", predicted);
    cJSON_AddNumberToObject(root, "tokens_evaluated", evaluated);
    add_probabilities(root, m, lps, n_lps, tok);
    return nv_api_print_free(root);
}

char *nv_lcpp_props(const nv_api_ctx *ctx, int slots) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON *gs = cJSON_AddObjectToObject(root, "default_generation_settings");
    cJSON_AddNumberToObject(gs, "n_ctx", ctx->seq_len);
    cJSON *params = cJSON_AddObjectToObject(gs, "params");
    cJSON_AddNumberToObject(params, "n_predict", -1);
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++) cJSON_AddNumberToObject(params, defaults[i].key, defaults[i].v);
    cJSON_AddNumberToObject(root, "total_slots", slots);
    cJSON_AddStringToObject(root, "model_alias", ctx->model_id);
    cJSON_AddStringToObject(root, "chat_template", ctx->jinja ? "jinja" : nv_chat_template_name(ctx->tmpl));
    cJSON *mod = cJSON_AddObjectToObject(root, "modalities");
    cJSON_AddFalseToObject(mod, "vision");
    cJSON_AddFalseToObject(mod, "audio");
    cJSON_AddStringToObject(root, "build_info", "nerve");
    return nv_api_print_free(root);
}

int nv_lcpp_embed_parse(const nv_api_ctx *ctx, const char *body, size_t len, nv_api_embed *out, int *normalize, nv_api_error *err) {
    memset(out, 0, sizeof *out);
    memset(err, 0, sizeof *err);
    *normalize = 2;
    cJSON *in = nv_api_body_object(body, len, err);
    if (!in) return err->status;
    int rc = 0;
    const cJSON *input = nv_api_field(in, "input"), *content = nv_api_field(in, "content"), *norm = nv_api_field(in, "embd_normalize");
    if (!input && !content) {
        nv_api_error_set(err, E400, "missing_required_parameter", "content", "\"input\" or \"content\" must be provided");
        rc = err->status;
    } else if (norm && (!cJSON_IsNumber(norm) || norm->valuedouble != floor(norm->valuedouble) || norm->valuedouble < -1 ||
                        norm->valuedouble > 1000)) {
        nv_api_error_set(err, E400, NULL, "embd_normalize", "'embd_normalize' must be an integer from -1 to 1000");
        rc = err->status;
    } else if (norm && norm->valuedouble == -1) {
        nv_api_error_set(err, E400, "unsupported_value", "embd_normalize",
                         "'embd_normalize' -1 (no normalisation) is not supported: this server's embeddings are normalised when pooled");
        rc = err->status;
    }
    if (norm && !rc) *normalize = (int)norm->valuedouble;
    cJSON *q = rc ? NULL : cJSON_CreateObject();
    if (!rc && !q) rc = nv_api_oom(err);
    if (!rc) {
        cJSON *copy = cJSON_Duplicate(input ? input : content, 1); /* input first, as llama-server reads them */
        if (!copy) rc = nv_api_oom(err);
        else cJSON_AddItemToObject(q, "input", copy);
    }
    if (!rc) rc = nv_api_copy_field(in, q, "model", NULL, 'j', err);
    if (!rc) rc = nv_api_copy_field(in, q, "lora", NULL, 'j', err);
    cJSON_Delete(in);
    if (!rc) rc = nv_api_embed_parse_json(ctx, q, out, err);
    cJSON_Delete(q);
    return rc;
}

char *nv_lcpp_embed_response(const float *vecs, int n, int dim, int normalize) {
    cJSON *list = cJSON_CreateArray();
    for (int i = 0; list && i < n; i++) {
        const float *v = vecs + (size_t)i * dim;
        double top = 0, sum = 0; /* the largest magnitude, and the others' powers against it (no underflow at a large N) */
        for (int k = 0; k < dim; k++) top = fmax(top, fabs((double)v[k]));
        for (int k = 0; normalize != 0 && top > 0 && k < dim; k++) sum += pow(fabs((double)v[k]) / top, normalize);
        /* the 2-norm's is 1 already (the pooling's) */
        const double scale = top <= 0 || normalize == 2 ? 1.0 : normalize == 0 ? 32760.0 / top : 1.0 / (top * pow(sum, 1.0 / normalize));
        cJSON *e = cJSON_CreateObject(), *outer = cJSON_CreateArray(), *vec = cJSON_CreateArray();
        for (int k = 0; vec && k < dim; k++) cJSON_AddItemToArray(vec, cJSON_CreateNumber(v[k] * scale));
        cJSON_AddItemToArray(outer, vec);
        cJSON_AddNumberToObject(e, "index", i);
        cJSON_AddItemToObject(e, "embedding", outer);
        cJSON_AddItemToArray(list, e);
    }
    return nv_api_print_free(list);
}

char *nv_lcpp_slots(const nv_api_ctx *ctx, const nv_slot *run, int n, int max_batch, int speculative) {
    cJSON *list = cJSON_CreateArray();
    for (int i = 0; list && i < max_batch; i++) { /* (n is at most max_batch: nv_sched_slots' cap) */
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id", i);
        cJSON_AddNumberToObject(o, "n_ctx", ctx->seq_len);
        cJSON_AddBoolToObject(o, "speculative", speculative);
        cJSON_AddBoolToObject(o, "is_processing", i < n);
        if (i >= n) {
            cJSON_AddNumberToObject(o, "id_task", -1);
        } else {
            const nv_slot *r = &run[i];
            /* once the first token is out the prompt has run whole (its uncached part processed); before, 0 */
            const int processed = r->generating ? r->n_prompt - r->n_cached : 0;
            cJSON_AddNumberToObject(o, "id_task", (double)r->task);
            cJSON_AddNumberToObject(o, "n_past", r->generating ? r->n_prompt + r->n_decoded : r->n_cached);
            cJSON_AddNumberToObject(o, "n_prompt_tokens", r->n_prompt);
            cJSON_AddNumberToObject(o, "n_prompt_tokens_processed", processed);
            cJSON_AddNumberToObject(o, "n_prompt_tokens_cache", r->n_cached);
            cJSON *params = cJSON_AddObjectToObject(o, "params");
            cJSON_AddNumberToObject(params, "n_predict", r->max_tokens);
            cJSON_AddNumberToObject(params, "temperature", r->temperature);
            cJSON_AddNumberToObject(params, "top_k", r->top_k);
            cJSON_AddNumberToObject(params, "top_p", r->top_p);
            cJSON_AddNumberToObject(params, "min_p", r->min_p);
            char seed[24]; /* all 64 bits (a double would round them) */
            snprintf(seed, sizeof seed, "%llu", (unsigned long long)r->seed);
            cJSON_AddRawToObject(params, "seed", seed);
            cJSON *next = cJSON_AddArrayToObject(o, "next_token"), *t = cJSON_CreateObject();
            cJSON_AddBoolToObject(t, "has_next_token", 1);
            cJSON_AddBoolToObject(t, "has_new_line", 0);
            cJSON_AddNumberToObject(t, "n_remain", r->max_tokens - r->n_decoded);
            cJSON_AddNumberToObject(t, "n_decoded", r->n_decoded);
            cJSON_AddItemToArray(next, t);
        }
        cJSON_AddItemToArray(list, o);
    }
    return nv_api_print_free(list);
}
