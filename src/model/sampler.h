/* Token sampling: greedy, temperature, top-p, with llama2.c's generator and procedure, so the
 * same seed and settings pick the same tokens as llama2.c's run.c; top-k and min-p (vLLM's and
 * llama.cpp's filters) when set. */
#ifndef NV_SAMPLER_H
#define NV_SAMPLER_H

#include <stdint.h>

#include "base/err.h"
#include "model/tokenizer.h"

typedef struct {
    float prob;
    int index;
} nv_prob_index;

typedef struct {
    int vocab_size;
    float temperature; /* 0 = greedy */
    float top_p;       /* <= 0 or >= 1 disables nucleus sampling */
    int top_k;         /* > 0: only the k most likely tokens (0: off) */
    float min_p;       /* > 0: only tokens at least min_p x the most likely one's probability (0: off) */
    float typical_p;   /* in (0, 1): locally typical sampling (1: off) */
    float top_n_sigma; /* > 0: only tokens whose logit is within n standard deviations of the largest (off: <= 0) */
    float xtc_probability, xtc_threshold; /* XTC: off while the probability is 0 */
    float dynatemp_range, dynatemp_exponent; /* dynamic temperature: off while the range is 0 */
    float *aux;        /* [vocab] scratch for typical sampling */
    int mirostat;      /* 1 or 2: Mirostat's version, in place of the filters (0: off) */
    float mirostat_tau, mirostat_eta, mirostat_mu; /* target surprise, learning rate, the running bound */
    uint64_t rng_state;
    nv_prob_index *probindex; /* scratch for top-p */
    nv_prob_index *sortbuf;   /* [vocab] the radix sort's scratch, from the first long sort on (NULL before) */
    /* OpenAI's logit adjustments, applied to the raw logits before everything else (greedy too):
     * logit_bias adds bias[i] to token bias_tok[i]; a token generated c times so far loses
     * c * frequency + presence. Off (NULL / 0) unless set. */
    int n_bias;
    int *bias_tok;
    float *bias;
    float presence, frequency;
    int *counts;     /* [vocab] times each token was accepted, when a penalty is on */
    int *seen;       /* the distinct accepted tokens, in order */
    int n_seen;
    /* vLLM's (and Hugging Face's) repetition penalty: every token of the prompt or the answer so far
     * has its logit divided by it when positive, multiplied when not. 1 (or 0: unset) is off. */
    float repetition;
    unsigned char *present; /* [vocab] 1 for a token of the prompt or accepted */
    int *rep_list;          /* those tokens, each once */
    int n_rep;
    /* llama.cpp's penalties (nv_sampler_set_penalty_window): window > 0 counts the repetition,
     * frequency and presence penalties over the last `window` tokens of the prompt and the answer
     * (dry_hist holds them) in place of the whole texts above; < 0: no penalty; 0: not windowed */
    int window;
    int *win_count, *win_touched; /* [vocab] scratch */
    /* DRY (nv_sampler_set_dry): off while dry_multiplier is 0; dry_hist is also the window's history */
    float dry_multiplier, dry_base;
    int dry_allowed, dry_last_n;
    unsigned char *dry_breaker; /* [vocab] 1: the token ends a repeat */
    int *dry_hist, n_hist, cap_hist; /* the prompt and the accepted tokens */
    int *dry_len;                    /* [vocab] scratch: the longest repeat each token would extend */
    int *dry_touched;                /* [vocab] scratch: the tokens with a dry_len */
} nv_sampler;

nv_err nv_sampler_init(nv_sampler *s, int vocab_size, float temperature, float top_p, uint64_t seed);
void nv_sampler_free(nv_sampler *s);
/* logit_bias: n (token, bias) pairs, copied; tokens must be in the vocabulary. */
nv_err nv_sampler_set_bias(nv_sampler *s, const int *tok, const float *bias, int n);
/* presence and frequency penalties (OpenAI's: both 0 is off). */
nv_err nv_sampler_set_penalties(nv_sampler *s, float presence, float frequency);
/* top-k and min-p, applied to the probabilities after temperature, before top-p (which then takes
 * its share of what they kept), as vLLM does; greedy ignores them. top_k 0 and min_p 0 are off. */
nv_err nv_sampler_set_filters(nv_sampler *s, int top_k, float min_p);
/* llama.cpp's further filters (greedy ignores them): top_n_sigma on the logits after the temperature,
 * before everything else (Mirostat too); typical_p and XTC after top-k and min-p, before top-p:
 * typical_p in (0, 1] (1: off) keeps the tokens whose surprise is closest to the distribution's
 * entropy until their probability reaches typical_p (Meister et al.'s locally typical sampling);
 * top_n_sigma > 0 keeps the tokens whose logit is within n standard deviations of the largest
 * (<= 0: off); XTC ("exclude top choices"), with probability xtc_probability a draw, removes every
 * token of probability >= xtc_threshold but the least likely of them (0: off; it draws a second
 * random number only when on). */
nv_err nv_sampler_set_more(nv_sampler *s, float typical_p, float top_n_sigma, float xtc_probability, float xtc_threshold);
/* Dynamic temperature (llama.cpp's dynatemp_range and dynatemp_exponent): the temperature of each
 * draw is chosen in [max(0, T - range), T + range] by the entropy H of the distribution at
 * temperature 1 (after the bias and penalties) over the n tokens not masked out:
 * T' = lo + (hi - lo) x (H / ln n)^exponent, so a confident step is sampled colder and an unsure one
 * hotter (T' 0: the most likely token). llama.cpp measures H over what its filters left, which come
 * before its temperature; here the temperature comes first, as in vLLM, so H is the whole
 * distribution's. range 0 is off; range and exponent >= 0. */
nv_err nv_sampler_set_dynatemp(nv_sampler *s, float range, float exponent);
/* Mirostat (Basu et al., llama.cpp's mirostat 1 and 2): after the temperature (and top_n_sigma), in
 * place of top-k, min-p, top-p, typical_p and XTC, the candidates are cut so that the text's surprise (log2 of
 * 1 / p) tracks tau: version 2 keeps the tokens whose surprise is at most mu, version 1 the k most
 * likely with k from Zipf's exponent estimated over the 100 most likely; after each draw mu moves by
 * eta x (the drawn token's surprise - tau), from 2 tau. version 0 is off. */
nv_err nv_sampler_set_mirostat(nv_sampler *s, int version, float tau, float eta);
/* The repetition penalty (> 0; 1 is off) over the prompt's tokens and every token accepted after. */
nv_err nv_sampler_set_repetition(nv_sampler *s, float penalty, const int *prompt, int n_prompt);
/* DRY ("don't repeat yourself": llama.cpp's and koboldcpp's sampler): a token that would extend a
 * repeat of an earlier run of at least allowed_length tokens loses multiplier x base^(length -
 * allowed_length) from its logit (after the bias, before the other penalties). Repeats are looked for
 * in the last last_n tokens of the prompt and the answer (-1: all of them; 0: off), longest first up
 * to 64 tokens; a breaker token (breaker[tok] != 0, [vocab], copied; NULL: none) ends a run, so text
 * across it never counts as one repeat. multiplier 0 is off. */
nv_err nv_sampler_set_dry(nv_sampler *s, float multiplier, float base, int allowed_length, int last_n,
                          const unsigned char *breaker, const int *prompt, int n_prompt);
/* llama.cpp's penalties (its repeat_last_n): the repetition penalty (set with
 * nv_sampler_set_repetition), frequency and presence (nv_sampler_set_penalties) count the last
 * last_n tokens of the prompt and the answer: a token there has its logit divided by the repetition
 * penalty (multiplied when not positive) and loses count x frequency + presence. -1: every token of
 * them; 0: no penalty at all. Without it the penalties are OpenAI's and vLLM's (above). Call it after
 * those two: with all three neutral nothing is counted. */
nv_err nv_sampler_set_penalty_window(nv_sampler *s, int last_n, const int *prompt, int n_prompt);
/* DRY's breaker mask for tok's vocabulary (vocab_size bytes, malloc'd; NULL when out of memory): the
 * tokens whose text holds one of the n strings, or with n < 0 llama.cpp's default breakers
 * "\n", ":", "\"" and "*". */
unsigned char *nv_dry_breakers(const nv_tokenizer *tok, int vocab_size, const char *const *strs, int n);
/* Counts a generated token for the penalties (a no-op when they are off). */
void nv_sampler_accept(nv_sampler *s, int tok);
/* Picks the next token; modifies logits in place (scaled and softmaxed when temperature > 0). */
int nv_sample(nv_sampler *s, float *logits);
int nv_argmax(const float *v, int n);
/* log sum exp over a row of logits, in double: log p(i) = logits[i] - nv_logits_logz (scoring). */
double nv_logits_logz(const float *logits, int n);
/* The most likely token of a logits row and its probability under the softmax (temperature 1):
 * a draft model's greedy token and how sure it is of it. */
int nv_top_token(const float *logits, int n, float *prob);

/* Speculative decoding by prompt lookup: for n from max_n down to min_n, the latest i < len - n
 * with ctx[i..i+n) equal to the last n tokens; the k tokens after it go to out (continued, past
 * the end of ctx, from the draft itself: a repeating text goes on repeating). Returns k, or 0 when
 * nothing matches. */
int nv_ngram_draft(const int *ctx, int len, int min_n, int max_n, int k, int *out);

/* Drafts from a predicted answer (OpenAI's Predicted Outputs: the text the answer is expected to
 * be, such as a file being edited). at is the index in ids of the token the answer is expected to
 * take next, -1 once it took another; hint is where it last was in place. nv_pred_follow moves it
 * along the answer's tokens. nv_pred_draft gives up to k of the tokens expected next (returns how
 * many, 0 when none); having lost its place, it first finds it again from the answer's last n
 * tokens (n from max_n down to min_n, ans[0..n_ans) the answer so far): their first occurrence in
 * ids that ends at or after hint (an edit replaced what lay before), else the last before it. */
typedef struct {
    const int *ids;
    int n;
    int at, hint;
} nv_pred;
void nv_pred_follow(nv_pred *p, int tok);
int nv_pred_draft(nv_pred *p, const int *ans, int n_ans, int min_n, int max_n, int k, int *out);

/* Most draft tokens a step may check per sequence. */
#define NV_MAX_SPEC 16

/* How many drafts are worth checking: with a sequence's per-token acceptance a (estimated from its
 * own drafts so far, starting from one agreement and one refusal, older drafts weighing 0.9 less a
 * step), the j-th draft is reached and accepted with probability a^j, and each draft costs a row
 * whether or not; drafts are proposed while a^j >= 0.3. A text that keeps repeating earns long
 * drafts (up to k_max), one that does not a single draft a step. */
typedef struct {
    double agreed, refused;
} nv_spec_record;
int nv_spec_len(const nv_spec_record *r, int k_max);
/* After a step with drafts: how many the model agreed with, and whether one was refused. */
void nv_spec_update(nv_spec_record *r, int agreed, int refused);

/* A draft model's next draft from its logits: its greedy token, or -1 when it gives that token less
 * than p_min (llama.cpp's --draft-p-min: a draft the draft itself doubts is rarely accepted, and
 * each costs a pass and a row). */
int nv_draft_token(const float *logits, int n, float p_min);
/* After a step whose k drafts came from a draft model, which fed the decode row's token and then its
 * drafts but the last: how many of the positions after the decode row's hold the draft's keys and
 * values of the text, with agreed of the drafts taken. */
static inline int nv_draft_kept(int agreed, int k) { return agreed < k - 1 ? agreed : k - 1; }

#endif
