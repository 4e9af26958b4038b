/* nerve bench template: what running a chat template as Jinja costs (serve --jinja, a model's own
 * template nerve has no renderer of), against nerve's own renderer of the same template measured in
 * the same run; both give the same text (checked on every row). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "cli/bench.h"
#include "cli/cli.h"
#include "serve/api.h"

#define CMD "bench template"

typedef struct {
    nv_chat_template t;
    const nv_tokenizer *tok;
    const nv_chat_msg *m;
    int n;
    nv_chat_opts o;
    size_t bytes;
    nv_err e;
} render_ctx;

static void run_render(void *p) {
    render_ctx *c = p;
    nv_buf b = {0};
    c->e = nv_chat_render_text(c->t, c->tok, c->m, c->n, &c->o, &b);
    c->bytes = b.len;
    nv_buf_free(&b);
}

/* text of o's rendering (NULL on failure; caller frees) */
static char *rendered(render_ctx *c) {
    nv_buf b = {0};
    if (nv_chat_render_text(c->t, c->tok, c->m, c->n, &c->o, &b) != NV_OK) {
        nv_buf_free(&b);
        return NULL;
    }
    return b.data ? nv_buf_take(&b) : strdup("");
}

int bench_template(int argc, char **argv, const bench_opts *o) {
    const char *tok_path = NULL;
    const int arc = bench_tokenizer_arg(CMD, argc, argv, &tok_path);
    if (arc) return arc;
    char path[4096];
    if (!tok_path && nv_data_path("models/tok512.bin", path, sizeof path)) tok_path = path;
    nv_tokenizer *tok = NULL;
    if (!tok_path || nv_tokenizer_load(tok_path, 0, &tok) != NV_OK) {
        bench_row r;
        row_begin(&r, "template", "cpu", 1);
        row_fail(&r, tok_path ? nv_errmsg() : "no ../shared/data/models/tok512.bin (set NERVE_DATA, or -z TOKENIZER)");
        row_end(&r, o);
        nv_tokenizer_free(tok);
        return 0;
    }
    /* a conversation: a system message, then questions and answers of a few sentences, one answer a tool call */
    enum { MAX_MSGS = 129 };
    static const nv_chat_call call = {"get_weather", "{\"city\": \"Paris\", \"unit\": \"c\"}", "call_1"};
    nv_chat_msg msgs[MAX_MSGS];
    msgs[0] = (nv_chat_msg){.role = "system", .content = "You are a helpful assistant. Answer briefly and kindly."};
    for (int i = 1; i < MAX_MSGS; i++) {
        const int user = i % 2;
        msgs[i] = (nv_chat_msg){.role = user ? "user" : "assistant",
                                .content = user ? "Once upon a time there was a little girl named Lily. What did she find in the park?"
                                                : "She found a shiny red ball under a big tree, and she played with it all day long."};
        if (i == 2) msgs[i].calls = &call, msgs[i].n_calls = 1;
        if (i == 3) msgs[i] = (nv_chat_msg){.role = "tool", .content = "{\"temp\": 21}", .tool_call_id = "call_1"};
    }
    cJSON *tools = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The weather in a city\","
                               " \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"unit\": "
                               "{\"enum\": [\"c\", \"f\"]}}, \"required\": [\"city\"]}}}]");
    static const int lengths[] = {3, 17, 129};
    const int n_templates = o->quick ? 2 : NV_CHAT_SMOLLM3 + 1, n_lengths = o->quick ? 2 : 3;
    const double min_s = o->quick ? 0.02 : 0.2;
    for (int t = 0; t < n_templates; t++) {
        const nv_chat_template tmpl = o->quick ? (t ? NV_CHAT_LLAMA3 : NV_CHAT_CHATML) : (nv_chat_template)t;
        const char *text = nv_chat_template_jinja(tmpl);
        nv_jinja *j = NULL;
        char **tool_texts = NULL;
        int n_tools = 0;
        nv_api_error err;
        nv_err e = nv_jinja_parse(text, strlen(text), &j);
        if (e == NV_OK && nv_api_tool_texts(tools, nv_chat_tool_style(tmpl), &tool_texts, &n_tools, &err))
            e = nv_fail(NV_EINVAL, "%s", err.message);
        for (int k = 0; k < n_lengths; k++) {
            bench_row r;
            row_begin(&r, "template", "cpu", 1);
            row_str(&r, "template", nv_chat_template_name(tmpl));
            row_int(&r, "messages", lengths[k]);
            render_ctx c = {tmpl, tok, msgs, lengths[k], {.tools = (const char *const *)tool_texts, .n_tools = n_tools}, 0, NV_OK};
            render_ctx jc = c;
            jc.o.jinja = j;
            char *ours = e == NV_OK ? rendered(&c) : NULL, *theirs = e == NV_OK ? rendered(&jc) : NULL;
            if (!ours || !theirs) {
                row_fail(&r, nv_errmsg());
            } else {
                const double renderer_s = bench_median(run_render, &c, 3, min_s, NULL), jinja_s = bench_median(run_render, &jc, 3, min_s, NULL);
                row_int(&r, "bytes", (long long)strlen(ours));
                row_num(&r, "renderer_us", renderer_s * 1e6);
                row_num(&r, "jinja_us", jinja_s * 1e6);
                row_num(&r, "ratio", jinja_s / renderer_s);
                row_int(&r, "same_text", !strcmp(ours, theirs));
            }
            row_end(&r, o);
            free(ours), free(theirs);
        }
        nv_api_tool_texts_free(tool_texts, n_tools);
        nv_jinja_free(j);
    }
    cJSON_Delete(tools);
    nv_tokenizer_free(tok);
    return 0;
}
