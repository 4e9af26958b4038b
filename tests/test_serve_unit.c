/* The server's pieces without HTTP: stop-string and UTF-8 hold-back, chat templates, the
 * OpenAI request parser's defaults and limits, and the response JSON shapes. */
#include <cjson/cJSON.h>

#include "model/tokenizer.h"
#include "serve/api.h"
#include "serve/chat.h"
#include "serve/sched.h"
#include "t.h"

static void test_stop_holdback(void) {
    const char *stops[] = {"world", "xyz"};
    T_CHECK(nv_stop_holdback("hello wor", 9, stops, 2) == 3, "prefix 'wor' of 'world' not held");
    T_CHECK(nv_stop_holdback("hello", 5, stops, 2) == 0, "nothing to hold");
    T_CHECK(nv_stop_holdback("abcx", 4, stops, 2) == 1, "prefix 'x' of 'xyz' not held");
    T_CHECK(nv_stop_holdback("w", 1, stops, 2) == 1, "short text");
    T_CHECK(nv_stop_holdback("world", 5, stops, 2) == 0, "a whole stop string is found, not held");
    const char *one[] = {"c"};
    T_CHECK(nv_stop_holdback("abc", 3, one, 1) == 0, "a one-byte stop string has no proper prefix");
}

static void test_utf8(void) {
    T_CHECK(nv_utf8_incomplete_tail("a\xC3", 2) == 1, "2-byte lead");
    T_CHECK(nv_utf8_incomplete_tail("a\xE2\x82", 3) == 2, "3-byte char missing one");
    T_CHECK(nv_utf8_incomplete_tail("a\xE2\x82\xAC", 4) == 0, "complete euro sign");
    T_CHECK(nv_utf8_incomplete_tail("\xF0\x9F\x98", 3) == 3, "4-byte char missing one");
    T_CHECK(nv_utf8_incomplete_tail("a\x80", 2) == 0, "stray continuation is not 'incomplete'");
    T_CHECK(nv_utf8_incomplete_tail("", 0) == 0, "empty");
    struct {
        const char *in, *out;
    } cases[] = {
        {"plain", "plain"},
        {"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80", "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"},
        {"a\xFF" "b", "a\xEF\xBF\xBD" "b"},
        {"\xC0\xAF", "\xEF\xBF\xBD\xEF\xBF\xBD"},                     /* overlong */
        {"\xED\xA0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},     /* surrogate */
        {"x\xE2\x82", "x\xEF\xBF\xBD\xEF\xBF\xBD"},                   /* truncated at the end */
        {"\xF4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* above U+10FFFF */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nv_buf b = {0};
        nv_utf8_sanitize(&b, cases[i].in, strlen(cases[i].in));
        T_CHECK(b.data && !strcmp(b.data, cases[i].out), "sanitize case %zu", i);
        nv_buf_free(&b);
    }
}

static int same_ids(const int *a, int na, const int *b, int nb) { return na == nb && !memcmp(a, b, (size_t)na * sizeof(int)); }

/* ids of the concatenation of encode(text_i, bos_i, eos_i) */
static int expect_ids(const nv_tokenizer *tok, int *out, const char *t1, int b1, int e1, const char *t2, int b2, int e2) {
    int *a = NULL, *b = NULL, na = 0, nb = 0;
    nv_tokenizer_encode(tok, t1, b1, e1, &a, &na);
    if (t2) nv_tokenizer_encode(tok, t2, b2, e2, &b, &nb);
    memcpy(out, a, (size_t)na * sizeof(int));
    if (b) memcpy(out + na, b, (size_t)nb * sizeof(int));
    free(a);
    free(b);
    return na + nb;
}

/* The shared data's 512-token vocabulary (stories260K's); NULL, with the case skipped or failed,
 * when it is missing or does not load. */
static nv_tokenizer *tok512(void) {
    const char *zp = t_data("models/tok512.bin");
    if (!zp) return NULL;
    nv_tokenizer *tok = NULL;
    T_CHECK(nv_tokenizer_load(zp, 0, &tok) == NV_OK, "%s", nv_errmsg());
    return tok;
}

static void test_chat_templates(void) {
    nv_tokenizer *tok = tok512();
    if (!tok) return;
    nv_chat_msg msgs[] = {{"system", "Be kind."}, {"user", "Hi there"}, {"assistant", "Hello!"}, {"user", "Tell a story"}};
    int *ids = NULL, n = 0, want[4096], nw;
    T_CHECK(nv_chat_render(NV_CHAT_PLAIN, tok, msgs, 4, &ids, &n) == NV_OK, "%s", nv_errmsg());
    nw = expect_ids(tok, want, "Be kind.\nHi there\nHello!\nTell a story", 1, 0, NULL, 0, 0);
    T_CHECK(same_ids(ids, n, want, nw), "plain template");
    free(ids);
    T_CHECK(nv_chat_render(NV_CHAT_CHATML, tok, msgs, 4, &ids, &n) == NV_OK, "%s", nv_errmsg());
    nw = expect_ids(tok, want,
                    "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
                    "Hello!<|im_end|>\n<|im_start|>user\nTell a story<|im_end|>\n<|im_start|>assistant\n",
                    1, 0, NULL, 0, 0);
    T_CHECK(same_ids(ids, n, want, nw), "chatml template");
    free(ids);
    /* Qwen3's non-thinking turn: an empty think block closed after the assistant's header */
    T_CHECK(nv_chat_render_ex(NV_CHAT_CHATML, tok, msgs + 3, 1, 1, &ids, &n) == NV_OK, "%s", nv_errmsg());
    nw = expect_ids(tok, want, "<|im_start|>user\nTell a story<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", 1, 0,
                    NULL, 0, 0);
    T_CHECK(same_ids(ids, n, want, nw), "chatml without thinking");
    free(ids);
    T_CHECK(nv_chat_render(NV_CHAT_LLAMA2, tok, msgs, 4, &ids, &n) == NV_OK, "%s", nv_errmsg());
    nw = expect_ids(tok, want, "[INST] <<SYS>>\nBe kind.\n<</SYS>>\n\nHi there [/INST] Hello! ", 1, 1,
                    "[INST] Tell a story [/INST]", 1, 0);
    T_CHECK(same_ids(ids, n, want, nw), "llama2 template");
    free(ids);
    nv_chat_msg spaced[] = {{"developer", "  Be kind.\n"}, {"user", "Hi there "}};
    T_CHECK(nv_chat_render(NV_CHAT_LLAMA3, tok, spaced, 2, &ids, &n) == NV_OK, "%s", nv_errmsg());
    nw = expect_ids(tok, want,
                    "<|start_header_id|>system<|end_header_id|>\n\nBe kind.<|eot_id|><|start_header_id|>user<|end_header_id|>"
                    "\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
                    1, 0, NULL, 0, 0);
    T_CHECK(same_ids(ids, n, want, nw), "llama3 template");
    free(ids);
    T_CHECK(!strcmp(nv_chat_template_stop(NV_CHAT_CHATML), "<|im_end|>") && !nv_chat_template_stop(NV_CHAT_PLAIN) &&
                !strcmp(nv_chat_template_stop(NV_CHAT_LLAMA3), "<|eot_id|>"),
            "template stop strings");
    nv_chat_template t;
    T_CHECK(nv_chat_template_parse("llama2", &t) == NV_OK && t == NV_CHAT_LLAMA2 &&
                nv_chat_template_parse("llama3", &t) == NV_OK && t == NV_CHAT_LLAMA3 &&
                !strcmp(nv_chat_template_name(NV_CHAT_LLAMA3), "llama3") && nv_chat_template_parse("jinja", &t) == NV_EINVAL,
            "template names");
    nv_tokenizer_free(tok);
}

static void test_api_parse_defaults_and_limits(void) {
    nv_tokenizer *tok = tok512();
    if (!tok) return;
    nv_api_ctx ctx = {"m", tok, NV_CHAT_CHATML, 512, 512, 100, 0};
    nv_api_request r;
    nv_api_error e;
    const char *simple = "{\"prompt\":\"Once upon a time\"}";
    T_CHECK(nv_api_parse(&ctx, 0, simple, strlen(simple), &r, &e) == 0, "%s", e.message);
    T_CHECK(r.req.n_prompt == 5 && r.req.max_tokens == 16 && r.req.temperature == 1.0f && r.req.top_p == 1.0f &&
                r.req.n_stop == 0 && !r.stream,
            "completion defaults: %d %d", r.req.n_prompt, r.req.max_tokens);
    nv_api_request_free(&r);
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi\"}]}],\"seed\":7,"
                       "\"stop\":\"END\",\"temperature\":0}";
    T_CHECK(nv_api_parse(&ctx, 1, chat, strlen(chat), &r, &e) == 0, "%s", e.message);
    /* chat: the rest of the context, capped by what the pool holds for one request (100 positions) */
    T_CHECK(r.req.max_tokens == 100 - r.req.n_prompt + 1, "chat max_tokens %d", r.req.max_tokens);
    T_CHECK(r.req.seed == 7 && r.req.n_stop == 2 && !strcmp(r.req.stop[0], "END") && !strcmp(r.req.stop[1], "<|im_end|>"),
            "seed / stop strings");
    nv_api_request_free(&r);
    const char *big = "{\"prompt\":\"Once\",\"max_tokens\":100}";
    T_CHECK(nv_api_parse(&ctx, 0, big, strlen(big), &r, &e) == 400 && !strcmp(e.code, "context_length_exceeded") &&
                !strcmp(e.param, "max_tokens"),
            "over the pool: %d %s", e.status, e.message);
    char *j = nv_api_error_json(&e);
    cJSON *root = cJSON_Parse(j);
    const cJSON *err = cJSON_GetObjectItem(root, "error");
    T_CHECK(err && cJSON_GetArraySize(err) == 4 && cJSON_IsString(cJSON_GetObjectItem(err, "message")) &&
                !strcmp(cJSON_GetObjectItem(err, "param")->valuestring, "max_tokens"),
            "error json %s", j);
    cJSON_Delete(root);
    free(j);
    /* a positive top_p too small for a float still samples (the most likely token), never 0 */
    const char *tiny = "{\"prompt\":\"Once\",\"top_p\":2e-91}";
    T_CHECK(nv_api_parse(&ctx, 0, tiny, strlen(tiny), &r, &e) == 0 && r.req.top_p > 0.0f, "tiny top_p: %g", (double)r.req.top_p);
    nv_api_request_free(&r);
    /* echo: max_tokens may be 0, and logprobs then score the prompt */
    const char *scored = "{\"prompt\":\"Once\",\"echo\":true,\"logprobs\":1,\"max_tokens\":0}";
    T_CHECK(nv_api_parse(&ctx, 0, scored, strlen(scored), &r, &e) == 0 && r.req.max_tokens == 0 && r.req.prompt_logprobs &&
                r.req.logprobs && r.req.top_logprobs == 1,
            "echo + logprobs: %s", e.message);
    nv_api_request_free(&r);
    nv_tokenizer_free(tok);
}

static void test_api_response_shapes(void) {
    nv_api_meta m;
    nv_api_meta_init(&m, 1, "model-x");
    T_CHECK(!strncmp(m.id, "chatcmpl-", 9) && strlen(m.id) > 20, "id %s", m.id);
    char *s = nv_api_chunk(&m, "", 0, "stop", 1);
    cJSON *root = cJSON_Parse(s);
    const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0);
    T_CHECK(c0 && cJSON_GetArraySize(cJSON_GetObjectItem(c0, "delta")) == 0 &&
                !strcmp(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "stop") &&
                cJSON_IsNull(cJSON_GetObjectItem(root, "usage")) &&
                !strcmp(cJSON_GetObjectItem(root, "object")->valuestring, "chat.completion.chunk"),
            "final chat chunk %s", s);
    cJSON_Delete(root);
    free(s);
    s = nv_api_response(&m, "tab\there \"quoted\"", "length", 3, 4);
    root = cJSON_Parse(s);
    const cJSON *msg = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0), "message");
    T_CHECK(msg && !strcmp(cJSON_GetObjectItem(msg, "content")->valuestring, "tab\there \"quoted\"") &&
                cJSON_GetObjectItem(cJSON_GetObjectItem(root, "usage"), "total_tokens")->valueint == 7,
            "chat response %s", s);
    cJSON_Delete(root);
    free(s);
}

/* /tokenize and /detokenize bodies: llama.cpp's and vLLM's field names, pieces, errors. */
/* chat_template_kwargs.enable_thinking (vLLM's): false renders the closed think block; other types 400 */
static void test_api_enable_thinking(void) {
    nv_tokenizer *tok = tok512();
    if (!tok) return;
    nv_api_ctx ctx = {"m", tok, NV_CHAT_CHATML, 512, 512, 400, 0};
    nv_api_request a, b;
    nv_api_error e;
    const char *on = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"chat_template_kwargs\":{\"enable_thinking\":true}}";
    const char *off = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"chat_template_kwargs\":{\"enable_thinking\":false}}";
    T_CHECK(nv_api_parse(&ctx, 1, on, strlen(on), &a, &e) == 0 && nv_api_parse(&ctx, 1, off, strlen(off), &b, &e) == 0, "%s", e.message);
    int *ids = NULL, n = 0;
    T_CHECK(nv_chat_render_ex(NV_CHAT_CHATML, tok, (nv_chat_msg[]){{"user", "Hi"}}, 1, 1, &ids, &n) == NV_OK, "%s", nv_errmsg());
    T_CHECK(b.req.n_prompt == n && !memcmp(b.req.prompt, ids, (size_t)n * sizeof(int)) && a.req.n_prompt < n,
            "enable_thinking false renders the closed think block (%d, %d, %d ids)", a.req.n_prompt, b.req.n_prompt, n);
    free(ids);
    nv_api_request_free(&a);
    nv_api_request_free(&b);
    static const char *bad[] = {"{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"chat_template_kwargs\":5}",
                                "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"chat_template_kwargs\":{\"enable_thinking\":0}}"};
    T_CHECK(nv_api_parse(&ctx, 1, bad[0], strlen(bad[0]), &a, &e) == 400 && !strcmp(e.param, "chat_template_kwargs"), "%s", e.message);
    T_CHECK(nv_api_parse(&ctx, 1, bad[1], strlen(bad[1]), &a, &e) == 400 && !strcmp(e.param, "enable_thinking"), "%s", e.message);
    nv_tokenizer_free(tok);
}

static void test_api_tokenize(void) {
    nv_tokenizer *tok = tok512();
    if (!tok) return;
    nv_api_ctx ctx = {"m", tok, NV_CHAT_PLAIN, 512, 512, 100, 0};
    nv_api_error e;
    char *out = NULL;
    static const struct {
        const char *body, *want;
    } ok[] = {
        {"{\"content\":\"Once upon a time\"}", "{\"tokens\":[403,407,261,378],\"count\":4,\"max_model_len\":512}"},
        {"{\"content\":\"Once upon\",\"add_special\":true}", "{\"tokens\":[1,403,407],\"count\":3,\"max_model_len\":512}"},
        {"{\"prompt\":\"Once upon\"}", "{\"tokens\":[1,403,407],\"count\":3,\"max_model_len\":512}"},
        {"{\"prompt\":\"Once\",\"add_special_tokens\":false}", "{\"tokens\":[403],\"count\":1,\"max_model_len\":512}"},
        {"{\"content\":\"Once upon\",\"add_special\":true,\"with_pieces\":true}",
         "{\"tokens\":[{\"id\":1,\"piece\":\"\"},{\"id\":403,\"piece\":\"Once\"},{\"id\":407,\"piece\":\" upon\"}],\"count\":3,"
         "\"max_model_len\":512}"},
        {"{\"content\":\"\"}", "{\"tokens\":[],\"count\":0,\"max_model_len\":512}"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        T_CHECK(nv_api_tokenize(&ctx, ok[i].body, strlen(ok[i].body), &out, &e) == 0 && out && !strcmp(out, ok[i].want),
                "%s gave %s (%s)", ok[i].body, out ? out : "-", e.message);
        free(out);
    }
    const char *back = "{\"tokens\":[1,403,407,261,378]}";
    T_CHECK(nv_api_detokenize(&ctx, back, strlen(back), &out, &e) == 0 && out &&
                !strcmp(out, "{\"content\":\"Once upon a time\",\"prompt\":\"Once upon a time\"}"),
            "detokenize gave %s", out ? out : e.message);
    free(out);
    /* more ids than one request may hold */
    const int many = (1 << 18) + 1;
    char *big = malloc((size_t)many * 2 + 32);
    if (big) {
        size_t at = (size_t)sprintf(big, "{\"tokens\":[");
        for (int i = 0; i < many; i++) at += (size_t)sprintf(big + at, i ? ",3" : "3");
        at += (size_t)sprintf(big + at, "]}");
        out = NULL;
        T_CHECK(nv_api_detokenize(&ctx, big, at, &out, &e) == 400 && !out && !strcmp(e.param, "tokens"), "%d ids accepted", many);
        free(out);
        free(big);
    }
    static const struct {
        int detok;
        const char *body, *param;
    } bad[] = {{0, "{}", "content"},           {0, "{\"content\":5}", "content"}, {0, "{\"content\":\"a\",\"with_pieces\":1}", "with_pieces"},
               {0, "[1]", ""},                 {0, "", ""},                        {1, "{}", "tokens"},
               {1, "{\"tokens\":[512]}", "tokens"}, {1, "{\"tokens\":[1.5]}", "tokens"}, {1, "{\"tokens\":\"1\"}", "tokens"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        out = NULL;
        int rc = (bad[i].detok ? nv_api_detokenize : nv_api_tokenize)(&ctx, bad[i].body, strlen(bad[i].body), &out, &e);
        T_CHECK(rc == 400 && !out && !strcmp(e.param, bad[i].param), "%s: %d param '%s' (%s)", bad[i].body, rc, e.param, e.message);
        free(out);
    }
    nv_tokenizer_free(tok);
}

/* --reasoning-format deepseek's split, whole and in every two pieces (and byte by byte): the same
 * reasoning and content either way. */
static void test_think_split(void) {
    static const struct {
        const char *in, *why, *said;
    } cases[] = {
        {"<think>\nabc\n</think>\n\nHello", "\nabc\n", "Hello"},
        {"  <think>x</think>y", "x", "y"},
        {"Hello <think>x</think>", "", "Hello <think>x</think>"},
        {"<think>never closed", "never closed", ""},
        {"<thi", "", "<thi"},
        {"", "", ""},
        {"\n\n", "", "\n\n"},
        {"<think></think>\n\n\nA\n\nB", "", "A\n\nB"},
        {"<think>\xc3\xa9\xe4\xb8\xad</think>\xf0\x9f\x98\x80", "\xc3\xa9\xe4\xb8\xad", "\xf0\x9f\x98\x80"},
        {"<think>a</thinkx</think>b", "a</thinkx", "b"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *in = cases[c].in;
        const size_t n = strlen(in);
        for (size_t cut = 0; cut <= n + 1; cut++) { /* cut n + 1: one byte at a time */
            nv_think t = {0};
            nv_buf why = {0}, said = {0};
            if (cut <= n) {
                nv_think_feed(&t, in, cut, 0, &why, &said);
                nv_think_feed(&t, in + cut, n - cut, 1, &why, &said);
            } else {
                for (size_t i = 0; i < n; i++) nv_think_feed(&t, in + i, 1, 0, &why, &said);
                nv_think_feed(&t, "", 0, 1, &why, &said);
            }
            const char *w = why.data ? why.data : "", *sd = said.data ? said.data : "";
            T_CHECK(!strcmp(w, cases[c].why) && !strcmp(sd, cases[c].said), "'%s' cut at %zu: reasoning '%s' content '%s'", in, cut, w, sd);
            nv_think_free(&t);
            nv_buf_free(&why);
            nv_buf_free(&said);
        }
    }
    /* the response carries reasoning_content only when given */
    nv_api_meta m;
    nv_api_meta_init(&m, 1, "m");
    nv_api_choice ch[2] = {{"Hello", "stop", NULL, 0, "thought"}, {"Hi", "stop", NULL, 0, NULL}};
    char *body = nv_api_response_choices(&m, ch, 2, 3, 4, 0);
    T_CHECK(body && strstr(body, "\"content\":\"Hello\",\"reasoning_content\":\"thought\"") &&
                !strstr(strstr(body, "\"Hi\""), "reasoning_content"),
            "%s", body ? body : "-");
    free(body);
    body = nv_api_reasoning_chunk(&m, "step", 0);
    T_CHECK(body && strstr(body, "\"delta\":{\"reasoning_content\":\"step\"}"), "%s", body ? body : "-");
    free(body);
}

int main(void) {
    T_RUN(test_stop_holdback);
    T_RUN(test_utf8);
    T_RUN(test_chat_templates);
    T_RUN(test_api_parse_defaults_and_limits);
    T_RUN(test_api_response_shapes);
    T_RUN(test_api_tokenize);
    T_RUN(test_api_enable_thinking);
    T_RUN(test_think_split);
    return t_done();
}
