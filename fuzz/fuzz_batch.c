/* libFuzzer harness: nerve batch's files (serve/batchfile.h; OpenAI's format or Anthropic's): each line of the input through
 * nv_batch_add_line as an input file's, then through nv_batch_output_line as a former output's.
 *
 * Checked: a refused line says why and leaves the set as it was; a kept request has a non-empty
 * custom_id that finds it, an endpoint of the four, and a body that is the line's own body as JSON
 * (the text taken between its braces parses to what cJSON parsed there, compared as cJSON prints
 * them); an output line is either
 * refused with a message or names a request of the set. And the whole input as an upload's multipart
 * body (serve/files.h, boundary XyZb): its end found the same when it comes in pieces (their sizes
 * drawn from its own bytes) as whole. Inputs above 64 KB are skipped. */
#include <cjson/cJSON.h>

#include "fuzz_util.h"
#include "serve/batchfile.h"
#include "serve/files.h"

#define FZ_MAX_INPUT (64u << 10)

static int add_cb(void *ctx, char *line, int no) {
    nv_batch_set *s = ctx;
    const int before = s->n;
    fz_clear_error();
    const nv_err e = nv_batch_add_line(s, line, no);
    if (e != NV_OK) {
        FZ_CHECK(e == NV_EINVAL && nv_errmsg()[0] != '\0' && s->n == before, "line %d refused (%d) without a message, or added", no, (int)e);
        return 0;
    }
    FZ_CHECK(s->n == before + 1, "line %d kept as %d requests", no, s->n - before);
    const nv_batch_req *r = &s->reqs[before];
    FZ_CHECK(r->custom_id[0] && nv_batch_find(s, r->custom_id) == before && r->line_no == no, "line %d: custom_id '%s'", no, r->custom_id);
    FZ_CHECK(!strncmp(r->url, "/v1/", 4), "line %d: url %s", no, r->url);
    FZ_CHECK(r->anthropic == (s->kind == 2) && (!r->anthropic || !strcmp(r->url, "/v1/messages")), "line %d: kind %d, url %s", no,
             s->kind, r->url);
    cJSON *whole = cJSON_ParseWithOpts(line, NULL, 1), *body = cJSON_Parse(r->body);
    FZ_CHECK(whole && body && cJSON_IsObject(body), "line %d: its body '%s' does not parse", no, r->body);
    /* printed, as cJSON_Compare looks each key up by name and so tells duplicate keys apart wrongly */
    char *got = cJSON_PrintUnformatted(body),
         *want = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(whole, r->anthropic ? "params" : "body"));
    FZ_CHECK(got && want && !strcmp(got, want), "line %d: body '%s' is not the line's", no, r->body);
    free(got);
    free(want);
    cJSON_Delete(whole);
    cJSON_Delete(body);
    return 0;
}

static int output_cb(void *ctx, char *line, int no) {
    const nv_batch_set *s = ctx;
    int at = -2, ok = -1;
    fz_clear_error();
    if (nv_batch_output_line(s, line, &at, &ok) != NV_OK) FZ_CHECK(nv_errmsg()[0] != '\0', "output line %d refused without a message", no);
    else FZ_CHECK(at >= 0 && at < s->n && (ok == 0 || ok == 1), "output line %d: request %d of %d, ok %d", no, at, s->n, ok);
    return 0;
}

/* The bytes of data that a multipart scan counts as body, whole and in pieces of 1..16 bytes. */
static void multipart_end(const uint8_t *data, size_t size) {
    nv_multipart_end whole, parts;
    if (!nv_multipart_end_init(&whole, "multipart/form-data; boundary=XyZb") ||
        !nv_multipart_end_init(&parts, "multipart/form-data; boundary=XyZb"))
        abort();
    const size_t want = nv_multipart_end_scan(&whole, (const char *)data, size);
    size_t got = 0;
    for (size_t at = 0; at < size;) {
        size_t k = 1 + data[at] % 16;
        if (k > size - at) k = size - at;
        got += nv_multipart_end_scan(&parts, (const char *)data + at, k);
        at += k;
    }
    FZ_CHECK(got == want && whole.closed == parts.closed, "a multipart body's end: %zu bytes whole, %zu in pieces", want, got);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > FZ_MAX_INPUT) return -1;
    multipart_end(data, size);
    char *text = malloc(size + 1), *again = malloc(size + 1);
    if (!text || !again) abort();
    memcpy(text, data, size);
    text[size] = '\0';
    memcpy(again, text, size + 1);
    nv_batch_set s;
    if (nv_batch_set_init(&s) != NV_OK) abort();
    nv_batch_for_lines(text, add_cb, &s);
    nv_batch_for_lines(again, output_cb, &s);
    nv_batch_set_free(&s);
    free(text);
    free(again);
    return 0;
}
