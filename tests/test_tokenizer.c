/* Tokenizer: llama.cpp's SPM vocabulary tests, agreement with a literal transcription of
 * llama2.c run.c encode(), round trips, hand-built vocabularies for the tie and threshold
 * rules, malformed files, and a long text. */
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "gguf_write.h"
#include "t.h"
#include "tok_util.h"

/* ---- helpers ---------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static nv_tokenizer *load_or_fail(const char *path, int vocab) {
    nv_tokenizer *t = NULL;
    nv_err e = nv_tokenizer_load(path, vocab, &t);
    T_CHECK(e == NV_OK, "load %s: %s", path, nv_errmsg());
    return e == NV_OK ? t : NULL;
}

/* ---- run.c encode(), transcribed: qsort + bsearch lookups, sprintf per pair, O(n^2) ------- */

typedef struct {
    const char *str;
    int id;
} ref_index;

static int ref_cmp(const void *a, const void *b) {
    return strcmp(((const ref_index *)a)->str, ((const ref_index *)b)->str);
}

typedef struct {
    const nv_tokenizer *t;
    ref_index *sorted;
    int n;
    size_t maxlen;
} ref_tok;

static void ref_init(ref_tok *r, const nv_tokenizer *t) {
    r->t = t;
    r->n = nv_tokenizer_vocab_size(t);
    r->sorted = malloc((size_t)r->n * sizeof *r->sorted);
    r->maxlen = 0;
    for (int i = 0; i < r->n; i++) {
        r->sorted[i].str = nv_tokenizer_piece(t, i);
        r->sorted[i].id = i;
        size_t l = strlen(r->sorted[i].str);
        if (l > r->maxlen) r->maxlen = l;
    }
    qsort(r->sorted, (size_t)r->n, sizeof *r->sorted, ref_cmp);
}

static int ref_lookup(const ref_tok *r, const char *s) {
    ref_index key = {s, 0};
    ref_index *res = bsearch(&key, r->sorted, (size_t)r->n, sizeof *r->sorted, ref_cmp);
    return res ? res->id : -1;
}

static int *ref_encode(const ref_tok *r, const char *text, int bos, int eos, int *n_tokens) {
    int *tokens = malloc((strlen(text) + 3) * sizeof *tokens);
    char *str_buffer = malloc(r->maxlen * 2 + 1 + 2);
    size_t str_len = 0;
    *n_tokens = 0;
    if (bos) tokens[(*n_tokens)++] = 1;
    if (text[0] != '\0') tokens[(*n_tokens)++] = ref_lookup(r, " ");
    for (const char *c = text; *c != '\0'; c++) {
        if ((*c & 0xC0) != 0x80) str_len = 0;
        str_buffer[str_len++] = *c;
        str_buffer[str_len] = '\0';
        if ((*(c + 1) & 0xC0) == 0x80 && str_len < 4) continue;
        int id = ref_lookup(r, str_buffer);
        if (id != -1) {
            tokens[(*n_tokens)++] = id;
        } else {
            for (size_t i = 0; i < str_len; i++) tokens[(*n_tokens)++] = (unsigned char)str_buffer[i] + 3;
        }
        str_len = 0;
    }
    for (;;) {
        float best_score = -1e10;
        int best_id = -1, best_idx = -1;
        for (int i = 0; i < (*n_tokens - 1); i++) {
            sprintf(str_buffer, "%s%s", nv_tokenizer_piece(r->t, tokens[i]), nv_tokenizer_piece(r->t, tokens[i + 1]));
            int id = ref_lookup(r, str_buffer);
            if (id != -1 && nv_tokenizer_score(r->t, id) > best_score) {
                best_score = nv_tokenizer_score(r->t, id);
                best_id = id;
                best_idx = i;
            }
        }
        if (best_idx == -1) break;
        tokens[best_idx] = best_id;
        for (int i = best_idx + 1; i < (*n_tokens - 1); i++) tokens[i] = tokens[i + 1];
        (*n_tokens)--;
    }
    if (eos) tokens[(*n_tokens)++] = 2;
    free(str_buffer);
    return tokens;
}

/* ---- random text ------------------------------------------------------------------------ */

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Valid UTF-8 of up to max_bytes: words, runs of spaces, newlines, tabs, Latin, Cyrillic, CJK,
 * emoji (with ZWJ and variation selectors), and any non-surrogate code point. */
static char *random_text(size_t max_bytes) {
    static const char *words[] = {"Hello", "world", "the", "Once", "upon", "a", "time", "there",
                                  "was", "little", "girl", "named", "Lily", ".", ",", "!", "?",
                                  "'s", "don't", "123", "3333", "llama", "<0x41>", "<s>"};
    char *s = malloc(max_bytes + 1);
    size_t n = 0;
    while (n + 16 < max_bytes && rng() % 40 != 0) {
        uint32_t k = rng() % 16, cp;
        if (k < 5) {
            const char *w = words[rng() % (sizeof words / sizeof words[0])];
            size_t wl = strlen(w);
            memcpy(s + n, w, wl);
            n += wl;
            continue;
        }
        switch (k) {
        case 5: cp = ' '; break;
        case 6: cp = rng() % 3 ? ' ' : '\n'; break;
        case 7: cp = rng() % 2 ? '\t' : '\n'; break;
        case 8: cp = 0x20 + rng() % 95; break;
        case 9: cp = 0xC0 + rng() % 0xC0; break;                    /* Latin-1, Latin Ext-A */
        case 10: cp = 0x400 + rng() % 0x100; break;                 /* Cyrillic */
        case 11: cp = 0x4E00 + rng() % 0x5200; break;               /* CJK */
        case 12: cp = 0x1F300 + rng() % 0x700; break;               /* emoji */
        case 13: cp = rng() % 2 ? 0x200D : 0xFE0F; break;           /* ZWJ, VS16 */
        case 14: cp = 1 + rng() % 0x10FFFF; break;                  /* anything */
        default: cp = 0x3040 + rng() % 0x60; break;                 /* Hiragana */
        }
        if (cp >= 0xD800 && cp < 0xE000) cp = 'x';
        n += put_utf8(s + n, cp);
    }
    s[n] = '\0';
    return s;
}

/* Arbitrary non-NUL bytes: stray continuation bytes, overlong runs, truncated sequences. */
static char *random_bytes(size_t max_bytes) {
    size_t n = rng() % max_bytes;
    char *s = malloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        uint32_t k = rng() % 4;
        s[i] = (char)(k == 0 ? 0x80 + rng() % 64 : k == 1 ? 0xC0 + rng() % 64 : 1 + rng() % 255);
    }
    s[n] = '\0';
    return s;
}

/* ---- (a) llama.cpp's SPM vocabulary tests ---------------------------------------------- */

static int first_diff(const int *a, int na, const int *b, int nb) {
    int d = 0;
    while (d < na && d < nb && a[d] == b[d]) d++;
    return d;
}

/* llama.cpp's SPM test cases through a vocabulary: tokenizer.bin, or the same vocabulary read
 * from llama.cpp's own vocab-only GGUF file. */
static void ggml_vocab_cases(const char *tokp) {
    const char *inp = t_data("tokenizers/ggml-vocab-llama-spm.gguf.inp");
    const char *outp = t_data("tokenizers/ggml-vocab-llama-spm.gguf.out");
    if (!tokp || !inp || !outp) return;
    nv_tokenizer *t = load_or_fail(tokp, 32000);
    if (!t) return;
    ref_tok ref;
    ref_init(&ref, t);
    char *in, *out;
    size_t inlen, outlen;
    T_CHECK(nv_file_read_all(inp, &in, &inlen) == NV_OK, "%s", nv_errmsg());
    T_CHECK(nv_file_read_all(outp, &out, &outlen) == NV_OK, "%s", nv_errmsg());

    /* Every input is followed by the separator (as llama.cpp's test-tokenizer-0 reads it);
     * the .out file has one line per input, empty for the empty input. */
    static const char sep[] = "\n__ggml_vocab_test__\n";
    char *ip = in, *op = out;
    int cases = 0, passed = 0;
    for (char *end; (end = strstr(ip, sep)) != NULL; ip = end + strlen(sep)) {
        *end = '\0';
        char *eol = strchr(op, '\n');
        T_CHECK(eol != NULL, "case %d: .out has no line for it", cases);
        if (!eol) break;
        *eol = '\0';
        int want[2048], nwant = 0;
        for (char *q = op, *e2; nwant < 2048; q = e2) {
            long v = strtol(q, &e2, 10);
            if (e2 == q) break;
            want[nwant++] = (int)v;
        }
        op = eol + 1;

        int *got, ngot;
        nv_err e = nv_tokenizer_encode(t, ip, 0, 0, &got, &ngot);
        T_CHECK(e == NV_OK, "case %d: %s", cases, nv_errmsg());
        int same = e == NV_OK && ngot == nwant && (nwant == 0 || memcmp(got, want, (size_t)nwant * sizeof(int)) == 0);
        T_CHECK(same, "case %d (\"%.40s\"): got %d ids, want %d; first differing at %d", cases, ip,
                ngot, nwant, first_diff(got, ngot, want, nwant));
        passed += same;

        int nref;
        int *r = ref_encode(&ref, ip, 1, 1, &nref);
        int *g2, ng2;
        T_CHECK(nv_tokenizer_encode(t, ip, 1, 1, &g2, &ng2) == NV_OK, "%s", nv_errmsg());
        T_CHECK(ng2 == nref && memcmp(g2, r, (size_t)nref * sizeof(int)) == 0,
                "case %d: differs from run.c's encode with bos+eos", cases);
        char *back = decode_all(t, g2, ng2 - 1); /* without the EOS */
        T_CHECK(strcmp(back, ip) == 0, "case %d: decode(encode(s)) != s", cases);
        free(back);
        free(g2);
        free(r);
        free(got);
        cases++;
    }
    T_CHECK(*op == '\0', ".out has lines beyond the %d inputs", cases);
    /* The files hold 46 inputs (47 pieces when the text after the last separator is counted). */
    T_CHECK(cases == 46, "expected 46 cases, found %d", cases);
    printf("    %d/%d llama.cpp SPM vocabulary cases reproduced (%s)\n", passed, cases, tokp);
    free(in);
    free(out);
    free(ref.sorted);
    nv_tokenizer_free(t);
}

static void test_ggml_vocab_cases(void) { ggml_vocab_cases(t_data("tokenizers/tokenizer.bin")); }
static void test_ggml_vocab_cases_gguf(void) { ggml_vocab_cases(t_data("tokenizers/ggml-vocab-llama-spm.gguf")); }

/* ---- (b) round trips and agreement with run.c on random text --------------------------- */

static void roundtrip_with(const char *path, int vocab, int iters) {
    nv_tokenizer *t = load_or_fail(path, vocab);
    if (!t) return;
    ref_tok ref;
    ref_init(&ref, t);
    int bad_rt = 0, bad_ref = 0, fallback = 0;
    for (int it = 0; it < iters; it++) {
        char *s = it % 5 == 4 ? random_bytes(200) : random_text(it % 7 == 0 ? 2000 : 300);
        int *ids, n;
        if (nv_tokenizer_encode(t, s, 1, 0, &ids, &n) != NV_OK) {
            T_CHECK(0, "encode: %s", nv_errmsg());
            free(s);
            continue;
        }
        for (int i = 0; i < n; i++) fallback += ids[i] >= 3 && ids[i] < 259;
        char *back = decode_all(t, ids, n);
        /* A literal "<0xXX>" in the text can merge into the byte token itself, which run.c
         * decodes to the raw byte: only texts without one must round-trip exactly. */
        if (!strstr(s, "<0x") && strcmp(back, s) != 0) {
            if (bad_rt++ < 3) T_CHECK(0, "%s: round trip of \"%.60s\" gave \"%.60s\"", path, s, back);
        }
        int nr;
        int *r = ref_encode(&ref, s, 1, 0, &nr);
        if (nr != n || memcmp(r, ids, (size_t)n * sizeof(int)) != 0) {
            if (bad_ref++ < 3) T_CHECK(0, "%s: \"%.60s\" differs from run.c's encode", path, s);
        }
        free(r);
        free(back);
        free(ids);
        free(s);
    }
    T_CHECK(bad_rt == 0, "%d round trips failed", bad_rt);
    T_CHECK(bad_ref == 0, "%d encodings differ from run.c", bad_ref);
    T_CHECK(fallback > 0, "random text never used byte fallback");
    free(ref.sorted);
    nv_tokenizer_free(t);
}

static void test_roundtrip_llama32000(void) {
    const char *p = t_data("tokenizers/tokenizer.bin");
    if (p) roundtrip_with(p, 32000, 300);
}

static void test_roundtrip_tok512(void) {
    const char *p = t_data("models/tok512.bin");
    if (p) roundtrip_with(p, 512, 300);
}

static void test_known_ids_and_decode(void) {
    const char *p = t_data("tokenizers/tokenizer.bin");
    if (!p) return;
    nv_tokenizer *t = load_or_fail(p, 0);
    if (!t) return;
    T_CHECK(nv_tokenizer_vocab_size(t) == 32000, "vocab %d", nv_tokenizer_vocab_size(t));
    T_CHECK(!strcmp(nv_tokenizer_piece(t, 1), "\n<s>\n"), "BOS piece");
    T_CHECK(nv_tokenizer_piece(t, -1) == NULL && nv_tokenizer_piece(t, 32000) == NULL, "range");
    T_CHECK(nv_tokenizer_lookup(t, " ") == 29871, "' ' is %d", nv_tokenizer_lookup(t, " "));
    T_CHECK(nv_tokenizer_lookup(t, "<0x41>") == 68, "byte token");
    T_CHECK(nv_tokenizer_lookup(t, "no such piece here") == -1, "missing piece");
    T_CHECK(nv_tokenizer_score(t, 259) == -1e9f, "score of '  ' %g", nv_tokenizer_score(t, 259));
    T_CHECK(!strcmp(nv_tokenizer_decode(t, 1, 15043), "Hello"), "space stripped after BOS");
    T_CHECK(!strcmp(nv_tokenizer_decode(t, 2, 15043), " Hello"), "kept otherwise");
    T_CHECK(!strcmp(nv_tokenizer_decode(t, 5, 68), "A"), "byte token decodes to its byte");
    T_CHECK(!strcmp(nv_tokenizer_decode(t, 5, 16), "\r"), "<0x0D>");
    T_CHECK(nv_tokenizer_decode(t, 1, 32000) == NULL && nv_tokenizer_decode(t, 1, -1) == NULL, "range");
    T_CHECK(nv_piece_printable("A") && nv_piece_printable(" ") && nv_piece_printable("\n"), "printable");
    T_CHECK(!nv_piece_printable("\x01") && !nv_piece_printable("") && !nv_piece_printable(NULL) &&
                !nv_piece_printable("\x80"), "unprintable");
    T_CHECK(nv_piece_printable("\xe4\xb8\xad"), "multi-byte piece is printed");
    int *ids, n;
    T_CHECK(nv_tokenizer_encode(t, "", 1, 1, &ids, &n) == NV_OK && n == 2 && ids[0] == 1 && ids[1] == 2,
            "empty text is BOS EOS");
    free(ids);
    T_CHECK(nv_tokenizer_encode(t, NULL, 1, 1, &ids, &n) == NV_EINVAL, "NULL text");
    nv_tokenizer_free(t);
}

/* ---- hand-built vocabularies ----------------------------------------------------------- */

static char tmpdir[64];

static int make_tmpdir(void) {
    if (tmpdir[0]) return 1;
    strcpy(tmpdir, "/tmp/nv_test_tok_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        tmpdir[0] = '\0';
        T_CHECK(0, "mkdtemp failed");
        return 0;
    }
    return 1;
}

static const char *write_tmp(const char *name, const void *data, size_t len) {
    static char path[128];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    T_CHECK(f != NULL, "cannot write %s", path);
    if (!f) return path;
    if (len) fwrite(data, 1, len, f);
    fclose(f);
    return path;
}

static void buf_i32(nv_buf *b, int32_t v) { nv_buf_append(b, &v, 4); }
static void buf_tok(nv_buf *b, const char *s, float score) {
    nv_buf_append(b, &score, 4);
    buf_i32(b, (int32_t)strlen(s));
    nv_buf_append(b, s, strlen(s));
}

/* <unk>, <s>, </s>, the 256 byte tokens, then extra pieces. */
static void build_vocab(nv_buf *b, const char **pieces, const float *scores, int n) {
    nv_buf_consume(b, b->len);
    buf_i32(b, 8);
    buf_tok(b, "<unk>", 0);
    buf_tok(b, "\n<s>\n", 0);
    buf_tok(b, "\n</s>\n", 0);
    for (int i = 0; i < 256; i++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", i);
        buf_tok(b, s, 0);
    }
    for (int i = 0; i < n; i++) buf_tok(b, pieces[i], scores[i]);
}

static int encode_is(nv_tokenizer *t, const char *text, const int *want, int nwant) {
    int *ids, n;
    if (nv_tokenizer_encode(t, text, 0, 0, &ids, &n) != NV_OK) return 0;
    int ok = n == nwant && memcmp(ids, want, (size_t)n * sizeof(int)) == 0;
    if (!ok) {
        fprintf(stderr, "    \"%s\" ->", text);
        for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fputc('\n', stderr);
    }
    free(ids);
    return ok;
}

static void test_merge_rules(void) {
    if (!make_tmpdir()) return;
    /* ids: 259 " ", 260 "a", 261 "aa", 262 "b", 263 "ab", 264 "ba"(-2e10), 265 "c", 266 "bc"(NaN),
     * 267 "aa" again (duplicate), 268 " a", 269 "cc" (-1e10, exactly run.c's floor) */
    const char *pieces[] = {" ", "a", "aa", "b", "ab", "ba", "c", "bc", "aa", " a", "cc"};
    float scores[] = {-1, -1, -5, -1, -5, -2e10f, -1, NAN, 100, -6, -1e10f};
    nv_buf b = {0};
    build_vocab(&b, pieces, scores, 11);
    nv_tokenizer *t = load_or_fail(write_tmp("rules.bin", b.data, b.len), 0);
    nv_buf_free(&b);
    if (!t) return;
    T_CHECK(nv_tokenizer_lookup(t, "aa") == 261, "duplicate string: lowest id, got %d", nv_tokenizer_lookup(t, "aa"));
    /* " aaa": " a"(-6) loses to "aa"(-5); both "aa" pairs tie at -5 and the leftmost wins. */
    T_CHECK(encode_is(t, "aaa", (int[]){259, 261, 260}, 3), "tie: leftmost pair merges first");
    /* "aab": pairs aa(-5) and ab(-5) tie; the leftmost (aa) wins, then "aab" is absent. */
    T_CHECK(encode_is(t, "aab", (int[]){259, 261, 262}, 3), "tie between different pieces");
    T_CHECK(encode_is(t, "ba", (int[]){259, 262, 260}, 3), "score below -1e10 never merges");
    T_CHECK(encode_is(t, "bc", (int[]){259, 262, 265}, 3), "NaN score never merges");
    T_CHECK(encode_is(t, "cc", (int[]){259, 265, 265}, 3), "score equal to -1e10 never merges");
    T_CHECK(encode_is(t, "a", (int[]){268}, 1), "dummy prefix merges");
    /* 'z' is not a piece: byte fallback to 'z'+3. A lone continuation byte likewise. */
    T_CHECK(encode_is(t, "z\x80", (int[]){259, 'z' + 3, 0x80 + 3}, 3), "byte fallback");
    /* Six continuation bytes after a lead byte: chunks of 4 then 3, all byte fallback here. */
    T_CHECK(encode_is(t, "\xf0\x80\x80\x80\x80\x80\x80", (int[]){259, 0xf3, 0x83, 0x83, 0x83, 0x83, 0x83, 0x83}, 8),
            "overlong run");
    nv_tokenizer_free(t);

    /* Chunking matters when a chunk is a piece: "\xe4\xb8\xad" is, and so is a 4-byte run of
     * stray continuation bytes. */
    const char *p2[] = {" ", "\xe4\xb8\xad", "\x80\x80\x80\x80", "a\x80"};
    float s2[] = {-1, -1, -1, -1};
    b = (nv_buf){0};
    build_vocab(&b, p2, s2, 4);
    t = load_or_fail(write_tmp("chunks.bin", b.data, b.len), 0);
    nv_buf_free(&b);
    if (!t) return;
    T_CHECK(encode_is(t, "\x80\x80\x80\x80\x80\xe4\xb8\xad", (int[]){259, 261, 0x83, 260}, 4),
            "stray continuation bytes in fours, then a 3-byte code point");
    /* The continuation byte after a full code point joins its chunk (cut at 4), so neither
     * the code point nor the following four are looked up as such. */
    T_CHECK(encode_is(t, "\xe4\xb8\xad\x80\x80\x80\x80\x80", (int[]){259, 0xe7, 0xbb, 0xb0, 0x83, 261}, 6),
            "chunks cut at 4 bytes");
    T_CHECK(encode_is(t, "a\x80", (int[]){259, 262}, 2), "ASCII byte plus continuation is one chunk");
    nv_tokenizer_free(t);

    /* No " " piece and a vocabulary too small for byte ids: nothing may index past the end. */
    nv_buf c = {0};
    buf_i32(&c, 4);
    buf_tok(&c, "<unk>", 0);
    buf_tok(&c, "\n<s>\n", 0);
    buf_tok(&c, "\n</s>\n", 0);
    buf_tok(&c, "ab", -1);
    t = load_or_fail(write_tmp("tiny.bin", c.data, c.len), 0);
    nv_buf_free(&c);
    if (!t) return;
    int *ids, n;
    T_CHECK(nv_tokenizer_encode(t, "ab \xe4\xb8\xad", 1, 1, &ids, &n) == NV_OK, "%s", nv_errmsg());
    for (int i = 0; i < n; i++) T_CHECK(ids[i] >= 0 && ids[i] < 4, "id %d out of range", ids[i]);
    free(ids);
    nv_tokenizer_free(t);
}

/* Random vocabularies over a tiny alphabet (so merges, long chains and ties abound; scores
 * include -0 and +0, which run.c's '>' treats as equal) against the literal run.c loop. */
static void test_random_vocabs(void) {
    if (!make_tmpdir()) return;
    static const char *alphabet[] = {"a", "b", " ", "\n", "\xc3\xa9", "\xe4\xb8\xad"};
    static const float score_set[] = {-1, -2, -3, 0.0f, -0.0f, 5, -1e9f};
    int bad = 0, total = 0;
    for (int v = 0; v < 30; v++) {
        int k = 10 + (int)(rng() % 150);
        const char **pieces = malloc((size_t)(k + 1) * sizeof *pieces);
        float *scores = malloc((size_t)(k + 1) * sizeof *scores);
        char (*store)[32] = malloc((size_t)(k + 1) * sizeof *store);
        int np = 0;
        strcpy(store[np], " ");
        pieces[np] = store[np];
        scores[np++] = -1;
        for (int i = 0; i < k; i++) {
            char w[32] = "";
            int parts = 1 + (int)(rng() % 5);
            for (int j = 0; j < parts; j++) strcat(w, alphabet[rng() % 6]);
            int dup = 0;
            for (int j = 0; j < np; j++) dup |= !strcmp(store[j], w);
            if (dup) continue;
            strcpy(store[np], w);
            pieces[np] = store[np];
            scores[np++] = score_set[rng() % 7];
        }
        nv_buf b = {0};
        build_vocab(&b, pieces, scores, np);
        nv_tokenizer *t = load_or_fail(write_tmp("random.bin", b.data, b.len), 0);
        nv_buf_free(&b);
        free(pieces);
        free(scores);
        free(store);
        if (!t) continue;
        ref_tok ref;
        ref_init(&ref, t);
        for (int it = 0; it < 60; it++) {
            char text[400] = "";
            int parts = (int)(rng() % 100);
            for (int j = 0; j < parts; j++) strcat(text, alphabet[rng() % 6]);
            int *ids, n, nr;
            T_CHECK(nv_tokenizer_encode(t, text, it & 1, 0, &ids, &n) == NV_OK, "%s", nv_errmsg());
            int *r = ref_encode(&ref, text, it & 1, 0, &nr);
            total++;
            if (n != nr || memcmp(ids, r, (size_t)n * sizeof(int)) != 0) {
                if (bad++ < 3) T_CHECK(0, "vocab %d: \"%s\" differs from run.c", v, text);
            }
            free(r);
            free(ids);
        }
        free(ref.sorted);
        nv_tokenizer_free(t);
    }
    T_CHECK(bad == 0, "%d of %d encodings differ from run.c", bad, total);
}

/* ---- (c) malformed files ---------------------------------------------------------------- */

static void expect_format_error(const char *what, const void *data, size_t len, int vocab) {
    const char *p = write_tmp("bad.bin", data, len);
    nv_tokenizer *t = (nv_tokenizer *)1;
    nv_err e = nv_tokenizer_load(p, vocab, &t);
    T_CHECK(e == NV_EFORMAT, "%s: got %s (%s)", what, nv_err_name(e), nv_errmsg());
    T_CHECK(t == NULL, "%s: *out not cleared", what);
    T_CHECK(strchr(nv_errmsg(), '\n') == NULL && nv_errmsg()[0], "%s: message must be one line", what);
    if (e == NV_OK) nv_tokenizer_free(t);
}

static void test_malformed(void) {
    if (!make_tmpdir()) return;
    nv_buf b = {0};
    const char *pieces[] = {" ", "a"};
    float scores[] = {-1, -2};
    build_vocab(&b, pieces, scores, 2); /* 261 tokens */
    size_t good_len = b.len;

    expect_format_error("empty file", b.data, 0, 0);
    for (size_t cut = 1; cut <= 4; cut++) expect_format_error("truncated header/no tokens", b.data, cut, 0);
    /* Every cut inside the file fails when the vocabulary size is known... */
    size_t cuts[] = {5, 8, 11, 12, 13, 14, 20, 21, 40, good_len / 2, good_len - 2, good_len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        char what[64];
        snprintf(what, sizeof what, "truncated at %zu of %zu", cuts[i], good_len);
        expect_format_error(what, b.data, cuts[i], 261);
    }
    /* ...and a cut inside an entry fails even when reading to the end. */
    /* The last entry ("a") is 4+4+1 bytes: score at len-9, length at len-5, piece at len-1. */
    expect_format_error("cut in a score", b.data, good_len - 7, 0);
    expect_format_error("cut in a length", b.data, good_len - 3, 0);
    expect_format_error("cut before a piece", b.data, good_len - 1, 0);
    expect_format_error("cut in a piece", b.data, 4 + 8 + 2, 0);
    expect_format_error("vocab_size beyond the file", b.data, good_len, 262);

    nv_tokenizer *t;
    const char *p = write_tmp("good.bin", b.data, good_len);
    T_CHECK(nv_tokenizer_load(p, 0, &t) == NV_OK && nv_tokenizer_vocab_size(t) == 261, "good file");
    nv_tokenizer_free(t);
    T_CHECK(nv_tokenizer_load(p, 100, &t) == NV_OK && nv_tokenizer_vocab_size(t) == 100,
            "fewer entries than the file has (as llama2.c reads)");
    nv_tokenizer_free(t);
    T_CHECK(nv_tokenizer_load(p, -1, &t) == NV_EINVAL && t == NULL, "negative vocab_size");
    char missing[128];
    snprintf(missing, sizeof missing, "%s/no-such-file", tmpdir);
    T_CHECK(nv_tokenizer_load(missing, 0, &t) == NV_EIO && t == NULL, "missing file");

    unsigned char *m = malloc(good_len);
    int32_t v;
    /* Negative length of the first entry (offset 4 + 4). */
    memcpy(m, b.data, good_len);
    v = -1;
    memcpy(m + 8, &v, 4);
    expect_format_error("negative length", m, good_len, 0);
    v = INT32_MIN;
    memcpy(m + 8, &v, 4);
    expect_format_error("INT32_MIN length", m, good_len, 0);
    v = INT32_MAX;
    memcpy(m + 8, &v, 4);
    expect_format_error("huge length", m, good_len, 0);
    memcpy(m, b.data, good_len);
    int32_t headers[] = {0, -5, INT32_MAX, 1 << 20};
    for (size_t i = 0; i < 4; i++) {
        memcpy(m, &headers[i], 4);
        expect_format_error("bad max_token_length", m, good_len, 0);
    }
    memcpy(m, b.data, good_len);
    expect_format_error("only two tokens", m, 4 + 8 + 5 + 8 + 5, 0);
    free(m);

    const char text[] = "This is a text file, not a tokenizer.\n";
    expect_format_error("text file", text, sizeof text - 1, 0);
    unsigned char garbage[4096];
    for (int round = 0; round < 50; round++) {
        size_t n = 1 + rng() % sizeof garbage;
        for (size_t i = 0; i < n; i++) garbage[i] = (unsigned char)rng();
        const char *gp = write_tmp("garbage.bin", garbage, n);
        nv_tokenizer *g = NULL;
        nv_err e = nv_tokenizer_load(gp, 0, &g);
        T_CHECK(e == NV_EFORMAT || e == NV_OK, "garbage: %s", nv_err_name(e));
        if (e == NV_OK) { /* a random file can be well formed; then it must still work */
            int *ids, nid;
            T_CHECK(nv_tokenizer_encode(g, "hello \xe4\xb8\xad", 1, 1, &ids, &nid) == NV_OK, "encode");
            free(ids);
        }
        nv_tokenizer_free(g);
    }
    /* Garbage with a plausible header: random entries after a valid max_token_length. */
    for (int round = 0; round < 50; round++) {
        size_t n = 8 + rng() % 512;
        for (size_t i = 0; i < n; i++) garbage[i] = (unsigned char)rng();
        v = 16;
        memcpy(garbage, &v, 4);
        v = (int32_t)(rng() % 64) - 8;
        memcpy(garbage + 8, &v, 4);
        const char *gp = write_tmp("garbage.bin", garbage, n);
        nv_tokenizer *g = NULL;
        nv_err e = nv_tokenizer_load(gp, 0, &g);
        T_CHECK(e == NV_EFORMAT || e == NV_OK, "garbage: %s", nv_err_name(e));
        nv_tokenizer_free(g);
    }
    nv_buf_free(&b);
}

/* Pieces longer than the header's max_token_length and embedded NULs must not overrun. */
static void test_lenient_pieces(void) {
    if (!make_tmpdir()) return;
    nv_buf b = {0};
    char longp[300];
    memset(longp, 'x', sizeof longp - 1);
    longp[sizeof longp - 1] = '\0';
    const char *pieces[] = {" ", "x", "xx", longp};
    float scores[] = {-1, -1, -2, -3};
    build_vocab(&b, pieces, scores, 4); /* header says 8 */
    float s = -4;
    nv_buf_append(&b, &s, 4);
    buf_i32(&b, 3);
    nv_buf_append(&b, "x\0y", 3);
    nv_tokenizer *t = load_or_fail(write_tmp("lenient.bin", b.data, b.len), 0);
    nv_buf_free(&b);
    if (!t) return;
    T_CHECK(!strcmp(nv_tokenizer_piece(t, 263), "x"), "embedded NUL ends the piece");
    int *ids, n;
    char text[400];
    memset(text, 'x', 299);
    text[299] = '\0';
    T_CHECK(nv_tokenizer_encode(t, text, 0, 0, &ids, &n) == NV_OK, "%s", nv_errmsg());
    ref_tok ref;
    ref_init(&ref, t);
    int nr;
    int *r = ref_encode(&ref, text, 0, 0, &nr);
    T_CHECK(n == nr && memcmp(ids, r, (size_t)n * sizeof(int)) == 0, "long pieces agree with run.c");
    free(r);
    free(ids);
    free(ref.sorted);
    nv_tokenizer_free(t);
}

/* ---- (d) a long text -------------------------------------------------------------------- */

static void test_long_text(void) {
    const char *tp = t_data("tokenizers/tokenizer.bin");
    const char *cp = t_data("corpus/tinystories_valid_head.txt");
    if (!tp || !cp) return;
    nv_tokenizer *t = load_or_fail(tp, 32000);
    if (!t) return;
    char *text;
    size_t len;
    T_CHECK(nv_file_read_all(cp, &text, &len) == NV_OK, "%s", nv_errmsg());
    size_t cut = len < 200000 ? len : 200000;
    while (cut > 0 && ((unsigned char)text[cut] & 0xC0) == 0x80) cut--;
    text[cut] = '\0';

    int *ids, n;
    double t0 = now_s();
    nv_err e = nv_tokenizer_encode(t, text, 1, 0, &ids, &n);
    double dt = now_s() - t0;
    T_CHECK(e == NV_OK, "%s", nv_errmsg());
    printf("    %zu bytes -> %d tokens in %.1f ms\n", cut, n, dt * 1e3);
    /* Not a speed test: only catches a return to run.c's quadratic loop (minutes here). */
    T_CHECK(dt < 20.0, "encode took %.1f s", dt);
    T_CHECK(n > 1000 && (size_t)n < cut / 2, "implausible token count %d", n);
    char *back = decode_all(t, ids, n);
    T_CHECK(strcmp(back, text) == 0, "long text does not round-trip");
    free(back);

    /* The first few KB against the literal run.c loop. */
    size_t head = 4000;
    while (((unsigned char)text[head] & 0xC0) == 0x80) head--;
    text[head] = '\0';
    ref_tok ref;
    ref_init(&ref, t);
    int nr, *r = ref_encode(&ref, text, 1, 0, &nr), *h, nh;
    T_CHECK(nv_tokenizer_encode(t, text, 1, 0, &h, &nh) == NV_OK, "%s", nv_errmsg());
    T_CHECK(nh == nr && memcmp(h, r, (size_t)nr * sizeof(int)) == 0, "4 KB prefix differs from run.c");
    T_CHECK(nh <= n && memcmp(h, ids, (size_t)nh / 2 * sizeof(int)) == 0, "prefix encodes like the whole");
    free(h);
    free(r);
    free(ref.sorted);
    free(ids);
    free(text);
    nv_tokenizer_free(t);
}

static void cleanup_tmpdir(void) {
    if (!tmpdir[0]) return;
    const char *names[] = {"rules.bin", "chunks.bin", "tiny.bin", "bad.bin", "good.bin", "garbage.bin", "lenient.bin", "random.bin"};
    char path[128];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", tmpdir, names[i]);
        unlink(path);
    }
    rmdir(tmpdir);
}

/* A GGUF SentencePiece vocabulary with control tokens beyond llama2.c's three (Phi-3's, Mistral's
 * [INST]): their text in a prompt is their id, the text between them encoded on its own with
 * SentencePiece's dummy prefix after each (llama.cpp's rule), merges never across; EOS from the
 * file, end-of-turn tokens ending generation; under a phi3 model the white space after them
 * dropped (but after <s>, <unk>, <|endoftext|>); with add_space_prefix false no dummy prefix at all. */
static void test_spm_special_tokens(void) {
    const char *text = "<|user|> a<|end|> <|assistant|> b";
    const struct {
        const char *arch;
        int space_prefix, want[16], n, a; /* a: the id of "a" encoded alone */
    } cases[] = {{"phi3", -1, {1, 8, 6, 9, 10, 3, 5}, 7, 6},
                 {"llama", -1, {1, 8, 3, 6, 9, 3, 3, 10, 3, 3, 5}, 11, 6},
                 {"llama", 0, {1, 8, 6, 9, 3, 10, 3, 5}, 8, 4}};
    for (int c = 0; c < 3; c++) {
        const char *p = t_path("spm_special.gguf");
        T_CHECK(gw_spm_vocab(p, cases[c].arch, cases[c].space_prefix), "writing %s", p);
        nv_tokenizer *t = NULL;
        T_CHECK(nv_tokenizer_load(p, 0, &t) == NV_OK, "%s", nv_errmsg());
        if (!t) continue;
        int *ids = NULL, n = 0;
        T_CHECK(nv_tokenizer_encode(t, text, 1, 0, &ids, &n) == NV_OK, "%s", nv_errmsg());
        int same = n == cases[c].n;
        for (int i = 0; same && i < n; i++) same = ids[i] == cases[c].want[i];
        T_CHECK(same, "%s: %d tokens, the first %d %d %d %d", cases[c].arch, n, n > 0 ? ids[0] : -1, n > 1 ? ids[1] : -1,
                n > 2 ? ids[2] : -1, n > 3 ? ids[3] : -1);
        free(ids);
        /* no special token in the text: one piece, as before */
        T_CHECK(nv_tokenizer_encode(t, "a", 1, 1, &ids, &n) == NV_OK && n == 3 && ids[0] == 1 && ids[1] == cases[c].a && ids[2] == 11,
                "%s: 'a' with BOS and EOS", cases[c].arch);
        free(ids);
        T_CHECK(nv_tokenizer_eos(t) == 11 && nv_tokenizer_is_eog(t, 11) && nv_tokenizer_is_eog(t, 9) && !nv_tokenizer_is_eog(t, 10),
                "%s: EOS and the end of a turn end generation", cases[c].arch);
        T_CHECK(!strcmp(nv_tokenizer_decode(t, 5, 10), "") && !strcmp(nv_tokenizer_decode(t, 10, 6), " a"),
                "%s: a control token prints nothing, text as it was", cases[c].arch);
        if (c == 0) { /* a run trained with it keeps it whole (a vocab-only GGUF as its tokenizer.bin), rule included */
            static const char words[] = "a b c a a b c c b a b c a b a c a b c b a c a b c a b c a b c a b a c b a b c a\n";
            const char *data = t_write("spm_words.txt", words, sizeof words - 1);
            char args[2000], kept[900];
            snprintf(args, sizeof args,
                     "train --dim 8 --layers 1 --heads 2 --hidden 16 --data %s -z %s --steps 1 --batch 1 --seq 8 --val-frac 0 "
                     "--quiet --out %s/spm_run",
                     data, p, t_tmpdir());
            snprintf(kept, sizeof kept, "%s/spm_run/tokenizer.bin", t_tmpdir());
            nv_tokenizer *u = NULL;
            int *again = NULL, na = 0;
            T_CHECK(t_nerve(args) == 0, "training with the vocabulary: %s", t_err);
            T_CHECK(nv_tokenizer_load(kept, 0, &u) == NV_OK && nv_tokenizer_encode(u, text, 1, 0, &again, &na) == NV_OK &&
                        na == cases[c].n && !memcmp(again, cases[c].want, (size_t)na * sizeof(int)) && nv_tokenizer_eos(u) == 11 &&
                        nv_tokenizer_strips_after_special(u),
                    "the run's tokenizer.bin encodes differently: %s", nv_errmsg());
            free(again);
            if (u) nv_tokenizer_free(u);
        }
        if (c >= 1) { /* written back as a GGUF vocabulary (what nerve export writes): the same ids */
            const char *q = t_path("spm_special_copy.gguf");
            nv_tokenizer *u = NULL;
            int *again = NULL, na = 0;
            T_CHECK(nv_gguf_save_vocab(t, q) == NV_OK && nv_tokenizer_load(q, 0, &u) == NV_OK, "%s", nv_errmsg());
            T_CHECK(u && nv_tokenizer_encode(u, text, 1, 1, &again, &na) == NV_OK && na == cases[c].n + 1 &&
                        !memcmp(again, cases[c].want, (size_t)cases[c].n * sizeof(int)) && again[cases[c].n] == 11 &&
                        nv_tokenizer_is_eog(u, 9),
                    "the vocabulary written back encodes differently");
            free(again);
            if (u) nv_tokenizer_free(u);
        }
        nv_tokenizer_free(t);
    }
}

/* A byte piece is "<0x", two hex digits and ">" exactly: sscanf's %X would also take a sign or a
 * space ("<0x-8>" read as byte 0xFFFFFFF8 once indexed a table of 256; found by fuzz_tokenizer). */
static void test_byte_pieces(void) {
    static const struct {
        const char *p;
        int want;
    } cases[] = {{"<0x41>", 0x41}, {"<0xff>", 0xff}, {"<0x00>", 0}, {"<0x-8>", -1}, {"<0x 8>", -1}, {"<0x+8>", -1},
                 {"<0x8>", -1},    {"<0x4G>", -1},   {"<0x41", -1},  {"<0x411>", -1}, {"<1x41>", -1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        T_CHECK(nv_byte_piece(cases[i].p, strlen(cases[i].p)) == cases[i].want, "%s: %d", cases[i].p,
                nv_byte_piece(cases[i].p, strlen(cases[i].p)));
}

int main(void) {
    T_RUN(test_ggml_vocab_cases);
    T_RUN(test_ggml_vocab_cases_gguf);
    T_RUN(test_known_ids_and_decode);
    T_RUN(test_byte_pieces);
    T_RUN(test_roundtrip_llama32000);
    T_RUN(test_roundtrip_tok512);
    T_RUN(test_merge_rules);
    T_RUN(test_random_vocabs);
    T_RUN(test_malformed);
    T_RUN(test_lenient_pieces);
    T_RUN(test_long_text);
    T_RUN(test_spm_special_tokens);
    cleanup_tmpdir();
    return t_done();
}
