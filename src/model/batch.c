#include "model/batch.h"

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "base/pool.h"
#include "model/attn_kern.h"
#include "model/forward.h"

/* Tasks an attention pass is split into (each owns GROUP scratch rows of scores). */
#define ATT_TASKS 32
/* Consecutive prefill rows of one sequence attend together, GROUP at a time: each key and value
 * block is then read once for all of them instead of once per row. */
#define GROUP 8
/* Blocks ahead whose keys, values or scales a decode row asks for: a sequence's blocks lie far
 * apart (no hardware stream finds the next), and a decode row spends only ~hd x B multiply-adds on
 * each, far less than a memory round trip. */
#define PF_AHEAD 4

const char *nv_kv_dtype_name(nv_kv_dtype t) {
    return t == NV_KV_F32 ? "f32" : t == NV_KV_F16 ? "f16" : t == NV_KV_Q8 ? "q8" : NULL;
}

nv_kv_dtype nv_kv_dtype_parse(const char *name) {
    if (!strcmp(name, "f32") || !strcmp(name, "fp32") || !strcmp(name, "float32")) return NV_KV_F32;
    if (!strcmp(name, "f16") || !strcmp(name, "fp16") || !strcmp(name, "float16")) return NV_KV_F16;
    if (!strcmp(name, "q8") || !strcmp(name, "q8_0") || !strcmp(name, "int8") || !strcmp(name, "i8")) return NV_KV_Q8;
    return (nv_kv_dtype)0;
}

int nv_kv_layers_count(const nv_config *c, nv_kv_layers held) {
    if (held == NV_KV_LAYERS_ALL) return c->n_layers;
    int n = 0;
    for (int l = 0; l < c->n_layers; l++) n += nv_config_layer_windowed(c, l) == (held == NV_KV_LAYERS_WINDOWED);
    return n;
}

int nv_kv_ring_blocks(const nv_config *c, int rows, int block_size) {
    return (int)(((long)rows + c->swa_window - 2) / block_size + 2);
}

size_t nv_kv_block_bytes_of(const nv_config *c, int block_size, nv_kv_dtype t, nv_kv_layers held) {
    return nv_kv_geometry_bytes(nv_kv_layers_count(c, held), block_size, nv_config_kv_dim(c), c->n_kv_heads, t);
}

size_t nv_kv_block_bytes(const nv_config *c, int block_size, nv_kv_dtype t) {
    return nv_kv_block_bytes_of(c, block_size, t, NV_KV_LAYERS_ALL);
}

nv_err nv_kv_pages_init(nv_kv_pages *kv, const nv_config *c, int block_size, int n_blocks, nv_kv_dtype t) {
    return nv_kv_pages_init_of(kv, c, block_size, n_blocks, t, NV_KV_LAYERS_ALL);
}

nv_err nv_kv_pages_init_of(nv_kv_pages *kv, const nv_config *c, int block_size, int n_blocks, nv_kv_dtype t,
                           nv_kv_layers held) {
    memset(kv, 0, sizeof *kv);
    if (block_size < 1 || n_blocks < 1)
        return nv_fail(NV_EINVAL, "kv pages: bad sizes (%d blocks of %d positions)", n_blocks, block_size);
    if (!nv_kv_dtype_name(t)) return nv_fail(NV_EINVAL, "kv pages: unknown element type %d", (int)t);
    const int n_layers = nv_kv_layers_count(c, held);
    if (n_layers < 1)
        return nv_fail(NV_EINVAL, "kv pages: the model has no %s layers",
                       held == NV_KV_LAYERS_WINDOWED ? "sliding-window" : "whole-context");
    size_t per = nv_kv_block_bytes_of(c, block_size, t, held);
    if ((size_t)n_blocks > SIZE_MAX / per) return nv_fail(NV_ENOMEM, "kv pages: size overflows");
    kv->data = nv_calloc_large((size_t)n_blocks, per); /* 2 MiB pages: a sequence's blocks lie far apart */
    if (!kv->data) return nv_fail(NV_ENOMEM, "cannot allocate %zu MB of KV pages", ((size_t)n_blocks * per) >> 20);
    kv->block_size = block_size;
    kv->n_blocks = n_blocks;
    kv->n_layers = n_layers;
    kv->held = held;
    kv->kv_dim = nv_config_kv_dim(c);
    kv->n_kv_heads = c->n_kv_heads;
    kv->dtype = t;
    kv->block_elems = per / nv_kv_dtype_bytes(t);
    return NV_OK;
}

void nv_kv_pages_free(nv_kv_pages *kv) {
    free(kv->data);
    memset(kv, 0, sizeof *kv);
}

/* fp16 stores saturate: a value past the largest finite fp16 becomes it, not infinity (NaN stays). */
static inline uint16_t to_f16(float x) {
    x = x > 65504.0f ? 65504.0f : x < -65504.0f ? -65504.0f : x;
    return (uint16_t)_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT);
}

float nv_kv_get(const nv_kv_pages *kv, size_t i) {
    if (kv->dtype == NV_KV_F16) return _cvtsh_ss(((const uint16_t *)kv->data)[i]);
    if (kv->dtype != NV_KV_Q8) return ((const float *)kv->data)[i];
    /* which layer, keys or values, head and position element i belongs to, for its scale */
    size_t per_kind = (size_t)kv->block_size * kv->kv_dim, in = i % kv->block_elems;
    int block = (int)(i / kv->block_elems), hd = kv->kv_dim / kv->n_kv_heads;
    if (in >= (size_t)kv->n_layers * 2 * per_kind) return 0.0f; /* padding or scales, not an element */
    int layer = (int)(in / (2 * per_kind)), values = (int)(in / per_kind % 2);
    size_t r = in % per_kind;
    int head = values ? (int)(r / ((size_t)kv->block_size * hd)) : (int)(r / kv->block_size) / hd;
    int pos = values ? (int)(r / hd % kv->block_size) : (int)(r % kv->block_size);
    return (float)((const int8_t *)kv->data)[i] * nv_kv_scales(kv, block, layer, values, head)[pos];
}

/* One kv head's keys or values of one position as int8 (element e at out[e * stride]) and their
 * scale: the largest finite magnitude maps to 127, each element rounds to nearest; an infinity
 * saturates at +-127 (as fp16 pages saturate) and a NaN makes the scale NaN, so it propagates as
 * it would through fp32 pages. */
static float to_q8(const float *x, int n, int8_t *out, size_t stride) {
    float amax = 0.0f;
    int nan = 0, inf = 0;
    for (int e = 0; e < n; e++) {
        float a = fabsf(x[e]);
        nan |= a != a;
        inf |= a == INFINITY;
        if (a < INFINITY && a > amax) amax = a;
    }
    /* magnitudes below 127 x FLT_MIN (1.5e-36) store as zero: their scale would be subnormal and its
     * inverse overflow */
    float scale = amax >= 127.0f * FLT_MIN ? amax / 127.0f : inf ? FLT_MAX / 127.0f : 0.0f;
    float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    for (int e = 0; e < n; e++) {
        float v = x[e] * inv;
        v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v == v ? v : 0.0f;
        out[(size_t)e * stride] = (int8_t)lrintf(v);
    }
    return nan ? NAN : scale;
}

/* Asks for count page elements (at most 4 KiB of them) from element i on: the start of a head's keys
 * or values in the next block, which lies a whole block of all layers away (no hardware stream
 * finds it). */
static inline void kv_prefetch(const void *base, size_t i, size_t count, const int DT) {
    const size_t size = DT == KV_F16 ? 2 : DT == KV_Q8 ? 1 : 4, bytes = count * size < 4096 ? count * size : 4096;
    const char *p = (const char *)base + i * size;
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, 3);
}

nv_err nv_batch_state_init(nv_batch_state *s, const nv_config *c, int max_rows, int max_seqs) {
    memset(s, 0, sizeof *s);
    if (max_rows < 1 || max_seqs < 1 || max_seqs > max_rows)
        return nv_fail(NV_EINVAL, "batch state: bad sizes (%d rows, %d sequences)", max_rows, max_seqs);
    size_t T = (size_t)max_rows;
    s->max_rows = max_rows;
    s->max_seqs = max_seqs;
    nv_err e = nv_rows_init(&s->r, c, max_rows);
    if (e != NV_OK) return e;
    s->att = calloc((size_t)ATT_TASKS * GROUP * (size_t)c->seq_len, sizeof(float));
    s->group_start = calloc(T, sizeof(int));
    s->rope = nv_rope_table_new(c, c->seq_len, 0);
    s->rope_swa = nv_rope_table_new(c, c->seq_len, 1);
    s->row_seq = calloc(T, sizeof(int));
    s->row_pos = calloc(T, sizeof(int));
    s->logit_row = calloc((size_t)max_seqs, sizeof(int));
    s->logits = calloc((size_t)max_seqs * (size_t)c->vocab_size, sizeof(float));
    s->logits_cap = max_seqs;
    if (!s->att || !s->row_seq || !s->row_pos || !s->logit_row || !s->logits || !s->rope || (c->rope_theta_swa != 0.0f && !s->rope_swa) ||
        !s->group_start) {
        nv_batch_state_free(s);
        return nv_fail(NV_ENOMEM, "cannot allocate the batch state (%d rows)", max_rows);
    }
    s->rope_key = nv_config_rope_key(c);
    s->head_dim = c->head_dim;
    s->seq_len = c->seq_len;
    return NV_OK;
}

nv_err nv_batch_state_set_adapters(nv_batch_state *s, const nv_config *c, const nv_adapters *set) {
    nv_adapter_rows_free(&s->adapter_rows);
    free(s->row_mix);
    s->row_mix = NULL;
    s->adapters = NULL;
    if (!set) return NV_OK;
    NV_TRY(nv_adapter_rows_init(&s->adapter_rows, c, set, s->max_rows));
    s->row_mix = calloc((size_t)s->max_rows, sizeof *s->row_mix);
    if (!s->row_mix) {
        nv_batch_state_set_adapters(s, c, NULL);
        return nv_fail(NV_ENOMEM, "cannot allocate the rows' adapters (%d rows)", s->max_rows);
    }
    s->adapters = set;
    return NV_OK;
}

void nv_batch_state_free(nv_batch_state *s) {
    nv_rows_free(&s->r);
    nv_batch_state_set_adapters(s, NULL, NULL);
    void *all[] = {s->att, s->row_seq, s->row_pos, s->logit_row, s->logits, s->rope, s->rope_swa, s->group_start};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    memset(s, 0, sizeof *s);
}

typedef struct {
    const nv_model *m;
    nv_batch_state *s;
    const nv_kv_pages *kv;
    const nv_batch_seq *seqs;
    int l, n, n_groups;
    int kl;         /* the layer's place in kv (l, or its place among the layers of its kind on split pages) */
    int windowed;   /* kv is the windowed side of split pages: sequences' wblocks index it */
} layer_job;

/* Sequence i's block table into the job's pages. */
static inline const int *job_table(const layer_job *j, int i) {
    return j->windowed ? j->seqs[i].wblocks : j->seqs[i].blocks;
}

/* Rows task, task + n_tasks, ...: biases, QK-norm, RoPE, and the row's keys and values into its block. */
static void rows_task(void *ctx, int task, int n_tasks) {
    const layer_job *j = ctx;
    const nv_config *c = &j->m->config;
    nv_batch_state *s = j->s;
    int hd = c->head_dim, q_dim = nv_config_q_dim(c), kv_dim = nv_config_kv_dim(c), B = j->kv->block_size, l = j->l, kl = j->kl;
    const float *rope = nv_rope_of_layer(c, s->rope, s->rope_swa, l);
    for (int t = task; t < j->n; t += n_tasks) {
        float *q = s->r.q + (size_t)t * q_dim, *k = s->r.k + (size_t)t * kv_dim;
        int p = s->row_pos[t];
        nv_qkv_finish(j->m, l, q, k, s->r.v + (size_t)t * kv_dim, rope ? rope + (size_t)p * hd : NULL, p);
        int blk = job_table(j, s->row_seq[t])[p / B], off = p % B;
        /* keys are stored transposed: [kv_dim][B] */
        size_t kat = nv_kv_keys_at(j->kv, blk, kl) + off, vat = nv_kv_values_at(j->kv, blk, kl) + (size_t)off * hd;
        const float *v = s->r.v + (size_t)t * kv_dim;
        if (j->kv->dtype == NV_KV_Q8) {
            int8_t *pages = j->kv->data;
            for (int hh = 0; hh < c->n_kv_heads; hh++) {
                nv_kv_scales(j->kv, blk, kl, 0, hh)[off] = to_q8(k + (size_t)hh * hd, hd, pages + kat + (size_t)hh * hd * B, (size_t)B);
                nv_kv_scales(j->kv, blk, kl, 1, hh)[off] = to_q8(v + (size_t)hh * hd, hd, pages + vat + (size_t)hh * B * hd, 1);
            }
        } else if (j->kv->dtype == NV_KV_F16) {
            uint16_t *pages = j->kv->data;
            for (int i = 0; i < kv_dim; i++) pages[kat + (size_t)i * B] = to_f16(k[i]);
            for (int i = 0; i < kv_dim; i++) pages[vat + (size_t)(i / hd) * B * hd + i % hd] = to_f16(v[i]);
        } else {
            float *pages = j->kv->data;
            for (int i = 0; i < kv_dim; i++) pages[kat + (size_t)i * B] = k[i];
            for (int hh = 0; hh < c->n_kv_heads; hh++)
                memcpy(pages + vat + (size_t)hh * B * hd, v + (size_t)hh * hd, (size_t)hd * sizeof(float));
        }
    }
}

/* Scores of one decode row against two key blocks of B = 8*NZ positions ([hd][B] each, at
 * elements k0 and k1 of the pages): 2*NZ independent sums held in registers (NZ and DT are
 * constants in each instance), multiply then add. */
static inline __attribute__((always_inline)) void scores_pair(const int NZ, const float *q, int hd, const void *pages,
                                                              size_t k0, size_t k1, float scale, float *out,
                                                              const int DT) {
    __m256 acc[8];
    for (int c = 0; c < 2 * NZ; c++) acc[c] = _mm256_setzero_ps();
    for (int i = 0; i < hd; i++) {
        const __m256 qi = _mm256_set1_ps(q[i]);
        for (int c = 0; c < NZ; c++) {
            acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(qi, kv_load8(pages, k0 + (size_t)i * 8 * NZ + 8 * c, DT)));
            acc[NZ + c] =
                _mm256_add_ps(acc[NZ + c], _mm256_mul_ps(qi, kv_load8(pages, k1 + (size_t)i * 8 * NZ + 8 * c, DT)));
        }
    }
    const __m256 vscale = _mm256_set1_ps(scale);
    for (int c = 0; c < 2 * NZ; c++) _mm256_storeu_ps(out + 8 * c, _mm256_div_ps(acc[c], vscale));
}

static inline __attribute__((always_inline)) void scores_pair_any(int nz, const float *q, int hd, const void *pages,
                                                                  size_t k0, size_t k1, float scale, float *out,
                                                                  const int DT) {
    switch (nz) {
    case 1: scores_pair(1, q, hd, pages, k0, k1, scale, out, DT); break;
    case 2: scores_pair(2, q, hd, pages, k0, k1, scale, out, DT); break;
    case 3: scores_pair(3, q, hd, pages, k0, k1, scale, out, DT); break;
    default: scores_pair(4, q, hd, pages, k0, k1, scale, out, DT); break;
    }
}

/* Outputs of the G rows of a group (row g sees positions 0..last0 + g) over NV*8 dimensions at
 * element i0 of the head: blocks outermost, so each block's values are read from memory once and
 * swept by every row that sees them from L1; a row's NV sums stay in registers across the block and
 * wait in its output row between blocks (exact: an fp32 store and load). Each lane still sums
 * att[u] v[u][i] over u in order, multiply then add. */
static inline __attribute__((always_inline)) void values_group(int NV, int G, const float *att0, size_t att_ld,
                                                               int u_from, int last0, const nv_kv_pages *kv, const int *blocks,
                                                               int l, size_t koff, int hd, int i0, float *out0,
                                                               size_t out_ld, const int DT) {
    const int B = kv->block_size;
    const void *pages = kv->data;
    for (int g = 0; g < G; g++)
        for (int c = 0; c < NV; c++) _mm256_storeu_ps(out0 + (size_t)g * out_ld + 8 * c, _mm256_setzero_ps());
    enum { CHUNK = 64 }; /* positions made fp32 at once (fp16 pages): 16 KiB at most */
    float vbuf[CHUNK * 64] __attribute__((aligned(32)));
    for (int u0 = u_from; u0 <= last0 + G - 1; u0 += B) {
        const size_t vb = nv_kv_values_at(kv, blocks[u0 / B], l) + koff * B + i0;
        if (u0 + B <= last0 + G - 1 && i0 == 0)
            kv_prefetch(pages, nv_kv_values_at(kv, blocks[u0 / B + 1], l) + koff * B, (size_t)B * hd, DT);
        const int seen = last0 + G - u0 < B ? last0 + G - u0 : B; /* positions of the block the last row sees */
        for (int z0 = 0; z0 < seen; z0 += CHUNK) {
            const int zn = seen - z0 < CHUNK ? seen - z0 : CHUNK;
            const float *v = vbuf;
            size_t vld = (size_t)8 * NV;
            if (DT == KV_F32) { /* fp32 pages: read in place */
                v = (const float *)pages + vb + (size_t)z0 * hd;
                vld = (size_t)hd;
            } else { /* each value made fp32 once for all the rows, not once per row */
                for (int z = 0; z < zn; z++)
                    for (int c = 0; c < NV; c++)
                        _mm256_store_ps(vbuf + (size_t)z * 8 * NV + 8 * c, kv_load8(pages, vb + (size_t)(z0 + z) * hd + 8 * c, DT));
            }
            for (int g = u0 + z0 > last0 ? u0 + z0 - last0 : 0; g < G; g++) {
                const float *att = att0 + (size_t)g * att_ld + u0 + z0;
                float *out = out0 + (size_t)g * out_ld;
                values_rows_add_any(NV, att, v, vld, last0 + g - u0 - z0 + 1 < zn ? last0 + g - u0 - z0 + 1 : zn, out);
            }
        }
    }
}

/* q8 pages: asks for the key (values = 0) or value (1) scales of (block, layer, kv head). */
static inline void q8_prefetch_scale_row(const nv_kv_pages *kv, int block, int l, int values, int head) {
    const char *sc = (const char *)nv_kv_scales(kv, block, l, values, head);
    for (size_t o = 0; o < (size_t)kv->block_size * sizeof(float); o += 64) __builtin_prefetch(sc + o, 0, 3);
}

/* Both, read by q8_scale_rows once the scores of the row are done. */
static inline void q8_prefetch_scales(const nv_kv_pages *kv, int block, int l, int head) {
    q8_prefetch_scale_row(kv, block, l, 0, head);
    q8_prefetch_scale_row(kv, block, l, 1, head);
}

/* q8 pages: att[g][u] *= the scale of position u's keys (values = 0) or values (1) of kv head `head`
 * for the G rows of a group (row g: positions 0..p0 + g). The same multiply whichever path computed
 * the scores, so q8 keeps the batch invariance of the other element types. */
static void q8_scale_rows(float *att0, size_t att_ld, int G, int u_from, int p0, const nv_kv_pages *kv, const int *blocks, int l,
                          int values, int head) {
    const int B = kv->block_size;
    /* every block's scales asked for first (those the scores loop did not ask for ahead): each is a
     * line or two of a different block, and the multiplies between them cannot hide a round trip */
    for (int u0 = u_from; u0 <= p0 + G - 1; u0 += B) q8_prefetch_scale_row(kv, blocks[u0 / B], l, values, head);
    for (int u0 = u_from; u0 <= p0 + G - 1; u0 += B) {
        const float *sc = nv_kv_scales(kv, blocks[u0 / B], l, values, head);
        for (int g = u0 > p0 ? u0 - p0 : 0; g < G; g++) {
            float *a = att0 + (size_t)g * att_ld + u0;
            const int n = p0 + g - u0 + 1 < B ? p0 + g - u0 + 1 : B;
            int z = 0;
            for (; z + 8 <= n; z += 8) _mm256_storeu_ps(a + z, _mm256_mul_ps(_mm256_loadu_ps(a + z), _mm256_loadu_ps(sc + z)));
            for (; z < n; z++) a[z] *= sc[z];
        }
    }
}

/* Causal attention of (group, head) units task, task + n_tasks, ... over each row's own pages: the
 * sums of forward.c's attention() in the same order for every element. A group is up to GROUP
 * consecutive rows of one sequence at consecutive positions (a prefill chunk), or a single row.
 * Scores: lanes are 8 positions of a block (keys are stored transposed), each lane summing
 * q[i] k[i] over i in order. Outputs: lanes are 8 dimensions of the head, each summing
 * att[u] v[u][i] over u in order. Each key/value block is loaded once for the whole group. Lane-wise
 * vector arithmetic (multiply, then add: no fused rounding) rounds exactly as scalar code. */
static inline __attribute__((always_inline)) void attention_units(const layer_job *j, int task, int n_tasks,
                                                                  const int DT) {
    const nv_config *c = &j->m->config;
    nv_batch_state *s = j->s;
    const nv_kv_pages *kv = j->kv;
    const void *pages = kv->data;
    int hd = c->head_dim, q_dim = nv_config_q_dim(c), B = kv->block_size, l = j->kl; /* the pages' layer */
    int kv_mul = c->n_heads / c->n_kv_heads, units = j->n_groups * c->n_heads;
    float scale = nv_config_attn_div(c);
    const int window = nv_config_layer_window(c, j->l);
    const float *sinks = j->m->w.sinks ? j->m->w.sinks + (size_t)j->l * c->n_heads : NULL; /* gpt-oss's */
    float *att0 = s->att + (size_t)task * GROUP * s->seq_len;
    /* a task takes consecutive heads of a sequence: their keys and values lie side by side */
    for (int unit = (int)((long)units * task / n_tasks); unit < (int)((long)units * (task + 1) / n_tasks); unit++) {
        int g = unit / c->n_heads, h = unit % c->n_heads;
        int r0 = s->group_start[g], r1 = g + 1 < j->n_groups ? s->group_start[g + 1] : j->n, G = r1 - r0;
        int p0 = s->row_pos[r0], plast = s->row_pos[r1 - 1];
        const int *blocks = job_table(j, s->row_seq[r0]);
        size_t koff = (size_t)(h / kv_mul) * hd;
        /* scores of every row, block by block: row g sees positions 0..p0+g */
        /* a sliding window: the blocks before the first row's window are never read (ub: where its
           first block starts; the positions of that block before the window are masked) */
        const int ub = nv_window_start(window, p0) / B * B;
        int u_done = ub;
        if (G == 1 && B % 8 == 0 && B <= 32) {
            /* a decode row: two blocks at a time, up to eight independent sums in flight (the scores
             * of positions past p0 in the last block land in the scratch row, past its used part) */
            const float *q = s->r.q + (size_t)r0 * q_dim + (size_t)h * hd;
            int nz = B / 8, nblk = p0 / B + 1;
            for (int bi = ub / B; bi + 2 <= nblk; bi += 2) {
                /* a pair of blocks is only ~2 x hd x B multiply-adds: ask for the keys well ahead */
                for (int ahead = bi + PF_AHEAD; ahead < bi + PF_AHEAD + 2 && ahead < nblk; ahead++) {
                    kv_prefetch(pages, nv_kv_keys_at(kv, blocks[ahead], l) + koff * B, (size_t)B * hd, DT);
                    if (DT == KV_Q8) q8_prefetch_scales(kv, blocks[ahead], l, h / kv_mul);
                }
                scores_pair_any(nz, q, hd, pages, nv_kv_keys_at(kv, blocks[bi], l) + koff * B,
                                nv_kv_keys_at(kv, blocks[bi + 1], l) + koff * B, scale, att0 + (size_t)bi * B, DT);
                u_done = (bi + 2) * B;
            }
        }
        for (int u0 = u_done; u0 <= plast && B % 8 == 0; u0 += B) {
            /* four rows and sixteen positions at a time: eight sums in flight, each key vector loaded
             * once for four rows (rows that do not reach the block are skipped) */
            const size_t kt = nv_kv_keys_at(kv, blocks[u0 / B], l) + koff * B; /* [hd][B] */
            if (u0 + B <= plast) {
                kv_prefetch(pages, nv_kv_keys_at(kv, blocks[u0 / B + 1], l) + koff * B, (size_t)B * hd, DT);
                if (DT == KV_Q8) q8_prefetch_scales(kv, blocks[u0 / B + 1], l, h / kv_mul);
            }
            for (int gr = u0 > p0 ? u0 - p0 : 0; gr < G; gr += 4) {
                const int R = G - gr < 4 ? G - gr : 4;
                const float *qr[4];
                float *ar[4];
                int cnt[4];
                for (int r = 0; r < R; r++) {
                    qr[r] = s->r.q + (size_t)(r0 + gr + r) * q_dim + (size_t)h * hd;
                    ar[r] = att0 + (size_t)(gr + r) * s->seq_len + u0;
                    cnt[r] = p0 + gr + r - u0 + 1 < B ? p0 + gr + r - u0 + 1 : B;
                }
                for (int z0 = 0; z0 < cnt[R - 1]; z0 += 16)
                    scores_rows_any(R, B - z0 >= 16 ? 2 : 1, 0, qr, hd, pages, kt, B, z0, cnt, scale, ar, DT);
            }
            u_done = u0 + B;
        }
        for (int u0 = u_done; u0 <= plast; u0 += B) { /* a block size that is not a multiple of 8 */
            const size_t kt = nv_kv_keys_at(kv, blocks[u0 / B], l) + koff * B; /* [hd][B] */
            for (int gr = 0; gr < G; gr++) {
                int p = p0 + gr;
                if (u0 > p) continue;
                const float *q = s->r.q + (size_t)(r0 + gr) * q_dim + (size_t)h * hd;
                float *att = att0 + (size_t)gr * s->seq_len;
                int cnt = p - u0 + 1 < B ? p - u0 + 1 : B, z0 = 0;
                for (; z0 + 8 <= B && z0 < cnt; z0 += 8) {
                    __m256 a = _mm256_setzero_ps();
                    for (int i = 0; i < hd; i++)
                        a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_set1_ps(q[i]), kv_load8(pages, kt + (size_t)i * B + z0, DT)));
                    float sums[8];
                    _mm256_storeu_ps(sums, a);
                    int m = cnt - z0 < 8 ? cnt - z0 : 8;
                    for (int z = 0; z < m; z++) att[u0 + z0 + z] = sums[z] / scale;
                }
                for (int z = z0; z < cnt; z++) { /* a block size that is not a multiple of 8 */
                    float score = 0.0f;
                    for (int i = 0; i < hd; i++) score += q[i] * kv_load1(pages, kt + (size_t)i * B + z, DT);
                    att[u0 + z] = score / scale;
                }
            }
        }
        /* q8: a score is (q . int8 keys) / sqrt(hd) times the keys' scale; a weight multiplies the
         * values' scale before it meets their int8 */
        if (DT == KV_Q8) q8_scale_rows(att0, (size_t)s->seq_len, G, ub, p0, kv, blocks, l, 0, h / kv_mul);
        if (c->attn_softcap != 0.0f) nv_attn_softcap(att0, (size_t)s->seq_len, ub, p0, G, c->attn_softcap);
        if (window) nv_window_mask(att0, (size_t)s->seq_len, ub, p0, G, window); /* after q8's scales: -inf x 0 would be NaN */
        nv_softmax_causal_sink(att0 + ub, (size_t)s->seq_len, p0 + 1 - ub, G, sinks ? sinks[h] : -INFINITY);
        if (DT == KV_Q8) q8_scale_rows(att0, (size_t)s->seq_len, G, ub, p0, kv, blocks, l, 1, h / kv_mul);
        int i0 = 0;
        if (G == 1) /* a decode row: 64 dimensions at a time, eight independent sums in registers */
            for (; i0 + 64 <= hd; i0 += 64) {
                __m256 o[8];
#pragma GCC unroll 8
                for (int e = 0; e < 8; e++) o[e] = _mm256_setzero_ps();
                for (int u0 = ub; u0 <= p0; u0 += B) {
                    const size_t vb = nv_kv_values_at(kv, blocks[u0 / B], l) + koff * B + i0;
                    if (i0 == 0 && u0 + PF_AHEAD * B <= p0)
                        kv_prefetch(pages, nv_kv_values_at(kv, blocks[u0 / B + PF_AHEAD], l) + koff * B, (size_t)B * hd, DT);
                    int cnt = p0 - u0 + 1 < B ? p0 - u0 + 1 : B;
                    for (int z = 0; z < cnt; z++) {
                        const __m256 a = _mm256_set1_ps(att0[u0 + z]);
                        const size_t v = vb + (size_t)z * hd;
#pragma GCC unroll 8
                        for (int e = 0; e < 8; e++) o[e] = _mm256_add_ps(o[e], _mm256_mul_ps(a, kv_load8(pages, v + 8 * e, DT)));
                    }
                }
                float *dst = s->r.xb + (size_t)r0 * q_dim + (size_t)h * hd + i0;
#pragma GCC unroll 8
                for (int e = 0; e < 8; e++) _mm256_storeu_ps(dst + 8 * e, o[e]);
            }
        for (int nv; (nv = (hd - i0) / 8 < 8 ? (hd - i0) / 8 : 8) > 0; i0 += 8 * nv)
            values_group(nv, G, att0, s->seq_len, ub, p0, kv, blocks, l, koff, hd, i0,
                             s->r.xb + (size_t)r0 * q_dim + (size_t)h * hd + i0, q_dim, DT);
        for (; i0 < hd; i0++) /* a head size that is not a multiple of 8 */
            for (int gr = 0; gr < G; gr++) {
                const float *att = att0 + (size_t)gr * s->seq_len;
                float o = 0.0f;
                for (int u = ub; u <= p0 + gr; u++)
                    o += att[u] * kv_load1(pages, nv_kv_values_at(kv, blocks[u / B], l) + koff * B + (size_t)(u % B) * hd + i0,
                                           DT);
                s->r.xb[(size_t)(r0 + gr) * q_dim + (size_t)h * hd + i0] = o;
            }
    }
}

static void attention_task(void *ctx, int task, int n_tasks) {
    const layer_job *j = ctx;
    if (j->kv->dtype == NV_KV_F16) attention_units(j, task, n_tasks, KV_F16);
    else if (j->kv->dtype == NV_KV_Q8) attention_units(j, task, n_tasks, KV_Q8);
    else attention_units(j, task, n_tasks, KV_F32);
}

/* Splits the step's rows into attention groups (see attention_task); returns their number. */
static int make_groups(nv_batch_state *s, int n) {
    int groups = 0;
    for (int t = 0; t < n; t++) {
        int start = groups == 0 || t - s->group_start[groups - 1] >= GROUP || s->row_seq[t] != s->row_seq[t - 1] ||
                    s->row_pos[t] != s->row_pos[t - 1] + 1;
        if (start) s->group_start[groups++] = t;
    }
    return groups;
}

/* Layer l over kv, the pages that hold it (on split pages: the side of its kind), where it is layer kl. */
static void layer_forward(const nv_model *m, nv_batch_state *s, const nv_kv_pages *kv, int kl, const nv_batch_seq *seqs,
                          int l, int n, const nv_adapter_rows *ad) {
    const nv_config *c = &m->config;
    const nv_layer_plans *lp = &m->plans[l];

    nv_layer_input(m, l, 0, s->r.xb, s->r.x, n);
    nv_plan_run_group((const nv_plan *const[]){lp->wq, lp->wk, lp->wv}, 3, s->r.xb, n,
                      (float *const[]){s->r.q, s->r.k, s->r.v}, NULL, NULL);
    nv_adapter_rows_add(ad, c, l, 0, s->r.xb, s->r.q);
    nv_adapter_rows_add(ad, c, l, 1, s->r.xb, s->r.k);
    nv_adapter_rows_add(ad, c, l, 2, s->r.xb, s->r.v);
    layer_job job = {m, s, kv, seqs, l, n, make_groups(s, n), kl, kv->held == NV_KV_LAYERS_WINDOWED};
    nv_pool_run(rows_task, &job, n < ATT_TASKS ? n : ATT_TASKS);
    /* every row's K/V of this step is in place before any row attends (causality by position) */
    int units = job.n_groups * c->n_heads;
    double work = 0; /* multiply-adds of the scores and the weighted sums (see forward.c's attention) */
    for (int t = 0; t < n; t++) work += (double)s->row_pos[t] + 1;
    work *= (double)c->n_heads * c->head_dim;
    nv_pool_run(attention_task, &job, work < NV_POOL_MIN_WORK ? 1 : units < ATT_TASKS ? units : ATT_TASKS);
    nv_layer_tail(m, l, n, &s->r, ad);
}

static nv_err batch_check(const nv_model *m, const nv_batch_state *s, const nv_kv_pages *kv, const nv_batch_seq *seqs,
                          int n_seqs, int *rows) {
    const nv_config *c = &m->config;
    if (!m->plans) return nv_fail(NV_EINVAL, "batch: plans not built");
    if (n_seqs < 1 || n_seqs > s->max_seqs)
        return nv_fail(NV_EINVAL, "batch: %d sequences do not fit a state of %d", n_seqs, s->max_seqs);
    const nv_kv_pages *wkv = kv->windowed;
    if (kv->n_layers != nv_kv_layers_count(c, kv->held) || kv->kv_dim != nv_config_kv_dim(c) || kv->n_kv_heads != c->n_kv_heads ||
        kv->held == NV_KV_LAYERS_WINDOWED)
        return nv_fail(NV_EINVAL, "batch: KV pages were made for another model shape");
    if ((kv->held == NV_KV_LAYERS_FULL) != (wkv != NULL) ||
        (wkv && (wkv->held != NV_KV_LAYERS_WINDOWED || wkv->n_layers != nv_kv_layers_count(c, NV_KV_LAYERS_WINDOWED) ||
                 wkv->kv_dim != kv->kv_dim || wkv->n_kv_heads != kv->n_kv_heads)))
        return nv_fail(NV_EINVAL, "batch: split KV pages need both sides, made for this model shape");
    if (s->head_dim != c->head_dim || s->seq_len != c->seq_len || s->rope_key != nv_config_rope_key(c))
        return nv_fail(NV_EINVAL, "batch: the state was made for another model shape");
    long total = 0;
    for (int i = 0; i < n_seqs; i++) {
        const nv_batch_seq *q = &seqs[i];
        if (q->n < 1 || !q->tokens || !q->blocks) return nv_fail(NV_EINVAL, "batch: sequence %d is empty", i);
        if (q->lora && nv_adapter_mix_check(q->lora) != NV_OK)
            return nv_fail(NV_EINVAL, "batch: sequence %d: %s", i, nv_errmsg());
        for (int j = 0; q->lora && j < q->lora->n; j++)
            if (!s->adapters || !s->adapters->v[q->lora->k[j] - 1].a)
                return nv_fail(NV_EINVAL, "batch: sequence %d asks for adapter %d, which is not loaded", i, q->lora->k[j]);
        if (q->logits < 0 || q->logits > q->n)
            return nv_fail(NV_EINVAL, "batch: sequence %d asks for the logits of %d of its %d rows", i, q->logits, q->n);
        if (q->pos < 0 || (long)q->pos + q->n > c->seq_len)
            return nv_fail(NV_ERANGE, "batch: positions %d..%ld exceed the context of %d", q->pos,
                           (long)q->pos + q->n - 1, c->seq_len);
        for (int t = 0; t < q->n; t++)
            if (q->tokens[t] < 0 || q->tokens[t] >= c->vocab_size)
                return nv_fail(NV_ERANGE, "batch: token id %d outside the vocabulary of %d", q->tokens[t],
                               c->vocab_size);
        for (int side = 0; side < 1 + (wkv != NULL); side++) {
            const nv_kv_pages *pk = side ? wkv : kv;
            const int *table = side ? q->wblocks : q->blocks;
            if (!table) return nv_fail(NV_EINVAL, "batch: sequence %d has no table for the windowed layers' pages", i);
            for (int b = 0; b <= (q->pos + q->n - 1) / pk->block_size; b++)
                if (table[b] < 0 || table[b] >= pk->n_blocks)
                    return nv_fail(NV_ERANGE, "batch: block id %d outside the pool of %d", table[b], pk->n_blocks);
        }
        total += q->n;
    }
    if (total > s->max_rows) return nv_fail(NV_EINVAL, "batch: %ld rows do not fit a state of %d", total, s->max_rows);
    *rows = (int)total;
    return NV_OK;
}

nv_err nv_batch_forward(const nv_model *m, nv_batch_state *s, const nv_kv_pages *kv, const nv_batch_seq *seqs,
                        int n_seqs) {
    const nv_config *c = &m->config;
    int n = 0, d = c->dim;
    NV_TRY(batch_check(m, s, kv, seqs, n_seqs, &n));
    int want = 0;
    for (int i = 0; i < n_seqs; i++) want += seqs[i].logits;
    NV_TRY(nv_logits_reserve(&s->logits, &s->logits_cap, want, c->vocab_size)); /* before any work: a failure changes nothing */
    int r = 0, adapted = 0;
    for (int i = 0; i < n_seqs; i++) {
        adapted |= seqs[i].lora && seqs[i].lora->n;
        for (int t = 0; t < seqs[i].n; t++, r++) {
            s->row_seq[r] = i;
            s->row_pos[r] = seqs[i].pos + t;
            if (s->row_mix) s->row_mix[r] = seqs[i].lora;
            nv_embed(m, seqs[i].tokens[t], s->r.x + (size_t)r * d);
        }
    }
    if (adapted) nv_adapter_rows_group(&s->adapter_rows, s->row_mix, n);
    s->step_rows = 0;
    int held[2] = {0, 0}; /* layers of each side of split pages so far */
    for (int l = 0; l < c->n_layers; l++) {
        const int w = kv->windowed && nv_config_layer_windowed(c, l);
        layer_forward(m, s, w ? kv->windowed : kv, held[w]++, seqs, l, n, adapted ? &s->adapter_rows : NULL);
    }
    s->step_rows = n;
    /* classifier over the last rows of each sequence that wants logits, stacked (xb has room: at
     * most every row of the step) */
    int rows = 0;
    r = 0;
    for (int i = 0; i < n_seqs; i++) {
        r += seqs[i].n;
        s->logit_row[i] = -1;
        if (!seqs[i].logits) continue;
        s->logit_row[i] = rows;
        for (int t = r - seqs[i].logits; t < r; t++, rows++)
            nv_rmsnorm(s->r.xb + (size_t)rows * d, s->r.x + (size_t)t * d, m->w.rms_final, d, c->norm_eps);
    }
    if (rows) {
        nv_plan_run(m->cls_plan, s->r.xb, rows, s->logits);
        nv_logits_finish(c, s->logits, rows);
    }
    return NV_OK;
}

nv_err nv_batch_row_logits(const nv_model *m, nv_batch_state *s, int row, int count, float *out) {
    const nv_config *c = &m->config;
    if (row < 0 || count < 1 || row + count > s->step_rows)
        return nv_fail(NV_EINVAL, "batch: rows %d..%d are not in the last step of %d rows", row, row + count - 1,
                       s->step_rows);
    int d = c->dim;
    nv_rmsnorm_rows(s->r.xb, s->r.x + (size_t)row * d, m->w.rms_final, count, d, c->norm_eps);
    nv_plan_run(m->cls_plan, s->r.xb, count, out);
    nv_logits_finish(c, out, count);
    return NV_OK;
}
