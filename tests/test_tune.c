/* nerve tune: it measures the engines on a model and keeps its choice per machine and model in the
 * tune file, which serve and generate take unless told otherwise; a file it cannot read is never
 * lost and never stops them. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "serve_util.h"
#include "t.h"

/* Engines every x86-64-v3 machine has, so the case runs anywhere and quickly. */
#define ENGINES "scalar,avx2,avx2-int8"

static char tune_file[700];

static cJSON *read_json(const char *path) {
    char *text = NULL;
    if (nv_file_read_all(path, &text, NULL) != NV_OK) return NULL;
    cJSON *j = cJSON_Parse(text);
    free(text);
    return j;
}

/* Writes root to path as the tune file. */
static void write_json(const char *path, const cJSON *root) {
    char *text = cJSON_Print(root);
    FILE *f = fopen(path, "w");
    T_CHECK(text && f, "cannot write %s", path);
    if (f && text) fputs(text, f);
    if (f) fclose(f);
    free(text);
}

/* The only machine's only model entry of a tune file (NULL when it has not exactly one of each). */
static cJSON *only_entry(cJSON *root, const char **machine, const char **model) {
    cJSON *ms = cJSON_GetObjectItem(root, "machines");
    if (cJSON_GetArraySize(ms) != 1) return NULL;
    cJSON *models = cJSON_GetObjectItem(ms->child, "models");
    if (cJSON_GetArraySize(models) != 1) return NULL;
    *machine = ms->child->string;
    *model = models->child->string;
    return models->child;
}

/* The serve log's "listening" line after starting with env and args (NULL, after failing the case, when it did not start). */
static char *serve_line(const char *name, const char *model, const char *tok, const char *args) {
    char env[1200];
    snprintf(env, sizeof env, "NERVE_LOG=info NERVE_ENGINES=" ENGINES " NERVE_TUNE_FILE='%s'", tune_file);
    server s;
    if (!server_spawn(&s, name, NULL, env, model, tok, args, 30)) {
        T_CHECK(0, "%s: the server did not start", name);
        return NULL;
    }
    char *log = read_log(&s);
    server_stop_within(&s, 20);
    return log;
}

static void test_tune(void) {
    const char *model = t_data("models/stories260K.bin"), *tok = t_data("models/tok512.bin");
    if (!model || !tok) return;
    snprintf(tune_file, sizeof tune_file, "%s/cache/nerve/tune.json", t_tmpdir());
    char args[2048], cmd[2600];
    snprintf(args, sizeof args, "tune -m '%s' --quick", model);
    snprintf(cmd, sizeof cmd, "%s", args);
    setenv("NERVE_ENGINES", ENGINES, 1);
    setenv("NERVE_TUNE_FILE", tune_file, 1);
    int rc = t_nerve(cmd);
    T_CHECK(rc == 0 && strstr(t_out, "tuned: serve on ") && strstr(t_out, "avx2-int8") && strstr(t_out, "decode"), "tune: %d %s %s", rc,
            t_out, t_err);
    cJSON *root = read_json(tune_file);
    const char *machine = NULL, *key = NULL;
    cJSON *e = only_entry(root, &machine, &key);
    const char *se = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(e, "serve"), "engine"));
    const cJSON *chunk = cJSON_GetObjectItem(cJSON_GetObjectItem(e, "serve"), "prefill_chunk");
    const char *ge = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(e, "generate"), "engine"));
    T_CHECK(e && se && (!strcmp(se, "avx2") || !strcmp(se, "avx2-int8")) && cJSON_IsNumber(chunk) &&
                (chunk->valueint == 64 || chunk->valueint == 128 || chunk->valueint == 256) && ge && !strcmp(ge, "avx2") &&
                strstr(machine, "threads") && strstr(machine, "avx2-int8") && !strstr(machine, "avx512") && strstr(key, "dim 64") &&
                cJSON_GetArraySize(cJSON_GetObjectItem(e, "measured")) == 2,
            "the tune file: %s", t_out);
    /* JSON Lines: every line an object; the last the choice */
    snprintf(cmd, sizeof cmd, "%s --json", args);
    rc = t_nerve(cmd);
    int lines = 0, objects = 0;
    char *last = NULL;
    for (char *p = t_out, *nl; p && *p; p = nl ? nl + 1 : NULL, lines++) {
        nl = strchr(p, '\n');
        if (nl) *nl = '\0';
        cJSON *j = cJSON_Parse(p);
        objects += cJSON_IsObject(j);
        cJSON_Delete(j);
        last = p;
    }
    T_CHECK(rc == 0 && lines >= 3 && objects == lines && last && strstr(last, "\"case\":\"choice\""), "--json: %d lines, %d objects", lines,
            objects);
    cJSON_Delete(root);
    root = read_json(tune_file); /* the second run replaced the entry, not added one */
    T_CHECK(only_entry(root, &machine, &key) != NULL, "one entry after two runs");

    /* serve takes the entry: here one set by hand (engine avx2, a chunk of 37), so the test sees it taken */
    cJSON *serve = cJSON_GetObjectItem(only_entry(root, &machine, &key), "serve");
    cJSON_ReplaceItemInObject(serve, "engine", cJSON_CreateString("avx2"));
    cJSON_ReplaceItemInObject(serve, "prefill_chunk", cJSON_CreateNumber(37));
    write_json(tune_file, root);
    FILE *f;
    char *log = serve_line("tuned", model, tok, "");
    T_CHECK(log && strstr(log, "engine avx2,") && strstr(log, "prefill chunk 37, tuned "), "tuned serve: %s", log ? log : "");
    free(log);
    log = serve_line("tuned-engine", model, tok, "--engine avx2-int8");
    T_CHECK(log && strstr(log, "engine avx2-int8,") && strstr(log, "prefill chunk 512,") && !strstr(log, "tuned"), "--engine: %s",
            log ? log : "");
    free(log);
    log = serve_line("tuned-chunk", model, tok, "--prefill-chunk 64");
    T_CHECK(log && strstr(log, "engine avx2-int8,") && strstr(log, "prefill chunk 64,") && !strstr(log, "tuned"), "--prefill-chunk: %s",
            log ? log : "");
    free(log);
    log = serve_line("tuned-off", model, tok, "--no-tune");
    T_CHECK(log && strstr(log, "engine avx2-int8,") && strstr(log, "prefill chunk 512,") && !strstr(log, "tuned"), "--no-tune: %s",
            log ? log : "");
    free(log);
    /* an entry naming no engine nerve knows: a warning, the defaults */
    cJSON_ReplaceItemInObject(serve, "engine", cJSON_CreateString("warp-drive"));
    write_json(tune_file, root);
    log = serve_line("tuned-bad-entry", model, tok, "");
    T_CHECK(log && strstr(log, "engine avx2-int8,") && strstr(log, "is not one nerve reads") && !strstr(log, ", tuned"), "bad entry: %s",
            log ? log : "");
    free(log);
    cJSON_Delete(root);

    /* a file that is not one: serve warns and starts with its defaults; tune keeps it as .bad */
    f = fopen(tune_file, "w");
    fputs("{\"version\": 1, \"machines\": [", f);
    fclose(f);
    log = serve_line("tuned-bad-file", model, tok, "");
    T_CHECK(log && strstr(log, "engine avx2-int8,") && strstr(log, "is not a tune file"), "bad file: %s", log ? log : "");
    free(log);
    rc = t_nerve(args);
    char bad[800], *kept = NULL;
    snprintf(bad, sizeof bad, "%s.bad", tune_file);
    nv_file_read_all(bad, &kept, NULL);
    root = read_json(tune_file);
    T_CHECK(rc == 0 && kept && !strcmp(kept, "{\"version\": 1, \"machines\": [") && only_entry(root, &machine, &key) &&
                strstr(t_err, ".bad"),
            "a bad file kept: %d '%s' %s", rc, kept ? kept : "(none)", t_err);
    free(kept);
    cJSON_Delete(root);
    /* a second bad file does not overwrite the first one kept */
    f = fopen(tune_file, "w");
    fputs("[]", f);
    fclose(f);
    rc = t_nerve(args);
    char bad1[820];
    snprintf(bad1, sizeof bad1, "%s.bad.1", tune_file);
    kept = NULL;
    nv_file_read_all(bad1, &kept, NULL);
    T_CHECK(rc == 0 && kept && !strcmp(kept, "[]") && nv_file_exists(bad), "a second bad file: %d %s", rc, t_err);
    free(kept);
    /* info counts this machine's models */
    T_CHECK(t_nerve("info") == 0 && strstr(t_out, "tune:     1 model tuned for this machine"), "info: %s", t_out);
    /* a tune file that cannot be read (a directory): tune writes nothing, serve goes on with its defaults */
    char dir_file[800];
    snprintf(dir_file, sizeof dir_file, "%s/tune-dir", t_tmpdir());
    nv_mkdirs(dir_file);
    setenv("NERVE_TUNE_FILE", dir_file, 1);
    rc = t_nerve(args);
    T_CHECK(rc == 1 && strstr(t_err, "cannot be read") && nv_file_exists(dir_file), "a directory: %d %s", rc, t_err);
    setenv("NERVE_TUNE_FILE", tune_file, 1);

    /* refusals: no model, a model that is not one, nowhere to write */
    T_CHECK(t_nerve("tune") == 2 && strstr(t_err, "-m MODEL is required"), "no -m: %s", t_err);
    snprintf(cmd, sizeof cmd, "tune -m '%s' --quick", tok);
    T_CHECK(t_nerve(cmd) == 1 && !strncmp(t_err, "nerve tune: ", 12) && strchr(t_err, '\n') == t_err + strlen(t_err) - 1,
            "not a model: one line: %s", t_err);
    unsetenv("NERVE_ENGINES");
    unsetenv("NERVE_TUNE_FILE");
}

/* generate takes the exact fp32 engine the file names for it: avx2 here, whose output is avx512's */
static void test_generate_tuned(void) {
    const char *model = t_data("models/stories260K.bin"), *tok = t_data("models/tok512.bin");
    if (!model || !tok) return;
    char file[700], gen[2400];
    snprintf(file, sizeof file, "%s/tune-generate.json", t_tmpdir());
    setenv("NERVE_TUNE_FILE", file, 1);
    setenv("NERVE_ENGINES", "scalar,avx2,avx512", 1);
    char args[2048];
    snprintf(args, sizeof args, "tune -m '%s' --quick", model);
    int rc = t_nerve(args);
    cJSON *root = read_json(file);
    const char *machine = NULL, *key = NULL;
    cJSON *e = only_entry(root, &machine, &key);
    T_CHECK(rc == 0 && e, "tune: %d %s", rc, t_err);
    if (!e) {
        cJSON_Delete(root);
        return;
    }
    if (!strstr(machine, "avx512")) { /* no AVX-512 here: avx2 is generate's own default already */
        cJSON_Delete(root);
        unsetenv("NERVE_TUNE_FILE");
        unsetenv("NERVE_ENGINES");
        t_skip("no AVX-512 on this machine: generate's default is the avx2 engine already");
        return;
    }
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(e, "generate"), "engine", cJSON_CreateString("avx2"));
    write_json(file, root);
    cJSON_Delete(root);
    /* sampled at temperature 1: a different bit in any logit would likely change a draw */
    snprintf(gen, sizeof gen, "generate -m '%s' -z '%s' -t 1 -s 7 -n 120 -p 'Once upon a time'", model, tok);
    rc = t_nerve(gen);
    char *tuned = strdup(t_out);
    T_CHECK(rc == 0 && strstr(t_err, "engine avx2\n"), "tuned generate: %d %s", rc, t_err);
    snprintf(gen + strlen(gen), sizeof gen - strlen(gen), " --no-tune");
    rc = t_nerve(gen);
    T_CHECK(rc == 0 && strstr(t_err, "engine avx512\n") && !strcmp(t_out, tuned) && strlen(tuned) > 20,
            "the same text on avx512: '%s' vs '%s'", t_out, tuned);
    free(tuned);
    /* an entry naming scalar (whose sums are not fused: other bits) is not taken */
    root = read_json(file);
    e = only_entry(root, &machine, &key);
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(e, "generate"), "engine", cJSON_CreateString("scalar"));
    write_json(file, root);
    cJSON_Delete(root);
    gen[strlen(gen) - strlen(" --no-tune")] = '\0';
    rc = t_nerve(gen);
    T_CHECK(rc == 0 && strstr(t_err, "engine avx512\n") && strstr(t_err, "would change the output"), "a scalar entry: %d %s", rc, t_err);
    unsetenv("NERVE_TUNE_FILE");
    unsetenv("NERVE_ENGINES");
}

int main(void) {
    T_RUN(test_tune);
    T_RUN(test_generate_tuned);
    return t_done();
}
