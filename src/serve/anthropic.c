#include "serve/anthropic.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define E400 400, "invalid_request_error"



/* A tool_use id as the conversation's template gets it: tool_use_block's inverse for a Mistral id
 * (toolu_ and 9 letters and digits: the 9 alone, which Mistral's templates require), else as sent. */
static const char *call_id_of(const char *id) {
    return !strncmp(id, "toolu_", 6) && nv_tool_mistral_id(id + 6, strlen(id + 6)) ? id + 6 : id;
}

static int is_type(const cJSON *block, const char *type) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(block, "type");
    return cJSON_IsString(t) && !strcmp(t->valuestring, type);
}

/* The text of a string or of a list of text blocks (tool_result content, system), into b. */
/* The text of a string or of a list of text blocks (a tool_result's content, the system prompt)
 * into b; path names the value in errors ("system", "messages.2.content.0.content"). */
static int text_of(const cJSON *v, const char *path, nv_buf *b, nv_api_error *err) {
    if (cJSON_IsString(v)) {
        nv_buf_puts(b, v->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(v)) return nv_api_bad(err, "%s: must be a string or a list of text blocks", path);
    int k = 0;
    for (const cJSON *p = v->child; p; p = p->next, k++) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!is_type(p, "text") || !cJSON_IsString(t))
            return nv_api_bad(err, "%s.%d: only text blocks {\"type\": \"text\", \"text\": string} are supported here", path, k);
        if (k) nv_buf_puts(b, "\n");
        nv_buf_puts(b, t->valuestring);
    }
    return 0;
}

/* Adds {"role": role, "content": text} to msgs, or joins text to the last message when that has the
 * same role, user or assistant (Anthropic combines consecutive turns of one role into one). Returns
 * the message, NULL when out of memory. */
static cJSON *add_msg(cJSON *msgs, const char *role, const char *text) {
    cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
    const char *last_role = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(last, "role"));
    text = text ? text : "";
    if (last_role && !strcmp(last_role, role) && (!strcmp(role, "user") || !strcmp(role, "assistant"))) {
        const char *prev = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(last, "content"));
        nv_buf joined = {0};
        nv_buf_printf(&joined, "%s%s%s", prev, *prev && *text ? "\n\n" : "", text);
        cJSON *c = joined.oom ? NULL : cJSON_CreateString(joined.data ? joined.data : "");
        nv_buf_free(&joined);
        if (!c) return NULL;
        cJSON_ReplaceItemInObjectCaseSensitive(last, "content", c);
        return last;
    }
    cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddStringToObject(m, "role", role) || !cJSON_AddStringToObject(m, "content", text)) {
        cJSON_Delete(m);
        return NULL;
    }
    cJSON_AddItemToArray(msgs, m);
    return m;
}

/* A user message's blocks: text joins the user turn, each tool_result becomes a tool message
 * (in the order given: the text before a result is its own turn). */
static int user_blocks(const cJSON *content, int i, cJSON *msgs, nv_api_error *err) {
    nv_buf text = {0};
    int rc = 0, k = 0, pending = 0;
    for (const cJSON *b = content->child; b && !rc; b = b->next, k++) {
        if (is_type(b, "text")) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "text");
            if (!cJSON_IsString(t)) rc = nv_api_bad(err, "messages.%d.content.%d.text: must be a string", i, k);
            else {
                if (pending) nv_buf_puts(&text, "\n");
                nv_buf_puts(&text, t->valuestring);
                pending = 1;
            }
        } else if (is_type(b, "tool_result")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "tool_use_id"), *c = nv_api_field(b, "content");
            const cJSON *is_error = nv_api_field(b, "is_error");
            if (!cJSON_IsString(id) || !id->valuestring[0]) {
                rc = nv_api_bad(err, "messages.%d.content.%d.tool_use_id: required (the id of the tool_use it answers)", i, k);
                break;
            }
            if (is_error && !cJSON_IsBool(is_error)) {
                rc = nv_api_bad(err, "messages.%d.content.%d.is_error: must be a boolean", i, k);
                break;
            }
            if (pending && !add_msg(msgs, "user", text.data)) {
                rc = nv_api_oom(err);
                break;
            }
            text.len = 0, pending = 0;
            nv_buf result = {0};
            if (cJSON_IsTrue(is_error)) nv_buf_puts(&result, "Error: "); /* the model reads that the call failed */
            char path[64];
            snprintf(path, sizeof path, "messages.%d.content.%d.content", i, k);
            if (c) rc = text_of(c, path, &result, err);
            if (!rc && result.oom) rc = nv_api_oom(err);
            cJSON *m = rc ? NULL : add_msg(msgs, "tool", result.data);
            if (m) cJSON_AddStringToObject(m, "tool_call_id", call_id_of(id->valuestring));
            else if (!rc) rc = nv_api_oom(err);
            nv_buf_free(&result);
        } else if (is_type(b, "image") || is_type(b, "document")) {
            rc = nv_api_bad(err, "messages.%d.content.%d: this model reads text only ('%s' blocks are not supported)", i, k,
                     cJSON_GetObjectItemCaseSensitive(b, "type")->valuestring);
        } else {
            rc = nv_api_bad(err, "messages.%d.content.%d: a user message's blocks are text and tool_result", i, k);
        }
    }
    if (!rc && text.oom) rc = nv_api_oom(err);
    if (!rc && (pending || k == 0) && !add_msg(msgs, "user", text.data)) rc = nv_api_oom(err);
    nv_buf_free(&text);
    return rc;
}

/* An assistant message's blocks: text is its content, tool_use its tool_calls (input printed as
 * the arguments' JSON text); thinking blocks of earlier turns are dropped. */
static int assistant_blocks(const cJSON *content, int i, cJSON *msgs, nv_api_error *err) {
    nv_buf text = {0};
    cJSON *calls = cJSON_CreateArray();
    if (!calls) return nv_api_oom(err);
    int rc = 0, k = 0;
    for (const cJSON *b = content->child; b && !rc; b = b->next, k++) {
        if (is_type(b, "text")) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "text");
            if (!cJSON_IsString(t)) rc = nv_api_bad(err, "messages.%d.content.%d.text: must be a string", i, k);
            else nv_buf_puts(&text, t->valuestring);
        } else if (is_type(b, "tool_use")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "id"), *name = cJSON_GetObjectItemCaseSensitive(b, "name");
            const cJSON *input = cJSON_GetObjectItemCaseSensitive(b, "input");
            if (!cJSON_IsString(id) || !cJSON_IsString(name) || !cJSON_IsObject(input)) {
                rc = nv_api_bad(err, "messages.%d.content.%d: a tool_use block is {\"id\", \"name\", \"input\": object}", i, k);
                break;
            }
            char *args = cJSON_PrintUnformatted(input);
            cJSON *call = cJSON_CreateObject(), *fn = cJSON_CreateObject();
            if (!args || !call || !fn) {
                free(args), cJSON_Delete(call), cJSON_Delete(fn);
                rc = nv_api_oom(err);
                break;
            }
            cJSON_AddStringToObject(call, "id", call_id_of(id->valuestring));
            cJSON_AddStringToObject(call, "type", "function");
            cJSON_AddStringToObject(fn, "name", name->valuestring);
            cJSON_AddStringToObject(fn, "arguments", args);
            cJSON_AddItemToObject(call, "function", fn);
            cJSON_AddItemToArray(calls, call);
            free(args);
        } else if (is_type(b, "thinking") || is_type(b, "redacted_thinking")) {
            continue;
        } else {
            rc = nv_api_bad(err, "messages.%d.content.%d: an assistant message's blocks are text, tool_use and thinking", i, k);
        }
    }
    if (!rc && text.oom) rc = nv_api_oom(err);
    cJSON *m = rc ? NULL : add_msg(msgs, "assistant", text.data);
    if (!rc && !m) rc = nv_api_oom(err);
    if (m && calls->child) { /* joined to an assistant turn before it: its calls follow that one's */
        cJSON *before = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (!before) cJSON_AddItemToObject(m, "tool_calls", calls), calls = NULL;
        else
            while (calls->child) cJSON_AddItemToArray(before, cJSON_DetachItemViaPointer(calls, calls->child));
    }
    cJSON_Delete(calls);
    nv_buf_free(&text);
    return rc;
}

static int translate_messages(const cJSON *in, cJSON *out, nv_api_error *err) {
    const cJSON *msgs = nv_api_field(in, "messages"), *system = nv_api_field(in, "system");
    if (!msgs) return nv_api_bad(err, "messages: Field required");
    if (!cJSON_IsArray(msgs) || !msgs->child) return nv_api_bad(err, "messages: must be a non-empty list of messages");
    cJSON *list = cJSON_AddArrayToObject(out, "messages");
    if (system) {
        nv_buf b = {0};
        int rc = text_of(system, "system", &b, err);
        if (!rc && b.oom) rc = nv_api_oom(err);
        else if (b.len && !add_msg(list, "system", b.data)) rc = nv_api_oom(err);
        nv_buf_free(&b);
        if (rc) return rc;
    }
    int i = 0;
    const cJSON *last = NULL;
    for (const cJSON *m = msgs->child; m; m = m->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role"), *content = nv_api_field(m, "content");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) return nv_api_bad(err, "messages.%d: must be {\"role\", \"content\"}", i);
        int user = !strcmp(role->valuestring, "user"), assistant = !strcmp(role->valuestring, "assistant");
        if (!user && !assistant)
            return nv_api_bad(err, "messages.%d.role: must be 'user' or 'assistant' (the system prompt is the top-level 'system')",
                       i);
        if (!content || (!cJSON_IsString(content) && !cJSON_IsArray(content)))
            return nv_api_bad(err, "messages.%d.content: must be a string or a list of content blocks", i);
        int rc = 0;
        if (cJSON_IsString(content)) rc = add_msg(list, role->valuestring, content->valuestring) ? 0 : nv_api_oom(err);
        else rc = user ? user_blocks(content, i, list, err) : assistant_blocks(content, i, list, err);
        if (rc) return rc;
        last = m;
    }
    /* a last assistant message is a prefill: the answer continues its text */
    if (!strcmp(cJSON_GetObjectItemCaseSensitive(last, "role")->valuestring, "assistant")) {
        const cJSON *answer = cJSON_GetArrayItem(list, cJSON_GetArraySize(list) - 1);
        if (cJSON_GetObjectItemCaseSensitive(answer, "tool_calls"))
            return nv_api_bad(err, "messages.%d: the last message, the assistant's, may hold only text to continue", i - 1);
        const char *t = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(answer, "content"));
        size_t n = t ? strlen(t) : 0;
        if (n && strchr(" \t\r\n", t[n - 1]))
            return nv_api_bad(err, "messages.%d: the final assistant content cannot end with trailing whitespace", i - 1);
        cJSON_AddBoolToObject(out, "continue_final_message", 1);
    }
    return 0;
}

/* tools [{"name", "description", "input_schema"}] and tool_choice into the OpenAI shapes. */
static int translate_tools(const cJSON *in, cJSON *out, nv_api_error *err) {
    const cJSON *tools = nv_api_field(in, "tools"), *choice = nv_api_field(in, "tool_choice");
    if (tools) {
        if (!cJSON_IsArray(tools)) return nv_api_bad(err, "tools: must be a list of tools");
        cJSON *list = cJSON_AddArrayToObject(out, "tools");
        int i = 0;
        for (const cJSON *t = tools->child; t; t = t->next, i++) {
            const cJSON *type = nv_api_field(t, "type"), *name = cJSON_GetObjectItemCaseSensitive(t, "name");
            const cJSON *desc = nv_api_field(t, "description"), *schema = cJSON_GetObjectItemCaseSensitive(t, "input_schema");
            if (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "custom")))
                return nv_api_bad(err, "tools.%d.type: only client tools (\"custom\") are supported here, not '%.40s'", i,
                           cJSON_IsString(type) ? type->valuestring : "?");
            if (!cJSON_IsObject(t) || !cJSON_IsString(name) || !cJSON_IsObject(schema) || (desc && !cJSON_IsString(desc)))
                return nv_api_bad(err, "tools.%d: a tool is {\"name\", \"description\": string, \"input_schema\": object}", i);
            cJSON *tool = cJSON_CreateObject(), *fn = cJSON_CreateObject();
            cJSON_AddItemToArray(list, tool);
            cJSON_AddStringToObject(tool, "type", "function");
            cJSON_AddItemToObject(tool, "function", fn);
            cJSON_AddStringToObject(fn, "name", name->valuestring);
            if (desc) cJSON_AddStringToObject(fn, "description", desc->valuestring);
            cJSON_AddItemToObject(fn, "parameters", cJSON_Duplicate(schema, 1));
        }
    }
    if (!choice) return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(choice, "type"), *name = cJSON_GetObjectItemCaseSensitive(choice, "name");
    const cJSON *dp = nv_api_field(choice, "disable_parallel_tool_use");
    if (!cJSON_IsObject(choice) || !cJSON_IsString(type) || (dp && !cJSON_IsBool(dp)))
        return nv_api_bad(err, "tool_choice: must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}");
    const char *t = type->valuestring;
    if (!strcmp(t, "tool")) {
        if (!cJSON_IsString(name)) return nv_api_bad(err, "tool_choice.name: required with type 'tool'");
        cJSON *c = cJSON_AddObjectToObject(out, "tool_choice");
        cJSON_AddStringToObject(c, "type", "function");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(c, "function"), "name", name->valuestring);
    } else if (!strcmp(t, "auto") || !strcmp(t, "any") || !strcmp(t, "none")) {
        if (strcmp(t, "none") && (!tools || !tools->child))
            return nv_api_bad(err, "tool_choice: '%s' needs 'tools'", t);
        cJSON_AddStringToObject(out, "tool_choice", !strcmp(t, "any") ? "required" : t);
    } else {
        return nv_api_bad(err, "tool_choice.type: must be 'auto', 'any', 'tool' or 'none', not '%.40s'", t);
    }
    if (dp) cJSON_AddBoolToObject(out, "parallel_tool_calls", !cJSON_IsTrue(dp));
    return 0;
}


static int translate(const cJSON *in, int count_only, int reasoning, cJSON *out, nv_anth_meta *meta, nv_api_error *err) {
    const cJSON *model = nv_api_field(in, "model");
    if (!cJSON_IsString(model)) return nv_api_bad(err, "model: Field required (a string)");
    cJSON_AddStringToObject(out, "model", model->valuestring);
    int rc;
    if ((rc = nv_api_copy_field(in, out, "lora", NULL, 'j', err))) return rc; /* llama.cpp's adapter list, as on /v1 */
    if (!count_only) {
        const cJSON *mt = nv_api_field(in, "max_tokens");
        if (!mt) return nv_api_bad(err, "max_tokens: Field required");
        if (!cJSON_IsNumber(mt) || mt->valuedouble < 1 || mt->valuedouble > 1e9 || mt->valuedouble != (double)(long long)mt->valuedouble)
            return nv_api_bad(err, "max_tokens: must be an integer of at least 1");
        cJSON_AddNumberToObject(out, "max_tokens", mt->valuedouble);
        if ((rc = nv_api_copy_field(in, out, "stream", NULL, 'b', err))) return rc;
        const cJSON *t = nv_api_field(in, "temperature");
        if (t && (!cJSON_IsNumber(t) || t->valuedouble < 0 || t->valuedouble > 1))
            return nv_api_bad(err, "temperature: must be a number from 0 to 1");
        if ((rc = nv_api_copy_field(in, out, "temperature", NULL, 'n', err)) || (rc = nv_api_copy_field(in, out, "top_p", NULL, 'n', err)) ||
            (rc = nv_api_copy_field(in, out, "top_k", NULL, 'i', err)))
            return rc;
        const cJSON *stops = nv_api_field(in, "stop_sequences");
        if (stops) {
            if (!cJSON_IsArray(stops) || cJSON_GetArraySize(stops) > NV_MAX_STOP - 1)
                return nv_api_bad(err, "stop_sequences: must be a list of at most %d strings", NV_MAX_STOP - 1);
            int i = 0;
            for (const cJSON *s = stops->child; s; s = s->next, i++) {
                if (!cJSON_IsString(s) || !s->valuestring[0] || strlen(s->valuestring) > 256)
                    return nv_api_bad(err, "stop_sequences.%d: must be a string of 1 to 256 bytes", i);
                if (!(meta->stop[meta->n_stop] = strdup(s->valuestring))) return nv_api_oom(err);
                meta->n_stop++;
            }
            cJSON_AddItemToObject(out, "stop", cJSON_Duplicate(stops, 1));
        }
    }
    const cJSON *thinking = nv_api_field(in, "thinking");
    if (thinking) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(thinking, "type");
        if (!cJSON_IsObject(thinking) || !cJSON_IsString(type) ||
            (strcmp(type->valuestring, "enabled") && strcmp(type->valuestring, "disabled") && strcmp(type->valuestring, "adaptive")))
            return nv_api_bad(err, "thinking: must be {\"type\": \"enabled\" | \"disabled\" | \"adaptive\"}");
    }
    /* Anthropic's default is no thinking: a reasoning model (--reasoning-format) thinks only when asked,
       through Qwen3's switch; other models' prompts are left as they are */
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(thinking, "type");
    if (reasoning && (!thinking || !strcmp(type->valuestring, "disabled")))
        cJSON_AddBoolToObject(cJSON_AddObjectToObject(out, "chat_template_kwargs"), "enable_thinking", 0);
    /* enabled with a budget: the think block's tokens are held to it (chat's thinking_budget_tokens) */
    const cJSON *budget = thinking && !strcmp(type->valuestring, "enabled") ? nv_api_field(thinking, "budget_tokens") : NULL;
    if (budget && !(cJSON_IsNumber(budget) && budget->valuedouble >= 0 && budget->valuedouble <= 1e9 && budget->valuedouble == floor(budget->valuedouble)))
        return nv_api_bad(err, "thinking.budget_tokens: must be an integer >= 0");
    if (budget) cJSON_AddNumberToObject(out, "thinking_budget_tokens", budget->valuedouble);
    const cJSON *md = nv_api_field(in, "metadata");
    if (md && !cJSON_IsObject(md)) return nv_api_bad(err, "metadata: must be an object");
    if ((rc = translate_tools(in, out, err))) return rc;
    return translate_messages(in, out, err);
}

void nv_anth_meta_free(nv_anth_meta *m) {
    for (int i = 0; i < m->n_stop; i++) free(m->stop[i]);
    memset(m, 0, sizeof *m);
}

typedef struct {
    int count_only, reasoning;
    nv_anth_meta *meta;
} translate_args;

static int translate_cb(const cJSON *in, cJSON *chat, void *arg, nv_api_error *err) {
    const translate_args *a = arg;
    return translate(in, a->count_only, a->reasoning, chat, a->meta, err);
}

int nv_anth_parse(const nv_api_ctx *ctx, const char *body, size_t len, int count_only, nv_api_request *out,
                  nv_anth_meta *meta, nv_api_error *err) {
    memset(meta, 0, sizeof *meta);
    translate_args a = {count_only, ctx->reasoning, meta};
    const nv_api_parse_opts o = {.max_stop = NV_MAX_STOP - 1, .count_only = count_only, .max_tokens_cap = 1};
    int rc = nv_api_parse_translated(ctx, body, len, translate_cb, &a, &o, out, err);
    if (rc) {
        nv_anth_meta_free(meta);
        return rc;
    }
    nv_api_new_id(meta->id, sizeof meta->id, "msg_");
    snprintf(meta->model, sizeof meta->model, "%s", out->model);
    return 0;
}

const char *nv_anth_error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    case 408:
    case 504: return "timeout_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}


/* An event's data: {"type": name} first, as Anthropic's events have it; the caller adds the rest. */
static cJSON *ev(const char *name) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", name);
    return o;
}

static cJSON *error_object(const nv_api_error *e) {
    cJSON *root = ev("error"), *o = cJSON_AddObjectToObject(root, "error");
    nv_buf msg = {0};
    nv_utf8_sanitize(&msg, e->message, strlen(e->message)); /* messages may quote the client's bytes */
    cJSON_AddStringToObject(o, "type", nv_anth_error_type(e->status));
    cJSON_AddStringToObject(o, "message", msg.data ? msg.data : "");
    nv_buf_free(&msg);
    return root;
}

char *nv_anth_error_json(const nv_api_error *e) { return nv_api_print_free(error_object(e)); }

const char *nv_anth_stop_reason(const nv_anth_meta *m, nv_finish f, int stop_index, int n_calls, const char **stop_sequence) {
    *stop_sequence = NULL;
    if (f != NV_FINISH_STOP) return "max_tokens";
    if (n_calls) return "tool_use";
    if (stop_index >= 0 && stop_index < m->n_stop) { /* not the template's own end-of-turn text */
        *stop_sequence = m->stop[stop_index];
        return "stop_sequence";
    }
    return "end_turn";
}

static cJSON *usage(const nv_anth_answer *a) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "input_tokens", a->prompt_tokens - a->cached_tokens);
    cJSON_AddNumberToObject(u, "cache_creation_input_tokens", 0);
    cJSON_AddNumberToObject(u, "cache_read_input_tokens", a->cached_tokens);
    cJSON_AddNumberToObject(u, "output_tokens", a->output_tokens);
    return u;
}

static cJSON *message_object(const nv_anth_meta *m) {
    cJSON *msg = cJSON_CreateObject();
    cJSON_AddStringToObject(msg, "id", m->id);
    cJSON_AddStringToObject(msg, "type", "message");
    cJSON_AddStringToObject(msg, "role", "assistant");
    cJSON_AddStringToObject(msg, "model", m->model);
    cJSON_AddArrayToObject(msg, "content");
    return msg;
}

static void set_stop(cJSON *o, const nv_anth_answer *a) {
    if (a && a->stop_reason) cJSON_AddStringToObject(o, "stop_reason", a->stop_reason);
    else cJSON_AddNullToObject(o, "stop_reason");
    if (a && a->stop_sequence) cJSON_AddStringToObject(o, "stop_sequence", a->stop_sequence);
    else cJSON_AddNullToObject(o, "stop_sequence");
}

/* A tool_use block; input: the call's arguments parsed (NULL: {} for the stream's start). */
static cJSON *tool_use_block(const nv_tool_call *c, int with_input) {
    cJSON *b = cJSON_CreateObject();
    char id[40];
    snprintf(id, sizeof id, "toolu_%s", strncmp(c->id, "call_", 5) ? c->id : c->id + 5);
    cJSON_AddStringToObject(b, "type", "tool_use");
    cJSON_AddStringToObject(b, "id", id);
    cJSON_AddStringToObject(b, "name", c->name);
    cJSON *input = with_input ? cJSON_Parse(c->arguments) : NULL; /* the parser printed it: it parses */
    cJSON_AddItemToObject(b, "input", input ? input : cJSON_CreateObject());
    return b;
}

static cJSON *text_block(const char *type, const char *key, const char *text) {
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "type", type);
    cJSON_AddStringToObject(b, key, text);
    if (!strcmp(type, "thinking")) cJSON_AddStringToObject(b, "signature", "");
    return b;
}

char *nv_anth_message(const nv_anth_meta *m, const nv_anth_answer *a) {
    cJSON *msg = message_object(m), *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
    if (a->reasoning && *a->reasoning) cJSON_AddItemToArray(content, text_block("thinking", "thinking", a->reasoning));
    /* the text, when there is any or nothing else: clients read content[0].text */
    if ((a->text && *a->text) || (!cJSON_GetArraySize(content) && !a->n_calls))
        cJSON_AddItemToArray(content, text_block("text", "text", a->text ? a->text : ""));
    for (int k = 0; k < a->n_calls; k++) cJSON_AddItemToArray(content, tool_use_block(&a->calls[k], 1));
    set_stop(msg, a);
    cJSON_AddItemToObject(msg, "usage", usage(a));
    return nv_api_print_free(msg);
}

char *nv_anth_count_json(int input_tokens) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "input_tokens", input_tokens);
    return nv_api_print_free(o);
}

static cJSON *model_object(const char *id, const char *at) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "type", "model");
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "display_name", id);
    cJSON_AddStringToObject(m, "created_at", at);
    return m;
}

char *nv_anth_models(const nv_api_ctx *ctx, long created, const char *single) {
    char at[32];
    time_t t = (time_t)created;
    strftime(at, sizeof at, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
    if (single) return nv_api_print_free(model_object(single, at));
    char ids[NV_MAX_ADAPTERS][NV_ADAPTER_NAME_CAP];
    const int n = nv_api_model_ids(ctx, ids);
    cJSON *list = cJSON_CreateObject();
    cJSON *data = cJSON_AddArrayToObject(list, "data");
    cJSON_AddItemToArray(data, model_object(ctx->model_id, at));
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(data, model_object(ids[i], at));
    cJSON_AddBoolToObject(list, "has_more", 0);
    cJSON_AddStringToObject(list, "first_id", ctx->model_id);
    cJSON_AddStringToObject(list, "last_id", n ? ids[n - 1] : ctx->model_id);
    return nv_api_print_free(list);
}

/* ---- the stream ---------------------------------------------------------------------------- */

/* "event: NAME\ndata: JSON\n\n"; takes data. */
static void event(nv_buf *out, cJSON *data) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(data, "type");
    char *s = data ? cJSON_PrintUnformatted(data) : NULL;
    if (s && cJSON_IsString(type)) nv_buf_printf(out, "event: %s\ndata: %s\n\n", type->valuestring, s);
    else out->oom = 1;
    free(s);
    cJSON_Delete(data);
}

static cJSON *indexed(const char *name, int index) {
    cJSON *o = ev(name);
    cJSON_AddNumberToObject(o, "index", index);
    return o;
}

void nv_anth_stream_start(nv_anth_stream *s, const nv_anth_meta *m, int prompt_tokens, int cached_tokens, nv_buf *out) {
    memset(s, 0, sizeof *s);
    s->m = m;
    cJSON *data = ev("message_start"), *msg = message_object(m);
    set_stop(msg, NULL);
    nv_anth_answer none = {.prompt_tokens = prompt_tokens, .cached_tokens = cached_tokens};
    cJSON_AddItemToObject(msg, "usage", usage(&none));
    cJSON_AddItemToObject(data, "message", msg);
    event(out, data);
    event(out, ev("ping"));
}

static void close_block(nv_anth_stream *s, nv_buf *out) {
    if (!s->open) return;
    event(out, indexed("content_block_stop", s->index++));
    s->open = 0;
}

void nv_anth_stream_text(nv_anth_stream *s, int thinking, const char *text, nv_buf *out) {
    const int kind = thinking ? 2 : 1;
    if (s->open != kind) {
        close_block(s, out);
        cJSON *start = indexed("content_block_start", s->index);
        cJSON_AddItemToObject(start, "content_block", thinking ? text_block("thinking", "thinking", "") : text_block("text", "text", ""));
        event(out, start);
        s->open = kind;
    }
    if (!*text) return;
    cJSON *d = indexed("content_block_delta", s->index), *delta = cJSON_AddObjectToObject(d, "delta");
    cJSON_AddStringToObject(delta, "type", thinking ? "thinking_delta" : "text_delta");
    cJSON_AddStringToObject(delta, thinking ? "thinking" : "text", text);
    event(out, d);
}

void nv_anth_stream_call(nv_anth_stream *s, const nv_tool_call *c, nv_buf *out) {
    close_block(s, out);
    cJSON *start = indexed("content_block_start", s->index);
    cJSON_AddItemToObject(start, "content_block", tool_use_block(c, 0));
    event(out, start);
    cJSON *d = indexed("content_block_delta", s->index), *delta = cJSON_AddObjectToObject(d, "delta");
    cJSON_AddStringToObject(delta, "type", "input_json_delta");
    cJSON_AddStringToObject(delta, "partial_json", c->arguments);
    event(out, d);
    event(out, indexed("content_block_stop", s->index++));
}

void nv_anth_stream_end(nv_anth_stream *s, const nv_anth_answer *a, nv_buf *out) {
    if (!s->open && s->index == 0) nv_anth_stream_text(s, 0, "", out); /* an empty answer still has its text block */
    close_block(s, out);
    cJSON *d = ev("message_delta"), *delta = cJSON_AddObjectToObject(d, "delta");
    set_stop(delta, a);
    cJSON_AddItemToObject(d, "usage", usage(a));
    event(out, d);
    event(out, ev("message_stop"));
}

void nv_anth_stream_error(const nv_api_error *e, nv_buf *out) {
    event(out, error_object(e)); /* {"type": "error", "error": {...}} */
}
