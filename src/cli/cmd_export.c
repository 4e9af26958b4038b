/* nerve export: a training checkpoint's (or a model file's) weights as a llama2.c checkpoint that
 * `nerve generate` reads, or as a GGUF file with its vocabulary that llama.cpp reads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "base/file.h"
#include "base/utf8.h"
#include "base/log.h"
#include "base/pool.h"
#include "cli/cli.h"
#include "cli/hub.h"
#include "model/gguf.h"
#include "model/hf.h"
#include "model/imatrix.h"
#include "model/model.h"
#include "serve/chat.h"
#include "train/ckpt.h"

#define CMD "export"

static int ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), t = strlen(tail);
    return n >= t && !strcmp(s + n - t, tail);
}

typedef enum { OUT_LLAMA2C, OUT_GGUF, OUT_HF } out_format;

/* The chat template the output carries: --chat-template's, --chat-template-file's, or the one the
 * input declares (a chat run's, a GGUF file's or a Hugging Face folder's, passed on as it is);
 * malloc'd, NULL for none. */
typedef struct {
    const char *name, *file; /* the flags */
} template_flags;

static int output_template(const template_flags *f, const char *input, char **text) {
    *text = NULL;
    if (f->name && !strcmp(f->name, "none")) return 0;
    if (f->name) {
        nv_chat_template t;
        if (nv_chat_template_parse(f->name, &t) != NV_OK) return cli_error(CMD, 2, "--chat-template: %s, or none", nv_errmsg());
        *text = strdup(nv_chat_template_jinja(t));
    } else if (f->file) {
        char *data = NULL;
        size_t n = 0;
        if (nv_file_read_all(f->file, &data, &n) != NV_OK) return cli_error(CMD, 1, "--chat-template-file: %s", nv_errmsg());
        if (n == 0 || n > (1 << 20) || memchr(data, 0, n) || !nv_utf8_valid(data, n)) {
            free(data);
            return cli_error(CMD, 1, "--chat-template-file %s: a template is 1 byte to 1 MiB of UTF-8 text without NUL bytes", f->file);
        }
        *text = strndup(data, n);
        free(data);
    } else {
        *text = cli_declared_template_text(input);
        return 0;
    }
    return *text ? 0 : cli_error(CMD, 1, "out of memory");
}

static int write_out(const nv_model *m, const char *out, const char *tok_path, out_format fmt, uint32_t type,
                     const char *chat_template, const nv_imatrix *im, nv_gguf_split *split) {
    if (m->cls_head) /* a GGUF reranker's: the export keeps the language model alone */
        nv_warn("export: %s gets no classification head (cls.output): it reranks by its tokens' logits (--rerank-tokens), not by the head",
                out);
    if (fmt == OUT_LLAMA2C) {
        if (chat_template) {
            nv_chat_template t;
            const int ours = nv_chat_template_of_jinja(chat_template, strlen(chat_template), &t);
            nv_warn("export: a llama2.c file has no place for the chat template: serve %s with --chat-template %s", out,
                    ours ? nv_chat_template_name(t) : "NAME, or --chat-template-file with the template's Jinja (or export GGUF or a Hugging Face folder, which keep it)");
        }
        return nv_model_save_v1(m, out) == NV_OK ? 0 : cli_error(CMD, 1, "%s", nv_errmsg());
    }
    nv_tokenizer *tok = NULL;
    if (tok_path && nv_tokenizer_load_for_model(tok_path, m->config.vocab_size, &tok) != NV_OK)
        return cli_error(CMD, 1, "%s", nv_errmsg());
    if (!tok) nv_warn("export: no tokenizer (-z): %s gets no vocabulary, which %s", out,
                      fmt == OUT_GGUF ? "llama.cpp needs" : "transformers needs (tokenizer.json)");
    char name[256];
    nv_path_name(out, name, sizeof name); /* general.name */
    nv_err e = fmt == OUT_GGUF ? nv_gguf_save_split(m, tok, name, out, type, chat_template, im, split)
                               : nv_hf_save(m, tok, out, type == NV_GGUF_F16 ? NV_HF_F16 : type == NV_GGUF_F32 ? NV_HF_F32 : NV_HF_BF16,
                                            chat_template);
    nv_tokenizer_free(tok);
    return e == NV_OK ? 0 : cli_error(CMD, 1, "%s", nv_errmsg());
}

/* What was written: OUT, or the split files' names. */
static void report_written(const char *out, const nv_gguf_split *split, const char *what) {
    if (!split) {
        fprintf(stderr, "nerve: wrote %s%s\n", out, what);
        return;
    }
    char first[4200], last[4200];
    if (nv_gguf_split_name(out, 0, split->n_files, first, sizeof first) != NV_OK ||
        nv_gguf_split_name(out, split->n_files - 1, split->n_files, last, sizeof last) != NV_OK)
        return;
    if (split->n_files == 1) fprintf(stderr, "nerve: wrote %s%s\n", first, what);
    else fprintf(stderr, "nerve: wrote %d files, %s to %s%s\n", split->n_files, first, last, what);
}

static int export_cmd(int argc, char **argv, nv_imatrix *im) {
    const char *in = NULL, *out = NULL, *tok_path = NULL, *type_name = "f32", *format = NULL, *imatrix_path = NULL;
    int pure = 0, max_tensors = 0;
    cli_hub_ref hub = {0};
    uint64_t max_bytes = 0;
    cli_loras loras = {0};
    template_flags tf = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: nerve export CHECKPOINT|RUN_DIR|MODEL -o OUT [-z TOKENIZER] [--type f32|f16|bf16|q8_0|q6_k|q5_k_m|q5_k_s|q5_1|q5_0|q4_k_m|q4_k_s|q4_1|q4_0|iq4_xs|iq4_nl|q3_k_l|q3_k_m|q3_k_s|q2_k|mxfp4_moe]\n"
                   "                   [--format llama2c|gguf|hf] [--imatrix FILE] [--pure] [--lora ADAPTER] [--lora-scaled ADAPTER SCALE]\n"
                   "                   [--split-max-size SIZE] [--split-max-tensors N]\n"
                   "  writes the weights of a training checkpoint (a run folder: its ckpt.bin) or of a model\n"
                   "  (a file, or a Hugging Face folder) as a llama2.c version-1 checkpoint; or, when OUT ends in .gguf,\n"
                   "  as a GGUF v3 llama model (qwen3 for a QK-norm model) as llama.cpp reads it; or, when OUT\n"
                   "  ends in '/' or is a folder (or --format hf), as a Hugging Face folder (config.json,\n"
                   "  model.safetensors, tokenizer.json, ...) as transformers reads it; with the vocabulary of -z\n"
                   "  (default: the run folder's tokenizer.bin, or the input's own)\n"
                   "  --format F  llama2c, gguf or hf: the output's form whatever its name\n"
                   "  --type T  Hugging Face: f32 (default, exact), bf16 or f16; GGUF: f32 (default, exact), f16 or bf16 (the weight matrices\n"
                   "            in half precision, 2x smaller, ~2x faster decode; bf16 keeps fp32's range), q8_0 (the weight matrices quantized to 8 bits\n"
                   "            in blocks of 32, ~3.8x smaller; nerve serves them as int8, ~2x faster decode) or\n"
                   "            q4_0 (4 bits in blocks of 32, ~7x smaller, coarser; served as 4-bit values), q4_1 and q5_1 (with\n"
                   "            a minimum per block too); llama.cpp's\n"
                   "            k-quants: q6_k (6 bits in super-blocks of 256, ~5x smaller), q5_k_m and q4_k_m (its\n"
                   "            Q5_K_M and Q4_K_M mixes: 5- or 4-bit, Q6_K for the classifier and some attn_v/ffn_down;\n"
                   "            ~5.5x and ~6.5x smaller), or q5_0; smaller still: iq4_xs and iq4_nl (4-bit indices into 16\n"
                   "            unevenly spaced values, per 32; IQ4_XS's scales 6-bit in super-blocks of 256: ~7x smaller),\n"
                   "            q3_k_m (3-bit, ~8x) and q2_k (2-bit, ~9.5x; both coarse: for large models); its other mixes\n"
                   "            q5_k_s (Q5_K alone) and q4_k_s (Q4_K, Q5_K for the first layers' attn_v and ffn_down), a\n"
                   "            little smaller than the _m mixes, and\n"
                   "            q3_k_s, q3_k_l (Q3_K alone, or Q5_K for attn_v, attn_output and ffn_down); rows that are\n"
                   "            not whole blocks fall back as llama.cpp's do; each gives the classifier Q6_K (q8_0 aside);\n"
                   "            mxfp4_moe: a mixture's experts in MXFP4 (gpt-oss's form), the other matrices Q8_0\n"
                   "  --pure    every matrix in the type's own form: no Q6_K classifier, none of a mix's raised layers\n"
                   "            (llama-quantize's --pure)\n"
                   "  --chat-template T  the chat template the output carries (GGUF: tokenizer.chat_template; Hugging Face:\n"
                   "            tokenizer_config.json's chat_template), in Jinja as transformers, vLLM and llama.cpp run it:\n"
                   "            plain, chatml, llama2, llama3, deepseek, phi3, gemma, granite, mistral, phi4-mini, phi4, olmo2, smollm3, or none\n"
                   "            (default: the input's own, e.g. the template a chat run trained with)\n"
                   "  --chat-template-file FILE  a Jinja template of your own instead\n"
                   "  --imatrix FILE  an importance matrix (nerve imatrix, or llama.cpp's imatrix .gguf/.dat): the\n"
                   "            q4_0, q5_0, k-quant and IQ4 blocks' scales fitted to it, keeping best the weights that meet\n"
                   "            the largest inputs\n"
                   "  --lora ADAPTER, --lora-scaled ADAPTER SCALE\n"
                   "            merge a LoRA adapter (GGUF, nerve's or llama.cpp's) into MODEL's weights first, scaled\n"
                   "            (default 1); up to 8. A LoRA run folder exports its merged model (model.bin/.gguf)\n"
                   "  -hf USER/NAME[:TAG]  the model from the Hugging Face Hub instead (nerve pull --help): a transformers\n"
                   "            repository's folder written as GGUF, quantized, is what llama.cpp's convert_hf_to_gguf.py\n"
                   "            and llama-quantize do\n"
                   "  --split-max-size SIZE, --split-max-tensors N\n"
                   "            GGUF: the model in llama-gguf-split's files, OUT-00001-of-0000N.gguf, ... (OUT without .gguf),\n"
                   "            each at most SIZE of tensor data (e.g. 2G, 500M: units of 1000, as llama-gguf-split's) or N\n"
                   "            tensors; llama.cpp and nerve load them from the first\n");
            return 0;
        }
        if (a[0] != '-') {
            if (in) return cli_error(CMD, 2, "one checkpoint at a time");
            in = a;
            continue;
        }
        if (cli_switch(a, "--pure", &pure, 1)) continue;
        const int hf = cli_hub_flag(CMD, argc, argv, &i, &hub);
        if (hf < 0) return 2;
        if (hf) continue;
        const int lf = cli_lora_flag(CMD, argc, argv, &i, &loras);
        if (lf < 0) return 2;
        if (lf) continue;
        if (!(v = cli_value(CMD, argc, argv, &i))) return 2;
        if (!strcmp(a, "-o")) out = v;
        else if (!strcmp(a, "-z")) tok_path = v;
        else if (!strcmp(a, "--type")) type_name = v;
        else if (!strcmp(a, "--format")) format = v;
        else if (!strcmp(a, "--chat-template")) tf.name = v;
        else if (!strcmp(a, "--chat-template-file")) tf.file = v;
        else if (!strcmp(a, "--imatrix")) imatrix_path = v;
        else if (!strcmp(a, "--split-max-size")) {
            if (!cli_size(CMD, a, v, 1000, &max_bytes)) return 2;
            if (!max_bytes) return cli_error(CMD, 2, "--split-max-size expects a size above 0");
        } else if (!strcmp(a, "--split-max-tensors")) {
            if (!cli_int(CMD, a, v, 1, 1 << 20, &max_tensors)) return 2;
        } else return cli_error(CMD, 2, "unknown option '%s'", a);
    }
    static const struct {
        const char *name;
        uint32_t type;
    } types[] = {{"f32", NV_GGUF_F32},  {"f16", NV_GGUF_F16},  {"bf16", NV_GGUF_BF16},  {"q8_0", NV_GGUF_Q8_0},   {"q6_k", NV_GGUF_Q6_K},
                 {"q5_0", NV_GGUF_Q5_0}, {"q5_k_m", NV_GGUF_Q5_K}, {"q5_k", NV_GGUF_Q5_K}, {"q4_k_m", NV_GGUF_Q4_K}, {"q4_k", NV_GGUF_Q4_K}, {"q4_0", NV_GGUF_Q4_0},
                 {"iq4_xs", NV_GGUF_IQ4_XS}, {"iq4_nl", NV_GGUF_IQ4_NL}, {"q3_k_m", NV_GGUF_Q3_K}, {"q3_k", NV_GGUF_Q3_K}, {"q2_k", NV_GGUF_Q2_K},
                 {"q4_1", NV_GGUF_Q4_1}, {"q5_1", NV_GGUF_Q5_1}, {"q5_k_s", NV_GGUF_Q5_K_S}, {"q4_k_s", NV_GGUF_Q4_K_S}, {"q3_k_s", NV_GGUF_Q3_K_S}, {"q3_k_l", NV_GGUF_Q3_K_L},
                 {"mxfp4_moe", NV_GGUF_MXFP4_MOE}};
    uint32_t type = UINT32_MAX;
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++)
        if (!strcasecmp(type_name, types[k].name)) type = types[k].type;
    if (type == UINT32_MAX)
        return cli_error(CMD, 2, "--type expects f32, f16, bf16, q8_0, q6_k, q5_k_m, q5_k_s, q5_1, q5_0, q4_k_m, q4_k_s, q4_1, q4_0, iq4_xs, iq4_nl, "
                                 "q3_k_l, q3_k_m, q3_k_s, q2_k or mxfp4_moe, not '%s'", type_name);
    if ((!in && !hub.repo) || !out) return cli_error(CMD, 2, "usage: nerve export CHECKPOINT|RUN_DIR|MODEL|-hf USER/NAME -o OUT [-z TOKENIZER]");
    if (tf.name && tf.file) return cli_error(CMD, 2, "--chat-template and --chat-template-file: one or the other");
    struct stat os;
    out_format fmt = ends_with(out, ".gguf")                                              ? OUT_GGUF
                     : ends_with(out, "/") || (stat(out, &os) == 0 && S_ISDIR(os.st_mode)) ? OUT_HF
                                                                                           : OUT_LLAMA2C;
    if (format) {
        if (!strcmp(format, "llama2c")) fmt = OUT_LLAMA2C;
        else if (!strcmp(format, "gguf")) fmt = OUT_GGUF;
        else if (!strcmp(format, "hf")) fmt = OUT_HF;
        else return cli_error(CMD, 2, "--format expects llama2c, gguf or hf, not '%s'", format);
    }
    if (fmt == OUT_HF && type != NV_GGUF_F32 && type != NV_GGUF_F16 && type != NV_GGUF_BF16)
        return cli_error(CMD, 2, "--type %s: a Hugging Face folder holds f32, bf16 or f16 weights", type_name);
    if (fmt == OUT_LLAMA2C && type != NV_GGUF_F32)
        return cli_error(CMD, 2, "--type %s needs a GGUF output (OUT ending in .gguf) or a Hugging Face one", type_name);
    nv_gguf_split split_by = {max_bytes, (uint32_t)max_tensors, 0}, *split = max_bytes || max_tensors ? &split_by : NULL;
    if (split && fmt != OUT_GGUF) return cli_error(CMD, 2, "--split-max-size and --split-max-tensors go with a GGUF output");
    if (pure && (fmt != OUT_GGUF || type == NV_GGUF_F32 || type == NV_GGUF_F16 || type == NV_GGUF_BF16))
        return cli_error(CMD, 2, "--pure goes with a quantized GGUF output (--type q8_0, q4_0, a k-quant, ...)");
    if (imatrix_path) {
        if (fmt != OUT_GGUF || type == NV_GGUF_F32 || type == NV_GGUF_F16 || type == NV_GGUF_BF16)
            return cli_error(CMD, 2, "--imatrix goes with a quantized GGUF output (--type q4_0, q4_1, q5_0, q5_1, a k-quant, iq4_xs, iq4_nl)");
        if (type == NV_GGUF_Q8_0) nv_warn("export: Q8_0 takes no importance matrix (as llama.cpp's): %s is not used", imatrix_path);
        else if (nv_imatrix_load(imatrix_path, im) != NV_OK) return cli_error(CMD, 1, "--imatrix: %s", nv_errmsg());
    }
    char hub_path[4400]; /* the model from the Hub, once the flags are known good */
    const int hub_rc = cli_hub_fetch(CMD, &hub, &in, hub_path, sizeof hub_path);
    if (hub_rc) return hub_rc;
    nv_pool_init(0); /* the quantizers run over every core (the same bytes on any count) */
    char path[4200], probe[4200], run_tok[4200];
    snprintf(path, sizeof path, "%s", in);
    snprintf(probe, sizeof probe, "%s/ckpt.bin", in);
    snprintf(run_tok, sizeof run_tok, "%s/tokenizer.bin", in);
    if (nv_file_exists(probe)) {
        snprintf(path, sizeof path, "%s", probe);
        if (!tok_path && nv_file_exists(run_tok)) tok_path = run_tok;
    }
    nv_ckpt ck;
    int lora_run = 0;
    if (nv_ckpt_load(path, &ck) == NV_OK && ck.h.lora_rank) { /* adapters: the run's merged model instead */
        nv_ckpt_close(&ck);
        cli_paths paths;
        const char *model_in = in, *no_tok = tok_path;
        if (strcmp(path, probe) != 0)
            return cli_error(CMD, 1, "%s holds LoRA adapters, not a model: export its run folder (the merged model), or the "
                                     "base model with --lora RUN_DIR/adapter.gguf", path);
        cli_model_paths(&model_in, &no_tok, &paths);
        /* the merged model is written at the run's end: one older than the checkpoint is from before */
        struct stat ms, cs;
        if (stat(model_in, &ms) != 0 || stat(probe, &cs) != 0 ||
            (ms.st_mtim.tv_sec < cs.st_mtim.tv_sec ||
             (ms.st_mtim.tv_sec == cs.st_mtim.tv_sec && ms.st_mtim.tv_nsec < cs.st_mtim.tv_nsec)))
            return cli_error(CMD, 1, "%s trained LoRA adapters and its merged model %s is missing or older than its checkpoint "
                                     "(the run ended before writing it): resume the run, or export the model it started from "
                                     "with --lora %s/adapter.gguf",
                             in, model_in, in);
        snprintf(path, sizeof path, "%s", model_in);
        nv_info("export: %s trained LoRA adapters: exporting its merged model %s", in, path);
        lora_run = 1;
    } else if (ck.map.data) {
        if (loras.n) {
            nv_ckpt_close(&ck);
            return cli_error(CMD, 2, "--lora applies to a model file, not to a training checkpoint (%s)", path);
        }
        nv_model m = {0};
        nv_ckpt_header_get_config(&ck.h, &m.config);
        m.params = (float *)ck.params; /* read only: the writers only read it */
        m.n_params = ck.h.n_params;
        nv_weights_point(&m.w, &m.config, m.params);
        long long step = (long long)ck.h.step;
        char *tmpl = NULL;
        int rc = output_template(&tf, path, &tmpl);
        if (!rc) rc = write_out(&m, out, tok_path, fmt, pure ? type | NV_GGUF_PURE : type, tmpl, im->n ? im : NULL, split);
        free(tmpl);
        nv_ckpt_close(&ck);
        char what[64];
        snprintf(what, sizeof what, " (step %lld)", step);
        if (!rc) report_written(out, split, what);
        return rc;
    }
    char why[512];
    snprintf(why, sizeof why, "%s", nv_errmsg());
    struct stat is;
    if (!lora_run && stat(path, &is) == 0 && S_ISDIR(is.st_mode)) { /* a Hugging Face folder, or a run folder's model */
        cli_paths paths;
        const char *model_in = path, *folder_tok = tok_path;
        cli_model_paths(&model_in, &folder_tok, &paths);
        if (!tok_path && paths.own_tok) tok_path = strcpy(run_tok, folder_tok);
        snprintf(path, sizeof path, "%s", model_in);
    } else if (!tok_path && nv_hf_is_model(path)) { /* its tokenizer.json */
        const char *model_in = path, *folder_tok = NULL;
        cli_paths paths;
        cli_model_paths(&model_in, &folder_tok, &paths);
        if (paths.own_tok) tok_path = strcpy(run_tok, folder_tok);
    }
    nv_model m;
    if (cli_load_model(path, &loras, 0, &m) != NV_OK) {
        if (loras.n || lora_run) return cli_error(CMD, 1, "%s", nv_errmsg()); /* the model's or an adapter's own error */
        return cli_error(CMD, 1, "%s is neither a training checkpoint (%s) nor a model (%s)", path, why, nv_errmsg());
    }
    if (!tok_path && fmt != OUT_LLAMA2C && nv_gguf_has_vocab(path)) tok_path = path; /* a GGUF input brings its own */
    char *tmpl = NULL;
    int rc = output_template(&tf, path, &tmpl);
    if (!rc) rc = write_out(&m, out, tok_path, fmt, pure ? type | NV_GGUF_PURE : type, tmpl, im->n ? im : NULL, split);
    free(tmpl);
    nv_model_free(&m);
    if (!rc) report_written(out, split, "");
    return rc;
}

int cmd_export(int argc, char **argv) {
    nv_imatrix im = {0};
    const int rc = export_cmd(argc, argv, &im);
    nv_imatrix_free(&im);
    return rc;
}
