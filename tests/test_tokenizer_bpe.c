/* Byte-level BPE vocabularies (GGUF tokenizer.ggml.model "gpt2": Llama 3, Qwen2/Qwen3), on the
 * small vocabulary of bpe_write.h, whose merges are chosen so that a wrong split, a wrong merge
 * order or a merge across pieces gives different ids than the right ones. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/err.h"
#include "model/gguf.h"
#include "model/grammar.h"
#include "model/think.h"
#include "model/tokenizer.h"
#include "serve/api.h"
#include "serve/ollama.h"
#include "serve/llamacpp.h"
#include "serve/chat.h"
#include "serve/schema.h"
#include "serve/tools.h"
#include "bpe_write.h"
#include "t.h"

static char tmp_path[256];

static nv_tokenizer *load_vocab(const vocab_opts *o) {
    snprintf(tmp_path, sizeof tmp_path, "/tmp/nerve_bpe_%d.gguf", (int)getpid());
    T_CHECK(write_vocab(tmp_path, o) == 0, "cannot write %s", tmp_path);
    nv_tokenizer *t = NULL;
    nv_err e = nv_tokenizer_load(tmp_path, 0, &t);
    T_CHECK(e == NV_OK, "load: %s", nv_errmsg());
    remove(tmp_path);
    return t;
}

static vocab_opts qwen(void) { return (vocab_opts){"qwen2", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0}; }
static vocab_opts llama3(void) { return (vocab_opts){"llama-bpe", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0}; }

/* The name tokenizer.json's splits sp would be read as. */
static const char *pre_named(const nv_bpe_splits *sp) {
    const char *name = nv_bpe_pre_of_splits(sp->re, sp->n);
    return name ? name : "(none)";
}

/* The id of the token whose text (in plain bytes) is s. */
static int id_of(const nv_tokenizer *t, const char *s) {
    char sp[256];
    spell(s, sp);
    return nv_tokenizer_lookup(t, sp);
}

/* What grammar g allows as the first token over t's vocabulary of vocab tokens (a mask the caller
 * frees; NULL when it cannot be built). */
static uint8_t *first_mask(const nv_tokenizer *t, nv_grammar *g, int vocab) {
    nv_gtrie *tr = NULL;
    uint8_t *mask = malloc((size_t)vocab);
    nv_gmatch *m = g ? nv_gmatch_new(g) : NULL;
    const int ok = m && mask && nv_gtrie_build(t, &tr) == NV_OK && nv_gmatch_mask(m, tr, mask) > 0;
    nv_gmatch_free(m);
    nv_gtrie_free(tr);
    if (!ok) free(mask);
    return ok ? mask : NULL;
}

static void expect_ids(const nv_tokenizer *t, const char *text, int bos, const int *want, int n_want) {
    int *ids = NULL, n = 0;
    T_CHECK(nv_tokenizer_encode(t, text, bos, 0, &ids, &n) == NV_OK, "encode: %s", nv_errmsg());
    int same = n == n_want;
    for (int i = 0; same && i < n; i++) same = ids[i] == want[i];
    if (!same) {
        char got[512] = "", exp[512] = "";
        for (int i = 0; i < n && strlen(got) < 480; i++) snprintf(got + strlen(got), sizeof got - strlen(got), "%d ", ids[i]);
        for (int i = 0; i < n_want && strlen(exp) < 480; i++) snprintf(exp + strlen(exp), sizeof exp - strlen(exp), "%d ", want[i]);
        T_CHECK(same, "'%s': got [%s] want [%s]", text, got, exp);
    }
    free(ids);
}
#define EXPECT(t, text, bos, ...)                                                                                      \
    do {                                                                                                               \
        const int w_[] = {__VA_ARGS__};                                                                                \
        expect_ids(t, text, bos, w_, (int)(sizeof w_ / sizeof w_[0]));                                                 \
    } while (0)

static void test_merges_by_rank_within_pieces(void) {
    nv_tokenizer *t = load_vocab(&(vocab_opts){"qwen2", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0});
    if (!t) return;
    T_CHECK(nv_tokenizer_byte_level(t) == 1, "byte level");
    EXPECT(t, " the cat", 1, id_of(t, " the"), id_of(t, " cat"));
    /* h-e (rank 1) before e-r (rank 9): "he" + "r", never "h" + "er" -> "her" */
    EXPECT(t, "her", 1, id_of(t, "he"), 'r');
    /* "  a": \s+(?!\S) takes one space, " a" is the next piece: the "  " merge cannot cross them */
    EXPECT(t, "  a", 0, id_of(t, " "), id_of(t, " "), 'a');
    EXPECT(t, "x  ", 0, 'x', id_of(t, "  "));
    /* newlines are their own piece, merged inside it */
    EXPECT(t, "a\n\nb", 0, 'a', id_of(t, "\n\n"), 'b');
    /* qwen2 splits digits one by one: "12" never merges */
    EXPECT(t, "123", 0, '1', '2', '3');
    /* contractions are pieces: "'ll" merges, and not with the letters before it */
    EXPECT(t, "I'll", 0, 'I', id_of(t, "'ll"));
    /* \p{L} is Unicode: 'é' is a letter, so "é!" is two pieces and "©!" (its second byte + '!') cannot merge */
    EXPECT(t, "\xc3\xa9!", 0, id_of(t, "\xc3\xa9"), '!');
    /* a whole-word token is not taken without ignore_merges */
    EXPECT(t, " there", 0, id_of(t, " the"), 'r', 'e');
    nv_tokenizer_free(t);
}

static void test_llama3_split_and_ignore_merges(void) {
    nv_tokenizer *t = load_vocab(&(vocab_opts){"llama-bpe", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0});
    if (!t) return;
    /* digits in threes: "12345" -> "123" "45" */
    EXPECT(t, "12345", 0, id_of(t, "12"), '3', '4', '5');
    EXPECT(t, " there", 0, ID_THERE);
    /* llama-bpe asks for BOS unless the file says otherwise */
    EXPECT(t, "at", 1, ID_ENDOFTEXT, id_of(t, "at"));
    nv_tokenizer_free(t);
    t = load_vocab(&(vocab_opts){"llama-bpe", ID_ENDOFTEXT, ID_IM_END, 0, -1, 0, 0, 0});
    if (!t) return;
    EXPECT(t, "at", 1, id_of(t, "at"));
    nv_tokenizer_free(t);
}

/* llama.cpp's dbrx (OLMo 2's vocabulary): Llama 3's split with every piece merged, a whole-word
 * token not taken, no BOS unless asked; tokenizer.json says it as that regex with ignore_merges false. */
static void test_dbrx_split_merges_whole_words(void) {
    nv_tokenizer *t = load_vocab(&(vocab_opts){"dbrx", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0});
    if (!t) return;
    EXPECT(t, "12345", 0, id_of(t, "12"), '3', '4', '5');
    EXPECT(t, " there", 0, id_of(t, " the"), 'r', 'e');
    EXPECT(t, "at", 1, id_of(t, "at"));
    nv_bpe_view v;
    T_CHECK(nv_tokenizer_bpe_view(t, &v) && !strcmp(v.pre, "dbrx") && !nv_bpe_pre_ignores_merges(v.pre) && nv_bpe_pre_ignores_merges("llama-bpe"),
            "the pre-tokenizer's name");
    nv_tokenizer_free(t);
}

static void test_specials_and_decode(void) {
    vocab_opts o = qwen();
    nv_tokenizer *t = load_vocab(&o);
    if (!t) return;
    EXPECT(t, "<|im_start|>user\nhi<|im_end|>", 1, ID_IM_START, 'u', 's', id_of(t, "er"), id_of(t, "\n"), 'h', 'i',
           ID_IM_END);
    /* the longest special wins; a half-written one is plain text; unused tokens are never matched */
    EXPECT(t, "<think>x<|im_end", 0, ID_THINK, 'x', '<', '|', 'i', 'm', '_', 'e', 'n', 'd');
    EXPECT(t, "<|im_end|>\nx<|im_end|>x", 0, ID_IM_END_NL, 'x', ID_IM_END, 'x');
    EXPECT(t, "[PAD0]", 0, '[', 'P', 'A', 'D', '0', ']');
    T_CHECK(strcmp(nv_tokenizer_decode(t, 0, ID_PAD), "") == 0, "unused tokens print nothing");
    T_CHECK(strcmp(nv_tokenizer_decode(t, 0, ID_IM_START), "") == 0, "control tokens print nothing");
    T_CHECK(strcmp(nv_tokenizer_decode(t, 0, ID_THINK), "<think>") == 0, "user-defined tokens print their text");
    T_CHECK(strcmp(nv_tokenizer_decode(t, 0, id_of(t, " cat")), " cat") == 0, "normal tokens print their bytes");
    T_CHECK(strcmp(nv_tokenizer_decode(t, 0, id_of(t, "\n\n")), "\n\n") == 0, "newlines");
    T_CHECK(nv_tokenizer_decode(t, 0, N_TOKENS) == NULL, "out of range");
    T_CHECK(nv_tokenizer_is_eog(t, ID_IM_END) && nv_tokenizer_is_eog(t, ID_ENDOFTEXT), "ends of generation");
    T_CHECK(!nv_tokenizer_is_eog(t, ID_IM_START) && !nv_tokenizer_is_eog(t, 1), "not ends");
    T_CHECK(nv_tokenizer_bos(t) == ID_ENDOFTEXT, "bos");
    /* qwen2 does not prepend BOS, except to give an empty text something to start from */
    EXPECT(t, "at", 1, id_of(t, "at"));
    EXPECT(t, "", 1, ID_ENDOFTEXT);
    int *ids = NULL, n = -1;
    T_CHECK(nv_tokenizer_encode(t, "", 0, 0, &ids, &n) == NV_OK && n == 0, "empty without bos");
    free(ids);
    EXPECT(t, "at", 0, id_of(t, "at"));
    T_CHECK(nv_tokenizer_encode(t, "at", 0, 1, &ids, &n) == NV_OK && n == 2 && ids[1] == ID_IM_END, "eos appended");
    free(ids);
    /* a control token shown (a template's tool-call marker) prints its text, so a call grammar that
       opens with that text takes the token itself (not only its bytes); ends, others and unknown texts are refused */
    cJSON *tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]");
    nv_grammar *g = NULL;
    const nv_call_frame frame = {.args_key = "arguments", .prefix = "<|im_start|>[", .suffix = "]"};
    T_CHECK(nv_tool_calls_grammar(tools, NULL, &frame, 0, 0, NULL, 0, &g) == NV_OK, "%s", nv_errmsg());
    cJSON_Delete(tools);
    uint8_t opens[2] = {0, 0};
    for (int shown = 0; shown < 2 && g; shown++) {
        T_CHECK(!shown || nv_tokenizer_show(t, "<|im_start|>") == ID_IM_START, "show");
        uint8_t *mask = first_mask(t, g, N_TOKENS);
        T_CHECK(mask, "%s", nv_errmsg());
        if (mask) opens[shown] = mask[ID_IM_START];
        T_CHECK(mask && mask['<'], "the marker's first byte is allowed");
        free(mask);
    }
    nv_grammar_unref(g);
    T_CHECK(!opens[0] && opens[1], "the marker's token opens the call: %d before it is shown, %d after", opens[0], opens[1]);
    T_CHECK(nv_tokenizer_show(t, "<|im_start|>") == ID_IM_START && !strcmp(nv_tokenizer_decode(t, 0, ID_IM_START), "<|im_start|>"),
            "a shown control token prints its text");
    T_CHECK(nv_tokenizer_show(t, "<|im_end|>") < 0 && nv_tokenizer_show(t, "<think>") < 0 && nv_tokenizer_show(t, "<|nope|>") < 0 &&
                !strcmp(nv_tokenizer_decode(t, 0, ID_IM_END), ""),
            "only control tokens that do not end an answer");
    nv_tokenizer_free(t);
}

/* Any text without special tokens' text comes back byte for byte, invalid UTF-8 included. */
static void test_roundtrip_random(void) {
    for (int v = 0; v < 2; v++) {
        vocab_opts o = v ? llama3() : qwen();
        nv_tokenizer *t = load_vocab(&o);
        if (!t) return;
        static const char *parts[] = {" ", "  ", "\n", "\r\n", "\t", "the", " cat", "her", "I'll", "'S", "12", "345",
                                      "\xc3\xa9", "\xe4\xb8\xad", "\xf0\x9f\x98\x80", "!", "?!", "\xff", "\xc3", "\x80",
                                      "<", "|>", "x", "\x01", "\x7f", "\xc2\xa0",
                                      /* what PCRE2 refuses: overlongs, a surrogate, past U+10FFFF, cut short */
                                      "\xc0\xaf", "\xe0\x80\x80", "\xf0\x80\x80\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80",
                                      "\xf5\x80", "\xe2\x82", "\xf0\x9f\x98"};
        uint64_t s = 0x9E3779B97F4A7C15ull + (uint64_t)v;
        for (int round = 0; round < 400; round++) {
            char text[512];
            size_t len = 0;
            int parts_n = 1 + (int)((s >> 33) % 30);
            for (int i = 0; i < parts_n; i++) {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                const char *p = parts[(s >> 20) % (sizeof parts / sizeof parts[0])];
                if (len + strlen(p) + 1 >= sizeof text) break;
                memcpy(text + len, p, strlen(p));
                len += strlen(p);
            }
            text[len] = 0;
            int *ids = NULL, n = 0;
            if (nv_tokenizer_encode(t, text, 0, 0, &ids, &n) != NV_OK) {
                T_CHECK(0, "encode failed: %s", nv_errmsg());
                break;
            }
            nv_buf back = {0};
            for (int i = 0; i < n; i++) nv_buf_puts(&back, nv_tokenizer_decode(t, i ? ids[i - 1] : -1, ids[i]));
            T_CHECK(back.len == len && memcmp(back.data, text, len) == 0, "round %d: '%s' came back as '%s'", round, text,
                    back.data ? back.data : "");
            T_CHECK(n <= (int)len, "no more ids than bytes");
            nv_buf_free(&back);
            free(ids);
        }
        nv_tokenizer_free(t);
    }
}

static void expect_refused(const vocab_opts *o, nv_err want, const char *what) {
    snprintf(tmp_path, sizeof tmp_path, "/tmp/nerve_bpe_bad_%d.gguf", (int)getpid());
    T_CHECK(write_vocab(tmp_path, o) == 0, "cannot write %s", tmp_path);
    nv_tokenizer *t = NULL;
    nv_err e = nv_tokenizer_load(tmp_path, 0, &t);
    T_CHECK(e == want && t == NULL, "%s: got %d (%s)", what, (int)e, e ? nv_errmsg() : "loaded");
    if (e != NV_OK) T_CHECK(strstr(nv_errmsg(), tmp_path) != NULL, "%s: the message names the file: %s", what, nv_errmsg());
    nv_tokenizer_free(t);
    remove(tmp_path);
}

static void test_refused(void) {
    vocab_opts o = qwen();
    o.pre = "some-future-model";
    expect_refused(&o, NV_EUNSUPPORTED, "unknown pre-tokenizer");
    o = qwen();
    o.drop_byte = 'q';
    expect_refused(&o, NV_EFORMAT, "a byte without a token");
    o = qwen();
    o.bad_merge = 1;
    expect_refused(&o, NV_EFORMAT, "a merge without a space");
    /* a vocabulary cut short of its special ids has none */
    o = qwen();
    snprintf(tmp_path, sizeof tmp_path, "/tmp/nerve_bpe_cut_%d.gguf", (int)getpid());
    T_CHECK(write_vocab(tmp_path, &o) == 0, "cannot write %s", tmp_path);
    nv_tokenizer *cut = NULL;
    T_CHECK(nv_tokenizer_load(tmp_path, ID_ENDOFTEXT, &cut) == NV_OK && cut, "%s", nv_errmsg());
    if (cut) {
        T_CHECK(nv_tokenizer_bos(cut) == -1 && nv_tokenizer_eos(cut) == -1 && !nv_tokenizer_is_eog(cut, ID_IM_END),
                "special ids past the cut are none");
        int *ids = NULL, n = 0;
        T_CHECK(nv_tokenizer_encode(cut, "<|im_end|>", 1, 1, &ids, &n) == NV_OK, "%s", nv_errmsg());
        for (int i = 0; i < n; i++) T_CHECK(ids[i] < ID_ENDOFTEXT, "id %d past the cut", ids[i]);
        free(ids);
        nv_tokenizer_free(cut);
    }
    remove(tmp_path);
    /* the model's vocabulary size must match */
    o = qwen();
    snprintf(tmp_path, sizeof tmp_path, "/tmp/nerve_bpe_size_%d.gguf", (int)getpid());
    T_CHECK(write_vocab(tmp_path, &o) == 0, "cannot write %s", tmp_path);
    nv_tokenizer *t = NULL;
    T_CHECK(nv_tokenizer_load_for_model(tmp_path, N_TOKENS + 1, &t) == NV_EFORMAT && !t, "size mismatch refused");
    T_CHECK(nv_tokenizer_load_for_model(tmp_path, N_TOKENS, &t) == NV_OK && t, "size match loads");
    nv_tokenizer_free(t);
    remove(tmp_path);
}

/* No pre-tokenizer named: GPT-2's split (digits together, no ignore_merges, no BOS). */
static void test_gpt2_default(void) {
    nv_tokenizer *t = load_vocab(&(vocab_opts){NULL, -1, -1, -1, -1, 0, 0, 0});
    if (!t) return;
    EXPECT(t, "12 the", 1, id_of(t, "12"), id_of(t, " the"));
    T_CHECK(nv_tokenizer_bos(t) == -1, "no BOS");
    int *ids = NULL, n = -1;
    T_CHECK(nv_tokenizer_encode(t, "", 1, 0, &ids, &n) == NV_OK && n == 0, "no BOS to start from: nothing");
    free(ids);
    T_CHECK(nv_tokenizer_is_eog(t, ID_IM_END) && nv_tokenizer_is_eog(t, ID_ENDOFTEXT), "end tokens found by name");
    nv_tokenizer_free(t);
}

/* SmolLM's split (llama.cpp's "smollm"; transformers' Digits then ByteLevel): every digit a piece,
 * and white space before a digit ends a piece there as at the text's end: "  " stays one piece
 * ("a  12" under GPT-2's split keeps a space for the number and merges "12"). scripts/hf_check.sh
 * compares it with transformers.js on a real vocabulary. */
static void test_smollm_digits(void) {
    nv_tokenizer *t = load_vocab(&(vocab_opts){"smollm", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0});
    nv_tokenizer *g = load_vocab(&(vocab_opts){"gpt-2", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0});
    if (!t || !g) return;
    EXPECT(t, "a  12", 1, id_of(t, "a"), id_of(t, "  "), id_of(t, "1"), id_of(t, "2"));
    EXPECT(g, "a  12", 1, id_of(g, "a"), id_of(g, " "), id_of(g, " "), id_of(g, "12"));
    EXPECT(t, "the 12the", 1, id_of(t, "t"), id_of(t, "he"), id_of(t, " "), id_of(t, "1"), id_of(t, "2"), id_of(t, "t"), id_of(t, "he"));
    /* Granite 3's files name it "refact" (llama.cpp runs its split as SmolLM's) */
    nv_tokenizer *r = load_vocab(&(vocab_opts){"refact", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0});
    if (r) EXPECT(r, "a  12", 1, id_of(r, "a"), id_of(r, "  "), id_of(r, "1"), id_of(r, "2"));
    nv_tokenizer_free(r);
    nv_tokenizer_free(t);
    nv_tokenizer_free(g);
}

/* GPT-4o's split (llama.cpp's "gpt-4o" and "llama4"; Phi-4-mini's tokenizer.json Split pattern): a
 * word ends where lower case turns upper ("aCat": "a" "Cat", so the a-C merge cannot join them,
 * as it does under GPT-2's split), digits in threes ("1212": "121" "2"), whole words not taken
 * (no ignore_merges), a contraction stays with its word; tokenizer.json's pattern names it. */
static void test_gpt4o_split(void) {
    nv_tokenizer *t = load_vocab(&(vocab_opts){"gpt-4o", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0});
    nv_tokenizer *g = load_vocab(&(vocab_opts){"gpt-2", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0});
    nv_tokenizer *l4 = load_vocab(&(vocab_opts){"llama4", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0});
    if (!t || !g || !l4) return;
    EXPECT(t, "aCat", 0, 'a', 'C', id_of(t, "at"));
    EXPECT(l4, "aCat", 0, 'a', 'C', id_of(t, "at"));
    EXPECT(g, "aCat", 0, id_of(g, "aC"), id_of(g, "at"));
    EXPECT(t, "1212", 0, id_of(t, "12"), '1', '2');
    EXPECT(g, "1212", 0, id_of(g, "12"), id_of(g, "12"));
    EXPECT(t, " there", 0, id_of(t, " the"), 'r', 'e');
    EXPECT(t, "Cat'll", 0, 'C', id_of(t, "at"), id_of(t, "'ll"));
    EXPECT(t, "!\n\n", 0, '!', id_of(t, "\n\n"));
    T_CHECK(!strcmp(pre_named(nv_bpe_splits_of_pre("gpt-4o")), "gpt-4o") &&
                nv_bpe_splits_of_pre("llama4") == nv_bpe_splits_of_pre("gpt-4o") && nv_bpe_splits_of_pre("gpt-4o") != nv_bpe_splits_of_pre("gpt-2"),
            "the pattern and its names");
    nv_tokenizer_free(t);
    nv_tokenizer_free(g);
    nv_tokenizer_free(l4);
}

/* Mistral's think tags as its vocabularies hold them, control tokens: parsed whole in a prompt, printed
 * only once shown (as the server shows them for a template with [THINK] blocks); then a prompt ending
 * with one opens the block, a spent budget's close is that one token, and a grammar allowing the block
 * takes the token itself. */
static void test_think_control_tokens(void) {
    nv_tokenizer *t = load_vocab(&(vocab_opts){"tekken", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 3, 0});
    if (!t) return;
    const int open = N_TOKENS, close = N_TOKENS + 1;
    EXPECT(t, "at[THINK]at[/THINK]", 0, id_of(t, "at"), open, id_of(t, "at"), close);
    T_CHECK(!strcmp(nv_tokenizer_decode(t, 0, open), ""), "a control token prints nothing until shown");
    T_CHECK(nv_tokenizer_show(t, "[THINK]") == open && nv_tokenizer_show(t, "[/THINK]") == close && !strcmp(nv_tokenizer_decode(t, 0, open), "[THINK]"),
            "shown, it prints its text");
    const int prompt[] = {id_of(t, "at"), open};
    T_CHECK(nv_think_opened(t, NV_THINK_BRACKET, prompt, 2) && !nv_think_opened(t, NV_THINK_ANGLE, prompt, 2), "the prompt opens Mistral's block");
    int *ids = NULL, n = 0;
    T_CHECK(nv_think_close_ids(t, NV_THINK_BRACKET, NULL, &ids, &n) == NV_OK && n == 1 && ids[0] == close, "the forced close: %d ids", n);
    free(ids);
    cJSON *schema = cJSON_Parse("{\"type\":\"object\"}");
    nv_grammar *g = NULL;
    T_CHECK(nv_schema_grammar_ex(schema, 0, NV_THINK_BRACKET, &g) == NV_OK, "%s", nv_errmsg());
    cJSON_Delete(schema);
    uint8_t *mask = first_mask(t, g, N_TOKENS + 2);
    T_CHECK(mask && mask[open] && !mask[close] && mask['{'], "the grammar takes the open tag's token first");
    nv_grammar_unref(g);
    free(mask);
    nv_tokenizer_free(t);
    /* as serve and chat show them: both of Mistral's tags for its tags, nothing for <think>'s */
    t = load_vocab(&(vocab_opts){"tekken", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 3, 0});
    if (!t) return;
    nv_think_show_tags(t, NV_THINK_ANGLE);
    T_CHECK(!strcmp(nv_tokenizer_decode(t, 0, open), ""), "<think>'s tags show nothing");
    nv_think_show_tags(t, NV_THINK_BRACKET);
    T_CHECK(!strcmp(nv_tokenizer_decode(t, 0, open), "[THINK]") && !strcmp(nv_tokenizer_decode(t, 0, close), "[/THINK]"), "Mistral's tags shown");
    nv_tokenizer_free(t);
}

/* The text of answer's ids, each decoded after the one before it, as serve prints a stream. */
static void decoded(const nv_tokenizer *t, const int *ids, int n, char *out, size_t cap) {
    *out = '\0';
    for (int i = 0; i < n; i++) snprintf(out + strlen(out), cap - strlen(out), "%s", nv_tokenizer_decode(t, i ? ids[i - 1] : 0, ids[i]));
}

/* Mistral's tool-call markers as the control tokens of its vocabularies: serve shows those its
 * template's call style writes, so that the answer's calls reach the parser as text (the model's
 * own call id with them). */
static void test_call_control_tokens(void) {
    static const struct {
        nv_tool_style style;
        const char *shown; /* the markers that print as text, of [TOOL_CALLS], [ARGS], [CALL_ID] */
    } cases[] = {{NV_TOOLS_HERMES, "---"}, {NV_TOOLS_MISTRAL_ARGS, "TA-"}, {NV_TOOLS_MISTRAL_CALL_ID, "TAC"}};
    const char *answer = "[TOOL_CALLS]play[CALL_ID]a1B2c3D4e[ARGS]{}";
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        nv_tokenizer *t = load_vocab(&(vocab_opts){"tekken", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 4, 0});
        if (!t) return;
        nv_chat_show_tool_tokens(t, NV_CHAT_CHATML, cases[c].style);
        for (int k = 0; k < 3; k++) {
            const char *want = cases[c].shown[k] == '-' ? "" : k == 0 ? "[TOOL_CALLS]" : k == 1 ? "[ARGS]" : "[CALL_ID]";
            T_CHECK(!strcmp(nv_tokenizer_decode(t, 0, N_TOKENS + k), want), "style %d: token %d prints '%s'", (int)cases[c].style, k,
                    nv_tokenizer_decode(t, 0, N_TOKENS + k));
        }
        if (cases[c].style == NV_TOOLS_MISTRAL_CALL_ID) {
            int *ids = NULL, n = 0;
            T_CHECK(nv_tokenizer_encode(t, answer, 0, 0, &ids, &n) == NV_OK, "%s", nv_errmsg());
            int controls = 0;
            for (int i = 0; i < n; i++) controls += ids[i] >= N_TOKENS;
            char text[256];
            decoded(t, ids, n, text, sizeof text);
            const char *names[] = {"play"};
            nv_tool_parser p = {.style = NV_TOOLS_MISTRAL_CALL_ID, .names = names, .n_names = 1};
            nv_buf content = {0};
            nv_tool_call *calls = NULL;
            int n_calls = 0;
            nv_tool_parser_feed(&p, text, strlen(text), 1, &content, &calls, &n_calls);
            T_CHECK(controls == 3 && n_calls == 1 && !strcmp(calls[0].name, "play") && !strcmp(calls[0].id, "a1B2c3D4e"),
                    "the answer's %d control tokens, printed '%s': %d calls", controls, text, n_calls);
            nv_tool_calls_free(calls, n_calls);
            nv_buf_free(&content);
            nv_tool_parser_free(&p);
            free(ids);
        }
        nv_tokenizer_free(t);
    }
    /* Mistral's v3 template: its [TOOL_CALLS] alone, whatever the Jinja style */
    nv_tokenizer *t = load_vocab(&(vocab_opts){"tekken", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 4, 0});
    if (!t) return;
    nv_chat_show_tool_tokens(t, NV_CHAT_MISTRAL, NV_TOOLS_HERMES);
    T_CHECK(!strcmp(nv_tokenizer_decode(t, 0, N_TOKENS), "[TOOL_CALLS]") && !strcmp(nv_tokenizer_decode(t, 0, N_TOKENS + 1), ""),
            "mistral's renderer: [TOOL_CALLS] shown, [ARGS] not");
    nv_tokenizer_free(t);
}

/* Mistral's Tekken split (llama.cpp's "tekken"; Mistral NeMo's and later tokenizer.json pattern):
 * GPT-4o's word split ("aCat": "a" "Cat"), every digit a piece ("1212": no "12"), whole-word tokens
 * taken (ignore_merges, as llama.cpp runs it), BOS asked for unless the file says otherwise. */
static void test_tekken_split(void) {
    nv_tokenizer *t = load_vocab(&(vocab_opts){"tekken", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0});
    if (!t) return;
    EXPECT(t, "aCat", 0, 'a', 'C', id_of(t, "at"));
    EXPECT(t, "1212", 0, '1', '2', '1', '2');
    EXPECT(t, " there", 0, ID_THERE);
    EXPECT(t, "!\n\n", 0, '!', id_of(t, "\n\n"));
    EXPECT(t, "at", 1, ID_ENDOFTEXT, id_of(t, "at"));
    T_CHECK(!strcmp(pre_named(nv_bpe_splits_of_pre("tekken")), "tekken") && nv_bpe_pre_ignores_merges("tekken") &&
                nv_bpe_splits_of_pre("tekken") != nv_bpe_splits_of_pre("gpt-4o"),
            "the pattern and its name");
    nv_tokenizer_free(t);
}

/* DeepSeek's splits, several in a row, each splitting the pieces the one before made
 * (scripts/bpe_check.sh compares them with transformers.js on DeepSeek-V3's vocabulary).
 * DeepSeek-Coder's: each line break and each digit a piece ("\n\n" and "12" not merged), a letter
 * run with the space before it, punctuation apart. DeepSeek LLM's: numbers whole ("12"), line breaks
 * apart. DeepSeek-V3's: numbers in threes ("121" "2"), line breaks together. All put BOS first. */
static void test_deepseek_splits(void) {
    nv_tokenizer *c = load_vocab(&(vocab_opts){"deepseek-coder", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0});
    nv_tokenizer *l = load_vocab(&(vocab_opts){"deepseek-llm", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0});
    nv_tokenizer *v3 = load_vocab(&(vocab_opts){"deepseek-v3", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0});
    nv_tokenizer *g = load_vocab(&(vocab_opts){"gpt-2", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0});
    if (!c || !l || !v3 || !g) return;
    EXPECT(c, "a 12", 0, 'a', ' ', '1', '2');
    EXPECT(l, "a 12", 0, 'a', ' ', id_of(l, "12"));
    EXPECT(g, "a 12", 0, 'a', ' ', id_of(g, "12"));
    EXPECT(c, "1212", 0, '1', '2', '1', '2');
    EXPECT(l, "1212", 0, id_of(l, "12"), id_of(l, "12"));
    EXPECT(v3, "1212", 0, id_of(v3, "12"), '1', '2');
    EXPECT(c, "x\n\ny", 0, 'x', '\n', '\n', 'y');
    EXPECT(l, "x\n\ny", 0, 'x', '\n', '\n', 'y');
    EXPECT(v3, "x\n\ny", 0, 'x', id_of(v3, "\n\n"), 'y');
    EXPECT(c, " cat!", 0, id_of(c, " cat"), '!');
    EXPECT(c, "at", 1, ID_ENDOFTEXT, id_of(c, "at"));
    /* DeepSeek LLM's trailing white space ("\\s+$"): the two spaces after "a" stay one piece and merge */
    EXPECT(l, "a  ", 0, 'a', id_of(l, "  "));
    static const char *const names[] = {"deepseek-llm", "deepseek-coder", "deepseek-v3"};
    for (int k = 0; k < 3; k++)
        T_CHECK(!strcmp(pre_named(nv_bpe_splits_of_pre(names[k])), names[k]) && nv_bpe_splits_of_pre(names[k])->n > 1, "%s", names[k]);
    T_CHECK(nv_bpe_splits_of_pre("hunyuan-dense") == nv_bpe_splits_of_pre("deepseek-v3"), "llama.cpp's other name for V3's");
    nv_tokenizer_free(c);
    nv_tokenizer_free(l);
    nv_tokenizer_free(v3);
    nv_tokenizer_free(g);
}

/* Written out (vocab-only GGUF) and read back: the same pieces, ids, special ids and encodings. */
static void test_write_read_back(void) {
    for (int v = 0; v < 2; v++) {
        vocab_opts o = v ? llama3() : qwen();
        if (v) o.add_bos = 0;
        else o.add_eos = 1; /* (an embedding model's vocabulary: EOS after each input) */
        nv_tokenizer *t = load_vocab(&o), *u = NULL;
        if (!t) return;
        char path[256];
        snprintf(path, sizeof path, "/tmp/nerve_bpe_back_%d.gguf", (int)getpid());
        T_CHECK(nv_gguf_save_vocab(t, path) == NV_OK, "save: %s", nv_errmsg());
        T_CHECK(nv_tokenizer_load(path, 0, &u) == NV_OK, "load back: %s", nv_errmsg());
        remove(path);
        if (!u) {
            nv_tokenizer_free(t);
            return;
        }
        T_CHECK(nv_tokenizer_vocab_size(u) == nv_tokenizer_vocab_size(t) && nv_tokenizer_byte_level(u), "size");
        for (int i = 0; i < nv_tokenizer_vocab_size(t); i++) {
            T_CHECK(!strcmp(nv_tokenizer_piece(t, i), nv_tokenizer_piece(u, i)), "piece %d", i);
            T_CHECK(!strcmp(nv_tokenizer_decode(t, 0, i), nv_tokenizer_decode(u, 0, i)), "text %d", i);
            T_CHECK(nv_tokenizer_is_eog(t, i) == nv_tokenizer_is_eog(u, i), "eog %d", i);
        }
        nv_bpe_view a, b;
        T_CHECK(nv_tokenizer_bpe_view(t, &a) && nv_tokenizer_bpe_view(u, &b), "views");
        T_CHECK(nv_tokenizer_adds_eos(t) == !v && nv_tokenizer_adds_eos(u) == !v, "add_eos_token %d, read back %d", nv_tokenizer_adds_eos(t),
                nv_tokenizer_adds_eos(u));
        T_CHECK(a.bos == b.bos && a.eos == b.eos && a.add_bos == b.add_bos && a.n_merges == b.n_merges &&
                    !strcmp(a.pre, b.pre) && !memcmp(a.merge_pair, b.merge_pair, 2 * sizeof(int32_t) * (size_t)a.n_merges),
                "specials, merges and pre-tokenizer kept");
        static const char *texts[] = {" the cat", "her 12345 I'll", "\xc3\xa9!", "<|im_start|>user\nhi<|im_end|>", "  a\n\nb", ""};
        for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
            int *x = NULL, *y = NULL, nx = 0, ny = 0;
            T_CHECK(nv_tokenizer_encode(t, texts[k], 1, 0, &x, &nx) == NV_OK && nv_tokenizer_encode(u, texts[k], 1, 0, &y, &ny) == NV_OK &&
                        nx == ny && !memcmp(x, y, (size_t)nx * sizeof(int)),
                    "'%s' encodes the same", texts[k]);
            free(x);
            free(y);
        }
        nv_tokenizer_free(t);
        nv_tokenizer_free(u);
    }
}

/* Ollama's context (nv_chat_render_history): a conversation so far, then a next message's own
 * rendering (its BOS left out, llama2's kept), is the whole conversation's rendering, for the
 * templates that render turn after turn, where the turns meet at a control token or BOS/EOS (not
 * smollm3 or mistral: a rendering of its own opens with SmolLM3's metadata system turn, and
 * mistral's puts the system text in the last user message). */
static void test_chat_history(void) {
    vocab_opts o = qwen();
    nv_tokenizer *t = load_vocab(&o);
    if (!t) return;
    const nv_chat_msg msgs[] = {{"system", "Be kind.", NULL, 0, NULL, NULL, NULL, 0}, {"user", "Hi there", NULL, 0, NULL, NULL, NULL, 0},
                                {"assistant", "Hello!", NULL, 0, NULL, NULL, NULL, 0}, {"user", "Tell a story", NULL, 0, NULL, NULL, NULL, 0}};
    static const nv_chat_template turn_by_turn[] = {NV_CHAT_CHATML, NV_CHAT_LLAMA2, NV_CHAT_LLAMA3, NV_CHAT_DEEPSEEK, NV_CHAT_PHI3,
                                                     NV_CHAT_GEMMA, NV_CHAT_PHI4, NV_CHAT_PHI4_MINI, NV_CHAT_OLMO2, NV_CHAT_GRANITE};
    for (int think = 0; think < 2; think++)
        for (size_t k = 0; k < sizeof turn_by_turn / sizeof turn_by_turn[0]; k++) {
            const nv_chat_template tmpl = turn_by_turn[k];
            const nv_chat_opts opts = {.no_think = think};
            int *hist = NULL, nh = 0, *next = NULL, nn = 0, *all = NULL, na = 0;
            T_CHECK(nv_chat_render_history(tmpl, t, msgs, 3, &opts, &hist, &nh) == NV_OK &&
                        nv_chat_render_opts(tmpl, t, msgs + 3, 1, &opts, &next, &nn) == NV_OK &&
                        nv_chat_render_opts(tmpl, t, msgs, 4, &opts, &all, &na) == NV_OK,
                    "%s: %s", nv_chat_template_name(tmpl), nv_errmsg());
            const int skip = nv_chat_leading_bos(tmpl, t, next, nn);
            T_CHECK(nh + nn - skip == na && !memcmp(hist, all, (size_t)nh * sizeof *all) &&
                        !memcmp(next + skip, all + nh, (size_t)(nn - skip) * sizeof *all),
                    "%s: the history (%d) and the next message (%d less %d) are not the whole (%d)", nv_chat_template_name(tmpl), nh,
                    nn, skip, na);
            free(hist), free(next), free(all);
        }
    /* /api/generate through chatml: the context its answer comes with, sent back with the next
       prompt, makes that prompt the whole conversation's rendering */
    nv_api_ctx ctx = {.model_id = "m", .tok = t, .tmpl = NV_CHAT_CHATML, .seq_len = 4096, .vocab_size = N_TOKENS, .capacity = 4000, .reasoning = 0, .dim = 64};
    nv_api_request r;
    nv_api_error e;
    nv_olla_meta meta;
    const char *first = "{\"model\":\"m\",\"system\":\"Be kind.\",\"prompt\":\"Hi there\"}";
    T_CHECK(nv_olla_parse(&ctx, first, strlen(first), 0, &r, &meta, &e) == 0, "%s", e.message);
    nv_api_request_free(&r);
    char *done = nv_olla_done(&meta, &(nv_olla_answer){.content = "", .finish = NV_FINISH_STOP, .whole = "Hello!"});
    nv_olla_meta_free(&meta);
    cJSON *j = cJSON_Parse(done);
    char *ids_json = cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "context")), next[8192];
    snprintf(next, sizeof next, "{\"model\":\"m\",\"prompt\":\"Tell a story\",\"context\":%s}", ids_json ? ids_json : "null");
    int *all = NULL, na = 0;
    T_CHECK(nv_olla_parse(&ctx, next, strlen(next), 0, &r, &meta, &e) == 0 &&
                nv_chat_render_opts(NV_CHAT_CHATML, t, msgs, 4, &(nv_chat_opts){0}, &all, &na) == NV_OK,
            "%s %s", e.message, nv_errmsg());
    T_CHECK(r.req.n_prompt == na && !memcmp(r.req.prompt, all, (size_t)na * sizeof *all),
            "the prompt after the context (%d ids) is not the conversation's (%d): %s", r.req.n_prompt, na, done);
    nv_api_request_free(&r);
    nv_olla_meta_free(&meta);
    free(all), free(ids_json), free(done);
    cJSON_Delete(j);
    nv_tokenizer_free(t);
}

/* A chat turn for training (nerve train's chat data) begins with exactly the server's prompt even
 * where a byte-level vocabulary merges across the boundary: plain's answer line starts with "\n",
 * and a user message ending in "\n" would make "\n\n" one token; the answer is then encoded on its
 * own. chatml ends the answer with the <|im_end|> token. */
static void test_chat_turn_boundary(void) {
    vocab_opts o = qwen();
    nv_tokenizer *t = load_vocab(&o);
    if (!t) return;
    const nv_chat_msg m[] = {{"user", "the cat\n", NULL, 0, NULL, NULL, NULL, 0}, {"assistant", "12 in", NULL, 0, NULL, NULL, NULL, 0}};
    const nv_chat_opts none = {0};
    for (int k = 0; k < 2; k++) {
        const nv_chat_template tmpl = k ? NV_CHAT_CHATML : NV_CHAT_PLAIN;
        int *ids = NULL, n = 0, np = 0, *prompt = NULL, nprompt = 0, *answer = NULL, na = 0, *whole = NULL, nw = 0;
        T_CHECK(nv_chat_render_turn(tmpl, t, m, 2, &none, &ids, &n, &np) == NV_OK &&
                    nv_chat_render_opts(tmpl, t, m, 1, &none, &prompt, &nprompt) == NV_OK,
                "render: %s", nv_errmsg());
        T_CHECK(np == nprompt && n > np && !memcmp(ids, prompt, (size_t)np * sizeof(int)),
                "%s: the turn does not begin with the server's prompt (%d of %d)", nv_chat_template_name(tmpl), np, nprompt);
        if (k == 0) { /* the merge happened: the whole text's tokens differ, the answer was encoded alone */
            T_CHECK(nv_tokenizer_encode(t, "the cat\n\n12 in", 0, 0, &whole, &nw) == NV_OK &&
                        nv_tokenizer_encode(t, "\n12 in", 0, 1, &answer, &na) == NV_OK,
                    "encode: %s", nv_errmsg());
            int merged = 0;
            for (int i = 0; i < nw; i++) merged |= whole[i] == id_of(t, "\n\n");
            T_CHECK(merged, "no merge across the boundary to test");
            T_CHECK(n == np + na && !memcmp(ids + np, answer, (size_t)na * sizeof(int)) && ids[n - 1] == nv_tokenizer_eos(t),
                    "plain: the answer is not \"\\n12 in\" encoded alone then EOS (%d = %d + %d, last %d)", n, np, na,
                    ids[n - 1]);
        } else {
            T_CHECK(ids[n - 1] == ID_IM_END, "chatml: the answer ends with %d, not <|im_end|>", ids[n - 1]);
        }
        free(ids), free(prompt), free(answer), free(whole);
    }
    /* olmo2 on a vocabulary that adds no BOS: its template writes BOS (<|endoftext|> here) all the same,
       once; the turn ends its answer with EOS and nothing after (no generation prompt) */
    int *ids = NULL, n = 0, np = 0, *prompt = NULL, nprompt = 0;
    nv_buf text = {0};
    T_CHECK(nv_chat_render_turn(NV_CHAT_OLMO2, t, m, 2, &none, &ids, &n, &np) == NV_OK &&
                nv_chat_render_opts(NV_CHAT_OLMO2, t, m, 1, &none, &prompt, &nprompt) == NV_OK &&
                nv_chat_render_text(NV_CHAT_OLMO2, t, m, 1, &none, &text) == NV_OK,
            "render: %s", nv_errmsg());
    T_CHECK(np == nprompt && n > np && !memcmp(ids, prompt, (size_t)np * sizeof(int)) && prompt[0] == ID_ENDOFTEXT &&
                prompt[1] != ID_ENDOFTEXT && ids[n - 1] == nv_tokenizer_eos(t) && ids[n - 2] != ID_ENDOFTEXT,
            "olmo2: BOS, the prompt, the answer and EOS (%d of %d)", np, nprompt);
    T_CHECK(text.data && !strcmp(text.data, "<|endoftext|><|user|>\nthe cat\n\n<|assistant|>\n"), "olmo2's text: %s", text.data ? text.data : "");
    free(ids), free(prompt);
    nv_buf_free(&text);
    nv_tokenizer_free(t);
}

/* /v1/completions with a suffix on a code model's vocabulary: the prompt is its fill-in-the-middle
 * form, PRE prefix SUF suffix MID, each part encoded alone; a vocabulary without the markers, a
 * suffix that is not a string and a prompt that is not one string are refused; chat refuses it. */
static void test_fill_in_the_middle(void) {
    vocab_opts o = qwen();
    o.fim = 1;
    nv_tokenizer *t = load_vocab(&o);
    if (!t) return;
    nv_api_ctx ctx = {.model_id = "m", .tok = t, .tmpl = NV_CHAT_CHATML, .seq_len = 4096, .vocab_size = N_TOKENS + 3, .capacity = 4000, .reasoning = 0, .dim = 64};
    const char *body = "{\"prompt\":\"def the(\",\"suffix\":\"\\n  return cat\",\"max_tokens\":4}";
    nv_api_request r;
    nv_api_error e;
    T_CHECK(nv_api_parse(&ctx, 0, body, strlen(body), &r, &e) == 0, "%s", e.message);
    int *a = NULL, *b = NULL, na = 0, nb = 0;
    nv_tokenizer_encode(t, "def the(", 0, 0, &a, &na);
    nv_tokenizer_encode(t, "\n  return cat", 0, 0, &b, &nb);
    int want[64], nw = 0;
    want[nw++] = N_TOKENS; /* <|fim_prefix|> */
    for (int i = 0; i < na; i++) want[nw++] = a[i];
    want[nw++] = N_TOKENS + 1;
    for (int i = 0; i < nb; i++) want[nw++] = b[i];
    want[nw++] = N_TOKENS + 2;
    int same = r.req.n_prompt == nw;
    for (int i = 0; same && i < nw; i++) same = r.req.prompt[i] == want[i];
    T_CHECK(same && na > 1 && nb > 1, "the prompt is not PRE prefix SUF suffix MID (%d ids, want %d)", r.req.n_prompt, nw);
    nv_api_request_free(&r);
    free(a), free(b);
    /* an empty suffix is a plain completion */
    const char *plain = "{\"prompt\":\"def the(\",\"suffix\":\"\"}";
    const int prc = nv_api_parse(&ctx, 0, plain, strlen(plain), &r, &e);
    T_CHECK(prc == 0 && r.req.prompt[0] != N_TOKENS, "empty suffix");
    if (prc == 0) nv_api_request_free(&r);
    static const struct {
        const char *body, *param;
        int chat;
    } bad[] = {{"{\"prompt\":\"x\",\"suffix\":5}", "suffix", 0},
               {"{\"prompt\":[\"x\",\"y\"],\"suffix\":\"z\"}", "prompt", 0},
               {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"suffix\":\"z\"}", "suffix", 1}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        memset(&e, 0, sizeof e);
        T_CHECK(nv_api_parse(&ctx, bad[i].chat, bad[i].body, strlen(bad[i].body), &r, &e) == 400 && !strcmp(e.param, bad[i].param),
                "case %zu: %d %s (%s)", i, e.status, e.message, e.param);
    }
    /* Ollama's /api/generate with a suffix: the same prompt; an empty one is the chat template's turn;
       refused with raw or a system text, on /api/chat, and when not a string */
    nv_olla_meta meta;
    const char *olla = "{\"model\":\"m\",\"prompt\":\"def the(\",\"suffix\":\"\\n  return cat\",\"stream\":false,"
                       "\"options\":{\"num_predict\":4}}";
    T_CHECK(nv_olla_parse(&ctx, olla, strlen(olla), 0, &r, &meta, &e) == 0, "ollama suffix: %s", e.message);
    same = r.req.n_prompt == nw;
    for (int i = 0; same && i < nw; i++) same = r.req.prompt[i] == want[i];
    T_CHECK(same && r.req.max_tokens == 4, "ollama: the prompt is not PRE prefix SUF suffix MID (%d ids, want %d)", r.req.n_prompt, nw);
    nv_api_request_free(&r);
    const char *olla_plain = "{\"model\":\"m\",\"prompt\":\"def the(\",\"suffix\":\"\"}";
    T_CHECK(nv_olla_parse(&ctx, olla_plain, strlen(olla_plain), 0, &r, &meta, &e) == 0 && r.req.prompt[0] != N_TOKENS &&
                r.req.n_prompt > na + 3,
            "ollama, an empty suffix: %s", e.message);
    nv_api_request_free(&r);
    nv_olla_meta_free(&meta);
    static const struct {
        const char *body, *said;
        int chat;
    } olla_bad[] = {{"{\"model\":\"m\",\"prompt\":\"x\",\"suffix\":5}", "suffix: must be a string", 0},
                    {"{\"model\":\"m\",\"prompt\":\"x\",\"suffix\":\"y\",\"raw\":true}", "not used with raw", 0},
                    {"{\"model\":\"m\",\"prompt\":\"x\",\"suffix\":\"y\",\"system\":\"s\"}", "not used with suffix", 0},
                    {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"suffix\":\"y\"}", "/api/generate's", 1}};
    for (size_t i = 0; i < sizeof olla_bad / sizeof *olla_bad; i++)
        T_CHECK(nv_olla_parse(&ctx, olla_bad[i].body, strlen(olla_bad[i].body), olla_bad[i].chat, &r, &meta, &e) == 400 &&
                    strstr(e.message, olla_bad[i].said),
                "ollama case %zu: %d %s", i, e.status, e.message);
    nv_tokenizer_free(t);
    t = load_vocab(&(vocab_opts){"qwen2", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0}); /* no markers */
    if (!t) return;
    ctx.tok = t, ctx.vocab_size = N_TOKENS;
    memset(&e, 0, sizeof e);
    T_CHECK(nv_api_parse(&ctx, 0, body, strlen(body), &r, &e) == 400 && !strcmp(e.param, "suffix") && strstr(e.message, "fill-in-the-middle"),
            "a vocabulary without markers: %d %s", e.status, e.message);
    T_CHECK(nv_olla_parse(&ctx, olla, strlen(olla), 0, &r, &meta, &e) == 400 && strstr(e.message, "fill-in-the-middle"),
            "ollama, a vocabulary without markers: %d %s", e.status, e.message);
    nv_tokenizer_free(t);
}

/* llama.cpp's /infill (serve/llamacpp.h): [PRE] prefix [SUF] suffix [MID] prompt; extra chunks' texts
 * first, or in the repo-level form where the vocabulary has <|repo_name|> and <|file_sep|>; a
 * prompt too long for the context loses the extra context, then the prefix's start, then the
 * suffix's end, and says it was truncated; a vocabulary without the markers, and bad fields, 400. */
static void expect_prompt_ids(const nv_api_request *r, const int *want, int nw, const char *what) {
    int same = r->req.n_prompt == nw;
    for (int i = 0; same && i < nw; i++) same = r->req.prompt[i] == want[i];
    T_CHECK(same, "%s: %d ids, want %d", what, r->req.n_prompt, nw);
}

static int put_text(const nv_tokenizer *t, const char *text, int *out) {
    int *v = NULL, n = 0;
    nv_tokenizer_encode(t, text, 0, 0, &v, &n);
    memcpy(out, v, (size_t)n * sizeof *v);
    free(v);
    return n;
}

/* llama.cpp's native body is read as an OpenAI one with its own fields taken out: a key given twice
 * is taken out whole (the second "logprobs" once surfaced as logprobs without n_probs; fuzz_api). */
static void test_native_repeated_keys(void) {
    nv_tokenizer *t = load_vocab(&(vocab_opts){"qwen2", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0});
    if (!t) return;
    nv_api_ctx ctx = {.model_id = "m", .tok = t, .tmpl = NV_CHAT_CHATML, .seq_len = 4096, .vocab_size = N_TOKENS, .capacity = 4000, .reasoning = 0, .dim = 64};
    static const char body[] = "{\"prompt\":\"cat\",\"max_tokens\":3,\"logprobs\":5,\"logprobs\":5,\"seed\":-1,\"seed\":-1}";
    nv_api_request r;
    nv_api_error e;
    nv_lcpp_meta m;
    T_CHECK(nv_lcpp_parse(&ctx, body, strlen(body), 0, &r, &m, &e) == 0, "%s", e.message);
    T_CHECK(m.n_probs == 0 && !r.req.logprobs, "n_probs %d, logprobs %d", m.n_probs, r.req.logprobs);
    nv_api_request_free(&r);
    nv_lcpp_meta_free(&m);
    nv_tokenizer_free(t);
}

static void test_infill_native(void) {
    for (int fim = 1; fim <= 2; fim++) {
        vocab_opts o = qwen();
        o.fim = fim;
        nv_tokenizer *t = load_vocab(&o);
        if (!t) return;
        const int V = N_TOKENS + (fim == 2 ? 5 : 3), PRE = N_TOKENS, SUF = PRE + 1, MID = PRE + 2, REP = PRE + 3, SEP = PRE + 4;
        nv_api_ctx ctx = {.model_id = "m", .tok = t, .tmpl = NV_CHAT_CHATML, .seq_len = 4096, .vocab_size = V, .capacity = 4000, .reasoning = 0, .dim = 64};
        const char *body = "{\"input_prefix\":\"def the(\",\"input_suffix\":\"\\n  return cat\",\"prompt\":\"cat\","
                           "\"input_extra\":[{\"filename\":\"a.py\",\"text\":\"the cat\"}],\"n_predict\":8}";
        nv_api_request r;
        nv_api_error e;
        nv_lcpp_meta m;
        T_CHECK(nv_lcpp_parse(&ctx, body, strlen(body), 1, &r, &m, &e) == 0, "%s", e.message);
        int want[256], nw = 0;
        if (fim == 2) {
            want[nw++] = REP;
            nw += put_text(t, "myproject\n", want + nw);
            want[nw++] = SEP;
            nw += put_text(t, "a.py\nthe cat", want + nw);
            want[nw++] = SEP;
            nw += put_text(t, "filename\n", want + nw);
        } else {
            nw += put_text(t, "the cat", want + nw);
        }
        want[nw++] = PRE;
        nw += put_text(t, "def the(", want + nw);
        want[nw++] = SUF;
        nw += put_text(t, "\n  return cat", want + nw);
        want[nw++] = MID;
        nw += put_text(t, "cat", want + nw);
        expect_prompt_ids(&r, want, nw, fim == 2 ? "repo-level form" : "extra text first");
        T_CHECK(!m.truncated && r.req.max_tokens == 8 && r.req.temperature == 0.8f && r.req.top_k == 40, "settings");
        nv_api_request_free(&r);
        nv_lcpp_meta_free(&m);
        /* a context of 24: the answer's room is a quarter (6); the prefix's start goes, the suffix stays whole */
        ctx.seq_len = 24;
        const char *lng = "{\"input_prefix\":\"the cat the cat the cat the cat the cat the cat the cat def\","
                          "\"input_suffix\":\" there\",\"input_extra\":[{\"text\":\"the cat the cat\"}]}";
        const int ok = nv_lcpp_parse(&ctx, lng, strlen(lng), 1, &r, &m, &e) == 0;
        T_CHECK(ok, "%s", e.message);
        if (ok) {
            int pre_ids[128], suf_ids[16];
            const int np = put_text(t, "the cat the cat the cat the cat the cat the cat the cat def", pre_ids), ns = put_text(t, " there", suf_ids);
            /* PRE, the prefix's last tokens, SUF, the whole suffix, MID: 18 ids in all */
            const int kept = 18 - 3 - ns;
            int same = r.req.n_prompt == 18 && r.req.prompt[0] == PRE && r.req.prompt[1 + kept] == SUF && r.req.prompt[17] == MID;
            for (int i = 0; same && i < kept; i++) same = r.req.prompt[1 + i] == pre_ids[np - kept + i];
            for (int i = 0; same && i < ns; i++) same = r.req.prompt[2 + kept + i] == suf_ids[i];
            T_CHECK(m.truncated && same && kept > 0 && kept < np, "truncated %d, %d ids (want 18: PRE, the prefix's last %d of %d, SUF, %d, MID)",
                    m.truncated, r.req.n_prompt, kept, np, ns);
            nv_api_request_free(&r);
            nv_lcpp_meta_free(&m);
        }
        ctx.seq_len = 4096;
        static const char *const bad[] = {"{\"input_prefix\":5}", "{\"input_extra\":{}}", "{\"input_extra\":[{\"text\":1}]}",
                                          "{\"input_prefix\":\"x\",\"n_predict\":-2}", "{\"input_prefix\":\"x\",\"dynatemp_range\":-0.5}"};
        for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
            memset(&e, 0, sizeof e);
            T_CHECK(nv_lcpp_parse(&ctx, bad[i], strlen(bad[i]), 1, &r, &m, &e) == 400, "bad body %zu accepted: %s", i, bad[i]);
        }
        nv_tokenizer_free(t);
    }
    nv_tokenizer *t = load_vocab(&(vocab_opts){"qwen2", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0}); /* no markers */
    if (!t) return;
    nv_api_ctx ctx = {.model_id = "m", .tok = t, .tmpl = NV_CHAT_CHATML, .seq_len = 4096, .vocab_size = N_TOKENS, .capacity = 4000, .reasoning = 0, .dim = 64};
    nv_api_request r;
    nv_api_error e = {0};
    nv_lcpp_meta m;
    T_CHECK(nv_lcpp_parse(&ctx, "{}", 2, 1, &r, &m, &e) == 400 && strstr(e.message, "fill-in-the-middle"), "no markers: %s", e.message);
    nv_tokenizer_free(t);
}

/* vLLM's bad_words on a byte-level vocabulary: each word as written (after its leading white space)
 * and, where the space makes a word of its own of as many tokens, after one space; a sequence's
 * last token is then never sampled after the rest of it. */
static void test_bad_words_tokens(void) {
    nv_tokenizer *t = load_vocab(&(vocab_opts){"qwen2", ID_ENDOFTEXT, ID_IM_END, -1, -1, 0, 0, 0});
    if (!t) return;
    nv_api_ctx ctx = {.model_id = "m", .tok = t, .tmpl = NV_CHAT_CHATML, .seq_len = 4096, .vocab_size = N_TOKENS, .capacity = 4000, .dim = 64};
    nv_api_request r;
    nv_api_error e;
    /* "t" and " t" are each one token: both banned; " cat" is "c" "at" as written, one token " cat" after a
       space (not as many: left out, as vLLM leaves it) */
    const char *body = "{\"prompt\": \"x\", \"max_tokens\": 2, \"bad_words\": [\"t\", \"  cat\"]}";
    T_CHECK(nv_api_parse(&ctx, 0, body, strlen(body), &r, &e) == 0, "%s", e.message);
    nv_buf got = {0}, want = {0};
    for (int k = 0, at = 0; k < r.req.n_bad; at += r.req.bad_len[k], k++) {
        for (int i = 0; i < r.req.bad_len[k]; i++) nv_buf_printf(&got, "%s%d", i ? " " : "", r.req.bad_tok[at + i]);
        nv_buf_puts(&got, ";");
    }
    nv_buf_printf(&want, "%d;%d;%d %d;", 't', id_of(t, " t"), 'c', id_of(t, "at"));
    T_CHECK(got.data && !strcmp(got.data, want.data), "the sequences: %s, not %s", got.data ? got.data : "", want.data);
    nv_buf_free(&got);
    nv_buf_free(&want);
    nv_api_request_free(&r);
    nv_tokenizer_free(t);
}

int main(void) {
    T_RUN(test_merges_by_rank_within_pieces);
    T_RUN(test_llama3_split_and_ignore_merges);
    T_RUN(test_dbrx_split_merges_whole_words);
    T_RUN(test_specials_and_decode);
    T_RUN(test_roundtrip_random);
    T_RUN(test_refused);
    T_RUN(test_gpt2_default);
    T_RUN(test_smollm_digits);
    T_RUN(test_gpt4o_split);
    T_RUN(test_tekken_split);
    T_RUN(test_deepseek_splits);
    T_RUN(test_think_control_tokens);
    T_RUN(test_call_control_tokens);
    T_RUN(test_write_read_back);
    T_RUN(test_chat_turn_boundary);
    T_RUN(test_chat_history);
    T_RUN(test_fill_in_the_middle);
    T_RUN(test_infill_native);
    T_RUN(test_native_repeated_keys);
    T_RUN(test_bad_words_tokens);
    return t_done();
}
