/* nerve perplexity end to end: its figure against the log-likelihood computed here token by token,
 * chunking and --val-frac, the KL divergence statistics against a reference, and its errors. */
#include <cjson/cJSON.h>

#include "base/buf.h"
#include "engine/engine.h"
#include "forward_ref.h"
#include "model/tokenizer.h"
#include "t.h"

#define CTX 64

/* The number field key of t_out's JSON object (NAN when missing); sub names an object inside. */
static double json_num(const char *sub, const char *key) {
    cJSON *o = cJSON_Parse(t_out), *in = sub ? cJSON_GetObjectItemCaseSensitive(o, sub) : o;
    cJSON *v = cJSON_GetObjectItemCaseSensitive(in, key);
    double r = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    cJSON_Delete(o);
    return r;
}

/* The shared TinyStories validation text's first n tokens (BOS-led stories) as a uint16 shard. */
static const char *write_shard(const char *name, const nv_tokenizer *tok, int n, int **ids_out) {
    const char *txt = t_data("corpus/tinystories_valid_head.txt");
    if (!txt) return NULL;
    char *text = NULL;
    size_t len = 0;
    int *ids = NULL, nids = 0;
    if (nv_file_read_all(txt, &text, &len) != NV_OK) return NULL;
    if (len > 65536) text[65536] = '\0';
    int ok = nv_tokenizer_encode(tok, text, 1, 0, &ids, &nids) == NV_OK && nids >= n;
    free(text);
    T_CHECK(ok, "the text gives %d tokens, %d wanted", nids, n);
    if (!ok) {
        free(ids);
        return NULL;
    }
    uint16_t *u = malloc((size_t)n * sizeof *u);
    for (int i = 0; i < n; i++) u[i] = (uint16_t)ids[i];
    const char *p = t_write(name, u, (size_t)n * sizeof *u);
    free(u);
    *ids_out = ids;
    return p;
}

/* -log p of every scored position of chunks [0, chunks) of ids, as llama.cpp scores them: each chunk
 * of CTX tokens starts at BOS, predictions from position CTX/2 to CTX-2 count. */
static double reference_ppl(const nv_model *m, const int *ids, int chunks, int bos, int *scored) {
    const int V = m->config.vocab_size;
    float *logits = malloc((size_t)CTX * V * sizeof(float));
    int chunk[CTX];
    double sum = 0;
    *scored = 0;
    for (int c = 0; c < chunks; c++) {
        memcpy(chunk, ids + (size_t)c * CTX, sizeof chunk);
        chunk[0] = bos;
        T_CHECK(t_forward_logits(m, chunk, CTX, logits), "forward failed");
        for (int p = CTX / 2; p < CTX - 1; p++) {
            const float *l = logits + (size_t)p * V;
            double mx = l[0], z = 0;
            for (int i = 1; i < V; i++) mx = l[i] > mx ? l[i] : mx;
            for (int i = 0; i < V; i++) z += exp(l[i] - mx);
            sum += mx + log(z) - l[chunk[p + 1]];
            (*scored)++;
        }
    }
    free(logits);
    return exp(sum / *scored);
}

/* stories260K and its tokenizer from the shared data, copied out of t_data's rotating buffers; 0
 * after marking the case skipped. */
static int shared_model(char model[600], char tokp[600]) {
    const char *mp = t_data("models/stories260K.bin"), *zp = t_data("models/tok512.bin");
    if (!mp || !zp) return 0;
    snprintf(model, 600, "%s", mp);
    snprintf(tokp, 600, "%s", zp);
    return 1;
}

static void test_perplexity_matches_token_by_token(void) {
    char model[600], tokp[600], args[3000];
    if (!shared_model(model, tokp)) return;
    nv_tokenizer *tok = NULL;
    nv_model m;
    int *ids = NULL;
    if (nv_tokenizer_load(tokp, 512, &tok) != NV_OK || nv_model_load(model, &m) != NV_OK) {
        T_CHECK(0, "load: %s", nv_errmsg());
        return;
    }
    const char *shard = write_shard("stories.bin", tok, 4 * CTX + 10, &ids);
    if (!shard) goto out;
    char shard_path[600];
    snprintf(shard_path, sizeof shard_path, "%s", shard);
    /* the CLI's figure (64-token passes, the fp32 engine) against one token at a time on scalar */
    T_CHECK(nv_engines_init(NULL, 1) == NV_OK && nv_model_build_plans(&m, NV_ENGINE_SCALAR) == NV_OK, "%s", nv_errmsg());
    int scored = 0;
    const double want = reference_ppl(&m, ids, 3, nv_tokenizer_bos(tok), &scored);
    snprintf(args, sizeof args, "perplexity -m %s -z %s -f %s --ctx %d --chunks 3 --engine scalar --json", model, tokp, shard_path, CTX);
    int rc = t_nerve(args);
    T_CHECK(rc == 0, "exit %d: %s", rc, t_err);
    T_CHECK(fabs(json_num(NULL, "ppl") - want) <= 1e-5 * want, "ppl %.8f, token by token %.8f", json_num(NULL, "ppl"), want);
    T_CHECK(json_num(NULL, "scored") == scored && scored == 3 * (CTX / 2 - 1), "scored %g of %d", json_num(NULL, "scored"), scored);
    T_CHECK(json_num(NULL, "chunks") == 3 && json_num(NULL, "ctx") == CTX, "chunks %g ctx %g", json_num(NULL, "chunks"), json_num(NULL, "ctx"));
    T_CHECK(json_num(NULL, "ppl_err") > 0 && json_num(NULL, "ppl_err") < want, "ppl_err %g", json_num(NULL, "ppl_err"));
    /* every whole chunk by default: 4 (the 10 tokens after them are not a chunk) */
    snprintf(args, sizeof args, "perplexity -m %s -z %s -f %s --ctx %d --json", model, tokp, shard_path, CTX);
    T_CHECK(t_nerve(args) == 0 && json_num(NULL, "chunks") == 4, "default chunks %g: %s", json_num(NULL, "chunks"), t_err);
    /* the text form: the final estimate on stdout, the running figures on stderr */
    snprintf(args, sizeof args, "perplexity -m %s -z %s -f %s --ctx %d --chunks 3 --engine scalar", model, tokp, shard_path, CTX);
    T_CHECK(t_nerve(args) == 0, "%s", t_err);
    char line[128];
    snprintf(line, sizeof line, "Final estimate: PPL = %.4f", want);
    T_CHECK(strstr(t_out, line) != NULL, "stdout %s, wanted %s", t_out, line);
    T_CHECK(strstr(t_err, "[1]") && strstr(t_err, ",[3]"), "no running figures: %s", t_err);
    /* --val-frac 0.5: the second half of the shard only, as a shard of that half alone scores */
    const int n = 4 * CTX + 10, held = n - (n - (int)((double)n * 0.5f));
    uint16_t *half = malloc((size_t)held * sizeof *half);
    for (int i = 0; i < held; i++) half[i] = (uint16_t)ids[n - held + i];
    char half_path[600];
    snprintf(half_path, sizeof half_path, "%s", t_write("half.bin", half, (size_t)held * sizeof *half));
    free(half);
    snprintf(args, sizeof args, "perplexity -m %s -z %s -f %s --ctx %d --val-frac 0.5 --json", model, tokp, shard_path, CTX);
    T_CHECK(t_nerve(args) == 0, "%s", t_err);
    const double held_ppl = json_num(NULL, "ppl"), held_chunks = json_num(NULL, "chunks");
    snprintf(args, sizeof args, "perplexity -m %s -z %s -f %s --ctx %d --json", model, tokp, half_path, CTX);
    T_CHECK(t_nerve(args) == 0, "%s", t_err);
    T_CHECK(held_chunks == held / CTX && json_num(NULL, "chunks") == held_chunks && json_num(NULL, "ppl") == held_ppl,
            "--val-frac: %g chunks ppl %g; the half alone %g chunks ppl %g", held_chunks, held_ppl, json_num(NULL, "chunks"),
            json_num(NULL, "ppl"));
    /* two files are one stream: the shard then its half give more chunks than the shard alone */
    snprintf(args, sizeof args, "perplexity -m %s -z %s -f %s --data %s --ctx %d --json", model, tokp, shard_path, half_path, CTX);
    T_CHECK(t_nerve(args) == 0 && json_num(NULL, "chunks") == (n + held) / CTX, "two files: %g chunks: %s", json_num(NULL, "chunks"), t_err);
out:
    free(ids);
    nv_model_free(&m);
    nv_tokenizer_free(tok);
}

/* A trained model predicts stories far better than chance; the same shape with random weights
 * scores about the vocabulary's size. */
static void test_perplexity_trained_against_random(void) {
    char args[3000], model[600], tokp[600];
    if (!shared_model(model, tokp)) return;
    snprintf(args, sizeof args, "perplexity -m %s -z %s --chunks 4 --json", model, tokp); /* the shared validation text */
    T_CHECK(t_nerve(args) == 0, "%s", t_err);
    const double trained = json_num(NULL, "ppl");
    T_CHECK(trained > 1.5 && trained < 8, "stories260K's perplexity %g", trained);
    T_CHECK(json_num(NULL, "ctx") == 512 && json_num(NULL, "scored") == 4 * 255, "ctx %g scored %g", json_num(NULL, "ctx"),
            json_num(NULL, "scored"));
    snprintf(args, sizeof args, "init --preset stories260K --seq-len 512 --seed 3 -o %s", t_path("random.bin"));
    T_CHECK(t_nerve(args) == 0, "init: %s", t_err);
    snprintf(args, sizeof args, "perplexity -m %s -z %s --chunks 4 --json", t_path("random.bin"), tokp);
    T_CHECK(t_nerve(args) == 0, "%s", t_err);
    const double random = json_num(NULL, "ppl");
    T_CHECK(random > 200 && random < 1500, "a random model's perplexity %g (vocabulary 512)", random);
}

/* --kl-base: the model against itself is zero divergence and the same top token everywhere; an int8
 * engine against fp32 is a small divergence with nearly every top token the same. */
static void test_perplexity_kl_divergence(void) {
    char args[3000], model[600], tokp[600];
    if (!shared_model(model, tokp)) return;
    snprintf(args, sizeof args, "perplexity -m %s -z %s --chunks 2 --kl-base %s --engine scalar --kl-base-engine scalar --json",
             model, tokp, model);
    T_CHECK(t_nerve(args) == 0, "%s", t_err);
    T_CHECK(json_num("kld", "mean") == 0 && json_num("kld", "max") == 0 && json_num(NULL, "same_top") == 1 &&
                json_num(NULL, "ln_ppl_ratio") == 0 && json_num("delta_p", "rms") == 0,
            "itself: kld %g max %g same_top %g ln ratio %g", json_num("kld", "mean"), json_num("kld", "max"),
            json_num(NULL, "same_top"), json_num(NULL, "ln_ppl_ratio"));
    T_CHECK(json_num("base", "ppl") == json_num(NULL, "ppl"), "base ppl %g, model ppl %g", json_num("base", "ppl"), json_num(NULL, "ppl"));
    /* avx2-int8 runs on every machine this binary runs on (x86-64-v3) */
    snprintf(args, sizeof args, "perplexity -m %s -z %s --chunks 2 --kl-base %s --engine avx2-int8 --json", model, tokp, model);
    int rc = t_nerve(args);
    if (rc == 1 && strstr(t_err, "is off")) {
        t_skip("avx2-int8 is off on this machine");
        return;
    }
    T_CHECK(rc == 0, "%s", t_err);
    const double kld = json_num("kld", "mean"), same = json_num(NULL, "same_top");
    T_CHECK(kld > 0 && kld < 0.01, "int8 against fp32: mean KLD %g", kld);
    T_CHECK(json_num("kld", "max") >= json_num("kld", "p99") && json_num("kld", "p99") >= json_num("kld", "median") &&
                json_num("kld", "median") >= json_num("kld", "min"),
            "quantiles out of order");
    T_CHECK(same > 0.95 && same < 1.0 + 1e-12, "same top token %g", same);
    T_CHECK(fabs(json_num(NULL, "ln_ppl_ratio")) < 0.02 && json_num(NULL, "ppl_cor") > 0.99, "ln ratio %g cor %g",
            json_num(NULL, "ln_ppl_ratio"), json_num(NULL, "ppl_cor"));
    cJSON *o = cJSON_Parse(t_out);
    cJSON *base = cJSON_GetObjectItemCaseSensitive(o, "base");
    const char *be = base ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(base, "engine")) : NULL;
    T_CHECK(be && (!strcmp(be, "avx512") || !strcmp(be, "avx2")), "the reference's engine %s, not the exact fp32 default", be ? be : "(none)");
    T_CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "engine")), "avx2-int8"), "engine");
    cJSON_Delete(o);
    /* the text form has llama.cpp's sections */
    snprintf(args, sizeof args, "perplexity -m %s -z %s --chunks 1 --kl-base %s --engine avx2-int8", model, tokp, model);
    T_CHECK(t_nerve(args) == 0 && strstr(t_out, "Mean    KLD:") && strstr(t_out, "Same top p:") && strstr(t_out, "Mean PPL(base)"),
            "text: %s", t_out);
}

static void expect_error(const char *args, int code, const char *needle) {
    int rc = t_nerve(args);
    int lines = 0;
    for (const char *s = t_err; *s; s++) lines += *s == '\n';
    T_CHECK(rc == code && lines == 1 && strstr(t_err, needle), "`%s`: exit %d (want %d), stderr: %s", args, rc, code, t_err);
}

/* Multiple-choice tasks from the TinyStories text: a story's first sentence as the context, its
 * second and three other stories' seconds as the choices (the gold one in turn at each place). */
#define MC_TASKS 24
static int mc_tasks(char ctx[][256], char choice[][4][256], int gold[]) {
    const char *txt = t_data("corpus/tinystories_valid_head.txt");
    char *text = NULL;
    if (!txt || nv_file_read_all(txt, &text, NULL) != NV_OK) return 0;
    char first[MC_TASKS + 3][256], second[MC_TASKS + 3][256];
    int n = 0;
    for (char *story = text; story && n < MC_TASKS + 3;) {
        char *end = strstr(story, "\n\n");
        if (end) *end = '\0';
        char *a = strstr(story, ". "), *b = a ? strstr(a + 2, ". ") : NULL;
        if (a && b && a - story < 200 && b - a < 200 && !memchr(story, '\n', (size_t)(b - story))) {
            snprintf(first[n], 256, "%.*s.", (int)(a - story), story);
            snprintf(second[n], 256, "%.*s.", (int)(b - a - 2), a + 2);
            n++;
        }
        story = end ? end + 2 : NULL;
    }
    free(text);
    for (int t = 0; t < n - 3; t++) {
        snprintf(ctx[t], 256, "%s", first[t]);
        gold[t] = t % 4;
        for (int k = 0, other = 1; k < 4; k++) snprintf(choice[t][k], 256, "%s", k == gold[t] ? second[t] : second[t + other++]);
    }
    return n - 3;
}

/* The accuracy that full forward passes of every choice give (each text from position 0, one token
 * at a time, on scalar): the command's prefix-once scoring must pick the same choices. */
static void mc_reference(const nv_model *m, const nv_tokenizer *tok, char ctx[][256], char choice[][4][256], const int *gold,
                         int n, int *right_sum, int *right_mean) {
    const int V = m->config.vocab_size;
    float *logits = malloc((size_t)m->config.seq_len * V * sizeof(float));
    *right_sum = *right_mean = 0;
    for (int t = 0; t < n; t++) {
        int *ids[4], len[4], shared = 1 << 30;
        char text[600];
        for (int k = 0; k < 4; k++) {
            snprintf(text, sizeof text, "%s %s", ctx[t], choice[t][k]);
            T_CHECK(nv_tokenizer_encode(tok, text, 1, 0, &ids[k], &len[k]) == NV_OK, "encode");
        }
        for (int k = 1; k < 4; k++) {
            int p = 0;
            while (p < len[0] && p < len[k] && ids[0][p] == ids[k][p]) p++;
            if (p < shared) shared = p;
        }
        double sum[4], mean[4];
        for (int k = 0; k < 4; k++) {
            T_CHECK(t_forward_logits(m, ids[k], len[k], logits), "forward");
            sum[k] = 0;
            for (int p = shared; p < len[k]; p++) {
                const float *l = logits + (size_t)(p - 1) * V;
                double mx = l[0], z = 0;
                for (int i = 1; i < V; i++) mx = l[i] > mx ? l[i] : mx;
                for (int i = 0; i < V; i++) z += exp(l[i] - mx);
                sum[k] += l[ids[k][p]] - mx - log(z);
            }
            mean[k] = sum[k] / (len[k] - shared);
            free(ids[k]);
        }
        int bs = 0, bm = 0;
        for (int k = 1; k < 4; k++) {
            if (sum[k] > sum[bs]) bs = k;
            if (mean[k] > mean[bm]) bm = k;
        }
        *right_sum += bs == gold[t];
        *right_mean += bm == gold[t];
    }
    free(logits);
}

/* --multiple-choice: llama.cpp's HellaSwag text and JSON Lines give the same figures, those of full
 * forward passes computed here; stories260K beats chance on its own kind of text; --tasks; malformed
 * files are refused with the line. */
static void test_multiple_choice(void) {
    char model[600], tokp[600], args[3000];
    if (!shared_model(model, tokp)) return;
    static char ctx[MC_TASKS][256], choice[MC_TASKS][4][256];
    int gold[MC_TASKS];
    const int n = mc_tasks(ctx, choice, gold);
    T_CHECK(n == MC_TASKS, "%d tasks from the text", n);
    if (n != MC_TASKS) return;
    nv_buf hs = {0}, jl = {0};
    for (int t = 0; t < n; t++) {
        nv_buf_printf(&hs, "%s\n%d\n%s\n%s\n%s\n%s\n", ctx[t], gold[t], choice[t][0], choice[t][1], choice[t][2], choice[t][3]);
        cJSON *o = cJSON_CreateObject(), *c = cJSON_CreateArray();
        cJSON_AddStringToObject(o, "question", ctx[t]);
        for (int k = 0; k < 4; k++) cJSON_AddItemToArray(c, cJSON_CreateString(choice[t][k]));
        cJSON_AddItemToObject(o, "choices", c);
        char letter[2] = {(char)('A' + gold[t]), 0};
        cJSON_AddStringToObject(o, "answer", letter);
        char *line = cJSON_PrintUnformatted(o);
        nv_buf_printf(&jl, "%s\n", line);
        free(line);
        cJSON_Delete(o);
    }
    char hs_path[600], jl_path[600];
    snprintf(hs_path, sizeof hs_path, "%s", t_write("hellaswag.txt", hs.data, hs.len));
    snprintf(jl_path, sizeof jl_path, "%s", t_write("choices.jsonl", jl.data, jl.len));
    nv_buf_free(&hs);
    nv_buf_free(&jl);
    nv_tokenizer *tok = NULL;
    nv_model m;
    if (nv_tokenizer_load(tokp, 512, &tok) != NV_OK || nv_model_load(model, &m) != NV_OK) {
        T_CHECK(0, "load: %s", nv_errmsg());
        return;
    }
    T_CHECK(nv_engines_init(NULL, 1) == NV_OK && nv_model_build_plans(&m, NV_ENGINE_SCALAR) == NV_OK, "%s", nv_errmsg());
    int want_sum = 0, want_mean = 0;
    mc_reference(&m, tok, ctx, choice, gold, n, &want_sum, &want_mean);
    for (int f = 0; f < 2; f++) {
        snprintf(args, sizeof args, "perplexity -m %s -z %s --multiple-choice %s --engine scalar --json", model, tokp,
                 f ? jl_path : hs_path);
        T_CHECK(t_nerve(args) == 0, "%s", t_err);
        T_CHECK(json_num(NULL, "tasks") == n && json_num(NULL, "skipped") == 0, "tasks %g skipped %g", json_num(NULL, "tasks"),
                json_num(NULL, "skipped"));
        T_CHECK(fabs(json_num(NULL, "acc") - 100.0 * want_sum / n) < 1e-9 &&
                    fabs(json_num(NULL, "acc_norm") - 100.0 * want_mean / n) < 1e-9,
                "%s: acc %g acc_norm %g, full passes %d and %d of %d", f ? "jsonl" : "hellaswag", json_num(NULL, "acc"),
                json_num(NULL, "acc_norm"), want_sum, want_mean, n);
    }
    T_CHECK(want_mean > n / 4 + 2, "stories260K picks the story's own sentence %d times of %d", want_mean, n);
    snprintf(args, sizeof args, "perplexity -m %s -z %s --multiple-choice %s --tasks 5", model, tokp, jl_path);
    T_CHECK(t_nerve(args) == 0 && strstr(t_out, "tasks     5 (0 skipped") && strstr(t_out, "acc_norm  ") &&
                strstr(t_err, "[5] "),
            "--tasks 5: %s %s", t_out, t_err);
    nv_model_free(&m);
    nv_tokenizer_free(tok);

    const struct {
        const char *text, *want;
    } bad[] = {
        {"a\n0\nb\nc\nd\n", "5 lines: llama.cpp's HellaSwag text has 6 a task"},
        {"a\n7\nb\nc\nd\ne\n", ":2: the gold ending's index must be 0..3"},
        {"{\"ctx\": \"a\", \"endings\": [\"b\", \"c\"], \"label\": 2}\n", ":1: the gold choice"},
        {"{\"ctx\": \"a\", \"endings\": [\"b\"], \"label\": 0}\n", ":1: the choices"},
        {"{\"endings\": [\"b\", \"c\"], \"label\": 0}\n", ":1: no context"},
        {"{\"ctx\": \"a\", \"endings\": [\"b\", \"c\"], \"label\": 0}\n{oops\n", ":2: not JSON"},
        {"{\"ctx\": \"a\", \"endings\": [\"b\", 5], \"label\": \"1\"}\n", ":1: choice 1 is not a string"},
        {"\n\n", ": no tasks"},
        {"\n{\"ctx\": \"a\", \"endings\": [\"b\", \"c\"], \"label\": 1e300}\n", ":2: the gold choice"}, /* JSON after a blank line */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *p = t_write("bad_mc.txt", bad[i].text, strlen(bad[i].text));
        snprintf(args, sizeof args, "perplexity -m %s -z %s --multiple-choice %s", model, tokp, p);
        T_CHECK(t_nerve(args) == 1 && strstr(t_err, "bad_mc.txt") && strstr(t_err, bad[i].want), "case %zu: %s", i, t_err);
    }
    snprintf(args, sizeof args, "perplexity -m %s -z %s --multiple-choice %s -f %s", model, tokp, jl_path, jl_path);
    T_CHECK(t_nerve(args) == 2 && strstr(t_err, "do not go with it"), "-f beside it: %s", t_err);
    snprintf(args, sizeof args, "perplexity -m %s -z %s --tasks 3", model, tokp);
    T_CHECK(t_nerve(args) == 2 && strstr(t_err, "--tasks goes with --multiple-choice"), "--tasks alone: %s", t_err);
}

static void test_perplexity_errors(void) {
    char args[3000], model[600], tokp[600];
    if (!shared_model(model, tokp)) return;
    expect_error("perplexity", 2, "-m MODEL (or -hf USER/NAME) is required");
    snprintf(args, sizeof args, "perplexity -m %s --bogus 1", model);
    expect_error(args, 2, "unknown option");
    snprintf(args, sizeof args, "perplexity -m %s --kl-base-engine scalar", model);
    expect_error(args, 2, "needs --kl-base");
    snprintf(args, sizeof args, "perplexity -m %s --ctx 3", model);
    expect_error(args, 2, "--ctx");
    /* chat data is scored by its answers: not mixed with text, nor with a chunk size */
    snprintf(args, sizeof args, "perplexity -m %s -z %s -f chats.jsonl --ctx 64", model, tokp);
    expect_error(args, 2, "chat data is scored a turn at a time");
    snprintf(args, sizeof args, "perplexity -m %s -z %s -f chats.jsonl -f text.txt", model, tokp);
    expect_error(args, 2, "one kind or the other");
    snprintf(args, sizeof args, "perplexity -m %s -z %s -f %s/missing.jsonl", model, tokp, t_tmpdir());
    expect_error(args, 1, "missing.jsonl");
    snprintf(args, sizeof args, "perplexity -m %s -z %s --chat-template chatml", model, tokp);
    expect_error(args, 2, "--chat-template goes with chat data");
    snprintf(args, sizeof args, "perplexity -m %s -z %s --ctx 1024", model, tokp);
    expect_error(args, 1, "longer than the model's context of 512");
    snprintf(args, sizeof args, "perplexity -m %s -z %s -f %s", model, tokp, t_write("short.txt", "Once upon a time.", 17));
    expect_error(args, 1, "a chunk needs 512");
    snprintf(args, sizeof args, "perplexity -m %s -z %s -f %s/missing.txt", model, tokp, t_tmpdir());
    expect_error(args, 1, "missing.txt");
    const uint16_t bad[8] = {1, 2, 3, 600, 4, 5, 6, 7}; /* a token outside the vocabulary of 512 */
    snprintf(args, sizeof args, "perplexity -m %s -z %s -f %s --ctx 4", model, tokp, t_write("bad.bin", bad, sizeof bad));
    expect_error(args, 1, "outside the vocabulary");
    snprintf(args, sizeof args, "perplexity -m %s -z %s", t_write("junk.bin", "not a model at all", 18), tokp);
    expect_error(args, 1, "junk.bin");
    snprintf(args, sizeof args, "perplexity -m %s -z %s --kl-base %s", model, tokp, t_path("junk.bin"));
    expect_error(args, 1, "junk.bin");
    /* a reference with another vocabulary predicts other tokens */
    snprintf(args, sizeof args, "init --preset stories15M --seq-len 512 -o %s", t_path("s15.bin"));
    T_CHECK(t_nerve(args) == 0, "init: %s", t_err);
    snprintf(args, sizeof args, "perplexity -m %s -z %s --kl-base %s --chunks 1", model, tokp, t_path("s15.bin"));
    expect_error(args, 1, "vocabulary");
}

int main(void) {
    T_RUN(test_perplexity_matches_token_by_token);
    T_RUN(test_perplexity_trained_against_random);
    T_RUN(test_perplexity_kl_divergence);
    T_RUN(test_perplexity_errors);
    T_RUN(test_multiple_choice);
    return t_done();
}
