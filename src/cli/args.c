#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "base/file.h"
#include "base/log.h"
#include "cli/cli.h"
#include "model/gguf.h"
#include "model/hf.h"
#include "model/sampler.h"
#include "train/train.h"

int cli_error(const char *cmd, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "nerve %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

int cli_read_text(const char *cmd, const char *flag, const char *path, char **out, size_t *len) {
    size_t n = 0;
    *out = NULL;
    if (nv_file_read_all(path, out, &n) != NV_OK) {
        cli_error(cmd, 1, "%s: %s", flag, nv_errmsg());
        return 0;
    }
    if (strlen(*out) != n) {
        cli_error(cmd, 1, "%s: %s holds a NUL byte", flag, path);
        free(*out);
        *out = NULL;
        return 0;
    }
    if (len) *len = n;
    return 1;
}

const char *cli_value(const char *cmd, int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        cli_error(cmd, 2, "%s needs a value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int cli_int(const char *cmd, const char *flag, const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        cli_error(cmd, 2, "%s expects an integer in [%ld, %ld], got '%s'", flag, lo, hi, s);
        return 0;
    }
    *out = (int)v;
    return 1;
}

int cli_experts(const char *cmd, int experts, int *used) {
    if (*used && !experts) return cli_error(cmd, 2, "--experts-used goes with --experts N");
    if (*used > experts) return cli_error(cmd, 2, "--experts-used %d exceeds --experts %d", *used, experts);
    if (experts && !*used) *used = experts < 2 ? experts : 2;
    return 0;
}

int cli_u64(const char *cmd, const char *flag, const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    if (*s == '-') {
        cli_error(cmd, 2, "%s expects a non-negative integer, got '%s'", flag, s);
        return 0;
    }
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end) {
        cli_error(cmd, 2, "%s expects a non-negative integer, got '%s'", flag, s);
        return 0;
    }
    *out = v;
    return 1;
}

int cli_size(const char *cmd, const char *flag, const char *s, int unit, uint64_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v >= 0) || !isfinite(v)) goto bad;
    int power = 0;
    switch (toupper((unsigned char)*end)) {
    case 'K': power = 1, end++; break;
    case 'M': power = 2, end++; break;
    case 'G': power = 3, end++; break;
    case 'T': power = 4, end++; break;
    default: break;
    }
    if (power && (end[0] == 'i' || end[0] == 'I')) end++, unit = 1024; /* KiB, GiB: binary whatever the default */
    double mul = 1;
    for (int i = 0; i < power; i++) mul *= unit;
    if (end[0] == 'B' || end[0] == 'b') end++;
    if (*end || v * mul > 1e18) goto bad;
    *out = (uint64_t)(v * mul);
    return 1;
bad:
    cli_error(cmd, 2, "%s expects a size like 512M or 2G, got '%s'", flag, s);
    return 0;
}

int cli_float(const char *cmd, const char *flag, const char *s, double lo, double hi, float *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) {
        cli_error(cmd, 2, "%s expects a number in [%g, %g], got '%s'", flag, lo, hi, s);
        return 0;
    }
    *out = (float)v;
    return 1;
}

int cli_kv_dtype(const char *cmd, const char *flag, const char *s, nv_kv_dtype *out) {
    if (!(*out = nv_kv_dtype_parse(s))) {
        cli_error(cmd, 2, "%s expects f16, f32 or q8, not '%s'", flag, s);
        return 0;
    }
    return 1;
}

int cli_engine(const char *cmd, const char *name, int threads, cli_engine_default pick, nv_engine_id *out) {
    if (nv_engines_init(NULL, threads) != NV_OK) return cli_error(cmd, 2, "%s", nv_errmsg());
    *out = pick == CLI_ENGINE_FP32 ? nv_engine_best_fp32() : pick == CLI_ENGINE_FLOAT ? nv_engine_best_float() : nv_engine_best();
    if (!name) return 0;
    if (nv_engine_parse(name, out) != NV_OK) return cli_error(cmd, 2, "%s", nv_errmsg());
    if (!nv_engine_available(*out)) return cli_error(cmd, 1, "engine %s is off: %s", name, nv_engine_why_off(*out));
    return 0;
}

/* The folder of a model file (its run folder when `nerve train` wrote it). */
static void folder_of(const char *model_path, char *dir, size_t cap) {
    const char *slash = strrchr(model_path, '/');
    snprintf(dir, cap, "%.*s", slash ? (int)(slash - model_path + (slash == model_path)) : 0, model_path);
}

int cli_template_flags(const char *cmd, const char *name, const char *file, nv_chat_template *out) {
    if (name && file) return cli_error(cmd, 2, "--chat-template and --chat-template-file: one or the other");
    if (name && nv_chat_template_parse(name, out) != NV_OK) return cli_error(cmd, 2, "%s", nv_errmsg());
    return 0;
}

/* A Jinja chat template recognised by its markers as one of nerve's: 1 and *out, else 0. */
static int template_of_text(const char *t, size_t n, nv_chat_template *out) {
    if (nv_chat_template_of_jinja(t, n, out)) return 1; /* one nerve wrote */
    if (memmem(t, n, "<|im_start|>", 12) && memmem(t, n, "Knowledge Cutoff Date", 21) && memmem(t, n, "Reasoning Mode", 14))
        *out = NV_CHAT_SMOLLM3; /* SmolLM3's ChatML, with its metadata */
    else if (memmem(t, n, "<|im_start|>", 12)) *out = memmem(t, n, "<|im_sep|>", 10) ? NV_CHAT_PHI4 : NV_CHAT_CHATML; /* Phi-4's separator */
    else if (memmem(t, n, "<|start_header_id|>", 19)) *out = NV_CHAT_LLAMA3;
    else if (memmem(t, n, NV_CHAT_DEEPSEEK_ASSISTANT, sizeof NV_CHAT_DEEPSEEK_ASSISTANT - 1)) *out = NV_CHAT_DEEPSEEK;
    else if (memmem(t, n, "<|assistant|>", 13) && memmem(t, n, "<|end|>", 7)) /* Phi-4-mini's: its tools' closing marker */
        *out = memmem(t, n, "<|/tool|>", 9) ? NV_CHAT_PHI4_MINI : NV_CHAT_PHI3;
    else if (memmem(t, n, "[gMASK]", 7)) return 0; /* GLM's roles are OLMo 2's markers, but its prompt and calls its own */
    else if (memmem(t, n, "<|assistant|>", 13) && memmem(t, n, "<|user|>", 8)) *out = NV_CHAT_OLMO2; /* the same roles without <|end|> */
    else if (memmem(t, n, "<start_of_turn>", 15) && memmem(t, n, "<end_of_turn>", 13)) *out = NV_CHAT_GEMMA;
    else if (memmem(t, n, "<|start_of_role|>", 17)) *out = NV_CHAT_GRANITE;
    else if (memmem(t, n, "[AVAILABLE_TOOLS]", 17) || memmem(t, n, "[TOOL_CALLS]", 12)) *out = NV_CHAT_MISTRAL;
    else if (memmem(t, n, "[INST]", 6)) *out = NV_CHAT_LLAMA2;
    else return 0;
    return 1;
}

char *cli_declared_template_text(const char *model_path) {
    char dir[4200], name[41];
    folder_of(model_path, dir, sizeof dir);
    if (nv_train_chat_template(dir, name, sizeof name)) { /* a chat run's, beside its model */
        char *own = nv_chat_jinja_marked(nv_train_chat_template_jinja(dir)); /* one it ran as Jinja, marked so wherever it goes */
        if (own) return own;
        nv_chat_template t;
        if (nv_chat_template_parse(name, &t) == NV_OK) return strdup(nv_chat_template_jinja(t));
        nv_warn("%s%schat_template names no chat template nerve knows ('%s'): ignored", dir, *dir ? "/" : "", name);
    }
    if (nv_hf_is_model(model_path)) return nv_hf_chat_template(model_path); /* tokenizer_config.json's */
    nv_gguf g;
    if (nv_gguf_open(model_path, &g) != NV_OK) return NULL;
    size_t n = 0;
    const char *t = nv_gguf_string(&g, "tokenizer.chat_template", &n);
    char *text = t ? strndup(t, n) : NULL;
    nv_gguf_close(&g);
    return text;
}

int cli_jinja_flag(const char *a, int *run_jinja) {
    if (!strcmp(a, "--jinja")) *run_jinja = 1;
    else if (!strcmp(a, "--no-jinja")) *run_jinja = 0;
    else return 0;
    return 1;
}

char *cli_gguf_named_template(const char *model_path, const char *name) {
    nv_gguf g;
    if (nv_gguf_open(model_path, &g) != NV_OK) return NULL;
    char key[96];
    size_t n = 0;
    snprintf(key, sizeof key, "tokenizer.chat_template.%s", name);
    const char *t = nv_gguf_string(&g, key, &n);
    char *text = t ? strndup(t, n) : NULL;
    nv_gguf_close(&g);
    return text;
}

/* What a template run as written would lose against nerve's renderer of the template its markers name
 * (llama.cpp probes templates the same way before it runs them): a system message it refuses or
 * drops, tools it does not show, a call or its result it refuses or drops; NULL when none. (A
 * generation prompt that opens a think block is read as the answer's: model/think.h.) */
static const char *jinja_lacks(const nv_jinja *prog) {
    static const char *const probes[][2] = {
        {"[{\"role\": \"system\", \"content\": \"probe_system\"}, {\"role\": \"user\", \"content\": \"probe_user\"}]",
         "takes no system message"},
        {"[{\"role\": \"user\", \"content\": \"probe_user\"}]", "shows no tools"},
        {"[{\"role\": \"user\", \"content\": \"probe_user\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": "
         "\"abc123def\", \"type\": \"function\", \"function\": {\"name\": \"probe_call\", \"arguments\": {\"x\": 1}}}]}, {\"role\": "
         "\"tool\", \"tool_call_id\": \"abc123def\", \"content\": \"probe_result\"}]",
         "takes no tool calls and results"}};
    static const char *const wants[][2] = {{"probe_system", "probe_user"}, {"probe_tool", "probe_user"}, {"probe_call", "probe_result"}};
    const char *lack = NULL;
    for (size_t i = 0; i < sizeof probes / sizeof *probes && !lack; i++) {
        cJSON *vars = cJSON_CreateObject();
        cJSON_AddItemToObject(vars, "messages", cJSON_Parse(probes[i][0]));
        cJSON_AddItemToObject(vars, "tools", i == 1 ? cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"probe_tool\", "
                                                                 "\"description\": \"d\", \"parameters\": {\"type\": \"object\", "
                                                                 "\"properties\": {}}}}]")
                                                    : cJSON_CreateNull());
        cJSON_AddStringToObject(vars, "bos_token", "<s>");
        cJSON_AddStringToObject(vars, "eos_token", "</s>");
        cJSON_AddBoolToObject(vars, "add_generation_prompt", 1);
        nv_buf out = {0};
        const nv_err e = nv_jinja_render(prog, vars, &out);
        cJSON_Delete(vars);
        const char *text = out.data ? out.data : "";
        if (e != NV_OK || !strstr(text, wants[i][0]) || !strstr(text, wants[i][1])) lack = probes[i][1];
        nv_buf_free(&out);
    }
    return lack;
}

int cli_chat_template(const char *cmd, const char *model_path, const char *name, const char *file, int jinja, nv_chat_template *tmpl,
                      nv_jinja **prog, char **text_out) {
    *prog = NULL;
    if (text_out) *text_out = NULL;
    const int frc = cli_template_flags(cmd, name, file, tmpl);
    if (frc) return frc;
    if (name && jinja <= 0) return 0; /* a name is nerve's renderer of it unless --jinja */
    const int asked = jinja > 0;
    char dir[4200], run[16], *text = NULL;
    size_t n = 0;
    folder_of(model_path, dir, sizeof dir);
    const char *from = file ? file : name ? "--chat-template" : model_path;
    if (name) {
        text = strdup(nv_chat_template_jinja(*tmpl));
    } else if (file) {
        if (nv_file_read_all(file, &text, &n) != NV_OK) return cli_error(cmd, 1, "--chat-template-file: %s", nv_errmsg());
    } else if (nv_train_chat_template(dir, run, sizeof run) && !strcmp(run, "jinja")) { /* marked: run as Jinja, below */
        if (!(text = nv_chat_jinja_marked(nv_train_chat_template_jinja(dir))))
            return cli_error(cmd, 1, "%s%schat_template names jinja, but %s%schat_template.jinja cannot be read", dir, *dir ? "/" : "", dir,
                             *dir ? "/" : "");
    } else {
        text = cli_declared_template_text(model_path);
    }
    if (!text) {
        if (asked && !name) nv_warn("%s declares no chat template: --jinja has none to run", model_path);
        return 0;
    }
    n = strlen(text);
    /* a run's own, in its folder or exported: run as Jinja whatever its markers say (and refused if it does not parse) */
    const int marked = !strncmp(text, NV_CHAT_RUN_AS_JINJA, sizeof NV_CHAT_RUN_AS_JINJA - 1);
    if (marked) jinja = 1;
    const int defaulted = jinja < 0;
    const int known = template_of_text(text, n, tmpl);
    /* by default (llama.cpp's and vLLM's) the template is run as it is written, the markers giving only
       the stops and the tool calls' form; exactly one of nerve's own templates is its renderer (the same
       text); --no-jinja: the renderer the markers name */
    nv_chat_template own;
    if (jinja < 0) jinja = !nv_chat_template_of_jinja(text, n, &own);
    int rc = 0;
    if (!known || jinja) {
        const nv_chat_template recognised = *tmpl;
        if (!known) *tmpl = NV_CHAT_PLAIN; /* its stop: the vocabulary's end of text; its calls: Hermes's */
        const char *lack = NULL;
        if (nv_jinja_parse(text, n, prog) != NV_OK) {
            if (file || asked || marked) rc = cli_error(cmd, 1, "%s: %s", from, nv_errmsg());
            else if (known)
                nv_warn("%s: its chat template cannot be run (%s): nerve's %s renderer instead (see --chat-template)", model_path,
                        nv_errmsg(), nv_chat_template_name(recognised));
            else nv_warn("%s: its chat template cannot be run (%s): plain instead (see --chat-template)", model_path, nv_errmsg());
        } else if (!known) {
            nv_info("%s: its chat template is none nerve knows by its markers: run as Jinja", from);
        } else if (defaulted && (lack = jinja_lacks(*prog))) { /* the renderer keeps what the template would lose */
            nv_info("%s: its chat template %s: nerve's %s renderer instead (--jinja runs it as written)", from, lack,
                    nv_chat_template_name(recognised));
            nv_jinja_free(*prog);
            *prog = NULL;
        }
    }
    if (text_out) *text_out = text;
    else free(text);
    return rc;
}

void cli_model_paths(const char **model, const char **tok, cli_paths *buf) {
    struct stat st;
    buf->own_tok = 0;
    if (stat(*model, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(buf->tok, sizeof buf->tok, "%s/tokenizer.bin", *model);
        if (!*tok && nv_file_exists(buf->tok)) *tok = buf->tok, buf->own_tok = 1;
        /* model.bin, or model.gguf for the shapes llama2.c's format cannot hold */
        snprintf(buf->model, sizeof buf->model, "%s/model.bin", *model);
        if (!nv_file_exists(buf->model)) { /* else model.gguf, else a Hugging Face folder's config.json */
            char other[sizeof buf->model];
            snprintf(other, sizeof other, "%s/model.gguf", *model);
            if (!nv_file_exists(other)) snprintf(other, sizeof other, "%s/config.json", *model);
            if (nv_file_exists(other)) memcpy(buf->model, other, sizeof other);
        }
        *model = buf->model;
    }
    if (!*tok && nv_hf_is_model(*model)) { /* its tokenizer.json */
        const char *slash = strrchr(*model, '/');
        snprintf(buf->tok, sizeof buf->tok, "%.*stokenizer.json", slash ? (int)(slash - *model + 1) : 0, *model);
        if (nv_file_exists(buf->tok)) *tok = buf->tok, buf->own_tok = 1;
    }
    if (!*tok && nv_gguf_has_vocab(*model)) *tok = *model, buf->own_tok = 1; /* a GGUF model carries its tokenizer */
    if (!*tok) {
        nv_data_path("tokenizers/tokenizer.bin", buf->tok, sizeof buf->tok);
        *tok = buf->tok;
    }
}

int cli_lora_flag(const char *cmd, int argc, char **argv, int *i, cli_loras *l) {
    const char *a = argv[*i];
    const int scaled = !strcmp(a, "--lora-scaled");
    if (!scaled && strcmp(a, "--lora") != 0) return 0;
    const char *path = cli_value(cmd, argc, argv, i), *sv = path && scaled ? cli_value(cmd, argc, argv, i) : NULL;
    float scale = 1.0f;
    if (!path || (scaled && (!sv || !cli_float(cmd, "--lora-scaled", sv, -1e6, 1e6, &scale)))) return -1;
    if (l->n == CLI_MAX_LORA) {
        cli_error(cmd, 2, "at most %d adapters (--lora)", CLI_MAX_LORA);
        return -1;
    }
    l->path[l->n] = path;
    l->scale[l->n++] = scale;
    return 1;
}

nv_err cli_load_model(const char *path, const cli_loras *l, int quantized, nv_model *m) {
    if (!l || !l->n) return quantized ? nv_model_load_quantized(path, m) : nv_model_load(path, m);
    NV_TRY(nv_model_load(path, m));
    nv_err e = nv_model_own_params(m);
    for (int i = 0; i < l->n && e == NV_OK; i++) {
        nv_lora_shape s;
        float *p = NULL;
        if ((e = nv_lora_load(l->path[i], &m->config, &s, &p)) != NV_OK) break;
        nv_lora_merge(m, &s, p, l->scale[i]);
        free(p);
        for (uint64_t j = 0; j < m->n_params && e == NV_OK; j++) /* a huge alpha or scale can overflow */
            if (!isfinite(m->params[j]))
                e = nv_fail(NV_ERANGE, "adapter %s at scale %g makes weights that are not finite", l->path[i],
                            (double)l->scale[i]);
        if (e != NV_OK) break;
        char targets[64];
        nv_info("adapter %s: rank %d, alpha %g, on %s, scale %g: merged", l->path[i], s.rank, (double)s.alpha,
                nv_lora_targets_text(s.targets, targets, sizeof targets), (double)l->scale[i]);
    }
    if (e != NV_OK) nv_model_free(m);
    return e;
}

int cli_spec_flag(const char *cmd, const char *a, const char *v, cli_spec *o) {
    if (!strcmp(a, "--model-draft") || !strcmp(a, "-md")) {
        if (!*v) return cli_error(cmd, 2, "%s needs a model file", a), -1;
        o->draft = v;
        return 1;
    }
    if (!strcmp(a, "--draft-engine")) {
        o->draft_engine = v;
        return 1;
    }
    if (!strcmp(a, "--draft-p-min")) {
        o->p_min_given = 1;
        return cli_float(cmd, a, v, 0, 1, &o->draft_p_min) ? 1 : -1;
    }
    int *dst = !strcmp(a, "--spec-tokens") ? &o->tokens : !strcmp(a, "--spec-lookup-min") ? &o->lookup_min
             : !strcmp(a, "--spec-lookup-max")                                          ? &o->lookup_max
                                                                                         : NULL;
    if (!dst) return 0;
    if (dst == &o->tokens) o->tokens_given = 1;
    else o->lookup_given = 1;
    return cli_int(cmd, a, v, dst == &o->tokens ? 0 : 1, dst == &o->tokens ? NV_MAX_SPEC : 64, dst) ? 1 : -1;
}

int cli_spec_check(const char *cmd, cli_spec *o) {
    if (o->lookup_min > o->lookup_max)
        return cli_error(cmd, 2, "--spec-lookup-min (%d) is larger than --spec-lookup-max (%d)", o->lookup_min, o->lookup_max);
    if ((o->draft_engine || o->p_min_given) && !o->draft)
        return cli_error(cmd, 2, "%s needs --model-draft", o->draft_engine ? "--draft-engine" : "--draft-p-min");
    nv_engine_id e;
    if (o->draft_engine && nv_engine_parse(o->draft_engine, &e) != NV_OK) return cli_error(cmd, 2, "--draft-engine: %s", nv_errmsg());
    if (!o->draft) return 0;
    if (o->lookup_given) return cli_error(cmd, 2, "--spec-lookup-min/max are for drafts by prompt lookup, not with --model-draft");
    if (o->tokens_given && o->tokens == 0) return cli_error(cmd, 2, "--model-draft needs --spec-tokens of at least 1");
    if (!o->tokens_given) o->tokens = 8;
    return 0;
}

int cli_load_companion(const char *cmd, const char *flag, const char *path, const char *engine_name, int threads, int vocab_size,
                       const nv_tokenizer *tok, nv_model *d) {
    const char *given = path, *dtok_path = NULL;
    cli_paths paths;
    cli_model_paths(&path, &dtok_path, &paths);
    nv_engine_id engine;
    int rc = cli_engine(cmd, engine_name, threads, CLI_ENGINE_FASTEST, &engine);
    if (rc) return rc;
    if (nv_model_load_quantized(path, d) != NV_OK) return cli_error(cmd, 1, "%s: %s", flag, nv_errmsg());
    const int V = vocab_size;
    if (d->config.vocab_size != V) {
        cli_error(cmd, 1, "%s: %s has a vocabulary of %d tokens, the model %d: it must share the model's tokenizer", flag, given,
                  d->config.vocab_size, V);
        goto fail;
    }
    if (paths.own_tok && tok) { /* its own vocabulary: a GGUF file's, or the tokenizer.bin of a run folder */
        nv_tokenizer *dt = NULL;
        if (nv_tokenizer_load_for_model(dtok_path, V, &dt) != NV_OK) {
            cli_error(cmd, 1, "%s: %s", flag, nv_errmsg());
            goto fail;
        }
        int differ = -1;
        for (int t = 0; t < V && differ < 0; t++) {
            const char *a = nv_tokenizer_piece(tok, t), *b = nv_tokenizer_piece(dt, t);
            if (!a || !b ? a != b : strcmp(a, b) != 0) differ = t;
        }
        nv_tokenizer_free(dt);
        if (differ >= 0) {
            cli_error(cmd, 1, "%s: %s's tokenizer differs from the model's (token %d): it must share the model's tokenizer", flag,
                      given, differ);
            goto fail;
        }
    }
    d->drop_sources = 1; /* built once: each source goes as its plan takes it */
    if (nv_model_build_plans(d, engine) != NV_OK) {
        cli_error(cmd, 1, "%s: %s", flag, nv_errmsg());
        goto fail;
    }
    nv_model_drop_quant_sources(d);
    return 0;
fail:
    nv_model_free(d);
    return 1;
}

int cli_load_draft(const char *cmd, const cli_spec *o, int threads, const nv_model *model, const nv_tokenizer *tok, nv_model *d) {
    return cli_load_companion(cmd, "--model-draft", o->draft, o->draft_engine, threads, model->config.vocab_size, tok, d);
}
