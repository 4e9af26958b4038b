/* The Anthropic Messages API: its requests become the chat requests the OpenAI API runs (the same
 * prompt tokens), its responses and events have Anthropic's shapes, and a real `nerve serve`
 * answers /v1/messages whole and streamed with the text /v1/chat/completions gives. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/anthropic.h"
#include "serve/ollama.h"
#include "serve_util.h"
#include "t.h"
#include "tok_util.h"


/* The prompt ids an Anthropic body and an OpenAI chat body give (both must parse). */
static int same_prompt(const nv_api_ctx *ctx, const char *anth, const char *openai, char *why, size_t cap) {
    nv_api_request a, o;
    nv_anth_meta m;
    nv_api_error e;
    if (nv_anth_parse(ctx, anth, strlen(anth), 0, &a, &m, &e)) {
        snprintf(why, cap, "anthropic: %d %.200s", e.status, e.message);
        return 0;
    }
    if (nv_api_parse(ctx, 1, openai, strlen(openai), &o, &e)) {
        snprintf(why, cap, "openai: %d %.200s", e.status, e.message);
        nv_api_request_free(&a), nv_anth_meta_free(&m);
        return 0;
    }
    int ok = same_ids(a.req.prompt, a.req.n_prompt, o.req.prompt, o.req.n_prompt);
    snprintf(why, cap, "%d vs %d prompt tokens", a.req.n_prompt, o.req.n_prompt);
    nv_api_request_free(&a), nv_api_request_free(&o), nv_anth_meta_free(&m);
    return ok;
}

static const char *A_TOOLS = "\"tools\":[{\"name\":\"play\",\"description\":\"Play\",\"input_schema\":{\"type\":\"object\","
                             "\"properties\":{\"toy\":{\"enum\":[\"ball\",\"car\"]}},\"required\":[\"toy\"]}}]";
static const char *O_TOOLS = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"play\",\"description\":\"Play\","
                             "\"parameters\":{\"type\":\"object\",\"properties\":{\"toy\":{\"enum\":[\"ball\",\"car\"]}},"
                             "\"required\":[\"toy\"]}}}]";

/* Mistral's templates take call ids of 9 letters and digits alone: the tool_use id this server gave
 * such a call (toolu_ and the 9) reaches the template as the 9 again, any other as sent; Ollama's
 * calls, which carry no ids, get ids of that form. The v3 renderer writes the ids, so each must
 * match the OpenAI conversation's exactly. */
static void test_mistral_call_ids(void) {
    nv_tokenizer *tok = tok512();
    if (!tok) return;
    nv_api_ctx ctx = {.model_id = "m", .tok = tok, .tmpl = NV_CHAT_MISTRAL, .seq_len = 4096, .vocab_size = 512, .capacity = 4000, .dim = 64};
    static const char a_fmt[] =
        "{\"model\":\"m\",\"max_tokens\":9,%s,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\","
        "\"content\":[{\"type\":\"tool_use\",\"id\":\"%s\",\"name\":\"play\",\"input\":{\"toy\":\"car\"}}]},{\"role\":\"user\","
        "\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"%s\",\"content\":\"vroom\"}]}]}";
    static const char o_fmt[] =
        "{\"max_tokens\":9,%s,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"\","
        "\"tool_calls\":[{\"id\":\"%s\",\"type\":\"function\",\"function\":{\"name\":\"play\",\"arguments\":"
        "\"{\\\"toy\\\":\\\"car\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"%s\",\"content\":\"vroom\"}]}";
    static const struct {
        const char *anth, *openai;
        int same;
    } cases[] = {{"toolu_a1B2c3D4e", "a1B2c3D4e", 1},
                 {"toolu_a1B2c3D4e", "toolu_a1B2c3D4e", 0}, /* the ids are in the prompt: a wrong one shows */
                 {"toolu_a1B2c3D4e5", "toolu_a1B2c3D4e5", 1},
                 {"toolu_01A09q90qw90lq917835lq9", "toolu_01A09q90qw90lq917835lq9", 1},
                 {"a1B2c3D4e", "a1B2c3D4e", 1}};
    char a[4096], o[4096], why[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(a, sizeof a, a_fmt, A_TOOLS, cases[i].anth, cases[i].anth);
        snprintf(o, sizeof o, o_fmt, O_TOOLS, cases[i].openai, cases[i].openai);
        T_CHECK(same_prompt(&ctx, a, o, why, sizeof why) == cases[i].same, "%s against %s: %s", cases[i].anth, cases[i].openai, why);
    }
    /* Ollama's: call k of message i is i in six base-36 digits and k in three */
    const char *olla = "{\"model\":\"m\",%s,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\","
                       "\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"play\",\"arguments\":{\"toy\":\"car\"}}}]},"
                       "{\"role\":\"tool\",\"content\":\"vroom\"}]}";
    snprintf(a, sizeof a, olla, O_TOOLS);
    snprintf(o, sizeof o, o_fmt, O_TOOLS, "000001000", "000001000");
    nv_api_request ro, rq;
    nv_olla_meta meta;
    nv_api_error e;
    T_CHECK(nv_olla_parse(&ctx, a, strlen(a), 1, &ro, &meta, &e) == 0, "ollama: %s", e.message);
    T_CHECK(nv_api_parse(&ctx, 1, o, strlen(o), &rq, &e) == 0, "openai: %s", e.message);
    T_CHECK(same_ids(ro.req.prompt, ro.req.n_prompt, rq.req.prompt, rq.req.n_prompt), "ollama's ids: %d vs %d tokens", ro.req.n_prompt,
            rq.req.n_prompt);
    nv_api_request_free(&ro), nv_api_request_free(&rq), nv_olla_meta_free(&meta);
    nv_tokenizer_free(tok);
}

/* system, text blocks, tool_use and tool_result render as their OpenAI counterparts */
static void test_translation_matches_openai(void) {
    nv_tokenizer *tok = tok512();
    if (!tok) return;
    nv_api_ctx ctx = {.model_id = "m", .tok = tok, .tmpl = NV_CHAT_CHATML, .seq_len = 4096, .vocab_size = 512, .capacity = 4000, .reasoning = 0, .dim = 64};
    char a[4096], o[4096], why[256];
    snprintf(a, sizeof a,
             "{\"model\":\"m\",\"max_tokens\":9,\"system\":[{\"type\":\"text\",\"text\":\"Be kind.\"},{\"type\":\"text\","
             "\"text\":\"Be brief.\"}],%s,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi\"}]},"
             "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hm\",\"signature\":\"x\"},{\"type\":\"text\","
             "\"text\":\"Let me see.\"},{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"play\",\"input\":{\"toy\":\"car\"}}]},"
             "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":\"vroom\"},"
             "{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":[{\"type\":\"text\",\"text\":\"no\"}],"
             "\"is_error\":true},{\"type\":\"text\",\"text\":\"Again?\"}]}]}",
             A_TOOLS);
    snprintf(o, sizeof o,
             "{\"max_tokens\":9,%s,\"messages\":[{\"role\":\"system\",\"content\":\"Be kind.\\nBe brief.\"},{\"role\":\"user\","
             "\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"Let me see.\",\"tool_calls\":[{\"id\":\"toolu_1\","
             "\"type\":\"function\",\"function\":{\"name\":\"play\",\"arguments\":\"{\\\"toy\\\":\\\"car\\\"}\"}}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"toolu_1\",\"content\":\"vroom\"},{\"role\":\"tool\",\"tool_call_id\":"
             "\"toolu_1\",\"content\":\"Error: no\"},{\"role\":\"user\",\"content\":\"Again?\"}]}",
             O_TOOLS);
    T_CHECK(same_prompt(&ctx, a, o, why, sizeof why), "a conversation with tools: %s", why);
    /* tool_choice: any is required (a grammar), tool names one, auto a lazy grammar, none no tools */
    const char *choices[] = {"{\"type\":\"any\"}", "{\"type\":\"tool\",\"name\":\"play\"}", "{\"type\":\"auto\"}", "{\"type\":\"none\"}"};
    for (int i = 0; i < 4; i++) {
        snprintf(a, sizeof a, "{\"model\":\"m\",\"max_tokens\":9,%s,\"tool_choice\":%s,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}",
                 A_TOOLS, choices[i]);
        nv_api_request r;
        nv_anth_meta m;
        nv_api_error e;
        T_CHECK(nv_anth_parse(&ctx, a, strlen(a), 0, &r, &m, &e) == 0, "%s: %s", choices[i], e.message);
        T_CHECK(i < 2 ? r.req.grammar && r.tools : i == 2 ? r.req.lazy_grammar && r.tools : !r.tools && !r.req.grammar,
                "tool_choice %s", choices[i]);
        nv_api_request_free(&r), nv_anth_meta_free(&m);
    }
    /* consecutive turns of one role are one turn, as Anthropic combines them */
    T_CHECK(same_prompt(&ctx,
                        "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"A\"},{\"role\":\"user\","
                        "\"content\":[{\"type\":\"text\",\"text\":\"B\"}]},{\"role\":\"assistant\",\"content\":\"C\"},"
                        "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"play\",\"input\":{}}]},"
                        "{\"role\":\"user\",\"content\":\"D\"}]}",
                        "{\"messages\":[{\"role\":\"user\",\"content\":\"A\\n\\nB\"},{\"role\":\"assistant\",\"content\":\"C\","
                        "\"tool_calls\":[{\"id\":\"t\",\"type\":\"function\",\"function\":{\"name\":\"play\",\"arguments\":\"{}\"}}]},"
                        "{\"role\":\"user\",\"content\":\"D\"}]}",
                        why, sizeof why),
            "consecutive turns: %s", why);
    /* sampling fields and disable_parallel_tool_use reach the request */
    snprintf(a, sizeof a,
             "{\"model\":\"m\",\"max_tokens\":9,\"top_k\":5,\"top_p\":0.5,\"temperature\":0.25,%s,\"tool_choice\":{\"type\":"
             "\"auto\",\"disable_parallel_tool_use\":%%s},\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}",
             A_TOOLS);
    for (int one = 0; one < 2; one++) {
        char b[4096];
        snprintf(b, sizeof b, a, one ? "true" : "false");
        nv_api_request r;
        nv_anth_meta m;
        nv_api_error e;
        T_CHECK(nv_anth_parse(&ctx, b, strlen(b), 0, &r, &m, &e) == 0 && r.req.top_k == 5 && r.req.top_p == 0.5f &&
                    r.req.temperature == 0.25f && r.req.lazy_grammar && r.req.lazy_ends == one,
                "sampling and disable_parallel_tool_use %d: %s", one, e.message);
        nv_api_request_free(&r), nv_anth_meta_free(&m);
    }
    /* a plain string content is the same as one text block; the model's id is kept for responses */
    T_CHECK(same_prompt(&ctx, "{\"model\":\"m\",\"max_tokens\":1,\"system\":\"S\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}",
                        "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"Hi\"}]}", why, sizeof why),
            "strings: %s", why);
    nv_tokenizer_free(tok);
}

/* A reasoning model (--reasoning-format) thinks only when asked, as Anthropic's models do; other
 * models' prompts do not change */
static void test_thinking_default(void) {
    nv_tokenizer *tok = tok512();
    if (!tok) return;
    nv_api_ctx ctx = {.model_id = "m", .tok = tok, .tmpl = NV_CHAT_CHATML, .seq_len = 4096, .vocab_size = 512, .capacity = 4000, .reasoning = 1, .dim = 64};
    char why[256];
    const char *off = "{\"chat_template_kwargs\":{\"enable_thinking\":false},\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}";
    const char *on = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}";
    const char *fmt = "{\"model\":\"m\",\"max_tokens\":5,%s\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}";
    const char *fields[] = {"", "\"thinking\":{\"type\":\"disabled\"},", "\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024},",
                            "\"thinking\":{\"type\":\"adaptive\"},"};
    for (int i = 0; i < 4; i++) {
        char a[512];
        snprintf(a, sizeof a, fmt, fields[i]);
        T_CHECK(same_prompt(&ctx, a, i < 2 ? off : on, why, sizeof why), "reasoning model, %s: %s", fields[i], why);
        ctx.reasoning = 0;
        T_CHECK(same_prompt(&ctx, a, on, why, sizeof why), "other model, %s: %s", fields[i], why);
        ctx.reasoning = 1;
    }
    nv_tokenizer_free(tok);
}

/* A last assistant message is continued, in each template; OpenAI's continue_final_message the same */
static void test_prefill(void) {
    nv_tokenizer *tok = tok512();
    if (!tok) return;
    const struct {
        nv_chat_template t;
        const char *text;
    } cases[] = {
        {NV_CHAT_CHATML, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nOnce upon"},
        {NV_CHAT_LLAMA3, "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nOnce upon"},
        {NV_CHAT_PLAIN, "Hi\nOnce upon"},
        {NV_CHAT_LLAMA2, "[INST] Hi [/INST] Once upon"},
        {NV_CHAT_DEEPSEEK, "<\xef\xbd\x9cUser\xef\xbd\x9c>Hi<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>Once upon"},
        {NV_CHAT_PHI3, "<|user|>\nHi<|end|>\n<|assistant|>\nOnce upon"},
    };
    const char *anth = "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\","
                       "\"content\":\"Once upon\"}]}";
    const char *oai = "{\"continue_final_message\":true,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\","
                      "\"content\":\"Once upon\"}]}";
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        nv_api_ctx ctx = {.model_id = "m", .tok = tok, .tmpl = cases[c].t, .seq_len = 4096, .vocab_size = 512, .capacity = 4000, .reasoning = 0, .dim = 64};
        nv_api_request r;
        nv_anth_meta m;
        nv_api_error e;
        int *want = NULL, nw = 0;
        nv_tokenizer_encode(tok, cases[c].text, 1, 0, &want, &nw);
        T_CHECK(nv_anth_parse(&ctx, anth, strlen(anth), 0, &r, &m, &e) == 0, "%s", e.message);
        T_CHECK(same_ids(r.req.prompt, r.req.n_prompt, want, nw), "%s: the prefill is continued (%d vs %d tokens)",
                nv_chat_template_name(cases[c].t), r.req.n_prompt, nw);
        nv_api_request_free(&r), nv_anth_meta_free(&m);
        T_CHECK(nv_api_parse(&ctx, 1, oai, strlen(oai), &r, &e) == 0, "%s", e.message);
        T_CHECK(same_ids(r.req.prompt, r.req.n_prompt, want, nw), "%s: continue_final_message", nv_chat_template_name(cases[c].t));
        nv_api_request_free(&r);
        free(want);
    }
    nv_tokenizer_free(tok);
}

/* {"type": "error", "error": {"type", "message"}} and nothing else */
static int anth_error_ok(const char *body, const char *type, const char *needle, char *why, size_t cap) {
    cJSON *root = cJSON_Parse(body);
    const cJSON *e = cJSON_GetObjectItem(root, "error");
    const char *t = cJSON_GetStringValue(cJSON_GetObjectItem(e, "type"));
    const char *msg = cJSON_GetStringValue(cJSON_GetObjectItem(e, "message"));
    int ok = cJSON_GetArraySize(root) == 2 && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(root, "type")) ?: "", "error") &&
             cJSON_GetArraySize(e) == 2 && t && !strcmp(t, type) && msg && *msg && (!needle || strstr(msg, needle));
    snprintf(why, cap, "%.300s", body ? body : "(none)");
    cJSON_Delete(root);
    return ok;
}

static void test_refusals(void) {
    nv_tokenizer *tok = tok512();
    if (!tok) return;
    nv_api_ctx ctx = {.model_id = "m", .tok = tok, .tmpl = NV_CHAT_CHATML, .seq_len = 4096, .vocab_size = 512, .capacity = 4000, .reasoning = 0, .dim = 64};
    const struct {
        const char *body, *needle;
        int status;
    } cases[] = {
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", "model: Field required", 400},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", "max_tokens: Field required", 400},
        {"{\"model\":\"m\",\"max_tokens\":0,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", "max_tokens", 400},
        {"{\"model\":\"m\",\"max_tokens\":2.5,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", "max_tokens", 400},
        {"{\"model\":\"other\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", "does not exist", 404},
        {"{\"model\":\"m\",\"max_tokens\":5}", "messages: Field required", 400},
        {"{\"model\":\"m\",\"max_tokens\":5,\"messages\":[]}", "messages", 400},
        {"{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"system\",\"content\":\"Hi\"}]}", "messages.0.role", 400},
        {"{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages.0.content", 400},
        {"{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{}}]}]}",
         "reads text only ('image'", 400},
        {"{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\","
         "\"name\":\"b\",\"input\":{}}]}]}",
         "messages.0.content.0", 400},
        {"{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\"}]}]}",
         "tool_use_id", 400},
        {"{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
         "{\"type\":\"tool_result\",\"tool_use_id\":\"t\",\"content\":[{\"type\":\"text\",\"text\":\"ok\"},{\"type\":\"image\"}]}]}]}",
         "messages.0.content.1.content.1: only text blocks", 400},
        {"{\"model\":\"m\",\"max_tokens\":5,\"top_k\":1e300,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", "top_k", 400},
        {"{\"model\":\"m\",\"max_tokens\":5,\"top_k\":1e999,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", "top_k", 400},
        {"{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\","
         "\"content\":[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"b\",\"input\":[]}]}]}",
         "messages.1.content.0", 400},
        {"{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\","
         "\"content\":\"Once \"}]}",
         "trailing whitespace", 400},
        {"{\"model\":\"m\",\"max_tokens\":5,\"system\":5,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", "system", 400},
        {"{\"model\":\"m\",\"max_tokens\":5,\"temperature\":1.5,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", "temperature", 400},
        {"{\"model\":\"m\",\"max_tokens\":5,\"top_k\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", "top_k", 400},
        {"{\"model\":\"m\",\"max_tokens\":5,\"stream\":1,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", "stream", 400},
        {"{\"model\":\"m\",\"max_tokens\":5,\"stop_sequences\":[\"\"],\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}",
         "stop_sequences.0", 400},
        {"{\"model\":\"m\",\"max_tokens\":5,\"stop_sequences\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}",
         "stop_sequences", 400},
        {"{\"model\":\"m\",\"max_tokens\":5,\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"web_search\"}],\"messages\":"
         "[{\"role\":\"user\",\"content\":\"Hi\"}]}",
         "web_search_20250305", 400},
        {"{\"model\":\"m\",\"max_tokens\":5,\"tools\":[{\"name\":\"a\"}],\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}",
         "tools.0", 400},
        {"{\"model\":\"m\",\"max_tokens\":5,\"tool_choice\":{\"type\":\"any\"},\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}",
         "needs 'tools'", 400},
        {"{\"model\":\"m\",\"max_tokens\":5,\"tool_choice\":{\"type\":\"tool\"},\"tools\":[{\"name\":\"a\",\"input_schema\":{}}],"
         "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}",
         "tool_choice.name", 400},
        {"{\"model\":\"m\",\"max_tokens\":5,\"thinking\":{\"type\":\"sometimes\"},\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}",
         "thinking", 400},
        {"{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]", "JSON", 400},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nv_api_request r;
        nv_anth_meta m;
        nv_api_error e;
        int rc = nv_anth_parse(&ctx, cases[i].body, strlen(cases[i].body), 0, &r, &m, &e);
        char *json = rc ? nv_anth_error_json(&e) : NULL, why[400];
        T_CHECK(rc == cases[i].status && json &&
                    anth_error_ok(json, cases[i].status == 404 ? "not_found_error" : "invalid_request_error", cases[i].needle, why, sizeof why),
                "case %zu: %d %s", i, rc, json ? json : "(accepted)");
        free(json);
        if (!rc) nv_api_request_free(&r), nv_anth_meta_free(&m);
    }
    const int statuses[] = {400, 401, 403, 404, 408, 413, 429, 500, 503};
    const char *types[] = {"invalid_request_error", "authentication_error", "permission_error", "not_found_error", "timeout_error",
                           "request_too_large", "rate_limit_error", "api_error", "overloaded_error"};
    for (int i = 0; i < 9; i++) T_CHECK(!strcmp(nv_anth_error_type(statuses[i]), types[i]), "status %d", statuses[i]);
    nv_tokenizer_free(tok);
}

/* max_tokens is a ceiling: past the context the answer gets the room there is; count_tokens counts
 * any length */
static void test_limits_and_count(void) {
    nv_tokenizer *tok = tok512();
    if (!tok) return;
    nv_api_ctx ctx = {.model_id = "m", .tok = tok, .tmpl = NV_CHAT_CHATML, .seq_len = 64, .vocab_size = 512, .capacity = 4000, .reasoning = 0, .dim = 64};
    nv_api_request r;
    nv_anth_meta m;
    nv_api_error e;
    const char *big = "{\"model\":\"m\",\"max_tokens\":100000,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}";
    T_CHECK(nv_anth_parse(&ctx, big, strlen(big), 0, &r, &m, &e) == 0 && r.req.max_tokens == 64 - r.req.n_prompt,
            "max_tokens 100000 in a 64-token context: %d (%s)", r.req.max_tokens, e.message);
    nv_api_request_free(&r), nv_anth_meta_free(&m);
    const char *few = "{\"model\":\"m\",\"max_tokens\":3,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}";
    T_CHECK(nv_anth_parse(&ctx, few, strlen(few), 0, &r, &m, &e) == 0 && r.req.max_tokens == 3 && !strncmp(m.id, "msg_", 4) &&
                strlen(m.id) == 28,
            "max_tokens 3: %d, id %s", r.req.max_tokens, m.id);
    nv_api_request_free(&r), nv_anth_meta_free(&m);
    char lng[4096];
    snprintf(lng, sizeof lng, "{\"model\":\"m\",%%s\"messages\":[{\"role\":\"user\",\"content\":\"%0300d\"}]}", 0);
    char body[4096];
    snprintf(body, sizeof body, lng, "\"max_tokens\":5,");
    T_CHECK(nv_anth_parse(&ctx, body, strlen(body), 0, &r, &m, &e) == 400 && strstr(e.message, "context length"),
            "a prompt past the context: %s", e.message);
    snprintf(body, sizeof body, lng, "");
    T_CHECK(nv_anth_parse(&ctx, body, strlen(body), 1, &r, &m, &e) == 0 && r.req.n_prompt > 64, "count_tokens past the context: %d (%s)",
            r.req.n_prompt, e.message);
    nv_api_request_free(&r), nv_anth_meta_free(&m);
    nv_tokenizer_free(tok);
}

/* The next event of an SSE text: its name (the "event:" line, which must match the data's type) and data */
static cJSON *next_event(const char **p, char *name, size_t cap) {
    const char *ev = *p ? strstr(*p, "event: ") : NULL;
    if (!ev) return NULL;
    const char *nl = strchr(ev, '\n');
    if (!nl || strncmp(nl + 1, "data: ", 6)) return NULL;
    snprintf(name, cap, "%.*s", (int)(nl - ev - 7), ev + 7);
    const char *json = nl + 7, *end = strstr(json, "\n\n");
    if (!end) return NULL;
    char *one = strndup(json, (size_t)(end - json));
    cJSON *data = cJSON_Parse(one);
    free(one);
    *p = end + 2;
    const char *type = cJSON_GetStringValue(cJSON_GetObjectItem(data, "type"));
    if (!type || strcmp(type, name)) {
        cJSON_Delete(data);
        return NULL;
    }
    return data;
}

/* What a stream says, put together the way the SDKs do. */
typedef struct {
    char names[2048]; /* event names, space-separated */
    char text[4096], thinking[1024], calls[1024];
    char stop_reason[32], stop_sequence[64];
    int input_tokens, output_tokens, ok; /* the final usage's: the prompt (cached tokens included), the answer */
    int start_input, start_cached;      /* message_start's usage: input_tokens, cache_read_input_tokens */
} stream_sum;

static void sum_stream(const char *sse, stream_sum *s) {
    memset(s, 0, sizeof *s);
    s->ok = 1;
    char name[64];
    cJSON *ev;
    int open = -1, next = 0;
    for (const char *p = sse; (ev = next_event(&p, name, sizeof name)); cJSON_Delete(ev)) {
        strncat(s->names, name, sizeof s->names - strlen(s->names) - 2);
        strcat(s->names, " ");
        const int index = cJSON_GetObjectItem(ev, "index") ? cJSON_GetObjectItem(ev, "index")->valueint : -1;
        const cJSON *d = cJSON_GetObjectItem(ev, "delta"), *b = cJSON_GetObjectItem(ev, "content_block");
        if (!strcmp(name, "message_start")) {
            const cJSON *u = cJSON_GetObjectItem(cJSON_GetObjectItem(ev, "message"), "usage");
            s->start_input = cJSON_GetObjectItem(u, "input_tokens")->valueint;
            s->start_cached = cJSON_GetObjectItem(u, "cache_read_input_tokens")->valueint;
        }
        if (!strcmp(name, "content_block_start")) {
            s->ok &= open < 0 && index == next;
            open = index;
            if (!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(b, "type")) ?: "", "tool_use")) {
                strncat(s->calls, cJSON_GetStringValue(cJSON_GetObjectItem(b, "name")) ?: "?", sizeof s->calls - strlen(s->calls) - 1);
                s->ok &= !strncmp(cJSON_GetStringValue(cJSON_GetObjectItem(b, "id")) ?: "", "toolu_", 6);
            }
        } else if (!strcmp(name, "content_block_delta")) {
            s->ok &= index == open;
            const char *type = cJSON_GetStringValue(cJSON_GetObjectItem(d, "type")) ?: "";
            char *dst = !strcmp(type, "text_delta") ? s->text : !strcmp(type, "thinking_delta") ? s->thinking : s->calls;
            size_t cap = dst == s->text ? sizeof s->text : dst == s->thinking ? sizeof s->thinking : sizeof s->calls;
            const char *key = !strcmp(type, "text_delta") ? "text" : !strcmp(type, "thinking_delta") ? "thinking" : "partial_json";
            strncat(dst, cJSON_GetStringValue(cJSON_GetObjectItem(d, key)) ?: "", cap - strlen(dst) - 1);
        } else if (!strcmp(name, "content_block_stop")) {
            s->ok &= index == open;
            open = -1;
            next++;
        } else if (!strcmp(name, "message_delta")) {
            snprintf(s->stop_reason, sizeof s->stop_reason, "%s", cJSON_GetStringValue(cJSON_GetObjectItem(d, "stop_reason")) ?: "");
            snprintf(s->stop_sequence, sizeof s->stop_sequence, "%s",
                     cJSON_GetStringValue(cJSON_GetObjectItem(d, "stop_sequence")) ?: "");
            const cJSON *u = cJSON_GetObjectItem(ev, "usage");
            s->output_tokens = cJSON_GetObjectItem(u, "output_tokens")->valueint;
            s->input_tokens = cJSON_GetObjectItem(u, "input_tokens")->valueint + cJSON_GetObjectItem(u, "cache_read_input_tokens")->valueint;
        }
    }
    const size_t n = strlen(s->names);
    s->ok &= open < 0 && n >= 13 && !strcmp(s->names + n - 13, "message_stop ") && !strncmp(s->names, "message_start ping ", 19);
}

/* The events of an answer with reasoning, text and a call; an empty answer still has a text block */
static void test_stream_events(void) {
    nv_anth_meta m = {.id = "msg_x", .model = "m"};
    nv_anth_stream st;
    nv_buf out = {0};
    nv_tool_call call = {.id = "call_abc", .name = "play", .arguments = "{\"toy\":\"car\"}"};
    nv_anth_stream_start(&st, &m, 7, 0, &out);
    nv_anth_stream_text(&st, 1, "hm", &out);
    nv_anth_stream_text(&st, 0, "Let ", &out);
    nv_anth_stream_text(&st, 0, "me.", &out);
    nv_anth_stream_call(&st, &call, &out);
    nv_anth_answer a = {.stop_reason = "tool_use", .prompt_tokens = 7, .output_tokens = 12};
    nv_anth_stream_end(&st, &a, &out);
    stream_sum s;
    sum_stream(out.data, &s);
    T_CHECK(s.ok && !strcmp(s.names, "message_start ping content_block_start content_block_delta content_block_stop "
                                     "content_block_start content_block_delta content_block_delta content_block_stop "
                                     "content_block_start content_block_delta content_block_stop message_delta message_stop ") &&
                !strcmp(s.thinking, "hm") && !strcmp(s.text, "Let me.") && !strcmp(s.calls, "play{\"toy\":\"car\"}") &&
                !strcmp(s.stop_reason, "tool_use") && s.input_tokens == 7 && s.output_tokens == 12,
            "events: %s", out.data);
    nv_buf_free(&out);
    nv_anth_stream_start(&st, &m, 3, 0, &out);
    nv_anth_stream_end(&st, &(nv_anth_answer){.stop_reason = "max_tokens", .prompt_tokens = 3}, &out);
    sum_stream(out.data, &s);
    T_CHECK(s.ok && !strcmp(s.names, "message_start ping content_block_start content_block_stop message_delta message_stop ") &&
                !strcmp(s.stop_reason, "max_tokens"),
            "an empty answer: %s", out.data);
    nv_buf_free(&out);
    /* the whole message: thinking, text, tool_use with its input parsed; usage without the cache reads */
    nv_anth_answer w = {.reasoning = "hm", .text = "Let me.", .calls = &call, .n_calls = 1, .stop_reason = "tool_use",
                        .prompt_tokens = 40, .cached_tokens = 32, .output_tokens = 9};
    char *body = nv_anth_message(&m, &w);
    cJSON *root = cJSON_Parse(body);
    const cJSON *c = cJSON_GetObjectItem(root, "content"), *u = cJSON_GetObjectItem(root, "usage");
    const cJSON *tu = cJSON_GetArrayItem(c, 2);
    T_CHECK(cJSON_GetArraySize(c) == 3 && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(c, 0), "type")), "thinking") &&
                !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(c, 1), "text")), "Let me.") &&
                !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(tu, "id")), "toolu_abc") &&
                !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(tu, "input"), "toy")), "car") &&
                cJSON_GetObjectItem(u, "input_tokens")->valueint == 8 && cJSON_GetObjectItem(u, "cache_read_input_tokens")->valueint == 32 &&
                cJSON_GetObjectItem(u, "output_tokens")->valueint == 9 && cJSON_IsNull(cJSON_GetObjectItem(root, "stop_sequence")) &&
                !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(root, "type")), "message"),
            "message: %s", body);
    cJSON_Delete(root);
    free(body);
    /* stop reasons: a request's own stop sequence, the template's end, a call, a limit */
    nv_anth_meta sm = {.n_stop = 1};
    sm.stop[0] = "END";
    const char *seq;
    T_CHECK(!strcmp(nv_anth_stop_reason(&sm, NV_FINISH_STOP, 0, 0, &seq), "stop_sequence") && seq && !strcmp(seq, "END") &&
                !strcmp(nv_anth_stop_reason(&sm, NV_FINISH_STOP, 1, 0, &seq), "end_turn") && !seq &&
                !strcmp(nv_anth_stop_reason(&sm, NV_FINISH_STOP, -1, 2, &seq), "tool_use") &&
                !strcmp(nv_anth_stop_reason(&sm, NV_FINISH_LENGTH, -1, 0, &seq), "max_tokens"),
            "stop reasons");
}

/* ---- a real server --------------------------------------------------------------------------- */

static server srv;
static const char *KEY = "x-api-key: sekret\r\n";

/* POST path with the key; the body's status must be want. */
static int post(const char *path, const char *headers, const char *body, resp *r) {
    return http(srv.port, "POST", path, headers ? headers : KEY, body, r);
}

/* The text of a whole message's text blocks, its stop reason and usage (the prompt's tokens, cached
 * ones included). */
static void whole_text(const char *body, char *text, size_t cap, char *stop, size_t scap, int *in, int *out) {
    cJSON *root = cJSON_Parse(body);
    text[0] = stop[0] = '\0';
    for (const cJSON *b = cJSON_GetObjectItem(root, "content") ? cJSON_GetObjectItem(root, "content")->child : NULL; b; b = b->next)
        if (!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(b, "type")) ?: "", "text"))
            strncat(text, cJSON_GetStringValue(cJSON_GetObjectItem(b, "text")) ?: "", cap - strlen(text) - 1);
    snprintf(stop, scap, "%s", cJSON_GetStringValue(cJSON_GetObjectItem(root, "stop_reason")) ?: "");
    const cJSON *u = cJSON_GetObjectItem(root, "usage"), *cached = cJSON_GetObjectItem(u, "cache_read_input_tokens");
    /* the whole prompt: input_tokens does not count what the prefix cache served */
    *in = cJSON_GetObjectItem(u, "input_tokens") && cached ? cJSON_GetObjectItem(u, "input_tokens")->valueint + cached->valueint : -1;
    *out = cJSON_GetObjectItem(u, "output_tokens") ? cJSON_GetObjectItem(u, "output_tokens")->valueint : -1;
    cJSON_Delete(root);
}

/* The content and prompt_tokens of a chat completion. */
static void chat_text(const char *body, char *text, size_t cap, int *prompt_tokens) {
    cJSON *root = cJSON_Parse(body);
    const cJSON *msg = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0), "message");
    snprintf(text, cap, "%s", cJSON_GetStringValue(cJSON_GetObjectItem(msg, "content")) ?: "");
    const cJSON *pt = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "usage"), "prompt_tokens");
    *prompt_tokens = pt ? pt->valueint : -1;
    cJSON_Delete(root);
}

/* Starts srv on model (chatml, a key). */
static int start(const char *name, const char *model, const char *tok) {
    if (server_spawn(&srv, name, NULL, NULL, model, tok, "--kv-memory 64M --chat-template chatml --api-key sekret", 30)) return 1;
    T_CHECK(0, "the server %s did not start", name);
    return 0;
}

/* Text: the trained stories260K (its 512-token context holds no tools block) */
static void test_server_messages(void) {
    const char *tok = t_data("models/tok512.bin"), *model = t_data("models/stories260K.bin");
    if (!tok || !model || !start("anthropic", model, tok)) return;
    char body[4096], text[4096], stop[32], otext[4096];
    int in = 0, out = 0, prompt_tokens = 0;
    resp r, o;
    /* greedy: the same text and prompt as /v1/chat/completions; the stream says the same */
    const char *msgs = "\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}]";
    snprintf(body, sizeof body, "{\"model\":\"stories260K\",\"max_tokens\":40,\"temperature\":0,%s}", msgs);
    T_CHECK(post("/v1/messages", NULL, body, &r) && r.status == 200 && strstr(r.head, "application/json"), "whole: %d %s", r.status, r.body);
    whole_text(r.body, text, sizeof text, stop, sizeof stop, &in, &out);
    snprintf(body, sizeof body, "{\"max_tokens\":40,\"temperature\":0,%s}", msgs);
    T_CHECK(post("/v1/chat/completions", NULL, body, &o) && o.status == 200, "chat: %d", o.status);
    chat_text(o.body, otext, sizeof otext, &prompt_tokens);
    T_CHECK(*text && !strcmp(text, otext) && in == prompt_tokens && out <= 40 && !strcmp(stop, out == 40 ? "max_tokens" : "end_turn"),
            "messages '%s' (%s, %d in, %d out) vs chat '%s' (%d in)", text, stop, in, out, otext, prompt_tokens);
    resp_free(&r), resp_free(&o);
    snprintf(body, sizeof body, "{\"model\":\"stories260K\",\"max_tokens\":40,\"temperature\":0,\"stream\":true,%s}", msgs);
    stream_sum s;
    T_CHECK(post("/v1/messages", NULL, body, &r) && r.status == 200 && strstr(r.head, "text/event-stream"), "stream: %d", r.status);
    sum_stream(r.body, &s);
    /* message_start comes once the prompt is in: its usage already splits off the prefix cache's share
       (the same prompt was just served, so some of it is cached) */
    T_CHECK(s.ok && !strcmp(s.text, text) && !strcmp(s.stop_reason, stop) && s.input_tokens == in && s.output_tokens == out &&
                s.start_cached > 0 && s.start_input + s.start_cached == in,
            "stream '%s' (%s) vs '%s' (%s), start usage %d + %d cached: %.400s", s.text, s.stop_reason, text, stop, s.start_input,
            s.start_cached, r.body);
    resp_free(&r);
    /* count_tokens: the prompt's length */
    snprintf(body, sizeof body, "{\"model\":\"stories260K\",%s}", msgs);
    T_CHECK(post("/v1/messages/count_tokens", NULL, body, &r) && r.status == 200 && strstr(r.body, "\"input_tokens\":") &&
                atoi(strstr(r.body, "\"input_tokens\":") + 15) == in,
            "count_tokens: %d %s (want %d)", r.status, r.body, in);
    resp_free(&r);
    /* a stop sequence from the middle of that text ends the answer before it, named in the response */
    char seq[8] = "";
    for (size_t i = 4; i + 3 < strlen(text) && !*seq; i++)
        if (text[i] >= 'a' && text[i] <= 'z' && text[i + 1] >= 'a' && text[i + 1] <= 'z' && text[i + 2] >= 'a' && text[i + 2] <= 'z')
            memcpy(seq, text + i, 3);
    T_CHECK(*seq, "no letters to stop at in '%s'", text);
    if (*seq) {
        const size_t before = (size_t)(strstr(text, seq) - text);
        for (int stream = 0; stream < 2; stream++) {
            snprintf(body, sizeof body,
                     "{\"model\":\"stories260K\",\"max_tokens\":40,\"temperature\":0,\"stream\":%s,\"stop_sequences\":[\"zzzz\",\"%s\"],%s}",
                     stream ? "true" : "false", seq, msgs);
            T_CHECK(post("/v1/messages", NULL, body, &r) && r.status == 200, "stop: %d", r.status);
            char sseq[64] = "";
            if (stream) {
                sum_stream(r.body, &s);
                snprintf(text + 2048, 2048, "%.2000s", s.text);
                snprintf(stop, sizeof stop, "%s", s.stop_reason);
                snprintf(sseq, sizeof sseq, "%s", s.stop_sequence);
            } else {
                whole_text(r.body, text + 2048, 2048, stop, sizeof stop, &in, &out);
                cJSON *root = cJSON_Parse(r.body);
                snprintf(sseq, sizeof sseq, "%s", cJSON_GetStringValue(cJSON_GetObjectItem(root, "stop_sequence")) ?: "");
                cJSON_Delete(root);
            }
            T_CHECK(!strcmp(stop, "stop_sequence") && !strcmp(sseq, seq) && strlen(text + 2048) == before &&
                        !strncmp(text + 2048, text, before),
                    "stream %d: stop at '%s': '%s' (%s, '%s')", stream, seq, text + 2048, stop, sseq);
            resp_free(&r);
        }
    }
    /* a prefill is continued, as /v1/chat/completions' continue_final_message */
    const char *pre = "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"Once upon\"}]";
    snprintf(body, sizeof body, "{\"model\":\"stories260K\",\"max_tokens\":12,\"temperature\":0,%s}", pre);
    T_CHECK(post("/v1/messages", NULL, body, &r) && r.status == 200, "prefill: %d %s", r.status, r.body);
    whole_text(r.body, text, sizeof text, stop, sizeof stop, &in, &out);
    snprintf(body, sizeof body, "{\"max_tokens\":12,\"temperature\":0,\"continue_final_message\":true,%s}", pre);
    T_CHECK(post("/v1/chat/completions", NULL, body, &o) && o.status == 200, "continue: %d %s", o.status, o.body);
    chat_text(o.body, otext, sizeof otext, &prompt_tokens);
    T_CHECK(!strcmp(text, otext) && in == prompt_tokens, "prefill '%s' (%d) vs '%s' (%d)", text, in, otext, prompt_tokens);
    resp_free(&r), resp_free(&o);
    /* errors in Anthropic's shape: key, model, method, JSON; Bearer keys work too */
    char why[400];
    snprintf(body, sizeof body, "{\"model\":\"stories260K\",\"max_tokens\":2,%s}", msgs);
    T_CHECK(post("/v1/messages", "", body, &r) && r.status == 401 && anth_error_ok(r.body, "authentication_error", NULL, why, sizeof why),
            "no key: %d %s", r.status, r.body);
    resp_free(&r);
    T_CHECK(post("/v1/messages", "x-api-key: wrong\r\n", body, &r) && r.status == 401, "a wrong key: %d", r.status);
    resp_free(&r);
    T_CHECK(post("/v1/messages", "Authorization: Bearer sekret\r\n", body, &r) && r.status == 200, "Bearer: %d %s", r.status, r.body);
    resp_free(&r);
    T_CHECK(post("/v1/messages", "x-api-key: wrong\r\nAuthorization: Bearer sekret\r\n", body, &r) && r.status == 200,
            "either header's key: %d %s", r.status, r.body);
    resp_free(&r);
    T_CHECK(post("/v1/messages", NULL, "{\"model\":\"claude-x\",\"max_tokens\":2,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", &r) &&
                r.status == 404 && anth_error_ok(r.body, "not_found_error", "claude-x", why, sizeof why),
            "unknown model: %d %s", r.status, r.body);
    resp_free(&r);
    /* /v1/models in Anthropic's shape for a client that sends anthropic-version; OpenAI's otherwise */
    const char *AV = "x-api-key: sekret\r\nanthropic-version: 2023-06-01\r\n";
    T_CHECK(http(srv.port, "GET", "/v1/models", AV, NULL, &r) && r.status == 200 && strstr(r.body, "\"type\":\"model\"") &&
                strstr(r.body, "\"id\":\"stories260K\"") && strstr(r.body, "\"has_more\":false") && strstr(r.body, "\"created_at\":\"20"),
            "models: %d %s", r.status, r.body);
    resp_free(&r);
    T_CHECK(http(srv.port, "GET", "/v1/models/stories260K", AV, NULL, &r) && r.status == 200 &&
                strstr(r.body, "\"display_name\":\"stories260K\"") && !strstr(r.body, "\"data\""),
            "one model: %d %s", r.status, r.body);
    resp_free(&r);
    T_CHECK(http(srv.port, "GET", "/v1/models/claude-x", AV, NULL, &r) && r.status == 404 &&
                anth_error_ok(r.body, "not_found_error", NULL, why, sizeof why),
            "an unknown model: %d %s", r.status, r.body);
    resp_free(&r);
    T_CHECK(http(srv.port, "GET", "/v1/models", KEY, NULL, &r) && r.status == 200 && strstr(r.body, "\"object\":\"list\""),
            "OpenAI's models: %d %s", r.status, r.body);
    resp_free(&r);
    T_CHECK(http(srv.port, "GET", "/v1/messages", KEY, NULL, &r) && r.status == 405 &&
                anth_error_ok(r.body, "invalid_request_error", NULL, why, sizeof why),
            "GET: %d %s", r.status, r.body);
    resp_free(&r);
    T_CHECK(post("/v1/messages/count_tokens", NULL, "{\"model\":", &r) && r.status == 400 &&
                anth_error_ok(r.body, "invalid_request_error", NULL, why, sizeof why),
            "bad JSON: %d %s", r.status, r.body);
    resp_free(&r);
    int rc = server_stop_within(&srv, 20);
    T_CHECK(rc == 0, "server exit %d", rc);
}

/* Tools: a random model with a 2,048-token context, the calls held to the schema */
static void test_server_tools(void) {
    const char *tok = t_data("models/tok512.bin");
    if (!tok) return;
    char model[700], args[1024], body[4096], text[4096], stop[32], otext[4096];
    int in = 0, out = 0, prompt_tokens = 0;
    resp r, o;
    stream_sum s;
    snprintf(model, sizeof model, "%s/anth-2k.bin", t_tmpdir());
    snprintf(args, sizeof args, "init --preset stories260K --seq-len 2048 --seed 7 -o '%s'", model);
    T_CHECK(t_nerve(args) == 0, "init failed");
    if (!start("anthropic-tools", model, tok)) return;
    /* tools: "any" makes a call that fits the schema, whole and streamed the same */
    snprintf(body, sizeof body,
             "{\"model\":\"anth-2k\",\"max_tokens\":300,\"temperature\":0,\"stream\":%%s,%s,\"tool_choice\":{\"type\":\"any\","
             "\"disable_parallel_tool_use\":true},\"messages\":[{\"role\":\"user\",\"content\":\"Play?\"}]}",
             A_TOOLS);
    char b2[4096];
    snprintf(b2, sizeof b2, body, "false");
    T_CHECK(post("/v1/messages", NULL, b2, &r) && r.status == 200, "tool_use: %d %s", r.status, r.body);
    cJSON *root = cJSON_Parse(r.body);
    const cJSON *c = cJSON_GetObjectItem(root, "content"), *tu = NULL;
    for (const cJSON *b = c ? c->child : NULL; b; b = b->next)
        if (!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(b, "type")) ?: "", "tool_use")) tu = b;
    const char *toy = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(tu, "input"), "toy"));
    const char *tid = cJSON_GetStringValue(cJSON_GetObjectItem(tu, "id"));
    T_CHECK(tu && toy && (!strcmp(toy, "ball") || !strcmp(toy, "car")) && tid && !strncmp(tid, "toolu_", 6) &&
                !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(root, "stop_reason")) ?: "", "tool_use"),
            "tool_use: %s", r.body);
    char want_call[256];
    snprintf(want_call, sizeof want_call, "play{\"toy\":\"%s\"}", toy ? toy : "?");
    cJSON_Delete(root);
    resp_free(&r);
    snprintf(b2, sizeof b2, body, "true");
    T_CHECK(post("/v1/messages", NULL, b2, &r) && r.status == 200, "tool_use stream: %d", r.status);
    sum_stream(r.body, &s);
    T_CHECK(s.ok && !strcmp(s.calls, want_call) && !strcmp(s.stop_reason, "tool_use"), "streamed call '%s' vs '%s': %.600s", s.calls,
            want_call, r.body);
    resp_free(&r);
    /* the call's result goes back as a tool_result: the same prompt as the OpenAI conversation */
    snprintf(body, sizeof body,
             "{\"model\":\"anth-2k\",\"max_tokens\":4,%s,\"messages\":[{\"role\":\"user\",\"content\":\"Play?\"},"
             "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"toolu_9\",\"name\":\"play\",\"input\":"
             "{\"toy\":\"car\"}}]},{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_9\","
             "\"content\":\"vroom\"}]}]}",
             A_TOOLS);
    T_CHECK(post("/v1/messages", NULL, body, &r) && r.status == 200, "tool_result: %d %s", r.status, r.body);
    whole_text(r.body, text, sizeof text, stop, sizeof stop, &in, &out);
    snprintf(body, sizeof body,
             "{\"max_tokens\":4,%s,\"messages\":[{\"role\":\"user\",\"content\":\"Play?\"},{\"role\":\"assistant\","
             "\"content\":null,\"tool_calls\":[{\"id\":\"toolu_9\",\"type\":\"function\",\"function\":{\"name\":\"play\","
             "\"arguments\":\"{\\\"toy\\\":\\\"car\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"toolu_9\",\"content\":\"vroom\"}]}",
             O_TOOLS);
    T_CHECK(post("/v1/chat/completions", NULL, body, &o) && o.status == 200, "openai tool result: %d %s", o.status, o.body);
    chat_text(o.body, otext, sizeof otext, &prompt_tokens);
    T_CHECK(in == prompt_tokens, "tool_result prompt %d vs %d", in, prompt_tokens);
    resp_free(&r), resp_free(&o);
    int rc = server_stop_within(&srv, 20);
    T_CHECK(rc == 0, "server exit %d", rc);
}

int main(void) {
    T_RUN(test_translation_matches_openai);
    T_RUN(test_mistral_call_ids);
    T_RUN(test_prefill);
    T_RUN(test_thinking_default);
    T_RUN(test_refusals);
    T_RUN(test_limits_and_count);
    T_RUN(test_stream_events);
    T_RUN(test_server_messages);
    T_RUN(test_server_tools);
    return t_done();
}
