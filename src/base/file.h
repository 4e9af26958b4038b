/* Read-only file mapping and a bounds-checked reader over untrusted bytes.
 *
 * Contract: nv_file_map() maps a whole file (an empty file maps to len 0, data NULL).
 * nv_reader never reads past its end: every read returns NV_EFORMAT with a message naming
 * what was being read when too few bytes remain. Writers: nv_file_write_atomic() writes a
 * temporary file beside the target, fsyncs it and renames it over the target, so a reader
 * sees either the old or the new file, never a torn one. */
#ifndef NV_FILE_H
#define NV_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

typedef struct {
    const uint8_t *data;
    size_t len;
} nv_mapped;

nv_err nv_file_map(const char *path, nv_mapped *out);
/* As nv_file_map, but a gzip file named ".gz" is decompressed into memory of its own (every member,
 * as gzip -d writes them one after another; released by nv_file_unmap alike): training data kept
 * compressed. One that decompresses past the machine's memory, or is not whole, is refused. */
nv_err nv_file_map_data(const char *path, nv_mapped *out);
/* Whether path names a ".gz" file (nv_file_map_data decompresses it). */
int nv_file_gz(const char *path);
void nv_file_unmap(nv_mapped *m);
/* Lets go of the pages of [p, p + len) inside a mapping (read again from the file if touched
 * again): what a loader has converted need not stay in the process's memory until the unmap. */
void nv_file_release(const void *p, size_t len);

typedef struct {
    const uint8_t *p;
    size_t len, pos;
    const char *what; /* file name used in error messages */
} nv_reader;

static inline nv_reader nv_reader_make(const void *p, size_t len, const char *what) {
    nv_reader r = {(const uint8_t *)p, len, 0, what};
    return r;
}
static inline size_t nv_reader_left(const nv_reader *r) { return r->len - r->pos; }
nv_err nv_read_bytes(nv_reader *r, void *dst, size_t n, const char *field);
/* Returns a pointer into the buffer (no copy) after checking n bytes remain. */
nv_err nv_read_view(nv_reader *r, const void **dst, size_t n, const char *field);
nv_err nv_read_u8(nv_reader *r, uint8_t *v, const char *field);
nv_err nv_read_u32(nv_reader *r, uint32_t *v, const char *field);
nv_err nv_read_i32(nv_reader *r, int32_t *v, const char *field);
nv_err nv_read_u64(nv_reader *r, uint64_t *v, const char *field);
nv_err nv_read_f32(nv_reader *r, float *v, const char *field);

/* Writes the concatenation of n (ptr,len) parts to path atomically (a new temporary file, fsync,
 * rename, the folder synced), with the mode of the file it replaces. */
typedef struct {
    const void *ptr;
    size_t len;
} nv_iov;
nv_err nv_file_write_atomic(const char *path, const nv_iov *parts, int n);
/* n_files files written so, all or none: every temporary file written and synced before the first
 * rename (a rename failing part way, which a full disk cannot cause, says how many were replaced). */
typedef struct {
    const char *path;
    const nv_iov *parts;
    int n;
} nv_file_out;
nv_err nv_file_write_atomic_set(const nv_file_out *files, int n_files);
/* For a single-threaded command: SIGINT, SIGTERM and SIGHUP (those left at their default) remove
 * the temporary file of an atomic write in progress before the process dies of them. */
void nv_file_clean_on_signals(void);
/* The folder holding path synced, so a rename in it outlives a power cut. */
void nv_file_sync_parent(const char *path);

/* Reads a whole small file into a NUL-terminated heap buffer (caller frees). */
nv_err nv_file_read_all(const char *path, char **out, size_t *len);

/* Directory holding the shared data: $NERVE_DATA, else ../shared/data beside the checkout
 * (found relative to the executable, then to the working directory). Writes the path of
 * rel inside it to buf. Returns 1 when that file exists, 0 otherwise. */
int nv_data_path(const char *rel, char *buf, size_t cap);

/* mkdir -p: creates path and its missing parents (mode 0755). */
nv_err nv_mkdirs(const char *path);
/* The same, the folders it makes readable by their owner alone (0700): for what holds users' data. */
nv_err nv_mkdirs_private(const char *path);
int nv_file_exists(const char *path);
/* Now (ns since the epoch) on the clock the kernel stamps files' times with (the coarse one). */
int64_t nv_file_clock_ns(void);
/* Removes the files names[0, n) from dir (those absent ignored), then dir itself when that leaves it
 * empty: what a command wrote into a folder of its own, taken back. */
void nv_remove_in_dir(const char *dir, const char *const *names, size_t n);
/* The same without removing dir. */
void nv_unlink_in_dir(const char *dir, const char *const *names, size_t n);
/* 1 when path names a folder (symbolic links followed). */
int nv_file_is_dir(const char *path);
/* Process pid's state letter as /proc/PID/stat gives it (R, S, T, Z, ...), 0 when there is no such
   process. */
char nv_proc_state(int pid);
/* When process pid started (/proc/pid/stat's starttime, clock ticks since boot; 0 when unknown): with
   its pid, what tells a process from a later one given the same pid. */
unsigned long long nv_proc_start_time(int pid);
/* A path's last component without its extension, into out ("runs/demo/" -> "demo", "m/x.gguf" ->
 * "x"): the server's model id, a GGUF's general.name (export, and a training run's model.gguf). */
void nv_path_name(const char *path, char *out, size_t cap);

#endif
