/* OpenAI's Conversations API (conversations.h): conversations in memory, in a list ordered by use
 * (the most recent first, the least recent dropped first when the bytes pass the cap). */
#include "serve/conversations.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/hash.h"
#include "base/log.h"
#include "serve/files.h"
#include "serve/responses.h"

#define MAX_ITEMS_AT_ONCE 20 /* OpenAI's limit on the items of a create or an add */

typedef struct conv {
    struct conv *prev, *next; /* by use, the most recent first */
    struct conv *hnext;       /* the next in its bucket of the index by id */
    char id[48];
    long created;
    cJSON *metadata; /* an object */
    cJSON *items;    /* a list, oldest first */
    size_t bytes;    /* its items' and metadata's JSON, and the record */
} conv;

struct nv_conv_store {
    pthread_mutex_t mu;
    conv *first, *last;
    size_t cap, bytes, count;
    conv **buckets; /* the index by id (a lookup is not a walk of every conversation under the lock) */
    size_t n_buckets; /* a power of two, at least count */
};

nv_err nv_conv_store_new(size_t cap, nv_conv_store **out) {
    nv_conv_store *s = calloc(1, sizeof *s);
    if (!s) return nv_fail(NV_ENOMEM, "out of memory");
    pthread_mutex_init(&s->mu, NULL);
    s->cap = cap;
    *out = s;
    return NV_OK;
}

static void conv_free(conv *c) {
    cJSON_Delete(c->metadata);
    cJSON_Delete(c->items);
    free(c);
}

void nv_conv_store_free(nv_conv_store *s) {
    if (!s) return;
    for (conv *c = s->first, *next; c; c = next) {
        next = c->next;
        conv_free(c);
    }
    free(s->buckets);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

void nv_conv_store_stats(nv_conv_store *s, size_t *count, size_t *bytes) {
    pthread_mutex_lock(&s->mu);
    *count = s->count, *bytes = s->bytes;
    pthread_mutex_unlock(&s->mu);
}

/* The bytes of j's JSON text; 0 when out of memory (no JSON value prints empty). */
static size_t json_bytes(const cJSON *j) {
    char *t = cJSON_PrintUnformatted(j);
    const size_t n = t ? strlen(t) : 0;
    free(t);
    return n;
}

static const char *id_of(const cJSON *item) { return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(item, "id")); }

/* The ids of list's items, sorted (*n of them; NULL with *n 0 when none or out of memory: -1). */
static const char **sorted_ids(const cJSON *list, int *n) {
    const int cap = list ? cJSON_GetArraySize(list) : 0;
    const char **v = cap ? malloc((size_t)cap * sizeof *v) : NULL;
    *n = 0;
    if (cap && !v) {
        *n = -1;
        return NULL;
    }
    for (const cJSON *it = cap ? list->child : NULL; it; it = it->next)
        if (id_of(it)) v[(*n)++] = id_of(it);
    if (*n > 1) qsort(v, (size_t)*n, sizeof *v, nv_strcmp_ptrs);
    return v;
}

static void unlink_conv(nv_conv_store *s, conv *c) {
    if (c->prev) c->prev->next = c->next;
    else s->first = c->next;
    if (c->next) c->next->prev = c->prev;
    else s->last = c->prev;
    c->prev = c->next = NULL;
}

static void push_front(nv_conv_store *s, conv *c) {
    c->next = s->first;
    if (s->first) s->first->prev = c;
    else s->last = c;
    s->first = c;
}

static conv **bucket_of(const nv_conv_store *s, const char *id) {
    return &s->buckets[nv_hash64(id, strlen(id), 31) & (s->n_buckets - 1)];
}

/* c into the store as the most recently used (under mu): 1, or 0 when the index cannot grow. */
static int store_add(nv_conv_store *s, conv *c) {
    if (s->count + 1 > s->n_buckets) { /* the index doubled, every conversation moved over */
        const size_t n = s->n_buckets ? 2 * s->n_buckets : 1024;
        conv **b = calloc(n, sizeof *b);
        if (!b) return 0;
        free(s->buckets);
        s->buckets = b, s->n_buckets = n;
        for (conv *x = s->first; x; x = x->next) {
            conv **at = bucket_of(s, x->id);
            x->hnext = *at, *at = x;
        }
    }
    push_front(s, c);
    conv **at = bucket_of(s, c->id);
    c->hnext = *at, *at = c;
    s->bytes += c->bytes, s->count++;
    return 1;
}

/* c out of the store (under mu; the caller frees it). */
static void store_drop(nv_conv_store *s, conv *c) {
    for (conv **at = bucket_of(s, c->id); *at; at = &(*at)->hnext)
        if (*at == c) {
            *at = c->hnext;
            break;
        }
    unlink_conv(s, c);
    s->bytes -= c->bytes, s->count--;
}

/* Conversation id, made the most recently used (under mu), or NULL. */
static conv *find(nv_conv_store *s, const char *id) {
    conv *c = s->n_buckets ? *bucket_of(s, id) : NULL;
    while (c && strcmp(c->id, id)) c = c->hnext;
    if (c && c != s->first) unlink_conv(s, c), push_front(s, c);
    return c;
}

/* Drops the least recently used conversations but keep while the bytes pass the cap (under mu). */
static void make_room(nv_conv_store *s, const conv *keep) {
    for (conv *c = s->last; c && s->bytes > s->cap;) {
        conv *prev = c->prev;
        if (c != keep) {
            store_drop(s, c);
            conv_free(c);
        }
        c = prev;
    }
}

static int not_found(nv_api_error *err, const char *what, const char *id) {
    nv_api_error_set(err, 404, "invalid_request_error", "not_found", NULL, "%s with id '%.100s' not found.", what, id);
    return err->status;
}

static int bad(nv_api_error *err, const char *param, const char *msg) {
    nv_api_error_set(err, 400, "invalid_request_error", "invalid_request", param, "%s", msg);
    return err->status;
}

static cJSON *item_in(const conv *c, const char *item_id, int *index) {
    int i = 0;
    for (cJSON *it = c->items->child; it; it = it->next, i++) {
        const char *iid = id_of(it);
        if (iid && !strcmp(iid, item_id)) {
            if (index) *index = i;
            return it;
        }
    }
    return NULL;
}

typedef struct {
    const char *id;
    int at;
    const cJSON *it;
} new_id;

static int by_id_then_place(const void *a, const void *b) {
    const new_id *x = a, *y = b;
    const int c = strcmp(x->id, y->id);
    return c ? c : (x->at > y->at) - (x->at < y->at);
}

/* The items whose ids c holds already (c NULL: none) or an earlier one of items holds, in the order
 * of their ids (then their places), into *out (*n of them; the caller frees it): 0, or -1 out of
 * memory. Sorted, not pairwise: a conversation may hold many items, and this runs under the store's
 * lock. */
static int clashing_items(const conv *c, const cJSON *items, const cJSON ***out, int *n) {
    int n_have, m = 0, at = 0;
    const char **have = sorted_ids(c ? c->items : NULL, &n_have);
    const int cap = cJSON_GetArraySize(items);
    new_id *v = cap ? malloc((size_t)cap * sizeof *v) : NULL;
    *out = cap ? malloc((size_t)cap * sizeof **out) : NULL;
    *n = 0;
    const int ok = n_have >= 0 && (!cap || (v && *out));
    for (const cJSON *it = ok ? items->child : NULL; it; it = it->next, at++)
        if (id_of(it)) v[m++] = (new_id){id_of(it), at, it};
    if (m > 1) qsort(v, (size_t)m, sizeof *v, by_id_then_place);
    for (int k = 0; k < m; k++)
        if ((k && !strcmp(v[k].id, v[k - 1].id)) || (n_have && bsearch(&v[k].id, have, (size_t)n_have, sizeof *have, nv_strcmp_ptrs)))
            (*out)[(*n)++] = v[k].it;
    free(have), free(v);
    return ok ? 0 : -1;
}

/* The first id among items that c holds already or that two of them share, copied to out (cap
 * bytes): 1 when there is one, 0 none, -1 out of memory. */
static int duplicate_id(const conv *c, const cJSON *items, char *out, size_t cap) {
    const cJSON **clash;
    int n;
    const int rc = clashing_items(c, items, &clash, &n);
    if (!rc && n) snprintf(out, cap, "%s", id_of(clash[0]));
    free(clash);
    return rc ? -1 : n > 0;
}

/* Adds a copy of items to c (under mu): 1, 0 when that would take c past a quarter of the cap, -1
 * out of memory. */
static int add_items(nv_conv_store *s, conv *c, const cJSON *items) {
    size_t more = 0;
    for (const cJSON *it = items->child; it; it = it->next) { /* as an item's delete takes them back */
        const size_t n = json_bytes(it);
        if (!n) return -1;
        more += n;
    }
    if (c->bytes + more > s->cap / 4) return 0;
    cJSON *copy = cJSON_Duplicate(items, 1);
    if (!copy) return -1;
    while (copy->child) cJSON_AddItemToArray(c->items, cJSON_DetachItemViaPointer(copy, copy->child));
    cJSON_Delete(copy);
    c->bytes += more, s->bytes += more;
    make_room(s, c);
    return 1;
}

static char *conv_json(const conv *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "object", "conversation");
    cJSON_AddNumberToObject(o, "created_at", (double)c->created);
    cJSON_AddItemToObject(o, "metadata", cJSON_Duplicate(c->metadata, 1));
    return nv_api_print_free(o);
}

/* metadata (NULL: none) as a conversation keeps it, into *out; 0 or the error's status. */
static int take_metadata(const cJSON *metadata, cJSON **out, nv_api_error *err) {
    if (metadata && !cJSON_IsNull(metadata) && (!cJSON_IsObject(metadata) || !nv_rec_metadata_ok(metadata)))
        return bad(err, "metadata", "'metadata' is an object of at most 16 strings, keys up to 64 characters, values up to 512");
    *out = metadata && cJSON_IsObject(metadata) ? cJSON_Duplicate(metadata, 1) : cJSON_CreateObject();
    return *out ? 0 : nv_api_oom(err);
}

/* The request's items (required or not), checked and in kept form; *out NULL when absent. */
static int take_items(const cJSON *root, int required, cJSON **out, nv_api_error *err) {
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(root, "items");
    *out = NULL;
    if (!items || cJSON_IsNull(items)) {
        if (!required) return 0;
        nv_api_error_set(err, 400, "invalid_request_error", "missing_required_parameter", "items", "'items' is required");
        return err->status;
    }
    if (!cJSON_IsArray(items) || cJSON_GetArraySize(items) > MAX_ITEMS_AT_ONCE || (required && !items->child))
        return bad(err, "items", required ? "'items' must be a list of 1 to 20 items" : "'items' must be a list of at most 20 items");
    return nv_resp_items_take(items, "items", out, err);
}

int nv_conv_create(nv_conv_store *s, const char *body, size_t len, char **out, nv_api_error *err) {
    cJSON *root = nv_api_body_object(body, len, err), *items = NULL;
    if (!root) return err->status;
    conv *c = calloc(1, sizeof *c);
    int rc = c ? 0 : nv_api_oom(err);
    if (!rc) rc = take_metadata(cJSON_GetObjectItemCaseSensitive(root, "metadata"), &c->metadata, err);
    if (!rc) rc = take_items(root, 0, &items, err);
    cJSON_Delete(root);
    if (!rc && !(c->items = cJSON_CreateArray())) rc = nv_api_oom(err);
    char dup_id[128];
    const int dup = !rc && items ? duplicate_id(c, items, dup_id, sizeof dup_id) : 0;
    if (dup) rc = dup < 0 ? nv_api_oom(err) : bad(err, "items", "Two items have the same id");
    if (rc) {
        cJSON_Delete(items);
        if (c) conv_free(c);
        return rc;
    }
    const size_t md_bytes = json_bytes(c->metadata);
    if (!md_bytes) { /* (counted, it must not be 0: an update takes it back) */
        cJSON_Delete(items);
        conv_free(c);
        return nv_api_oom(err);
    }
    nv_api_new_id(c->id, sizeof c->id, "conv_");
    c->created = (long)time(NULL);
    c->bytes = sizeof *c + md_bytes;
    pthread_mutex_lock(&s->mu);
    const int in = store_add(s, c), added = !in ? -1 : items ? add_items(s, c, items) : 1;
    if (added > 0) make_room(s, c);
    else if (in) store_drop(s, c);
    *out = added > 0 ? conv_json(c) : NULL;
    pthread_mutex_unlock(&s->mu);
    cJSON_Delete(items);
    if (added <= 0) {
        conv_free(c);
        return added < 0 ? nv_api_oom(err) : bad(err, "items", "These items pass a quarter of the server's --responses-store");
    }
    return *out ? 0 : nv_api_oom(err);
}

int nv_conv_get(nv_conv_store *s, const char *id, char **out, nv_api_error *err) {
    pthread_mutex_lock(&s->mu);
    const conv *c = find(s, id);
    *out = c ? conv_json(c) : NULL;
    pthread_mutex_unlock(&s->mu);
    return !c ? not_found(err, "Conversation", id) : *out ? 0 : nv_api_oom(err);
}

int nv_conv_update(nv_conv_store *s, const char *id, const char *body, size_t len, char **out, nv_api_error *err) {
    cJSON *root = nv_api_body_object(body, len, err), *md = NULL;
    if (!root) return err->status;
    const cJSON *given = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    int rc = given ? take_metadata(given, &md, err) : bad(err, "metadata", "'metadata' is required");
    cJSON_Delete(root);
    if (rc) return rc;
    pthread_mutex_lock(&s->mu);
    conv *c = find(s, id);
    const size_t now = c ? json_bytes(md) : 0;
    if (c && now) {
        const size_t was = json_bytes(c->metadata); /* (0 when out of memory: counted over, never under) */
        cJSON_Delete(c->metadata);
        c->metadata = md, md = NULL;
        c->bytes += now - was, s->bytes += now - was; /* (wraps back: the sum stays right) */
        make_room(s, c);
    }
    *out = c && now ? conv_json(c) : NULL;
    pthread_mutex_unlock(&s->mu);
    cJSON_Delete(md);
    return !c ? not_found(err, "Conversation", id) : *out ? 0 : nv_api_oom(err);
}

int nv_conv_delete(nv_conv_store *s, const char *id, char **out, nv_api_error *err) {
    pthread_mutex_lock(&s->mu);
    conv *c = find(s, id);
    if (c) store_drop(s, c);
    pthread_mutex_unlock(&s->mu);
    if (!c) return not_found(err, "Conversation", id);
    conv_free(c);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", "conversation.deleted");
    cJSON_AddBoolToObject(o, "deleted", 1);
    return (*out = nv_api_print_free(o)) ? 0 : nv_api_oom(err);
}

int nv_conv_items_add(nv_conv_store *s, const char *id, const char *body, size_t len, char **out, nv_api_error *err) {
    cJSON *root = nv_api_body_object(body, len, err), *items = NULL;
    if (!root) return err->status;
    int rc = take_items(root, 1, &items, err);
    cJSON_Delete(root);
    if (rc) return rc;
    pthread_mutex_lock(&s->mu);
    conv *c = find(s, id);
    char dup_id[128];
    const int dup = c ? duplicate_id(c, items, dup_id, sizeof dup_id) : 0;
    const int added = c && !dup ? add_items(s, c, items) : 0;
    pthread_mutex_unlock(&s->mu);
    if (!c || dup || added <= 0) {
        cJSON_Delete(items);
        if (!c) return not_found(err, "Conversation", id);
        if (dup < 0) return nv_api_oom(err);
        if (dup) {
            nv_api_error_set(err, 400, "invalid_request_error", "invalid_request", "items", "Duplicate item found with id '%.100s'", dup_id);
            return err->status;
        }
        return added < 0 ? nv_api_oom(err) : bad(err, "items", "The conversation would pass a quarter of the server's --responses-store");
    }
    return nv_resp_item_page(items, "20", "asc", NULL, "The items", out, err); /* (what was added, in order) */
}

int nv_conv_items_list(nv_conv_store *s, const char *id, const char *limit, const char *order, const char *after, char **out,
                       nv_api_error *err) {
    char owner[160];
    snprintf(owner, sizeof owner, "Conversation '%.100s'", id);
    pthread_mutex_lock(&s->mu); /* (the page alone copied: a conversation may hold many items) */
    const conv *c = find(s, id);
    const int rc = c ? nv_resp_item_page_of(c->items, limit, order, after, owner, out, err) : 0;
    pthread_mutex_unlock(&s->mu);
    return c ? rc : not_found(err, "Conversation", id);
}

int nv_conv_item_get(nv_conv_store *s, const char *id, const char *item, char **out, nv_api_error *err) {
    pthread_mutex_lock(&s->mu);
    conv *c = find(s, id);
    const cJSON *it = c ? item_in(c, item, NULL) : NULL;
    *out = it ? cJSON_PrintUnformatted(it) : NULL;
    pthread_mutex_unlock(&s->mu);
    return !c ? not_found(err, "Conversation", id) : !it ? not_found(err, "Item", item) : *out ? 0 : nv_api_oom(err);
}

int nv_conv_item_delete(nv_conv_store *s, const char *id, const char *item, char **out, nv_api_error *err) {
    pthread_mutex_lock(&s->mu);
    conv *c = find(s, id);
    int index = -1;
    cJSON *it = c ? item_in(c, item, &index) : NULL;
    if (it) {
        const size_t gone = json_bytes(it); /* (0 when out of memory: counted over, never under) */
        cJSON_DeleteItemFromArray(c->items, index);
        c->bytes -= gone, s->bytes -= gone;
    }
    *out = it ? conv_json(c) : NULL;
    pthread_mutex_unlock(&s->mu);
    return !c ? not_found(err, "Conversation", id) : !it ? not_found(err, "Item", item) : *out ? 0 : nv_api_oom(err);
}

int nv_items_duplicate_id(const cJSON *items, char *out, size_t cap) { return duplicate_id(NULL, items, out, cap); }

int nv_conv_context(nv_conv_store *s, const char *id, const cJSON *own, cJSON **items, nv_api_error *err) {
    pthread_mutex_lock(&s->mu);
    const conv *c = find(s, id);
    char dup_id[128];
    const int dup = c ? duplicate_id(c, own, dup_id, sizeof dup_id) : 0;
    *items = c && !dup ? cJSON_Duplicate(c->items, 1) : NULL;
    pthread_mutex_unlock(&s->mu);
    if (!c) {
        nv_api_error_set(err, 404, "invalid_request_error", "not_found", "conversation", "Conversation with id '%.100s' not found.", id);
        return err->status;
    }
    if (dup > 0) {
        nv_api_error_set(err, 400, "invalid_request_error", "invalid_request", "input", "Duplicate item found with id '%.100s'", dup_id);
        return err->status;
    }
    return *items ? 0 : nv_api_oom(err);
}

/* The first of items whose id is dup gets a new one: 1, 0 when none did (out of memory). */
static int renew_id(cJSON *it) {
    char fresh[48];
    nv_api_new_id(fresh, sizeof fresh, "item_");
    cJSON *v = cJSON_CreateString(fresh);
    if (v && cJSON_ReplaceItemInObjectCaseSensitive(it, "id", v)) return 1;
    cJSON_Delete(v);
    return 0;
}

/* Fresh ids for the items of ours whose ids c holds already or an earlier one of items holds (ids
 * another request added meanwhile): 1, or 0 out of memory. */
static int renew_clashing_ids(const conv *c, cJSON *items) {
    const cJSON **clash;
    int n;
    int ok = clashing_items(c, items, &clash, &n) == 0;
    for (int k = 0; ok && k < n; k++) ok = renew_id((cJSON *)clash[k]); /* (items is the caller's own copy) */
    free(clash);
    return ok;
}

int nv_conv_append(nv_conv_store *s, const char *id, const cJSON *items) {
    cJSON *copy = cJSON_Duplicate(items, 1);
    if (!copy) {
        nv_warn("serve: conversation %s: the response's items not added (out of memory)", id);
        return 0;
    }
    pthread_mutex_lock(&s->mu);
    conv *c = find(s, id);
    int added = 0;
    if (c) added = renew_clashing_ids(c, copy) ? add_items(s, c, copy) : -1;
    pthread_mutex_unlock(&s->mu);
    cJSON_Delete(copy);
    if (added <= 0)
        nv_warn("serve: conversation %s: the response's items not added (%s)", id,
                !c ? "the conversation is gone" : added < 0 ? "out of memory" : "it would pass a quarter of --responses-store");
    return added > 0;
}
