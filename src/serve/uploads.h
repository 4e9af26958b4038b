/* OpenAI's Uploads API (`nerve serve --files-dir DIR`): a file sent in parts, each its own request
 * (POST /v1/uploads, then /v1/uploads/ID/parts as often as needed, in any order and at once, then
 * /v1/uploads/ID/complete naming the parts in their order), which becomes a file of the store
 * (serve/files.h) — the way OpenAI's SDKs send a large file.
 *
 * Contract:
 * - An upload is DIR/ID.json (its Upload object, its parts and order; ids "upload_" and 24 hex
 *   digits), written atomically at each change; a part's bytes are DIR/part_ + 24 hex digits, written
 *   whole (the store's temporary file, fsynced, renamed) before the record lists it. Parts count
 *   against the store's --files-max-bytes from their first byte until they are removed.
 * - pending -> completed (its parts, in the order given, checked against the bytes declared and an
 *   md5 when one is given, become one file, the parts removed), cancelled (the parts removed), or
 *   expired (an hour after creation, not completed: the parts removed). An ended upload's record is
 *   removed an hour after it expired (or would have).
 * - A part is at most 64 MiB, an upload (its declared bytes, its parts together) at most 8 GiB and
 *   1,000 parts, and its bytes no more than the store's limit.
 * - A server started again finds its pending uploads whole (a part whose record was not written is
 *   removed) and their parts' bytes counted.
 * - Every function is safe from any thread. */
#ifndef NV_SERVE_UPLOADS_H
#define NV_SERVE_UPLOADS_H

#include <stddef.h>
#include <stdint.h>

#include "serve/api.h"
#include "serve/files.h"

#define NV_UPLOAD_PART_MAX (64ull << 20)

typedef struct nv_uploads nv_uploads;

nv_err nv_uploads_open(nv_uploads **out, nv_files *files);
void nv_uploads_close(nv_uploads *u);

/* Pending uploads past their hour expired (their parts' room given back): before a file is written. */
void nv_uploads_reap(nv_uploads *u);
/* 0 when upload id takes parts (pending), else the error's status in e: a part's body is checked for
 * it before it is read. */
int nv_uploads_check(nv_uploads *u, const char *id, nv_api_error *e);

/* The endpoints: 0 with the JSON answer in *out (malloc'd), else the error in e (its status). */
/* POST /v1/uploads: {filename, purpose, bytes, mime_type, expires_after?} (expires_after the file's). */
int nv_uploads_create(nv_uploads *u, const char *body, size_t len, char **out, nv_api_error *e);
/* POST /v1/uploads/ID/parts, its data (bytes of them) read into part (taken: kept or aborted here). */
int nv_uploads_add_part(nv_uploads *u, const char *id, nv_file_upload *part, uint64_t bytes, char **out, nv_api_error *e);
/* POST /v1/uploads/ID/complete: {part_ids: [...], md5?}. */
int nv_uploads_complete(nv_uploads *u, const char *id, const char *body, size_t len, char **out, nv_api_error *e);
/* POST /v1/uploads/ID/cancel. */
int nv_uploads_cancel(nv_uploads *u, const char *id, char **out, nv_api_error *e);

#endif
