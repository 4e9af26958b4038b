/* Causal multi-head attention with GQA for training: forward (keeps each row's softmax max and
 * 1/sum, not the T x T probabilities) and backward (recomputes the probabilities from the scores and
 * those two numbers: the same operations as the forward, so the same bits), parallel over the thread
 * pool.
 *
 * Layouts: q/dq [B*T][H*hd], k/v/dk/dv [B*T][KVH*hd], stats [B][H][T][2] (row t's max of the scaled
 * scores, then 1/sum of their exps), out/dout like q. The workspace holds
 * nv_attention_workspace(c, B, T) floats.
 * Forward runs one (sequence, query head) per task; backward one (sequence, KV head) per task,
 * so the dk/dv rows a task adds to belong to it alone. Within a task every product (scores, the
 * weighted sums, and the four gradients) runs on engine e's fp32 panel kernel through nv_bpack
 * (engine.h), by blocks of query rows that stop at the block's last key; the softmaxes run with
 * AVX2 (part of the x86-64-v3 baseline). Results do not depend on the thread count. */
#ifndef NV_ATTENTION_H
#define NV_ATTENTION_H

#include <stddef.h>

#include "engine/engine.h"
#include "model/config.h"

size_t nv_attention_workspace(const nv_config *c, int B, int T);
/* layer: the model's layer, whose sliding window (Gemma's windowed layers: row t sees keys
 * t - swa_window + 1..t) applies; the scores are divided by nv_config_attn_div and, with
 * attn_softcap, capped (cap * tanh(score / cap)) before the softmax.
 * seg: NULL, or [B*T] the first position of each row's document within its window (0 <= seg[r] <=
 * r % T): row t then attends to keys seg[t]..t only, as if its document were a window of its own
 * (packed windows of several conversations); NULL is seg 0 everywhere, bit for bit. */
void nv_attention_forward(const nv_config *c, nv_engine_id e, int B, int T, int layer, const float *q, const float *k,
                          const float *v, const int *seg, float *stats, float *out, float *ws);
/* dq, dk, dv are accumulated (+=); seg as the forward's. */
void nv_attention_backward(const nv_config *c, nv_engine_id e, int B, int T, int layer, const float *q, const float *k,
                           const float *v, const int *seg, const float *stats, const float *dout, float *dq, float *dk,
                           float *dv, float *ws);

#endif
