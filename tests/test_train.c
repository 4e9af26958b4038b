/* nerve train end to end: bit-exact resume after SIGINT, refused corrupt checkpoints, constant
 * plan builds, export, and fine-tuning stories260K lowering its validation loss. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model/gguf.h"
#include "model/model.h"
#include "train/ckpt.h"
#include "t.h"


static int run_nerve(const char *args, char *err, size_t cap) {
    char cmd[8192], errp[600];
    snprintf(errp, sizeof errp, "%s/stderr.txt", t_tmpdir());
    snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>%s </dev/null", t_nerve_bin(), args, errp);
    int st = system(cmd);
    if (err) {
        char *e = NULL;
        nv_file_read_all(errp, &e, NULL);
        snprintf(err, cap, "%s", e ? e : "");
        free(e);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* The tiny model every case trains: 2 layers, GQA, tok512 vocabulary, 32-token windows. */
static void train_args(char *buf, size_t cap, const char *out, const char *extra) {
    const char *data = t_data("corpus/tinystories_valid_head.txt"), *tok = t_data("models/tok512.bin");
    snprintf(buf, cap,
             "train --dim 32 --layers 2 --heads 4 --kv-heads 2 --hidden 64 --data %s -z %s --steps 24 --batch 4 "
             "--seq 32 --lr 3e-3 --warmup 4 --eval-every 8 --eval-batches 2 --ckpt-every 6 --seed 7 --quiet --out %s %s",
             data ? data : "x", tok ? tok : "x", out, extra);
}

/* Losses by step from metrics.jsonl, as the exact strings written. */
static int read_losses(const char *dir, char losses[][32], int max) {
    char path[800], *text = NULL;
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    if (nv_file_read_all(path, &text, NULL) != NV_OK) return 0;
    int n = 0;
    for (char *p = text; (p = strstr(p, "\"loss\":")) != NULL && n < max; p += 7) {
        char *end = strchr(p + 7, ',');
        size_t len = end ? (size_t)(end - p - 7) : 0;
        if (len >= 32) len = 31;
        memcpy(losses[n], p + 7, len);
        losses[n][len] = '\0';
        n++;
    }
    free(text);
    return n;
}

static int count_steps(const char *dir) {
    char l[64][32];
    return read_losses(dir, l, 64);
}

static void test_resume_after_sigint_is_bit_exact(void) {
    if (!t_data("corpus/tinystories_valid_head.txt") || !t_data("models/tok512.bin")) return;
    char args[4096], err[4096], full[600], split[600];
    snprintf(full, sizeof full, "%s/full", t_tmpdir());
    snprintf(split, sizeof split, "%s/split", t_tmpdir());
    train_args(args, sizeof args, full, "");
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "uninterrupted run failed: %s", err);
    /* the efficiency report ends with the run's peak memory */
    const char *pm = strstr(err, "; peak memory ");
    T_CHECK(pm && strtod(pm + 14, NULL) > 0.0 && strstr(pm, " GB\n"), "no peak memory in the report: %s", err);

    /* the same run, interrupted with SIGINT part way, then resumed */
    train_args(args, sizeof args, split, "");
    char cmd[8192];
    /* 15 ms after each step: the interrupt lands part way however fast this machine trains */
    snprintf(cmd, sizeof cmd, "exec env NERVE_TEST_STEP_DELAY_MS=15 %s %s >/dev/null 2>%s/split.err", t_nerve_bin(), args,
             t_tmpdir());
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int waited = 0;
    while (count_steps(split) < 9 && waited < 60000) {
        usleep(5000);
        waited += 5;
    }
    kill(pid, SIGINT);
    int st;
    waitpid(pid, &st, 0);
    T_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "interrupted run did not exit cleanly (status %d)", st);
    int done_before = count_steps(split);
    T_CHECK(done_before >= 9 && done_before < 24, "interrupt landed at step %d", done_before);
    train_args(args, sizeof args, split, "--resume");
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "resume failed: %s", err);

    char a[64][32], b[64][32];
    int na = read_losses(full, a, 64), nb = read_losses(split, b, 64);
    T_CHECK(na == 24 && nb == 24, "steps logged: %d uninterrupted, %d interrupted+resumed", na, nb);
    for (int i = 0; i < na && i < nb; i++) T_CHECK(strcmp(a[i], b[i]) == 0, "step %d: loss %s vs %s", i + 1, a[i], b[i]);
    /* plans are built once: the count logged at every step is the same */
    char path[800], *text = NULL;
    snprintf(path, sizeof path, "%.600s/metrics.jsonl", full);
    nv_file_read_all(path, &text, NULL);
    long first = -1, differ = 0;
    for (char *p = text; p && (p = strstr(p, "\"plan_builds\":")); p += 14) {
        long v = strtol(p + 14, NULL, 10);
        if (first < 0) first = v;
        differ += v != first;
    }
    free(text);
    T_CHECK(first > 0 && differ == 0, "plan builds changed during training (first %ld, %ld differ)", first, differ);
    snprintf(path, sizeof path, "%.600s/loss.svg", full);
    T_CHECK(nv_file_exists(path), "no loss.svg");
}

/* A checkpoint written by nv_ckpt_save loads back; header flags other than 0/1 are refused
 * (found by fuzz/fuzz_ckpt.c: any non-zero value used to read as true). */
static void test_ckpt_roundtrip_and_flags(void) {
    nv_config c;
    T_CHECK(nv_config_preset("stories260K", &c) == NV_OK, "%s", nv_errmsg());
    nv_ckpt_header h;
    memset(&h, 0, sizeof h);
    nv_ckpt_header_set_config(&h, &c);
    h.n_params = nv_config_param_count(&c);
    h.step = 7;
    size_t n = (size_t)h.n_params;
    float *p = calloc(n, sizeof(float)), *m = calloc(n, sizeof(float)), *v = calloc(n, sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = (float)i * 1e-3f, m[i] = -p[i], v[i] = 2 * p[i];
    const char *path = t_path("unit.ckpt");
    T_CHECK(nv_ckpt_save(path, &h, p, m, v) == NV_OK, "%s", nv_errmsg());
    nv_ckpt k;
    T_CHECK(nv_ckpt_load(path, &k) == NV_OK, "%s", nv_errmsg());
    T_CHECK(k.h.step == 7 && !memcmp(k.params, p, n * sizeof(float)) && !memcmp(k.v, v, n * sizeof(float)), "round trip");
    nv_ckpt_close(&k);
    h.qk_norm = 2;
    T_CHECK(nv_ckpt_save(path, &h, p, m, v) == NV_OK, "%s", nv_errmsg());
    T_CHECK(nv_ckpt_load(path, &k) == NV_EFORMAT && strstr(nv_errmsg(), "must be 0 or 1"), "flag 2 accepted: %s", nv_errmsg());
    free(p), free(m), free(v);
    /* the projection-bias flag (qwen2): kept, and refused when neither 0 nor 1 */
    c.qkv_bias = 1;
    memset(&h, 0, sizeof h);
    nv_ckpt_header_set_config(&h, &c);
    h.n_params = nv_config_param_count(&c);
    n = (size_t)h.n_params;
    p = calloc(n, sizeof(float)), m = calloc(n, sizeof(float)), v = calloc(n, sizeof(float));
    T_CHECK(nv_ckpt_save(path, &h, p, m, v) == NV_OK && nv_ckpt_load(path, &k) == NV_OK, "%s", nv_errmsg());
    nv_config back;
    nv_ckpt_header_get_config(&k.h, &back);
    T_CHECK(back.qkv_bias == 1 && !memcmp(&back, &c, sizeof c), "the bias flag survives the round trip");
    nv_ckpt_close(&k);
    h.qkv_bias = 3;
    T_CHECK(nv_ckpt_save(path, &h, p, m, v) == NV_OK, "%s", nv_errmsg());
    T_CHECK(nv_ckpt_load(path, &k) == NV_EFORMAT && strstr(nv_errmsg(), "must be 0 or 1"), "bias flag 3 accepted: %s", nv_errmsg());
    free(p), free(m), free(v);
}

static void test_corrupt_checkpoint_refused_and_kept(void) {
    if (!t_data("corpus/tinystories_valid_head.txt") || !t_data("models/tok512.bin")) return;
    char args[4096], err[4096], dir[600], ck[700];
    snprintf(dir, sizeof dir, "%s/full", t_tmpdir());
    snprintf(ck, sizeof ck, "%s/ckpt.bin", dir);
    char *orig = NULL;
    size_t len = 0;
    if (nv_file_read_all(ck, &orig, &len) != NV_OK) {
        T_CHECK(0, "no checkpoint from the previous case");
        return;
    }
    /* flip one byte in the weights */
    FILE *f = fopen(ck, "r+b");
    fseek(f, (long)len / 2, SEEK_SET);
    fputc(orig[len / 2] ^ 0x40, f);
    fclose(f);
    train_args(args, sizeof args, dir, "--resume");
    int rc = run_nerve(args, err, sizeof err);
    const char *line = strstr(err, "nerve train:");
    T_CHECK(rc == 1 && line && strstr(line, "checksum") && strchr(line, '\n') == strrchr(err, '\n'), "corrupt: rc %d '%s'", rc, err);
    char *after = NULL;
    size_t alen = 0;
    nv_file_read_all(ck, &after, &alen);
    T_CHECK(after && alen == len && memcmp(after, orig, len / 2) == 0, "the refused checkpoint was modified");
    free(after);
    /* truncated */
    if (truncate(ck, (off_t)(len - 100)) != 0) T_CHECK(0, "truncate failed");
    rc = run_nerve(args, err, sizeof err);
    T_CHECK(rc == 1 && strstr(err, "truncated"), "truncated: rc %d '%s'", rc, err);
    /* restore, then: a new run into a folder holding a checkpoint is refused without --resume */
    nv_iov part = {orig, len};
    nv_file_write_atomic(ck, &part, 1);
    train_args(args, sizeof args, dir, "");
    rc = run_nerve(args, err, sizeof err);
    T_CHECK(rc == 1 && strstr(err, "--resume"), "overwrite: rc %d '%s'", rc, err);
    /* resuming with different settings is refused */
    train_args(args, sizeof args, dir, "--resume --seed 8");
    rc = run_nerve(args, err, sizeof err);
    T_CHECK(rc == 1 && strstr(err, "same"), "different seed: rc %d '%s'", rc, err);
    free(orig);
}

static void test_export_then_generate(void) {
    const char *tok = t_data("models/tok512.bin");
    if (!tok || !t_data("corpus/tinystories_valid_head.txt")) return;
    char args[4096], err[4096];
    snprintf(args, sizeof args, "export %s/full -o %s/exported.bin", t_tmpdir(), t_tmpdir());
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "export failed: %s", err);
    snprintf(args, sizeof args, "generate -m %s/exported.bin -z %s -n 30 -t 0", t_tmpdir(), tok);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "generate from export failed: %s", err);
    snprintf(args, sizeof args, "generate -m %s/full/model.bin -z %s/full/tokenizer.bin -n 30 -t 0", t_tmpdir(), t_tmpdir());
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "generate from the run's model.bin failed: %s", err);
    snprintf(args, sizeof args, "generate -m %s/full -n 30 -t 0", t_tmpdir()); /* the folder: model.bin + tokenizer.bin */
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "generate from the run folder failed: %s", err);
}

/* A shape llama2.c's format cannot hold (QK-norm, head size 16 with dim 32) ends its run with
 * model.gguf (qwen3) holding exactly the checkpoint's weights, and the run folder generates. */
static void test_qk_norm_run_writes_gguf(void) {
    if (!t_data("corpus/tinystories_valid_head.txt") || !t_data("models/tok512.bin")) return;
    char args[4096], err[4096], dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/qk", t_tmpdir());
    train_args(args, sizeof args, dir, "--qk-norm --head-dim 16");
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "train failed: %s", err);
    snprintf(path, sizeof path, "%s/model.bin", dir);
    T_CHECK(!nv_file_exists(path), "model.bin written for a QK-norm shape");
    snprintf(path, sizeof path, "%s/model.gguf", dir);
    nv_model m;
    nv_ckpt k;
    char ck[700];
    snprintf(ck, sizeof ck, "%s/ckpt.bin", dir);
    T_CHECK(nv_model_load(path, &m) == NV_OK && nv_ckpt_load(ck, &k) == NV_OK, "%s", nv_errmsg());
    if (m.params && k.params) {
        T_CHECK(m.config.qk_norm && m.config.head_dim == 16 && m.n_params == k.h.n_params &&
                    !memcmp(m.params, k.params, (size_t)m.n_params * sizeof(float)),
                "model.gguf differs from the checkpoint's weights");
        nv_ckpt_close(&k);
    }
    nv_model_free(&m);
    snprintf(args, sizeof args, "generate -m %s -n 30 -t 0", dir);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "generate from the run folder failed: %s", err);
    /* the file carries the run's vocabulary, as llama.cpp needs */
    T_CHECK(nv_gguf_has_vocab(path), "model.gguf has no vocabulary");
    snprintf(args, sizeof args, "generate -m %s -n 30 -t 0", path);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "generate from model.gguf alone failed: %s", err);
}

static float val_at(const char *dir, int want_step) {
    char path[800], *text = NULL;
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    if (nv_file_read_all(path, &text, NULL) != NV_OK) return NAN;
    float v = NAN;
    for (char *line = text; line && *line;) {
        char *next = strchr(line, '\n');
        int step;
        char *vp = strstr(line, "\"val_loss\":");
        if (sscanf(line, "{\"step\":%d", &step) == 1 && step == want_step && vp) v = strtof(vp + 11, NULL);
        line = next ? next + 1 : NULL;
    }
    free(text);
    return v;
}

static void test_finetune_stories260K_lowers_val_loss(void) {
    const char *m = t_data("models/stories260K.bin"), *tok = t_data("models/tok512.bin");
    const char *data = t_data("corpus/tinystories_valid_head.txt");
    if (!m || !tok || !data) return;
    char args[4096], err[4096], dir[600];
    snprintf(dir, sizeof dir, "%s/ft", t_tmpdir());
    snprintf(args, sizeof args,
             "train --init-from %s -z %s --data %s --steps 10 --batch 4 --seq 64 --lr 1e-4 --warmup 2 --eval-every 10 "
             "--eval-batches 4 --quiet --out %s",
             m, tok, data, dir);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "fine-tune failed: %s", err);
    float before = val_at(dir, 0), after = val_at(dir, 10);
    T_CHECK(isfinite(before) && isfinite(after) && after < before, "validation loss %.4f -> %.4f", before, after);
    /* the same model with one NaN weight is refused before anything is written */
    char bad[700], *bytes = NULL;
    size_t len = 0;
    snprintf(bad, sizeof bad, "%s/nan_weight.bin", t_tmpdir());
    snprintf(dir, sizeof dir, "%s/ft_nan", t_tmpdir());
    if (nv_file_read_all(m, &bytes, &len) != NV_OK || len < 28 + 4 * 1000) {
        T_CHECK(0, "cannot read %s", m);
        free(bytes);
        return;
    }
    const float nan = NAN;
    memcpy(bytes + 28 + 4 * 777, &nan, 4);
    nv_iov part = {bytes, len};
    T_CHECK(nv_file_write_atomic(bad, &part, 1) == NV_OK, "write %s", bad);
    free(bytes);
    snprintf(args, sizeof args, "train --init-from %s -z %s --data %s --steps 2 --batch 4 --seq 64 --quiet --out %s", bad, tok,
             data, dir);
    const int rc = run_nerve(args, err, sizeof err);
    char ck[800];
    snprintf(ck, sizeof ck, "%s/ckpt.bin", dir);
    const char *line = strstr(err, "nerve train: the starting weights hold a value that is not finite");
    T_CHECK(rc == 1 && line && strchr(line, '\n') == strrchr(err, '\n') && !nv_file_exists(ck),
            "a NaN weight to fine-tune: exit %d '%s'", rc, err);
}

/* A gradient that is not finite (a hook poisons one from step 3 on) skips its update: the run warns
 * per step, writes valid JSON (null, "skipped":true), and after 5 such steps in a row stops as
 * diverged (exit 1, one error line) with a checkpoint whose weights and moments are those of step 2,
 * bit for bit what a 2-step run saves. */
static void test_diverged_run_stops_and_keeps_good_weights(void) {
    if (!t_data("corpus/tinystories_valid_head.txt") || !t_data("models/tok512.bin")) return;
    char args[4096], cmd[8192], err[8192], dir[600], ref[600], path[800];
    snprintf(dir, sizeof dir, "%s/diverged", t_tmpdir());
    snprintf(ref, sizeof ref, "%s/two_steps", t_tmpdir());
    train_args(args, sizeof args, dir, "");
    snprintf(cmd, sizeof cmd, "exec env NERVE_TEST_NAN_GRAD_FROM=3 %s %s >/dev/null 2>%s/diverged.err </dev/null",
             t_nerve_bin(), args, t_tmpdir());
    int st = system(cmd), rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    snprintf(path, sizeof path, "%s/diverged.err", t_tmpdir());
    char *text = NULL;
    nv_file_read_all(path, &text, NULL);
    snprintf(err, sizeof err, "%s", text ? text : "");
    free(text);
    const char *line = strstr(err, "nerve train: training diverged");
    T_CHECK(rc == 1 && line && strchr(line, '\n') == strrchr(err, '\n'), "diverged run: exit %d '%s'", rc, err);
    int warned = 0;
    for (const char *p = err; (p = strstr(p, "update skipped")) != NULL; p++) warned++;
    T_CHECK(warned == 5, "%d skipped-update warnings, not 5: '%s'", warned, err);
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    text = NULL;
    nv_file_read_all(path, &text, NULL);
    int skipped = 0, nulls = 0;
    for (const char *p = text; p && (p = strstr(p, "\"skipped\":true")) != NULL; p++) skipped++;
    for (const char *p = text; p && (p = strstr(p, "\"grad_norm\":null")) != NULL; p++) nulls++;
    T_CHECK(text && skipped == 5 && nulls == 5 && !strstr(text, "nan") && !strstr(text, "inf") && strstr(text, "\"step\":7,") &&
                !strstr(text, "\"step\":8,"),
            "metrics of the diverged run: %d skipped, %d null norms: %s", skipped, nulls, text ? text : "(none)");
    free(text);
    /* its checkpoint holds step 2's weights and moments (step counts the skipped updates too) */
    train_args(args, sizeof args, ref, "--steps 2");
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "2-step run: '%s'", err);
    char ca[800], cb[800];
    snprintf(ca, sizeof ca, "%s/ckpt.bin", dir);
    snprintf(cb, sizeof cb, "%s/ckpt.bin", ref);
    nv_ckpt a = {0}, b = {0};
    if (nv_ckpt_load(ca, &a) != NV_OK || nv_ckpt_load(cb, &b) != NV_OK) {
        T_CHECK(0, "checkpoints: %s", nv_errmsg());
    } else {
        const size_t bytes = (size_t)a.h.n_params * sizeof(float);
        T_CHECK(a.h.step == 7 && b.h.step == 2 && a.h.n_params == b.h.n_params, "steps %lld and %lld", (long long)a.h.step,
                (long long)b.h.step);
        T_CHECK(a.h.n_params == b.h.n_params && !memcmp(a.params, b.params, bytes) && !memcmp(a.m, b.m, bytes) &&
                    !memcmp(a.v, b.v, bytes),
                "the diverged run's checkpoint is not step 2's state");
    }
    nv_ckpt_close(&a);
    nv_ckpt_close(&b);
}

static void test_bad_training_args(void) {
    char err[4096], args[4096];
    const char *bad[] = {"train --steps 0", "train --batch x", "train --preset nope", "train --dim 30 --layers 2",
                         "train --dim 32 --layers 1 --heads 5", "train --preset stories260K --qkv-bias",
                         "train --dim 32 --layers 1 --heads 4 --qk-norm --qkv-bias"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = run_nerve(bad[i], err, sizeof err);
        T_CHECK(rc == 2 || rc == 1, "'%s' exit %d", bad[i], rc);
        T_CHECK(strncmp(err, "nerve train:", 12) == 0, "'%s' printed '%s'", bad[i], err);
    }
    snprintf(args, sizeof args, "train --data %s/missing.txt --out %s/x", t_tmpdir(), t_tmpdir());
    T_CHECK(run_nerve(args, err, sizeof err) == 1 && strstr(err, "missing.txt"), "missing data: '%s'", err);
    /* a run far past this machine's memory (a terabyte of activations) is refused before it allocates */
    const char *data = t_data("corpus/tinystories_valid_head.txt"), *tok = t_data("models/tok512.bin");
    if (data && tok) {
        snprintf(args, sizeof args,
                 "train --dim 512 --layers 8 --heads 8 --context 1024 --batch 4096 --seq 1024 --steps 1 --data %s -z %s "
                 "--out %s/huge",
                 data, tok, t_tmpdir());
        const int rc = run_nerve(args, err, sizeof err);
        T_CHECK(rc == 1 && strstr(err, "nerve train: training needs about") && strstr(err, "lower --batch or --seq"),
                "a run too large for memory: exit %d '%s'", rc, err);
        char ck[700];
        snprintf(ck, sizeof ck, "%s/huge/ckpt.bin", t_tmpdir());
        T_CHECK(!nv_file_exists(ck), "a refused run wrote a checkpoint");
    }
}

int main(void) {
    T_RUN(test_resume_after_sigint_is_bit_exact);
    T_RUN(test_ckpt_roundtrip_and_flags);
    T_RUN(test_corrupt_checkpoint_refused_and_kept);
    T_RUN(test_export_then_generate);
    T_RUN(test_qk_norm_run_writes_gguf);
    T_RUN(test_finetune_stories260K_lowers_val_loss);
    T_RUN(test_diverged_run_stops_and_keeps_good_weights);
    T_RUN(test_bad_training_args);
    return t_done();
}
