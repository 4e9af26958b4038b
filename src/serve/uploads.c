/* OpenAI's Uploads API: a file sent in parts (serve/uploads.h). */
#include "serve/uploads.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <nettle/md5.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"

#define UPLOAD_TTL_S 3600            /* a pending upload expires an hour after creation, as OpenAI's */
#define UPLOAD_MAX_BYTES (8ull << 30) /* OpenAI's limit on an upload */
#define UPLOAD_MAX_PARTS 1000

struct nv_uploads {
    nv_files *files;
    pthread_mutex_t mu;
    nv_recs r; /* held: the upload is being put together (nv_uploads_complete, outside mu) */
};

enum { U_PENDING, U_COMPLETED, U_CANCELLED, U_EXPIRED, U_COUNT };
static const char *const status_names[U_COUNT] = {"pending", "completed", "cancelled", "expired"};

static int status_of(const cJSON *o) { return nv_rec_status(o, status_names, U_COUNT); }

static int id_ok(const char *id) { return nv_id_well_formed(id, "upload_"); }

static void part_path(const nv_uploads *u, const char *part_id, char *out, size_t cap) {
    snprintf(out, cap, "%.4096s/%.40s", nv_files_dir(u->files), part_id);
}

static int is_count(const cJSON *v, double most) {
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= most && v->valuedouble == (double)(long long)v->valuedouble;
}

/* A record is whole: the Upload object's fields, and each part {id, bytes, created_at}. */
static int valid(const cJSON *o, const char *id) {
    (void)id;
    const cJSON *parts = cJSON_GetObjectItemCaseSensitive(o, "nerve_parts"), *p;
    const double exp = nv_rec_num(o, "nerve_expires_after");
    int ok = !strcmp(nv_rec_str(o, "object"), "upload") && status_of(o) >= 0 &&
             (exp == 0 || (is_count(cJSON_GetObjectItemCaseSensitive(o, "nerve_expires_after"), 2592000) && exp >= 3600)) &&
             is_count(cJSON_GetObjectItemCaseSensitive(o, "bytes"), (double)UPLOAD_MAX_BYTES) &&
             nv_files_purpose_ok(nv_rec_str(o, "purpose")) && nv_rec_str(o, "filename")[0] && nv_rec_num(o, "expires_at") > 0 &&
             (!parts || cJSON_IsArray(parts));
    cJSON_ArrayForEach(p, parts) ok &= nv_id_well_formed(nv_rec_str(p, "id"), "part_") &&
                                       is_count(cJSON_GetObjectItemCaseSensitive(p, "bytes"), (double)NV_UPLOAD_PART_MAX);
    return ok;
}

static void save(const nv_uploads *u, const nv_rec *x) {
    if (nv_files_save_record(nv_files_dir(u->files), x->id, x->o, x->seq) != NV_OK)
        nv_warn("serve: upload %s: its record: %s", x->id, nv_errmsg());
}

/* The parts' files removed (parts: a record's nerve_parts, taken), their bytes given back to the
   store when it counts them (release). */
static void drop_parts(nv_uploads *u, cJSON *parts, int release) {
    const cJSON *p;
    cJSON_ArrayForEach(p, parts) {
        char path[4200];
        part_path(u, nv_rec_str(p, "id"), path, sizeof path);
        unlink(path);
        if (release) nv_files_release(u->files, (uint64_t)nv_rec_num(p, "bytes"));
    }
    cJSON_Delete(parts);
}

/* An upload ended (under mu): its record saved without its parts first, then the parts removed (a
   crash between leaves parts no record lists, which the next start removes). */
static void set_status(nv_uploads *u, nv_rec *x, int st) {
    cJSON *parts = cJSON_DetachItemFromObjectCaseSensitive(x->o, "nerve_parts");
    nv_rec_put(x->o, "status", cJSON_CreateString(status_names[st]));
    save(u, x);
    drop_parts(u, parts, 1);
}

/* Pending uploads past their hour expire; ended ones go an hour after that (under mu). */
static void reap(nv_uploads *u) {
    const double now = (double)time(NULL);
    for (int i = u->r.n - 1; i >= 0; i--) {
        nv_rec *x = &u->r.v[i];
        const double at = nv_rec_num(x->o, "expires_at");
        if (x->held || now < at) continue;
        if (status_of(x->o) == U_PENDING) set_status(u, x, U_EXPIRED);
        else if (now >= at + UPLOAD_TTL_S) {
            char path[4200];
            snprintf(path, sizeof path, "%.4096s/%.40s.json", nv_files_dir(u->files), x->id);
            unlink(path);
            nv_recs_remove(&u->r, x);
        }
    }
}

/* 1 when part_id is a part of a pending upload (under mu, or before u is shared). */
static int part_listed(const nv_uploads *u, const char *part_id) {
    for (int i = 0; i < u->r.n; i++) {
        const cJSON *p;
        cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(u->r.v[i].o, "nerve_parts")) if (!strcmp(nv_rec_str(p, "id"), part_id)) return 1;
    }
    return 0;
}

nv_err nv_uploads_open(nv_uploads **out, nv_files *files) {
    *out = NULL;
    nv_uploads *u = calloc(1, sizeof *u);
    if (!u) return nv_fail(NV_ENOMEM, "out of memory");
    u->files = files;
    pthread_mutex_init(&u->mu, NULL);
    nv_err e = nv_recs_open(&u->r, nv_files_dir(files), id_ok, valid, "an upload's");
    /* the pending uploads' parts: counted against the store's limit; a part gone missing is dropped
       from its upload (the client sees it unknown at completion) */
    for (int i = 0; e == NV_OK && i < u->r.n; i++) {
        nv_rec *x = &u->r.v[i];
        cJSON *parts = cJSON_GetObjectItemCaseSensitive(x->o, "nerve_parts");
        if (status_of(x->o) != U_PENDING) { /* (an ended upload lists none: a record edited by hand) */
            drop_parts(u, cJSON_DetachItemFromObjectCaseSensitive(x->o, "nerve_parts"), 0);
            continue;
        }
        for (int k = cJSON_GetArraySize(parts) - 1; k >= 0; k--) {
            const cJSON *p = cJSON_GetArrayItem(parts, k);
            char path[4200];
            part_path(u, nv_rec_str(p, "id"), path, sizeof path);
            struct stat st;
            if (stat(path, &st) == 0 && (double)st.st_size == nv_rec_num(p, "bytes")) {
                nv_files_hold(files, (uint64_t)st.st_size);
                continue;
            }
            nv_warn("serve: upload %s: its part %s is missing or not whole: dropped", x->id, nv_rec_str(p, "id"));
            cJSON_DeleteItemFromArray(parts, k);
            save(u, x);
        }
    }
    /* parts no pending upload lists: written by a server stopped before its record listed them */
    DIR *d = e == NV_OK ? opendir(nv_files_dir(files)) : NULL;
    for (struct dirent *de; d && (de = readdir(d));)
        if (nv_id_well_formed(de->d_name, "part_") && !part_listed(u, de->d_name)) {
            char path[4200];
            part_path(u, de->d_name, path, sizeof path);
            unlink(path);
        }
    if (d) closedir(d);
    if (e != NV_OK) {
        nv_uploads_close(u);
        return e;
    }
    reap(u);
    *out = u;
    return NV_OK;
}

void nv_uploads_close(nv_uploads *u) {
    if (!u) return;
    nv_recs_free(&u->r);
    pthread_mutex_destroy(&u->mu);
    free(u);
}

static int answer(const cJSON *o, char **out, nv_api_error *e) {
    cJSON *pub = nv_rec_public(o);
    *out = pub ? cJSON_PrintUnformatted(pub) : NULL;
    cJSON_Delete(pub);
    return *out ? 0 : nv_api_oom(e);
}

static int bad(nv_api_error *e, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(nv_api_error *e, const char *param, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    nv_api_error_set(e, 400, "invalid_request_error", "invalid_request", param, "%s", msg);
    return e->status;
}

/* The pending upload id (under mu, reaped first): its record, or NULL with the error in e — 404 when
   there is none, 409 while it is being completed, 400 once it has ended. */
static nv_rec *pending(nv_uploads *u, const char *id, nv_api_error *e) {
    reap(u);
    memset(e, 0, sizeof *e);
    nv_rec *x = id_ok(id) ? nv_recs_get(&u->r, id) : NULL;
    if (!x) nv_api_error_set(e, 404, "invalid_request_error", "not_found", "upload_id", "No upload found with id '%.60s'", id);
    else if (x->held) nv_api_error_set(e, 409, "invalid_request_error", "conflict", "upload_id", "Upload %s is being completed", id);
    else if (status_of(x->o) != U_PENDING)
        bad(e, "upload_id", "Upload %s is %s: it takes no more parts and cannot be completed or cancelled", id,
            status_names[status_of(x->o)]);
    else return x;
    return NULL;
}

void nv_uploads_reap(nv_uploads *u) {
    pthread_mutex_lock(&u->mu);
    reap(u);
    pthread_mutex_unlock(&u->mu);
}

static void room_for_part(const nv_rec *x, uint64_t bytes, nv_api_error *e);

int nv_uploads_check(nv_uploads *u, const char *id, nv_api_error *e) {
    pthread_mutex_lock(&u->mu);
    const nv_rec *x = pending(u, id, e);
    if (x) room_for_part(x, 1, e); /* a full upload's part (of at least a byte) is refused before its body is read */
    pthread_mutex_unlock(&u->mu);
    return e->status;
}

int nv_uploads_create(nv_uploads *u, const char *body, size_t len, char **out, nv_api_error *e) {
    nv_uploads_reap(u); /* (an expired upload's parts give their room back) */
    memset(e, 0, sizeof *e);
    cJSON *in = nv_api_body_object(body, len, e);
    if (!in) return e->status;
    const cJSON *filename = nv_api_field(in, "filename"), *purpose = nv_api_field(in, "purpose"), *bytes = nv_api_field(in, "bytes"),
                *mime = nv_api_field(in, "mime_type"), *exp = nv_api_field(in, "expires_after");
    long expires_after = 0;
    if (!cJSON_IsString(filename) || !filename->valuestring[0] || strlen(filename->valuestring) > 255)
        bad(e, "filename", "filename must be a string of 1 to 255 characters");
    else if (!cJSON_IsString(purpose) || !nv_files_purpose_ok(purpose->valuestring))
        bad(e, "purpose", "purpose must be one of batch, fine-tune, assistants, vision, user_data, evals");
    else if (!is_count(bytes, (double)UPLOAD_MAX_BYTES))
        bad(e, "bytes", "bytes must be a whole number from 0 to %llu (8 GiB)", (unsigned long long)UPLOAD_MAX_BYTES);
    else if (bytes->valuedouble > (double)nv_files_max_bytes(u->files))
        nv_api_error_set(e, 413, "invalid_request_error", "file_too_large", "bytes",
                         "%.0f bytes are more than the server keeps (--files-max-bytes %llu)", bytes->valuedouble,
                         (unsigned long long)nv_files_max_bytes(u->files));
    else if (!cJSON_IsString(mime) || !mime->valuestring[0] || strlen(mime->valuestring) > 255)
        bad(e, "mime_type", "mime_type must be a string (the file's MIME type, as text/jsonl)");
    else if (exp) { /* the file's: {anchor: created_at, seconds: an hour to 30 days}, as POST /v1/files takes it */
        const cJSON *secs = nv_api_field(exp, "seconds");
        if (!cJSON_IsObject(exp) || strcmp(nv_rec_str(exp, "anchor"), "created_at") != 0 || !is_count(secs, 2592000) ||
            secs->valuedouble < 3600)
            bad(e, "expires_after", "expires_after: anchor must be created_at and seconds a number from 3600 to 2592000");
        else expires_after = (long)secs->valuedouble;
    }
    if (e->status) {
        cJSON_Delete(in);
        return e->status;
    }
    char id[40];
    nv_api_new_id(id, sizeof id, "upload_");
    const double now = (double)time(NULL);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", "upload");
    cJSON_AddNumberToObject(o, "bytes", bytes->valuedouble);
    cJSON_AddNumberToObject(o, "created_at", now);
    cJSON_AddNumberToObject(o, "expires_at", now + UPLOAD_TTL_S);
    cJSON_AddStringToObject(o, "filename", filename->valuestring);
    cJSON_AddStringToObject(o, "purpose", purpose->valuestring);
    cJSON_AddStringToObject(o, "status", "pending");
    cJSON_AddNullToObject(o, "file");
    cJSON_AddNumberToObject(o, "nerve_expires_after", (double)expires_after);
    cJSON_AddArrayToObject(o, "nerve_parts");
    cJSON_Delete(in);
    char what[400];
    snprintf(what, sizeof what, "%s, %.0f bytes, purpose %s", nv_rec_str(o, "filename"), nv_rec_num(o, "bytes"), nv_rec_str(o, "purpose"));
    pthread_mutex_lock(&u->mu);
    const uint64_t seq = u->r.next_seq;
    nv_err err = nv_files_save_record(nv_files_dir(u->files), id, o, seq);
    if (err == NV_OK && (err = nv_recs_add(&u->r, id, o, seq)) != NV_OK) {
        char path[4200];
        snprintf(path, sizeof path, "%.4096s/%s.json", nv_files_dir(u->files), id);
        unlink(path);
    }
    const int rc = err == NV_OK ? answer(o, out, e) : (nv_api_error_set(e, 500, "server_error", NULL, NULL, "%s", nv_errmsg()), e->status);
    pthread_mutex_unlock(&u->mu);
    if (err != NV_OK) cJSON_Delete(o);
    else nv_info("serve: upload %s: %s", id, what);
    return rc;
}

/* Under mu: e set when upload x cannot take a part of `bytes` more: it has UPLOAD_MAX_PARTS, or its
   parts would pass 8 GiB. */
static void room_for_part(const nv_rec *x, uint64_t bytes, nv_api_error *e) {
    const cJSON *parts = cJSON_GetObjectItemCaseSensitive(x->o, "nerve_parts"), *p;
    double held = 0;
    cJSON_ArrayForEach(p, parts) held += nv_rec_num(p, "bytes");
    if (cJSON_GetArraySize(parts) >= UPLOAD_MAX_PARTS) bad(e, "upload_id", "Upload %s has %d parts, the most it may", x->id, UPLOAD_MAX_PARTS);
    else if (held + (double)bytes > (double)UPLOAD_MAX_BYTES)
        nv_api_error_set(e, 413, "invalid_request_error", "part_too_large", "data", "Upload %s's parts would pass 8 GiB", x->id);
}

int nv_uploads_add_part(nv_uploads *u, const char *id, nv_file_upload *part, uint64_t bytes, char **out, nv_api_error *e) {
    memset(e, 0, sizeof *e);
    pthread_mutex_lock(&u->mu);
    const nv_rec *x = pending(u, id, e);
    if (x) room_for_part(x, bytes, e);
    pthread_mutex_unlock(&u->mu);
    if (!e->status && bytes > NV_UPLOAD_PART_MAX)
        nv_api_error_set(e, 413, "invalid_request_error", "part_too_large", "data", "A part is at most 64 MiB");
    if (e->status) {
        nv_files_upload_abort(part);
        return e->status;
    }
    /* its bytes kept first (fsynced: slow for a large part), outside mu; listed after */
    char part_id[40], path[4200];
    nv_api_new_id(part_id, sizeof part_id, "part_");
    part_path(u, part_id, path, sizeof path);
    if (nv_files_upload_keep(part, path) != NV_OK) {
        nv_api_error_set(e, 500, "server_error", NULL, NULL, "%s", nv_errmsg());
        return e->status;
    }
    const double now = (double)time(NULL);
    pthread_mutex_lock(&u->mu);
    nv_rec *y = pending(u, id, e); /* (it may have ended, or other parts come, meanwhile) */
    if (y) room_for_part(y, bytes, e);
    if (y && !e->status) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "id", part_id);
        cJSON_AddNumberToObject(p, "bytes", (double)bytes);
        cJSON_AddNumberToObject(p, "created_at", now);
        cJSON *parts = cJSON_GetObjectItemCaseSensitive(y->o, "nerve_parts");
        if (!parts) parts = cJSON_AddArrayToObject(y->o, "nerve_parts");
        cJSON_AddItemToArray(parts, p);
        if (nv_files_save_record(nv_files_dir(u->files), y->id, y->o, y->seq) != NV_OK) {
            nv_api_error_set(e, 500, "server_error", NULL, NULL, "%s", nv_errmsg());
            cJSON_DeleteItemFromArray(parts, cJSON_GetArraySize(parts) - 1);
        }
    }
    pthread_mutex_unlock(&u->mu);
    if (e->status) {
        unlink(path);
        nv_files_release(u->files, bytes);
        return e->status;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", part_id);
    cJSON_AddStringToObject(o, "object", "upload.part");
    cJSON_AddNumberToObject(o, "created_at", now);
    cJSON_AddStringToObject(o, "upload_id", id);
    const int rc = answer(o, out, e);
    cJSON_Delete(o);
    return rc;
}

/* The parts at paths, in order, into the new file at tmp, with their md5 (hex) into md5_hex; NV_EIO. */
static nv_err join_parts(char (*paths)[4200], int n, const char *tmp, char md5_hex[2 * MD5_DIGEST_SIZE + 1]) {
    const int out = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (out < 0) return nv_fail(NV_EIO, "cannot write %s: %s", tmp, strerror(errno));
    struct md5_ctx md5;
    md5_init(&md5);
    enum { CHUNK = 1 << 20 };
    char *buf = malloc(CHUNK);
    nv_err e = buf ? NV_OK : nv_fail(NV_ENOMEM, "out of memory");
    for (int i = 0; e == NV_OK && i < n; i++) {
        const int in = open(paths[i], O_RDONLY | O_CLOEXEC);
        if (in < 0) e = nv_fail(NV_EIO, "cannot read %s: %s", paths[i], strerror(errno));
        for (ssize_t r; e == NV_OK && (r = read(in, buf, CHUNK)) != 0;) {
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) {
                e = nv_fail(NV_EIO, "cannot read %s: %s", paths[i], strerror(errno));
                break;
            }
            md5_update(&md5, (size_t)r, (const uint8_t *)buf);
            for (ssize_t done = 0; e == NV_OK && done < r;) {
                const ssize_t w = write(out, buf + done, (size_t)(r - done));
                if (w < 0 && errno == EINTR) continue;
                if (w <= 0) e = nv_fail(NV_EIO, "cannot write %s: %s", tmp, strerror(w < 0 ? errno : ENOSPC));
                else done += w;
            }
        }
        if (in >= 0) close(in);
    }
    free(buf);
    if (e == NV_OK && fsync(out) != 0) e = nv_fail(NV_EIO, "cannot write %s: %s", tmp, strerror(errno));
    if (close(out) != 0 && e == NV_OK) e = nv_fail(NV_EIO, "cannot write %s: %s", tmp, strerror(errno));
    uint8_t digest[MD5_DIGEST_SIZE];
    md5_digest(&md5, MD5_DIGEST_SIZE, digest);
    for (int i = 0; i < MD5_DIGEST_SIZE; i++) snprintf(md5_hex + 2 * i, 3, "%02x", digest[i]);
    if (e != NV_OK) unlink(tmp);
    return e;
}

int nv_uploads_complete(nv_uploads *u, const char *id, const char *body, size_t len, char **out, nv_api_error *e) {
    memset(e, 0, sizeof *e);
    cJSON *in = nv_api_body_object(body, len, e);
    if (!in) return e->status;
    const cJSON *ids = nv_api_field(in, "part_ids"), *md5 = nv_api_field(in, "md5"), *pid;
    if (!cJSON_IsArray(ids)) bad(e, "part_ids", "part_ids must be the list of the upload's part ids, in the file's order");
    else if (md5 && (!cJSON_IsString(md5) || strlen(md5->valuestring) != 2 * MD5_DIGEST_SIZE ||
                     strspn(md5->valuestring, "0123456789abcdefABCDEF") != 2 * MD5_DIGEST_SIZE))
        bad(e, "md5", "md5 must be the file's MD5 checksum, 32 hexadecimal digits");
    const int n = e->status ? 0 : cJSON_GetArraySize(ids);
    if (n > UPLOAD_MAX_PARTS) bad(e, "part_ids", "part_ids lists %d ids: an upload has at most %d parts", n, UPLOAD_MAX_PARTS);
    char(*paths)[4200] = n && !e->status ? calloc((size_t)n, sizeof *paths) : NULL;
    if (n && !paths && !e->status) nv_api_oom(e);
    char filename[256] = "", purpose[32] = "";
    long expires_after = 0;
    pthread_mutex_lock(&u->mu);
    nv_rec *x = e->status ? NULL : pending(u, id, e);
    if (x) { /* every id a part of this upload, once, and their bytes the upload's */
        const cJSON *parts = cJSON_GetObjectItemCaseSensitive(x->o, "nerve_parts");
        double total = 0;
        int k = 0;
        cJSON_ArrayForEach(pid, ids) {
            const cJSON *p = NULL, *q;
            cJSON_ArrayForEach(q, parts) if (cJSON_IsString(pid) && !strcmp(nv_rec_str(q, "id"), pid->valuestring)) p = q;
            int twice = 0;
            for (q = ids->child; p && q != pid; q = q->next) twice |= !strcmp(q->valuestring, pid->valuestring);
            if (!p || twice) {
                bad(e, "part_ids", "part_ids[%d] %s", k, !p ? "is not a part of this upload" : "is listed twice");
                break;
            }
            part_path(u, pid->valuestring, paths[k++], sizeof *paths);
            total += nv_rec_num(p, "bytes");
        }
        if (!e->status && total != nv_rec_num(x->o, "bytes"))
            bad(e, "part_ids", "The parts hold %.0f bytes, not the %.0f the upload was created with", total, nv_rec_num(x->o, "bytes"));
        if (!e->status) {
            x->held = 1;
            snprintf(filename, sizeof filename, "%s", nv_rec_str(x->o, "filename"));
            snprintf(purpose, sizeof purpose, "%s", nv_rec_str(x->o, "purpose"));
            expires_after = (long)nv_rec_num(x->o, "nerve_expires_after");
        }
    }
    pthread_mutex_unlock(&u->mu);
    if (e->status) {
        free(paths);
        cJSON_Delete(in);
        return e->status;
    }
    /* put together outside mu (gigabytes, maybe); held keeps the upload as it is meanwhile */
    char tmp[4200], got[2 * MD5_DIGEST_SIZE + 1];
    char name[64];
    nv_api_new_id(name, sizeof name, ".upload-"); /* (the store removes one a crash leaves) */
    snprintf(tmp, sizeof tmp, "%.4096s/%s", nv_files_dir(u->files), name);
    nv_err err = join_parts(paths, n, tmp, got);
    free(paths);
    nv_file_info fi;
    if (err == NV_OK && md5 && strcasecmp(got, md5->valuestring) != 0) {
        unlink(tmp);
        bad(e, "md5", "The parts' MD5 checksum is %s, not %s: the upload stays pending", got, md5->valuestring);
    } else if (err == NV_OK && (err = nv_files_adopt(u->files, tmp, filename, purpose, expires_after, &fi)) != NV_OK) {
        unlink(tmp);
    }
    cJSON_Delete(in);
    if (err != NV_OK) nv_api_error_set(e, 500, "server_error", NULL, NULL, "%s", nv_errmsg());
    pthread_mutex_lock(&u->mu);
    x = nv_recs_get(&u->r, id); /* (held: still there) */
    x->held = 0;
    int rc = e->status;
    if (!rc) {
        char *file = nv_file_json(&fi);
        nv_rec_put(x->o, "file", file ? cJSON_Parse(file) : cJSON_CreateNull());
        free(file);
        set_status(u, x, U_COMPLETED); /* every part goes, listed or not (a crash since the file was made leaves the upload
                                          pending: completed again, it makes a second file) */
        rc = answer(x->o, out, e);
    }
    pthread_mutex_unlock(&u->mu);
    if (!e->status) nv_info("serve: upload %s completed: file %s, %lld bytes", id, fi.id, (long long)fi.bytes);
    return rc;
}

int nv_uploads_cancel(nv_uploads *u, const char *id, char **out, nv_api_error *e) {
    memset(e, 0, sizeof *e);
    pthread_mutex_lock(&u->mu);
    nv_rec *x = pending(u, id, e);
    if (x) set_status(u, x, U_CANCELLED);
    const int rc = x ? answer(x->o, out, e) : e->status;
    pthread_mutex_unlock(&u->mu);
    return rc;
}
