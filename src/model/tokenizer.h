/* Llama SentencePiece-style tokenizer in llama2.c's tokenizer.bin format.
 *
 * Contract:
 * - File format (little-endian): int32 max_token_length, then per token: float32 score,
 *   int32 len, len bytes (no NUL). nv_tokenizer_load() with vocab_size 0 reads entries until
 *   the end of the file; with vocab_size > 0 exactly that many entries must be present and any
 *   bytes after them are ignored (llama2.c reads only vocab_size entries). Anything malformed
 *   (truncated entry, negative length, max_token_length <= 0 or absurd, fewer than 3 tokens)
 *   is NV_EFORMAT with a one-line message. Pieces longer than the header's max_token_length
 *   are accepted: buffers are sized from the longest real piece.
 * - Ids 0, 1, 2 are <unk>, BOS, EOS; ids 3..258 are the byte tokens <0x00>..<0xFF> (what the
 *   byte fallback emits). A piece is used as a C string: an embedded NUL ends it, as in run.c.
 * - nv_tokenizer_encode() gives exactly llama2.c run.c encode()'s ids (BOS, dummy " " prefix
 *   for non-empty text, UTF-8 chunks of at most 4 bytes looked up whole or byte-fallback, then
 *   greedy highest-score merges with the leftmost pair winning ties, EOS), computed in
 *   O(n log n) instead of run.c's O(n^2). Where run.c would index out of the vocabulary (no " "
 *   piece, or byte id b+3 past the end of a small vocabulary) it falls back to the byte token,
 *   then to <unk> (0). On duplicate piece strings the lowest id wins.
 * - nv_tokenizer_decode() is run.c decode(): after BOS (id 1) a leading space is dropped;
 *   a piece that sscanf reads as "<0x%02hhX>" becomes that single raw byte.
 * - A loaded tokenizer is immutable: every function may be called from many threads at once. */
#ifndef NV_TOKENIZER_H
#define NV_TOKENIZER_H

#include "base/err.h"

typedef struct nv_tokenizer nv_tokenizer;

#define NV_TOKEN_UNK 0
#define NV_TOKEN_BOS 1
#define NV_TOKEN_EOS 2

nv_err nv_tokenizer_load(const char *path, int vocab_size, nv_tokenizer **out);
/* Loads every entry of path and checks that their number is the model's vocabulary size:
 * NV_EFORMAT with a message naming both sizes when they differ. */
nv_err nv_tokenizer_load_for_model(const char *path, int vocab_size, nv_tokenizer **out);
void nv_tokenizer_free(nv_tokenizer *t);

int nv_tokenizer_vocab_size(const nv_tokenizer *t);
/* The piece as stored (NUL-terminated copy), NULL if id is out of range. */
const char *nv_tokenizer_piece(const nv_tokenizer *t, int id);
/* The piece's score; 0 if id is out of range. */
float nv_tokenizer_score(const nv_tokenizer *t, int id);
/* Id of the piece equal to str, or -1. */
int nv_tokenizer_lookup(const nv_tokenizer *t, const char *str);

/* Encodes text; *tokens is allocated here (caller frees), at most strlen(text) + 3 ids. */
nv_err nv_tokenizer_encode(const nv_tokenizer *t, const char *text, int bos, int eos, int **tokens,
                           int *n_tokens);
/* Text to print for token following prev_token; NULL if token is out of range. */
const char *nv_tokenizer_decode(const nv_tokenizer *t, int prev_token, int token);

/* llama2.c safe_printf's rule: 0 for NULL, "", or a single byte that is neither isprint nor
 * isspace (raw control bytes from byte tokens); 1 otherwise. */
int nv_piece_printable(const char *piece);

#endif
