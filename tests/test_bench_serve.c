/* nerve bench serve, nerve bench prefix, nerve bench rerank, nerve bench spec and nerve bench preempt, --quick (a stories260K-shaped model): each runs a
 * real server as a child process and prints one JSON row per clients value / per case, with the
 * fields of ../shared/design.md "Benchmarks". Speed targets are not checked here (benchmarks
 * measure, tests check): only that the rows are there, well formed and plausible. */
#include <cjson/cJSON.h>

#include "t.h"

/* Parses stdout's JSON Lines into rows[]; returns how many (-1 on a malformed line). */
static int parse_rows(const char *out, cJSON **rows, int cap) {
    int n = 0;
    const char *p = out;
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        if (len) {
            cJSON *row = cJSON_ParseWithLength(p, len);
            if (!row || n == cap) {
                cJSON_Delete(row);
                return -1;
            }
            rows[n++] = row;
        }
        p += len + (nl ? 1 : 0);
    }
    return n;
}

static double num(const cJSON *row, const char *key) {
    const cJSON *v = cJSON_GetObjectItem(row, key);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

static const char *str(const cJSON *row, const char *key) {
    const cJSON *v = cJSON_GetObjectItem(row, key);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static int has_data(void) {
    return t_data("models/tok512.bin") != NULL;
}

static void test_bench_serve_quick(void) {
    if (!has_data()) return;
    /* the tiny model decodes a token in well under a millisecond, so a stream's events can reach
       the client in one read (gaps of 0); the server's test hook (inherited by the child server)
       spaces steps so that every figure is measurable */
    setenv("NERVE_TEST_STEP_DELAY_MS", "2", 1);
    int rc = t_nerve("bench serve --quick --json");
    T_CHECK(rc == 0, "exit %d: %s", rc, t_err);
    cJSON *rows[16];
    int n = parse_rows(t_out, rows, 16);
    T_CHECK(n == 3, "%d rows: %s", n, t_out);
    static const int clients[3] = {1, 4, 16};
    for (int i = 0; i < n && i < 3; i++) {
        const cJSON *r = rows[i];
        T_CHECK(!strcmp(str(r, "bench"), "serve") && str(r, "engine")[0] && num(r, "threads") >= 1, "row %d head", i);
        T_CHECK(num(r, "clients") == clients[i] && num(r, "requests") == clients[i] * 2, "row %d clients %g", i,
                num(r, "clients"));
        T_CHECK(!cJSON_GetObjectItem(r, "ok"), "row %d failed: %s", i, str(r, "why"));
        T_CHECK(num(r, "tokens_per_s") > 0 && num(r, "decode_tokens_per_s") > 0 && num(r, "completion_tokens") > 0,
                "row %d throughput", i);
        T_CHECK(num(r, "ttft_ms_p50") > 0 && num(r, "ttft_ms_p99") >= num(r, "ttft_ms_p50"), "row %d TTFT %g %g", i,
                num(r, "ttft_ms_p50"), num(r, "ttft_ms_p99"));
        T_CHECK(num(r, "itl_ms_p50") > 0 && num(r, "itl_ms_p99") >= num(r, "itl_ms_p50"), "row %d ITL", i);
        T_CHECK(num(r, "ratio_vs") > 0 && !strcmp(str(r, "model"), "stories260K"), "row %d ratio", i);
    }
    for (int i = 0; i < n; i++) cJSON_Delete(rows[i]);
    /* the readable table: one line per clients value */
    rc = t_nerve("bench serve --quick --clients 2 --requests 1");
    T_CHECK(rc == 0 && strstr(t_out, "clients=2") && strstr(t_out, "itl_ms_p50="), "table: %s %s", t_out, t_err);
    T_CHECK(t_nerve("bench serve --clients 0") == 2, "a bad --clients accepted");
    /* with adapters: each clients value three times, the base model's row, then the adapters' named as
       models and mixed two at a time by lora lists, each against the base's */
    rc = t_nerve("bench serve --quick --json --clients 2 --requests 1 --lora-rank 4 --adapters 2");
    n = parse_rows(t_out, rows, 16);
    T_CHECK(rc == 0 && n == 3, "exit %d, %d rows: %s %s", rc, n, t_out, t_err);
    if (n == 3) {
        T_CHECK(!strcmp(str(rows[0], "model"), "stories260K") && strstr(str(rows[1], "model"), "2 LoRA adapters of rank 4") &&
                    strstr(str(rows[2], "model"), "two at 0.5 each per request (lora lists)"),
                "%s / %s", str(rows[1], "model"), str(rows[2], "model"));
        for (int k = 1; k < 3; k++)
            T_CHECK(!cJSON_GetObjectItem(rows[k], "ok") && num(rows[k], "decode_tokens_per_s") > 0 && num(rows[k], "ratio_vs") > 0 &&
                        strstr(str(rows[k], "ratio_of"), "base model"),
                    "the adapters' row %d: %s", k, t_out);
    }
    for (int i = 0; i < n; i++) cJSON_Delete(rows[i]);
    T_CHECK(t_nerve("bench serve --adapters 0") == 2, "a bad --adapters accepted");
    unsetenv("NERVE_TEST_STEP_DELAY_MS");
}

static void test_bench_prefix_quick(void) {
    if (!has_data()) return;
    int rc = t_nerve("bench prefix --quick --json");
    T_CHECK(rc == 0, "exit %d: %s", rc, t_err);
    cJSON *rows[16];
    int n = parse_rows(t_out, rows, 16);
    T_CHECK(n == 3, "%d rows: %s", n, t_out);
    static const char *cases[3] = {"cold", "ram", "disk"};
    for (int i = 0; i < n && i < 3; i++) {
        const cJSON *r = rows[i];
        T_CHECK(!strcmp(str(r, "bench"), "prefix") && !strcmp(str(r, "case"), cases[i]) && str(r, "engine")[0], "row %d: %s",
                i, str(r, "case"));
        T_CHECK(!cJSON_GetObjectItem(r, "ok"), "row %d failed: %s", i, str(r, "why"));
        T_CHECK(num(r, "ttft_ms_p50") > 0 && num(r, "seq") == 420 && num(r, "prefix") == 400, "row %d", i);
        /* the hits were real: the whole prefix came from the cache (and nothing, cold) */
        T_CHECK(num(r, "cached_tokens") == (i == 0 ? 0 : 400), "row %d cached %g", i, num(r, "cached_tokens"));
        if (i > 0) T_CHECK(num(r, "ratio_vs") > 0, "row %d ratio", i);
    }
    for (int i = 0; i < n; i++) cJSON_Delete(rows[i]);
}

/* bench rerank: a row with the prefix cache and one without, the same prompts in both */
static void test_bench_rerank_quick(void) {
    if (!has_data()) return;
    int rc = t_nerve("bench rerank --quick --json --docs 4 --query-words 20 --doc-words 10");
    T_CHECK(rc == 0, "exit %d: %s", rc, t_err);
    cJSON *rows[4];
    int n = parse_rows(t_out, rows, 4);
    T_CHECK(n == 2, "%d rows: %s", n, t_out);
    static const char *cases[2] = {"prefix-cache", "no-prefix-cache"};
    for (int i = 0; i < n && i < 2; i++) {
        const cJSON *r = rows[i];
        T_CHECK(!strcmp(str(r, "bench"), "rerank") && !strcmp(str(r, "case"), cases[i]) && !cJSON_GetObjectItem(r, "ok"), "row %d: %s %s", i,
                str(r, "case"), str(r, "why"));
        T_CHECK(num(r, "docs") == 4 && num(r, "docs_per_s") > 0 && num(r, "prompt_tokens_per_request") > 4 * 30 &&
                    num(r, "prompt_tokens_per_request") == num(rows[0], "prompt_tokens_per_request"),
                "row %d", i);
    }
    if (n >= 1) T_CHECK(num(rows[0], "ratio_vs") > 0 && !strcmp(str(rows[0], "ratio_of"), "no-prefix-cache"), "the ratio");
    for (int i = 0; i < n; i++) cJSON_Delete(rows[i]);
    T_CHECK(t_nerve("bench rerank --docs 0") == 2, "a bad --docs accepted");
}

/* bench spec: the same requests with and without drafts; identical texts, drafts accepted on the
 * greedy story, and most of the predicted answers' tokens taken from their predictions (the trained stories260K repeats itself within 150 tokens on the fp32 engines; an
 * engine that rounds differently, as the int8 ones, tells another story, so the engine is named:
 * avx2, the same bits on every machine). */
static void test_bench_spec_quick(void) {
    if (!has_data() || !t_data("models/stories260K.bin")) return;
    int rc = t_nerve("bench spec --quick --json --tokens 150 --engine avx2");
    T_CHECK(rc == 0, "exit %d: %s", rc, t_err);
    cJSON *rows[16];
    int n = parse_rows(t_out, rows, 16);
    T_CHECK(n == 3, "%d rows: %s", n, t_out);
    static const char *cases[3] = {"greedy", "sampled", "predicted"};
    for (int i = 0; i < n && i < 3; i++) {
        const cJSON *r = rows[i];
        T_CHECK(!strcmp(str(r, "bench"), "spec") && !strcmp(str(r, "case"), cases[i]) && num(r, "clients") == 1, "row %d", i);
        T_CHECK(!cJSON_GetObjectItem(r, "ok") && cJSON_IsTrue(cJSON_GetObjectItem(r, "identical")), "row %d: %s", i, str(r, "why"));
        T_CHECK(num(r, "tokens_per_s") > 0 && num(r, "tokens_per_s_no_drafts") > 0 && num(r, "ratio_vs") > 0 &&
                    num(r, "completion_tokens") == 150,
                "row %d figures", i);
        T_CHECK(num(r, "acceptance") >= 0 && num(r, "acceptance") <= 1 && num(r, "tokens_per_step_no_drafts") <= 1.0001, "row %d", i);
    }
    if (n >= 1) T_CHECK(num(rows[0], "tokens_per_step") > 1.05 && num(rows[0], "acceptance") > 0, "greedy: %g tokens a step",
                        num(rows[0], "tokens_per_step"));
    if (n >= 3) T_CHECK(num(rows[2], "tokens_per_step") > 4 && num(rows[2], "acceptance") > 0.5, "predicted: %g tokens a step, acceptance %g",
                        num(rows[2], "tokens_per_step"), num(rows[2], "acceptance"));
    for (int i = 0; i < n; i++) cJSON_Delete(rows[i]);
    T_CHECK(t_nerve("bench spec --spec-tokens 17") == 2, "--spec-tokens 17 accepted");
    T_CHECK(t_nerve("bench spec --draft-engine avx2") == 2, "--draft-engine without a draft accepted");
}

/* bench spec --model-draft: the model as its own draft on its engine: the row names the draft, the
 * texts are identical and the greedy drafts all but always accepted. */
static void test_bench_spec_draft_quick(void) {
    const char *m = t_data("models/stories260K.bin");
    if (!has_data() || !m) return;
    char args[1024];
    snprintf(args, sizeof args, "bench spec --quick --json --tokens 100 --engine avx2 --model-draft %s --draft-engine avx2 --spec-tokens 4 --draft-p-min 0", m);
    int rc = t_nerve(args);
    T_CHECK(rc == 0, "exit %d: %s", rc, t_err);
    cJSON *rows[16];
    int n = parse_rows(t_out, rows, 16);
    T_CHECK(n == 3, "%d rows: %s", n, t_out);
    for (int i = 0; i < n; i++)
        T_CHECK(!strcmp(str(rows[i], "draft"), "stories260K") && num(rows[i], "draft_p_min") == 0 && cJSON_IsTrue(cJSON_GetObjectItem(rows[i], "identical")) &&
                    num(rows[i], "completion_tokens") == 100,
                "row %d: %s", i, str(rows[i], "why"));
    if (n >= 1) T_CHECK(num(rows[0], "acceptance") > 0.9 && num(rows[0], "tokens_per_step") > 2.5, "greedy: acceptance %g, %g tokens a step",
                        num(rows[0], "acceptance"), num(rows[0], "tokens_per_step"));
    for (int i = 0; i < n; i++) cJSON_Delete(rows[i]);
}

/* bench preempt: the priority case without and with preemption (only the latter preempts), the
 * overcommit case reserving and overcommitting (the same requests: the same tokens either way) */
static void test_bench_preempt_quick(void) {
    if (!has_data()) return;
    setenv("NERVE_TEST_STEP_DELAY_MS", "2", 1); /* (the long streams last some 0.4 s) */
    int rc = t_nerve("bench preempt --quick --json --tokens 200");
    T_CHECK(rc == 0, "exit %d: %s", rc, t_err);
    cJSON *rows[8];
    int n = parse_rows(t_out, rows, 8);
    T_CHECK(n == 4, "%d rows: %s", n, t_out);
    static const char *cases[4] = {"priority", "priority", "overcommit", "overcommit"},
                      *modes[4] = {"no-preemption", "preemption", "reserve", "kv-overcommit"};
    for (int i = 0; i < n && i < 4; i++) {
        const cJSON *r = rows[i];
        T_CHECK(!strcmp(str(r, "bench"), "preempt") && !strcmp(str(r, "case"), cases[i]) && !strcmp(str(r, "mode"), modes[i]) &&
                    !cJSON_GetObjectItem(r, "ok") && num(r, "max_tokens") == 200,
                "row %d: %s %s %s", i, str(r, "case"), str(r, "mode"), str(r, "why"));
    }
    if (n == 4) {
        T_CHECK(num(rows[0], "preemptions") == 0 && num(rows[1], "preemptions") == 1 && num(rows[0], "ttft_ms") > 0 &&
                    num(rows[1], "ratio_vs") > 0,
                "priority: %g and %g preemptions", num(rows[0], "preemptions"), num(rows[1], "preemptions"));
        T_CHECK(num(rows[2], "completion_tokens") > 0 && num(rows[2], "completion_tokens") == num(rows[3], "completion_tokens") &&
                    num(rows[3], "ratio_vs") > 0 && !strcmp(str(rows[3], "ratio_of"), "reserve tokens_per_s"),
                "overcommit: %g and %g tokens", num(rows[2], "completion_tokens"), num(rows[3], "completion_tokens"));
    }
    for (int i = 0; i < n; i++) cJSON_Delete(rows[i]);
    T_CHECK(t_nerve("bench preempt --clients 1") == 2, "--clients 1 accepted");
}

int main(void) {
    T_RUN(test_bench_serve_quick);
    T_RUN(test_bench_prefix_quick);
    T_RUN(test_bench_rerank_quick);
    T_RUN(test_bench_spec_quick);
    T_RUN(test_bench_spec_draft_quick);
    T_RUN(test_bench_preempt_quick);
    return t_done();
}
