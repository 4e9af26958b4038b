#include "serve/sched.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/pool.h"
#include "base/timer.h"
#include "model/sampler.h"

struct nv_req {
    /* immutable after creation */
    int *prompt;
    int n_prompt, max_tokens;
    int ignore_eos, min_tokens; /* nv_req_params' */
    int embed; /* the prompt's embedding is kept (nv_req_params.embed) */
    int score_tok[NV_MAX_SCORE]; /* nv_req_params' */
    int n_score;
    nv_adapter_mix lora; /* nv_req_params' */
    nv_slot slot; /* its parameters for GET /slots (task: set at submission) */
    int background; /* nv_sched_submit's: it waits behind the others */
    nv_adapters *pinned; /* the set its adapters are pinned in while it exists (NULL: none) */
    uint64_t root; /* the prefix cache's parent of its first block: 0, or its adapters' identity */
    char *stop[NV_MAX_STOP];
    int stop_src[NV_MAX_STOP]; /* each one's index in nv_req_params.stop */
    int n_stop;
    double t_arrival, deadline;
    int blocks_needed;
    /* guarded by the scheduler's lock */
    int refs;
    int cancel;
    int done;
    nv_finish finish;
    int n_gen_pub;
    double t_first_pub, t_last_pub; /* t_first and t_last as published with n_gen_pub */
    nv_buf out;
    int lp_pub, lp_sent; /* log-prob records published / handed to nv_req_poll */
    pthread_cond_t cv;
    nv_req *next; /* queue link */
    /* the loop thread's own */
    nv_sampler sampler;
    nv_gsampler gs; /* structured output: where the answer is in its grammar (gs.m NULL: none) */
    nv_glazy lazy;  /* a lazy grammar (lazy.g NULL: none; gs is its matcher while it is on) */
    unsigned long g_draws, g_masks; /* constrained decoding's cost so far, for the metrics */
    int stop_hit; /* the stop string that ended the answer (its index in nv_req_params.stop), or -1 */
    int stop_tok; /* the token that ended it where vLLM reports it (nv_req_status.stop_token), or -1 */
    double g_mask_s;
    int lazy_ends;  /* its whole sentence ends the answer */
    /* a reasoning budget (think_budget >= 0): the answer's think block followed, the tokens spent in
       it, the UTF-8 bytes its text still owes a character, and where in think_close the forcing is
       (-1: not forcing) */
    nv_think thk;
    int think_budget, think_n, think_u8, *think_close, n_think_close, force_at;
    int *stop_ids, n_stop_ids; /* stop_token_ids */
    int include_stop, n_own_stop, keep_special, priority; /* nv_req_params' */
    unsigned char *allowed; /* allowed_token_ids as a mask [vocab] (NULL: any token) */
    /* bad_words: the sequences (nv_req_params'), and the answer's tokens so far (bad_hist, n_gen of them
       and this step's) which their ends are matched against */
    int *bad_tok, *bad_len, n_bad, *bad_hist, n_hist;
    int *blocks;
    int n_alloc, reserved;
    /* split pages (the scheduler's wring > 0): the windowed layers' table, [blocks_needed]. Its first
     * n_wring entries are the sequence's own ring of blocks in wpool; entry k past them repeats entry
     * k mod n_wring, which holds only positions the window has left behind */
    int *wblocks;
    int n_wring, wreserved;
    int pos;  /* positions whose keys and values are written */
    /* after a preemption while it decoded: the tokens of its positions [0, n_replay) (the prompt and
       the answer but the token its next decode row feeds), computed again before it goes on (NULL:
       none) */
    int *replay;
    int n_replay;
    int preempted; /* times it went back to the queue from running */
    int stalled;   /* an overcommitted pool had no room for its next blocks this step: it sits the step out */
    int last; /* the token the next decode row feeds (and decode()'s previous token) */
    int outs[NV_MAX_SPEC + 1]; /* the tokens this step sampled, in order */
    int n_outs;
    int outs_fail; /* after outs, the grammar found no token: the request fails once they are published */
    /* speculative decoding (the scheduler's spec_tokens > 0) */
    int *ctx; /* the prompt, then every generated token: where drafts are looked up */
    int n_ctx, cap_ctx;
    int spec_rows[NV_MAX_SPEC + 1]; /* a drafting decode row's tokens: last, then the drafts */
    int spec_k;                     /* this step: the most drafts its blocks were taken for (0: none) */
    nv_spec_record spec;            /* its drafts' acceptance so far */
    int dvalid; /* a draft model: positions [0, dvalid) of its pages hold the draft's keys and values of ctx */
    int dnext;  /* this step: dvalid once the draft's rows of ctx have run */
    int dk;     /* this step: the draft model's tokens fed behind the decode row (0: none) */
    /* a prediction (pred.n > 0): where the answer is in it, whether this step's drafts came from it,
       and its drafts taken and refused so far (published with n_gen) */
    int *pred_ids;
    nv_pred pred;
    int pred_step;
    int pred_acc, pred_rej, pred_acc_pub, pred_rej_pub;
    int n_gen;
    nv_finish fin;
    nv_buf pending; /* text not yet safe to publish */
    nv_buf emit;    /* text to publish after this step */
    double t_first, t_last; /* when the first and the latest token came */
    /* log-probabilities (lp_k >= 0): one record per generated token, with the byte range its text
     * took in the pending stream, so a record is published with the text it produced */
    int lp_k;
    float *lp_raw;     /* [vocab] a row's raw logits (sampling overwrites the row) */
    nv_token_lp lp_steps[NV_MAX_SPEC + 1]; /* the records of outs, filled by the sample task */
    nv_token_lp *lps;
    struct lp_span {
        size_t start, end; /* the bytes of pending text record i produced, counted from the first */
    } *lp_span;
    int n_lps, cap_lps, lp_flushed;
    size_t pend_total, pend_done; /* bytes appended to / taken out of pending, all told */
    /* prompt log-probabilities (prompt_logprobs): record i for prompt token i, filled as the
     * prompt runs (loop thread), published whole when it has (plp_ready, under the lock) */
    nv_token_lp *plps;
    int plp_k; /* their alternatives per token */
    int plp_ready, plp_sent;
    /* an embedding (embed): the sum over the prompt's rows of the final norm's output (loop thread) */
    double *embed_sum; /* [dim] */
    int embed_rows;
    float scores[NV_MAX_SCORE]; /* a scoring request's logits (loop thread), kept once its last row has run */
    int scored;
    /* the prefix cache (the loop thread's own; n_cached is also read under the lock) */
    uint64_t *hashes;              /* [blocks_needed] chain hashes of the full blocks */
    int n_lookup;                  /* prompt blocks a lookup may reuse (hashed at the first lookup), -1 before */
    int n_hashed;                  /* blocks 0..n_hashed-1 are hashed (and indexed when they could be) */
    int restore_next, restore_end; /* blocks [restore_next, restore_end) wait to be read from disk */
    int n_cached;                  /* prompt tokens served from the cache */
    int snapped;                   /* split pages: the window at its prompt's end was offered as a checkpoint */
    int snap_at;                   /* split pages: the block edge inside its prompt where an earlier prompt's
                                      cached prefix ends, which no checkpoint reached: its window is kept
                                      there too (0: none) */
    int disk_from;                 /* the first block asked of the SSD tier */
    /* split pages, a prefix read from the SSD tier: the windowed layers' blocks [wrestore_next,
       wrestore_end) wait to be read into its ring; restore_shared of its first blocks are shared from
       RAM, and its reservation holds blocks for them too, so that a block failing its checks leaves it
       to prefill the whole prompt on blocks of its own (restore_fallback) */
    int wrestore_next, wrestore_end;
    int restore_shared, restore_split;
    int wvalid_from; /* split pages: its ring holds the windowed layers' keys and values of the blocks
                        from this one on that it has reached (those before were never copied in) */
};

/* A finished sequence's ring of windowed-layer blocks, kept (see ckpt_keep). */
struct nv_swa_ckpt {
    int32_t *ring;     /* the sequence's ring blocks (the checkpoint's references) */
    int n_ring, ring_len; /* blocks held; the ring's length (block k lived in ring[k % ring_len]) */
    int lo, end;       /* blocks [lo, end) of its windowed layers are intact and full */
    uint64_t *hashes;  /* [end - lo] their chain hashes */
    uint64_t used;     /* when it was made or last reused */
};

/* Disk bytes read per loop iteration at most (at least one block), so a long restore does not
 * stall the other sequences' decoding. */
#define RESTORE_BYTES (64u << 20)

typedef struct {
    nv_req *r;
    int k;
    int ok;
    int win;   /* a windowed-layer block (split pages), into the ring */
    int split; /* the request's prefix is split pages' (restore_split when listed) */
} restore_item;

/* ---- text helpers ---------------------------------------------------------------------- */

size_t nv_stop_holdback(const char *text, size_t n, const char *const *stop, int n_stop) {
    size_t best = 0;
    for (int i = 0; i < n_stop; i++) {
        size_t L = strlen(stop[i]);
        for (size_t k = (L - 1 < n ? L - 1 : n); k > best; k--)
            if (L > 0 && memcmp(text + n - k, stop[i], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

static int utf8_need(unsigned char c) {
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0; /* continuation byte or never valid */
}

size_t nv_utf8_incomplete_tail(const char *text, size_t n) {
    const unsigned char *b = (const unsigned char *)text;
    for (size_t k = 1; k <= 4 && k <= n; k++) {
        unsigned char c = b[n - k];
        if ((c & 0xC0) == 0x80) continue; /* continuation: keep looking for the lead byte */
        int need = utf8_need(c);
        return need > (int)k ? k : 0;
    }
    return 0;
}

void nv_utf8_sanitize(nv_buf *out, const char *text, size_t n) {
    const unsigned char *b = (const unsigned char *)text;
    size_t i = 0, run = 0; /* run: start of the current stretch of valid bytes */
    while (i < n) {
        unsigned char c = b[i];
        int need = utf8_need(c), ok = need > 0 && i + (size_t)need <= n;
        for (int j = 1; ok && j < need; j++) {
            unsigned char d = b[i + (size_t)j];
            unsigned lo = 0x80, hi = 0xBF;
            if (j == 1) {
                if (c == 0xE0) lo = 0xA0;      /* overlong */
                else if (c == 0xED) hi = 0x9F; /* surrogates */
                else if (c == 0xF0) lo = 0x90; /* overlong */
                else if (c == 0xF4) hi = 0x8F; /* above U+10FFFF */
            }
            if (d < lo || d > hi) ok = 0;
        }
        if (ok) {
            i += (size_t)need;
            continue;
        }
        nv_buf_append(out, b + run, i - run);
        nv_buf_puts(out, "\xEF\xBF\xBD");
        i++;
        run = i;
    }
    nv_buf_append(out, b + run, n - run);
}

/* ---- requests ---------------------------------------------------------------------------- */

static void cond_init_mono(pthread_cond_t *cv) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

static void cond_wait_s(pthread_cond_t *cv, pthread_mutex_t *mu, double s) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long long ns = (long long)ts.tv_nsec + (long long)(s * 1e9);
    ts.tv_sec += (time_t)(ns / 1000000000LL);
    ts.tv_nsec = (long)(ns % 1000000000LL);
    pthread_cond_timedwait(cv, mu, &ts);
}

static void req_free(nv_req *r) {
    if (r->pinned) nv_adapters_unpin_mix(r->pinned, &r->lora); /* a removed adapter goes with its last request */
    free(r->prompt);
    free(r->replay);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->blocks);
    free(r->wblocks);
    free(r->hashes);
    free(r->lp_raw);
    free(r->lps);
    free(r->lp_span);
    free(r->plps);
    free(r->embed_sum);
    free(r->ctx);
    free(r->pred_ids);
    free(r->think_close);
    nv_think_free(&r->thk);
    free(r->allowed);
    free(r->stop_ids);
    free(r->bad_tok);
    free(r->bad_len);
    free(r->bad_hist);
    nv_gsampler_free(&r->gs);
    nv_glazy_free(&r->lazy);
    nv_sampler_free(&r->sampler);
    nv_buf_free(&r->out);
    nv_buf_free(&r->pending);
    nv_buf_free(&r->emit);
    pthread_cond_destroy(&r->cv);
    free(r);
}

/* n token ids, each in the vocabulary (else NV_EINVAL naming what), into a copy of their own. */
static nv_err copy_ids(const int *ids, int n, int vocab, const char *what, int **out) {
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab) return nv_fail(NV_EINVAL, "request: %s %d is outside the vocabulary", what, ids[i]);
    if (!(*out = malloc((size_t)(n > 0 ? n : 1) * sizeof **out))) return nv_fail(NV_ENOMEM, "request: out of memory");
    if (n > 0) memcpy(*out, ids, (size_t)n * sizeof **out);
    return NV_OK;
}

/* The rules a request's answer follows besides its sampler and grammars (nv_req_params'): its
 * reasoning budget (grammar_thinks: its grammar, if any, took the block the prompt opened), stop
 * tokens, what its text keeps, its priority, allowed tokens and bad words; the lists copied. */
static nv_err take_answer_rules(nv_req *r, const nv_req_params *p, int grammar_thinks) {
    nv_err e = NV_OK;
    const int V = p->vocab_size;
    r->think_budget = p->think_budget >= 0 && p->n_think_close > 0 ? p->think_budget : -1;
    r->thk.state = p->think_open ? (grammar_thinks ? NV_THINK_IN : NV_THINK_PAST) : NV_THINK_UNDECIDED;
    r->thk.tags = p->think_tags;
    r->force_at = -1;
    if (r->think_budget >= 0 && (e = copy_ids(p->think_close, p->n_think_close, V, "the think block's closing token", &r->think_close)) == NV_OK)
        r->n_think_close = p->n_think_close;
    r->include_stop = p->include_stop, r->n_own_stop = p->n_own_stop, r->keep_special = p->keep_special, r->priority = p->priority;
    if (e == NV_OK && p->n_stop_ids > 0 && (e = copy_ids(p->stop_ids, p->n_stop_ids, V, "the stop token", &r->stop_ids)) == NV_OK)
        r->n_stop_ids = p->n_stop_ids;
    if (e == NV_OK && p->n_allowed > 0) { /* a mask: each row then costs one pass over the vocabulary */
        if (!(r->allowed = calloc((size_t)p->vocab_size, 1))) e = nv_fail(NV_ENOMEM, "request: out of memory");
        for (int i = 0; e == NV_OK && i < p->n_allowed; i++)
            if (p->allowed[i] < 0 || p->allowed[i] >= p->vocab_size) e = nv_fail(NV_EINVAL, "request: the allowed token %d is outside the vocabulary", p->allowed[i]);
            else r->allowed[p->allowed[i]] = 1;
    }
    if (e == NV_OK && p->n_bad > 0) {
        size_t total = 0;
        for (int k = 0; e == NV_OK && k < p->n_bad; k++)
            if (p->bad_len[k] < 1) e = nv_fail(NV_EINVAL, "request: a bad word of no tokens");
            else total += (size_t)p->bad_len[k];
        if (e == NV_OK) e = copy_ids(p->bad_tok, (int)total, V, "a bad word's token", &r->bad_tok);
        if (e == NV_OK) e = copy_ids(p->bad_len, p->n_bad, INT_MAX, "a bad word's length", &r->bad_len);
        /* the answer's tokens: one step samples at most what max_tokens leaves, drafts included */
        if (e == NV_OK && !(r->bad_hist = malloc(((size_t)p->max_tokens + NV_MAX_SPEC + 1) * sizeof(int))))
            e = nv_fail(NV_ENOMEM, "request: out of memory");
        if (e == NV_OK) r->n_bad = p->n_bad;
    }
    return e;
}

nv_err nv_req_create(nv_req **out, const nv_req_params *p) {
    *out = NULL;
    if (p->n_prompt < 1 || p->max_tokens < 0 || p->n_stop < 0 || p->n_stop > NV_MAX_STOP || p->n_prediction < 0 ||
        (p->n_prediction > 0 && !p->prediction))
        return nv_fail(NV_EINVAL, "request: empty prompt or a negative number of tokens");
    if (nv_adapter_mix_check(&p->lora) != NV_OK) return nv_fail(NV_EINVAL, "request: %s", nv_errmsg());
    nv_req *r = calloc(1, sizeof *r);
    if (!r) return nv_fail(NV_ENOMEM, "request: out of memory");
    cond_init_mono(&r->cv);
    r->refs = 1;
    r->stop_hit = r->stop_tok = -1;
    r->prompt = malloc((size_t)p->n_prompt * sizeof(int));
    if (!r->prompt) goto oom;
    memcpy(r->prompt, p->prompt, (size_t)p->n_prompt * sizeof(int));
    r->n_prompt = p->n_prompt;
    r->max_tokens = p->max_tokens;
    r->ignore_eos = p->ignore_eos;
    r->min_tokens = p->min_tokens;
    r->lora = p->lora;
    if (p->n_prediction > 0) {
        const nv_err pe = copy_ids(p->prediction, p->n_prediction, p->vocab_size, "the prediction's token", &r->pred_ids);
        if (pe != NV_OK) {
            req_free(r);
            return pe;
        }
        r->pred = (nv_pred){r->pred_ids, p->n_prediction, 0, 0};
        r->spec = (nv_spec_record){8, 0}; /* a prediction is mostly the answer: long drafts from the start */
    }
    for (int i = 0; i < p->n_stop; i++) {
        if (!p->stop[i] || !*p->stop[i]) continue;
        if (!(r->stop[r->n_stop] = strdup(p->stop[i]))) goto oom;
        r->stop_src[r->n_stop++] = i;
    }
    /* llama2.c's xorshift stays at 0 forever from state 0 */
    uint64_t seed = p->seed ? p->seed : 0x2545F4914F6CDD1Dull;
    r->slot = (nv_slot){.n_prompt = p->n_prompt, .max_tokens = p->max_tokens, .temperature = p->temperature, .top_p = p->top_p,
                        .min_p = p->min_p, .top_k = p->top_k, .seed = p->seed};
    nv_err e = nv_sampler_init(&r->sampler, p->vocab_size, p->temperature, p->top_p, seed);
    if (e == NV_OK) e = nv_sampler_set_bias(&r->sampler, p->bias_tok, p->bias, p->n_bias);
    if (e == NV_OK) e = nv_sampler_set_penalties(&r->sampler, p->presence_penalty, p->frequency_penalty);
    if (e == NV_OK) e = nv_sampler_set_filters(&r->sampler, p->top_k, p->min_p);
    if (e == NV_OK && p->repetition_penalty > 0)
        e = nv_sampler_set_repetition(&r->sampler, p->repetition_penalty, r->prompt, r->n_prompt);
    if (e == NV_OK && p->penalty_window)
        e = nv_sampler_set_penalty_window(&r->sampler, p->penalty_last_n, r->prompt, r->n_prompt);
    if (e == NV_OK && ((p->typical_p > 0 && p->typical_p < 1) || p->top_n_sigma > 0 || p->xtc_probability > 0))
        e = nv_sampler_set_more(&r->sampler, p->typical_p > 0 ? p->typical_p : 1.0f, p->top_n_sigma, p->xtc_probability,
                                p->xtc_threshold);
    if (e == NV_OK && p->dynatemp_range > 0) e = nv_sampler_set_dynatemp(&r->sampler, p->dynatemp_range, p->dynatemp_exponent);
    if (e == NV_OK && p->mirostat) e = nv_sampler_set_mirostat(&r->sampler, p->mirostat, p->mirostat_tau, p->mirostat_eta);
    if (e == NV_OK && p->dry_multiplier > 0)
        e = nv_sampler_set_dry(&r->sampler, p->dry_multiplier, p->dry_base, p->dry_allowed_length, p->dry_last_n,
                               p->dry_breaker, r->prompt, r->n_prompt);
    r->lp_k = !p->logprobs ? -1 : p->top_logprobs < 0 ? 0 : p->top_logprobs > NV_MAX_TOP_LOGPROBS ? NV_MAX_TOP_LOGPROBS : p->top_logprobs;
    if (e == NV_OK && r->lp_k >= 0 && !(r->lp_raw = malloc((size_t)p->vocab_size * sizeof(float))))
        e = nv_fail(NV_ENOMEM, "request: out of memory");
    r->plp_k = r->lp_k > p->prompt_top ? r->lp_k : p->prompt_top;
    if (r->plp_k > NV_MAX_TOP_LOGPROBS) r->plp_k = NV_MAX_TOP_LOGPROBS;
    if (e == NV_OK && p->prompt_logprobs) {
        if (!(r->plps = calloc((size_t)p->n_prompt, sizeof *r->plps))) e = nv_fail(NV_ENOMEM, "request: out of memory");
        else r->plps[0] = (nv_token_lp){.tok = r->prompt[0], .prev = NV_TOKEN_BOS, .unscored = 1};
    }
    if (e == NV_OK && p->embed && p->max_tokens != 0) e = nv_fail(NV_EINVAL, "request: an embedding runs the prompt only");
    r->embed = p->embed;
    if (e == NV_OK && (p->n_score < 0 || p->n_score > NV_MAX_SCORE || (p->n_score && (p->max_tokens != 0 || p->embed))))
        e = nv_fail(NV_EINVAL, "request: scoring runs the prompt only, for 1 to %d tokens", NV_MAX_SCORE);
    for (int i = 0; e == NV_OK && i < p->n_score; i++)
        if (p->score_tok[i] < 0 || p->score_tok[i] >= p->vocab_size)
            e = nv_fail(NV_EINVAL, "request: the scored token %d is outside the vocabulary", p->score_tok[i]);
    if (e == NV_OK) memcpy(r->score_tok, p->score_tok, sizeof r->score_tok), r->n_score = p->n_score;
    if (e == NV_OK && p->grammar) e = nv_gsampler_init(&r->gs, p->grammar, p->vocab_size);
    /* the prompt opened the block: a grammar allowing one is fed its opening; one without it refuses it,
       and stays: the answer is then the grammar's from its first token, no block for a budget to close */
    int grammar_thinks = 1;
    const char *open = nv_think_tags_of(p->think_tags)->open;
    if (e == NV_OK && p->grammar && p->think_open && (grammar_thinks = nv_gmatch_feed(r->gs.m, open, strlen(open))) < 0)
        e = nv_fail(NV_ENOMEM, "request: out of memory");
    if (e == NV_OK && p->lazy_grammar && !p->grammar &&
        (e = nv_glazy_init(&r->lazy, p->lazy_grammar, p->lazy_trigger, p->lazy_at_start)) == NV_OK) {
        r->lazy.think = p->lazy_think;
        r->lazy.thk.state = p->think_open ? NV_THINK_IN : NV_THINK_UNDECIDED;
        r->lazy.thk.tags = p->think_tags;
    }
    r->lazy_ends = p->lazy_ends;
    if (e == NV_OK) e = take_answer_rules(r, p, grammar_thinks);
    if (e != NV_OK) {
        req_free(r);
        return e;
    }
    r->t_arrival = nv_now();
    r->deadline = p->timeout_s > 0 ? r->t_arrival + p->timeout_s : 0;
    r->last = r->prompt[r->n_prompt - 1];
    r->n_lookup = -1;
    *out = r;
    return NV_OK;
oom:
    req_free(r);
    return nv_fail(NV_ENOMEM, "request: out of memory");
}

static void req_unref_locked(nv_req *r) {
    if (--r->refs == 0) req_free(r);
}

void nv_req_release(nv_sched *s, nv_req *r) {
    if (!r) return;
    if (!s) {
        req_unref_locked(r);
        return;
    }
    pthread_mutex_lock(&s->mu);
    req_unref_locked(r);
    pthread_mutex_unlock(&s->mu);
}

void nv_req_cancel(nv_sched *s, nv_req *r) {
    pthread_mutex_lock(&s->mu);
    r->cancel = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void lp_list_append(nv_lp_list *lps, const nv_token_lp *src, int n) {
    if (lps->oom) return;
    if (lps->n + n > lps->cap) {
        int cap = lps->cap ? lps->cap : 64;
        while (cap < lps->n + n) cap *= 2;
        nv_token_lp *v = realloc(lps->v, (size_t)cap * sizeof *v);
        if (!v) {
            lps->oom = 1;
            return;
        }
        lps->v = v;
        lps->cap = cap;
    }
    memcpy(lps->v + lps->n, src, (size_t)n * sizeof *lps->v);
    lps->n += n;
}

void nv_req_poll(nv_sched *s, nv_req *r, double wait_s, nv_buf *out, nv_lp_list *lps, nv_req_status *st) {
    pthread_mutex_lock(&s->mu);
    int prompt_news = r->plp_ready && !r->plp_sent;
    if (!r->done && r->out.len == 0 && r->lp_sent == r->lp_pub && !prompt_news && wait_s > 0) {
        cond_wait_s(&r->cv, &s->mu, wait_s);
        prompt_news = r->plp_ready && !r->plp_sent;
    }
    if (r->out.len) {
        nv_buf_append(out, r->out.data, r->out.len);
        nv_buf_consume(&r->out, r->out.len);
    }
    if (lps && prompt_news) lp_list_append(lps, r->plps, r->n_prompt);
    if (lps && r->lp_pub > r->lp_sent) lp_list_append(lps, r->lps + r->lp_sent, r->lp_pub - r->lp_sent);
    r->plp_sent |= prompt_news;
    r->lp_sent = r->lp_pub;
    st->done = r->done;
    st->finish = r->finish;
    st->prompt_tokens = r->n_prompt;
    st->prompt_records = r->plp_sent;
    st->completion_tokens = r->n_gen_pub;
    st->cached_tokens = r->n_cached;
    st->stop_index = r->done ? r->stop_hit : -1; /* written by the loop before it published done */
    st->stop_token = r->done ? r->stop_tok : -1;
    st->stop_text[0] = '\0';
    for (int i = 0; r->done && r->stop_hit >= 0 && r->stop_hit < r->n_own_stop && i < r->n_stop; i++)
        if (r->stop_src[i] == r->stop_hit) snprintf(st->stop_text, sizeof st->stop_text, "%s", r->stop[i]);
    st->prompt_s = r->t_first_pub > 0 ? r->t_first_pub - r->t_arrival : 0;
    st->gen_s = r->t_first_pub > 0 ? r->t_last_pub - r->t_first_pub : 0;
    st->accepted_prediction_tokens = r->pred_acc_pub;
    st->rejected_prediction_tokens = r->pred_rej_pub;
    pthread_mutex_unlock(&s->mu);
}

/* ---- the scheduler ------------------------------------------------------------------------- */

/* Split pages: the ring of windowed-layer blocks a sequence of the given blocks takes. */
static int ring_blocks(const nv_sched *s, int blocks_needed) {
    return blocks_needed < s->wring ? blocks_needed : s->wring;
}

/* The ring blocks r holds: one for each of its first blocks, up to its ring's length. */
static int ring_held(const nv_req *r) { return r->n_alloc < r->n_wring ? r->n_alloc : r->n_wring; }

/* r's block k of the windowed layers: the next block of its ring (from its reservation), or, past
 * the ring's length, the ring block it reuses. */
static void ring_take(nv_sched *s, nv_req *r, int k) {
    if (k < r->n_wring) {
        r->wblocks[k] = nv_kv_alloc(&s->wpool);
        r->wreserved--;
    } else {
        r->wblocks[k] = r->wblocks[k % r->n_wring];
    }
}

long nv_sched_capacity(const nv_sched *s) {
    long pool = (long)s->pool.n_blocks * s->pool.block_size;
    return pool < s->model->config.seq_len ? pool : s->model->config.seq_len;
}

static void reap_disk(nv_sched *s);

/* Closes the SSD tier (its writers finish their queues; every pinned block comes back) and frees it. */
static void disk_free_all(nv_sched *s) {
    nv_disk *tiers[2] = {s->disk, s->wdisk};
    for (int i = 0; i < 2; i++)
        if (tiers[i]) nv_disk_close(tiers[i]);
    reap_disk(s);
    for (int i = 0; i < 2; i++)
        if (tiers[i]) nv_disk_free(tiers[i]);
    s->disk = s->wdisk = NULL;
    free(s->wstage);
    free(s->wstage_free);
    s->wstage = NULL, s->wstage_free = NULL, s->n_wstage_free = 0;
}

/* The prefix cache: identity, the RAM tier over the pool, the SSD tier when asked for (an
 * unusable directory is one warning, and serving goes on without it). */
static nv_err prefix_init(nv_sched *s) {
    const nv_sched_opts *o = &s->o;
    const nv_config *c = &s->model->config;
    uint64_t id = nv_prefix_model_id(s->model, o->block_size, s->pool.pages.dtype);
    NV_TRY(nv_prefix_init(&s->prefix, &s->pool, id));
    s->prefix_on = 1;
    uint64_t idle = o->ram_cache_bytes / s->pool.block_bytes;
    nv_kv_set_max_idle(&s->pool, idle > (uint64_t)s->pool.n_blocks ? s->pool.n_blocks : (int)idle);
    uint64_t per_iter = RESTORE_BYTES / (s->wring && s->wpool.block_bytes > s->pool.block_bytes ? s->wpool.block_bytes : s->pool.block_bytes);
    s->restore_cap = per_iter < 1 ? 1 : per_iter > (uint64_t)s->pool.n_blocks ? s->pool.n_blocks : (int)per_iter;
    s->restore = calloc((size_t)s->restore_cap, sizeof(restore_item));
    if (!s->restore) return nv_fail(NV_ENOMEM, "scheduler: out of memory");
    if (o->disk_dir && *o->disk_dir && o->disk_bytes > 0) {
        int q = s->pool.n_blocks / 4;
        nv_disk_opts d = {.root = o->disk_dir,
                          .model_id = id,
                          .block_size = o->block_size,
                          .n_layers = c->n_layers,
                          .kv_dim = nv_config_kv_dim(c),
                          .n_kv_heads = c->n_kv_heads,
                          .dtype = s->pool.pages.dtype,
                          .max_bytes = o->disk_bytes,
                          .queue_cap = q < 1 ? 1 : q > 64 ? 64 : q};
        nv_err e = NV_OK;
        if (s->wring) { /* split pages: each side's blocks in a part of their own, the budget shared so both hold as many */
            const double fb = (double)s->pool.block_bytes, wb = (double)s->wpool.block_bytes;
            nv_disk_opts w = d;
            d.part = "full", d.n_layers = nv_kv_layers_count(c, NV_KV_LAYERS_FULL);
            d.max_bytes = (uint64_t)((double)o->disk_bytes * fb / (fb + wb));
            w.part = "windowed", w.n_layers = nv_kv_layers_count(c, NV_KV_LAYERS_WINDOWED);
            w.max_bytes = o->disk_bytes - d.max_bytes;
            s->wstage_bytes = (s->wpool.block_bytes + (size_t)o->block_size * sizeof(int32_t) + 63) & ~(size_t)63;
            s->wstage = malloc((size_t)w.queue_cap * s->wstage_bytes);
            s->wstage_free = malloc((size_t)w.queue_cap * sizeof(int));
            if (!s->wstage || !s->wstage_free) e = nv_fail(NV_ENOMEM, "out of memory");
            for (int i = 0; e == NV_OK && i < w.queue_cap; i++) s->wstage_free[s->n_wstage_free++] = i;
            if (e == NV_OK) e = nv_disk_open(&s->wdisk, &w);
        }
        if (e == NV_OK) e = nv_disk_open(&s->disk, &d);
        if (e != NV_OK) {
            nv_warn("serve: prefix cache: %s; running without the SSD tier (serving goes on)", nv_errmsg());
            disk_free_all(s);
        }
    }
    return NV_OK;
}

nv_err nv_sched_init(nv_sched *s, const nv_model *model, const nv_tokenizer *tok, nv_metrics *metrics,
                     const nv_sched_opts *o) {
    memset(s, 0, sizeof *s);
    if (o->max_batch < 1 || o->prefill_chunk < 1 || o->max_queue < 1)
        return nv_fail(NV_EINVAL, "scheduler: max batch, prefill chunk and queue must be at least 1");
    if (o->spec_tokens < 0 || o->spec_tokens > NV_MAX_SPEC || o->pred_tokens < 0 || o->pred_tokens > NV_MAX_SPEC ||
        ((o->spec_tokens || o->pred_tokens) && (o->spec_ngram_min < 1 || o->spec_ngram_max < o->spec_ngram_min)))
        return nv_fail(NV_EINVAL, "scheduler: speculative decoding takes 0 to %d draft tokens and n-grams of 1 <= min <= max",
                       NV_MAX_SPEC);
    pthread_mutex_init(&s->mu, NULL);
    cond_init_mono(&s->cv);
    s->inited = 1;
    s->model = model;
    s->tok = tok;
    s->metrics = metrics;
    s->o = *o;
    const nv_config *c = &model->config;
    const nv_kv_dtype dtype = o->kv_dtype ? o->kv_dtype : NV_KV_F16;
    const int drafts = o->spec_tokens > o->pred_tokens ? o->spec_tokens : o->pred_tokens; /* the most a decode row takes */
    /* draft rows a step takes in all: every sequence's --spec-tokens, and predictions' further drafts for
       at most 16 sequences (a large max_batch does not multiply the batch state by 17) */
    const int pred_more = o->pred_tokens > o->spec_tokens ? o->pred_tokens - o->spec_tokens : 0;
    s->draft_cap = o->max_batch * o->spec_tokens + pred_more * (o->max_batch < 16 ? o->max_batch : 16);
    /* auto: split when every layer's keys and values of the whole context would not fit the budget
       (a block id's bytes: the model's every layer, and a draft model's) */
    const uint64_t id_bytes = nv_kv_block_bytes(c, o->block_size, dtype) +
                              (o->draft ? nv_kv_block_bytes(&o->draft->config, o->block_size, dtype) : 0);
    const int split = nv_kv_layers_count(c, NV_KV_LAYERS_WINDOWED) > 0 && nv_kv_layers_count(c, NV_KV_LAYERS_FULL) > 0 &&
                      (o->swa_cache == NV_SWA_WINDOW ||
                       (o->swa_cache == NV_SWA_AUTO && o->kv_bytes / id_bytes * (uint64_t)o->block_size < (uint64_t)c->seq_len));
    const nv_kv_layers held = split ? NV_KV_LAYERS_FULL : NV_KV_LAYERS_ALL;
    uint64_t kv_bytes = o->kv_bytes;
    nv_err e = NV_OK;
    if (split) {
        /* the windowed layers' pages: a ring per sequence that holds the window behind its first row
           and the most rows a step gives it (a prompt chunk, or a decode row and its drafts); rings
           for max_batch sequences, within the share of the budget those layers would take unsplit */
        const int B = o->block_size, rows = o->prefill_chunk > 1 + drafts ? o->prefill_chunk : 1 + drafts;
        s->wring = nv_kv_ring_blocks(c, rows, B);
        const uint64_t wb = nv_kv_block_bytes_of(c, B, dtype, NV_KV_LAYERS_WINDOWED);
        uint64_t share = (uint64_t)((double)kv_bytes * nv_kv_layers_count(c, NV_KV_LAYERS_WINDOWED) / c->n_layers) / wb;
        /* and with the prefix cache one more, so that a kept ring (a checkpoint) and max_batch running
           sequences fit together: a request continuing it need not wait for its room */
        uint64_t want = (uint64_t)(o->max_batch + (o->prefix_cache ? 1 : 0)) * (uint64_t)s->wring;
        uint64_t wn = want < share ? want : share > (uint64_t)s->wring ? share : (uint64_t)s->wring;
        if (wn * wb >= kv_bytes) {
            nv_sched_free(s);
            return nv_fail(NV_EINVAL,
                           "scheduler: a KV budget of %.1f MiB leaves nothing for the whole-context layers after one window's "
                           "ring (%d blocks of %.1f KiB)",
                           (double)kv_bytes / 1048576.0, s->wring, (double)wb / 1024.0);
        }
        e = nv_kv_pool_init(&s->wpool, c, NV_KV_LAYERS_WINDOWED, B, dtype, wn * wb, 0);
        kv_bytes -= wn * wb;
    }
    if (o->draft) {
        const nv_config *dc = &o->draft->config;
        if (!o->spec_tokens || dc->vocab_size != c->vocab_size) {
            nv_sched_free(s);
            return nv_fail(NV_EINVAL, "scheduler: a draft model needs spec_tokens >= 1 and the model's vocabulary (%d tokens, not %d)",
                           c->vocab_size, dc->vocab_size);
        }
        /* one budget for both: a block id holds the model's and the draft's keys and values */
        const double tb = (double)nv_kv_block_bytes_of(c, o->block_size, dtype, held),
                     db = (double)nv_kv_block_bytes(dc, o->block_size, dtype);
        kv_bytes = (uint64_t)((double)kv_bytes * (tb / (tb + db)));
        s->dlimit = c->seq_len < dc->seq_len ? c->seq_len : dc->seq_len;
    }
    if (e == NV_OK) e = nv_kv_pool_init(&s->pool, c, held, o->block_size, dtype, kv_bytes, 0);
    if (e == NV_OK && split) {
        s->pool.pages.windowed = &s->wpool.pages;
        s->cap_ckpts = 3 * o->max_batch; /* a sequence leaves up to three: a shared prefix's, its prompt's, its ring */
        if (!(s->ckpts = calloc((size_t)s->cap_ckpts, sizeof *s->ckpts))) e = nv_fail(NV_ENOMEM, "scheduler: out of memory");
    }
    /* every sequence's decode row with its drafts, and the prompt chunk */
    if (e == NV_OK) e = nv_batch_state_init(&s->bs, c, o->max_batch + s->draft_cap + o->prefill_chunk, o->max_batch);
    if (e == NV_OK) e = nv_batch_state_set_adapters(&s->bs, c, o->adapters);
    if (e == NV_OK && o->draft) { /* the model's rows of a step and as many rows of catching up */
        const nv_config *dc = &o->draft->config;
        e = nv_kv_pages_init(&s->dpages, dc, o->block_size, s->pool.n_blocks, dtype);
        if (e == NV_OK) e = nv_batch_state_init(&s->dbs, dc, o->max_batch + 2 * o->prefill_chunk, o->max_batch);
        if (e == NV_OK && (!(s->dseqs = calloc((size_t)o->max_batch, sizeof *s->dseqs)) ||
                           !(s->dreq = calloc((size_t)o->max_batch, sizeof *s->dreq))))
            e = nv_fail(NV_ENOMEM, "scheduler: out of memory");
    }
    if (e != NV_OK) {
        nv_sched_free(s);
        return e;
    }
    s->eog_ids = malloc((size_t)c->vocab_size * sizeof *s->eog_ids);
    if (s->eog_ids)
        for (int t = 0; t < c->vocab_size; t++)
            if (nv_tokenizer_is_eog(tok, t)) s->eog_ids[s->n_eog++] = t;
    s->running = calloc((size_t)o->max_batch, sizeof *s->running);
    s->step_req = calloc((size_t)o->max_batch, sizeof *s->step_req);
    s->victims = calloc((size_t)o->max_batch, sizeof *s->victims);
    s->held = calloc((size_t)s->pool.n_blocks, sizeof *s->held);
    s->embed_tmp = malloc((size_t)c->dim * sizeof *s->embed_tmp);
    s->seqs = calloc((size_t)o->max_batch, sizeof *s->seqs);
    if (!s->running || !s->step_req || !s->victims || !s->held || !s->seqs || !s->embed_tmp || !s->eog_ids) {
        nv_sched_free(s);
        return nv_fail(NV_ENOMEM, "scheduler: out of memory");
    }
    if (o->prefix_cache && (e = prefix_init(s)) != NV_OK) {
        nv_sched_free(s);
        return e;
    }
    return NV_OK;
}

/* Ends r with fin: returns its blocks and the rest of its reservation, wakes its waiter and
 * drops the scheduler's reference. Lock held; r is no longer queued or running. */
/* Keeps what the request's grammar sampler cost before it goes. */
static void grammar_costs(nv_req *r) {
    r->g_draws += r->gs.draws;
    r->g_masks += r->gs.masks;
    r->g_mask_s += r->gs.mask_s;
    r->gs.draws = r->gs.masks = 0;
    r->gs.mask_s = 0;
}

/* ---- split pages: checkpoints of the windowed layers ------------------------------------------
 * On split pages a prefix is only reusable with the windowed layers' keys and values of the window
 * behind its end, which a ring overwrites as its sequence goes on. So a finished sequence hands its
 * ring over as a checkpoint instead of returning it (llama.cpp's SWA checkpoints): its blocks
 * [lo, end) are intact there, with their chain hashes. A prompt that continues it (the next turn of
 * a conversation) may reuse its prefix up to any block P <= end whose window starts at or after lo:
 * the shared whole-context blocks from the prefix cache, the window copied into its own ring.
 * Checkpoints hold wpool blocks; the least recently used goes when a sequence needs the room. */

/* The first block a row at position p reads in the windowed layers. */
static int window_block(const nv_sched *s, long p) {
    long from = p - s->model->config.swa_window + 1;
    return from > 0 ? (int)(from / s->wpool.block_size) : 0;
}

static void ckpt_drop(nv_sched *s, int i) {
    nv_swa_ckpt *c = &s->ckpts[i];
    for (int k = 0; k < c->n_ring; k++) nv_kv_unref(&s->wpool, c->ring[k]);
    s->ckpt_blocks -= c->n_ring;
    free(c->ring);
    free(c->hashes);
    s->ckpts[i] = s->ckpts[--s->n_ckpts];
}

/* The least recently used checkpoint other than `keep` (-1: none). */
static int ckpt_oldest(const nv_sched *s, int keep) {
    int old = -1;
    for (int i = 0; i < s->n_ckpts; i++)
        if (i != keep && (old < 0 || s->ckpts[i].used < s->ckpts[old].used)) old = i;
    return old;
}

/* Frees the least recently used checkpoints (other than `keep`) until wpool can reserve `need`;
 * returns keep's index, which dropping others may move. */
static int ckpt_make_room(nv_sched *s, int need, int keep) {
    while (nv_kv_available(&s->wpool) < need) {
        const int old = ckpt_oldest(s, keep);
        if (old < 0) break;
        if (keep == s->n_ckpts - 1) keep = old; /* the last moves into the dropped one's place */
        ckpt_drop(s, old);
    }
    return keep;
}

/* A new checkpoint of r's blocks [lo, end) (their chain hashes copied), whose n_ring blocks the
 * caller puts in its ring (block k at ring[k % ring_len]); the least recently used goes when the
 * store is full. NULL when out of memory. */
static nv_swa_ckpt *ckpt_new(nv_sched *s, const nv_req *r, int n_ring, int ring_len, int lo, int end) {
    if (s->n_ckpts == s->cap_ckpts) ckpt_drop(s, ckpt_oldest(s, -1));
    nv_swa_ckpt c = {malloc((size_t)n_ring * sizeof(int32_t)), n_ring, ring_len, lo, end,
                     malloc((size_t)(end - lo) * sizeof(uint64_t)), ++s->ckpt_clock};
    if (!c.ring || !c.hashes) {
        free(c.ring);
        free(c.hashes);
        return NULL;
    }
    memcpy(c.hashes, r->hashes + lo, (size_t)(end - lo) * sizeof(uint64_t));
    s->ckpt_blocks += n_ring;
    s->ckpts[s->n_ckpts] = c;
    return &s->ckpts[s->n_ckpts++];
}

/* Copies a windowed-layer block's keys and values into another. */
static void wblock_copy(nv_sched *s, int32_t to, int32_t from) {
    memcpy(nv_kv_block_data(&s->wpool.pages, to), nv_kv_block_data(&s->wpool.pages, from), s->wpool.block_bytes);
}

/* A finished sequence's ring as a checkpoint; 0 (the caller returns the ring) when it has no full
 * block it could be continued from. */
static int ckpt_keep(nv_sched *s, nv_req *r) {
    const int n_ring = ring_held(r), end = r->n_hashed;
    const int lo = r->n_alloc - n_ring > r->wvalid_from ? r->n_alloc - n_ring : r->wvalid_from;
    if (!s->prefix_on || !s->wring || r->embed || end <= lo) return 0;
    nv_swa_ckpt *c = ckpt_new(s, r, n_ring, r->n_wring, lo, end);
    if (c) memcpy(c->ring, r->wblocks, (size_t)n_ring * sizeof(int32_t));
    return c != NULL;
}

/* Split pages: the window behind r's first `end` blocks (its prompt's, hashed) copied into blocks of
   their own, as a checkpoint, in room no sequence has reserved (the least recently used checkpoints
   make way for it, and it for a sequence's ring). Taken once a prompt has run: a finished
   sequence's ring holds only what its last steps touched, so after a long answer this is what the same
   prompt (asked again, or with another answer) continues from. And where a prompt's cached prefix
   ended that no checkpoint reached (snap_at): the part the prompts that follow share. */
static void ckpt_snapshot(nv_sched *s, nv_req *r, int end) {
    const int B = s->wpool.block_size;
    int lo = end > 1 ? window_block(s, (long)(end - 1) * B) : 0; /* hits at end and end - 1 */
    if (lo < r->wvalid_from) lo = r->wvalid_from;
    const int n = end - lo;
    if (end < 1 || n < 1) return;
    ckpt_make_room(s, n, -1); /* older checkpoints go first (never room a sequence reserved) */
    if (!nv_kv_reserve(&s->wpool, n)) return;
    nv_swa_ckpt *c = ckpt_new(s, r, n, n, lo, end);
    if (!c) {
        nv_kv_unreserve(&s->wpool, n);
        return;
    }
    for (int k = lo; k < end; k++) { /* block k at ring[k % n], as in a ring of n */
        c->ring[k % n] = nv_kv_alloc(&s->wpool);
        wblock_copy(s, c->ring[k % n], r->wblocks[k]);
    }
}

/* The checkpoint a prompt whose first `hits` blocks are in the prefix cache can continue, and at
 * which block (*at, <= hits: the largest any checkpoint serves); -1 when none. */
static int ckpt_find(const nv_sched *s, const nv_req *r, int hits, int *at) {
    int best = -1;
    *at = 0;
    for (int i = 0; i < s->n_ckpts; i++) {
        const nv_swa_ckpt *c = &s->ckpts[i];
        for (int p = hits < c->end ? hits : c->end; p > *at && window_block(s, (long)p * s->wpool.block_size) >= c->lo; p--)
            if (c->hashes[p - 1 - c->lo] == r->hashes[p - 1]) { /* a chain hash: the whole prefix up to p agrees */
                best = i, *at = p;
                break;
            }
    }
    return best;
}

/* r continues checkpoint ck from block `at`: the ring blocks of its first `at` blocks taken, and
 * the window behind block `at` copied into them. */
static void ckpt_resume(nv_sched *s, nv_req *r, int ck, int at) {
    nv_swa_ckpt *c = &s->ckpts[ck];
    for (int k = 0; k < at; k++) ring_take(s, r, k);
    r->wvalid_from = window_block(s, (long)at * s->wpool.block_size);
    for (int k = r->wvalid_from; k < at; k++) wblock_copy(s, r->wblocks[k], c->ring[k % c->ring_len]);
    c->used = ++s->ckpt_clock;
}

/* Returns r's blocks (indexed ones stay in the prefix cache, idle) and the rest of its reservation. */
static void release_blocks(nv_sched *s, nv_req *r, nv_finish fin) {
    /* last block first: a prefix's first blocks end up the most recently used idle ones */
    for (int i = r->n_alloc - 1; i >= 0; i--) nv_kv_unref(&s->pool, r->blocks[i]);
    if (fin == NV_FINISH_ERROR || r->restore_split || !ckpt_keep(s, r)) /* (a ring still being read from disk is not whole) */
        for (int i = ring_held(r) - 1; i >= 0; i--) nv_kv_unref(&s->wpool, r->wblocks[i]);
    nv_kv_unreserve(&s->wpool, r->wreserved);
    r->wreserved = 0;
    r->n_alloc = 0;
    r->restore_next = r->restore_end = r->wrestore_next = r->wrestore_end = 0;
    r->restore_split = r->restore_shared = 0;
    nv_kv_unreserve(&s->pool, r->reserved);
    r->reserved = 0;
}

static void retire(nv_sched *s, nv_req *r, nv_finish fin) {
    release_blocks(s, r, fin);
    r->done = 1;
    r->finish = fin;
    r->n_gen_pub = r->n_gen;
    r->pred_acc_pub = r->pred_acc, r->pred_rej_pub = r->pred_rej;
    r->t_first_pub = r->t_first, r->t_last_pub = r->t_last;
    nv_metrics_finish(s->metrics, fin, r->n_prompt, r->n_gen, nv_now() - r->t_arrival);
    grammar_costs(r);
    if (r->g_draws) nv_metrics_grammar(s->metrics, r->g_draws, r->g_masks, r->g_mask_s);
    pthread_cond_broadcast(&r->cv);
    req_unref_locked(r);
}

static void remove_running(nv_sched *s, int i) {
    memmove(s->running + i, s->running + i + 1, (size_t)(s->n_running - i - 1) * sizeof *s->running);
    s->n_running--;
}

/* Takes r out of the running sequences. */
static void remove_running_req(nv_sched *s, const nv_req *r) {
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i] == r) {
            remove_running(s, i);
            return;
        }
}

/* Retires what was cancelled, timed out or shut down. */
static void sweep(nv_sched *s, double now) {
    nv_req **link = &s->wait_head, *prev = NULL;
    while (*link) {
        nv_req *r = *link;
        /* (a preempted one was running: it finishes with those still running) */
        nv_finish fin = r->cancel ? NV_FINISH_CANCELLED
                        : s->stopping > (r->preempted ? 1 : 0) ? NV_FINISH_SHUTDOWN
                        : (r->deadline > 0 && now > r->deadline) ? NV_FINISH_TIMEOUT
                                                                 : NV_FINISH_NONE;
        if (fin == NV_FINISH_NONE) {
            prev = r;
            link = &r->next;
            continue;
        }
        *link = r->next;
        if (s->wait_tail == r) s->wait_tail = prev;
        s->n_waiting--;
        r->next = NULL;
        retire(s, r, fin);
    }
    for (int i = 0; i < s->n_running;) {
        nv_req *r = s->running[i];
        nv_finish fin = r->cancel ? NV_FINISH_CANCELLED
                        : s->stopping == 2 ? NV_FINISH_SHUTDOWN
                        : (r->deadline > 0 && now > r->deadline) ? NV_FINISH_TIMEOUT
                                                                 : NV_FINISH_NONE;
        if (fin == NV_FINISH_NONE) {
            i++;
            continue;
        }
        remove_running(s, i);
        retire(s, r, fin);
    }
}

/* The chain parent of r's block k: the block before it, or for the first the request's root (an
 * adapter's KV is its own: its chains start at the adapter's identity). */
static uint64_t chain_parent(const nv_req *r, int k) { return k ? r->hashes[k - 1] : r->root; }

/* Queues block b (full, indexed) for the SSD writer, pinned by a reference until reaped. */
static void disk_write(nv_sched *s, int32_t b, uint64_t hash, uint64_t parent) {
    if (!s->disk) return;
    nv_disk_job j = {.hash = hash,
                     .parent = parent,
                     .tokens = s->pool.tokens + (size_t)b * s->pool.block_size,
                     .payload = nv_kv_block_data(&s->pool.pages, b),
                     .block = b};
    nv_kv_ref(&s->pool, b);
    if (!nv_disk_enqueue(s->disk, &j)) nv_kv_unref(&s->pool, b);
}

/* Split pages: r's windowed-layer block k (full, hashed) queued for the windowed part of the SSD
 * tier, as a copy (its ring block is written again once the ring comes round), while its ring still
 * holds it and a staging slot is free. */
static void wdisk_write(nv_sched *s, const nv_req *r, int k, uint64_t hash, uint64_t parent) {
    if (!s->wdisk || k < r->wvalid_from || k + r->n_wring < r->n_alloc || nv_disk_known(s->wdisk, hash)) return;
    if (!s->n_wstage_free) { /* the writer is behind: as a full queue's drop */
        s->wstage_drops++;
        return;
    }
    const int slot = s->wstage_free[--s->n_wstage_free], B = s->pool.block_size;
    uint8_t *copy = s->wstage + (size_t)slot * s->wstage_bytes;
    int32_t *tokens = (int32_t *)(copy + s->wpool.block_bytes);
    memcpy(copy, nv_kv_block_data(&s->wpool.pages, r->wblocks[k]), s->wpool.block_bytes);
    memcpy(tokens, s->pool.tokens + (size_t)r->blocks[k] * B, (size_t)B * sizeof *tokens);
    nv_disk_job j = {.hash = hash, .parent = parent, .tokens = tokens, .payload = copy, .block = slot};
    if (!nv_disk_enqueue(s->wdisk, &j)) s->wstage_free[s->n_wstage_free++] = slot;
}

/* Drops the SSD writers' references on the blocks they are done with (the windowed part's: staging
 * slots). */
static void reap_disk(nv_sched *s) {
    int32_t done[64];
    int n;
    while (s->disk && (n = nv_disk_reap(s->disk, done, 64)) > 0)
        for (int i = 0; i < n; i++) nv_kv_unref(&s->pool, done[i]);
    while (s->wdisk && (n = nv_disk_reap(s->wdisk, done, 64)) > 0)
        for (int i = 0; i < n; i++) s->wstage_free[s->n_wstage_free++] = done[i];
}

/* The tokens r's positions hold, and how many of them a prefill computes: its prompt, or after a
 * preemption while it decoded, the prompt and the answer before its next decode row. */
static const int *fill_tokens(const nv_req *r) { return r->replay ? r->replay : r->prompt; }
static int fill_end(const nv_req *r) { return r->replay ? r->n_replay : r->n_prompt; }

/* The request's block table and hash chain, and the chain hashes of the prompt blocks a lookup
 * may reuse (computed once, at the request's first lookup). 0 when out of memory. */
static int prepare(nv_sched *s, nv_req *r) {
    if (!r->blocks) r->blocks = malloc((size_t)r->blocks_needed * sizeof(int));
    if (!r->blocks) return 0;
    if (s->wring && !r->wblocks && !(r->wblocks = malloc((size_t)r->blocks_needed * sizeof(int)))) return 0;
    if (r->embed) { /* the sum of its rows, the model's width; no drafts and no prefix lookups */
        if (!r->embed_sum && !(r->embed_sum = calloc((size_t)s->model->config.dim, sizeof *r->embed_sum))) return 0;
        r->n_lookup = 0;
        return 1;
    }
    if ((s->o.spec_tokens || (r->pred.n && s->o.pred_tokens)) && !r->ctx) { /* the prompt and every token the request may generate */
        long cap = (long)r->n_prompt + r->max_tokens;
        r->cap_ctx = (int)(cap < s->model->config.seq_len + 1 ? cap : s->model->config.seq_len + 1);
        if (r->cap_ctx < r->n_prompt) r->cap_ctx = r->n_prompt;
        if (!(r->ctx = malloc((size_t)r->cap_ctx * sizeof *r->ctx))) return 0;
        memcpy(r->ctx, r->prompt, (size_t)r->n_prompt * sizeof *r->ctx);
        r->n_ctx = r->n_prompt;
    }
    if ((r->gs.m || r->lazy.g) && !s->trie && nv_gtrie_build(s->tok, &s->trie) != NV_OK) return 0;
    if (!s->prefix_on || r->n_lookup >= 0) return 1;
    int B = s->pool.block_size;
    r->hashes = malloc((size_t)r->blocks_needed * sizeof *r->hashes);
    if (!r->hashes) return 0;
    int n = (r->n_prompt - 1) / B;
    if (n > r->blocks_needed) n = r->blocks_needed;
    uint64_t parent = r->root;
    for (int k = 0; k < n; k++) parent = r->hashes[k] = nv_prefix_chain(s->prefix.model_id, parent, r->prompt + k * B, B);
    r->n_lookup = n;
    return 1;
}

/* How many of r's first n blocks (found in the prefix cache) no sequence holds: taking them takes
 * from the pool's free room. */
static int idle_count(const nv_sched *s, const nv_req *r, int n) {
    int idle = 0;
    for (int k = 0; k < n; k++) idle += s->pool.refs[r->blocks[k]] == 0;
    return idle;
}

/* Split pages with an SSD tier: the largest point p in (lo, top] of r's prompt blocks whose window,
 * the windowed layers' blocks [window_block(p B), p), the tier's windowed part holds (0: none).
 * A block it lacks rules out every point whose window holds it, so each block is asked once. */
static int wdisk_point(nv_sched *s, const nv_req *r, int lo, int top) {
    for (int p = top; p > lo;) {
        int k = p - 1;
        const int w = window_block(s, (long)p * s->pool.block_size);
        while (k >= w && nv_disk_has(s->wdisk, r->hashes[k])) k--;
        if (k < w) return p;
        p = k;
    }
    return 0;
}

/* Whether a goes before b whenever they meet: an interactive request before a background one, else
 * the lower priority value. */
static int outranks(const nv_req *a, const nv_req *b) {
    return a->background != b->background ? a->background < b->background : a->priority < b->priority;
}

/* Whether a waits ahead of b in the queue: a outranks b, or neither does and a came first. */
static int ranks_before(const nv_req *a, const nv_req *b) {
    return outranks(a, b) || (!outranks(b, a) && a->slot.task < b->slot.task);
}

/* Queues r behind every request that ranks before it (lock held). */
static void enqueue(nv_sched *s, nv_req *r) {
    nv_req **link = &s->wait_head, *prev = NULL;
    while (*link && ranks_before(*link, r)) prev = *link, link = &(*link)->next;
    r->next = *link;
    *link = r;
    if (s->wait_tail == prev) s->wait_tail = r;
    s->n_waiting++;
}

static int victim_order(const void *x, const void *y) { /* the lowest-ranked first */
    const nv_req *a = *(nv_req *const *)x, *b = *(nv_req *const *)y;
    return ranks_before(a, b) - ranks_before(b, a);
}
static int rank_order(const void *x, const void *y) { return victim_order(y, x); } /* the highest first */

/* The pool's blocks preempting v gives r, whose first `hits` blocks the prefix cache holds, once the
 * victims picked before it have gone too: the rest of v's reservation, and the blocks of v that no
 * one but the victims then holds (s->held counts them), but those r shares (they stay r's, idle). */
static int preempt_gain(nv_sched *s, const nv_req *v, const nv_req *r, int hits) {
    int gain = v->reserved;
    for (int k = 0; k < v->n_alloc; k++) {
        const int32_t b = v->blocks[k];
        gain += ++s->held[b] == s->pool.refs[b] && !(k < hits && r->blocks[k] == b);
    }
    return gain;
}

/* Forgets v's blocks in s->held once a choice of victims is made. */
static void gain_forget(nv_sched *s, const nv_req *v) {
    for (int k = 0; k < v->n_alloc; k++) s->held[v->blocks[k]] = 0;
}

/* Sends running v back to the queue (lock held): its state stays (sampler, grammar, text so far), its
 * blocks go (indexed ones idle in the prefix cache, where its admission again finds them), and the
 * positions it had are computed again from what they held (replay). 0 when out of memory. */
static int preempt(nv_sched *s, nv_req *v) {
    const int B = s->pool.block_size;
    if (v->n_gen > 0 && v->pos > v->n_replay) { /* (while it still prompts, its prompt is all it had) */
        if (!v->replay && !(v->replay = malloc((size_t)v->blocks_needed * B * sizeof *v->replay))) return 0;
        for (int p = 0; p < v->pos; p++) v->replay[p] = s->pool.tokens[(size_t)v->blocks[p / B] * B + p % B];
        v->n_replay = v->pos;
    }
    if (s->prefix_on && v->n_hashed > v->n_lookup) v->n_lookup = v->n_hashed; /* their hashes are kept */
    release_blocks(s, v, NV_FINISH_NONE);
    v->pos = v->dvalid = v->n_hashed = 0;
    remove_running_req(s, v);
    v->preempted++;
    enqueue(s, v);
    nv_metrics_preempted(s->metrics);
    nv_debug("serve: request %llu (priority %d%s) preempted after %d tokens", v->slot.task, v->priority,
             v->background ? ", background" : "", v->n_gen);
    return 1;
}

/* Whether running v can go back to the queue: not one whose rows are read as they run (an
 * embedding, a score, prompt log-probabilities until they are whole), nor one reading its prefix
 * from disk (on split pages, until both its parts are whole). So every decoding sequence can. On
 * split pages its ring is kept as a checkpoint (release_blocks), which it continues from when it
 * comes back, unless the room was needed. */
static int preemptible(const nv_req *v) {
    return !v->embed && !v->n_score && (!v->plps || v->plp_ready) && v->restore_next >= v->restore_end && !v->restore_split;
}

/* Whether requests reserve only what they hold so far (o.overcommit). */
static int overcommit(const nv_sched *s) { return s->o.overcommit; }

/* The drafts r's decode row may carry this step (before the step's cap on drafts in all): as many as
 * its acceptance so far makes worthwhile, never more than the tokens it may still produce after this
 * row's, nor past the context (so within its reservation). */
static int drafts_for(const nv_sched *s, const nv_req *r) {
    const int k_max = r->pred.n && s->o.pred_tokens ? s->o.pred_tokens : s->o.spec_tokens;
    int k = k_max && r->ctx ? nv_spec_len(&r->spec, k_max) : 0;
    const int left = r->max_tokens - r->n_gen - 1, room = s->model->config.seq_len - 1 - r->pos;
    if (k > left) k = left;
    if (k > room) k = room;
    return k > 0 ? k : 0;
}

/* The running sequences r may preempt, into s->victims: how many. */
static int victims_of(nv_sched *s, const nv_req *r) {
    if (s->o.no_preempt || s->stopping) return 0;
    int n = 0;
    for (int i = 0; i < s->n_running; i++)
        if (outranks(r, s->running[i]) && preemptible(s->running[i])) s->victims[n++] = s->running[i];
    return n;
}

/* Makes room for r, the head of the queue, by preempting running sequences it outranks, the
 * lowest-ranked first (the latest submitted among equals), as few as give it a slot (when every one
 * is taken), `short_by` blocks of the pool and, on split pages, `wshort` of the windowed layers'
 * (a victim's ring becomes a checkpoint, which gives way); none when they cannot. Returns how many
 * went. */
static int preempt_for(nv_sched *s, const nv_req *r, int hits, int short_by, int wshort) {
    const int n = victims_of(s, r);
    qsort(s->victims, (size_t)n, sizeof *s->victims, victim_order);
    const int slots = s->n_running >= s->o.max_batch;
    int k = 0, gain = 0, wgain = 0;
    while (k < n && (k < slots || gain < short_by || wgain < wshort)) {
        const nv_req *v = s->victims[k++];
        /* (overcommitted: each victim also takes the block of headroom admission leaves it) */
        gain += preempt_gain(s, v, r, hits) + overcommit(s);
        wgain += v->wreserved + ring_held(v);
    }
    for (int i = 0; i < k; i++) gain_forget(s, s->victims[i]);
    if (k < slots || gain < short_by || wgain < wshort) return 0;
    int went = 0;
    for (int i = 0; i < k; i++) went += preempt(s, s->victims[i]);
    return went;
}

static void admit(nv_sched *s) {
    int B = s->pool.block_size;
    while (s->wait_head && s->stopping < 2) {
        nv_req *r = s->wait_head;
        if (s->n_running >= s->o.max_batch && !victims_of(s, r)) break;
        if (!prepare(s, r)) {
            s->wait_head = r->next;
            if (!s->wait_head) s->wait_tail = NULL;
            s->n_waiting--;
            r->next = NULL;
            nv_log(NV_LOG_WARN, "serve: out of memory admitting a request");
            retire(s, r, NV_FINISH_ERROR);
            continue;
        }
        /* its blocks: overcommitted, its prompt's and first answer position's (the rest as it goes:
           grow), with a block left for each running sequence's next one */
        const int now = overcommit(s) ? nv_kv_blocks_for(&s->pool, (long)fill_end(r) + 1) : r->blocks_needed;
        const int own = now < r->blocks_needed ? now : r->blocks_needed, headroom = overcommit(s) ? s->n_running : 0;
        /* the longest cached prefix: RAM first, then the chain goes on from disk */
        int hits = 0, idle_hits = 0, on_disk = 0, ck = -1, shared = 0, wpoint = 0;
        /* a prompt whose rows are read (log-probabilities until whole, embedding) runs in full */
        if (s->prefix_on && (!r->plps || r->plp_ready) && !r->embed) {
            for (; hits < r->n_lookup; hits++) {
                int32_t b = nv_prefix_find(&s->prefix, r->hashes[hits], chain_parent(r, hits), fill_tokens(r) + hits * B);
                if (b < 0) break;
                r->blocks[hits] = b;
            }
            shared = hits;
            if (s->wring) { /* split pages: only as far as a checkpoint's window reaches */
                ck = ckpt_find(s, r, shared, &hits);
                if (s->wdisk) { /* or the SSD tier's: its whole-context blocks, then a window it holds */
                    int top = shared;
                    while (top < r->n_lookup && nv_disk_has(s->disk, r->hashes[top])) top++;
                    wpoint = wdisk_point(s, r, hits, top);
                    const int from_ram = wpoint < shared ? wpoint : shared;
                    /* its reservation holds every block of its own, for the fallback (restore_fallback) */
                    if (wpoint && nv_kv_available(&s->pool) < own + idle_count(s, r, from_ram)) wpoint = 0;
                    if (wpoint) ck = -1, hits = from_ram, on_disk = wpoint - from_ram;
                }
            } else {
                while (s->disk && hits + on_disk < r->n_lookup && nv_disk_has(s->disk, r->hashes[hits + on_disk])) on_disk++;
            }
            idle_hits = idle_count(s, r, hits);
        }
        int need = own - (wpoint ? 0 : hits); /* blocks of its own, disk restores included */
        const int wneed = ring_blocks(s, r->blocks_needed);
        const int short_by = need + idle_hits + headroom - nv_kv_available(&s->pool);
        /* split pages: the other checkpoints give way to a ring; ck's own room, too, only where nobody it
           outranks can make it (its prompt then runs whole, below) */
        const int ck_room = ck >= 0 ? s->ckpts[ck].n_ring : 0;
        const int wshort = wneed ? wneed - nv_kv_available(&s->wpool) - (s->ckpt_blocks - ck_room) : 0;
        if (short_by > 0 || wshort > 0 || s->n_running >= s->o.max_batch) { /* the head waits; nobody overtakes it */
            if (preempt_for(s, r, hits, short_by, wshort)) continue; /* (their blocks may be its hits now) */
            if (short_by > 0 || wshort > ck_room || s->n_running >= s->o.max_batch) break;
        }
        if (wneed) {
            ck = ckpt_make_room(s, wneed, ck); /* checkpoints go only for a request the pool holds */
            if (nv_kv_available(&s->wpool) < wneed && ck >= 0) { /* the room is the checkpoint's own: the prompt runs whole */
                ckpt_drop(s, ck);
                ck = -1, hits = idle_hits = 0, need = own;
                if (nv_kv_available(&s->pool) < need + headroom) break;
            }
            if (nv_kv_available(&s->wpool) < wneed) break;
        }
        /* split pages: the window where a shared prefix ends is kept too (ckpt_snapshot), when this
           prompt cannot continue from there */
        r->snap_at = s->wring && shared > (wpoint ? wpoint : hits) ? shared : 0;
        s->wait_head = r->next;
        if (!s->wait_head) s->wait_tail = NULL;
        s->n_waiting--;
        r->next = NULL;
        for (int k = 0; k < hits; k++) nv_kv_ref(&s->pool, r->blocks[k]);
        for (int k = 0; s->disk && k < hits; k++) nv_disk_touch(s->disk, r->hashes[k]); /* their files stay the freshest */
        nv_kv_reserve(&s->pool, need); /* cannot fail: checked above */
        r->reserved = need;
        if (wneed) nv_kv_reserve(&s->wpool, wneed);
        r->n_wring = r->wreserved = wneed;
        r->wvalid_from = 0;
        if (ck >= 0) ckpt_resume(s, r, ck, hits);
        for (int k = 0; k < wpoint; k++) ring_take(s, r, k);
        r->n_alloc = hits;
        for (int k = 0; k < on_disk; k++) {
            r->blocks[r->n_alloc++] = nv_kv_alloc(&s->pool);
            r->reserved--;
        }
        r->pos = hits * B;
        r->dvalid = hits * B; /* blocks in RAM hold the draft's keys and values too (index_full_blocks) */
        if (!r->preempted) r->n_cached = hits * B; /* (the prompt's, as its first admission found it) */
        else nv_debug("serve: request %llu back: %d of its %d positions found in the prefix cache (%d on disk)", r->slot.task,
                      hits * B, fill_end(r), on_disk * B);
        r->n_hashed = hits;
        r->restore_next = r->disk_from = hits;
        r->restore_end = hits + on_disk;
        r->restore_split = wpoint > 0;
        r->restore_shared = wpoint ? hits : 0;
        r->wrestore_next = r->wrestore_end = 0;
        if (wpoint) r->wrestore_next = r->wvalid_from = window_block(s, (long)wpoint * B), r->wrestore_end = wpoint;
        if (s->prefix_on && (!r->plps || r->plp_ready) && !r->embed) {
            /* a shared block whose file was dropped or evicted gets another chance at the SSD tier */
            for (int k = 0; s->disk && k < hits; k++)
                if (!nv_disk_known(s->disk, r->hashes[k])) disk_write(s, r->blocks[k], r->hashes[k], chain_parent(r, k));
            int miss = r->n_lookup - hits;
            const int restoring = on_disk || wpoint; /* counted once read */
            if (!r->preempted) nv_metrics_prefix(s->metrics, hits, miss, 0, restoring || !s->disk ? 0 : miss, restoring ? 0 : r->n_cached);
        }
        s->running[s->n_running++] = r;
    }
}

/* An overcommitted pool (o.overcommit), before each step, the highest-ranked first: each decoding
 * sequence reserves the block its decode row reaches beyond those it holds and has reserved, and, where
 * the pool has them without preempting anyone, its drafts' (plan_step takes no more drafts than it
 * holds room for). Where the pool is short, sequences ranked below it go back to the queue (preempt),
 * the lowest first, as few as free the block (counted as preempt_for counts them); the growing one
 * itself when it is the lowest of several. One that can free nothing so (those below it still
 * prefilling a prompt whose rows are read, or their blocks still held by the SSD writer) sits the
 * step out (stalled). A sequence never preempts one ranked above it. Lock held. */
static void grow(nv_sched *s) {
    if (!overcommit(s)) return;
    const int n = s->n_running, B = s->pool.block_size;
    nv_req **order = s->victims;
    memcpy(order, s->running, (size_t)n * sizeof *order);
    qsort(order, (size_t)n, sizeof *order, rank_order);
    for (int i = 0; i < n; i++) {
        nv_req *r = order[i];
        if (!r) continue; /* preempted by a sequence before it */
        r->stalled = 0;
        if (r->pos < fill_end(r) || r->restore_next < r->restore_end) continue; /* its prompt was reserved whole */
        const long held = (long)(r->n_alloc + r->reserved) * B;
        if (held < (long)r->pos + 1) { /* the decode row's block */
            if (nv_kv_available(&s->pool) < 1) { /* those below it that free one, the lowest first */
                int gain = 0, last = n, lower = 0;
                for (int j = n - 1; j > i; j--) {
                    if (!order[j]) continue;
                    lower = 1;
                    if (!gain && preemptible(order[j])) gain = preempt_gain(s, order[j], r, 0), last = j;
                }
                for (int j = n - 1; j >= last; j--)
                    if (order[j] && preemptible(order[j])) gain_forget(s, order[j]);
                if (gain) {
                    for (int j = n - 1; j >= last; j--)
                        if (order[j] && preemptible(order[j]) && preempt(s, order[j])) order[j] = NULL;
                } else if (!lower && i > 0 && preemptible(r) && preempt(s, r)) {
                    continue; /* the lowest of several: it waits in the queue now */
                }
            }
            if (!nv_kv_reserve(&s->pool, 1)) {
                r->stalled = 1;
                continue;
            }
            r->reserved++;
        }
        /* its drafts' blocks, where the pool has them */
        const long reach = (long)r->pos + 1 + drafts_for(s, r);
        const int extra = (int)((reach + B - 1) / B) - r->n_alloc - r->reserved;
        if (extra > 0 && nv_kv_reserve(&s->pool, extra)) r->reserved += extra;
    }
}

/* Split pages: a block of r's prefix on disk failed its checks (or went): r prefills its whole
 * prompt instead, on blocks of its own (its reservation holds one for each block it shared), none of
 * them indexed yet (restore_split_done indexes them). */
static void restore_fallback(nv_sched *s, nv_req *r) {
    for (int k = 0; k < r->restore_shared; k++) {
        nv_kv_unref(&s->pool, r->blocks[k]);
        r->blocks[k] = nv_kv_alloc(&s->pool);
        r->reserved--;
    }
    if (!r->preempted) nv_metrics_prefix(s->metrics, 0, 0, 0, r->n_lookup, 0), r->n_cached = 0; /* (counted at its first admission) */
    r->restore_next = r->restore_end = r->wrestore_next = r->wrestore_end = 0;
    r->restore_split = r->restore_shared = 0;
    r->pos = r->dvalid = r->n_hashed = r->wvalid_from = 0;
    nv_log(NV_LOG_WARN, "serve: prefix cache: a block on disk failed its checks; the prompt runs whole");
}

/* Split pages: r's prefix is read whole (its window and the whole-context blocks past those it
 * shares): the blocks read are indexed (with a draft model, once the draft has run them:
 * index_full_blocks), the fallback's spare reservation returned, and r goes on from there. */
static void restore_split_done(nv_sched *s, nv_req *r) {
    const int B = s->pool.block_size, p = r->wrestore_end;
    for (int k = r->disk_from; k < p && !s->o.draft; k++) nv_prefix_insert(&s->prefix, r->blocks[k], r->hashes[k], chain_parent(r, k));
    if (!s->o.draft) r->n_hashed = p;
    nv_kv_unreserve(&s->pool, r->restore_shared);
    r->reserved -= r->restore_shared;
    r->pos = p * B;
    if (!r->preempted) r->n_cached = r->pos, nv_metrics_prefix(s->metrics, 0, 0, p - r->disk_from, r->n_lookup - p, r->n_cached);
    r->restore_next = r->restore_end = r->wrestore_next = r->wrestore_end = 0;
    r->restore_split = r->restore_shared = 0;
}

/* Reads the disk blocks admitted requests wait for, at most restore_cap blocks per call, with
 * the lock released while reading (the blocks are the requests' own; only this thread touches
 * the pool). A block that fails its checks ends that request's hit: it is prefilled instead (on
 * split pages from its start, restore_fallback: what came before has no window to go on from).
 * Lock held on entry and exit. */
static void restore_from_disk(nv_sched *s) {
    if (!s->disk) return;
    restore_item *it = s->restore;
    int n = 0, B = s->pool.block_size;
    for (int i = 0; i < s->n_running && n < s->restore_cap; i++) {
        nv_req *r = s->running[i];
        for (int k = r->wrestore_next; k < r->wrestore_end && n < s->restore_cap; k++) it[n++] = (restore_item){r, k, 0, 1, 1};
        for (int k = r->restore_next; k < r->restore_end && n < s->restore_cap; k++)
            it[n++] = (restore_item){r, k, 0, 0, r->restore_split};
    }
    if (!n) return;
    pthread_mutex_unlock(&s->mu);
    double t0 = nv_now();
    for (int i = 0; i < n; i++) nv_disk_prefetch(it[i].win ? s->wdisk : s->disk, it[i].r->hashes[it[i].k]); /* the device reads in parallel */
    nv_req *failed = NULL;
    for (int i = 0; i < n; i++) {
        nv_req *r = it[i].r;
        int k = it[i].k;
        if (r == failed) continue;
        void *into = it[i].win ? nv_kv_block_data(&s->wpool.pages, r->wblocks[k]) : nv_kv_block_data(&s->pool.pages, r->blocks[k]);
        it[i].ok = nv_disk_load(it[i].win ? s->wdisk : s->disk, r->hashes[k], chain_parent(r, k), fill_tokens(r) + k * B, into);
        if (!it[i].ok) failed = r;
    }
    nv_debug("serve: prefix cache: read %d blocks from disk in %.1f ms%s", n, (nv_now() - t0) * 1e3,
             failed ? " (a block failed its checks)" : "");
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < n; i++) {
        nv_req *r = it[i].r;
        int k = it[i].k;
        if (it[i].split) { /* split pages: all or nothing */
            int *next = it[i].win ? &r->wrestore_next : &r->restore_next;
            if (!r->restore_split || k != *next) continue; /* after a failure of this request */
            if (!it[i].ok) {
                restore_fallback(s, r);
                continue;
            }
            if (!it[i].win)
                for (int t = 0; t < B; t++) nv_kv_record(&s->pool, r->blocks[k], t, fill_tokens(r)[k * B + t]);
            *next = k + 1;
            if (r->wrestore_next >= r->wrestore_end && r->restore_next >= r->restore_end) restore_split_done(s, r);
            continue;
        }
        if (k != r->restore_next || k >= r->restore_end) continue; /* after a failure of this request */
        if (!it[i].ok) {
            r->restore_end = k;
        } else {
            int32_t b = r->blocks[k];
            for (int t = 0; t < B; t++) nv_kv_record(&s->pool, b, t, fill_tokens(r)[k * B + t]);
            if (!s->o.draft) { /* with a draft model: once the draft has run it (index_full_blocks) */
                nv_prefix_insert(&s->prefix, b, r->hashes[k], chain_parent(r, k));
                r->n_hashed = k + 1;
            }
            r->restore_next = k + 1;
            r->pos = (k + 1) * B;
            if (!r->preempted) r->n_cached = r->pos;
        }
        if (r->restore_next >= r->restore_end) { /* done: count it */
            int blocks = r->pos / B;
            r->restore_next = r->restore_end = 0;
            if (!r->preempted) nv_metrics_prefix(s->metrics, 0, 0, blocks - r->disk_from, r->n_lookup - blocks, r->n_cached);
        }
    }
}

/* Room for at least want log-prob records (lock held: nv_req_poll reads them under it, so they may
 * move only now, never while the step runs unlocked); out of memory turns them off for the rest of
 * the answer. */
static void lp_reserve(nv_req *r, int want) {
    if (want <= r->cap_lps) return;
    int cap = r->cap_lps ? 2 * r->cap_lps : 64;
    while (cap < want) cap *= 2;
    nv_token_lp *v = realloc(r->lps, (size_t)cap * sizeof *v);
    if (v) r->lps = v;
    struct lp_span *sp = v ? realloc(r->lp_span, (size_t)cap * sizeof *sp) : NULL;
    if (sp) r->lp_span = sp;
    if (!sp) {
        nv_log(NV_LOG_WARN, "serve: out of memory for log-probabilities; the rest of this answer has none");
        r->lp_k = -1;
        return;
    }
    r->cap_lps = cap;
}

/* Chooses this step's rows (lock held): one decode row per generating sequence, prompt chunks
 * from a budget of prefill_chunk rows in admission order. Takes the blocks the rows reach, a
 * decode row's drafts included (looked up after the lock is released: draft_rows). */
static int plan_step(nv_sched *s) {
    int budget = s->o.prefill_chunk, n = 0, B = s->pool.block_size, drafts_left = s->draft_cap;
    for (int i = 0; i < s->n_running; i++) {
        nv_req *r = s->running[i];
        nv_batch_seq q = {0};
        if (r->restore_next < r->restore_end || r->wrestore_next < r->wrestore_end) continue; /* still reading its prefix from disk */
        if (r->stalled) continue; /* no room for its next blocks this step (grow) */
        if (r->pos < fill_end(r)) {
            if (budget == 0) continue;
            r->spec_k = 0;
            q.n = fill_end(r) - r->pos < budget ? fill_end(r) - r->pos : budget;
            /* a chunk that reaches snap_at ends there: the ring then holds the window behind that block and
               the one before it (ckpt_snapshot copies both), however far the chunk would have gone past */
            const long snap = (long)r->snap_at * B;
            if (r->pos < snap && r->pos + q.n > snap) q.n = (int)(snap - r->pos);
            budget -= q.n;
            q.tokens = fill_tokens(r) + r->pos;
            /* (a replay's last position is followed by its decode row, which the logits come from) */
            q.logits = !r->replay && r->pos + q.n == r->n_prompt && (r->max_tokens > 0 || r->n_score);
        } else {
            q.n = 1;
            q.tokens = &r->last;
            q.logits = 1;
            r->pred_step = 0;
            int k = drafts_for(s, r);
            if (k > drafts_left) k = drafts_left;
            if (overcommit(s) && k > (r->n_alloc + r->reserved) * B - r->pos - 1) /* (the room grow found for them) */
                k = (r->n_alloc + r->reserved) * B - r->pos - 1;
            r->spec_k = k > 0 ? k : 0;
            drafts_left -= r->spec_k;
        }
        q.pos = r->pos;
        q.blocks = r->blocks;
        q.wblocks = r->wblocks;
        q.lora = r->lora.n ? &r->lora : NULL;
        const long reach = (long)r->pos + q.n + (q.tokens == &r->last ? r->spec_k : 0); /* positions it may write */
        while ((long)r->n_alloc * B < reach) {
            int b = r->reserved > 0 ? nv_kv_alloc(&s->pool) : -1;
            if (b < 0) break;
            r->reserved--;
            if (r->wblocks) ring_take(s, r, r->n_alloc);
            r->blocks[r->n_alloc++] = b;
        }
        if ((long)r->n_alloc * B < reach) { /* cannot happen: admission (and grow) reserved every block */
            nv_log(NV_LOG_WARN, "serve: a sequence outgrew its KV reservation");
            remove_running(s, i--);
            retire(s, r, NV_FINISH_ERROR);
            continue;
        }
        for (int t = 0; t < q.n; t++) {
            int p = r->pos + t;
            nv_kv_record(&s->pool, r->blocks[p / B], p % B, q.tokens[t]);
        }
        if (r->lp_k >= 0) lp_reserve(r, r->n_lps + 1 + NV_MAX_SPEC); /* the most tokens a step samples */
        s->seqs[n] = q;
        s->step_req[n++] = r;
    }
    return n;
}

/* The step's drafts, with the lock released (the lookup scans each sequence's text, which only the
 * loop thread and its pool touch; blocks were taken for them under the lock), one sequence per
 * task; then their tokens are recorded in the sequences' own blocks. */
typedef struct {
    nv_sched *s;
    int n;
} draft_job;

static void draft_task(void *ctx, int task, int n_tasks) {
    const draft_job *j = ctx;
    nv_sched *s = j->s;
    for (int i = task; i < j->n; i += n_tasks) {
        nv_req *r = s->step_req[i];
        nv_batch_seq *q = &s->seqs[i];
        if (q->tokens != &r->last || r->spec_k <= 0 || (s->o.draft && !r->pred.n)) continue;
        int nd = 0;
        if (r->pred.n) /* the prediction first, then the lookup where it has nothing */
            nd = r->pred_step = nv_pred_draft(&r->pred, r->ctx + r->n_prompt, r->n_ctx - r->n_prompt, s->o.spec_ngram_min,
                                              s->o.spec_ngram_max, r->spec_k, r->spec_rows + 1);
        if (nd <= 0) nd = nv_ngram_draft(r->ctx, r->n_ctx, s->o.spec_ngram_min, s->o.spec_ngram_max, r->spec_k, r->spec_rows + 1);
        if (nd <= 0) continue;
        r->spec_rows[0] = r->last;
        q->tokens = r->spec_rows;
        q->n = q->logits = 1 + nd;
    }
}

/* The draft model's part of a step (loop thread, lock released): first one pass over every
 * sequence's rows of ctx from its dvalid up to the model's rows of this step (catching up at most
 * prefill_chunk rows beyond them in all), with the logits of the decode row of each sequence that
 * is caught up and may draft; then a pass per further draft, each drafting sequence feeding its
 * previous greedy token. A pass that fails stops drafting for good (the answers are the model's
 * either way). */
static int draft_pass(nv_sched *s, int nd, const char *what) {
    if (nv_batch_forward(s->o.draft, &s->dbs, &s->dpages, s->dseqs, nd) == NV_OK) return 1;
    nv_warn("serve: the draft model's %s failed (%s); speculative decoding is off from now on", what, nv_errmsg());
    s->draft_off = 1;
    return 0;
}

/* Draft j + 1 of r from the draft's logits; r's drafts stop at j where the draft doubts it. */
static void take_draft(nv_sched *s, nv_req *r, int j, const float *logits) {
    const int tok = nv_draft_token(logits, s->o.draft->config.vocab_size, s->o.draft_p_min);
    if (tok < 0) r->dk = j;
    else r->spec_rows[j + 1] = tok;
}

static void draft_model_rows(nv_sched *s, int n) {
    const nv_config *dc = &s->o.draft->config;
    int budget = s->o.prefill_chunk, nd = 0, kmax = 0;
    for (int i = 0; i < n; i++) {
        nv_req *r = s->step_req[i];
        const nv_batch_seq *q = &s->seqs[i];
        r->dk = 0;
        r->dnext = r->dvalid;
        if (r->embed || !r->ctx) continue;
        int end = q->pos + q->n; /* the model's rows of ctx this step (a decode row feeds ctx[pos]) */
        if (end > s->dlimit) end = s->dlimit;
        if (end > r->n_ctx) end = r->n_ctx;
        int rows = end - r->dvalid;
        if (rows <= 0) continue;
        if (rows > q->n + budget) rows = q->n + budget;
        if (rows > q->n) budget -= rows - q->n;
        nv_batch_seq d = {.tokens = r->ctx + r->dvalid, .n = rows, .pos = r->dvalid, .blocks = r->blocks};
        r->dnext = r->dvalid + rows;
        /* caught up: the decode row's logits give the first draft */
        if (q->tokens == &r->last && !r->pred.n && r->spec_k > 0 && r->dnext == q->pos + 1 && q->pos + r->spec_k <= s->dlimit) {
            d.logits = 1;
            r->dk = r->spec_k;
            if (r->dk > kmax) kmax = r->dk;
        }
        s->dseqs[nd] = d;
        s->dreq[nd++] = r;
    }
    if (!nd || !draft_pass(s, nd, "catch-up pass")) {
        for (int i = 0; i < n; i++) s->step_req[i]->dk = 0, s->step_req[i]->dnext = s->step_req[i]->dvalid;
        return;
    }
    for (int i = 0; i < nd; i++)
        if (s->dreq[i]->dk) take_draft(s, s->dreq[i], 0, nv_batch_logits(&s->dbs, dc, i));
    for (int j = 1; j < kmax; j++) { /* draft j + 1 from draft j, fed at pos + j */
        int m = 0;
        for (int i = 0; i < n; i++) {
            nv_req *r = s->step_req[i];
            if (r->dk <= j) continue;
            s->dseqs[m] = (nv_batch_seq){.tokens = &r->spec_rows[j], .n = 1, .pos = s->seqs[i].pos + j, .blocks = r->blocks, .logits = 1};
            s->dreq[m++] = r;
        }
        if (!m) break; /* every sequence's drafts stopped (draft_p_min) */
        if (!draft_pass(s, m, "draft pass")) {
            for (int i = 0; i < n; i++) s->step_req[i]->dk = 0;
            return;
        }
        for (int i = 0; i < m; i++) take_draft(s, s->dreq[i], j, nv_batch_logits(&s->dbs, dc, i));
    }
    for (int i = 0; i < n; i++) {
        nv_req *r = s->step_req[i];
        if (!r->dk) continue;
        r->spec_rows[0] = r->last;
        s->seqs[i].tokens = r->spec_rows;
        s->seqs[i].n = s->seqs[i].logits = 1 + r->dk;
    }
}

static void draft_rows(nv_sched *s, int n) {
    int preds = 0;
    for (int i = 0; i < n && !preds; i++) preds = s->step_req[i]->pred.n && s->step_req[i]->spec_k > 0;
    if ((s->o.spec_tokens && !s->o.draft) || preds) {
        draft_job j = {s, n};
        nv_pool_run(draft_task, &j, n);
    }
    if (s->o.draft && !s->draft_off) draft_model_rows(s, n);
    const int B = s->pool.block_size;
    for (int i = 0; i < n; i++) {
        const nv_batch_seq *q = &s->seqs[i];
        nv_req *r = s->step_req[i];
        if (q->tokens != r->spec_rows) continue;
        for (int t = 1; t < q->n; t++) nv_kv_record(&s->pool, r->blocks[(q->pos + t) / B], (q->pos + t) % B, q->tokens[t]);
    }
}

/* Moves what is safe of r's pending text to r->emit (everything when final). */
static void flush_text(nv_req *r, int final) {
    size_t n = r->pending.len, keep = 0;
    if (n) {
        if (!final) {
            keep = nv_stop_holdback(r->pending.data, n, (const char *const *)r->stop, r->n_stop);
            size_t u = nv_utf8_incomplete_tail(r->pending.data, n);
            if (u > keep) keep = u;
        }
        nv_utf8_sanitize(&r->emit, r->pending.data, n - keep);
        nv_buf_consume(&r->pending, n - keep);
        r->pend_done += n - keep;
    }
    /* the log-prob records whose text has now left pending go with it (empty pieces too) */
    while (r->lp_flushed < r->n_lps && r->lp_span[r->lp_flushed].end <= r->pend_done) r->lp_flushed++;
}

/* Appends a token's record for a token whose text takes the next len bytes (the room was made
 * under the lock by lp_reserve: the records move only while no poller reads them). */
static void lp_record(nv_req *r, const nv_token_lp *lp, size_t len) {
    if (r->n_lps == r->cap_lps) return; /* lp_reserve failed and turned the records off */
    r->lps[r->n_lps] = *lp;
    r->lp_span[r->n_lps] = (struct lp_span){r->pend_total, r->pend_total + len};
    r->n_lps++;
}

/* The log-softmax of raw logits at tok, and the k most likely tokens (ties: the lower id first). */
static void lp_compute(const float *raw, int n, int tok, int k, nv_token_lp *out) {
    float maxv = raw[0];
    for (int i = 1; i < n; i++)
        if (raw[i] > maxv) maxv = raw[i];
    double sum = 0.0;
    out->rank = 1;
    for (int i = 0; i < n; i++) sum += expf(raw[i] - maxv), out->rank += raw[i] > raw[tok];
    const float lse = maxv + (float)log(sum);
    out->tok = tok;
    out->logprob = raw[tok] - lse;
    out->n_top = 0;
    for (int i = 0; i < n && k > 0; i++) {
        if (out->n_top == k && !(raw[i] > out->top_lp[k - 1])) continue;
        int j = out->n_top < k ? out->n_top++ : k - 1;
        while (j > 0 && raw[i] > out->top_lp[j - 1]) {
            out->top_lp[j] = out->top_lp[j - 1];
            out->top_tok[j] = out->top_tok[j - 1];
            j--;
        }
        out->top_lp[j] = raw[i];
        out->top_tok[j] = i;
    }
    for (int j = 0; j < out->n_top; j++) out->top_lp[j] -= lse;
}

/* 1 when tok ends r's answer: an end-of-generation token (unless ignore_eos), or one of its stop_token_ids. */
static int ends_answer(const nv_sched *s, const nv_req *r, int tok) {
    for (int i = 0; i < r->n_stop_ids; i++)
        if (tok == r->stop_ids[i]) return 1;
    return !r->ignore_eos && nv_tokenizer_is_eog(s->tok, tok);
}

/* A sampled token (lp: its log-probability record): text, stop strings, limits (loop thread, no
 * lock). The sampler has counted it already (sample_task). */
static void on_token(nv_sched *s, nv_req *r, int tok, nv_token_lp *lp, double now) {
    const nv_config *c = &s->model->config;
    if (ends_answer(s, r, tok)) {
        r->fin = NV_FINISH_STOP;
        /* vLLM's stop_reason: the token id, but for the vocabulary's own EOS (an end token besides it, as
           <|eom_id|> or Qwen's <|endoftext|>, vLLM reads from the generation config as a stop token id) */
        if (r->ignore_eos || (tok != nv_tokenizer_eos(s->tok) && tok != nv_tokenizer_bos(s->tok))) r->stop_tok = tok;
        if (r->include_stop) { /* include_stop_str_in_output: the ending token's text stays, with its record */
            const char *piece = nv_tokenizer_answer_piece(s->tok, r->last, tok, r->keep_special);
            lp->prev = r->last;
            if (r->lp_k >= 0) lp_record(r, lp, strlen(piece));
            nv_buf_puts(&r->pending, piece), r->pend_total += strlen(piece);
        }
        flush_text(r, 1);
        return;
    }
    lp->prev = r->last;
    /* (an end token ignore_eos lets through adds no text: vLLM skips special tokens likewise) */
    const char *piece = nv_tokenizer_answer_piece(s->tok, r->last, tok, r->keep_special);
    r->last = tok;
    r->n_gen++;
    if (r->ctx && r->n_ctx < r->cap_ctx) r->ctx[r->n_ctx++] = tok;
    if (r->pred.n) nv_pred_follow(&r->pred, tok);
    size_t piece_len = piece ? strlen(piece) : 0;
    if (r->lp_k >= 0) lp_record(r, lp, piece_len);
    r->pend_total += piece_len;
    if (r->n_gen == 1) nv_metrics_ttft(s->metrics, now - r->t_arrival), r->t_first = now;
    else nv_metrics_itl(s->metrics, now - r->t_last);
    r->t_last = now;
    if (piece) nv_buf_puts(&r->pending, piece);
    if (r->n_stop && r->pending.len) {
        size_t cut = (size_t)-1;
        int hit_i = -1;
        for (int i = 0; i < r->n_stop; i++) {
            const char *hit = memmem(r->pending.data, r->pending.len, r->stop[i], strlen(r->stop[i]));
            if (hit && (size_t)(hit - r->pending.data) < cut) {
                cut = (size_t)(hit - r->pending.data);
                r->stop_hit = r->stop_src[i];
                hit_i = i;
            }
        }
        if (cut != (size_t)-1) {
            if (r->include_stop && r->stop_src[hit_i] < r->n_own_stop) cut += strlen(r->stop[hit_i]); /* the request's own stays */
            r->pending.len = cut;
            r->pending.data[cut] = '\0';
            r->fin = NV_FINISH_STOP;
            /* tokens whose text lies wholly in the stop string are not part of the answer */
            r->pend_total = r->pend_done + cut;
            while (r->n_lps > r->lp_flushed && r->lp_span[r->n_lps - 1].start >= r->pend_total) r->n_lps--;
            if (r->n_lps > 0 && r->lp_span[r->n_lps - 1].end > r->pend_total) r->lp_span[r->n_lps - 1].end = r->pend_total;
        }
    }
    /* a whole sentence that nothing may follow: the answer is complete (no step spent on EOS) */
    if (!r->fin && r->gs.m && (!r->lazy.g || r->lazy_ends) && nv_gmatch_finished(r->gs.m)) r->fin = NV_FINISH_STOP;
    if (!r->fin && (r->n_gen >= r->max_tokens || r->pos >= c->seq_len)) r->fin = NV_FINISH_LENGTH;
    flush_text(r, r->fin != NV_FINISH_NONE);
}

/* Hashes r's newly full blocks by chain and indexes them (lock held): the RAM tier, and a
 * write to the SSD tier for each block indexed for the first time. */
static void index_full_blocks(nv_sched *s, nv_req *r) {
    int B = s->pool.block_size, full = r->pos;
    /* with a draft model, a block whose draft keys and values are not whole yet waits (one past the
       draft's context has none to wait for) */
    if (s->o.draft && !s->draft_off && r->dvalid < full && r->dvalid < s->dlimit) full = r->dvalid;
    while ((long)(r->n_hashed + 1) * B <= full && r->n_hashed < r->n_alloc) {
        int k = r->n_hashed;
        int32_t b = r->blocks[k];
        uint64_t parent = chain_parent(r, k);
        uint64_t h = k < r->n_lookup ? r->hashes[k]
                                     : nv_prefix_chain(s->prefix.model_id, parent, (const int *)s->pool.tokens + (size_t)b * B, B);
        r->hashes[k] = h;
        r->n_hashed++;
        if (nv_prefix_insert(&s->prefix, b, h, parent)) disk_write(s, b, h, parent);
        if (s->wdisk) wdisk_write(s, r, k, h, parent);
    }
}

/* A token inside the request's grammar; -1 where no token can continue it (a vocabulary missing a
 * byte it needs): the request then fails rather than end with a truncated text called whole. */
static int sample_in_grammar(nv_sched *s, nv_req *r, int prev, float *logits) {
    int tok = nv_gsample(&r->gs, s->trie, s->tok, &r->sampler, prev, logits);
    if (tok < 0) nv_log(NV_LOG_WARN, "serve: no token of the vocabulary continues the request's grammar; the request fails");
    return tok;
}

/* A lazy grammar after token tok (following prev): one that is on goes off when its sentence is
 * whole (unless that ends the answer: on_token does it); one that is off comes on at its trigger. */
static void lazy_step(nv_sched *s, nv_req *r, int prev, int tok) {
    if (tok < 0 || nv_tokenizer_is_eog(s->tok, tok)) return;
    if (r->gs.m) {
        if (nv_gmatch_finished(r->gs.m) && !r->lazy_ends) grammar_costs(r), nv_gsampler_free(&r->gs);
        return;
    }
    if (nv_glazy_step(&r->lazy, &r->gs, s->model->config.vocab_size, nv_tokenizer_decode(s->tok, prev, tok)) < 0)
        nv_log(NV_LOG_WARN, "serve: out of memory following a tool call's grammar; the call goes unconstrained");
}

/* allowed_token_ids and bad_words on a row's logits: every token outside the allowed ones, and each
 * bad word's last token where the answer so far ends with the rest of it, gets -inf. 0 when no token
 * is left (with min_tokens' end tokens gone too): nothing can be sampled. */
static int token_filters(const nv_sched *s, const nv_req *r, float *logits) {
    const int n = s->model->config.vocab_size;
    if (r->allowed)
        for (int v = 0; v < n; v++)
            if (!r->allowed[v]) logits[v] = -INFINITY;
    for (int k = 0, at = 0; k < r->n_bad; at += r->bad_len[k], k++) {
        const int *w = r->bad_tok + at, m = r->bad_len[k] - 1; /* the rest: its first m tokens */
        if (m <= r->n_hist && !memcmp(r->bad_hist + r->n_hist - m, w, (size_t)m * sizeof(int))) logits[w[m]] = -INFINITY;
    }
    if (!r->allowed && !r->n_bad) return 1;
    for (int v = 0; v < n; v++)
        if (logits[v] > -INFINITY) return 1;
    return 0;
}

/* A reasoning budget before a row is sampled (prev: the answer's last token): forcing begins once the
 * block has spent its tokens (and its text ends on a whole character), where the request's grammar,
 * if any, takes the whole closing; one that does not keeps its own way (the budget is dropped). */
static void think_check(const nv_sched *s, nv_req *r, int prev) {
    if (r->force_at >= 0 || r->think_budget < 0 || r->thk.state != NV_THINK_IN || r->think_n < r->think_budget || r->think_u8) return;
    int takes = 1;
    if (r->gs.m) {
        nv_buf text = {0};
        for (int i = 0; i < r->n_think_close; i++) nv_buf_puts(&text, nv_tokenizer_decode(s->tok, i ? r->think_close[i - 1] : prev, r->think_close[i]));
        takes = !text.oom && nv_gmatch_try(r->gs.m, text.data ? text.data : "", text.len) == 1;
        nv_buf_free(&text);
    }
    if (takes) r->force_at = 0;
    else r->think_budget = -1;
}

/* The think block after token tok (following prev), for the budget: the tokens spent inside it, and
 * the forcing's end (the budget is then spent for good). */
static void think_step(nv_sched *s, nv_req *r, int prev, int tok) {
    if (r->think_budget < 0) return;
    if (r->force_at >= 0) { /* a forced token */
        if (++r->force_at == r->n_think_close) r->force_at = -1, r->think_budget = -1;
        return;
    }
    const char *piece = nv_tokenizer_decode(s->tok, prev, tok);
    const size_t n = piece ? strlen(piece) : 0;
    const int was_in = r->thk.state == NV_THINK_IN;
    nv_think_feed(&r->thk, piece ? piece : "", n, 0, NULL, NULL);
    if (r->thk.state >= NV_THINK_PAST) { /* closed by the model, or no block: nothing to count */
        r->think_budget = -1;
        return;
    }
    r->think_n += was_in && r->thk.state == NV_THINK_IN;
    for (size_t i = 0; i < n; i++) { /* continuation bytes still owed to the last character */
        const unsigned char b = (unsigned char)piece[i];
        r->think_u8 = (b & 0xC0) == 0x80 ? (r->think_u8 ? r->think_u8 - 1 : 0) : utf8_need(b) > 0 ? utf8_need(b) - 1 : 0;
    }
}

/* Samples the step's sequences on the pool: each has its own sampler and logits row, and a
 * softmax over the vocabulary per sequence is a few percent of a step worth sharing out. */
typedef struct {
    nv_sched *s;
    int n;
} sample_job;

/* Sequence i's tokens of this step, row by row: what one row per step would sample from each
 * (the rows' logits are the same bits), going on to the next row only while the token equals
 * the draft that row was fed, and stopping where the answer must end (an end token, a whole
 * grammar sentence). */
static void sample_rows(nv_sched *s, int i) {
    const nv_config *c = &s->model->config;
    nv_req *r = s->step_req[i];
    const nv_batch_seq *q = &s->seqs[i];
    const int n = c->vocab_size, first = q->n - q->logits; /* the first row with logits */
    int prev = r->last;
    r->n_outs = r->outs_fail = 0;
    if (r->n_score) { /* a scoring request: its last row's logits of its tokens (or its head's: head_scores), nothing sampled */
        const float *logits = q->logits && !s->model->cls_head ? nv_batch_logits_at(&s->bs, c, i, 0) : NULL;
        for (int k = 0; logits && k < r->n_score; k++) r->scores[k] = logits[r->score_tok[k]];
        r->scored |= logits != NULL;
        return;
    }
    for (int j = 0; j < q->logits; j++) {
        float *logits = nv_batch_logits_at(&s->bs, c, i, j);
        if (r->lp_k >= 0) memcpy(r->lp_raw, logits, (size_t)n * sizeof(float));
        if (r->n_gen + j < r->min_tokens) { /* min_tokens: the answer may not end yet */
            for (int e = 0; e < s->n_eog; e++) logits[s->eog_ids[e]] = -INFINITY;
            for (int e = 0; e < r->n_stop_ids; e++) logits[r->stop_ids[e]] = -INFINITY;
        }
        const int left = token_filters(s, r, logits);
        think_check(s, r, prev);
        int tok;
        if (r->force_at >= 0) { /* the budget is spent: the block's closing, whatever the logits say */
            tok = r->think_close[r->force_at];
            if (r->gs.m && nv_gmatch_accept(r->gs.m, s->tok, prev, tok) <= 0) tok = -1; /* (out of memory) */
        } else if (!left) {
            nv_log(NV_LOG_WARN, "serve: allowed_token_ids, bad_words and min_tokens leave no token to sample; the request fails");
            tok = -1;
        } else {
            tok = r->gs.m ? sample_in_grammar(s, r, prev, logits) : nv_sample(&r->sampler, logits);
        }
        if (tok < 0) { /* the tokens before it are still the answer's, as they would be one row a step */
            r->outs_fail = 1;
            return;
        }
        if (r->lp_k >= 0) lp_compute(r->lp_raw, n, tok, r->lp_k, &r->lp_steps[j]);
        r->outs[r->n_outs++] = tok;
        if (ends_answer(s, r, tok)) return;
        nv_sampler_accept(&r->sampler, tok);
        if (r->bad_hist) r->bad_hist[r->n_hist++] = tok;
        think_step(s, r, prev, tok);
        if (r->lazy.g) lazy_step(s, r, prev, tok);
        if (r->gs.m && (!r->lazy.g || r->lazy_ends) && nv_gmatch_finished(r->gs.m)) return;
        if (j + 1 == q->logits || q->tokens[first + j + 1] != tok) return; /* the next row was fed another token */
        prev = tok;
    }
}

static void sample_task(void *ctx, int task, int n_tasks) {
    const sample_job *j = ctx;
    for (int i = task; i < j->n; i += n_tasks) sample_rows(j->s, i);
}

/* Prompt log-probabilities: the logits of every prompt row of this step whose next token is in
 * the prompt (row p scores token p + 1), PLP_ROWS rows per classifier product, each row's
 * log-softmax on the pool. */
#define PLP_ROWS 16
typedef struct {
    nv_sched *s;
    nv_req *r;
    int p0; /* position of the first row */
} plp_job;

static void plp_task(void *ctx, int task, int n_tasks) {
    const plp_job *j = ctx;
    const int vocab = j->s->model->config.vocab_size;
    (void)n_tasks;
    nv_token_lp *rec = &j->r->plps[j->p0 + task + 1];
    lp_compute(j->s->plp_logits + (size_t)task * vocab, vocab, j->r->prompt[j->p0 + task + 1], j->r->plp_k, rec);
    rec->prev = j->r->prompt[j->p0 + task];
}

static void prompt_logprobs(nv_sched *s, int n) {
    const int vocab = s->model->config.vocab_size, chunk = PLP_ROWS < s->bs.max_rows ? PLP_ROWS : s->bs.max_rows;
    for (int i = 0, row = 0; i < n; row += s->seqs[i].n, i++) {
        nv_req *r = s->step_req[i];
        const nv_batch_seq *q = &s->seqs[i];
        if (!r->plps || r->plp_ready || q->pos >= r->n_prompt) continue; /* (once whole, a replay's rows add nothing) */
        int scored = r->n_prompt - 1 - q->pos < q->n ? r->n_prompt - 1 - q->pos : q->n; /* rows with a next prompt token */
        if (scored > 0 && !s->plp_logits && !(s->plp_logits = malloc((size_t)chunk * vocab * sizeof(float)))) {
            nv_log(NV_LOG_WARN, "serve: out of memory for prompt log-probabilities");
            r->fin = NV_FINISH_ERROR;
            continue;
        }
        for (int t = 0; t < scored; t += chunk) {
            int c = scored - t < chunk ? scored - t : chunk;
            if (nv_batch_row_logits(s->model, &s->bs, row + t, c, s->plp_logits) != NV_OK) {
                nv_log(NV_LOG_WARN, "serve: prompt log-probabilities: %s", nv_errmsg());
                r->fin = NV_FINISH_ERROR;
                break;
            }
            plp_job j = {s, r, q->pos + t};
            nv_pool_run(plp_task, &j, c);
        }
    }
}

/* Embeddings: each embed request's rows of this step through the final norm, summed (loop thread;
 * the rows' residual stream is what the step left in the batch state): every row for the mean, else
 * only the prompt's first or last. */
static void embed_rows(nv_sched *s, int n) {
    const nv_model *m = s->model;
    const int d = m->config.dim;
    float *tmp = s->embed_tmp;
    for (int i = 0, row = 0; i < n; row += s->seqs[i].n, i++) {
        nv_req *r = s->step_req[i];
        if (!r->embed_sum) continue;
        for (int t = 0; t < s->seqs[i].n; t++) {
            const int p = s->seqs[i].pos + t;
            if ((s->o.pooling == NV_POOLING_CLS && p != 0) || (s->o.pooling == NV_POOLING_LAST && p != r->n_prompt - 1)) continue;
            nv_rmsnorm(tmp, s->bs.r.x + (size_t)(row + t) * d, m->w.rms_final, d, m->config.norm_eps);
            for (int j = 0; j < d; j++) r->embed_sum[j] += tmp[j];
        }
        r->embed_rows += s->seqs[i].n;
    }
}

/* A model with a classification head (a GGUF reranker's): each scoring request's last row through
 * the final norm and the head (loop thread). */
static void head_scores(nv_sched *s, int n) {
    const nv_model *m = s->model;
    const int d = m->config.dim;
    if (!m->cls_head) return;
    for (int i = 0, row = 0; i < n; row += s->seqs[i].n, i++) {
        nv_req *r = s->step_req[i];
        if (!r->n_score || !s->seqs[i].logits) continue;
        nv_rmsnorm(s->embed_tmp, s->bs.r.x + (size_t)(row + s->seqs[i].n - 1) * d, m->w.rms_final, d, m->config.norm_eps);
        for (int k = 0; k < r->n_score && k < m->n_cls_head; k++) {
            const float *w = m->cls_head + (size_t)k * d;
            double sum = m->cls_head[(size_t)m->n_cls_head * d + k];
            for (int j = 0; j < d; j++) sum += (double)w[j] * s->embed_tmp[j];
            r->scores[k] = (float)sum;
        }
        r->scored = 1;
    }
}

int nv_req_embedding(nv_sched *s, nv_req *r, float *out, int dim) {
    pthread_mutex_lock(&s->mu);
    int ok = r->done && r->finish == NV_FINISH_LENGTH && r->embed_sum && r->embed_rows == r->n_prompt && dim == s->model->config.dim;
    if (ok) { /* the pooled rows made unit length: the sum made unit length (as OpenAI's embeddings are) */
        double norm = 0;
        for (int j = 0; j < dim; j++) norm += r->embed_sum[j] * r->embed_sum[j];
        norm = sqrt(norm);
        for (int j = 0; j < dim; j++) out[j] = (float)(norm > 0 ? r->embed_sum[j] / norm : 0.0);
    }
    pthread_mutex_unlock(&s->mu);
    return ok;
}

int nv_req_scores(nv_sched *s, nv_req *r, float *out) {
    pthread_mutex_lock(&s->mu);
    const int ok = r->done && r->finish == NV_FINISH_LENGTH && r->n_score && r->scored;
    if (ok) memcpy(out, r->scores, (size_t)r->n_score * sizeof *out);
    pthread_mutex_unlock(&s->mu);
    return ok;
}

static void *sched_loop(void *arg) {
    nv_sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        reap_disk(s);
        sweep(s, nv_now());
        if (s->stopping == 2) break;
        admit(s);
        restore_from_disk(s);
        grow(s);
        if (s->n_running == 0) {
            cond_wait_s(&s->cv, &s->mu, 0.1);
            continue;
        }
        int n = plan_step(s);
        if (n == 0) { /* every sequence waits (reading from disk, or stalled): the lock goes a moment */
            cond_wait_s(&s->cv, &s->mu, 0.002);
            continue;
        }
        pthread_mutex_unlock(&s->mu);

        draft_rows(s, n);
        int rows = 0;
        for (int i = 0; i < n; i++) rows += s->seqs[i].n;
        nv_err e = nv_batch_forward(s->model, &s->bs, &s->pool.pages, s->seqs, n);
        double now = nv_now();
        if (e != NV_OK) nv_log(NV_LOG_WARN, "serve: forward failed: %s", nv_errmsg());
        else {
            prompt_logprobs(s, n);
            embed_rows(s, n);
            head_scores(s, n);
            sample_job sj = {s, n};
            nv_pool_run(sample_task, &sj, n);
        }
        unsigned long drafts = 0, drafted = 0, accepted = 0;
        for (int i = 0; i < n; i++) {
            nv_req *r = s->step_req[i];
            const nv_batch_seq *q = &s->seqs[i];
            if (s->o.draft) r->dvalid = r->dnext;
            if (e != NV_OK) {
                r->fin = NV_FINISH_ERROR;
                continue;
            }
            if (!q->logits || r->n_score) {
                r->pos += q->n;
                if (r->max_tokens == 0 && r->pos >= r->n_prompt && !r->fin) r->fin = NV_FINISH_LENGTH; /* prompt only */
                continue;
            }
            /* token j came from row q->n - q->logits + j: the rows up to it hold the sequence's keys and values */
            int used = 0;
            for (; used < r->n_outs && !r->fin; used++) {
                r->pos = q->pos + q->n - q->logits + used + 1;
                on_token(s, r, r->outs[used], &r->lp_steps[used], now);
            }
            if (r->outs_fail && !r->fin) r->fin = NV_FINISH_ERROR;
            if (q->n == q->logits && q->n > 1) { /* a decode row with drafts */
                /* the drafts the model agreed with, of the tokens the answer took (none after its end) */
                int agreed = 0;
                while (agreed < used && agreed + 1 < q->n && r->outs[agreed] == q->tokens[agreed + 1]) agreed++;
                drafts++;
                drafted += (unsigned long)(q->n - 1);
                accepted += (unsigned long)agreed;
                nv_spec_update(&r->spec, agreed, agreed < used && agreed + 1 < q->n); /* a token the answer took differed from its draft */
                if (r->pred_step) r->pred_acc += agreed, r->pred_rej += q->n - 1 - agreed;
                if (r->dk) r->dvalid += nv_draft_kept(agreed, r->dk);
            }
        }
        if (drafts) nv_metrics_spec(s->metrics, drafts, drafted, accepted);
        nv_metrics_step(s->metrics, rows);
        if (s->o.step_delay_ms > 0) usleep((useconds_t)s->o.step_delay_ms * 1000u);

        pthread_mutex_lock(&s->mu);
        for (int i = 0; i < n; i++) {
            nv_req *r = s->step_req[i];
            /* an embedded document's blocks are not kept for others (no one asks for its prefix) */
            if (s->prefix_on && e == NV_OK && !r->embed) index_full_blocks(s, r);
            if (s->wring && s->prefix_on && e == NV_OK && !r->embed) {
                if (r->snap_at && r->pos >= (long)r->snap_at * s->pool.block_size) ckpt_snapshot(s, r, r->snap_at), r->snap_at = 0;
                if (!r->snapped && r->pos >= r->n_prompt) ckpt_snapshot(s, r, r->n_hashed), r->snapped = 1;
            }
            if (r->emit.len) {
                nv_buf_append(&r->out, r->emit.data, r->emit.len);
                nv_buf_consume(&r->emit, r->emit.len);
            }
            r->lp_pub = r->lp_flushed;
            r->n_gen_pub = r->n_gen;
            r->pred_acc_pub = r->pred_acc, r->pred_rej_pub = r->pred_rej;
            r->t_first_pub = r->t_first, r->t_last_pub = r->t_last;
            if (r->plps && r->pos >= r->n_prompt && r->fin != NV_FINISH_ERROR) r->plp_ready = 1; /* never half-computed records */
            if (r->fin != NV_FINISH_NONE) {
                remove_running_req(s, r);
                retire(s, r, r->fin);
            } else {
                pthread_cond_broadcast(&r->cv);
            }
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

nv_err nv_sched_start(nv_sched *s) {
    if (pthread_create(&s->thread, NULL, sched_loop, s) != 0)
        return nv_fail(NV_ENOMEM, "scheduler: cannot start the loop thread");
    s->started = 1;
    return NV_OK;
}

/* The requests waiting that count against max_queue for a new one: not those preempted (they were
 * running), and for an interactive one not the background ones either. */
static int waiting_counted(const nv_sched *s, int background) {
    int n = 0;
    for (const nv_req *r = s->wait_head; r; r = r->next) n += !r->preempted && (background || !r->background);
    return n;
}

nv_submit nv_sched_submit(nv_sched *s, nv_req *r, int background) {
    const nv_config *c = &s->model->config;
    long positions = (long)r->n_prompt + (r->max_tokens > 0 ? r->max_tokens - 1 : 0);
    if (positions > c->seq_len) positions = c->seq_len;
    r->blocks_needed = nv_kv_blocks_for(&s->pool, positions);
    pthread_mutex_lock(&s->mu);
    nv_submit res = NV_SUBMIT_OK;
    if (s->stopping) res = NV_SUBMIT_STOPPING;
    else if (r->blocks_needed > s->pool.n_blocks) res = NV_SUBMIT_TOO_BIG;
    else if (waiting_counted(s, background) >= s->o.max_queue) res = NV_SUBMIT_QUEUE_FULL;
    else if (r->lora.n && !r->pinned && !nv_adapters_pin_mix(s->o.adapters, &r->lora))
        res = NV_SUBMIT_NO_ADAPTER; /* removed (or its slot given to another) since the request named it */
    if (res == NV_SUBMIT_OK) {
        if (r->lora.n) r->pinned = s->o.adapters;
        r->root = nv_adapters_mix_root(s->o.adapters, &r->lora);
        r->slot.task = ++s->submitted;
        r->refs++;
        r->background = background;
        enqueue(s, r); /* (its task the latest: behind its equals) */
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return res;
}

void nv_sched_drain(nv_sched *s) {
    pthread_mutex_lock(&s->mu);
    if (s->stopping < 1) s->stopping = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

int nv_sched_busy(nv_sched *s) {
    pthread_mutex_lock(&s->mu);
    int n = s->n_waiting + s->n_running;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void nv_sched_stop(nv_sched *s) {
    if (!s->started) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 2;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    s->started = 0;
    /* the loop retires everything before it exits; anything left was never admitted */
    pthread_mutex_lock(&s->mu);
    sweep(s, nv_now());
    pthread_mutex_unlock(&s->mu);
}

void nv_sched_free(nv_sched *s) {
    nv_sched_stop(s);
    disk_free_all(s); /* the writers finish their queues; then every pinned block comes back */
    nv_prefix_free(&s->prefix);
    free(s->restore);
    free(s->plp_logits);
    nv_gtrie_free(s->trie);
    s->trie = NULL;
    if (s->inited) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
    }
    free(s->running);
    free(s->eog_ids);
    free(s->step_req);
    free(s->victims);
    free(s->held);
    free(s->embed_tmp);
    free(s->seqs);
    nv_batch_state_free(&s->bs);
    while (s->n_ckpts) ckpt_drop(s, s->n_ckpts - 1);
    free(s->ckpts);
    nv_kv_pool_free(&s->pool);
    nv_kv_pool_free(&s->wpool);
    free(s->dseqs);
    free(s->dreq);
    nv_batch_state_free(&s->dbs);
    nv_kv_pages_free(&s->dpages);
    memset(s, 0, sizeof *s);
}

int nv_sched_slots(nv_sched *s, nv_slot *out, int cap) {
    pthread_mutex_lock(&s->mu);
    int n = 0;
    for (int i = 0; i < s->n_running && n < cap; i++) {
        const nv_req *r = s->running[i];
        out[n] = r->slot;
        out[n].n_cached = r->n_cached;
        out[n].n_decoded = r->n_gen_pub;
        out[n++].generating = r->n_gen_pub > 0;
    }
    pthread_mutex_unlock(&s->mu);
    return n;
}

void nv_sched_gauges(nv_sched *s, nv_metrics_gauges *g) {
    memset(g, 0, sizeof *g);
    pthread_mutex_lock(&s->mu);
    g->waiting = s->n_waiting;
    g->running = s->n_running;
    g->kv_in_use = nv_kv_in_use(&s->pool);
    g->kv_total = s->pool.n_blocks;
    g->kv_reserved = s->pool.n_reserved;
    g->kv_block_size = s->pool.block_size;
    g->kv_block_bytes = s->pool.block_bytes;
    if (s->wring) {
        g->kv_window_total = s->wpool.n_blocks;
        g->kv_window_in_use = nv_kv_in_use(&s->wpool) - s->ckpt_blocks;
        g->kv_window_kept = s->ckpt_blocks;
        g->kv_window_reserved = s->wpool.n_reserved;
        g->kv_window_block_bytes = s->wpool.block_bytes;
    }
    g->max_batch = s->o.max_batch;
    g->prefix_on = s->prefix_on;
    g->kv_idle = s->pool.n_idle;
    g->kv_evictions = s->pool.evictions;
    g->ram_blocks = s->prefix_on ? nv_prefix_blocks(&s->prefix) : 0;
    g->ram_max_idle = s->pool.max_idle;
    if ((g->lora_on = s->o.adapters != NULL)) {
        int numbers[NV_MAX_ADAPTERS];
        g->lora_n = nv_adapters_names(s->o.adapters, g->lora_name, numbers, NV_MAX_ADAPTERS);
        for (int j = 0; j < g->lora_n; j++) {
            for (int i = 0; i < s->n_running; i++) g->lora_running[j] += nv_adapter_mix_find(&s->running[i]->lora, numbers[j]) >= 0;
            for (const nv_req *r = s->wait_head; r; r = r->next) g->lora_waiting[j] += nv_adapter_mix_find(&r->lora, numbers[j]) >= 0;
        }
    }
    const uint64_t wstage_drops = s->wstage_drops; /* (the loop counts them under the lock) */
    pthread_mutex_unlock(&s->mu);
    g->disk_on = s->disk != NULL;
    if (s->disk) {
        nv_disk_stats_get(s->disk, &g->disk);
        g->disk_dir = nv_disk_dir(s->disk);
    }
    if (s->wdisk) { /* split pages: both parts of the tier together */
        nv_disk_stats w;
        nv_disk_stats_get(s->wdisk, &w);
        g->disk.writer_up &= w.writer_up;
        g->disk.files += w.files, g->disk.bytes += w.bytes, g->disk.max_bytes += w.max_bytes, g->disk.queue_depth += w.queue_depth;
        g->disk.writes += w.writes, g->disk.write_drops += w.write_drops + wstage_drops, g->disk.write_errors += w.write_errors;
        g->disk.evictions += w.evictions, g->disk.rejected += w.rejected, g->disk.loads += w.loads, g->disk.load_failures += w.load_failures;
    }
}
