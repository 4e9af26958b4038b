/* llama.cpp's GBNF grammars compiled into byte grammars (model/grammar.h), for constrained decoding:
 * a request's `grammar` (llama.cpp's server) or `guided_grammar` (vLLM's), `nerve generate
 * --grammar`.
 *
 * Contract:
 * - Rules `name ::= alternatives`, one a line (a rule goes on over more lines inside parentheses
 *   and after a '|'); names of letters, digits, '-' and '_'; `# comments` to the end of the line.
 *   Elements: "literals", [character classes] with ranges and [^negation], '.' (any character),
 *   rule names, ( groups ), each optionally followed by *, +, ?, {n}, {n,} or {n,m} (counts up to
 *   1000). Escapes in literals and classes: \t \n \r \\ \" \[ \] \- \^ \/ and \xHH, \uHHHH,
 *   \UHHHHHHHH. Characters are Unicode code points written as UTF-8; a class matches one code
 *   point (surrogates never). The sentences are those of the rule `root`.
 * - Refused with NV_EINVAL and one line, giving the line and column where there is one: a syntax
 *   error, a rule defined twice, a name used but never defined, no root, a rule that can reach
 *   itself before reading a character (left recursion, named; it includes repeating what can match
 *   nothing, e.g. ("a"?)*), a text over 64 KB, more than 4096 rule names, a grammar that grows past
 *   NV_GRAMMAR_MAX_ELEMS elements while it is read. */
#ifndef NV_SERVE_GBNF_H
#define NV_SERVE_GBNF_H

#include "model/grammar.h"

/* think (0, or the tags: NV_THINK_ANGLE, NV_THINK_BRACKET): a reasoning model's "<think>...</think>"
 * block may come first (nv_think_block_rule). */
nv_err nv_gbnf_grammar(const char *text, int think, nv_grammar **out);

#endif
