/* nerve train end to end: bit-exact resume after SIGINT, refused corrupt checkpoints, constant
 * plan builds, export, and fine-tuning stories260K lowering its validation loss. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model/forward.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "serve/chat.h"
#include "train/ckpt.h"
#include "train/dist.h"
#include "train/train.h"
#include "t.h"
#include "serve_util.h"


/* Runs `launcher nerve args` (launcher "" or "mpirun ..."), its stderr into err. */
static int run_launched(const char *launcher, const char *args, char *err, size_t cap) {
    char cmd[16384], errp[600];
    snprintf(errp, sizeof errp, "%s/stderr.txt", t_tmpdir());
    snprintf(cmd, sizeof cmd, "%s %s %s >/dev/null 2>%s </dev/null", launcher, t_nerve_bin(), args, errp);
    int st = system(cmd);
    if (err) {
        char *e = NULL;
        nv_file_read_all(errp, &e, NULL);
        snprintf(err, cap, "%s", e ? e : "");
        free(e);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static int run_nerve(const char *args, char *err, size_t cap) { return run_launched("", args, err, cap); }

/* The tiny model every case trains: 2 layers, GQA, tok512 vocabulary, 32-token windows. */
static void train_args(char *buf, size_t cap, const char *out, const char *extra) {
    const char *data = t_data("corpus/tinystories_valid_head.txt"), *tok = t_data("models/tok512.bin");
    snprintf(buf, cap,
             "train --dim 32 --layers 2 --heads 4 --kv-heads 2 --hidden 64 --data %s -z %s --steps 24 --batch 4 "
             "--seq 32 --lr 3e-3 --warmup 4 --eval-every 8 --eval-batches 2 --ckpt-every 6 --seed 7 --quiet --out %s %s",
             data ? data : "x", tok ? tok : "x", out, extra);
}

/* train_args for a run from a model file (--init-from in extra), whose shape is the file's */
static void train_args_from(char *buf, size_t cap, const char *out, const char *extra) {
    static const char shape[] = "--dim 32 --layers 2 --heads 4 --kv-heads 2 --hidden 64 ";
    train_args(buf, cap, out, extra);
    char *at = strstr(buf, shape);
    if (at) memset(at, ' ', strlen(shape));
}

/* A field of every step that has it in metrics.jsonl (key: "\"loss\":"), as the exact strings written. */
static int read_field(const char *dir, const char *key, char values[][32], int max) {
    char path[800], *text = NULL;
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    if (nv_file_read_all(path, &text, NULL) != NV_OK) return 0;
    const size_t kl = strlen(key);
    int n = 0;
    for (char *p = text; (p = strstr(p, key)) != NULL && n < max; p += kl) {
        char *end = strpbrk(p + kl, ",}");
        size_t len = end ? (size_t)(end - p - kl) : 0;
        if (len >= 32) len = 31;
        memcpy(values[n], p + kl, len);
        values[n][len] = '\0';
        n++;
    }
    free(text);
    return n;
}

/* Losses by step from metrics.jsonl, as the exact strings written. */
static int read_losses(const char *dir, char losses[][32], int max) { return read_field(dir, "\"loss\":", losses, max); }

static int count_steps(const char *dir) {
    char l[64][32];
    return read_losses(dir, l, 64);
}

/* The processes whose parent is pid (an mpirun's job), up to max of them, in /proc's order. */
static int children_of(pid_t pid, pid_t *out, int max) {
    int n = 0;
    DIR *procs = opendir("/proc");
    for (struct dirent *d; procs && n < max && (d = readdir(procs)) != NULL;) {
        char stat_path[300], stat[1024] = "";
        snprintf(stat_path, sizeof stat_path, "/proc/%.256s/stat", d->d_name);
        FILE *f = atoi(d->d_name) > 0 ? fopen(stat_path, "r") : NULL; /* /proc files have no size to read by */
        if (!f) continue;
        if (!fgets(stat, sizeof stat, f)) stat[0] = '\0';
        fclose(f);
        const char *after = strrchr(stat, ')'); /* "pid (name) state ppid ..." */
        int ppid = 0;
        if (after && sscanf(after + 1, " %*c %d", &ppid) == 1 && ppid == pid) out[n++] = (pid_t)atoi(d->d_name);
    }
    if (procs) closedir(procs);
    return n;
}

/* Runs `launcher nerve args` (launcher "" or "mpirun ...") into dir and sends sig once 9 steps are
 * logged: to the launched process, or with child_only to the newest of its children (one process of
 * an mpirun job); returns the exit status and the steps done. What has not ended 60 s later is
 * killed (a job that hangs fails the case instead of the suite). */
static int run_interrupted(const char *launcher, const char *args, const char *dir, int sig, int child_only,
                           int *steps_done) {
    char cmd[8192];
    /* 15 ms after each step: the interrupt lands part way however fast this machine trains */
    snprintf(cmd, sizeof cmd, "exec env NERVE_TEST_STEP_DELAY_MS=15 %s %s %s >/dev/null 2>%s/interrupted.err", launcher,
             t_nerve_bin(), args, t_tmpdir());
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int waited = 0;
    while (count_steps(dir) < 9 && waited < 60000) {
        usleep(5000);
        waited += 5;
    }
    pid_t kids[64], target = pid;
    int n_kids = children_of(pid, kids, 64);
    for (int i = 0; i < n_kids; i++)
        if (kids[i] > target) target = kids[i];
    T_CHECK(!child_only || target != pid, "no child of %s to signal", launcher);
    kill(child_only ? target : pid, sig);
    int st = 0;
    for (waited = 0; waitpid(pid, &st, WNOHANG) == 0; waited += 10) {
        if (waited == 60000) {
            T_CHECK(0, "%s did not end within 60 s of the signal", launcher);
            n_kids = children_of(pid, kids, 64);
            for (int i = 0; i < n_kids; i++) kill(kids[i], SIGKILL);
            kill(pid, SIGKILL);
        }
        usleep(10000);
    }
    *steps_done = count_steps(dir);
    return st;
}

/* 1 when run folder dir ended with model.gguf (no model.bin) holding exactly its checkpoint's weights
 * and config; the model's config into *c. */
static int run_gguf_is_ckpt(const char *dir, nv_config *c) {
    char path[700], ck[700];
    memset(c, 0, sizeof *c);
    snprintf(path, sizeof path, "%s/model.bin", dir);
    T_CHECK(!nv_file_exists(path), "%s written", path);
    snprintf(path, sizeof path, "%s/model.gguf", dir);
    snprintf(ck, sizeof ck, "%s/ckpt.bin", dir);
    nv_model m;
    nv_ckpt k;
    int same = 0;
    if (nv_model_load(path, &m) != NV_OK) {
        T_CHECK(0, "%s", nv_errmsg());
        return 0;
    }
    if (nv_ckpt_load(ck, &k) == NV_OK) {
        nv_config kc;
        nv_ckpt_header_get_config(&k.h, &kc);
        same = !memcmp(&kc, &m.config, sizeof kc) && m.n_params == k.h.n_params &&
               !memcmp(m.params, k.params, (size_t)m.n_params * sizeof(float));
        nv_ckpt_close(&k);
    }
    T_CHECK(same, "%s differs from the checkpoint's weights or config", path);
    *c = m.config;
    nv_model_free(&m);
    return same;
}

static float val_at(const char *dir, int want_step);

/* A run of train_args with extra, and the same interrupted with SIGINT part way then resumed, into
 * the folders tag + "full" and tag + "split": the same loss at every step. */
static void resume_case(const char *tag, const char *extra) {
    char args[4096], err[4096], full[600], split[600];
    snprintf(full, sizeof full, "%s/%sfull", t_tmpdir(), tag);
    snprintf(split, sizeof split, "%s/%ssplit", t_tmpdir(), tag);
    train_args(args, sizeof args, full, extra);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "uninterrupted run failed: %s", err);
    /* the efficiency report ends with the run's peak memory */
    const char *pm = strstr(err, "; peak memory ");
    T_CHECK(pm && strtod(pm + 14, NULL) > 0.0 && strstr(pm, " GB\n"), "no peak memory in the report: %s", err);

    /* the same run, interrupted with SIGINT part way, then resumed */
    train_args(args, sizeof args, split, extra);
    int done_before = 0;
    const int st = run_interrupted("", args, split, SIGINT, 0, &done_before);
    T_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s interrupted run did not exit cleanly (status %d)", tag, st);
    T_CHECK(done_before >= 9 && done_before < 24, "%s: interrupt landed at step %d", tag, done_before);
    char resume[1024], mpath[800];
    snprintf(resume, sizeof resume, "%s --resume", extra);
    train_args(args, sizeof args, split, resume);
    /* a line past the checkpoint and one the run was killed while writing: the resume drops both */
    snprintf(mpath, sizeof mpath, "%.600s/metrics.jsonl", split);
    FILE *mf = fopen(mpath, "a");
    T_CHECK(mf && fputs("{\"step\":999,\"loss\":1.5}\n{\"step\":3,\"loss\":2.", mf) >= 0, "%s: lines added", tag);
    if (mf) fclose(mf);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "%s: resume failed: %s", tag, err);
    char *mtext = NULL;
    nv_file_read_all(mpath, &mtext, NULL);
    int bad_lines = 0, lines = 0;
    for (char *line = mtext ? strtok(mtext, "\n") : NULL; line; line = strtok(NULL, "\n"), lines++) {
        cJSON *o = cJSON_Parse(line);
        bad_lines += !o || !cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "step")) ||
                     cJSON_GetObjectItemCaseSensitive(o, "step")->valuedouble > 24;
        cJSON_Delete(o);
    }
    free(mtext);
    T_CHECK(lines > 24 && bad_lines == 0, "%s: the resumed run's metrics: %d lines, %d not its steps' JSON", tag, lines, bad_lines);

    char a[64][32], b[64][32];
    int na = read_losses(full, a, 64), nb = read_losses(split, b, 64);
    T_CHECK(na == 24 && nb == 24, "%s: steps logged: %d uninterrupted, %d interrupted+resumed", tag, na, nb);
    for (int i = 0; i < na && i < nb; i++) T_CHECK(strcmp(a[i], b[i]) == 0, "%s: step %d: loss %s vs %s", tag, i + 1, a[i], b[i]);
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
    T_CHECK(first > 0 && differ == 0, "%s: plan builds changed during training (first %ld, %ld differ)", tag, first, differ);
    snprintf(path, sizeof path, "%.600s/loss.svg", full);
    T_CHECK(nv_file_exists(path), "%s: no loss.svg", tag);
}

static void test_resume_after_sigint_is_bit_exact(void) {
    if (!t_data("corpus/tinystories_valid_head.txt") || !t_data("models/tok512.bin")) return;
    resume_case("", ""); /* later cases use its "full" run */
    resume_case("drop", "--dropout 0.2"); /* the masks are the step's and the micro-batch's, not the process's history */
    /* dropout changes the training, not the evaluation: the same start, other losses after */
    char ld[64][32], l0[64][32];
    char drop_dir[700], plain_dir[700];
    snprintf(drop_dir, sizeof drop_dir, "%s/dropfull", t_tmpdir());
    snprintf(plain_dir, sizeof plain_dir, "%s/full", t_tmpdir());
    const int nd = read_losses(drop_dir, ld, 64), n0 = read_losses(plain_dir, l0, 64);
    T_CHECK(nd == 24 && n0 == 24 && strcmp(ld[0], l0[0]) != 0 && val_at(drop_dir, 0) == val_at(plain_dir, 0),
            "dropout: first losses %s and %s, step 0's validation %g and %g", nd ? ld[0] : "-", n0 ? l0[0] : "-",
            (double)val_at(drop_dir, 0), (double)val_at(plain_dir, 0));
    /* a weighted mixture (--data-weights) resumes to the same losses too, and says its shares */
    nv_buf text = {0};
    for (int i = 0; i < 400; i++) nv_buf_printf(&text, "The cat sat on the mat %d times.%s", i, i % 8 == 7 ? "\n\n" : " ");
    char extra[900], args[4096], err[4096];
    snprintf(extra, sizeof extra, "--data %s --data-weights 1,3", t_write("cats.txt", text.data, text.len));
    nv_buf_free(&text);
    resume_case("mix", extra);
    char dir[700];
    snprintf(dir, sizeof dir, "%s/mixfull", t_tmpdir());
    train_args(args, sizeof args, dir, extra);
    strcat(args, " --resume");
    T_CHECK(run_nerve(args, err, sizeof err) == 0 && strstr(err, "cats.txt: 75.0% of the training windows"), "no shares: %s", err);
    const char *bad[] = {"--data-weights 1", "--data-weights 1,-2", "--data-weights 0,0", "--data-weights 1,,2"};
    for (int i = 0; i < 4; i++) {
        snprintf(extra, sizeof extra, "--data %s %s", t_path("cats.txt"), bad[i]);
        snprintf(dir, sizeof dir, "%s/mixbad", t_tmpdir());
        train_args(args, sizeof args, dir, extra);
        T_CHECK(run_nerve(args, err, sizeof err) == 2 && strstr(err, "nerve train: --data-weights") && !strchr(strchr(err, '\n') + 1, '\n'),
                "'%s': %s", bad[i], err);
    }
}

/* A mixture of experts trained from scratch (4 experts, 2 a token): resumed after SIGINT to the same
 * losses; the load-balancing loss logged at every step near 1 (even) and its weight part of the
 * objective (another --router-aux-coef, other losses); model.gguf holds the checkpoint's weights with
 * the experts, and generate, perplexity and serve's folder form run it; fine-tuning the result goes on
 * to a lower validation loss; the flags' misuses refused. */
static void test_moe_run(void) {
    if (!t_data("corpus/tinystories_valid_head.txt") || !t_data("models/tok512.bin")) return;
    const char *moe = "--experts 4 --experts-used 2";
    resume_case("moe_", moe);
    char dir[600], args[4096], err[4096];
    snprintf(dir, sizeof dir, "%s/moe_full", t_tmpdir());
    char aux[64][32], loss[64][32];
    const int naux = read_field(dir, "\"router_aux\":", aux, 64);
    T_CHECK(naux == 24, "router_aux logged at %d of 24 steps", naux);
    for (int i = 0; i < naux; i++) {
        const double v = strtod(aux[i], NULL);
        T_CHECK(v >= 0.99 && v < 1.5, "step %d: router_aux %s", i + 1, aux[i]);
    }
    char zs[64][32];
    T_CHECK(read_field(dir, "\"router_z\":", zs, 64) == 24 && strtod(zs[0], NULL) > 0, "router_z not logged");
    read_losses(dir, loss, 64);
    char other[600];
    snprintf(other, sizeof other, "%s/moe_aux", t_tmpdir());
    static const char *const weights[2] = {"--router-aux-coef 1", "--router-z-coef 0.1"};
    for (int wi = 0; wi < 2; wi++) { /* each term's weight is part of the objective */
        char flags[200];
        snprintf(flags, sizeof flags, "--experts 4 --experts-used 2 %s --steps 4", weights[wi]);
        snprintf(other, sizeof other, "%s/moe_w%d", t_tmpdir(), wi);
        train_args(args, sizeof args, other, flags);
        T_CHECK(run_nerve(args, err, sizeof err) == 0, "%s", err);
        char l2[64][32];
        T_CHECK(read_losses(other, l2, 64) == 4 && !strcmp(l2[0], loss[0]) && strcmp(l2[3], loss[3]),
                "%s changed nothing (step 4: %s and %s)", weights[wi], l2[3], loss[3]);
    }
    snprintf(other, sizeof other, "%s/moe_aux", t_tmpdir());
    /* the run's model */
    nv_config mc;
    T_CHECK(run_gguf_is_ckpt(dir, &mc) && mc.n_experts == 4 && mc.n_experts_used == 2, "%d experts, %d a token",
            mc.n_experts, mc.n_experts_used);
    snprintf(args, sizeof args, "generate -m %s -n 20 -t 0 -p Once", dir);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "generate from the run folder: %s", err);
    snprintf(args, sizeof args, "perplexity -m %s -f %s --ctx 32 --chunks 4", dir, t_data("corpus/tinystories_valid_head.txt"));
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "perplexity: %s", err);
    /* fine-tuning it: the shape comes from the file, the validation loss goes down */
    char tuned[600], extra[1200];
    snprintf(tuned, sizeof tuned, "%s/moe_tuned", t_tmpdir());
    snprintf(extra, sizeof extra, "--steps 16 --init-from %s", dir);
    train_args_from(args, sizeof args, tuned, extra);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "fine-tune: %s", err);
    const float v0 = val_at(dir, 24), v1 = val_at(tuned, 16);
    T_CHECK(v1 < v0, "fine-tuning the mixture: validation loss %g, was %g", v1, v0);
    /* LoRA adapters on its attention (the default targets for a mixture), served with the base */
    char lora_dir[600];
    snprintf(lora_dir, sizeof lora_dir, "%s/moe_lora", t_tmpdir());
    snprintf(extra, sizeof extra, "--steps 16 --lora-rank 4 --init-from %s", dir);
    train_args_from(args, sizeof args, lora_dir, extra);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "LoRA on the mixture: %s", err);
    /* its merged model: the attention moved, the experts and routers as they were, bit for bit */
    nv_model base, merged;
    char bp[700], mp[700];
    snprintf(bp, sizeof bp, "%s/model.gguf", dir);
    snprintf(mp, sizeof mp, "%s/model.gguf", lora_dir);
    if (nv_model_load(bp, &base) == NV_OK) {
        if (nv_model_load(mp, &merged) == NV_OK) {
            const nv_config *bc = &base.config;
            const size_t attn = (size_t)bc->n_layers * bc->dim * nv_config_q_dim(bc),
                         ffn = (size_t)bc->n_layers * bc->n_experts * bc->hidden_dim * bc->dim;
            T_CHECK(memcmp(base.w.wq, merged.w.wq, attn * sizeof(float)) != 0, "the adapters changed no query weight");
            T_CHECK(!memcmp(base.w.w1, merged.w.w1, ffn * sizeof(float)) && !memcmp(base.w.w2, merged.w.w2, ffn * sizeof(float)) &&
                        !memcmp(base.w.router, merged.w.router, (size_t)bc->n_layers * bc->n_experts * bc->dim * sizeof(float)),
                    "the experts or the router changed");
            nv_model_free(&merged);
        } else {
            T_CHECK(0, "%s", nv_errmsg());
        }
        nv_model_free(&base);
    }
    snprintf(args, sizeof args, "generate -m %s --lora %s/adapter.gguf -n 12 -t 0 -p Once", dir, lora_dir);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "generate with the adapter: %s", err);
    snprintf(extra, sizeof extra, "--steps 2 --lora-rank 4 --lora-targets q,up --init-from %s", dir);
    train_args_from(args, sizeof args, other, extra);
    const int lrc = run_nerve(args, err, sizeof err);
    const char *lsaid = strstr(err, "nerve train: LoRA adapters on a mixture of experts' FFN");
    T_CHECK(lrc == 1 && lsaid && strchr(lsaid, '\n') == err + strlen(err) - 1, "exit %d: %s", lrc, err);
    /* misuse */
    const char *bad[] = {"--experts-used 2", "--experts 4 --experts-used 5", "--router-aux-coef 0.1", "--router-z-coef 0.1",
                         "--experts 4 --router-aux-coef -1", "--experts 4 --router-z-coef -1", "--experts 0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        train_args(args, sizeof args, other, bad[i]);
        T_CHECK(run_nerve(args, err, sizeof err) == 2 && !strncmp(err, "nerve train:", 12) && strchr(err, '\n') == err + strlen(err) - 1,
                "'%s': %s", bad[i], err);
    }
    snprintf(extra, sizeof extra, "--experts 2 --init-from %s", dir);
    train_args_from(args, sizeof args, other, extra);
    T_CHECK(run_nerve(args, err, sizeof err) == 2 && strstr(err, "a mixture of experts already"), "%s", err);
    /* sparse upcycling: the dense run of resume_case made 4 experts, each a copy of its FFN: its first
       evaluation is the dense model's (but for the rounding of the weighted sum), and training lowers it */
    char up[600], dense[600];
    snprintf(up, sizeof up, "%s/moe_upcycled", t_tmpdir());
    snprintf(dense, sizeof dense, "%s/full", t_tmpdir());
    snprintf(extra, sizeof extra, "--steps 16 --experts 4 --init-from %s", dense);
    train_args_from(args, sizeof args, up, extra);
    T_CHECK(run_nerve(args, err, sizeof err) == 0 && strstr(err, "upcycled: 4 experts"), "upcycling: %s", err);
    const float d24 = val_at(dense, 24), u0 = val_at(up, 0), u16 = val_at(up, 16);
    T_CHECK(fabsf(u0 - d24) <= 1e-4f * d24 && u16 < u0, "upcycled: validation loss %g at the start (the dense model's %g), %g after",
            u0, d24, u16);
    nv_config uc;
    T_CHECK(run_gguf_is_ckpt(up, &uc) && uc.n_experts == 4 && uc.n_experts_used == 2, "%d experts", uc.n_experts);
    snprintf(extra, sizeof extra, "--steps 2 --experts 4 --lora-rank 4 --init-from %s", dense);
    train_args_from(args, sizeof args, other, extra);
    T_CHECK(run_nerve(args, err, sizeof err) == 2 && strstr(err, "drop --lora-rank"), "%s", err);
    /* preference losses have no share for the balance term: refused in one line */
    char pref[700];
    snprintf(pref, sizeof pref, "%s/moe_pref.jsonl", t_tmpdir());
    FILE *f = fopen(pref, "w");
    for (int i = 0; f && i < 8; i++) fprintf(f, "{\"prompt\": \"Tom had a dog.\", \"chosen\": \" It was big.\", \"rejected\": \" no\"}\n");
    if (f) fclose(f);
    snprintf(args, sizeof args, "train --init-from %s --data %s --steps 2 --batch 2 --seq 128 --quiet --out %s", dir, pref, other);
    const int prc = run_nerve(args, err, sizeof err);
    const char *said = strstr(err, "nerve train: preference training of a mixture-of-experts");
    T_CHECK(prc == 1 && said && strchr(said, '\n') == err + strlen(err) - 1, "%s", err);
}

/* --recompute: the same losses and validation losses to the last digit as a run that keeps the
 * activations; and a checkpoint of one resumes with the other. */
static void test_recompute_run(void) {
    if (!t_data("corpus/tinystories_valid_head.txt") || !t_data("models/tok512.bin")) return;
    char a[600], b[600], args[4096], err[4096];
    snprintf(a, sizeof a, "%s/rc_keep", t_tmpdir());
    snprintf(b, sizeof b, "%s/rc_again", t_tmpdir());
    train_args(args, sizeof args, a, "");
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "kept: %s", err);
    train_args(args, sizeof args, b, "--recompute");
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "recomputed: %s", err);
    char la[64][32], lb[64][32], vb[64][32], va[64][32];
    int na = read_losses(a, la, 64), nb = read_losses(b, lb, 64);
    T_CHECK(na == 24 && nb == 24, "steps %d and %d", na, nb);
    for (int i = 0; i < na && i < nb; i++) T_CHECK(!strcmp(la[i], lb[i]), "step %d: loss %s kept, %s recomputed", i + 1, la[i], lb[i]);
    const int nva = read_field(a, "\"val_loss\":", va, 64), nvb = read_field(b, "\"val_loss\":", vb, 64);
    T_CHECK(nva == nvb && nva >= 3 && !strcmp(va[nva - 1], vb[nvb - 1]), "validation %s kept, %s recomputed", va[nva - 1], vb[nvb - 1]);
    /* stopped after a step recomputed, resumed keeping them */
    snprintf(b, sizeof b, "%s/rc_mixed", t_tmpdir());
    train_args(args, sizeof args, b, "--recompute --time-limit 0.0001");
    T_CHECK(run_nerve(args, err, sizeof err) == 0 && count_steps(b) < 24, "stopped: %s", err);
    train_args(args, sizeof args, b, "--resume");
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "resumed: %s", err);
    nb = read_losses(b, lb, 64);
    T_CHECK(nb == 24, "steps %d", nb);
    for (int i = 0; i < na && i < nb; i++) T_CHECK(!strcmp(la[i], lb[i]), "step %d: loss %s kept, %s mixed", i + 1, la[i], lb[i]);
}

/* A checkpoint of config c with zero weights and moments (*p, *m, *v, n of each: returned) saved to
 * path with header *h and loaded into *k. */
static size_t zero_ckpt(const nv_config *c, const char *path, nv_ckpt_header *h, float **p, float **m, float **v, nv_ckpt *k) {
    memset(h, 0, sizeof *h);
    nv_ckpt_header_set_config(h, c);
    h->n_params = nv_config_param_count(c);
    const size_t n = (size_t)h->n_params;
    *p = calloc(n, sizeof(float)), *m = calloc(n, sizeof(float)), *v = calloc(n, sizeof(float));
    T_CHECK(nv_ckpt_save(path, h, *p, *m, *v) == NV_OK && nv_ckpt_load(path, k) == NV_OK, "%s", nv_errmsg());
    return n;
}

/* A checkpoint written by nv_ckpt_save loads back; header flags other than 0/1 are refused
 * (found by fuzz/fuzz_ckpt.c: any non-zero value used to read as true). */

/* A checkpoint of header h written as format version ver wrote it: its first hb header bytes. */
static void write_ckpt_version(const char *path, const nv_ckpt_header *h, uint32_t ver, uint32_t hb, const float *p, const float *m,
                               const float *v, size_t n) {
    uint64_t sum = nv_checksum64("NVCKPT01", 8, 0);
    sum = nv_checksum64(&ver, 4, sum), sum = nv_checksum64(&hb, 4, sum), sum = nv_checksum64(h, hb, sum);
    for (int part = 0; part < 3; part++) sum = nv_checksum64(part == 0 ? p : part == 1 ? m : v, n * sizeof(float), sum);
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite("NVCKPT01", 1, 8, f), fwrite(&ver, 4, 1, f), fwrite(&hb, 4, 1, f), fwrite(h, 1, hb, f);
        fwrite(p, sizeof(float), n, f), fwrite(m, sizeof(float), n, f), fwrite(v, sizeof(float), n, f), fwrite(&sum, 8, 1, f);
        fclose(f);
    }
}

/* c's fields of the newest checkpoint version survive its round trip; a file of config w written as
 * the older version ver (its first hb header bytes) loads as `older`, without them. */
static void newer_fields_case(const char *path, const nv_config *c, const nv_config *w, const nv_config *older, uint32_t ver,
                              uint32_t hb, const char *what) {
    nv_ckpt_header h;
    nv_ckpt k;
    nv_config back;
    float *p, *m, *v;
    size_t n = zero_ckpt(c, path, &h, &p, &m, &v, &k);
    nv_ckpt_header_get_config(&k.h, &back);
    T_CHECK(!memcmp(&back, c, sizeof back), "%s: not kept through the round trip", what);
    nv_ckpt_close(&k);
    free(p), free(m), free(v);
    n = zero_ckpt(w, path, &h, &p, &m, &v, &k);
    nv_ckpt_close(&k);
    write_ckpt_version(path, &h, ver, hb, p, m, v, n);
    const nv_err e = nv_ckpt_load(path, &k);
    T_CHECK(e == NV_OK, "a version %u checkpoint: %s", ver, nv_errmsg());
    if (e == NV_OK) {
        nv_ckpt_header_get_config(&k.h, &back);
        T_CHECK(!memcmp(&back, older, sizeof back), "a version %u checkpoint read %s", ver, what);
        nv_ckpt_close(&k);
    }
    free(p), free(m), free(v);
}

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
    h.qk_norm = 3; /* 2: over whole projections (OLMo 2), below */
    T_CHECK(nv_ckpt_save(path, &h, p, m, v) == NV_OK, "%s", nv_errmsg());
    T_CHECK(nv_ckpt_load(path, &k) == NV_EFORMAT && strstr(nv_errmsg(), "must be 0 or 1"), "flag 3 accepted: %s", nv_errmsg());
    free(p), free(m), free(v);
    /* the projection-bias flag (qwen2): kept, and refused when neither 0 nor 1 */
    c.qkv_bias = 1;
    n = zero_ckpt(&c, path, &h, &p, &m, &v, &k);
    nv_config back;
    nv_ckpt_header_get_config(&k.h, &back);
    T_CHECK(back.qkv_bias == 1 && !memcmp(&back, &c, sizeof c), "the bias flag survives the round trip");
    nv_ckpt_close(&k);
    h.qkv_bias = 3;
    T_CHECK(nv_ckpt_save(path, &h, p, m, v) == NV_OK, "%s", nv_errmsg());
    T_CHECK(nv_ckpt_load(path, &k) == NV_EFORMAT && strstr(nv_errmsg(), "must be 0 or 1"), "bias flag 3 accepted: %s", nv_errmsg());
    free(p), free(m), free(v);
    /* RoPE factors and YaRN's parameters (version 3) survive; a version 2 file (a 144-byte header,
       none of them) still loads */
    T_CHECK(nv_config_preset("stories260K", &c) == NV_OK, "%s", nv_errmsg());
    const nv_rope_yarn y = {8.0f, 64, 32.0f, 1.0f, 0.0f, 1};
    T_CHECK(nv_config_rope_yarn(&c, &y) == NV_OK, "%s", nv_errmsg());
    n = zero_ckpt(&c, path, &h, &p, &m, &v, &k);
    nv_ckpt_header_get_config(&k.h, &back);
    T_CHECK(!memcmp(&back, &c, sizeof c) && back.yarn.no_truncate == 1, "YaRN does not survive the round trip");
    nv_ckpt_close(&k);
    free(p), free(m), free(v);
    nv_config l3; /* Llama 3.1's rule beside its divisors, as a config.json gives it */
    T_CHECK(nv_config_preset("stories260K", &l3) == NV_OK, "%s", nv_errmsg());
    l3.n_rope_factors = l3.head_dim / 2;
    for (int i = 0; i < l3.n_rope_factors; i++) l3.rope_factors[i] = 1.0f + (float)i;
    l3.llama3 = (nv_rope_llama3){8.0f, 1.0f, 4.0f, 64};
    n = zero_ckpt(&l3, path, &h, &p, &m, &v, &k);
    nv_ckpt_header_get_config(&k.h, &back);
    T_CHECK(!memcmp(&back, &l3, sizeof l3), "Llama 3.1's rule does not survive the round trip");
    nv_ckpt_close(&k);
    free(p), free(m), free(v);
    n = zero_ckpt(&c, path, &h, &p, &m, &v, &k);
    nv_ckpt_close(&k);
    nv_ckpt_header h2 = h;
    h2.n_rope_factors = 0, h2.yarn_factor = 0; /* written as version 2 wrote it */
    memset(h2.rope_factors, 0, sizeof h2.rope_factors);
    write_ckpt_version(path, &h2, 2, 144, p, m, v, n);
    T_CHECK(nv_ckpt_load(path, &k) == NV_OK && k.h.n_rope_factors == 0, "a version 2 checkpoint: %s", nv_errmsg());
    nv_ckpt_close(&k);
    free(p), free(m), free(v);
    /* SmolLM3's layers without RoPE (version 4) survive; a version 3 file (a 1216-byte header) reads as none */
    nv_config base, sm;
    T_CHECK(nv_config_preset("stories260K", &base) == NV_OK, "%s", nv_errmsg());
    sm = base;
    sm.nope_period = 4;
    newer_fields_case(path, &sm, &sm, &base, 3, 1216, "the layers without RoPE");
    /* the Gemma block (version 5) survives; a version 4 file (a 1224-byte header) reads as llama's */
    nv_config gm = base;
    gm.swa_window = 64, gm.swa_period = 6, gm.rope_theta_swa = 10000.0f, gm.ffn_gelu = 1, gm.post_norms = 1;
    gm.emb_scale = 8.0f, gm.attn_div = 4.0f, gm.logit_softcap = 30.0f, gm.attn_softcap = 50.0f;
    nv_config gm_v4 = gm;
    gm_v4.post_norms = 0; /* their weights would not be counted by a version 4 reader */
    newer_fields_case(path, &gm, &gm_v4, &base, 4, 1224, "the Gemma block");
    /* Granite's multipliers (version 6) survive; a version 5 file (a 1264-byte header) reads without them */
    nv_config gr = base, gr_v5;
    nv_config_set_granite(&gr, 12.0f, 0.0078125f, 0.22f, 8.0f);
    gr_v5 = gr;
    gr_v5.residual_scale = gr_v5.logit_div = 0.0f;
    newer_fields_case(path, &gr, &gr, &gr_v5, 5, 1264, "Granite's multipliers");
    /* partial rotation (version 7) survives; version 6's reserved field reads as none */
    nv_config pr = base;
    pr.rope_dim = base.head_dim / 2;
    newer_fields_case(path, &pr, &pr, &base, 6, 1272, "partial rotation");
    /* LongRoPE's short set (version 8) survives; a version 7 file reads its long set alone */
    nv_config lr = base, lr_v7;
    lr.n_rope_factors = base.head_dim / 2, lr.longrope_orig = 100, lr.rope_attn = 1.25f;
    for (int i = 0; i < lr.n_rope_factors; i++) lr.rope_factors[i] = 2.0f + (float)i, lr.rope_factors_short[i] = 1.0f + 0.1f * (float)i;
    lr_v7 = lr;
    lr_v7.longrope_orig = 0;
    memset(lr_v7.rope_factors_short, 0, sizeof lr_v7.rope_factors_short);
    newer_fields_case(path, &lr, &lr, &lr_v7, 7, 1272, "LongRoPE's short set");
    /* OLMo 2's block (version 9: no pre-norms, QK-norm over whole projections) survives; a version 8
       file reads the field's place as the reserved 0 it was, and refuses QK-norm 2 */
    nv_config ol = base, ol_v8 = base;
    ol.post_norms = ol.no_pre_norms = 1, ol.qk_norm = NV_QK_NORM_WHOLE;
    ol_v8.post_norms = 1;
    nv_ckpt_header h8;
    nv_ckpt k8;
    float *p8, *m8, *v8;
    size_t n8 = zero_ckpt(&ol, path, &h8, &p8, &m8, &v8, &k8);
    nv_ckpt_header_get_config(&k8.h, &back);
    T_CHECK(!memcmp(&back, &ol, sizeof back) && k8.h.n_params == nv_config_param_count(&ol), "OLMo 2's block: not kept through the round trip");
    nv_ckpt_close(&k8);
    free(p8), free(m8), free(v8);
    n8 = zero_ckpt(&ol_v8, path, &h8, &p8, &m8, &v8, &k8);
    nv_ckpt_close(&k8);
    h8.no_pre_norms = 1;
    write_ckpt_version(path, &h8, 8, 2304, p8, m8, v8, n8);
    T_CHECK(nv_ckpt_load(path, &k8) == NV_OK, "a version 8 checkpoint: %s", nv_errmsg());
    nv_ckpt_header_get_config(&k8.h, &back);
    T_CHECK(!memcmp(&back, &ol_v8, sizeof back), "a version 8 checkpoint read OLMo 2's block");
    nv_ckpt_close(&k8);
    h8.no_pre_norms = 0, h8.qk_norm = NV_QK_NORM_WHOLE;
    write_ckpt_version(path, &h8, 8, 2304, p8, m8, v8, n8);
    T_CHECK(nv_ckpt_load(path, &k8) == NV_EFORMAT && strstr(nv_errmsg(), "must be 0 or 1"), "a version 8 checkpoint's QK-norm 2: %s", nv_errmsg());
    free(p8), free(m8), free(v8);
    /* the best validation loss (version 10) survives; a version 9 file reads none; values out of range
       are refused */
    n8 = zero_ckpt(&base, path, &h8, &p8, &m8, &v8, &k8);
    nv_ckpt_close(&k8);
    h8.step = 20, h8.best_step = 8, h8.best_val_loss = 1.5f, h8.evals_since_best = 2;
    T_CHECK(nv_ckpt_save(path, &h8, p8, m8, v8) == NV_OK && nv_ckpt_load(path, &k8) == NV_OK, "%s", nv_errmsg());
    T_CHECK(k8.h.best_step == 8 && k8.h.best_val_loss == 1.5f && k8.h.evals_since_best == 2, "the best validation loss: not kept");
    nv_ckpt_close(&k8);
    write_ckpt_version(path, &h8, 9, 2304, p8, m8, v8, n8);
    T_CHECK(nv_ckpt_load(path, &k8) == NV_OK, "a version 9 checkpoint: %s", nv_errmsg());
    T_CHECK(isnan(k8.h.best_val_loss) && k8.h.best_step == 0 && k8.h.evals_since_best == 0, "a version 9 checkpoint read a best loss");
    nv_ckpt_close(&k8);
    const struct {
        int64_t step;
        float val;
        int32_t since;
    } bad[] = {{21, 1.5f, 2}, {-1, 1.5f, 0}, {8, 1.5f, -1}, {8, INFINITY, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        nv_ckpt_header hb = h8;
        hb.best_step = bad[i].step, hb.best_val_loss = bad[i].val, hb.evals_since_best = bad[i].since;
        T_CHECK(nv_ckpt_save(path, &hb, p8, m8, v8) == NV_OK, "%s", nv_errmsg());
        T_CHECK(nv_ckpt_load(path, &k8) == NV_EFORMAT && strstr(nv_errmsg(), "out of range"), "best case %zu: %s", i, nv_errmsg());
    }
    /* the length --time-budget decided (version 11) survives; a version 10 file reads none; one short of
       the steps done, or negative, is refused */
    h8.budget_steps = 300;
    T_CHECK(nv_ckpt_save(path, &h8, p8, m8, v8) == NV_OK && nv_ckpt_load(path, &k8) == NV_OK && k8.h.budget_steps == 300,
            "the decided length: not kept (%s)", nv_errmsg());
    nv_ckpt_close(&k8);
    write_ckpt_version(path, &h8, 10, 2320, p8, m8, v8, n8);
    T_CHECK(nv_ckpt_load(path, &k8) == NV_OK && k8.h.budget_steps == 0 && k8.h.best_val_loss == 1.5f,
            "a version 10 checkpoint: %s", nv_errmsg());
    nv_ckpt_close(&k8);
    /* Ministral 3's attention temperature (version 12) survives; a version 11 file reads none; a bad one is refused */
    nv_config tc, tback;
    nv_ckpt_header_get_config(&h8, &tc);
    tc.attn_temp_scale = 0.1f, tc.attn_temp_len = 16384;
    nv_ckpt_header_set_config(&h8, &tc);
    T_CHECK(nv_ckpt_save(path, &h8, p8, m8, v8) == NV_OK && nv_ckpt_load(path, &k8) == NV_OK, "%s", nv_errmsg());
    nv_ckpt_header_get_config(&k8.h, &tback);
    T_CHECK(tback.attn_temp_scale == 0.1f && tback.attn_temp_len == 16384, "the attention temperature: not kept");
    nv_ckpt_close(&k8);
    write_ckpt_version(path, &h8, 11, 2328, p8, m8, v8, n8);
    T_CHECK(nv_ckpt_load(path, &k8) == NV_OK && k8.h.attn_temp_scale == 0.0f && k8.h.attn_temp_len == 0 && k8.h.budget_steps == 300,
            "a version 11 checkpoint: %s", nv_errmsg());
    nv_ckpt_close(&k8);
    h8.attn_temp_len = 0;
    T_CHECK(nv_ckpt_save(path, &h8, p8, m8, v8) == NV_OK && nv_ckpt_load(path, &k8) == NV_EFORMAT && strstr(nv_errmsg(), "attention temperature"),
            "a temperature without a length: %s", nv_errmsg());
    h8.attn_temp_scale = 0.0f;
    for (int i = 0; i < 2; i++) {
        h8.budget_steps = i ? -1 : h8.step - 1;
        T_CHECK(nv_ckpt_save(path, &h8, p8, m8, v8) == NV_OK, "%s", nv_errmsg());
        T_CHECK(nv_ckpt_load(path, &k8) == NV_EFORMAT && strstr(nv_errmsg(), "out of range"), "decided length %lld: %s",
                (long long)h8.budget_steps, nv_errmsg());
    }
    free(p8), free(m8), free(v8);
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
    nv_config qc;
    T_CHECK(run_gguf_is_ckpt(dir, &qc) && qc.qk_norm && qc.head_dim == 16, "QK-norm %d, head size %d", qc.qk_norm, qc.head_dim);
    snprintf(path, sizeof path, "%s/model.gguf", dir);
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

/* A model whose RoPE is scaled (YaRN here; Llama 3.1+'s factors take the same path) fine-tunes
 * with that rotation: its checkpoint keeps the divisors and YaRN's parameters (version 3), the
 * validation loss before any step differs from the same weights without the scaling, the run
 * ends with a model.gguf of the same scaling, and a resume takes the checkpoint. */
static void test_scaled_rope_finetune(void) {
    const char *bp = t_data("models/stories260K.bin"), *tok = t_data("models/tok512.bin"), *data = t_data("corpus/tinystories_valid_head.txt");
    if (!bp || !tok || !data) return;
    nv_model m;
    T_CHECK(nv_model_load(bp, &m) == NV_OK, "%s", nv_errmsg());
    if (!m.params) return;
    char plain[700], yarn[700], args[4096], err[4096], dy[700], dp[700];
    snprintf(plain, sizeof plain, "%s/plain.gguf", t_tmpdir());
    snprintf(yarn, sizeof yarn, "%s/yarn.gguf", t_tmpdir());
    T_CHECK(nv_gguf_save(&m, NULL, "plain", plain, NV_GGUF_F32, NULL, NULL) == NV_OK, "%s", nv_errmsg());
    const nv_rope_yarn y = {4.0f, 128, 32.0f, 1.0f, 0.0f, 0};
    T_CHECK(nv_config_rope_yarn(&m.config, &y) == NV_OK && nv_gguf_save(&m, NULL, "yarn", yarn, NV_GGUF_F32, NULL, NULL) == NV_OK, "%s",
            nv_errmsg());
    snprintf(dy, sizeof dy, "%s/yarn-run", t_tmpdir());
    snprintf(dp, sizeof dp, "%s/plain-run", t_tmpdir());
    for (int which = 0; which < 2; which++) {
        snprintf(args, sizeof args, "train --init-from %s -z %s --data %s --steps 2 --batch 2 --seq 64 --eval-every 1 --eval-batches 2 "
                 "--seed 5 --quiet --out %s", which ? plain : yarn, tok, data, which ? dp : dy);
        T_CHECK(run_nerve(args, err, sizeof err) == 0, "train failed: %s", err);
    }
    const float vy = val_at(dy, 0), vp = val_at(dp, 0);
    T_CHECK(vy == vy && vp == vp && vy != vp, "validation before training: %g with YaRN, %g without", (double)vy, (double)vp);
    char ck[800], out[800];
    snprintf(ck, sizeof ck, "%s/ckpt.bin", dy);
    snprintf(out, sizeof out, "%s/model.gguf", dy);
    nv_ckpt k;
    nv_model r;
    T_CHECK(nv_ckpt_load(ck, &k) == NV_OK && nv_model_load(out, &r) == NV_OK, "%s", nv_errmsg());
    if (k.params) {
        nv_config kc;
        nv_ckpt_header_get_config(&k.h, &kc);
        T_CHECK(kc.n_rope_factors == m.config.n_rope_factors && kc.yarn.attn_factor == m.config.yarn.attn_factor &&
                    !memcmp(kc.rope_factors, m.config.rope_factors, sizeof kc.rope_factors),
                "the checkpoint lost the scaling");
        nv_ckpt_close(&k);
    }
    if (r.params)
        T_CHECK(r.config.yarn.factor == 4.0f && r.config.yarn.orig_ctx == 128 &&
                    !memcmp(r.config.rope_factors, m.config.rope_factors, sizeof r.config.rope_factors),
                "model.gguf lost the scaling");
    nv_model_free(&r);
    snprintf(args, sizeof args, "train --init-from %s -z %s --data %s --steps 3 --batch 2 --seq 64 --eval-every 1 --eval-batches 2 "
             "--seed 5 --quiet --out %s --resume", yarn, tok, data, dy);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "resume failed: %s", err);
    nv_model_free(&m);
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

/* --val-data: its files validate whole and --data's train whole (token counts exact); the
 * validation loss of a starting model depends on --val-data's tokens alone; --val-frac beside it is
 * a usage error. */
/* The TinyStories text's first `chars` characters in tok512's tokens (a BOS first) into *ids
 * (malloc'd); their number, or 0 (a failed check) when the files are not there or give fewer than
 * `want`. */
static int story_tokens(size_t chars, int want, int **ids) {
    const char *tokp = t_data("models/tok512.bin"), *text_path = t_data("corpus/tinystories_valid_head.txt");
    nv_tokenizer *tok = NULL;
    char *text = NULL;
    size_t len = 0;
    int n = 0;
    *ids = NULL;
    if (!tokp || !text_path) return 0;
    if (nv_tokenizer_load(tokp, 512, &tok) == NV_OK && nv_file_read_all(text_path, &text, &len) == NV_OK) {
        if (len > chars) text[chars] = '\0';
        if (nv_tokenizer_encode(tok, text, 1, 0, ids, &n) != NV_OK) n = 0;
    }
    T_CHECK(n >= want, "%d tokens: %s", n, nv_errmsg());
    free(text);
    nv_tokenizer_free(tok);
    if (n >= want) return n;
    free(*ids);
    *ids = NULL;
    return 0;
}

/* ids[0, n) as a uint16 shard file `name` of the test folder, its path into out. */
static void u16_shard(const char *name, const int *ids, int n, char *out, size_t cap) {
    uint16_t *u = malloc((size_t)n * sizeof *u);
    for (int i = 0; u && i < n; i++) u[i] = (uint16_t)ids[i];
    snprintf(out, cap, "%s", u ? t_write(name, u, (size_t)n * 2) : "");
    free(u);
}

static void test_val_data_files(void) {
    const char *m = t_data("models/stories260K.bin"), *tokp = t_data("models/tok512.bin");
    int *ids;
    if (!m || !tokp || !story_tokens(40000, 4000, &ids)) return;
    char model[600], tpath[600], args[4096], err[4096], dir[3][600], shard[3][600];
    snprintf(model, sizeof model, "%s", m);
    snprintf(tpath, sizeof tpath, "%s", tokp);
    const int at[3] = {0, 2000, 3000}, count[3] = {2000, 600, 600}; /* A trains; B and C validate */
    for (int k = 0; k < 3; k++) {
        char name[32];
        snprintf(name, sizeof name, "part%d.bin", k);
        u16_shard(name, ids + at[k], count[k], shard[k], sizeof shard[k]);
        snprintf(dir[k], sizeof dir[k], "%s/valdata%d", t_tmpdir(), k);
    }
    free(ids);
    const int runs[3][2] = {{0, 1}, {2, 1}, {0, 2}}; /* (--data, --val-data) */
    float val[3];
    for (int r = 0; r < 3; r++) {
        snprintf(args, sizeof args,
                 "train --init-from %s -z %s --data %s --val-data %s --steps 1 --batch 2 --seq 64 --eval-every 1 --eval-batches 4 "
                 "--quiet --out %s",
                 model, tpath, shard[runs[r][0]], shard[runs[r][1]], dir[r]);
        T_CHECK(run_nerve(args, err, sizeof err) == 0, "run %d: %s", r, err);
        char want[96];
        snprintf(want, sizeof want, "data: %d training tokens, %d validation tokens", count[runs[r][0]], count[runs[r][1]]);
        T_CHECK(strstr(err, want) != NULL, "run %d: wanted '%s' in %s", r, want, err);
        val[r] = val_at(dir[r], 0);
    }
    T_CHECK(isfinite(val[0]) && val[0] == val[1], "the same --val-data gave %.6f and %.6f", val[0], val[1]);
    T_CHECK(isfinite(val[2]) && val[2] != val[0], "another --val-data gave the same loss %.6f", val[2]);
    snprintf(args, sizeof args, "train --data %s --val-data %s --val-frac 0.1 --out %s/valdata-x", shard[0], shard[1], t_tmpdir());
    T_CHECK(run_nerve(args, err, sizeof err) == 2 && strstr(err, "--val-data and --val-frac exclude each other"), "both: %s", err);
    snprintf(args, sizeof args, "train --data %s --val-data --out %s/valdata-y", shard[0], t_tmpdir());
    T_CHECK(run_nerve(args, err, sizeof err) == 2 && strstr(err, "--val-data needs at least one path"), "no path: %s", err);
}

/* The "Final estimate" line of `nerve perplexity` on model (a file or a folder), "" when it failed. */
static void perplexity_line(const char *model, char *out, size_t cap) {
    char args[2048], cmd[4096], path[700], *text = NULL;
    const char *tok = t_data("models/tok512.bin"), *val = t_data("corpus/tinystories_valid_head.txt");
    snprintf(path, sizeof path, "%s/ppl.txt", t_tmpdir());
    snprintf(args, sizeof args, "perplexity -m %s%s%s -f %s --ctx 64 --chunks 4", model, strstr(model, ".bin") ? " -z " : "",
             strstr(model, ".bin") ? tok : "", val ? val : "x");
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>/dev/null", t_nerve_bin(), args, path);
    out[0] = '\0';
    if (system(cmd) == 0 && nv_file_read_all(path, &text, NULL) == NV_OK) {
        const char *at = strstr(text, "Final estimate");
        if (at) snprintf(out, cap, "%.*s", (int)strcspn(at, "\n"), at);
    }
    free(text);
}

/* Saves that fail: a final model that cannot be written (its path a folder) fails the run, saying the
 * checkpoint holds the weights; a best/ that cannot be written (its .part a file) is a warning, and
 * the run's figures name what best/ holds (no best, here), not the evaluation it failed to keep. */
static void test_failed_saves(void) {
    if (!t_data("corpus/tinystories_valid_head.txt") || !t_data("models/tok512.bin")) return;
    char dir[700], path[800], args[4096], err[4096];
    snprintf(dir, sizeof dir, "%s/unsaved", t_tmpdir());
    snprintf(path, sizeof path, "%s/model.bin/x", dir);
    T_CHECK(nv_mkdirs(path) == NV_OK, "%s", path);
    train_args(args, sizeof args, dir, "--steps 8");
    const int rc = run_nerve(args, err, sizeof err);
    T_CHECK(rc != 0 && strstr(err, "model.bin is not written") && strstr(err, "nerve export") && count_steps(dir) == 8,
            "a final model that cannot be written: exit %d: %s", rc, err);
    snprintf(dir, sizeof dir, "%s/no_best", t_tmpdir());
    snprintf(path, sizeof path, "%s/.best.part", dir);
    T_CHECK(nv_mkdirs(dir) == NV_OK && t_write("no_best/.best.part", "x", 1), "%s", path);
    train_args(args, sizeof args, dir, "--steps 16 --save-best");
    T_CHECK(run_nerve(args, err, sizeof err) == 0 && strstr(err, "are not saved") && !strstr(err, "best validation loss"),
            "a best/ that cannot be written: %s", err);
    nv_ckpt k;
    snprintf(path, sizeof path, "%s/ckpt.bin", dir);
    if (nv_ckpt_load(path, &k) == NV_OK) {
        T_CHECK(isnan(k.h.best_val_loss), "the checkpoint's best: %g at step %lld", (double)k.h.best_val_loss, (long long)k.h.best_step);
        nv_ckpt_close(&k);
    } else {
        T_CHECK(0, "%s", nv_errmsg());
    }
    /* a LoRA run whose last checkpoint's adapters cannot be written fails rather than leave an
       earlier checkpoint's adapter.gguf (or none) as the run's */
    const char *base = t_data("models/stories260K.bin");
    if (!base) return;
    char base_path[700];
    snprintf(base_path, sizeof base_path, "%s", base);
    snprintf(dir, sizeof dir, "%s/no_adapters", t_tmpdir());
    snprintf(path, sizeof path, "%s/adapter.gguf/x", dir);
    T_CHECK(nv_mkdirs(path) == NV_OK, "%s", path);
    train_args_from(args, sizeof args, dir, "--steps 4 --lora-rank 4 --no-merge");
    char with_base[4096 + 720];
    snprintf(with_base, sizeof with_base, "%s --init-from %s", args, base_path);
    const int lrc = run_nerve(with_base, err, sizeof err);
    T_CHECK(lrc != 0 && strstr(err, "adapter.gguf is not written") && strstr(err, "ckpt.bin holds the adapters"), "exit %d: %s", lrc, err);
}

/* --save-best and --early-stop. stories260K fine-tuned on text unlike its own (a few made-up words
 * repeated) while validating on TinyStories: the validation loss is lowest before the first step,
 * so --early-stop 3 stops after three evaluations, best/ holds the starting weights as a model
 * folder (perplexity as the starting model's, to the digit), the checkpoint keeps the best; resumed,
 * the run has nothing to do, and with a higher --early-stop it trains on without overwriting best/
 * (the best restored, not forgotten). A run from scratch whose validation loss falls keeps its
 * lowest step's weights; a LoRA run its adapters and the model they make; a new run in the folder drops an old best/;
 * without validation the flags are refused. */
static void test_save_best_and_early_stop(void) {
    const char *m_at = t_data("models/stories260K.bin"), *tok_at = t_data("models/tok512.bin");
    const char *val = t_data("corpus/tinystories_valid_head.txt");
    if (!m_at || !tok_at || !val) return;
    char m[600], tok[600]; /* t_data's buffers are reused (perplexity_line takes some) */
    snprintf(m, sizeof m, "%s", m_at);
    snprintf(tok, sizeof tok, "%s", tok_at);
    char odd[700], dir[600], args[4096], err[4096], path[800];
    snprintf(odd, sizeof odd, "%s/odd.txt", t_tmpdir());
    {
        static const char *const words[] = {"zebra", "quantum", "xylophone", "marmalade", "kettle", "ozone", "juniper"};
        FILE *f = fopen(odd, "w");
        uint64_t r = 1;
        for (int d = 0; f && d < 200; d++, fputs("\n\n", f))
            for (int w = 0; w < 60; w++) r = r * 6364136223846793005ull + 1442695040888963407ull, fprintf(f, "%s ", words[(r >> 33) % 7]);
        if (f) fclose(f);
    }
    snprintf(dir, sizeof dir, "%s/best_run", t_tmpdir());
    char common[3000];
    snprintf(common, sizeof common,
             "train --init-from %s -z %s --data %s --val-data %s --steps 40 --batch 4 --seq 64 --lr 3e-3 --warmup 2 --eval-every 4 "
             "--eval-batches 4 --quiet",
             m, tok, odd, val);
    snprintf(args, sizeof args, "%s --early-stop 3 --out %s", common, dir);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "early stop run: %s", err);
    T_CHECK(count_steps(dir) == 12 && strstr(err, "stopped early at step 12") && strstr(err, "at step 0"), "%d steps: %s", count_steps(dir), err);
    char want[512], got[512];
    perplexity_line(m, want, sizeof want);
    snprintf(path, sizeof path, "%s/best", dir);
    perplexity_line(path, got, sizeof got);
    T_CHECK(want[0] && !strcmp(want, got), "best/ is not the starting model: '%s' against '%s'", got, want);
    nv_ckpt k;
    snprintf(path, sizeof path, "%s/ckpt.bin", dir);
    if (nv_ckpt_load(path, &k) == NV_OK) {
        T_CHECK(k.h.step == 12 && k.h.best_step == 0 && k.h.best_val_loss == val_at(dir, 0) && k.h.evals_since_best == 3,
                "checkpoint: step %lld, best %g at %lld, %d since", (long long)k.h.step, (double)k.h.best_val_loss,
                (long long)k.h.best_step, (int)k.h.evals_since_best);
        nv_ckpt_close(&k);
    } else {
        T_CHECK(0, "%s", nv_errmsg());
    }
    char *before = NULL, *after = NULL;
    size_t nb = 0, na = 0;
    snprintf(path, sizeof path, "%s/best/model.bin", dir);
    nv_file_read_all(path, &before, &nb);
    snprintf(args, sizeof args, "%s --early-stop 3 --resume --out %s", common, dir);
    T_CHECK(run_nerve(args, err, sizeof err) == 0 && strstr(err, "nothing to do") && count_steps(dir) == 12, "resumed: %s", err);
    snprintf(args, sizeof args, "%s --early-stop 4 --resume --out %s", common, dir);
    T_CHECK(run_nerve(args, err, sizeof err) == 0 && count_steps(dir) == 16 && strstr(err, "stopped early at step 16"), "trained on: %s", err);
    nv_file_read_all(path, &after, &na);
    T_CHECK(before && after && nb == na && !memcmp(before, after, nb), "best/model.bin changed after the resume");
    free(before), free(after);

    /* LoRA: best/ holds the adapters (of step 0 here) and the model they make, the starting one */
    char lora_dir[700];
    snprintf(lora_dir, sizeof lora_dir, "%s/best_lora", t_tmpdir());
    snprintf(args, sizeof args, "%s --lora-rank 4 --early-stop 2 --out %s", common, lora_dir);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "LoRA run: %s", err);
    snprintf(path, sizeof path, "%s/best/adapter.gguf", lora_dir);
    T_CHECK(nv_file_exists(path), "no %s: %s", path, err);
    snprintf(path, sizeof path, "%s/best/adapter_config.json", lora_dir);
    T_CHECK(nv_file_exists(path), "no %s", path);
    snprintf(path, sizeof path, "%s/best", lora_dir);
    perplexity_line(path, got, sizeof got);
    T_CHECK(want[0] && !strcmp(want, got), "a LoRA run's best/ is not the starting model: '%s' against '%s'", got, want);
    /* validated on its own kind of text, the loss falls to the last step: best/model.bin is the run's
       merged model.bin byte for byte (merged from best/adapter.gguf as read back) */
    snprintf(args, sizeof args,
             "train --init-from %s -z %s --data %s --val-frac 0.1 --steps 12 --batch 4 --seq 64 --lr 3e-3 --warmup 2 "
             "--eval-every 4 --eval-batches 4 --quiet --lora-rank 4 --save-best --out %s",
             m, tok, odd, lora_dir);
    snprintf(path, sizeof path, "%s/ckpt.bin", lora_dir);
    unlink(path);
    T_CHECK(run_nerve(args, err, sizeof err) == 0 && strstr(err, "at step 12"), "LoRA run on its own text: %s", err);
    char final_path[800];
    snprintf(path, sizeof path, "%s/best/model.bin", lora_dir);
    snprintf(final_path, sizeof final_path, "%s/model.bin", lora_dir);
    T_CHECK(t_same_files(path, final_path), "a LoRA run's best/model.bin is not its merged model");

    /* from scratch, the validation loss falls: best/ holds the lowest step's weights (the last's:
       the run's own model.bin, byte for byte) */
    snprintf(dir, sizeof dir, "%s/best_scratch", t_tmpdir());
    train_args(args, sizeof args, dir, "--save-best");
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "run: %s", err);
    char vals[8][32];
    const int nv = read_field(dir, "\"val_loss\":", vals, 8);
    int low = 0;
    for (int i = 1; i < nv; i++)
        if (strtod(vals[i], NULL) < strtod(vals[low], NULL)) low = i;
    T_CHECK(nv == 4 && low == 3, "validation losses (%d): the lowest is evaluation %d", nv, low);
    snprintf(path, sizeof path, "%s/best/model.bin", dir);
    snprintf(final_path, sizeof final_path, "%s/model.bin", dir);
    T_CHECK(t_same_files(path, final_path), "best/model.bin is not the last step's model");
    /* a new run in the folder, without the flag, drops the earlier run's best/ */
    train_args(args, sizeof args, dir, "--steps 2");
    snprintf(path, sizeof path, "%s/ckpt.bin", dir);
    unlink(path);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "rerun: %s", err);
    snprintf(path, sizeof path, "%s/best", dir);
    T_CHECK(!nv_file_exists(path), "%s outlived a new run", path);

    /* no validation: refused in one line */
    train_args(args, sizeof args, dir, "--save-best --val-frac 0 --resume");
    T_CHECK(run_nerve(args, err, sizeof err) == 1 && strstr(err, "follow the validation loss"), "no validation: %s", err);
    train_args(args, sizeof args, dir, "--early-stop 2 --eval-every 0 --resume");
    T_CHECK(run_nerve(args, err, sizeof err) == 1 && strstr(err, "follow the validation loss"), "no evaluations: %s", err);
    train_args(args, sizeof args, dir, "--early-stop 0");
    T_CHECK(run_nerve(args, err, sizeof err) == 2, "--early-stop 0: %s", err);
}

/* --epochs sets the run's length from the data: ceil(F x (training tokens / seq) / batch) steps,
 * each step's metrics carrying the passes so far (the last one's F, to a step's worth); with
 * --steps it is a usage error. */
static void test_epochs(void) {
    const char *data = t_data("corpus/tinystories_valid_head.txt"), *tok = t_data("models/tok512.bin");
    if (!data || !tok) return;
    char args[4096], err[4096], dir[600];
    snprintf(dir, sizeof dir, "%s/epochs", t_tmpdir());
    snprintf(args, sizeof args,
             "train --dim 32 --layers 2 --heads 4 --kv-heads 2 --hidden 64 --data %s -z %s --epochs 0.5 --batch 16 --seq 32 "
             "--eval-every 0 --quiet --out %s",
             data, tok, dir);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "run: %s", err);
    const char *at = strstr(err, "data: ");
    const double n_train = at ? strtod(at + 6, NULL) : 0, windows = n_train / 32;
    const int want = (int)ceil(0.5 * windows / 16);
    char ep[2048][32];
    const int n = read_field(dir, "\"epoch\":", ep, 2048);
    T_CHECK(n_train > 0 && n == want, "%d steps logged for %.0f training tokens, want %d", n, n_train, want);
    const double last = n ? strtod(ep[n - 1], NULL) : 0, first = n ? strtod(ep[0], NULL) : 0;
    T_CHECK(last >= 0.5 && last < 0.5 + 16 / windows && fabs(first - 16 / windows) < 1e-6, "epochs %.6f .. %.6f", first, last);
    T_CHECK(strstr(err, "0.5 epochs: ") && strstr(err, "epochs) in "), "no epochs said: %s", err);
    snprintf(args, sizeof args, "train --data %s -z %s --epochs 1 --steps 5 --out %s/epochs2", data, tok, t_tmpdir());
    T_CHECK(run_nerve(args, err, sizeof err) == 2 && strstr(err, "exclude each other"), "both: %s", err);
}

/* nerve tokenize -o writes the text's tokens as nerve train reads them: a run on the shard logs the
 * same losses, bit for bit, as the run on the text; the uint32 form too; and its refusals. */
static void test_pretokenized_shard(void) {
    const char *data = t_data("corpus/tinystories_valid_head.txt"), *tok = t_data("models/tok512.bin");
    if (!data || !tok) return;
    char text[600], tokp[600], args[4096], err[4096], dirs[3][600], shard[2][600];
    snprintf(text, sizeof text, "%s", data);
    snprintf(tokp, sizeof tokp, "%s", tok);
    const char *ext[2] = {"bin", "u32"};
    for (int k = 0; k < 2; k++) {
        snprintf(shard[k], sizeof shard[k], "%s/valid.%s", t_tmpdir(), ext[k]);
        snprintf(args, sizeof args, "tokenize -z %s -o %s %s", tokp, shard[k], text);
        T_CHECK(run_nerve(args, err, sizeof err) == 0 && strstr(err, "tokens from 1 file"), "tokenize -o %s: %s", ext[k], err);
    }
    const char *runs[3] = {text, shard[0], shard[1]};
    char loss[3][64][32];
    int n[3];
    for (int r = 0; r < 3; r++) {
        snprintf(dirs[r], sizeof dirs[r], "%s/shardrun%d", t_tmpdir(), r);
        snprintf(args, sizeof args,
                 "train --dim 32 --layers 2 --heads 4 --kv-heads 2 --hidden 64 --data %s -z %s --steps 6 --batch 4 --seq 32 "
                 "--eval-every 3 --eval-batches 2 --seed 5 --quiet --out %s",
                 runs[r], tokp, dirs[r]);
        T_CHECK(run_nerve(args, err, sizeof err) == 0, "run %d: %s", r, err);
        n[r] = read_field(dirs[r], "\"loss\":", loss[r], 64);
    }
    for (int r = 1; r < 3; r++) {
        int same = n[r] == n[0] && n[0] == 6;
        for (int i = 0; same && i < n[0]; i++) same = !strcmp(loss[r][i], loss[0][i]);
        T_CHECK(same, "the %s shard's losses differ from the text's (%d vs %d steps)", ext[r - 1], n[r], n[0]);
    }
    static const struct {
        const char *args, *want;
        int rc;
    } bad[] = {{"-o %s/x.txt %s", "a shard is named .bin (uint16) or .u32 (uint32)", 2},
               {"-o %s/x.bin", "name at least one", 2},
               {"-o %s/x.bin --bos %s", "not --bos", 2},
               {"-o %s/x.bin %s/none.txt", "none.txt", 1},
               {"-o %s/x.bin chats.jsonl", "chat data", 2}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char rest[1400];
        snprintf(rest, sizeof rest, bad[i].args, t_tmpdir(), i == 3 ? t_tmpdir() : text);
        snprintf(args, sizeof args, "tokenize -z %s %s", tokp, rest);
        const int rc = run_nerve(args, err, sizeof err);
        T_CHECK(rc == bad[i].rc && strstr(err, bad[i].want) && strchr(err, '\n') == strrchr(err, '\n'), "`%s`: exit %d %s", args, rc, err);
    }
}

static int read_values(const char *dir, const char *key, double *v, int max);

/* `nerve perplexity ARGS --json`'s acc_norm (NAN when it fails). */
static double perplexity_acc_norm(const char *args) {
    char cmd[8192], line[4096] = "";
    snprintf(cmd, sizeof cmd, "%s perplexity %s --json 2>/dev/null", t_nerve_bin(), args);
    FILE *p = popen(cmd, "r");
    if (!p) return NAN;
    if (!fgets(line, sizeof line, p)) line[0] = '\0';
    pclose(p);
    const char *v = strstr(line, "\"acc_norm\":");
    return v ? strtod(v + 11, NULL) : NAN;
}

/* --eval-choice: multiple-choice accuracy at step 0 and at every evaluation, in metrics.jsonl and on
 * the progress line; the figures are what `nerve perplexity --multiple-choice` gives the starting
 * model and the run's model (the same engine: the same bits); refusals. */
static void test_eval_choice_during_training(void) {
    const char *m = t_data("models/stories260K.bin"), *tok = t_data("models/tok512.bin");
    const char *data = t_data("corpus/tinystories_valid_head.txt");
    if (!m || !tok || !data) return;
    char model[600], tokp[600], text[600];
    snprintf(model, sizeof model, "%s", m);
    snprintf(tokp, sizeof tokp, "%s", tok);
    snprintf(text, sizeof text, "%s", data);
    static const char *const tasks =
        "{\"ctx\": \"Once upon a time, there was a little\", \"endings\": [\"girl named Lily.\", \"of the the of.\", \"blue went sky "
        "ran.\"], \"label\": 0}\n"
        "{\"ctx\": \"Tim and his mom went to the\", \"endings\": [\"ball ball ball.\", \"park to play.\"], \"label\": 1}\n"
        "{\"ctx\": \"The cat was very\", \"endings\": [\"and the\", \"happy.\", \"tree the.\"], \"label\": 1}\n"
        "{\"ctx\": \"She wanted to play with her\", \"endings\": [\"toys.\", \"went went.\"], \"label\": 0}\n"
        "{\"ctx\": \"One day, a big dog\", \"endings\": [\"the the the.\", \"saw a bird.\", \"of.\"], \"label\": 1}\n"
        "{\"ctx\": \"Lily said, \\\"Thank you,\", \"endings\": [\"Mom!\\\"\", \"tree dog.\"], \"label\": 0}\n";
    char tasks_path[600], dir[600], args[4096], err[8192], pargs[2048];
    snprintf(tasks_path, sizeof tasks_path, "%s", t_write("mc.jsonl", tasks, strlen(tasks)));
    snprintf(dir, sizeof dir, "%s/mc_run", t_tmpdir());
    snprintf(args, sizeof args,
             "train --init-from %s -z %s --data %s --steps 8 --batch 4 --seq 64 --lr 1e-3 --eval-every 4 --eval-batches 1 "
             "--eval-choice %s --engine avx2 --out %s",
             model, tokp, text, tasks_path, dir);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "train: %s", err);
    T_CHECK(strstr(err, "step 0/8 | val ") && strstr(err, "| mc "), "no accuracy on the progress line: %s", err);
    double acc[8];
    const int n = read_values(dir, "\"mc_acc_norm\":", acc, 8);
    T_CHECK(n == 3, "%d evaluations of the tasks, not 3 (steps 0, 4, 8)", n);
    snprintf(pargs, sizeof pargs, "-m %s -z %s --multiple-choice %s --engine avx2", model, tokp, tasks_path);
    const double start = perplexity_acc_norm(pargs);
    snprintf(pargs, sizeof pargs, "-m %s --multiple-choice %s --engine avx2", dir, tasks_path);
    const double end = perplexity_acc_norm(pargs);
    T_CHECK(n == 3 && fabs(acc[0] * 100 - start) < 1e-9 && fabs(acc[2] * 100 - end) < 1e-9,
            "mc_acc_norm %g .. %g, perplexity %g .. %g", n ? acc[0] : NAN, n == 3 ? acc[2] : NAN, start, end);
    T_CHECK(start > 50, "stories260K picks %g%% of the easy tasks", start);
    /* refused */
    const struct {
        const char *extra, *want;
        int rc;
    } bad[] = {
        {"--eval-choice-tasks 3", "--eval-choice-tasks goes with --eval-choice FILE", 2},
        {"--lora-rank 4 --eval-choice X", "--eval-choice scores whole-model runs", 2},
        {"--eval-every 0 --eval-choice X", "--eval-every must be positive", 2},
        {"--eval-choice /nonexistent/mc.jsonl", "/nonexistent/mc.jsonl", 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "train --init-from %s -z %s --data %s --steps 2 --seq 32 --quiet --out %s/mc_bad %s", model,
                 tokp, text, t_tmpdir(), bad[i].extra);
        T_CHECK(run_nerve(args, err, sizeof err) == bad[i].rc && strstr(err, bad[i].want), "%s: '%s'", bad[i].extra, err);
    }
}

/* --sample-every: samples after the prompt at steps 3 and 6, on stderr and in samples.txt, the same
 * text `nerve generate` writes from the run's model with the same seed and length (scalar engine on
 * both sides: the same sums); training with them logs the same losses as without. */
static void test_samples_during_training(void) {
    char args[4096], err[8192], dir[2][600], extra[300];
    char loss[2][16][32];
    int n[2];
    for (int r = 0; r < 2; r++) {
        snprintf(dir[r], sizeof dir[r], "%s/samples%d", t_tmpdir(), r);
        snprintf(extra, sizeof extra, "--steps 6 --engine scalar %s",
                 r ? "--sample-every 3 --sample-tokens 12 --sample-prompt 'Once upon a time'" : "");
        train_args(args, sizeof args, dir[r], extra);
        T_CHECK(run_nerve(args, err, sizeof err) == 0, "run %d: %s", r, err);
        n[r] = read_field(dir[r], "\"loss\":", loss[r], 16);
    }
    int same = n[0] == 6 && n[1] == 6;
    for (int i = 0; same && i < 6; i++) same = !strcmp(loss[0][i], loss[1][i]);
    T_CHECK(same, "sampling changed the losses");
    char path[700], *text = NULL;
    snprintf(path, sizeof path, "%s/samples.txt", dir[1]);
    nv_file_read_all(path, &text, NULL);
    const char *s3 = text ? strstr(text, "step 3:\nOnce upon a time") : NULL, *s6 = text ? strstr(text, "step 6:\nOnce upon a time") : NULL;
    T_CHECK(s3 && s6 && s6 > s3, "samples.txt: %s", text ? text : "(none)");
    /* the last sample against generate: seed = run seed x the golden ratio constant + step + 1 */
    const uint64_t seed = 7ull * 0x9E3779B97F4A7C15ull + 6 + 1;
    const char *tok = t_data("models/tok512.bin");
    if (s6 && tok) {
        char want[1024];
        snprintf(want, sizeof want, "%s", s6 + strlen("step 6:\n"));
        char *end = strstr(want, "\n\n");
        if (end) *end = '\0';
        int *ids = NULL, np = 0;
        nv_tokenizer *t = NULL;
        if (nv_tokenizer_load(tok, 512, &t) == NV_OK) nv_tokenizer_encode(t, "Once upon a time", 1, 0, &ids, &np);
        snprintf(args, sizeof args, "generate -m %s/model.bin -z %s -p 'Once upon a time' -n %d -s %llu --engine scalar", dir[1], tok,
                 np + 12, (unsigned long long)seed);
        const int rc = t_nerve(args);
        T_CHECK(rc == 0 && !strcmp(t_out, want), "generate gave '%s', the run's sample '%s'", t_out, want);
        free(ids);
        nv_tokenizer_free(t);
    }
    free(text);
    snprintf(args, sizeof args, "train --sample-tokens 5 --out %s/x", t_tmpdir());
    T_CHECK(run_nerve(args, err, sizeof err) == 2 && strstr(err, "go with --sample-every"), "%s", err);
}

/* --lr-schedule reaches the optimizer: wsd over 6 steps with half of them decaying logs the full
 * rate three times, then the line to the floor; --decay-frac without wsd, or an unknown schedule,
 * is a usage error. */
static void test_lr_schedule_flag(void) {
    char args[4096], err[4096], dir[600], lr[16][32];
    snprintf(dir, sizeof dir, "%s/wsd", t_tmpdir());
    char extra[200];
    snprintf(extra, sizeof extra, "--lr-schedule wsd --decay-frac 0.5 --lr 1e-3 --warmup 0 --steps 6");
    train_args(args, sizeof args, dir, extra);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "wsd run: %s", err);
    const int n = read_field(dir, "\"lr\":", lr, 16);
    const double want[6] = {1e-3, 1e-3, 1e-3, 1e-3, 7e-4, 4e-4};
    int ok = n == 6;
    for (int i = 0; i < n && i < 6; i++) ok &= fabs(atof(lr[i]) - want[i]) < 1e-9;
    T_CHECK(ok, "%d rates: %s %s %s %s %s %s", n, lr[0], lr[1], lr[2], lr[3], lr[4], lr[5]);
    snprintf(args, sizeof args, "train --decay-frac 0.3 --out %s/x", t_tmpdir());
    T_CHECK(run_nerve(args, err, sizeof err) == 2 && strstr(err, "--decay-frac goes with --lr-schedule wsd"), "%s", err);
    snprintf(args, sizeof args, "train --lr-schedule step --out %s/x", t_tmpdir());
    T_CHECK(run_nerve(args, err, sizeof err) == 2 && strstr(err, "unknown learning-rate schedule 'step'"), "%s", err);
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

/* mpirun (OpenMPI) and a nerve built with it, or the case is skipped. The launcher runs as root where
 * tests do (containers), without the single-copy shared memory containers often forbid, on however
 * few cores; the processes it starts skip AddressSanitizer's leak check (OpenMPI keeps allocations
 * it never frees), which the test's other runs keep. */
static int mpi_ready(char *launcher, size_t cap) {
    if (!nv_dist_built_in()) {
        t_skip("nerve was built without OpenMPI (libopenmpi-dev)");
        return 0;
    }
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        t_skip("no mpirun (openmpi-bin)");
        return 0;
    }
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 1);
    const char *asan = getenv("ASAN_OPTIONS");
    snprintf(launcher, cap, "mpirun --oversubscribe -x ASAN_OPTIONS=%s%sdetect_leaks=0", asan ? asan : "",
             asan && *asan ? ":" : "");
    return 1;
}

static int read_values(const char *dir, const char *key, double *v, int max) {
    char l[64][32];
    int n = read_field(dir, key, l, max < 64 ? max : 64);
    for (int i = 0; i < n; i++) v[i] = strtod(l[i], NULL);
    return n;
}

/* The steps' key (loss, grad_norm) of two runs of `steps` steps agree within rel from step `from` on. */
static void check_close_runs(const char *dir_a, const char *dir_b, const char *key, int steps, int from, double rel) {
    double a[64], b[64];
    const int na = read_values(dir_a, key, a, 64), nb = read_values(dir_b, key, b, 64);
    T_CHECK(na == steps && nb == steps, "%s logged: %d in %s, %d in %s", key, na, dir_a, nb, dir_b);
    for (int i = from; i < na && i < nb; i++)
        T_CHECK(fabs(a[i] - b[i]) <= rel * fabs(a[i]), "step %d: %s %.9g in %s, %.9g in %s", i + 1, key, a[i], dir_a, b[i],
                dir_b);
}

/* train_args with flags and extra in one process and under launcher (two processes): the same
   losses and gradient norms but for the order of the sums. */
static void dp_case(const char *launcher, const char *flags, const char *extra, const char *tag) {
    char all[400], one[600], two[600], args[4096], err[4096];
    snprintf(all, sizeof all, "%s %s", flags, extra);
    snprintf(one, sizeof one, "%s/dp_%s_one", t_tmpdir(), tag);
    snprintf(two, sizeof two, "%s/dp_%s_two", t_tmpdir(), tag);
    train_args(args, sizeof args, one, all);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "%s, one process: %s", tag, err);
    train_args(args, sizeof args, two, all);
    T_CHECK(run_launched(launcher, args, err, sizeof err) == 0, "%s, two processes: %s", tag, err);
    check_close_runs(one, two, "\"loss\":", 24, 0, 1e-4);
    check_close_runs(one, two, "\"grad_norm\":", 24, 0, 1e-3);
    check_close_runs(one, two, "\"token_acc\":", 24, 0, 0.02);
    /* --full-eval's figures, each process scoring its share of every validation batch */
    double fa[8], fb[8], aa[8], ab[8];
    const int nfa = read_values(one, "\"full_val_loss\":", fa, 8), nfb = read_values(two, "\"full_val_loss\":", fb, 8);
    const int naa = read_values(one, "\"full_val_token_acc\":", aa, 8), nab = read_values(two, "\"full_val_token_acc\":", ab, 8);
    T_CHECK(!strstr(extra, "--full-eval") || (nfa >= 1 && nfa == nfb && naa == nfa && nab == nfa && fabs(fa[nfa - 1] - fb[nfa - 1]) <= 1e-4 * fa[nfa - 1] &&
                                               fabs(aa[nfa - 1] - ab[nfa - 1]) <= 0.005),
            "%s: full evaluations %d and %d: %g, %g", tag, nfa, nfb, nfa ? fa[nfa - 1] : 0.0, nfb ? fb[nfb - 1] : 0.0);
}

/* Data parallel: 2 processes taking half of each batch train what one process trains (the same
 * losses and gradient norms but for the order of the sums: a gradient scaled wrong shows in the
 * norms); a stop requested on one process stops both after the same step, and the job resumes bit
 * for bit; its checkpoint resumes in one process too; a batch that does not split, processes given
 * different settings, and one process failing alone end the job with a clear error; a mixture of
 * experts too (its balance term off: that is each process's own). fp32 (avx2) so that only the
 * order of the sums differs. */
static void test_data_parallel_matches_one_process(void) {
    if (!t_data("corpus/tinystories_valid_head.txt") || !t_data("models/tok512.bin")) return;
    char mpirun[1200], np2[1300], guarded[1400];
    if (!mpi_ready(mpirun, sizeof mpirun)) return;
    snprintf(np2, sizeof np2, "%s -np 2", mpirun);
    snprintf(guarded, sizeof guarded, "timeout -k 5 120 %s", np2); /* a hang fails the case, not the suite */
    char args[4096], err[4096], cmd[12288], one[600], two[600], split[600], moved[600], path[800];
    snprintf(one, sizeof one, "%s/dp_one", t_tmpdir());
    snprintf(two, sizeof two, "%s/dp_two", t_tmpdir());
    snprintf(split, sizeof split, "%s/dp_split", t_tmpdir());
    snprintf(moved, sizeof moved, "%s/dp_moved", t_tmpdir());
    const char *flags = "--threads 1 --engine avx2", *resume = "--threads 1 --engine avx2 --resume";
    train_args(args, sizeof args, one, flags);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "one process: %s", err);
    train_args(args, sizeof args, two, flags);
    T_CHECK(run_launched(guarded, args, err, sizeof err) == 0, "two processes: %s", err);
    T_CHECK(strstr(err, "x 2 processes") != NULL, "the report does not say 2 processes: %s", err);
    check_close_runs(one, two, "\"loss\":", 24, 0, 1e-4);
    check_close_runs(one, two, "\"grad_norm\":", 24, 0, 1e-3);
    check_close_runs(one, two, "\"tokens\":", 24, 0, 0);
    const float va = val_at(one, 24), vb = val_at(two, 24);
    T_CHECK(isfinite(va) && fabsf(va - vb) <= 1e-4f * va, "validation loss %g in one process, %g in two", va, vb);
    char *text = NULL;
    snprintf(path, sizeof path, "%.600s/metrics.jsonl", two);
    nv_file_read_all(path, &text, NULL);
    T_CHECK(text && strstr(text, "\"processes\":2"), "metrics do not say 2 processes");
    free(text);
    /* a mixture of experts: the same, the balance term off (it is each process's windows' own) */
    dp_case(guarded, flags, "--experts 4 --router-aux-coef 0", "moe");
    /* dropout: each process drops what one process drops on those rows */
    dp_case(guarded, flags, "--dropout 0.2 --full-eval", "drop");

    /* SIGUSR1 (which mpirun would pass on to both at once) to one process only: both stop after the
       same step, process 0 saves; resumed, the uninterrupted job's losses bit for bit */
    train_args(args, sizeof args, split, flags);
    int done_before = 0;
    const int st = run_interrupted(np2, args, split, SIGUSR1, 1, &done_before);
    T_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the stopped job did not exit cleanly (status %d)", st);
    T_CHECK(done_before >= 9 && done_before < 24, "the stop landed at step %d", done_before);
    snprintf(cmd, sizeof cmd, "cp -r %s %s", split, moved);
    T_CHECK(system(cmd) == 0, "%s", cmd);
    train_args(args, sizeof args, split, resume);
    T_CHECK(run_launched(guarded, args, err, sizeof err) == 0, "resume in two processes: %s", err);
    char la[64][32], lb[64][32];
    int na = read_losses(two, la, 64), nb = read_losses(split, lb, 64);
    T_CHECK(na == 24 && nb == 24, "steps logged: %d uninterrupted, %d stopped and resumed", na, nb);
    for (int i = 0; i < na && i < nb; i++) T_CHECK(strcmp(la[i], lb[i]) == 0, "step %d: loss %s vs %s", i + 1, la[i], lb[i]);
    /* the same checkpoint goes on in one process: the batch is the run's, not the process's */
    train_args(args, sizeof args, moved, resume);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "resume in one process: %s", err);
    check_close_runs(two, moved, "\"loss\":", 24, done_before, 1e-4);

    /* refused together, one line from process 0: a batch that does not split over the processes */
    char bad[600];
    snprintf(bad, sizeof bad, "%s/dp_bad", t_tmpdir());
    train_args(args, sizeof args, bad, "--batch 3");
    const int rc = run_launched(guarded, args, err, sizeof err);
    const char *said = strstr(err, "nerve train: --batch 3 does not split evenly over 2 processes");
    T_CHECK(rc != 0 && said && !strstr(said + 30, "does not split"), "--batch 3 over 2 processes: exit %d '%s'", rc, err);
    /* two programs in one job (mpirun's colon syntax): another seed; a data file the second lacks */
    char other[4096];
    train_args(args, sizeof args, bad, "");
    train_args(other, sizeof other, bad, "--seed 8");
    snprintf(cmd, sizeof cmd, "%s : -np 1 %s %s", args, t_nerve_bin(), other);
    snprintf(np2, sizeof np2, "timeout -k 5 120 %s -np 1", mpirun);
    T_CHECK(run_launched(np2, cmd, err, sizeof err) != 0 && strstr(err, "were not given the same model, data and settings"),
            "processes with different seeds: '%s'", err);
    snprintf(other, sizeof other, "train --data %s/missing.txt -z %s --out %s", t_tmpdir(), t_data("models/tok512.bin"), bad);
    snprintf(cmd, sizeof cmd, "%s : -np 1 %s %s", args, t_nerve_bin(), other);
    T_CHECK(run_launched(np2, cmd, err, sizeof err) != 0 && strstr(err, "missing.txt"),
            "a process failing alone: '%s'", err);
    snprintf(path, sizeof path, "%.600s/ckpt.bin", bad);
    T_CHECK(!nv_file_exists(path), "a refused job wrote a checkpoint");
}

/* Prompt/completion fine-tuning (TRL's format, strings): stories260K learns the completion after the
 * prompt, the run declares no chat template, and `nerve generate` of a new prompt gives it. */
static void test_prompt_completion_finetune(void) {
    const char *model = t_data("models/stories260K.bin"), *tok = t_data("models/tok512.bin");
    if (!model || !tok) return;
    static const char *who[] = {"the cat", "a dog", "Tim", "the bird", "Sue", "the big bear"};
    static const char *what[] = {"go to the park", "like the red ball", "want to play", "see the sun", "find a toy"};
    nv_buf lines = {0};
    for (int i = 0; i < 240; i++)
        nv_buf_printf(&lines, "{\"prompt\": \"Q: Did %s %s?\\nA:\", \"completion\": \" Yes, the cat is happy.\"}\n", who[i % 6],
                      what[(i / 6) % 5]);
    const char *data = t_write("pc.jsonl", lines.data, lines.len);
    nv_buf_free(&lines);
    char args[4096], err[8192], dir[600], path[700];
    const int learn = !t_sanitized(); /* the sanitizer's pass: a few steps, not enough to learn the answer */
    snprintf(dir, sizeof dir, "%s/pc_run", t_tmpdir());
    snprintf(args, sizeof args,
             "train --init-from %s -z %s --data %s --steps %d --batch 8 --seq 64 --lr 1e-3 --warmup %d --eval-every 0 --seed 3 "
             "--quiet --out %s",
             model, tok, data, learn ? 120 : 3, learn ? 10 : 1, dir);
    T_CHECK(run_nerve(args, err, sizeof err) == 0 && strstr(err, "prompt and completion joined as they are (no chat template)"),
            "prompt/completion fine-tune: %s", err);
    snprintf(path, sizeof path, "%s/chat_template", dir);
    T_CHECK(!nv_file_exists(path), "a prompt/completion run declared a chat template");
    snprintf(args, sizeof args, "generate -m %s -p \"$(printf 'Q: Did the dog see a kite?\\nA:')\" -t 0 -n 60 --engine avx2", dir);
    T_CHECK(t_nerve(args) == 0 && (!learn || strstr(t_out, "Q: Did the dog see a kite?\nA: Yes, the cat is happy.")), "generate: %s %s",
            t_out, t_err);
}

/* Chat fine-tuning end to end: stories260K fine-tuned on conversations in OpenAI's format (one answer
 * to every question) learns the answer; the run folder keeps its chat template, and `nerve serve -m
 * RUN_DIR` takes it up and gives the answer, ending at the template's stop. */
static void test_chat_finetune_then_serve(void) {
    const char *model = t_data("models/stories260K.bin"), *tok = t_data("models/tok512.bin");
    if (!model || !tok) return;
    static const char *who[] = {"the cat", "a dog", "Tim", "the bird", "Sue", "the big bear"};
    static const char *what[] = {"go to the park", "like the red ball", "want to play", "see the sun", "find a toy"};
    char path[800], line[512], args[4096], err[8192], dir[600];
    snprintf(path, sizeof path, "%s/chats.jsonl", t_tmpdir());
    FILE *f = fopen(path, "w");
    T_CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    for (int i = 0; i < 240; i++) {
        snprintf(line, sizeof line,
                 "{\"messages\": [%s{\"role\": \"user\", \"content\": \"Did %s %s?\"}, {\"role\": \"assistant\", "
                 "\"content\": \"Yes, the cat is happy.\"}]}\n",
                 i % 3 ? "" : "{\"role\": \"system\", \"content\": \"Be kind.\"}, ", who[i % 6], what[(i / 6) % 5]);
        fputs(line, f);
    }
    fclose(f);
    snprintf(dir, sizeof dir, "%s/chat_run", t_tmpdir());
    /* the sanitizer's pass: a few steps, the same code, not enough to learn the answer */
    const int learn = !t_sanitized(), steps = learn ? 120 : 4;
    snprintf(args, sizeof args,
             "train --init-from %s -z %s --data %s --steps %d --batch 8 --seq 96 --lr 1e-3 --warmup %d --eval-every %d "
             "--eval-batches 2 --seed 3 --quiet --out %s",
             model, tok, path, steps, learn ? 10 : 1, steps / 3, dir);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "chat fine-tune: %s", err);
    T_CHECK(strstr(err, "chat data: 240 answers to train on (12 of them held out), rendered with the chatml template"),
            "no chat data summary: %s", err);
    /* windows too short to reach any answer: nothing to train, refused */
    char short_args[4400], short_dir[700];
    snprintf(short_dir, sizeof short_dir, "%s/chat_short", t_tmpdir());
    snprintf(short_args, sizeof short_args, "train --init-from %s -z %s --data %s --steps 2 --seq 8 --out %s", model, tok,
             path, short_dir);
    T_CHECK(run_nerve(short_args, err, sizeof err) == 1 && strstr(err, "no training conversation has an answer within --seq 8"),
            "prompts longer than the window: '%s'", err);
    const float v0 = val_at(dir, 0), v1 = val_at(dir, steps);
    T_CHECK(v0 > 3 && v1 > 0 && (!learn || v1 < 0.3f), "validation loss on the answers %g -> %g", v0, v1);
    char *text = NULL;
    snprintf(path, sizeof path, "%.600s/chat_template", dir);
    T_CHECK(nv_file_read_all(path, &text, NULL) == NV_OK && text && !strcmp(text, "chatml\n"), "chat_template: %s",
            text ? text : "(none)");
    free(text);
    server s;
    if (!server_spawn(&s, "chat_run", NULL, NULL, dir, NULL, "--engine avx2", 30)) {
        T_CHECK(0, "serving the run folder failed");
        return;
    }
    char *log = read_log(&s);
    T_CHECK(strstr(log, "chat template chatml") != NULL, "the server did not take the run's template: %s", log);
    free(log);
    resp r;
    const char *body = "{\"messages\": [{\"role\": \"user\", \"content\": \"Did the dog see a kite?\"}], \"temperature\": 0}";
    T_CHECK(http(s.port, "POST", "/v1/chat/completions", NULL, body, &r) && r.status == 200 &&
                (!learn || (strstr(r.body, "\"content\":\"Yes, the cat is happy.\"") && strstr(r.body, "\"finish_reason\":\"stop\""))),
            "answer: %d %s", r.status, r.body ? r.body : "");
    resp_free(&r);
    T_CHECK(server_stop_within(&s, 20) == 0, "server did not stop cleanly");

    /* perplexity of the held-out answers (as training validates): the trained model's near its last
       validation loss, the starting model's far above */
    double nll[2] = {-1, -1};
    const char *text_path_for_mix = t_data("corpus/tinystories_valid_head.txt");
    if (!text_path_for_mix) text_path_for_mix = "x.txt";
    for (int k = 0; k < 2; k++) {
        snprintf(short_args, sizeof short_args, "perplexity -m %s %s%s -f %s/chats.jsonl --val-frac 0.05 --chat-template chatml --json",
                 k ? model : dir, k ? "-z " : "", k ? tok : "", t_tmpdir());
        if (t_nerve(short_args) == 0) {
            cJSON *o = cJSON_Parse(t_out);
            const cJSON *v = cJSON_GetObjectItem(o, "nll");
            if (cJSON_IsNumber(v) && cJSON_GetObjectItem(o, "answers") && cJSON_GetObjectItem(o, "answers")->valueint == 12) nll[k] = v->valuedouble;
            cJSON_Delete(o);
        }
    }
    T_CHECK(nll[0] >= 0 && fabs(nll[0] - v1) < 0.05 + 0.5 * v1 && nll[1] > 3, "answer perplexity: trained %g (validation %g), base %g: %s",
            nll[0], (double)v1, nll[1], t_err);
    snprintf(short_args, sizeof short_args, "perplexity -m %s -f %s/chats.jsonl --ctx 64", dir, t_tmpdir());
    T_CHECK(t_nerve(short_args) == 2 && strstr(t_err, "a turn at a time"), "--ctx with chat data: %s", t_err);
    snprintf(short_args, sizeof short_args, "perplexity -m %s -f %s/chats.jsonl -f %s", dir, t_tmpdir(), text_path_for_mix);
    T_CHECK(t_nerve(short_args) == 2 && strstr(t_err, "one kind or the other"), "chat and text: %s", t_err);

    /* nerve chat with the run folder: its template, the answer cut at the template's end of turn (text
       here: <|im_end|> is no token of this vocabulary), never printed */
    const char *qs = t_write("chat_questions.txt", "Did the dog see a kite?\nDid Sue find a toy?\n", 44);
    snprintf(short_args, sizeof short_args, "chat -m %s -t 0 --engine avx2", dir);
    T_CHECK(t_nerve_stdin(short_args, qs) == 0 && (!learn || !strcmp(t_out, "Yes, the cat is happy.\nYes, the cat is happy.\n")),
            "nerve chat: '%s' %s", t_out, t_err);

    /* exported, the run's template travels in Jinja: GGUF's tokenizer.chat_template, which a server of
       that file takes up (the same answer), and a Hugging Face folder's tokenizer_config.json; a
       llama2.c file has no place for it and says so */
    char gguf_out[700], hf_out[700];
    snprintf(gguf_out, sizeof gguf_out, "%s/chat_run.gguf", t_tmpdir());
    snprintf(hf_out, sizeof hf_out, "%s/chat_run_hf/", t_tmpdir());
    snprintf(short_args, sizeof short_args, "export %s -o %s", dir, gguf_out);
    T_CHECK(run_nerve(short_args, err, sizeof err) == 0, "export to GGUF: %s", err);
    nv_gguf g;
    size_t tl = 0;
    const char *jinja = nv_chat_template_jinja(NV_CHAT_CHATML);
    if (nv_gguf_open(gguf_out, &g) == NV_OK) {
        const char *t = nv_gguf_string(&g, "tokenizer.chat_template", &tl);
        T_CHECK(t && tl == strlen(jinja) && !memcmp(t, jinja, tl), "the GGUF file's chat template: %.*s", t ? (int)tl : 6,
                t ? t : "(none)");
        nv_gguf_close(&g);
    } else {
        T_CHECK(0, "%s: %s", gguf_out, nv_errmsg());
    }
    if (server_spawn(&s, "chat_gguf", NULL, NULL, gguf_out, NULL, "--engine avx2", 30)) {
        log = read_log(&s);
        T_CHECK(strstr(log, "chat template chatml") != NULL, "the server did not take the file's template: %s", log);
        free(log);
        T_CHECK(http(s.port, "POST", "/v1/chat/completions", NULL, body, &r) && r.status == 200 &&
                    (!learn || strstr(r.body, "\"content\":\"Yes, the cat is happy.\"")),
                "answer from the GGUF export: %d %s", r.status, r.body ? r.body : "");
        resp_free(&r);
        T_CHECK(server_stop_within(&s, 20) == 0, "server did not stop cleanly");
    } else {
        T_CHECK(0, "serving the GGUF export failed");
    }
    snprintf(short_args, sizeof short_args, "export %s -o %s", dir, hf_out);
    T_CHECK(run_nerve(short_args, err, sizeof err) == 0, "export to a folder: %s", err);
    snprintf(path, sizeof path, "%.600stokenizer_config.json", hf_out);
    text = NULL;
    cJSON *tc = nv_file_read_all(path, &text, NULL) == NV_OK ? cJSON_Parse(text) : NULL;
    const cJSON *ct = cJSON_GetObjectItem(tc, "chat_template");
    T_CHECK(cJSON_IsString(ct) && !strcmp(ct->valuestring, jinja), "tokenizer_config.json's chat template: %s", text ? text : "");
    cJSON_Delete(tc);
    free(text);
    snprintf(short_args, sizeof short_args, "export %s -o %s/chat_run.bin", dir, t_tmpdir());
    T_CHECK(run_nerve(short_args, err, sizeof err) == 0 && strstr(err, "--chat-template chatml"), "export to llama2.c: %s", err);
    /* chosen, or left out, by flag; a template file must be UTF-8 text */
    snprintf(short_args, sizeof short_args, "export %s -o %s --chat-template none", dir, gguf_out);
    T_CHECK(run_nerve(short_args, err, sizeof err) == 0 && nv_gguf_open(gguf_out, &g) == NV_OK, "--chat-template none: %s", err);
    T_CHECK(!nv_gguf_string(&g, "tokenizer.chat_template", &tl), "--chat-template none wrote one");
    nv_gguf_close(&g);
    snprintf(short_args, sizeof short_args, "export %s -o %s --chat-template jinja", dir, gguf_out);
    T_CHECK(run_nerve(short_args, err, sizeof err) == 2 && strstr(err, "unknown chat template 'jinja'"), "a bad name: %s", err);
    const char *bad_tmpl = t_write("bad.jinja", "{{ '\xff' }}", 9);
    snprintf(short_args, sizeof short_args, "export %s -o %s --chat-template-file %s", dir, gguf_out, bad_tmpl);
    T_CHECK(run_nerve(short_args, err, sizeof err) == 1 && strstr(err, "UTF-8"), "a template file not UTF-8: %s", err);
    const char *own = t_write("own.jinja", "{{ messages[0].content }}", 25);
    snprintf(short_args, sizeof short_args, "export %s -o %s --chat-template-file %s", dir, gguf_out, own);
    T_CHECK(run_nerve(short_args, err, sizeof err) == 0 && nv_gguf_open(gguf_out, &g) == NV_OK, "--chat-template-file: %s", err);
    const char *ot = nv_gguf_string(&g, "tokenizer.chat_template", &tl);
    T_CHECK(ot && tl == 25 && !memcmp(ot, "{{ messages[0].content }}", 25), "the file's template");
    nv_gguf_close(&g);

    /* fine-tuning a chat run's model again: the template it declares is the default (here one written
       beside a copy of it) */
    char cmd[2048], *text_data = (char *)t_data("corpus/tinystories_valid_head.txt");
    snprintf(cmd, sizeof cmd, "mkdir -p %.600s/declared && cp %.600s/model.bin %.600s/declared/ && echo llama2 > %.600s/declared/chat_template",
             t_tmpdir(), dir, t_tmpdir(), t_tmpdir());
    T_CHECK(system(cmd) == 0, "%s", cmd);
    snprintf(short_dir, sizeof short_dir, "%s/declared_run", t_tmpdir());
    snprintf(short_args, sizeof short_args, "train --init-from %s/declared/model.bin -z %s --data %s/chats.jsonl --steps 1 "
             "--seq 96 --eval-every 0 --quiet --out %s", t_tmpdir(), tok, t_tmpdir(), short_dir);
    T_CHECK(run_nerve(short_args, err, sizeof err) == 0 && strstr(err, "rendered with the llama2 template (the starting model's)"),
            "the starting model's template: '%s'", err);

    /* packed windows train (a step's answers from several turns) */
    snprintf(short_dir, sizeof short_dir, "%s/packed_run", t_tmpdir());
    snprintf(short_args, sizeof short_args, "train --init-from %s -z %s --data %s/chats.jsonl --steps 2 --seq 256 --pack "
             "--eval-every 0 --quiet --out %s", model, tok, t_tmpdir(), short_dir);
    T_CHECK(run_nerve(short_args, err, sizeof err) == 0 && strstr(err, "windows packed"), "--pack: '%s'", err);
    /* the folder remembers the packing: a resume without --pack is refused (its data would go on otherwise),
       one with it goes on; and a run that did not pack refuses a resume with it */
    snprintf(short_args, sizeof short_args, "train --init-from %s -z %s --data %s/chats.jsonl --steps 3 --seq 256 --resume "
             "--eval-every 0 --quiet --out %s", model, tok, t_tmpdir(), short_dir);
    T_CHECK(run_nerve(short_args, err, sizeof err) == 1 && strstr(err, "was trained with --pack: resume with it"),
            "resumed without --pack: '%s'", err);
    snprintf(short_args + strlen(short_args), sizeof short_args - strlen(short_args), " --pack");
    T_CHECK(run_nerve(short_args, err, sizeof err) == 0, "resumed with --pack: '%s'", err);
    snprintf(short_args, sizeof short_args, "%s --resume --steps 130 --pack", args);
    T_CHECK(run_nerve(short_args, err, sizeof err) == 1 && strstr(err, "was trained without --pack"), "a --pack resume of an unpacked run: '%s'",
            err);

    /* resumed with another template: refused (the folder says which it learned) */
    snprintf(short_args, sizeof short_args, "%s --resume --steps 130 --chat-template llama3", args);
    T_CHECK(run_nerve(short_args, err, sizeof err) == 1 && strstr(err, "was trained with the chatml chat template"),
            "resume with another template: '%s'", err);
    /* the folder reused for text (its checkpoint removed): no chat_template is left to mislead the server */
    snprintf(cmd, sizeof cmd, "rm %.600s/ckpt.bin", dir);
    T_CHECK(text_data && system(cmd) == 0, "%s", cmd);
    snprintf(short_args, sizeof short_args, "train --init-from %s -z %s --data %s --steps 2 --seq 32 --quiet --out %s", model,
             tok, text_data ? text_data : "x", dir);
    T_CHECK(run_nerve(short_args, err, sizeof err) == 0, "text run in the chat folder: %s", err);
    snprintf(path, sizeof path, "%.600s/chat_template", dir);
    T_CHECK(!nv_file_exists(path), "a text run left the chat run's chat_template");

    /* steps whose windows hold no answer (long prompts cut by --seq) are skipped, not updates of momentum
       alone: a warning, "skipped" with a null loss, and no divergence */
    snprintf(path, sizeof path, "%s/chats_long.jsonl", t_tmpdir());
    if ((f = fopen(path, "w")) != NULL) {
        for (int i = 0; i < 40; i++)
            fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}, {\"role\": \"assistant\", \"content\": "
                       "\"Yes.\"}]}\n",
                    i % 2 ? "Hi?" : "Once upon a time there was a very long question that goes on and on and on?");
        fclose(f);
    }
    snprintf(short_dir, sizeof short_dir, "%s/chat_gaps", t_tmpdir());
    snprintf(short_args, sizeof short_args,
             "train --init-from %s -z %s --data %s --steps 16 --batch 1 --seq 48 --eval-every 0 --quiet --out %s", model,
             tok, path, short_dir);
    T_CHECK(run_nerve(short_args, err, sizeof err) == 0 && strstr(err, "no answer token in this step's windows"),
            "steps without answers: '%s'", err);
    snprintf(path, sizeof path, "%.600s/metrics.jsonl", short_dir);
    text = NULL;
    nv_file_read_all(path, &text, NULL);
    int skipped = 0, trained = 0;
    for (const char *p = text; p && (p = strstr(p, "\"step\":")); p++) {
        const char *end = strchr(p, '\n');
        const int null_loss = strstr(p, "\"loss\":null") && strstr(p, "\"loss\":null") < end;
        const int marked = strstr(p, "\"skipped\":true") && strstr(p, "\"skipped\":true") < end;
        T_CHECK(null_loss == marked, "a step's loss and skip disagree: %.*s", (int)(end ? end - p : 80), p);
        skipped += marked, trained += !marked;
    }
    T_CHECK(skipped > 0 && trained > 0, "%d steps skipped, %d trained: the case did not mix them", skipped, trained);
    free(text);
    /* --seq auto: the longest turn whole (a multiple of 16), so none is skipped or cut */
    snprintf(path, sizeof path, "%s/chats_long.jsonl", t_tmpdir());
    snprintf(short_dir, sizeof short_dir, "%s/chat_auto", t_tmpdir());
    snprintf(short_args, sizeof short_args, "train --init-from %s -z %s --data %s --steps 4 --batch 2 --seq auto --eval-every 0 --out %s",
             model, tok, path, short_dir);
    const int auto_rc = run_nerve(short_args, err, sizeof err);
    const char *said = strstr(err, "--seq auto: ");
    int auto_seq = 0, longest_turn = 0;
    if (said) sscanf(said, "--seq auto: %d (the longest turn is %d tokens)", &auto_seq, &longest_turn);
    T_CHECK(auto_rc == 0 && longest_turn > 17 && auto_seq == (longest_turn - 1 + 15) / 16 * 16 && !strstr(err, "skipped") &&
                !strstr(err, "are cut"),
            "--seq auto: %d for a longest turn of %d: '%s'", auto_seq, longest_turn, err);

    /* the loss is the mean over the step's answer tokens however the step is cut: 2 micro-batches of
       4 windows (the same 8 windows; answers of 1 to 9 words, so the halves hold different numbers
       of targets) give one batch of 8's losses and gradient norms */
    char whole[600], halves[600];
    snprintf(path, sizeof path, "%s/chats_mixed.jsonl", t_tmpdir());
    if (!(f = fopen(path, "w"))) {
        T_CHECK(0, "cannot write %s", path);
        return;
    }
    for (int i = 0; i < 240; i++) {
        char answer[128] = "";
        for (int w = 0; w <= i % 9; w++) strcat(answer, w ? " yes" : "Yes");
        fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"Did %s %s?\"}, {\"role\": \"assistant\", "
                   "\"content\": \"%s.\"}]}\n", who[i % 6], what[(i / 6) % 5], answer);
    }
    fclose(f);
    const int pair_steps = learn ? 24 : 6;
    snprintf(whole, sizeof whole, "%s/chat_whole", t_tmpdir());
    snprintf(halves, sizeof halves, "%s/chat_halves", t_tmpdir());
    for (int k = 0; k < 2; k++) {
        snprintf(args, sizeof args,
                 "train --init-from %s -z %s --data %s --steps %d --batch %d --accum %d --seq 96 --lr 1e-3 --eval-every 0 "
                 "--seed 4 --engine avx2 --quiet --out %s",
                 model, tok, path, pair_steps, k ? 4 : 8, k ? 2 : 1, k ? halves : whole);
        T_CHECK(run_nerve(args, err, sizeof err) == 0, "chat run %d: %s", k, err);
    }
    check_close_runs(whole, halves, "\"loss\":", pair_steps, 0, 1e-5);
    check_close_runs(whole, halves, "\"grad_norm\":", pair_steps, 0, 1e-4);
}

/* The greedy answers a run folder's server gives to the six questions of test_preference_finetune,
 * and how many of them are `want`. */
static int answers_are(const char *dir, const char *name, const char *want) {
    static const char *const qs[] = {"Did Tim see the sun?", "Did the cat want to play?", "Did a dog find a toy?",
                                     "Did Sue go to the park?", "Did the bird like the red ball?", "Did the big bear see the sun?"};
    server s;
    if (!server_spawn(&s, name, NULL, NULL, dir, NULL, "--engine avx2", 30)) {
        T_CHECK(0, "serving %s failed", dir);
        return -1;
    }
    int n = 0;
    char body[512], want_json[128];
    snprintf(want_json, sizeof want_json, "\"content\":\"%s\"", want);
    for (int i = 0; i < 6; i++) {
        snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}], \"temperature\": 0, "
                 "\"max_tokens\": 16}", qs[i]);
        resp r;
        if (http(s.port, "POST", "/v1/chat/completions", NULL, body, &r) && r.status == 200 && strstr(r.body, want_json)) n++;
        resp_free(&r);
    }
    T_CHECK(server_stop_within(&s, 20) == 0, "server did not stop cleanly");
    return n;
}

/* Preference training end to end: stories260K fine-tuned on answers that are half "Yes" and half
 * "No" answers some questions each way; trained by DPO on pairs preferring "Yes", it answers every
 * question "Yes" (with the SFT term; pure DPO's first step is log 2 exactly, the model being its own
 * reference); the validation pairs go from none preferred rightly to all; IPO, SimPO and ORPO learn
 * the preference too; a stopped run resumes bit for bit; LoRA adapters train on pairs; two
 * processes train what one does; the settings preference training cannot take are refused. */
static const char *const pref_who[] = {"the cat", "a dog", "Tim", "the bird", "Sue", "the big bear"};
static const char *const pref_what[] = {"go to the park", "like the red ball", "want to play", "see the sun", "find a toy"};

/* n preference pairs into path: "Did WHO WHAT?" answered "Yes, they were happy." rather than "No. Go
   away."; 0 when it cannot be written. */
static int write_preferences(const char *path, int n) {
    FILE *g = fopen(path, "w");
    T_CHECK(g, "cannot write %s", path);
    if (!g) return 0;
    for (int i = 0; i < n; i++)
        fprintf(g, "{\"input\": {\"messages\": [{\"role\": \"user\", \"content\": \"Did %s %s?\"}]}, \"preferred_output\": "
                "[{\"role\": \"assistant\", \"content\": \"Yes, they were happy.\"}], \"non_preferred_output\": [{\"role\": "
                "\"assistant\", \"content\": \"No. Go away.\"}]}\n", pref_who[i % 6], pref_what[(i / 6) % 5]);
    return fclose(g) == 0;
}

static void test_preference_finetune(void) {
    const char *model = t_data("models/stories260K.bin"), *tok = t_data("models/tok512.bin");
    if (!model || !tok) return;
    char sft_data[800], pref_data[800], sft[700], dpo[700], args[4096], err[8192];
    snprintf(sft_data, sizeof sft_data, "%s/yes_no.jsonl", t_tmpdir());
    snprintf(pref_data, sizeof pref_data, "%s/prefer_yes.jsonl", t_tmpdir());
    FILE *f = fopen(sft_data, "w");
    T_CHECK(f, "cannot write the data");
    if (!f) return;
    for (int i = 0; i < 240; i++)
        fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"Did %s %s?\"}, {\"role\": \"assistant\", \"content\": "
                "\"%s\"}]}\n", pref_who[i % 6], pref_what[(i / 6) % 5], i % 2 ? "Yes, they were happy." : "No. Go away.");
    fclose(f);
    /* the sanitizer's pass: fewer pairs (each run's reference pass goes over all of them) and a few
       steps of each run, the same code, not enough to learn the preference */
    const int learn = !t_sanitized(), pref_steps = learn ? 30 : 3, n_pairs = learn ? 120 : 40, mpi_steps = learn ? 10 : 4;
    if (!write_preferences(pref_data, n_pairs)) return;
    snprintf(sft, sizeof sft, "%s/sft_run", t_tmpdir());
    snprintf(args, sizeof args, "train --init-from %s -z %s --data %s --steps %d --batch 8 --seq 96 --lr 1e-3 --warmup %d "
             "--eval-every 0 --seed 3 --quiet --out %s", model, tok, sft_data, learn ? 120 : 4, learn ? 10 : 1, sft);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "SFT: %s", err);
    const int yes_before = answers_are(sft, "sft_serve", "Yes, they were happy.");
    T_CHECK(yes_before >= 0 && yes_before < 6, "the SFT model already answers %d of 6 questions Yes", yes_before);

    char base[3000];
    snprintf(base, sizeof base, "train --init-from %s/model.bin -z %s/tokenizer.bin --data %s --batch 8 --seq 96 --warmup 5 "
             "--eval-batches 2 --seed 4 --quiet", sft, sft, pref_data);
    /* pure DPO: the first step's loss is log 2 (the model is its reference), none preferred at step 0 */
    snprintf(dpo, sizeof dpo, "%s/dpo_pure", t_tmpdir());
    snprintf(args, sizeof args, "%s --steps 2 --lr 1e-5 --eval-every 1 --out %s", base, dpo);
    char said[2][120]; /* 5% held out */
    snprintf(said[0], sizeof said[0], "preference data: %d pairs to train on (%d of them held out)", n_pairs, n_pairs / 20);
    snprintf(said[1], sizeof said[1], "log-probabilities of %d pairs", n_pairs);
    T_CHECK(run_nerve(args, err, sizeof err) == 0 && strstr(err, said[0]) && strstr(err, said[1]), "pure DPO: %s", err);
    char l[64][32], acc[64][32];
    T_CHECK(read_losses(dpo, l, 64) == 2 && !strncmp(l[0], "0.69314718", 10), "the first step's loss is %s, not log 2", l[0]);
    T_CHECK(read_field(dpo, "\"val_reward_acc\":", acc, 64) == 3 && !strcmp(acc[0], "0"), "step 0's accuracy %s", acc[0]);
    T_CHECK(read_field(dpo, "\"reward_margin\":", acc, 64) == 2 && !strcmp(acc[0], "0"), "step 1's margin %s", acc[0]);

    /* with the SFT term, every answer becomes the preferred one */
    snprintf(dpo, sizeof dpo, "%s/dpo_run", t_tmpdir());
    snprintf(args, sizeof args, "%s --steps %d --lr 3e-4 --pref-sft-weight 1 --eval-every %d --out %s", base, pref_steps, pref_steps / 3,
             dpo);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "DPO: %s", err);
    const int na = read_field(dpo, "\"val_reward_acc\":", acc, 64);
    T_CHECK(na == 4 && !strcmp(acc[0], "0") && (!learn || !strcmp(acc[3], "1")), "validation accuracy %s -> %s", acc[0],
            na ? acc[na - 1] : "-");
    T_CHECK(!learn || val_at(dpo, pref_steps) < 0.1f, "validation loss %g", val_at(dpo, pref_steps));
    const int yes_after = answers_are(dpo, "dpo_serve", "Yes, they were happy.");
    T_CHECK(yes_after >= 0 && (!learn || yes_after == 6), "not every answer became the preferred one");

    /* the other losses: each learns the preference (the validation pairs preferred rightly, by its
       rewards and by the likelihood a token); SimPO and ORPO without a reference pass, and ORPO, whose
       loss holds the preferred answer's cross-entropy, answers every question Yes */
    static const char *const kinds[] = {"ipo", "simpo", "orpo"};
    char other[700];
    for (int k = 0; k < 3; k++) {
        snprintf(other, sizeof other, "%s/pref_%s", t_tmpdir(), kinds[k]);
        snprintf(args, sizeof args, "%s --steps %d --lr 3e-4 --pref-loss %s --eval-every %d --out %s", base, pref_steps, kinds[k],
                 pref_steps, other);
        T_CHECK(run_nerve(args, err, sizeof err) == 0 && (strstr(err, "the reference") != NULL) == (k == 0), "%s: %s",
                kinds[k], err);
        char choice[64][32];
        T_CHECK(read_field(other, "\"val_reward_acc\":", acc, 64) == 2 && (!learn || !strcmp(acc[1], "1")) &&
                    read_field(other, "\"val_choice_acc\":", choice, 64) == 2 && (!learn || !strcmp(choice[1], "1")),
                "%s: validation accuracy %s, choice %s", kinds[k], acc[1], choice[1]);
    }
    const int orpo_yes = answers_are(other, "orpo_serve", "Yes, they were happy.");
    T_CHECK(orpo_yes >= 0 && (!learn || orpo_yes == 6), "ORPO: not every answer became the preferred one");

    /* stopped after its first step and resumed: the same losses as the run above */
    char split[700];
    snprintf(split, sizeof split, "%s/dpo_split", t_tmpdir());
    snprintf(args, sizeof args, "%s --steps %d --lr 3e-4 --pref-sft-weight 1 --eval-every %d --time-limit 0.0001 --out %s",
             base, pref_steps, pref_steps / 3, split);
    T_CHECK(run_nerve(args, err, sizeof err) == 0 && count_steps(split) == 1, "the stopped run: %s", err);
    snprintf(args, sizeof args, "%s --steps %d --lr 3e-4 --pref-sft-weight 1 --eval-every %d --resume --out %s", base, pref_steps,
             pref_steps / 3, split);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "resume: %s", err);
    char lb[64][32];
    const int n1 = read_losses(dpo, l, 64), n2 = read_losses(split, lb, 64);
    T_CHECK(n1 == pref_steps && n2 == pref_steps, "steps logged: %d and %d", n1, n2);
    for (int i = 0; i < n1 && i < n2; i++) T_CHECK(!strcmp(l[i], lb[i]), "step %d: loss %s vs %s resumed", i + 1, l[i], lb[i]);

    /* LoRA: the frozen model is the reference; the adapters learn the preference */
    char lora[700];
    snprintf(lora, sizeof lora, "%s/dpo_lora", t_tmpdir());
    const int lora_steps = learn ? 20 : 2;
    snprintf(args, sizeof args, "%s --steps %d --lr 3e-3 --pref-sft-weight 1 --lora-rank 8 --eval-every %d --out %s", base, lora_steps,
             lora_steps, lora);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "LoRA DPO: %s", err);
    T_CHECK(read_field(lora, "\"val_reward_acc\":", acc, 64) == 2 && (!learn || !strcmp(acc[1], "1")), "LoRA: validation accuracy %s",
            acc[1]);

    /* two processes, a pair each of every micro-batch's four: the losses and validation of one process */
    char mpirun[1200], np2[1400];
    if (mpi_ready(mpirun, sizeof mpirun)) {
        snprintf(np2, sizeof np2, "timeout -k 5 120 %s -np 2", mpirun);
        char one[700], two[700];
        snprintf(one, sizeof one, "%s/dpo_one", t_tmpdir());
        snprintf(two, sizeof two, "%s/dpo_two", t_tmpdir());
        snprintf(args, sizeof args, "%s --steps %d --lr 1e-4 --batch 4 --accum 2 --eval-every %d --threads 1 --engine avx2 --out %s",
                 base, mpi_steps, mpi_steps / 2, one);
        T_CHECK(run_nerve(args, err, sizeof err) == 0, "one process: %s", err);
        snprintf(args, sizeof args, "%s --steps %d --lr 1e-4 --batch 4 --accum 2 --eval-every %d --threads 1 --engine avx2 --out %s",
                 base, mpi_steps, mpi_steps / 2, two);
        T_CHECK(run_launched(np2, args, err, sizeof err) == 0, "two processes: %s", err);
        double a[64], b2[64];
        const int n_one = read_values(one, "\"loss\":", a, 64), n_two = read_values(two, "\"loss\":", b2, 64);
        T_CHECK(n_one == mpi_steps && n_two == mpi_steps, "steps: %d and %d", n_one, n_two);
        for (int i = 0; i < n_one && i < n_two; i++)
            T_CHECK(fabs(a[i] - b2[i]) <= 1e-5 * fabs(a[i]), "step %d: loss %.9g in one process, %.9g in two", i + 1, a[i], b2[i]);
        T_CHECK(fabsf(val_at(one, mpi_steps) - val_at(two, mpi_steps)) <= 1e-5f * val_at(one, mpi_steps), "validation %g and %g",
                val_at(one, mpi_steps), val_at(two, mpi_steps));
        snprintf(args, sizeof args, "%s --steps 2 --batch 6 --out %s/dpo_bad", base, t_tmpdir());
        T_CHECK(run_launched(np2, args, err, sizeof err) == 2 && strstr(err, "a multiple of 4"), "--batch 6 over 2: '%s'", err);
    }

    /* a DPO run resumed from another starting model would compare with another reference: refused */
    snprintf(args, sizeof args, "train --init-from %s -z %s --data %s --batch 8 --seq 96 --warmup 5 --eval-batches 2 --seed 4 --steps 30 "
             "--lr 3e-4 --pref-sft-weight 1 --eval-every 10 --resume --quiet --out %s", model, tok, pref_data, split);
    T_CHECK(run_nerve(args, err, sizeof err) == 1 && strstr(err, "was trained against other weights than --init-from's"),
            "a resume from another model: '%s'", err);

    /* refused */
    const struct {
        const char *extra, *want;
    } bad[] = {
        {"--batch 7", "--batch must be a multiple of 2"},
        {"--pack", "--pack does not go with preference data"},
        {"--pref-beta 0", "--pref-beta"},
        {"--pref-loss kto", "unknown preference loss 'kto'"},
        {"--simpo-gamma 1", "--simpo-gamma goes with --pref-loss simpo"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "%s --steps 2 --out %s/dpo_bad %s", base, t_tmpdir(), bad[i].extra);
        T_CHECK(run_nerve(args, err, sizeof err) == 2 && strstr(err, bad[i].want), "%s: '%s'", bad[i].extra, err);
    }
    snprintf(args, sizeof args, "train -z %s --data %s --steps 2 --quiet --out %s/dpo_bad", tok, pref_data, t_tmpdir());
    T_CHECK(run_nerve(args, err, sizeof err) == 2 && strstr(err, "give it with --init-from"), "no --init-from: '%s'", err);
    snprintf(args, sizeof args, "train --init-from %s -z %s --data %s --steps 2 --pref-beta 0.5 --quiet --out %s/dpo_bad", model,
             tok, sft_data, t_tmpdir());
    T_CHECK(run_nerve(args, err, sizeof err) == 2 && strstr(err, "--pref-beta goes with preference data"), "--pref-beta on chat data: '%s'", err);
}

/* LoRA end to end on stories260K: adapters on a few matrices lower the validation loss; a run
 * interrupted part way and resumed gives the uninterrupted losses and adapter bit for bit with
 * plans built once; the run folder's merged model generates what the base model with the adapter
 * (--lora) does, and export writes that model; other weights of the same shape, another rank and
 * whole-model flags are refused, as are LoRA flags without a model and a
 * malformed adapter. */
static void lora_args(char *buf, size_t cap, const char *base, const char *out, const char *extra) {
    snprintf(buf, cap,
             "train --init-from %s -z %s --data %s --steps 24 --batch 4 --seq 64 --lr 3e-3 --warmup 2 --eval-every 8 "
             "--eval-batches 4 --ckpt-every 6 --seed 3 --lora-rank 4 --lora-targets q,v,o,down --quiet --out %s %s",
             base, t_data("models/tok512.bin"), t_data("corpus/tinystories_valid_head.txt"), out, extra);
}

/* --best-metric: best/ and --early-stop follow another figure, the highest being best (here
 * preference data's held-out reward accuracy); kept in the checkpoint, so a resume must follow the
 * same; and its refusals. */
/* The last value of `key` metrics.jsonl in dir records (0: none). */
static double last_metric(const char *dir, const char *key) {
    char path[800], pat[64], *text = NULL;
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    snprintf(pat, sizeof pat, "\"%s\":", key);
    if (nv_file_read_all(path, &text, NULL) != NV_OK) return 0;
    double v = 0;
    for (const char *p = text; (p = strstr(p, pat)) != NULL; p += strlen(pat)) v = atof(p + strlen(pat));
    free(text);
    return v;
}

/* The last step metrics.jsonl in dir records (0: none). */
static long last_step(const char *dir) { return (long)last_metric(dir, "step"); }

/* The length a run's log says --time-budget decided last (-1: none). */
static long budget_steps(const char *err) {
    long n = -1;
    for (const char *at = strstr(err, "--time-budget "); at; at = strstr(at + 1, "--time-budget ")) {
        const char *p = strstr(at, "s: ");
        if (p) n = atol(p + 3);
    }
    return n;
}

/* --time-budget: a few steps in, the run's measured rate decides how many steps fit, and it ends
 * about when the budget does; a run stopped after the decision resumes to the same length; the three
 * ways to give a run's length exclude each other. */
static void test_time_budget(void) {
    const char *data = t_data("corpus/tinystories_valid_head.txt"), *tok = t_data("models/tok512.bin");
    if (!data || !tok) return;
    char dir[700], base[2000], args[4096], err[8192];
    snprintf(base, sizeof base,
             "train --dim 32 --layers 2 --heads 4 --kv-heads 2 --hidden 64 --data %s -z %s --batch 4 --seq 32 --lr 3e-3 "
             "--eval-every 50 --eval-batches 2 --seed 7 --quiet",
             data, tok);
    snprintf(dir, sizeof dir, "%s/budget", t_tmpdir());
    snprintf(args, sizeof args, "%s --time-budget 2 --out %s", base, dir);
    double t0 = now_s();
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "run: %s", err);
    const double took = now_s() - t0;
    long n = budget_steps(err);
    T_CHECK(n >= 5 && last_step(dir) == n, "decided %ld steps, ran %ld: %s", n, last_step(dir), err);
    /* the whole command: the data and model set up, then two seconds of steps (slow machines decide fewer) */
    T_CHECK(took > 1.6 && took < 12, "a budget of 2 s took %.1f s (%ld steps)", took, n);
    const double ended = last_metric(dir, "elapsed_s");
    T_CHECK(ended > 1.5 && ended < 2.6, "the last step ended %.2f s in: %s", ended, err);
    if (getenv("T_VERBOSE")) printf("    --time-budget 2: %ld steps, %.2f s in all, the last step %.2f s in\n", n, took, ended);

    /* the machine slows down part way (20 ms more a step from 1.1 s on, 10-30x the tiny model's step
       here): the plans after it move the schedule's end, so the run still ends about when its budget does */
    snprintf(dir, sizeof dir, "%s/budget_slowed", t_tmpdir());
    snprintf(args, sizeof args, "%s --time-budget 2 --out %s", base, dir);
    T_CHECK(run_launched("env NERVE_TEST_STEP_DELAY_MS=20@1.1", args, err, sizeof err) == 0, "run: %s", err);
    const long slowed = budget_steps(err);
    const double slowed_end = last_metric(dir, "elapsed_s");
    /* fewer steps than its own pace before the slowdown would have made in 2 s (not the first run's
       count: the two runs' paces differ by as much on a machine shared with other tests) */
    static char at[32768][32];
    const int logged = read_field(dir, "\"elapsed_s\":", at, 32768);
    int before = 0;
    for (int i = 0; i < logged; i++) before += strtod(at[i], NULL) < 1.1;
    T_CHECK(slowed < 0.9 * before * 2 / 1.1 && last_step(dir) == slowed && slowed_end > 1.5 && slowed_end < 2.6,
            "slowed down part way: %ld steps (%d in its first 1.1 s), the last ended %.2f s in: %s", slowed, before, slowed_end, err);
    if (getenv("T_VERBOSE")) printf("    slowed from 1.1 s on: %ld steps, the last %.2f s in\n", slowed, slowed_end);

    /* stopped by --time-limit once decided, resumed: on to the decided length */
    snprintf(dir, sizeof dir, "%s/budget_resumed", t_tmpdir());
    snprintf(args, sizeof args, "%s --time-budget 3 --time-limit 1 --out %s", base, dir);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "run: %s", err);
    n = budget_steps(err);
    const long stopped = last_step(dir);
    T_CHECK(n >= 5 && stopped < n, "decided %ld steps, stopped at %ld: %s", n, stopped, err);
    snprintf(args, sizeof args, "%s --time-budget 3 --resume --out %s", base, dir);
    T_CHECK(run_nerve(args, err, sizeof err) == 0 && budget_steps(err) < 0, "resume: %s", err);
    T_CHECK(last_step(dir) == n, "resumed at %ld to %ld, not the %ld decided", stopped, last_step(dir), n);

    static const char *const refused[] = {"--steps 5 --time-budget 2", "--epochs 1 --time-budget 2", "--time-budget 0"};
    for (int i = 0; i < 3; i++) {
        snprintf(args, sizeof args, "%s %s --out %s/budget_refused", base, refused[i], t_tmpdir());
        T_CHECK(run_nerve(args, err, sizeof err) == 2, "%s: %s", refused[i], err);
    }
}

/* Text and no -z: the run trains its own BPE tokenizer on the text (--data, then --val-data), the
 * one `nerve tokenizer train` makes of the same files, and keeps it in its folder as tokenizer.bin
 * (the model's vocabulary its size), leaving no temporary file; a resumed run takes that one; a run
 * refused for its folder's checkpoint leaves the folder's tokenizer as it was; --vocab is refused
 * where no tokenizer is trained, and where it cannot hold the text's characters. */
static void test_own_tokenizer(void) {
    const char *text = t_data("corpus/tinystories_valid_head.txt"), *val = t_data("corpus/tinystories_sample.txt");
    if (!text || !val) return;
    char dir[700], tmp[700], args[4096], err[8192], want[800], got[800], launcher[800];
    snprintf(dir, sizeof dir, "%s/own_tok", t_tmpdir());
    snprintf(tmp, sizeof tmp, "%s/own_tok_tmp", t_tmpdir());
    T_CHECK(nv_mkdirs(tmp) == NV_OK, "%s", nv_errmsg());
    snprintf(launcher, sizeof launcher, "env TMPDIR=%s", tmp);
    static const char shape[] = "--dim 32 --layers 2 --heads 4 --kv-heads 2 --hidden 64 --batch 4 --seq 32 --eval-every 4 --eval-batches 2 --quiet";
    snprintf(args, sizeof args, "train %s --vocab 400 --data %s --val-data %s --steps 4 --out %s", shape, text, val, dir);
    T_CHECK(run_launched(launcher, args, err, sizeof err) == 0 && strstr(err, "trained a BPE tokenizer of 400 tokens"), "run: %s", err);
    snprintf(want, sizeof want, "%s/own_tok_want.bin", t_tmpdir());
    snprintf(args, sizeof args, "tokenizer train --vocab 400 %s %s -o %s", text, val, want);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "tokenizer train: %s", err);
    snprintf(got, sizeof got, "%s/tokenizer.bin", dir);
    char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    T_CHECK(nv_file_read_all(want, &a, &na) == NV_OK && nv_file_read_all(got, &b, &nb) == NV_OK && na == nb && !memcmp(a, b, na),
            "the run's tokenizer.bin (%zu bytes) is not the one nerve tokenizer train makes of its text (%zu)", nb, na);
    snprintf(args, sizeof args, "%s/model.bin", dir);
    nv_model m;
    if (nv_model_load(args, &m) == NV_OK) {
        T_CHECK(m.config.vocab_size == 400, "the model's vocabulary is %d, not the tokenizer's 400", m.config.vocab_size);
        nv_model_free(&m);
    } else {
        T_CHECK(0, "%s", nv_errmsg());
    }
    int left = 0;
    DIR *d = opendir(tmp);
    for (struct dirent *ent; d && (ent = readdir(d));) left += ent->d_name[0] != '.';
    if (d) closedir(d);
    T_CHECK(d && left == 0, "%d temporary files left in TMPDIR", left);
    /* the same command again: refused for the checkpoint, the folder's tokenizer untouched (another
       --vocab trained one elsewhere); resumed: the folder's tokenizer, none trained */
    const char *const settings[] = {"--vocab 350 --steps 4", "--vocab 400 --steps 6 --resume"};
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "train %s %s --data %s --val-data %s --out %s", shape, settings[i], text, val, dir);
        const int rc = run_nerve(args, err, sizeof err);
        if (i == 0) T_CHECK(rc == 1 && strstr(err, "already holds a checkpoint"), "%s: exit %d: %s", settings[i], rc, err);
        else T_CHECK(rc == 0 && !strstr(err, "trained a BPE") && last_step(dir) == 6, "%s: exit %d: %s", settings[i], rc, err);
        free(b);
        b = NULL;
        T_CHECK(nv_file_read_all(got, &b, &nb) == NV_OK && na == nb && !memcmp(a, b, na), "%s changed the folder's tokenizer", settings[i]);
    }
    free(a);
    free(b);
    /* a .jsonl file of text lines: the tokenizer of its texts, one a line (as a text file of those lines) */
    char jsonl[800], plain[800], jdir[700];
    snprintf(jsonl, sizeof jsonl, "%s/own_tok.jsonl", t_tmpdir());
    snprintf(plain, sizeof plain, "%s/own_tok_lines.txt", t_tmpdir());
    snprintf(jdir, sizeof jdir, "%s/own_tok_jsonl", t_tmpdir());
    FILE *fj = fopen(jsonl, "w"), *fp = fopen(plain, "w");
    for (int i = 0; fj && fp && i < 300; i++) {
        fprintf(fj, "{\"id\": %d, \"text\": \"Tom had %d red \\\"balls\\\" and a caf\\u00e9 day number %d.\"}\n", i, i % 17, i);
        fprintf(fp, "Tom had %d red \"balls\" and a caf\u00e9 day number %d.\n", i % 17, i);
    }
    if (fj) fclose(fj);
    if (fp) fclose(fp);
    snprintf(args, sizeof args, "tokenizer train --vocab 300 %s -o %s", plain, want);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "tokenizer train: %s", err);
    snprintf(args, sizeof args, "train %s --vocab 300 --data %s --steps 2 --out %s", shape, jsonl, jdir);
    T_CHECK(run_nerve(args, err, sizeof err) == 0 && strstr(err, "trained a BPE tokenizer of 300 tokens"), "a .jsonl of text: %s", err);
    snprintf(got, sizeof got, "%s/tokenizer.bin", jdir);
    T_CHECK(nv_file_read_all(want, &a, &na) == NV_OK && nv_file_read_all(got, &b, &nb) == NV_OK && na == nb && !memcmp(a, b, na),
            "the .jsonl run's tokenizer is not that of its texts, one a line");
    free(a);
    free(b);
    /* --vocab where no tokenizer is trained; one too small for the text's characters */
    const char *tok = t_data("models/tok512.bin");
    char shard[800];
    snprintf(shard, sizeof shard, "%s/own_tok.bin", t_tmpdir());
    char chat[800];
    snprintf(chat, sizeof chat, "%s/own_tok_chat.jsonl", t_tmpdir());
    FILE *fc = fopen(chat, "w");
    if (fc) fputs("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"hello\"}]}\n", fc), fclose(fc);
    const char *const refused[] = {"-z", "--data-shard", "--vocab-small", "--data-chat"};
    for (int i = 0; i < 4; i++) {
        if (i == 0) snprintf(args, sizeof args, "train %s --vocab 400 -z %s --data %s --out %s/refused", shape, tok ? tok : "x", text, t_tmpdir());
        if (i == 1) snprintf(args, sizeof args, "train %s --vocab 400 --data %s %s --out %s/refused", shape, text, shard, t_tmpdir());
        if (i == 2) snprintf(args, sizeof args, "train %s --vocab 260 --data %s --out %s/refused", shape, text, t_tmpdir());
        if (i == 3) snprintf(args, sizeof args, "train %s --vocab 400 --data %s %s --out %s/refused", shape, text, chat, t_tmpdir());
        T_CHECK(run_nerve(args, err, sizeof err) == 2 && strchr(err, '\n') == strrchr(err, '\n'), "%s: %s", refused[i], err);
    }
}

static void test_best_metric(void) {
    const char *model = t_data("models/stories260K.bin"), *tok = t_data("models/tok512.bin");
    if (!model || !tok) return;
    char data[700], dir[700], base[3000], args[4096], err[8192], path[800];
    snprintf(data, sizeof data, "%s/best_pairs.jsonl", t_tmpdir());
    if (!write_preferences(data, 40)) return;
    snprintf(base, sizeof base, "train --init-from %s -z %s --data %s --batch 8 --seq 96 --warmup 2 --eval-batches 2 --seed 4 "
             "--lr 3e-4 --pref-sft-weight 1 --eval-every 1 --engine avx2 --quiet", model, tok, data);
    snprintf(dir, sizeof dir, "%s/best_acc", t_tmpdir());
    snprintf(args, sizeof args, "%s --steps 4 --save-best --best-metric val_reward_acc --out %s", base, dir);
    T_CHECK(run_nerve(args, err, sizeof err) == 0 && strstr(err, "best held-out reward accuracy"), "run: %s", err);
    /* the first evaluation of the highest accuracy (step 0's included) */
    double acc[16];
    const int n = read_values(dir, "\"val_reward_acc\":", acc, 16);
    int best = 0;
    for (int i = 1; i < n; i++)
        if (acc[i] > acc[best]) best = i;
    nv_ckpt k;
    snprintf(path, sizeof path, "%s/ckpt.bin", dir);
    if (nv_ckpt_load(path, &k) == NV_OK) {
        T_CHECK(n == 5 && k.h.best_metric == NV_BEST_REWARD_ACC && k.h.best_step == best && k.h.best_val_loss == (float)acc[best],
                "checkpoint: metric %d, best %g at %lld; metrics: %d evaluations, the highest %g at %d", (int)k.h.best_metric,
                (double)k.h.best_val_loss, (long long)k.h.best_step, n, n ? acc[best] : 0.0, best);
        nv_ckpt_close(&k);
    } else {
        T_CHECK(0, "%s", nv_errmsg());
    }
    snprintf(path, sizeof path, "%s/best/model.bin", dir);
    T_CHECK(nv_file_exists(path), "no %s", path);
    /* resumed by the validation loss: refused, the checkpoint kept */
    snprintf(args, sizeof args, "%s --steps 6 --save-best --resume --out %s", base, dir);
    T_CHECK(run_nerve(args, err, sizeof err) == 1 && strstr(err, "kept its best by --best-metric val_reward_acc"), "resume: %s", err);
    T_CHECK(count_steps(dir) == 4, "the refused resume trained");

    /* --early-stop 2: the run stops after two evaluations without a higher accuracy */
    snprintf(dir, sizeof dir, "%s/best_early", t_tmpdir());
    snprintf(args, sizeof args, "%s --steps 12 --early-stop 2 --best-metric val_reward_acc --out %s", base, dir);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "early stop: %s", err);
    const int m = read_values(dir, "\"val_reward_acc\":", acc, 16);
    int stop = 12, hi = 0, since = 0; /* the rule, replayed on what was logged */
    for (int i = 1; i < m && stop == 12; i++) {
        if (acc[i] > acc[hi]) hi = i, since = 0;
        else if (++since >= 2) stop = i;
    }
    T_CHECK(m >= 3 && count_steps(dir) == stop && (stop == 12 || strstr(err, "the held-out reward accuracy has not gone above")),
            "stopped at step %d, the rule says %d: %s", count_steps(dir), stop, err);

    static const struct {
        const char *extra, *want;
        int rc, text;
    } bad[] = {{"--best-metric nope", "want val_loss, val_reward_acc", 2, 0},
               {"--best-metric mc_acc --save-best", "--eval-choice", 1, 0},
               {"--best-metric val_choice_acc", "goes with --save-best or --early-stop", 1, 0},
               {"--best-metric val_reward_acc --save-best", "this run's data are not pairs", 1, 1},
               {"--best-metric val_token_acc --save-best", "preference pairs are scored by their rewards", 1, 0},
               {"--full-eval", "preference pairs are scored by their rewards", 1, 0},
               {"--full-eval --val-frac 0", "--full-eval scores the whole validation split: give held-out data", 1, 1}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(dir, sizeof dir, "%s/best_bad%zu", t_tmpdir(), i);
        if (bad[i].text) train_args(args, sizeof args, dir, bad[i].extra);
        else snprintf(args, sizeof args, "%s --steps 2 %s --out %s", base, bad[i].extra, dir);
        T_CHECK(run_nerve(args, err, sizeof err) == bad[i].rc && strstr(err, bad[i].want), "%s: exit ?, '%s'", bad[i].extra, err);
    }
}

/* Every metrics.jsonl line of a run folder, parsed (up to max); their number. */
static int metrics_lines(const char *dir, cJSON **out, int max) {
    char path[800], *text = NULL;
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    if (nv_file_read_all(path, &text, NULL) != NV_OK) return 0;
    int n = 0;
    for (char *line = strtok(text, "\n"); line && n < max; line = strtok(NULL, "\n")) out[n++] = cJSON_Parse(line);
    free(text);
    return n;
}

static double field_or_nan(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* Model file path's mean loss over windows 0..n-1 of T + 1 tokens of toks (overlapping by one) into
 * *nll, and how many of their targets have the largest logit of their row into *right, as the
 * inference forward makes them (fp32): the number of targets, 0 when the model did not load. */
static int reference_figures(const char *path, const int *toks, int n, int T, double *nll, int *right) {
    nv_model model;
    nv_state st;
    double sum_nll = 0;
    int targets = 0;
    *right = 0;
    if (nv_model_load(path, &model) != NV_OK || nv_model_build_plans(&model, NV_ENGINE_AVX2) != NV_OK) {
        T_CHECK(0, "%s", nv_errmsg());
        return 0;
    }
    const int V = model.config.vocab_size;
    if (nv_state_init(&st, &model.config, T, T, 1) == NV_OK) {
        for (int w = 0; w < n && nv_forward(&model, &st, toks + w * T, T, 0) == NV_OK; w++)
            for (int t = 0; t < T; t++) {
                const float *lg = st.logits + (size_t)t * V;
                const int target = toks[w * T + t + 1];
                float mx = lg[0];
                for (int v = 1; v < V; v++) mx = lg[v] > mx ? lg[v] : mx;
                double sum = 0;
                for (int v = 0; v < V; v++) sum += exp((double)lg[v] - mx);
                sum_nll += log(sum) + mx - lg[target];
                *right += lg[target] >= mx;
                targets++;
            }
        nv_state_free(&st);
    }
    nv_model_free(&model);
    *nll = targets ? sum_nll / targets : NAN;
    return targets;
}

/* Token accuracy and --full-eval: a step's token_acc is a count of its 128 targets; step 0's
 * evaluation is the starting model's over the first batch; --full-eval's loss and accuracy come at
 * each epoch's end and the last step alone, and are those of the final model over every validation
 * window once, as the inference forward makes them; --best-metric
 * val_token_acc keeps the evaluation of the highest. */
static void test_token_accuracy_and_full_eval(void) {
    const char *m = t_data("models/stories260K.bin"), *tokp = t_data("models/tok512.bin");
    enum { TRAIN = 300, VAL = 600, T = 64 };
    int *ids;
    if (!m || !tokp || !story_tokens(20000, TRAIN + VAL, &ids)) return;
    char base[3000], args[4096], err[8192], dir[600], shard[2][600], path[800];
    u16_shard("acc_train.bin", ids, TRAIN, shard[0], sizeof shard[0]);
    u16_shard("acc_val.bin", ids + TRAIN, VAL, shard[1], sizeof shard[1]);
    const int *val = ids + TRAIN;
    snprintf(base, sizeof base, "train --init-from %s -z %s --data %s --val-data %s --batch 2 --seq %d --warmup 1 --engine avx2 --quiet", m,
             tokp, shard[0], shard[1], T);
    snprintf(dir, sizeof dir, "%s/token_acc", t_tmpdir());
    snprintf(args, sizeof args, "%s --steps 7 --lr 1e-3 --eval-every 3 --eval-batches 1 --full-eval --out %s", base, dir);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "run: %s", err);
    cJSON *line[16];
    const int nl = metrics_lines(dir, line, 16);
    T_CHECK(nl == 8, "%d metrics lines", nl);
    int full_steps = 0, bad_full = 0, bad_acc = 0, evals = 0;
    double prev_epoch = 0, full_loss = NAN, full_acc = NAN, val0 = NAN, acc0 = NAN;
    for (int i = 0; i < nl; i++) {
        const int step = (int)field_or_nan(line[i], "step");
        const double acc = field_or_nan(line[i], "token_acc"), epoch = field_or_nan(line[i], "epoch");
        if (step > 0) /* a count of the step's 2 x 64 targets */
            bad_acc += !(acc >= 0 && acc <= 1 && fabs(acc * 2 * T - round(acc * 2 * T)) < 1e-6);
        const int want_full = step > 0 && (floor(epoch) > floor(prev_epoch) || step == 7);
        if (step > 0) prev_epoch = epoch;
        const int has_full = !isnan(field_or_nan(line[i], "full_val_loss")) && !isnan(field_or_nan(line[i], "full_val_token_acc"));
        bad_full += want_full != has_full;
        full_steps += has_full;
        evals += !isnan(field_or_nan(line[i], "val_loss")) && field_or_nan(line[i], "val_token_acc") >= 0;
        if (step == 7) full_loss = field_or_nan(line[i], "full_val_loss"), full_acc = field_or_nan(line[i], "full_val_token_acc");
        if (step == 0) val0 = field_or_nan(line[i], "val_loss"), acc0 = field_or_nan(line[i], "val_token_acc");
    }
    /* 300 tokens hold 4.67 windows of 65: a pass every 2.33 steps of 2 */
    T_CHECK(bad_acc == 0 && bad_full == 0 && full_steps == 3 && evals == 4,
            "token_acc off %d times; full evaluations %d (%d misplaced); %d evaluations", bad_acc, full_steps, bad_full, evals);
    for (int i = 0; i < nl; i++) cJSON_Delete(line[i]);

    /* the final model over the 9 validation windows (599 tokens: 9 x 64 targets), one forward each;
       and the starting model over step 0's evaluation, the first batch (windows 0 and 1) */
    double nll, nll0;
    int right, right0;
    snprintf(path, sizeof path, "%s/model.bin", dir);
    const int targets = reference_figures(path, val, 9, T, &nll, &right), targets0 = reference_figures(m, val, 2, T, &nll0, &right0);
    free(ids);
    T_CHECK(targets == 9 * T && fabs(nll - full_loss) <= 1e-4 * full_loss && fabs(right - full_acc * targets) <= 1.5,
            "the whole validation split: loss %.6f, accuracy %.6f (%d of %d) here; the trainer's %.6f, %.6f", nll,
            (double)right / targets, right, targets, full_loss, full_acc);
    T_CHECK(targets0 == 2 * T && fabs(nll0 - val0) <= 1e-4 * val0 && fabs(right0 - acc0 * targets0) <= 1.5,
            "step 0's evaluation: loss %.6f, accuracy %.6f here; the trainer's %.6f, %.6f", nll0, (double)right0 / targets0, val0, acc0);

    /* --best-metric val_token_acc: best/ at the first evaluation of the highest */
    snprintf(dir, sizeof dir, "%s/token_acc_best", t_tmpdir());
    snprintf(args, sizeof args, "%s --steps 4 --lr 3e-3 --eval-every 1 --eval-batches 2 --save-best --best-metric val_token_acc --out %s",
             base, dir);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "best run: %s", err);
    double acc[16] = {0};
    const int na = read_values(dir, "\"val_token_acc\":", acc, 16);
    int best = 0;
    for (int i = 1; i < na; i++)
        if (acc[i] > acc[best]) best = i;
    char want[96];
    snprintf(want, sizeof want, "best held-out token accuracy %.4f, at step %d", acc[best], best);
    T_CHECK(na == 5 && strstr(err, want), "%d evaluations; wanted '%s' in %s", na, want, err);
}

/* Chat turns run only as far as each micro-batch's furthest answer, in training and in evaluations:
 * the losses of whole windows (the test hook NERVE_TEST_WHOLE_WINDOWS) to 1e-5 but for the order
 * of sums, full and LoRA fine-tunes, while metrics.jsonl's run_tokens shows the rows cut. */
static void test_trimmed_windows(void) {
    const char *model = t_data("models/stories260K.bin"), *tok = t_data("models/tok512.bin");
    if (!model || !tok) return;
    static const char *const words[] = {"the", "cat", "saw", "a", "big", "red", "ball", "and", "ran", "to", "park", "Lily"};
    char data[700], args[4096], err[8192], dir[2][700];
    snprintf(data, sizeof data, "%s/trim.jsonl", t_tmpdir());
    FILE *f = fopen(data, "w");
    uint64_t x = 7;
    for (int i = 0; f && i < 40; i++) { /* one long answer (the windows' length), the rest a few words */
        fprintf(f, "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me story %d.\"},{\"role\":\"assistant\",\"content\":\"", i);
        const int n = i == 0 ? 150 : 3 + i % 10;
        for (int w = 0; w < n; w++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            fprintf(f, "%s%s", w ? " " : "", words[(x >> 33) % 12]);
        }
        fprintf(f, "\"}]}\n");
    }
    if (f) fclose(f);
    static const char *const kinds[2] = {"", "--lora-rank 4 --no-merge"};
    for (int k = 0; k < 2; k++) {
        for (int run = 0; run < 2; run++) {
            snprintf(dir[run], sizeof dir[run], "%s/trim%d%d", t_tmpdir(), k, run);
            snprintf(args, sizeof args,
                     "train --init-from %s -z %s --data %s --val-frac 0.1 --seq auto --batch 4 --steps 24 --lr 1e-3 --eval-every 12 "
                     "--eval-batches 2 --full-eval --engine avx2 --quiet %s --out %s",
                     model, tok, data, kinds[k], dir[run]);
            T_CHECK(run_launched(run ? "env NERVE_TEST_WHOLE_WINDOWS=1" : "", args, err, sizeof err) == 0, "%s run %d: %s", kinds[k], run, err);
        }
        check_close_runs(dir[0], dir[1], "\"loss\":", 24, 0, 1e-5);
        double va[4], vb[4], ra[32], rb[32];
        const int nva = read_values(dir[0], "\"val_loss\":", va, 4), nvb = read_values(dir[1], "\"val_loss\":", vb, 4);
        T_CHECK(nva == 3 && nvb == 3 && fabs(va[0] - vb[0]) <= 1e-5 * vb[0] && fabs(va[2] - vb[2]) <= 1e-4 * vb[2],
                "%s: validation %g, whole windows %g", kinds[k], nva ? va[nva - 1] : 0.0, nvb ? vb[nvb - 1] : 0.0);
        double fa[8], fb[8]; /* (the evaluations' windows cut as training's are) */
        const int nfa = read_values(dir[0], "\"full_val_loss\":", fa, 8), nfb = read_values(dir[1], "\"full_val_loss\":", fb, 8);
        T_CHECK(nfa >= 1 && nfa == nfb && fabs(fa[nfa - 1] - fb[nfa - 1]) <= 1e-4 * fb[nfa - 1], "%s: full validation %g, whole windows %g",
                kinds[k], nfa ? fa[nfa - 1] : 0.0, nfb ? fb[nfb - 1] : 0.0);
        const int nra = read_values(dir[0], "\"run_tokens\":", ra, 32), nrb = read_values(dir[1], "\"run_tokens\":", rb, 32);
        int cut = 0, bad = 0;
        for (int i = 0; i < nra && i < nrb; i++) {
            cut += ra[i] < rb[i];
            bad += ra[i] > rb[i] || rb[i] != rb[0] || (long)ra[i] % 64 != 0; /* 4 windows of a multiple of 16 */
        }
        T_CHECK(nra == 24 && nrb == 24 && cut >= 12 && !bad, "%s: run_tokens cut on %d steps of 24 (%d wrong): %g against %g", kinds[k], cut, bad,
                nra ? ra[0] : 0.0, nrb ? rb[0] : 0.0);
    }
    /* dropout's buffers, made at the first step's (short) length, hold a later step's whole windows
       (the sanitizer pass sees an overflow) */
    snprintf(dir[0], sizeof dir[0], "%s/trim_drop", t_tmpdir());
    snprintf(args, sizeof args,
             "train --init-from %s -z %s --data %s --val-frac 0.1 --seq auto --batch 4 --steps 24 --lr 1e-3 --eval-every 0 --engine avx2 "
             "--quiet --dropout 0.1 --lora-rank 4 --lora-dropout 0.1 --no-merge --out %s",
             model, tok, data, dir[0]);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "dropout: %s", err);
    double rd[32];
    const int nrd = read_values(dir[0], "\"run_tokens\":", rd, 32);
    int longer = 0;
    for (int i = 1; i < nrd; i++) longer |= rd[i] > rd[0];
    T_CHECK(nrd == 24 && longer, "dropout's run: no step longer than the first (%d steps)", nrd);
}

static void test_lora_run(void) {
    char base[1000], tok[1000], base_gguf[1000]; /* t_data's buffers are reused */
    if (!t_data("models/stories260K.bin") || !t_data("models/tok512.bin") || !t_data("gguf/tinyllamas-stories-260k-f32.gguf") ||
        !t_data("corpus/tinystories_valid_head.txt"))
        return;
    snprintf(base, sizeof base, "%s", t_data("models/stories260K.bin"));
    snprintf(tok, sizeof tok, "%s", t_data("models/tok512.bin"));
    snprintf(base_gguf, sizeof base_gguf, "%s", t_data("gguf/tinyllamas-stories-260k-f32.gguf"));
    char args[4096], err[4096], full[600], split[600], path[800];
    snprintf(full, sizeof full, "%s/lora_full", t_tmpdir());
    snprintf(split, sizeof split, "%s/lora_split", t_tmpdir());
    lora_args(args, sizeof args, base, full, "--save-every 10");
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "LoRA run failed: %s", err);
    const float before = val_at(full, 0), after = val_at(full, 24);
    T_CHECK(isfinite(before) && after < before, "validation loss %.4f -> %.4f", before, after);
    snprintf(path, sizeof path, "%.600s/adapter.gguf", full);
    T_CHECK(nv_file_exists(path), "no adapter.gguf in the run folder");

    lora_args(args, sizeof args, base, split, "--save-every 10");
    int done_before = 0;
    const int st = run_interrupted("", args, split, SIGINT, 0, &done_before);
    T_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && done_before >= 9 && done_before < 24, "interrupt: status %d at step %d", st,
            done_before);
    lora_args(args, sizeof args, base, split, "--resume --save-every 10");
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "resume failed: %s", err);
    for (int step = 10; step <= 30; step += 10) { /* --save-every's adapters, the same however the run was cut */
        char pa[800], pb[800];
        snprintf(pa, sizeof pa, "%.600s/step-%d/adapter.gguf", full, step);
        snprintf(pb, sizeof pb, "%.600s/step-%d/adapter.gguf", split, step);
        T_CHECK(step == 30 ? !nv_file_exists(pa) : t_same_files(pa, pb), "step %d's adapters", step);
    }
    char a[64][32], b[64][32];
    int na = read_losses(full, a, 64), nb = read_losses(split, b, 64);
    T_CHECK(na == 24 && nb == 24, "steps logged: %d uninterrupted, %d interrupted+resumed", na, nb);
    for (int i = 0; i < na && i < nb; i++) T_CHECK(strcmp(a[i], b[i]) == 0, "step %d: loss %s vs %s", i + 1, a[i], b[i]);
    char *fa = NULL, *fb = NULL;
    size_t la = 0, lb = 0;
    snprintf(path, sizeof path, "%.600s/adapter.gguf", full);
    nv_file_read_all(path, &fa, &la);
    snprintf(path, sizeof path, "%.600s/adapter.gguf", split);
    nv_file_read_all(path, &fb, &lb);
    T_CHECK(fa && fb && la == lb && !memcmp(fa, fb, la), "the resumed run's adapter differs");
    free(fa), free(fb);
    char builds[64][32];
    const int nbuild = read_field(full, "\"plan_builds\":", builds, 64);
    for (int i = 1; i < nbuild; i++) T_CHECK(!strcmp(builds[i], builds[0]), "plan builds %s then %s", builds[0], builds[i]);

    /* the merged model, the base with the adapter, and export's model say the same */
    char merged[4096], adapted[4096];
    snprintf(args, sizeof args, "generate -m %s -t 0 -n 48", full);
    T_CHECK(t_nerve(args) == 0, "generate from the run: %s", t_err);
    snprintf(merged, sizeof merged, "%s", t_out);
    snprintf(args, sizeof args, "generate -m %s -z %s --lora %s/adapter.gguf -t 0 -n 48", base, tok, full);
    T_CHECK(t_nerve(args) == 0 && strstr(t_err, "merged"), "generate with --lora: %s", t_err);
    snprintf(adapted, sizeof adapted, "%s", t_out);
    T_CHECK(strlen(merged) > 40 && !strcmp(merged, adapted), "merged model '%s', base with the adapter '%s'", merged, adapted);
    snprintf(args, sizeof args, "generate -m %s -z %s --lora-scaled %s/adapter.gguf 0 -t 0 -n 48", base, tok, full);
    T_CHECK(t_nerve(args) == 0, "--lora-scaled 0: %s", t_err);
    snprintf(adapted, sizeof adapted, "%s", t_out);
    snprintf(args, sizeof args, "generate -m %s -z %s -t 0 -n 48", base, tok);
    T_CHECK(t_nerve(args) == 0 && !strcmp(t_out, adapted) && strcmp(t_out, merged) != 0,
            "scale 0 is not the base model's text, or the adapter changed nothing");
    snprintf(args, sizeof args, "export %s -o %s/lora_export.bin", full, t_tmpdir());
    T_CHECK(run_nerve(args, err, sizeof err) == 0 && strstr(err, "merged model"), "export of the run: %s", err);
    snprintf(args, sizeof args, "export %s --lora %s/adapter.gguf -o %s/lora_export2.bin", base, full, t_tmpdir());
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "export --lora: %s", err);
    snprintf(path, sizeof path, "%.600s/model.bin", full);
    char *m1 = NULL, *m2 = NULL, *m3 = NULL;
    size_t l1 = 0, l2 = 0, l3 = 0;
    nv_file_read_all(path, &m1, &l1);
    nv_file_read_all(t_path("lora_export.bin"), &m2, &l2);
    nv_file_read_all(t_path("lora_export2.bin"), &m3, &l3);
    T_CHECK(m1 && m2 && m3 && l1 == l2 && l1 == l3 && !memcmp(m1, m2, l1) && !memcmp(m1, m3, l1),
            "the run's model, its export and the base merged by export differ");
    free(m1), free(m2), free(m3);

    /* a quantized (Q8_0) base: the adapted matrices take the merged weights, not the file's blocks */
    snprintf(args, sizeof args, "export %s -z %s --type q8_0 -o %s/base_q8.gguf", base, tok, t_tmpdir());
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "export q8_0: %s", err);
    snprintf(args, sizeof args, "export %s/base_q8.gguf --lora %s/adapter.gguf -o %s/merged_q8.bin", t_tmpdir(), full, t_tmpdir());
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "export q8_0 --lora: %s", err);
    snprintf(args, sizeof args, "generate -m %s/merged_q8.bin -z %s -t 0 -n 48", t_tmpdir(), tok);
    T_CHECK(t_nerve(args) == 0, "generate merged q8_0: %s", t_err);
    snprintf(merged, sizeof merged, "%s", t_out);
    snprintf(args, sizeof args, "generate -m %s/base_q8.gguf -z %s --lora %s/adapter.gguf -t 0 -n 48", t_tmpdir(), tok, full);
    T_CHECK(t_nerve(args) == 0, "generate q8_0 --lora: %s", t_err);
    T_CHECK(strlen(merged) > 40 && !strcmp(merged, t_out), "q8_0 base with the adapter '%s', merged '%s'", t_out, merged);
    snprintf(args, sizeof args, "generate -m %s/base_q8.gguf -z %s -t 0 -n 48", t_tmpdir(), tok);
    T_CHECK(t_nerve(args) == 0 && strcmp(merged, t_out) != 0, "the adapter changed nothing on the q8_0 base");
    /* trained on that base, or on a llama2.c v1 file (used in place: a file's mapping), the frozen
       matrices' fp32 pages are let go once the plans hold them, and the model is had again for the
       merges (read again, or the file's pages): the run's model and best/ are the base merged by export
       with the run's adapters, byte for byte */
    snprintf(args, sizeof args, "export %s -o %s/base_v1.bin", base, t_tmpdir());
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "export v1: %s", err);
    for (int kind = 0; kind < 2; kind++) {
        char run[700], from[700];
        snprintf(run, sizeof run, "%s/lora_run_%d", t_tmpdir(), kind);
        snprintf(from, sizeof from, "%s/%s", t_tmpdir(), kind ? "base_v1.bin" : "base_q8.gguf");
        snprintf(args, sizeof args,
                 "train --init-from %s -z %s --data %s --steps 8 --batch 4 --seq 64 --lr 3e-3 --warmup 2 --eval-every 4 "
                 "--eval-batches 2 --save-best --lora-rank 4 --quiet --out %s",
                 from, tok, t_data("corpus/tinystories_valid_head.txt"), run);
        T_CHECK(run_nerve(args, err, sizeof err) == 0, "LoRA run on %s: %s", from, err);
        for (int best = 0; best < 2; best++) {
            char want[800];
            snprintf(want, sizeof want, "%s/merged_%d_%d.bin", t_tmpdir(), kind, best);
            snprintf(args, sizeof args, "export %s --lora %s%s/adapter.gguf -o %s", from, run, best ? "/best" : "", want);
            T_CHECK(run_nerve(args, err, sizeof err) == 0, "export --lora: %s", err);
            snprintf(path, sizeof path, "%s%s/model.bin", run, best ? "/best" : "");
            T_CHECK(t_same_files(path, want), "%s is not %s merged with its adapters", path, from);
        }
    }
    /* a merged model older than the run's checkpoint (a run that died before its end) is not exported */
    snprintf(path, sizeof path, "%.600s/ckpt.bin", full);
    struct timespec later[2];
    clock_gettime(CLOCK_REALTIME, &later[0]);
    later[0].tv_sec += 60;
    later[1] = later[0];
    T_CHECK(utimensat(AT_FDCWD, path, later, 0) == 0, "utimensat %s", path);
    snprintf(args, sizeof args, "export %s -o %s/stale.bin", full, t_tmpdir());
    int rc = run_nerve(args, err, sizeof err);
    T_CHECK(rc == 1 && strstr(err, "older than its checkpoint") && strstr(err, "--lora"), "stale merged model: exit %d '%s'", rc, err);

    /* refused: other weights of the same shape, another rank, the whole model, flags without a model */
    snprintf(args, sizeof args, "init --preset stories260K --seed 9 -o %s/other_base.bin", t_tmpdir());
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "init: %s", err);
    snprintf(path, sizeof path, "%s/other_base.bin", t_tmpdir());
    lora_args(args, sizeof args, path, split, "--resume --steps 30");
    rc = run_nerve(args, err, sizeof err);
    T_CHECK(rc == 1 && strstr(err, "adapts other weights"), "another base: exit %d '%s'", rc, err);
    lora_args(args, sizeof args, base, split, "--resume --lora-rank 8");
    rc = run_nerve(args, err, sizeof err);
    T_CHECK(rc == 1 && strstr(err, "rank 4"), "another rank: exit %d '%s'", rc, err);
    snprintf(args, sizeof args, "train --init-from %s -z %s --data %s --steps 24 --batch 4 --seq 64 --seed 3 --quiet --out %s --resume",
             base, tok, t_data("corpus/tinystories_valid_head.txt"), split);
    rc = run_nerve(args, err, sizeof err);
    T_CHECK(rc == 1 && strstr(err, "LoRA adapters"), "whole-model resume of a LoRA run: exit %d '%s'", rc, err);
    const char *bad[] = {"train --lora-rank 4", "train --lora-alpha 8", "train --lora-targets q",
                         "train --init-from x.bin --lora-rank 0", "train --init-from x.bin --lora-rank 4 --lora-targets q,x",
                         "train --lora-dropout 0.1", "train --init-from x.bin --lora-rank 4 --lora-dropout 1",
                         "train --dropout 0.99", "train --dropout -0.1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rc = run_nerve(bad[i], err, sizeof err);
        T_CHECK(rc == 2 && !strncmp(err, "nerve train:", 12) && strchr(err, '\n') == strrchr(err, '\n'), "'%s': exit %d '%s'",
                bad[i], rc, err);
    }
    /* a rank past the model's matrices, and a malformed adapter */
    snprintf(args, sizeof args, "train --init-from %s -z %s --lora-rank 65 --steps 1 --quiet --out %s/lora_big", base, tok, t_tmpdir());
    rc = run_nerve(args, err, sizeof err);
    T_CHECK(rc == 1 && strstr(err, "LoRA rank 65"), "rank 65 of stories260K: exit %d '%s'", rc, err);
    snprintf(args, sizeof args, "generate -m %s -z %s --lora %s -n 8", base, tok, base_gguf);
    rc = t_nerve(args);
    T_CHECK(rc == 1 && strstr(t_err, "not an adapter") && strchr(t_err, '\n') == strrchr(t_err, '\n'),
            "a model as adapter: exit %d '%s'", rc, t_err);
}

/* --save-every N|epoch and --save-limit: step-N/ folders hold the weights after step N (with a
 * constant rate, the model of a run that ended there, byte for byte), at each epoch's end with
 * --epochs, none at the last step, the newest K kept; a new run removes an earlier one's. --lora-init
 * starts the adapters from a run's: its first evaluation is that run's last, to the bit; its refusals. */
static void test_save_every_and_lora_init(void) {
    char base[1000], tok[1000];
    if (!t_data("models/stories260K.bin") || !t_data("models/tok512.bin") || !t_data("corpus/tinystories_valid_head.txt")) return;
    snprintf(base, sizeof base, "%s", t_data("models/stories260K.bin"));
    snprintf(tok, sizeof tok, "%s", t_data("models/tok512.bin"));
    char args[4096], err[4096], dir[600], six[600], path[800], want[800];
    snprintf(dir, sizeof dir, "%s/save_every", t_tmpdir());
    snprintf(six, sizeof six, "%s/save_every6", t_tmpdir());
    train_args(args, sizeof args, dir, "--steps 10 --lr-schedule constant --save-every 3 --save-limit 2");
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "run: %s", err);
    train_args(args, sizeof args, six, "--steps 6 --lr-schedule constant");
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "run of 6: %s", err);
    snprintf(path, sizeof path, "%s/step-6/model.bin", dir);
    snprintf(want, sizeof want, "%s/model.bin", six);
    T_CHECK(t_same_files(path, want), "step-6/ holds the weights after step 6");
    for (int step = 3; step <= 10; step++) {
        snprintf(path, sizeof path, "%s/step-%d", dir, step);
        T_CHECK(nv_file_exists(path) == (step == 6 || step == 9), "step-%d/ (the last two of 3, 6, 9 kept)", step);
    }
    snprintf(path, sizeof path, "%s/step-9/tokenizer.bin", dir);
    T_CHECK(nv_file_exists(path), "a step's folder is a model folder");
    snprintf(args, sizeof args, "generate -m %s/step-9 -n 8 -t 0", dir);
    T_CHECK(t_nerve(args) == 0, "generate from step-9/: %s", t_err);
    /* resumed: the folders past its checkpoint (a run killed after writing them) and a half-written one go */
    snprintf(path, sizeof path, "%s/step-12", dir);
    T_CHECK(nv_mkdirs(path) == NV_OK, "mkdir");
    snprintf(path, sizeof path, "%s/.step-4.part", dir);
    T_CHECK(nv_mkdirs(path) == NV_OK, "mkdir");
    train_args(args, sizeof args, dir, "--steps 12 --lr-schedule constant --save-every 3 --save-limit 2 --resume");
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "resumed: %s", err);
    snprintf(path, sizeof path, "%s/step-12", dir);
    snprintf(want, sizeof want, "%s/.step-4.part", dir);
    T_CHECK(!nv_file_exists(path) && !nv_file_exists(want), "the resumed run's folders past its checkpoint removed");
    train_args(args, sizeof args, dir, "--steps 2"); /* refused (a checkpoint is there): the folder as it was */
    T_CHECK(run_nerve(args, err, sizeof err) == 1 && strstr(err, "already holds a checkpoint"), "a new run over a run: %s", err);
    snprintf(path, sizeof path, "%s/step-9", dir);
    T_CHECK(nv_file_exists(path), "a refused run removes nothing");
    /* a GGUF model (QK-norm): a step's folder holds its vocabulary, as the run folder's */
    snprintf(want, sizeof want, "%s/save_every_gguf", t_tmpdir());
    train_args(args, sizeof args, want, "--steps 3 --qk-norm --save-every 2");
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "QK-norm run: %s", err);
    snprintf(args, sizeof args, "generate -m %s/step-2/model.gguf -n 4 -t 0", want);
    T_CHECK(t_nerve(args) == 0, "generate from step-2/model.gguf alone: %s", t_err);
    train_args(args, sizeof args, dir, "--steps 2"); /* a new run in the folder: the earlier one's gone */
    snprintf(path, sizeof path, "%s/ckpt.bin", dir);
    unlink(path);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "a new run: %s", err);
    snprintf(path, sizeof path, "%s/step-9", dir);
    T_CHECK(!nv_file_exists(path), "a new run removes the earlier run's step-N/");

    /* at each epoch's end: 10 chat turns, batch 4: windows 12, 20, 32 pass 10, 20, 30 at steps 3, 5, 8 (the last) */
    snprintf(path, sizeof path, "%s/save_epochs.jsonl", t_tmpdir());
    FILE *f = fopen(path, "w");
    for (int i = 0; f && i < 10; i++)
        fprintf(f, "{\"messages\":[{\"role\":\"user\",\"content\":\"Who is friend %d?\"},{\"role\":\"assistant\",\"content\":"
                   "\"Lily.\"}]}\n", i);
    if (f) fclose(f);
    snprintf(dir, sizeof dir, "%s/save_epochs", t_tmpdir());
    snprintf(args, sizeof args,
             "train --init-from %s -z %s --data %s --val-frac 0 --epochs 3 --batch 4 --seq auto --lora-rank 4 --no-merge "
             "--save-every epoch --quiet --out %s",
             base, tok, path, dir);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "epochs run: %s", err);
    for (int step = 1; step <= 8; step++) {
        snprintf(path, sizeof path, "%s/step-%d/adapter.gguf", dir, step);
        T_CHECK(nv_file_exists(path) == (step == 3 || step == 5), "step-%d/ (epochs end at 3, 5 and 8, the last)", step);
    }

    /* --lora-init: a LoRA run's adapters trained on */
    char first[600], second[600];
    snprintf(first, sizeof first, "%s/lora_init1", t_tmpdir());
    snprintf(second, sizeof second, "%s/lora_init2", t_tmpdir());
    lora_args(args, sizeof args, base, first, "--steps 8");
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "first run: %s", err);
    snprintf(path, sizeof path, "%s/adapter.gguf", first);
    char extra[1000];
    snprintf(extra, sizeof extra, "--steps 2 --lora-init %s", path);
    lora_args(args, sizeof args, base, second, extra);
    char *rank = strstr(args, "--lora-rank 4 --lora-targets q,v,o,down");
    if (rank) memset(rank, ' ', strlen("--lora-rank 4 --lora-targets q,v,o,down")); /* (the file's shape) */
    T_CHECK(run_nerve(args, err, sizeof err) == 0 && strstr(err, "rank 4"), "from the first run's adapters: %s", err);
    const float end1 = val_at(first, 8), start2 = val_at(second, 0), start1 = val_at(first, 0);
    T_CHECK(isfinite(end1) && end1 == start2 && start2 != start1, "validation loss: first run %.6f -> %.6f, the second starts at %.6f", start1,
            end1, start2);
    snprintf(want, sizeof want, "%s/model.bin", second);
    T_CHECK(nv_file_exists(want) && !strstr(err, "not written"), "the second run's merged model: %s", err);
    struct {
        const char *extra;
        int rc;
        const char *says;
    } bad[] = {{"--lora-rank 8", 2, "--lora-rank must agree"},
               {"--lora-alpha 3", 2, "--lora-alpha must agree"},
               {"--lora-targets q", 2, "--lora-targets must agree"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(args, sizeof args, "train --init-from %s -z %s --lora-init %s %s --steps 1 --quiet --out %s/lora_init_bad", base, tok, path,
                 bad[i].extra, t_tmpdir());
        const int rc = run_nerve(args, err, sizeof err);
        T_CHECK(rc == bad[i].rc && strstr(err, bad[i].says) && strchr(err, '\n') == strrchr(err, '\n'), "%s: exit %d '%s'", bad[i].extra, rc, err);
    }
    const char *refused[][2] = {{"train --lora-init x.gguf --steps 1", "give it with --init-from"},
                                {"train --save-limit 2 --steps 1", "--save-limit goes with --save-every"},
                                {"train --save-every 0 --steps 1", "--save-every"},
                                {"train --save-every epochs --steps 1", "--save-every"}};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        const int rc = run_nerve(refused[i][0], err, sizeof err);
        T_CHECK(rc == 2 && strstr(err, refused[i][1]), "'%s': exit %d '%s'", refused[i][0], rc, err);
    }
    snprintf(args, sizeof args, "train --init-from %s -z %s --lora-init %s/missing.gguf --steps 1 --quiet --out %s/lora_init_bad", base, tok,
             t_tmpdir(), t_tmpdir());
    const int rc = run_nerve(args, err, sizeof err);
    T_CHECK(rc == 1 && strstr(err, "--lora-init") && strchr(err, '\n') == strrchr(err, '\n'), "a missing adapter: exit %d '%s'", rc, err);
}

/* Distillation (--teacher): resumed after SIGINT to the same losses (the teacher's logits are the
 * windows' own), plans built once; the KL term and the teacher's time logged; the student learns
 * towards the teacher (its KL falls); the misuses refused in one line each. */
static void test_distill_run(void) {
    char teacher[600];
    const char *tp = t_data("models/stories260K.bin");
    if (!tp || !t_data("corpus/tinystories_valid_head.txt") || !t_data("models/tok512.bin")) return;
    snprintf(teacher, sizeof teacher, "%.599s", tp); /* (t_data's buffers are reused) */
    char extra[2400], args[4096], err[4096], dir[700];
    snprintf(extra, sizeof extra, "--teacher %s --distill-alpha 0.6 --distill-temp 2", teacher);
    resume_case("kd", extra);
    snprintf(dir, sizeof dir, "%s/kdfull", t_tmpdir());
    char kl[64][32], ms[64][32];
    const int nk = read_field(dir, "\"distill_kl\":", kl, 64), nm = read_field(dir, "\"ms_teacher\":", ms, 64);
    T_CHECK(nk == 24 && nm == 24 && atof(kl[23]) < atof(kl[0]) && atof(ms[0]) > 0, "distill_kl %d steps (%s -> %s), ms_teacher %d",
            nk, nk ? kl[0] : "-", nk ? kl[nk - 1] : "-", nm);
    /* the objective is not the cross-entropy's: other losses than the plain run's after the first step */
    char plain[64][32], kd[64][32];
    char plain_dir[700];
    snprintf(plain_dir, sizeof plain_dir, "%s/kdplain", t_tmpdir());
    train_args(args, sizeof args, plain_dir, "");
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "the plain run: %s", err);
    const int np = read_losses(plain_dir, plain, 64), nkd = read_losses(dir, kd, 64);
    T_CHECK(np == 24 && nkd == 24 && !strcmp(plain[0], kd[0]) && strcmp(plain[5], kd[5]) != 0,
            "the first loss (same weights) %s / %s, the sixth %s / %s", np ? plain[0] : "-", nkd ? kd[0] : "-", np > 5 ? plain[5] : "-",
            nkd > 5 ? kd[5] : "-");
    snprintf(dir, sizeof dir, "%s/kdrep", t_tmpdir());
    train_args(args, sizeof args, dir, extra);
    char *q = strstr(args, " --quiet");
    if (q) memset(q, ' ', 8);
    T_CHECK(run_nerve(args, err, sizeof err) == 0 && strstr(err, "(kl ") && strstr(err, "the teacher's ") && strstr(err, "teacher: "),
            "the progress and report lines: %s", err);
    /* packed chat windows: the teacher sees each conversation alone, as the model does, so a model
       distilled from itself (both fp32) starts with no divergence at all */
    nv_buf chat = {0};
    static const char *const who[] = {"Tom", "Sue", "the dog", "a bird", "Lily"};
    for (int i = 0; i < 60; i++)
        nv_buf_printf(&chat, "{\"messages\": [{\"role\": \"user\", \"content\": \"Where did %s go?\"}, {\"role\": "
                             "\"assistant\", \"content\": \"%s went to the park %d times.\"}]}\n",
                      who[i % 5], who[(i + 2) % 5], i);
    const char *chat_path = t_write("kdchat.jsonl", chat.data, chat.len);
    nv_buf_free(&chat);
    snprintf(dir, sizeof dir, "%s/kdpack", t_tmpdir());
    snprintf(extra, sizeof extra, "--init-from %s --teacher %s --distill-alpha 1 --engine avx2 --teacher-engine avx2 --data %s --pack "
             "--seq 256", teacher, teacher, chat_path);
    train_args_from(args, sizeof args, dir, extra);
    T_CHECK(run_nerve(args, err, sizeof err) == 0, "packed chat: %s", err);
    const int nkp = read_field(dir, "\"distill_kl\":", kl, 64);
    T_CHECK(nkp > 0 && atof(kl[0]) < 1e-5, "a model distilled from itself starts at KL %s", nkp ? kl[0] : "-");
    /* refused: the flags without a teacher, a teacher of other tokens (another size; the same size,
       other pieces), a context shorter than --seq */
    nv_buf text = {0};
    uint32_t x = 9;
    for (int i = 0; i < 6000; i++) { /* words of random letters: enough pairs for 512 tokens */
        char w[9];
        const int n = 2 + i % 6;
        for (int k = 0; k < n; k++) x = x * 1664525u + 1013904223u, w[k] = (char)('a' + (x >> 24) % 26);
        w[n] = 0;
        nv_buf_printf(&text, "%s%s", w, i % 12 == 11 ? ".\n" : " ");
    }
    const char *txt = t_write("other.txt", text.data, text.len);
    nv_buf_free(&text);
    char other_tok[700], big[700], cmd[2000];
    snprintf(other_tok, sizeof other_tok, "%s/other512.bin", t_tmpdir());
    snprintf(big, sizeof big, "%s/big-vocab.bin", t_tmpdir());
    snprintf(cmd, sizeof cmd, "tokenizer train --vocab 512 %s -o %s", txt, other_tok);
    T_CHECK(t_nerve(cmd) == 0, "tokenizer train: %s", t_err);
    snprintf(cmd, sizeof cmd, "init --preset stories15M --seq-len 64 -o %s", big);
    T_CHECK(t_nerve(cmd) == 0, "init: %s", t_err);
    const char *gguf = t_data("gguf/tinyllamas-stories-260k-f32.gguf");
    char e0[800], e1[800], e2[800];
    snprintf(e1, sizeof e1, "--teacher %s", big);
    snprintf(e2, sizeof e2, "--teacher %s --seq 600 --context 1024", teacher);
    snprintf(e0, sizeof e0, "--teacher %s -z %s", gguf ? gguf : "x", other_tok);
    const struct {
        const char *extra, *why;
        int rc;
    } bad[4] = {{"--distill-alpha 0.3", "--distill-alpha goes with --teacher", 2},
                {e1, "has a vocabulary of 32000 tokens, the model 512", 1},
                {e2, "its context of 512 is shorter than --seq 600", 1},
                {e0, "tokenizer differs from the model's (token", 1}};
    for (int i = 0; i < 4; i++) {
        if (i == 3 && !gguf) break;
        snprintf(dir, sizeof dir, "%s/kdbad%d", t_tmpdir(), i);
        train_args(args, sizeof args, dir, bad[i].extra);
        const int rc = run_nerve(args, err, sizeof err);
        T_CHECK(rc == bad[i].rc && strstr(err, bad[i].why), "'%s': exit %d: %s", bad[i].extra, rc, err);
        char ck[800];
        snprintf(ck, sizeof ck, "%s/ckpt.bin", dir);
        T_CHECK(!nv_file_exists(ck), "'%s': a refused run wrote a checkpoint", bad[i].extra);
    }
}

static void test_bad_training_args(void) {
    char err[4096], args[4096];
    const char *bad[] = {"train --steps 0", "train --batch x", "train --preset nope", "train --dim 30 --layers 2",
                         "train --dim 32 --layers 1 --heads 5", "train --preset stories260K --qkv-bias",
                         "train --dim 32 --layers 1 --heads 4 --qk-norm --qkv-bias", "train --chat-template chatml",
                         "train --chat-template nope --data x.jsonl", "train --pack"};
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
    T_RUN(test_moe_run);
    T_RUN(test_ckpt_roundtrip_and_flags);
    T_RUN(test_recompute_run);
    T_RUN(test_corrupt_checkpoint_refused_and_kept);
    T_RUN(test_export_then_generate);
    T_RUN(test_qk_norm_run_writes_gguf);
    T_RUN(test_scaled_rope_finetune);
    T_RUN(test_finetune_stories260K_lowers_val_loss);
    T_RUN(test_val_data_files);
    T_RUN(test_save_best_and_early_stop);
    T_RUN(test_failed_saves);
    T_RUN(test_best_metric);
    T_RUN(test_token_accuracy_and_full_eval);
    T_RUN(test_trimmed_windows);
    T_RUN(test_time_budget);
    T_RUN(test_own_tokenizer);
    T_RUN(test_epochs);
    T_RUN(test_lr_schedule_flag);
    T_RUN(test_pretokenized_shard);
    T_RUN(test_samples_during_training);
    T_RUN(test_eval_choice_during_training);
    T_RUN(test_diverged_run_stops_and_keeps_good_weights);
    T_RUN(test_bad_training_args);
    T_RUN(test_distill_run);
    T_RUN(test_lora_run);
    T_RUN(test_save_every_and_lora_init);
    T_RUN(test_data_parallel_matches_one_process);
    T_RUN(test_chat_finetune_then_serve);
    T_RUN(test_prompt_completion_finetune);
    T_RUN(test_preference_finetune);
    return t_done();
}
