/* nerve generate: sample text from a llama2.c checkpoint, printing exactly what llama2.c's run
 * prints for the same model, tokenizer, prompt, steps, temperature, top-p and seed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "base/timer.h"
#include "base/log.h"
#include "cli/cli.h"
#include "cli/hub.h"
#include "engine/engine.h"
#include "model/forward.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "serve/gbnf.h"
#include "serve/schema.h"

#define CMD "generate"
#define PREFILL_CHUNK 64

static void usage(FILE *f) {
    fprintf(f,
            "usage: nerve generate -m MODEL [-z TOKENIZER] [-p PROMPT] [-n STEPS] [-t TEMP] [--top-p P] [-s SEED]\n"
            "                      [--top-k K] [--min-p P] [--repetition-penalty R] [--presence-penalty X] [--frequency-penalty X] [--repeat-last-n N] [--json | --json-schema SCHEMA]\n"
            "                      [--grammar GBNF | --grammar-file FILE] [--spec-tokens N] [--spec-lookup-min N] [--spec-lookup-max N] [--engine E] [--threads N] [--no-tune]\n"
            "                      [--model-draft MODEL [--draft-engine E] [--draft-p-min P]] [--lora ADAPTER] [--lora-scaled ADAPTER SCALE]\n"
            CLI_HUB_USAGE
            "  -m MODEL      llama2.c checkpoint (v0 or v1), a GGUF file (llama; F32/F16/BF16/Q4-Q8/K-quants),\n"
            "                a `nerve train` run folder (its model.bin or model.gguf), or a Hugging Face folder\n"
            "                (config.json, safetensors; its tokenizer.json the default -z)\n"
            "  --lora ADAPTER, --lora-scaled ADAPTER SCALE\n"
            "                a LoRA adapter (GGUF: nerve train --lora-rank's adapter.gguf, or llama.cpp's; or a PEFT\n"
            "                adapter folder, as a LoRA run folder holds it too) merged into the weights at load, scaled\n"
            "                (default 1); up to 8, applied in order\n"
            "  -z TOKENIZER  llama2.c tokenizer.bin, a GGUF file's vocabulary or a tokenizer.json (default: the run\n"
            "                folder's tokenizer.bin, the GGUF model's own vocabulary, the Hugging Face folder's tokenizer.json, else\n"
            "                tokenizers/tokenizer.bin in the shared data)\n"
            "  -p PROMPT     text to continue (also -i); default empty\n"
            "  -f FILE       the prompt from a file instead, as it is (also --file)\n"
            "  -n STEPS      positions to run, prompt included (default 256; 0 or more than the context = context)\n"
            "  -t TEMP       temperature, 0 = greedy (default 1.0)\n"
            "  --top-p P     nucleus sampling threshold, 0 or 1 = off (default 0.9)\n"
            "  --top-k K     sample among the K most likely tokens only (default 0: off)\n"
            "  --min-p P     drop tokens below P x the most likely one's probability (default 0: off)\n"
            "  -s SEED       random seed (default: the time)\n"
            "  --repetition-penalty R\n"
            "                tokens of the prompt or the text so far: logit / R when positive, x R when not\n"
            "                (vLLM's; default 1: off)\n"
            "  --presence-penalty X, --frequency-penalty X\n"
            "                OpenAI's penalties on tokens generated so far, -2..2 (default 0: off)\n"
            "  --repeat-last-n N\n"
            "                the three penalties as llama.cpp counts them: over the last N tokens of the prompt and\n"
            "                the text (-1: all of them; 0: no penalty)\n"
            "  --typical-p P, --top-n-sigma N, --xtc-probability P [--xtc-threshold T]\n"
            "                llama.cpp's samplers: locally typical sampling (default 1: off), the logits within N\n"
            "                deviations of the largest (default -1: off), XTC: with probability P drop every token\n"
            "                at or above T (default 0.1) but the least likely of them (default P 0: off)\n"
            "  --dynatemp-range R [--dynatemp-exp E]\n"
            "                dynamic temperature: each draw's in [TEMP - R, TEMP + R] by the distribution's\n"
            "                entropy raised to E (default 1); R 0 (default) is off\n"
            "  --mirostat 1|2 [--mirostat-ent TAU] [--mirostat-lr ETA]\n"
            "                Mirostat in place of the filters: the text's surprise tracks TAU (default 5) at the\n"
            "                rate ETA (default 0.1); 0 (default) is off\n"
            "  --dry-multiplier M [--dry-base B] [--dry-allowed-length N] [--dry-penalty-last-n N]\n"
            "  [--dry-sequence-breaker S]...\n"
            "                DRY (llama.cpp's): a token that would extend a repeat of N (default 2) or more tokens\n"
            "                loses M x B^(length - N) (default B 1.75; M 0: off), over the last N tokens (-1, the\n"
            "                default: all); breakers (default \\n : \" *; 'none': no breaker) end a repeat\n"
            "  --json        the text generated is a JSON object (constrained decoding; ends when it is whole)\n"
            "  --json-schema SCHEMA\n"
            "                the text generated is JSON that SCHEMA accepts: a file, or the schema's JSON text\n"
            "                (the keywords supported: docs/serving.md, Structured outputs)\n"
            "  --grammar GBNF, --grammar-file FILE\n"
            "                the text generated is a sentence of a GBNF grammar (llama.cpp's format; its rule 'root'),\n"
            "                given as text or in a file; the run ends when nothing more may follow\n"
            "  --spec-tokens N\n"
            "                speculative decoding by prompt lookup: up to N (<= 16) tokens that followed an earlier\n"
            "                occurrence of the last tokens are checked in one forward pass; the text is exactly the\n"
            "                one without (default 0: off)\n"
            "  --spec-lookup-min N, --spec-lookup-max N\n"
            "                the lengths of the tail looked up, longest first (default 2 and 4)\n"
            "  --model-draft MODEL, -md MODEL\n"
            "                speculative decoding by a draft model: a smaller model with the same tokenizer proposes\n"
            "                up to --spec-tokens tokens (default 8) by greedy decoding, checked in one forward pass;\n"
            "                the text is exactly the one without\n"
            "  --draft-engine E\n"
            "                the draft model's engine (default: the fastest that probes well)\n"
            "  --draft-p-min P\n"
            "                drafts stop at the first the draft model gives a probability below P (default 0.75; 0: never)\n"
            "  --engine E    scalar, avx2, avx512, avx512-bf16, amx-bf16, avx2-int8, avx512-int8, amx-int8 (default: the fastest\n"
            "                exact fp32 one that probes well, so the output is llama2.c's)\n"
            "  --threads N   threads for the engines (default: one per core)\n"
            "  --no-tune     ignore the exact fp32 engine `nerve tune` measured fastest for this machine and model\n"
            "                (avx512 or avx2: the same output)\n");
}

/* llama2.c's safe_printf: skip empty pieces and lone unprintable bytes (its byte tokens); a
 * byte-level vocabulary's lone bytes are parts of characters and all print. */
static void print_piece(const nv_tokenizer *tok, const char *piece) {
    if (nv_tokenizer_piece_shown(tok, piece)) fputs(piece, stdout);
}

/* --json (NULL: any JSON object) or --json-schema: a file, or the schema's own JSON text. */
static nv_err load_grammar(const char *schema_arg, nv_grammar **out);

/* --grammar TEXT or --grammar-file FILE (GBNF). */
static nv_err load_gbnf(const char *text, const char *file, nv_grammar **out) {
    char *owned = NULL;
    if (file) NV_TRY(nv_file_read_all(file, &owned, NULL));
    nv_err e = nv_gbnf_grammar(file ? owned : text, 0, out);
    free(owned);
    if (e == NV_OK || e == NV_ENOMEM) return e;
    return nv_fail(e, "%s: %s", file ? file : "--grammar", nv_errmsg());
}

static nv_err load_grammar(const char *schema_arg, nv_grammar **out) {
    if (!schema_arg) return nv_json_object_grammar(out);
    char *text = NULL;
    struct stat st;
    int is_file = stat(schema_arg, &st) == 0;
    if (is_file) NV_TRY(nv_file_read_all(schema_arg, &text, NULL));
    cJSON *schema = cJSON_Parse(is_file ? text : schema_arg);
    free(text);
    if (!schema)
        return nv_fail(NV_EINVAL, "--json-schema: %.200s is %s", schema_arg,
                       is_file ? "not valid JSON" : "neither a file nor valid JSON");
    nv_err e = nv_schema_grammar(schema, out);
    cJSON_Delete(schema);
    if (e == NV_OK) return NV_OK;
    return nv_fail(e, "--json-schema: %s", nv_errmsg());
}

/* Up to k tokens the draft model proposes after ctx[0..n_ctx) by greedy decoding, into out. Its cache
 * holds ctx's keys and values at positions [0, *dvalid); it runs ctx from there (chunk by chunk), then
 * feeds its own tokens, stopping before one it gives less than p_min: on return the positions after
 * ctx's hold at least its drafts but the last (the caller credits those the model takes). Returns
 * how many it proposed (0 when its context cannot hold them), -1 on failure (reported). */
static int draft_tokens(const nv_model *d, nv_state *ds, const int *ctx, int n_ctx, int *dvalid, int k, float p_min, int *out) {
    if (n_ctx - 1 + k > ds->cache_len) k = ds->cache_len - (n_ctx - 1);
    if (!nv_state_resumable(ds, *dvalid)) *dvalid = 0; /* its windowed layers' ring has gone past: all again */
    if (k <= 0) return 0;
    while (*dvalid < n_ctx) {
        int n = n_ctx - *dvalid < ds->max_tokens ? n_ctx - *dvalid : ds->max_tokens;
        if (nv_forward(d, ds, ctx + *dvalid, n, *dvalid) != NV_OK) return -1;
        *dvalid += n;
    }
    const int V = d->config.vocab_size;
    for (int j = 0; j < k; j++) { /* until one the draft itself doubts (p_min) */
        if (j && nv_forward(d, ds, &out[j - 1], 1, n_ctx - 1 + j) != NV_OK) return -1;
        if ((out[j] = nv_draft_token(ds->logits, V, p_min)) < 0) return j;
    }
    return k;
}

/* DRY on the sampler, its breakers the tokens whose text holds one of the strings (n < 0: llama.cpp's
   default ones). */
static nv_err set_dry(nv_sampler *smp, const nv_tokenizer *tok, float mult, float base, int allowed, int last_n,
                      const char *const *strs, int n, const int *prompt, int n_prompt) {
    if (mult == 0.0f || last_n == 0) return NV_OK;
    unsigned char *mask = nv_dry_breakers(tok, smp->vocab_size, strs, n);
    if (!mask) return nv_fail(NV_ENOMEM, "out of memory");
    const nv_err e = nv_sampler_set_dry(smp, mult, base, allowed, last_n, mask, prompt, n_prompt);
    free(mask);
    return e;
}

int cmd_generate(int argc, char **argv) {
    const char *model_path = NULL, *tok_path = NULL, *prompt = "", *engine_name = NULL, *schema_arg = NULL, *prompt_file = NULL;
    int prompt_given = 0;
    const char *gbnf_text = NULL, *gbnf_file = NULL;
    int no_tune = 0;
    int json_object = 0;
    int steps = 256, threads = 0;
    cli_spec spec = CLI_SPEC_DEFAULTS;
    float temperature = 1.0f, top_p = 0.9f, presence = 0.0f, frequency = 0.0f, min_p = 0.0f, repetition = 1.0f;
    int penalty_window = 0, penalty_last_n = 0; /* --repeat-last-n given, and its N */
    int top_k = 0, dry_allowed = 2, dry_last_n = -1, n_breakers = -1; /* -1: llama.cpp's breakers */
    float dry_mult = 0, dry_base = 1.75f, typical_p = 1.0f, top_n_sigma = -1.0f, xtc_p = 0.0f, xtc_t = 0.1f;
    float miro_tau = 5.0f, miro_eta = 0.1f, dt_range = 0.0f, dt_exp = 1.0f;
    int mirostat = 0;
    const char *breakers[32];
    uint64_t seed = 0;
    cli_loras loras = {0};
    cli_hub_ref hub = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (cli_switch(a, "--json", &json_object, 1) ||
            cli_switch(a, "--no-tune", &no_tune, 1))
            continue;
        const int lf = cli_lora_flag(CMD, argc, argv, &i, &loras);
        if (lf < 0) return 2;
        if (lf) continue;
        const int hf = cli_hub_flag(CMD, argc, argv, &i, &hub);
        if (hf < 0) return 2;
        if (hf) continue;
        if (!(v = cli_value(CMD, argc, argv, &i))) return 2;
        const int sf = cli_spec_flag(CMD, a, v, &spec);
        if (sf < 0) return 2;
        if (sf) continue;
        if (!strcmp(a, "-m")) model_path = v;
        else if (!strcmp(a, "-z")) tok_path = v;
        else if (!strcmp(a, "-p") || !strcmp(a, "-i")) prompt = v, prompt_given = 1;
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) prompt_file = v;
        else if (!strcmp(a, "-n")) { if (!cli_int(CMD, a, v, 0, 1 << 30, &steps)) return 2; }
        else if (!strcmp(a, "-t")) { if (!cli_float(CMD, a, v, 0, 1e6, &temperature)) return 2; }
        else if (!strcmp(a, "--top-p")) { if (!cli_float(CMD, a, v, 0, 1, &top_p)) return 2; }
        else if (!strcmp(a, "--top-k")) { if (!cli_int(CMD, a, v, 0, 1 << 30, &top_k)) return 2; }
        else if (!strcmp(a, "--min-p")) { if (!cli_float(CMD, a, v, 0, 1, &min_p)) return 2; }
        else if (!strcmp(a, "--repetition-penalty")) { if (!cli_float(CMD, a, v, 0.001, 10, &repetition)) return 2; }
        else if (!strcmp(a, "--repeat-last-n")) {
            if (!cli_int(CMD, a, v, -1, 1000000000, &penalty_last_n)) return 2;
            penalty_window = 1;
        }
        else if (!strcmp(a, "--mirostat")) { if (!cli_int(CMD, a, v, 0, 2, &mirostat)) return 2; }
        else if (!strcmp(a, "--mirostat-ent")) { if (!cli_float(CMD, a, v, 0, 100, &miro_tau)) return 2; }
        else if (!strcmp(a, "--mirostat-lr")) { if (!cli_float(CMD, a, v, 0, 1, &miro_eta)) return 2; }
        else if (!strcmp(a, "--typical-p")) { if (!cli_float(CMD, a, v, 0.0001, 1, &typical_p)) return 2; }
        else if (!strcmp(a, "--top-n-sigma")) { if (!cli_float(CMD, a, v, -1, 1000, &top_n_sigma)) return 2; }
        else if (!strcmp(a, "--xtc-probability")) { if (!cli_float(CMD, a, v, 0, 1, &xtc_p)) return 2; }
        else if (!strcmp(a, "--xtc-threshold")) { if (!cli_float(CMD, a, v, 0, 1, &xtc_t)) return 2; }
        else if (!strcmp(a, "--dynatemp-range")) { if (!cli_float(CMD, a, v, 0, 100, &dt_range)) return 2; }
        else if (!strcmp(a, "--dynatemp-exp")) { if (!cli_float(CMD, a, v, 0, 100, &dt_exp)) return 2; }
        else if (!strcmp(a, "--dry-multiplier")) { if (!cli_float(CMD, a, v, 0, 1000, &dry_mult)) return 2; }
        else if (!strcmp(a, "--dry-base")) { if (!cli_float(CMD, a, v, 1, 100, &dry_base)) return 2; }
        else if (!strcmp(a, "--dry-allowed-length")) { if (!cli_int(CMD, a, v, 1, 64, &dry_allowed)) return 2; }
        else if (!strcmp(a, "--dry-penalty-last-n")) { if (!cli_int(CMD, a, v, -1, 1 << 30, &dry_last_n)) return 2; }
        else if (!strcmp(a, "--dry-sequence-breaker")) {
            if (n_breakers < 0) n_breakers = 0;
            if (strcmp(v, "none") != 0) {
                if (n_breakers == 32) return cli_error(CMD, 2, "at most 32 --dry-sequence-breaker strings");
                breakers[n_breakers++] = v;
            }
        }
        else if (!strcmp(a, "--presence-penalty")) { if (!cli_float(CMD, a, v, -2, 2, &presence)) return 2; }
        else if (!strcmp(a, "--frequency-penalty")) { if (!cli_float(CMD, a, v, -2, 2, &frequency)) return 2; }
        else if (!strcmp(a, "-s")) { if (!cli_u64(CMD, a, v, &seed)) return 2; }
        else if (!strcmp(a, "--json-schema")) schema_arg = v;
        else if (!strcmp(a, "--grammar")) gbnf_text = v;
        else if (!strcmp(a, "--grammar-file")) gbnf_file = v;
        else if (!strcmp(a, "--engine")) engine_name = v;
        else if (!strcmp(a, "--threads")) { if (!cli_int(CMD, a, v, 1, 1024, &threads)) return 2; }
        else return cli_error(CMD, 2, "unknown option '%s' (see nerve generate --help)", a);
    }
    if (!model_path && !hub.repo) return cli_error(CMD, 2, "-m MODEL (or -hf USER/NAME) is required (see nerve generate --help)");
    if (!!json_object + !!schema_arg + !!gbnf_text + !!gbnf_file > 1)
        return cli_error(CMD, 2, "give one of --json, --json-schema, --grammar and --grammar-file");
    if (cli_spec_check(CMD, &spec)) return 2;
    if (prompt_given && prompt_file) return cli_error(CMD, 2, "-p and -f both give the prompt: one or the other");
    /* the model from the Hub once the flags are known good (a download is no place to learn of a typo) */
    char hub_path[4400];
    const int hub_rc = cli_hub_fetch(CMD, &hub, &model_path, hub_path, sizeof hub_path);
    if (hub_rc) return hub_rc;
    char *prompt_text = NULL; /* -f: the file's text, as it is (its last line break included) */
    if (prompt_file) {
        if (!cli_read_text(CMD, "-f", prompt_file, &prompt_text, NULL)) return 1;
        prompt = prompt_text;
    }
    nv_grammar *grammar = NULL;
    if (((json_object || schema_arg) && load_grammar(schema_arg, &grammar) != NV_OK) ||
        ((gbnf_text || gbnf_file) && load_gbnf(gbnf_text, gbnf_file, &grammar) != NV_OK)) {
        free(prompt_text);
        return cli_error(CMD, 1, "%s", nv_errmsg());
    }
    if (seed == 0) seed = (uint64_t)time(NULL); /* as run.c: 0 means "pick one" */

    cli_paths paths;
    cli_model_paths(&model_path, &tok_path, &paths);
    nv_engine_id engine;
    /* exact fp32 by default, so the output is llama2.c's: bf16/int8 engines are opt-in here */
    int erc = cli_engine(CMD, engine_name, threads, CLI_ENGINE_FP32, &engine);
    if (erc) {
        free(prompt_text);
        nv_grammar_unref(grammar);
        return erc;
    }

    nv_model model;
    nv_tokenizer *tok = NULL;
    nv_sampler sampler = {0};
    nv_gsampler gs = {0};
    nv_gtrie *trie = NULL;
    nv_state state = {0}, dstate = {0};
    nv_model draft = {0};
    int dvalid = 0; /* positions of the draft's cache holding ctx's keys and values */
    int *prompt_tokens = NULL, n_prompt = 0, rc = 1;
    int *ctx = NULL, n_ctx = 0; /* --spec-tokens: the prompt and every generated token, where drafts are looked up */
    if (cli_load_model(model_path, &loras, 1, &model) != NV_OK) {
        nv_grammar_unref(grammar);
        return cli_error(CMD, 1, "%s", nv_errmsg());
    }
    const nv_config *c = &model.config;
    if (nv_tokenizer_load_for_model(tok_path, c->vocab_size, &tok) != NV_OK) {
        cli_error(CMD, 1, "%s", nv_errmsg());
        goto done;
    }
    if (steps == 0 || steps > c->seq_len) steps = c->seq_len;
    if (!no_tune && !engine_name) { /* the exact fp32 engine nerve tune found fastest here (the same output) */
        char machine[512], key[256];
        cli_tuned t;
        cli_tune_machine(machine, sizeof machine);
        cli_tune_model_key(&model, key, sizeof key);
        if (cli_tune_lookup(machine, key, &t) && t.generate_engine != engine) {
            /* only between avx512 and avx2, whose outputs are the same bits (scalar's sums are not fused) */
            const int same_bits = (engine == NV_ENGINE_AVX512 || engine == NV_ENGINE_AVX2) &&
                                  (t.generate_engine == NV_ENGINE_AVX512 || t.generate_engine == NV_ENGINE_AVX2);
            if (same_bits && nv_engine_available(t.generate_engine)) engine = t.generate_engine;
            else nv_warn("%s: generate's engine %s would change the output here: not used", t.path, nv_engine_name(t.generate_engine));
        }
    }
    /* the KV cache holds the positions this run can reach, not the whole context (131,072 for Llama 3.1) */
    model.drop_sources = 1; /* built once: each source goes as its plan takes it */
    if (nv_model_build_plans(&model, engine) != NV_OK || nv_sampler_init(&sampler, c->vocab_size, temperature, top_p, seed) != NV_OK ||
        nv_sampler_set_penalties(&sampler, presence, frequency) != NV_OK ||
        nv_sampler_set_filters(&sampler, top_k, min_p) != NV_OK ||
        nv_sampler_set_more(&sampler, typical_p, top_n_sigma, xtc_p, xtc_t) != NV_OK ||
        nv_sampler_set_mirostat(&sampler, mirostat, miro_tau, miro_eta) != NV_OK ||
        nv_sampler_set_dynatemp(&sampler, dt_range, dt_exp) != NV_OK ||
        nv_state_init(&state, c, PREFILL_CHUNK, steps, 0) != NV_OK ||
        nv_tokenizer_encode(tok, prompt, 1, 0, &prompt_tokens, &n_prompt) != NV_OK ||
        nv_sampler_set_repetition(&sampler, repetition, prompt_tokens, n_prompt) != NV_OK ||
        (penalty_window && nv_sampler_set_penalty_window(&sampler, penalty_last_n, prompt_tokens, n_prompt) != NV_OK) ||
        set_dry(&sampler, tok, dry_mult, dry_base, dry_allowed, dry_last_n, breakers, n_breakers, prompt_tokens, n_prompt) != NV_OK ||
        (grammar && (nv_gtrie_build(tok, &trie) != NV_OK || nv_gsampler_init(&gs, grammar, c->vocab_size) != NV_OK))) {
        cli_error(CMD, 1, "%s", nv_errmsg());
        goto done;
    }
    if (n_prompt == 0) {
        cli_error(CMD, 1, "the prompt gives no tokens and this vocabulary has no BOS to start from: pass -p TEXT");
        goto done;
    }
    nv_model_drop_quant_sources(&model); /* the plans hold their own copy */
    if (spec.draft) {
        if ((rc = cli_load_draft(CMD, &spec, threads, &model, tok, &draft)) != 0) goto done;
        rc = 1;
        const int dcache = steps < draft.config.seq_len ? steps : draft.config.seq_len;
        if (nv_state_init(&dstate, &draft.config, PREFILL_CHUNK, dcache, 0) != NV_OK) {
            cli_error(CMD, 1, "%s", nv_errmsg());
            goto done;
        }
    }

    /* Prefill: the prompt tokens whose successors are forced, run in chunks. */
    double t0 = nv_now();
    int n_forced = n_prompt < steps ? n_prompt : steps;
    int pos = 0, stopped = 0;
    /* run.c prints each forced pair (prompt[i], prompt[i+1]) for the positions it runs */
    int n_pairs = n_prompt - 1 < steps ? n_prompt - 1 : steps;
    /* llama2.c's prompts start with BOS, which prints nothing; a vocabulary that adds none starts with text */
    if (prompt_tokens[0] != nv_tokenizer_bos(tok)) print_piece(tok, nv_tokenizer_decode(tok, -1, prompt_tokens[0]));
    for (int i = 0; i < n_pairs && !stopped; i++) {
        if (prompt_tokens[i + 1] == nv_tokenizer_bos(tok)) stopped = 1; /* BOS delimits sequences, as in run.c */
        else print_piece(tok, nv_tokenizer_decode(tok, prompt_tokens[i], prompt_tokens[i + 1]));
    }
    fflush(stdout);
    while (pos < n_forced) {
        int n = n_forced - pos < PREFILL_CHUNK ? n_forced - pos : PREFILL_CHUNK;
        if (nv_forward(&model, &state, prompt_tokens + pos, n, pos) != NV_OK) {
            cli_error(CMD, 1, "%s", nv_errmsg());
            goto done;
        }
        pos += n;
    }
    double t_prefill = nv_now();
    int generated = 0, drafted = 0, accepted = 0, passes = 0;
    if (spec.tokens && !(ctx = malloc(((size_t)n_prompt + (size_t)steps + 1) * sizeof *ctx))) {
        cli_error(CMD, 1, "out of memory");
        goto done;
    }
    if (ctx) memcpy(ctx, prompt_tokens, (size_t)n_prompt * sizeof *ctx), n_ctx = n_prompt;
    if (!stopped && n_forced == n_prompt) {
        int token = prompt_tokens[n_prompt - 1];
        /* the last forward's tokens: the token fed at its first position, then its drafts; row j of
           state.logits holds the successor of feed[j] */
        int feed[NV_MAX_SPEC + 1], nrows = 1, row = 0, agreed = 0;
        nv_spec_record record = {0, 0};
        const size_t V = (size_t)c->vocab_size;
        while (1) {
            float *logits = state.logits + (size_t)row * V;
            int next = grammar ? nv_gsample(&gs, trie, tok, &sampler, token, logits) : nv_sample(&sampler, logits);
            if (next < 0) {
                fprintf(stderr, "nerve generate: no token of this vocabulary continues the grammar; stopping\n");
                break;
            }
            /* run.c stops at BOS only; byte-level vocabularies end at their end-of-generation tokens */
            if (nv_tokenizer_ends_text(tok, next)) break;
            nv_sampler_accept(&sampler, next);
            print_piece(tok, nv_tokenizer_decode(tok, token, next));
            fflush(stdout);
            generated++;
            token = next;
            if (ctx) ctx[n_ctx++] = token;
            if (pos >= steps || (grammar && nv_gmatch_finished(gs.m))) break;
            /* a draft the model agreed with: its keys and values are in place, its row has the next logits */
            if (++row < nrows && feed[row] == token) {
                accepted++, agreed++;
                pos++;
                continue;
            }
            if (nrows > 1) nv_spec_update(&record, agreed, row < nrows); /* the last forward's drafts: refused when a row was left */
            if (draft.plans && nrows > 1) dvalid += nv_draft_kept(agreed, nrows - 1); /* the draft model's cache */
            agreed = 0;
            /* drafts: as many as this text's acceptance makes worthwhile, never past the positions this run may reach */
            int nd = 0, k = spec.tokens ? nv_spec_len(&record, spec.tokens) : 0;
            if (k > steps - 1 - pos) k = steps - 1 - pos;
            if (ctx && k > 0 && draft.plans) nd = draft_tokens(&draft, &dstate, ctx, n_ctx, &dvalid, k, spec.draft_p_min, feed + 1);
            else if (ctx && k > 0) nd = nv_ngram_draft(ctx, n_ctx, spec.lookup_min, spec.lookup_max, k, feed + 1);
            if (nd < 0) {
                cli_error(CMD, 1, "the draft model: %s", nv_errmsg());
                goto done;
            }
            feed[0] = token;
            nrows = 1 + nd;
            drafted += nd;
            passes++;
            if (nv_forward_rows(&model, &state, feed, nrows, pos, nrows) != NV_OK) {
                cli_error(CMD, 1, "%s", nv_errmsg());
                goto done;
            }
            pos++;
            row = 0;
        }
    }
    double t_end = nv_now();
    /* run.c ends with a newline; our stdout is the text alone, so pipes get exactly the sample */
    if (isatty(STDOUT_FILENO)) printf("\n");
    fflush(stdout);
    fprintf(stderr, "nerve: %d prompt tokens (%.1f tok/s), %d generated (%.1f tok/s), engine %s\n", n_forced,
            t_prefill > t0 ? n_forced / (t_prefill - t0) : 0.0, generated,
            t_end > t_prefill && generated > 1 ? (generated - 1) / (t_end - t_prefill) : 0.0, nv_engine_name(engine));
    if (spec.tokens)
        fprintf(stderr, "nerve: speculative decoding: %d of %d draft tokens accepted (%d forward passes after the prompt's, for %d tokens)\n",
                accepted, drafted, passes, generated);
    rc = 0;
done:
    free(prompt_text);
    free(prompt_tokens);
    free(ctx);
    nv_state_free(&state);
    nv_state_free(&dstate);
    nv_model_free(&draft);
    nv_sampler_free(&sampler);
    nv_gsampler_free(&gs);
    nv_gtrie_free(trie);
    nv_grammar_unref(grammar);
    if (tok) nv_tokenizer_free(tok);
    nv_model_free(&model);
    return rc;
}
