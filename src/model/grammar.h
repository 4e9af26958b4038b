/* Constrained decoding: a context-free grammar over bytes, a matcher that follows it as tokens
 * are generated, and the token mask that keeps a sampler inside it (structured outputs:
 * serve/schema.c compiles a JSON schema into one).
 *
 * Contract:
 * - A grammar is built rule by rule (nv_gbuild): a rule is a list of alternatives, each a
 *   sequence of byte sets and references to rules; an empty alternative matches nothing (epsilon).
 *   Rules may be recursive, but not left-recursive (a rule reaching itself before consuming a
 *   byte): nv_gbuild_finish() refuses that, a reference to an undefined rule, and grammars over
 *   NV_GRAMMAR_MAX_ELEMS elements, with NV_EINVAL and a one-line message. A finished grammar is
 *   immutable and reference counted (nv_grammar_ref/unref), shared by every sequence using it.
 * - The matcher is llama.cpp's: a set of parse stacks (at most NV_GRAMMAR_MAX_STACKS; beyond,
 *   the later alternatives are dropped, so a pathological ambiguous grammar narrows rather than
 *   explodes), kept as persistent linked frames so that trying a continuation costs only the
 *   frames it adds. nv_gmatch_feed() accepts bytes only if every one keeps some stack alive
 *   (otherwise it changes nothing); nv_gmatch_done() says the bytes so far are a whole sentence.
 * - The mask: nv_gtrie holds a vocabulary's token texts in a byte trie (tokens whose text is
 *   empty, and end-of-generation tokens, are left out); nv_gmatch_mask() marks every token whose
 *   whole text the grammar accepts next, walking the trie once with the stacks (a subtree is cut
 *   as soon as no stack survives its prefix), plus the end-of-generation tokens when the
 *   sentence is complete. Token texts are taken as they follow a token other than BOS. Frames
 *   are shared (one per (position, parent)), so equal parse states have equal stacks, and the
 *   walk interns each distinct set of stacks as a state with a transition per byte, made when
 *   first needed (a small automaton: the state inside a JSON string, met after every plain
 *   character, is expanded once per walk). The trie is laid out depth first. */
#ifndef NV_MODEL_GRAMMAR_H
#define NV_MODEL_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/buf.h"
#include "model/sampler.h"
#include "model/think.h"
#include "model/tokenizer.h"

#define NV_GRAMMAR_MAX_ELEMS (1 << 20)
#define NV_GRAMMAR_MAX_STACKS 1024

/* ---- building ---- */

typedef struct nv_gbuild nv_gbuild;
typedef struct nv_grammar nv_grammar;

/* A rule body being written: alternatives of elements. */
typedef struct {
    uint32_t *e; /* encoded elements (see grammar.c) */
    int n;
    size_t cap;
    int oom;
} nv_gbody;

nv_gbuild *nv_gbuild_new(void);
void nv_gbuild_free(nv_gbuild *b);
/* A new rule id, defined later with nv_gbuild_define (lets a rule refer to itself). */
int nv_gbuild_reserve(nv_gbuild *b);
/* Defines rule id with body (the body is reset for reuse). Returns id. */
int nv_gbuild_define(nv_gbuild *b, int id, nv_gbody *body);
/* nv_gbuild_reserve + nv_gbuild_define. */
int nv_gbuild_add(nv_gbuild *b, nv_gbody *body);
/* Elements defined so far (a builder may stop early once past NV_GRAMMAR_MAX_ELEMS). */
long nv_gbuild_size(const nv_gbuild *b);
/* Defines every rule reserved but not defined as matching nothing (after a part of a grammar was
 * given up on, its leftovers are unreachable). */
void nv_gbuild_seal(nv_gbuild *b);

/* Appends to the current alternative: one byte from [lo, hi]; one of the bytes set in bits
 * (256 bits); one of the bytes of chars; the bytes of s in order; a reference to rule. */
void nv_gbody_range(nv_gbuild *b, nv_gbody *body, unsigned lo, unsigned hi);
/* One byte among those of chars. */
void nv_gbody_chars(nv_gbuild *b, nv_gbody *body, const char *chars);
void nv_gbody_set(nv_gbuild *b, nv_gbody *body, const uint8_t bits[32]);
void nv_gbody_lit(nv_gbuild *b, nv_gbody *body, const char *s, size_t n);
void nv_gbody_ref(nv_gbody *body, int rule);
/* Ends the current alternative and starts the next. */
void nv_gbody_alt(nv_gbody *body);
void nv_gbody_free(nv_gbody *body);

/* Names rule id in nv_gbuild_finish's messages (a grammar written by hand: its rule names). */
void nv_gbuild_name(nv_gbuild *b, int id, const char *name);
/* A rule matching item min..max times (max < 0: any number), as right recursion; the caller bounds
 * the counts (each optional repetition is a rule). */
int nv_gbuild_repeat(nv_gbuild *b, int item, long min, long max);
/* A rule matching one code point, UTF-8 encoded, from the n ranges [lo, hi] (inclusive, within
 * U+0000..U+10FFFF; surrogates never match); negate: every code point outside them instead. A set
 * that matches nothing gives a rule that matches nothing. */
int nv_gbuild_codepoints(nv_gbuild *b, const uint32_t (*ranges)[2], int n, int negate);

/* The grammar whose sentences rule root derives; b is consumed (freed) either way. */
nv_err nv_gbuild_finish(nv_gbuild *b, int root, nv_grammar **out);

nv_grammar *nv_grammar_ref(nv_grammar *g);
void nv_grammar_unref(nv_grammar *g);

/* ---- matching ---- */

typedef struct nv_gmatch nv_gmatch;

/* A matcher at the start of g's sentences (holds a reference to g); NULL when out of memory. */
nv_gmatch *nv_gmatch_new(nv_grammar *g);
void nv_gmatch_free(nv_gmatch *m);
/* Feeds n bytes: 1 and the state moves on when the grammar accepts them all, else 0 and nothing
 * changes (-1: out of memory, nothing changes). */
int nv_gmatch_feed(nv_gmatch *m, const char *bytes, size_t n);
/* 1 when the bytes would be accepted (nothing changes). */
int nv_gmatch_try(nv_gmatch *m, const char *bytes, size_t n);
/* 1 when the bytes fed so far are a whole sentence. */
int nv_gmatch_done(const nv_gmatch *m);
/* 1 when the sentence is whole and nothing may follow it. */
int nv_gmatch_finished(const nv_gmatch *m);

/* ---- the token mask ---- */

typedef struct nv_gtrie nv_gtrie;

nv_err nv_gtrie_build(const nv_tokenizer *t, nv_gtrie **out);
void nv_gtrie_free(nv_gtrie *tr);

/* allowed[v] = 1 for every token the grammar accepts next, else 0 (vocab entries); returns how
 * many are allowed (-1: out of memory). */
int nv_gmatch_mask(nv_gmatch *m, const nv_gtrie *tr, uint8_t *allowed);
/* 1 when token tok, following prev, may come next (an end-of-generation token: when the
 * sentence is whole). */
int nv_gmatch_allows(nv_gmatch *m, const nv_tokenizer *t, int prev, int tok);
/* Moves the matcher past token tok following prev; 1 when it was allowed. */
int nv_gmatch_accept(nv_gmatch *m, const nv_tokenizer *t, int prev, int tok);

/* ---- sampling inside a grammar ---- */

/* One sequence's constrained sampling: its matcher and scratch for a vocabulary. */
typedef struct {
    nv_gmatch *m;
    float *logits; /* [vocab] the step's logits, kept for a second draw */
    uint8_t *mask; /* [vocab] */
    int vocab;
    /* what it cost: tokens drawn, whole masks computed (the first draw refused), their time */
    unsigned long draws, masks;
    double mask_s;
} nv_gsampler;

nv_err nv_gsampler_init(nv_gsampler *g, nv_grammar *grammar, int vocab);
void nv_gsampler_free(nv_gsampler *g);
/* The next token, drawn by s from logits (modified, as nv_sample does) and inside the grammar,
 * which moves past it (prev: the token before it). The unconstrained draw is tried first and kept
 * when the grammar accepts its text (the usual case, and cheap); otherwise every token outside
 * the mask gets -inf and s draws again: for plain sampling exactly the model's distribution
 * restricted to the grammar (llama.cpp's order too). -1 when no token of the vocabulary continues
 * the grammar (one lacking a byte it needs). */
int nv_gsample(nv_gsampler *g, const nv_gtrie *tr, const nv_tokenizer *t, nv_sampler *s, int prev, float *logits);

/* ---- lazy grammars (llama.cpp's) ---- */

/* Text is free until a trigger appears (at_start: unless the text's first non-blank byte begins
 * the trigger, never); from the trigger on it must be a sentence of the grammar. */
typedef struct {
    nv_grammar *g;
    char *trigger;
    int at_start, seen;
    int think;     /* set after init: a leading think block (thk.tags') is text the trigger is not looked for in */
    nv_think thk;  /* with it, that block followed (its state NV_THINK_IN: the prompt opened it) */
    nv_buf tail; /* the text since the grammar was last on, as far as it may hold the trigger */
} nv_glazy;

nv_err nv_glazy_init(nv_glazy *z, nv_grammar *g, const char *trigger, int at_start);
void nv_glazy_free(nv_glazy *z);
/* After a token whose text is piece, with gs off: 1 when the trigger is complete, gs is then on
 * and has been fed the text from the trigger on; 0 when gs stays off (text that the grammar
 * refuses right after the trigger leaves it off too). -1: out of memory. */
int nv_glazy_step(nv_glazy *z, nv_gsampler *gs, int vocab, const char *piece);

#endif
