/* Causal multi-head attention with GQA for training: forward (keeps the probabilities) and
 * backward, parallel over the thread pool.
 *
 * Layouts: q/dq [B*T][H*hd], k/v/dk/dv [B*T][KVH*hd], att [B][H][T][T] (row t holds u <= t),
 * out/dout like q. The workspace holds nv_attention_workspace(c, B, T) floats.
 * Forward runs one (sequence, query head) per task; backward one (sequence, KV head) per task,
 * so the dk/dv rows a task gathers into belong to it alone. Keys and values are transposed per
 * task so the score loops run 8 positions at a time with AVX2 (part of the x86-64-v3 baseline). */
#ifndef NV_ATTENTION_H
#define NV_ATTENTION_H

#include <stddef.h>

#include "model/config.h"

size_t nv_attention_workspace(const nv_config *c, int B, int T);
void nv_attention_forward(const nv_config *c, int B, int T, const float *q, const float *k, const float *v, float *att,
                          float *out, float *ws);
/* dq, dk, dv are accumulated (+=). */
void nv_attention_backward(const nv_config *c, int B, int T, const float *q, const float *k, const float *v,
                           const float *att, const float *dout, float *dq, float *dk, float *dv, float *ws);

#endif
