/* Reasoning models (model/think.h, the scheduler's reasoning budget, the chat API's reasoning
 * fields): a think block the prompt opens, the tokens that close one whose budget is spent, and the
 * server end to end — the answer read as starting inside the block, the budget forcing the close
 * after exactly its tokens (the same tokens the model gives without it until then), a grammar
 * following the forced close, streaming, the template's reasoning_effort and thinking switch, and
 * the requests' 400s. */
#include <cjson/cJSON.h>

#include "model/think.h"
#include "t.h"
#include "serve_util.h"
#include "tok_util.h"

/* the text of ids as an answer prints them (after a token that is not BOS) */
static void ids_text(const nv_tokenizer *tok, const int *ids, int n, nv_buf *out) {
    for (int i = 0; i < n; i++) nv_buf_puts(out, nv_tokenizer_decode(tok, i ? ids[i - 1] : 0, ids[i]));
}

static int opened(const nv_tokenizer *tok, const char *text) {
    int *ids = NULL, n = 0;
    if (nv_tokenizer_encode(tok, text, 1, 0, &ids, &n) != NV_OK) return -1;
    const int o = nv_think_opened(tok, NV_THINK_ANGLE, ids, n);
    free(ids);
    return o;
}

/* text fed to a tracker starting as start says, in two pieces cut at every place: the reasoning and
 * the content it gives are want_why and want_said */
static void split_everywhere(nv_think start, const char *text, const char *want_why, const char *want_said) {
    const size_t n = strlen(text);
    for (size_t cut = 0; cut <= n; cut++) {
        nv_think t = start;
        nv_buf why = {0}, said = {0};
        nv_think_feed(&t, text, cut, 0, &why, &said);
        nv_think_feed(&t, text + cut, n - cut, 1, &why, &said);
        /* (nothing at all: a buffer never written) */
        T_CHECK(!strcmp(why.data ? why.data : "", want_why) && !strcmp(said.data ? said.data : "", want_said), "'%s' cut at %zu: '%s' '%s'", text, cut,
                why.data ? why.data : "", said.data ? said.data : "");
        nv_think_free(&t);
        nv_buf_free(&why);
        nv_buf_free(&said);
    }
}

static void test_think_unit(void) {
    /* a block the prompt opened: the text is reasoning until it closes, in pieces cut anywhere */
    split_everywhere((nv_think){.state = NV_THINK_IN}, "step one\nstep two</think>\n\nThe answer.", "step one\nstep two", "The answer.");
    nv_think t = {.state = NV_THINK_IN}; /* followed only: nothing kept */
    nv_think_feed(&t, "a </thi", 7, 0, NULL, NULL);
    T_CHECK(t.state == NV_THINK_IN, "still inside");
    nv_think_feed(&t, "nk>\nb", 5, 0, NULL, NULL);
    T_CHECK(t.state == NV_THINK_PAST, "past it: %d", t.state);
    nv_think_free(&t);

    /* Mistral's tags (Magistral's): "<think>" is then plain text */
    split_everywhere((nv_think){.tags = NV_THINK_BRACKET}, "[THINK]a <think> b</think>[/THINK]\nThe [THINK] answer.", "a <think> b</think>",
                     "The [THINK] answer.");
    nv_think m = {.tags = NV_THINK_BRACKET};
    nv_buf said = {0};
    nv_think_feed(&m, "<think>x</think>y", 17, 1, NULL, &said);
    T_CHECK(said.data && !strcmp(said.data, "<think>x</think>y") && m.state == NV_THINK_PAST, "no [THINK]: all content: '%s'",
            said.data ? said.data : "");
    nv_think_free(&m);
    nv_buf_free(&said);
    /* the tags a template's text shows */
    int shown = -1;
    T_CHECK(nv_think_tags_of_template("[INST]{{ m }}[/INST]{{ '[THINK]' + b.thinking + '[/THINK]' }}", &shown) == NV_THINK_BRACKET && shown == 1,
            "Mistral's tags");
    T_CHECK(nv_think_tags_of_template("{{ '<think>' }} [THINK]", &shown) == NV_THINK_ANGLE && shown == 1, "<think>, with one of Mistral's tags");
    T_CHECK(nv_think_tags_of_template("[INST]{{ m }}[/INST]", &shown) == NV_THINK_ANGLE && shown == 0 &&
                nv_think_tags_of_template(NULL, &shown) == NV_THINK_ANGLE && shown == 0,
            "none shown");

    nv_tokenizer *tok = tok512();
    if (!tok) return;
    {
        int *ids = NULL, n = 0;
        T_CHECK(nv_tokenizer_encode(tok, "[INST] Hi[/INST][THINK]\n", 1, 0, &ids, &n) == NV_OK && nv_think_opened(tok, NV_THINK_BRACKET, ids, n) == 1 &&
                    nv_think_opened(tok, NV_THINK_ANGLE, ids, n) == 0,
                "a prompt opening Mistral's block");
        free(ids);
        T_CHECK(nv_tokenizer_encode(tok, "[INST] Hi[/INST]<think>", 1, 0, &ids, &n) == NV_OK && nv_think_opened(tok, NV_THINK_BRACKET, ids, n) == 0,
                "<think> does not open Mistral's");
        free(ids);
        nv_buf text = {0};
        T_CHECK(nv_think_close_ids(tok, NV_THINK_BRACKET, NULL, &ids, &n) == NV_OK, "%s", nv_errmsg());
        ids_text(tok, ids, n, &text);
        T_CHECK(text.data && !strcmp(text.data, "[/THINK]"), "Mistral's forced close: '%s'", text.data ? text.data : "");
        free(ids);
        nv_buf_free(&text);
    }
    T_CHECK(opened(tok, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n") == 1, "a prompt opening the block");
    T_CHECK(opened(tok, "<think>") == 1 && opened(tok, "Once upon a time there was a girl who liked to think. <think> \n\n") == 1,
            "short and long prompts, white space after it");
    T_CHECK(opened(tok, "<think>\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n      \t\t\t\t") == 1, "much white space after it");
    T_CHECK(opened(tok, "<|im_start|>assistant\n<think>\n\n</think>\n\n") == 0 && opened(tok, "<think>x") == 0 && opened(tok, "think>") == 0 &&
                opened(tok, "Hi") == 0,
            "a closed block, text after it, no block");
    int *ids = NULL, n = 0;
    nv_buf text = {0};
    T_CHECK(nv_think_close_ids(tok, NV_THINK_ANGLE, NULL, &ids, &n) == NV_OK && n > 1, "%s", nv_errmsg());
    ids_text(tok, ids, n, &text);
    T_CHECK(text.data && !strcmp(text.data, "\n</think>\n\n"), "the closing without a dummy space: '%s'", text.data ? text.data : "");
    free(ids);
    text.len = 0;
    T_CHECK(nv_think_close_ids(tok, NV_THINK_ANGLE, "Time is up.", &ids, &n) == NV_OK, "%s", nv_errmsg());
    ids_text(tok, ids, n, &text);
    T_CHECK(text.data && strstr(text.data, "Time is up.\n</think>\n\n") && strlen(text.data) <= strlen(" Time is up.\n</think>\n\n"),
            "the message first: '%s'", text.data ? text.data : "");
    free(ids);
    nv_buf_free(&text);
    nv_tokenizer_free(tok);
}

/* A chat answer at temperature 0: its content and reasoning (each "" when absent), and with
 * logprobs its tokens' texts, each into a list (NULL: not wanted). 0 unless it answered 200. */
typedef struct {
    char content[4096], reasoning[4096];
    char toks[64][32];
    int n_toks;
    int status;
    char error[512];
} answer;

static int chat(int port, const char *extra, int stream, answer *a) {
    char body[2048];
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"Tell me a story.\"}], \"temperature\": 0, \"max_tokens\": 40, "
             "\"stream\": %s%s%s}",
             stream ? "true" : "false", *extra ? ", " : "", extra);
    memset(a, 0, sizeof *a);
    resp r;
    if (!http(port, "POST", "/v1/chat/completions", NULL, body, &r)) return 0;
    a->status = r.status;
    if (r.status != 200) {
        cJSON *j = cJSON_Parse(r.body);
        const char *msg = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "message"));
        snprintf(a->error, sizeof a->error, "%s", msg ? msg : "");
        cJSON_Delete(j);
        resp_free(&r);
        return 0;
    }
    nv_buf content = {0}, reasoning = {0};
    if (stream) {
        for (const char *p = r.body; (p = strstr(p, "data: ")); p++) {
            cJSON *j = cJSON_Parse(p + 6); /* (cJSON stops at the object's end) */
            const cJSON *d = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "delta");
            const char *c = cJSON_GetStringValue(cJSON_GetObjectItem(d, "content")), *w = cJSON_GetStringValue(cJSON_GetObjectItem(d, "reasoning_content"));
            if (c) nv_buf_puts(&content, c);
            if (w) nv_buf_puts(&reasoning, w);
            cJSON_Delete(j);
        }
    } else {
        cJSON *j = cJSON_Parse(r.body);
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), *m = cJSON_GetObjectItem(ch, "message");
        const char *c = cJSON_GetStringValue(cJSON_GetObjectItem(m, "content")), *w = cJSON_GetStringValue(cJSON_GetObjectItem(m, "reasoning_content"));
        if (c) nv_buf_puts(&content, c);
        if (w) nv_buf_puts(&reasoning, w);
        const cJSON *lps = cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "logprobs"), "content");
        for (const cJSON *e = lps ? lps->child : NULL; e && a->n_toks < 64; e = e->next)
            snprintf(a->toks[a->n_toks++], sizeof a->toks[0], "%s", cJSON_GetStringValue(cJSON_GetObjectItem(e, "token")));
        cJSON_Delete(j);
    }
    snprintf(a->content, sizeof a->content, "%s", content.data ? content.data : "");
    snprintf(a->reasoning, sizeof a->reasoning, "%s", reasoning.data ? reasoning.data : "");
    nv_buf_free(&content);
    nv_buf_free(&reasoning);
    resp_free(&r);
    return 1;
}

/* the first k tokens' text of a */
static const char *first_tokens(const answer *a, int k, char *out, size_t cap) {
    out[0] = 0;
    for (int i = 0; i < k && i < a->n_toks; i++) strncat(out, a->toks[i], cap - strlen(out) - 1);
    return out;
}

/* ChatML whose assistant turns (the generation prompt's, and earlier answers' alike, so a turn renders
 * as it was prompted) open a think block, after the effort where one is given */
static const char *const THINK_TEMPLATE =
    "{%- macro head() %}{{ '<|im_start|>assistant\\n' }}{% if reasoning_effort is defined %}effort={{ reasoning_effort }}\n{% endif %}"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endmacro %}"
    "{%- for m in messages %}{% if m.role == 'assistant' %}{{ head() }}{{ m.content }}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}{{ head() }}{% endif %}";

static void test_think_serve(void) {
    const char *m = t_data("models/stories260K.bin"), *z = t_data("models/tok512.bin");
    nv_tokenizer *tok = tok512();
    if (!m || !z || !tok) {
        if (tok) nv_tokenizer_free(tok);
        return;
    }
    server s;
    /* the servers here on the exact engine: the same text on every CPU (answers' token counts are checked) */
    if (!template_server(&s, "think_serve", m, z, "think.jinja", THINK_TEMPLATE, "--kv-memory 16M --kv-disk-cache 0 --engine avx2", "(reasoning to reasoning_content)")) {
        nv_tokenizer_free(tok);
        return;
    }
    /* the template's variables */
    static const struct {
        const char *extra, *want;
    } prompts[] = {{"\"reasoning_effort\": \"high\"", "assistant\neffort=high\n<think>\n"},
                   {"\"reasoning_effort\": \"none\"", "assistant\neffort=none\n<think>\n\n</think>\n\n"},
                   {"\"thinking_budget_tokens\": 0", "assistant\n<think>\n\n</think>\n\n"},
                   {"\"thinking_token_budget\": 0, \"chat_template_kwargs\": {\"enable_thinking\": true}", "assistant\n<think>\n"},
                   {"\"chat_template_kwargs\": {\"reasoning_effort\": \"low\"}, \"reasoning_effort\": \"high\"", "effort=low\n<think>\n"}};
    for (size_t i = 0; i < sizeof prompts / sizeof *prompts; i++) {
        char body[512];
        snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], %s}", prompts[i].extra);
        int status;
        cJSON *j = post_json_status(s.port, "/apply-template", body, &status);
        const char *p = cJSON_GetStringValue(cJSON_GetObjectItem(j, "prompt"));
        const size_t pl = p ? strlen(p) : 0, wl = strlen(prompts[i].want);
        T_CHECK(status == 200 && pl >= wl && !strcmp(p + pl - wl, prompts[i].want), "%s: '%s'", prompts[i].extra, p ? p : "");
        cJSON_Delete(j);
    }

    answer plain, whole, a, b;
    /* as written: the tokens without any budget, the block never closed by this model in 40 */
    T_CHECK(chat(s.port, "\"reasoning_format\": \"none\", \"logprobs\": true", 0, &plain) && plain.n_toks == 40 && !strstr(plain.content, "</think>"),
            "%d tokens: '%s' %s", plain.n_toks, plain.content, plain.error);
    T_CHECK(chat(s.port, "", 0, &whole) && !strcmp(whole.reasoning, plain.content) && !*whole.content,
            "all reasoning: '%s' / '%s'", whole.reasoning, whole.content);
    /* a budget of 5: those 5 tokens, then the closing forced */
    char want[2048], first[1024];
    snprintf(want, sizeof want, "%s\n</think>\n\n", first_tokens(&plain, 5, first, sizeof first));
    T_CHECK(chat(s.port, "\"reasoning_format\": \"none\", \"thinking_token_budget\": 5", 0, &a) && !strncmp(a.content, want, strlen(want)) &&
                strlen(a.content) > strlen(want),
            "budget 5 as written: '%s', not '%s...'", a.content, want);
    T_CHECK(chat(s.port, "\"thinking_token_budget\": 5", 0, &b) && !strcmp(b.reasoning, (snprintf(want, sizeof want, "%s\n", first), want)) &&
                !strcmp(b.content, a.content + strlen(first) + strlen("\n</think>\n\n")),
            "budget 5 read: '%s' / '%s'", b.reasoning, b.content);
    answer st;
    T_CHECK(chat(s.port, "\"thinking_token_budget\": 5", 1, &st) && !strcmp(st.reasoning, b.reasoning) && !strcmp(st.content, b.content),
            "streamed the same: '%s' / '%s'", st.reasoning, st.content);
    /* a grammar that allows a leading block starts inside it, and takes the forced closing */
    T_CHECK(chat(s.port, "\"thinking_token_budget\": 3, \"response_format\": {\"type\": \"json_object\"}", 0, &a) &&
                !strcmp(a.reasoning, (snprintf(want, sizeof want, "%s\n", first_tokens(&plain, 3, first, sizeof first)), want)) &&
                !strstr(a.content, "think>"),
            "json_object after the block: '%s' / '%s'", a.reasoning, a.content);
    /* read as written, a JSON answer's grammar has no block: no budget writes into it (not even the
       closing's first line break, which JSON's white space would take) */
    T_CHECK(chat(s.port, "\"reasoning_format\": \"none\", \"thinking_token_budget\": 2, \"response_format\": {\"type\": \"json_object\"}", 0, &a) &&
                chat(s.port, "\"reasoning_format\": \"none\", \"response_format\": {\"type\": \"json_object\"}", 0, &st) && !strcmp(a.content, st.content),
            "a grammar without the block: '%s' against '%s'", a.content, st.content);
    /* the 400s */
    static const char *const bad[] = {"\"reasoning_format\": \"legacy\"", "\"thinking_token_budget\": -2", "\"thinking_budget_tokens\": 1.5",
                                      "\"thinking_token_budget\": 1, \"thinking_budget_tokens\": 1", "\"reasoning_effort\": \"huge\"",
                                      "\"reasoning_effort\": 3"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) T_CHECK(!chat(s.port, bad[i], 0, &a) && a.status == 400, "%s: %d", bad[i], a.status);
    /* Anthropic's thinking budget */
    resp r;
    T_CHECK(http(s.port, "POST", "/v1/messages", NULL,
                 "{\"model\": \"stories260K\", \"max_tokens\": 40, \"temperature\": 0, \"thinking\": {\"type\": \"enabled\", \"budget_tokens\": 5}, "
                 "\"messages\": [{\"role\": \"user\", \"content\": \"Tell me a story.\"}]}",
                 &r) && r.status == 200,
            "Anthropic's messages");
    cJSON *j = r.status == 200 ? cJSON_Parse(r.body) : NULL;
    const cJSON *block = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "content"), 0);
    T_CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(block, "type")) ? cJSON_GetStringValue(cJSON_GetObjectItem(block, "type")) : "", "thinking") &&
                !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(block, "thinking")) ? cJSON_GetStringValue(cJSON_GetObjectItem(block, "thinking")) : "",
                        b.reasoning),
            "its thinking block holds the budget's 5 tokens: %s", r.body ? r.body : "");
    cJSON_Delete(j);
    resp_free(&r);
    T_CHECK(http(s.port, "POST", "/v1/messages", NULL,
                 "{\"model\": \"stories260K\", \"max_tokens\": 4, \"thinking\": {\"type\": \"enabled\", \"budget_tokens\": -5}, "
                 "\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}",
                 &r) && r.status == 400 && strstr(r.body, "thinking.budget_tokens"),
            "a negative budget: %d %s", r.status, r.body ? r.body : "");
    resp_free(&r);
    /* the Responses API's reasoning.effort and Ollama's think level reach the template: the prompt grows by "effort=high\n" */
    static const struct {
        const char *path, *plain, *effort, *count;
    } apis[] = {{"/v1/responses", "{\"model\": \"stories260K\", \"input\": \"Hi\", \"max_output_tokens\": 1}",
                 "{\"model\": \"stories260K\", \"input\": \"Hi\", \"max_output_tokens\": 1, \"reasoning\": {\"effort\": \"high\"}}", "usage.input_tokens"},
                {"/api/chat", "{\"model\": \"stories260K\", \"stream\": false, \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"options\": {\"num_predict\": 1}}",
                 "{\"model\": \"stories260K\", \"stream\": false, \"think\": \"high\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
                 "\"options\": {\"num_predict\": 1}}",
                 "prompt_eval_count"}};
    int grow = -1;
    {
        int *e = NULL, ne = 0;
        if (nv_tokenizer_encode(tok, "effort=high\n", 0, 0, &e, &ne) == NV_OK) grow = ne;
        free(e);
    }
    for (size_t i = 0; i < sizeof apis / sizeof *apis; i++) {
        double count[2] = {0, 0};
        for (int k = 0; k < 2; k++) {
            int status;
            cJSON *o = post_json_status(s.port, apis[i].path, k ? apis[i].effort : apis[i].plain, &status);
            const cJSON *v = strchr(apis[i].count, '.') ? cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "input_tokens")
                                                          : cJSON_GetObjectItem(o, apis[i].count);
            count[k] = status == 200 && cJSON_IsNumber(v) ? v->valuedouble : -1;
            cJSON_Delete(o);
        }
        T_CHECK(count[0] > 0 && count[1] - count[0] >= grow - 1 && count[1] - count[0] <= grow + 1, "%s: %g then %g prompt tokens (%d more wanted)",
                apis[i].path, count[0], count[1], grow);
    }
    int status;
    cJSON *o = post_json_status(s.port, "/api/chat", "{\"model\": \"stories260K\", \"think\": \"deep\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}", &status);
    T_CHECK(status == 400, "Ollama's think level must be low, medium or high: %d", status);
    cJSON_Delete(o);
    /* /api/generate's context is the turn as it ran: the template saw the think level */
    o = post_json_status(s.port, "/api/generate", "{\"model\": \"stories260K\", \"prompt\": \"Hi\", \"think\": \"high\", \"stream\": false, "
                                                  "\"options\": {\"num_predict\": 2}}", &status);
    char *ctx_ids = status == 200 ? cJSON_PrintUnformatted(cJSON_GetObjectItem(o, "context")) : NULL;
    cJSON_Delete(o);
    char dbody[8192];
    snprintf(dbody, sizeof dbody, "{\"tokens\": %s}", ctx_ids ? ctx_ids : "[]");
    o = post_json_status(s.port, "/detokenize", dbody, &status);
    const char *ctx_text = cJSON_GetStringValue(cJSON_GetObjectItem(o, "content"));
    T_CHECK(ctx_ids && ctx_text && strstr(ctx_text, "assistant\neffort=high\n<think>\n"), "the context's text: %s", ctx_text ? ctx_text : "");
    cJSON_Delete(o);
    free(ctx_ids);
    T_CHECK(server_stop_within(&s, 20) == 0, "the server did not exit 0");

    /* the server's default budget and message; a request's -1 lifts it */
    if (!template_server(&s, "think_budget", m, z, "think.jinja", THINK_TEMPLATE,
                         "--kv-memory 16M --kv-disk-cache 0 --reasoning-budget 7 --reasoning-budget-message 'Time is up.' "
                         "--spec-tokens 4 --spec-lookup-min 1 --engine avx2", /* (drafts change nothing: the same text as the first server's) */
                         "(reasoning to reasoning_content)")) {
        nv_tokenizer_free(tok);
        return;
    }
    int *ids = NULL, n = 0;
    nv_buf close = {0};
    T_CHECK(nv_think_close_ids(tok, NV_THINK_ANGLE, "Time is up.", &ids, &n) == NV_OK, "%s", nv_errmsg());
    ids_text(tok, ids, n, &close);
    free(ids);
    const char *nl = close.data ? strstr(close.data, "</think>") : NULL;
    snprintf(want, sizeof want, "%s%.*s", first_tokens(&plain, 7, first, sizeof first), nl ? (int)(nl - close.data) : 0, close.data ? close.data : "");
    T_CHECK(chat(s.port, "", 0, &a) && !strcmp(a.reasoning, want) && *a.content, "the server's budget: '%s', not '%s'", a.reasoning, want);
    T_CHECK(chat(s.port, "\"thinking_token_budget\": -1", 0, &a) && !strcmp(a.reasoning, plain.content), "no limit: '%s'", a.reasoning);

    nv_buf_free(&close);
    T_CHECK(server_stop_within(&s, 20) == 0, "the second server did not exit 0");
    nv_tokenizer_free(tok);
}

/* Mistral's form (Magistral's, Ministral 3 Reasoning's): earlier reasoning as thinking chunks, and
 * here a generation prompt that opens the block, so the model's answer is read from inside it */
static const char *const MISTRAL_THINK_TEMPLATE =
    "{%- for m in messages %}{% if m.role == 'user' %}[INST]{{ m.content }}[/INST]{% elif m.role == 'assistant' %}"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for b in m.content %}"
    "{% if b.type == 'thinking' %}{{ '[THINK]' + b.thinking + '[/THINK]' }}{% else %}{{ b.text }}{% endif %}{% endfor %}{% endif %}"
    "{% if m.reasoning_content is defined %}(reasoning_content){% endif %}\n{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}[THINK]{% endif %}";

/* gpt-oss's harmony messages: the analysis channel the reasoning, the final channel (and a commentary
 * without a recipient) the content, a message to functions.NAME a Hermes tool-call block in the content,
 * whatever the pieces; an answer off the format all content; the state IN while the analysis is read */
static void test_think_harmony(void) {
    const nv_think h = {.tags = NV_THINK_HARMONY};
    split_everywhere(h, "<|channel|>analysis<|message|>The user greets.<|end|><|start|>assistant<|channel|>final<|message|>Hello!", "The user greets.",
                     "Hello!");
    split_everywhere(h, "<|channel|>final<|message|>Just this.", "", "Just this.");
    split_everywhere(h, "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
                        "<|constrain|>json<|message|>{\"city\": \"Paris\"}",
                     "Need weather.", "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}</tool_call>");
    split_everywhere(h, "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>not json", "",
                     "<tool_call>{\"name\":\"f\",\"arguments\":\"not json\"}</tool_call>");
    split_everywhere(h, "<|channel|>commentary<|message|>Let me look.<|end|><|start|>assistant<|channel|>final<|message|>Done.", "",
                     "Let me look.Done.");
    split_everywhere(h, "Plain text <|end|> all of it", "", "Plain text <|end|> all of it");
    /* a prompt that opened the analysis: the answer starts inside it */
    split_everywhere((nv_think){.tags = NV_THINK_HARMONY, .state = NV_THINK_IN}, "Let me see.<|end|><|start|>assistant<|channel|>final<|message|>Hi",
                     "Let me see.", "Hi");
    nv_think t = h;
    nv_think_feed(&t, "<|channel|>analysis<|message|>hm", 32, 0, NULL, NULL);
    T_CHECK(t.state == NV_THINK_IN, "inside the analysis: %d", t.state);
    nv_think_feed(&t, "<|end|><|start|>assis", 21, 0, NULL, NULL);
    T_CHECK(t.state == NV_THINK_PAST, "between messages (no budget counts the next header): %d", t.state);
    nv_think_feed(&t, "tant<|channel|>final<|message|>x", 32, 0, NULL, NULL);
    T_CHECK(t.state == NV_THINK_PAST, "past it: %d", t.state);
    nv_think_free(&t);
    T_CHECK(nv_think_tags_of_template("{{ '<|start|>' + role + '<|channel|>analysis<|message|>' }}", NULL) == NV_THINK_HARMONY,
            "a harmony template's tags");
}

static void test_think_mistral(void) {
    const char *m = t_data("models/stories260K.bin"), *z = t_data("models/tok512.bin");
    if (!m || !z) return;
    server s;
    if (!template_server(&s, "think_mistral", m, z, "think_mistral.jinja", MISTRAL_THINK_TEMPLATE, "--kv-memory 16M --kv-disk-cache 0 --engine avx2",
                         "(reasoning in [THINK] blocks to reasoning_content)"))
        return;
    /* an earlier answer's reasoning reaches the template as a thinking chunk before its text */
    int status;
    cJSON *j = post_json_status(s.port, "/apply-template",
                                "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello.\", "
                                "\"reasoning_content\": \"greet back\"}, {\"role\": \"user\", \"content\": \"Bye\"}]}",
                                &status);
    const char *p = cJSON_GetStringValue(cJSON_GetObjectItem(j, "prompt"));
    T_CHECK(status == 200 && p && !strcmp(p, "[INST]Hi[/INST][THINK]greet back[/THINK]Hello.[INST]Bye[/INST][THINK]"), "the history: '%s'",
            p ? p : "");
    cJSON_Delete(j);
    /* no chunk for an empty reasoning, nor for a user's message */
    j = post_json_status(s.port, "/apply-template",
                         "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\", \"reasoning_content\": \"mine\"}, {\"role\": \"assistant\", "
                         "\"content\": \"Hello.\", \"reasoning_content\": \"\"}, {\"role\": \"user\", \"content\": \"Bye\"}]}",
                         &status);
    p = cJSON_GetStringValue(cJSON_GetObjectItem(j, "prompt"));
    T_CHECK(status == 200 && p && !strcmp(p, "[INST]Hi[/INST]Hello.(reasoning_content)[INST]Bye[/INST][THINK]"), "no chunks: '%s'", p ? p : "");
    cJSON_Delete(j);
    answer plain, whole, a, b, st;
    T_CHECK(chat(s.port, "\"reasoning_format\": \"none\", \"logprobs\": true", 0, &plain) && plain.n_toks == 40 && !strstr(plain.content, "[/THINK]"),
            "%d tokens: '%s' %s", plain.n_toks, plain.content, plain.error);
    T_CHECK(chat(s.port, "", 0, &whole) && !strcmp(whole.reasoning, plain.content) && !*whole.content, "all reasoning: '%s' / '%s'", whole.reasoning,
            whole.content);
    /* a budget of 5: those 5 tokens, then Mistral's close forced (no line breaks around it) */
    char want[2048], first[1024];
    snprintf(want, sizeof want, "%s[/THINK]", first_tokens(&plain, 5, first, sizeof first));
    T_CHECK(chat(s.port, "\"reasoning_format\": \"none\", \"thinking_token_budget\": 5", 0, &a) && !strncmp(a.content, want, strlen(want)) &&
                strlen(a.content) > strlen(want),
            "budget 5 as written: '%s', not '%s...'", a.content, want);
    T_CHECK(chat(s.port, "\"thinking_token_budget\": 5", 0, &b) && !strcmp(b.reasoning, first) && !strcmp(b.content, a.content + strlen(want)),
            "budget 5 read: '%s' / '%s'", b.reasoning, b.content);
    T_CHECK(chat(s.port, "\"thinking_token_budget\": 5", 1, &st) && !strcmp(st.reasoning, b.reasoning) && !strcmp(st.content, b.content),
            "streamed the same: '%s' / '%s'", st.reasoning, st.content);
    /* a grammar starts inside the block the prompt opened, and takes the forced close */
    T_CHECK(chat(s.port, "\"thinking_token_budget\": 3, \"response_format\": {\"type\": \"json_object\"}", 0, &a) &&
                !strcmp(a.reasoning, first_tokens(&plain, 3, first, sizeof first)) && a.content[strspn(a.content, " \n")] == '{' &&
                !strstr(a.content, "THINK"),
            "json_object after the block: '%s' / '%s' (not '%s')", a.reasoning, a.content, first);
    T_CHECK(server_stop_within(&s, 20) == 0, "the server did not exit 0");
}

int main(void) {
    T_RUN(test_think_unit);
    T_RUN(test_think_serve);
    T_RUN(test_think_mistral);
    T_RUN(test_think_harmony);
    return t_done();
}
