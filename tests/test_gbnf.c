/* Grammars written as text: GBNF (llama.cpp's format), whole-text regular expressions and choices
 * (vLLM's guided_regex and guided_choice), the code-point sets under them, and the server fields
 * and generate flags that take them. */
#include <cjson/cJSON.h>
#include <regex.h>

#include "base/utf8.h"
#include "serve/gbnf.h"
#include "serve/schema.h"
#include "serve_util.h"
#include "t.h"

/* 1 when the grammar takes all of s (a fresh matcher), 0 when it refuses a byte of it, 2 when it
 * takes every byte but s is not a whole sentence. */
static int takes(nv_grammar *g, const char *s, size_t n) {
    nv_gmatch *m = nv_gmatch_new(g);
    int r = nv_gmatch_feed(m, s, n) == 1 ? (nv_gmatch_done(m) ? 1 : 2) : 0;
    nv_gmatch_free(m);
    return r;
}
#define TAKES(g, s) takes(g, s, strlen(s))

/* A code-point set as a grammar of one character: every code point (a stride through the whole
 * range, and each range's edges) is taken exactly when it is in the set; byte sequences that are
 * not UTF-8 never are. */
static void test_codepoint_sets(void) {
    static const uint32_t ranges[][2] = {{'a', 'z'}, {0x3B1, 0x3C9}, {0x7FF, 0x801}, {0xD700, 0xE100}, {0xFFFD, 0x10002}, {0x10FFF0, 0x10FFFF}};
    const int n = (int)(sizeof ranges / sizeof ranges[0]);
    for (int negate = 0; negate < 2; negate++) {
        nv_gbuild *b = nv_gbuild_new();
        int r = nv_gbuild_codepoints(b, ranges, n, negate);
        nv_grammar *g = NULL;
        T_CHECK(nv_gbuild_finish(b, r, &g) == NV_OK, "%s", nv_errmsg());
        if (!g) return;
        int bad = 0, checked = 0, edges = 0;
        uint32_t probes[256];
        int np = 0;
        for (int i = 0; i < n; i++) /* each range's edges and their neighbours, then every 97th code point */
            for (int d = -1; d <= 1; d++) probes[np++] = ranges[i][0] + (uint32_t)d, probes[np++] = ranges[i][1] + (uint32_t)d;
        const int range_edges = np;
        static const uint32_t lengths[] = {0x7F, 0x80, 0x7FF, 0x800, 0xD7FF, 0xE000, 0xFFFF, 0x10000, 0x10FFFF}; /* UTF-8's own edges */
        for (size_t i = 0; i < sizeof lengths / sizeof *lengths; i++) probes[np++] = lengths[i];
        for (int k = 0; k < np + 0x10FFFF / 97 + 1; k++) {
            const uint32_t c = k < np ? probes[k] : (uint32_t)(k - np) * 97;
            edges += k < np;
            if (c > 0x10FFFF) continue;
            char buf[4];
            size_t len = nv_utf8_put(c, buf);
            int in = 0;
            for (int i = 0; i < n; i++) in |= c >= ranges[i][0] && c <= ranges[i][1];
            if (negate) in = !in;
            if (c >= 0xD800 && c <= 0xDFFF) in = 0; /* surrogates are never characters */
            checked++;
            if ((takes(g, buf, len) == 1) != in && bad++ < 5)
                T_CHECK(0, "%s set: U+%04X taken %d, in the set %d", negate ? "negated" : "plain", c, takes(g, buf, len), in);
        }
        T_CHECK(checked > 11000 && range_edges == 6 * n && edges == np, "only %d code points checked (%d edges)", checked, edges);
        static const char *const not_utf8[] = {"\xC0\x80", "\xC1\xBF", "\xE0\x80\x80", "\xED\xA0\x80", "\xF0\x80\x80\x80", "\xF4\x90\x80\x80", "\x80", "\xFF"};
        for (size_t i = 0; i < sizeof not_utf8 / sizeof *not_utf8; i++)
            T_CHECK(takes(g, not_utf8[i], strlen(not_utf8[i])) != 1, "not UTF-8 taken: case %zu", i);
        nv_grammar_unref(g);
    }
}

static nv_grammar *gbnf(const char *text) {
    nv_grammar *g = NULL;
    nv_err e = nv_gbnf_grammar(text, 0, &g);
    T_CHECK(e == NV_OK, "%s\n%s", nv_errmsg(), text);
    return g;
}

static void test_gbnf_grammars(void) {
    /* an expression grammar as llama.cpp's examples write them: rules over lines, comments, groups */
    nv_grammar *g = gbnf("# arithmetic\n"
                         "root  ::= expr\n"
                         "expr  ::= term (([-+*/]) term)*   # operators between terms\n"
                         "term  ::= num | \"(\" ws expr ws \")\"\n"
                         "num   ::= [0-9]+\n"
                         "ws    ::= [ \\t]*\n");
    if (g) {
        T_CHECK(TAKES(g, "1+23*( 4-5 )") == 1 && TAKES(g, "12") == 1, "expressions");
        T_CHECK(TAKES(g, "1+") == 2 && TAKES(g, "(1") == 2, "unfinished ones are not whole");
        T_CHECK(TAKES(g, "+1") == 0 && TAKES(g, "1a") == 0 && TAKES(g, "") == 2, "refusals");
        nv_grammar_unref(g);
    }
    /* alternatives continued after '|' and inside parentheses over lines; counts; escapes; '.' */
    g = gbnf("root ::= greeting \" \" name \"!\"? tail\n"
             "greeting ::= \"hi\" |\n"
             "   \"hello\" | \"\\x48\\u00e9\"\n"
             "name ::= (\n"
             "  [A-Z] [a-z]{1,3}\n"
             ")\n"
             "tail ::= (\"\\n\" .){0,2}\n");
    if (g) {
        T_CHECK(TAKES(g, "hi Bob") == 1 && TAKES(g, "hello Anna!") == 1 && TAKES(g, "H\xC3\xA9 Al") == 1, "alternatives, escapes");
        T_CHECK(TAKES(g, "hi Bobby") == 0 && TAKES(g, "hi B") == 2 && TAKES(g, "hi bob") == 0, "{1,3}");
        T_CHECK(TAKES(g, "hi Bo\n\xE2\x82\xAC\n\n") == 1 && TAKES(g, "hi Bo\nx\ny\nz") == 0, "'.' is any character, {0,2}");
        nv_grammar_unref(g);
    }
    g = gbnf("root ::= [^\"\\\\\\n]* \"\\\"\"\r\n"); /* CRLF lines; a negated class with escapes */
    if (g) {
        T_CHECK(TAKES(g, "caf\xC3\xA9 \"") == 1 && TAKES(g, "a\\b\"") == 0 && TAKES(g, "a\nb\"") == 0, "negated class");
        nv_grammar_unref(g);
    }
    /* errors: one line, where, and what */
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"root ::= foo\n", "line 1, column 10: rule 'foo' is used but not defined"},
        {"root = \"a\"\n", "line 1, column 6: expected '::='"},
        {"root ::= \"a\n", "line 1, column 10: a '\"' without its closing"},
        {"root ::= [a-\n", "a '[' without its ']'"},
        {"root ::= (\"a\"\n", "a '(' without its ')'"},
        {"root ::= \"a\"\nroot ::= \"b\"\n", "line 2, column 1: rule 'root' is defined twice"},
        {"start ::= \"a\"\n", "no rule named 'root'"},
        {"root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"\n", "rule 'expr' reaches itself before reading anything"},
        {"root ::= (\"a\"?)*\n", "left-recursive"},
        {"root ::= \"a\" \n | \"b\"\n", "line 2, column 2: expected a rule name"},
        {"root ::= \"\\q\"\n", "an unknown escape"},
        {"root ::= [z-a]\n", "runs backwards"},
        {"root ::= \"a\"{2000}\n", "a repetition count from 0 to 1000"},
        {"root ::= \"a\"{3,1}\n", "m below n"},
        {"root ::= \"\\uD800\"\n", "surrogate"},
        {"root ::= \"\xC3\"\n", "not UTF-8"},
        {"root ::= )\n", "a ')' without its '('"},
        {"root ::= \"a\" ]\n", "expected an element"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        nv_grammar *x = NULL;
        nv_err e = nv_gbnf_grammar(bad[i].text, 0, &x);
        T_CHECK(e == NV_EINVAL && !x && strstr(nv_errmsg(), bad[i].want) && !strchr(nv_errmsg(), '\n'), "case %zu: %s (wanted '%s')", i,
                nv_errmsg(), bad[i].want);
        nv_grammar_unref(x);
    }
    /* bounded before it is built: the text, the names, the elements a repetition makes */
    nv_buf big = {0};
    nv_buf_puts(&big, "root ::= r0\n");
    for (int i = 0; i < 4100; i++) nv_buf_printf(&big, "r%d ::= r%d\n", i, i + 1);
    nv_grammar *x = NULL;
    T_CHECK(nv_gbnf_grammar(big.data, 0, &x) == NV_EINVAL && strstr(nv_errmsg(), "more than 4096 rule names"), "names: %s", nv_errmsg());
    nv_buf_free(&big);
    nv_buf_puts(&big, "root ::=");
    for (int i = 0; i < 400; i++) nv_buf_puts(&big, " \"a\"{0,1000}");
    T_CHECK(nv_gbnf_grammar(big.data, 0, &x) == NV_EINVAL && strstr(nv_errmsg(), "grows past"), "elements: %s", nv_errmsg());
    nv_buf_free(&big);
    nv_buf_puts(&big, "root ::= \"a\"");
    for (int i = 0; i < 70000; i++) nv_buf_puts(&big, " ");
    T_CHECK(nv_gbnf_grammar(big.data, 0, &x) == NV_EINVAL && strstr(nv_errmsg(), "longer than 65536 bytes"), "text: %s", nv_errmsg());
    nv_buf_free(&big);
    /* a reasoning model's think block may come first */
    nv_grammar *t = NULL;
    T_CHECK(nv_gbnf_grammar("root ::= \"yes\" | \"no\"\n", 1, &t) == NV_OK, "%s", nv_errmsg());
    if (t) {
        T_CHECK(TAKES(t, "<think>hmm</think>\nyes") == 1 && TAKES(t, "no") == 1 && TAKES(t, "<think>a</think>maybe") == 0, "think");
        nv_grammar_unref(t);
    }
}

/* Whole-text regular expressions, against POSIX regexec on the same strings (anchored), and choices. */
static void test_regex_and_choice(void) {
    static const struct {
        const char *ecma, *posix;
    } pats[] = {
        {"[0-9]{3}-[0-9]{4}", "^[0-9]{3}-[0-9]{4}$"},
        {"(ab|a)(c|bcd)?d*", "^(ab|a)(c|bcd)?d*$"},
        {"^x[^a-c]+y$", "^x[^a-c]+y$"},
        {"(?:a\\.b)+|\\d\\s?", "^((a\\.b)+|[0-9][[:space:]]?)$"},
    };
    const char alphabet[] = "abcdxy019-. ";
    unsigned seed = 12345;
    for (size_t i = 0; i < sizeof pats / sizeof *pats; i++) {
        nv_grammar *g = NULL;
        regex_t re;
        T_CHECK(nv_regex_grammar(pats[i].ecma, 0, &g) == NV_OK, "%s: %s", pats[i].ecma, nv_errmsg());
        T_CHECK(regcomp(&re, pats[i].posix, REG_EXTENDED | REG_NOSUB) == 0, "regcomp %s", pats[i].posix);
        if (!g) continue;
        int matched = 0, differ = 0;
        for (int k = 0; k < (t_sanitized() ? 2000 : 20000); k++) { /* the sanitizer's pass: the same paths, fewer strings */
            char s[12];
            int len = (int)((seed = seed * 1103515245u + 12345u) >> 16) % 10;
            for (int j = 0; j < len; j++) s[j] = alphabet[((seed = seed * 1103515245u + 12345u) >> 16) % (sizeof alphabet - 1)];
            s[len] = '\0';
            const int want = regexec(&re, s, 0, NULL, 0) == 0, got = TAKES(g, s) == 1;
            matched += want;
            if (want != got && differ++ < 3) T_CHECK(0, "%s on '%s': grammar %d, regexec %d", pats[i].ecma, s, got, want);
        }
        /* strings the random ones rarely hit */
        const char *const extra[] = {"555-1234", "abcd", "abd", "xdy", "a.ba.b", "7 ", "7"};
        for (size_t j = 0; j < sizeof extra / sizeof *extra; j++)
            T_CHECK((regexec(&re, extra[j], 0, NULL, 0) == 0) == (TAKES(g, extra[j]) == 1), "%s on '%s'", pats[i].ecma, extra[j]);
        regfree(&re);
        nv_grammar_unref(g);
        (void)matched;
    }
    /* raw text: quotes and backslashes are themselves, not JSON escapes */
    nv_grammar *g = NULL;
    T_CHECK(nv_regex_grammar("say \"hi\\\\\"", 0, &g) == NV_OK, "%s", nv_errmsg());
    if (g) T_CHECK(TAKES(g, "say \"hi\\\"") == 1 && TAKES(g, "xsay \"hi\\\"") == 0, "raw characters");
    nv_grammar_unref(g);
    T_CHECK(nv_regex_grammar("(a", 0, &g) != NV_OK && strstr(nv_errmsg(), "regex:"), "a bad regex: %s", nv_errmsg());
    T_CHECK(nv_regex_grammar("a\\1", 0, &g) == NV_EUNSUPPORTED, "back references: %s", nv_errmsg());
    const char *const colors[] = {"red", "green", "greenish"};
    T_CHECK(nv_choice_grammar(colors, 3, 0, &g) == NV_OK, "%s", nv_errmsg());
    if (g) T_CHECK(TAKES(g, "red") == 1 && TAKES(g, "green") == 1 && TAKES(g, "greenish") == 1 && TAKES(g, "gre") == 2 && TAKES(g, "blue") == 0,
                   "choices");
    nv_grammar_unref(g);
}

static server srv;

static char *content_of(const resp *r, int chat) {
    cJSON *j = cJSON_Parse(r->body);
    const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    const char *s = chat ? cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "message"), "content"))
                         : cJSON_GetStringValue(cJSON_GetObjectItem(c0, "text"));
    char *out = strdup(s ? s : "(none)");
    cJSON_Delete(j);
    return out;
}

/* The server's fields: llama.cpp's grammar, vLLM's guided_grammar, guided_regex, guided_choice and
 * structured_outputs, sampled (seeded, so the model's own preferences are overruled), and their errors. */
static void test_server_fields(void) {
    const char *tok = t_data("models/tok512.bin"), *model = t_data("models/stories260K.bin");
    if (!tok || !model) return;
    if (!server_spawn(&srv, "gbnf", NULL, NULL, model, tok, "--kv-memory 64M --chat-template chatml", 30)) {
        T_CHECK(0, "the server did not start");
        return;
    }
    regex_t phone;
    regcomp(&phone, "^[0-9]{3}-[0-9]{4}$", REG_EXTENDED | REG_NOSUB);
    for (int seed = 1; seed <= 3; seed++) {
        resp r;
        char body[1024], *c;
        snprintf(body, sizeof body,
                 "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"seed\":%d,\"grammar\":\"root ::= (\\\"yes\\\" | \\\"no\\\") \\\".\\\"\"}", seed);
        T_CHECK(http(srv.port, "POST", "/v1/completions", NULL, body, &r) && r.status == 200, "grammar: %d %s", r.status, r.body);
        c = content_of(&r, 0);
        T_CHECK((!strcmp(c, "yes.") || !strcmp(c, "no.")) && strstr(r.body, "\"finish_reason\":\"stop\""), "grammar gave '%s': %s", c, r.body);
        free(c), resp_free(&r);
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Pick\"}],\"max_tokens\":40,\"seed\":%d,\"guided_choice\":[\"red\",\"green\",\"blue\"]}", seed);
        T_CHECK(http(srv.port, "POST", "/v1/chat/completions", NULL, body, &r) && r.status == 200, "choice: %d %s", r.status, r.body);
        c = content_of(&r, 1);
        T_CHECK(!strcmp(c, "red") || !strcmp(c, "green") || !strcmp(c, "blue"), "guided_choice gave '%s'", c);
        free(c), resp_free(&r);
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Call me\"}],\"max_tokens\":40,\"seed\":%d,\"guided_regex\":\"[0-9]{3}-[0-9]{4}\"}", seed);
        T_CHECK(http(srv.port, "POST", "/v1/chat/completions", NULL, body, &r) && r.status == 200, "regex: %d %s", r.status, r.body);
        c = content_of(&r, 1);
        T_CHECK(regexec(&phone, c, 0, NULL, 0) == 0, "guided_regex gave '%s'", c);
        free(c), resp_free(&r);
        snprintf(body, sizeof body,
                 /* bounded, so that the grammar closes it within 40 tokens whatever a sampler picks */
                 "{\"prompt\":\"x\",\"max_tokens\":40,\"seed\":%d,\"structured_outputs\":{\"regex\":\"(ab){1,6}c\"}}", seed);
        T_CHECK(http(srv.port, "POST", "/v1/completions", NULL, body, &r) && r.status == 200, "structured_outputs: %d %s", r.status, r.body);
        c = content_of(&r, 0);
        regex_t abc;
        regcomp(&abc, "^(ab){1,6}c$", REG_EXTENDED | REG_NOSUB);
        T_CHECK(regexec(&abc, c, 0, NULL, 0) == 0, "structured_outputs.regex gave '%s'", c);
        regfree(&abc);
        free(c), resp_free(&r);
    }
    regfree(&phone);
    resp r;
    T_CHECK(http(srv.port, "POST", "/v1/chat/completions", NULL,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":60,\"structured_outputs\":{\"json\":{\"type\":\"object\","
                 "\"properties\":{\"n\":{\"type\":\"integer\"}},\"required\":[\"n\"]}}}",
                 &r) && r.status == 200,
            "structured_outputs.json: %d %s", r.status, r.body);
    char *c = content_of(&r, 1);
    cJSON *j = cJSON_Parse(c);
    T_CHECK(cJSON_IsNumber(cJSON_GetObjectItem(j, "n")), "structured_outputs.json gave '%s'", c);
    cJSON_Delete(j), free(c), resp_free(&r);
    T_CHECK(http(srv.port, "POST", "/v1/completions", NULL,
                 "{\"prompt\":\"x\",\"max_tokens\":20,\"guided_grammar\":\"root ::= [a-c]{2} \\\"!\\\"\"}", &r) && r.status == 200,
            "guided_grammar: %d %s", r.status, r.body);
    c = content_of(&r, 0);
    T_CHECK(strlen(c) == 3 && c[0] >= 'a' && c[0] <= 'c' && c[1] >= 'a' && c[1] <= 'c' && c[2] == '!', "guided_grammar gave '%s'", c);
    free(c), resp_free(&r);
    static const struct {
        const char *body, *param, *text;
    } bad[] = {
        {"{\"prompt\":\"x\",\"grammar\":\"root ::= foo\"}", "grammar", "line 1, column 10"},
        {"{\"prompt\":\"x\",\"grammar\":5}", "grammar", "must be a string"},
        {"{\"prompt\":\"x\",\"guided_regex\":\"(a\"}", "guided_regex", "regex"},
        {"{\"prompt\":\"x\",\"guided_choice\":[]}", "guided_choice", "non-empty list of strings"},
        {"{\"prompt\":\"x\",\"guided_choice\":[\"a\",1]}", "guided_choice", "non-empty list of strings"},
        {"{\"prompt\":\"x\",\"guided_choice\":[\"a\"],\"guided_regex\":\"a\"}", "guided_regex", "give one of"},
        {"{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_object\"},\"grammar\":\"root ::= \\\"a\\\"\"}", "response_format", "give one of"},
        {"{\"prompt\":\"x\",\"structured_outputs\":{}}", "structured_outputs", "one of json"},
        {"{\"prompt\":\"x\",\"structured_outputs\":{\"regex\":\"a\",\"choice\":[\"a\"]}}", "structured_outputs", "one of json"},
        {"{\"prompt\":\"x\",\"structured_outputs\":{\"structural_tag\":{}}}", "structured_outputs.structural_tag", "not supported"},
        {"{\"prompt\":\"x\",\"structured_outputs\":{\"json\":\"{\"}}", "structured_outputs.json", "not valid JSON"},
        {"{\"prompt\":\"x\",\"guided_choice\":[\"a\"],\"ignore_eos\":true}", "ignore_eos", "structured outputs"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char want[96];
        snprintf(want, sizeof want, "\"param\":\"%s\"", bad[i].param);
        T_CHECK(http(srv.port, "POST", "/v1/completions", NULL, bad[i].body, &r) && r.status == 400 && strstr(r.body, want) &&
                    strstr(r.body, bad[i].text),
                "case %zu: %d %s", i, r.status, r.body);
        resp_free(&r);
    }
    /* response_format text beside a grammar is no second constraint */
    T_CHECK(http(srv.port, "POST", "/v1/completions", NULL,
                 "{\"prompt\":\"x\",\"max_tokens\":5,\"response_format\":{\"type\":\"text\"},\"guided_choice\":[\"ok\"]}", &r) && r.status == 200 &&
                strstr(r.body, "\"text\":\"ok\""),
            "text format and a choice: %d %s", r.status, r.body);
    resp_free(&r);
    int rc = server_stop_within(&srv, 20);
    T_CHECK(rc == 0, "server exit %d", rc);
}

static void test_generate_grammar(void) {
    const char *mp = t_data("models/stories260K.bin"), *zp = t_data("models/tok512.bin");
    if (!mp || !zp) return;
    char model[600], tokp[600], args[2048];
    snprintf(model, sizeof model, "%s", mp);
    snprintf(tokp, sizeof tokp, "%s", zp);
    snprintf(args, sizeof args, "generate -m %s -z %s -p 'Once upon a time' -n 100 -s 3 --grammar 'root ::= \" \" [a-z]+ \" \" [0-9]{2} \".\"'", model, tokp);
    int rc = t_nerve(args);
    regex_t re;
    regcomp(&re, "^Once upon a time [a-z]+ [0-9]{2}\\.$", REG_EXTENDED | REG_NOSUB);
    T_CHECK(rc == 0 && regexec(&re, t_out, 0, NULL, 0) == 0, "exit %d, stdout '%s': %s", rc, t_out, t_err);
    regfree(&re);
    const char *gf = t_write("g.gbnf", "root ::= \" \" (\"yes\" | \"no\")\n", 29);
    snprintf(args, sizeof args, "generate -m %s -z %s -p 'Once upon a time' -n 100 -s 4 --grammar-file %s", model, tokp, gf);
    rc = t_nerve(args);
    T_CHECK(rc == 0 && (!strcmp(t_out, "Once upon a time yes") || !strcmp(t_out, "Once upon a time no")), "file: exit %d '%s': %s", rc, t_out, t_err);
    snprintf(args, sizeof args, "generate -m %s -z %s --grammar 'root ::= x'", model, tokp);
    rc = t_nerve(args);
    const char *nl = strchr(t_err, '\n');
    T_CHECK(rc == 1 && strstr(t_err, "--grammar: line 1, column 10: rule 'x' is used but not defined") && nl && !strchr(nl + 1, '\n'),
            "bad grammar: exit %d %s", rc, t_err);
    snprintf(args, sizeof args, "generate -m %s -z %s --grammar-file %s/none.gbnf", model, tokp, t_tmpdir());
    rc = t_nerve(args);
    T_CHECK(rc == 1 && strstr(t_err, "none.gbnf"), "missing file: exit %d %s", rc, t_err);
    snprintf(args, sizeof args, "generate -m %s -z %s --json --grammar 'root ::= \"a\"'", model, tokp);
    T_CHECK(t_nerve(args) == 2 && strstr(t_err, "give one of"), "two constraints: %s", t_err);
}

int main(void) {
    T_RUN(test_codepoint_sets);
    T_RUN(test_gbnf_grammars);
    T_RUN(test_regex_and_choice);
    T_RUN(test_server_fields);
    T_RUN(test_generate_grammar);
    return t_done();
}
