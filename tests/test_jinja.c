/* The Jinja engine (src/serve/jinja.c) that runs models' own chat templates: the language against
 * jinja2's answers (tests/jinja_cases.json, checked against jinja2 itself by scripts/jinja_check.py),
 * nerve's own templates' Jinja forms against their C renderers (text and ids), a training turn,
 * the variables a request passes, and untrusted templates' errors and limits. */
#include <cjson/cJSON.h>

#include "model/gguf.h"
#include "serve/chat.h"
#include "serve/jinja.h"
#include "serve/api.h"
#include "t.h"
#include "serve_util.h"

/* renders text with vars (JSON text, NULL: none): NV_OK and *out, or the error */
static nv_err render(const char *text, const char *vars, char **out) {
    *out = NULL;
    nv_jinja *j;
    nv_err e = nv_jinja_parse(text, strlen(text), &j);
    if (e != NV_OK) return e;
    cJSON *v = vars ? cJSON_Parse(vars) : NULL;
    nv_buf b = {0};
    e = nv_jinja_render(j, v, &b);
    cJSON_Delete(v);
    nv_jinja_free(j);
    if (e == NV_OK) *out = b.data ? nv_buf_take(&b) : strdup("");
    nv_buf_free(&b);
    return e;
}

/* Every case renders what jinja2 gave it, or fails with the message it names. */
static void test_jinja_cases(void) {
    char *text = NULL;
    size_t n = 0;
    if (nv_file_read_all("tests/jinja_cases.json", &text, &n) != NV_OK) {
        T_CHECK(0, "tests/jinja_cases.json: %s", nv_errmsg());
        return;
    }
    cJSON *all = cJSON_Parse(text), *vars = cJSON_GetObjectItem(all, "variables"), *c;
    int cases = 0, limits = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(all, "cases")) {
        const char *t = cJSON_GetObjectItem(c, "template")->valuestring;
        const cJSON *want = cJSON_GetObjectItem(c, "expected"), *err = cJSON_GetObjectItem(c, "error");
        nv_jinja *j;
        nv_buf b = {0};
        nv_err e = nv_jinja_parse(t, strlen(t), &j);
        if (e == NV_OK) e = nv_jinja_render(j, vars, &b), nv_jinja_free(j);
        if (want)
            T_CHECK(e == NV_OK && !strcmp(b.data ? b.data : "", want->valuestring), "%s\n  gave: %s\n  want: %s", t,
                    e == NV_OK ? (b.data ? b.data : "") : nv_errmsg(), want->valuestring);
        else
            T_CHECK(e != NV_OK && strstr(nv_errmsg(), err->valuestring) && strstr(nv_errmsg(), "chat template: line "),
                    "%s: %s (want an error with '%s')", t, e == NV_OK ? "rendered" : nv_errmsg(), err->valuestring);
        limits += cJSON_IsTrue(cJSON_GetObjectItem(c, "limit"));
        cases++;
        nv_buf_free(&b);
    }
    T_CHECK(cases >= 70 && limits >= 5, "%d cases, %d of limits", cases, limits);
    cJSON_Delete(all);
    free(text);
}

/* The cases' expectations are jinja2's (python3-jinja2, as transformers runs templates). */
static void test_jinja_cases_are_jinja2s(void) {
    if (system("/usr/bin/python3 -c 'import jinja2' 2>/dev/null") != 0) return t_skip("no python3-jinja2 (scripts/deps.sh)");
    FILE *p = popen("/usr/bin/python3 scripts/jinja_check.py tests/jinja_cases.json 2>&1", "r");
    char out[4096] = "";
    const size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
    out[n] = 0;
    const int rc = p ? pclose(p) : -1;
    T_CHECK(rc == 0 && strstr(out, "cases as jinja2 gives them"), "jinja_check.py (exit %d): %s", rc, out);
}

/* The language's corners the cases cannot show: the line an error names, a template's own
 * whitespace, the generation marker, variables that are absent, and what a program keeps. */
static void test_jinja_corners(void) {
    char *out;
    T_CHECK(render("a\nb\n{{ x.y }}", NULL, &out) == NV_EFORMAT && strstr(nv_errmsg(), "line 3: 'y' of an undefined value"), "%s", nv_errmsg());
    T_CHECK(render("{% for %}", NULL, &out) == NV_EFORMAT && strstr(nv_errmsg(), "line 1:"), "%s", nv_errmsg());
    T_CHECK(render("{% generation %}g{{ 1 }}{% endgeneration %}|", NULL, &out) == NV_OK && !strcmp(out, "g1|"), "%s", out ? out : nv_errmsg());
    free(out);
    T_CHECK(render("{{ messages }}[{{ nothing }}]{{ nothing is defined }}", NULL, &out) == NV_OK && !strcmp(out, "[]False"), "%s",
            out ? out : nv_errmsg());
    free(out);
    T_CHECK(render("x\n", NULL, &out) == NV_OK && !strcmp(out, "x"), "one last line break dropped: '%s'", out ? out : "");
    free(out);
    T_CHECK(render("", NULL, &out) == NV_OK && !strcmp(out, ""), "empty");
    free(out);
    /* a program renders again and again the same, its variables its own each time */
    nv_jinja *j;
    const char *t = "{% set ns = namespace(k=0) %}{% for m in messages %}{% set ns.k = ns.k + 1 %}{% endfor %}{{ ns.k }}";
    T_CHECK(nv_jinja_parse(t, strlen(t), &j) == NV_OK, "%s", nv_errmsg());
    for (int i = 0; i < 3; i++) {
        cJSON *v = cJSON_Parse("{\"messages\": [1, 2, 3]}");
        nv_buf b = {0};
        T_CHECK(nv_jinja_render(j, v, &b) == NV_OK && b.data && !strcmp(b.data, "3"), "render %d: %s", i, b.data ? b.data : nv_errmsg());
        nv_buf_free(&b);
        cJSON_Delete(v);
    }
    nv_jinja_free(j);
    /* bytes that are not text, and NULs, in a template: rendered as they are or refused, never read past */
    static const char odd[] = "\xff\xfe{{ '\xc3' }}\x01";
    T_CHECK(render(odd, NULL, &out) == NV_OK && !strcmp(out, "\xff\xfe\xc3\x01"), "odd bytes");
    free(out);
    T_CHECK(render("{{ 'abc", NULL, &out) == NV_EFORMAT && strstr(nv_errmsg(), "not closed"), "%s", nv_errmsg());
    T_CHECK(render("{{ 1 }", NULL, &out) == NV_EFORMAT, "an unclosed tag");
    T_CHECK(render("{# c", NULL, &out) == NV_EFORMAT, "an unclosed comment");
    T_CHECK(render("{% raw %}x", NULL, &out) == NV_EFORMAT, "an unclosed raw");
}

static const char *const TOOLS[] = {
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather, «now»\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"n\": {\"type\": \"number\", \"minimum\": 0.5}}, "
    "\"required\": [\"city\"]}}}",
    "{\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}",
};

/* nerve's own templates, run as Jinja (their exported forms), give the ids their C renderers give:
 * text, BOS and special tokens alike, with and without tools, calls and their results. */
static void test_jinja_nerve_templates(void) {
    const char *z = t_data("models/tok512.bin");
    if (!z) return;
    nv_tokenizer *tok;
    if (nv_tokenizer_load(z, 512, &tok) != NV_OK) {
        T_CHECK(0, "%s", nv_errmsg());
        return;
    }
    const nv_chat_call calls[] = {{"get_weather", "{\"city\": \"Paris\", \"n\": 2.5}", "c1"}, {"get_time", "{}", "c2"}};
    const nv_chat_msg c0[] = {{"user", "Hello", NULL, 0, NULL, NULL, NULL, 0}};
    const nv_chat_msg c1[] = {{"system", "Be brief.", NULL, 0, NULL, NULL, NULL, 0}, {"user", "Hi there", NULL, 0, NULL, NULL, NULL, 0}};
    const nv_chat_msg c2[] = {{"user", "A", NULL, 0, NULL, NULL, NULL, 0}, {"assistant", "B", NULL, 0, NULL, NULL, NULL, 0}, {"user", "C", NULL, 0, NULL, NULL, NULL, 0}};
    const nv_chat_msg c3[] = {{"developer", "  Spaces  \n", NULL, 0, NULL, NULL, NULL, 0}, {"user", "\tTabbed\n", NULL, 0, NULL, NULL, NULL, 0}};
    const nv_chat_msg c4[] = {{"user", "Weather?", NULL, 0, NULL, NULL, NULL, 0},
                              {"assistant", "Checking.", calls, 2, NULL, NULL, NULL, 0},
                              {"tool", "sunny", NULL, 0, "c1", NULL, NULL, 0},
                              {"tool", "noon", NULL, 0, "c2", NULL, NULL, 0},
                              {"assistant", "Sunny at noon.", NULL, 0, NULL, NULL, NULL, 0},
                              {"user", "Thanks", NULL, 0, NULL, NULL, NULL, 0}};
    const nv_chat_msg c5[] = {{"user", "ends with an answer", NULL, 0, NULL, NULL, NULL, 0}, {"assistant", "the answer", NULL, 0, NULL, NULL, NULL, 0}};
    const struct {
        const nv_chat_msg *m;
        int n, tools;
    } convs[] = {{c0, 1, 0}, {c1, 2, 0}, {c2, 3, 0}, {c3, 2, 0}, {c4, 6, 1}, {c0, 1, 1}, {c1, 2, 1}, {c5, 2, 0}};
    int compared = 0;
    for (int t = NV_CHAT_PLAIN; t <= NV_CHAT_SMOLLM3; t++) {
        /* the tools' text as the server gives a template's renderer */
        char **tools = NULL;
        int n_tools = 0;
        nv_api_error err;
        cJSON *tj = cJSON_CreateArray();
        for (int k = 0; k < 2; k++) cJSON_AddItemToArray(tj, cJSON_Parse(TOOLS[k]));
        T_CHECK(nv_api_tool_texts(tj, nv_chat_tool_style((nv_chat_template)t), &tools, &n_tools, &err) == 0 && n_tools == 2, "%s", err.message);
        cJSON_Delete(tj);
        const char *text = nv_chat_template_jinja((nv_chat_template)t);
        nv_jinja *j;
        if (nv_jinja_parse(text, strlen(text), &j) != NV_OK) {
            T_CHECK(0, "%s: %s", nv_chat_template_name((nv_chat_template)t), nv_errmsg());
            continue;
        }
        for (size_t k = 0; k < sizeof convs / sizeof *convs; k++) {
            for (int think = 0; think < 2; think++) {
                nv_chat_opts o = {.no_think = think, .tools = convs[k].tools ? (const char *const *)tools : NULL, .n_tools = convs[k].tools ? 2 : 0};
                int *a = NULL, na = 0, *b = NULL, nb = 0;
                nv_buf ta = {0}, tb = {0};
                const nv_err ea = nv_chat_render_opts((nv_chat_template)t, tok, convs[k].m, convs[k].n, &o, &a, &na);
                const nv_err eta = nv_chat_render_text((nv_chat_template)t, tok, convs[k].m, convs[k].n, &o, &ta);
                o.jinja = j;
                const nv_err eb = nv_chat_render_opts((nv_chat_template)t, tok, convs[k].m, convs[k].n, &o, &b, &nb);
                const nv_err etb = nv_chat_render_text((nv_chat_template)t, tok, convs[k].m, convs[k].n, &o, &tb);
                T_CHECK(ea == NV_OK && eb == NV_OK && eta == NV_OK && etb == NV_OK && na == nb && !memcmp(a, b, (size_t)na * sizeof *a) &&
                            ta.data && tb.data && !strcmp(ta.data, tb.data),
                        "%s, conversation %zu%s: ids %d and %d\n  nerve: %s\n  jinja: %s", nv_chat_template_name((nv_chat_template)t), k,
                        think ? " (no think)" : "", na, nb, ta.data ? ta.data : nv_errmsg(), tb.data ? tb.data : nv_errmsg());
                compared++;
                free(a), free(b);
                nv_buf_free(&ta), nv_buf_free(&tb);
            }
        }
        /* an answer to continue (vLLM's continue_final_message): the text up to its end */
        if (t == NV_CHAT_CHATML || t == NV_CHAT_LLAMA3 || t == NV_CHAT_PLAIN) {
            nv_chat_opts o = {.continue_final = 1};
            nv_buf ta = {0}, tb = {0};
            nv_chat_render_text((nv_chat_template)t, tok, c5, 2, &o, &ta);
            o.jinja = j;
            T_CHECK(nv_chat_render_text((nv_chat_template)t, tok, c5, 2, &o, &tb) == NV_OK && ta.data && tb.data && !strcmp(ta.data, tb.data),
                    "%s continued:\n  nerve: %s\n  jinja: %s", nv_chat_template_name((nv_chat_template)t), ta.data ? ta.data : "",
                    tb.data ? tb.data : nv_errmsg());
            nv_buf_free(&ta), nv_buf_free(&tb);
        }
        /* a training turn: the same ids, the answer where nerve's renderer puts it */
        if (t == NV_CHAT_CHATML || t == NV_CHAT_LLAMA3 || t == NV_CHAT_GEMMA || t == NV_CHAT_PHI3) {
            nv_chat_opts o = {0};
            int *a = NULL, na = 0, pa = 0, *b = NULL, nb = 0, pb = 0;
            const nv_err ea = nv_chat_render_turn((nv_chat_template)t, tok, c4, 5, &o, &a, &na, &pa);
            o.jinja = j;
            const nv_err eb = nv_chat_render_turn((nv_chat_template)t, tok, c4, 5, &o, &b, &nb, &pb);
            T_CHECK(ea == NV_OK && eb == NV_OK && na == nb && pa == pb && !memcmp(a, b, (size_t)na * sizeof *a), "%s turn: %d/%d and %d/%d (%s)",
                    nv_chat_template_name((nv_chat_template)t), pa, na, pb, nb, nv_errmsg());
            free(a), free(b);
        }
        nv_jinja_free(j);
        nv_api_tool_texts_free(tools, n_tools);
    }
    T_CHECK(compared == 13 * 16, "%d renderings compared", compared);
    nv_tokenizer_free(tok);
}

/* What a template is given: the calls' arguments as objects (their text when not JSON), tools as
 * objects, the BOS and EOS text, a request's chat_template_kwargs; its raise_exception and its
 * errors are the caller's NV_EINVAL with the template's message. */
static void test_jinja_variables(void) {
    const char *z = t_data("models/tok512.bin");
    if (!z) return;
    nv_tokenizer *tok;
    if (nv_tokenizer_load(z, 512, &tok) != NV_OK) return;
    const char *t = "{{ bos_token }}|{{ eos_token }}|{% for m in messages %}{{ m.role }}:{{ m.content }}"
                    "{% for c in m.tool_calls or [] %}[{{ c.id }} {{ c.type }} {{ c.function.name }} {{ c.function.arguments is mapping }} "
                    "{{ c.function.arguments.city or c.function.arguments }}]{% endfor %}{% if m.tool_call_id %}({{ m.tool_call_id }}){% endif %}"
                    "{% if m.name is defined %}<{{ m.name }}>{% endif %}{% if m.reasoning_content is defined %}[{{ m.reasoning_content }}]{% endif %};"
                    "{% endfor %}|{{ tools | map(attribute='function.name') | join(',') if tools else 'no tools' }}|{{ flavour }}|"
                    "{{ enable_thinking is defined }}|{{ add_generation_prompt }}";
    nv_jinja *j;
    T_CHECK(nv_jinja_parse(t, strlen(t), &j) == NV_OK, "%s", nv_errmsg());
    const nv_chat_call calls[] = {{"get_weather", "{\"city\": \"Paris\"}", "c1"}, {"get_time", "not json", NULL}};
    const nv_chat_msg m[] = {{"developer", "d", NULL, 0, NULL, NULL, NULL, 0}, {"user", "u", NULL, 0, NULL, "ann", NULL, 0}, {"assistant", "", calls, 2, NULL, NULL, "hmm", 0},
                             {"function", "r", NULL, 0, "c1", NULL, NULL, 0}};
    cJSON *kw = cJSON_Parse("{\"flavour\": \"mint\", \"messages\": \"not these\"}");
    nv_chat_opts o = {.jinja = j, .tools = TOOLS, .n_tools = 2, .kwargs = kw, .no_think = 1};
    nv_buf b = {0};
    T_CHECK(nv_chat_render_text(NV_CHAT_PLAIN, tok, m, 4, &o, &b) == NV_OK && b.data &&
                !strcmp(b.data, "<s>|</s>|system:d;user:u<ann>;assistant:None[c1 function get_weather True Paris][ function get_time False not json][hmm];"
                                "tool:r(c1);|get_weather,get_time|mint|True|True"),
            "%s", b.data ? b.data : nv_errmsg());
    nv_buf_free(&b);
    /* add_generation_prompt false (a request's): the variable false; chatml's renderer without its header; llama3's refuses */
    o = (nv_chat_opts){.jinja = j, .no_gen_prompt = 1};
    T_CHECK(nv_chat_render_text(NV_CHAT_PLAIN, tok, m + 1, 1, &o, &b) == NV_OK && b.data && strstr(b.data, "|False") && !strstr(b.data, "|True"), "%s",
            b.data ? b.data : nv_errmsg());
    nv_buf_free(&b);
    o = (nv_chat_opts){.no_gen_prompt = 1};
    T_CHECK(nv_chat_render_text(NV_CHAT_CHATML, tok, m + 1, 1, &o, &b) == NV_OK && b.data && !strcmp(b.data, "<s><|im_start|>user\nu<|im_end|>\n"),
            "%s", b.data ? b.data : nv_errmsg());
    nv_buf_free(&b);
    T_CHECK(nv_chat_render_text(NV_CHAT_LLAMA3, tok, m + 1, 1, &o, &b) == NV_EINVAL && strstr(nv_errmsg(), "add_generation_prompt false"), "%s",
            nv_errmsg());
    nv_buf_free(&b);
    /* numbers written as floats stay floats, as json.loads keeps them (arguments and tools' schemas) */
    {
        nv_jinja *jf;
        const char *tf = "{% for c in messages[0].tool_calls %}{{ c.function.arguments | tojson }} {{ c.function.arguments.days }}{% endfor %}"
                         " {{ tools[0] | tojson }}";
        T_CHECK(nv_jinja_parse(tf, strlen(tf), &jf) == NV_OK, "%s", nv_errmsg());
        const nv_chat_call fc[] = {{"f", "{\"days\": 3.0, \"n\": 2, \"x\": [1e2, -0.5, \"7.0\"], \"s\": \"1.0 \\\" 2\"}", NULL}};
        const nv_chat_msg fm[] = {{"assistant", "", fc, 1, NULL, NULL, NULL, 0}};
        const char *tool[] = {"{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"minimum\": 0.0, \"maximum\": 10}}}"};
        o = (nv_chat_opts){.jinja = jf, .tools = tool, .n_tools = 1};
        T_CHECK(nv_chat_render_text(NV_CHAT_PLAIN, tok, fm, 1, &o, &b) == NV_OK && b.data &&
                    !strcmp(b.data, "{\"days\": 3.0, \"n\": 2, \"x\": [100.0, -0.5, \"7.0\"], \"s\": \"1.0 \\\" 2\"} 3.0 "
                                    "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"minimum\": 0.0, \"maximum\": 10}}}"),
                "%s", b.data ? b.data : nv_errmsg());
        nv_buf_free(&b);
        nv_jinja_free(jf);
    }
    /* the ids: the text's, BOS where the template wrote it and nowhere else */
    int *ids = NULL, n = 0;
    o = (nv_chat_opts){.jinja = j};
    T_CHECK(nv_chat_render_opts(NV_CHAT_PLAIN, tok, m + 1, 1, &o, &ids, &n) == NV_OK && n > 2 && ids[0] == nv_tokenizer_bos(tok) &&
                ids[1] != nv_tokenizer_bos(tok),
            "ids %d: %d %d", n, n ? ids[0] : -1, n > 1 ? ids[1] : -1);
    free(ids);
    nv_jinja_free(j);
    const char *r = "{% if messages[0].role != 'user' %}{{ raise_exception('the first message must be the user\\'s') }}{% endif %}x";
    T_CHECK(nv_jinja_parse(r, strlen(r), &j) == NV_OK, "%s", nv_errmsg());
    o = (nv_chat_opts){.jinja = j};
    T_CHECK(nv_chat_render_opts(NV_CHAT_PLAIN, tok, m, 2, &o, &ids, &n) == NV_EINVAL && strstr(nv_errmsg(), "the first message must be the user's"),
            "%s", nv_errmsg());
    T_CHECK(nv_chat_render_opts(NV_CHAT_PLAIN, tok, m + 1, 1, &o, &ids, &n) == NV_OK, "%s", nv_errmsg());
    free(ids);
    nv_jinja_free(j);
    int np = 0;
    /* continue_final_message, transformers' way: after the text without its white space where the template trims
       it; a template that does not show it refused; a training turn of empty messages through a template of
       nothing but them */
    const char *trim = "{% for m in messages %}<{{ m.content | trim }}>{% endfor %}", *roles = "{% for m in messages %}{{ m.role }}{% endfor %}";
    const nv_chat_msg begun[] = {{"user", "Give JSON", NULL, 0, NULL, NULL, NULL, 0}, {"assistant", " Sure:\n", NULL, 0, NULL, NULL, NULL, 0}};
    T_CHECK(nv_jinja_parse(trim, strlen(trim), &j) == NV_OK, "%s", nv_errmsg());
    o = (nv_chat_opts){.jinja = j, .continue_final = 1};
    T_CHECK(nv_chat_render_text(NV_CHAT_PLAIN, tok, begun, 2, &o, &b) == NV_OK && b.data && !strcmp(b.data, "<Give JSON><Sure:"), "%s",
            b.data ? b.data : nv_errmsg());
    nv_buf_free(&b);
    /* an answer the template ends with neither its stop nor EOS is trained with EOS after it */
    const int turn_ok = nv_chat_render_turn(NV_CHAT_PLAIN, tok, begun, 2, &(nv_chat_opts){.jinja = j}, &ids, &n, &np) == NV_OK;
    T_CHECK(turn_ok && n > np && ids[n - 1] == nv_tokenizer_eos(tok) && ids[n - 2] != nv_tokenizer_eos(tok), "the answer's end: %d of %d",
            turn_ok ? ids[n - 1] : -1, n);
    free(ids);
    const nv_chat_msg empty[] = {{"user", "", NULL, 0, NULL, NULL, NULL, 0}, {"assistant", "", NULL, 0, NULL, NULL, NULL, 0}};
    T_CHECK(nv_chat_render_turn(NV_CHAT_PLAIN, tok, empty, 2, &(nv_chat_opts){.jinja = j}, &ids, &n, &np) == NV_OK && np <= n, "%s", nv_errmsg());
    free(ids);
    nv_jinja_free(j);
    T_CHECK(nv_jinja_parse(roles, strlen(roles), &j) == NV_OK, "%s", nv_errmsg());
    o.jinja = j;
    T_CHECK(nv_chat_render_text(NV_CHAT_PLAIN, tok, begun, 2, &o, &b) == NV_EINVAL && strstr(nv_errmsg(), "does not show the final message"),
            "%s", nv_errmsg());
    nv_buf_free(&b);
    T_CHECK(nv_chat_render_turn(NV_CHAT_PLAIN, tok, empty, 2, &(nv_chat_opts){.jinja = j}, &ids, &n, &np) == NV_OK, "%s", nv_errmsg());
    free(ids);
    nv_jinja_free(j);
    cJSON_Delete(kw);
    nv_tokenizer_free(tok);
}

/* 1 when the server answers path (POST body, or GET without one) with status and a body holding want */
static int answers(int port, const char *path, const char *body, int status, const char *want) {
    resp r;
    memset(&r, 0, sizeof r);
    const int ok = http(port, body ? "POST" : "GET", path, NULL, body, &r) && r.status == status && r.body && strstr(r.body, want);
    if (!ok) fprintf(stderr, "    %s: %d %s\n", path, r.status, r.body ? r.body : "");
    resp_free(&r);
    return ok;
}

/* The server with a template it does not know (--chat-template-file): the prompt its Jinja renders
 * (a request's chat_template_kwargs among its variables), a raise_exception a 400 carrying its
 * message; --jinja runs a known one as Jinja, the same prompt as its renderer's. */
static void test_jinja_serve(void) {
    const char *m = t_data("models/stories260K.bin"), *z = t_data("models/tok512.bin");
    if (!m || !z) return;
    static const char tmpl[] =
        "{{- bos_token }}{%- for m in messages %}\n"
        "  {%- if m.role == 'system' %}{{ raise_exception('System messages are not supported.') }}{% endif %}\n"
        "  {{- '### ' + m.role | capitalize + ':\\n' + m.content | trim + '\\n' }}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}{{- '### Assistant:' + (' ' + greeting if greeting is defined else '') + '\\n' }}{% endif %}\n";
    const char *file = t_write("mine.jinja", tmpl, strlen(tmpl));
    char args[4400];
    snprintf(args, sizeof args, "--chat-template-file '%s' --kv-memory 16M --no-prefix-cache", file);
    server s;
    if (!server_spawn(&s, "jinja_serve", NULL, NULL, m, z, args, 30)) {
        T_CHECK(0, "the server did not start");
        return;
    }
    T_CHECK(answers(s.port, "/apply-template", "{\"messages\": [{\"role\": \"user\", \"content\": \" Once upon \"}]}", 200,
                    "\"prompt\":\"<s>### User:\\nOnce upon\\n### Assistant:\\n\""),
            "the prompt");
    T_CHECK(answers(s.port, "/apply-template",
                    "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"chat_template_kwargs\": {\"greeting\": \"Hello!\"}}", 200,
                    "### Assistant: Hello!\\n"),
            "kwargs");
    T_CHECK(answers(s.port, "/apply-template", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"name\": \"bob\"}], \"add_generation_prompt\": false}",
                    200, "\"prompt\":\"<s>### User:\\nx\\n\""),
            "add_generation_prompt false");
    /* an answer of calls: its content none where the request sent null (or none), "" where it sent "" */
    static const char with_calls[] =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", %s\"tool_calls\": [{\"id\": \"c1\", "
        "\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}]}], \"add_generation_prompt\": false}";
    char body[512];
    snprintf(body, sizeof body, with_calls, "\"content\": \"\", ");
    const int empty = answers(s.port, "/apply-template", body, 200, "### Assistant:\\n\\n\"");
    snprintf(body, sizeof body, with_calls, "\"content\": null, ");
    const int null = answers(s.port, "/apply-template", body, 200, "### Assistant:\\nNone\\n\"");
    snprintf(body, sizeof body, with_calls, "");
    T_CHECK(empty && null && answers(s.port, "/apply-template", body, 200, "### Assistant:\\nNone\\n\""), "a call's content: \"\" or none");
    T_CHECK(answers(s.port, "/apply-template", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"name\": 7}]}", 400, "'messages[0].name' must be a string") &&
                answers(s.port, "/v1/chat/completions", "{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\", \"reasoning_content\": [1]}]}", 400,
                        "'messages[0].reasoning_content' must be a string") &&
                answers(s.port, "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"add_generation_prompt\": 0}", 400,
                        "'add_generation_prompt' must be a boolean"),
            "the fields' types");
    const char *sys = "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 4}";
    T_CHECK(answers(s.port, "/v1/chat/completions", sys, 400, "\"message\":\"chat template: line 2: raise_exception: System messages are not supported.\"") &&
                answers(s.port, "/v1/chat/completions", sys, 400, "\"type\":\"invalid_request_error\",\"param\":\"messages\""),
            "raise");
    T_CHECK(answers(s.port, "/v1/chat/completions",
                    "{\"messages\": [{\"role\": \"user\", \"content\": \"Once upon a time\"}], \"max_tokens\": 4, \"temperature\": 0}", 200,
                    "\"completion_tokens\":4"),
            "an answer");
    T_CHECK(answers(s.port, "/props", NULL, 200, "\"chat_template\":\"jinja\""), "props");
    char *log = read_log(&s);
    T_CHECK(strstr(log, "run as Jinja") != NULL, "%s", log);
    free(log);
    T_CHECK(server_stop_within(&s, 30) == 0, "stop");
    /* --jinja: chatml's own Jinja form, run */
    if (!server_spawn(&s, "jinja_chatml", NULL, NULL, m, z, "--chat-template chatml --jinja --kv-memory 16M --no-prefix-cache", 30)) {
        T_CHECK(0, "the server did not start");
        return;
    }
    T_CHECK(answers(s.port, "/apply-template", "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}", 200,
                    "\"prompt\":\"<s><|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n\""),
            "--jinja");
    /* numbers written as floats stay floats through a request: a tool's schema, a call's arguments */
    T_CHECK(answers(s.port, "/apply-template",
                    "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": "
                    "[{\"id\": \"c\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 2.0}\"}}]}], \"tools\": "
                    "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": {\"x\": "
                    "{\"type\": \"number\", \"minimum\": 1.0, \"maximum\": 1e2, \"default\": 3}}}}}]}",
                    200, "\\\"minimum\\\": 1.0, \\\"maximum\\\": 100.0, \\\"default\\\": 3}") &&
                answers(s.port, "/apply-template",
                        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": "
                        "[{\"id\": \"c\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 2.0}\"}}]}]}",
                        200, "{\\\"x\\\": 2.0}"),
            "floats kept");
    T_CHECK(server_stop_within(&s, 30) == 0, "stop");
}

/* 1 when `nerve serve -m run` renders a user message of text as the prompt want (JSON-escaped) */
static int run_prompt(const char *name, const char *run, const char *text, const char *want) {
    server s;
    if (!server_spawn(&s, name, NULL, NULL, run, NULL, "--kv-memory 16M --no-prefix-cache", 30)) return 0;
    char body[512], prompt[512];
    snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}]}", text);
    snprintf(prompt, sizeof prompt, "\"prompt\":\"%s\"", want);
    const int ok = answers(s.port, "/apply-template", body, 200, prompt);
    return server_stop_within(&s, 30) == 0 && ok;
}

/* nerve train with a template of the user's (--chat-template-file): its data rendered by it, the run
 * folder keeping it (chat_template names "jinja", chat_template.jinja holds it), which serve runs, a
 * run that goes on from that folder trains with it too, and an export carries it. */
static void test_jinja_train(void) {
    const char *m = t_data("models/stories260K.bin"), *z = t_data("models/tok512.bin");
    if (!m || !z) return;
    static const char tmpl[] = "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}Q: {{ m.content }}\n"
                               "{% elif m.role == 'assistant' %}A: {{ m.content }}{{ eos_token }}\n{% endif %}{% endfor %}"
                               "{% if add_generation_prompt %}A:{% endif %}";
    const char *file = t_write("qa.jinja", tmpl, strlen(tmpl));
    char data[600], run[600], run2[600], args[8192], path[700];
    snprintf(data, sizeof data, "%s/qa.jsonl", t_tmpdir());
    FILE *f = fopen(data, "w");
    for (int i = 0; f && i < 24; i++)
        fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"Is %d odd?\"}, {\"role\": \"assistant\", \"content\": \"%s\"}]}\n", i,
                i % 2 ? "Yes." : "No.");
    if (f) fclose(f);
    snprintf(run, sizeof run, "%s/qa_run", t_tmpdir());
    snprintf(args, sizeof args, "train --init-from %s -z %s --data %s --chat-template-file %s --steps 2 --batch 2 --seq 64 --quiet --out %s", m,
             z, data, file, run);
    T_CHECK(t_nerve(args) == 0 && strstr(t_err, "rendered with the jinja template"), "train: %s", t_err);
    char *text = NULL;
    snprintf(path, sizeof path, "%s/chat_template", run);
    T_CHECK(nv_file_read_all(path, &text, NULL) == NV_OK && !strcmp(text, "jinja\n"), "chat_template: %s", text ? text : "(none)");
    free(text), text = NULL;
    snprintf(path, sizeof path, "%s/chat_template.jinja", run);
    T_CHECK(nv_file_read_all(path, &text, NULL) == NV_OK && !strcmp(text, tmpl), "chat_template.jinja: %s", text ? text : "(none)");
    free(text);
    T_CHECK(run_prompt("jinja_run", run, "Is 3 odd?", "<s>Q: Is 3 odd?\\nA:"), "the run's template");
    /* its answers' perplexity, rendered as it trained: the same held-out answers, the same tokens */
    snprintf(args, sizeof args, "perplexity -m %s -f %s --val-frac 0.25 --json", run, data);
    T_CHECK(t_nerve(args) == 0 && strstr(t_out, "\"answers\":6"), "perplexity: %s %s", t_out, t_err);
    /* fine-tuned again from the run folder: its template, run */
    snprintf(run2, sizeof run2, "%s/qa_run2", t_tmpdir());
    snprintf(args, sizeof args, "train --init-from %s --data %s --steps 2 --batch 2 --seq 64 --quiet --out %s", run, data, run2);
    T_CHECK(t_nerve(args) == 0 && strstr(t_err, "rendered with the jinja template (the starting model's)"), "train again: %s", t_err);
    text = NULL;
    snprintf(path, sizeof path, "%s/chat_template.jinja", run2);
    /* (marked, as it left its first run's folder: NV_CHAT_RUN_AS_JINJA) */
    T_CHECK(nv_file_read_all(path, &text, NULL) == NV_OK && !strncmp(text, NV_CHAT_RUN_AS_JINJA, strlen(NV_CHAT_RUN_AS_JINJA)) &&
                !strcmp(text + strlen(NV_CHAT_RUN_AS_JINJA), tmpl),
            "again: %s", text ? text : "(none)");
    free(text);
    /* exported: GGUF's tokenizer.chat_template is the template, marked to be run as Jinja */
    snprintf(path, sizeof path, "%s/qa.gguf", t_tmpdir());
    snprintf(args, sizeof args, "export %s -o %s", run, path);
    T_CHECK(t_nerve(args) == 0, "export: %s", t_err);
    nv_gguf g;
    size_t n = 0;
    if (nv_gguf_open(path, &g) == NV_OK) {
        const char *t = nv_gguf_string(&g, "tokenizer.chat_template", &n);
        const size_t k = strlen(NV_CHAT_RUN_AS_JINJA);
        T_CHECK(t && n == k + strlen(tmpl) && !memcmp(t, NV_CHAT_RUN_AS_JINJA, k) && !memcmp(t + k, tmpl, n - k), "the GGUF file's template: %.*s",
                t ? (int)n : 6, t ? t : "(none)");
        nv_gguf_close(&g);
    } else
        T_CHECK(0, "%s", nv_errmsg());
    /* --jinja: a template whose markers say ChatML, run as it is written, in training and then in serving */
    static const char marked[] = "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role | upper }}: {{ m.content }}\n{% endfor %}"
                                 "{% if add_generation_prompt %}<|im_start|>ASSISTANT:{% endif %}";
    const char *marked_file = t_write("marked.jinja", marked, strlen(marked));
    snprintf(run2, sizeof run2, "%s/qa_run3", t_tmpdir());
    snprintf(args, sizeof args, "train --init-from %s -z %s --data %s --chat-template-file %s --jinja --steps 1 --batch 2 --seq 64 --quiet --out %s",
             m, z, data, marked_file, run2);
    T_CHECK(t_nerve(args) == 0 && strstr(t_err, "rendered with the jinja template"), "train --jinja: %s", t_err);
    T_CHECK(run_prompt("jinja_run3", run2, "Hi", "<s><|im_start|>USER: Hi\\n<|im_start|>ASSISTANT:"),
            "the run's template, run though its markers say ChatML");
    /* exported, it is still run as it was written: the mark in its text tells serve so */
    char gguf3[700];
    snprintf(gguf3, sizeof gguf3, "%s/qa3.gguf", t_tmpdir());
    snprintf(args, sizeof args, "export %s -z %s -o %s", run2, z, gguf3);
    T_CHECK(t_nerve(args) == 0, "export: %s", t_err);
    T_CHECK(run_prompt("jinja_gguf3", gguf3, "Hi", "<s><|im_start|>USER: Hi\\n<|im_start|>ASSISTANT:"), "the exported file's template, run");
    /* resumed with another Jinja template: refused, naming the one it trained with */
    snprintf(args, sizeof args, "train --init-from %s -z %s --data %s --chat-template-file %s --jinja --steps 3 --batch 2 --seq 64 --quiet --out %s --resume",
             m, z, data, file, run2);
    T_CHECK(t_nerve(args) == 1 && strstr(t_err, "trained with another chat template, run as Jinja"), "resume: %s", t_err);
    /* a run folder whose chat_template names jinja without its chat_template.jinja: refused in one line */
    snprintf(path, sizeof path, "%s/chat_template.jinja", run2);
    unlink(path);
    snprintf(args, sizeof args, "chat -m %s -p Hi -n 2", run2);
    T_CHECK(t_nerve(args) == 1 && strstr(t_err, "chat_template names jinja, but") && strstr(t_err, "cannot be read"), "%s", t_err);
    /* a template whose generation prompt is not how its answers begin cannot be trained on as served: the line named */
    static const char apart[] = "{% for m in messages %}{{ 'Answer: ' if m.role == 'assistant' else 'Q: ' }}{{ m.content }}\n{% endfor %}"
                                "{% if add_generation_prompt %}A:{% endif %}";
    const char *apart_file = t_write("apart.jinja", apart, strlen(apart));
    snprintf(args, sizeof args, "train --init-from %s -z %s --data %s --chat-template-file %s --steps 1 --batch 2 --seq 64 --quiet --out %s/qa_apart",
             m, z, data, apart_file, t_tmpdir());
    T_CHECK(t_nerve(args) == 1 && strstr(t_err, "qa.jsonl:1: the chat template's generation prompt"), "%s", t_err);
    /* without chat data, refused */
    snprintf(args, sizeof args, "train --init-from %s -z %s --data %s --chat-template-file %s --steps 1", m, z, t_data("corpus/tinystories_valid_head.txt"), file);
    T_CHECK(t_nerve(args) == 2 && strstr(t_err, "--chat-template-file goes with chat data"), "%s", t_err);
}

int main(void) {
    T_RUN(test_jinja_cases);
    T_RUN(test_jinja_cases_are_jinja2s);
    T_RUN(test_jinja_corners);
    T_RUN(test_jinja_nerve_templates);
    T_RUN(test_jinja_variables);
    T_RUN(test_jinja_serve);
    T_RUN(test_jinja_train);
    return t_done();
}
