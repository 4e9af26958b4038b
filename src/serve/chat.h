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
 * Roles: system, developer (as system), user, assistant. */
#ifndef NV_SERVE_CHAT_H
#define NV_SERVE_CHAT_H

#include "base/err.h"
#include "model/tokenizer.h"

typedef enum { NV_CHAT_PLAIN = 0, NV_CHAT_CHATML, NV_CHAT_LLAMA2, NV_CHAT_LLAMA3 } nv_chat_template;

typedef struct {
    const char *role;
    const char *content;
} nv_chat_msg;

nv_err nv_chat_template_parse(const char *name, nv_chat_template *out);
const char *nv_chat_template_name(nv_chat_template t);
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

#endif
