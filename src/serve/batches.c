#include "serve/batches.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log.h"
#include "serve/batchrun.h"

#define ID_LEN 33       /* "batch_" or (Anthropic's) "msgbatch_", + 24 hex digits */
#define MAX_ERRORS 100  /* a failed validation lists this many bad lines */
#define WINDOW_S 86400L /* completion_window "24h" */

enum { B_VALIDATING, B_FAILED, B_IN_PROGRESS, B_FINALIZING, B_COMPLETED, B_EXPIRED, B_CANCELLING, B_CANCELLED, B_N };
static const char *const status_name[B_N] = {"validating", "failed",  "in_progress", "finalizing",
                                             "completed",  "expired", "cancelling",  "cancelled"};
/* the time field each status sets when it begins */
static const char *const status_at[B_N] = {NULL, "failed_at", "in_progress_at", "finalizing_at",
                                           "completed_at", "expired_at", "cancelling_at", "cancelled_at"};

/* A batch is an nv_rec: its Batch object; held: it could not go on (its answers so far unreadable, a
   file not writable, memory): it waits for the next start rather than being tried again at once. */
typedef nv_rec batch;

struct nv_batches {
    nv_files *files;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    nv_recs r; /* the batches */
    pthread_t thread;
    int started;
    int port, workers;
    float timeout_s;
    char key[128];
    atomic_int stopping;  /* nv_batches_stop's level */
    nv_batch_runner *run; /* the batch running now, and its id (under mu) */
    char running[ID_LEN + 1];
    atomic_int run_completed, run_failed; /* its counts as they come */
};

/* ---- the records ------------------------------------------------------------------------------------ */

static int status_of(const cJSON *o) { return nv_rec_status(o, status_name, B_N); }

static int ended(int st) { return st == B_FAILED || st == B_COMPLETED || st == B_EXPIRED || st == B_CANCELLED; }


static void set_status(cJSON *o, int st) {
    nv_rec_put(o, "status", cJSON_CreateString(status_name[st]));
    if (status_at[st]) nv_rec_put(o, status_at[st], cJSON_CreateNumber((double)time(NULL)));
}

static void set_counts(cJSON *o, int total, int completed, int failed) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "total", total);
    cJSON_AddNumberToObject(c, "completed", completed);
    cJSON_AddNumberToObject(c, "failed", failed);
    nv_rec_put(o, "request_counts", c);
}

static void path_of(const char *dir, const char *id, const char *ext, char *out, size_t cap) {
    snprintf(out, cap, "%.4096s/%.40s%.20s", dir, id, ext);
}

/* DIR/ID.json: the object and its order (under mu). */
static nv_err save(nv_batches *b, const batch *x) {
    const nv_err e = nv_files_save_record(nv_files_dir(b->files), x->id, x->o, x->seq);
    if (e != NV_OK) nv_warn("serve: batch %s: %s", x->id, nv_errmsg());
    return e;
}

/* 1 when id is one of ours: OpenAI's batch_, Anthropic's msgbatch_ (the same records; Anthropic's
   hold their requests in DIR/ID.input.jsonl, not in a file of the store, and "nerve_kind"). */
static int id_ok(const char *id) { return nv_id_well_formed(id, "batch_") || nv_id_well_formed(id, "msgbatch_"); }

static int anthropic_of(const cJSON *o) { return !strcmp(nv_rec_str(o, "nerve_kind"), "anthropic"); }

/* 1 when a DIR/batch_*.json's object is a batch's whole record. */
static int valid(const cJSON *o, const char *id) {
    (void)id;
    return status_of(o) >= 0 && (anthropic_of(o) || nv_id_well_formed(nv_rec_str(o, "input_file_id"), "file-")) &&
           nv_rec_str(o, "endpoint")[0] && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "created_at")) &&
           cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "expires_at")) &&
           cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(o, "request_counts"));
}

/* The bytes of an Anthropic batch's requests (DIR/ID.input.jsonl; 0 when none). */
static uint64_t input_bytes(const char *dir, const char *id) {
    char path[4200];
    struct stat st;
    path_of(dir, id, ".input.jsonl", path, sizeof path);
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
}

nv_err nv_batches_open(nv_batches **out, nv_files *files) {
    *out = NULL;
    nv_batches *b = calloc(1, sizeof *b);
    if (!b) return nv_fail(NV_ENOMEM, "out of memory");
    b->files = files;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    const nv_err e = nv_recs_open(&b->r, nv_files_dir(files), id_ok, valid, "a batch's");
    if (e != NV_OK) {
        nv_batches_close(b);
        return e;
    }
    /* Anthropic's batches' requests count against the files' limit, as the files do */
    for (int i = 0; i < b->r.n; i++) nv_files_hold(files, input_bytes(nv_files_dir(files), b->r.v[i].id));
    *out = b;
    return NV_OK;
}

/* ---- running a batch ---------------------------------------------------------------------------- */

typedef struct {
    nv_batches *b;
    nv_batch_runner run;
    FILE *out, *err; /* the partials, appended to */
    char *answered;  /* [set.n] */
    long expires_at;
    int expired, write_error;
} run_ctx;

static void on_result(void *ctx, int k, char *line, int status, int ok, const double usage[2]) {
    (void)usage;
    run_ctx *r = ctx;
    nv_batches *b = r->b;
    /* cut by the server's own shutdown: not an answer; it runs again at the next start */
    if (atomic_load(&b->stopping) && (status == 0 || status == 503 || status == 429)) {
        free(line);
        return;
    }
    FILE *f = ok ? r->out : r->err;
    if (!r->write_error && (fprintf(f, "%s\n", line) < 0 || fflush(f) != 0)) r->write_error = errno ? errno : EIO;
    free(line);
    r->answered[r->run.todo[k]] = 1;
    atomic_fetch_add(ok ? &b->run_completed : &b->run_failed, 1);
    if (time(NULL) > r->expires_at && !r->expired) {
        r->expired = 1;
        nv_batch_run_stop(&r->run, 1);
    }
}

/* What reading a batch's lines collects: the bad ones as OpenAI's {code, message, param, line}. */
typedef struct {
    nv_batch_set *set;
    const char *endpoint; /* OpenAI's: each line's url; NULL: Anthropic's lines */
    cJSON *errors;
    int n_bad;
} check_ctx;

static void add_error(cJSON *errors, const char *code, const char *msg, int line) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "code", code);
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddNullToObject(e, "param");
    if (line > 0) cJSON_AddNumberToObject(e, "line", line);
    else cJSON_AddNullToObject(e, "line");
    cJSON_AddItemToArray(errors, e);
}

static int check_line(void *ctx, char *line, int no) {
    check_ctx *c = ctx;
    const int before = c->set->n;
    const nv_err e = nv_batch_add_line(c->set, line, no);
    const char *code = "invalid_request", *msg = nv_errmsg();
    char why[400];
    if (e == NV_ENOMEM) return -1;
    if (e == NV_OK && c->set->reqs[before].anthropic != !c->endpoint)
        code = "invalid_request", msg = c->endpoint ? "an Anthropic Message Batches line: /v1/batches runs OpenAI's batch lines"
                                                    : "not an Anthropic Message Batches request";
    else if (e == NV_OK && c->endpoint && strcmp(c->set->reqs[before].url, c->endpoint) != 0) {
        snprintf(why, sizeof why, "the url %.100s is not the batch's endpoint %.40s", c->set->reqs[before].url, c->endpoint);
        code = "mismatched_endpoint", msg = why;
    } else if (e == NV_OK)
        return 0;
    if (++c->n_bad <= MAX_ERRORS) add_error(c->errors, code, msg, no);
    return 0;
}

/* The batch's requests into set: OpenAI's from the store's file_id, each line's url endpoint;
   Anthropic's (endpoint NULL) from DIR/ID.input.jsonl. */
static int read_input(nv_batches *b, const char *id, const char *file_id, const char *endpoint, nv_batch_set *set, cJSON *errors) {
    nv_file_info fi = {0};
    int fd;
    if (endpoint) {
        fd = nv_files_open_content(b->files, file_id, &fi);
    } else {
        char path[4200];
        struct stat st;
        path_of(nv_files_dir(b->files), id, ".input.jsonl", path, sizeof path);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0 && fstat(fd, &st) == 0) fi.bytes = st.st_size;
    }
    if (fd < 0) {
        add_error(errors, "invalid_file", "the input file is no longer on the server", 0);
        return -1;
    }
    char *text = malloc((size_t)fi.bytes + 1);
    size_t got = 0;
    while (text && got < (size_t)fi.bytes) {
        const ssize_t r = read(fd, text + got, (size_t)fi.bytes - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (!text || got != (size_t)fi.bytes) {
        free(text);
        add_error(errors, "invalid_file", text ? "the input file could not be read whole" : "out of memory", 0);
        return -1;
    }
    text[got] = '\0';
    if (memchr(text, '\0', got)) {
        free(text);
        add_error(errors, "invalid_file", "the input file holds a NUL byte: it is not JSON Lines", 0);
        return -1;
    }
    check_ctx c = {.set = set, .endpoint = endpoint, .errors = errors};
    const int rc = nv_batch_for_lines(text, check_line, &c);
    free(text);
    if (rc) {
        add_error(errors, "server_error", "out of memory", 0);
        return -1;
    }
    if (c.n_bad > MAX_ERRORS) {
        char msg[96];
        snprintf(msg, sizeof msg, "and %d more bad lines", c.n_bad - MAX_ERRORS);
        add_error(errors, "invalid_request", msg, 0);
    }
    if (!c.n_bad && !set->n) add_error(errors, "empty_file", "the input file holds no requests", 0);
    return c.n_bad || !set->n ? -1 : 0;
}

/* Keeps the whole lines of partial path that answer requests of set not yet answered (marking
 * them), dropping a torn or repeated one; the file written back when a line went. Returns the
 * lines kept, or -1 when the file cannot be rewritten. */
typedef struct {
    const nv_batch_set *set;
    char *answered;
    nv_buf kept;
    int n, dropped;
} partial_ctx;

static int partial_line(void *ctx, char *line, int no) {
    (void)no;
    partial_ctx *p = ctx;
    int at, ok;
    if (nv_batch_output_line(p->set, line, &at, &ok) != NV_OK || p->answered[at]) {
        p->dropped++;
        return 0;
    }
    p->answered[at] = 1, p->n++;
    nv_buf_append(&p->kept, line, strlen(line));
    nv_buf_append(&p->kept, "\n", 1);
    return 0;
}

static int keep_partial(const char *path, const nv_batch_set *set, char *answered) {
    char *text = NULL;
    size_t len;
    if (!nv_file_exists(path)) return 0;
    if (nv_file_read_all(path, &text, &len) != NV_OK) return -1;
    partial_ctx p = {.set = set, .answered = answered};
    nv_batch_for_lines(text, partial_line, &p);
    free(text);
    int rc = p.kept.oom ? -1 : p.n;
    if (rc >= 0 && p.dropped) {
        nv_iov part = {p.kept.data ? p.kept.data : "", p.kept.len};
        if (nv_file_write_atomic(path, &part, 1) != NV_OK) rc = -1;
    }
    nv_buf_free(&p.kept);
    return rc;
}

/* The line of a request never run: OpenAI's error line (code batch_expired), or Anthropic's result of
   type canceled or expired. */
static int write_unrun(FILE *f, const nv_batch_req *q, int expired) {
    char id[64];
    cJSON *o = cJSON_CreateObject();
    if (q->anthropic) {
        cJSON_AddStringToObject(o, "custom_id", q->custom_id);
        cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "result"), "type", expired ? "expired" : "canceled");
    } else {
        nv_api_new_id(id, sizeof id, "batch_req_");
        cJSON_AddStringToObject(o, "id", id);
        cJSON_AddStringToObject(o, "custom_id", q->custom_id);
        cJSON_AddNullToObject(o, "response");
        cJSON *e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "code", "batch_expired");
        cJSON_AddStringToObject(e, "message", "This request could not be executed before the completion window expired.");
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    const int ok = s && fprintf(f, "%s\n", s) >= 0;
    free(s);
    return ok;
}

/* Under mu: the record of id, or NULL. */
static batch *get(nv_batches *b, const char *id) { return id_ok(id) ? nv_recs_get(&b->r, id) : NULL; }

/* Anthropic's results are one file: the output partial's lines, then the errors partial's, written
   whole as ID.results.partial (a temporary file, fsync, rename), then the two removed; a rerun after a
   stop finds the results made and only removes what is left (0: done). */
static int merge_partials(const char *dir, const char *id) {
    char out_path[4200], err_path[4200], res_path[4200];
    path_of(dir, id, ".output.partial", out_path, sizeof out_path);
    path_of(dir, id, ".errors.partial", err_path, sizeof err_path);
    path_of(dir, id, ".results.partial", res_path, sizeof res_path);
    if (!nv_file_exists(res_path)) {
        if (!nv_file_exists(out_path) && !nv_file_exists(err_path)) return 0; /* made a file already (finalize finds it by name) */
        char *text[2] = {NULL, NULL};
        size_t len[2] = {0, 0};
        const char *from[2] = {out_path, err_path};
        int ok = 1;
        for (int k = 0; k < 2 && ok; k++) ok = !nv_file_exists(from[k]) || nv_file_read_all(from[k], &text[k], &len[k]) == NV_OK;
        const nv_iov parts[2] = {{text[0] ? text[0] : "", len[0]}, {text[1] ? text[1] : "", len[1]}};
        ok = ok && nv_file_write_atomic(res_path, parts, 2) == NV_OK;
        free(text[0]), free(text[1]);
        if (!ok) return -1;
    }
    unlink(out_path);
    unlink(err_path);
    return 0;
}

/* The partials made files of the store and the batch ended with status st (its counts given; unrun:
   Anthropic's requests never run, canceled or expired). */
static void finalize(nv_batches *b, const char *id, int st, int total, int completed, int failed, int unrun, cJSON *errors) {
    const char *dir = nv_files_dir(b->files);
    pthread_mutex_lock(&b->mu);
    batch *x = get(b, id);
    const int anth = x && anthropic_of(x->o);
    if (x) { /* what it ends as, kept: a server stopped while it ends ends it so at its next start */
        set_status(x->o, B_FINALIZING);
        set_counts(x->o, total, completed, failed);
        nv_rec_put(x->o, "nerve_unrun", cJSON_CreateNumber(unrun));
        nv_rec_put(x->o, "nerve_final", cJSON_CreateString(status_name[st]));
        save(b, x);
    }
    pthread_mutex_unlock(&b->mu);
    const int merged = anth && merge_partials(dir, id) == 0;
    if (anth && !merged) nv_warn("serve: batch %s: its errored results stay in %s: %s", id, dir, nv_errmsg());
    char file_ids[2][NV_FILE_ID_LEN + 1] = {"", ""};
    static const char *const ext[2] = {".output.partial", ".errors.partial"}, *const name[2] = {"_output.jsonl", "_error.jsonl"};
    for (int k = 0; k < 2; k++) {
        char path[4200], fname[64];
        nv_file_info fi;
        if (anth && k == 1) continue; /* merged into the results (or left where the warning says) */
        path_of(dir, id, merged ? ".results.partial" : ext[k], path, sizeof path);
        snprintf(fname, sizeof fname, "%s%s", id, anth ? "_results.jsonl" : name[k]);
        struct stat st_;
        if (stat(path, &st_) != 0) { /* made a file before a stop that came before its record said so */
            if (nv_files_find_name(b->files, fname, "batch_output", &fi)) snprintf(file_ids[k], sizeof file_ids[k], "%s", fi.id);
            continue;
        }
        if (st_.st_size == 0) {
            unlink(path);
            continue;
        }
        if (nv_files_adopt(b->files, path, fname, "batch_output", 0, &fi) == NV_OK) snprintf(file_ids[k], sizeof file_ids[k], "%s", fi.id);
        else nv_warn("serve: batch %s: its results stay in %s: %s", id, path, nv_errmsg());
    }
    pthread_mutex_lock(&b->mu);
    if ((x = get(b, id))) {
        nv_rec_put(x->o, "output_file_id", file_ids[0][0] ? cJSON_CreateString(file_ids[0]) : cJSON_CreateNull());
        nv_rec_put(x->o, "error_file_id", file_ids[1][0] ? cJSON_CreateString(file_ids[1]) : cJSON_CreateNull());
        if (errors) {
            cJSON *eo = cJSON_CreateObject();
            cJSON_AddStringToObject(eo, "object", "list");
            cJSON_AddItemToObject(eo, "data", errors);
            nv_rec_put(x->o, "errors", eo);
            errors = NULL;
        }
        set_status(x->o, st);
        save(b, x);
    }
    pthread_mutex_unlock(&b->mu);
    cJSON_Delete(errors);
    nv_info("serve: batch %s %s: %d of %d requests answered, %d with an error", id, status_name[st], completed + failed, total,
            failed);
}

/* Runs batch id (whatever of it is left) to its end, or until the server stops. */
static void process(nv_batches *b, const char *id) {
    char input[NV_FILE_ID_LEN + 1], endpoint[64];
    pthread_mutex_lock(&b->mu);
    batch *x = get(b, id);
    int st = x ? status_of(x->o) : -1;
    if (x) {
        snprintf(input, sizeof input, "%s", nv_rec_str(x->o, "input_file_id"));
        snprintf(endpoint, sizeof endpoint, "%s", nv_rec_str(x->o, "endpoint"));
    }
    const long expires_at = x ? (long)nv_rec_num(x->o, "expires_at") : 0;
    const int had_cancel = x && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(x->o, "cancelling_at"));
    const int anth = x && anthropic_of(x->o);
    int final_st = -1, counts[4] = {0};
    if (st == B_FINALIZING) { /* stopped while it ended: end it as it was ending */
        const cJSON *rc = cJSON_GetObjectItemCaseSensitive(x->o, "request_counts"), *fin = cJSON_GetObjectItemCaseSensitive(x->o, "nerve_final");
        counts[0] = (int)nv_rec_num(rc, "total"), counts[1] = (int)nv_rec_num(rc, "completed"), counts[2] = (int)nv_rec_num(rc, "failed");
        counts[3] = (int)nv_rec_num(x->o, "nerve_unrun");
        for (int k = 0; cJSON_IsString(fin) && k < B_N; k++)
            if (!strcmp(fin->valuestring, status_name[k]) && ended(k)) final_st = k;
        if (final_st < 0) final_st = had_cancel ? B_CANCELLED : B_COMPLETED;
    }
    pthread_mutex_unlock(&b->mu);
    if (st < 0) return;
    if (final_st >= 0) {
        finalize(b, id, final_st, counts[0], counts[1], counts[2], counts[3], NULL);
        return;
    }
    const char *dir = nv_files_dir(b->files);
    char out_path[4200], err_path[4200];
    path_of(dir, id, ".output.partial", out_path, sizeof out_path);
    path_of(dir, id, ".errors.partial", err_path, sizeof err_path);

    nv_batch_set set;
    cJSON *errors = cJSON_CreateArray();
    run_ctx r = {.b = b, .expires_at = expires_at};
    int *todo = NULL, completed = 0, failed = 0, unrun = 0;
    if (!errors || nv_batch_set_init(&set) != NV_OK) {
        cJSON_Delete(errors);
        return;
    }
    if (read_input(b, id, input, anth ? NULL : endpoint, &set, errors) != 0) {
        /* a batch that ran before its input went keeps what it answered */
        finalize(b, id, B_FAILED, set.n, 0, 0, 0, errors);
        errors = NULL;
        goto end;
    }
    if (!(r.answered = calloc((size_t)set.n, 1)) || !(todo = malloc((size_t)set.n * sizeof *todo))) goto end;
    if ((completed = keep_partial(out_path, &set, r.answered)) < 0 || (failed = keep_partial(err_path, &set, r.answered)) < 0) {
        if (st == B_CANCELLING) { /* cancelled all the same: what it answered stays where it is */
            nv_warn("serve: batch %s: cannot read its answers so far (%s): cancelled without them", id, nv_errmsg());
            finalize(b, id, B_CANCELLED, set.n, 0, 0, 0, NULL);
            goto end;
        }
        nv_warn("serve: batch %s: cannot read its answers so far (%s): it waits for the next start", id, nv_errmsg());
        goto end;
    }
    if (st == B_VALIDATING) {
        pthread_mutex_lock(&b->mu);
        if ((x = get(b, id)) && status_of(x->o) == B_VALIDATING) {
            set_status(x->o, B_IN_PROGRESS);
            set_counts(x->o, set.n, 0, 0);
            save(b, x);
        }
        st = x ? status_of(x->o) : -1;
        pthread_mutex_unlock(&b->mu);
    }
    r.out = fopen(out_path, "a"), r.err = fopen(err_path, "a");
    if (!r.out || !r.err) {
        nv_warn("serve: batch %s: cannot write its answers in %s: %s", id, dir, strerror(errno));
        goto end;
    }
    int n_todo = 0;
    for (int i = 0; i < set.n; i++)
        if (!r.answered[i]) todo[n_todo++] = i;
    atomic_store(&b->run_completed, completed);
    atomic_store(&b->run_failed, failed);
    if (st == B_IN_PROGRESS && n_todo && time(NULL) <= expires_at) {
        r.run = (nv_batch_runner){.set = &set, .todo = todo, .n_todo = n_todo, .port = b->port, .timeout_s = b->timeout_s,
                                  .workers = b->workers, .on_result = on_result, .ctx = &r};
        nv_batch_runner_init(&r.run, b->key);
        pthread_mutex_lock(&b->mu);
        const int go = !b->stopping && (x = get(b, id)) && status_of(x->o) == B_IN_PROGRESS;
        if (go) b->run = &r.run, snprintf(b->running, sizeof b->running, "%s", id);
        pthread_mutex_unlock(&b->mu);
        if (go) {
            nv_info("serve: batch %s: %d requests to %s%s", id, n_todo, anth ? "/v1/messages" : endpoint,
                    completed + failed ? " (the rest were answered before)" : "");
            if (nv_batch_run(&r.run) != 0) nv_warn("serve: batch %s: cannot start its threads", id);
        }
        pthread_mutex_lock(&b->mu);
        b->run = NULL, b->running[0] = '\0';
        pthread_mutex_unlock(&b->mu);
        nv_batch_runner_free(&r.run);
    }
    completed = atomic_load(&b->run_completed), failed = atomic_load(&b->run_failed);
    if (fflush(r.out) != 0 || fsync(fileno(r.out)) != 0 || fflush(r.err) != 0 || fsync(fileno(r.err)) != 0)
        r.write_error = errno ? errno : EIO;
    pthread_mutex_lock(&b->mu);
    const int stopping = b->stopping;
    st = (x = get(b, id)) ? status_of(x->o) : -1;
    pthread_mutex_unlock(&b->mu);
    if (stopping || st < 0) goto end; /* stays as it is for the next start */
    int unanswered = 0;
    for (int i = 0; i < set.n; i++) unanswered += !r.answered[i];
    if (st == B_IN_PROGRESS && unanswered && !r.expired && time(NULL) <= expires_at && !r.write_error) {
        /* not every request ran (no thread could start, memory): they wait for the next start */
        nv_warn("serve: batch %s: %d requests were not run; they wait for the next start", id, unanswered);
        goto end;
    }
    if (st == B_CANCELLING || r.expired || time(NULL) > expires_at) {
        /* the requests never run: OpenAI's expired ones an error line each (counted failed), Anthropic's
           canceled or expired ones a result each */
        const int expired = st != B_CANCELLING;
        for (int i = 0; i < set.n; i++)
            if (!r.answered[i] && (anth || expired)) {
                if (!write_unrun(r.err, &set.reqs[i], expired)) r.write_error = errno ? errno : EIO;
                if (anth) unrun++;
                else failed++;
            }
        if (fflush(r.err) != 0 || fsync(fileno(r.err)) != 0) r.write_error = errno ? errno : EIO;
        st = expired ? B_EXPIRED : B_CANCELLED;
    } else {
        st = B_COMPLETED;
    }
    if (r.write_error) {
        char msg[200];
        snprintf(msg, sizeof msg, "the answers could not be written: %s", strerror(r.write_error));
        add_error(errors, "server_error", msg, 0);
        st = B_FAILED;
    }
    fclose(r.out), fclose(r.err);
    r.out = r.err = NULL;
    finalize(b, id, st, set.n, completed, failed, unrun, st == B_FAILED ? errors : NULL);
    if (st == B_FAILED) errors = NULL;
end:
    if (r.out) fclose(r.out);
    if (r.err) fclose(r.err);
    cJSON_Delete(errors);
    free(r.answered);
    free(todo);
    nv_batch_set_free(&set);
}

/* Under mu: the oldest batch with work left, or -1. */
static int next_pending(const nv_batches *b) {
    for (int i = 0; i < b->r.n; i++) {
        if (b->r.v[i].held) continue;
        const int st = status_of(b->r.v[i].o);
        if (st == B_VALIDATING || st == B_IN_PROGRESS || st == B_CANCELLING || st == B_FINALIZING) return i;
    }
    return -1;
}

static void *runner_main(void *arg) {
    nv_batches *b = arg;
    pthread_mutex_lock(&b->mu);
    while (!b->stopping) {
        const int i = next_pending(b);
        if (i < 0) {
            pthread_cond_wait(&b->cv, &b->mu);
            continue;
        }
        char id[sizeof b->r.v->id];
        snprintf(id, sizeof id, "%s", b->r.v[i].id);
        const int before = status_of(b->r.v[i].o);
        pthread_mutex_unlock(&b->mu);
        process(b, id);
        pthread_mutex_lock(&b->mu);
        const batch *x = get(b, id);
        /* it made no way: held until the next start (unless a cancel came meanwhile: that one runs next) */
        const int st = x ? status_of(x->o) : -1, cancelled_meanwhile = st == B_CANCELLING && before != B_CANCELLING;
        if (x && !atomic_load(&b->stopping) && !ended(st) && !cancelled_meanwhile) b->r.v[x - b->r.v].held = 1;
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

nv_err nv_batches_start(nv_batches *b, int port, const char *api_key, int workers, float timeout_s) {
    b->port = port, b->workers = workers, b->timeout_s = timeout_s;
    snprintf(b->key, sizeof b->key, "%s", api_key);
    if (pthread_create(&b->thread, NULL, runner_main, b) != 0) return nv_fail(NV_ENOMEM, "cannot start the batches' thread");
    b->started = 1;
    return NV_OK;
}

void nv_batches_stop(nv_batches *b, int level) {
    if (!b) return;
    pthread_mutex_lock(&b->mu);
    if (atomic_load(&b->stopping) < level) atomic_store(&b->stopping, level);
    if (b->run) nv_batch_run_stop(b->run, level); /* (its lock is never held while taking ours) */
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

void nv_batches_close(nv_batches *b) {
    if (!b) return;
    if (b->started) {
        nv_batches_stop(b, 1);
        pthread_join(b->thread, NULL);
    }
    nv_recs_free(&b->r);
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    explicit_bzero(b->key, sizeof b->key);
    free(b);
}

int nv_batches_counts(nv_batches *b, const char **names, int *counts, int cap) {
    pthread_mutex_lock(&b->mu);
    const int n = nv_recs_count_status(&b->r, status_name, B_N, names, counts, cap);
    pthread_mutex_unlock(&b->mu);
    return n;
}

/* ---- the endpoints ---------------------------------------------------------------------------------- */

/* An RFC 3339 time (Anthropic's) of o[key], seconds since 1970, or null when it has none. */
static void add_time(cJSON *to, const char *name, const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v)) {
        cJSON_AddNullToObject(to, name);
        return;
    }
    const time_t t = (time_t)v->valuedouble;
    struct tm tm;
    char buf[40];
    gmtime_r(&t, &tm);
    strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    cJSON_AddStringToObject(to, name, buf);
}

/* x as Anthropic's MessageBatch, counts c (total, succeeded, errored), base the server's URL. */
static cJSON *anth_object(const batch *x, const int c[3], const char *base) {
    const cJSON *o = x->o;
    const int st = status_of(o), unrun = (int)nv_rec_num(o, "nerve_unrun"), end = ended(st);
    cJSON *a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "id", x->id);
    cJSON_AddStringToObject(a, "type", "message_batch");
    cJSON_AddStringToObject(a, "processing_status", end ? "ended" : st == B_CANCELLING ? "canceling" : "in_progress");
    cJSON *rc = cJSON_AddObjectToObject(a, "request_counts");
    cJSON_AddNumberToObject(rc, "processing", end ? 0 : c[0] - c[1] - c[2]);
    cJSON_AddNumberToObject(rc, "succeeded", c[1]);
    cJSON_AddNumberToObject(rc, "errored", st == B_FAILED ? c[0] - c[1] : c[2]);
    cJSON_AddNumberToObject(rc, "canceled", st == B_CANCELLED ? unrun : 0);
    cJSON_AddNumberToObject(rc, "expired", st == B_EXPIRED ? unrun : 0);
    add_time(a, "ended_at", o, end ? status_at[st] : "");
    add_time(a, "created_at", o, "created_at");
    add_time(a, "expires_at", o, "expires_at");
    add_time(a, "cancel_initiated_at", o, "cancelling_at");
    cJSON_AddNullToObject(a, "archived_at");
    if (end) {
        char url[600];
        snprintf(url, sizeof url, "%.400s/v1/messages/batches/%s/results", base, x->id);
        cJSON_AddStringToObject(a, "results_url", url);
    } else {
        cJSON_AddNullToObject(a, "results_url");
    }
    return a;
}

/* x's object as its API shows it (under mu): the running one's counts as they are now; base: the
   server's URL (Anthropic's results_url). */
static cJSON *shown(nv_batches *b, const batch *x, const char *base) {
    const cJSON *rc = cJSON_GetObjectItemCaseSensitive(x->o, "request_counts");
    int c[3] = {(int)nv_rec_num(rc, "total"), (int)nv_rec_num(rc, "completed"), (int)nv_rec_num(rc, "failed")};
    if (!strcmp(b->running, x->id)) c[1] = atomic_load(&b->run_completed), c[2] = atomic_load(&b->run_failed);
    if (anthropic_of(x->o)) return anth_object(x, c, base);
    cJSON *o = nv_rec_public(x->o);
    if (o) set_counts(o, c[0], c[1], c[2]);
    return o;
}

static int not_found(const char *id, nv_api_error *e) {
    nv_api_error_set(e, 404, "not_found_error", "not_found", NULL, "No batch found with id '%.100s'", id);
    return e->status;
}

/* Under mu: the record of id when it is one of that API's (Anthropic's or OpenAI's), or NULL. */
static batch *get_kind(nv_batches *b, const char *id, int anthropic) {
    batch *x = get(b, id);
    return x && anthropic_of(x->o) == anthropic ? x : NULL;
}

static int answer(cJSON *o, char **out, nv_api_error *e) {
    *out = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return *out ? 0 : nv_api_oom(e);
}

static int bad(nv_api_error *e, const char *param, const char *msg) {
    nv_api_error_set(e, 400, "invalid_request_error", "invalid_request", param, "%s", msg);
    return e->status;
}


static cJSON *new_record(const char *id, const char *endpoint, const char *input_file_id, const cJSON *meta);
static int add_record(nv_batches *b, const char *id, cJSON *o, const char *base, char **out, nv_api_error *e);

int nv_batches_create(nv_batches *b, const char *body, size_t len, char **out, nv_api_error *e) {
    static const char *const endpoints[] = {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"};
    cJSON *req = cJSON_ParseWithLength(body, len);
    int rc = 0;
    if (!cJSON_IsObject(req)) {
        cJSON_Delete(req);
        return bad(e, NULL, "The body must be a JSON object: {\"input_file_id\", \"endpoint\", \"completion_window\": \"24h\"}");
    }
    const cJSON *in = nv_api_field(req, "input_file_id"), *ep = nv_api_field(req, "endpoint"),
                *win = nv_api_field(req, "completion_window"), *meta = nv_api_field(req, "metadata");
    nv_file_info fi;
    int k = 0;
    while (cJSON_IsString(ep) && k < 4 && strcmp(ep->valuestring, endpoints[k]) != 0) k++;
    if (!cJSON_IsString(in)) rc = bad(e, "input_file_id", "input_file_id (the id of a file uploaded with purpose \"batch\") is required");
    else if (!nv_files_get(b->files, in->valuestring, &fi)) {
        nv_api_error_set(e, 400, "invalid_request_error", "invalid_request", "input_file_id", "No file found with id '%.100s'",
                         in->valuestring);
        rc = e->status;
    } else if (strcmp(fi.purpose, "batch") != 0)
        rc = bad(e, "input_file_id", "The input file must be uploaded with purpose \"batch\"");
    else if (!cJSON_IsString(ep) || k == 4)
        rc = bad(e, "endpoint", "endpoint must be one of /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses");
    else if (!cJSON_IsString(win) || strcmp(win->valuestring, "24h") != 0)
        rc = bad(e, "completion_window", "completion_window must be \"24h\"");
    else if (meta && (!cJSON_IsObject(meta) || !nv_rec_metadata_ok(meta)))
        rc = bad(e, "metadata", "metadata must be an object of at most 16 strings (keys up to 64 characters, values up to 512)");
    if (rc) {
        cJSON_Delete(req);
        return rc;
    }
    char id[64];
    nv_api_new_id(id, sizeof id, "batch_");
    cJSON *o = new_record(id, endpoints[k], fi.id, meta);
    cJSON_Delete(req);
    return add_record(b, id, o, "", out, e);
}

/* A new batch's record: validating, in OpenAI's Batch shape (Anthropic's shown from it). */
static cJSON *new_record(const char *id, const char *endpoint, const char *input_file_id, const cJSON *meta) {
    const long now = (long)time(NULL);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", "batch");
    cJSON_AddStringToObject(o, "endpoint", endpoint);
    cJSON_AddNullToObject(o, "errors");
    if (input_file_id) cJSON_AddStringToObject(o, "input_file_id", input_file_id);
    else cJSON_AddNullToObject(o, "input_file_id"), cJSON_AddStringToObject(o, "nerve_kind", "anthropic");
    cJSON_AddStringToObject(o, "completion_window", "24h");
    cJSON_AddStringToObject(o, "status", "validating");
    cJSON_AddNullToObject(o, "output_file_id");
    cJSON_AddNullToObject(o, "error_file_id");
    cJSON_AddNumberToObject(o, "created_at", (double)now);
    cJSON_AddNullToObject(o, "in_progress_at");
    cJSON_AddNumberToObject(o, "expires_at", (double)(now + WINDOW_S));
    for (int s = B_FINALIZING; s < B_N; s++)
        if (status_at[s]) cJSON_AddNullToObject(o, status_at[s]);
    cJSON_AddNullToObject(o, "failed_at");
    set_counts(o, 0, 0, 0);
    if (meta) cJSON_AddItemToObject(o, "metadata", cJSON_Duplicate(meta, 1));
    else cJSON_AddNullToObject(o, "metadata");
    return o;
}

/* Record o (taken) saved and listed, and the runner woken: its object as its API shows it in *out. */
static int add_record(nv_batches *b, const char *id, cJSON *o, const char *base, char **out, nv_api_error *e) {
    pthread_mutex_lock(&b->mu);
    const uint64_t seq = b->r.next_seq;
    batch tmp = {.o = o, .seq = seq};
    snprintf(tmp.id, sizeof tmp.id, "%.33s", id);
    nv_err err = save(b, &tmp);
    if (err == NV_OK) err = nv_recs_add(&b->r, id, o, seq);
    cJSON *copy = err == NV_OK ? shown(b, &tmp, base) : NULL;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    if (err != NV_OK) {
        cJSON_Delete(o);
        nv_api_error_set(e, 500, "api_error", NULL, NULL, "The batch could not be saved: %s", nv_errmsg());
        return e->status;
    }
    return answer(copy, out, e);
}

/* Anthropic's custom_id: 1 to 64 of letters, digits, '-' and '_'. */
static int custom_id_ok(const char *s) {
    size_t n = 0;
    for (; s[n]; n++)
        if (n >= 64 || !((s[n] >= 'a' && s[n] <= 'z') || (s[n] >= 'A' && s[n] <= 'Z') || (s[n] >= '0' && s[n] <= '9') || s[n] == '-' ||
                         s[n] == '_'))
            return 0;
    return n > 0;
}

int nv_batches_create_anthropic(nv_batches *b, const char *body, size_t len, const char *base, char **out, nv_api_error *e) {
    cJSON *req = cJSON_ParseWithLength(body, len);
    const cJSON *reqs = cJSON_IsObject(req) ? nv_api_field(req, "requests") : NULL;
    const int n = cJSON_IsArray(reqs) ? cJSON_GetArraySize(reqs) : 0;
    if (n < 1 || n > 100000) {
        cJSON_Delete(req);
        nv_api_error_set(e, 400, "invalid_request_error", NULL, "requests",
                         "requests: a list of 1 to 100,000 {\"custom_id\", \"params\"} objects is required");
        return e->status;
    }
    /* each request as a line of a Message Batches file, checked as nerve batch checks one */
    nv_buf text = {0};
    nv_batch_set set;
    int rc = nv_batch_set_init(&set) == NV_OK ? 0 : nv_api_oom(e);
    int k = 0;
    for (const cJSON *it = reqs->child; !rc && it; it = it->next, k++) {
        const cJSON *cid = cJSON_GetObjectItemCaseSensitive(it, "custom_id"), *params = cJSON_GetObjectItemCaseSensitive(it, "params");
        if (!cJSON_IsString(cid) || !custom_id_ok(cid->valuestring) || !cJSON_IsObject(params)) {
            nv_api_error_set(e, 400, "invalid_request_error", NULL, "requests",
                             "requests[%d]: want {\"custom_id\": 1 to 64 letters, digits, '-' or '_', \"params\": a Messages request}", k);
            rc = e->status;
            break;
        }
        cJSON *line = cJSON_CreateObject();
        cJSON_AddStringToObject(line, "custom_id", cid->valuestring);
        cJSON_AddItemToObject(line, "params", cJSON_Duplicate(params, 1));
        char *s = cJSON_PrintUnformatted(line);
        cJSON_Delete(line);
        const nv_err err = s ? nv_batch_add_line(&set, s, k + 1) : NV_ENOMEM;
        if (err == NV_OK) {
            nv_buf_append(&text, s, strlen(s));
            nv_buf_append(&text, "\n", 1);
        } else if (err == NV_ENOMEM) {
            rc = nv_api_oom(e);
        } else {
            nv_api_error_set(e, 400, "invalid_request_error", NULL, "requests", "requests[%d]: %s", k, nv_errmsg());
            rc = e->status;
        }
        free(s);
    }
    nv_batch_set_free(&set);
    cJSON_Delete(req);
    if (!rc && text.oom) rc = nv_api_oom(e);
    char id[64], path[4200];
    nv_api_new_id(id, sizeof id, "msgbatch_");
    path_of(nv_files_dir(b->files), id, ".input.jsonl", path, sizeof path);
    nv_iov part = {text.data, text.len};
    const uint64_t bytes = text.len;
    if (!rc && !nv_files_reserve(b->files, bytes)) { /* its requests count against the files' limit */
        nv_api_error_set(e, 413, "request_too_large", NULL, "requests",
                         "The batch's requests would pass the server's limit of %llu bytes of files (--files-max-bytes)",
                         (unsigned long long)nv_files_max_bytes(b->files));
        rc = e->status;
    } else if (!rc && nv_file_write_atomic(path, &part, 1) != NV_OK) {
        nv_api_error_set(e, 500, "api_error", NULL, NULL, "The batch could not be saved: %s", nv_errmsg());
        rc = e->status;
        nv_files_release(b->files, bytes);
    }
    nv_buf_free(&text);
    if (rc) return rc;
    cJSON *o = new_record(id, "/v1/messages", NULL, NULL);
    set_counts(o, n, 0, 0); /* Anthropic's counts them processing from the start */
    rc = add_record(b, id, o, base, out, e);
    if (rc) unlink(path), nv_files_release(b->files, bytes);
    return rc;
}

int nv_batches_get(nv_batches *b, int anthropic, const char *id, const char *base, char **out, nv_api_error *e) {
    pthread_mutex_lock(&b->mu);
    const batch *x = get_kind(b, id, anthropic);
    cJSON *o = x ? shown(b, x, base) : NULL;
    pthread_mutex_unlock(&b->mu);
    if (!x) return not_found(id, e);
    return answer(o, out, e);
}

int nv_batches_uses(nv_batches *b, const char *file_id) {
    pthread_mutex_lock(&b->mu);
    int uses = 0;
    for (int i = 0; i < b->r.n && !uses; i++)
        uses = !ended(status_of(b->r.v[i].o)) && !strcmp(nv_rec_str(b->r.v[i].o, "input_file_id"), file_id);
    pthread_mutex_unlock(&b->mu);
    return uses;
}

int nv_batches_cancel(nv_batches *b, int anthropic, const char *id, const char *base, char **out, nv_api_error *e) {
    pthread_mutex_lock(&b->mu);
    batch *x = get_kind(b, id, anthropic);
    const int st = x ? status_of(x->o) : -1;
    cJSON *o = NULL;
    if (st == B_VALIDATING || st == B_IN_PROGRESS) {
        set_status(x->o, B_CANCELLING);
        x->held = 0; /* a batch waiting for the next start is cancelled now */
        save(b, x);
        if (b->run && !strcmp(b->running, id)) nv_batch_run_stop(b->run, 1); /* those running finish */
        pthread_cond_broadcast(&b->cv);
    }
    /* Anthropic's cancel answers a batch that has ended as it is; OpenAI's refuses it */
    const int ok = x && (anthropic || (st != B_FAILED && st != B_COMPLETED && st != B_EXPIRED && st != B_FINALIZING));
    if (ok) o = shown(b, x, base);
    pthread_mutex_unlock(&b->mu);
    if (!x) return not_found(id, e);
    if (!ok) {
        nv_api_error_set(e, 409, "invalid_request_error", "invalid_request", NULL, "Cannot cancel a batch with status '%s'",
                         status_name[st]);
        return e->status;
    }
    return answer(o, out, e);
}

int nv_batches_list(nv_batches *b, int anthropic, int limit, const char *after, const char *before, const char *base, char **out,
                    nv_api_error *e) {
    cJSON *o = cJSON_CreateObject(), *data = cJSON_AddArrayToObject(o, "data");
    if (!anthropic) cJSON_AddStringToObject(o, "object", "list");
    pthread_mutex_lock(&b->mu);
    /* newest first; after an id: the older ones; before an id: the newer ones nearest it */
    int hi = b->r.n - 1, lo = 0;
    if (after || before) {
        const batch *x = get(b, after ? after : before);
        const int at = x ? (int)(x - b->r.v) : -1;
        if (at < 0) hi = -1;
        else if (after) hi = at - 1;
        else lo = at + 1;
    }
    int kept = 0, more = 0;
    if (before) { /* the limit nearest the cursor: skip the newest beyond them */
        int count = 0;
        for (int i = lo; i <= hi; i++) count += anthropic_of(b->r.v[i].o) == anthropic;
        for (int skip = count - limit; skip > 0 && hi >= lo; hi--) skip -= anthropic_of(b->r.v[hi].o) == anthropic, more = 1;
    }
    const char *first = NULL, *last = NULL;
    for (int i = hi; i >= lo; i--) {
        if (anthropic_of(b->r.v[i].o) != anthropic) continue;
        if (kept == limit) {
            more = 1;
            break;
        }
        cJSON_AddItemToArray(data, shown(b, &b->r.v[i], base));
        if (!first) first = b->r.v[i].id;
        last = b->r.v[i].id, kept++;
    }
    if (first) cJSON_AddStringToObject(o, "first_id", first), cJSON_AddStringToObject(o, "last_id", last);
    else cJSON_AddNullToObject(o, "first_id"), cJSON_AddNullToObject(o, "last_id");
    pthread_mutex_unlock(&b->mu);
    cJSON_AddBoolToObject(o, "has_more", more);
    return answer(o, out, e);
}

int nv_batches_delete(nv_batches *b, const char *id, char **out, nv_api_error *e) {
    pthread_mutex_lock(&b->mu);
    batch *x = get_kind(b, id, 1);
    const int st = x ? status_of(x->o) : -1;
    char results[NV_FILE_ID_LEN + 1] = "";
    if (x && ended(st)) { /* its record, its requests and its results go */
        char path[4200];
        const char *dir = nv_files_dir(b->files);
        snprintf(results, sizeof results, "%.29s", nv_rec_str(x->o, "output_file_id"));
        path_of(dir, id, ".json", path, sizeof path);
        unlink(path);
        nv_files_release(b->files, input_bytes(dir, id));
        path_of(dir, id, ".input.jsonl", path, sizeof path);
        unlink(path);
        nv_recs_remove(&b->r, x);
    }
    pthread_mutex_unlock(&b->mu);
    if (!x) return not_found(id, e);
    if (!ended(st)) {
        nv_api_error_set(e, 400, "invalid_request_error", NULL, NULL, "Message batch %.60s has not ended: cancel it first", id);
        return e->status;
    }
    if (results[0]) nv_files_delete(b->files, results);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "type", "message_batch_deleted");
    return answer(o, out, e);
}

int nv_batches_results(nv_batches *b, const char *id, int *fd, long long *bytes, nv_api_error *e) {
    pthread_mutex_lock(&b->mu);
    const batch *x = get_kind(b, id, 1);
    const int st = x ? status_of(x->o) : -1;
    char results[NV_FILE_ID_LEN + 1] = "";
    if (x) snprintf(results, sizeof results, "%.29s", nv_rec_str(x->o, "output_file_id"));
    pthread_mutex_unlock(&b->mu);
    if (!x) return not_found(id, e);
    if (!ended(st)) {
        nv_api_error_set(e, 400, "invalid_request_error", NULL, NULL, "Message batch %.60s has not ended: its results are not ready", id);
        return e->status;
    }
    nv_file_info fi = {0};
    *fd = results[0] ? nv_files_open_content(b->files, results, &fi) : -1;
    *bytes = fi.bytes;
    return 0;
}
