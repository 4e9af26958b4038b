/* The server's pieces without HTTP: stop-string and UTF-8 hold-back, chat templates, the
 * OpenAI request parser's defaults and limits, and the response JSON shapes. */
#include <cjson/cJSON.h>
#include <time.h>

#include "model/tokenizer.h"
#include "serve/api.h"
#include "serve/batchfile.h"
#include "serve/chat.h"
#include "serve/files.h"
#include "serve/sched.h"
#include "serve/tools.h"
#include "t.h"
#include "tok_util.h"

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

/* Prompt lookup: the longest tail that occurred before, its latest occurrence, at most k tokens. */
static void test_ngram_draft(void) {
    int out[8] = {0};
    /* 1 2 3 4 5 | 9 1 2 3 4 6 | 1 2 3: "1 2 3" last seen before the "4 6" */
    const int a[] = {1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 6, 1, 2, 3};
    int n = nv_ngram_draft(a, 14, 1, 4, 3, out);
    T_CHECK(n == 3 && out[0] == 4 && out[1] == 6 && out[2] == 1, "latest occurrence: %d (%d %d %d)", n, out[0], out[1], out[2]);
    /* the longest n first: "9 2" occurs only once before, "2" alone later */
    const int b[] = {9, 2, 7, 2, 8, 9, 2};
    n = nv_ngram_draft(b, 7, 1, 3, 2, out);
    T_CHECK(n == 2 && out[0] == 7 && out[1] == 2, "longest match: %d (%d %d)", n, out[0], out[1]);
    n = nv_ngram_draft(b, 7, 1, 1, 2, out);
    T_CHECK(n == 2 && out[0] == 8 && out[1] == 9, "1-gram: %d (%d %d)", n, out[0], out[1]);
    /* past the end of the context the draft repeats itself; no match below min; nothing in a short context */
    const int c[] = {5, 6, 5};
    n = nv_ngram_draft(c, 3, 1, 4, 8, out);
    T_CHECK(n == 8 && out[0] == 6 && out[1] == 5 && out[2] == 6 && out[7] == 5, "tail: %d (%d %d %d %d)", n, out[0], out[1],
            out[2], out[7]);
    T_CHECK(nv_ngram_draft(c, 3, 2, 4, 8, out) == 0, "no 2-gram repeats");
    T_CHECK(nv_ngram_draft(c, 1, 1, 4, 8, out) == 0 && nv_ngram_draft(c, 3, 1, 4, 0, out) == 0, "one token / k = 0");
    const int d[] = {1, 2, 3, 4};
    T_CHECK(nv_ngram_draft(d, 4, 1, 4, 4, out) == 0, "nothing repeats");
    /* a run of one token proposes more of it */
    const int e[] = {7, 7, 7, 7};
    n = nv_ngram_draft(e, 4, 2, 2, 4, out);
    T_CHECK(n == 4 && out[0] == 7 && out[3] == 7, "run: %d", n);
}

/* A prediction's drafts: from its start, along the answer while it follows, found again after an edit
 * (the first occurrence of the answer's tail at or after where it left, else the last before), none
 * past its end or where the tail occurs nowhere. */
static void test_pred_draft(void) {
    /* predicted: a b c d e f g h c d (c d occurs twice) */
    const int ids[] = {10, 11, 12, 13, 14, 15, 16, 17, 12, 13};
    nv_pred p = {ids, 10, 0, 0};
    int out[8] = {0}, ans[16] = {0}, n_ans = 0;
    int n = nv_pred_draft(&p, ans, n_ans, 2, 4, 3, out);
    T_CHECK(n == 3 && out[0] == 10 && out[2] == 12, "start: %d (%d %d)", n, out[0], out[2]);
    const int took[] = {10, 11, 12};
    for (int i = 0; i < 3; i++) nv_pred_follow(&p, ans[n_ans++] = took[i]);
    n = nv_pred_draft(&p, ans, n_ans, 2, 4, 8, out);
    T_CHECK(p.at == 3 && n == 7 && out[0] == 13 && out[6] == 13, "followed: at %d, %d drafts", p.at, n);
    /* an edit: 99 instead of d, then e f: found again after f */
    const int edit[] = {99, 14, 15};
    for (int i = 0; i < 3; i++) nv_pred_follow(&p, ans[n_ans++] = edit[i]);
    T_CHECK(p.at == -1 && p.hint == 3, "lost: at %d hint %d", p.at, p.hint);
    n = nv_pred_draft(&p, ans, n_ans, 2, 4, 2, out);
    T_CHECK(p.at == 6 && n == 2 && out[0] == 16 && out[1] == 17, "found again: at %d, %d (%d %d)", p.at, n, out[0], out[1]);
    /* "c d" after the hint (at 8), not the earlier one */
    nv_pred q = {ids, 10, -1, 5};
    const int cd[] = {12, 13};
    T_CHECK(nv_pred_draft(&q, cd, 2, 2, 4, 4, out) == 0 && q.at == 10, "the occurrence after the hint: at %d", q.at);
    /* only before the hint: the last of those */
    nv_pred r = {ids, 10, -1, 9};
    const int ab[] = {10, 11};
    T_CHECK(nv_pred_draft(&r, ab, 2, 2, 4, 4, out) == 4 && r.at == 2 && out[0] == 12, "before the hint: at %d", r.at);
    /* no occurrence of the tail (min 2: a single token is not enough) */
    nv_pred u = {ids, 10, -1, 0};
    const int xy[] = {98, 12};
    T_CHECK(nv_pred_draft(&u, xy, 2, 2, 4, 4, out) == 0 && u.at == -1, "no match: at %d", u.at);
    T_CHECK(nv_pred_draft(&u, xy, 2, 1, 4, 4, out) == 4 && u.at == 3, "1-gram: at %d", u.at);
    /* past the end: nothing, and a token then loses the place */
    nv_pred e = {ids, 10, 10, 10};
    T_CHECK(nv_pred_draft(&e, ans, 0, 2, 4, 4, out) == 0, "past the end");
    nv_pred_follow(&e, 10);
    T_CHECK(e.at == -1, "a token past the end");
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

/* Template t renders msgs as BOS then text, one encoding. */
static void expect_render(const nv_tokenizer *tok, nv_chat_template t, const nv_chat_msg *msgs, int n_msgs, const char *text) {
    int *ids = NULL, n = 0, want[4096];
    T_CHECK(nv_chat_render(t, tok, msgs, n_msgs, &ids, &n) == NV_OK, "%s", nv_errmsg());
    const int nw = expect_ids(tok, want, text, 1, 0, NULL, 0, 0);
    T_CHECK(same_ids(ids, n, want, nw), "%s template", nv_chat_template_name(t));
    free(ids);
}

static void test_chat_templates(void) {
    nv_tokenizer *tok = tok512();
    if (!tok) return;
    nv_chat_msg msgs[] = {{.role = "system", .content = "Be kind."}, {.role = "user", .content = "Hi there"}, {.role = "assistant", .content = "Hello!"}, {.role = "user", .content = "Tell a story"}};
    nv_chat_template t0;
    int *ids = NULL, n = 0, want[4096], nw;
    expect_render(tok, NV_CHAT_PLAIN, msgs, 4, "Be kind.\nHi there\nHello!\nTell a story");
    expect_render(tok, NV_CHAT_CHATML, msgs, 4,
                  "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
                  "Hello!<|im_end|>\n<|im_start|>user\nTell a story<|im_end|>\n<|im_start|>assistant\n");
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
    /* SmolLM3's: its metadata system turn (today's date; thinking by default, the system message's
       /no_think switching it off and dropped from its text), left open; without thinking an empty
       think block before each answer and after the generation prompt; an answer's leading line
       breaks dropped; a /system_override system message alone */
    {
        char today[64], want_text[4096];
        const time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        strftime(today, sizeof today, "%d %B %Y", &tm);
        nv_chat_msg smol[] = {{.role = "system", .content = "Be kind. /no_think"}, {.role = "user", .content = "Hi there"},
                              {.role = "assistant", .content = "\n\nHello!"}, {.role = "user", .content = "Tell a story"}};
        snprintf(want_text, sizeof want_text,
                 "<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\nToday Date: %s\nReasoning Mode: /no_think\n\n"
                 "## Custom Instructions\n\nBe kind.\n\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n"
                 "Hello!<|im_end|>\n<|im_start|>user\nTell a story<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n",
                 today);
        expect_render(tok, NV_CHAT_SMOLLM3, smol, 4, want_text);
        nv_buf st = {0};
        T_CHECK(nv_chat_render_text(NV_CHAT_SMOLLM3, tok, smol + 1, 1, &(nv_chat_opts){0}, &st) == NV_OK && st.data &&
                    strstr(st.data, "Reasoning Mode: /think\n\n## Custom Instructions\n\nYou are a helpful AI assistant named SmolLM, "
                                    "trained by Hugging Face. Your role") &&
                    st.len > 71 && !strcmp(st.data + st.len - 71, "conclusion.\n\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"),
                "smollm3 thinking by default: %s", st.data ? st.data : nv_errmsg());
        nv_chat_msg over[] = {{.role = "system", .content = "/system_override Only this. /think  "}, {.role = "user", .content = "A"}};
        st.len = 0;
        T_CHECK(nv_chat_render_text(NV_CHAT_SMOLLM3, tok, over, 2, &(nv_chat_opts){0}, &st) == NV_OK && st.data &&
                    !strcmp(st.data, "<s><|im_start|>system\n Only this.<|im_end|>\n<|im_start|>user\nA<|im_end|>\n<|im_start|>assistant\n"),
                "smollm3 /system_override: %s", st.data ? st.data : nv_errmsg());
        /* tools: its xml_tools' block, each tool as Python prints the dict, the system turn closed */
        static const char *const tools[] = {"{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"it's\\n\u00a0\", "
                                            "\"parameters\": {\"x\": true, \"y\": null, \"z\": [0.5, 2, 1e-05, \"\"]}}}"};
        st.len = 0;
        T_CHECK(nv_chat_render_text(NV_CHAT_SMOLLM3, tok, over + 1, 1, &(nv_chat_opts){.tools = tools, .n_tools = 1}, &st) == NV_OK &&
                    st.data &&
                    strstr(st.data, "\n\n### Tools\n\nYou may call one or more functions to assist with the user query.\nYou are provided "
                                    "with function signatures within <tools></tools> XML tags:\n\n<tools>\n{'type': 'function', 'function': "
                                    "{'name': 'f', 'description': \"it's\\n\\xa0\", 'parameters': {'x': True, 'y': None, 'z': [0.5, 2, "
                                    "1e-05, '']}}}\n</tools>\n\nFor each function call, return a json object with function name and "
                                    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                                    "\"arguments\": <args-json-object>}\n</tool_call>\n\n<|im_end|>\n<|im_start|>user\nA<|im_end|>\n"),
                "smollm3 tools: %s", st.data ? st.data : nv_errmsg());
        nv_buf_free(&st);
        T_CHECK(!strcmp(nv_chat_template_stop(NV_CHAT_SMOLLM3), "<|im_end|>") && nv_chat_tool_style(NV_CHAT_SMOLLM3) == NV_TOOLS_HERMES,
                "smollm3's stop and calls");
    }
    nv_chat_msg spaced[] = {{.role = "developer", .content = "  Be kind.\n"}, {.role = "user", .content = "Hi there "}};
    expect_render(tok, NV_CHAT_LLAMA3, spaced, 2,
                  "<|start_header_id|>system<|end_header_id|>\n\nBe kind.<|eot_id|><|start_header_id|>user<|end_header_id|>"
                  "\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    /* DeepSeek-R1's: the system text after BOS, user and assistant markers, an earlier answer without
       its reasoning and ended by end-of-sentence */
    nv_chat_msg ds[] = {{.role = "system", .content = "Be kind."}, {.role = "user", .content = "Hi there"},
                        {.role = "assistant", .content = "<think>\nhmm\n</think>\n\nHello!"}, {.role = "user", .content = "Tell a story"}};
    expect_render(tok, NV_CHAT_DEEPSEEK, ds, 4,
                  "Be kind.<\xef\xbd\x9cUser\xef\xbd\x9c>Hi there<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>\n\nHello!"
                  "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c><\xef\xbd\x9cUser\xef\xbd\x9c>Tell a story"
                  "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>");
    /* Phi-3's: the role between <| and |>, each turn ended by <|end|> and a line break */
    expect_render(tok, NV_CHAT_PHI3, msgs, 4,
                  "<|system|>\nBe kind.<|end|>\n<|user|>\nHi there<|end|>\n<|assistant|>\nHello!<|end|>\n<|user|>\nTell a story<|end|>\n"
                  "<|assistant|>\n");
    T_CHECK(!strcmp(nv_chat_template_stop(NV_CHAT_PHI3), "<|end|>") && nv_chat_template_parse("phi3", &t0) == NV_OK && t0 == NV_CHAT_PHI3,
            "phi3's stop and name");
    T_CHECK(!strcmp(nv_chat_template_stop(NV_CHAT_DEEPSEEK), "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>") &&
                nv_chat_template_parse("deepseek", &t0) == NV_OK && t0 == NV_CHAT_DEEPSEEK,
            "deepseek's stop and name");
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

/* Ollama's context on llama2.c's vocabulary (nv_chat_render_history; the templates that render turn
 * after turn: test_tokenizer_bpe): plain's is the prompt's text with the answer right after it, as
 * /api/generate's answer went on from it; mistral (the system text goes in the last user message)
 * falls back to the training turn; a history ends with an answer. */
static void test_chat_history(void) {
    nv_tokenizer *tok = tok512();
    if (!tok) return;
    const nv_chat_msg msgs[] = {{.role = "system", .content = "Be kind."}, {.role = "user", .content = "Hi there"},
                                {.role = "assistant", .content = "Hello!"}};
    const nv_chat_opts none = {0};
    int *hist = NULL, nh = 0, want[4096], nw;
    T_CHECK(nv_chat_render_history(NV_CHAT_PLAIN, tok, msgs, 3, &none, &hist, &nh) == NV_OK, "plain: %s", nv_errmsg());
    nw = expect_ids(tok, want, "Be kind.\nHi thereHello!", 1, 0, NULL, 0, 0);
    T_CHECK(same_ids(hist, nh, want, nw), "plain: not the prompt's text with the answer after it");
    free(hist);
    int *turn = NULL, nt = 0, np = 0;
    T_CHECK(nv_chat_render_history(NV_CHAT_MISTRAL, tok, msgs, 3, &none, &hist, &nh) == NV_OK &&
                nv_chat_render_turn(NV_CHAT_MISTRAL, tok, msgs, 3, &none, &turn, &nt, &np) == NV_OK && same_ids(hist, nh, turn, nt),
            "mistral: not the training turn (%s)", nv_errmsg());
    free(hist), free(turn);
    T_CHECK(nv_chat_render_history(NV_CHAT_CHATML, tok, msgs, 2, &none, &hist, &nh) == NV_EINVAL, "a history must end with an answer");
    nv_tokenizer_free(tok);
}

/* The prompt as text (/apply-template): BOS and EOS spelled where the ids have them, the same
 * ids as the token rendering where the text encodes as one piece; the Jinja forms recognised
 * exactly and only as themselves (their renderings are checked against jinja2 and transformers.js
 * by scripts/chat_template_check.py, which test_serve runs). */
static void test_chat_template_text(void) {
    nv_tokenizer *tok = tok512();
    if (!tok) return;
    nv_chat_msg msgs[] = {{.role = "system", .content = "Be kind."}, {.role = "user", .content = "Hi there"},
                          {.role = "assistant", .content = "Hello!"}, {.role = "user", .content = "Tell a story"}};
    const nv_chat_opts none = {0};
    for (int t = NV_CHAT_PLAIN; t <= NV_CHAT_GRANITE; t++) {
        if (t == NV_CHAT_GEMMA) continue; /* its vocabulary's own: tests/test_archs.c */
        nv_buf text = {0};
        int *ids = NULL, n = 0, *again = NULL, na = 0;
        T_CHECK(nv_chat_render_text((nv_chat_template)t, tok, msgs, 4, &none, &text) == NV_OK && text.data, "%s", nv_errmsg());
        T_CHECK(nv_chat_render((nv_chat_template)t, tok, msgs, 4, &ids, &n) == NV_OK, "%s", nv_errmsg());
        if (t == NV_CHAT_LLAMA2) { /* per exchange: BOS ... EOS, then the open turn */
            T_CHECK(text.data && !strcmp(text.data, "<s>[INST] <<SYS>>\nBe kind.\n<</SYS>>\n\nHi there [/INST] Hello! </s>"
                                                     "<s>[INST] Tell a story [/INST]"),
                    "llama2 text: %s", text.data);
        } else if (t == NV_CHAT_GRANITE) { /* no line break after the role, each turn ended by <|end_of_text|> and one */
            T_CHECK(text.data && !strcmp(text.data, "<s><|start_of_role|>system<|end_of_role|>Be kind.<|end_of_text|>\n"
                                                     "<|start_of_role|>user<|end_of_role|>Hi there<|end_of_text|>\n"
                                                     "<|start_of_role|>assistant<|end_of_role|>Hello!<|end_of_text|>\n"
                                                     "<|start_of_role|>user<|end_of_role|>Tell a story<|end_of_text|>\n"
                                                     "<|start_of_role|>assistant<|end_of_role|>"),
                    "granite text: %s", text.data);
        }
        if (t != NV_CHAT_LLAMA2) { /* one text after BOS */
            T_CHECK(text.data && !strncmp(text.data, "<s>", 3) &&
                        nv_tokenizer_encode(tok, text.data + 3, 1, 0, &again, &na) == NV_OK && na == n &&
                        !memcmp(again, ids, (size_t)n * sizeof *ids),
                    "%s: the text does not encode to the prompt's ids: %s", nv_chat_template_name((nv_chat_template)t),
                    text.data ? text.data : "");
        }
        free(ids);
        free(again);
        nv_buf_free(&text);
        const char *j = nv_chat_template_jinja((nv_chat_template)t);
        nv_chat_template back = NV_CHAT_PLAIN;
        T_CHECK(j && nv_chat_template_of_jinja(j, strlen(j), &back) && back == (nv_chat_template)t,
                "%s: its Jinja form is not recognised", nv_chat_template_name((nv_chat_template)t));
        T_CHECK(j && !nv_chat_template_of_jinja(j, strlen(j) - 1, &back), "a cut Jinja form recognised");
    }
    /* the endpoint: tools and kwargs as a chat request has them; the request's errors as 400s */
    nv_api_ctx ctx = {.model_id = "m", .tok = tok, .tmpl = NV_CHAT_CHATML, .seq_len = 512, .vocab_size = 512, .capacity = 100, .reasoning = 0, .dim = 64};
    nv_api_error e;
    char *out = NULL;
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"chat_template_kwargs\":{\"enable_thinking\":false},"
                       "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}]}";
    T_CHECK(nv_api_apply_template(&ctx, body, strlen(body), &out, &e) == 0 && out, "%s", e.message);
    cJSON *root = cJSON_Parse(out);
    const cJSON *prompt = cJSON_GetObjectItem(root, "prompt");
    T_CHECK(cJSON_IsString(prompt) && !strncmp(prompt->valuestring, "<s><|im_start|>system\n# Tools", 29) &&
                strstr(prompt->valuestring, "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}") &&
                strstr(prompt->valuestring, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"),
            "apply-template: %s", out);
    cJSON_Delete(root);
    free(out);
    static const struct {
        const char *body, *param;
    } bad[] = {{"{}", "messages"},
               {"{\"messages\":[]}", "messages"},
               {"{\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}", "messages"},
               {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\"}]}", "tools"},
               {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":3}", "chat_template_kwargs"},
               {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"continue_final_message\":true}", "continue_final_message"},
               {"[1]", NULL},
               {"{bad", NULL}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        out = NULL;
        const int rc = nv_api_apply_template(&ctx, bad[i].body, strlen(bad[i].body), &out, &e);
        T_CHECK(rc == 400 && !out && (!bad[i].param || !strncmp(e.param, bad[i].param, strlen(bad[i].param))),
                "%s: %d %s (%s)", bad[i].body, rc, e.message, e.param);
        free(out);
    }
    nv_tokenizer_free(tok);
}

/* Mistral Small 3.2's form: the grammar of tool_choice required (and auto's, once [TOOL_CALLS] comes)
 * holds NAME[CALL_ID]ID[ARGS]{...}, ID nine letters and digits. */
static void test_api_call_id_grammar(void) {
    nv_tokenizer *tok = tok512();
    if (!tok) return;
    nv_api_ctx ctx = {.model_id = "m", .tok = tok, .tmpl = NV_CHAT_MISTRAL, .seq_len = 2048, .vocab_size = 512, .capacity = 2048, .dim = 64,
                      .jinja_tools = NV_TOOLS_MISTRAL_CALL_ID};
    static const char fmt[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"tool_choice\":\"%s\",\"tools\":["
                              "{\"type\":\"function\",\"function\":{\"name\":\"play\",\"parameters\":{\"type\":\"object\","
                              "\"properties\":{\"toy\":{\"type\":\"string\"}},\"required\":[\"toy\"]}}}]}";
    static const struct {
        const char *text;
        int whole; /* 1: a whole answer the grammar takes; 0: refused on the way */
    } cases[] = {
        {"[TOOL_CALLS]play[CALL_ID]a1B2c3D4e[ARGS]{\"toy\": \"ball\"}", 1},
        {"[TOOL_CALLS]play[CALL_ID]a1B2c3D4e[ARGS]{\"toy\": \"ball\"}[TOOL_CALLS]play[CALL_ID]zzzzzzzzz[ARGS]{\"toy\":\"car\"}", 1},
        {"[TOOL_CALLS]play[ARGS]{\"toy\": \"ball\"}", 0},                  /* no id */
        {"[TOOL_CALLS]play[CALL_ID]a1B2c3D4[ARGS]{\"toy\": \"ball\"}", 0}, /* eight */
        {"[TOOL_CALLS]play[CALL_ID]a1B2c3D4e5[ARGS]{\"toy\": \"ball\"}", 0}, /* ten */
        {"[TOOL_CALLS]play[CALL_ID]a1B2c-D4e[ARGS]{\"toy\": \"ball\"}", 0},  /* not a letter or digit */
        {"[TOOL_CALLS]play[CALL_ID]a1B2c3D4e[ARGS]{}", 0},                  /* the schema's required key */
    };
    for (int required = 0; required < 2; required++) {
        char body[768];
        snprintf(body, sizeof body, fmt, required ? "required" : "auto");
        nv_api_request r;
        nv_api_error e;
        T_CHECK(nv_api_parse(&ctx, 1, body, strlen(body), &r, &e) == 0, "%s", e.message);
        nv_grammar *g = required ? r.req.grammar : r.req.lazy_grammar;
        T_CHECK(g && (required || !strcmp(r.req.lazy_trigger, "[TOOL_CALLS]")), "required %d: a grammar", required);
        for (size_t i = 0; g && i < sizeof cases / sizeof cases[0]; i++) {
            nv_gmatch *m = nv_gmatch_new(g);
            const int fed = m && nv_gmatch_feed(m, cases[i].text, strlen(cases[i].text));
            T_CHECK(fed == cases[i].whole && (!fed || nv_gmatch_done(m)), "required %d: %s %s", required, cases[i].text,
                    cases[i].whole ? "refused" : "taken");
            nv_gmatch_free(m);
        }
        nv_api_request_free(&r);
    }
    nv_tokenizer_free(tok);
}

/* Under tool_choice auto, where the calls are the rest of the answer (Mistral's forms), the lazy grammar
 * holds all of them: several where parallel_tool_calls, one where not. */
static void test_api_lazy_parallel_calls(void) {
    nv_tokenizer *tok = tok512();
    if (!tok) return;
    nv_api_ctx ctx = {.model_id = "m", .tok = tok, .tmpl = NV_CHAT_MISTRAL, .seq_len = 2048, .vocab_size = 512, .capacity = 2048, .dim = 64,
                      .jinja_tools = NV_TOOLS_MISTRAL_ARGS};
    static const char fmt[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"parallel_tool_calls\":%s,\"tools\":["
                              "{\"type\":\"function\",\"function\":{\"name\":\"play\",\"parameters\":{\"type\":\"object\"}}}]}";
    const char *two = "[TOOL_CALLS]play[ARGS]{}[TOOL_CALLS]play[ARGS]{\"a\": 1}";
    for (int parallel = 0; parallel < 2; parallel++) {
        char body[512];
        snprintf(body, sizeof body, fmt, parallel ? "true" : "false");
        nv_api_request r;
        nv_api_error e;
        T_CHECK(nv_api_parse(&ctx, 1, body, strlen(body), &r, &e) == 0 && r.req.lazy_grammar && r.req.lazy_ends &&
                    !strcmp(r.req.lazy_trigger, "[TOOL_CALLS]"),
                "%s", e.message);
        nv_gmatch *m = r.req.lazy_grammar ? nv_gmatch_new(r.req.lazy_grammar) : NULL;
        T_CHECK(m && nv_gmatch_feed(m, two, strlen(two)) == parallel, "parallel %d: two calls %s", parallel, parallel ? "refused" : "taken");
        nv_gmatch_free(m);
        nv_api_request_free(&r);
    }
    nv_tokenizer_free(tok);
}

static void test_api_parse_defaults_and_limits(void) {
    nv_tokenizer *tok = tok512();
    if (!tok) return;
    nv_api_ctx ctx = {.model_id = "m", .tok = tok, .tmpl = NV_CHAT_CHATML, .seq_len = 512, .vocab_size = 512, .capacity = 100, .reasoning = 0, .dim = 64};
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
    /* max_tokens -1 (llama.cpp's "no limit"): the room there is, on either route; -2 is refused */
    const char *unl = "{\"prompt\":\"Once\",\"max_tokens\":-1}";
    T_CHECK(nv_api_parse(&ctx, 0, unl, strlen(unl), &r, &e) == 0 && r.req.max_tokens == 100 - r.req.n_prompt + 1, "max_tokens -1: %d %s",
            r.req.max_tokens, e.message);
    nv_api_request_free(&r);
    const char *neg = "{\"prompt\":\"Once\",\"max_tokens\":-2}";
    T_CHECK(nv_api_parse(&ctx, 0, neg, strlen(neg), &r, &e) == 400 && !strcmp(e.param, "max_tokens"), "max_tokens -2 accepted");
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
    /* top_k: -1, 0 and the whole vocabulary or more are off; min_p as given */
    const char *filt = "{\"prompt\":\"Once\",\"top_k\":100000,\"min_p\":0.05}";
    T_CHECK(nv_api_parse(&ctx, 0, filt, strlen(filt), &r, &e) == 0 && r.req.top_k == 0 && r.req.min_p == 0.05f,
            "top_k %d min_p %g", r.req.top_k, (double)r.req.min_p);
    nv_api_request_free(&r);
    const char *off = "{\"prompt\":\"Once\",\"top_k\":-1}";
    T_CHECK(nv_api_parse(&ctx, 0, off, strlen(off), &r, &e) == 0 && r.req.top_k == 0 && r.req.min_p == 0.0f, "top_k -1: %d",
            r.req.top_k);
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
    nv_api_ctx ctx = {.model_id = "m", .tok = tok, .tmpl = NV_CHAT_CHATML, .seq_len = 512, .vocab_size = 512, .capacity = 400, .reasoning = 0, .dim = 64};
    nv_api_request a, b;
    nv_api_error e;
    const char *on = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"chat_template_kwargs\":{\"enable_thinking\":true}}";
    const char *off = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"chat_template_kwargs\":{\"enable_thinking\":false}}";
    T_CHECK(nv_api_parse(&ctx, 1, on, strlen(on), &a, &e) == 0 && nv_api_parse(&ctx, 1, off, strlen(off), &b, &e) == 0, "%s", e.message);
    int *ids = NULL, n = 0;
    T_CHECK(nv_chat_render_ex(NV_CHAT_CHATML, tok, (nv_chat_msg[]){{.role = "user", .content = "Hi"}}, 1, 1, &ids, &n) == NV_OK, "%s", nv_errmsg());
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
    nv_api_ctx ctx = {.model_id = "m", .tok = tok, .tmpl = NV_CHAT_PLAIN, .seq_len = 512, .vocab_size = 512, .capacity = 100, .reasoning = 0, .dim = 64};
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
    nv_api_choice ch[2] = {{.text = "Hello", .finish = "stop", .reasoning = "thought"}, {.text = "Hi", .finish = "stop"}};
    char *body = nv_api_response_choices(&m, ch, 2, 3, 4, 0);
    T_CHECK(body && strstr(body, "\"content\":\"Hello\",\"reasoning_content\":\"thought\"") &&
                !strstr(strstr(body, "\"Hi\""), "reasoning_content"),
            "%s", body ? body : "-");
    free(body);
    body = nv_api_reasoning_chunk(&m, "step", 0);
    T_CHECK(body && strstr(body, "\"delta\":{\"reasoning_content\":\"step\"}"), "%s", body ? body : "-");
    free(body);
}

/* Python's json.dumps, as the templates' tojson prints a tool (the strings Python 3 gives). */
static void test_py_json(void) {
    cJSON *j = cJSON_Parse("{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"a\":[1,2.5,true,null],"
                           "\"s\":\"x\\\"\\n\xc3\xa9\",\"e\":{},\"l\":[]}}}");
    nv_buf b = {0};
    nv_py_json(&b, j, 0);
    T_CHECK(b.data && !strcmp(b.data, "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"a\": [1, 2.5, "
                                      "true, null], \"s\": \"x\\\"\\n\xc3\xa9\", \"e\": {}, \"l\": []}}}"),
            "compact: %s", b.data);
    nv_buf_free(&b);
    nv_py_json(&b, cJSON_GetObjectItem(cJSON_GetObjectItem(j, "function"), "parameters"), 4);
    T_CHECK(b.data && !strcmp(b.data, "{\n    \"a\": [\n        1,\n        2.5,\n        true,\n        null\n    ],\n    \"s\": "
                                      "\"x\\\"\\n\xc3\xa9\",\n    \"e\": {},\n    \"l\": []\n}"),
            "indent 4: %s", b.data);
    nv_buf_free(&b);
    cJSON_Delete(j);
}

/* Tools in each template, and the messages that carry calls and results. */
static void test_chat_tools(void) {
    nv_tokenizer *tok = tok512();
    if (!tok) return;
    const char *tools[] = {"{\"type\": \"function\", \"function\": {\"name\": \"f\"}}"};
    nv_chat_call call = {"f", "{\"x\": 1}", NULL};
    nv_chat_msg msgs[] = {{.role = "system", .content = "Be kind."},
                          {.role = "user", .content = "Hi"},
                          {.role = "assistant", .content = "", .calls = &call, .n_calls = 1},
                          {.role = "tool", .content = "42"},
                          {.role = "tool", .content = "43"}};
    nv_chat_opts o = {.tools = tools, .n_tools = 1};
    const char *hermes = "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
                         "function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": "
                         "{\"name\": \"f\"}}\n</tools>\n\nFor each function call, return a json object with function name and "
                         "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                         "\"arguments\": <args-json-object>}\n</tool_call>";
    char want_text[4096];
    int *ids = NULL, n = 0, want[4096], nw;
    /* chatml: Qwen's template, the two results in one user turn */
    snprintf(want_text, sizeof want_text,
             "<|im_start|>system\nBe kind.\n\n%s<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
             "{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n42\n"
             "</tool_response>\n<tool_response>\n43\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
             hermes);
    T_CHECK(nv_chat_render_opts(NV_CHAT_CHATML, tok, msgs, 5, &o, &ids, &n) == NV_OK, "%s", nv_errmsg());
    nw = expect_ids(tok, want, want_text, 1, 0, NULL, 0, 0);
    T_CHECK(same_ids(ids, n, want, nw), "chatml with tools");
    free(ids);
    /* llama3: Meta's 3.1 JSON format */
    const char *tools4[] = {"{\n    \"type\": \"function\"\n}"};
    nv_chat_opts o4 = {.tools = tools4, .n_tools = 1};
    T_CHECK(nv_chat_render_opts(NV_CHAT_LLAMA3, tok, msgs, 4, &o4, &ids, &n) == NV_OK, "%s", nv_errmsg());
    nw = expect_ids(tok, want,
                    "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n\nBe kind.<|eot_id|>"
                    "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a "
                    "function call with its proper arguments that best answers the given prompt.\n\nRespond in the format "
                    "{\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use variables."
                    "\n\n{\n    \"type\": \"function\"\n}\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
                    "{\"name\": \"f\", \"parameters\": {\"x\": 1}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n42"
                    "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
                    1, 0, NULL, 0, 0);
    T_CHECK(same_ids(ids, n, want, nw), "llama3 with tools");
    free(ids);
    /* plain: the tools first, results as <tool_response> lines */
    snprintf(want_text, sizeof want_text,
             "%s\nBe kind.\nHi\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_response>\n42\n"
             "</tool_response>",
             hermes);
    T_CHECK(nv_chat_render_opts(NV_CHAT_PLAIN, tok, msgs, 4, &o, &ids, &n) == NV_OK, "%s", nv_errmsg());
    nw = expect_ids(tok, want, want_text, 1, 0, NULL, 0, 0);
    T_CHECK(same_ids(ids, n, want, nw), "plain with tools");
    free(ids);
    /* granite: Granite 3's own turns; the tools one JSON list, each result a tool_response turn */
    const char *granite_tools[] = {"{\n    \"type\": \"function\"\n}", "{\n    \"a\": [\n        1\n    ]\n}"};
    nv_chat_opts og = {.tools = granite_tools, .n_tools = 2};
    const char *granite_list = "<|start_of_role|>available_tools<|end_of_role|>[\n    {\n        \"type\": \"function\"\n    },\n"
                               "    {\n        \"a\": [\n            1\n        ]\n    }\n]<|end_of_text|>\n";
    nv_chat_call two[] = {{"f", "{\"x\": 1}", "a1b2c3d4e"}, {"g", "{}", NULL}};
    msgs[2].calls = two, msgs[2].n_calls = 2;
    nv_buf text = {0};
    snprintf(want_text, sizeof want_text,
             "<s><|start_of_role|>system<|end_of_role|>Be kind.<|end_of_text|>\n%s<|start_of_role|>user<|end_of_role|>Hi"
             "<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|><|tool_call|>[{\"name\": \"f\", \"arguments\": "
             "{\"x\": 1}}, {\"name\": \"g\", \"arguments\": {}}]<|end_of_text|>\n<|start_of_role|>tool_response<|end_of_role|>42"
             "<|end_of_text|>\n<|start_of_role|>tool_response<|end_of_role|>43<|end_of_text|>\n"
             "<|start_of_role|>assistant<|end_of_role|>",
             granite_list);
    T_CHECK(nv_chat_render_text(NV_CHAT_GRANITE, tok, msgs, 5, &og, &text) == NV_OK && text.data && !strcmp(text.data, want_text),
            "granite with tools: %s", text.data ? text.data : nv_errmsg());
    /* no system message: Granite's own line saying tools exist */
    text.len = 0;
    snprintf(want_text, sizeof want_text,
             "<s><|start_of_role|>system<|end_of_role|>You are Granite, developed by IBM. You are a helpful AI assistant with "
             "access to the following tools. When a tool is required to answer the user's query, respond with <|tool_call|> "
             "followed by a JSON list of tools used. If a tool does not exist in the provided list of tools, notify the user "
             "that you do not have the ability to fulfill the request.<|end_of_text|>\n%s<|start_of_role|>user<|end_of_role|>Hi"
             "<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>",
             granite_list);
    T_CHECK(nv_chat_render_text(NV_CHAT_GRANITE, tok, msgs + 1, 1, &og, &text) == NV_OK && text.data && !strcmp(text.data, want_text),
            "granite's own system line: %s", text.data ? text.data : nv_errmsg());
    /* a turn to train on: the answer's calls as the model writes them, then <|end_of_text|> */
    int np = 0;
    T_CHECK(nv_chat_render_turn(NV_CHAT_GRANITE, tok, msgs + 1, 2, &og, &ids, &n, &np) == NV_OK, "%s", nv_errmsg());
    text.len = 0;
    T_CHECK(nv_chat_render_text(NV_CHAT_GRANITE, tok, msgs + 1, 1, &og, &text) == NV_OK && text.data, "%s", nv_errmsg());
    nv_buf_puts(&text, "<|tool_call|>[{\"name\": \"f\", \"arguments\": {\"x\": 1}}, {\"name\": \"g\", \"arguments\": {}}]"
                       "<|end_of_text|>");
    nw = expect_ids(tok, want, text.data + 3, 1, 0, NULL, 0, 0);
    T_CHECK(same_ids(ids, n, want, nw) && np > 0 && np < n, "granite's answer with calls");
    free(ids);
    nv_buf_free(&text);
    /* mistral: Mistral's v3 turns, the system text and the tools before the last user message, the
       calls with their ids (the answer's text not shown), EOS after each answer */
    const char *one_line[] = {"{\"type\": \"function\", \"function\": {\"name\": \"f\"}}"};
    nv_chat_opts om = {.tools = one_line, .n_tools = 1};
    msgs[2].content = "Checking.";
    msgs[3].tool_call_id = "a1b2c3d4e";
    nv_chat_msg more[7];
    memcpy(more, msgs, sizeof msgs);
    more[5] = (nv_chat_msg){.role = "assistant", .content = "  Done. "};
    more[6] = (nv_chat_msg){.role = "user", .content = "Thanks"};
    text.len = 0;
    T_CHECK(nv_chat_render_text(NV_CHAT_MISTRAL, tok, more, 7, &om, &text) == NV_OK && text.data &&
                !strcmp(text.data, "<s>[INST] Hi[/INST][TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"x\": 1}, \"id\": \"a1b2c3d4e\"}, "
                                   "{\"name\": \"g\", \"arguments\": {}, \"id\": \"\"}]</s>[TOOL_RESULTS] {\"content\": 42, \"call_id\": "
                                   "\"a1b2c3d4e\"}[/TOOL_RESULTS][TOOL_RESULTS] {\"content\": 43, \"call_id\": \"\"}[/TOOL_RESULTS] Done.</s>"
                                   "[AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}][/AVAILABLE_TOOLS]"
                                   "[INST] Be kind.\n\nThanks[/INST]"),
            "mistral: %s", text.data ? text.data : nv_errmsg());
    /* the ids: BOS once, EOS (the token) after each answer */
    T_CHECK(nv_chat_render_opts(NV_CHAT_MISTRAL, tok, more, 7, &om, &ids, &n) == NV_OK, "%s", nv_errmsg());
    int eos = 0, bos = 0;
    for (int i = 0; i < n; i++) eos += ids[i] == nv_tokenizer_eos(tok), bos += ids[i] == nv_tokenizer_bos(tok);
    T_CHECK(eos == 2 && bos == 1 && ids[0] == nv_tokenizer_bos(tok), "mistral: %d EOS, %d BOS", eos, bos);
    free(ids);
    nv_buf_free(&text);
    msgs[2].content = "", msgs[3].tool_call_id = NULL;
    msgs[2].calls = &call, msgs[2].n_calls = 1;
    /* phi4-mini: Phi-4-mini's turns without line breaks, the tools' functions between <|tool|> and
       <|/tool|> in the system turn (an empty one without a system message), calls as Granite's list
       closed by <|/tool_call|>, results as tool turns (BOS as this vocabulary adds it; Phi-4-mini's
       adds none) */
    const char *fn[] = {"{\"name\": \"f\"}"};
    nv_chat_opts o4m = {.tools = fn, .n_tools = 1};
    text.len = 0;
    T_CHECK(nv_chat_render_text(NV_CHAT_PHI4_MINI, tok, msgs, 4, &o4m, &text) == NV_OK && text.data &&
                !strcmp(text.data, "<s><|system|>Be kind.<|tool|>[{\"name\": \"f\"}]<|/tool|><|end|><|user|>Hi<|end|><|assistant|>"
                                   "<|tool_call|>[{\"name\": \"f\", \"arguments\": {\"x\": 1}}]<|/tool_call|><|end|><|tool|>42<|end|>"
                                   "<|assistant|>"),
            "phi4-mini: %s", text.data ? text.data : nv_errmsg());
    text.len = 0;
    T_CHECK(nv_chat_render_text(NV_CHAT_PHI4_MINI, tok, msgs + 1, 1, &o4m, &text) == NV_OK && text.data &&
                !strcmp(text.data, "<s><|system|><|tool|>[{\"name\": \"f\"}]<|/tool|><|end|><|user|>Hi<|end|><|assistant|>"),
            "phi4-mini without a system message: %s", text.data ? text.data : nv_errmsg());
    text.len = 0;
    T_CHECK(nv_chat_render_text(NV_CHAT_PHI4_MINI, tok, msgs, 2, &(nv_chat_opts){0}, &text) == NV_OK && text.data &&
                !strcmp(text.data, "<s><|system|>Be kind.<|end|><|user|>Hi<|end|><|assistant|>"),
            "phi4-mini without tools: %s", text.data ? text.data : nv_errmsg());
    /* phi4: Phi-4's ChatML turns, <|im_sep|> after the role and no line breaks; tools as ChatML's */
    text.len = 0;
    static const char phi4_head[] = "<s><|im_start|>system<|im_sep|>Be kind.\n\n# Tools";
    T_CHECK(nv_chat_render_text(NV_CHAT_PHI4, tok, msgs, 4, &o, &text) == NV_OK && text.data &&
                !strncmp(text.data, phi4_head, sizeof phi4_head - 1) &&
                strstr(text.data, "</tool_call><|im_end|><|im_start|>user<|im_sep|>Hi<|im_end|><|im_start|>assistant<|im_sep|><tool_call>\n{\"name\": \"f\", "
                                  "\"arguments\": {\"x\": 1}}\n</tool_call><|im_end|><|im_start|>user<|im_sep|><tool_response>\n42\n"
                                  "</tool_response><|im_end|><|im_start|>assistant<|im_sep|>"),
            "phi4: %s", text.data ? text.data : nv_errmsg());
    text.len = 0;
    T_CHECK(nv_chat_render_text(NV_CHAT_PHI4, tok, msgs, 2, &(nv_chat_opts){0}, &text) == NV_OK && text.data &&
                !strcmp(text.data, "<s><|im_start|>system<|im_sep|>Be kind.<|im_end|><|im_start|>user<|im_sep|>Hi<|im_end|>"
                                   "<|im_start|>assistant<|im_sep|>"),
            "phi4 without tools: %s", text.data ? text.data : nv_errmsg());
    /* olmo2: OLMo 2's turns (<|role|>, a line break, the text, a line break), an answer ended by EOS then
       a line break, the generation prompt after every conversation; tools as ChatML's in a system turn */
    text.len = 0;
    T_CHECK(nv_chat_render_text(NV_CHAT_OLMO2, tok, msgs, 2, &(nv_chat_opts){0}, &text) == NV_OK && text.data &&
                !strcmp(text.data, "<s><|system|>\nBe kind.\n<|user|>\nHi\n<|assistant|>\n"),
            "olmo2 without tools: %s", text.data ? text.data : nv_errmsg());
    text.len = 0;
    static const char olmo2_head[] = "<s><|system|>\nBe kind.\n\n# Tools";
    T_CHECK(nv_chat_render_text(NV_CHAT_OLMO2, tok, msgs, 4, &o, &text) == NV_OK && text.data &&
                !strncmp(text.data, olmo2_head, sizeof olmo2_head - 1) &&
                strstr(text.data, "</tool_call>\n<|user|>\nHi\n<|assistant|>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n"
                                  "</tool_call></s>\n<|user|>\n<tool_response>\n42\n</tool_response>\n<|assistant|>\n"),
            "olmo2: %s", text.data ? text.data : nv_errmsg());
    T_CHECK(nv_chat_render_opts(NV_CHAT_OLMO2, tok, msgs, 4, &o, &ids, &n) == NV_OK, "%s", nv_errmsg());
    eos = bos = 0;
    for (int i = 0; i < n; i++) eos += ids[i] == nv_tokenizer_eos(tok), bos += ids[i] == nv_tokenizer_bos(tok);
    T_CHECK(eos == 1 && bos == 1 && ids[0] == nv_tokenizer_bos(tok) && nv_chat_template_stop(NV_CHAT_OLMO2) == NULL,
            "olmo2: %d EOS, %d BOS; its answers end at EOS", eos, bos);
    free(ids);
    T_CHECK(nv_chat_tool_style(NV_CHAT_PHI4_MINI) == NV_TOOLS_PHI4_MINI && !strcmp(nv_chat_tool_token(NV_CHAT_PHI4_MINI), "<|tool_call|>") &&
                !strcmp(nv_chat_template_stop(NV_CHAT_PHI4_MINI), "<|end|>"),
            "phi4-mini's calls, marker and stop");
    nv_buf_free(&text);
    nv_tokenizer_free(tok);
}

/* Calls out of an answer, fed whole and byte by byte (the two must agree). */
typedef struct {
    const char *text;
    const char *content;
    int n_calls;
    const char *name0, *args0;
} tool_case;

/* The tools the XML cases' values are read by (their schemas say each value's kind). */
static const char xml_tools[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},\"hourly\":{\"type\":\"boolean\"},"
    "\"opts\":{\"type\":\"object\"},\"note\":{\"type\":[\"string\",\"null\"]},\"ratio\":{\"type\":\"number\"},"
    "\"ids\":{\"$ref\":\"#/$defs/ids\"}},\"$defs\":{\"ids\":{\"type\":\"array\"}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"play\",\"parameters\":{\"type\":\"object\",\"properties\":{},"
    "\"additionalProperties\":{\"type\":\"integer\"}}}}]";

/* The content and calls of answer text in style (the tools get_weather and play; XML's values read by
 * xml_tools), fed whole or byte by byte; *tools the schemas to free (NULL: none). */
static void parse_answer(nv_tool_style style, const char *text, int bytewise, cJSON **tools, nv_buf *content, nv_tool_call **calls,
                         int *n) {
    static const char *names[] = {"get_weather", "play"};
    *tools = style == NV_TOOLS_XML ? cJSON_Parse(xml_tools) : NULL;
    nv_tool_parser p = {.style = style, .names = names, .n_names = 2, .tools = *tools};
    const size_t len = strlen(text);
    if (bytewise)
        for (size_t i = 0; i < len; i++) nv_tool_parser_feed(&p, text + i, 1, 0, content, calls, n);
    nv_tool_parser_feed(&p, bytewise ? "" : text, bytewise ? 0 : len, 1, content, calls, n);
    nv_tool_parser_free(&p);
}

static void run_tool_case(nv_tool_style style, const tool_case *c, int bytewise) {
    cJSON *tools;
    nv_buf content = {0};
    nv_tool_call *calls = NULL;
    int n = 0;
    parse_answer(style, c->text, bytewise, &tools, &content, &calls, &n);
    const char *got = content.data ? content.data : "";
    T_CHECK(!strcmp(got, c->content) && n == c->n_calls, "%s (%s): content '%s' (want '%s'), %d calls (want %d)", c->text,
            bytewise ? "byte by byte" : "whole", got, c->content, n, c->n_calls);
    /* ids: OpenAI's "call_" and 24 letters and digits; Mistral's 9 letters and digits */
    const int mistral = style == NV_TOOLS_MISTRAL || nv_tool_style_mistral_args(style);
    if (n && c->name0)
        T_CHECK(!strcmp(calls[0].name, c->name0) && !strcmp(calls[0].arguments, c->args0) &&
                    (mistral || !strncmp(calls[0].id, "call_", 5)) && strlen(calls[0].id) == (mistral ? 9 : 29) &&
                    strspn(calls[0].id + (mistral ? 0 : 5), "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") ==
                        (mistral ? 9 : 24),
                "%s: call %s %s %s", c->text, calls[0].name, calls[0].arguments, calls[0].id);
    nv_tool_calls_free(calls, n);
    nv_buf_free(&content);
    cJSON_Delete(tools);
}

/* The ids of the calls in text (MISTRAL_CALL_ID style, every byte fed alone), ", "-joined into got. */
static void call_ids_of(const char *text, char *got, size_t cap) {
    cJSON *tools;
    nv_buf content = {0};
    nv_tool_call *calls = NULL;
    int n = 0;
    parse_answer(NV_TOOLS_MISTRAL_CALL_ID, text, 1, &tools, &content, &calls, &n);
    *got = '\0';
    for (int i = 0; i < n; i++) snprintf(got + strlen(got), cap - strlen(got), "%s%s", i ? ", " : "", calls[i].id);
    nv_tool_calls_free(calls, n);
    nv_buf_free(&content);
}

/* Mistral Small 3.2's calls carry the model's own ids, which its template writes again with the
 * results: kept where they are Mistral ids (9 letters and digits), else a new one of that form. */
static void test_tool_parser_call_ids(void) {
    char got[256];
    call_ids_of("[TOOL_CALLS]play[CALL_ID]a1B2c3D4e[ARGS]{}[TOOL_CALLS]get_weather[CALL_ID]Zz9Yy8Xx7[ARGS]{\"city\":\"Oslo\"}", got,
                sizeof got);
    T_CHECK(!strcmp(got, "a1B2c3D4e, Zz9Yy8Xx7"), "the model's ids: %s", got);
    /* an id given twice: the second call gets its own, so each result names one call */
    call_ids_of("[TOOL_CALLS]play[CALL_ID]abcdefghi[ARGS]{}[TOOL_CALLS]play[CALL_ID]abcdefghi[ARGS]{\"a\":1}", got, sizeof got);
    T_CHECK(strlen(got) == 20 && !strncmp(got, "abcdefghi, ", 11) && strcmp(got + 11, "abcdefghi"), "an id twice: %s", got);
    static const char *const other[] = {"[TOOL_CALLS]play[CALL_ID]abc[ARGS]{}", "[TOOL_CALLS]play[CALL_ID]abcdefghij[ARGS]{}",
                                        "[TOOL_CALLS]play[CALL_ID]abcd_fghi[ARGS]{}", "[TOOL_CALLS]play[CALL_ID][ARGS]{}",
                                        "[TOOL_CALLS]play[ARGS]{}"};
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
        call_ids_of(other[i], got, sizeof got);
        T_CHECK(strlen(got) == 9 && strspn(got, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") == 9 &&
                    strcmp(got, "abcdefghi") && strcmp(got, "abcdefghij"),
                "%s: a new Mistral id, got '%s'", other[i], got);
    }
}

static void run_tool_cases(nv_tool_style style, const tool_case *cases, size_t n) {
    for (size_t i = 0; i < n; i++)
        for (int bw = 0; bw < 2; bw++) run_tool_case(style, &cases[i], bw);
}

static void test_tool_parser(void) {
    static const tool_case hermes[] = {
        {"Just text, <tool_ no call.", "Just text, <tool_ no call.", 0, NULL, NULL},
        {"  spaced answer \n", "  spaced answer \n", 0, NULL, NULL},
        {"<tool_call>\n{\"name\": \"play\", \"arguments\": {\"toy\": \"ball\"}}\n</tool_call>", "", 1, "play", "{\"toy\":\"ball\"}"},
        {"Let me look.\n\n<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}\n</tool_call>\n<tool_call>"
         "{\"name\":\"play\",\"arguments\":\"{\\\"toy\\\": \\\"car\\\"}\"}</tool_call>\n",
         "Let me look.", 2, "get_weather", "{\"city\":\"Oslo\"}"},
        {"<tool_call>{\"name\":\"fly\",\"arguments\":{}}</tool_call>", "<tool_call>{\"name\":\"fly\",\"arguments\":{}}</tool_call>", 0,
         NULL, NULL},
        {"<tool_call>{not json}</tool_call> after", "<tool_call>{not json}</tool_call> after", 0, NULL, NULL},
        {"<tool_call>\n{\"name\": \"play\"}\n", "", 1, "play", "{}"},
        {"<tool_call>\n{\"name\": \"play\", \"arg", "<tool_call>\n{\"name\": \"play\", \"arg", 0, NULL, NULL},
        {"<tool_call>{\"name\":\"play\",\"arguments\":[1]}</tool_call>", "<tool_call>{\"name\":\"play\",\"arguments\":[1]}</tool_call>",
         0, NULL, NULL},
        {"Here:\n<tool_call>bad</tool_call>", "Here:\n<tool_call>bad</tool_call>", 0, NULL, NULL},
        {"A \n<tool_call>{\"name\":\"play\"}</tool_call>\n B", "AB", 1, "play", "{}"}, /* blanks around a call go */
    };
    run_tool_cases(NV_TOOLS_HERMES, hermes, sizeof hermes / sizeof hermes[0]);
    static const tool_case llama3[] = {
        {" {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}", "", 1, "get_weather", "{\"city\":\"Rome\"}"},
        {"{\"name\": \"play\", \"arguments\": {}}", "", 1, "play", "{}"},
        {"The answer is {\"name\": \"play\"}", "The answer is {\"name\": \"play\"}", 0, NULL, NULL},
        {"{\"set\": 1}", "{\"set\": 1}", 0, NULL, NULL},
        {"\n\n", "\n\n", 0, NULL, NULL},
    };
    run_tool_cases(NV_TOOLS_LLAMA3, llama3, sizeof llama3 / sizeof llama3[0]);
    static const tool_case granite[] = {
        {"Let me check. <|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}, {\"name\": \"play\", "
         "\"arguments\": {}}]",
         "Let me check.", 2, "get_weather", "{\"city\":\"Oslo\"}"},
        {"<|tool_call|>{\"name\": \"play\", \"arguments\": \"{\\\"toy\\\": \\\"car\\\"}\"}\n", "", 1, "play", "{\"toy\":\"car\"}"},
        {"<|tool_call|>[{\"name\": \"play\"}, {\"name\": \"fly\"}]", "<|tool_call|>[{\"name\": \"play\"}, {\"name\": \"fly\"}]", 0,
         NULL, NULL}, /* one unknown tool: none is a call */
        {"<|tool_call|>[{\"name\": \"play\"}] and more", "<|tool_call|>[{\"name\": \"play\"}] and more", 0, NULL, NULL},
        {"A\n<|tool_call|>[not json", "A\n<|tool_call|>[not json", 0, NULL, NULL},
        {"Nothing to call.<|tool_call|>[]", "Nothing to call.", 0, NULL, NULL},
        {"Text <|tool_ but no call \n", "Text <|tool_ but no call \n", 0, NULL, NULL},
        {"<tool_call>{\"name\": \"play\"}</tool_call>", "<tool_call>{\"name\": \"play\"}</tool_call>", 0, NULL, NULL},
    };
    run_tool_cases(NV_TOOLS_GRANITE, granite, sizeof granite / sizeof granite[0]);
    static const tool_case mistral[] = {
        {"[TOOL_CALLS] [{\"name\": \"play\", \"arguments\": {\"toy\": \"ball\"}, \"id\": \"abcdefghi\"}, {\"name\": \"get_weather\", "
         "\"arguments\": {}}]",
         "", 2, "play", "{\"toy\":\"ball\"}"},
        {"Sure. [TOOL_CALLS][{\"name\": \"fly\", \"arguments\": {}}]", "Sure. [TOOL_CALLS][{\"name\": \"fly\", \"arguments\": {}}]", 0,
         NULL, NULL},
        {"<|tool_call|>[{\"name\": \"play\"}]", "<|tool_call|>[{\"name\": \"play\"}]", 0, NULL, NULL},
    };
    run_tool_cases(NV_TOOLS_MISTRAL, mistral, sizeof mistral / sizeof mistral[0]);
    /* Mistral's later form: NAME[ARGS]{...} after [TOOL_CALLS], each call its own marker */
    static const tool_case mistral_args[] = {
        {"Sure. [TOOL_CALLS]play[ARGS]{\"toy\": \"ball\"}", "Sure.", 1, "play", "{\"toy\":\"ball\"}"},
        {"[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}[TOOL_CALLS]play[ARGS]{}\n", "", 2, "get_weather", "{\"city\":\"Oslo\"}"},
        {"[TOOL_CALLS]fly[ARGS]{}", "[TOOL_CALLS]fly[ARGS]{}", 0, NULL, NULL},                     /* an unknown tool */
        {"[TOOL_CALLS]play[ARGS]{} and more", "[TOOL_CALLS]play[ARGS]{} and more", 0, NULL, NULL}, /* text after it */
        {"[TOOL_CALLS]play[ARGS][1]", "[TOOL_CALLS]play[ARGS][1]", 0, NULL, NULL},                 /* not an object */
        {"[TOOL_CALLS]play{}", "[TOOL_CALLS]play{}", 0, NULL, NULL},
        {"No call [TOOL_ here.", "No call [TOOL_ here.", 0, NULL, NULL},
        {"[TOOL_CALLS]play[ARGS]{}\n [TOOL_CALLS]play[ARGS]{\"toy\": \"[TOOL_CALLS]x[ARGS]\"}", "", 2, "play", "{}"}, /* blanks between; markers in a string */
        {"[TOOL_CALLS]play[ARGS]{}{}", "[TOOL_CALLS]play[ARGS]{}{}", 0, NULL, NULL},
        {"[TOOL_CALLS]play[ARGS]{}[TOOL_CALLS]", "[TOOL_CALLS]play[ARGS]{}[TOOL_CALLS]", 0, NULL, NULL},
    };
    run_tool_cases(NV_TOOLS_MISTRAL_ARGS, mistral_args, sizeof mistral_args / sizeof mistral_args[0]);
    run_tool_cases(NV_TOOLS_MISTRAL_CALL_ID, mistral_args, sizeof mistral_args / sizeof mistral_args[0]);
    /* with the call's id between its name and its arguments (Mistral Small 3.2's form) */
    static const tool_case mistral_call_id[] = {
        {"Sure. [TOOL_CALLS]play[CALL_ID]a1B2c3D4e[ARGS]{\"toy\": \"ball\"}", "Sure.", 1, "play", "{\"toy\":\"ball\"}"},
        {"[TOOL_CALLS]get_weather[CALL_ID]abcdefghi[ARGS]{}[TOOL_CALLS]play[CALL_ID]123456789[ARGS]{}", "", 2, "get_weather", "{}"},
        {"[TOOL_CALLS]fly[CALL_ID]abcdefghi[ARGS]{}", "[TOOL_CALLS]fly[CALL_ID]abcdefghi[ARGS]{}", 0, NULL, NULL}, /* unknown */
        {"[TOOL_CALLS]pl[CALL_ID]ay[ARGS]{}", "[TOOL_CALLS]pl[CALL_ID]ay[ARGS]{}", 0, NULL, NULL}, /* the name cut by the id */
        {"[TOOL_CALLS]play[CALL_ID]abcdefghi{}", "[TOOL_CALLS]play[CALL_ID]abcdefghi{}", 0, NULL, NULL}, /* no [ARGS] */
        {"[TOOL_CALLS]play[CALL_ID]abc[ARGS]{}", "", 1, "play", "{}"}, /* an id of another form: replaced */
        /* another marker before [ARGS]: the id would swallow it */
        {"[TOOL_CALLS]play[CALL_ID]x[TOOL_CALLS]get_weather[CALL_ID]abcdefghi[ARGS]{}",
         "[TOOL_CALLS]play[CALL_ID]x[TOOL_CALLS]get_weather[CALL_ID]abcdefghi[ARGS]{}", 0, NULL, NULL},
        {"[TOOL_CALLS]play[CALL_ID]a[CALL_ID]abcdefghi[ARGS]{}", "[TOOL_CALLS]play[CALL_ID]a[CALL_ID]abcdefghi[ARGS]{}", 0, NULL, NULL},
    };
    run_tool_cases(NV_TOOLS_MISTRAL_CALL_ID, mistral_call_id, sizeof mistral_call_id / sizeof mistral_call_id[0]);
    /* Qwen3-Coder's XML: each value read as its schema admits */
#define XC(body) "<tool_call>\n<function=get_weather>\n" body "</function>\n</tool_call>"
#define XP(k, v) "<parameter=" k ">\n" v "\n</parameter>\n"
    static const tool_case xml[] = {
        {"Let me look.\n\n" XC(XP("city", "Oslo") XP("days", "3")), "Let me look.", 1, "get_weather", "{\"city\":\"Oslo\",\"days\":3}"},
        {XC(XP("city", "\"Oslo\"")), "", 1, "get_weather", "{\"city\":\"\\\"Oslo\\\"\"}"}, /* a string as written, quotes and all */
        {XC(XP("city", "42") XP("hourly", "True") XP("opts", "{\"a\": [1, 2]}") XP("ids", "[1, \"x\"]")), "", 1, "get_weather",
         "{\"city\":\"42\",\"hourly\":true,\"opts\":{\"a\":[1,2]},\"ids\":[1,\"x\"]}"},
        /* a string's own line breaks and '<' stay; only the form's one line break at each end goes */
        {XC(XP("city", "\nSan Jose,\nCA < LA\n")), "", 1, "get_weather", "{\"city\":\"\\nSan Jose,\\nCA < LA\\n\"}"},
        /* not of the admitted kind: a string; null where admitted; a number; unknown parameters as strings */
        {XC(XP("days", "3.5") XP("note", "null") XP("ratio", "1e3") XP("wind", "12")), "", 1, "get_weather",
         "{\"days\":\"3.5\",\"note\":null,\"ratio\":1000,\"wind\":\"12\"}"},
        {XC(XP("days", "seven") XP("hourly", "fals") XP("note", "nil")), "", 1, "get_weather",
         "{\"days\":\"seven\",\"hourly\":\"fals\",\"note\":\"nil\"}"},
        /* Python's str() of None and False, as a template's `| string` writes earlier calls; a quoted text
           where strings and more are admitted stays as written */
        {XC(XP("note", "None") XP("hourly", "FALSE")), "", 1, "get_weather", "{\"note\":null,\"hourly\":false}"},
        {XC(XP("note", "\"Oslo\"")), "", 1, "get_weather", "{\"note\":\"\\\"Oslo\\\"\"}"},
        /* a value may hold the block's closing: the block ends after the function */
        {XC(XP("city", "a </tool_call> b")) "\nAfter.", "After.", 1, "get_weather", "{\"city\":\"a </tool_call> b\"}"},
        /* two functions in one block; a function or a value left unclosed (vLLM's reading) */
        {"<tool_call>\n<function=play>\n</function>\n<function=get_weather>\n" XP("city", "X") "</function>\n</tool_call>", "", 2,
         "play", "{}"},
        {"<tool_call>\n<function=get_weather>\n" XP("city", "Oslo") "</tool_call> B", "B", 1, "get_weather", "{\"city\":\"Oslo\"}"},
        {"<tool_call><function=play><parameter=a>1</function></tool_call>", "", 1, "play", "{\"a\":1}"},
        {"<tool_call><function=play><parameter=a>\n1\n<parameter=b>2</parameter></function></tool_call>", "", 1, "play",
         "{\"a\":\"1\\n<parameter=b>2\"}"}, /* a later </parameter> closes it: values may hold "<parameter=" */
        /* a parameter written twice is the last; additionalProperties' schema reads the others */
        {XC(XP("city", "A") XP("city", "B")), "", 1, "get_weather", "{\"city\":\"B\"}"},
        {"<tool_call>\n<function=play>\n" XP("speed", "5") "</function>\n</tool_call>\n<tool_call>\n<function=play>\n</function>\n"
         "</tool_call>",
         "", 2, "play", "{\"speed\":5}"},
        /* Hermes's JSON in the same blocks; the closing of the block missing at the end */
        {"<tool_call>\n{\"name\": \"play\", \"arguments\": {}}\n</tool_call>", "", 1, "play", "{}"},
        {"<tool_call>\n<function=play>\n</function>", "", 1, "play", "{}"},
        /* not calls: an unknown tool, no </function>, text after it, a parameter without its closing, no name */
        {"<tool_call>\n<function=fly>\n</function>\n</tool_call>", "<tool_call>\n<function=fly>\n</function>\n</tool_call>", 0, NULL, NULL},
        {"<tool_call><function=play></function> x</tool_call>", "<tool_call><function=play></function> x</tool_call>", 0, NULL, NULL},
        /* functions without their <tool_call> (vLLM's fallback); prose that only names the form stays */
        {"Sure.\n<function=play>\n</function>", "Sure.", 1, "play", "{}"},
        {"<function=get_weather>\n" XP("city", "Oslo") "</function>\nDone.", "Done.", 1, "get_weather", "{\"city\":\"Oslo\"}"},
        {"<function=play>\n" XP("a", "1"), "", 1, "play", "{\"a\":1}"},
        {"<function=play>\n</function>\n<function=play>\n" XP("b", "2") "</function>", "", 2, "play", "{}"},
        {"Write <function=NAME> then its parameters.", "Write <function=NAME> then its parameters.", 0, NULL, NULL},
        {"<function=fly>\n</function> x", "<function=fly>\n</function> x", 0, NULL, NULL},
        {"<tool_call>\n<function=play>\n</function>\n<function=fly>\n</function>\n</tool_call>",
         "<tool_call>\n<function=play>\n</function>\n<function=fly>\n</function>\n</tool_call>", 0, NULL, NULL}, /* one unknown: none */
        {"<tool_call><function=play><parameter=>1</parameter></function></tool_call>",
         "<tool_call><function=play><parameter=>1</parameter></function></tool_call>", 0, NULL, NULL},
    };
#undef XC
#undef XP
    run_tool_cases(NV_TOOLS_XML, xml, sizeof xml / sizeof xml[0]);
    /* streamed: content is never taken back: what is given before the end stays given */
    const char *names[] = {"play"};
    nv_tool_parser p = {.style = NV_TOOLS_HERMES, .names = names, .n_names = 1};
    nv_buf content = {0};
    nv_tool_call *calls = NULL;
    int n = 0;
    nv_tool_parser_feed(&p, "Sure. <tool", 11, 0, &content, &calls, &n);
    T_CHECK(content.data && !strcmp(content.data, "Sure.") && n == 0, "held back: '%s'", content.data ? content.data : "");
    nv_tool_parser_feed(&p, "_call>{\"name\":\"play\"}</tool_call>", 34, 0, &content, &calls, &n);
    T_CHECK(n == 1 && !strcmp(content.data, "Sure."), "call after held text: %d '%s'", n, content.data);
    nv_tool_calls_free(calls, n);
    nv_buf_free(&content);
    nv_tool_parser_free(&p);
    /* Granite's list is decided at the end of the answer; the text before the marker streams */
    p = (nv_tool_parser){.style = NV_TOOLS_GRANITE, .names = names, .n_names = 1};
    calls = NULL, n = 0;
    nv_tool_parser_feed(&p, "Sure <|tool", 11, 0, &content, &calls, &n);
    T_CHECK(content.data && !strcmp(content.data, "Sure") && n == 0, "granite held back: '%s'", content.data ? content.data : "");
    const char *rest = "_call|>[{\"name\":\"play\"}]";
    nv_tool_parser_feed(&p, rest, strlen(rest), 0, &content, &calls, &n);
    T_CHECK(n == 0 && !strcmp(content.data, "Sure"), "granite before the end: %d '%s'", n, content.data);
    nv_tool_parser_feed(&p, "", 0, 1, &content, &calls, &n);
    T_CHECK(n == 1 && !strcmp(content.data, "Sure") && !strcmp(calls[0].name, "play"), "granite at the end: %d '%s'", n, content.data);
    nv_tool_calls_free(calls, n);
    nv_buf_free(&content);
    nv_tool_parser_free(&p);
}

static void test_api_tools(void) {
    nv_tokenizer *tok = tok512();
    if (!tok) return;
    nv_api_ctx ctx = {.model_id = "m", .tok = tok, .tmpl = NV_CHAT_CHATML, .seq_len = 4096, .vocab_size = 512, .capacity = 4000, .reasoning = 0, .dim = 64};
    nv_api_request r;
    nv_api_error e;
    const char *T = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"play\",\"parameters\":{\"type\":\"object\","
                    "\"properties\":{\"toy\":{\"enum\":[\"ball\",\"car\"]}},\"required\":[\"toy\"]}}}]";
    char body[2048];
    /* a conversation with a call and its result renders; auto: no grammar, tools kept for reading calls */
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":"
             "[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"play\",\"arguments\":\"{\\\"toy\\\":\\\"car\\\"}\"}}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"done\"}],%s}",
             T);
    T_CHECK(nv_api_parse(&ctx, 1, body, strlen(body), &r, &e) == 0, "%s", e.message);
    T_CHECK(r.tools && r.tools->n == 1 && !strcmp(r.tools->names[0], "play") && !r.req.grammar, "auto");
    nv_api_request_free(&r);
    /* required and named: a grammar; none: nothing */
    const char *choices[] = {"\"required\"", "{\"type\":\"function\",\"function\":{\"name\":\"play\"}}", "\"none\""};
    for (int i = 0; i < 3; i++) {
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],%s,\"tool_choice\":%s}", T, choices[i]);
        T_CHECK(nv_api_parse(&ctx, 1, body, strlen(body), &r, &e) == 0, "%s", e.message);
        T_CHECK(i < 2 ? r.tools && r.req.grammar : !r.tools && !r.req.grammar, "tool_choice %s", choices[i]);
        if (i < 2 && r.req.grammar) { /* the grammar takes exactly a call */
            nv_gmatch *m = nv_gmatch_new(r.req.grammar);
            const char *call = "<tool_call>\n{\"name\": \"play\", \"arguments\": {\"toy\": \"car\"}}\n</tool_call>";
            T_CHECK(nv_gmatch_feed(m, call, strlen(call)) == 1 && nv_gmatch_done(m), "a call fits the grammar");
            nv_gmatch_free(m);
        }
        nv_api_request_free(&r);
    }
    /* a tool's $ref points into its own parameters; parallel calls may end with a newline */
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"tool_choice\":\"required\",\"tools\":["
             "{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":{\"$defs\":{\"T\":{\"enum\":[\"x\"]}},"
             "\"type\":\"object\",\"properties\":{\"k\":{\"$ref\":\"#/$defs/T\"}},\"required\":[\"k\"]}}},"
             "{\"type\":\"function\",\"function\":{\"name\":\"b\",\"parameters\":{\"$defs\":{\"T\":{\"type\":\"integer\"}},"
             "\"type\":\"object\",\"properties\":{\"k\":{\"$ref\":\"#/$defs/T\"}},\"required\":[\"k\"]}}}]}");
    T_CHECK(nv_api_parse(&ctx, 1, body, strlen(body), &r, &e) == 0 && r.req.grammar, "$defs in tools: %s", e.message);
    if (r.req.grammar) {
        const char *good[] = {"<tool_call>\n{\"name\": \"a\", \"arguments\": {\"k\": \"x\"}}\n</tool_call>",
                              "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"k\": 5}}\n</tool_call>\n",
                              "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"k\": 5}}\n</tool_call>\n<tool_call>\n{\"name\": \"a\", "
                              "\"arguments\": {\"k\": \"x\"}}\n</tool_call>"};
        const char *bad_calls[] = {"<tool_call>\n{\"name\": \"a\", \"arguments\": {\"k\": 5}}\n</tool_call>",
                                   "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"k\": \"x\"}}\n</tool_call>",
                                   "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"k\": \"x\"}}\n</tool_call>\n\n"};
        for (int i = 0; i < 3; i++) {
            nv_gmatch *m = nv_gmatch_new(r.req.grammar);
            T_CHECK(nv_gmatch_feed(m, good[i], strlen(good[i])) == 1 && nv_gmatch_done(m), "accepts %s", good[i]);
            nv_gmatch_free(m);
            m = nv_gmatch_new(r.req.grammar);
            T_CHECK(!(nv_gmatch_feed(m, bad_calls[i], strlen(bad_calls[i])) == 1 && nv_gmatch_done(m)), "refuses %s", bad_calls[i]);
            nv_gmatch_free(m);
        }
    }
    nv_api_request_free(&r);
    /* auto: a tool whose schema cannot be held leaves only itself unconstrained */
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"parallel_tool_calls\":false,\"tools\":["
             "{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":{\"type\":\"string\",\"pattern\":\"(?=x)\"}}},"
             "{\"type\":\"function\",\"function\":{\"name\":\"b\"}}]}");
    T_CHECK(nv_api_parse(&ctx, 1, body, strlen(body), &r, &e) == 0 && r.req.lazy_grammar && r.req.lazy_ends && !r.req.grammar,
            "auto with one bad tool: %s", e.message);
    nv_api_request_free(&r);
    static const struct {
        const char *extra, *param;
    } bad[] = {
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"bad name\"}}]", "tools"},
        {"\"tools\":[{\"type\":\"retrieval\"}]", "tools"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}},{\"type\":\"function\",\"function\":{\"name\":\"a\"}}]", "tools"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":[]}}]", "tools"},
        {"\"tool_choice\":\"required\"", "tool_choice"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}}],\"tool_choice\":\"always\"", "tool_choice"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"b\"}}", "tool_choice"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":{\"type\":\"string\",\"pattern\":\"(?=x)\"}}}],"
         "\"tool_choice\":\"required\"", "tools"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}}],\"guided_regex\":\"[a-z]+\"", "tools"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}}],\"guided_choice\":[\"x\"]", "tools"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}}],\"parallel_tool_calls\":1", "parallel_tool_calls"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],%s}", bad[i].extra);
        T_CHECK(nv_api_parse(&ctx, 1, body, strlen(body), &r, &e) == 400 && !strcmp(e.param, bad[i].param), "%s: %d %s (%s)",
                bad[i].extra, e.status, e.param, e.message);
    }
    /* beside a JSON response_format: under auto a call or, instead, the answer in the format; required
       and named: a call only (the format waits for a later turn) */
    const char *formats[] = {"\"response_format\":{\"type\":\"json_object\"}",
                             "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"c\",\"schema\":"
                             "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}"};
    for (int f = 0; f < 2; f++)
        for (int i = 0; i < 3; i++) {
            snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],%s,%s%s%s}", T, formats[f],
                     i ? ",\"tool_choice\":" : "", i ? choices[i - 1] : "");
            T_CHECK(nv_api_parse(&ctx, 1, body, strlen(body), &r, &e) == 0 && r.tools && r.req.grammar && !r.req.lazy_grammar,
                    "format %d choice %d: %s", f, i, e.message);
            if (r.req.grammar) {
                const char *call = "<tool_call>\n{\"name\": \"play\", \"arguments\": {\"toy\": \"car\"}}\n</tool_call>";
                const char *answer = f ? "{\"city\": \"Oslo\"}" : "{\"any\": 1}";
                nv_gmatch *m = nv_gmatch_new(r.req.grammar), *a = nv_gmatch_new(r.req.grammar);
                T_CHECK(nv_gmatch_feed(m, call, strlen(call)) == 1 && nv_gmatch_done(m), "format %d choice %d: a call", f, i);
                T_CHECK((nv_gmatch_feed(a, answer, strlen(answer)) == 1 && nv_gmatch_done(a)) == (i == 0),
                        "format %d choice %d: the answer in the format %s", f, i, i ? "taken" : "refused");
                nv_gmatch_free(m);
                nv_gmatch_free(a);
            }
            nv_api_request_free(&r);
        }
    const char *bad_msgs[] = {
        "{\"messages\":[{\"role\":\"tool\"}]}",
        "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}}]}]}",
        "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":5}]}",
    };
    for (size_t i = 0; i < sizeof bad_msgs / sizeof bad_msgs[0]; i++)
        T_CHECK(nv_api_parse(&ctx, 1, bad_msgs[i], strlen(bad_msgs[i]), &r, &e) == 400 && !strcmp(e.param, "messages"), "%s: %s",
                bad_msgs[i], e.message);
    /* --reasoning-format: the JSON (or the required call) may follow a think block; not on completions */
    nv_api_ctx rctx = ctx;
    rctx.reasoning = 1;
    const char *rf = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"response_format\":{\"type\":\"json_object\"}}";
    const char *rfc = "{\"prompt\":\"Hi\",\"response_format\":{\"type\":\"json_object\"}}";
    const char *thought = "<think>\nhm</think>\n\n{\"x\": 1}";
    for (int chat = 1; chat >= 0; chat--) {
        T_CHECK(nv_api_parse(&rctx, chat, chat ? rf : rfc, strlen(chat ? rf : rfc), &r, &e) == 0 && r.req.grammar, "%s", e.message);
        if (r.req.grammar) {
            nv_gmatch *m = nv_gmatch_new(r.req.grammar);
            int ok = nv_gmatch_feed(m, thought, strlen(thought)) == 1 && nv_gmatch_done(m);
            T_CHECK(ok == chat, "a think block before the JSON: %s", chat ? "chat takes it" : "completions do not");
            nv_gmatch_free(m);
        }
        nv_api_request_free(&r);
    }
    /* an escaped NUL would cut a string short inside cJSON: refused */
    const char *nul = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}";
    const char *not_nul = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\\\u0000b\"}]}";
    T_CHECK(nv_api_parse(&ctx, 1, nul, strlen(nul), &r, &e) == 400 && strstr(e.message, "u0000"), "%s", e.message);
    T_CHECK(nv_api_parse(&ctx, 1, not_nul, strlen(not_nul), &r, &e) == 0, "an escaped backslash before u0000: %s", e.message);
    nv_api_request_free(&r);
    /* completions have no tools */
    const char *comp = "{\"prompt\":\"x\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}}]}";
    T_CHECK(nv_api_parse(&ctx, 0, comp, strlen(comp), &r, &e) == 400 && !strcmp(e.param, "tools"), "completions: %s", e.message);
    /* the response shapes: content null beside calls, finish_reason as given */
    nv_tool_call call = {"call_abc", "play", "{\"toy\":\"car\"}"};
    nv_api_meta meta;
    nv_api_meta_init(&meta, 1, "m");
    nv_api_choice ch = {.text = "", .finish = "tool_calls", .calls = &call, .n_calls = 1};
    char *out = nv_api_response_choices(&meta, &ch, 1, 5, 7, 0);
    cJSON *j = cJSON_Parse(out);
    const cJSON *msg = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "message");
    const cJSON *tc = cJSON_GetArrayItem(cJSON_GetObjectItem(msg, "tool_calls"), 0);
    T_CHECK(cJSON_IsNull(cJSON_GetObjectItem(msg, "content")) && !strcmp(cJSON_GetObjectItem(tc, "id")->valuestring, "call_abc") &&
                !strcmp(cJSON_GetObjectItem(tc, "type")->valuestring, "function") &&
                !strcmp(cJSON_GetObjectItem(cJSON_GetObjectItem(tc, "function"), "arguments")->valuestring, "{\"toy\":\"car\"}"),
            "%s", out);
    cJSON_Delete(j);
    free(out);
    out = nv_api_tool_call_chunk(&meta, &call, 2, 0);
    j = cJSON_Parse(out);
    tc = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "delta"), "tool_calls"), 0);
    T_CHECK(cJSON_GetObjectItem(tc, "index")->valueint == 2 && !strcmp(cJSON_GetObjectItem(cJSON_GetObjectItem(tc, "function"), "name")->valuestring, "play"),
            "%s", out);
    cJSON_Delete(j);
    free(out);
    nv_tokenizer_free(tok);
}

/* /v1/embeddings' request and answer: inputs of each kind, limits, and base64 of the floats' bytes. */
static void test_api_embeddings(void) {
    nv_tokenizer *tok = tok512();
    if (!tok) return;
    nv_api_ctx ctx = {.model_id = "m", .tok = tok, .tmpl = NV_CHAT_PLAIN, .seq_len = 512, .vocab_size = 512, .capacity = 100, .reasoning = 0, .dim = 2};
    nv_api_embed e;
    nv_api_error err;
    const char *ok = "{\"input\":[\"Once upon\",[1,2,3],\"a\"],\"encoding_format\":\"base64\",\"dimensions\":2,\"user\":\"x\"}";
    T_CHECK(nv_api_embed_parse(&ctx, ok, strlen(ok), &e, &err) == 0, "%s", err.message);
    T_CHECK(e.n == 3 && e.base64 && e.n_ids[1] == 3 && e.ids[1][2] == 3 && e.ids[0][0] == 1 && e.n_ids[2] == 2, "parsed: n %d", e.n);
    nv_api_embed_free(&e);
    const float v[4] = {1.0f, -2.5f, 0.0f, 0.5f};
    char *body = nv_api_embed_response(ctx.dim, "m", v, 2, 1, 7);
    T_CHECK(body && strstr(body, "\"embedding\":\"AACAPwAAIMA=\"") && strstr(body, "\"embedding\":\"AAAAAAAAAD8=\"") &&
                strstr(body, "\"prompt_tokens\":7") && strstr(body, "\"index\":1"),
            "base64 body: %s", body);
    free(body);
    body = nv_api_embed_response(ctx.dim, "m", v, 1, 0, 1);
    T_CHECK(body && strstr(body, "\"embedding\":[1,-2.5]") && strstr(body, "\"object\":\"list\""), "float body: %s", body);
    free(body);
    static const char *const bad[] = {"{\"input\":\"\"}", "{\"input\":[\"a\",\"\"]}", "{\"input\":[]}", "{\"input\":{}}",
                                      "{\"input\":\"a\",\"dimensions\":3}", "{\"input\":[[1,2],\"a\",7]}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        T_CHECK(nv_api_embed_parse(&ctx, bad[i], strlen(bad[i]), &e, &err) == 400 && !e.ids, "%s accepted", bad[i]);
    }
    /* past the KV pool's 100 positions (the context is 512) */
    char big[1024];
    size_t len = (size_t)snprintf(big, sizeof big, "{\"input\":[");
    for (int i = 0; i < 101; i++) len += (size_t)snprintf(big + len, sizeof big - len, "%s5", i ? "," : "");
    snprintf(big + len, sizeof big - len, "]}");
    T_CHECK(nv_api_embed_parse(&ctx, big, strlen(big), &e, &err) == 400 && !strcmp(err.code, "context_length_exceeded"),
            "101 ids: %s", err.message);
    nv_tokenizer_free(tok);
}

/* nerve batch's files (serve/batchfile.h): a body reaches the server as its line wrote it (a number
 * cJSON would round, whitespace that is a control character), or as cJSON read it where an escaped key
 * could be "body" itself; the url without /v1; each refusal's reason; a former output's lines. */
static void test_batch_file(void) {
    nv_batch_set s;
    T_CHECK(nv_batch_set_init(&s) == NV_OK, "%s", nv_errmsg());
    T_CHECK(nv_batch_add_line(&s, "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/completions\",\"body\":\x0e{\"seed\": 18446744073709551615}\x01}", 1) ==
                NV_OK && s.n == 1,
            "%s", nv_errmsg());
    T_CHECK(s.n == 1 && !strcmp(s.reqs[0].body, "{\"seed\": 18446744073709551615}") && !strcmp(s.reqs[0].url, "/v1/completions"),
            "body '%s', url %s", s.n ? s.reqs[0].body : "", s.n ? s.reqs[0].url : "");
    T_CHECK(nv_batch_add_line(&s, "{\"\\u0062ody\":{\"a\":1},\"custom_id\":\"b\",\"method\":\"POST\",\"url\":\"/v1/embeddings\",\"body\":{\"a\":2}}", 2) ==
                NV_OK && s.n == 2 && !strcmp(s.reqs[1].body, "{\"a\":1}"),
            "escaped key: '%s'", s.n > 1 ? s.reqs[1].body : nv_errmsg());
    static const struct {
        const char *line, *why;
    } bad[] = {
        {"[1]", "not a JSON object"},
        {"{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}}", "repeats line 1's"},
        {"{\"custom_id\":\"\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}}", "custom_id"},
        {"{\"custom_id\":\"c\",\"method\":\"PUT\",\"url\":\"/v1/completions\",\"body\":{}}", "method"},
        {"{\"custom_id\":\"c\",\"method\":\"POST\",\"url\":\"/v1/files\",\"body\":{}}", "url"},
        {"{\"custom_id\":\"c\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":[]}", "body must"},
        {"{\"custom_id\":\"c\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"stream\":true}}", "stream"},
        {"{\"custom_id\":\"c\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}} {}", "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        T_CHECK(nv_batch_add_line(&s, bad[i].line, 3) == NV_EINVAL && strstr(nv_errmsg(), bad[i].why) && s.n == 2, "'%s': %s",
                bad[i].line, nv_errmsg());
    int at, ok;
    T_CHECK(nv_batch_output_line(&s, "{\"id\":\"x\",\"custom_id\":\"b\",\"response\":{\"status_code\":201},\"error\":null}", &at, &ok) ==
                    NV_OK && at == 1 && ok == 1,
            "2xx: %d %d", at, ok);
    T_CHECK(nv_batch_output_line(&s, "{\"custom_id\":\"a\",\"response\":null,\"error\":{}}", &at, &ok) == NV_OK && at == 0 && ok == 0,
            "no answer: %d %d", at, ok);
    T_CHECK(nv_batch_output_line(&s, "{\"custom_id\":\"z\",\"response\":null}", &at, &ok) == NV_EINVAL && strstr(nv_errmsg(), "'z'"),
            "%s", nv_errmsg());
    T_CHECK(nv_batch_output_line(&s, "{\"custom_id\":\"a\"}", &at, &ok) == NV_EINVAL, "no response accepted");
    T_CHECK(nv_batch_add_line(&s, "{\"custom_id\":\"m\",\"params\":{\"max_tokens\":2,\"messages\":[]}}", 4) == NV_EINVAL &&
                strstr(nv_errmsg(), "Anthropic's batch format among OpenAI's"),
            "%s", nv_errmsg());
    nv_batch_set_free(&s);
    /* Anthropic's: params as written, for /v1/messages; results read back by their type */
    T_CHECK(nv_batch_set_init(&s) == NV_OK, "%s", nv_errmsg());
    T_CHECK(nv_batch_add_line(&s, "{\"custom_id\":\"m\",\"params\":{\"max_tokens\":2, \"messages\":[]}}", 1) == NV_OK && s.n == 1 &&
                s.reqs[0].anthropic && !strcmp(s.reqs[0].url, "/v1/messages") && !strcmp(s.reqs[0].body, "{\"max_tokens\":2, \"messages\":[]}"),
            "%s", s.n ? s.reqs[0].body : nv_errmsg());
    T_CHECK(nv_batch_add_line(&s, "{\"custom_id\":\"n\",\"params\":[]}", 2) == NV_EINVAL && strstr(nv_errmsg(), "params must"), "%s",
            nv_errmsg());
    T_CHECK(nv_batch_output_line(&s, "{\"custom_id\":\"m\",\"result\":{\"type\":\"succeeded\",\"message\":{}}}", &at, &ok) == NV_OK &&
                at == 0 && ok == 1,
            "succeeded: %d %d", at, ok);
    T_CHECK(nv_batch_output_line(&s, "{\"custom_id\":\"m\",\"result\":{\"type\":\"errored\"}}", &at, &ok) == NV_OK && ok == 0,
            "errored: %d", ok);
    T_CHECK(nv_batch_output_line(&s, "{\"custom_id\":\"m\",\"response\":null}", &at, &ok) == NV_EINVAL, "an OpenAI line accepted");
    nv_batch_set_free(&s);
}

/* A multipart body's end found however its bytes are split: the body counted up to the close
 * delimiter, the epilogue after it not, near misses in the content not taken for it. */
static void test_multipart_end(void) {
    nv_multipart_end m;
    T_CHECK(!nv_multipart_end_init(&m, "multipart/form-data") && !nv_multipart_end_init(&m, NULL) &&
                !nv_multipart_end_init(&m, "multipart/form-data; boundary=") &&
                !nv_multipart_end_init(&m, "multipart/form-data; boundary=\"\""),
            "no boundary taken for one");
    char long_b[160];
    snprintf(long_b, sizeof long_b, "multipart/form-data; boundary=%0101d", 0);
    T_CHECK(!nv_multipart_end_init(&m, long_b), "a boundary longer than 100 taken");
    T_CHECK(nv_multipart_end_init(&m, "multipart/form-data; boundary=\"a b\"; x=1") && !strcmp(m.delim, "--a b--"), "quoted: %s", m.delim);
    T_CHECK(nv_multipart_end_init(&m, "Multipart/Form-Data; BOUNDARY=XyZb; charset=x") && !strcmp(m.delim, "--XyZb--"), "%s", m.delim);
    T_CHECK(!nv_multipart_end_init(&m, "application/x-www-form-urlencoded; boundary=XyZb") && !nv_multipart_end_init(&m, "text/plain; boundary=x") &&
                nv_multipart_end_init(&m, " multipart/form-data;boundary=k"),
            "a boundary on another type taken as a form (or a leading space refused)");
    const char *body = "--XyZb\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\r\n"
                       "near --XyZb- and --XyZ-- and -XyZb--x\r\n--XyZb--\r\n\r\nepilogue --XyZb-- again";
    const size_t n = strlen(body), end = (size_t)(strstr(body, "\r\n--XyZb--") - body) + 10;
    for (size_t cut = 0; cut <= n; cut++) { /* every split in two */
        nv_multipart_end_init(&m, "multipart/form-data; boundary=XyZb");
        const size_t got = nv_multipart_end_scan(&m, body, cut) + nv_multipart_end_scan(&m, body + cut, n - cut);
        T_CHECK(got == end && m.closed, "split at %zu: %zu bytes of body, not %zu", cut, got, end);
    }
    uint32_t x = 12345;
    for (int round = 0; round < 200; round++) { /* many pieces of 1..12 bytes */
        nv_multipart_end_init(&m, "multipart/form-data; boundary=XyZb");
        size_t got = 0;
        for (size_t at = 0; at < n;) {
            x = x * 1664525u + 1013904223u;
            size_t k = 1 + (x >> 16) % 12;
            if (k > n - at) k = n - at;
            got += nv_multipart_end_scan(&m, body + at, k);
            at += k;
        }
        T_CHECK(got == end, "round %d: %zu bytes of body, not %zu", round, got, end);
    }
    nv_multipart_end_init(&m, "multipart/form-data; boundary=XyZb");
    T_CHECK(nv_multipart_end_scan(&m, body, end - 1) == end - 1 && !m.closed, "ended early");
}

int main(void) {
    T_RUN(test_stop_holdback);
    T_RUN(test_utf8);
    T_RUN(test_ngram_draft);
    T_RUN(test_pred_draft);
    T_RUN(test_batch_file);
    T_RUN(test_multipart_end);
    T_RUN(test_chat_templates);
    T_RUN(test_chat_history);
    T_RUN(test_chat_template_text);
    T_RUN(test_api_parse_defaults_and_limits);
    T_RUN(test_api_lazy_parallel_calls);
    T_RUN(test_api_call_id_grammar);
    T_RUN(test_api_response_shapes);
    T_RUN(test_api_tokenize);
    T_RUN(test_api_enable_thinking);
    T_RUN(test_think_split);
    T_RUN(test_py_json);
    T_RUN(test_chat_tools);
    T_RUN(test_tool_parser);
    T_RUN(test_tool_parser_call_ids);
    T_RUN(test_api_tools);
    T_RUN(test_api_embeddings);
    return t_done();
}
