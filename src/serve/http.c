#include "serve/http.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/timer.h"
#include "serve/anthropic.h"
#include "serve/llamacpp.h"
#include "serve/ollama.h"
#include "serve/rerank.h"
#include "serve/responses.h"
#include "serve/webui.h"

struct nv_http {
    struct MHD_Daemon *d;
    nv_http_opts o;
    nv_sched *s;
    nv_metrics *m;
    nv_api_ctx ctx;
    long created;
    int port;
    atomic_int stopping;
    atomic_int active; /* requests received whose response has not completed */
    nv_resp_store *responses; /* stored Responses (NULL: --responses-store 0) */
    nv_conv_store *convs;     /* Conversations (NULL: --responses-store 0) */
    pthread_mutex_t bg_mu;    /* the background responses running, or ended and kept (their events) */
    pthread_cond_t bg_cv;     /* a background response logged an event */
    struct bg_resp *bg;
    atomic_int starting;      /* 1 inside MHD_start_daemon: */
    char start_error[256];    /* its last message then (why a TLS key was refused) */
};

enum { P_OPENAI = 0, P_ANTHROPIC, P_RESPONSES, P_LLAMACPP, P_OLLAMA }; /* the API a stream speaks */

typedef enum {
    R_NONE = 0, R_HEALTH, R_METRICS, R_MODELS, R_MODEL, R_COMPLETIONS, R_CHAT, R_TOKENIZE, R_DETOKENIZE, R_EMBEDDINGS,
    R_MESSAGES, R_COUNT_TOKENS, /* Anthropic's API: its error shape */
    R_RESPONSES, R_LORA_LOAD, R_LORA_UNLOAD, R_RESPONSE, R_RESPONSE_ITEMS,
    R_LCPP_COMPLETION, R_INFILL, R_PROPS, R_APPLY_TEMPLATE, /* llama.cpp's native API */
    R_WEBUI, /* GET /: the chat page */
    R_OLLA_CHAT, R_OLLA_GENERATE, R_OLLA_TAGS, R_OLLA_PS, R_OLLA_SHOW, R_OLLA_EMBED, R_OLLA_EMBEDDINGS,
    R_OLLA_VERSION, /* Ollama's API: its error shape */
    R_FILES, R_FILE, R_FILE_CONTENT, R_BATCHES, R_BATCH, R_BATCH_CANCEL, /* OpenAI's Files and Batch APIs (--files-dir) */
    R_MSG_BATCHES, R_MSG_BATCH, R_MSG_BATCH_CANCEL, R_MSG_BATCH_RESULTS, /* Anthropic's Message Batches (--files-dir) */
    R_FT_JOBS, R_FT_JOB, R_FT_JOB_ACTION, R_FT_JOB_EVENTS, R_FT_JOB_CHECKPOINTS, /* OpenAI's fine-tuning jobs (--files-dir) */
    R_UPLOADS, R_UPLOAD_PARTS, R_UPLOAD_ACTION, /* OpenAI's Uploads (--files-dir): a file in parts */
    R_RESPONSE_CANCEL, /* a background response's cancel */
    R_CONVS, R_CONV, R_CONV_ITEMS, R_CONV_ITEM, /* OpenAI's Conversations API */
    R_RESPONSE_TOKENS, /* POST /v1/responses/input_tokens */
    R_RERANK, R_RERANK_V2, R_SCORE, /* /rerank and /v1/rerank (Jina's, vLLM's), /v2/rerank (Cohere's), /score and /v1/score (vLLM's) */
    R_LORA_ADAPTERS, /* llama.cpp's GET and POST /lora-adapters */
    R_LCPP_EMBEDDING, /* llama.cpp's native POST /embedding */
    R_SLOTS /* llama.cpp's GET /slots */
} route_id;

typedef struct {
    nv_http *h;
    route_id route;
    const char *method;
    nv_buf body;
    int too_big;
    int responded;
    double t0;
    /* POST /v1/files, /v1/uploads/ID/parts: the multipart body streamed into the store */
    struct MHD_PostProcessor *pp;
    nv_file_upload *up;
    char filename[256], purpose[64];
    int purpose_len, files_seen;
    char exp_anchor[32], exp_seconds[32]; /* OpenAI's expires_after[anchor], [seconds] */
    uint64_t file_bytes; /* of the file part so far */
    nv_multipart_end end; /* what follows the body's close delimiter is not fed to the processor */
    nv_api_error up_err; /* the first thing wrong with the upload (status 0: nothing) */
} conn_ctx;

/* An answer split as it comes: its reasoning (--reasoning-format deepseek), its content, and the
 * tool calls it completes (a request with tools). */
typedef struct {
    int reasoning, tools;
    nv_think think;
    nv_tool_parser tp;
} answer_split;

/* The API a generation answers in and what its answer needs from the request (P_OPENAI: nothing):
 * the meta of proto's parser, the others zero. */
typedef struct {
    int proto;
    nv_anth_meta anth;
    nv_resp_meta resp;
    nv_lcpp_meta lcpp;
    nv_olla_meta olla;
} api_meta;

static void api_meta_free(api_meta *m) {
    nv_anth_meta_free(&m->anth);
    nv_resp_meta_free(&m->resp);
    nv_lcpp_meta_free(&m->lcpp);
    nv_olla_meta_free(&m->olla);
}

typedef struct {
    nv_http *h;
    nv_req *r[NV_MAX_CHOICES]; /* one sequence per choice */
    int n, per;                /* choices, choices per prompt */
    int ended[NV_MAX_CHOICES];       /* the choice's finish chunk is out */
    long text_offset[NV_MAX_CHOICES]; /* completions logprobs: bytes of text sent per choice */
    char *echo[NV_MAX_CHOICES];       /* echo with logprobs: the prompt, sent with its records */
    answer_split split[NV_MAX_CHOICES]; /* each choice's reasoning, content and calls */
    nv_api_tools *tools;                /* chat with tools: the names split[] reads calls of */
    int n_calls[NV_MAX_CHOICES];
    api_meta pm;                        /* P_OPENAI, or another API's stream (one choice) and its meta */
    nv_anth_stream anth;
    int anth_started;                   /* message_start is out */
    nv_resp_stream resp;
    int prompt_tokens, completion_tokens, cached_tokens;
    nv_api_meta meta;
    int fd;
    int include_usage;
    int finished; /* the last event is in out */
    nv_buf out;   /* SSE bytes not yet handed to libmicrohttpd */
    size_t off;
} stream_ctx;

/* ---- helpers ------------------------------------------------------------------------------- */

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* 1 when the peer has closed (or reset) its end of the socket. */
static int conn_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)) return 1;
    if (p.revents & POLLIN) {
        char b;
        return recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
    }
    return 0;
}

/* Equality of given[0, gl) and key whose time depends only on the key's length, not on where the
   strings differ. */
static int key_equal(const char *given, size_t gl, const char *key) {
    size_t kl = strlen(key);
    volatile unsigned char d = (unsigned char)(gl != kl);
    for (size_t i = 0; i < kl; i++) d |= (unsigned char)(key[i] ^ (i < gl ? given[i] : 0));
    return d == 0;
}

/* 1 when given (white space around it is not part of a header's value) is one of the keys, each
   compared whole whichever matches. */
static int key_known(const nv_http *h, const char *given) {
    while (*given == ' ' || *given == '\t') given++;
    size_t gl = strlen(given);
    while (gl && (given[gl - 1] == ' ' || given[gl - 1] == '\t')) gl--;
    int found = 0;
    for (int i = 0; i < h->o.n_api_keys; i++) found |= key_equal(given, gl, h->o.api_keys[i]);
    return found;
}

static int auth_ok(nv_http *h, struct MHD_Connection *c) {
    if (h->o.n_api_keys <= 0) return 1;
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key"); /* Anthropic's clients send it so */
    if (x && key_known(h, x)) return 1;
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!v || strncasecmp(v, "Bearer ", 7) != 0) return 0;
    return key_known(h, v + 7);
}

static void add_common_headers(nv_http *h, struct MHD_Response *resp, const char *ctype) {
    if (ctype) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (h->o.cors) MHD_add_response_header(resp, MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_ORIGIN, "*");
}

static void access_log(const nv_http *h, conn_ctx *cc, int status, const char *what) {
    static const char *const names[] = {"?", "/health", "/metrics", "/v1/models", "/v1/models/{id}", "/v1/completions",
                                        "/v1/chat/completions", "/tokenize", "/detokenize", "/v1/embeddings",
                                        "/v1/messages", "/v1/messages/count_tokens", "/v1/responses",
                                        "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/v1/responses/{id}",
                                        "/v1/responses/{id}/input_items", "/completion", "/infill", "/props", "/apply-template", "/",
                                        "/api/chat", "/api/generate", "/api/tags", "/api/ps", "/api/show", "/api/embed",
                                        "/api/embeddings", "/api/version", "/v1/files", "/v1/files/{id}",
                                        "/v1/files/{id}/content", "/v1/batches", "/v1/batches/{id}", "/v1/batches/{id}/cancel",
                                        "/v1/messages/batches", "/v1/messages/batches/{id}", "/v1/messages/batches/{id}/cancel",
                                        "/v1/messages/batches/{id}/results", "/v1/fine_tuning/jobs", "/v1/fine_tuning/jobs/{id}",
                                        "/v1/fine_tuning/jobs/{id}/{action}", "/v1/fine_tuning/jobs/{id}/events",
                                        "/v1/fine_tuning/jobs/{id}/checkpoints", "/v1/uploads", "/v1/uploads/{id}/parts",
                                        "/v1/uploads/{id}/{action}", "/v1/responses/{id}/cancel", "/v1/conversations",
                                        "/v1/conversations/{id}", "/v1/conversations/{id}/items",
                                        "/v1/conversations/{id}/items/{item}", "/v1/responses/input_tokens", "/v1/rerank",
                                        "/v2/rerank", "/v1/score", "/lora-adapters", "/embedding", "/slots"};
    _Static_assert(sizeof names / sizeof *names == R_SLOTS + 1, "a route without its name");
    nv_log(h->o.quiet_access ? NV_LOG_DEBUG : NV_LOG_INFO, "serve: %s %s %d %.3fs%s%s", cc->method, names[cc->route], status, nv_now() - cc->t0, what ? " " : "",
            what ? what : "");
}

static int anthropic_route(route_id r) { return r == R_MESSAGES || r == R_COUNT_TOKENS || (r >= R_MSG_BATCHES && r <= R_MSG_BATCH_RESULTS); }
static int ollama_route(route_id r) { return r >= R_OLLA_CHAT && r <= R_OLLA_VERSION; }

/* Anthropic's SDKs send anthropic-version with every request: /v1/models answers them in their shape. */
static int anthropic_client(struct MHD_Connection *c) {
    return MHD_lookup_connection_value(c, MHD_HEADER_KIND, "anthropic-version") != NULL;
}

/* Queues a built response (taken) with status, counted in the metrics. */
static enum MHD_Result queue_counted(nv_http *h, struct MHD_Connection *c, conn_ctx *cc, int status, struct MHD_Response *resp) {
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    cc->responded = 1;
    nv_metrics_status(h->m, status);
    return ret;
}

/* Queues body (malloc'd, taken) with status. */
static enum MHD_Result respond(nv_http *h, struct MHD_Connection *c, conn_ctx *cc, int status, const char *ctype,
                               char *body, const char *hname, const char *hval) {
    if (!body) {
        body = strdup(anthropic_route(cc->route)
                          ? "{\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"out of memory\"}}"
                          : "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}");
        status = 500;
        ctype = "application/json";
        if (!body) return MHD_NO;
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    add_common_headers(h, resp, ctype);
    if (hname) MHD_add_response_header(resp, hname, hval);
    enum MHD_Result ret = queue_counted(h, c, cc, status, resp);
    if (status >= 400 || cc->route >= R_COMPLETIONS) access_log(h, cc, status, NULL);
    return ret;
}

/* The chat page: public as llama-server's (it holds nothing; its requests carry the key the user
   gives it), and kept from loading or sending anything but itself and its calls to this server. */
static enum MHD_Result respond_page(nv_http *h, struct MHD_Connection *c, conn_ctx *cc) {
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(nv_webui_page), (void *)nv_webui_page, MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    add_common_headers(h, resp, "text/html; charset=utf-8");
    MHD_add_response_header(resp, "Content-Security-Policy",
                            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
                            "base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
    return queue_counted(h, c, cc, 200, resp);
}

/* An error body in the shape of the API the route belongs to, or the client speaks. */
static char *error_json(struct MHD_Connection *c, const conn_ctx *cc, const nv_api_error *e) {
    if (ollama_route(cc->route)) return nv_olla_error_json(e);
    return anthropic_route(cc->route) || anthropic_client(c) ? nv_anth_error_json(e) : nv_api_error_json(e);
}

static enum MHD_Result respond_error(nv_http *h, struct MHD_Connection *c, conn_ctx *cc, const nv_api_error *e) {
    const char *hname = NULL, *hval = NULL;
    if (e->status == 429) hname = MHD_HTTP_HEADER_RETRY_AFTER, hval = "1";
    else if (e->status == 401) hname = MHD_HTTP_HEADER_WWW_AUTHENTICATE, hval = "Bearer";
    else if (e->status == 503) hname = MHD_HTTP_HEADER_RETRY_AFTER, hval = "5";
    return respond(h, c, cc, e->status, "application/json", error_json(c, cc, e), hname, hval);
}

static enum MHD_Result fail(nv_http *h, struct MHD_Connection *c, conn_ctx *cc, int status, const char *type,
                            const char *code, const char *msg) {
    nv_api_error e;
    nv_api_error_set(&e, status, type, code, NULL, "%s", msg);
    return respond_error(h, c, cc, &e);
}

/* ---- routing ------------------------------------------------------------------------------- */

static route_id route_of(const char *url) {
    if (!strcmp(url, "/")) return R_WEBUI;
    if (!strcmp(url, "/health")) return R_HEALTH;
    if (!strcmp(url, "/metrics")) return R_METRICS;
    if (!strcmp(url, "/props")) return R_PROPS;
    if (!strcmp(url, "/apply-template")) return R_APPLY_TEMPLATE;
    if (!strcmp(url, "/lora-adapters")) return R_LORA_ADAPTERS;
    if (!strcmp(url, "/embedding")) return R_LCPP_EMBEDDING;
    if (!strcmp(url, "/slots")) return R_SLOTS;
    if (!strcmp(url, "/v2/rerank")) return R_RERANK_V2;
    if (!strncmp(url, "/v1/", 4)) url += 3;
    if (!strcmp(url, "/rerank")) return R_RERANK;
    if (!strcmp(url, "/score")) return R_SCORE;
    if (!strcmp(url, "/models")) return R_MODELS;
    if (!strncmp(url, "/models/", 8) && url[8]) return R_MODEL;
    if (!strcmp(url, "/completions")) return R_COMPLETIONS;
    if (!strcmp(url, "/chat/completions")) return R_CHAT;
    if (!strcmp(url, "/tokenize")) return R_TOKENIZE;
    if (!strcmp(url, "/detokenize")) return R_DETOKENIZE;
    if (!strcmp(url, "/embeddings")) return R_EMBEDDINGS;
    if (!strcmp(url, "/messages")) return R_MESSAGES;
    if (!strcmp(url, "/messages/count_tokens")) return R_COUNT_TOKENS;
    if (!strcmp(url, "/responses")) return R_RESPONSES;
    if (!strcmp(url, "/responses/input_tokens")) return R_RESPONSE_TOKENS; /* (not a response's id: those are resp_...) */
    if (!strncmp(url, "/responses/", 11) && url[11]) { /* a response's id, then nothing or /input_items */
        const char *slash = strchr(url + 11, '/');
        if (!slash) return R_RESPONSE;
        if (slash > url + 11 && !strcmp(slash, "/cancel")) return R_RESPONSE_CANCEL;
        return slash > url + 11 && !strcmp(slash, "/input_items") ? R_RESPONSE_ITEMS : R_NONE;
    }
    if (!strcmp(url, "/conversations")) return R_CONVS;
    if (!strncmp(url, "/conversations/", 15) && url[15] && url[15] != '/') { /* {id}, {id}/items, {id}/items/{item} */
        const char *slash = strchr(url + 15, '/');
        if (!slash) return R_CONV;
        if (strncmp(slash, "/items", 6)) return R_NONE;
        if (!slash[6]) return R_CONV_ITEMS;
        return slash[6] == '/' && slash[7] && !strchr(slash + 7, '/') ? R_CONV_ITEM : R_NONE;
    }
    if (!strcmp(url, "/load_lora_adapter")) return R_LORA_LOAD;
    if (!strcmp(url, "/unload_lora_adapter")) return R_LORA_UNLOAD;
    if (!strcmp(url, "/completion")) return R_LCPP_COMPLETION;
    if (!strcmp(url, "/infill")) return R_INFILL;
    if (!strcmp(url, "/api/chat")) return R_OLLA_CHAT;
    if (!strcmp(url, "/api/generate")) return R_OLLA_GENERATE;
    if (!strcmp(url, "/api/tags")) return R_OLLA_TAGS;
    if (!strcmp(url, "/api/ps")) return R_OLLA_PS;
    if (!strcmp(url, "/api/show")) return R_OLLA_SHOW;
    if (!strcmp(url, "/api/embed")) return R_OLLA_EMBED;
    if (!strcmp(url, "/api/embeddings")) return R_OLLA_EMBEDDINGS;
    if (!strcmp(url, "/api/version")) return R_OLLA_VERSION;
    if (!strcmp(url, "/messages/batches")) return R_MSG_BATCHES;
    if (!strncmp(url, "/messages/batches/", 18) && url[18] && url[18] != '/') {
        const char *slash = strchr(url + 18, '/');
        if (!slash) return R_MSG_BATCH;
        return !strcmp(slash, "/cancel") ? R_MSG_BATCH_CANCEL : !strcmp(slash, "/results") ? R_MSG_BATCH_RESULTS : R_NONE;
    }
    if (!strcmp(url, "/fine_tuning/jobs")) return R_FT_JOBS;
    if (!strncmp(url, "/fine_tuning/jobs/", 18) && url[18] && url[18] != '/') {
        const char *slash = strchr(url + 18, '/');
        if (!slash) return R_FT_JOB;
        if (!strcmp(slash, "/events")) return R_FT_JOB_EVENTS;
        if (!strcmp(slash, "/checkpoints")) return R_FT_JOB_CHECKPOINTS;
        return !strcmp(slash, "/cancel") || !strcmp(slash, "/pause") || !strcmp(slash, "/resume") ? R_FT_JOB_ACTION : R_NONE;
    }
    if (!strcmp(url, "/uploads")) return R_UPLOADS;
    if (!strncmp(url, "/uploads/", 9) && url[9] && url[9] != '/') {
        const char *slash = strchr(url + 9, '/');
        if (slash && !strcmp(slash, "/parts")) return R_UPLOAD_PARTS;
        return slash && (!strcmp(slash, "/complete") || !strcmp(slash, "/cancel")) ? R_UPLOAD_ACTION : R_NONE;
    }
    if (!strcmp(url, "/files")) return R_FILES;
    if (!strcmp(url, "/batches")) return R_BATCHES;
    for (int k = 0; k < 2; k++) { /* /files/{id}[/content], /batches/{id}[/cancel] */
        static const char *const base[2] = {"/files/", "/batches/"}, *const tail[2] = {"/content", "/cancel"};
        const size_t bl = strlen(base[k]);
        if (strncmp(url, base[k], bl) != 0 || !url[bl] || url[bl] == '/') continue;
        const char *slash = strchr(url + bl, '/');
        if (!slash) return k ? R_BATCH : R_FILE;
        return !strcmp(slash, tail[k]) ? (k ? R_BATCH_CANCEL : R_FILE_CONTENT) : R_NONE;
    }
    return R_NONE;
}

static int route_is_post(route_id r);

/* The methods a route answers, as an Allow header lists them. */
static const char *route_methods(route_id r) {
    switch (r) {
    case R_RESPONSE:
    case R_FILE:
    case R_MSG_BATCH:
    case R_MODEL:
    case R_CONV_ITEM:
        return "GET, DELETE";
    case R_CONV:
        return "GET, POST, DELETE";
    case R_CONV_ITEMS:
    case R_FILES:
    case R_BATCHES:
    case R_MSG_BATCHES:
    case R_FT_JOBS:
    case R_LORA_ADAPTERS:
        return "GET, POST";
    case R_BATCH_CANCEL:
    case R_MSG_BATCH_CANCEL:
    case R_FT_JOB_ACTION:
    case R_UPLOADS:
    case R_UPLOAD_PARTS:
    case R_UPLOAD_ACTION:
    case R_RESPONSE_CANCEL:
    case R_CONVS:
        return "POST";
    default:
        return route_is_post(r) ? "POST" : "GET";
    }
}

static int method_allowed(route_id r, const char *method) {
    const char *list = route_methods(r);
    const size_t n = strlen(method);
    for (const char *p = list; (p = strstr(p, method)); p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == ',' || !p[n])) return 1;
    return 0;
}

static int route_is_post(route_id r) {
    return r == R_COMPLETIONS || r == R_CHAT || r == R_TOKENIZE || r == R_DETOKENIZE || r == R_EMBEDDINGS || r == R_MESSAGES ||
           r == R_COUNT_TOKENS || r == R_RESPONSES || r == R_LORA_LOAD || r == R_LORA_UNLOAD || r == R_LCPP_COMPLETION ||
           r == R_INFILL || r == R_APPLY_TEMPLATE || r == R_OLLA_CHAT || r == R_OLLA_GENERATE || r == R_OLLA_SHOW ||
           r == R_OLLA_EMBED || r == R_OLLA_EMBEDDINGS || r == R_RESPONSE_TOKENS || r == R_RERANK || r == R_RERANK_V2 ||
           r == R_SCORE || r == R_LCPP_EMBEDDING;
}

/* ---- streams ------------------------------------------------------------------------------- */

/* (reasoning: the request's own, nv_api_request.reasoning, 0 or the block's tags; think_open: its
   prompt opened the block) */
static answer_split split_init(int reasoning, int think_open, const nv_api_tools *t) {
    answer_split a = {.reasoning = reasoning, .tools = t != NULL, .think.tags = reasoning};
    if (think_open) a.think.state = NV_THINK_IN;
    if (t) a.tp = (nv_tool_parser){.style = t->style, .names = (const char *const *)t->names, .n_names = t->n, .tools = t->tools};
    return a;
}

/* The next n bytes of the answer (final: it is whole): the reasoning to why, the content to said,
 * the calls completed to *calls (*n_calls of them). -1 when out of memory. */
static int split_feed(answer_split *a, const char *s, size_t n, int final, nv_buf *why, nv_buf *said, nv_tool_call **calls,
                      int *n_calls) {
    nv_buf content = {0};
    if (a->reasoning) { /* the reasoning first, then the content */
        nv_think_feed(&a->think, s, n, final, why, &content);
        s = content.data ? content.data : "";
        n = content.len;
    }
    int rc = 0;
    if (a->tools) rc = nv_tool_parser_feed(&a->tp, s, n, final, said, calls, n_calls);
    else if (n) nv_buf_append(said, s, n);
    rc |= -(content.oom || why->oom || said->oom);
    nv_buf_free(&content);
    return rc < 0 ? -1 : 0;
}

static void split_free(answer_split *a) {
    nv_think_free(&a->think);
    nv_tool_parser_free(&a->tp);
}

static void sse_event(stream_ctx *st, char *json) {
    if (!json) {
        st->out.oom = 1;
        return;
    }
    const int line = st->pm.proto == P_OLLAMA; /* Ollama's streams are JSON lines */
    if (!line) nv_buf_puts(&st->out, "data: ");
    nv_buf_puts(&st->out, json);
    nv_buf_puts(&st->out, line ? "\n" : "\n\n");
    free(json);
}

/* The error of a request that did not end with stop or length. */
static void finish_error(nv_http *h, nv_finish f, nv_api_error *e) {
    if (f == NV_FINISH_TIMEOUT)
        nv_api_error_set(e, 408, "timeout_error", "timeout", NULL, "The request ran past the server's timeout of %g s",
                         h->o.timeout_s);
    else if (f == NV_FINISH_SHUTDOWN)
        nv_api_error_set(e, 503, "server_error", "service_unavailable", NULL, "The server is shutting down");
    else
        nv_api_error_set(e, 500, "server_error", NULL, NULL, "Generation failed (%s)", nv_finish_name(f));
}

static void stream_cancel_all(stream_ctx *st) {
    for (int i = 0; i < st->n; i++)
        if (!st->ended[i]) nv_req_cancel(st->h->s, st->r[i]);
}

/* One choice's news as OpenAI chunks with its index: reasoning, content (with its log-probabilities),
 * then the calls it completed. */
static void openai_news(stream_ctx *st, int i, const nv_buf *why, const nv_buf *said, const nv_lp_list *lps,
                        const nv_tool_call *calls, int n_new) {
    st->meta.index = i;
    if (why->len) sse_event(st, nv_api_reasoning_chunk(&st->meta, why->data, st->include_usage));
    if (said->len || lps->n) {
        st->meta.lps = lps->v;
        st->meta.n_lps = lps->n;
        st->meta.text_offset = st->text_offset[i];
        sse_event(st, nv_api_chunk(&st->meta, said->data ? said->data : "", 0, NULL, st->include_usage));
        st->text_offset[i] = nv_api_text_advance(&st->meta);
        st->meta.lps = NULL;
        st->meta.n_lps = 0;
    }
    for (int k = 0; k < n_new; k++)
        sse_event(st, nv_api_tool_call_chunk(&st->meta, &calls[k], st->n_calls[i]++, st->include_usage));
}

/* The same as Anthropic's events (thinking and text blocks, tool_use blocks) or the Responses API's
 * (reasoning and message items, function_call items): one choice. */
static void item_news(stream_ctx *st, const nv_buf *why, const nv_buf *said, const nv_tool_call *calls, int n_new) {
    const int anth = st->pm.proto == P_ANTHROPIC;
    if (why->len) anth ? nv_anth_stream_text(&st->anth, 1, why->data, &st->out) : nv_resp_stream_text(&st->resp, 1, why->data, &st->out);
    if (said->len) anth ? nv_anth_stream_text(&st->anth, 0, said->data, &st->out) : nv_resp_stream_text(&st->resp, 0, said->data, &st->out);
    for (int k = 0; k < n_new; k++) anth ? nv_anth_stream_call(&st->anth, &calls[k], &st->out) : nv_resp_stream_call(&st->resp, &calls[k], &st->out);
    st->n_calls[0] += n_new;
}

/* Polls every unfinished choice once (waiting on the first when none had news), turning its new
 * text into a chunk with that choice's index; a choice that ended gets its finish chunk, and when
 * all have, the usage chunk and [DONE] (Anthropic's stream: message_delta and message_stop). A
 * choice that failed ends the whole stream with an error event. */
static void stream_poll(stream_ctx *st) {
    int news = 0, waited = 0;
    for (int pass = 0; pass < 2 && !news && !st->finished; pass++)
        for (int i = 0; i < st->n && !st->finished; i++) {
            if (st->ended[i]) continue;
            nv_buf text = {0};
            nv_lp_list lps = {0};
            nv_req_status rs;
            double wait = pass == 1 && !waited ? 0.1 : 0.0;
            waited |= wait > 0;
            nv_req_poll(st->h->s, st->r[i], wait, &text, st->meta.lp_on ? &lps : NULL, &rs);
            if (st->echo[i] && lps.n) { /* the prompt's records are in: its text goes first */
                nv_buf both = {0};
                nv_buf_puts(&both, st->echo[i]);
                if (text.len) nv_buf_append(&both, text.data, text.len);
                nv_buf_free(&text);
                text = both;
                free(st->echo[i]);
                st->echo[i] = NULL;
            }
            if (lps.oom || text.oom) st->out.oom = 1;
            nv_buf why = {0}, said = {0};
            nv_tool_call *calls = NULL; /* the calls this text completed, sent after its content */
            int n_new = 0;
            if ((text.len || rs.done) &&
                split_feed(&st->split[i], text.data ? text.data : "", text.len, rs.done, &why, &said, &calls, &n_new) < 0)
                st->out.oom = 1;
            if (st->pm.proto == P_ANTHROPIC && !st->anth_started && (text.len || rs.done) &&
                (rs.finish == NV_FINISH_NONE || rs.finish == NV_FINISH_STOP || rs.finish == NV_FINISH_LENGTH)) {
                nv_anth_stream_start(&st->anth, &st->pm.anth, rs.prompt_tokens, rs.cached_tokens, &st->out);
                st->anth_started = 1;
            }
            if (st->pm.proto == P_OLLAMA) {
                if (st->pm.olla.prompt && said.len) nv_buf_append(&st->pm.olla.streamed, said.data, said.len);
                if (why.len || said.len || n_new)
                    sse_event(st, nv_olla_chunk(&st->pm.olla, why.data, said.data, calls, n_new));
                st->n_calls[0] += n_new;
            } else if (st->pm.proto == P_LLAMACPP) {
                if (said.len || (st->pm.lcpp.n_probs && lps.n))
                    sse_event(st, nv_lcpp_chunk(&st->pm.lcpp, said.data ? said.data : "", rs.completion_tokens, rs.prompt_tokens,
                                                lps.v, lps.n, st->h->ctx.tok));
            } else if (st->pm.proto != P_OPENAI) {
                item_news(st, &why, &said, calls, n_new);
            } else {
                openai_news(st, i, &why, &said, &lps, calls, n_new);
            }
            news |= why.len || said.len || lps.n || n_new;
            nv_tool_calls_free(calls, n_new);
            free(lps.v);
            nv_buf_free(&text), nv_buf_free(&why), nv_buf_free(&said);
            if (!rs.done) continue;
            news = 1;
            st->ended[i] = 1;
            if (rs.finish != NV_FINISH_STOP && rs.finish != NV_FINISH_LENGTH) {
                nv_api_error e;
                finish_error(st->h, rs.finish, &e);
                if (st->pm.proto == P_ANTHROPIC) nv_anth_stream_error(&e, &st->out);
                else if (st->pm.proto == P_RESPONSES) nv_resp_stream_fail(&st->resp, "failed", &e, &st->out, NULL);
                else sse_event(st, st->pm.proto == P_OLLAMA ? nv_olla_error_json(&e) : nv_api_error_json(&e));
                stream_cancel_all(st);
                if (st->pm.proto == P_OPENAI) nv_buf_puts(&st->out, "data: [DONE]\n\n");
                st->finished = 1;
                break;
            }
            if (i % st->per == 0) st->prompt_tokens += rs.prompt_tokens; /* each prompt once */
            if (i == 0) st->cached_tokens = rs.cached_tokens;
            st->completion_tokens += rs.completion_tokens;
            st->meta.pred_accepted += rs.accepted_prediction_tokens;
            st->meta.pred_rejected += rs.rejected_prediction_tokens;
            if (st->pm.proto == P_ANTHROPIC) {
                nv_anth_answer a = {.prompt_tokens = st->prompt_tokens, .cached_tokens = st->cached_tokens,
                                    .output_tokens = st->completion_tokens};
                a.stop_reason = nv_anth_stop_reason(st->anth.m, rs.finish, rs.stop_index, st->n_calls[0], &a.stop_sequence);
                nv_anth_stream_end(&st->anth, &a, &st->out);
            } else if (st->pm.proto == P_RESPONSES) {
                nv_resp_answer a = {.incomplete = rs.finish == NV_FINISH_LENGTH, .prompt_tokens = st->prompt_tokens,
                                    .cached_tokens = st->cached_tokens, .output_tokens = st->completion_tokens};
                nv_resp_stream_end(&st->resp, &a, &st->out, NULL);
            } else if (st->pm.proto == P_LLAMACPP) { /* the whole response, its content already sent */
                nv_lcpp_answer a = {"", rs.finish, rs.stop_index, rs.prompt_tokens, rs.completion_tokens, rs.cached_tokens,
                                    rs.prompt_s, rs.gen_s, NULL, 0, NULL}; /* the records went with their text */
                sse_event(st, nv_lcpp_response(&st->pm.lcpp, &a));
            } else if (st->pm.proto == P_OLLAMA) { /* the last line: counts and times, the text already sent */
                nv_olla_answer a = {.content = "", .finish = rs.finish, .prompt_tokens = rs.prompt_tokens,
                                    .completion_tokens = rs.completion_tokens, .prompt_s = rs.prompt_s, .gen_s = rs.gen_s,
                                    .whole = st->pm.olla.streamed.data};
                if (st->pm.olla.streamed.oom) st->out.oom = 1;
                sse_event(st, nv_olla_done(&st->pm.olla, &a));
            }
            if (st->pm.proto != P_OPENAI) {
                st->finished = 1;
                return;
            }
            const char *fin = rs.finish == NV_FINISH_STOP && st->n_calls[i] ? "tool_calls" : nv_api_finish_reason(rs.finish);
            st->meta.index = i;
            st->meta.status = &rs;
            sse_event(st, nv_api_chunk(&st->meta, "", 0, fin, st->include_usage));
            st->meta.status = NULL;
        }
    if (st->finished) return;
    int all = 1;
    for (int i = 0; i < st->n; i++) all &= st->ended[i];
    if (!all) return;
    if (st->include_usage)
        sse_event(st, nv_api_usage_chunk(&st->meta, st->prompt_tokens, st->completion_tokens, st->cached_tokens));
    nv_buf_puts(&st->out, "data: [DONE]\n\n");
    st->finished = 1;
}

/* Copies what out holds past *off (at most max) to buf: the count, 0 when nothing is left (out
   is then emptied). */
static size_t out_drain(nv_buf *out, size_t *off, char *buf, size_t max) {
    size_t n = out->len - *off < max ? out->len - *off : max;
    memcpy(buf, out->data + *off, n);
    *off += n;
    if (*off == out->len) out->len = *off = 0;
    return n;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream_ctx *st = cls;
    for (;;) {
        if (st->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (st->out.len > st->off) return (ssize_t)out_drain(&st->out, &st->off, buf, max);
        if (st->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        stream_poll(st);
        if (!st->finished && st->out.len == 0 && conn_gone(st->fd)) {
            stream_cancel_all(st);
            for (int i = 0; i < st->n; i++) st->ended[i] = 1;
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void stream_free(void *cls) {
    stream_ctx *st = cls;
    for (int i = 0; i < st->n; i++) {
        if (!st->finished && !st->ended[i]) nv_req_cancel(st->h->s, st->r[i]); /* the client went away */
        nv_req_release(st->h->s, st->r[i]);
    }
    for (int i = 0; i < st->n; i++) free(st->echo[i]), split_free(&st->split[i]);
    nv_api_tools_free(st->tools);
    nv_resp_stream_free(&st->resp);
    api_meta_free(&st->pm);
    nv_buf_free(&st->out);
    free(st);
}

/* ---- completions --------------------------------------------------------------------------- */

static void release_all(nv_http *h, nv_req **r, int n, int cancel) {
    for (int i = 0; i < n; i++) {
        if (cancel) nv_req_cancel(h->s, r[i]);
        nv_req_release(h->s, r[i]);
    }
}

/* Submits r[0..n) all or nothing: on a refusal the ones queued are cancelled and every reference
 * is dropped. */
static nv_submit submit_all(nv_http *h, nv_req **r, int n) {
    for (int i = 0; i < n; i++) {
        nv_submit sub = atomic_load(&h->stopping) ? NV_SUBMIT_STOPPING : nv_sched_submit(h->s, r[i], h->o.background);
        if (sub == NV_SUBMIT_OK) continue;
        release_all(h, r, i, 1);
        for (int j = i; j < n; j++) nv_req_release(NULL, r[j]);
        return sub;
    }
    return NV_SUBMIT_OK;
}

static enum MHD_Result submit_failed(nv_http *h, struct MHD_Connection *c, conn_ctx *cc, nv_submit sub) {
    if (sub == NV_SUBMIT_QUEUE_FULL)
        return fail(h, c, cc, 429, "rate_limit_exceeded", "rate_limit_exceeded",
                    "The server is at capacity: every sequence slot and queue place is taken. Retry shortly.");
    if (sub == NV_SUBMIT_TOO_BIG)
        return fail(h, c, cc, 400, "invalid_request_error", "context_length_exceeded",
                    "The request needs more KV cache blocks than the whole pool holds (raise --kv-memory)");
    if (sub == NV_SUBMIT_NO_ADAPTER)
        return fail(h, c, cc, 404, "invalid_request_error", "model_not_found",
                    "A LoRA adapter this request uses was removed meanwhile (see /v1/models and /lora-adapters)");
    return fail(h, c, cc, 503, "server_error", "service_unavailable", "The server is shutting down");
}

/* A request that could not be made: out of memory (500) or parameters the scheduler refuses (400). */
static enum MHD_Result create_failed(nv_http *h, struct MHD_Connection *c, conn_ctx *cc, nv_err ce) {
    nv_api_error err;
    if (ce == NV_ENOMEM) nv_api_error_set(&err, 500, "server_error", NULL, NULL, "%s", nv_errmsg());
    else nv_api_error_set(&err, 400, "invalid_request_error", NULL, NULL, "%s", nv_errmsg());
    return respond_error(h, c, cc, &err);
}

/* Waits for r to end, collecting its text (and log-probabilities) as it comes; 0 when the client
 * closed the connection first (the caller cancels). */
static int wait_done(nv_http *h, nv_req *r, int fd, nv_buf *text, nv_lp_list *lps, nv_req_status *st) {
    for (;;) {
        nv_req_poll(h->s, r, 0.1, text, lps, st);
        if (st->done) return 1;
        if (conn_gone(fd)) return 0;
    }
}

/* An ended request that did not run to its end, as the error it answers with. */
static enum MHD_Result finish_failed(nv_http *h, struct MHD_Connection *c, conn_ctx *cc, nv_finish f) {
    nv_api_error e;
    finish_error(h, f, &e);
    return respond_error(h, c, cc, &e);
}

/* Runs a parsed request and answers it whole or as a stream in pm's API (both taken). */
static enum MHD_Result generate(nv_http *h, struct MHD_Connection *c, conn_ctx *cc, nv_api_request ar, api_meta pm) {
    const int proto = pm.proto;
    const int chat = ar.chat;
    ar.req.timeout_s = h->o.timeout_s;
    /* n choices per prompt: n sequences from each, seeds apart so sampled choices differ; choice
     * k is prompt k / per of the list, choice k % per of it */
    const int per = ar.n > 1 ? ar.n : 1, n = per * (ar.n_more + 1);
    nv_req *r[NV_MAX_CHOICES] = {0};
    const char *echo[NV_MAX_CHOICES];
    int made = 0;
    for (; made < n; made++) {
        nv_req_params p = ar.req;
        const int q = made / per;
        if (q > 0) {
            p.prompt = ar.more[q - 1].ids;
            p.n_prompt = ar.more[q - 1].n;
        }
        echo[made] = q > 0 ? ar.more[q - 1].echo_text : ar.echo_text;
        p.seed = ar.req.seed + (uint64_t)(made % per) * 0x9E3779B97F4A7C15ull;
        nv_err ce = nv_req_create(&r[made], &p);
        if (ce == NV_OK) continue;
        for (int i = 0; i < made; i++) nv_req_release(NULL, r[i]);
        nv_api_request_free(&ar);
        api_meta_free(&pm);
        return create_failed(h, c, cc, ce);
    }
    nv_submit sub = submit_all(h, r, n);
    if (sub != NV_SUBMIT_OK) {
        nv_api_request_free(&ar);
        api_meta_free(&pm);
        return submit_failed(h, c, cc, sub);
    }
    nv_api_meta meta;
    nv_api_meta_init(&meta, chat, ar.model);
    meta.lp_on = ar.req.logprobs;
    meta.lp_ids = ar.lp_ids;
    meta.lp_special = ar.req.keep_special;
    meta.lp_tok = h->ctx.tok;
    meta.pred = ar.req.n_prediction > 0;
    int fd = conn_fd(c);

    if (ar.stream) {
        stream_ctx *st = calloc(1, sizeof *st);
        if (!st) {
            release_all(h, r, n, 1);
            nv_api_request_free(&ar);
            api_meta_free(&pm);
            return fail(h, c, cc, 500, "server_error", NULL, "out of memory");
        }
        st->h = h;
        memcpy(st->r, r, sizeof r);
        st->n = n;
        st->meta = meta;
        st->fd = fd;
        st->include_usage = ar.include_usage;
        st->per = per;
        st->tools = ar.tools; /* the stream reads calls after the request is gone */
        ar.tools = NULL;
        for (int i = 0; i < n; i++) st->split[i] = split_init(chat ? ar.reasoning : 0, ar.req.think_open, st->tools);
        st->pm = pm; /* Anthropic's message_start once the prompt is in (stream_poll): its usage is then whole */
        if (proto == P_RESPONSES) nv_resp_stream_start(&st->resp, &st->pm.resp, &st->out);
        for (int i = 0; i < n && st->pm.proto == P_OPENAI; i++) {
            st->meta.index = i;
            if (chat) sse_event(st, nv_api_chunk(&st->meta, "", 1, NULL, st->include_usage));
            else if (ar.echo && echo[i] && *echo[i] && meta.lp_on) {
                if (!(st->echo[i] = strdup(echo[i]))) st->out.oom = 1; /* sent when its records are */
            } else if (ar.echo && echo[i] && *echo[i])
                sse_event(st, nv_api_chunk(&st->meta, echo[i], 0, NULL, st->include_usage));
        }
        nv_api_request_free(&ar);
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, st, stream_free);
        if (!resp) {
            stream_free(st);
            return MHD_NO;
        }
        add_common_headers(h, resp, st->pm.proto == P_OLLAMA ? "application/x-ndjson" : "text/event-stream");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        enum MHD_Result ret = queue_counted(h, c, cc, 200, resp);
        access_log(h, cc, 200, "stream");
        return ret;
    }

    nv_buf text[NV_MAX_CHOICES] = {0};
    nv_lp_list lps[NV_MAX_CHOICES] = {0};
    nv_req_status rs[NV_MAX_CHOICES];
    int oom = 0;
    /* vLLM's prompt_logprobs: the prompt's records come first, ahead of the answer's (with echo and
       logprobs, both lists start with them) */
    const int prompt_lp = ar.prompt_lp, prompt_top = ar.req.prompt_top, echo_lps = ar.echo && ar.req.logprobs;
    for (int i = 0; i < n; i++)
        if (ar.echo && echo[i]) nv_buf_puts(&text[i], echo[i]);
    for (int i = 0; i < n; i++) { /* in turn: a choice's wait lets the others run too */
        if (!wait_done(h, r[i], fd, &text[i], meta.lp_on || prompt_lp ? &lps[i] : NULL, &rs[i])) {
            release_all(h, r, n, 1);
            for (int j = 0; j < n; j++) free(lps[j].v), nv_buf_free(&text[j]);
            nv_api_request_free(&ar);
            api_meta_free(&pm);
            access_log(h, cc, 499, "client closed the connection");
            return MHD_NO;
        }
        oom |= text[i].oom || lps[i].oom;
    }
    release_all(h, r, n, 0);
    nv_api_tools *tools = ar.tools; /* read the answers for calls after the request is gone */
    const int reasoning = chat ? ar.reasoning : 0, think_open = ar.req.think_open; /* and their think blocks */
    ar.tools = NULL;
    nv_api_request_free(&ar);
    enum MHD_Result ret;
    int failed = -1, completion = 0, prompt = 0;
    for (int i = 0; i < n; i++) {
        completion += rs[i].completion_tokens;
        meta.pred_accepted += rs[i].accepted_prediction_tokens;
        meta.pred_rejected += rs[i].rejected_prediction_tokens;
        if (i % per == 0) prompt += rs[i].prompt_tokens; /* each prompt once */
        if (failed < 0 && rs[i].finish != NV_FINISH_STOP && rs[i].finish != NV_FINISH_LENGTH) failed = i;
    }
    if (oom) {
        ret = fail(h, c, cc, 500, "server_error", NULL, "out of memory");
    } else if (failed < 0) {
        nv_api_choice ch[NV_MAX_CHOICES];
        nv_buf why[NV_MAX_CHOICES] = {0}, said[NV_MAX_CHOICES] = {0};
        nv_tool_call *calls[NV_MAX_CHOICES] = {0};
        int n_calls[NV_MAX_CHOICES] = {0};
        for (int i = 0; i < n; i++) { /* the reasoning and the calls out of the content */
            answer_split sp = split_init(reasoning, think_open, tools);
            oom |= split_feed(&sp, text[i].data ? text[i].data : "", text[i].len, 1, &why[i], &said[i], &calls[i], &n_calls[i]) < 0;
            split_free(&sp);
            const int n_plps = prompt_lp && rs[i].prompt_records && lps[i].n >= rs[i].prompt_tokens ? rs[i].prompt_tokens : 0,
                      skip = echo_lps ? 0 : n_plps;
            ch[i] = (nv_api_choice){.text = said[i].data ? said[i].data : "", .finish = nv_api_finish_reason(rs[i].finish),
                                    .lps = lps[i].v ? lps[i].v + skip : NULL, .n_lps = lps[i].n - skip, .reasoning = why[i].data /* NULL: none, the field is left out */,
                                    .calls = calls[i], .n_calls = n_calls[i], .status = &rs[i],
                                    .plps = n_plps ? lps[i].v : NULL, .n_plps = n_plps, .plp_top = prompt_top};
            if (n_calls[i] && rs[i].finish == NV_FINISH_STOP) ch[i].finish = "tool_calls";
        }
        char *body = NULL;
        if (!oom && proto == P_ANTHROPIC) {
            nv_anth_answer a = {.reasoning = ch[0].reasoning, .text = ch[0].text, .calls = calls[0], .n_calls = n_calls[0],
                                .prompt_tokens = prompt, .cached_tokens = rs[0].cached_tokens, .output_tokens = completion};
            a.stop_reason = nv_anth_stop_reason(&pm.anth, rs[0].finish, rs[0].stop_index, n_calls[0], &a.stop_sequence);
            body = nv_anth_message(&pm.anth, &a);
        } else if (!oom && proto == P_RESPONSES) {
            nv_resp_answer a = {.reasoning = ch[0].reasoning, .text = ch[0].text, .calls = calls[0], .n_calls = n_calls[0],
                                .incomplete = rs[0].finish == NV_FINISH_LENGTH, .prompt_tokens = prompt,
                                .cached_tokens = rs[0].cached_tokens, .output_tokens = completion};
            body = nv_resp_response(&pm.resp, &a, NULL);
        } else if (!oom && proto == P_OLLAMA) {
            nv_olla_answer a = {ch[0].reasoning, ch[0].text, calls[0], n_calls[0], rs[0].finish, prompt, completion,
                                rs[0].prompt_s, rs[0].gen_s, ch[0].text};
            body = nv_olla_done(&pm.olla, &a);
        } else if (!oom && proto == P_LLAMACPP) {
            nv_lcpp_answer a = {pm.lcpp.prompt_only ? "" : ch[0].text, rs[0].finish, rs[0].stop_index, prompt, completion,
                                rs[0].cached_tokens, rs[0].prompt_s, rs[0].gen_s, ch[0].lps, ch[0].n_lps, h->ctx.tok};
            body = nv_lcpp_response(&pm.lcpp, &a);
        } else if (!oom) {
            body = nv_api_response_choices(&meta, ch, n, prompt, completion, rs[0].cached_tokens);
        }
        for (int i = 0; i < n; i++) nv_buf_free(&why[i]), nv_buf_free(&said[i]), nv_tool_calls_free(calls[i], n_calls[i]);
        ret = respond(h, c, cc, 200, "application/json", body, NULL, NULL);
    } else {
        ret = finish_failed(h, c, cc, rs[failed].finish);
    }
    for (int i = 0; i < n; i++) free(lps[i].v), nv_buf_free(&text[i]);
    nv_api_tools_free(tools);
    api_meta_free(&pm);
    return ret;
}

static enum MHD_Result completions(nv_http *h, struct MHD_Connection *c, conn_ctx *cc) {
    nv_api_request ar;
    nv_api_error err;
    if (nv_api_parse(&h->ctx, cc->route == R_CHAT, cc->body.data, cc->body.len, &ar, &err)) return respond_error(h, c, cc, &err);
    return generate(h, c, cc, ar, (api_meta){.proto = P_OPENAI});
}

/* llama.cpp's native /completion and /infill, run as the completions request they translate to. */
static enum MHD_Result native(nv_http *h, struct MHD_Connection *c, conn_ctx *cc) {
    nv_api_request ar;
    nv_api_error err;
    api_meta pm = {.proto = P_LLAMACPP};
    if (nv_lcpp_parse(&h->ctx, cc->body.data, cc->body.len, cc->route == R_INFILL, &ar, &pm.lcpp, &err)) return respond_error(h, c, cc, &err);
    return generate(h, c, cc, ar, pm);
}

/* Ollama's /api/chat and /api/generate, run as the chat (or, raw, completions) request they translate to. */
static enum MHD_Result ollama(nv_http *h, struct MHD_Connection *c, conn_ctx *cc) {
    nv_api_request ar;
    nv_api_error err;
    api_meta pm = {.proto = P_OLLAMA};
    if (nv_olla_parse(&h->ctx, cc->body.data, cc->body.len, cc->route == R_OLLA_CHAT, &ar, &pm.olla, &err)) return respond_error(h, c, cc, &err);
    if (pm.olla.load_only) return respond(h, c, cc, 200, "application/json", nv_olla_loaded(&pm.olla), NULL, NULL);
    return generate(h, c, cc, ar, pm);
}

/* ---- background responses (background: true) ---------------------------------------------------- */

#define BG_MAX 256        /* background responses running at once (a thread each) */
#define BG_ENDED_MAX 1024 /* ended ones whose events are kept for GET ?stream=true */
#define BG_KEEP_S 3600.0  /* how long after its end */

/* A background response: its request runs while a thread of its own waits for it, keeps what it
   answers in the store as it goes (queued, in_progress, then completed, incomplete, failed or
   cancelled: GET /v1/responses/{id} reads it there) and logs its stream's events, which any number
   of streams follow (POST with stream: true, GET .../{id}?stream=true&starting_after=N) without
   owning the request: a client that goes away stops nothing. The record, with its log, stays after
   its end for BG_KEEP_S, while the logs of those ended fit in --responses-store and at most
   BG_ENDED_MAX have ended, and while a stream reads it; DELETE drops it. Under bg_mu: everything
   but thread; meta.keep is NULL once deleted (nothing more is kept). Ended (r released), its
   thread needs bg_mu no more. */
typedef struct bg_resp {
    nv_http *h;
    char id[48];
    nv_req *r;              /* NULL once released */
    nv_resp_meta meta;      /* (freed at its end) */
    nv_api_tools *tools;    /* the answer is read for calls */
    int reasoning, think_open; /* its answer's think block is read out (and began in the prompt) */
    nv_resp_stream stream;  /* its events, made as a streamed response's are */
    nv_buf log;             /* every event so far */
    size_t *starts;         /* where event (sequence_number) k begins in log */
    int n_events, cap_events;
    int ended;              /* its last event is in the log (and its end in the store) */
    double ended_at;
    int readers;            /* streams following its log */
    int cancelled, deleted; /* POST .../cancel; DELETE */
    int joined;             /* its thread (which ends once r is released) has been joined */
    pthread_t thread;
    struct bg_resp *next;   /* (newest first) */
} bg_resp;

/* Appends ev's events (whole ones) to b's log, noting where each begins, and wakes its readers
   (under bg_mu); end: the last is among them. */
static void bg_log(bg_resp *b, nv_buf *ev, int end) {
    const size_t at = b->log.len;
    if (ev->oom) b->log.oom = 1;
    else if (ev->len) nv_buf_append(&b->log, ev->data, ev->len);
    for (size_t pos = at; !b->log.oom && pos < b->log.len;) {
        if (b->n_events == b->cap_events) {
            const int cap = b->cap_events ? 2 * b->cap_events : 64;
            size_t *s = realloc(b->starts, (size_t)cap * sizeof *s);
            if (!s) {
                b->log.oom = 1;
                break;
            }
            b->starts = s, b->cap_events = cap;
        }
        b->starts[b->n_events++] = pos;
        const char *e = memmem(b->log.data + pos, b->log.len - pos, "\n\n", 2); /* (event JSON has no raw newline) */
        pos = e ? (size_t)(e - b->log.data) + 2 : b->log.len;
    }
    if (end || b->log.oom) b->ended = 1, b->ended_at = nv_now();
    nv_buf_free(ev);
    pthread_cond_broadcast(&b->h->bg_cv);
}

/* The terminal events of b's stream (under bg_mu), its response kept as it ended. An end too large
   to keep (past a quarter of --responses-store with its answer) is kept without its output: failed,
   saying so, when it finished (its stream has the whole answer), else as it ended; never left
   queued or in progress. */
static void bg_end(bg_resp *b, const nv_req_status *st, int oom, nv_buf *ev) {
    nv_api_error e;
    const nv_api_error *why = &e;
    const char *status = "failed";
    int kept = 0;
    if (oom) {
        nv_api_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        nv_resp_stream_fail(&b->stream, status, &e, ev, &kept);
    } else if (st->finish == NV_FINISH_STOP || st->finish == NV_FINISH_LENGTH) { /* (a cancel too late to stop it) */
        const nv_resp_answer a = {.incomplete = st->finish == NV_FINISH_LENGTH, .prompt_tokens = st->prompt_tokens,
                                  .cached_tokens = st->cached_tokens, .output_tokens = st->completion_tokens};
        nv_resp_stream_end(&b->stream, &a, ev, &kept);
        nv_api_error_set(&e, 500, "server_error", "response_too_large", NULL,
                         "The response is too large to keep: it passes a quarter of the server's --responses-store");
    } else if (b->cancelled) {
        status = "cancelled", why = NULL;
        nv_resp_stream_fail(&b->stream, status, NULL, ev, &kept);
    } else {
        finish_error(b->h, st->finish, &e);
        nv_resp_stream_fail(&b->stream, status, &e, ev, &kept);
    }
    if (!kept && b->meta.keep) free(nv_resp_unfinished(&b->meta, status, why, NULL));
}

static void *bg_main(void *arg) {
    bg_resp *b = arg;
    nv_http *h = b->h;
    answer_split sp = split_init(b->reasoning, b->think_open, b->tools);
    nv_req_status st;
    int started = 0, ended = 0;
    do {
        nv_buf text = {0}, why = {0}, said = {0}, ev = {0};
        nv_tool_call *calls = NULL;
        int n_new = 0;
        nv_req_poll(h->s, b->r, 0.1, &text, NULL, &st);
        const int lost = text.oom || ((text.len || st.done) &&
                                      split_feed(&sp, text.data ? text.data : "", text.len, st.done, &why, &said, &calls, &n_new) < 0);
        pthread_mutex_lock(&h->bg_mu);
        const int oom = lost || b->log.oom; /* (a log that could not grow ends it too) */
        if (!ended) {
            if (!started && !oom && (st.prompt_s > 0 || text.len || st.finish == NV_FINISH_STOP || st.finish == NV_FINISH_LENGTH)) {
                started = 1; /* its first token: in progress */
                nv_resp_stream_running(&b->stream, &ev);
                if (!st.done && !b->cancelled) free(nv_resp_unfinished(&b->meta, "in_progress", NULL, NULL));
            }
            if (!oom && why.len) nv_resp_stream_text(&b->stream, 1, why.data, &ev);
            if (!oom && said.len) nv_resp_stream_text(&b->stream, 0, said.data, &ev);
            for (int k = 0; k < n_new && !oom; k++) nv_resp_stream_call(&b->stream, &calls[k], &ev);
            if ((ended = oom || st.done)) bg_end(b, &st, oom, &ev);
            if (oom && !st.done) nv_req_cancel(h->s, b->r); /* (polled on to its end) */
            bg_log(b, &ev, ended);
        }
        if (st.done) {
            nv_req_release(h->s, b->r);
            b->r = NULL;
            nv_resp_stream_free(&b->stream);
            nv_resp_meta_free(&b->meta); /* (its log is what stays) */
        }
        pthread_mutex_unlock(&h->bg_mu);
        nv_buf_free(&text), nv_buf_free(&why), nv_buf_free(&said), nv_buf_free(&ev), nv_tool_calls_free(calls, n_new);
    } while (!st.done);
    split_free(&sp);
    nv_api_tools_free(b->tools); /* (read by split only; bg_drop joins before it frees) */
    b->tools = NULL;
    return NULL;
}

/* Whether b has ended and released its request (under bg_mu): its thread is then at its end. */
static int bg_over(const bg_resp *b) { return b->ended && !b->r; }

static void bg_free(bg_resp *b) {
    nv_resp_meta_free(&b->meta);
    nv_api_tools_free(b->tools);
    nv_buf_free(&b->log);
    free(b->starts);
    free(b);
}

/* Joins (unless done) and frees *p (under bg_mu, let go for the join: a thread still running takes it to end). */
static void bg_drop(nv_http *h, bg_resp **p) {
    bg_resp *b = *p;
    *p = b->next;
    if (b->r) nv_req_cancel(h->s, b->r);
    pthread_mutex_unlock(&h->bg_mu);
    if (!b->joined) pthread_join(b->thread, NULL);
    bg_free(b);
    pthread_mutex_lock(&h->bg_mu);
}

/* Drops, under bg_mu, the ended records no stream reads that were deleted or ended BG_KEEP_S ago,
   then the oldest such while the ended ones' logs pass --responses-store or they are more than
   BG_ENDED_MAX; with all, every one: those running cancelled first and waited for (the server
   stops: its scheduler has ended their requests already, and no stream is left). */
static void bg_reap(nv_http *h, int all) {
    const double now = nv_now();
    for (bg_resp *b = h->bg; b; b = b->next) /* threads over joined: a record kept holds no thread */
        if (bg_over(b) && !b->joined) pthread_join(b->thread, NULL), b->joined = 1;
    for (;;) {
        bg_resp **victim = NULL, **oldest = NULL;
        size_t bytes = 0;
        int ended = 0;
        for (bg_resp **p = &h->bg; *p && !victim; p = &(*p)->next) {
            const bg_resp *b = *p;
            if (all) victim = p;
            if (!bg_over(b) || b->readers) continue;
            if (b->deleted || now - b->ended_at > BG_KEEP_S) victim = p;
            bytes += b->log.len, ended++;
            oldest = p;
        }
        if (!victim && (bytes > h->o.responses_store || ended > BG_ENDED_MAX)) victim = oldest;
        if (!victim) return;
        bg_drop(h, victim);
    }
}

/* The background response id (under bg_mu): running only, or any whose record is kept and not
   deleted; NULL when none. */
static bg_resp *bg_find(nv_http *h, const char *id, int running) {
    for (bg_resp *b = h->bg; b; b = b->next)
        if (!b->deleted && !(running && b->ended) && !strcmp(b->id, id)) return b;
    return NULL;
}

/* A stream following a background response's log from event `next`. */
typedef struct {
    nv_http *h;
    bg_resp *b;
    int next;
    int fd;
    int finished;
    nv_buf out;
    size_t off;
} bg_reader;

static ssize_t bg_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    bg_reader *rd = cls;
    bg_resp *b = rd->b;
    for (;;) {
        if (rd->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (rd->out.len > rd->off) return (ssize_t)out_drain(&rd->out, &rd->off, buf, max);
        if (rd->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        pthread_mutex_lock(&rd->h->bg_mu);
        if (rd->next >= b->n_events && !b->ended) {
            struct timespec until;
            clock_gettime(CLOCK_MONOTONIC, &until); /* (bg_cv waits on it) */
            until.tv_nsec += 100000000;
            if (until.tv_nsec >= 1000000000) until.tv_sec++, until.tv_nsec -= 1000000000;
            pthread_cond_timedwait(&rd->h->bg_cv, &rd->h->bg_mu, &until);
        }
        const int broken = b->log.oom;
        if (!broken && rd->next < b->n_events) {
            nv_buf_append(&rd->out, b->log.data + b->starts[rd->next], b->log.len - b->starts[rd->next]);
            rd->next = b->n_events;
        }
        if (b->ended && rd->next >= b->n_events) rd->finished = 1;
        pthread_mutex_unlock(&rd->h->bg_mu);
        if (broken) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (!rd->finished && rd->out.len == 0 && conn_gone(rd->fd)) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static void bg_read_free(void *cls) {
    bg_reader *rd = cls;
    pthread_mutex_lock(&rd->h->bg_mu);
    rd->b->readers--;
    bg_reap(rd->h, 0); /* (the last reader of one deleted or past its time) */
    pthread_mutex_unlock(&rd->h->bg_mu);
    nv_buf_free(&rd->out);
    free(rd);
}

/* Answers with b's events past sequence number after (-1: all of them), as they come; b's
   readers count holds it already (given back here on any failure, when the response is cancelled
   too if this stream was its creator's: no one would know its id). */
static enum MHD_Result bg_follow(nv_http *h, struct MHD_Connection *c, conn_ctx *cc, bg_resp *b, long after, int creator) {
    bg_reader *rd = calloc(1, sizeof *rd);
    struct MHD_Response *resp = NULL;
    if (rd) {
        *rd = (bg_reader){.h = h, .b = b, .next = (int)(after + 1), .fd = conn_fd(c)};
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, bg_read, rd, bg_read_free);
    }
    if (!resp) {
        pthread_mutex_lock(&h->bg_mu);
        if (creator && b->r) b->cancelled = 1, nv_req_cancel(h->s, b->r);
        if (!rd) b->readers--;
        pthread_mutex_unlock(&h->bg_mu);
        if (rd) bg_read_free(rd);
        return fail(h, c, cc, 500, "server_error", NULL, "out of memory");
    }
    add_common_headers(h, resp, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ret = queue_counted(h, c, cc, 200, resp);
    access_log(h, cc, 200, "stream");
    return ret;
}

/* POST /v1/responses with background: true: the request submitted, a thread to wait for it, and the
   response answered at once, queued (and kept so), or with stream: true its events as they come. */
static enum MHD_Result background_response(nv_http *h, struct MHD_Connection *c, conn_ctx *cc, nv_api_request ar, api_meta pm) {
    ar.req.timeout_s = h->o.timeout_s;
    const int stream = ar.stream;
    nv_req *r = NULL;
    const nv_err ce = nv_req_create(&r, &ar.req);
    bg_resp *b = ce == NV_OK ? calloc(1, sizeof *b) : NULL;
    if (!b) {
        nv_req_release(NULL, r);
        nv_api_request_free(&ar);
        api_meta_free(&pm);
        return ce != NV_OK ? create_failed(h, c, cc, ce) : fail(h, c, cc, 500, "server_error", NULL, "out of memory");
    }
    b->h = h, b->r = r, b->meta = pm.resp, b->tools = ar.tools;
    b->reasoning = ar.reasoning, b->think_open = ar.req.think_open;
    snprintf(b->id, sizeof b->id, "%s", b->meta.id);
    pm.resp = (nv_resp_meta){0}, ar.tools = NULL;
    nv_api_request_free(&ar);
    api_meta_free(&pm);
    pthread_mutex_lock(&h->bg_mu);
    bg_reap(h, 0);
    int running = 0;
    for (const bg_resp *q = h->bg; q; q = q->next) running += !q->ended;
    const int full = running >= BG_MAX;
    nv_submit sub = full ? NV_SUBMIT_QUEUE_FULL : submit_all(h, &b->r, 1);
    if (full) nv_req_release(NULL, b->r);
    char *queued = NULL;
    int kept = 0;
    bg_resp *started = NULL;
    if (sub == NV_SUBMIT_OK) {
        queued = nv_resp_unfinished(&b->meta, "queued", NULL, &kept); /* (too large a conversation is not kept) */
        nv_buf ev = {0};
        nv_resp_stream_start(&b->stream, &b->meta, &ev);
        bg_log(b, &ev, 0);
        if (kept && !b->log.oom && pthread_create(&b->thread, NULL, bg_main, b) == 0) {
            b->next = h->bg, h->bg = b;
            b->readers = stream; /* (before bg_mu is let go: a reaper leaves it alone) */
            started = b, b = NULL;
        } else {
            release_all(h, &b->r, 1, 1);
            nv_resp_stream_free(&b->stream);
            nv_resp_store_delete(h->responses, b->meta.id);
            free(queued);
            queued = NULL;
        }
    }
    pthread_mutex_unlock(&h->bg_mu);
    if (b) {
        const int oom = b->log.oom;
        bg_free(b);
        if (full)
            return fail(h, c, cc, 429, "rate_limit_exceeded", "rate_limit_exceeded",
                        "The server runs 256 background responses already: retry when one has ended");
        if (sub != NV_SUBMIT_OK) return submit_failed(h, c, cc, sub);
        if (!kept)
            return fail(h, c, cc, 400, "invalid_request_error", "invalid_request",
                        "A background response is kept to be read later, and this conversation passes a quarter of the "
                        "server's --responses-store");
        return fail(h, c, cc, 500, "server_error", NULL, oom ? "out of memory" : "cannot start a thread");
    }
    if (stream) {
        free(queued);
        return bg_follow(h, c, cc, started, -1, 1);
    }
    return respond(h, c, cc, 200, "application/json", queued, NULL, NULL);
}

/* GET /v1/responses/{id}?stream=true[&starting_after=N]: a background response's events (those
   after sequence number N), from its log, then as they come until it ends. */
static enum MHD_Result background_stream(nv_http *h, struct MHD_Connection *c, conn_ctx *cc, const char *id) {
    const char *after_text = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "starting_after");
    long after = -1;
    if (after_text) {
        char *end = NULL;
        errno = 0;
        after = strtol(after_text, &end, 10);
        if (!*after_text || *end || errno || after < 0 || after > INT_MAX - 1)
            return fail(h, c, cc, 400, "invalid_request_error", "invalid_value",
                        "'starting_after' must be an event's sequence_number: an integer >= 0");
    }
    pthread_mutex_lock(&h->bg_mu);
    bg_reap(h, 0);
    bg_resp *b = bg_find(h, id, 0);
    if (b) b->readers++;
    pthread_mutex_unlock(&h->bg_mu);
    if (b) return bg_follow(h, c, cc, b, after, 0);
    char *out = NULL;
    nv_api_error err;
    if (nv_resp_get(h->responses, id, &out, &err)) return respond_error(h, c, cc, &err); /* (404) */
    free(out);
    nv_api_error_set(&err, 400, "invalid_request_error", "invalid_request", "stream",
                     "This response's events are not kept: only a background response's are, for an hour after it ends");
    return respond_error(h, c, cc, &err);
}

/* POST /v1/responses/{id}/cancel: a background response still running ends cancelled (its request
   cancelled; answered once its thread has kept it); one that has ended is answered as it ended. */
static enum MHD_Result background_cancel(nv_http *h, struct MHD_Connection *c, conn_ctx *cc, const char *id) {
    pthread_mutex_lock(&h->bg_mu);
    bg_resp *b = bg_find(h, id, 1);
    if (b) {
        b->cancelled = 1;
        if (b->r) nv_req_cancel(h->s, b->r);
    }
    pthread_mutex_unlock(&h->bg_mu);
    for (double t0 = nv_now(); b && nv_now() - t0 < 10;) { /* (its thread ends within a poll of the cancel) */
        pthread_mutex_lock(&h->bg_mu);
        const int running = bg_find(h, id, 1) != NULL;
        pthread_mutex_unlock(&h->bg_mu);
        if (!running) break;
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&h->bg_mu);
    bg_reap(h, 0);
    pthread_mutex_unlock(&h->bg_mu);
    char *out = NULL;
    nv_api_error err;
    if (nv_resp_get(h->responses, id, &out, &err)) return respond_error(h, c, cc, &err);
    cJSON *o = cJSON_Parse(out);
    const int background = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "background"));
    cJSON_Delete(o);
    if (!background) {
        free(out);
        return fail(h, c, cc, 400, "invalid_request_error", "invalid_request",
                    "Only a response created with 'background': true can be cancelled");
    }
    return respond(h, c, cc, 200, "application/json", out, NULL, NULL);
}

/* OpenAI's /v1/responses, run as the chat request it translates to. */
static enum MHD_Result responses(nv_http *h, struct MHD_Connection *c, conn_ctx *cc) {
    nv_api_request ar;
    nv_api_error err;
    api_meta pm = {.proto = P_RESPONSES};
    if (nv_resp_parse(&h->ctx, h->responses, h->convs, cc->body.data, cc->body.len, &ar, &pm.resp, &err))
        return respond_error(h, c, cc, &err);
    if (pm.resp.background) return background_response(h, c, cc, ar, pm);
    return generate(h, c, cc, ar, pm);
}

/* GET or DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items: from the store. */
static enum MHD_Result stored_response(nv_http *h, struct MHD_Connection *c, conn_ctx *cc, const char *url, int is_delete) {
    char id[128];
    const char *start = strstr(url, "/responses/") + 11, *slash = strchr(start, '/');
    snprintf(id, sizeof id, "%.*s", (int)(slash ? slash - start : (ptrdiff_t)strlen(start)), start);
    char *out = NULL;
    nv_api_error err;
    int rc;
    if (cc->route == R_RESPONSE_ITEMS)
        rc = nv_resp_input_items(h->responses, id, MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit"),
                                 MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "order"),
                                 MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after"), &out, &err);
    else {
        if (is_delete) { /* a background response: cancelled if running, and nothing of it kept after, its log dropped */
            pthread_mutex_lock(&h->bg_mu);
            bg_resp *b = bg_find(h, id, 0);
            if (b) {
                b->cancelled = b->deleted = 1;
                b->meta.keep = NULL;
                if (b->r) nv_req_cancel(h->s, b->r);
            }
            bg_reap(h, 0);
            pthread_mutex_unlock(&h->bg_mu);
        } else {
            const char *stream = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "stream");
            if (stream && strcmp(stream, "false")) {
                if (!strcmp(stream, "true")) return background_stream(h, c, cc, id);
                return fail(h, c, cc, 400, "invalid_request_error", "invalid_value", "'stream' must be true or false");
            }
        }
        rc = (is_delete ? nv_resp_delete : nv_resp_get)(h->responses, id, &out, &err);
    }
    return rc ? respond_error(h, c, cc, &err) : respond(h, c, cc, 200, "application/json", out, NULL, NULL);
}

/* Anthropic's /v1/messages (run as the chat request it translates to) and /v1/messages/count_tokens. */
static enum MHD_Result messages(nv_http *h, struct MHD_Connection *c, conn_ctx *cc) {
    nv_api_request ar;
    nv_api_error err;
    api_meta pm = {.proto = P_ANTHROPIC};
    const int count = cc->route == R_COUNT_TOKENS;
    if (nv_anth_parse(&h->ctx, cc->body.data, cc->body.len, count, &ar, &pm.anth, &err)) return respond_error(h, c, cc, &err);
    if (count) {
        const int n = ar.req.n_prompt;
        nv_api_request_free(&ar);
        nv_anth_meta_free(&pm.anth);
        return respond(h, c, cc, 200, "application/json", nv_anth_count_json(n), NULL, NULL);
    }
    return generate(h, c, cc, ar, pm);
}

/* /v1/load_lora_adapter {"lora_name", "lora_path"} and /v1/unload_lora_adapter {"lora_name"}
 * (vLLM's, answered as it does: a line of text), with --allow-lora-updates only. A load reads the
 * file and builds its plans on this connection's thread; requests go on meanwhile. */
static enum MHD_Result lora_update(nv_http *h, struct MHD_Connection *c, conn_ctx *cc) {
    const int load = cc->route == R_LORA_LOAD;
    if (!h->o.lora_updates || !h->ctx.adapters)
        return fail(h, c, cc, 403, "invalid_request_error", "lora_updates_disabled",
                    "Loading and unloading LoRA adapters at run time is off: start the server with --allow-lora-updates");
    if (atomic_load(&h->stopping)) return fail(h, c, cc, 503, "server_error", "service_unavailable", "The server is shutting down");
    nv_api_error err = {0};
    cJSON *root = nv_api_body_object(cc->body.data, cc->body.len, &err);
    if (!root) return respond_error(h, c, cc, &err);
    const cJSON *name = nv_api_field(root, "lora_name"), *path = nv_api_field(root, "lora_path");
    char msg[700];
    int status = 200;
    if (!cJSON_IsString(name) || !*name->valuestring)
        nv_api_error_set(&err, 400, "invalid_request_error", "missing_required_parameter", "lora_name", "'lora_name' must be a non-empty string"),
            status = 400;
    else if (load && (!cJSON_IsString(path) || !*path->valuestring))
        nv_api_error_set(&err, 400, "invalid_request_error", "missing_required_parameter", "lora_path", "'lora_path' must be a non-empty string"),
            status = 400;
    else if (nv_adapters_check_name(name->valuestring) != NV_OK)
        nv_api_error_set(&err, 400, "invalid_request_error", NULL, "lora_name", "%s", nv_errmsg()), status = 400;
    else if (!strcmp(name->valuestring, h->ctx.model_id))
        nv_api_error_set(&err, 400, "invalid_request_error", NULL, "lora_name", "'%.200s' is the base model's id", name->valuestring),
            status = 400;
    else if (h->o.ftjobs && nv_ftjobs_reserves(h->o.ftjobs, name->valuestring))
        nv_api_error_set(&err, 400, "invalid_request_error", NULL, "lora_name",
                         "'%.200s' is a fine-tuning job's model%s", name->valuestring,
                         load ? "" : ": DELETE /v1/models/{model} removes it"),
            status = 400;
    else if (load && h->o.ftjobs && nv_adapters_live_count(h->ctx.adapters) + nv_ftjobs_pending_models(h->o.ftjobs) >= NV_MAX_ADAPTERS)
        nv_api_error_set(&err, 400, "invalid_request_error", NULL, "lora_name",
                         "The adapters' places left (of %d) are held for the fine-tuning jobs yet to end", NV_MAX_ADAPTERS),
            status = 400;
    else if (load && nv_adapters_find(h->ctx.adapters, name->valuestring, NULL))
        nv_api_error_set(&err, 400, "invalid_request_error", NULL, "lora_name", "The LoRA adapter '%.200s' has already been loaded",
                         name->valuestring),
            status = 400;
    else if (load) {
        const nv_err e = nv_adapters_add(h->ctx.adapters, h->s->model, name->valuestring, path->valuestring, 1.0f);
        if (e != NV_OK)
            nv_api_error_set(&err, e == NV_ENOMEM ? 500 : 400, e == NV_ENOMEM ? "server_error" : "invalid_request_error", NULL,
                             "lora_path", "%s", nv_errmsg()),
                status = err.status;
        else
            snprintf(msg, sizeof msg, "Success: LoRA adapter '%.200s' added successfully.", name->valuestring);
    } else if (nv_adapters_remove(h->ctx.adapters, name->valuestring) != NV_OK) {
        nv_api_error_set(&err, 404, "invalid_request_error", "model_not_found", "lora_name",
                         "The LoRA adapter '%.200s' cannot be found", name->valuestring);
        status = 404;
    } else {
        snprintf(msg, sizeof msg, "Success: LoRA adapter '%.200s' removed successfully.", name->valuestring);
    }
    if (status == 200) nv_info("serve: %s", msg);
    cJSON_Delete(root);
    return status == 200 ? respond(h, c, cc, 200, "text/plain; charset=utf-8", strdup(msg), NULL, NULL) : respond_error(h, c, cc, &err);
}

/* What run_prompts keeps of a finished prompt-only request (i: its place among all of them):
 * 0 when it has nothing (it failed). */
typedef int (*prompt_take)(nv_http *h, nv_req *r, int i, void *arg);

/* run_prompts' waves, base's adapters pinned. */
static int run_waves(nv_http *h, struct MHD_Connection *c, conn_ctx *cc, const nv_req_params *base, int *const *ids,
                     const int *n_ids, int n_all, int lead, prompt_take take, void *arg, long *prompt_tokens, enum MHD_Result *ret) {
    const int fd = conn_fd(c), wave = h->s->o.max_queue < NV_MAX_CHOICES ? h->s->o.max_queue : NV_MAX_CHOICES;
    const double t0 = nv_now();
    *prompt_tokens = 0;
    for (int w0 = 0, n; w0 < n_all; w0 += n) {
        n = lead && w0 == 0 && n_all > 1 ? 1 : n_all - w0 < wave ? n_all - w0 : wave;
        const double left = h->o.timeout_s > 0 ? h->o.timeout_s - (nv_now() - t0) : 0; /* 0: none */
        if (h->o.timeout_s > 0 && left <= 0) {
            *ret = finish_failed(h, c, cc, NV_FINISH_TIMEOUT);
            return 0;
        }
        nv_req *r[NV_MAX_CHOICES] = {0};
        nv_req_status rs[NV_MAX_CHOICES];
        for (int made = 0; made < n; made++) {
            nv_req_params p = *base;
            p.prompt = ids[w0 + made], p.n_prompt = n_ids[w0 + made], p.timeout_s = left;
            nv_err ce = nv_req_create(&r[made], &p);
            if (ce == NV_OK) continue;
            for (int i = 0; i < made; i++) nv_req_release(NULL, r[i]);
            *ret = create_failed(h, c, cc, ce);
            return 0;
        }
        nv_submit sub = submit_all(h, r, n);
        if (sub != NV_SUBMIT_OK) {
            *ret = submit_failed(h, c, cc, sub);
            return 0;
        }
        int failed = -1;
        for (int i = 0; i < n; i++) {
            nv_buf none = {0};
            const int done = wait_done(h, r[i], fd, &none, NULL, &rs[i]);
            nv_buf_free(&none);
            if (!done) {
                release_all(h, r, n, 1);
                access_log(h, cc, 499, "client closed the connection");
                *ret = MHD_NO;
                return 0;
            }
            if (failed < 0 && !take(h, r[i], w0 + i, arg)) failed = i;
            *prompt_tokens += rs[i].prompt_tokens;
        }
        release_all(h, r, n, 0);
        if (failed >= 0) {
            *ret = finish_failed(h, c, cc, rs[failed].finish == NV_FINISH_LENGTH ? NV_FINISH_ERROR : rs[failed].finish);
            return 0;
        }
    }
    return 1;
}

/* Prompt-only requests (base's parameters, each its own prompt) run in waves of up to
 * NV_MAX_CHOICES at once (no more than the queue holds; batched by the scheduler like any others),
 * all within one --timeout; take keeps each one's result. With lead, the first runs alone: prompts
 * that open alike (a rerank's query before each document) then find its blocks in the prefix cache
 * instead of each computing them. 1 and the prompt tokens run, or 0 with the response (an error)
 * sent as *ret. */
static int run_prompts(nv_http *h, struct MHD_Connection *c, conn_ctx *cc, const nv_req_params *base, int *const *ids,
                       const int *n_ids, int n_all, int lead, prompt_take take, void *arg, long *prompt_tokens,
                       enum MHD_Result *ret) {
    /* the waves' requests come and go: base's adapters are held for all of them */
    if (!nv_adapters_pin_mix(h->ctx.adapters, &base->lora)) {
        *ret = submit_failed(h, c, cc, NV_SUBMIT_NO_ADAPTER);
        return 0;
    }
    const int ok = run_waves(h, c, cc, base, ids, n_ids, n_all, lead, take, arg, prompt_tokens, ret);
    nv_adapters_unpin_mix(h->ctx.adapters, &base->lora);
    return ok;
}

static int take_embedding(nv_http *h, nv_req *r, int i, void *vecs) {
    return nv_req_embedding(h->s, r, (float *)vecs + (size_t)i * h->ctx.dim, h->ctx.dim);
}

/* /v1/embeddings, and Ollama's /api/embed and /api/embeddings in their shapes: each input a
 * prompt-only request that keeps its embedding; the answer lists them in input order. */
static enum MHD_Result embeddings(nv_http *h, struct MHD_Connection *c, conn_ctx *cc) {
    nv_api_embed in;
    nv_api_error err;
    nv_olla_meta om;
    const int olla = ollama_route(cc->route), legacy = cc->route == R_OLLA_EMBEDDINGS, lcpp = cc->route == R_LCPP_EMBEDDING;
    int normalize = 2;
    if (olla   ? nv_olla_embed_parse(&h->ctx, cc->body.data, cc->body.len, legacy, &in, &om, &err)
        : lcpp ? nv_lcpp_embed_parse(&h->ctx, cc->body.data, cc->body.len, &in, &normalize, &err)
               : nv_api_embed_parse(&h->ctx, cc->body.data, cc->body.len, &in, &err))
        return respond_error(h, c, cc, &err);
    const int full = h->ctx.dim, dim = in.dims ? in.dims : full;
    float *vecs = malloc((size_t)in.n * full * sizeof(float));
    enum MHD_Result ret;
    long prompt_tokens = 0;
    const nv_req_params base = {.max_tokens = 0, .vocab_size = h->ctx.vocab_size, .embed = 1, .lora = in.lora};
    if (!vecs) ret = fail(h, c, cc, 500, "server_error", NULL, "out of memory");
    else if (run_prompts(h, c, cc, &base, in.ids, in.n_ids, in.n, 0, take_embedding, vecs, &prompt_tokens, &ret)) {
        if (in.dims) nv_api_embed_cut(vecs, in.n, full, dim);
        ret = respond(h, c, cc, 200, "application/json",
                      olla   ? nv_olla_embed_response(&om, legacy, vecs, in.n, dim, (int)prompt_tokens)
                      : lcpp ? nv_lcpp_embed_response(vecs, in.n, dim, normalize)
                             : nv_api_embed_response(dim, in.model, vecs, in.n, in.base64, (int)prompt_tokens),
                      NULL, NULL);
    }
    nv_api_embed_free(&in);
    free(vecs);
    return ret;
}

typedef struct {
    float *relevance;
    int raw;
} relevance_out;

static int take_relevance(nv_http *h, nv_req *r, int i, void *arg) {
    float logits[NV_MAX_SCORE];
    relevance_out *o = arg;
    if (!nv_req_scores(h->s, r, logits)) return 0;
    o->relevance[i] = nv_rerank_relevance(h->o.rerank, logits, o->raw);
    return 1;
}

/* /rerank, /v1/rerank, /v2/rerank, /score and /v1/score: each (query, document) pair a prompt-only
 * request scoring its "yes" and "no" tokens (serve/rerank.h). */
static enum MHD_Result rerank(nv_http *h, struct MHD_Connection *c, conn_ctx *cc) {
    nv_rerank_req in;
    nv_api_error err;
    const nv_rerank_api api = cc->route == R_SCORE ? NV_RERANK_SCORE : cc->route == R_RERANK_V2 ? NV_RERANK_COHERE : NV_RERANK_JINA;
    if (nv_rerank_parse(&h->ctx, h->o.rerank, api, cc->body.data, cc->body.len, &in, &err)) return respond_error(h, c, cc, &err);
    float *relevance = malloc((size_t)in.n * sizeof *relevance);
    enum MHD_Result ret;
    long prompt_tokens = 0;
    nv_req_params base = {.max_tokens = 0, .vocab_size = h->ctx.vocab_size, .n_score = h->o.rerank->n_tok,
                          .lora = in.lora};
    memcpy(base.score_tok, h->o.rerank->tok, sizeof base.score_tok);
    relevance_out ro = {relevance, in.raw};
    if (!relevance) ret = fail(h, c, cc, 500, "server_error", NULL, "out of memory");
    else if (run_prompts(h, c, cc, &base, in.ids, in.n_ids, in.n, in.one_query, take_relevance, &ro, &prompt_tokens, &ret))
        ret = respond(h, c, cc, 200, "application/json", nv_rerank_response(&in, relevance, (int)prompt_tokens), NULL, NULL);
    nv_rerank_req_free(&in);
    free(relevance);
    return ret;
}

/* ---- OpenAI's Files and Batch APIs (--files-dir) ----------------------------------------------------- */


/* The id in url after base ("/files/", "/batches/"), up to the next '/'. */
static void url_id(const char *url, const char *base, char *out, size_t cap) {
    const char *start = strstr(url, base) + strlen(base), *slash = strchr(start, '/');
    snprintf(out, cap, "%.*s", (int)(slash ? slash - start : (ptrdiff_t)strlen(start)), start);
}

/* ?limit=N within [1, most] (absent: dflt); -1 when it is not such a number. */
static int limit_arg(struct MHD_Connection *c, int dflt, int most) {
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit");
    if (!v) return dflt;
    char *end;
    const long n = strtol(v, &end, 10);
    return *v && !*end && n >= 1 && n <= most ? (int)n : -1;
}

static enum MHD_Result files_off(nv_http *h, struct MHD_Connection *c, conn_ctx *cc) {
    return fail(h, c, cc, 404, "invalid_request_error", "not_found",
                "The Files and Batch APIs are off: start nerve serve with --files-dir DIR (where files and batches are kept)");
}

/* One part of POST /v1/files's multipart body: "purpose", and "file" (its bytes into the store). */
static enum MHD_Result take_part(conn_ctx *cc, const char *key, const char *filename, const char *data, uint64_t off,
                                 size_t size) {
    nv_http *h = cc->h;
    if (cc->up_err.status) return MHD_YES; /* the rest is read and dropped */
    if (!key) { /* a part without a quoted name */
        nv_api_error_set(&cc->up_err, 400, "invalid_request_error", "invalid_request", NULL,
                         "Each part of the body needs a name: Content-Disposition: form-data; name=\"purpose\" or name=\"file\"");
        return MHD_YES;
    }
    /* the short fields, gathered: purpose, expires_after's */
    char *field = !strcmp(key, "purpose") ? cc->purpose : !strcmp(key, "expires_after[anchor]") ? cc->exp_anchor
                : !strcmp(key, "expires_after[seconds]") ? cc->exp_seconds : NULL;
    if (field) {
        const size_t cap = field == cc->purpose ? sizeof cc->purpose : sizeof cc->exp_anchor, have = strlen(field);
        if (have + size >= cap) {
            nv_api_error_set(&cc->up_err, 400, "invalid_request_error", "invalid_request", key, "%s is too long", key);
            return MHD_YES;
        }
        memcpy(field + have, data, size);
        field[have + size] = '\0';
        cc->purpose_len = (int)strlen(cc->purpose);
        return MHD_YES;
    }
    const int part = cc->route == R_UPLOAD_PARTS; /* an upload's part: its bytes are the field data */
    if (strcmp(key, part ? "data" : "file") != 0) return MHD_YES; /* other fields: not kept */
    /* a part's first call has off 0, and so may the next when the first had no bytes */
    if (off == 0 && !cc->up) { /* the file's first bytes */
        if (cc->files_seen++) {
            nv_api_error_set(&cc->up_err, 400, "invalid_request_error", "invalid_request", key, "Upload one file at a time");
            return MHD_YES;
        }
        snprintf(cc->filename, sizeof cc->filename, "%s", filename && *filename ? filename : "upload");
        if (nv_files_upload_begin(h->o.files, &cc->up) != NV_OK) {
            nv_api_error_set(&cc->up_err, 500, "server_error", NULL, NULL, "%s", nv_errmsg());
            return MHD_YES;
        }
    } else if (off == 0 && cc->file_bytes > 0) {
        nv_api_error_set(&cc->up_err, 400, "invalid_request_error", "invalid_request", key, "Upload one file at a time");
        return MHD_YES;
    }
    cc->file_bytes += size;
    if (part && cc->file_bytes > NV_UPLOAD_PART_MAX) { /* refused as it comes, not once written */
        nv_api_error_set(&cc->up_err, 413, "invalid_request_error", "part_too_large", "data", "A part is at most 64 MiB");
        return MHD_YES;
    }
    const nv_err e = size ? nv_files_upload_write(cc->up, data, size) : NV_OK;
    if (e != NV_OK)
        nv_api_error_set(&cc->up_err, e == NV_ERANGE ? 413 : 500, e == NV_ERANGE ? "invalid_request_error" : "server_error",
                         e == NV_ERANGE ? "file_too_large" : NULL, e == NV_ERANGE ? key : NULL, "%s", nv_errmsg());
    return MHD_YES;
}

static enum MHD_Result upload_part(void *cls, enum MHD_ValueKind kind, const char *key, const char *filename,
                                   const char *content_type, const char *transfer_encoding, const char *data, uint64_t off,
                                   size_t size) {
    (void)kind, (void)content_type, (void)transfer_encoding;
    conn_ctx *cc = cls;
    const enum MHD_Result r = take_part(cc, key, filename, data, off, size);
    if (cc->up_err.status && cc->up) { /* refused: its bytes and their room go now, not when a slow client ends the body */
        nv_files_upload_abort(cc->up);
        cc->up = NULL;
    }
    return r;
}

/* POST /v1/files, once its body is read: the file kept, or why not. */
/* A streamed multipart body's first checks: whole, with its file field (file, or data for an upload's
   part); what is wrong into e (its status 0: nothing). */
static void streamed_checks(const conn_ctx *cc, nv_api_error *e) {
    *e = cc->up_err;
    const int part = cc->route == R_UPLOAD_PARTS;
    if (!e->status && !cc->end.closed)
        nv_api_error_set(e, 400, "invalid_request_error", "invalid_request", NULL,
                         "The multipart body ends before its close delimiter (--BOUNDARY--): the upload is not whole");
    else if (!e->status && !cc->files_seen)
        nv_api_error_set(e, 400, "invalid_request_error", "invalid_request", part ? "data" : "file",
                         part ? "No data: POST multipart/form-data with the field data (the part's bytes)"
                              : "No file: POST multipart/form-data with the fields purpose and file");
}

static enum MHD_Result upload_done(nv_http *h, struct MHD_Connection *c, conn_ctx *cc) {
    nv_api_error e;
    streamed_checks(cc, &e);
    const int known = nv_files_purpose_ok(cc->purpose);
    if (!e.status && !known)
        nv_api_error_set(&e, 400, "invalid_request_error", "invalid_request", "purpose",
                         "purpose must be one of batch, fine-tune, assistants, vision, user_data, evals%s%.40s%s",
                         cc->purpose_len ? " (not '" : "", cc->purpose, cc->purpose_len ? "')" : "");
    /* expires_after: {anchor: created_at, seconds: 3600 to 2592000 (an hour to 30 days)}, OpenAI's bounds */
    long expires_after = 0;
    if (!e.status && (cc->exp_anchor[0] || cc->exp_seconds[0])) {
        char *end;
        expires_after = strtol(cc->exp_seconds, &end, 10);
        if (strcmp(cc->exp_anchor, "created_at") != 0 || !cc->exp_seconds[0] || *end || expires_after < 3600 || expires_after > 2592000)
            nv_api_error_set(&e, 400, "invalid_request_error", "invalid_request", "expires_after",
                             "expires_after: anchor must be created_at and seconds a number from 3600 to 2592000");
    }
    if (e.status) {
        nv_files_upload_abort(cc->up);
        cc->up = NULL;
        return respond_error(h, c, cc, &e);
    }
    nv_file_info fi;
    const nv_err err = nv_files_upload_commit(cc->up, cc->filename, cc->purpose, expires_after, &fi);
    cc->up = NULL;
    if (err != NV_OK) return fail(h, c, cc, 500, "server_error", NULL, nv_errmsg());
    nv_info("serve: file %s: %s, %lld bytes, purpose %s", fi.id, fi.filename, (long long)fi.bytes, fi.purpose);
    return respond(h, c, cc, 200, "application/json", nv_file_json(&fi), NULL, NULL);
}

/* OpenAI's Uploads: create, a part (its body streamed into the store as POST /v1/files's), complete, cancel. */
static enum MHD_Result uploads_api(nv_http *h, struct MHD_Connection *c, conn_ctx *cc, const char *url) {
    if (!h->o.files || !h->o.uploads) return files_off(h, c, cc);
    char id[64], *out = NULL;
    if (cc->route != R_UPLOADS) url_id(url, "/uploads/", id, sizeof id);
    nv_api_error e;
    int rc;
    const char *body = cc->body.data ? cc->body.data : "";
    if (cc->route == R_UPLOADS) rc = nv_uploads_create(h->o.uploads, body, cc->body.len, &out, &e);
    else if (cc->route == R_UPLOAD_PARTS) {
        streamed_checks(cc, &e);
        if (e.status) {
            nv_files_upload_abort(cc->up);
            rc = e.status;
        } else {
            rc = nv_uploads_add_part(h->o.uploads, id, cc->up, cc->file_bytes, &out, &e);
        }
        cc->up = NULL;
    } else if (!strcmp(strrchr(url, '/'), "/complete")) rc = nv_uploads_complete(h->o.uploads, id, body, cc->body.len, &out, &e);
    else rc = nv_uploads_cancel(h->o.uploads, id, &out, &e);
    return rc ? respond_error(h, c, cc, &e) : respond(h, c, cc, 200, "application/json", out, NULL, NULL);
}

static enum MHD_Result files_api(nv_http *h, struct MHD_Connection *c, conn_ctx *cc, const char *url, const char *method) {
    if (!h->o.files) return files_off(h, c, cc);
    if (cc->route == R_FILES && !strcmp(method, "POST")) return upload_done(h, c, cc);
    if (cc->route == R_FILES) {
        const char *purpose = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "purpose"),
                   *order = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "order"),
                   *after = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after");
        const int limit = limit_arg(c, 10000, 10000);
        if (limit < 0) return fail(h, c, cc, 400, "invalid_request_error", "invalid_request", "limit must be a number from 1 to 10000");
        if (order && strcmp(order, "asc") && strcmp(order, "desc"))
            return fail(h, c, cc, 400, "invalid_request_error", "invalid_request", "order must be asc or desc");
        return respond(h, c, cc, 200, "application/json",
                       nv_files_list_json(h->o.files, purpose, limit, order && !strcmp(order, "asc"), after), NULL, NULL);
    }
    char id[64];
    url_id(url, "/files/", id, sizeof id);
    nv_file_info fi;
    nv_api_error e;
    nv_api_error_set(&e, 404, "invalid_request_error", "not_found", NULL, "No file found with id '%.60s'", id);
    if (cc->route == R_FILE_CONTENT) {
        const int fd = nv_files_open_content(h->o.files, id, &fi);
        if (fd < 0) return respond_error(h, c, cc, &e);
        struct MHD_Response *resp = MHD_create_response_from_fd((uint64_t)fi.bytes, fd); /* (closes fd) */
        if (!resp) {
            close(fd);
            return MHD_NO;
        }
        add_common_headers(h, resp, "application/octet-stream");
        return queue_counted(h, c, cc, 200, resp);
    }
    if (!strcmp(method, "DELETE")) {
        if (h->o.batches && nv_batches_uses(h->o.batches, id))
            return fail(h, c, cc, 409, "invalid_request_error", "file_in_use",
                        "A batch that has not ended reads this file: cancel it, or wait for it to end");
        if (!nv_files_delete(h->o.files, id)) return respond_error(h, c, cc, &e);
        char *out = NULL;
        if (asprintf(&out, "{\"id\":\"%s\",\"object\":\"file\",\"deleted\":true}", id) < 0) out = NULL;
        return respond(h, c, cc, 200, "application/json", out, NULL, NULL);
    }
    if (!nv_files_get(h->o.files, id, &fi)) return respond_error(h, c, cc, &e);
    return respond(h, c, cc, 200, "application/json", nv_file_json(&fi), NULL, NULL);
}

/* The server's own URL as the client named it (Anthropic's results_url): its Host header when it is a
   plain host[:port], else 127.0.0.1. */
static void base_url(const nv_http *h, struct MHD_Connection *c, char *out, size_t cap) {
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    int ok = host && *host && strlen(host) < 256;
    for (const char *p = host; ok && *p; p++) ok = isalnum((unsigned char)*p) || strchr(".-:[]", *p);
    snprintf(out, cap, "%s://%s", h->o.tls_key ? "https" : "http", ok ? host : "127.0.0.1");
}

/* OpenAI's /v1/batches and Anthropic's /v1/messages/batches. */
static enum MHD_Result batches_api(nv_http *h, struct MHD_Connection *c, conn_ctx *cc, const char *url, const char *method) {
    if (!h->o.batches) return files_off(h, c, cc);
    const int anth = cc->route >= R_MSG_BATCHES;
    char *out = NULL, id[64] = "", base[300];
    nv_api_error e;
    int rc;
    base_url(h, c, base, sizeof base);
    if (cc->route != R_BATCHES && cc->route != R_MSG_BATCHES) url_id(url, "/batches/", id, sizeof id);
    if (cc->route == R_MSG_BATCH_RESULTS) {
        int fd = -1;
        long long bytes = 0;
        if ((rc = nv_batches_results(h->o.batches, id, &fd, &bytes, &e))) return respond_error(h, c, cc, &e);
        struct MHD_Response *resp = fd >= 0 ? MHD_create_response_from_fd((uint64_t)bytes, fd) /* (closes fd) */
                                            : MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
        if (!resp) {
            if (fd >= 0) close(fd);
            return MHD_NO;
        }
        add_common_headers(h, resp, "application/x-jsonl");
        return queue_counted(h, c, cc, 200, resp);
    }
    const char *body = cc->body.data ? cc->body.data : "";
    if ((cc->route == R_BATCHES || cc->route == R_MSG_BATCHES) && !strcmp(method, "POST")) {
        rc = anth ? nv_batches_create_anthropic(h->o.batches, body, cc->body.len, base, &out, &e)
                  : nv_batches_create(h->o.batches, body, cc->body.len, &out, &e);
    } else if (cc->route == R_BATCHES || cc->route == R_MSG_BATCHES) {
        const int limit = limit_arg(c, 20, anth ? 1000 : 100);
        if (limit < 0) {
            nv_api_error_set(&e, 400, "invalid_request_error", "invalid_request", "limit", "limit must be a number from 1 to %d",
                             anth ? 1000 : 100);
            return respond_error(h, c, cc, &e);
        }
        rc = nv_batches_list(h->o.batches, anth, limit,
                             MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, anth ? "after_id" : "after"),
                             anth ? MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "before_id") : NULL, base, &out, &e);
    } else if (cc->route == R_MSG_BATCH && !strcmp(method, "DELETE")) {
        rc = nv_batches_delete(h->o.batches, id, &out, &e);
    } else {
        rc = (cc->route == R_BATCH_CANCEL || cc->route == R_MSG_BATCH_CANCEL ? nv_batches_cancel : nv_batches_get)(h->o.batches, anth, id,
                                                                                                                 base, &out, &e);
    }
    return rc ? respond_error(h, c, cc, &e) : respond(h, c, cc, 200, "application/json", out, NULL, NULL);
}

/* OpenAI's metadata filter among a list's GET arguments: metadata[KEY]=VALUE (into an object, the
   last of a key's values kept; checked whole afterwards, as a request's metadata is), or
   metadata=null (a JSON null: no metadata at all); bad when malformed or mixed, failed when out of
   memory. Other arguments are not its. */
typedef struct {
    cJSON *filter;
    int bad, failed;
} metadata_filter;

static enum MHD_Result metadata_filter_arg(void *ctx, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    metadata_filter *f = ctx;
    const size_t n = strlen(key);
    if (!strcmp(key, "metadata")) { /* null, once or more, and nothing else */
        f->bad |= !value || strcmp(value, "null") != 0 || (f->filter && !cJSON_IsNull(f->filter));
        if (!f->bad && !f->filter) f->failed |= !(f->filter = cJSON_CreateNull());
        return f->bad || f->failed ? MHD_NO : MHD_YES;
    }
    if (strncmp(key, "metadata[", 9) != 0) return MHD_YES;
    f->bad |= key[n - 1] != ']' || n == 10 || !value || (f->filter && !cJSON_IsObject(f->filter)) ||
              cJSON_GetArraySize(f->filter) > 64; /* (bounded here; the sizes and 16 keys by nv_rec_metadata_ok, after) */
    if (!f->bad && !f->filter) f->failed |= !(f->filter = cJSON_CreateObject());
    if (f->bad || f->failed) return MHD_NO;
    char k[80]; /* (a longer key cut here is still past the 64 that nv_rec_metadata_ok allows) */
    snprintf(k, sizeof k, "%.*s", (int)(n - 10), key + 9);
    cJSON_DeleteItemFromObjectCaseSensitive(f->filter, k);
    f->failed |= !cJSON_AddStringToObject(f->filter, k, value);
    return f->failed ? MHD_NO : MHD_YES;
}

/* OpenAI's /v1/conversations, /v1/conversations/{id}, .../items and .../items/{item}. */
static enum MHD_Result conversations_api(nv_http *h, struct MHD_Connection *c, conn_ctx *cc, const char *url, const char *method) {
    if (!h->convs)
        return fail(h, c, cc, 404, "invalid_request_error", "not_found", "This server keeps no conversations (serve --responses-store 0)");
    char id[128] = "", item[128] = "", *out = NULL;
    nv_api_error e;
    if (cc->route != R_CONVS) url_id(url, "/conversations/", id, sizeof id);
    if (cc->route == R_CONV_ITEM) url_id(url, "/items/", item, sizeof item);
    const char *body = cc->body.data ? cc->body.data : "";
    const int post = !strcmp(method, "POST"), del = !strcmp(method, "DELETE");
    int rc;
    if (cc->route == R_CONVS) rc = nv_conv_create(h->convs, body, cc->body.len, &out, &e);
    else if (cc->route == R_CONV)
        rc = post  ? nv_conv_update(h->convs, id, body, cc->body.len, &out, &e)
             : del ? nv_conv_delete(h->convs, id, &out, &e)
                   : nv_conv_get(h->convs, id, &out, &e);
    else if (cc->route == R_CONV_ITEMS)
        rc = post ? nv_conv_items_add(h->convs, id, body, cc->body.len, &out, &e)
                  : nv_conv_items_list(h->convs, id, MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit"),
                                       MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "order"),
                                       MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after"), &out, &e);
    else rc = (del ? nv_conv_item_delete : nv_conv_item_get)(h->convs, id, item, &out, &e);
    return rc ? respond_error(h, c, cc, &e) : respond(h, c, cc, 200, "application/json", out, NULL, NULL);
}

/* OpenAI's /v1/fine_tuning/jobs. */
static enum MHD_Result ftjobs_api(nv_http *h, struct MHD_Connection *c, conn_ctx *cc, const char *url, const char *method) {
    if (!h->o.ftjobs)
        return fail(h, c, cc, 404, "invalid_request_error", "not_found",
                    "The fine-tuning jobs API is off: start nerve serve with --files-dir DIR (where files and jobs are kept)");
    char *out = NULL, id[64] = "";
    nv_api_error e;
    int rc;
    if (cc->route != R_FT_JOBS) url_id(url, "/fine_tuning/jobs/", id, sizeof id);
    const int limit = limit_arg(c, cc->route == R_FT_JOB_CHECKPOINTS ? 10 : 20, 100);
    const char *after = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after");
    if (limit < 0 && (cc->route == R_FT_JOBS || cc->route == R_FT_JOB_EVENTS || cc->route == R_FT_JOB_CHECKPOINTS)) {
        nv_api_error_set(&e, 400, "invalid_request_error", "invalid_request", "limit", "limit must be a number from 1 to 100");
        return respond_error(h, c, cc, &e);
    }
    if (cc->route == R_FT_JOBS && !strcmp(method, "POST"))
        rc = nv_ftjobs_create(h->o.ftjobs, cc->body.data ? cc->body.data : "", cc->body.len, &out, &e);
    else if (cc->route == R_FT_JOBS) {
        metadata_filter f = {NULL, 0, 0};
        MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, metadata_filter_arg, &f);
        cJSON *filter = f.filter;
        if (f.failed) {
            cJSON_Delete(filter);
            nv_api_oom(&e);
            return respond_error(h, c, cc, &e);
        }
        if (f.bad || (cJSON_IsObject(filter) && !nv_rec_metadata_ok(filter))) {
            cJSON_Delete(filter);
            nv_api_error_set(&e, 400, "invalid_request_error", "invalid_request", "metadata",
                             "metadata filters are metadata[KEY]=VALUE (at most 16, keys up to 64 characters, values up to 512), or metadata=null");
            return respond_error(h, c, cc, &e);
        }
        rc = nv_ftjobs_list(h->o.ftjobs, limit, after, filter, &out, &e);
        cJSON_Delete(filter);
    }
    else if (cc->route == R_FT_JOB_EVENTS)
        rc = nv_ftjobs_events(h->o.ftjobs, id, limit, after, &out, &e);
    else if (cc->route == R_FT_JOB_CHECKPOINTS)
        rc = nv_ftjobs_checkpoints(h->o.ftjobs, id, limit, after, &out, &e);
    else if (cc->route == R_FT_JOB_ACTION)
        rc = nv_ftjobs_act(h->o.ftjobs, id, strrchr(url, '/') + 1, &out, &e);
    else
        rc = nv_ftjobs_get(h->o.ftjobs, id, &out, &e);
    return rc ? respond_error(h, c, cc, &e) : respond(h, c, cc, 200, "application/json", out, NULL, NULL);
}

/* ---- the access handler ---------------------------------------------------------------------- */

/* A list of header names as a CORS preflight asks for them: letters, digits, '-', '_', commas and
 * spaces only (nothing that could end the header it is echoed into), at most 1 KiB. */
static int header_list_ok(const char *s) {
    size_t n = 0;
    for (; s[n]; n++)
        if (n >= 1024 || !(isalnum((unsigned char)s[n]) || s[n] == '-' || s[n] == '_' || s[n] == ',' || s[n] == ' ')) return 0;
    return n > 0;
}

static enum MHD_Result dispatch(nv_http *h, struct MHD_Connection *c, conn_ctx *cc, const char *url,
                                const char *method) {
    if (!strcmp(method, "OPTIONS") && h->o.cors && cc->route != R_NONE) {
        struct MHD_Response *resp = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
        if (!resp) return MHD_NO;
        add_common_headers(h, resp, NULL);
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
        /* the headers the browser asks for (the OpenAI SDKs send their own X-Stainless-* ones, which a
           fixed list would refuse), when they are plain header names; else the two every client needs */
        const char *asked = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
        MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                                asked && header_list_ok(asked) ? asked : "Authorization, Content-Type");
        MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
        return queue_counted(h, c, cc, 204, resp);
    }
    if (cc->route == R_NONE) {
        nv_api_error e;
        nv_api_error_set(&e, 404, "invalid_request_error", "not_found", NULL, "Not found: %s %.200s", method, url);
        return respond_error(h, c, cc, &e);
    }
    const int is_delete = !strcmp(method, "DELETE");
    if (!method_allowed(cc->route, method)) {
        nv_api_error e;
        const char *allow = route_methods(cc->route);
        nv_api_error_set(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "%s is not allowed on %.200s (use %s)",
                         method, url, allow);
        return respond(h, c, cc, 405, "application/json", error_json(c, cc, &e), MHD_HTTP_HEADER_ALLOW, allow);
    }
    if (cc->route == R_HEALTH) {
        int stopping = atomic_load(&h->stopping);
        return respond(h, c, cc, stopping ? 503 : 200, "application/json",
                       strdup(stopping ? "{\"status\":\"shutting down\"}" : "{\"status\":\"ok\"}"), NULL, NULL);
    }
    if (cc->route == R_WEBUI) return respond_page(h, c, cc);
    if (cc->route == R_OLLA_VERSION) /* public, as /health: what the server speaks */
        return respond(h, c, cc, 200, "application/json", nv_olla_version(), NULL, NULL);
    if (cc->route == R_PROPS) /* public, as llama-server's */
        return respond(h, c, cc, 200, "application/json", nv_lcpp_props(&h->ctx, h->s->o.max_batch), NULL, NULL);
    if (!auth_ok(h, c))
        return fail(h, c, cc, 401, "invalid_request_error", "invalid_api_key",
                    "Invalid or missing API key: send the header 'Authorization: Bearer <key>' (or 'x-api-key: <key>')");
    if (cc->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "The request body is larger than the server's limit of %zu bytes", h->o.max_body);
        return fail(h, c, cc, 413, "invalid_request_error", "request_too_large", msg);
    }
    switch (cc->route) {
    case R_METRICS: {
        nv_metrics_gauges g;
        nv_sched_gauges(h->s, &g);
        g.model_id = h->ctx.model_id;
        g.engine = h->o.engine;
        if ((g.responses_on = h->responses != NULL)) nv_resp_store_stats(h->responses, &g.responses_kept, &g.responses_bytes);
        if (h->convs) nv_conv_store_stats(h->convs, &g.conversations, &g.conversations_bytes);
        if ((g.files_on = h->o.files != NULL)) {
            nv_files_usage(h->o.files, &g.files_n, &g.files_bytes);
            g.batch_n = nv_batches_counts(h->o.batches, g.batch_status, g.batches, 8);
            if (h->o.ftjobs) g.ftjob_n = nv_ftjobs_counts(h->o.ftjobs, g.ftjob_status, g.ftjobs, 8);
        }
        return respond(h, c, cc, 200, "text/plain; version=0.0.4; charset=utf-8", nv_metrics_render(h->m, &g), NULL, NULL);
    }
    case R_MODELS:
        return respond(h, c, cc, 200, "application/json",
                       anthropic_client(c) ? nv_anth_models(&h->ctx, h->created, NULL) : nv_api_models(&h->ctx, h->created, NULL),
                       NULL, NULL);
    case R_MODEL: {
        const char *id = strstr(url, "/models/") + 8; /* the whole rest: an id may hold '/' (an alias "org/name") */
        if (is_delete) { /* a fine-tuned model's (OpenAI's DELETE /v1/models/{model}) */
            char *out = NULL;
            nv_api_error e;
            if (!h->o.ftjobs || !nv_ftjobs_owns(h->o.ftjobs, id)) {
                const int known = nv_api_model_find(&h->ctx, id, NULL) >= 0;
                nv_api_error_set(&e, known ? 403 : 404, "invalid_request_error", known ? "model_not_deletable" : "model_not_found",
                                 "model", known ? "The model '%.200s' is not a fine-tuned model of this server's: it cannot be deleted"
                                                : "The model '%.200s' does not exist",
                                 id);
                return respond_error(h, c, cc, &e);
            }
            return nv_ftjobs_delete_model(h->o.ftjobs, id, &out, &e) ? respond_error(h, c, cc, &e)
                                                                      : respond(h, c, cc, 200, "application/json", out, NULL, NULL);
        }
        const int k = nv_api_model_find(&h->ctx, id, NULL);
        if (k < 0) {
            nv_api_error e;
            nv_api_error_set(&e, 404, "invalid_request_error", "model_not_found", "model",
                             "The model '%.200s' does not exist", id);
            return respond_error(h, c, cc, &e);
        }
        return respond(h, c, cc, 200, "application/json",
                       anthropic_client(c) ? nv_anth_models(&h->ctx, h->created, id) : nv_api_models(&h->ctx, h->created, id),
                       NULL, NULL);
    }
    case R_TOKENIZE:
    case R_DETOKENIZE:
    case R_APPLY_TEMPLATE: {
        char *out = NULL;
        nv_api_error e;
        int rc = (cc->route == R_TOKENIZE     ? nv_api_tokenize
                  : cc->route == R_DETOKENIZE ? nv_api_detokenize
                                              : nv_api_apply_template)(&h->ctx, cc->body.data, cc->body.len, &out, &e);
        return rc ? respond_error(h, c, cc, &e) : respond(h, c, cc, 200, "application/json", out, NULL, NULL);
    }
    case R_LORA_LOAD:
    case R_LORA_UNLOAD:
        return lora_update(h, c, cc);
    case R_SLOTS: { /* a load balancer's probe: ?fail_on_no_slot answers 503 while every slot is taken */
        nv_slot *run = calloc((size_t)h->s->o.max_batch, sizeof *run);
        if (!run) return fail(h, c, cc, 500, "server_error", NULL, "out of memory");
        const int n = nv_sched_slots(h->s, run, h->s->o.max_batch);
        enum MHD_Result ret;
        if (n >= h->s->o.max_batch && MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "fail_on_no_slot"))
            ret = fail(h, c, cc, 503, "server_error", "unavailable_error", "no slot available");
        else
            ret = respond(h, c, cc, 200, "application/json",
                          nv_lcpp_slots(&h->ctx, run, n, h->s->o.max_batch, h->s->o.spec_tokens > 0 || h->s->o.draft != NULL), NULL, NULL);
        free(run);
        return ret;
    }
    case R_LORA_ADAPTERS: {
        nv_api_error e;
        if (!strcmp(cc->method, "GET")) return respond(h, c, cc, 200, "application/json", nv_api_lora_list(&h->ctx), NULL, NULL);
        if (nv_api_lora_apply(&h->ctx, cc->body.data, cc->body.len, &e)) return respond_error(h, c, cc, &e);
        return respond(h, c, cc, 200, "application/json", strdup("{\"success\":true}"), NULL, NULL);
    }
    case R_OLLA_TAGS:
    case R_OLLA_PS:
        return respond(h, c, cc, 200, "application/json", nv_olla_tags(&h->ctx, &h->o.olla, h->created, cc->route == R_OLLA_PS),
                       NULL, NULL);
    case R_OLLA_SHOW: {
        char *out = NULL;
        nv_api_error e;
        return nv_olla_show(&h->ctx, &h->o.olla, cc->body.data, cc->body.len, &out, &e) ? respond_error(h, c, cc, &e)
                                                                                         : respond(h, c, cc, 200, "application/json", out, NULL, NULL);
    }
    case R_RESPONSE:
    case R_RESPONSE_ITEMS:
        return stored_response(h, c, cc, url, is_delete);
    case R_RESPONSE_TOKENS: {
        char *out = NULL;
        nv_api_error e;
        return nv_resp_input_tokens(&h->ctx, h->responses, h->convs, cc->body.data, cc->body.len, &out, &e)
                   ? respond_error(h, c, cc, &e)
                   : respond(h, c, cc, 200, "application/json", out, NULL, NULL);
    }
    case R_RESPONSE_CANCEL: {
        char id[128];
        const char *start = strstr(url, "/responses/") + 11;
        snprintf(id, sizeof id, "%.*s", (int)(strchr(start, '/') - start), start);
        return background_cancel(h, c, cc, id);
    }
    case R_FILES:
    case R_FILE:
    case R_FILE_CONTENT:
        return files_api(h, c, cc, url, method);
    case R_CONVS:
    case R_CONV:
    case R_CONV_ITEMS:
    case R_CONV_ITEM:
        return conversations_api(h, c, cc, url, method);
    case R_UPLOADS:
    case R_UPLOAD_PARTS:
    case R_UPLOAD_ACTION:
        return uploads_api(h, c, cc, url);
    case R_BATCHES:
    case R_BATCH:
    case R_BATCH_CANCEL:
    case R_MSG_BATCHES:
    case R_MSG_BATCH:
    case R_MSG_BATCH_CANCEL:
    case R_MSG_BATCH_RESULTS:
        return batches_api(h, c, cc, url, method);
    case R_FT_JOBS:
    case R_FT_JOB:
    case R_FT_JOB_ACTION:
    case R_FT_JOB_EVENTS:
    case R_FT_JOB_CHECKPOINTS:
        return ftjobs_api(h, c, cc, url, method);
    default:
        if (atomic_load(&h->stopping)) return fail(h, c, cc, 503, "server_error", "service_unavailable", "The server is shutting down");
        if (anthropic_route(cc->route)) return messages(h, c, cc);
        if (cc->route == R_RESPONSES) return responses(h, c, cc);
        if (cc->route == R_LCPP_COMPLETION || cc->route == R_INFILL) return native(h, c, cc);
        if (cc->route == R_OLLA_CHAT || cc->route == R_OLLA_GENERATE) return ollama(h, c, cc);
        if (cc->route == R_RERANK || cc->route == R_RERANK_V2 || cc->route == R_SCORE) return rerank(h, c, cc);
        if (cc->route == R_EMBEDDINGS || cc->route == R_OLLA_EMBED || cc->route == R_OLLA_EMBEDDINGS || cc->route == R_LCPP_EMBEDDING)
            return embeddings(h, c, cc);
        return completions(h, c, cc);
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    nv_http *h = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) {
        if (!(cc = calloc(1, sizeof *cc))) return MHD_NO;
        *con_cls = cc;
        atomic_fetch_add(&h->active, 1);
        cc->t0 = nv_now();
        cc->h = h;
        cc->route = route_of(url);
        if (cc->route == R_WEBUI && !h->o.webui) cc->route = R_NONE; /* --no-webui */
        cc->method = method;
        if ((cc->route == R_FILES || cc->route == R_UPLOAD_PARTS) && !strcmp(method, "POST")) { /* streamed to the store, not held */
            if (!auth_ok(h, c))
                return fail(h, c, cc, 401, "invalid_request_error", "invalid_api_key",
                            "Invalid or missing API key: send the header 'Authorization: Bearer <key>' (or 'x-api-key: <key>')");
            if (!h->o.files || (cc->route == R_UPLOAD_PARTS && !h->o.uploads)) return files_off(h, c, cc);
            if (h->o.uploads) nv_uploads_reap(h->o.uploads); /* (an expired upload's parts give their room back) */
            if (cc->route == R_UPLOAD_PARTS) { /* an upload that takes no part: refused before its body is read */
                char id[64];
                nv_api_error e;
                url_id(url, "/uploads/", id, sizeof id);
                if (nv_uploads_check(h->o.uploads, id, &e)) return respond_error(h, c, cc, &e);
            }
            const char *ctype = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
            if (!nv_multipart_end_init(&cc->end, ctype) ||
                !(cc->pp = MHD_create_post_processor(c, 64 * 1024, upload_part, cc)))
                return fail(h, c, cc, 400, "invalid_request_error", "invalid_request",
                            cc->route == R_FILES ? "Upload the file as multipart/form-data with the fields purpose and file"
                                                 : "Send the part as multipart/form-data with the field data");
            return MHD_YES;
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            unsigned long long n = strtoull(cl, &end, 10);
            if (n > h->o.max_body) {
                cc->too_big = 1;
                /* refuse before reading the body (libmicrohttpd closes the connection after) */
                if (!auth_ok(h, c) && cc->route != R_HEALTH)
                    return fail(h, c, cc, 401, "invalid_request_error", "invalid_api_key",
                                "Invalid or missing API key: send the header 'Authorization: Bearer <key>' (or 'x-api-key: <key>')");
                char msg[128];
                snprintf(msg, sizeof msg, "The request body is larger than the server's limit of %zu bytes",
                         h->o.max_body);
                return fail(h, c, cc, 413, "invalid_request_error", "request_too_large", msg);
            }
        }
        return MHD_YES;
    }
    if (cc->responded) {
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size && cc->pp) {
        const size_t body = nv_multipart_end_scan(&cc->end, upload, *upload_size);
        if (body && MHD_post_process(cc->pp, upload, body) != MHD_YES && !cc->up_err.status)
            nv_api_error_set(&cc->up_err, 400, "invalid_request_error", "invalid_request", NULL, "The multipart body is malformed");
        *upload_size = 0;
        return MHD_YES;
    }
    if (cc->pp) { /* the body is whole: its last part ends as the processor goes */
        if (MHD_destroy_post_processor(cc->pp) != MHD_YES && !cc->up_err.status)
            nv_api_error_set(&cc->up_err, 400, "invalid_request_error", "invalid_request", NULL, "The multipart body is malformed");
        cc->pp = NULL;
    }
    if (*upload_size) {
        if (!cc->too_big && cc->body.len + *upload_size <= h->o.max_body) nv_buf_append(&cc->body, upload, *upload_size);
        else {
            cc->too_big = 1;
            nv_buf_free(&cc->body);
        }
        if (cc->body.oom) return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    return dispatch(h, c, cc, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)c, (void)toe;
    nv_http *h = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) return;
    atomic_fetch_sub(&h->active, 1);
    if (cc->pp) MHD_destroy_post_processor(cc->pp);
    nv_files_upload_abort(cc->up); /* an upload the client left */
    nv_buf_free(&cc->body);
    free(cc);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    nv_http *h = cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n') line[--n] = '\0';
    if (atomic_load(&h->starting)) snprintf(h->start_error, sizeof h->start_error, "%.200s", line);
    nv_debug("serve: libmicrohttpd: %s", line);
}

nv_err nv_http_start(nv_http **out, const nv_http_opts *o, nv_sched *s, nv_metrics *m, const nv_api_ctx *ctx) {
    *out = NULL;
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    int gai = getaddrinfo(o->host, port, &hints, &ai);
    if (gai != 0 || !ai) return nv_fail(NV_EINVAL, "cannot resolve --host '%s': %s", o->host, gai_strerror(gai));
    nv_http *h = calloc(1, sizeof *h);
    if (!h) {
        freeaddrinfo(ai);
        return nv_fail(NV_ENOMEM, "out of memory");
    }
    h->o = *o;
    h->s = s;
    h->m = m;
    h->ctx = *ctx;
    h->created = (long)time(NULL);
    pthread_mutex_init(&h->bg_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* a wall clock set back does not stretch a reader's wait */
    pthread_cond_init(&h->bg_cv, &ca);
    pthread_condattr_destroy(&ca);
    if (o->responses_store && (nv_resp_store_new(o->responses_store, &h->responses) != NV_OK ||
                               nv_conv_store_new(o->responses_store, &h->convs) != NV_OK)) {
        nv_resp_store_free(h->responses);
        nv_conv_store_free(h->convs);
        free(h);
        freeaddrinfo(ai);
        return nv_fail(NV_ENOMEM, "out of memory");
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    const int tls = o->tls_key != NULL;
    if (tls && MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
        nv_resp_store_free(h->responses);
        nv_conv_store_free(h->convs);
        free(h);
        freeaddrinfo(ai);
        return nv_fail(NV_EUNSUPPORTED, "HTTPS: this libmicrohttpd was built without TLS (GnuTLS)");
    }
    if (tls) flags |= MHD_USE_TLS;
    unsigned idle = (unsigned)(o->timeout_s > 0 ? o->timeout_s + 30 : 600);
    /* without TLS the list ends before the key and certificate */
    atomic_store(&h->starting, 1);
    h->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_CONNECTION_TIMEOUT, idle,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)512, MHD_OPTION_THREAD_STACK_SIZE,
                            (size_t)(4u << 20), MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h,
                            tls ? MHD_OPTION_HTTPS_MEM_KEY : MHD_OPTION_END, o->tls_key, MHD_OPTION_HTTPS_MEM_CERT, o->tls_cert,
                            MHD_OPTION_END);
    atomic_store(&h->starting, 0);
    freeaddrinfo(ai);
    if (!h->d) {
        char why[300];
        snprintf(why, sizeof why, "%s", h->start_error);
        nv_resp_store_free(h->responses);
        nv_conv_store_free(h->convs);
        free(h);
        if (tls && why[0])
            return nv_fail(NV_EINVAL, "cannot serve HTTPS on %s:%d: %s (--ssl-key-file, --ssl-cert-file: a PEM private key and its "
                                      "certificate)", o->host, o->port, why);
        return nv_fail(NV_EIO, "cannot listen on %s:%d (address in use or not available)", o->host, o->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : o->port;
    *out = h;
    return NV_OK;
}

int nv_http_port(const nv_http *h) { return h->port; }

int nv_http_active(nv_http *h) { return atomic_load(&h->active); }

void nv_http_quiesce(nv_http *h) {
    atomic_store(&h->stopping, 1);
    MHD_socket fd = MHD_quiesce_daemon(h->d);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void nv_http_stop(nv_http *h) {
    if (!h) return;
    MHD_stop_daemon(h->d);
    pthread_mutex_lock(&h->bg_mu);
    bg_reap(h, 1);
    pthread_mutex_unlock(&h->bg_mu);
    pthread_mutex_destroy(&h->bg_mu);
    pthread_cond_destroy(&h->bg_cv);
    nv_resp_store_free(h->responses);
    nv_conv_store_free(h->convs);
    free(h);
}
