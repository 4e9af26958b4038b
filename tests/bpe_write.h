/* A small byte-level BPE ("gpt2") vocabulary as a vocab-only GGUF file, for tests and fuzz seeds:
 * the 256 byte tokens (GPT-2's stand-ins, written out independently of the tokenizer's), one token
 * per merge below, four special tokens and one whole word no merge makes. The merges are chosen
 * so that a wrong split, merge order or cross-piece merge gives different ids. */
#ifndef NV_TEST_BPE_WRITE_H
#define NV_TEST_BPE_WRITE_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/buf.h"

/* GPT-2's bytes_to_unicode, written out independently of the tokenizer's. */
static void stand_in(int b, char *out) {
    static int cp[256], ready;
    if (!ready) {
        int n = 0;
        for (int x = 0; x < 256; x++) cp[x] = -1;
        for (int x = 33; x <= 126; x++) cp[x] = x;
        for (int x = 161; x <= 172; x++) cp[x] = x;
        for (int x = 174; x <= 255; x++) cp[x] = x;
        for (int x = 0; x < 256; x++)
            if (cp[x] < 0) cp[x] = 256 + n++;
        ready = 1;
    }
    int c = cp[b];
    if (c < 0x80) {
        out[0] = (char)c;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | c >> 6);
        out[1] = (char)(0x80 | (c & 0x3F));
        out[2] = 0;
    }
}

/* Text in stand-ins: "Ġthe" for " the". */
static void spell(const char *text, char *out) {
    out[0] = 0;
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) stand_in(*p, out + strlen(out));
}

static const char *merges_text[][2] = {
    {" ", "t"}, {"h", "e"}, {" t", "he"}, {"i", "n"}, {" ", "c"}, {"a", "t"}, {" c", "at"}, {"1", "2"},
    {"\n", "\n"}, {"e", "r"}, {"h", "er"}, {" ", " "}, {"\xc3", "\xa9"}, {"\xa9", "!"}, {"'", "l"}, {"'l", "l"},
    {"a", "C"}, /* across GPT-4o's split where lower case turns upper */
};
#define N_MERGES (int)(sizeof merges_text / sizeof merges_text[0])
/* "<|im_end|>\n" starts with another special's text (the longest must win); "[PAD0]" is unused
 * (type 5: never matched, prints nothing) */
static const char *specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "<|im_end|>\n", "[PAD0]"};
static const int special_type[] = {3, 3, 3, 4, 4, 5};
enum { ID_ENDOFTEXT = 256 + N_MERGES, ID_IM_START, ID_IM_END, ID_THINK, ID_IM_END_NL, ID_PAD, ID_THERE, N_TOKENS };

typedef struct {
    const char *pre;  /* NULL: no tokenizer.ggml.pre */
    int bos, eos;     /* -1: absent */
    int add_bos;      /* -1: absent */
    int drop_byte;    /* >= 0: leave this byte's token out (its slot becomes another piece) */
    int bad_merge;    /* write a merge without a space */
    int fim;          /* 1: three more tokens after the others, Qwen2.5-Coder's fill-in-the-middle markers;
                         2: and its <|repo_name|> and <|file_sep|>; 3: instead Mistral's [THINK] and [/THINK];
                         4: instead Mistral's tool-call markers [TOOL_CALLS], [ARGS] and [CALL_ID];
                         5: instead gpt-oss's harmony markers <|start|>, <|channel|>, <|message|>, <|end|>,
                         <|return|>, <|call|>, <|constrain|> */
    int add_eos;      /* 1: tokenizer.ggml.add_eos_token true (an embedding model's) */
} vocab_opts;

static const char *fim_specials[] = {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>"};
static const char *think_specials[] = {"[THINK]", "[/THINK]"};
static const char *call_specials[] = {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"};
static const char *harmony_specials[] = {"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"};
/* How many control tokens vocab_opts.fim puts after the others. */
static int extra_specials(int fim) { return fim == 5 ? 7 : fim == 4 ? 3 : fim == 3 ? 2 : fim == 2 ? 5 : fim ? 3 : 0; }

static void kv_key(nv_buf *w, const char *k, uint32_t type) {
    uint64_t n = strlen(k);
    nv_buf_append(w, &n, 8);
    nv_buf_append(w, k, n);
    nv_buf_append(w, &type, 4);
}
static void put_str(nv_buf *w, const char *s) {
    uint64_t n = strlen(s);
    nv_buf_append(w, &n, 8);
    nv_buf_append(w, s, n);
}

static void token_text(int id, int fim, char *out) {
    if (id < 256) stand_in(id, out);
    else if (id < 256 + N_MERGES) {
        char a[64], b[64];
        spell(merges_text[id - 256][0], a);
        spell(merges_text[id - 256][1], b);
        snprintf(out, 128, "%s%s", a, b);
    } else if (id < ID_THERE) strcpy(out, specials[id - ID_ENDOFTEXT]);
    else if (id == ID_THERE) spell(" there", out); /* a whole word no merge makes: only ignore_merges finds it */
    else if (fim == 3) strcpy(out, think_specials[id - N_TOKENS]);
    else if (fim == 4) strcpy(out, call_specials[id - N_TOKENS]);
    else if (fim == 5) strcpy(out, harmony_specials[id - N_TOKENS]);
    else strcpy(out, fim_specials[id - N_TOKENS]);
}

static int write_vocab(const char *path, const vocab_opts *o) {
    nv_buf w = {0};
    nv_buf_append(&w, "GGUF", 4);
    uint32_t version = 3;
    uint64_t nt = 0, nkv = 5 + (o->pre != NULL) + (o->bos >= 0) + (o->eos >= 0) + (o->add_bos >= 0) + (o->add_eos == 1);
    nv_buf_append(&w, &version, 4);
    nv_buf_append(&w, &nt, 8);
    nv_buf_append(&w, &nkv, 8);
    kv_key(&w, "general.architecture", 8);
    put_str(&w, "llama");
    kv_key(&w, "tokenizer.ggml.model", 8);
    put_str(&w, "gpt2");
    if (o->pre) {
        kv_key(&w, "tokenizer.ggml.pre", 8);
        put_str(&w, o->pre);
    }
    kv_key(&w, "tokenizer.ggml.tokens", 9);
    uint32_t et = 8;
    const int nt_all = N_TOKENS + extra_specials(o->fim);
    uint64_t n = (uint64_t)nt_all;
    nv_buf_append(&w, &et, 4);
    nv_buf_append(&w, &n, 8);
    for (int i = 0; i < nt_all; i++) {
        char t[128];
        if (i == o->drop_byte) strcpy(t, "[unused]");
        else token_text(i, o->fim, t);
        put_str(&w, t);
    }
    kv_key(&w, "tokenizer.ggml.token_type", 9);
    et = 5;
    nv_buf_append(&w, &et, 4);
    nv_buf_append(&w, &n, 8);
    for (int i = 0; i < nt_all; i++) {
        int32_t ty = i >= ID_ENDOFTEXT && i < ID_THERE ? special_type[i - ID_ENDOFTEXT] : i >= N_TOKENS ? 3 : 1;
        nv_buf_append(&w, &ty, 4);
    }
    kv_key(&w, "tokenizer.ggml.merges", 9);
    et = 8;
    n = N_MERGES;
    nv_buf_append(&w, &et, 4);
    nv_buf_append(&w, &n, 8);
    for (int i = 0; i < N_MERGES; i++) {
        char a[64], b[64], m[160];
        spell(merges_text[i][0], a);
        spell(merges_text[i][1], b);
        snprintf(m, sizeof m, o->bad_merge && i == 3 ? "%s%s" : "%s %s", a, b);
        put_str(&w, m);
    }
    if (o->bos >= 0) {
        kv_key(&w, "tokenizer.ggml.bos_token_id", 4);
        uint32_t v = (uint32_t)o->bos;
        nv_buf_append(&w, &v, 4);
    }
    if (o->eos >= 0) {
        kv_key(&w, "tokenizer.ggml.eos_token_id", 4);
        uint32_t v = (uint32_t)o->eos;
        nv_buf_append(&w, &v, 4);
    }
    if (o->add_bos >= 0) {
        kv_key(&w, "tokenizer.ggml.add_bos_token", 7);
        uint8_t v = (uint8_t)o->add_bos;
        nv_buf_append(&w, &v, 1);
    }
    if (o->add_eos == 1) {
        kv_key(&w, "tokenizer.ggml.add_eos_token", 7);
        const uint8_t v = 1;
        nv_buf_append(&w, &v, 1);
    }
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(w.data, 1, w.len, f) == w.len;
    if (f && fclose(f) != 0) ok = 0;
    nv_buf_free(&w);
    return ok ? 0 : -1;
}

#endif
