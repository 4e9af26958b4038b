#include "serve/rerank.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "base/buf.h"
#include "serve/sched.h"
#include "serve/tools.h"

#define E400 400, "invalid_request_error"

/* Qwen3-Reranker's instruction and system prompt (its model card's), which the chat prompt keeps. */
static const char default_instruction[] = "Given a web search query, retrieve relevant passages that answer the query";
static const char judge_system[] = "Judge whether the Document meets the requirements based on the Query and the Instruct "
                                   "provided. Note that the answer can only be \"yes\" or \"no\".";
static const char judge_user[] = "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}";

/* The one token whose text is s (encoded as a prompt's continuation is: no BOS), or -1. */
static int single_token(const nv_tokenizer *tok, const char *s, size_t n) {
    char text[64];
    if (n == 0 || n >= sizeof text) return -1;
    memcpy(text, s, n);
    text[n] = 0;
    int *ids = NULL, m = 0, id = -1;
    if (nv_tokenizer_encode(tok, text, 0, 0, &ids, &m) == NV_OK && m == 1) id = ids[0];
    free(ids);
    return id;
}

nv_err nv_rerank_init(nv_rerank *rk, const nv_tokenizer *tok, int head_rows, const char *tokens, const char *tmpl,
                      const char *instruction) {
    memset(rk, 0, sizeof *rk);
    if (head_rows && tokens) return nv_fail(NV_EINVAL, "--rerank-tokens: this model scores with its classification head (cls.output)");
    if (head_rows > NV_MAX_SCORE) {
        snprintf(rk->off, sizeof rk->off, "This model's classification head has %d outputs: a reranker's has 1 or 2", head_rows);
        return NV_OK;
    }
    const char *list = tokens ? tokens : "yes,no";
    const char *comma = strchr(list, ',');
    const size_t n1 = comma ? (size_t)(comma - list) : strlen(list);
    if (comma && strchr(comma + 1, ','))
        return nv_fail(NV_EINVAL, "--rerank-tokens takes one or two tokens (YES[,NO]), not '%s'", list);
    /* a head's outputs stand where the tokens would (their ids unused) */
    const int yes = head_rows ? 0 : single_token(tok, list, n1),
              no = head_rows ? (head_rows == 2 ? 0 : -2) : comma ? single_token(tok, comma + 1, strlen(comma + 1)) : -2;
    if (yes < 0 || no == -1) {
        const char *bad = yes < 0 ? list : comma + 1;
        const int bad_n = (int)(yes < 0 ? n1 : strlen(comma + 1));
        if (tokens) return nv_fail(NV_EINVAL, "--rerank-tokens: '%.*s' is not one token of this vocabulary", bad_n, bad);
        snprintf(rk->off, sizeof rk->off,
                 "This model's vocabulary has no single token '%.*s' to score with: start the server with "
                 "--rerank-tokens YES,NO (two tokens of its vocabulary) to rerank with it",
                 bad_n, bad);
        return NV_OK;
    }
    if (tmpl && (!strstr(tmpl, "{query}") || !strstr(tmpl, "{document}")))
        return nv_fail(NV_EINVAL, "the rerank template must hold {query} and {document}");
    if ((tmpl && !(rk->tmpl = strdup(tmpl))) || !(rk->instruction = strdup(instruction ? instruction : default_instruction))) {
        nv_rerank_free(rk);
        return nv_fail(NV_ENOMEM, "rerank: out of memory");
    }
    rk->tok[0] = yes;
    rk->n_tok = 1;
    if (no >= 0) rk->tok[rk->n_tok++] = no;
    return NV_OK;
}

void nv_rerank_free(nv_rerank *rk) {
    free(rk->tmpl);
    free(rk->instruction);
    memset(rk, 0, sizeof *rk);
}

float nv_rerank_relevance(const nv_rerank *rk, const float *logits, int raw) {
    const double x = rk->n_tok == 2 ? (double)logits[0] - logits[1] : logits[0];
    return (float)(raw ? x : 1.0 / (1.0 + exp(-x)));
}

/* tmpl with {query}, {document} and {instruction} replaced in one pass (what they are replaced
 * with is not looked into again). */
static void fill(nv_buf *b, const char *tmpl, const char *query, const char *doc, const char *instruction) {
    static const char *const names[] = {"{query}", "{document}", "{instruction}"};
    const char *with[] = {query, doc, instruction};
    for (const char *p = tmpl; *p;) {
        int k = 0;
        while (k < 3 && strncmp(p, names[k], strlen(names[k]))) k++;
        if (k < 3) {
            nv_buf_puts(b, with[k]);
            p += strlen(names[k]);
        } else {
            const char *next = strchr(p + 1, '{');
            const size_t n = next ? (size_t)(next - p) : strlen(p);
            nv_buf_append(b, p, n);
            p += n;
        }
    }
}

/* The prompt of one pair (0), or the error's status. */
static int pair_prompt(const nv_api_ctx *ctx, const nv_rerank *rk, const char *query, const char *doc, int **ids, int *n,
                       nv_api_error *err) {
    nv_buf text = {0};
    fill(&text, rk->tmpl ? rk->tmpl : judge_user, query, doc, rk->instruction);
    nv_err e = text.oom ? nv_fail(NV_ENOMEM, "out of memory") : NV_OK;
    if (e == NV_OK && rk->tmpl) e = nv_tokenizer_encode(ctx->tok, text.data, 1, 0, ids, n);
    else if (e == NV_OK) {
        const nv_chat_msg msgs[2] = {{.role = "system", .content = judge_system}, {.role = "user", .content = text.data}};
        const nv_chat_opts o = {.no_think = 1, .jinja = ctx->jinja};
        e = nv_chat_render_opts(ctx->tmpl, ctx->tok, msgs, 2, &o, ids, n);
        if (e == NV_EINVAL) { /* a template that takes no system message (Gemma 2's raises): the instructions open the user's */
            nv_buf both = {0};
            nv_buf_printf(&both, "%s\n\n%s", judge_system, text.data);
            const nv_chat_msg one = {.role = "user", .content = both.data ? both.data : ""};
            e = both.oom ? nv_fail(NV_ENOMEM, "out of memory") : nv_chat_render_opts(ctx->tmpl, ctx->tok, &one, 1, &o, ids, n);
            nv_buf_free(&both);
        }
    }
    nv_buf_free(&text);
    if (e == NV_OK) return 0;
    if (e == NV_ENOMEM) return nv_api_oom(err);
    nv_api_error_set(err, E400, NULL, NULL, "the model's chat template cannot render the rerank prompt: %s", nv_errmsg());
    return err->status;
}

/* The number of tokens of doc (encoded as it is in a prompt, without BOS). */
static int doc_tokens(const nv_tokenizer *tok, const char *doc) {
    int *ids = NULL, n = 0;
    if (nv_tokenizer_encode(tok, doc, 0, 0, &ids, &n) != NV_OK) n = 0;
    free(ids);
    return n;
}

/* doc cut to its first max_tokens tokens (< 0: as it is), without a character cut in two, malloc'd;
 * NULL when out of memory. */
static char *doc_cut(const nv_tokenizer *tok, const char *doc, int max_tokens) {
    int *ids = NULL, n = 0;
    if (max_tokens < 0 || nv_tokenizer_encode(tok, doc, 0, 0, &ids, &n) != NV_OK || n <= max_tokens) {
        free(ids);
        return strdup(doc);
    }
    nv_buf b = {0};
    for (int i = 0; i < max_tokens; i++) nv_buf_puts(&b, nv_tokenizer_decode(tok, i ? ids[i - 1] : nv_tokenizer_bos(tok), ids[i]));
    free(ids);
    if (b.oom) {
        nv_buf_free(&b);
        return NULL;
    }
    if (!b.data) return strdup("");
    b.len -= nv_utf8_incomplete_tail(b.data, b.len); /* a byte-level token may end inside a character */
    b.data[b.len] = 0;
    return nv_buf_take(&b);
}

/* A whole number >= lo in v, clamped to hi: 1 and *out; 0 when v is not one. */
static int count_field(const cJSON *v, double lo, int hi, int *out) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo) || v->valuedouble != floor(v->valuedouble)) return 0;
    *out = v->valuedouble >= hi ? hi : (int)v->valuedouble;
    return 1;
}

void nv_rerank_req_free(nv_rerank_req *r) {
    for (int i = 0; i < r->n; i++) {
        if (r->ids) free(r->ids[i]);
        if (r->docs) free(r->docs[i]);
    }
    free(r->ids);
    free(r->n_ids);
    free(r->docs);
    memset(r, 0, sizeof *r);
}

/* A string, or a list of 1 to NV_RERANK_MAX_DOCS items each a string or (objects allowed) {"text":
 * string}: the count (a string: 1, *single set), or -1 with err set. */
static int text_list(const cJSON *v, const char *key, int objects, int *single, nv_api_error *err) {
    *single = cJSON_IsString(v);
    if (*single) return 1;
    const int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (n < 1 || n > NV_RERANK_MAX_DOCS) {
        nv_api_error_set(err, E400, n < 0 && !v ? "missing_required_parameter" : NULL, key,
                         "'%s' must be %s list of 1 to %d %s", key, objects ? "a" : "a string or a", NV_RERANK_MAX_DOCS,
                         objects ? "documents (strings or {\"text\": string} objects)" : "strings");
        return -1;
    }
    int i = 0;
    for (const cJSON *d = v->child; d; d = d->next, i++) {
        const cJSON *t = objects && cJSON_IsObject(d) ? nv_api_field(d, "text") : d;
        if (!cJSON_IsString(t)) {
            nv_api_error_set(err, E400, NULL, key, "'%s[%d]' must be a string%s", key, i, objects ? " or an object with a string 'text'" : "");
            return -1;
        }
    }
    return n;
}

static const char *text_at(const cJSON *v, int single, int i) {
    if (single) return v->valuestring;
    const cJSON *d = cJSON_GetArrayItem(v, i);
    return cJSON_IsObject(d) ? nv_api_field(d, "text")->valuestring : d->valuestring;
}

int nv_rerank_parse(const nv_api_ctx *ctx, const nv_rerank *rk, nv_rerank_api api, const char *body, size_t len,
                    nv_rerank_req *out, nv_api_error *err) {
    memset(out, 0, sizeof *out);
    memset(err, 0, sizeof *err);
    out->api = api;
    if (!rk || !rk->n_tok) {
        nv_api_error_set(err, E400, "model_not_supported", NULL, "%s",
                         rk ? rk->off : "This server does not rerank");
        return err->status;
    }
    cJSON *root = nv_api_body_object(body, len, err);
    if (!root) return err->status;
    int rc = nv_api_check_model(ctx, root, &out->lora, out->model, err);
    const int score = api == NV_RERANK_SCORE;
    if (api == NV_RERANK_JINA && !nv_api_field(root, "documents") && nv_api_field(root, "texts")) out->api = api = NV_RERANK_TEI;
    const int tei = api == NV_RERANK_TEI;
    const char *qkey = score ? "text_1" : "query", *dkey = score ? "text_2" : tei ? "texts" : "documents";
    const cJSON *q = nv_api_field(root, qkey), *docs = nv_api_field(root, dkey);
    const cJSON *top_n = score ? NULL : nv_api_field(root, "top_n");
    const cJSON *cut = api == NV_RERANK_COHERE ? nv_api_field(root, "max_tokens_per_doc") : NULL;
    int nq = 0, nd = 0, q_single = 0, d_single = 0;
    if (!rc && score) {
        if ((nq = text_list(q, qkey, 0, &q_single, err)) < 0 || (nd = text_list(docs, dkey, 0, &d_single, err)) < 0) rc = err->status;
        else if (nq > 1 && nq != nd)
            nv_api_error_set(err, E400, NULL, qkey, "'text_1' and 'text_2' must be one against many or as many as each other, not %d and %d",
                             nq, nd),
                rc = err->status;
    } else if (!rc) {
        if (!cJSON_IsString(q) || !*q->valuestring)
            nv_api_error_set(err, E400, q ? NULL : "missing_required_parameter", qkey, "'query' must be a non-empty string"), rc = err->status;
        else if ((nd = text_list(docs, dkey, !tei, &d_single, err)) < 0) rc = err->status;
        else if (d_single) nv_api_error_set(err, E400, NULL, dkey, "'%s' must be a list", dkey), rc = err->status;
        q_single = 1;
    }
    int n_top = nd, per_doc = api == NV_RERANK_COHERE ? 4096 : -1; /* (Cohere's default) */
    if (!rc && top_n && !count_field(top_n, 0, nd, &n_top))
        nv_api_error_set(err, E400, NULL, "top_n", "'top_n' must be an integer >= 0"), rc = err->status;
    int ret_docs = api == NV_RERANK_JINA, raw = 0;
    if (!rc && !score) rc = nv_api_get_bool(root, tei ? "return_text" : "return_documents", &ret_docs, err);
    if (!rc && tei) rc = nv_api_get_bool(root, "raw_scores", &raw, err);
    if (!rc && cut && !count_field(cut, 1, 1 << 30, &per_doc))
        nv_api_error_set(err, E400, NULL, "max_tokens_per_doc", "'max_tokens_per_doc' must be an integer >= 1"), rc = err->status;
    if (!rc) {
        out->n = nd;
        out->top_n = n_top >= 1 ? n_top : nd;
        out->one_query = q_single || nq == 1;
        out->return_documents = ret_docs;
        out->raw = raw;
        if (!(out->ids = calloc((size_t)nd, sizeof *out->ids)) || !(out->n_ids = calloc((size_t)nd, sizeof *out->n_ids)) ||
            !(out->docs = calloc((size_t)nd, sizeof *out->docs)))
            rc = nv_api_oom(err);
    }
    const long limit = ctx->seq_len < ctx->capacity ? ctx->seq_len : ctx->capacity;
    long total = 0;
    for (int i = 0; !rc && i < nd; i++) {
        const char *query = text_at(q, q_single, out->one_query ? 0 : i), *given = text_at(docs, d_single, i);
        char *doc = doc_cut(ctx->tok, given, per_doc);
        if (!doc || !(out->docs[i] = strdup(given))) {
            free(doc);
            rc = nv_api_oom(err);
            break;
        }
        /* a prompt past the context: the document cut to fit (its last tokens dropped), as Jina and
           Cohere cut long documents; the query's prompt alone past it is the request's 400 */
        for (int tries = 0; !rc; tries++) {
            free(out->ids[i]), out->ids[i] = NULL;
            if ((rc = pair_prompt(ctx, rk, query, doc, &out->ids[i], &out->n_ids[i], err))) break;
            if (out->n_ids[i] <= limit) break;
            const int have = doc_tokens(ctx->tok, doc), keep = have - (int)(out->n_ids[i] - limit) - 4 * tries;
            if (!*doc || tries == 8) {
                char which[32] = "";
                if (!out->one_query) snprintf(which, sizeof which, "[%d]", i);
                nv_api_error_set(err, E400, "context_length_exceeded", qkey,
                                 "This model's maximum context length is %d tokens (%ld fit the KV pool), but the prompt of "
                                 "'%s%s' with %s alone has %d",
                                 ctx->seq_len, ctx->capacity, qkey, which, *doc ? "a part of its document" : "an empty document",
                                 out->n_ids[i]);
                rc = err->status;
                break;
            }
            char *shorter = doc_cut(ctx->tok, doc, keep > 0 ? keep : 0);
            free(doc);
            if (!(doc = shorter)) rc = nv_api_oom(err);
        }
        free(doc);
        total += out->n_ids[i];
        if (!rc && total > NV_RERANK_MAX_TOKENS) {
            nv_api_error_set(err, E400, "context_length_exceeded", dkey, "The prompts of this request's pairs come to more than %d tokens", NV_RERANK_MAX_TOKENS);
            rc = err->status;
        }
    }
    cJSON_Delete(root);
    if (rc) nv_rerank_req_free(out);
    return rc;
}

typedef struct {
    int index;
    float relevance;
} ranked;

static int by_relevance(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->relevance != y->relevance) return x->relevance < y->relevance ? 1 : -1;
    return x->index - y->index;
}

char *nv_rerank_response(const nv_rerank_req *r, const float *relevance, int prompt_tokens) {
    nv_buf b = {0};
    char id[64];
    if (r->api == NV_RERANK_SCORE) {
        nv_api_new_id(id, sizeof id, "score-");
        nv_buf_printf(&b, "{\"id\":\"%s\",\"object\":\"list\",\"created\":%ld,\"model\":", id, (long)time(NULL));
        nv_json_string(&b, r->model);
        nv_buf_puts(&b, ",\"data\":[");
        for (int i = 0; i < r->n; i++)
            nv_buf_printf(&b, "%s{\"index\":%d,\"object\":\"score\",\"score\":%.9g}", i ? "," : "", i, (double)relevance[i]);
        nv_buf_printf(&b, "],\"usage\":{\"prompt_tokens\":%d,\"total_tokens\":%d,\"completion_tokens\":0}}", prompt_tokens,
                      prompt_tokens);
    } else {
        ranked *order = malloc((size_t)r->n * sizeof *order);
        if (!order) return NULL;
        for (int i = 0; i < r->n; i++) order[i] = (ranked){i, relevance[i]};
        qsort(order, (size_t)r->n, sizeof *order, by_relevance);
        if (r->api == NV_RERANK_TEI) { /* text-embeddings-inference's: the list alone */
            nv_buf_puts(&b, "[");
            for (int k = 0; k < r->top_n; k++) {
                nv_buf_printf(&b, "%s{\"index\":%d,\"score\":%.9g", k ? "," : "", order[k].index, (double)order[k].relevance);
                if (r->return_documents) nv_buf_puts(&b, ",\"text\":"), nv_json_string(&b, r->docs[order[k].index]);
                nv_buf_puts(&b, "}");
            }
            nv_buf_puts(&b, "]");
            free(order);
            goto done;
        }
        nv_api_new_id(id, sizeof id, "rerank-");
        nv_buf_printf(&b, "{\"id\":\"%s\",\"model\":", id);
        nv_json_string(&b, r->model);
        nv_buf_puts(&b, ",\"results\":[");
        for (int k = 0; k < r->top_n; k++) {
            nv_buf_printf(&b, "%s{\"index\":%d,\"relevance_score\":%.9g", k ? "," : "", order[k].index, (double)order[k].relevance);
            if (r->return_documents) {
                nv_buf_puts(&b, ",\"document\":{\"text\":");
                nv_json_string(&b, r->docs[order[k].index]);
                nv_buf_puts(&b, "}");
            }
            nv_buf_puts(&b, "}");
        }
        free(order);
        nv_buf_printf(&b, "],\"usage\":{\"prompt_tokens\":%d,\"total_tokens\":%d}", prompt_tokens, prompt_tokens);
        if (r->api == NV_RERANK_COHERE)
            nv_buf_printf(&b, ",\"meta\":{\"api_version\":{\"version\":\"2\"},\"billed_units\":{\"search_units\":1},"
                              "\"tokens\":{\"input_tokens\":%d,\"output_tokens\":0}}",
                          prompt_tokens);
        nv_buf_puts(&b, "}");
    }
done:
    if (b.oom) {
        nv_buf_free(&b);
        return NULL;
    }
    return nv_buf_take(&b);
}
