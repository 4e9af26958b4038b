/* nerve perplexity --multiple-choice: a model's accuracy on multiple-choice tasks (llama.cpp's
 * llama-perplexity --hellaswag / --multiple-choice, lm-evaluation-harness's acc and acc_norm): each
 * choice is scored by the log-probability the model gives its tokens after the shared context, and
 * the task is right when the best choice is the gold one. */
#ifndef NV_CHOICE_H
#define NV_CHOICE_H

#include "base/err.h"
#include "model/model.h"
#include "model/tokenizer.h"

#define NV_CHOICE_MAX 16 /* choices a task */

typedef struct {
    char *context;
    char *choices[NV_CHOICE_MAX];
    int n_choices, gold;
} nv_choice_task;

typedef struct {
    nv_choice_task *t;
    int n;
} nv_choice_set;

/* Reads FILE: llama.cpp's HellaSwag text (6 lines a task: the context, the gold ending's index, four
 * endings) or, when its first non-blank character is '{', JSON Lines of one task each: the context in
 * "ctx" (with "activity_label" before it, as llama.cpp's file has it), "context", "prompt",
 * "question" or "query"; 2..16 choices in "endings", "choices" or "options"; the gold one's index in
 * "label", "answer" or "gold" (a number, a string of digits, or a letter A..P). Errors name the file
 * and the line. */
nv_err nv_choice_load(const char *path, nv_choice_set *out);
void nv_choice_free(nv_choice_set *s);

typedef struct {
    int tasks, skipped;   /* scored; left out (a choice past the model's context, or one with no token of its own) */
    int right_sum, right_mean; /* best by the summed log-probability; by the mean a token (llama.cpp's) */
    double seconds, tokens;    /* in forward passes, and the tokens they ran */
} nv_choice_result;

/* Scores the first max_tasks tasks (0: all) with m (plans built) through a state of its own: a
 * task's text is the context, a space (unless one side has it) and a choice, encoded whole with BOS
 * where the vocabulary adds one; the tokens every choice shares run once, then each choice's from
 * there. progress (may be NULL) is called after every task. */
nv_err nv_choice_score(const nv_model *m, const nv_tokenizer *tok, const nv_choice_set *set, int max_tasks,
                       nv_choice_result *r, void (*progress)(const nv_choice_result *r, int done, int total));

#endif
