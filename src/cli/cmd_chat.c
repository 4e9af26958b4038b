/* nerve chat: a conversation with a chat model in the terminal, as llama.cpp's conversation mode
 * or `ollama run` have it. Each line read is a user message (a line ending in '\' goes on to the
 * next); the whole conversation is rendered with the model's chat template, as `nerve serve`
 * renders a request, only the tokens the KV cache does not hold yet are run, and the answer streams
 * to stdout. When the conversation outgrows the context, its oldest exchanges are dropped. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/timer.h"
#include "cli/cli.h"
#include "cli/hub.h"
#include "engine/engine.h"
#include "model/forward.h"
#include "model/sampler.h"
#include "model/think.h"
#include "model/tokenizer.h"
#include "serve/chat.h"

#define CMD "chat"
#define PREFILL_CHUNK 64

static void usage(FILE *f) {
    fprintf(f,
            "usage: nerve chat -m MODEL [-z TOKENIZER] [--chat-template T | --chat-template-file F] [--jinja | --no-jinja] [--system TEXT | --system-file F] [-p TEXT] [-n N] [--ctx N]\n"
            "                  [-t TEMP] [--top-p P] [--top-k K] [--min-p P] [-s SEED] [--no-think]\n"
            "                  [--engine E] [--threads N] [--lora ADAPTER | --lora-scaled ADAPTER SCALE]\n"
            "  a conversation with a chat model: each line on stdin is your message (end a line with '\\' to\n"
            "  go on to the next), the answer streams to stdout. /reset starts over, /exit (or end of input) ends.\n"
            "  Ctrl-C stops an answer; at the prompt it ends the conversation.\n"
            CLI_HUB_USAGE
            "  -m MODEL            a model file, a nerve train run folder or a Hugging Face folder (as generate)\n"
            "  -z TOKENIZER        default: the model's own, as generate\n"
            "  --chat-template T   plain, chatml, llama2, llama3, deepseek, phi3, gemma, granite, mistral, phi4-mini or phi4\n"
            "                      (default: what the model declares, as serve: a chat run's, a GGUF file's or a folder's;\n"
            "                      else plain)\n"
            "  --chat-template-file F  a Jinja template, taken as the model's own is\n"
            "  --jinja, --no-jinja as serve's: the model's own template run as Jinja always, or never where nerve has a\n"
            "                      renderer of it (default: run unless it would lose what that renderer keeps)\n"
            "  --system TEXT       a system message first\n"
            "  --system-file F     the system message from a file (its last line break dropped)\n"
            "  -p TEXT             one message, answered, then the end (no input read): for scripts\n"
            "  -n N                the most tokens of one answer (default 512)\n"
            "  --ctx N             the positions the conversation may fill (default the model's context, at most\n"
            "                      8192); the oldest exchanges are dropped to make room for a new one\n"
            "  -t TEMP             temperature (default 0.7; 0: greedy)\n"
            "  --top-p P, --top-k K, --min-p P   filters (defaults 0.95, 40, 0.05)\n"
            "  -s SEED             random seed (default: the time)\n"
            "  --no-think          chatml: Qwen3's non-thinking turns (an empty reasoning block)\n"
            "  --engine E, --threads N   as serve (default: the fastest engine that probes well)\n");
}

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

/* The conversation: messages whose texts this owns. */
typedef struct {
    nv_chat_msg *m;
    int n, cap;
} history;

static int history_push(history *h, const char *role, const char *text, size_t len) {
    if (h->n == h->cap) {
        const int cap = h->cap ? 2 * h->cap : 16;
        nv_chat_msg *m = realloc(h->m, (size_t)cap * sizeof *m);
        if (!m) return -1;
        h->m = m, h->cap = cap;
    }
    char *copy = strndup(text, len);
    if (!copy) return -1;
    h->m[h->n++] = (nv_chat_msg){.role = role, .content = copy};
    return 0;
}

/* Drops messages [from, from + k). */
static void history_drop(history *h, int from, int k) {
    if (k <= 0) return;
    for (int i = from; i < from + k; i++) free((void *)h->m[i].content);
    memmove(h->m + from, h->m + from + k, (size_t)(h->n - from - k) * sizeof *h->m);
    h->n -= k;
}

/* One user message from stdin: a line, joined with the next while it ends in '\'. 0 at the end of
 * the input (or Ctrl-C at the prompt), -1 out of memory. */
static int read_message(nv_buf *out, int show_prompt) {
    char *line = NULL;
    size_t cap = 0;
    out->len = 0;
    if (out->data) out->data[0] = 0;
    for (int first = 1;; first = 0) {
        if (show_prompt) fputs(first ? "> " : ". ", stderr);
        errno = 0;
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0) {
            free(line);
            return first || interrupted ? 0 : 1; /* an unfinished continuation at the end is still a message */
        }
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) n--;
        const int more = n > 0 && line[n - 1] == '\\';
        nv_buf_append(out, line, (size_t)(n - more));
        if (!more) break;
        nv_buf_puts(out, "\n");
    }
    free(line);
    return out->oom ? -1 : 1;
}

/* The length of the longest tail of s (n bytes) that begins stop: text held back until it is known
 * not to be the stop string. */
static size_t stop_tail(const char *s, size_t n, const char *stop) {
    const size_t sl = stop ? strlen(stop) : 0;
    for (size_t k = sl - (sl > 0) < n ? sl - (sl > 0) : n; k > 0; k--)
        if (!memcmp(s + n - k, stop, k)) return k;
    return 0;
}

int cmd_chat(int argc, char **argv) {
    const char *model_path = NULL, *tok_path = NULL, *engine_name = NULL, *template_name = NULL, *system_text = NULL;
    const char *system_file = NULL;
    const char *one = NULL, *template_file = NULL; /* -p: a single message */
    int max_answer = 512, ctx_arg = 0, threads = 0, top_k = 40, no_think = 0, run_jinja = -1;
    float temperature = 0.7f, top_p = 0.95f, min_p = 0.05f;
    uint64_t seed = 0;
    cli_loras loras = {0};
    cli_hub_ref hub = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (cli_switch(a, "--no-think", &no_think, 1) || cli_jinja_flag(a, &run_jinja)) continue;
        const int lf = cli_lora_flag(CMD, argc, argv, &i, &loras);
        if (lf < 0) return 2;
        if (lf) continue;
        const int hf = cli_hub_flag(CMD, argc, argv, &i, &hub);
        if (hf < 0) return 2;
        if (hf) continue;
        if (!(v = cli_value(CMD, argc, argv, &i))) return 2;
        if (!strcmp(a, "-m")) model_path = v;
        else if (!strcmp(a, "-z")) tok_path = v;
        else if (!strcmp(a, "--chat-template")) template_name = v;
        else if (!strcmp(a, "--chat-template-file")) template_file = v;
        else if (!strcmp(a, "--system")) system_text = v;
        else if (!strcmp(a, "--system-file")) system_file = v;
        else if (!strcmp(a, "-p")) one = v;
        else if (!strcmp(a, "-n")) { if (!cli_int(CMD, a, v, 1, 1 << 20, &max_answer)) return 2; }
        else if (!strcmp(a, "--ctx")) { if (!cli_int(CMD, a, v, 16, 1 << 24, &ctx_arg)) return 2; }
        else if (!strcmp(a, "-t")) { if (!cli_float(CMD, a, v, 0, 1e6, &temperature)) return 2; }
        else if (!strcmp(a, "--top-p")) { if (!cli_float(CMD, a, v, 0, 1, &top_p)) return 2; }
        else if (!strcmp(a, "--top-k")) { if (!cli_int(CMD, a, v, 0, 1 << 30, &top_k)) return 2; }
        else if (!strcmp(a, "--min-p")) { if (!cli_float(CMD, a, v, 0, 1, &min_p)) return 2; }
        else if (!strcmp(a, "-s")) { if (!cli_u64(CMD, a, v, &seed)) return 2; }
        else if (!strcmp(a, "--engine")) engine_name = v;
        else if (!strcmp(a, "--threads")) { if (!cli_int(CMD, a, v, 1, 1024, &threads)) return 2; }
        else return cli_error(CMD, 2, "unknown option '%s' (see nerve chat --help)", a);
    }
    if (!model_path && !hub.repo) return cli_error(CMD, 2, "-m MODEL (or -hf USER/NAME) is required (see nerve chat --help)");
    if (system_text && system_file) return cli_error(CMD, 2, "--system and --system-file both give the system message: one or the other");
    nv_chat_template tmpl = NV_CHAT_PLAIN;
    nv_jinja *jinja = NULL; /* the template run as Jinja (cli_chat_template) */
    char *jinja_text = NULL;
    const int trc = cli_template_flags(CMD, template_name, template_file, &tmpl);
    if (trc) return trc;
    char hub_path[4400];
    const int hub_rc = cli_hub_fetch(CMD, &hub, &model_path, hub_path, sizeof hub_path);
    if (hub_rc) return hub_rc;
    if (seed == 0) seed = (uint64_t)time(NULL);
    cli_paths paths;
    cli_model_paths(&model_path, &tok_path, &paths);
    nv_engine_id engine;
    int erc = cli_engine(CMD, engine_name, threads, CLI_ENGINE_FASTEST, &engine);
    if (erc) return erc;

    nv_model model;
    nv_tokenizer *tok = NULL;
    nv_sampler sampler = {0};
    nv_state state = {0};
    history h = {0};
    nv_buf input = {0}, answer = {0};
    int *fed = NULL, n_fed = 0, rc = 1, turns = 0, answered = 0, asked = 0;
    double t_gen = 0;
    char *system_read = NULL; /* --system-file's text */
    if (system_file) {
        size_t len = 0;
        if (!cli_read_text(CMD, "--system-file", system_file, &system_read, &len)) return 1;
        while (len && (system_read[len - 1] == '\n' || system_read[len - 1] == '\r')) system_read[--len] = '\0';
        system_text = system_read;
    }
    if (cli_load_model(model_path, &loras, 1, &model) != NV_OK) {
        free(system_read);
        return cli_error(CMD, 1, "%s", nv_errmsg());
    }
    const nv_config *c = &model.config;
    const int ctx = ctx_arg ? (ctx_arg < c->seq_len ? ctx_arg : c->seq_len) : c->seq_len < 8192 ? c->seq_len : 8192;
    model.drop_sources = 1; /* built once: each source goes as its plan takes it */
    if (nv_tokenizer_load_for_model(tok_path, c->vocab_size, &tok) != NV_OK || nv_model_build_plans(&model, engine) != NV_OK ||
        nv_sampler_init(&sampler, c->vocab_size, temperature, top_p, seed) != NV_OK ||
        nv_sampler_set_filters(&sampler, top_k, min_p) != NV_OK || nv_state_init(&state, c, PREFILL_CHUNK, ctx, 0) != NV_OK ||
        !(fed = malloc((size_t)ctx * sizeof *fed))) {
        cli_error(CMD, 1, "%s", fed || !tok ? nv_errmsg() : "out of memory");
        goto done;
    }
    nv_model_drop_quant_sources(&model);
    if (cli_chat_template(CMD, model_path, template_name, template_file, run_jinja, &tmpl, &jinja, &jinja_text)) goto done;
    const int think_tags = nv_think_tags_of_template(jinja_text, NULL);
    nv_think_show_tags(tok, think_tags);
    if (system_text && history_push(&h, "system", system_text, strlen(system_text))) goto oom;
    const char *stop = nv_chat_template_stop(tmpl);
    const int tty = !one && isatty(STDIN_FILENO);
    struct sigaction sa = {.sa_handler = on_sigint}, old_sa; /* no SA_RESTART: Ctrl-C ends a read at the prompt */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_sa);
    if (tty)
        fprintf(stderr, "nerve chat: %s, chat template %s, engine %s, context %d; /reset starts over, /exit ends\n", model_path,
                jinja ? "jinja" : nv_chat_template_name(tmpl), nv_engine_name(engine), ctx);
    const nv_chat_opts opts = {.no_think = no_think, .jinja = jinja};
    for (;;) {
        interrupted = 0;
        int got;
        if (one) { /* -p: that message, then the end */
            if (asked++) break;
            input.len = 0;
            nv_buf_puts(&input, one);
            got = input.oom ? -1 : 1;
        } else {
            got = read_message(&input, tty);
        }
        if (got < 0) goto oom;
        if (got == 0) break;
        if (one && !input.len) {
            rc = cli_error(CMD, 2, "-p: the message is empty");
            goto done;
        }
        if (!strcmp(input.data, "/exit") || !strcmp(input.data, "/quit")) break;
        if (!strcmp(input.data, "/reset")) {
            history_drop(&h, system_text ? 1 : 0, h.n - (system_text ? 1 : 0));
            if (tty) fputs("(the conversation starts over)\n", stderr);
            continue;
        }
        if (!input.len) continue;
        if (history_push(&h, "user", input.data, input.len)) goto oom;
        /* the conversation's tokens, its oldest exchanges dropped while it leaves no room for an answer */
        int *ids = NULL, n_ids = 0;
        for (;;) {
            free(ids);
            ids = NULL;
            if (nv_chat_render_opts(tmpl, tok, h.m, h.n, &opts, &ids, &n_ids) != NV_OK) {
                cli_error(CMD, 1, "%s", nv_errmsg());
                goto done;
            }
            const int first = system_text ? 1 : 0;
            if (n_ids + (max_answer < ctx / 2 ? max_answer : ctx / 2) <= ctx || h.n - first <= 1) break;
            /* the oldest exchange: a user message and the answers that follow it */
            int k = 1;
            while (first + k < h.n - 1 && strcmp(h.m[first + k].role, "user") != 0) k++;
            history_drop(&h, first, k);
        }
        if (n_ids == 0 || n_ids >= ctx) {
            fprintf(stderr, "nerve chat: that message gives %d tokens, more than the context of %d holds (--ctx)\n", n_ids, ctx);
            free(ids);
            if (one) goto done; /* the one message: a failure */
            history_drop(&h, h.n - 1, 1);
            continue;
        }
        /* only what the cache does not hold: the tokens after the common beginning (at least the last,
           whose logits are wanted) */
        int pos = 0;
        while (pos < n_fed && pos < n_ids - 1 && fed[pos] == ids[pos]) pos++;
        if (!nv_state_resumable(&state, pos)) pos = 0; /* a windowed layer's ring has gone past it: all again */
        const double t0 = nv_now();
        while (pos < n_ids) {
            const int n = n_ids - pos < PREFILL_CHUNK ? n_ids - pos : PREFILL_CHUNK;
            if (nv_forward(&model, &state, ids + pos, n, pos) != NV_OK) {
                free(ids);
                cli_error(CMD, 1, "%s", nv_errmsg());
                goto done;
            }
            memcpy(fed + pos, ids + pos, (size_t)n * sizeof *ids);
            pos += n;
        }
        n_fed = pos;
        int token = ids[n_ids - 1], produced = 0;
        const int opened = nv_think_opened(tok, think_tags, ids, n_ids);
        if (opened) /* the prompt opened the answer's think block: shown as it is (Mistral's without a line) */
            printf("%s%s", nv_think_tags_of(think_tags)->open, think_tags == NV_THINK_BRACKET ? "" : "\n");
        free(ids);
        size_t shown = 0; /* answer bytes printed; the rest may be the start of the stop string */
        answer.len = 0;
        int stopped = 0;
        while (!interrupted && produced < max_answer && pos < ctx) {
            const int next = nv_sample(&sampler, state.logits);
            if (nv_tokenizer_is_eog(tok, next) || next == nv_tokenizer_eos(tok)) break;
            const char *piece = nv_tokenizer_decode(tok, token, next);
            if (piece && nv_tokenizer_piece_shown(tok, piece)) nv_buf_puts(&answer, piece);
            if (answer.oom) goto oom;
            produced++;
            const char *at = stop && answer.data ? strstr(answer.data + (shown > strlen(stop) ? shown - strlen(stop) : 0), stop) : NULL;
            if (at) { /* the template's end of turn, spelled in text by a vocabulary without it */
                answer.len = (size_t)(at - answer.data);
                answer.data[answer.len] = 0;
                stopped = 1;
            }
            const size_t safe = stopped ? answer.len : answer.len - stop_tail(answer.data, answer.len, stop);
            if (safe > shown) fwrite(answer.data + shown, 1, safe - shown, stdout), shown = safe;
            fflush(stdout);
            if (stopped) break;
            fed[pos] = next;
            if (nv_forward(&model, &state, &next, 1, pos) != NV_OK) {
                cli_error(CMD, 1, "%s", nv_errmsg());
                goto done;
            }
            pos++;
            token = next;
        }
        n_fed = pos;
        if (!stopped && answer.len > shown) fwrite(answer.data + shown, 1, answer.len - shown, stdout);
        fputs("\n", stdout);
        fflush(stdout);
        if (interrupted && tty) fputs("(stopped)\n", stderr);
        else if (produced == max_answer || pos >= ctx)
            fprintf(stderr, "nerve chat: the answer was cut at %d tokens (%s)\n", produced, produced == max_answer ? "-n" : "--ctx");
        t_gen += nv_now() - t0;
        answered += produced;
        turns++;
        if (think_tags == NV_THINK_HARMONY) { /* the next prompt holds the final channel's text alone, as harmony drops the reasoning */
            nv_think hm = {.tags = NV_THINK_HARMONY, .state = opened ? NV_THINK_IN : NV_THINK_UNDECIDED};
            nv_buf said = {0};
            nv_think_feed(&hm, answer.data ? answer.data : "", answer.len, 1, NULL, &said);
            nv_think_free(&hm);
            const int bad = said.oom || history_push(&h, "assistant", said.data ? said.data : "", said.len);
            nv_buf_free(&said);
            if (bad) goto oom;
        } else if (history_push(&h, "assistant", answer.data ? answer.data : "", answer.len))
            goto oom;
    }
    sigaction(SIGINT, &old_sa, NULL);
    if (turns)
        fprintf(stderr, "nerve chat: %d answer%s, %d tokens, %.1f tok/s with the prompts' prefill, engine %s\n", turns,
                turns == 1 ? "" : "s", answered, t_gen > 0 ? answered / t_gen : 0.0, nv_engine_name(engine));
    rc = 0;
    goto done;
oom:
    cli_error(CMD, 1, "out of memory");
done:
    free(system_read);
    history_drop(&h, 0, h.n);
    free(h.m);
    free(fed);
    nv_buf_free(&input);
    nv_buf_free(&answer);
    nv_state_free(&state);
    nv_sampler_free(&sampler);
    if (tok) nv_tokenizer_free(tok);
    nv_jinja_free(jinja);
    free(jinja_text);
    nv_model_free(&model);
    return rc;
}
