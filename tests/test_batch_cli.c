/* nerve batch end to end: OpenAI batch files answered as nerve serve answers each body, in the
 * input's order; the input checked whole first; an existing output kept unless --resume, which
 * keeps its successful answers and runs the rest; SIGINT writes what was answered. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "t.h"
#include "serve_util.h"

#define SERVE_FLAGS "--kv-memory 64M --kv-disk-cache 0 --chat-template chatml"

static const char *model_path(void) { return t_data("models/stories260K.bin"); }
static const char *tok_path(void) { return t_data("models/tok512.bin"); }

/* The bodies of the mixed batch: four endpoints, seeded sampling, greedy, n=2, and one a 400. */
static const char *const bodies[] = {
    "{\"model\":\"stories260K\",\"prompt\":\"Once upon a time\",\"max_tokens\":24,\"temperature\":0}",
    "{\"model\":\"stories260K\",\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story\"}],\"max_tokens\":16,"
    "\"temperature\":0.9,\"seed\":7}",
    "{\"prompt\":\"The little dog\",\"max_tokens\":20,\"temperature\":0.8,\"seed\":3,\"n\":2}",
    "{\"input\":[\"a cat\",\"a dog\"]}",
    "{\"input\":\"Lily went to the park\",\"max_output_tokens\":12,\"temperature\":0}",
    "{\"prompt\":5,\"max_tokens\":4}",
    "{\"prompt\":\"Tom and Sue\",\"max_tokens\":30,\"temperature\":1.0,\"top_p\":0.9,\"seed\":11}",
};
static const char *const urls[] = {"/v1/completions", "/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                                   "/v1/responses",   "/v1/completions",      "/v1/completions"};
#define N_BODIES (int)(sizeof bodies / sizeof *bodies)

/* The answer with what differs between two runs of the same request removed (ids, times, and the
 * prompt tokens the prefix cache held, which depend on what ran before). */
static char *answer_core(const char *body) {
    cJSON *j = cJSON_Parse(body);
    if (!j) return strdup(body);
    static const char *const drop[] = {"id", "created", "created_at", "completed_at"};
    for (size_t i = 0; i < sizeof drop / sizeof *drop; i++) cJSON_DeleteItemFromObjectCaseSensitive(j, drop[i]);
    cJSON *usage = cJSON_GetObjectItemCaseSensitive(j, "usage");
    cJSON_DeleteItemFromObjectCaseSensitive(usage, "prompt_tokens_details");
    cJSON_DeleteItemFromObjectCaseSensitive(usage, "input_tokens_details");
    cJSON *out = cJSON_GetObjectItemCaseSensitive(j, "output");
    cJSON *it;
    cJSON_ArrayForEach(it, out) cJSON_DeleteItemFromObjectCaseSensitive(it, "id");
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return s;
}

static void write_input(const char *name, int copies) {
    FILE *f = fopen(t_path(name), "w");
    for (int c = 0; c < copies; c++)
        for (int i = 0; i < N_BODIES; i++) {
            fprintf(f, "{\"custom_id\":\"req-%d-%d\",\"method\":\"POST\",\"url\":\"%s\",\"body\":%s}\n", c, i, urls[i], bodies[i]);
            if (i == 2) fprintf(f, "\n"); /* blank lines are skipped */
        }
    fclose(f);
}

static cJSON **read_lines(const char *path, int *n) {
    char *text = NULL;
    *n = 0;
    if (nv_file_read_all(path, &text, NULL) != NV_OK) return NULL;
    cJSON **v = calloc(4096, sizeof *v);
    for (char *line = strtok(text, "\n"); line && *n < 4096; line = strtok(NULL, "\n")) v[(*n)++] = cJSON_Parse(line);
    free(text);
    return v;
}

static void free_lines(cJSON **v, int n) {
    for (int i = 0; i < n; i++) cJSON_Delete(v[i]);
    free(v);
}

static const char *str_of(const cJSON *o, const char *k) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(s) ? s->valuestring : "";
}
static int status_of(const cJSON *line) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(line, "response"), "status_code");
    return cJSON_IsNumber(s) ? s->valueint : -1;
}
static char *body_core_of(const cJSON *line) {
    char *b = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(line, "response"), "body"));
    char *core = answer_core(b ? b : "");
    free(b);
    return core;
}

static int run_batch(const char *in, const char *out, const char *extra) {
    char args[4096];
    snprintf(args, sizeof args, "batch -m %s -z %s " SERVE_FLAGS " -i %s -o %s %s", model_path(), tok_path(), t_path(in), t_path(out),
             extra ? extra : "");
    return t_nerve(args);
}

/* Every line answered as a server answers its body alone, in the input's order, with OpenAI's fields. */
static void test_batch_answers_as_serve(void) {
    if (!model_path() || !tok_path()) return;
    write_input("in.jsonl", 3);
    int rc = run_batch("in.jsonl", "out.jsonl", NULL);
    T_CHECK(rc == 0, "exit %d: %s", rc, t_err);
    T_CHECK(strstr(t_err, "21 requests answered (3 with an error)"), "summary: %s", t_err);
    T_CHECK(!strstr(t_err, "POST /v1/"), "the batch's server logged every request: %s", t_err);
    int n = 0;
    cJSON **lines = read_lines(t_path("out.jsonl"), &n);
    T_CHECK(n == 3 * N_BODIES, "%d lines", n);
    server srv;
    if (!server_spawn(&srv, "batch-serve", NULL, NULL, model_path(), tok_path(), SERVE_FLAGS, 30)) {
        T_CHECK(0, "no server");
        free_lines(lines, n);
        return;
    }
    for (int i = 0; i < n && lines; i++) {
        const int c = i / N_BODIES, k = i % N_BODIES;
        char want_id[32];
        snprintf(want_id, sizeof want_id, "req-%d-%d", c, k);
        T_CHECK(!strcmp(str_of(lines[i], "custom_id"), want_id), "line %d: custom_id %s, not %s", i, str_of(lines[i], "custom_id"), want_id);
        T_CHECK(!strncmp(str_of(lines[i], "id"), "batch_req_", 10), "line %d: id '%s'", i, str_of(lines[i], "id"));
        T_CHECK(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(lines[i], "error")), "line %d: error not null", i);
        const cJSON *res = cJSON_GetObjectItemCaseSensitive(lines[i], "response");
        T_CHECK(str_of(res, "request_id")[0], "line %d: no request_id", i);
        resp r;
        T_CHECK(http(srv.port, "POST", urls[k], NULL, bodies[k], &r), "POST %s", urls[k]);
        T_CHECK(status_of(lines[i]) == r.status, "line %d: status %d, the server's %d", i, status_of(lines[i]), r.status);
        T_CHECK(r.status == (k == 5 ? 400 : 200), "line %d: status %d", i, r.status);
        char *got = body_core_of(lines[i]), *want = answer_core(r.body ? r.body : "");
        T_CHECK(!strcmp(got, want), "line %d (%s): the batch's answer\n%s\ndiffers from the server's\n%s", i, urls[k], got, want);
        if (k != 5 && k != 3) { /* the id is the answer's own */
            cJSON *rb = cJSON_GetObjectItemCaseSensitive(res, "body");
            T_CHECK(!strcmp(str_of(res, "request_id"), str_of(rb, "id")), "line %d: request_id is not the answer's id", i);
        }
        free(got), free(want);
        resp_free(&r);
    }
    T_CHECK(server_stop_within(&srv, 20) == 0, "server exit");
    free_lines(lines, n);
}

/* A malformed input is refused whole, before anything runs; an output is never overwritten unasked. */
static void test_batch_refuses(void) {
    if (!model_path() || !tok_path()) return;
    const char *bad =
        "{\"custom_id\":\"a\",\"method\":\"GET\",\"url\":\"/v1/completions\",\"body\":{}}\n"
        "not json\n"
        "{\"custom_id\":\"b\",\"method\":\"POST\",\"url\":\"/v1/models\",\"body\":{}}\n"
        "{\"custom_id\":\"c\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"a\",\"stream\":true}}\n"
        "{\"custom_id\":\"d\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":\"a\"}\n"
        "{\"custom_id\":\"\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}}\n"
        "{\"custom_id\":\"e\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"a\"}}\n"
        "{\"custom_id\":\"e\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"b\"}}\n"
        "{\"custom_id\":\"f\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"b\"}} and more\n";
    t_write("bad.jsonl", bad, strlen(bad));
    int rc = run_batch("bad.jsonl", "bad_out.jsonl", NULL);
    T_CHECK(rc == 1 && strstr(t_err, "bad.jsonl:1: method") && strstr(t_err, "bad.jsonl:2: not a JSON") && strstr(t_err, "bad.jsonl:3: url") &&
                strstr(t_err, "bad.jsonl:4: body.stream") && strstr(t_err, "bad.jsonl:5: body must") &&
                strstr(t_err, "bad.jsonl:6: custom_id") && strstr(t_err, "bad.jsonl:8: custom_id repeats line 7") &&
                strstr(t_err, "bad.jsonl:9: not a JSON object") && strstr(t_err, "8 of its lines") && !strstr(t_err, "bad.jsonl:7"),
            "exit %d: %s", rc, t_err);
    T_CHECK(access(t_path("bad_out.jsonl"), F_OK) != 0 && access(t_path("bad_out.jsonl.partial"), F_OK) != 0, "an output was written");
    t_write("nul.jsonl", "{}\0{}\n", 6);
    rc = run_batch("nul.jsonl", "bad_out.jsonl", NULL);
    T_CHECK(rc == 1 && strstr(t_err, "NUL byte"), "exit %d: %s", rc, t_err);
    t_write("empty.jsonl", "\n\n", 2);
    rc = run_batch("empty.jsonl", "bad_out.jsonl", NULL);
    T_CHECK(rc == 1 && strstr(t_err, "holds no requests"), "exit %d: %s", rc, t_err);
    /* an existing output: refused without --resume, untouched; a model that does not load leaves it too */
    write_input("keep_in.jsonl", 1);
    const char *kept = "{\"custom_id\":\"req-0-0\",\"response\":{\"status_code\":200,\"body\":{}},\"error\":null}\n";
    t_write("keep_out.jsonl", kept, strlen(kept));
    rc = run_batch("keep_in.jsonl", "keep_out.jsonl", NULL);
    T_CHECK(rc == 1 && strstr(t_err, "exists: --resume"), "exit %d: %s", rc, t_err);
    char args[4096], *now = NULL;
    snprintf(args, sizeof args, "batch -m %s/absent.bin -z %s -i %s -o %s --resume", t_tmpdir(), tok_path(), t_path("keep_in.jsonl"),
             t_path("keep_out.jsonl"));
    rc = t_nerve(args);
    T_CHECK(rc == 1, "a missing model: exit %d: %s", rc, t_err);
    nv_file_read_all(t_path("keep_out.jsonl"), &now, NULL);
    T_CHECK(now && !strcmp(now, kept), "the output changed: %s", now ? now : "(gone)");
    free(now);
    /* a former output that is not one, or of another batch */
    t_write("other_out.jsonl", "{\"custom_id\":\"zzz\",\"response\":null,\"error\":{}}\n", 46);
    rc = run_batch("keep_in.jsonl", "other_out.jsonl", "--resume");
    T_CHECK(rc == 1 && strstr(t_err, "'zzz' is not among"), "exit %d: %s", rc, t_err);
    t_write("junk_out.jsonl", "hello\n", 6);
    rc = run_batch("keep_in.jsonl", "junk_out.jsonl", "--resume");
    T_CHECK(rc == 1 && strstr(t_err, "junk_out.jsonl:1: not a line of a batch"), "exit %d: %s", rc, t_err);
    snprintf(args, sizeof args, "batch -m %s -i %s -o %s --port 8000", model_path(), t_path("keep_in.jsonl"), t_path("x.jsonl"));
    rc = t_nerve(args);
    T_CHECK(rc == 2 && strstr(t_err, "--port"), "exit %d: %s", rc, t_err);
}

/* --resume keeps the 2xx answers and runs what is missing or failed: the same answers as one run. */
static void test_batch_resume(void) {
    if (!model_path() || !tok_path()) return;
    write_input("r_in.jsonl", 2);
    int rc = run_batch("r_in.jsonl", "r_full.jsonl", "--parallel 3");
    T_CHECK(rc == 0, "exit %d: %s", rc, t_err);
    int n = 0;
    cJSON **full = read_lines(t_path("r_full.jsonl"), &n);
    /* a former run's output: the first five answers, one of them turned into a failure */
    FILE *f = fopen(t_path("r_out.jsonl"), "w");
    for (int i = 0; i < 5 && i < n; i++) {
        cJSON *copy = cJSON_Duplicate(full[i], 1);
        if (i == 1) cJSON_SetNumberValue(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(copy, "response"), "status_code"), 500);
        char *s = cJSON_PrintUnformatted(copy);
        fprintf(f, "%s\n", s);
        free(s);
        cJSON_Delete(copy);
    }
    fclose(f);
    /* a server that does not start: the former output as it was, no .partial left */
    char *was = NULL, *is = NULL;
    nv_file_read_all(t_path("r_out.jsonl"), &was, NULL);
    rc = run_batch("r_in.jsonl", "r_out.jsonl", "--resume --engine nope");
    nv_file_read_all(t_path("r_out.jsonl"), &is, NULL);
    T_CHECK(rc != 0 && was && is && !strcmp(was, is) && access(t_path("r_out.jsonl.partial"), F_OK) != 0,
            "a server that did not start: exit %d, the output %s, .partial %s", rc, was && is && !strcmp(was, is) ? "kept" : "changed",
            access(t_path("r_out.jsonl.partial"), F_OK) ? "absent" : "left");
    free(was), free(is);
    rc = run_batch("r_in.jsonl", "r_out.jsonl", "--resume");
    T_CHECK(rc == 0 && strstr(t_err, "10 requests answered"), "exit %d: %s", rc, t_err);
    int m = 0;
    cJSON **got = read_lines(t_path("r_out.jsonl"), &m);
    T_CHECK(m == n && n == 2 * N_BODIES, "%d lines, %d in one run", m, n);
    for (int i = 0; i < m && got; i++) {
        int j = 0;
        while (j < n && strcmp(str_of(full[j], "custom_id"), str_of(got[i], "custom_id"))) j++;
        T_CHECK(j < n, "line %d: custom_id %s", i, str_of(got[i], "custom_id"));
        if (j == n) continue;
        char *a = body_core_of(got[i]), *b = body_core_of(full[j]);
        T_CHECK(!strcmp(a, b) && status_of(got[i]) == status_of(full[j]), "%s: answered otherwise", str_of(got[i], "custom_id"));
        /* the four kept answers are the same lines, ids and all; the failed one and the rest run again */
        const int kept = j < 5 && j != 1;
        T_CHECK(kept == !strcmp(str_of(got[i], "id"), str_of(full[j], "id")), "%s: kept %d", str_of(got[i], "custom_id"), kept);
        T_CHECK(!kept || i < 4, "%s: a kept answer at line %d", str_of(got[i], "custom_id"), i);
        free(a), free(b);
    }
    free_lines(got, m);
    free_lines(full, n);
}

/* SIGINT (or SIGHUP): the requests running finish, the rest are not sent; the output holds the
 * answered ones whole, exit 130; --resume then answers the rest. */
/* 16 requests of 30 steps (tag's custom ids and files) started two at a time as a child process
 * (ignoring SIGHUP, as under nohup, with ignore_hup), its stderr in TAG_err.txt; returns its pid once
 * the server runs (the run takes ~6 s at 25 ms a step). */
static pid_t start_slow_batch(const char *tag, int ignore_hup) {
    char in[64], out[64], err_name[64];
    snprintf(in, sizeof in, "%s_in.jsonl", tag);
    snprintf(out, sizeof out, "%s_out.jsonl", tag);
    snprintf(err_name, sizeof err_name, "%s_err.txt", tag);
    FILE *f = fopen(t_path(in), "w");
    for (int i = 0; i < 16; i++)
        fprintf(f, "{\"custom_id\":\"%s%d\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"Once\",\"max_tokens\":30,\"temperature\":0}}\n",
                tag, i);
    fclose(f);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "exec env NERVE_TEST_STEP_DELAY_MS=25 '%s' batch -m '%s' -z '%s' " SERVE_FLAGS " -i '%s' -o '%s' --parallel 2 2>'%s'",
             t_nerve_bin(), model_path(), tok_path(), t_path(in), t_path(out), t_path(err_name));
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGHUP, ignore_hup ? SIG_IGN : SIG_DFL);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    char *err = NULL;
    for (double t0 = now_s(); now_s() - t0 < 30; sleep_ms(20)) {
        free(err), err = NULL;
        nv_file_read_all(t_path(err_name), &err, NULL);
        if (err && strstr(err, "its requests to a server")) break;
    }
    free(err);
    return pid;
}

static void test_batch_interrupt(void) {
    if (!model_path() || !tok_path()) return;
    const pid_t pid = start_slow_batch("i", 0);
    sleep_ms(1200);
    kill(pid, SIGINT);
    int st = 0;
    waitpid(pid, &st, 0);
    char *err = NULL;
    nv_file_read_all(t_path("i_err.txt"), &err, NULL);
    T_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 130 && err && strstr(err, "--resume runs them"), "status %d: %s", st, err ? err : "");
    free(err);
    int n = 0;
    cJSON **lines = read_lines(t_path("i_out.jsonl"), &n);
    T_CHECK(lines && n >= 1 && n < 16, "%d answers written", n);
    for (int i = 0; i < n; i++) T_CHECK(status_of(lines[i]) == 200, "line %d: status %d", i, status_of(lines[i]));
    free_lines(lines, n);
    T_CHECK(access(t_path("i_out.jsonl.partial"), F_OK) != 0, "the partial file was left");
    /* SIGHUP (the terminal closed) stops it the same way; under nohup (SIGHUP ignored) it goes on */
    for (int ignored = 0; ignored < 2; ignored++) {
        const pid_t hup = start_slow_batch(ignored ? "g" : "h", ignored);
        sleep_ms(600);
        kill(hup, SIGHUP);
        waitpid(hup, &st, 0);
        int nh = 0;
        cJSON **hl = read_lines(t_path(ignored ? "g_out.jsonl" : "h_out.jsonl"), &nh);
        T_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == (ignored ? 0 : 130) && (ignored ? nh == 16 : nh >= 1 && nh < 16),
                "SIGHUP%s: status %d, %d answers written", ignored ? " ignored" : "", st, nh);
        free_lines(hl, nh);
    }
    int rc = run_batch("i_in.jsonl", "i_out.jsonl", "--resume");
    char want[64];
    snprintf(want, sizeof want, "%d requests answered (0 with an error)", 16 - n);
    T_CHECK(rc == 0 && strstr(t_err, want), "exit %d: %s", rc, t_err);
    lines = read_lines(t_path("i_out.jsonl"), &n);
    T_CHECK(n == 16, "%d lines after --resume", n);
    char *first = n ? body_core_of(lines[0]) : NULL;
    for (int i = 1; i < n; i++) { /* the same greedy request: the same answer */
        char *b = body_core_of(lines[i]);
        T_CHECK(first && !strcmp(first, b), "line %d differs", i);
        free(b);
    }
    free(first);
    free_lines(lines, n);
}

/* A run killed outright (SIGKILL) leaves its answers in OUT.partial, a whole line each as it came: a
 * new run is refused while it is there, and --resume keeps its whole lines (a last one cut short
 * dropped) and runs the rest. */
static void test_batch_killed(void) {
    if (!model_path() || !tok_path()) return;
    const pid_t pid = start_slow_batch("k", 0);
    int n = 0;
    cJSON **lines = NULL;
    for (double t0 = now_s(); n < 3 && now_s() - t0 < 30; sleep_ms(50)) {
        free_lines(lines, n);
        lines = read_lines(t_path("k_out.jsonl.partial"), &n);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    free_lines(lines, n);
    lines = read_lines(t_path("k_out.jsonl.partial"), &n);
    T_CHECK(n >= 3 && n < 16 && access(t_path("k_out.jsonl"), F_OK) != 0, "%d answers in the killed run's .partial", n);
    for (int i = 0; i < n; i++) T_CHECK(status_of(lines[i]) == 200, "line %d: status %d", i, status_of(lines[i]));
    free_lines(lines, n);
    FILE *f = fopen(t_path("k_out.jsonl.partial"), "a"); /* a line the kill cut short */
    if (f) fputs("{\"id\":\"batch_req_x\",\"custom_id\":\"k15\",\"respo", f), fclose(f);
    int rc = run_batch("k_in.jsonl", "k_out.jsonl", "");
    T_CHECK(rc == 1 && strstr(t_err, ".partial holds the answers") && access(t_path("k_out.jsonl.partial"), F_OK) == 0,
            "without --resume: exit %d: %s", rc, t_err);
    rc = run_batch("k_in.jsonl", "k_out.jsonl", "--resume");
    char want[64];
    snprintf(want, sizeof want, "%d requests answered (0 with an error)", 16 - n);
    T_CHECK(rc == 0 && strstr(t_err, want), "--resume: exit %d: %s", rc, t_err);
    int m = 0;
    lines = read_lines(t_path("k_out.jsonl"), &m);
    int seen[16] = {0}, ok = m == 16;
    for (int i = 0; i < m && ok; i++) {
        const int k = atoi(str_of(lines[i], "custom_id") + 1);
        ok = k >= 0 && k < 16 && !seen[k]++ && status_of(lines[i]) == 200;
    }
    T_CHECK(ok && access(t_path("k_out.jsonl.partial"), F_OK) != 0, "%d lines after --resume, each request once", m);
    free_lines(lines, m);
}

/* Anthropic's Message Batches: {"custom_id", "params"} lines answered {"custom_id", "result": {"type":
 * "succeeded", "message"}} as the server answers /v1/messages, or errored with the server's error; a
 * file of both formats is refused; --resume keeps the succeeded results. */
static void test_batch_anthropic(void) {
    if (!model_path() || !tok_path()) return;
    static const char *const params[] = {
        "{\"model\":\"stories260K\",\"max_tokens\":20,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"temperature\":0}",
        "{\"model\":\"nope\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
        "{\"model\":\"stories260K\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
    };
    FILE *f = fopen(t_path("a_in.jsonl"), "w");
    for (int i = 0; i < 3; i++) fprintf(f, "{\"custom_id\":\"m%d\",\"params\":%s}\n", i, params[i]);
    fclose(f);
    int rc = run_batch("a_in.jsonl", "a_out.jsonl", NULL);
    T_CHECK(rc == 0 && strstr(t_err, "3 requests answered (2 with an error)"), "exit %d: %s", rc, t_err);
    int n = 0;
    cJSON **lines = read_lines(t_path("a_out.jsonl"), &n);
    T_CHECK(n == 3, "%d lines", n);
    server srv;
    if (n == 3 && server_spawn(&srv, "batch-anthropic", NULL, NULL, model_path(), tok_path(), SERVE_FLAGS, 30)) {
        static const char *const want_type[] = {"succeeded", "errored", "errored"}, *const want_error[] = {"", "not_found_error",
                                                                                                            "invalid_request_error"};
        for (int i = 0; i < 3; i++) {
            const cJSON *res = cJSON_GetObjectItemCaseSensitive(lines[i], "result");
            char id[8];
            snprintf(id, sizeof id, "m%d", i);
            T_CHECK(!strcmp(str_of(lines[i], "custom_id"), id) && !strcmp(str_of(res, "type"), want_type[i]), "line %d: %s %s", i,
                    str_of(lines[i], "custom_id"), str_of(res, "type"));
            resp r;
            T_CHECK(http(srv.port, "POST", "/v1/messages", NULL, params[i], &r), "POST /v1/messages");
            if (i == 0) {
                char *b = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(res, "message"));
                char *got = answer_core(b ? b : ""), *want = answer_core(r.body ? r.body : "");
                T_CHECK(r.status == 200 && !strcmp(got, want), "the batch's message\n%s\nis not the server's\n%s", got, want);
                free(b), free(got), free(want);
            } else {
                const cJSON *err = cJSON_GetObjectItemCaseSensitive(res, "error");
                T_CHECK(r.status >= 400 && !strcmp(str_of(err, "type"), want_error[i]) && str_of(err, "message")[0], "line %d: error %s",
                        i, str_of(err, "type"));
            }
            resp_free(&r);
        }
        T_CHECK(server_stop_within(&srv, 20) == 0, "server exit");
    }
    /* resumed: the succeeded result is kept as it was, the errored ones run again */
    char *before = cJSON_PrintUnformatted(n ? lines[0] : NULL);
    free_lines(lines, n);
    rc = run_batch("a_in.jsonl", "a_out.jsonl", "--resume");
    T_CHECK(rc == 0 && strstr(t_err, "2 requests answered"), "resume: exit %d: %s", rc, t_err);
    lines = read_lines(t_path("a_out.jsonl"), &n);
    char *kept = n ? cJSON_PrintUnformatted(lines[0]) : NULL;
    T_CHECK(n == 3 && before && kept && !strcmp(before, kept), "after --resume: %d lines, the first %s", n, kept ? kept : "-");
    free(before), free(kept);
    free_lines(lines, n);
    /* one file, one format */
    const char *mixed = "{\"custom_id\":\"a\",\"params\":{\"max_tokens\":2,\"messages\":[]}}\n"
                        "{\"custom_id\":\"b\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}}\n";
    t_write("mixed.jsonl", mixed, strlen(mixed));
    rc = run_batch("mixed.jsonl", "mixed_out.jsonl", NULL);
    T_CHECK(rc == 1 && strstr(t_err, "mixed.jsonl:2: a line of OpenAI's batch format among Anthropic's"), "exit %d: %s", rc, t_err);
}

int main(void) {
    T_RUN(test_batch_answers_as_serve);
    T_RUN(test_batch_refuses);
    T_RUN(test_batch_resume);
    T_RUN(test_batch_interrupt);
    T_RUN(test_batch_killed);
    T_RUN(test_batch_anthropic);
    return t_done();
}
