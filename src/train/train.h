/* The training loop: micro-batches with gradient accumulation, AdamW with the packed-weight
 * refresh in the same pass, periodic validation, atomic checkpoints (every N steps, at the end,
 * on SIGINT/SIGTERM/SIGUSR1), metrics as JSON Lines, a loss-curve SVG and an efficiency report.
 *
 * The run folder holds: ckpt.bin (resume state), metrics.jsonl (one object per step), loss.svg,
 * model.bin (llama2.c v1 export of the final weights; model.gguf instead for the shapes that format
 * cannot hold, with the vocabulary when there is one; a LoRA run's merged with its adapters, which
 * adapter.gguf holds alone, in llama.cpp's adapter format) and, when one was
 * given, tokenizer.bin (a copy, so the folder is self-contained for `nerve generate`); after
 * training on chat data, chat_template (the template's name, for `nerve serve`); with save_best,
 * best/ (the same files for the weights of the best evaluation by best_metric); with save_every,
 * step-N/ (the same for the weights after step N).
 * Resuming (same arguments, same folder) continues the exact loss sequence of an uninterrupted
 * run: every piece of state that influences the next step is in the checkpoint. */
#ifndef NV_TRAIN_H
#define NV_TRAIN_H

#include "engine/engine.h"
#include "model/config.h"
#include "model/choice.h"
#include "model/lora.h"
#include "model/model.h"
#include "train/data.h"
#include "train/optim.h"
#include "train/pref.h"

/* What --save-best and --early-stop follow: the validation loss (lower is better), preference data's
 * held-out accuracies (by the loss's rewards, by the model's own choice), the multiple-choice tasks'
 * (acc, acc_norm) or the held-out token accuracy, higher being better. (The order is checkpoints'
 * best_metric: new ones go at the end.) */
typedef enum {
    NV_BEST_VAL_LOSS = 0,
    NV_BEST_REWARD_ACC,
    NV_BEST_CHOICE_ACC,
    NV_BEST_MC_ACC,
    NV_BEST_MC_ACC_NORM,
    NV_BEST_TOKEN_ACC,
    NV_BEST_COUNT
} nv_best_metric;
/* The metric named as --best-metric and metrics.jsonl spell it (-1: none such). */
int nv_best_metric_parse(const char *name);

typedef struct {
    nv_config config;
    const float *init_params; /* fine-tuning start (n_params floats) or NULL for random init */
    nv_lora_shape lora;       /* rank > 0: train LoRA adapters on the frozen init_params (model/lora.h); the run
                                 folder then also gets adapter.gguf, and model.* holds the merged weights */
    /* LoRA: a run gives the fp32 pages of init_params' matrices back once its plans hold them
       (NV_TMODEL_RELEASE_BASE: the base then takes about half the memory) when they can be had again
       for the merges at its end: init_file_backed, init_params are a read-only file mapping (a
       llama2.c v1 file used in place), whose pages read the file again; or reload_init makes the
       starting model again as it was loaded. The caller must then not read init_params' matrices
       during the run. Neither: init_params stay whole. */
    int init_file_backed;
    nv_err (*reload_init)(void *ctx, nv_model *out);
    void *reload_ctx;
    int batch, seq, accum, steps;
    float dropout;      /* on the residual branches while training (nv_tmodel_set_dropout); 0: none */
    float lora_dropout; /* on each adapter's input while training (PEFT's lora_dropout); 0: none */
    int lora_no_merge;  /* a LoRA run writes its adapters alone, no merged model (--no-merge) */
    const float *lora_init; /* a LoRA run's adapters at its start (lora's shape: an earlier run's, to train on);
                               NULL: nv_lora_init's (B zero: the frozen model as it is) */
    uint64_t seed;
    nv_adamw_opts adamw;
    int eval_every, eval_batches, ckpt_every;
    /* save_best: at every evaluation whose best_metric is the best so far, the weights into the run
       folder's best/ (the model with the tokenizer and chat template; a LoRA run's adapters).
       early_stop > 0: stop (checkpointed, cleanly) after that many evaluations without a better one;
       implies save_best. Both need eval_every, and the metric's source: validation data, preference
       data's held-out pairs, or eval_choice. */
    int save_best, early_stop;
    /* save_every > 0: every that many steps, NV_TRAIN_SAVE_EPOCH: at the end of every pass over the
       training data, the weights into the run folder's step-N/ (as best/ gets them: a model folder, a
       LoRA run's adapters), none at the last step (the run folder's own); save_limit > 0: the newest
       that many kept, older ones removed. A new run removes an earlier run's step-N/ folders. */
    int save_every, save_limit;
    /* full_eval: at the end of every pass over the training data and at the last step, the loss and
       token accuracy over every validation window once (metrics.jsonl's full_val_loss and
       full_val_token_acc; token data only) */
    int full_eval;
    nv_best_metric best_metric;
    const char *out_dir;
    const char *tokenizer_path; /* copied into the run folder when set */
    const char *chat_template;  /* the template chat data was rendered with: the run folder's chat_template
                                   file, which `nerve serve -m RUN_DIR` takes up; NULL: none */
    const char *chat_template_jinja; /* its Jinja text when the run ran one (chat_template "jinja"): the
                                        folder's chat_template.jinja */
    int resume;
    nv_engine_id engine;
    int quiet;                 /* no live progress line */
    double time_limit_s;       /* stop (checkpointed, clean) after this long; 0 = none */
    /* time_budget_s > 0: the run's length is what fits this long from its first step, evaluations
       included: steps is then only a provisional bound until, a few steps in (at least 5, and 5% of the
       budget), the measured rate decides it, and at 30% of the budget the rate since corrects it once;
       warmup_auto: adamw.warmup_steps is the default, cut to a tenth of the first decision. The
       decision is kept in the checkpoint (a resume goes on to it and plans no more). */
    double time_budget_s;
    int warmup_auto;
    /* every sample_every steps (and after the last), sample_tokens tokens the model writes after BOS
       and sample_prompt (NULL: none) with tokenizer, to stderr and the run folder's samples.txt; 0: none.
       Whole-model runs only. */
    int sample_every, sample_tokens;
    const char *sample_prompt;
    const nv_tokenizer *tokenizer;
    /* preference data (nv_dataset.pref): the loss (train/pref.h; default DPO); DPO and IPO compare
       with the starting model (init_params; with LoRA, the frozen model the adapters start at zero
       on), whose log-probabilities of every pair are computed once at the start (again on resume: the
       same bits). pref.sft_weight > 0 adds that times the preferred answer's mean cross-entropy a
       token to each pair's loss (RPO: it keeps the preferred answers likely, where DPO alone can
       lower both answers' likelihood) */
    nv_pref_opts pref;
    /* multiple-choice tasks (model/choice.h) scored at every evaluation with tokenizer, the first
       eval_choice_tasks of them (0: all): metrics' mc_acc and mc_acc_norm (llm.c's HellaSwag during
       training). Whole-model runs only. */
    const nv_choice_set *eval_choice;
    int eval_choice_tasks;
    int recompute; /* activation checkpointing (nv_tmodel_init_ex): the same bits, less memory, more time */
    /* knowledge distillation (nv_tmodel_set_teacher): a teacher model of the same vocabulary (its
       plans built, its context at least seq) whose logits for every training window (a packed window's
       documents each on its own, as the model sees them) the model learns towards with weight
       distill_alpha at temperature distill_temp; NULL: none. Not with preference data. */
    const nv_model *teacher;
    float distill_alpha, distill_temp;
    float router_aux_coef; /* a mixture of experts: the load-balancing loss's weight (nv_tmodel's) */
    float router_z_coef;   /* and the router z-loss's (0: none) */
} nv_train_opts;

void nv_train_defaults(nv_train_opts *o);
/* Updates skipped in a row (a gradient norm that is not finite) after which a run stops as diverged. */
#define NV_TRAIN_BUDGET_STEPS (1 << 30) /* steps before --time-budget decides: a bound never reached */
#define NV_TRAIN_DIVERGED_STEPS 5
#define NV_TRAIN_SAVE_EPOCH (-1) /* save_every: at each epoch's end */
/* Runs (or resumes) training. Returns NV_OK also when stopped by a signal after saving; a run
 * that diverged saves its checkpoint and model (the weights of the last good update) and returns
 * NV_ERANGE. */
nv_err nv_train_run(const nv_train_opts *o, const nv_dataset *train);
/* Data parallel (train/dist.h): nv_train_run runs on every process of the job. After it failed,
 * 1 when every process failed at the same point (settings, the run folder, memory, divergence), so
 * all can leave cleanly and process 0's message is the one to show; 0 when this process may have
 * failed alone, and must end the job (nv_dist_abort) rather than leave the others waiting. */
int nv_train_failed_together(void);
/* The steps of a run folder's step-N/ folders (save_every's), ascending: the newest cap of them into
 * steps, their number; 0 when it has none or cannot be read. */
int nv_train_snapshots(const char *run_dir, long *steps, int cap);
/* Removes a run folder's step-N/ folder (its files, then it). */
void nv_train_remove_snapshot(const char *run_dir, long step);
/* The chat template a run folder records (its chat_template file, the name on one line), into name
 * (cap bytes; a longer line is cut); 0 when the folder has none. dir "" is the current folder. */
int nv_train_chat_template(const char *dir, char *name, size_t cap);
/* The Jinja template a run folder's chat_template names as "jinja" (its chat_template.jinja; malloc'd),
 * NULL when it names another or none. */
char *nv_train_chat_template_jinja(const char *dir);
/* Set by the SIGINT/SIGTERM/SIGUSR1 handler that nv_train_run installs; exposed for tests. */
extern volatile int nv_train_stop_requested;

#endif
