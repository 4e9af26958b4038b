/* Reranking (src/serve/rerank.c, the scheduler's scoring requests, /v1/rerank, /v2/rerank,
 * /v1/score): the tokens a vocabulary scores with, the prompts a pair makes, the requests'
 * checks, the responses' shapes and order, and the server's relevance against the probabilities
 * the model gives the same prompt's next token through /v1/completions. */
#include <cjson/cJSON.h>
#include <math.h>

#include "model/gguf.h"
#include "serve/rerank.h"
#include "t.h"
#include "serve_util.h"
#include "tok_util.h"
#include "gguf_write.h"

static int one_token(const nv_tokenizer *tok, const char *s) {
    int *ids = NULL, n = 0, id = -1;
    if (nv_tokenizer_encode(tok, s, 0, 0, &ids, &n) == NV_OK && n == 1) id = ids[0];
    free(ids);
    return id;
}

static void test_rerank_init(void) {
    nv_tokenizer *tok = tok512();
    if (!tok) return;
    nv_rerank rk;
    /* tok512 has no "yes": reranking off, saying how to turn it on; a given list must hold */
    T_CHECK(nv_rerank_init(&rk, tok, 0, NULL, NULL, NULL) == NV_OK && rk.n_tok == 0 && strstr(rk.off, "--rerank-tokens YES,NO"), "%s", rk.off);
    nv_rerank_free(&rk);
    T_CHECK(nv_rerank_init(&rk, tok, 0, "the,a", NULL, NULL) == NV_OK && rk.n_tok == 2 && rk.tok[0] == one_token(tok, "the") &&
                rk.tok[1] == one_token(tok, "a") && rk.tok[0] >= 0 && !strcmp(rk.instruction, "Given a web search query, retrieve relevant passages that answer the query"),
            "two tokens");
    const float l2[2] = {2.0f, 0.5f}, l1[1] = {0.0f};
    T_CHECK(fabsf(nv_rerank_relevance(&rk, l2, 0) - (float)(1.0 / (1.0 + exp(-1.5)))) < 1e-6f && nv_rerank_relevance(&rk, l2, 1) == 1.5f,
            "sigmoid of the difference; raw, the difference");
    nv_rerank_free(&rk);
    T_CHECK(nv_rerank_init(&rk, tok, 0, "the", "{query}|{document}", "mine") == NV_OK && rk.n_tok == 1 && !strcmp(rk.instruction, "mine") &&
                !strcmp(rk.tmpl, "{query}|{document}") && nv_rerank_relevance(&rk, l1, 0) == 0.5f,
            "one token");
    nv_rerank_free(&rk);
    T_CHECK(nv_rerank_init(&rk, tok, 0, "the,a,b", NULL, NULL) == NV_EINVAL && strstr(nv_errmsg(), "one or two tokens"), "%s", nv_errmsg());
    T_CHECK(nv_rerank_init(&rk, tok, 0, "the,once upon", NULL, NULL) == NV_EINVAL && strstr(nv_errmsg(), "'once upon' is not one token"),
            "%s", nv_errmsg());
    T_CHECK(nv_rerank_init(&rk, tok, 0, ",a", NULL, NULL) == NV_EINVAL, "an empty token");
    T_CHECK(nv_rerank_init(&rk, tok, 0, "the", "{query} only", NULL) == NV_EINVAL && strstr(nv_errmsg(), "{document}"), "%s", nv_errmsg());
    nv_tokenizer_free(tok);
}

/* 1 when ids (n) are text's encoding as a prompt's (BOS first) */
static int encodes(const nv_tokenizer *tok, const int *ids, int n, const char *text) {
    int *want = NULL, m = 0;
    const int ok = nv_tokenizer_encode(tok, text, 1, 0, &want, &m) == NV_OK && m == n && !memcmp(want, ids, (size_t)n * sizeof *ids);
    free(want);
    return ok;
}

/* parse's status; with want_param, err's param must be it, and its message must hold want_msg */
static int parse_fails(const nv_api_ctx *ctx, const nv_rerank *rk, nv_rerank_api api, const char *body, int status, const char *param,
                       const char *msg) {
    nv_rerank_req r;
    nv_api_error e;
    const int rc = nv_rerank_parse(ctx, rk, api, body, strlen(body), &r, &e);
    const int ok = rc == status && (!param || !strcmp(e.param, param)) && (!msg || strstr(e.message, msg));
    if (!ok) fprintf(stderr, "    %s -> %d '%s' %s\n", body, rc, e.param, e.message);
    if (!rc) nv_rerank_req_free(&r);
    return ok;
}

static void test_rerank_parse(void) {
    nv_tokenizer *tok = tok512();
    if (!tok) return;
    nv_rerank rk;
    T_CHECK(nv_rerank_init(&rk, tok, 0, "the,a", "Q: {query}\nD: {document}\nI: {instruction}", "inst") == NV_OK, "%s", nv_errmsg());
    nv_api_ctx ctx = {.model_id = "m", .tok = tok, .tmpl = NV_CHAT_PLAIN, .seq_len = 512, .vocab_size = 512, .capacity = 400, .reasoning = 0, .dim = 64};
    nv_rerank_req r;
    nv_api_error e;
    /* the template filled in one pass: a document's "{query}" stays as it is */
    const char *body = "{\"query\": \"cat\", \"documents\": [\"the {query} dog\", {\"text\": \"b\"}]}";
    T_CHECK(nv_rerank_parse(&ctx, &rk, NV_RERANK_JINA, body, strlen(body), &r, &e) == 0, "%s", e.message);
    T_CHECK(r.n == 2 && r.top_n == 2 && r.return_documents == 1 && !strcmp(r.docs[1], "b") && !strcmp(r.model, "m") &&
                encodes(tok, r.ids[0], r.n_ids[0], "Q: cat\nD: the {query} dog\nI: inst") && encodes(tok, r.ids[1], r.n_ids[1], "Q: cat\nD: b\nI: inst"),
            "the prompts");
    nv_rerank_req_free(&r);
    /* Cohere's max_tokens_per_doc: the document's first tokens are scored (it is returned whole) */
    int *ids = NULL, n = 0, n_doc = 0;
    T_CHECK(nv_tokenizer_encode(tok, "once upon a time there was", 0, 0, &ids, &n_doc) == NV_OK && n_doc > 4, "the document's tokens");
    free(ids);
    body = "{\"query\": \"cat\", \"documents\": [\"once upon a time there was\"], \"top_n\": 5}";
    T_CHECK(nv_rerank_parse(&ctx, &rk, NV_RERANK_COHERE, body, strlen(body), &r, &e) == 0, "%s", e.message);
    n = r.n ? r.n_ids[0] : 0;
    nv_rerank_req_free(&r);
    body = "{\"query\": \"cat\", \"documents\": [\"once upon a time there was\"], \"max_tokens_per_doc\": 2, \"top_n\": 5}";
    T_CHECK(nv_rerank_parse(&ctx, &rk, NV_RERANK_COHERE, body, strlen(body), &r, &e) == 0, "%s", e.message);
    T_CHECK(r.n == 1 && r.top_n == 1 && r.return_documents == 0 && !strcmp(r.docs[0], "once upon a time there was") &&
                abs(r.n_ids[0] - (n - (n_doc - 2))) <= 1,
            "max_tokens_per_doc: %d prompt tokens, %d whole (the document %d)", r.n ? r.n_ids[0] : -1, n, n_doc);
    nv_rerank_req_free(&r);
    /* /score: one against many, or pair by pair */
    body = "{\"text_1\": [\"q1\", \"q2\"], \"text_2\": [\"d1\", \"d2\"]}";
    T_CHECK(nv_rerank_parse(&ctx, &rk, NV_RERANK_SCORE, body, strlen(body), &r, &e) == 0 && r.n == 2 &&
                encodes(tok, r.ids[1], r.n_ids[1], "Q: q2\nD: d2\nI: inst"),
            "pairs");
    nv_rerank_req_free(&r);
    body = "{\"text_1\": \"q\", \"text_2\": [\"d1\", \"d2\", \"d3\"]}";
    T_CHECK(nv_rerank_parse(&ctx, &rk, NV_RERANK_SCORE, body, strlen(body), &r, &e) == 0 && r.n == 3 && r.one_query &&
                encodes(tok, r.ids[2], r.n_ids[2], "Q: q\nD: d3\nI: inst"),
            "one against many");
    nv_rerank_req_free(&r);
    body = "{\"text_1\": [\"q\"], \"text_2\": [\"d1\", \"d2\"]}"; /* a list of one: one against many too (vLLM's) */
    T_CHECK(nv_rerank_parse(&ctx, &rk, NV_RERANK_SCORE, body, strlen(body), &r, &e) == 0 && r.n == 2 && r.one_query &&
                encodes(tok, r.ids[1], r.n_ids[1], "Q: q\nD: d2\nI: inst"),
            "a list of one against many");
    nv_rerank_req_free(&r);
    body = "{\"query\": \"q\", \"documents\": [\"a\", \"b\"], \"top_n\": 1e10, \"max_tokens_per_doc\": 1e12}";
    T_CHECK(nv_rerank_parse(&ctx, &rk, NV_RERANK_COHERE, body, strlen(body), &r, &e) == 0 && r.top_n == 2, "huge counts: %s", e.message);
    nv_rerank_req_free(&r);
    /* what is refused */
    T_CHECK(parse_fails(&ctx, &rk, NV_RERANK_JINA, "{\"documents\": [\"a\"]}", 400, "query", "'query' must be a non-empty string"), "no query");
    T_CHECK(parse_fails(&ctx, &rk, NV_RERANK_JINA, "{\"query\": \"\", \"documents\": [\"a\"]}", 400, "query", NULL), "an empty query");
    T_CHECK(parse_fails(&ctx, &rk, NV_RERANK_JINA, "{\"query\": \"q\"}", 400, "documents", "list of 1 to 1000"), "no documents");
    T_CHECK(parse_fails(&ctx, &rk, NV_RERANK_JINA, "{\"query\": \"q\", \"documents\": []}", 400, "documents", NULL), "none");
    T_CHECK(parse_fails(&ctx, &rk, NV_RERANK_JINA, "{\"query\": \"q\", \"documents\": \"a\"}", 400, "documents", "must be a list"), "a string");
    T_CHECK(parse_fails(&ctx, &rk, NV_RERANK_JINA, "{\"query\": \"q\", \"documents\": [\"a\", 7]}", 400, "documents", "'documents[1]'"), "a number");
    T_CHECK(parse_fails(&ctx, &rk, NV_RERANK_JINA, "{\"query\": \"q\", \"documents\": [{\"txt\": \"a\"}]}", 400, "documents", "'documents[0]'"),
            "an object without text");
    T_CHECK(parse_fails(&ctx, &rk, NV_RERANK_JINA, "{\"query\": \"q\", \"documents\": [\"a\"], \"top_n\": -1}", 400, "top_n", NULL), "top_n < 0");
    T_CHECK(parse_fails(&ctx, &rk, NV_RERANK_JINA, "{\"query\": \"q\", \"documents\": [\"a\"], \"top_n\": 1.5}", 400, "top_n", NULL), "top_n 1.5");
    T_CHECK(parse_fails(&ctx, &rk, NV_RERANK_JINA, "{\"query\": \"q\", \"documents\": [\"a\"], \"return_documents\": 1}", 400, "return_documents", NULL),
            "return_documents");
    T_CHECK(parse_fails(&ctx, &rk, NV_RERANK_COHERE, "{\"query\": \"q\", \"documents\": [\"a\"], \"max_tokens_per_doc\": 0}", 400, "max_tokens_per_doc", NULL),
            "max_tokens_per_doc");
    T_CHECK(parse_fails(&ctx, &rk, NV_RERANK_JINA, "{\"model\": \"other\", \"query\": \"q\", \"documents\": [\"a\"]}", 404, "model", NULL), "model");
    T_CHECK(parse_fails(&ctx, &rk, NV_RERANK_SCORE, "{\"text_1\": [\"a\", \"b\"], \"text_2\": [\"a\", \"b\", \"c\"]}", 400, "text_1", "2 and 3"), "2 and 3");
    T_CHECK(parse_fails(&ctx, &rk, NV_RERANK_SCORE, "{\"text_1\": [\"a\", \"b\"], \"text_2\": \"a\"}", 400, "text_1", NULL), "2 and 1");
    T_CHECK(parse_fails(&ctx, &rk, NV_RERANK_SCORE, "{\"text_1\": \"a\"}", 400, "text_2", NULL), "no text_2");
    T_CHECK(parse_fails(&ctx, &rk, NV_RERANK_JINA, "[1]", 400, NULL, NULL), "not an object");
    nv_buf many = {0};
    nv_buf_puts(&many, "{\"query\": \"q\", \"documents\": [\"a\"");
    for (int i = 0; i < NV_RERANK_MAX_DOCS; i++) nv_buf_puts(&many, ", \"a\"");
    nv_buf_puts(&many, "]}");
    T_CHECK(parse_fails(&ctx, &rk, NV_RERANK_JINA, many.data, 400, "documents", "1 to 1000"), "1001 documents");
    nv_buf_free(&many);
    /* a document past the context is cut to fit (the one returned is as given); a query past it is a 400 */
    nv_buf big = {0};
    nv_buf_puts(&big, "{\"query\": \"q\", \"documents\": [\"a\", \"");
    for (int i = 0; i < 500; i++) nv_buf_puts(&big, "dog ");
    nv_buf_puts(&big, "\"]}");
    T_CHECK(nv_rerank_parse(&ctx, &rk, NV_RERANK_JINA, big.data, big.len, &r, &e) == 0 && r.n == 2 && r.n_ids[1] <= 400 && r.n_ids[1] > 300 &&
                strlen(r.docs[1]) == 2000 && !memcmp(r.ids[1], r.ids[0], 4 * sizeof(int)),
            "a long document cut to fit: %d tokens (%s)", r.n ? r.n_ids[1] : -1, e.message);
    if (!e.status) nv_rerank_req_free(&r);
    nv_buf_free(&big);
    nv_buf_puts(&big, "{\"query\": \"");
    for (int i = 0; i < 500; i++) nv_buf_puts(&big, "dog ");
    nv_buf_puts(&big, "\", \"documents\": [\"a\"]}");
    T_CHECK(parse_fails(&ctx, &rk, NV_RERANK_JINA, big.data, 400, "query", "context length"), "a query past the context");
    nv_buf_free(&big);
    nv_buf_puts(&big, "{\"text_1\": [\"a\", \"");
    for (int i = 0; i < 500; i++) nv_buf_puts(&big, "dog ");
    nv_buf_puts(&big, "\"], \"text_2\": [\"x\", \"y\"]}");
    T_CHECK(parse_fails(&ctx, &rk, NV_RERANK_SCORE, big.data, 400, "text_1", "the prompt of 'text_1[1]' with"), "which query is past the context");
    nv_buf_free(&big);
    nv_rerank off;
    T_CHECK(nv_rerank_init(&off, tok, 0, NULL, NULL, NULL) == NV_OK, "off");
    T_CHECK(parse_fails(&ctx, &off, NV_RERANK_JINA, "{\"query\": \"q\", \"documents\": [\"a\"]}", 400, NULL, "--rerank-tokens"), "off says why");
    T_CHECK(parse_fails(&ctx, NULL, NV_RERANK_JINA, "{\"query\": \"q\", \"documents\": [\"a\"]}", 400, NULL, "does not rerank"), "no reranker");
    nv_rerank_free(&off);
    nv_rerank_free(&rk);
    /* the chat template's prompt: Qwen3-Reranker's own on ChatML with thinking off */
    T_CHECK(nv_rerank_init(&rk, tok, 0, "the,a", NULL, NULL) == NV_OK, "%s", nv_errmsg());
    ctx.tmpl = NV_CHAT_CHATML;
    body = "{\"query\": \"What is the capital of China?\", \"documents\": [\"The capital of China is Beijing.\"]}";
    T_CHECK(nv_rerank_parse(&ctx, &rk, NV_RERANK_JINA, body, strlen(body), &r, &e) == 0, "%s", e.message);
    nv_buf want = {0};
    nv_buf_puts(&want, "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct provided. "
                       "Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n"
                       "<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n"
                       "<Query>: What is the capital of China?\n<Document>: The capital of China is Beijing.<|im_end|>\n"
                       "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    int *wids = NULL, nw = 0;
    T_CHECK(nv_tokenizer_encode(tok, want.data, 1, 0, &wids, &nw) == NV_OK && r.n == 1 && r.n_ids[0] == nw &&
                !memcmp(r.ids[0], wids, (size_t)nw * sizeof *wids),
            "Qwen3-Reranker's prompt");
    free(wids);
    nv_buf_free(&want);
    nv_rerank_req_free(&r);
    nv_rerank_free(&rk);
    nv_tokenizer_free(tok);
}

static void test_rerank_response(void) {
    nv_tokenizer *tok = tok512();
    if (!tok) return;
    nv_rerank rk;
    T_CHECK(nv_rerank_init(&rk, tok, 0, "the,a", "{query} {document}", NULL) == NV_OK, "%s", nv_errmsg());
    nv_api_ctx ctx = {.model_id = "m", .tok = tok, .tmpl = NV_CHAT_PLAIN, .seq_len = 512, .vocab_size = 512, .capacity = 400, .reasoning = 0, .dim = 64};
    nv_rerank_req r;
    nv_api_error e;
    const float rel[3] = {0.25f, 0.75f, 0.25f};
    const char *body = "{\"query\": \"q\", \"documents\": [\"d0\", {\"text\": \"d\\\"1\"}, \"d2\"], \"top_n\": 2}";
    T_CHECK(nv_rerank_parse(&ctx, &rk, NV_RERANK_JINA, body, strlen(body), &r, &e) == 0, "%s", e.message);
    char *out = nv_rerank_response(&r, rel, 12);
    T_CHECK(out && !strncmp(out, "{\"id\":\"rerank-", 14) &&
                strstr(out, "\"model\":\"m\",\"results\":[{\"index\":1,\"relevance_score\":0.75,\"document\":{\"text\":\"d\\\"1\"}},"
                            "{\"index\":0,\"relevance_score\":0.25,\"document\":{\"text\":\"d0\"}}],\"usage\":{\"prompt_tokens\":12,\"total_tokens\":12}}"),
            "best first, ties in input order, top_n: %s", out);
    free(out);
    nv_rerank_req_free(&r);
    body = "{\"query\": \"q\", \"documents\": [\"d0\", \"d1\", \"d2\"]}";
    T_CHECK(nv_rerank_parse(&ctx, &rk, NV_RERANK_COHERE, body, strlen(body), &r, &e) == 0, "%s", e.message);
    out = nv_rerank_response(&r, rel, 12);
    T_CHECK(out && strstr(out, "\"results\":[{\"index\":1,\"relevance_score\":0.75},{\"index\":0,\"relevance_score\":0.25},{\"index\":2,\"relevance_score\":0.25}]") &&
                strstr(out, "\"meta\":{\"api_version\":{\"version\":\"2\"},\"billed_units\":{\"search_units\":1},\"tokens\":{\"input_tokens\":12,\"output_tokens\":0}}"),
            "Cohere's: %s", out);
    free(out);
    nv_rerank_req_free(&r);
    /* text-embeddings-inference's: "texts", the answer a list, return_text, raw_scores */
    body = "{\"query\": \"q\", \"texts\": [\"d0\", \"d1\", \"d2\"], \"return_text\": true, \"raw_scores\": true}";
    T_CHECK(nv_rerank_parse(&ctx, &rk, NV_RERANK_JINA, body, strlen(body), &r, &e) == 0 && r.api == NV_RERANK_TEI && r.raw && r.return_documents,
            "TEI's: %s", e.message);
    out = nv_rerank_response(&r, rel, 9);
    T_CHECK(out && !strcmp(out, "[{\"index\":1,\"score\":0.75,\"text\":\"d1\"},{\"index\":0,\"score\":0.25,\"text\":\"d0\"},"
                                "{\"index\":2,\"score\":0.25,\"text\":\"d2\"}]"),
            "TEI's answer: %s", out);
    free(out);
    nv_rerank_req_free(&r);
    T_CHECK(parse_fails(&ctx, &rk, NV_RERANK_JINA, "{\"query\": \"q\", \"texts\": [{\"text\": \"a\"}]}", 400, "texts", "'texts[0]' must be a string") &&
                parse_fails(&ctx, &rk, NV_RERANK_JINA, "{\"query\": \"q\", \"texts\": [\"a\"], \"raw_scores\": 1}", 400, "raw_scores", NULL) &&
                parse_fails(&ctx, &rk, NV_RERANK_JINA, "{\"query\": \"q\", \"texts\": [\"a\"], \"return_text\": \"y\"}", 400, "return_text", NULL),
            "TEI's 400s");
    body = "{\"text_1\": \"q\", \"text_2\": [\"d0\", \"d1\", \"d2\"]}";
    T_CHECK(nv_rerank_parse(&ctx, &rk, NV_RERANK_SCORE, body, strlen(body), &r, &e) == 0, "%s", e.message);
    out = nv_rerank_response(&r, rel, 9);
    T_CHECK(out && !strncmp(out, "{\"id\":\"score-", 13) && strstr(out, "\"object\":\"list\",\"created\":") &&
                strstr(out, "\"data\":[{\"index\":0,\"object\":\"score\",\"score\":0.25},{\"index\":1,\"object\":\"score\",\"score\":0.75},"
                            "{\"index\":2,\"object\":\"score\",\"score\":0.25}],\"usage\":{\"prompt_tokens\":9,\"total_tokens\":9,\"completion_tokens\":0}}"),
            "vLLM's score: %s", out);
    free(out);
    nv_rerank_req_free(&r);
    nv_rerank_free(&rk);
    nv_tokenizer_free(tok);
}

/* The JSON body of a POST (NULL unless it answered 200) */
static cJSON *post_json(int port, const char *path, const char *body) {
    int status;
    cJSON *j = post_json_status(port, path, body, &status);
    if (status == 200) return j;
    char *shown = j ? cJSON_PrintUnformatted(j) : NULL;
    fprintf(stderr, "    %s: %d %s\n", path, status, shown ? shown : "");
    free(shown);
    cJSON_Delete(j);
    return NULL;
}

/* The log-probability the model gives token tok after text's prompt, through /v1/completions' echo */
static double next_logprob(int port, const nv_tokenizer *t, const char *text, int tok) {
    int *ids = NULL, n = 0;
    if (nv_tokenizer_encode(t, text, 1, 0, &ids, &n) != NV_OK) return NAN;
    nv_buf b = {0};
    nv_buf_puts(&b, "{\"prompt\": [");
    for (int i = 0; i < n; i++) nv_buf_printf(&b, "%d, ", ids[i]);
    nv_buf_printf(&b, "%d], \"max_tokens\": 0, \"echo\": true, \"logprobs\": 0}", tok);
    free(ids);
    cJSON *j = post_json(port, "/v1/completions", b.data);
    nv_buf_free(&b);
    const cJSON *lps = j ? cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "logprobs"),
                                               "token_logprobs")
                         : NULL;
    const cJSON *last = lps ? cJSON_GetArrayItem(lps, cJSON_GetArraySize(lps) - 1) : NULL;
    const double lp = cJSON_IsNumber(last) ? last->valuedouble : NAN;
    cJSON_Delete(j);
    return lp;
}

/* The server: each document's relevance is sigmoid(log p(the) - log p(a)) of the next token after
 * its prompt (the completion endpoint's own probabilities), best first; Cohere's and vLLM's
 * shapes give the same numbers; a server whose vocabulary cannot score says so. */
static void test_rerank_serve(void) {
    const char *m = t_data("models/stories260K.bin"), *z = t_data("models/tok512.bin");
    nv_tokenizer *tok = tok512();
    if (!m || !z || !tok) {
        if (tok) nv_tokenizer_free(tok);
        return;
    }
    static const char tmpl[] = "Q: {query}\nStory: {document}\nAnswer:";
    const char *file = t_write("rerank.txt", tmpl, strlen(tmpl));
    char args[4400];
    /* prompts prefilled 7 rows a step: a pair's last row is in its last chunk */
    snprintf(args, sizeof args, "--rerank-tokens the,a --rerank-template '%s' --kv-memory 16M --kv-disk-cache 0 --prefill-chunk 7", file);
    server s;
    if (!server_spawn(&s, "rerank_serve", NULL, NULL, m, z, args, 30)) {
        T_CHECK(0, "the server did not start");
        nv_tokenizer_free(tok);
        return;
    }
    static const char *const docs[3] = {"Once upon a time there was a little girl.", "The dog ran to the park and played with a ball.",
                                        "Tom was sad. He lost his toy"};
    cJSON *j = post_json(s.port, "/v1/rerank",
                         "{\"query\": \"Who was sad?\", \"documents\": [\"Once upon a time there was a little girl.\", "
                         "\"The dog ran to the park and played with a ball.\", \"Tom was sad. He lost his toy\"]}");
    const cJSON *res = j ? cJSON_GetObjectItem(j, "results") : NULL;
    T_CHECK(cJSON_GetArraySize(res) == 3, "three results");
    const int the = one_token(tok, "the"), a = one_token(tok, "a");
    double prev = 2, rel[3] = {0};
    for (int k = 0; k < cJSON_GetArraySize(res); k++) {
        const cJSON *it = cJSON_GetArrayItem(res, k);
        const int i = cJSON_GetObjectItem(it, "index")->valueint;
        const double got = cJSON_GetObjectItem(it, "relevance_score")->valuedouble;
        const cJSON *doc = cJSON_GetObjectItem(cJSON_GetObjectItem(it, "document"), "text");
        T_CHECK(i >= 0 && i < 3 && cJSON_IsString(doc) && !strcmp(doc->valuestring, docs[i]), "result %d's document", k);
        if (i < 0 || i >= 3) continue;
        char text[256];
        snprintf(text, sizeof text, "Q: Who was sad?\nStory: %s\nAnswer:", docs[i]);
        const double want = 1.0 / (1.0 + exp(-(next_logprob(s.port, tok, text, the) - next_logprob(s.port, tok, text, a))));
        T_CHECK(fabs(got - want) < 1e-4 * (want > 1e-3 ? want : 1e-3), "document %d: %.9g, not %.9g", i, got, want);
        T_CHECK(got <= prev, "best first");
        prev = rel[i] = got;
    }
    cJSON_Delete(j);
    j = post_json(s.port, "/v2/rerank", "{\"query\": \"Who was sad?\", \"top_n\": 1, \"documents\": [\"Once upon a time there was a little girl.\", "
                                        "\"The dog ran to the park and played with a ball.\", \"Tom was sad. He lost his toy\"]}");
    res = j ? cJSON_GetObjectItem(j, "results") : NULL;
    const cJSON *top = cJSON_GetArrayItem(res, 0);
    T_CHECK(cJSON_GetArraySize(res) == 1 && top && !cJSON_GetObjectItem(top, "document") && cJSON_GetObjectItem(j, "meta") &&
                fabs(cJSON_GetObjectItem(top, "relevance_score")->valuedouble - rel[cJSON_GetObjectItem(top, "index")->valueint]) < 1e-6,
            "Cohere's top_n 1");
    cJSON_Delete(j);
    j = post_json(s.port, "/rerank", "{\"query\": \"Who was sad?\", \"raw_scores\": true, \"texts\": [\"Once upon a time there was a little girl.\", "
                                   "\"The dog ran to the park and played with a ball.\", \"Tom was sad. He lost his toy\"]}");
    for (int k = 0; k < 3; k++) { /* TEI's: a list, best first; raw scores the relevances' logits */
        const cJSON *it = cJSON_GetArrayItem(j, k), *ix = cJSON_GetObjectItem(it, "index"), *sc = cJSON_GetObjectItem(it, "score");
        const int i = cJSON_IsNumber(ix) ? ix->valueint : -1;
        T_CHECK(cJSON_IsArray(j) && i >= 0 && i < 3 && cJSON_IsNumber(sc) && rel[i] > 0 && rel[i] < 1 &&
                    fabs(sc->valuedouble - log(rel[i] / (1 - rel[i]))) < 1e-3,
                "TEI's result %d", k);
    }
    cJSON_Delete(j);
    j = post_json(s.port, "/v1/score", "{\"text_1\": \"Who was sad?\", \"text_2\": [\"Once upon a time there was a little girl.\", "
                                       "\"The dog ran to the park and played with a ball.\", \"Tom was sad. He lost his toy\"]}");
    const cJSON *data = j ? cJSON_GetObjectItem(j, "data") : NULL;
    for (int i = 0; i < 3; i++) {
        const cJSON *sc = cJSON_GetObjectItem(cJSON_GetArrayItem(data, i), "score");
        T_CHECK(cJSON_IsNumber(sc) && fabs(sc->valuedouble - rel[i]) < 1e-6, "score %d", i);
    }
    cJSON_Delete(j);
    /* a long query: the first pair runs alone, so the others find its blocks in the prefix cache */
    const double cached0 = metric(s.port, "nerve_prefix_cached_tokens_total");
    j = post_json(s.port, "/v1/rerank",
                  "{\"query\": \"Once upon a time there was a little girl named Lily. She loved to play outside in the park with her "
                  "friends and her dog, and one day she found a big red ball under a tree\", \"documents\": [\"a\", \"b\", \"c\", \"d\"]}");
    const double cached = metric(s.port, "nerve_prefix_cached_tokens_total") - cached0;
    T_CHECK(j && cached >= 3 * 32, "%.0f prompt tokens from the prefix cache", cached);
    cJSON_Delete(j);
    T_CHECK(server_stop_within(&s, 30) == 0, "stop");
    /* the default tokens are not in tok512's vocabulary: a 400 saying what to do */
    if (!server_spawn(&s, "rerank_off", NULL, NULL, m, z, "--kv-memory 16M", 30)) {
        T_CHECK(0, "the server did not start");
    } else {
        resp r;
        memset(&r, 0, sizeof r);
        T_CHECK(http(s.port, "POST", "/v1/rerank", NULL, "{\"query\": \"q\", \"documents\": [\"a\"]}", &r) && r.status == 400 && r.body &&
                    strstr(r.body, "\"code\":\"model_not_supported\"") && strstr(r.body, "--rerank-tokens YES,NO"),
                "%d %s", r.status, r.body ? r.body : "");
        resp_free(&r);
        T_CHECK(server_stop_within(&s, 30) == 0, "stop");
    }
    /* a given list that the vocabulary cannot hold stops the server before it listens */
    char out[512];
    snprintf(out, sizeof out, "--rerank-tokens the,xyzzyq");
    T_CHECK(!server_spawn(&s, "rerank_bad", NULL, NULL, m, z, out, 10), "a bad --rerank-tokens started");
    char *log = read_log(&s);
    T_CHECK(log && strstr(log, "--rerank-tokens: 'xyzzyq' is not one token of this vocabulary"), "%s", log ? log : "");
    free(log);
    server_stop_within(&s, 5);
    nv_tokenizer_free(tok);
}

/* A GGUF's own rerank template (tokenizer.chat_template.rerank, llama.cpp's) makes the prompts:
 * the same scores as --rerank-template with its text, others than another template's. (The test
 * model's context is 16 positions: short prompts.) */
static void test_rerank_gguf_template(void) {
    const char *path = t_path("rr.gguf"), *text = "{query} {document}", *other = "{document} {query}";
    gw_rerank_template = text;
    gguf_write_model_ex(path, "llama", 3, 1, NULL);
    gw_rerank_template = NULL;
    const char *file = t_write("rr.txt", text, strlen(text)), *file2 = t_write("rr2.txt", other, strlen(other));
    const char *body = "{\"text_1\": \"a\", \"text_2\": [\"ab a\", \"a a ab\", \"ab\"]}";
    double got[3][3] = {{0}};
    for (int run = 0; run < 3; run++) {
        char args[4400];
        snprintf(args, sizeof args, "--rerank-tokens a,ab --kv-memory 4M %s%s%s", run ? "--rerank-template '" : "",
                 run == 1 ? file : run == 2 ? file2 : "", run ? "'" : "");
        server s;
        if (!server_spawn(&s, "rerank_gguf", NULL, NULL, path, NULL, args, 30)) {
            T_CHECK(0, "the server did not start");
            return;
        }
        cJSON *j = post_json(s.port, "/v1/score", body);
        for (int i = 0; i < 3; i++) {
            const cJSON *sc = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), i), "score");
            got[run][i] = cJSON_IsNumber(sc) ? sc->valuedouble : -1;
        }
        cJSON_Delete(j);
        T_CHECK(server_stop_within(&s, 30) == 0, "stop");
    }
    for (int i = 0; i < 3; i++) T_CHECK(got[0][i] > 0 && got[0][i] == got[1][i], "pair %d: %.9g against %.9g", i, got[0][i], got[1][i]);
    T_CHECK(got[2][0] > 0 && (got[2][0] != got[0][0] || got[2][1] != got[0][1] || got[2][2] != got[0][2]), "another template's prompts");
}

/* /v1/score of body on a server of model with args: each score into got[i] (-1 where missing) */
static int scores_of(const char *name, const char *model, const char *args, const char *body, double *got, int n) {
    server s;
    for (int i = 0; i < n; i++) got[i] = -1;
    if (!server_spawn(&s, name, NULL, NULL, model, NULL, args, 30)) return 0;
    cJSON *j = post_json(s.port, "/v1/score", body);
    for (int i = 0; i < n; i++) {
        const cJSON *sc = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), i), "score");
        if (cJSON_IsNumber(sc)) got[i] = sc->valuedouble;
    }
    cJSON_Delete(j);
    return server_stop_within(&s, 30) == 0;
}

/* A GGUF reranker's classification head (cls.output, llama.cpp's): made of a tied model's rows of
 * two tokens, it gives the scores those tokens' logits give on the model without it; it takes no
 * --rerank-tokens; a head of three outputs is not a reranker's. */
static void test_rerank_head(void) {
    const char *with = t_path("head.gguf"), *without = t_path("nohead.gguf");
    const char *body = "{\"text_1\": \"a\", \"text_2\": [\"ab a\", \"a a ab\", \"ab\"]}";
    gw_rerank_template = "{query} {document}";
    gw_cls_rows = 2, gw_cls_tokens[0] = 3, gw_cls_tokens[1] = 5; /* "\u2581a", "\u2581ab" */
    gguf_write_model_ex(with, "llama", 3, 1, NULL);
    gw_cls_rows = 0;
    gguf_write_model_ex(without, "llama", 3, 1, NULL);
    double head[3], toks[3];
    T_CHECK(scores_of("rerank_head", with, "--engine avx2 --kv-memory 4M", body, head, 3), "the server with the head");
    T_CHECK(scores_of("rerank_tokens", without, "--engine avx2 --kv-memory 4M --rerank-tokens a,ab", body, toks, 3), "the one without");
    for (int i = 0; i < 3; i++)
        T_CHECK(head[i] > 0 && head[i] < 1 && fabs(head[i] - toks[i]) < 1e-5, "pair %d: the head's %.9g, the tokens' %.9g", i, head[i], toks[i]);
    T_CHECK(head[0] != head[1] || head[1] != head[2], "the pairs' scores differ");
    /* cls.output.bias: 1 on the first output, 0 on the second, so the logit of each relevance 1 more */
    gw_rerank_template = "{query} {document}";
    gw_cls_rows = 2, gw_cls_biased = 1;
    gguf_write_model_ex(with, "llama", 3, 1, NULL);
    gw_cls_rows = gw_cls_biased = 0;
    T_CHECK(scores_of("rerank_bias", with, "--engine avx2 --kv-memory 4M", body, head, 3), "the server with the biased head");
    for (int i = 0; i < 3; i++)
        T_CHECK(head[i] > 0 && head[i] < 1 && fabs(log(head[i] / (1 - head[i])) - log(toks[i] / (1 - toks[i])) - 1) < 1e-4, "pair %d: %.9g with the bias, %.9g without",
                i, head[i], toks[i]);
    server s;
    T_CHECK(!server_spawn(&s, "rerank_head_tokens", NULL, NULL, with, NULL, "--rerank-tokens a,ab", 10), "--rerank-tokens with a head started");
    char *log = read_log(&s);
    T_CHECK(log && strstr(log, "classification head"), "%s", log ? log : "");
    free(log);
    server_stop_within(&s, 5);
    gw_cls_rows = 3, gw_cls_tokens[2] = 0;
    gguf_write_model_ex(with, "llama", 3, 1, NULL);
    gw_cls_rows = 0;
    gw_rerank_template = NULL;
    if (!server_spawn(&s, "rerank_head3", NULL, NULL, with, NULL, "--kv-memory 4M", 30)) {
        T_CHECK(0, "the server did not start");
        return;
    }
    resp r;
    memset(&r, 0, sizeof r);
    T_CHECK(http(s.port, "POST", "/v1/score", NULL, body, &r) && r.status == 400 && r.body && strstr(r.body, "has 3 outputs"), "%d %s", r.status,
            r.body ? r.body : "");
    resp_free(&r);
    T_CHECK(server_stop_within(&s, 30) == 0, "stop");
}

int main(void) {
    T_RUN(test_rerank_init);
    T_RUN(test_rerank_parse);
    T_RUN(test_rerank_response);
    T_RUN(test_rerank_serve);
    T_RUN(test_rerank_gguf_template);
    T_RUN(test_rerank_head);
    return t_done();
}
