/* Constrained decoding: the byte grammar matcher, JSON schemas compiled into grammars (each
 * checked on texts it must accept and texts it must refuse), and the token mask against a
 * token-by-token check on real vocabularies. */
#include <cjson/cJSON.h>
#include <time.h>

#include "base/timer.h"
#include "model/grammar.h"
#include "model/tokenizer.h"
#include "serve/schema.h"
#include "t.h"

/* 1 when text is a whole sentence of g, fed in one piece and byte by byte (the two must agree). */
static int accepts(nv_grammar *g, const char *text) {
    nv_gmatch *whole = nv_gmatch_new(g), *bytes = nv_gmatch_new(g);
    int a = nv_gmatch_feed(whole, text, strlen(text)) == 1 && nv_gmatch_done(whole);
    int b = 1;
    for (const char *p = text; *p && b; p++) b = nv_gmatch_feed(bytes, p, 1) == 1;
    b = b && nv_gmatch_done(bytes);
    nv_gmatch_free(whole);
    nv_gmatch_free(bytes);
    T_CHECK(a == b, "whole (%d) and byte-by-byte (%d) feeding disagree on '%s'", a, b, text);
    return a;
}

static nv_grammar *schema_grammar(const char *json) {
    cJSON *s = cJSON_Parse(json);
    nv_grammar *g = NULL;
    nv_err e = nv_schema_grammar(s, &g);
    T_CHECK(e == NV_OK, "schema %s: %s", json, nv_errmsg());
    cJSON_Delete(s);
    return g;
}

static void test_builder_and_matcher(void) {
    /* S ::= "a" S "b" | "" : a^n b^n, recursion that is not left recursion */
    nv_gbuild *b = nv_gbuild_new();
    nv_gbody body = {0};
    int s = nv_gbuild_reserve(b);
    nv_gbody_lit(b, &body, "a", 1);
    nv_gbody_ref(&body, s);
    nv_gbody_lit(b, &body, "b", 1);
    nv_gbody_alt(&body);
    nv_gbuild_define(b, s, &body);
    nv_grammar *g = NULL;
    T_CHECK(nv_gbuild_finish(b, s, &g) == NV_OK, "%s", nv_errmsg());
    if (!g) return;
    T_CHECK(accepts(g, ""), "empty");
    T_CHECK(accepts(g, "ab") && accepts(g, "aaabbb"), "a^n b^n");
    T_CHECK(!accepts(g, "aab") && !accepts(g, "abb") && !accepts(g, "ba"), "unbalanced");
    nv_gmatch *m = nv_gmatch_new(g);
    T_CHECK(nv_gmatch_done(m) && !nv_gmatch_finished(m), "the empty sentence is whole, but more may follow");
    T_CHECK(nv_gmatch_feed(m, "aa", 2) == 1 && !nv_gmatch_done(m), "prefix");
    T_CHECK(nv_gmatch_feed(m, "bbb", 3) == 0, "a refused feed");
    T_CHECK(nv_gmatch_try(m, "bb", 2) && nv_gmatch_feed(m, "bb", 2) == 1, "the state did not move on the refused feed");
    T_CHECK(nv_gmatch_finished(m), "a^2 b^2 ends it");
    T_CHECK(nv_gmatch_feed(m, "b", 1) == 0 && nv_gmatch_feed(m, "a", 1) == 0, "nothing after the end");
    /* a long sentence keeps the frames compacted: the matcher stays usable */
    nv_gmatch_free(m);
    m = nv_gmatch_new(g);
    for (int i = 0; i < 20000; i++) T_CHECK(nv_gmatch_feed(m, "a", 1) == 1, "a %d", i);
    for (int i = 0; i < 20000; i++) T_CHECK(nv_gmatch_feed(m, "b", 1) == 1, "b %d", i);
    T_CHECK(nv_gmatch_finished(m), "a^20000 b^20000");
    nv_gmatch_free(m);
    nv_grammar_unref(g);

    /* left recursion: L ::= L "x" | "y"; and through a nullable rule: M ::= E M "z" | "", E ::= "" */
    b = nv_gbuild_new();
    int l = nv_gbuild_reserve(b);
    nv_gbody_ref(&body, l);
    nv_gbody_lit(b, &body, "x", 1);
    nv_gbody_alt(&body);
    nv_gbody_lit(b, &body, "y", 1);
    nv_gbuild_define(b, l, &body);
    T_CHECK(nv_gbuild_finish(b, l, &g) == NV_EINVAL && strstr(nv_errmsg(), "left-recursive"), "left recursion: %s",
            nv_errmsg());
    b = nv_gbuild_new();
    int e = nv_gbuild_add(b, &body);
    int mm = nv_gbuild_reserve(b);
    nv_gbody_ref(&body, e);
    nv_gbody_ref(&body, mm);
    nv_gbody_lit(b, &body, "z", 1);
    nv_gbody_alt(&body);
    nv_gbuild_define(b, mm, &body);
    T_CHECK(nv_gbuild_finish(b, mm, &g) == NV_EINVAL, "left recursion behind a nullable rule");
    /* expansions that would take 2^24 steps without reading a byte fail instead of stalling:
     * R0 ::= "" | "a",  Rk ::= R(k-1) R(k-1) */
    b = nv_gbuild_new();
    int prev = nv_gbuild_reserve(b);
    nv_gbody_alt(&body);
    nv_gbody_lit(b, &body, "a", 1);
    nv_gbuild_define(b, prev, &body);
    for (int k = 1; k <= 24; k++) {
        nv_gbody_ref(&body, prev);
        nv_gbody_ref(&body, prev);
        prev = nv_gbuild_add(b, &body);
    }
    T_CHECK(nv_gbuild_finish(b, prev, &g) == NV_OK, "%s", nv_errmsg());
    double t0 = (double)clock() / CLOCKS_PER_SEC;
    nv_gmatch *big = g ? nv_gmatch_new(g) : NULL;
    int failed = !big || nv_gmatch_feed(big, "aa", 2) < 0;
    T_CHECK(failed && (double)clock() / CLOCKS_PER_SEC - t0 < 5, "an exploding expansion is cut short (%d)", failed);
    nv_gmatch_free(big);
    nv_grammar_unref(g);
    /* an undefined rule */
    b = nv_gbuild_new();
    int u = nv_gbuild_reserve(b);
    nv_gbody_ref(&body, u);
    int r = nv_gbuild_add(b, &body);
    T_CHECK(nv_gbuild_finish(b, r, &g) == NV_EINVAL && strstr(nv_errmsg(), "never defined"), "%s", nv_errmsg());
}

static void test_json_object(void) {
    nv_grammar *g = NULL;
    T_CHECK(nv_json_object_grammar(&g) == NV_OK, "%s", nv_errmsg());
    if (!g) return;
    const char *good[] = {
        "{}",
        " {\"a\": 1}",
        "{\"a\":[1,2.5,-3e+10,0.0,-0,1E5],\"b\":{\"c\":null,\"d\":true,\"e\":false}}",
        "{\n  \"k\" : \"esc \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9\\uABCD\",\n  \"u\": \"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"\n}",
        "{\"\":[[],{}, [ [ ] ] ]}",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) T_CHECK(accepts(g, good[i]), "valid: %s", good[i]);
    const char *bad[] = {
        "", "[]", "1", "\"s\"", "{", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "{,}", "{\"a\":01}", "{\"a\":1.}",
        "{\"a\":.5}", "{\"a\":+1}", "{\"a\":tru}", "{\"a\":\"\x01\"}", "{\"a\":\"\\x\"}", "{\"a\":\"\\u12\"}",
        "{\"a\":\"\xc0\xaf\"}", "{\"a\":\"\xed\xa0\x80\"}", "{\"a\":\"\xf4\x90\x80\x80\"}", "{\"a\":\"\xff\"}",
        "{} ", "{}{}", "{'a':1}", "{\"a\":NaN}", "{\"a\":1e1234}", "{\"a\":12345678901234567}", "{\"a\":\"\\ud800\"}",
        "{\"a\":\"\\uDFFF\"}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) T_CHECK(!accepts(g, bad[i]), "invalid: %s", bad[i]);
    /* whitespace: one space, or a newline and up to 20 spaces or tabs */
    const char *ws_good[] = {"{ }", "{\n}", "{\n\t\t\"a\": 1\n}", "{\n                    \"a\":1}", " {}", "\n{}"};
    for (size_t i = 0; i < sizeof ws_good / sizeof ws_good[0]; i++) T_CHECK(accepts(g, ws_good[i]), "valid: %s", ws_good[i]);
    const char *ws_bad[] = {"{  }", "{\n\n}", "{ \n}", "{\n                     \"a\":1}", "{\r\n}", "\t{}"};
    for (size_t i = 0; i < sizeof ws_bad / sizeof ws_bad[0]; i++) T_CHECK(!accepts(g, ws_bad[i]), "invalid: %s", ws_bad[i]);
    nv_grammar_unref(g);
}

typedef struct {
    const char *schema;
    const char *good[10];
    const char *bad[10];
} schema_case;

static void test_schemas(void) {
    static const schema_case cases[] = {
        {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"}},"
         "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}",
         {"{\"name\":\"Ann\",\"age\":7}", "{ \"name\" : \"\" , \"age\" : -12 }"},
         {"{\"age\":7,\"name\":\"Ann\"}", "{\"name\":\"Ann\"}", "{\"name\":\"Ann\",\"age\":7.5}", "{\"name\":1,\"age\":7}",
          "{\"name\":\"Ann\",\"age\":7,\"x\":1}", "{}"}},
        {"{\"properties\":{\"a\":{\"type\":\"boolean\"},\"b\":{\"type\":\"null\"},\"c\":{\"type\":\"number\"}},\"required\":[\"b\"]}",
         {"{\"b\":null}", "{\"a\":true,\"b\":null}", "{\"b\":null,\"c\":1.5e-3}", "{\"a\":false,\"b\":null,\"c\":0}"},
         {"{}", "{\"a\":true}", "{\"a\":true,\"c\":1}", "{\"b\":null,\"a\":true}", "{,\"b\":null}", "{\"b\":null,}"}},
        {"{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",1,null]},\"minItems\":1,\"maxItems\":3}",
         {"[\"red\"]", "[ \"green\" , 1 ]", "[null,null,\"red\"]"},
         {"[]", "[\"blue\"]", "[1,1,1,1]", "[\"Red\"]", "[2]"}},
        {"{\"type\":[\"string\",\"null\"],\"minLength\":2,\"maxLength\":3}",
         {"null", "\"ab\"", "\"\xc3\xa9\xc3\xa9\xc3\xa9\"", "\"\\n\\t\""},
         {"\"a\"", "\"abcd\"", "\"\"", "nul"}},
        {"{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"x\":{\"const\":1}},\"required\":[\"x\"]},"
         "{\"type\":\"object\",\"properties\":{\"x\":{\"const\":\"1\"},\"y\":{\"type\":\"integer\"}},\"required\":[\"x\",\"y\"]}]}",
         {"{\"x\":1}", "{\"x\":\"1\",\"y\":2}"},
         {"{\"x\":1,\"y\":2}", "{\"x\":\"1\"}", "{\"x\":2}"}},
        {"{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
         "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"]}},\"$ref\":\"#/$defs/node\"}",
         {"{\"v\":1}", "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[]}]}"},
         {"{\"v\":1,\"kids\":[{}]}", "{\"kids\":[]}"}},
        {"{\"type\":\"integer\",\"minimum\":-15,\"maximum\":120}",
         {"-15", "-9", "-10", "0", "7", "99", "100", "120", "19"},
         {"-16", "-0", "121", "200", "1000", "007", "-", "1.0"}},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":0}", {"1", "9", "10", "9999999999999999"}, {"0", "-1", "01"}},
        {"{\"type\":\"integer\",\"minimum\":1000,\"maximum\":2024}", {"1000", "1999", "2000", "2024", "2019"},
         {"999", "2025", "2030", "3000", "10000"}},
        {"{\"type\":\"string\",\"format\":\"date-time\"}", {"\"2026-12-01T04:33:00Z\"", "\"1999-01-31T23:59:60.123+05:30\""},
         {"\"2026-13-01T00:00:00Z\"", "\"2026-12-00T00:00:00Z\"", "\"2026-12-01T24:00:00Z\"", "\"2026-12-01\""}},
        {"{\"type\":\"string\",\"format\":\"uuid\"}", {"\"123e4567-e89b-12d3-a456-426614174000\""},
         {"\"123e4567e89b12d3a456426614174000\"", "\"123e4567-e89b-12d3-a456-42661417400\""}},
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}", {"{}", "{\"a\":1,\"b\":2}"},
         {"{\"a\":\"x\"}"}},
        {"{\"type\":\"object\",\"additionalProperties\":false}", {"{}", "{ }"}, {"{\"a\":1}"}},
        {"{\"type\":\"integer\",\"format\":\"int32\"}", {"2147483647", "-2147483648", "0"}, {"2147483648", "-2147483649"}},
        {"{\"type\":\"string\",\"enum\":[\"ab\",\"abc\",\"b\"],\"title\":\"t\"}", {"\"ab\"", "\"abc\"", "\"b\""},
         {"\"a\"", "\"abcd\"", "\"bb\""}},
        {"{\"const\":{\"k\":[1,\"\xc3\xa9\"]}}", {"{\"k\":[1,\"\xc3\xa9\"]}"}, {"{\"k\": [1,\"\xc3\xa9\"]}"}},
        {"true", {"1", "{\"a\":[null]}", "\"s\""}, {"", "x"}},
        /* pattern: the JSON text of each string the expression matches */
        {"{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3}$\"}", {"\"AB-123\"", "\"ZZ-000\""},
         {"\"ab-123\"", "\"AB-1234\"", "\"AB-12\"", "\"AB123\""}},
        {"{\"type\":\"string\",\"pattern\":\"ab\"}", {"\"ab\"", "\"xxabyy\"", "\"\\\"ab\\\\\""}, {"\"a b\"", "\"\""}},
        {"{\"type\":\"string\",\"pattern\":\"^(cat|dog)s?$\"}", {"\"cats\"", "\"dog\""}, {"\"cow\"", "\"catss\"", "\"cat \""}},
        {"{\"type\":\"string\",\"pattern\":\"^a\\\"b\\\\\\\\c\\\\n$\"}", {"\"a\\\"b\\\\c\\n\""}, {"\"a\\\"b\\c\\n\"", "\"a\\\"b\\\\c\""}},
        {"{\"type\":\"string\",\"pattern\":\"^[^\\\"]{1,3}$\"}", {"\"\xc3\xa9\"", "\"xyz\"", "\"\\n\""}, {"\"\\\"\"", "\"abcd\"", "\"\""}},
        {"{\"type\":\"string\",\"pattern\":\"^.$\"}", {"\"\xe2\x82\xac\"", "\"\\t\"", "\"~\""}, {"\"\\n\"", "\"\xe2\x80\xa8\"", "\"ab\""}},
        {"{\"type\":\"string\",\"pattern\":\"^\\\\u0041+[\\\\x42-\\\\x43]$\"}", {"\"AAB\"", "\"AC\""}, {"\"A\"", "\"AD\""}},
        {"{\"type\":\"string\",\"pattern\":\"^a|b$\"}", {"\"axx\"", "\"xxb\"", "\"a\"", "\"b\""}, {"\"xbx\"", "\"xax\""}},
        {"{\"type\":\"string\",\"pattern\":\"^(?:\\\\w+\\\\.)*\\\\w+@\\\\w+\\\\.[a-z]{2,3}$\"}", {"\"a.b@c.io\"", "\"x_1@y.com\""},
         {"\"@c.io\"", "\"a@c.toolong\"", "\"a b@c.io\""}},
        {"{\"type\":\"string\",\"pattern\":\"^[^\\\\s]+$\"}", {"\"ab\"", "\"a-b\""}, {"\"a b\"", "\"\xc2\xa0\"", "\"\xc3\xa9\""}},
        {"{\"type\":\"string\",\"pattern\":\"^[^]$\"}", {"\"\\n\"", "\"\xc3\xa9\"", "\"\\\"\""}, {"\"ab\"", "\"\""}},
        {"{\"type\":\"string\",\"pattern\":\"^[\\\\s\\\\S]?\\\\D\\\\W$\"}", {"\" x-\"", "\"x!\"", "\"\xc3\xa9\xc3\xa9\""}, {"\"1-\"", "\"xa\""}},
        {"{\"title\":\"T\",\"description\":\"d\",\"allOf\":[{\"type\":\"boolean\"}]}", {"true", "false"}, {"1"}},
        /* numbers between whole bounds (pydantic's Field(ge=0, le=1) on a float), written without an exponent */
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", {"0", "1", "0.5", "0.999", "1.000", "0.0", "0.0001"},
         {"-0.5", "1.5", "1.0001", "2", "-1", "1e0", "0.5e-1", "01"}},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0}", {"0.01", "1", "12345.6", "3.0"}, {"0", "0.0", "-0.1", "-3", "0.000"}},
        {"{\"type\":\"number\",\"maximum\":-1}", {"-1", "-1.5", "-200", "-1.0"}, {"-0.5", "0", "-0.99", "1"}},
        {"{\"type\":\"number\",\"minimum\":-2,\"exclusiveMaximum\":3}", {"-2", "-1.5", "-0.5", "0", "2.999", "-2.00"},
         {"3", "3.0", "-2.01", "-3", "3.5"}},
        {"{\"type\":\"number\",\"minimum\":5,\"exclusiveMinimum\":true,\"maximum\":7}", {"5.5", "6", "7", "7.00"}, {"5", "5.0", "7.1", "8"}},
        {"{\"type\":[\"number\",\"null\"],\"minimum\":0}", {"0", "null", "7.25"}, {"-1", "-0.1"}},
        /* tuples: prefixItems (then items), or the older drafts' list of items (then additionalItems) */
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}]}",
         {"[]", "[1]", "[1, \"a\"]", "[1,\"a\",true,{}]"}, {"[\"a\"]", "[1, 2]", "[1,]"}},
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}],\"items\":false,\"minItems\":2}",
         {"[1,\"a\"]", "[ 7 , \"\" ]"}, {"[1]", "[1,\"a\",2]", "[]"}},
        {"{\"type\":\"array\",\"items\":[{\"type\":\"boolean\"}],\"additionalItems\":{\"type\":\"null\"}}",
         {"[true, null, null]", "[]", "[false]"}, {"[null]", "[true, 1]"}},
        {"{\"type\":\"array\",\"prefixItems\":[{\"const\":1}],\"items\":{\"type\":\"string\"},\"maxItems\":2}",
         {"[1, \"x\"]", "[1]"}, {"[1, \"x\", \"y\"]", "[1, 2]", "[2]"}},
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"},{\"type\":\"null\"}],\"maxItems\":1}",
         {"[1]", "[]"}, {"[1, \"a\"]"}},
        {"{\"type\":\"number\",\"minimum\":0,\"exclusiveMinimum\":0,\"maximum\":2,\"exclusiveMaximum\":3}", {"0.5", "2"}, {"0", "2.5"}},
        /* 15 significant digits at most: more could name the double of an excluded bound (99.9999999999999999 is 100.0) */
        {"{\"type\":\"number\",\"exclusiveMaximum\":100}", {"99.9999999999999", "99.5", "-3"}, {"99.99999999999999", "99.9999999999999999", "100"}},
        {"{\"type\":\"number\",\"exclusiveMinimum\":false}", {"1e5", "-2.5"}, {"x"}}, /* draft 4's boolean alone bounds nothing */
        {"{\"type\":\"number\",\"minimum\":-9007199254740992}", {"-9007199254740992", "5"}, {"-9007199254740993"}},
        /* multipleOf: few multiples in range, listed; open ranges digit by digit (c 10^m: c's multiples, then m zeros) */
        {"{\"type\":\"integer\",\"minimum\":0,\"maximum\":100,\"multipleOf\":5}", {"0", "5", "35", "100"}, {"3", "105", "-5", "050"}},
        {"{\"type\":\"integer\",\"multipleOf\":7}", {"0", "7", "-49", "9999999999999996", "343"}, {"8", "-50", "70000000000000000", "07"}},
        {"{\"type\":\"integer\",\"minimum\":1,\"multipleOf\":12}", {"12", "144", "1200000"}, {"0", "-12", "13", "1212121212121213"}},
        {"{\"type\":\"integer\",\"maximum\":0,\"multipleOf\":3}", {"0", "-3", "-999"}, {"3", "-4"}},
        {"{\"type\":\"integer\",\"multipleOf\":2500}", {"2500", "-5000", "1000000", "0"}, {"250", "2600", "12500000000000000000"}},
        {"{\"type\":\"integer\",\"multipleOf\":1000}", {"1000", "17000", "0"}, {"100", "1500"}},
        {"{\"type\":\"integer\",\"multipleOf\":0.5}", {"1", "-3", "12"}, {"1.5"}}, /* every integer */
        {"{\"type\":\"number\",\"multipleOf\":0.01}", {"0.07", "12", "-3.5", "19.99"}, {"0.001", "1e2", "1.999"}},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":10,\"multipleOf\":0.1}", {"0", "9.9", "10", "10.0", "3.2"}, {"10.1", "0.25", "-0.1"}},
        {"{\"type\":\"number\",\"multipleOf\":4}", {"8", "-12", "0"}, {"6", "8.0", "4.5"}},
        {"{\"type\":\"integer\",\"minimum\":-20,\"maximum\":20,\"multipleOf\":7}", {"-14", "-7", "0", "14"}, {"-21", "21", "-20", "13"}},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":30,\"multipleOf\":10}", {"10", "20"}, {"0", "30", "15", "10.5"}},
        /* uniqueItems over an enum's values (pydantic's set[Enum] through a $ref too): each at most once */
        {"{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",\"blue\"]},\"uniqueItems\":true}",
         {"[]", "[\"red\"]", "[\"blue\", \"red\"]", "[\"green\",\"blue\",\"red\"]"},
         {"[\"red\",\"red\"]", "[\"blue\",\"green\",\"blue\"]", "[\"pink\"]", "[\"red\",\"green\",\"blue\",\"red\"]"}},
        {"{\"$defs\":{\"Size\":{\"type\":\"integer\",\"enum\":[1,2,3,4]}},\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/Size\"},"
         "\"uniqueItems\":true,\"minItems\":2,\"maxItems\":3}",
         {"[1,2]", "[4,3,1]"}, {"[1]", "[1,1]", "[1,2,3,4]", "[2,2,3]", "[]"}},
        {"{\"type\":\"array\",\"items\":{\"const\":\"x\"},\"uniqueItems\":true}", {"[]", "[\"x\"]"}, {"[\"x\",\"x\"]"}},
        {"{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":false}", {"[\"a\",\"a\"]"}, {"[1]"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nv_grammar *g = schema_grammar(cases[i].schema);
        if (!g) continue;
        for (int k = 0; k < 10 && cases[i].good[k]; k++)
            T_CHECK(accepts(g, cases[i].good[k]), "schema %zu accepts %s", i, cases[i].good[k]);
        for (int k = 0; k < 10 && cases[i].bad[k]; k++)
            T_CHECK(!accepts(g, cases[i].bad[k]), "schema %zu refuses %s", i, cases[i].bad[k]);
        nv_grammar_unref(g);
    }
}

static void test_schema_refusals(void) {
    static const struct {
        const char *schema, *why;
        nv_err code;
    } bad[] = {
        {"{\"type\":\"number\",\"minimum\":0.5}", "'minimum' on a number: only whole bounds", NV_EUNSUPPORTED},
        {"{\"type\":\"number\",\"minimum\":9007199254740994}", "up to 2^53", NV_EUNSUPPORTED},
        {"{\"type\":\"number\",\"exclusiveMinimum\":9007199254740000,\"exclusiveMaximum\":9007199254740001}", "15 significant digits", NV_EUNSUPPORTED},
        {"{\"type\":\"number\",\"minimum\":1,\"exclusiveMaximum\":1}", "no number between", NV_EINVAL},
        {"{\"type\":\"number\",\"maximum\":\"1\"}", "must be numbers", NV_EINVAL},
        {"{\"type\":\"array\",\"uniqueItems\":true}", "'uniqueItems' is supported on items of an 'enum'", NV_EUNSUPPORTED},
        {"{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":true}", "'uniqueItems' is supported on items of an 'enum'", NV_EUNSUPPORTED},
        {"{\"type\":\"array\",\"items\":{\"enum\":[1,2,3,4,5,6,7,8,9,10,11]},\"uniqueItems\":true}", "over 11 values", NV_EUNSUPPORTED},
        {"{\"type\":\"array\",\"items\":{\"enum\":[1,2]},\"uniqueItems\":true,\"minItems\":3}", "'minItems' 3 is more than", NV_EINVAL},
        {"{\"type\":\"array\",\"items\":{\"enum\":[1]},\"uniqueItems\":1}", "true or false", NV_EINVAL},
        {"{\"type\":\"array\",\"items\":{\"enum\":[{\"a\":1,\"b\":2},{\"b\":2,\"a\":1}]},\"uniqueItems\":true}", "objects or arrays", NV_EUNSUPPORTED},
        {"{\"type\":\"number\",\"multipleOf\":0.10000000001}", "'multipleOf' 0.1", NV_EUNSUPPORTED},
        {"{\"type\":\"array\",\"prefixItems\":[{\"const\":1}],\"uniqueItems\":true}", "beside a tuple", NV_EUNSUPPORTED},
        {"{\"type\":\"integer\",\"multipleOf\":7919}", "at most 4096 multiples", NV_EUNSUPPORTED},
        {"{\"type\":\"integer\",\"minimum\":100000,\"multipleOf\":3}", "at most 4096 multiples", NV_EUNSUPPORTED},
        {"{\"type\":\"integer\",\"minimum\":1,\"maximum\":4,\"multipleOf\":5}", "no multiple of 5", NV_EINVAL},
        {"{\"type\":\"integer\",\"multipleOf\":1.5}", "'multipleOf' 1.5", NV_EUNSUPPORTED},
        {"{\"type\":\"number\",\"multipleOf\":0.25}", "'multipleOf' 0.25", NV_EUNSUPPORTED},
        {"{\"type\":\"number\",\"multipleOf\":0}", "above 0", NV_EINVAL},
        {"{\"multipleOf\":2}", "'multipleOf' without a 'type'", NV_EUNSUPPORTED},
        {"{\"type\":\"array\",\"prefixItems\":[{}],\"items\":false,\"minItems\":2}", "matches nothing", NV_EINVAL},
        {"{\"type\":\"array\",\"prefixItems\":{}}", "a list of schemas", NV_EINVAL},
        {"{\"type\":\"array\",\"additionalItems\":false}", "'additionalItems' without", NV_EUNSUPPORTED},
        {"{\"type\":\"string\",\"format\":\"email\"}", "'format': 'email'", NV_EUNSUPPORTED},
        {"{\"properties\":{\"a\":{}},\"additionalProperties\":true}", "'additionalProperties' beside", NV_EUNSUPPORTED},
        {"{\"properties\":{\"a\":{}},\"required\":[\"b\"]}", "'required' names 'b'", NV_EUNSUPPORTED},
        {"{\"type\":\"strin\"}", "not a JSON schema type", NV_EINVAL},
        {"{\"$ref\":\"#/$defs/nope\"}", "does not point", NV_EINVAL},
        {"{\"$ref\":\"http://x/y\"}", "only references into the schema", NV_EUNSUPPORTED},
        {"{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}", "left-recursive", NV_EINVAL},
        {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "below 'minItems'", NV_EINVAL},
        {"{\"type\":\"string\",\"maxLength\":1000000}", "over 10000", NV_EUNSUPPORTED},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer", NV_EINVAL},
        {"{\"enum\":[]}", "non-empty", NV_EINVAL},
        {"false", "matches nothing", NV_EINVAL},
        {"3", "object or a boolean", NV_EINVAL},
        {"{\"type\":[\"object\",\"object\"]}", "lists 'object' twice", NV_EINVAL},
        {"{\"maxLength\":3}", "'maxLength' without a 'type'", NV_EUNSUPPORTED},
        {"{\"properties\":{},\"items\":true}", "object and array keywords", NV_EUNSUPPORTED},
        {"{\"type\":\"object\",\"anyOf\":[{\"required\":[]}]}", "'type' beside 'anyOf'", NV_EUNSUPPORTED},
        {"{\"enum\":[\"a\",\"bb\"],\"maxLength\":1}", "'maxLength' beside 'enum'", NV_EUNSUPPORTED},
        {"{\"$ref\":\"#\",\"minItems\":1}", "'minItems' beside '$ref'", NV_EUNSUPPORTED},
        {"{\"type\":\"string\",\"enum\":[1]}", "not of the schema's 'type'", NV_EINVAL},
        {"{\"type\":\"integer\",\"format\":\"uuid\"}", "only int32 and int64", NV_EUNSUPPORTED},
        {"{\"type\":\"boolean\",\"format\":\"x\"}", "'format' on a boolean", NV_EUNSUPPORTED},
        {"{\"type\":\"integer\",\"maximum\":1e17}", "beyond 2^53", NV_EUNSUPPORTED},
        {"{\"type\":\"string\",\"pattern\":\"(?=a)b\"}", "look-around", NV_EUNSUPPORTED},
        {"{\"type\":\"string\",\"pattern\":\"\\\\bword\"}", "word boundaries", NV_EUNSUPPORTED},
        {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "back references", NV_EUNSUPPORTED},
        {"{\"type\":\"string\",\"pattern\":\"[\xc3\xa0-\xc3\xbf]\"}", "past ASCII", NV_EUNSUPPORTED},
        {"{\"type\":\"string\",\"pattern\":\"a**\"}", "after a quantifier", NV_EUNSUPPORTED},
        {"{\"type\":\"string\",\"pattern\":\"(a\"}", "without its ')'", NV_EUNSUPPORTED},
        {"{\"type\":\"string\",\"pattern\":\"a)\"}", "without its '('", NV_EUNSUPPORTED},
        {"{\"type\":\"string\",\"pattern\":\"a{2000}\"}", "at most 1000", NV_EUNSUPPORTED},
        {"{\"type\":\"string\",\"pattern\":\"a^b\"}", "only at the ends", NV_EUNSUPPORTED},
        {"{\"type\":\"string\",\"pattern\":\"[z-a]\"}", "backwards", NV_EUNSUPPORTED},
        {"{\"type\":\"string\",\"pattern\":\"a\",\"maxLength\":3}", "'pattern' with", NV_EUNSUPPORTED},
        {"{\"type\":\"string\",\"pattern\":\"^((a?){1000}){1000}$\"}", "can match the empty string", NV_EUNSUPPORTED},
        {"{\"type\":\"string\",\"pattern\":\"(a*)*\"}", "can match the empty string", NV_EUNSUPPORTED},
        {"{\"type\":\"string\",\"pattern\":\"(a|)+b\"}", "can match the empty string", NV_EUNSUPPORTED},
        {"{\"type\":\"string\",\"pattern\":\"a{ 3}\"}", "not a quantifier", NV_EUNSUPPORTED},
        {"{\"type\":\"string\",\"pattern\":\"a{3,+4}\"}", "not a quantifier", NV_EUNSUPPORTED},
        {"{\"type\":\"string\",\"pattern\":\"[]a]\"}", "matches nothing", NV_EUNSUPPORTED},
        {"{\"type\":\"string\",\"pattern\":\"\\\\01\"}", "octal", NV_EUNSUPPORTED},
        {"{\"type\":\"string\",\"pattern\":\"\xc0\xa2\"}", "not UTF-8", NV_EUNSUPPORTED},
        {"{\"type\":\"string\",\"pattern\":\"\xed\xa0\x80\"}", "not UTF-8", NV_EUNSUPPORTED},
        {"{\"pattern\":\"a\"}", "'pattern' without a 'type'", NV_EUNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *s = cJSON_Parse(bad[i].schema);
        nv_grammar *g = NULL;
        nv_err e = nv_schema_grammar(s, &g);
        T_CHECK(e == bad[i].code && !g && strstr(nv_errmsg(), bad[i].why), "%s: %d %s", bad[i].schema, e, nv_errmsg());
        nv_grammar_unref(g);
        cJSON_Delete(s);
    }
    /* anyOf over 128 schemas is refused (each would be a parse stack); a long enum is one trie */
    char *many = malloc(1 << 16);
    strcpy(many, "{\"anyOf\":[");
    for (int i = 0; i < 129; i++) strcat(many, i ? ",{\"const\":1}" : "{\"const\":1}");
    strcat(many, "]}");
    cJSON *a = cJSON_Parse(many);
    nv_grammar *ga = NULL;
    T_CHECK(nv_schema_grammar(a, &ga) == NV_EUNSUPPORTED && strstr(nv_errmsg(), "more than 128"), "%s", nv_errmsg());
    cJSON_Delete(a);
    strcpy(many, "{\"enum\":[");
    for (int i = 0; i < 3000; i++) sprintf(many + strlen(many), "%s\"v%d\"", i ? "," : "", i);
    strcat(many, "]}");
    a = cJSON_Parse(many);
    ga = NULL;
    T_CHECK(nv_schema_grammar(a, &ga) == NV_OK, "3000 values: %s", nv_errmsg());
    if (ga) {
        T_CHECK(accepts(ga, "\"v0\"") && accepts(ga, "\"v1234\"") && accepts(ga, "\"v2999\"") && !accepts(ga, "\"v3000\"") &&
                    !accepts(ga, "\"v\""),
                "every value of a 3000-value enum, and nothing else");
        nv_grammar_unref(ga);
    }
    cJSON_Delete(a);
    free(many);
    /* a deep nesting is refused, not recursed without end */
    char deep[4096] = "";
    for (int i = 0; i < 100; i++) strcat(deep, "{\"items\":");
    strcat(deep, "true");
    for (int i = 0; i < 100; i++) strcat(deep, "}");
    cJSON *s = cJSON_Parse(deep);
    nv_grammar *g = NULL;
    T_CHECK(nv_schema_grammar(s, &g) == NV_EINVAL && strstr(nv_errmsg(), "deeper"), "%s", nv_errmsg());
    cJSON_Delete(s);
}

/* The mask against asking token by token, at every token boundary of a few texts. */
static void check_mask(const nv_tokenizer *t, nv_grammar *g, const char *text) {
    nv_gtrie *tr = NULL;
    T_CHECK(nv_gtrie_build(t, &tr) == NV_OK, "%s", nv_errmsg());
    int V = nv_tokenizer_vocab_size(t);
    uint8_t *mask = malloc((size_t)V);
    int *ids = NULL, n = 0;
    nv_tokenizer_encode(t, text, 0, 0, &ids, &n);
    nv_gmatch *m = nv_gmatch_new(g);
    int prev = NV_TOKEN_EOS, steps = 0;
    for (int i = 0; i <= n; i++) {
        int k = nv_gmatch_mask(m, tr, mask), count = 0, differ = 0;
        for (int v = 0; v < V; v++) {
            int want = nv_gmatch_allows(m, t, prev, v);
            count += want;
            if (want != mask[v] && differ++ < 3)
                T_CHECK(0, "step %d token %d '%s': mask %d, one by one %d", i, v, nv_tokenizer_decode(t, prev, v), mask[v], want);
        }
        T_CHECK(k == count, "step %d: %d allowed, counted %d", i, k, count);
        if (i < n) {
            T_CHECK(mask[ids[i]], "step %d: the text's own token %d is masked out", i, ids[i]);
            nv_gmatch_accept(m, t, prev, ids[i]);
            prev = ids[i];
        }
        steps++;
    }
    T_CHECK(nv_gmatch_done(m), "the text is whole");
    nv_gmatch_free(m);
    free(ids);
    free(mask);
    nv_gtrie_free(tr);
}

/* {"anyOf": [{"k": 0}, ..., {"k": n-1}]} as objects: n parse stacks after {"k": */
static nv_grammar *many_stacks(int n) {
    char *text = malloc(65536);
    strcpy(text, "{\"anyOf\":[");
    for (int i = 0; i < n; i++)
        sprintf(text + strlen(text), "%s{\"type\":\"object\",\"properties\":{\"k\":{\"const\":%d}},\"required\":[\"k\"]}", i ? "," : "", i);
    strcat(text, "]}");
    nv_grammar *g = schema_grammar(text);
    free(text);
    return g;
}

static void test_mask(void) {
    const char *paths[] = {"models/tok512.bin", "tokenizers/tokenizer.bin"};
    nv_grammar *g = schema_grammar("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":40},"
                                   "\"n\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},"
                                   "\"required\":[\"name\",\"n\",\"tags\"]}");
    nv_grammar *any = NULL;
    nv_json_object_grammar(&any);
    for (int p = 0; p < 2; p++) {
        const char *path = t_data(paths[p]);
        if (!path) return;
        nv_tokenizer *t = NULL;
        if (nv_tokenizer_load(path, 0, &t) != NV_OK) {
            T_CHECK(0, "%s", nv_errmsg());
            continue;
        }
        check_mask(t, g, "{\"name\": \"Lily \xc3\xa9 \\\"x\\\"\", \"n\": -42, \"tags\": [\"a\", \"bb\"]}");
        check_mask(t, any, "{\"k\": [1.5, {\"z\": null}], \"t\": true}");
        nv_grammar *wide = many_stacks(100); /* past the heads' hash threshold */
        if (wide) {
            check_mask(t, wide, "{\"k\": 97}");
            T_CHECK(accepts(wide, "{\"k\":0}") && accepts(wide, "{ \"k\" : 99 }") && !accepts(wide, "{\"k\":100}") &&
                        !accepts(wide, "{\"k\":-1}"),
                    "100 alternatives");
        }
        nv_grammar_unref(wide);
        nv_tokenizer_free(t);
    }
    nv_grammar_unref(g);
    nv_grammar_unref(any);
}

/* Lazy grammars: free text until the trigger, then held to the grammar from the trigger on. */
/* A reasoning model's think block before the JSON (--reasoning-format). */
static void test_think(void) {
    cJSON *schema = cJSON_Parse("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}");
    nv_grammar *g = NULL;
    T_CHECK(nv_schema_grammar_ex(schema, 0, 1, &g) == NV_OK, "%s", nv_errmsg());
    cJSON_Delete(schema);
    if (!g) return;
    const char *good[] = {"{\"a\":1}", " {\"a\":1}", "<think>\nLet me see: { \"a\" } </think\n</thin> <<</think>\n\n{\"a\":2}",
                          "<think></think>{\"a\":3}", "<think>\xc3\xa9</think>\n{\"a\":4}"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) T_CHECK(accepts(g, good[i]), "accepts %s", good[i]);
    const char *bad[] = {"<think>x</think>y{\"a\":1}", "<think>x", "x<think></think>{\"a\":1}", "<think>a</think>b</think>{\"a\":1}",
                         "<think>x</think>\n\n\n{\"a\":1}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) T_CHECK(!accepts(g, bad[i]), "refuses %s", bad[i]);
    nv_grammar_unref(g);
    /* a lazy trigger inside the think block does not count */
    schema = cJSON_Parse("{\"type\":\"object\"}");
    T_CHECK(nv_schema_grammar_framed(schema, "<tool_call>\n", "\n</tool_call>", NULL, &g) == NV_OK, "%s", nv_errmsg());
    cJSON_Delete(schema);
    nv_glazy z;
    nv_gsampler gs = {0};
    T_CHECK(nv_glazy_init(&z, g, "<tool_call>", 0) == NV_OK, "%s", nv_errmsg());
    z.think = 1;
    const char *pieces[] = {"\n<thi", "nk>I could write <tool_call>\n{ here", "</th", "ink>\n\n"};
    for (int i = 0; i < 4; i++) T_CHECK(nv_glazy_step(&z, &gs, 16, pieces[i]) == 0 && !gs.m, "inside the think block (%d)", i);
    T_CHECK(nv_glazy_step(&z, &gs, 16, "<tool_call>\n{") == 1 && gs.m, "after it");
    nv_gsampler_free(&gs);
    nv_glazy_free(&z);
    /* a block the prompt opened: the answer starts inside it */
    T_CHECK(nv_glazy_init(&z, g, "<tool_call>", 0) == NV_OK, "%s", nv_errmsg());
    z.think = 1, z.thk.state = NV_THINK_IN;
    const char *opened[] = {"I could write <tool_call>\n{ ", "here</think>", "\n"};
    for (int i = 0; i < 3; i++) T_CHECK(nv_glazy_step(&z, &gs, 16, opened[i]) == 0 && !gs.m, "inside the opened block (%d)", i);
    T_CHECK(nv_glazy_step(&z, &gs, 16, "<tool_call>\n{") == 1 && gs.m, "after it");
    nv_gsampler_free(&gs);
    nv_glazy_free(&z);
    /* at the start, after the block */
    T_CHECK(nv_glazy_init(&z, g, "<tool_call>", 1) == NV_OK, "%s", nv_errmsg());
    z.think = 1;
    T_CHECK(nv_glazy_step(&z, &gs, 16, "<think>hm</think>\n") == 0 && nv_glazy_step(&z, &gs, 16, "<tool_call>\n{") == 1 && gs.m,
            "at the start after a think block");
    nv_gsampler_free(&gs);
    nv_glazy_free(&z);
    /* no think block: the text is looked at as it is */
    T_CHECK(nv_glazy_init(&z, g, "<tool_call>", 0) == NV_OK, "%s", nv_errmsg());
    z.think = 1;
    T_CHECK(nv_glazy_step(&z, &gs, 16, "Sure <tool_call>\n{") == 1 && gs.m, "no think block");
    nv_gsampler_free(&gs);
    nv_glazy_free(&z);
    /* Mistral's tags: "<think>" is then text like any other */
    T_CHECK(nv_glazy_init(&z, g, "<tool_call>", 0) == NV_OK, "%s", nv_errmsg());
    z.think = z.thk.tags = NV_THINK_BRACKET;
    const char *bracket[] = {"[THINK]I could write <tool_call>\n{ ", "here</think>[/TH", "INK]"};
    for (int i = 0; i < 3; i++) T_CHECK(nv_glazy_step(&z, &gs, 16, bracket[i]) == 0 && !gs.m, "inside the [THINK] block (%d)", i);
    T_CHECK(nv_glazy_step(&z, &gs, 16, "<tool_call>\n{") == 1 && gs.m, "after it");
    nv_gsampler_free(&gs);
    nv_glazy_free(&z);
    nv_grammar_unref(g);

    /* the JSON after Mistral's [THINK]...[/THINK] (Magistral's) */
    schema = cJSON_Parse("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}");
    T_CHECK(nv_schema_grammar_ex(schema, 0, NV_THINK_BRACKET, &g) == NV_OK, "%s", nv_errmsg());
    cJSON_Delete(schema);
    if (!g) return;
    const char *good_b[] = {"{\"a\":1}", "[THINK]Let me see: <think></think> [/THINK [THINK]\n[/THINK]{\"a\":2}", "[THINK][/THINK]\n{\"a\":3}"};
    for (size_t i = 0; i < sizeof good_b / sizeof good_b[0]; i++) T_CHECK(accepts(g, good_b[i]), "accepts %s", good_b[i]);
    const char *bad_b[] = {"<think>x</think>{\"a\":1}", "[THINK]x", "[THINK]a[/THINK]b[/THINK]{\"a\":1}", "[THINK]x</think>{\"a\":1}"};
    for (size_t i = 0; i < sizeof bad_b / sizeof bad_b[0]; i++) T_CHECK(!accepts(g, bad_b[i]), "refuses %s", bad_b[i]);
    nv_grammar_unref(g);
}

/* The calls grammar of tools under frame accepts each of good and refuses each of bad. */
static void calls_cases(const cJSON *tools, const nv_call_frame *frame, const char *const *good, size_t n_good, const char *const *bad,
                        size_t n_bad) {
    nv_grammar *g = NULL;
    T_CHECK(nv_tool_calls_grammar(tools, NULL, frame, 0, 0, NULL, 0, &g) == NV_OK, "%s", nv_errmsg());
    for (size_t i = 0; g && i < n_good; i++) T_CHECK(accepts(g, good[i]), "accepts %s", good[i]);
    for (size_t i = 0; g && i < n_bad; i++) T_CHECK(!accepts(g, bad[i]), "refuses %s", bad[i]);
    nv_grammar_unref(g);
}

/* Tool calls as one list in one frame (Granite's <|tool_call|>[A, B]): calls inside the list only,
 * at least one, each held to its tool's schema. */
static void test_tool_call_list(void) {
    cJSON *tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"play\",\"parameters\":{\"type\":\"object\","
                               "\"properties\":{\"toy\":{\"enum\":[\"ball\",\"car\"]}},\"required\":[\"toy\"]}}},"
                               "{\"type\":\"function\",\"function\":{\"name\":\"time\"}}]");
    nv_grammar *g = NULL;
    const nv_call_frame list = {.args_key = "arguments", .prefix = "<|tool_call|>[", .suffix = "]", .item_sep = ", "},
                        one = {.args_key = "arguments", .prefix = "<|tool_call|>[", .suffix = "]"};
    {
        const char *good[] = {"<|tool_call|>[{\"name\": \"play\", \"arguments\": {\"toy\": \"car\"}}]",
                              "<|tool_call|>[{\"name\":\"time\",\"arguments\":{}}, {\"name\": \"play\", \"arguments\": {\"toy\":\"ball\"}}]",
                              "<|tool_call|>[{\"name\":\"time\",\"arguments\":{\"any\":[1]}}, {\"name\":\"time\",\"arguments\":{}}, "
                              "{\"name\":\"time\",\"arguments\":{}}]"};
        const char *bad[] = {"<|tool_call|>[]", "<|tool_call|>[{\"name\": \"play\", \"arguments\": {\"toy\": \"doll\"}}]",
                             "<|tool_call|>[{\"name\":\"time\",\"arguments\":{}}]<|tool_call|>[{\"name\":\"time\",\"arguments\":{}}]",
                             "<|tool_call|>[{\"name\":\"time\",\"arguments\":{}},]", "<|tool_call|>{\"name\":\"time\",\"arguments\":{}}"};
        calls_cases(tools, &list, good, sizeof good / sizeof good[0], bad, sizeof bad / sizeof bad[0]);
    }
    /* one call only: no second in the list */
    T_CHECK(nv_tool_calls_grammar(tools, "time", &one, 0, 0, NULL, 0, &g) == NV_OK, "%s", nv_errmsg());
    if (g) {
        T_CHECK(accepts(g, "<|tool_call|>[{\"name\":\"time\",\"arguments\":{}}]") &&
                    !accepts(g, "<|tool_call|>[{\"name\":\"time\",\"arguments\":{}}, {\"name\":\"time\",\"arguments\":{}}]"),
                "a single call");
        nv_grammar_unref(g);
    }
    cJSON_Delete(tools);
}

/* Mistral's later calls: [TOOL_CALLS]NAME[ARGS]{...}, more right after each (parallel), held to the schemas. */
static void test_name_args_calls(void) {
    cJSON *tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"play\",\"parameters\":{\"type\":\"object\","
                               "\"properties\":{\"toy\":{\"enum\":[\"ball\",\"car\"]}},\"required\":[\"toy\"]}}},"
                               "{\"type\":\"function\",\"function\":{\"name\":\"time\"}}]");
    const nv_call_frame frame = {.prefix = "[TOOL_CALLS]", .suffix = "", .sep = "", .name_args = "[ARGS]"};
    const char *good[] = {"[TOOL_CALLS]play[ARGS]{\"toy\": \"car\"}", "[TOOL_CALLS]time[ARGS]{}[TOOL_CALLS]play[ARGS]{\"toy\":\"ball\"}",
                          "[TOOL_CALLS]time[ARGS]{\"any\": [1]}\n"};
    const char *bad[] = {"[TOOL_CALLS]play[ARGS]{\"toy\": \"doll\"}", "[TOOL_CALLS]play{\"toy\": \"car\"}", "[TOOL_CALLS]fly[ARGS]{}",
                         "[TOOL_CALLS] play[ARGS]{\"toy\": \"car\"}", "play[ARGS]{}"};
    calls_cases(tools, &frame, good, sizeof good / sizeof good[0], bad, sizeof bad / sizeof bad[0]);
    cJSON_Delete(tools);
}

/* Tools beside an answer format (response_format): Hermes calls, one or more, or instead the answer
 * in the format (a schema, or any object), after white space; nothing of both, nothing else. */
static void test_calls_or_answer(void) {
    cJSON *tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"play\",\"parameters\":{\"type\":\"object\","
                               "\"properties\":{\"toy\":{\"enum\":[\"ball\",\"car\"]}},\"required\":[\"toy\"]}}}]");
    cJSON *answer = cJSON_Parse("{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":5},"
                                "\"$defs_use\":{\"$ref\":\"#/$defs/n\"}},\"required\":[\"city\"],\"additionalProperties\":false,"
                                "\"$defs\":{\"n\":{\"type\":\"integer\"}}}");
    const nv_call_frame hermes = {.args_key = "arguments", .prefix = "<tool_call>\n", .suffix = "\n</tool_call>", .sep = "\n"};
    nv_grammar *g = NULL;
    T_CHECK(nv_tool_calls_grammar(tools, NULL, &hermes, 0, 0, answer, 0, &g) == NV_OK, "%s", nv_errmsg());
    if (g) {
        const char *good[] = {"<tool_call>\n{\"name\": \"play\", \"arguments\": {\"toy\": \"car\"}}\n</tool_call>",
                              "<tool_call>\n{\"name\": \"play\", \"arguments\": {\"toy\": \"car\"}}\n</tool_call>\n<tool_call>\n"
                              "{\"name\": \"play\", \"arguments\": {\"toy\": \"ball\"}}\n</tool_call>\n",
                              "{\"city\": \"Oslo\"}", "\n {\"city\":\"Rome\",\"$defs_use\":3}"};
        for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) T_CHECK(accepts(g, good[i]), "accepts %s", good[i]);
        const char *bad[] = {"{\"city\": \"Copenhagen\"}", "{\"toy\": \"car\"}", "Sure: {\"city\": \"Oslo\"}",
                             "{\"city\": \"Oslo\"}<tool_call>\n{\"name\": \"play\", \"arguments\": {\"toy\": \"car\"}}\n</tool_call>",
                             "<tool_call>\n{\"name\": \"play\", \"arguments\": {\"toy\": \"car\"}}\n</tool_call>{\"city\": \"Oslo\"}"};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) T_CHECK(!accepts(g, bad[i]), "refuses %s", bad[i]);
        nv_grammar_unref(g);
    }
    T_CHECK(nv_tool_calls_grammar(tools, NULL, &hermes, 0, 0, NULL, 1, &g) == NV_OK, "%s", nv_errmsg());
    if (g) {
        T_CHECK(accepts(g, "{\"anything\": [1, 2]}") && !accepts(g, "[1, 2]") &&
                    accepts(g, "<tool_call>\n{\"name\": \"play\", \"arguments\": {\"toy\": \"ball\"}}\n</tool_call>"),
                "a call or any object");
        nv_grammar_unref(g);
    }
    cJSON *bad_answer = cJSON_Parse("{\"type\":\"object\",\"properties\":{\"x\":{\"$ref\":\"#/nowhere\"}}}");
    T_CHECK(nv_tool_calls_grammar(tools, NULL, &hermes, 0, 0, bad_answer, 0, &g) != NV_OK && !g && strstr(nv_errmsg(), "the answer's format"),
            "a format that cannot be compiled: %s", nv_errmsg());
    cJSON_Delete(bad_answer);
    cJSON_Delete(answer);
    cJSON_Delete(tools);
}

/* Tool calls written as XML (Qwen3-Coder's form): each parameter in its block in the schema's order,
 * a string as it is (its enum, pattern, format and lengths held), any other value as its JSON text,
 * a parameter that may be a string or more as any text without "</parameter>"; and the schemas the
 * form cannot hold, refused with a reason. */
static void test_xml_calls(void) {
    cJSON *tools = cJSON_Parse(
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{"
        "\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":7},"
        "\"unit\":{\"enum\":[\"c\",\"f\"]},\"code\":{\"$ref\":\"#/$defs/code\"},\"at\":{\"type\":\"string\",\"format\":\"date\"},"
        "\"tag\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":3},\"note\":{\"type\":[\"string\",\"null\"]},"
        "\"opts\":{\"type\":\"object\",\"properties\":{\"hourly\":{\"type\":\"boolean\"}},\"required\":[\"hourly\"]}},"
        "\"required\":[\"city\",\"days\"],\"$defs\":{\"code\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}$\"}}}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"time\"}}]");
    const nv_call_frame xml = {.prefix = "<tool_call>\n", .suffix = "\n</tool_call>", .sep = "\n", .xml = 1};
    nv_grammar *g = NULL;
    T_CHECK(nv_tool_calls_grammar(tools, NULL, &xml, 0, 0, NULL, 0, &g) == NV_OK, "%s", nv_errmsg());
    if (g) {
        const char *good[] = {
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
            "</function>\n</tool_call>",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan \"Jose\" <b>\nCA\n</parameter>\n<parameter=days>\n7\n"
            "</parameter>\n<parameter=unit>\nf\n</parameter>\n<parameter=code>\nUS\n</parameter>\n<parameter=at>\n2026-12-07\n"
            "</parameter>\n<parameter=tag>\nab\n</parameter>\n<parameter=note>\nnull\n</parameter>\n<parameter=opts>\n"
            "{\"hourly\": true}\n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\n\n</parameter>\n<parameter=days>\n1\n</parameter>\n"
            "</function>\n</tool_call>\n<tool_call>\n<function=time>\n<parameter=any name>\n1 < 2\n</parameter>\n</function>\n"
            "</tool_call>\n",
            "<tool_call>\n<function=time>\n</function>\n</tool_call>"};
        for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) T_CHECK(accepts(g, good[i]), "accepts %s", good[i]);
        const char *bad[] = {
            /* days missing; out of range; as a JSON string; city after days; an unknown parameter */
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n9\n</parameter>\n"
            "</function>\n</tool_call>",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n\"3\"\n</parameter>\n"
            "</function>\n</tool_call>",
            "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n<parameter=city>\nOslo\n</parameter>\n"
            "</function>\n</tool_call>",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
            "<parameter=wind>\n3\n</parameter>\n</function>\n</tool_call>",
            /* a string that holds the closing; an enum's value as JSON; a pattern, a date, lengths broken */
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nA</parameter>B\n</parameter>\n<parameter=days>\n3\n"
            "</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nX\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
            "<parameter=unit>\n\"c\"\n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nX\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
            "<parameter=code>\nUSA\n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nX\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
            "<parameter=at>\n2026-13-07\n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nX\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
            "<parameter=tag>\nabcd\n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nX\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
            "<parameter=tag>\na<\n</parameter>\n</function>\n</tool_call>",
            /* an object parameter breaking its schema; an unknown tool; JSON in place of XML */
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nX\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
            "<parameter=opts>\n{}\n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=fly>\n</function>\n</tool_call>",
            "<tool_call>\n{\"name\": \"time\", \"arguments\": {}}\n</tool_call>"};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) T_CHECK(!accepts(g, bad[i]), "refuses %s", bad[i]);
        nv_grammar_unref(g);
    }
    /* under tool_choice auto the same grammar comes on lazily at "<tool_call>": the call from there
       is held to it, and it is whole at "</tool_call>" (more may follow after a line break) */
    T_CHECK(nv_tool_calls_grammar(tools, NULL, &xml, 1, 0, NULL, 0, &g) == NV_OK, "%s", nv_errmsg());
    if (g) {
        nv_glazy z;
        nv_gsampler gs = {0};
        T_CHECK(nv_glazy_init(&z, g, "<tool_call>", 0) == NV_OK, "%s", nv_errmsg());
        T_CHECK(nv_glazy_step(&z, &gs, 16, "Let me look. <tool") == 0 && !gs.m, "off before the trigger");
        T_CHECK(nv_glazy_step(&z, &gs, 16, "_call>\n<function=time>\n") == 1 && gs.m, "on at the trigger");
        const char *rest = "<parameter=x>\n1 < 2\n</parameter>\n</function>\n</tool_call>";
        T_CHECK(gs.m && nv_gmatch_feed(gs.m, rest, strlen(rest)) && nv_gmatch_done(gs.m) && !nv_gmatch_finished(gs.m),
                "a whole call, and room for another");
        T_CHECK(gs.m && !nv_gmatch_try(gs.m, "{", 1) && nv_gmatch_try(gs.m, "\n<tool_call>\n<function=", 23), "only another call");
        nv_gsampler_free(&gs);
        nv_glazy_free(&z);
        nv_grammar_unref(g);
    }
    /* a string's pattern need only match somewhere in it (JSON's 'pattern'), and no string held to one
       holds '<'; a value in JSON writes '<' as \u003c; a listed string may not hold the closing */
    cJSON *more = cJSON_Parse(
        "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{"
        "\"url\":{\"type\":\"string\",\"pattern\":\"^https?://\"},\"digit\":{\"type\":\"string\",\"pattern\":\"[0-9]\"},"
        "\"o\":{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\"}}}}}}}]");
    T_CHECK(nv_tool_calls_grammar(more, NULL, &xml, 0, 0, NULL, 0, &g) == NV_OK, "%s", nv_errmsg());
    if (g) {
#define XF(body) "<tool_call>\n<function=f>\n" body "</function>\n</tool_call>"
        const char *ok[] = {XF("<parameter=url>\nhttps://x.org/a?b=1\n</parameter>\n"), XF("<parameter=digit>\nabc1def\n</parameter>\n"),
                            XF("<parameter=o>\n{\"s\": \"\\u003c/parameter>\"}\n</parameter>\n")};
        for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) T_CHECK(accepts(g, ok[i]), "accepts %s", ok[i]);
        const char *no[] = {XF("<parameter=url>\nftp://x\n</parameter>\n"), XF("<parameter=digit>\nabc\n</parameter>\n"),
                            XF("<parameter=digit>\n<1\n</parameter>\n"), XF("<parameter=o>\n{\"s\": \"</parameter>\"}\n</parameter>\n"),
                            XF("<parameter=o>\n{\"s\": \"a<b\"}\n</parameter>\n")};
        for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) T_CHECK(!accepts(g, no[i]), "refuses %s", no[i]);
        nv_grammar_unref(g);
    }
    cJSON_Delete(more);
    /* under auto a tool the form cannot hold is still callable, with any parameters */
    more = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"anyOf\":[{\"type\":\"object\"}]}}},"
                       "{\"type\":\"function\",\"function\":{\"name\":\"time\",\"parameters\":{\"type\":\"object\",\"properties\":{},"
                       "\"additionalProperties\":false}}}]");
    T_CHECK(nv_tool_calls_grammar(more, NULL, &xml, 1, 0, NULL, 0, &g) == NV_OK, "%s", nv_errmsg());
    if (g) {
        T_CHECK(accepts(g, XF("<parameter=any>\nthing\n</parameter>\n")) && accepts(g, "<tool_call>\n<function=time>\n</function>\n</tool_call>") &&
                    !accepts(g, "<tool_call>\n<function=time>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>"),
                "a tool left unheld is called freely, the others held");
        nv_grammar_unref(g);
    }
    cJSON_Delete(more);
#undef XF
    /* what a string parameter cannot be held to here is refused, naming it */
    const char *refused[][2] = {
        {"{\"type\":\"object\",\"properties\":{\"x\":{\"anyOf\":[{\"type\":\"string\",\"pattern\":\"a\"},{\"type\":\"integer\"}]}}}",
         "may be a string or another value"},
        {"{\"type\":\"object\",\"properties\":{\"a<b\":{\"type\":\"string\"}}}", "cannot be written"},
        {"{\"anyOf\":[{\"type\":\"object\"}]}", "'anyOf' on a tool's parameters"},
        {"{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\",\"pattern\":\"a\",\"maxLength\":3}}}", "beside 'pattern'"},
        {"{\"type\":\"array\"}", "of type 'object'"},
        {"{\"type\":\"object\",\"properties\":{\"x\":{\"enum\":[\"a</parameter>b\"]}}}", "holding \"</parameter>\""},
        {"{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\",\"pattern\":\"^<b>$\"}}}", "'<' cannot be held"},
        {"{\"type\":\"object\",\"properties\":{\"x\":{\"anyOf\":[{\"type\":\"string\"}],\"allOf\":[{\"type\":\"string\"}]}}}",
         "'allOf' beside 'anyOf'"},
        {"{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\",\"enum\":[]}}}", "non-empty"},
        {"{\"type\":\"object\",\"properties\":{\"x\":{\"anyOf\":[{\"type\":\"integer\"},{\"$ref\":\"#/nowhere\"}]}}}",
         "not read whole"},
        {"{\"type\":\"object\",\"properties\":{\"x\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"integer\",\"minimum\":0}]}}}",
         "names types alone"},
        {"{\"type\":\"object\",\"properties\":{\"x\":false}}", "names types alone"},
        {"{\"type\":\"object\",\"properties\":{\"x\":{\"type\":7}}}", "names types alone"},
        {"{\"type\":\"object\",\"properties\":{\"o\":{\"type\":\"object\",\"properties\":{\"a</parameter>\":{}}}}}", "a member named"},
        {"{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\",\"pattern\":\"a\\\\u0000\"}}}", "NUL cannot"}};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char text[1024];
        snprintf(text, sizeof text, "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":%s}}]", refused[i][0]);
        cJSON *t = cJSON_Parse(text);
        T_CHECK(nv_tool_calls_grammar(t, NULL, &xml, 0, 0, NULL, 0, &g) != NV_OK && !g && strstr(nv_errmsg(), refused[i][1]),
                "%s: %s", refused[i][0], nv_errmsg());
        cJSON_Delete(t);
    }
    /* references that multiply (3 to the next level, 20 levels down to a string): refused at once, not
       walked 3^20 times */
    char wide[8192];
    size_t at = (size_t)snprintf(wide, sizeof wide, "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{"
                                                   "\"type\":\"object\",\"properties\":{\"x\":{\"$ref\":\"#/$defs/l0\"}},\"$defs\":{");
    for (int level = 0; level < 20; level++)
        at += (size_t)snprintf(wide + at, sizeof wide - at, "\"l%d\":{\"anyOf\":[{\"$ref\":\"#/$defs/l%d\"},{\"$ref\":\"#/$defs/l%d\"},"
                               "{\"$ref\":\"#/$defs/l%d\"}]},", level, level + 1, level + 1, level + 1);
    snprintf(wide + at, sizeof wide - at, "\"l20\":{\"type\":\"string\"}}}}}]");
    cJSON *wt = cJSON_Parse(wide);
    const double t0 = nv_now();
    T_CHECK(wt && nv_tool_calls_grammar(wt, NULL, &xml, 0, 0, NULL, 0, &g) != NV_OK && !g && nv_now() - t0 < 5.0,
            "references that multiply: %s (%.1f s)", nv_errmsg(), nv_now() - t0);
    cJSON_Delete(wt);
    /* a value's kinds, which the parser reads the text by */
    cJSON *doc = cJSON_Parse("{\"$defs\":{\"s\":{\"type\":\"string\"}}}");
    const char *kinds[][2] = {{"{\"type\":\"string\"}", "1"}, {"{\"type\":[\"integer\",\"null\"]}", "20"}, {"{\"enum\":[\"a\",1.5]}", "3"},
                              {"{\"$ref\":\"#/$defs/s\"}", "1"}, {"{\"anyOf\":[{\"type\":\"boolean\"},{}]}", "0"},
                              {"{\"properties\":{}}", "32"}, {"{}", "0"}, {"{\"$ref\":\"#/nowhere\"}", "0"},
                              {"{\"allOf\":[{\"type\":[\"string\",\"number\"]},{\"type\":\"number\"}]}", "6"}};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        cJSON *s = cJSON_Parse(kinds[i][0]);
        T_CHECK(nv_schema_kinds(s, doc) == (unsigned)atoi(kinds[i][1]), "%s: %u", kinds[i][0], nv_schema_kinds(s, doc));
        cJSON_Delete(s);
    }
    cJSON_Delete(doc);
    /* branches that multiply (8 references to the next level, 7 levels down to a string): the walk
       stops at its limit of work and says "any" instead of taking 8^7 steps */
    char deep[4096] = "{\"$defs\":{";
    for (int level = 0; level < 7; level++) {
        size_t at = strlen(deep);
        at += (size_t)snprintf(deep + at, sizeof deep - at, "%s\"l%d\":{\"anyOf\":[", level ? "," : "", level);
        for (int k = 0; k < 8; k++) at += (size_t)snprintf(deep + at, sizeof deep - at, "%s{\"$ref\":\"#/$defs/l%d\"}", k ? "," : "", level + 1);
        snprintf(deep + at, sizeof deep - at, "]}");
    }
    strncat(deep, ",\"l7\":{\"type\":\"string\"}}}", sizeof deep - strlen(deep) - 1);
    doc = cJSON_Parse(deep);
    cJSON *top = cJSON_Parse("{\"allOf\":[{\"type\":\"string\"},{\"$ref\":\"#/$defs/l0\"}]}"), *near = cJSON_Parse("{\"$ref\":\"#/$defs/l6\"}");
    T_CHECK(doc && nv_schema_kinds(top, doc) == 0 && nv_schema_kinds(near, doc) == 1, "a walk that multiplies: %u, near the end %u",
            nv_schema_kinds(top, doc), nv_schema_kinds(near, doc));
    cJSON_Delete(top);
    cJSON_Delete(near);
    cJSON_Delete(doc);
    cJSON_Delete(tools);
}

static void test_lazy(void) {
    cJSON *schema = cJSON_Parse("{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"play\"}},\"required\":[\"name\"]}");
    nv_grammar *g = NULL;
    T_CHECK(nv_schema_grammar_framed(schema, "<tool_call>\n", "\n</tool_call>", NULL, &g) == NV_OK, "%s", nv_errmsg());
    cJSON_Delete(schema);
    if (!g) return;
    nv_glazy z;
    nv_gsampler gs = {0};
    T_CHECK(nv_glazy_init(&z, g, "<tool_call>", 0) == NV_OK, "%s", nv_errmsg());
    const char *before[] = {"Sure", ". I will <", "tool", "_c"};
    for (int i = 0; i < 4; i++) T_CHECK(nv_glazy_step(&z, &gs, 16, before[i]) == 0 && !gs.m, "off before the trigger (%d)", i);
    T_CHECK(nv_glazy_step(&z, &gs, 16, "all>\n{\"na") == 1 && gs.m, "on at the trigger's last byte");
    if (gs.m) {
        T_CHECK(nv_gmatch_try(gs.m, "me\": \"play\"}\n</tool_call>", 25) && !nv_gmatch_try(gs.m, "me\": \"fly\"", 10),
                "the matcher is past the trigger and the text after it");
        T_CHECK(nv_gmatch_feed(gs.m, "me\":\"play\"}\n</tool_call>", 24) == 1 && nv_gmatch_finished(gs.m), "a whole call");
    }
    nv_gsampler_free(&gs);
    /* off again: a second call is found the same way; text the grammar refuses leaves it off */
    T_CHECK(nv_glazy_step(&z, &gs, 16, " and <tool_call>\n{") == 1 && gs.m, "a second trigger");
    nv_gsampler_free(&gs);
    T_CHECK(nv_glazy_step(&z, &gs, 16, "<tool_call>oops") == 0 && !gs.m, "refused right after the trigger");
    nv_glazy_free(&z);
    /* at the start only: blank lines first are fine, text first is not */
    T_CHECK(nv_glazy_init(&z, g, "<tool_call>", 1) == NV_OK, "%s", nv_errmsg());
    T_CHECK(nv_glazy_step(&z, &gs, 16, " \n") == 0 && nv_glazy_step(&z, &gs, 16, "<tool") == 0 &&
                nv_glazy_step(&z, &gs, 16, "_call>\n") == 1 && gs.m,
            "at the start, over three pieces");
    nv_gsampler_free(&gs);
    nv_glazy_free(&z);
    T_CHECK(nv_glazy_init(&z, g, "<tool_call>", 1) == NV_OK, "%s", nv_errmsg());
    T_CHECK(nv_glazy_step(&z, &gs, 16, "Hi ") == 0 && nv_glazy_step(&z, &gs, 16, "<tool_call>\n{") == 0 && !gs.m,
            "not at the start: never");
    nv_glazy_free(&z);
    nv_grammar_unref(g);
}

int main(void) {
    T_RUN(test_builder_and_matcher);
    T_RUN(test_json_object);
    T_RUN(test_schemas);
    T_RUN(test_schema_refusals);
    T_RUN(test_mask);
    T_RUN(test_tool_call_list);
    T_RUN(test_calls_or_answer);
    T_RUN(test_xml_calls);
    T_RUN(test_name_args_calls);
    T_RUN(test_lazy);
    T_RUN(test_think);
    return t_done();
}
