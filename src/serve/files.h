/* OpenAI's Files API's store (`nerve serve --files-dir DIR`): uploaded files and the Batch API's
 * results, kept in a folder so they outlive the server.
 *
 * Contract:
 * - A file is DIR/ID (its bytes) and DIR/ID.json (its File object and the order it came in); ids are
 *   "file-" and 24 hex digits. Both are written whole before the file is listed: the object first
 *   (atomically), then the bytes (a temporary DIR/.upload-* fsynced) renamed in; a file is removed
 *   object first, then bytes. So a crash leaves a file whole or a half no one lists: nv_files_open
 *   lists what the folder holds and removes those halves (an object without its bytes, bytes
 *   without an object, an object's unfinished temporary copy) and what an interrupted upload left;
 *   it skips (with a warning) an object that is not one of ours or whose bytes are of another size.
 * - The folder is its owner's alone (0700); names are kept as valid UTF-8.
 * - max_bytes bounds the bytes of every file and upload under way together: a write past it fails.
 * - A file past its expires_at is removed the next time the store is read (as absent already).
 * - Every function is safe from any thread. An id from a request is checked before it names a path. */
#ifndef NV_SERVE_FILES_H
#define NV_SERVE_FILES_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

#define NV_FILE_ID_LEN 29 /* "file-" + 24 hex digits */

typedef struct {
    char id[NV_FILE_ID_LEN + 1];
    char filename[256];
    char purpose[32];
    int64_t bytes;
    long created_at;
    long expires_at; /* when it goes (OpenAI's expires_after), 0: never */
    uint64_t seq; /* the order files came in (created_at repeats within a second) */
} nv_file_info;

typedef struct nv_files nv_files;
typedef struct nv_file_upload nv_file_upload;

nv_err nv_files_open(nv_files **out, const char *dir, uint64_t max_bytes);
void nv_files_close(nv_files *f);
const char *nv_files_dir(const nv_files *f);
/* Files held and their bytes. */
void nv_files_usage(nv_files *f, int *n, uint64_t *bytes);

/* An upload: begin, write its bytes as they come, then commit (it becomes a file) or abort. */
nv_err nv_files_upload_begin(nv_files *f, nv_file_upload **out);
/* NV_ERANGE (nv_errmsg says the store's limit) when the bytes would pass max_bytes; NV_EIO. */
nv_err nv_files_upload_write(nv_file_upload *u, const void *p, size_t n);
/* Ends u either way; expires_after_s > 0: the file goes that long after its creation. */
nv_err nv_files_upload_commit(nv_file_upload *u, const char *filename, const char *purpose, long expires_after_s,
                              nv_file_info *out);
void nv_files_upload_abort(nv_file_upload *u);

/* The file at path (in the store's folder) made a file of the store, renamed to its id: the Batch
 * API's results, a fine-tuning job's, an upload's parts put together; kept even past max_bytes (a
 * batch's answers are not thrown away); expires_after_s as nv_files_upload_commit's. */
nv_err nv_files_adopt(nv_files *f, const char *path, const char *filename, const char *purpose, long expires_after_s,
                      nv_file_info *out);
/* Ends u keeping its bytes at path (in the store's folder, not a file of the store: an upload's part),
 * fsynced and renamed; they stay counted against max_bytes until nv_files_release gives them back
 * (nv_files_hold counts such bytes found when the server starts). */
nv_err nv_files_upload_keep(nv_file_upload *u, const char *path);
void nv_files_hold(nv_files *f, uint64_t bytes);
/* The same when there is room under max_bytes (1), else nothing counted (0). */
int nv_files_reserve(nv_files *f, uint64_t bytes);
uint64_t nv_files_max_bytes(const nv_files *f);
void nv_files_release(nv_files *f, uint64_t bytes);
/* 1 when purpose is one a file may have (batch, fine-tune, assistants, vision, user_data, evals). */
int nv_files_purpose_ok(const char *purpose);

/* 1 when the store holds a file of that name and purpose (the newest such in *out), else 0. */
int nv_files_find_name(nv_files *f, const char *filename, const char *purpose, nv_file_info *out);
/* 1 when id is a file of the store (its object in *out when out is not NULL), else 0. */
int nv_files_get(nv_files *f, const char *id, nv_file_info *out);
/* The file's bytes open for reading (the caller closes it), or -1 when there is no such file. */
int nv_files_open_content(nv_files *f, const char *id, nv_file_info *out);
/* 1 when the file was removed, 0 when there is no such file. */
int nv_files_delete(nv_files *f, const char *id);

/* The File object (malloc'd JSON; NULL when out of memory). */
char *nv_file_json(const nv_file_info *i);
/* GET /v1/files: the files of purpose (NULL: all), newest first unless asc, after the id given
 * (NULL: from the first), at most limit; {"object": "list", "data", "first_id", "last_id",
 * "has_more"}. NULL when out of memory. */
char *nv_files_list_json(nv_files *f, const char *purpose, int limit, int asc, const char *after);

/* The end of an upload's multipart body, its close delimiter "--BOUNDARY--", found in its bytes as
 * they come however they are split: what follows it (the epilogue, a line break some clients send,
 * as the OpenAI SDK does) may be dropped, as RFC 2046 allows; libmicrohttpd's processor refuses any
 * byte after the delimiter. */
typedef struct {
    char delim[112];
    size_t len;
    char tail[112]; /* the last len - 1 bytes seen: where a delimiter split between two reads begins */
    size_t tail_len;
    int closed;
} nv_multipart_end;
/* From a multipart/form-data Content-Type's boundary parameter (quoted or not): 1, or 0 when the type is
 * another or names no usable boundary. */
int nv_multipart_end_init(nv_multipart_end *m, const char *content_type);
/* How many of the n bytes at p belong to the body: n, or up to the delimiter's end when it ends
 * among them; 0 once it has ended. */
size_t nv_multipart_end_scan(nv_multipart_end *m, const char *p, size_t n);

/* The folder's records (a file's object, a batch's): DIR/ID.json holds object o and its order
 * ("nerve_seq"), written atomically. */
typedef struct cJSON cJSON;
nv_err nv_files_save_record(const char *dir, const char *id, const cJSON *o, uint64_t seq);
/* A record read back: its object with nerve_seq taken out into *seq, or NULL when it is not a JSON
 * object with one. */
cJSON *nv_files_load_record(const char *path, uint64_t *seq);

/* A folder's records of one kind (batches, fine-tuning jobs) in the order they came (seq ascending):
 * each its id, its object, its order, and held (the runner's own mark, not saved). */
typedef struct {
    char id[40];
    cJSON *o;
    uint64_t seq;
    int held;
} nv_rec;
typedef struct {
    nv_rec *v;
    int n, cap;
    uint64_t next_seq; /* the order the next new record takes */
} nv_recs;
/* Every DIR/ID.json whose id id_ok accepts and whose record valid(o, id) keeps (else skipped with a
 * warning that it is not a whole `what` record); NV_EIO when DIR cannot be read. */
nv_err nv_recs_open(nv_recs *r, const char *dir, int (*id_ok)(const char *id), int (*valid)(const cJSON *o, const char *id),
                    const char *what);
/* The index of o's "status" in names[0..n), -1 when it is none of them. */
int nv_rec_status(const cJSON *o, const char *const *names, int n);
/* How many of r's records are in each of the first cap statuses of names[0..n): names[i] and
   counts[i] for the i < the returned number. */
int nv_recs_count_status(const nv_recs *r, const char *const *status_names, int n, const char **names, int *counts, int cap);
/* o (taken on success) as record id of order seq, in its place. */
nv_err nv_recs_add(nv_recs *r, const char *id, cJSON *o, uint64_t seq);
/* The record of id, or NULL. */
nv_rec *nv_recs_get(nv_recs *r, const char *id);
/* x (one of r's) taken out and freed. */
void nv_recs_remove(nv_recs *r, nv_rec *x);
void nv_recs_free(nv_recs *r);

/* A record's fields: a number (0 when absent), a string ("" when absent); o[key] = item (taken; a
 * number, a string, null, an object), in the place the key had; a copy without the record's own
 * fields ("nerve_*": not the API's), NULL when out of memory. */
double nv_rec_num(const cJSON *o, const char *key);
const char *nv_rec_str(const cJSON *o, const char *key);
void nv_rec_put(cJSON *o, const char *key, cJSON *item);
cJSON *nv_rec_public(const cJSON *o);
/* OpenAI's metadata: at most 16 pairs of strings, keys of up to 64 characters, values of up to 512. */
int nv_rec_metadata_ok(const cJSON *m);

/* 1 when s is an id of the form prefix + 24 lowercase hex digits. */
int nv_id_well_formed(const char *s, const char *prefix);

#endif
