#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

nv_err nv_file_map(const char *path, nv_mapped *out) {
    out->data = NULL;
    out->len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return nv_fail(NV_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return nv_fail(NV_EIO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return nv_fail(NV_EIO, "%s: not a regular file", path);
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return nv_fail(NV_EIO, "%s: mmap: %s", path, strerror(e));
        }
        out->data = p;
        out->len = (size_t)st.st_size;
    }
    close(fd);
    return NV_OK;
}

int nv_file_gz(const char *path) {
    const size_t n = strlen(path);
    return n > 3 && !strcmp(path + n - 3, ".gz");
}

nv_err nv_file_map_data(const char *path, nv_mapped *out) {
    NV_TRY(nv_file_map(path, out));
    if (!nv_file_gz(path) || out->len < 2 || out->data[0] != 0x1f || out->data[1] != 0x8b) return NV_OK;
    const nv_mapped gz = *out;
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    const size_t limit = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : (size_t)1 << 34;
    size_t cap = gz.len * 4 + 4096, len = 0;
    uint8_t *buf = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    z_stream z = {.next_in = (Bytef *)gz.data};
    int rc = buf == MAP_FAILED ? Z_MEM_ERROR : inflateInit2(&z, 15 + 16), too_big = 0; /* (15 + 16: gzip's wrapper) */
    const int inited = rc == Z_OK;
    while (rc == Z_OK) {
        if (len == cap) { /* a larger mapping: mremap moves it, no copy */
            const size_t more = cap * 2 < limit ? cap * 2 : limit;
            uint8_t *nb = more > cap ? mremap(buf, cap, more, MREMAP_MAYMOVE) : MAP_FAILED;
            if (nb == MAP_FAILED) {
                too_big = more <= cap, rc = Z_MEM_ERROR;
                break;
            }
            buf = nb, cap = more;
        }
        const size_t left_in = gz.len - (size_t)(z.next_in - gz.data);
        z.avail_in = left_in > UINT32_MAX ? UINT32_MAX : (uInt)left_in;
        z.next_out = buf + len;
        z.avail_out = cap - len > UINT32_MAX ? UINT32_MAX : (uInt)(cap - len);
        const uInt room = z.avail_out;
        rc = inflate(&z, Z_NO_FLUSH);
        len += room - z.avail_out;
        const size_t at = (size_t)(z.next_in - gz.data);
        if (rc == Z_STREAM_END && gz.len - at >= 2 && gz.data[at] == 0x1f && gz.data[at + 1] == 0x8b)
            rc = inflateReset(&z); /* another member follows (gzip -d writes each after the last) */
        else if (rc == Z_BUF_ERROR) /* stuck: no room (more follows), or the input ended inside a member */
            rc = z.avail_out ? Z_DATA_ERROR : Z_OK;
    }
    const char *why = z.msg ? z.msg : "it ends inside a member";
    if (inited) inflateEnd(&z);
    nv_file_unmap(out);
    if (rc != Z_STREAM_END) {
        if (buf != MAP_FAILED) munmap(buf, cap);
        return too_big ? nv_fail(NV_ENOMEM, "%s: decompresses past the machine's memory (%.1f GB)", path, (double)limit / 1e9)
               : rc == Z_MEM_ERROR ? nv_fail(NV_ENOMEM, "%s: out of memory decompressing it", path)
                                   : nv_fail(NV_EFORMAT, "%s: not a whole gzip file (%s)", path, why);
    }
    if (!len) munmap(buf, cap);
    else if (cap > len) mremap(buf, cap, len, 0); /* the spare pages back (nv_file_unmap unmaps len bytes) */
    out->data = len ? buf : NULL;
    out->len = len;
    return NV_OK;
}

void nv_file_release(const void *p, size_t len) {
    const uintptr_t page = 4096, lo = (uintptr_t)p & ~(page - 1), hi = ((uintptr_t)p + len + page - 1) & ~(page - 1);
    if (p && len) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED); /* a private read-only file mapping: nothing lost */
}

void nv_file_unmap(nv_mapped *m) {
    if (m->data) munmap((void *)m->data, m->len);
    m->data = NULL;
    m->len = 0;
}

nv_err nv_read_view(nv_reader *r, const void **dst, size_t n, const char *field) {
    if (n > nv_reader_left(r))
        return nv_fail(NV_EFORMAT, "%s: truncated: %s needs %zu bytes at offset %zu, file has %zu",
                       r->what, field, n, r->pos, r->len);
    *dst = r->p + r->pos;
    r->pos += n;
    return NV_OK;
}

nv_err nv_read_bytes(nv_reader *r, void *dst, size_t n, const char *field) {
    const void *src = NULL;
    NV_TRY(nv_read_view(r, &src, n, field));
    if (n) memcpy(dst, src, n);
    return NV_OK;
}

nv_err nv_read_u8(nv_reader *r, uint8_t *v, const char *field) { return nv_read_bytes(r, v, 1, field); }
nv_err nv_read_u32(nv_reader *r, uint32_t *v, const char *field) { return nv_read_bytes(r, v, 4, field); }
nv_err nv_read_i32(nv_reader *r, int32_t *v, const char *field) { return nv_read_bytes(r, v, 4, field); }
nv_err nv_read_u64(nv_reader *r, uint64_t *v, const char *field) { return nv_read_bytes(r, v, 8, field); }
nv_err nv_read_f32(nv_reader *r, float *v, const char *field) { return nv_read_bytes(r, v, 4, field); }

static int write_full(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The temporary files of the atomic write in progress, for the signal handler nv_file_clean_on_signals
 * installs (single-threaded commands only: one write at a time): pending_list's first pending_n. */
static char *const *volatile pending_list;
static volatile sig_atomic_t pending_n;
static int clean_on_signals;

static void unlink_pending_and_die(int sig) {
    for (sig_atomic_t i = 0; i < pending_n; i++) unlink(pending_list[i]); /* (async-signal-safe) */
    signal(sig, SIG_DFL);
    raise(sig);
}

void nv_file_clean_on_signals(void) {
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
        struct sigaction old;
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_DFL) signal(sigs[i], unlink_pending_and_die);
    }
    clean_on_signals = 1;
}

/* The first n of tmps (each named before its file is made) for the handler; 0 when the write is over. */
static void pending_set(char *const *tmps, int n) {
    if (!clean_on_signals) return;
    atomic_signal_fence(memory_order_seq_cst);
    if (n) pending_list = tmps; /* (the names whole before the handler may read them) */
    atomic_signal_fence(memory_order_seq_cst);
    pending_n = n;
}

void nv_file_sync_parent(const char *path) {
    const char *slash = strrchr(path, '/');
    char dir[4352];
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if ((size_t)(slash - path) < sizeof dir) snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
    else return;
    const int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) fsync(fd), close(fd);
}

/* parts written to a new file tmp (not one a link put there) with the mode of the file at path, synced;
 * on failure tmp is gone. */
static nv_err write_temp(const char *path, const char *tmp, const nv_iov *parts, int n) {
    struct stat old;
    const int had = stat(path, &old) == 0 && S_ISREG(old.st_mode);
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, had ? (old.st_mode & 0777) : 0644);
    if (fd < 0) return nv_fail(NV_EIO, "%s: %s", tmp, strerror(errno));
    if (had) fchmod(fd, old.st_mode & 07777); /* (the umask left out of it) */
    int ok = 1, err = 0;
    for (int i = 0; i < n && ok; i++) ok = write_full(fd, parts[i].ptr, parts[i].len) == 0;
    if (!(ok = ok && fsync(fd) == 0)) err = errno;
    if (close(fd) != 0 && ok) ok = 0, err = errno;
    if (ok) return NV_OK;
    nv_err e = nv_fail(NV_EIO, "%s: %s", path, strerror(err));
    unlink(tmp);
    return e;
}

nv_err nv_file_write_atomic_set(const nv_file_out *files, int n_files) {
    char **tmp = calloc((size_t)n_files + 1, sizeof *tmp);
    if (!tmp) return nv_fail(NV_ENOMEM, "out of memory");
    nv_err e = NV_OK;
    int made = 0;
    for (; made < n_files && e == NV_OK; made++) {
        const size_t cap = strlen(files[made].path) + 32;
        if (!(tmp[made] = malloc(cap))) {
            e = nv_fail(NV_ENOMEM, "out of memory");
            break;
        }
        snprintf(tmp[made], cap, "%s.tmp.%ld", files[made].path, (long)getpid());
        pending_set(tmp, made + 1); /* (before the file is there: a signal from here on finds it named) */
        if ((e = write_temp(files[made].path, tmp[made], files[made].parts, files[made].n)) != NV_OK) break;
    }
    /* every file whole and synced before the first takes its name: a failure before here changes nothing;
       the renames are not cut by a signal (one that comes meanwhile is taken after them) */
    sigset_t stop, was;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT), sigaddset(&stop, SIGTERM), sigaddset(&stop, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &stop, &was);
    int renamed = 0;
    for (; e == NV_OK && renamed < n_files; renamed++)
        if (rename(tmp[renamed], files[renamed].path) != 0) {
            e = renamed ? nv_fail(NV_EIO, "%s: %s (the %d files before it are replaced, it and the rest not)", files[renamed].path, strerror(errno), renamed)
                        : nv_fail(NV_EIO, "%s: %s", files[renamed].path, strerror(errno));
            break; /* (its temporary file is removed with the rest's) */
        }
    for (int i = renamed; i < made && i < n_files; i++) unlink(tmp[i]);
    pending_set(tmp, 0);
    pthread_sigmask(SIG_SETMASK, &was, NULL);
    for (int i = 0; i < renamed; i++) nv_file_sync_parent(files[i].path);
    for (int i = 0; i < n_files; i++) free(tmp[i]);
    free(tmp);
    return e;
}

nv_err nv_file_write_atomic(const char *path, const nv_iov *parts, int n) {
    const nv_file_out f = {path, parts, n};
    return nv_file_write_atomic_set(&f, 1);
}

nv_err nv_file_read_all(const char *path, char **out, size_t *len) {
    nv_mapped m;
    NV_TRY(nv_file_map(path, &m));
    char *buf = malloc(m.len + 1);
    if (!buf) {
        nv_file_unmap(&m);
        return nv_fail(NV_ENOMEM, "%s: out of memory", path);
    }
    if (m.len) memcpy(buf, m.data, m.len);
    buf[m.len] = '\0';
    *out = buf;
    if (len) *len = m.len;
    nv_file_unmap(&m);
    return NV_OK;
}

int nv_file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

int64_t nv_file_clock_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME_COARSE, &now);
    return (int64_t)now.tv_sec * 1000000000LL + now.tv_nsec;
}

void nv_unlink_in_dir(const char *dir, const char *const *names, size_t n) {
    char path[4400];
    for (size_t i = 0; i < n; i++)
        if (snprintf(path, sizeof path, "%s/%s", dir, names[i]) < (int)sizeof path) unlink(path);
}

void nv_remove_in_dir(const char *dir, const char *const *names, size_t n) {
    nv_unlink_in_dir(dir, names, n);
    rmdir(dir);
}

/* /proc/pid/stat's fields after the command's name (")" then a space), into st; NULL when none. */
static const char *proc_stat_rest(int pid, char *st, size_t cap) {
    char path[64];
    st[0] = 0;
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r"); /* (a /proc file says it is empty: read, not mapped) */
    if (f && !fgets(st, (int)cap, f)) st[0] = 0;
    if (f) fclose(f);
    const char *paren = strrchr(st, ')');
    return paren && paren[1] == ' ' ? paren + 2 : NULL;
}

char nv_proc_state(int pid) {
    char st[512];
    const char *rest = proc_stat_rest(pid, st, sizeof st);
    return rest ? rest[0] : 0;
}

unsigned long long nv_proc_start_time(int pid) {
    char st[1024];
    const char *rest = proc_stat_rest(pid, st, sizeof st);
    /* field 22, starttime: the 20th after the name (state is the 3rd field) */
    for (int field = 3; rest && field < 22; field++) {
        rest = strchr(rest, ' ');
        if (rest) rest++;
    }
    return rest ? strtoull(rest, NULL, 10) : 0;
}

int nv_file_is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

void nv_path_name(const char *path, char *out, size_t cap) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--; /* "runs/train/" names the folder */
    const char *base = path;
    for (size_t i = 0; i < n; i++)
        if (path[i] == '/') base = path + i + 1;
    snprintf(out, cap, "%.*s", (int)(n - (size_t)(base - path)), base);
    char *dot = strrchr(out, '.');
    if (dot && dot != out) *dot = '\0';
}

static nv_err mkdirs_mode(const char *path, mode_t mode) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return nv_fail(NV_EINVAL, "path too long: %s", path);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, mode) != 0 && errno != EEXIST) return nv_fail(NV_EIO, "%s: %s", buf, strerror(errno));
            *p = c;
            if (!c) break;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) return nv_fail(NV_EIO, "%s: not a directory", path);
    return NV_OK;
}

nv_err nv_mkdirs(const char *path) { return mkdirs_mode(path, 0755); }

nv_err nv_mkdirs_private(const char *path) { return mkdirs_mode(path, 0700); }

int nv_data_path(const char *rel, char *buf, size_t cap) {
    const char *env = getenv("NERVE_DATA");
    if (env && *env) {
        snprintf(buf, cap, "%s/%s", env, rel);
        return nv_file_exists(buf);
    }
    /* The executable lives in <checkout>/build[/...]; the data sits in <checkout>/../shared/data. */
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        for (int up = 0; up < 4; up++) {
            char *slash = strrchr(exe, '/');
            if (!slash || slash == exe) break;
            *slash = '\0';
            snprintf(buf, cap, "%s/../shared/data/%s", exe, rel);
            if (nv_file_exists(buf)) return 1;
        }
    }
    snprintf(buf, cap, "../shared/data/%s", rel);
    return nv_file_exists(buf);
}
