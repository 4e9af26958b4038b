/* libFuzzer harness: nerve train's chat data (a .jsonl file of {"messages": [...], "tools": [...]}
 * lines, OpenAI's chat fine-tuning format; or preference pairs, OpenAI's or TRL's) through
 * nv_dataset_open_chat under the plain, chatml, llama2, llama3, granite and mistral templates,
 * with stories260K's tokenizer (models/tok512.bin from the shared data, else a stand-in).
 *
 * Checked, as src/train/data.h promises: a failure leaves a message and nothing open; a success
 * holds turns whose starts rise strictly to the source's end, tokens within the vocabulary, a
 * first token never trained and the trained ones a suffix of each turn (the answer after its
 * prompt), at least one of them per turn; the training/validation split falls on a turn, and
 * n_train is where it falls; training and validation windows (a window shorter than some turns,
 * so turns are cut), one turn each and packed, hold inputs within the vocabulary and targets that
 * are -1 or within it; preference data's pairs are whole (two turns each, split between pairs, their
 * batches' pair numbers in the training or validation range). A temporary file that cannot be written aborts (a campaign that tests
 * nothing must not read as one that found nothing). */
#include "fuzz_util.h"
#include "train/data.h"

#define FZ_MAX_INPUT (1u << 18)
#define FZ_T 24
#define FZ_B 3

static nv_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    tok = fz_tok512("fuzz_chat");
    return 0;
}

static void check_source(const nv_source *s) {
    FZ_CHECK(s->starts && s->trained && s->n_starts >= 1, "a chat source without turns");
    FZ_CHECK(s->starts[0] == 0 && s->starts[s->n_starts] == s->n_tokens, "starts %llu..%llu of %llu",
             (unsigned long long)s->starts[0], (unsigned long long)s->starts[s->n_starts], (unsigned long long)s->n_tokens);
    FZ_CHECK(s->n_train_starts <= s->n_starts && s->n_train == s->starts[s->n_train_starts], "split at turn %llu",
             (unsigned long long)s->n_train_starts);
    for (uint64_t t = 0; t < s->n_starts; t++) {
        const uint64_t from = s->starts[t], end = s->starts[t + 1];
        FZ_CHECK(end > from, "turn %llu is empty", (unsigned long long)t);
        FZ_CHECK(!s->trained[from], "turn %llu trains its first token", (unsigned long long)t);
        int answer = 0;
        for (uint64_t j = from; j < end; j++) {
            FZ_CHECK(nv_source_token(s, j) < FZ_TOK_VOCAB, "token %u", nv_source_token(s, j));
            FZ_CHECK(s->trained[j] <= 1 && (!answer || s->trained[j]), "turn %llu: a prompt token after its answer began",
                     (unsigned long long)t);
            answer |= s->trained[j];
        }
        FZ_CHECK(answer, "turn %llu has no answer token", (unsigned long long)t);
    }
}

static void check_windows(const int *in, const int *tg, int n) {
    for (int i = 0; i < n; i++) {
        FZ_CHECK(in[i] >= 0 && in[i] < FZ_TOK_VOCAB, "input %d", in[i]);
        FZ_CHECK(tg[i] >= -1 && tg[i] < FZ_TOK_VOCAB, "target %d", tg[i]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > FZ_MAX_INPUT) return -1;
    /* the loader knows chat data by the name's ending; a campaign that tests nothing must not look
       like one that found nothing */
    char path[512];
    if (fz_write_temp_as("chat", ".jsonl", data, size, path, sizeof path) != 0) abort();
    const nv_chat_template all[] = {NV_CHAT_PLAIN, NV_CHAT_CHATML, NV_CHAT_LLAMA2, NV_CHAT_LLAMA3, NV_CHAT_GRANITE, NV_CHAT_MISTRAL,
                                    NV_CHAT_PHI4_MINI, NV_CHAT_PHI4, NV_CHAT_OLMO2, NV_CHAT_SMOLLM3};
    const char *paths[] = {path};
    for (int k = 0; k < (int)(sizeof all / sizeof all[0]); k++) {
        nv_dataset ds;
        fz_clear_error(); /* a failure must leave its own message */
        if (nv_dataset_open_chat(&ds, paths, 1, tok, FZ_TOK_VOCAB, 0.25f, all[k]) != NV_OK) {
            FZ_CHECK(nv_errmsg()[0] != '\0' && ds.src == NULL, "a failure without a message, or left open");
            continue;
        }
        if (nv_data_jsonl_is_text(path)) { /* {"text": ...} lines: documents, every token in the vocabulary */
            FZ_CHECK(ds.n_src == 1 && !ds.chat && !ds.src[0].starts, "text lines read as chat data");
            for (uint64_t i = 0; i < ds.src[0].n_tokens; i++)
                FZ_CHECK(nv_source_token(&ds.src[0], i) < FZ_TOK_VOCAB, "text token out of the vocabulary");
            nv_dataset_close(&ds);
            continue;
        }
        FZ_CHECK(ds.n_src == 1 && ds.chat, "not read as chat data");
        check_source(&ds.src[0]);
        int in[FZ_B * FZ_T], tg[FZ_B * FZ_T], seg[FZ_B * FZ_T];
        nv_data_cursor c;
        nv_data_cursor_init(&c, 1);
        FZ_CHECK(ds.src[0].n_train_starts > 0, "no training turn (the split keeps one)");
        for (int it = 0; it < 4; it++) { /* one turn a window, then packed */
            ds.pack = it >= 2;
            FZ_CHECK(nv_data_next_batch(&ds, &c, FZ_B, FZ_T, in, tg, seg) == NV_OK, "%s", nv_errmsg());
            check_windows(in, tg, FZ_B * FZ_T);
            /* each row's document starts at or before it, no earlier than the row before's; one
               turn a window: every row's at 0 */
            for (int r = 0; r < FZ_B * FZ_T; r++) {
                const int t = r % FZ_T;
                FZ_CHECK(seg[r] >= 0 && seg[r] <= t && (t == 0 || seg[r] >= seg[r - 1]) && (ds.pack || seg[r] == 0),
                         "row %d: document start %d", r, seg[r]);
            }
        }
        ds.pack = 0;
        for (int i = 0; i < 2 && nv_data_val_batch(&ds, i, FZ_B, FZ_T, in, tg); i++) check_windows(in, tg, FZ_B * FZ_T);
        if (ds.pref) { /* whole pairs: two turns each, the split between pairs, batches of pairs in range */
            const nv_source *s = &ds.src[0];
            FZ_CHECK(s->pairs && s->n_starts % 2 == 0 && s->n_train_starts % 2 == 0 && nv_data_pairs(&ds) == s->n_starts / 2,
                     "%llu turns, %llu training, as pairs", (unsigned long long)s->n_starts,
                     (unsigned long long)s->n_train_starts);
            int pin[2 * FZ_T], ptg[2 * FZ_T];
            uint64_t ids[1];
            FZ_CHECK(nv_data_next_pairs(&ds, &c, 2, FZ_T, pin, ptg, ids) == NV_OK && ids[0] < s->n_train_starts / 2,
                     "training pair %llu: %s", (unsigned long long)ids[0], nv_errmsg());
            check_windows(pin, ptg, 2 * FZ_T);
            if (nv_data_val_pairs(&ds, 0, 2, FZ_T, pin, ptg, ids)) {
                FZ_CHECK(ids[0] >= s->n_train_starts / 2 && ids[0] < s->n_starts / 2, "validation pair %llu",
                         (unsigned long long)ids[0]);
                check_windows(pin, ptg, 2 * FZ_T);
            }
        }
        (void)nv_dataset_unigram_loss(&ds, FZ_TOK_VOCAB);
        nv_dataset_close(&ds);
    }
    unlink(path);
    return 0;
}
