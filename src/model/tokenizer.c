#include "model/tokenizer.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <uninorm.h>

#include "base/file.h"
#include "base/log.h"
#include "model/gguf.h"
#include "model/hf.h"

/* Longest max_token_length header we believe; Llama's is 27, and anything near this is a
 * corrupt or foreign file rather than a vocabulary. */
#define TOK_MAX_HEADER_LEN 65536
/* run.c's merge threshold: its best_score starts at this float and a pair must beat it. */
#define TOK_MERGE_FLOOR (-1e10f)

struct nv_tokenizer {
    int n;
    int max_len;          /* longest piece (as a C string): pairs longer than this never match */
    char *arena;          /* every piece, NUL-terminated, back to back */
    size_t *off;          /* piece i starts at arena + off[i] */
    int *len;             /* strlen of piece i */
    float *score;
    uint32_t *hash;       /* hash of piece i, checked before comparing bytes */
    int *table;           /* open addressing over ids, -1 = empty */
    uint32_t mask;
    char byte_pieces[512]; /* "b\0" for every byte b: decode's answer for <0xXX> pieces */
    uint8_t bigram[256 * 256 / 8]; /* bit (x,y) set: some piece has byte y right after byte x */
    int unk, bos, eos, add_bos; /* llama2.c's: 0, 1, 2, always */
    int add_eos;                /* an embedding model's inputs end with EOS (its vocabulary says so) */
    int spm_bytes;         /* a GGUF SentencePiece vocabulary's byte tokens are byte_tok's, not llama2.c's b + 3 */
    int eog[16], n_eog;    /* ids that end generation */
    /* Byte-level BPE (a GGUF "gpt2" vocabulary); NULL/0 for llama2.c's. Pieces are stored as
     * the file spells them (every byte as one code point); text is what they print. */
    int byte_level, ignore_merges;
    int nfc;               /* a tokenizer.json's NFC normalizer: text composed before it is encoded */
    uint8_t *type;         /* GGUF token type of each id */
    char *text;            /* decoded bytes of every id, NUL-terminated, back to back */
    size_t *text_off;
    uint64_t *mkey;        /* merges: key (left << 32 | right) + 1, 0 = empty slot */
    uint32_t *mrank;       /* the merge's rank (its line in the merges list) */
    int32_t *mid;          /* the merged token */
    uint32_t mmask;
    int byte_tok[256];     /* the token of each single byte */
    char stand[256][2];    /* each byte's GPT-2 stand-in code point as UTF-8 (stand_len[b] bytes) */
    uint8_t stand_len[256];
    int32_t *merge_pair;   /* the merges kept, in rank order: left, right ids (for writing them out) */
    int n_merges;
    char pre[64];
    int eot, eom;
    int *special;          /* control and user-defined ids, grouped by first byte, longest first */
    int rstrip;            /* Phi-3's vocabulary: most special tokens take the white space after them */
    int no_space_prefix;   /* a GGUF vocabulary's add_space_prefix false: no SentencePiece dummy prefix */
    int special_at[257];   /* special[special_at[b] .. special_at[b+1]) start with byte b */
    pcre2_code *re[NV_BPE_MAX_SPLITS]; /* the pre-tokenizer's splits, in order */
    int n_re;
    int shown[8], n_shown; /* control tokens decoding prints as their text (nv_tokenizer_show) */
};

/* FNV-1a, continued across calls so a pair can be hashed without concatenating it. */
#define TOK_HASH_INIT 2166136261u
static uint32_t tok_hash(uint32_t h, const char *s, int n) {
    for (int i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 16777619u;
    }
    return h;
}

static inline const char *tok_piece(const nv_tokenizer *t, int id) { return t->arena + t->off[id]; }

/* Id of the string a (la bytes) followed by b (lb bytes), or -1. */
static int tok_lookup2(const nv_tokenizer *t, const char *a, int la, const char *b, int lb) {
    if (la + lb > t->max_len) return -1;
    uint32_t h = tok_hash(tok_hash(TOK_HASH_INIT, a, la), b, lb);
    for (uint32_t i = h & t->mask;; i = (i + 1) & t->mask) {
        int id = t->table[i];
        if (id < 0) return -1;
        if (t->hash[id] == h && t->len[id] == la + lb) {
            const char *p = tok_piece(t, id);
            if (memcmp(p, a, (size_t)la) == 0 && memcmp(p + la, b, (size_t)lb) == 0) return id;
        }
    }
}

int nv_byte_piece(const char *p, size_t len) {
    if (len != 6 || memcmp(p, "<0x", 3) || !isxdigit((unsigned char)p[3]) || !isxdigit((unsigned char)p[4]) || p[5] != '>') return -1;
    const char hex[3] = {p[3], p[4], 0};
    return (int)strtol(hex, NULL, 16);
}

int nv_tokenizer_lookup(const nv_tokenizer *t, const char *str) {
    size_t n = strlen(str);
    if (n > (size_t)t->max_len) return -1;
    return tok_lookup2(t, str, (int)n, "", 0);
}

/* Re-fails a reader error with the token index in front, keeping the reader's detail. */
static nv_err tok_entry_fail(nv_err e, int index) {
    return nv_fail(e, "%s (token %d)", nv_errmsg(), index);
}

/* Reads one entry; *piece points into the mapping. */
static nv_err tok_read_entry(nv_reader *r, int index, float *score, const void **piece, int32_t *len) {
    nv_err e;
    if ((e = nv_read_f32(r, score, "token score")) != NV_OK) return tok_entry_fail(e, index);
    if ((e = nv_read_i32(r, len, "token length")) != NV_OK) return tok_entry_fail(e, index);
    if (*len < 0)
        return nv_fail(NV_EFORMAT, "%s: token %d has negative length %d at offset %zu", r->what,
                       index, (int)*len, r->pos - 4);
    if ((e = nv_read_view(r, piece, (size_t)*len, "token bytes")) != NV_OK)
        return tok_entry_fail(e, index);
    return NV_OK;
}

void nv_tokenizer_free(nv_tokenizer *t) {
    if (!t) return;
    free(t->type);
    free(t->text);
    free(t->text_off);
    free(t->mkey);
    free(t->mrank);
    free(t->mid);
    free(t->special);
    free(t->merge_pair);
    for (int k = 0; k < t->n_re; k++) pcre2_code_free(t->re[k]);
    free(t->arena);
    free(t->off);
    free(t->len);
    free(t->score);
    free(t->hash);
    free(t->table);
    free(t);
}

static void tok_index(nv_tokenizer *t);

/* The piece arrays for count tokens whose bytes, each plus a NUL, take arena_len. */
static nv_err tok_alloc(const char *path, nv_tokenizer *t, int count, size_t arena_len) {
    t->n = count;
    size_t cap = 1;
    while (cap < 2 * (size_t)count) cap <<= 1;
    if (cap > UINT32_MAX) return nv_fail(NV_ENOMEM, "%s: vocabulary too large", path);
    t->arena = malloc(arena_len ? arena_len : 1);
    t->off = malloc((size_t)count * sizeof *t->off);
    t->len = malloc((size_t)count * sizeof *t->len);
    t->score = calloc((size_t)count, sizeof *t->score);
    t->hash = malloc((size_t)count * sizeof *t->hash);
    t->table = malloc(cap * sizeof *t->table);
    if (!t->arena || !t->off || !t->len || !t->score || !t->hash || !t->table)
        return nv_fail(NV_ENOMEM, "%s: out of memory for %d tokens", path, count);
    t->mask = (uint32_t)(cap - 1);
    memset(t->table, 0xff, cap * sizeof *t->table);
    return NV_OK;
}

/* Copies piece i (len bytes) to the arena at *at. */
static nv_err tok_put_piece(const char *path, nv_tokenizer *t, int i, size_t *at, const void *p, size_t len) {
    memcpy(t->arena + *at, p, len);
    t->arena[*at + len] = '\0';
    t->off[i] = *at;
    /* run.c treats pieces as C strings; an embedded NUL ends the piece. */
    size_t sl = strlen(t->arena + *at);
    if (sl > INT_MAX / 2) return nv_fail(NV_EFORMAT, "%s: token %d is too long", path, i);
    t->len[i] = (int)sl;
    if (t->len[i] > t->max_len) t->max_len = t->len[i];
    *at += len + 1;
    return NV_OK;
}

static nv_err tok_build(const char *path, const nv_mapped *m, int vocab_size, nv_tokenizer *t) {
    nv_reader r = nv_reader_make(m->data, m->len, path);
    int32_t header;
    if (m->len == 0) return nv_fail(NV_EFORMAT, "%s: empty file, not a tokenizer", path);
    NV_TRY(nv_read_i32(&r, &header, "max_token_length"));
    if (header <= 0 || header > TOK_MAX_HEADER_LEN)
        return nv_fail(NV_EFORMAT, "%s: max_token_length %d is not in 1..%d; not a tokenizer.bin",
                       path, (int)header, TOK_MAX_HEADER_LEN);

    /* Pass 1: validate every entry and size the arrays. */
    size_t body = r.pos, arena_len = 0;
    int count = 0;
    while (vocab_size > 0 ? count < vocab_size : nv_reader_left(&r) > 0) {
        float s;
        const void *p;
        int32_t len;
        if (count == INT_MAX) return nv_fail(NV_EFORMAT, "%s: too many tokens", path);
        NV_TRY(tok_read_entry(&r, count, &s, &p, &len));
        arena_len += (size_t)len + 1;
        count++;
    }
    if (count < 3)
        return nv_fail(NV_EFORMAT, "%s: %d tokens; a vocabulary needs at least <unk>, <s>, </s>",
                       path, count);
    NV_TRY(tok_alloc(path, t, count, arena_len));

    /* Pass 2: copy the pieces and index them; the first of equal strings keeps the slot. */
    r.pos = body;
    size_t at = 0;
    for (int i = 0; i < count; i++) {
        const void *p;
        int32_t len;
        NV_TRY(tok_read_entry(&r, i, &t->score[i], &p, &len));
        NV_TRY(tok_put_piece(path, t, i, &at, p, (size_t)len));
    }
    tok_index(t);
    for (int b = 0; b < 256; b++) {
        t->byte_pieces[2 * b] = (char)b;
        t->byte_pieces[2 * b + 1] = '\0';
    }
    t->unk = NV_TOKEN_UNK;
    t->bos = NV_TOKEN_BOS;
    t->eos = NV_TOKEN_EOS;
    t->add_bos = 1;
    t->eog[t->n_eog++] = NV_TOKEN_BOS;
    t->eog[t->n_eog++] = NV_TOKEN_EOS;
    return NV_OK;
}

/* The lookup table and the byte-pair bitmap over the pieces already in the arena. */
static void tok_index(nv_tokenizer *t) {
    const int count = t->n;
    for (int i = 0; i < count; i++) {
        const char *p = tok_piece(t, i);
        uint32_t h = tok_hash(TOK_HASH_INIT, p, t->len[i]);
        t->hash[i] = h;
        uint32_t j = h & t->mask;
        for (; t->table[j] >= 0; j = (j + 1) & t->mask) {
            int o = t->table[j];
            if (t->hash[o] == h && t->len[o] == t->len[i] && memcmp(tok_piece(t, o), p, (size_t)t->len[i]) == 0)
                break;
        }
        if (t->table[j] < 0) t->table[j] = i;
    }
    for (int i = 0; i < count; i++) {
        const unsigned char *p = (const unsigned char *)tok_piece(t, i);
        for (int j = 1; j < t->len[i]; j++) {
            unsigned bg = (unsigned)p[j - 1] << 8 | p[j];
            t->bigram[bg >> 3] |= (uint8_t)(1u << (bg & 7));
        }
    }
}

/* ---- byte-level BPE (GGUF "gpt2" vocabularies: Llama 3, Qwen2/3) ---------------------------- */

/* The pre-tokenizers' splits, as the models' tokenizer.json define them (llama.cpp's names). */
static const char RE_GPT2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char RE_LLAMA3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
                                "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_QWEN2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
                               "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* SmolLM's (and StarCoder's): every digit a piece, then GPT-2's split of what lies between, whose
 * lookahead ends at a digit as it ends at the piece's end (one regex for the two passes). */
static const char RE_SMOLLM[] = "\\p{N}|'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?![^\\s\\p{N}])|\\s+";
/* GPT-4o's (tiktoken's o200k_base: Phi-4-mini, Llama 4): a word split where lower case turns upper,
 * its contraction kept with it, digits in threes, line breaks and slashes kept after punctuation. */
static const char RE_GPT4O[] = "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                               "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                               "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* Mistral's Tekken (Mistral NeMo, Small 3, Magistral, Devstral, Ministral): GPT-4o's split without
 * the contractions, and every digit a piece. */
static const char RE_TEKKEN[] = "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
                                "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
                                "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static int name_in(const char *name, const char *const *list) {
    for (; *list; list++)
        if (!strcmp(name, *list)) return 1;
    return 0;
}

/* DeepSeek's splits come several in a row (tokenizer.json's Sequence of Split pre-tokenizers).
 * DeepSeek LLM's first: line breaks, letters of the cased scripts (Latin, Greek, Cyrillic,
 * Armenian, Georgian, Cherokee... as its tokenizer.json lists them), ASCII and full-width
 * punctuation, trailing white space, CJK and Hangul runs, numbers. DeepSeek-Coder's: line breaks,
 * letters, punctuation, CJK and Hangul runs, each digit. DeepSeek-V3's: numbers in threes, CJK and
 * kana runs, then a split near GPT-4o's. Written as the tokenizer.json files write them (literal
 * characters, here as universal character names), so that those files are recognised. */
#define RE_CJK_HANGUL "[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+"
static const char RE_DEEPSEEK_CASED[] =
    "\\s?[A-Za-z\u00B5\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u01BA\u01BC-\u01BF\u01C4-\u0293\u0295-\u02AF\u0370-\u0373\u0376\u0377"
    "\u037B-\u037D\u037F\u0386\u0388-\u038A\u038C\u038E-\u03A1\u03A3-\u03F5\u03F7-\u0481\u048A-\u052F\u0531-\u0556\u10A0-\u10C5"
    "\u13A0-\u13F5\u13F8-\u13FD\u1C90-\u1CBA\u1CBD-\u1CBF\u1D00-\u1D2B\u1D6B-\u1D77\u1D79-\u1D9A\u1E00-\u1F15\u1F18-\u1F1D"
    "\u1F20-\u1F45\u1F48-\u1F4D\u1F50-\u1F57\u1F59\u1F5B\u1F5D\u1F5F-\u1F7D\u1F80-\u1FB4\u1FB6-\u1FBC\u1FBE\u1FC2-\u1FC4"
    "\u1FC6-\u1FCC\u1FD0-\u1FD3\u1FD6-\u1FDB\u1FE0-\u1FEC\u1FF2-\u1FF4\u1FF6-\u1FFC\u2102\u2107\u210A-\u2113\u2115\u2119-\u211D"
    "\u2124\u2126\u2128\u212A-\u212D\u212F-\u2134\u2139\u213C-\u213F\u2145-\u2149\u214E\u2183\u2184\u2C00-\u2C7B\u2C7E-\u2CE4"
    "\u2CEB-\u2CEE\u2CF2\u2CF3\uA640-\uA66D\uA680-\uA69B\uA722-\uA76F\uA771-\uA787\uA78B-\uA78E\uAB70-\uABBF\uFB00-\uFB06"
    "\uFB13-\uFB17\uFF21-\uFF3A\uFF41-\uFF5A\U00010400-\U0001044F\U000104B0-\U000104D3\U000104D8-\U000104FB"
    "\U00010C80-\U00010CB2\U00010CC0-\U00010CF2\U000118A0-\U000118DF\U0001E900-\U0001E943]+";
static const char RE_DEEPSEEK_V3[] = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
                                     "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";

/* The splits by llama.cpp's pre-tokenizer names, applied in order: each splits every piece the one
 * before made, a match and the text between two matches each a piece (tokenizer.json's Split,
 * "Isolated"). */
static const nv_bpe_splits pre_splits[] = {
    {"llama-bpe", 1, {RE_LLAMA3}},
    {"qwen2", 1, {RE_QWEN2}},
    {"gpt-2", 1, {RE_GPT2}},
    {"smollm", 1, {RE_SMOLLM}},
    {"gpt-4o", 1, {RE_GPT4O}},
    {"tekken", 1, {RE_TEKKEN}},
    {"deepseek-llm", 6,
     {"[\r\n]", RE_DEEPSEEK_CASED, "\\s?[!-/:-~\uFF01-\uFF0F\uFF1A-\uFF5E\u2018-\u201F\u3000-\u3002]+", "\\s+$", RE_CJK_HANGUL, "\\p{N}+"}},
    {"deepseek-coder", 5, {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK_HANGUL, "\\p{N}"}},
    {"deepseek-v3", 3, {"\\p{N}{1,3}", "[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+", RE_DEEPSEEK_V3}},
};
enum { SPLITS_LLAMA3, SPLITS_QWEN2, SPLITS_GPT2, SPLITS_SMOLLM, SPLITS_GPT4O, SPLITS_TEKKEN, SPLITS_DEEPSEEK_LLM, SPLITS_DEEPSEEK_CODER, SPLITS_DEEPSEEK_V3 };

const char *nv_bpe_pre_of_splits(const char *const *re, int n) {
    for (size_t i = 0; i < sizeof pre_splits / sizeof pre_splits[0]; i++) {
        int k = 0;
        while (k < n && k < pre_splits[i].n && !strcmp(re[k], pre_splits[i].re[k])) k++;
        if (k == n && n == pre_splits[i].n) return pre_splits[i].pre;
    }
    return NULL;
}

/* Llama 3's split, whose pieces that are tokens are taken whole (its BPE ignores the merges) */
static const char *const llama3[] = {"llama3", "llama-v3", "llama-bpe", "falcon3", NULL};

/* (Tekken's pieces too, as llama.cpp takes them: tiktoken's vocabulary) */
int nv_bpe_pre_ignores_merges(const char *pre) { return name_in(pre, llama3) || !strcmp(pre, "tekken"); }

const nv_bpe_splits *nv_bpe_splits_of_pre(const char *pre) {
    /* Llama 3's split (cl100k's) with merges applied to every piece: DBRX's and OLMo 2's vocabularies */
    static const char *const cl100k[] = {"dbrx", "smaug-bpe", NULL};
    static const char *const qwen2[] = {"qwen2", "deepseek-r1-qwen", NULL};
    static const char *const smollm[] = {"smollm", "starcoder", "refact", NULL}; /* refact: Granite 3's */
    static const char *const gpt4o[] = {"gpt-4o", "llama4", NULL};
    static const char *const deepseek3[] = {"deepseek-v3", "hunyuan-dense", NULL}; /* (llama.cpp's names for the split) */
    const int k = name_in(pre, llama3) || name_in(pre, cl100k) ? SPLITS_LLAMA3
                  : name_in(pre, qwen2)                        ? SPLITS_QWEN2
                  : name_in(pre, smollm)                       ? SPLITS_SMOLLM
                  : name_in(pre, gpt4o)                        ? SPLITS_GPT4O
                  : !strcmp(pre, "tekken")                     ? SPLITS_TEKKEN
                  : !strcmp(pre, "deepseek-llm")               ? SPLITS_DEEPSEEK_LLM
                  : !strcmp(pre, "deepseek-coder")             ? SPLITS_DEEPSEEK_CODER
                  : name_in(pre, deepseek3)                    ? SPLITS_DEEPSEEK_V3
                                                               : SPLITS_GPT2;
    return &pre_splits[k];
}

/* GPT-2's printable stand-in for each byte: printable Latin-1 bytes stand for themselves, the
 * others (controls, space, 0x7F-0xA0, 0xAD) for U+0100 onwards in byte order. */
static unsigned byte_code_point(unsigned b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    unsigned n = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) n++;
    return 0x100 + n;
}

/* Code points below 0x800 as UTF-8; returns the length. */
static int utf8_put2(char *o, unsigned cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    o[0] = (char)(0xC0 | cp >> 6);
    o[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

static uint32_t merge_hash(uint64_t key) { return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32); }

/* The slot of the merge of tokens a and b: where its key is, or the empty slot it would take. */
static uint32_t merge_slot(const nv_tokenizer *t, int a, int b, uint64_t *key) {
    *key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    uint32_t i = merge_hash(*key) & t->mmask;
    while (t->mkey[i] && t->mkey[i] != *key) i = (i + 1) & t->mmask;
    return i;
}

/* The merge of tokens a and b: the merged id and its rank, or -1. */
static int merge_find(const nv_tokenizer *t, int a, int b, uint32_t *rank) {
    uint64_t key;
    const uint32_t i = merge_slot(t, a, b, &key);
    if (!t->mkey[i]) return -1;
    *rank = t->mrank[i];
    return t->mid[i];
}

static int by_special(const void *x, const void *y, void *ctx) {
    const nv_tokenizer *t = ctx;
    int a = *(const int *)x, b = *(const int *)y;
    unsigned char fa = (unsigned char)tok_piece(t, a)[0], fb = (unsigned char)tok_piece(t, b)[0];
    if (fa != fb) return fa < fb ? -1 : 1;
    if (t->len[a] != t->len[b]) return t->len[a] > t->len[b] ? -1 : 1;
    return a < b ? -1 : a > b;
}

static void add_eog(nv_tokenizer *t, int id) {
    if (id < 0 || t->n_eog == (int)(sizeof t->eog / sizeof t->eog[0])) return;
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return;
    t->eog[t->n_eog++] = id;
}

/* The special tokens (unknown, control, user-defined: t->type), found in text before anything
 * else, longest first. */
static nv_err index_specials(const char *path, nv_tokenizer *t) {
    int ns = 0;
#define IS_SPECIAL(i) ((t->type[i] == 2 || t->type[i] == 3 || t->type[i] == 4) && t->len[i] > 0)
    for (int i = 0; i < t->n; i++) ns += IS_SPECIAL(i);
    if (!(t->special = malloc((size_t)(ns ? ns : 1) * sizeof *t->special))) return nv_fail(NV_ENOMEM, "%s: out of memory", path);
    ns = 0;
    for (int i = 0; i < t->n; i++)
        if (IS_SPECIAL(i)) t->special[ns++] = i;
#undef IS_SPECIAL
    qsort_r(t->special, (size_t)ns, sizeof *t->special, by_special, t);
    for (int b = 0, j = 0; b <= 256; b++) {
        while (j < ns && (unsigned char)tok_piece(t, t->special[j])[0] < b) j++;
        t->special_at[b] = j;
    }
    return NV_OK;
}

/* A vocabulary's special id, or -1 when it is past a vocabulary cut to n tokens. */
static int id_within(int id, int n) { return id < n ? id : -1; }

/* A harmony vocabulary's (gpt-oss's: <|return|>, <|call|> and <|end|> all there) message markers made
 * user-defined: the answer's text holds them, where its parser reads channels (as llama.cpp renders
 * them). Whether the vocabulary is one. */
static int harmony_markers(nv_tokenizer *t) {
    if (nv_tokenizer_lookup(t, "<|return|>") < 0 || nv_tokenizer_lookup(t, "<|call|>") < 0 || nv_tokenizer_lookup(t, "<|end|>") < 0) return 0;
    static const char *const shown[] = {"<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", NULL};
    for (int i = 0; shown[i]; i++) {
        const int id = nv_tokenizer_lookup(t, shown[i]);
        if (id >= 0 && (t->type[id] == 3 || t->type[id] == 4)) t->type[id] = 4;
    }
    return 1;
}

/* Generation ends at EOS, the end-of-turn and end-of-message ids, and the control tokens that end
 * turns by name (as llama.cpp finds them). */
static void add_ends(nv_tokenizer *t) {
    add_eog(t, t->eos);
    add_eog(t, t->eot);
    add_eog(t, t->eom);
    /* gpt-oss's harmony format: an answer's messages end at <|end|> and go on (its reasoning, then its
       final message), the answer at <|return|> or a tool call's <|call|> */
    const int harmony = harmony_markers(t);
    static const char *const ends[] = {"<|eot_id|>",  "<|im_end|>", "<|endoftext|>", "<|end_of_text|>", "<|eom_id|>",
                                       "<end_of_turn>", "<|end|>",  NULL};
    for (int i = 0; ends[i]; i++) { /* a user-defined one made control, as llama.cpp makes it (Gemma's <end_of_turn>) */
        int id = nv_tokenizer_lookup(t, ends[i]);
        if (id >= 0 && (t->type[id] == 3 || t->type[id] == 4) && !(harmony && !strcmp(ends[i], "<|end|>"))) add_eog(t, id), t->type[id] = 3;
    }
    if (harmony) add_eog(t, nv_tokenizer_lookup(t, "<|return|>")), add_eog(t, nv_tokenizer_lookup(t, "<|call|>"));
}

static nv_err tok_build_bpe(const char *path, const nv_gguf_bpe *v, int vocab_size, nv_tokenizer *t) {
    static const char *const gpt2[] = {"gpt-2", "gpt2", "default", "", NULL};
    const nv_bpe_splits *sp = nv_bpe_splits_of_pre(v->pre);
    int add_bos_default = 0;
    if (nv_bpe_pre_ignores_merges(v->pre)) {
        t->ignore_merges = 1;
        add_bos_default = 1;
    } else if (sp == &pre_splits[SPLITS_DEEPSEEK_LLM] || sp == &pre_splits[SPLITS_DEEPSEEK_CODER] || sp == &pre_splits[SPLITS_DEEPSEEK_V3]) {
        add_bos_default = 1; /* (their tokenizers put BOS first) */
    } else if (sp == &pre_splits[SPLITS_GPT2] && name_in(v->pre, gpt2)) {
        if (strcmp(v->pre, "gpt-2") && strcmp(v->pre, "gpt2")) /* llama.cpp runs a set of its own then */
            nv_warn("%s: no pre-tokenizer named (tokenizer.ggml.pre '%s'): using GPT-2's split; ids may differ from the "
                    "model's own tokenizer (older Llama 3 files: convert them again)", path, v->pre[0] ? "default" : "");
    } else if (sp == &pre_splits[SPLITS_GPT2]) {
        char shown[128];
        return nv_fail(NV_EUNSUPPORTED,
                       "%s: pre-tokenizer '%s' is not supported (llama3/llama-bpe, dbrx, qwen2, smollm, gpt-4o, tekken, deepseek-llm, "
                       "deepseek-coder, deepseek-v3, gpt-2)", path,
                       nv_gguf_shown(v->pre, strlen(v->pre), shown, sizeof shown));
    }
    if (vocab_size > v->n_tokens)
        return nv_fail(NV_EFORMAT, "%s: %d tokens, fewer than the %d asked for", path, v->n_tokens, vocab_size);
    const int n = vocab_size > 0 ? vocab_size : v->n_tokens;
    size_t arena_len = 0;
    for (int i = 0; i < n; i++) arena_len += (size_t)v->tok_len[i] + 1;
    NV_TRY(tok_alloc(path, t, n, arena_len));
    t->byte_level = 1;
    t->type = malloc((size_t)n);
    t->text_off = malloc((size_t)n * sizeof *t->text_off);
    t->text = malloc(arena_len ? arena_len : 1); /* decoding never lengthens a piece */
    if (!t->type || !t->text_off || !t->text) return nv_fail(NV_ENOMEM, "%s: out of memory for %d tokens", path, n);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        NV_TRY(tok_put_piece(path, t, i, &at, v->tok[i], (size_t)v->tok_len[i]));
        t->type[i] = v->tok_type[i] >= 0 && v->tok_type[i] <= 6 ? (uint8_t)v->tok_type[i] : 1;
    }
    tok_index(t);

    /* bytes: the token of each byte's stand-in, and what every piece prints */
    int back[0x144]; /* stand-in code point -> byte */
    for (int i = 0; i < 0x144; i++) back[i] = -1;
    for (unsigned b = 0; b < 256; b++) {
        unsigned cp = byte_code_point(b);
        back[cp] = (int)b;
        t->stand_len[b] = (uint8_t)utf8_put2(t->stand[b], cp);
        t->byte_tok[b] = tok_lookup2(t, t->stand[b], t->stand_len[b], "", 0);
        if (t->byte_tok[b] < 0)
            return nv_fail(NV_EFORMAT, "%s: no token for byte 0x%02X; not a byte-level BPE vocabulary", path, b);
    }
    harmony_markers(t); /* (before what each piece prints is fixed) */
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        const unsigned char *p = (const unsigned char *)tok_piece(t, i);
        const int len = t->len[i];
        t->text_off[i] = o;
        if (t->type[i] == 4) { /* user-defined tokens print as written */
            memcpy(t->text + o, p, (size_t)len);
            o += (size_t)len;
        } else if (t->type[i] != 1) { /* control, unknown, unused (padding) ones: nothing, as llama.cpp */
        } else {
            for (int j = 0; j < len;) {
                unsigned cp = p[j];
                int k = 1;
                if ((p[j] & 0xE0) == 0xC0 && j + 1 < len && (p[j + 1] & 0xC0) == 0x80) {
                    cp = (unsigned)(p[j] & 0x1F) << 6 | (p[j + 1] & 0x3F);
                    k = 2;
                }
                if (cp < 0x144 && back[cp] >= 0 && (k == 2 || cp < 0x80)) t->text[o++] = (char)back[cp];
                else { /* not a stand-in: the bytes as they are */
                    memcpy(t->text + o, p + j, (size_t)k);
                    o += (size_t)k;
                }
                j += k;
            }
        }
        t->text[o++] = '\0';
    }

    /* merges "A B" -> rank; the first line of a pair wins */
    size_t cap = 1;
    while (cap < 2 * (size_t)(v->n_merges > 0 ? v->n_merges : 1)) cap <<= 1;
    t->mkey = calloc(cap, sizeof *t->mkey);
    t->mrank = malloc(cap * sizeof *t->mrank);
    t->mid = malloc(cap * sizeof *t->mid);
    t->merge_pair = malloc(2 * (size_t)(v->n_merges > 0 ? v->n_merges : 1) * sizeof *t->merge_pair);
    if (!t->mkey || !t->mrank || !t->mid || !t->merge_pair)
        return nv_fail(NV_ENOMEM, "%s: out of memory for %d merges", path, v->n_merges);
    t->mmask = (uint32_t)(cap - 1);
    int used = 0;
    for (int r = 0; r < v->n_merges; r++) {
        const char *m = v->merge[r];
        const int ml = v->merge_len[r];
        const char *sp = ml > 1 ? memchr(m + 1, ' ', (size_t)ml - 1) : NULL;
        if (!sp) return nv_fail(NV_EFORMAT, "%s: merge %d is not two pieces separated by a space", path, r);
        const int la = (int)(sp - m), lb = ml - la - 1;
        int a = tok_lookup2(t, m, la, "", 0), b = tok_lookup2(t, sp + 1, lb, "", 0), ab = tok_lookup2(t, m, la, sp + 1, lb);
        if (a < 0 || b < 0 || ab < 0) continue; /* names a piece the vocabulary lacks: it can never apply */
        uint64_t key;
        const uint32_t i = merge_slot(t, a, b, &key);
        if (t->mkey[i]) continue;
        t->mkey[i] = key;
        t->mrank[i] = (uint32_t)r;
        t->mid[i] = ab;
        t->merge_pair[2 * used] = a;
        t->merge_pair[2 * used + 1] = b;
        used++;
    }
    t->n_merges = used;
    if (used == 0 && v->n_merges > 0) return nv_fail(NV_EFORMAT, "%s: none of the %d merges joins two tokens of the vocabulary", path, v->n_merges);

    NV_TRY(index_specials(path, t));

    /* ids past a vocabulary cut to vocab_size are none */
    t->bos = id_within(v->bos, n);
    t->eos = id_within(v->eos, n);
    t->eot = id_within(v->eot, n);
    t->eom = id_within(v->eom, n);
    snprintf(t->pre, sizeof t->pre, "%s", v->pre);
    t->add_bos = t->bos >= 0 && (v->add_bos >= 0 ? v->add_bos : add_bos_default);
    t->add_eos = t->eos >= 0 && v->add_eos > 0;
    t->n_eog = 0;
    add_ends(t);

    for (int k = 0; k < sp->n; k++) {
        int err;
        PCRE2_SIZE at_err;
        t->re[k] = pcre2_compile((PCRE2_SPTR)sp->re[k], PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &at_err, NULL);
        if (!t->re[k]) return nv_fail(NV_EUNSUPPORTED, "%s: this PCRE2 cannot compile the pre-tokenizer (error %d)", path, err);
        t->n_re = k + 1;
        pcre2_jit_compile(t->re[k], PCRE2_JIT_COMPLETE); /* else the interpreter: slower, still linear (see bpe_split) */
    }
    return NV_OK;
}

/* Whether the n bytes at s contain word, ASCII case aside. */
static int has_word(const char *s, size_t n, const char *word) {
    const size_t w = strlen(word);
    for (size_t i = 0; i + w <= n; i++)
        if (!strncasecmp(s + i, word, w)) return 1;
    return 0;
}

/* The byte tokens by their pieces (<0xXX>, type byte) when they are not llama2.c's ids b + 3 (Gemma's
 * vocabulary has them past its specials). */
static void spm_byte_ids(nv_tokenizer *t) {
    int at_llama2c = 1, found = 0;
    for (int b = 0; b < 256; b++) t->byte_tok[b] = -1;
    for (int i = 0; i < t->n; i++) {
        const int b = t->type[i] == 6 ? nv_byte_piece(tok_piece(t, i), (size_t)t->len[i]) : -1;
        if (b >= 0 && t->byte_tok[b] < 0) t->byte_tok[b] = i, found++;
    }
    for (int b = 0; b < 256; b++) at_llama2c &= t->byte_tok[b] == b + 3 || (t->byte_tok[b] < 0 && b + 3 >= t->n);
    t->spm_bytes = found && !at_llama2c; /* no byte type marked (a file without token types): llama2.c's ids, as before */
}

/* A SentencePiece vocabulary's types, ids, add_bos and dummy prefix (v's: a GGUF file's or a
 * tokenizer.json's) on t, built from its pieces in llama2.c's form. */
static nv_err spm_meta_apply(const char *path, nv_tokenizer *t, const nv_gguf_bpe *v) {
    if (!(t->type = malloc((size_t)t->n))) return nv_fail(NV_ENOMEM, "%s: out of memory for the token types", path);
    for (int i = 0; i < t->n; i++) /* ids past a cut to the model's vocabulary are gone */
        t->type[i] = i < v->n_tokens && v->tok_type[i] >= 0 && v->tok_type[i] <= 6 ? (uint8_t)v->tok_type[i] : 1;
    if (v->bos >= 0 && v->bos < t->n) t->bos = v->bos;
    if (v->unk >= 0 && v->unk < t->n) t->unk = v->unk;
    if (t->bos != NV_TOKEN_BOS) t->n_eog = 0; /* not llama2.c's ids: its BOS 1 does not end generation */
    spm_byte_ids(t);
    if (v->eos >= 0 && v->eos < t->n) t->eos = v->eos;
    t->eot = id_within(v->eot, t->n);
    t->eom = id_within(v->eom, t->n);
    if (v->add_bos >= 0) t->add_bos = v->add_bos;
    t->add_eos = t->eos >= 0 && v->add_eos > 0;
    t->no_space_prefix = v->add_space == 0;
    add_ends(t);
    return index_specials(path, t);
}

/* What a GGUF SentencePiece vocabulary says beyond llama2.c's form: its token types (control and
 * user-defined tokens then parsed in text, as llama.cpp parses them), its ids, end-of-turn tokens,
 * add_bos and dummy prefix (spm_meta_apply); a Phi-3's special tokens take the white space after
 * them but <unk>, <s> and <|endoftext|> (llama.cpp's rule, by a general.name holding "phi-3" or
 * "phi3", here also by the phi3 architecture: its tokenizer strips there). */
static nv_err tok_spm_meta(const char *path, nv_tokenizer *t) {
    nv_gguf g;
    NV_TRY(nv_gguf_open(path, &g));
    nv_gguf_bpe v;
    nv_err e = nv_gguf_spm_meta(&g, &v);
    size_t an = 0, nn = 0;
    const char *arch = nv_gguf_string(&g, "general.architecture", &an), *name = nv_gguf_string(&g, "general.name", &nn);
    t->rstrip = (arch && an == 4 && !memcmp(arch, "phi3", 4)) || (name && (has_word(name, nn, "phi-3") || has_word(name, nn, "phi3")));
    nv_gguf_close(&g);
    NV_TRY(e);
    e = spm_meta_apply(path, t, &v);
    nv_gguf_bpe_free(&v);
    return e;
}

static nv_err tok_load_gguf(const char *path, int vocab_size, nv_tokenizer *t) {
    nv_gguf g;
    NV_TRY(nv_gguf_open(path, &g));
    char model[32];
    nv_err e;
    if (nv_gguf_vocab_model(&g, model, sizeof model) && !strcmp(model, "gpt2")) {
        nv_gguf_bpe v;
        e = nv_gguf_bpe_vocab(&g, &v);
        if (e == NV_OK) e = tok_build_bpe(path, &v, vocab_size, t);
        nv_gguf_bpe_free(&v);
        nv_gguf_close(&g);
        return e;
    }
    nv_gguf_close(&g);
    uint8_t *bytes = NULL; /* a SentencePiece vocabulary, as tokenizer.bin bytes */
    size_t len = 0;
    e = nv_gguf_tokenizer_bytes(path, &bytes, &len);
    if (e == NV_OK) e = tok_build(path, &(nv_mapped){bytes, len}, vocab_size, t);
    free(bytes);
    return e == NV_OK ? tok_spm_meta(path, t) : e;
}

nv_err nv_tokenizer_load(const char *path, int vocab_size, nv_tokenizer **out) {
    *out = NULL;
    if (vocab_size < 0) return nv_fail(NV_EINVAL, "%s: negative vocab_size %d", path, vocab_size);
    nv_mapped m;
    NV_TRY(nv_file_map(path, &m));
    nv_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        nv_file_unmap(&m);
        return nv_fail(NV_ENOMEM, "out of memory");
    }
    nv_err e;
    if (nv_gguf_is(m.data, m.len)) {
        nv_file_unmap(&m);
        e = tok_load_gguf(path, vocab_size, t);
    } else if (nv_hf_is_json(m.data, m.len)) { /* a Hugging Face tokenizer.json */
        nv_file_unmap(&m);
        nv_hf_vocab v;
        e = nv_hf_vocab_read(path, &v);
        if (e == NV_OK)
            e = v.byte_level ? tok_build_bpe(path, &v.bpe, vocab_size, t) : tok_build(path, &(nv_mapped){v.spm, v.spm_len}, vocab_size, t);
        if (e == NV_OK && v.typed) e = spm_meta_apply(path, t, &v.bpe); /* Gemma's layout */
        if (e == NV_OK) t->add_eos = t->eos >= 0 && v.bpe.add_eos > 0; /* (llama2.c's layout too) */
        t->nfc = v.nfc;
        t->rstrip = v.rstrip && !v.byte_level; /* (SentencePiece's rule: the byte-level encoder has none) */
        nv_hf_vocab_free(&v);
    } else {
        e = tok_build(path, &m, vocab_size, t);
        nv_file_unmap(&m);
    }
    if (e != NV_OK) {
        nv_tokenizer_free(t);
        return e;
    }
    *out = t;
    return NV_OK;
}

int nv_tokenizer_vocab_size(const nv_tokenizer *t) { return t->n; }
int nv_tokenizer_bos(const nv_tokenizer *t) { return t->bos; }
int nv_tokenizer_unk(const nv_tokenizer *t) { return t->unk; }
int nv_tokenizer_eos(const nv_tokenizer *t) { return t->eos; }
int nv_tokenizer_adds_bos(const nv_tokenizer *t) { return t->add_bos; }
int nv_tokenizer_adds_eos(const nv_tokenizer *t) { return t->add_eos; }
int nv_tokenizer_byte_level(const nv_tokenizer *t) { return t->byte_level; }

int nv_tokenizer_bpe_view(const nv_tokenizer *t, nv_bpe_view *v) {
    if (!t->byte_level) return 0;
    *v = (nv_bpe_view){t->pre, t->type, t->merge_pair, t->n_merges, t->bos, t->eos, t->eot, t->eom, t->add_bos, t->nfc};
    return 1;
}

int nv_tokenizer_is_eog(const nv_tokenizer *t, int id) {
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return 1;
    return 0;
}

const char *nv_tokenizer_piece(const nv_tokenizer *t, int id) {
    return id >= 0 && id < t->n ? tok_piece(t, id) : NULL;
}

const char *nv_tokenizer_special_text(const nv_tokenizer *t, int id) {
    const char *p = nv_tokenizer_piece(t, id);
    if (!t->byte_level && p && p[0] == '\n') /* llama2.c's spelling of BOS and EOS, that no text matches */
        return !strcmp(p, "\n<s>\n") ? "<s>" : !strcmp(p, "\n</s>\n") ? "</s>" : p;
    return p;
}

const char *nv_tokenizer_answer_piece(const nv_tokenizer *t, int prev_token, int token, int special) {
    const char *p = token == t->bos || nv_tokenizer_is_eog(t, token) ? "" : nv_tokenizer_decode(t, prev_token, token);
    if (!p) return "";
    const char *own = special && !*p ? nv_tokenizer_special_text(t, token) : NULL;
    return own ? own : p;
}

int nv_tokenizer_show(nv_tokenizer *t, const char *text) {
    const int id = nv_tokenizer_lookup(t, text);
    if (id < 0 || !t->type || t->type[id] != 3 || nv_tokenizer_is_eog(t, id) || id == t->bos) return -1;
    for (int i = 0; i < t->n_shown; i++)
        if (t->shown[i] == id) return id;
    if (t->n_shown == (int)(sizeof t->shown / sizeof t->shown[0])) return -1;
    t->shown[t->n_shown++] = id;
    return id;
}

float nv_tokenizer_score(const nv_tokenizer *t, int id) {
    return id >= 0 && id < t->n ? t->score[id] : 0.0f;
}

int nv_tokenizer_type(const nv_tokenizer *t, int id) { return t->type && id >= 0 && id < t->n ? t->type[id] : 0; }

int nv_tokenizer_strips_after_special(const nv_tokenizer *t) { return t->rstrip; }

int nv_tokenizer_space_prefix(const nv_tokenizer *t) { return !t->byte_level && !t->no_space_prefix; }

int nv_tokenizer_llama2c_form(const nv_tokenizer *t) {
    if (t->byte_level) return 0;
    if (!t->type) return 1;
    if (t->rstrip || t->no_space_prefix || t->spm_bytes || t->unk != NV_TOKEN_UNK || t->bos != NV_TOKEN_BOS || t->eos != NV_TOKEN_EOS ||
        !t->add_bos)
        return 0;
    for (int i = NV_TOKEN_EOS + 1; i < t->n; i++)
        if (t->type[i] != 1 && t->type[i] != 6) return 0; /* a special token llama2.c's file cannot mark */
    return 1;
}

/* run.c's byte fallback is id b+3; a vocabulary too small for that gets <unk> instead of an
 * id past its end. */
static int tok_byte_id(const nv_tokenizer *t, unsigned char b) {
    if (t->spm_bytes) return t->byte_tok[b] >= 0 ? t->byte_tok[b] : t->unk;
    return (int)b + 3 < t->n ? (int)b + 3 : t->unk;
}

/* A merge candidate: the pair starting at node `left` merges into piece `id`. key orders
 * candidates the way run.c picks them: higher score first, then the leftmost pair (merges only
 * remove right-hand nodes, so node indices stay in text order). The candidate is stale once
 * the pair at `left` has changed, which bumps gen[left]. */
typedef struct {
    uint64_t key; /* ordered score bits << 32 | ~left */
    uint32_t gen;
    int32_t id;
} tok_cand;

/* Maps a non-NaN float to an unsigned key with the same order; -0 and +0 are equal, as they
 * are to run.c's '>'. */
static inline uint32_t tok_score_key(float f) {
    if (f == 0.0f) f = 0.0f;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

static inline int tok_cand_left(const tok_cand *c) { return (int)~(uint32_t)c->key; }

/* A 4-ary max-heap on key: shallower than a binary heap, so fewer cache misses. */
typedef struct {
    tok_cand *a;
    size_t n, cap;
} tok_heap;

static void tok_heap_down(tok_heap *h, size_t i) {
    tok_cand x = h->a[i];
    for (;;) {
        size_t c = 4 * i + 1, best = c;
        if (c >= h->n) break;
        size_t end = c + 4 < h->n ? c + 4 : h->n;
        for (size_t j = c + 1; j < end; j++)
            if (h->a[j].key > h->a[best].key) best = j;
        if (h->a[best].key <= x.key) break;
        h->a[i] = h->a[best];
        i = best;
    }
    h->a[i] = x;
}

static int tok_heap_push(tok_heap *h, tok_cand c) {
    if (h->n == h->cap) {
        size_t nc = h->cap ? 2 * h->cap : 64;
        tok_cand *na = realloc(h->a, nc * sizeof *na);
        if (!na) return -1;
        h->a = na;
        h->cap = nc;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 4;
        if (h->a[p].key >= c.key) break;
        h->a[i] = h->a[p];
        i = p;
    }
    h->a[i] = c;
    return 0;
}

static tok_cand tok_heap_pop(tok_heap *h) {
    tok_cand top = h->a[0];
    h->a[0] = h->a[--h->n];
    if (h->n) tok_heap_down(h, 0);
    return top;
}

/* One token of the sequence being merged. The fields sit together because the merge loop
 * visits nodes in score order, i.e. at random places in the text: one cache miss, not four. */
typedef struct {
    int tok, next, prev;
    uint32_t gen; /* bumped whenever the pair starting here changes */
} tok_node;

/* The candidate for the pair (l, r) if its concatenation is a piece run.c would merge. */
static int tok_pair(const nv_tokenizer *t, const tok_node *nd, int l, int r, tok_cand *c) {
    int a = nd[l].tok, b = nd[r].tok, id;
    uint32_t order;
    if (t->byte_level) { /* the merge listed first wins */
        uint32_t rank;
        if ((id = merge_find(t, a, b, &rank)) < 0) return 0;
        order = ~rank;
    } else {
        id = tok_lookup2(t, tok_piece(t, a), t->len[a], tok_piece(t, b), t->len[b]);
        if (id < 0 || !(t->score[id] > TOK_MERGE_FLOOR)) return 0;
        order = tok_score_key(t->score[id]);
    }
    c->key = (uint64_t)order << 32 | (uint32_t)~(uint32_t)l;
    c->gen = nd[l].gen;
    c->id = id;
    return 1;
}

static int tok_offer(const nv_tokenizer *t, tok_heap *h, const tok_node *nd, int l, int r) {
    tok_cand c;
    if (l < 0 || r < 0 || !tok_pair(t, nd, l, r, &c)) return 0;
    return tok_heap_push(h, c);
}

/* Run.c's greedy loop over the nodes [s, e), which no merge can leave. */
static int tok_merge_span(const nv_tokenizer *t, tok_node *nd, tok_heap *h, int s, int e) {
    h->n = 0;
    for (int i = s; i + 1 < e; i++)
        if (tok_pair(t, nd, i, i + 1, &h->a[h->n])) h->n++;
    for (size_t i = h->n / 4 + 1; i-- > 0;)
        if (i < h->n) tok_heap_down(h, i);
    while (h->n) {
        tok_cand c = tok_heap_pop(h);
        int l = tok_cand_left(&c);
        if (nd[l].gen != c.gen) continue; /* stale */
        int r = nd[l].next, p = nd[l].prev, rn = nd[r].next;
        nd[l].tok = c.id;
        nd[l].next = rn;
        if (rn >= 0) nd[rn].prev = l;
        /* The pairs starting at l and at p changed; r is gone. */
        nd[l].gen++;
        nd[r].gen++;
        if (p >= 0) nd[p].gen++;
        if (tok_offer(t, h, nd, p, l) != 0 || tok_offer(t, h, nd, l, rn) != 0) return -1;
    }
    return 0;
}

/* Whether no merge can ever join the token holding initial token a (at its end) with the one
 * holding initial token b (at its start). A merged token's piece is the concatenation of the
 * initial pieces it covers, so such a merge would make a piece containing a's last byte
 * followed by b's first byte; if no piece has that byte pair, the two sides are independent. */
static int tok_cut(const nv_tokenizer *t, int a, int b) {
    if (t->len[a] == 0 || t->len[b] == 0) return 0;
    unsigned bg = (unsigned)(unsigned char)tok_piece(t, a)[t->len[a] - 1] << 8 | (unsigned char)tok_piece(t, b)[0];
    return !(t->bigram[bg >> 3] >> (bg & 7) & 1);
}

/* Greedy merging over tok[0..n) in place; returns the new count or -1 on allocation failure.
 * brk (optional): brk[i] != 0 keeps tok[i-1] and tok[i] apart (the pre-tokenizer's pieces).
 * The sequence is split where tok_cut() proves no merge can cross, and each span is merged on
 * its own: run.c's global order restricted to a span is that span's own greedy order (the
 * best pair overall is the best, and leftmost among equals, within its span), so the result
 * is identical, while the heap and nodes stay small and in cache. */
static int tok_merge(const nv_tokenizer *t, int *tok, int n, const uint8_t *brk) {
    if (n < 2) return n;
    tok_node *nd = malloc((size_t)n * sizeof *nd);
    tok_heap h = {malloc((size_t)n * sizeof(tok_cand)), 0, (size_t)n};
    int m = -1;
    if (!nd || !h.a) goto done;
    m = 0;
    for (int s = 0, e; s < n; s = e) {
        for (e = s + 1; e < n && !(brk && brk[e]) && !tok_cut(t, tok[e - 1], tok[e]); e++) {
        }
        for (int i = s; i < e; i++) nd[i] = (tok_node){tok[i], i + 1 < e ? i + 1 : -1, i > s ? i - 1 : -1, 0};
        if (tok_merge_span(t, nd, &h, s, e) != 0) {
            m = -1;
            goto done;
        }
        /* Node s is never removed (only right-hand nodes are), so the span starts there.
         * Writing at m <= s leaves tok[e..] untouched for the next spans. */
        for (int i = s; i >= 0; i = nd[i].next) tok[m++] = nd[i].tok;
    }
done:
    free(nd);
    free(h.a);
    return m;
}

/* The tokens of a text being encoded, with the pieces' starts marked. */
typedef struct {
    const nv_tokenizer *t;
    int *tok;
    uint8_t *brk;
    int n;
    char *scratch; /* 2 bytes per text byte: a piece spelled in stand-ins */
} bpe_out;

/* Appends the initial tokens of one pre-tokenized piece (its bytes), marking where it starts. */
static void bpe_piece(bpe_out *o, const unsigned char *p, size_t k) {
    const nv_tokenizer *t = o->t;
    if (k == 0) return;
    if (t->ignore_merges && k <= (size_t)t->max_len) { /* a piece that is a token is taken whole */
        int w = 0;
        for (size_t j = 0; j < k; j++) {
            memcpy(o->scratch + w, t->stand[p[j]], t->stand_len[p[j]]);
            w += t->stand_len[p[j]];
        }
        int id = tok_lookup2(t, o->scratch, w, "", 0);
        if (id >= 0) {
            o->brk[o->n] = 1;
            o->tok[o->n++] = id;
            return;
        }
    }
    for (size_t j = 0; j < k; j++) {
        o->brk[o->n] = j == 0;
        o->tok[o->n++] = t->byte_tok[p[j]];
    }
}

/* Bytes of the valid UTF-8 character at s[0..n), or 0 (RFC 3629: no overlongs, surrogates or code
 * points past U+10FFFF: what PCRE2 accepts). */
static size_t utf8_char_len(const unsigned char *s, size_t n) {
    const unsigned char b = s[0];
    size_t k;
    unsigned lo = 0x80, hi = 0xBF; /* the range of the second byte */
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) k = 2;
    else if (b >= 0xE0 && b <= 0xEF) k = 3, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
    else if (b >= 0xF0 && b <= 0xF4) k = 4, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
    else return 0;
    if (k > n) return 0;
    for (size_t j = 1; j < k; j++)
        if (s[j] < (j == 1 ? lo : 0x80) || s[j] > (j == 1 ? hi : 0xBF)) return 0;
    return k;
}

/* Length of the longest valid UTF-8 prefix of s[0..n). */
static size_t utf8_valid_prefix(const unsigned char *s, size_t n) {
    size_t i = 0, k;
    while (i < n && (k = utf8_char_len(s + i, n - i)) > 0) i += k;
    return i;
}

/* Splits u[0..n) (valid UTF-8, not empty) by the pre-tokenizer's split k, and each part by the
 * splits after it (each part their whole subject, so a lookahead or `$` ends at the part's end, as
 * tokenizer.json's Sequence runs them), down to the pieces. */
static nv_err bpe_split_by(bpe_out *o, pcre2_match_data **md, int k, const unsigned char *u, size_t n) {
    if (k == o->t->n_re) {
        bpe_piece(o, u, n);
        return NV_OK;
    }
    for (size_t off = 0; off < n;) {
        int rc = pcre2_match(o->t->re[k], u, n, off, PCRE2_NO_UTF_CHECK, md[k], NULL);
        size_t ms = n, me = n;
        if (rc >= 0) {
            const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md[k]);
            ms = ov[0];
            /* no alternative matches nothing; if one did, step on by a whole character */
            me = ov[1] > ms ? ov[1] : ms < n ? ms + utf8_char_len(u + ms, n - ms) : ms + 1;
        } else if (rc != PCRE2_ERROR_NOMATCH) {
            return nv_fail(NV_EINVAL, "tokenizer: the pre-tokenizer failed (PCRE2 error %d)", rc);
        }
        if (ms > off) NV_TRY(bpe_split_by(o, md, k + 1, u + off, ms - off));
        if (ms < n) NV_TRY(bpe_split_by(o, md, k + 1, u + ms, me - ms));
        off = me;
    }
    return NV_OK;
}

/* Splits s[0..len) with the pre-tokenizer. Runs of valid UTF-8 are matched without PCRE2's own
 * check (which rescans the rest of the subject on every call: quadratic without the JIT); the
 * bytes between them (invalid UTF-8) are pieces of their own, so nothing is dropped. */
static nv_err bpe_split(bpe_out *o, pcre2_match_data **md, const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t run = 0; run < len;) {
        const size_t n = utf8_valid_prefix(u + run, len - run);
        if (n) NV_TRY(bpe_split_by(o, md, 0, u + run, n));
        size_t bad = run + n;
        while (bad < len && utf8_char_len(u + bad, len - bad) == 0) bad++;
        bpe_piece(o, u + run + n, bad - run - n); /* the invalid bytes: one piece (none at the end) */
        run = bad;
    }
    return NV_OK;
}

/* The special token starting at s (longest first), or -1. */
static int bpe_special_at(const nv_tokenizer *t, const char *s, size_t left) {
    const unsigned char b = (unsigned char)s[0];
    for (int j = t->special_at[b]; j < t->special_at[b + 1]; j++) {
        int id = t->special[j];
        if ((size_t)t->len[id] <= left && memcmp(tok_piece(t, id), s, (size_t)t->len[id]) == 0) return id;
    }
    return -1;
}

/* llama.cpp's BPE tokenizer with special tokens parsed: the text is cut at every control or
 * user-defined token's text, each part is split by the pre-tokenizer, and each piece's bytes
 * are merged by rank, never across pieces. */
static nv_err tok_encode_bpe(const nv_tokenizer *t, const char *text, size_t tl, int bos, int eos, int *tok, int *n_out) {
    bpe_out o = {t, tok, malloc(tl + 3), 0, malloc(2 * tl + 1)};
    pcre2_match_data *md[NV_BPE_MAX_SPLITS] = {0};
    int md_ok = 1;
    for (int k = 0; k < t->n_re; k++) md_ok &= (md[k] = pcre2_match_data_create_from_pattern(t->re[k], NULL)) != NULL;
    nv_err e = NV_OK;
    if (!o.brk || !o.scratch || !md_ok) e = nv_fail(NV_ENOMEM, "out of memory encoding %zu bytes", tl);
    if (e == NV_OK && bos && t->add_bos) {
        o.brk[o.n] = 1;
        tok[o.n++] = t->bos;
    }
    for (size_t i = 0, part = 0; e == NV_OK && i <= tl;) {
        int sp = i < tl ? bpe_special_at(t, text + i, tl - i) : -1;
        if (sp < 0 && i < tl) {
            i++;
            continue;
        }
        if ((e = bpe_split(&o, md, text + part, i - part)) != NV_OK || i == tl) break;
        o.brk[o.n] = 1;
        tok[o.n++] = sp;
        i += (size_t)t->len[sp];
        part = i;
    }
    if (e == NV_OK) {
        int m = tok_merge(t, tok, o.n, o.brk);
        if (m < 0) e = nv_fail(NV_ENOMEM, "out of memory encoding %zu bytes", tl);
        else {
            if (m == 0 && bos && t->bos >= 0) tok[m++] = t->bos; /* a model needs something to condition on */
            if (eos && t->eos >= 0) tok[m++] = t->eos;
            *n_out = m;
        }
    }
    for (int k = 0; k < t->n_re; k++) pcre2_match_data_free(md[k]);
    free(o.brk);
    free(o.scratch);
    return e;
}

nv_err nv_ids_push(nv_ids *l, const int *ids, int n) {
    if (n <= 0) return NV_OK;
    if (l->n + n > l->cap) {
        const int cap = (l->n + n) * 2 + 16;
        int *p = realloc(l->v, (size_t)cap * sizeof *p);
        if (!p) return nv_fail(NV_ENOMEM, "out of memory for token ids");
        l->v = p, l->cap = cap;
    }
    memcpy(l->v + l->n, ids, (size_t)n * sizeof *ids);
    l->n += n;
    return NV_OK;
}

nv_err nv_tokenizer_encode_into(const nv_tokenizer *t, const char *text, int bos, int eos, nv_ids *l) {
    int *ids = NULL, n = 0;
    NV_TRY(nv_tokenizer_encode(t, text, bos, eos, &ids, &n));
    const nv_err e = nv_ids_push(l, ids, n);
    free(ids);
    return e;
}

/* text composed to Unicode NFC in *out (malloc'd), or *out NULL where it stays as it is: ASCII,
 * or not UTF-8 (which no normalizer reads). */
static nv_err nfc_text(const char *text, char **out) {
    *out = NULL;
    const unsigned char *s = (const unsigned char *)text;
    while (*s && *s < 0x80) s++;
    if (!*s) return NV_OK;
    size_t n = 0, tl = strlen(text);
    uint8_t *c = u8_normalize(UNINORM_NFC, (const uint8_t *)text, tl, NULL, &n);
    if (!c) return errno == ENOMEM ? nv_fail(NV_ENOMEM, "out of memory composing %zu bytes", tl) : NV_OK;
    char *z = realloc(c, n + 1);
    if (!z) {
        free(c);
        return nv_fail(NV_ENOMEM, "out of memory composing %zu bytes", tl);
    }
    z[n] = 0;
    *out = z;
    return NV_OK;
}

static nv_err encode_text(const nv_tokenizer *t, const char *text, int bos, int eos, int **tokens, int *n_tokens);

nv_err nv_tokenizer_encode(const nv_tokenizer *t, const char *text, int bos, int eos, int **tokens,
                           int *n_tokens) {
    *tokens = NULL;
    *n_tokens = 0;
    if (!text) return nv_fail(NV_EINVAL, "cannot encode NULL text");
    if (!t->nfc) return encode_text(t, text, bos, eos, tokens, n_tokens);
    char *composed; /* as the tokenizer.json's normalizer asks, before anything else */
    NV_TRY(nfc_text(text, &composed));
    const nv_err e = encode_text(t, composed ? composed : text, bos, eos, tokens, n_tokens);
    free(composed);
    return e;
}

/* Appends at tok + n the tokens of a piece of text between special tokens, before the merges:
 * with space, SentencePiece's dummy prefix; then run.c's UTF-8 walk, byte for byte: a chunk is a
 * non-continuation byte plus the continuation bytes after it, cut at 4 bytes; stray continuation
 * bytes form chunks of their own, also at most 4. A chunk not in the vocabulary falls back to its
 * bytes. Returns the new count. */
static int spm_chunks(const nv_tokenizer *t, const char *text, size_t len, int space, int *tok, int n) {
    if (space) {
        int id = nv_tokenizer_lookup(t, " ");
        tok[n++] = id >= 0 ? id : tok_byte_id(t, ' ');
    }
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        size_t k = 1;
        while (k < 4 && i + k < len && (s[i + k] & 0xC0) == 0x80) k++;
        int id = k <= (size_t)t->max_len ? tok_lookup2(t, text + i, (int)k, "", 0) : -1;
        if (id >= 0) {
            tok[n++] = id;
        } else {
            for (size_t j = 0; j < k; j++) tok[n++] = tok_byte_id(t, s[i + j]);
        }
        i += k;
    }
    return n;
}

/* Whether Phi-3's rule would take the white space after special token id (all but <unk>, <s>,
 * <|endoftext|>, as llama.cpp's). */
static int strip_rule_takes(const nv_tokenizer *t, int id) {
    const char *p = nv_tokenizer_special_text(t, id); /* (llama2.c's "\n<s>\n" as <s>) */
    return strcmp(p, "<unk>") && strcmp(p, "<s>") && strcmp(p, "<|endoftext|>");
}

int nv_tokenizer_strips_after(const nv_tokenizer *t, int id) { return t->rstrip && strip_rule_takes(t, id); }

int nv_tokenizer_strip_rule_matters(const nv_tokenizer *t) {
    for (int j = 0; t->special && !t->byte_level && j < t->special_at[256]; j++)
        if (strip_rule_takes(t, t->special[j])) return 1;
    return 0;
}

static nv_err encode_text(const nv_tokenizer *t, const char *text, int bos, int eos, int **tokens, int *n_tokens) {
    size_t tl = strlen(text);
    if (tl > (size_t)INT_MAX / 2 - 4) return nv_fail(NV_ERANGE, "text of %zu bytes is too long to encode", tl);
    /* Each byte yields at most one token; plus BOS, a dummy prefix per piece between special tokens
       (each at least a byte) and EOS. */
    int *tok = malloc((2 * tl + 4) * sizeof *tok);
    if (!tok) return nv_fail(NV_ENOMEM, "out of memory encoding %zu bytes", tl);
    int n = 0;
    if (t->byte_level) {
        nv_err e = tok_encode_bpe(t, text, tl, bos, eos, tok, &n);
        if (e != NV_OK) {
            free(tok);
            return e;
        }
        *tokens = tok;
        *n_tokens = n;
        return NV_OK;
    }
    if (bos && t->add_bos) tok[n++] = t->bos;
    /* A GGUF vocabulary's special tokens cut the text (llama.cpp's SentencePiece tokenizer): each
       piece between them is encoded on its own, with SentencePiece's dummy-prefix space when it
       opens the text or follows a special token; merges never cross a cut (brk). Without special
       tokens the text is one piece. */
    const int specials = t->special && t->special_at[256] > 0;
    uint8_t *brk = specials ? calloc(2 * tl + 4, 1) : NULL;
    if (specials && !brk) {
        free(tok);
        return nv_fail(NV_ENOMEM, "out of memory encoding %zu bytes", tl);
    }
    int after_special = 1;
    for (size_t i = 0, part = 0; i <= tl;) {
        const int sp = specials && i < tl ? bpe_special_at(t, text + i, tl - i) : -1;
        if (sp < 0 && i < tl) {
            i++;
            continue;
        }
        if (i > part) {
            if (brk) brk[n] = 1;
            n = spm_chunks(t, text + part, i - part, after_special && !t->no_space_prefix, tok, n);
            after_special = 0;
        }
        if (i == tl) break;
        brk[n] = 1;
        tok[n++] = sp;
        i += (size_t)t->len[sp];
        if (nv_tokenizer_strips_after(t, sp))
            while (i < tl && isspace((unsigned char)text[i])) i++;
        part = i;
        after_special = 1;
    }
    int m = tok_merge(t, tok, n, brk);
    free(brk);
    if (m < 0) {
        free(tok);
        return nv_fail(NV_ENOMEM, "out of memory encoding %zu bytes", tl);
    }
    n = m;
    if (n == 0 && bos && t->bos >= 0) tok[n++] = t->bos; /* a model needs something to condition on (as byte-level ones) */
    if (eos) tok[n++] = t->eos;
    *tokens = tok;
    *n_tokens = n;
    return NV_OK;
}

const char *nv_tokenizer_decode(const nv_tokenizer *t, int prev_token, int token) {
    if (token < 0 || token >= t->n) return NULL;
    for (int i = 0; i < t->n_shown; i++)
        if (token == t->shown[i]) return tok_piece(t, token);
    if (t->byte_level) return t->text + t->text_off[token];
    /* a GGUF vocabulary's control tokens past llama2.c's three print nothing, as the byte-level ones */
    /* (llama2.c's own three keep their pieces, as run.c prints them) */
    if (t->type && t->type[token] == 3 && !(t->bos == NV_TOKEN_BOS && token <= NV_TOKEN_EOS)) return "";
    const char *p = tok_piece(t, token);
    /* SentencePiece's decoder drops the dummy prefix's space after BOS (llama2.c PR #89). */
    if (prev_token == t->bos && p[0] == ' ' && !t->no_space_prefix) p++;
    /* Same test as run.c (sscanf, so the same lenient matches), gated to stay cheap. */
    if (p[0] == '<' && p[1] == '0' && p[2] == 'x') {
        unsigned char b;
        if (sscanf(p, "<0x%02hhX>", &b) == 1) p = t->byte_pieces + 2 * (int)b;
    }
    return p;
}

void nv_tokenizer_mark_containing(const nv_tokenizer *t, const char *const *strs, int n, unsigned char *mask) {
    for (int id = 0; id < t->n; id++) {
        const char *text = nv_tokenizer_decode(t, -1, id);
        for (int k = 0; text && k < n && !mask[id]; k++) mask[id] = strs[k][0] && strstr(text, strs[k]) != NULL;
    }
}

int nv_piece_printable(const char *piece) {
    if (!piece || piece[0] == '\0') return 0;
    if (piece[1] == '\0') {
        unsigned char b = (unsigned char)piece[0];
        if (!(isprint(b) || isspace(b))) return 0;
    }
    return 1;
}

int nv_tokenizer_piece_shown(const nv_tokenizer *t, const char *piece) {
    return piece && (nv_tokenizer_byte_level(t) || nv_piece_printable(piece));
}

int nv_tokenizer_ends_text(const nv_tokenizer *t, int id) {
    return id == nv_tokenizer_bos(t) || (nv_tokenizer_byte_level(t) && nv_tokenizer_is_eog(t, id));
}

nv_err nv_tokenizer_load_for_model(const char *path, int vocab_size, nv_tokenizer **out) {
    NV_TRY(nv_tokenizer_load(path, 0, out));
    if (nv_tokenizer_vocab_size(*out) == vocab_size) return NV_OK;
    nv_err e = nv_fail(NV_EFORMAT, "%s has %d tokens but the model's vocabulary is %d: pass the model's tokenizer with -z",
                       path, nv_tokenizer_vocab_size(*out), vocab_size);
    nv_tokenizer_free(*out);
    *out = NULL;
    return e;
}
