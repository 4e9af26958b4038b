#include "serve/batchrun.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/net.h"
#include "serve/api.h"

/* The prompt and completion tokens an answer's body reports (chat/completions and embeddings, or the
 * Responses and Messages APIs' input and output tokens) into usage[0], usage[1]. */
static void usage_of(const cJSON *body, double usage[2]) {
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(body, "usage");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens"), *c = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
    if (!p) p = cJSON_GetObjectItemCaseSensitive(u, "input_tokens");
    if (!c) c = cJSON_GetObjectItemCaseSensitive(u, "output_tokens");
    usage[0] = cJSON_IsNumber(p) ? p->valuedouble : 0.0;
    usage[1] = cJSON_IsNumber(c) ? c->valuedouble : 0.0;
}

static char *print_line(cJSON *o) {
    char *line = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return line;
}

char *nv_batch_result_line(const nv_batch_req *r, int status, const char *body, const char *why, int *ok, double usage[2]) {
    cJSON *o = cJSON_CreateObject(), *ans = status > 0 ? cJSON_Parse(body) : NULL;
    if (r->anthropic) { /* Message Batches: {"custom_id", "result": {"type": "succeeded", "message"} or errored} */
        *ok = status >= 200 && status < 300 && ans;
        cJSON_AddStringToObject(o, "custom_id", r->custom_id);
        cJSON *res = cJSON_AddObjectToObject(o, "result");
        cJSON_AddStringToObject(res, "type", *ok ? "succeeded" : "errored");
        if (*ok) {
            usage_of(ans, usage);
            cJSON_AddItemToObject(res, "message", ans);
        } else { /* the server's Anthropic-shaped error's own object, or one saying what happened */
            cJSON *err = cJSON_DetachItemFromObjectCaseSensitive(ans, "error");
            if (!cJSON_IsObject(err)) {
                cJSON_Delete(err);
                err = cJSON_CreateObject();
                cJSON_AddStringToObject(err, "type", "api_error");
                cJSON_AddStringToObject(err, "message", status > 0 ? "the server's answer was not JSON" : why);
            }
            cJSON_AddItemToObject(res, "error", err);
            cJSON_Delete(ans);
        }
        return print_line(o);
    }
    char id[64], rid[64];
    nv_api_new_id(id, sizeof id, "batch_req_");
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "custom_id", r->custom_id);
    *ok = status >= 200 && status < 300;
    if (status > 0) {
        const cJSON *aid = cJSON_GetObjectItemCaseSensitive(ans, "id");
        if (cJSON_IsString(aid)) snprintf(rid, sizeof rid, "%.63s", aid->valuestring);
        else nv_api_new_id(rid, sizeof rid, "req_");
        if (*ok) usage_of(ans, usage);
        cJSON *resp = cJSON_AddObjectToObject(o, "response");
        cJSON_AddNumberToObject(resp, "status_code", status);
        cJSON_AddStringToObject(resp, "request_id", rid);
        if (ans) cJSON_AddItemToObject(resp, "body", ans);
        else cJSON_AddStringToObject(resp, "body", body); /* not JSON: kept as text */
        cJSON_AddNullToObject(o, "error");
    } else {
        cJSON_AddNullToObject(o, "response");
        cJSON *e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "code", "request_failed");
        cJSON_AddStringToObject(e, "message", why);
    }
    return print_line(o);
}

void nv_batch_runner_init(nv_batch_runner *r, const char *api_key) {
    snprintf(r->auth, sizeof r->auth, "Authorization: Bearer %.120s\r\n", api_key);
    pthread_mutex_init(&r->mu, NULL);
    r->next_take = 0;
    atomic_store(&r->stop, 0);
    for (int w = 0; w < NV_BATCH_MAX_WORKERS; w++) r->fds[w] = -1;
}

void nv_batch_runner_free(nv_batch_runner *r) {
    pthread_mutex_destroy(&r->mu);
    explicit_bzero(r->auth, sizeof r->auth);
}

/* Sends request q and waits for its whole answer; a 429 (the server's queue full) is sent again.
 * Returns its output line (*status the answer's, 0 when none came), or NULL when abandoned (a
 * second stop) or out of memory. */
static char *run_one(nv_batch_runner *b, int w, const nv_batch_req *q, int *status, int *ok, double usage[2]) {
    for (int attempt = 0;; attempt++) {
        size_t len;
        char *req = nv_http_request_text("POST", q->url, b->auth, q->body, &len);
        if (!req) return NULL;
        const int fd = nv_loopback_connect(b->port, b->timeout_s > 0 ? (int)b->timeout_s + 60 : 0); /* 0: wait as long as it takes */
        pthread_mutex_lock(&b->mu);
        const int abandoned = atomic_load(&b->stop) >= 2;
        if (!abandoned) b->fds[w] = fd;
        pthread_mutex_unlock(&b->mu);
        nv_http_answer a = {0};
        int got = 0;
        if (fd >= 0 && !abandoned && nv_send_all(fd, req, len)) {
            char *raw;
            size_t n;
            got = nv_recv_all(fd, &raw, &n) && nv_http_answer_parse(raw, n, &a);
            free(raw);
        }
        free(req);
        pthread_mutex_lock(&b->mu);
        b->fds[w] = -1;
        pthread_mutex_unlock(&b->mu);
        if (fd >= 0) close(fd);
        if (atomic_load(&b->stop) >= 2 || abandoned) {
            nv_http_answer_free(&a);
            return NULL;
        }
        /* the queue full, or no answer (a connection refused or cut): wait a little and send it again
           (no answer, a few times) */
        if (!atomic_load(&b->stop) && ((got && a.status == 429) || (!got && attempt < 3))) {
            nv_http_answer_free(&a);
            struct timespec ts = {0, (attempt < 20 ? 10 + attempt * 10 : 200) * 1000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        *status = got ? a.status : 0;
        char *line = nv_batch_result_line(q, *status, got ? a.body : "", got ? "" : "no answer came from the server", ok, usage);
        nv_http_answer_free(&a);
        return line;
    }
}

typedef struct {
    nv_batch_runner *b;
    int w;
} worker_arg;

static void *worker_main(void *arg) {
    nv_batch_runner *b = ((worker_arg *)arg)->b;
    const int w = ((worker_arg *)arg)->w;
    for (;;) {
        pthread_mutex_lock(&b->mu);
        if (atomic_load(&b->stop) || b->next_take >= b->n_todo) {
            pthread_mutex_unlock(&b->mu);
            break;
        }
        const int k = b->next_take++;
        pthread_mutex_unlock(&b->mu);
        int status = 0, ok = 0;
        double usage[2] = {0, 0};
        char *line = run_one(b, w, &b->set->reqs[b->todo[k]], &status, &ok, usage);
        if (!line) continue; /* abandoned (the loop ends) or out of memory (the request stays unanswered) */
        pthread_mutex_lock(&b->mu);
        b->on_result(b->ctx, k, line, status, ok, usage);
        pthread_mutex_unlock(&b->mu);
    }
    return NULL;
}

int nv_batch_run(nv_batch_runner *b) {
    int workers = b->workers;
    if (workers > b->n_todo) workers = b->n_todo;
    if (workers > NV_BATCH_MAX_WORKERS) workers = NV_BATCH_MAX_WORKERS;
    if (workers < 1) workers = 1;
    pthread_t *th = malloc((size_t)workers * sizeof *th);
    worker_arg *args = malloc((size_t)workers * sizeof *args);
    int started = 0;
    for (int w = 0; th && args && w < workers; w++) {
        args[w] = (worker_arg){b, w};
        if (pthread_create(&th[w], NULL, worker_main, &args[w]) != 0) break;
        started++;
    }
    for (int w = 0; w < started; w++) pthread_join(th[w], NULL);
    free(th);
    free(args);
    return started ? 0 : -1;
}

void nv_batch_run_stop(nv_batch_runner *b, int level) {
    if (atomic_load(&b->stop) < level) atomic_store(&b->stop, level);
    if (level < 2) return;
    pthread_mutex_lock(&b->mu);
    for (int w = 0; w < NV_BATCH_MAX_WORKERS; w++) /* the server sees each connection go and ends its request */
        if (b->fds[w] >= 0) shutdown(b->fds[w], SHUT_RDWR);
    pthread_mutex_unlock(&b->mu);
}
