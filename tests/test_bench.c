/* nerve bench: every subcommand's --quick --json output is JSON Lines with the fields of
 * ../shared/design.md "Benchmarks" (engines that are off and peers that cannot run say ok:false
 * with a why), and the accuracy contract of issue 3 item 5: on stories260K, teacher-forced over
 * 512 positions, fp32 engines agree with scalar's top-1 token everywhere and the low-precision
 * engines (amx-bf16, amx-int8) on at least 99% of positions. Speed is never checked here. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/kern.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "t.h"

/* ---------------------------------------------------------------- bench output */

static int have_nerve(void) {
    if (access(t_nerve_bin(), X_OK) == 0) return 1;
    t_skip("no nerve binary (build build/nerve or set NERVE_BIN)");
    return 0;
}

/* Runs `nerve bench what --quick --json`; the output (caller frees) or NULL. */
static char *run_bench(const char *what, int *rc) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' bench %s --quick --json 2>/dev/null </dev/null", t_nerve_bin(), what);
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *out = malloc(cap);
    size_t got;
    while (out && (got = fread(out + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (cap - n < 1024) {
            char *bigger = realloc(out, cap * 2);
            if (!bigger) break;
            out = bigger;
            cap *= 2;
        }
    }
    int st = pclose(p);
    *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (out) out[n] = '\0';
    return out;
}

static int is_engine_name(const char *s, nv_engine_id *e) { return nv_engine_parse(s, e) == NV_OK; }

static const char *str_field(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int num_field(const cJSON *o, const char *k, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v)) return 0;
    if (out) *out = v->valuedouble;
    return 1;
}

/* Checks every line of one bench's output; figs: the figure fields a measured row must carry
 * (any one of the alternatives separated by '|' in each entry). Returns the rows seen. */
static int check_lines(const char *what, const char *out, const char *const *figs, int nfigs, int *measured) {
    int rows = 0;
    *measured = 0;
    const char *line = out;
    while (*line) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        char *buf = malloc(len + 1);
        memcpy(buf, line, len);
        buf[len] = '\0';
        line += len + (nl ? 1 : 0);
        if (!len) {
            free(buf);
            continue;
        }
        rows++;
        cJSON *o = cJSON_Parse(buf);
        T_CHECK(cJSON_IsObject(o), "%s: not a JSON object: %.200s", what, buf);
        if (!cJSON_IsObject(o)) {
            cJSON_Delete(o);
            free(buf);
            continue;
        }
        const char *bench = str_field(o, "bench"), *engine = str_field(o, "engine");
        double threads = 0;
        T_CHECK(bench && !strcmp(bench, what), "%s: bench field: %.200s", what, buf);
        T_CHECK(engine && *engine, "%s: engine field: %.200s", what, buf);
        T_CHECK(num_field(o, "threads", &threads) && threads >= 1, "%s: threads field: %.200s", what, buf);
        const cJSON *ok = cJSON_GetObjectItemCaseSensitive(o, "ok");
        nv_engine_id e;
        if (cJSON_IsFalse(ok)) {
            const char *why = str_field(o, "why");
            T_CHECK(why && *why, "%s: ok:false without a why: %.200s", what, buf);
        } else {
            T_CHECK(ok == NULL || cJSON_IsTrue(ok), "%s: bad ok: %.200s", what, buf);
            /* an engine that is off must never have measured figures */
            if (engine && is_engine_name(engine, &e))
                T_CHECK(nv_engine_available(e), "%s: row for engine %s, which is off, has no ok:false: %.200s", what,
                        engine, buf);
            (*measured)++;
            for (int f = 0; f < nfigs; f++) {
                char alts[128];
                snprintf(alts, sizeof alts, "%s", figs[f]);
                int found = 0;
                for (char *save = NULL, *k = strtok_r(alts, "|", &save); k; k = strtok_r(NULL, "|", &save))
                    found |= num_field(o, k, NULL);
                T_CHECK(found, "%s: measured row lacks %s: %.200s", what, figs[f], buf);
            }
        }
        cJSON_Delete(o);
        free(buf);
    }
    return rows;
}

static void check_bench(const char *what, const char *const *figs, int nfigs) {
    if (!have_nerve()) return;
    int rc = -1, measured = 0;
    char *out = run_bench(what, &rc);
    T_CHECK(out != NULL, "cannot run nerve bench %s", what);
    if (!out) return;
    T_CHECK(rc == 0, "nerve bench %s --quick --json exited %d", what, rc);
    int rows = check_lines(what, out, figs, nfigs, &measured);
    T_CHECK(rows > 0, "nerve bench %s printed no rows", what);
    T_CHECK(measured > 0, "nerve bench %s measured nothing (avx2 or scalar is always there)", what);
    free(out);
}

static void test_bench_matmul(void) {
    const char *figs[] = {"gflops|value", "m|value", "n|value", "k|value"};
    check_bench("matmul", figs, 4);
}
static void test_bench_peak(void) {
    const char *figs[] = {"gflops|gops|gb_per_s"};
    check_bench("peak", figs, 1);
}
static void test_bench_cache(void) {
    const char *figs[] = {"gflops", "mb", "m", "n", "k"};
    check_bench("cache", figs, 5);
}
static void test_bench_chain(void) {
    const char *figs[] = {"gflops", "ops", "frac", "us_per_op"};
    check_bench("chain", figs, 4);
}
static void test_bench_accuracy(void) {
    if (!t_data("models/stories260K.bin") || !t_data("models/tok512.bin") || !t_data("corpus/tinystories_valid_head.txt"))
        return;
    const char *figs[] = {"max_abs_err", "mean_abs_err", "top1_agree", "seq"};
    check_bench("accuracy", figs, 4);
}
/* --kv-cache-dtype runs the same teacher-forced text through paged KV of that type (as serve keeps
 * it); --model takes another model file; a bad type or model is an error. */
static void test_bench_accuracy_kv_dtype(void) {
    const char *mp = t_data("models/stories260K.bin"), *tp = t_data("models/tok512.bin");
    if (!have_nerve() || !mp || !tp || !t_data("corpus/tinystories_valid_head.txt")) return;
    char what[2400];
    int rc = -1;
    snprintf(what, sizeof what, "accuracy --engine avx2 --kv-cache-dtype q8 --model '%s' -z '%s'", mp, tp);
    char *out = run_bench(what, &rc);
    cJSON *o = out ? cJSON_Parse(out) : NULL;
    double top1 = -1;
    cJSON *kv = cJSON_GetObjectItem(o, "kv_dtype");
    num_field(o, "top1_agree", &top1);
    /* stories260K's keys of 8 dimensions lose most to int8: 61 of 64 positions agree (f16: all) */
    T_CHECK(rc == 0 && cJSON_IsString(kv) && !strcmp(kv->valuestring, "q8") && top1 >= 0.9,
            "q8 accuracy row: rc %d, top-1 %g: %.300s", rc, top1, out ? out : "");
    cJSON_Delete(o);
    free(out);
    out = run_bench("accuracy --engine avx2 --kv-cache-dtype q4", &rc);
    T_CHECK(rc == 2, "an unknown KV element type was accepted (rc %d)", rc);
    free(out);
    out = run_bench("accuracy --engine avx2 --model /nonexistent/model.bin", &rc);
    T_CHECK(rc == 1, "a missing --model was accepted (rc %d)", rc);
    free(out);
}
static void test_bench_grammar(void) {
    if (!t_data("tokenizers/tokenizer.bin")) return;
    const char *figs[] = {"mask_ms", "token_by_token_ms", "allowed", "vocab", "one_token_us"};
    check_bench("grammar", figs, 5);
}
/* every template's Jinja form renders its renderer's text, and both are timed */
static void test_bench_template(void) {
    if (!t_data("models/tok512.bin")) return;
    const char *figs[] = {"renderer_us", "jinja_us", "ratio", "same_text", "bytes", "messages"};
    check_bench("template", figs, 6);
    int rc = -1;
    char *out = run_bench("template", &rc);
    T_CHECK(out && rc == 0 && strstr(out, "\"same_text\":1") && !strstr(out, "\"same_text\":0"), "%s", out ? out : "");
    free(out);
}
static void test_bench_generate(void) {
    const char *figs[] = {"tokens_per_s|gb_per_s"};
    check_bench("generate", figs, 1);
}

/* The named cases of design.md: generate rows prefill256, prefill2048, decode for every engine. */
static void test_bench_generate_cases(void) {
    if (!have_nerve()) return;
    int rc = -1;
    char *out = run_bench("generate --engine avx2", &rc);
    T_CHECK(out && rc == 0, "nerve bench generate --engine avx2 failed (%d)", rc);
    if (!out) return;
    const char *cases[] = {"\"case\":\"prefill256\"", "\"case\":\"prefill2048\"", "\"case\":\"decode\"", "\"case\":\"read-bw\""};
    for (int i = 0; i < 4; i++) T_CHECK(strstr(out, cases[i]) != NULL, "no row with %s", cases[i]);
    T_CHECK(strstr(out, "\"of_bound\":") != NULL, "decode row without of_bound");
    free(out);
}

/* bench train of a mixture of experts (stories260K's shape, 4 experts, 2 a token): measured rows with
 * the experts said, and no PyTorch rows (the peers train dense models). */
static void test_bench_train_experts(void) {
    if (!have_nerve()) return;
    int rc = -1, measured = 0;
    char *out = run_bench("train --experts 4 --engine avx2", &rc);
    T_CHECK(out && rc == 0, "nerve bench train --experts 4 failed (%d)", rc);
    if (!out) return;
    const char *figs[] = {"ms_per_step", "tokens_per_s", "tflops", "experts", "experts_used"};
    T_CHECK(check_lines("train", out, figs, 5, &measured) > 0 && measured > 0, "no measured rows");
    T_CHECK(strstr(out, "\"experts\":4") && strstr(out, "\"experts_used\":2") && !strstr(out, "torch"), "%.400s", out);
    free(out);
}

/* --model takes a model file as well as a preset; anything else is an error. */
static void test_bench_generate_model_file(void) {
    const char *mp = t_data("models/stories260K.bin");
    if (!have_nerve() || !mp) return;
    char what[1200];
    int rc = -1;
    snprintf(what, sizeof what, "generate --engine avx2 --case decode --model '%s'", mp);
    char *out = run_bench(what, &rc);
    T_CHECK(out && rc == 0 && strstr(out, "\"weights\":\"from the file\"") && strstr(out, "\"tokens_per_s\":"),
            "bench generate on a model file: rc %d, %.300s", rc, out ? out : "");
    free(out);
    out = run_bench("generate --case decode --model /nonexistent/model.bin", &rc);
    T_CHECK(rc != 0, "a --model that is neither a preset nor a file was accepted");
    free(out);
}

/* ---------------------------------------------------------------- accuracy */

#define POSITIONS 512

static struct {
    int ready, failed, n, vocab;
    int *ids;
    float *ref; /* scalar logits [n][vocab] */
    nv_model m;
} acc;

static void free_plans(nv_model *m) {
    if (m->plans) {
        for (int l = 0; l < m->config.n_layers; l++) {
            nv_layer_plans *lp = &m->plans[l];
            nv_plan *all[] = {lp->wq, lp->wk, lp->wv, lp->wo, lp->w1, lp->w2, lp->w3};
            for (int i = 0; i < 7; i++) nv_plan_free(all[i]);
        }
        free(m->plans);
        m->plans = NULL;
    }
    nv_plan_free(m->cls_plan);
    m->cls_plan = NULL;
}

static nv_err logits_on(nv_engine_id e, float *out) {
    free_plans(&acc.m);
    NV_TRY(nv_model_build_plans(&acc.m, e));
    nv_state s;
    const int chunk = 128;
    NV_TRY(nv_state_init(&s, &acc.m.config, chunk, acc.n, 1));
    nv_err err = NV_OK;
    for (int pos = 0; pos < acc.n && err == NV_OK; pos += chunk) {
        int len = acc.n - pos < chunk ? acc.n - pos : chunk;
        err = nv_forward(&acc.m, &s, acc.ids + pos, len, pos);
        if (err == NV_OK) memcpy(out + (size_t)pos * acc.vocab, s.logits, (size_t)len * acc.vocab * sizeof(float));
    }
    nv_state_free(&s);
    return err;
}

/* Loads stories260K and 512 tokens of TinyStories and computes scalar's logits once. */
static int acc_setup(void) {
    if (acc.ready) return 1;
    if (acc.failed) {
        t_skip("setup failed earlier");
        return 0;
    }
    const char *mp = t_data("models/stories260K.bin"), *tp = t_data("models/tok512.bin"),
               *cp = t_data("corpus/tinystories_valid_head.txt");
    if (!mp || !tp || !cp) {
        acc.failed = 1;
        return 0;
    }
    nv_tokenizer *tok = NULL;
    char *text = NULL;
    size_t len = 0;
    int ok = nv_model_load(mp, &acc.m) == NV_OK;
    T_CHECK(ok, "load: %s", nv_errmsg());
    if (ok) ok = nv_tokenizer_load(tp, acc.m.config.vocab_size, &tok) == NV_OK && nv_file_read_all(cp, &text, &len) == NV_OK;
    T_CHECK(ok, "tokenizer/text: %s", nv_errmsg());
    if (ok && len > 32768) {
        char *nl = memchr(text + 32768, '\n', len - 32768);
        if (nl) *nl = '\0';
    }
    int n = 0;
    if (ok) ok = nv_tokenizer_encode(tok, text, 1, 0, &acc.ids, &n) == NV_OK;
    T_CHECK(ok && n >= POSITIONS, "encode: %d tokens (%s)", n, nv_errmsg());
    free(text);
    nv_tokenizer_free(tok);
    if (!ok || n < POSITIONS) {
        acc.failed = 1;
        return 0;
    }
    acc.n = POSITIONS;
    acc.vocab = acc.m.config.vocab_size;
    acc.ref = malloc((size_t)acc.n * acc.vocab * sizeof(float));
    ok = acc.ref && logits_on(NV_ENGINE_SCALAR, acc.ref) == NV_OK;
    T_CHECK(ok, "scalar forward: %s", nv_errmsg());
    if (!ok) {
        acc.failed = 1;
        return 0;
    }
    acc.ready = 1;
    return 1;
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* Top-1 agreement of engine e with scalar, in positions out of 512 (-1 on failure). */
static int agreement(nv_engine_id e, double *max_err) {
    float *got = malloc((size_t)acc.n * acc.vocab * sizeof(float));
    if (!got || logits_on(e, got) != NV_OK) {
        free(got);
        return -1;
    }
    int agree = 0;
    *max_err = 0;
    for (int p = 0; p < acc.n; p++) {
        const float *a = acc.ref + (size_t)p * acc.vocab, *b = got + (size_t)p * acc.vocab;
        agree += argmax(a, acc.vocab) == argmax(b, acc.vocab);
        for (int j = 0; j < acc.vocab; j++) *max_err = fmax(*max_err, fabs((double)a[j] - b[j]));
    }
    free(got);
    return agree;
}

/* strict 0: a shortfall is reported as a skip with the figures instead of a failure (used for the
 * emulated int8 engine, which misses the 99% contract today; see docs/benchmarks.md). */
static void check_engine(nv_engine_id e, const char *label, int strict) {
    if (!acc_setup()) return;
    if (!nv_engine_available(e)) {
        char why[300];
        snprintf(why, sizeof why, "engine %s is off%s: %s", nv_engine_name(e), label, nv_engine_why_off(e));
        t_skip(why);
        return;
    }
    double max_err = 0;
    int agree = agreement(e, &max_err);
    T_CHECK(agree >= 0, "%s forward: %s", nv_engine_name(e), nv_errmsg());
    const int lowp = nv_engine_low_precision(e);
    const int need = lowp ? (99 * acc.n + 99) / 100 : acc.n; /* >= 99% (507 of 512), or all */
    if (!strict && agree >= 0 && agree < need) {
        char why[300];
        snprintf(why, sizeof why, "KNOWN SHORTFALL %s%s: top-1 agrees on %d of %d positions (issue 3 item 5 needs %d), max logit error %.3g",
                 nv_engine_name(e), label, agree, acc.n, need, max_err);
        t_skip(why);
        return;
    }
    T_CHECK(agree >= need, "%s%s: top-1 agrees on %d of %d positions (need %d), max logit error %g", nv_engine_name(e),
            label, agree, acc.n, need, max_err);
    printf("    %s%s: top-1 %d/%d, max |logit error| %.3g\n", nv_engine_name(e), label, agree, acc.n, max_err);
}

static void test_accuracy_avx2(void) { check_engine(NV_ENGINE_AVX2, "", 1); }
static void test_accuracy_avx512(void) { check_engine(NV_ENGINE_AVX512, "", 1); }
static void test_accuracy_avx512_bf16(void) { check_engine(NV_ENGINE_AVX512_BF16, "", 1); }
static void test_accuracy_amx_bf16(void) { check_engine(NV_ENGINE_AMX_BF16, "", 1); }
static void test_accuracy_amx_int8(void) { check_engine(NV_ENGINE_AMX_INT8, "", 1); }
static void test_accuracy_avx512_int8(void) { check_engine(NV_ENGINE_AVX512_INT8, "", 1); }
static void test_accuracy_avx2_int8(void) { check_engine(NV_ENGINE_AVX2_INT8, "", 1); }
/* The same numerics on the emulated kernels (tile and zmm semantics in C), so the contract is
 * checked on machines without the hardware too. */
static void test_accuracy_avx512_emulated(void) { check_engine(NV_ENGINE_AVX512, " (emulated)", 1); }
static void test_accuracy_avx512_bf16_emulated(void) { check_engine(NV_ENGINE_AVX512_BF16, " (emulated)", 1); }
static void test_accuracy_amx_bf16_emulated(void) { check_engine(NV_ENGINE_AMX_BF16, " (emulated)", 1); }
static void test_accuracy_amx_int8_emulated(void) { check_engine(NV_ENGINE_AMX_INT8, " (emulated)", 1); }
static void test_accuracy_avx512_int8_emulated(void) { check_engine(NV_ENGINE_AVX512_INT8, " (emulated)", 1); }

int main(void) {
    nv_engines_init(NULL, 0);
    T_RUN(test_bench_matmul);
    T_RUN(test_bench_peak);
    T_RUN(test_bench_cache);
    T_RUN(test_bench_chain);
    T_RUN(test_bench_accuracy);
    T_RUN(test_bench_accuracy_kv_dtype);
    T_RUN(test_bench_grammar);
    T_RUN(test_bench_template);
    T_RUN(test_bench_generate);
    T_RUN(test_bench_generate_cases);
    T_RUN(test_bench_generate_model_file);
    T_RUN(test_bench_train_experts);
    T_RUN(test_accuracy_avx2);
    T_RUN(test_accuracy_avx512);
    T_RUN(test_accuracy_avx512_bf16);
    T_RUN(test_accuracy_amx_bf16);
    T_RUN(test_accuracy_amx_int8);
    T_RUN(test_accuracy_avx512_int8);
    T_RUN(test_accuracy_avx2_int8);
    nv_engines_set_emulation(1);
    nv_engines_reset();
    nv_engines_init(NULL, 0);
    nv_engines_set_emulation(0);
    T_RUN(test_accuracy_avx512_emulated);
    T_RUN(test_accuracy_avx512_bf16_emulated);
    T_RUN(test_accuracy_amx_bf16_emulated);
    T_RUN(test_accuracy_amx_int8_emulated);
    T_RUN(test_accuracy_avx512_int8_emulated);
    nv_engines_reset();
    free_plans(&acc.m);
    if (acc.ready || acc.m.params) nv_model_free(&acc.m);
    free(acc.ids);
    free(acc.ref);
    return t_done();
}
