#include "serve/chat.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/buf.h"
#include "model/think.h"
#include "serve/tools.h"

static const char *const names[] = {"plain",   "chatml",  "llama2",    "llama3", "deepseek", "phi3",
                                     "gemma",   "granite", "mistral",   "phi4-mini", "phi4",   "olmo2", "smollm3"};

/* DeepSeek's markers: fullwidth vertical bars, and U+2581 for the space in end▁of▁sentence */
#define DS_USER "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define DS_ASSISTANT NV_CHAT_DEEPSEEK_ASSISTANT
#define DS_END "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define N_TEMPLATES (int)(sizeof names / sizeof names[0])
/* Granite's markers */
#define GRANITE_ROLE(r) "<|start_of_role|>" r "<|end_of_role|>"
#define GRANITE_END "<|end_of_text|>\n"

nv_err nv_chat_template_parse(const char *name, nv_chat_template *out) {
    for (int i = 0; i < N_TEMPLATES; i++)
        if (strcmp(name, names[i]) == 0) {
            *out = (nv_chat_template)i;
            return NV_OK;
        }
    return nv_fail(NV_EINVAL,
                   "unknown chat template '%s' (known: plain, chatml, llama2, llama3, deepseek, phi3, gemma, granite, mistral, phi4-mini, phi4, "
                   "olmo2, smollm3)",
                   name);
}

const char *nv_chat_template_name(nv_chat_template t) { return (unsigned)t < (unsigned)N_TEMPLATES ? names[t] : "?"; }

const char *nv_chat_template_stop(nv_chat_template t) {
    return t == NV_CHAT_CHATML || t == NV_CHAT_PHI4 || t == NV_CHAT_SMOLLM3 ? "<|im_end|>"
           : t == NV_CHAT_LLAMA3 ? "<|eot_id|>"
           : t == NV_CHAT_DEEPSEEK ? DS_END
           : t == NV_CHAT_PHI3 || t == NV_CHAT_PHI4_MINI ? "<|end|>"
           : t == NV_CHAT_GEMMA ? "<end_of_turn>"
           : t == NV_CHAT_GRANITE ? "<|end_of_text|>"
                               : NULL;
}

int nv_chat_role_known(const char *role) {
    return !strcmp(role, "system") || !strcmp(role, "developer") || !strcmp(role, "user") || !strcmp(role, "assistant") ||
           !strcmp(role, "tool") || !strcmp(role, "function");
}

static int is_system(const char *role) { return !strcmp(role, "system") || !strcmp(role, "developer"); }
/* "function": the deprecated role of a function's result (LangChain's FunctionMessage), a tool's result */
static int is_tool(const char *role) { return !strcmp(role, "tool") || !strcmp(role, "function"); }

nv_tool_style nv_chat_tool_text_style(nv_chat_template t, const nv_jinja *jinja) { return jinja ? NV_TOOLS_HERMES : nv_chat_tool_style(t); }

nv_tool_style nv_chat_tool_style(nv_chat_template t) {
    return t == NV_CHAT_LLAMA3    ? NV_TOOLS_LLAMA3
           : t == NV_CHAT_GRANITE ? NV_TOOLS_GRANITE
           : t == NV_CHAT_MISTRAL ? NV_TOOLS_MISTRAL
           : t == NV_CHAT_PHI4_MINI ? NV_TOOLS_PHI4_MINI
                                  : NV_TOOLS_HERMES;
}

nv_tool_style nv_chat_jinja_tool_style(nv_chat_template t, const char *jinja_text) {
    /* <tool_call> too: templates that wrap the same body in a tag of their own are another form */
    if (jinja_text && strstr(jinja_text, "<tool_call>") && strstr(jinja_text, "<function=") && strstr(jinja_text, "<parameter="))
        return NV_TOOLS_XML;
    if (jinja_text && strstr(jinja_text, NV_MISTRAL_TOOL_CALLS) && strstr(jinja_text, NV_MISTRAL_ARGS))
        return strstr(jinja_text, NV_MISTRAL_CALL_ID) ? NV_TOOLS_MISTRAL_CALL_ID : NV_TOOLS_MISTRAL_ARGS;
    return nv_chat_tool_style(t);
}

void nv_chat_show_tool_tokens(nv_tokenizer *tok, nv_chat_template t, nv_tool_style jinja_tools) {
    if (nv_chat_tool_token(t)) nv_tokenizer_show(tok, nv_chat_tool_token(t));
    if (nv_tool_style_mistral_args(jinja_tools)) nv_tokenizer_show(tok, NV_MISTRAL_TOOL_CALLS), nv_tokenizer_show(tok, NV_MISTRAL_ARGS);
    if (jinja_tools == NV_TOOLS_MISTRAL_CALL_ID) nv_tokenizer_show(tok, NV_MISTRAL_CALL_ID);
}

const char *nv_chat_tool_token(nv_chat_template t) {
    return t == NV_CHAT_GRANITE || t == NV_CHAT_PHI4_MINI ? NV_GRANITE_TOOL_CALL : t == NV_CHAT_MISTRAL ? NV_MISTRAL_TOOL_CALLS : NULL;
}

/* ---- tools: the Hermes format (Qwen2.5/Qwen3's templates) and Llama 3.1's JSON one ---- */

static void hermes_tools(nv_buf *b, const nv_chat_opts *o) {
    nv_buf_puts(b, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                   "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
    for (int i = 0; i < o->n_tools; i++) nv_buf_printf(b, "\n%s", o->tools[i]);
    nv_buf_puts(b, "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
                   "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                   "<args-json-object>}\n</tool_call>");
}

/* An assistant message's calls after its content (Qwen3's template: a newline before each but a
 * first one that opens the message). */
static void hermes_calls(nv_buf *b, const nv_chat_msg *m) {
    for (int i = 0; i < m->n_calls; i++) {
        if (i || (m->content && *m->content)) nv_buf_puts(b, "\n");
        nv_buf_printf(b, "<tool_call>\n{\"name\": \"%s\", \"arguments\": %s}\n</tool_call>", m->calls[i].name,
                      m->calls[i].arguments);
    }
}

static void tool_response(nv_buf *b, const char *content) {
    nv_buf_printf(b, "<tool_response>\n%s\n</tool_response>", content);
}

static void llama3_tools_preamble(nv_buf *b, const nv_chat_opts *o) {
    nv_buf_puts(b, "Given the following functions, please respond with a JSON for a function call with its proper "
                   "arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function name, "
                   "\"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n");
    for (int i = 0; i < o->n_tools; i++) nv_buf_printf(b, "%s\n\n", o->tools[i]);
}

/* Granite 3's system line when tools are given and no system message (its template's, without the
 * knowledge cutoff and today's date, which would change the prompt from day to day). */
#define GRANITE_TOOLS_SYSTEM                                                                                             \
    "You are Granite, developed by IBM. You are a helpful AI assistant with access to the following tools. When a "      \
    "tool is required to answer the user's query, respond with " NV_GRANITE_TOOL_CALL " followed by a JSON list of tools " \
    "used. If a tool does not exist in the provided list of tools, notify the user that you do not have the ability "    \
    "to fulfill the request."

/* The tools as one JSON list indented by 4 (Python's json.dumps(tools, indent=4)): each tool's
 * text, already indented by 4 at its own depth, moved one level in (its strings hold no raw line
 * break, so every line break is one of the layout's). */
static void granite_tools(nv_buf *b, const nv_chat_opts *o) {
    nv_buf_puts(b, "[");
    for (int i = 0; i < o->n_tools; i++) {
        nv_buf_puts(b, i ? ",\n    " : "\n    ");
        for (const char *s = o->tools[i], *nl; *s; s = nl + 1) {
            if (!(nl = strchr(s, '\n'))) {
                nv_buf_puts(b, s);
                break;
            }
            nv_buf_append(b, s, (size_t)(nl - s));
            nv_buf_puts(b, "\n    ");
        }
    }
    nv_buf_puts(b, "\n]");
}

/* An assistant's calls as one JSON list after open (NV_GRANITE_CALLS, NV_MISTRAL_CALLS), each call's
 * id too with ids (Mistral's); nothing without calls. */
static void call_list(nv_buf *b, const char *open, const nv_chat_msg *m, int ids) {
    if (!m->n_calls) return;
    nv_buf_puts(b, open);
    for (int i = 0; i < m->n_calls; i++) {
        nv_buf_printf(b, "%s{\"name\": \"%s\", \"arguments\": %s", i ? ", " : "", m->calls[i].name, m->calls[i].arguments);
        if (ids) nv_buf_printf(b, ", \"id\": \"%s\"", m->calls[i].id ? m->calls[i].id : "");
        nv_buf_puts(b, "}");
    }
    nv_buf_puts(b, "]");
}

/* Appends s without leading and trailing white space. */
static void put_stripped(nv_buf *b, const char *s) {
    while (*s && isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) n--;
    nv_buf_append(b, s, n);
}

/* A user-side message's text: a tool result wrapped as Hermes has it. */
static void put_user_side(nv_buf *b, const nv_chat_msg *m) {
    if (is_tool(m->role)) tool_response(b, m->content);
    else put_stripped(b, m->content);
}

/* Where a rendering goes: token ids, each piece encoded as the model reads it, or text, with BOS
 * and EOS spelled where encoding adds them (what the template's Jinja form gives). */
typedef struct {
    const nv_tokenizer *tok;
    nv_ids *ids;
    nv_buf *text;
} sink;

/* bos: 1, BOS where the tokenizer prepends one; SINK_BOS_ALWAYS, where the vocabulary has one (a
 * template that writes bos_token itself: OLMo 2's). eos: EOS after the text. */
#define SINK_BOS_ALWAYS 2
static nv_err sink_put(const sink *s, const char *text, int bos, int eos) {
    const int b = nv_tokenizer_bos(s->tok), e = nv_tokenizer_eos(s->tok);
    const int own = bos == SINK_BOS_ALWAYS && b >= 0 && !nv_tokenizer_adds_bos(s->tok); /* the template's, not the tokenizer's */
    if (s->ids) {
        if (own) NV_TRY(nv_ids_push(s->ids, &b, 1));
        return nv_tokenizer_encode_into(s->tok, text, bos != 0, eos, s->ids);
    }
    if (bos && b >= 0 && (own || nv_tokenizer_adds_bos(s->tok))) nv_buf_puts(s->text, nv_tokenizer_special_text(s->tok, b));
    nv_buf_puts(s->text, text);
    if (eos && e >= 0) nv_buf_puts(s->text, nv_tokenizer_special_text(s->tok, e));
    return s->text->oom ? nv_fail(NV_ENOMEM, "chat: out of memory") : NV_OK;
}

static nv_err render_llama2(const nv_chat_msg *m, int n, const nv_chat_opts *o, const sink *out) {
    nv_buf sys = {0}, user = {0}, text = {0};
    nv_err e = NV_OK;
    for (int i = 0; i < n; i++)
        if (is_system(m[i].role)) {
            if (sys.len) nv_buf_puts(&sys, "\n\n");
            put_stripped(&sys, m[i].content);
        }
    if (o->n_tools) {
        if (sys.len) nv_buf_puts(&sys, "\n\n");
        hermes_tools(&sys, o);
    }
    int have_user = 0, first = 1;
    for (int i = 0; i < n && e == NV_OK; i++) {
        if (is_system(m[i].role)) continue;
        if (strcmp(m[i].role, "assistant") != 0) { /* user and tool messages make the turn */
            if (have_user) nv_buf_puts(&user, "\n\n");
            put_user_side(&user, &m[i]);
            have_user = 1;
            continue;
        }
        /* an assistant answer closes the exchange */
        nv_buf_puts(&text, "[INST] ");
        if (first && sys.len) nv_buf_printf(&text, "<<SYS>>\n%s\n<</SYS>>\n\n", sys.data);
        if (user.len) nv_buf_append(&text, user.data, user.len);
        nv_buf_puts(&text, " [/INST] ");
        put_stripped(&text, m[i].content);
        hermes_calls(&text, &m[i]);
        int last = i == n - 1;
        if (!last) nv_buf_puts(&text, " ");
        e = text.oom ? nv_fail(NV_ENOMEM, "chat: out of memory") : sink_put(out, text.data, 1, !last);
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
        e = text.oom ? nv_fail(NV_ENOMEM, "chat: out of memory") : sink_put(out, text.data, 1, 0);
    }
done:
    nv_buf_free(&sys);
    nv_buf_free(&user);
    nv_buf_free(&text);
    return e;
}

/* 1 when the messages end with an assistant answer to continue (nv_chat_opts.continue_final). */
static int continues(const nv_chat_msg *m, int n, const nv_chat_opts *o) {
    return o->continue_final && n > 0 && !strcmp(m[n - 1].role, "assistant");
}

/* ChatML's turns (Qwen's), Phi-3's, Phi-4's and OLMo 2's have one shape: a marker around the role
 * (with a line break after it but in Phi-4's), the text, an end marker (the same). OLMo 2's (Tülu
 * 3's format) ends an answer with EOS instead, then a line break unless it is the last message, and
 * opens with BOS whatever the vocabulary's habit, as its template writes bos_token. */
typedef struct {
    const char *pre, *close, *end;
    int thinks;      /* Qwen3's empty reasoning on a non-thinking turn (nv_chat_opts.no_think) */
    int eos_answers; /* OLMo 2's answers, ended by EOS */
} turn_marks;
static const turn_marks chatml_marks = {"<|im_start|>", "\n", "<|im_end|>\n", 1, 0},
                        phi3_marks = {"<|", "|>\n", "<|end|>\n", 0, 0},
                        phi4_marks = {"<|im_start|>", "<|im_sep|>", "<|im_end|>", 0, 0},
                        olmo2_marks = {"<|", "|>\n", "\n", 0, 1};

/* The turns of m[0..n) into text; with k->eos_answers, each answer and the text before it go to out
 * with EOS after them (*put: something went to out), the rest stays in text. gen_prompt: the
 * assistant's header after the last message (not after an answer being continued). Tools join the
 * first system message in one system turn; consecutive tool results share one user turn. */
static nv_err render_turns(nv_buf *text, const nv_chat_msg *m, int n, const nv_chat_opts *o, const turn_marks *k, const sink *out,
                           int gen_prompt, int *put) {
    const char *no_think = k->thinks && o->no_think ? "<think>\n\n</think>\n\n" : "";
    int i = 0;
    if (o->n_tools) {
        nv_buf_printf(text, "%ssystem%s", k->pre, k->close);
        if (n && is_system(m[0].role)) nv_buf_printf(text, "%s\n\n", m[i++].content);
        hermes_tools(text, o);
        nv_buf_puts(text, k->end);
    }
    for (; i < n; i++) {
        if (is_tool(m[i].role)) {
            if (i == 0 || !is_tool(m[i - 1].role)) nv_buf_printf(text, "%suser%s", k->pre, k->close);
            else nv_buf_puts(text, "\n");
            tool_response(text, m[i].content);
            if (i == n - 1 || !is_tool(m[i + 1].role)) nv_buf_puts(text, k->end);
            continue;
        }
        if (i == n - 1 && continues(m, n, o)) { /* the answer so far: the model goes on from its last byte */
            nv_buf_printf(text, "%sassistant%s%s%s", k->pre, k->close, no_think, m[i].content);
            return NV_OK;
        }
        nv_buf_printf(text, "%s%s%s%s", k->pre, is_system(m[i].role) ? "system" : m[i].role, k->close, m[i].content);
        hermes_calls(text, &m[i]);
        if (k->eos_answers && !strcmp(m[i].role, "assistant")) {
            NV_TRY(text->oom ? nv_fail(NV_ENOMEM, "chat: out of memory") : sink_put(out, text->data, *put ? 0 : SINK_BOS_ALWAYS, 1));
            nv_buf_free(text);
            *put = 1;
            if (i < n - 1) nv_buf_puts(text, "\n");
        } else {
            nv_buf_puts(text, k->end);
        }
    }
    if (gen_prompt) nv_buf_printf(text, "%sassistant%s%s", k->pre, k->close, no_think);
    return NV_OK;
}

/* Granite's turns: <|start_of_role|>ROLE<|end_of_role|>TEXT<|end_of_text|> and a line break, with
 * its own tool turns (chat.h). */
static void render_granite(nv_buf *text, const nv_chat_msg *m, int n, const nv_chat_opts *o) {
    int i = 0;
    if (o->n_tools) {
        nv_buf_printf(text, GRANITE_ROLE("system") "%s" GRANITE_END GRANITE_ROLE("available_tools"),
                      n && is_system(m[0].role) ? m[i++].content : GRANITE_TOOLS_SYSTEM);
        granite_tools(text, o);
        nv_buf_puts(text, GRANITE_END);
    }
    for (; i < n; i++) {
        const char *role = is_system(m[i].role) ? "system" : is_tool(m[i].role) ? "tool_response" : m[i].role;
        nv_buf_printf(text, GRANITE_ROLE("%s") "%s", role, m[i].content);
        if (i == n - 1 && continues(m, n, o)) return; /* the answer so far, continued */
        call_list(text, NV_GRANITE_CALLS, &m[i], 0);
        nv_buf_puts(text, GRANITE_END);
    }
    nv_buf_puts(text, GRANITE_ROLE("assistant"));
}

/* Phi-4-mini's calls: Granite's list, closed by its own token. */
#define PHI4_CALLS_END "<|/tool_call|>"
static void phi4_calls(nv_buf *b, const nv_chat_msg *m) {
    call_list(b, NV_GRANITE_CALLS, m, 0);
    if (m->n_calls) nv_buf_puts(b, PHI4_CALLS_END);
}

/* Phi-4-mini's turns: <|role|>TEXT<|end|>, no line breaks (its own template's; Phi-3's have them);
 * the tools, their functions as one JSON list, between <|tool|> and <|/tool|> at the end of the
 * system turn (the first system message's, else an empty one), as its template puts a system
 * message's tools; a tool's result a turn of role tool, as its template names it; earlier calls
 * phi4_calls. */
static void render_phi4_mini(nv_buf *text, const nv_chat_msg *m, int n, const nv_chat_opts *o) {
    int i = 0;
    if (o->n_tools) {
        nv_buf_printf(text, "<|system|>%s<|tool|>[", n && is_system(m[0].role) ? m[i++].content : "");
        for (int k = 0; k < o->n_tools; k++) nv_buf_printf(text, "%s%s", k ? ", " : "", o->tools[k]);
        nv_buf_puts(text, "]<|/tool|><|end|>");
    }
    for (; i < n; i++) {
        nv_buf_printf(text, "<|%s|>%s", is_system(m[i].role) ? "system" : is_tool(m[i].role) ? "tool" : m[i].role, m[i].content);
        if (i == n - 1 && continues(m, n, o)) return; /* the answer so far, continued */
        phi4_calls(text, &m[i]);
        nv_buf_puts(text, "<|end|>");
    }
    nv_buf_puts(text, "<|assistant|>");
}

/* Mistral's v3 turns (chat.h), out in pieces that each end with EOS (the last may not): BOS opens
 * the first. */
static nv_err render_mistral(const nv_chat_msg *m, int n, const nv_chat_opts *o, const sink *out) {
    nv_buf sys = {0}, text = {0};
    int last_user = -1, first = 1;
    nv_err e = NV_OK;
    for (int i = 0; i < n; i++) {
        if (is_system(m[i].role)) nv_buf_printf(&sys, "%s%s", sys.len ? "\n\n" : "", m[i].content);
        else if (!strcmp(m[i].role, "user")) last_user = i;
    }
    for (int i = 0; i < n && e == NV_OK; i++) {
        if (is_system(m[i].role)) continue;
        int ends = 0; /* an answer: EOS after it */
        if (is_tool(m[i].role)) {
            nv_buf_printf(&text, "[TOOL_RESULTS] {\"content\": %s, \"call_id\": \"%s\"}[/TOOL_RESULTS]", m[i].content,
                          m[i].tool_call_id ? m[i].tool_call_id : "");
        } else if (strcmp(m[i].role, "assistant")) {
            const int last = i == last_user;
            if (last && o->n_tools) {
                nv_buf_puts(&text, "[AVAILABLE_TOOLS] [");
                for (int k = 0; k < o->n_tools; k++) nv_buf_printf(&text, "%s%s", k ? ", " : "", o->tools[k]);
                nv_buf_puts(&text, "][/AVAILABLE_TOOLS]");
            }
            nv_buf_printf(&text, "[INST] %s%s%s[/INST]", last && sys.len ? sys.data : "", last && sys.len ? "\n\n" : "", m[i].content);
        } else if (i == n - 1 && continues(m, n, o)) { /* the answer so far, continued */
            nv_buf_printf(&text, " %s", m[i].content);
        } else if (m[i].n_calls) { /* (its text is not shown, as Mistral's template has it) */
            call_list(&text, NV_MISTRAL_CALLS, &m[i], 1);
            ends = 1;
        } else {
            nv_buf_puts(&text, " ");
            put_stripped(&text, m[i].content);
            ends = 1;
        }
        if (ends) {
            e = text.oom || sys.oom ? nv_fail(NV_ENOMEM, "chat: out of memory") : sink_put(out, text.data, first, 1);
            nv_buf_free(&text);
            first = 0;
        }
    }
    if (e == NV_OK && (text.len || first))
        e = text.oom || sys.oom ? nv_fail(NV_ENOMEM, "chat: out of memory") : sink_put(out, text.data ? text.data : "", first, 0);
    nv_buf_free(&sys);
    nv_buf_free(&text);
    return e;
}

/* Gemma's turns: <start_of_turn>user (or model, the assistant's), the text trimmed, <end_of_turn>;
 * the first system message and the tools open the first turn's text (Gemma has no system turn);
 * consecutive tool results share one user turn. */
static void render_gemma(nv_buf *text, const nv_chat_msg *m, int n, const nv_chat_opts *o) {
    nv_buf prefix = {0};
    int i = 0;
    if (n && is_system(m[0].role)) nv_buf_printf(&prefix, "%s\n\n", m[i++].content);
    if (o->n_tools) {
        hermes_tools(&prefix, o);
        nv_buf_puts(&prefix, "\n\n");
    }
    if (prefix.oom) text->oom = 1;
    for (const int first = i; i < n; i++) {
        const char *pre = i == first && prefix.data ? prefix.data : "";
        if (is_tool(m[i].role)) {
            nv_buf_puts(text, i == 0 || !is_tool(m[i - 1].role) ? "<start_of_turn>user\n" : "\n");
            nv_buf_puts(text, i == 0 || !is_tool(m[i - 1].role) ? pre : "");
            tool_response(text, m[i].content);
            if (i == n - 1 || !is_tool(m[i + 1].role)) nv_buf_puts(text, "<end_of_turn>\n");
            continue;
        }
        nv_buf_printf(text, "<start_of_turn>%s\n%s", strcmp(m[i].role, "assistant") ? "user" : "model", pre);
        if (i == n - 1 && continues(m, n, o)) { /* the answer so far, continued */
            nv_buf_puts(text, m[i].content);
            nv_buf_free(&prefix);
            return;
        }
        put_stripped(text, m[i].content);
        hermes_calls(text, &m[i]);
        nv_buf_puts(text, "<end_of_turn>\n");
    }
    nv_buf_puts(text, "<start_of_turn>model\n");
    nv_buf_free(&prefix);
}

/* A Llama 3 message's body: an assistant's call replaces its content. */
static void llama3_body(nv_buf *text, const nv_chat_msg *m) {
    if (m->n_calls)
        for (int k = 0; k < m->n_calls; k++)
            nv_buf_printf(text, "%s{\"name\": \"%s\", \"parameters\": %s}", k ? "\n" : "", m->calls[k].name,
                          m->calls[k].arguments);
    else put_stripped(text, m->content);
}

static void render_llama3(nv_buf *text, const nv_chat_msg *m, int n, const nv_chat_opts *o) {
    int i = 0, preamble = o->n_tools > 0;
    if (o->n_tools) { /* Llama 3.1: the system turn says tools exist; they go before the first user message */
        nv_buf_puts(text, "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n\n");
        if (n && is_system(m[0].role)) put_stripped(text, m[i++].content);
        nv_buf_puts(text, "<|eot_id|>");
    }
    for (; i < n; i++) {
        const char *role = is_system(m[i].role) ? "system" : is_tool(m[i].role) ? "ipython" : m[i].role;
        nv_buf_printf(text, "<|start_header_id|>%s<|end_header_id|>\n\n", role);
        if (preamble && !strcmp(role, "user")) {
            llama3_tools_preamble(text, o);
            preamble = 0;
        }
        llama3_body(text, &m[i]);
        if (i == n - 1 && continues(m, n, o)) return; /* the answer so far, continued */
        nv_buf_puts(text, "<|eot_id|>");
    }
    nv_buf_puts(text, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* An answer as DeepSeek-R1's template shows it again: without its reasoning. */
static void deepseek_answer(nv_buf *text, const nv_chat_msg *m) {
    const char *c = m->content, *end;
    while ((end = strstr(c, "</think>")) != NULL) c = end + 8;
    nv_buf_puts(text, c);
    hermes_calls(text, m);
}

static void render_deepseek(nv_buf *text, const nv_chat_msg *m, int n, const nv_chat_opts *o) {
    int sys = 0;
    for (int i = 0; i < n; i++)
        if (is_system(m[i].role)) nv_buf_printf(text, "%s%s", sys++ ? "\n\n" : "", m[i].content);
    if (o->n_tools) {
        if (sys) nv_buf_puts(text, "\n\n");
        hermes_tools(text, o);
    }
    for (int i = 0; i < n; i++) {
        if (is_system(m[i].role)) continue;
        if (is_tool(m[i].role)) { /* consecutive results share one user turn, as chatml's */
            nv_buf_puts(text, i == 0 || !is_tool(m[i - 1].role) ? DS_USER : "\n");
            tool_response(text, m[i].content);
        } else if (strcmp(m[i].role, "assistant")) {
            nv_buf_printf(text, DS_USER "%s", m[i].content);
        } else if (i == n - 1 && continues(m, n, o)) { /* the answer so far, continued */
            nv_buf_printf(text, DS_ASSISTANT "%s", m[i].content);
            return;
        } else {
            nv_buf_puts(text, DS_ASSISTANT);
            deepseek_answer(text, &m[i]);
            nv_buf_puts(text, DS_END);
        }
    }
    nv_buf_puts(text, DS_ASSISTANT);
}

/* SmolLM3's template (chat.h). */
#define SMOLLM3_THINK                                                                                                    \
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face. Your role as an assistant involves "        \
    "thoroughly exploring questions through a systematic thinking process before providing the final precise and "     \
    "accurate solutions. This requires engaging in a comprehensive cycle of analysis, summarizing, exploration, "       \
    "reassessment, reflection, backtracking, and iteration to develop well-considered thinking process. Please "        \
    "structure your response into two main sections: Thought and Solution using the specified format: <think> "        \
    "Thought section </think> Solution section. In the Thought section, detail your reasoning process in steps. Each "  \
    "step should include detailed considerations such as analysing questions, summarizing relevant findings, "          \
    "brainstorming new ideas, verifying the accuracy of the current steps, refining any errors, and revisiting "        \
    "previous steps. In the Solution section, based on various attempts, explorations, and reflections from the "       \
    "Thought section, systematically present the final solution that you deem correct. The Solution section should be " \
    "logical, accurate, and concise and detail necessary steps needed to reach the conclusion."
#define SMOLLM3_NO_THINK "You are a helpful AI assistant named SmolLM, trained by Hugging Face."
#define SMOLLM3_EMPTY_THINK "<think>\n\n</think>\n"

/* s with every `cut` taken out, one after the other (Python's str.replace in turn), then the white
   space at its end. */
static void put_without(nv_buf *b, const char *s, const char *const *cut, int n_cut) {
    nv_buf t = {0};
    nv_buf_puts(&t, s);
    for (int k = 0; k < n_cut && t.data; k++) {
        nv_buf u = {0};
        const size_t cl = strlen(cut[k]);
        const char *p = t.data;
        for (const char *hit; (hit = strstr(p, cut[k])); p = hit + cl) nv_buf_append(&u, p, (size_t)(hit - p));
        nv_buf_puts(&u, p);
        nv_buf_free(&t);
        t = u;
    }
    size_t n = t.len;
    while (n && isspace((unsigned char)t.data[n - 1])) n--;
    if (n) nv_buf_append(b, t.data, n);
    nv_buf_free(&t);
}

/* SmolLM3's tools, as its template writes its xml_tools: each as Python prints the dict (`tool |
   string`); a tool whose text is not JSON, which the API never passes on, as its text. */
static void smollm3_tools(nv_buf *b, const nv_chat_opts *o) {
    nv_buf_puts(b, "### Tools\n\nYou may call one or more functions to assist with the user query.\nYou are provided with "
                   "function signatures within <tools></tools> XML tags:\n\n<tools>\n");
    for (int i = 0; i < o->n_tools; i++) {
        cJSON *tool = cJSON_Parse(o->tools[i]);
        if (tool) nv_py_repr(b, tool);
        else nv_buf_puts(b, o->tools[i]);
        cJSON_Delete(tool);
        nv_buf_puts(b, "\n");
    }
    nv_buf_puts(b, "</tools>\n\nFor each function call, return a json object with function name and arguments within "
                   "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                   "<args-json-object>}\n</tool_call>\n\n<|im_end|>\n");
}

static void render_smollm3(nv_buf *text, const nv_chat_msg *m, int n, const nv_chat_opts *o) {
    const char *sys = n && is_system(m[0].role) ? m[0].content : NULL;
    int think = !o->no_think;
    if (sys && strstr(sys, "/no_think")) think = 0;
    else if (sys && strstr(sys, "/think")) think = 1;
    static const char *const switches[] = {"/no_think", "/think"}, *const all[] = {"/no_think", "/think", "/system_override"};
    nv_buf_puts(text, "<|im_start|>system\n");
    if (sys && strstr(sys, "/system_override")) {
        put_without(text, sys, all, 3);
        nv_buf_puts(text, "<|im_end|>\n");
    } else {
        char today[64];
        const time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm); /* as the template's strftime_now gives it */
        strftime(today, sizeof today, "%d %B %Y", &tm);
        nv_buf_printf(text, "## Metadata\n\nKnowledge Cutoff Date: June 2025\nToday Date: %s\nReasoning Mode: %s\n\n"
                            "## Custom Instructions\n\n", today, think ? "/think" : "/no_think");
        const size_t at = text->len;
        if (sys) put_without(text, sys, switches, 2);
        if (text->len == at) nv_buf_puts(text, think ? SMOLLM3_THINK : SMOLLM3_NO_THINK);
        nv_buf_puts(text, "\n\n");
        if (o->n_tools) smollm3_tools(text, o);
    }
    for (int i = 0; i < n; i++) {
        if (is_system(m[i].role)) continue;
        if (strcmp(m[i].role, "assistant") != 0) {
            nv_buf_printf(text, "<|im_start|>user\n%s<|im_end|>\n", m[i].content);
            continue;
        }
        const char *c = m[i].content;
        while (*c == '\n') c++;
        nv_buf_printf(text, "<|im_start|>assistant\n%s%s", think ? "" : SMOLLM3_EMPTY_THINK, c);
        if (i == n - 1 && continues(m, n, o)) return; /* the answer so far, continued */
        hermes_calls(text, &m[i]);
        nv_buf_puts(text, "<|im_end|>\n");
    }
    nv_buf_printf(text, "<|im_start|>assistant\n%s", think ? "" : SMOLLM3_EMPTY_THINK);
}

static void render_plain(nv_buf *text, const nv_chat_msg *m, int n, const nv_chat_opts *o) {
    if (o->n_tools) {
        hermes_tools(text, o);
        nv_buf_puts(text, "\n");
    }
    for (int i = 0; i < n; i++) {
        if (i) nv_buf_puts(text, "\n");
        if (is_tool(m[i].role)) tool_response(text, m[i].content);
        else nv_buf_puts(text, m[i].content);
        hermes_calls(text, &m[i]);
    }
}

nv_err nv_chat_render(nv_chat_template t, const nv_tokenizer *tok, const nv_chat_msg *m, int n, int **tokens,
                      int *n_tokens) {
    return nv_chat_render_ex(t, tok, m, n, 0, tokens, n_tokens);
}

nv_err nv_chat_render_ex(nv_chat_template t, const nv_tokenizer *tok, const nv_chat_msg *m, int n, int no_think,
                         int **tokens, int *n_tokens) {
    nv_chat_opts o = {.no_think = no_think};
    return nv_chat_render_opts(t, tok, m, n, &o, tokens, n_tokens);
}

/* The text of messages m[0..n) in a template that renders text (every one but llama2). */
static void render_prompt(nv_chat_template t, nv_buf *text, const nv_chat_msg *m, int n, const nv_chat_opts *o, int gen_prompt) {
    int put = 0; /* (these marks send nothing to a sink) */
    if (t == NV_CHAT_CHATML || t == NV_CHAT_PHI3 || t == NV_CHAT_PHI4)
        render_turns(text, m, n, o, t == NV_CHAT_CHATML ? &chatml_marks : t == NV_CHAT_PHI3 ? &phi3_marks : &phi4_marks, NULL, gen_prompt, &put);
    else if (t == NV_CHAT_GRANITE) render_granite(text, m, n, o);
    else if (t == NV_CHAT_PHI4_MINI) render_phi4_mini(text, m, n, o);
    else if (t == NV_CHAT_LLAMA3) render_llama3(text, m, n, o);
    else if (t == NV_CHAT_DEEPSEEK) render_deepseek(text, m, n, o);
    else if (t == NV_CHAT_GEMMA) render_gemma(text, m, n, o);
    else if (t == NV_CHAT_SMOLLM3) render_smollm3(text, m, n, o);
    else render_plain(text, m, n, o);
}

/* JSON text parsed, its numbers written as floats marked so (a template shows 3.0 as json.loads keeps it) */
static cJSON *parse_keeping_floats(const char *text) {
    cJSON *j = cJSON_Parse(text);
    nv_json_mark_floats(j, text, strlen(text));
    return j;
}

/* transformers' variables for o->jinja (see nv_chat_opts) */
static cJSON *jinja_vars(const nv_tokenizer *tok, const nv_chat_msg *m, int n, const nv_chat_opts *o, int gen_prompt) {
    cJSON *v = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(v, "messages");
    /* a template with Mistral's [THINK] blocks reads an assistant's earlier reasoning as a thinking chunk
       before its text (content [{"type": "thinking", "thinking"}, {"type": "text", "text"}], no
       reasoning_content), as llama.cpp gives it them */
    const int think_chunks = nv_think_tags_of_template(nv_jinja_source(o->jinja), NULL) == NV_THINK_BRACKET;
    for (int i = 0; i < n; i++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddItemToArray(msgs, x);
        cJSON_AddStringToObject(x, "role", is_system(m[i].role) ? "system" : is_tool(m[i].role) ? "tool" : m[i].role);
        const int none = !m[i].content || (!*m[i].content && m[i].n_calls && !m[i].text_given); /* a call's none, as clients send it */
        const int chunks = think_chunks && m[i].reasoning && *m[i].reasoning && !strcmp(m[i].role, "assistant");
        if (chunks) { /* the reasoning as a thinking chunk, then the text's own */
            cJSON *chunks = cJSON_AddArrayToObject(x, "content"), *think = cJSON_CreateObject();
            cJSON_AddItemToArray(chunks, think);
            cJSON_AddStringToObject(think, "type", "thinking");
            cJSON_AddStringToObject(think, "thinking", m[i].reasoning);
            if (!none) {
                cJSON *text = cJSON_CreateObject();
                cJSON_AddItemToArray(chunks, text);
                cJSON_AddStringToObject(text, "type", "text");
                cJSON_AddStringToObject(text, "text", m[i].content);
            }
        } else if (none)
            cJSON_AddNullToObject(x, "content");
        else
            cJSON_AddStringToObject(x, "content", m[i].content);
        if (m[i].tool_call_id) cJSON_AddStringToObject(x, "tool_call_id", m[i].tool_call_id);
        if (m[i].name) cJSON_AddStringToObject(x, "name", m[i].name);
        if (m[i].reasoning && !chunks) cJSON_AddStringToObject(x, "reasoning_content", m[i].reasoning);
        if (!m[i].n_calls) continue;
        cJSON *calls = cJSON_AddArrayToObject(x, "tool_calls");
        for (int k = 0; k < m[i].n_calls; k++) {
            const nv_chat_call *c = &m[i].calls[k];
            cJSON *call = cJSON_CreateObject(), *f = cJSON_CreateObject(), *args = parse_keeping_floats(c->arguments ? c->arguments : "");
            cJSON_AddItemToArray(calls, call);
            if (c->id) cJSON_AddStringToObject(call, "id", c->id);
            cJSON_AddStringToObject(call, "type", "function");
            cJSON_AddItemToObject(call, "function", f);
            cJSON_AddStringToObject(f, "name", c->name ? c->name : "");
            if (args && cJSON_IsObject(args)) cJSON_AddItemToObject(f, "arguments", args); /* an object, as templates expect */
            else cJSON_Delete(args), cJSON_AddStringToObject(f, "arguments", c->arguments ? c->arguments : "");
        }
    }
    if (o->n_tools) {
        cJSON *tools = cJSON_AddArrayToObject(v, "tools");
        for (int i = 0; i < o->n_tools; i++) {
            cJSON *t = parse_keeping_floats(o->tools[i]);
            if (t) cJSON_AddItemToArray(tools, t);
        }
    } else
        cJSON_AddNullToObject(v, "tools");
    const int b = nv_tokenizer_bos(tok), e = nv_tokenizer_eos(tok);
    cJSON_AddStringToObject(v, "bos_token", b >= 0 ? nv_tokenizer_special_text(tok, b) : "");
    cJSON_AddStringToObject(v, "eos_token", e >= 0 ? nv_tokenizer_special_text(tok, e) : "");
    cJSON_AddBoolToObject(v, "add_generation_prompt", gen_prompt);
    if (o->no_think) cJSON_AddFalseToObject(v, "enable_thinking");
    if (o->effort) cJSON_AddStringToObject(v, "reasoning_effort", o->effort);
    static const char *const ours[] = {"tools", "bos_token", "eos_token", "add_generation_prompt", "enable_thinking", "reasoning_effort"};
    for (const cJSON *k = o->kwargs ? o->kwargs->child : NULL; k; k = k->next) {
        if (!k->string || !strcmp(k->string, "messages")) continue;
        for (size_t i = 0; i < sizeof ours / sizeof *ours; i++) /* a kwarg takes the place of one of ours */
            if (!strcmp(k->string, ours[i])) cJSON_DeleteItemFromObjectCaseSensitive(v, ours[i]);
        cJSON_AddItemToObject(v, k->string, cJSON_Duplicate(k, 1));
    }
    return v;
}

/* Where content ends in text[from..n), as transformers finds the final message for
 * continue_final_message: the last place of its text without white space around it, then after
 * the whole of it where the template kept it so, else after that text; -1 when it is not there. */
static long content_end(const char *text, size_t n, size_t from, const char *content) {
    const size_t len = strlen(content);
    size_t a = 0, b = len;
    while (a < b && isspace((unsigned char)content[a])) a++;
    while (b > a && isspace((unsigned char)content[b - 1])) b--;
    if (a == b) return (long)n; /* nothing to find: the text as it is */
    const char *last = NULL;
    for (const char *p = text + from, *hit; p < text + n && (hit = memmem(p, (size_t)(text + n - p), content + a, b - a)); p = hit + 1)
        last = hit;
    if (!last) return -1;
    const size_t loc = (size_t)(last - text);
    return (long)(loc + (a == 0 && loc + len <= n && !memcmp(text + loc, content, len) ? len : b - a));
}

/* The text o->jinja renders of m[0..n); continue_final cuts it after the last message's content
 * (content_end: transformers' way; a template that does not show it is refused). */
static nv_err jinja_text(const nv_tokenizer *tok, const nv_chat_msg *m, int n, const nv_chat_opts *o, int gen_prompt, nv_buf *text) {
    const int cont = continues(m, n, o);
    cJSON *vars = jinja_vars(tok, m, n, o, gen_prompt && !cont);
    const size_t at = text->len;
    nv_err e = vars ? nv_jinja_render(o->jinja, vars, text) : nv_fail(NV_ENOMEM, "chat: out of memory");
    cJSON_Delete(vars);
    if (e != NV_OK) return e == NV_ENOMEM ? e : nv_fail(NV_EINVAL, "%s", nv_errmsg());
    if (cont && text->data) {
        const long end = content_end(text->data, text->len, at, m[n - 1].content ? m[n - 1].content : "");
        if (end < 0) return nv_fail(NV_EINVAL, "continue_final_message: the chat template does not show the final message's text");
        text->len = (size_t)end;
        text->data[text->len] = 0;
    }
    return NV_OK;
}

/* text's ids with the vocabulary's BOS and EOS, where a template spells them, as those tokens (a
 * SentencePiece vocabulary's encoding reads "<s>" as text; transformers and llama.cpp read it as BOS) */
static nv_err encode_spelled(const nv_tokenizer *tok, const char *text, nv_ids *out) {
    const int id[2] = {nv_tokenizer_bos(tok), nv_tokenizer_eos(tok)};
    const char *spelled[2] = {id[0] >= 0 ? nv_tokenizer_special_text(tok, id[0]) : NULL, id[1] >= 0 ? nv_tokenizer_special_text(tok, id[1]) : NULL};
    const char *next[2] = {NULL, NULL}; /* each one's next place (searched again only once passed) */
    int gone[2] = {!spelled[0] || !*spelled[0], !spelled[1] || !*spelled[1]};
    while (*text) {
        int which = -1;
        for (int k = 0; k < 2; k++) {
            if (!gone[k] && (!next[k] || next[k] < text)) next[k] = strstr(text, spelled[k]), gone[k] = !next[k];
            if (!gone[k] && (which < 0 || next[k] < next[which])) which = k;
        }
        const char *at = which >= 0 ? next[which] : NULL;
        const size_t n = at ? (size_t)(at - text) : strlen(text);
        if (n) {
            char *piece = strndup(text, n);
            nv_err e = piece ? nv_tokenizer_encode_into(tok, piece, 0, 0, out) : nv_fail(NV_ENOMEM, "chat: out of memory");
            free(piece);
            NV_TRY(e);
        }
        if (!at) break;
        NV_TRY(nv_ids_push(out, &id[which], 1));
        text = at + strlen(spelled[which]);
    }
    return NV_OK;
}

/* gen_prompt 0: without the assistant's header after the last message (OLMo 2's; the other
   templates' callers always want it). */
static nv_err render(nv_chat_template t, const nv_chat_msg *m, int n, const nv_chat_opts *o, const sink *out, int gen_prompt) {
    if (o->no_gen_prompt && !o->jinja && t != NV_CHAT_PLAIN && t != NV_CHAT_CHATML && t != NV_CHAT_PHI3 && t != NV_CHAT_PHI4 &&
        t != NV_CHAT_OLMO2)
        return nv_fail(NV_EINVAL, "add_generation_prompt false: nerve's %s renderer always ends with the assistant's header (run "
                                  "the model's template as Jinja: serve without --no-jinja)",
                       nv_chat_template_name(t));
    gen_prompt = gen_prompt && !o->no_gen_prompt;
    if (o->jinja) { /* the text as it is: BOS only where the template writes bos_token */
        nv_buf text = {0};
        nv_err e = jinja_text(out->tok, m, n, o, gen_prompt, &text);
        if (e == NV_OK && text.oom) e = nv_fail(NV_ENOMEM, "chat: out of memory");
        if (e == NV_OK) e = out->ids ? encode_spelled(out->tok, text.data ? text.data : "", out->ids) : sink_put(out, text.data ? text.data : "", 0, 0);
        nv_buf_free(&text);
        return e;
    }
    if (t == NV_CHAT_LLAMA2) return render_llama2(m, n, o, out);
    if (t == NV_CHAT_MISTRAL) return render_mistral(m, n, o, out);
    nv_buf text = {0};
    nv_err e = NV_OK;
    int put = 0;
    if (t == NV_CHAT_OLMO2) e = render_turns(&text, m, n, o, &olmo2_marks, out, gen_prompt, &put);
    else render_prompt(t, &text, m, n, o, gen_prompt);
    const int bos = put ? 0 : t == NV_CHAT_OLMO2 ? SINK_BOS_ALWAYS : 1; /* (OLMo 2's template writes bos_token) */
    if (e == NV_OK && (text.len || !put))
        e = text.oom ? nv_fail(NV_ENOMEM, "chat: out of memory") : sink_put(out, text.data ? text.data : "", bos, 0);
    nv_buf_free(&text);
    return e;
}

nv_err nv_chat_render_text(nv_chat_template t, const nv_tokenizer *tok, const nv_chat_msg *m, int n, const nv_chat_opts *o,
                           nv_buf *text) {
    const sink out = {.tok = tok, .text = text};
    return render(t, m, n, o, &out, 1);
}

nv_err nv_chat_render_opts(nv_chat_template t, const nv_tokenizer *tok, const nv_chat_msg *m, int n,
                           const nv_chat_opts *o, int **tokens, int *n_tokens) {
    *tokens = NULL;
    *n_tokens = 0;
    nv_ids out = {0};
    const sink to_ids = {.tok = tok, .ids = &out};
    nv_err e = render(t, m, n, o, &to_ids, 1);
    if (e != NV_OK) {
        free(out.v);
        return e;
    }
    *tokens = out.v;
    *n_tokens = out.n;
    return NV_OK;
}

int nv_chat_leading_bos(nv_chat_template t, const nv_tokenizer *tok, const int *ids, int n) {
    return t != NV_CHAT_LLAMA2 && n > 0 && ids[0] == nv_tokenizer_bos(tok);
}

nv_err nv_chat_render_history(nv_chat_template t, const nv_tokenizer *tok, const nv_chat_msg *m, int n, const nv_chat_opts *o,
                              int **tokens, int *n_tokens) {
    *tokens = NULL;
    *n_tokens = 0;
    if (n < 1 || strcmp(m[n - 1].role, "assistant") != 0)
        return nv_fail(NV_EINVAL, "chat: a conversation so far ends with the assistant's answer");
    nv_chat_opts closed = *o;
    closed.continue_final = 0;
    if (t == NV_CHAT_PLAIN && !o->jinja) {
        nv_buf text = {0};
        render_plain(&text, m, n - 1, &closed);
        nv_buf_puts(&text, m[n - 1].content);
        hermes_calls(&text, &m[n - 1]);
        nv_ids out = {0};
        nv_err e = text.oom ? nv_fail(NV_ENOMEM, "chat: out of memory") : nv_tokenizer_encode_into(tok, text.data ? text.data : "", 1, 0, &out);
        nv_buf_free(&text);
        if (e != NV_OK) {
            free(out.v);
            return e;
        }
        *tokens = out.v;
        *n_tokens = out.n;
        return NV_OK;
    }
    nv_chat_msg *more = malloc(((size_t)n + 1) * sizeof *more);
    if (!more) return nv_fail(NV_ENOMEM, "chat: out of memory");
    memcpy(more, m, (size_t)n * sizeof *more);
    more[n] = (nv_chat_msg){.role = "user", .content = "."};
    int *all = NULL, na = 0, *next = NULL, nn = 0;
    nv_err e = nv_chat_render_opts(t, tok, more, n + 1, &closed, &all, &na);
    if (e == NV_OK) e = nv_chat_render_opts(t, tok, more + n, 1, &closed, &next, &nn);
    free(more);
    const int skip = e == NV_OK && nv_chat_leading_bos(t, tok, next, nn), tail = nn - skip;
    if (e == NV_OK && tail > 0 && na > tail && !memcmp(all + na - tail, next + skip, (size_t)tail * sizeof *all)) {
        *tokens = all;
        *n_tokens = na - tail;
        all = NULL;
    } else if (e == NV_OK) {
        int np;
        e = nv_chat_render_turn(t, tok, m, n, &closed, tokens, n_tokens, &np);
    }
    free(all);
    free(next);
    return e;
}

nv_err nv_chat_render_turn(nv_chat_template t, const nv_tokenizer *tok, const nv_chat_msg *m, int n, const nv_chat_opts *o,
                           int **tokens, int *n_tokens, int *n_prompt) {
    *tokens = NULL;
    *n_tokens = *n_prompt = 0;
    if (n < 1 || strcmp(m[n - 1].role, "assistant") != 0)
        return nv_fail(NV_EINVAL, "chat: a turn ends with the assistant's answer");
    /* llama2 shows an assistant message that ends the messages as an answer to continue: one right
       after another would be trained as its continuation */
    if (t == NV_CHAT_LLAMA2 && !o->jinja && n >= 2 && !strcmp(m[n - 2].role, "assistant"))
        return nv_fail(NV_EFORMAT, "chat: the llama2 template cannot hold two assistant messages in a row");
    int *prompt = NULL, np = 0;
    if (!o->jinja) NV_TRY(nv_chat_render_opts(t, tok, m, n - 1, o, &prompt, &np)); /* (o->jinja: from the prompt's text below) */
    nv_ids out = {0};
    nv_buf answer = {0}; /* the answer's text and what ends it (text templates) */
    nv_err e = NV_OK;
    const nv_chat_msg *a = &m[n - 1];
    if (o->jinja) { /* the whole conversation as the template ends it; the answer: what follows the prompt's text */
        nv_chat_opts whole = *o;
        whole.continue_final = 0;
        nv_buf p = {0};
        nv_ids pids = {0};
        e = jinja_text(tok, m, n - 1, o, 1, &p);
        if (e == NV_OK) e = jinja_text(tok, m, n, &whole, 0, &answer);
        if (e == NV_OK && (p.oom || answer.oom)) e = nv_fail(NV_ENOMEM, "chat: out of memory");
        if (e == NV_OK && (answer.len < p.len || (p.len && memcmp(answer.data, p.data, p.len))))
            e = nv_fail(NV_EFORMAT, "the chat template's generation prompt is not how it begins the answer it renders: it cannot be "
                                    "trained on as the server would prompt it");
        if (e == NV_OK) { /* the answer up to what stops the server's generation (the template's stop, else EOS); EOS after it when
                             neither follows, so that the model learns to stop */
            const char *stop = nv_chat_template_stop(t), *eos = nv_tokenizer_eos(tok) >= 0 ? nv_tokenizer_special_text(tok, nv_tokenizer_eos(tok)) : NULL;
            const long after = answer.data ? content_end(answer.data, answer.len, p.len, a->content ? a->content : "") : -1;
            const char *from = answer.data ? answer.data + (after >= 0 ? (size_t)after : p.len) : "", *end = NULL;
            if (stop && *stop) end = strstr(from, stop);
            if (end) end += strlen(stop);
            else if (eos && *eos && (end = strstr(from, eos))) end += strlen(eos);
            if (end) answer.len = (size_t)(end - answer.data), answer.data[answer.len] = 0;
            else if (eos && *eos) nv_buf_puts(&answer, eos);
            if (answer.oom) e = nv_fail(NV_ENOMEM, "chat: out of memory");
        }
        if (e == NV_OK) e = encode_spelled(tok, p.data ? p.data : "", &pids); /* the prompt's ids, as the server feeds them */
        prompt = pids.v, np = pids.n;
        if (e == NV_OK) e = encode_spelled(tok, answer.data ? answer.data : "", &out);
        if (e == NV_OK) nv_buf_consume(&answer, p.len);
        nv_buf_free(&p);
    } else if (t == NV_CHAT_LLAMA2) { /* the last answer is continued (no EOS): then the EOS that ends it */
        const sink to_ids = {.tok = tok, .ids = &out};
        e = render_llama2(m, n, o, &to_ids);
        if (e == NV_OK) e = nv_tokenizer_encode_into(tok, "", 0, 1, &out);
    } else if (t == NV_CHAT_MISTRAL || t == NV_CHAT_OLMO2) { /* the answer as the template ends it, with EOS */
        const sink to_ids = {.tok = tok, .ids = &out};
        nv_chat_opts whole = *o;
        whole.continue_final = 0;
        e = render(t, m, n, &whole, &to_ids, 0);
        if (t == NV_CHAT_OLMO2) { /* (the answer's text, for a vocabulary that merges across the boundary) */
            nv_buf_puts(&answer, a->content);
            hermes_calls(&answer, a);
        } else if (a->n_calls) {
            call_list(&answer, NV_MISTRAL_CALLS, a, 1);
        } else {
            nv_buf_puts(&answer, " ");
            put_stripped(&answer, a->content);
        }
    } else {
        nv_buf text = {0};
        if (t == NV_CHAT_PLAIN) { /* the answer is the text's next line, ended by EOS */
            render_plain(&text, m, n - 1, o);
            if (n > 1) nv_buf_puts(&answer, "\n");
            nv_buf_puts(&answer, a->content);
            hermes_calls(&answer, a);
        } else { /* the answer after the prompt, as the template shows it, and the template's end marker */
            render_prompt(t, &text, m, n - 1, o, 1);
            if (t == NV_CHAT_LLAMA3) {
                llama3_body(&answer, a);
            } else {
                const char *c = a->content;
                while (t == NV_CHAT_SMOLLM3 && *c == '\n') c++; /* as SmolLM3's template shows an answer */
                nv_buf_puts(&answer, c);
                if (t == NV_CHAT_GRANITE) call_list(&answer, NV_GRANITE_CALLS, a, 0);
                else if (t == NV_CHAT_PHI4_MINI) phi4_calls(&answer, a);
                else hermes_calls(&answer, a);
            }
            nv_buf_puts(&answer, nv_chat_template_stop(t));
        }
        if (!answer.oom && answer.len) nv_buf_append(&text, answer.data, answer.len);
        e = text.oom || answer.oom ? nv_fail(NV_ENOMEM, "chat: out of memory")
                                   : nv_tokenizer_encode_into(tok, text.data ? text.data : "", 1, t == NV_CHAT_PLAIN, &out);
        nv_buf_free(&text);
    }
    int k = 0; /* the prompt's tokens, unless the answer's first token merged with its last */
    while (e == NV_OK && k < np && k < out.n && prompt[k] == out.v[k]) k++;
    if (e == NV_OK && k < np) {
        /* a byte-level vocabulary can merge across the boundary (punctuation and a line break): then the
           server's prompt, and the answer encoded on its own, as the model would write it after that
           prompt; a vocabulary with a dummy-space prefix cannot encode a piece on its own */
        free(out.v);
        out = (nv_ids){0};
        if ((t == NV_CHAT_LLAMA2 && !o->jinja) || !nv_tokenizer_byte_level(tok)) {
            e = nv_fail(NV_EUNSUPPORTED, "chat: the answer's first token merges with the prompt's last");
        } else {
            out.v = prompt, out.n = out.cap = np;
            prompt = NULL;
            e = o->jinja ? encode_spelled(tok, answer.data ? answer.data : "", &out)
                         : nv_tokenizer_encode_into(tok, answer.data ? answer.data : "", 0,
                                                    t == NV_CHAT_PLAIN || t == NV_CHAT_MISTRAL || t == NV_CHAT_OLMO2, &out);
            k = np;
        }
    }
    free(prompt);
    nv_buf_free(&answer);
    if (e != NV_OK) {
        free(out.v);
        return e;
    }
    *tokens = out.v;
    *n_tokens = out.n;
    *n_prompt = k;
    return NV_OK;
}

/* ---- the templates in Jinja, as tokenizer_config.json and GGUF's tokenizer.chat_template carry them ----
 * Each renders exactly the text nv_chat_render_text gives (add_generation_prompt: the assistant's
 * header the server always adds; enable_thinking false: chatml's empty reasoning). Literal text sits
 * only inside {{ }} so no consumer's whitespace rules (trim_blocks, lstrip_blocks) can touch it. */

#define J_SYS "['system', 'developer']"
#define J_TOOL "['tool', 'function']"
/* BOS where the tokenizer prepends one (a consumer passes bos_token; none for Qwen's vocabularies) */
#define J_BOS "{%- if bos_token %}{{- bos_token }}{%- endif %}"
/* ns.c: message m's text (a string, or its text parts joined) */
#define J_CONTENT                                                                                                        \
    "{%- if m.content is string %}{%- set ns.c = m.content %}{%- else %}{%- set ns.c = '' %}"                           \
    "{%- for p in m.content or [] %}{%- if p.type == 'text' %}{%- set ns.c = ns.c + p.text %}{%- endif %}{%- endfor %}"  \
    "{%- endif %}"
#define J_ARGS "{%- if f.arguments is string %}{{- f.arguments }}{%- else %}{{- f.arguments | tojson }}{%- endif %}"
/* an assistant's calls in Hermes form after its text (a line break before each but a first one that
 * opens an empty message) */
#define J_HERMES_CALLS                                                                                                   \
    "{%- for tc in m.tool_calls or [] %}{%- set f = tc.function if tc.function is defined else tc %}"                    \
    "{%- if not loop.first or ns.c %}{{- '\\n' }}{%- endif %}"                                                           \
    "{{- '<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' }}" J_ARGS "{{- '}\\n</tool_call>' }}"           \
    "{%- endfor %}"
#define J_TOOLS_HEAD                                                                                                     \
    "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with "        \
    "function signatures within <tools></tools> XML tags:\\n<tools>"
#define J_TOOLS_TAIL                                                                                                     \
    "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "            \
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "                     \
    "<args-json-object>}\\n</tool_call>"
#define J_HERMES_TOOLS                                                                                                   \
    "{{- '" J_TOOLS_HEAD "' }}{%- for t in tools %}{{- '\\n' + (t | tojson) }}{%- endfor %}{{- '" J_TOOLS_TAIL "' }}"
#define J_RESPONSE "'<tool_response>\\n' + ns.c + '\\n</tool_response>'"
#define J_IS_TOOL(i) "messages[" i "].role in " J_TOOL
#define J_EACH "{%- for i in range(ns.start, messages | length) %}{%- set m = messages[i] %}" J_CONTENT

static const char jinja_plain[] =
    "{%- set ns = namespace(c='', start=0) %}" J_BOS
    "{%- if tools %}" J_HERMES_TOOLS "{{- '\\n' }}{%- endif %}"
    J_EACH
    "{%- if i %}{{- '\\n' }}{%- endif %}"
    "{%- if m.role in " J_TOOL " %}{{- " J_RESPONSE " }}{%- else %}{{- ns.c }}{%- endif %}" J_HERMES_CALLS
    "{%- endfor %}";

/* render_turns' form, of the markers PRE role CLOSE and END (turn_marks': the line breaks in them);
 * THINK after the generation prompt */
#define J_TURNS(PRE, CLOSE, END, THINK)                                                                                  \
    "{%- set ns = namespace(c='', start=0) %}" J_BOS                                                                     \
    "{%- if tools %}{{- '" PRE "system" CLOSE "' }}"                                                                     \
    "{%- if messages and messages[0].role in " J_SYS " %}{%- set m = messages[0] %}" J_CONTENT                           \
    "{{- ns.c + '\\n\\n' }}{%- set ns.start = 1 %}{%- endif %}" J_HERMES_TOOLS "{{- '" END "' }}{%- endif %}"            \
    J_EACH                                                                                                               \
    "{%- if m.role in " J_TOOL " %}"                                                                                     \
    "{%- if i == 0 or not " J_IS_TOOL("i - 1") " %}{{- '" PRE "user" CLOSE "' }}{%- else %}{{- '\\n' }}{%- endif %}"     \
    "{{- " J_RESPONSE " }}"                                                                                              \
    "{%- if i == messages | length - 1 or not " J_IS_TOOL("i + 1") " %}{{- '" END "' }}{%- endif %}"                     \
    "{%- else %}"                                                                                                        \
    "{{- '" PRE "' + ('system' if m.role in " J_SYS " else m.role) + '" CLOSE "' + ns.c }}" J_HERMES_CALLS               \
    "{{- '" END "' }}"                                                                                                   \
    "{%- endif %}{%- endfor %}"                                                                                          \
    "{%- if add_generation_prompt %}{{- '" PRE "assistant" CLOSE "' }}" THINK "{%- endif %}"

static const char jinja_chatml[] = J_TURNS(
    "<|im_start|>", "\\n", "<|im_end|>\\n",
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}");
static const char jinja_phi3[] = J_TURNS("<|", "|>\\n", "<|end|>\\n", "");
static const char jinja_phi4[] = J_TURNS("<|im_start|>", "<|im_sep|>", "<|im_end|>", "");
#define J_GRANITE_ROLE(r) "'<|start_of_role|>' + " r " + '<|end_of_role|>'"
/* call_list's form (Granite's list, and Phi-4-mini's), the list closed by END */
#define J_CALL_LIST(END)                                                                                                 \
    "{%- if m.tool_calls %}{{- '" NV_GRANITE_CALLS "' }}"                                                                \
    "{%- for tc in m.tool_calls %}{%- set f = tc.function if tc.function is defined else tc %}"                        \
    "{%- if not loop.first %}{{- ', ' }}{%- endif %}{{- '{\"name\": \"' + f.name + '\", \"arguments\": ' }}" J_ARGS       \
    "{{- '}' }}{%- endfor %}{{- '" END "' }}{%- endif %}"
static const char jinja_granite[] =
    "{%- set ns = namespace(c='', start=0) %}" J_BOS
    "{%- if tools %}{{- " J_GRANITE_ROLE("'system'") " }}"
    "{%- if messages and messages[0].role in " J_SYS " %}{%- set m = messages[0] %}" J_CONTENT
    "{{- ns.c }}{%- set ns.start = 1 %}{%- else %}{{- \"" GRANITE_TOOLS_SYSTEM "\" }}{%- endif %}"
    "{{- '<|end_of_text|>\\n' + " J_GRANITE_ROLE("'available_tools'") " + (tools | tojson(indent=4)) + '<|end_of_text|>\\n' }}"
    "{%- endif %}"
    J_EACH
    "{%- set role = 'system' if m.role in " J_SYS " else ('tool_response' if m.role in " J_TOOL " else m.role) %}"
    "{{- " J_GRANITE_ROLE("role") " + ns.c }}" J_CALL_LIST("]")
    "{{- '<|end_of_text|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- " J_GRANITE_ROLE("'assistant'") " }}{%- endif %}";

static const char jinja_phi4_mini[] =
    "{%- set ns = namespace(c='', start=0) %}" J_BOS
    "{%- if tools %}{{- '<|system|>' }}"
    "{%- if messages and messages[0].role in " J_SYS " %}{%- set m = messages[0] %}" J_CONTENT
    "{{- ns.c }}{%- set ns.start = 1 %}{%- endif %}"
    "{{- '<|tool|>[' }}{%- for t in tools %}{%- if not loop.first %}{{- ', ' }}{%- endif %}"
    "{{- (t.function if t.function is defined else t) | tojson }}{%- endfor %}{{- ']<|/tool|><|end|>' }}"
    "{%- endif %}"
    J_EACH
    "{{- '<|' + ('system' if m.role in " J_SYS " else ('tool' if m.role in " J_TOOL " else m.role)) + '|>' + ns.c }}"
    J_CALL_LIST("]" PHI4_CALLS_END) "{{- '<|end|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>' }}{%- endif %}";

static const char jinja_mistral[] =
    "{%- set ns = namespace(c='', start=0, sys='', last=-1) %}" J_BOS
    "{%- for m in messages %}{%- if m.role in " J_SYS " %}" J_CONTENT
    "{%- set ns.sys = ns.sys + ('\\n\\n' if ns.sys else '') + ns.c %}"
    "{%- elif m.role == 'user' %}{%- set ns.last = loop.index0 %}{%- endif %}{%- endfor %}"
    J_EACH
    "{%- if m.role in " J_SYS " %}"
    "{%- elif m.role in " J_TOOL " %}"
    "{{- '[TOOL_RESULTS] {\"content\": ' + ns.c + ', \"call_id\": \"' + (m.tool_call_id or '') + '\"}[/TOOL_RESULTS]' }}"
    "{%- elif m.role != 'assistant' %}"
    "{%- if i == ns.last and tools %}{{- '[AVAILABLE_TOOLS] [' }}"
    "{%- for t in tools %}{%- if not loop.first %}{{- ', ' }}{%- endif %}{{- t | tojson }}{%- endfor %}"
    "{{- '][/AVAILABLE_TOOLS]' }}{%- endif %}"
    "{{- '[INST] ' + (ns.sys + '\\n\\n' if i == ns.last and ns.sys else '') + ns.c + '[/INST]' }}"
    "{%- elif m.tool_calls %}{{- '" NV_MISTRAL_CALLS "' }}"
    "{%- for tc in m.tool_calls %}{%- set f = tc.function if tc.function is defined else tc %}"
    "{%- if not loop.first %}{{- ', ' }}{%- endif %}{{- '{\"name\": \"' + f.name + '\", \"arguments\": ' }}" J_ARGS
    "{{- ', \"id\": \"' + (tc.id or '') + '\"}' }}{%- endfor %}{{- ']' + eos_token }}"
    "{%- else %}{{- ' ' + (ns.c | trim) + eos_token }}"
    "{%- endif %}{%- endfor %}";

static const char jinja_llama2[] =
    "{%- set ns = namespace(c='', start=0, sys='', user='', first=true, have_user=false) %}"
    "{%- set bos = bos_token if bos_token else '' %}"
    "{%- for m in messages %}{%- if m.role in " J_SYS " %}" J_CONTENT
    "{%- if ns.sys %}{%- set ns.sys = ns.sys + '\\n\\n' %}{%- endif %}{%- set ns.sys = ns.sys + (ns.c | trim) %}"
    "{%- endif %}{%- endfor %}"
    "{%- if tools %}{%- if ns.sys %}{%- set ns.sys = ns.sys + '\\n\\n' %}{%- endif %}"
    "{%- set ns.sys = ns.sys + '" J_TOOLS_HEAD "' %}"
    "{%- for t in tools %}{%- set ns.sys = ns.sys + '\\n' + (t | tojson) %}{%- endfor %}"
    "{%- set ns.sys = ns.sys + '" J_TOOLS_TAIL "' %}{%- endif %}"
    J_EACH
    "{%- if m.role in " J_SYS " %}"
    "{%- elif m.role != 'assistant' %}"
    "{%- if ns.have_user %}{%- set ns.user = ns.user + '\\n\\n' %}{%- endif %}"
    "{%- if m.role in " J_TOOL " %}{%- set ns.user = ns.user + " J_RESPONSE " %}"
    "{%- else %}{%- set ns.user = ns.user + (ns.c | trim) %}{%- endif %}"
    "{%- set ns.have_user = true %}"
    "{%- else %}"
    "{{- bos + '[INST] ' }}{%- if ns.first and ns.sys %}{{- '<<SYS>>\\n' + ns.sys + '\\n<</SYS>>\\n\\n' }}{%- endif %}"
    "{{- ns.user + ' [/INST] ' + (ns.c | trim) }}" J_HERMES_CALLS
    "{%- if i < messages | length - 1 %}{{- ' ' + eos_token }}{%- endif %}"
    "{%- set ns.user = '' %}{%- set ns.have_user = false %}{%- set ns.first = false %}"
    "{%- endif %}{%- endfor %}"
    "{%- if messages[-1].role != 'assistant' %}"
    "{{- bos + '[INST] ' }}{%- if ns.first and ns.sys %}{{- '<<SYS>>\\n' + ns.sys + '\\n<</SYS>>\\n\\n' }}{%- endif %}"
    "{{- ns.user + ' [/INST]' }}{%- endif %}";

static const char jinja_llama3[] =
    "{%- set ns = namespace(c='', start=0, preamble=false) %}" J_BOS
    "{%- if tools %}{{- '<|start_header_id|>system<|end_header_id|>\\n\\nEnvironment: ipython\\n\\n' }}"
    "{%- if messages and messages[0].role in " J_SYS " %}{%- set m = messages[0] %}" J_CONTENT
    "{{- ns.c | trim }}{%- set ns.start = 1 %}{%- endif %}"
    "{{- '<|eot_id|>' }}{%- set ns.preamble = true %}{%- endif %}"
    J_EACH
    "{%- set role = 'system' if m.role in " J_SYS " else ('ipython' if m.role in " J_TOOL " else m.role) %}"
    "{{- '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' }}"
    "{%- if ns.preamble and role == 'user' %}"
    "{{- 'Given the following functions, please respond with a JSON for a function call with its proper arguments "
    "that best answers the given prompt.\\n\\nRespond in the format {\"name\": function name, \"parameters\": "
    "dictionary of argument name and its value}.Do not use variables.\\n\\n' }}"
    "{%- for t in tools %}{{- (t | tojson(indent=4)) + '\\n\\n' }}{%- endfor %}{%- set ns.preamble = false %}"
    "{%- endif %}"
    "{%- if m.tool_calls %}{%- for tc in m.tool_calls %}{%- set f = tc.function if tc.function is defined else tc %}"
    "{%- if not loop.first %}{{- '\\n' }}{%- endif %}{{- '{\"name\": \"' + f.name + '\", \"parameters\": ' }}" J_ARGS
    "{{- '}' }}{%- endfor %}"
    "{%- else %}{{- ns.c | trim }}{%- endif %}"
    "{{- '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}";

static const char jinja_deepseek[] =
    "{%- set ns = namespace(c='', start=0, sys=false) %}" J_BOS
    "{%- for m in messages %}{%- if m.role in " J_SYS " %}" J_CONTENT
    "{%- if ns.sys %}{{- '\\n\\n' }}{%- endif %}{{- ns.c }}{%- set ns.sys = true %}{%- endif %}{%- endfor %}"
    "{%- if tools %}{%- if ns.sys %}{{- '\\n\\n' }}{%- endif %}" J_HERMES_TOOLS "{%- endif %}"
    J_EACH
    "{%- if m.role in " J_SYS " %}"
    "{%- elif m.role in " J_TOOL " %}"
    "{{- ('" DS_USER "' if i == 0 or not " J_IS_TOOL("i - 1") " else '\\n') + " J_RESPONSE " }}"
    "{%- elif m.role != 'assistant' %}{{- '" DS_USER "' + ns.c }}"
    "{%- else %}{{- '" DS_ASSISTANT "' + ns.c.split('</think>')[-1] }}" J_HERMES_CALLS "{{- '" DS_END "' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '" DS_ASSISTANT "' }}{%- endif %}";

static const char jinja_gemma[] =
    "{%- set ns = namespace(c='', start=0, pre='') %}" J_BOS
    "{%- if messages and messages[0].role in " J_SYS " %}{%- set m = messages[0] %}" J_CONTENT
    "{%- set ns.pre = ns.c + '\\n\\n' %}{%- set ns.start = 1 %}{%- endif %}"
    "{%- if tools %}{%- set ns.pre = ns.pre + '" J_TOOLS_HEAD "' %}"
    "{%- for t in tools %}{%- set ns.pre = ns.pre + '\\n' + (t | tojson) %}{%- endfor %}"
    "{%- set ns.pre = ns.pre + '" J_TOOLS_TAIL "\\n\\n' %}{%- endif %}"
    J_EACH
    "{%- set pre = ns.pre if i == ns.start else '' %}"
    "{%- if m.role in " J_TOOL " %}"
    "{%- if i == 0 or not " J_IS_TOOL("i - 1") " %}{{- '<start_of_turn>user\\n' + pre }}{%- else %}{{- '\\n' }}{%- endif %}"
    "{{- " J_RESPONSE " }}"
    "{%- if i == messages | length - 1 or not " J_IS_TOOL("i + 1") " %}{{- '<end_of_turn>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<start_of_turn>' + ('model' if m.role == 'assistant' else 'user') + '\\n' + pre + (ns.c | trim) }}" J_HERMES_CALLS
    "{{- '<end_of_turn>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}";

/* OLMo 2's turns' form (bos_token as J_BOS: transformers passes it always, as OLMo 2's own template writes it) */
static const char jinja_olmo2[] =
    "{%- set ns = namespace(c='', start=0) %}" J_BOS
    "{%- if tools %}{{- '<|system|>\\n' }}"
    "{%- if messages and messages[0].role in " J_SYS " %}{%- set m = messages[0] %}" J_CONTENT
    "{{- ns.c + '\\n\\n' }}{%- set ns.start = 1 %}{%- endif %}" J_HERMES_TOOLS "{{- '\\n' }}{%- endif %}"
    J_EACH
    "{%- if m.role in " J_TOOL " %}"
    "{%- if i == 0 or not " J_IS_TOOL("i - 1") " %}{{- '<|user|>\\n' }}{%- else %}{{- '\\n' }}{%- endif %}"
    "{{- " J_RESPONSE " }}"
    "{%- if i == messages | length - 1 or not " J_IS_TOOL("i + 1") " %}{{- '\\n' }}{%- endif %}"
    "{%- elif m.role == 'assistant' %}{{- '<|assistant|>\\n' + ns.c }}" J_HERMES_CALLS "{{- eos_token }}"
    "{%- if i < messages | length - 1 %}{{- '\\n' }}{%- endif %}"
    "{%- else %}{{- '<|' + ('system' if m.role in " J_SYS " else m.role) + '|>\\n' + ns.c + '\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- endif %}";

/* SmolLM3's: its system turn (today's date from strftime_now, as its own template has it; thinking
   unless enable_thinking is false or the system message says /no_think), then its turns */
static const char jinja_smollm3[] =
    "{%- set ns = namespace(c='', start=0, think=true, sys='') %}" J_BOS
    "{%- if enable_thinking is defined and enable_thinking is false %}{%- set ns.think = false %}{%- endif %}"
    "{%- if messages and messages[0].role in " J_SYS " %}{%- set m = messages[0] %}" J_CONTENT "{%- set ns.sys = ns.c %}"
    "{%- if '/no_think' in ns.sys %}{%- set ns.think = false %}{%- elif '/think' in ns.sys %}{%- set ns.think = true %}{%- endif %}"
    "{%- endif %}"
    "{%- set custom = ns.sys.replace('/no_think', '').replace('/think', '').rstrip() %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if '/system_override' in ns.sys %}{{- custom.replace('/system_override', '').rstrip() + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '## Metadata\\n\\nKnowledge Cutoff Date: June 2025\\nToday Date: ' + strftime_now('%d %B %Y') + '\\nReasoning Mode: ' + "
    "('/think' if ns.think else '/no_think') + '\\n\\n## Custom Instructions\\n\\n' }}"
    "{%- if custom %}{{- custom }}{%- elif ns.think %}{{- '" SMOLLM3_THINK "' }}{%- else %}{{- '" SMOLLM3_NO_THINK "' }}{%- endif %}"
    "{{- '\\n\\n' }}"
    "{%- if tools %}{{- '### Tools\\n\\nYou may call one or more functions to assist with the user query.\\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\\n\\n<tools>\\n' }}{%- for t in tools %}{{- (t | string) + '\\n' }}{%- endfor %}"
    "{{- '</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    "XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call>\\n\\n<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
    J_EACH
    "{%- if m.role in " J_SYS " %}"
    "{%- elif m.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + ('' if ns.think else '<think>\\n\\n</think>\\n') + ns.c.lstrip('\\n') }}" J_HERMES_CALLS
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>user\\n' + ns.c + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' + ('' if ns.think else '<think>\\n\\n</think>\\n') }}{%- endif %}";

const char *nv_chat_template_jinja(nv_chat_template t) {
    switch (t) {
    case NV_CHAT_PLAIN: return jinja_plain;
    case NV_CHAT_CHATML: return jinja_chatml;
    case NV_CHAT_LLAMA2: return jinja_llama2;
    case NV_CHAT_LLAMA3: return jinja_llama3;
    case NV_CHAT_DEEPSEEK: return jinja_deepseek;
    case NV_CHAT_PHI3: return jinja_phi3;
    case NV_CHAT_GEMMA: return jinja_gemma;
    case NV_CHAT_GRANITE: return jinja_granite;
    case NV_CHAT_MISTRAL: return jinja_mistral;
    case NV_CHAT_PHI4_MINI: return jinja_phi4_mini;
    case NV_CHAT_PHI4: return jinja_phi4;
    case NV_CHAT_OLMO2: return jinja_olmo2;
    case NV_CHAT_SMOLLM3: return jinja_smollm3;
    }
    return NULL;
}

char *nv_chat_jinja_marked(char *text) {
    static const char mark[] = NV_CHAT_RUN_AS_JINJA;
    if (!text || !strncmp(text, mark, sizeof mark - 1)) return text;
    const size_t n = strlen(text);
    char *out = malloc(sizeof mark + n);
    if (out) memcpy(out, mark, sizeof mark - 1), memcpy(out + sizeof mark - 1, text, n + 1);
    free(text);
    return out;
}

int nv_chat_template_of_jinja(const char *text, size_t n, nv_chat_template *out) {
    for (int i = 0; i < N_TEMPLATES; i++) {
        const char *j = nv_chat_template_jinja((nv_chat_template)i);
        if (j && strlen(j) == n && !memcmp(j, text, n)) {
            *out = (nv_chat_template)i;
            return 1;
        }
    }
    return 0;
}
