/* The prefix cache end to end: the real `nerve serve` on a free loopback port, driven over plain
 * sockets. Greedy text is identical with a RAM hit, a disk hit after a restart and no cache;
 * cached_tokens in usage (completions, chat, the streamed usage chunk); corrupted, truncated
 * and swapped block files are removed, never used; an unusable cache directory and a writer
 * whose writes fail leave one warning and serving goes on; cached blocks are reclaimed under
 * pool pressure instead of refusing requests; concurrent requests share a prefix's blocks. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "serve_util.h"
#include "t.h"

static char tmpdir[256];
static const char *model_path, *tok_path;

/* ---- server processes ------------------------------------------------------------------------- */

/* Starts `[pre] nerve serve -m MODEL -z TOK --port 0 ARGS` with env (NAME=VALUE ...). */
static int server_start(server *s, const char *name, const char *model, const char *args, const char *env,
                        const char *pre) {
    return server_spawn(s, name, pre, env, model ? model : model_path, tok_path, args, 60);
}

static int server_stop(server *s) { return server_stop_within(s, 30); }

/* ---- a small HTTP/1.1 client over plain sockets ------------------------------------------------ */

static int connect_to(int port) { return connect_to_within(port, 120); }

static int send_request(int fd, const char *method, const char *path, const char *body) {
    size_t blen = body ? strlen(body) : 0;
    char *req = malloc(blen + 512);
    int n = snprintf(req, 512, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n", method, path);
    if (body) n += snprintf(req + n, 512 - (size_t)n, "Content-Type: application/json\r\nContent-Length: %zu\r\n", blen);
    n += snprintf(req + n, 512 - (size_t)n, "\r\n");
    if (body) memcpy(req + n, body, blen);
    size_t left = (size_t)n + blen;
    const char *p = req;
    while (left) {
        ssize_t k = send(fd, p, left, MSG_NOSIGNAL);
        if (k <= 0) break;
        p += k;
        left -= (size_t)k;
    }
    free(req);
    return left == 0;
}

/* Reads until the peer closes; appends to *buf (NUL-terminated). */
static void read_rest(int fd, char **buf, size_t *len) {
    size_t cap = *len + 65536;
    *buf = realloc(*buf, cap);
    for (;;) {
        if (*len + 4096 + 1 > cap) *buf = realloc(*buf, cap *= 2);
        ssize_t k = recv(fd, *buf + *len, cap - *len - 1, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        *len += (size_t)k;
    }
    (*buf)[*len] = '\0';
}

/* The body after the headers, de-chunked in place. */
static char *body_of(char *raw, int *status) {
    *status = 0;
    char *sep = strstr(raw, "\r\n\r\n");
    if (!sep || sscanf(raw, "HTTP/1.%*d %d", status) != 1) return NULL;
    *sep = '\0';
    int chunked = strcasestr(raw, "Transfer-Encoding: chunked") != NULL;
    char *b = sep + 4;
    if (!chunked) return b;
    char *in = b, *out = b;
    for (;;) {
        char *end;
        unsigned long sz = strtoul(in, &end, 16);
        char *crlf = strstr(in, "\r\n");
        if (!crlf || sz == 0) break;
        in = crlf + 2;
        size_t have = strlen(in);
        if (sz > have) sz = have;
        memmove(out, in, sz);
        out += sz;
        in += sz;
        if (in[0] == '\r' && in[1] == '\n') in += 2;
    }
    *out = '\0';
    return b;
}

typedef struct {
    int status;
    char text[8192];
    int prompt_tokens, completion_tokens, cached_tokens; /* cached_tokens -1: absent */
    int usage_chunks, done;
} result;

static void take_usage(result *out, const cJSON *root) {
    const cJSON *u = cJSON_GetObjectItem(root, "usage");
    if (!cJSON_IsObject(u)) return;
    out->prompt_tokens = cJSON_GetObjectItem(u, "prompt_tokens")->valueint;
    out->completion_tokens = cJSON_GetObjectItem(u, "completion_tokens")->valueint;
    const cJSON *c = cJSON_GetObjectItem(cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens");
    out->cached_tokens = cJSON_IsNumber(c) ? c->valueint : -1;
}

static void take_text(result *out, const cJSON *root, int chat, int stream) {
    const cJSON *choices = cJSON_GetObjectItem(root, "choices");
    if (!cJSON_IsArray(choices)) return;
    if (cJSON_GetArraySize(choices) == 0) out->usage_chunks++;
    const cJSON *c0 = cJSON_GetArrayItem(choices, 0), *t;
    if (!c0) return;
    t = chat ? cJSON_GetObjectItem(cJSON_GetObjectItem(c0, stream ? "delta" : "message"), "content")
             : cJSON_GetObjectItem(c0, "text");
    if (cJSON_IsString(t)) strncat(out->text, t->valuestring, sizeof out->text - strlen(out->text) - 1);
}

/* Parses a whole response (SSE or JSON) into out. */
static void parse_result(char *raw, int chat, result *out) {
    memset(out, 0, sizeof *out);
    out->cached_tokens = -1;
    char *body = body_of(raw, &out->status);
    if (!body || out->status != 200) return;
    if (!strncmp(body, "data: ", 6)) {
        char *save = NULL;
        for (char *ev = strtok_r(body, "\n", &save); ev; ev = strtok_r(NULL, "\n", &save)) {
            if (strncmp(ev, "data: ", 6) != 0) continue;
            ev += 6;
            if (!strcmp(ev, "[DONE]")) {
                out->done++;
                continue;
            }
            cJSON *root = cJSON_Parse(ev);
            if (!root) continue;
            take_text(out, root, chat, 1);
            take_usage(out, root);
            cJSON_Delete(root);
        }
    } else {
        cJSON *root = cJSON_Parse(body);
        if (root) {
            take_text(out, root, chat, 0);
            take_usage(out, root);
        }
        cJSON_Delete(root);
    }
}

static int post(int port, int chat, const char *body, result *out) {
    memset(out, 0, sizeof *out);
    int fd = connect_to(port);
    if (fd < 0) return 0;
    char *buf = NULL;
    size_t len = 0;
    int ok = send_request(fd, "POST", chat ? "/v1/chat/completions" : "/v1/completions", body);
    if (ok) read_rest(fd, &buf, &len);
    close(fd);
    if (!ok || !buf) {
        free(buf);
        return 0;
    }
    parse_result(buf, chat, out);
    free(buf);
    return out->status == 200;
}

/* A stream opened and read until its first generated text. */
typedef struct {
    int fd;
    char *buf;
    size_t len;
} stream;

static int stream_open(int port, const char *body, stream *st) {
    memset(st, 0, sizeof *st);
    st->fd = connect_to(port);
    if (st->fd < 0 || !send_request(st->fd, "POST", "/v1/completions", body)) return 0;
    size_t cap = 65536;
    st->buf = malloc(cap);
    while (st->len < cap - 1) {
        ssize_t k = recv(st->fd, st->buf + st->len, cap - 1 - st->len, 0);
        if (k <= 0) break;
        st->len += (size_t)k;
        st->buf[st->len] = '\0';
        for (const char *t = st->buf; (t = strstr(t, "\"text\":\"")); t++)
            if (t[8] != '"') return 1; /* generated text arrived */
    }
    return 0;
}

static void stream_finish(stream *st, result *out) {
    read_rest(st->fd, &st->buf, &st->len);
    close(st->fd);
    parse_result(st->buf, 0, out);
    free(st->buf);
}

static int count_of(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p++) n++;
    return n;
}

/* ---- the prompts ---------------------------------------------------------------------------------- */

#define PROMPT_P                                                                                                      \
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. "  \
    "One day, she saw a big red ball under a tree. She ran to get it, but a small dog took the ball and ran away. "     \
    "Lily was sad, so her mom gave her a hug and they went home to bake a cake together"
#define SUFFIX " and the dog came back with the ball"

static char body_p[2048], body_p2[2048];
static result ref_p, ref_p2; /* no cache: the reference texts */
static int cached_full;      /* cached tokens of P when its every reusable block hits */

static const char *greedy(char *buf, size_t cap, const char *prompt, int max_tokens) {
    /* every answer its max_tokens long whatever text an engine's rounding gives (the counts are checked) */
    snprintf(buf, cap, "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true}", prompt, max_tokens);
    return buf;
}

static const char *cache_dir(void) {
    static char d[400];
    snprintf(d, sizeof d, "%s/kv", tmpdir);
    return d;
}

/* The model's block directory under the cache root (the only subdirectory made by the server
 * of model_path there; found by elimination against `other`). */
static int model_dir(const char *root, const char *not_this, char *out, size_t cap) {
    DIR *d = opendir(root);
    int found = 0;
    for (struct dirent *de; d && (de = readdir(d));) {
        if (de->d_name[0] == '.' || (not_this && !strcmp(de->d_name, not_this))) continue;
        snprintf(out, cap, "%s/%s", root, de->d_name);
        found++;
    }
    if (d) closedir(d);
    return found == 1;
}

static int list_blocks(const char *dir, char names[][64], int cap) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *de; d && (de = readdir(d));) {
        size_t l = strlen(de->d_name);
        if (l == 20 && !strcmp(de->d_name + 16, ".kvb") && n < cap) memcpy(names[n++], de->d_name, 21);
    }
    if (d) closedir(d);
    return n;
}

static uint64_t header_u64(const char *path, long off) {
    uint64_t v = UINT64_MAX;
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        if (pread(fd, &v, 8, off) != 8) v = UINT64_MAX;
        close(fd);
    }
    return v;
}

static int exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* ---- tests ------------------------------------------------------------------------------------------ */

static void test_no_cache_reference(void) {
    server s;
    if (!server_start(&s, "nocache", NULL, "--no-prefix-cache", NULL, NULL)) {
        T_CHECK(0, "server did not start");
        return;
    }
    T_CHECK(post(s.port, 0, body_p, &ref_p) && ref_p.completion_tokens == 40, "P: %d", ref_p.status);
    T_CHECK(post(s.port, 0, body_p2, &ref_p2) && ref_p2.completion_tokens == 40, "P2: %d", ref_p2.status);
    T_CHECK(ref_p.cached_tokens == 0 && ref_p2.cached_tokens == 0, "cached tokens without a cache: %d", ref_p.cached_tokens);
    T_CHECK(ref_p.prompt_tokens > 100 && ref_p2.prompt_tokens > ref_p.prompt_tokens, "prompt of %d tokens", ref_p.prompt_tokens);
    T_CHECK(metric(s.port, "nerve_prefix_cache_hits_total{tier=\"ram\"}") == -1, "prefix metrics without a prefix cache");
    cached_full = (ref_p.prompt_tokens - 1) / 16 * 16;
    T_CHECK(server_stop(&s) == 0, "exit");
}

static void test_exact_ram_then_disk_after_restart(void) {
    char args[600];
    snprintf(args, sizeof args, "--kv-cache-dir '%s'", cache_dir());
    server s;
    if (!server_start(&s, "ram", NULL, args, NULL, NULL)) {
        T_CHECK(0, "server did not start");
        return;
    }
    int port = s.port;
    result r;
    T_CHECK(post(port, 0, body_p, &r) && !strcmp(r.text, ref_p.text) && r.cached_tokens == 0, "cold: cached %d, text %s",
            r.cached_tokens, r.text);
    /* the RAM hits below are uses of the block files too (their mtimes say so once the server stops):
       the hits come after the files were written */
    for (int t = 0; t < 500 && metric(port, "nerve_prefix_cache_blocks{tier=\"disk\"}") < cached_full / 16; t++) sleep_ms(10);
    sleep_ms(60);
    struct timespec t_hit;
    clock_gettime(CLOCK_REALTIME, &t_hit);
    T_CHECK(post(port, 0, body_p, &r) && !strcmp(r.text, ref_p.text) && r.cached_tokens == cached_full,
            "RAM hit: cached %d (want %d), text equal %d", r.cached_tokens, cached_full, !strcmp(r.text, ref_p.text));
    T_CHECK(post(port, 0, body_p2, &r) && !strcmp(r.text, ref_p2.text) && r.cached_tokens >= cached_full - 16 &&
                r.cached_tokens > 0,
            "a longer prompt sharing the prefix: cached %d, equal %d", r.cached_tokens, !strcmp(r.text, ref_p2.text));
    /* chat: the plain template gives the same tokens; cached_tokens in the whole response and in
       the streamed usage chunk */
    char chat[2048];
    snprintf(chat, sizeof chat,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":40,\"temperature\":0,"
             "\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
             PROMPT_P);
    T_CHECK(post(port, 1, chat, &r) && r.usage_chunks == 1 && r.done == 1 && r.cached_tokens == cached_full &&
                !strcmp(r.text, ref_p.text),
            "streamed chat: usage chunks %d cached %d", r.usage_chunks, r.cached_tokens);
    snprintf(chat, sizeof chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":40,\"temperature\":0}",
             PROMPT_P);
    T_CHECK(post(port, 1, chat, &r) && r.cached_tokens == cached_full && !strcmp(r.text, ref_p.text), "chat: cached %d",
            r.cached_tokens);
    T_CHECK(metric(port, "nerve_prefix_cache_hits_total{tier=\"ram\"}") >= 3.0 * cached_full / 16, "RAM hits %g",
            metric(port, "nerve_prefix_cache_hits_total{tier=\"ram\"}"));
    T_CHECK(metric(port, "nerve_prefix_cache_blocks{tier=\"ram\"}") > 0 && metric(port, "nerve_prefix_cache_idle_blocks") > 0,
            "no idle cached blocks");
    T_CHECK(wait_pool_idle(port), "blocks in use after every request ended");
    T_CHECK(metric(port, "nerve_prefix_cache_blocks{tier=\"disk\"}") > 0 && metric(port, "nerve_prefix_disk_up") == 1,
            "nothing written to disk");
    T_CHECK(server_stop(&s) == 0, "exit");
    char mdir[700], names[256][64];
    int used = 0;
    const int n_files = model_dir(cache_dir(), NULL, mdir, sizeof mdir) ? list_blocks(mdir, names, 256) : 0;
    for (int i = 0; i < n_files; i++) {
        char path[1000];
        struct stat sb;
        snprintf(path, sizeof path, "%.700s/%.63s", mdir, names[i]);
        /* (a file's timestamp may lag the clock by a tick) */
        used += stat(path, &sb) == 0 && (double)sb.st_mtim.tv_sec + sb.st_mtim.tv_nsec * 1e-9 >=
                                            (double)t_hit.tv_sec + t_hit.tv_nsec * 1e-9 - 0.03;
    }
    T_CHECK(used >= cached_full / 16, "%d of %d block files carry their RAM hits in their mtimes (want %d)", used, n_files,
            cached_full / 16);

    /* a restart: the blocks come back from disk, and the text is the same */
    if (!server_start(&s, "disk", NULL, args, NULL, NULL)) {
        T_CHECK(0, "server did not restart");
        return;
    }
    port = s.port;
    char *log = read_log(&s);
    T_CHECK(strstr(log, "prefix cache: RAM") && !strstr(log, " (0 blocks,"), "start line: %s", log);
    free(log);
    T_CHECK(post(port, 0, body_p, &r) && !strcmp(r.text, ref_p.text) && r.cached_tokens == cached_full,
            "disk hit: cached %d (want %d), text equal %d", r.cached_tokens, cached_full, !strcmp(r.text, ref_p.text));
    T_CHECK(metric(port, "nerve_prefix_cache_hits_total{tier=\"disk\"}") == cached_full / 16 &&
                metric(port, "nerve_prefix_cache_hits_total{tier=\"ram\"}") == 0,
            "disk hits %g", metric(port, "nerve_prefix_cache_hits_total{tier=\"disk\"}"));
    /* restored blocks are in RAM now */
    T_CHECK(post(port, 0, body_p2, &r) && !strcmp(r.text, ref_p2.text) && r.cached_tokens > 0, "after restore: cached %d",
            r.cached_tokens);
    T_CHECK(metric(port, "nerve_prefix_cache_hits_total{tier=\"ram\"}") >= cached_full / 16 - 1, "RAM hits after restore");
    T_CHECK(wait_pool_idle(port), "blocks in use after every request ended");
    T_CHECK(server_stop(&s) == 0, "exit");
}

/* q8 pages (int8 keys and values with their scales, one block a contiguous range as in the other
 * types): greedy text is the same cold, from a RAM hit and from a disk hit after a restart:
 * the q8 block files are found again and used after the restart. */
static void test_q8_pages_cache_exactly(void) {
    char args[700];
    snprintf(args, sizeof args, "--kv-cache-dtype q8 --kv-cache-dir '%s-q8'", cache_dir());
    server s;
    result cold, r;
    for (int run = 0; run < 2; run++) {
        if (!server_start(&s, run ? "q8-disk" : "q8", NULL, args, NULL, NULL)) {
            T_CHECK(0, "server did not start");
            return;
        }
        char *log = read_log(&s);
        T_CHECK(strstr(log, "q8"), "the start lines do not name the q8 cache: %s", log);
        free(log);
        if (run == 0) {
            T_CHECK(post(s.port, 0, body_p, &cold) && cold.completion_tokens == 40 && cold.cached_tokens == 0,
                    "cold: %d, cached %d", cold.status, cold.cached_tokens);
            T_CHECK(post(s.port, 0, body_p, &r) && r.cached_tokens == cached_full && !strcmp(r.text, cold.text),
                    "RAM hit: cached %d (want %d), text equal %d", r.cached_tokens, cached_full, !strcmp(r.text, cold.text));
        } else {
            T_CHECK(post(s.port, 0, body_p, &r) && r.cached_tokens == cached_full && !strcmp(r.text, cold.text),
                    "disk hit: cached %d (want %d), text equal %d", r.cached_tokens, cached_full, !strcmp(r.text, cold.text));
            T_CHECK(metric(s.port, "nerve_prefix_cache_hits_total{tier=\"disk\"}") == cached_full / 16, "disk hits %g",
                    metric(s.port, "nerve_prefix_cache_hits_total{tier=\"disk\"}"));
        }
        T_CHECK(wait_pool_idle(s.port), "blocks in use after every request ended");
        T_CHECK(server_stop(&s) == 0, "exit");
    }
}

static void test_bad_files_are_removed_never_used(void) {
    char dir[700], other_dir[700], name[300];
    if (!model_dir(cache_dir(), NULL, dir, sizeof dir)) {
        T_CHECK(0, "no model directory under %s", cache_dir());
        return;
    }
    snprintf(name, sizeof name, "%s", strrchr(dir, '/') + 1);
    /* another model (other weights) writes its blocks beside ours */
    const char *other = t_path("other.bin");
    char args[1200];
    snprintf(args, sizeof args, "init --preset stories260K --seed 9 -o '%s'", other);
    T_CHECK(t_nerve(args) == 0, "init: %s", t_err);
    snprintf(args, sizeof args, "--kv-cache-dir '%s'", cache_dir());
    server s;
    if (!server_start(&s, "other", other, args, NULL, NULL)) {
        T_CHECK(0, "server did not start");
        return;
    }
    result r;
    T_CHECK(post(s.port, 0, body_p, &r), "other model: %d", r.status);
    T_CHECK(server_stop(&s) == 0, "exit");
    if (!model_dir(cache_dir(), name, other_dir, sizeof other_dir)) {
        T_CHECK(0, "the other model's directory is missing");
        return;
    }
    static char ours[512][64], theirs[512][64];
    int n = list_blocks(dir, ours, 512), m = list_blocks(other_dir, theirs, 512);
    T_CHECK(n >= 4 && m >= 1, "%d and %d block files", n, m);
    if (n < 4 || m < 1) return;
    /* the first block of P's chain (parent 0) gets a corrupted payload; another file is
       truncated, a third swapped for the other model's block, and one of theirs is copied in */
    char first[800] = "", trunc_path[800] = "", swapped[800] = "", foreign[800], path[800];
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, ours[i]);
        if (header_u64(path, 32) == 0 && !first[0]) snprintf(first, sizeof first, "%s", path);
        else if (!trunc_path[0]) snprintf(trunc_path, sizeof trunc_path, "%s", path);
        else if (!swapped[0]) snprintf(swapped, sizeof swapped, "%s", path);
    }
    T_CHECK(first[0] && trunc_path[0] && swapped[0], "no first block file among %d", n);
    if (!first[0] || !trunc_path[0] || !swapped[0]) return;
    int fd = open(first, O_RDWR);
    char c = 0;
    T_CHECK(fd >= 0 && pread(fd, &c, 1, 80 + 64 + 999) == 1, "read");
    c ^= 1;
    T_CHECK(pwrite(fd, &c, 1, 80 + 64 + 999) == 1, "corrupt");
    close(fd);
    T_CHECK(truncate(trunc_path, 1000) == 0, "truncate");
    snprintf(path, sizeof path, "%s/%s", other_dir, theirs[0]);
    char cmd[4000];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s' && cp '%s' '%s/%s'", path, swapped, path, dir, theirs[0]);
    T_CHECK(system(cmd) == 0, "copy");
    snprintf(foreign, sizeof foreign, "%s/%s", dir, theirs[0]);

    snprintf(args, sizeof args, "--kv-cache-dir '%s'", cache_dir());
    if (!server_start(&s, "bad", NULL, args, NULL, NULL)) {
        T_CHECK(0, "server did not start");
        return;
    }
    int port = s.port;
    T_CHECK(metric(port, "nerve_prefix_disk_rejected_total") == 3, "rejected at start: %g",
            metric(port, "nerve_prefix_disk_rejected_total"));
    T_CHECK(!exists(trunc_path) && !exists(swapped) && !exists(foreign) && exists(first), "bad files not removed at start");
    snprintf(path, sizeof path, "%s/%s", other_dir, theirs[0]);
    T_CHECK(exists(path), "the other model's own file was removed");
    /* the corrupted first block fails its checksum when read: removed, and P is prefilled */
    T_CHECK(post(port, 0, body_p, &r) && !strcmp(r.text, ref_p.text) && r.cached_tokens == 0,
            "with a corrupted first block: cached %d, text equal %d", r.cached_tokens, !strcmp(r.text, ref_p.text));
    T_CHECK(metric(port, "nerve_prefix_disk_rejected_total") == 4, "corrupted file not rejected (%g)",
            metric(port, "nerve_prefix_disk_rejected_total"));
    /* the block was computed again, and written again: the file is whole now */
    T_CHECK(wait_pool_idle(port), "blocks in use");
    char now = 0;
    fd = open(first, O_RDONLY);
    T_CHECK(fd >= 0 && pread(fd, &now, 1, 80 + 64 + 999) == 1 && now == (char)(c ^ 1), "the corrupted file was kept");
    if (fd >= 0) close(fd);
    T_CHECK(post(port, 0, body_p, &r) && !strcmp(r.text, ref_p.text) && r.cached_tokens == cached_full,
            "then from RAM: cached %d", r.cached_tokens);
    T_CHECK(server_stop(&s) == 0, "exit");
}

static void test_unusable_dir_and_failing_writer(void) {
    /* a cache "directory" that is a file: one warning, no SSD tier, serving goes on */
    const char *file = t_write("not-a-dir", "x", 1);
    char args[700];
    snprintf(args, sizeof args, "--kv-cache-dir '%s'", file);
    server s;
    if (!server_start(&s, "notdir", NULL, args, NULL, NULL)) {
        T_CHECK(0, "server did not start");
        return;
    }
    result r;
    T_CHECK(post(s.port, 0, body_p, &r) && !strcmp(r.text, ref_p.text), "text: %d", r.status);
    T_CHECK(post(s.port, 0, body_p, &r) && !strcmp(r.text, ref_p.text) && r.cached_tokens == cached_full,
            "the RAM tier works without the SSD tier: cached %d", r.cached_tokens);
    T_CHECK(metric(s.port, "nerve_prefix_disk_up") == 0, "disk tier up");
    T_CHECK(server_stop(&s) == 0, "exit");
    char *log = read_log(&s);
    T_CHECK(count_of(log, "without the SSD tier") == 1 && count_of(log, "warning") == 1, "log: %s", log);
    free(log);

    /* writes that fail (a file size limit below one block file, as a full disk would): the
       writer stops with one warning, serving goes on */
    snprintf(args, sizeof args, "--kv-cache-dir '%s/kv-limited'", tmpdir);
    if (!server_start(&s, "limited", NULL, args, NULL, "ulimit -f 16;")) {
        T_CHECK(0, "server did not start");
        return;
    }
    T_CHECK(post(s.port, 0, body_p, &r) && !strcmp(r.text, ref_p.text), "text: %d", r.status);
    T_CHECK(post(s.port, 0, body_p2, &r) && !strcmp(r.text, ref_p2.text), "text 2: %d", r.status);
    T_CHECK(post(s.port, 0, body_p, &r) && !strcmp(r.text, ref_p.text) && r.cached_tokens == cached_full, "text 3: cached %d",
            r.cached_tokens);
    T_CHECK(metric(s.port, "nerve_prefix_disk_up") == 0 && metric(s.port, "nerve_prefix_disk_writes_total{result=\"failed\"}") == 1 &&
                metric(s.port, "nerve_prefix_cache_blocks{tier=\"disk\"}") == 0,
            "writer up %g, failed %g", metric(s.port, "nerve_prefix_disk_up"),
            metric(s.port, "nerve_prefix_disk_writes_total{result=\"failed\"}"));
    T_CHECK(wait_pool_idle(s.port), "blocks pinned after the writer stopped");
    T_CHECK(server_stop(&s) == 0, "exit");
    log = read_log(&s);
    T_CHECK(count_of(log, "writer stopped") == 1, "log: %s", log);
    free(log);
}

static void test_pool_pressure_reclaims_cached_blocks(void) {
    /* 8 blocks of 16 positions (10 KiB each in fp16); each request needs 7: the second can only run
       by reclaiming the first one's idle cached blocks */
    server s;
    if (!server_start(&s, "tiny", NULL, "--kv-memory 80K --max-batch 1 --max-queue 2 --kv-disk-cache 0", NULL, NULL)) {
        T_CHECK(0, "server did not start");
        return;
    }
    int port = s.port;
    T_CHECK(metric(port, "nerve_kv_blocks_total") == 8, "pool of %g", metric(port, "nerve_kv_blocks_total"));
    char b1[512], b2[512];
    greedy(b1, sizeof b1, "Once upon a time, there was a little girl named Lily. She loved to play outside in the park", 80);
    greedy(b2, sizeof b2, "Tom and his friend Sue went to the big lake to catch a fish. They took a red boat and sang", 80);
    result r1, r2, r3;
    T_CHECK(post(port, 0, b1, &r1) && r1.completion_tokens == 80, "first: %d", r1.status);
    int need = (r1.prompt_tokens + 80 - 1 + 15) / 16;
    T_CHECK(need == 7 || need == 8, "the first request needs %d blocks (prompt %d)", need, r1.prompt_tokens);
    T_CHECK(metric(port, "nerve_prefix_cache_idle_blocks") >= 5, "idle %g", metric(port, "nerve_prefix_cache_idle_blocks"));
    T_CHECK(post(port, 0, b2, &r2) && r2.completion_tokens == 80, "second: %d", r2.status);
    T_CHECK(metric(port, "nerve_prefix_cache_evictions_total{tier=\"ram\"}") > 0, "nothing evicted");
    T_CHECK(post(port, 0, b1, &r3) && !strcmp(r3.text, r1.text) && r3.cached_tokens % 16 == 0, "first again: cached %d",
            r3.cached_tokens);
    T_CHECK(wait_pool_idle(port), "blocks in use");
    T_CHECK(metric(port, "nerve_kv_blocks_free") == 8, "free %g", metric(port, "nerve_kv_blocks_free"));
    T_CHECK(server_stop(&s) == 0, "exit");
    /* --kv-ram-cache 0 keeps no idle block */
    if (!server_start(&s, "noram", NULL, "--kv-ram-cache 0 --kv-disk-cache 0", NULL, NULL)) {
        T_CHECK(0, "server did not start");
        return;
    }
    T_CHECK(post(s.port, 0, body_p, &r1) && !strcmp(r1.text, ref_p.text), "text");
    T_CHECK(post(s.port, 0, body_p, &r1) && r1.cached_tokens == 0, "cached %d with no RAM tier", r1.cached_tokens);
    T_CHECK(metric(s.port, "nerve_prefix_cache_idle_blocks") == 0 && metric(s.port, "nerve_prefix_cache_blocks{tier=\"ram\"}") == 0,
            "idle blocks kept");
    T_CHECK(server_stop(&s) == 0, "exit");
}

static void test_concurrent_requests_share_blocks(void) {
    server s;
    if (!server_start(&s, "share", NULL, "--kv-disk-cache 0 --prefill-chunk 256", "NERVE_TEST_STEP_DELAY_MS=40", NULL)) {
        T_CHECK(0, "server did not start");
        return;
    }
    int port = s.port;
    char a_body[2048], b_body[2048];
    snprintf(a_body, sizeof a_body, "{\"prompt\":\"%s\",\"max_tokens\":40,\"temperature\":0,\"ignore_eos\":true,\"stream\":true}",
             PROMPT_P);
    snprintf(b_body, sizeof b_body,
             "{\"prompt\":\"%s\",\"max_tokens\":40,\"temperature\":0,\"ignore_eos\":true,\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true}}",
             PROMPT_P SUFFIX);
    stream a, b;
    T_CHECK(stream_open(port, a_body, &a), "first stream did not start");
    double in_a = metric(port, "nerve_kv_blocks_in_use");
    T_CHECK(stream_open(port, b_body, &b), "second stream did not start");
    double in_ab = metric(port, "nerve_kv_blocks_in_use");
    T_CHECK(metric(port, "nerve_running_sequences") == 2, "both should be running");
    /* unshared, B would hold at least its prompt's blocks; shared, only the ones past the prefix */
    int b_alone = (ref_p2.prompt_tokens + 15) / 16;
    T_CHECK(in_ab - in_a <= 4 && in_ab - in_a < b_alone, "blocks in use: %g with A, %g with A and B (B alone: %d)", in_a,
            in_ab, b_alone);
    result ra, rb;
    stream_finish(&a, &ra);
    stream_finish(&b, &rb);
    T_CHECK(!strcmp(ra.text, ref_p.text) && !strcmp(rb.text, ref_p2.text), "shared prefix changed the text");
    T_CHECK(rb.cached_tokens >= cached_full - 16 && rb.cached_tokens > 0, "B's cached tokens %d", rb.cached_tokens);
    T_CHECK(wait_pool_idle(port), "blocks in use");
    T_CHECK(server_stop(&s) == 0, "exit");
}

/* A draft model with the prefix cache: the model as its own draft on the same engine, so a greedy
 * answer's drafts are all right but where the answer ends inside one (at most --spec-tokens refused
 * a request) exactly when the draft's keys and values are whole for every position it attends. So
 * the blocks a request finds in RAM or reads from disk hold the draft's keys and values too, or
 * the draft catches up over them: cold, from RAM, from disk after a restart, and a continuation
 * whose prompt is a cached answer's text, every text equal to a server's without drafts or cache. */
static int draft_request(int port, const char *body, const result *want, const char *what, result *r) {
    double d0 = metric(port, "nerve_spec_draft_tokens_total"), a0 = metric(port, "nerve_spec_accepted_tokens_total");
    int ok = post(port, 0, body, r);
    double drafted = metric(port, "nerve_spec_draft_tokens_total") - d0, accepted = metric(port, "nerve_spec_accepted_tokens_total") - a0;
    T_CHECK(ok && !strcmp(r->text, want->text), "%s: the text differs: %s", what, r->text);
    T_CHECK(accepted >= 20 && drafted - accepted <= 4, "%s: %.0f drafts, %.0f accepted (cached %d)", what, drafted, accepted,
            r->cached_tokens);
    return ok;
}

static void test_draft_model_with_cache(void) {
    char args[1200], cont[8192];
    server s;
    result want_c, r;
    if (!server_start(&s, "draftref", NULL, "--engine avx2 --no-prefix-cache", NULL, NULL)) {
        T_CHECK(0, "server did not start");
        return;
    }
    result want_p, want_p2;
    T_CHECK(post(s.port, 0, body_p, &want_p) && post(s.port, 0, body_p2, &want_p2), "reference answers");
    cJSON *o = cJSON_CreateObject(); /* the first answer's text continued: its blocks are the cached answer's */
    char *pc = malloc(strlen(PROMPT_P) + strlen(want_p.text) + 16);
    sprintf(pc, "%s%s Then", PROMPT_P, want_p.text);
    cJSON_AddStringToObject(o, "prompt", pc);
    cJSON_AddNumberToObject(o, "max_tokens", 40);
    cJSON_AddNumberToObject(o, "temperature", 0);
    char *js = cJSON_PrintUnformatted(o);
    snprintf(cont, sizeof cont, "%s", js);
    free(js), free(pc), cJSON_Delete(o);
    T_CHECK(post(s.port, 0, cont, &want_c), "reference continuation");
    T_CHECK(server_stop(&s) == 0, "exit");

    snprintf(args, sizeof args, "--engine avx2 --draft-engine avx2 --model-draft '%s' --spec-tokens 4 --draft-p-min 0 --kv-cache-dir '%s/draftkv'",
             model_path, tmpdir);
    if (!server_start(&s, "draft", NULL, args, NULL, NULL)) {
        T_CHECK(0, "the draft server did not start");
        return;
    }
    char *log = read_log(&s);
    T_CHECK(strstr(log, "up to 4 drafts by"), "start line: %s", log);
    free(log);
    draft_request(s.port, body_p, &want_p, "cold", &r);
    draft_request(s.port, body_p, &want_p, "RAM hit", &r);
    T_CHECK(r.cached_tokens == cached_full, "RAM hit: cached %d", r.cached_tokens);
    draft_request(s.port, body_p2, &want_p2, "a longer prompt", &r);
    draft_request(s.port, cont, &want_c, "continuation", &r);
    T_CHECK(r.cached_tokens > cached_full + 16, "continuation: cached %d, the answer's blocks not found", r.cached_tokens);
    T_CHECK(wait_pool_idle(s.port), "blocks in use");
    T_CHECK(server_stop(&s) == 0, "exit");

    if (!server_start(&s, "draft2", NULL, args, NULL, NULL)) {
        T_CHECK(0, "the draft server did not restart");
        return;
    }
    draft_request(s.port, cont, &want_c, "continuation from disk", &r);
    T_CHECK(r.cached_tokens > cached_full + 16 && metric(s.port, "nerve_prefix_cache_hits_total{tier=\"disk\"}") > 0,
            "from disk: cached %d", r.cached_tokens);
    draft_request(s.port, body_p, &want_p, "RAM hit of blocks read from disk", &r);
    T_CHECK(r.cached_tokens == cached_full && metric(s.port, "nerve_prefix_cache_hits_total{tier=\"ram\"}") > 0,
            "RAM after disk: cached %d", r.cached_tokens);
    T_CHECK(wait_pool_idle(s.port), "blocks in use");
    T_CHECK(server_stop(&s) == 0, "exit");
}

static void test_prefix_data(void) {
    t_data("models/stories260K.bin");
    t_data("models/tok512.bin");
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    snprintf(tmpdir, sizeof tmpdir, "%s", t_tmpdir());
    model_path = t_data("models/stories260K.bin");
    tok_path = t_data("models/tok512.bin");
    if (!model_path || !tok_path) {
        T_RUN(test_prefix_data); /* reports the skip */
        return t_done();
    }
    static char mp[4096], tp[4096];
    snprintf(mp, sizeof mp, "%s", model_path);
    snprintf(tp, sizeof tp, "%s", tok_path);
    model_path = mp;
    tok_path = tp;
    greedy(body_p, sizeof body_p, PROMPT_P, 40);
    greedy(body_p2, sizeof body_p2, PROMPT_P SUFFIX, 40);
    T_RUN(test_no_cache_reference);
    T_RUN(test_exact_ram_then_disk_after_restart);
    T_RUN(test_q8_pages_cache_exactly);
    T_RUN(test_bad_files_are_removed_never_used);
    T_RUN(test_unusable_dir_and_failing_writer);
    T_RUN(test_pool_pressure_reclaims_cached_blocks);
    T_RUN(test_concurrent_requests_share_blocks);
    T_RUN(test_draft_model_with_cache);
    return t_done();
}
