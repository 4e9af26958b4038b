/* nerve bench grammar: what constrained decoding costs per token, on a real vocabulary. */
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/timer.h"
#include "cli/bench.h"
#include "cli/cli.h"
#include "model/grammar.h"
#include "serve/schema.h"

#define CMD "bench grammar"

typedef struct {
    nv_gmatch *m;
    const nv_gtrie *tr;
    const nv_tokenizer *tok;
    uint8_t *mask;
    int vocab, allowed, probe;
} grammar_ctx;

static void run_mask(void *p) {
    grammar_ctx *c = p;
    c->allowed = nv_gmatch_mask(c->m, c->tr, c->mask);
}

/* The peer: asking the grammar about every token in turn, as a mask without the trie would. */
static void run_scan(void *p) {
    grammar_ctx *c = p;
    int n = 0;
    for (int v = 0; v < c->vocab; v++) n += nv_gmatch_allows(c->m, c->tok, NV_TOKEN_EOS, v);
    c->allowed = n;
}

/* What the sampler does first: one token's text against the grammar. */
static void run_check(void *p) {
    grammar_ctx *c = p;
    for (int i = 0; i < 1000; i++) c->allowed = nv_gmatch_allows(c->m, c->tok, NV_TOKEN_EOS, c->probe);
}

int bench_grammar(int argc, char **argv, const bench_opts *o) {
    const char *tok_path = NULL;
    const int arc = bench_tokenizer_arg(CMD, argc, argv, &tok_path);
    if (arc) return arc;
    char path[4096];
    if (!tok_path) {
        if (!nv_data_path("tokenizers/tokenizer.bin", path, sizeof path)) {
            bench_row r;
            row_begin(&r, "grammar", "cpu", 1);
            row_fail(&r, "no ../shared/data/tokenizers/tokenizer.bin (set NERVE_DATA, or -z TOKENIZER)");
            row_end(&r, o);
            return 0;
        }
        tok_path = path;
    }
    nv_tokenizer *tok = NULL;
    if (nv_tokenizer_load(tok_path, 0, &tok) != NV_OK) return cli_error(CMD, 1, "%s", nv_errmsg());
    const int vocab = nv_tokenizer_vocab_size(tok);
    nv_gtrie *tr = NULL;
    double t0 = nv_now();
    nv_err e = nv_gtrie_build(tok, &tr);
    double trie_ms = (nv_now() - t0) * 1e3;
    /* (size: multipleOf digit by digit, its remainder the state; colors: uniqueItems, a rule per set of ten) */
    const char *schema_text = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\","
                              "\"minimum\":0,\"maximum\":150},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
                              "\"size\":{\"type\":\"integer\",\"minimum\":0,\"multipleOf\":7},\"colors\":{\"type\":\"array\",\"items\":{"
                              "\"enum\":[\"red\",\"orange\",\"yellow\",\"green\",\"blue\",\"indigo\",\"violet\",\"black\",\"white\",\"grey\"]},"
                              "\"uniqueItems\":true}},\"required\":[\"name\",\"age\",\"tags\",\"size\",\"colors\"]}";
    cJSON *schema = cJSON_Parse(schema_text);
    nv_grammar *g = NULL, *gx = NULL;
    if (e == NV_OK) e = nv_schema_grammar(schema, &g);
    /* the same arguments in a tool call written as XML (Qwen3-Coder's form): a string as it is */
    cJSON_Delete(schema);
    char tools_text[2048];
    snprintf(tools_text, sizeof tools_text, "[{\"type\":\"function\",\"function\":{\"name\":\"person\",\"parameters\":%s}}]", schema_text);
    cJSON *tools = cJSON_Parse(tools_text);
    if (!tools && e == NV_OK) e = nv_fail(NV_ENOMEM, "out of memory");
    const nv_call_frame xml = {.prefix = "<tool_call>\n", .suffix = "\n</tool_call>", .xml = 1};
    if (e == NV_OK) e = nv_tool_calls_grammar(tools, NULL, &xml, 0, 0, NULL, 0, &gx);
    cJSON_Delete(tools);
    uint8_t *mask = malloc((size_t)vocab);
    if (e != NV_OK || !mask) {
        free(mask);
        nv_grammar_unref(g);
        nv_grammar_unref(gx);
        nv_gtrie_free(tr);
        nv_tokenizer_free(tok);
        return cli_error(CMD, 1, "%s", e != NV_OK ? nv_errmsg() : "out of memory");
    }
    /* where a JSON answer spends its tokens: the states a mask is asked for */
    static const struct {
        const char *name, *prefix;
        int xml;
    } states[] = {
        {"start", "", 0},
        {"key", "{\"name\": \"Ann\", ", 0},
        {"string", "{\"name\": \"Once upon a time there ", 0},
        {"integer", "{\"name\": \"Ann\", \"age\": 1", 0},
        {"array", "{\"name\": \"Ann\", \"age\": 7, \"tags\": [\"a\", ", 0},
        {"multiple_of", "{\"name\": \"Ann\", \"age\": 7, \"tags\": [], \"size\": 14", 0},
        {"unique_items", "{\"name\": \"Ann\", \"age\": 7, \"tags\": [], \"size\": 14, \"colors\": [\"red\", \"blue\", ", 0},
        {"xml_string", "<tool_call>\n<function=person>\n<parameter=name>\nOnce upon a time there ", 1},
        {"xml_integer", "<tool_call>\n<function=person>\n<parameter=name>\nAnn\n</parameter>\n<parameter=age>\n1", 1},
    };
    const double min_s = o->quick ? 0.05 : 0.5;
    for (size_t i = 0; i < sizeof states / sizeof states[0]; i++) {
        grammar_ctx c = {nv_gmatch_new(states[i].xml ? gx : g), tr, tok, mask, vocab, 0, nv_tokenizer_lookup(tok, "▁the")};
        if (c.probe < 0) c.probe = vocab / 2;
        bench_row r;
        row_begin(&r, "grammar", "cpu", 1);
        row_str(&r, "state", states[i].name);
        row_int(&r, "vocab", vocab);
        if (!c.m || nv_gmatch_feed(c.m, states[i].prefix, strlen(states[i].prefix)) != 1) {
            row_fail(&r, "the state's text does not fit the grammar");
            row_end(&r, o);
            nv_gmatch_free(c.m);
            continue;
        }
        double mask_s = bench_median(run_mask, &c, 3, min_s, NULL);
        int allowed = c.allowed;
        double scan_s = bench_median(run_scan, &c, o->quick ? 1 : 3, min_s, NULL);
        double check_s = bench_median(run_check, &c, 3, min_s / 5, NULL) / 1000;
        row_int(&r, "allowed", allowed);
        row_num(&r, "mask_ms", mask_s * 1e3);
        row_num(&r, "token_by_token_ms", scan_s * 1e3);
        row_num(&r, "speedup", scan_s / mask_s);
        row_num(&r, "one_token_us", check_s * 1e6);
        row_num(&r, "trie_ms", trie_ms);
        row_end(&r, o);
        nv_gmatch_free(c.m);
    }
    free(mask);
    nv_grammar_unref(g);
    nv_grammar_unref(gx);
    nv_gtrie_free(tr);
    nv_tokenizer_free(tok);
    return 0;
}
