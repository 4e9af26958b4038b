/* nerve: train and serve Llama-family transformers on the CPU's matrix engines. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"train", cmd_train, "train a model from scratch, fine-tune one, or resume a run"},
    {"export", cmd_export, "write a training checkpoint as a llama2.c model"},
    {"generate", cmd_generate, "sample text from a checkpoint"},
    {"chat", cmd_chat, "talk with a chat model in the terminal"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server with continuous batching"},
    {"tokenize", cmd_tokenize, "print the token ids of a text, or write text files' tokens as a training shard"},
    {"tokenizer", cmd_tokenizer, "train a BPE tokenizer (tokenizer train)"},
    {"bench", cmd_bench, "measure the engines, training, generation and serving against peers"},
    {"init", cmd_init, "write a randomly initialised checkpoint of a preset shape"},
    {"perplexity", cmd_perplexity, "score a text: perplexity, and the KL divergence from a reference model"},
    {"imatrix", cmd_imatrix, "an importance matrix of a model over a text, for export --imatrix's quantization"},
    {"tune", cmd_tune, "measure which engine and prefill chunk serve a model fastest here, and keep the choice"},
    {"info", cmd_info, "what this machine offers: CPU, features, engines"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: nerve <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n`nerve <command> --help` describes a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "nerve: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
