/* nerve tokenize: print the ids llama2.c's encoder gives a text, to compare tokenizers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "model/tokenizer.h"

static const char *const tokenize_usage =
    "usage: nerve tokenize -z TOKENIZER [--bos] [--] TEXT\n"
    "       nerve tokenize -z TOKENIZER [--bos] --null-separated < TEXTS\n"
    "  -z TOKENIZER       tokenizer in llama2.c tokenizer.bin format, or a GGUF file's vocabulary\n"
    "  --bos              prepend the vocabulary's BOS id (where it asks for one: llama2.c's always)\n"
    "  --null-separated   read the texts from stdin, each ended by a NUL byte (or the end of input)\n"
    "Prints the ids of each TEXT space-separated on one line (no EOS).\n";

static int print_ids(const char *cmd, const nv_tokenizer *t, const char *text, int bos) {
    int *ids, n;
    if (nv_tokenizer_encode(t, text, bos, 0, &ids, &n) != NV_OK) return cli_error(cmd, 1, "%s", nv_errmsg());
    for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    putchar('\n');
    free(ids);
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *cmd = "tokenize", *path = NULL, *text = NULL;
    int bos = 0, options_done = 0, from_stdin = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!options_done && a[0] == '-' && a[1] != '\0') {
            if (!strcmp(a, "--")) {
                options_done = 1;
            } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
                fputs(tokenize_usage, stdout);
                return 0;
            } else if (!strcmp(a, "-z")) {
                if (!(path = cli_value(cmd, argc, argv, &i))) return 2;
            } else if (!strcmp(a, "--bos")) {
                bos = 1;
            } else if (!strcmp(a, "--null-separated")) {
                from_stdin = 1;
            } else {
                return cli_error(cmd, 2, "unknown option '%s' (see nerve tokenize --help)", a);
            }
        } else if (text) {
            return cli_error(cmd, 2, "one TEXT argument expected, got another: '%s' (quote the text)", a);
        } else {
            text = a;
        }
    }
    if (!path) return cli_error(cmd, 2, "missing -z TOKENIZER (see nerve tokenize --help)");
    if (!text == !from_stdin)
        return cli_error(cmd, 2, from_stdin ? "TEXT and --null-separated exclude each other" : "missing TEXT (see nerve tokenize --help)");

    nv_tokenizer *t;
    if (nv_tokenizer_load(path, 0, &t) != NV_OK) return cli_error(cmd, 1, "%s", nv_errmsg());
    int rc = 0;
    if (text) rc = print_ids(cmd, t, text, bos);
    else {
        char *line = NULL;
        size_t cap = 0;
        ssize_t len;
        while (rc == 0 && (len = getdelim(&line, &cap, '\0', stdin)) > 0) {
            if (line[len - 1] != '\0') line[len] = '\0'; /* the last text, without its NUL */
            rc = print_ids(cmd, t, line, bos);
        }
        free(line);
    }
    nv_tokenizer_free(t);
    if (rc) return rc;
    if (fflush(stdout) != 0 || ferror(stdout)) return cli_error(cmd, 1, "writing the ids failed");
    return 0;
}
