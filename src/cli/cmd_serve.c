/* nerve serve: an OpenAI-compatible HTTP server with continuous batching over a paged KV cache
 * with a prefix cache (RAM tier in the pool, SSD tier on disk). Loads the model and tokenizer, starts the scheduler loop (serve/sched.h) and the HTTP front
 * (serve/http.h), then waits for SIGINT/SIGTERM/SIGHUP: on the first it stops accepting, ends queued
 * requests (503), lets running ones finish for up to GRACE_S seconds, cancels the rest and exits
 * 0; a second signal cancels at once. cli_serve_run with a job (`nerve batch`) runs the job beside
 * the server instead of waiting, passing the signals on to it, and stops the server when it ends. */
#include <ctype.h>

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/file.h"
#include "base/log.h"
#include "base/timer.h"
#include "cli/cli.h"
#include "cli/hub.h"
#include "engine/engine.h"
#include "model/gguf.h"
#include "model/hf.h"
#include "model/tokenizer.h"
#include "serve/api.h"
#include "serve/batchrun.h"
#include "serve/chat.h"
#include "serve/http.h"
#include "serve/sched.h"

static const char *CMD = "serve"; /* or the job's command (cli_serve_run) */
#define GRACE_S 5.0

/* Reranking's prompts and tokens: --rerank-template's prompt, else a GGUF's own rerank template
 * (llama.cpp's), else the chat template. 0, or 1 with the error said. */
static int rerank_setup(const char *model_path, const nv_tokenizer *tok, int head_rows, const char *tokens, const char *file,
                        const char *instruction, nv_rerank *out) {
    char *text = NULL;
    if (file && nv_file_read_all(file, &text, NULL) != NV_OK) return cli_error(CMD, 1, "--rerank-template: %s", nv_errmsg());
    if (!file && (text = cli_gguf_named_template(model_path, "rerank")) && (!strstr(text, "{query}") || !strstr(text, "{document}"))) {
        nv_warn("%s: its rerank template holds no {query} and {document}: ignored (the chat template makes rerank prompts)", model_path);
        free(text), text = NULL;
    }
    if (instruction && text && !strstr(text, "{instruction}"))
        nv_warn("--rerank-instruction: the rerank template has no {instruction}: the instruction is not used");
    const nv_err e = nv_rerank_init(out, tok, head_rows, tokens, text, instruction);
    free(text);
    if (e == NV_OK) return 0;
    return cli_error(CMD, 1, "%s%s", file && !strstr(nv_errmsg(), "--rerank") ? "--rerank-template: " : "", nv_errmsg());
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: nerve serve -m MODEL [-z TOKENIZER] [--port 8000] [--host 127.0.0.1] [--alias NAME]\n"
            "                   [--engine E] [--threads N] [--api-key KEY | --api-key-file F] [--cors] [--ssl-key-file F --ssl-cert-file F]\n"
            "                   [--chat-template plain|chatml|llama2|llama3|deepseek|phi3|gemma|granite|mistral|phi4-mini|phi4|olmo2|smollm3 |\n"
            "                    --chat-template-file F] [--jinja] [--reasoning-format auto|none|deepseek]\n"
            "                   [--reasoning-budget N] [--reasoning-budget-message TEXT] [--reasoning-effort LEVEL] [--scheduling-policy fcfs|priority] [--no-preemption]\n"
            "                   [--kv-overcommit] [--pooling mean|cls|last] [--matryoshka] [--trust-request-chat-template]\n"
            "                   [--rerank-tokens YES[,NO]] [--rerank-template F] [--rerank-instruction TEXT]\n"
            "                   [--ctx-size N] [--max-batch N] [--prefill-chunk N] [--spec-tokens N] [--spec-lookup-min N] [--spec-lookup-max N]\n"
            "                   [--prediction-tokens N]\n"
            "                   [--max-queue N] [--kv-memory SIZE] [--kv-block N] [--timeout S] [--max-body SIZE] [--responses-store SIZE]\n"
            "                   [--kv-ram-cache SIZE] [--kv-disk-cache SIZE] [--kv-cache-dir DIR] [--no-prefix-cache]\n"
            "                   [--kv-cache-dtype f16|f32|q8] [--swa-cache auto|full|window] [--no-tune] [--lora ADAPTER] [--lora-scaled ADAPTER SCALE]\n"
            "                   [--lora-modules NAME=ADAPTER...] [--max-lora-rank R] [--allow-lora-updates]\n"
            "                   [--files-dir DIR [--files-max-bytes SIZE] [--batch-parallel N] [--fine-tune-nice N] [--no-fine-tune-yield]]\n"
            CLI_HUB_USAGE
            "  -m MODEL             llama2.c checkpoint (v0 or v1), a GGUF file (llama; F32/F16/BF16/Q4-Q8/K-quants),\n"
            "                       a `nerve train` run folder (its model.bin or model.gguf), or a Hugging Face\n"
            "                       folder (config.json, safetensors; its tokenizer.json the default -z)\n"
            "  --lora ADAPTER, --lora-scaled ADAPTER SCALE\n"
            "                       a LoRA adapter (GGUF: nerve train --lora-rank's adapter.gguf, or llama.cpp's; or a\n"
            "                       PEFT adapter folder) merged into the weights at load, scaled (default 1); up to 8, in order\n"
            "  --lora-modules NAME=ADAPTER...\n"
            "                       LoRA adapters a request picks by naming NAME as its 'model' (vLLM's flag): kept\n"
            "                       unmerged, so requests of several adapters and of the base model share each step;\n"
            "                       listed by /v1/models and /lora-adapters (repeat the flag or list several; up to 64);\n"
            "                       a request's \"lora\": [{\"id\", \"scale\"}] (llama.cpp's) mixes up to 8 at its own factors\n"
            "  --max-lora-rank R    the largest adapter rank served (default 64; sizes the step's scratch)\n"
            "  --allow-lora-updates POST /v1/load_lora_adapter {\"lora_name\", \"lora_path\"} and /v1/unload_lora_adapter\n"
            "                       {\"lora_name\"} load and remove adapters while serving (vLLM's endpoints; off by\n"
            "                       default: a client then names files the server reads)\n"
            "  -z TOKENIZER         llama2.c tokenizer.bin, a GGUF file's vocabulary or a tokenizer.json (default: the run\n"
            "                       folder's tokenizer.bin, the GGUF model's own vocabulary, the Hugging Face folder's tokenizer.json, else\n"
            "                       tokenizers/tokenizer.bin in the shared data)\n"
            "  --port P             TCP port (default 8000; 0 = any free port, printed at start)\n"
            "  --host H             address to bind (default 127.0.0.1: this machine only)\n"
            "  --alias NAME         model id in the API (default: the model's file name without extension; vLLM's\n"
            "                       --served-model-name too)\n"
            "  --engine E           scalar, avx2, avx512, avx512-bf16, amx-bf16, avx2-int8, avx512-int8, amx-int8 (default: the fastest that probes well)\n"
            "  --threads N, -t N    threads for the engines (default: one per core)\n"
            "  --no-tune            ignore what `nerve tune` measured for this machine and model (the engine and\n"
            "                       the prefill chunk; used by default when neither --engine nor --prefill-chunk says)\n"
            "  --api-key KEY        require 'Authorization: Bearer KEY' or 'x-api-key: KEY' (default: $NERVE_API_KEY, else none);\n"
            "                       repeat it for several keys\n"
            "  --api-key-file F     the keys from a file, one a line ('#' lines and blank ones skipped): kept out of the\n"
            "                       process list and the shell's history\n"
            "  --cors               send Access-Control-Allow-Origin: * and answer CORS preflights\n"
            "  --no-webui           no chat page at / (default: GET / answers a page to chat with the model in a browser)\n"
            "  --ssl-key-file F, --ssl-cert-file F\n"
            "                       serve HTTPS with this PEM private key and certificate (chain) instead of HTTP\n"
            "                       (llama.cpp's flags; vLLM's --ssl-keyfile, --ssl-certfile too)\n"
            "  --chat-template T    one of the names above, nerve's renderer of it (default: what the model declares:\n"
            "                       a GGUF file's or a folder's chat template, a chat run's own; else plain)\n"
            "  --chat-template-file F  a Jinja template (llama.cpp's flag), taken as the model's own is\n"
            "  --jinja, --no-jinja  the model's own template (or the file) is run as Jinja, as written, its markers\n"
            "                       naming the stops and the tool calls' form (XML where it writes <tool_call>,\n"
            "                       <function= and <parameter=, as Qwen3-Coder's); where it would lose what nerve's renderer\n"
            "                       of that template keeps (a system message, tools, calls and results) that\n"
            "                       renderer instead, said at start. --jinja: run it always;\n"
            "                       --no-jinja: the renderer whenever the markers name one\n"
            "  --rerank-tokens YES[,NO]\n"
            "                       the tokens whose probabilities at a rerank prompt's end give a document's\n"
            "                       relevance to the query (/v1/rerank, /v2/rerank, /v1/score): sigmoid(logit YES -\n"
            "                       logit NO) (default yes,no: Qwen3-Reranker's; each must be one token)\n"
            "  --rerank-template F  a rerank prompt with {query}, {document} and {instruction} in it (default: a GGUF's\n"
            "                       own rerank template, else the chat template on a judging system prompt and a user\n"
            "                       message '<Instruct>: I\\n<Query>: Q\\n<Document>: D', thinking off)\n"
            "  --rerank-instruction TEXT\n"
            "                       what {instruction} says (default: Qwen3-Reranker's web search instruction)\n"
            "  --pooling P          how an embedding pools its input's final-norm rows: mean, cls (the first) or last\n"
            "                       (Qwen3-Embedding's) (default: the model's pooling_type, or a sentence-transformers\n"
            "                       folder's 1_Pooling, else mean)\n"
            "  --trust-request-chat-template\n"
            "                       run a chat request's own 'chat_template' (vLLM's; a Jinja text, for that request\n"
            "                       alone: its client then chooses what the model reads). Without it such a request\n"
            "                       is a 400\n"
            "  --matryoshka         the model's embeddings may be cut to a request's 'dimensions' (made unit length\n"
            "                       again): one trained for it (Matryoshka representation learning: Qwen3-Embedding);\n"
            "                       a folder whose config.json says is_matryoshka needs no flag\n"
            "  --reasoning-format F auto, none or deepseek: a chat answer's leading <think>...</think> (Qwen3, DeepSeek-R1;\n"
            "                       [THINK]...[/THINK] where the template writes Mistral's tags: Magistral)\n"
            "                       goes to message.reasoning_content (delta.reasoning_content streamed); a prompt\n"
            "                       that opens the block starts the answer in it; auto (default): deepseek when the\n"
            "                       chat template shows think blocks, else none; a request's reasoning_format overrides\n"
            "  --reasoning-budget N the tokens a chat answer may think (-1: no limit, the default; 0: thinking off);\n"
            "                       once spent, the block is closed for it (a request's thinking_token_budget)\n"
            "  --reasoning-budget-message TEXT\n"
            "                       what the closing forced at the budget begins with (default: nothing)\n"
            "  --reasoning-effort L the chat template's reasoning_effort where a request gives none (none, minimal, low,\n"
            "                       medium, high, xhigh; none and minimal also turn thinking off where answers are\n"
            "                       read for reasoning)\n"
            "  --scheduling-policy P\n"
            "                       fcfs (default: requests wait in arrival order; a non-zero priority is a 400) or\n"
            "                       priority (a request's priority orders the queue, lower first, as vLLM's)\n"
            "  --no-preemption      a waiting request never preempts running ones; by default one that finds no\n"
            "                       sequence or no KV room sends back to the queue those it outranks (a lower priority\n"
            "                       value under --scheduling-policy priority; the Batch API's requests for any other),\n"
            "                       which go on later with the same text, their positions computed again where the\n"
            "                       prefix cache no longer holds them\n"
            "  --kv-overcommit      admit a request once its prompt fits the KV pool rather than its prompt and\n"
            "                       max_tokens: sequences take blocks as they grow, and where the pool runs short the\n"
            "                       lowest-ranked (the latest among equals) are preempted as above (more requests at\n"
            "                       once when answers end before max_tokens; vLLM's way)\n"
            "  --max-batch N        sequences decoded together per step (default 16; llama-server's --parallel/-np too)\n"
            "  --ctx-size N, -c N, --max-model-len N\n"
            "                       the positions a request may fill, prompt and answer (default the model's context;\n"
            "                       at most that)\n"
            "  --prefill-chunk N    prompt tokens per step, shared by sequences in prefill (default 512)\n"
            "  --spec-tokens N      speculative decoding by prompt lookup: up to N tokens (<= 16) that followed an\n"
            "                       earlier occurrence of a sequence's last tokens are checked in one step; the\n"
            "                       text is exactly what decoding without it gives (default 0: off)\n"
            "  --spec-lookup-min N, --spec-lookup-max N\n"
            "                       the lengths of the tail looked up, longest first (default 2 and 4)\n"
            "  --prediction-tokens N\n"
            "                       a request's 'prediction' (OpenAI's Predicted Outputs: the text the answer is\n"
            "                       expected to be) proposes up to N of its tokens a step, checked as drafts; the\n"
            "                       text is exactly what decoding without it gives (default 16, 0: not drafted from)\n"
            "  --model-draft MODEL  speculative decoding by a draft model (also -md): a smaller model with the same\n"
            "                       tokenizer proposes up to --spec-tokens tokens (default 8) by greedy decoding,\n"
            "                       checked in one step; the text is exactly what decoding without it gives; its\n"
            "                       keys and values share the --kv-memory budget\n"
            "  --draft-engine E     the draft model's engine (default: the fastest that probes well)\n"
            "  --draft-p-min P      a sequence's drafts stop at the first the draft model gives a probability\n"
            "                       below P (default 0.75; 0: never)\n"
            "  --max-queue N        requests waiting for admission before 429 (default 64)\n"
            "  --kv-memory SIZE     KV cache budget, e.g. 512M, 2G (default 512M; also --kv-budget)\n"
            "  --kv-block N         positions per KV block (default 16)\n"
            "  --kv-cache-dtype T   element type of cached keys and values: f16 (default: half the memory and\n"
            "                       the reads of f32), q8 (int8 with a scale per position and head: ~1.9x the\n"
            "                       positions of f16) or f32 (outputs bit-identical to nerve generate); llama-server's\n"
            "                       --cache-type-k/-ctk and --cache-type-v/-ctv too (the same type for both; q8_0 is q8)\n"
            "  --n-gpu-layers N, -ngl N\n"
            "                       accepted for llama-server's scripts, and ignored (with a warning unless 0)\n"
            "  --swa-cache M        a model with sliding-window layers (Gemma 2 and 3, OLMo 3): full keeps every\n"
            "                       position of every layer; window keeps only the window of the windowed layers (a\n"
            "                       ring of blocks per sequence), so long contexts take several times less memory;\n"
            "                       the same outputs either way. The prefix cache then reuses a prefix only where a\n"
            "                       window behind its end is kept: a finished sequence's ring (a conversation's next\n"
            "                       turn), a prompt's end, where a shared prefix ended, or the SSD tier, which keeps\n"
            "                       each block's windowed layers too. auto (default): window when --kv-memory cannot\n"
            "                       hold the model's whole context with every layer, else full\n"
            "  --timeout S          end a request that has not finished after S seconds (default 600)\n"
            "  --max-body SIZE      largest request body (default 1M)\n"
            "  --responses-store SIZE\n"
            "                       Responses API: finished responses kept in memory for previous_response_id and\n"
            "                       GET /v1/responses/{id}, the oldest dropped first past SIZE (default 64M; 0 = none);\n"
            "                       as much again for conversations, and for ended background responses' events\n"
            "  --kv-ram-cache SIZE  prefix cache, RAM tier: KV of finished requests kept in the pool for reuse,\n"
            "                       reclaimed when needed (default: as much as --kv-memory; 0 = keep none)\n"
            "  --kv-disk-cache SIZE prefix cache, SSD tier: cap on this model's block files (default 8G; 0 = off)\n"
            "  --kv-cache-dir DIR   SSD tier directory (default $XDG_CACHE_HOME/nerve/kv, else ~/.cache/nerve/kv)\n"
            "  --no-prefix-cache    no prefix cache at all (every prompt is prefilled)\n"
            "  --files-dir DIR      OpenAI's Files and Batch APIs, kept in DIR (they outlive the server): POST /v1/files\n"
            "                       (multipart: purpose, file), GET /v1/files[/{id}[/content]], DELETE /v1/files/{id};\n"
            "                       POST /v1/batches {input_file_id, endpoint, completion_window: \"24h\"}, GET\n"
            "                       /v1/batches[/{id}], POST /v1/batches/{id}/cancel; Anthropic's /v1/messages/batches\n"
            "                       (create, get, list, cancel, delete, results). A batch runs in the background,\n"
            "                       its requests queued behind everyone else's; a server stopped part way goes on with\n"
            "                       it at the next start; and the fine-tuning jobs API: POST /v1/fine_tuning/jobs {model,\n"
            "                       training_file, ...} trains LoRA adapters on this model in a nerve train process of\n"
            "                       its own (held while requests run), then serves them as ft:MODEL:local:SUFFIX:ID; GET\n"
            "                       /v1/fine_tuning/jobs[/{id}[/events|/checkpoints]], POST .../{cancel,pause,resume},\n"
            "                       DELETE /v1/models/{ft:...} (default: off, those endpoints answer 404)\n"
            "  --files-max-bytes SIZE\n"
            "                       the uploaded files' bytes together (default 2G; a batch's results are kept past it)\n"
            "  --batch-parallel N   a batch's requests at once (default: --max-batch)\n"
            "  --fine-tune-nice N   a fine-tuning job's trainer runs N nice levels below the server, 0-19 (default 10)\n"
            "  --no-fine-tune-yield a fine-tuning job's trainer runs beside requests (default: it is held while\n"
            "                       requests wait or run, training in the server's idle time)\n");
}

/* A PEM file's text into *out (NUL-terminated) when it holds a block "-----BEGIN ...marker-----";
   else one line on stderr and 0. */
static int read_pem(const char *flag, const char *path, const char *marker, char **out) {
    if (!cli_read_text(CMD, flag, path, out, NULL)) return 0;
    const char *begin = strstr(*out, "-----BEGIN ");
    const char *end = begin ? strstr(begin + 11, "-----") : NULL; /* the BEGIN line's end */
    if (!begin || !end || !memmem(begin, (size_t)(end - begin), marker, strlen(marker))) {
        cli_error(CMD, 1, "%s: %s is not a PEM %s (-----BEGIN ...%s-----)", flag, path, marker, marker);
        free(*out);
        *out = NULL;
        return 0;
    }
    return 1;
}

/* Requests waiting or running: a fine-tuning job's trainer is held meanwhile. */
static int sched_busy(void *sched) { return nv_sched_busy(sched) > 0; }

/* What Ollama's /api/tags and /api/show say of the model: its format, architecture, weight type,
   parameters and file size (arch and quant hold the texts). */
static nv_olla_model_info olla_info(const char *path, const nv_model *m, char arch[64], char quant[32]) {
    nv_olla_model_info info = {.n_params = (long long)m->n_params, .family = "llama", .quantization = "F32",
                               .format = nv_hf_is_model(path) ? "safetensors" : "llama2.c"};
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) info.file_bytes = (long long)st.st_size;
    nv_gguf g;
    if (nv_gguf_open(path, &g) != NV_OK) return info;
    info.file_bytes = (long long)nv_gguf_file_bytes(&g);
    size_t n = 0;
    const char *a = nv_gguf_string(&g, "general.architecture", &n);
    if (a) info.family = nv_gguf_shown(a, n, arch, 64);
    const nv_gguf_kv *ft = nv_gguf_find(&g, "general.file_type");
    uint32_t v = 0;
    if (ft && (ft->type == 4 || ft->type == 5)) memcpy(&v, ft->val, 4);
    snprintf(quant, 32, "%s", ft && nv_gguf_file_type_name(v) ? nv_gguf_file_type_name(v) : "unknown");
    info.quantization = quant;
    info.format = "gguf";
    nv_gguf_close(&g);
    return info;
}

/* The API keys: each --api-key, each line of --api-key-file (surrounding white space trimmed; empty
   lines and lines starting with '#' skipped), else $NERVE_API_KEY. The file's text (text_len bytes)
   is kept in *text, the keys pointing into it. 0 after one line on stderr. */
#define MAX_API_KEYS 256
static int gather_api_keys(const char *const *given, int n_given, const char *key_file, char **text, size_t *text_len,
                           const char **keys, int *n) {
    *n = 0;
    for (int i = 0; i < n_given; i++)
        if (*given[i]) keys[(*n)++] = given[i];
    if (key_file) {
        if (!cli_read_text(CMD, "--api-key-file", key_file, text, text_len)) return 0;
        for (char *line = *text, *next; line; line = next) {
            next = strchr(line, '\n');
            if (next) *next++ = '\0';
            while (isspace((unsigned char)*line)) line++;
            size_t l = strlen(line);
            while (l && isspace((unsigned char)line[l - 1])) line[--l] = '\0';
            if (!l || line[0] == '#') continue;
            if (*n == MAX_API_KEYS) {
                cli_error(CMD, 2, "at most %d API keys", MAX_API_KEYS);
                return 0;
            }
            keys[(*n)++] = line;
        }
        if (!*n) {
            cli_error(CMD, 1, "--api-key-file: %s holds no key", key_file);
            return 0;
        }
    }
    const char *env = getenv("NERVE_API_KEY");
    if (!*n && env && *env) keys[(*n)++] = env;
    return 1;
}

/* The job's thread: its exit code in rc, then done. */
typedef struct {
    const cli_serve_job *job;
    int port, max_batch, max_queue;
    float timeout;
    int rc;
    atomic_int done;
} job_run;

static void *job_main(void *arg) {
    job_run *j = arg;
    j->rc = j->job->run(j->job->ctx, j->port, j->max_batch, j->max_queue, j->timeout);
    atomic_store(&j->done, 1);
    return NULL;
}

/* Runs the job beside the server until it ends, passing signals on to it (the signals blocked in
 * every thread, taken here): its exit code, or 1 when its thread cannot start. */
static int run_job(const cli_serve_job *job, int port, int max_batch, int max_queue, float timeout, const sigset_t *sigs) {
    job_run j = {.job = job, .port = port, .max_batch = max_batch, .max_queue = max_queue, .timeout = timeout};
    pthread_t t;
    if (pthread_create(&t, NULL, job_main, &j) != 0) return cli_error(CMD, 1, "cannot start a thread");
    int level = 0;
    struct timespec tick = {0, 50 * 1000 * 1000};
    while (!atomic_load(&j.done))
        if (sigtimedwait(sigs, NULL, &tick) > 0 && level < 2) job->interrupt(job->ctx, ++level);
    pthread_join(t, NULL);
    return j.rc;
}

int cmd_serve(int argc, char **argv) { return cli_serve_run(argc, argv, NULL); }

int cli_serve_run(int argc, char **argv, const cli_serve_job *job) {
    if (job) CMD = job->cmd;
    const char *model_path = NULL, *tok_path = NULL, *engine_name = NULL, *alias = NULL, *host = "127.0.0.1";
    const char *template_name = NULL, *template_file = NULL, *ssl_key = NULL, *ssl_cert = NULL, *key_file = NULL;
    const char *given_keys[MAX_API_KEYS], *api_keys[MAX_API_KEYS];
    int n_given_keys = 0, n_api_keys = 0;
    int reasoning = -1; /* auto: deepseek for a template that shows think blocks, else none */
    int think_budget = -1, *think_close = NULL, n_think_close = 0, priority_sched = 0, no_preempt = 0, overcommit = 0, matryoshka = 0, trust_template = 0;
    const char *budget_message = NULL, *reasoning_effort = NULL;
    int port = 8000, threads = 0, cors = 0, webui = 1, max_batch = 16, prefill_chunk = 512, max_queue = 64, kv_block = 16;
    int pred_tokens = NV_MAX_SPEC;
    int no_tune = 0, chunk_given = 0, max_lora_rank = 64, lora_updates = 0;
    float timeout = 600.0f;
    uint64_t kv_bytes = 512ull << 20, max_body = 1ull << 20, ram_cache = UINT64_MAX, disk_cache = 8ull << 30;
    uint64_t responses_store = 64ull << 20;
    int prefix_cache = 1;
    cli_spec spec = CLI_SPEC_DEFAULTS;
    const char *cache_dir = NULL, *files_dir = NULL;
    uint64_t files_max = 2ull << 30;
    int batch_parallel = 0, ft_nice = 10, ft_yield = 1, run_jinja = -1, pooling = NV_POOLING_DEFAULT, ctx_size = 0;
    const char *rerank_tokens = NULL, *rerank_file = NULL, *rerank_instruction = NULL;
    nv_kv_dtype kv_dtype = NV_KV_F16, kv_side[2] = {0, 0}; /* llama.cpp's --cache-type-k and -v, which must agree */
    nv_swa_cache swa_cache = NV_SWA_AUTO;
    cli_loras loras = {0};
    cli_hub_ref hub = {0};
    const char *modules[NV_MAX_ADAPTERS];
    int n_modules = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (cli_switch(a, "--cors", &cors, 1) ||
            cli_switch(a, "--no-prefix-cache", &prefix_cache, 0) ||
            cli_switch(a, "--no-webui", &webui, 0) ||
            cli_switch(a, "--no-preemption", &no_preempt, 1) ||
            cli_switch(a, "--kv-overcommit", &overcommit, 1) ||
            cli_switch(a, "--matryoshka", &matryoshka, 1) ||
            cli_switch(a, "--trust-request-chat-template", &trust_template, 1) ||
            cli_switch(a, "--no-tune", &no_tune, 1) ||
            cli_switch(a, "--allow-lora-updates", &lora_updates, 1) ||
            cli_switch(a, "--no-fine-tune-yield", &ft_yield, 0) ||
            cli_jinja_flag(a, &run_jinja))
            continue;
        if (!strcmp(a, "--lora-modules")) { /* NAME=ADAPTER, then more such words until the next flag */
            if (!(v = cli_value(CMD, argc, argv, &i))) return 2;
            for (;;) {
                const char *eq = strchr(v, '=');
                if (!eq || eq == v || !eq[1])
                    return cli_error(CMD, 2, "--lora-modules takes NAME=ADAPTER (a name, then the adapter's file), not '%s'", v);
                if (n_modules == NV_MAX_ADAPTERS) return cli_error(CMD, 2, "at most %d adapters (--lora-modules)", NV_MAX_ADAPTERS);
                modules[n_modules++] = v;
                if (i + 1 >= argc || argv[i + 1][0] == '-') break;
                v = argv[++i];
            }
            continue;
        }
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
        else if (!strcmp(a, "--port")) { if (!cli_int(CMD, a, v, 0, 65535, &port)) return 2; }
        else if (!strcmp(a, "--host")) host = v;
        else if (!strcmp(a, "--alias") || !strcmp(a, "--served-model-name")) alias = v;
        else if (!strcmp(a, "--engine")) engine_name = v;
        else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) { if (!cli_int(CMD, a, v, 1, 1024, &threads)) return 2; }
        else if (!strcmp(a, "--api-key")) {
            if (n_given_keys == MAX_API_KEYS) return cli_error(CMD, 2, "at most %d API keys", MAX_API_KEYS);
            given_keys[n_given_keys++] = v;
        }
        else if (!strcmp(a, "--api-key-file")) key_file = v;
        else if (!strcmp(a, "--ssl-key-file") || !strcmp(a, "--ssl-keyfile")) ssl_key = v;
        else if (!strcmp(a, "--ssl-cert-file") || !strcmp(a, "--ssl-certfile")) ssl_cert = v;
        else if (!strcmp(a, "--chat-template")) template_name = v;
        else if (!strcmp(a, "--chat-template-file")) template_file = v;
        else if (!strcmp(a, "--rerank-tokens")) rerank_tokens = v;
        else if (!strcmp(a, "--rerank-template")) rerank_file = v;
        else if (!strcmp(a, "--rerank-instruction")) rerank_instruction = v;
        else if (!strcmp(a, "--pooling")) {
            if ((pooling = nv_pooling_of(v)) < 0) return cli_error(CMD, 2, "--pooling takes mean, cls or last, not '%s'", v);
        }
        else if (!strcmp(a, "--reasoning-format")) {
            if (strcmp(v, "none") && strcmp(v, "deepseek") && strcmp(v, "auto"))
                return cli_error(CMD, 2, "--reasoning-format takes auto, none or deepseek, not '%s'", v);
            reasoning = !strcmp(v, "auto") ? -1 : !strcmp(v, "deepseek");
        }
        else if (!strcmp(a, "--reasoning-budget")) { if (!cli_int(CMD, a, v, -1, 1000000000, &think_budget)) return 2; }
        else if (!strcmp(a, "--reasoning-budget-message")) budget_message = v;
        else if (!strcmp(a, "--scheduling-policy")) {
            if (strcmp(v, "fcfs") && strcmp(v, "priority")) return cli_error(CMD, 2, "--scheduling-policy takes fcfs or priority, not '%s'", v);
            priority_sched = !strcmp(v, "priority");
        }
        else if (!strcmp(a, "--reasoning-effort")) {
            if (!(reasoning_effort = nv_api_effort_level(v))) return cli_error(CMD, 2, "--reasoning-effort takes none, minimal, low, medium, high or xhigh, not '%s'", v);
        }
        else if (!strcmp(a, "--max-lora-rank")) { if (!cli_int(CMD, a, v, 1, 1024, &max_lora_rank)) return 2; }
        else if (!strcmp(a, "--max-batch") || !strcmp(a, "--parallel") || !strcmp(a, "-np")) {
            if (!cli_int(CMD, a, v, 1, 4096, &max_batch)) return 2;
        }
        else if (!strcmp(a, "--n-gpu-layers") || !strcmp(a, "-ngl") || !strcmp(a, "--gpu-layers")) { /* (llama-server's scripts carry it) */
            if (strcmp(v, "0")) nv_warn("%s %.20s: nerve runs on the CPU's engines; ignored", a, v);
        }
        else if (!strcmp(a, "--ctx-size") || !strcmp(a, "-c") || !strcmp(a, "--max-model-len")) { /* (0: the model's, as llama-server's) */
            if (!cli_int(CMD, a, v, 0, 1 << 30, &ctx_size)) return 2;
            if (ctx_size && ctx_size < 16) return cli_error(CMD, 2, "%s takes 0 (the model's context) or at least 16, not %d", a, ctx_size);
        }
        else if (!strcmp(a, "--prediction-tokens")) { if (!cli_int(CMD, a, v, 0, NV_MAX_SPEC, &pred_tokens)) return 2; }
        else if (!strcmp(a, "--prefill-chunk")) {
            if (!cli_int(CMD, a, v, 1, 1 << 16, &prefill_chunk)) return 2;
            chunk_given = 1;
        }
        else if (!strcmp(a, "--max-queue")) { if (!cli_int(CMD, a, v, 1, 1 << 20, &max_queue)) return 2; }
        else if (!strcmp(a, "--kv-block")) { if (!cli_int(CMD, a, v, 1, 4096, &kv_block)) return 2; }
        else if (!strcmp(a, "--kv-cache-dtype")) { if (!cli_kv_dtype(CMD, a, v, &kv_dtype)) return 2; }
        else if (!strcmp(a, "--cache-type-k") || !strcmp(a, "-ctk") || !strcmp(a, "--cache-type-v") || !strcmp(a, "-ctv")) {
            const int side = !strcmp(a, "--cache-type-v") || !strcmp(a, "-ctv");
            if (!cli_kv_dtype(CMD, a, v, &kv_side[side])) return 2;
            if (kv_side[!side] && kv_side[!side] != kv_side[side])
                return cli_error(CMD, 2, "the keys' and the values' cache types must be the same here (%s and %s)", nv_kv_dtype_name(kv_side[0]),
                                 nv_kv_dtype_name(kv_side[1]));
            kv_dtype = kv_side[side];
        }
        else if (!strcmp(a, "--swa-cache")) {
            if (strcmp(v, "auto") && strcmp(v, "full") && strcmp(v, "window"))
                return cli_error(CMD, 2, "--swa-cache takes auto, full or window, not '%s'", v);
            swa_cache = !strcmp(v, "window") ? NV_SWA_WINDOW : !strcmp(v, "full") ? NV_SWA_FULL : NV_SWA_AUTO;
        }
        else if (!strcmp(a, "--kv-memory") || !strcmp(a, "--kv-budget")) { if (!cli_size(CMD, a, v, 1024, &kv_bytes)) return 2; }
        else if (!strcmp(a, "--max-body")) { if (!cli_size(CMD, a, v, 1024, &max_body)) return 2; }
        else if (!strcmp(a, "--kv-ram-cache")) { if (!cli_size(CMD, a, v, 1024, &ram_cache)) return 2; }
        else if (!strcmp(a, "--responses-store")) { if (!cli_size(CMD, a, v, 1024, &responses_store)) return 2; }
        else if (!strcmp(a, "--kv-disk-cache")) { if (!cli_size(CMD, a, v, 1024, &disk_cache)) return 2; }
        else if (!strcmp(a, "--kv-cache-dir")) {
            if (!*v) return cli_error(CMD, 2, "--kv-cache-dir needs a directory (use --kv-disk-cache 0 for no SSD tier)");
            cache_dir = v;
        }
        else if (!strcmp(a, "--timeout")) { if (!cli_float(CMD, a, v, 0.001, 1e7, &timeout)) return 2; }
        else if (!strcmp(a, "--files-dir")) {
            if (job) return cli_error(CMD, 2, "--files-dir: nerve batch runs its own file (-i); the Batch API is nerve serve's");
            if (!*v) return cli_error(CMD, 2, "--files-dir needs a directory");
            files_dir = v;
        }
        else if (!strcmp(a, "--files-max-bytes")) { if (!cli_size(CMD, a, v, 1024, &files_max)) return 2; }
        else if (!strcmp(a, "--batch-parallel")) { if (!cli_int(CMD, a, v, 1, 256, &batch_parallel)) return 2; }
        else if (!strcmp(a, "--fine-tune-nice")) { if (!cli_int(CMD, a, v, 0, 19, &ft_nice)) return 2; }
        else return cli_error(CMD, 2, "unknown option '%s' (see nerve %s --help)", a, CMD);
    }
    if (hub.repo && !alias) alias = hub.repo; /* the model's id in the API: the repository's, as vLLM names it */
    if (!model_path && !hub.repo) return cli_error(CMD, 2, "-m MODEL (or -hf USER/NAME) is required (see nerve %s --help)", CMD);
    if (job) { /* this process's own requests: this machine only, any free port, the job's key alone */
        host = "127.0.0.1", port = 0, webui = 0, cors = 0;
        given_keys[0] = job->api_key, n_given_keys = 1, key_file = NULL;
    }
    if (cli_spec_check(CMD, &spec)) return 2;
    if (!ssl_key != !ssl_cert) return cli_error(CMD, 2, "--ssl-key-file and --ssl-cert-file go together (HTTPS needs both)");
    nv_chat_template tmpl = NV_CHAT_PLAIN;
    nv_rerank rerank = {0};
    nv_jinja *jinja = NULL; /* the template run as Jinja (cli_chat_template), and its text */
    char *jinja_text = NULL;
    const int trc = cli_template_flags(CMD, template_name, template_file, &tmpl);
    if (trc) return trc;
    /* the model from the Hub (before the signals are blocked: Ctrl-C stops a download) */
    char hub_path[4400];
    const int hub_rc = cli_hub_fetch(CMD, &hub, &model_path, hub_path, sizeof hub_path);
    if (hub_rc) return hub_rc;
    int step_delay_ms = 0;
    const char *delay = getenv("NERVE_TEST_STEP_DELAY_MS");
    if (delay && *delay) step_delay_ms = atoi(delay);

    /* Signals are taken by sigwait in this thread: block them before any thread starts. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    struct sigaction hup; /* a terminal that closes: the same orderly stop, unless it is ignored (nohup) */
    if (sigaction(SIGHUP, NULL, &hup) == 0 && hup.sa_handler != SIG_IGN) sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN); /* a file size limit makes the SSD tier's writes fail (EFBIG), not the server */
    signal(SIGCHLD, SIG_DFL); /* a fine-tuning job waits for its trainer: an inherited SIG_IGN would reap it unseen */

    char default_dir[4096] = "";
    if (!cache_dir && prefix_cache && disk_cache > 0) {
        const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        if (xdg && xdg[0] == '/') snprintf(default_dir, sizeof default_dir, "%s/nerve/kv", xdg);
        else if (home && home[0] == '/') snprintf(default_dir, sizeof default_dir, "%s/.cache/nerve/kv", home);
        else nv_warn("serve: prefix cache: neither XDG_CACHE_HOME nor HOME is set: no SSD tier (see --kv-cache-dir)");
        cache_dir = default_dir[0] ? default_dir : NULL;
    }

    char model_id[256];
    if (alias) snprintf(model_id, sizeof model_id, "%s", alias);
    else if (nv_hf_is_model(model_path)) { /* a Hugging Face folder's config.json: the folder's name */
        char dir[4096];
        snprintf(dir, sizeof dir, "%.*s", (int)(strrchr(model_path, '/') ? strrchr(model_path, '/') - model_path : 0), model_path);
        nv_path_name(*dir ? dir : ".", model_id, sizeof model_id);
    } else
        nv_path_name(model_path, model_id, sizeof model_id); /* a run folder: its name */
    char module_names[NV_MAX_ADAPTERS][NV_ADAPTER_NAME_CAP];
    for (int k = 0; k < n_modules; k++) { /* usage errors before anything loads */
        const size_t len = (size_t)(strchr(modules[k], '=') - modules[k]);
        if (len >= sizeof module_names[k])
            return cli_error(CMD, 2, "--lora-modules: the name '%.*s' is longer than %d characters", (int)len, modules[k], NV_ADAPTER_NAME_CAP - 1);
        memcpy(module_names[k], modules[k], len);
        module_names[k][len] = 0;
        if (nv_adapters_check_name(module_names[k]) != NV_OK) return cli_error(CMD, 2, "--lora-modules: %s", nv_errmsg());
        if (!strcmp(module_names[k], model_id))
            return cli_error(CMD, 2, "--lora-modules: '%s' is the base model's id (see --alias)", module_names[k]);
        for (int j = 0; j < k; j++)
            if (!strcmp(module_names[j], module_names[k]))
                return cli_error(CMD, 2, "--lora-modules: the name '%s' is given twice", module_names[k]);
    }
    cli_paths paths;
    cli_model_paths(&model_path, &tok_path, &paths);
    nv_engine_id engine;
    int erc = cli_engine(CMD, engine_name, threads, CLI_ENGINE_FASTEST, &engine); /* the fastest engine that probes well */
    if (erc) return erc;
    /* the keys' files, read before the model loads: a wrong one fails at once */
    char *key_text = NULL, *key_pem = NULL, *cert_pem = NULL; /* --api-key-file's; the TLS key's and certificate's */
    size_t key_text_len = 0;
    if (!gather_api_keys(given_keys, n_given_keys, key_file, &key_text, &key_text_len, api_keys, &n_api_keys) ||
        (ssl_key && (!read_pem("--ssl-key-file", ssl_key, "PRIVATE KEY", &key_pem) ||
                     !read_pem("--ssl-cert-file", ssl_cert, "CERTIFICATE", &cert_pem)))) {
        free(key_text);
        free(key_pem);
        return 1;
    }

    nv_model model, draft = {0};
    nv_adapters adapters;
    nv_adapters_init(&adapters, max_lora_rank);
    nv_tokenizer *tok = NULL;
    nv_metrics metrics;
    nv_sched sched;
    nv_http *http = NULL, *own = NULL; /* own: the Batch API's server on 127.0.0.1 */
    nv_files *files = NULL;
    nv_batches *batches = NULL;
    nv_ftjobs *ftjobs = NULL;
    nv_uploads *uploads = NULL;
    char own_key[64] = "";
    const char *own_keys[1] = {own_key}; /* kept while its server runs */
    int rc = 1, sched_ok = 0;
    nv_metrics_init(&metrics);
    if (cli_load_model(model_path, &loras, 1, &model) != NV_OK) {
        nv_metrics_free(&metrics);
        nv_adapters_free(&adapters);
        free(key_text), free(key_pem), free(cert_pem);
        return cli_error(CMD, 1, "%s", nv_errmsg());
    }
    const nv_config *c = &model.config;
    if (nv_tokenizer_load_for_model(tok_path, c->vocab_size, &tok) != NV_OK) {
        cli_error(CMD, 1, "%s", nv_errmsg());
        goto done;
    }
    if ((rc = cli_chat_template(CMD, model_path, template_name, template_file, run_jinja, &tmpl, &jinja, &jinja_text)) != 0) goto done;
    rc = 1;
    if (rerank_setup(model_path, tok, model.n_cls_head, rerank_tokens, rerank_file, rerank_instruction, &rerank)) goto done;
    /* auto: a template that shows think blocks is a reasoning model's (DeepSeek-R1's, Qwen3's), its answers
       read so; not nerve's own forms (its ChatML shows Qwen3's switch, and a run trained on it does not think) */
    nv_chat_template own_form;
    int shows_think = 0;
    const int think_tags = nv_think_tags_of_template(jinja_text, &shows_think);
    if (reasoning < 0)
        reasoning = tmpl == NV_CHAT_DEEPSEEK || (shows_think && !nv_chat_template_of_jinja(jinja_text, strlen(jinja_text), &own_form));
    nv_think_show_tags(tok, think_tags);
    if (nv_think_close_ids(tok, think_tags, budget_message, &think_close, &n_think_close) != NV_OK) {
        cli_error(CMD, 1, "%s", nv_errmsg());
        goto done;
    }
    const nv_tool_style jinja_tools = jinja ? nv_chat_jinja_tool_style(tmpl, jinja_text) : NV_TOOLS_HERMES;
    nv_chat_show_tool_tokens(tok, tmpl, jinja_tools);
    char tuned_line[160] = "";
    if (!no_tune && !engine_name && !chunk_given) { /* what `nerve tune` measured best here for this model */
        char machine[512], key[256];
        cli_tuned t;
        cli_tune_machine(machine, sizeof machine);
        cli_tune_model_key(&model, key, sizeof key);
        if (cli_tune_lookup(machine, key, &t) && nv_engine_available(t.serve_engine)) {
            engine = t.serve_engine;
            prefill_chunk = t.prefill_chunk;
            snprintf(tuned_line, sizeof tuned_line, ", tuned %.20s", t.at);
            nv_info("serve: engine %s and prefill chunk %d as nerve tune measured them (%s, %s)", nv_engine_name(engine),
                    prefill_chunk, t.at, t.path);
        }
    }
    if (ctx_size > c->seq_len) { /* (past it the model was not trained: its RoPE scaling is its own) */
        cli_error(CMD, 1, "--ctx-size %d is past the model's context of %d positions", ctx_size, c->seq_len);
        goto done;
    }
    if (ctx_size) model.config.seq_len = ctx_size; /* requests, the RoPE tables and attention's rows stop there */
    model.drop_sources = 1; /* built once: each source goes as its plan takes it (the prefix cache keys the hash kept of them) */
    if (nv_model_build_plans(&model, engine) != NV_OK) {
        cli_error(CMD, 1, "%s", nv_errmsg());
        goto done;
    }
    for (int k = 0; k < n_modules; k++) {
        if (nv_adapters_add(&adapters, &model, module_names[k], modules[k] + strlen(module_names[k]) + 1, 1.0f) != NV_OK) {
            cli_error(CMD, 1, "%s", nv_errmsg());
            goto done;
        }
        const nv_adapter *ad = &adapters.v[nv_adapters_find(&adapters, module_names[k], NULL) - 1];
        char targets[64];
        nv_info("serve: adapter %s: %s (rank %d, alpha %g, on %s: %.2fM parameters)", ad->name, ad->path, ad->shape.rank,
                (double)ad->shape.alpha, nv_lora_targets_text(ad->shape.targets, targets, sizeof targets),
                (double)ad->n_params / 1e6);
    }
    if (spec.draft && (rc = cli_load_draft(CMD, &spec, threads, &model, tok, &draft)) != 0) goto done;
    if (spec.draft && ctx_size && draft.config.seq_len > ctx_size) draft.config.seq_len = ctx_size; /* (its tables too) */
    rc = 1;
    nv_sched_opts so = {.max_batch = max_batch,
                        .prefill_chunk = prefill_chunk,
                        .max_queue = max_queue,
                        .block_size = kv_block,
                        .kv_bytes = kv_bytes,
                        .kv_dtype = kv_dtype,
                        .swa_cache = swa_cache,
                        .step_delay_ms = step_delay_ms,
                        .no_preempt = no_preempt,
                        .overcommit = overcommit,
                        .pooling = pooling ? pooling : model.pooling ? model.pooling : NV_POOLING_MEAN,
                        .prefix_cache = prefix_cache,
                        .ram_cache_bytes = ram_cache,
                        .disk_dir = cache_dir,
                        .disk_bytes = disk_cache,
                        .spec_tokens = spec.tokens,
                        .pred_tokens = pred_tokens,
                        .spec_ngram_min = spec.lookup_min,
                        .spec_ngram_max = spec.lookup_max,
                        .draft = spec.draft ? &draft : NULL,
                        .draft_p_min = spec.draft_p_min,
                        .adapters = n_modules || lora_updates || files_dir ? &adapters : NULL}; /* (fine-tuned models too) */
    if (swa_cache == NV_SWA_WINDOW && !nv_kv_layers_count(&model.config, NV_KV_LAYERS_WINDOWED))
        nv_warn("serve: --swa-cache window: %s has no sliding-window layers; every layer keeps every position", model_id);
    else if (swa_cache == NV_SWA_WINDOW && !nv_kv_layers_count(&model.config, NV_KV_LAYERS_FULL))
        nv_warn("serve: --swa-cache window needs layers that see the whole context beside the windowed ones; every layer "
                "keeps every position");
    if (nv_sched_init(&sched, &model, tok, &metrics, &so) != NV_OK) {
        cli_error(CMD, 1, "%s", nv_errmsg());
        goto done;
    }
    sched_ok = 1;
    if (so.pooling != NV_POOLING_MEAN)
        nv_info("serve: embeddings pool the %s token (%s)", so.pooling == NV_POOLING_LAST ? "last" : "first",
                pooling ? "--pooling" : "the model's pooling type");
    if (swa_cache == NV_SWA_AUTO && sched.wring)
        nv_info("serve: every layer's keys and values of the context of %d positions would not fit --kv-memory: the "
                "windowed layers keep only their window (--swa-cache full keeps every position)",
                model.config.seq_len);
    nv_model_drop_quant_sources(&model); /* the plans hold their own copy */
    if (nv_sched_start(&sched) != NV_OK) {
        cli_error(CMD, 1, "%s", nv_errmsg());
        goto done;
    }
    nv_api_ctx ctx = {.model_id = model_id,
                      .tok = tok,
                      .tmpl = tmpl,
                      .jinja = jinja,
                      .jinja_tools = jinja_tools,
                      .think_tags = think_tags,
                      .reasoning = reasoning,
                      .think_budget = think_budget,
                      .think_close = think_close,
                      .n_think_close = n_think_close,
                      .reasoning_effort = reasoning_effort,
                      .priority_sched = priority_sched,
                      .seq_len = c->seq_len,
                      .vocab_size = c->vocab_size,
                      .dim = c->dim,
                      .matryoshka = matryoshka || model.matryoshka,
                      .trust_request_template = trust_template,
                      .mrl_dims = model.mrl_dims,
                      .n_mrl_dims = model.n_mrl_dims,
                      .capacity = nv_sched_capacity(&sched),
                      .adapters = &adapters};
    char olla_arch[64], olla_quant[32];
    nv_http_opts ho = {.host = host,
                       .port = port,
                       .api_keys = api_keys,
                       .n_api_keys = n_api_keys,
                       .cors = cors,
                       .webui = webui,
                       .quiet_access = job != NULL,
                       .olla = olla_info(model_path, &model, olla_arch, olla_quant),
                       .max_body = (size_t)max_body,
                       .timeout_s = timeout,
                       .engine = nv_engine_name(nv_model_engine(&model)),
                       .lora_updates = lora_updates,
                       .responses_store = (size_t)responses_store,
                       .rerank = &rerank,
                       .tls_key = key_pem,
                       .tls_cert = cert_pem};
    if (files_dir) { /* the Files and Batch APIs (their batches run once both servers are up) */
        if (nv_files_open(&files, files_dir, files_max) != NV_OK || nv_batches_open(&batches, files) != NV_OK ||
            nv_uploads_open(&uploads, files) != NV_OK) {
            cli_error(CMD, 1, "--files-dir %s: %s", files_dir, nv_errmsg());
            goto done;
        }
        ho.files = files, ho.batches = batches, ho.uploads = uploads;
        /* the fine-tuning jobs: LoRA adapters trained by nerve train on the model as it was given */
        char abs_model[4096];
        nv_ftjobs_opts fo = {.model_id = model_id,
                             .model_path = realpath(model_path, abs_model) ? abs_model : model_path,
                             .tok_path = tok_path,
                             .template_name = nv_chat_template_name(tmpl),
                             .template_jinja = jinja ? jinja_text : NULL,
                             .threads = threads,
                             .nice = ft_nice,
                             .busy = sched_busy,
                             .busy_ctx = &sched,
                             .yield = ft_yield,
                             .unavailable = loras.n ? "the served model has adapters merged into it (--lora): serve the merged model "
                                                      "(nerve export --lora) to fine-tune it"
                                                    : NULL,
                             .adapters = &adapters,
                             .model = &model};
        if (nv_ftjobs_open(&ftjobs, files, &fo) != NV_OK) {
            cli_error(CMD, 1, "--files-dir %s: %s", files_dir, nv_errmsg());
            goto done;
        }
        ho.ftjobs = ftjobs;
    }
    char adapters_line[48] = ""; /* before the HTTP threads can load adapters */
    if (adapters.live || lora_updates)
        snprintf(adapters_line, sizeof adapters_line, " with %d LoRA adapter%s%s", adapters.live, adapters.live == 1 ? "" : "s",
                 lora_updates ? ", loaded at run time too" : "");
    if (nv_http_start(&http, &ho, &sched, &metrics, &ctx) != NV_OK) {
        cli_error(CMD, 1, "%s", nv_errmsg());
        goto done;
    }
    if (files) { /* the batches' requests go to a server of their own on 127.0.0.1, queued behind the others */
        nv_http_opts oo = ho;
        nv_api_new_id(own_key, sizeof own_key, "nv-batch-");
        oo.host = "127.0.0.1", oo.port = 0, oo.api_keys = own_keys, oo.n_api_keys = 1, oo.cors = 0, oo.webui = 0;
        oo.quiet_access = 1, oo.background = 1, oo.tls_key = oo.tls_cert = NULL, oo.files = NULL, oo.batches = NULL, oo.ftjobs = NULL, oo.uploads = NULL;
        oo.timeout_s = 0;        /* a batch's request may wait long behind the others; max_tokens bounds its run */
        oo.responses_store = 0;  /* (a batch's Responses are not kept for previous_response_id) */
        const int parallel = batch_parallel ? batch_parallel : max_batch < 256 ? max_batch : 256; /* within its connection limit */
        if (nv_http_start(&own, &oo, &sched, &metrics, &ctx) != NV_OK ||
            nv_batches_start(batches, nv_http_port(own), own_key, parallel, 0.0f) != NV_OK || nv_ftjobs_start(ftjobs) != NV_OK) {
            cli_error(CMD, 1, "the Batch API's own server: %s", nv_errmsg());
            goto done;
        }
    }
    char cache_line[4400] = ", no prefix cache", window_line[200] = "";
    if (sched.wring)
        snprintf(window_line, sizeof window_line,
                 ", windowed layers' KV %d blocks = %.1f MiB (a ring of %d a sequence: its window and a step's rows)",
                 sched.wpool.n_blocks, (double)sched.wpool.n_blocks * (double)sched.wpool.block_bytes / 1048576.0, sched.wring);
    if (sched.prefix_on) {
        double ram_mib = (double)sched.pool.max_idle * (double)sched.pool.block_bytes / 1048576.0;
        if (sched.disk) {
            nv_metrics_gauges g;
            nv_sched_gauges(&sched, &g);
            char dirs[2200];
            if (sched.wdisk) snprintf(dirs, sizeof dirs, "%s and %s", nv_disk_dir(sched.disk), nv_disk_dir(sched.wdisk));
            else snprintf(dirs, sizeof dirs, "%s", nv_disk_dir(sched.disk));
            snprintf(cache_line, sizeof cache_line, "%s, prefix cache: RAM %.1f MiB%s, SSD %s (%ld %s, %.1f of %.1f MiB)", window_line,
                     ram_mib, sched.wdisk ? " and windowed-layer checkpoints" : "", dirs, g.disk.files,
                     sched.wdisk ? "files: each block's two sides" : "blocks", (double)g.disk.bytes / 1048576.0,
                     (double)g.disk.max_bytes / 1048576.0);
        } else {
            snprintf(cache_line, sizeof cache_line, "%s, prefix cache: RAM %.1f MiB%s", window_line, ram_mib,
                     sched.wring ? " and windowed-layer checkpoints, no SSD tier" : ", no SSD tier");
        }
    } else if (sched.wring) {
        snprintf(cache_line, sizeof cache_line, "%s, no prefix cache", window_line);
    }
    char spec_line[200] = "";
    if (spec.draft)
        snprintf(spec_line, sizeof spec_line, ", speculative decoding: up to %d drafts by %.60s (%.1fM parameters, engine %s, KV %.1f MiB)",
                 spec.tokens, spec.draft, (double)draft.n_params / 1e6, nv_engine_name(nv_model_engine(&draft)),
                 (double)sched.dpages.n_blocks * (double)nv_kv_block_bytes(&draft.config, kv_block, sched.dpages.dtype) / 1048576.0);
    else if (spec.tokens)
        snprintf(spec_line, sizeof spec_line, ", speculative decoding: up to %d drafts (lookup %d-%d)", spec.tokens,
                 spec.lookup_min, spec.lookup_max);
    char files_line[4300] = "";
    if (files) { /* what the Files and Batch APIs hold */
        int n_files;
        uint64_t file_bytes;
        nv_files_usage(files, &n_files, &file_bytes);
        snprintf(files_line, sizeof files_line, ", files and batches in %.4000s (%d file%s, %.1f MiB)", files_dir, n_files,
                 n_files == 1 ? "" : "s", (double)file_bytes / 1048576.0);
    }
    const char *fmt_host = strchr(host, ':') ? "[%s]" : "%s";
    char shown[300], tmpl_shown[200];
    snprintf(shown, sizeof shown, fmt_host, host);
    const char *calls_note = ctx.jinja_tools == NV_TOOLS_XML            ? "the calls written as XML"
                             : ctx.jinja_tools == NV_TOOLS_MISTRAL_ARGS ? "the calls written as [TOOL_CALLS]NAME[ARGS]{...}"
                             : ctx.jinja_tools == NV_TOOLS_MISTRAL_CALL_ID ? "the calls written as [TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}"
                                                                        : NULL;
    if (!jinja)
        snprintf(tmpl_shown, sizeof tmpl_shown, "%s", nv_chat_template_name(tmpl));
    else if (tmpl != NV_CHAT_PLAIN)
        snprintf(tmpl_shown, sizeof tmpl_shown, "the model's own, run as Jinja (stops and tool calls as %s%s%s)", nv_chat_template_name(tmpl),
                 calls_note ? "'s, " : "", calls_note ? calls_note : "");
    else
        snprintf(tmpl_shown, sizeof tmpl_shown, "the model's own, run as Jinja%s%s%s", calls_note ? " (" : "", calls_note ? calls_note : "",
                 calls_note ? ")" : "");
    fprintf(stderr,
            "nerve %s: %s %s://%s:%d (model %s%s, engine %s, chat template %s%s, KV %s %d blocks x %d tokens = "
            "%.1f MiB, max batch %d, prefill chunk %d%s%s%s%s%s)%s\n",
            CMD, job ? "its requests to a server on" : "listening on", key_pem ? "https" : "http", shown, nv_http_port(http), model_id, adapters_line, ho.engine, tmpl_shown,
            !reasoning ? "" : think_tags == NV_THINK_BRACKET ? " (reasoning in [THINK] blocks to reasoning_content)" : " (reasoning to reasoning_content)",
            nv_kv_dtype_name(sched.pool.pages.dtype), sched.pool.n_blocks,
            sched.pool.block_size, (double)sched.pool.n_blocks * (double)sched.pool.block_bytes / 1048576.0, max_batch,
            prefill_chunk, tuned_line, cache_line, spec_line, files_line, n_api_keys && !job ? ", API key required" : "",
            webui ? "; chat in a browser at /" : "");
    fflush(stderr);

    int sig = 0, job_rc = 0;
    if (job) {
        job_rc = run_job(job, nv_http_port(http), max_batch, max_queue, timeout, &sigs);
    } else {
        while (sigwait(&sigs, &sig) != 0) {
        }
        fprintf(stderr, "nerve serve: %s: finishing running requests (up to %.0f s), then stopping\n",
                sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP" : "SIGTERM", GRACE_S);
    }
    nv_batches_stop(batches, 1); /* a batch's requests still running finish; the rest wait for the next start */
    nv_ftjobs_stop(ftjobs);      /* a trainer saves its checkpoint meanwhile */
    nv_http_quiesce(http);
    if (own) nv_http_quiesce(own);
    nv_sched_drain(&sched);
    double until = nv_now() + GRACE_S;
    struct timespec tick = {0, 100 * 1000 * 1000};
    while ((nv_sched_busy(&sched) || nv_http_active(http) || (own && nv_http_active(own))) && nv_now() < until)
        if (sigtimedwait(&sigs, NULL, &tick) > 0) break; /* a second signal: cancel now */
    nv_sched_stop(&sched);
    /* let the connection threads send what the scheduler's last words were (bounded) */
    for (double t = nv_now() + 1.0; (nv_http_active(http) || (own && nv_http_active(own))) && nv_now() < t;) {
        struct timespec ms10 = {0, 10 * 1000 * 1000};
        nanosleep(&ms10, NULL);
    }
    rc = job_rc;
done:
    nv_batches_stop(batches, 1); /* before the scheduler stops: its last 503s are not a batch's answers */
    if (sched_ok) nv_sched_stop(&sched);
    nv_batches_stop(batches, 2);
    if (http) nv_http_stop(http); /* no client reaches the batches after this */
    nv_batches_close(batches);    /* (its requests have their answers: the scheduler has stopped) */
    nv_ftjobs_close(ftjobs);      /* (its trainer stopped; no client reaches it after nv_http_stop) */
    nv_uploads_close(uploads);
    if (own) nv_http_stop(own);
    nv_files_close(files);
    explicit_bzero(own_key, sizeof own_key);
    if (sched_ok) nv_sched_free(&sched);
    nv_adapters_free(&adapters);
    if (tok) nv_tokenizer_free(tok);
    nv_jinja_free(jinja);
    free(jinja_text);
    free(think_close);
    nv_rerank_free(&rerank);
    nv_model_free(&model);
    nv_model_free(&draft);
    nv_metrics_free(&metrics);
    if (key_pem) explicit_bzero(key_pem, strlen(key_pem)); /* the private key leaves no copy behind */
    if (key_text) explicit_bzero(key_text, key_text_len);
    free(key_text);
    free(key_pem);
    free(cert_pem);
    if (rc == 0 && !job) fprintf(stderr, "nerve serve: stopped\n");
    return rc;
}
