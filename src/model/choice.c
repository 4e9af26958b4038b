#include "model/choice.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/file.h"
#include "base/timer.h"
#include "model/forward.h"
#include "model/sampler.h"

#define ROWS 64 /* tokens a forward pass */

void nv_choice_free(nv_choice_set *s) {
    for (int i = 0; i < s->n; i++) {
        free(s->t[i].context);
        for (int k = 0; k < s->t[i].n_choices; k++) free(s->t[i].choices[k]);
    }
    free(s->t);
    memset(s, 0, sizeof *s);
}

static nv_choice_task *next_task(nv_choice_set *s, int *cap) {
    if (s->n == *cap) {
        const int nc = *cap ? *cap * 2 : 256;
        nv_choice_task *t = realloc(s->t, (size_t)nc * sizeof *t);
        if (!t) return NULL;
        s->t = t;
        *cap = nc;
    }
    nv_choice_task *t = &s->t[s->n++];
    memset(t, 0, sizeof *t);
    return t;
}

/* The index a gold field gives: a number, a string of digits, or a letter A..P. -1 when none. */
static int gold_index(const cJSON *g) {
    if (cJSON_IsNumber(g))
        return g->valuedouble >= 0 && g->valuedouble <= 1000 && g->valuedouble == floor(g->valuedouble) ? (int)g->valuedouble : -1;
    if (!cJSON_IsString(g) || !g->valuestring[0]) return -1;
    const char *v = g->valuestring;
    if (!v[1] && v[0] >= 'A' && v[0] < 'A' + NV_CHOICE_MAX) return v[0] - 'A';
    char *end;
    const long n = strtol(v, &end, 10);
    return *end || !isdigit((unsigned char)v[0]) || n > 1000 ? -1 : (int)n;
}

static const cJSON *first_field(const cJSON *o, const char *const *names) {
    for (; *names; names++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, *names);
        if (f) return f;
    }
    return NULL;
}

static nv_err json_task(const char *path, long line_no, const cJSON *o, nv_choice_task *t) {
    static const char *const ctx_names[] = {"ctx", "context", "prompt", "question", "query", NULL};
    static const char *const choice_names[] = {"endings", "choices", "options", NULL};
    static const char *const gold_names[] = {"label", "answer", "gold", NULL};
    if (!cJSON_IsObject(o)) return nv_fail(NV_EFORMAT, "%s:%ld: not a JSON object", path, line_no);
    const cJSON *ctx = first_field(o, ctx_names), *choices = first_field(o, choice_names), *gold = first_field(o, gold_names);
    if (!cJSON_IsString(ctx))
        return nv_fail(NV_EFORMAT, "%s:%ld: no context: give \"ctx\", \"context\", \"prompt\", \"question\" or \"query\" as "
                                   "a string", path, line_no);
    const int n = cJSON_GetArraySize(choices);
    if (!cJSON_IsArray(choices) || n < 2 || n > NV_CHOICE_MAX)
        return nv_fail(NV_EFORMAT, "%s:%ld: the choices (\"endings\", \"choices\" or \"options\") must be a list of 2 to %d "
                                   "strings", path, line_no, NV_CHOICE_MAX);
    t->gold = gold_index(gold);
    if (t->gold < 0 || t->gold >= n)
        return nv_fail(NV_EFORMAT, "%s:%ld: the gold choice (\"label\", \"answer\" or \"gold\": an index, or a letter) must "
                                   "name one of the %d choices", path, line_no, n);
    const cJSON *label = cJSON_GetObjectItemCaseSensitive(o, "activity_label"); /* HellaSwag's, as llama.cpp's file */
    const size_t need = strlen(ctx->valuestring) + (cJSON_IsString(label) ? strlen(label->valuestring) + 2 : 0) + 1;
    if (!(t->context = malloc(need))) return nv_fail(NV_ENOMEM, "out of memory reading %s", path);
    snprintf(t->context, need, "%s%s%s", cJSON_IsString(label) ? label->valuestring : "", cJSON_IsString(label) ? ": " : "",
             ctx->valuestring);
    const cJSON *c;
    cJSON_ArrayForEach(c, choices) {
        if (!cJSON_IsString(c)) return nv_fail(NV_EFORMAT, "%s:%ld: choice %d is not a string", path, line_no, t->n_choices);
        if (!(t->choices[t->n_choices] = strdup(c->valuestring))) return nv_fail(NV_ENOMEM, "out of memory reading %s", path);
        t->n_choices++;
    }
    return NV_OK;
}

/* Line i of the text (its end cut at \r\n or \n), NUL-terminated in place. */
static char **split_lines(char *text, size_t len, int *n) {
    int cap = 0, k = 0;
    char **lines = NULL;
    for (size_t at = 0; at < len;) {
        char *nl = memchr(text + at, '\n', len - at);
        const size_t end = nl ? (size_t)(nl - text) : len;
        if (k == cap) {
            cap = cap ? cap * 2 : 1024;
            char **l = realloc(lines, (size_t)cap * sizeof *l);
            if (!l) {
                free(lines);
                return NULL;
            }
            lines = l;
        }
        text[end] = '\0';
        if (end > at && text[end - 1] == '\r') text[end - 1] = '\0';
        lines[k++] = text + at;
        at = end + 1;
    }
    *n = k;
    return lines ? lines : calloc(1, sizeof *lines);
}

nv_err nv_choice_load(const char *path, nv_choice_set *out) {
    memset(out, 0, sizeof *out);
    char *text = NULL;
    size_t len = 0;
    NV_TRY(nv_file_read_all(path, &text, &len));
    size_t first = 0; /* before the lines are cut: their ends become NULs */
    while (first < len && isspace((unsigned char)text[first])) first++;
    const int json = first < len && text[first] == '{';
    int n_lines = 0, cap = 0;
    char **lines = split_lines(text, len, &n_lines);
    nv_err e = lines ? NV_OK : nv_fail(NV_ENOMEM, "out of memory reading %s", path);
    if (e == NV_OK && json) {
        for (int i = 0; i < n_lines && e == NV_OK; i++) {
            const char *l = lines[i];
            while (isspace((unsigned char)*l)) l++;
            if (!*l) continue;
            cJSON *o = cJSON_Parse(l);
            nv_choice_task *t = o ? next_task(out, &cap) : NULL;
            if (!o) e = nv_fail(NV_EFORMAT, "%s:%d: not JSON (a task a line)", path, i + 1);
            else if (!t) e = nv_fail(NV_ENOMEM, "out of memory reading %s", path);
            else e = json_task(path, i + 1, o, t);
            cJSON_Delete(o);
        }
    } else if (e == NV_OK) { /* llama.cpp's HellaSwag text: 6 lines a task */
        while (n_lines > 0 && !lines[n_lines - 1][0]) n_lines--;
        if (n_lines % 6)
            e = nv_fail(NV_EFORMAT, "%s: %d lines: llama.cpp's HellaSwag text has 6 a task (the context, the gold ending's "
                                    "index, four endings), or give JSON Lines", path, n_lines);
        for (int i = 0; i + 5 < n_lines && e == NV_OK; i += 6) {
            nv_choice_task *t = next_task(out, &cap);
            if (!t) {
                e = nv_fail(NV_ENOMEM, "out of memory reading %s", path);
                break;
            }
            char *end;
            const long g = strtol(lines[i + 1], &end, 10);
            if (end == lines[i + 1] || *end || g < 0 || g > 3) {
                e = nv_fail(NV_EFORMAT, "%s:%d: the gold ending's index must be 0..3, not '%.40s'", path, i + 2, lines[i + 1]);
                break;
            }
            t->gold = (int)g;
            if (!(t->context = strdup(lines[i]))) e = nv_fail(NV_ENOMEM, "out of memory reading %s", path);
            for (int k = 0; k < 4 && e == NV_OK; k++) {
                if (!(t->choices[k] = strdup(lines[i + 2 + k]))) e = nv_fail(NV_ENOMEM, "out of memory reading %s", path);
                else t->n_choices++;
            }
        }
    }
    if (e == NV_OK && !out->n) e = nv_fail(NV_EFORMAT, "%s: no tasks", path);
    free(lines);
    free(text);
    if (e != NV_OK) nv_choice_free(out);
    return e;
}

/* The context and a choice as one text: a space between unless one side has it. */
static char *join(const char *ctx, const char *choice) {
    const size_t a = strlen(ctx), b = strlen(choice);
    const int space = a && b && !isspace((unsigned char)ctx[a - 1]) && !isspace((unsigned char)choice[0]);
    char *s = malloc(a + b + 2);
    if (s) snprintf(s, a + b + 2, "%s%s%s", ctx, space ? " " : "", choice);
    return s;
}

/* Runs tokens [from, to) at their positions, ROWS a pass; with sum, adds the log-probability each
   position gives the token after it (tokens[to] must exist). */
static nv_err run_span(const nv_model *m, nv_state *s, const int *tokens, int from, int to, double *sum, double *ran) {
    const int V = m->config.vocab_size;
    for (int at = from; at < to; at += ROWS) {
        const int n = to - at < ROWS ? to - at : ROWS;
        NV_TRY(sum ? nv_forward_rows(m, s, tokens + at, n, at, n) : nv_forward(m, s, tokens + at, n, at));
        *ran += n;
        for (int r = 0; sum && r < n; r++) {
            const float *row = s->logits + (size_t)r * V;
            *sum += (double)row[tokens[at + r + 1]] - nv_logits_logz(row, V);
        }
    }
    return NV_OK;
}

nv_err nv_choice_score(const nv_model *m, const nv_tokenizer *tok, const nv_choice_set *set, int max_tasks,
                       nv_choice_result *r, void (*progress)(const nv_choice_result *r, int done, int total)) {
    memset(r, 0, sizeof *r);
    const int total = max_tasks > 0 && max_tasks < set->n ? max_tasks : set->n, ctx = m->config.seq_len;
    nv_state st = {0};
    NV_TRY(nv_state_init(&st, &m->config, ROWS, ctx, 0));
    int *ids[NV_CHOICE_MAX] = {0}, n_ids[NV_CHOICE_MAX] = {0};
    nv_err e = NV_OK;
    const double t0 = nv_now();
    for (int ti = 0; ti < total && e == NV_OK; ti++) {
        const nv_choice_task *t = &set->t[ti];
        for (int k = 0; k < t->n_choices && e == NV_OK; k++) {
            char *text = join(t->context, t->choices[k]);
            e = text ? nv_tokenizer_encode(tok, text, nv_tokenizer_adds_bos(tok), 0, &ids[k], &n_ids[k])
                     : nv_fail(NV_ENOMEM, "out of memory");
            free(text);
        }
        /* the tokens every choice shares: run once; each choice's own are scored */
        int shared = e == NV_OK ? n_ids[0] : 0, fits = 1;
        for (int k = 1; k < t->n_choices && e == NV_OK; k++) {
            int p = 0;
            while (p < shared && p < n_ids[k] && ids[k][p] == ids[0][p]) p++;
            shared = p;
        }
        for (int k = 0; k < t->n_choices && e == NV_OK; k++) fits &= n_ids[k] <= ctx && n_ids[k] > shared;
        if (e == NV_OK && (!fits || shared < 1)) {
            r->skipped++; /* past the context, a choice with no token of its own, or nothing to predict from */
        } else if (e == NV_OK) {
            double sums[NV_CHOICE_MAX];
            e = run_span(m, &st, ids[0], 0, shared - 1, NULL, &r->tokens);
            int best_sum = 0, best_mean = 0;
            for (int k = 0; k < t->n_choices && e == NV_OK; k++) {
                sums[k] = 0;
                /* a windowed layer's ring gone past the shared tokens (a long choice before): run them again */
                if (!nv_state_resumable(&st, shared - 1)) e = run_span(m, &st, ids[k], 0, shared - 1, NULL, &r->tokens);
                if (e == NV_OK) e = run_span(m, &st, ids[k], shared - 1, n_ids[k] - 1, &sums[k], &r->tokens);
                if (e != NV_OK) break;
                if (sums[k] > sums[best_sum]) best_sum = k;
                if (sums[k] / (n_ids[k] - shared) > sums[best_mean] / (n_ids[best_mean] - shared)) best_mean = k;
            }
            if (e == NV_OK) {
                r->tasks++;
                r->right_sum += best_sum == t->gold;
                r->right_mean += best_mean == t->gold;
            }
        }
        for (int k = 0; k < NV_CHOICE_MAX; k++) free(ids[k]), ids[k] = NULL, n_ids[k] = 0;
        r->seconds = nv_now() - t0;
        if (e == NV_OK && progress) progress(r, ti + 1, total);
    }
    nv_state_free(&st);
    return e;
}
