/* GGUF, llama.cpp's model format, read-only: versions 1 to 3.
 *
 * Contract:
 * - nv_gguf_open maps the file and checks all of it before returning: the header, every
 *   metadata value (arrays of scalars or strings; nested arrays are refused), every tensor's
 *   name, shape (1 to 4 dimensions), type and data range (aligned to general.alignment,
 *   default 32, inside the file). Anything malformed or truncated is NV_EFORMAT with a one-line
 *   message; nothing is read past the end of the mapping. Version 1 stores counts, lengths and
 *   dimensions as 32-bit values, later versions as 64-bit ones. A model split by llama-gguf-split
 *   (or nerve export --split-max-size) is opened from its first file, PREFIX-00001-of-0000N.gguf:
 *   the others are found by name and checked (split.no, split.count, split.tensors.count), their
 *   tensors joined to the first's, whose metadata is the model's.
 * - nv_gguf_load_model (behind nv_model_load, which recognises the magic) takes architecture
 *   "llama": the config from llama.* metadata (head_count_kv defaults to head_count,
 *   rope.freq_base to 10000, layer_norm_rms_epsilon to 1e-5; rope.dimension_count, when present,
 *   must equal the head size) and the tensors token_embd, output_norm, output (absent: the
 *   classifier is the embedding) and blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output,
 *   ffn_norm, ffn_gate, ffn_down, ffn_up}, each shape checked, converted to fp32 (F32, F16, BF16,
 *   Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS as llama.cpp's reference dequantizers define
 *   them; other types are NV_EUNSUPPORTED naming the type). The whole model is checked before any
 *   weight memory is taken. llama.cpp stores Llama's Q/K weights
 *   in Meta's rotary layout, the one this project's RoPE uses, so no permutation is applied.
 * - nv_gguf_tokenizer_bytes (behind nv_tokenizer_load) turns a "llama" (SentencePiece)
 *   vocabulary into llama2.c's tokenizer.bin bytes: U+2581 becomes a space, scores are kept, BOS/EOS are written "\n<s>\n"/"\n</s>\n"
 *   as llama2.c's export writes them (no text spells them), and
 *   <unk>, BOS and EOS must be ids 0, 1, 2 as this project's tokenizer assumes. */
#ifndef NV_GGUF_H
#define NV_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/file.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/tokenizer.h"

typedef struct {
    const char *key;
    size_t key_len;
    uint32_t type;     /* GGUF value type */
    const uint8_t *val; /* the value; for arrays, the first element */
    uint32_t elem;     /* arrays: the element type */
    uint64_t count;    /* arrays: the number of elements */
} nv_gguf_kv;

typedef struct {
    const char *name;
    size_t name_len;
    uint32_t n_dims;
    uint64_t dims[4]; /* dims[0] varies fastest */
    uint32_t type;    /* ggml type */
    const uint8_t *data;
    uint64_t bytes;
} nv_gguf_tensor;

typedef struct {
    nv_mapped map;      /* the file (a split model's first: all its metadata) */
    nv_mapped *shards;  /* a split model's other files, n_shards of them: tensors point into them too */
    uint32_t n_shards;
    const char *path;
    uint32_t version;
    uint64_t n_kv, n_tensors;
    nv_gguf_kv *kv;
    nv_gguf_tensor *t;
} nv_gguf;

/* 1 when data starts with GGUF's magic. */
int nv_gguf_is(const void *data, size_t len);
nv_err nv_gguf_open(const char *path, nv_gguf *g);
void nv_gguf_close(nv_gguf *g);
/* The bytes of its files (all of a split model's). */
uint64_t nv_gguf_file_bytes(const nv_gguf *g);
const nv_gguf_kv *nv_gguf_find(const nv_gguf *g, const char *key);
const nv_gguf_tensor *nv_gguf_tensor_find(const nv_gguf *g, const char *name);
/* A string value: its bytes (not NUL-terminated) and length; NULL when absent or not a string. */
const char *nv_gguf_string(const nv_gguf *g, const char *key, size_t *len);

/* ggml's name of a tensor type (the codes ggml.h gives them; "?" for removed and unknown ones). */
const char *nv_gguf_type_name(uint32_t type);
/* n values of ggml type `type` at data (whole blocks) to fp32, as the loader converts them. */
nv_err nv_gguf_dequant(uint32_t type, const void *data, uint64_t n, float *out);
/* The config of a GGUF model without reading its tensors. */
nv_err nv_gguf_read_config(const char *path, nv_config *c);
/* Loads a GGUF model (see above) into m, weights converted to fp32 in owned memory. */
nv_err nv_gguf_load_model(const char *path, nv_model *m);
/* The same with the quantized plan matrices kept only quantized (nv_model_load_quantized). */
nv_err nv_gguf_load_model_quantized(const char *path, nv_model *m);
/* Plan matrix i's tensor (nv_model.quant's order: per layer wq, wk, wv, wo, w1, w2, w3, then the
 * classifier, then a mixture of experts' expert matrices, whose tensors hold every expert of a layer:
 * *expert says which slice, when not NULL) by its GGUF name; and 1 when m keeps the tensor `name` only as its plan source (its
 * fp32 values pending: the loaders leave them unmade). */
void nv_model_plan_tensor_name(const nv_config *c, int i, char *name, size_t cap, int *expert);
int nv_model_pending(const nv_model *m, const char *name);
/* Keeps plan matrix i's n fp16 values h (bf16 with bf16) as its plan source (m->quant, made when
 * missing); with pending its fp32 values are left to be made (never the token embedding's: lookups
 * read them). */
nv_err nv_model_keep_half(nv_model *m, int i, const void *h, size_t n, int bf16, int pending);
/* Tensor types nv_gguf_save writes (ggml's codes). */
#define NV_GGUF_F32 0u
#define NV_GGUF_F16 1u
#define NV_GGUF_Q4_0 2u
#define NV_GGUF_Q4_1 3u /* Q4_0 with a minimum per block: values 0..15 from it, scale (max - min)/15 */
#define NV_GGUF_Q5_0 6u
#define NV_GGUF_Q5_1 7u /* the same in 5 bits */
#define NV_GGUF_Q8_0 8u
#define NV_GGUF_Q4_K 12u /* the file as llama.cpp's Q4_K_M mix (Q4_K, Q6_K where it matters) */
#define NV_GGUF_Q5_K 13u /* the file as its Q5_K_M mix (Q5_K, Q6_K where it matters) */
#define NV_GGUF_Q6_K 14u
#define NV_GGUF_Q2_K 10u   /* llama.cpp's Q2_K mix (Q2_K; Q3_K, Q4_K and Q6_K where it matters) */
#define NV_GGUF_Q3_K 11u   /* its Q3_K_M mix (Q3_K; Q4_K, Q5_K and Q6_K where it matters) */
#define NV_GGUF_IQ4_NL 20u /* its IQ4_NL mix (IQ4_NL; Q5_K and Q6_K where it matters) */
#define NV_GGUF_IQ4_XS 23u /* its IQ4_XS mix (IQ4_XS; Q5_K and Q6_K where it matters) */
#define NV_GGUF_BF16 30u
/* llama.cpp's other k-quant mixes: writer codes outside the tensor types' range, the low byte its file type */
#define NV_GGUF_Q3_K_S 0x10Bu /* Q3_K throughout (Q6_K for the classifier) */
#define NV_GGUF_Q3_K_L 0x10Du /* Q3_K; Q5_K for attn_v, attn_output and ffn_down */
#define NV_GGUF_Q4_K_S 0x10Eu /* Q4_K; Q5_K for attn_v in the first four layers and ffn_down in the first eighth */
#define NV_GGUF_Q5_K_S 0x110u /* Q5_K throughout */
#define NV_GGUF_MXFP4_MOE 0x126u /* a mixture's experts in MXFP4 (gpt-oss's own form), the other matrices Q8_0 */
/* Or'ed into a quantized type: every matrix in the mix's own type (Q4_K for Q4_K_M, ...), none raised
 * for the classifier or the layers that matter (llama-quantize's --pure). */
#define NV_GGUF_PURE 0x10000u
/* Writes m (and, when tok is given, its SentencePiece vocabulary) as a GGUF v3 llama model,
 * atomically: what llama.cpp reads. type NV_GGUF_F32: every tensor F32, read back bit for bit.
 * NV_GGUF_Q8_0 / NV_GGUF_Q4_0: the matrices whose rows are whole blocks of 32 quantized as
 * llama.cpp's reference quantizers do (Q8_0: scale max|x|/127, values rounded; Q4_0: scale
 * -(the value of largest magnitude)/8, values 0..15 around 8; scales in fp16), the rest F32.
 * NV_GGUF_Q5_0 likewise (scale -(the value of largest magnitude)/16, values 0..31 around 16).
 * NV_GGUF_Q4_K / NV_GGUF_Q5_K / NV_GGUF_Q6_K: llama.cpp's Q4_K_M or Q5_K_M mix (Q4_K or Q5_K;
 * Q6_K for the classifier and for attn_v and ffn_down in the first and last eighth of the layers
 * and every third between) or Q6_K throughout, each sub-block's scale (and Q4_K's and Q5_K's min)
 * fitted by weighted least squares over candidate scales; matrices whose rows are not whole
 * super-blocks of 256 fall back as llama.cpp's quantizer does (Q4_K -> Q5_0, Q5_K -> Q5_1 (scale
 * and minimum of 32 values), Q6_K -> Q8_0).
 * NV_GGUF_F16: every matrix in fp16 (round to nearest even, beyond +-65504 infinite), norms F32.
 * NV_GGUF_BF16: every matrix in bf16 (round to nearest even), norms F32.
 * chat_template (Jinja text, or NULL): tokenizer.chat_template.
 * imatrix (or NULL): an importance per input column for the matrices quantized to Q4_0, Q5_0 (and
 * Q5_1), Q4_K, Q5_K and Q6_K, each block's scale fitted to it (imatrix.h); an entry of another
 * width is an error before anything is written, a missing one a warning.
 * A model with both QK-norm and projection biases is NV_EUNSUPPORTED (no GGUF architecture has both). */
struct nv_imatrix;
nv_err nv_gguf_save(const nv_model *m, const nv_tokenizer *tok, const char *name, const char *path, uint32_t type,
                    const char *chat_template, const struct nv_imatrix *imatrix);
/* The same, with split (or NULL: one file, path): the model in llama-gguf-split's files, PREFIX-00001-of-0000N.gguf
 * (path without ".gguf" the prefix), each holding whole tensors in order, a new one begun where the
 * last would pass max_tensors tensors or max_bytes of tensor data (0: no such limit; a tensor larger
 * than max_bytes gets a file to itself); the first holds the metadata. All are written or none
 * (nv_file_write_atomic_set); n_files says how many. */
typedef struct {
    uint64_t max_bytes;
    uint32_t max_tensors;
    int n_files; /* out */
} nv_gguf_split;
nv_err nv_gguf_save_split(const nv_model *m, const nv_tokenizer *tok, const char *name, const char *path, uint32_t type,
                          const char *chat_template, const struct nv_imatrix *imatrix, nv_gguf_split *split);
/* The name of split no (from 0) of n that nv_gguf_save_split writes for path (path without ".gguf", or
 * without its own split suffix when it names a split file, then "-0000K-of-0000N.gguf"), into out. */
nv_err nv_gguf_split_name(const char *path, int no, int n, char *out, size_t cap);
/* Which split file path names (PREFIX-0000K-of-0000N.gguf: K, from 1, and *count N), or 0. */
int nv_gguf_split_no(const char *path, int *count);
/* Importance matrices in llama.cpp's imatrix GGUF (imatrix.h: nv_imatrix_save, nv_imatrix_load). */
nv_err nv_gguf_save_imatrix(const struct nv_imatrix *im, const char *path);
nv_err nv_gguf_load_imatrix(const char *path, struct nv_imatrix *im);
/* llama.cpp's name of a file type (general.file_type: its llama_ftype numbers: "Q4_K_M", ...), NULL
 * when unknown. */
const char *nv_gguf_file_type_name(uint32_t ft);
/* Writes tok alone as a vocab-only GGUF v3 file (llama.cpp's ggml-vocab-*.gguf kind), atomically. */
nv_err nv_gguf_save_vocab(const nv_tokenizer *tok, const char *path);
/* 1 when path is a GGUF file whose metadata holds a vocabulary. */
int nv_gguf_has_vocab(const char *path);
/* The vocabulary of path as llama2.c tokenizer.bin bytes in *out (the caller frees). */
nv_err nv_gguf_tokenizer_bytes(const char *path, uint8_t **out, size_t *len);
/* n SentencePiece pieces (U+2581 for spaces) and their scores as llama2.c tokenizer.bin bytes in
 * *out (the caller frees): with llama2c_ids, ids 1 and 2 written "\n<s>\n"/"\n</s>\n"; path names the
 * source in errors. */
nv_err nv_spm_bytes(const char *path, int n, const char *const *piece, const size_t *plen, const float *score, int llama2c_ids, uint8_t **out,
                    size_t *len);

/* The model's tensors in llama.cpp's names and order, each with its GGUF shape [d0, d1] or [d0, d1,
 * d2] (d0 the input width; d1 1 for a vector; d2 the experts of a mixture's expert tensors, 0 for
 * the others) and where it lives in w (p NULL when w is): the one map the GGUF reader and writer
 * and the Hugging Face ones share. nv_model_tensor_count is its length. */
typedef struct {
    char name[64];
    uint64_t d0, d1;
    float *p;
    uint64_t d2;
} nv_tensor_ref;
/* Rows of a tensor: d1, times d2 for an expert tensor. */
static inline uint64_t nv_tensor_rows(const nv_tensor_ref *t) { return t->d1 * (t->d2 ? t->d2 : 1); }
size_t nv_model_tensor_count(const nv_config *c);
size_t nv_model_tensor_map(const nv_config *c, const nv_weights *w, nv_tensor_ref *t);
/* Where a written tensor's rows come from: one block of the weights (n 1), or (phi3's fused
 * tensors) up to three one after another; `first` names the first part's tensor when they are
 * fused (for an importance matrix collected under the separate names). */
typedef struct {
    const float *p[3];
    uint64_t rows[3];
    int n;
    char first[64];
} nv_tensor_parts;
/* tp[0..n): each tensor of the map t[0..n) one part (its own rows); with phi3, t and tp made phi3's
 * in place: a layer's attn_q, attn_k and attn_v one blk.N.attn_qkv, its ffn_gate and ffn_up one
 * blk.N.ffn_up (the gate's rows first), as llama.cpp's phi3 (and Phi-3's folders: qkv_proj,
 * gate_up_proj) hold them. Returns the tensors' count. */
size_t nv_tensor_parts_of(nv_tensor_ref *t, nv_tensor_parts *tp, size_t n, int phi3);
/* Whether c is written as Phi-3 (GGUF phi3; a Hugging Face folder too when it has LongRoPE's
 * divisors): llama's block rotating part of each head (Phi-4-mini), which llama.cpp's llama
 * refuses; for a folder also any per-pair RoPE divisors besides YaRN's and Llama 3.1's rule. */
int nv_config_phi3_form(const nv_config *c, int folder);
/* Every query and key row of m (and the QK-norm weights and the biases that go with them)
 * reordered between this project's RoPE order, which rotates rows (2i, 2i + 1) of a head, and the
 * order of qwen GGUF files and of Hugging Face checkpoints, which rotate rows (i, i + hd/2):
 * to_half 1 into the latter, 0 back (with partial rotation, within the first rows a head rotates,
 * (i, i + rot/2), the rest kept). */
nv_err nv_model_qk_reorder(nv_model *m, int to_half);
/* The rows of heads x hd rows of row_bytes each (NULL: nothing) reordered the same way, in place,
 * the first rot rows of each head rotated (hd: all of them). */
nv_err nv_rope_rows_reorder(void *base, size_t row_bytes, int heads, int hd, int rot, int to_half);
/* A LoRA adapter's B ([out][rank], matrix t in plan order) for a query (t 0) or key (t 1) matrix:
 * its rows reordered the same way (nothing for the other matrices). */
nv_err nv_lora_b_rows_reorder(const nv_config *c, int t, float *b, int rank, int to_half);
/* view: m's config and weights, but for copies of the query and key rows (QK-norm weights, query
 * and key biases) in the half order (*copy, the caller frees), for writers of that order. */
nv_err nv_model_half_view(const nv_model *m, nv_model *view, float **copy);

/* LoRA adapters in llama.cpp's GGUF form (what its convert_lora_to_gguf.py writes and its --lora
 * reads): general.type "adapter", general.architecture the base model's (llama, qwen2, qwen3),
 * adapter.type "lora", adapter.lora.alpha (F32), and for each adapted matrix
 * "blk.N.attn_q.weight.lora_a" (dims [in, rank]: A) and ".lora_b" (dims [rank, out]: B), B's
 * query and key rows in a qwen file's RoPE order. Saving writes F32 tensors atomically. Loading
 * checks every tensor (a pair per matrix, one rank, shapes of this model, a type the model loader
 * converts, finite values) and returns the trainable block's layout (model/lora.h): matrices the
 * file adapts in some layers only get zeros (no change) in the others; a file without alpha gets
 * alpha = rank (llama.cpp then scales by the user's scale alone). */
nv_err nv_gguf_save_lora(const nv_config *c, const nv_lora_shape *s, const float *p, const char *path);
nv_err nv_gguf_load_lora(const char *path, const nv_config *c, nv_lora_shape *s, float **params);

/* Text from a file (a name, a key) as message text in out: at most 100 bytes, anything but
 * printable ASCII as '?', so an error stays one line. Returns out. */
const char *nv_gguf_shown(const char *s, size_t n, char *out, size_t cap);
/* tokenizer.ggml.model of an open file as a C string in out, or NULL when absent. */
const char *nv_gguf_vocab_model(const nv_gguf *g, char *out, size_t cap);
/* A byte-level BPE ("gpt2") vocabulary: the strings point into g's mapping (valid while g is
 * open), the arrays are the caller's to release with nv_gguf_bpe_free. Ids absent from the
 * metadata are -1; add_bos is -1 when the file does not say. */
typedef struct {
    int n_tokens, n_merges;
    const char **tok, **merge;
    int *tok_len, *merge_len;
    int32_t *tok_type; /* llama.cpp's: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte */
    char pre[64];      /* tokenizer.ggml.pre, "" when absent */
    int bos, eos, eot, eom, unk, add_bos;
    int add_eos;   /* tokenizer.ggml.add_eos_token (an embedding model's input ends with EOS), -1 when absent */
    int add_space; /* tokenizer.ggml.add_space_prefix (SentencePiece's dummy prefix), -1 when absent */
} nv_gguf_bpe;
nv_err nv_gguf_bpe_vocab(const nv_gguf *g, nv_gguf_bpe *v);
/* A SentencePiece ("llama") vocabulary's token types, ids and add_bos as nv_gguf_bpe holds them
 * (tok and merge NULL): what its llama2.c form (nv_gguf_tokenizer_bytes) cannot carry. */
nv_err nv_gguf_spm_meta(const nv_gguf *g, nv_gguf_bpe *v);
void nv_gguf_bpe_free(nv_gguf_bpe *v);

#endif
