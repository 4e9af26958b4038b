/* JSON schemas to byte grammars (see schema.h). */
#include "serve/schema.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/utf8.h"
#include "serve/tools.h"

#define WS_INDENT 20
#define INT_DIGITS 16
#define FRAC_DIGITS 16
#define EXP_DIGITS 3
#define MAX_DEPTH 64
#define XML_PARAM_CLOSE "</parameter>" /* what ends a parameter's value in a tool call written as XML */
#define MAX_REPEAT 10000
#define INT_LIMIT 9999999999999999LL /* the largest INT_DIGITS-digit integer */

typedef struct {
    const cJSON *target; /* what the reference resolved to: spellings of one place share a rule */
    int mode;            /* the rule's form: JSON, JSON without '<' (c->xml), a raw string (REF_RAW) */
    int rule;
} ref_rule;

#define REF_RAW 2

typedef struct {
    nv_gbuild *b;
    const cJSON *doc;
    int ws, value, string, chr, number, integer, digit, hex, object_any, array_any;
    ref_rule *refs;
    int n_refs, cap_refs;
    int depth;
    int think; /* a reasoning model's think block may come first (its tags: NV_THINK_ANGLE, NV_THINK_BRACKET) */
    int xml_text; /* a parameter's free text in a tool call written as XML (-1: not made yet) */
    /* 1 while a tool call's value written as XML is made: no string in it holds '<' (so none holds
       "</parameter>"), a JSON string writing it \u003c; the string rules of the other form wait in other */
    int xml, other[5];
    int rawc; /* raw_char's rule (-1: not made yet) */
    nv_err err;
} sc;

/* Records the first error (later ones follow from it) and returns 0, the rule id callers give
 * back on failure. */
static int fail(sc *c, nv_err code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(sc *c, nv_err code, const char *fmt, ...) {
    if (c->err != NV_OK) return 0;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->err = nv_fail(code, "%s", msg);
    return 0;
}

/* ---- pieces ---- */

static int lit_rule(sc *c, const char *s) {
    nv_gbody body = {0};
    nv_gbody_lit(c->b, &body, s, strlen(s));
    return nv_gbuild_add(c->b, &body);
}

static int range_rule(sc *c, unsigned lo, unsigned hi) {
    nv_gbody body = {0};
    nv_gbody_range(c->b, &body, lo, hi);
    return nv_gbuild_add(c->b, &body);
}

/* item repeated min..max times (max < 0: no limit), as right recursion. */
static int repeat(sc *c, int item, long min, long max) {
    if (min > MAX_REPEAT || (max >= 0 && max - min > MAX_REPEAT))
        return fail(c, NV_EUNSUPPORTED, "a repetition bound over %s is not supported", "10000");
    return nv_gbuild_repeat(c->b, item, min, max);
}

/* Between tokens: nothing, one space, or a newline and up to 20 spaces or tabs of indentation
 * (llama.cpp's rule): enough for compact and pretty-printed JSON, and a model cannot wander off
 * into runs of blank lines. */
static int ws(sc *c) {
    if (c->ws >= 0) return c->ws;
    nv_gbody body = {0};
    nv_gbody_chars(c->b, &body, " \t");
    int indent = repeat(c, nv_gbuild_add(c->b, &body), 0, WS_INDENT);
    nv_gbody_alt(&body);
    nv_gbody_lit(c->b, &body, " ", 1);
    nv_gbody_alt(&body);
    nv_gbody_lit(c->b, &body, "\n", 1);
    nv_gbody_ref(&body, indent);
    return c->ws = nv_gbuild_add(c->b, &body);
}

static int digit(sc *c) { return c->digit >= 0 ? c->digit : (c->digit = range_rule(c, '0', '9')); }

static int hex(sc *c) {
    if (c->hex >= 0) return c->hex;
    nv_gbody body = {0};
    nv_gbody_chars(c->b, &body, "0123456789abcdefABCDEF");
    return c->hex = nv_gbuild_add(c->b, &body);
}

/* Every well-formed UTF-8 sequence of 2 to 4 bytes (no overlongs, surrogates or code points past
 * U+10FFFF) as alternatives appended to body; no_line_seps leaves out U+2028 and U+2029 (the
 * line terminators a regular expression's '.' does not match). */
static void utf8_multibyte(sc *c, nv_gbody *body, int no_line_seps) {
    static const unsigned rows[][4][2] = {
        {{0xC2, 0xDF}, {0x80, 0xBF}, {0, 0}, {0, 0}},
        {{0xE0, 0xE0}, {0xA0, 0xBF}, {0x80, 0xBF}, {0, 0}},
        {{0xE1, 0xEC}, {0x80, 0xBF}, {0x80, 0xBF}, {0, 0}},
        {{0xED, 0xED}, {0x80, 0x9F}, {0x80, 0xBF}, {0, 0}},
        {{0xEE, 0xEF}, {0x80, 0xBF}, {0x80, 0xBF}, {0, 0}},
        {{0xF0, 0xF0}, {0x90, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
        {{0xF1, 0xF3}, {0x80, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
        {{0xF4, 0xF4}, {0x80, 0x8F}, {0x80, 0xBF}, {0x80, 0xBF}},
    };
    static const unsigned e1_ec_no_seps[][4][2] = { /* rows[2] around E2 80 A8 and E2 80 A9 */
        {{0xE1, 0xE1}, {0x80, 0xBF}, {0x80, 0xBF}, {0, 0}},
        {{0xE2, 0xE2}, {0x81, 0xBF}, {0x80, 0xBF}, {0, 0}},
        {{0xE2, 0xE2}, {0x80, 0x80}, {0x80, 0xA7}, {0, 0}},
        {{0xE2, 0xE2}, {0x80, 0x80}, {0xAA, 0xBF}, {0, 0}},
        {{0xE3, 0xEC}, {0x80, 0xBF}, {0x80, 0xBF}, {0, 0}},
    };
    int first = 1;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const int split = no_line_seps && i == 2;
        const unsigned(*r)[4][2] = split ? e1_ec_no_seps : &rows[i];
        const size_t n = split ? sizeof e1_ec_no_seps / sizeof e1_ec_no_seps[0] : 1;
        for (size_t j = 0; j < n; j++, first = 0) {
            if (!first) nv_gbody_alt(body);
            for (int k = 0; k < 4 && r[j][k][0]; k++) nv_gbody_range(c->b, body, r[j][k][0], r[j][k][1]);
        }
    }
}

/* One character inside a JSON string: printable ASCII but '"' and '\\', an escape, or a
 * well-formed UTF-8 sequence (no overlongs, surrogates or code points past U+10FFFF). */
static int chr(sc *c) {
    if (c->chr >= 0) return c->chr;
    nv_gbuild *b = c->b;
    nv_gbody body = {0};
    uint8_t bits[32] = {0};
    for (unsigned x = 0x20; x < 0x80; x++)
        if (x != '"' && x != '\\' && (x != '<' || !c->xml)) bits[x >> 3] |= (uint8_t)(1u << (x & 7));
    int h = hex(c);
    nv_gbody_set(b, &body, bits);
    nv_gbody_alt(&body);
    nv_gbody_lit(b, &body, "\\", 1);
    nv_gbody_chars(b, &body, "\"\\/bfnrt");
    nv_gbody_alt(&body); /* \uXXXX but a surrogate's half (a pair spells what raw UTF-8 spells anyway) */
    nv_gbody_lit(b, &body, "\\u", 2);
    nv_gbody_chars(b, &body, "0123456789abcefABCEF");
    for (int i = 0; i < 3; i++) nv_gbody_ref(&body, h);
    nv_gbody_alt(&body);
    nv_gbody_lit(b, &body, "\\u", 2);
    nv_gbody_chars(b, &body, "dD");
    nv_gbody_chars(b, &body, "01234567");
    for (int i = 0; i < 2; i++) nv_gbody_ref(&body, h);
    nv_gbody_alt(&body);
    utf8_multibyte(c, &body, 0);
    return c->chr = nv_gbuild_add(b, &body);
}

/* "..." with min..max characters (max < 0: any number). */
static int string_len(sc *c, long min, long max) {
    if (min == 0 && max < 0 && c->string >= 0) return c->string;
    int chars = repeat(c, chr(c), min, max);
    nv_gbody body = {0};
    nv_gbody_lit(c->b, &body, "\"", 1);
    nv_gbody_ref(&body, chars);
    nv_gbody_lit(c->b, &body, "\"", 1);
    int r = nv_gbuild_add(c->b, &body);
    if (min == 0 && max < 0) c->string = r;
    return r;
}

/* -?(0|[1-9][0-9]{0,15}) */
static int integer(sc *c) {
    if (c->integer >= 0) return c->integer;
    int rest = repeat(c, digit(c), 0, INT_DIGITS - 1);
    nv_gbody body = {0};
    nv_gbody_alt(&body);
    nv_gbody_lit(c->b, &body, "-", 1);
    int sign = nv_gbuild_add(c->b, &body);
    nv_gbody_ref(&body, sign);
    nv_gbody_lit(c->b, &body, "0", 1);
    nv_gbody_alt(&body);
    nv_gbody_ref(&body, sign);
    nv_gbody_range(c->b, &body, '1', '9');
    nv_gbody_ref(&body, rest);
    return c->integer = nv_gbuild_add(c->b, &body);
}

/* integer (\.[0-9]{1,16})? ([eE][-+]?[0-9]{1,3})? */
static int number(sc *c) {
    if (c->number >= 0) return c->number;
    nv_gbody body = {0};
    nv_gbody_alt(&body);
    nv_gbody_lit(c->b, &body, ".", 1);
    nv_gbody_ref(&body, repeat(c, digit(c), 1, FRAC_DIGITS));
    int frac = nv_gbuild_add(c->b, &body);
    nv_gbody_alt(&body);
    nv_gbody_chars(c->b, &body, "+-");
    int sign = nv_gbuild_add(c->b, &body);
    int exp_digits = repeat(c, digit(c), 1, EXP_DIGITS);
    nv_gbody_alt(&body);
    nv_gbody_chars(c->b, &body, "eE");
    nv_gbody_ref(&body, sign);
    nv_gbody_ref(&body, exp_digits);
    int exp = nv_gbuild_add(c->b, &body);
    nv_gbody_ref(&body, integer(c));
    nv_gbody_ref(&body, frac);
    nv_gbody_ref(&body, exp);
    return c->number = nv_gbuild_add(c->b, &body);
}

/* open "{" or "[", then items separated by "," and the closer, whitespace between: the k-th item
 * (from 0) is prefix[k] while k < n_prefix, then item (item < 0: none after the prefix); min..max
 * items (max < 0: any number). */
static int sequence_of(sc *c, const char *open, const char *close, const int *prefix, int n_prefix, int item, long min, long max) {
    if (item < 0 && (max < 0 || max > n_prefix)) max = n_prefix;
    if (min > MAX_REPEAT || (max >= 0 && max > MAX_REPEAT) || n_prefix > MAX_REPEAT)
        return fail(c, NV_EUNSUPPORTED, "a repetition bound over %s is not supported", "10000");
    if (max >= 0 && min > max) return fail(c, NV_EINVAL, "the array's items leave room for fewer than 'minItems'");
    int w = ws(c);
    nv_gbody body = {0};
    /* after_k: k items written, next a "," or the closer; past the prefix, an unbounded list loops on its last state */
    int last = -1;
    long top = max >= 0 ? max : min > n_prefix ? min : n_prefix > 0 ? n_prefix : 1;
    int *after = calloc((size_t)top + 1, sizeof *after);
    if (!after) return fail(c, NV_ENOMEM, "out of memory");
    for (long k = top; k >= 1; k--) {
        int self = nv_gbuild_reserve(c->b);
        int first = 1;
        if (k >= min) {
            nv_gbody_lit(c->b, &body, close, 1);
            first = 0;
        }
        if (max < 0 || k < max) {
            if (!first) nv_gbody_alt(&body);
            nv_gbody_lit(c->b, &body, ",", 1);
            nv_gbody_ref(&body, w);
            nv_gbody_ref(&body, k < n_prefix ? prefix[k] : item);
            nv_gbody_ref(&body, w);
            nv_gbody_ref(&body, k == top ? (max < 0 ? self : last) : last);
        }
        nv_gbuild_define(c->b, self, &body);
        after[k] = last = self;
    }
    int first = 1;
    if (min == 0) {
        nv_gbody_lit(c->b, &body, close, 1);
        first = 0;
    }
    if (max != 0) {
        if (!first) nv_gbody_alt(&body);
        nv_gbody_ref(&body, n_prefix > 0 ? prefix[0] : item);
        nv_gbody_ref(&body, w);
        nv_gbody_ref(&body, after[1]);
    }
    int rest = nv_gbuild_add(c->b, &body);
    nv_gbody_lit(c->b, &body, open, 1);
    nv_gbody_ref(&body, w);
    nv_gbody_ref(&body, rest);
    free(after);
    return nv_gbuild_add(c->b, &body);
}

static int sequence(sc *c, const char *open, const char *close, int item, long min, long max) {
    return sequence_of(c, open, close, NULL, 0, item, min, max);
}

static int any_value(sc *c);

/* "key" ws ":" ws value, for any string key (key_rule) or one written literally */
static int member(sc *c, const char *key_lit, int key_rule, int value) {
    nv_gbody body = {0};
    if (key_lit) nv_gbody_lit(c->b, &body, key_lit, strlen(key_lit));
    else nv_gbody_ref(&body, key_rule);
    nv_gbody_ref(&body, ws(c));
    nv_gbody_lit(c->b, &body, ":", 1);
    nv_gbody_ref(&body, ws(c));
    nv_gbody_ref(&body, value);
    return nv_gbuild_add(c->b, &body);
}

static int any_value(sc *c) {
    if (c->value >= 0) return c->value;
    c->value = nv_gbuild_reserve(c->b);
    c->object_any = sequence(c, "{", "}", member(c, NULL, string_len(c, 0, -1), c->value), 0, -1);
    c->array_any = sequence(c, "[", "]", c->value, 0, -1);
    nv_gbody body = {0};
    const int alts[] = {c->object_any, c->array_any, string_len(c, 0, -1), number(c)};
    for (size_t i = 0; i < sizeof alts / sizeof alts[0]; i++) {
        nv_gbody_ref(&body, alts[i]);
        nv_gbody_alt(&body);
    }
    nv_gbody_lit(c->b, &body, "true", 4);
    nv_gbody_alt(&body);
    nv_gbody_lit(c->b, &body, "false", 5);
    nv_gbody_alt(&body);
    nv_gbody_lit(c->b, &body, "null", 4);
    nv_gbuild_define(c->b, c->value, &body);
    return c->value;
}

/* ---- integer ranges ---- */

/* Digit strings of length n between lo and hi (inclusive, same length), digit by digit. */
static int digits_between(sc *c, const char *lo, const char *hi, int n) {
    nv_gbody body = {0};
    if (n == 0) return nv_gbuild_add(c->b, &body);
    if (strspn(lo, "0") >= (size_t)n && strspn(hi, "9") >= (size_t)n) return repeat(c, digit(c), n, n);
    if (lo[0] == hi[0]) {
        nv_gbody_range(c->b, &body, (unsigned char)lo[0], (unsigned char)lo[0]);
        nv_gbody_ref(&body, digits_between(c, lo + 1, hi + 1, n - 1));
        return nv_gbuild_add(c->b, &body);
    }
    static const char nines[] = "9999999999999999", zeros[] = "0000000000000000";
    /* lo[0] then >= lo[1..]; the digits strictly between, anything after; hi[0] then <= hi[1..] */
    int ge = digits_between(c, lo + 1, nines, n - 1), le = digits_between(c, zeros, hi + 1, n - 1);
    int any = repeat(c, digit(c), n - 1, n - 1);
    nv_gbody_range(c->b, &body, (unsigned char)lo[0], (unsigned char)lo[0]);
    nv_gbody_ref(&body, ge);
    if (hi[0] - lo[0] > 1) {
        nv_gbody_alt(&body);
        nv_gbody_range(c->b, &body, (unsigned char)lo[0] + 1u, (unsigned char)hi[0] - 1u);
        nv_gbody_ref(&body, any);
    }
    nv_gbody_alt(&body);
    nv_gbody_range(c->b, &body, (unsigned char)hi[0], (unsigned char)hi[0]);
    nv_gbody_ref(&body, le);
    return nv_gbuild_add(c->b, &body);
}

/* A fraction's n digits at most (n >= 1), not all zero: 0{z} [1-9] [0-9]{0, n - 1 - z}. */
static int nonzero_digits(sc *c, int n) {
    nv_gbody body = {0};
    for (int z = 0; z < n; z++) {
        if (z) nv_gbody_alt(&body);
        for (int i = 0; i < z; i++) nv_gbody_lit(c->b, &body, "0", 1);
        nv_gbody_range(c->b, &body, '1', '9');
        nv_gbody_ref(&body, repeat(c, digit(c), 0, n - 1 - z));
    }
    return nv_gbuild_add(c->b, &body);
}

/* A number's significant digits where it must not round onto a whole bound: 15 (DBL_DIG), which a
 * double keeps apart. */
#define EXACT_DIGITS 15

/* The decimal spellings (no leading zeros) of lo..hi, 0 <= lo <= hi <= INT_LIMIT: alternatives
 * appended to body, one per digit count. frac > 0: each followed by a point and up to frac digits
 * not all zero, EXACT_DIGITS in all at most (a digit count that leaves none is left out). */
static void naturals(sc *c, nv_gbody *body, long long lo, long long hi, int *first, int frac) {
    long long p = 1;
    for (int d = 1; d <= INT_DIGITS && lo <= hi; d++, p *= 10) {
        long long top = p * 10 - 1; /* the largest d-digit number */
        if (lo > top) continue;
        long long a = lo, z = hi < top ? hi : top;
        lo = z + 1;
        if (frac && d >= EXACT_DIGITS) continue;
        char sa[24], sz[24];
        snprintf(sa, sizeof sa, "%0*lld", d, a);
        snprintf(sz, sizeof sz, "%0*lld", d, z);
        if (!*first) nv_gbody_alt(body);
        *first = 0;
        nv_gbody_ref(body, digits_between(c, sa, sz, d));
        if (frac) {
            nv_gbody_lit(c->b, body, ".", 1);
            nv_gbody_ref(body, nonzero_digits(c, EXACT_DIGITS - d < frac ? EXACT_DIGITS - d : frac));
        }
    }
}

static int integer_range(sc *c, long long lo, long long hi) {
    nv_gbody body = {0};
    int first = 1;
    if (lo < 0) { /* -(max(1, -hi) .. -lo) */
        nv_gbody inner = {0};
        int f2 = 1;
        naturals(c, &inner, hi < 0 ? -hi : 1, -lo, &f2, 0);
        nv_gbody_lit(c->b, &body, "-", 1);
        nv_gbody_ref(&body, nv_gbuild_add(c->b, &inner));
        first = 0;
    }
    if (hi >= 0) naturals(c, &body, lo > 0 ? lo : 0, hi, &first, 0);
    return nv_gbuild_add(c->b, &body);
}

/* ---- multiples ---- */

#define MULT_LISTED 4096 /* the most multiples in a range written out one by one (a trie) */
#define MULT_STATES 100  /* the largest divisor (its factors of 10 aside) followed digit by digit */

static int literal_trie(sc *c, char **lits, int n, size_t d);

/* Positive multiples of k (2..MULT_STATES) of 1..n digits, digit by digit: rest[m k + r] is what may
 * follow digits of remainder r when up to m more may come, ending at remainder 0 (-1: nothing can). */
static int positive_multiples(sc *c, long long k, int n) {
    int *rest = malloc((size_t)n * (size_t)k * sizeof *rest);
    if (!rest) return fail(c, NV_ENOMEM, "out of memory");
    nv_gbody body = {0};
    for (int m = 0; m < n && c->err == NV_OK; m++)
        for (long long r = 0; r < k; r++) {
            int alts = 0;
            if (r == 0) nv_gbody_alt(&body), alts++; /* (it may end here) */
            for (long long t = 0; m > 0 && t < k; t++) { /* the digits taking r to t, where t can still end */
                const int next = rest[(size_t)(m - 1) * (size_t)k + (size_t)t];
                char digits[11] = "";
                for (int d = 0, i = 0; d < 10; d++)
                    if ((10 * r + d) % k == t) digits[i++] = (char)('0' + d);
                if (next < 0 || !digits[0]) continue;
                if (alts++) nv_gbody_alt(&body);
                nv_gbody_chars(c->b, &body, digits);
                nv_gbody_ref(&body, next);
            }
            rest[(size_t)m * (size_t)k + (size_t)r] = alts ? nv_gbuild_add(c->b, &body) : -1;
        }
    int alts = 0; /* the first digit, not 0 */
    for (int d = 1; d < 10 && c->err == NV_OK; d++) {
        const int next = rest[(size_t)(n - 1) * (size_t)k + (size_t)(d % k)];
        if (next < 0) continue;
        if (alts++) nv_gbody_alt(&body);
        const char one[2] = {(char)('0' + d), 0};
        nv_gbody_lit(c->b, &body, one, 1);
        nv_gbody_ref(&body, next);
    }
    free(rest);
    return alts ? nv_gbuild_add(c->b, &body) : fail(c, NV_EINVAL, "no multiple of %lld has at most %d digits", k, n);
}

/* JSON Schema's multipleOf k (whole, >= 2) on the integers lo..hi: written out as a trie when there
 * are at most MULT_LISTED of them; else, in a range open at each end it is not 0 at (any number, the
 * naturals, the negatives), digit by digit for k = c 10^m with c <= MULT_STATES (c's multiples, then m
 * zeros). Anything else is refused, as every constraint is enforced or refused. */
static int integer_multiples(sc *c, long long lo, long long hi, long long k) {
    const long long m_lo = lo >= 0 ? (lo + k - 1) / k : -((-lo) / k), m_hi = hi >= 0 ? hi / k : -((-hi + k - 1) / k);
    if (m_lo > m_hi) return fail(c, NV_EINVAL, "no multiple of %lld lies between the integer bounds", k);
    if (m_hi - m_lo < MULT_LISTED) {
        const int n = (int)(m_hi - m_lo + 1);
        char **lits = calloc((size_t)n, sizeof *lits);
        if (!lits) return fail(c, NV_ENOMEM, "out of memory");
        for (int i = 0; i < n && c->err == NV_OK; i++)
            if (!(lits[i] = malloc(24))) fail(c, NV_ENOMEM, "out of memory");
            else snprintf(lits[i], 24, "%lld", (m_lo + i) * k);
        int r = 0;
        if (c->err == NV_OK) {
            qsort(lits, (size_t)n, sizeof *lits, nv_strcmp_ptrs);
            r = literal_trie(c, lits, n, 0);
        }
        for (int i = 0; i < n; i++) free(lits[i]);
        free(lits);
        return r;
    }
    /* the positive multiples, the negative ones: none or all of each (up to INT_DIGITS digits) */
    const int pos = hi >= k, neg = lo <= -k, zero = lo <= 0 && hi >= 0;
    long long core = k;
    int zeros = 0;
    while (core % 10 == 0) core /= 10, zeros++;
    if ((pos && (hi != INT_LIMIT || lo > k)) || (neg && (lo != -INT_LIMIT || hi < -k)) || core > MULT_STATES)
        return fail(c, NV_EUNSUPPORTED, "'multipleOf' %lld between these bounds is not supported (at most %d multiples in range; or a "
                                        "range open at its ends away from 0, for a divisor of at most %d times a power of 10)",
                    k, MULT_LISTED, MULT_STATES);
    const char tail[] = "0000000000000000";
    nv_gbody body = {0};
    int mult; /* the digits before the zeros: core's multiples, or any (core 1: [1-9][0-9]{0, 15 - zeros}) */
    if (core > 1) {
        mult = positive_multiples(c, core, INT_DIGITS - zeros);
    } else {
        nv_gbody_range(c->b, &body, '1', '9');
        nv_gbody_ref(&body, repeat(c, digit(c), 0, INT_DIGITS - zeros - 1));
        mult = nv_gbuild_add(c->b, &body);
    }
    nv_gbody_ref(&body, mult);
    nv_gbody_lit(c->b, &body, tail, (size_t)zeros);
    const int positive = nv_gbuild_add(c->b, &body);
    int first = 1;
    const int parts[3] = {zero, pos, neg};
    for (int i = 0; i < 3; i++) {
        if (!parts[i]) continue;
        if (!first) nv_gbody_alt(&body);
        first = 0;
        if (i == 0) nv_gbody_lit(c->b, &body, "0", 1);
        if (i == 2) nv_gbody_lit(c->b, &body, "-", 1);
        if (i) nv_gbody_ref(&body, positive);
    }
    return nv_gbuild_add(c->b, &body);
}

/* ---- formats ---- */

/* lo..hi written with exactly two digits */
static int two_digits(sc *c, int lo, int hi) {
    char a[8], z[8];
    snprintf(a, sizeof a, "%02d", lo);
    snprintf(z, sizeof z, "%02d", hi);
    return digits_between(c, a, z, 2);
}

/* HH:MM:SS, optional fraction, then Z or an offset (RFC 3339) */
static int format_time(sc *c) {
    nv_gbody body = {0};
    nv_gbody_alt(&body);
    nv_gbody_lit(c->b, &body, ".", 1);
    nv_gbody_ref(&body, repeat(c, digit(c), 1, 9));
    int frac = nv_gbuild_add(c->b, &body);
    nv_gbody_chars(c->b, &body, "Zz");
    nv_gbody_alt(&body);
    nv_gbody_chars(c->b, &body, "+-");
    nv_gbody_ref(&body, two_digits(c, 0, 23));
    nv_gbody_lit(c->b, &body, ":", 1);
    nv_gbody_ref(&body, two_digits(c, 0, 59));
    int zone = nv_gbuild_add(c->b, &body);
    nv_gbody_ref(&body, two_digits(c, 0, 23));
    nv_gbody_lit(c->b, &body, ":", 1);
    nv_gbody_ref(&body, two_digits(c, 0, 59));
    nv_gbody_lit(c->b, &body, ":", 1);
    nv_gbody_ref(&body, two_digits(c, 0, 60)); /* a leap second */
    nv_gbody_ref(&body, frac);
    nv_gbody_ref(&body, zone);
    return nv_gbuild_add(c->b, &body);
}

static int format_rule(sc *c, const char *f) {
    nv_gbody body = {0};
    int d = digit(c);
    if (!strcmp(f, "date") || !strcmp(f, "date-time")) {
        /* YYYY-MM-DD, months 01-12, days 01-31 */
        for (int i = 0; i < 4; i++) nv_gbody_ref(&body, d);
        nv_gbody_lit(c->b, &body, "-", 1);
        nv_gbody_ref(&body, two_digits(c, 1, 12));
        nv_gbody_lit(c->b, &body, "-", 1);
        nv_gbody_ref(&body, two_digits(c, 1, 31));
        if (f[4]) {
            nv_gbody_lit(c->b, &body, "T", 1);
            nv_gbody_ref(&body, format_time(c));
        }
    } else if (!strcmp(f, "time")) {
        nv_gbody_ref(&body, format_time(c));
    } else if (!strcmp(f, "uuid")) {
        int h = hex(c);
        const int groups[] = {8, 4, 4, 4, 12};
        for (int g = 0; g < 5; g++) {
            if (g) nv_gbody_lit(c->b, &body, "-", 1);
            for (int i = 0; i < groups[g]; i++) nv_gbody_ref(&body, h);
        }
    } else {
        return fail(c, NV_EUNSUPPORTED, "'format': '%.60s' is not supported (date, time, date-time and uuid are)", f);
    }
    return nv_gbuild_add(c->b, &body);
}

/* ---- schemas ---- */

static int gen(sc *c, const cJSON *s);

/* A JSON string literal for text (escaped as cJSON prints it). */
static char *json_quote(const char *text) {
    cJSON *j = cJSON_CreateString(text);
    char *q = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    return q;
}

static const char *const ignored_keys[] = {"title",    "description", "default",  "examples",  "$schema", "$id",
                                           "$comment", "deprecated",  "readOnly", "writeOnly", "$defs",   "definitions"};
static const char *const known_keys[] = {"type",      "properties", "required",  "additionalProperties", "pattern",
                                         "items",     "minItems",   "maxItems",  "minLength", "prefixItems", "additionalItems",
                                         "maxLength", "enum",       "const",     "anyOf",
                                         "oneOf",     "allOf",      "$ref",      "format",
                                         "minimum",   "maximum",    "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
                                         "uniqueItems"};

static int in_list(const char *k, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(k, list[i])) return 1;
    return 0;
}

/* A non-negative integer keyword (absent: def). */
static long count_kw(sc *c, const cJSON *s, const char *key, long def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    if (!v) return def;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble) || v->valuedouble > 1e9) {
        fail(c, NV_EINVAL, "'%s' must be a non-negative integer", key);
        return def;
    }
    return (long)v->valuedouble;
}

/* Follows a "#..." reference (JSON pointer, with ~0 ~1 escapes) in doc: 0 and *at, 1 when ref is
 * not "#...", 2 when a name in it is longer than 255 bytes, 3 when it points nowhere in doc. */
static int json_pointer(const cJSON *doc, const char *ref, const cJSON **at_out) {
    if (ref[0] != '#') return 1;
    const cJSON *at = doc;
    const char *p = ref + 1;
    while (*p) {
        if (*p != '/') break;
        p++;
        char key[256];
        size_t n = 0;
        while (*p && *p != '/') {
            char ch = *p++;
            if (ch == '~' && (*p == '0' || *p == '1')) ch = *p++ == '0' ? '~' : '/';
            else if (ch == '%' && isxdigit((unsigned char)p[0]) && isxdigit((unsigned char)p[1])) { /* a URI fragment's escape */
                char hx[3] = {p[0], p[1], 0};
                ch = (char)strtol(hx, NULL, 16);
                p += 2;
            }
            if (n + 1 >= sizeof key) return 2;
            key[n++] = ch;
        }
        key[n] = '\0';
        if (cJSON_IsArray(at)) {
            char *end;
            long i = strtol(key, &end, 10);
            at = *key && !*end && i >= 0 ? cJSON_GetArrayItem(at, (int)i) : NULL;
        } else {
            at = cJSON_IsObject(at) ? cJSON_GetObjectItemCaseSensitive(at, key) : NULL;
        }
        if (!at) break;
    }
    if (!at || *p) return 3;
    *at_out = at;
    return 0;
}

static const cJSON *resolve(sc *c, const char *ref) {
    const cJSON *at = NULL;
    switch (json_pointer(c->doc, ref, &at)) {
    case 0: return at;
    case 1: fail(c, NV_EUNSUPPORTED, "'$ref': '%.100s' is not supported (only references into the schema itself, '#...')", ref); break;
    case 2: fail(c, NV_EUNSUPPORTED, "'$ref': '%.100s' has a name longer than 255 bytes", ref); break;
    default: fail(c, NV_EINVAL, "'$ref': '%.100s' does not point into the schema", ref);
    }
    return NULL;
}

static int raw_string(sc *c, const cJSON *s);
static int raw_char(sc *c);

/* The rule of what ref points to, made once per form (raw: as raw_string writes it). */
static int gen_ref(sc *c, const char *ref, int raw) {
    const cJSON *target = resolve(c, ref);
    if (!target) return 0;
    const int mode = raw ? REF_RAW : c->xml;
    for (int i = 0; i < c->n_refs; i++)
        if (c->refs[i].target == target && c->refs[i].mode == mode) return c->refs[i].rule;
    if (c->n_refs == c->cap_refs) {
        int cap = c->cap_refs ? c->cap_refs * 2 : 8;
        ref_rule *r = realloc(c->refs, (size_t)cap * sizeof *r);
        if (!r) return fail(c, NV_ENOMEM, "out of memory");
        c->refs = r;
        c->cap_refs = cap;
    }
    /* the rule is named before its body is made, so the target may refer to itself */
    int id = nv_gbuild_reserve(c->b);
    c->refs[c->n_refs++] = (ref_rule){target, mode, id};
    nv_gbody body = {0};
    nv_gbody_ref(&body, raw ? raw_string(c, target) : gen(c, target));
    nv_gbuild_define(c->b, id, &body);
    return id;
}

/* An object with the listed properties, in their order; those not required may be left out. */
static int gen_properties(sc *c, const cJSON *props, const cJSON *required) {
    int k = cJSON_GetArraySize(props);
    int *members = calloc((size_t)k + 1, sizeof *members);
    uint8_t *req = calloc((size_t)k + 1, 1);
    if (!members || !req) {
        free(members);
        free(req);
        return fail(c, NV_ENOMEM, "out of memory");
    }
    int i = 0;
    for (const cJSON *p = props->child; p; p = p->next, i++) {
        if (c->xml && strstr(p->string, XML_PARAM_CLOSE)) {
            fail(c, NV_EUNSUPPORTED, "a member named with \"" XML_PARAM_CLOSE "\" cannot be written in a tool call as XML");
            break;
        }
        char *key = json_quote(p->string);
        if (!key) {
            fail(c, NV_ENOMEM, "out of memory");
            break;
        }
        members[i] = member(c, key, 0, gen(c, p));
        cJSON_free(key);
    }
    for (const cJSON *r = required ? required->child : NULL; r; r = r->next) { /* (object_keywords checked them) */
        int j = 0;
        for (const cJSON *p = props->child; p && strcmp(p->string, r->valuestring); p = p->next) j++;
        req[j] = 1;
    }
    /* first_i: members i.. with none written yet; next_i: with some written (a comma first) */
    int w = ws(c);
    nv_gbody body = {0};
    int first = nv_gbuild_add(c->b, &body), next = nv_gbuild_add(c->b, &body);
    for (i = k - 1; i >= 0; i--) {
        nv_gbody_ref(&body, members[i]);
        nv_gbody_ref(&body, w);
        nv_gbody_ref(&body, next);
        if (!req[i]) {
            nv_gbody_alt(&body);
            nv_gbody_ref(&body, first);
        }
        int nfirst = nv_gbuild_add(c->b, &body);
        nv_gbody_lit(c->b, &body, ",", 1);
        nv_gbody_ref(&body, w);
        nv_gbody_ref(&body, members[i]);
        nv_gbody_ref(&body, w);
        nv_gbody_ref(&body, next);
        if (!req[i]) {
            nv_gbody_alt(&body);
            nv_gbody_ref(&body, next);
        }
        next = nv_gbuild_add(c->b, &body);
        first = nfirst;
    }
    free(members);
    free(req);
    nv_gbody_lit(c->b, &body, "{", 1);
    nv_gbody_ref(&body, w);
    nv_gbody_ref(&body, first);
    nv_gbody_lit(c->b, &body, "}", 1);
    return nv_gbuild_add(c->b, &body);
}

/* An object schema's properties, required and additionalProperties (*props, *req, *add), checked:
 * each of its kind; with properties, no additionalProperties but false (members are the listed
 * ones) and required naming them; without, nothing required. 1, or 0 with c->err set. */
static int object_keywords(sc *c, const cJSON *s, const cJSON **props, const cJSON **req, const cJSON **add) {
    *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (*props && !cJSON_IsObject(*props)) return fail(c, NV_EINVAL, "'properties' must be an object");
    if (*req && !cJSON_IsArray(*req)) return fail(c, NV_EINVAL, "'required' must be an array");
    if (*add && !cJSON_IsBool(*add) && !cJSON_IsObject(*add))
        return fail(c, NV_EINVAL, "'additionalProperties' must be a boolean or a schema");
    if (!*props || !(*props)->child)
        return *req && (*req)->child ? fail(c, NV_EUNSUPPORTED, "'required' without 'properties' is not supported") : 1;
    if (*add && !cJSON_IsFalse(*add))
        return fail(c, NV_EUNSUPPORTED, "'additionalProperties' beside 'properties' is not supported (members are the listed ones)");
    for (const cJSON *r = *req ? (*req)->child : NULL; r; r = r->next)
        if (!cJSON_IsString(r)) return fail(c, NV_EINVAL, "'required' must list property names");
        else if (!cJSON_GetObjectItemCaseSensitive(*props, r->valuestring))
            return fail(c, NV_EUNSUPPORTED, "'required' names '%.100s', which is not among 'properties'", r->valuestring);
    return 1;
}

static int gen_object(sc *c, const cJSON *s) {
    const cJSON *props, *req, *add;
    if (!object_keywords(c, s, &props, &req, &add)) return 0;
    if (props && props->child) return gen_properties(c, props, req);
    if (cJSON_IsFalse(add)) return sequence(c, "{", "}", 0, 0, 0); /* nothing may be in it */
    int value = cJSON_IsObject(add) ? gen(c, add) : any_value(c);
    if (!cJSON_IsObject(add)) return c->object_any;
    return sequence(c, "{", "}", member(c, NULL, string_len(c, 0, -1), value), 0, -1);
}

/* items (a schema, or false: none), minItems, maxItems; a tuple's first items each their own schema:
 * prefixItems (2020-12, items then the rest) or items as a list (drafts 4 to 7, additionalItems the rest). */
#define UNIQUE_VALUES 10 /* the most values uniqueItems follows (a rule per set of them used) */

static int enum_texts(sc *c, const cJSON *list, const cJSON *type, const char *key, int raw, char ***out);
static int schema_keys(sc *c, const cJSON *s, const char **branch);

/* An enum's values, or const's as a list of one (*one, which the caller deletes); NULL when out of
 * memory. */
static const cJSON *values_of(const cJSON *s, const char *branch, cJSON **one) {
    *one = NULL;
    if (strcmp(branch, "const")) return cJSON_GetObjectItemCaseSensitive(s, "enum");
    *one = cJSON_CreateArray();
    return *one && cJSON_AddItemReferenceToArray(*one, cJSON_GetObjectItemCaseSensitive(s, "const")) ? *one : NULL;
}

/* uniqueItems over items of an enum or a const (a $ref to one, as pydantic writes set[Enum]): a rule
 * per set of values written so far, each next value one not in it, min..max of them. Items of other
 * schemas are refused (the grammar cannot compare arbitrary values). */
static int unique_items(sc *c, const cJSON *items, long min, long max) {
    const cJSON *t = items;
    for (int hops = 0; t && cJSON_IsObject(t) && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(t, "$ref")) && hops < MAX_DEPTH; hops++)
        t = resolve(c, cJSON_GetObjectItemCaseSensitive(t, "$ref")->valuestring);
    const char *branch = NULL;
    if (c->err != NV_OK) return 0;
    if (!cJSON_IsObject(t) || !schema_keys(c, t, &branch) || !branch || (strcmp(branch, "enum") && strcmp(branch, "const")))
        return c->err != NV_OK ? 0
                               : fail(c, NV_EUNSUPPORTED, "'uniqueItems' is supported on items of an 'enum' or a 'const' (of at most %d values)",
                                      UNIQUE_VALUES);
    cJSON *one = NULL;
    const cJSON *list = values_of(t, branch, &one);
    char **lits = NULL;
    int n = -1;
    if (!list) fail(c, NV_ENOMEM, "out of memory");
    else if (!cJSON_IsArray(list) || !list->child) fail(c, NV_EINVAL, "'enum' must be a non-empty array");
    else n = enum_texts(c, list, cJSON_GetObjectItemCaseSensitive(t, "type"), branch, 0, &lits);
    cJSON_Delete(one);
    int r = 0;
    if (n > UNIQUE_VALUES) fail(c, NV_EUNSUPPORTED, "'uniqueItems' over %d values is not supported (at most %d)", n, UNIQUE_VALUES);
    else if (n >= 0 && min > n) fail(c, NV_EINVAL, "'minItems' %ld is more than the %d values 'uniqueItems' leaves", min, n);
    for (int i = 0; i < n && c->err == NV_OK; i++) /* (objects equal whatever their keys' order: texts cannot tell them apart) */
        if (lits[i][0] == '{' || lits[i][0] == '[')
            fail(c, NV_EUNSUPPORTED, "'uniqueItems' over objects or arrays is not supported (only strings, numbers, booleans, null)");
    if (n >= 0 && c->err == NV_OK) {
        if (max < 0 || max > n) max = n;
        const int w = ws(c), full = (1 << n) - 1;
        int *after = malloc(((size_t)full + 1) * sizeof *after); /* after[set]: what may follow once those values are written */
        int value[UNIQUE_VALUES]; /* each value's text, one rule the sets refer to */
        for (int i = 0; i < n; i++) value[i] = lit_rule(c, lits[i]);
        nv_gbody body = {0};
        for (int set = full; after && set >= 1; set--) { /* (supersets first: their rules are made) */
            const int count = __builtin_popcount((unsigned)set);
            int alts = 0;
            if (count >= min) nv_gbody_lit(c->b, &body, "]", 1), alts++;
            for (int i = 0; i < n && count < max; i++) {
                if (set & (1 << i)) continue;
                if (alts++) nv_gbody_alt(&body);
                nv_gbody_lit(c->b, &body, ",", 1);
                nv_gbody_ref(&body, w);
                nv_gbody_ref(&body, value[i]);
                nv_gbody_ref(&body, w);
                nv_gbody_ref(&body, after[set | 1 << i]);
            }
            after[set] = nv_gbuild_add(c->b, &body);
        }
        int alts = 0; /* "[", then "]" or a first value */
        if (min == 0) nv_gbody_lit(c->b, &body, "]", 1), alts++;
        for (int i = 0; after && i < n && max > 0; i++) {
            if (alts++) nv_gbody_alt(&body);
            nv_gbody_ref(&body, value[i]);
            nv_gbody_ref(&body, w);
            nv_gbody_ref(&body, after[1 << i]);
        }
        const int rest = after ? nv_gbuild_add(c->b, &body) : fail(c, NV_ENOMEM, "out of memory");
        if (after) {
            nv_gbody_lit(c->b, &body, "[", 1);
            nv_gbody_ref(&body, w);
            nv_gbody_ref(&body, rest);
            r = nv_gbuild_add(c->b, &body);
        }
        free(after);
    }
    for (int i = 0; i < n; i++) cJSON_free(lits[i]);
    free(lits);
    return r;
}

static int gen_array(sc *c, const cJSON *s) {
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items"), *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    const cJSON *additional = cJSON_GetObjectItemCaseSensitive(s, "additionalItems");
    if (prefix && cJSON_IsArray(items)) return fail(c, NV_EINVAL, "'prefixItems' beside a list of 'items'");
    if (prefix && !cJSON_IsArray(prefix)) return fail(c, NV_EINVAL, "'prefixItems' must be a list of schemas");
    if (cJSON_IsArray(items)) prefix = items, items = additional; /* the older drafts' tuple */
    else if (additional) return fail(c, NV_EUNSUPPORTED, "'additionalItems' without a list of 'items' is not supported");
    if (items && !cJSON_IsObject(items) && !cJSON_IsBool(items)) return fail(c, NV_EINVAL, "'items' must be a schema");
    long min = count_kw(c, s, "minItems", 0), max = count_kw(c, s, "maxItems", -1);
    if (max >= 0 && max < min) return fail(c, NV_EINVAL, "'maxItems' is below 'minItems'");
    const int n_prefix = prefix ? cJSON_GetArraySize(prefix) : 0;
    if (n_prefix > MAX_REPEAT) return fail(c, NV_EUNSUPPORTED, "a tuple of over %s items is not supported", "10000");
    if (cJSON_IsFalse(items) && min > n_prefix) return fail(c, NV_EINVAL, "'items': false with 'minItems' above the tuple's length matches nothing");
    const cJSON *uniq = cJSON_GetObjectItemCaseSensitive(s, "uniqueItems");
    if (uniq && !cJSON_IsBool(uniq)) return fail(c, NV_EINVAL, "'uniqueItems' must be true or false");
    if (cJSON_IsTrue(uniq) && n_prefix) return fail(c, NV_EUNSUPPORTED, "'uniqueItems' beside a tuple ('prefixItems') is not supported");
    if (cJSON_IsTrue(uniq)) return unique_items(c, cJSON_IsObject(items) ? items : NULL, min, max);
    int *rules = n_prefix ? calloc((size_t)n_prefix, sizeof *rules) : NULL;
    if (n_prefix && !rules) return fail(c, NV_ENOMEM, "out of memory");
    int k = 0;
    for (const cJSON *p = prefix ? prefix->child : NULL; p; p = p->next) rules[k++] = gen(c, p);
    const int item = cJSON_IsFalse(items) ? -1 : items && cJSON_IsObject(items) ? gen(c, items) : any_value(c);
    const int r = c->err == NV_OK ? sequence_of(c, "[", "]", rules, n_prefix, item, min, max) : 0;
    free(rules);
    return r;
}

/* ---- pattern: an ECMAScript regular expression (a subset) to the JSON strings it matches ---- */

/* The grammar writes a string's JSON text, so each character the expression allows is written as
 * JSON writes it: '"' and '\' escaped, control characters as \n, \t, ... or \u00XX, the rest as
 * its UTF-8 bytes. Only that one spelling is generated (JSON allows others, e.g. \u0061): every
 * generated text decodes to a string the expression matches. */

typedef struct {
    uint8_t ascii[16];  /* members below 0x80 */
    uint32_t cps[64];   /* members above, one by one */
    int n_cps;
    int multibyte;      /* every character above 0x7F (1), or those but U+2028/U+2029 (2, for '.') */
    int has_space;      /* \s or \S is in it: its negation must not reach past ASCII (Unicode spaces) */
} rx_class;

typedef struct {
    sc *c;
    const char *p, *end;
    int depth;
    int raw; /* guided_regex: the whole text matches, each character written as its UTF-8 bytes */
    int search; /* with raw: a string parameter written as XML, which (as JSON's 'pattern') need only hold a match */
} rx;

static int rx_fail(rx *r, const char *what) { return fail(r->c, NV_EUNSUPPORTED, "%s: %s", r->raw ? "regex" : "'pattern'", what); }

static void cls_ascii(rx_class *k, unsigned lo, unsigned hi) {
    for (unsigned x = lo; x <= hi && x < 128; x++) k->ascii[x >> 3] |= (uint8_t)(1u << (x & 7));
}

static int cls_add(rx *r, rx_class *k, uint32_t lo, uint32_t hi) {
    if (lo > hi) return rx_fail(r, "a class range runs backwards");
    if (hi < 128) {
        cls_ascii(k, lo, hi);
        return 1;
    }
    if (lo != hi) return rx_fail(r, "a class range past ASCII is not supported");
    if (k->n_cps == 64) return rx_fail(r, "a class with more than 64 characters past ASCII is not supported");
    k->cps[k->n_cps++] = lo;
    return 1;
}

/* \d \w \s and their negations (ASCII, as ECMAScript without the i flag; \S keeps to ASCII so no
 * Unicode space slips in). */
static int cls_shorthand(rx *r, rx_class *k, char e) {
    rx_class t = {0};
    if (e == 'd' || e == 'D') cls_ascii(&t, '0', '9');
    if (e == 'w' || e == 'W') cls_ascii(&t, '0', '9'), cls_ascii(&t, 'A', 'Z'), cls_ascii(&t, 'a', 'z'), cls_ascii(&t, '_', '_');
    if (e == 's' || e == 'S') cls_ascii(&t, '\t', '\r'), cls_ascii(&t, ' ', ' ');
    int neg = e == 'D' || e == 'W' || e == 'S';
    for (int i = 0; i < 16; i++) k->ascii[i] |= neg ? (uint8_t)~t.ascii[i] : t.ascii[i];
    if (neg && e != 'S') k->multibyte = 1;
    if (e == 's' || e == 'S') k->has_space = 1;
    (void)r;
    return 1;
}

/* One code point from the pattern's UTF-8 (the pattern is a JSON string, so its text is UTF-8). */
static int rx_codepoint(rx *r, uint32_t *cp) {
    const size_t n = nv_utf8_get(r->p, r->end, cp);
    if (!n) return rx_fail(r, "not UTF-8");
    r->p += n;
    return 1;
}

static int rx_hex(rx *r, int digits, uint32_t *cp) {
    uint32_t v = 0;
    for (int i = 0; i < digits; i++, r->p++) {
        if (r->p >= r->end || !isxdigit((unsigned char)*r->p)) return rx_fail(r, "a \\x or \\u escape needs hex digits");
        v = v * 16 + (uint32_t)(isdigit((unsigned char)*r->p) ? *r->p - '0' : (tolower((unsigned char)*r->p) - 'a' + 10));
    }
    *cp = v;
    return 1;
}

/* After a backslash: a class shorthand (class set) or one code point. Returns 1, or 0 failed. */
static int rx_escape(rx *r, rx_class *k, int *is_class, uint32_t *cp) {
    if (r->p >= r->end) return rx_fail(r, "it ends with a backslash");
    char e = *r->p++;
    *is_class = 0;
    switch (e) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S': *is_class = 1; return cls_shorthand(r, k, e);
    case 'n': *cp = '\n'; return 1;
    case 'r': *cp = '\r'; return 1;
    case 't': *cp = '\t'; return 1;
    case 'f': *cp = '\f'; return 1;
    case 'v': *cp = '\v'; return 1;
    case '0':
        if (r->p < r->end && isdigit((unsigned char)*r->p)) return rx_fail(r, "octal escapes are not supported");
        *cp = 0;
        return 1;
    case 'x': return rx_hex(r, 2, cp);
    case 'u':
        if (r->p < r->end && *r->p == '{') return rx_fail(r, "\\u{...} is not supported");
        if (!rx_hex(r, 4, cp)) return 0;
        if (*cp >= 0xD800 && *cp <= 0xDFFF) return rx_fail(r, "a surrogate escape is not supported");
        return 1;
    case 'b': case 'B': return rx_fail(r, "word boundaries (\\b, \\B) are not supported");
    case 'p': case 'P': return rx_fail(r, "Unicode properties (\\p, \\P) are not supported");
    case 'k': case 'c': return rx_fail(r, "\\k and \\c are not supported");
    default:
        if (e >= '1' && e <= '9') return rx_fail(r, "back references are not supported");
        if (isalnum((unsigned char)e)) return rx_fail(r, "an unknown escape");
        r->p--;
        return rx_codepoint(r, cp); /* an escaped punctuation character stands for itself */
    }
}

/* The JSON spelling of one code point as grammar text appended to body. */
static void json_char(sc *c, nv_gbody *body, uint32_t cp) {
    char buf[8];
    size_t n = cp < 0x80 ? nv_json_escape(cp, buf) : 0;
    if (!n) n = nv_utf8_put(cp, buf);
    nv_gbody_lit(c->b, body, buf, n);
}

/* One character as the expression's text writes it: its JSON spelling, or (raw) its UTF-8 bytes. */
static void rx_char(rx *r, nv_gbody *body, uint32_t cp) {
    if ((cp == '<' || cp == 0) && r->c->xml) {
        rx_fail(r, cp ? "'<' cannot be held in a value of a tool call written as XML" : "NUL cannot be held in a value of a tool call written as XML");
        return;
    }
    if (!r->raw) {
        json_char(r->c, body, cp);
        return;
    }
    char buf[4];
    nv_gbody_lit(r->c->b, body, buf, nv_utf8_put(cp, buf));
}

/* A class as one rule: the plain ASCII members as one byte set, the others spelled as JSON does
 * (raw: every ASCII member is plain). */
static int cls_rule(rx *r, const rx_class *k) {
    sc *c = r->c;
    nv_gbody body = {0};
    uint8_t plain[32] = {0};
    int any = 0, first = 1;
    for (unsigned x = r->raw ? 0 : 0x20; x < 0x80; x++)
        if ((r->raw || (x != '"' && x != '\\')) && (k->ascii[x >> 3] >> (x & 7) & 1) && !(c->xml && (x == '<' || x == 0)))
            plain[x >> 3] |= (uint8_t)(1u << (x & 7)), any = 1;
    if (any) nv_gbody_set(c->b, &body, plain), first = 0;
    for (unsigned x = 0; x < 0x20 && !r->raw; x++)
        if (k->ascii[x >> 3] >> (x & 7) & 1) {
            if (!first) nv_gbody_alt(&body);
            json_char(c, &body, x), first = 0;
        }
    const unsigned esc[] = {'"', '\\'};
    for (int i = 0; i < 2 && !r->raw; i++)
        if (k->ascii[esc[i] >> 3] >> (esc[i] & 7) & 1) {
            if (!first) nv_gbody_alt(&body);
            json_char(c, &body, esc[i]), first = 0;
        }
    for (int i = 0; i < k->n_cps; i++) {
        if (!first) nv_gbody_alt(&body);
        rx_char(r, &body, k->cps[i]), first = 0;
    }
    if (k->multibyte) {
        if (!first) nv_gbody_alt(&body);
        utf8_multibyte(c, &body, k->multibyte == 2);
        first = 0;
    }
    if (first) return rx_fail(r, "a class that matches nothing");
    return nv_gbuild_add(c->b, &body);
}

static int rx_alt(rx *r, int top, int *nullable);

static int rx_class_atom(rx *r) {
    rx_class k = {0};
    int neg = r->p < r->end && *r->p == '^';
    if (neg) r->p++;
    while (r->p < r->end && *r->p != ']') { /* ECMAScript: "[]" is empty, "[^]" any character */
        uint32_t lo;
        int is_class = 0;
        if (*r->p == '\\') {
            r->p++;
            if (!rx_escape(r, &k, &is_class, &lo)) return 0;
            if (is_class) continue;
        } else if (!rx_codepoint(r, &lo)) return 0;
        uint32_t hi = lo;
        if (r->p + 1 < r->end && *r->p == '-' && r->p[1] != ']') {
            r->p++;
            if (*r->p == '\\') {
                r->p++;
                if (!rx_escape(r, &k, &is_class, &hi)) return 0;
                if (is_class) return rx_fail(r, "a class shorthand cannot end a range");
            } else if (!rx_codepoint(r, &hi)) return 0;
        }
        if (!cls_add(r, &k, lo, hi)) return 0;
    }
    if (r->p >= r->end) return rx_fail(r, "a '[' without its ']'");
    r->p++;
    if (neg) {
        if (k.n_cps || k.multibyte) return rx_fail(r, "a negated class with members past ASCII is not supported");
        for (int i = 0; i < 16; i++) k.ascii[i] = (uint8_t)~k.ascii[i];
        k.multibyte = !k.has_space; /* past ASCII, whitespace is Unicode's: keep to ASCII then */
    }
    return cls_rule(r, &k);
}

/* One atom: a group, a class, '.', an escape or a character (*nullable: it can match nothing). */
static int rx_atom(rx *r, int *nullable) {
    const char ch = *r->p;
    *nullable = 0;
    if (ch == '(') {
        r->p++;
        if (r->p < r->end && *r->p == '?') {
            if (r->p + 1 < r->end && r->p[1] == ':') r->p += 2;
            else if (r->p + 1 < r->end && r->p[1] == '<' && r->p + 2 < r->end && r->p[2] != '=' && r->p[2] != '!') {
                const char *gt = memchr(r->p, '>', (size_t)(r->end - r->p)); /* a named group: just a group */
                if (!gt) return rx_fail(r, "a group name without its '>'");
                r->p = gt + 1;
            } else return rx_fail(r, "look-around assertions are not supported");
        }
        if (++r->depth > 32) return rx_fail(r, "groups nest deeper than 32");
        int g = rx_alt(r, 0, nullable);
        r->depth--;
        if (r->c->err != NV_OK) return 0;
        if (r->p >= r->end || *r->p != ')') return rx_fail(r, "a '(' without its ')'");
        r->p++;
        return g;
    }
    rx_class k = {0};
    if (ch == '[') {
        r->p++;
        return rx_class_atom(r);
    }
    if (ch == '.') { /* any character but line terminators */
        r->p++;
        cls_ascii(&k, 0x20, 0x7F);
        cls_ascii(&k, '\t', '\t');
        k.multibyte = 2;
        return cls_rule(r, &k);
    }
    if (ch == '^' || ch == '$') return rx_fail(r, "'^' and '$' are supported only at the ends of the pattern's alternatives");
    if (ch == '*' || ch == '+' || ch == '?' || ch == '{') return rx_fail(r, "a quantifier with nothing to repeat");
    uint32_t cp;
    int is_class = 0;
    if (ch == '\\') {
        r->p++;
        if (!rx_escape(r, &k, &is_class, &cp)) return 0;
        if (is_class) return cls_rule(r, &k);
    } else if (!rx_codepoint(r, &cp)) return 0;
    nv_gbody body = {0};
    rx_char(r, &body, cp);
    return nv_gbuild_add(r->c->b, &body);
}

/* An atom's quantifier, if any: *, +, ?, {n}, {n,}, {n,m} (a lazy '?' after it changes nothing
 * here: the same strings match). */
static int rx_quantified(rx *r, int atom, int *nullable) {
    if (r->p >= r->end) return atom;
    long min = -1, max = -1;
    if (*r->p == '*') min = 0, r->p++;
    else if (*r->p == '+') min = 1, r->p++;
    else if (*r->p == '?') min = 0, max = 1, r->p++;
    else if (*r->p == '{') {
        char *e;
        if (!isdigit((unsigned char)r->p[1])) return rx_fail(r, "a '{' that is not a quantifier");
        min = strtol(r->p + 1, &e, 10);
        if (e == r->p + 1 || min < 0 || min > 1000) return rx_fail(r, "a {n,m} quantifier needs counts of at most 1000");
        max = min;
        if (*e == ',') {
            if (e[1] == '}') max = -1, e++;
            else if (!isdigit((unsigned char)e[1])) return rx_fail(r, "a '{' that is not a quantifier");
            else {
                char *f;
                max = strtol(e + 1, &f, 10);
                if (f == e + 1 || max < min || max > 1000) return rx_fail(r, "a {n,m} quantifier needs counts of at most 1000");
                e = f;
            }
        }
        if (*e != '}') return rx_fail(r, "a '{' that is not a quantifier");
        r->p = e + 1;
    } else return atom;
    if (r->p < r->end && *r->p == '?') r->p++;
    if (r->p < r->end && (*r->p == '*' || *r->p == '+' || *r->p == '{')) return rx_fail(r, "a quantifier after a quantifier");
    /* repeating what can match nothing would let the parser loop without reading (e.g. (a*)*):
     * the same strings are written without it, as (a*)? or a* */
    if (*nullable && (max < 0 || max > 1))
        return rx_fail(r, "a repeated part that can match the empty string (write (a*)* as a*, (a?){3} as a{0,3})");
    if (min == 0) *nullable = 1;
    return repeat(r->c, atom, min, max);
}

/* A sequence of quantified atoms; at the top level it may start with '^' and end with '$', and
 * without them any text may come before or after. */
static int rx_seq(rx *r, int top, int *nullable) {
    nv_gbody body = {0};
    int anchored_start = 0, anchored_end = 0;
    *nullable = 1;
    if (top && r->p < r->end && *r->p == '^') anchored_start = 1, r->p++;
    const int pad = top && (!r->raw || r->search); /* a match anywhere: any text before and after it */
    if (pad && !anchored_start) nv_gbody_ref(&body, repeat(r->c, r->raw ? raw_char(r->c) : chr(r->c), 0, -1));
    while (r->p < r->end && *r->p != '|' && *r->p != ')' && r->c->err == NV_OK) {
        if (top && *r->p == '$' && (r->p + 1 == r->end || r->p[1] == '|')) {
            anchored_end = 1;
            r->p++;
            break;
        }
        int an;
        int a = rx_atom(r, &an);
        if (r->c->err != NV_OK) break;
        nv_gbody_ref(&body, rx_quantified(r, a, &an));
        *nullable &= an;
    }
    if (pad && !anchored_end) nv_gbody_ref(&body, repeat(r->c, r->raw ? raw_char(r->c) : chr(r->c), 0, -1));
    if (r->c->err != NV_OK) {
        nv_gbody_free(&body);
        return 0;
    }
    return nv_gbuild_add(r->c->b, &body);
}

static int rx_alt(rx *r, int top, int *nullable) {
    nv_gbody body = {0};
    *nullable = 0;
    for (int first = 1;; first = 0) {
        int sn;
        int s = rx_seq(r, top, &sn);
        *nullable |= sn;
        if (r->c->err != NV_OK) {
            nv_gbody_free(&body);
            return 0;
        }
        if (!first) nv_gbody_alt(&body);
        nv_gbody_ref(&body, s);
        if (r->p < r->end && *r->p == '|') {
            r->p++;
            continue;
        }
        break;
    }
    return nv_gbuild_add(r->c->b, &body);
}

/* "..." whose text matches pattern. */
static int pattern_string(sc *c, const char *pattern) {
    rx r = {c, pattern, pattern + strlen(pattern), 0, 0, 0};
    if (strlen(pattern) > 1000) return fail(c, NV_EUNSUPPORTED, "'pattern' longer than 1000 bytes is not supported");
    int nullable;
    int body_rule = rx_alt(&r, 1, &nullable);
    if (c->err != NV_OK) return 0;
    if (r.p != r.end) return fail(c, NV_EUNSUPPORTED, "'pattern': a ')' without its '('");
    nv_gbody body = {0};
    nv_gbody_lit(c->b, &body, "\"", 1);
    nv_gbody_ref(&body, body_rule);
    nv_gbody_lit(c->b, &body, "\"", 1);
    return nv_gbuild_add(c->b, &body);
}

static int gen_string(sc *c, const cJSON *s) {
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    long min = count_kw(c, s, "minLength", 0), max = count_kw(c, s, "maxLength", -1);
    if (max >= 0 && max < min) return fail(c, NV_EINVAL, "'maxLength' is below 'minLength'");
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    if (pat) {
        if (!cJSON_IsString(pat)) return fail(c, NV_EINVAL, "'pattern' must be a string");
        if (fmt || cJSON_GetObjectItemCaseSensitive(s, "minLength") || cJSON_GetObjectItemCaseSensitive(s, "maxLength"))
            return fail(c, NV_EUNSUPPORTED, "'pattern' with 'format', 'minLength' or 'maxLength' is not supported");
        return pattern_string(c, pat->valuestring);
    }
    if (fmt) {
        if (!cJSON_IsString(fmt)) return fail(c, NV_EINVAL, "'format' must be a string");
        if (cJSON_GetObjectItemCaseSensitive(s, "minLength") || cJSON_GetObjectItemCaseSensitive(s, "maxLength"))
            return fail(c, NV_EUNSUPPORTED, "'format' with 'minLength' or 'maxLength' is not supported");
        nv_gbody body = {0};
        nv_gbody_lit(c->b, &body, "\"", 1);
        nv_gbody_ref(&body, format_rule(c, fmt->valuestring));
        nv_gbody_lit(c->b, &body, "\"", 1);
        return nv_gbuild_add(c->b, &body);
    }
    return string_len(c, min, max);
}

/* multipleOf's divisor of integers into *k: a whole one, or 1 for an inverse of one (0.5, 0.1: every
 * integer is a multiple), or one of a decimal's digits (0.01) into *frac_digits (numbers only:
 * frac_digits NULL for integers; *k then 0); 0 (refused) for anything else. Absent: *k 0. */
static int multiple_of(sc *c, const cJSON *s, long long *k, int *frac_digits) {
    const cJSON *mo = cJSON_GetObjectItemCaseSensitive(s, "multipleOf");
    *k = 0;
    if (frac_digits) *frac_digits = 0;
    if (!mo) return 1;
    if (!cJSON_IsNumber(mo) || !(mo->valuedouble > 0) || !isfinite(mo->valuedouble))
        return fail(c, NV_EINVAL, "'multipleOf' must be a number above 0");
    const double v = mo->valuedouble, inv = 1.0 / v;
    if (v == floor(v) && v <= 1e15) {
        *k = (long long)v;
        return 1;
    }
    for (int n = 1; frac_digits && n <= FRAC_DIGITS; n++) { /* 10^-n, exactly as a double spells it */
        char text[8];
        snprintf(text, sizeof text, "1e-%d", n);
        if (v == strtod(text, NULL)) {
            *frac_digits = n;
            return 1;
        }
    }
    if (!frac_digits && inv == floor(inv)) return *k = 1, 1;
    return fail(c, NV_EUNSUPPORTED, "'multipleOf' %g is not supported (on integers: a whole number up to 10^15 or the inverse of one; "
                                    "on numbers: also 0.1, 0.01, ...)", v);
}

/* Integer bounds: minimum/maximum, exclusiveMinimum/exclusiveMaximum as numbers (draft 6 on) or
 * booleans beside them (draft 4); multipleOf. */
static int gen_integer(sc *c, const cJSON *s) {
    double lo = -(double)INT_LIMIT, hi = (double)INT_LIMIT;
    long long k;
    if (!multiple_of(c, s, &k, NULL)) return 0;
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minimum"), *mx = cJSON_GetObjectItemCaseSensitive(s, "maximum");
    const cJSON *xmn = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum");
    const cJSON *xmx = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    if (fmt) { /* OpenAPI's integer formats: int32 is a range, int64 holds every integer written here */
        if (!cJSON_IsString(fmt) || (strcmp(fmt->valuestring, "int32") && strcmp(fmt->valuestring, "int64")))
            return fail(c, NV_EUNSUPPORTED, "'format' on an integer: only int32 and int64 are supported");
        if (!strcmp(fmt->valuestring, "int32")) lo = -2147483648.0, hi = 2147483647.0;
    }
    if (!mn && !mx && !xmn && !xmx && lo < -2147483648.0 && k <= 1) return integer(c);
    const cJSON *all[] = {mn, mx, xmn, xmx};
    for (int i = 0; i < 4; i++) {
        if (all[i] && !cJSON_IsNumber(all[i]) && !(i >= 2 && cJSON_IsBool(all[i])))
            return fail(c, NV_EINVAL, "integer bounds must be numbers");
        if (cJSON_IsNumber(all[i]) && fabs(all[i]->valuedouble) > 9007199254740992.0) /* 2^53: doubles stop being exact */
            return fail(c, NV_EUNSUPPORTED, "integer bounds beyond 2^53 in size are not supported");
    }
    if (mn) lo = fmax(lo, cJSON_IsTrue(xmn) ? floor(mn->valuedouble) + 1 : ceil(mn->valuedouble));
    if (mx) hi = fmin(hi, cJSON_IsTrue(xmx) ? ceil(mx->valuedouble) - 1 : floor(mx->valuedouble));
    if (cJSON_IsNumber(xmn) && floor(xmn->valuedouble) + 1 > lo) lo = floor(xmn->valuedouble) + 1;
    if (cJSON_IsNumber(xmx) && ceil(xmx->valuedouble) - 1 < hi) hi = ceil(xmx->valuedouble) - 1;
    if (lo < -(double)INT_LIMIT) lo = -(double)INT_LIMIT;
    if (hi > (double)INT_LIMIT) hi = (double)INT_LIMIT;
    if (lo > hi) return fail(c, NV_EINVAL, "the integer bounds leave no integer between them");
    /* (INT_LIMIT is past a double's whole numbers: the open ends as it is) */
    const long long lo_i = lo <= -(double)INT_LIMIT ? -INT_LIMIT : (long long)lo, hi_i = hi >= (double)INT_LIMIT ? INT_LIMIT : (long long)hi;
    return k > 1 ? integer_multiples(c, lo_i, hi_i, k) : integer_range(c, lo_i, hi_i);
}

/* A number's bounds (minimum, maximum, exclusive ones as numbers or draft 4's booleans beside
 * them), each a whole number: *lo..*hi with whether each end is exclusive; 0 when a bound is not
 * whole (refused), 1 when some bound is given, -1 when none is. */
static int number_bounds(sc *c, const cJSON *s, long long *lo, int *lo_x, long long *hi, int *hi_x) {
    const char *const keys[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
    const cJSON *v[4];
    int any = 0;
    for (int i = 0; i < 4; i++) {
        v[i] = cJSON_GetObjectItemCaseSensitive(s, keys[i]);
        any |= cJSON_IsNumber(v[i]); /* (draft 4's booleans alone bound nothing) */
        if (v[i] && !cJSON_IsNumber(v[i]) && !(i >= 2 && cJSON_IsBool(v[i]))) return fail(c, NV_EINVAL, "number bounds must be numbers");
        if (cJSON_IsNumber(v[i]) && (v[i]->valuedouble != floor(v[i]->valuedouble) || fabs(v[i]->valuedouble) > 9007199254740992.0))
            return fail(c, NV_EUNSUPPORTED, "'%s' on a number: only whole bounds up to 2^53 in size are supported", keys[i]);
    }
    if (!any) return -1;
    *lo = -INT_LIMIT, *hi = INT_LIMIT, *lo_x = *hi_x = 0;
    for (int i = 0; i < 4; i++) { /* the tightest of each side; of equal ones, the exclusive */
        if (!cJSON_IsNumber(v[i])) continue;
        const long long b = (long long)v[i]->valuedouble;
        const int x = i >= 2 || cJSON_IsTrue(v[i + 2 < 4 ? i + 2 : i]);
        if (i % 2 == 0 && (b > *lo || (b == *lo && x))) *lo = b, *lo_x = x;
        if (i % 2 == 1 && (b < *hi || (b == *hi && x))) *hi = b, *hi_x = x;
    }
    return 1;
}

/* A number between whole bounds, written without an exponent: a whole value in range (then ".0..."
 * or not), or one strictly between two whole numbers k and k + 1 that both lie in range: k's digits
 * (-m for -(m + 1) < v < -m), a point and up to frac digits not all zero, 15 significant digits at
 * most (more could name a double on an excluded bound: 99.9999999999999999 is 100.0). */
static int number_range(sc *c, long long lo, int lo_x, long long hi, int hi_x, int frac) {
    const long long whole_lo = lo + lo_x, whole_hi = hi - hi_x;
    if (lo > hi || (lo == hi && (lo_x || hi_x))) return fail(c, NV_EINVAL, "the number bounds leave no number between them");
    nv_gbody body = {0};
    nv_gbody_alt(&body);
    nv_gbody_lit(c->b, &body, ".", 1);
    nv_gbody_ref(&body, repeat(c, lit_rule(c, "0"), 1, frac));
    const int zeros = nv_gbuild_add(c->b, &body);
    int first = 1;
    if (whole_lo <= whole_hi) {
        nv_gbody_ref(&body, integer_range(c, whole_lo, whole_hi));
        nv_gbody_ref(&body, zeros);
        first = 0;
    }
    const long long pos_lo = lo > 0 ? lo : 0, neg_lo = hi < 0 ? -hi : 0; /* k >= 0 in [lo, hi - 1]; m in [-hi, -lo - 1] */
    if (pos_lo <= hi - 1) naturals(c, &body, pos_lo, hi - 1, &first, frac);
    if (neg_lo <= -lo - 1) {
        nv_gbody ms = {0};
        int f = 1;
        naturals(c, &ms, neg_lo, -lo - 1, &f, frac);
        if (!f) {
            if (!first) nv_gbody_alt(&body);
            nv_gbody_lit(c->b, &body, "-", 1);
            nv_gbody_ref(&body, nv_gbuild_add(c->b, &ms));
            first = 0;
        }
    }
    if (first) { /* (bounds so far apart from 0 that no fraction has the digits, and no whole value between) */
        nv_gbody_free(&body);
        return fail(c, NV_EUNSUPPORTED, "the number bounds leave no number of 15 significant digits between them");
    }
    return nv_gbuild_add(c->b, &body);
}

static int gen_type(sc *c, const cJSON *s, const char *type) {
    if (!strcmp(type, "object")) return gen_object(c, s);
    if (!strcmp(type, "array")) return gen_array(c, s);
    if (!strcmp(type, "string")) return gen_string(c, s);
    if (!strcmp(type, "integer")) return gen_integer(c, s);
    if (!strcmp(type, "number")) {
        const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
        if (fmt && (!cJSON_IsString(fmt) || (strcmp(fmt->valuestring, "float") && strcmp(fmt->valuestring, "double"))))
            return fail(c, NV_EUNSUPPORTED, "'format' on a number: only float and double are supported");
        long long lo = 0, hi = 0, k;
        int lo_x = 0, hi_x = 0, bounded = number_bounds(c, s, &lo, &lo_x, &hi, &hi_x), frac;
        if (!bounded || !multiple_of(c, s, &k, &frac)) return 0;
        if (bounded < 0) lo = -INT_LIMIT, hi = INT_LIMIT;
        if (k) { /* whole multiples: integers */
            if (lo + lo_x > hi - hi_x) return fail(c, NV_EINVAL, "the number bounds leave no multiple of %lld between them", k);
            return k > 1 ? integer_multiples(c, lo + lo_x, hi - hi_x, k) : integer_range(c, lo + lo_x, hi - hi_x);
        }
        if (frac && bounded < 0) { /* up to frac digits after the point, no exponent */
            nv_gbody body = {0};
            nv_gbody_alt(&body);
            nv_gbody_lit(c->b, &body, ".", 1);
            nv_gbody_ref(&body, repeat(c, digit(c), 1, frac));
            const int point = nv_gbuild_add(c->b, &body);
            nv_gbody_ref(&body, integer(c));
            nv_gbody_ref(&body, point);
            return nv_gbuild_add(c->b, &body);
        }
        return bounded > 0 ? number_range(c, lo, lo_x, hi, hi_x, frac ? frac : FRAC_DIGITS) : number(c);
    }
    if (cJSON_GetObjectItemCaseSensitive(s, "format") && strcmp(type, "string"))
        return fail(c, NV_EUNSUPPORTED, "'format' on a %s is not supported", type);
    if (!strcmp(type, "boolean")) {
        nv_gbody body = {0};
        nv_gbody_lit(c->b, &body, "true", 4);
        nv_gbody_alt(&body);
        nv_gbody_lit(c->b, &body, "false", 5);
        return nv_gbuild_add(c->b, &body);
    }
    if (!strcmp(type, "null")) return lit_rule(c, "null");
    return fail(c, NV_EINVAL, "'type': '%.40s' is not a JSON schema type", type);
}

/* The JSON texts of an enum's values as a byte trie of rules, so that however many values share a
 * beginning, the parser follows one path (not one stack per value). lits[0..n) are sorted and
 * share their first d bytes. */
static int literal_trie(sc *c, char **lits, int n, size_t d) {
    nv_gbody body = {0};
    int first = 1;
    for (int i = 0; i < n && c->err == NV_OK;) {
        if (!first) nv_gbody_alt(&body);
        first = 0;
        size_t len = strlen(lits[i]);
        if (len == d) { /* a value ends here */
            i++;
            continue;
        }
        int j = i + 1;
        while (j < n && strlen(lits[j]) > d && lits[j][d] == lits[i][d]) j++;
        if (j == i + 1) { /* one value from here on: the rest of it as it is */
            nv_gbody_lit(c->b, &body, lits[i] + d, len - d);
        } else {
            nv_gbody_lit(c->b, &body, lits[i] + d, 1);
            nv_gbody_ref(&body, literal_trie(c, lits + i, j - i, d + 1));
        }
        i = j;
    }
    return nv_gbuild_add(c->b, &body);
}

/* 1 when v is of one of the types named by type (a string or a list; NULL: any). */
static int of_type(const cJSON *v, const cJSON *type) {
    if (!type) return 1;
    for (const cJSON *t = cJSON_IsArray(type) ? type->child : type; t; t = cJSON_IsArray(type) ? t->next : NULL) {
        const char *n = cJSON_GetStringValue(t);
        if (!n) continue;
        if ((!strcmp(n, "string") && cJSON_IsString(v)) || (!strcmp(n, "number") && cJSON_IsNumber(v)) ||
            (!strcmp(n, "integer") && cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble)) ||
            (!strcmp(n, "boolean") && cJSON_IsBool(v)) || (!strcmp(n, "null") && cJSON_IsNull(v)) ||
            (!strcmp(n, "object") && cJSON_IsObject(v)) || (!strcmp(n, "array") && cJSON_IsArray(v)))
            return 1;
    }
    return 0;
}

#define MAX_ENUM_TEXT 4096
#define MAX_ANY_OF 128

/* The texts of an enum's values (or const's: a list of one), each written exactly as cJSON prints it
 * (raw: each a string, written as it is, not as JSON), sorted, each once, into *out (cJSON_free each,
 * free the list); how many, or -1 after a failure. */
static int enum_texts(sc *c, const cJSON *list, const cJSON *type, const char *key, int raw, char ***out) {
    int n = cJSON_GetArraySize(list);
    char **lits = calloc((size_t)n + 1, sizeof *lits);
    *out = lits;
    if (!lits) return fail(c, NV_ENOMEM, "out of memory"), -1;
    int k = 0;
    for (const cJSON *e = list->child; e && c->err == NV_OK; e = e->next) {
        if (!of_type(e, type)) {
            fail(c, NV_EINVAL, "a value of '%s' is not of the schema's 'type'", key);
            break;
        }
        if (raw && !cJSON_IsString(e)) {
            fail(c, NV_EINVAL, "a value of '%s' is not a string", key);
            break;
        }
        if (raw && (lits[k] = cJSON_malloc(strlen(e->valuestring) + 1))) strcpy(lits[k], e->valuestring);
        else if (!raw) lits[k] = cJSON_PrintUnformatted(e);
        if (!lits[k]) fail(c, NV_ENOMEM, "out of memory");
        else if ((raw || c->xml) && strstr(lits[k], XML_PARAM_CLOSE))
            fail(c, NV_EUNSUPPORTED, "a value of '%s' holding \"" XML_PARAM_CLOSE "\" cannot be written in a tool call as XML", key), k++;
        else if (strlen(lits[k++]) > MAX_ENUM_TEXT) fail(c, NV_EUNSUPPORTED, "'%s' values longer than 4096 bytes are not supported", key);
    }
    if (c->err == NV_OK) {
        qsort(lits, (size_t)k, sizeof *lits, nv_strcmp_ptrs);
        int u = 0; /* a value listed twice is one path */
        for (int i = 0; i < k; i++) {
            if (u && !strcmp(lits[u - 1], lits[i])) {
                cJSON_free(lits[i]);
                continue;
            }
            lits[u++] = lits[i];
        }
        k = u;
    }
    if (c->err == NV_OK) return k;
    for (int i = 0; i < k; i++) cJSON_free(lits[i]);
    return -1;
}

static int gen_enum(sc *c, const cJSON *list, const cJSON *type, const char *key, int raw) {
    char **lits;
    const int k = enum_texts(c, list, type, key, raw, &lits);
    const int r = k >= 0 ? literal_trie(c, lits, k, 0) : 0;
    for (int i = 0; i < k; i++) cJSON_free(lits[i]);
    free(lits);
    return r;
}

/* anyOf / oneOf: one alternative per schema. */
static int alternatives(sc *c, const cJSON *list, const char *key) {
    if (!cJSON_IsArray(list) || !list->child) return fail(c, NV_EINVAL, "'%s' must be a non-empty array", key);
    if (cJSON_GetArraySize(list) > MAX_ANY_OF) return fail(c, NV_EUNSUPPORTED, "'%s' with more than 128 schemas is not supported", key);
    nv_gbody body = {0};
    for (const cJSON *e = list->child; e; e = e->next) {
        int r = gen(c, e);
        if (e != list->child) nv_gbody_alt(&body);
        nv_gbody_ref(&body, r);
    }
    return nv_gbuild_add(c->b, &body);
}

/* Keywords that belong to one type, refused where no type says which values they hold for. */
static const char *const typed_keys[] = {"minLength", "maxLength", "format", "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                         "multipleOf"};
static const char *const object_keys[] = {"properties", "required", "additionalProperties"};
static const char *const array_keys[] = {"items", "minItems", "maxItems", "prefixItems", "additionalItems", "uniqueItems"};
#define COUNT(a) (sizeof a / sizeof a[0])

/* s's keywords: each one known (or an annotation), and at most one branch ($ref, const, enum,
 * anyOf, oneOf, allOf) with nothing beside it but annotations (and a type beside enum or const,
 * checked there): a value beside the branch would go unenforced. *branch: it, or NULL. 1, or 0
 * with c->err set. */
static int schema_keys(sc *c, const cJSON *s, const char **branch) {
    for (const cJSON *k = s->child; k; k = k->next)
        if (!in_list(k->string, known_keys, COUNT(known_keys)) && !in_list(k->string, ignored_keys, COUNT(ignored_keys)))
            return fail(c, NV_EUNSUPPORTED, "'%.60s' is not supported in a schema", k->string);
    const char *const branches[] = {"$ref", "const", "enum", "anyOf", "oneOf", "allOf"};
    *branch = NULL;
    for (size_t i = 0; i < COUNT(branches) && !*branch; i++)
        if (cJSON_GetObjectItemCaseSensitive(s, branches[i])) *branch = branches[i];
    for (const cJSON *k = *branch ? s->child : NULL; k; k = k->next) {
        if (in_list(k->string, ignored_keys, COUNT(ignored_keys)) || !strcmp(k->string, *branch)) continue;
        if (!strcmp(k->string, "type") && (!strcmp(*branch, "enum") || !strcmp(*branch, "const"))) continue; /* checked */
        return fail(c, NV_EUNSUPPORTED, "'%.60s' beside '%s' is not supported", k->string, *branch);
    }
    return 1;
}

/* const: enum's list of one. */
static int gen_const(sc *c, const cJSON *s, const cJSON *type, int raw) {
    cJSON *one;
    const cJSON *list = values_of(s, "const", &one);
    int r = !list ? fail(c, NV_ENOMEM, "out of memory") : gen_enum(c, list, type, "const", raw);
    cJSON_Delete(one);
    return r;
}

static int gen(sc *c, const cJSON *s) {
    if (c->err != NV_OK) return 0;
    if (c->b && nv_gbuild_size(c->b) > NV_GRAMMAR_MAX_ELEMS)
        return fail(c, NV_EUNSUPPORTED, "the schema makes a grammar over %s elements", "1,048,576");
    if (cJSON_IsTrue(s)) return any_value(c);
    if (cJSON_IsFalse(s)) return fail(c, NV_EINVAL, "a 'false' schema matches nothing");
    if (!cJSON_IsObject(s)) return fail(c, NV_EINVAL, "a schema must be an object or a boolean");
    if (c->depth >= MAX_DEPTH) return fail(c, NV_EINVAL, "the schema nests deeper than %s levels", "64");
    const char *branch;
    if (!schema_keys(c, s, &branch)) return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    int has_object = 0, has_array = 0;
    for (size_t i = 0; i < COUNT(object_keys); i++) has_object |= !!cJSON_GetObjectItemCaseSensitive(s, object_keys[i]);
    for (size_t i = 0; i < COUNT(array_keys); i++) has_array |= !!cJSON_GetObjectItemCaseSensitive(s, array_keys[i]);
    if (!branch && !type) {
        for (size_t i = 0; i < COUNT(typed_keys); i++)
            if (cJSON_GetObjectItemCaseSensitive(s, typed_keys[i]))
                return fail(c, NV_EUNSUPPORTED, "'%s' without a 'type' is not supported", typed_keys[i]);
        if (has_object && has_array)
            return fail(c, NV_EUNSUPPORTED, "object and array keywords without a 'type' are not supported");
    }
    if (cJSON_IsArray(type)) /* each type once: a repeat would compile the same subtree again */
        for (const cJSON *t = type->child; t; t = t->next)
            for (const cJSON *u = type->child; u != t; u = u->next)
                if (cJSON_IsString(t) && cJSON_IsString(u) && !strcmp(t->valuestring, u->valuestring))
                    return fail(c, NV_EINVAL, "'type' lists '%.20s' twice", t->valuestring);
    c->depth++;
    int r;
    if (branch && !strcmp(branch, "$ref")) {
        const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
        r = cJSON_IsString(ref) ? gen_ref(c, ref->valuestring, 0) : fail(c, NV_EINVAL, "'$ref' must be a string");
    } else if (branch && !strcmp(branch, "const")) {
        r = gen_const(c, s, type, 0);
    } else if (branch && !strcmp(branch, "enum")) {
        const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
        r = cJSON_IsArray(en) && en->child ? gen_enum(c, en, type, "enum", 0) : fail(c, NV_EINVAL, "'enum' must be a non-empty array");
    } else if (branch && !strcmp(branch, "allOf")) {
        const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
        if (!cJSON_IsArray(all) || cJSON_GetArraySize(all) != 1)
            r = fail(c, NV_EUNSUPPORTED, "'allOf' with other than one schema is not supported");
        else r = gen(c, all->child);
    } else if (branch) {
        r = alternatives(c, cJSON_GetObjectItemCaseSensitive(s, branch), branch);
    } else if (cJSON_IsString(type)) {
        r = gen_type(c, s, type->valuestring);
    } else if (cJSON_IsArray(type) && type->child) {
        nv_gbody body = {0};
        for (const cJSON *t = type->child; t; t = t->next) {
            if (!cJSON_IsString(t)) {
                nv_gbody_free(&body);
                c->depth--;
                return fail(c, NV_EINVAL, "'type' must be a string or a list of strings");
            }
            if (t != type->child) nv_gbody_alt(&body);
            nv_gbody_ref(&body, gen_type(c, s, t->valuestring));
        }
        r = nv_gbuild_add(c->b, &body);
    } else if (type) {
        r = fail(c, NV_EINVAL, "'type' must be a string or a list of strings");
    } else if (has_object) {
        r = gen_object(c, s);
    } else if (has_array) {
        r = gen_array(c, s);
    } else {
        r = any_value(c);
    }
    c->depth--;
    return r;
}

/* Any text in which close does not occur (its first byte occurs in it only there), as a small
 * automaton (state k: the last k bytes are the first k of close), so no stack grows however long
 * the text; no NUL. */
static int text_without(nv_gbuild *b, const char *close) {
    const int L = (int)strlen(close); /* 2 to 32 bytes */
    int st[32] = {0};
    for (int k = 0; k < L; k++) st[k] = nv_gbuild_reserve(b);
    const unsigned lt = (unsigned char)close[0];
    for (int k = 0; k < L; k++) {
        nv_gbody body = {0};
        uint8_t other[32];
        memset(other, 0xFF, sizeof other);
        other[0] &= (uint8_t)~1u; /* no NUL */
        const unsigned next = (unsigned char)close[k];
        other[next >> 3] &= (uint8_t)~(1u << (next & 7));
        other[lt >> 3] &= (uint8_t)~(1u << (lt & 7));
        nv_gbody_alt(&body); /* the text may end here */
        if (k + 1 < L) { /* one more byte of close (its last would complete it: not in the text) */
            nv_gbody_range(b, &body, next, next);
            nv_gbody_ref(&body, st[k + 1]);
            nv_gbody_alt(&body);
        }
        if (next != lt) { /* its first byte starts it over */
            nv_gbody_range(b, &body, lt, lt);
            nv_gbody_ref(&body, st[1]);
            nv_gbody_alt(&body);
        }
        nv_gbody_set(b, &body, other);
        nv_gbody_ref(&body, st[0]);
        nv_gbuild_define(b, st[k], &body);
    }
    return st[0];
}

/* A reasoning model's block before the answer: nothing, or the open tag, any text in which the
 * close does not occur, the close and a newline or not. Harmony's answer is the final channel's
 * message: its header, after the analysis message or alone. */
int nv_think_block_rule(nv_gbuild *b, int tags) {
    const nv_think_tags *t = nv_think_tags_of(tags);
    const int text = text_without(b, t->close);
    nv_gbody body = {0};
    if (tags == NV_THINK_HARMONY) { /* "<|channel|>final<|message|>", or the analysis message and then it */
        nv_gbody_lit(b, &body, NV_HARMONY_FINAL_HEADER, strlen(NV_HARMONY_FINAL_HEADER));
        nv_gbody_alt(&body);
        nv_gbody_lit(b, &body, t->open, strlen(t->open));
        nv_gbody_ref(&body, text);
        nv_gbody_lit(b, &body, t->forced, strlen(t->forced));
        return nv_gbuild_add(b, &body);
    }
    nv_gbody_alt(&body);
    nv_gbody_lit(b, &body, "\n", 1);
    int blank = nv_gbuild_add(b, &body);
    nv_gbody_alt(&body);
    nv_gbody_lit(b, &body, t->open, strlen(t->open));
    nv_gbody_ref(&body, text);
    nv_gbody_lit(b, &body, t->close, strlen(t->close));
    nv_gbody_ref(&body, blank);
    return nv_gbuild_add(b, &body);
}

/* ---- the kinds of value a schema admits; tool calls' parameters written as XML ---- */

unsigned nv_json_kinds(const cJSON *v) {
    if (cJSON_IsString(v)) return NV_KIND_STRING;
    if (cJSON_IsNumber(v)) return NV_KIND_NUMBER | (v->valuedouble == floor(v->valuedouble) ? NV_KIND_INTEGER : 0u);
    if (cJSON_IsBool(v)) return NV_KIND_BOOLEAN;
    if (cJSON_IsNull(v)) return NV_KIND_NULL;
    return cJSON_IsObject(v) ? NV_KIND_OBJECT : cJSON_IsArray(v) ? NV_KIND_ARRAY : 0u;
}

static unsigned type_kinds(const cJSON *type) {
    static const char *const names[] = {"string", "number", "integer", "boolean", "null", "object", "array"};
    unsigned k = 0;
    for (const cJSON *t = cJSON_IsArray(type) ? type->child : type; t; t = cJSON_IsArray(type) ? t->next : NULL)
        for (unsigned i = 0; i < COUNT(names); i++)
            if (cJSON_IsString(t) && !strcmp(t->valuestring, names[i])) k |= 1u << i;
    return k & NV_KIND_NUMBER ? k | NV_KIND_INTEGER : k; /* a number may be whole */
}

/* A schema's kinds and free_text walk its references and branches: at most this deep, and this
 * many schemas looked at (an untrusted schema's branches could otherwise multiply without end). */
#define KINDS_DEPTH 16
#define KINDS_WORK 4096

static unsigned kinds_walk(const cJSON *s, const cJSON *doc, int depth, int *work) {
    if (!cJSON_IsObject(s) || depth > KINDS_DEPTH || --*work < 0) return 0;
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref"), *at = NULL;
    if (cJSON_IsString(ref)) return json_pointer(doc, ref->valuestring, &at) ? 0 : kinds_walk(at, doc, depth + 1, work);
    const cJSON *cst = cJSON_GetObjectItemCaseSensitive(s, "const"), *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    if (cst) return nv_json_kinds(cst);
    unsigned k = 0;
    if (cJSON_IsArray(en) && en->child) {
        for (const cJSON *e = en->child; e; e = e->next) k |= nv_json_kinds(e);
        return k;
    }
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf"), *one = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    const cJSON *alts = cJSON_IsArray(any) && any->child ? any : one;
    if (cJSON_IsArray(alts) && alts->child) { /* any of them: a branch that says nothing admits anything */
        for (const cJSON *e = alts->child; e; e = e->next) {
            unsigned ke = kinds_walk(e, doc, depth + 1, work);
            if (!ke) return 0;
            k |= ke;
        }
        return k;
    }
    if (cJSON_IsArray(all) && all->child) { /* all of them: what each admits */
        k = ~0u;
        for (const cJSON *e = all->child; e; e = e->next) {
            unsigned ke = kinds_walk(e, doc, depth + 1, work);
            if (ke) k &= ke;
        }
        return k == ~0u ? 0 : k;
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (type) return type_kinds(type);
    for (size_t i = 0; i < COUNT(object_keys); i++)
        if (cJSON_GetObjectItemCaseSensitive(s, object_keys[i])) return NV_KIND_OBJECT;
    for (size_t i = 0; i < COUNT(array_keys); i++)
        if (cJSON_GetObjectItemCaseSensitive(s, array_keys[i])) return NV_KIND_ARRAY;
    return 0;
}

/* 0 (any) where the walk ran out of work. */
unsigned nv_schema_kinds(const cJSON *schema, const cJSON *doc) {
    int work = KINDS_WORK;
    unsigned k = kinds_walk(schema, doc, 0, &work);
    return work < 0 ? 0 : k;
}

/* 1 when any text, read as the value it is of the kinds s admits or else as a string, fits s: s is
 * true, says nothing, or names types alone (one or a list, nothing holding them further), or each of
 * its anyOf/oneOf branches is such, or its $ref's target is (0 past the walk's limits, or when a
 * $ref points nowhere: not known to be free). */
static int free_text(const cJSON *s, const cJSON *doc, int depth, int *work) {
    if (--*work < 0 || depth > KINDS_DEPTH) return 0;
    if (cJSON_IsTrue(s)) return 1;
    if (!cJSON_IsObject(s)) return 0;
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref"), *at = NULL;
    const cJSON *alts = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    if (!alts) alts = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    const cJSON *branch = ref ? ref : alts;
    for (const cJSON *k = s->child; k; k = k->next)
        if (!in_list(k->string, ignored_keys, COUNT(ignored_keys)) && k != branch && (branch || strcmp(k->string, "type")))
            return 0; /* a keyword that holds the value, or one beside a branch */
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if ((ref && !cJSON_IsString(ref)) || (type && !type_kinds(type))) return 0;
    if (ref) return !json_pointer(doc, ref->valuestring, &at) && free_text(at, doc, depth + 1, work);
    if (alts) {
        if (!cJSON_IsArray(alts) || !alts->child) return 0;
        for (const cJSON *e = alts->child; e; e = e->next)
            if (!free_text(e, doc, depth + 1, work)) return 0;
    }
    return 1;
}

/* A parameter's free text: any in which "</parameter>" does not occur. */
static int xml_text(sc *c) {
    if (c->xml_text < 0) c->xml_text = text_without(c->b, XML_PARAM_CLOSE);
    return c->xml_text;
}

/* A character of a string parameter held to a pattern, a format or lengths: any but '<' (so that
 * it never holds "</parameter>", which would end it) and control characters other than tab and
 * line breaks. */
static int raw_char(sc *c) {
    if (c->rawc >= 0) return c->rawc;
    nv_gbody body = {0};
    uint8_t bits[32] = {0};
    for (unsigned x = '\t'; x < 0x80; x++)
        if (x != '<' && (x >= 0x20 || x == '\t' || x == '\n' || x == '\r')) bits[x >> 3] |= (uint8_t)(1u << (x & 7));
    nv_gbody_set(c->b, &body, bits);
    nv_gbody_alt(&body);
    utf8_multibyte(c, &body, 0);
    return c->rawc = nv_gbuild_add(c->b, &body);
}

/* The values of a schema that admits only strings (kinds says so), each written as it is (not as a
 * JSON string): the branches as gen takes them (one, nothing beside it), each string type's pattern
 * (a match anywhere in it, as JSON's), format or lengths, else any text without "</parameter>". */
static int raw_string(sc *c, const cJSON *s) {
    if (c->err != NV_OK) return 0;
    if (nv_gbuild_size(c->b) > NV_GRAMMAR_MAX_ELEMS)
        return fail(c, NV_EUNSUPPORTED, "the schema makes a grammar over %s elements", "1,048,576");
    if (!cJSON_IsObject(s)) return fail(c, NV_EINVAL, "a schema must be an object or a boolean");
    if (c->depth >= MAX_DEPTH) return fail(c, NV_EINVAL, "the schema nests deeper than %s levels", "64");
    const char *branch;
    if (!schema_keys(c, s, &branch)) return 0;
    const cJSON *v = branch ? cJSON_GetObjectItemCaseSensitive(s, branch) : NULL, *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    int r;
    c->depth++;
    if (branch && !strcmp(branch, "$ref")) {
        r = cJSON_IsString(v) ? gen_ref(c, v->valuestring, 1) : fail(c, NV_EINVAL, "'$ref' must be a string");
    } else if (branch && !strcmp(branch, "const")) {
        r = gen_const(c, s, type, 1);
    } else if (branch && !strcmp(branch, "enum")) {
        r = cJSON_IsArray(v) && v->child ? gen_enum(c, v, type, "enum", 1) : fail(c, NV_EINVAL, "'enum' must be a non-empty array");
    } else if (branch && !strcmp(branch, "allOf")) {
        r = cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 ? raw_string(c, v->child)
                                                            : fail(c, NV_EUNSUPPORTED, "'allOf' with other than one schema is not supported");
    } else if (branch) { /* anyOf, oneOf */
        if (!cJSON_IsArray(v) || !v->child) r = fail(c, NV_EINVAL, "'%s' must be a non-empty array", branch);
        else if (cJSON_GetArraySize(v) > MAX_ANY_OF) r = fail(c, NV_EUNSUPPORTED, "'%s' with more than 128 schemas is not supported", branch);
        else {
            nv_gbody body = {0};
            for (const cJSON *e = v->child; e; e = e->next) {
                if (e != v->child) nv_gbody_alt(&body);
                nv_gbody_ref(&body, raw_string(c, e));
            }
            r = nv_gbuild_add(c->b, &body);
        }
    } else {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern"), *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
        const int lengths = cJSON_GetObjectItemCaseSensitive(s, "minLength") || cJSON_GetObjectItemCaseSensitive(s, "maxLength");
        const long min = count_kw(c, s, "minLength", 0), max = count_kw(c, s, "maxLength", -1);
        int nullable;
        rx x = {c, pat ? cJSON_GetStringValue(pat) : NULL, NULL, 0, 1, 1};
        if ((pat || fmt) && lengths)
            r = fail(c, NV_EUNSUPPORTED, "'minLength' and 'maxLength' beside 'pattern' or 'format' are not supported");
        else if (pat && fmt)
            r = fail(c, NV_EUNSUPPORTED, "'pattern' with 'format' is not supported");
        else if (max >= 0 && max < min)
            r = fail(c, NV_EINVAL, "'maxLength' is below 'minLength'");
        else if (lengths)
            r = repeat(c, raw_char(c), min, max);
        else if (pat && !x.p)
            r = fail(c, NV_EINVAL, "'pattern' must be a string");
        else if (pat && strlen(x.p) > 1000)
            r = fail(c, NV_EUNSUPPORTED, "'pattern' longer than 1000 bytes is not supported");
        else if (pat) {
            x.end = x.p + strlen(x.p);
            r = rx_alt(&x, 1, &nullable);
            if (c->err == NV_OK && x.p != x.end) r = fail(c, NV_EUNSUPPORTED, "'pattern': a ')' without its '('");
        } else if (fmt)
            r = cJSON_IsString(fmt) ? format_rule(c, fmt->valuestring) : fail(c, NV_EINVAL, "'format' must be a string");
        else
            r = xml_text(c);
    }
    c->depth--;
    return r;
}

/* A parameter's value: a string as it is; any other value as its JSON text; where the schema admits
 * strings and more (or does not say), any text (read back as one of the others where it is one). */
static int xml_value(sc *c, const cJSON *s) {
    const unsigned k = nv_schema_kinds(s, c->doc);
    int work = KINDS_WORK;
    if (k && !(k & NV_KIND_STRING)) return gen(c, s);
    if (k == NV_KIND_STRING) return raw_string(c, s);
    if (!free_text(s, c->doc, 0, &work))
        return fail(c, NV_EUNSUPPORTED, "a parameter that may be a string or another value is supported in tool calls written as "
                                        "XML only where its schema names types alone (a constraint on any branch, or a schema "
                                        "not read whole, is not)");
    return xml_text(c);
}

/* <parameter=NAME>\nVALUE\n</parameter>\n (name: NULL: any name the form can carry). */
static int xml_param(sc *c, const char *name, int value) {
    if (name && (!*name || strpbrk(name, "<>\r\n")))
        return fail(c, NV_EUNSUPPORTED, "a parameter named '%.60s' cannot be written in a tool call as XML", name);
    nv_gbody body = {0};
    nv_gbody_lit(c->b, &body, "<parameter=", 11);
    if (name) {
        nv_gbody_lit(c->b, &body, name, strlen(name));
    } else {
        uint8_t bits[32];
        memset(bits, 0xFF, sizeof bits);
        static const unsigned char not_in_name[] = {0, '<', '>', '\r', '\n'};
        for (size_t i = 0; i < sizeof not_in_name; i++) bits[not_in_name[i] >> 3] &= (uint8_t)~(1u << (not_in_name[i] & 7));
        nv_gbody nb = {0};
        nv_gbody_set(c->b, &nb, bits);
        nv_gbody_ref(&body, repeat(c, nv_gbuild_add(c->b, &nb), 1, -1));
    }
    nv_gbody_lit(c->b, &body, ">\n", 2);
    nv_gbody_ref(&body, value);
    nv_gbody_lit(c->b, &body, "\n" XML_PARAM_CLOSE "\n", sizeof XML_PARAM_CLOSE + 1);
    return nv_gbuild_add(c->b, &body);
}

/* A tool's arguments written as XML: its parameters schema's properties in their order (those not
 * required may be left out), each in its <parameter=...> block; without properties, any names. */
static int xml_params(sc *c, const cJSON *params) {
    static const char *const keys[] = {"type", "properties", "required", "additionalProperties"};
    if (!params || cJSON_IsNull(params) || cJSON_IsTrue(params)) return repeat(c, xml_param(c, NULL, xml_text(c)), 0, -1);
    if (!cJSON_IsObject(params)) return fail(c, NV_EINVAL, "a tool's parameters must be a schema object");
    for (const cJSON *k = params->child; k; k = k->next)
        if (!in_list(k->string, keys, COUNT(keys)) && !in_list(k->string, ignored_keys, COUNT(ignored_keys)))
            return fail(c, NV_EUNSUPPORTED, "'%.60s' on a tool's parameters is not supported in tool calls written as XML "
                                            "(an object's 'properties' are)", k->string);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(params, "type"), *props, *req, *add;
    if (type && type_kinds(type) != NV_KIND_OBJECT) return fail(c, NV_EINVAL, "a tool's parameters must be of type 'object'");
    if (!object_keywords(c, params, &props, &req, &add)) return 0;
    if (!props || !props->child) {
        if (cJSON_IsFalse(add)) return lit_rule(c, "");
        return repeat(c, xml_param(c, NULL, cJSON_IsObject(add) ? xml_value(c, add) : xml_text(c)), 0, -1);
    }
    /* the parameters from the last back: rest_i ::= param_i rest_{i+1}, or rest_{i+1} alone when param_i is optional */
    int k = cJSON_GetArraySize(props), *values = calloc((size_t)k * 2 + 1, sizeof *values), *required = values + k, i = 0;
    if (!values) return fail(c, NV_ENOMEM, "out of memory");
    for (const cJSON *p = props->child; p; p = p->next, i++) {
        values[i] = xml_param(c, p->string, xml_value(c, p));
        for (const cJSON *r = req ? req->child : NULL; r && !required[i]; r = r->next) required[i] = !strcmp(r->valuestring, p->string);
    }
    int rest = lit_rule(c, "");
    for (i = k - 1; i >= 0 && c->err == NV_OK; i--) {
        nv_gbody body = {0};
        nv_gbody_ref(&body, values[i]);
        nv_gbody_ref(&body, rest);
        if (!required[i]) {
            nv_gbody_alt(&body);
            nv_gbody_ref(&body, rest);
        }
        rest = nv_gbuild_add(c->b, &body);
    }
    free(values);
    return rest;
}

/* Values of tool calls written as XML (on) or JSON (off): the string rules of the other form are
 * put aside, so each form's rules are made once and never mixed. */
static void set_xml(sc *c, int on) {
    if (c->xml == on) return;
    int *mine[5] = {&c->chr, &c->string, &c->value, &c->object_any, &c->array_any};
    for (int i = 0; i < 5; i++) {
        const int t = *mine[i];
        *mine[i] = c->other[i], c->other[i] = t;
    }
    c->xml = on;
}

/* root ::= ws T */
static nv_err finish(sc *c, int top, nv_grammar **out) {
    int root = 0;
    if (c->err == NV_OK) {
        nv_gbody body = {0};
        if (c->think) nv_gbody_ref(&body, nv_think_block_rule(c->b, c->think));
        nv_gbody_ref(&body, ws(c));
        nv_gbody_ref(&body, top);
        root = nv_gbuild_add(c->b, &body);
    }
    free(c->refs);
    if (c->err != NV_OK) {
        nv_gbuild_free(c->b);
        return c->err;
    }
    return nv_gbuild_finish(c->b, root, out);
}

static nv_err start(sc *c, const cJSON *doc) {
    memset(c, 0, sizeof *c);
    c->ws = c->value = c->string = c->chr = c->number = c->integer = c->digit = c->hex = c->object_any = c->array_any = c->xml_text = -1;
    for (int i = 0; i < 5; i++) c->other[i] = -1;
    c->rawc = -1;
    c->doc = doc;
    if (!(c->b = nv_gbuild_new())) return nv_fail(NV_ENOMEM, "out of memory");
    return NV_OK;
}

nv_err nv_schema_grammar_ex(const cJSON *schema, int json_object, int think, nv_grammar **out) {
    *out = NULL;
    sc c;
    NV_TRY(start(&c, json_object ? NULL : schema));
    c.think = think;
    int top = json_object ? (any_value(&c), c.object_any) : gen(&c, schema);
    return finish(&c, top, out);
}

nv_err nv_schema_grammar(const cJSON *schema, nv_grammar **out) { return nv_schema_grammar_ex(schema, 0, 0, out); }
nv_err nv_json_object_grammar(nv_grammar **out) { return nv_schema_grammar_ex(NULL, 1, 0, out); }

/* prefix T suffix, and with sep: (sep prefix T suffix)* and a newline that may end it; or instead
 * (alt >= 0), white space and alt. */
static nv_err finish_framed(sc *c, int value, const char *prefix, const char *suffix, const char *sep, int alt, nv_grammar **out) {
    free(c->refs);
    if (c->err != NV_OK) {
        nv_gbuild_free(c->b);
        return c->err;
    }
    nv_gbody body = {0};
    nv_gbody_lit(c->b, &body, prefix, strlen(prefix));
    nv_gbody_ref(&body, value);
    nv_gbody_lit(c->b, &body, suffix, strlen(suffix));
    int one = nv_gbuild_add(c->b, &body), root = one;
    int think = c->think ? nv_think_block_rule(c->b, c->think) : -1;
    if (sep) { /* more ::= | sep one more;  end ::= | "\n" (the newline a model writes after a call) */
        int more = nv_gbuild_reserve(c->b);
        nv_gbody_alt(&body);
        nv_gbody_lit(c->b, &body, sep, strlen(sep));
        nv_gbody_ref(&body, one);
        nv_gbody_ref(&body, more);
        nv_gbuild_define(c->b, more, &body);
        nv_gbody_alt(&body);
        nv_gbody_lit(c->b, &body, "\n", 1);
        int end = nv_gbuild_add(c->b, &body);
        nv_gbody_ref(&body, one);
        nv_gbody_ref(&body, more);
        nv_gbody_ref(&body, end);
        root = nv_gbuild_add(c->b, &body);
    }
    if (alt >= 0) { /* root | ws alt */
        nv_gbody_ref(&body, root);
        nv_gbody_alt(&body);
        nv_gbody_ref(&body, ws(c));
        nv_gbody_ref(&body, alt);
        root = nv_gbuild_add(c->b, &body);
    }
    if (think >= 0) {
        nv_gbody_ref(&body, think);
        nv_gbody_ref(&body, root);
        root = nv_gbuild_add(c->b, &body);
    }
    return nv_gbuild_finish(c->b, root, out);
}

nv_err nv_schema_grammar_framed(const cJSON *schema, const char *prefix, const char *suffix, const char *sep,
                                nv_grammar **out) {
    *out = NULL;
    sc c;
    NV_TRY(start(&c, schema));
    int value = gen(&c, schema);
    return finish_framed(&c, value, prefix, suffix, sep, -1, out);
}

nv_err nv_tool_calls_grammar(const cJSON *tools, const char *only, const nv_call_frame *frame, int skip_bad, int think,
                             const cJSON *answer, int answer_object, nv_grammar **out) {
    *out = NULL;
    sc c;
    NV_TRY(start(&c, NULL));
    c.think = think;
    nv_gbody calls = {0};
    int n_ok = 0, n_held = 0, skipped = 0;
    char key[80], why[512] = "no tool to call";
    snprintf(key, sizeof key, "\"%s\"", frame->xml || frame->name_args ? "" : frame->args_key);
    int id = -1; /* a call's own id: letters and digits */
    if (frame->name_args && frame->call_id) {
        nv_gbody alnum = {0};
        nv_gbody_range(c.b, &alnum, 'a', 'z');
        nv_gbody_alt(&alnum);
        nv_gbody_range(c.b, &alnum, 'A', 'Z');
        nv_gbody_alt(&alnum);
        nv_gbody_range(c.b, &alnum, '0', '9');
        id = repeat(&c, nv_gbuild_add(c.b, &alnum), NV_MISTRAL_ID_LEN, NV_MISTRAL_ID_LEN);
    }
    for (const cJSON *t = tools ? tools->child : NULL; t && c.err == NV_OK; t = t->next) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(fn, "name"));
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        if (!name || (only && strcmp(only, name))) continue;
        c.doc = params; /* a tool's $ref points into its own parameters */
        set_xml(&c, frame->xml);
        int args = frame->xml ? xml_params(&c, params) : params && !cJSON_IsNull(params) ? gen(&c, params) : (any_value(&c), c.object_any);
        if (c.err != NV_OK) {
            snprintf(why, sizeof why, "tool '%.64s': %s", name, nv_errmsg());
            if (!skip_bad || c.err == NV_ENOMEM) break;
            nv_log(NV_LOG_WARN, "serve: %s; its calls are read but not held to its schema", why);
            c.err = NV_OK;
            c.depth = 0;
            skipped = 1;
            /* its calls may still be written: any arguments */
            args = frame->xml ? xml_params(&c, NULL) : (any_value(&c), c.object_any);
        } else {
            n_held++;
        }
        char lit[96];
        nv_gbody body = {0};
        if (frame->xml) { /* <function=NAME>\n PARAMETERS </function> */
            snprintf(lit, sizeof lit, "<function=%s>\n", name);
            nv_gbody_lit(c.b, &body, lit, strlen(lit));
            nv_gbody_ref(&body, args);
            nv_gbody_lit(c.b, &body, "</function>", 11);
        } else if (frame->name_args) { /* NAME [call_id ID] name_args ARGS */
            nv_gbody_lit(c.b, &body, name, strlen(name));
            if (id >= 0) {
                nv_gbody_lit(c.b, &body, frame->call_id, strlen(frame->call_id));
                nv_gbody_ref(&body, id);
            }
            nv_gbody_lit(c.b, &body, frame->name_args, strlen(frame->name_args));
            nv_gbody_ref(&body, args);
        } else { /* {"name": NAME, KEY: ARGS} */
            snprintf(lit, sizeof lit, "\"%s\"", name);
            int w = ws(&c);
            nv_gbody_lit(c.b, &body, "{", 1);
            nv_gbody_ref(&body, w);
            nv_gbody_ref(&body, member(&c, "\"name\"", 0, lit_rule(&c, lit)));
            nv_gbody_ref(&body, w);
            nv_gbody_lit(c.b, &body, ",", 1);
            nv_gbody_ref(&body, w);
            nv_gbody_ref(&body, member(&c, key, 0, args));
            nv_gbody_ref(&body, w);
            nv_gbody_lit(c.b, &body, "}", 1);
        }
        if (n_ok++) nv_gbody_alt(&calls);
        nv_gbody_ref(&calls, nv_gbuild_add(c.b, &body));
    }
    set_xml(&c, 0);
    if (c.err == NV_OK && !n_held) c.err = nv_fail(skipped ? NV_EUNSUPPORTED : NV_EINVAL, "%s", why);
    else if (c.err != NV_OK) c.err = nv_fail(c.err, "%s", why);
    if (c.err != NV_OK) nv_gbody_free(&calls);
    int value = c.err == NV_OK ? nv_gbuild_add(c.b, &calls) : 0;
    if (c.err == NV_OK && frame->item_sep) { /* list ::= call more;  more ::= | item_sep call more */
        int more = nv_gbuild_reserve(c.b);
        nv_gbody_alt(&calls);
        nv_gbody_lit(c.b, &calls, frame->item_sep, strlen(frame->item_sep));
        nv_gbody_ref(&calls, value);
        nv_gbody_ref(&calls, more);
        nv_gbuild_define(c.b, more, &calls);
        nv_gbody_ref(&calls, value);
        nv_gbody_ref(&calls, more);
        value = nv_gbuild_add(c.b, &calls);
    }
    int alt = -1; /* the answer in the format instead of a call (its $ref points into its own schema) */
    if (c.err == NV_OK && (answer || answer_object)) {
        c.doc = answer_object ? NULL : answer;
        alt = answer_object ? (any_value(&c), c.object_any) : gen(&c, answer);
        if (c.err != NV_OK) c.err = nv_fail(c.err, "the answer's format: %s", nv_errmsg());
    }
    if (skipped && c.err == NV_OK) nv_gbuild_seal(c.b); /* a skipped tool's leftovers */
    return finish_framed(&c, value, frame->prefix, frame->suffix, frame->sep, alt, out);
}

/* ---- whole texts: a regular expression, a choice ---- */

/* The grammar of top, after a think block when c->think (no white space around: the text is the
 * whole answer). */
static nv_err finish_text(sc *c, int top, nv_grammar **out) {
    free(c->refs);
    if (c->err != NV_OK) {
        nv_gbuild_free(c->b);
        return c->err;
    }
    nv_gbody body = {0};
    if (c->think) nv_gbody_ref(&body, nv_think_block_rule(c->b, c->think));
    nv_gbody_ref(&body, top);
    return nv_gbuild_finish(c->b, nv_gbuild_add(c->b, &body), out);
}

nv_err nv_regex_grammar(const char *pattern, int think, nv_grammar **out) {
    *out = NULL;
    sc c;
    NV_TRY(start(&c, NULL));
    c.think = think;
    rx r = {&c, pattern, pattern + strlen(pattern), 0, 1, 0};
    int nullable, top = 0;
    if (strlen(pattern) > 4000) fail(&c, NV_EUNSUPPORTED, "regex: longer than 4000 bytes is not supported");
    else top = rx_alt(&r, 1, &nullable);
    if (c.err == NV_OK && r.p != r.end) fail(&c, NV_EUNSUPPORTED, "regex: a ')' without its '('");
    return finish_text(&c, top, out);
}

nv_err nv_choice_grammar(const char *const *choices, int n, int think, nv_grammar **out) {
    *out = NULL;
    sc c;
    NV_TRY(start(&c, NULL));
    c.think = think;
    nv_gbody body = {0};
    if (n < 1) fail(&c, NV_EINVAL, "no choices");
    for (int i = 0; i < n && c.err == NV_OK; i++) {
        if (i) nv_gbody_alt(&body);
        nv_gbody_lit(c.b, &body, choices[i], strlen(choices[i]));
    }
    const int top = c.err == NV_OK ? nv_gbuild_add(c.b, &body) : (nv_gbody_free(&body), 0);
    return finish_text(&c, top, out);
}
