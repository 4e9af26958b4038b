/* libFuzzer harness: grammars written as text (src/serve/gbnf.h's GBNF, schema.h's whole-text
 * regular expressions and choices) on untrusted input.
 *
 * The first byte picks the form (GBNF, regex, choices one a line) and whether a think block may
 * come first; the rest, up to its first NUL, is the text. A failure must carry one line of
 * message. When it compiles, the harness checks model/grammar.h's matcher contract on the input's
 * own bytes and a few fixed texts: feeding byte by byte agrees with feeding the whole text at once
 * (the same bytes taken, the same "whole sentence" answer), a refused byte changes nothing, and
 * nv_gmatch_try never changes the state. Inputs above 64 KB are skipped. */
#include "fuzz_util.h"
#include "serve/gbnf.h"
#include "serve/schema.h"

#define FZ_MAX_INPUT (64u << 10)

static const char *const probes[] = {"yes", "1+2*(3)", "hello world\n", "\xc3\xa9\xe2\x82\xac", "<think>x</think>\nno", "", "\"a\""};

/* Feeds s to a fresh matcher byte by byte and whole; both must agree. */
static void check_text(nv_grammar *g, const char *s, size_t n) {
    nv_gmatch *a = nv_gmatch_new(g), *b = nv_gmatch_new(g);
    FZ_CHECK(a && b, "matcher");
    size_t taken = 0;
    for (; taken < n; taken++) {
        const int before = nv_gmatch_done(a), t = nv_gmatch_try(a, s + taken, 1);
        FZ_CHECK(nv_gmatch_done(a) == before, "try changed the state");
        const int f = nv_gmatch_feed(a, s + taken, 1);
        FZ_CHECK(f == t, "try said %d, feed %d", t, f);
        if (f != 1) {
            FZ_CHECK(nv_gmatch_done(a) == before, "a refused byte changed the state");
            break;
        }
    }
    const int whole = nv_gmatch_feed(b, s, n);
    FZ_CHECK(whole == (taken == n), "whole text %d, byte by byte took %zu of %zu", whole, taken, n);
    if (whole == 1) FZ_CHECK(nv_gmatch_done(a) == nv_gmatch_done(b), "done differs");
    nv_gmatch_free(a);
    nv_gmatch_free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > FZ_MAX_INPUT) return 0;
    const int form = (data[0] & 0x7F) % 3, think = data[0] >> 7;
    char *text = malloc(size);
    if (!text) return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    nv_grammar *g = NULL;
    nv_err e;
    fz_clear_error();
    if (form == 0) e = nv_gbnf_grammar(text, think, &g);
    else if (form == 1) e = nv_regex_grammar(text, think, &g);
    else { /* choices, one a line */
        const char *lines[64];
        int n = 0;
        for (char *p = text, *nl; n < 64 && p; p = nl ? nl + 1 : NULL) {
            nl = strchr(p, '\n');
            if (nl) *nl = '\0';
            lines[n++] = p;
        }
        e = nv_choice_grammar(lines, n, think, &g);
        if (e == NV_OK) {
            for (int i = 0; i < n; i++) { /* every choice is a whole sentence */
                nv_gmatch *m = nv_gmatch_new(g);
                FZ_CHECK(m && (strlen(lines[i]) == 0 || nv_gmatch_feed(m, lines[i], strlen(lines[i])) == 1) && nv_gmatch_done(m),
                         "choice %d is not taken", i);
                nv_gmatch_free(m);
            }
        }
    }
    fz_check_error(e, form == 0 ? "nv_gbnf_grammar" : form == 1 ? "nv_regex_grammar" : "nv_choice_grammar");
    FZ_CHECK((e == NV_OK) == (g != NULL), "a result without success or the reverse");
    if (g) {
        for (size_t i = 0; i < sizeof probes / sizeof *probes; i++) check_text(g, probes[i], strlen(probes[i]));
        const size_t len = size - 1, tail = len < 64 ? len : 64;
        check_text(g, (const char *)data + 1 + len - tail, tail);
        nv_grammar_unref(g);
    }
    free(text);
    return 0;
}
