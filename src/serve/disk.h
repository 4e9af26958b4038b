/* The prefix cache's SSD tier: one file per full KV block, written by a background thread,
 * indexed again at start so cached prefixes survive a restart.
 *
 * Contract:
 * - Files live in ROOT/<model identity as 16 hex digits>/ (so servers of different models can
 *   share ROOT without seeing each other's blocks), or ROOT/<identity>-<part>/ for a part of the
 *   model's layers (split pages: "full" for the whole-context layers, "windowed" for the others),
 *   one per block, named <block hash>.kvb:
 *
 *     offset  size  field (little-endian)
 *      0      8     magic "NVKVBLK\0"
 *      8      4     format version (NV_DISK_VERSION)
 *     12      4     header bytes (80 + 4 x token count)
 *     16      8     model identity (serve/prefix.h; for a part, nv_hash64 of the part's name
 *                   seeded with it, so one part's file never passes for the other's)
 *     24      8     block hash (the chain hash; also the file name)
 *     32      8     parent block hash (a first block: 0, or its LoRA adapters' identity)
 *     40      4     token count (= block size)
 *     44      4     element type (1: fp32, 2: fp16, 3: q8; model/batch.h nv_kv_dtype)
 *     48      4     layer count
 *     52      4     kv_dim
 *     56      8     payload bytes (= nv_kv_geometry_bytes: layers x 2 x block x kv_dim x element
 *                   bytes, and for q8 the padding and scales)
 *     64      8     payload checksum (nv_hash64)
 *     72      8     header checksum (nv_checksum64 of bytes 0..71 and the token ids)
 *     80      4n    the block's token ids
 *     80+4n   ...   payload: the pool block as it is in memory (serve/kv.h, model/batch.h)
 *
 * - The model's folder is made 0700 and the files 0600: they hold the prompts' tokens.
 * - Writes (nv_disk_enqueue) never block: a job is queued when fewer than queue_cap jobs are
 *   outstanding (queued, being written, or done but not yet reaped), otherwise it is dropped
 *   and counted. The writer thread writes the file under a temporary name (pid, a random salt and
 *   a counter) and renames it into place (no fsync: a file torn by a crash fails its size or
 *   header checksum at the next start, or its payload checksum at its first load, and is removed).
 *   The job's payload and tokens must stay unchanged until nv_disk_reap() hands its block back
 *   (the scheduler holds a pool reference on the block until then).
 * - The tier is capped at max_bytes of this model's files: before a write, the least recently
 *   used files are removed to make room (a load counts as a use, and so does a hit of the block
 *   in RAM, nv_disk_touch; the file's mtime records them, at the load or at close, so the order
 *   survives a restart).
 * - A disk filled by others first costs up to 8 of the least recently used files and one more
 *   try. A fault of one file (a folder under its name, a temporary name taken) drops that block
 *   alone. Any other write error (disk still full, read-only or vanished directory, file size
 *   limit) stops the writer with one warning; queued jobs are then handed back unwritten and later
 *   ones dropped. Lookups and loads of the files already there go on.
 * - nv_disk_open() indexes the model's directory: every *.kvb file is checked — magic, version,
 *   model identity, geometry, header checksum, the chain hash recomputed from its parent and
 *   tokens against the header and the name, and the exact file size — and any that fails is
 *   removed, never used (one that cannot be opened for want of descriptors is left for a later
 *   start). Files are opened non-blocking: a FIFO under a block's name is not a block and never
 *   waits for a writer. Temporary files older than a minute (a crash's leftovers) are removed.
 *   Out of memory while indexing, the tier is not opened. One folder serves one process: two
 *   servers of one model on one folder would each keep to the cap only the files it knows.
 *   The payload checksum is verified on every load (nv_disk_load), which removes a file that
 *   fails it, so a block that rotted after the index is not used either.
 * - Thread-safe: the scheduler thread looks up, loads, enqueues and reaps while the writer
 *   thread writes and evicts; one mutex guards the index. nv_disk_close() lets the writer finish
 *   the queue, joins it; after it, nv_disk_reap() still hands back the last jobs' blocks. */
#ifndef NV_SERVE_DISK_H
#define NV_SERVE_DISK_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "model/batch.h"

#define NV_DISK_VERSION 1u
#define NV_DISK_HEADER_BYTES 80

typedef struct {
    const char *root;   /* the cache directory */
    const char *part;   /* the layers the blocks hold, when not all: the directory's suffix (NULL: all) */
    uint64_t model_id;
    int block_size, n_layers, kv_dim, n_kv_heads;
    nv_kv_dtype dtype;  /* the pages' element type */
    uint64_t max_bytes; /* cap on this model's files */
    int queue_cap;      /* outstanding write jobs */
} nv_disk_opts;

typedef struct {
    uint64_t hash, parent;
    const int32_t *tokens; /* block_size ids */
    const void *payload;   /* the block's bytes */
    int32_t block;         /* handed back by nv_disk_reap() */
} nv_disk_job;

typedef struct {
    int writer_up; /* 0 once the writer stopped on an error */
    long files;
    uint64_t bytes, max_bytes;
    int queue_depth; /* queued or being written */
    uint64_t writes, write_drops, write_errors, evictions, rejected, loads, load_failures;
} nv_disk_stats;

typedef struct nv_disk nv_disk;

/* Creates ROOT/<model>/ when missing, indexes it and starts the writer. */
nv_err nv_disk_open(nv_disk **out, const nv_disk_opts *o);
/* Lets the writer finish the queue and joins it (nv_disk_reap then hands back every block). */
void nv_disk_close(nv_disk *d);
/* Frees a closed tier. */
void nv_disk_free(nv_disk *d);
/* The model's directory. */
const char *nv_disk_dir(const nv_disk *d);
/* Bytes of one block file. */
uint64_t nv_disk_file_bytes(const nv_disk *d);

/* 1 when a usable file of this block is on disk. */
int nv_disk_has(nv_disk *d, uint64_t hash);
/* A use of the block from RAM: its file becomes the most recently used (at close its mtime says
 * so), so a prefix that keeps hitting in RAM is not the first evicted from disk (its first blocks,
 * written first, would otherwise go first and cut every later one off). */
void nv_disk_touch(nv_disk *d, uint64_t hash);
/* 1 when the block is on disk or queued to be written. */
int nv_disk_known(nv_disk *d, uint64_t hash);
/* Queues a write; 1 queued, 0 dropped (queue full, writer stopped, or already known). */
int nv_disk_enqueue(nv_disk *d, const nv_disk_job *j);
/* Hands back the blocks of finished jobs (written or not); returns how many (at most cap). */
int nv_disk_reap(nv_disk *d, int32_t *blocks, int cap);
/* Asks the kernel to start reading the block's file (readahead), so the reads of a long prefix
 * proceed in parallel; a hint only. */
void nv_disk_prefetch(nv_disk *d, uint64_t hash);
/* Reads the block into payload after checking it is exactly (hash, parent, tokens) and its
 * checksum: 1 on success; 0 when it is not there or fails a check (the file is then removed). */
int nv_disk_load(nv_disk *d, uint64_t hash, uint64_t parent, const int *tokens, void *payload);
void nv_disk_stats_get(nv_disk *d, nv_disk_stats *st);

#endif
