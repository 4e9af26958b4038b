#include "model/think.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

size_t nv_partial_tag(const char *s, size_t n, const char *tag) {
    const size_t tl = strlen(tag);
    for (size_t k = tl - 1 < n ? tl - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, tag, k)) return k;
    return 0;
}

#define H_MESSAGE "<|message|>"
#define H_END "<|end|>"
#define H_FINAL "<|end|><|start|>assistant" NV_HARMONY_FINAL_HEADER
#define H_HEADER_MAX 1024 /* the most bytes a message header may take */

const nv_think_tags *nv_think_tags_of(int tags) {
    static const nv_think_tags angle = {"<think>", "</think>", "\n</think>\n\n"}, bracket = {"[THINK]", "[/THINK]", "[/THINK]"},
                               harmony = {"<|channel|>analysis" H_MESSAGE, H_END, H_FINAL};
    return tags == NV_THINK_BRACKET ? &bracket : tags == NV_THINK_HARMONY ? &harmony : &angle;
}

int nv_think_tags_of_template(const char *text, int *shown) {
    const int harmony = text && strstr(text, "<|channel|>") && strstr(text, "analysis");
    const int bracket = text && strstr(text, "[THINK]") && strstr(text, "[/THINK]");
    if (shown) *shown = harmony || bracket || (text && strstr(text, "<think>"));
    return harmony ? NV_THINK_HARMONY : bracket ? NV_THINK_BRACKET : NV_THINK_ANGLE;
}

void nv_think_show_tags(nv_tokenizer *tok, int tags) {
    if (tags != NV_THINK_BRACKET) return;
    const nv_think_tags *t = nv_think_tags_of(tags);
    nv_tokenizer_show(tok, t->open);
    nv_tokenizer_show(tok, t->close);
}

static void put(nv_buf *b, const char *s, size_t n) {
    if (b && n) nv_buf_append(b, s, n);
}

/* ---- harmony ---- */

enum { H_HEADER = 0, H_REASONING, H_CONTENT, H_CALL, H_RAW /* no harmony: all content */ };

/* The word of header h (n bytes) after key ("<|channel|>", "to="), up to white space or '<', into out. */
static void header_word(const char *h, size_t n, const char *key, char *out, size_t cap) {
    const char *at = memmem(h, n, key, strlen(key));
    size_t k = 0;
    for (const char *p = at ? at + strlen(key) : h + n; p < h + n && *p != ' ' && *p != '<' && *p != '\n' && k + 1 < cap; p++) out[k++] = *p;
    out[k] = '\0';
}

/* A tool call's message ended: Hermes's block of it into the content. */
static void harmony_call(nv_think *t, nv_buf *content) {
    if (!content) { /* (followed only) */
        nv_buf_free(&t->call);
        return;
    }
    cJSON *args = cJSON_ParseWithLength(t->call.data ? t->call.data : "", t->call.len), *block = cJSON_CreateObject();
    if (!args) { /* not a JSON value: its text */
        nv_buf_append(&t->call, "", 1);
        args = cJSON_CreateString(t->call.oom ? "" : t->call.data);
    }
    cJSON_AddStringToObject(block, "name", t->call_name);
    if (args) cJSON_AddItemToObject(block, "arguments", args);
    char *json = cJSON_PrintUnformatted(block);
    if (json) nv_buf_printf(content, "<tool_call>%s</tool_call>", json);
    free(json);
    cJSON_Delete(block);
    nv_buf_free(&t->call);
}

static size_t harmony_feed(nv_think *t, const char *h, size_t len, int final, nv_buf *reasoning, nv_buf *content) {
    size_t used = 0;
    while (used < len) {
        const char *p = h + used;
        const size_t left = len - used;
        if (t->route == H_RAW) {
            put(content, p, left);
            return len;
        }
        if (t->route == H_HEADER && t->state == NV_THINK_IN) { /* a prompt that opened the analysis: its text first */
            t->route = H_REASONING;
            continue;
        }
        if (t->route == H_HEADER) {
            /* (a header's end looked for in its first bytes alone: the same however the text comes) */
            const size_t scan = left < H_HEADER_MAX ? left : H_HEADER_MAX;
            const char *m = memmem(p, scan, H_MESSAGE, strlen(H_MESSAGE));
            /* a header starts with its markers; anything else (a model off the format) is content */
            const int marked = !strncmp(p, "<|start|>", left < 9 ? left : 9) || !strncmp(p, "<|channel|>", left < 11 ? left : 11);
            if (!marked || (!m && (final || left >= H_HEADER_MAX))) {
                t->route = H_RAW, t->state = NV_THINK_PAST;
                continue;
            }
            if (!m) break; /* the header goes on */
            char channel[32], to[128];
            header_word(p, (size_t)(m - p), "<|channel|>", channel, sizeof channel);
            header_word(p, (size_t)(m - p), "to=", to, sizeof to);
            if (!strncmp(to, "functions.", 10)) {
                t->route = H_CALL;
                snprintf(t->call_name, sizeof t->call_name, "%s", to + 10);
            } else
                t->route = !strcmp(channel, "analysis") ? H_REASONING : H_CONTENT;
            t->state = t->route == H_REASONING ? NV_THINK_IN : NV_THINK_PAST;
            used += (size_t)(m - p) + strlen(H_MESSAGE);
            continue;
        }
        nv_buf *to = t->route == H_REASONING ? reasoning : t->route == H_CONTENT ? content : &t->call;
        const char *end = memmem(p, left, H_END, strlen(H_END));
        const size_t body = end ? (size_t)(end - p) : final ? left : left - nv_partial_tag(p, left, H_END);
        put(to, p, body);
        used += body + (end ? strlen(H_END) : 0);
        if (end || final) { /* between messages: nothing is reasoning until an analysis header */
            if (t->route == H_CALL) harmony_call(t, content);
            t->route = H_HEADER, t->state = NV_THINK_PAST;
        }
        if (!end) break;
    }
    if (final && t->route == H_CALL) { /* its message's text came whole before the final piece */
        harmony_call(t, content);
        t->route = H_HEADER, t->state = NV_THINK_PAST;
    }
    return used;
}

void nv_think_feed(nv_think *t, const char *s, size_t n, int final, nv_buf *reasoning, nv_buf *content) {
    if (t->tags == NV_THINK_HARMONY) {
        nv_buf_append(&t->hold, s, n);
        nv_buf_consume(&t->hold, harmony_feed(t, t->hold.data ? t->hold.data : "", t->hold.len, final, reasoning, content));
        return;
    }
    const nv_think_tags *tags = nv_think_tags_of(t->tags);
    const char *open = tags->open, *close = tags->close;
    const size_t ol = strlen(open), cl = strlen(close);
    nv_buf_append(&t->hold, s, n);
    const char *h = t->hold.data ? t->hold.data : "";
    size_t len = t->hold.len, used = 0;
    for (;;) {
        const char *p = h + used;
        const size_t left = len - used;
        if (t->state == NV_THINK_UNDECIDED) {
            size_t ws = 0;
            while (ws < left && (p[ws] == ' ' || p[ws] == '\n' || p[ws] == '\r' || p[ws] == '\t')) ws++;
            const size_t rest = left - ws;
            if (rest >= ol && !memcmp(p + ws, open, ol)) {
                used += ws + ol;
                t->state = NV_THINK_IN;
                continue;
            }
            if (!final && (rest == 0 || (rest < ol && !memcmp(p + ws, open, rest)))) break; /* not known yet */
            t->state = NV_THINK_PAST;
            continue;
        }
        if (t->state == NV_THINK_IN) {
            const char *end = memmem(p, left, close, cl);
            if (end) {
                put(reasoning, p, (size_t)(end - p));
                used += (size_t)(end - p) + cl;
                t->state = NV_THINK_PAST_NL;
                continue;
            }
            const size_t keep = final ? 0 : nv_partial_tag(p, left, close);
            put(reasoning, p, left - keep);
            used += left - keep;
            break;
        }
        if (t->state == NV_THINK_PAST_NL) {
            while (used < len && (h[used] == '\n' || h[used] == '\r')) used++;
            if (used == len) break;
            t->state = NV_THINK_PAST;
        }
        put(content, h + used, len - used);
        used = len;
        break;
    }
    nv_buf_consume(&t->hold, used); /* what is left waits for the next piece */
}

void nv_think_free(nv_think *t) {
    nv_buf_free(&t->hold);
    nv_buf_free(&t->call);
}

int nv_think_opened(const nv_tokenizer *tok, int tags, const int *ids, int n) {
    /* backwards from the end: white space of any length passed over, then the tag's length in bytes
       before it (64 tokens back at most: the tag is one to seven of them) */
    const char *tag = nv_think_tags_of(tags)->open;
    const size_t len = strlen(tag);
    char tail[32]; /* (the tags are 7 bytes; harmony's 30) */
    if (len > sizeof tail) return 0;
    size_t have = 0;
    for (int i = n - 1; i >= 0 && i >= n - 64 && have < len; i--) {
        const char *piece = nv_tokenizer_decode(tok, i ? ids[i - 1] : -1, ids[i]); /* (Mistral's tags: shown tokens) */
        for (size_t k = piece ? strlen(piece) : 0; k > 0 && have < len; k--) {
            const char c = piece[k - 1];
            if (!have && (c == ' ' || c == '\n' || c == '\r' || c == '\t')) continue;
            tail[len - 1 - have++] = c;
        }
    }
    return have == len && !memcmp(tail, tag, len);
}

nv_err nv_think_close_ids(const nv_tokenizer *tok, int tags, const char *message, int **ids, int *n) {
    nv_buf text = {0};
    if (message) nv_buf_puts(&text, message);
    nv_buf_puts(&text, nv_think_tags_of(tags)->forced);
    nv_err e = text.oom ? nv_fail(NV_ENOMEM, "out of memory") : nv_tokenizer_encode(tok, text.data, 0, 0, ids, n);
    if (e == NV_OK && *n > 1 && text.data[0] != ' ') { /* a dummy prefix's space standing alone: not ours */
        const char *first = nv_tokenizer_decode(tok, -1, (*ids)[0]);
        if (first && !strcmp(first, " ")) memmove(*ids, *ids + 1, (size_t)--*n * sizeof **ids);
    }
    nv_buf_free(&text);
    return e;
}
