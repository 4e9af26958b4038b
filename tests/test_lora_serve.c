/* LoRA adapters served per request (model/adapters.h, serve --lora-modules): in one batched step,
 * rows of the base model are bit-identical to a step without adapters, rows of an adapter equal
 * the merged model's (fp32: to rounding; bf16/int8 engines: within their bounds) and do not
 * depend on what shares the step (an adapter's rows gathered from several sequences or read in
 * place give the same bits); bad adapters and names are refused. End to end: the server lists the
 * adapters, a request naming one generates what `generate --lora` does, the base's text is
 * untouched, an unknown model is a 404, the prefix cache (RAM and SSD tiers) never serves one
 * adapter's KV to another or to the base, embeddings follow the adapter, and the flag's errors
 * are one line. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "engine/engine.h"
#include "model/adapters.h"
#include "model/batch.h"
#include "model/gguf.h"
#include "model/lora.h"
#include "serve/api.h"
#include "serve/sched.h"
#include "serve_util.h"
#include "t.h"

#define LEN 72 /* two steps of 36 rows: sequences 0 and 2 give adapter one 72 rows a step, two of its units */
#define NSEQ 4
#define TABLE 12

/* An adapter of shape s for c with B not zero, written to name in the temporary folder; its
 * floats in *out when out is given. */
static const char *write_adapter(const nv_config *c, const nv_lora_shape *s, uint64_t seed, float b_scale, const char *name,
                                 float **out) {
    const uint64_t n = nv_lora_param_count(c, s);
    float *p = malloc((size_t)n * sizeof(float));
    if (!p) return NULL;
    nv_lora_init_nonzero(c, s, p, seed, b_scale);
    const char *path = t_path(name);
    T_CHECK(nv_gguf_save_lora(c, s, p, path) == NV_OK, "%s", nv_errmsg());
    if (out) *out = p;
    else free(p);
    return path;
}

/* Runs the NSEQ prompts in two steps of LEN/2 rows each, sequence i with the adapters ad[i] (NULL:
 * none), and keeps each one's last-row logits in out[i]. seqs_on selects which sequences run (the
 * others sit out). */
static int run_two_steps(const nv_model *m, const nv_adapters *set, int toks[NSEQ][LEN], const nv_adapter_mix *const ad[NSEQ],
                         unsigned seqs_on, float *out[NSEQ]) {
    const nv_config *c = &m->config;
    nv_kv_pages kv;
    nv_batch_state bs;
    int table[NSEQ][TABLE];
    for (int i = 0; i < NSEQ; i++)
        for (int b = 0; b < TABLE; b++) table[i][b] = i * TABLE + b;
    if (nv_kv_pages_init(&kv, c, 8, NSEQ * TABLE, NV_KV_F32) != NV_OK) return 0;
    if (nv_batch_state_init(&bs, c, NSEQ * LEN, NSEQ) != NV_OK || nv_batch_state_set_adapters(&bs, c, set) != NV_OK) {
        nv_kv_pages_free(&kv);
        return 0;
    }
    int ok = 1;
    for (int step = 0; step < 2 && ok; step++) {
        nv_batch_seq q[NSEQ];
        int idx[NSEQ], n = 0;
        for (int i = 0; i < NSEQ; i++) {
            if (!(seqs_on >> i & 1)) continue;
            q[n] = (nv_batch_seq){toks[i] + step * LEN / 2, LEN / 2, step * LEN / 2, table[i], step == 1, ad[i], NULL};
            idx[n++] = i;
        }
        ok = nv_batch_forward(m, &bs, &kv, q, n) == NV_OK;
        for (int j = 0; ok && step == 1 && j < n; j++)
            memcpy(out[idx[j]], nv_batch_logits(&bs, c, j), (size_t)c->vocab_size * sizeof(float));
    }
    if (!ok) fprintf(stderr, "    %s\n", nv_errmsg());
    nv_batch_state_free(&bs);
    nv_kv_pages_free(&kv);
    return ok;
}

/* Four sets of NSEQ logit rows of V floats (a test's mixed, plain, alone and reference runs). */
static void logit_rows_alloc(float *rows[4][NSEQ], int V) {
    for (int s = 0; s < 4; s++)
        for (int i = 0; i < NSEQ; i++) rows[s][i] = malloc((size_t)V * sizeof(float));
}

static void logit_rows_free(float *rows[4][NSEQ]) {
    for (int s = 0; s < 4; s++)
        for (int i = 0; i < NSEQ; i++) free(rows[s][i]);
}

static float max_abs(const float *a, int n) {
    float w = 0.0f;
    for (int i = 0; i < n; i++) w = fmaxf(w, fabsf(a[i]));
    return w;
}

static float max_diff(const float *a, const float *b, int n) {
    float w = 0.0f;
    for (int i = 0; i < n; i++) w = fmaxf(w, fabsf(a[i] - b[i]));
    return w;
}

static void test_batch_rows_take_their_adapters(void) {
    const nv_config c = {48, 96, 2, 6, 2, 12, 300, 128, 10000.0f, 1e-5f, 0, 1, 0, {0}, 0, NV_CONFIG_PLAIN}; /* GQA, QK-norm */
    const nv_lora_shape s1 = {4, 8.0f, NV_LORA_ALL}, s2 = {2, 2.0f, NV_LORA_Q | NV_LORA_V | NV_LORA_GATE};
    float *p1, *p2;
    const char *f1 = write_adapter(&c, &s1, 5, 0.3f, "one.gguf", &p1);
    char f1_copy[700];
    snprintf(f1_copy, sizeof f1_copy, "%s", f1);
    char f2[700]; /* t_path's buffers are reused */
    snprintf(f2, sizeof f2, "%s", write_adapter(&c, &s2, 6, 0.5f, "two.gguf", &p2));
    int toks[NSEQ][LEN];
    nv_rng rng;
    nv_rng_seed(&rng, 3);
    for (int i = 0; i < NSEQ; i++)
        for (int p = 0; p < LEN; p++) toks[i][p] = 3 + (int)(nv_rng_uniform(&rng) * (float)(c.vocab_size - 3));
    memcpy(toks[2], toks[0], sizeof toks[0]); /* sequences 0 and 2: one adapter, one prompt, rows apart */
    const nv_engine_id engines[3] = {NV_ENGINE_SCALAR, nv_engine_best_float(), nv_engine_best()};
    static float ref32[2][300]; /* the scalar engine's merged logits of sequences 0 and 3 */
    for (int e = 0; e < 3; e++) {
        if (e && engines[e] == engines[e - 1]) continue;
        const nv_engine_id eng = engines[e];
        nv_model base, merged[2];
        T_CHECK(nv_model_alloc(&base, &c) == NV_OK && nv_model_alloc(&merged[0], &c) == NV_OK &&
                    nv_model_alloc(&merged[1], &c) == NV_OK,
                "%s", nv_errmsg());
        nv_model_init_random(&base, 11);
        for (uint64_t i = 0; i < base.n_params; i++) base.params[i] *= 8.0f; /* logits well apart */
        for (int k = 0; k < 2; k++) memcpy(merged[k].params, base.params, (size_t)base.n_params * sizeof(float));
        nv_lora_merge(&merged[0], &s1, p1, 1.0f);
        nv_lora_merge(&merged[1], &s2, p2, 1.0f);
        T_CHECK(nv_model_build_plans(&base, eng) == NV_OK && nv_model_build_plans(&merged[0], eng) == NV_OK &&
                    nv_model_build_plans(&merged[1], eng) == NV_OK,
                "%s", nv_errmsg());
        nv_adapters set;
        nv_adapters_init(&set, 4);
        T_CHECK(nv_adapters_add(&set, &base, "one", f1_copy, 1.0f) == NV_OK, "%s", nv_errmsg());
        T_CHECK(nv_adapters_add(&set, &base, "two", f2, 1.0f) == NV_OK, "%s", nv_errmsg());
        T_CHECK(set.live == 2 && nv_adapters_find(&set, "two", NULL) == 2 && nv_adapters_find(&set, "three", NULL) == 0, "find");
        T_CHECK(set.v[0].hash != set.v[1].hash && set.v[0].hash && set.v[1].hash, "adapter identities");
        const int V = c.vocab_size;
        float *rows[4][NSEQ];
        logit_rows_alloc(rows, V);
        float **mixed = rows[0], **plain = rows[1], **alone = rows[2], **ref = rows[3];
        const nv_adapter_mix one = {1, {1}, {1.0f}, {set.v[0].gen}}, two = {1, {2}, {1.0f}, {set.v[1].gen}};
        const nv_adapter_mix *const ad[NSEQ] = {&one, NULL, &one, &two}, *const none[NSEQ] = {NULL};
        T_CHECK(run_two_steps(&base, &set, toks, ad, 0xF, mixed), "mixed step");
        T_CHECK(run_two_steps(&base, NULL, toks, none, 0xF, plain), "base step");
        T_CHECK(run_two_steps(&base, &set, toks, ad, 0x1, alone), "adapter one alone");
        T_CHECK(run_two_steps(&base, &set, toks, ad, 0x8, alone), "adapter two alone");
        T_CHECK(!memcmp(mixed[1], plain[1], (size_t)V * sizeof(float)), "%s: the base's row changed beside adapters",
                nv_engine_name(eng));
        T_CHECK(!memcmp(mixed[0], mixed[2], (size_t)V * sizeof(float)) && !memcmp(mixed[0], alone[0], (size_t)V * sizeof(float)),
                "%s: an adapter's rows depend on what shares the step", nv_engine_name(eng));
        T_CHECK(!memcmp(mixed[3], alone[3], (size_t)V * sizeof(float)), "%s: adapter two's rows depend on the step",
                nv_engine_name(eng));
        /* against the merged models, every sequence under one adapter: as close as fp32 rounding, or
         * on a bf16/int8 engine as close as that engine's merged model is to the fp32 one */
        T_CHECK(run_two_steps(&merged[0], NULL, toks, none, 0x1, ref), "merged one");
        T_CHECK(run_two_steps(&merged[1], NULL, toks, none, 0x8, ref), "merged two");
        if (e == 0)
            for (int i = 0; i < NSEQ; i += 3) memcpy(ref32[i / 3], ref[i], (size_t)V * sizeof(float));
        for (int i = 0; i < NSEQ; i += 3) {
            const float d = max_diff(mixed[i], ref[i], V), scale = max_abs(ref[i], V);
            const float own = max_diff(ref[i], ref32[i / 3], V), bound = fmaxf(1e-4f * scale, 3.0f * own);
            T_CHECK(d <= bound, "%s: sequence %d is %.3g from the merged model's logits (bound %.3g, max %.3g)", nv_engine_name(eng), i,
                    (double)d, (double)bound, (double)scale);
            const float effect = max_diff(mixed[i], plain[i], V); /* well beyond the distance to the merged model */
            T_CHECK(effect > 5.0f * d && effect > 0.01f * scale, "%s: the adapter changes little (%.3g)", nv_engine_name(eng),
                    (double)effect);
        }
        /* an adapter number the state does not have */
        nv_kv_pages kv;
        nv_batch_state bs;
        int table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
        T_CHECK(nv_kv_pages_init(&kv, &c, 8, 8, NV_KV_F32) == NV_OK && nv_batch_state_init(&bs, &c, 8, 1) == NV_OK &&
                    nv_batch_state_set_adapters(&bs, &c, &set) == NV_OK,
                "%s", nv_errmsg());
        const nv_adapter_mix three = {1, {3}, {1.0f}, {0}}, unordered = {2, {2, 1}, {1.0f, 1.0f}, {0, 0}},
                             nine = {NV_MIX_ADAPTERS + 1, {0}, {0}, {0}};
        nv_batch_seq q = {toks[0], 2, 0, table, 1, &three, NULL};
        T_CHECK(nv_batch_forward(&base, &bs, &kv, &q, 1) == NV_EINVAL && strstr(nv_errmsg(), "adapter 3, which is not loaded"), "%s", nv_errmsg());
        q.lora = &unordered;
        T_CHECK(nv_batch_forward(&base, &bs, &kv, &q, 1) == NV_EINVAL && strstr(nv_errmsg(), "out of order"), "%s", nv_errmsg());
        q.lora = &nine;
        T_CHECK(nv_batch_forward(&base, &bs, &kv, &q, 1) == NV_EINVAL && strstr(nv_errmsg(), "adapters"), "%s", nv_errmsg());
        nv_batch_state_set_adapters(&bs, &c, NULL);
        q.lora = &one;
        T_CHECK(nv_batch_forward(&base, &bs, &kv, &q, 1) == NV_EINVAL, "an adapter on a state without any");
        nv_batch_state_free(&bs);
        nv_kv_pages_free(&kv);
        logit_rows_free(rows);
        /* refusals: the set is unchanged by each */
        T_CHECK(nv_adapters_add(&set, &base, "one", f2, 1.0f) != NV_OK && strstr(nv_errmsg(), "twice"), "%s", nv_errmsg());
        T_CHECK(nv_adapters_add(&set, &base, "", f2, 1.0f) != NV_OK, "an empty name");
        char long_name[NV_ADAPTER_NAME_CAP + 8];
        memset(long_name, 'x', NV_ADAPTER_NAME_CAP);
        long_name[NV_ADAPTER_NAME_CAP] = 0;
        T_CHECK(nv_adapters_add(&set, &base, long_name, f2, 1.0f) != NV_OK, "a name of %d characters", NV_ADAPTER_NAME_CAP);
        T_CHECK(nv_adapters_add(&set, &base, "none", t_path("missing.gguf"), 1.0f) != NV_OK && strstr(nv_errmsg(), "missing.gguf"),
                "%s", nv_errmsg());
        T_CHECK(nv_adapters_add(&set, &base, "nan", f2, NAN) != NV_OK, "a NaN scale");
        const nv_config other = {64, 96, 2, 4, 4, 16, 300, 64, 10000.0f, 1e-5f, 0, 1, 0, {0}, 0, NV_CONFIG_PLAIN};
        const char *fo = write_adapter(&other, &s2, 7, 0.1f, "other.gguf", NULL);
        T_CHECK(nv_adapters_add(&set, &base, "other", fo, 1.0f) != NV_OK, "an adapter of another shape");
        const nv_lora_shape huge = {1, 1e6f, NV_LORA_Q}; /* alpha / rank x B beyond float's range */
        const char *fh = write_adapter(&c, &huge, 8, 1e35f, "huge.gguf", NULL);
        T_CHECK(nv_adapters_add(&set, &base, "huge", fh, 1.0f) != NV_OK && strstr(nv_errmsg(), "not finite"), "%s", nv_errmsg());
        const nv_lora_shape wide = {5, 5.0f, NV_LORA_Q}; /* above the set's max_rank of 4 */
        const char *fw = write_adapter(&c, &wide, 9, 0.1f, "wide.gguf", NULL);
        T_CHECK(nv_adapters_add(&set, &base, "wide", fw, 1.0f) != NV_OK && strstr(nv_errmsg(), "--max-lora-rank"), "%s", nv_errmsg());
        T_CHECK(set.live == 2, "refused adapters were added");
        /* removal at run time: a pinned adapter lives until its last unpin; its slot then takes the
         * next adapter with a new generation, which an old lookup cannot pin */
        unsigned gen1 = 0, gen2 = 0;
        T_CHECK(nv_adapters_find(&set, "two", &gen1) == 2 && nv_adapters_pin(&set, 2, gen1), "pin");
        T_CHECK(nv_adapters_remove(&set, "two") == NV_OK && nv_adapters_find(&set, "two", NULL) == 0 && set.live == 1, "remove");
        T_CHECK(set.v[1].a != NULL && set.v[1].state == NV_ADAPTER_REMOVED, "a pinned adapter was freed");
        T_CHECK(nv_adapters_pin(&set, 2, gen1), "a removed adapter still held could not be pinned by a request that named it before");
        nv_adapters_unpin(&set, 2);
        T_CHECK(nv_adapters_add(&set, &base, "three", f2, 1.0f) == NV_OK && nv_adapters_find(&set, "three", NULL) == 3,
                "a removed adapter's slot was taken before its last request: %s", nv_errmsg());
        nv_adapters_unpin(&set, 2);
        T_CHECK(set.v[1].a == NULL && set.v[1].state == NV_ADAPTER_FREE, "the last unpin did not free it");
        T_CHECK(!nv_adapters_pin(&set, 2, gen1), "a freed adapter was pinned");
        T_CHECK(nv_adapters_remove(&set, "two") != NV_OK, "removed twice");
        T_CHECK(nv_adapters_add(&set, &base, "two", f2, 1.0f) == NV_OK && nv_adapters_find(&set, "two", &gen2) == 2 && gen2 != gen1,
                "slot 2 again, generation %u then %u", gen1, gen2);
        T_CHECK(!nv_adapters_pin(&set, 2, gen1) && nv_adapters_pin(&set, 2, gen2), "pins by generation");
        nv_adapters_unpin(&set, 2);
        char names[NV_MAX_ADAPTERS][NV_ADAPTER_NAME_CAP];
        T_CHECK(nv_adapters_names(&set, names, NULL, NV_MAX_ADAPTERS) == 3 && !strcmp(names[0], "one") && !strcmp(names[1], "two") &&
                    !strcmp(names[2], "three"),
                "names");
        nv_adapters_free(&set);
        for (int k = 0; k < 2; k++) nv_model_free(&merged[k]);
        nv_model_free(&base);
    }
    free(p1);
    free(p2);
}

/* llama.cpp's per-request lists: a sequence under a mix of adapters at their factors gives the
 * logits of the model with those adapters merged at those factors (fp32: to rounding; bf16/int8:
 * as close as that engine's merged model is to the fp32 one), and its rows do not depend on what
 * shares the step; mixes are kept in order, at most NV_MIX_ADAPTERS; each mix has its own identity. */
static void test_batch_rows_take_their_mixes(void) {
    const nv_config c = {48, 96, 2, 6, 2, 12, 300, 128, 10000.0f, 1e-5f, 0, 1, 0, {0}, 0, NV_CONFIG_PLAIN};
    const nv_lora_shape s1 = {4, 8.0f, NV_LORA_ALL}, s2 = {2, 2.0f, NV_LORA_Q | NV_LORA_V | NV_LORA_GATE};
    float *p1 = NULL, *p2 = NULL;
    char f1[700], f2[700];
    snprintf(f1, sizeof f1, "%s", write_adapter(&c, &s1, 5, 0.3f, "mix-one.gguf", &p1));
    snprintf(f2, sizeof f2, "%s", write_adapter(&c, &s2, 6, 0.5f, "mix-two.gguf", &p2));
    if (!p1 || !p2) return;
    int toks[NSEQ][LEN];
    nv_rng rng;
    nv_rng_seed(&rng, 4);
    for (int i = 0; i < NSEQ; i++)
        for (int p = 0; p < LEN; p++) toks[i][p] = 3 + (int)(nv_rng_uniform(&rng) * (float)(c.vocab_size - 3));
    /* sequence 0: one at 0.5; 1: the base; 2: one at 1 and two at 0.7; 3: two at -1 */
    const float factors[NSEQ][2] = {{0.5f, 0.0f}, {0.0f, 0.0f}, {1.0f, 0.7f}, {0.0f, -1.0f}};
    const int V = c.vocab_size;
    static float ref32[NSEQ][300];
    const nv_engine_id engines[2] = {NV_ENGINE_SCALAR, nv_engine_best()};
    for (int e = 0; e < 2; e++) {
        if (e && engines[e] == engines[0]) continue;
        const nv_engine_id eng = engines[e];
        nv_model base, merged[NSEQ];
        T_CHECK(nv_model_alloc(&base, &c) == NV_OK, "%s", nv_errmsg());
        nv_model_init_random(&base, 11);
        for (uint64_t i = 0; i < base.n_params; i++) base.params[i] *= 8.0f;
        T_CHECK(nv_model_build_plans(&base, eng) == NV_OK, "%s", nv_errmsg());
        nv_adapters set;
        nv_adapters_init(&set, 4);
        T_CHECK(nv_adapters_add(&set, &base, "one", f1, 1.0f) == NV_OK && nv_adapters_add(&set, &base, "two", f2, 1.0f) == NV_OK, "%s",
                nv_errmsg());
        nv_adapter_mix mix[NSEQ] = {{0}};
        const nv_adapter_mix *ad[NSEQ], *const none[NSEQ] = {NULL};
        for (int i = 0; i < NSEQ; i++) {
            for (int k = 2; k >= 1; k--) /* given the later adapter first: the mix keeps them in order */
                T_CHECK(nv_adapter_mix_set(&mix[i], k, set.v[k - 1].gen, factors[i][k - 1]) == NV_OK, "mix_set");
            ad[i] = mix[i].n ? &mix[i] : NULL;
        }
        T_CHECK(mix[2].n == 2 && mix[2].k[0] == 1 && mix[2].k[1] == 2 && mix[2].factor[1] == 0.7f && !mix[1].n, "the mixes' order");
        float *rows[4][NSEQ];
        logit_rows_alloc(rows, V);
        float **mixed = rows[0], **plain = rows[1], **alone = rows[2], **ref = rows[3];
        T_CHECK(run_two_steps(&base, &set, toks, ad, 0xF, mixed) && run_two_steps(&base, NULL, toks, none, 0xF, plain), "steps");
        for (int i = 0; i < NSEQ; i++) T_CHECK(run_two_steps(&base, &set, toks, ad, 1u << i, alone), "sequence %d alone", i);
        T_CHECK(!memcmp(mixed[1], plain[1], (size_t)V * sizeof(float)), "%s: the base's row changed beside mixes", nv_engine_name(eng));
        for (int i = 0; i < NSEQ; i++)
            T_CHECK(!memcmp(mixed[i], alone[i], (size_t)V * sizeof(float)), "%s: sequence %d depends on what shares its step",
                    nv_engine_name(eng), i);
        /* the merged models of each mix, every sequence against its own */
        for (int i = 0; i < NSEQ; i++) {
            T_CHECK(nv_model_alloc(&merged[i], &c) == NV_OK, "%s", nv_errmsg());
            memcpy(merged[i].params, base.params, (size_t)base.n_params * sizeof(float));
            if (factors[i][0] != 0.0f) nv_lora_merge(&merged[i], &s1, p1, factors[i][0]);
            if (factors[i][1] != 0.0f) nv_lora_merge(&merged[i], &s2, p2, factors[i][1]);
            T_CHECK(nv_model_build_plans(&merged[i], eng) == NV_OK, "%s", nv_errmsg());
            T_CHECK(run_two_steps(&merged[i], NULL, toks, none, 1u << i, ref), "merged %d", i);
            if (e == 0) memcpy(ref32[i], ref[i], (size_t)V * sizeof(float));
            const float d = max_diff(mixed[i], ref[i], V), scale = max_abs(ref[i], V);
            const float own = max_diff(ref[i], ref32[i], V), bound = fmaxf(1e-4f * scale, 3.0f * own);
            T_CHECK(d <= bound, "%s: sequence %d is %.3g from its merged model's logits (bound %.3g, max %.3g)", nv_engine_name(eng), i,
                    (double)d, (double)bound, (double)scale);
            if (i != 1) {
                const float effect = max_diff(mixed[i], plain[i], V);
                T_CHECK(effect > 5.0f * d && effect > 0.01f * scale, "%s: mix %d changes little (%.3g)", nv_engine_name(eng), i,
                        (double)effect);
            }
            nv_model_free(&merged[i]);
        }
        /* identities: the adapter's own at factor 1, another for every other mix, 0 for none */
        const nv_adapter_mix single = {1, {1}, {1.0f}, {set.v[0].gen}};
        const uint64_t r0 = nv_adapters_mix_root(&set, &mix[0]), r2 = nv_adapters_mix_root(&set, &mix[2]),
                       r3 = nv_adapters_mix_root(&set, &mix[3]), again = nv_adapters_mix_root(&set, &(nv_adapter_mix){mix[0].n, {1}, {0.5f}, {0}});
        T_CHECK(nv_adapters_mix_root(&set, &single) == set.v[0].hash && !nv_adapters_mix_root(&set, &mix[1]) && r0 && r2 && r3 &&
                    r0 != set.v[0].hash && r0 != r2 && r0 != r3 && r2 != r3 && r3 != set.v[1].hash && again == r0 &&
                    nv_adapters_mix_root(&set, &(nv_adapter_mix){1, {1}, {0.25f}, {0}}) != r0,
                "mix identities");
        logit_rows_free(rows);
        nv_adapters_free(&set);
        nv_model_free(&base);
    }
    /* a mix holds at most NV_MIX_ADAPTERS; 0 takes one out; a factor given again replaces the old */
    nv_adapter_mix m = {0};
    for (int k = NV_MIX_ADAPTERS; k >= 1; k--) T_CHECK(nv_adapter_mix_set(&m, k * 2, 0, (float)k) == NV_OK, "set %d", k);
    T_CHECK(nv_adapter_mix_set(&m, 3, 0, 1.0f) == NV_ERANGE && m.n == NV_MIX_ADAPTERS, "a mix of %d took one more", NV_MIX_ADAPTERS);
    T_CHECK(nv_adapter_mix_set(&m, 4, 7, -2.0f) == NV_OK && m.n == NV_MIX_ADAPTERS && m.k[1] == 4 && m.factor[1] == -2.0f && m.gen[1] == 7,
            "replaced");
    T_CHECK(nv_adapter_mix_set(&m, 4, 0, 0.0f) == NV_OK && m.n == NV_MIX_ADAPTERS - 1 && m.k[1] == 6, "taken out");
    T_CHECK(nv_adapter_mix_set(&m, 5, 0, 0.0f) == NV_OK && m.n == NV_MIX_ADAPTERS - 1, "an absent one taken out");
    T_CHECK(nv_adapter_mix_set(&m, 3, 0, 1.0f) == NV_OK && m.k[0] == 2 && m.k[1] == 3 && m.k[2] == 6, "put in its place");
    for (int i = 1; i < m.n; i++) T_CHECK(m.k[i] > m.k[i - 1], "order at %d", i);
    free(p1);
    free(p2);
}

static int parse_list(const nv_api_ctx *ctx, const char *text, const char *param, nv_adapter_mix *m, nv_api_error *err) {
    *m = (nv_adapter_mix){0};
    memset(err, 0, sizeof *err);
    cJSON *j = cJSON_Parse(text);
    const int rc = nv_api_lora_parse(ctx, j, param, m, err);
    cJSON_Delete(j);
    return rc;
}

/* The list's rules without a server: a set of ten live slots (no plans: only names and states are
 * read). The 8-adapter limit holds for the list's outcome (an entry zeroed later frees its place;
 * the model's adapter takes one); a scale below float's normal range is 0; a whole body's errors
 * name the body; POST's list is all or nothing; a request's mix is checked when it is made. */
static void test_lora_list_rules(void) {
    static nv_adapters set;
    nv_adapters_init(&set, 4);
    for (int i = 0; i < 10; i++) {
        snprintf(set.v[i].name, sizeof set.v[i].name, "ad-%d", i);
        set.v[i].state = NV_ADAPTER_LIVE;
        set.v[i].gen = 1;
        set.live++;
    }
    nv_api_ctx ctx = {.model_id = "base", .adapters = &set};
    nv_api_error err;
    nv_adapter_mix m;
    char list[600];
    cJSON *j;
#define PARSE(text, param) parse_list(&ctx, text, param, &m, &err)
    snprintf(list, sizeof list, "[");
    for (int i = 0; i < 9; i++) snprintf(list + strlen(list), sizeof list - strlen(list), "{\"id\":%d,\"scale\":1},", i);
    snprintf(list + strlen(list), sizeof list - strlen(list), "{\"id\":0,\"scale\":0}]");
    T_CHECK(PARSE(list, "lora") == 0 && m.n == 8 && m.k[0] == 2 && m.k[7] == 9, "nine, then the first at 0: %s (n %d)", err.message, m.n);
    const size_t cut = strlen(list) - strlen(",{\"id\":0,\"scale\":0}]");
    list[cut] = ']', list[cut + 1] = 0; /* the nine alone */
    T_CHECK(PARSE(list, "lora") == 400 && strstr(err.message, "At most 8") && !strcmp(err.param, "lora"), "nine: %s", err.message);
    T_CHECK(PARSE("[{\"id\":3,\"scale\":1e-40},{\"id\":4,\"scale\":-2}]", "lora") == 0 && m.n == 1 && m.k[0] == 5 && m.factor[0] == -2.0f,
            "a subnormal scale: n %d", m.n);
    T_CHECK(PARSE("[{\"id\":3,\"scale\":2},{\"id\":3,\"scale\":0.5}]", "lora") == 0 && m.n == 1 && m.factor[0] == 0.5f && m.gen[0] == 1,
            "a later entry wins");
    T_CHECK(PARSE("{\"id\":3}", NULL) == 400 && strstr(err.message, "The request body") && !err.param[0], "a body's error: %s %s",
            err.message, err.param);
    /* the model's adapter and eight more */
    j = cJSON_Parse("{\"model\":\"ad-9\",\"lora\":[{\"id\":0,\"scale\":1},{\"id\":1,\"scale\":1},{\"id\":2,\"scale\":1},{\"id\":3,\"scale\":1},"
                    "{\"id\":4,\"scale\":1},{\"id\":5,\"scale\":1},{\"id\":6,\"scale\":1},{\"id\":7,\"scale\":1}]}");
    char id[NV_API_MODEL_ID];
    T_CHECK(nv_api_check_model(&ctx, j, &m, id, &err) == 400 && strstr(err.message, "the model's included"), "%s", err.message);
    cJSON_ReplaceItemInObject(j, "lora", cJSON_Parse("[{\"id\":9,\"scale\":0.5}]"));
    T_CHECK(nv_api_check_model(&ctx, j, &m, id, &err) == 0 && m.n == 1 && m.k[0] == 10 && m.factor[0] == 0.5f && !strcmp(id, "ad-9"),
            "the model's adapter at the list's scale");
    cJSON_Delete(j);
    /* POST: all or nothing; GET lists the factors */
    T_CHECK(nv_api_lora_apply(&ctx, "[{\"id\":1,\"scale\":0.5}]", 22, &err) == 0 && set.v[1].applied == 0.5f, "POST");
    nv_adapters_applied(&set, &m);
    T_CHECK(m.n == 1 && m.k[0] == 2 && m.factor[0] == 0.5f, "applied");
    T_CHECK(nv_api_lora_apply(&ctx, "[{\"id\":1,\"scale\":0.5", 21, &err) == 400 && !strcmp(err.code, "invalid_json"), "broken JSON");
    nv_adapter_mix stale = {1, {3}, {1.0f}, {7}}; /* generation 7: replaced since */
    T_CHECK(!nv_adapters_apply(&set, &stale) && set.v[1].applied == 0.5f && set.v[2].applied == 0.0f, "a stale list changed the set");
    char *got = nv_api_lora_list(&ctx);
    cJSON *listed = got ? cJSON_Parse(got) : NULL;
    const cJSON *one = cJSON_GetArrayItem(listed, 1);
    T_CHECK(cJSON_GetArraySize(listed) == 10 && cJSON_GetObjectItem(one, "id")->valueint == 1 &&
                cJSON_GetObjectItem(one, "scale")->valuedouble == 0.5 && !strcmp(cJSON_GetObjectItem(one, "name")->valuestring, "ad-1") &&
                cJSON_GetObjectItem(cJSON_GetArrayItem(listed, 9), "scale")->valuedouble == 0.0,
            "GET: %s", got ? got : "");
    cJSON_Delete(listed);
    free(got);
    /* a request's mix is checked when it is made */
    const int prompt[2] = {1, 2};
    nv_req *r = NULL;
    const nv_adapter_mix bad[3] = {{NV_MIX_ADAPTERS + 1, {0}, {0}, {0}}, {2, {3, 2}, {1, 1}, {0}}, {1, {4}, {0.0f}, {0}}};
    for (int i = 0; i < 3; i++) {
        nv_req_params p = {.prompt = prompt, .n_prompt = 2, .max_tokens = 1, .vocab_size = 32, .temperature = 1, .top_p = 1,
                           .think_budget = -1, .lora = bad[i]};
        T_CHECK(nv_req_create(&r, &p) == NV_EINVAL && !r, "bad mix %d made a request", i);
    }
#undef PARSE
    nv_adapters_free(&set);
}

/* ---- the server ------------------------------------------------------------------------------- */

/* Granite's branches scaled into the residual: an adapter's update of wo and w2 joins its product
 * before the scaling, so the rows of an adapter still give the merged model's logits (and a base row
 * beside them its own bits). */
static void test_granite_rows_take_their_adapters(void) {
    nv_config c = {48, 96, 2, 6, 2, 8, 300, 128, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    nv_config_set_granite(&c, 4.0, 0.2, 0.3, 2.0);
    const nv_lora_shape sh = {4, 8.0f, NV_LORA_O | NV_LORA_DOWN | NV_LORA_Q};
    float *p = NULL;
    const char *f = write_adapter(&c, &sh, 5, 0.3f, "granite-ad.gguf", &p);
    char path[700];
    snprintf(path, sizeof path, "%s", f ? f : "");
    nv_model base, merged;
    T_CHECK(p && nv_model_alloc(&base, &c) == NV_OK && nv_model_alloc(&merged, &c) == NV_OK, "%s", nv_errmsg());
    if (!p || !base.params || !merged.params) return;
    nv_model_init_random(&base, 11);
    for (uint64_t i = 0; i < base.n_params; i++) base.params[i] *= 8.0f;
    memcpy(merged.params, base.params, (size_t)base.n_params * sizeof(float));
    nv_lora_merge(&merged, &sh, p, 1.0f);
    T_CHECK(nv_model_build_plans(&base, NV_ENGINE_SCALAR) == NV_OK && nv_model_build_plans(&merged, NV_ENGINE_SCALAR) == NV_OK, "%s",
            nv_errmsg());
    nv_adapters set;
    nv_adapters_init(&set, 4);
    T_CHECK(nv_adapters_add(&set, &base, "one", path, 1.0f) == NV_OK, "%s", nv_errmsg());
    int toks[NSEQ][LEN];
    for (int i = 0; i < NSEQ; i++)
        for (int q = 0; q < LEN; q++) toks[i][q] = 3 + (i * 131 + q * 17) % (c.vocab_size - 3);
    const int V = c.vocab_size;
    const nv_adapter_mix one = {1, {1}, {1.0f}, {set.v[0].gen}};
    const nv_adapter_mix *const ad[NSEQ] = {&one, NULL, &one, NULL}, *const none[NSEQ] = {NULL};
    float *rows[4][NSEQ];
    logit_rows_alloc(rows, V);
    float **mixed = rows[0], **plain = rows[1], **ref = rows[3];
    T_CHECK(run_two_steps(&base, &set, toks, ad, 0xF, mixed) && run_two_steps(&base, NULL, toks, none, 0xF, plain) &&
                run_two_steps(&merged, NULL, toks, none, 0xF, ref),
            "steps");
    for (int i = 0; i < NSEQ; i++) {
        const float d = max_diff(mixed[i], ad[i] ? ref[i] : plain[i], V), scale = max_abs(ref[i], V);
        T_CHECK(ad[i] ? d <= 1e-4f * scale : d == 0.0f, "sequence %d (adapter %d) is %.3g from its model's logits (max %.3g)", i, !!ad[i],
                (double)d, (double)scale);
        if (ad[i]) T_CHECK(max_diff(mixed[i], plain[i], V) > 0.01f * scale, "the adapter changes little");
    }
    logit_rows_free(rows);
    nv_adapters_free(&set);
    nv_model_free(&base);
    nv_model_free(&merged);
    free(p);
}

/* The greedy text of a completion (NULL on a failure), with the request's 'lora' list when given. */
static char *completion_lora(int port, const char *model, const char *lora, const char *prompt, int max_tokens, int *cached) {
    char body[2048];
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0%s%s}", model, prompt,
             max_tokens, lora ? ",\"lora\":" : "", lora ? lora : "");
    resp r;
    char *text = NULL;
    if (http(port, "POST", "/v1/completions", NULL, body, &r) && r.status == 200) {
        cJSON *root = cJSON_Parse(r.body);
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0);
        const cJSON *t = cJSON_GetObjectItem(ch, "text"), *m = cJSON_GetObjectItem(root, "model");
        const cJSON *u = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "usage"), "prompt_tokens_details");
        if (cJSON_IsString(t) && cJSON_IsString(m) && !strcmp(m->valuestring, model)) text = strdup(t->valuestring);
        if (cached) *cached = u ? cJSON_GetObjectItem(u, "cached_tokens")->valueint : -1;
        cJSON_Delete(root);
    } else {
        fprintf(stderr, "    %s: %d %s\n", model, r.status, r.body ? r.body : "");
    }
    resp_free(&r);
    return text;
}

static char *completion(int port, const char *model, const char *prompt, int max_tokens, int *cached) {
    return completion_lora(port, model, NULL, prompt, max_tokens, cached);
}

static int post(int port, const char *path, const char *body, resp *r) { return http(port, "POST", path, NULL, body, r); }

/* --allow-lora-updates: adapters loaded and removed while serving; a request running on an adapter
 * being removed finishes on it; the name is gone at once, the file can be loaded again. want_a is
 * the greedy text of fa on prompt from the first server (40 tokens). */
static void test_runtime_updates(const char *base, const char *tok, const char *fa, const char *fb, const char *prompt,
                                 const char *want_b) {
    server s;
    if (!server_spawn(&s, "lora-updates", NULL, "NERVE_LOG=info NERVE_TEST_STEP_DELAY_MS=5", base, tok,
                      "--engine scalar --kv-cache-dtype f32 --kv-disk-cache 0 --allow-lora-updates --max-lora-rank 6", 60)) {
        T_CHECK(0, "the server did not start");
        return;
    }
    resp r;
    char body[1600];
    snprintf(body, sizeof body, "{\"lora_name\":\"ad-x\",\"lora_path\":\"%s\"}", fb);
    T_CHECK(post(s.port, "/v1/load_lora_adapter", body, &r) && r.status == 200 && strstr(r.body, "Success"), "load: %d %s", r.status,
            r.body);
    resp_free(&r);
    T_CHECK(post(s.port, "/v1/load_lora_adapter", body, &r) && r.status == 400 && strstr(r.body, "already been loaded") &&
                strstr(r.body, "\"param\":\"lora_name\""),
            "loaded twice: %d %s", r.status, r.body);
    resp_free(&r);
    snprintf(body, sizeof body, "{\"lora_name\":\"ad-wide\",\"lora_path\":\"%s\"}", fa);
    T_CHECK(post(s.port, "/v1/load_lora_adapter", body, &r) && r.status == 400 && strstr(r.body, "--max-lora-rank"), "rank 8 of 6: %d %s",
            r.status, r.body);
    resp_free(&r);
    T_CHECK(post(s.port, "/v1/load_lora_adapter", "{\"lora_name\":\"a\\nb\",\"lora_path\":\"x\"}", &r) && r.status == 400 &&
                strstr(r.body, "\"param\":\"lora_name\""),
            "a control character in the name: %d %s", r.status, r.body);
    resp_free(&r);
    T_CHECK(http(s.port, "GET", "/v1/models", NULL, NULL, &r) && r.status == 200 && strstr(r.body, "\"id\":\"ad-x\""), "%s", r.body);
    resp_free(&r);
    T_CHECK(http(s.port, "GET", "/metrics", NULL, NULL, &r) && r.status == 200 && strstr(r.body, "\nnerve_lora_adapters 1\n") &&
                strstr(r.body, "nerve_lora_sequences{adapter=\"ad-x\",state=\"running\"} 0\n"),
            "metrics: %s", r.body);
    resp_free(&r);
    char *got = completion(s.port, "ad-x", prompt, 40, NULL);
    T_CHECK(got && want_b && !strcmp(got, want_b), "a loaded adapter's text '%s', at start '%s'", got ? got : "", want_b ? want_b : "");
    free(got);
    /* applied to requests that choose none (POST /lora-adapters), until it is removed */
    T_CHECK(post(s.port, "/lora-adapters", "[{\"id\":0,\"scale\":1}]", &r) && r.status == 200, "POST /lora-adapters: %d %s", r.status,
            r.body);
    resp_free(&r);
    got = completion(s.port, "stories260K", prompt, 40, NULL);
    T_CHECK(got && want_b && !strcmp(got, want_b), "the base with ad-x applied: '%s'", got ? got : "");
    free(got);
    /* removed while a request runs on it: that request finishes on the adapter */
    char req[2048];
    snprintf(req, sizeof req, "{\"model\":\"ad-x\",\"prompt\":\"%s\",\"max_tokens\":60,\"temperature\":0}", prompt);
    size_t len;
    char *raw = build_request("POST", "/v1/completions", NULL, req, &len);
    int fd = connect_to_within(s.port, 60);
    T_CHECK(fd >= 0 && send_all(fd, raw, len), "send");
    free(raw);
    sleep_ms(120); /* some steps in: 60 tokens take 300 ms or more */
    T_CHECK(post(s.port, "/v1/unload_lora_adapter", "{\"lora_name\":\"ad-x\"}", &r) && r.status == 200 && strstr(r.body, "removed"),
            "unload: %d %s", r.status, r.body);
    resp_free(&r);
    char *text = NULL;
    size_t n = 0;
    memset(&r, 0, sizeof r);
    T_CHECK(fd >= 0 && read_all(fd, &text, &n) && parse_response(text, n, &r) && r.status == 200, "the running request failed");
    if (fd >= 0) close(fd);
    cJSON *root = r.body ? cJSON_Parse(r.body) : NULL;
    const cJSON *t = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0), "text");
    const cJSON *mo = cJSON_GetObjectItem(root, "model");
    T_CHECK(cJSON_IsString(t) && want_b && !strncmp(t->valuestring, want_b, strlen(want_b)) && cJSON_IsString(mo) &&
                !strcmp(mo->valuestring, "ad-x"),
            "the request running while its adapter was removed: '%s' from '%s'", cJSON_IsString(t) ? t->valuestring : "",
            cJSON_IsString(mo) ? mo->valuestring : "");
    cJSON_Delete(root);
    resp_free(&r);
    free(text);
    T_CHECK(post(s.port, "/v1/completions", "{\"model\":\"ad-x\",\"prompt\":\"x\"}", &r) && r.status == 404, "after removal: %d",
            r.status);
    resp_free(&r);
    T_CHECK(post(s.port, "/v1/unload_lora_adapter", "{\"lora_name\":\"ad-x\"}", &r) && r.status == 404, "removed twice: %d", r.status);
    resp_free(&r);
    T_CHECK(http(s.port, "GET", "/lora-adapters", NULL, NULL, &r) && r.status == 200 && !strcmp(r.body, "[]"), "after removal: %s", r.body);
    resp_free(&r);
    T_CHECK(post(s.port, "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":2,\"lora\":[{\"id\":0,\"scale\":1}]}", &r) &&
                r.status == 400 && strstr(r.body, "invalid adapter id"),
            "a removed adapter's id: %d %s", r.status, r.body);
    resp_free(&r);
    got = completion(s.port, "stories260K", prompt, 40, NULL);
    T_CHECK(got && want_b && strcmp(got, want_b), "the base still runs the removed adapter: '%s'", got ? got : "");
    free(got);
    T_CHECK(http(s.port, "GET", "/metrics", NULL, NULL, &r) && r.status == 200 && strstr(r.body, "\nnerve_lora_adapters 0\n") &&
                !strstr(r.body, "adapter=\"ad-x\""),
            "metrics after removal");
    resp_free(&r);
    /* refusals: no file, not an adapter, the base's id, no name */
    snprintf(body, sizeof body, "{\"lora_name\":\"bad\",\"lora_path\":\"%s\"}", base);
    T_CHECK(post(s.port, "/v1/load_lora_adapter", body, &r) && r.status == 400 && strstr(r.body, "\"param\":\"lora_path\""), "%d %s",
            r.status, r.body);
    resp_free(&r);
    T_CHECK(post(s.port, "/v1/load_lora_adapter", "{\"lora_name\":\"bad\",\"lora_path\":\"/nonexistent/a.gguf\"}", &r) &&
                r.status == 400,
            "%d", r.status);
    resp_free(&r);
    snprintf(body, sizeof body, "{\"lora_name\":\"stories260K\",\"lora_path\":\"%s\"}", fb);
    T_CHECK(post(s.port, "/v1/load_lora_adapter", body, &r) && r.status == 400, "the base's id: %d", r.status);
    resp_free(&r);
    T_CHECK(post(s.port, "/v1/load_lora_adapter", "{\"lora_path\":\"x\"}", &r) && r.status == 400, "no name: %d", r.status);
    resp_free(&r);
    T_CHECK(post(s.port, "/v1/load_lora_adapter", "{\"lora_name\":\"y\"}", &r) && r.status == 400, "no path: %d", r.status);
    resp_free(&r);
    /* the same file again, under the old name: the same text */
    snprintf(body, sizeof body, "{\"lora_name\":\"ad-x\",\"lora_path\":\"%s\"}", fb);
    T_CHECK(post(s.port, "/v1/load_lora_adapter", body, &r) && r.status == 200, "load again: %d %s", r.status, r.body);
    resp_free(&r);
    got = completion(s.port, "ad-x", prompt, 40, NULL);
    T_CHECK(got && want_b && !strcmp(got, want_b), "loaded again: '%s'", got ? got : "");
    free(got);
    T_CHECK(http(s.port, "GET", "/lora-adapters", NULL, NULL, &r) && r.status == 200 && strstr(r.body, "\"id\":0,") &&
                strstr(r.body, "\"scale\":0,") && strstr(r.body, "\"name\":\"ad-x\""),
            "loaded again, not applied: %s", r.body);
    resp_free(&r);
    T_CHECK(server_stop_within(&s, 30) == 0, "stop");
    char *log = read_log(&s);
    T_CHECK(strstr(log, "added successfully") && strstr(log, "removed successfully"), "the log names the updates");
    free(log);
}

/* Whether `nerve generate` (scalar, greedy, 60 positions) of the base with these --lora flags writes
 * text (served greedy text of the same prompt) as far as both go, more than 20 characters. */
static int generate_gives(const char *base, const char *tok, const char *lora_flags, const char *prompt, const char *text) {
    char cmd[5000];
    snprintf(cmd, sizeof cmd, "generate -m %s -z %s --engine scalar -t 0 -n 60 %s -p '%s'", base, tok, lora_flags, prompt);
    if (t_nerve(cmd) != 0) {
        fprintf(stderr, "    %s\n", t_err);
        return 0;
    }
    /* generate prints the prompt, then the answer up to 60 positions */
    const size_t pl = strlen(prompt), al = strlen(t_out) > pl ? strlen(t_out) - pl : 0, gl = text ? strlen(text) : 0;
    const size_t n = al < gl ? al : gl;
    const int same = n > 20 && !strncmp(t_out, prompt, pl) && !strncmp(t_out + pl, text, n);
    if (!same) fprintf(stderr, "    served '%s', generate %s: '%s'\n", text ? text : "(none)", lora_flags, t_out);
    return same;
}

/* llama.cpp's LoRA API on a server of two adapters (ad-a: id 0, ad-b: id 1): GET /lora-adapters
 * lists them, a request's 'lora' list runs the base with those adapters at those factors (what
 * `generate --lora-scaled` gives), on /v1 and /completion alike; POST /lora-adapters sets the list
 * requests that choose none run with; a mix's KV is its own in the prefix cache; bad lists are
 * 400s that change nothing. tb, ta, tbb: the base's, ad-a's and ad-b's greedy text of prompt. */
static void test_lora_lists(int port, const char *base, const char *tok, const char *fa, const char *fb, const char *prompt,
                            const char *longp, const char *tb, const char *ta, const char *tbb) {
    resp r;
    T_CHECK(http(port, "GET", "/lora-adapters", NULL, NULL, &r) && r.status == 200, "GET /lora-adapters: %d", r.status);
    cJSON *list = r.body ? cJSON_Parse(r.body) : NULL;
    T_CHECK(cJSON_GetArraySize(list) == 2, "%s", r.body);
    for (int i = 0; i < 2 && cJSON_GetArraySize(list) == 2; i++) {
        const cJSON *e = cJSON_GetArrayItem(list, i), *path = cJSON_GetObjectItem(e, "path"), *name = cJSON_GetObjectItem(e, "name");
        T_CHECK(cJSON_GetObjectItem(e, "id")->valueint == i && cJSON_GetObjectItem(e, "scale")->valuedouble == 0.0 &&
                    cJSON_IsString(path) && !strcmp(path->valuestring, i ? fb : fa) && cJSON_IsString(name) &&
                    !strcmp(name->valuestring, i ? "ad-b" : "ad-a"),
                "entry %d: %s", i, r.body);
    }
    cJSON_Delete(list);
    resp_free(&r);
    /* a request's list: one adapter at 1 is that adapter; factors and two at once are the merged model's */
    char *t = completion_lora(port, "stories260K", "[{\"id\":0,\"scale\":1}]", prompt, 40, NULL);
    T_CHECK(t && ta && !strcmp(t, ta), "ad-a by its id: '%s', by its name '%s'", t ? t : "", ta ? ta : "");
    free(t);
    t = completion_lora(port, "stories260K", "[{\"id\":1,\"scale\":3},{\"id\":0,\"scale\":0.5},{\"id\":1,\"scale\":1.5}]", prompt, 40, NULL);
    char flags[1600];
    snprintf(flags, sizeof flags, "--lora-scaled %s 0.5 --lora-scaled %s 1.5", fa, fb);
    T_CHECK(t && strcmp(t, tb) && strcmp(t, ta) && strcmp(t, tbb) && generate_gives(base, tok, flags, prompt, t), "two adapters at 0.5 and 1.5");
    free(t);
    t = completion_lora(port, "stories260K", "[{\"id\":1,\"scale\":-0.75}]", prompt, 40, NULL);
    snprintf(flags, sizeof flags, "--lora-scaled %s -0.75", fb);
    T_CHECK(t && strcmp(t, tb) && generate_gives(base, tok, flags, prompt, t), "a negative factor");
    free(t);
    /* an adapter named as the model: at 1 unless the list says otherwise */
    t = completion_lora(port, "ad-b", "[]", prompt, 40, NULL);
    T_CHECK(t && tbb && !strcmp(t, tbb), "ad-b with an empty list: '%s'", t ? t : "");
    free(t);
    t = completion_lora(port, "ad-b", "[{\"id\":1,\"scale\":0}]", prompt, 40, NULL);
    T_CHECK(t && tb && !strcmp(t, tb), "ad-b at 0 is the base: '%s'", t ? t : "");
    free(t);
    /* llama.cpp's own /completion */
    char body[2048];
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"n_predict\":40,\"temperature\":0,\"lora\":[{\"id\":0,\"scale\":1}]}", prompt);
    T_CHECK(http(port, "POST", "/completion", NULL, body, &r) && r.status == 200, "/completion: %d %s", r.status, r.body);
    cJSON *root = r.body ? cJSON_Parse(r.body) : NULL;
    const cJSON *content = cJSON_GetObjectItem(root, "content");
    T_CHECK(cJSON_IsString(content) && ta && !strcmp(content->valuestring, ta), "/completion with ad-a: %s", r.body);
    cJSON_Delete(root);
    resp_free(&r);
    T_CHECK(http(port, "POST", "/v1/chat/completions", NULL,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":4,\"lora\":[{\"id\":1,\"scale\":0.5}]}", &r) &&
                r.status == 200,
            "chat with a list: %d %s", r.status, r.body);
    resp_free(&r);
    /* the other APIs pass the list on: embeddings of ad-a by id are ad-a's; a bad list is each API's 400 */
    char *vec[2] = {NULL, NULL};
    const char *embed_bodies[2] = {"{\"model\":\"ad-a\",\"input\":\"a red ball\"}", "{\"input\":\"a red ball\",\"lora\":[{\"id\":0,\"scale\":1}]}"};
    for (int i = 0; i < 2; i++) {
        T_CHECK(http(port, "POST", "/v1/embeddings", NULL, embed_bodies[i], &r) && r.status == 200, "embeddings: %d", r.status);
        cJSON *er = r.body ? cJSON_Parse(r.body) : NULL;
        vec[i] = cJSON_PrintUnformatted(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(er, "data"), 0), "embedding"));
        cJSON_Delete(er);
        resp_free(&r);
    }
    T_CHECK(vec[0] && vec[1] && !strcmp(vec[0], vec[1]), "embeddings by id differ from ad-a's");
    free(vec[0]), free(vec[1]);
    const char *api_bodies[][2] = {
        {"/v1/messages", "{\"model\":\"stories260K\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"lora\":%s}"},
        {"/v1/responses", "{\"input\":\"Hi\",\"max_output_tokens\":4,\"lora\":%s}"},
        {"/api/generate", "{\"model\":\"stories260K\",\"prompt\":\"Hi\",\"stream\":false,\"options\":{\"num_predict\":4},\"lora\":%s}"},
        {"/api/chat", "{\"model\":\"stories260K\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"stream\":false,\"options\":{\"num_predict\":4},\"lora\":%s}"},
        {"/api/embed", "{\"model\":\"stories260K\",\"input\":\"Hi\",\"lora\":%s}"}};
    for (size_t i = 0; i < sizeof api_bodies / sizeof api_bodies[0]; i++) {
        for (int bad_id = 0; bad_id < 2; bad_id++) {
            snprintf(body, sizeof body, api_bodies[i][1], bad_id ? "[{\"id\":7,\"scale\":1}]" : "[{\"id\":1,\"scale\":0.5}]");
            const int ok = http(port, "POST", api_bodies[i][0], "anthropic-version: 2023-06-01\r\n", body, &r);
            T_CHECK(ok && (bad_id ? r.status == 400 && strstr(r.body, "invalid adapter id") : r.status == 200),
                    "%s with %s list: %d %s", api_bodies[i][0], bad_id ? "a bad" : "a good", r.status, r.body);
            resp_free(&r);
        }
    }
    /* refused lists */
    const char *bad[] = {"{}", "[5]", "[{\"id\":2,\"scale\":1}]", "[{\"id\":-1,\"scale\":1}]", "[{\"id\":0}]", "[{\"id\":0.5,\"scale\":1}]",
                         "[{\"id\":0,\"scale\":\"1\"}]", "[{\"id\":0,\"scale\":101}]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(body, sizeof body, "{\"prompt\":\"x\",\"max_tokens\":2,\"lora\":%s}", bad[i]);
        T_CHECK(http(port, "POST", "/v1/completions", NULL, body, &r) && r.status == 400 && strstr(r.body, "\"param\":\"lora\""),
                "lora %s: %d %s", bad[i], r.status, r.body);
        resp_free(&r);
    }
    T_CHECK(http(port, "POST", "/completion", NULL, "{\"prompt\":\"x\",\"n_predict\":2,\"lora\":[{\"id\":9,\"scale\":1}]}", &r) &&
                r.status == 400 && strstr(r.body, "invalid adapter id"),
            "/completion with an unknown id: %d %s", r.status, r.body);
    resp_free(&r);
    /* the prefix cache: the long prompt is cached under the base and ad-a already; ad-a at 0.5 is a model of its own */
    int c1 = -1, c2 = -1, c3 = -1;
    char *l1 = completion_lora(port, "stories260K", "[{\"id\":0,\"scale\":0.5}]", longp, 12, &c1);
    char *l2 = completion_lora(port, "stories260K", "[{\"id\":0,\"scale\":0.5}]", longp, 12, &c2);
    char *l3 = completion_lora(port, "stories260K", "[{\"id\":0,\"scale\":0.25}]", longp, 12, &c3);
    T_CHECK(l1 && l2 && l3 && c1 == 0 && c2 >= 32 && c3 == 0 && !strcmp(l1, l2), "cached tokens of a mix: %d, again %d, another %d", c1,
            c2, c3);
    free(l1), free(l2), free(l3);
    /* POST /lora-adapters: what requests that choose none run with */
    T_CHECK(http(port, "POST", "/lora-adapters", NULL, "[{\"id\":1,\"scale\":1}]", &r) && r.status == 200 && strstr(r.body, "\"success\":true"),
            "POST /lora-adapters: %d %s", r.status, r.body);
    resp_free(&r);
    T_CHECK(http(port, "GET", "/lora-adapters", NULL, NULL, &r) && r.status == 200 && strstr(r.body, "\"id\":1,") &&
                strstr(r.body, "\"scale\":1,") && strstr(r.body, "\"scale\":0,"),
            "after POST: %s", r.body);
    resp_free(&r);
    const char *refused[] = {"{\"id\":0,\"scale\":1}", "[{\"id\":5,\"scale\":1}]", "", "[{\"id\":0,\"scale\":1e9}]"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        T_CHECK(http(port, "POST", "/lora-adapters", NULL, refused[i], &r) && r.status == 400 && strstr(r.body, "\"error\""),
                "POST /lora-adapters '%s': %d %s", refused[i], r.status, r.body);
        resp_free(&r);
    }
    t = completion(port, "stories260K", prompt, 40, NULL);
    T_CHECK(t && tbb && !strcmp(t, tbb), "the base after POST (refusals since): '%s'", t ? t : "");
    free(t);
    t = completion_lora(port, "stories260K", "[]", prompt, 40, NULL);
    T_CHECK(t && tb && !strcmp(t, tb), "an empty list chooses the base: '%s'", t ? t : "");
    free(t);
    t = completion(port, "ad-a", prompt, 40, NULL);
    T_CHECK(t && ta && !strcmp(t, ta), "an adapter named as the model after POST: '%s'", t ? t : "");
    free(t);
    T_CHECK(http(port, "POST", "/lora-adapters", NULL, "[]", &r) && r.status == 200, "POST []");
    resp_free(&r);
    t = completion(port, "stories260K", prompt, 40, NULL);
    T_CHECK(t && tb && !strcmp(t, tb), "the base after POST []: '%s'", t ? t : "");
    free(t);
    T_CHECK(http(port, "DELETE", "/lora-adapters", NULL, NULL, &r) && r.status == 405, "DELETE: %d", r.status);
    resp_free(&r);
}

static void test_server_adapters(void) {
    const char *base_path = t_data("models/stories260K.bin");
    char base[1000], tok[1000];
    if (!base_path) return;
    snprintf(base, sizeof base, "%s", base_path);
    const char *tok_path = t_data("models/tok512.bin");
    if (!tok_path) return;
    snprintf(tok, sizeof tok, "%s", tok_path);
    nv_model m;
    T_CHECK(nv_model_load(base, &m) == NV_OK, "%s", nv_errmsg());
    const nv_lora_shape sa = {8, 16.0f, NV_LORA_ALL}, sb = {4, 4.0f, NV_LORA_Q | NV_LORA_V | NV_LORA_UP | NV_LORA_DOWN};
    char fa[700], fb[700];
    snprintf(fa, sizeof fa, "%s", write_adapter(&m.config, &sa, 21, 0.08f, "a.gguf", NULL));
    snprintf(fb, sizeof fb, "%s", write_adapter(&m.config, &sb, 22, 0.15f, "b.gguf", NULL));
    nv_model_free(&m);
    char args[2400];
    /* the RAM tier alone first (a hit cannot come from disk), then with the SSD tier */
    snprintf(args, sizeof args, "--engine scalar --kv-cache-dtype f32 --kv-block 16 --kv-disk-cache 0 --lora-modules ad-a=%s ad-b=%s",
             fa, fb);
    server s;
    if (!server_spawn(&s, "lora", NULL, NULL, base, tok, args, 60)) {
        T_CHECK(0, "the server did not start");
        return;
    }
    resp r;
    T_CHECK(http(s.port, "GET", "/v1/models", NULL, NULL, &r) && r.status == 200, "models");
    cJSON *root = cJSON_Parse(r.body);
    const cJSON *data = cJSON_GetObjectItem(root, "data");
    T_CHECK(cJSON_GetArraySize(data) == 3, "%s", r.body);
    const cJSON *m1 = cJSON_GetArrayItem(data, 1), *m0 = cJSON_GetArrayItem(data, 0);
    T_CHECK(m1 && !strcmp(cJSON_GetObjectItem(m1, "id")->valuestring, "ad-a") &&
                !strcmp(cJSON_GetObjectItem(m1, "parent")->valuestring, "stories260K") && cJSON_IsNull(cJSON_GetObjectItem(m0, "parent")),
            "%s", r.body);
    cJSON_Delete(root);
    resp_free(&r);
    T_CHECK(http(s.port, "GET", "/v1/models/ad-b", NULL, NULL, &r) && r.status == 200 && strstr(r.body, "\"id\":\"ad-b\""), "%s",
            r.body);
    resp_free(&r);
    T_CHECK(http(s.port, "GET", "/v1/models/ad-c", NULL, NULL, &r) && r.status == 404, "%d", r.status);
    resp_free(&r);
    T_CHECK(http(s.port, "POST", "/v1/completions", NULL, "{\"model\":\"ad-c\",\"prompt\":\"x\"}", &r) && r.status == 404 &&
                strstr(r.body, "model_not_found"),
            "%d %s", r.status, r.body);
    resp_free(&r);

    /* greedy text: the base untouched, each adapter what generate --lora gives (merged weights) */
    const char *prompt = "Once upon a time, there was a little girl named Lily. She loved to play";
    char *tb = completion(s.port, "stories260K", prompt, 40, NULL);
    char *ta = completion(s.port, "ad-a", prompt, 40, NULL);
    char *tbb = completion(s.port, "ad-b", prompt, 40, NULL);
    T_CHECK(tb && ta && tbb, "completions failed");
    if (tb && ta && tbb) {
        T_CHECK(strcmp(ta, tb) && strcmp(tbb, tb) && strcmp(ta, tbb), "the adapters change nothing:\n%s\n%s\n%s", tb, ta, tbb);
        const char *which[3] = {NULL, fa, fb};
        const char *got[3] = {tb, ta, tbb};
        for (int k = 0; k < 3; k++) {
            char lora[800] = "";
            if (which[k]) snprintf(lora, sizeof lora, "--lora %s", which[k]);
            T_CHECK(generate_gives(base, tok, lora, prompt, got[k]), "model %d", k);
        }
    }
    /* the prefix cache: a prompt of three full blocks, first under ad-a, then the base, ad-b, ad-a */
    const char *longp = "Tom was a happy boy who lived in a small house by the sea. He loved to play outside in the park with his "
                        "friends. One day, he saw a big red ball under a tree and ran to get it";
    int cached[4] = {-1, -1, -1, -1};
    char *l0 = completion(s.port, "ad-a", longp, 12, &cached[0]);
    char *l1 = completion(s.port, "stories260K", longp, 12, &cached[1]);
    char *l2 = completion(s.port, "ad-b", longp, 12, &cached[2]);
    char *l3 = completion(s.port, "ad-a", longp, 12, &cached[3]);
    T_CHECK(l0 && l1 && l2 && l3, "long completions");
    T_CHECK(cached[0] == 0 && cached[1] == 0 && cached[2] == 0 && cached[3] >= 32, "cached tokens %d %d %d %d", cached[0],
            cached[1], cached[2], cached[3]);
    if (l0 && l3) T_CHECK(!strcmp(l0, l3), "a cache hit changed the text: '%s' / '%s'", l0, l3);
    /* embeddings follow the adapter */
    char *eb = NULL, *ea = NULL;
    T_CHECK(http(s.port, "POST", "/v1/embeddings", NULL, "{\"model\":\"stories260K\",\"input\":\"a red ball\"}", &r) && r.status == 200,
            "embeddings");
    eb = r.body ? strdup(r.body) : NULL;
    resp_free(&r);
    T_CHECK(http(s.port, "POST", "/v1/embeddings", NULL, "{\"model\":\"ad-a\",\"input\":\"a red ball\"}", &r) && r.status == 200 &&
                strstr(r.body, "\"model\":\"ad-a\""),
            "embeddings of an adapter: %s", r.body);
    ea = r.body ? strdup(r.body) : NULL;
    resp_free(&r);
    if (ea && eb) T_CHECK(strcmp(strstr(ea, "\"data\""), strstr(eb, "\"data\"")) != 0, "the adapter's embedding is the base's");
    T_CHECK(http(s.port, "POST", "/v1/chat/completions", NULL,
                 "{\"model\":\"ad-b\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":4}", &r) &&
                r.status == 200 && strstr(r.body, "\"model\":\"ad-b\""),
            "chat: %s", r.body);
    resp_free(&r);
    T_CHECK(http(s.port, "POST", "/v1/messages", "anthropic-version: 2023-06-01\r\n",
                 "{\"model\":\"ad-a\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", &r) &&
                r.status == 200 && strstr(r.body, "\"model\":\"ad-a\""),
            "messages: %s", r.body);
    resp_free(&r);
    T_CHECK(http(s.port, "POST", "/v1/responses", NULL, "{\"model\":\"ad-b\",\"input\":\"Hi\",\"max_output_tokens\":4}", &r) &&
                r.status == 200 && strstr(r.body, "\"model\":\"ad-b\""),
            "responses: %s", r.body);
    resp_free(&r);
    T_CHECK(http(s.port, "GET", "/v1/models", "anthropic-version: 2023-06-01\r\n", NULL, &r) && r.status == 200 &&
                strstr(r.body, "\"id\":\"ad-b\"") && strstr(r.body, "\"last_id\":\"ad-b\""),
            "Anthropic's model list: %s", r.body);
    resp_free(&r);
    test_lora_lists(s.port, base, tok, fa, fb, prompt, longp, tb, ta, tbb);
    char body[1600];
    snprintf(body, sizeof body, "{\"lora_name\":\"ad-x\",\"lora_path\":\"%s\"}", fa);
    T_CHECK(http(s.port, "POST", "/v1/load_lora_adapter", NULL, body, &r) && r.status == 403 && strstr(r.body, "--allow-lora-updates"),
            "loading without --allow-lora-updates: %d %s", r.status, r.body);
    resp_free(&r);
    T_CHECK(server_stop_within(&s, 30) == 0, "stop");
    test_runtime_updates(base, tok, fa, fb, prompt, tbb);

    /* the SSD tier: ad-a's blocks written by one server come back to ad-a after a restart, never to
     * the base model */
    snprintf(args, sizeof args, "--engine scalar --kv-cache-dtype f32 --kv-block 16 --kv-cache-dir %s --lora-modules ad-a=%s ad-b=%s",
             t_path("kvdisk"), fa, fb);
    int c0 = -1, c1 = -1, c2 = -1;
    char *first = NULL, *again = NULL, *plain = NULL;
    if (server_spawn(&s, "lora-disk", NULL, NULL, base, tok, args, 60)) {
        first = completion(s.port, "ad-a", longp, 12, &c0);
        T_CHECK(server_stop_within(&s, 30) == 0, "stop");
    }
    if (server_spawn(&s, "lora-disk2", NULL, NULL, base, tok, args, 60)) {
        plain = completion(s.port, "stories260K", longp, 12, &c2);
        again = completion(s.port, "ad-a", longp, 12, &c1);
        T_CHECK(server_stop_within(&s, 30) == 0, "stop");
    }
    T_CHECK(first && again && plain && c0 == 0 && c2 == 0 && c1 >= 32 && !strcmp(first, again),
            "SSD tier: %d, then the base %d and the adapter %d cached tokens; '%s' / '%s'", c0, c2, c1, first ? first : "",
            again ? again : "");
    if (l0 && first) T_CHECK(!strcmp(l0, first), "the SSD server's text differs from the RAM server's");
    free(first), free(again), free(plain);
    free(tb), free(ta), free(tbb), free(l0), free(l1), free(l2), free(l3), free(ea), free(eb);

    /* the flag's errors: one line, exit 2 (usage) or 1 (a file that is not an adapter of this model) */
    char cmd[5000];
    const char *bad[] = {"--lora-modules ad", "--lora-modules =x", "--lora-modules ad=", "--lora-modules stories260K=%s"};
    for (int i = 0; i < 4; i++) {
        char flag[900];
        snprintf(flag, sizeof flag, bad[i], fa);
        snprintf(cmd, sizeof cmd, "serve -m %s -z %s --port 0 %s", base, tok, flag);
        T_CHECK(t_nerve(cmd) == 2 && strchr(t_err, '\n') == strrchr(t_err, '\n') && strstr(t_err, "--lora-modules"),
                "'%s': %s", flag, t_err);
    }
    snprintf(cmd, sizeof cmd, "serve -m %s -z %s --port 0 --kv-disk-cache 0 --lora-modules x=%s --lora-modules x=%s", base, tok, fa, fb);
    T_CHECK(t_nerve(cmd) == 2 && strstr(t_err, "twice") && strchr(t_err, '\n') == strrchr(t_err, '\n'), "%s", t_err);
    snprintf(cmd, sizeof cmd, "serve -m %s -z %s --port 0 --kv-disk-cache 0 --lora-modules x=%s", base, tok, base);
    T_CHECK(t_nerve(cmd) == 1 && strstr(t_err, "nerve serve:") && strstr(t_err, "stories260K.bin") &&
                strchr(t_err, '\n') == strrchr(t_err, '\n'),
            "%s", t_err);
}

int main(void) {
    nv_engines_init(NULL, 0);
    T_RUN(test_batch_rows_take_their_adapters);
    T_RUN(test_batch_rows_take_their_mixes);
    T_RUN(test_granite_rows_take_their_adapters);
    T_RUN(test_lora_list_rules);
    T_RUN(test_server_adapters);
    return t_done();
}
