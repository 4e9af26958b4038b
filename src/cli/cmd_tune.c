/* nerve tune: measures, on a model's own layers and on this machine, which engine and prefill chunk
 * serve it fastest and which exact fp32 engine generates with it fastest, and stores the choice
 * per machine and model shape in the tune file, which `serve` and `generate` then take by default.
 *
 * Every engine that probes well (scalar only when it is the only fp32 one) is measured with the model's plans built for it: prefill of a
 * prompt of --prompt tokens in chunks of 64 up to its length, at most 2,048 (the scheduler's
 * prefill chunk), through the single-sequence forward (the batched one's plans and kernels), then
 * --answer tokens of greedy decode. serve gets the engine whose request (that prompt, that answer)
 * takes least time, with its fastest chunk (the smaller of two within 3%), unless its own default
 * is within 5% of it when both are measured again (then the default, whose precision order the
 * noise should not overturn);
 * generate avx2 instead of its default avx512 only when avx2 decodes 5% faster (the two give
 * bit-identical outputs, so its text does not change). The file is JSON: {"version": 1,
 * "machines": {MACHINE: {"cpu", "threads", "models": {MODEL: {"serve": {"engine", "prefill_chunk"}, "generate": {"engine"}, "measured":
 * [...], "model", "at"}}}}}; MACHINE names the CPU, the threads and the engines on (so a run under
 * NERVE_ENGINES or another --threads is a machine of its own), MODEL the shape and the weights'
 * formats. It is updated under a lock (FILE.lock) and written atomically; one that does not parse
 * is kept beside it as FILE.bad (FILE.bad.1, ... when that exists); one that cannot be read is left
 * alone and nothing is written. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "base/cpu.h"
#include "base/file.h"
#include "base/hash.h"
#include "base/log.h"
#include "base/pool.h"
#include "base/rng.h"
#include "base/timer.h"
#include "cli/bench.h"
#include "cli/cli.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/sampler.h"

#define CMD "tune"
#define TUNE_CHUNK_MAX 2048 /* the largest prefill chunk tune measures (an entry's larger one is not read) */

static void usage(FILE *f) {
    fprintf(f,
            "usage: nerve tune -m MODEL [--threads N] [--prompt N] [--answer N] [--quick] [--json]\n"
            "  -m MODEL      the model to tune for: a llama2.c checkpoint, a GGUF file, a run folder or a Hugging Face folder\n"
            "  --threads N   the threads serve and generate will run with (default: one per core)\n"
            "  --prompt N    prompt tokens of the request tuned for (default 512; at most half the context)\n"
            "  --answer N    answer tokens of that request (default 128)\n"
            "  --quick       one repeat per figure and chunks up to 256 (for tests)\n"
            "  --json        JSON Lines: one object per measurement, then the choice\n"
            "The choice is stored in $NERVE_TUNE_FILE, else $XDG_CACHE_HOME/nerve/tune.json, else\n"
            "~/.cache/nerve/tune.json; serve and generate take it unless --engine (or --prefill-chunk) or\n"
            "--no-tune says otherwise.\n");
}

int cli_tune_path(char *out, size_t cap) {
    const char *f = getenv("NERVE_TUNE_FILE"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (f && *f) snprintf(out, cap, "%s", f);
    else if (xdg && xdg[0] == '/') snprintf(out, cap, "%s/nerve/tune.json", xdg);
    else if (home && home[0] == '/') snprintf(out, cap, "%s/.cache/nerve/tune.json", home);
    else return 0;
    return 1;
}

void cli_tune_machine(char *out, size_t cap) {
    const nv_cpu_info *ci = nv_cpu_probe();
    int n = snprintf(out, cap, "%s | %d threads |", ci->model, nv_pool_threads());
    for (int e = 0; e < NV_ENGINE_COUNT && n > 0 && (size_t)n < cap; e++)
        if (nv_engine_available((nv_engine_id)e)) n += snprintf(out + n, cap - (size_t)n, " %s", nv_engine_name((nv_engine_id)e));
}

void cli_tune_model_key(const nv_model *m, char *out, size_t cap) {
    const nv_config *c = &m->config;
    /* the weights' formats: each plan matrix's source (fp32, fp16, bf16, or int8 blocks of qb with or without offsets) */
    uint64_t h = nv_hash64("nerve-tune", 10, 0);
    const int nm = nv_model_plan_count(c);
    for (int i = 0; m->quant && i < nm; i++) {
        int kind[3];
        nv_qmatrix_kind(&m->quant[i], kind);
        h = nv_hash64(kind, sizeof kind, h);
    }
    char experts[48] = "";
    if (c->n_experts) snprintf(experts, sizeof experts, ", experts %d/%d", c->n_experts_used, c->n_experts);
    snprintf(out, cap, "dim %d, layers %d, heads %d/%d x %d, hidden %d%s, vocab %d, context %d, weights %016llx", c->dim,
             c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, c->hidden_dim, experts, c->vocab_size, c->seq_len,
             (unsigned long long)h);
}

#define TUNE_FILE_MAX (4u << 20)

/* The tune file, parsed; NULL when it does not exist (*bad 0), cannot be read (*bad -1: a
 * directory, no permission, past TUNE_FILE_MAX) or is not a tune file (*bad 1). Read with read(),
 * not mapped: another process rewriting it cannot fault this one. */
static cJSON *read_tune_file(const char *path, int *bad) {
    *bad = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        *bad = nv_file_exists(path) ? -1 : 0;
        return NULL;
    }
    char *text = malloc(TUNE_FILE_MAX + 1);
    size_t len = text ? fread(text, 1, TUNE_FILE_MAX + 1, f) : 0;
    const int failed = !text || ferror(f) || len > TUNE_FILE_MAX;
    fclose(f);
    cJSON *root = failed ? NULL : cJSON_ParseWithLength(text, len);
    free(text);
    if (failed) {
        *bad = -1;
        return NULL;
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "version");
    if (!cJSON_IsObject(root) || !cJSON_IsNumber(v) || v->valueint != 1 ||
        !cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(root, "machines"))) {
        cJSON_Delete(root);
        *bad = 1;
        return NULL;
    }
    return root;
}

int cli_tune_lookup(const char *machine, const char *model_key, cli_tuned *out) {
    memset(out, 0, sizeof *out);
    char path[4200];
    if (!cli_tune_path(path, sizeof path)) return 0;
    int bad;
    cJSON *root = read_tune_file(path, &bad);
    if (bad) nv_warn("%s %s (run nerve tune again): not used", path, bad < 0 ? "cannot be read" : "is not a tune file nerve reads");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "machines"), machine);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(m, "models"), model_key);
    const cJSON *serve = cJSON_GetObjectItemCaseSensitive(e, "serve"), *gen = cJSON_GetObjectItemCaseSensitive(e, "generate");
    const char *se = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(serve, "engine"));
    const cJSON *chunk = cJSON_GetObjectItemCaseSensitive(serve, "prefill_chunk");
    const char *ge = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(gen, "engine"));
    const char *at = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "at"));
    int found = e != NULL;
    if (found && (!se || nv_engine_parse(se, &out->serve_engine) != NV_OK || !cJSON_IsNumber(chunk) || chunk->valuedouble < 1 ||
                  chunk->valuedouble > TUNE_CHUNK_MAX || chunk->valuedouble != (int)chunk->valuedouble || !ge ||
                  nv_engine_parse(ge, &out->generate_engine) != NV_OK)) {
        nv_warn("%s: the entry for this machine and model is not one nerve reads (run nerve tune again): not used", path);
        found = 0;
    }
    if (found) {
        out->prefill_chunk = chunk->valueint;
        snprintf(out->at, sizeof out->at, "%s", at ? at : "?");
        snprintf(out->path, sizeof out->path, "%s", path);
    }
    cJSON_Delete(root);
    return found;
}

int cli_tune_count(const char *machine, char *path, size_t cap) {
    path[0] = '\0';
    if (!cli_tune_path(path, cap)) return -1;
    int bad;
    cJSON *root = read_tune_file(path, &bad);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "machines"), machine);
    int n = bad ? -1 : cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(m, "models"));
    cJSON_Delete(root);
    return n;
}

/* ---- measuring ---------------------------------------------------------------------------------- */

/* The best of reps bench_prefill_s; < 0 on failure. */
static double time_prefill(const nv_model *m, nv_state *s, const int *prompt, int n, int chunk, int reps) {
    double best = -1;
    for (int r = 0; r < reps; r++) {
        double t = bench_prefill_s(m, s, prompt, n, chunk);
        if (t < 0) return -1;
        if (best < 0 || t < best) best = t;
    }
    return best;
}

/* Seconds per token of greedy decode after the prompt (prefilled in chunks of chunk); < 0 on failure. */
static double time_decode(const nv_model *m, nv_state *s, const int *prompt, int n, int chunk, int steps) {
    if (time_prefill(m, s, prompt, n, chunk, 1) < 0) return -1;
    int tok = nv_argmax(s->logits, m->config.vocab_size);
    double t0 = nv_now();
    for (int i = 0; i < steps; i++) {
        if (nv_forward(m, s, &tok, 1, n + i) != NV_OK) return -1;
        tok = nv_argmax(s->logits, m->config.vocab_size);
    }
    return (nv_now() - t0) / steps;
}

typedef struct {
    nv_engine_id e;
    int ok;
    char why[256];
    int n_chunks, chunk[8];
    double prefill_tps[8]; /* per chunk */
    int best_chunk;
    double best_prefill_tps, decode_tps, request_s;
} engine_run;

static void measure(nv_model *m, nv_engine_id e, const int *prompt, int P, int D, const int *chunks, int n_chunks, int reps,
                    engine_run *r) {
    memset(r, 0, sizeof *r);
    r->e = e;
    nv_state s;
    if (nv_model_build_plans(m, e) != NV_OK || /* replaces the last engine's plans */ nv_state_init(&s, &m->config, chunks[n_chunks - 1], P + D + 1, 0) != NV_OK) {
        snprintf(r->why, sizeof r->why, "%s", nv_errmsg());
        return;
    }
    /* untimed first: the plans' and the state's pages touched, the caches warm, as for a running server */
    time_prefill(m, &s, prompt, P, chunks[n_chunks - 1], 1);
    time_decode(m, &s, prompt, chunks[0] < P ? chunks[0] : P, chunks[0], D < 8 ? D : 8);
    for (int i = 0; i < n_chunks; i++) {
        double t = time_prefill(m, &s, prompt, P, chunks[i], reps);
        if (t <= 0) {
            snprintf(r->why, sizeof r->why, "prefill: %s", nv_errmsg());
            nv_state_free(&s);
            return;
        }
        r->chunk[r->n_chunks] = chunks[i];
        r->prefill_tps[r->n_chunks++] = P / t;
        /* the fastest chunk; a larger one must beat it by 3% (a smaller chunk lets decodes in sooner) */
        if (P / t > r->best_prefill_tps * 1.03) r->best_prefill_tps = P / t, r->best_chunk = chunks[i];
    }
    double best_decode = -1;
    for (int k = 0; k < reps; k++) {
        double t = time_decode(m, &s, prompt, P, r->best_chunk, D);
        if (t > 0 && (best_decode < 0 || t < best_decode)) best_decode = t;
    }
    nv_state_free(&s);
    if (best_decode <= 0) {
        snprintf(r->why, sizeof r->why, "decode: %s", nv_errmsg());
        return;
    }
    r->decode_tps = 1.0 / best_decode;
    r->request_s = P / r->best_prefill_tps + D * best_decode;
    r->ok = 1;
}

/* ---- the file ---------------------------------------------------------------------------------- */

static cJSON *child_object(cJSON *parent, const char *key) {
    cJSON *o = cJSON_GetObjectItemCaseSensitive(parent, key);
    if (cJSON_IsObject(o)) return o;
    cJSON_DeleteItemFromObjectCaseSensitive(parent, key);
    return cJSON_AddObjectToObject(parent, key);
}

static int save_locked(const char *path, const char *machine, int threads, const char *model_key, const char *model_path,
                const engine_run *runs, int n_runs, const engine_run *serve, nv_engine_id gen) {
    int bad;
    cJSON *root = read_tune_file(path, &bad);
    if (bad < 0) return cli_error(CMD, 1, "%s cannot be read (a directory, no permission, or too large): nothing written", path);
    if (bad) { /* kept, not lost: the new file starts afresh */
        char keep[4300];
        snprintf(keep, sizeof keep, "%s.bad", path);
        for (int k = 1; nv_file_exists(keep) && k < 1000; k++) snprintf(keep, sizeof keep, "%s.bad.%d", path, k);
        if (rename(path, keep) != 0) return cli_error(CMD, 1, "%s is not a tune file and cannot be moved aside to %s", path, keep);
        nv_warn("%s was not a tune file nerve reads: kept as %s, a new one written", path, keep);
    }
    if (!root) {
        root = cJSON_CreateObject();
        cJSON_AddNumberToObject(root, "version", 1);
        cJSON_AddObjectToObject(root, "machines");
    }
    cJSON *mach = child_object(child_object(root, "machines"), machine);
    cJSON_DeleteItemFromObjectCaseSensitive(mach, "cpu");
    cJSON_DeleteItemFromObjectCaseSensitive(mach, "threads");
    cJSON_AddStringToObject(mach, "cpu", nv_cpu_probe()->model);
    cJSON_AddNumberToObject(mach, "threads", threads);
    cJSON *models = child_object(mach, "models");
    cJSON_DeleteItemFromObjectCaseSensitive(models, model_key);
    cJSON *e = cJSON_AddObjectToObject(models, model_key);
    cJSON *s = cJSON_AddObjectToObject(e, "serve");
    cJSON_AddStringToObject(s, "engine", nv_engine_name(serve->e));
    cJSON_AddNumberToObject(s, "prefill_chunk", serve->best_chunk);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(e, "generate"), "engine", nv_engine_name(gen));
    cJSON *meas = cJSON_AddArrayToObject(e, "measured");
    for (int i = 0; i < n_runs; i++) {
        if (!runs[i].ok) continue;
        cJSON *r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "engine", nv_engine_name(runs[i].e));
        cJSON_AddNumberToObject(r, "prefill_tokens_per_s", (double)(long)(runs[i].best_prefill_tps * 10) / 10);
        cJSON_AddNumberToObject(r, "prefill_chunk", runs[i].best_chunk);
        cJSON_AddNumberToObject(r, "decode_tokens_per_s", (double)(long)(runs[i].decode_tps * 10) / 10);
        cJSON_AddNumberToObject(r, "request_ms", (double)(long)(runs[i].request_s * 1e4) / 10);
        cJSON_AddItemToArray(meas, r);
    }
    cJSON_AddStringToObject(e, "model", model_path);
    char at[32];
    time_t now = time(NULL);
    strftime(at, sizeof at, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    cJSON_AddStringToObject(e, "at", at);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return cli_error(CMD, 1, "out of memory");
    nv_iov part = {text, strlen(text)};
    nv_err err = nv_file_write_atomic(path, &part, 1);
    free(text);
    if (err != NV_OK) return cli_error(CMD, 1, "%s", nv_errmsg());
    return 0;
}

/* The entry merged into the file under an exclusive lock (PATH.lock), so two tune runs at once
 * each keep their entry. */
static int save(const char *path, const char *machine, int threads, const char *model_key, const char *model_path,
                const engine_run *runs, int n_runs, const engine_run *serve, nv_engine_id gen) {
    char dir[4200], lock[4300];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = '\0';
        if (nv_mkdirs(dir) != NV_OK) return cli_error(CMD, 1, "%s", nv_errmsg());
    }
    snprintf(lock, sizeof lock, "%s.lock", path);
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 || flock(fd, LOCK_EX) != 0) {
        if (fd >= 0) close(fd);
        return cli_error(CMD, 1, "cannot lock %s: %s", lock, strerror(errno));
    }
    int rc = save_locked(path, machine, threads, model_key, model_path, runs, n_runs, serve, gen);
    close(fd); /* releases the lock */
    return rc;
}

int cmd_tune(int argc, char **argv) {
    const char *model_path = NULL, *tok_path = NULL;
    int threads = 0, P = 512, D = 128, quick = 0, json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--quick")) { quick = 1; continue; }
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (strcmp(a, "-m") && strcmp(a, "--threads") && strcmp(a, "--prompt") && strcmp(a, "--answer")) {
            usage(stderr);
            return cli_error(CMD, 2, "unknown option '%s'", a);
        }
        const char *v = cli_value(CMD, argc, argv, &i);
        if (!v) return 2;
        if (!strcmp(a, "-m")) model_path = v;
        else if (!strcmp(a, "--threads")) { if (!cli_int(CMD, a, v, 1, 4096, &threads)) return 2; }
        else if (!strcmp(a, "--prompt")) { if (!cli_int(CMD, a, v, 1, 1 << 20, &P)) return 2; }
        else if (!cli_int(CMD, a, v, 1, 1 << 20, &D)) return 2; /* --answer */
    }
    if (!model_path) {
        usage(stderr);
        return cli_error(CMD, 2, "-m MODEL is required");
    }
    char path[4200];
    if (!cli_tune_path(path, sizeof path))
        return cli_error(CMD, 1, "nowhere to keep the tune file: set NERVE_TUNE_FILE, XDG_CACHE_HOME or HOME");
    cli_paths paths;
    cli_model_paths(&model_path, &tok_path, &paths);
    if (nv_engines_init(NULL, threads) != NV_OK) return cli_error(CMD, 2, "%s", nv_errmsg());
    nv_model m;
    if (nv_model_load_quantized(model_path, &m) != NV_OK) return cli_error(CMD, 1, "%s", nv_errmsg());
    const nv_config *c = &m.config;
    if (c->seq_len < 4) {
        nv_model_free(&m);
        return cli_error(CMD, 1, "%s: a context of %d positions is too short to tune for", model_path, c->seq_len);
    }
    /* the request must fit the context: at most half of it prompt, the rest (less one) answer */
    if (P > c->seq_len / 2) P = c->seq_len / 2;
    if (D > c->seq_len - P - 1) D = c->seq_len - P - 1;
    int chunks[8], n_chunks = 0;
    for (int k = 64; k <= (quick ? 256 : TUNE_CHUNK_MAX) && n_chunks < 8; k *= 2)
        if (k <= P || n_chunks == 0) chunks[n_chunks++] = k < P ? k : P;
    int *prompt = malloc((size_t)P * sizeof(int));
    if (!prompt) {
        nv_model_free(&m);
        return cli_error(CMD, 1, "out of memory");
    }
    uint64_t st = 7;
    for (int i = 0; i < P; i++) prompt[i] = (int)(nv_xorshift_u32(&st) % (uint32_t)c->vocab_size);
    char machine[512], key[256];
    cli_tune_machine(machine, sizeof machine);
    cli_tune_model_key(&m, key, sizeof key); /* before plans are built: the weights' sources are still there */
    const int T = nv_pool_threads(), reps = quick ? 1 : 2;
    if (!json)
        printf("nerve tune: %s on %s (%d threads): a request of %d prompt and %d answer tokens\n", model_path,
               nv_cpu_probe()->model, T, P, D);
    engine_run runs[NV_ENGINE_COUNT];
    int n_runs = 0, best = -1, def = -1, alt = -1;
    const nv_engine_id serve_default = nv_engine_best();
    nv_engine_id gen = nv_engine_best_fp32();
    double gen_tps = -1;
    for (int e = NV_ENGINE_COUNT - 1; e >= 0; e--) { /* the ladder's order, fastest rung first */
        if (!nv_engine_available((nv_engine_id)e) || (e == NV_ENGINE_SCALAR && nv_engine_best_fp32() != NV_ENGINE_SCALAR)) continue;
        engine_run *r = &runs[n_runs++];
        measure(&m, (nv_engine_id)e, prompt, P, D, chunks, n_chunks, reps, r);
        const char *en = nv_engine_name((nv_engine_id)e);
        if (json) {
            for (int i = 0; r->ok && i < r->n_chunks; i++)
                printf("{\"bench\":\"tune\",\"engine\":\"%s\",\"threads\":%d,\"case\":\"prefill\",\"chunk\":%d,\"seq\":%d,\"tokens_per_s\":%.1f}\n",
                       en, T, r->chunk[i], P, r->prefill_tps[i]);
            if (r->ok)
                printf("{\"bench\":\"tune\",\"engine\":\"%s\",\"threads\":%d,\"case\":\"decode\",\"seq\":%d,\"tokens_per_s\":%.1f,"
                       "\"request_ms\":%.1f}\n",
                       en, T, D, r->decode_tps, r->request_s * 1e3);
            else {
                cJSON *row = cJSON_CreateObject();
                cJSON_AddStringToObject(row, "bench", "tune");
                cJSON_AddStringToObject(row, "engine", en);
                cJSON_AddNumberToObject(row, "threads", T);
                cJSON_AddBoolToObject(row, "ok", 0);
                cJSON_AddStringToObject(row, "why", r->why);
                char *text = cJSON_PrintUnformatted(row);
                if (text) printf("%s\n", text);
                free(text);
                cJSON_Delete(row);
            }
        } else if (r->ok) {
            printf("  %-12s prefill %8.1f tok/s (chunk %4d)   decode %7.1f tok/s   request %8.1f ms\n", en, r->best_prefill_tps,
                   r->best_chunk, r->decode_tps, r->request_s * 1e3);
        }
        if (!r->ok) nv_warn("tune: %s: %s", en, r->why);
        if (r->ok && (best < 0 || r->request_s < runs[best].request_s)) best = n_runs - 1;
        if (r->ok && (nv_engine_id)e == serve_default) def = n_runs - 1;
        if (r->ok && (nv_engine_id)e == gen) gen_tps = r->decode_tps;
        if (r->ok && e == NV_ENGINE_AVX2 && gen == NV_ENGINE_AVX512) alt = n_runs - 1;
    }
    if (best < 0) {
        nv_model_free(&m);
        free(prompt);
        return cli_error(CMD, 1, "no engine could run %s", model_path);
    }
    /* what serve and generate take without a tune file stays unless another engine is clearly faster
       (5%: below that the figures are the machine's noise), measured again right after the default,
       so that a moment's slowness of the machine does not decide it */
    if (def >= 0 && best != def && runs[best].request_s <= 0.95 * runs[def].request_s) {
        engine_run again[2];
        measure(&m, runs[def].e, prompt, P, D, chunks, n_chunks, reps, &again[0]);
        measure(&m, runs[best].e, prompt, P, D, chunks, n_chunks, reps, &again[1]);
        if (again[0].ok && again[0].request_s < runs[def].request_s) runs[def] = again[0];
        if (again[1].ok && again[1].request_s < runs[best].request_s) runs[best] = again[1];
    }
    if (def >= 0 && runs[best].request_s > 0.95 * runs[def].request_s) best = def;
    /* generate: avx512 and avx2 give the same bits; avx2 when it decodes clearly faster */
    if (alt >= 0 && gen_tps > 0 && runs[alt].decode_tps > 1.05 * gen_tps) gen = NV_ENGINE_AVX2;
    nv_model_free(&m);
    free(prompt);
    int rc = save(path, machine, T, key, model_path, runs, n_runs, &runs[best], gen);
    if (rc) return rc;
    if (json)
        printf("{\"bench\":\"tune\",\"case\":\"choice\",\"threads\":%d,\"serve_engine\":\"%s\",\"prefill_chunk\":%d,"
               "\"generate_engine\":\"%s\",\"file\":\"%s\"}\n",
               T, nv_engine_name(runs[best].e), runs[best].best_chunk, nv_engine_name(gen), path);
    else
        printf("tuned: serve on %s with a prefill chunk of %d, generate on %s (saved in %s)\n", nv_engine_name(runs[best].e),
               runs[best].best_chunk, nv_engine_name(gen), path);
    return 0;
}
