/* BPE tokenizer training: a hand-checked tiny corpus, the TinyStories text at 512/1024/4096
 * tokens (loads with nv_tokenizer_load, round-trips, compresses better with a larger
 * vocabulary), byte fallback for unseen text, reserved pieces that must never be assembled,
 * determinism, and `nerve tokenizer train` end to end with its errors. */
#include <errno.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model/bpe_train.h"
#include "model/tokenizer.h"
#include "t.h"
#include "tok_util.h"


/* Trains on one text; returns 1 on success (r filled), 0 after recording a failure. */
static int train1(const char *text, size_t len, int vocab, nv_bpe_result *r) {
    nv_iov in = {text, len};
    nv_bpe_opts o = {.vocab_size = vocab};
    nv_err e = nv_bpe_train(&in, 1, &o, r);
    T_CHECK(e == NV_OK, "train (vocab %d): %s", vocab, nv_errmsg());
    return e == NV_OK;
}

/* Trains, writes the result under name and loads it; NULL after recording a failure. */
static nv_tokenizer *train_load(const char *name, const char *text, size_t len, int vocab, nv_bpe_result *stats) {
    nv_bpe_result r;
    if (!train1(text, len, vocab, &r)) return NULL;
    const char *p = t_write(name, r.data, r.len);
    if (stats) {
        *stats = r;
        stats->data = NULL;
    }
    nv_bpe_result_free(&r);
    nv_tokenizer *t = NULL;
    nv_err e = nv_tokenizer_load(p, 0, &t);
    T_CHECK(e == NV_OK, "load %s: %s", p, nv_errmsg());
    return e == NV_OK ? t : NULL;
}

/* Encodes text with BOS, checks decode gives it back; returns the token count (BOS excluded). */
static int round_trip(const nv_tokenizer *t, const char *text) {
    int *ids = NULL, n = 0;
    nv_err e = nv_tokenizer_encode(t, text, 1, 0, &ids, &n);
    T_CHECK(e == NV_OK, "encode: %s", nv_errmsg());
    if (e != NV_OK) return -1;
    char *back = decode_all(t, ids, n);
    size_t tl = strlen(text);
    T_CHECK(strcmp(back, text) == 0, "round trip of %zu bytes differs (got %zu bytes): '%.60s' vs '%.60s'", tl,
            strlen(back), back, text);
    free(back);
    free(ids);
    return n - 1;
}

static char *read_data(const char *rel, size_t *len) {
    const char *p = t_data(rel);
    if (!p) return NULL;
    char *text = NULL;
    nv_err e = nv_file_read_all(p, &text, len);
    T_CHECK(e == NV_OK, "read %s: %s", p, nv_errmsg());
    return text;
}

/* ---- the hand-checked corpus -------------------------------------------------------------- */

static void test_tiny_corpus_first_merges(void) {
    /* " aaab aaab ab" (dummy prefix): a x7, " " x3, b x3 -> ids a=259, " "=260, b=261 (ties by
     * bytes). Pairs: aa 4, " a" 3, ab 3 -> "aa"; then ab 3 -> "ab"; then " aa" 2 ties
     * "aa"+"ab" 2 and wins on the lower left id; then " aa"+"ab" 2 -> " aaab"; then only
     * " "+"ab" is left, seen once: training stops at 266 tokens. */
    const char *text = "aaab aaab ab";
    nv_bpe_result st;
    nv_tokenizer *t = train_load("tiny.bin", text, strlen(text), 300, &st);
    if (!t) return;
    T_CHECK(st.n_tokens == 266 && st.n_chars == 3 && st.n_learned == 4 && st.n_dropped == 0,
            "tokens %d chars %d learned %d dropped %d", st.n_tokens, st.n_chars, st.n_learned, st.n_dropped);
    T_CHECK(nv_tokenizer_vocab_size(t) == 266, "vocab %d", nv_tokenizer_vocab_size(t));
    const char *want[] = {"a", " ", "b", "aa", "ab", " aa", " aaab"};
    const float score[] = {-4, -5, -6, 0, -1, -2, -3};
    for (int i = 0; i < 7; i++) {
        const char *p = nv_tokenizer_piece(t, 259 + i);
        T_CHECK(p && strcmp(p, want[i]) == 0, "id %d is '%s', want '%s'", 259 + i, p ? p : "(null)", want[i]);
        T_CHECK(nv_tokenizer_score(t, 259 + i) == score[i], "id %d score %g, want %g", 259 + i,
                nv_tokenizer_score(t, 259 + i), score[i]);
    }
    int *ids, n;
    T_CHECK(nv_tokenizer_encode(t, text, 1, 1, &ids, &n) == NV_OK, "%s", nv_errmsg());
    int expect[] = {1, 265, 265, 260, 263, 2};
    T_CHECK(n == 6 && memcmp(ids, expect, sizeof expect) == 0, "encoded to %d ids: %d %d %d %d %d %d", n, ids[0],
            n > 1 ? ids[1] : -1, n > 2 ? ids[2] : -1, n > 3 ? ids[3] : -1, n > 4 ? ids[4] : -1, n > 5 ? ids[5] : -1);
    free(ids);
    /* a character never seen falls back to its bytes */
    T_CHECK(nv_tokenizer_encode(t, "ac", 1, 0, &ids, &n) == NV_OK, "%s", nv_errmsg());
    int expect2[] = {1, 260, 259, 'c' + 3};
    T_CHECK(n == 4 && memcmp(ids, expect2, sizeof expect2) == 0, "'ac' encoded to %d ids", n);
    free(ids);
    round_trip(t, text);
    nv_tokenizer_free(t);

    /* Words: a space starts one, digits stand alone, letters and punctuation split, lines
     * never join. Words " ab" x4 and ".." x4 (ids: '.' 259 by count, then ' ' 'a' by bytes):
     * ".." wins the tie on the lowest left id, then " a", then " ab". */
    const char *text2 = "ab1.. ab1..\nab1.. ab1..\n";
    t = train_load("words.bin", text2, strlen(text2), 400, &st);
    if (!t) return;
    for (int id = 259 + st.n_chars; id < st.n_tokens; id++) {
        const char *p = nv_tokenizer_piece(t, id);
        const char *want2[] = {"..", " a", " ab"};
        T_CHECK(id - 259 - st.n_chars < 3 && strcmp(p, want2[id - 259 - st.n_chars]) == 0, "unexpected piece '%s'", p);
    }
    T_CHECK(st.n_learned == 3 && st.n_chars == 6, "learned %d pieces, %d chars", st.n_learned, st.n_chars);
    round_trip(t, text2);
    nv_tokenizer_free(t);
}

/* ---- the TinyStories text ----------------------------------------------------------------- */

static void check_layout(const nv_tokenizer *t, const nv_bpe_result *st) {
    const char *special[3] = {"<unk>", "\n<s>\n", "\n</s>\n"};
    for (int i = 0; i < 3; i++)
        T_CHECK(strcmp(nv_tokenizer_piece(t, i), special[i]) == 0 && nv_tokenizer_score(t, i) == 0, "id %d", i);
    for (int b = 0; b < 256; b++) {
        char want[8];
        snprintf(want, sizeof want, "<0x%02X>", b);
        T_CHECK(strcmp(nv_tokenizer_piece(t, 3 + b), want) == 0 && nv_tokenizer_score(t, 3 + b) == 0, "byte id %d", 3 + b);
    }
    T_CHECK(nv_tokenizer_lookup(t, " ") >= 259, "no ' ' piece");
    int first = 259 + st->n_chars;
    for (int id = 259; id < first; id++) {
        const char *p = nv_tokenizer_piece(t, id);
        T_CHECK(nv_tokenizer_lookup(t, p) == id, "character '%s' (id %d) is not its own piece", p, id);
        T_CHECK(nv_tokenizer_score(t, id) < nv_tokenizer_score(t, nv_tokenizer_vocab_size(t) - 1), "char score");
    }
    for (int id = first; id < nv_tokenizer_vocab_size(t); id++) {
        const char *p = nv_tokenizer_piece(t, id);
        T_CHECK(nv_tokenizer_score(t, id) == -(float)(id - first), "id %d score %g", id, nv_tokenizer_score(t, id));
        T_CHECK(strchr(p + 1, ' ') == NULL && strchr(p, '\n') == NULL, "piece %d '%s' spans a word boundary", id, p);
        T_CHECK(strncmp(p, "<0x", 3) != 0, "piece %d '%s'", id, p);
        T_CHECK(nv_tokenizer_lookup(t, p) == id, "piece %d '%s' is a duplicate", id, p);
        int digits = 0;
        for (const char *c = p; *c; c++) digits += *c >= '0' && *c <= '9';
        T_CHECK(digits == 0, "piece %d '%s' holds a digit", id, p);
    }
}

static void test_tinystories_vocab_512_1024_4096(void) {
    size_t len;
    char *text = read_data("corpus/tinystories_valid_head.txt", &len);
    if (!text) return;
    const int vocabs[3] = {512, 1024, 4096};
    double tpb[3] = {0, 0, 0};
    for (int v = 0; v < 3; v++) {
        char name[32];
        snprintf(name, sizeof name, "ts%d.bin", vocabs[v]);
        nv_bpe_result st;
        nv_tokenizer *t = train_load(name, text, len, vocabs[v], &st);
        if (!t) break;
        T_CHECK(st.n_tokens == vocabs[v] && nv_tokenizer_vocab_size(t) == vocabs[v], "vocab %d: %d tokens", vocabs[v],
                st.n_tokens);
        T_CHECK(st.n_chars >= 50 && st.n_chars <= 80 && st.n_bytes == len, "chars %d bytes %llu", st.n_chars,
                (unsigned long long)st.n_bytes);
        /* the exact vocab_size load reads the same file */
        nv_tokenizer *t2 = NULL;
        T_CHECK(nv_tokenizer_load(t_path(name), vocabs[v], &t2) == NV_OK, "%s", nv_errmsg());
        nv_tokenizer_free(t2);
        check_layout(t, &st);
        int n = round_trip(t, text);
        tpb[v] = (double)n / (double)len;
        /* a held-out story the tokenizer never saw */
        round_trip(t, "Once upon a time, in a quiet village, a curious fox named Pip found a shiny blue stone.\n"
                      "\"What is this?\" he asked. His mother smiled and said, \"It is a gift.\"");
        if (v == 0) {
            /* about as good as the reference tok512 (SentencePiece on TinyStories) */
            const char *ref = t_data("models/tok512.bin");
            nv_tokenizer *r = NULL;
            if (ref && nv_tokenizer_load(ref, 0, &r) == NV_OK) {
                int *ids, nr;
                T_CHECK(nv_tokenizer_encode(r, text, 1, 0, &ids, &nr) == NV_OK, "%s", nv_errmsg());
                printf("    tokens per byte: ours %.4f, tok512 %.4f\n", tpb[0], (double)(nr - 1) / (double)len);
                T_CHECK(n <= (nr - 1) * 1.03, "ours %d tokens, tok512 %d", n, nr - 1);
                free(ids);
                nv_tokenizer_free(r);
            }
        }
        nv_tokenizer_free(t);
    }
    printf("    tokens per byte at 512 / 1024 / 4096: %.4f / %.4f / %.4f\n", tpb[0], tpb[1], tpb[2]);
    T_CHECK(tpb[0] > 0 && tpb[0] < 0.5, "512: %.4f tokens per byte", tpb[0]);
    T_CHECK(tpb[1] > 0 && tpb[1] < tpb[0] * 0.95, "1024 (%.4f) not below 512 (%.4f)", tpb[1], tpb[0]);
    T_CHECK(tpb[2] > 0 && tpb[2] < tpb[1] * 0.95, "4096 (%.4f) not below 1024 (%.4f)", tpb[2], tpb[1]);
    free(text);
}

static void test_deterministic(void) {
    size_t len;
    char *text = read_data("corpus/tinystories_valid_head.txt", &len);
    if (!text) return;
    nv_bpe_result a, b;
    if (train1(text, len, 1024, &a)) {
        if (train1(text, len, 1024, &b)) {
            T_CHECK(a.len == b.len && memcmp(a.data, b.data, a.len) == 0, "two runs differ");
            nv_bpe_result_free(&b);
        }
        /* the first 512 tokens of a 1024 run are a 512 run: the merge order does not depend on
         * the target size */
        if (train1(text, len, 512, &b)) {
            nv_tokenizer *t1 = NULL, *t2 = NULL;
            nv_tokenizer_load(t_write("d1024.bin", a.data, a.len), 0, &t1);
            nv_tokenizer_load(t_write("d512.bin", b.data, b.len), 0, &t2);
            T_CHECK(t1 && t2, "load");
            for (int i = 0; t1 && t2 && i < 512; i++)
                T_CHECK(strcmp(nv_tokenizer_piece(t1, i), nv_tokenizer_piece(t2, i)) == 0, "id %d differs", i);
            nv_tokenizer_free(t1);
            nv_tokenizer_free(t2);
            nv_bpe_result_free(&b);
        }
        nv_bpe_result_free(&a);
    }
    free(text);
}

/* ---- unseen text and reserved pieces ------------------------------------------------------ */

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint32_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static void test_round_trip_unseen_text(void) {
    size_t len;
    char *text = read_data("corpus/tinystories_valid_head.txt", &len);
    if (!text) return;
    nv_tokenizer *t = train_load("rt.bin", text, len > 200000 ? 200000 : len, 512, NULL);
    free(text);
    if (!t) return;
    const char *cases[] = {
        "naïve café — 日本語のテキスト 🙂 Ωμέγα",
        "  two leading spaces, trailing ones   ",
        " one leading space",
        "tabs\tand\r\nCRLF lines\r\n\n\nand blank ones\n",
        "<0x41> <unk> <s> </s> <0xZZ> <0x4 <0x",
        "\xff\xfe broken \xc3 UTF-8 \xe2\x82 here \x80\x80\x80\x80\x80 \xf0\x9f\x99",
        "digits 0123456789 and 3.14159, $100!",
        "x",
        " ",
        "\n",
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) round_trip(t, cases[i]);
    /* random bytes (no NUL), random printable ASCII, random code points */
    char buf[2048];
    for (int iter = 0; iter < 200; iter++) {
        int n = 1 + (int)(rng() % 300), kind = iter % 3, k = 0;
        for (int j = 0; j < n && k < (int)sizeof buf - 5; j++) {
            if (kind == 0) {
                buf[k++] = (char)(1 + rng() % 255);
            } else if (kind == 1) {
                buf[k++] = (char)(32 + rng() % 95);
            } else {
                uint32_t cp = 1 + rng() % 0x10FFFF;
                if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'q';
                if (cp < 0x80) buf[k++] = (char)cp;
                else if (cp < 0x800) buf[k++] = (char)(0xC0 | cp >> 6), buf[k++] = (char)(0x80 | (cp & 63));
                else if (cp < 0x10000)
                    buf[k++] = (char)(0xE0 | cp >> 12), buf[k++] = (char)(0x80 | (cp >> 6 & 63)), buf[k++] = (char)(0x80 | (cp & 63));
                else
                    buf[k++] = (char)(0xF0 | cp >> 18), buf[k++] = (char)(0x80 | (cp >> 12 & 63)),
                    buf[k++] = (char)(0x80 | (cp >> 6 & 63)), buf[k++] = (char)(0x80 | (cp & 63));
            }
        }
        buf[k] = '\0';
        round_trip(t, buf);
    }
    nv_tokenizer_free(t);
}

static void test_reserved_pieces_never_assembled(void) {
    /* A text full of the reserved spellings. A piece like "<0x41" or "1>" would let the encoder
     * join them into the byte token <0x41>, and one starting "<0x" decodes as a byte. The word
     * rules (punctuation, letters and digits split apart) already keep such pieces out; the
     * trainer's reserved-piece check is a second guard. Either way the property must hold. */
    char *text = malloc(200000);
    size_t n = 0;
    const char *line = "<0x41> <unk> <s> </s> x<0x41>y <0x0A>\n<0x41><0x41> <0x41>\n";
    while (n + strlen(line) < 200000) {
        memcpy(text + n, line, strlen(line));
        n += strlen(line);
    }
    nv_bpe_result st;
    nv_tokenizer *t = train_load("reserved.bin", text, n, 600, &st);
    if (t) {
        T_CHECK(st.n_learned > 5, "learned only %d", st.n_learned);
        for (int id = 259 + st.n_chars; id < st.n_tokens; id++) {
            const char *p = nv_tokenizer_piece(t, id);
            T_CHECK(strstr(p, "<0x") != p && strstr(p, " <0x") != p, "piece '%s' decodes as a byte", p);
        }
        text[n] = '\0';
        round_trip(t, line);
        round_trip(t, text);
        int *ids, m;
        T_CHECK(nv_tokenizer_encode(t, "<0x41>", 0, 0, &ids, &m) == NV_OK, "%s", nv_errmsg());
        for (int i = 0; i < m; i++) T_CHECK(ids[i] >= 259, "'<0x41>' encoded to reserved id %d", ids[i]);
        free(ids);
        nv_tokenizer_free(t);
    }
    free(text);
}

static void test_endoftext_is_a_line_break(void) {
    size_t len;
    char *text = read_data("corpus/tinystories_sample.txt", &len);
    if (!text) return;
    T_CHECK(strstr(text, "<|endoftext|>") != NULL, "sample lost its markers");
    nv_bpe_result st;
    nv_tokenizer *t = train_load("eot.bin", text, len, 400, &st);
    if (t) {
        for (int id = 259 + st.n_chars; id < st.n_tokens; id++) {
            const char *p = nv_tokenizer_piece(t, id);
            T_CHECK(strchr(p, '<') == NULL && strchr(p, '|') == NULL && strstr(p, "endof") == NULL, "piece '%s'", p);
        }
        round_trip(t, text);
        nv_tokenizer_free(t);
    }
    free(text);
}

static void test_api_errors(void) {
    nv_bpe_result r;
    nv_bpe_opts o = {.vocab_size = 512};
    nv_iov empty = {"", 0}, lines = {"\n\n\r\n", 4}, ok = {"hello world", 11};
    T_CHECK(nv_bpe_train(&empty, 1, &o, &r) == NV_EINVAL && r.data == NULL, "empty text accepted");
    T_CHECK(nv_bpe_train(&lines, 1, &o, &r) == NV_EINVAL, "only line breaks accepted");
    T_CHECK(nv_bpe_train(NULL, 0, &o, &r) == NV_EINVAL, "no texts accepted");
    o.vocab_size = 258;
    T_CHECK(nv_bpe_train(&ok, 1, &o, &r) == NV_ERANGE, "vocab 258 accepted");
    o.vocab_size = NV_BPE_MAX_VOCAB + 1;
    T_CHECK(nv_bpe_train(&ok, 1, &o, &r) == NV_ERANGE, "huge vocab accepted");
    /* "hello world" keeps 8 characters (h e l o w r d and the space): 267 needed */
    o.vocab_size = 266;
    T_CHECK(nv_bpe_train(&ok, 1, &o, &r) == NV_ERANGE && strstr(nv_errmsg(), "at least 267"), "%s", nv_errmsg());
    o.vocab_size = 267;
    T_CHECK(nv_bpe_train(&ok, 1, &o, &r) == NV_OK && r.n_tokens == 267 && r.n_learned == 0, "%s", nv_errmsg());
    nv_bpe_result_free(&r);
    o.vocab_size = 512;
    o.char_coverage = 1.5;
    T_CHECK(nv_bpe_train(&ok, 1, &o, &r) == NV_EINVAL, "coverage 1.5 accepted");
}

/* ---- the command ------------------------------------------------------------------------- */

static int one_error_line(void) {
    int lines = 0;
    for (const char *s = t_err; *s; s++) lines += *s == '\n';
    return lines == 1 && strncmp(t_err, "nerve tokenizer: ", 17) == 0;
}

static int have_nerve(void) {
    if (access(t_nerve_bin(), X_OK) == 0) return 1;
    t_skip("no nerve binary (build build/nerve or set NERVE_BIN)");
    return 0;
}

static void test_cli_train(void) {
    const char *corpus = t_data("corpus/tinystories_valid_head.txt");
    if (!corpus || !have_nerve()) return;
    char args[2048];
    snprintf(args, sizeof args, "tokenizer train --vocab 512 %s -o %s", corpus, t_path("cli512.bin"));
    int rc = t_nerve(args);
    T_CHECK(rc == 0 && strstr(t_out, "512 tokens"), "exit %d: %s %s", rc, t_out, t_err);
    /* the command writes what the library trains */
    size_t len;
    char *text = NULL, *file = NULL;
    size_t flen = 0;
    nv_file_read_all(corpus, &text, &len);
    nv_file_read_all(t_path("cli512.bin"), &file, &flen);
    nv_bpe_result r;
    if (text && file && train1(text, len, 512, &r)) {
        T_CHECK(flen == r.len && memcmp(file, r.data, r.len) == 0, "CLI output differs from the library's");
        nv_bpe_result_free(&r);
    }
    free(file);
    /* --max-chars cuts at a character boundary: byte 16 is the second byte of the third "é" */
    const char *src = "café café café\ncafé café café\n";
    const char *p = t_write("cafe.txt", src, strlen(src));
    snprintf(args, sizeof args, "tokenizer train --vocab 300 --max-chars 16 %s %s -o %s", p, p, t_path("cut.bin"));
    T_CHECK(t_nerve(args) == 0, "max-chars: %s", t_err);
    file = NULL;
    nv_file_read_all(t_path("cut.bin"), &file, &flen);
    if (file && train1(src, 15, 300, &r)) {
        T_CHECK(flen == r.len && memcmp(file, r.data, r.len) == 0, "--max-chars 16 is not the first 15 bytes");
        nv_bpe_result_free(&r);
    }
    free(file);
    /* several files: the second one adds to the first */
    snprintf(args, sizeof args, "tokenizer train --vocab 300 %s %s -o %s", p, p, t_path("two.bin"));
    T_CHECK(t_nerve(args) == 0 && strstr(t_out, "from 72 bytes"), "two files: %s %s", t_out, t_err);
    /* a folder: its text files in path order, as those files given by name (a hidden one left out) */
    char dir[700], cmd[3000];
    snprintf(dir, sizeof dir, "%s/tokdir", t_tmpdir());
    snprintf(cmd, sizeof cmd, "mkdir -p '%s/b' && cp '%s' '%s/a.txt' && cp '%s' '%s/b/c.txt' && cp '%s' '%s/.skip.txt'", dir, corpus, dir,
             p, dir, p, dir);
    T_CHECK(system(cmd) == 0, "making %s", dir);
    snprintf(args, sizeof args, "tokenizer train --vocab 512 %s -o %s", dir, t_path("dir.bin"));
    T_CHECK(t_nerve(args) == 0, "a folder: %s", t_err);
    snprintf(args, sizeof args, "tokenizer train --vocab 512 %s %s -o %s", corpus, p, t_path("named.bin"));
    T_CHECK(t_nerve(args) == 0, "the same files named: %s", t_err);
    char *from_dir = NULL, *from_named = NULL;
    size_t nd = 0, nn = 0;
    nv_file_read_all(t_path("dir.bin"), &from_dir, &nd);
    nv_file_read_all(t_path("named.bin"), &from_named, &nn);
    T_CHECK(from_dir && from_named && nd == nn && !memcmp(from_dir, from_named, nd), "the folder's tokenizer is not its files'");
    free(from_dir), free(from_named);
    /* help */
    T_CHECK(t_nerve("tokenizer --help") == 0 && strstr(t_out, "--vocab"), "help");
    T_CHECK(t_nerve("tokenizer train --help") == 0 && strstr(t_out, "--max-chars"), "help");
    T_CHECK(t_nerve("--help") == 0 && strstr(t_out, "tokenizer"), "not listed in nerve --help");
    free(text);
}

static void test_cli_errors(void) {
    const char *corpus = t_data("corpus/tinystories_valid_head.txt");
    if (!corpus || !have_nerve()) return;
    const char *o = t_path("bad.bin");
    char args[2048];
    struct {
        const char *fmt;
        int rc;
    } cases[] = {
        {"tokenizer", 2},
        {"tokenizer frobnicate", 2},
        {"tokenizer train %s -o %s", 2},                        /* no --vocab */
        {"tokenizer train --vocab %s -o %s", 2},                /* the corpus as the number */
        {"tokenizer train --vocab abc %s -o %s", 2},
        {"tokenizer train --vocab 100 %s -o %s", 2},
        {"tokenizer train --vocab 99999999999 %s -o %s", 2},
        {"tokenizer train --vocab 270 %s -o %s", 2},            /* fewer than 259 + characters */
        {"tokenizer train --vocab 512 --max-chars 0 %s -o %s", 2},
        {"tokenizer train --vocab 512 --max-chars -5 %s -o %s", 2},
        {"tokenizer train --vocab 512 --bogus %s -o %s", 2},
        {"tokenizer train --vocab 512 %s", 2},                  /* no -o */
        {"tokenizer train --vocab 512 -o", 2},
        {"tokenizer train --vocab 512 -o %s/x.bin", 2},         /* no TEXT */
        {"tokenizer train --vocab 512 %s/missing.txt -o %s", 1},
        {"tokenizer train --vocab 512 %s -o %s/no/such/dir/x.bin", 1},
        {"tokenizer train --vocab 512 %s/notext -o %s", 1},    /* a folder of no text file */
    };
    char notext[700];
    snprintf(notext, sizeof notext, "%s/notext", t_tmpdir());
    T_CHECK(mkdir(notext, 0755) == 0 || errno == EEXIST, "mkdir %s", notext);
    t_write("notext/data.jsonl", "{\"text\": \"a\"}\n", 14);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *a1 = corpus, *a2 = o;
        if (strstr(cases[i].fmt, "%s/missing") || strstr(cases[i].fmt, "%s/notext")) a1 = t_tmpdir();
        if (strstr(cases[i].fmt, "-o %s/")) a2 = t_tmpdir();
        if (strstr(cases[i].fmt, "-o %s/x.bin")) a1 = t_tmpdir();
        snprintf(args, sizeof args, cases[i].fmt, a1, a2);
        int rc = t_nerve(args);
        T_CHECK(rc == cases[i].rc && one_error_line(), "'%s': exit %d (want %d), stderr '%s'", args, rc, cases[i].rc,
                t_err);
    }
    T_CHECK(access(o, F_OK) != 0, "a failed run left %s", o);
    const char *empty = t_write("empty.txt", "", 0), *nl = t_write("nl.txt", "\n\n\n", 3);
    snprintf(args, sizeof args, "tokenizer train --vocab 512 %s %s -o %s", empty, nl, o);
    int rc = t_nerve(args);
    T_CHECK(rc == 1 && one_error_line() && strstr(t_err, "empty"), "empty text: exit %d '%s'", rc, t_err);
    /* a failed run keeps an existing output */
    t_write("keep.bin", "old", 3);
    snprintf(args, sizeof args, "tokenizer train --vocab 512 %s -o %s", empty, t_path("keep.bin"));
    T_CHECK(t_nerve(args) == 1, "empty text");
    char *kept = NULL;
    nv_file_read_all(t_path("keep.bin"), &kept, NULL);
    T_CHECK(kept && strcmp(kept, "old") == 0, "output overwritten by a failed run");
    free(kept);
}

int main(void) {
    T_RUN(test_tiny_corpus_first_merges);
    T_RUN(test_tinystories_vocab_512_1024_4096);
    T_RUN(test_deterministic);
    T_RUN(test_round_trip_unseen_text);
    T_RUN(test_reserved_pieces_never_assembled);
    T_RUN(test_endoftext_is_a_line_break);
    T_RUN(test_api_errors);
    T_RUN(test_cli_train);
    T_RUN(test_cli_errors);
    return t_done();
}
