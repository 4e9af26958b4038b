#include "serve/files.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/file.h"
#include "base/log.h"
#include "serve/api.h"
#include "serve/sched.h"

struct nv_files {
    char dir[4096];
    int lock_fd; /* DIR/.lock, held (flock) while the store is open: one server a folder */
    uint64_t max_bytes, used; /* used: the files' bytes and those of uploads under way */
    uint64_t next_seq;
    pthread_mutex_t mu;
    nv_file_info *v; /* in the order they came (seq ascending) */
    int n, cap;
};

struct nv_file_upload {
    nv_files *f;
    int fd;
    uint64_t bytes;
    char tmp[4200 + 80];
};

int nv_multipart_end_init(nv_multipart_end *m, const char *content_type) {
    memset(m, 0, sizeof *m);
    while (content_type && (*content_type == ' ' || *content_type == '\t')) content_type++;
    if (!content_type || strncasecmp(content_type, "multipart/form-data", 19) != 0) return 0; /* (a boundary of another type: not a form) */
    const char *b = strcasestr(content_type, "boundary=");
    if (!b) return 0;
    b += 9;
    const int quoted = *b == '"';
    b += quoted;
    const size_t n = strcspn(b, quoted ? "\"" : "; \t");
    if (n == 0 || n > 100) return 0;
    snprintf(m->delim, sizeof m->delim, "--%.*s--", (int)n, b);
    m->len = n + 4;
    return 1;
}

size_t nv_multipart_end_scan(nv_multipart_end *m, const char *p, size_t n) {
    if (m->closed) return 0;
    const size_t dl = m->len, head = n < dl - 1 ? n : dl - 1; /* a delimiter begun in the tail ends within head */
    char join[2 * sizeof m->tail];
    memcpy(join, m->tail, m->tail_len);
    memcpy(join + m->tail_len, p, head);
    size_t body = n;
    const char *hit = memmem(join, m->tail_len + head, m->delim, dl);
    if (hit) body = (size_t)(hit - join) + dl - m->tail_len;
    else if ((hit = memmem(p, n, m->delim, dl))) body = (size_t)(hit - p) + dl;
    m->closed = hit != NULL;
    if (n >= dl - 1) { /* the tail: the last dl - 1 bytes seen */
        memcpy(m->tail, p + n - (dl - 1), dl - 1);
        m->tail_len = dl - 1;
    } else {
        const size_t keep = m->tail_len + n > dl - 1 ? dl - 1 - n : m->tail_len;
        memmove(m->tail, m->tail + m->tail_len - keep, keep);
        memcpy(m->tail + keep, p, n);
        m->tail_len = keep + n;
    }
    return body;
}

int nv_id_well_formed(const char *s, const char *prefix) {
    const size_t pl = strlen(prefix);
    if (!s || strncmp(s, prefix, pl) != 0) return 0;
    s += pl;
    for (int i = 0; i < 24; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return s[24] == '\0';
}

const char *nv_files_dir(const nv_files *f) { return f->dir; }

static void reap(nv_files *f);

void nv_files_usage(nv_files *f, int *n, uint64_t *bytes) {
    pthread_mutex_lock(&f->mu);
    reap(f);
    *n = f->n;
    *bytes = 0;
    for (int i = 0; i < f->n; i++) *bytes += (uint64_t)f->v[i].bytes;
    pthread_mutex_unlock(&f->mu);
}

static void path_of(const nv_files *f, const char *name, const char *ext, char *out, size_t cap) {
    snprintf(out, cap, "%.4096s/%.64s%.8s", f->dir, name, ext);
}

static cJSON *info_object(const nv_file_info *i) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", i->id);
    cJSON_AddStringToObject(o, "object", "file");
    cJSON_AddNumberToObject(o, "bytes", (double)i->bytes);
    cJSON_AddNumberToObject(o, "created_at", (double)i->created_at);
    if (i->expires_at > 0) cJSON_AddNumberToObject(o, "expires_at", (double)i->expires_at);
    else cJSON_AddNullToObject(o, "expires_at");
    cJSON_AddStringToObject(o, "filename", i->filename);
    cJSON_AddStringToObject(o, "purpose", i->purpose);
    cJSON_AddStringToObject(o, "status", "processed");
    cJSON_AddNullToObject(o, "status_details");
    return o;
}

char *nv_file_json(const nv_file_info *i) {
    cJSON *o = info_object(i);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

nv_err nv_files_save_record(const char *dir, const char *id, const cJSON *o, uint64_t seq) {
    cJSON *copy = cJSON_Duplicate(o, 1);
    if (copy) cJSON_AddNumberToObject(copy, "nerve_seq", (double)seq);
    char *s = copy ? cJSON_PrintUnformatted(copy) : NULL;
    cJSON_Delete(copy);
    if (!s) return nv_fail(NV_ENOMEM, "out of memory");
    char path[4200 + 80];
    snprintf(path, sizeof path, "%.4096s/%.40s.json", dir, id);
    nv_iov part = {s, strlen(s)};
    const nv_err e = nv_file_write_atomic(path, &part, 1);
    free(s);
    return e;
}

cJSON *nv_files_load_record(const char *path, uint64_t *seq) {
    char *text = NULL;
    size_t len;
    if (nv_file_read_all(path, &text, &len) != NV_OK) return NULL;
    cJSON *o = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *sq = cJSON_GetObjectItemCaseSensitive(o, "nerve_seq");
    if (!cJSON_IsObject(o) || !cJSON_IsNumber(sq) || sq->valuedouble < 0) {
        cJSON_Delete(o);
        return NULL;
    }
    *seq = (uint64_t)sq->valuedouble;
    cJSON_DeleteItemFromObjectCaseSensitive(o, "nerve_seq");
    return o;
}

/* The object written beside the bytes: the File object and its order. */
static nv_err save_info(const nv_files *f, const nv_file_info *i) {
    cJSON *o = info_object(i);
    const nv_err e = nv_files_save_record(f->dir, i->id, o, i->seq);
    cJSON_Delete(o);
    return e;
}

/* Removes file i (under mu): its object first (a crash between leaves bytes no one lists), then its bytes. */
static void remove_at(nv_files *f, int i) {
    char path[4200 + 80];
    path_of(f, f->v[i].id, ".json", path, sizeof path);
    unlink(path);
    path_of(f, f->v[i].id, "", path, sizeof path);
    unlink(path);
    f->used -= (uint64_t)f->v[i].bytes;
    memmove(f->v + i, f->v + i + 1, (size_t)(f->n - i - 1) * sizeof *f->v);
    f->n--;
}

/* The files past their expires_at removed (under mu). */
static void reap(nv_files *f) {
    const long now = (long)time(NULL);
    for (int i = f->n - 1; i >= 0; i--)
        if (f->v[i].expires_at > 0 && now >= f->v[i].expires_at) remove_at(f, i);
}

static int find(const nv_files *f, const char *id) {
    if (!nv_id_well_formed(id, "file-")) return -1;
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->v[i].id, id)) return i;
    return -1;
}

/* Adds i keeping seq order (under mu, or before the store is shared). */
static nv_err add(nv_files *f, const nv_file_info *i) {
    if (f->n == f->cap) {
        const int cap = f->cap ? 2 * f->cap : 64;
        nv_file_info *v = realloc(f->v, (size_t)cap * sizeof *v);
        if (!v) return nv_fail(NV_ENOMEM, "out of memory");
        f->v = v, f->cap = cap;
    }
    int at = f->n;
    while (at > 0 && f->v[at - 1].seq > i->seq) at--;
    memmove(f->v + at + 1, f->v + at, (size_t)(f->n - at) * sizeof *f->v);
    f->v[at] = *i;
    f->n++;
    f->used += (uint64_t)i->bytes;
    if (i->seq >= f->next_seq) f->next_seq = i->seq + 1;
    return NV_OK;
}

/* One DIR/ID.json read back: 1 when it is a file's whole object and its bytes are there, -1 when it is
   whole but its bytes are not (a crash before they were renamed in), 0 otherwise. */
static int load_one(nv_files *f, const char *name, nv_file_info *out) {
    char path[4200 + 80], id[64];
    snprintf(id, sizeof id, "%.*s", (int)(strlen(name) - 5), name);
    path_of(f, name, "", path, sizeof path);
    uint64_t seq;
    cJSON *o = nv_files_load_record(path, &seq);
    const cJSON *jid = cJSON_GetObjectItemCaseSensitive(o, "id"), *fn = cJSON_GetObjectItemCaseSensitive(o, "filename"),
                *pu = cJSON_GetObjectItemCaseSensitive(o, "purpose"), *by = cJSON_GetObjectItemCaseSensitive(o, "bytes"),
                *ca = cJSON_GetObjectItemCaseSensitive(o, "created_at");
    int ok = cJSON_IsString(jid) && !strcmp(jid->valuestring, id) && cJSON_IsString(fn) && strlen(fn->valuestring) < sizeof out->filename &&
             cJSON_IsString(pu) && strlen(pu->valuestring) < sizeof out->purpose && cJSON_IsNumber(by) && by->valuedouble >= 0 &&
             by->valuedouble <= 1e18 && cJSON_IsNumber(ca) && ca->valuedouble >= 0 && ca->valuedouble <= 1e12; /* (casts in range) */
    if (ok) {
        memset(out, 0, sizeof *out);
        snprintf(out->id, sizeof out->id, "%.29s", id);
        snprintf(out->filename, sizeof out->filename, "%s", fn->valuestring);
        snprintf(out->purpose, sizeof out->purpose, "%s", pu->valuestring);
        out->bytes = (int64_t)by->valuedouble;
        out->created_at = (long)ca->valuedouble;
        const cJSON *ea = cJSON_GetObjectItemCaseSensitive(o, "expires_at");
        out->expires_at = cJSON_IsNumber(ea) && ea->valuedouble > 0 ? (long)fmin(ea->valuedouble, 1e12) : 0;
        out->seq = seq;
        struct stat st;
        path_of(f, id, "", path, sizeof path);
        const int there = stat(path, &st) == 0;
        ok = !there && errno == ENOENT ? -1 : there && S_ISREG(st.st_mode) && (int64_t)st.st_size == out->bytes;
    }
    cJSON_Delete(o);
    return ok;
}

nv_err nv_files_open(nv_files **out, const char *dir, uint64_t max_bytes) {
    *out = NULL;
    NV_TRY(nv_mkdirs_private(dir)); /* users' files: theirs alone */
    chmod(dir, 0700);                /* (made by an earlier version with 0755) */
    nv_files *f = calloc(1, sizeof *f);
    if (!f) return nv_fail(NV_ENOMEM, "out of memory");
    f->lock_fd = -1;
    snprintf(f->dir, sizeof f->dir, "%s", dir);
    f->max_bytes = max_bytes;
    pthread_mutex_init(&f->mu, NULL);
    char lock_path[4200 + 80];
    path_of(f, ".lock", "", lock_path, sizeof lock_path);
    if ((f->lock_fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0 || flock(f->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        const int en = errno;
        nv_files_close(f);
        return en == EWOULDBLOCK ? nv_fail(NV_EIO, "another nerve serve keeps its files and batches in %s", dir)
                                 : nv_fail(NV_EIO, "cannot lock %s: %s", lock_path, strerror(en));
    }
    DIR *d = opendir(dir);
    if (!d) {
        const int en = errno;
        nv_files_close(f);
        return nv_fail(NV_EIO, "cannot read the files' folder %s: %s", dir, strerror(en));
    }
    nv_err e = NV_OK;
    for (struct dirent *de; e == NV_OK && (de = readdir(d));) {
        const char *name = de->d_name;
        const size_t len = strlen(name);
        char path[4200 + 80];
        if (!strncmp(name, ".upload-", 8)) { /* an upload the server did not see end */
            path_of(f, name, "", path, sizeof path);
            unlink(path);
            continue;
        }
        if (len != NV_FILE_ID_LEN + 5 || strcmp(name + NV_FILE_ID_LEN, ".json") != 0 || strncmp(name, "file-", 5) != 0) continue;
        char id[NV_FILE_ID_LEN + 1];
        snprintf(id, sizeof id, "%.*s", NV_FILE_ID_LEN, name);
        if (!nv_id_well_formed(id, "file-")) continue;
        nv_file_info i;
        const int got = load_one(f, name, &i);
        if (got < 0) { /* a crash before its bytes were renamed in: nothing to list */
            path_of(f, name, "", path, sizeof path);
            unlink(path);
            continue;
        }
        if (!got) {
            nv_warn("serve: %s/%s is not a file's whole record (or its bytes are missing or of another size): not listed", dir, name);
            continue;
        }
        e = add(f, &i);
    }
    /* bytes without a record (a crash while a file was removed) and a record's unfinished
       temporary copies: no one lists them, so they go (the folder is this server's alone: the lock) */
    rewinddir(d);
    for (struct dirent *de; e == NV_OK && (de = readdir(d));) {
        const char *name = de->d_name;
        char path[4200 + 80];
        struct stat st;
        const int bytes = strlen(name) == NV_FILE_ID_LEN && nv_id_well_formed(name, "file-");
        if (bytes) path_of(f, name, ".json", path, sizeof path);
        if ((bytes && lstat(path, &st) != 0 && errno == ENOENT) || (!strncmp(name, "file-", 5) && strstr(name, ".json.tmp."))) {
            path_of(f, name, "", path, sizeof path);
            unlink(path);
        }
    }
    closedir(d);
    if (e != NV_OK) {
        nv_files_close(f);
        return e;
    }
    reap(f);
    *out = f;
    return NV_OK;
}

void nv_files_close(nv_files *f) {
    if (!f) return;
    if (f->lock_fd >= 0) close(f->lock_fd); /* (the lock goes with it) */
    pthread_mutex_destroy(&f->mu);
    free(f->v);
    free(f);
}

nv_err nv_files_upload_begin(nv_files *f, nv_file_upload **out) {
    *out = NULL;
    nv_file_upload *u = calloc(1, sizeof *u);
    if (!u) return nv_fail(NV_ENOMEM, "out of memory");
    char name[64];
    nv_api_new_id(name, sizeof name, ".upload-");
    path_of(f, name, "", u->tmp, sizeof u->tmp);
    u->f = f;
    u->fd = open(u->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (u->fd < 0) {
        const int en = errno;
        free(u);
        return nv_fail(NV_EIO, "cannot write in the files' folder %s: %s", f->dir, strerror(en));
    }
    *out = u;
    return NV_OK;
}

nv_err nv_files_upload_write(nv_file_upload *u, const void *p, size_t n) {
    nv_files *f = u->f;
    pthread_mutex_lock(&f->mu);
    const int room = f->used + n <= f->max_bytes;
    if (room) f->used += n;
    pthread_mutex_unlock(&f->mu);
    if (!room)
        return nv_fail(NV_ERANGE, "the server's files would pass its limit of %llu bytes (--files-max-bytes): delete some first",
                       (unsigned long long)f->max_bytes);
    u->bytes += n;
    for (const char *s = p; n;) {
        const ssize_t w = write(u->fd, s, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return nv_fail(NV_EIO, "cannot write in the files' folder: %s", strerror(w < 0 ? errno : ENOSPC));
        s += w, n -= (size_t)w;
    }
    return NV_OK;
}

static void upload_end(nv_file_upload *u, int keep) {
    if (u->fd >= 0) close(u->fd);
    if (!keep) unlink(u->tmp);
    pthread_mutex_lock(&u->f->mu);
    u->f->used -= u->bytes; /* committed files count again through add */
    pthread_mutex_unlock(&u->f->mu);
    free(u);
}

void nv_files_upload_abort(nv_file_upload *u) {
    if (u) upload_end(u, 0);
}

/* The bytes at tmp made file i (its id, seq and time given here): its object saved, renamed, listed.
   On failure the bytes stay at tmp (an adopted file's are a batch's only copy of its answers). */
static nv_err make_file(nv_files *f, const char *tmp, nv_file_info *i, long expires_after_s) {
    char path[4200 + 80];
    nv_api_new_id(i->id, sizeof i->id, "file-");
    i->created_at = (long)time(NULL);
    i->expires_at = expires_after_s > 0 ? i->created_at + expires_after_s : 0;
    path_of(f, i->id, "", path, sizeof path);
    pthread_mutex_lock(&f->mu);
    i->seq = f->next_seq++;
    pthread_mutex_unlock(&f->mu);
    /* the record first, then the bytes under their name: a crash between leaves a record without
       bytes, which the next start removes, while the bytes are still at tmp (a batch's answers) */
    nv_err e = save_info(f, i);
    if (e != NV_OK) return e;
    if (rename(tmp, path) != 0) {
        e = nv_fail(NV_EIO, "cannot write %s: %s", path, strerror(errno));
        path_of(f, i->id, ".json", path, sizeof path);
        unlink(path);
        return e;
    }
    pthread_mutex_lock(&f->mu);
    e = add(f, i);
    pthread_mutex_unlock(&f->mu);
    return e;
}

/* A client's file name as a record keeps it: valid UTF-8 (what is not becomes U+FFFD, so the list
   stays valid JSON for strict decoders), cut at a character's edge to fit. */
static void set_filename(nv_file_info *out, const char *filename) {
    nv_buf b = {0};
    nv_utf8_sanitize(&b, filename, strlen(filename));
    size_t n = b.len < sizeof out->filename ? b.len : sizeof out->filename - 1;
    while (n > 0 && n < b.len && ((unsigned char)b.data[n] & 0xC0) == 0x80) n--; /* not inside a character */
    memcpy(out->filename, b.data ? b.data : "", n);
    out->filename[n] = '\0';
    nv_buf_free(&b);
}

nv_err nv_files_upload_commit(nv_file_upload *u, const char *filename, const char *purpose, long expires_after_s,
                              nv_file_info *out) {
    memset(out, 0, sizeof *out);
    set_filename(out, filename);
    snprintf(out->purpose, sizeof out->purpose, "%s", purpose);
    out->bytes = (int64_t)u->bytes;
    nv_err e = fsync(u->fd) == 0 ? NV_OK : nv_fail(NV_EIO, "cannot write in the files' folder: %s", strerror(errno));
    if (close(u->fd) != 0 && e == NV_OK) e = nv_fail(NV_EIO, "cannot write in the files' folder: %s", strerror(errno));
    u->fd = -1;
    if (e == NV_OK) e = make_file(u->f, u->tmp, out, expires_after_s);
    upload_end(u, 0); /* after a rename the temporary name is gone; unlink only misses */
    return e;
}

nv_err nv_files_upload_keep(nv_file_upload *u, const char *path) {
    nv_err e = fsync(u->fd) == 0 ? NV_OK : nv_fail(NV_EIO, "cannot write in the files' folder: %s", strerror(errno));
    if (close(u->fd) != 0 && e == NV_OK) e = nv_fail(NV_EIO, "cannot write in the files' folder: %s", strerror(errno));
    u->fd = -1;
    if (e == NV_OK && rename(u->tmp, path) != 0) e = nv_fail(NV_EIO, "cannot write %s: %s", path, strerror(errno));
    if (e == NV_OK) {
        free(u); /* its bytes stay counted: nv_files_release */
        return NV_OK;
    }
    upload_end(u, 0);
    return e;
}

uint64_t nv_files_max_bytes(const nv_files *f) { return f->max_bytes; }

void nv_files_hold(nv_files *f, uint64_t bytes) {
    pthread_mutex_lock(&f->mu);
    f->used += bytes;
    pthread_mutex_unlock(&f->mu);
}

int nv_files_reserve(nv_files *f, uint64_t bytes) {
    pthread_mutex_lock(&f->mu);
    const int room = f->used + bytes <= f->max_bytes;
    if (room) f->used += bytes;
    pthread_mutex_unlock(&f->mu);
    return room;
}

void nv_files_release(nv_files *f, uint64_t bytes) {
    pthread_mutex_lock(&f->mu);
    f->used -= bytes < f->used ? bytes : f->used;
    pthread_mutex_unlock(&f->mu);
}

int nv_files_purpose_ok(const char *purpose) {
    static const char *const purposes[] = {"batch", "fine-tune", "assistants", "vision", "user_data", "evals"};
    for (size_t k = 0; k < sizeof purposes / sizeof *purposes; k++)
        if (!strcmp(purpose, purposes[k])) return 1;
    return 0;
}

nv_err nv_files_adopt(nv_files *f, const char *path, const char *filename, const char *purpose, long expires_after_s,
                      nv_file_info *out) {
    memset(out, 0, sizeof *out);
    set_filename(out, filename);
    snprintf(out->purpose, sizeof out->purpose, "%s", purpose);
    struct stat st;
    if (stat(path, &st) != 0) return nv_fail(NV_EIO, "cannot read %s: %s", path, strerror(errno));
    out->bytes = (int64_t)st.st_size;
    return make_file(f, path, out, expires_after_s);
}

int nv_files_find_name(nv_files *f, const char *filename, const char *purpose, nv_file_info *out) {
    pthread_mutex_lock(&f->mu);
    reap(f);
    int at = -1;
    for (int i = f->n - 1; i >= 0 && at < 0; i--)
        if (!strcmp(f->v[i].filename, filename) && !strcmp(f->v[i].purpose, purpose)) at = i;
    if (at >= 0 && out) *out = f->v[at];
    pthread_mutex_unlock(&f->mu);
    return at >= 0;
}

int nv_files_get(nv_files *f, const char *id, nv_file_info *out) {
    pthread_mutex_lock(&f->mu);
    reap(f);
    const int i = find(f, id);
    if (i >= 0 && out) *out = f->v[i];
    pthread_mutex_unlock(&f->mu);
    return i >= 0;
}

int nv_files_open_content(nv_files *f, const char *id, nv_file_info *out) {
    pthread_mutex_lock(&f->mu);
    reap(f);
    int fd = -1;
    const int i = find(f, id);
    if (i >= 0) { /* opened under the lock: a delete after it leaves this reader its bytes */
        char path[4200 + 80];
        path_of(f, id, "", path, sizeof path);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0 && out) *out = f->v[i];
    }
    pthread_mutex_unlock(&f->mu);
    return fd;
}

int nv_files_delete(nv_files *f, const char *id) {
    pthread_mutex_lock(&f->mu);
    reap(f);
    const int i = find(f, id);
    if (i >= 0) remove_at(f, i);
    pthread_mutex_unlock(&f->mu);
    return i >= 0;
}

char *nv_files_list_json(nv_files *f, const char *purpose, int limit, int asc, const char *after) {
    cJSON *o = cJSON_CreateObject(), *data = cJSON_AddArrayToObject(o, "data");
    cJSON_AddStringToObject(o, "object", "list");
    pthread_mutex_lock(&f->mu);
    reap(f);
    int start = asc ? 0 : f->n - 1;
    const int step = asc ? 1 : -1;
    if (after) { /* the one after that id in this order; an id no longer here lists nothing */
        const int at = find(f, after);
        start = at < 0 ? (asc ? f->n : -1) : at + step;
    }
    int shown = 0, more = 0;
    const char *first = NULL, *last = NULL;
    for (int i = start; i >= 0 && i < f->n; i += step) {
        if (purpose && strcmp(f->v[i].purpose, purpose) != 0) continue;
        if (shown == limit) {
            more = 1;
            break;
        }
        cJSON_AddItemToArray(data, info_object(&f->v[i]));
        if (!first) first = f->v[i].id;
        last = f->v[i].id;
        shown++;
    }
    if (first) cJSON_AddStringToObject(o, "first_id", first), cJSON_AddStringToObject(o, "last_id", last);
    else cJSON_AddNullToObject(o, "first_id"), cJSON_AddNullToObject(o, "last_id");
    pthread_mutex_unlock(&f->mu);
    cJSON_AddBoolToObject(o, "has_more", more);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

double nv_rec_num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : 0.0;
}

const char *nv_rec_str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : "";
}

void nv_rec_put(cJSON *o, const char *key, cJSON *item) {
    if (!item) return;
    if (cJSON_GetObjectItemCaseSensitive(o, key)) cJSON_ReplaceItemInObjectCaseSensitive(o, key, item);
    else cJSON_AddItemToObject(o, key, item);
}

cJSON *nv_rec_public(const cJSON *o) {
    cJSON *c = cJSON_Duplicate(o, 1);
    for (cJSON *it = c ? c->child : NULL, *next; it; it = next) {
        next = it->next;
        if (!strncmp(it->string, "nerve_", 6)) cJSON_Delete(cJSON_DetachItemViaPointer(c, it));
    }
    return c;
}

int nv_rec_metadata_ok(const cJSON *m) {
    int n = 0;
    for (const cJSON *it = m ? m->child : NULL; it; it = it->next, n++)
        if (!cJSON_IsString(it) || strlen(it->string) > 64 || strlen(it->valuestring) > 512) return 0;
    return n <= 16;
}

int nv_rec_status(const cJSON *o, const char *const *names, int n) {
    const char *s = nv_rec_str(o, "status");
    for (int k = 0; k < n; k++)
        if (!strcmp(s, names[k])) return k;
    return -1;
}

int nv_recs_count_status(const nv_recs *r, const char *const *status_names, int n, const char **names, int *counts, int cap) {
    const int m = cap < n ? cap : n;
    for (int k = 0; k < m; k++) names[k] = status_names[k], counts[k] = 0;
    for (int i = 0; i < r->n; i++) {
        const int st = nv_rec_status(r->v[i].o, status_names, n);
        if (st >= 0 && st < m) counts[st]++;
    }
    return m;
}

nv_err nv_recs_add(nv_recs *r, const char *id, cJSON *o, uint64_t seq) {
    if (r->n == r->cap) {
        const int cap = r->cap ? 2 * r->cap : 32;
        nv_rec *v = realloc(r->v, (size_t)cap * sizeof *v);
        if (!v) return nv_fail(NV_ENOMEM, "out of memory");
        r->v = v, r->cap = cap;
    }
    int at = r->n;
    while (at > 0 && r->v[at - 1].seq > seq) at--;
    memmove(r->v + at + 1, r->v + at, (size_t)(r->n - at) * sizeof *r->v);
    snprintf(r->v[at].id, sizeof r->v[at].id, "%s", id);
    r->v[at].o = o, r->v[at].seq = seq, r->v[at].held = 0;
    r->n++;
    if (seq >= r->next_seq) r->next_seq = seq + 1;
    return NV_OK;
}

nv_rec *nv_recs_get(nv_recs *r, const char *id) {
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->v[i].id, id)) return &r->v[i];
    return NULL;
}

void nv_recs_remove(nv_recs *r, nv_rec *x) {
    const int i = (int)(x - r->v);
    cJSON_Delete(x->o);
    memmove(r->v + i, r->v + i + 1, (size_t)(r->n - i - 1) * sizeof *r->v);
    r->n--;
}

void nv_recs_free(nv_recs *r) {
    for (int i = 0; i < r->n; i++) cJSON_Delete(r->v[i].o);
    free(r->v);
    memset(r, 0, sizeof *r);
}

nv_err nv_recs_open(nv_recs *r, const char *dir, int (*id_ok)(const char *id), int (*valid)(const cJSON *o, const char *id),
                    const char *what) {
    DIR *d = opendir(dir);
    if (!d) return nv_fail(NV_EIO, "cannot read the files' folder %s: %s", dir, strerror(errno));
    nv_err e = NV_OK;
    for (struct dirent *de; e == NV_OK && (de = readdir(d));) {
        const char *name = de->d_name;
        const size_t len = strlen(name);
        if (len < 5 || len - 5 >= sizeof r->v->id || strcmp(name + len - 5, ".json") != 0) continue;
        char id[sizeof r->v->id], path[4200];
        snprintf(id, sizeof id, "%.*s", (int)(len - 5), name);
        if (!id_ok(id)) continue;
        snprintf(path, sizeof path, "%.4096s/%s", dir, name);
        uint64_t seq;
        cJSON *o = nv_files_load_record(path, &seq);
        if (!o || strcmp(nv_rec_str(o, "id"), id) != 0 || !valid(o, id)) {
            nv_warn("serve: %s is not %s whole record: not listed", path, what);
            cJSON_Delete(o);
            continue;
        }
        if ((e = nv_recs_add(r, id, o, seq)) != NV_OK) cJSON_Delete(o);
    }
    closedir(d);
    return e;
}
