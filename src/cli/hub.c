/* Models from the Hugging Face Hub (hub.h). */
#include "cli/hub.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <nettle/sha2.h>

#include "base/buf.h"
#include "base/file.h"
#include "base/hash.h"
#include "base/log.h"
#include "base/timer.h"
#include "cli/cli.h"
#include "model/gguf.h"
#include "model/hf.h"

#define MAX_LIST_BYTES (64u << 20) /* a repository's file list (large ones list ~10,000 files in a few MB) */
#define MAX_ERROR_BYTES 4096u
#define TMP_PATH 8192 /* a cache path and a listed name (at most 1,000 bytes) and more */

int cli_hub_flag(const char *cmd, int argc, char **argv, int *i, cli_hub_ref *ref) {
    const char *a = argv[*i];
    const char **dst = !strcmp(a, "-hf") || !strcmp(a, "--hf-repo") ? &ref->repo
                       : !strcmp(a, "-hff") || !strcmp(a, "--hf-file") ? &ref->file
                       : !strcmp(a, "--hf-token") ? &ref->token
                                                  : NULL;
    if (!dst) return 0;
    const char *v = cli_value(cmd, argc, argv, i);
    if (!v) return -1;
    *dst = v;
    return 1;
}

/* ---- names ------------------------------------------------------------------------------------ */

/* A repository part (user or name): letters, digits, '-', '_', '.', not starting with '.' or '-'. */
static int part_ok(const char *s, size_t n) {
    if (n == 0 || n > 96 || s[0] == '.' || s[0] == '-') return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '-' && s[i] != '_' && s[i] != '.') return 0;
    return !memmem(s, n, "..", 2);
}

/* A file of the list as a path inside the cache: relative, no empty, "." or ".." component, no
 * control character or backslash. */
static int file_ok(const char *s) {
    const size_t n = strlen(s);
    if (n == 0 || n > 1000 || s[0] == '/') return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f || s[i] == '\\') return 0;
    for (const char *p = s; *p;) {
        const char *e = strchr(p, '/');
        const size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 0 || (len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.')) return 0;
        p += len + (e != NULL);
        if (e && !*p) return 0; /* a trailing '/' */
    }
    return 1;
}

static const char *base_name(const char *s) {
    const char *b = strrchr(s, '/');
    return b ? b + 1 : s;
}

static int ends_with_ci(const char *s, const char *tail) {
    const size_t n = strlen(s), t = strlen(tail);
    return n >= t && !strcasecmp(s + n - t, tail);
}

/* Whether tag appears in name (case-insensitive) between characters that cannot continue a tag. */
static int has_tag(const char *name, const char *tag) {
    const size_t n = strlen(name), t = strlen(tag);
    for (size_t i = 0; t && i + t <= n; i++) {
        if (strncasecmp(name + i, tag, t)) continue;
        const int before = i == 0 || !(isalnum((unsigned char)name[i - 1]) || name[i - 1] == '_');
        const int after = i + t == n || !(isalnum((unsigned char)name[i + t]) || name[i + t] == '_');
        if (before && after) return 1;
    }
    return 0;
}

/* ---- HTTP ------------------------------------------------------------------------------------- */

typedef struct {
    CURL *h;
    FILE *out;      /* a download's file, or NULL: into body */
    nv_buf *body;   /* the answer (a list), or an error's text */
    long long have; /* bytes in out before this request (a Range asked from there) */
    long long got, total;
    int tty;
    const char *what;
    double t0, shown;
} xfer;

static size_t on_data(char *p, size_t size, size_t n, void *ud) {
    xfer *x = ud;
    const size_t len = size * n;
    long code = 0;
    curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &code);
    if (!x->out || code < 200 || code >= 300) { /* a list, or an error's text (kept short) */
        const size_t cap = x->out ? MAX_ERROR_BYTES : MAX_LIST_BYTES;
        if (x->body->len + len > cap) return x->out ? len : 0;
        nv_buf_append(x->body, p, len);
        return x->body->oom ? 0 : len;
    }
    if (x->have && code == 200 && x->got == 0) { /* the server sent the whole file, not the rest: start over */
        if (fflush(x->out) != 0 || ftruncate(fileno(x->out), 0) != 0 || fseek(x->out, 0, SEEK_SET) != 0) return 0;
        x->have = 0;
    }
    if (fwrite(p, 1, len, x->out) != len) return 0;
    x->got += (long long)len;
    return len;
}

static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow) {
    (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
    xfer *x = ud;
    const double t = nv_now();
    if (x->tty && t - x->shown >= 0.5) {
        x->shown = t;
        const double done = (double)(x->have + x->got) / 1e6, rate = (double)x->got / 1e6 / (t - x->t0 > 1e-3 ? t - x->t0 : 1e-3);
        fprintf(stderr, "\rnerve: %s  %.1f / %.1f MB  %.1f MB/s   ", x->what, done, (double)x->total / 1e6, rate);
    }
    return 0;
}

/* GET url (with the token as a bearer, following redirects): into x's file from x->have on, or into
 * x->body. *code: the final answer's status. */
static nv_err http_get(const char *url, const char *token, xfer *x, long *code) {
    CURL *h = curl_easy_init();
    if (!h) return nv_fail(NV_ENOMEM, "out of memory for an HTTP request");
    x->h = h;
    x->t0 = x->shown = nv_now();
    struct curl_slist *hdr = NULL;
    if (token && *token) {
        nv_buf auth = {0};
        nv_buf_printf(&auth, "Authorization: Bearer %s", token);
        nv_buf_append(&auth, "", 1);
        if (!auth.oom) hdr = curl_slist_append(hdr, (const char *)auth.data);
        nv_buf_free(&auth);
    }
    hdr = curl_slist_append(hdr, "Accept: application/json, */*");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(h, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    /* an https endpoint's answers are not redirected to plain http */
    curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, strncmp(url, "https:", 6) ? "http,https" : "https");
    curl_easy_setopt(h, CURLOPT_USERAGENT, "nerve");
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L); /* a transfer stalled for a minute fails */
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
    char range[32];
    snprintf(range, sizeof range, "%lld-", x->have);
    /* (a Range header, not curl's resume: a server that ignores it answers 200 and the file starts over, on_data) */
    if (x->out && x->have > 0) curl_easy_setopt(h, CURLOPT_RANGE, range);
    if (x->out) {
        curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(h, CURLOPT_XFERINFODATA, x);
    }
    const CURLcode rc = curl_easy_perform(h);
    *code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, code);
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    if (x->tty && x->out) fprintf(stderr, "\r%*s\r", 79, "");
    if (rc != CURLE_OK) return nv_fail(NV_EIO, "%s: %s", url, curl_easy_strerror(rc));
    return NV_OK;
}

/* The status's meaning for a user, with the answer's text when it is short and printable. */
static nv_err http_refused(const char *what, long code, const nv_buf *body) {
    char said[200] = "";
    size_t n = 0;
    for (size_t i = 0; body && i < body->len && n + 1 < sizeof said; i++)
        said[n++] = (char)(isprint((unsigned char)body->data[i]) ? body->data[i] : ' ');
    said[n] = '\0';
    const char *why = code == 401 || code == 403 ? ": the repository is gated or private (set HF_TOKEN, or --hf-token, to a token that may read it)"
                      : code == 404                ? ": not found"
                                                   : "";
    return nv_fail(NV_EIO, "%s: HTTP %ld%s%s%s", what, code, why, n && !*why ? ": " : "", *why ? "" : said);
}

/* ---- the list --------------------------------------------------------------------------------- */

typedef struct {
    char *name;
    long long size;   /* -1: not listed */
    char sha256[65];  /* an LFS file's, "" for the others */
} hub_file;

typedef struct {
    hub_file *f;
    int n;
} hub_list;

static void list_free(hub_list *l) {
    for (int i = 0; i < l->n; i++) free(l->f[i].name);
    free(l->f);
    l->f = NULL, l->n = 0;
}

static nv_err list_parse(const char *repo, const nv_buf *body, hub_list *l) {
    cJSON *root = cJSON_ParseWithLength((const char *)body->data, body->len);
    const cJSON *sib = root ? cJSON_GetObjectItemCaseSensitive(root, "siblings") : NULL;
    if (!cJSON_IsArray(sib)) {
        cJSON_Delete(root);
        return nv_fail(NV_EFORMAT, "%s: the Hub's answer holds no file list (\"siblings\")", repo);
    }
    const int n = cJSON_GetArraySize(sib);
    l->f = calloc((size_t)n + 1, sizeof *l->f);
    nv_err e = l->f ? NV_OK : nv_fail(NV_ENOMEM, "out of memory");
    const cJSON *s;
    cJSON_ArrayForEach(s, sib) {
        if (e != NV_OK) break;
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(s, "rfilename"), *size = cJSON_GetObjectItemCaseSensitive(s, "size"),
                    *lfs = cJSON_GetObjectItemCaseSensitive(s, "lfs");
        const cJSON *sha = lfs ? cJSON_GetObjectItemCaseSensitive(lfs, "sha256") : NULL;
        if (!cJSON_IsString(name)) {
            e = nv_fail(NV_EFORMAT, "%s: a file of the Hub's list has no name", repo);
            break;
        }
        hub_file *f = &l->f[l->n];
        f->size = cJSON_IsNumber(size) && size->valuedouble >= 0 && size->valuedouble < 1e15 ? (long long)size->valuedouble : -1;
        if (cJSON_IsString(sha) && strlen(sha->valuestring) == 64 && strspn(sha->valuestring, "0123456789abcdef") == 64)
            memcpy(f->sha256, sha->valuestring, 65);
        if (!(f->name = strdup(name->valuestring))) e = nv_fail(NV_ENOMEM, "out of memory");
        else l->n++;
    }
    cJSON_Delete(root);
    if (e != NV_OK) list_free(l);
    return e;
}

static const hub_file *list_find(const hub_list *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->f[i].name, name)) return &l->f[i];
    return NULL;
}

static int by_name(const void *a, const void *b) { return strcmp(((const hub_file *)a)->name, ((const hub_file *)b)->name); }

static int is_gguf_model(const char *name) { return ends_with_ci(name, ".gguf") && !strcasestr(base_name(name), "mmproj"); }

/* The GGUF file ref asks for: --hf-file's, the tag's (a file not split, else a first split; the
 * shortest name first), Q4_K_M's without a tag, else the first. */
static const hub_file *pick_gguf(const hub_list *l, const char *tag, int *any) {
    const hub_file *best = NULL;
    *any = 0;
    for (int pass = 0; pass < 2 && !best; pass++) {
        const char *want = pass == 0 ? (tag ? tag : "Q4_K_M") : NULL;
        if (pass == 1 && tag) break; /* a tag that matches nothing is an error, not another file */
        for (int i = 0; i < l->n; i++) {
            const hub_file *f = &l->f[i];
            if (!is_gguf_model(f->name) || !file_ok(f->name)) continue;
            *any = 1;
            int count = 0;
            const int no = nv_gguf_split_no(f->name, &count);
            if (no > 1 || (want && !has_tag(base_name(f->name), want))) continue;
            if (!best || strlen(f->name) < strlen(best->name)) best = f;
        }
    }
    return best;
}

/* ---- the cache -------------------------------------------------------------------------------- */

static nv_err cache_root(char *out, size_t cap) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (xdg && *xdg) n = snprintf(out, cap, "%s/nerve/hub", xdg);
    else if (home && *home) n = snprintf(out, cap, "%s/.cache/nerve/hub", home);
    else return nv_fail(NV_EINVAL, "neither XDG_CACHE_HOME nor HOME is set: no place for the Hub's files");
    return n > 0 && (size_t)n < cap ? NV_OK : nv_fail(NV_ERANGE, "the cache's path is too long");
}

static nv_err sha256_file(const char *path, char hex[65]) {
    nv_mapped m;
    NV_TRY(nv_file_map(path, &m));
    struct sha256_ctx ctx;
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_init(&ctx);
    for (size_t at = 0; at < m.len; at += 1u << 30) sha256_update(&ctx, m.len - at < (1u << 30) ? m.len - at : 1u << 30, m.data + at);
    sha256_digest(&ctx, sizeof d, d);
    nv_file_unmap(&m);
    for (int i = 0; i < SHA256_DIGEST_SIZE; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
    return NV_OK;
}

static long long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) ? (long long)st.st_size : -1;
}

/* Makes the folders above path (inside the cache). */
static nv_err parent_dirs(const char *path) {
    char dir[TMP_PATH];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    return nv_mkdirs(dir);
}

/* Where the SHA-256 a file was fetched with is kept: ".NAME.sha256" beside it. */
static void sum_path(const char *dest, char *out, size_t cap) {
    const char *base = base_name(dest);
    snprintf(out, cap, "%.*s.%s.sha256", (int)(base - dest), dest, base);
}

/* Whether dest holds f as the list gives it now: its size, and (an LFS file) the SHA-256 it was
 * fetched with, so a file the repository changed is fetched again. */
static int cached(const char *dest, const hub_file *f) {
    if (f->size < 0 || file_size(dest) != f->size) return 0;
    if (!f->sha256[0]) return 1;
    char sp[TMP_PATH + 16], *kept = NULL;
    sum_path(dest, sp, sizeof sp);
    const int same = nv_file_read_all(sp, &kept, NULL) == NV_OK && !strcmp(kept, f->sha256);
    free(kept);
    return same;
}

/* f of repo into dir/f->name: through .part (resumed), checked, renamed. */
static nv_err download(const char *endpoint, const char *repo, const char *token, const char *dir, const hub_file *f) {
    char dest[TMP_PATH], part[TMP_PATH + 8], url[3 * TMP_PATH];
    snprintf(dest, sizeof dest, "%s/%s", dir, f->name);
    snprintf(part, sizeof part, "%s.part", dest);
    if (cached(dest, f)) return NV_OK; /* fetched before */
    NV_TRY(parent_dirs(dest));
    /* the name's components escaped, its slashes kept */
    nv_buf u = {0};
    nv_buf_printf(&u, "%s/%s/resolve/main/", endpoint, repo);
    for (const char *p = f->name; *p;) {
        const size_t len = strcspn(p, "/");
        char *esc = curl_easy_escape(NULL, p, (int)len);
        if (!esc) {
            nv_buf_free(&u);
            return nv_fail(NV_ENOMEM, "out of memory");
        }
        nv_buf_printf(&u, "%s%s", esc, p[len] ? "/" : "");
        curl_free(esc);
        p += len + (p[len] != 0);
    }
    snprintf(url, sizeof url, "%.*s", (int)u.len, u.oom ? "" : (const char *)u.data);
    nv_buf_free(&u);
    FILE *out = fopen(part, "ab");
    if (!out) return nv_fail(NV_EIO, "%s: %s", part, strerror(errno));
    /* held until the part has its name (released when it is closed): one process at a time */
    if (flock(fileno(out), LOCK_EX | LOCK_NB) != 0) {
        fclose(out);
        return nv_fail(NV_EIO, "%s/%s: another process is downloading it into %s", repo, f->name, part);
    }
    if (cached(dest, f)) { /* that process finished it meanwhile */
        fclose(out);
        return NV_OK;
    }
    long long have = fseek(out, 0, SEEK_END) == 0 ? ftell(out) : -1;
    /* not the file's start, or a file without a SHA-256 to check a resumed whole by: begin again */
    if (have < 0 || (f->size >= 0 && have > f->size) || (have > 0 && !f->sha256[0])) {
        if (ftruncate(fileno(out), 0) != 0) {
            fclose(out);
            return nv_fail(NV_EIO, "%s: %s", part, strerror(errno));
        }
        have = 0;
    }
    nv_buf err = {0};
    xfer x = {.out = out, .body = &err, .have = have, .total = f->size, .tty = isatty(STDERR_FILENO), .what = base_name(f->name)};
    long code = 206; /* a part already whole (a stop between its last byte and its rename) asks for nothing */
    const double t0 = nv_now();
    nv_err e = NV_OK;
    if (!(f->size >= 0 && have == f->size)) {
        nv_info("hub: %s %s/%s (%.1f MB)%s", have ? "resuming" : "downloading", repo, f->name, (double)(f->size > 0 ? f->size : 0) / 1e6,
                have ? " from where it stopped" : "");
        e = http_get(url, token, &x, &code);
    }
    const int synced = fflush(out) == 0 && fsync(fileno(out)) == 0;
    const long long got = file_size(part);
    if (e == NV_OK && code != 200 && code != 206) e = http_refused(url, code, &err);
    else if (e == NV_OK && !synced) e = nv_fail(NV_EIO, "%s: %s", part, strerror(errno));
    else if (e == NV_OK && f->size >= 0 && got != f->size)
        e = nv_fail(NV_EIO, "%s/%s: %lld bytes arrived, the Hub lists %lld (run again to resume)", repo, f->name, got, f->size);
    nv_buf_free(&err);
    if (e == NV_OK && f->sha256[0]) {
        char hex[65];
        if ((e = sha256_file(part, hex)) == NV_OK && strcmp(hex, f->sha256)) {
            unlink(part); /* whole but wrong: a resume could never mend it */
            e = nv_fail(NV_EFORMAT, "%s/%s: its SHA-256 is %s, the Hub lists %s: not kept", repo, f->name, hex, f->sha256);
        }
    }
    if (e == NV_OK && rename(part, dest) != 0) e = nv_fail(NV_EIO, "%s: %s", dest, strerror(errno));
    char sp[TMP_PATH + 16];
    sum_path(dest, sp, sizeof sp);
    if (e == NV_OK && f->sha256[0]) e = nv_file_write_atomic(sp, &(nv_iov){f->sha256, 64}, 1);
    else if (e == NV_OK) unlink(sp);
    fclose(out);
    if (e == NV_OK) {
        nv_file_sync_parent(dest);
        const double t = nv_now() - t0;
        nv_info("hub: %s/%s: %.1f MB in %.1f s", repo, f->name, (double)got / 1e6, t);
    }
    return e;
}

/* ---- the choice kept for offline use --------------------------------------------------------- */

/* dir/.nerve-choice-TAG: the files chosen, one a line, the first the one to load ("." for the folder). */
static void choice_path(const char *dir, const char *key, char *out, size_t cap) {
    if ((size_t)snprintf(out, cap, "%s/.nerve-choice-%s", dir, key) >= cap) out[0] = '\0';
}

static nv_err choice_save(const char *dir, const char *key, const char *load, const hub_list *files) {
    nv_buf b = {0};
    nv_buf_printf(&b, "%s\n", load);
    for (int i = 0; i < files->n; i++) nv_buf_printf(&b, "%s\n", files->f[i].name);
    char p[TMP_PATH];
    choice_path(dir, key, p, sizeof p);
    nv_err e = b.oom ? nv_fail(NV_ENOMEM, "out of memory") : nv_file_write_atomic(p, &(nv_iov){b.data, b.len}, 1);
    nv_buf_free(&b);
    return e;
}

/* The load path the last fetch chose, when every file it chose is there. */
static int choice_load(const char *dir, const char *key, char *path, size_t cap) {
    char p[TMP_PATH], *text = NULL;
    choice_path(dir, key, p, sizeof p);
    if (nv_file_read_all(p, &text, NULL) != NV_OK) return 0;
    int ok = 1, first = 1;
    for (char *line = strtok(text, "\n"); line && ok; line = strtok(NULL, "\n"), first = 0) {
        if (first) {
            ok = !strcmp(line, ".") || file_ok(line);
            const int w = !ok ? 0 : !strcmp(line, ".") ? snprintf(path, cap, "%s", dir) : snprintf(path, cap, "%s/%s", dir, line);
            ok = ok && w > 0 && (size_t)w < cap;
            continue;
        }
        char f[TMP_PATH];
        snprintf(f, sizeof f, "%s/%s", dir, line);
        ok = file_ok(line) && file_size(f) >= 0;
    }
    free(text);
    return ok && !first;
}

/* ---- choosing and fetching -------------------------------------------------------------------- */

/* The files to fetch into *want (names shared with l) and the one to load (NULL: the folder). */
static nv_err choose(const char *repo, const hub_list *l, const cli_hub_ref *ref, const char *tag, hub_list *want, const char **load) {
    *load = NULL;
    want->f = calloc((size_t)l->n + 1, sizeof *want->f);
    want->n = 0;
    if (!want->f) return nv_fail(NV_ENOMEM, "out of memory");
    const hub_file *g = NULL;
    int any = 0;
    if (ref->file) {
        char shown[128];
        if (!(g = list_find(l, ref->file)))
            return nv_fail(NV_EINVAL, "%s has no file '%s'", repo, nv_gguf_shown(ref->file, strlen(ref->file), shown, sizeof shown));
        if (!is_gguf_model(g->name) || !file_ok(g->name)) return nv_fail(NV_EINVAL, "--hf-file %s: not a GGUF model file", ref->file);
    } else if (!(g = pick_gguf(l, tag, &any)) && (tag || any)) {
        return nv_fail(NV_EINVAL, "%s has no GGUF file %s%s", repo, tag ? "tagged " : "", tag ? tag : "");
    }
    if (g) {
        int count = 0;
        const int no = nv_gguf_split_no(g->name, &count);
        *load = g->name;
        want->f[want->n++] = *g;
        for (int k = 2; no == 1 && k <= count; k++) { /* the rest of a split model */
            char name[1100];
            nv_gguf_split_name(g->name, k - 1, count, name, sizeof name); /* (fits: the first's length, at most 1000) */
            const hub_file *s = list_find(l, name);
            if (!s) return nv_fail(NV_EFORMAT, "%s lists %s but not its split %s", repo, g->name, name);
            want->f[want->n++] = *s;
        }
        return NV_OK;
    }
    /* no GGUF file: a transformers folder */
    if (!list_find(l, "config.json"))
        return nv_fail(NV_EUNSUPPORTED, "%s has neither a GGUF file nor a transformers model (config.json)", repo);
    const int indexed = list_find(l, "model.safetensors.index.json") != NULL, single = list_find(l, "model.safetensors") != NULL;
    for (int i = 0; i < l->n; i++) {
        const hub_file *f = &l->f[i];
        const int top = !strchr(f->name, '/');
        const int meta = ends_with_ci(f->name, ".json") || ends_with_ci(f->name, ".jinja");
        const int weights = top && ends_with_ci(f->name, ".safetensors") && !indexed && (!single || !strcmp(f->name, "model.safetensors"));
        if ((meta || weights) && file_ok(f->name)) want->f[want->n++] = *f;
    }
    return NV_OK;
}

/* The shards model.safetensors.index.json names (after it is fetched), added to want. */
static nv_err index_shards(const char *repo, const char *dir, const hub_list *l, hub_list *want) {
    char p[TMP_PATH], *text = NULL;
    size_t len = 0;
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    NV_TRY(nv_file_read_all(p, &text, &len));
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *map = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL, *it;
    nv_err e = cJSON_IsObject(map) ? NV_OK : nv_fail(NV_EFORMAT, "%s: model.safetensors.index.json has no weight_map", repo);
    cJSON_ArrayForEach(it, map) {
        if (e != NV_OK) break;
        if (!cJSON_IsString(it)) {
            char shown[128];
            e = nv_fail(NV_EFORMAT, "%s: model.safetensors.index.json maps '%s' to no file", repo,
                        nv_gguf_shown(it->string ? it->string : "?", it->string ? strlen(it->string) : 1, shown, sizeof shown));
            break;
        }
        int seen = 0;
        for (int i = 0; i < want->n && !seen; i++) seen = !strcmp(want->f[i].name, it->valuestring);
        if (seen) continue;
        const hub_file *f = list_find(l, it->valuestring);
        char shown[128];
        if (!f || strchr(f->name, '/') || !file_ok(f->name))
            e = nv_fail(NV_EFORMAT, "%s: the index names '%s', which the repository does not list", repo,
                        nv_gguf_shown(it->valuestring, strlen(it->valuestring), shown, sizeof shown));
        else want->f[want->n++] = *f;
    }
    cJSON_Delete(root);
    return e;
}

static int fetch(const char *cmd, const cli_hub_ref *ref, char *path, size_t cap);

int cli_hub_fetch(const char *cmd, const cli_hub_ref *ref, const char **model_path, char *path, size_t cap) {
    if (!ref->repo) return ref->file || ref->token ? cli_error(cmd, 2, "--hf-file and --hf-token go with -hf USER/NAME") : 0;
    if (*model_path) return cli_error(cmd, 2, "a model's path and -hf: one or the other");
    const int rc = fetch(cmd, ref, path, cap);
    if (!rc) *model_path = path;
    return rc;
}

static int fetch(const char *cmd, const cli_hub_ref *ref, char *path, size_t cap) {
    /* USER/NAME[:TAG] */
    char repo[256], tag[64] = "";
    const char *colon = strchr(ref->repo, ':'), *slash = strchr(ref->repo, '/');
    const size_t rl = colon ? (size_t)(colon - ref->repo) : strlen(ref->repo);
    if (!slash || slash > ref->repo + rl || !part_ok(ref->repo, (size_t)(slash - ref->repo)) ||
        !part_ok(slash + 1, rl - (size_t)(slash + 1 - ref->repo)) || rl >= sizeof repo)
        return cli_error(cmd, 2, "-hf expects USER/NAME or USER/NAME:TAG (a Hugging Face repository), not '%s'", ref->repo);
    if (colon && (!colon[1] || strlen(colon + 1) >= sizeof tag || strspn(colon + 1, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") != strlen(colon + 1)))
        return cli_error(cmd, 2, "-hf %s: a tag is letters, digits, '_', '.' and '-' (Q4_K_M, Q8_0, ...)", ref->repo);
    snprintf(repo, sizeof repo, "%.*s", (int)rl, ref->repo);
    if (colon) snprintf(tag, sizeof tag, "%s", colon + 1);
    if (colon && ref->file) return cli_error(cmd, 2, "-hf %s with --hf-file: the tag or the file, not both", ref->repo);
    char root[4096], dir[4400], key[80];
    if (cache_root(root, sizeof root) != NV_OK) return cli_error(cmd, 1, "%s", nv_errmsg());
    snprintf(dir, sizeof dir, "%s/%s", root, repo);
    /* the choice's key: the tag (upper case), the file's hash, or the default */
    if (ref->file) snprintf(key, sizeof key, "file-%016llx", (unsigned long long)nv_hash64(ref->file, strlen(ref->file), 0));
    else snprintf(key, sizeof key, "%s", *tag ? tag : "default");
    for (char *p = key; *p; p++) *p = (char)toupper((unsigned char)*p);
    const char *endpoint_env = getenv("HF_ENDPOINT");
    char endpoint[1024];
    snprintf(endpoint, sizeof endpoint, "%s", endpoint_env && *endpoint_env ? endpoint_env : "https://huggingface.co");
    for (size_t n = strlen(endpoint); n && endpoint[n - 1] == '/'; n--) endpoint[n - 1] = '\0';
    const char *token = ref->token ? ref->token : getenv("HF_TOKEN");
    const char *offline_env = getenv("HF_HUB_OFFLINE");
    const int offline = offline_env && (!strcmp(offline_env, "1") || !strcasecmp(offline_env, "true") || !strcasecmp(offline_env, "yes"));
    /* the list */
    nv_buf body = {0};
    nv_err e = NV_OK;
    long code = 0;
    if (offline) e = nv_fail(NV_EIO, "HF_HUB_OFFLINE is set");
    else {
        curl_global_init(CURL_GLOBAL_DEFAULT);
        char url[1400];
        snprintf(url, sizeof url, "%s/api/models/%s?blobs=true", endpoint, repo);
        xfer x = {.body = &body};
        if ((e = http_get(url, token, &x, &code)) == NV_OK && code != 200) e = http_refused(repo, code, &body);
    }
    if (e != NV_OK) { /* offline: what the last fetch chose, when it is all there */
        char why[1100];
        snprintf(why, sizeof why, "%s", nv_errmsg());
        nv_buf_free(&body);
        if (code != 401 && code != 403 && code != 404 && choice_load(dir, key, path, cap)) {
            nv_warn("%s: the Hub could not be asked (%s): using the files fetched before", repo, why);
            return 0;
        }
        return cli_error(cmd, 1, "%s%s", why, code == 0 ? " (and the cache holds no earlier fetch of it)" : "");
    }
    hub_list l = {0}, want = {0};
    const char *load = NULL;
    e = list_parse(repo, &body, &l);
    nv_buf_free(&body);
    if (e == NV_OK) {
        qsort(l.f, (size_t)l.n, sizeof *l.f, by_name);
        e = choose(repo, &l, ref, *tag ? tag : NULL, &want, &load);
    }
    /* a folder's config.json first: a model nerve does not run is refused before its weights come */
    const hub_file *config = !load && e == NV_OK ? list_find(&l, "config.json") : NULL;
    if (config && (e = download(endpoint, repo, token, dir, config)) == NV_OK) {
        char cfg[4500];
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
        if (nv_hf_check_config(cfg) != NV_OK)
            e = nv_fail(NV_EUNSUPPORTED, "%s: %s (its weights are not fetched; a GGUF repository of the model may run: -hf USER/NAME-GGUF)",
                        repo, nv_errmsg());
    }
    /* the folder's index next: it names the weights */
    const hub_file *index = !load && e == NV_OK ? list_find(&l, "model.safetensors.index.json") : NULL;
    if (index && (e = download(endpoint, repo, token, dir, index)) == NV_OK) e = index_shards(repo, dir, &l, &want);
    for (int i = 0; i < want.n && e == NV_OK; i++) e = download(endpoint, repo, token, dir, &want.f[i]);
    if (e == NV_OK) e = choice_save(dir, key, load ? load : ".", &want);
    if (e == NV_OK) {
        int n = load ? snprintf(path, cap, "%s/%s", dir, load) : snprintf(path, cap, "%s", dir);
        if (n < 0 || (size_t)n >= cap) e = nv_fail(NV_ERANGE, "%s: the cache's path is too long", repo);
    }
    free(want.f); /* (its names are l's) */
    list_free(&l);
    return e == NV_OK ? 0 : cli_error(cmd, 1, "%s", nv_errmsg());
}
