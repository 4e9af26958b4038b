/* The scheduler: continuous batching over the paged KV cache, in a loop thread that owns the
 * model.
 *
 * Contract:
 * - Requests are submitted from any thread (nv_sched_submit) into a queue of at most max_queue
 *   entries, ordered by priority (a lower value first; nv_req_params.priority, 0 by default) and
 *   arrival within one; a full queue is refused (the HTTP layer answers 429 with Retry-After).
 *   Background requests (the Batch API's) queue behind every other one.
 * - Every iteration the loop (1) retires cancelled, timed-out and (when stopping) shut-down
 *   requests, (2) admits queued requests in queue order while fewer than max_batch run and
 *   the KV pool can *reserve* every block the request may ever need — ceil((prompt + max_tokens
 *   - 1) / block_size) — so memory is never over-committed (o.overcommit: only its prompt's, a
 *   decoding sequence then reserving its next blocks before each step, grow(), preempting the
 *   lowest-ranked where the pool is short); the head of the queue waits when it
 *   does not fit (no overtaking, so no starvation among equal priorities; a stream of higher
 *   priorities can hold lower ones back), unless preempting running sequences it outranks makes
 *   the room (unless o.no_preempt): those go back to the queue with their state, their blocks to the
 *   prefix cache, and when admitted again compute what the cache no longer holds of their
 *   positions (the same tokens as without the preemption), (3) runs one
 *   batched forward (model/batch.h) over every running sequence: one decode row each, plus
 *   prompt rows of sequences still in prefill, at most prefill_chunk prompt rows per step, given
 *   to them in admission order, (4) samples each sequence that finished its prompt or decoded,
 *   with its own sampler (greedy at temperature 0), (5) turns tokens into text and publishes it,
 *   (6) retires finished sequences, returning their blocks and unused reservation.
 * - Generation ends at token EOS (2) or BOS (1), a stop token (stop_ids) or a stop string ("stop";
 *   the stop string and what follows are not part of the text, unless include_stop keeps it), or after max_tokens tokens or at the end of the
 *   context ("length"). Published text is always valid UTF-8: an incomplete character at the
 *   end is held back until it completes (invalid bytes become U+FFFD), and so is a tail that
 *   could still grow into a stop string.
 * - Requests are reference counted: the submitter holds one reference, the scheduler another
 *   while the request is queued or running. nv_req_cancel() asks the loop to drop a request
 *   (its blocks return to the pool at the next iteration); nv_req_release() drops the caller's
 *   reference. All request state shared between threads is guarded by the scheduler's lock.
 * - Prefix cache (serve/prefix.h, serve/disk.h; off with prefix_cache = 0): admission first
 *   looks the prompt's full blocks up — at most (prompt - 1) / block_size of them, so at least
 *   one prompt token is always computed — in RAM (shared by reference: the request's table
 *   points at the cached blocks), then continues the chain from the SSD tier. The request
 *   reserves only the blocks it does not share, and counts reviving idle cached blocks against
 *   the pool, so memory is never over-committed. Disk blocks are read into the request's own
 *   blocks by the loop before the request's first step, with the lock released and at most
 *   RESTORE_BYTES per iteration (other sequences keep decoding); a block that fails its checks
 *   ends the hit there and is prefilled instead. After every step each sequence's newly full
 *   blocks (prompt or generated) are hashed by chain and indexed in RAM, and queued for the
 *   SSD writer (which pins them with a reference until nv_disk_reap hands them back). A
 *   finished sequence returns its blocks last-first, so a prefix's first blocks are the last
 *   evicted. The status reports the prompt tokens served from the cache (cached_tokens).
 * - Speculative decoding (spec_tokens > 0): a decoding sequence whose last n tokens occurred
 *   before in its prompt or answer (n from spec_ngram_max down to spec_ngram_min) feeds the
 *   tokens that followed that occurrence as drafts behind its decode row, and the step computes
 *   the logits of every one of those rows. Tokens are then sampled row by row with the
 *   sequence's own sampler, exactly as one row per step would (same logits, same generator, same
 *   penalties and grammar), and the next row is used only while the token sampled equals the
 *   draft it was fed: every draft the model agrees with is a step saved, and the text, the
 *   log-probabilities and the random draws are those of decoding without drafts. A draft is never
 *   longer than the tokens the request may still produce, so the reservation holds (overcommitted:
 *   grow reserves its blocks before the step); the keys and
 *   values the refused drafts wrote lie past the sequence's position and are written again.
 * - A request's prediction (OpenAI's Predicted Outputs; pred_tokens > 0): drafts taken from the
 *   predicted answer where the answer follows it, checked the same way, whatever spec_tokens is;
 *   its acceptance starts high (a prediction is mostly the answer). The status counts the
 *   prediction's drafts the answer took and those it refused.
 * - A draft model (nv_sched_opts.draft; llama.cpp's --model-draft): the drafts come from a smaller
 *   model of the same vocabulary instead of the lookup, checked the same way (so the same text).
 *   The draft keeps its own keys and values in pages of its own shape that share the pool's block
 *   ids and the sequences' block tables (one reservation covers both; the pool's budget is split
 *   between them by their block sizes). Each step it runs every row the model runs (prompt chunks,
 *   decode rows; not an embedding's), then for each drafting sequence its greedy tokens one row
 *   per pass, all sequences batched: k drafts cost k passes of the draft. Per sequence, dvalid
 *   counts the positions whose draft keys and values belong to its tokens; the draft catches up
 *   from there (refused drafts, blocks read from the SSD tier), at most prefill_chunk extra rows a
 *   step, and drafts only once caught up. A block enters the prefix cache only once its draft keys
 *   and values are whole too (blocks read from disk included), so a prefix hit in RAM is one for
 *   the draft as well. Positions past the draft's context get no drafts.
 * - LoRA adapters (nv_sched_opts.adapters, model/adapters.h): a request's `adapter` (0 the base
 *   model) is its sequence's in every step, so one step serves several adapters and the base
 *   together. Submission pins the adapter (by number and generation) for as long as the request
 *   exists, so an adapter removed at run time is freed only after its last request; one that is no
 *   longer live is refused (NV_SUBMIT_NO_ADAPTER). The prefix
 *   cache's chains of an adapter's request start at the adapter's identity instead of 0 (its first
 *   block's parent), so its blocks never match the base's or another adapter's, in RAM or on disk.
 * - Split pages (swa_cache window, or auto where the budget is short, on a model with windowed and
 *   whole-context layers): the pool holds the whole-context layers; the windowed layers live in
 *   wpool, where a sequence owns a ring of min(wring, its blocks) blocks, reserved at admission with the rest (the head of the queue also
 *   waits for those) and returned when it ends. Its block k of the windowed layers is ring block k
 *   mod the ring's length; wring covers the window behind a step's first row and the most rows a
 *   step gives a sequence, so no row ever reads a reused block. With the prefix cache (RAM only: no
 *   SSD tier), a finished sequence's ring is kept as a checkpoint, and a prompt reuses its cached
 *   prefix only as far as a checkpoint holds the window behind it (the window is copied into its
 *   own ring); once a prompt has run, the window behind it is also copied into spare blocks as a
 *   checkpoint (the same prompt again after a long answer); the least recently used checkpoint goes
 *   when a sequence needs its blocks.
 * - Shutdown: nv_sched_drain() stops admission and ends every queued request ("shutdown") but
 *   the preempted ones, which were running: they are admitted again and continue with the running
 *   ones. nv_sched_stop() ends them all and joins the loop. */
#ifndef NV_SERVE_SCHED_H
#define NV_SERVE_SCHED_H

#include <pthread.h>
#include <stdint.h>

#include "model/adapters.h"
#include "model/batch.h"
#include "model/grammar.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "base/buf.h"
#include "serve/disk.h"
#include "serve/kv.h"
#include "serve/metrics.h"
#include "serve/prefix.h"

#define NV_MAX_STOP 16
#define NV_MAX_STOP_BYTES 256 /* a stop string's length (OpenAI's API takes no longer) */

typedef struct nv_req nv_req;
typedef struct nv_swa_ckpt nv_swa_ckpt;

typedef enum { NV_SWA_AUTO = 0, NV_SWA_FULL, NV_SWA_WINDOW } nv_swa_cache;

/* One token's log-probability under the model (the log-softmax of its raw logits,
 * before temperature, penalties and bias) and its n_top most likely alternatives, best first. */
#define NV_MAX_TOP_LOGPROBS 20
typedef struct {
    int tok;
    int prev; /* the token before it (its text depends on it: no leading space after BOS) */
    int unscored; /* the prompt's first token: nothing precedes it, so no log-probability */
    float logprob;
    int rank; /* its place among the vocabulary's tokens by logit, 1 the most likely (vLLM's) */
    int n_top;
    int top_tok[NV_MAX_TOP_LOGPROBS];
    float top_lp[NV_MAX_TOP_LOGPROBS];
} nv_token_lp;

/* A growing list of them (the caller frees v). */
typedef struct {
    nv_token_lp *v;
    int n, cap;
    int oom;
} nv_lp_list;

#define NV_MAX_SCORE 2

typedef struct {
    const int *prompt; /* copied */
    int n_prompt;
    int max_tokens; /* 0: run the prompt only (for its log-probabilities), finish "length" */
    float temperature, top_p;
    int top_k;    /* vLLM's and llama.cpp's filters: 0 is off */
    float min_p;  /* 0 is off */
    uint64_t seed; /* the sampler's xorshift state, as llama2.c's -s (0 is mapped to a fixed non-zero state) */
    const char *stop[NV_MAX_STOP]; /* copied; empty strings are ignored */
    int n_stop;
    double timeout_s; /* <= 0: none */
    int vocab_size;   /* the model's (sizes the sampler) */
    float presence_penalty, frequency_penalty; /* OpenAI's, -2..2 (0: off) */
    float repetition_penalty;                  /* vLLM's, over the prompt and the answer (0 or 1: off) */
    int penalty_window, penalty_last_n;        /* penalty_window: the three penalties as llama.cpp's, over the last
                                                  penalty_last_n tokens (nv_sampler_set_penalty_window) */
    float dry_multiplier, dry_base;            /* DRY (nv_sampler_set_dry): multiplier 0 is off */
    int dry_allowed_length, dry_last_n;
    const unsigned char *dry_breaker;          /* [vocab] or NULL; copied */
    float typical_p, top_n_sigma;              /* llama.cpp's filters (nv_sampler_set_more): 0 is off */
    float xtc_probability, xtc_threshold;
    float dynatemp_range, dynatemp_exponent;   /* llama.cpp's dynamic temperature (range 0: off) */
    int mirostat;                              /* 0 (off), 1 or 2 (nv_sampler_set_mirostat) */
    float mirostat_tau, mirostat_eta;
    int ignore_eos;                            /* vLLM's: end-of-generation tokens do not end the answer */
    int min_tokens;                            /* vLLM's: none of them is sampled before this many tokens */
    const int *stop_ids;                       /* vLLM's stop_token_ids: these end the answer as end tokens do (copied) */
    int n_stop_ids;
    int include_stop;                          /* vLLM's include_stop_str_in_output: the stop string (or token) that ended it stays */
    int n_own_stop;                            /* with it: stop[0..n_own_stop) are the request's own (the server's after them are not kept) */
    int keep_special;                          /* vLLM's skip_special_tokens false: control tokens' texts are written */
    int priority;                              /* vLLM's: a lower value is admitted first (equal ones in arrival order) */
    const int *allowed;                        /* vLLM's allowed_token_ids: only these are sampled (n_allowed 0: any); copied */
    int n_allowed;
    /* vLLM's bad_words as token sequences (bad_len[k] tokens each, one after another in bad_tok): a
       sequence's last token is not sampled where the answer's tokens so far end with the rest of it
       (a sequence of one: never); copied */
    const int *bad_tok, *bad_len;
    int n_bad;
    const int *bias_tok;                       /* logit_bias: n_bias (token, bias) pairs, copied */
    const float *bias;
    int n_bias;
    int logprobs;     /* 1: report each token's log-probability */
    int top_logprobs; /* with it, the most likely alternatives per token (0..NV_MAX_TOP_LOGPROBS) */
    int prompt_logprobs; /* the prompt's tokens' records too, published before the first generated
                            token's (such a request computes its prompt in full: no prefix-cache
                            hits), with the more of top_logprobs (with logprobs) and prompt_top
                            alternatives */
    int prompt_top;
    nv_grammar *grammar; /* structured output: only sentences of this grammar are generated (the
                            request holds its own reference); the answer ends when one is whole */
    /* A lazy grammar (llama.cpp's): the answer is free until the trigger text appears (with
     * lazy_at_start: until its first non-blank byte, which must be the trigger), then the text
     * from the trigger on must be a sentence of lazy_grammar; when it is whole, the answer is
     * free again (tool calls under tool_choice "auto"). */
    nv_grammar *lazy_grammar;
    const char *lazy_trigger;
    int lazy_at_start;
    int lazy_ends; /* the answer ends when the lazy grammar's sentence is whole (one call only) */
    int lazy_think; /* the trigger is not looked for inside a leading think block (think_tags') */
    nv_adapter_mix lora; /* the LoRA adapters the request runs with (numbers in nv_sched_opts.adapters, each with
                            its generation when the request looked it up, and factor; n 0: none) */
    /* a predicted answer (OpenAI's Predicted Outputs; copied): its tokens are checked as drafts where
       the answer follows it (nv_sched_opts.pred_tokens), which changes nothing in the answer */
    const int *prediction;
    int n_prediction;
    int embed; /* with max_tokens 0: the prompt's embedding (its tokens' final norm outputs pooled as
                  nv_sched_opts.pooling says, unit length) is kept for nv_req_embedding; computed in full (no
                  prefix-cache hits, whose rows are not run) */
    /* with max_tokens 0: the logits of these tokens at the prompt's last position are kept for
       nv_req_scores (a reranker's "yes" and "no"); a model with a classification head
       (nv_model.cls_head) keeps its first n_score outputs there instead; 0 of them: none */
    int score_tok[NV_MAX_SCORE];
    int n_score;
    /* the prompt opened a think block (nv_think_opened): the answer starts inside it (a grammar that
       allows a leading block, and a lazy grammar's look-out, start there too) */
    int think_open;
    int think_tags; /* the tags of its think block (nv_think_tags_of: NV_THINK_ANGLE, or 0, NV_THINK_BRACKET) */
    /* a reasoning budget (llama.cpp's --reasoning-budget, vLLM's thinking_token_budget): once the
       answer has spent think_budget tokens inside its think block without closing it, and its last
       UTF-8 character is whole, the think_close tokens are forced (copied); < 0: no budget */
    int think_budget;
    const int *think_close;
    int n_think_close;
} nv_req_params;

typedef struct {
    int done;
    nv_finish finish;
    int prompt_tokens, completion_tokens;
    int prompt_records; /* the prompt's log-probability records went out, the first of the list (prompt_logprobs) */
    int cached_tokens; /* prompt tokens whose KV came from the prefix cache */
    int stop_index;    /* once done: the stop string that ended the answer (its index in
                          nv_req_params.stop), else -1 (an end token, a limit, a failure) */
    int stop_token;    /* once done: the token that ended it, one of stop_token_ids or an end token
                          other than the vocabulary's EOS (and llama2.c's BOS), which vLLM reports as
                          none; else -1 */
    char stop_text[NV_MAX_STOP_BYTES + 1]; /* once done: that stop string's text where it is one of the
                                              request's own (nv_req_params.n_own_stop), else "" */
    double prompt_s;   /* seconds from submission to the first token (queueing and prompt; 0 before it) */
    double gen_s;      /* seconds from the first token to the latest published one */
    /* a prediction's drafts so far: taken by the answer, checked and refused */
    int accepted_prediction_tokens, rejected_prediction_tokens;
} nv_req_status;

typedef struct {
    int max_batch;     /* sequences per step */
    int prefill_chunk; /* prompt rows per step */
    int max_queue;     /* queued requests before 429 */
    int block_size;    /* positions per KV block */
    uint64_t kv_bytes; /* KV pool budget */
    nv_kv_dtype kv_dtype; /* the pool's element type (0: fp16) */
    /* a model with sliding-window layers beside whole-context ones: NV_SWA_WINDOW keeps only the
     * window of the windowed layers (split pages: a ring of blocks per sequence in pages of their own;
     * the pool holds the other layers' keys and values; the prefix cache as far as checkpoints reach,
     * no SSD tier); NV_SWA_FULL keeps every position of every layer; NV_SWA_AUTO (0) is window when
     * the budget cannot hold the model's whole context with every layer, full otherwise */
    nv_swa_cache swa_cache;
    int step_delay_ms; /* testing hook: sleep after each step (0 = off) */
    /* the prefix cache */
    int prefix_cache;          /* 0: off (no sharing, no tiers) */
    uint64_t ram_cache_bytes;  /* idle cached blocks kept in the pool (capped by the pool) */
    const char *disk_dir;      /* the SSD tier's directory; NULL: no SSD tier */
    uint64_t disk_bytes;       /* the SSD tier's cap (0: no SSD tier) */
    /* speculative decoding by prompt lookup (0: off): each decoding sequence proposes up to
     * spec_tokens tokens that followed the latest earlier occurrence of its last n tokens
     * (spec_ngram_max >= n >= spec_ngram_min, the longest that occurs), checked in one step */
    int spec_tokens;
    int spec_ngram_min, spec_ngram_max;
    /* a request's prediction: up to pred_tokens of its tokens checked a step (0: predictions are not
     * drafted from); where the answer has left it, the answer's last n tokens find its place again
     * (n as above), else the lookup drafts as it would (with spec_tokens or not; never a draft model);
     * the drafts past spec_tokens go to at most 16 sequences a step (draft_cap) */
    int pred_tokens;
    /* a draft model (NULL: none): with spec_tokens > 0 the drafts are its greedy tokens instead of
     * the lookup's; its vocabulary must be the model's; its plans built; must outlive the scheduler */
    const nv_model *draft;
    float draft_p_min; /* a sequence's drafts stop at the first the draft gives less probability (0: never) */
    /* LoRA adapters a request may name (NULL: none); kept unmerged, so one step serves sequences
     * of several adapters and of the base model; must outlive the scheduler */
    nv_adapters *adapters;
    /* 1: no request is admitted by preempting others (overcommit's growth still preempts). Otherwise
     * a request at the head of the queue that finds no slot or no room preempts running sequences it
     * outranks (an interactive request a background one, a lower priority value a higher one), the
     * lowest-ranked first, when that makes the room (not sequences whose prompt rows are read:
     * embeddings, scores, prompt log-probabilities until whole) */
    int no_preempt;
    /* 1: a request is admitted when the blocks of its prompt (and its first answer position) fit, not
     * every block its max_tokens may take; a decoding sequence reserves its next blocks as it reaches
     * them, and where the pool is short the lowest-ranked running sequences are preempted (the one
     * growing, when it is the lowest). More requests run at once when answers end before their
     * max_tokens (vLLM's way) */
    int overcommit;
    /* how an embedding pools its prompt's rows through the final norm (nv_pooling; DEFAULT: the mean) */
    int pooling;
} nv_sched_opts;


typedef struct {
    const nv_model *model;
    const nv_tokenizer *tok;
    nv_gtrie *trie; /* the vocabulary's texts for grammar masks, built by the first request with a grammar */
    int *eog_ids;   /* the vocabulary's end-of-generation tokens (min_tokens holds them off) */
    int n_eog;
    nv_metrics *metrics;
    nv_sched_opts o;
    nv_kv_pool pool;
    /* split pages (o.swa_cache, on a model with both kinds of layers): the windowed layers'
     * pool, and the blocks of one sequence's ring; wring 0 when the pages are not split */
    nv_kv_pool wpool;
    int wring;
    /* and with the prefix cache, finished sequences' rings kept as checkpoints (sched.c) */
    struct nv_swa_ckpt *ckpts;
    int n_ckpts, cap_ckpts, ckpt_blocks;
    uint64_t ckpt_clock;
    nv_batch_state bs;
    pthread_t thread;
    int started, inited;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    nv_req *wait_head, *wait_tail;
    int n_waiting;
    nv_req **running;
    int n_running;
    unsigned long long submitted; /* requests taken so far (under the lock) */
    int stopping; /* 0 serving, 1 draining, 2 stopping */
    /* the loop's scratch for one step */
    nv_batch_seq *seqs;
    nv_req **step_req;
    nv_req **victims; /* admission's scratch: the running sequences a request may preempt */
    uint16_t *held;   /* admission's scratch: per pool block, how many of the victims picked hold it (0 between uses) */
    /* the prefix cache */
    int prefix_on;
    nv_prefix prefix;
    nv_disk *disk; /* NULL: no SSD tier */
    /* split pages: the windowed layers' part of the SSD tier (disk holds the whole-context layers'),
     * and the copies its writer reads (a ring block is written again before the writer gets to it):
     * a slot per outstanding write, each a block's bytes then its tokens */
    nv_disk *wdisk;
    uint8_t *wstage;
    int *wstage_free, n_wstage_free;
    size_t wstage_bytes;
    uint64_t wstage_drops; /* windowed blocks not written: every slot was taken (counted as write drops) */
    void *restore; /* the loop's scratch for disk reads */
    int restore_cap;
    float *plp_logits; /* the loop's scratch for prompt log-probabilities (made at first use) */
    float *embed_tmp;  /* the loop's scratch for embeddings: one row through the final norm */
    /* the draft model (o.draft): its pages (the pool's block ids), its step state and rows */
    nv_kv_pages dpages;
    nv_batch_state dbs;
    nv_batch_seq *dseqs;
    nv_req **dreq;
    int dlimit;    /* positions the draft can hold: the smaller of the two contexts */
    int draft_cap; /* draft rows a step may take in all (sizes the batch state beside max_batch and a chunk) */
    int draft_off; /* a draft pass failed: drafting stopped for good (logged once) */
} nv_sched;

typedef enum { NV_SUBMIT_OK = 0, NV_SUBMIT_QUEUE_FULL, NV_SUBMIT_STOPPING, NV_SUBMIT_TOO_BIG, NV_SUBMIT_NO_ADAPTER } nv_submit;

nv_err nv_sched_init(nv_sched *s, const nv_model *model, const nv_tokenizer *tok, nv_metrics *metrics,
                     const nv_sched_opts *o);
nv_err nv_sched_start(nv_sched *s);
void nv_sched_drain(nv_sched *s);
/* Queued plus running requests. */
int nv_sched_busy(nv_sched *s);
void nv_sched_stop(nv_sched *s);
void nv_sched_free(nv_sched *s);
void nv_sched_gauges(nv_sched *s, nv_metrics_gauges *g);
/* A running sequence as llama-server's GET /slots shows a slot: what it was asked, how far it is. */
typedef struct {
    unsigned long long task; /* its submission's number, from 1 */
    int n_prompt, n_cached, n_decoded, max_tokens;
    int generating; /* its prompt has run (its first token is out) */
    float temperature, top_p, min_p;
    int top_k;
    uint64_t seed;
} nv_slot;
/* The running sequences (at most cap, in admission order) into out; returns how many. */
int nv_sched_slots(nv_sched *s, nv_slot *out, int cap);
/* Positions the whole pool can hold (the largest prompt + max_tokens one request can reserve). */
long nv_sched_capacity(const nv_sched *s);

/* A new request holding one reference (the caller's). */
nv_err nv_req_create(nv_req **out, const nv_req_params *p);
/* background: the request waits behind every other one waiting (the server's own Batch API), and
 * a full queue of them does not refuse the others: max_queue counts the others alone for those. */
nv_submit nv_sched_submit(nv_sched *s, nv_req *r, int background);
/* Waits up to wait_s seconds for new text or the end; appends new text to out and, when lps is
 * given, the log-probabilities of the tokens that text came from (with prompt_logprobs, first
 * one record per prompt token, once the prompt has run). */
void nv_req_poll(nv_sched *s, nv_req *r, double wait_s, nv_buf *out, nv_lp_list *lps, nv_req_status *st);
void nv_req_cancel(nv_sched *s, nv_req *r);
/* An embed request's embedding (dim floats) once it is done and finished "length"; 0 otherwise. */
int nv_req_embedding(nv_sched *s, nv_req *r, float *out, int dim);
/* A scoring request's logits (nv_req_params.score_tok, n_score of them) once it is done and
 * finished "length"; 0 otherwise. */
int nv_req_scores(nv_sched *s, nv_req *r, float *out);
/* Drops the caller's reference (frees the request when it was the last). For a request never
 * submitted, s may be NULL. */
void nv_req_release(nv_sched *s, nv_req *r);

/* Text helpers, exposed for tests: the length of the longest suffix of text[0..n) that is a
 * proper prefix of one of the stop strings; the length of an incomplete UTF-8 character at
 * the end of text (0 when it ends on a boundary); and a copy of text with every invalid UTF-8
 * sequence replaced by U+FFFD appended to out. */
size_t nv_stop_holdback(const char *text, size_t n, const char *const *stop, int n_stop);
size_t nv_utf8_incomplete_tail(const char *text, size_t n);
void nv_utf8_sanitize(nv_buf *out, const char *text, size_t n);

#endif
