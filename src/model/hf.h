/* Hugging Face model folders: what `save_pretrained` writes and the Hub serves.
 *
 * A folder holds config.json (model_type llama, mistral, qwen2, qwen3, their mixtures of experts,
 * the Gemma family's gemma, gemma2, gemma3_text, smollm3, granite, granitemoe (its experts fused per
 * layer) or phi3 (its query, key and value projections fused, and its gate and up), the weights as
 * model.safetensors or as shards named by model.safetensors.index.json (F32, F16 or BF16 tensors
 * under transformers' names), and tokenizer.json (+ tokenizer_config.json). A model is named by
 * its config.json (cli_model_paths turns a folder into that path); its tokenizer by its
 * tokenizer.json.
 *
 * Reading: the config is checked field by field (hidden_act silu, Gemma's gelu_pytorch_tanh and
 * its block, its norms stored as w - 1 read as w; RoPE unscaled or Llama 3.1's
 * "llama3" scaling, turned into the per-frequency divisors llama.cpp computes; a Mistral sliding
 * window caps the context at the window, where full attention is the same); every tensor is
 * checked against its shape and its byte range inside its file before any weight memory is taken;
 * a tensor the model has no place for is refused (but the rotary inv_freq buffers old checkpoints
 * carry, and lm_head beside tied embeddings, which transformers ignores too). Transformers rotate
 * query and key values half a head apart: their rows are reordered on the way in and out (see
 * nv_model_qk_reorder).
 *
 * Tokenizers: tokenizer.json's BPE model, either byte-level (Llama 3's and Qwen2/3's split regexes
 * or GPT-2's, recognised exactly) or with byte fallback and SentencePiece's U+2581 (Llama 2,
 * Mistral, Gemma: ranks become scores, the merge of rank r scoring -r, for this project's
 * SentencePiece encoder; <unk>, BOS, EOS ids 0, 1, 2, or Gemma's layout with its ids, token types
 * and no dummy prefix kept). BOS, EOS and add_bos_token come from
 * tokenizer_config.json, else the post-processor's template; ids the file does not name up to
 * config.json's vocab_size become unused [PADn] tokens, as llama.cpp's converter makes them. */
#ifndef NV_HF_H
#define NV_HF_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "model/gguf.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/tokenizer.h"

/* 1 when path's last component is config.json (a Hugging Face model). */
int nv_hf_is_model(const char *path);
nv_err nv_hf_read_config(const char *config_path, nv_config *c);
/* Whether config.json alone describes a model nerve runs (its architecture and shape; the weights
 * not looked at): NV_OK, or the reason it does not. */
nv_err nv_hf_check_config(const char *config_path);
/* quantized (nv_model_load_quantized, for inference): F16 weight matrices are kept as fp16 plan
 * sources, their fp32 values not made (as a GGUF file's F16 tensors), half the memory on the
 * engines that run fp16 plans. */
nv_err nv_hf_load_model(const char *config_path, nv_model *m, int quantized);

/* 1 when data is JSON text (its first non-blank byte '{'): a tokenizer.json. */
int nv_hf_is_json(const void *data, size_t len);
/* A tokenizer.json's vocabulary in the forms the tokenizer builds from: byte-level BPE (bpe, its
 * strings valid until nv_hf_vocab_free) or SentencePiece as llama2.c tokenizer.bin bytes (spm). */
typedef struct {
    int byte_level;
    int nfc; /* the normalizer composes text to Unicode NFC first (Qwen's) */
    int typed; /* SentencePiece-style, not llama's ids (Gemma's layout): bpe's ids, token types and
                  add_space say what llama2.c's form cannot */
    int rstrip; /* an added token takes the white space after it (Phi-3's: the tokenizer's rule for
                   its special tokens) */
    nv_gguf_bpe bpe;
    uint8_t *spm;
    size_t spm_len;
    void *json, *cfg; /* the parsed tokenizer.json and tokenizer_config.json */
    char *arena;      /* merges given as pairs, spelled "left right"; [PADn] names */
} nv_hf_vocab;
nv_err nv_hf_vocab_read(const char *path, nv_hf_vocab *v);
void nv_hf_vocab_free(nv_hf_vocab *v);
/* tokenizer_config.json's chat_template beside path (a config.json or tokenizer.json; the
 * "default" one of a list), as a heap string the caller frees; NULL when there is none. */
char *nv_hf_chat_template(const char *path);

typedef enum { NV_HF_F32, NV_HF_BF16, NV_HF_F16 } nv_hf_dtype;
/* Writes m (and tok, when given) into folder dir, created if missing: config.json,
 * generation_config.json, model.safetensors (matrices and norms in dtype), tokenizer.json and
 * tokenizer_config.json; each file atomically. A llama2.c vocabulary is written as BPE with byte
 * fallback whose merges are every split of a piece into two pieces, ranked by the piece's score
 * (transformers' own conversion of SentencePiece models). A mixture of experts is written as
 * Mixtral (model_type mixtral), or with QK-norm as Qwen3-MoE, a tensor per expert. Refused: RoPE
 * frequency factors (config.json names a scaling rule, not divisors), QK-norm or experts with
 * biases (no such model type), and any model the config.json made would not read back as exactly
 * (checked before anything is written). The Gemma family is written as gemma, gemma2 or
 * gemma3_text (norms as w - 1), SmolLM3 as smollm3, Granite as granite, or with experts as granitemoe
 * (its experts fused per layer: input_linear, output_linear, router.layer).
 * chat_template (Jinja text, or NULL): tokenizer_config.json's chat_template (written with tok). */
nv_err nv_hf_save(const nv_model *m, const nv_tokenizer *tok, const char *dir, nv_hf_dtype dtype, const char *chat_template);

/* PEFT's LoRA adapters (what `PeftModel.save_pretrained` writes): adapter_config.json (peft_type
 * LORA, r, lora_alpha, use_rslora: the update scaled by alpha / sqrt(r)) and
 * adapter_model.safetensors with base_model.model.model.layers.N.<module>.lora_A.weight [r, in]
 * and .lora_B.weight [out, r] for the attention and FFN projections (B's query and key rows in
 * transformers' RoPE order). DoRA, trained biases, modules_to_save and per-module ranks are refused;
 * matrices adapted in some layers only get zeros (no change) in the others. path: the folder, its
 * adapter_config.json or its adapter_model.safetensors. Loading returns the trainable block's
 * layout (model/lora.h), as nv_gguf_load_lora. */
int nv_hf_is_lora(const char *path);
nv_err nv_hf_load_lora(const char *path, const nv_config *c, nv_lora_shape *s, float **params);
/* Writes adapter_config.json (with lora_dropout, the dropout it was trained with) and
 * adapter_model.safetensors (F32) into dir, created if missing. */
nv_err nv_hf_save_lora(const nv_config *c, const nv_lora_shape *s, const float *p, float lora_dropout, const char *dir);
/* An adapter from either form: a PEFT folder (nv_hf_is_lora) or a GGUF file. */
nv_err nv_lora_load(const char *path, const nv_config *c, nv_lora_shape *s, float **params);

#endif
