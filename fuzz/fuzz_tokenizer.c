/* libFuzzer harness: nv_tokenizer_load on untrusted tokenizer.bin files and GGUF vocabularies
 * (SentencePiece and byte-level BPE), then encode/decode.
 *
 * The input is the tokenizer file. A failure must carry one line of message. When it loads
 * (every entry, vocab_size 0), the harness checks src/model/tokenizer.h's contract:
 * - loading it again with vocab_size = its size succeeds with the same size;
 * - every piece is found by nv_tokenizer_lookup (at its own id or an earlier equal one);
 * - encoding a fixed text and the input's last bytes (as text) gives at most strlen + 3 ids,
 *   all in range, ending with EOS when asked; each id decodes.
 * Inputs above 1 MB are skipped. */
#include "fuzz_util.h"
#include "model/tokenizer.h"

#define FZ_MAX_INPUT (1u << 20)
#define FZ_MAX_TEXT 1024
#define FZ_MAX_IDS 2048 /* pieces checked by lookup */

static const char *fixed_text = "Once upon a time, there was a little girl named Lily. \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 "
                                "<0x41> \x80\xbf\xff\t\n  end I'll 12345 <|im_start|>user<|im_end|><think>";

static volatile size_t sink;

static void check_encode(const nv_tokenizer *t, const char *text, int bos, int eos) {
    int *ids = NULL, n = -1;
    fz_clear_error();
    nv_err e = nv_tokenizer_encode(t, text, bos, eos, &ids, &n);
    fz_check_error(e, "nv_tokenizer_encode");
    FZ_CHECK(e == NV_OK, "encode failed: %s", nv_errmsg());
    int vocab = nv_tokenizer_vocab_size(t);
    /* a byte an id at most, a dummy prefix per piece between special tokens (each a byte at least), BOS, EOS */
    FZ_CHECK(n >= 0 && (size_t)n <= 2 * strlen(text) + 3, "%d ids for %zu bytes", n, strlen(text));
    /* BOS is not checked: like run.c, the merges may join it with what follows when the
     * vocabulary has such a piece (an empty or odd BOS piece). */
    FZ_CHECK(!bos || n >= 1 || nv_tokenizer_bos(t) < 0, "no ids with BOS asked for");
    if (eos && nv_tokenizer_eos(t) >= 0) FZ_CHECK(n >= 1 && ids[n - 1] == nv_tokenizer_eos(t), "no EOS last");
    for (int i = 0; i < n; i++) {
        FZ_CHECK(ids[i] >= 0 && ids[i] < vocab, "id %d out of range [0, %d)", ids[i], vocab);
        const char *p = nv_tokenizer_decode(t, i ? ids[i - 1] : NV_TOKEN_BOS, ids[i]);
        FZ_CHECK(p != NULL, "id %d does not decode", ids[i]);
        sink += strlen(p) + (size_t)nv_piece_printable(p);
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > FZ_MAX_INPUT) return -1;
    char path[512];
    if (fz_write_temp("tok", data, size, path, sizeof path) != 0) return 0;
    nv_tokenizer *t = (nv_tokenizer *)&sink, *t2 = NULL; /* t must be reset to NULL on failure */
    fz_clear_error();
    nv_err e = nv_tokenizer_load(path, 0, &t), e2 = NV_OK;
    char msg[1024] = "";
    int vocab = e == NV_OK ? nv_tokenizer_vocab_size(t) : 0;
    if (e == NV_OK) { /* the same file read with its size given */
        e2 = nv_tokenizer_load(path, vocab, &t2);
        snprintf(msg, sizeof msg, "%s", nv_errmsg());
    }
    unlink(path);
    fz_check_error(e, "nv_tokenizer_load");
    if (e != NV_OK) {
        FZ_CHECK(t == NULL, "*out not cleared on failure");
        return 0;
    }
    FZ_CHECK(vocab >= 3, "vocabulary of %d tokens accepted", vocab);
    FZ_CHECK(e2 == NV_OK && nv_tokenizer_vocab_size(t2) == vocab, "reload with vocab_size %d: %s", vocab, msg);
    nv_tokenizer_free(t2);

    int limit = vocab < FZ_MAX_IDS ? vocab : FZ_MAX_IDS;
    for (int i = 0; i < limit; i++) {
        const char *p = nv_tokenizer_piece(t, i);
        FZ_CHECK(p != NULL, "piece %d missing", i);
        int j = nv_tokenizer_lookup(t, p);
        FZ_CHECK(j >= 0 && j <= i && strcmp(nv_tokenizer_piece(t, j), p) == 0, "piece %d found at %d", i, j);
        sink += (size_t)(nv_tokenizer_score(t, i) > 0);
        FZ_CHECK(nv_tokenizer_decode(t, i ? i - 1 : 0, i) != NULL, "piece %d does not decode", i);
    }
    FZ_CHECK(nv_tokenizer_piece(t, vocab) == NULL && nv_tokenizer_piece(t, -1) == NULL &&
                 nv_tokenizer_decode(t, 0, vocab) == NULL && nv_tokenizer_decode(t, 0, -1) == NULL,
             "out-of-range ids accepted");

    check_encode(t, fixed_text, 1, 1);
    check_encode(t, "", 1, 0);
    size_t n = size < FZ_MAX_TEXT ? size : FZ_MAX_TEXT;
    char *text = fz_text(data + size - n, n);
    if (text) {
        check_encode(t, text, 1, 0);
        check_encode(t, text, 0, 1);
        free(text);
    }
    nv_tokenizer_free(t);
    return 0;
}
