/* A reasoning model's think block ("<think>...</think>" at the start of an answer, or Mistral's
 * "[THINK]...[/THINK]": Magistral's, Ministral 3 Reasoning's), followed as the answer's text comes:
 * what the server splits into reasoning and content, what a lazy grammar's trigger is not looked
 * for in, and what a reasoning budget counts.
 *
 * Contract:
 * - nv_think_feed() takes the text in pieces the way llama.cpp's --reasoning-format deepseek
 *   reads it: "<think>" at its start (after white space) opens the reasoning, "</think>" closes
 *   it and the newlines after it are dropped; a text that does not start so is all content, one
 *   that never closes all reasoning. A piece cut inside a tag is held back until the next (final:
 *   the text is whole), and only at ASCII bytes, so the UTF-8 characters of each output stay
 *   whole. reasoning or content may be NULL (that part is not wanted).
 * - Harmony (gpt-oss's answers: messages "[<|start|>assistant]<|channel|>C[ to=functions.NAME][ <|constrain|>json]
 *   <|message|>BODY<|end|>", the last one's end never written: <|return|> and <|call|> end generation):
 *   the analysis channel's bodies are the reasoning, the final channel's and a commentary without a
 *   recipient the content, and a message to functions.NAME a tool call, written into the content as
 *   Hermes's <tool_call>{"name": NAME, "arguments": BODY}</tool_call> (BODY as a JSON string when it
 *   is no JSON value) for the tool-call parser; an answer that does not open with a message header is
 *   all content. The state is NV_THINK_IN while an analysis body is read, NV_THINK_PAST from the first
 *   other message on.
 * - A prompt that ends by opening the block (a template's generation prompt "<think>\n": DeepSeek-R1's
 *   later ones, Qwen3's thinking-only ones) makes the answer start inside it: nv_think_opened()
 *   says so of a prompt's tokens, and a tracker started with state NV_THINK_IN reads it so. */
#ifndef NV_MODEL_THINK_H
#define NV_MODEL_THINK_H

#include <stddef.h>

#include "base/buf.h"
#include "model/tokenizer.h"

enum { NV_THINK_UNDECIDED = 0, NV_THINK_IN, NV_THINK_PAST, NV_THINK_PAST_NL /* past it, newlines still dropped */ };

/* The tags a model writes its block in ("tags" arguments below; 0 reads as NV_THINK_ANGLE, so a zeroed
 * tracker follows "<think>"). Where a flag "think" elsewhere says a block may come, its value is these. */
enum { NV_THINK_ANGLE = 1 /* <think>...</think> */, NV_THINK_BRACKET /* [THINK]...[/THINK], control tokens in Mistral's vocabularies */,
       NV_THINK_HARMONY /* gpt-oss's harmony messages: <|channel|>analysis<|message|>...<|end|>, then the final channel's */ };
/* Harmony's final message's header (its answer), what a response format's JSON follows. */
#define NV_HARMONY_FINAL_HEADER "<|channel|>final<|message|>"
typedef struct {
    const char *open, *close;
    const char *forced; /* what a spent budget forces: the close as the model would write it */
} nv_think_tags;
const nv_think_tags *nv_think_tags_of(int tags);
/* The tags a chat template's text shows (harmony's where it writes "<|channel|>" and the analysis channel,
 * Mistral's where it writes both of theirs, else "<think>"'s), and whether it shows any (*shown; NULL:
 * not wanted). */
int nv_think_tags_of_template(const char *text, int *shown);

typedef struct {
    int state; /* NV_THINK_* */
    int tags;  /* NV_THINK_ANGLE (or 0), NV_THINK_BRACKET or NV_THINK_HARMONY */
    nv_buf hold;
    /* harmony: where the message being read goes (0: its header is being read), and a tool call's name
       and arguments, gathered until its message ends */
    int route;
    char call_name[128];
    nv_buf call;
} nv_think;

void nv_think_feed(nv_think *t, const char *s, size_t n, int final, nv_buf *reasoning, nv_buf *content);
void nv_think_free(nv_think *t);
/* Makes decoding print Mistral's tags (control tokens in its vocabularies) where tags are its, so the
 * reader sees them, as llama.cpp preserves them; <think> is text already. Before tok is shared. */
void nv_think_show_tags(nv_tokenizer *tok, int tags);
/* 1 when the text of the prompt's last tokens ends (white space aside) with the open tag. */
int nv_think_opened(const nv_tokenizer *tok, int tags, const int *ids, int n);
/* The tokens that close a think block whose budget is spent: message (NULL: none), then the tags'
 * forced close ("\n</think>\n\n", "[/THINK]"; llama.cpp's --reasoning-budget-message; the tag a
 * vocabulary's own token where it has one), without the space a SentencePiece vocabulary puts before
 * a text. *ids is the caller's. */
nv_err nv_think_close_ids(const nv_tokenizer *tok, int tags, const char *message, int **ids, int *n);
/* The length of the longest end of s[0..n) that starts tag without being all of it (what a
 * stream holds back while a tag may be coming). */
size_t nv_partial_tag(const char *s, size_t n, const char *tag);

#endif
