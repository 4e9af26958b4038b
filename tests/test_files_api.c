/* OpenAI's Files and Batch APIs on nerve serve (--files-dir): uploads kept byte for byte across
 * restarts, listed, read and deleted; every malformed upload refused with nothing kept; a batch's
 * answers exactly what the server gives each body; bad input lines failing the batch with their
 * numbers; a server stopped part way going on with the batch at its next start (a torn line
 * dropped, every request answered once); cancel; and a batch's requests queued behind others. */
#include <ctype.h>
#include <dirent.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/buf.h"
#include "t.h"
#include "serve_util.h"

#define FLAGS "--kv-memory 64M --kv-disk-cache 0 --chat-template chatml"
#define KEY "Authorization: Bearer sk-files\r\n"

static const char *model_path(void) { return t_data("models/stories260K.bin"); }
static const char *tok_path(void) { return t_data("models/tok512.bin"); }

static const char *str_of(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static double num_of(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* POST path as multipart/form-data: the purpose field (NULL: none) and content (NULL: none) as the
   field `field` of filename. */
static int post_multipart(int port, const char *path, const char *purpose, const char *field, const char *filename, const char *content,
                          resp *r) {
    nv_buf body = {0};
    char part[512];
    if (purpose) {
        snprintf(part, sizeof part, "--XyZb\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n%s\r\n", purpose);
        nv_buf_append(&body, part, strlen(part));
    }
    if (content) {
        snprintf(part, sizeof part,
                 "--XyZb\r\nContent-Disposition: form-data; name=\"%s\"; filename=\"%s\"\r\nContent-Type: application/octet-stream\r\n\r\n",
                 field, filename);
        nv_buf_append(&body, part, strlen(part));
        nv_buf_append(&body, content, strlen(content));
        nv_buf_append(&body, "\r\n", 2);
    }
    nv_buf_append(&body, "--XyZb--\r\n\r\n", 12); /* and an epilogue, as the OpenAI SDK sends one */
    nv_buf raw = {0};
    snprintf(part, sizeof part,
             "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" KEY
             "Content-Type: multipart/form-data; boundary=XyZb\r\nContent-Length: %zu\r\n\r\n",
             path, body.len);
    nv_buf_append(&raw, part, strlen(part));
    nv_buf_append(&raw, body.data, body.len);
    const int ok = http_raw(port, raw.data, raw.len, r);
    nv_buf_free(&body);
    nv_buf_free(&raw);
    return ok;
}

/* POST /v1/files: the purpose field (NULL: none) and the file (NULL: none). */
static int upload(int port, const char *purpose, const char *filename, const char *content, resp *r) {
    return post_multipart(port, "/v1/files", purpose, "file", filename, content, r);
}

/* GET path's JSON answer (NULL unless 200). */
static cJSON *get_json(int port, const char *path) {
    resp r;
    cJSON *j = NULL;
    if (http(port, "GET", path, KEY, NULL, &r) && r.status == 200) j = cJSON_Parse(r.body);
    resp_free(&r);
    return j;
}

/* The id of the file content uploaded with purpose, or "" after a failed check. */
static void upload_id(int port, const char *purpose, const char *content, char id[64]) {
    resp r;
    id[0] = 0;
    T_CHECK(upload(port, purpose, "in.jsonl", content, &r) && r.status == 200, "upload: %d %s", r.status, r.body ? r.body : "");
    cJSON *j = cJSON_Parse(r.body ? r.body : "");
    snprintf(id, 64, "%s", str_of(j, "id"));
    cJSON_Delete(j);
    resp_free(&r);
}

static char *file_content(int port, const char *id) {
    char path[128];
    snprintf(path, sizeof path, "/v1/files/%s/content", id);
    resp r;
    char *s = NULL;
    if (http(port, "GET", path, KEY, NULL, &r) && r.status == 200) s = strdup(r.body);
    resp_free(&r);
    return s;
}

/* POST /v1/batches for file id: the batch's id ("" after a failed check). */
static void create_batch(int port, const char *file_id, const char *endpoint, char id[64]) {
    char body[256];
    snprintf(body, sizeof body, "{\"input_file_id\":\"%s\",\"endpoint\":\"%s\",\"completion_window\":\"24h\",\"metadata\":{\"k\":\"v\"}}",
             file_id, endpoint);
    resp r;
    id[0] = 0;
    T_CHECK(http(port, "POST", "/v1/batches", KEY, body, &r) && r.status == 200, "create: %d %s", r.status, r.body ? r.body : "");
    cJSON *j = cJSON_Parse(r.body ? r.body : "");
    T_CHECK(!strcmp(str_of(j, "status"), "validating") && !strcmp(str_of(j, "object"), "batch") &&
                !strcmp(str_of(cJSON_GetObjectItemCaseSensitive(j, "metadata"), "k"), "v"),
            "the new batch: %s", r.body ? r.body : "");
    snprintf(id, 64, "%s", str_of(j, "id"));
    cJSON_Delete(j);
    resp_free(&r);
}

/* Polls a batch (OpenAI's at /v1/batches, or Anthropic's at /v1/messages/batches: its
   processing_status) until its status is one of until's words (or until wait_s): its object. */
static cJSON *poll_batch(int port, const char *base, const char *field, const char *id, const char *until, double wait_s) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", base, id);
    cJSON *j = NULL;
    for (double t0 = now_s(); now_s() - t0 < wait_s; sleep_ms(30)) {
        cJSON_Delete(j);
        j = get_json(port, path);
        if (j && str_of(j, field)[0] && strstr(until, str_of(j, field))) break;
    }
    return j;
}

static cJSON *wait_batch(int port, const char *id, const char *until, double wait_s) {
    return poll_batch(port, "/v1/batches", "status", id, until, wait_s);
}

static double count_of(const cJSON *b, const char *k) { return num_of(cJSON_GetObjectItemCaseSensitive(b, "request_counts"), k); }

/* Every line of text as JSON, into lines (at most cap); the count. */
static int json_lines(const char *text, cJSON **lines, int cap) {
    int n = 0;
    for (const char *p = text; p && *p && n < cap;) {
        const char *nl = strchr(p, '\n');
        const size_t len = nl ? (size_t)(nl - p) : strlen(p);
        lines[n++] = cJSON_ParseWithLength(p, len);
        p = nl ? nl + 1 : NULL;
    }
    return n;
}

/* ---- files ------------------------------------------------------------------------------------------ */

static int names_in(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *de; d && (de = readdir(d));) n += !strncmp(de->d_name, prefix, strlen(prefix));
    if (d) closedir(d);
    return n;
}

static void test_files(void) {
    if (!model_path() || !tok_path()) return;
    const char *dir = t_path("store");
    char args[1024];
    snprintf(args, sizeof args, FLAGS " --api-key sk-files --files-dir '%s' --files-max-bytes 4K", dir);
    server s;
    if (!server_spawn(&s, "files", NULL, NULL, model_path(), tok_path(), args, 60)) return;
    resp r;
    char ids[3][64];
    static const char *const texts[3] = {"{\"a\":1}\n", "line one\nline two\n", "third \xc3\xa9\n"};
    static const char *const purposes[3] = {"batch", "user_data", "batch"};
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "f%d.jsonl", i);
        T_CHECK(upload(s.port, purposes[i], name, texts[i], &r) && r.status == 200, "upload %d: %d %s", i, r.status, r.body);
        cJSON *j = cJSON_Parse(r.body ? r.body : "");
        snprintf(ids[i], sizeof ids[i], "%s", str_of(j, "id"));
        T_CHECK(!strncmp(ids[i], "file-", 5) && !strcmp(str_of(j, "object"), "file") && num_of(j, "bytes") == (double)strlen(texts[i]) &&
                    !strcmp(str_of(j, "filename"), name) && !strcmp(str_of(j, "purpose"), purposes[i]) && num_of(j, "created_at") > 0,
                "the File object: %s", r.body);
        cJSON_Delete(j);
        resp_free(&r);
    }
    /* the bytes as uploaded */
    char *c1 = file_content(s.port, ids[1]);
    T_CHECK(c1 && !strcmp(c1, texts[1]), "content: %s", c1 ? c1 : "-");
    free(c1);
    /* lists: newest first by default, a purpose, ascending order, limit and after */
    cJSON *l = get_json(s.port, "/v1/files");
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(l, "data");
    T_CHECK(cJSON_GetArraySize(data) == 3 && !strcmp(str_of(cJSON_GetArrayItem(data, 0), "id"), ids[2]) &&
                !strcmp(str_of(l, "object"), "list") && cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(l, "has_more")),
            "the list");
    cJSON_Delete(l);
    l = get_json(s.port, "/v1/files?purpose=batch&order=asc&limit=1");
    data = cJSON_GetObjectItemCaseSensitive(l, "data");
    T_CHECK(cJSON_GetArraySize(data) == 1 && !strcmp(str_of(cJSON_GetArrayItem(data, 0), "id"), ids[0]) &&
                cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(l, "has_more")),
            "purpose, order, limit");
    cJSON_Delete(l);
    char path[160];
    snprintf(path, sizeof path, "/v1/files?purpose=batch&order=asc&after=%s", ids[0]);
    l = get_json(s.port, path);
    data = cJSON_GetObjectItemCaseSensitive(l, "data");
    T_CHECK(cJSON_GetArraySize(data) == 1 && !strcmp(str_of(cJSON_GetArrayItem(data, 0), "id"), ids[2]), "after");
    cJSON_Delete(l);
    /* refused, nothing kept: no purpose, an unknown one, no file, two files, past the store's room,
       not multipart, no key; and ids that are not the store's */
    static const char *const big_fmt = "%05000d";
    char big[5100];
    snprintf(big, sizeof big, big_fmt, 7);
    struct {
        const char *purpose, *content;
        int status;
    } bad[] = {{NULL, "x", 400}, {"weights", "x", 400}, {"batch", NULL, 400}, {"batch", big, 413}};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        T_CHECK(upload(s.port, bad[k].purpose, "b.jsonl", bad[k].content, &r) && r.status == bad[k].status &&
                    strstr(r.body, "\"error\""),
                "bad upload %zu: %d %s", k, r.status, r.body);
        resp_free(&r);
    }
    const char *two_body = "--XyZb\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
                           "--XyZb\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\naa\r\n"
                           "--XyZb\r\nContent-Disposition: form-data; name=\"file\"; filename=\"b\"\r\n\r\nbb\r\n--XyZb--\r\n";
    char two[1024];
    snprintf(two, sizeof two,
             "POST /v1/files HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" KEY
             "Content-Type: multipart/form-data; boundary=XyZb\r\nContent-Length: %zu\r\n\r\n%s",
             strlen(two_body), two_body);
    T_CHECK(http_raw(s.port, two, strlen(two), &r) && r.status == 400 && strstr(r.body, "one file"), "two files: %d %s", r.status,
            r.body);
    resp_free(&r);
    /* a part without a quoted name (the processor gives no key), a body cut before its close delimiter */
    static const char *const odd_bodies[] = {
        "--XyZb\r\nContent-Disposition: form-data\r\n\r\nbatch\r\n--XyZb--\r\n",
        "--XyZb\r\nContent-Disposition: form-data; name=file; filename=\"a\"\r\n\r\naa\r\n--XyZb--\r\n",
        "--XyZb\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--XyZb\r\nContent-Disposition: form-data; "
        "name=\"file\"; filename=\"a\"\r\n\r\nthe first bytes of a file cut short"};
    for (int k = 0; k < 3; k++) {
        char raw[1024];
        snprintf(raw, sizeof raw,
                 "POST /v1/files HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" KEY
                 "Content-Type: multipart/form-data; boundary=XyZb\r\nContent-Length: %zu\r\n\r\n%s",
                 strlen(odd_bodies[k]), odd_bodies[k]);
        T_CHECK(http_raw(s.port, raw, strlen(raw), &r) && r.status == 400, "odd body %d: %d %s", k, r.status, r.body ? r.body : "");
        resp_free(&r);
    }
    T_CHECK(http(s.port, "POST", "/v1/files", KEY, "{\"purpose\":\"batch\"}", &r) && r.status == 400 && strstr(r.body, "multipart"),
            "JSON body: %d %s", r.status, r.body);
    resp_free(&r);
    T_CHECK(http(s.port, "GET", "/v1/files", NULL, NULL, &r) && r.status == 401, "no key: %d", r.status);
    resp_free(&r);
    static const char *const wrong[] = {"/v1/files/file-0123", "/v1/files/..%2F..%2Fetc", "/v1/files/file-0123456789abcdef01234567/content",
                                        "/v1/files/batch_0123456789abcdef01234567"};
    for (size_t k = 0; k < sizeof wrong / sizeof *wrong; k++) {
        T_CHECK(http(s.port, "GET", wrong[k], KEY, NULL, &r) && r.status == 404, "%s: %d", wrong[k], r.status);
        resp_free(&r);
    }
    T_CHECK(names_in(dir, ".upload-") == 0, "an upload's temporary left behind");
    l = get_json(s.port, "/v1/files");
    T_CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(l, "data")) == 3, "the refused uploads were kept");
    cJSON_Delete(l);
    /* delete */
    snprintf(path, sizeof path, "/v1/files/%s", ids[0]);
    T_CHECK(http(s.port, "DELETE", path, KEY, NULL, &r) && r.status == 200 && strstr(r.body, "\"deleted\":true"), "delete: %d %s",
            r.status, r.body);
    resp_free(&r);
    T_CHECK(http(s.port, "GET", path, KEY, NULL, &r) && r.status == 404, "deleted: %d", r.status);
    resp_free(&r);
    T_CHECK(http(s.port, "PUT", path, KEY, "{}", &r) && r.status == 405, "PUT: %d", r.status);
    resp_free(&r);
    /* expires_after (OpenAI's): an hour to 30 days after its creation, else refused */
    static const char *const exp_fields[][2] = {{"created_at", "3600"}, {"created_at", "60"}, {"now", "3600"}, {"created_at", "1h"}};
    char exp_id[64] = "";
    for (int k = 0; k < 4; k++) {
        char body[700], raw[1200];
        snprintf(body, sizeof body,
                 "--XyZb\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
                 "--XyZb\r\nContent-Disposition: form-data; name=\"expires_after[anchor]\"\r\n\r\n%s\r\n"
                 "--XyZb\r\nContent-Disposition: form-data; name=\"expires_after[seconds]\"\r\n\r\n%s\r\n"
                 "--XyZb\r\nContent-Disposition: form-data; name=\"file\"; filename=\"e.jsonl\"\r\n\r\nx\r\n--XyZb--\r\n",
                 exp_fields[k][0], exp_fields[k][1]);
        snprintf(raw, sizeof raw,
                 "POST /v1/files HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" KEY
                 "Content-Type: multipart/form-data; boundary=XyZb\r\nContent-Length: %zu\r\n\r\n%s",
                 strlen(body), body);
        T_CHECK(http_raw(s.port, raw, strlen(raw), &r) && r.status == (k ? 400 : 200), "expires_after %s %s: %d %s", exp_fields[k][0],
                exp_fields[k][1], r.status, r.body ? r.body : "");
        if (k == 0) {
            cJSON *j = cJSON_Parse(r.body ? r.body : "");
            T_CHECK(num_of(j, "expires_at") == num_of(j, "created_at") + 3600, "expires_at %g, created_at %g", num_of(j, "expires_at"),
                    num_of(j, "created_at"));
            snprintf(exp_id, sizeof exp_id, "%s", str_of(j, "id"));
            cJSON_Delete(j);
        }
        resp_free(&r);
    }
    T_CHECK(server_stop_within(&s, 20) == 0, "server exit");
    /* its time come (its record told so): removed at the next start, bytes and all */
    char exp_rec[128], *exp_text = NULL;
    snprintf(exp_rec, sizeof exp_rec, "store/%s.json", exp_id);
    nv_file_read_all(t_path(exp_rec), &exp_text, NULL);
    cJSON *exp_o = cJSON_Parse(exp_text ? exp_text : "");
    free(exp_text);
    cJSON_ReplaceItemInObjectCaseSensitive(exp_o, "expires_at", cJSON_CreateNumber(1000));
    exp_text = cJSON_PrintUnformatted(exp_o);
    cJSON_Delete(exp_o);
    t_write(exp_rec, exp_text ? exp_text : "", exp_text ? strlen(exp_text) : 0);
    free(exp_text);
    /* a restart lists what was kept; what is not a whole record is skipped, an upload's leftovers removed;
       a crash's halves go: bytes without a record (a removal cut short), a whole record without its
       bytes (a file made but not yet renamed in), a record's unfinished temporary copy */
    char junk[700];
    snprintf(junk, sizeof junk, "%s/file-00000000000000000000000a.json", dir);
    t_write("store/file-00000000000000000000000a.json", "{\"id\":", 6);
    t_write("store/.upload-0123", "half", 4);
    t_write("store/file-00000000000000000000000b", "orphan", 6);
    char rec_c[600];
    snprintf(rec_c, sizeof rec_c,
             "{\"id\":\"file-00000000000000000000000c\",\"object\":\"file\",\"bytes\":3,\"created_at\":1,\"filename\":\"c\","
             "\"purpose\":\"batch\",\"nerve_seq\":99}");
    t_write("store/file-00000000000000000000000c.json", rec_c, strlen(rec_c));
    t_write("store/file-00000000000000000000000d.json.tmp.77", "{", 1);
    if (!server_spawn(&s, "files2", NULL, NULL, model_path(), tok_path(), args, 60)) return;
    l = get_json(s.port, "/v1/files?order=asc");
    data = cJSON_GetObjectItemCaseSensitive(l, "data");
    T_CHECK(cJSON_GetArraySize(data) == 2 && !strcmp(str_of(cJSON_GetArrayItem(data, 0), "id"), ids[1]) &&
                !strcmp(str_of(cJSON_GetArrayItem(data, 1), "id"), ids[2]),
            "after the restart");
    cJSON_Delete(l);
    char *c2 = file_content(s.port, ids[2]);
    T_CHECK(c2 && !strcmp(c2, texts[2]), "content after the restart: %s", c2 ? c2 : "-");
    free(c2);
    char *log = read_log(&s);
    T_CHECK(strstr(log, "not a file's whole record") && names_in(dir, ".upload-") == 0, "the junk: %s", log);
    T_CHECK(!nv_file_exists(t_path("store/file-00000000000000000000000b")) && !nv_file_exists(t_path("store/file-00000000000000000000000c.json")) &&
                !nv_file_exists(t_path("store/file-00000000000000000000000d.json.tmp.77")) && nv_file_exists(junk),
            "a crash's halves were kept (or the malformed record removed)");
    struct stat sb;
    T_CHECK(stat(t_path("store"), &sb) == 0 && (sb.st_mode & 077) == 0, "the store is mode %o", (unsigned)(sb.st_mode & 0777));
    /* a file name that is not UTF-8 is kept as UTF-8 (the list stays valid JSON for strict decoders) */
    T_CHECK(upload(s.port, "user_data", "bad\xff\xc3name.txt", "x", &r) && r.status == 200 && strstr(r.body, "bad\xef\xbf\xbd"),
            "a name of invalid UTF-8: %d %s", r.status, r.body);
    resp_free(&r);
    /* Anthropic's batches keep their requests beside the files: they count against the same limit (4K here) */
    {
        nv_buf big = {0};
        nv_buf_printf(&big, "{\"requests\":[");
        for (int k = 0; k < 3; k++) {
            nv_buf_printf(&big, "%s{\"custom_id\":\"r%d\",\"params\":{\"model\":\"stories260K\",\"max_tokens\":4,\"messages\":[{\"role\":"
                                "\"user\",\"content\":\"", k ? "," : "", k);
            for (int c = 0; c < 1500; c++) nv_buf_append(&big, "a", 1);
            nv_buf_printf(&big, "\"}]}}");
        }
        nv_buf_printf(&big, "]}");
        T_CHECK(http(s.port, "POST", "/v1/messages/batches", KEY, big.data, &r) && r.status == 413 && strstr(r.body, "--files-max-bytes"),
                "a message batch past the files' limit: %d %s", r.status, r.body);
        resp_free(&r);
        nv_buf_free(&big);
    }
    snprintf(exp_rec, sizeof exp_rec, "store/%s", exp_id);
    T_CHECK(exp_id[0] && !nv_file_exists(t_path(exp_rec)), "the expired file's bytes are still there");
    free(log);
    T_CHECK(server_stop_within(&s, 20) == 0, "server exit");
    /* without --files-dir: 404 saying how to turn it on */
    if (!server_spawn(&s, "nofiles", NULL, NULL, model_path(), tok_path(), FLAGS, 60)) return;
    T_CHECK(upload(s.port, "batch", "a", "x", &r) && r.status == 404 && strstr(r.body, "--files-dir"), "off: %d %s", r.status, r.body);
    resp_free(&r);
    T_CHECK(http(s.port, "GET", "/v1/batches", NULL, NULL, &r) && r.status == 404 && strstr(r.body, "--files-dir"), "off: %d", r.status);
    resp_free(&r);
    T_CHECK(server_stop_within(&s, 20) == 0, "server exit");
}

/* ---- batches ---------------------------------------------------------------------------------------- */

static const char *const bodies[] = {
    "{\"model\":\"stories260K\",\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story\"}],\"max_tokens\":16,\"temperature\":0}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"A dog\"}],\"max_tokens\":12,\"temperature\":0.9,\"seed\":5}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":4,\"temperature\":\"hot\"}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Sue and Tom\"}],\"max_tokens\":20,\"temperature\":0,\"n\":2}",
};
#define N_BODIES 4

static char *input_text(int copies, const char *url) {
    nv_buf b = {0};
    char line[600];
    for (int c = 0; c < copies; c++)
        for (int i = 0; i < N_BODIES; i++) {
            snprintf(line, sizeof line, "{\"custom_id\":\"q%d-%d\",\"method\":\"POST\",\"url\":\"%s\",\"body\":%s}\n", c, i, url, bodies[i]);
            nv_buf_append(&b, line, strlen(line));
        }
    nv_buf_append(&b, "", 1);
    return b.data;
}

/* The answer without what differs between two runs of a request (ids, time, what the prefix cache held). */
static char *core(const cJSON *body) {
    cJSON *j = cJSON_Duplicate(body, 1);
    cJSON_DeleteItemFromObjectCaseSensitive(j, "id");
    cJSON_DeleteItemFromObjectCaseSensitive(j, "created");
    cJSON *usage = cJSON_GetObjectItemCaseSensitive(j, "usage");
    static const char *const cached[] = {"prompt_tokens_details", "input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"};
    for (int k = 0; k < 4; k++) cJSON_DeleteItemFromObjectCaseSensitive(usage, cached[k]); /* what the prefix cache held */
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return s;
}

/* The batch's output and error files hold each custom_id of the input once, the 2xx in the output
 * and the rest in the errors: the number of lines, or -1. */
static int check_results(int port, const cJSON *b, int copies, int compare) {
    cJSON *lines[256];
    int n = 0, n_out = 0;
    char *out = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(b, "output_file_id")) ? file_content(port, str_of(b, "output_file_id")) : NULL;
    char *err = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(b, "error_file_id")) ? file_content(port, str_of(b, "error_file_id")) : NULL;
    n_out = out ? json_lines(out, lines, 256) : 0;
    n = n_out + (err ? json_lines(err, lines + n_out, 256 - n_out) : 0);
    char seen[64][N_BODIES] = {{0}};
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int c = -1, k = -1;
        const cJSON *resp_ = cJSON_GetObjectItemCaseSensitive(lines[i], "response");
        const int status = (int)num_of(resp_, "status_code");
        if (sscanf(str_of(lines[i], "custom_id"), "q%d-%d", &c, &k) != 2 || c < 0 || c >= copies || k < 0 || k >= N_BODIES || seen[c][k]++) {
            bad++;
            continue;
        }
        const int ok = status >= 200 && status < 300;
        if ((i < n_out) != ok || (k == 2) == ok || !strncmp(str_of(lines[i], "id"), "batch_req_", 10) == 0) bad++;
        if (compare && ok && c == 0) { /* what the server answers the body alone */
            resp r;
            T_CHECK(http(port, "POST", "/v1/chat/completions", KEY, bodies[k], &r) && r.status == 200, "direct %d", k);
            cJSON *direct = cJSON_Parse(r.body ? r.body : "");
            char *a = core(cJSON_GetObjectItemCaseSensitive(resp_, "body")), *d = core(direct);
            T_CHECK(a && d && !strcmp(a, d), "request %d: the batch's answer\n%s\nis not the server's\n%s", k, a, d);
            free(a), free(d);
            cJSON_Delete(direct);
            resp_free(&r);
        }
    }
    for (int i = 0; i < n; i++) cJSON_Delete(lines[i]);
    free(out), free(err);
    T_CHECK(!bad, "%d result lines are wrong", bad);
    return bad ? -1 : n;
}

static void test_batch(void) {
    if (!model_path() || !tok_path()) return;
    char args[1024];
    snprintf(args, sizeof args, FLAGS " --api-key sk-files --files-dir '%s'", t_path("bstore"));
    server s;
    if (!server_spawn(&s, "batch", NULL, NULL, model_path(), tok_path(), args, 60)) return;
    char *in = input_text(3, "/v1/chat/completions");
    char fid[64], bid[64];
    upload_id(s.port, "batch", in, fid);
    free(in);
    create_batch(s.port, fid, "/v1/chat/completions", bid);
    cJSON *b = wait_batch(s.port, bid, "completed failed expired cancelled", 60);
    T_CHECK(!strcmp(str_of(b, "status"), "completed") && count_of(b, "total") == 12 && count_of(b, "completed") == 9 &&
                count_of(b, "failed") == 3 && num_of(b, "completed_at") >= num_of(b, "in_progress_at") && num_of(b, "in_progress_at") > 0,
            "the batch: %s %g %g %g", str_of(b, "status"), count_of(b, "total"), count_of(b, "completed"), count_of(b, "failed"));
    T_CHECK(check_results(s.port, b, 3, 1) == 12, "the results");
    char out_id[64];
    snprintf(out_id, sizeof out_id, "%s", str_of(b, "output_file_id"));
    cJSON_Delete(b);
    /* /metrics counts the files and the batches by status */
    resp mr;
    T_CHECK(http(s.port, "GET", "/metrics", KEY, NULL, &mr) && mr.status == 200 && strstr(mr.body, "\nnerve_files 3\n") &&
                strstr(mr.body, "\nnerve_batches{status=\"completed\"} 1\n") && strstr(mr.body, "\nnerve_batches{status=\"failed\"} 0\n"),
            "metrics: %s", mr.body ? mr.body : "");
    resp_free(&mr);
    /* results are files of purpose batch_output */
    char path[160];
    snprintf(path, sizeof path, "/v1/files/%s", out_id);
    cJSON *f = get_json(s.port, path);
    T_CHECK(!strcmp(str_of(f, "purpose"), "batch_output") && strstr(str_of(f, "filename"), bid), "the output file's object");
    cJSON_Delete(f);
    /* a large upload (the body read in many pieces) is kept byte for byte */
    nv_buf large = {0};
    for (int i = 0; large.len < 300000; i++) {
        char line[64];
        snprintf(line, sizeof line, "line %d --XyZ -- XyZb\r\n", i);
        nv_buf_append(&large, line, strlen(line));
    }
    nv_buf_append(&large, "", 1);
    char lid[64];
    upload_id(s.port, "batch", large.data, lid);
    char *back = file_content(s.port, lid);
    T_CHECK(back && !strcmp(back, large.data), "the large upload came back %s", back ? "changed" : "not at all");
    free(back);
    nv_buf_free(&large);
    /* lines whose url is not the endpoint, or are not requests: failed, listed with their numbers */
    const char *mixed = "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{}}\n"
                        "{\"custom_id\":\"b\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}}\n"
                        "not json\n";
    upload_id(s.port, "batch", mixed, fid);
    create_batch(s.port, fid, "/v1/chat/completions", bid);
    b = wait_batch(s.port, bid, "completed failed expired cancelled", 30);
    const cJSON *errs = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(b, "errors"), "data");
    T_CHECK(!strcmp(str_of(b, "status"), "failed") && cJSON_GetArraySize(errs) == 2 && num_of(cJSON_GetArrayItem(errs, 0), "line") == 2 &&
                !strcmp(str_of(cJSON_GetArrayItem(errs, 0), "code"), "mismatched_endpoint") &&
                num_of(cJSON_GetArrayItem(errs, 1), "line") == 3 && num_of(b, "failed_at") > 0,
            "the bad lines: %s", str_of(b, "status"));
    cJSON_Delete(b);
    /* creation refused */
    char body[300];
    const char *const refused[] = {"{}", "[1]", "{\"input_file_id\":\"file-000000000000000000000000\",\"endpoint\":\"/v1/chat/completions\",\"completion_window\":\"24h\"}",
                                   NULL, NULL, NULL, NULL};
    char more[4][300];
    snprintf(more[0], sizeof more[0], "{\"input_file_id\":\"%s\",\"endpoint\":\"/v1/moderations\",\"completion_window\":\"24h\"}", fid);
    snprintf(more[1], sizeof more[1], "{\"input_file_id\":\"%s\",\"endpoint\":\"/v1/completions\",\"completion_window\":\"1h\"}", fid);
    snprintf(more[2], sizeof more[2], "{\"input_file_id\":\"%s\",\"endpoint\":\"/v1/completions\",\"completion_window\":\"24h\",\"metadata\":{\"a\":1}}", fid);
    snprintf(more[3], sizeof more[3], "{\"input_file_id\":\"%s\",\"endpoint\":\"/v1/completions\",\"completion_window\":\"24h\"}", out_id);
    for (int k = 0; k < 7; k++) {
        snprintf(body, sizeof body, "%s", k < 3 ? refused[k] : more[k - 3]);
        resp r;
        T_CHECK(http(s.port, "POST", "/v1/batches", KEY, body, &r) && r.status == 400 && strstr(r.body, "\"error\""), "refused %d: %d %s",
                k, r.status, r.body);
        resp_free(&r);
    }
    resp r;
    T_CHECK(http(s.port, "GET", "/v1/batches/batch_000000000000000000000000", KEY, NULL, &r) && r.status == 404, "unknown: %d", r.status);
    resp_free(&r);
    snprintf(path, sizeof path, "/v1/batches/%s/cancel", bid);
    T_CHECK(http(s.port, "POST", path, KEY, "", &r) && r.status == 409, "cancel a failed batch: %d", r.status);
    resp_free(&r);
    cJSON *l = get_json(s.port, "/v1/batches?limit=1");
    T_CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(l, "data")) == 1 &&
                !strcmp(str_of(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(l, "data"), 0), "id"), bid) &&
                cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(l, "has_more")),
            "the list");
    cJSON_Delete(l);
    T_CHECK(server_stop_within(&s, 20) == 0, "server exit");
}

/* A server stopped part way goes on at its next start; a torn line is dropped and runs again. */
static void test_batch_restart(void) {
    if (!model_path() || !tok_path()) return;
    const char *dir = t_path("rstore");
    char args[1024];
    snprintf(args, sizeof args, FLAGS " --api-key sk-files --files-dir '%s' --max-batch 2 --batch-parallel 6", dir);
    server s;
    if (!server_spawn(&s, "restart", NULL, "NERVE_LOG=info NERVE_TEST_STEP_DELAY_MS=10", model_path(), tok_path(), args, 60)) return;
    char *in = input_text(8, "/v1/chat/completions");
    char fid[64], bid[64];
    upload_id(s.port, "batch", in, fid);
    free(in);
    create_batch(s.port, fid, "/v1/chat/completions", bid);
    cJSON *b = NULL;
    for (double t0 = now_s(); now_s() - t0 < 60; sleep_ms(20)) {
        cJSON_Delete(b);
        char path[128];
        snprintf(path, sizeof path, "/v1/batches/%s", bid);
        b = get_json(s.port, path);
        if (count_of(b, "completed") + count_of(b, "failed") >= 4) break;
    }
    const double before = count_of(b, "completed") + count_of(b, "failed");
    cJSON_Delete(b);
    T_CHECK(before >= 4 && before < 32, "%g answered before the stop", before);
    T_CHECK(server_stop_within(&s, 30) == 0, "server exit");
    /* what the stopped server left: the batch in progress, whole lines, and a line torn by a crash */
    char rec[700], *text = NULL;
    snprintf(rec, sizeof rec, "%s/%s.json", dir, bid);
    nv_file_read_all(rec, &text, NULL);
    T_CHECK(text && strstr(text, "\"in_progress\""), "the record: %s", text ? text : "-");
    free(text);
    snprintf(rec, sizeof rec, "%s/%s.output.partial", dir, bid);
    char *partial = NULL;
    nv_file_read_all(rec, &partial, NULL);
    const char *nl = partial ? strchr(partial, '\n') : NULL;
    T_CHECK(nl != NULL, "no whole answer in %s", rec);
    FILE *f = fopen(rec, "a"); /* a line written twice, and a torn one */
    if (f && nl) fwrite(partial, 1, (size_t)(nl - partial + 1), f);
    if (f) fputs("{\"id\":\"batch_req_1\",\"custom_id\":\"q7-3\",\"respo", f), fclose(f);
    free(partial);
    if (!server_spawn(&s, "restart2", NULL, NULL, model_path(), tok_path(), args, 60)) return;
    b = wait_batch(s.port, bid, "completed failed expired cancelled", 60);
    T_CHECK(!strcmp(str_of(b, "status"), "completed") && count_of(b, "completed") == 24 && count_of(b, "failed") == 8, "after the restart: %s %g %g",
            str_of(b, "status"), count_of(b, "completed"), count_of(b, "failed"));
    T_CHECK(check_results(s.port, b, 8, 0) == 32, "every request answered once");
    cJSON_Delete(b);
    char *log = read_log(&s);
    T_CHECK(strstr(log, "the rest were answered before"), "the restart ran the whole batch again: %s", log);
    free(log);
    T_CHECK(server_stop_within(&s, 20) == 0, "server exit");
    /* a batch whose answers so far cannot be read waits for the next start (said once), and the
       server goes on: its record made from the finished one's, its output partial a folder */
    char *rec_text = NULL;
    snprintf(rec, sizeof rec, "%s/%s.json", dir, bid);
    nv_file_read_all(rec, &rec_text, NULL);
    cJSON *stuck = cJSON_Parse(rec_text ? rec_text : "");
    char stuck_json[8192];
    snprintf(stuck_json, sizeof stuck_json, "%s", rec_text ? rec_text : "");
    free(rec_text);
    const char *sid = "batch_00000000000000000000abcd";
    cJSON_ReplaceItemInObjectCaseSensitive(stuck, "id", cJSON_CreateString(sid));
    cJSON_ReplaceItemInObjectCaseSensitive(stuck, "status", cJSON_CreateString("in_progress"));
    char *stuck_text = cJSON_PrintUnformatted(stuck);
    cJSON_Delete(stuck);
    char name[128];
    snprintf(name, sizeof name, "rstore/%s.json", sid);
    t_write(name, stuck_text ? stuck_text : "", stuck_text ? strlen(stuck_text) : 0);
    free(stuck_text);
    snprintf(rec, sizeof rec, "%s/%s.output.partial", dir, sid);
    T_CHECK(mkdir(rec, 0755) == 0, "mkdir %s", rec);
    if (!server_spawn(&s, "restart3", NULL, NULL, model_path(), tok_path(), args, 60)) return;
    sleep_ms(1500);
    resp r;
    T_CHECK(http(s.port, "POST", "/v1/chat/completions", KEY, bodies[0], &r) && r.status == 200, "the server: %d", r.status);
    resp_free(&r);
    log = read_log(&s);
    int said = 0;
    for (const char *p = log; (p = strstr(p, "cannot read its answers so far")); p++) said++;
    T_CHECK(said == 1, "the stuck batch was tried %d times", said);
    free(log);
    /* cancelled, it ends (without the answers it cannot read) */
    char path[128];
    snprintf(path, sizeof path, "/v1/batches/%s/cancel", sid);
    T_CHECK(http(s.port, "POST", path, KEY, "", &r) && r.status == 200, "cancel the stuck batch: %d", r.status);
    resp_free(&r);
    b = wait_batch(s.port, sid, "cancelled", 30);
    T_CHECK(!strcmp(str_of(b, "status"), "cancelled"), "the stuck batch after its cancel: %s", str_of(b, "status"));
    cJSON_Delete(b);
    /* one server a folder */
    server twin;
    T_CHECK(!server_spawn(&twin, "restart-twin", NULL, NULL, model_path(), tok_path(), args, 30), "a second server on the folder started");
    log = read_log(&twin);
    T_CHECK(strstr(log, "another nerve serve keeps its files and batches in"), "the second server: %s", log);
    free(log);
    T_CHECK(server_stop_within(&s, 20) == 0, "server exit");
    /* stopped while it ended: ended as it was ending, its answers made a file */
    const char *fid2 = "batch_00000000000000000000abce";
    stuck = cJSON_Parse(stuck_json);
    cJSON_ReplaceItemInObjectCaseSensitive(stuck, "id", cJSON_CreateString(fid2));
    cJSON_ReplaceItemInObjectCaseSensitive(stuck, "status", cJSON_CreateString("finalizing"));
    cJSON_DeleteItemFromObjectCaseSensitive(stuck, "nerve_final");
    cJSON_AddStringToObject(stuck, "nerve_final", "cancelled");
    stuck_text = cJSON_PrintUnformatted(stuck);
    cJSON_Delete(stuck);
    snprintf(name, sizeof name, "rstore/%s.json", fid2);
    t_write(name, stuck_text ? stuck_text : "", stuck_text ? strlen(stuck_text) : 0);
    free(stuck_text);
    const char *one = "{\"id\":\"batch_req_9\",\"custom_id\":\"q0-0\",\"response\":{\"status_code\":200,\"request_id\":\"x\",\"body\":{}},\"error\":null}\n";
    snprintf(name, sizeof name, "rstore/%s.output.partial", fid2);
    t_write(name, one, strlen(one));
    if (!server_spawn(&s, "restart4", NULL, NULL, model_path(), tok_path(), args, 60)) return;
    b = wait_batch(s.port, fid2, "cancelled completed", 30);
    char *content = file_content(s.port, str_of(b, "output_file_id"));
    T_CHECK(!strcmp(str_of(b, "status"), "cancelled") && content && !strcmp(content, one) && !cJSON_GetObjectItemCaseSensitive(b, "nerve_final"),
            "the batch stopped while it ended: %s, %s", str_of(b, "status"), content ? content : "-");
    free(content);
    cJSON_Delete(b);
    T_CHECK(server_stop_within(&s, 20) == 0, "server exit");
}

/* Cancel: no request starts after, those running finish; a batch's requests wait behind others. */
static void test_batch_cancel_priority(void) {
    if (!model_path() || !tok_path()) return;
    char args[1024];
    snprintf(args, sizeof args, FLAGS " --api-key sk-files --files-dir '%s' --max-batch 1 --batch-parallel 6", t_path("cstore"));
    server s;
    if (!server_spawn(&s, "cancel", NULL, "NERVE_LOG=info NERVE_TEST_STEP_DELAY_MS=15", model_path(), tok_path(), args, 60)) return;
    char *in = input_text(10, "/v1/chat/completions");
    char fid[64], bid[64], path[128];
    upload_id(s.port, "batch", in, fid);
    free(in);
    create_batch(s.port, fid, "/v1/chat/completions", bid);
    snprintf(path, sizeof path, "/v1/batches/%s", bid);
    cJSON *b = NULL;
    for (double t0 = now_s(); now_s() - t0 < 60; sleep_ms(20)) { /* running, with the queue full of its requests */
        cJSON_Delete(b);
        b = get_json(s.port, path);
        if (count_of(b, "completed") + count_of(b, "failed") >= 2) break;
    }
    const double before = count_of(b, "completed") + count_of(b, "failed");
    cJSON_Delete(b);
    /* an interactive request overtakes the five of the batch waiting */
    resp r;
    T_CHECK(http(s.port, "POST", "/v1/chat/completions", KEY, bodies[0], &r) && r.status == 200, "interactive: %d", r.status);
    resp_free(&r);
    b = get_json(s.port, path);
    const double after = count_of(b, "completed") + count_of(b, "failed");
    cJSON_Delete(b);
    T_CHECK(after - before <= 2, "the batch answered %g requests while one interactive request waited", after - before);
    /* its input is not deleted under it (409); once it has ended, it is */
    char fpath[128];
    snprintf(fpath, sizeof fpath, "/v1/files/%s", fid);
    T_CHECK(http(s.port, "DELETE", fpath, KEY, NULL, &r) && r.status == 409 && strstr(r.body, "file_in_use"), "delete while it runs: %d %s",
            r.status, r.body);
    resp_free(&r);
    snprintf(path, sizeof path, "/v1/batches/%s/cancel", bid);
    T_CHECK(http(s.port, "POST", path, KEY, "", &r) && r.status == 200 && strstr(r.body, "\"cancelling\""), "cancel: %d %s", r.status,
            r.body);
    resp_free(&r);
    b = wait_batch(s.port, bid, "cancelled completed", 60);
    const double done = count_of(b, "completed") + count_of(b, "failed");
    T_CHECK(!strcmp(str_of(b, "status"), "cancelled") && done < 40 && num_of(b, "cancelled_at") > 0, "cancelled: %s, %g answered",
            str_of(b, "status"), done);
    T_CHECK(check_results(s.port, b, 10, 0) == (int)done, "the answers before the cancel");
    cJSON_Delete(b);
    T_CHECK(http(s.port, "DELETE", fpath, KEY, NULL, &r) && r.status == 200, "delete once it ended: %d %s", r.status, r.body);
    resp_free(&r);
    T_CHECK(server_stop_within(&s, 20) == 0, "server exit");
}

/* An interactive request that finds every sequence taken by a batch's preempts it: it answers while
 * the batch's request waits, and that request's answer is still the one the server gives it alone. */
static void test_batch_preempted(void) {
    if (!model_path() || !tok_path()) return;
    char args[1024];
    snprintf(args, sizeof args, FLAGS " --files-dir '%s' --max-batch 1", t_path("pstore")); /* (no key: /metrics is read) */
    server s;
    if (!server_spawn(&s, "preempted", NULL, "NERVE_TEST_STEP_DELAY_MS=15", model_path(), tok_path(), args, 60)) return;
    static const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story\"}],\"max_tokens\":150,\"temperature\":0,"
                              "\"ignore_eos\":true}";
    char line[400], fid[64], bid[64];
    snprintf(line, sizeof line, "{\"custom_id\":\"long\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":%s}\n", body);
    upload_id(s.port, "batch", line, fid);
    create_batch(s.port, fid, "/v1/chat/completions", bid);
    int running = 0;
    for (double t0 = now_s(); now_s() - t0 < 30 && !running; sleep_ms(10)) running = metric(s.port, "nerve_running_sequences") == 1;
    sleep_ms(300);
    resp r = {0};
    T_CHECK(running && http(s.port, "POST", "/v1/chat/completions", KEY, bodies[0], &r) && r.status == 200, "interactive: %d", r.status);
    resp_free(&r);
    T_CHECK(metric(s.port, "nerve_preemptions_total") == 1, "%g preemptions", metric(s.port, "nerve_preemptions_total"));
    cJSON *b = wait_batch(s.port, bid, "completed failed", 60);
    char *out = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(b, "output_file_id")) ? file_content(s.port, str_of(b, "output_file_id")) : NULL;
    cJSON *lines[2] = {0};
    T_CHECK(out && json_lines(out, lines, 2) == 1, "the batch's output: %s", out ? out : "(none)");
    T_CHECK(http(s.port, "POST", "/v1/chat/completions", KEY, body, &r) && r.status == 200, "alone: %d", r.status);
    cJSON *direct = cJSON_Parse(r.body ? r.body : "");
    char *a = lines[0] ? core(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(lines[0], "response"), "body")) : NULL,
         *d = core(direct);
    T_CHECK(a && d && !strcmp(a, d), "the preempted answer\n%s\nis not the server's alone\n%s", a ? a : "", d ? d : "");
    free(a), free(d), free(out);
    cJSON_Delete(direct), cJSON_Delete(lines[0]), cJSON_Delete(b);
    resp_free(&r);
    T_CHECK(server_stop_within(&s, 20) == 0, "server exit");
}

/* ---- Anthropic's Message Batches ------------------------------------------------------------------- */

static const char *const msg_params[] = {
    "{\"model\":\"stories260K\",\"max_tokens\":14,\"temperature\":0,\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story\"}]}",
    "{\"model\":\"gpt-4\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}",
    "{\"model\":\"stories260K\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}",
};

/* POST /v1/messages/batches of copies x the three params (custom_id mK-I): the batch's id ("" after a failed check). */
static void create_msg_batch(int port, int copies, char id[64]) {
    nv_buf b = {0};
    nv_buf_printf(&b, "{\"requests\":[");
    for (int c = 0; c < copies; c++)
        for (int i = 0; i < 3; i++) nv_buf_printf(&b, "%s{\"custom_id\":\"m%d-%d\",\"params\":%s}", c || i ? "," : "", c, i, msg_params[i]);
    nv_buf_printf(&b, "]}");
    resp r;
    id[0] = 0;
    T_CHECK(http(port, "POST", "/v1/messages/batches", KEY, b.data, &r) && r.status == 200, "create: %d %s", r.status, r.body ? r.body : "");
    cJSON *j = cJSON_Parse(r.body ? r.body : "");
    T_CHECK(!strcmp(str_of(j, "type"), "message_batch") && !strcmp(str_of(j, "processing_status"), "in_progress") &&
                num_of(cJSON_GetObjectItemCaseSensitive(j, "request_counts"), "processing") == 3 * copies,
            "the new batch: %s", r.body ? r.body : "");
    snprintf(id, 64, "%s", str_of(j, "id"));
    cJSON_Delete(j);
    resp_free(&r);
    nv_buf_free(&b);
}

static cJSON *wait_msg_batch(int port, const char *id, double wait_s) {
    return poll_batch(port, "/v1/messages/batches", "processing_status", id, "ended", wait_s);
}

static double msg_count(const cJSON *b, const char *k) { return num_of(cJSON_GetObjectItemCaseSensitive(b, "request_counts"), k); }

/* The results of batch id: each custom_id's result type counted into types (succeeded, errored,
   canceled, expired); the first copy's succeeded message compared with what /v1/messages answers. */
static int msg_results(int port, const char *id, int copies, int types[4], int compare) {
    char path[160];
    snprintf(path, sizeof path, "/v1/messages/batches/%s/results", id);
    resp r;
    T_CHECK(http(port, "GET", path, KEY, NULL, &r) && r.status == 200, "results: %d", r.status);
    cJSON *lines[256];
    const int n = r.status == 200 ? json_lines(r.body, lines, 256) : 0;
    resp_free(&r);
    static const char *const names[4] = {"succeeded", "errored", "canceled", "expired"};
    char seen[64][3] = {{0}};
    int bad = 0;
    for (int i = 0; i < n; i++) {
        const cJSON *res = cJSON_GetObjectItemCaseSensitive(lines[i], "result");
        int c = -1, k = -1, t = 0;
        while (t < 4 && strcmp(str_of(res, "type"), names[t]) != 0) t++;
        if (sscanf(str_of(lines[i], "custom_id"), "m%d-%d", &c, &k) != 2 || c < 0 || c >= copies || k < 0 || k > 2 || seen[c][k]++ || t == 4 ||
            (t < 2 && (t == 0) != (k == 0))) {
            bad++;
            continue;
        }
        types[t]++;
        if (compare && t == 0 && c == 0) {
            resp d;
            T_CHECK(http(port, "POST", "/v1/messages", KEY, msg_params[0], &d) && d.status == 200, "/v1/messages");
            cJSON *direct = cJSON_Parse(d.body ? d.body : "");
            char *a = core(cJSON_GetObjectItemCaseSensitive(res, "message")), *w = core(direct);
            T_CHECK(a && w && !strcmp(a, w), "the batch's message\n%s\nis not the server's\n%s", a, w);
            free(a), free(w);
            cJSON_Delete(direct);
            resp_free(&d);
        }
    }
    for (int i = 0; i < n; i++) cJSON_Delete(lines[i]);
    T_CHECK(!bad, "%d result lines are wrong", bad);
    return n;
}

/* Message Batches: answered as /v1/messages answers each request; bad creations refused in
 * Anthropic's error shape; OpenAI's endpoints do not see them nor Anthropic's OpenAI's; the list's
 * cursors; a cancel's canceled results; results and deletion only once ended. */
static void test_message_batches(void) {
    if (!model_path() || !tok_path()) return;
    char args[1024];
    snprintf(args, sizeof args, FLAGS " --api-key sk-files --files-dir '%s' --max-batch 1 --batch-parallel 1", t_path("mstore"));
    server s;
    if (!server_spawn(&s, "msgbatch", NULL, "NERVE_LOG=info NERVE_TEST_STEP_DELAY_MS=5", model_path(), tok_path(), args, 60)) return;
    char ids[3][64];
    create_msg_batch(s.port, 2, ids[0]);
    cJSON *b = wait_msg_batch(s.port, ids[0], 60);
    T_CHECK(msg_count(b, "succeeded") == 2 && msg_count(b, "errored") == 4 && msg_count(b, "processing") == 0 &&
                strstr(str_of(b, "results_url"), ids[0]) && str_of(b, "ended_at")[0],
            "the ended batch");
    cJSON_Delete(b);
    int types[4] = {0};
    T_CHECK(msg_results(s.port, ids[0], 2, types, 1) == 6 && types[0] == 2 && types[1] == 4, "the results: %d %d", types[0], types[1]);
    /* refused in Anthropic's shape */
    static const char *const refused[] = {"{}", "{\"requests\":[]}", "{\"requests\":[{\"custom_id\":\"a b\",\"params\":{}}]}",
                                          "{\"requests\":[{\"custom_id\":\"a\",\"params\":{}},{\"custom_id\":\"a\",\"params\":{}}]}",
                                          "{\"requests\":[{\"custom_id\":\"a\",\"params\":[]}]}",
                                          "{\"requests\":[{\"custom_id\":\"a\",\"params\":{\"stream\":true}}]}"};
    resp r;
    for (size_t k = 0; k < sizeof refused / sizeof *refused; k++) {
        T_CHECK(http(s.port, "POST", "/v1/messages/batches", KEY, refused[k], &r) && r.status == 400 && strstr(r.body, "\"type\":\"error\""),
                "refused %zu: %d %s", k, r.status, r.body);
        resp_free(&r);
    }
    /* each API its own */
    char path[160];
    snprintf(path, sizeof path, "/v1/batches/%s", ids[0]);
    T_CHECK(http(s.port, "GET", path, KEY, NULL, &r) && r.status == 404, "OpenAI's endpoint saw it: %d", r.status);
    resp_free(&r);
    cJSON *l = get_json(s.port, "/v1/batches");
    T_CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(l, "data")) == 0, "OpenAI's list holds it");
    cJSON_Delete(l);
    /* a cancel part way: those never run canceled; no deletion, no results before the end */
    create_msg_batch(s.port, 12, ids[1]);
    for (double t0 = now_s(); now_s() - t0 < 60; sleep_ms(20)) {
        snprintf(path, sizeof path, "/v1/messages/batches/%s", ids[1]);
        b = get_json(s.port, path);
        const double done = msg_count(b, "succeeded") + msg_count(b, "errored");
        cJSON_Delete(b);
        if (done >= 2) break;
    }
    snprintf(path, sizeof path, "/v1/messages/batches/%s", ids[1]);
    T_CHECK(http(s.port, "DELETE", path, KEY, NULL, &r) && r.status == 400, "deleted while running: %d", r.status);
    resp_free(&r);
    snprintf(path, sizeof path, "/v1/messages/batches/%s/results", ids[1]);
    T_CHECK(http(s.port, "GET", path, KEY, NULL, &r) && r.status == 400, "results while running: %d", r.status);
    resp_free(&r);
    snprintf(path, sizeof path, "/v1/messages/batches/%s/cancel", ids[1]);
    T_CHECK(http(s.port, "POST", path, KEY, "", &r) && r.status == 200 && strstr(r.body, "\"canceling\""), "cancel: %d %s", r.status, r.body);
    resp_free(&r);
    b = wait_msg_batch(s.port, ids[1], 60);
    const double canceled = msg_count(b, "canceled");
    T_CHECK(canceled > 0 && msg_count(b, "succeeded") + msg_count(b, "errored") + canceled == 36 && str_of(b, "cancel_initiated_at")[0],
            "canceled %g", canceled);
    cJSON_Delete(b);
    int t2[4] = {0};
    T_CHECK(msg_results(s.port, ids[1], 12, t2, 0) == 36 && t2[2] == (int)canceled, "the results after the cancel: %d canceled", t2[2]);
    /* the list, newest first, its cursors */
    create_msg_batch(s.port, 1, ids[2]);
    cJSON_Delete(wait_msg_batch(s.port, ids[2], 60));
    l = get_json(s.port, "/v1/messages/batches?limit=2");
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(l, "data");
    T_CHECK(cJSON_GetArraySize(data) == 2 && !strcmp(str_of(cJSON_GetArrayItem(data, 0), "id"), ids[2]) &&
                !strcmp(str_of(cJSON_GetArrayItem(data, 1), "id"), ids[1]) && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(l, "has_more")),
            "the list");
    cJSON_Delete(l);
    snprintf(path, sizeof path, "/v1/messages/batches?after_id=%s", ids[1]);
    l = get_json(s.port, path);
    data = cJSON_GetObjectItemCaseSensitive(l, "data");
    T_CHECK(cJSON_GetArraySize(data) == 1 && !strcmp(str_of(cJSON_GetArrayItem(data, 0), "id"), ids[0]), "after_id");
    cJSON_Delete(l);
    snprintf(path, sizeof path, "/v1/messages/batches?before_id=%s&limit=1", ids[0]);
    l = get_json(s.port, path);
    data = cJSON_GetObjectItemCaseSensitive(l, "data");
    T_CHECK(cJSON_GetArraySize(data) == 1 && !strcmp(str_of(cJSON_GetArrayItem(data, 0), "id"), ids[1]) &&
                cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(l, "has_more")),
            "before_id");
    cJSON_Delete(l);
    /* deleted once ended: its record and results gone */
    snprintf(path, sizeof path, "/v1/messages/batches/%s", ids[0]);
    T_CHECK(http(s.port, "DELETE", path, KEY, NULL, &r) && r.status == 200 && strstr(r.body, "message_batch_deleted"), "delete: %d",
            r.status);
    resp_free(&r);
    T_CHECK(http(s.port, "GET", path, KEY, NULL, &r) && r.status == 404 && strstr(r.body, "not_found_error"), "deleted: %d %s", r.status,
            r.body);
    resp_free(&r);
    T_CHECK(server_stop_within(&s, 20) == 0, "server exit");
}

/* ---- OpenAI's fine-tuning jobs ---------------------------------------------------------------------- */

/* Chat examples that all answer the same (a pattern the small model learns in a few steps). */
static char *chat_examples(int n, int bad_line) {
    nv_buf b = {0};
    for (int i = 0; i < n; i++) {
        char line[400];
        if (i + 1 == bad_line) snprintf(line, sizeof line, "not json\n");
        else
            snprintf(line, sizeof line,
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"Who is friend %d?\"},{\"role\":\"assistant\",\"content\":\"The friend "
                     "is Lily.\"}]}\n",
                     i);
        nv_buf_append(&b, line, strlen(line));
    }
    nv_buf_append(&b, "", 1);
    return b.data;
}

/* POST /v1/fine_tuning/jobs: the status, the answer in *j (the caller frees it). */
static int create_job(int port, const char *body, cJSON **j) {
    resp r;
    int st = http(port, "POST", "/v1/fine_tuning/jobs", KEY, body, &r) ? r.status : -1;
    *j = cJSON_Parse(r.body ? r.body : "");
    resp_free(&r);
    return st;
}

static cJSON *wait_job(int port, const char *id, const char *until, double wait_s) {
    return poll_batch(port, "/v1/fine_tuning/jobs", "status", id, until, wait_s);
}

/* A job's events, oldest first (every one: pages of 7 followed by their cursors). */
static int job_events(int port, const char *id, cJSON **out, int cap) {
    int n = 0;
    char after[64] = "", path[200];
    for (int more = 1; more && n < cap;) {
        snprintf(path, sizeof path, "/v1/fine_tuning/jobs/%s/events?limit=7%s%s", id, after[0] ? "&after=" : "", after);
        cJSON *l = get_json(port, path);
        const cJSON *data = cJSON_GetObjectItemCaseSensitive(l, "data");
        T_CHECK(cJSON_GetArraySize(data) <= 7, "a page of %d", cJSON_GetArraySize(data));
        for (const cJSON *e = data ? data->child : NULL; e && n < cap; e = e->next) out[n++] = cJSON_Duplicate(e, 1);
        more = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(l, "has_more")) && cJSON_GetArraySize(data) > 0;
        if (more) snprintf(after, sizeof after, "%s", str_of(cJSON_GetArrayItem(data, cJSON_GetArraySize(data) - 1), "id"));
        cJSON_Delete(l);
    }
    for (int i = 0; i < n / 2; i++) { /* newest first as listed */
        cJSON *t = out[i];
        out[i] = out[n - 1 - i], out[n - 1 - i] = t;
    }
    return n;
}

/* A job created from body, paused once its run folder has `file`, and its runner done with it (it
 * said its trainer stopped): 1 (its id in id[64]), or 0. */
static int paused_job(int port, const char *body, const char *dir, const char *file, char *id) {
    cJSON *j = NULL;
    const int made = create_job(port, body, &j) == 200;
    snprintf(id, 64, "%s", str_of(j, "id"));
    cJSON_Delete(j);
    if (!made) return 0;
    char path[800];
    snprintf(path, sizeof path, "%s/%s.run/run/%s", dir, id, file);
    for (double t0 = now_s(); !nv_file_exists(path) && now_s() - t0 < 60;) sleep_ms(20);
    snprintf(path, sizeof path, "/v1/fine_tuning/jobs/%s/pause", id);
    resp r;
    const int paused = http(port, "POST", path, KEY, "", &r) && r.status == 200;
    resp_free(&r);
    if (!paused) return 0;
    int stopped = 0;
    for (double t0 = now_s(); !stopped && now_s() - t0 < 30; sleep_ms(20)) {
        cJSON *evs[256];
        const int nev = job_events(port, id, evs, 256);
        for (int i = 0; i < nev; i++) {
            stopped |= !strncmp(str_of(evs[i], "message"), "The trainer stopped at step", 27);
            cJSON_Delete(evs[i]);
        }
    }
    snprintf(path, sizeof path, "/v1/fine_tuning/jobs/%s", id);
    cJSON *j2 = get_json(port, path);
    const int paused2 = stopped && !strcmp(str_of(j2, "status"), "paused");
    cJSON_Delete(j2);
    return paused2;
}

/* The trainer's losses of a job, from its run folder. */
/* A field of a job's trainer's steps 1, 2, ... (-1 where a step has none): their number. */
static int job_field(const char *dir, const char *id, const char *key, double *v, int cap) {
    char path[700], *text = NULL;
    snprintf(path, sizeof path, "%s/%s.run/run/metrics.jsonl", dir, id);
    nv_file_read_all(path, &text, NULL);
    cJSON *lines[256];
    const int n = json_lines(text, lines, 256);
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (k < cap && num_of(lines[i], "step") == k + 1) v[k++] = num_of(lines[i], key);
        cJSON_Delete(lines[i]);
    }
    free(text);
    return k;
}

static int job_losses(const char *dir, const char *id, double *loss, int cap) { return job_field(dir, id, "loss", loss, cap); }

/* The steps a job's trainer has written. */
static int job_steps(const char *dir, const char *id) {
    char path[700], *text = NULL;
    snprintf(path, sizeof path, "%s/%s.run/run/metrics.jsonl", dir, id);
    nv_file_read_all(path, &text, NULL);
    int n = 0;
    for (const char *p = text; p && (p = strchr(p, '\n')); p++) n++;
    free(text);
    return n;
}

static char *chat_answer(int port, const char *model) {
    char body[512];
    snprintf(body, sizeof body,
             "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"Who is friend 3?\"}],\"max_tokens\":8,\"temperature\":0}", model);
    resp r;
    char *out = NULL;
    if (http(port, "POST", "/v1/chat/completions", KEY, body, &r) && r.status == 200) {
        cJSON *j = cJSON_Parse(r.body);
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0), "message");
        out = strdup(str_of(msg, "content"));
        cJSON_Delete(j);
    } else {
        out = strdup(r.body ? r.body : "-");
    }
    resp_free(&r);
    return out;
}

/* The trainer's pid job id's record in dir keeps (0: none). */
static int record_pid(const char *dir, const char *id) {
    char path[700], *text = NULL;
    snprintf(path, sizeof path, "%s/%s.json", dir, id);
    nv_file_read_all(path, &text, NULL);
    cJSON *o = cJSON_Parse(text ? text : "");
    const int pid = (int)num_of(o, "nerve_pid");
    cJSON_Delete(o);
    free(text);
    return pid;
}

/* The state of every thread of process pid when they are all in one ('T': the process stopped whole),
   else 0. (A stop reaches a process's threads one by one: the kernel continues an orphaned group's
   stopped members only once their stop is whole.) */
static char all_threads_state(int pid) {
    char dir[64], state = 0;
    snprintf(dir, sizeof dir, "/proc/%d/task", pid);
    DIR *d = opendir(dir);
    for (struct dirent *de; d && (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        const char st = nv_proc_state(atoi(de->d_name)); /* (/proc/TID/stat is the thread's) */
        if (!st || (state && st != state)) {
            state = 0;
            break;
        }
        state = st;
    }
    if (d) closedir(d);
    return state;
}

/* POST path with a JSON body (NULL: none): its status, its answer parsed into *j (the caller deletes it). */
static int post_json(int port, const char *path, const char *body, cJSON **j) {
    resp r;
    const int st = http(port, "POST", path, KEY "Content-Type: application/json\r\n", body, &r) ? r.status : 0;
    *j = cJSON_Parse(r.body ? r.body : "");
    resp_free(&r);
    return st;
}

/* A part of upload id: its id into part_id ("" when refused); the status. */
static int add_part(int port, const char *id, const char *content, char part_id[64]) {
    char path[128];
    snprintf(path, sizeof path, "/v1/uploads/%s/parts", id);
    resp r;
    const int st = post_multipart(port, path, NULL, "data", "blob", content, &r) ? r.status : 0;
    cJSON *j = cJSON_Parse(r.body ? r.body : "");
    snprintf(part_id, 64, "%s", st == 200 ? str_of(j, "id") : "");
    T_CHECK(st != 200 || (!strcmp(str_of(j, "object"), "upload.part") && !strcmp(str_of(j, "upload_id"), id) && !strncmp(part_id, "part_", 5)),
            "the part: %s", r.body ? r.body : "");
    cJSON_Delete(j);
    resp_free(&r);
    return st;
}

/* POST /v1/uploads for `bytes` bytes: the upload's id ("" after a failed check). */
static void create_upload(int port, long bytes, const char *extra, char id[64]) {
    char body[512];
    snprintf(body, sizeof body, "{\"filename\":\"big.jsonl\",\"purpose\":\"batch\",\"bytes\":%ld,\"mime_type\":\"text/jsonl\"%s}", bytes,
             extra);
    cJSON *j;
    const int st = post_json(port, "/v1/uploads", body, &j);
    snprintf(id, 64, "%s", st == 200 ? str_of(j, "id") : "");
    T_CHECK(st == 200 && !strncmp(id, "upload_", 7) && !strcmp(str_of(j, "object"), "upload") && !strcmp(str_of(j, "status"), "pending") &&
                num_of(j, "bytes") == bytes && num_of(j, "expires_at") == num_of(j, "created_at") + 3600 &&
                cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "file")) && !cJSON_GetObjectItemCaseSensitive(j, "nerve_parts"),
            "create: %d", st);
    cJSON_Delete(j);
}

/* POST /v1/uploads/id/action with body: the status, and the answer's status field or error param into what. */
static int upload_action(int port, const char *id, const char *action, const char *body, char what[64], cJSON **keep) {
    char path[160];
    snprintf(path, sizeof path, "/v1/uploads/%s/%s", id, action);
    cJSON *j;
    const int st = post_json(port, path, body, &j);
    snprintf(what, 64, "%s", st == 200 ? str_of(j, "status") : str_of(cJSON_GetObjectItemCaseSensitive(j, "error"), "param"));
    if (keep) *keep = j;
    else cJSON_Delete(j);
    return st;
}

/* OpenAI's Uploads: a file sent in parts (out of order) becomes a file of the store, checked by its
 * bytes and md5; the refusals; a restart keeps a pending upload's parts; parts count against the
 * store's room; cancel and expiry remove them. */
static void test_uploads(void) {
    if (!model_path() || !tok_path()) return;
    const char *dir = t_path("ustore");
    char args[1024], id[64], p[4][64], what[64], body[512];
    snprintf(args, sizeof args, FLAGS " --api-key sk-files --files-dir '%s' --files-max-bytes 1K", dir);
    server s;
    if (!server_spawn(&s, "uploads", NULL, NULL, model_path(), tok_path(), args, 60)) return;
    static const struct {
        const char *body, *param;
    } refused[] = {{"{\"purpose\":\"batch\",\"bytes\":3,\"mime_type\":\"text/plain\"}", "filename"},
                   {"{\"filename\":\"a\",\"purpose\":\"nope\",\"bytes\":3,\"mime_type\":\"text/plain\"}", "purpose"},
                   {"{\"filename\":\"a\",\"purpose\":\"batch\",\"bytes\":-1,\"mime_type\":\"text/plain\"}", "bytes"},
                   {"{\"filename\":\"a\",\"purpose\":\"batch\",\"bytes\":1.5,\"mime_type\":\"text/plain\"}", "bytes"},
                   {"{\"filename\":\"a\",\"purpose\":\"batch\",\"bytes\":9000000000,\"mime_type\":\"text/plain\"}", "bytes"},
                   {"{\"filename\":\"a\",\"purpose\":\"batch\",\"bytes\":3}", "mime_type"},
                   {"{\"filename\":\"a\",\"purpose\":\"batch\",\"bytes\":3,\"mime_type\":\"t\",\"expires_after\":{\"anchor\":\"created_at\","
                    "\"seconds\":60}}",
                    "expires_after"}};
    for (size_t k = 0; k < sizeof refused / sizeof *refused; k++) {
        cJSON *j;
        const int st = post_json(s.port, "/v1/uploads", refused[k].body, &j);
        T_CHECK(st == 400 && !strcmp(str_of(cJSON_GetObjectItemCaseSensitive(j, "error"), "param"), refused[k].param), "refusal %zu: %d", k, st);
        cJSON_Delete(j);
    }
    /* three parts sent C, A, B; completed as A B C with the right md5 (after a wrong one) */
    static const char *const text[3] = {"{\"custom_id\":\"a\"}\n", "{\"custom_id\":\"b\"}\n", "{\"custom_id\":\"c\"}\n"};
    const long total = (long)(strlen(text[0]) * 3);
    create_upload(s.port, total, ",\"expires_after\":{\"anchor\":\"created_at\",\"seconds\":7200}", id);
    T_CHECK(add_part(s.port, id, text[2], p[2]) == 200 && add_part(s.port, id, text[0], p[0]) == 200 && add_part(s.port, id, text[1], p[1]) == 200,
            "the parts");
    T_CHECK(add_part(s.port, "upload_000000000000000000000000", text[0], p[3]) == 404, "a part of no upload");
    static const char *const bad_lists[] = {"{}", "{\"part_ids\":[\"%s\",\"%s\"]}", "{\"part_ids\":[\"%s\",\"%s\",\"%s\",\"%s\"]}",
                                            "{\"part_ids\":[\"%s\",\"%s\",\"part_000000000000000000000000\"]}",
                                            "{\"part_ids\":[\"%s\",\"%s\",\"%s\"],\"md5\":\"xyz\"}"};
    for (size_t k = 0; k < sizeof bad_lists / sizeof *bad_lists; k++) {
        snprintf(body, sizeof body, bad_lists[k], p[0], p[1], p[2], p[0]);
        const int st = upload_action(s.port, id, "complete", body, what, NULL);
        T_CHECK(st == 400 && (!strcmp(what, "part_ids") || (k == 4 && !strcmp(what, "md5"))), "list %zu: %d %s", k, st, what);
    }
    snprintf(body, sizeof body, "{\"part_ids\":[\"%s\",\"%s\",\"%s\"],\"md5\":\"00000000000000000000000000000000\"}", p[0], p[1], p[2]);
    T_CHECK(upload_action(s.port, id, "complete", body, what, NULL) == 400 && !strcmp(what, "md5"), "a wrong md5: %s", what);
    T_CHECK(names_in(dir, "part_") == 3, "the parts after a refusal: %d", names_in(dir, "part_"));
    { /* md5 of the three lines, A B C */
        char cmd[700], *sum = NULL;
        snprintf(cmd, sizeof cmd, "printf '%%s%%s%%s' '%s' '%s' '%s' | md5sum | cut -c1-32 > '%s'", "{\"custom_id\":\"a\"}\n",
                 "{\"custom_id\":\"b\"}\n", "{\"custom_id\":\"c\"}\n", t_path("md5.txt"));
        T_CHECK(system(cmd) == 0 && nv_file_read_all(t_path("md5.txt"), &sum, NULL) == NV_OK && strlen(sum) >= 32, "md5sum");
        for (int i = 0; sum && i < 32; i++) sum[i] = (char)toupper((unsigned char)sum[i]); /* (either case) */
        if (sum) snprintf(body, sizeof body, "{\"part_ids\":[\"%s\",\"%s\",\"%s\"],\"md5\":\"%.32s\"}", p[0], p[1], p[2], sum);
        free(sum);
    }
    cJSON *done = NULL;
    T_CHECK(upload_action(s.port, id, "complete", body, what, &done) == 200 && !strcmp(what, "completed"), "complete: %s", what);
    const cJSON *file = cJSON_GetObjectItemCaseSensitive(done, "file");
    char fid[64];
    snprintf(fid, sizeof fid, "%s", str_of(file, "id"));
    char *content = file_content(s.port, fid), want[256];
    snprintf(want, sizeof want, "%s%s%s", text[0], text[1], text[2]);
    T_CHECK(content && !strcmp(content, want) && num_of(file, "bytes") == total && !strcmp(str_of(file, "filename"), "big.jsonl") &&
                !strcmp(str_of(file, "purpose"), "batch") && num_of(file, "expires_at") == num_of(file, "created_at") + 7200 &&
                names_in(dir, "part_") == 0,
            "the file: %s; %d parts left", content ? content : "-", names_in(dir, "part_"));
    free(content);
    cJSON_Delete(done);
    T_CHECK(add_part(s.port, id, text[0], p[3]) == 400 && upload_action(s.port, id, "cancel", NULL, what, NULL) == 400 &&
                upload_action(s.port, id, "complete", body, what, NULL) == 400,
            "a completed upload takes no part, cancel or second completion");
    /* the upload's file serves a batch like any */
    char bid[64];
    create_batch(s.port, fid, "/v1/chat/completions", bid);
    T_CHECK(bid[0], "a batch of the uploaded file");

    /* the store's room (1 KiB, 57 bytes held by the file): parts count from their first byte */
    char big[701];
    memset(big, 'x', 700), big[700] = 0;
    char id2[64];
    cJSON *j2;
    T_CHECK(post_json(s.port, "/v1/uploads", "{\"filename\":\"a\",\"purpose\":\"batch\",\"bytes\":2000,\"mime_type\":\"t\"}", &j2) == 413 &&
                !strcmp(str_of(cJSON_GetObjectItemCaseSensitive(j2, "error"), "param"), "bytes"),
            "an upload larger than the store");
    cJSON_Delete(j2);
    create_upload(s.port, 1000, "", id2);
    T_CHECK(add_part(s.port, id2, big, p[0]) == 200, "a part within the room");
    T_CHECK(add_part(s.port, id2, big, p[1]) == 413 && names_in(dir, "part_") == 1, "a part past the room: %d left", names_in(dir, "part_"));
    resp r;
    T_CHECK(upload(s.port, "batch", "f.jsonl", big, &r) && r.status == 413, "a file past the room the part holds: %d", r.status);
    resp_free(&r);
    /* a restart keeps the pending upload, its part counted */
    T_CHECK(server_stop_within(&s, 30) == 0, "server exit");
    t_write("ustore/part_0123456789abcdef01234567", "zz", 2); /* a part no record lists */
    if (!server_spawn(&s, "uploads2", NULL, NULL, model_path(), tok_path(), args, 60)) return;
    T_CHECK(names_in(dir, "part_") == 1 && add_part(s.port, id2, big, p[1]) == 413, "after the restart: %d parts", names_in(dir, "part_"));
    T_CHECK(upload_action(s.port, id2, "cancel", NULL, what, NULL) == 200 && !strcmp(what, "cancelled") && names_in(dir, "part_") == 0,
            "cancel: %s, %d parts left", what, names_in(dir, "part_"));
    T_CHECK(upload(s.port, "batch", "f.jsonl", big, &r) && r.status == 200, "the room back: %d", r.status);
    resp_free(&r);
    T_CHECK(upload_action(s.port, id2, "complete", "{\"part_ids\":[]}", what, NULL) == 400 &&
                upload_action(s.port, "upload_000000000000000000000000", "cancel", NULL, what, NULL) == 404,
            "a cancelled upload, an unknown one");
    /* expiry: a pending upload whose hour has passed (its record edited) is expired, its parts gone */
    char id3[64];
    create_upload(s.port, 4, "", id3);
    T_CHECK(add_part(s.port, id3, "ab", p[0]) == 200, "a part");
    T_CHECK(server_stop_within(&s, 30) == 0, "server exit");
    char rec[700], *saved = NULL;
    snprintf(rec, sizeof rec, "ustore/%s.json", id3);
    if (nv_file_read_all(t_path(rec), &saved, NULL) == NV_OK) {
        cJSON *o = cJSON_Parse(saved);
        cJSON_ReplaceItemInObjectCaseSensitive(o, "expires_at", cJSON_CreateNumber(num_of(o, "created_at") - 1));
        char *out = cJSON_PrintUnformatted(o);
        t_write(rec, out, strlen(out));
        free(out);
        cJSON_Delete(o);
    }
    free(saved);
    if (!server_spawn(&s, "uploads3", NULL, NULL, model_path(), tok_path(), args, 60)) return;
    T_CHECK(add_part(s.port, id3, "cd", p[1]) == 400 && names_in(dir, "part_") == 0, "expired: %d parts left", names_in(dir, "part_"));
    T_CHECK(upload_action(s.port, id3, "cancel", NULL, what, NULL) == 400, "an expired upload cancelled");
    T_CHECK(server_stop_within(&s, 30) == 0, "server exit");
}

/* A server of the small model with args (env: its environment's additions, or NULL) started as name,
 * and 24 chat examples uploaded to it for fine-tuning (their file's id in chat[64]): 1, or 0 (said). */
static int chat_server(server *s, const char *name, const char *env, const char *args, char *chat) {
    if (!server_spawn(s, name, NULL, env, model_path(), tok_path(), args, 60)) {
        T_CHECK(0, "the server did not start");
        return 0;
    }
    char *text = chat_examples(24, 0);
    upload_id(s->port, "fine-tune", text, chat);
    free(text);
    return 1;
}

/* A server that runs its chat template as Jinja (--chat-template-file, one nerve has no renderer of)
 * trains its jobs' data with that template: the job's run renders with it and keeps it. */
static void test_fine_tuning_jinja(void) {
    if (!model_path() || !tok_path()) return;
    const char *dir = t_path("ftjstore");
    static const char tmpl[] = "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                               "{% if add_generation_prompt %}<assistant>{% endif %}";
    const char *file = t_write("ft.jinja", tmpl, strlen(tmpl));
    char args[2048], chat[64], body[512], path[800], id[64];
    snprintf(args, sizeof args, "--kv-memory 64M --kv-disk-cache 0 --api-key sk-files --files-dir '%s' --chat-template-file '%s'", dir, file);
    server s;
    if (!chat_server(&s, "ftj", NULL, args, chat)) return;
    snprintf(body, sizeof body, "{\"model\":\"stories260K\",\"training_file\":\"%s\",\"hyperparameters\":{\"n_epochs\":1}}", chat);
    cJSON *j;
    T_CHECK(create_job(s.port, body, &j) == 200, "create");
    snprintf(id, sizeof id, "%s", str_of(j, "id"));
    cJSON_Delete(j);
    j = wait_job(s.port, id, "succeeded", 120);
    T_CHECK(!strcmp(str_of(j, "status"), "succeeded"), "the job: %s", str_of(j, "status"));
    cJSON_Delete(j);
    char *kept = NULL;
    snprintf(path, sizeof path, "%s/%s.run/run/chat_template.jinja", dir, id);
    T_CHECK(nv_file_read_all(path, &kept, NULL) == NV_OK && !strcmp(kept, tmpl), "the job's template: %s", kept ? kept : "(none)");
    free(kept);
    T_CHECK(server_stop_within(&s, 30) == 0, "server exit");
}

/* A job whose adapters the server cannot load when it ends (started again after its trainer paused,
 * by a server whose --max-lora-rank is below the job's lora_rank) fails saying where its adapters
 * are, and they stay there with its earlier epochs' models, at that start and the next. */
static void test_fine_tuning_unloadable(void) {
    if (!model_path() || !tok_path()) return;
    const char *dir = t_path("ftkstore");
    char args[2048], chat[64], body[512], path[800], id[64];
    snprintf(args, sizeof args, FLAGS " --api-key sk-files --files-dir '%s'", dir);
    server s;
    if (!chat_server(&s, "ftk", "NERVE_TEST_STEP_DELAY_MS=30", args, chat)) return;
    snprintf(body, sizeof body, "{\"model\":\"stories260K\",\"training_file\":\"%s\",\"hyperparameters\":{\"n_epochs\":4,\"lora_rank\":16}}", chat);
    T_CHECK(paused_job(s.port, body, dir, "step-24", id), "the job paused");
    T_CHECK(server_stop_within(&s, 30) == 0, "server exit");
    char small[2100];
    snprintf(small, sizeof small, "%s --max-lora-rank 8", args);
    if (!server_spawn(&s, "ftk2", NULL, "NERVE_TEST_STEP_DELAY_MS=30", model_path(), tok_path(), small, 60)) return;
    snprintf(path, sizeof path, "/v1/fine_tuning/jobs/%s/resume", id);
    resp r;
    T_CHECK(http(s.port, "POST", path, KEY, "", &r) && r.status == 200, "resume: %d %s", r.status, r.body);
    resp_free(&r);
    cJSON *j = wait_job(s.port, id, "failed succeeded cancelled", 120);
    const char *msg = str_of(cJSON_GetObjectItemCaseSensitive(j, "error"), "message");
    T_CHECK(!strcmp(str_of(j, "status"), "failed") && strstr(msg, "rank 16") && strstr(msg, "they are kept"), "%s: %s", str_of(j, "status"), msg);
    cJSON_Delete(j);
    char adapter[800], third_epoch[800];
    snprintf(adapter, sizeof adapter, "%s/%s.run/run/adapter.gguf", dir, id);
    snprintf(third_epoch, sizeof third_epoch, "%s/%s.run/run/step-72/adapter.gguf", dir, id);
    T_CHECK(nv_file_exists(adapter) && nv_file_exists(third_epoch), "the adapters kept at %s, and the third epoch's", adapter);
    T_CHECK(server_stop_within(&s, 30) == 0, "server exit");
    if (!server_spawn(&s, "ftk3", NULL, NULL, model_path(), tok_path(), args, 60)) return;
    snprintf(path, sizeof path, "/v1/fine_tuning/jobs/%s", id);
    j = get_json(s.port, path);
    T_CHECK(!strcmp(str_of(j, "status"), "failed") && nv_file_exists(adapter) && nv_file_exists(third_epoch),
            "at the next start: %s, the adapters %s, the third epoch's %s", str_of(j, "status"), nv_file_exists(adapter) ? "kept" : "gone",
            nv_file_exists(third_epoch) ? "kept" : "gone");
    cJSON_Delete(j);
    T_CHECK(server_stop_within(&s, 30) == 0, "server exit");
}

/* A server that dies after a job's adapters loaded but before its record said so (a crash in that
 * window): the next start resumes the job from its final checkpoint, trains nothing, and ends it
 * succeeded with its model served. */
static void test_fine_tuning_dies_at_its_end(void) {
    if (!model_path() || !tok_path()) return;
    const char *dir = t_path("ftdstore");
    char args[2048], chat[64], body[512], path[800], id[64];
    snprintf(args, sizeof args, FLAGS " --api-key sk-files --files-dir '%s'", dir);
    server s;
    if (!chat_server(&s, "ftd", "NERVE_TEST_DIE_BEFORE_RECORD=1", args, chat)) return;
    snprintf(body, sizeof body, "{\"model\":\"stories260K\",\"training_file\":\"%s\",\"hyperparameters\":{\"n_epochs\":1}}", chat);
    cJSON *j = NULL;
    T_CHECK(create_job(s.port, body, &j) == 200, "create");
    snprintf(id, sizeof id, "%s", str_of(j, "id"));
    cJSON_Delete(j);
    int st = 0;
    pid_t gone = 0;
    for (double t0 = now_s(); !gone && now_s() - t0 < 60; sleep_ms(20)) gone = waitpid(s.pid, &st, WNOHANG);
    T_CHECK(gone == s.pid && WIFEXITED(st) && WEXITSTATUS(st) == 3, "the server died at the job's end: %d", st);
    if (gone != s.pid) return;
    s.pid = 0;
    char *saved = NULL;
    snprintf(path, sizeof path, "%s/%s.json", dir, id);
    nv_file_read_all(path, &saved, NULL);
    const int steps = job_steps(dir, id);
    snprintf(path, sizeof path, "%s/%s.run/run/ckpt.bin", dir, id);
    T_CHECK(saved && strstr(saved, "\"running\"") && nv_file_exists(path) && steps == 24, "left: %d steps, %.200s", steps, saved ? saved : "-");
    free(saved);
    if (!server_spawn(&s, "ftd2", NULL, NULL, model_path(), tok_path(), args, 60)) return;
    j = wait_job(s.port, id, "succeeded failed cancelled", 60);
    const char *model = str_of(j, "fine_tuned_model");
    cJSON *l = get_json(s.port, "/v1/models");
    char *listed = cJSON_PrintUnformatted(l);
    T_CHECK(!strcmp(str_of(j, "status"), "succeeded") && *model && listed && strstr(listed, model) && job_steps(dir, id) == 24 &&
                !nv_file_exists(path),
            "after the restart: %s, %d steps, model %s, checkpoint %s", str_of(j, "status"), job_steps(dir, id), model,
            nv_file_exists(path) ? "left" : "removed");
    free(listed);
    cJSON_Delete(l);
    cJSON_Delete(j);
    T_CHECK(server_stop_within(&s, 30) == 0, "server exit");
}

static void test_fine_tuning(void) {
    if (!model_path() || !tok_path()) return;
    const char *dir = t_path("ftstore");
    char args[1024];
    snprintf(args, sizeof args, FLAGS " --api-key sk-files --files-dir '%s' --allow-lora-updates", dir);
    server s;
    if (!server_spawn(&s, "ft", NULL, "NERVE_LOG=info NERVE_TEST_STEP_DELAY_MS=30", model_path(), tok_path(), args, 60)) return;
    char chat[64], val[64], pref[64], bad[64], batch[64], body[1024];
    char *text = chat_examples(24, 0);
    upload_id(s.port, "fine-tune", text, chat);
    upload_id(s.port, "fine-tune", text, val);
    upload_id(s.port, "batch", text, batch);
    free(text);
    text = chat_examples(6, 2);
    upload_id(s.port, "fine-tune", text, bad);
    free(text);
    nv_buf pb = {0};
    for (int i = 0; i < 8; i++) {
        const char *line = "{\"input\":{\"messages\":[{\"role\":\"user\",\"content\":\"Say a kind word.\"}]},\"preferred_output\":[{\"role\":"
                           "\"assistant\",\"content\":\"You are kind.\"}],\"non_preferred_output\":[{\"role\":\"assistant\",\"content\":\"Go.\"}]}\n";
        nv_buf_append(&pb, line, strlen(line));
    }
    nv_buf_append(&pb, "", 1);
    upload_id(s.port, "fine-tune", pb.data, pref);
    nv_buf_free(&pb);
    /* refusals: 400 naming the parameter, and no job made */
    struct {
        const char *fmt, *param;
    } refused[] = {
        {"{\"training_file\":\"%s\"}", "model"},
        {"{\"model\":\"gpt-4o-mini\",\"training_file\":\"%s\"}", "model"},
        {"{\"model\":\"stories260K\"}", "training_file"},
        {"{\"model\":\"stories260K\",\"training_file\":\"file-000000000000000000000000\"}", "training_file"},
        {"{\"model\":\"stories260K\",\"training_file\":\"%s\",\"hyperparameters\":{\"n_epochs\":0}}", "hyperparameters.n_epochs"},
        {"{\"model\":\"stories260K\",\"training_file\":\"%s\",\"hyperparameters\":{\"batch_size\":1.5}}", "hyperparameters.batch_size"},
        {"{\"model\":\"stories260K\",\"training_file\":\"%s\",\"hyperparameters\":{\"lora_rank\":65}}", "hyperparameters.lora_rank"},
        {"{\"model\":\"stories260K\",\"training_file\":\"%s\",\"hyperparameters\":{\"warmup\":3}}", "hyperparameters"},
        {"{\"model\":\"stories260K\",\"training_file\":\"%s\",\"hyperparameters\":{},\"method\":{\"type\":\"supervised\",\"supervised\":{"
         "\"hyperparameters\":{}}}}",
         "hyperparameters"},
        {"{\"model\":\"stories260K\",\"training_file\":\"%s\",\"method\":{\"type\":\"reinforcement\"}}", "method.type"},
        {"{\"model\":\"stories260K\",\"training_file\":\"%s\",\"method\":{\"type\":\"dpo\"}}", "training_file"},
        {"{\"model\":\"stories260K\",\"training_file\":\"%s\",\"suffix\":\"a:b\"}", "suffix"},
        {"{\"model\":\"stories260K\",\"training_file\":\"%s\",\"seed\":-1}", "seed"},
        {"{\"model\":\"stories260K\",\"training_file\":\"%s\",\"integrations\":[{\"type\":\"wandb\"}]}", "integrations"},
        {"{\"model\":\"stories260K\",\"training_file\":\"%s\",\"validation_file\":\"%s\"}", "validation_file"},
    };
    for (size_t k = 0; k < sizeof refused / sizeof *refused; k++) {
        snprintf(body, sizeof body, refused[k].fmt, chat, batch);
        cJSON *j;
        const int st = create_job(s.port, body, &j);
        const cJSON *err = cJSON_GetObjectItemCaseSensitive(j, "error");
        T_CHECK(st == 400 && !strcmp(str_of(err, "param"), refused[k].param), "refusal %zu: %d %s", k, st, str_of(err, "message"));
        cJSON_Delete(j);
    }
    /* a file of one example past 16 MiB: refused without reading it whole */
    {
        nv_buf big = {0};
        nv_buf_append(&big, "{\"messages\":\"", 13);
        char chunk[4096];
        memset(chunk, 'a', sizeof chunk);
        for (int i = 0; i < (17 << 20) / (int)sizeof chunk; i++) nv_buf_append(&big, chunk, sizeof chunk);
        nv_buf_append(&big, "\"}\n", 4);
        char huge[64];
        upload_id(s.port, "fine-tune", big.data, huge);
        nv_buf_free(&big);
        snprintf(body, sizeof body, "{\"model\":\"stories260K\",\"training_file\":\"%s\"}", huge);
        cJSON *hj;
        T_CHECK(create_job(s.port, body, &hj) == 400 &&
                    strstr(str_of(cJSON_GetObjectItemCaseSensitive(hj, "error"), "message"), "longer than 16 MiB"),
                "an example of 17 MiB: %s", str_of(cJSON_GetObjectItemCaseSensitive(hj, "error"), "message"));
        cJSON_Delete(hj);
    }
    snprintf(body, sizeof body, "{\"model\":\"stories260K\",\"training_file\":\"%s\"}", batch); /* the purpose */
    cJSON *j;
    T_CHECK(create_job(s.port, body, &j) == 400, "a file of purpose batch");
    cJSON_Delete(j);
    snprintf(body, sizeof body, "{\"model\":\"stories260K\",\"training_file\":\"%s\"}", pref); /* pairs need dpo */
    T_CHECK(create_job(s.port, body, &j) == 400 && strstr(str_of(cJSON_GetObjectItemCaseSensitive(j, "error"), "message"), "dpo"), "pairs");
    cJSON_Delete(j);
    cJSON *l = get_json(s.port, "/v1/fine_tuning/jobs");
    T_CHECK(l && cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(l, "data")) == 0, "no job after the refusals");
    cJSON_Delete(l);

    /* a job: trained, served as ft:BASE:local:SUFFIX:ID, its events, result file and checkpoint */
    snprintf(body, sizeof body,
             "{\"model\":\"stories260K\",\"training_file\":\"%s\",\"validation_file\":\"%s\",\"suffix\":\"friends\",\"seed\":11,"
             "\"metadata\":{\"k\":\"v\"},\"method\":{\"type\":\"supervised\",\"supervised\":{\"hyperparameters\":{\"n_epochs\":4,"
             "\"batch_size\":2}}}}",
             chat, val);
    T_CHECK(create_job(s.port, body, &j) == 200, "create");
    char id1[64];
    snprintf(id1, sizeof id1, "%s", str_of(j, "id"));
    const cJSON *hp = cJSON_GetObjectItemCaseSensitive(j, "hyperparameters");
    T_CHECK(!strncmp(id1, "ftjob-", 6) && !strcmp(str_of(j, "object"), "fine_tuning.job") && !strcmp(str_of(j, "status"), "queued") &&
                num_of(hp, "n_epochs") == 4 && num_of(hp, "batch_size") == 2 && num_of(hp, "learning_rate_multiplier") == 1 &&
                num_of(j, "seed") == 11 && !strcmp(str_of(cJSON_GetObjectItemCaseSensitive(j, "metadata"), "k"), "v") &&
                cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "fine_tuned_model")) && !cJSON_GetObjectItemCaseSensitive(j, "nerve_args"),
            "the new job");
    cJSON_Delete(j);
    j = wait_job(s.port, id1, "succeeded failed cancelled", 120);
    char ft[200];
    snprintf(ft, sizeof ft, "ft:stories260K:local:friends:%.8s", id1 + 6);
    T_CHECK(!strcmp(str_of(j, "status"), "succeeded") && !strcmp(str_of(j, "fine_tuned_model"), ft) && num_of(j, "trained_tokens") > 0 &&
                num_of(j, "finished_at") >= num_of(j, "created_at"),
            "the job: %s %s %s", str_of(j, "status"), str_of(j, "fine_tuned_model"),
            str_of(cJSON_GetObjectItemCaseSensitive(j, "error"), "message"));
    /* vLLM's load and unload endpoints keep off a job's models (DELETE /v1/models removes them) */
    for (int unload = 0; unload < 2; unload++) {
        resp lr;
        char lb[400];
        snprintf(lb, sizeof lb, "{\"lora_name\":\"%s%s\",\"lora_path\":\"/nonexistent\"}", ft, unload ? "" : ":ckpt-step-1");
        T_CHECK(http(s.port, "POST", unload ? "/v1/unload_lora_adapter" : "/v1/load_lora_adapter", KEY, lb, &lr) && lr.status == 400 &&
                    strstr(lr.body, "fine-tuning job's model"),
                "%s a job's model: %d %s", unload ? "unloading" : "loading", lr.status, lr.body);
        resp_free(&lr);
    }
    const cJSON *rf = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "result_files"), 0);
    char *csv = cJSON_IsString(rf) ? file_content(s.port, rf->valuestring) : NULL;
    int rows = 0;
    for (const char *p = csv; p && (p = strchr(p, '\n')); p++) rows++;
    static const char header[] = "step,train_loss,train_accuracy,valid_loss,valid_mean_token_accuracy,full_valid_loss,"
                                 "full_valid_mean_token_accuracy,learning_rate\n";
    /* the columns' figures present in a row: training alone at step 5, every one at step 12 (the first
       epoch's end: a full evaluation, none of --eval-every's) but the held-out batches', all at step 48 */
    const char *row5 = csv ? strstr(csv, "\n5,") : NULL, *row12 = csv ? strstr(csv, "\n12,") : NULL, *row48 = csv ? strstr(csv, "\n48,") : NULL;
    char shape[3][16] = {"", "", ""};
    const char *rowv[3] = {row5, row12, row48};
    for (int r = 0; r < 3; r++)
        for (const char *p = rowv[r] ? rowv[r] + 1 : NULL; p && *p != '\n' && strlen(shape[r]) < 15; p++)
            if (*p == ',') shape[r][strlen(shape[r])] = p[1] == ',' || p[1] == '\n' ? '-' : 'x';
    T_CHECK(csv && !strncmp(csv, header, sizeof header - 1) && rows == 1 + 48 && !strcmp(shape[0], "xx----x") &&
                !strcmp(shape[1], "xx--xxx") && !strcmp(shape[2], "xxxxxxx"),
            "the result file: %d rows, figures at step 5 '%s', 12 '%s', 48 '%s'", rows, shape[0], shape[1], shape[2]);
    free(csv);
    cJSON_Delete(j);
    double l1[64], acc1[64], full1[64], fullacc1[64];
    T_CHECK(job_losses(dir, id1, l1, 64) == 48 && l1[47] < 0.5 * l1[0], "the losses: %g -> %g", l1[0], l1[47]);
    T_CHECK(job_field(dir, id1, "token_acc", acc1, 64) == 48 && acc1[47] > acc1[0] && job_field(dir, id1, "full_val_loss", full1, 64) == 48 &&
                job_field(dir, id1, "full_val_token_acc", fullacc1, 64) == 48 && full1[11] > 0 && full1[35] > 0 && full1[47] > 0 &&
                full1[10] == -1 && fullacc1[35] >= 0,
            "the token accuracies %g -> %g; full validation at steps 11, 12, 36, 48: %g %g %g %g", acc1[0], acc1[47], full1[10], full1[11],
            full1[35], full1[47]);
    cJSON *ev[256];
    const int ne = job_events(s.port, id1, ev, 256);
    int metrics = 0, created = 0, done = 0, ckpt_events = 0;
    for (int i = 0; i < ne; i++) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(ev[i], "data");
        ckpt_events += !strncmp(str_of(ev[i], "message"), "Checkpoint created at step ", 27);
        if (!strcmp(str_of(ev[i], "type"), "metrics"))
            metrics += num_of(d, "step") == metrics + 1 && num_of(d, "total_steps") == 48 && num_of(d, "train_loss") == l1[metrics] &&
                       num_of(d, "train_mean_token_accuracy") == acc1[metrics] && num_of(d, "full_valid_loss") == full1[metrics] &&
                       (full1[metrics] < 0 || strstr(str_of(ev[i], "message"), ", full validation loss="));
        created += i == 0 && strstr(str_of(ev[i], "message"), "Created fine-tuning job") != NULL;
        done += i == ne - 1 && !strcmp(str_of(ev[i], "message"), "The job has successfully completed");
        cJSON_Delete(ev[i]);
    }
    T_CHECK(metrics == 48 && created && done && ckpt_events == 2, "%d events: %d metrics in order, created %d, done %d, %d checkpoints", ne,
            metrics, created, done, ckpt_events);
    char path[300];
    snprintf(path, sizeof path, "/v1/fine_tuning/jobs/%s/checkpoints", id1);
    l = get_json(s.port, path);
    const cJSON *ck = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(l, "data"), 0);
    const cJSON *ckm = cJSON_GetObjectItemCaseSensitive(ck, "metrics");
    T_CHECK(ck && num_of(ck, "step_number") == 48 && !strcmp(str_of(ck, "fine_tuned_model_checkpoint"), ft) && num_of(ckm, "train_loss") == l1[47] &&
                num_of(ckm, "train_mean_token_accuracy") == acc1[47] && num_of(ckm, "valid_loss") > 0 &&
                num_of(ckm, "valid_mean_token_accuracy") >= 0 && num_of(ckm, "full_valid_loss") == full1[47] &&
                num_of(ckm, "full_valid_mean_token_accuracy") == fullacc1[47],
            "the checkpoint");
    /* and its earlier epochs' models, the last two (steps 24 and 36 of 12 a pass), newest first, served */
    const cJSON *ckd = cJSON_GetObjectItemCaseSensitive(l, "data");
    char ck36[240], ck24[240], first_ck[80] = "";
    snprintf(ck36, sizeof ck36, "%s:ckpt-step-36", ft);
    snprintf(ck24, sizeof ck24, "%s:ckpt-step-24", ft);
    const cJSON *c36 = cJSON_GetArrayItem(ckd, 1), *c24 = cJSON_GetArrayItem(ckd, 2);
    T_CHECK(cJSON_GetArraySize(ckd) == 3 && num_of(c36, "step_number") == 36 && !strcmp(str_of(c36, "fine_tuned_model_checkpoint"), ck36) &&
                num_of(cJSON_GetObjectItemCaseSensitive(c36, "metrics"), "train_loss") == l1[35] &&
                num_of(cJSON_GetObjectItemCaseSensitive(c36, "metrics"), "full_valid_loss") == full1[35] &&
                num_of(cJSON_GetObjectItemCaseSensitive(c36, "metrics"), "full_valid_mean_token_accuracy") == fullacc1[35] &&
                num_of(c24, "step_number") == 24 &&
                !strcmp(str_of(c24, "fine_tuned_model_checkpoint"), ck24) &&
                num_of(cJSON_GetObjectItemCaseSensitive(c24, "metrics"), "train_loss") == l1[23] && strcmp(str_of(c36, "id"), str_of(c24, "id")) &&
                !strcmp(str_of(l, "last_id"), str_of(c24, "id")) && !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(l, "has_more")),
            "the earlier epochs' checkpoints: %d", cJSON_GetArraySize(ckd));
    snprintf(first_ck, sizeof first_ck, "%s", str_of(ck, "id"));
    cJSON_Delete(l);
    snprintf(path, sizeof path, "/v1/fine_tuning/jobs/%s/checkpoints?limit=1", id1);
    l = get_json(s.port, path);
    T_CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(l, "data")) == 1 && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(l, "has_more")),
            "a page of one checkpoint");
    cJSON_Delete(l);
    snprintf(path, sizeof path, "/v1/fine_tuning/jobs/%s/checkpoints?after=%s", id1, first_ck);
    l = get_json(s.port, path);
    T_CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(l, "data")) == 2 &&
                num_of(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(l, "data"), 0), "step_number") == 36,
            "the checkpoints after the first");
    cJSON_Delete(l);
    char step_dir[700];
    snprintf(step_dir, sizeof step_dir, "%s/%s.run/run/step-12", dir, id1);
    T_CHECK(!nv_file_exists(step_dir), "the first epoch's model is not kept (the last two are)");
    char *ck_says = chat_answer(s.port, ck36);
    T_CHECK(strstr(ck_says, "friend is"), "the model of step 36 says '%s'", ck_says);
    free(ck_says);
    /* served beside the base: listed with its parent, answering as trained */
    l = get_json(s.port, "/v1/models");
    const cJSON *m1 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(l, "data"), 1);
    T_CHECK(!strcmp(str_of(m1, "id"), ft) && !strcmp(str_of(m1, "parent"), "stories260K"), "/v1/models");
    cJSON_Delete(l);
    char *base_says = chat_answer(s.port, "stories260K"), *ft_says = chat_answer(s.port, ft);
    T_CHECK(strstr(ft_says, "friend is") && !strstr(base_says, "friend is"), "the base says '%s', the fine-tuned model '%s'", base_says, ft_says);
    free(base_says), free(ft_says);

    /* the same job paused, resumed, its server restarted part way, its file deleted: the same losses */
    snprintf(body, sizeof body,
             "{\"model\":\"stories260K\",\"training_file\":\"%s\",\"validation_file\":\"%s\",\"seed\":11,\"hyperparameters\":{\"n_epochs\":4,"
             "\"batch_size\":2}}",
             chat, val);
    T_CHECK(create_job(s.port, body, &j) == 200, "create 2");
    char id2[64];
    snprintf(id2, sizeof id2, "%s", str_of(j, "id"));
    cJSON_Delete(j);
    snprintf(path, sizeof path, "/v1/files/%s", chat);
    resp r;
    T_CHECK(http(s.port, "DELETE", path, KEY, NULL, &r) && r.status == 200, "delete the training file");
    resp_free(&r);
    double l2[64];
    for (double t0 = now_s(); job_losses(dir, id2, l2, 64) < 6 && now_s() - t0 < 60;) sleep_ms(20);
    snprintf(path, sizeof path, "/v1/fine_tuning/jobs/%s/pause", id2);
    T_CHECK(http(s.port, "POST", path, KEY, "", &r) && r.status == 200, "pause: %d %s", r.status, r.body);
    resp_free(&r);
    j = wait_job(s.port, id2, "paused succeeded failed", 60);
    const int at_pause = job_losses(dir, id2, l2, 64);
    T_CHECK(!strcmp(str_of(j, "status"), "paused") && at_pause < 48, "paused at %d: %s", at_pause, str_of(j, "status"));
    cJSON_Delete(j);
    T_CHECK(http(s.port, "POST", path, KEY, "", &r) && r.status == 400, "a paused job paused again: %d", r.status);
    resp_free(&r);
    snprintf(path, sizeof path, "/v1/fine_tuning/jobs/%s/resume", id2);
    T_CHECK(http(s.port, "POST", path, KEY, "", &r) && r.status == 200 && strstr(r.body, "\"queued\""), "resume: %d", r.status);
    resp_free(&r);
    for (double t0 = now_s(); job_losses(dir, id2, l2, 64) < at_pause + 4 && now_s() - t0 < 60;) sleep_ms(20);
    /* the server killed outright while a request holds the trainer (stopped, the parent's death
       signal pending): the kernel continues the orphaned trainer, which saves its checkpoint and goes */
    const int conn = connect_to_within(s.port, 5);
    const char *req = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n" KEY "Content-Type: application/json\r\n"
                      "Content-Length: 52\r\n\r\n{\"prompt\":\"Once\",\"max_tokens\":200,\"ignore_eos\":true}";
    T_CHECK(conn >= 0 && strlen(strstr(req, "\r\n\r\n") + 4) == 52 && send_all(conn, req, strlen(req)), "a long request");
    const int trainer = record_pid(dir, id2);
    char state = 0;
    for (double t0 = now_s(); state != 'T' && now_s() - t0 < 10; sleep_ms(10)) state = all_threads_state(trainer);
    T_CHECK(trainer > 1 && state == 'T', "the trainer (pid %d) held while the request runs: state %c", trainer, state ? state : '-');
    char oom_path[64], oom[16] = "";
    snprintf(oom_path, sizeof oom_path, "/proc/%d/oom_score_adj", trainer);
    FILE *of = fopen(oom_path, "r");
    if (of && !fgets(oom, sizeof oom, of)) oom[0] = 0;
    if (of) fclose(of);
    T_CHECK(atoi(oom) == 1000, "the trainer goes first when memory runs out: oom_score_adj '%s'", oom);
    kill(s.pid, SIGKILL);
    waitpid(s.pid, NULL, 0);
    s.pid = 0;
    if (conn >= 0) close(conn);
    char tlog_path[700], *tl = NULL;
    snprintf(tlog_path, sizeof tlog_path, "%s/%s.run/train.log", dir, id2);
    int stops = 0;
    for (double t0 = now_s(); (stops < 2 || (nv_proc_state(trainer) && nv_proc_state(trainer) != 'Z')) && now_s() - t0 < 30; sleep_ms(50)) {
        free(tl), tl = NULL;
        nv_file_read_all(tlog_path, &tl, NULL);
        stops = 0;
        for (const char *p = tl; p && (p = strstr(p, "stopped at step ")); p++) stops++;
    }
    free(tl);
    T_CHECK(stops == 2 && (!nv_proc_state(trainer) || nv_proc_state(trainer) == 'Z'),
            "the held trainer of a killed server stopped with its checkpoint (%d stops in its log, state %c)", stops,
            nv_proc_state(trainer) ? nv_proc_state(trainer) : '-');
    char rec[700], *saved = NULL;
    snprintf(rec, sizeof rec, "%s/%s.json", dir, id2);
    nv_file_read_all(rec, &saved, NULL);
    T_CHECK(saved && (strstr(saved, "\"running\"") || strstr(saved, "\"validating_files\"")), "left training: %.300s", saved ? saved : "-");
    /* a trainer still there at the next start (a stand-in: a stopped process whose command line is
       `X train ...` naming the job's folder, its pid and start time in the record) is continued and
       stopped by it before the job goes on */
    char mark[80];
    snprintf(mark, sizeof mark, "%s.run/x", id2);
    char standin_dir[700];
    snprintf(standin_dir, sizeof standin_dir, "%s", t_path("standin"));
    mkdir(standin_dir, 0700);
    t_write("standin/train", "while :; do sleep 1; done\n", 26);
    const pid_t standin = fork();
    if (standin == 0) {
        if (chdir(standin_dir) == 0) execl("/bin/sh", "sh", "train", mark, (char *)NULL); /* argv[1]: train */
        _exit(127);
    }
    for (double t0 = now_s(); nv_proc_state(standin) != 'S' && now_s() - t0 < 5;) sleep_ms(10);
    kill(standin, SIGSTOP);
    cJSON *edited = cJSON_Parse(saved ? saved : "");
    cJSON_ReplaceItemInObjectCaseSensitive(edited, "nerve_pid", cJSON_CreateNumber(standin));
    cJSON_ReplaceItemInObjectCaseSensitive(edited, "nerve_pid_start", cJSON_CreateNumber((double)nv_proc_start_time(standin)));
    char *text_rec = cJSON_PrintUnformatted(edited);
    FILE *recf = fopen(rec, "w");
    if (recf && text_rec) fputs(text_rec, recf);
    if (recf) fclose(recf);
    free(text_rec);
    cJSON_Delete(edited);
    free(saved);
    const int at_stop = job_losses(dir, id2, l2, 64);
    T_CHECK(at_stop < 48, "stopped at step %d of 48", at_stop);
    if (!server_spawn(&s, "ft2", NULL, "NERVE_LOG=info NERVE_TEST_STEP_DELAY_MS=30", model_path(), tok_path(), args, 60)) return;
    int standin_st = 0;
    const pid_t reaped = waitpid(standin, &standin_st, WNOHANG);
    if (reaped != standin) kill(standin, SIGKILL), waitpid(standin, NULL, 0);
    T_CHECK(reaped == standin && WIFSIGNALED(standin_st) && WTERMSIG(standin_st) == SIGTERM,
            "the stand-in trainer stopped (SIGTERM) before the server started");
    char *slog = read_log(&s);
    T_CHECK(slog && strstr(slog, "outlived the last server"), "the server says it stopped a trainer left behind");
    free(slog);
    l = get_json(s.port, "/v1/models");
    T_CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(l, "data")) == 4, "the fine-tuned models served after the restart");
    cJSON_Delete(l);
    j = wait_job(s.port, id2, "succeeded failed cancelled", 120);
    T_CHECK(!strcmp(str_of(j, "status"), "succeeded"), "after the restart: %s %s", str_of(j, "status"),
            str_of(cJSON_GetObjectItemCaseSensitive(j, "error"), "message"));
    T_CHECK(num_of(j, "trained_tokens") > 0, "a resumed job's trained_tokens: %g", num_of(j, "trained_tokens"));
    cJSON_Delete(j);
    int same = job_losses(dir, id2, l2, 64) == 48;
    for (int i = 0; same && i < 48; i++) same = l2[i] == l1[i];
    T_CHECK(same, "paused at %d, stopped at %d: the losses of the run never stopped", at_pause, at_stop);
    char *tlog = NULL; /* it went on from its checkpoints, twice, not from the start */
    snprintf(rec, sizeof rec, "%s/%s.run/train.log", dir, id2);
    nv_file_read_all(rec, &tlog, NULL);
    int resumes = 0;
    for (const char *p = tlog; p && (p = strstr(p, "resuming ")); p++) resumes++;
    T_CHECK(resumes == 2, "%d resumes in %s", resumes, rec);
    free(tlog);
    const int ne2 = job_events(s.port, id2, ev, 256);
    int steps2 = 0, pauses = 0;
    for (int i = 0; i < ne2; i++) {
        if (!strcmp(str_of(ev[i], "type"), "metrics")) /* (a step told twice breaks the count) */
            steps2 = num_of(cJSON_GetObjectItemCaseSensitive(ev[i], "data"), "step") == steps2 + 1 ? steps2 + 1 : -1000;
        else pauses += !strcmp(str_of(ev[i], "message"), "The job was paused");
        cJSON_Delete(ev[i]);
    }
    T_CHECK(steps2 == 48 && pauses == 1, "the resumed job's events: each step once, in order (%d), and its pause (%d)", steps2, pauses);

    /* a file with a bad line: failed, the error naming the file and the line */
    snprintf(body, sizeof body, "{\"model\":\"stories260K\",\"training_file\":\"%s\"}", bad);
    T_CHECK(create_job(s.port, body, &j) == 200, "create 3");
    char id3[64];
    snprintf(id3, sizeof id3, "%s", str_of(j, "id"));
    cJSON_Delete(j);
    j = wait_job(s.port, id3, "succeeded failed cancelled", 60);
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(j, "error");
    char want[80];
    snprintf(want, sizeof want, "%s:2:", bad);
    T_CHECK(!strcmp(str_of(j, "status"), "failed") && !strcmp(str_of(err, "code"), "invalid_training_file") &&
                strstr(str_of(err, "message"), want) && !strstr(str_of(err, "message"), dir) &&
                cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "fine_tuned_model")),
            "the failed job: %s %s", str_of(j, "status"), str_of(err, "message"));
    cJSON_Delete(j);
    snprintf(path, sizeof path, "/v1/fine_tuning/jobs/%s/cancel", id3);
    T_CHECK(http(s.port, "POST", path, KEY, "", &r) && r.status == 400, "cancel an ended job: %d", r.status);
    resp_free(&r);

    /* preference pairs by DPO; a job cancelled while queued behind it */
    snprintf(body, sizeof body, "{\"model\":\"stories260K\",\"training_file\":\"%s\",\"method\":{\"type\":\"dpo\",\"dpo\":{\"hyperparameters\":{\"beta\":0.2,\"n_epochs\":2}}}}", pref);
    T_CHECK(create_job(s.port, body, &j) == 200, "create dpo");
    char id4[64], id5[64];
    snprintf(id4, sizeof id4, "%s", str_of(j, "id"));
    T_CHECK(num_of(cJSON_GetObjectItemCaseSensitive(j, "hyperparameters"), "beta") == 0.2 &&
                !strcmp(str_of(cJSON_GetObjectItemCaseSensitive(j, "method"), "type"), "dpo"),
            "the dpo job");
    cJSON_Delete(j);
    snprintf(body, sizeof body, "{\"model\":\"stories260K\",\"training_file\":\"%s\"}", bad);
    T_CHECK(create_job(s.port, body, &j) == 200, "create 5");
    snprintf(id5, sizeof id5, "%s", str_of(j, "id"));
    cJSON_Delete(j);
    snprintf(path, sizeof path, "/v1/fine_tuning/jobs/%s/cancel", id5);
    T_CHECK(http(s.port, "POST", path, KEY, "", &r) && r.status == 200 && strstr(r.body, "\"cancelled\""), "cancel: %d %s", r.status, r.body);
    resp_free(&r);
    j = wait_job(s.port, id4, "succeeded failed cancelled", 120);
    T_CHECK(!strcmp(str_of(j, "status"), "succeeded") && !strncmp(str_of(j, "fine_tuned_model"), "ft:stories260K:local::", 22),
            "the dpo job: %s %s", str_of(j, "status"), str_of(cJSON_GetObjectItemCaseSensitive(j, "error"), "message"));
    cJSON_Delete(j);
    snprintf(path, sizeof path, "/v1/fine_tuning/jobs/%s", id5);
    j = get_json(s.port, path);
    T_CHECK(!strcmp(str_of(j, "status"), "cancelled"), "the cancelled job stays cancelled: %s", str_of(j, "status"));
    cJSON_Delete(j);
    l = get_json(s.port, "/v1/fine_tuning/jobs?limit=2");
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(l, "data");
    T_CHECK(cJSON_GetArraySize(data) == 2 && !strcmp(str_of(cJSON_GetArrayItem(data, 0), "id"), id5) &&
                cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(l, "has_more")),
            "the list, newest first");
    cJSON_Delete(l);
    snprintf(path, sizeof path, "/v1/fine_tuning/jobs?after=%s", id2);
    l = get_json(s.port, path);
    data = cJSON_GetObjectItemCaseSensitive(l, "data");
    T_CHECK(cJSON_GetArraySize(data) == 1 && !strcmp(str_of(cJSON_GetArrayItem(data, 0), "id"), id1), "after");
    cJSON_Delete(l);
    /* OpenAI's metadata filter: job 1 alone has {"k": "v"} */
    l = get_json(s.port, "/v1/fine_tuning/jobs?metadata%5Bk%5D=v");
    data = cJSON_GetObjectItemCaseSensitive(l, "data");
    T_CHECK(cJSON_GetArraySize(data) == 1 && !strcmp(str_of(cJSON_GetArrayItem(data, 0), "id"), id1), "metadata[k]=v");
    cJSON_Delete(l);
    l = get_json(s.port, "/v1/fine_tuning/jobs?metadata[k]=w");
    T_CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(l, "data")) == 0, "metadata[k]=w");
    cJSON_Delete(l);
    l = get_json(s.port, "/v1/fine_tuning/jobs?metadata=null&limit=4");
    data = cJSON_GetObjectItemCaseSensitive(l, "data");
    int with_meta = 0;
    for (const cJSON *x = data ? data->child : NULL; x; x = x->next) with_meta += !strcmp(str_of(x, "id"), id1);
    T_CHECK(cJSON_GetArraySize(data) == 4 && !with_meta && !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(l, "has_more")),
            "metadata=null: the four others");
    cJSON_Delete(l);
    char many[1200] = "/v1/fine_tuning/jobs?metadata[k]=v", dup[1200] = "/v1/fine_tuning/jobs?metadata[k]=w";
    for (int i = 0; i < 16; i++) snprintf(many + strlen(many), sizeof many - strlen(many), "&metadata[k%d]=v", i);
    for (int i = 0; i < 20; i++) snprintf(dup + strlen(dup), sizeof dup - strlen(dup), "&metadata[k]=v"); /* (the last wins) */
    struct {
        const char *path;
        int status, listed;
    } filters[] = {{"/v1/fine_tuning/jobs?metadata%5Bk=v", 400, -1},
                   {"/v1/fine_tuning/jobs?metadata[]=v", 400, -1},
                   {"/v1/fine_tuning/jobs?metadata[aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa]=v", 400, -1},
                   {"/v1/fine_tuning/jobs?metadata[aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa]=v", 400, -1},
                   {"/v1/fine_tuning/jobs?metadata=x", 400, -1},
                   {"/v1/fine_tuning/jobs?metadata=null&metadata[k]=v", 400, -1},
                   {many, 400, -1},
                   {dup, 200, 1},
                   {"/v1/fine_tuning/jobs?metadataX=1&limit=2", 200, 2}};
    for (size_t i = 0; i < sizeof filters / sizeof *filters; i++) {
        T_CHECK(http(s.port, "GET", filters[i].path, KEY, NULL, &r) && r.status == filters[i].status &&
                    (r.status != 400 || strstr(r.body, "\"metadata\"")),
                "filter %zu: %d", i, r.status);
        cJSON *fl = filters[i].listed >= 0 ? cJSON_Parse(r.body ? r.body : "") : NULL;
        T_CHECK(filters[i].listed < 0 || cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(fl, "data")) == filters[i].listed,
                "filter %zu lists %d", i, cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(fl, "data")));
        cJSON_Delete(fl);
        resp_free(&r);
    }
    T_CHECK(http(s.port, "GET", "/metrics", KEY, NULL, &r) && r.status == 200 &&
                strstr(r.body, "\nnerve_fine_tuning_jobs{status=\"succeeded\"} 3\n") &&
                strstr(r.body, "\nnerve_fine_tuning_jobs{status=\"failed\"} 1\n") &&
                strstr(r.body, "\nnerve_fine_tuning_jobs{status=\"cancelled\"} 1\n"),
            "/metrics: %s", r.body ? strstr(r.body, "nerve_fine_tuning_jobs{") : "-");
    resp_free(&r);

    /* a job going on from an earlier epoch's model: its adapters train on, their rank kept; the model
       deleted while the job waits (it holds its own link to them), then refused as a start */
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"training_file\":\"%s\",\"hyperparameters\":{\"lora_rank\":4}}", ck24, val);
    T_CHECK(create_job(s.port, body, &j) == 400 && !strcmp(str_of(cJSON_GetObjectItemCaseSensitive(j, "error"), "param"), "hyperparameters.lora_rank"),
            "another rank than the model's");
    cJSON_Delete(j);
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"training_file\":\"%s\",\"seed\":11,\"hyperparameters\":{\"n_epochs\":1,\"batch_size\":2}}",
             ck24, val);
    T_CHECK(create_job(s.port, body, &j) == 200 && !strcmp(str_of(j, "model"), ck24), "create from %s: %s", ck24,
            str_of(cJSON_GetObjectItemCaseSensitive(j, "error"), "message"));
    char id7[64];
    snprintf(id7, sizeof id7, "%s", str_of(j, "id"));
    cJSON_Delete(j);
    snprintf(path, sizeof path, "/v1/models/%s", ck24);
    T_CHECK(http(s.port, "DELETE", path, KEY, NULL, &r) && r.status == 200, "delete an earlier epoch's model: %d", r.status);
    resp_free(&r);
    T_CHECK(create_job(s.port, body, &j) == 400 && !strcmp(str_of(cJSON_GetObjectItemCaseSensitive(j, "error"), "param"), "model"),
            "a deleted model as the start");
    cJSON_Delete(j);
    j = wait_job(s.port, id7, "succeeded failed cancelled", 120);
    double l7[16];
    T_CHECK(!strcmp(str_of(j, "status"), "succeeded") && !strncmp(str_of(j, "fine_tuned_model"), "ft:stories260K:local::", 22) &&
                job_losses(dir, id7, l7, 16) == 12 && l7[0] < 0.5 * l1[0],
            "the job from step 24's model: %s, first loss %g (the base's %g)", str_of(j, "status"), l7[0], l1[0]);
    cJSON_Delete(j);
    snprintf(path, sizeof path, "/v1/fine_tuning/jobs/%s/checkpoints", id1);
    l = get_json(s.port, path);
    T_CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(l, "data")) == 2, "the deleted model's checkpoint is not listed");
    cJSON_Delete(l);
    snprintf(step_dir, sizeof step_dir, "%s/%s.run/run/step-24", dir, id1);
    T_CHECK(!nv_file_exists(step_dir), "its adapters removed");

    /* a fine-tuned model deleted: gone from the list and from requests, and at the next start */
    snprintf(path, sizeof path, "/v1/models/%s", ft);
    T_CHECK(http(s.port, "DELETE", path, KEY, NULL, &r) && r.status == 200 && strstr(r.body, "\"deleted\":true"), "delete: %d %s", r.status, r.body);
    resp_free(&r);
    T_CHECK(http(s.port, "DELETE", path, KEY, NULL, &r) && r.status == 404, "deleted twice: %d", r.status);
    resp_free(&r);
    T_CHECK(http(s.port, "DELETE", "/v1/models/stories260K", KEY, NULL, &r) && r.status == 403, "the base: %d", r.status);
    resp_free(&r);
    ft_says = chat_answer(s.port, ft);
    T_CHECK(strstr(ft_says, "model_not_found") || strstr(ft_says, "does not exist"), "a request for it: %s", ft_says);
    free(ft_says);
    /* a long job when the server stops: its trainer stops with its checkpoint, and the job goes on at
       the next start; cancelled while it trains: cancelled at once, what it had written removed */
    snprintf(body, sizeof body, "{\"model\":\"stories260K\",\"training_file\":\"%s\",\"hyperparameters\":{\"n_epochs\":50}}", val);
    T_CHECK(create_job(s.port, body, &j) == 200, "create 6");
    char id6[64];
    snprintf(id6, sizeof id6, "%s", str_of(j, "id"));
    cJSON_Delete(j);
    for (double t0 = now_s(); job_steps(dir, id6) < 3 && now_s() - t0 < 60;) sleep_ms(20);
    /* requests go first: the trainer is held while one runs (40 steps of the server's, 30 ms each;
       held within a poll of 50 ms, it makes a step or two, where it made 34 not held) */
    const int steps_before = job_steps(dir, id6);
    const double t_req = now_s();
    T_CHECK(http(s.port, "POST", "/v1/completions", KEY, "{\"prompt\":\"Once\",\"max_tokens\":40,\"ignore_eos\":true}", &r) && r.status == 200,
            "a request while the job trains: %d", r.status);
    resp_free(&r);
    const int steps_during = job_steps(dir, id6) - steps_before;
    T_CHECK(steps_during <= 6, "the trainer made %d steps in the %.1f s a request ran", steps_during, now_s() - t_req);
    for (double t0 = now_s(); job_steps(dir, id6) < steps_before + steps_during + 3 && now_s() - t0 < 60;) sleep_ms(20);
    T_CHECK(job_steps(dir, id6) >= steps_before + steps_during + 3, "the trainer goes on once the server is quiet");
    T_CHECK(server_stop_within(&s, 60) == 0, "server exit");
    snprintf(rec, sizeof rec, "%s/%s.run/run/ckpt.bin", dir, id6);
    T_CHECK(nv_file_exists(rec), "the stopped job's checkpoint");
    /* job 1's record edited by hand: an earlier epoch's model whose entry is not whole, a rank out of range */
    snprintf(path, sizeof path, "%s/%s.json", dir, id1);
    char *rec1 = NULL;
    nv_file_read_all(path, &rec1, NULL);
    cJSON *o1 = cJSON_Parse(rec1 ? rec1 : "");
    cJSON *bogus = cJSON_CreateObject();
    cJSON_AddStringToObject(bogus, "model", "ft:bogus");
    cJSON_AddStringToObject(bogus, "step", "x");
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(o1, "nerve_checkpoints"), bogus);
    cJSON_ReplaceItemInObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(o1, "nerve_args"), "lora_rank", cJSON_CreateNumber(0));
    char *text1 = cJSON_PrintUnformatted(o1);
    FILE *f1 = fopen(path, "w");
    if (f1 && text1) fputs(text1, f1);
    if (f1) fclose(f1);
    free(text1), free(rec1);
    cJSON_Delete(o1);
    if (!server_spawn(&s, "ft3", NULL, NULL, model_path(), tok_path(), args, 60)) return;
    T_CHECK(http(s.port, "DELETE", "/v1/models/ft:bogus", KEY, NULL, &r) && r.status == 404, "a model whose entry is not whole: %d", r.status);
    resp_free(&r);
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"training_file\":\"%s\"}", ck36, val);
    T_CHECK(create_job(s.port, body, &j) == 400 && strstr(str_of(cJSON_GetObjectItemCaseSensitive(j, "error"), "message"), "rank 0"),
            "a start whose rank is out of range: %s", str_of(cJSON_GetObjectItemCaseSensitive(j, "error"), "message"));
    cJSON_Delete(j);
    snprintf(path, sizeof path, "/v1/fine_tuning/jobs/%s/checkpoints", id1);
    l = get_json(s.port, path);
    T_CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(l, "data")) == 1, "job 1's checkpoints: step 36's alone");
    cJSON_Delete(l);
    l = get_json(s.port, "/v1/models");
    /* the base; job 1's model of step 36 (its final one and step 24's deleted); job 2's three, the dpo
       job's two (2 epochs), the job from step 24's one (1 epoch) */
    int ck36_listed = 0;
    for (const cJSON *m = cJSON_GetObjectItemCaseSensitive(l, "data")->child; m; m = m->next) ck36_listed += !strcmp(str_of(m, "id"), ck36);
    T_CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(l, "data")) == 8 && ck36_listed,
            "served after the restart: the eight left (%d)", cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(l, "data")));
    cJSON_Delete(l);
    j = wait_job(s.port, id6, "running", 60);
    T_CHECK(!strcmp(str_of(j, "status"), "running"), "the stopped job goes on: %s", str_of(j, "status"));
    cJSON_Delete(j);
    snprintf(step_dir, sizeof step_dir, "%s/%s.run/run/step-24", dir, id6); /* (an epoch is 24 steps) */
    for (double t0 = now_s(); !nv_file_exists(step_dir) && now_s() - t0 < 60;) sleep_ms(20);
    T_CHECK(nv_file_exists(step_dir), "the long job's first epoch's model");
    snprintf(path, sizeof path, "/v1/fine_tuning/jobs/%s/cancel", id6);
    T_CHECK(http(s.port, "POST", path, KEY, "", &r) && r.status == 200 && strstr(r.body, "\"cancelled\""), "cancel while training: %d %s", r.status,
            r.body);
    resp_free(&r);
    for (double t0 = now_s(); nv_file_exists(rec) && now_s() - t0 < 30;) sleep_ms(20);
    snprintf(path, sizeof path, "/v1/fine_tuning/jobs/%s", id6);
    j = get_json(s.port, path);
    T_CHECK(!strcmp(str_of(j, "status"), "cancelled") && !nv_file_exists(rec) && cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "fine_tuned_model")),
            "cancelled, its checkpoint removed: %s", str_of(j, "status"));
    T_CHECK(!nv_file_exists(step_dir), "and its epochs' models");
    cJSON_Delete(j);
    /* cancelled while paused: what it had written removed at once */
    snprintf(body, sizeof body, "{\"model\":\"stories260K\",\"training_file\":\"%s\",\"hyperparameters\":{\"n_epochs\":50}}", val);
    char id8[64];
    T_CHECK(paused_job(s.port, body, dir, "step-24", id8), "job 8 paused");
    snprintf(step_dir, sizeof step_dir, "%s/%s.run/run/step-24", dir, id8);
    snprintf(rec, sizeof rec, "%s/%s.run/run/ckpt.bin", dir, id8);
    T_CHECK(nv_file_exists(step_dir) && nv_file_exists(rec), "the paused job's checkpoint and first epoch's model");
    snprintf(path, sizeof path, "/v1/fine_tuning/jobs/%s/cancel", id8);
    T_CHECK(http(s.port, "POST", path, KEY, "", &r) && r.status == 200 && !nv_file_exists(step_dir) && !nv_file_exists(rec),
            "cancelled while paused: its checkpoint and epochs' models removed (%d)", r.status);
    resp_free(&r);
    /* resumed from a checkpoint its trainer refuses: failed, and never running after the resume (the
       earlier run's metrics lines are not this trainer's steps) */
    char id8b[64];
    T_CHECK(paused_job(s.port, body, dir, "ckpt.bin", id8b), "job 8b paused");
    snprintf(rec, sizeof rec, "%s/%s.run/run/ckpt.bin", dir, id8b);
    T_CHECK(job_steps(dir, id8b) > 0 && truncate(rec, 100) == 0, "job 8b paused after %d steps, its checkpoint cut short", job_steps(dir, id8b));
    snprintf(path, sizeof path, "/v1/fine_tuning/jobs/%s/resume", id8b);
    T_CHECK(http(s.port, "POST", path, KEY, "", &r) && r.status == 200, "resume 8b: %d", r.status);
    resp_free(&r);
    j = wait_job(s.port, id8b, "failed succeeded cancelled", 60);
    T_CHECK(!strcmp(str_of(j, "status"), "failed") && strstr(str_of(cJSON_GetObjectItemCaseSensitive(j, "error"), "message"), "ckpt"),
            "resumed from a checkpoint cut short: %s %s", str_of(j, "status"), str_of(cJSON_GetObjectItemCaseSensitive(j, "error"), "message"));
    cJSON_Delete(j);
    {
        cJSON *evs[256];
        const int nev = job_events(s.port, id8b, evs, 256);
        int resumed_at = -1, started_after = 0;
        for (int i = 0; i < nev; i++) {
            if (!strcmp(str_of(evs[i], "message"), "Resuming the job from its last checkpoint")) resumed_at = i;
            else if (resumed_at >= 0 && !strcmp(str_of(evs[i], "message"), "Fine-tuning job started")) started_after++;
            cJSON_Delete(evs[i]);
        }
        T_CHECK(resumed_at >= 0 && started_after == 0, "no start told after the resume (resumed at event %d, %d told)", resumed_at,
                started_after);
    }
    /* a trainer killed outright by another than the server (the kernel, out of memory): the job goes
       on, twice (the first time from the checkpoint of step 200), each step told once; the third time
       it fails saying so */
    snprintf(body, sizeof body, "{\"model\":\"stories260K\",\"training_file\":\"%s\",\"hyperparameters\":{\"n_epochs\":50}}", val);
    T_CHECK(create_job(s.port, body, &j) == 200, "create 9");
    char id9[64];
    snprintf(id9, sizeof id9, "%s", str_of(j, "id"));
    cJSON_Delete(j);
    int last_pid = 0;
    for (int kill_no = 1; kill_no <= 3; kill_no++) {
        int pid9 = 0;
        for (double t0 = now_s(); now_s() - t0 < 60; sleep_ms(20)) { /* a new trainer that has made a few steps */
            pid9 = record_pid(dir, id9);
            char ckpt9[700];
            snprintf(ckpt9, sizeof ckpt9, "%s/%s.run/run/ckpt.bin", dir, id9);
            if (pid9 > 1 && pid9 != last_pid && job_steps(dir, id9) >= 5 && (kill_no > 1 || nv_file_exists(ckpt9))) break;
        }
        T_CHECK(pid9 > 1 && pid9 != last_pid, "trainer %d of job 9: pid %d", kill_no, pid9);
        if (pid9 <= 1 || pid9 == last_pid) break;
        kill(pid9, SIGKILL);
        last_pid = pid9;
        j = wait_job(s.port, id9, kill_no < 3 ? "queued" : "failed", 30);
        T_CHECK(!strcmp(str_of(j, "status"), kill_no < 3 ? "queued" : "failed"), "killed %d: %s", kill_no, str_of(j, "status"));
        if (kill_no == 3)
            T_CHECK(strstr(str_of(cJSON_GetObjectItemCaseSensitive(j, "error"), "message"), "signal 9") &&
                        strstr(str_of(cJSON_GetObjectItemCaseSensitive(j, "error"), "message"), "2 times"),
                    "the third: %s", str_of(cJSON_GetObjectItemCaseSensitive(j, "error"), "message"));
        cJSON_Delete(j);
    }
    const int ne9 = job_events(s.port, id9, ev, 256);
    int steps9 = 0, kills = 0, from_ckpt = 0;
    for (int i = 0; i < ne9; i++) {
        from_ckpt += !strcmp(str_of(ev[i], "message"), "Resuming the job from its last checkpoint");
        if (!strcmp(str_of(ev[i], "type"), "metrics"))
            steps9 = num_of(cJSON_GetObjectItemCaseSensitive(ev[i], "data"), "step") == steps9 + 1 ? steps9 + 1 : -1000;
        else kills += !strncmp(str_of(ev[i], "message"), "The trainer was killed at step", 30) && !strcmp(str_of(ev[i], "level"), "warn");
        cJSON_Delete(ev[i]);
    }
    T_CHECK(steps9 >= 200 && kills == 2 && from_ckpt >= 1, "job 9's events: each step once (%d), two kills gone on from (%d), from its checkpoint (%d)",
            steps9, kills, from_ckpt);
    /* the adapters' places the jobs yet to end will take are theirs: one-epoch jobs until no more fit,
       then a run-time load is refused (a job's final load would fail without its place) */
    {
        char fill[64][64], data_id[64];
        int made = 0;
        char *few = chat_examples(4, 0);
        upload_id(s.port, "fine-tune", few, data_id);
        free(few);
        snprintf(body, sizeof body, "{\"model\":\"stories260K\",\"training_file\":\"%s\",\"hyperparameters\":{\"n_epochs\":1}}", data_id);
        for (; made < 64; made++) {
            cJSON *fj;
            const int st = create_job(s.port, body, &fj);
            snprintf(fill[made], sizeof fill[made], "%s", str_of(fj, "id"));
            cJSON_Delete(fj);
            if (st != 200) break;
        }
        T_CHECK(made > 0 && made < 64, "%d jobs made before the places ran out", made);
        resp lr;
        T_CHECK(http(s.port, "POST", "/v1/load_lora_adapter", KEY, "{\"lora_name\":\"extra\",\"lora_path\":\"/nonexistent\"}", &lr) &&
                    lr.status == 400 && strstr(lr.body, "held for the fine-tuning jobs"),
                "a load into a job's place: %d %s", lr.status, lr.body);
        resp_free(&lr);
        for (int k = 0; k < made; k++) {
            snprintf(path, sizeof path, "/v1/fine_tuning/jobs/%s/cancel", fill[k]);
            T_CHECK(http(s.port, "POST", path, KEY, "", &lr) && lr.status == 200, "cancel %d: %d", k, lr.status);
            resp_free(&lr);
        }
    }
    T_CHECK(server_stop_within(&s, 30) == 0, "server exit");
    /* off without --files-dir */
    if (!server_spawn(&s, "ftoff", NULL, NULL, model_path(), tok_path(), FLAGS, 60)) return;
    T_CHECK(http(s.port, "GET", "/v1/fine_tuning/jobs", "", NULL, &r) && r.status == 404 && strstr(r.body, "--files-dir"), "off: %d", r.status);
    resp_free(&r);
    T_CHECK(server_stop_within(&s, 30) == 0, "server exit");
}

int main(void) {
    T_RUN(test_files);
    T_RUN(test_batch);
    T_RUN(test_batch_restart);
    T_RUN(test_batch_cancel_priority);
    T_RUN(test_batch_preempted);
    T_RUN(test_message_batches);
    T_RUN(test_uploads);
    T_RUN(test_fine_tuning);
    T_RUN(test_fine_tuning_jinja);
    T_RUN(test_fine_tuning_unloadable);
    T_RUN(test_fine_tuning_dies_at_its_end);
    return t_done();
}
