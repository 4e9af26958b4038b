#include "serve/disk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "base/hash.h"
#include "base/log.h"
#include "serve/prefix.h"

static const char DISK_MAGIC[8] = {'N', 'V', 'K', 'V', 'B', 'L', 'K', '\0'};
#define TMP_MAX_AGE_S 60

typedef struct {
    char magic[8];
    uint32_t version, header_bytes;
    uint64_t model_id, hash, parent;
    uint32_t n_tokens, dtype, n_layers, kv_dim;
    uint64_t payload_bytes, payload_sum, header_sum;
} disk_header;
_Static_assert(sizeof(disk_header) == NV_DISK_HEADER_BYTES, "the block file header is 80 bytes");

enum { E_FREE = 0, E_WRITING, E_READY };

typedef struct {
    uint64_t hash;
    int64_t stamp; /* last use (mtime, ns) */
    int32_t prev, next;
    uint8_t state;
    uint8_t touched; /* used from RAM since the start: its mtime is brought up to date at close */
} entry;

struct nv_disk {
    nv_disk_opts o;
    char dir[4096];
    uint64_t payload_bytes, file_bytes;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int started, closing;
    /* the index */
    nv_map64 map; /* hash -> entry */
    entry *e;
    int32_t n_e, cap_e, free_e; /* free_e: a list of free entries through next */
    int32_t lru_head, lru_tail;
    /* the writer's queue and the finished jobs */
    nv_disk_job *q;
    int q_head, q_n, in_flight;
    int32_t *done;
    int d_head, d_n;
    uint64_t tmp_counter, tmp_salt; /* temporary names: a counter and this process's random salt */
    uint64_t tier_id; /* the headers' identity: the model's, mixed with the part's name for a part of its layers */
    nv_disk_stats st;
};

/* ---- the index (lock held) ---------------------------------------------------------------------- */

static int32_t entry_new(nv_disk *d, uint64_t hash, uint8_t state) {
    int32_t i;
    if (d->free_e >= 0) {
        i = d->free_e;
        d->free_e = d->e[i].next;
    } else {
        if (d->n_e == d->cap_e) {
            int32_t cap = d->cap_e ? d->cap_e * 2 : 256;
            entry *ne = realloc(d->e, (size_t)cap * sizeof *ne);
            if (!ne) return -1;
            d->e = ne;
            d->cap_e = cap;
        }
        i = d->n_e++;
    }
    if (nv_map64_put(&d->map, hash, i) != NV_OK) {
        d->e[i].state = E_FREE;
        d->e[i].next = d->free_e;
        d->free_e = i;
        return -1;
    }
    d->e[i] = (entry){.hash = hash, .stamp = 0, .prev = -1, .next = -1, .state = state};
    return i;
}

static void lru_unlink(nv_disk *d, int32_t i) {
    entry *x = &d->e[i];
    if (x->prev >= 0) d->e[x->prev].next = x->next;
    else d->lru_head = x->next;
    if (x->next >= 0) d->e[x->next].prev = x->prev;
    else d->lru_tail = x->prev;
    x->prev = x->next = -1;
}

static void lru_push(nv_disk *d, int32_t i) {
    entry *x = &d->e[i];
    x->prev = d->lru_tail;
    x->next = -1;
    if (d->lru_tail >= 0) d->e[d->lru_tail].next = i;
    else d->lru_head = i;
    d->lru_tail = i;
}

/* Forgets entry i (a ready one leaves the LRU list and the byte count). */
static void entry_drop(nv_disk *d, int32_t i) {
    entry *x = &d->e[i];
    if (x->state == E_READY) {
        lru_unlink(d, i);
        d->st.files--;
        d->st.bytes -= d->file_bytes;
    }
    nv_map64_del(&d->map, x->hash);
    x->state = E_FREE;
    x->next = d->free_e;
    d->free_e = i;
}

static void block_path(const nv_disk *d, uint64_t hash, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/%016" PRIx64 ".kvb", d->dir, hash);
}

/* Removes the least recently used file. */
static void evict_head(nv_disk *d) {
    int32_t i = d->lru_head;
    if (i < 0) return;
    char path[4200];
    block_path(d, d->e[i].hash, path, sizeof path);
    unlink(path);
    entry_drop(d, i);
    d->st.evictions++;
}

/* ---- file format ---------------------------------------------------------------------------------- */

static uint64_t header_sum(const disk_header *h, const int32_t *tokens, uint32_t n) {
    uint64_t s = nv_checksum64(h, offsetof(disk_header, header_sum), 0);
    return nv_checksum64(tokens, (size_t)n * 4, s);
}

/* Checks a header and its tokens against this tier; 1 when they describe a usable block. */
static int header_ok(const nv_disk *d, const disk_header *h, const int32_t *tokens) {
    const nv_disk_opts *o = &d->o;
    if (memcmp(h->magic, DISK_MAGIC, 8) != 0 || h->version != NV_DISK_VERSION) return 0;
    if (h->header_bytes != NV_DISK_HEADER_BYTES + 4u * (uint32_t)o->block_size) return 0;
    if (h->model_id != d->tier_id || h->n_tokens != (uint32_t)o->block_size || h->dtype != (uint32_t)o->dtype ||
        h->n_layers != (uint32_t)o->n_layers || h->kv_dim != (uint32_t)o->kv_dim || h->payload_bytes != d->payload_bytes)
        return 0;
    if (h->header_sum != header_sum(h, tokens, h->n_tokens)) return 0;
    /* the name of the block is what its parent and tokens hash to */
    return h->hash == nv_prefix_chain(o->model_id, h->parent, (const int *)tokens, o->block_size);
}

/* A block file opened to read: not following a link, not waiting on a FIFO put under its name. */
static int open_block(const char *path) { return open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK); }

static int read_full(int fd, void *buf, size_t n, off_t off) {
    uint8_t *p = buf;
    while (n) {
        ssize_t k = pread(fd, p, n, off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return 0;
        p += k;
        n -= (size_t)k;
        off += k;
    }
    return 1;
}

/* Reads and checks the header and tokens of an open block file of the expected size. */
static int read_header(const nv_disk *d, int fd, disk_header *h, int32_t *tokens) {
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != d->file_bytes) return 0;
    if (!read_full(fd, h, sizeof *h, 0)) return 0;
    if (memcmp(h->magic, DISK_MAGIC, 8) != 0 || h->n_tokens != (uint32_t)d->o.block_size) return 0;
    if (!read_full(fd, tokens, (size_t)d->o.block_size * 4, NV_DISK_HEADER_BYTES)) return 0;
    return header_ok(d, h, tokens);
}

/* Writes one block file (tmp + rename); 0 on success, else errno with what failed in why. */
static int write_block(nv_disk *d, const nv_disk_job *j, uint64_t counter, char *why, size_t cap) {
    const nv_disk_opts *o = &d->o;
    disk_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, DISK_MAGIC, 8);
    h.version = NV_DISK_VERSION;
    h.header_bytes = NV_DISK_HEADER_BYTES + 4u * (uint32_t)o->block_size;
    h.model_id = d->tier_id;
    h.hash = j->hash;
    h.parent = j->parent;
    h.n_tokens = (uint32_t)o->block_size;
    h.dtype = (uint32_t)o->dtype;
    h.n_layers = (uint32_t)o->n_layers;
    h.kv_dim = (uint32_t)o->kv_dim;
    h.payload_bytes = d->payload_bytes;
    h.payload_sum = nv_hash64(j->payload, d->payload_bytes, 0);
    h.header_sum = header_sum(&h, j->tokens, h.n_tokens);
    char path[4200], tmp[4300];
    block_path(d, j->hash, path, sizeof path);
    /* (the salt: two containers sharing the directory may both be pid 1) */
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%" PRIx64 ".%" PRIu64, path, (long)getpid(), d->tmp_salt, counter);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600); /* the prompt's tokens are in it: the user's alone */
    if (fd < 0) {
        int e = errno;
        snprintf(why, cap, "cannot create %s: %s", tmp, strerror(e));
        return e ? e : EIO;
    }
    struct iovec iov[3] = {{&h, sizeof h},
                           {(void *)(uintptr_t)j->tokens, (size_t)o->block_size * 4},
                           {(void *)(uintptr_t)j->payload, d->payload_bytes}};
    int iv = 0, err = 0;
    while (iv < 3) {
        ssize_t k = writev(fd, iov + iv, 3 - iv);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            err = k < 0 ? errno : ENOSPC;
            break;
        }
        size_t left = (size_t)k;
        while (iv < 3 && left >= iov[iv].iov_len) left -= iov[iv++].iov_len;
        if (iv < 3) {
            iov[iv].iov_base = (uint8_t *)iov[iv].iov_base + left;
            iov[iv].iov_len -= left;
        }
    }
    if (close(fd) != 0 && !err) err = errno;
    if (!err && rename(tmp, path) != 0) err = errno;
    if (err) {
        unlink(tmp);
        snprintf(why, cap, "cannot write %s: %s", path, strerror(err));
    }
    return err;
}

/* ---- the writer ------------------------------------------------------------------------------------- */

static void *writer_main(void *arg) {
    nv_disk *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (d->q_n == 0 && !d->closing) pthread_cond_wait(&d->cv, &d->mu);
        if (d->q_n == 0) break;
        nv_disk_job j = d->q[d->q_head];
        d->q_head = (d->q_head + 1) % d->o.queue_cap;
        d->q_n--;
        d->in_flight = 1;
        int write = d->st.writer_up && d->file_bytes <= d->o.max_bytes;
        if (write)
            while (d->st.bytes + d->file_bytes > d->o.max_bytes && d->lru_head >= 0) evict_head(d);
        uint64_t counter = d->tmp_counter++;
        pthread_mutex_unlock(&d->mu);

        char why[8600] = "";
        int err = write ? write_block(d, &j, counter, why, sizeof why) : 0;
        if (err == ENOSPC || err == EDQUOT) { /* the disk's other users filled it: make room among ours, once */
            pthread_mutex_lock(&d->mu);
            int freed = 0;
            for (; freed < 8 && d->lru_head >= 0; freed++) evict_head(d);
            counter = d->tmp_counter++;
            pthread_mutex_unlock(&d->mu);
            if (freed) err = write_block(d, &j, counter, why, sizeof why);
        }
        /* a fault of this one file (a folder under its name, a temporary name taken) drops the block alone */
        const int this_file = err == EISDIR || err == EEXIST || err == ENOTEMPTY;

        pthread_mutex_lock(&d->mu);
        d->in_flight = 0;
        int32_t i = nv_map64_get(&d->map, j.hash);
        if (write && !err && i >= 0 && d->e[i].state == E_WRITING) {
            d->e[i].state = E_READY;
            d->e[i].stamp = (int64_t)time(NULL) * 1000000000LL;
            lru_push(d, i);
            d->st.files++;
            d->st.bytes += d->file_bytes;
            d->st.writes++;
        } else {
            if (i >= 0 && d->e[i].state == E_WRITING) entry_drop(d, i);
            if (err) {
                d->st.write_errors++;
                if (d->st.writer_up && !this_file) {
                    d->st.writer_up = 0;
                    nv_warn("serve: prefix cache: SSD tier writer stopped: %s; blocks are no longer written to %s "
                            "(serving goes on)",
                            why, d->dir);
                }
            } else {
                d->st.write_drops++;
            }
        }
        d->done[(d->d_head + d->d_n) % d->o.queue_cap] = j.block;
        d->d_n++;
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* ---- opening: the index ------------------------------------------------------------------------------ */

static int is_hex16(const char *s, uint64_t *v) {
    uint64_t x = 0;
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        int dgt = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (dgt < 0) return 0;
        x = x << 4 | (uint64_t)dgt;
    }
    *v = x;
    return 1;
}

static int cmp_stamp(const void *a, const void *b, void *ctx) {
    const entry *e = ctx;
    int64_t x = e[*(const int32_t *)a].stamp, y = e[*(const int32_t *)b].stamp;
    return x < y ? -1 : x > y;
}

/* Indexes the directory's block files, removing those that fail their checks (a file that cannot
 * be read for want of memory or descriptors is left alone); 0 when out of memory. */
static int scan(nv_disk *d) {
    DIR *dir = opendir(d->dir);
    if (!dir) return 1;
    int32_t *tokens = malloc((size_t)d->o.block_size * 4);
    int ok_all = tokens != NULL;
    time_t now = time(NULL);
    struct dirent *de;
    while (ok_all && (de = readdir(dir))) {
        const char *name = de->d_name;
        size_t n = strlen(name);
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", d->dir, name);
        if (strstr(name, ".kvb.tmp.")) { /* a write that never finished */
            struct stat sb;
            if (lstat(path, &sb) == 0 && S_ISREG(sb.st_mode) && now - sb.st_mtime > TMP_MAX_AGE_S) unlink(path);
            continue;
        }
        if (n < 4 || strcmp(name + n - 4, ".kvb") != 0) continue; /* not ours */
        uint64_t hash = 0;
        int ok = n == 20 && is_hex16(name, &hash) && nv_map64_get(&d->map, hash) < 0;
        disk_header h;
        struct stat sb;
        memset(&h, 0, sizeof h);
        memset(&sb, 0, sizeof sb);
        int fd = ok ? open_block(path) : -1;
        if (ok && fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == EINTR)) continue; /* not the file's fault */
        ok = fd >= 0 && read_header(d, fd, &h, tokens) && h.hash == hash && fstat(fd, &sb) == 0;
        if (fd >= 0) close(fd);
        if (!ok) {
            if (unlink(path) == 0) d->st.rejected++;
            continue;
        }
        int32_t i = entry_new(d, hash, E_READY);
        if (i < 0) {
            ok_all = 0; /* out of memory: the file stays for a later start */
            break;
        }
        d->e[i].stamp = (int64_t)sb.st_mtim.tv_sec * 1000000000LL + sb.st_mtim.tv_nsec;
        d->st.files++;
        d->st.bytes += d->file_bytes;
    }
    free(tokens);
    closedir(dir);
    /* least recently used first */
    int32_t *order = ok_all ? malloc((size_t)(d->n_e ? d->n_e : 1) * sizeof *order) : NULL;
    if (!order) return 0;
    int32_t k = 0;
    for (int32_t i = 0; i < d->n_e; i++)
        if (d->e[i].state == E_READY) order[k++] = i;
    qsort_r(order, (size_t)k, sizeof *order, cmp_stamp, d->e);
    for (int32_t i = 0; i < k; i++) lru_push(d, order[i]);
    free(order);
    while (d->st.bytes > d->o.max_bytes && d->lru_head >= 0) evict_head(d);
    return 1;
}

nv_err nv_disk_open(nv_disk **out, const nv_disk_opts *o) {
    *out = NULL;
    if (!o->root || !*o->root) return nv_fail(NV_EINVAL, "SSD tier: no directory");
    if (o->block_size < 1 || o->n_layers < 1 || o->kv_dim < 1 || o->n_kv_heads < 1 ||
        o->kv_dim % o->n_kv_heads != 0 || o->queue_cap < 1 || !nv_kv_dtype_name(o->dtype))
        return nv_fail(NV_EINVAL, "SSD tier: bad geometry");
    nv_disk *d = calloc(1, sizeof *d);
    if (!d) return nv_fail(NV_ENOMEM, "SSD tier: out of memory");
    d->o = *o;
    d->o.root = d->o.part = NULL;
    if (snprintf(d->dir, sizeof d->dir, "%s/%016" PRIx64 "%s%s", o->root, o->model_id, o->part ? "-" : "", o->part ? o->part : "") >=
        (int)sizeof d->dir) {
        free(d);
        return nv_fail(NV_EINVAL, "SSD tier: directory name too long");
    }
    d->payload_bytes = nv_kv_geometry_bytes(o->n_layers, o->block_size, o->kv_dim, o->n_kv_heads, o->dtype);
    d->file_bytes = NV_DISK_HEADER_BYTES + 4ull * (uint64_t)o->block_size + d->payload_bytes;
    d->free_e = d->lru_head = d->lru_tail = -1;
    d->st.writer_up = 1;
    d->st.max_bytes = o->max_bytes;
    /* a part's files name it in their identity: the two parts of a model whose layer counts are equal
       have files of the same size and geometry, which must not pass for each other's */
    d->tier_id = o->part ? nv_hash64(o->part, strlen(o->part), o->model_id) : o->model_id;
    if (getrandom(&d->tmp_salt, sizeof d->tmp_salt, GRND_NONBLOCK) != (ssize_t)sizeof d->tmp_salt)
        d->tmp_salt = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)d;
    nv_err e = nv_mkdirs_private(d->dir); /* the files hold prompts: the user's alone */
    if (e == NV_OK) chmod(d->dir, 0700);  /* (made by an earlier version with 0755) */
    if (e == NV_OK && access(d->dir, R_OK | X_OK) != 0)
        e = nv_fail(NV_EIO, "%s: %s", d->dir, strerror(errno));
    if (e != NV_OK) {
        free(d);
        return nv_fail(e, "SSD tier unusable: %s", nv_errmsg());
    }
    d->q = calloc((size_t)o->queue_cap, sizeof *d->q);
    d->done = calloc((size_t)o->queue_cap, sizeof *d->done);
    if (!d->q || !d->done || nv_map64_init(&d->map, 1024) != NV_OK) {
        free(d->q);
        free(d->done);
        nv_map64_free(&d->map);
        free(d);
        return nv_fail(NV_ENOMEM, "SSD tier: out of memory");
    }
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    if (!scan(d)) {
        nv_disk_free(d); /* (no writer started: freeing is all there is to do) */
        return nv_fail(NV_ENOMEM, "SSD tier: out of memory indexing its files");
    }
    if (pthread_create(&d->thread, NULL, writer_main, d) != 0) {
        d->st.writer_up = 0;
        nv_warn("serve: prefix cache: cannot start the SSD tier writer; blocks are not written to %s", d->dir);
    } else {
        d->started = 1;
    }
    *out = d;
    return NV_OK;
}

void nv_disk_close(nv_disk *d) {
    if (!d) return;
    if (d->started) {
        pthread_mutex_lock(&d->mu);
        d->closing = 1;
        pthread_cond_signal(&d->cv);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->thread, NULL);
        d->started = 0;
    }
    /* the files used from RAM get the time of that use as their mtimes, so the order survives a
       restart (best effort: the tier may be read-only) */
    pthread_mutex_lock(&d->mu);
    for (int32_t i = d->lru_head; i >= 0; i = d->e[i].next) {
        if (!d->e[i].touched) continue;
        char path[4200];
        block_path(d, d->e[i].hash, path, sizeof path);
        const struct timespec ts[2] = {{0, UTIME_OMIT}, {(time_t)(d->e[i].stamp / 1000000000LL), (long)(d->e[i].stamp % 1000000000LL)}};
        utimensat(AT_FDCWD, path, ts, AT_SYMLINK_NOFOLLOW);
        d->e[i].touched = 0;
    }
    pthread_mutex_unlock(&d->mu);
    /* jobs left (no writer) are handed back unwritten by nv_disk_reap: nothing to do here */
}

void nv_disk_free(nv_disk *d) {
    if (!d) return;
    nv_disk_close(d);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
    nv_map64_free(&d->map);
    free(d->e);
    free(d->q);
    free(d->done);
    free(d);
}

const char *nv_disk_dir(const nv_disk *d) { return d->dir; }
uint64_t nv_disk_file_bytes(const nv_disk *d) { return d->file_bytes; }

int nv_disk_has(nv_disk *d, uint64_t hash) {
    pthread_mutex_lock(&d->mu);
    int32_t i = nv_map64_get(&d->map, hash);
    int r = i >= 0 && d->e[i].state == E_READY;
    pthread_mutex_unlock(&d->mu);
    return r;
}

void nv_disk_touch(nv_disk *d, uint64_t hash) {
    pthread_mutex_lock(&d->mu);
    int32_t i = nv_map64_get(&d->map, hash);
    if (i >= 0 && d->e[i].state == E_READY) {
        lru_unlink(d, i);
        lru_push(d, i);
        d->e[i].touched = 1;
        d->e[i].stamp = nv_file_clock_ns(); /* (the files' clock; written at close as it was: the order kept) */
    }
    pthread_mutex_unlock(&d->mu);
}

int nv_disk_known(nv_disk *d, uint64_t hash) {
    pthread_mutex_lock(&d->mu);
    int r = nv_map64_get(&d->map, hash) >= 0;
    pthread_mutex_unlock(&d->mu);
    return r;
}

int nv_disk_enqueue(nv_disk *d, const nv_disk_job *j) {
    pthread_mutex_lock(&d->mu);
    int ok = 0;
    if (nv_map64_get(&d->map, j->hash) >= 0) {
        /* already there or on its way */
    } else if (!d->st.writer_up || !d->started || d->closing || d->q_n + d->in_flight + d->d_n >= d->o.queue_cap) {
        d->st.write_drops++;
    } else if (entry_new(d, j->hash, E_WRITING) >= 0) {
        d->q[(d->q_head + d->q_n) % d->o.queue_cap] = *j;
        d->q_n++;
        pthread_cond_signal(&d->cv);
        ok = 1;
    }
    pthread_mutex_unlock(&d->mu);
    return ok;
}

int nv_disk_reap(nv_disk *d, int32_t *blocks, int cap) {
    pthread_mutex_lock(&d->mu);
    int n = 0;
    while (d->d_n > 0 && n < cap) {
        blocks[n++] = d->done[d->d_head];
        d->d_head = (d->d_head + 1) % d->o.queue_cap;
        d->d_n--;
    }
    if (!d->started) /* closed: hand back what was never written as well */
        while (d->q_n > 0 && n < cap) {
            nv_disk_job *j = &d->q[d->q_head];
            int32_t i = nv_map64_get(&d->map, j->hash);
            if (i >= 0 && d->e[i].state == E_WRITING) entry_drop(d, i);
            blocks[n++] = j->block;
            d->q_head = (d->q_head + 1) % d->o.queue_cap;
            d->q_n--;
        }
    pthread_mutex_unlock(&d->mu);
    return n;
}

/* Forgets a file that failed a check, and removes it. */
static void reject(nv_disk *d, uint64_t hash, const char *path) {
    pthread_mutex_lock(&d->mu);
    int32_t i = nv_map64_get(&d->map, hash);
    if (i >= 0 && d->e[i].state == E_READY) {
        unlink(path);
        entry_drop(d, i);
        d->st.rejected++;
    }
    d->st.load_failures++;
    pthread_mutex_unlock(&d->mu);
}

void nv_disk_prefetch(nv_disk *d, uint64_t hash) {
    char path[4200];
    block_path(d, hash, path, sizeof path);
    int fd = open_block(path);
    if (fd < 0) return;
    struct stat sb;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode)) posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
    close(fd);
}

int nv_disk_load(nv_disk *d, uint64_t hash, uint64_t parent, const int *tokens, void *payload) {
    if (!nv_disk_has(d, hash)) return 0;
    char path[4200];
    block_path(d, hash, path, sizeof path);
    int fd = open_block(path);
    if (fd < 0) { /* evicted meanwhile, or removed behind our back (short of descriptors: kept) */
        const int transient = errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == EINTR;
        pthread_mutex_lock(&d->mu);
        int32_t i = nv_map64_get(&d->map, hash);
        if (!transient && i >= 0 && d->e[i].state == E_READY) entry_drop(d, i);
        d->st.load_failures++;
        pthread_mutex_unlock(&d->mu);
        return 0;
    }
    disk_header h;
    int32_t *tk = malloc((size_t)d->o.block_size * 4);
    if (!tk) { /* out of memory: the file is not at fault */
        close(fd);
        pthread_mutex_lock(&d->mu);
        d->st.load_failures++;
        pthread_mutex_unlock(&d->mu);
        return 0;
    }
    int ok = read_header(d, fd, &h, tk) && h.hash == hash && h.parent == parent &&
             memcmp(tk, tokens, (size_t)d->o.block_size * 4) == 0 &&
             read_full(fd, payload, d->payload_bytes, (off_t)(NV_DISK_HEADER_BYTES + 4 * (size_t)d->o.block_size)) &&
             nv_hash64(payload, d->payload_bytes, 0) == h.payload_sum;
    free(tk);
    if (!ok) {
        close(fd);
        reject(d, hash, path);
        return 0;
    }
    struct timespec ts[2] = {{0, UTIME_OMIT}, {0, UTIME_NOW}};
    futimens(fd, ts); /* the LRU order, for the next start (best effort: the tier may be read-only) */
    close(fd);
    const int64_t now = nv_file_clock_ns();
    pthread_mutex_lock(&d->mu);
    int32_t i = nv_map64_get(&d->map, hash);
    if (i >= 0 && d->e[i].state == E_READY) {
        lru_unlink(d, i);
        lru_push(d, i);
        d->e[i].stamp = now;
        d->e[i].touched = 0; /* (its mtime says this use already) */
    }
    d->st.loads++;
    pthread_mutex_unlock(&d->mu);
    return 1;
}

void nv_disk_stats_get(nv_disk *d, nv_disk_stats *st) {
    pthread_mutex_lock(&d->mu);
    *st = d->st;
    st->queue_depth = d->q_n + d->in_flight;
    pthread_mutex_unlock(&d->mu);
}
