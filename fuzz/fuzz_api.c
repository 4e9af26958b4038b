/* libFuzzer harness: nv_api_parse on untrusted /v1/completions and /v1/chat/completions bodies.
 *
 * The input is the JSON body (not NUL-terminated, as libmicrohttpd hands it over). It is
 * parsed as a completion (chat = 0) and as a chat under each template (plain, chatml, llama2:
 * nv_api_parse renders the messages through nv_chat_render itself, as the server does), with
 * the context the server builds for stories260K: its tokenizer (models/tok512.bin from the
 * shared data, found by nv_data_path / NERVE_DATA), seq_len 512, vocab 512, and a KV pool
 * holding 300 positions per request so both the context and the pool limits are reachable.
 *
 * Checked, as src/serve/api.h promises: a failure returns its HTTP status, fills a message,
 * frees everything, and nv_api_error_json gives valid JSON; a success gives a prompt of
 * 1..seq_len-1 ids within the vocabulary that fits the pool, max_tokens >= 1 (0 only with echo)
 * within the context and the pool, prompt log-probabilities exactly with echo and logprobs, sampling parameters in range, at most NV_MAX_STOP non-empty stop
 * strings; nv_req_create (the next thing the server does) accepts it, a sampler set up as the
 * scheduler sets up the request's (temperature, top_p, seed, logit_bias, penalties) picks tokens
 * inside the vocabulary for a few steps over flat and sloped logits (what a freshly initialised
 * and a trained model give), and the response bodies built from it are valid JSON. A request with
 * a response format (a JSON schema from the body) runs its grammar as the scheduler would: for a
 * few steps the mask agrees with asking token by token, and the best allowed token moves the
 * matcher on. The body is also read as a model's answer by the tool-call parser of each style and
 * by the think-block reader of each tag pair, whole and byte by byte, which must agree. And as an Anthropic Messages body (and a count_tokens
 * one): a failure gives Anthropic's error body and keeps nothing; a success is a chat request that
 * passes the same checks (max_tokens capped by the room, never refused for it), and the message and
 * stream events built for it are valid JSON. And as a Responses body, the same way (OpenAI's error
 * body; the response object and its events valid), and as Ollama's chat, generate, embed and show bodies, and as
 * POST /lora-adapters' list (all or nothing; GET's list stays JSON). */
#include <cjson/cJSON.h>
#include <math.h>

#include "base/file.h"
#include "fuzz_util.h"
#include "model/grammar.h"
#include "model/sampler.h"
#include "model/think.h"
#include "serve/anthropic.h"
#include "serve/llamacpp.h"
#include "serve/ollama.h"
#include "serve/api.h"
#include "serve/rerank.h"
#include "serve/responses.h"
#include "serve/tools.h"

#define FZ_MAX_INPUT (1u << 20)
#define FZ_SEQ_LEN 512
#define FZ_VOCAB 512
#define FZ_CAPACITY 300

static nv_tokenizer *tok;
static nv_gtrie *trie;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    tok = fz_tok512("fuzz_api");
    if (nv_gtrie_build(tok, &trie) != NV_OK) {
        fprintf(stderr, "fuzz_api: %s\n", nv_errmsg());
        exit(1);
    }
    return 0;
}

static void check_json(char *s, const char *what) {
    FZ_CHECK(s != NULL, "%s: no JSON", what);
    cJSON *j = cJSON_Parse(s);
    FZ_CHECK(j != NULL, "%s is not valid JSON: %s", what, s);
    cJSON_Delete(j);
    free(s);
}

/* The scheduler's sampling for this request: three steps, each token counted for the penalties. */
static void check_sampling(const nv_req_params *q) {
    nv_sampler sm;
    fz_clear_error();
    nv_err e = nv_sampler_init(&sm, q->vocab_size, q->temperature, q->top_p, q->seed ? q->seed : 1);
    if (e == NV_OK) e = nv_sampler_set_bias(&sm, q->bias_tok, q->bias, q->n_bias);
    if (e == NV_OK) e = nv_sampler_set_penalties(&sm, q->presence_penalty, q->frequency_penalty);
    FZ_CHECK(e == NV_OK, "sampler refused a parsed request: %s", nv_errmsg());
    float *logits = malloc((size_t)q->vocab_size * sizeof *logits);
    FZ_CHECK(logits != NULL, "out of memory");
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < q->vocab_size; i++) logits[i] = step == 0 ? 0.0f : (float)((i * 7 + step) % 13) * 0.25f;
        int tok = nv_sample(&sm, logits);
        FZ_CHECK(tok >= 0 && tok < q->vocab_size, "sampled token %d", tok);
        nv_sampler_accept(&sm, tok);
    }
    free(logits);
    nv_sampler_free(&sm);
}

/* The request's grammar over the vocabulary, as the scheduler steps it. */
static void check_grammar(nv_grammar *g) {
    nv_gmatch *m = nv_gmatch_new(g);
    FZ_CHECK(m != NULL, "out of memory");
    static uint8_t mask[FZ_VOCAB];
    int prev = NV_TOKEN_EOS;
    for (int step = 0; step < 8; step++) {
        int k = nv_gmatch_mask(m, trie, mask), count = 0, pick = -1;
        for (int v = 0; v < FZ_VOCAB; v++) {
            int want = nv_gmatch_allows(m, tok, prev, v);
            FZ_CHECK(want == mask[v], "step %d token %d: mask %d, token by token %d", step, v, mask[v], want);
            count += want;
            /* a varying pick, so the walk goes down different paths */
            if (want && (pick < 0 || (v * 31 + step * 7) % 17 > (pick * 31 + step * 7) % 17)) pick = v;
        }
        FZ_CHECK(k == count, "mask count %d, counted %d", k, count);
        if (pick < 0 || nv_tokenizer_is_eog(tok, pick)) break;
        FZ_CHECK(nv_gmatch_accept(m, tok, prev, pick), "an allowed token %d was not accepted", pick);
        prev = pick;
    }
    nv_gmatch_free(m);
}

static void check_request(const nv_api_ctx *ctx, int chat, nv_api_request *r) {
    const nv_req_params *q = &r->req;
    FZ_CHECK(r->chat == chat, "chat flag");
    FZ_CHECK(q->n_prompt >= 1 && q->n_prompt < ctx->seq_len && q->n_prompt <= ctx->capacity, "prompt of %d ids",
             q->n_prompt);
    FZ_CHECK(q->prompt == r->prompt_ids && r->prompt_ids != NULL, "prompt pointer");
    for (int i = 0; i < q->n_prompt; i++)
        FZ_CHECK(q->prompt[i] >= 0 && q->prompt[i] < ctx->vocab_size, "prompt id %d", q->prompt[i]);
    FZ_CHECK((q->max_tokens >= 1 || (q->max_tokens == 0 && r->echo && !chat)) && (long)q->n_prompt + q->max_tokens <= ctx->seq_len &&
                 q->max_tokens <= ctx->capacity - q->n_prompt + 1,
             "max_tokens %d with %d prompt ids", q->max_tokens, q->n_prompt);
    FZ_CHECK(q->temperature >= 0 && q->temperature <= 2 && q->top_p > 0 && q->top_p <= 1, "temperature %g top_p %g",
             q->temperature, q->top_p);
    FZ_CHECK(q->n_stop >= 0 && q->n_stop <= NV_MAX_STOP, "%d stop strings", q->n_stop);
    for (int i = 0; i < q->n_stop; i++) FZ_CHECK(q->stop[i] && q->stop[i][0] && strlen(q->stop[i]) <= 256, "stop %d", i);
    FZ_CHECK(q->vocab_size == ctx->vocab_size, "vocab_size");
    FZ_CHECK(!r->echo || chat || r->echo_text != NULL, "echo without text");
    FZ_CHECK(q->prompt_logprobs == (r->echo && q->logprobs), "prompt log-probabilities without echo and logprobs");
    FZ_CHECK(q->n_prediction >= 0 && q->n_prediction <= ctx->seq_len && (q->n_prediction == 0 || q->prediction == r->pred_ids),
             "prediction of %d ids", q->n_prediction);
    for (int i = 0; i < q->n_prediction; i++)
        FZ_CHECK(q->prediction[i] >= 0 && q->prediction[i] < ctx->vocab_size, "prediction id %d", q->prediction[i]);

    nv_req *req = NULL;
    fz_clear_error();
    nv_err e = nv_req_create(&req, q);
    FZ_CHECK(e == NV_OK, "nv_req_create refused a parsed request: %s", nv_errmsg());
    nv_req_release(NULL, req);
    check_sampling(q);
    FZ_CHECK(q->grammar == r->grammar, "grammar pointer");
    if (q->grammar) check_grammar(q->grammar);

    nv_api_meta meta;
    nv_api_meta_init(&meta, chat, ctx->model_id);
    const char *text = r->echo_text ? r->echo_text : "";
    meta.pred = q->n_prediction > 0;
    check_json(nv_api_response(&meta, text, "stop", q->n_prompt, 0), "response");
    check_json(nv_api_chunk(&meta, text, chat, NULL, r->include_usage), "chunk");
}

/* The body as /v1/messages and /v1/messages/count_tokens, under chatml (tools and prefills render). */
static void check_anthropic(nv_api_ctx *ctx, const char *data, size_t size) {
    ctx->tmpl = NV_CHAT_CHATML;
    for (int count = 0; count < 2; count++) {
        nv_api_request r;
        nv_anth_meta m;
        nv_api_error err;
        int rc = nv_anth_parse(ctx, data, size, count, &r, &m, &err);
        if (rc != 0) {
            FZ_CHECK(rc == err.status && rc >= 400 && rc < 600 && err.message[0] != '\0', "messages status %d", rc);
            FZ_CHECK(r.prompt_ids == NULL && m.n_stop == 0, "a failed Messages parse kept memory");
            check_json(nv_anth_error_json(&err), "Anthropic error body");
            continue;
        }
        /* the stop sequences lead the request's stop strings, in order: stop_index names them */
        FZ_CHECK(m.n_stop <= r.req.n_stop && r.req.n_prompt >= 1, "%d stop sequences, %d in the request", m.n_stop, r.req.n_stop);
        for (int i = 0; i < m.n_stop && i < r.req.n_stop; i++) FZ_CHECK(!strcmp(m.stop[i], r.req.stop[i]), "stop sequence %d", i);
        if (!count) check_request(ctx, 1, &r);
        nv_anth_answer a = {.text = "x", .stop_reason = "end_turn", .prompt_tokens = r.req.n_prompt};
        check_json(nv_anth_message(&m, &a), "Anthropic message");
        nv_anth_stream st;
        nv_buf out = {0};
        nv_anth_stream_start(&st, &m, r.req.n_prompt, 0, &out);
        nv_anth_stream_end(&st, &a, &out);
        FZ_CHECK(!out.oom && strstr(out.data, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"), "Anthropic events");
        nv_buf_free(&out);
        nv_api_request_free(&r);
        nv_anth_meta_free(&m);
    }
}

/* The body as a conversation's create, its update and its items' add: each answers JSON or an
 * error; what a create kept lists back as JSON. */
static void check_conversation(nv_conv_store *convs, const char *data, size_t size) {
    if (!convs) return;
    char *out = NULL, id[64] = "";
    nv_api_error err;
    int rc = nv_conv_create(convs, data, size, &out, &err);
    FZ_CHECK(rc == 0 ? out != NULL : rc == err.status && rc >= 400 && rc < 600 && !out, "conversation create %d", rc);
    if (rc) return check_json(nv_api_error_json(&err), "conversation error");
    cJSON *c = cJSON_Parse(out);
    snprintf(id, sizeof id, "%s", cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "id")) ?: "");
    cJSON_Delete(c);
    check_json(out, "conversation");
    FZ_CHECK(*id, "a conversation without an id");
    for (int add = 0; add < 2; add++) {
        out = NULL;
        rc = add ? nv_conv_items_add(convs, id, data, size, &out, &err) : nv_conv_update(convs, id, data, size, &out, &err);
        check_json(rc ? nv_api_error_json(&err) : out, "conversation answer");
    }
    out = NULL;
    FZ_CHECK(nv_conv_items_list(convs, id, "100", "asc", NULL, &out, &err) == 0, "the items listed back");
    check_json(out, "conversation items");
    out = NULL;
    FZ_CHECK(nv_conv_delete(convs, id, &out, &err) == 0, "deleted");
    free(out);
}

/* The body as /v1/responses (chatml). */
static void check_responses(nv_api_ctx *ctx, const char *data, size_t size) {
    ctx->tmpl = NV_CHAT_CHATML;
    nv_api_request r;
    nv_resp_meta m;
    nv_api_error err;
    static nv_resp_store *store; /* holds resp_fuzz for previous_response_id to continue */
    if (!store && nv_resp_store_new(1 << 20, &store) == NV_OK)
        nv_resp_store_put(store, "resp_fuzz",
                          strdup("{\"id\":\"resp_fuzz\",\"output\":[{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":"
                                 "\"output_text\",\"text\":\"hi\"}]},{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"play\","
                                 "\"arguments\":\"{}\"}]}"),
                          strdup("[{\"type\":\"message\",\"role\":\"user\",\"content\":\"x\",\"id\":\"msg_1\"}]"), strdup("[]"));
    static nv_conv_store *convs; /* a conversation the body cannot name (its id is random): the lookup's refusal */
    if (!convs && nv_conv_store_new(1 << 20, &convs) == NV_OK) {
        char *made = NULL;
        if (nv_conv_create(convs, "{\"items\":[{\"role\":\"user\",\"content\":\"hi\"}]}", 41, &made, &err) == 0) free(made);
    }
    check_conversation(convs, data, size);
    int rc = nv_resp_parse(ctx, store, convs, data, size, &r, &m, &err);
    if (rc != 0) {
        FZ_CHECK(rc == err.status && rc >= 400 && rc < 600 && err.message[0] != '\0', "responses status %d", rc);
        FZ_CHECK(r.prompt_ids == NULL && m.echo == NULL, "a failed Responses parse kept memory");
        check_json(nv_api_error_json(&err), "Responses error body");
        return;
    }
    check_request(ctx, 1, &r);
    nv_tool_call call = {.id = "call_x", .name = "play", .arguments = "{}"};
    nv_resp_answer a = {.reasoning = "r", .text = "x", .calls = &call, .n_calls = 1, .prompt_tokens = r.req.n_prompt};
    check_json(nv_resp_response(&m, &a, NULL), "Responses response");
    nv_resp_stream st;
    nv_buf out = {0};
    nv_resp_stream_start(&st, &m, &out);
    nv_resp_stream_text(&st, 1, "r", &out);
    nv_resp_stream_text(&st, 0, "x", &out);
    nv_resp_stream_call(&st, &call, &out);
    nv_resp_stream_end(&st, &a, &out, NULL);
    nv_resp_stream_free(&st);
    FZ_CHECK(!out.oom && strstr(out.data, "event: response.completed\n"), "Responses events");
    nv_buf_free(&out);
    nv_resp_stream_start(&st, &m, &out);
    nv_resp_stream_text(&st, 0, "x", &out);
    nv_api_error_set(&err, 408, "timeout_error", "timeout", NULL, "late");
    nv_resp_stream_fail(&st, "failed", &err, &out, NULL);
    nv_resp_stream_free(&st);
    FZ_CHECK(!out.oom && strstr(out.data, "event: response.failed\n"), "Responses failure event");
    nv_buf_free(&out);
    if (m.keep) { /* kept whole: it continues as resp_fuzz does; then gone, so resp_fuzz is never pushed out */
        char *kept = NULL;
        FZ_CHECK(nv_resp_get(store, m.id, &kept, &err) == 0 && kept, "a kept response is not there");
        free(kept);
        FZ_CHECK(nv_resp_store_delete(store, m.id) == 1, "delete");
    }
    nv_api_request_free(&r);
    nv_resp_meta_free(&m);
}

/* The answer's calls and content must not depend on how the text arrives. */
static void check_tool_parser(const char *data, size_t size) {
    static const char *const names[] = {"get_weather", "play", "a"};
    static cJSON *tools; /* the XML style's values are read by these schemas */
    if (!tools)
        tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
                            "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},\"on\":{\"type\":\"boolean\"},"
                            "\"o\":{\"anyOf\":[{\"type\":\"object\"},{\"type\":\"null\"},{\"$ref\":\"#/$defs/a\"}]}},"
                            "\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}}}}},{\"type\":\"function\",\"function\":{\"name\":\"play\","
                            "\"parameters\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"number\"}}}}]");
    for (int style = NV_TOOLS_HERMES; style < NV_TOOLS_N; style++) {
        nv_buf content[2] = {{0}, {0}};
        nv_tool_call *calls[2] = {NULL, NULL};
        int n[2] = {0, 0};
        for (int bytewise = 0; bytewise < 2; bytewise++) {
            nv_tool_parser p = {.style = (nv_tool_style)style, .names = names, .n_names = 3, .tools = tools};
            if (bytewise)
                for (size_t i = 0; i < size; i++) nv_tool_parser_feed(&p, data + i, 1, 0, &content[1], &calls[1], &n[1]);
            nv_tool_parser_feed(&p, bytewise ? "" : data, bytewise ? 0 : size, 1, &content[bytewise], &calls[bytewise], &n[bytewise]);
            nv_tool_parser_free(&p);
        }
        FZ_CHECK(n[0] == n[1] && content[0].len == content[1].len &&
                     (!content[0].len || !memcmp(content[0].data, content[1].data, content[0].len)) && content[0].len <= size,
                 "tool parser style %d: whole and byte by byte differ (%d / %d calls, %zu / %zu bytes)", style, n[0], n[1],
                 content[0].len, content[1].len);
        for (int k = 0; k < n[0] && k < n[1]; k++) {
            FZ_CHECK(!strcmp(calls[0][k].name, calls[1][k].name) && !strcmp(calls[0][k].arguments, calls[1][k].arguments),
                     "tool parser: call %d differs", k);
            /* an id taken from the text (Mistral's [CALL_ID]) is the same either way; made-up ones are random */
            if (memmem(data, size, calls[0][k].id, strlen(calls[0][k].id)))
                FZ_CHECK(!strcmp(calls[0][k].id, calls[1][k].id), "tool parser: call %d's own id differs", k);
        }
        for (int b = 0; b < 2; b++) nv_buf_free(&content[b]), nv_tool_calls_free(calls[b], n[b]);
    }
}

/* The answer's reasoning and content must not depend on how the text arrives, in any tags (harmony's
 * calls are rewritten as Hermes blocks: its content may outgrow the text). */
static void check_think(const char *data, size_t size) {
    for (int tags = NV_THINK_ANGLE; tags <= NV_THINK_HARMONY; tags++) {
        nv_buf why[2] = {{0}, {0}}, said[2] = {{0}, {0}};
        for (int bytewise = 0; bytewise < 2; bytewise++) {
            nv_think t = {.tags = tags, .state = size % 3 ? NV_THINK_UNDECIDED : NV_THINK_IN};
            if (bytewise)
                for (size_t i = 0; i < size; i++) nv_think_feed(&t, data + i, 1, 0, &why[1], &said[1]);
            nv_think_feed(&t, bytewise ? "" : data, bytewise ? 0 : size, 1, &why[bytewise], &said[bytewise]);
            nv_think_free(&t);
        }
        FZ_CHECK(why[0].len == why[1].len && said[0].len == said[1].len && (!why[0].len || !memcmp(why[0].data, why[1].data, why[0].len)) &&
                     (!said[0].len || !memcmp(said[0].data, said[1].data, said[0].len)) &&
                     (tags == NV_THINK_HARMONY || why[0].len + said[0].len <= size),
                 "think tags %d: whole and byte by byte differ (%zu / %zu, %zu / %zu bytes)", tags, why[0].len, why[1].len, said[0].len,
                 said[1].len);
        for (int b = 0; b < 2; b++) nv_buf_free(&why[b]), nv_buf_free(&said[b]);
    }
}

/* The body as llama.cpp's /completion and /infill (the fuzzing vocabulary has no fill-in-the-middle
 * tokens: /infill's refusal past its own fields' checks), and as its /embedding's. */
static void check_llamacpp(nv_api_ctx *ctx, const char *data, size_t size) {
    for (int infill = 0; infill < 2; infill++) {
        nv_api_request r;
        nv_lcpp_meta m;
        nv_api_error err;
        int rc = nv_lcpp_parse(ctx, data, size, infill, &r, &m, &err);
        if (rc != 0) {
            FZ_CHECK(rc == err.status && rc >= 400 && rc < 600 && err.message[0] != '\0', "native status %d", rc);
            FZ_CHECK(m.prompt == NULL && m.n_stop == 0, "a failed native parse kept memory");
            check_json(nv_api_error_json(&err), "native error body");
            continue;
        }
        FZ_CHECK(m.n_stop == r.req.n_stop && r.req.n_prompt >= 1, "%d stop words, %d in the request", m.n_stop, r.req.n_stop);
        check_request(ctx, 0, &r);
        /* one generated token's record (the prompt's ids stand in), for n_probs */
        nv_token_lp lp = {.tok = r.req.prompt[r.req.n_prompt - 1], .prev = NV_TOKEN_BOS, .logprob = -0.5f, .n_top = 1,
                          .top_tok = {r.req.prompt[0]}, .top_lp = {-1.0f}};
        FZ_CHECK(m.n_probs >= 0 && m.n_probs <= NV_MAX_TOP_LOGPROBS && (m.n_probs > 0) == r.req.logprobs, "n_probs %d, logprobs %d",
                 m.n_probs, r.req.logprobs);
        nv_lcpp_answer a = {"x", NV_FINISH_STOP, m.n_stop - 1, r.req.n_prompt, 1, 0, 0.1, 0.2, &lp, 1, ctx->tok};
        check_json(nv_lcpp_response(&m, &a), "native response");
        check_json(nv_lcpp_chunk(&m, "x", 1, r.req.n_prompt, &lp, 1, ctx->tok), "native chunk");
        nv_api_request_free(&r);
        nv_lcpp_meta_free(&m);
    }
    /* and as /embedding's body: a failure keeps nothing; a success's answer (unit vectors stand in) is JSON */
    nv_api_embed e;
    nv_api_error err;
    int normalize = -5;
    const int rc = nv_lcpp_embed_parse(ctx, data, size, &e, &normalize, &err);
    if (rc != 0) {
        FZ_CHECK(rc == err.status && rc >= 400 && rc < 600 && err.message[0] && e.ids == NULL, "/embedding status %d", rc);
        return;
    }
    FZ_CHECK(e.n >= 1 && e.n <= NV_MAX_EMBED_INPUTS && normalize >= 0 && normalize <= 1000, "%d inputs, embd_normalize %d", e.n, normalize);
    float *vecs = calloc((size_t)e.n * 4, sizeof(float));
    for (int i = 0; vecs && i < e.n; i++) vecs[i * 4 + i % 4] = 1.0f;
    if (vecs) check_json(nv_lcpp_embed_response(vecs, e.n, 4, normalize), "/embedding answer");
    free(vecs);
    nv_api_embed_free(&e);
}

/* The body as Ollama's /api/chat and /api/generate, and /api/show: a failure gives Ollama's error
 * body; a load-only request keeps nothing; a success passes the request checks and its lines and
 * whole answer (with a call) are valid JSON. */
static void check_ollama(nv_api_ctx *ctx, const char *data, size_t size) {
    for (int chat = 0; chat < 2; chat++) {
        nv_api_request r;
        nv_olla_meta m;
        nv_api_error err;
        int rc = nv_olla_parse(ctx, data, size, chat, &r, &m, &err);
        if (rc != 0) {
            FZ_CHECK(rc == err.status && rc >= 400 && rc < 600 && err.message[0] != '\0' && r.prompt_ids == NULL, "ollama status %d", rc);
            check_json(nv_olla_error_json(&err), "ollama error body");
            continue;
        }
        if (m.load_only) {
            FZ_CHECK(r.prompt_ids == NULL, "a load-only request was parsed");
            check_json(nv_olla_loaded(&m), "ollama load answer");
            continue;
        }
        check_request(ctx, r.chat, &r);
        nv_tool_call call = {.id = "call_0", .name = (char *)"f", .arguments = (char *)"{\"a\":1}"};
        nv_olla_answer a = {"why", "x", &call, 1, NV_FINISH_STOP, r.req.n_prompt, 1, 0.1, 0.2, "x"};
        check_json(nv_olla_chunk(&m, "why", "x", &call, 1), "ollama line");
        check_json(nv_olla_done(&m, &a), "ollama answer");
        nv_api_request_free(&r);
        nv_olla_meta_free(&m);
    }
    for (int legacy = 0; legacy < 2; legacy++) { /* /api/embed, /api/embeddings */
        nv_api_embed e;
        nv_olla_meta m;
        nv_api_error err;
        if (nv_olla_embed_parse(ctx, data, size, legacy, &e, &m, &err) != 0) {
            FZ_CHECK(err.status >= 400 && err.status < 600 && err.message[0] != '\0' && e.ids == NULL, "ollama embed status %d", err.status);
            check_json(nv_olla_error_json(&err), "ollama embed error body");
            continue;
        }
        FZ_CHECK(e.n >= 1 && (!legacy || e.n == 1), "%d embedding inputs", e.n);
        float v[4] = {0.5f, -0.5f, 0.5f, -0.5f};
        check_json(nv_olla_embed_response(&m, legacy, v, 1, 4, e.n_ids[0]), "ollama embed answer");
        nv_api_embed_free(&e);
    }
    const nv_olla_model_info info = {260032, 1056540, "llama", "F32", "llama2.c"};
    char *out = NULL;
    nv_api_error err;
    if (nv_olla_show(ctx, &info, data, size, &out, &err) == 0) check_json(out, "ollama show");
    else check_json(nv_olla_error_json(&err), "ollama show error");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > FZ_MAX_INPUT) return -1;
    static nv_adapters adapters; /* two adapters, lora-a (id 0) and lora-c (id 2), a request may name as its model or list */
    if (!adapters.live) {
        nv_adapters_init(&adapters, 16);
        for (int i = 0; i < 3; i += 2) {
            snprintf(adapters.v[i].name, sizeof adapters.v[i].name, "lora-%c", 'a' + i);
            adapters.v[i].state = NV_ADAPTER_LIVE;
            adapters.live++;
        }
    }
    nv_api_ctx ctx = {.model_id = "stories260K",
                      .adapters = &adapters,
                      .tok = tok,
                      .tmpl = NV_CHAT_PLAIN,
                      .seq_len = FZ_SEQ_LEN,
                      .vocab_size = FZ_VOCAB,
                      .capacity = FZ_CAPACITY,
                      .dim = 64,
                      .matryoshka = 1, /* (dimensions below the width cut the vectors) */
                      .trust_request_template = 1, /* (a request's own template parsed and run) */
                      /* a reasoning server's: every request's budget and effort parsed through */
                      .reasoning = 1,
                      .think_budget = -1,
                      .think_close = (const int[]){13, 2},
                      .n_think_close = 2,
                      .priority_sched = 1};
    /* a template run as Jinja (serve --chat-template-file): the request's messages, calls, tools and
       chat_template_kwargs all reach it */
    /* and one writing Mistral's think tags, which is given earlier reasoning as thinking chunks */
    static nv_jinja *prog, *prog_think;
    if (!prog) {
        static const char t[] = "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% for c in m.tool_calls or [] %}"
                                "[{{ c.function.name }} {{ c.function.arguments | tojson }}]{% endfor %}{% endfor %}{{ tools | tojson }}"
                                "{{ extra | default('') }}{{ reasoning_effort | default('') }}{% if add_generation_prompt %}<assistant>{% endif %}";
        static const char tt[] = "{% for m in messages %}{% if m.content is string or m.content is none %}{{ m.content }}{% else %}"
                                 "{% for b in m.content %}{% if b.type == 'thinking' %}{{ '[THINK]' + b.thinking + '[/THINK]' }}"
                                 "{% else %}{{ b.text }}{% endif %}{% endfor %}{% endif %}{% endfor %}";
        FZ_CHECK(nv_jinja_parse(t, sizeof t - 1, &prog) == NV_OK && nv_jinja_parse(tt, sizeof tt - 1, &prog_think) == NV_OK,
                 "the harness's templates: %s", nv_errmsg());
    }
    const nv_chat_template passes[] = {NV_CHAT_PLAIN, NV_CHAT_PLAIN, NV_CHAT_CHATML, NV_CHAT_LLAMA2, NV_CHAT_PLAIN};
    for (int pass = 0; pass < 5; pass++) {
        int chat = pass > 0;
        ctx.tmpl = passes[pass];
        ctx.jinja = pass != 4 ? NULL : size % 2 ? prog : prog_think;
        /* its calls written as XML or as one of Mistral's [ARGS] forms (by the body's length): the tools'
           schemas compiled to that form */
        ctx.jinja_tools = pass != 4 ? NV_TOOLS_HERMES : size % 2 ? NV_TOOLS_XML : size / 2 % 2 ? NV_TOOLS_MISTRAL_CALL_ID : NV_TOOLS_MISTRAL_ARGS;
        /* and Mistral's [THINK] blocks with its calls: grammars after them, earlier reasoning as thinking chunks */
        ctx.think_tags = ctx.reasoning = nv_tool_style_mistral_args(ctx.jinja_tools) ? NV_THINK_BRACKET : NV_THINK_ANGLE;
        nv_api_request r;
        nv_api_error err;
        int rc = nv_api_parse(&ctx, chat, (const char *)data, size, &r, &err);
        if (rc != 0) {
            FZ_CHECK(rc == err.status && rc >= 400 && rc < 600, "status %d / %d", rc, err.status);
            FZ_CHECK(err.message[0] != '\0', "error without a message");
            FZ_CHECK(r.prompt_ids == NULL && r.echo_text == NULL && r.stop_copy[0] == NULL, "failed parse kept memory");
            check_json(nv_api_error_json(&err), "error body");
            /* not JSON / not an object: the chat passes would say the same */
            if (err.code && !strcmp(err.code, "invalid_json")) break;
            continue;
        }
        const nv_adapter_mix *mix = &r.req.lora;
        FZ_CHECK(mix->n >= 0 && mix->n <= 2, "%d adapters of two", mix->n);
        for (int i = 0; i < mix->n; i++)
            FZ_CHECK((mix->k[i] == 1 || mix->k[i] == 3) && (!i || mix->k[i] > mix->k[i - 1]) && mix->factor[i] != 0.0f &&
                         fabsf(mix->factor[i]) <= NV_API_LORA_SCALE_MAX,
                     "adapter %d of the mix: number %d, factor %g", i, mix->k[i], (double)mix->factor[i]);
        check_request(&ctx, chat, &r);
        nv_api_request_free(&r);
    }
    ctx.jinja = NULL;
    check_anthropic(&ctx, (const char *)data, size);
    check_responses(&ctx, (const char *)data, size);
    check_llamacpp(&ctx, (const char *)data, size);
    check_ollama(&ctx, (const char *)data, size);
    /* and as POST /lora-adapters' body: all or nothing, then GET's list is JSON; reset for the next input */
    nv_api_error lerr;
    const int lrc = nv_api_lora_apply(&ctx, (const char *)data, size, &lerr);
    FZ_CHECK(lrc == 0 || (lrc == 400 && lrc == lerr.status && lerr.message[0]), "POST /lora-adapters: %d", lrc);
    nv_adapter_mix applied;
    nv_adapters_applied(&adapters, &applied);
    FZ_CHECK(lrc == 0 || applied.n == 0, "a refused list changed the factors");
    for (int i = 0; i < applied.n; i++)
        FZ_CHECK((applied.k[i] == 1 || applied.k[i] == 3) && applied.factor[i] != 0.0f, "applied adapter %d", applied.k[i]);
    check_json(nv_api_lora_list(&ctx), "GET /lora-adapters");
    nv_adapters_apply(&adapters, &(nv_adapter_mix){0});
    check_tool_parser((const char *)data, size);
    check_think((const char *)data, size);
    /* the same body as /tokenize and /detokenize: a valid JSON answer or an error with a message */
    for (int detok = 0; detok < 2; detok++) {
        char *out = NULL;
        nv_api_error err;
        int rc = (detok ? nv_api_detokenize : nv_api_tokenize)(&ctx, (const char *)data, size, &out, &err);
        if (rc != 0) {
            FZ_CHECK(rc == err.status && rc >= 400 && rc < 600 && err.message[0] != '\0' && out == NULL, "%s status %d",
                     detok ? "detokenize" : "tokenize", rc);
            check_json(nv_api_error_json(&err), "error body");
        } else {
            check_json(out, detok ? "detokenize body" : "tokenize body");
        }
    }
    /* as /apply-template under each template: an object with the prompt's text, or an error */
    for (int t = NV_CHAT_PLAIN; t <= NV_CHAT_DEEPSEEK + 1; t++) { /* (+1: the Jinja template) */
        char *out = NULL;
        nv_api_error err;
        ctx.tmpl = t > NV_CHAT_DEEPSEEK ? NV_CHAT_PLAIN : (nv_chat_template)t;
        ctx.jinja = t > NV_CHAT_DEEPSEEK ? prog : NULL;
        int rc = nv_api_apply_template(&ctx, (const char *)data, size, &out, &err);
        if (rc != 0) {
            FZ_CHECK(rc == err.status && rc >= 400 && rc < 600 && err.message[0] != '\0' && out == NULL, "apply-template status %d", rc);
            check_json(nv_api_error_json(&err), "error body");
            if (err.code && !strcmp(err.code, "invalid_json")) break;
        } else {
            cJSON *j = cJSON_Parse(out);
            FZ_CHECK(j && cJSON_IsString(cJSON_GetObjectItem(j, "prompt")), "apply-template body %s", out);
            cJSON_Delete(j);
            free(out);
        }
    }
    ctx.jinja = NULL;
    /* and as /v1/embeddings: every input checked, the answer for zero vectors valid JSON */
    nv_api_embed em;
    nv_api_error err;
    int rc = nv_api_embed_parse(&ctx, (const char *)data, size, &em, &err);
    if (rc != 0) {
        FZ_CHECK(rc == err.status && rc >= 400 && rc < 600 && err.message[0] != '\0' && em.ids == NULL, "embeddings status %d", rc);
        check_json(nv_api_error_json(&err), "error body");
    } else {
        FZ_CHECK(em.n >= 1 && em.n <= NV_MAX_EMBED_INPUTS, "embeddings: %d inputs", em.n);
        for (int i = 0; i < em.n; i++) {
            FZ_CHECK(em.n_ids[i] >= 1 && em.n_ids[i] <= FZ_SEQ_LEN && em.n_ids[i] <= FZ_CAPACITY, "input %d: %d ids", i, em.n_ids[i]);
            for (int t = 0; t < em.n_ids[i]; t++) FZ_CHECK(em.ids[i][t] >= 0 && em.ids[i][t] < FZ_VOCAB, "input %d: id out of range", i);
        }
        FZ_CHECK(em.dims >= 0 && em.dims < ctx.dim && (!em.dims || ctx.matryoshka), "dimensions %d", em.dims);
        float *zero = calloc((size_t)em.n * 64, sizeof(float));
        if (zero && em.dims) nv_api_embed_cut(zero, em.n, ctx.dim, em.dims);
        check_json(zero ? nv_api_embed_response(em.dims ? em.dims : ctx.dim, em.model, zero, em.n, em.base64, 1) : NULL, "embeddings body");
        free(zero);
        nv_api_embed_free(&em);
    }
    /* and as /v1/rerank, /v2/rerank and /v1/score, with a template prompt and with the chat template's
       (the vocabulary's "the" and "a" as the scored tokens) */
    static nv_rerank rk[2];
    if (!rk[0].n_tok) {
        FZ_CHECK(nv_rerank_init(&rk[0], tok, 0, "the,a", "Q: {query} D: {document} I: {instruction}", NULL) == NV_OK, "rerank: %s", nv_errmsg());
        FZ_CHECK(nv_rerank_init(&rk[1], tok, 0, "the,a", NULL, NULL) == NV_OK, "rerank: %s", nv_errmsg());
    }
    for (int k = 0; k < 6; k++) {
        nv_rerank_req rr;
        ctx.tmpl = k & 1 ? NV_CHAT_CHATML : NV_CHAT_PLAIN;
        rc = nv_rerank_parse(&ctx, &rk[k & 1], (nv_rerank_api)(k / 2), (const char *)data, size, &rr, &err);
        if (rc != 0) {
            FZ_CHECK(rc == err.status && rc >= 400 && rc < 600 && err.message[0] != '\0' && rr.ids == NULL, "rerank status %d", rc);
            check_json(nv_api_error_json(&err), "error body");
            continue;
        }
        FZ_CHECK(rr.n >= 1 && rr.n <= NV_RERANK_MAX_DOCS && rr.top_n >= 1 && rr.top_n <= rr.n, "rerank: %d pairs, top %d", rr.n, rr.top_n);
        float *rel = calloc((size_t)rr.n, sizeof(float));
        for (int i = 0; i < rr.n; i++) {
            FZ_CHECK(rr.n_ids[i] >= 1 && rr.n_ids[i] <= FZ_SEQ_LEN && rr.n_ids[i] <= FZ_CAPACITY && rr.docs[i], "pair %d: %d ids", i, rr.n_ids[i]);
            for (int t = 0; t < rr.n_ids[i]; t++) FZ_CHECK(rr.ids[i][t] >= 0 && rr.ids[i][t] < FZ_VOCAB, "pair %d: id out of range", i);
            if (rel) rel[i] = (float)((i * 37) % 11) / 10.0f;
        }
        check_json(rel ? nv_rerank_response(&rr, rel, 1) : NULL, "rerank body");
        free(rel);
        nv_rerank_req_free(&rr);
    }
    return 0;
}
