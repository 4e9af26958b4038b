/* libFuzzer harness: nerve perplexity --multiple-choice's task files (llama.cpp's HellaSwag text, or
 * JSON Lines of {"ctx", "endings", "label"} and the other names src/model/choice.h reads) through
 * nv_choice_load, and the first tasks of a file that loads through nv_choice_score on a tiny random
 * model with stories260K's tokenizer (shared data, else the stand-in).
 *
 * Checked: a failure carries a message and leaves nothing allocated; a success holds at least one
 * task, each with a context, 2..16 choices and a gold index among them; scoring counts every task
 * once, as scored or left out, with no more right answers than tasks. A temporary file that cannot
 * be written aborts. Inputs above 64 KB are skipped. */
#include "fuzz_util.h"
#include "model/choice.h"

#define FZ_MAX_INPUT (64u << 10)
#define FZ_SCORED 3

static nv_tokenizer *tok;
static nv_model model;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    tok = fz_tok512("fuzz_choice");
    /* a model of the tokenizer's vocabulary with a short context, so long choices are left out */
    const nv_config c = {16, 32, 1, 2, 2, 8, FZ_TOK_VOCAB, 48, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    if (nv_engines_init(NULL, 1) != NV_OK || nv_model_alloc(&model, &c) != NV_OK) abort();
    nv_model_init_random(&model, 5);
    if (nv_model_build_plans(&model, NV_ENGINE_SCALAR) != NV_OK) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > FZ_MAX_INPUT) return -1;
    char path[512];
    if (fz_write_temp_as("choice", ".txt", data, size, path, sizeof path) != 0) abort();
    nv_choice_set set;
    fz_clear_error();
    if (nv_choice_load(path, &set) != NV_OK) {
        FZ_CHECK(nv_errmsg()[0] != '\0' && set.t == NULL && set.n == 0, "a failure without a message, or left allocated");
        unlink(path);
        return 0;
    }
    FZ_CHECK(set.n >= 1, "loaded without a task");
    for (int i = 0; i < set.n; i++) {
        const nv_choice_task *t = &set.t[i];
        FZ_CHECK(t->context && t->n_choices >= 2 && t->n_choices <= NV_CHOICE_MAX && t->gold >= 0 && t->gold < t->n_choices,
                 "task %d: %d choices, gold %d", i, t->n_choices, t->gold);
        for (int k = 0; k < t->n_choices; k++) FZ_CHECK(t->choices[k] != NULL, "task %d choice %d missing", i, k);
    }
    nv_choice_result r;
    const int want = set.n < FZ_SCORED ? set.n : FZ_SCORED;
    FZ_CHECK(nv_choice_score(&model, tok, &set, FZ_SCORED, &r, NULL) == NV_OK, "%s", nv_errmsg());
    FZ_CHECK(r.tasks + r.skipped == want && r.right_sum <= r.tasks && r.right_mean <= r.tasks && r.right_sum >= 0,
             "%d scored + %d left out of %d; right %d / %d", r.tasks, r.skipped, want, r.right_sum, r.right_mean);
    nv_choice_free(&set);
    unlink(path);
    return 0;
}
