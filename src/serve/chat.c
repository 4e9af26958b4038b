#include "serve/chat.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"

static const char *const names[] = {"plain", "chatml", "llama2", "llama3"};
#define N_TEMPLATES (int)(sizeof names / sizeof names[0])

nv_err nv_chat_template_parse(const char *name, nv_chat_template *out) {
    for (int i = 0; i < N_TEMPLATES; i++)
        if (strcmp(name, names[i]) == 0) {
            *out = (nv_chat_template)i;
            return NV_OK;
        }
    return nv_fail(NV_EINVAL, "unknown chat template '%s' (known: plain, chatml, llama2, llama3)", name);
}

const char *nv_chat_template_name(nv_chat_template t) { return (unsigned)t < (unsigned)N_TEMPLATES ? names[t] : "?"; }

const char *nv_chat_template_stop(nv_chat_template t) {
    return t == NV_CHAT_CHATML ? "<|im_end|>" : t == NV_CHAT_LLAMA3 ? "<|eot_id|>" : NULL;
}

int nv_chat_role_known(const char *role) {
    return !strcmp(role, "system") || !strcmp(role, "developer") || !strcmp(role, "user") || !strcmp(role, "assistant");
}

static int is_system(const char *role) { return !strcmp(role, "system") || !strcmp(role, "developer"); }

typedef struct {
    int *ids;
    int n, cap;
} id_list;

static nv_err ids_add_text(id_list *l, const nv_tokenizer *tok, const char *text, int bos, int eos) {
    int *ids = NULL, n = 0;
    NV_TRY(nv_tokenizer_encode(tok, text, bos, eos, &ids, &n));
    if (l->n + n > l->cap) {
        int cap = (l->n + n) * 2 + 16;
        int *p = realloc(l->ids, (size_t)cap * sizeof(int));
        if (!p) {
            free(ids);
            return nv_fail(NV_ENOMEM, "chat: out of memory");
        }
        l->ids = p;
        l->cap = cap;
    }
    memcpy(l->ids + l->n, ids, (size_t)n * sizeof(int));
    l->n += n;
    free(ids);
    return NV_OK;
}

/* Appends s without leading and trailing white space. */
static void put_stripped(nv_buf *b, const char *s) {
    while (*s && isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) n--;
    nv_buf_append(b, s, n);
}

static nv_err render_llama2(const nv_tokenizer *tok, const nv_chat_msg *m, int n, id_list *out) {
    nv_buf sys = {0}, user = {0}, text = {0};
    nv_err e = NV_OK;
    for (int i = 0; i < n; i++)
        if (is_system(m[i].role)) {
            if (sys.len) nv_buf_puts(&sys, "\n\n");
            put_stripped(&sys, m[i].content);
        }
    int have_user = 0, first = 1;
    for (int i = 0; i < n && e == NV_OK; i++) {
        if (is_system(m[i].role)) continue;
        if (!strcmp(m[i].role, "user")) {
            if (have_user) nv_buf_puts(&user, "\n\n");
            put_stripped(&user, m[i].content);
            have_user = 1;
            continue;
        }
        /* an assistant answer closes the exchange */
        nv_buf_puts(&text, "[INST] ");
        if (first && sys.len) nv_buf_printf(&text, "<<SYS>>\n%s\n<</SYS>>\n\n", sys.data);
        if (user.len) nv_buf_append(&text, user.data, user.len);
        nv_buf_puts(&text, " [/INST] ");
        put_stripped(&text, m[i].content);
        int last = i == n - 1;
        if (!last) nv_buf_puts(&text, " ");
        e = text.oom ? nv_fail(NV_ENOMEM, "chat: out of memory")
                     : ids_add_text(out, tok, text.data, 1, !last);
        nv_buf_free(&text);
        nv_buf_free(&user);
        have_user = 0;
        first = 0;
        if (last) goto done;
    }
    if (e == NV_OK) {
        nv_buf_puts(&text, "[INST] ");
        if (first && sys.len) nv_buf_printf(&text, "<<SYS>>\n%s\n<</SYS>>\n\n", sys.data);
        if (user.len) nv_buf_append(&text, user.data, user.len);
        nv_buf_puts(&text, " [/INST]");
        e = text.oom ? nv_fail(NV_ENOMEM, "chat: out of memory") : ids_add_text(out, tok, text.data, 1, 0);
    }
done:
    nv_buf_free(&sys);
    nv_buf_free(&user);
    nv_buf_free(&text);
    return e;
}

nv_err nv_chat_render(nv_chat_template t, const nv_tokenizer *tok, const nv_chat_msg *m, int n, int **tokens,
                      int *n_tokens) {
    return nv_chat_render_ex(t, tok, m, n, 0, tokens, n_tokens);
}

nv_err nv_chat_render_ex(nv_chat_template t, const nv_tokenizer *tok, const nv_chat_msg *m, int n, int no_think,
                         int **tokens, int *n_tokens) {
    *tokens = NULL;
    *n_tokens = 0;
    id_list out = {0};
    nv_err e = NV_OK;
    if (t == NV_CHAT_LLAMA2) {
        e = render_llama2(tok, m, n, &out);
    } else {
        nv_buf text = {0};
        for (int i = 0; i < n; i++) {
            if (t == NV_CHAT_CHATML) {
                nv_buf_printf(&text, "<|im_start|>%s\n%s<|im_end|>\n", is_system(m[i].role) ? "system" : m[i].role,
                              m[i].content);
            } else if (t == NV_CHAT_LLAMA3) {
                nv_buf_printf(&text, "<|start_header_id|>%s<|end_header_id|>\n\n", is_system(m[i].role) ? "system" : m[i].role);
                put_stripped(&text, m[i].content);
                nv_buf_puts(&text, "<|eot_id|>");
            } else {
                if (i) nv_buf_puts(&text, "\n");
                nv_buf_puts(&text, m[i].content);
            }
        }
        if (t == NV_CHAT_CHATML) nv_buf_puts(&text, no_think ? "<|im_start|>assistant\n<think>\n\n</think>\n\n" : "<|im_start|>assistant\n");
        if (t == NV_CHAT_LLAMA3) nv_buf_puts(&text, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        if (text.oom) e = nv_fail(NV_ENOMEM, "chat: out of memory");
        else e = ids_add_text(&out, tok, text.data ? text.data : "", 1, 0);
        nv_buf_free(&text);
    }
    if (e != NV_OK) {
        free(out.ids);
        return e;
    }
    *tokens = out.ids;
    *n_tokens = out.n;
    return NV_OK;
}
