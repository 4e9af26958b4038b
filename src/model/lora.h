/* Low-rank adapters (LoRA): a frozen weight matrix W (out x in) of a layer's attention or FFN
 * gains a trained low-rank update, W' = W + (alpha / rank) * B . A, with A rank x in and B
 * out x rank. Training keeps only A and B (and their optimizer state): a few percent of the
 * model's parameters, so a model too large to train whole still fine-tunes on this box.
 *
 * The trainable block holds, for each layer and each targeted matrix in the plan order (q, k, v,
 * o, gate, down, up), A [rank][in] then B^T [rank][out]: B is kept transposed, the layout the
 * engine plans take for the two products (y += s (x A^T) B^T runs as a dx-style product over
 * B^T). Files store B as llama.cpp's adapters do, out x rank (nv_gguf_save_lora). */
#ifndef NV_LORA_H
#define NV_LORA_H

#include <stdint.h>

#include "base/err.h"
#include "model/model.h"

/* Bits of nv_lora_shape.targets, in the plan order of a layer's matrices (NV_LAYER_MATRICES). */
enum { NV_LORA_Q = 1, NV_LORA_K = 2, NV_LORA_V = 4, NV_LORA_O = 8, NV_LORA_GATE = 16, NV_LORA_DOWN = 32, NV_LORA_UP = 64 };
#define NV_LORA_ALL 127u
#define NV_LORA_ATTN 15u /* q, k, v, o */
#define NV_LORA_FFN 112u /* gate, down, up */

typedef struct {
    int rank;         /* 0: no adapter (the whole model trains) */
    float alpha;      /* the update is scaled by alpha / rank */
    unsigned targets; /* NV_LORA_* bits */
} nv_lora_shape;

/* Parses a comma-separated list of q, k, v, o, gate, down, up, or attn (q,k,v,o), ffn (gate,down,up),
 * all; one line of error naming the bad word. */
nv_err nv_lora_parse_targets(const char *spec, unsigned *mask);
/* The list as nv_lora_parse_targets reads it, into out (cap bytes). */
const char *nv_lora_targets_text(unsigned mask, char *out, size_t cap);
/* Matrix t (0..6, plan order) of a layer: its rows (outputs) and columns (inputs). */
void nv_lora_dims(const nv_config *c, int t, int *out, int *in);
/* Floats of the trainable block, and where layer l's matrix t starts in it (A, then B^T right
 * after, rank x in floats later); the matrix must be targeted. */
uint64_t nv_lora_param_count(const nv_config *c, const nv_lora_shape *s);
uint64_t nv_lora_offset(const nv_config *c, const nv_lora_shape *s, int l, int t);
/* Checks a shape against a model: rank 1..min(in, out, 1024) of every target, alpha in (0, 1e6],
 * at least one target; in a mixture of experts, the attention's alone (NV_EUNSUPPORTED). */
nv_err nv_lora_validate(const nv_config *c, const nv_lora_shape *s);
/* The starting adapter: A uniform in +-1/sqrt(in) from seed (as PEFT's default), B zero, so the
 * adapted model starts as the base model. */
void nv_lora_init(const nv_config *c, const nv_lora_shape *s, float *p, uint64_t seed);
/* An adapter that changes the model, for measurements and tests: A as nv_lora_init, B's values
 * normal with standard deviation b_scale. */
void nv_lora_init_nonzero(const nv_config *c, const nv_lora_shape *s, float *p, uint64_t seed, float b_scale);
/* m's fp32 weights += scale * (alpha / rank) * B . A for every target (the model's plans, if any,
 * must be refreshed or rebuilt after). The merged matrices' block-quantized sources (m->quant, a
 * GGUF file's), which no longer hold them, are freed, so plans are built from the fp32 weights. */
void nv_lora_merge(nv_model *m, const nv_lora_shape *s, const float *p, float scale);
/* One matrix: w (out x in) += k * B . A, with a [rank][in] and bt [rank][out]. */
void nv_lora_merge_matrix(float *w, int out, int in, int rank, const float *a, const float *bt, float k);

#endif
