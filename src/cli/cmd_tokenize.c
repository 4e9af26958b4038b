/* nerve tokenize: print the ids llama2.c's encoder gives a text, to compare tokenizers; or write
 * text files' tokens, as nerve train reads them, into a shard it takes without tokenizing again. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/pool.h"
#include "base/timer.h"
#include "cli/cli.h"
#include "model/tokenizer.h"
#include "train/data.h"

static const char *const tokenize_usage =
    "usage: nerve tokenize -z TOKENIZER [--bos] [--] TEXT\n"
    "       nerve tokenize -z TOKENIZER [--bos] --null-separated < TEXTS\n"
    "       nerve tokenize -z TOKENIZER [--threads N] -o SHARD.bin|SHARD.u32 FILE...\n"
    "  -z TOKENIZER       tokenizer in llama2.c tokenizer.bin format, a GGUF file's vocabulary, or a Hugging Face tokenizer.json\n"
    "  --bos              prepend the vocabulary's BOS id (where it asks for one: llama2.c's always)\n"
    "  --null-separated   read the texts from stdin, each ended by a NUL byte (or the end of input)\n"
    "  -o SHARD           write the tokens of the text FILEs, read as nerve train reads them (documents split\n"
    "                     at blank lines, each from BOS), to a shard nerve train --data takes without\n"
    "                     tokenizing again: .bin llama2.c's uint16 (vocabularies up to 65,536), .u32 uint32\n"
    "  --threads N        threads tokenizing (default: one per core)\n"
    "Prints the ids of each TEXT space-separated on one line (no EOS).\n";

/* -o: the files' tokens through nerve train's reader, written whole and atomically. */
static int write_shard(const char *cmd, const char *tok_path, const char *out, const char *const *files, int n, int threads) {
    const size_t ol = strlen(out);
    const int width = ol > 4 && !strcmp(out + ol - 4, ".bin") ? 2 : ol > 4 && !strcmp(out + ol - 4, ".u32") ? 4 : 0;
    if (!width) return cli_error(cmd, 2, "-o %s: a shard is named .bin (uint16) or .u32 (uint32)", out);
    for (int i = 0; i < n; i++)
        if (nv_data_jsonl_is_turns(files[i]))
            return cli_error(cmd, 2, "%s: chat data is rendered by nerve train itself (give it to --data as it is)", files[i]);
    nv_tokenizer *t = NULL;
    if (nv_tokenizer_load(tok_path, 0, &t) != NV_OK) return cli_error(cmd, 1, "%s", nv_errmsg());
    const int vocab = nv_tokenizer_vocab_size(t);
    if (width == 2 && vocab > 65536) {
        nv_tokenizer_free(t);
        return cli_error(cmd, 2, "-o %s: %d tokens do not fit uint16: name the shard .u32", out, vocab);
    }
    if (nv_pool_init(threads) != NV_OK) {
        nv_tokenizer_free(t);
        return cli_error(cmd, 1, "%s", nv_errmsg());
    }
    nv_dataset ds;
    const double t0 = nv_now();
    int rc = 0;
    if (nv_dataset_open(&ds, files, n, t, vocab, 0.0f) != NV_OK) {
        rc = cli_error(cmd, 1, "%s", nv_errmsg());
        nv_tokenizer_free(t);
        return rc;
    }
    const double secs = nv_now() - t0;
    uint64_t total = 0;
    for (int i = 0; i < ds.n_src; i++) total += ds.src[i].n_tokens;
    uint8_t *buf = malloc(total ? total * (uint64_t)width : 1);
    if (!buf) rc = cli_error(cmd, 1, "out of memory for %llu tokens", (unsigned long long)total);
    uint64_t k = 0; /* corpora pass 2^31 tokens */
    for (int i = 0; i < ds.n_src && buf; i++) /* little-endian, as llama2.c's shards */
        for (uint64_t j = 0; j < ds.src[i].n_tokens; j++, k++) {
            const uint32_t v = nv_source_token(&ds.src[i], j);
            if (width == 2) buf[2 * k] = (uint8_t)v, buf[2 * k + 1] = (uint8_t)(v >> 8);
            else for (int b = 0; b < 4; b++) buf[4 * k + (uint64_t)b] = (uint8_t)(v >> (8 * b));
        }
    nv_iov part = {buf, total * (uint64_t)width};
    if (buf && nv_file_write_atomic(out, &part, 1) != NV_OK) rc = cli_error(cmd, 1, "%s", nv_errmsg());
    if (!rc)
        fprintf(stderr, "nerve tokenize: %llu tokens from %d file%s in %.2f s (%d thread%s) -> %s (%.1f MB)\n", (unsigned long long)total,
                n, n == 1 ? "" : "s", secs, nv_pool_threads(), nv_pool_threads() == 1 ? "" : "s", out,
                (double)total * width / 1e6);
    free(buf);
    nv_dataset_close(&ds);
    nv_tokenizer_free(t);
    return rc;
}

static int print_ids(const char *cmd, const nv_tokenizer *t, const char *text, int bos) {
    int *ids, n;
    if (nv_tokenizer_encode(t, text, bos, 0, &ids, &n) != NV_OK) return cli_error(cmd, 1, "%s", nv_errmsg());
    for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    putchar('\n');
    free(ids);
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *cmd = "tokenize", *path = NULL, *out = NULL;
    const char **args = calloc((size_t)argc + 1, sizeof *args); /* TEXT, or -o's files */
    int bos = 0, options_done = 0, from_stdin = 0, n_args = 0, threads = 0, rc = -1;
    if (!args) return cli_error(cmd, 1, "out of memory");
    for (int i = 1; i < argc && rc < 0; i++) {
        const char *a = argv[i];
        if (!options_done && a[0] == '-' && a[1] != '\0') {
            if (!strcmp(a, "--")) {
                options_done = 1;
            } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
                fputs(tokenize_usage, stdout);
                rc = 0;
            } else if (!strcmp(a, "-z") || !strcmp(a, "-o") || !strcmp(a, "--threads")) {
                const char *v = cli_value(cmd, argc, argv, &i);
                if (!v) rc = 2;
                else if (a[1] == 'z') path = v;
                else if (a[1] == 'o') out = v;
                else if (!cli_int(cmd, a, v, 1, 1024, &threads)) rc = 2;
            } else if (!strcmp(a, "--bos")) {
                bos = 1;
            } else if (!strcmp(a, "--null-separated")) {
                from_stdin = 1;
            } else {
                rc = cli_error(cmd, 2, "unknown option '%s' (see nerve tokenize --help)", a);
            }
        } else {
            args[n_args++] = a;
        }
    }
    if (rc < 0 && !path) rc = cli_error(cmd, 2, "missing -z TOKENIZER (see nerve tokenize --help)");
    if (rc < 0 && out) {
        rc = !n_args ? cli_error(cmd, 2, "-o writes the tokens of text files: name at least one")
             : bos || from_stdin ? cli_error(cmd, 2, "-o takes files, not --bos or --null-separated (each document starts with BOS)")
                                 : write_shard(cmd, path, out, args, n_args, threads);
    }
    if (rc < 0 && n_args > 1) rc = cli_error(cmd, 2, "one TEXT argument expected, got another: '%s' (quote the text)", args[1]);
    const char *text = n_args ? args[0] : NULL;
    free(args);
    if (rc >= 0) return rc;
    if (!text == !from_stdin)
        return cli_error(cmd, 2, from_stdin ? "TEXT and --null-separated exclude each other" : "missing TEXT (see nerve tokenize --help)");

    nv_tokenizer *t;
    if (nv_tokenizer_load(path, 0, &t) != NV_OK) return cli_error(cmd, 1, "%s", nv_errmsg());
    rc = 0;
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
