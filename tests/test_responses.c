/* OpenAI's Responses API: its requests become the chat requests /v1/chat/completions runs (the same
 * prompt tokens), its response objects and events have OpenAI's shapes, and a real `nerve serve`
 * answers /v1/responses whole and streamed with the text chat gives. */
#include <cjson/cJSON.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/responses.h"
#include "serve_util.h"
#include "t.h"
#include "tok_util.h"

/* Parses a Responses body; 0 or the status (the error's message in why). */
static int rparse(const nv_api_ctx *ctx, const char *body, nv_api_request *r, nv_resp_meta *m, nv_api_error *e) {
    return nv_resp_parse(ctx, NULL, NULL, body, strlen(body), r, m, e);
}

/* 1 when the Responses body and the chat body give the same prompt tokens. */
static int same_as_chat(const nv_api_ctx *ctx, const char *resp_body, const char *chat_body, char *why, size_t cap) {
    nv_api_request a, c;
    nv_resp_meta m;
    nv_api_error e;
    if (rparse(ctx, resp_body, &a, &m, &e)) {
        snprintf(why, cap, "responses: %d %.200s", e.status, e.message);
        return 0;
    }
    int ok = nv_api_parse(ctx, 1, chat_body, strlen(chat_body), &c, &e) == 0;
    snprintf(why, cap, "chat: %.200s", ok ? "" : e.message);
    if (ok) {
        ok = same_ids(a.req.prompt, a.req.n_prompt, c.req.prompt, c.req.n_prompt);
        snprintf(why, cap, "%d vs %d prompt tokens", a.req.n_prompt, c.req.n_prompt);
        nv_api_request_free(&c);
    }
    nv_api_request_free(&a), nv_resp_meta_free(&m);
    return ok;
}

static const char *R_TOOLS = "\"tools\":[{\"type\":\"function\",\"name\":\"play\",\"description\":\"Play\",\"parameters\":{\"type\":"
                             "\"object\",\"properties\":{\"toy\":{\"enum\":[\"ball\",\"car\"]}},\"required\":[\"toy\"]}}]";
static const char *C_TOOLS = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"play\",\"description\":\"Play\",\"parameters\":"
                             "{\"type\":\"object\",\"properties\":{\"toy\":{\"enum\":[\"ball\",\"car\"]}},\"required\":[\"toy\"]}}}]";

static void test_translation(void) {
    nv_tokenizer *tok = tok512();
    if (!tok) return;
    nv_api_ctx ctx = {.model_id = "m", .tok = tok, .tmpl = NV_CHAT_CHATML, .seq_len = 4096, .vocab_size = 512, .capacity = 4000, .reasoning = 0, .dim = 64};
    char r[4096], c[4096], why[256];
    snprintf(r, sizeof r,
             "{\"model\":\"m\",\"instructions\":\"Be kind.\",%s,\"input\":[{\"role\":\"developer\",\"content\":\"Short.\"},"
             "{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"Hi \"},{\"type\":\"input_text\","
             "\"text\":\"there\"}]},{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[]},{\"role\":\"assistant\",\"content\":"
             "[{\"type\":\"output_text\",\"text\":\"Let me see.\"}]},{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"play\","
             "\"arguments\":\"{\\\"toy\\\":\\\"car\\\"}\"},{\"type\":\"function_call\",\"call_id\":\"call_2\",\"name\":\"play\","
             "\"arguments\":\"{}\"},{\"type\":\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"vroom\"},"
             "{\"type\":\"function_call_output\",\"call_id\":\"call_2\",\"output\":[{\"type\":\"input_text\",\"text\":\"no\"}]},"
             "{\"role\":\"user\",\"content\":\"Again?\"}]}",
             R_TOOLS);
    snprintf(c, sizeof c,
             "{%s,\"messages\":[{\"role\":\"system\",\"content\":\"Be kind.\"},{\"role\":\"developer\",\"content\":\"Short.\"},"
             "{\"role\":\"user\",\"content\":\"Hi there\"},{\"role\":\"assistant\",\"content\":\"Let me see.\",\"tool_calls\":["
             "{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"play\",\"arguments\":\"{\\\"toy\\\":\\\"car\\\"}\"}},"
             "{\"id\":\"call_2\",\"type\":\"function\",\"function\":{\"name\":\"play\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\","
             "\"tool_call_id\":\"call_1\",\"content\":\"vroom\"},{\"role\":\"tool\",\"tool_call_id\":\"call_2\",\"content\":\"no\"},"
             "{\"role\":\"user\",\"content\":\"Again?\"}]}",
             C_TOOLS);
    T_CHECK(same_as_chat(&ctx, r, c, why, sizeof why), "a conversation with calls: %s", why);
    T_CHECK(same_as_chat(&ctx, "{\"input\":\"Hi\"}", "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", why, sizeof why),
            "a string input: %s", why);
    /* tool_choice and text.format become grammars; reasoning.effort none turns a reasoning model's thinking off */
    const char *grammars[] = {"\"tool_choice\":\"required\"", "\"tool_choice\":{\"type\":\"function\",\"name\":\"play\"}"};
    for (int i = 0; i < 2; i++) {
        snprintf(r, sizeof r, "{\"input\":\"Hi\",%s,%s}", R_TOOLS, grammars[i]);
        nv_api_request q;
        nv_resp_meta m;
        nv_api_error e;
        T_CHECK(rparse(&ctx, r, &q, &m, &e) == 0 && q.req.grammar && q.tools, "%s: %s", grammars[i], e.message);
        nv_api_request_free(&q), nv_resp_meta_free(&m);
    }
    nv_api_request q;
    nv_resp_meta m;
    nv_api_error e;
    T_CHECK(rparse(&ctx,
                   "{\"input\":\"Hi\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"k\",\"schema\":{\"type\":\"object\","
                   "\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},\"strict\":true}},\"max_output_tokens\":100000}",
                   &q, &m, &e) == 0 &&
                q.req.grammar && q.req.max_tokens == 4000 - q.req.n_prompt + 1,
            "json_schema and the max_output_tokens ceiling (the KV pool's 4,000 positions): %d, %s", q.req.max_tokens, e.message);
    nv_api_request_free(&q), nv_resp_meta_free(&m);
    ctx.reasoning = 1;
    T_CHECK(same_as_chat(&ctx, "{\"input\":\"Hi\",\"reasoning\":{\"effort\":\"none\"}}",
                         "{\"chat_template_kwargs\":{\"enable_thinking\":false},\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", why,
                         sizeof why) &&
                same_as_chat(&ctx, "{\"input\":\"Hi\",\"reasoning\":{\"effort\":\"high\"}}",
                             "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", why, sizeof why),
            "reasoning.effort: %s", why);
    nv_tokenizer_free(tok);
}

static void test_refusals(void) {
    nv_tokenizer *tok = tok512();
    if (!tok) return;
    nv_api_ctx ctx = {.model_id = "m", .tok = tok, .tmpl = NV_CHAT_CHATML, .seq_len = 4096, .vocab_size = 512, .capacity = 4000, .reasoning = 0, .dim = 64};
    const struct {
        const char *body, *param;
        int status;
    } cases[] = {
        {"{\"model\":\"m\"}", "input", 400},
        {"{\"input\":[]}", "input", 400},
        {"{\"input\":5}", "input", 400},
        {"{\"input\":\"x\",\"model\":\"gpt-5\"}", "model", 404},
        {"{\"input\":\"x\",\"previous_response_id\":\"resp_1\"}", "previous_response_id", 400},
        {"{\"input\":\"x\",\"conversation\":\"conv_1\"}", "conversation", 400},
        {"{\"input\":\"x\",\"background\":true}", "background", 400},
        {"{\"input\":[{\"type\":\"item_reference\",\"id\":\"msg_1\"}]}", "input[0]", 400},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":\"x\"}]}]}", "input[0].content", 400},
        {"{\"input\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "input[0]", 400},
        {"{\"input\":[{\"role\":\"user\"}]}", "input[0].content", 400},
        {"{\"input\":[{\"type\":\"function_call\",\"name\":\"a\"}]}", "input[0]", 400},
        {"{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\"}]}", "input[0]", 400},
        {"{\"input\":[{\"type\":\"web_search_call\"}]}", "input[0]", 400},
        {"{\"input\":[5]}", "input[0]", 400},
        {"{\"input\":\"x\",\"tools\":[5]}", "tools", 400},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\"}]}", "tools", 400},
        {"{\"input\":\"x\",\"tool_choice\":{\"type\":\"allowed_tools\"}}", "tool_choice", 400},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"yaml\"}}}", "text.format.type", 400},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"schema\":{\"type\":\"nope\"}}}}", "text.format.schema", 400},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}],\"tool_choice\":\"required\"}", "tool_choice", 400},
        {"{\"input\":\"x\",\"text\":5}", "text", 400},
        {"{\"input\":\"x\",\"max_output_tokens\":0}", "max_output_tokens", 400},
        {"{\"input\":\"x\",\"temperature\":3}", "temperature", 400},
        {"{\"input\":\"x\",\"instructions\":5}", "instructions", 400},
        {"{\"input\":\"x\",\"metadata\":[]}", "metadata", 400},
        {"{\"input\":\"x\",\"metadata\":{\"k\":1}}", "metadata", 400},
        {"{\"input\":[{\"role\":\"user\",\"content\":\"a\",\"id\":\"m1\"},{\"role\":\"user\",\"content\":\"b\",\"id\":\"m1\"}]}", "input", 400},
        {"{\"input\":\"x\",\"reasoning\":\"high\"}", "reasoning", 400},
        {"{\"input\":\"x\"", NULL, 400},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nv_api_request r;
        nv_resp_meta m;
        nv_api_error e;
        int rc = rparse(&ctx, cases[i].body, &r, &m, &e);
        T_CHECK(rc == cases[i].status && (!cases[i].param || !strcmp(e.param, cases[i].param)) && e.message[0] && !m.echo && !r.prompt_ids,
                "case %zu (%s): %d, param '%s': %s", i, cases[i].body, rc, e.param, e.message);
        if (!rc) nv_api_request_free(&r), nv_resp_meta_free(&m);
    }
    nv_tokenizer_free(tok);
}

/* The next event of an SSE text: its type, which the "event:" line must repeat, and its data. */
static cJSON *next_event(const char **p) {
    const char *ev = *p ? strstr(*p, "event: ") : NULL, *nl = ev ? strchr(ev, '\n') : NULL;
    if (!nl || strncmp(nl + 1, "data: ", 6)) return NULL;
    const char *json = nl + 7, *end = strstr(json, "\n\n");
    if (!end) return NULL;
    char *one = strndup(json, (size_t)(end - json));
    cJSON *data = cJSON_Parse(one);
    free(one);
    *p = end + 2;
    const char *type = cJSON_GetStringValue(cJSON_GetObjectItem(data, "type"));
    if (!type || strlen(type) != (size_t)(nl - ev - 7) || strncmp(type, ev + 7, strlen(type))) {
        cJSON_Delete(data);
        return NULL;
    }
    return data;
}

/* A stream put together as the SDKs do: event types, text deltas, arguments, the final response. */
typedef struct {
    char types[4096], text[4096], reasoning[1024], args[1024];
    cJSON *final;
    int ok; /* sequence numbers 0, 1, 2, ...; every event inside the item added at its output_index, with that
               item's id; a part added before its deltas; every .done equal to its item's deltas */
} rstream;

static void sum(const char *sse, rstream *s) {
    memset(s, 0, sizeof *s);
    s->ok = 1;
    cJSON *ev;
    int seq = 0, open = -1, part = 0;
    char id[96] = "", item[4096] = ""; /* the open item's id and its deltas */
    for (const char *p = sse; (ev = next_event(&p)); cJSON_Delete(ev)) {
        const char *t = cJSON_GetStringValue(cJSON_GetObjectItem(ev, "type"));
        const cJSON *idx = cJSON_GetObjectItem(ev, "output_index"), *sn = cJSON_GetObjectItem(ev, "sequence_number");
        const char *iid = cJSON_GetStringValue(cJSON_GetObjectItem(ev, "item_id"));
        const char *d = cJSON_GetStringValue(cJSON_GetObjectItem(ev, "delta"));
        s->ok &= sn && sn->valueint == seq++;
        strncat(s->types, t + (strncmp(t, "response.", 9) ? 0 : 9), sizeof s->types - strlen(s->types) - 2);
        strcat(s->types, " ");
        if (!strcmp(t, "response.output_item.added")) {
            s->ok &= open < 0 && idx != NULL;
            open = idx ? idx->valueint : -1;
            snprintf(id, sizeof id, "%s", cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(ev, "item"), "id")) ?: "");
            item[0] = '\0', part = 0;
        } else if (!strcmp(t, "response.output_item.done")) {
            s->ok &= idx && idx->valueint == open, open = -1;
        } else if (idx) {
            s->ok &= idx->valueint == open && iid && !strcmp(iid, id);
        }
        if (!strcmp(t, "response.content_part.added")) part = 1;
        if (strstr(t, ".delta")) {
            s->ok &= d != NULL && (part || strstr(t, "function_call"));
            strncat(item, d ?: "", sizeof item - strlen(item) - 1);
        }
        char *dst = !strcmp(t, "response.output_text.delta") ? s->text : !strcmp(t, "response.reasoning_text.delta") ? s->reasoning
                  : !strcmp(t, "response.function_call_arguments.delta") ? s->args : NULL;
        if (dst) strncat(dst, d ?: "", 1000 - strlen(dst));
        const char *done = !strcmp(t, "response.output_text.done") || !strcmp(t, "response.reasoning_text.done") ? "text"
                         : !strcmp(t, "response.function_call_arguments.done") ? "arguments" : NULL;
        if (done) s->ok &= !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(ev, done)) ?: "?", item);
        if (!strcmp(t, "response.completed") || !strcmp(t, "response.incomplete") || !strcmp(t, "response.failed")) {
            cJSON_Delete(s->final);
            s->final = cJSON_DetachItemFromObject(ev, "response");
        }
    }
    s->ok &= s->final != NULL && open < 0;
}

/* The text of a response's message items. */
static void output_text(const cJSON *resp, char *out, size_t cap) {
    out[0] = '\0';
    for (const cJSON *o = cJSON_GetObjectItem(resp, "output") ? cJSON_GetObjectItem(resp, "output")->child : NULL; o; o = o->next)
        for (const cJSON *c = cJSON_GetObjectItem(o, "content") ? cJSON_GetObjectItem(o, "content")->child : NULL; c; c = c->next)
            if (!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(c, "type")) ?: "", "output_text"))
                strncat(out, cJSON_GetStringValue(cJSON_GetObjectItem(c, "text")) ?: "", cap - strlen(out) - 1);
}

static void test_events(void) {
    nv_resp_meta m = {.id = "resp_0123456789abcdef01234567", .created = 5, .model = "m", .echo = cJSON_CreateObject()};
    nv_resp_stream st;
    nv_buf out = {0};
    nv_tool_call call = {.id = "call_abc", .name = "play", .arguments = "{\"toy\":\"car\"}"};
    nv_resp_stream_start(&st, &m, &out);
    nv_resp_stream_text(&st, 1, "hm", &out);
    nv_resp_stream_text(&st, 0, "Let ", &out);
    nv_resp_stream_text(&st, 0, "me.", &out);
    nv_resp_stream_call(&st, &call, &out);
    nv_resp_answer a = {.reasoning = "hm", .text = "Let me.", .calls = &call, .n_calls = 1, .prompt_tokens = 7, .cached_tokens = 4,
                        .output_tokens = 12};
    nv_resp_stream_end(&st, &a, &out, NULL);
    nv_resp_stream_free(&st);
    rstream s;
    sum(out.data, &s);
    T_CHECK(s.ok && !strcmp(s.types, "created in_progress output_item.added content_part.added reasoning_text.delta reasoning_text.done "
                                     "content_part.done output_item.done "
                                     "output_item.added content_part.added output_text.delta output_text.delta output_text.done "
                                     "content_part.done output_item.done output_item.added function_call_arguments.delta "
                                     "function_call_arguments.done output_item.done completed ") &&
                !strcmp(s.text, "Let me.") && !strcmp(s.reasoning, "hm") && !strcmp(s.args, call.arguments),
            "events: %s", out.data);
    /* the stream's final response is the whole response */
    char *whole = nv_resp_response(&m, &a, NULL);
    cJSON *w = cJSON_Parse(whole);
    T_CHECK(s.final && cJSON_Compare(cJSON_GetObjectItem(w, "output"), cJSON_GetObjectItem(s.final, "output"), 1) &&
                cJSON_Compare(cJSON_GetObjectItem(w, "usage"), cJSON_GetObjectItem(s.final, "usage"), 1),
            "whole %s vs streamed %s", whole, out.data);
    const cJSON *u = cJSON_GetObjectItem(w, "usage"), *o = cJSON_GetObjectItem(w, "output");
    T_CHECK(cJSON_GetObjectItem(u, "input_tokens")->valueint == 7 && cJSON_GetObjectItem(u, "total_tokens")->valueint == 19 &&
                cJSON_GetObjectItem(cJSON_GetObjectItem(u, "input_tokens_details"), "cached_tokens")->valueint == 4 &&
                cJSON_GetArraySize(o) == 3 && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(w, "status")), "completed") &&
                !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(o, 2), "call_id")), "call_abc"),
            "response: %s", whole);
    free(whole);
    cJSON_Delete(w);
    cJSON_Delete(s.final);
    nv_buf_free(&out);
    /* an empty answer still has its message; a limit makes the response incomplete */
    nv_resp_stream_start(&st, &m, &out);
    nv_resp_stream_end(&st, &(nv_resp_answer){.incomplete = 1, .prompt_tokens = 3}, &out, NULL);
    nv_resp_stream_free(&st);
    sum(out.data, &s);
    T_CHECK(s.ok && !strcmp(s.types, "created in_progress output_item.added content_part.added output_text.done content_part.done "
                                     "output_item.done incomplete ") &&
                !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(s.final, "incomplete_details"), "reason")),
                        "max_output_tokens"),
            "empty: %s", out.data);
    cJSON_Delete(s.final);
    nv_buf_free(&out);
    /* reasoning alone: its part, then an empty message, the same as the whole response */
    nv_resp_answer ra = {.reasoning = "hm", .text = "", .prompt_tokens = 3, .output_tokens = 2};
    nv_resp_stream_start(&st, &m, &out);
    nv_resp_stream_text(&st, 1, "hm", &out);
    nv_resp_stream_end(&st, &ra, &out, NULL);
    nv_resp_stream_free(&st);
    sum(out.data, &s);
    whole = nv_resp_response(&m, &ra, NULL);
    w = cJSON_Parse(whole);
    T_CHECK(s.ok && !strcmp(s.types, "created in_progress output_item.added content_part.added reasoning_text.delta reasoning_text.done "
                                     "content_part.done output_item.done output_item.added content_part.added output_text.done "
                                     "content_part.done output_item.done completed ") &&
                cJSON_Compare(cJSON_GetObjectItem(w, "output"), cJSON_GetObjectItem(s.final, "output"), 1),
            "reasoning alone: %s vs %s", whole, out.data);
    free(whole);
    cJSON_Delete(w);
    cJSON_Delete(s.final);
    nv_buf_free(&out);
    /* a failure part way keeps what was said, its item closed incomplete */
    nv_resp_stream_start(&st, &m, &out);
    nv_resp_stream_text(&st, 0, "Once", &out);
    nv_api_error e;
    nv_api_error_set(&e, 408, "timeout_error", "timeout", NULL, "too slow");
    nv_resp_stream_fail(&st, "failed", &e, &out, NULL);
    nv_resp_stream_free(&st);
    sum(out.data, &s);
    const cJSON *fo = cJSON_GetArrayItem(cJSON_GetObjectItem(s.final, "output"), 0);
    T_CHECK(s.ok && strstr(s.types, "output_item.done failed ") && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(s.final, "status")), "failed") &&
                !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(s.final, "error"), "code")), "timeout") &&
                !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(fo, "status")), "incomplete"),
            "failed: %s", out.data);
    cJSON_Delete(s.final);
    nv_buf_free(&out);
    cJSON_Delete(m.echo);
}

/* ---- a real server --------------------------------------------------------------------------- */

static server srv;

static int start(const char *name, const char *model, const char *tok) {
    if (server_spawn(&srv, name, NULL, NULL, model, tok, "--kv-memory 64M --chat-template chatml", 30)) return 1;
    T_CHECK(0, "the server %s did not start", name);
    return 0;
}

static void test_server(void) {
    const char *tok = t_data("models/tok512.bin"), *model = t_data("models/stories260K.bin");
    if (!tok || !model || !start("responses", model, tok)) return;
    resp r, c;
    char text[4096], ctext[4096];
    const char *rb = "{\"model\":\"stories260K\",\"instructions\":\"Tell a story.\",\"input\":\"Once upon a time\",\"max_output_tokens\":30,"
                     "\"temperature\":0%s}";
    char body[1024];
    snprintf(body, sizeof body, rb, "");
    T_CHECK(http(srv.port, "POST", "/v1/responses", NULL, body, &r) && r.status == 200, "whole: %d %s", r.status, r.body);
    cJSON *w = cJSON_Parse(r.body);
    output_text(w, text, sizeof text);
    T_CHECK(http(srv.port, "POST", "/v1/chat/completions", NULL,
                 "{\"max_tokens\":30,\"temperature\":0,\"messages\":[{\"role\":\"system\",\"content\":\"Tell a story.\"},{\"role\":\"user\","
                 "\"content\":\"Once upon a time\"}]}",
                 &c) &&
                c.status == 200,
            "chat: %d", c.status);
    cJSON *cj = cJSON_Parse(c.body);
    const cJSON *msg = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(cj, "choices"), 0), "message");
    snprintf(ctext, sizeof ctext, "%s", cJSON_GetStringValue(cJSON_GetObjectItem(msg, "content")) ?: "");
    const int prompt = cJSON_GetObjectItem(cJSON_GetObjectItem(cj, "usage"), "prompt_tokens")->valueint;
    const cJSON *u = cJSON_GetObjectItem(w, "usage");
    T_CHECK(*text && !strcmp(text, ctext) && cJSON_GetObjectItem(u, "input_tokens")->valueint == prompt &&
                !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(w, "status")) ?: "", "incomplete") &&
                !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(w, "instructions")) ?: "", "Tell a story.") &&
                !strncmp(cJSON_GetStringValue(cJSON_GetObjectItem(w, "id")) ?: "", "resp_", 5),
            "responses '%s' vs chat '%s': %s", text, ctext, r.body);
    cJSON_Delete(cj);
    resp_free(&r), resp_free(&c);
    snprintf(body, sizeof body, rb, ",\"stream\":true");
    T_CHECK(http(srv.port, "POST", "/v1/responses", NULL, body, &r) && r.status == 200 && strstr(r.head, "text/event-stream"),
            "stream: %d", r.status);
    rstream s;
    sum(r.body, &s);
    const cJSON *su = cJSON_GetObjectItem(s.final, "usage"); /* the same tokens; the prefix cache's share differs */
    T_CHECK(s.ok && !strcmp(s.text, text) && su &&
                cJSON_GetObjectItem(su, "input_tokens")->valueint == cJSON_GetObjectItem(u, "input_tokens")->valueint &&
                cJSON_GetObjectItem(su, "output_tokens")->valueint == cJSON_GetObjectItem(u, "output_tokens")->valueint &&
                !strncmp(s.types, "created in_progress output_item.added content_part.added output_text.delta", 74),
            "streamed '%s' vs '%s': %.500s", s.text, text, r.body);
    cJSON_Delete(s.final);
    cJSON_Delete(w);
    resp_free(&r);
    T_CHECK(http(srv.port, "POST", "/v1/responses", NULL, "{\"input\":\"x\",\"previous_response_id\":\"resp_1\"}", &r) && r.status == 400 &&
                strstr(r.body, "\"param\":\"previous_response_id\""),
            "previous_response_id: %d %s", r.status, r.body);
    resp_free(&r);
    T_CHECK(http(srv.port, "GET", "/v1/responses", NULL, NULL, &r) && r.status == 405, "GET: %d", r.status);
    resp_free(&r);
    int rc = server_stop_within(&srv, 20);
    T_CHECK(rc == 0, "server exit %d", rc);
}

/* A forced call on a random model with room for the tools, whole and streamed; its output goes back */
static void test_server_calls(void) {
    const char *tok = t_data("models/tok512.bin");
    if (!tok) return;
    char model[700], args[1024], body[4096];
    snprintf(model, sizeof model, "%s/resp-2k.bin", t_tmpdir());
    snprintf(args, sizeof args, "init --preset stories260K --seq-len 2048 --seed 7 -o '%s'", model);
    T_CHECK(t_nerve(args) == 0, "init failed");
    if (!start("responses-tools", model, tok)) return;
    resp r, c;
    snprintf(body, sizeof body, "{\"input\":\"Play?\",%s,\"tool_choice\":\"required\",\"max_output_tokens\":300,\"temperature\":0%%s}", R_TOOLS);
    char b2[4096];
    snprintf(b2, sizeof b2, body, "");
    T_CHECK(http(srv.port, "POST", "/v1/responses", NULL, b2, &r) && r.status == 200, "call: %d %s", r.status, r.body);
    cJSON *w = cJSON_Parse(r.body);
    const cJSON *fc = NULL;
    for (const cJSON *o = cJSON_GetObjectItem(w, "output") ? cJSON_GetObjectItem(w, "output")->child : NULL; o; o = o->next)
        if (!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(o, "type")) ?: "", "function_call")) fc = o;
    const char *fargs = cJSON_GetStringValue(cJSON_GetObjectItem(fc, "arguments"));
    cJSON *parsed = fargs ? cJSON_Parse(fargs) : NULL;
    const char *toy = cJSON_GetStringValue(cJSON_GetObjectItem(parsed, "toy"));
    T_CHECK(fc && toy && (!strcmp(toy, "ball") || !strcmp(toy, "car")) &&
                !strncmp(cJSON_GetStringValue(cJSON_GetObjectItem(fc, "call_id")) ?: "", "call_", 5) &&
                !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(w, "status")) ?: "", "completed"),
            "function_call: %s", r.body);
    cJSON_Delete(parsed);
    resp_free(&r);
    snprintf(b2, sizeof b2, body, ",\"stream\":true");
    T_CHECK(http(srv.port, "POST", "/v1/responses", NULL, b2, &r) && r.status == 200, "call stream: %d", r.status);
    rstream s;
    sum(r.body, &s);
    T_CHECK(s.ok && fargs && !strcmp(s.args, fargs) && strstr(s.types, "function_call_arguments.done output_item.done completed"),
            "streamed call '%s' vs '%s': %.600s", s.args, fargs ? fargs : "", r.body);
    cJSON_Delete(s.final);
    resp_free(&r);
    /* the output sent back: the chat conversation's prompt */
    snprintf(body, sizeof body,
             "{\"input\":[{\"role\":\"user\",\"content\":\"Play?\"},{\"type\":\"function_call\",\"call_id\":\"call_9\",\"name\":\"play\","
             "\"arguments\":\"{\\\"toy\\\":\\\"car\\\"}\"},{\"type\":\"function_call_output\",\"call_id\":\"call_9\",\"output\":\"vroom\"}],"
             "%s,\"max_output_tokens\":3,\"temperature\":0}",
             R_TOOLS);
    T_CHECK(http(srv.port, "POST", "/v1/responses", NULL, body, &r) && r.status == 200, "output: %d %s", r.status, r.body);
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Play?\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":"
             "\"call_9\",\"type\":\"function\",\"function\":{\"name\":\"play\",\"arguments\":\"{\\\"toy\\\":\\\"car\\\"}\"}}]},{\"role\":"
             "\"tool\",\"tool_call_id\":\"call_9\",\"content\":\"vroom\"}],%s,\"max_tokens\":3,\"temperature\":0}",
             C_TOOLS);
    T_CHECK(http(srv.port, "POST", "/v1/chat/completions", NULL, body, &c) && c.status == 200, "chat: %d %s", c.status, c.body);
    const char *pin = r.body ? strstr(r.body, "\"input_tokens\":") : NULL, *pc = c.body ? strstr(c.body, "\"prompt_tokens\":") : NULL;
    char rt[512] = "", ct[512] = "";
    cJSON *rj = cJSON_Parse(r.body), *cj = cJSON_Parse(c.body);
    output_text(rj, rt, sizeof rt);
    snprintf(ct, sizeof ct, "%s",
             cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(cj, "choices"), 0), "message"),
                                                      "content")) ?: "");
    T_CHECK(pin && pc && atoi(pin + 15) == atoi(pc + 16) && !strcmp(rt, ct), "function_call_output: %s / '%s' vs %s / '%s'",
            pin ? pin : "-", rt, pc ? pc : "-", ct);
    cJSON_Delete(rj), cJSON_Delete(cj);
    resp_free(&r), resp_free(&c);
    cJSON_Delete(w);
    int rc = server_stop_within(&srv, 20);
    T_CHECK(rc == 0, "server exit %d", rc);
}

/* The store alone: what is put comes back, the oldest goes first once the bytes pass the cap, a
 * response over a quarter of the cap is not kept, a deleted one is gone. */
static void test_store_unit(void) {
    nv_resp_store *st = NULL;
    T_CHECK(nv_resp_store_new(16384, &st) == NV_OK, "new");
    if (!st) return;
    char id[32], big[2048];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    for (int i = 0; i < 20; i++) { /* ~1.1 KB each: about fourteen fit in 16 KB */
        snprintf(id, sizeof id, "resp_%d", i);
        char *r = malloc(1100);
        snprintf(r, 1100, "{\"id\":\"%s\",\"pad\":\"%.1000s\"}", id, big);
        nv_resp_store_put(st, id, r, strdup("[]"), strdup("[1]"));
    }
    size_t count = 0, bytes = 0;
    nv_resp_store_stats(st, &count, &bytes);
    T_CHECK(count >= 12 && count <= 15 && bytes <= 16384, "%zu kept in %zu bytes", count, bytes);
    char *r = NULL, *c = NULL, *in = NULL;
    T_CHECK(nv_resp_store_copy(st, "resp_0", &r, &c, &in) == 0 && !r && !c && !in, "the oldest was not dropped");
    T_CHECK(nv_resp_store_copy(st, "resp_19", &r, &c, &in) == 1 && r && strstr(r, "resp_19") && !strcmp(c, "[]") && !strcmp(in, "[1]"),
            "the newest: %s", r ? r : "(none)");
    free(r), free(c), free(in);
    T_CHECK(nv_resp_store_copy(st, "resp_18", NULL, NULL, &in) == 1 && in && !strcmp(in, "[1]"), "one text only");
    free(in);
    nv_resp_store_put(st, "resp_big", strdup(big), strdup(big), strdup("[]")); /* 4 KB of text: over a quarter of the cap */
    T_CHECK(nv_resp_store_copy(st, "resp_big", NULL, NULL, NULL) == 0 && nv_resp_store_copy(st, "resp_19", NULL, NULL, NULL) == 1,
            "a response over a quarter of the cap was kept, or pushed the others out");
    T_CHECK(nv_resp_store_delete(st, "resp_19") == 1 && nv_resp_store_delete(st, "resp_19") == 0 &&
                nv_resp_store_copy(st, "resp_19", NULL, NULL, NULL) == 0,
            "delete");
    nv_resp_store_free(st);
}

static double usage_of(const cJSON *o, const char *a, const char *b) {
    const cJSON *u = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), a);
    return b ? cJSON_GetObjectItem(u, b) ? cJSON_GetObjectItem(u, b)->valuedouble : -1 : u ? u->valuedouble : -1;
}

/* previous_response_id continues a kept response (the prompt is the chat conversation's, its
 * prefix a cache hit), GET returns what was answered, input_items lists and pages, store false and
 * DELETE forget, a streamed response is kept as its final event has it. */
static void test_server_stored(void) {
    const char *tok = t_data("models/tok512.bin"), *model = t_data("models/stories260K.bin");
    if (!tok || !model || !start("responses-store", model, tok)) return;
    resp r, g, c;
    char body[4096], id1[64] = "", id2[64] = "", text1[2048] = "", text2[2048] = "", path[256];
    T_CHECK(http(srv.port, "POST", "/v1/responses", NULL,
                 "{\"input\":[{\"role\":\"user\",\"content\":\"Once upon a time\"},{\"role\":\"assistant\",\"content\":\"there was\"},"
                 "{\"role\":\"user\",\"content\":\"a cat\"}],\"max_output_tokens\":12,\"temperature\":0}",
                 &r) && r.status == 200,
            "first: %d %s", r.status, r.body);
    cJSON *w = cJSON_Parse(r.body);
    snprintf(id1, sizeof id1, "%s", cJSON_GetStringValue(cJSON_GetObjectItem(w, "id")) ?: "");
    output_text(w, text1, sizeof text1);
    T_CHECK(cJSON_IsTrue(cJSON_GetObjectItem(w, "store")) && cJSON_IsNull(cJSON_GetObjectItem(w, "previous_response_id")) && *text1,
            "store echoed: %s", r.body);
    cJSON_Delete(w);
    snprintf(path, sizeof path, "/v1/responses/%s", id1);
    T_CHECK(http(srv.port, "GET", path, NULL, NULL, &g) && g.status == 200 && r.body && g.body && !strcmp(g.body, r.body),
            "GET gives %d %.300s, the answer was %.300s", g.status, g.body, r.body);
    resp_free(&g);
    resp_free(&r);
    T_CHECK(http(srv.port, "GET", "/metrics", NULL, NULL, &g) && g.status == 200 && strstr(g.body, "\nnerve_responses_stored 1\n") &&
                strstr(g.body, "\nnerve_responses_stored_bytes "),
            "metrics: %.2000s", g.body);
    resp_free(&g);
    /* continued: the earlier items, the answer, then the new input, as the chat request of all of them */
    snprintf(body, sizeof body, "{\"previous_response_id\":\"%s\",\"input\":\"The end?\",\"max_output_tokens\":8,\"temperature\":0}", id1);
    T_CHECK(http(srv.port, "POST", "/v1/responses", NULL, body, &r) && r.status == 200, "continued: %d %s", r.status, r.body);
    w = cJSON_Parse(r.body);
    snprintf(id2, sizeof id2, "%s", cJSON_GetStringValue(cJSON_GetObjectItem(w, "id")) ?: "");
    output_text(w, text2, sizeof text2);
    T_CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(w, "previous_response_id")) ?: "", id1), "previous_response_id echoed: %s", r.body);
    cJSON *esc = cJSON_CreateString(text1);
    char *esc_text = cJSON_PrintUnformatted(esc);
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"},{\"role\":\"assistant\",\"content\":\"there was\"},"
             "{\"role\":\"user\",\"content\":\"a cat\"},{\"role\":\"assistant\",\"content\":%s},{\"role\":\"user\",\"content\":"
             "\"The end?\"}],\"max_tokens\":8,\"temperature\":0}",
             esc_text);
    free(esc_text), cJSON_Delete(esc);
    T_CHECK(http(srv.port, "POST", "/v1/chat/completions", NULL, body, &c) && c.status == 200, "chat: %d %s", c.status, c.body);
    cJSON *cj = cJSON_Parse(c.body);
    const char *ctext = cJSON_GetStringValue(
        cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(cj, "choices"), 0), "message"), "content"));
    T_CHECK(usage_of(w, "input_tokens", NULL) == usage_of(cj, "prompt_tokens", NULL) && ctext && !strcmp(ctext, text2),
            "continued prompt %g tokens '%s', the chat conversation %g '%s'", usage_of(w, "input_tokens", NULL), text2,
            usage_of(cj, "prompt_tokens", NULL), ctext ? ctext : "");
    T_CHECK(usage_of(w, "input_tokens_details", "cached_tokens") >= 16, "the first response's prompt was not a cache hit: %s", r.body);
    cJSON_Delete(cj), cJSON_Delete(w);
    resp_free(&r), resp_free(&c);
    /* input_items: the request's own items, newest first by default, with ids; paged */
    snprintf(path, sizeof path, "/v1/responses/%s/input_items", id2);
    T_CHECK(http(srv.port, "GET", path, NULL, NULL, &g) && g.status == 200, "input_items: %d %s", g.status, g.body);
    cJSON *l = cJSON_Parse(g.body);
    const cJSON *d0 = cJSON_GetArrayItem(cJSON_GetObjectItem(l, "data"), 0);
    T_CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(l, "data")) == 1 && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(l, "object")) ?: "", "list") &&
                !strncmp(cJSON_GetStringValue(cJSON_GetObjectItem(d0, "id")) ?: "", "msg_", 4) &&
                !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(d0, "content"), 0), "text")) ?: "", "The end?") &&
                cJSON_IsFalse(cJSON_GetObjectItem(l, "has_more")),
            "input_items of the continuation: %s", g.body);
    cJSON_Delete(l);
    resp_free(&g);
    char page[3][64] = {{0}};
    snprintf(path, sizeof path, "/v1/responses/%s/input_items?limit=2", id1);
    T_CHECK(http(srv.port, "GET", path, NULL, NULL, &g) && g.status == 200, "page 1: %d %s", g.status, g.body);
    l = cJSON_Parse(g.body);
    for (int k = 0; k < 2; k++)
        snprintf(page[k], sizeof page[k], "%s", cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(l, "data"), k), "id")) ?: "");
    T_CHECK(cJSON_IsTrue(cJSON_GetObjectItem(l, "has_more")) &&
                !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(l, "last_id")) ?: "", page[1]) &&
                !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(l, "data"), 0), "role")) ?: "", "user"),
            "page 1 (newest first): %s", g.body);
    cJSON_Delete(l);
    resp_free(&g);
    snprintf(path, sizeof path, "/v1/responses/%s/input_items?limit=2&after=%s", id1, page[1]);
    T_CHECK(http(srv.port, "GET", path, NULL, NULL, &g) && g.status == 200, "page 2: %d %s", g.status, g.body);
    l = cJSON_Parse(g.body);
    snprintf(page[2], sizeof page[2], "%s", cJSON_GetStringValue(cJSON_GetObjectItem(l, "first_id")) ?: "");
    const cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItem(l, "data"), 0);
    T_CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(l, "data")) == 1 && cJSON_IsFalse(cJSON_GetObjectItem(l, "has_more")) && *page[2] &&
                strcmp(page[2], page[0]) && strcmp(page[2], page[1]) &&
                !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(first, "content"), 0), "text")) ?: "",
                        "Once upon a time"),
            "page 2: %s", g.body);
    cJSON_Delete(l);
    resp_free(&g);
    snprintf(path, sizeof path, "/v1/responses/%s/input_items?order=asc&limit=1", id1);
    T_CHECK(http(srv.port, "GET", path, NULL, NULL, &g) && g.status == 200 && strstr(g.body, page[2]) && strstr(g.body, "\"has_more\":true"),
            "asc: %d %s", g.status, g.body);
    resp_free(&g);
    const char *bad_queries[] = {"limit=0", "limit=101", "limit=x", "order=up", "after=msg_nope"};
    for (int k = 0; k < 5; k++) {
        snprintf(path, sizeof path, "/v1/responses/%s/input_items?%s", id1, bad_queries[k]);
        T_CHECK(http(srv.port, "GET", path, NULL, NULL, &g) && g.status == 400, "%s: %d %s", bad_queries[k], g.status, g.body);
        resp_free(&g);
    }
    /* a streamed continuation is kept as its response.completed event gives it */
    snprintf(body, sizeof body, "{\"previous_response_id\":\"%s\",\"input\":\"More.\",\"max_output_tokens\":5,\"stream\":true}", id2);
    T_CHECK(http(srv.port, "POST", "/v1/responses", NULL, body, &r) && r.status == 200, "stream: %d", r.status);
    rstream s;
    sum(r.body, &s);
    char *final = cJSON_PrintUnformatted(s.final);
    snprintf(path, sizeof path, "/v1/responses/%s", cJSON_GetStringValue(cJSON_GetObjectItem(s.final, "id")) ?: "none");
    T_CHECK(s.ok && final && http(srv.port, "GET", path, NULL, NULL, &g) && g.status == 200 && !strcmp(g.body, final),
            "the streamed response kept: %d %.300s against %.300s", g.status, g.body, final ? final : "");
    free(final);
    cJSON_Delete(s.final);
    resp_free(&g), resp_free(&r);
    /* kept as the model sees it: an item's other fields and reasoning items are left out */
    T_CHECK(http(srv.port, "POST", "/v1/responses", NULL,
                 "{\"input\":[{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[],\"encrypted_content\":\"zzzz\"},"
                 "{\"role\":\"user\",\"content\":\"hi\",\"extra\":\"junk\"}],\"max_output_tokens\":2}",
                 &r) && r.status == 200,
            "with a reasoning item: %d %s", r.status, r.body);
    w = cJSON_Parse(r.body);
    snprintf(path, sizeof path, "/v1/responses/%s/input_items", cJSON_GetStringValue(cJSON_GetObjectItem(w, "id")) ?: "none");
    T_CHECK(http(srv.port, "GET", path, NULL, NULL, &g) && g.status == 200 && !strstr(g.body, "junk") && !strstr(g.body, "zzzz") &&
                strstr(g.body, "\"text\":\"hi\"") && strstr(g.body, "\"role\":\"user\""),
            "kept items: %s", g.body);
    cJSON_Delete(w);
    resp_free(&g), resp_free(&r);
    /* store false: answered, not kept */
    T_CHECK(http(srv.port, "POST", "/v1/responses", NULL, "{\"input\":\"x\",\"store\":false,\"max_output_tokens\":2}", &r) && r.status == 200 &&
                strstr(r.body, "\"store\":false"),
            "store false: %d %s", r.status, r.body);
    w = cJSON_Parse(r.body);
    snprintf(path, sizeof path, "/v1/responses/%s", cJSON_GetStringValue(cJSON_GetObjectItem(w, "id")) ?: "none");
    T_CHECK(http(srv.port, "GET", path, NULL, NULL, &g) && g.status == 404, "store false then GET: %d", g.status);
    resp_free(&g);
    snprintf(body, sizeof body, "{\"previous_response_id\":\"%s\",\"input\":\"x\"}", cJSON_GetStringValue(cJSON_GetObjectItem(w, "id")) ?: "none");
    T_CHECK(http(srv.port, "POST", "/v1/responses", NULL, body, &g) && g.status == 400 && strstr(g.body, "previous_response_not_found") &&
                strstr(g.body, "\"param\":\"previous_response_id\""),
            "continuing a response not kept: %d %s", g.status, g.body);
    cJSON_Delete(w);
    resp_free(&g), resp_free(&r);
    /* DELETE: gone, a second time 404; what continued from it stands alone */
    snprintf(path, sizeof path, "/v1/responses/%s", id1);
    T_CHECK(http(srv.port, "DELETE", path, NULL, NULL, &g) && g.status == 200 && strstr(g.body, "\"deleted\":true") && strstr(g.body, id1),
            "DELETE: %d %s", g.status, g.body);
    resp_free(&g);
    T_CHECK(http(srv.port, "GET", path, NULL, NULL, &g) && g.status == 404 && strstr(g.body, id1), "GET after DELETE: %d %s", g.status, g.body);
    resp_free(&g);
    T_CHECK(http(srv.port, "DELETE", path, NULL, NULL, &g) && g.status == 404, "DELETE twice: %d", g.status);
    resp_free(&g);
    snprintf(body, sizeof body, "{\"previous_response_id\":\"%s\",\"input\":\"The end?\",\"max_output_tokens\":8,\"temperature\":0,\"store\":false}", id1);
    T_CHECK(http(srv.port, "POST", "/v1/responses", NULL, body, &r) && r.status == 400, "continuing a deleted response: %d", r.status);
    resp_free(&r);
    snprintf(path, sizeof path, "/v1/responses/%s", id2);
    T_CHECK(http(srv.port, "PUT", path, NULL, "{}", &g) && g.status == 405 && strstr(g.head, "GET, DELETE"), "PUT: %d %s", g.status, g.head);
    resp_free(&g);
    snprintf(path, sizeof path, "/v1/responses/%s/cancel", id2);
    T_CHECK(http(srv.port, "POST", path, NULL, "{}", &g) && g.status == 400 && strstr(g.body, "'background': true"), "cancel: %d", g.status);
    resp_free(&g);
    int rc = server_stop_within(&srv, 20);
    T_CHECK(rc == 0, "server exit %d", rc);
}

/* A response's field as a string ("" when absent). */
static const char *field_str(const cJSON *o, const char *k) { return cJSON_GetStringValue(cJSON_GetObjectItem(o, k)) ?: ""; }

/* POST /v1/responses with body: the status, the id into id, the response's status into st. */
static int post_response(const char *body, char id[64], char st[32]) {
    resp r;
    const int code = http(srv.port, "POST", "/v1/responses", NULL, body, &r) ? r.status : 0;
    cJSON *w = cJSON_Parse(r.body ? r.body : "");
    snprintf(id, 64, "%s", field_str(w, "id"));
    snprintf(st, 32, "%s", code == 200 ? field_str(w, "status") : field_str(cJSON_GetObjectItem(w, "error"), "param"));
    cJSON_Delete(w);
    resp_free(&r);
    return code;
}

/* GET /v1/responses/{id} (NULL unless 200). */
static cJSON *get_response(const char *id) {
    char path[128];
    snprintf(path, sizeof path, "/v1/responses/%s", id);
    resp g;
    cJSON *w = http(srv.port, "GET", path, NULL, NULL, &g) && g.status == 200 ? cJSON_Parse(g.body) : NULL;
    resp_free(&g);
    return w;
}

/* Polls response id until its status is none of queued and in_progress (up to wait_s): the last
 * object read; *seen gets a bit for each status met (1 queued, 2 in_progress). */
static cJSON *wait_response(const char *id, double wait_s, int *seen) {
    cJSON *w = NULL;
    for (double t0 = now_s(); now_s() - t0 < wait_s; sleep_ms(5)) {
        cJSON_Delete(w);
        w = get_response(id);
        const char *st = field_str(w, "status");
        *seen |= (strcmp(st, "queued") == 0) | (strcmp(st, "in_progress") == 0) << 1;
        if (w && strcmp(st, "queued") && strcmp(st, "in_progress")) break;
    }
    return w;
}

/* Sends method path (body: NULL for none) on a new connection: its socket, -1 when that failed. */
static int open_stream(const char *method, const char *path, const char *body) {
    size_t len;
    char *req = build_request(method, path, NULL, body, &len);
    int fd = req ? connect_to_within(srv.port, 10) : -1;
    if (fd >= 0 && !send_all(fd, req, len)) close(fd), fd = -1;
    free(req);
    return fd;
}

/* Reads fd onto the end of got (cap bytes, kept NUL-ended) until got holds needle, or with needle
 * NULL until the server closes the connection, up to wait_s: 1 when it did. */
static int read_until(int fd, char *got, size_t cap, const char *needle, double wait_s) {
    size_t n = strlen(got);
    for (double t0 = now_s(); fd >= 0 && n < cap - 1 && now_s() - t0 < wait_s;) {
        if (needle && strstr(got, needle)) return 1;
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) continue;
        const ssize_t k = recv(fd, got + n, cap - 1 - n, 0);
        if (k <= 0) return !needle && k == 0;
        n += (size_t)k;
        got[n] = '\0';
    }
    return needle && strstr(got, needle);
}

/* Opens a stream of POST path with body, reads until its bytes hold needle (up to wait_s), then
 * hangs up: what came (NULL when the needle did not). */
static char *stream_until(const char *path, const char *body, const char *needle, double wait_s) {
    const int fd = open_stream("POST", path, body);
    char *got = calloc(1, 65536);
    const int found = got && read_until(fd, got, 65536, needle, wait_s);
    if (fd >= 0) close(fd);
    if (!found) free(got);
    return found ? got : NULL;
}

/* The id of the first response object in sse ("" when none). */
static void sse_id(const char *sse, char id[64]) {
    const char *at = sse ? strstr(sse, "\"id\":\"resp_") : NULL;
    snprintf(id, 64, "%.*s", at ? (int)strcspn(at + 6, "\"") : 0, at ? at + 6 : "");
}

/* The events of sse from the one whose sequence_number is n on (NULL: none). */
static const char *from_event(const char *sse, int n) {
    char key[48];
    snprintf(key, sizeof key, "\"sequence_number\":%d,", n);
    const char *at = sse ? strstr(sse, key) : NULL;
    while (at && at > sse && strncmp(at, "event: ", 7)) at--;
    return at;
}

/* Background streams: POST with stream: true gives its events; GET ?stream=true replays the log
 * whole, starting_after=N from event N+1, the same bytes; the last event's response is the one
 * kept; a client that hangs up stops nothing and resumes where it left; a stream follows a cancel
 * to its end; refusals. */
static void background_streams(const char *fg_text) {
    char id[64], path[256];
    static const char body[] = "{\"input\":\"Once upon a time\",\"max_output_tokens\":40,\"temperature\":0,\"background\":true,\"stream\":true}";
    resp r, g;
    T_CHECK(http(srv.port, "POST", "/v1/responses", NULL, body, &r) && r.status == 200 && r.head && strstr(r.head, "text/event-stream"),
            "stream: %d", r.status);
    rstream s;
    sum(r.body ? r.body : "", &s);
    char text[2048] = "";
    output_text(s.final, text, sizeof text);
    T_CHECK(s.ok && !strncmp(s.types, "created queued in_progress output_item.added content_part.added output_text.delta ", 82) &&
                strstr(s.types, "output_text.done content_part.done output_item.done incomplete ") && !strcmp(s.text, fg_text) &&
                !strcmp(text, fg_text),
            "events: %s / '%s'", s.types, s.text);
    snprintf(id, sizeof id, "%s", field_str(s.final, "id"));
    cJSON *w = get_response(id);
    char *kept = cJSON_PrintUnformatted(w), *last = cJSON_PrintUnformatted(s.final);
    T_CHECK(kept && last && !strcmp(kept, last), "kept %.200s, streamed %.200s", kept ? kept : "", last ? last : "");
    free(kept), free(last), cJSON_Delete(w), cJSON_Delete(s.final);
    /* replayed after its end: the same bytes; from an event on; past the last, nothing */
    snprintf(path, sizeof path, "/v1/responses/%s?stream=true", id);
    T_CHECK(http(srv.port, "GET", path, NULL, NULL, &g) && g.status == 200 && r.body && g.body && !strcmp(g.body, r.body), "replay: %d",
            g.status);
    resp_free(&g);
    snprintf(path, sizeof path, "/v1/responses/%s?stream=true&starting_after=5", id);
    const char *sixth = from_event(r.body, 6);
    T_CHECK(sixth && http(srv.port, "GET", path, NULL, NULL, &g) && g.status == 200 && g.body && !strcmp(g.body, sixth),
            "from event 6: %.200s", g.body ? g.body : "");
    resp_free(&g);
    snprintf(path, sizeof path, "/v1/responses/%s?stream=true&starting_after=100000", id);
    T_CHECK(http(srv.port, "GET", path, NULL, NULL, &g) && g.status == 200 && (!g.body || !*g.body), "past the end: %d", g.status);
    resp_free(&g), resp_free(&r);
    const char *bad[] = {"stream=yes", "stream=true&starting_after=-1", "stream=true&starting_after=x", "stream=true&starting_after="};
    for (int k = 0; k < 4; k++) {
        snprintf(path, sizeof path, "/v1/responses/%s?%s", id, bad[k]);
        T_CHECK(http(srv.port, "GET", path, NULL, NULL, &g) && g.status == 400 && strstr(g.body, "invalid_value"), "%s: %d", bad[k], g.status);
        resp_free(&g);
    }

    /* the client hangs up after event 6, a delta: the response runs on; resumed after event 5 while it runs, it is whole */
    char *first = stream_until("/v1/responses", body, "\"sequence_number\":6,", 20);
    sse_id(first, id);
    w = get_response(id);
    T_CHECK(first && *id && w && strstr(first, "response.output_text.delta") &&
                (!strcmp(field_str(w, "status"), "in_progress") || !strcmp(field_str(w, "status"), "queued")),
            "hung up: %s %s", id, field_str(w, "status"));
    cJSON_Delete(w);
    snprintf(path, sizeof path, "/v1/responses/%s?stream=true&starting_after=5", id);
    T_CHECK(http(srv.port, "GET", path, NULL, NULL, &g) && g.status == 200 && g.body && !strncmp(g.body, "event: ", 7) &&
                strstr(g.body, "\"sequence_number\":6,"),
            "resumed: %d", g.status);
    snprintf(path, sizeof path, "/v1/responses/%s?stream=true", id);
    T_CHECK(http(srv.port, "GET", path, NULL, NULL, &r) && r.status == 200 && g.body && r.body && !strcmp(from_event(r.body, 6) ?: "", g.body),
            "the resumed events against the replay");
    sum(r.body ? r.body : "", &s);
    output_text(s.final, text, sizeof text);
    T_CHECK(s.ok && !strcmp(s.text, fg_text) && !strcmp(text, fg_text) && !strcmp(field_str(s.final, "status"), "incomplete"),
            "after a hang-up: '%s'", s.text);
    cJSON_Delete(s.final);
    free(first);
    resp_free(&g), resp_free(&r);

    /* a stream that follows a response cancelled: its end says so (response.failed, status cancelled) */
    static const char long_body[] = "{\"input\":\"Once upon a time\",\"max_output_tokens\":400,\"temperature\":0,\"background\":true,\"stream\":true}";
    first = stream_until("/v1/responses", long_body, "response.output_text.delta", 20);
    sse_id(first, id);
    snprintf(path, sizeof path, "/v1/responses/%s/cancel", id);
    T_CHECK(*id && http(srv.port, "POST", path, NULL, NULL, &g) && g.status == 200 && strstr(g.body, "\"status\":\"cancelled\""), "cancel");
    resp_free(&g);
    snprintf(path, sizeof path, "/v1/responses/%s?stream=true", id);
    T_CHECK(http(srv.port, "GET", path, NULL, NULL, &r) && r.status == 200, "the cancelled one's events");
    sum(r.body ? r.body : "", &s);
    const size_t nt = strlen(s.types);
    T_CHECK(s.ok && nt > 24 && !strcmp(s.types + nt - 24, "output_item.done failed ") &&
                !strcmp(field_str(s.final, "status"), "cancelled") && cJSON_IsNull(cJSON_GetObjectItem(s.final, "error")),
            "cancelled: %s", s.types);
    w = get_response(id);
    kept = cJSON_PrintUnformatted(w), last = cJSON_PrintUnformatted(s.final);
    T_CHECK(kept && last && !strcmp(kept, last), "the cancelled one kept as streamed: %.200s", kept ? kept : "");
    free(kept), free(last), cJSON_Delete(w), cJSON_Delete(s.final), free(first);
    resp_free(&r);
    /* deleted: its events go with it; a response not in the background has none; an unknown one is 404 */
    snprintf(path, sizeof path, "/v1/responses/%s", id);
    T_CHECK(http(srv.port, "DELETE", path, NULL, NULL, &g) && g.status == 200, "delete");
    resp_free(&g);
    snprintf(path, sizeof path, "/v1/responses/%s?stream=true", id);
    T_CHECK(http(srv.port, "GET", path, NULL, NULL, &g) && g.status == 404, "deleted then streamed: %d", g.status);
    resp_free(&g);
    T_CHECK(http(srv.port, "POST", "/v1/responses", NULL, "{\"input\":\"x\",\"max_output_tokens\":2}", &r) && r.status == 200, "foreground");
    w = cJSON_Parse(r.body ? r.body : "");
    snprintf(path, sizeof path, "/v1/responses/%s?stream=true", field_str(w, "id"));
    T_CHECK(http(srv.port, "GET", path, NULL, NULL, &g) && g.status == 400 && strstr(g.body, "\"param\":\"stream\""), "foreground streamed: %d %s",
            g.status, g.body);
    cJSON_Delete(w), resp_free(&g), resp_free(&r);
    T_CHECK(http(srv.port, "GET", "/v1/responses/resp_000000000000000000000000?stream=true", NULL, NULL, &g) && g.status == 404, "unknown: %d",
            g.status);
    resp_free(&g);

    /* three streams follow one response at once (its creator's, one from the start, one after event
       3); a DELETE meanwhile: each goes on to the end, the response cancelled; then nothing of it is kept */
    enum { CAP = 1 << 17 };
    char *got[3] = {calloc(1, CAP), calloc(1, CAP), calloc(1, CAP)};
    int fd[3] = {open_stream("POST", "/v1/responses", long_body), -1, -1};
    T_CHECK(got[0] && got[1] && got[2] && read_until(fd[0], got[0], CAP, "\"sequence_number\":6,", 20), "the creator's stream");
    sse_id(got[0], id);
    snprintf(path, sizeof path, "/v1/responses/%s?stream=true", id);
    fd[1] = open_stream("GET", path, NULL);
    snprintf(path, sizeof path, "/v1/responses/%s?stream=true&starting_after=3", id);
    fd[2] = open_stream("GET", path, NULL);
    for (int k = 1; k < 3; k++) T_CHECK(read_until(fd[k], got[k], CAP, "\"sequence_number\":8,", 20), "stream %d follows", k);
    snprintf(path, sizeof path, "/v1/responses/%s", id);
    T_CHECK(http(srv.port, "DELETE", path, NULL, NULL, &g) && g.status == 200, "deleted while followed: %d", g.status);
    resp_free(&g);
    for (int k = 0; k < 3; k++) {
        T_CHECK(read_until(fd[k], got[k], CAP, NULL, 20) && strstr(got[k], "event: response.failed") && strstr(got[k], "\"status\":\"cancelled\"") &&
                    (k == 2) == !strstr(got[k], "\"sequence_number\":3,") && strstr(got[k], "\"sequence_number\":4,"),
                "stream %d: %.300s", k, got[k] ? got[k] + (strlen(got[k]) > 300 ? strlen(got[k]) - 300 : 0) : "");
        if (fd[k] >= 0) close(fd[k]);
        free(got[k]);
    }
    snprintf(path, sizeof path, "/v1/responses/%s?stream=true", id);
    T_CHECK(http(srv.port, "GET", path, NULL, NULL, &g) && g.status == 404, "deleted, then followed: %d", g.status);
    resp_free(&g);
}

/* Whether GET /v1/responses/{id}?stream=true comes to say that response's events are not kept
 * (within 5 s: they go at the first request after its thread is over). */
static int events_dropped(const char *id) {
    char path[128];
    snprintf(path, sizeof path, "/v1/responses/%s?stream=true", id);
    resp g = {0};
    for (double t0 = now_s(); now_s() - t0 < 5; sleep_ms(20)) {
        resp_free(&g);
        if (!http(srv.port, "GET", path, NULL, NULL, &g) || g.status != 200) break;
    }
    const int dropped = g.status == 400 && g.body && strstr(g.body, "\"param\":\"stream\"");
    resp_free(&g);
    return dropped;
}

/* background: true: answered at once, queued; the thread that waits for it keeps it in progress,
 * then completed with the text the same request gives in the foreground; one still running cannot
 * be continued; a cancel ends one cancelled, a DELETE leaves nothing of it; a server stops with one
 * running. */
static void test_server_background(void) {
    const char *tok = t_data("models/tok512.bin"), *model = t_data("models/stories260K.bin");
    if (!tok || !model) return;
    if (!server_spawn(&srv, "responses-bg", NULL, "NERVE_LOG=info NERVE_TEST_STEP_DELAY_MS=15", model, tok,
                      "--kv-memory 64M --chat-template chatml", 30)) {
        T_CHECK(0, "the server did not start");
        return;
    }
    char id[64], st[32], id2[64], body[512], path[256];
    static const char req[] = "{\"input\":\"Once upon a time\",\"max_output_tokens\":40,\"temperature\":0%s}";
    snprintf(body, sizeof body, req, ",\"background\":true");
    T_CHECK(post_response(body, id, st) == 200 && !strcmp(st, "queued"), "created: %s", st);
    cJSON *w = get_response(id);
    T_CHECK(w && cJSON_IsTrue(cJSON_GetObjectItem(w, "background")) && cJSON_IsTrue(cJSON_GetObjectItem(w, "store")) &&
                cJSON_GetArraySize(cJSON_GetObjectItem(w, "output")) == 0 && cJSON_IsNull(cJSON_GetObjectItem(w, "usage")),
            "the response while it runs");
    cJSON_Delete(w);
    snprintf(body, sizeof body, "{\"previous_response_id\":\"%s\",\"input\":\"More.\",\"max_output_tokens\":4}", id);
    T_CHECK(post_response(body, id2, st) == 400 && !strcmp(st, "previous_response_id"), "continued while running: %s", st);
    int seen = 0;
    w = wait_response(id, 30, &seen);
    char text[2048] = "", fg[2048] = "";
    output_text(w, text, sizeof text);
    T_CHECK(w && !strcmp(field_str(w, "status"), "incomplete") && (seen & 2) && cJSON_GetObjectItem(w, "usage") &&
                usage_of(w, "output_tokens", NULL) == 40 && *text,
            "ended %s (seen %d): %s", field_str(w, "status"), seen, text);
    cJSON_Delete(w);
    resp r;
    snprintf(body, sizeof body, req, "");
    T_CHECK(http(srv.port, "POST", "/v1/responses", NULL, body, &r) && r.status == 200, "foreground: %d", r.status);
    w = cJSON_Parse(r.body ? r.body : "");
    output_text(w, fg, sizeof fg);
    T_CHECK(!strcmp(text, fg), "background '%s', foreground '%s'", text, fg);
    background_streams(fg);
    char fg_id[64];
    snprintf(fg_id, sizeof fg_id, "%s", field_str(w, "id"));
    cJSON_Delete(w), resp_free(&r);
    snprintf(body, sizeof body, "{\"previous_response_id\":\"%s\",\"input\":\"More.\",\"max_output_tokens\":4}", id);
    T_CHECK(post_response(body, id2, st) == 200, "continued once ended: %s", st);
    snprintf(path, sizeof path, "/v1/responses/%s/input_items", id);
    T_CHECK(http(srv.port, "GET", path, NULL, NULL, &r) && r.status == 200 && strstr(r.body, "Once upon a time"), "input_items: %d", r.status);
    resp_free(&r);

    /* cancelled while it runs: its request ends, the response says so; a second cancel answers it again */
    snprintf(body, sizeof body, "{\"input\":\"Once upon a time\",\"max_output_tokens\":400,\"background\":true}");
    T_CHECK(post_response(body, id, st) == 200, "the long one");
    for (double t0 = now_s(); now_s() - t0 < 20; sleep_ms(5)) {
        w = get_response(id);
        const int running = !strcmp(field_str(w, "status"), "in_progress");
        cJSON_Delete(w);
        if (running) break;
    }
    snprintf(path, sizeof path, "/v1/responses/%s/cancel", id);
    T_CHECK(http(srv.port, "POST", path, NULL, NULL, &r) && r.status == 200 && strstr(r.body, "\"status\":\"cancelled\""), "cancel: %d %s",
            r.status, r.body);
    resp_free(&r);
    w = get_response(id);
    T_CHECK(!strcmp(field_str(w, "status"), "cancelled"), "after the cancel: %s", field_str(w, "status"));
    cJSON_Delete(w);
    T_CHECK(http(srv.port, "POST", path, NULL, NULL, &r) && r.status == 200 && strstr(r.body, "\"status\":\"cancelled\""), "cancelled again");
    resp_free(&r);
    snprintf(path, sizeof path, "/v1/responses/%s/cancel", fg_id);
    T_CHECK(http(srv.port, "POST", path, NULL, NULL, &r) && r.status == 400, "a foreground response cancelled: %d", r.status);
    resp_free(&r);
    T_CHECK(http(srv.port, "POST", "/v1/responses/resp_000000000000000000000000/cancel", NULL, NULL, &r) && r.status == 404,
            "an unknown one cancelled: %d", r.status);
    resp_free(&r);
    /* deleted while it runs: nothing of it comes back when its thread ends */
    T_CHECK(post_response(body, id, st) == 200, "another long one");
    snprintf(path, sizeof path, "/v1/responses/%s", id);
    T_CHECK(http(srv.port, "DELETE", path, NULL, NULL, &r) && r.status == 200, "delete: %d", r.status);
    resp_free(&r);
    sleep_ms(300);
    w = get_response(id);
    T_CHECK(!w, "a deleted background response came back: %s", field_str(w, "status"));
    cJSON_Delete(w);
    /* refused: not stored */
    T_CHECK(post_response("{\"input\":\"x\",\"background\":true,\"store\":false}", id2, st) == 400 && !strcmp(st, "background"),
            "not stored: %s", st);
    T_CHECK(post_response("{\"input\":\"x\",\"background\":1}", id2, st) == 400 && !strcmp(st, "background"), "not a boolean: %s", st);
    /* the server stops with one running, a stream following it: the stream ends with it, failed */
    snprintf(body, sizeof body, "{\"input\":\"Once upon a time\",\"max_output_tokens\":400,\"temperature\":0,\"background\":true,\"stream\":true}");
    int sfd = open_stream("POST", "/v1/responses", body);
    char *sgot = calloc(1, 1 << 17);
    T_CHECK(sgot && read_until(sfd, sgot, 1 << 17, "response.output_text.delta", 20), "one more, followed");
    int rc = server_stop_within(&srv, 20);
    T_CHECK(rc == 0, "server exit %d", rc);
    T_CHECK(sgot && read_until(sfd, sgot, 1 << 17, NULL, 5) && strstr(sgot, "event: response.failed") && strstr(sgot, "service_unavailable"),
            "the stream at the stop: %.300s", sgot ? sgot + (strlen(sgot) > 300 ? strlen(sgot) - 300 : 0) : "");
    if (sfd >= 0) close(sfd);
    free(sgot);
    /* a store of 8 KiB keeps 2 KiB a response: a long answer ends failed, saying why, not queued for ever
       (on the exact engine, whose answer is the same on every machine: the cancelled one below waits
       for 200 of its events) */
    if (!server_spawn(&srv, "responses-bg-small", NULL, "NERVE_TEST_STEP_DELAY_MS=5", model, tok,
                      "--kv-memory 64M --chat-template chatml --responses-store 8K --engine avx2", 30)) {
        T_CHECK(0, "the server did not start");
        return;
    }
    /* 900 bytes of metadata, which fit the room without the answer (the cancelled one below), so that
     * any 400 tokens pass it whatever text the engine's rounding leads the model to */
    char bigger[2048];
    snprintf(bigger, sizeof bigger,
             "{\"input\":\"Once upon a time\",\"metadata\":{\"a\":\"%450s\",\"b\":\"%450s\"},\"max_output_tokens\":400,"
             "\"temperature\":0,\"background\":true%s}",
             "", "", "");
    T_CHECK(post_response(bigger, id, st) == 200 && !strcmp(st, "queued"), "the long one: %s", st);
    int seen2 = 0;
    w = wait_response(id, 30, &seen2);
    T_CHECK(!strcmp(field_str(w, "status"), "failed") &&
                !strcmp(field_str(cJSON_GetObjectItem(w, "error"), "code"), "response_too_large"),
            "too large to keep: %s %s", field_str(w, "status"), field_str(cJSON_GetObjectItem(w, "error"), "code"));
    cJSON_Delete(w);
    T_CHECK(events_dropped(id), "the events of one past the store's room kept");
    resp lg;
    /* cancelled with 900 bytes of metadata and its output so far: too large to keep whole, kept cancelled without it */
    snprintf(bigger, sizeof bigger,
             "{\"input\":\"Once upon a time\",\"metadata\":{\"a\":\"%450s\",\"b\":\"%450s\"},\"max_output_tokens\":400,"
             "\"temperature\":0,\"background\":true%s}",
             "", "", ",\"stream\":true");
    char *seen_events = stream_until("/v1/responses", bigger, "\"sequence_number\":200,", 20);
    sse_id(seen_events, id);
    free(seen_events);
    snprintf(path, sizeof path, "/v1/responses/%s/cancel", id);
    T_CHECK(*id && http(srv.port, "POST", path, NULL, NULL, &lg) && lg.status == 200 && strstr(lg.body, "\"status\":\"cancelled\"") &&
                strstr(lg.body, "\"output\":[]"),
            "cancelled, too large: %d %.200s", lg.status, lg.body);
    resp_free(&lg);
    T_CHECK(events_dropped(id), "the events of one cancelled, its stream gone, kept past the store's room");
    char longer[4000]; /* 2,500 bytes of metadata, which every response object repeats */
    snprintf(longer, sizeof longer,
             "{\"input\":\"x\",\"metadata\":{\"a\":\"%500s\",\"b\":\"%500s\",\"c\":\"%500s\",\"d\":\"%500s\",\"e\":\"%500s\"},"
             "\"max_output_tokens\":4,\"background\":true}",
             "", "", "", "", "");
    resp r2;
    T_CHECK(http(srv.port, "POST", "/v1/responses", NULL, longer, &r2) && r2.status == 400 && strstr(r2.body, "--responses-store"),
            "a conversation too large to keep: %d %s", r2.status, r2.body);
    resp_free(&r2);
    rc = server_stop_within(&srv, 20);
    T_CHECK(rc == 0, "server exit %d", rc);
}

/* truncation "auto" in the parser, with a KV pool's share (1,000 positions) far below the context
 * (4096): the room kept for the answer is a quarter of what one request can hold; parallel calls
 * dropped take their outputs with them (the chat request of what stays has the same prompt); when
 * no drop makes the prompt fit, the request's own error. */
static void test_truncation_unit(void) {
    nv_tokenizer *tok = tok512();
    if (!tok) return;
    nv_api_ctx ctx = {.model_id = "m", .tok = tok, .tmpl = NV_CHAT_CHATML, .seq_len = 4096, .vocab_size = 512, .capacity = 1000, .reasoning = 0, .dim = 64}; /* (the tools' description alone: about 400 tokens) */
    char longer[1024] = "", r[8192], c[4096], why[256];
    for (int k = 0; k < 40; k++) strcat(longer, "Lily and Tom play. ");
    snprintf(r, sizeof r,
             "{%s,\"truncation\":\"auto\",\"input\":[{\"role\":\"user\",\"content\":\"%s\"},"
             "{\"type\":\"function_call\",\"call_id\":\"call_a\",\"name\":\"play\",\"arguments\":\"{\\\"toy\\\":\\\"%s\\\"}\"},"
             "{\"type\":\"function_call\",\"call_id\":\"call_b\",\"name\":\"play\",\"arguments\":\"{}\"},"
             "{\"type\":\"function_call_output\",\"call_id\":\"call_a\",\"output\":\"vroom\"},"
             "{\"type\":\"function_call_output\",\"call_id\":\"call_b\",\"output\":\"no\"},{\"role\":\"user\",\"content\":\"Go on.\"}]}",
             R_TOOLS, longer, longer);
    snprintf(c, sizeof c,
             "{%s,\"messages\":[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"call_b\",\"type\":\"function\","
             "\"function\":{\"name\":\"play\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_b\",\"content\":\"no\"},"
             "{\"role\":\"user\",\"content\":\"Go on.\"}]}",
             C_TOOLS);
    T_CHECK(same_as_chat(&ctx, r, c, why, sizeof why), "the calls dropped with their outputs: %s", why);
    /* two calls dropped, their ids out of order: each output goes with its call */
    snprintf(r, sizeof r,
             "{%s,\"truncation\":\"auto\",\"input\":[{\"role\":\"user\",\"content\":\"%s\"},"
             "{\"type\":\"function_call\",\"call_id\":\"call_z\",\"name\":\"play\",\"arguments\":\"{\\\"toy\\\":\\\"%s\\\"}\"},"
             "{\"type\":\"function_call\",\"call_id\":\"call_a\",\"name\":\"play\",\"arguments\":\"{\\\"toy\\\":\\\"%s\\\"}\"},"
             "{\"type\":\"function_call\",\"call_id\":\"call_b\",\"name\":\"play\",\"arguments\":\"{}\"},"
             "{\"type\":\"function_call_output\",\"call_id\":\"call_z\",\"output\":\"vroom\"},"
             "{\"type\":\"function_call_output\",\"call_id\":\"call_a\",\"output\":\"zoom\"},"
             "{\"type\":\"function_call_output\",\"call_id\":\"call_b\",\"output\":\"no\"},{\"role\":\"user\",\"content\":\"Go on.\"}]}",
             R_TOOLS, longer, longer, longer);
    T_CHECK(same_as_chat(&ctx, r, c, why, sizeof why), "two calls dropped with their outputs: %s", why);
    nv_api_request q;
    nv_resp_meta m;
    nv_api_error e;
    snprintf(r, sizeof r, "{\"truncation\":\"auto\",\"instructions\":\"%s %s %s %s %s\",\"input\":[{\"role\":\"user\",\"content\":\"a\"},"
             "{\"role\":\"user\",\"content\":\"b\"}]}", longer, longer, longer, longer, longer);
    T_CHECK(rparse(&ctx, r, &q, &m, &e) == 400 && !strcmp(e.code ? e.code : "", "context_length_exceeded"), "instructions past the pool: %d %s",
            e.status, e.message);
    nv_tokenizer_free(tok);
}

/* The Conversations store without a server: create (items, metadata), refusals, get, update,
 * items added, listed, paged, got and deleted, the byte cap (least recently used dropped first; a
 * conversation past a quarter takes no more), the context a response reads and its appended items. */
static void test_conversations_unit(void) {
    nv_conv_store *s = NULL;
    T_CHECK(nv_conv_store_new(64 * 1024, &s) == NV_OK, "new");
    if (!s) return;
    char *out = NULL, id[64] = "", item[64] = "";
    nv_api_error e;
#define CONV(call) ((out = NULL), (call))
    T_CHECK(CONV(nv_conv_create(s, "", 0, &out, &e)) == 400 && !out, "an empty body taken");
    const char *body = "{\"metadata\":{\"topic\":\"cats\"},\"items\":[{\"role\":\"user\",\"content\":\"hi\"},"
                       "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"hello\"}]}]}";
    T_CHECK(CONV(nv_conv_create(s, body, strlen(body), &out, &e)) == 0 && out, "create: %s", e.message);
    cJSON *o = cJSON_Parse(out ? out : "");
    snprintf(id, sizeof id, "%s", field_str(o, "id"));
    T_CHECK(!strncmp(id, "conv_", 5) && !strcmp(field_str(o, "object"), "conversation") && cJSON_GetNumberValue(cJSON_GetObjectItem(o, "created_at")) > 1.7e9 &&
                !strcmp(field_str(cJSON_GetObjectItem(o, "metadata"), "topic"), "cats"),
            "the conversation: %s", out);
    cJSON_Delete(o), free(out);
    /* refusals: each names its field */
    static const struct {
        const char *body, *param;
    } bad[] = {{"{\"metadata\":[1]}", "metadata"},
               {"{\"metadata\":{\"k\":1}}", "metadata"},
               {"{\"items\":{}}", "items"},
               {"{\"items\":[{\"role\":\"robot\",\"content\":\"x\"}]}", "items[0]"},
               {"{\"items\":[{\"role\":\"user\",\"content\":\"x\"},{\"type\":\"banana\"}]}", "items[1]"},
               {"{\"items\":[{\"role\":\"user\",\"content\":\"x\",\"id\":\"msg_a\"},{\"role\":\"user\",\"content\":\"y\",\"id\":\"msg_a\"}]}", "items"},
               {"[1]", NULL}};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        T_CHECK(CONV(nv_conv_create(s, bad[k].body, strlen(bad[k].body), &out, &e)) == 400 && !out &&
                    (!bad[k].param || !strcmp(e.param, bad[k].param)),
                "%s: %s (%s)", bad[k].body, e.param, e.message);
        free(out);
    }
    char many[4096] = "{\"items\":[";
    for (int k = 0; k < 21; k++) strcat(many, k ? ",{\"role\":\"user\",\"content\":\"x\"}" : "{\"role\":\"user\",\"content\":\"x\"}");
    strcat(many, "]}");
    T_CHECK(CONV(nv_conv_create(s, many, strlen(many), &out, &e)) == 400 && !strcmp(e.param, "items"), "21 items: %s", e.param);
    /* items: added (the list of those added, in order), listed newest first, paged, got, deleted */
    const char *add = "{\"items\":[{\"role\":\"user\",\"content\":\"one\",\"id\":\"msg_one\"},{\"type\":\"function_call\",\"call_id\":\"c1\","
                      "\"name\":\"f\",\"arguments\":\"{}\"},{\"type\":\"reasoning\",\"summary\":[]}]}";
    T_CHECK(CONV(nv_conv_items_add(s, id, add, strlen(add), &out, &e)) == 0 && out && strstr(out, "\"first_id\":\"msg_one\"") &&
                strstr(out, "\"last_id\":\"fc_") && !strstr(out, "reasoning"),
            "added: %s", out ? out : e.message);
    free(out);
    T_CHECK(CONV(nv_conv_items_add(s, id, add, strlen(add), &out, &e)) == 400 && strstr(e.message, "msg_one"), "a duplicate id: %s", e.message);
    T_CHECK(CONV(nv_conv_items_add(s, "conv_none", add, strlen(add), &out, &e)) == 404, "to none: %d", e.status);
    T_CHECK(CONV(nv_conv_items_add(s, id, "{\"items\":[]}", 12, &out, &e)) == 400, "no items");
    T_CHECK(CONV(nv_conv_items_list(s, id, NULL, NULL, NULL, &out, &e)) == 0 && out, "list");
    o = cJSON_Parse(out ? out : "");
    const cJSON *data = cJSON_GetObjectItem(o, "data");
    T_CHECK(cJSON_GetArraySize(data) == 4 && !strcmp(field_str(cJSON_GetArrayItem(data, 0), "type"), "function_call") &&
                !strcmp(field_str(cJSON_GetArrayItem(data, 1), "id"), "msg_one") &&
                !strcmp(field_str(cJSON_GetArrayItem(data, 3), "role"), "user") && cJSON_IsFalse(cJSON_GetObjectItem(o, "has_more")),
            "newest first: %s", out);
    snprintf(item, sizeof item, "%s", field_str(cJSON_GetArrayItem(data, 2), "id")); /* the assistant's "hello" */
    cJSON_Delete(o), free(out);
    T_CHECK(CONV(nv_conv_items_list(s, id, "2", "asc", NULL, &out, &e)) == 0 && out && strstr(out, "\"has_more\":true") &&
                strstr(out, "hello") && !strstr(out, "msg_one"),
            "asc, 2: %s", out);
    free(out);
    T_CHECK(CONV(nv_conv_items_list(s, id, "2", "asc", item, &out, &e)) == 0 && out && strstr(out, "\"first_id\":\"msg_one\"") &&
                strstr(out, "\"has_more\":false"),
            "after: %s", out);
    free(out);
    T_CHECK(CONV(nv_conv_items_list(s, id, "0", NULL, NULL, &out, &e)) == 400 && !strcmp(e.param, "limit"), "limit 0");
    T_CHECK(CONV(nv_conv_items_list(s, id, NULL, NULL, "msg_none", &out, &e)) == 400 && !strcmp(e.param, "after"), "after none");
    T_CHECK(CONV(nv_conv_item_get(s, id, item, &out, &e)) == 0 && out && strstr(out, "\"text\":\"hello\"") && strstr(out, "output_text"),
            "item: %s", out);
    free(out);
    T_CHECK(CONV(nv_conv_item_get(s, id, "msg_none", &out, &e)) == 404, "no such item");
    T_CHECK(CONV(nv_conv_item_delete(s, id, item, &out, &e)) == 0 && out && strstr(out, "\"object\":\"conversation\""), "item deleted");
    free(out);
    T_CHECK(CONV(nv_conv_item_get(s, id, item, &out, &e)) == 404 && CONV(nv_conv_item_delete(s, id, item, &out, &e)) == 404, "gone");
    /* metadata replaced; a bad one refused, the old one kept */
    T_CHECK(CONV(nv_conv_update(s, id, "{\"metadata\":{\"topic\":\"dogs\"}}", 29, &out, &e)) == 0 && out && strstr(out, "dogs"), "update");
    free(out);
    T_CHECK(CONV(nv_conv_update(s, id, "{\"metadata\":\"x\"}", 16, &out, &e)) == 400 && CONV(nv_conv_update(s, id, "{}", 2, &out, &e)) == 400,
            "bad updates");
    T_CHECK(CONV(nv_conv_get(s, id, &out, &e)) == 0 && out && strstr(out, "dogs"), "kept: %s", out);
    free(out);
    /* the context a response reads, and what it adds */
    cJSON *own = cJSON_Parse("[{\"type\":\"message\",\"id\":\"msg_one\",\"role\":\"user\",\"content\":[]}]"), *ctx = NULL;
    T_CHECK(nv_conv_context(s, id, own, &ctx, &e) == 400 && !strcmp(e.param, "input") && !ctx, "an input item already in it");
    cJSON_Delete(own);
    own = cJSON_Parse("[{\"type\":\"message\",\"id\":\"msg_two\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"two\"}]}]");
    T_CHECK(nv_conv_context(s, "conv_none", own, &ctx, &e) == 404 && !strcmp(e.param, "conversation"), "unknown");
    T_CHECK(nv_conv_context(s, id, own, &ctx, &e) == 0 && cJSON_GetArraySize(ctx) == 3, "context: %d", cJSON_GetArraySize(ctx));
    cJSON_Delete(ctx);
    T_CHECK(nv_conv_append(s, id, own) == 1 && nv_conv_append(s, "conv_none", own) == 0, "append");
    T_CHECK(CONV(nv_conv_items_list(s, id, "1", NULL, NULL, &out, &e)) == 0 && out && strstr(out, "msg_two"), "appended last: %s", out);
    free(out);
    /* an append whose item's id it holds already (two requests at once): that item gets a new id */
    T_CHECK(nv_conv_append(s, id, own) == 1 && CONV(nv_conv_items_list(s, id, "1", NULL, NULL, &out, &e)) == 0 && out &&
                strstr(out, "\"first_id\":\"item_") && strstr(out, "two"),
            "re-id: %s", out);
    free(out);
    /* several clashes at once, with it and among themselves: each later holder of an id gets a new one */
    cJSON *clashes = cJSON_Parse("[{\"type\":\"message\",\"id\":\"msg_two\",\"role\":\"user\",\"content\":[]},"
                              "{\"type\":\"message\",\"id\":\"msg_new\",\"role\":\"user\",\"content\":[]},"
                              "{\"type\":\"message\",\"id\":\"msg_new\",\"role\":\"user\",\"content\":[]}]");
    T_CHECK(nv_conv_append(s, id, clashes) == 1 && CONV(nv_conv_items_list(s, id, "100", "asc", NULL, &out, &e)) == 0 && out, "clashes");
    cJSON *page = cJSON_Parse(out ? out : "");
    int news = 0, twos = 0, same = 0;
    const cJSON *listed = cJSON_GetObjectItem(page, "data");
    for (const cJSON *a = listed ? listed->child : NULL; a; a = a->next) {
        const char *ai = cJSON_GetStringValue(cJSON_GetObjectItem(a, "id"));
        news += ai && !strcmp(ai, "msg_new"), twos += ai && !strcmp(ai, "msg_two");
        for (const cJSON *b = a->next; b; b = b->next) same += ai && !strcmp(ai, cJSON_GetStringValue(cJSON_GetObjectItem(b, "id")));
    }
    T_CHECK(news == 1 && twos == 1 && same == 0, "ids after several clashes: msg_new %d, msg_two %d, shared %d: %s", news, twos, same, out);
    cJSON_Delete(page), cJSON_Delete(clashes);
    free(out);
    /* an id that is not a string is made; what an add counts, the item's delete gives back */
    size_t n0, b0, n1, b1;
    nv_conv_store_stats(s, &n0, &b0);
    const char *odd = "{\"items\":[{\"role\":\"user\",\"content\":\"z\",\"id\":null},{\"role\":\"user\",\"content\":\"zz\",\"id\":7}]}";
    T_CHECK(CONV(nv_conv_items_add(s, id, odd, strlen(odd), &out, &e)) == 0 && out, "odd ids");
    o = cJSON_Parse(out ? out : "");
    char odd_ids[2][64];
    for (int k = 0; k < 2; k++) snprintf(odd_ids[k], sizeof odd_ids[k], "%s", field_str(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "data"), k), "id"));
    T_CHECK(!strncmp(odd_ids[0], "msg_", 4) && !strncmp(odd_ids[1], "msg_", 4) && strcmp(odd_ids[0], odd_ids[1]), "ids made: %s", out);
    cJSON_Delete(o), free(out);
    for (int k = 0; k < 2; k++) {
        T_CHECK(CONV(nv_conv_item_delete(s, id, odd_ids[k], &out, &e)) == 0, "odd %d deleted", k);
        free(out);
    }
    nv_conv_store_stats(s, &n1, &b1);
    T_CHECK(n1 == n0 && b1 == b0, "bytes %zu after an add and its delete, %zu before", b1, b0);
    /* the cap: 64 KiB; a conversation past 16 KiB takes no more; the least recently used go first */
    char pad[8192], big[9000];
    memset(pad, 'y', sizeof pad - 1);
    pad[sizeof pad - 1] = '\0';
    snprintf(big, sizeof big, "{\"items\":[{\"role\":\"user\",\"content\":\"%.7000s\"}]}", pad);
    T_CHECK(CONV(nv_conv_items_add(s, id, big, strlen(big), &out, &e)) == 0, "7 KB added");
    free(out);
    T_CHECK(CONV(nv_conv_items_add(s, id, big, strlen(big), &out, &e)) == 0, "14 KB");
    free(out);
    T_CHECK(CONV(nv_conv_items_add(s, id, big, strlen(big), &out, &e)) == 400 && strstr(e.message, "--responses-store"), "past a quarter");
    T_CHECK(nv_conv_append(s, id, own) == 1, "a small append still fits");
    char ids[8][64];
    for (int k = 0; k < 8; k++) {
        T_CHECK(CONV(nv_conv_create(s, big, strlen(big), &out, &e)) == 0, "filler %d", k);
        o = cJSON_Parse(out ? out : "");
        snprintf(ids[k], sizeof ids[k], "%s", field_str(o, "id"));
        cJSON_Delete(o), free(out);
        if (k != 3) continue;
        T_CHECK(CONV(nv_conv_get(s, id, &out, &e)) == 0, "used again"); /* the first: used after fillers 0-3 */
        free(out);
    }
    size_t count = 0, bytes = 0;
    nv_conv_store_stats(s, &count, &bytes);
    T_CHECK(bytes <= 64 * 1024 && CONV(nv_conv_get(s, ids[0], &out, &e)) == 404 && CONV(nv_conv_get(s, ids[7], &out, &e)) == 0, "%zu in %zu bytes",
            count, bytes);
    free(out);
    T_CHECK(CONV(nv_conv_get(s, id, &out, &e)) == 0, "the one used lately was dropped before older ones");
    free(out);
    T_CHECK(CONV(nv_conv_delete(s, id, &out, &e)) == 0 && out && strstr(out, "conversation.deleted") && strstr(out, "\"deleted\":true"), "delete");
    free(out);
    T_CHECK(CONV(nv_conv_delete(s, id, &out, &e)) == 404 && CONV(nv_conv_get(s, id, &out, &e)) == 404, "deleted twice");
    for (int k = 0; k < 8; k++) { /* (those the cap dropped: 404) */
        if (CONV(nv_conv_delete(s, ids[k], &out, &e)) == 0) free(out);
    }
    nv_conv_store_stats(s, &count, &bytes);
    T_CHECK(count == 0 && bytes == 0, "all deleted: %zu in %zu bytes", count, bytes);
    nv_conv_store_free(s);
    /* thousands of conversations (their index grown twice): each found, those deleted gone, the rest kept */
    T_CHECK(nv_conv_store_new(64u << 20, &s) == NV_OK, "a larger store");
    enum { MANY = 3000 };
    static char many_ids[MANY][48];
    int made = 0;
    for (int k = 0; k < MANY && s; k++) {
        if (CONV(nv_conv_create(s, "{}", 2, &out, &e)) != 0) break;
        cJSON *c = cJSON_Parse(out);
        snprintf(many_ids[k], sizeof many_ids[k], "%s", field_str(c, "id"));
        cJSON_Delete(c), free(out);
        made++;
    }
    int found = 0, deleted = 0, gone = 0;
    for (int k = 0; k < made; k++) {
        if (CONV(nv_conv_get(s, many_ids[k], &out, &e)) == 0) found++, free(out);
        if (k % 3 == 0 && CONV(nv_conv_delete(s, many_ids[k], &out, &e)) == 0) deleted++, free(out);
    }
    for (int k = 0; k < made; k++) {
        const int st = CONV(nv_conv_get(s, many_ids[k], &out, &e));
        if (st == 0) free(out);
        gone += (k % 3 == 0) == (st == 404);
    }
    nv_conv_store_stats(s, &count, &bytes);
    T_CHECK(made == MANY && found == MANY && deleted == (MANY + 2) / 3 && gone == MANY && count == (size_t)(MANY - deleted),
            "%d made, %d found, %d deleted, %d as they should be, %zu left", made, found, deleted, gone, count);
#undef CONV
    cJSON_Delete(own);
    nv_conv_store_free(s);
}

/* POST body to path: the answer parsed (NULL unless 200). */
static cJSON *post_json(const char *path, const char *body) {
    resp r;
    cJSON *w = http(srv.port, "POST", path, NULL, body, &r) && r.status == 200 ? cJSON_Parse(r.body) : NULL;
    resp_free(&r);
    return w;
}

/* The first choice's text of a chat request (temperature 0), as JSON text (a string literal). */
static char *chat_text(const char *messages, int max_tokens) {
    char body[4096];
    snprintf(body, sizeof body, "{\"messages\":%s,\"max_tokens\":%d,\"temperature\":0}", messages, max_tokens);
    cJSON *c = post_json("/v1/chat/completions", body);
    const cJSON *t = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(c, "choices"), 0), "message"), "content");
    char *s = t ? cJSON_PrintUnformatted(t) : NULL;
    cJSON_Delete(c);
    return s;
}

/* The status of method path (body: NULL for none), -1 when want (NULL: anything) is in neither
 * its head nor its body. */
static int answer(const char *method, const char *path, const char *body, const char *want) {
    resp r;
    int status = http(srv.port, method, path, NULL, body, &r) ? r.status : 0;
    if (want && !(r.head && strstr(r.head, want)) && !(r.body && strstr(r.body, want))) status = -1;
    resp_free(&r);
    return status;
}

/* Conversations over HTTP: a response in a conversation sees its items, then the conversation
 * holds that response's input and output, which the next response sees (each answer the chat
 * request of the same messages gives); streamed responses add theirs too; refusals; the routes'
 * methods; deleted, the conversation is gone. */
static void test_server_conversations(void) {
    const char *tok = t_data("models/tok512.bin"), *model = t_data("models/stories260K.bin");
    if (!tok || !model || !start("responses-conv", model, tok)) return;
    char body[4096], path[256], id[64];
    cJSON *c = post_json("/v1/conversations", "{\"items\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"metadata\":{\"k\":\"v\"}}");
    snprintf(id, sizeof id, "%s", field_str(c, "id"));
    cJSON_Delete(c);
    T_CHECK(!strncmp(id, "conv_", 5), "created: %s", id);
    snprintf(body, sizeof body, "{\"conversation\":\"%s\",\"input\":\"The end?\",\"max_output_tokens\":8,\"temperature\":0}", id);
    cJSON *r1 = post_json("/v1/responses", body);
    char text1[1024] = "";
    output_text(r1, text1, sizeof text1);
    char *want = chat_text("[{\"role\":\"user\",\"content\":\"Once upon a time\"},{\"role\":\"user\",\"content\":\"The end?\"}]", 8);
    cJSON *t1 = cJSON_CreateString(text1);
    char *got = cJSON_PrintUnformatted(t1);
    T_CHECK(r1 && want && got && !strcmp(want, got) && !strcmp(field_str(cJSON_GetObjectItem(r1, "conversation"), "id"), id),
            "first turn %s, the chat's %s", got ? got : "", want ? want : "");
    /* the second turn sees the first's answer (the object form of conversation) */
    snprintf(body, sizeof body, "{\"conversation\":{\"id\":\"%s\"},\"input\":\"And then?\",\"max_output_tokens\":8,\"temperature\":0,\"stream\":true}",
             id);
    resp r;
    T_CHECK(http(srv.port, "POST", "/v1/responses", NULL, body, &r) && r.status == 200, "streamed: %d", r.status);
    rstream s;
    sum(r.body ? r.body : "", &s);
    char msgs[3072];
    snprintf(msgs, sizeof msgs,
             "[{\"role\":\"user\",\"content\":\"Once upon a time\"},{\"role\":\"user\",\"content\":\"The end?\"},"
             "{\"role\":\"assistant\",\"content\":%s},{\"role\":\"user\",\"content\":\"And then?\"}]",
             got ? got : "\"\"");
    char *want2 = chat_text(msgs, 8);
    cJSON *t2 = cJSON_CreateString(s.text);
    char *got2 = cJSON_PrintUnformatted(t2);
    T_CHECK(s.ok && want2 && got2 && !strcmp(want2, got2), "second turn %s, the chat's %s", got2 ? got2 : "", want2 ? want2 : "");
    free(want), free(got), free(want2), free(got2), cJSON_Delete(t1), cJSON_Delete(t2), cJSON_Delete(s.final), resp_free(&r);
    /* a response not stored adds its items all the same */
    snprintf(body, sizeof body, "{\"conversation\":\"%s\",\"input\":\"Bye.\",\"max_output_tokens\":4,\"store\":false}", id);
    T_CHECK(answer("POST", "/v1/responses", body, "\"store\":false") == 200, "store false");
    /* the conversation's items: its first, then each turn's input and answer */
    snprintf(path, sizeof path, "/v1/conversations/%s/items?order=asc", id);
    T_CHECK(http(srv.port, "GET", path, NULL, NULL, &r) && r.status == 200, "items: %d", r.status);
    c = cJSON_Parse(r.body ? r.body : "");
    const cJSON *data = cJSON_GetObjectItem(c, "data");
    const char *roles[] = {"user", "user", "assistant", "user", "assistant", "user", "assistant"};
    int ok = cJSON_GetArraySize(data) == 7 && strstr(r.body, "Bye.");
    for (int k = 0; k < 7 && ok; k++) ok = !strcmp(field_str(cJSON_GetArrayItem(data, k), "role"), roles[k]);
    const cJSON *out1 = cJSON_GetArrayItem(cJSON_GetObjectItem(r1, "output"), 0);
    T_CHECK(ok && !strcmp(field_str(cJSON_GetArrayItem(data, 2), "id"), field_str(out1, "id")), "items: %.600s", r.body);
    cJSON_Delete(c), cJSON_Delete(r1), resp_free(&r);
    T_CHECK(metric(srv.port, "nerve_conversations") == 1 && metric(srv.port, "nerve_conversations_bytes") > 500, "metrics: %g conversations, %g bytes",
            metric(srv.port, "nerve_conversations"), metric(srv.port, "nerve_conversations_bytes"));
    /* refusals */
    static const struct {
        const char *body, *param;
        int status;
    } bad[] = {{"{\"conversation\":\"conv_000000000000000000000000\",\"input\":\"x\"}", "conversation", 404},
               {"{\"conversation\":{\"id\":5},\"input\":\"x\"}", "conversation", 400},
               {"{\"conversation\":\"%s\",\"previous_response_id\":\"resp_x\",\"input\":\"x\"}", "conversation", 400},
               {"{\"conversation\":\"%s\",\"input\":[{\"role\":\"robot\",\"content\":\"x\"}]}", "input[0]", 400}};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        snprintf(body, sizeof body, bad[k].body, id);
        T_CHECK(http(srv.port, "POST", "/v1/responses", NULL, body, &r) && r.status == bad[k].status &&
                    strstr(r.body, bad[k].param),
                "%s: %d %s", body, r.status, r.body);
        resp_free(&r);
    }
    snprintf(path, sizeof path, "/v1/conversations/%s/items/%s", id, "msg_x");
    T_CHECK(answer("GET", path, NULL, NULL) == 404, "no such item");
    T_CHECK(answer("PUT", path, "{}", "GET, DELETE") == 405, "PUT an item");
    snprintf(path, sizeof path, "/v1/conversations/%s", id);
    T_CHECK(answer("POST", path, "{\"metadata\":{\"k\":\"w\"}}", "\"k\":\"w\"") == 200, "update");
    T_CHECK(answer("PATCH", path, "{}", "GET, POST, DELETE") == 405, "PATCH");
    T_CHECK(answer("DELETE", path, NULL, "conversation.deleted") == 200, "delete");
    T_CHECK(answer("GET", path, NULL, NULL) == 404 && metric(srv.port, "nerve_conversations") == 0, "gone");
    snprintf(body, sizeof body, "{\"conversation\":\"%s\",\"input\":\"x\"}", id);
    T_CHECK(answer("POST", "/v1/responses", body, NULL) == 404, "a response in a deleted one");
    T_CHECK(answer("GET", "/v1/conversations", NULL, NULL) == 405, "GET /v1/conversations");
    const int rc = server_stop_within(&srv, 20);
    T_CHECK(rc == 0, "server exit %d", rc);
}

/* The prompt tokens of a chat request of messages (a JSON list), or -1 when it is refused. */
static int chat_prompt_of(const char *messages) {
    char body[8192];
    snprintf(body, sizeof body, "{\"messages\":%s,\"max_tokens\":1,\"temperature\":0}", messages);
    cJSON *c = post_json("/v1/chat/completions", body);
    const int n = c ? (int)usage_of(c, "prompt_tokens", NULL) : -1;
    cJSON_Delete(c);
    return n;
}

/* truncation "auto": a conversation longer than the context drops its oldest items, the fewest
 * that leave max_output_tokens of room (the chat request of the items kept has the same prompt,
 * one item fewer dropped would not fit); "disabled" (the default) refuses it; a conversation keeps
 * every item. */
static void test_server_truncation(void) {
    const char *tok = t_data("models/tok512.bin"), *model = t_data("models/stories260K.bin");
    if (!tok || !model || !start("responses-trunc", model, tok)) return;
    static const char *const turn[] = {"user", "assistant"};
    char items[6][700], list[8192] = "[", input[8192];
    for (int k = 0; k < 6; k++) { /* about 110 tokens each: six pass the 512 of stories260K */
        snprintf(items[k], sizeof items[k], "{\"role\":\"%s\",\"content\":\"%d: Lily and Tom went to the park with a red ball and a big dog. "
                 "They ran and played in the sun. Then the dog saw a cat and ran after it, and Lily laughed.\"}", turn[k % 2], k);
        strcat(list, k ? "," : "");
        strcat(list, items[k]);
    }
    strcat(list, "]");
    snprintf(input, sizeof input, "{\"input\":%s,\"max_output_tokens\":16,\"temperature\":0}", list);
    resp r;
    T_CHECK(http(srv.port, "POST", "/v1/responses", NULL, input, &r) && r.status == 400 && strstr(r.body, "context_length_exceeded"),
            "disabled: %d", r.status);
    resp_free(&r);
    snprintf(input, sizeof input, "{\"input\":%s,\"max_output_tokens\":16,\"temperature\":0,\"truncation\":\"auto\"}", list);
    cJSON *w = post_json("/v1/responses", input);
    const int got = w ? (int)usage_of(w, "input_tokens", NULL) : -1;
    int fits = -1, tokens[6];
    for (int d = 0; d < 6; d++) { /* the chat request of the items past the first d */
        char kept[8192] = "[";
        for (int k = d; k < 6; k++) strcat(kept, k > d ? "," : ""), strcat(kept, items[k]);
        strcat(kept, "]");
        tokens[d] = chat_prompt_of(kept);
        if (fits < 0 && tokens[d] > 0 && tokens[d] + 16 <= 512) fits = d;
    }
    T_CHECK(w && fits > 0 && got == tokens[fits] && !strcmp(field_str(w, "truncation"), "auto") && cJSON_GetArraySize(cJSON_GetObjectItem(w, "output")),
            "auto: %d prompt tokens; the chat's with %d dropped %d, with %d dropped %d", got, fits, fits >= 0 ? tokens[fits] : -1,
            fits - 1, fits > 0 ? tokens[fits - 1] : -1);
    cJSON_Delete(w);
    /* /v1/responses/input_tokens counts what the request would give the model: truncated as it would be; past the context, counted */
    cJSON *n = post_json("/v1/responses/input_tokens", input);
    T_CHECK(n && !strcmp(field_str(n, "object"), "response.input_tokens") && cJSON_GetNumberValue(cJSON_GetObjectItem(n, "input_tokens")) == got,
            "input_tokens, truncated: %g against %d", n ? cJSON_GetNumberValue(cJSON_GetObjectItem(n, "input_tokens")) : -1, got);
    cJSON_Delete(n);
    snprintf(input, sizeof input, "{\"input\":%s,\"max_output_tokens\":16}", list);
    n = post_json("/v1/responses/input_tokens", input);
    T_CHECK(n && cJSON_GetNumberValue(cJSON_GetObjectItem(n, "input_tokens")) > 512, "input_tokens, whole: %g",
            n ? cJSON_GetNumberValue(cJSON_GetObjectItem(n, "input_tokens")) : -1);
    cJSON_Delete(n);
    T_CHECK(answer("GET", "/v1/responses/input_tokens", NULL, "POST") == 405, "GET input_tokens");
    T_CHECK(answer("POST", "/v1/responses/input_tokens", "{\"input\":[]}", "\"param\":\"input\"") == 400, "input_tokens of nothing");
    /* no max_output_tokens: a quarter of the context kept for the answer */
    snprintf(input, sizeof input, "{\"input\":%s,\"temperature\":0,\"truncation\":\"auto\",\"max_output_tokens\":null}", list);
    w = post_json("/v1/responses", input);
    const int got2 = w ? (int)usage_of(w, "input_tokens", NULL) : -1;
    int fits2 = -1;
    for (int d = 0; d < 6 && fits2 < 0; d++)
        if (tokens[d] > 0 && tokens[d] + 128 <= 512) fits2 = d;
    T_CHECK(w && fits2 >= 0 && got2 == tokens[fits2], "a quarter kept: %d tokens, want %d", got2, fits2 >= 0 ? tokens[fits2] : -1);
    cJSON_Delete(w);
    T_CHECK(answer("POST", "/v1/responses", "{\"input\":\"x\",\"truncation\":\"middle\"}", "\"param\":\"truncation\"") == 400, "a bad truncation");
    /* one item alone past the context: nothing to drop, the request's own error */
    char huge[8192];
    snprintf(huge, sizeof huge, "{\"input\":\"%.*s\",\"truncation\":\"auto\"}", 3000,
             "Lily and Tom went to the park with a red ball and a big dog. Lily and Tom went to the park with a red ball and a big dog. "
             "Lily and Tom went to the park with a red ball and a big dog. Lily and Tom went to the park with a red ball and a big dog. "
             "Lily and Tom went to the park with a red ball and a big dog. Lily and Tom went to the park with a red ball and a big dog. "
             "Lily and Tom went to the park with a red ball and a big dog. Lily and Tom went to the park with a red ball and a big dog. "
             "Lily and Tom went to the park with a red ball and a big dog. Lily and Tom went to the park with a red ball and a big dog. "
             "Lily and Tom went to the park with a red ball and a big dog. Lily and Tom went to the park with a red ball and a big dog. "
             "Lily and Tom went to the park with a red ball and a big dog. Lily and Tom went to the park with a red ball and a big dog. "
             "Lily and Tom went to the park with a red ball and a big dog. Lily and Tom went to the park with a red ball and a big dog. "
             "Lily and Tom went to the park with a red ball and a big dog. Lily and Tom went to the park with a red ball and a big dog. "
             "Lily and Tom went to the park with a red ball and a big dog. Lily and Tom went to the park with a red ball and a big dog. "
             "Lily and Tom went to the park with a red ball and a big dog. Lily and Tom went to the park with a red ball and a big dog. "
             "Lily and Tom went to the park with a red ball and a big dog. Lily and Tom went to the park with a red ball and a big dog. ");
    T_CHECK(answer("POST", "/v1/responses", huge, "context_length_exceeded") == 400, "one item past the context");
    /* a conversation: truncated for the model, whole in the store */
    char conv_body[8192];
    snprintf(conv_body, sizeof conv_body, "{\"items\":%s}", list);
    cJSON *c = post_json("/v1/conversations", conv_body);
    char id[64], path[160];
    snprintf(id, sizeof id, "%s", field_str(c, "id"));
    cJSON_Delete(c);
    snprintf(input, sizeof input, "{\"conversation\":\"%s\",\"input\":\"The end.\",\"max_output_tokens\":8,\"truncation\":\"auto\"}", id);
    w = post_json("/v1/responses", input);
    T_CHECK(w && usage_of(w, "input_tokens", NULL) + 8 <= 512, "in a conversation: %g", w ? usage_of(w, "input_tokens", NULL) : -1);
    cJSON_Delete(w);
    snprintf(path, sizeof path, "/v1/conversations/%s/items?limit=100", id);
    resp g;
    T_CHECK(http(srv.port, "GET", path, NULL, NULL, &g) && g.status == 200 && strstr(g.body, "0: Lily") && strstr(g.body, "The end."),
            "the conversation kept whole: %.200s", g.body);
    resp_free(&g);
    const int rc = server_stop_within(&srv, 20);
    T_CHECK(rc == 0, "server exit %d", rc);
}

/* --responses-store 0: nothing kept, previous_response_id refused as unsupported, store answered false. */
static void test_server_store_off(void) {
    const char *tok = t_data("models/tok512.bin"), *model = t_data("models/stories260K.bin");
    if (!tok || !model) return;
    if (!server_spawn(&srv, "responses-nostore", NULL, NULL, model, tok, "--kv-memory 64M --chat-template chatml --responses-store 0", 30)) {
        T_CHECK(0, "the server did not start");
        return;
    }
    resp r, g;
    T_CHECK(http(srv.port, "POST", "/v1/responses", NULL, "{\"input\":\"x\",\"max_output_tokens\":2}", &r) && r.status == 200 &&
                strstr(r.body, "\"store\":false"),
            "answered: %d %s", r.status, r.body);
    cJSON *w = cJSON_Parse(r.body);
    char path[256], body[256];
    snprintf(path, sizeof path, "/v1/responses/%s", cJSON_GetStringValue(cJSON_GetObjectItem(w, "id")) ?: "none");
    T_CHECK(http(srv.port, "GET", path, NULL, NULL, &g) && g.status == 404 && strstr(g.body, "--responses-store 0"), "GET: %d %s", g.status, g.body);
    resp_free(&g);
    T_CHECK(http(srv.port, "GET", "/metrics", NULL, NULL, &g) && g.status == 200 && !strstr(g.body, "nerve_responses_stored"), "metrics without a store");
    resp_free(&g);
    snprintf(body, sizeof body, "{\"previous_response_id\":\"%s\",\"input\":\"x\"}", cJSON_GetStringValue(cJSON_GetObjectItem(w, "id")) ?: "none");
    T_CHECK(http(srv.port, "POST", "/v1/responses", NULL, body, &g) && g.status == 400 && strstr(g.body, "unsupported_parameter"),
            "previous_response_id: %d %s", g.status, g.body);
    resp_free(&g), resp_free(&r);
    T_CHECK(http(srv.port, "POST", "/v1/responses", NULL, "{\"input\":\"x\",\"background\":true}", &g) && g.status == 400 &&
                strstr(g.body, "--responses-store 0"),
            "background without a store: %d %s", g.status, g.body);
    resp_free(&g);
    cJSON_Delete(w);
    int rc = server_stop_within(&srv, 20);
    T_CHECK(rc == 0, "server exit %d", rc);
}

int main(void) {
    T_RUN(test_translation);
    T_RUN(test_store_unit);
    T_RUN(test_refusals);
    T_RUN(test_events);
    T_RUN(test_server);
    T_RUN(test_server_calls);
    T_RUN(test_server_stored);
    T_RUN(test_server_store_off);
    T_RUN(test_server_background);
    T_RUN(test_conversations_unit);
    T_RUN(test_truncation_unit);
    T_RUN(test_server_conversations);
    T_RUN(test_server_truncation);
    return t_done();
}
