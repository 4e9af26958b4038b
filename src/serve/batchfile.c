#include "serve/batchfile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

static const char *const batch_urls[] = {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"};
#define N_URLS (int)(sizeof batch_urls / sizeof *batch_urls)

nv_err nv_batch_set_init(nv_batch_set *s) {
    memset(s, 0, sizeof *s);
    return nv_map64_init(&s->ids, 1024);
}

void nv_batch_set_free(nv_batch_set *s) {
    for (int i = 0; i < s->n; i++) free(s->reqs[i].custom_id), free(s->reqs[i].body);
    free(s->reqs);
    nv_map64_free(&s->ids);
    memset(s, 0, sizeof *s);
}

/* The index of id, or -1; *slot the key it has or would take. */
static int find_slot(const nv_batch_set *s, const char *id, uint64_t *slot) {
    for (uint64_t h = nv_hash64(id, strlen(id), 17);; h++) {
        const int32_t at = nv_map64_get(&s->ids, h);
        if (at < 0 || !strcmp(s->reqs[at].custom_id, id)) {
            *slot = h;
            return at;
        }
    }
}

int nv_batch_find(const nv_batch_set *s, const char *custom_id) {
    uint64_t slot;
    return find_slot(s, custom_id, &slot);
}

/* A JSON text's whitespace, string and value skipped (text cJSON has parsed already, whose whitespace
 * is every byte up to 32, control characters included). */
static const char *skip_ws(const char *p) {
    while (*p && (unsigned char)*p <= 32) p++;
    return p;
}
static const char *skip_string(const char *p) { /* p at the opening quote: past the closing one */
    for (p++; *p && *p != '"'; p++)
        if (*p == '\\' && p[1]) p++;
    return *p ? p + 1 : p;
}
static const char *skip_value(const char *p) {
    if (*p == '"') return skip_string(p);
    if (*p != '{' && *p != '[') {
        while ((unsigned char)*p > 32 && *p != ',' && *p != '}' && *p != ']') p++;
        return p;
    }
    int depth = 0;
    while (*p) {
        if (*p == '"') {
            p = skip_string(p);
            continue;
        }
        if (*p == '{' || *p == '[') depth++;
        else if ((*p == '}' || *p == ']') && --depth == 0) return p + 1;
        p++;
    }
    return p;
}

/* Where the value of the first top-level key `key` of the JSON object text starts and its length: 1,
 * or 0 when not found as written, or when a key before it is escaped (it may be `key` itself, which
 * cJSON would take: the caller prints cJSON's value instead). */
static int member_span(const char *obj, const char *key, const char **start, size_t *len) {
    const char *p = skip_ws(obj);
    if (*p != '{') return 0;
    const size_t kl = strlen(key);
    for (p = skip_ws(p + 1); *p == '"';) {
        const char *k = p + 1, *after = skip_string(p);
        if (after <= k || memchr(k, '\\', (size_t)(after - 1 - k))) return 0; /* (cut short: not JSON) */
        const int match = (size_t)(after - 1 - k) == kl && !memcmp(k, key, kl);
        p = skip_ws(after);
        if (*p != ':') return 0;
        p = skip_ws(p + 1);
        const char *v = p;
        p = skip_value(p);
        if (match) {
            *start = v;
            *len = (size_t)(p - v);
            return 1;
        }
        p = skip_ws(p);
        if (*p != ',') return 0;
        p = skip_ws(p + 1);
    }
    return 0;
}

int nv_batch_for_lines(char *text, int (*fn)(void *ctx, char *line, int no), void *ctx) {
    int no = 0, rc = 0;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        no++;
        size_t l = strlen(line);
        if (l && line[l - 1] == '\r') line[--l] = '\0';
        if (*skip_ws(line) && (rc = fn(ctx, line, no)) != 0) break;
    }
    return rc;
}

/* The line's object checked as a request: NV_OK with its endpoint, its id's slot and its kind (1
 * OpenAI's, 2 Anthropic's), else the reason. */
static nv_err check(const nv_batch_set *s, const cJSON *j, const char **url, uint64_t *slot, int *kind) {
    if (!cJSON_IsObject(j)) return nv_fail(NV_EINVAL, "not a JSON object");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "custom_id"), *method = cJSON_GetObjectItemCaseSensitive(j, "method");
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(j, "url"), *body = cJSON_GetObjectItemCaseSensitive(j, "body");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(j, "params");
    *kind = params && !u && !method && !body ? 2 : 1;
    *url = *kind == 2 ? "/v1/messages" : NULL;
    for (int i = 0; *kind == 1 && cJSON_IsString(u) && i < N_URLS; i++)
        if (!strcmp(u->valuestring, batch_urls[i]) || !strcmp(u->valuestring, batch_urls[i] + 3)) *url = batch_urls[i];
    if (!cJSON_IsString(id) || !id->valuestring[0]) return nv_fail(NV_EINVAL, "custom_id must be a non-empty string");
    const int dup = find_slot(s, id->valuestring, slot);
    if (dup >= 0) return nv_fail(NV_EINVAL, "custom_id repeats line %d's (each request needs its own)", s->reqs[dup].line_no);
    if (s->kind && s->kind != *kind)
        return nv_fail(NV_EINVAL, "a line of %s batch format among %s's: a file holds one kind", *kind == 2 ? "Anthropic's" : "OpenAI's",
                       s->kind == 2 ? "Anthropic's" : "OpenAI's");
    if (*kind == 2) body = params;
    else if (!cJSON_IsString(method) || strcmp(method->valuestring, "POST")) return nv_fail(NV_EINVAL, "method must be \"POST\"");
    else if (!*url) return nv_fail(NV_EINVAL, "url must be one of /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses");
    if (!cJSON_IsObject(body)) return nv_fail(NV_EINVAL, "%s must be a JSON object (the request)", *kind == 2 ? "params" : "body");
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(body, "stream")))
        return nv_fail(NV_EINVAL, "body.stream: a batch's answers are written whole; leave stream out");
    return NV_OK;
}

nv_err nv_batch_add_line(nv_batch_set *s, const char *line, int line_no) {
    cJSON *j = cJSON_ParseWithOpts(line, NULL, 1); /* nothing but the object on its line */
    const char *url = NULL;
    uint64_t slot = 0;
    int kind = 0;
    nv_err e = check(s, j, &url, &slot, &kind);
    char *text = NULL, *cid = NULL;
    if (e == NV_OK) {
        const char *start, *key = kind == 2 ? "params" : "body";
        size_t len;
        text = member_span(line, key, &start, &len) ? strndup(start, len)
                                                     : cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(j, key));
        cid = strdup(cJSON_GetObjectItemCaseSensitive(j, "custom_id")->valuestring);
        if (s->n == s->cap) {
            const int cap = s->cap ? s->cap * 2 : 1024;
            nv_batch_req *r = realloc(s->reqs, (size_t)cap * sizeof *r);
            if (r) s->reqs = r, s->cap = cap;
        }
        if (!text || !cid || s->n == s->cap || nv_map64_put(&s->ids, slot, s->n) != NV_OK)
            e = nv_fail(NV_ENOMEM, "out of memory for the batch's requests");
    }
    if (e == NV_OK) {
        s->reqs[s->n++] = (nv_batch_req){.custom_id = cid, .url = url, .body = text, .line_no = line_no, .anthropic = kind == 2};
        s->kind = kind;
    } else
        free(text), free(cid);
    cJSON_Delete(j);
    return e;
}

nv_err nv_batch_output_line(const nv_batch_set *s, const char *line, int *index, int *ok) {
    cJSON *j = cJSON_ParseWithOpts(line, NULL, 1);
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "custom_id");
    const cJSON *status = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "response"), "status_code");
    const cJSON *result = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "result"), "type");
    const int anthropic = s->kind == 2;
    nv_err e = NV_OK;
    *index = -1, *ok = 0;
    if (!cJSON_IsObject(j) || !cJSON_IsString(id) || !cJSON_HasObjectItem(j, anthropic ? "result" : "response"))
        e = nv_fail(NV_EINVAL, "not a line of a batch's output");
    else if ((*index = nv_batch_find(s, id->valuestring)) < 0)
        e = nv_fail(NV_EINVAL, "custom_id '%.200s' is not among the input's requests: the output of another batch?", id->valuestring);
    else if (anthropic)
        *ok = cJSON_IsString(result) && !strcmp(result->valuestring, "succeeded");
    else
        *ok = cJSON_IsNumber(status) && status->valuedouble >= 200 && status->valuedouble < 300;
    cJSON_Delete(j);
    return e;
}
