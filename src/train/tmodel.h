/* The model as training sees it: fp32 master parameters and their gradients, activations for a
 * batch of B sequences of T tokens, and one forward and one backward function per layer type
 * (the llm.c habit). Parameters and gradients are single contiguous blocks in the version-1
 * order of nv_weights, with a struct of pointers into each; activations likewise.
 *
 * Every matrix product runs through the model's engine plans: forward y = x.W^T, backward
 * dx = dy.W (nv_plan_run_dx) and dW += dy^T.x (nv_gemm_dw). The plans are built once; the
 * optimizer pass (nv_tmodel_optimize) rewrites their packed copies as it changes the master
 * weights (nv_plan_refresh_rows), so nothing is ever rebuilt because weights changed. */
#ifndef NV_TMODEL_H
#define NV_TMODEL_H

#include "model/lora.h"
#include "model/model.h"
#include "train/optim.h"

typedef struct {
    float *x;           /* [L+1][BT][d] residual stream entering each layer; x[L] leaves the last */
    float *xn1, *rstd1; /* [L][BT][d], [L][BT] attention RMSNorm */
    float *qraw, *kraw; /* [L][BT][qd], [L][BT][kvd] projections before QK-norm (qk_norm only) */
    float *qrstd, *krstd; /* [L][BT][H], [L][BT][KVH] (qk_norm only) */
    float *q, *k, *v;   /* [L][BT][qd|kvd] after QK-norm and RoPE */
    float *att_stats;   /* [L][B][H][T][2] each attention row's softmax max and 1/sum (backward recomputes P) */
    float *ao;          /* [L][BT][qd] attention output before wo */
    float *x2;          /* [L][BT][d] residual after attention */
    float *ya, *rstd_pa; /* post-norms only: [L][BT][d] the attention's output projection before its norm, [L][BT] */
    float *yf, *rstd_pf; /* post-norms only: [L][BT][d] the FFN's down projection before its norm, [L][BT] */
    float *xn2, *rstd2; /* [L][BT][d], [L][BT] FFN RMSNorm */
    float *h1, *h3, *hg; /* [L][BT][hidden] gate, up, silu(gate)*up; in a mixture of experts
                            [L][BT*K][hidden], a row per token's chosen expert, grouped by expert */
    /* a mixture of experts only (K = n_experts_used, E = n_experts) */
    float *moe_p;       /* [L][BT][E] the router's softmax */
    float *moe_w;       /* [L][BT][K] the chosen experts' weights (renormalised) */
    float *moe_lse;     /* [L][BT] the log of the sum of exp of each row's router logits */
    float *moe_y;       /* [L][BT*K][d] the experts' outputs, grouped by expert */
    int *moe_sel;       /* [L][BT][K] the chosen experts */
    int *moe_order;     /* [L][BT*K] the token * K + choice of each grouped row */
    int *moe_at;        /* [L][BT*K] the grouped row of each token's choice */
    int *moe_off;       /* [L][E+1] where expert e's grouped rows start */
    float *xnf, *rstdf; /* [BT][d], [BT] final norm */
    float *logits;      /* [BT][V]; the cross-entropy leaves exp(logit - row max) here (with a soft cap on
                           the logits, tanh(logit / cap) instead), the backward turns that into dlogits in place */
    float *lmax;        /* [BT] with a soft cap on the logits: each row's largest capped logit */
    float *pscale;      /* [BT] 1 / each row's sum of exps: logits[r][i] * pscale[r] is p(i) */
    float *nll;         /* [BT] each row's -log p(target); 0 where it has none */
} nv_acts;

typedef struct {
    nv_model m;        /* config, master weights (owned, writable) and plans */
    float *grads;      /* [n_params] */
    int grads_held;    /* grads hold a sum the next backward adds to; 0 after init, zero_grad and each
                          optimizer step: the next backward writes them */
    nv_weights g;      /* pointers into grads */
    int B, T;
    int T_cap;          /* the T it was made for: nv_tmodel_set_length runs shorter windows in its buffers */
    nv_acts a;
    int recompute;     /* the layers' activations are not kept: the backward runs each layer's forward
                          again from its input, into one layer's slots (nv_tmodel_init_ex) */
    float *act_mem;
    float *scratch;    /* backward temporaries */
    const int *inputs, *targets; /* of the last forward, [B*T] */
    const int *seg;              /* nv_tmodel_set_segments's, or NULL */
    const int *seg_fwd;          /* the last forward's, which its backward uses */
    /* dropout (nv_tmodel_set_dropout): the probability, key and first row's number of the forwards
       that follow, and of the last forward (which its backward uses); the backward's masked
       branch gradient */
    float drop_p, drop_p_fwd, lora_drop_p, lora_drop_p_fwd;
    uint32_t drop_key, drop_key_fwd, drop_row0, drop_row0_fwd;
    float *drop_buf;
    float *lora_xd;     /* [B*T][widest adapter input]: an adapter's input with its dropout, or that input's gradient */
    float loss;        /* mean loss of the last forward over its rows with a target */
    /* distillation (nv_tmodel_set_teacher): the teacher's logits for the forwards that follow, its
       weight and temperature; the last forward's teacher (its rows' gradients then made by it, for
       its backward to scale); its mean KL divergence over its rows with a target, and the objective
       its backward differentiates */
    const float *teacher, *teacher_fwd;
    float distill_alpha, distill_temp;
    float distill_kl, objective;
    int n_targets;     /* those rows (a negative target is none: chat data's prompts and padding) */
    int n_correct;     /* and of them, those whose target's logit is the row's largest (token accuracy) */
    /* a mixture of experts: the load-balancing loss's weight in the objective (set by the caller;
       0: none), and the last forward's loss, the mean over layers of (E / K) * sum_e f_e P_e with
       f_e the share of the window's tokens that chose expert e and P_e its mean router probability
       (1 when balanced). nv_tmodel_backward adds coef * grad_scale * its gradient; the preference
       losses' nv_tmodel_backward_seq does not. */
    float router_aux_coef, router_aux;
    /* and the router z-loss's (ST-MoE: the mean over rows of the square of the log of the sum of exp
       of the router's logits, which keeps them small; averaged over layers), weight and last value */
    float router_z_coef, router_z;
    double flops_per_step; /* matmul FLOPs of one forward+backward of B*T tokens, one document a window */
    double flops_dense;    /* of those, the weights' products (attention's are flops_key a key a row sees) */
    double flops_key;
    double attn_seconds;   /* time spent in causal attention (forward and backward) since init */
    /* LoRA (lora.rank > 0): the base weights are frozen — no gradients (grads is NULL), never
       updated — and adapters on the targeted matrices train instead (model/lora.h's block) */
    nv_lora_shape lora;
    float *lora_params, *lora_grads;
    nv_plan **lora_plans; /* [L][7][2]: A (n rank, k in) and B^T (n rank, k out); NULL where not targeted */
    float *lora_us;       /* [L][7][B*T][rank]: alpha/rank * x A^T of the last forward (targeted matrices) */
    float *lora_du;       /* [B*T][rank] backward temporary */
    float *sink;          /* the frozen norms' weight gradients, made and dropped */
    int base_released;    /* NV_TMODEL_RELEASE_BASE let frozen matrices' fp32 pages go */
    /* what the optimizer trains and a checkpoint keeps: the model's block, or the adapters' */
    float *train_params, *train_grads;
    uint64_t n_train;
} nv_tmodel;

/* Takes ownership of nothing: copies init (n_params floats, version-1 order) or initialises
 * randomly with seed when init is NULL. */
nv_err nv_tmodel_init(nv_tmodel *tm, const nv_config *c, const float *init, uint64_t seed, int B, int T,
                      nv_engine_id engine);
/* The same with adapters when lora is not NULL and its rank positive: lora_init (the block's
 * floats) or, when NULL, nv_lora_init from seed; the base weights init must be given, and are then
 * used in place, not copied: they must stay alive and unchanged until nv_tmodel_free (nothing
 * writes them; nv_model_own_params(&tm->m) first to change them, as the merge at a run's end does). */
nv_err nv_tmodel_init_lora(nv_tmodel *tm, const nv_config *c, const float *init, uint64_t seed, int B, int T,
                           nv_engine_id engine, const nv_lora_shape *lora, const float *lora_init);
/* Either, with flags:
 * - NV_TMODEL_RECOMPUTE: activation checkpointing at every layer. Only each layer's input is kept
 *   (and the last one's output); the backward runs a layer's forward again just before its backward,
 *   the same operations, so the loss and gradients are the same bits, for about a third more work and
 *   the activations of one layer instead of all of them.
 * - NV_TMODEL_RELEASE_BASE (with adapters): each frozen matrix's pages in init are given back to the
 *   kernel once its plan holds its own copy (nv_model.release_floats; every engine but scalar), so the
 *   base is held once, as its plans (bf16 tiles and dx's transposed tiles: 4 bytes a weight, not 8).
 *   The caller must not read those matrices in init afterwards (tm->base_released says whether any
 *   went): a merge reads the model again. The token embedding, norms and biases stay. */
#define NV_TMODEL_RECOMPUTE 1
#define NV_TMODEL_RELEASE_BASE 2
nv_err nv_tmodel_init_ex(nv_tmodel *tm, const nv_config *c, const float *init, uint64_t seed, int B, int T,
                         nv_engine_id engine, const nv_lora_shape *lora, const float *lora_init, int flags);
void nv_tmodel_free(nv_tmodel *tm);
/* About the bytes a training model of this shape and batch holds (with AdamW's state; with
 * adapters, when lora is not NULL, theirs and no gradients for the base), with nv_tmodel_init_ex's
 * flags: for a check before anything is allocated. */
double nv_tmodel_memory_bytes(const nv_config *c, int B, int T, const nv_lora_shape *lora, int flags);

/* Forward over inputs [B*T]; with targets, returns the mean cross-entropy over the rows whose
 * target is not negative (0 when none; else 0 without targets). */
float nv_tmodel_forward(nv_tmodel *tm, const int *inputs, const int *targets);
/* Packed windows: seg [B*T] gives each row's first position of its document within its window
 * (0 <= seg[r] <= r % T), so that attention sees that document alone (each row of a packed window
 * attends to its own conversation's earlier tokens, as in a window of its own); NULL: every row sees
 * its whole window up to itself. Used by every forward until set again; the caller keeps it alive
 * through the backward. */
void nv_tmodel_set_segments(nv_tmodel *tm, const int *seg);
/* The windows of the forwards and backwards that follow are T long (1..T_cap; else T_cap): rows
 * b * T + t of their inputs and targets, the activations laid out for that T inside buffers made
 * for T_cap (the scratch keeps its T_cap layout); a forward and its backward must see the same
 * length. */
void nv_tmodel_set_length(nv_tmodel *tm, int T);
/* Dropout, training's regularisation, for the forwards that follow (p_lora: the adapters' own, below): each element of every layer's
 * attention and FFN branch output (after a post-norm, before Granite's multiplier; a mixture's
 * weighted sum) is dropped with probability p before it joins the residual stream, the others
 * scaled by 1 / (1 - p) (inverted dropout). Which, a hash of key (one per micro-batch), the layer
 * and branch, the row's number in the whole batch (row0 + its index: a data-parallel process passes
 * where its rows start, so N processes drop what one would) and the column: the backward, a
 * recomputing backward and any split of the work over threads see the same mask, and a resumed run
 * the same as an uninterrupted one. p 0 (evaluation, sampling): none, the same bits as before any
 * was set. p_lora (adapters only, PEFT's lora_dropout): each adapter's input is dropped likewise,
 * with a mask of its own per layer and matrix, before its A (the frozen product sees the whole
 * input). NV_EINVAL outside [0, 1); NV_ENOMEM for their buffers. */
nv_err nv_tmodel_set_dropout(nv_tmodel *tm, float p, float p_lora, uint64_t key, uint64_t row0);
/* Knowledge distillation (Hinton et al.) for the forwards that follow: teacher [B*T][V] holds a
 * teacher model's logits for each row (the caller's, alive through the backward; NULL: off). A row
 * with a target then contributes (1 - alpha) * -log p(target) + alpha * temp^2 * KL(r || q), r and
 * q the teacher's and the model's softmax of their logits / temp; the backward differentiates that
 * (the rows' mean), tm->loss stays the cross-entropy alone (comparable with a run without), and
 * tm->distill_kl is the KL term's mean, tm->objective the whole. NV_EINVAL for alpha outside [0, 1],
 * a temperature not positive, or a model whose logits are soft-capped. */
nv_err nv_tmodel_set_teacher(nv_tmodel *tm, const float *teacher, float alpha, float temp);
/* The matmul FLOPs of one forward+backward of B*T rows packed as seg says (NULL: one document a
 * window, flops_per_step): attention counted over the keys each row sees, its document's earlier
 * rows within the layer's window. */
double nv_tmodel_step_flops(const nv_tmodel *tm, const int *seg);
/* Backward of the last forward (which must have had targets); adds grad_scale * dLoss/dparam
 * into grads, Loss the forward's mean (grad_scale = 1/accum_steps averages micro-batches; rows
 * without a target add nothing). The first backward after init,
 * zero_grad or an optimizer step writes them instead (the weight-gradient products overwrite;
 * the rest is cleared first), with the bits an add to zeros gives. */
void nv_tmodel_backward(nv_tmodel *tm, float grad_scale);
/* Each sequence's summed log p(target) over its rows with a target, from the last forward (which had
 * targets): out[b] for b < B, summed in row order (no segments: one document a window). */
void nv_tmodel_seq_logp(const nv_tmodel *tm, double *out);
/* Backward of sum_b seq_scale[b] * (sequence b's summed -log p(target)) instead of the mean loss:
 * per-sequence weights, of either sign (preference training). Adds into grads as nv_tmodel_backward. */
void nv_tmodel_backward_seq(nv_tmodel *tm, const float *seq_scale);
void nv_tmodel_zero_grad(nv_tmodel *tm);
/* Rewrites every plan's packed weights (the adapters' too) from the master weights. */
void nv_tmodel_refresh(nv_tmodel *tm);
/* One optimizer update of the master weights from grads, each plan's packed copy refreshed in the
 * same pass: the parameters go by pieces over the pool, and a piece of a matrix's rows is packed
 * right after its update, while it is still in cache (not re-read from memory in a second pass).
 * The same bits as nv_adamw_step followed by nv_tmodel_refresh. The gradients are spent (grads_held
 * 0): the next backward writes them rather than adding, so they are neither cleared nor read back.
 * Returns the pre-clip gradient norm; *lr_out receives the rate used. A norm that is not finite
 * skips the update (nv_adamw_step's rule): weights, moments and packed copies stay as they are. */
double nv_tmodel_optimize(nv_tmodel *tm, nv_adamw *opt, float *lr_out);

/* Building blocks (exposed for tests). */
void nv_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int rows, int n, float eps);
/* dx += ..., dw += ...; dx may alias nothing else. part: nv_rmsnorm_partials(rows, n) floats of
 * scratch (the weight gradient's sum per chunk of rows, added in order: bits independent of threads). */
void nv_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
                         int rows, int n, float *part);
size_t nv_rmsnorm_partials(size_t rows, size_t n);

#endif
