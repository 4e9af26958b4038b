#include "serve/ollama.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/buf.h"
#include "base/hash.h"
#include "base/log.h"
#include "base/timer.h"
#include "serve/sched.h"

/* The model id a name stands for: Ollama's clients add the tag ":latest" to names without one. */
static void model_id_of(const char *name, char *id, size_t cap) {
    const size_t n = strlen(name), tag = sizeof ":latest" - 1;
    snprintf(id, cap, "%.*s", (int)(n > tag && !strcmp(name + n - tag, ":latest") ? n - tag : n), name);
}

/* The 404 of a model this server does not have, in Ollama's words (also over the OpenAI parser's
   own 404); returns its status. */
static int not_found(nv_api_error *err, const char *name) {
    nv_api_error_set(err, 404, "invalid_request_error", "model_not_found", "model", "model '%.200s' not found", name);
    return err->status;
}

/* A field that must be absent, null or empty (images: no model here reads them). */
static int refuse_unless_empty(const cJSON *in, const char *key, const char *why, nv_api_error *err) {
    const cJSON *v = nv_api_field(in, key);
    if (!v || (cJSON_IsString(v) && !v->valuestring[0]) || ((cJSON_IsArray(v) || cJSON_IsObject(v)) && !v->child)) return 0;
    return nv_api_bad(err, "%s: %s", key, why);
}

/* options: what changes an answer, as the OpenAI request's fields; Ollama's runner settings ignored. */
static int translate_options(const cJSON *in, cJSON *out, nv_api_error *err) {
    const cJSON *o = nv_api_field(in, "options");
    if (!o) return 0;
    if (!cJSON_IsObject(o)) return nv_api_bad(err, "options: must be an object");
    static const struct {
        const char *key, *as;
        char kind;
    } fields[] = {{"seed", "seed", 'i'},
                  {"temperature", "temperature", 'n'},
                  {"top_k", "top_k", 'i'},
                  {"top_p", "top_p", 'n'},
                  {"min_p", "min_p", 'n'},
                  {"typical_p", "typical_p", 'n'},
                  {"repeat_penalty", "repetition_penalty", 'n'},
                  {"presence_penalty", "presence_penalty", 'n'},
                  {"frequency_penalty", "frequency_penalty", 'n'},
                  {"repeat_last_n", "repeat_last_n", 'i'},
                  {"mirostat", "mirostat", 'i'},
                  {"mirostat_tau", "mirostat_tau", 'n'},
                  {"mirostat_eta", "mirostat_eta", 'n'}};
    int rc;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if ((rc = nv_api_copy_field(o, out, fields[i].key, fields[i].as, fields[i].kind, err))) return rc;
    if (!nv_api_field(o, "repeat_last_n")) cJSON_AddNumberToObject(out, "repeat_last_n", 64); /* Ollama's penalties' window */
    const cJSON *np = nv_api_field(o, "num_predict");
    if (np) { /* -1 and -2 (fill the context): no limit (translate's default) */
        if (!cJSON_IsNumber(np) || np->valuedouble != floor(np->valuedouble) || np->valuedouble < -2 || np->valuedouble > 1e9)
            return nv_api_bad(err, "options.num_predict: must be an integer (-1: no limit)");
        if (np->valuedouble > 0) cJSON_AddNumberToObject(out, "max_tokens", np->valuedouble);
        else if (np->valuedouble == 0) return nv_api_bad(err, "options.num_predict: 0 would answer nothing (-1: no limit)");
    }
    const cJSON *stop = nv_api_field(o, "stop");
    if (stop) {
        if (!cJSON_IsArray(stop) && !cJSON_IsString(stop)) return nv_api_bad(err, "options.stop: must be a list of strings");
        cJSON_AddItemToObject(out, "stop", cJSON_Duplicate(stop, 1)); /* checked as OpenAI's */
    }
    return 0;
}

/* format: "json", a JSON schema, or "" (none). */
static int translate_format(const cJSON *in, cJSON *out, nv_api_error *err) {
    const cJSON *f = nv_api_field(in, "format");
    if (!f || (cJSON_IsString(f) && !f->valuestring[0])) return 0;
    cJSON *rf = cJSON_AddObjectToObject(out, "response_format");
    if (cJSON_IsString(f) && !strcmp(f->valuestring, "json")) {
        cJSON_AddStringToObject(rf, "type", "json_object");
        return 0;
    }
    if (!cJSON_IsObject(f)) return nv_api_bad(err, "format: must be \"json\" or a JSON schema");
    cJSON_AddStringToObject(rf, "type", "json_schema");
    cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
    cJSON_AddStringToObject(js, "name", "format");
    cJSON_AddItemToObject(js, "schema", cJSON_Duplicate(f, 1));
    return 0;
}

/* The id given to call k of message i (Ollama's calls carry none): 9 letters and digits, message and
   call in base 36, so that Mistral's templates, which take no other length, take it too (unique for
   up to 36^3 calls in a message). */
static void made_up_call_id(int i, int k, char id[16]) {
    static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
    unsigned v = (unsigned)i, w = (unsigned)k;
    for (int d = 5; d >= 0; d--, v /= 36) id[d] = digits[v % 36];
    for (int d = 8; d >= 6; d--, w /= 36) id[d] = digits[w % 36];
    id[9] = '\0';
}

/* Ollama's messages as OpenAI's: tool_calls' arguments objects as JSON text with ids, and each tool
   message linked to the call it answers (by tool_name, else the next unanswered one). */
static int translate_messages(const cJSON *msgs, cJSON *out, nv_api_error *err) {
    if (!cJSON_IsArray(msgs)) return nv_api_bad(err, "messages: must be a list");
    cJSON *list = cJSON_AddArrayToObject(out, "messages");
    const cJSON *calls = NULL; /* the latest assistant message's tool_calls */
    int call_msg = -1, answered = 0, i = 0;
    for (const cJSON *m = msgs->child; m; m = m->next, i++) {
        if (!cJSON_IsObject(m)) return nv_api_bad(err, "messages.%d: must be an object", i);
        if (refuse_unless_empty(m, "images", "this server's models read text, not images", err)) return err->status;
        cJSON *q = cJSON_CreateObject();
        cJSON_AddItemToArray(list, q);
        const cJSON *role = nv_api_field(m, "role"), *content = nv_api_field(m, "content");
        if (!cJSON_IsString(role)) return nv_api_bad(err, "messages.%d.role: required (a string)", i);
        if (content && !cJSON_IsString(content)) return nv_api_bad(err, "messages.%d.content: must be a string", i);
        cJSON_AddStringToObject(q, "role", role->valuestring);
        cJSON_AddStringToObject(q, "content", content ? content->valuestring : "");
        const cJSON *tc = nv_api_field(m, "tool_calls");
        if (tc && !cJSON_IsArray(tc)) return nv_api_bad(err, "messages.%d.tool_calls: must be a list", i);
        if (tc && tc->child) {
            cJSON *oc = cJSON_AddArrayToObject(q, "tool_calls");
            int k = 0;
            for (const cJSON *c = tc->child; c; c = c->next, k++) {
                const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
                const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name"), *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
                if (!cJSON_IsString(name)) return nv_api_bad(err, "messages.%d.tool_calls.%d.function.name: required (a string)", i, k);
                cJSON *call = cJSON_CreateObject(), *f = cJSON_CreateObject();
                char id[16];
                made_up_call_id(i, k, id);
                cJSON_AddItemToArray(oc, call);
                cJSON_AddStringToObject(call, "id", id);
                cJSON_AddStringToObject(call, "type", "function");
                cJSON_AddItemToObject(call, "function", f);
                cJSON_AddStringToObject(f, "name", name->valuestring);
                char *text = args ? (cJSON_IsString(args) ? strdup(args->valuestring) : cJSON_PrintUnformatted(args)) : strdup("{}");
                if (!text) return nv_api_oom(err);
                cJSON_AddStringToObject(f, "arguments", text);
                free(text);
            }
            calls = tc, call_msg = i, answered = 0;
        }
        if (!strcmp(role->valuestring, "tool")) { /* the call it answers: by name, else in order */
            if (!calls) return nv_api_bad(err, "messages.%d: a tool message must follow an assistant message with tool_calls", i);
            const cJSON *tn = nv_api_field(m, "tool_name");
            int k = 0, pick = -1;
            for (const cJSON *c = calls->child; c; c = c->next, k++) {
                const cJSON *name = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c, "function"), "name");
                if (cJSON_IsString(tn) && cJSON_IsString(name) && !strcmp(name->valuestring, tn->valuestring)) pick = k;
            }
            if (pick < 0) pick = answered < k ? answered : k - 1;
            answered++;
            char id[16];
            made_up_call_id(call_msg, pick, id);
            cJSON_AddStringToObject(q, "tool_call_id", id);
        }
    }
    return 0;
}

static int translate(const cJSON *in, cJSON *out, int chat, int reasoning, nv_olla_meta *meta, nv_api_error *err) {
    const cJSON *model = nv_api_field(in, "model");
    if (!cJSON_IsString(model) || !model->valuestring[0]) return nv_api_bad(err, "model is required");
    snprintf(meta->model, sizeof meta->model, "%s", model->valuestring);
    char id[NV_API_MODEL_ID + 8];
    model_id_of(model->valuestring, id, sizeof id);
    cJSON_AddStringToObject(out, "model", id);
    const cJSON *stream = nv_api_field(in, "stream");
    if (stream && !cJSON_IsBool(stream)) return nv_api_bad(err, "stream: must be a boolean");
    cJSON_AddBoolToObject(out, "stream", !cJSON_IsFalse(stream)); /* Ollama streams unless told not to */
    const cJSON *think = nv_api_field(in, "think");
    if (think && !cJSON_IsBool(think) &&
        !(cJSON_IsString(think) && (!strcmp(think->valuestring, "low") || !strcmp(think->valuestring, "medium") || !strcmp(think->valuestring, "high"))))
        return nv_api_bad(err, "think: must be a boolean (or \"low\", \"medium\", \"high\")");
    if (reasoning && cJSON_IsFalse(think)) /* Qwen3's switch */
        cJSON_AddBoolToObject(cJSON_AddObjectToObject(out, "chat_template_kwargs"), "enable_thinking", 0);
    if (cJSON_IsString(think)) cJSON_AddStringToObject(out, "reasoning_effort", think->valuestring); /* gpt-oss's levels: the template's */
    int rc;
    if ((rc = nv_api_copy_field(in, out, "lora", NULL, 'j', err)) || /* llama.cpp's adapter list, as on /v1 */
        (rc = refuse_unless_empty(in, "images", "this server's models read text, not images", err)) ||
        (rc = refuse_unless_empty(in, "template", "the model's chat template is the server's (--chat-template)", err)) ||
        (chat && (rc = refuse_unless_empty(in, "suffix", "fill-in-the-middle is /api/generate's", err))) ||
        (chat && (rc = refuse_unless_empty(in, "context", "/api/chat's conversation is its messages", err))) ||
        (rc = translate_options(in, out, err)) || (rc = translate_format(in, out, err)))
        return rc;
    /* Ollama's default: until the end of the turn or of the context (a ceiling the parser lowers to
       the room there is) */
    if (!nv_api_field(out, "max_tokens")) cJSON_AddNumberToObject(out, "max_tokens", 1e9);
    if (chat) {
        const cJSON *tools = nv_api_field(in, "tools"), *msgs = nv_api_field(in, "messages");
        if (tools) cJSON_AddItemToObject(out, "tools", cJSON_Duplicate(tools, 1)); /* OpenAI's shape, checked as theirs */
        return msgs ? translate_messages(msgs, out, err) : 0; /* none: the model is loaded */
    }
    const cJSON *prompt = nv_api_field(in, "prompt"), *system = nv_api_field(in, "system"), *raw = nv_api_field(in, "raw");
    const cJSON *suffix = nv_api_field(in, "suffix");
    if (!prompt) return 0; /* none: the model is loaded */
    if (!cJSON_IsString(prompt)) return nv_api_bad(err, "prompt: must be a string");
    if (system && !cJSON_IsString(system)) return nv_api_bad(err, "system: must be a string");
    if (raw && !cJSON_IsBool(raw)) return nv_api_bad(err, "raw: must be a boolean");
    if (suffix && !cJSON_IsString(suffix)) return nv_api_bad(err, "suffix: must be a string");
    if (suffix && suffix->valuestring[0]) {
        /* fill-in-the-middle: the answer goes between prompt and suffix, asked in the model's own form
           (as Ollama's code-model templates write it), so a completions request with OpenAI's suffix */
        if (cJSON_IsTrue(raw)) return nv_api_bad(err, "suffix: not used with raw (the prompt is sent as it is)");
        if ((rc = refuse_unless_empty(in, "context", "not used with suffix (the model's fill-in-the-middle form)", err))) return rc;
        if (system && system->valuestring[0]) return nv_api_bad(err, "system: not used with suffix (the model's fill-in-the-middle form has no system text)");
        cJSON_AddStringToObject(out, "prompt", prompt->valuestring);
        cJSON_AddStringToObject(out, "suffix", suffix->valuestring);
        return 0;
    }
    if (cJSON_IsTrue(raw)) { /* the prompt as it is: a text completion */
        if (system) return nv_api_bad(err, "system: not used with raw (the prompt is sent as it is)");
        if ((rc = refuse_unless_empty(in, "context", "not used with raw (the prompt is sent as it is)", err))) return rc;
        cJSON_AddStringToObject(out, "prompt", prompt->valuestring);
        return 0;
    }
    cJSON *list = cJSON_AddArrayToObject(out, "messages"), *m;
    if (system && system->valuestring[0]) {
        cJSON_AddItemToArray(list, m = cJSON_CreateObject());
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", system->valuestring);
    }
    cJSON_AddItemToArray(list, m = cJSON_CreateObject());
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", prompt->valuestring);
    return 0;
}

/* generate through the template: its context's ids (checked against the vocabulary), and what its
   answer's context is rendered from. */
static int keep_turn(const nv_api_ctx *ctx, const cJSON *in, nv_olla_meta *m, nv_api_error *err) {
    const cJSON *system = nv_api_field(in, "system");
    m->ctx = ctx;
    if (!(m->prompt = strdup(nv_api_field(in, "prompt")->valuestring)) ||
        (system && system->valuestring[0] && !(m->system = strdup(system->valuestring))))
        return nv_api_oom(err);
    const cJSON *c = nv_api_field(in, "context");
    if (!c || cJSON_IsNull(c)) return 0;
    if (!cJSON_IsArray(c)) return nv_api_bad(err, "context: must be a list of token ids");
    const int n = cJSON_GetArraySize(c); /* however long: the prompt it begins is truncated to fit */
    if (n && !(m->context = malloc((size_t)n * sizeof *m->context))) return nv_api_oom(err);
    const cJSON *id;
    cJSON_ArrayForEach(id, c) {
        const double v = cJSON_IsNumber(id) ? id->valuedouble : -1;
        if (!(v >= 0 && v < ctx->vocab_size && v == floor(v)))
            return nv_api_bad(err, "context: item %d is not a token id of this model's vocabulary (0 to %d)", m->n_context,
                              ctx->vocab_size - 1);
        m->context[m->n_context++] = (int)v;
    }
    return 0;
}

void nv_olla_meta_free(nv_olla_meta *m) {
    free(m->system);
    free(m->prompt);
    free(m->context);
    nv_buf_free(&m->streamed);
    m->system = m->prompt = NULL;
    m->context = NULL;
    m->n_context = 0;
}

int nv_olla_parse(const nv_api_ctx *ctx, const char *body, size_t len, int chat, nv_api_request *out, nv_olla_meta *meta,
                  nv_api_error *err) {
    memset(out, 0, sizeof *out);
    memset(err, 0, sizeof *err);
    memset(meta, 0, sizeof *meta);
    meta->chat = chat;
    meta->t_arrival = nv_now();
    cJSON *in = nv_api_body_object(body, len, err);
    if (!in) return err->status;
    /* nothing to answer: Ollama loads the model (it is loaded here from the start) */
    const cJSON *what = nv_api_field(in, chat ? "messages" : "prompt");
    const int empty = !what || (cJSON_IsArray(what) && !what->child) || (cJSON_IsString(what) && !what->valuestring[0]);
    cJSON *q = cJSON_CreateObject();
    int rc = q ? translate(in, q, chat, ctx->reasoning, meta, err) : nv_api_oom(err);
    /* options.num_keep: the prompt's first tokens a truncation keeps (Ollama's default 4) */
    const cJSON *opts = nv_api_field(in, "options"), *nk = cJSON_IsObject(opts) ? nv_api_field(opts, "num_keep") : NULL;
    if (!rc && nk && !(cJSON_IsNumber(nk) && nk->valuedouble >= 0 && nk->valuedouble <= 1e9 && nk->valuedouble == floor(nk->valuedouble)))
        rc = nv_api_bad(err, "options.num_keep: must be an integer >= 0");
    const int keep = nk && !rc ? (int)nk->valuedouble : 4;
    /* through the template: the OpenAI request's messages stand for it */
    if (!rc && !empty && !chat && nv_api_field(q, "messages")) rc = keep_turn(ctx, in, meta, err);
    cJSON_Delete(in);
    if (!rc && empty) { /* the model must still be one this server has */
        char id[NV_API_MODEL_ID + 8];
        model_id_of(meta->model, id, sizeof id);
        if (nv_api_model_find(ctx, id, NULL) < 0) not_found(err, meta->model);
        else meta->load_only = 1;
        cJSON_Delete(q);
        return err->status;
    }
    const nv_api_parse_opts o = {.max_stop = NV_MAX_STOP - 1, .max_tokens_cap = 1, .prefix = meta->context,
                                 .n_prefix = meta->n_context, .truncate = 1, .keep = keep};
    /* translate() wrote a prompt (raw, or a suffix to fill in before) for a completions request, else messages */
    if (!rc) rc = nv_api_parse_json(ctx, !nv_api_field(q, "prompt"), q, &o, out, err);
    meta->no_think = out->no_think, meta->effort = out->effort; /* the context renders the turn as it ran */
    cJSON_Delete(q);
    if (rc == 404) not_found(err, meta->model);
    if (rc) nv_olla_meta_free(meta);
    return rc;
}

char *nv_olla_error_json(const nv_api_error *e) {
    cJSON *o = cJSON_CreateObject();
    nv_buf msg = {0};
    nv_utf8_sanitize(&msg, e->message, strlen(e->message)); /* messages may quote the client's bytes */
    cJSON_AddStringToObject(o, "error", msg.data ? msg.data : "");
    nv_buf_free(&msg);
    return nv_api_print_free(o);
}

int nv_olla_embed_parse(const nv_api_ctx *ctx, const char *body, size_t len, int legacy, nv_api_embed *out, nv_olla_meta *meta,
                        nv_api_error *err) {
    memset(out, 0, sizeof *out);
    memset(err, 0, sizeof *err);
    memset(meta, 0, sizeof *meta);
    meta->t_arrival = nv_now();
    cJSON *in = nv_api_body_object(body, len, err);
    if (!in) return err->status;
    cJSON *q = cJSON_CreateObject();
    const cJSON *model = nv_api_field(in, "model"), *input = nv_api_field(in, legacy ? "prompt" : "input");
    const cJSON *trunc = nv_api_field(in, "truncate");
    int rc = !q ? nv_api_oom(err) : 0;
    if (!rc && (!cJSON_IsString(model) || !model->valuestring[0])) rc = nv_api_bad(err, "model is required");
    else if (!rc && trunc && !cJSON_IsBool(trunc)) rc = nv_api_bad(err, "truncate: must be a boolean");
    else if (!rc && (!input || (!cJSON_IsString(input) && !cJSON_IsArray(input))))
        rc = nv_api_bad(err, legacy ? "prompt: must be a string" : "input: must be a text or a list of texts");
    else if (!rc && legacy && !cJSON_IsString(input)) rc = nv_api_bad(err, "prompt: must be a string");
    if (!rc) {
        char id[NV_API_MODEL_ID + 8];
        snprintf(meta->model, sizeof meta->model, "%s", model->valuestring);
        model_id_of(model->valuestring, id, sizeof id);
        cJSON_AddStringToObject(q, "model", id);
        cJSON_AddItemToObject(q, "input", cJSON_Duplicate(input, 1));
        rc = nv_api_copy_field(in, q, "dimensions", NULL, 'i', err);
        if (!rc) rc = nv_api_copy_field(in, q, "lora", NULL, 'j', err);
    }
    cJSON_Delete(in);
    if (!rc) rc = nv_api_embed_parse_json(ctx, q, out, err);
    cJSON_Delete(q);
    if (rc == 404) not_found(err, meta->model);
    return rc;
}

char *nv_olla_embed_response(const nv_olla_meta *m, int legacy, const float *vecs, int n, int dim, int prompt_tokens) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", m->model);
    cJSON *list = legacy ? NULL : cJSON_AddArrayToObject(o, "embeddings");
    for (int i = 0; i < n; i++) {
        cJSON *v = cJSON_CreateArray();
        for (int k = 0; k < dim; k++) cJSON_AddItemToArray(v, cJSON_CreateNumber((double)vecs[(size_t)i * dim + k]));
        if (legacy) cJSON_AddItemToObject(o, "embedding", v);
        else cJSON_AddItemToArray(list, v);
    }
    if (!legacy) {
        cJSON_AddNumberToObject(o, "total_duration", floor((nv_now() - m->t_arrival) * 1e9));
        cJSON_AddNumberToObject(o, "load_duration", 0);
        cJSON_AddNumberToObject(o, "prompt_eval_count", prompt_tokens);
    }
    return nv_api_print_free(o);
}

/* RFC 3339 in UTC with nanoseconds, as Ollama writes created_at. */
static void rfc3339(char *out, size_t cap, double unix_s) {
    const time_t t = (time_t)unix_s;
    struct tm tm;
    gmtime_r(&t, &tm);
    char day[32];
    strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, cap, "%s.%09ldZ", day, (long)((unix_s - (double)t) * 1e9));
}

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static cJSON *head(const nv_olla_meta *m) {
    cJSON *o = cJSON_CreateObject();
    char at[48];
    rfc3339(at, sizeof at, wall_now());
    cJSON_AddStringToObject(o, "model", m->model);
    cJSON_AddStringToObject(o, "created_at", at);
    return o;
}

/* The answer's text: chat's message (with its calls, arguments as JSON objects) or generate's response. */
static void add_text(cJSON *o, const nv_olla_meta *m, const char *thinking, const char *content, const nv_tool_call *calls,
                     int n_calls) {
    cJSON *where = o;
    if (m->chat) {
        where = cJSON_AddObjectToObject(o, "message");
        cJSON_AddStringToObject(where, "role", "assistant");
    }
    cJSON_AddStringToObject(where, m->chat ? "content" : "response", content ? content : "");
    if (thinking && thinking[0]) cJSON_AddStringToObject(where, "thinking", thinking);
    if (!n_calls || !m->chat) return;
    cJSON *list = cJSON_AddArrayToObject(where, "tool_calls");
    for (int i = 0; i < n_calls; i++) {
        cJSON *c = cJSON_CreateObject(), *f = cJSON_AddObjectToObject(c, "function");
        cJSON_AddItemToArray(list, c);
        cJSON_AddStringToObject(f, "name", calls[i].name);
        cJSON *args = cJSON_Parse(calls[i].arguments ? calls[i].arguments : "{}");
        cJSON_AddItemToObject(f, "arguments", args ? args : cJSON_CreateString(calls[i].arguments ? calls[i].arguments : ""));
    }
}

char *nv_olla_chunk(const nv_olla_meta *m, const char *thinking, const char *content, const nv_tool_call *calls, int n_calls) {
    cJSON *o = head(m);
    add_text(o, m, thinking, content, calls, n_calls);
    cJSON_AddBoolToObject(o, "done", 0);
    return nv_api_print_free(o);
}

static double ns(double s) { return s > 0 ? floor(s * 1e9) : 0; }

/* generate's context: the one it came with, then its messages and answer as the conversation so far
   (its BOS left out after a context, as the prompt's was); 0 when the template cannot render it. */
static int add_context(cJSON *o, const nv_olla_meta *m, const char *answer) {
    nv_chat_msg msgs[3];
    int n = 0;
    if (m->system) msgs[n++] = (nv_chat_msg){.role = "system", .content = m->system};
    msgs[n++] = (nv_chat_msg){.role = "user", .content = m->prompt};
    msgs[n++] = (nv_chat_msg){.role = "assistant", .content = answer ? answer : ""};
    const nv_chat_opts opts = {.no_think = m->no_think, .effort = m->effort, .jinja = m->ctx->jinja};
    int *ids = NULL, k = 0;
    if (nv_chat_render_history(m->ctx->tmpl, m->ctx->tok, msgs, n, &opts, &ids, &k) != NV_OK) {
        nv_warn("serve: /api/generate: no context for the answer: %s", nv_errmsg());
        return 0;
    }
    const int skip = m->n_context && nv_chat_leading_bos(m->ctx->tmpl, m->ctx->tok, ids, k);
    cJSON *list = cJSON_AddArrayToObject(o, "context");
    for (int i = 0; list && i < m->n_context; i++) cJSON_AddItemToArray(list, cJSON_CreateNumber(m->context[i]));
    for (int i = skip; list && i < k; i++) cJSON_AddItemToArray(list, cJSON_CreateNumber(ids[i]));
    free(ids);
    return 1;
}

char *nv_olla_done(const nv_olla_meta *m, const nv_olla_answer *a) {
    cJSON *o = head(m);
    add_text(o, m, a->thinking, a->content, a->calls, a->n_calls);
    cJSON_AddBoolToObject(o, "done", 1);
    cJSON_AddStringToObject(o, "done_reason", a->finish == NV_FINISH_LENGTH ? "length" : "stop");
    cJSON_AddNumberToObject(o, "total_duration", ns(nv_now() - m->t_arrival));
    cJSON_AddNumberToObject(o, "load_duration", 0);
    cJSON_AddNumberToObject(o, "prompt_eval_count", a->prompt_tokens);
    cJSON_AddNumberToObject(o, "prompt_eval_duration", ns(a->prompt_s));
    cJSON_AddNumberToObject(o, "eval_count", a->completion_tokens);
    cJSON_AddNumberToObject(o, "eval_duration", ns(a->gen_s));
    if (m->prompt) add_context(o, m, a->whole);
    return nv_api_print_free(o);
}

char *nv_olla_loaded(const nv_olla_meta *m) {
    cJSON *o = head(m);
    add_text(o, m, NULL, "", NULL, 0);
    cJSON_AddBoolToObject(o, "done", 1);
    cJSON_AddStringToObject(o, "done_reason", "load");
    return nv_api_print_free(o);
}

/* "1.2B", "260K": Ollama's parameter_size. */
static void param_size(char *out, size_t cap, long long n) {
    if (n >= 1000000000LL) snprintf(out, cap, "%.1fB", (double)n / 1e9);
    else if (n >= 1000000LL) snprintf(out, cap, "%.1fM", (double)n / 1e6);
    else snprintf(out, cap, "%.0fK", (double)n / 1e3);
}

static cJSON *details(const nv_olla_model_info *info, const char *parent) {
    cJSON *d = cJSON_CreateObject(), *fams;
    char size[32];
    param_size(size, sizeof size, info->n_params);
    cJSON_AddStringToObject(d, "parent_model", parent ? parent : "");
    cJSON_AddStringToObject(d, "format", info->format);
    cJSON_AddStringToObject(d, "family", info->family);
    cJSON_AddItemToObject(d, "families", fams = cJSON_CreateArray());
    cJSON_AddItemToArray(fams, cJSON_CreateString(info->family));
    cJSON_AddStringToObject(d, "parameter_size", size);
    cJSON_AddStringToObject(d, "quantization_level", info->quantization);
    return d;
}

char *nv_olla_tags(const nv_api_ctx *ctx, const nv_olla_model_info *info, long started, int running) {
    char ids[NV_MAX_ADAPTERS + 1][NV_ADAPTER_NAME_CAP];
    snprintf(ids[0], sizeof ids[0], "%s", ctx->model_id);
    const int n = 1 + nv_api_model_ids(ctx, ids + 1);
    cJSON *root = cJSON_CreateObject(), *list = cJSON_AddArrayToObject(root, "models");
    char at[48];
    rfc3339(at, sizeof at, (double)started);
    for (int i = 0; i < n; i++) {
        cJSON *m = cJSON_CreateObject();
        char name[80], digest[80];
        snprintf(name, sizeof name, "%s:latest", ids[i]);
        /* 64 hex digits that stand for the name (Ollama's are its manifest's sha256) */
        unsigned long long d[4];
        for (int k = 0; k < 4; k++) d[k] = (unsigned long long)nv_hash64(name, strlen(name), (uint64_t)k + 1);
        snprintf(digest, sizeof digest, "%016llx%016llx%016llx%016llx", d[0], d[1], d[2], d[3]);
        cJSON_AddItemToArray(list, m);
        cJSON_AddStringToObject(m, "name", name);
        cJSON_AddStringToObject(m, "model", name);
        if (!running) cJSON_AddStringToObject(m, "modified_at", at);
        cJSON_AddNumberToObject(m, "size", (double)info->file_bytes);
        cJSON_AddStringToObject(m, "digest", digest);
        cJSON_AddItemToObject(m, "details", details(info, i ? ids[0] : NULL));
        if (running) {
            cJSON_AddStringToObject(m, "expires_at", "9999-12-31T23:59:59Z"); /* loaded for as long as the server runs */
            cJSON_AddNumberToObject(m, "size_vram", 0);
            cJSON_AddNumberToObject(m, "context_length", ctx->seq_len);
        }
    }
    return nv_api_print_free(root);
}

int nv_olla_show(const nv_api_ctx *ctx, const nv_olla_model_info *info, const char *body, size_t len, char **out,
                 nv_api_error *err) {
    *out = NULL;
    memset(err, 0, sizeof *err);
    cJSON *in = nv_api_body_object(body, len, err);
    if (!in) return err->status;
    const cJSON *model = nv_api_field(in, "model");
    if (!model) model = nv_api_field(in, "name"); /* the field's earlier name */
    char id[NV_API_MODEL_ID + 8];
    if (cJSON_IsString(model)) model_id_of(model->valuestring, id, sizeof id);
    const int k = cJSON_IsString(model) ? nv_api_model_find(ctx, id, NULL) : -1;
    if (k < 0) {
        if (!cJSON_IsString(model)) nv_api_bad(err, "model is required");
        else not_found(err, model->valuestring);
        cJSON_Delete(in);
        return err->status;
    }
    cJSON_Delete(in);
    cJSON *root = cJSON_CreateObject(), *mi = cJSON_CreateObject(), *caps = cJSON_CreateArray();
    char key[96];
    cJSON_AddStringToObject(root, "modelfile", "");
    cJSON_AddStringToObject(root, "parameters", "");
    cJSON_AddStringToObject(root, "template", nv_chat_template_name(ctx->tmpl));
    cJSON_AddItemToObject(root, "details", details(info, k ? ctx->model_id : NULL));
    cJSON_AddStringToObject(mi, "general.architecture", info->family);
    cJSON_AddNumberToObject(mi, "general.parameter_count", (double)info->n_params);
    snprintf(key, sizeof key, "%s.context_length", info->family);
    cJSON_AddNumberToObject(mi, key, ctx->seq_len);
    snprintf(key, sizeof key, "%s.embedding_length", info->family);
    cJSON_AddNumberToObject(mi, key, ctx->dim);
    cJSON_AddNumberToObject(mi, "tokenizer.ggml.vocab_size", ctx->vocab_size); /* not Ollama's key: its list of tokens */
    cJSON_AddItemToObject(root, "model_info", mi);
    cJSON_AddItemToArray(caps, cJSON_CreateString("completion"));
    cJSON_AddItemToArray(caps, cJSON_CreateString("tools"));
    if (ctx->reasoning) cJSON_AddItemToArray(caps, cJSON_CreateString("thinking"));
    cJSON_AddItemToObject(root, "capabilities", caps);
    if (!(*out = nv_api_print_free(root))) return nv_api_oom(err);
    return 0;
}

char *nv_olla_version(void) { return strdup("{\"version\":\"0.12.0\"}"); }
