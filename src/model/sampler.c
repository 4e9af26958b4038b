#include "model/sampler.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "model/forward.h"

nv_err nv_sampler_init(nv_sampler *s, int vocab_size, float temperature, float top_p, uint64_t seed) {
    memset(s, 0, sizeof *s);
    if (vocab_size < 1) return nv_fail(NV_EINVAL, "sampler: empty vocabulary");
    if (!(temperature >= 0.0f) || !isfinite(temperature))
        return nv_fail(NV_EINVAL, "temperature must be a finite number >= 0 (got %g)", temperature);
    if (!(top_p >= 0.0f && top_p <= 1.0f)) return nv_fail(NV_EINVAL, "top-p must be in [0, 1] (got %g)", top_p);
    s->vocab_size = vocab_size;
    s->temperature = temperature;
    s->top_p = top_p;
    s->rng_state = seed;
    s->probindex = malloc((size_t)vocab_size * sizeof *s->probindex);
    if (!s->probindex) return nv_fail(NV_ENOMEM, "sampler: out of memory");
    return NV_OK;
}

void nv_sampler_free(nv_sampler *s) {
    free(s->probindex);
    free(s->sortbuf);
    s->sortbuf = NULL;
    free(s->bias_tok);
    free(s->bias);
    free(s->counts);
    free(s->seen);
    free(s->present);
    free(s->rep_list);
    free(s->dry_breaker);
    free(s->dry_hist);
    free(s->win_count);
    free(s->win_touched);
    free(s->dry_len);
    free(s->dry_touched);
    free(s->aux);
    s->aux = NULL;
    s->dry_breaker = NULL;
    s->dry_hist = s->dry_len = s->dry_touched = s->win_count = s->win_touched = NULL;
    s->n_hist = s->cap_hist = 0;
    s->dry_multiplier = 0;
    s->probindex = NULL;
    s->bias_tok = s->counts = s->seen = s->rep_list = NULL;
    s->present = NULL;
    s->bias = NULL;
    s->n_bias = s->n_seen = s->n_rep = 0;
}

nv_err nv_sampler_set_bias(nv_sampler *s, const int *tok, const float *bias, int n) {
    free(s->bias_tok);
    free(s->bias);
    s->bias_tok = NULL;
    s->bias = NULL;
    s->n_bias = 0;
    if (n <= 0) return NV_OK;
    for (int i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] >= s->vocab_size || !isfinite(bias[i]))
            return nv_fail(NV_ERANGE, "logit bias: token %d outside the vocabulary of %d, or a bias that is not finite", tok[i],
                           s->vocab_size);
    s->bias_tok = malloc((size_t)n * sizeof *s->bias_tok);
    s->bias = malloc((size_t)n * sizeof *s->bias);
    if (!s->bias_tok || !s->bias) return nv_fail(NV_ENOMEM, "sampler: out of memory");
    memcpy(s->bias_tok, tok, (size_t)n * sizeof *tok);
    memcpy(s->bias, bias, (size_t)n * sizeof *bias);
    s->n_bias = n;
    return NV_OK;
}

nv_err nv_sampler_set_penalties(nv_sampler *s, float presence, float frequency) {
    if (!isfinite(presence) || !isfinite(frequency)) return nv_fail(NV_EINVAL, "penalties must be finite numbers");
    s->presence = presence;
    s->frequency = frequency;
    if ((presence != 0.0f || frequency != 0.0f) && !s->counts) {
        s->counts = calloc((size_t)s->vocab_size, sizeof *s->counts);
        s->seen = malloc((size_t)s->vocab_size * sizeof *s->seen);
        if (!s->counts || !s->seen) return nv_fail(NV_ENOMEM, "sampler: out of memory");
    }
    return NV_OK;
}

nv_err nv_sampler_set_filters(nv_sampler *s, int top_k, float min_p) {
    if (top_k < 0) return nv_fail(NV_EINVAL, "top-k must be >= 0 (0 is off; got %d)", top_k);
    if (!(min_p >= 0.0f && min_p <= 1.0f)) return nv_fail(NV_EINVAL, "min-p must be in [0, 1] (got %g)", min_p);
    s->top_k = top_k;
    s->min_p = min_p;
    return NV_OK;
}

nv_err nv_sampler_set_more(nv_sampler *s, float typical_p, float top_n_sigma, float xtc_probability, float xtc_threshold) {
    if (!(typical_p > 0.0f && typical_p <= 1.0f) || !isfinite(top_n_sigma) || !(xtc_probability >= 0.0f && xtc_probability <= 1.0f) ||
        !(xtc_threshold >= 0.0f && xtc_threshold <= 1.0f))
        return nv_fail(NV_EINVAL, "typical-p must be in (0, 1], top-n-sigma finite, the XTC probability and threshold in [0, 1]");
    if (typical_p < 1.0f && !s->aux && !(s->aux = malloc((size_t)s->vocab_size * sizeof *s->aux)))
        return nv_fail(NV_ENOMEM, "sampler: out of memory");
    s->typical_p = typical_p;
    s->top_n_sigma = top_n_sigma;
    s->xtc_probability = xtc_probability;
    s->xtc_threshold = xtc_threshold;
    return NV_OK;
}

nv_err nv_sampler_set_mirostat(nv_sampler *s, int version, float tau, float eta) {
    if (version < 0 || version > 2 || !(tau >= 0.0f) || !isfinite(tau) || !(eta >= 0.0f) || !isfinite(eta))
        return nv_fail(NV_EINVAL, "Mirostat: the version must be 0, 1 or 2, tau and eta finite and >= 0");
    s->mirostat = version;
    s->mirostat_tau = tau;
    s->mirostat_eta = eta;
    s->mirostat_mu = 2.0f * tau;
    return NV_OK;
}

static void mark_present(nv_sampler *s, int tok) {
    if (!s->present[tok]) {
        s->present[tok] = 1;
        s->rep_list[s->n_rep++] = tok;
    }
}

nv_err nv_sampler_set_dynatemp(nv_sampler *s, float range, float exponent) {
    if (!(range >= 0.0f) || !isfinite(range) || !(exponent >= 0.0f) || !isfinite(exponent))
        return nv_fail(NV_EINVAL, "dynamic temperature: the range and the exponent must be finite numbers >= 0 (got %g, %g)",
                       range, exponent);
    s->dynatemp_range = range;
    s->dynatemp_exponent = exponent;
    return NV_OK;
}

/* The temperature of this draw (nv_sampler_set_dynatemp): from the entropy of the logits' softmax. */
static float draw_temperature(const nv_sampler *s, const float *logits, int n) {
    if (!(s->dynatemp_range > 0.0f)) return s->temperature;
    float maxv = -INFINITY;
    int finite = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(logits[i])) finite++, maxv = logits[i] > maxv ? logits[i] : maxv;
    if (finite < 2) return s->temperature; /* one candidate: nothing to be unsure of */
    /* H = -sum p ln p with p = e^d / z, d = logit - max: ln z - sum(e^d d) / z, in one pass */
    double z = 0, zd = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(logits[i])) {
            const double d = (double)logits[i] - maxv, e = exp(d);
            z += e, zd += e * d;
        }
    const double h = log(z) - zd / z;
    const double lo = s->temperature > s->dynatemp_range ? s->temperature - s->dynatemp_range : 0.0,
                 hi = s->temperature + s->dynatemp_range;
    return (float)(lo + (hi - lo) * pow(h / log((double)finite), s->dynatemp_exponent));
}

nv_err nv_sampler_set_repetition(nv_sampler *s, float penalty, const int *prompt, int n_prompt) {
    if (!(penalty > 0.0f) || !isfinite(penalty)) return nv_fail(NV_EINVAL, "repetition penalty must be > 0 (got %g)", penalty);
    s->repetition = penalty;
    if (penalty == 1.0f) return NV_OK;
    if (!s->present) {
        s->present = calloc((size_t)s->vocab_size, 1);
        s->rep_list = malloc((size_t)s->vocab_size * sizeof *s->rep_list);
        if (!s->present || !s->rep_list) {
            free(s->present);
            free(s->rep_list);
            s->present = NULL;
            s->rep_list = NULL;
            return nv_fail(NV_ENOMEM, "sampler: out of memory");
        }
    }
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] >= 0 && prompt[i] < s->vocab_size) mark_present(s, prompt[i]);
    return NV_OK;
}

#define DRY_MAX_REPEAT 64 /* the longest repeat measured: its penalty is far past any logit by then */

static int dry_push(nv_sampler *s, int tok) {
    if (s->n_hist == s->cap_hist) {
        const int nc = s->cap_hist ? s->cap_hist * 2 : 256;
        int *h = realloc(s->dry_hist, (size_t)nc * sizeof *h);
        if (!h) return 0;
        s->dry_hist = h;
        s->cap_hist = nc;
    }
    s->dry_hist[s->n_hist++] = tok;
    return 1;
}

/* The history DRY and the penalty window read: the prompt, then each accepted token. */
static nv_err hist_start(nv_sampler *s, const int *prompt, int n_prompt) {
    s->n_hist = 0;
    for (int i = 0; i < n_prompt; i++)
        if (!dry_push(s, prompt[i])) return nv_fail(NV_ENOMEM, "sampler: out of memory");
    return NV_OK;
}

nv_err nv_sampler_set_penalty_window(nv_sampler *s, int last_n, const int *prompt, int n_prompt) {
    if (last_n < -1) return nv_fail(NV_EINVAL, "the penalties' window must be -1 (all), 0 (no penalty) or positive (got %d)", last_n);
    /* (neutral penalties need no window, as llama.cpp's are then no step at all) */
    const int penalized = (s->repetition > 0.0f && s->repetition != 1.0f) || s->presence != 0.0f || s->frequency != 0.0f;
    s->window = !penalized || last_n == 0 ? -1 : last_n < 0 ? INT_MAX : last_n;
    if (s->window < 0) return NV_OK;
    if (!s->win_count) s->win_count = calloc((size_t)s->vocab_size, sizeof *s->win_count);
    if (!s->win_touched) s->win_touched = malloc((size_t)s->vocab_size * sizeof *s->win_touched);
    if (!s->win_count || !s->win_touched) return nv_fail(NV_ENOMEM, "sampler: out of memory");
    return hist_start(s, prompt, n_prompt);
}

nv_err nv_sampler_set_dry(nv_sampler *s, float multiplier, float base, int allowed_length, int last_n,
                          const unsigned char *breaker, const int *prompt, int n_prompt) {
    if (!(multiplier >= 0.0f) || !isfinite(multiplier) || !(base >= 1.0f) || !isfinite(base) || allowed_length < 1 ||
        allowed_length > DRY_MAX_REPEAT || last_n < -1)
        return nv_fail(NV_EINVAL, "DRY: the multiplier must be >= 0, the base >= 1, the allowed length 1..%d and the "
                                  "window -1 (all), 0 (off) or positive", DRY_MAX_REPEAT);
    s->dry_multiplier = last_n == 0 ? 0.0f : multiplier;
    s->dry_base = base;
    s->dry_allowed = allowed_length;
    s->dry_last_n = last_n;
    if (s->dry_multiplier == 0.0f) return NV_OK;
    if (!s->dry_len) s->dry_len = calloc((size_t)s->vocab_size, sizeof *s->dry_len);
    if (!s->dry_touched) s->dry_touched = malloc((size_t)s->vocab_size * sizeof *s->dry_touched);
    if (!s->dry_breaker) s->dry_breaker = calloc((size_t)s->vocab_size, 1);
    if (!s->dry_len || !s->dry_touched || !s->dry_breaker) return nv_fail(NV_ENOMEM, "sampler: out of memory");
    if (breaker) memcpy(s->dry_breaker, breaker, (size_t)s->vocab_size);
    return hist_start(s, prompt, n_prompt);
}

unsigned char *nv_dry_breakers(const nv_tokenizer *tok, int vocab_size, const char *const *strs, int n) {
    static const char *const defaults[] = {"\n", ":", "\"", "*"};
    unsigned char *mask = calloc((size_t)vocab_size, 1);
    if (mask) nv_tokenizer_mark_containing(tok, n < 0 ? defaults : strs, n < 0 ? 4 : n, mask);
    return mask;
}

/* For every earlier place the history's last tokens also stand, the token that followed there would
   repeat them once more: it loses multiplier x base^(n - allowed) for the longest such run n. */
static void dry_penalize(nv_sampler *s, float *logits) {
    const int *h = s->dry_hist, n = s->n_hist;
    if (n < 2 || s->dry_breaker[h[n - 1]]) return;
    const int from = s->dry_last_n > 0 && n > s->dry_last_n ? n - s->dry_last_n : 0;
    int touched = 0;
    for (int i = from + 1; i < n; i++) { /* h[i] followed h[i - 1]; does that run end like the history? */
        int len = 0;
        while (len < DRY_MAX_REPEAT && i - 1 - len >= from && h[i - 1 - len] == h[n - 1 - len] && !s->dry_breaker[h[n - 1 - len]])
            len++;
        const int t = h[i];
        if (len >= s->dry_allowed && t >= 0 && t < s->vocab_size && len > s->dry_len[t]) {
            if (!s->dry_len[t]) s->dry_touched[touched++] = t;
            s->dry_len[t] = len;
        }
    }
    for (int k = 0; k < touched; k++) {
        const int t = s->dry_touched[k];
        const double p = (double)s->dry_multiplier * pow((double)s->dry_base, (double)(s->dry_len[t] - s->dry_allowed));
        logits[t] -= (float)(p < 1e30 ? p : 1e30);
        s->dry_len[t] = 0;
    }
}

void nv_sampler_accept(nv_sampler *s, int tok) {
    if (tok < 0 || tok >= s->vocab_size) return;
    if (s->dry_multiplier > 0.0f || s->window > 0) dry_push(s, tok);
    if (s->present) mark_present(s, tok);
    if (s->counts && s->counts[tok]++ == 0) s->seen[s->n_seen++] = tok;
}

/* llama.cpp's penalties over the window: each token of the last `window` of the history, counted. */
static void window_penalize(nv_sampler *s, float *logits) {
    const int n = s->n_hist, from = n > s->window ? n - s->window : 0;
    const float rep = s->repetition > 0.0f ? s->repetition : 1.0f;
    int touched = 0;
    for (int i = from; i < n; i++) {
        const int t = s->dry_hist[i];
        if (t >= 0 && t < s->vocab_size && s->win_count[t]++ == 0) s->win_touched[touched++] = t;
    }
    for (int k = 0; k < touched; k++) {
        const int t = s->win_touched[k];
        const float l = logits[t] > 0.0f ? logits[t] / rep : logits[t] * rep;
        logits[t] = l - (float)s->win_count[t] * s->frequency - s->presence;
        s->win_count[t] = 0;
    }
}

/* The bias, DRY, then the repetition penalty, then presence and frequency (vLLM's order); over a
 * window, llama.cpp's: the bias, the penalties, then DRY. */
static void adjust_logits(nv_sampler *s, float *logits) {
    for (int i = 0; i < s->n_bias; i++) logits[s->bias_tok[i]] += s->bias[i];
    if (s->window) {
        if (s->window > 0) window_penalize(s, logits);
        if (s->dry_multiplier > 0.0f) dry_penalize(s, logits);
        return;
    }
    if (s->dry_multiplier > 0.0f) dry_penalize(s, logits);
    if (s->present && s->repetition != 1.0f)
        for (int i = 0; i < s->n_rep; i++) {
            float *l = &logits[s->rep_list[i]];
            *l = *l > 0.0f ? *l / s->repetition : *l * s->repetition;
        }
    for (int i = 0; i < s->n_seen; i++) {
        int t = s->seen[i];
        logits[t] -= (float)s->counts[t] * s->frequency + s->presence;
    }
}

int nv_draft_token(const float *logits, int n, float p_min) {
    float p;
    const int tok = nv_top_token(logits, n, &p);
    return p < p_min ? -1 : tok;
}

int nv_top_token(const float *logits, int n, float *prob) {
    const int best = nv_argmax(logits, n);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)logits[i] - (double)logits[best]);
    *prob = sum > 0 ? (float)(1.0 / sum) : 0.0f; /* NaN logits: not sure at all */
    return best;
}

int nv_argmax(const float *v, int n) {
    int best = 0;
    float max_p = v[0];
    for (int i = 1; i < n; i++)
        if (v[i] > max_p) {
            max_p = v[i];
            best = i;
        }
    return best;
}

static int sample_mult(const float *probs, int n, float coin) {
    float cdf = 0.0f;
    for (int i = 0; i < n; i++) {
        cdf += probs[i];
        if (coin < cdf) return i;
    }
    return n - 1; /* rounding errors */
}

static inline uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static int compare_prob_desc(const void *a, const void *b) {
    const nv_prob_index *x = a, *y = b;
    if (x->prob > y->prob) return -1;
    if (x->prob < y->prob) return 1;
    return 0;
}

#define RADIX_MIN 256 /* candidates from which sorting goes by radix */

static int compare_dist(const void *a, const void *b, void *arg) {
    const float *d = arg, x = d[((const nv_prob_index *)a)->index], y = d[((const nv_prob_index *)b)->index];
    return x < y ? -1 : x > y;
}

/* c[0..n) by key, most likely first (key NULL: by probability) or, with key[index] (a [vocab] list),
 * smallest first; equal ones in the order given: the order of llama2.c's qsort (glibc's, a stable
 * merge sort). Long lists (a flat distribution gives tens of thousands of candidates, which qsort took
 * milliseconds a token over) by an LSD radix sort on the keys' bits, a byte a pass, stable, through a
 * scratch list the sampler keeps from its first long sort: the keys are never negative (the callers'
 * probabilities are above zero, their distances absolute values), and such floats order as their
 * bits do. */
static void sort_by(nv_sampler *s, nv_prob_index *c, int n, const float *key) {
    if (n >= RADIX_MIN && !s->sortbuf) s->sortbuf = malloc((size_t)s->vocab_size * sizeof *s->sortbuf);
    if (n < RADIX_MIN || !s->sortbuf) {
        if (key) qsort_r(c, (size_t)n, sizeof *c, compare_dist, (void *)key);
        else qsort(c, (size_t)n, sizeof *c, compare_prob_desc);
        return;
    }
    const uint32_t flip = key ? 0 : 0xffffffffu; /* most likely first: the bits reversed */
#define SORT_KEY(e) (bits_of(key ? key[(e).index] : (e).prob) ^ flip)
    int count[4][256] = {{0}};
    for (int i = 0; i < n; i++) {
        const uint32_t u = SORT_KEY(c[i]);
        for (int b = 0; b < 4; b++) count[b][(u >> (8 * b)) & 255]++;
    }
    nv_prob_index *src = c, *dst = s->sortbuf;
    for (int b = 0; b < 4; b++) {
        int at = 0, uniform = 0;
        for (int v = 0; v < 256; v++) {
            const int k = count[b][v];
            uniform |= k == n;
            count[b][v] = at;
            at += k;
        }
        if (uniform) continue; /* every key has this byte: the order stands */
        for (int i = 0; i < n; i++) dst[count[b][(SORT_KEY(src[i]) >> (8 * b)) & 255]++] = src[i];
        nv_prob_index *t = src;
        src = dst, dst = t;
    }
#undef SORT_KEY
    if (src != c) memcpy(c, src, (size_t)n * sizeof *c);
}

/* Candidates c[0..n), most likely first where limit matters: keeps the shortest prefix whose sum
 * passes limit (all of them when none does) and draws one of it in proportion to its probability. */
static int sample_nucleus(const nv_prob_index *c, int n, float limit, float coin) {
    float cumulative = 0.0f;
    int last = n - 1;
    for (int i = 0; i < n; i++) {
        cumulative += c[i].prob;
        if (cumulative > limit) {
            last = i;
            break;
        }
    }
    float r = coin * cumulative, cdf = 0.0f;
    for (int i = 0; i <= last; i++) {
        cdf += c[i].prob;
        if (r < cdf) return c[i].index;
    }
    return c[last].index; /* rounding */
}

static int sample_topp(nv_sampler *s, const float *probs, int n, float topp, float coin) {
    nv_prob_index *probindex = s->probindex;
    /* Tokens below (1 - topp) / (n - 1) can never be in the nucleus: drop them before sorting. */
    int n0 = 0;
    const float cutoff = (1.0f - topp) / (float)(n - 1);
    for (int i = 0; i < n; i++)
        if (probs[i] >= cutoff) {
            probindex[n0].index = i;
            probindex[n0].prob = probs[i];
            n0++;
        }
    /* None passes when top_p < 1/n and the distribution is near uniform (max p < cutoff): the
     * nucleus is then the top token alone (its p >= 1/n > top_p). Also NaN probabilities. */
    if (n0 == 0) return nv_argmax(probs, n);
    sort_by(s, probindex, n0, NULL);
    return sample_nucleus(probindex, n0, topp, coin);
}

/* Moves the k most likely of v[0..n) to v[0..k) (in no particular order): quickselect with the
 * middle element as pivot, so the same input always gives the same arrangement. */
static void select_top(nv_prob_index *v, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const float pivot = v[lo + (hi - lo) / 2].prob;
        int i = lo, j = hi;
        while (i <= j) {
            while (v[i].prob > pivot) i++;
            while (v[j].prob < pivot) j--;
            if (i <= j) {
                nv_prob_index t = v[i];
                v[i++] = v[j];
                v[j--] = t;
            }
        }
        /* v[lo..j] >= pivot >= v[i..hi] */
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

/* The candidates: every token with a probability above zero and at least floor_p, in index order. */
static int candidates(const float *probs, int n, float floor_p, nv_prob_index *c) {
    int n0 = 0;
    for (int i = 0; i < n; i++)
        if (probs[i] > 0.0f && probs[i] >= floor_p) c[n0++] = (nv_prob_index){probs[i], i};
    return n0;
}

/* Locally typical sampling over candidates c[0..n) (probabilities, not normalised): ordered by how
   far each one's surprise is from the distribution's entropy (dist: [vocab] scratch), the fewest
   whose share reaches p; returns how many. */
static int typical_set(nv_sampler *s, nv_prob_index *c, int n, float p, float *dist) {
    double total = 0, ent = 0;
    for (int i = 0; i < n; i++) total += c[i].prob;
    for (int i = 0; i < n; i++) {
        const double q = c[i].prob / total;
        ent -= q * log(q);
    }
    for (int i = 0; i < n; i++) dist[c[i].index] = (float)fabs(-log(c[i].prob / total) - ent);
    sort_by(s, c, n, dist);
    double cum = 0;
    int k = 0;
    while (k < n) {
        cum += c[k++].prob / total;
        if (cum >= p) break;
    }
    return k;
}

/* Sampling with a filter on: the candidates are the tokens with a probability above zero and at
 * least min_p x the largest, the k most likely of them with top-k; then the typical set, XTC, and
 * top-p keeping the most likely candidates until their share of the candidates' total passes top_p. */
static int sample_filtered(nv_sampler *s, const float *probs, int n, float coin) {
    nv_prob_index *c = s->probindex;
    float pmax = 0.0f;
    for (int i = 0; i < n; i++) pmax = probs[i] > pmax ? probs[i] : pmax;
    int n0 = candidates(probs, n, s->min_p * pmax, c);
    if (n0 == 0) return nv_argmax(probs, n); /* NaN probabilities */
    if (s->top_k > 0 && n0 > s->top_k) {
        select_top(c, n0, s->top_k);
        n0 = s->top_k;
    }
    if (s->typical_p > 0 && s->typical_p < 1) n0 = typical_set(s, c, n0, s->typical_p, s->aux);
    if (s->xtc_probability > 0 && nv_xorshift_f32(&s->rng_state) < s->xtc_probability) {
        sort_by(s, c, n0, NULL);
        float total = 0.0f;
        for (int i = 0; i < n0; i++) total += c[i].prob;
        int top = 0; /* the candidates at or above the threshold: all but the least likely of them go */
        while (top < n0 && c[top].prob >= s->xtc_threshold * total) top++;
        if (top >= 2) {
            c += top - 1;
            n0 -= top - 1;
        }
    }
    if (!(s->top_p > 0 && s->top_p < 1)) return sample_nucleus(c, n0, INFINITY, coin); /* all of them */
    sort_by(s, c, n0, NULL);
    float total = 0.0f;
    for (int i = 0; i < n0; i++) total += c[i].prob;
    return sample_nucleus(c, n0, s->top_p * total, coin);
}

#define MIROSTAT_M 100 /* the most likely tokens Zipf's exponent is estimated over (version 1) */

/* Mirostat's draw from probabilities probs (version 1 or 2), and its update of mu. */
static int sample_mirostat(nv_sampler *s, const float *probs, int n, float coin) {
    nv_prob_index *c = s->probindex;
    /* version 2: surprise -log2 p <= mu  <=>  p >= 2^-mu */
    int n0 = candidates(probs, n, s->mirostat == 2 ? exp2f(-s->mirostat_mu) : 0.0f, c);
    if (s->mirostat == 2) {
        if (n0 == 0) c[n0++] = (nv_prob_index){1.0f, nv_argmax(probs, n)};
    } else {
        if (n0 == 0) return nv_argmax(probs, n);
        const int m = n0 < MIROSTAT_M ? n0 : MIROSTAT_M;
        select_top(c, n0, m);
        sort_by(s, c, m, NULL);
        double sum_tb = 0, sum_tt = 0;
        for (int i = 0; i + 1 < m; i++) {
            const double t = log((double)(i + 2) / (double)(i + 1)), b = log((double)c[i].prob / (double)c[i + 1].prob);
            sum_tb += t * b;
            sum_tt += t * t;
        }
        const double s_hat = sum_tt > 0 ? sum_tb / sum_tt : 1.0, eps = s_hat - 1.0;
        double k = eps != 0 && s_hat > 0 ? pow(eps * pow(2.0, s->mirostat_mu) / (1.0 - pow((double)n, -eps)), 1.0 / s_hat) : n0;
        if (!(k >= 1.0)) k = 1.0; /* NaN too */
        const int keep = k < n0 ? (int)k : n0;
        if (keep > m) select_top(c, n0, keep);
        n0 = keep;
        sort_by(s, c, n0, NULL);
    }
    float total = 0.0f;
    for (int i = 0; i < n0; i++) total += c[i].prob;
    const int tok = sample_nucleus(c, n0, INFINITY, coin);
    float p = 0.0f;
    for (int i = 0; i < n0; i++)
        if (c[i].index == tok) p = c[i].prob / total;
    if (p > 0.0f) s->mirostat_mu -= s->mirostat_eta * (-log2f(p) - s->mirostat_tau);
    return tok;
}

int nv_sample(nv_sampler *s, float *logits) {
    int n = s->vocab_size;
    adjust_logits(s, logits);
    if (s->temperature == 0.0f) return nv_argmax(logits, n);
    const float temp = draw_temperature(s, logits, n);
    if (temp == 0.0f) return nv_argmax(logits, n);
    /* A temperature so small that the largest logit over it overflows is greedy (its limit):
     * the softmax would be all NaN. The first maximum is found in the same pass as the division. */
    int best = 0;
    float maxv = logits[0];
    for (int q = 0; q < n; q++) {
        const float v = logits[q];
        if (v > maxv) maxv = v, best = q;
        logits[q] = v / temp;
    }
    if (!isfinite(maxv / temp)) return best;
    if (s->top_n_sigma > 0) { /* the logits further than n deviations below the largest drop out */
        double sum = 0, sq = 0; /* over the finite ones: a masked token (-inf) is no part of the spread */
        int finite = 0;
        for (int q = 0; q < n; q++)
            if (isfinite(logits[q])) sum += logits[q], finite++;
        const double mean = finite ? sum / finite : 0;
        for (int q = 0; q < n; q++)
            if (isfinite(logits[q])) sq += (logits[q] - mean) * (logits[q] - mean);
        const float floor_l = maxv / temp - s->top_n_sigma * (float)sqrt(finite ? sq / finite : 0);
        for (int q = 0; q < n; q++)
            if (logits[q] < floor_l) logits[q] = -INFINITY;
    }
    nv_softmax(logits, n);
    float coin = nv_xorshift_f32(&s->rng_state);
    if (s->mirostat) return sample_mirostat(s, logits, n, coin);
    /* a top-k of the whole vocabulary filters nothing: the unfiltered procedure, the same tokens */
    if ((s->top_k > 0 && s->top_k < n) || s->min_p > 0 || (s->typical_p > 0 && s->typical_p < 1) || s->xtc_probability > 0)
        return sample_filtered(s, logits, n, coin);
    if (s->top_p <= 0 || s->top_p >= 1 || n < 2) return sample_mult(logits, n, coin);
    return sample_topp(s, logits, n, s->top_p, coin);
}

int nv_ngram_draft(const int *ctx, int len, int min_n, int max_n, int k, int *out) {
    if (min_n < 1) min_n = 1;
    for (int n = max_n < len - 1 ? max_n : len - 1; n >= min_n && k > 0; n--) {
        const int *tail = ctx + len - n;
        for (int i = len - n - 1; i >= 0; i--) { /* the latest occurrence first: what the text repeats now */
            if (ctx[i] != tail[0] || memcmp(ctx + i, tail, (size_t)n * sizeof *ctx) != 0) continue;
            /* what followed it, continued past the end into the draft itself: a text that repeats
             * with a period shorter than k keeps repeating */
            for (int j = 0; j < k; j++) out[j] = i + n + j < len ? ctx[i + n + j] : out[i + n + j - len];
            return k;
        }
    }
    return 0;
}

void nv_pred_follow(nv_pred *p, int tok) {
    if (p->at >= 0 && p->at < p->n && p->ids[p->at] == tok) p->hint = ++p->at;
    else p->at = -1;
}

int nv_pred_draft(nv_pred *p, const int *ans, int n_ans, int min_n, int max_n, int k, int *out) {
    if (min_n < 1) min_n = 1;
    for (int n = max_n < n_ans ? max_n : n_ans; p->at < 0 && n >= min_n; n--) {
        const int *tail = ans + n_ans - n;
        int before = -1;
        for (int i = 0; i + n <= p->n; i++) {
            if (p->ids[i] != tail[0] || memcmp(p->ids + i, tail, (size_t)n * sizeof *tail) != 0) continue;
            if (i + n >= p->hint) {
                p->at = i + n;
                break;
            }
            before = i + n;
        }
        if (p->at < 0 && before >= 0) p->at = before;
    }
    if (p->at < 0) return 0;
    int m = p->n - p->at < k ? p->n - p->at : k;
    if (m > 0) memcpy(out, p->ids + p->at, (size_t)m * sizeof *out);
    return m > 0 ? m : 0;
}

/* A draft is proposed only while the chance that it is reached and accepted is at least this. */
#define SPEC_P_MIN 0.3

int nv_spec_len(const nv_spec_record *r, int k_max) {
    double a = (r->agreed + 1.0) / (r->agreed + r->refused + 2.0), p = a;
    int k = 1;
    while (k < k_max && p * a >= SPEC_P_MIN) p *= a, k++;
    return k;
}

void nv_spec_update(nv_spec_record *r, int agreed, int refused) {
    r->agreed = 0.9 * r->agreed + agreed;
    r->refused = 0.9 * r->refused + (refused != 0);
}

double nv_logits_logz(const float *logits, int n) {
    float mx = logits[0];
    for (int i = 1; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)logits[i] - mx);
    return mx + log(sum);
}
