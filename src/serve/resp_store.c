/* The Responses API's stored responses (responses.h): a map from id to the response's JSON, the
 * items the model saw before its output (what previous_response_id continues) and its own input
 * items, in memory, the oldest dropped first once the bytes pass the cap. */
#include "serve/responses.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "base/log.h"

#define BUCKETS 4096 /* chains stay short up to a few hundred thousand responses */

typedef struct entry {
    struct entry *older, *newer; /* age order */
    struct entry *next;          /* in its bucket */
    char id[48];
    char *response, *context, *input; /* JSON texts */
    size_t bytes;
} entry;

struct nv_resp_store {
    pthread_mutex_t mu;
    entry *buckets[BUCKETS];
    entry *oldest, *newest;
    size_t cap, bytes, count;
};

nv_err nv_resp_store_new(size_t cap, nv_resp_store **out) {
    nv_resp_store *s = calloc(1, sizeof *s);
    if (!s) return nv_fail(NV_ENOMEM, "out of memory");
    pthread_mutex_init(&s->mu, NULL);
    s->cap = cap;
    *out = s;
    return NV_OK;
}

static void entry_free(entry *e) {
    free(e->response), free(e->context), free(e->input);
    free(e);
}

void nv_resp_store_free(nv_resp_store *s) {
    if (!s) return;
    for (entry *e = s->oldest, *next; e; e = next) {
        next = e->newer;
        entry_free(e);
    }
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static entry **slot_of(nv_resp_store *s, const char *id) {
    entry **p = &s->buckets[nv_hash64(id, strlen(id), 0) % BUCKETS];
    while (*p && strcmp((*p)->id, id)) p = &(*p)->next;
    return p;
}

/* Unlinks the entry *p points at (its bucket slot) from both lists; the caller frees it. */
static entry *unlink_at(nv_resp_store *s, entry **p) {
    entry *e = *p;
    *p = e->next;
    if (e->older) e->older->newer = e->newer;
    else s->oldest = e->newer;
    if (e->newer) e->newer->older = e->older;
    else s->newest = e->older;
    s->bytes -= e->bytes;
    s->count--;
    return e;
}

int nv_resp_store_put(nv_resp_store *s, const char *id, char *response, char *context, char *input) {
    entry *e = calloc(1, sizeof *e);
    const size_t bytes = sizeof *e + strlen(response) + strlen(context) + strlen(input);
    if (!e || bytes > s->cap / 4) { /* one conversation never pushes out every other */
        if (e) nv_warn("serve: response %s (%zu bytes with its conversation) is over a quarter of --responses-store: not kept", id, bytes);
        free(e), free(response), free(context), free(input);
        return 0;
    }
    snprintf(e->id, sizeof e->id, "%s", id);
    e->response = response, e->context = context, e->input = input, e->bytes = bytes;
    pthread_mutex_lock(&s->mu);
    entry **p = slot_of(s, id);
    if (*p) entry_free(unlink_at(s, p)); /* ids are random: only a replay of the same one */
    while (s->oldest && s->bytes + bytes > s->cap) entry_free(unlink_at(s, slot_of(s, s->oldest->id)));
    p = slot_of(s, id);
    *p = e;
    e->older = s->newest;
    if (s->newest) s->newest->newer = e;
    else s->oldest = e;
    s->newest = e;
    s->bytes += bytes;
    s->count++;
    pthread_mutex_unlock(&s->mu);
    return 1;
}

int nv_resp_store_copy(nv_resp_store *s, const char *id, char **response, char **context, char **input) {
    pthread_mutex_lock(&s->mu);
    entry *e = *slot_of(s, id);
    int ok = e != NULL;
    char *r = NULL, *c = NULL, *in = NULL;
    if (ok && ((response && !(r = strdup(e->response))) || (context && !(c = strdup(e->context))) ||
               (input && !(in = strdup(e->input)))))
        ok = -1;
    pthread_mutex_unlock(&s->mu);
    if (ok < 0) free(r), free(c), free(in), r = c = in = NULL;
    if (response) *response = r;
    if (context) *context = c;
    if (input) *input = in;
    return ok;
}

int nv_resp_store_delete(nv_resp_store *s, const char *id) {
    pthread_mutex_lock(&s->mu);
    entry **p = slot_of(s, id);
    entry *e = *p ? unlink_at(s, p) : NULL;
    pthread_mutex_unlock(&s->mu);
    if (e) entry_free(e);
    return e != NULL;
}

void nv_resp_store_stats(nv_resp_store *s, size_t *count, size_t *bytes) {
    pthread_mutex_lock(&s->mu);
    *count = s->count;
    *bytes = s->bytes;
    pthread_mutex_unlock(&s->mu);
}
