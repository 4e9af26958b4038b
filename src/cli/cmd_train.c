/* nerve train: train from scratch or fine-tune, resumable, on the fastest engine. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log.h"
#include "base/timer.h"
#include "cli/cli.h"
#include "cli/hub.h"
#include "engine/engine.h"
#include "model/hf.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "train/data.h"
#include "train/dist.h"
#include "train/train.h"

#define CMD "train"
#define MAX_DATA 64

static void usage(FILE *f) {
    fprintf(f,
            "usage: nerve train [--preset NAME | --dim D --layers L --heads H [--kv-heads K] [--hidden N] [--head-dim N]\n"
            "                   [--qk-norm | --qkv-bias] [--separate-classifier] [--context N]] [--experts N [--experts-used K]]\n"
            "                   [--router-aux-coef C] [--router-z-coef C] [--init-from MODEL | -hf USER/NAME[:TAG]]\n"
            "                   [--teacher MODEL [--distill-alpha A] [--distill-temp T] [--teacher-engine E]]\n"
            "                   --data PATH... [-z TOKENIZER | --vocab N] [--steps N | --epochs F | --time-budget S] [--batch B] [--seq S|auto] [--accum A] [--lr LR]\n"
            "                   [--warmup N] [--lr-schedule cosine|linear|constant|wsd [--decay-frac F]] [--min-lr-frac F]\n"
            "                   [--weight-decay W] [--decay-embeddings] [--clip C] [--dropout P]\n"
            "                   [--beta2 B] [--seed S] [--out DIR] [--resume] [--eval-every N] [--eval-batches N]\n"
            "                   [--sample-every N [--sample-tokens N] [--sample-prompt TEXT]] [--eval-choice FILE [--eval-choice-tasks N]]\n"
            "                   [--data-weights W1,W2,...] [--val-frac F | --val-data PATH...] [--save-best] [--early-stop N] [--best-metric M] [--full-eval]\n"
            "                   [--ckpt-every N] [--save-every N|epoch [--save-limit K]] [--time-limit SECONDS] [--engine E] [--threads N] [--quiet]\n"
            "                   [--chat-template plain|chatml|llama2|llama3|deepseek|phi3|gemma|granite|mistral|phi4-mini|phi4|olmo2|smollm3 |\n"
            "                    --chat-template-file F] [--jinja | --no-jinja] [--pack]\n"
            "                   [--pref-loss dpo|ipo|simpo|orpo] [--pref-beta B] [--pref-sft-weight W] [--simpo-gamma G]\n"
            "                   [--lora-rank R | --lora-init ADAPTER [--lora-alpha A] [--lora-targets LIST] [--lora-dropout P] [--no-merge]] [--recompute]\n"
            "  presets: %s\n"
            "  --data: llama2.c uint16 shards (.bin), uint32 shards (.u32), text files (tokenized with -z; a folder:\n"
            "          every text file under it, in path order, hidden and binary ones left out), or chat\n"
            "          data (.jsonl, OpenAI's chat fine-tuning format: {\"messages\": [...]} a line; only the assistant's\n"
            "          answers are trained on, each conversation rendered with --chat-template, default the one the\n"
            "          --init-from model declares (run as Jinja as serve runs it; --jinja, --no-jinja and\n"
            "          --chat-template-file F as serve's), else chatml, which the run folder keeps for nerve serve -m RUN_DIR\n"
            "          (with a Jinja template: chat_template.jinja, run by serve, a run going on from it, perplexity);\n"
            "          --pack fills each window with the turns that follow instead of padding (more answer tokens a\n"
            "          step when turns are short; each attends to itself alone)\n"
            "          Text (files, folders, .jsonl text lines) without -z (and --init-from): the run trains its own BPE\n"
            "          tokenizer on them first (as nerve tokenizer train; the first 256 MiB), --vocab N tokens\n"
            "          (default: the shape's vocabulary, fewer when the text has no more pairs to merge), and\n"
            "          keeps it in --out as tokenizer.bin (a --resume takes that one)\n"
            "          Preference data (.jsonl in OpenAI's preference format: {\"input\": {\"messages\": [...]},\n"
            "          \"preferred_output\": [answer], \"non_preferred_output\": [answer]} a line, or TRL's\n"
            "          {\"prompt\": ..., \"chosen\": ..., \"rejected\": ...}) trains the --init-from model to\n"
            "          prefer the preferred answers: --pref-loss dpo (default: direct preference optimisation\n"
            "          against the model as it starts), ipo, simpo (--simpo-gamma, default 0.5) or orpo (those two\n"
            "          need no reference); --pref-beta (default 0.1, simpo 2) scales the rewards (dpo, ipo: higher\n"
            "          keeps closer to the start; orpo: the odds ratio's weight); --pref-sft-weight W (default 0)\n"
            "          adds W x the preferred answer's cross-entropy (RPO).\n"
            "          --batch counts windows (two a pair); the loss is --pref-loss's, reward_acc the pairs preferred rightly\n"
            "  --lr-schedule: after the warmup, to --min-lr-frac x --lr (default 0.1) by a cosine (default), a\n"
            "          straight line, not at all (constant), or wsd: the full rate until the last --decay-frac\n"
            "          (default 0.2) of the steps, then a straight line (warmup-stable-decay)\n"
            "  --sample-every: every N steps and at the end, print (and add to the run folder's samples.txt) what\n"
            "          the model writes after --sample-prompt (default: nothing but BOS), --sample-tokens tokens\n"
            "          (default 64) sampled as nerve generate does; training goes on exactly as without\n"
            "  --eval-choice: multiple-choice tasks (as nerve perplexity --multiple-choice reads them) scored at\n"
            "          every evaluation: metrics' mc_acc and mc_acc_norm, the first --eval-choice-tasks N of them\n"
            "  --dropout P: while training, drop each element of every layer's attention and FFN output with\n"
            "          probability P before it joins the residual stream (the rest scaled by 1/(1-P)): against\n"
            "          overfitting a small text (nanoGPT trains Shakespeare's characters with 0.2); evaluation,\n"
            "          samples and the saved model have none. Default 0\n"
            "  --recompute: keep only each layer's input and run its forward again in the backward (activation\n"
            "          checkpointing): the same losses to the bit, about a third more time, one layer's activations\n"
            "  --seq auto: with chat or preference data, the longest turn with its prompt (rounded up to a\n"
            "          multiple of 16, at most the model's context), so no answer is cut; other data: 256\n"
            "  --epochs F: the run's length in passes over the training data instead of --steps: F x its windows\n"
            "          (its tokens / --seq; a chat file's turns) / (--batch x --accum) steps, rounded up\n"
            "  --time-budget S: the run's length in time instead: after a few steps (at least 5 and 5%% of S) the\n"
            "          steps that fit S seconds from the first step at the rate measured, evaluations included,\n"
            "          planned again at 30, 45, 60, 75 and 90%% of S from the rate since the plan before; the LR\n"
            "          schedule (and the default warmup, a tenth of them at\n"
            "          most) then fits those; a --resume goes on to the length decided (kept in the checkpoint).\n"
            "          --time-limit stops a run wherever it is; this one plans to end there\n"
            "  --data-weights: each --data file's share of the training windows (a mixture: 3,1 draws three\n"
            "          windows from the first for one from the second, whatever their sizes); by default a file's\n"
            "          share is its size\n"
            "  --save-every N|epoch: every N steps, or at the end of every pass over the training data, the\n"
            "          weights as they stand into the run folder's step-N/ (a model folder, as best/: a LoRA run's\n"
            "          adapters), written whole or not at all; none at the last step (the run folder's own weights).\n"
            "          --save-limit K keeps the newest K of them. A new run in the folder removes an earlier run's\n"
            "          step-N/ folders; a resumed one those past its checkpoint\n"
            "  --val-data: files for validation alone (the --data files then train whole); without it the last\n"
            "          --val-frac (default 0.05) of each --data file is held out\n"
            "  --save-best: whenever an evaluation's validation loss is the lowest so far (step 0's included), the\n"
            "          weights go to the run folder's best/ (a model folder for generate and serve; a LoRA run's:\n"
            "          its adapters); --early-stop N stops the run after N evaluations without a lower one (with\n"
            "          --save-best); the final weights stay in the run folder itself. --best-metric M follows\n"
            "          another figure instead, the highest being best: val_reward_acc or val_choice_acc (preference\n"
            "          data), mc_acc or mc_acc_norm (--eval-choice), val_token_acc (the share of the held-out tokens\n"
            "          the model ranks first); val_loss is the default\n"
            "  --full-eval: at the end of every pass over the training data and at the last step, the loss and\n"
            "          token accuracy over the whole validation split, each window once (metrics.jsonl's\n"
            "          full_val_loss, full_val_token_acc); an evaluation's own (--eval-every) is of --eval-batches\n"
            "          batches\n"
            "  defaults: --preset stories260K, --data corpus/tinystories_train_first1000.txt and -z models/tok512.bin\n"
            "            from the shared data, --steps 1000 --batch 8 --seq 256 --lr 5e-4 --warmup 100 (a tenth of\n"
            "            --steps when that is less) --out runs/train\n"
            "  the run folder gets ckpt.bin, metrics.jsonl, loss.svg, model.bin (model.gguf\n"
            "  when llama2.c's format cannot hold the shape, as with --qk-norm or --qkv-bias) and tokenizer.bin\n"
            "  --qk-norm: Qwen3's per-head query/key norms; --qkv-bias: Qwen2's query/key/value biases\n"
            "  --experts N: a mixture of N experts of the shape's FFN in every layer, --experts-used K (default 2)\n"
            "          of them a token, picked by a router (Mixtral's form; Qwen3-MoE's with --qk-norm; written as\n"
            "          model.gguf); with --init-from a dense model, each expert starts as a copy of its FFN (sparse\n"
            "          upcycling); --router-aux-coef C (default 0.01) weighs the load-balancing loss that keeps\n"
            "          the experts evenly used (metrics' router_aux: 1 when even); --router-z-coef C (default 0, ST-MoE\n"
            "          uses 0.001) the router z-loss that keeps its logits small (metrics' router_z)\n"
            "  --teacher MODEL: knowledge distillation: a model of the same tokens (any format --init-from takes;\n"
            "          a larger one, or the model itself before a change) whose distribution over the next token the\n"
            "          model learns towards: each target's loss is (1 - A) x cross-entropy + A x T^2 x KL(teacher ||\n"
            "          model) at temperature T (--distill-alpha A, default 0.5; --distill-temp T, default 1); the\n"
            "          teacher runs each window before the model's forward on --teacher-engine (default: the\n"
            "          fastest that probes well); loss and val stay the cross-entropy, metrics' distill_kl the KL\n"
            "  --init-from: a llama2.c model, a GGUF file (llama, qwen2, qwen3), a run folder or a Hugging Face\n"
            "          folder (config.json, safetensors) to fine-tune; its own tokenizer is the default -z\n"
            "  -hf USER/NAME[:TAG]: --init-from's model from the Hugging Face Hub, downloaded once into the cache\n"
            "          (nerve pull --help; --hf-file FILE, --hf-token TOKEN)\n"
            "  --lora-rank: with --init-from, train low-rank adapters (LoRA) on the frozen model instead of every\n"
            "          weight: a few percent of the parameters, gradients and optimizer state; --lora-alpha scales\n"
            "          the update by alpha/rank (default 2 x rank); --lora-targets: q,k,v,o,gate,down,up, attn, ffn or\n"
            "          all (default; attn for a mixture of experts, whose FFN takes none); --lora-dropout P (PEFT's\n"
            "          lora_dropout, default 0) drops each adapter's input with probability P while training.\n"
            "          --no-merge: the run folder gets the adapters alone (no merged model: a model's size less on disk,\n"
            "          and no time spent writing it at each stop). --lora-init ADAPTER (an adapter.gguf, or a PEFT\n"
            "          folder) starts the adapters from an earlier run's to train them on (their rank, alpha and\n"
            "          targets are the run's; a preference loss compares with the model they make).\n"
            "          The run folder then also\n"
            "          gets adapter.gguf (llama.cpp's adapter format, for\n"
            "          --lora) and model.* holds the weights merged with it\n"
            "  data parallel: mpirun -np N nerve train ... runs N processes (on this machine or several), each\n"
            "  taking --batch / N of every batch's windows; the same arguments train the same model\n",
            nv_config_preset_names());
}

static int train(int argc, char **argv);

/* --lora-init: the adapters a LoRA run starts from, for the model of config c; their shape is the
   run's (a --lora-rank, --lora-alpha or --lora-targets given must agree). 0, or the exit status. */
static int lora_start(const char *path, const nv_config *c, float alpha_given, const char *targets_given, nv_lora_shape *lora,
                      float **params) {
    nv_lora_shape s;
    if (nv_lora_load(path, c, &s, params) != NV_OK) return cli_error(CMD, 1, "--lora-init: %s", nv_errmsg());
    unsigned targets = s.targets;
    if (targets_given && nv_lora_parse_targets(targets_given, &targets) != NV_OK) return cli_error(CMD, 2, "%s", nv_errmsg());
    const char *differs = lora->rank && lora->rank != s.rank        ? "--lora-rank"
                          : alpha_given > 0 && alpha_given != s.alpha ? "--lora-alpha"
                          : targets != s.targets                     ? "--lora-targets"
                                                                     : NULL;
    if (differs) {
        char t[64];
        return cli_error(CMD, 2, "--lora-init %s holds adapters of rank %d, alpha %g, on %s: %s must agree (or leave it out)", path,
                         s.rank, (double)s.alpha, nv_lora_targets_text(s.targets, t, sizeof t), differs);
    }
    *lora = s;
    return 0;
}

/* Under mpirun every process runs this. A process that failed alone ends the whole job (the others
   would wait for it forever); a failure all reached together lets them all leave cleanly. */
int cmd_train(int argc, char **argv) {
    if (nv_dist_init() != NV_OK) {
        cli_error(CMD, 1, "%s", nv_errmsg());
        nv_dist_finalize();
        return 1;
    }
    if (nv_dist_rank() > 0 && !getenv("NERVE_LOG")) nv_log_set_level(NV_LOG_WARN); /* one console: process 0's */
    const int rc = train(argc, argv);
    if (rc != 0 && nv_dist_size() > 1 && !nv_train_failed_together()) nv_dist_abort(rc);
    nv_dist_finalize();
    return rc;
}

/* Text the run's own tokenizer is trained on at most: the first 256 MiB of the --data files. */
#define OWN_TOKENIZER_CHARS (256ull << 20)

/* No -z, no --init-from and only text to train on (text files, folders, .jsonl files of text lines): the run's own
 * byte-fallback BPE tokenizer of `vocab` tokens, trained on the text (the --data files, then the
 * --val-data ones) into a temporary file (*temp set) that the run copies into its folder as
 * tokenizer.bin; a resumed run takes the one its folder holds. 0 with path set, or the exit code. */
static int own_tokenizer(const nv_train_opts *o, const char *const *paths, int n_paths, int vocab, char *path, size_t cap,
                         int *temp) {
    *temp = 0;
    snprintf(path, cap, "%s/tokenizer.bin", o->out_dir);
    if (o->resume && nv_file_exists(path)) return 0;
    const double t0 = nv_now();
    nv_bpe_result r;
    nv_err e = cli_bpe_train_paths(paths, n_paths, vocab, OWN_TOKENIZER_CHARS, &r);
    if (e != NV_OK)
        return cli_error(CMD, e == NV_ERANGE ? 2 : 1, "training the run's tokenizer on its text (no -z given): %s", nv_errmsg());
    const char *tmp = getenv("TMPDIR");
    snprintf(path, cap, "%s/nerve-tokenizer-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    const int fd = mkstemp(path); /* a name of its own, which the write below replaces */
    if (fd >= 0) close(fd), *temp = 1;
    const nv_iov part = {r.data, r.len};
    e = fd < 0 ? nv_fail(NV_EIO, "%s: %s", path, strerror(errno)) : nv_file_write_atomic(path, &part, 1);
    if (e != NV_OK) {
        nv_bpe_result_free(&r);
        return cli_error(CMD, 1, "cannot write the run's tokenizer: %s", nv_errmsg());
    }
    nv_info("no -z: trained a BPE tokenizer of %d tokens%s on %.1f MB of the text in %.2f s; the run keeps it as "
            "%s/tokenizer.bin",
            r.n_tokens, r.n_tokens < vocab ? " (the text has no more pairs to merge)" : "", (double)r.n_bytes / 1e6,
            nv_now() - t0, o->out_dir);
    nv_bpe_result_free(&r);
    return 0;
}

/* --experts N on a dense --init-from: every expert a copy of its FFN (sparse upcycling); m replaced. */
static nv_err upcycle_init(nv_model *m, int experts, int used, uint64_t seed) {
    nv_model up;
    NV_TRY(nv_model_upcycle(m, experts, used, seed, &up));
    nv_model_free(m);
    *m = up;
    return NV_OK;
}

/* --teacher's model (cli_load_companion: the model's tokens, plans on engine_name); 0, or the exit
   code after saying why. own_trained: the run trains its own tokenizer, which no teacher can share. */
static int load_teacher(const char *path, const char *engine_name, int threads, int vocab_size, const nv_tokenizer *tok,
                        int own_trained, nv_model *out) {
    if (own_trained)
        return cli_error(CMD, 2, "--teacher needs the model's tokenizer to be the teacher's: give it with -z (or --init-from)");
    const int rc = cli_load_companion(CMD, "--teacher", path, engine_name, threads, vocab_size, tok, out);
    if (!rc) nv_info("teacher: %s (%.2fM parameters, engine %s)", path, (double)out->n_params / 1e6, nv_engine_name(nv_model_engine(out)));
    return rc;
}

/* How --init-from's model was made, to make it again (nv_train_opts.reload_init). */
typedef struct {
    const char *path;
    int experts, experts_used;
    uint64_t seed;
} init_source;

static nv_err reload_init(void *ctx, nv_model *out) {
    const init_source *src = ctx;
    NV_TRY(nv_model_load(src->path, out));
    const nv_err e = src->experts ? upcycle_init(out, src->experts, src->experts_used, src->seed) : NV_OK;
    if (e != NV_OK) nv_model_free(out);
    return e;
}

static int train(int argc, char **argv) {
    nv_train_opts o;
    nv_train_defaults(&o);
    const char *preset = NULL, *tok_path = NULL, *init_from = NULL, *engine_name = NULL, *template_name = NULL;
    cli_hub_ref hub = {0}; /* -hf: --init-from's model from the Hub */
    const char *teacher_path = NULL, *teacher_engine = NULL, *distill_given = NULL, *template_file = NULL;
    const char *data[MAX_DATA], *val_data[MAX_DATA];
    nv_jinja *jinja = NULL; /* the chat template run as Jinja (cli_chat_template), and its text */
    char *jinja_text = NULL;
    int run_jinja = -1;
    int n_val = 0, val_frac_given = 0;
    int n_data = 0, threads = 0, dim = 0, layers = 0, heads = 0, kv_heads = 0, hidden = 0, head_dim = 0, context = 0;
    int qk_norm = 0, qkv_bias = 0, separate = 0, warmup_given = 0, pack = 0, decay_given = 0, sample_given = 0;
    const char *pref_given = NULL; /* a preference training flag, for the refusal without preference data */
    const char *choice_path = NULL;
    nv_choice_set choices = {0};
    int gamma_given = 0, experts = 0, experts_used = 0, aux_given = 0;
    float val_frac = 0.05f, lora_alpha = 0, data_weights[MAX_DATA];
    int n_weights = 0; /* --data-weights */
    int steps_given = 0, seq_auto = 0; /* --seq auto: chat data's longest turn */
    float epochs = 0; /* --epochs: the steps from the data's size */
    float time_budget = 0; /* --time-budget: the steps that fit, decided by the run */
    const char *lora_targets = NULL, *lora_init_path = NULL;
    float *lora_init = NULL; /* --lora-init's adapters */
    int vocab = 0; /* --vocab: the size of the tokenizer the run trains when given no -z */
    char own_tok[4200];
    int own_tok_temp = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--resume")) { o.resume = 1; continue; }
        if (!strcmp(a, "--quiet")) { o.quiet = 1; continue; }
        if (!strcmp(a, "--qk-norm")) { qk_norm = 1; continue; }
        if (!strcmp(a, "--qkv-bias")) { qkv_bias = 1; continue; }
        if (!strcmp(a, "--separate-classifier")) { separate = 1; continue; }
        if (!strcmp(a, "--decay-embeddings")) { o.adamw.decay_embeddings = 1; continue; }
        if (!strcmp(a, "--pack")) { pack = 1; continue; }
        if (cli_jinja_flag(a, &run_jinja)) continue;
        if (!strcmp(a, "--recompute")) { o.recompute = 1; continue; }
        if (!strcmp(a, "--no-merge")) { o.lora_no_merge = 1; continue; }
        if (!strcmp(a, "--save-best")) { o.save_best = 1; continue; }
        if (!strcmp(a, "--full-eval")) { o.full_eval = 1; continue; }
        if (!strcmp(a, "--data") || !strcmp(a, "--val-data")) {
            const int val = a[2] == 'v';
            if (i + 1 >= argc || argv[i + 1][0] == '-') return cli_error(CMD, 2, "%s needs at least one path", a);
            while (i + 1 < argc && argv[i + 1][0] != '-') {
                if (n_data + n_val == MAX_DATA) return cli_error(CMD, 2, "at most %d data files", MAX_DATA);
                if (val) val_data[n_val++] = argv[++i];
                else data[n_data++] = argv[++i];
            }
            continue;
        }
        const int hf = cli_hub_flag(CMD, argc, argv, &i, &hub);
        if (hf < 0) return 2;
        if (hf) continue;
        if (!(v = cli_value(CMD, argc, argv, &i))) return 2;
        int ok = 1;
        if (!strcmp(a, "--preset")) preset = v;
        else if (!strcmp(a, "-z")) tok_path = v;
        else if (!strcmp(a, "--vocab")) ok = cli_int(CMD, a, v, NV_BPE_RESERVED + 1, NV_BPE_MAX_VOCAB, &vocab);
        else if (!strcmp(a, "--init-from")) init_from = v;
        else if (!strcmp(a, "--teacher")) teacher_path = v;
        else if (!strcmp(a, "--teacher-engine")) teacher_engine = v;
        else if (!strcmp(a, "--distill-alpha")) ok = cli_float(CMD, a, v, 0, 1, &o.distill_alpha), distill_given = a;
        else if (!strcmp(a, "--distill-temp")) ok = cli_float(CMD, a, v, 0.01f, 100, &o.distill_temp), distill_given = a;
        else if (!strcmp(a, "--engine")) engine_name = v;
        else if (!strcmp(a, "--chat-template")) template_name = v;
        else if (!strcmp(a, "--chat-template-file")) template_file = v;
        else if (!strcmp(a, "--out")) o.out_dir = v;
        else if (!strcmp(a, "--lora-rank")) ok = cli_int(CMD, a, v, 1, 1024, &o.lora.rank);
        else if (!strcmp(a, "--lora-alpha")) ok = cli_float(CMD, a, v, 1e-6f, 1e6f, &lora_alpha);
        else if (!strcmp(a, "--lora-targets")) lora_targets = v;
        else if (!strcmp(a, "--lora-init")) lora_init_path = v;
        else if (!strcmp(a, "--save-every") && !strcmp(v, "epoch")) o.save_every = NV_TRAIN_SAVE_EPOCH;
        else if (!strcmp(a, "--save-every")) ok = cli_int(CMD, a, v, 1, 1 << 30, &o.save_every);
        else if (!strcmp(a, "--save-limit")) ok = cli_int(CMD, a, v, 1, 1 << 20, &o.save_limit);
        else if (!strcmp(a, "--lora-dropout")) ok = cli_float(CMD, a, v, 0, 0.95, &o.lora_dropout);
        else if (!strcmp(a, "--dim")) ok = cli_int(CMD, a, v, 1, 1 << 16, &dim);
        else if (!strcmp(a, "--layers")) ok = cli_int(CMD, a, v, 1, 1024, &layers);
        else if (!strcmp(a, "--heads")) ok = cli_int(CMD, a, v, 1, 4096, &heads);
        else if (!strcmp(a, "--kv-heads")) ok = cli_int(CMD, a, v, 1, 4096, &kv_heads);
        else if (!strcmp(a, "--hidden")) ok = cli_int(CMD, a, v, 1, 1 << 20, &hidden);
        else if (!strcmp(a, "--head-dim")) ok = cli_int(CMD, a, v, 2, 4096, &head_dim);
        else if (!strcmp(a, "--context")) ok = cli_int(CMD, a, v, 1, 1 << 22, &context);
        else if (!strcmp(a, "--experts")) ok = cli_int(CMD, a, v, 1, NV_MOE_MAX_EXPERTS, &experts);
        else if (!strcmp(a, "--experts-used")) ok = cli_int(CMD, a, v, 1, NV_MOE_MAX_EXPERTS, &experts_used);
        else if (!strcmp(a, "--router-aux-coef")) ok = cli_float(CMD, a, v, 0, 100, &o.router_aux_coef), aux_given = 1;
        else if (!strcmp(a, "--router-z-coef")) ok = cli_float(CMD, a, v, 0, 100, &o.router_z_coef), aux_given = 1;
        else if (!strcmp(a, "--steps")) ok = cli_int(CMD, a, v, 1, 1 << 30, &o.steps), steps_given = 1;
        else if (!strcmp(a, "--epochs")) ok = cli_float(CMD, a, v, 1e-6, 1e6, &epochs);
        else if (!strcmp(a, "--time-budget")) ok = cli_float(CMD, a, v, 0.1f, 1e8f, &time_budget);
        else if (!strcmp(a, "--batch")) ok = cli_int(CMD, a, v, 1, 1 << 16, &o.batch);
        else if (!strcmp(a, "--seq") && !strcmp(v, "auto")) seq_auto = 1;
        else if (!strcmp(a, "--seq")) ok = cli_int(CMD, a, v, 1, 1 << 20, &o.seq), seq_auto = 0;
        else if (!strcmp(a, "--accum")) ok = cli_int(CMD, a, v, 1, 1 << 16, &o.accum);
        else if (!strcmp(a, "--warmup")) ok = cli_int(CMD, a, v, 0, 1 << 30, &o.adamw.warmup_steps), warmup_given = 1;
        else if (!strcmp(a, "--eval-every")) ok = cli_int(CMD, a, v, 0, 1 << 30, &o.eval_every);
        else if (!strcmp(a, "--early-stop")) ok = cli_int(CMD, a, v, 1, 1 << 30, &o.early_stop);
        else if (!strcmp(a, "--best-metric")) {
            const int m = nv_best_metric_parse(v);
            if (m < 0) return cli_error(CMD, 2, "--best-metric %s: want val_loss, val_reward_acc, val_choice_acc, mc_acc, mc_acc_norm or val_token_acc", v);
            o.best_metric = (nv_best_metric)m;
        }
        else if (!strcmp(a, "--data-weights")) { /* W1,W2,...: one a --data file */
            n_weights = 0;
            for (const char *p = v; ok && *p;) {
                char *end;
                const float w = strtof(p, &end);
                if (end == p || (*end && *end != ',') || n_weights == MAX_DATA || !(w >= 0.0f) || !isfinite(w))
                    return cli_error(CMD, 2, "--data-weights '%s': want numbers >= 0 separated by commas, one a --data file", v);
                data_weights[n_weights++] = w;
                p = *end ? end + 1 : end;
            }
        }
        else if (!strcmp(a, "--sample-every")) ok = cli_int(CMD, a, v, 0, 1 << 30, &o.sample_every);
        else if (!strcmp(a, "--sample-tokens")) ok = cli_int(CMD, a, v, 1, 1 << 20, &o.sample_tokens), sample_given = 1;
        else if (!strcmp(a, "--sample-prompt")) o.sample_prompt = v, sample_given = 1;
        else if (!strcmp(a, "--eval-batches")) ok = cli_int(CMD, a, v, 1, 1 << 20, &o.eval_batches);
        else if (!strcmp(a, "--ckpt-every")) ok = cli_int(CMD, a, v, 0, 1 << 30, &o.ckpt_every);
        else if (!strcmp(a, "--threads")) ok = cli_int(CMD, a, v, 1, 1024, &threads);
        else if (!strcmp(a, "--seed")) ok = cli_u64(CMD, a, v, &o.seed);
        else if (!strcmp(a, "--lr")) ok = cli_float(CMD, a, v, 0, 10, &o.adamw.lr);
        else if (!strcmp(a, "--min-lr-frac")) ok = cli_float(CMD, a, v, 0, 1, &o.adamw.min_lr_frac);
        else if (!strcmp(a, "--lr-schedule")) {
            if (nv_lr_schedule_parse(v, &o.adamw.schedule) != NV_OK) return cli_error(CMD, 2, "%s", nv_errmsg());
        } else if (!strcmp(a, "--decay-frac")) ok = cli_float(CMD, a, v, 0, 1, &o.adamw.decay_frac), decay_given = 1;
        else if (!strcmp(a, "--weight-decay")) ok = cli_float(CMD, a, v, 0, 10, &o.adamw.weight_decay);
        else if (!strcmp(a, "--dropout")) ok = cli_float(CMD, a, v, 0, 0.95, &o.dropout);
        else if (!strcmp(a, "--clip")) ok = cli_float(CMD, a, v, 0, 1e6, &o.adamw.grad_clip);
        else if (!strcmp(a, "--beta2")) ok = cli_float(CMD, a, v, 0, 0.999999, &o.adamw.beta2);
        else if (!strcmp(a, "--eval-choice")) choice_path = v;
        else if (!strcmp(a, "--eval-choice-tasks")) ok = cli_int(CMD, a, v, 1, 1 << 30, &o.eval_choice_tasks);
        else if (!strcmp(a, "--pref-beta")) ok = cli_float(CMD, a, v, 1e-4f, 100, &o.pref.beta), pref_given = a;
        else if (!strcmp(a, "--pref-sft-weight")) ok = cli_float(CMD, a, v, 0, 100, &o.pref.sft_weight), pref_given = a;
        else if (!strcmp(a, "--simpo-gamma")) ok = cli_float(CMD, a, v, -100, 100, &o.pref.gamma), pref_given = a, gamma_given = 1;
        else if (!strcmp(a, "--pref-loss")) {
            if (nv_pref_kind_parse(v, &o.pref.kind) != NV_OK) return cli_error(CMD, 2, "%s", nv_errmsg());
            pref_given = a;
        }
        else if (!strcmp(a, "--val-frac")) ok = cli_float(CMD, a, v, 0, 0.9, &val_frac), val_frac_given = 1;
        else if (!strcmp(a, "--time-limit")) {
            float t;
            ok = cli_float(CMD, a, v, 0, 1e9, &t);
            o.time_limit_s = t;
        } else return cli_error(CMD, 2, "unknown option '%s' (see nerve train --help)", a);
        if (!ok) return 2;
    }

    const int lora_on = o.lora.rank || lora_init_path; /* (--lora-init's file gives the shape) */
    if ((lora_alpha > 0 || lora_targets || o.lora_dropout > 0 || o.lora_no_merge) && !lora_on)
        return cli_error(CMD, 2, "%s goes with --lora-rank (or --lora-init)",
                         lora_targets ? "--lora-targets" : lora_alpha > 0 ? "--lora-alpha" : o.lora_no_merge ? "--no-merge" : "--lora-dropout");
    if (o.save_limit && !o.save_every) return cli_error(CMD, 2, "--save-limit goes with --save-every");
    if (lora_on && !init_from && !hub.repo)
        return cli_error(CMD, 2, "%s adapts a trained model: give it with --init-from (or -hf)", lora_init_path ? "--lora-init" : "--lora-rank");
    if (o.lora.rank) {
        o.lora.alpha = lora_alpha > 0 ? lora_alpha : 2.0f * (float)o.lora.rank;
        o.lora.targets = NV_LORA_ALL;
        if (lora_targets && nv_lora_parse_targets(lora_targets, &o.lora.targets) != NV_OK)
            return cli_error(CMD, 2, "%s", nv_errmsg());
    }

    if (cli_experts(CMD, experts, &experts_used)) return 2;
    if (experts && lora_on)
        return cli_error(CMD, 2, "--experts upcycles the model to train it whole: drop %s", lora_init_path ? "--lora-init" : "--lora-rank");
    if ((steps_given != 0) + (epochs > 0) + (time_budget > 0) > 1)
        return cli_error(CMD, 2, "--steps, --epochs and --time-budget exclude each other (give the run's length once)");
    if (time_budget > 0) { /* a bound the run's decision replaces */
        o.time_budget_s = time_budget;
        o.steps = NV_TRAIN_BUDGET_STEPS;
        o.warmup_auto = !warmup_given;
    }
    if (decay_given && o.adamw.schedule != NV_LR_WSD) return cli_error(CMD, 2, "--decay-frac goes with --lr-schedule wsd");
    if (sample_given && !o.sample_every) return cli_error(CMD, 2, "--sample-tokens and --sample-prompt go with --sample-every N");
    if (o.sample_every && lora_on)
        return cli_error(CMD, 2, "--sample-every samples whole-model runs (a LoRA run's adapters are not in its plans)");
    if (choice_path && lora_on)
        return cli_error(CMD, 2, "--eval-choice scores whole-model runs (a LoRA run's adapters are not in its plans): score "
                                 "the run's merged model afterwards with nerve perplexity --multiple-choice");
    if (o.eval_choice_tasks && !choice_path) return cli_error(CMD, 2, "--eval-choice-tasks goes with --eval-choice FILE");
    if (choice_path && o.eval_every <= 0) return cli_error(CMD, 2, "--eval-choice scores at every evaluation: --eval-every must be positive");
    if (vocab && (tok_path || init_from || hub.repo))
        return cli_error(CMD, 2, "--vocab sizes the tokenizer a run trains on its text when it is given no -z and no --init-from");
    /* text and no tokenizer: the run trains its own on the --data files, then the --val-data ones (own_tokenizer) */
    const char *text_paths[2 * MAX_DATA];
    int own = !tok_path && !init_from && !hub.repo && n_data > 0;
    for (int i = 0; i < n_data + n_val && own; i++) {
        const char *p = text_paths[i] = i < n_data ? data[i] : val_data[i - n_data];
        own = nv_file_is_dir(p) || nv_data_named_text(p) || nv_data_jsonl_is_text(p);
    }
    if (vocab && !own)
        return cli_error(CMD, 2, "--vocab sizes the tokenizer a run trains on its text: the data here is not only text (text "
                                 "files, folders, .jsonl files of {\"text\"} lines)");
    char hub_path[4400]; /* the model to start from, from the Hub, once the flags are known good */
    const int hub_rc = cli_hub_fetch(CMD, &hub, &init_from, hub_path, sizeof hub_path);
    if (hub_rc) return hub_rc;
    cli_paths init_paths; /* a folder (a run's, or Hugging Face's) names its model file and tokenizer */
    init_source init_src;
    if (init_from) {
        const char *own_tok = tok_path;
        cli_model_paths(&init_from, &own_tok, &init_paths);
        if (!tok_path && init_paths.own_tok) tok_path = own_tok;
    }
    char default_data[4096], default_tok[4096];
    if (n_data == 0) {
        nv_data_path("corpus/tinystories_train_first1000.txt", default_data, sizeof default_data);
        data[n_data++] = default_data;
        if (!tok_path) {
            nv_data_path("models/tok512.bin", default_tok, sizeof default_tok);
            tok_path = default_tok;
        }
    }
    if (!threads) threads = nv_dist_threads(); /* processes sharing CPUs divide them */
    int erc = cli_engine(CMD, engine_name, threads, CLI_ENGINE_FLOAT, &o.engine);
    if (erc) return erc;

    nv_tokenizer *tok = NULL;
    nv_model init = {0}, teacher = {0};
    nv_dataset ds = {0};
    int rc = 1;
    if (tok_path && nv_tokenizer_load(tok_path, 0, &tok) != NV_OK) {
        cli_error(CMD, 1, "%s", nv_errmsg());
        goto done;
    }
    if (o.sample_every && !tok) {
        rc = cli_error(CMD, 2, "--sample-every needs the tokenizer to write the samples with: give -z");
        goto done;
    }
    o.tokenizer = tok;
    nv_config *c = &o.config;
    if ((qk_norm || qkv_bias) && !dim) { /* a preset or a model file says its own shape */
        rc = cli_error(CMD, 2, "%s goes with --dim (a preset or --init-from gives the whole shape)", qk_norm ? "--qk-norm" : "--qkv-bias");
        goto done;
    }
    if (init_from) {
        if (preset || dim) {
            rc = cli_error(CMD, 2, "--init-from takes the model's shape from the file: drop --preset/--dim");
            goto done;
        }
        if (nv_model_load(init_from, &init) != NV_OK) {
            cli_error(CMD, 1, "%s", nv_errmsg());
            goto done;
        }
        if (experts) { /* sparse upcycling: every expert a copy of the dense FFN */
            if (upcycle_init(&init, experts, experts_used, o.seed) != NV_OK) {
                rc = cli_error(CMD, init.config.n_experts ? 2 : 1, "--experts: %s: %s", init_from, nv_errmsg());
                goto done;
            }
            nv_info("%s upcycled: %d experts of its FFN, %d a token (%.2fM parameters)", init_from, experts, experts_used,
                    (double)init.n_params / 1e6);
        }
        *c = init.config;
        o.init_params = init.params;
        init_src = (init_source){init_from, experts, experts_used, o.seed};
        o.init_file_backed = init.mapped.data && !init.params_owned; /* (a llama2.c v1 file, used in place) */
        o.reload_init = reload_init, o.reload_ctx = &init_src; /* LoRA gives its frozen matrices' pages back */
    } else if (dim) {
        if (!layers || !heads) {
            rc = cli_error(CMD, 2, "--dim needs --layers and --heads");
            goto done;
        }
        memset(c, 0, sizeof *c);
        c->dim = dim;
        c->n_layers = layers;
        c->n_heads = heads;
        c->n_kv_heads = kv_heads ? kv_heads : heads;
        c->head_dim = head_dim ? head_dim : (dim % heads == 0 ? dim / heads : 0);
        c->hidden_dim = hidden ? hidden : ((2 * 4 * dim / 3 + 31) / 32) * 32; /* llama's 8/3 d, rounded to 32 */
        c->vocab_size = 32000;
        c->seq_len = 256;
        c->rope_theta = 10000.0f;
        c->norm_eps = 1e-5f;
        c->shared_classifier = !separate;
        c->qk_norm = qk_norm;
        c->qkv_bias = qkv_bias;
        if (qk_norm && qkv_bias) { /* no GGUF architecture holds both */
            rc = cli_error(CMD, 2, "--qk-norm and --qkv-bias exclude each other (Qwen3 has the one, Qwen2 the other)");
            goto done;
        }
    } else if (nv_config_preset(preset ? preset : "stories260K", c) != NV_OK) {
        rc = cli_error(CMD, 2, "%s", nv_errmsg());
        goto done;
    }
    if (experts && !init_from) /* a mixture of experts of the shape's FFN */
        c->n_experts = experts, c->n_experts_used = experts_used;
    if (aux_given && !c->n_experts) {
        rc = cli_error(CMD, 2, "--router-aux-coef and --router-z-coef weigh a mixture of experts' router losses: the model has no experts");
        goto done;
    }
    if (lora_init_path && (rc = lora_start(lora_init_path, c, lora_alpha, lora_targets, &o.lora, &lora_init)) != 0) goto done;
    rc = 1;
    o.lora_init = lora_init;
    if (c->n_experts && o.lora.rank) { /* adapters on a mixture: its attention's (its router stays as it is) */
        if (aux_given) {
            rc = cli_error(CMD, 2, "--router-aux-coef and --router-z-coef train the router: LoRA adapters leave it frozen");
            goto done;
        }
        if (!lora_targets && !lora_init) o.lora.targets = NV_LORA_ATTN; /* (--lora-init's are the file's) */
    }
    if (!init_from) {
        if (own) {
            if ((rc = own_tokenizer(&o, text_paths, n_data + n_val, vocab ? vocab : c->vocab_size, own_tok, sizeof own_tok,
                                    &own_tok_temp)))
                goto done;
            rc = 1;
            tok_path = own_tok;
            if (nv_tokenizer_load(tok_path, 0, &tok) != NV_OK) {
                cli_error(CMD, 1, "%s", nv_errmsg());
                goto done;
            }
        }
        if (tok) c->vocab_size = nv_tokenizer_vocab_size(tok);
        if (context) c->seq_len = context;
        if (c->seq_len < o.seq) c->seq_len = o.seq;
        if (nv_config_validate(c) != NV_OK) {
            rc = cli_error(CMD, 2, "%s", nv_errmsg());
            goto done;
        }
    } else if (tok && nv_tokenizer_vocab_size(tok) != c->vocab_size) {
        cli_error(CMD, 1, "%s has %d tokens but %s has a vocabulary of %d: pass its tokenizer with -z", tok_path,
                  nv_tokenizer_vocab_size(tok), init_from, c->vocab_size);
        goto done;
    }
    if (seq_auto && o.seq > c->seq_len) o.seq = c->seq_len;
    if (o.seq > c->seq_len) {
        rc = cli_error(CMD, 2, "--seq %d exceeds the model's context of %d", o.seq, c->seq_len);
        goto done;
    }
    nv_chat_template tmpl = NV_CHAT_CHATML;
    if ((rc = cli_template_flags(CMD, template_name, template_file, &tmpl)) != 0) goto done;
    rc = 1;
    if (n_val && val_frac_given) {
        rc = cli_error(CMD, 2, "--val-data and --val-frac exclude each other (with --val-data the --data files train whole)");
        goto done;
    }
    /* --val-data's files follow --data's in one dataset, validation whole */
    for (int i = 0; i < n_val; i++) data[n_data + i] = val_data[i];
    int chat_files = 0; /* refused before the data is read */
    for (int i = 0; i < n_data + n_val; i++) chat_files += nv_data_jsonl_is_turns(data[i]);
    if ((template_name || template_file || run_jinja >= 0 || pack) && !chat_files) {
        rc = cli_error(CMD, 2, "%s goes with chat data (a .jsonl file in --data)",
                       pack ? "--pack" : template_name ? "--chat-template" : template_file ? "--chat-template-file" : run_jinja ? "--jinja" : "--no-jinja");
        goto done;
    }
    /* fine-tuning a chat model: the template it declares (a GGUF file's, a folder's, or a chat run's), nerve's
       renderer of it when its markers say which, else run as Jinja, as serve renders it */
    int declared = 0;
    if (run_jinja > 0 && !init_from && !template_file && !template_name) {
        rc = cli_error(CMD, 2, "--jinja needs a template to run: --chat-template-file F, --chat-template NAME or an --init-from model's own");
        goto done;
    }
    if (chat_files && (init_from || template_file || (template_name && run_jinja > 0))) {
        if ((rc = cli_chat_template(CMD, init_from ? init_from : "", template_name, template_file, run_jinja, &tmpl, &jinja, &jinja_text)) != 0)
            goto done;
        rc = 1;
        declared = init_from && !template_name && !template_file && jinja_text;
    }
    if (nv_dataset_open_jinja(&ds, data, n_data + n_val, tok, c->vocab_size, n_val ? 0.0f : val_frac, tmpl, jinja) != NV_OK) {
        cli_error(CMD, 1, "%s", nv_errmsg());
        goto done;
    }
    if (n_val) nv_dataset_split_at(&ds, n_data);
    if (n_weights && n_weights != n_data) {
        rc = cli_error(CMD, 2, "--data-weights gives %d weight%s for %d --data files", n_weights, n_weights == 1 ? "" : "s", n_data);
        goto done;
    }
    if (n_weights && nv_dataset_set_weights(&ds, data_weights, n_weights) != NV_OK) {
        rc = cli_error(CMD, 2, "--data-weights: %s", nv_errmsg());
        goto done;
    }
    if (pref_given && !ds.pref) {
        rc = cli_error(CMD, 2, "%s goes with preference data (.jsonl lines with preferred_output and non_preferred_output, "
                               "or prompt, chosen and rejected)", pref_given);
        goto done;
    }
    if (gamma_given && o.pref.kind != NV_PREF_SIMPO) {
        rc = cli_error(CMD, 2, "--simpo-gamma goes with --pref-loss simpo");
        goto done;
    }
    if (ds.pref && pack) {
        rc = cli_error(CMD, 2, "--pack does not go with preference data: each answer of a pair is a window of its own");
        goto done;
    }
    if (ds.pref && !init_from) {
        rc = cli_error(CMD, 2, "preference training improves an existing model: give it with --init-from");
        goto done;
    }
    if (ds.pref && o.batch % (2 * nv_dist_size())) {
        rc = cli_error(CMD, 2, "--batch %d: preference pairs are two windows each, so --batch must be a multiple of %d",
                       o.batch, 2 * nv_dist_size());
        goto done;
    }
    if (ds.chat) {
        ds.pack = pack;
        o.chat_template = !ds.templated ? NULL : jinja ? "jinja" : nv_chat_template_name(tmpl); /* prompt/completion text: none */
        o.chat_template_jinja = jinja ? jinja_text : NULL; /* (the text of a template nerve renders itself: not kept) */
        uint64_t turns = 0, val_turns = 0, cut = 0, trainable = 0, longest = 0;
        if (seq_auto) { /* the longest turn whole (a multiple of 16, for the kernels' tiles), within the context */
            for (int i = 0; i < ds.n_src; i++)
                for (uint64_t t = 0; t < ds.src[i].n_starts; t++)
                    if (ds.src[i].starts[t + 1] - ds.src[i].starts[t] > longest) longest = ds.src[i].starts[t + 1] - ds.src[i].starts[t];
            const uint64_t want = (longest > 1 ? longest - 1 + 15 : 16) / 16 * 16;
            o.seq = want < (uint64_t)c->seq_len ? (int)want : c->seq_len;
            if (nv_dist_rank() == 0) fprintf(stderr, "nerve: --seq auto: %d (the longest turn is %llu tokens)\n", o.seq, (unsigned long long)longest);
            longest = 0;
        }
        for (int i = 0; i < ds.n_src; i++)
            for (uint64_t t = 0; t < ds.src[i].n_starts; t++) {
                const nv_source *s = &ds.src[i];
                const uint64_t from = s->starts[t], end = s->starts[t + 1];
                turns++;
                val_turns += t >= s->n_train_starts;
                cut += end - from > (uint64_t)o.seq + 1;
                if (end - from > longest) longest = end - from;
                /* an answer token within the window's targets (positions 1..seq) */
                int any = 0;
                for (uint64_t j = from + 1; j < end && j <= from + (uint64_t)o.seq && !any; j++) any = s->trained[j];
                trainable += any && t < s->n_train_starts;
            }
        if (!trainable) {
            cli_error(CMD, 1, "no training conversation has an answer within --seq %d + 1 tokens (their prompts are "
                              "longer, the longest turn is %llu tokens): raise --seq",
                      o.seq, (unsigned long long)longest);
            goto done;
        }
        if (nv_dist_rank() == 0) {
            char how[128];
            if (o.chat_template)
                snprintf(how, sizeof how, "rendered with the %s template%s", o.chat_template, declared ? " (the starting model's)" : "");
            else snprintf(how, sizeof how, "prompt and completion joined as they are (no chat template)");
            fprintf(stderr, "nerve: %s: %llu %s to train on (%llu of them held out), %s; the longest is %llu tokens with its "
                            "prompt%s\n",
                    ds.pref ? "preference data" : "chat data", (unsigned long long)(ds.pref ? turns / 2 : turns),
                    ds.pref ? "pairs" : "answers", (unsigned long long)(ds.pref ? val_turns / 2 : val_turns), how,
                    (unsigned long long)longest, pack ? "; windows packed" : "");
            if (cut)
                nv_warn("%llu of the %llu turns are longer than --seq %d + 1 tokens: their ends are cut (raise --seq to keep them)",
                        (unsigned long long)cut, (unsigned long long)turns, o.seq);
        }
    }
    if (nv_dist_rank() == 0)
        fprintf(stderr, "nerve: data: %llu training tokens, %llu validation tokens; unigram baseline loss %.3f\n",
            (unsigned long long)ds.train_tokens, (unsigned long long)ds.val_tokens,
            nv_dataset_unigram_loss(&ds, c->vocab_size));
    for (int i = 0; n_weights && i < n_data && nv_dist_rank() == 0; i++) /* the mixture, as it will be drawn */
        fprintf(stderr, "nerve: data: %s: %.1f%% of the training windows (%llu tokens, %.1f%% of the training tokens)\n",
                ds.src[i].path, 100 * ds.weights[i], (unsigned long long)ds.src[i].n_train,
                ds.train_tokens ? 100.0 * (double)ds.src[i].n_train / (double)ds.train_tokens : 0.0);
    if (epochs > 0) { /* the steps that draw that many passes over the training data */
        const double per_step = (double)o.batch * o.accum, windows = nv_data_epoch_windows(&ds, o.seq);
        const double steps = ceil(epochs * windows / per_step);
        if (!(steps >= 1) || steps > (double)(1 << 30)) {
            rc = cli_error(CMD, 2, "--epochs %g: %.0f steps of %d x %d windows (the data holds %.1f windows of %d tokens)",
                           (double)epochs, steps, o.batch, o.accum, windows, o.seq + 1);
            goto done;
        }
        o.steps = (int)steps;
        if (nv_dist_rank() == 0)
            fprintf(stderr, "nerve: %g epochs: %d steps of %d windows (%.1f windows a pass)\n", (double)epochs, o.steps,
                    o.batch * o.accum, windows);
    }
    /* a short run still warms up and decays: the default warmup is at most a tenth of the run */
    if (!warmup_given && o.adamw.warmup_steps > o.steps / 10) o.adamw.warmup_steps = o.steps / 10;
    o.tokenizer_path = tok_path;
    if (choice_path) {
        if (!tok) {
            rc = cli_error(CMD, 2, "--eval-choice needs the tokenizer (-z)");
            goto done;
        }
        if (nv_choice_load(choice_path, &choices) != NV_OK) {
            cli_error(CMD, 1, "%s", nv_errmsg());
            goto done;
        }
        o.eval_choice = &choices;
    }
    if (distill_given && !teacher_path) {
        rc = cli_error(CMD, 2, "%s goes with --teacher MODEL", distill_given);
        goto done;
    }
    if (teacher_path && (rc = load_teacher(teacher_path, teacher_engine, threads, c->vocab_size, tok, own_tok_temp, &teacher)) != 0)
        goto done;
    if (teacher_path) o.teacher = &teacher;
    rc = 1;
    if (nv_train_run(&o, &ds) != NV_OK) {
        if (nv_dist_rank() == 0 || !nv_train_failed_together()) cli_error(CMD, 1, "%s", nv_errmsg());
        goto done;
    }
    rc = 0;
done:
    if (own_tok_temp) unlink(own_tok);
    nv_choice_free(&choices);
    nv_dataset_close(&ds);
    nv_model_free(&init);
    nv_model_free(&teacher);
    free(lora_init);
    nv_jinja_free(jinja);
    free(jinja_text);
    if (tok) nv_tokenizer_free(tok);
    return rc;
}
