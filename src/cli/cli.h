/* The nerve command's subcommands and the strict option parsers they share.
 * Every subcommand returns the process exit code: 0 success, 1 failure, 2 usage error; it
 * reports an error as one line "nerve <cmd>: <message>" on stderr. */
#ifndef NV_CLI_H
#define NV_CLI_H

#include <stdint.h>
#include <string.h>

#include "engine/engine.h"
#include "model/batch.h"
#include "model/bpe_train.h"
#include "model/model.h"
#include "serve/chat.h"

int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_batch(int argc, char **argv);

/* Work run beside a server that cli_serve_run starts for it (`nerve batch`): the server listens on
 * 127.0.0.1 at a free port, with api_key its only key and no chat page; run is called on a thread
 * of its own once it listens, and its return is the exit code; SIGINT/SIGTERM are passed to
 * interrupt (level 1 the first, 2 the second); the server then stops. */
typedef struct {
    const char *cmd; /* the command errors name */
    const char *api_key;
    void *ctx;
    int (*run)(void *ctx, int port, int max_batch, int max_queue, float timeout_s);
    void (*interrupt)(void *ctx, int level);
} cli_serve_job;
/* nerve serve's options and server; with job NULL, `nerve serve` itself. */
int cli_serve_run(int argc, char **argv, const cli_serve_job *job);
int cmd_tokenize(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_init(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tokenizer(int argc, char **argv);
int cmd_tune(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_imatrix(int argc, char **argv);
int cmd_pull(int argc, char **argv);

/* A byte-fallback BPE tokenizer of `vocab` tokens trained on text files and folders (every text file
 * under a folder, as train --data reads it), their first max_chars bytes (cmd_tokenizer.c); `nerve
 * tokenizer train`'s, and train's when it is given text and no tokenizer. */
nv_err cli_bpe_train_paths(const char *const *paths, int n_paths, int vocab, uint64_t max_chars, nv_bpe_result *r);

/* nerve tune's file (cmd_tune.c): what was measured best for this machine and a model shape. */
typedef struct {
    nv_engine_id serve_engine, generate_engine;
    int prefill_chunk;
    char at[32];     /* when it was measured */
    char path[4200]; /* the tune file */
} cli_tuned;
/* The tune file's path ($NERVE_TUNE_FILE, $XDG_CACHE_HOME/nerve/tune.json, ~/.cache/nerve/tune.json);
 * 0 when none can be named. */
int cli_tune_path(char *out, size_t cap);
/* This machine as the file keys it: CPU, threads in the pool, the engines on (after nv_engines_init). */
void cli_tune_machine(char *out, size_t cap);
/* A model as the file keys it: shape and the weights' formats (call before the quantized sources are
 * dropped). */
void cli_tune_model_key(const nv_model *m, char *out, size_t cap);
/* The choice stored for this machine and model: 1 when there is one (a file or entry nerve cannot
 * read is a warning and 0). */
int cli_tune_lookup(const char *machine, const char *model_key, cli_tuned *out);
/* Models tuned for this machine in the tune file (its path to path), -1 when it cannot be read. */
int cli_tune_count(const char *machine, char *path, size_t cap);

/* Parse a whole string as a number within [lo, hi]; on failure print
 * "nerve <cmd>: <flag> ..." and return 0. */
int cli_int(const char *cmd, const char *flag, const char *s, long lo, long hi, int *out);
/* A size: "512M", "2G", "64k", "1048576", "1.5G", an optional trailing B or iB; K, M, G, T powers of
 * unit (1024, or 1000 as llama-gguf-split reads them; KiB, MiB, ... 1024's whatever unit says). 0 after one line on stderr. */
int cli_size(const char *cmd, const char *flag, const char *s, int unit, uint64_t *out);
int cli_u64(const char *cmd, const char *flag, const char *s, uint64_t *out);
int cli_float(const char *cmd, const char *flag, const char *s, double lo, double hi, float *out);
/* --experts N and --experts-used K as given (0: not given): *used gets its default (2, or N when
 * fewer) when N is given alone. Returns 0, or 2 after printing why the pair does not go together. */
int cli_experts(const char *cmd, int experts, int *used);
/* --kv-cache-dtype's value (f16, f32 or q8; model/batch.h), the same way. */
int cli_kv_dtype(const char *cmd, const char *flag, const char *s, nv_kv_dtype *out);
/* The value after argv[*i] (advancing *i), or NULL after printing a usage error. */
const char *cli_value(const char *cmd, int argc, char **argv, int *i);
/* A flag without a value: 1 (and *out = value) when a is flag, else 0. */
static inline int cli_switch(const char *a, const char *flag, int *out, int value) {
    if (strcmp(a, flag) != 0) return 0;
    *out = value;
    return 1;
}
int cli_error(const char *cmd, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A text file a flag names, whole, into *out (NUL-terminated; len its bytes, or NULL): 1, or 0 after
   one line on stderr when it cannot be read or holds a NUL byte (*out then NULL). */
int cli_read_text(const char *cmd, const char *flag, const char *path, char **out, size_t *len);
/* Probes the engines on `threads` threads and picks `name`, or when NULL the fastest engine
 * (see cli_engine_default). Returns 0, or the exit code after printing why
 * (2: unknown engine name, 1: that engine is off on this machine). */
/* The engines a command picks from by default: the fastest (serve), the fastest whose operands are
 * floating point (train: nothing quantised to int8), the fastest exact fp32 one (generate). */
typedef enum { CLI_ENGINE_FASTEST, CLI_ENGINE_FLOAT, CLI_ENGINE_FP32 } cli_engine_default;
int cli_engine(const char *cmd, const char *name, int threads, cli_engine_default pick, nv_engine_id *out);

/* Speculative decoding's flags, the same for serve and generate: --spec-tokens N (0..NV_MAX_SPEC,
 * 0: off), --spec-lookup-min N, --spec-lookup-max N (1..64; defaults 2 and 4), or drafts from a
 * smaller model: --model-draft MODEL (-md; then --spec-tokens defaults to 8 and the lookup flags
 * are refused), --draft-engine E and --draft-p-min P (0..1). */
typedef struct {
    int tokens, lookup_min, lookup_max;
    int tokens_given, lookup_given;
    const char *draft, *draft_engine;
    float draft_p_min; /* --draft-p-min P: drafts stop at the first the draft gives less (default 0.75) */
    int p_min_given;
} cli_spec;
#define CLI_SPEC_DEFAULTS {0, 2, 4, 0, 0, NULL, NULL, 0.75f, 0}
/* 1 when flag a (value v) is one of them and was read, 0 when it is not one of them, -1 after
 * printing why v is bad. */
int cli_spec_flag(const char *cmd, const char *a, const char *v, cli_spec *o);
/* 0, or 2 after printing why (min above max, lookup flags beside a draft model); fills in the
 * draft model's default draft length. */
int cli_spec_check(const char *cmd, cli_spec *o);
/* A model beside the run's own (a speculative draft, a distillation teacher; flag names it in
 * errors) at path: loaded for inference, its vocabulary checked against the model's (vocab_size
 * tokens and, where it carries its own tokenizer — a GGUF file or a run folder — the same pieces as
 * tok, when tok is given), its plans built on engine_name (NULL: the fastest engine that probes
 * well). Returns 0, or the exit code after printing why (d then empty). */
int cli_load_companion(const char *cmd, const char *flag, const char *path, const char *engine_name, int threads, int vocab_size,
                       const nv_tokenizer *tok, nv_model *d);
/* The draft model of o->draft for a model and its tokenizer (cli_load_companion, on o->draft_engine:
 * the draft's bits never change the answers). */
int cli_load_draft(const char *cmd, const cli_spec *o, int threads, const nv_model *model, const nv_tokenizer *tok, nv_model *d);

/* The model and tokenizer paths of `-m MODEL [-z TOKENIZER]`. MODEL may be a `nerve train` run
 * folder: its model.bin (else its model.gguf), and its tokenizer.bin unless -z was given; or a GGUF file, whose own
 * vocabulary is the tokenizer unless -z was given. Otherwise the tokenizer is
 * tokenizers/tokenizer.bin in the shared data. *model and *tok are updated in place (pointing
 * into the buffers when changed). */
typedef struct {
    char model[4200], tok[4200];
    int own_tok; /* the tokenizer came with the model (a run folder's, a GGUF file's), not -z or the default */
} cli_paths;
void cli_model_paths(const char **model, const char **tok, cli_paths *buf);
/* Adapters merged into a model at load: `--lora FILE` and `--lora-scaled FILE SCALE` (llama.cpp's
 * flags; a GGUF LoRA adapter as nerve train writes it or llama.cpp's convert_lora_to_gguf.py does). */
#define CLI_MAX_LORA 8
typedef struct {
    const char *path[CLI_MAX_LORA];
    float scale[CLI_MAX_LORA];
    int n;
} cli_loras;
/* Handles argv[*i] when it is --lora or --lora-scaled (taking its values): 1 taken, 0 not one of
 * them, -1 a bad value (reported). */
int cli_lora_flag(const char *cmd, int argc, char **argv, int *i, cli_loras *l);
/* Loads a model for inference (quantized: nv_model_load_quantized's form; else every weight fp32);
 * with adapters, every weight in fp32, each adapter of l merged in (the matrices it changes lose
 * their block-quantized sources: plans take the merged fp32 weights), merged weights that are not
 * finite refused. One line of error on failure, m left empty. */
nv_err cli_load_model(const char *path, const cli_loras *l, int quantized, nv_model *m);
/* The chat template a model file declares, as Jinja text (malloc'd; NULL when none): the
 * chat_template file `nerve train` leaves beside a model fine-tuned on chat data (its run folder)
 * as nv_chat_template_jinja writes it, else a Hugging Face folder's tokenizer_config.json's, else a
 * GGUF file's tokenizer.chat_template. */
char *cli_declared_template_text(const char *model_path);
/* --jinja (1) and --no-jinja (0) into *run_jinja (-1 when neither: the default); 1 when a is one. */
int cli_jinja_flag(const char *a, int *run_jinja);
/* A GGUF model's named template tokenizer.chat_template.NAME (malloc'd), NULL when it has none. */
char *cli_gguf_named_template(const char *model_path, const char *name);
/* What serve, chat, train and perplexity render with: --chat-template NAME (nerve's renderer of it),
 * else --chat-template-file F or the model's own template (cli_declared_template_text), run as Jinja
 * (*prog; the caller frees it), *tmpl the template its markers name for stops and calls (plain for
 * none: EOS stops the answer; tool calls in Hermes's form). jinja -1 (the default): nerve's renderer of
 * the named template instead where the template would lose what it keeps (a system message, tools,
 * calls and results; a generation prompt that opens a think block), or when the text is exactly one
 * of nerve's own; 1 (--jinja, or a run folder that trained with a Jinja template): run it always;
 * 0 (--no-jinja): the renderer whenever the markers name one. *tmpl is left as it was when nothing
 * is declared. text_out (may be NULL): the
 * template's text as found (malloc'd; a file's, --jinja's or the model's own, run or not), NULL when
 * none. A file's, --jinja's or a run's marked template that does not parse is refused (1); the
 * model's own is then warned of and the named renderer used (plain for none). 0, or the exit code. */
int cli_chat_template(const char *cmd, const char *model_path, const char *name, const char *file, int jinja, nv_chat_template *tmpl,
                      nv_jinja **prog, char **text_out);
/* --chat-template NAME and --chat-template-file FILE checked (either may be NULL, not both; NAME
 * into *out), before anything loads. 0, or the exit code after printing why. */
int cli_template_flags(const char *cmd, const char *name, const char *file, nv_chat_template *out);

#endif
