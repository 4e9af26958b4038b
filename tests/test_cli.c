/* The nerve command end to end: generate's golden output, init, tokenize, info, and errors. */
#include <sys/wait.h>
#include <unistd.h>

#include "t.h"

static char tmpdir[256];
static char out_path[512], err_path[512];
static char *out_text, *err_text;

/* Runs `nerve ARGS` (args already shell-quoted); captures stdout/stderr; returns the exit code. */
static int nerve(const char *args) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>%s </dev/null", t_nerve_bin(), args, out_path, err_path);
    int st = system(cmd);
    free(out_text);
    free(err_text);
    out_text = err_text = NULL;
    nv_file_read_all(out_path, &out_text, NULL);
    nv_file_read_all(err_path, &err_text, NULL);
    if (!out_text) out_text = calloc(1, 1);
    if (!err_text) err_text = calloc(1, 1);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

static void test_generate_reproduces_llama2c_greedy(void) {
    const char *m = t_data("models/stories260K.bin"), *z = t_data("models/tok512.bin");
    const char *want_path = t_data("models/stories260K_greedy200.expected.txt");
    if (!m || !z || !want_path) return;
    char args[2048], *want = NULL;
    snprintf(args, sizeof args, "generate -m %s -z %s -t 0 -n 200", m, z);
    int rc = nerve(args);
    T_CHECK(rc == 0, "exit %d: %s", rc, err_text);
    nv_file_read_all(want_path, &want, NULL);
    T_CHECK(want && strcmp(out_text, want) == 0, "stdout differs from the llama2.c golden:\n%s", out_text);
    T_CHECK(strstr(err_text, "tok/s") != NULL, "no tok/s summary on stderr");
    free(want);
}

/* Every fp32 engine keeps the golden; an engine that is off on this machine is reported, not failed. */
static void test_generate_fp32_engines_match_golden(void) {
    const char *m = t_data("models/stories260K.bin"), *z = t_data("models/tok512.bin");
    const char *want_path = t_data("models/stories260K_greedy200.expected.txt");
    if (!m || !z || !want_path) return;
    char *want = NULL, args[2048];
    nv_file_read_all(want_path, &want, NULL);
    const char *engines[] = {"scalar", "avx2", "avx512"};
    int ran = 0;
    for (size_t i = 0; i < sizeof engines / sizeof engines[0]; i++) {
        snprintf(args, sizeof args, "generate -m %s -z %s -t 0 -n 200 --engine %s", m, z, engines[i]);
        int rc = nerve(args);
        if (rc == 1 && strstr(err_text, "is off")) {
            printf("    %s: off on this machine (%s)", engines[i], err_text);
            continue;
        }
        ran++;
        T_CHECK(rc == 0 && want && strcmp(out_text, want) == 0, "engine %s: rc %d, stdout differs: %s", engines[i], rc, out_text);
    }
    T_CHECK(ran >= 1, "no engine ran");
    free(want);
}

static void test_generate_seeded_and_prompted(void) {
    const char *m = t_data("models/stories260K.bin"), *z = t_data("models/tok512.bin");
    if (!m || !z) return;
    char args[2048], first[4096];
    snprintf(args, sizeof args, "generate -m %s -z %s -p 'Once upon a time' -n 80 -t 0.9 --top-p 0.9 -s 42", m, z);
    T_CHECK(nerve(args) == 0, "%s", err_text);
    snprintf(first, sizeof first, "%s", out_text);
    T_CHECK(strncmp(first, "Once upon a time", 16) == 0, "prompt not echoed: %s", first);
    T_CHECK(nerve(args) == 0 && strcmp(first, out_text) == 0, "same seed, different text");
    snprintf(args, sizeof args, "generate -m %s -z %s -p 'Once upon a time' -n 80 -t 0.9 --top-p 0.9 -s 43", m, z);
    T_CHECK(nerve(args) == 0 && strcmp(first, out_text) != 0, "different seeds, same text");
    /* fewer steps than prompt tokens: only the prompt's first pieces, no sampling */
    snprintf(args, sizeof args, "generate -m %s -z %s -p 'Once upon a time there was' -n 3 -t 0", m, z);
    T_CHECK(nerve(args) == 0, "%s", err_text);
    T_CHECK(strlen(out_text) > 0 && strlen(out_text) < 16, "steps < prompt printed '%s'", out_text);
}

static void test_init_then_generate(void) {
    const char *z = t_data("models/tok512.bin");
    if (!z) return;
    char args[2048];
    snprintf(args, sizeof args, "init --preset stories260K --seq-len 128 --seed 5 -o %s/init.bin", tmpdir);
    T_CHECK(nerve(args) == 0, "init failed: %s", err_text);
    snprintf(args, sizeof args, "generate -m %s/init.bin -z %s -n 20 -t 0", tmpdir, z);
    T_CHECK(nerve(args) == 0, "generate from init failed: %s", err_text);
    snprintf(args, sizeof args, "init --preset nope -o %s/x.bin", tmpdir);
    T_CHECK(nerve(args) == 2 && count_lines(err_text) == 1, "bad preset: %s", err_text);
}

static void test_tokenize(void) {
    const char *z = t_data("tokenizers/tokenizer.bin");
    if (!z) return;
    char args[2048];
    snprintf(args, sizeof args, "tokenize -z %s 'Hello world'", z);
    T_CHECK(nerve(args) == 0 && strcmp(out_text, "15043 3186\n") == 0, "got '%s' %s", out_text, err_text);
    snprintf(args, sizeof args, "tokenize -z %s --bos 'Hello world'", z);
    T_CHECK(nerve(args) == 0 && strcmp(out_text, "1 15043 3186\n") == 0, "got '%s' %s", out_text, err_text);
}

static void test_bad_input_one_line_errors(void) {
    const char *z = t_data("models/tok512.bin");
    if (!z) return;
    char args[2048], path[600];
    snprintf(path, sizeof path, "%s/garbage.bin", tmpdir);
    FILE *f = fopen(path, "wb");
    for (int i = 0; i < 1000; i++) fputc((i * 7919) & 0xff, f);
    fclose(f);
    snprintf(args, sizeof args, "generate -m %s -z %s", path, z);
    int rc = nerve(args);
    T_CHECK(rc == 1 && count_lines(err_text) == 1 && strstr(err_text, "nerve generate:"), "garbage model: rc %d '%s'", rc, err_text);
    snprintf(args, sizeof args, "generate -m %s/missing.bin -z %s", tmpdir, z);
    T_CHECK(nerve(args) == 1 && count_lines(err_text) == 1, "missing model: '%s'", err_text);
    const char *m = t_data("models/stories260K.bin");
    if (!m) return;
    /* a tokenizer with a different vocabulary size than the model */
    const char *big = t_data("tokenizers/tokenizer.bin");
    if (big) {
        snprintf(args, sizeof args, "generate -m %s -z %s -n 5", m, big);
        T_CHECK(nerve(args) != 0 && count_lines(err_text) == 1, "mismatched tokenizer: '%s'", err_text);
    }
    const char *bad_args[] = {"generate", "generate -m", "generate -m x -n -3", "generate -m x -t abc",
                              "generate -m x --top-p 2", "generate -m x --bogus 1", "frobnicate", "init -o"};
    for (size_t i = 0; i < sizeof bad_args / sizeof bad_args[0]; i++) {
        rc = nerve(bad_args[i]);
        T_CHECK(rc == 2, "'%s' exit %d", bad_args[i], rc);
    }
    snprintf(args, sizeof args, "generate -m %s -z %s --engine warp-drive", m, z);
    T_CHECK(nerve(args) == 2 && count_lines(err_text) == 1, "bad engine: '%s'", err_text);
}

static void test_info(void) {
    T_CHECK(nerve("info") == 0, "info failed: %s", err_text);
    const char *want[] = {"cpu:", "cores:", "memory:", "AVX2", "AVX-512F", "AVX512-BF16", "AMX-TILE", "AMX-BF16", "AMX-INT8",
                          "amx:", "scalar"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        T_CHECK(strstr(out_text, want[i]) != NULL, "info lacks '%s'", want[i]);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/nerve-test-cli-XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    snprintf(out_path, sizeof out_path, "%s/stdout", tmpdir);
    snprintf(err_path, sizeof err_path, "%s/stderr", tmpdir);
    T_RUN(test_generate_reproduces_llama2c_greedy);
    T_RUN(test_generate_fp32_engines_match_golden);
    T_RUN(test_generate_seeded_and_prompted);
    T_RUN(test_init_then_generate);
    T_RUN(test_tokenize);
    T_RUN(test_bad_input_one_line_errors);
    T_RUN(test_info);
    free(out_text);
    free(err_text);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return t_done();
}
