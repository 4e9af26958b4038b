#include "serve/responses.h"

#include "base/log.h"
#include "serve/files.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


static int bad(nv_api_error *err, const char *code, const char *param, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int bad(nv_api_error *err, const char *code, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char msg[sizeof err->message];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    nv_api_error_set(err, 400, "invalid_request_error", code, param, "%s", msg);
    return err->status;
}

static const char *type_of(const cJSON *o) { return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "type")); }

static cJSON *text_part(const char *type, const char *text) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", type);
    cJSON_AddStringToObject(p, "text", text);
    if (!strcmp(type, "output_text")) cJSON_AddArrayToObject(p, "annotations"), cJSON_AddArrayToObject(p, "logprobs");
    return p;
}

/* The text of a string or of a list of text parts (input_text, output_text; a refusal's text), into b. */
static int parts_text(const cJSON *v, const char *param, nv_buf *b, nv_api_error *err) {
    if (cJSON_IsString(v)) {
        nv_buf_puts(b, v->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(v)) return bad(err, NULL, param, "'%s' must be a string or a list of text parts", param);
    int k = 0;
    for (const cJSON *p = v->child; p; p = p->next, k++) {
        const char *t = type_of(p);
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(p, !t || strcmp(t, "refusal") ? "text" : "refusal");
        if (!t || (strcmp(t, "input_text") && strcmp(t, "output_text") && strcmp(t, "refusal")) || !cJSON_IsString(text))
            return bad(err, NULL, param, "'%s[%d]' must be a text part {\"type\": \"input_text\", \"text\": ...} (this model reads text only%s%.40s)",
                       param, k, t ? ": not " : "", t ? t : "");
        nv_buf_puts(b, text->valuestring);
    }
    return 0;
}

/* Adds {"role": role, "content": text} to msgs; NULL when out of memory. */
static cJSON *add_msg(cJSON *msgs, const char *role, const char *text) {
    cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddStringToObject(m, "role", role) || !cJSON_AddStringToObject(m, "content", text ? text : "")) {
        cJSON_Delete(m);
        return NULL;
    }
    cJSON_AddItemToArray(msgs, m);
    return m;
}

/* A function_call item as a call of the assistant turn it continues (or of a new one). */
static int add_call(cJSON *msgs, const cJSON *item, const char *param, nv_api_error *err) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(item, "call_id"), *name = cJSON_GetObjectItemCaseSensitive(item, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(item, "arguments");
    if (!cJSON_IsString(id) || !cJSON_IsString(name) || !cJSON_IsString(args))
        return bad(err, NULL, param, "'%s': a function_call item has 'call_id', 'name' and 'arguments' (JSON text)", param);
    cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
    const char *role = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(last, "role"));
    if (!role || strcmp(role, "assistant")) last = add_msg(msgs, "assistant", "");
    cJSON *calls = cJSON_GetObjectItemCaseSensitive(last, "tool_calls");
    if (last && !calls) calls = cJSON_AddArrayToObject(last, "tool_calls");
    cJSON *call = cJSON_CreateObject(), *fn = cJSON_CreateObject();
    if (!last || !calls || !call || !fn) {
        cJSON_Delete(call), cJSON_Delete(fn);
        return nv_api_oom(err);
    }
    cJSON_AddStringToObject(call, "id", id->valuestring);
    cJSON_AddStringToObject(call, "type", "function");
    cJSON_AddStringToObject(fn, "name", name->valuestring);
    cJSON_AddStringToObject(fn, "arguments", args->valuestring);
    cJSON_AddItemToObject(call, "function", fn);
    cJSON_AddItemToArray(calls, call);
    return 0;
}

/* The chat messages of items (a list): [0, base) the ones previous_response_id or the conversation
 * brings (named prior in errors), the request's own from base on (named own[i - base]). */
static int translate_input(const cJSON *in, const cJSON *items, int base, const char *prior, const char *own, cJSON *out,
                           nv_api_error *err) {
    cJSON *msgs = cJSON_AddArrayToObject(out, "messages");
    const cJSON *instr = nv_api_field(in, "instructions");
    if (!msgs) return nv_api_oom(err);
    if (instr && !cJSON_IsString(instr)) return bad(err, NULL, "instructions", "'instructions' must be a string");
    if (instr && *instr->valuestring && !add_msg(msgs, "system", instr->valuestring)) return nv_api_oom(err);
    int i = 0, rc = 0;
    for (const cJSON *item = items->child; item && !rc; item = item->next, i++) {
        char param[48];
        if (i < base) snprintf(param, sizeof param, "%s", prior);
        else snprintf(param, sizeof param, "%s[%d]", own, i - base);
        const char *t = type_of(item);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(item, "role");
        if (!cJSON_IsObject(item)) return bad(err, NULL, param, "'%s' must be an item object", param);
        if ((!t && role) || (t && !strcmp(t, "message"))) {
            const char *r = cJSON_GetStringValue(role);
            if (!r || (strcmp(r, "user") && strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "assistant")))
                return bad(err, NULL, param, "'%s.role' must be user, system, developer or assistant", param);
            nv_buf text = {0};
            snprintf(param + strlen(param), sizeof param - strlen(param), ".content");
            const cJSON *content = nv_api_field(item, "content");
            rc = content ? parts_text(content, param, &text, err) : bad(err, "missing_required_parameter", param, "'%s' is required", param);
            if (!rc && (text.oom || !add_msg(msgs, r, text.data))) rc = nv_api_oom(err);
            nv_buf_free(&text);
        } else if (t && !strcmp(t, "function_call")) {
            rc = add_call(msgs, item, param, err);
        } else if (t && !strcmp(t, "function_call_output")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(item, "call_id"), *output = nv_api_field(item, "output");
            if (!cJSON_IsString(id) || !output)
                return bad(err, NULL, param, "'%s': a function_call_output item has 'call_id' and 'output'", param);
            nv_buf text = {0};
            snprintf(param + strlen(param), sizeof param - strlen(param), ".output");
            rc = parts_text(output, param, &text, err);
            cJSON *m = rc || text.oom ? NULL : add_msg(msgs, "tool", text.data);
            if (m) cJSON_AddStringToObject(m, "tool_call_id", id->valuestring);
            else if (!rc) rc = nv_api_oom(err);
            nv_buf_free(&text);
        } else if (t && !strcmp(t, "reasoning")) {
            continue; /* an earlier turn's thinking: not shown to the model again */
        } else if (t && !strcmp(t, "item_reference")) {
            return bad(err, "unsupported_parameter", param, "'%s': item references are not supported: send the items whole (or previous_response_id)", param);
        } else {
            return bad(err, NULL, param, "'%s': items are messages, function_call, function_call_output and reasoning, not '%.40s'",
                       param, t ? t : "(no type)");
        }
    }
    return rc;
}

/* tools (flat function tools) and tool_choice into the chat shapes. */
static int translate_tools(const cJSON *in, cJSON *out, nv_api_error *err) {
    const cJSON *tools = nv_api_field(in, "tools"), *choice = nv_api_field(in, "tool_choice");
    if (tools) {
        if (!cJSON_IsArray(tools)) return bad(err, NULL, "tools", "'tools' must be a list of tools");
        cJSON *list = cJSON_AddArrayToObject(out, "tools");
        int i = 0;
        for (const cJSON *t = tools->child; t; t = t->next, i++) {
            const char *type = type_of(t);
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
            if (!cJSON_IsObject(t) || !type) return bad(err, NULL, "tools", "'tools[%d]' must be a tool object with a 'type'", i);
            if (strcmp(type, "function")) { /* hosted tools (web_search, local_shell, ...) run on OpenAI's side: none here */
                nv_warn("serve: /v1/responses: tool %d of type '%.40s' left out (this server runs function tools only)", i, type);
                continue;
            }
            if (!cJSON_IsString(name)) return bad(err, NULL, "tools", "'tools[%d].name' is required", i);
            cJSON *tool = cJSON_CreateObject(), *fn = cJSON_CreateObject();
            if (!list || !tool || !fn) {
                cJSON_Delete(tool), cJSON_Delete(fn);
                return nv_api_oom(err);
            }
            cJSON_AddItemToArray(list, tool);
            cJSON_AddStringToObject(tool, "type", "function");
            cJSON_AddItemToObject(tool, "function", fn);
            const char *keys[] = {"name", "description", "parameters", "strict"};
            for (int k = 0; k < 4; k++) /* the chat parser checks their types */
                if (cJSON_GetObjectItemCaseSensitive(t, keys[k]))
                    cJSON_AddItemToObject(fn, keys[k], cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(t, keys[k]), 1));
        }
    }
    if (choice && cJSON_IsObject(choice)) {
        const char *type = type_of(choice);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(choice, "name");
        if (!type || strcmp(type, "function") || !cJSON_IsString(name))
            return bad(err, NULL, "tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", \"name\": ...}");
        cJSON *c = cJSON_AddObjectToObject(out, "tool_choice");
        cJSON_AddStringToObject(c, "type", "function");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(c, "function"), "name", name->valuestring);
    } else if (choice) {
        cJSON_AddItemToObject(out, "tool_choice", cJSON_Duplicate(choice, 0)); /* a string: the chat parser's */
    }
    return 0;
}

/* text.format into response_format. */
static int translate_format(const cJSON *in, cJSON *out, nv_api_error *err) {
    const cJSON *text = nv_api_field(in, "text");
    if (!text) return 0;
    const cJSON *format = nv_api_field(text, "format");
    if (!cJSON_IsObject(text) || (format && !cJSON_IsObject(format)))
        return bad(err, NULL, "text", "'text' must be {\"format\": {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}}");
    const char *type = format ? type_of(format) : "text";
    if (!type) return bad(err, NULL, "text.format.type", "'text.format.type' is required");
    cJSON *rf = cJSON_AddObjectToObject(out, "response_format");
    cJSON_AddStringToObject(rf, "type", type); /* the chat parser names the types it takes */
    if (!strcmp(type, "json_schema")) {
        cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
        const char *keys[] = {"name", "schema", "strict"};
        for (int k = 0; k < 3; k++)
            if (cJSON_GetObjectItemCaseSensitive(format, keys[k]))
                cJSON_AddItemToObject(js, keys[k], cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(format, keys[k]), 1));
    }
    return 0;
}

/* The configuration a response repeats, as OpenAI's responses do. */
static cJSON *echo_of(const cJSON *in) {
    cJSON *e = cJSON_CreateObject();
    const char *keys[] = {"instructions", "max_output_tokens", "temperature", "top_p", "tools", "tool_choice",
                          "parallel_tool_calls", "text", "reasoning", "metadata", "user"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        const cJSON *v = nv_api_field(in, keys[k]);
        cJSON_AddItemToObject(e, keys[k], v ? cJSON_Duplicate(v, 1) : cJSON_CreateNull());
    }
    static const struct {
        const char *key;
        double v;
    } defaults[] = {{"temperature", 1}, {"top_p", 1}};
    for (int k = 0; k < 2; k++)
        if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(e, defaults[k].key)))
            cJSON_ReplaceItemInObjectCaseSensitive(e, defaults[k].key, cJSON_CreateNumber(defaults[k].v));
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(e, "tools"))) cJSON_ReplaceItemInObjectCaseSensitive(e, "tools", cJSON_CreateArray());
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(e, "tool_choice")))
        cJSON_ReplaceItemInObjectCaseSensitive(e, "tool_choice", cJSON_CreateString("auto"));
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(e, "parallel_tool_calls")))
        cJSON_ReplaceItemInObjectCaseSensitive(e, "parallel_tool_calls", cJSON_CreateTrue());
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(e, "text"))) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddStringToObject(cJSON_AddObjectToObject(t, "format"), "type", "text");
        cJSON_ReplaceItemInObjectCaseSensitive(e, "text", t);
    }
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(e, "metadata"))) cJSON_ReplaceItemInObjectCaseSensitive(e, "metadata", cJSON_CreateObject());
    cJSON_AddNullToObject(e, "previous_response_id"); /* both set by translate_cb */
    cJSON_AddBoolToObject(e, "store", 0);
    cJSON_AddStringToObject(e, "truncation", "disabled");
    cJSON_AddBoolToObject(e, "background", 0);
    cJSON_AddNullToObject(e, "conversation");
    return e;
}

static void normalize_items(cJSON *list);

/* The request's input as a list of items, each with a type and an id (a string: one user message). */
static int own_items(const cJSON *in, cJSON **out, nv_api_error *err) {
    const cJSON *input = nv_api_field(in, "input");
    if (!input) return bad(err, "missing_required_parameter", "input", "'input' is required");
    if (!cJSON_IsString(input) && (!cJSON_IsArray(input) || !input->child))
        return bad(err, NULL, "input", "'input' must be a string or a non-empty list of items");
    cJSON *list = cJSON_IsArray(input) ? cJSON_Duplicate(input, 1) : cJSON_CreateArray();
    if (list && cJSON_IsString(input)) {
        cJSON *m = cJSON_CreateObject(), *parts = cJSON_CreateArray();
        cJSON_AddItemToArray(list, m);
        cJSON_AddStringToObject(m, "type", "message");
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddItemToObject(m, "content", parts);
        cJSON_AddItemToArray(parts, text_part("input_text", input->valuestring));
    }
    if (!list) return nv_api_oom(err);
    normalize_items(list);
    char dup_id[128]; /* (an item is found by its id: input items list page by page after one) */
    const int dup = nv_items_duplicate_id(list, dup_id, sizeof dup_id);
    if (dup) {
        cJSON_Delete(list);
        return dup < 0 ? nv_api_oom(err) : bad(err, NULL, "input", "Duplicate item found with id '%.100s'", dup_id);
    }
    *out = list;
    return 0;
}

/* Each item of list with a type and an id, a message's string content as a list of parts: as OpenAI
 * lists input items. */
static void normalize_items(cJSON *list) {
    for (cJSON *it = list->child; it; it = it->next) {
        if (!cJSON_IsObject(it)) continue;
        const char *t = type_of(it);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role"), *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!t && role) cJSON_AddStringToObject(it, "type", t = "message");
        if (t && !strcmp(t, "message") && cJSON_IsString(content)) { /* listed as OpenAI lists it: a list of parts */
            const char *r = cJSON_GetStringValue(role);
            cJSON *parts = cJSON_CreateArray();
            cJSON_AddItemToArray(parts, text_part(r && !strcmp(r, "assistant") ? "output_text" : "input_text", content->valuestring));
            cJSON_ReplaceItemInObjectCaseSensitive(it, "content", parts);
        }
        const char *given = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "id"));
        if (given && *given && strlen(given) <= 100) continue; /* (else one is made: an item is found by its id) */
        const char *prefix = !t                                 ? "item_"
                             : !strcmp(t, "message")              ? "msg_"
                             : !strcmp(t, "function_call")        ? "fc_"
                             : !strcmp(t, "function_call_output") ? "fco_"
                             : !strcmp(t, "reasoning")            ? "rs_"
                                                                  : "item_";
        char id[48];
        nv_api_new_id(id, sizeof id, prefix);
        cJSON_DeleteItemFromObjectCaseSensitive(it, "id");
        cJSON_AddStringToObject(it, "id", id);
    }
}

/* The items previous_response_id continues from: what that response's model saw, then its output
 * (*out NULL when the request names none). */
static int previous_items(nv_resp_store *store, const cJSON *in, cJSON **out, nv_api_error *err) {
    const cJSON *prev = nv_api_field(in, "previous_response_id");
    *out = NULL;
    if (!prev) return 0;
    if (!store)
        return bad(err, "unsupported_parameter", "previous_response_id",
                   "'previous_response_id' is not supported: this server keeps no responses (serve --responses-store 0); send the whole conversation in 'input'");
    if (!cJSON_IsString(prev)) return bad(err, NULL, "previous_response_id", "'previous_response_id' must be a string");
    char *resp = NULL, *context = NULL;
    const int got = nv_resp_store_copy(store, prev->valuestring, &resp, &context, NULL);
    if (got < 0) return nv_api_oom(err);
    if (!got)
        return bad(err, "previous_response_not_found", "previous_response_id", "Previous response with id '%.100s' not found.",
                   prev->valuestring);
    cJSON *items = cJSON_Parse(context), *r = cJSON_Parse(resp);
    free(context), free(resp);
    const char *status = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "status"));
    if (status && (!strcmp(status, "queued") || !strcmp(status, "in_progress"))) { /* a background response still running */
        bad(err, NULL, "previous_response_id", "Previous response '%.100s' is %s: continue from it once it has ended", prev->valuestring,
            !strcmp(status, "queued") ? "queued" : "in progress");
        cJSON_Delete(items), cJSON_Delete(r);
        return err->status;
    }
    cJSON *output = cJSON_GetObjectItemCaseSensitive(r, "output");
    if (!cJSON_IsArray(items) || !cJSON_IsArray(output)) { /* what the store holds was written here: only memory fails */
        cJSON_Delete(items), cJSON_Delete(r);
        return nv_api_oom(err);
    }
    while (output->child) cJSON_AddItemToArray(items, cJSON_DetachItemViaPointer(output, output->child));
    cJSON_Delete(r);
    *out = items;
    return 0;
}

/* Text parts as kept: their type and text alone. */
static cJSON *kept_parts(const cJSON *content, int assistant) {
    cJSON *parts = cJSON_CreateArray();
    if (cJSON_IsString(content)) {
        cJSON_AddItemToArray(parts, text_part(assistant ? "output_text" : "input_text", content->valuestring));
        return parts;
    }
    for (const cJSON *p = cJSON_IsArray(content) ? content->child : NULL; p; p = p->next) {
        const char *t = type_of(p);
        const int refusal = t && !strcmp(t, "refusal");
        const char *text = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(p, refusal ? "refusal" : "text"));
        if (!t || !text) continue;
        cJSON *q = cJSON_CreateObject();
        cJSON_AddStringToObject(q, "type", t);
        cJSON_AddStringToObject(q, refusal ? "refusal" : "text", text);
        cJSON_AddItemToArray(parts, q);
    }
    return parts;
}

/* An item as a stored response keeps it: the fields the model is shown (messages, calls, their
 * outputs), nothing else; reasoning items, never shown again, are not kept. NULL: not kept. */
static cJSON *kept_item(const cJSON *it) {
    const char *t = type_of(it);
    static const char *const call_keys[] = {"id", "call_id", "name", "arguments"};
    if (t && (!strcmp(t, "function_call") || !strcmp(t, "function_call_output"))) {
        cJSON *k = cJSON_CreateObject();
        cJSON_AddStringToObject(k, "type", t);
        const int output = !strcmp(t, "function_call_output");
        for (int i = 0; i < (output ? 2 : 4); i++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(it, call_keys[i]);
            if (cJSON_IsString(v)) cJSON_AddStringToObject(k, call_keys[i], v->valuestring);
        }
        const cJSON *out = output ? cJSON_GetObjectItemCaseSensitive(it, "output") : NULL;
        if (out) cJSON_AddItemToObject(k, "output", cJSON_IsString(out) ? cJSON_CreateString(out->valuestring) : kept_parts(out, 0));
        return k;
    }
    if (!t || strcmp(t, "message")) return NULL;
    const char *role = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "role")), *id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "id"));
    cJSON *k = cJSON_CreateObject();
    cJSON_AddStringToObject(k, "type", "message");
    if (id) cJSON_AddStringToObject(k, "id", id);
    cJSON_AddStringToObject(k, "role", role ? role : "user");
    cJSON_AddItemToObject(k, "content", kept_parts(cJSON_GetObjectItemCaseSensitive(it, "content"), role && !strcmp(role, "assistant")));
    return k;
}

static cJSON *kept_items(const cJSON *list) {
    cJSON *k = list ? cJSON_CreateArray() : NULL;
    for (const cJSON *it = k ? list->child : NULL; it; it = it->next) {
        cJSON *x = kept_item(it);
        if (x) cJSON_AddItemToArray(k, x);
    }
    return k;
}

int nv_resp_items_take(const cJSON *items, const char *param, cJSON **out, nv_api_error *err) {
    cJSON *list = cJSON_Duplicate(items, 1), *in = cJSON_CreateObject(), *scratch = cJSON_CreateObject();
    int rc = list && in && scratch ? 0 : nv_api_oom(err);
    if (!rc) normalize_items(list);
    if (!rc) rc = translate_input(in, list, 0, "", param, scratch, err); /* checked as a request's input is */
    *out = rc ? NULL : kept_items(list);
    if (!rc && !*out) rc = nv_api_oom(err);
    cJSON_Delete(list), cJSON_Delete(in), cJSON_Delete(scratch);
    return rc;
}

typedef struct {
    int reasoning;
    nv_resp_store *store;
    nv_conv_store *convs;
    nv_resp_meta *meta;
    int count_only;   /* the prompt alone, to count it (POST /v1/responses/input_tokens) */
    int truncate;     /* truncation: "auto" */
    int drop;         /* the items dropped from the context's start (truncation) */
    int n_items;      /* the items of the context before any was dropped */
    long max_output;  /* max_output_tokens (0: not given) */
} translate_args;

/* The items of the conversation the request names (a conversation's id, or {"id": ...}), *out NULL
 * when it names none; the conversation noted in the meta, where the response's items go once it
 * finishes. own: the request's own items (none of them may be in it already). */
static int conversation_items(translate_args *a, const cJSON *in, const cJSON *own, cJSON **out, nv_api_error *err) {
    const cJSON *conv = nv_api_field(in, "conversation");
    *out = NULL;
    if (!conv) return 0;
    if (!a->convs)
        return bad(err, "unsupported_parameter", "conversation",
                   "'conversation' needs stored conversations: this server keeps none (serve --responses-store 0)");
    if (nv_api_field(in, "previous_response_id"))
        return bad(err, NULL, "conversation", "'conversation' and 'previous_response_id' cannot both be given");
    const cJSON *id = cJSON_IsObject(conv) ? cJSON_GetObjectItemCaseSensitive(conv, "id") : conv;
    if (!cJSON_IsString(id) || !*id->valuestring || strlen(id->valuestring) >= sizeof a->meta->conversation)
        return bad(err, NULL, "conversation", "'conversation' must be a conversation's id, or {\"id\": ...}");
    const int rc = nv_conv_context(a->convs, id->valuestring, own, out, err);
    if (!rc) {
        snprintf(a->meta->conversation, sizeof a->meta->conversation, "%s", id->valuestring);
        a->meta->convs = a->convs;
    }
    return rc;
}

static int translate(const cJSON *in, translate_args *a, cJSON *out, nv_api_error *err) {
    const cJSON *store = nv_api_field(in, "store"), *bg = nv_api_field(in, "background");
    if (store && !cJSON_IsBool(store)) return bad(err, NULL, "store", "'store' must be true or false");
    if (bg && !cJSON_IsBool(bg)) return bad(err, NULL, "background", "'background' must be true or false");
    if (cJSON_IsTrue(bg) && (!a->store || cJSON_IsFalse(store)))
        return bad(err, "unsupported_parameter", "background",
                   a->store ? "A background response is kept to be read later: 'store' must be true"
                            : "'background' needs stored responses: this server keeps none (serve --responses-store 0)");
    a->meta->background = cJSON_IsTrue(bg);
    const cJSON *trunc = nv_api_field(in, "truncation");
    if (trunc && (!cJSON_IsString(trunc) || (strcmp(trunc->valuestring, "auto") && strcmp(trunc->valuestring, "disabled"))))
        return bad(err, NULL, "truncation", "'truncation' must be 'auto' or 'disabled'");
    a->truncate = trunc && !strcmp(trunc->valuestring, "auto");
    const char *copy[] = {"model", "temperature", "top_p", "stream", "parallel_tool_calls", "user", "lora"};
    for (size_t k = 0; k < sizeof copy / sizeof copy[0]; k++) { /* the chat parser checks them */
        const int rc = nv_api_copy_field(in, out, copy[k], NULL, 'j', err);
        if (rc) return rc;
    }
    const cJSON *mot = nv_api_field(in, "max_output_tokens");
    if (mot) cJSON_AddItemToObject(out, "max_tokens", cJSON_Duplicate(mot, 0));
    a->max_output = cJSON_IsNumber(mot) && mot->valuedouble >= 1 ? (long)(mot->valuedouble < 1e9 ? mot->valuedouble : 1e9) : 0;
    const cJSON *md = nv_api_field(in, "metadata");
    if (md && !cJSON_IsNull(md) && (!cJSON_IsObject(md) || !nv_rec_metadata_ok(md))) /* (as OpenAI bounds it: each response repeats it) */
        return bad(err, NULL, "metadata", "'metadata' is an object of at most 16 strings, keys up to 64 characters, values up to 512");
    const cJSON *r = nv_api_field(in, "reasoning");
    if (r && !cJSON_IsObject(r)) return bad(err, NULL, "reasoning", "'reasoning' must be an object {\"effort\": ...}");
    const cJSON *effort = nv_api_field(r, "effort");
    if (effort && !nv_api_effort_level(cJSON_GetStringValue(effort)))
        return bad(err, NULL, "reasoning.effort", "'reasoning.effort' must be one of none, minimal, low, medium, high, xhigh");
    /* chat's reasoning_effort: the template's variable; none and minimal turn thinking off (Qwen3's switch) */
    if (effort) cJSON_AddStringToObject(out, "reasoning_effort", effort->valuestring);
    int rc;
    if ((rc = translate_tools(in, out, err)) || (rc = translate_format(in, out, err))) return rc;
    cJSON *own = NULL, *context = NULL;
    if ((rc = own_items(in, &own, err)) || (rc = conversation_items(a, in, own, &context, err)) ||
        (!context && (rc = previous_items(a->store, in, &context, err)))) {
        cJSON_Delete(own);
        return rc;
    }
    if (!context) context = cJSON_CreateArray();
    int base = cJSON_GetArraySize(context);
    for (const cJSON *it = own->child; it && context; it = it->next) cJSON_AddItemToArray(context, cJSON_Duplicate(it, 1));
    a->n_items = context ? cJSON_GetArraySize(context) : 0;
    cJSON *gone = a->drop ? cJSON_CreateArray() : NULL; /* truncation: the oldest first, never the last */
    for (int k = 0; k < a->drop && gone && context->child && context->child->next; k++, base--) /* (base below 0: own items dropped) */
        cJSON_AddItemToArray(gone, cJSON_DetachItemViaPointer(context, context->child));
    /* a call's output goes with its call (the calls dropped sorted: a body of many calls and outputs is
       not a product of the two, each time truncation tries a length) */
    int n_calls = 0;
    const char **calls = gone ? malloc(((size_t)cJSON_GetArraySize(gone) + 1) * sizeof *calls) : NULL;
    for (const cJSON *g = calls ? gone->child : NULL; g; g = g->next) {
        const char *call = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(g, "call_id"));
        if (call && type_of(g) && !strcmp(type_of(g), "function_call")) calls[n_calls++] = call;
    }
    if (n_calls > 1) qsort(calls, (size_t)n_calls, sizeof *calls, nv_strcmp_ptrs);
    for (cJSON *it = n_calls ? context->child : NULL, *next; it && it->next; it = next) {
        next = it->next;
        const char *t = type_of(it), *call = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "call_id"));
        if (call && t && !strcmp(t, "function_call_output") && bsearch(&call, calls, (size_t)n_calls, sizeof *calls, nv_strcmp_ptrs))
            cJSON_Delete(cJSON_DetachItemViaPointer(context, it)); /* (names no longer matter: the first parse checked every item) */
    }
    free(calls);
    if (a->drop && (!gone || !calls)) rc = nv_api_oom(err);
    cJSON_Delete(gone);
    if (!rc) rc = context ? translate_input(in, context, base, a->meta->convs ? "conversation" : "previous_response_id", "input", out, err)
                          : nv_api_oom(err);
    const int keep = a->store && !cJSON_IsFalse(store);
    if (!rc && (keep || a->meta->convs)) { /* kept, or added to the conversation, once it finishes, as kept_item gives them */
        if (keep) a->meta->keep = a->store;
        /* (the context only for a kept response: a conversation's items are the conversation's own) */
        a->meta->context = keep ? kept_items(context) : NULL, a->meta->input = kept_items(own);
        if ((keep && !a->meta->context) || !a->meta->input) rc = nv_api_oom(err);
    }
    cJSON_Delete(context), cJSON_Delete(own);
    return rc;
}

/* The chat parser's name of a field, as the Responses request calls it. */
static void rename_param(nv_api_error *err) {
    static const char *const map[][2] = {{"max_tokens", "max_output_tokens"},
                                         {"response_format.json_schema.schema", "text.format.schema"},
                                         {"response_format.json_schema", "text.format"},
                                         {"response_format.type", "text.format.type"},
                                         {"response_format", "text.format"},
                                         {"messages", "input"}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(err->param, map[i][0])) {
            snprintf(err->param, sizeof err->param, "%s", map[i][1]);
            return;
        }
}

void nv_resp_meta_free(nv_resp_meta *m) {
    cJSON_Delete(m->echo);
    cJSON_Delete(m->context);
    cJSON_Delete(m->input);
    memset(m, 0, sizeof *m);
}

/* The chat request, and the configuration every response object repeats. */
static int translate_cb(const cJSON *in, cJSON *chat, void *arg, nv_api_error *err) {
    translate_args *a = arg;
    int rc = translate(in, a, chat, err);
    if (!rc && !(a->meta->echo = echo_of(in))) rc = nv_api_oom(err);
    if (rc) return rc;
    const cJSON *prev = nv_api_field(in, "previous_response_id");
    cJSON_ReplaceItemInObjectCaseSensitive(a->meta->echo, "previous_response_id",
                                           prev ? cJSON_CreateString(prev->valuestring) : cJSON_CreateNull());
    cJSON_ReplaceItemInObjectCaseSensitive(a->meta->echo, "store", cJSON_CreateBool(a->meta->keep != NULL));
    cJSON_ReplaceItemInObjectCaseSensitive(a->meta->echo, "background", cJSON_CreateBool(a->meta->background));
    cJSON *conv = a->meta->convs ? cJSON_CreateObject() : cJSON_CreateNull();
    if (a->meta->convs) cJSON_AddStringToObject(conv, "id", a->meta->conversation);
    cJSON_ReplaceItemInObjectCaseSensitive(a->meta->echo, "conversation", conv);
    cJSON_ReplaceItemInObjectCaseSensitive(a->meta->echo, "truncation", cJSON_CreateString(a->truncate ? "auto" : "disabled"));
    return 0;
}

/* Whether a parsed request's prompt leaves too little room for its answer under truncation "auto":
   max_output_tokens (at most half of what one request can hold: the context, or the KV pool's
   share when smaller), or a quarter of that when not given. */
static int short_of_room(const nv_api_ctx *ctx, const translate_args *a, const nv_api_request *r) {
    const long limit = ctx->capacity + 1 < ctx->seq_len ? ctx->capacity + 1 : ctx->seq_len; /* what one request can hold */
    const long want = a->max_output ? (a->max_output < limit / 2 ? a->max_output : limit / 2) : limit / 4;
    return r->req.n_prompt + want > limit;
}

/* nv_resp_parse's parse, dropping the context's first `drop` items. */
static int parse_dropping(const nv_api_ctx *ctx, const char *body, size_t len, translate_args *a, int drop, nv_api_request *out,
                          nv_api_error *err) {
    nv_resp_meta_free(a->meta);
    a->drop = drop;
    const nv_api_parse_opts o = {.max_stop = 4, .max_tokens_cap = 1, .count_only = a->count_only};
    return nv_api_parse_translated(ctx, body, len, translate_cb, a, &o, out, err);
}

static int parse(const nv_api_ctx *ctx, nv_resp_store *store, nv_conv_store *convs, const char *body, size_t len, int count_only,
                 nv_api_request *out, nv_resp_meta *meta, nv_api_error *err) {
    memset(meta, 0, sizeof *meta);
    translate_args a = {.reasoning = ctx->reasoning, .store = store, .convs = convs, .meta = meta, .count_only = count_only};
    int rc = parse_dropping(ctx, body, len, &a, 0, out, err);
    const int over = rc ? err->code && !strcmp(err->code, "context_length_exceeded") : short_of_room(ctx, &a, out);
    if (a.truncate && over && a.n_items > 1) { /* truncation "auto": the fewest of the oldest items dropped that make room */
        const nv_api_error first = *err;
        const int whole = rc, n = a.n_items;
        int lo = 1, hi = n - 1, best = -1, most = -1, other = 0; /* most: the largest count that parsed */
        if (!rc) nv_api_request_free(out);
        while (lo <= hi && !other) { /* (dropping more never lengthens the prompt) */
            const int mid = lo + (hi - lo) / 2;
            rc = parse_dropping(ctx, body, len, &a, mid, out, err);
            other = rc && !(err->code && !strcmp(err->code, "context_length_exceeded")); /* (that error stands) */
            const int fits = !rc && !short_of_room(ctx, &a, out);
            if (!rc) most = mid > most ? mid : most, nv_api_request_free(out);
            if (fits) best = mid, hi = mid - 1;
            else lo = mid + 1;
        }
        const int pick = best > 0 ? best : most > 0 ? most : whole ? -1 : 0; /* none enough: the most room there was */
        if (!other && pick >= 0) rc = parse_dropping(ctx, body, len, &a, pick, out, err);
        else if (!other) *err = first, rc = whole; /* (nothing dropped makes it parse: the request's own error) */
    }
    if (rc) {
        rename_param(err);
        nv_resp_meta_free(meta);
        return rc;
    }
    nv_api_new_id(meta->id, sizeof meta->id, "resp_");
    meta->created = (long)time(NULL);
    snprintf(meta->model, sizeof meta->model, "%s", out->model);
    return 0;
}

int nv_resp_parse(const nv_api_ctx *ctx, nv_resp_store *store, nv_conv_store *convs, const char *body, size_t len,
                  nv_api_request *out, nv_resp_meta *meta, nv_api_error *err) {
    return parse(ctx, store, convs, body, len, 0, out, meta, err);
}

int nv_resp_input_tokens(const nv_api_ctx *ctx, nv_resp_store *store, nv_conv_store *convs, const char *body, size_t len, char **out,
                         nv_api_error *err) {
    nv_api_request r;
    nv_resp_meta m;
    const int rc = parse(ctx, store, convs, body, len, 1, &r, &m, err);
    if (rc) return rc;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "response.input_tokens");
    cJSON_AddNumberToObject(o, "input_tokens", r.req.n_prompt);
    nv_api_request_free(&r);
    nv_resp_meta_free(&m);
    return (*out = nv_api_print_free(o)) ? 0 : nv_api_oom(err);
}

/* ---- output items and the response ------------------------------------------------------------- */


/* An item's id: its kind's prefix, the response's hex and the item's index. */
static void item_id(char *out, size_t cap, const nv_resp_meta *m, const char *prefix, int index) {
    snprintf(out, cap, "%s_%.32s%02x", prefix, m->id + strlen("resp_"), index & 0xff);
}


/* A message item (reasoning 0) or a reasoning item with the text so far (NULL: no part yet). */
static cJSON *text_item(const nv_resp_meta *m, int reasoning, int index, const char *text, const char *status) {
    char id[64];
    item_id(id, sizeof id, m, reasoning ? "rs" : "msg", index);
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "type", reasoning ? "reasoning" : "message");
    cJSON_AddStringToObject(it, "id", id);
    if (reasoning) cJSON_AddArrayToObject(it, "summary");
    else cJSON_AddStringToObject(it, "status", status), cJSON_AddStringToObject(it, "role", "assistant");
    cJSON *content = cJSON_AddArrayToObject(it, "content");
    if (text) cJSON_AddItemToArray(content, text_part(reasoning ? "reasoning_text" : "output_text", text));
    return it;
}

static cJSON *call_item(const nv_resp_meta *m, int index, const nv_tool_call *c, const char *arguments, const char *status) {
    char id[64];
    item_id(id, sizeof id, m, "fc", index);
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "type", "function_call");
    cJSON_AddStringToObject(it, "id", id);
    cJSON_AddStringToObject(it, "call_id", c->id);
    cJSON_AddStringToObject(it, "name", c->name);
    cJSON_AddStringToObject(it, "arguments", arguments);
    cJSON_AddStringToObject(it, "status", status);
    return it;
}

/* The response object: status, its output items (taken), usage when a is given. */
static cJSON *response_object(const nv_resp_meta *m, const char *status, cJSON *items, const nv_resp_answer *a) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", m->id);
    cJSON_AddStringToObject(r, "object", "response");
    cJSON_AddNumberToObject(r, "created_at", (double)m->created);
    cJSON_AddStringToObject(r, "status", status);
    cJSON_AddNullToObject(r, "error");
    if (!strcmp(status, "incomplete")) cJSON_AddStringToObject(cJSON_AddObjectToObject(r, "incomplete_details"), "reason", "max_output_tokens");
    else cJSON_AddNullToObject(r, "incomplete_details");
    cJSON_AddStringToObject(r, "model", m->model);
    cJSON_AddItemToObject(r, "output", items ? items : cJSON_CreateArray());
    for (const cJSON *e = m->echo ? m->echo->child : NULL; e; e = e->next) cJSON_AddItemToObject(r, e->string, cJSON_Duplicate(e, 1));
    if (!a) {
        cJSON_AddNullToObject(r, "usage");
        return r;
    }
    cJSON *u = cJSON_AddObjectToObject(r, "usage");
    cJSON_AddNumberToObject(u, "input_tokens", a->prompt_tokens);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "input_tokens_details"), "cached_tokens", a->cached_tokens);
    cJSON_AddNumberToObject(u, "output_tokens", a->output_tokens);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "output_tokens_details"), "reasoning_tokens", 0);
    cJSON_AddNumberToObject(u, "total_tokens", a->prompt_tokens + a->output_tokens);
    return r;
}

/* A response into the store (when there is one), with the items its model saw and its own input;
   *kept, when kept is not NULL: whether the store took it. */
static void keep(const nv_resp_meta *m, const cJSON *response, int *kept) {
    int done = 0;
    if (m->keep) {
        char *r = cJSON_PrintUnformatted(response), *c = cJSON_PrintUnformatted(m->context), *in = cJSON_PrintUnformatted(m->input);
        if (r && c && in) {
            done = nv_resp_store_put(m->keep, m->id, r, c, in);
        } else {
            nv_warn("serve: response %s not kept: out of memory", m->id);
            free(r), free(c), free(in);
        }
    }
    if (kept) *kept = done;
}

/* A finished response's input and output items added to its conversation (when it has one). */
static void add_to_conversation(const nv_resp_meta *m, const cJSON *response) {
    if (!m->convs) return;
    cJSON *items = cJSON_Duplicate(m->input, 1), *out = kept_items(cJSON_GetObjectItemCaseSensitive(response, "output"));
    while (items && out && out->child) cJSON_AddItemToArray(items, cJSON_DetachItemViaPointer(out, out->child));
    if (items && out) nv_conv_append(m->convs, m->conversation, items);
    else nv_warn("serve: conversation %s: the response's items not added: out of memory", m->conversation);
    cJSON_Delete(items), cJSON_Delete(out);
}

char *nv_resp_response(const nv_resp_meta *m, const nv_resp_answer *a, int *kept) {
    cJSON *items = cJSON_CreateArray();
    int k = 0;
    if (a->reasoning && *a->reasoning) cJSON_AddItemToArray(items, text_item(m, 1, k++, a->reasoning, "completed"));
    /* the message when it has text or nothing else came (clients read output_text) */
    if ((a->text && *a->text) || !a->n_calls)
        cJSON_AddItemToArray(items, text_item(m, 0, k++, a->text ? a->text : "", a->incomplete && !a->n_calls ? "incomplete" : "completed"));
    for (int c = 0; c < a->n_calls; c++) cJSON_AddItemToArray(items, call_item(m, k++, &a->calls[c], a->calls[c].arguments, "completed"));
    cJSON *r = response_object(m, a->incomplete ? "incomplete" : "completed", items, a);
    keep(m, r, kept);
    add_to_conversation(m, r);
    return nv_api_print_free(r);
}

/* The response object's error: {"code", "message"} of e (its type when it has no code). */
static void set_error(cJSON *r, const nv_api_error *e) {
    cJSON *err = cJSON_CreateObject();
    cJSON_AddStringToObject(err, "code", e->code ? e->code : e->type ? e->type : "server_error");
    cJSON_AddStringToObject(err, "message", e->message);
    cJSON_ReplaceItemInObjectCaseSensitive(r, "error", err);
}

char *nv_resp_unfinished(const nv_resp_meta *m, const char *status, const nv_api_error *e, int *kept) {
    cJSON *r = response_object(m, status, NULL, NULL);
    if (e && e->status) set_error(r, e);
    keep(m, r, kept);
    return nv_api_print_free(r);
}

/* ---- the stream --------------------------------------------------------------------------------- */

/* "event: TYPE\ndata: {"type": TYPE, "sequence_number": n, ...fields}\n\n"; takes fields (an object). */
static void event(nv_resp_stream *s, const char *type, cJSON *fields, nv_buf *out) {
    cJSON *e = cJSON_CreateObject();
    char *json = NULL;
    if (e && fields) {
        cJSON_AddStringToObject(e, "type", type);
        cJSON_AddNumberToObject(e, "sequence_number", s->seq++);
        while (fields->child) {
            cJSON *f = cJSON_DetachItemViaPointer(fields, fields->child);
            cJSON_AddItemToObject(e, f->string, f);
        }
        json = cJSON_PrintUnformatted(e);
    }
    cJSON_Delete(e);
    cJSON_Delete(fields);
    if (!json) {
        out->oom = 1;
        return;
    }
    nv_buf_printf(out, "event: %s\ndata: %s\n\n", type, json);
    free(json);
}

/* {"output_index": i, "item_id": id (when given)} */
static cJSON *at(int index, const char *item_id) {
    cJSON *o = cJSON_CreateObject();
    if (item_id) cJSON_AddStringToObject(o, "item_id", item_id);
    cJSON_AddNumberToObject(o, "output_index", index);
    return o;
}

static cJSON *with_item(cJSON *o, cJSON *item) {
    cJSON_AddItemToObject(o, "item", item);
    return o;
}

/* An event carrying the response as it stands, without output: response.created, .queued, .in_progress. */
static void status_event(nv_resp_stream *s, const char *type, const char *status, nv_buf *out) {
    cJSON *f = cJSON_CreateObject();
    cJSON_AddItemToObject(f, "response", response_object(s->m, status, NULL, NULL));
    event(s, type, f, out);
}

void nv_resp_stream_start(nv_resp_stream *s, const nv_resp_meta *m, nv_buf *out) {
    memset(s, 0, sizeof *s);
    s->m = m;
    s->items = cJSON_CreateArray();
    if (!s->items) out->oom = 1;
    const char *status = m->background ? "queued" : "in_progress";
    status_event(s, "response.created", status, out);
    if (m->background) status_event(s, "response.queued", status, out);
    else nv_resp_stream_running(s, out);
}

void nv_resp_stream_running(nv_resp_stream *s, nv_buf *out) { status_event(s, "response.in_progress", "in_progress", out); }

/* {"item_id", "output_index", "content_index": 0} of the open item's part */
static cJSON *part_at(const nv_resp_stream *s, const char *id) {
    cJSON *f = at(s->index, id);
    cJSON_AddNumberToObject(f, "content_index", 0);
    return f;
}

static void close_item(nv_resp_stream *s, const char *status, nv_buf *out) {
    if (!s->open) return;
    const int reasoning = s->open == 2;
    const char *text = s->text.data ? s->text.data : "", *part = reasoning ? "reasoning_text" : "output_text";
    char id[64];
    item_id(id, sizeof id, s->m, reasoning ? "rs" : "msg", s->index);
    cJSON *f = part_at(s, id);
    cJSON_AddStringToObject(f, "text", text);
    if (!reasoning) cJSON_AddArrayToObject(f, "logprobs");
    event(s, reasoning ? "response.reasoning_text.done" : "response.output_text.done", f, out);
    f = part_at(s, id);
    cJSON_AddItemToObject(f, "part", text_part(part, text));
    event(s, "response.content_part.done", f, out);
    event(s, "response.output_item.done", with_item(at(s->index, NULL), text_item(s->m, reasoning, s->index, text, status)), out);
    cJSON_AddItemToArray(s->items, text_item(s->m, reasoning, s->index, text, status));
    if (s->text.oom) out->oom = 1;
    nv_buf_free(&s->text);
    s->open = 0;
    s->index++;
}

void nv_resp_stream_text(nv_resp_stream *s, int reasoning, const char *text, nv_buf *out) {
    const int kind = reasoning ? 2 : 1;
    if (s->open != kind) {
        close_item(s, "completed", out);
        s->open = kind;
        s->answered |= !reasoning;
        char id[64];
        item_id(id, sizeof id, s->m, reasoning ? "rs" : "msg", s->index);
        event(s, "response.output_item.added", with_item(at(s->index, NULL), text_item(s->m, reasoning, s->index, NULL, "in_progress")), out);
        cJSON *f = part_at(s, id);
        cJSON_AddItemToObject(f, "part", text_part(reasoning ? "reasoning_text" : "output_text", ""));
        event(s, "response.content_part.added", f, out);
    }
    if (!*text) return;
    char id[64];
    item_id(id, sizeof id, s->m, reasoning ? "rs" : "msg", s->index);
    nv_buf_puts(&s->text, text);
    cJSON *f = part_at(s, id);
    cJSON_AddStringToObject(f, "delta", text);
    if (!reasoning) cJSON_AddArrayToObject(f, "logprobs");
    event(s, reasoning ? "response.reasoning_text.delta" : "response.output_text.delta", f, out);
}

void nv_resp_stream_call(nv_resp_stream *s, const nv_tool_call *c, nv_buf *out) {
    close_item(s, "completed", out);
    s->answered = 1;
    char id[64];
    item_id(id, sizeof id, s->m, "fc", s->index);
    event(s, "response.output_item.added", with_item(at(s->index, NULL), call_item(s->m, s->index, c, "", "in_progress")), out);
    cJSON *f = at(s->index, id);
    cJSON_AddStringToObject(f, "delta", c->arguments);
    event(s, "response.function_call_arguments.delta", f, out);
    f = at(s->index, id);
    cJSON_AddStringToObject(f, "name", c->name);
    cJSON_AddStringToObject(f, "arguments", c->arguments);
    event(s, "response.function_call_arguments.done", f, out);
    event(s, "response.output_item.done", with_item(at(s->index, NULL), call_item(s->m, s->index, c, c->arguments, "completed")), out);
    cJSON_AddItemToArray(s->items, call_item(s->m, s->index, c, c->arguments, "completed"));
    s->index++;
}

void nv_resp_stream_end(nv_resp_stream *s, const nv_resp_answer *a, nv_buf *out, int *kept) {
    /* a message whenever there is text or nothing else, as in nv_resp_response */
    if (!s->answered) nv_resp_stream_text(s, 0, "", out);
    const char *status = a->incomplete ? "incomplete" : "completed";
    close_item(s, s->open == 1 ? status : "completed", out);
    cJSON *f = cJSON_CreateObject(), *r = response_object(s->m, status, s->items, a);
    s->items = NULL;
    keep(s->m, r, kept);
    add_to_conversation(s->m, r);
    cJSON_AddItemToObject(f, "response", r);
    event(s, a->incomplete ? "response.incomplete" : "response.completed", f, out);
}

void nv_resp_stream_fail(nv_resp_stream *s, const char *status, const nv_api_error *e, nv_buf *out, int *kept) {
    close_item(s, "incomplete", out); /* what was said so far stays in the output */
    cJSON *r = response_object(s->m, status, s->items, NULL);
    s->items = NULL;
    if (e) set_error(r, e);
    if (kept) *kept = 0;
    if (s->m->background) keep(s->m, r, kept); /* (a request's own stream keeps only what finished) */
    cJSON *f = cJSON_CreateObject();
    cJSON_AddItemToObject(f, "response", r);
    event(s, "response.failed", f, out);
}

void nv_resp_stream_free(nv_resp_stream *s) {
    cJSON_Delete(s->items);
    nv_buf_free(&s->text);
    s->items = NULL;
}

/* ---- stored responses: GET, DELETE, input items ----------------------------------------------- */

static int not_kept(nv_resp_store *st, const char *id, nv_api_error *err) {
    nv_api_error_set(err, 404, "invalid_request_error", "not_found", NULL, "%s%.100s%s", st ? "Response with id '" : "", st ? id : "",
                     st ? "' not found." : "This server keeps no responses (serve --responses-store 0)");
    return err->status;
}

int nv_resp_get(nv_resp_store *s, const char *id, char **out, nv_api_error *err) {
    const int got = s ? nv_resp_store_copy(s, id, out, NULL, NULL) : 0;
    return got > 0 ? 0 : got < 0 ? nv_api_oom(err) : not_kept(s, id, err);
}

int nv_resp_delete(nv_resp_store *s, const char *id, char **out, nv_api_error *err) {
    if (!s || !nv_resp_store_delete(s, id)) return not_kept(s, id, err);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", "response");
    cJSON_AddBoolToObject(o, "deleted", 1);
    return (*out = nv_api_print_free(o)) ? 0 : nv_api_oom(err);
}

int nv_resp_input_items(nv_resp_store *s, const char *id, const char *limit, const char *order, const char *after, char **out,
                        nv_api_error *err) {
    char *text = NULL;
    const int got = s ? nv_resp_store_copy(s, id, NULL, NULL, &text) : 0;
    if (got <= 0) return got < 0 ? nv_api_oom(err) : not_kept(s, id, err);
    cJSON *items = cJSON_Parse(text);
    free(text);
    if (!items) return nv_api_oom(err);
    char owner[160];
    snprintf(owner, sizeof owner, "response '%.100s'", id);
    return nv_resp_item_page(items, limit, order, after, owner, out, err);
}

int nv_resp_item_page_of(const cJSON *items, const char *limit, const char *order, const char *after, const char *owner, char **out,
                         nv_api_error *err) {
    long n = 20;
    if (limit) {
        char *end;
        n = strtol(limit, &end, 10);
        if (!*limit || *end || n < 1 || n > 100) {
            return bad(err, NULL, "limit", "'limit' must be a whole number from 1 to 100, not '%.40s'", limit);
        }
    }
    if (order && strcmp(order, "asc") && strcmp(order, "desc")) {
        return bad(err, NULL, "order", "'order' must be 'asc' or 'desc', not '%.40s'", order);
    }
    const int asc = order && !strcmp(order, "asc");
    cJSON *data = cJSON_CreateArray(), *o = cJSON_CreateObject();
    if (!data || !o) {
        cJSON_Delete(data), cJSON_Delete(o);
        return nv_api_oom(err);
    }
    const int total = cJSON_GetArraySize(items);
    const cJSON **list = malloc(((size_t)total + 1) * sizeof *list); /* indexed: cJSON_GetArrayItem walks from the start */
    if (!list) {
        cJSON_Delete(data), cJSON_Delete(o);
        return nv_api_oom(err);
    }
    int k = 0;
    for (const cJSON *it = items->child; it; it = it->next) list[k++] = it;
    int at = asc ? 0 : total - 1, found = after == NULL;
    for (; at >= 0 && at < total && !found; at += asc ? 1 : -1) { /* the item after `after`, in this order */
        const char *iid = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(list[at], "id"));
        found = iid && !strcmp(iid, after);
    }
    if (!found) {
        free(list);
        cJSON_Delete(data), cJSON_Delete(o);
        return bad(err, NULL, "after", "'after': %s has no item '%.100s'", owner, after);
    }
    int taken = 0;
    for (; at >= 0 && at < total && taken < n; at += asc ? 1 : -1, taken++) cJSON_AddItemToArray(data, cJSON_Duplicate(list[at], 1));
    const int more = at >= 0 && at < total;
    free(list);
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddItemToObject(o, "data", data);
    const char *first = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(data->child, "id"));
    const char *last = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(data, cJSON_GetArraySize(data) - 1), "id"));
    cJSON_AddItemToObject(o, "first_id", first ? cJSON_CreateString(first) : cJSON_CreateNull());
    cJSON_AddItemToObject(o, "last_id", last ? cJSON_CreateString(last) : cJSON_CreateNull());
    cJSON_AddBoolToObject(o, "has_more", more);
    return (*out = nv_api_print_free(o)) ? 0 : nv_api_oom(err);
}


int nv_resp_item_page(cJSON *items, const char *limit, const char *order, const char *after, const char *owner, char **out,
                      nv_api_error *err) {
    const int rc = nv_resp_item_page_of(items, limit, order, after, owner, out, err);
    cJSON_Delete(items);
    return rc;
}
