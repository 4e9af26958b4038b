#include "model/think.h"

#include <string.h>

size_t nv_partial_tag(const char *s, size_t n, const char *tag) {
    const size_t tl = strlen(tag);
    for (size_t k = tl - 1 < n ? tl - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, tag, k)) return k;
    return 0;
}

const nv_think_tags *nv_think_tags_of(int tags) {
    static const nv_think_tags angle = {"<think>", "</think>", "\n</think>\n\n"}, bracket = {"[THINK]", "[/THINK]", "[/THINK]"};
    return tags == NV_THINK_BRACKET ? &bracket : &angle;
}

int nv_think_tags_of_template(const char *text, int *shown) {
    const int bracket = text && strstr(text, "[THINK]") && strstr(text, "[/THINK]");
    if (shown) *shown = bracket || (text && strstr(text, "<think>"));
    return bracket ? NV_THINK_BRACKET : NV_THINK_ANGLE;
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

void nv_think_feed(nv_think *t, const char *s, size_t n, int final, nv_buf *reasoning, nv_buf *content) {
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

void nv_think_free(nv_think *t) { nv_buf_free(&t->hold); }

int nv_think_opened(const nv_tokenizer *tok, int tags, const int *ids, int n) {
    /* backwards from the end: white space of any length passed over, then the tag's length in bytes
       before it (64 tokens back at most: the tag is one to seven of them) */
    const char *tag = nv_think_tags_of(tags)->open;
    const size_t len = strlen(tag);
    char tail[8]; /* (the tags are 7 bytes) */
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
