/* Tokenizers: Llama's SentencePiece style in llama2.c's tokenizer.bin format (or a GGUF "llama"
 * vocabulary), and byte-level BPE from a GGUF "gpt2" vocabulary (Llama 3, Qwen2/Qwen3).
 *
 * Contract (llama2.c's format):
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
 * Contract (byte-level BPE, tokenizer.ggml.model "gpt2"):
 * - Pieces are spelled as the file has them (each byte as GPT-2's printable stand-in code point);
 *   merges come from tokenizer.ggml.merges, ranked by their order; BOS, EOS, EOT/EOM and
 *   add_bos_token from the metadata. tokenizer.ggml.pre picks the split: llama3/llama-bpe
 *   (digits in threes; a piece that is a whole token skips the merges), qwen2 (single digits),
 *   smollm/starcoder (every digit a piece, then GPT-2's split), gpt-4o/llama4 (o200k's), tekken
 *   (Mistral's: single digits, whole-token pieces skip the merges), gpt-2/default; any other is
 *   NV_EUNSUPPORTED. A Hugging Face tokenizer.json is read into the same form (model/hf.h). A
 *   vocabulary lacking a token for one of the 256 bytes, or whose merges join nothing, is NV_EFORMAT.
 * - nv_tokenizer_encode() is llama.cpp's with special tokens parsed: the text is cut at the text
 *   of every control or user-defined token (longest first), the rest is split by the pre-tokenizer
 *   (invalid UTF-8 bytes are pieces of their own), and each piece's bytes merge lowest rank
 *   first, leftmost among equals. BOS is prepended only when bos is set and the vocabulary asks
 *   for it (add_bos_token; Llama 3 does, Qwen does not); no dummy space prefix.
 * - nv_tokenizer_decode() ignores prev_token: a normal token prints its bytes, a user-defined one
 *   its text, a control token nothing.
 * - nv_tokenizer_is_eog(): EOS, EOT, EOM and the control tokens <|im_end|>, <|endoftext|>,
 *   <|eot_id|>, <|end_of_text|>, <|eom_id|>, <end_of_turn> (for llama2.c's: BOS and EOS).
 * - A loaded tokenizer is immutable: every function may be called from many threads at once. */
#ifndef NV_TOKENIZER_H
#define NV_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

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
/* The BOS, <unk> and EOS ids (-1 when the vocabulary has none; <unk>: 0 for a byte-level one). */
int nv_tokenizer_bos(const nv_tokenizer *t);
int nv_tokenizer_unk(const nv_tokenizer *t);
int nv_tokenizer_eos(const nv_tokenizer *t);
/* 1 when id ends a generation (see above). */
int nv_tokenizer_is_eog(const nv_tokenizer *t, int id);
/* 1 when encode's bos prepends BOS (llama2.c's always; byte-level ones when they ask for it). */
int nv_tokenizer_adds_bos(const nv_tokenizer *t);
/* 1 when the vocabulary asks for EOS after an input (tokenizer.ggml.add_eos_token, a tokenizer.json
 * template ending with it: embedding models pooling the last token, Qwen3-Embedding's). Encode
 * appends it only when its eos says so: embeddings' inputs. */
int nv_tokenizer_adds_eos(const nv_tokenizer *t);
/* 1 for a byte-level BPE vocabulary. */
int nv_tokenizer_byte_level(const nv_tokenizer *t);
/* What a byte-level vocabulary needs to be written out again (pieces: nv_tokenizer_piece). */
typedef struct {
    const char *pre;           /* the pre-tokenizer's name as the file gave it ("" when absent) */
    const uint8_t *type;       /* GGUF token type per id */
    const int32_t *merge_pair; /* n_merges (left, right) id pairs in rank order */
    int n_merges;
    int bos, eos, eot, eom, add_bos; /* ids -1 when absent */
    int nfc;                         /* text is composed to Unicode NFC before it is split */
} nv_bpe_view;
/* A pre-tokenizer's splits: n regexes applied in order, each splitting every piece the one before
 * made (a match and the text between two matches each a piece), as tokenizer.json's Sequence of
 * Split pre-tokenizers ("Isolated") applies them. */
#define NV_BPE_MAX_SPLITS 6
typedef struct {
    const char *pre; /* llama.cpp's name for them */
    int n;
    const char *re[NV_BPE_MAX_SPLITS];
} nv_bpe_splits;
/* llama.cpp's pre-tokenizer name ("llama-bpe", "qwen2", "deepseek-coder"...) whose splits are the n
 * regexes re (tokenizer.json's Split patterns, in order), or NULL for none supported; and the splits
 * of a name (GPT-2's for a name this project does not know). */
const char *nv_bpe_pre_of_splits(const char *const *re, int n);
const nv_bpe_splits *nv_bpe_splits_of_pre(const char *pre);
/* Whether pre-tokenizer pre's pieces that are tokens are taken whole, the merges not applied to them
 * (Llama 3's, tokenizer.json's ignore_merges; DBRX's and OLMo 2's same split does not). */
int nv_bpe_pre_ignores_merges(const char *pre);
/* Fills *v and returns 1 for a byte-level vocabulary; 0 otherwise. */
int nv_tokenizer_bpe_view(const nv_tokenizer *t, nv_bpe_view *v);
/* The piece as stored (NUL-terminated copy), NULL if id is out of range. */
const char *nv_tokenizer_piece(const nv_tokenizer *t, int id);
/* The token's text as a tokenizer.json, a GGUF vocabulary or a chat template spells it: a
 * SentencePiece vocabulary's <unk>, <s> and </s> (llama2.c stores BOS and EOS as "\n<s>\n" and
 * "\n</s>\n"), else the piece; NULL if id is out of range. */
const char *nv_tokenizer_special_text(const nv_tokenizer *t, int id);
/* The byte a SentencePiece byte piece stands for: len 6, "<0x", two hex digits, ">" (no sign, no
 * space, as sscanf's %X would take); -1 for any other piece. */
int nv_byte_piece(const char *p, size_t len);
/* Makes decoding print the control token whose text is `text` as that text (llama.cpp's
 * preserved tokens): Granite answers a tool call with its <|tool_call|> token, which the server
 * must see. Call it before the tokenizer is shared (the only exception to immutability); at
 * most eight. Returns the token's id, or -1 when the vocabulary has no such control token (or it
 * is BOS or an end of generation, which never print). */
int nv_tokenizer_show(nv_tokenizer *t, const char *text);
/* The piece's score; 0 if id is out of range. */
float nv_tokenizer_score(const nv_tokenizer *t, int id);
/* The GGUF token type the vocabulary gave id (1 normal, 2 unknown, 3 control, 4 user-defined,
 * 6 byte), or 0 when its file gave none (llama2.c's tokenizer.bin). */
int nv_tokenizer_type(const nv_tokenizer *t, int id);
/* 1 when special tokens take the white space after them (a Phi-3 vocabulary's rule). */
int nv_tokenizer_strips_after_special(const nv_tokenizer *t);
/* 1 when special token id takes the white space after it: under that rule, all but <unk>, <s> and
 * <|endoftext|> (llama.cpp's). */
int nv_tokenizer_strips_after(const nv_tokenizer *t, int id);
/* 1 when that rule would change how t encodes some text: a SentencePiece vocabulary with special
 * tokens parsed in text besides those three. */
int nv_tokenizer_strip_rule_matters(const nv_tokenizer *t);
/* 1 when SentencePiece's dummy-prefix space opens the text (and follows each special token): a
 * SentencePiece vocabulary unless its GGUF file said add_space_prefix false. */
int nv_tokenizer_space_prefix(const nv_tokenizer *t);
/* 1 when llama2.c's tokenizer.bin holds the whole vocabulary: SentencePiece with <unk>, BOS, EOS
 * at 0, 1, 2, BOS added, no other special token, no white-space rule. */
int nv_tokenizer_llama2c_form(const nv_tokenizer *t);
/* Id of the piece equal to str, or -1. */
int nv_tokenizer_lookup(const nv_tokenizer *t, const char *str);

/* Encodes text; *tokens is allocated here (caller frees), at most strlen(text) + 3 ids. bos: BOS
 * first (byte-level vocabularies: only when they ask for it, or when the text gives no token at
 * all); eos: EOS last. Only a byte-level vocabulary without BOS can give 0 ids. */
nv_err nv_tokenizer_encode(const nv_tokenizer *t, const char *text, int bos, int eos, int **tokens,
                           int *n_tokens);
/* A growing list of token ids (the caller frees v). */
typedef struct {
    int *v;
    int n, cap;
} nv_ids;
/* Appends n ids (NV_ENOMEM, the list unchanged, when it cannot grow). */
nv_err nv_ids_push(nv_ids *l, const int *ids, int n);
/* Appends text's encoding (nv_tokenizer_encode's, with bos and eos). */
nv_err nv_tokenizer_encode_into(const nv_tokenizer *t, const char *text, int bos, int eos, nv_ids *l);
/* Text to print for token following prev_token; NULL if token is out of range. */
const char *nv_tokenizer_decode(const nv_tokenizer *t, int prev_token, int token);
/* token's text in a generated answer (or an echoed prompt): nv_tokenizer_decode's, but BOS and the
 * end-of-generation tokens give nothing; with special (vLLM's skip_special_tokens false) a token that
 * gives nothing gives its own text instead (nv_tokenizer_special_text's: "<|im_end|>", "</s>"). */
const char *nv_tokenizer_answer_piece(const nv_tokenizer *t, int prev_token, int token, int special);
/* mask[id] = 1 for every token whose text (nv_tokenizer_decode's) contains one of the n strings
 * (empty ones match nothing); others are left as they are. mask has the vocabulary's size. */
void nv_tokenizer_mark_containing(const nv_tokenizer *t, const char *const *strs, int n, unsigned char *mask);

/* llama2.c safe_printf's rule: 0 for NULL, "", or a single byte that is neither isprint nor
 * isspace (raw control bytes from byte tokens); 1 otherwise. */
int nv_piece_printable(const char *piece);
/* Text generation as `nerve generate` does it (llama2.c's run, extended): 1 when a piece is printed
 * (every one of a byte-level vocabulary, whose lone bytes are parts of characters; else
 * nv_piece_printable's rule), and 1 when id ends the text (BOS, as run.c stops; a byte-level
 * vocabulary's end-of-generation tokens too). */
int nv_tokenizer_piece_shown(const nv_tokenizer *t, const char *piece);
int nv_tokenizer_ends_text(const nv_tokenizer *t, int id);

#endif
