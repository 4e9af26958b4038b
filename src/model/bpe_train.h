/* Byte-fallback BPE tokenizer training, written in llama2.c's tokenizer.bin format.
 *
 * Contract:
 * - Output layout is Llama's SentencePiece vocabulary, so nv_tokenizer_encode (llama2.c's
 *   encoder) works unchanged: id 0 "<unk>", 1 "\n<s>\n", 2 "\n</s>\n", ids 3..258 the byte
 *   tokens "<0x00>".."<0xFF>" (score 0), then one piece per kept character, then the learned
 *   pieces in training order with score -(rank), so the encoder's highest-score-first merging
 *   applies them in the order they were learned. Kept characters score below every learned
 *   piece (they are never the result of a merge, so their scores do not matter to encoding).
 * - Characters are UTF-8 code points cut exactly as the encoder cuts them. The most frequent
 *   ones covering char_coverage of all character occurrences are kept (" " always); the rest
 *   are left to the byte fallback and never take part in a merge.
 * - Word boundaries follow SentencePiece: each line of text is a sentence with a dummy leading
 *   space; a space starts a new word and attaches to the word after it (" the"); letters,
 *   punctuation and digits are split apart (each digit on its own; ASCII and typographic
 *   apostrophes count as letters); "\n" and "\r" are tokens of their own and never merge;
 *   "<|endoftext|>" ends a line and is dropped (as the data loader drops it). So a learned
 *   piece never spans a word boundary except for its one leading space.
 * - Learned pieces never start with "<0x" (llama2.c's decoder would read them as a byte) and
 *   are never a part of "<unk>" or "<0xHH>" that could be joined into one, so the encoder can
 *   never assemble a reserved piece: encode then decode gives the text back exactly, for any
 *   text without NUL bytes.
 * - Training counts words in a hash map and then merges the most frequent pair (ties: lower
 *   left id, then lower right id), updating pair counts incrementally from per-pair lists of
 *   the words that hold them. Output is a pure function of the text bytes and the options.
 *   Training stops when vocab_size tokens exist or no pair occurs min_pair_count times; then
 *   fewer tokens are written (n_tokens says how many).
 * - A merge whose result equals an existing piece reuses that id. */
#ifndef NV_BPE_TRAIN_H
#define NV_BPE_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/file.h"

#define NV_BPE_RESERVED 259 /* <unk>, <s>, </s> and the 256 byte tokens */
#define NV_BPE_MAX_VOCAB (1 << 24) /* ranks stay exact as float scores */

typedef struct {
    int vocab_size;       /* tokens wanted in all: 259 + kept characters + learned pieces */
    double char_coverage; /* share of character occurrences the kept characters cover; 0 -> 0.9995 */
    int max_piece_chars;  /* longest learned piece in code points; 0 -> 16 */
    int min_pair_count;   /* a pair seen fewer times is never merged; 0 -> 2 */
} nv_bpe_opts;

typedef struct {
    uint8_t *data;      /* the tokenizer.bin bytes (free with nv_bpe_result_free) */
    size_t len;
    int n_tokens;       /* entries written, <= vocab_size */
    int n_chars;        /* characters that have their own piece */
    int n_dropped;      /* distinct characters left to the byte fallback */
    int n_learned;      /* learned pieces */
    uint64_t n_bytes;   /* text bytes read */
    uint64_t n_words;   /* distinct words (of two characters or more) */
} nv_bpe_result;

/* Trains on the concatenation of texts (each text ends a line). Errors: NV_EINVAL for no
 * characters at all ("empty text"), NV_ERANGE for a vocab_size outside
 * [259 + kept characters, NV_BPE_MAX_VOCAB], NV_ENOMEM. */
nv_err nv_bpe_train(const nv_iov *texts, int n_texts, const nv_bpe_opts *opts, nv_bpe_result *out);
void nv_bpe_result_free(nv_bpe_result *r);

#endif
