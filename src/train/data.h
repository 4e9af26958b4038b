/* Training data: token streams from llama2.c pretokenized shards (flat little-endian uint16,
 * `.bin`), uint32 shards for vocabularies over 65535 (`.u32`), or plain text tokenized at load
 * (any other extension; documents split at blank lines, `<|endoftext|>`, or lines when the file
 * has no blank line; each document starts with BOS), or a `.jsonl` file of {"text": ...} lines
 * (each line's text a document: what Hugging Face datasets and most pretraining dumps export).
 *
 * Chat data (`.jsonl`, OpenAI's chat fine-tuning format: one {"messages": [...]} a line, tools and
 * each assistant message's "weight" 0/1 as OpenAI reads them) is supervised fine-tuning: every
 * assistant answer (weight 1, the default) becomes one turn, the conversation up to it rendered
 * with a chat template as the server renders a request (nv_chat_render_turn), and only the
 * answer's tokens (with what ends it) are targets; the prompt's are not trained on.
 *
 * Shards are memory-mapped. Every token is checked against the vocabulary at load, so a
 * malformed shard is an error, never an out-of-range read. The last val_frac of each source is
 * held out for validation (of a chat source, its last conversations). Windows of T+1 tokens are
 * drawn at random positions by a seeded generator whose whole state is nv_data_cursor, which
 * checkpoints save and restore; a chat source's windows are whole turns, one a window (cut after
 * T + 1 tokens, padded with targets -1, which the loss skips), or with pack a turn and the ones after
 * it in the file, each from its start (their tokens attend to the earlier turns' in the window).
 *
 * Prompt/completion data (`.jsonl` of {"prompt", "completion"} lines, TRL's prompt-completion
 * format): two strings are one text, the prompt then the completion (BOS first, EOS after it),
 * whose completion tokens alone are targets (from the first token that is not the prompt's own
 * encoding: a token merging across the boundary is the completion's); two lists of messages are a
 * conversation rendered as chat data's, trained on the completion's assistant messages only.
 *
 * Preference data (`.jsonl` in OpenAI's preference fine-tuning format: {"input": {"messages": [...],
 * "tools": [...]}, "preferred_output": [one assistant message], "non_preferred_output": [one]} a
 * line, or TRL's {"prompt", "chosen", "rejected"}) gives pairs of turns, the two answers after the same conversation, each rendered as chat
 * data's and drawn together (nv_data_next_pairs); the split falls between pairs. */
#ifndef NV_DATA_H
#define NV_DATA_H

#include <stdint.h>

#include "base/file.h"
#include "model/tokenizer.h"
#include "serve/chat.h"

typedef struct {
    char path[512];
    nv_mapped map;      /* shards */
    const uint8_t *tokens; /* a shard's tokens in map (after llm.c's header, where it has one) */
    uint32_t *owned;    /* text, tokenized */
    int width;          /* 2 or 4 bytes per token */
    uint64_t n_tokens;
    uint64_t n_train;   /* tokens [0, n_train) train, [n_train, n_tokens) validate */
    /* chat data (NULL / 0 otherwise) */
    uint8_t *trained;   /* [n_tokens]: 1 where the token is an answer's, a target the loss counts */
    uint64_t *starts;   /* [n_starts + 1]: where each turn begins; starts[n_starts] = n_tokens */
    uint64_t n_starts, n_train_starts; /* turns; the first n_train_starts train */
    uint8_t pairs;      /* preference data: turns 2p (the preferred answer) and 2p + 1 (the other) are pair p */
    uint8_t completions; /* prompt/completion lines: 1 where their texts are joined as they are, no template */
    uint8_t templated;   /* some turn was rendered with the chat template */
    const nv_jinja *jinja; /* the chat template run as Jinja (nv_dataset_open_jinja), NULL: tmpl's renderer */
} nv_source;

typedef struct {
    nv_source *src;
    int n_src;
    uint64_t train_tokens, val_tokens;
    int chat;             /* a source is chat data: some targets are -1 */
    int pack;             /* chat training windows go on into the next turns instead of padding (set
                             by the caller; validation windows stay one turn each) */
    int pref;             /* preference pairs (every source; chat is set too): nv_data_next_pairs */
    int templated;        /* some source's turns were rendered with the chat template (the model then
                             chats with it; prompt/completion text alone does not) */
    double *weights;      /* [n_src] each source's share of the training windows, summing to 1
                             (nv_dataset_set_weights); NULL: in proportion to the windows each holds */
} nv_dataset;

typedef struct {
    uint64_t rng;      /* xorshift state */
    uint64_t windows;  /* windows drawn so far */
} nv_data_cursor;

/* The text files a folder holds, as --data reads a folder: every regular file under it (to a depth of
 * 32 folders) in the order of their paths; names starting with '.' (and what such folders hold) and
 * symbolic links left out, and counted apart: files of the other data formats (.bin, .u32, .jsonl)
 * and binary ones (a NUL byte in the first 8000 bytes, git's rule). */
typedef struct {
    char **paths;
    size_t n, cap;
    size_t other, binary; /* left out */
} nv_text_files;
nv_err nv_data_text_files(const char *dir, nv_text_files *out);
/* 1 when path's name is not one of the other formats' (.bin, .u32, .jsonl): read as text. */
int nv_data_named_text(const char *path);
void nv_text_files_free(nv_text_files *f);

/* 1 when path is a .jsonl file (by its name) of text lines: its first line an object with a "text"
 * string (and neither chat's "messages" nor preference data's "input"/"prompt"). */
int nv_data_jsonl_is_text(const char *path);
/* 1 when path is a .jsonl file (by its name) of turns: chat, prompt/completion or preference data
 * (any .jsonl file but one of text lines). */
int nv_data_jsonl_is_turns(const char *path);
/* fn(ctx, text, length) for each line's "text" string of such a file, in order (the first error it
 * returns ends the walk); NV_EFORMAT, naming the line, for a line that is not an object with one, or
 * a file with none. */
nv_err nv_data_jsonl_each_text(const char *path, nv_err (*fn)(void *ctx, const char *text, size_t n), void *ctx);
/* tok may be NULL when every path is a shard. Chat data is rendered with the chatml template. */
nv_err nv_dataset_open(nv_dataset *ds, const char *const *paths, int n, const nv_tokenizer *tok, int vocab_size,
                       float val_frac);
/* The same, chat data rendered with tmpl. */
nv_err nv_dataset_open_chat(nv_dataset *ds, const char *const *paths, int n, const nv_tokenizer *tok, int vocab_size,
                            float val_frac, nv_chat_template tmpl);
/* The same, chat data rendered by the Jinja template jinja (nv_chat_opts.jinja; it outlives the
 * dataset's loading), tmpl giving its stop. */
nv_err nv_dataset_open_jinja(nv_dataset *ds, const char *const *paths, int n, const nv_tokenizer *tok, int vocab_size,
                             float val_frac, nv_chat_template tmpl, const nv_jinja *jinja);
/* Makes sources [first_val, n_src) validation data whole and the ones before them training data
 * whole (nerve train --val-data), in place of the val_frac split. */
void nv_dataset_split_at(nv_dataset *ds, int first_val);
/* Draws training windows (or preference pairs) from the first n sources in proportion to w[0..n)
 * (>= 0, finite, not all 0; the sources after them train nothing) instead of their sizes: a mixture,
 * each source's windows then drawn uniformly within it (a small source is seen more often, a large
 * one less, than its size alone would have it). */
nv_err nv_dataset_set_weights(nv_dataset *ds, const float *w, int n);
void nv_dataset_close(nv_dataset *ds);
static inline uint32_t nv_source_token(const nv_source *s, uint64_t i) {
    if (s->owned) return s->owned[i];
    if (s->width == 2) {
        uint16_t v;
        __builtin_memcpy(&v, s->tokens + 2 * i, 2);
        return v;
    }
    uint32_t v;
    __builtin_memcpy(&v, s->tokens + 4 * i, 4);
    return v;
}

void nv_data_cursor_init(nv_data_cursor *c, uint64_t seed);
/* Fills inputs/targets [B*T] with B random training windows; needs train_tokens > T per source
 * chosen (sources too short for a window are never chosen; a chat source needs a turn). A target
 * of -1 is no target (chat data: a prompt's token, or padding). seg, when not NULL, gets [B*T]
 * each row's first position of its document in the window (nv_tmodel_set_segments): a packed
 * window's later turns start where they start, every other row's document at 0. With weights
 * (nv_dataset_set_weights) a window's source is drawn by them first, and a weighted source too short
 * for a window is an error naming it. */
nv_err nv_data_next_batch(const nv_dataset *ds, nv_data_cursor *c, int B, int T, int *inputs, int *targets, int *seg);
/* The validation windows of T, every source's (a chat source's held-out turns; a text source's
 * held-out tokens in windows of T + 1 overlapping by one). */
uint64_t nv_data_val_windows(const nv_dataset *ds, int T);
/* Validation batch number i (0-based): windows i * B .. i * B + B - 1 of those, in order across the
 * sources, wrapping round to the first past the last; returns 0 when the validation split cannot hold
 * a window. */
int nv_data_val_batch(const nv_dataset *ds, uint64_t i, int B, int T, int *inputs, int *targets);

/* Preference data: the pairs of every source, training and validation (global numbers: a source's
 * after the ones before it), and pair p's two windows: the preferred answer's into in/tg [0, T), the
 * other's into [T, 2T). */
uint64_t nv_data_pairs(const nv_dataset *ds);
void nv_data_pair(const nv_dataset *ds, uint64_t p, int T, int *in, int *tg);
/* B / 2 random training pairs (B even): windows 2i and 2i + 1 are pair ids[i]'s. */
nv_err nv_data_next_pairs(const nv_dataset *ds, nv_data_cursor *c, int B, int T, int *inputs, int *targets,
                          uint64_t *ids);
/* Validation batch number i of B / 2 pairs, the validation pairs in order; 0 when there are none. */
int nv_data_val_pairs(const nv_dataset *ds, int i, int B, int T, int *inputs, int *targets, uint64_t *ids);

/* The windows of T + 1 tokens one pass over the training data draws (an epoch): a text source's
 * training tokens / T, a chat source's training turns (preference data: two a pair); what
 * nv_data_cursor.windows is measured against. 0 when there is no training data. */
double nv_data_epoch_windows(const nv_dataset *ds, int T);

/* Unigram entropy of the training split in nats per token: the loss a model that ignores
 * context can reach, the baseline training must beat. */
double nv_dataset_unigram_loss(const nv_dataset *ds, int vocab_size);

#endif
