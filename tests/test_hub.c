/* Models from the Hugging Face Hub (src/cli/hub.c) against a Hub of the test's own on loopback
 * ($HF_ENDPOINT): the file list API (/api/models/USER/NAME?blobs=true) and /USER/NAME/resolve/main/FILE
 * redirected to where the bytes are, with Range requests, as the Hub answers them. What is chosen
 * (the tag's file, Q4_K_M by default, never mmproj, a split model whole, a transformers folder's
 * files and no other weights), that the model runs as the local file does, the cache (nothing
 * fetched twice; offline use), a stopped download resumed, a wrong SHA-256 not kept, a gated
 * repository's token, and names that would leave the cache refused. */
#include <microhttpd.h>
#include <nettle/sha2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/file.h"
#include "t.h"

typedef struct {
    const char *repo, *name;
    char path[700]; /* the bytes served */
    long long size;
    char sha256[65];
} hub_entry;

enum { MAX_ENTRIES = 32 };
static hub_entry entries[MAX_ENTRIES];
static int n_entries;
static int cut_next;      /* the next file answer stops half way (a dropped connection) */
static int corrupt_next;  /* the next file answer flips a byte */
static int file_requests; /* file answers begun */
static int ignore_range;  /* answer a Range request with the whole file (a server or proxy without ranges) */
static long long last_range = -1;
static const char *gated_repo; /* this repository's list wants "Authorization: Bearer secret" */

static void sha256_hex(const char *data, size_t n, char out[65]) {
    struct sha256_ctx c;
    uint8_t d[32];
    sha256_init(&c);
    sha256_update(&c, n, (const uint8_t *)data);
    sha256_digest(&c, 32, d);
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static void add(const char *repo, const char *name, const char *path) {
    hub_entry *e = &entries[n_entries++];
    e->repo = repo, e->name = name;
    snprintf(e->path, sizeof e->path, "%s", path);
    char *data = NULL;
    size_t n = 0;
    T_CHECK(nv_file_read_all(path, &data, &n) == NV_OK, "%s", path);
    e->size = (long long)n;
    sha256_hex(data ? data : "", n, e->sha256);
    free(data);
}

static int ends_with(const char *s, const char *tail) { return strlen(s) >= strlen(tail) && !strcmp(s + strlen(s) - strlen(tail), tail); }

static enum MHD_Result answer_text(struct MHD_Connection *c, unsigned status, const char *text) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
    const enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

typedef struct {
    char *data;
    size_t n, stop;
} body_src;

static ssize_t read_body(void *cls, uint64_t pos, char *buf, size_t max) {
    body_src *b = cls;
    if (pos >= b->stop) return b->stop < b->n ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
    size_t k = b->stop - (size_t)pos < max ? b->stop - (size_t)pos : max;
    memcpy(buf, b->data + pos, k);
    return (ssize_t)k;
}

static void free_body(void *cls) {
    body_src *b = cls;
    free(b->data);
    free(b);
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method, const char *version,
                               const char *upload, size_t *upload_n, void **state) {
    (void)cls, (void)version, (void)upload, (void)upload_n, (void)state;
    if (strcmp(method, "GET")) return answer_text(c, 405, "");
    if (!strncmp(url, "/api/models/", 12)) {
        const char *repo = url + 12, *blobs = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "blobs");
        const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
        if (gated_repo && !strcmp(repo, gated_repo) && !(auth && !strcmp(auth, "Bearer secret")))
            return answer_text(c, 401, "{\"error\":\"Access to this model is restricted\"}");
        nv_buf b = {0};
        int any = 0;
        nv_buf_printf(&b, "{\"id\":\"%s\",\"siblings\":[", repo);
        for (int i = 0; i < n_entries; i++)
            if (!strcmp(entries[i].repo, repo)) {
                if (blobs && !strcmp(blobs, "true") && ends_with(entries[i].name, ".json")) /* a small file: git's, no LFS sum */
                    nv_buf_printf(&b, "%s{\"rfilename\":\"%s\",\"size\":%lld}", any ? "," : "", entries[i].name, entries[i].size);
                else if (blobs && !strcmp(blobs, "true"))
                    nv_buf_printf(&b, "%s{\"rfilename\":\"%s\",\"size\":%lld,\"lfs\":{\"sha256\":\"%s\",\"size\":%lld}}", any ? "," : "",
                                  entries[i].name, entries[i].size, entries[i].sha256, entries[i].size);
                else
                    nv_buf_printf(&b, "%s{\"rfilename\":\"%s\"}", any ? "," : "", entries[i].name);
                any = 1;
            }
        nv_buf_printf(&b, "]}");
        if (!any) {
            nv_buf_free(&b);
            return answer_text(c, 404, "{\"error\":\"Repository not found\"}");
        }
        nv_buf_append(&b, "", 1);
        const enum MHD_Result ok = answer_text(c, 200, (const char *)b.data);
        nv_buf_free(&b);
        return ok;
    }
    const char *resolve = strstr(url, "/resolve/main/");
    if (resolve) { /* the Hub sends its LFS files from elsewhere */
        char to[1200];
        snprintf(to, sizeof to, "/cdn%.*s/%s", (int)(resolve - url), url, resolve + 14);
        struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(r, "Location", to);
        const enum MHD_Result ok = MHD_queue_response(c, 302, r);
        MHD_destroy_response(r);
        return ok;
    }
    if (!strncmp(url, "/u/evil/", 8)) /* a hostile Hub: bytes for whatever path a "../" name makes */
        return answer_text(c, 200, "GGUF");
    if (!strncmp(url, "/cdn/", 5)) {
        for (int i = 0; i < n_entries; i++) {
            char want[1200];
            snprintf(want, sizeof want, "/cdn/%s/%s", entries[i].repo, entries[i].name);
            if (strcmp(url, want)) continue;
            body_src *b = calloc(1, sizeof *b);
            if (!b || nv_file_read_all(entries[i].path, &b->data, &b->n) != NV_OK) return answer_text(c, 500, "");
            file_requests++;
            long long from = 0;
            const char *range = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Range");
            if (range && !ignore_range && sscanf(range, "bytes=%lld-", &from) == 1 && from > 0 && (size_t)from < b->n) last_range = from;
            else from = 0;
            if (corrupt_next) b->data[b->n / 2] ^= 1, corrupt_next = 0;
            memmove(b->data, b->data + from, b->n - (size_t)from);
            b->n -= (size_t)from;
            b->stop = cut_next ? b->n / 2 : b->n;
            cut_next = 0;
            struct MHD_Response *r = MHD_create_response_from_callback(b->n, 65536, read_body, b, free_body);
            if (from) {
                char cr[100];
                snprintf(cr, sizeof cr, "bytes %lld-%lld/%lld", from, entries[i].size - 1, entries[i].size);
                MHD_add_response_header(r, "Content-Range", cr);
            }
            const enum MHD_Result ok = MHD_queue_response(c, from ? 206 : 200, r);
            MHD_destroy_response(r);
            return ok;
        }
    }
    return answer_text(c, 404, "Entry not found");
}

static int same_file(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    const int same = nv_file_read_all(a, &x, &nx) == NV_OK && nv_file_read_all(b, &y, &ny) == NV_OK && nx == ny && !memcmp(x, y, nx);
    free(x), free(y);
    return same;
}

/* t_out's first line (the path nerve pull prints) into out */
static const char *printed(char *out, size_t cap) {
    snprintf(out, cap, "%.*s", (int)strcspn(t_out, "\n"), t_out);
    return out;
}

static void test_hub(void) {
    const char *m = t_data("models/stories260K.bin"), *z = t_data("models/tok512.bin");
    if (!m || !z) return;
    char args[3000], f32[700], q8[700], split[700], hf[700], junk[700], got[4400], cache[700], golden[4096];
    snprintf(f32, sizeof f32, "%s", t_path("f32.gguf"));
    snprintf(q8, sizeof q8, "%s", t_path("q8.gguf"));
    snprintf(split, sizeof split, "%s", t_path("f16.gguf"));
    snprintf(hf, sizeof hf, "%s/hf/", t_tmpdir());
    snprintf(junk, sizeof junk, "%s", t_write("junk.bin", "not a model", 11));
    snprintf(args, sizeof args, "export %s -z %s -o %s && %s export %s -z %s -o %s --type q8_0 && %s export %s -z %s -o %s --type f16 "
                                "--split-max-tensors 30 && %s export %s -z %s -o %s",
             m, z, f32, t_nerve_bin(), m, z, q8, t_nerve_bin(), m, z, split, t_nerve_bin(), m, z, hf);
    T_CHECK(t_nerve(args) == 0, "exports: %s", t_err);
    char s1[760], s2[760], cfg[760], tokj[760], tokc[760], st[760];
    snprintf(s1, sizeof s1, "%s/f16-00001-of-00002.gguf", t_tmpdir());
    snprintf(s2, sizeof s2, "%s/f16-00002-of-00002.gguf", t_tmpdir());
    snprintf(cfg, sizeof cfg, "%sconfig.json", hf);
    snprintf(tokj, sizeof tokj, "%stokenizer.json", hf);
    snprintf(tokc, sizeof tokc, "%stokenizer_config.json", hf);
    snprintf(st, sizeof st, "%smodel.safetensors", hf);
    const char *oss_cfg = t_write("oss_config.json", "{\"architectures\": [\"GptOssForCausalLM\"], \"model_type\": \"gpt_oss\"}", 65);
    const char *const src[] = {f32, q8, junk, s1, s2, cfg, tokj, tokc, st, oss_cfg};
    enum { F32, Q8, JUNK, S1, S2, CFG, TOKJ, TOKC, ST, OSS_CFG };
    static const struct {
        const char *repo, *name;
        int src;
    } listed[] = {{"u/gguf", "m-Q4_K_M.gguf", F32},
                  {"u/gguf", "model-name-Q8_0.gguf", Q8}, /* (longer than the mmproj file's name, which a shorter-name rule would pick) */
                  {"u/gguf", "mmproj-Q8_0.gguf", JUNK},
                  {"u/gguf", "F16/m-F16-00001-of-00002.gguf", S1},
                  {"u/gguf", "F16/m-F16-00002-of-00002.gguf", S2},
                  {"u/gguf", "README.md", JUNK},
                  {"u/gated", "g-Q8_0.gguf", Q8},
                  {"u/hf", "config.json", CFG},
                  {"u/hf", "tokenizer.json", TOKJ},
                  {"u/hf", "tokenizer_config.json", TOKC},
                  {"u/hf", "model.safetensors", ST},
                  {"u/hf", "consolidated.safetensors", JUNK},
                  {"u/hf", "onnx/model.onnx", JUNK},
                  {"u/evil", "../../escape.gguf", Q8},
                  {"u/oss", "config.json", OSS_CFG},
                  {"u/oss", "model.safetensors", ST}};
    for (size_t i = 0; i < sizeof listed / sizeof *listed; i++) add(listed[i].repo, listed[i].name, src[listed[i].src]);
    struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, handler, NULL, MHD_OPTION_END);
    T_CHECK(d != NULL, "the test's Hub did not start");
    if (!d) return;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%u/", info ? info->port : 0);
    snprintf(cache, sizeof cache, "%s/xdg", t_tmpdir());
    setenv("HF_ENDPOINT", endpoint, 1);
    setenv("XDG_CACHE_HOME", cache, 1);
    unsetenv("HF_TOKEN");
    unsetenv("HF_HUB_OFFLINE");
    /* the default (Q4_K_M), then a tag in any case; each runs as the file it is */
    snprintf(args, sizeof args, "generate -m %s -z %s -t 0 -n 24", f32, z);
    T_CHECK(t_nerve(args) == 0, "%s", t_err);
    snprintf(golden, sizeof golden, "%s", t_out);
    T_CHECK(t_nerve("pull u/gguf") == 0 && same_file(printed(got, sizeof got), f32) && strstr(got, "/xdg/nerve/hub/u/gguf/m-Q4_K_M.gguf"),
            "pull u/gguf: %s %s", t_out, t_err);
    snprintf(args, sizeof args, "generate -hf u/gguf -z %s -t 0 -n 24", z);
    T_CHECK(t_nerve(args) == 0 && !strcmp(t_out, golden), "generate -hf: '%s' against '%s' (%s)", t_out, golden, t_err);
    T_CHECK(t_nerve("pull u/gguf:q8_0") == 0 && same_file(printed(got, sizeof got), q8) && strstr(got, "/model-name-Q8_0.gguf"), "tag q8_0: %s %s", t_out, t_err);
    T_CHECK(t_nerve("info -hf u/gguf:q8_0") == 0 && strstr(t_out, "file type Q8_0"), "info -hf: %s %s", t_out, t_err);
    /* a split model: both files, loaded from the first */
    T_CHECK(t_nerve("pull u/gguf:F16") == 0 && same_file(printed(got, sizeof got), s1) && strstr(got, "F16/m-F16-00001-of-00002.gguf"), "F16: %s %s",
            t_out, t_err);
    char second[4500];
    snprintf(second, sizeof second, "%s/xdg/nerve/hub/u/gguf/F16/m-F16-00002-of-00002.gguf", t_tmpdir());
    T_CHECK(same_file(second, s2), "the second split file");
    snprintf(args, sizeof args, "generate -hf u/gguf:F16 -z %s -t 0 -n 24", z);
    T_CHECK(t_nerve(args) == 0 && !strcmp(t_out, golden), "generate -hf of a split model: '%s' (%s)", t_out, t_err);
    /* nothing fetched twice; --hf-file; a tag of no file, a file that is no model */
    const int before = file_requests;
    T_CHECK(t_nerve("pull u/gguf:Q8_0") == 0 && file_requests == before, "the cached file fetched again (%d requests)", file_requests - before);
    T_CHECK(t_nerve("pull u/gguf --hf-file model-name-Q8_0.gguf") == 0 && same_file(printed(got, sizeof got), q8), "--hf-file: %s", t_err);
    T_CHECK(t_nerve("pull u/gguf:Q5_K") == 1 && strstr(t_err, "no GGUF file tagged Q5_K"), "a missing tag: %s", t_err);
    T_CHECK(t_nerve("pull u/gguf --hf-file README.md") == 1 && strstr(t_err, "not a GGUF model file"), "README.md: %s", t_err);
    T_CHECK(t_nerve("pull u/nothing") == 1 && strstr(t_err, "404") && strstr(t_err, "not found"), "an unknown repository: %s", t_err);
    T_CHECK(t_nerve("pull nope") == 2 && t_nerve("pull u/gguf:Q8_0 --hf-file model-name-Q8_0.gguf") == 2 && t_nerve("pull ../x") == 2,
            "usage errors: %s", t_err);
    /* a command's own usage error comes before any download */
    const int before_usage = file_requests;
    T_CHECK(t_nerve("export -hf u/gguf:F16") == 2 && t_nerve("generate -hf u/gguf:F16 --json --grammar x") == 2 && file_requests == before_usage,
            "usage errors after %d requests: %s", file_requests - before_usage, t_err);
    /* offline: the last fetch of a tag, all there; another tag refused */
    setenv("HF_HUB_OFFLINE", "1", 1);
    T_CHECK(t_nerve("pull u/gguf:q8_0") == 0 && same_file(printed(got, sizeof got), q8) && strstr(t_err, "fetched before"), "offline: %s %s",
            t_out, t_err);
    T_CHECK(t_nerve("pull u/gguf:Q2_K") == 1 && strstr(t_err, "no earlier fetch"), "offline, never fetched: %s", t_err);
    unsetenv("HF_HUB_OFFLINE");
    /* a download stopped half way resumes with a Range request; a wrong SHA-256 is not kept */
    char dest[4500], part[4600];
    snprintf(dest, sizeof dest, "%s/xdg/nerve/hub/u/gguf/model-name-Q8_0.gguf", t_tmpdir());
    snprintf(part, sizeof part, "%s.part", dest);
    unlink(dest);
    cut_next = 1;
    last_range = -1;
    T_CHECK(t_nerve("pull u/gguf:Q8_0") == 1 && access(dest, F_OK) != 0 && access(part, F_OK) == 0, "a dropped download: %s", t_err);
    T_CHECK(t_nerve("pull u/gguf:Q8_0") == 0 && last_range > 0 && same_file(dest, q8) && access(part, F_OK) != 0,
            "resumed from %lld: %s", last_range, t_err);
    /* a file the repository changed (the same size, another SHA-256) is fetched again */
    char *changed = NULL;
    size_t changed_n = 0;
    T_CHECK(nv_file_read_all(q8, &changed, &changed_n) == NV_OK, "%s", nv_errmsg());
    hub_entry *e = NULL;
    for (int i = 0; i < n_entries; i++)
        if (!strcmp(entries[i].name, "model-name-Q8_0.gguf")) e = &entries[i];
    if (changed && e) {
        changed[changed_n / 2] ^= 1;
        snprintf(e->path, sizeof e->path, "%s", t_write("changed.gguf", changed, changed_n));
        sha256_hex(changed, changed_n, e->sha256);
        const int asked_before = file_requests;
        T_CHECK(t_nerve("pull u/gguf:Q8_0") == 0 && file_requests == asked_before + 1 && same_file(dest, e->path), "a changed file: %d requests, %s",
                file_requests - asked_before, t_err);
        T_CHECK(t_nerve("pull u/gguf:Q8_0") == 0 && file_requests == asked_before + 1, "the changed file fetched twice");
        snprintf(e->path, sizeof e->path, "%s", q8); /* back as it was */
        char *orig = NULL;
        size_t on = 0;
        if (nv_file_read_all(q8, &orig, &on) == NV_OK) sha256_hex(orig, on, e->sha256);
        free(orig);
    }
    free(changed);
    /* a server that ignores the Range request: the whole file again, from its start */
    unlink(dest);
    cut_next = 1;
    T_CHECK(t_nerve("pull u/gguf:Q8_0") == 1 && access(part, F_OK) == 0, "a dropped download: %s", t_err);
    ignore_range = 1;
    T_CHECK(t_nerve("pull u/gguf:Q8_0") == 0 && same_file(dest, q8) && access(part, F_OK) != 0, "a Range ignored: %s", t_err);
    ignore_range = 0;
    unlink(dest);
    corrupt_next = 1;
    T_CHECK(t_nerve("pull u/gguf:Q8_0") == 1 && strstr(t_err, "SHA-256") && access(dest, F_OK) != 0 && access(part, F_OK) != 0,
            "a corrupted download: %s", t_err);
    /* a gated repository: its token */
    gated_repo = "u/gated";
    T_CHECK(t_nerve("pull u/gated") == 1 && strstr(t_err, "401") && strstr(t_err, "HF_TOKEN"), "gated, no token: %s", t_err);
    T_CHECK(t_nerve("pull u/gated --hf-token secret") == 0 && same_file(printed(got, sizeof got), q8), "gated, --hf-token: %s", t_err);
    setenv("HF_TOKEN", "secret", 1);
    unlink(printed(got, sizeof got));
    T_CHECK(t_nerve("pull u/gated") == 0, "gated, HF_TOKEN: %s", t_err);
    unsetenv("HF_TOKEN");
    /* a transformers repository: the folder, its weights and no other ones */
    T_CHECK(t_nerve("pull u/hf") == 0 && strstr(printed(got, sizeof got), "/xdg/nerve/hub/u/hf"), "pull u/hf: %s %s", t_out, t_err);
    char extra[4600];
    snprintf(extra, sizeof extra, "%s/consolidated.safetensors", got);
    T_CHECK(access(extra, F_OK) != 0, "consolidated.safetensors fetched beside model.safetensors");
    snprintf(extra, sizeof extra, "%s/onnx/model.onnx", got);
    T_CHECK(access(extra, F_OK) != 0, "onnx/model.onnx fetched");
    T_CHECK(t_nerve("generate -hf u/hf -t 0 -n 24") == 0 && !strcmp(t_out, golden), "generate -hf of a folder: '%s' (%s)", t_out, t_err);
    /* a file without a SHA-256 (the Hub lists its small files so) is not resumed but fetched again whole */
    char tok_json[4600];
    snprintf(tok_json, sizeof tok_json, "%s/tokenizer.json", got);
    unlink(tok_json);
    cut_next = 1;
    last_range = -1;
    T_CHECK(t_nerve("pull u/hf") == 1 && t_nerve("pull u/hf") == 0 && last_range == -1 && same_file(tok_json, tokj),
            "a file without a sum resumed (from %lld): %s", last_range, t_err);
    /* export takes -hf too: the folder written as GGUF runs as the folder does */
    snprintf(args, sizeof args, "export -hf u/hf -o %s/from_hub.gguf && %s generate -m %s/from_hub.gguf -t 0 -n 24", t_tmpdir(), t_nerve_bin(),
             t_tmpdir());
    T_CHECK(t_nerve(args) == 0 && !strcmp(t_out, golden), "export -hf: '%s' (%s)", t_out, t_err);
    /* train -hf: fine-tunes the folder from the Hub (its tokenizer the run's) */
    const char *text = t_data("corpus/tinystories_sample.txt");
    if (text) {
        snprintf(args, sizeof args, "train -hf u/hf --data %s --steps 2 --batch 1 --seq 16 --eval-every 0 --out %s/hub_run", text, t_tmpdir());
        T_CHECK(t_nerve(args) == 0, "train -hf: %s", t_err);
        snprintf(args, sizeof args, "train -hf u/hf --vocab 300 --data %s --steps 2", text);
        T_CHECK(t_nerve(args) == 2 && strstr(t_err, "--vocab"), "train -hf --vocab: %s", t_err);
    }
    /* a folder of a model nerve does not run: refused from its config.json, its weights never fetched */
    const int asked = file_requests;
    T_CHECK(t_nerve("pull u/oss") == 1 && strstr(t_err, "GGUF repository") && file_requests == asked + 1, "u/oss: %d files fetched: %s",
            file_requests - asked, t_err);
    /* a name that would leave the cache */
    T_CHECK(t_nerve("pull u/evil") == 1 && t_nerve("pull u/evil --hf-file ../../escape.gguf") == 1, "u/evil: %s", t_err);
    snprintf(extra, sizeof extra, "%s/xdg/nerve/hub/escape.gguf", t_tmpdir());
    T_CHECK(access(extra, F_OK) != 0, "a file written outside the repository's folder");
    snprintf(extra, sizeof extra, "%s/xdg/nerve/hub/escape.gguf.part", t_tmpdir());
    T_CHECK(access(extra, F_OK) != 0, "a partial file written outside the repository's folder");
    MHD_stop_daemon(d);
}

int main(void) {
    T_RUN(test_hub);
    return t_done();
}
