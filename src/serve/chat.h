/* Chat templates: turning a list of chat messages into the prompt's token ids.
 *
 * Contract (every template starts with BOS where the vocabulary prepends one: llama2.c's always,
 * byte-level ones when they ask for it; their special tokens' text becomes those tokens):
 * - plain: the messages' contents joined by "\n", no role markers, encoded as one text; the
 *   assistant continues the text. For a single message this is exactly the tokens
 *   /v1/completions gives the same text. llama2.c checkpoints carry no template, so plain is
 *   what the server uses for them unless --chat-template says otherwise.
 * - chatml: "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per message, then
 *   "<|im_start|>assistant\n"; generation also stops at the text "<|im_end|>".
 * - llama2: Meta's Llama-2 chat format: per exchange BOS "[INST] USER [/INST] ANSWER" EOS, the
 *   system messages folded into the first user turn as "<<SYS>>\nSYSTEM\n<</SYS>>\n\n", and
 *   the last user turn as BOS "[INST] USER [/INST]". Consecutive user messages are joined by
 *   "\n\n". A final assistant message is continued (no EOS after it).
 * - llama3: Meta's Llama 3 format: BOS (when the vocabulary prepends one), then per message
 *   "<|start_header_id|>ROLE<|end_header_id|>\n\n" CONTENT (trimmed) "<|eot_id|>", then
 *   "<|start_header_id|>assistant<|end_header_id|>\n\n"; generation also stops at the text
 *   "<|eot_id|>". With a byte-level vocabulary the markers are its special tokens.
 * - deepseek: DeepSeek-R1's (and its Qwen and Llama distillations'): BOS, the system messages'
 *   text, then per message "<｜User｜>" CONTENT or "<｜Assistant｜>" CONTENT "<｜end▁of▁sentence｜>"
 *   (an earlier answer without its reasoning: the text after its last "</think>", as the model's own
 *   template shows it), then "<｜Assistant｜>"; generation also stops at "<｜end▁of▁sentence｜>"
 *   (the vocabulary's EOS). llama.cpp's deepseek3.
 * Roles: system, developer (as system), user, assistant, tool.
 *
 * Tools (nv_chat_opts.tools: each tool's JSON as the template prints it, Python's json.dumps style:
 * one line for Hermes, indented by 4 for llama3 and granite):
 * - chatml, plain, llama2, deepseek use the Hermes format Qwen2.5/Qwen3 are trained on: a "# Tools" block
 *   listing the tools inside <tools></tools> and asking for calls as
 *   <tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>, in the system turn (chatml: the
 *   first system message's text first; llama2: inside <<SYS>>; deepseek: after the system text;
 *   plain: the first lines). An
 *   assistant message's calls follow its content in that form; tool results are user turns of
 *   <tool_response>\nCONTENT\n</tool_response> (consecutive ones in one turn).
 * - llama3 uses Meta's Llama 3.1 JSON format: "Environment: ipython" opens the system turn, the
 *   tools (indented JSON) and the instruction to answer {"name": ..., "parameters": ...} go
 *   before the first user message, an assistant's call is that JSON, and tool results are
 *   ipython turns.
 * - granite uses IBM Granite 3's own format: a system turn (the first system message, else Granite's
 *   line saying tools exist and asking for "<|tool_call|> followed by a JSON list"), then an
 *   available_tools turn holding the tools as one JSON list indented by 4; an assistant's calls
 *   follow its text as <|tool_call|>[{"name": NAME, "arguments": ARGS}, ...]; each tool result is a
 *   tool_response turn (with or without tools in the request).
 * - mistral uses Mistral's v3 format (Mistral-7B-Instruct-v0.3, Mistral-Large-2407): BOS, then
 *   "[INST] USER[/INST]" per user message, " ANSWER" EOS per answer; the system messages' text
 *   opens the last user message (then "\n\n"), and the tools, as one JSON list, go before it as
 *   "[AVAILABLE_TOOLS] [...][/AVAILABLE_TOOLS]"; an assistant's calls (its text, if any, is not
 *   shown, as Mistral's template drops it) are "[TOOL_CALLS] [{"name", "arguments", "id"}, ...]"
 *   EOS, each tool result "[TOOL_RESULTS] {"content": RESULT, "call_id": "ID"}[/TOOL_RESULTS]".
 * - smollm3 is SmolLM3's template: ChatML's turns after a system turn of its own, "## Metadata" (its
 *   knowledge cutoff, today's date, "Reasoning Mode: /think" or "/no_think": thinking unless
 *   nv_chat_opts.no_think or the first system message says /no_think) and "## Custom Instructions"
 *   (the first system message without those switches, else SmolLM3's default for the mode), left
 *   open as SmolLM3's template leaves it unless tools close it ("### Tools", Hermes's list and
 *   instruction); a "/system_override" system message stands alone instead. Other system messages
 *   are not shown, tool results are user turns, and without thinking each answer (and the
 *   generation prompt) starts with an empty "<think>\n\n</think>\n". An answer's calls follow its
 *   text in Hermes form (SmolLM3's own template drops them from the history). */
#ifndef NV_SERVE_CHAT_H
#define NV_SERVE_CHAT_H

#include <stddef.h>

#include "base/buf.h"
#include "base/err.h"
#include "model/tokenizer.h"
#include "serve/jinja.h"

typedef enum { NV_CHAT_PLAIN = 0, NV_CHAT_CHATML, NV_CHAT_LLAMA2, NV_CHAT_LLAMA3, NV_CHAT_DEEPSEEK, NV_CHAT_PHI3, NV_CHAT_GEMMA,
               NV_CHAT_GRANITE, NV_CHAT_MISTRAL, NV_CHAT_PHI4_MINI, NV_CHAT_PHI4, NV_CHAT_OLMO2, NV_CHAT_SMOLLM3 } nv_chat_template;

/* DeepSeek's assistant marker, <｜Assistant｜> (fullwidth vertical bars): the deepseek template writes
 * it, and a GGUF file's template holding it is recognised as that one. */
#define NV_CHAT_DEEPSEEK_ASSISTANT "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"

typedef struct {
    const char *name;
    const char *arguments; /* JSON text */
    const char *id;        /* the call's id, or NULL (mistral writes it) */
} nv_chat_call;

typedef struct {
    const char *role;
    const char *content;
    const nv_chat_call *calls; /* an assistant's tool calls */
    int n_calls;
    const char *tool_call_id; /* a tool result's call, or NULL (mistral writes it) */
    const char *name;         /* the message's 'name' (a participant's, or a tool's), or NULL: templates run as Jinja see it */
    const char *reasoning;    /* an assistant's earlier reasoning (reasoning_content), or NULL: templates run as Jinja see it */
    /* an assistant's calls with no text: a template run as Jinja sees its content as none, as clients
       mostly send it, unless the request sent the empty string (then ""); templates differ on the two */
    int text_given;
} nv_chat_msg;

typedef struct {
    int no_think; /* chatml: Qwen3's non-thinking turn (see nv_chat_render_ex) */
    const char *const *tools; /* each tool's JSON (above), NULL: no tools */
    int n_tools;
    /* A last message from the assistant is an answer begun, which the model continues: chatml and
     * llama3 render it without what ends a turn and without a new assistant header (llama2 and
     * plain always continue it). vLLM's continue_final_message; the Anthropic API's prefill. */
    int continue_final;
    /* add_generation_prompt false (vLLM's and llama.cpp's request field): no assistant header after the
     * last message (run as Jinja: the variable false; chatml, phi3, phi4, olmo2 and plain render it so;
     * nerve's other renderers refuse it) */
    int no_gen_prompt;
    /* The model's own Jinja template, run (src/serve/jinja.c) in place of the named template's
     * renderer, which then gives only what the answer stops at and its tool calls' format. The
     * variables are transformers': messages (OpenAI's shape; an assistant's calls with their
     * arguments as objects), tools (their JSON, or none), bos_token and eos_token (their text),
     * add_generation_prompt, enable_thinking (false with no_think) and kwargs' members (a request's
     * chat_template_kwargs). Its text is encoded as it is, BOS where the template writes it
     * (transformers' add_special_tokens false); continue_final cuts it after the last message's
     * content. A template's error (raise_exception among them) is NV_EINVAL with its message. */
    const nv_jinja *jinja;
    const struct cJSON *kwargs;
    const char *effort; /* a template run as Jinja sees it as reasoning_effort (a kwarg of that name wins); NULL: undefined */
} nv_chat_opts;

/* The tool calls' wire format of a template. */
/* Phi-4-mini's calls are Granite's list after the same marker (its vocabulary's control token, then
 * closed by <|/tool_call|>); its tools are their functions on one line. */
/* XML: Qwen3-Coder's (and Qwen3.5's) calls, each <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n
 * </parameter>\n...</function>\n</tool_call>, a string VALUE as it is and any other as its JSON text; only a
 * template run as Jinja writes them (nv_chat_jinja_tool_style). */
/* MISTRAL_ARGS: Mistral's later templates' calls (Ministral 3's: the v13 vocabulary's), each
 * [TOOL_CALLS]NAME[ARGS]{...} one after another, ending the answer; MISTRAL_CALL_ID: the same with
 * the call's id, which the model writes, between its name and its arguments (Mistral Small 3.2's, the
 * v11 vocabulary's: [TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}, ID nine letters and digits); only a template run as Jinja writes them (nv_chat_jinja_tool_style). */
typedef enum {
    NV_TOOLS_HERMES = 0, NV_TOOLS_LLAMA3, NV_TOOLS_GRANITE, NV_TOOLS_MISTRAL, NV_TOOLS_PHI4_MINI, NV_TOOLS_XML, NV_TOOLS_MISTRAL_ARGS,
    NV_TOOLS_MISTRAL_CALL_ID,
    NV_TOOLS_N /* how many */
} nv_tool_style;
nv_tool_style nv_chat_tool_style(nv_chat_template t);
/* The calls' format of a template run as Jinja whose text is jinja_text: XML where the text writes
 * "<tool_call>", "<function=" and "<parameter=" (as Qwen3-Coder's does), MISTRAL_ARGS where it writes
 * "[TOOL_CALLS]" and "[ARGS]", MISTRAL_CALL_ID where also "[CALL_ID]", else t's. */
nv_tool_style nv_chat_jinja_tool_style(nv_chat_template t, const char *jinja_text);
/* The form a template is given each tool's text in (nv_chat_opts.tools): a template run as Jinja gets
 * each tool whole (Hermes's one line: its variables are parsed back from it), a renderer its own form. */
nv_tool_style nv_chat_tool_text_style(nv_chat_template t, const nv_jinja *jinja);
/* What opens Granite's and Mistral's tool calls: one control token in their vocabularies. */
#define NV_GRANITE_TOOL_CALL "<|tool_call|>"
#define NV_MISTRAL_TOOL_CALLS "[TOOL_CALLS]"
#define NV_MISTRAL_ARGS "[ARGS]" /* between a call's name and its arguments (MISTRAL_ARGS; a control token too) */
#define NV_MISTRAL_CALL_ID "[CALL_ID]" /* between a call's name and its id (MISTRAL_CALL_ID; a control token too) */
#define NV_MISTRAL_ID_LEN 9            /* the letters and digits of a Mistral call's id (its templates take no other) */
/* 1 for the Mistral styles whose calls are NAME[ARGS]{...} (with or without the id between). */
static inline int nv_tool_style_mistral_args(nv_tool_style s) { return s == NV_TOOLS_MISTRAL_ARGS || s == NV_TOOLS_MISTRAL_CALL_ID; }
/* What their list of calls opens with, as the templates write it and the call grammar holds it. */
#define NV_GRANITE_CALLS NV_GRANITE_TOOL_CALL "["
#define NV_MISTRAL_CALLS NV_MISTRAL_TOOL_CALLS " ["
/* The text of the control token that opens the template's tool calls, which decoding must print
 * (nv_tokenizer_show): Granite's, Mistral's, Phi-4-mini's; NULL for the others (their markers are text). */
const char *nv_chat_tool_token(nv_chat_template t);
/* Shows (nv_tokenizer_show) the control tokens the calls of template t with call style jinja_tools
 * are written with (Granite's <|tool_call|>; Mistral's [TOOL_CALLS], [ARGS] and [CALL_ID]), so that
 * their text reaches the tool-call parser, as llama.cpp's preserved tokens. */
void nv_chat_show_tool_tokens(nv_tokenizer *tok, nv_chat_template t, nv_tool_style jinja_tools);

nv_err nv_chat_template_parse(const char *name, nv_chat_template *out);
const char *nv_chat_template_name(nv_chat_template t);
/* The template in Jinja, as Hugging Face's tokenizer_config.json and GGUF's tokenizer.chat_template
 * carry it: with the messages (OpenAI's shape), tools, bos_token, eos_token, add_generation_prompt
 * true and enable_thinking it renders nv_chat_render_text's text (continue_final_message: the
 * consumer's own cut after the last message). `nerve export` writes it for a chat run. */
const char *nv_chat_template_jinja(nv_chat_template t);
/* What opens a template a run trained with as Jinja when it leaves the run folder (an export, the
 * run's own model.gguf): a Jinja comment (it renders nothing in any engine) that tells nerve to run
 * the template as Jinja whatever its markers say, as the run folder's chat_template does. */
#define NV_CHAT_RUN_AS_JINJA "{#- nerve: run as Jinja -#}\n"
/* text (malloc'd; taken) with NV_CHAT_RUN_AS_JINJA before it, unless it has it (malloc'd), NULL when text is. */
char *nv_chat_jinja_marked(char *text);
/* 1 and *out when text (n bytes) is exactly one of those Jinja forms. */
int nv_chat_template_of_jinja(const char *text, size_t n, nv_chat_template *out);
/* The stop string the template implies, or NULL. */
const char *nv_chat_template_stop(nv_chat_template t);
/* 1 when role is one the templates know. */
int nv_chat_role_known(const char *role);
/* The prompt ids (caller frees *tokens). */
nv_err nv_chat_render(nv_chat_template t, const nv_tokenizer *tok, const nv_chat_msg *msgs, int n_msgs, int **tokens,
                      int *n_tokens);
/* The same; no_think (chatml only) closes an empty think block after the assistant's header,
 * "<think>\n\n</think>\n\n", which is how Qwen3's own template turns its reasoning off
 * (enable_thinking false). */
nv_err nv_chat_render_ex(nv_chat_template t, const nv_tokenizer *tok, const nv_chat_msg *msgs, int n_msgs, int no_think,
                         int **tokens, int *n_tokens);
/* The same with tools (above). */
nv_err nv_chat_render_opts(nv_chat_template t, const nv_tokenizer *tok, const nv_chat_msg *msgs, int n_msgs,
                           const nv_chat_opts *o, int **tokens, int *n_tokens);
/* The same prompt as text appended to *text: what the ids encode, with BOS and EOS spelled
 * (nv_tokenizer_special_text) where they are added. llama.cpp's /apply-template. */
nv_err nv_chat_render_text(nv_chat_template t, const nv_tokenizer *tok, const nv_chat_msg *msgs, int n_msgs,
                           const nv_chat_opts *o, nv_buf *text);
/* One assistant turn as training sees it: msgs[n_msgs - 1] is the assistant's answer; the ids are
 * the prompt nv_chat_render_opts gives the messages before it (what the server feeds the model)
 * followed by the answer's tokens as the model should produce them, ending with what stops the
 * server's generation: "<|im_end|>" (chatml), "<|eot_id|>" (llama3), EOS (llama2, plain, mistral). The
 * whole text is encoded at once, as a conversation that continues reads it; *n_prompt is where
 * the answer starts: always the prompt's length. Where the answer's first token would merge with
 * the prompt's last, a byte-level vocabulary takes the prompt's tokens and the answer encoded on its
 * own; other vocabularies fail with NV_EUNSUPPORTED (their templates put a line break or a space
 * there, which they never merge). llama2 refuses an answer right after another (NV_EFORMAT). */
nv_err nv_chat_render_turn(nv_chat_template t, const nv_tokenizer *tok, const nv_chat_msg *msgs, int n_msgs,
                           const nv_chat_opts *o, int **tokens, int *n_tokens, int *n_prompt);
/* 1 when ids (n of them) open with a BOS that a rendering going on after a conversation leaves out:
 * the templates open only the conversation with BOS, but llama2's, whose turns each open with <s>. */
int nv_chat_leading_bos(nv_chat_template t, const nv_tokenizer *tok, const int *ids, int n);
/* A conversation so far, msgs[n_msgs - 1] the assistant's answer, as the ids that a following
 * message's own rendering (its BOS left out as nv_chat_leading_bos says) goes after: Ollama's
 * context. plain: the prompt's text with the answer right after it (/api/generate's answer goes on
 * from the prompt). The others: the messages with one more user message, less that message's own
 * rendering; where the template does not end so (mistral puts the system text in the last user
 * message, smollm3 opens every rendering with its metadata system turn) nv_chat_render_turn's ids. */
nv_err nv_chat_render_history(nv_chat_template t, const nv_tokenizer *tok, const nv_chat_msg *msgs, int n_msgs,
                              const nv_chat_opts *o, int **tokens, int *n_tokens);

#endif
