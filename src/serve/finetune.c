#include "serve/finetune.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#include "base/file.h"
#include "base/log.h"
#include "base/timer.h"
#include "train/train.h"

#define ID_LEN 30          /* "ftjob-" + 24 hex digits */
#define BASE_LR 1e-3       /* the LoRA learning rate a multiplier of 1 gives */
#define DEFAULT_RANK 8     /* the adapters' rank unless the job asks (nerve's hyperparameters.lora_rank) */
#define STOP_WAIT_S 60.0   /* a trainer asked to stop has this long to save its checkpoint */
#define QUIET_S 0.3        /* a held trainer goes on once the server has had no request this long */
#define POLL_S 0.05        /* how often the runner looks at the server and the trainer */
#define MAX_ARGS 48
#define FIRST_LINE_MAX (16 << 20) /* a training file's first example, read at create to tell its kind */
#define KILLED_RETRIES 2   /* a trainer killed outright, not by the server (the kernel, short of memory), goes on this often */
#define RETRY_WAIT_S 2.0   /* ... after this many seconds times the attempt: memory short a moment may be there again */
#define CKPT_EVERY 200     /* the trainer's checkpoints, steps apart (a stop saves one too): what a trainer killed outright loses */
#define CKPT_KEEP 2        /* earlier epochs' models served beside the final one (OpenAI keeps the last three epochs') */
#define CKPT_SUFFIX ":ckpt-step-"

enum { J_QUEUED, J_VALIDATING, J_RUNNING, J_SUCCEEDED, J_FAILED, J_CANCELLED, J_PAUSED, J_N };
static const char *const status_name[J_N] = {"queued", "validating_files", "running", "succeeded", "failed", "cancelled", "paused"};

typedef nv_rec job; /* its FineTuningJob object, and the record's own nerve_* fields */

struct nv_ftjobs {
    nv_files *files;
    nv_ftjobs_opts o;
    char *model_id, *model_path, *tok_path, *template_name, *unavailable; /* o's strings, owned */
    char template_file[4200]; /* the server's Jinja template, kept for the trainer ("": none) */
    char exe[4096];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    nv_recs r; /* the jobs */
    pthread_t thread;
    int started, stopping;
    char running[ID_LEN + 1]; /* the job training now, "" none (under mu) */
    int want_stop;            /* its trainer is to stop: the job was cancelled or paused (under mu) */
};

/* ---- the records ---------------------------------------------------------------------------------- */

static int status_of(const cJSON *o) { return nv_rec_status(o, status_name, J_N); }

static int ended(int st) { return st == J_SUCCEEDED || st == J_FAILED || st == J_CANCELLED; }

static void path_of(const nv_ftjobs *j, const char *id, const char *rest, char *out, size_t cap) {
    snprintf(out, cap, "%.4000s/%.40s%.60s", nv_files_dir(j->files), id, rest);
}

static int id_ok(const char *id) { return nv_id_well_formed(id, "ftjob-"); }

static job *get(nv_ftjobs *j, const char *id) { return id_ok(id) ? nv_recs_get(&j->r, id) : NULL; }

/* The base model a job adapts (one that continues a fine-tuned model names that one as its model). */
static const char *base_of(const cJSON *o) {
    const char *b = nv_rec_str(o, "nerve_base_model");
    return b[0] ? b : nv_rec_str(o, "model");
}

/* The models a job serves once it succeeded: its final one and up to CKPT_KEEP earlier epochs'. */
static int models_of(const cJSON *o) {
    const double epochs = nv_rec_num(cJSON_GetObjectItemCaseSensitive(o, "nerve_args"), "n_epochs");
    return 1 + (int)fmin(CKPT_KEEP, fmax(0, epochs - 1));
}

/* The models the jobs yet to end will serve (under mu). */
static int pending_models(const nv_ftjobs *j) {
    int pending = 0;
    for (int i = 0; i < j->r.n; i++) pending += ended(status_of(j->r.v[i].o)) ? 0 : models_of(j->r.v[i].o);
    return pending;
}

static int deleted(const cJSON *o) { return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "nerve_deleted")); }

/* The step of a record's earlier epoch's model ({step, model, ...}), -1 when the entry is not whole
   (a record edited by hand: it is then none of the job's models). */
static long checkpoint_step(const cJSON *c) {
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(c, "step"), *model = cJSON_GetObjectItemCaseSensitive(c, "model");
    if (!cJSON_IsNumber(step) || !(step->valuedouble >= 1 && step->valuedouble <= 1073741824.0) ||
        step->valuedouble != floor(step->valuedouble) || !cJSON_IsString(model) || !model->valuestring[0] ||
        strlen(model->valuestring) >= NV_ADAPTER_NAME_CAP)
        return -1;
    return (long)step->valuedouble;
}

/* DIR/ID.json (under mu). */
static nv_err save(nv_ftjobs *j, const job *x) {
    const nv_err e = nv_files_save_record(nv_files_dir(j->files), x->id, x->o, x->seq);
    if (e != NV_OK) nv_warn("serve: fine-tuning job %s: %s", x->id, nv_errmsg());
    return e;
}

static void set_status(nv_ftjobs *j, job *x, int st) {
    nv_rec_put(x->o, "status", cJSON_CreateString(status_name[st]));
    if (ended(st)) nv_rec_put(x->o, "finished_at", cJSON_CreateNumber((double)time(NULL)));
    if (st != J_RUNNING && st != J_VALIDATING) nv_rec_put(x->o, "estimated_finish", cJSON_CreateNull());
    save(j, x);
}

/* An event of job id appended to its events.jsonl: type "message" or "metrics" (data taken, may be NULL). */
static void event(nv_ftjobs *j, const char *id, const char *level, const char *type, cJSON *data, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static void event(nv_ftjobs *j, const char *id, const char *level, const char *type, cJSON *data, const char *fmt, ...) {
    char msg[1200], eid[64], path[4200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    nv_api_new_id(eid, sizeof eid, "ftevent-");
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "object", "fine_tuning.job.event");
    cJSON_AddStringToObject(e, "id", eid);
    cJSON_AddNumberToObject(e, "created_at", (double)time(NULL));
    cJSON_AddStringToObject(e, "level", level);
    cJSON_AddStringToObject(e, "message", msg);
    if (data) cJSON_AddItemToObject(e, "data", data);
    else cJSON_AddObjectToObject(e, "data");
    cJSON_AddStringToObject(e, "type", type);
    char *line = cJSON_PrintUnformatted(e);
    cJSON_Delete(e);
    path_of(j, id, ".run/events.jsonl", path, sizeof path);
    const int fd = line ? open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : -1;
    if (fd >= 0) {
        const size_t n = strlen(line);
        line[n] = '\n'; /* one write: a line is whole or absent */
        if (write(fd, line, n + 1) != (ssize_t)(n + 1)) nv_warn("serve: fine-tuning job %s: cannot write %s", id, path);
        close(fd);
    }
    free(line);
}

/* 1 when a DIR/ftjob-*.json's object is a job's whole record. */
static int valid(const cJSON *o, const char *id) {
    (void)id;
    return status_of(o) >= 0 && nv_rec_str(o, "model")[0] && nv_id_well_formed(nv_rec_str(o, "training_file"), "file-") &&
           cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(o, "nerve_args"));
}

/* 1 while process pid runs (an exited one its parent has not reaped, a zombie, does not). */
static int alive(pid_t pid) {
    const char st = nv_proc_state((int)pid);
    return st && st != 'Z';
}

/* The record forgets its trainer's process. */
static void forget_pid(job *x) {
    cJSON_DeleteItemFromObjectCaseSensitive(x->o, "nerve_pid");
    cJSON_DeleteItemFromObjectCaseSensitive(x->o, "nerve_pid_start");
}

/* A signal to the process pidfd holds (its pid when the kernel has no pidfds: -1). */
static void signal_trainer(int pidfd, pid_t pid, int sig) {
    if (pidfd >= 0) syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0);
    else kill(pid, sig);
}

/* A trainer of job x that a server killed outright left behind (its pid in the record, its command
   line naming the job's folder, ID.run/): continued, told to stop (it saves its checkpoint), waited for; the
   pid taken out of the record. */
static void stop_orphan(nv_ftjobs *j, job *x) {
    const cJSON *pid_item = cJSON_GetObjectItemCaseSensitive(x->o, "nerve_pid");
    if (!pid_item) return;
    const double pid_n = cJSON_IsNumber(pid_item) ? pid_item->valuedouble : 0;
    if (!(pid_n > 1 && pid_n < 4194304.0)) {
        forget_pid(x);
        save(j, x);
        return;
    }
    const pid_t pid = (pid_t)pid_n;
    /* the process is the trainer only when it started when that one did (a pid is reused), runs
       `nerve train` (argv[1]: not a `tail -f` of its log) and names the job's folder */
    const double start = nv_rec_num(x->o, "nerve_pid_start");
    char path[64], mark[64], cmd[16384];
    size_t n = 0;
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
    snprintf(mark, sizeof mark, "%s.run/", x->id); /* (however the folder was spelled: the job's own name) */
    /* a handle on this very process first: signals through it never reach a later one of its pid */
    const int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
    const int fd = open(path, O_RDONLY | O_CLOEXEC); /* (a /proc file says it is empty: read until it ends) */
    for (ssize_t got; fd >= 0 && n < sizeof cmd && (got = read(fd, cmd + n, sizeof cmd - n)) > 0;) n += (size_t)got;
    if (fd >= 0) close(fd);
    const char *arg1 = memchr(cmd, 0, n);
    const int trainer = arg1 && arg1 + 7 <= cmd + n && !memcmp(arg1 + 1, "train", 6) && memmem(cmd, n, mark, strlen(mark)) &&
                        (start <= 0 || (double)nv_proc_start_time((int)pid) == start);
    if (trainer) {
        nv_warn("serve: fine-tuning job %s: its trainer (pid %d) outlived the last server: stopping it", x->id, (int)pid);
        signal_trainer(pfd, pid, SIGCONT); /* (held when that server died) */
        signal_trainer(pfd, pid, SIGTERM);
        const double t0 = nv_now();
        while (alive(pid) && nv_now() - t0 < STOP_WAIT_S) usleep(20000);
        if (alive(pid)) signal_trainer(pfd, pid, SIGKILL);
        while (alive(pid) && nv_now() - t0 < STOP_WAIT_S + 5) usleep(20000);
    }
    if (pfd >= 0) close(pfd);
    forget_pid(x);
    save(j, x);
}

/* The folder in a job's run folder that holds the adapters of its model at step (0: the final one). */
static void model_dir(const nv_ftjobs *j, const char *id, long step, char *out, size_t cap) {
    char rest[64];
    if (step > 0) snprintf(rest, sizeof rest, ".run/run/step-%ld", step);
    else snprintf(rest, sizeof rest, ".run/run");
    path_of(j, id, rest, out, cap);
}

/* The adapters of a succeeded job's model at step (0: the final one) served as name. */
static nv_err serve_model(nv_ftjobs *j, const char *id, long step, const char *name) {
    char dir[4200], path[4300];
    model_dir(j, id, step, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/adapter.gguf", dir);
    return nv_adapters_add(j->o.adapters, j->o.model, name, path, 1.0f);
}

/* The files of a job's model at step > 0 (an earlier epoch's folder, step-N/) removed, with the folder. */
static void remove_step_model(const nv_ftjobs *j, const char *id, long step) {
    char run[4200];
    model_dir(j, id, 0, run, sizeof run);
    nv_train_remove_snapshot(run, step);
}

/* What an ended run of job id leaves beside its adapters and metrics: the checkpoint, a merged model
   (a whole model's size each, not needed to serve the adapters), the job's links to its data and to
   the adapters it started from, and unless it succeeded, its earlier epochs' models. */
static void drop_run_leftovers(const nv_ftjobs *j, const char *id, const char *jobdir, int succeeded) {
    static const char *const run_names[] = {"ckpt.bin", "model.bin", "model.gguf"},
                             *const data[] = {"train.jsonl", "validation.jsonl", "init-adapter.gguf"};
    char run[4300];
    snprintf(run, sizeof run, "%.4200s/run", jobdir);
    long steps[64];
    const int n = succeeded ? 0 : nv_train_snapshots(run, steps, 64);
    for (int i = 0; i < n; i++) remove_step_model(j, id, steps[i]);
    nv_remove_in_dir(run, run_names, sizeof run_names / sizeof *run_names); /* (the checkpoint last but one: a sign it is done) */
    nv_remove_in_dir(jobdir, data, sizeof data / sizeof *data);
}

/* At open: a succeeded job's models (the final one and its earlier epochs'), those not deleted. */
static void serve_job_models(nv_ftjobs *j, const job *x) {
    const char *final_name = nv_rec_str(x->o, "fine_tuned_model");
    if (!deleted(x->o) && serve_model(j, x->id, 0, final_name) != NV_OK)
        nv_warn("serve: fine-tuned model %s (job %s) is not served: %s", final_name, x->id, nv_errmsg());
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(x->o, "nerve_checkpoints")) {
        if (deleted(c)) continue;
        const long step = checkpoint_step(c);
        if (step <= 0 || serve_model(j, x->id, step, nv_rec_str(c, "model")) != NV_OK)
            nv_warn("serve: fine-tuned model %s (job %s) is not served: %s", nv_rec_str(c, "model"), x->id,
                    step <= 0 ? "its record of it is not whole" : nv_errmsg());
    }
}

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

nv_err nv_ftjobs_open(nv_ftjobs **out, nv_files *files, const nv_ftjobs_opts *o) {
    *out = NULL;
    nv_ftjobs *j = calloc(1, sizeof *j);
    if (!j) return nv_fail(NV_ENOMEM, "out of memory");
    j->files = files;
    j->o = *o;
    j->o.model_id = j->model_id = dup_or_null(o->model_id);
    j->o.model_path = j->model_path = dup_or_null(o->model_path);
    j->o.tok_path = j->tok_path = dup_or_null(o->tok_path);
    j->o.template_name = j->template_name = dup_or_null(o->template_name);
    j->o.unavailable = j->unavailable = dup_or_null(o->unavailable);
    pthread_mutex_init(&j->mu, NULL);
    pthread_condattr_t ca; /* the runner's waits are timed by the monotonic clock: a clock set back does not stall it */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    const ssize_t n = readlink("/proc/self/exe", j->exe, sizeof j->exe - 1);
    if (n <= 0 || (size_t)n >= sizeof j->exe - 1) {
        nv_ftjobs_close(j);
        return nv_fail(NV_EIO, "cannot find this program's file (/proc/self/exe) to run the trainer with");
    }
    j->exe[n] = 0;
    j->o.template_jinja = NULL;
    if (o->template_jinja) { /* the trainer renders the jobs' data as the server renders requests */
        snprintf(j->template_file, sizeof j->template_file, "%s/.chat_template.jinja", nv_files_dir(files));
        nv_iov part = {o->template_jinja, strlen(o->template_jinja)};
        if (nv_file_write_atomic(j->template_file, &part, 1) != NV_OK) {
            nv_ftjobs_close(j);
            return nv_fail(NV_EIO, "%s", nv_errmsg());
        }
    }
    const nv_err e = nv_recs_open(&j->r, nv_files_dir(files), id_ok, valid, "a fine-tuning job's");
    for (int i = 0; e == NV_OK && i < j->r.n; i++) {
        job *x = &j->r.v[i];
        stop_orphan(j, x);
        const int st = status_of(x->o);
        if (st == J_VALIDATING || st == J_RUNNING) { /* the server stopped it: it goes on from its checkpoint */
            set_status(j, x, J_QUEUED);
            event(j, x->id, "info", "message", NULL, "The server restarted: the job is queued to go on from its last checkpoint");
        } else if (st == J_SUCCEEDED && strcmp(base_of(x->o), j->o.model_id) != 0) {
            if (!deleted(x->o))
                nv_warn("serve: fine-tuned model %s (job %s) is not served: it adapts %s, and this server serves %s",
                        nv_rec_str(x->o, "fine_tuned_model"), x->id, base_of(x->o), j->o.model_id);
        } else if (st == J_SUCCEEDED) {
            serve_job_models(j, x);
        }
        if (ended(status_of(x->o)) && !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(x->o, "nerve_keep_run"))) {
            /* what an ended job no longer needs (a server stopped before it cleared them; a job whose
               adapters did not load keeps its run) */
            char jobdir[4200];
            path_of(j, x->id, ".run", jobdir, sizeof jobdir);
            drop_run_leftovers(j, x->id, jobdir, status_of(x->o) == J_SUCCEEDED);
        }
    }
    if (e != NV_OK) {
        nv_ftjobs_close(j);
        return e;
    }
    *out = j;
    return NV_OK;
}

/* ---- training a job ------------------------------------------------------------------------------ */

/* An argument list built in one buffer. */
typedef struct {
    char *buf, **argv;
    size_t cap, used;
    int argc, full;
} arg_list;

static void arg(arg_list *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void arg(arg_list *l, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int w = l->full ? -1 : vsnprintf(l->buf + l->used, l->cap - l->used, fmt, ap);
    va_end(ap);
    if (w < 0 || (size_t)w >= l->cap - l->used || l->argc >= MAX_ARGS - 1) {
        l->full = 1;
        return;
    }
    l->argv[l->argc++] = l->buf + l->used;
    l->argv[l->argc] = NULL;
    l->used += (size_t)w + 1;
}

/* nerve train's arguments for job x (under mu): into argv (their text in buf); their number, -1 when
   they do not fit. */
static int trainer_args(const nv_ftjobs *j, const job *x, const char *jobdir, char *buf, size_t cap, char **argv) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(x->o, "nerve_args");
    arg_list l = {.buf = buf, .argv = argv, .cap = cap};
    arg(&l, "%s", j->exe);
    arg(&l, "train");
    arg(&l, "--init-from");
    arg(&l, "%s", j->o.model_path);
    if (j->o.tok_path) {
        arg(&l, "-z");
        arg(&l, "%s", j->o.tok_path);
    }
    arg(&l, "--data");
    arg(&l, "%s/train.jsonl", jobdir);
    if (nv_rec_str(x->o, "validation_file")[0]) {
        arg(&l, "--val-data");
        arg(&l, "%s/validation.jsonl", jobdir);
        if (!(nv_rec_num(a, "beta") > 0)) arg(&l, "--full-eval"); /* full_valid_loss at each epoch's end (not pairs') */
    } else {
        arg(&l, "--val-frac");
        arg(&l, "0");
    }
    arg(&l, "--out");
    arg(&l, "%s/run", jobdir);
    if (j->template_file[0]) { /* the server's Jinja template, run as the server runs it */
        arg(&l, "--chat-template-file");
        arg(&l, "%s", j->template_file);
        arg(&l, "--jinja");
    } else {
        arg(&l, "--chat-template");
        arg(&l, "%s", j->o.template_name);
    }
    arg(&l, "--seq");
    arg(&l, "auto");
    arg(&l, "--no-merge"); /* the adapters are what the server loads */
    arg(&l, "--lora-rank");
    arg(&l, "%d", (int)nv_rec_num(a, "lora_rank"));
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "lora_init"))) { /* a fine-tuned model's adapters go on training */
        arg(&l, "--lora-init");
        arg(&l, "%s/init-adapter.gguf", jobdir);
    }
    arg(&l, "--epochs");
    arg(&l, "%d", (int)nv_rec_num(a, "n_epochs"));
    if (models_of(x->o) > 1) { /* the earlier epochs' models (step-N/), the last CKPT_KEEP of them */
        arg(&l, "--save-every");
        arg(&l, "epoch");
        arg(&l, "--save-limit");
        arg(&l, "%d", models_of(x->o) - 1);
    }
    arg(&l, "--batch");
    arg(&l, "%d", (int)nv_rec_num(a, "batch_windows"));
    arg(&l, "--lr");
    arg(&l, "%.9g", nv_rec_num(a, "lr"));
    arg(&l, "--seed");
    arg(&l, "%.0f", nv_rec_num(x->o, "seed"));
    if (nv_rec_num(a, "beta") > 0) {
        arg(&l, "--pref-loss");
        arg(&l, "dpo");
        arg(&l, "--pref-beta");
        arg(&l, "%.9g", nv_rec_num(a, "beta"));
    }
    if (j->o.threads > 0) {
        arg(&l, "--threads");
        arg(&l, "%d", j->o.threads);
    }
    arg(&l, "--ckpt-every");
    arg(&l, "%d", CKPT_EVERY);
    char ckpt[4200];
    snprintf(ckpt, sizeof ckpt, "%.4100s/run/ckpt.bin", jobdir);
    if (nv_file_exists(ckpt)) arg(&l, "--resume");
    return l.full ? -1 : l.argc;
}

/* The trainer's last error line in its log ("nerve train: ..."), or a word on how it ended: 1 when it
   said why itself. */
static int trainer_error(const char *log, int status, char *out, size_t cap) {
    if (WIFSIGNALED(status))
        snprintf(out, cap, "the trainer was stopped by signal %d%s", WTERMSIG(status),
                 WTERMSIG(status) == SIGKILL ? " (the kernel's, when memory runs out: a smaller batch or lora_rank, or shorter examples)" : "");
    else snprintf(out, cap, "the trainer failed (exit status %d%s)", WEXITSTATUS(status),
                  WEXITSTATUS(status) == 127 ? ": it could not be started" : "");
    FILE *f = fopen(log, "r");
    if (!f) return 0;
    char line[2048];
    int said = 0;
    while (fgets(line, sizeof line, f)) {
        const char *p = !strncmp(line, "nerve train: ", 13) ? line + 13 : !strncmp(line, "nerve: error: ", 14) ? line + 14 : NULL;
        if (!p || !*p) continue;
        snprintf(out, cap, "%.1000s", p);
        out[strcspn(out, "\n")] = 0;
        said = 1;
    }
    fclose(f);
    return said;
}

/* In msg, the job's copy of a data file (jobdir + name) named by the file's id, as the client knows it. */
static void name_data(char *msg, size_t cap, const char *jobdir, const char *name, const char *file_id) {
    char path[4300], out[1024];
    snprintf(path, sizeof path, "%.4200s%s", jobdir, name);
    const char *at = strstr(msg, path);
    if (!at || !*file_id) return;
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - msg), msg, file_id, at + strlen(path));
    snprintf(msg, cap, "%s", out);
}

/* A step's figures from the trainer's metrics.jsonl, NAN where it has none: the training loss and
   token accuracy, the last evaluation's, and the whole validation file's (--full-eval: at each epoch's
   end and the last step). */
typedef struct {
    double loss, acc, val, val_acc, full_val, full_acc;
} step_metrics;

#define NO_METRICS ((step_metrics){NAN, NAN, NAN, NAN, NAN, NAN})

static double num_or_nan(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* Line o's training figures into s; its evaluation's too, where it has one. */
static void step_metrics_of(const cJSON *o, step_metrics *s) {
    s->loss = num_or_nan(o, "loss"), s->acc = num_or_nan(o, "token_acc");
    s->full_val = num_or_nan(o, "full_val_loss"), s->full_acc = num_or_nan(o, "full_val_token_acc");
    if (!isnan(num_or_nan(o, "val_loss"))) s->val = num_or_nan(o, "val_loss"), s->val_acc = num_or_nan(o, "val_token_acc");
}

/* Under OpenAI's names, those s has, into d. */
static void add_step_metrics(cJSON *d, const step_metrics *s) {
    const struct {
        const char *name;
        double v;
    } f[] = {{"train_loss", s->loss},     {"train_mean_token_accuracy", s->acc}, {"valid_loss", s->val},
             {"valid_mean_token_accuracy", s->val_acc}, {"full_valid_loss", s->full_val}, {"full_valid_mean_token_accuracy", s->full_acc}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (isfinite(f[i].v)) cJSON_AddNumberToObject(d, f[i].name, f[i].v);
}

typedef struct {
    long off;  /* how far metrics.jsonl was read */
    long last; /* the last step reported */
    double tokens, total, elapsed;
    struct stat at_start; /* metrics.jsonl when this trainer started (an earlier run's), or st_nlink 0: none */
} metrics_read;

/* The trainer's new metrics lines (not under mu: the runner alone writes a running job's steps): an
 * event each (type metrics) for job id, a step told once. Returns 1 when the file holds a step's line
 * and this trainer has changed it since it started (a resumed one rewrites the earlier run's lines it
 * keeps, or adds its own; compared with the file as it was, not with a clock another machine may
 * keep): the job is running. Told before or not: a trainer started again from an earlier step trains. */
static int read_metrics(nv_ftjobs *j, const char *id, const char *path, metrics_read *m) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && st.st_size < m->off) m->off = 0; /* a resume cut it back: steps are compared */
    fseek(f, m->off, SEEK_SET);
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int seen = 0;
    while ((n = getline(&line, &cap, f)) > 0) {
        if (line[n - 1] != '\n') break; /* not whole yet */
        m->off += n;
        cJSON *o = cJSON_Parse(line);
        const long step = (long)nv_rec_num(o, "step");
        if (o && nv_rec_num(o, "total_steps") > 0) m->total = nv_rec_num(o, "total_steps"); /* (told or not) */
        seen |= o && step > 0;
        if (o && step > 0) /* the latest line's (a resumed run's lines go on from its checkpoint's step, told or not) */
            m->tokens = nv_rec_num(o, "tokens"), m->elapsed = nv_rec_num(o, "elapsed_s");
        if (o && step > m->last) {
            m->last = step;
            step_metrics s = NO_METRICS; /* this line's alone: an event tells a validation loss at its step */
            step_metrics_of(o, &s);
            cJSON *d = cJSON_CreateObject();
            cJSON_AddNumberToObject(d, "step", (double)step);
            add_step_metrics(d, &s);
            cJSON_AddNumberToObject(d, "total_steps", m->total);
            cJSON_AddNumberToObject(d, "learning_rate", nv_rec_num(o, "lr"));
            char tl[64] = "no answer token to learn", vl[64] = "", fl[64] = "";
            if (!isnan(s.loss)) snprintf(tl, sizeof tl, "training loss=%.4f", s.loss);
            if (!isnan(s.val)) snprintf(vl, sizeof vl, ", validation loss=%.4f", s.val);
            if (!isnan(s.full_val)) snprintf(fl, sizeof fl, ", full validation loss=%.4f", s.full_val);
            event(j, id, "info", "metrics", d, "Step %ld/%.0f: %s%s%s", step, m->total, tl, vl, fl);
        }
        cJSON_Delete(o);
    }
    free(line);
    /* (after the lines: one added meanwhile changed the file too) */
    const struct stat *was = &m->at_start;
    const int changed = fstat(fileno(f), &st) == 0 && (!was->st_nlink || st.st_ino != was->st_ino || st.st_dev != was->st_dev ||
                                                        st.st_size != was->st_size || st.st_mtim.tv_sec != was->st_mtim.tv_sec ||
                                                        st.st_mtim.tv_nsec != was->st_mtim.tv_nsec);
    fclose(f);
    return seen && changed;
}

/* The job's progress from m (under mu). */
static void show_progress(job *x, const metrics_read *m) {
    nv_rec_put(x->o, "trained_tokens", cJSON_CreateNumber(m->tokens));
    const double left = m->last > 0 ? m->elapsed / (double)m->last * (m->total - (double)m->last) : 0;
    nv_rec_put(x->o, "estimated_finish", cJSON_CreateNumber(floor((double)time(NULL) + (left > 0 ? left : 0))));
}

/* The step metrics as OpenAI's result file (a CSV), made a file of the store: its id, or "" . */
static void result_file(nv_ftjobs *j, const char *id, const char *metrics, char *file_id) {
    file_id[0] = 0;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%.4000s/.ftresult-%.40s", nv_files_dir(j->files), id);
    FILE *in = fopen(metrics, "r"), *out = fopen(tmp, "w");
    if (!in || !out) {
        if (in) fclose(in);
        if (out) fclose(out);
        return;
    }
    /* OpenAI's columns, then the whole validation file's figures and the learning rate; a figure the
       step has not is empty */
    fprintf(out, "step,train_loss,train_accuracy,valid_loss,valid_mean_token_accuracy,full_valid_loss,"
                 "full_valid_mean_token_accuracy,learning_rate\n");
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, in) > 0) {
        cJSON *o = cJSON_Parse(line);
        if (o && nv_rec_num(o, "step") > 0) {
            step_metrics s = NO_METRICS;
            step_metrics_of(o, &s);
            fprintf(out, "%.0f", nv_rec_num(o, "step"));
            const double col[] = {s.loss, s.acc, s.val, s.val_acc, s.full_val, s.full_acc, num_or_nan(o, "lr")};
            for (size_t i = 0; i < sizeof col / sizeof col[0]; i++) {
                if (isfinite(col[i])) fprintf(out, ",%.6g", col[i]);
                else fputc(',', out);
            }
            fputc('\n', out);
        }
        cJSON_Delete(o);
    }
    free(line);
    fclose(in);
    const int bad = fflush(out) != 0 || fsync(fileno(out)) != 0;
    if (fclose(out) != 0 || bad) {
        unlink(tmp);
        return;
    }
    nv_file_info fi;
    char name[80];
    snprintf(name, sizeof name, "%.40s_step_metrics.csv", id);
    if (nv_files_adopt(j->files, tmp, name, "fine-tune-results", 0, &fi) != NV_OK) {
        nv_warn("serve: fine-tuning job %s: its result file: %s", id, nv_errmsg());
        unlink(tmp);
        return;
    }
    snprintf(file_id, NV_FILE_ID_LEN + 1, "%s", fi.id);
}

/* A succeeded job's earlier epochs' models (its run's step-N/ folders, the last CKPT_KEEP) served as
   NAME:ckpt-step-N, those that load: their records ({step, model, created_at}), the newest first. */
static cJSON *serve_checkpoints(nv_ftjobs *j, const char *id, const char *name, const char *run) {
    long steps[64];
    const int n = nv_train_snapshots(run, steps, 64);
    cJSON *list = cJSON_CreateArray();
    for (int i = n - 1; i >= 0; i--) {
        char model[NV_ADAPTER_NAME_CAP + 32], dir[4200];
        snprintf(model, sizeof model, "%s" CKPT_SUFFIX "%ld", name, steps[i]);
        const int too_long = strlen(model) >= NV_ADAPTER_NAME_CAP;
        if (n - 1 - i >= CKPT_KEEP || too_long || serve_model(j, id, steps[i], model) != NV_OK) {
            if (n - 1 - i < CKPT_KEEP)
                nv_warn("serve: fine-tuning job %s: its model of step %ld is not served: %s", id, steps[i],
                        too_long ? "its name would be too long" : nv_errmsg());
            remove_step_model(j, id, steps[i]);
            continue;
        }
        struct stat st;
        model_dir(j, id, steps[i], dir, sizeof dir);
        cJSON *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "step", (double)steps[i]);
        cJSON_AddStringToObject(c, "model", model);
        cJSON_AddNumberToObject(c, "created_at", stat(dir, &st) == 0 ? (double)st.st_mtime : (double)time(NULL));
        cJSON_AddItemToArray(list, c);
    }
    return list;
}

/* The trainer's process for argv, its output to logfd: `nice` levels below the server's (at most 19), in a process group of its
   own (a terminal's Ctrl-C is the server's to pass on), stopped (SIGTERM: it saves its checkpoint)
   when the thread that started it ends (a server killed outright, held or not), its signals as a new
   process's, the first the kernel ends when memory runs out (oom_score_adj 1000). -1 when fork
   fails (errno). logfd and nullfd are above 2. */
static pid_t start_trainer(char **argv, int logfd, int nullfd, int nice) {
    const pid_t parent = getpid();
    /* nice levels below the server's, whatever its own (made here: only async-signal-safe calls after fork) */
    errno = 0;
    int own = getpriority(PRIO_PROCESS, 0);
    if (errno) own = 0;
    const int level = own + nice > 19 ? 19 : own + nice;
    /* the server's environment but what would make the trainer another program's: an MPI launcher's
       (it would join that job as a rank) and the server's API key */
    size_t n_env = 0;
    while (environ[n_env]) n_env++;
    char **env = malloc((n_env + 1) * sizeof *env);
    if (!env) return -1;
    size_t kept = 0;
    for (size_t i = 0; i < n_env; i++)
        if (strncmp(environ[i], "OMPI_", 5) && strncmp(environ[i], "PMIX_", 5) && strncmp(environ[i], "PMI_", 4) &&
            strncmp(environ[i], "NERVE_API_KEY=", 14))
            env[kept++] = environ[i];
    env[kept] = NULL;
    const pid_t pid = fork();
    if (pid != 0) {
        const int fork_errno = errno;
        free(env);
        errno = fork_errno; /* (the caller reports a failed fork's) */
        return pid;
    }
    /* the child: only calls safe after fork until exec */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGPIPE, &dfl, NULL);
    sigaction(SIGXFSZ, &dfl, NULL);
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigaction(SIGHUP, &ign, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    /* a process group of its own in the server's session: a terminal's Ctrl-C is not its, and when the
       server dies while it is held (SIGSTOP) the group is orphaned with a stopped member, so the kernel
       continues it (SIGCONT; the SIGHUP that comes with it ignored) and the death signal stops it */
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127); /* the server ended before the line above */
    setpriority(PRIO_PROCESS, 0, level);
    const int oom = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC); /* short of memory, the kernel ends it, not the server */
    if (oom >= 0) {
        if (write(oom, "1000", 4) != 4) { /* (left as it was) */
        }
        close(oom);
    }
    dup2(nullfd, 0);
    dup2(logfd, 1);
    dup2(logfd, 2);
    closefrom(3);
    execve("/proc/self/exe", argv, env); /* the server's own program, even when its file was replaced since */
    _exit(127);
}

/* fd moved above 0-2 (a server started with one of them closed would have had it given here), -1 stays. */
static int above_stdio(int fd) {
    if (fd < 0 || fd > 2) return fd;
    const int moved = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    close(fd);
    return moved;
}

/* Trains job id (not under mu) until its trainer exits, if it is still queued. */
static void process(nv_ftjobs *j, const char *id) {
    char jobdir[4200], run[4300], log[4300], metrics[4400], adapter[4400], args[16384], errmsg[1024] = "";
    char train_id[NV_FILE_ID_LEN + 1], val_id[NV_FILE_ID_LEN + 1];
    char *argv[MAX_ARGS];
    path_of(j, id, ".run", jobdir, sizeof jobdir);
    snprintf(run, sizeof run, "%s/run", jobdir);
    snprintf(log, sizeof log, "%s/train.log", jobdir);
    snprintf(metrics, sizeof metrics, "%.4200s/metrics.jsonl", run);
    snprintf(adapter, sizeof adapter, "%.4200s/adapter.gguf", run);
    const int resumed = nv_file_exists(metrics);
    char ckpt_path[4400];
    snprintf(ckpt_path, sizeof ckpt_path, "%.4200s/ckpt.bin", run);
    const int from_ckpt = nv_file_exists(ckpt_path);
    metrics_read m = {0};
    if (resumed) { /* the steps already told (a killed server may have missed some the trainer wrote) */
        char events[4400];
        path_of(j, id, ".run/events.jsonl", events, sizeof events);
        FILE *f = fopen(events, "r");
        char *line = NULL;
        size_t cap = 0;
        while (f && getline(&line, &cap, f) > 0) {
            cJSON *o = cJSON_Parse(line);
            const long step = (long)nv_rec_num(cJSON_GetObjectItemCaseSensitive(o, "data"), "step");
            if (!strcmp(nv_rec_str(o, "type"), "metrics") && step > m.last) m.last = step;
            cJSON_Delete(o);
        }
        free(line);
        if (f) fclose(f);
    }
    pthread_mutex_lock(&j->mu);
    job *x = get(j, id);
    if (!x || j->stopping || status_of(x->o) != J_QUEUED) { /* cancelled or paused since it was picked, or the server stops */
        pthread_mutex_unlock(&j->mu);
        return;
    }
    snprintf(train_id, sizeof train_id, "%s", nv_rec_str(x->o, "training_file"));
    snprintf(val_id, sizeof val_id, "%s", nv_rec_str(x->o, "validation_file"));
    const int argc = trainer_args(j, x, jobdir, args, sizeof args, argv);
    snprintf(j->running, sizeof j->running, "%s", id);
    j->want_stop = 0;
    set_status(j, x, J_VALIDATING);
    if (argc <= 0) snprintf(errmsg, sizeof errmsg, "the trainer's arguments do not fit");
    else if (resumed && from_ckpt) event(j, id, "info", "message", NULL, "Resuming the job from its last checkpoint");
    else if (resumed) event(j, id, "info", "message", NULL, "Starting the job again from its first step (no checkpoint was saved)");
    else event(j, id, "info", "message", NULL, "Validating training file: %s", train_id);
    pthread_mutex_unlock(&j->mu);
    const int logfd = errmsg[0] ? -1 : above_stdio(open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    const int nullfd = errmsg[0] ? -1 : above_stdio(open("/dev/null", O_RDONLY | O_CLOEXEC));
    pid_t pid = -1;
    if (!errmsg[0] && (logfd < 0 || nullfd < 0)) snprintf(errmsg, sizeof errmsg, "cannot open %.900s: %s", log, strerror(errno));
    if (stat(metrics, &m.at_start) != 0) m.at_start.st_nlink = 0;
    if (!errmsg[0] && (pid = start_trainer(argv, logfd, nullfd, j->o.nice)) < 0)
        snprintf(errmsg, sizeof errmsg, "cannot start the trainer: %s", strerror(errno));
    if (logfd >= 0) close(logfd);
    if (nullfd >= 0) close(nullfd);
    int status = 0, signalled = 0, held = 0;
    double signalled_at = 0, busy_at = 0;
    if (pid > 0) { /* a server killed outright: the next one finds its trainer by this */
        pthread_mutex_lock(&j->mu);
        x = get(j, id);
        nv_rec_put(x->o, "nerve_pid", cJSON_CreateNumber((double)pid));
        nv_rec_put(x->o, "nerve_pid_start", cJSON_CreateNumber((double)nv_proc_start_time((int)pid))); /* (the pid may be reused) */
        save(j, x);
        pthread_mutex_unlock(&j->mu);
    }
    int lost = 0; /* waitpid failed: how it ended is unknown, so it did not succeed */
    while (pid > 0) {
        const pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) {
            lost = 1;
            snprintf(errmsg, sizeof errmsg, "the trainer's end was not seen: %s", strerror(errno));
            break;
        }
        const int seen = read_metrics(j, id, metrics, &m); /* (file reads outside the lock) */
        const int busy = j->o.yield && j->o.busy && j->o.busy(j->o.busy_ctx);
        if (busy) busy_at = nv_now();
        pthread_mutex_lock(&j->mu);
        x = get(j, id);
        const int stop = j->want_stop || j->stopping;
        if (!signalled && busy && !stop && !held) kill(pid, SIGSTOP), held = 1; /* requests go first */
        else if (held && (stop || nv_now() - busy_at >= QUIET_S)) kill(pid, SIGCONT), held = 0;
        if (stop && !signalled) kill(pid, SIGTERM), signalled = 1, signalled_at = nv_now();
        else if (signalled && nv_now() - signalled_at > STOP_WAIT_S) kill(pid, SIGKILL); /* its last checkpoint stays */
        if (seen && (status_of(x->o) == J_VALIDATING || status_of(x->o) == J_RUNNING)) {
            show_progress(x, &m);
            if (status_of(x->o) == J_VALIDATING) {
                set_status(j, x, J_RUNNING);
                event(j, id, "info", "message", NULL, "Fine-tuning job started");
            }
        }
        struct timespec until; /* (woken early by a cancel, a pause or the server's stop) */
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += (long)(POLL_S * 1e9);
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        if (!(stop && !signalled)) pthread_cond_timedwait(&j->cv, &j->mu, &until);
        pthread_mutex_unlock(&j->mu);
    }
    read_metrics(j, id, metrics, &m);
    const int exited_ok = pid > 0 && !lost && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    const int finished = exited_ok && m.total > 0 && (double)m.last >= m.total && nv_file_exists(adapter);
    int said = 0; /* the trainer's own message: before its first step, most often about the data */
    if (!finished && !errmsg[0]) {
        if (exited_ok) snprintf(errmsg, sizeof errmsg, "the trainer stopped at step %ld of %.0f", m.last, m.total);
        else said = trainer_error(log, status, errmsg, sizeof errmsg);
        name_data(errmsg, sizeof errmsg, jobdir, "/train.jsonl", train_id);
        name_data(errmsg, sizeof errmsg, jobdir, "/validation.jsonl", val_id);
    }
    /* how it ends: a status the API gave it while it trained stands (cancelled; paused, or queued
       again by a resume: it goes on from its checkpoint); else succeeded when the trainer did all its
       steps, kept for the next start when the server stopped it, else failed */
    pthread_mutex_lock(&j->mu);
    x = get(j, id);
    const int now = status_of(x->o), by_api = now == J_CANCELLED || now == J_PAUSED || now == J_QUEUED;
    /* killed outright by another than the server (the kernel when memory runs out: the trainer goes
       first, oom_score_adj): queued to go on from its last checkpoint, a few times */
    const double tried = nv_rec_num(x->o, "nerve_retries");
    const int retries = tried >= 0 && tried <= KILLED_RETRIES ? (int)tried : KILLED_RETRIES; /* (a record edited by hand: no more) */
    int retry = !by_api && !finished && !j->stopping && pid > 0 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL &&
                      !signalled && retries < KILLED_RETRIES;
    int outcome = by_api ? (now == J_CANCELLED || !finished ? -1 : J_SUCCEEDED)
                  : finished ? J_SUCCEEDED
                  : j->stopping ? -1
                  : retry ? J_QUEUED
                          : J_FAILED;
    if (outcome == J_FAILED && retries > 0) {
        const size_t at = strlen(errmsg);
        snprintf(errmsg + at, sizeof errmsg - at, " (after it was started again %d time%s)", retries, retries == 1 ? "" : "s");
    }
    char name[NV_ADAPTER_NAME_CAP];
    snprintf(name, sizeof name, "%s", nv_rec_str(x->o, "nerve_fine_tuned_model"));
    pthread_mutex_unlock(&j->mu);
    char file_id[NV_FILE_ID_LEN + 1] = "";
    cJSON *ckpts = NULL;
    int load_failed = 0;
    if (outcome == J_SUCCEEDED) { /* the adapters load outside the lock (requests go on meanwhile) */
        if (serve_model(j, id, 0, name) != NV_OK) {
            /* the training is not thrown away: its run folder stays, the adapters in it */
            snprintf(errmsg, sizeof errmsg, "its adapters do not load: %.600s (they are kept: %.40s.run/run/adapter.gguf in the files' folder)",
                     nv_errmsg(), id);
            outcome = J_FAILED;
            load_failed = 1;
        } else {
            result_file(j, id, metrics, file_id);
            ckpts = serve_checkpoints(j, id, name, run);
        }
    }
    /* what the run no longer needs goes once its record says how it ended: a server stopped before
       that finds the checkpoint, resumes it (nothing left to train) and ends the job the same way */
    const int drop_run = outcome == J_SUCCEEDED || (outcome == J_FAILED && !load_failed) || now == J_CANCELLED,
              drop_succeeded = outcome == J_SUCCEEDED;
    if (getenv("NERVE_TEST_DIE_BEFORE_RECORD") && outcome == J_SUCCEEDED) _exit(3); /* (the tests' crash in that window) */
    pthread_mutex_lock(&j->mu);
    x = get(j, id);
    /* a cancel or pause the API answered between the two locks (the job still training then) stands,
       but for a job whose model is already served (that one succeeded) and, for a pause, one that
       failed (its data and checkpoint are gone: it could not go on) */
    const int late = status_of(x->o), late_cancel = late != now && late == J_CANCELLED && outcome != J_SUCCEEDED,
              late_pause = late != now && late == J_PAUSED && outcome != J_SUCCEEDED && outcome != J_FAILED;
    if (late_cancel || late_pause) outcome = -1, retry = 0;
    if (outcome == J_SUCCEEDED) {
        cJSON *files = cJSON_CreateArray();
        if (file_id[0]) cJSON_AddItemToArray(files, cJSON_CreateString(file_id));
        nv_rec_put(x->o, "result_files", files);
        nv_rec_put(x->o, "fine_tuned_model", cJSON_CreateString(name));
        for (int i = cJSON_GetArraySize(ckpts) - 1; i >= 0; i--) { /* (oldest first, as they were made) */
            const cJSON *c = cJSON_GetArrayItem(ckpts, i);
            event(j, id, "info", "message", NULL, "Checkpoint created at step %.0f: %s", nv_rec_num(c, "step"), nv_rec_str(c, "model"));
        }
        nv_rec_put(x->o, "nerve_checkpoints", ckpts);
        ckpts = NULL;
        event(j, id, "info", "message", NULL, "New fine-tuned model created: %s", name);
        event(j, id, "info", "message", NULL, "The job has successfully completed");
        nv_info("serve: fine-tuning job %s succeeded: serving %s", id, name);
    } else if (outcome == J_FAILED) {
        cJSON *err = cJSON_CreateObject();
        const int data = said && m.last == 0;
        cJSON_AddStringToObject(err, "code", data ? "invalid_training_file" : "training_failed");
        cJSON_AddStringToObject(err, "message", errmsg);
        if (data) cJSON_AddStringToObject(err, "param", "training_file");
        else cJSON_AddNullToObject(err, "param");
        nv_rec_put(x->o, "error", err);
        event(j, id, "error", "message", NULL, "The job failed: %s", errmsg);
        nv_warn("serve: fine-tuning job %s failed: %s", id, errmsg);
    } else if (now == J_PAUSED || now == J_QUEUED) {
        event(j, id, "info", "message", NULL, "The trainer stopped at step %ld, its checkpoint saved", m.last);
    } else if (retry) {
        nv_rec_put(x->o, "nerve_retries", cJSON_CreateNumber(retries + 1));
        event(j, id, "warn", "message", NULL,
              "The trainer was killed at step %ld (signal 9: the kernel's, when memory runs out): the job goes on from its last "
              "checkpoint (or its first step, when none was saved) in %.0f s (%d of %d times)",
              m.last, RETRY_WAIT_S * (retries + 1), retries + 1, KILLED_RETRIES);
        nv_warn("serve: fine-tuning job %s: its trainer was killed at step %ld: starting it again", id, m.last);
    }
    cJSON_Delete(ckpts);
    forget_pid(x);
    if (load_failed) nv_rec_put(x->o, "nerve_keep_run", cJSON_CreateTrue()); /* (its adapters are there) */
    if (outcome >= 0) set_status(j, x, outcome);
    else save(j, x);
    j->running[0] = 0; /* (a cancel or pause from here on finds the job no longer training) */
    pthread_cond_broadcast(&j->cv);
    /* a job going on after its trainer was killed waits first, queued (a cancel or pause meanwhile ends
       the wait; the jobs behind it wait too: one trains at a time) */
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += (time_t)(RETRY_WAIT_S * (retries + 1));
    while (retry && !j->stopping && (x = get(j, id)) && status_of(x->o) == J_QUEUED &&
           pthread_cond_timedwait(&j->cv, &j->mu, &deadline) != ETIMEDOUT) {
    }
    pthread_mutex_unlock(&j->mu);
    if (late_cancel || drop_run) drop_run_leftovers(j, id, jobdir, drop_succeeded && !late_cancel);
}

/* Under mu: the oldest queued job of the model this server serves (the others wait for a server of
   theirs), or -1; none while the model cannot be fine-tuned here. */
static int next_queued(const nv_ftjobs *j) {
    for (int i = 0; i < j->r.n && !j->o.unavailable; i++)
        if (status_of(j->r.v[i].o) == J_QUEUED && !strcmp(base_of(j->r.v[i].o), j->o.model_id)) return i;
    return -1;
}

static void *runner_main(void *arg) {
    nv_ftjobs *j = arg;
    pthread_mutex_lock(&j->mu);
    while (!j->stopping) {
        const int i = next_queued(j);
        if (i < 0) {
            pthread_cond_wait(&j->cv, &j->mu);
            continue;
        }
        char id[sizeof j->r.v->id];
        snprintf(id, sizeof id, "%s", j->r.v[i].id);
        pthread_mutex_unlock(&j->mu);
        process(j, id);
        pthread_mutex_lock(&j->mu);
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

nv_err nv_ftjobs_start(nv_ftjobs *j) {
    if (pthread_create(&j->thread, NULL, runner_main, j) != 0) return nv_fail(NV_ENOMEM, "cannot start the fine-tuning jobs' thread");
    j->started = 1;
    return NV_OK;
}

void nv_ftjobs_stop(nv_ftjobs *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    j->stopping = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

void nv_ftjobs_close(nv_ftjobs *j) {
    if (!j) return;
    if (j->started) {
        nv_ftjobs_stop(j);
        pthread_join(j->thread, NULL);
    }
    nv_recs_free(&j->r);
    free(j->model_id), free(j->model_path), free(j->tok_path), free(j->template_name), free(j->unavailable);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

int nv_ftjobs_counts(nv_ftjobs *j, const char **names, int *counts, int cap) {
    pthread_mutex_lock(&j->mu);
    const int n = nv_recs_count_status(&j->r, status_name, J_N, names, counts, cap);
    pthread_mutex_unlock(&j->mu);
    return n;
}

/* ---- the endpoints --------------------------------------------------------------------------------- */

static int answer(cJSON *o, char **out, nv_api_error *e) {
    *out = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return *out ? 0 : nv_api_oom(e);
}

static int bad(nv_api_error *e, const char *code, const char *param, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int bad(nv_api_error *e, const char *code, const char *param, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    nv_api_error_set(e, 400, "invalid_request_error", code, param, "%s", msg);
    return e->status;
}

static int not_found(const char *id, nv_api_error *e) {
    nv_api_error_set(e, 404, "invalid_request_error", "not_found", "fine_tuning_job_id", "No fine-tuning job found with id '%.100s'", id);
    return e->status;
}

/* The kinds of training data a file's first line shows. */
enum { DATA_CHAT, DATA_PREF };

/* File id (purpose fine-tune): its kind from its first line, its examples (lines that are not blank). */
static int data_file(nv_ftjobs *j, const char *id, const char *param, int *kind, long *examples, nv_api_error *e) {
    nv_file_info fi;
    if (!nv_files_get(j->files, id, &fi)) return bad(e, "invalid_request", param, "No file found with id '%.100s'", id);
    if (strcmp(fi.purpose, "fine-tune") != 0)
        return bad(e, "invalid_request", param, "The file %s must be uploaded with purpose \"fine-tune\" (it has \"%.32s\")", id, fi.purpose);
    const int fd = nv_files_open_content(j->files, id, NULL);
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (!f) {
        if (fd >= 0) close(fd);
        return bad(e, "invalid_request", param, "No file found with id '%.100s'", id);
    }
    /* lines with something on them counted in blocks, the first of them kept (at most FIRST_LINE_MAX: a
       file of one huge line must not take the server's memory) */
    nv_buf first = {0};
    char block[65536];
    size_t got;
    long lines = 0, no = 0, first_no = 0;
    int rc = 0, blank = 1, in_first = 0, at_start = 1;
    while (!rc && (got = fread(block, 1, sizeof block, f)) > 0) {
        for (size_t k = 0; k < got && !rc; k++) {
            const char c = block[k];
            if (at_start) no++, at_start = 0, blank = 1;
            if (blank && c != ' ' && c != '\t' && c != '\r' && c != '\n') {
                blank = 0;
                if (lines++ == 0) in_first = 1, first_no = no;
            }
            if (c == '\n') {
                at_start = 1;
                in_first = 0;
                continue;
            }
            if (in_first) { /* the rest of the line in this block, at once */
                const char *nl = memchr(block + k, '\n', got - k);
                const size_t run = nl ? (size_t)(nl - (block + k)) : got - k;
                if (first.len + run > FIRST_LINE_MAX)
                    rc = bad(e, "invalid_training_file", param, "The file %s, line %ld: an example longer than %d MiB", id, no,
                             FIRST_LINE_MAX >> 20);
                else
                    nv_buf_append(&first, block + k, run);
                k += run - 1; /* (the loop's k++ then reaches the newline, or the block's end) */
            }
        }
    }
    if (!rc && lines) { /* the first example says which kind the file is (the trainer checks every line) */
        cJSON *o = cJSON_ParseWithLength(first.data ? first.data : "", first.len);
        const int pref = cJSON_GetObjectItemCaseSensitive(o, "preferred_output") || cJSON_GetObjectItemCaseSensitive(o, "chosen");
        if (!cJSON_IsObject(o) || (!pref && !cJSON_GetObjectItemCaseSensitive(o, "messages") && !cJSON_GetObjectItemCaseSensitive(o, "prompt")))
            rc = bad(e, "invalid_training_file", param,
                     "The file %s, line %ld: not a fine-tuning example (a JSON object with \"messages\", or for dpo "
                     "\"input\", \"preferred_output\" and \"non_preferred_output\")",
                     id, first_no);
        *kind = pref ? DATA_PREF : DATA_CHAT;
        cJSON_Delete(o);
    }
    nv_buf_free(&first);
    fclose(f);
    if (!rc && !lines) rc = bad(e, "invalid_training_file", param, "The file %s holds no examples", id);
    *examples = lines;
    return rc;
}

/* A hyperparameter: "auto" (or absent: *out stays) or a number within lo..hi (an integer when integer). */
static int hyper(const cJSON *h, const char *key, double lo, double hi, int integer, double *out, nv_api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(h, key);
    if (!v || cJSON_IsNull(v) || (cJSON_IsString(v) && !strcmp(v->valuestring, "auto"))) return 0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi) || (integer && v->valuedouble != floor(v->valuedouble))) {
        char param[80];
        snprintf(param, sizeof param, "hyperparameters.%s", key);
        return bad(e, "invalid_request", param, "%s must be \"auto\" or %s from %g to %g", key, integer ? "an integer" : "a number", lo, hi);
    }
    *out = v->valuedouble;
    return 0;
}

/* The suffix: up to 64 of letters, digits, '-', '_' and '.'. */
static int suffix_ok(const char *s) {
    size_t n = 0;
    for (; s[n]; n++)
        if (n >= 64 || !((s[n] >= 'a' && s[n] <= 'z') || (s[n] >= 'A' && s[n] <= 'Z') || (s[n] >= '0' && s[n] <= '9') || s[n] == '-' ||
                         s[n] == '_' || s[n] == '.'))
            return 0;
    return 1;
}

/* The job as the API shows it (under mu). */
static cJSON *shown(const job *x) { return nv_rec_public(x->o); }

static cJSON *hyper_object(double epochs, double batch, double mult, double beta) {
    cJSON *h = cJSON_CreateObject();
    cJSON_AddNumberToObject(h, "batch_size", batch);
    cJSON_AddNumberToObject(h, "learning_rate_multiplier", mult);
    cJSON_AddNumberToObject(h, "n_epochs", epochs);
    if (beta > 0) cJSON_AddNumberToObject(h, "beta", beta);
    return h;
}

/* What a job reads, a hard link in its folder to the file from (copied where links are not): the
   uploaded data, and the adapters it goes on from. */
static nv_err link_data(const char *from, const char *jobdir, const char *name) {
    char to[4300];
    snprintf(to, sizeof to, "%s/%s", jobdir, name);
    if (link(from, to) == 0) return NV_OK;
    FILE *in = fopen(from, "rb"), *out = in ? fopen(to, "wb") : NULL; /* (a folder whose file system has no links) */
    char buf[1 << 16];
    size_t n;
    int bad = !in || !out;
    while (!bad && (n = fread(buf, 1, sizeof buf, in)) > 0) bad = fwrite(buf, 1, n, out) != n;
    bad |= in && ferror(in);
    if (in) fclose(in);
    if (out) bad |= fclose(out) != 0;
    if (bad) unlink(to);
    return bad ? nv_fail(NV_EIO, "cannot copy %s to %s", from, to) : NV_OK;
}

static job *owner(nv_ftjobs *j, const char *model, long *step, cJSON **entry);

/* A fine-tuned model of this server's base to go on from: the file of its adapters, their rank. */
static int parent_of(nv_ftjobs *j, const char *model, char *adapter, size_t cap, double *rank, nv_api_error *e) {
    long step = 0;
    cJSON *entry = NULL;
    pthread_mutex_lock(&j->mu);
    const job *x = owner(j, model, &step, &entry);
    const int ours = x && !strcmp(base_of(x->o), j->o.model_id), gone = x && deleted(entry);
    char dir[4200];
    if (ours && !gone) {
        model_dir(j, x->id, step, dir, sizeof dir);
        snprintf(adapter, cap, "%.4200s/adapter.gguf", dir);
        *rank = nv_rec_num(cJSON_GetObjectItemCaseSensitive(x->o, "nerve_args"), "lora_rank");
    }
    pthread_mutex_unlock(&j->mu);
    if (ours && !gone && !(*rank >= 1 && *rank <= j->o.adapters->max_rank && *rank == floor(*rank)))
        return bad(e, "model_not_available", "model", "Model %.200s's adapters (rank %g) cannot be trained on by this server (ranks 1 to %d)",
                   model, *rank, j->o.adapters->max_rank);
    if (ours && !gone && !nv_file_exists(adapter))
        return bad(e, "model_not_available", "model", "Model %.200s's adapters are missing from the job's folder", model);
    if (ours && !gone) return 0;
    return bad(e, "model_not_available", "model",
               gone ? "Model %.200s was deleted" : "Model %.200s is not available for fine-tuning: this server fine-tunes %.200s and the models fine-tuned from it",
               model, j->o.model_id);
}

int nv_ftjobs_create(nv_ftjobs *j, const char *body, size_t len, char **out, nv_api_error *e) {
    cJSON *req = cJSON_ParseWithLength(body, len);
    if (!cJSON_IsObject(req)) {
        cJSON_Delete(req);
        return bad(e, "invalid_request", NULL, "The body must be a JSON object: {\"model\", \"training_file\", ...}");
    }
    const cJSON *model = nv_api_field(req, "model"), *tf = nv_api_field(req, "training_file"), *vf = nv_api_field(req, "validation_file"),
                *hp = nv_api_field(req, "hyperparameters"), *method = nv_api_field(req, "method"), *suffix = nv_api_field(req, "suffix"),
                *seed = nv_api_field(req, "seed"), *meta = nv_api_field(req, "metadata"), *integ = nv_api_field(req, "integrations");
    const cJSON *mtype = method ? cJSON_GetObjectItemCaseSensitive(method, "type") : NULL;
    const char *type = cJSON_IsString(mtype) ? mtype->valuestring : "supervised";
    const int dpo = !strcmp(type, "dpo");
    const cJSON *mconf = method ? cJSON_GetObjectItemCaseSensitive(method, type) : NULL;
    const cJSON *mhp = mconf ? cJSON_GetObjectItemCaseSensitive(mconf, "hyperparameters") : NULL;
    int kind = DATA_CHAT, vkind = DATA_CHAT, rc = 0;
    long examples = 0, vexamples = 0;
    if (j->o.unavailable) rc = bad(e, "invalid_request", "model", "Fine-tuning is not available on this server: %s", j->o.unavailable);
    else if (!cJSON_IsString(model) || !*model->valuestring) rc = bad(e, "invalid_request", "model", "model (the model to fine-tune) is required");
    else if (!cJSON_IsString(tf)) rc = bad(e, "invalid_request", "training_file", "training_file (the id of a file uploaded with purpose \"fine-tune\") is required");
    else if (vf && !cJSON_IsNull(vf) && !cJSON_IsString(vf)) rc = bad(e, "invalid_request", "validation_file", "validation_file must be a file's id");
    else if (method && (!cJSON_IsObject(method) || (mtype && !cJSON_IsString(mtype))))
        rc = bad(e, "invalid_request", "method", "method must be an object {\"type\": \"supervised\" or \"dpo\", ...}");
    else if (strcmp(type, "supervised") != 0 && !dpo)
        rc = bad(e, "invalid_request", "method.type", "method.type %.40s is not supported here: supervised or dpo", type);
    else if ((mconf && !cJSON_IsObject(mconf)) || (mhp && !cJSON_IsObject(mhp)) || (hp && !cJSON_IsNull(hp) && !cJSON_IsObject(hp)))
        rc = bad(e, "invalid_request", mhp || mconf ? "method" : "hyperparameters", "hyperparameters must be an object");
    else if (hp && !cJSON_IsNull(hp) && mhp)
        rc = bad(e, "invalid_request", "hyperparameters", "Give the hyperparameters in method.%s.hyperparameters or in hyperparameters, not both", type);
    else if (suffix && !cJSON_IsNull(suffix) && (!cJSON_IsString(suffix) || !suffix_ok(suffix->valuestring)))
        rc = bad(e, "invalid_request", "suffix", "suffix must be up to 64 letters, digits, '-', '_' or '.'");
    else if (seed && !cJSON_IsNull(seed) && (!cJSON_IsNumber(seed) || seed->valuedouble < 0 || seed->valuedouble > 2147483647.0 ||
                                             seed->valuedouble != floor(seed->valuedouble)))
        rc = bad(e, "invalid_request", "seed", "seed must be an integer from 0 to 2147483647");
    else if (meta && !cJSON_IsNull(meta) && (!cJSON_IsObject(meta) || !nv_rec_metadata_ok(meta)))
        rc = bad(e, "invalid_request", "metadata", "metadata must be an object of at most 16 strings (keys up to 64 characters, values up to 512)");
    else if (integ && !cJSON_IsNull(integ) && (!cJSON_IsArray(integ) || cJSON_GetArraySize(integ) > 0))
        rc = bad(e, "invalid_request", "integrations", "integrations are not supported here");
    else if (!(rc = data_file(j, tf->valuestring, "training_file", &kind, &examples, e)) && cJSON_IsString(vf))
        rc = data_file(j, vf->valuestring, "validation_file", &vkind, &vexamples, e);
    /* a fine-tuned model (or an earlier epoch's) goes on training from its adapters */
    const int continues = !rc && strcmp(model->valuestring, j->o.model_id) != 0;
    char parent_adapter[4300] = "";
    double parent_rank = 0;
    if (continues) rc = parent_of(j, model->valuestring, parent_adapter, sizeof parent_adapter, &parent_rank, e);
    if (!rc && (kind == DATA_PREF) != dpo)
        rc = bad(e, "invalid_training_file", "training_file",
                 dpo ? "The dpo method trains on preference pairs ({\"input\", \"preferred_output\", \"non_preferred_output\"} a line); "
                       "%s holds other examples"
                     : "%s holds preference pairs: they train with method {\"type\": \"dpo\"}",
                 tf->valuestring);
    if (!rc && cJSON_IsString(vf) && vkind != kind)
        rc = bad(e, "invalid_validation_file", "validation_file", "The validation file's examples are not of the training file's kind");
    /* the hyperparameters, "auto" resolved as OpenAI's: 3 epochs, fewer for a large file, more for a small one */
    const cJSON *h = mhp ? mhp : hp;
    double epochs = 3, batch = 1, mult = 1, beta = dpo ? 0.1 : 0, rank = continues ? parent_rank : DEFAULT_RANK;
    if (examples * 3 < 100) epochs = fmin(25, floor(100.0 / (double)(examples ? examples : 1)));
    else if (examples * 3 > 25000) epochs = fmax(1, floor(25000.0 / (double)examples));
    batch = fmax(1, fmin(8, ceil(0.002 * (double)examples)));
    const int max_rank = j->o.adapters->max_rank;
    if (rank > max_rank && !continues) rank = max_rank;
    if (!rc && h && !cJSON_IsNull(h)) {
        for (const cJSON *it = h->child; !rc && it; it = it->next)
            if (strcmp(it->string, "n_epochs") && strcmp(it->string, "batch_size") && strcmp(it->string, "learning_rate_multiplier") &&
                strcmp(it->string, "lora_rank") && (!dpo || strcmp(it->string, "beta")))
                rc = bad(e, "invalid_request", "hyperparameters", "Unknown hyperparameter '%.60s' (n_epochs, batch_size, "
                                                                  "learning_rate_multiplier%s, and nerve's lora_rank)",
                         it->string, dpo ? ", beta" : "");
        if (!rc) rc = hyper(h, "n_epochs", 1, 50, 1, &epochs, e);
        if (!rc) rc = hyper(h, "batch_size", 1, 256, 1, &batch, e);
        if (!rc) rc = hyper(h, "learning_rate_multiplier", 1e-6, 10, 0, &mult, e);
        if (!rc && dpo) rc = hyper(h, "beta", 1e-6, 2, 0, &beta, e);
        if (!rc) rc = hyper(h, "lora_rank", 1, max_rank, 1, &rank, e);
    }
    if (!rc && continues && rank != parent_rank)
        rc = bad(e, "invalid_request", "hyperparameters.lora_rank", "%.200s's adapters are of rank %.0f: its lora_rank goes on as it is",
                 model->valuestring, parent_rank);
    char id[64], ft_name[NV_ADAPTER_NAME_CAP];
    nv_api_new_id(id, sizeof id, "ftjob-");
    const char *sfx = cJSON_IsString(suffix) ? suffix->valuestring : "";
    /* (with room for an earlier epoch's :ckpt-step-N) */
    const int name_len = snprintf(ft_name, sizeof ft_name, "ft:%s:local:%s:%.8s", j->o.model_id, sfx, id + 6);
    if (!rc && name_len + (epochs > 1 ? (int)strlen(CKPT_SUFFIX) + 10 : 0) >= (int)sizeof ft_name)
        rc = bad(e, "invalid_request", "suffix", "The fine-tuned model's name ft:%.60s:local:%.64s:ID%s would pass %d characters: a shorter suffix",
                 j->o.model_id, sfx, epochs > 1 ? CKPT_SUFFIX "N" : "", NV_ADAPTER_NAME_CAP - 1);
    if (rc) {
        cJSON_Delete(req);
        return rc;
    }
    unsigned seed_value;
    if (cJSON_IsNumber(seed)) seed_value = (unsigned)seed->valuedouble;
    else {
        char r[64];
        nv_api_new_id(r, sizeof r, "");
        seed_value = (unsigned)(strtoull(r + 16, NULL, 16) % 2147483647ull);
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "fine_tuning.job");
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "model", model->valuestring);
    cJSON_AddNumberToObject(o, "created_at", (double)time(NULL));
    cJSON_AddNullToObject(o, "finished_at");
    cJSON_AddNullToObject(o, "fine_tuned_model");
    cJSON_AddStringToObject(o, "organization_id", "local");
    cJSON_AddArrayToObject(o, "result_files");
    cJSON_AddStringToObject(o, "status", "queued");
    cJSON_AddStringToObject(o, "training_file", tf->valuestring);
    if (cJSON_IsString(vf)) cJSON_AddStringToObject(o, "validation_file", vf->valuestring);
    else cJSON_AddNullToObject(o, "validation_file");
    cJSON_AddItemToObject(o, "hyperparameters", hyper_object(epochs, batch, mult, beta));
    cJSON_AddNullToObject(o, "trained_tokens");
    cJSON_AddNullToObject(o, "error");
    cJSON_AddNumberToObject(o, "seed", seed_value);
    cJSON_AddNullToObject(o, "estimated_finish");
    cJSON_AddNullToObject(o, "integrations");
    if (cJSON_IsObject(meta)) cJSON_AddItemToObject(o, "metadata", cJSON_Duplicate(meta, 1));
    else cJSON_AddNullToObject(o, "metadata");
    if (sfx[0]) cJSON_AddStringToObject(o, "user_provided_suffix", sfx);
    else cJSON_AddNullToObject(o, "user_provided_suffix");
    cJSON *mo = cJSON_AddObjectToObject(o, "method");
    cJSON_AddStringToObject(mo, "type", dpo ? "dpo" : "supervised");
    cJSON_AddItemToObject(cJSON_AddObjectToObject(mo, dpo ? "dpo" : "supervised"), "hyperparameters", hyper_object(epochs, batch, mult, beta));
    cJSON *a = cJSON_AddObjectToObject(o, "nerve_args"); /* what the trainer is given */
    cJSON_AddNumberToObject(a, "n_epochs", epochs);
    cJSON_AddNumberToObject(a, "batch_windows", dpo ? 2 * batch : batch); /* nerve train counts a pair's two windows */
    cJSON_AddNumberToObject(a, "lr", BASE_LR * mult);
    cJSON_AddNumberToObject(a, "lora_rank", rank);
    if (dpo) cJSON_AddNumberToObject(a, "beta", beta);
    if (continues) cJSON_AddTrueToObject(a, "lora_init"); /* from the job folder's init-adapter.gguf */
    cJSON_AddStringToObject(o, "nerve_base_model", j->o.model_id);
    cJSON_AddStringToObject(o, "nerve_fine_tuned_model", ft_name); /* its name once it succeeds */
    cJSON_Delete(req);
    /* its folder and data before it is listed: a job is whole or absent */
    char jobdir[4200];
    path_of(j, id, ".run", jobdir, sizeof jobdir);
    char from[4200];
    nv_err err = mkdir(jobdir, 0755) == 0 ? NV_OK : nv_fail(NV_EIO, "cannot make %s: %s", jobdir, strerror(errno));
    snprintf(from, sizeof from, "%.4000s/%s", nv_files_dir(j->files), nv_rec_str(o, "training_file"));
    const char *data_gone = NULL; /* a training or validation file deleted since it was checked: the client's doing */
    if (err == NV_OK && (err = link_data(from, jobdir, "train.jsonl")) != NV_OK && !nv_file_exists(from)) data_gone = "training_file";
    snprintf(from, sizeof from, "%.4000s/%s", nv_files_dir(j->files), nv_rec_str(o, "validation_file"));
    if (err == NV_OK && nv_rec_str(o, "validation_file")[0] && (err = link_data(from, jobdir, "validation.jsonl")) != NV_OK &&
        !nv_file_exists(from))
        data_gone = "validation_file";
    int parent_gone = 0;
    if (err == NV_OK && parent_adapter[0] && (err = link_data(parent_adapter, jobdir, "init-adapter.gguf")) != NV_OK)
        parent_gone = !nv_file_exists(parent_adapter); /* (deleted since it was looked up; else the error as any) */
    pthread_mutex_lock(&j->mu);
    job tmp = {.o = o, .seq = j->r.next_seq};
    snprintf(tmp.id, sizeof tmp.id, "%.30s", id);
    /* room to serve its models once it succeeds: the adapters' places, less those of jobs yet to end
       (counted here, with the job added under the same lock: two creates at once cannot both take the last) */
    const int pending = models_of(o) + pending_models(j), live = nv_adapters_live_count(j->o.adapters);
    const int full = err == NV_OK && live + pending > NV_MAX_ADAPTERS;
    if (full) err = NV_EINVAL;
    if (err == NV_OK) event(j, id, "info", "message", NULL, "Created fine-tuning job: %s", id);
    if (err == NV_OK) err = save(j, &tmp);
    if (err == NV_OK) err = nv_recs_add(&j->r, id, o, tmp.seq);
    cJSON *copy = err == NV_OK ? shown(&tmp) : NULL;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (err != NV_OK) {
        const char *msg = nv_errmsg();
        char path[4200];
        path_of(j, id, ".json", path, sizeof path);
        unlink(path);
        static const char *const names[] = {"train.jsonl", "validation.jsonl", "init-adapter.gguf", "events.jsonl"};
        nv_remove_in_dir(jobdir, names, sizeof names / sizeof *names);
        rmdir(jobdir);
        const int models = models_of(o);
        char parent_name[NV_ADAPTER_NAME_CAP];
        snprintf(parent_name, sizeof parent_name, "%s", nv_rec_str(o, "model"));
        cJSON_Delete(o);
        if (parent_gone) return bad(e, "model_not_available", "model", "Model %.200s was deleted", parent_name);
        if (data_gone) return bad(e, "invalid_request", data_gone, "The job's %s was deleted while the job was created", data_gone);
        if (full)
            return bad(e, "invalid_request", NULL,
                       "The server serves %d models beside its base and the jobs yet to end will serve %d more (this one %d), of at "
                       "most %d: delete a fine-tuned model (DELETE /v1/models/{model}) first",
                       live, pending - models, models, NV_MAX_ADAPTERS);
        nv_api_error_set(e, 500, "server_error", NULL, NULL, "The fine-tuning job could not be saved: %s", msg);
        return e->status;
    }
    nv_info("serve: fine-tuning job %s queued: %.0f epochs of %ld examples, batch %.0f, LoRA rank %.0f", id, epochs, examples, batch, rank);
    return answer(copy, out, e);
}

int nv_ftjobs_get(nv_ftjobs *j, const char *id, char **out, nv_api_error *e) {
    pthread_mutex_lock(&j->mu);
    const job *x = get(j, id);
    cJSON *o = x ? shown(x) : NULL;
    pthread_mutex_unlock(&j->mu);
    return x ? answer(o, out, e) : not_found(id, e);
}

/* Whether job object o's metadata matches the filter: NULL any, JSON null none at all, else an object
   of strings each of which the job's metadata holds. */
static int metadata_matches(const cJSON *o, const cJSON *filter) {
    if (!filter) return 1;
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(o, "metadata");
    if (cJSON_IsNull(filter)) return !cJSON_IsObject(meta) || !meta->child;
    for (const cJSON *f = filter->child; f; f = f->next) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, f->string);
        if (!cJSON_IsString(v) || !cJSON_IsString(f) || strcmp(v->valuestring, f->valuestring) != 0) return 0;
    }
    return 1;
}

int nv_ftjobs_list(nv_ftjobs *j, int limit, const char *after, const cJSON *metadata, char **out, nv_api_error *e) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    pthread_mutex_lock(&j->mu);
    int hi = j->r.n - 1, kept = 0, more = 0;
    if (after) {
        const job *x = get(j, after);
        hi = x ? (int)(x - j->r.v) - 1 : -1;
    }
    for (; hi >= 0 && !more; hi--) {
        if (!metadata_matches(j->r.v[hi].o, metadata)) continue;
        if (kept++ < limit) cJSON_AddItemToArray(data, shown(&j->r.v[hi]));
        else more = 1;
    }
    pthread_mutex_unlock(&j->mu);
    cJSON_AddBoolToObject(o, "has_more", more);
    return answer(o, out, e);
}

int nv_ftjobs_act(nv_ftjobs *j, const char *id, const char *action, char **out, nv_api_error *e) {
    pthread_mutex_lock(&j->mu);
    job *x = get(j, id);
    if (!x) {
        pthread_mutex_unlock(&j->mu);
        return not_found(id, e);
    }
    const int st = status_of(x->o), training = !strcmp(j->running, id);
    const int cancel = !strcmp(action, "cancel"), pause = !strcmp(action, "pause");
    int rc = 0;
    if (cancel ? ended(st) : pause ? st != J_QUEUED && st != J_VALIDATING && st != J_RUNNING : st != J_PAUSED) {
        nv_api_error_set(e, 400, "invalid_request_error", "invalid_request", NULL, "The job %s is %s: it cannot be %s", id, status_name[st],
                         cancel ? "cancelled" : pause ? "paused" : "resumed");
        rc = e->status;
    } else { /* the status is the API's at once; a trainer running stops at its next step's end, saving its checkpoint */
        set_status(j, x, cancel ? J_CANCELLED : pause ? J_PAUSED : J_QUEUED);
        if (cancel) event(j, id, "info", "message", NULL, "The job was cancelled");
        else if (!pause) event(j, id, "info", "message", NULL, "The job was resumed: queued to go on from its last checkpoint");
        else event(j, id, "info", "message", NULL, "The job was paused");
        if (training && (cancel || pause)) j->want_stop = 1;
        pthread_cond_broadcast(&j->cv);
    }
    cJSON *o = rc ? NULL : shown(x);
    pthread_mutex_unlock(&j->mu);
    if (!rc && cancel && !training) { /* (one training is the runner's to clear once its trainer stopped) */
        char jobdir[4200];
        path_of(j, id, ".run", jobdir, sizeof jobdir);
        drop_run_leftovers(j, id, jobdir, 0);
    }
    return rc ? rc : answer(o, out, e);
}

int nv_ftjobs_events(nv_ftjobs *j, const char *id, int limit, const char *after, char **out, nv_api_error *e) {
    char path[4200];
    pthread_mutex_lock(&j->mu);
    const int known = get(j, id) != NULL;
    pthread_mutex_unlock(&j->mu);
    if (!known) return not_found(id, e);
    path_of(j, id, ".run/events.jsonl", path, sizeof path);
    /* newest first: the last limit + 1 events before the cursor (or of the whole file, without one)
       kept as the file is read, so a long run's events cost a page's memory, not the file's */
    const int ring_cap = limit + 1;
    cJSON **ring = calloc((size_t)ring_cap, sizeof *ring);
    if (!ring) return nv_api_oom(e);
    int head = 0, count = 0, found = !after;
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while (f && (n = getline(&line, &cap, f)) > 0) {
        if (line[n - 1] != '\n') break; /* torn */
        cJSON *ev = cJSON_Parse(line);
        if (!cJSON_IsObject(ev)) {
            cJSON_Delete(ev);
            continue;
        }
        if (after && !strcmp(nv_rec_str(ev, "id"), after)) {
            found = 1;
            cJSON_Delete(ev);
            break;
        }
        if (count == ring_cap) cJSON_Delete(ring[head]), head = (head + 1) % ring_cap, count--;
        ring[(head + count++) % ring_cap] = ev;
    }
    free(line);
    if (f) fclose(f);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    const int shown_n = !found ? 0 : count < limit ? count : limit; /* an unknown cursor: none */
    for (int k = 0; k < shown_n; k++) { /* from the newest */
        const int at = (head + count - 1 - k) % ring_cap;
        cJSON_AddItemToArray(data, ring[at]);
        ring[at] = NULL;
    }
    cJSON_AddBoolToObject(o, "has_more", found && count > limit);
    for (int k = 0; k < ring_cap; k++) cJSON_Delete(ring[k]);
    free(ring);
    return answer(o, out, e);
}

#define MAX_LISTED 16 /* a job's models the checkpoints list shows at most (its final one and CKPT_KEEP earlier ones) */

typedef struct {
    long step;         /* its step (the final model: the last) */
    char model[NV_ADAPTER_NAME_CAP];
    double created_at;
    long at;           /* the last step of metrics.jsonl up to it (its own) */
    step_metrics m;    /* that step's figures, with the last evaluation's up to it */
} listed_model;

/* The figures of each listed model's step from the run's metrics.jsonl, read once. */
static void models_metrics(const char *path, listed_model *v, int n) {
    FILE *f = n > 0 ? fopen(path, "r") : NULL;
    char *line = NULL;
    size_t cap = 0;
    for (int i = 0; i < n; i++) v[i].at = 0, v[i].m = NO_METRICS;
    while (f && getline(&line, &cap, f) > 0) {
        cJSON *o = cJSON_Parse(line);
        const long at = (long)nv_rec_num(o, "step");
        for (int i = 0; o && at > 0 && i < n; i++) /* (step 0's evaluation is the base model's) */
            if (at <= v[i].step && at >= v[i].at) {
                v[i].at = at;
                step_metrics_of(o, &v[i].m); /* the step's own figures, the last evaluation's up to it */
            }
        cJSON_Delete(o);
    }
    free(line);
    if (f) fclose(f);
}

int nv_ftjobs_checkpoints(nv_ftjobs *j, const char *id, int limit, const char *after, char **out, nv_api_error *e) {
    pthread_mutex_lock(&j->mu);
    const job *x = get(j, id);
    if (!x) {
        pthread_mutex_unlock(&j->mu);
        return not_found(id, e);
    }
    /* a succeeded job's models not deleted, the newest first: the final one, then the earlier epochs' */
    listed_model v[MAX_LISTED];
    int n = 0;
    if (status_of(x->o) == J_SUCCEEDED && !deleted(x->o)) {
        v[n] = (listed_model){.step = 1L << 40, .created_at = nv_rec_num(x->o, "finished_at")};
        snprintf(v[n++].model, sizeof v->model, "%s", nv_rec_str(x->o, "fine_tuned_model"));
    }
    const cJSON *c, *earlier = status_of(x->o) == J_SUCCEEDED ? cJSON_GetObjectItemCaseSensitive(x->o, "nerve_checkpoints") : NULL;
    cJSON_ArrayForEach(c, earlier) { /* (a record edited by hand past MAX_LISTED: the first of them) */
        const long step = checkpoint_step(c);
        if (deleted(c) || step <= 0 || n == MAX_LISTED) continue;
        v[n] = (listed_model){.step = step, .created_at = nv_rec_num(c, "created_at")};
        snprintf(v[n++].model, sizeof v->model, "%s", nv_rec_str(c, "model"));
    }
    pthread_mutex_unlock(&j->mu);
    char path[4200];
    path_of(j, id, ".run/run/metrics.jsonl", path, sizeof path);
    models_metrics(path, v, n);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    char first[80] = "", last[80] = "";
    int i = 0, past = !after; /* past the cursor: listed from there; an unknown one: none */
    for (int kept = 0; i < n && kept < limit; i++) {
        char cid[80];
        if (i == 0 && v[0].step == 1L << 40) snprintf(cid, sizeof cid, "ftckpt_%s", id + 6);
        else snprintf(cid, sizeof cid, "ftckpt_%s_%ld", id + 6, v[i].step);
        if (!past) {
            past = !strcmp(cid, after);
            continue;
        }
        cJSON *ck = cJSON_CreateObject();
        cJSON_AddStringToObject(ck, "object", "fine_tuning.job.checkpoint");
        cJSON_AddStringToObject(ck, "id", cid);
        cJSON_AddNumberToObject(ck, "created_at", v[i].created_at);
        cJSON_AddStringToObject(ck, "fine_tuned_model_checkpoint", v[i].model);
        cJSON_AddNumberToObject(ck, "step_number", (double)v[i].at);
        cJSON *mm = cJSON_AddObjectToObject(ck, "metrics");
        cJSON_AddNumberToObject(mm, "step", (double)v[i].at);
        add_step_metrics(mm, &v[i].m);
        cJSON_AddStringToObject(ck, "fine_tuning_job_id", id);
        cJSON_AddItemToArray(data, ck);
        if (!kept++) snprintf(first, sizeof first, "%s", cid);
        snprintf(last, sizeof last, "%s", cid);
    }
    if (first[0]) cJSON_AddStringToObject(o, "first_id", first), cJSON_AddStringToObject(o, "last_id", last);
    else cJSON_AddNullToObject(o, "first_id"), cJSON_AddNullToObject(o, "last_id");
    cJSON_AddBoolToObject(o, "has_more", past && i < n);
    return answer(o, out, e);
}

/* Under mu: the succeeded job whose model (deleted or not) is called model: its final one (*step 0,
   *entry its record) or an earlier epoch's (*step its step, *entry its record in nerve_checkpoints);
   else NULL. */
static job *owner(nv_ftjobs *j, const char *model, long *step, cJSON **entry) {
    for (int i = 0; i < j->r.n; i++) {
        job *x = &j->r.v[i];
        if (status_of(x->o) != J_SUCCEEDED) continue;
        if (!strcmp(nv_rec_str(x->o, "fine_tuned_model"), model)) {
            *step = 0, *entry = x->o;
            return x;
        }
        cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(x->o, "nerve_checkpoints")) {
            const long at = checkpoint_step(c);
            if (at > 0 && !strcmp(nv_rec_str(c, "model"), model)) {
                *step = at, *entry = c;
                return x;
            }
        }
    }
    return NULL;
}

int nv_ftjobs_owns(nv_ftjobs *j, const char *model) {
    long step;
    cJSON *entry;
    pthread_mutex_lock(&j->mu);
    const int yes = owner(j, model, &step, &entry) != NULL;
    pthread_mutex_unlock(&j->mu);
    return yes;
}

int nv_ftjobs_pending_models(nv_ftjobs *j) {
    pthread_mutex_lock(&j->mu);
    const int pending = pending_models(j);
    pthread_mutex_unlock(&j->mu);
    return pending;
}

int nv_ftjobs_reserves(nv_ftjobs *j, const char *name) {
    pthread_mutex_lock(&j->mu);
    int yes = 0;
    for (int i = 0; i < j->r.n && !yes; i++) {
        const cJSON *o = j->r.v[i].o;
        const int st = status_of(o);
        if (st == J_FAILED || st == J_CANCELLED) continue; /* (a deleted model's name stays its job's: its checkpoints may be served) */
        const char *own = nv_rec_str(o, "nerve_fine_tuned_model");
        const size_t n = strlen(own);
        yes = n && !strncmp(name, own, n) && (!name[n] || !strncmp(name + n, CKPT_SUFFIX, strlen(CKPT_SUFFIX)));
    }
    pthread_mutex_unlock(&j->mu);
    return yes;
}

int nv_ftjobs_delete_model(nv_ftjobs *j, const char *model, char **out, nv_api_error *e) {
    long step = 0;
    cJSON *entry = NULL;
    pthread_mutex_lock(&j->mu);
    job *x = owner(j, model, &step, &entry);
    if (!x || deleted(entry)) {
        pthread_mutex_unlock(&j->mu);
        nv_api_error_set(e, 404, "invalid_request_error", "model_not_found", "model", "The model '%.200s' does not exist", model);
        return e->status;
    }
    nv_rec_put(entry, "nerve_deleted", cJSON_CreateTrue());
    save(j, x);
    char run[4200], id[sizeof x->id];
    snprintf(id, sizeof id, "%s", x->id);
    path_of(j, id, ".run/run", run, sizeof run);
    event(j, id, "info", "message", NULL, "The fine-tuned model %s was deleted", model);
    pthread_mutex_unlock(&j->mu);
    nv_adapters_remove(j->o.adapters, model); /* (freed when its last request ends) */
    static const char *const names[] = {"adapter.gguf", "adapter_model.safetensors", "adapter_config.json"};
    if (step > 0) remove_step_model(j, id, step); /* (owner gives a positive step for an earlier epoch's model alone) */
    else nv_remove_in_dir(run, names, sizeof names / sizeof *names);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", model);
    cJSON_AddStringToObject(o, "object", "model");
    cJSON_AddBoolToObject(o, "deleted", 1);
    return answer(o, out, e);
}
