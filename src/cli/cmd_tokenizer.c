/* nerve tokenizer train: learn a byte-fallback BPE vocabulary from text files and write it in
 * llama2.c's tokenizer.bin format (see model/bpe_train.h for the rules). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/file.h"
#include "base/timer.h"
#include "cli/cli.h"
#include "model/bpe_train.h"
#include "train/data.h"

static const char *const tokenizer_usage =
    "usage: nerve tokenizer train --vocab N [--max-chars M] -o OUT TEXT|FOLDER...\n"
    "  TEXT, FOLDER    text files, or folders: every text file under them in path order, as nerve train\n"
    "                  --data reads a folder (hidden, linked, binary and .bin/.u32/.jsonl files left out);\n"
    "                  a .jsonl file of {\"text\": ...} lines named: its texts, one a line\n"
    "  --vocab N       tokens in all: 259 reserved (<unk>, <s>, </s>, 256 byte tokens), one per\n"
    "                  character kept from the text, then learned pieces\n"
    "  --max-chars M   read at most the first M bytes of text, all files together (cut at a\n"
    "                  character boundary); default: all of it\n"
    "  -o OUT          the tokenizer.bin to write (atomically)\n"
    "Lines are sentences with a leading space, as SentencePiece does; \"<|endoftext|>\" ends a\n"
    "line and is dropped. The output loads with -z in every nerve command.\n";

/* Appends the files of path (a folder's text files in order, or the file itself) to all, owned by it. */
static nv_err add_text_path(nv_text_files *all, const char *path) {
    nv_text_files one = {0};
    if (nv_file_is_dir(path)) {
        NV_TRY(nv_data_text_files(path, &one));
    } else {
        one.paths = malloc(sizeof *one.paths);
        if (one.paths) one.paths[0] = strdup(path);
        if (!one.paths || !one.paths[0]) {
            free(one.paths);
            return nv_fail(NV_ENOMEM, "out of memory");
        }
        one.n = one.cap = 1;
    }
    char **grown = realloc(all->paths, (all->n + one.n) * sizeof *grown);
    if (!grown) {
        nv_text_files_free(&one);
        return nv_fail(NV_ENOMEM, "out of memory");
    }
    all->paths = grown;
    memcpy(all->paths + all->n, one.paths, one.n * sizeof *one.paths);
    all->n += one.n, all->cap = all->n;
    free(one.paths); /* (its strings are all's now) */
    return NV_OK;
}

/* A .jsonl file's text lines, each "text" a line of the buffer (nv_data_jsonl_each_text). */
static nv_err jsonl_line_text(void *ctx, const char *text, size_t n) {
    nv_buf *b = ctx;
    nv_buf_append(b, text, n);
    nv_buf_append(b, "\n", 1);
    return b->oom ? nv_fail(NV_ENOMEM, "out of memory") : NV_OK;
}

nv_err cli_bpe_train_paths(const char *const *paths, int n_paths, int vocab, uint64_t max_chars, nv_bpe_result *r) {
    memset(r, 0, sizeof *r);
    nv_text_files files = {0}; /* the text files of the paths given, folders opened */
    nv_err e = NV_OK;
    for (int i = 0; i < n_paths && e == NV_OK; i++) e = add_text_path(&files, paths[i]);
    const size_t n = files.n;
    nv_mapped *maps = e == NV_OK ? calloc(n ? n : 1, sizeof *maps) : NULL;
    nv_buf *lines = e == NV_OK ? calloc(n ? n : 1, sizeof *lines) : NULL; /* a .jsonl file of text lines: their texts */
    nv_iov *texts = e == NV_OK ? calloc(n ? n : 1, sizeof *texts) : NULL;
    if (e == NV_OK && (!maps || !lines || !texts)) e = nv_fail(NV_ENOMEM, "out of memory");
    for (size_t i = 0; e == NV_OK && i < n; i++) {
        const char *p = files.paths[i];
        if (nv_data_jsonl_is_text(p)) {
            e = nv_data_jsonl_each_text(p, jsonl_line_text, &lines[i]);
            texts[i] = (nv_iov){lines[i].data, lines[i].len};
        } else if ((e = nv_file_map_data(p, &maps[i])) == NV_OK) {
            texts[i] = (nv_iov){maps[i].data, maps[i].len};
        }
    }
    int n_texts = 0;
    uint64_t budget = max_chars;
    for (size_t i = 0; e == NV_OK && i < n && budget > 0; i++) {
        const uint8_t *data = texts[i].ptr;
        size_t len = texts[i].len;
        if ((uint64_t)len > budget) {
            len = (size_t)budget;
            /* never split a character: back up to the start of the one that was cut */
            for (int k = 0; k < 3 && len > 0 && (data[len] & 0xC0) == 0x80; k++) len--;
            budget = 0;
        } else {
            budget -= (uint64_t)len;
        }
        texts[n_texts++] = (nv_iov){data, len};
    }
    if (e == NV_OK) {
        nv_bpe_opts o = {.vocab_size = vocab};
        e = nv_bpe_train(texts, n_texts, &o, r);
    }
    for (size_t i = 0; maps && i < n; i++)
        if (maps[i].data) nv_file_unmap(&maps[i]);
    for (size_t i = 0; lines && i < n; i++) nv_buf_free(&lines[i]);
    free(maps);
    free(lines);
    free(texts);
    nv_text_files_free(&files);
    return e;
}

static int tokenizer_train(int argc, char **argv) {
    const char *cmd = "tokenizer", *out_path = NULL;
    int vocab = 0, options_done = 0, n_paths = 0;
    uint64_t max_chars = UINT64_MAX;
    int rc = 2;
    const char **paths = calloc((size_t)argc, sizeof *paths);
    if (!paths) return cli_error(cmd, 1, "out of memory");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!options_done && a[0] == '-' && a[1] != '\0') {
            if (!strcmp(a, "--")) {
                options_done = 1;
            } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
                fputs(tokenizer_usage, stdout);
                free(paths);
                return 0;
            } else if (!strcmp(a, "--vocab")) {
                const char *v = cli_value(cmd, argc, argv, &i);
                if (!v || !cli_int(cmd, "--vocab", v, NV_BPE_RESERVED + 1, NV_BPE_MAX_VOCAB, &vocab)) goto done;
            } else if (!strcmp(a, "--max-chars")) {
                const char *v = cli_value(cmd, argc, argv, &i);
                if (!v || !cli_u64(cmd, "--max-chars", v, &max_chars)) goto done;
                if (max_chars == 0) {
                    cli_error(cmd, 2, "--max-chars must be at least 1");
                    goto done;
                }
            } else if (!strcmp(a, "-o")) {
                if (!(out_path = cli_value(cmd, argc, argv, &i))) goto done;
            } else {
                cli_error(cmd, 2, "unknown option '%s' (see nerve tokenizer --help)", a);
                goto done;
            }
        } else {
            paths[n_paths++] = a;
        }
    }
    if (!vocab) {
        cli_error(cmd, 2, "missing --vocab N (see nerve tokenizer --help)");
        goto done;
    }
    if (!out_path) {
        cli_error(cmd, 2, "missing -o OUT (see nerve tokenizer --help)");
        goto done;
    }
    if (!n_paths) {
        cli_error(cmd, 2, "missing TEXT files to train on (see nerve tokenizer --help)");
        goto done;
    }

    rc = 1;
    double t0 = nv_now();
    nv_bpe_result r;
    nv_err e = cli_bpe_train_paths(paths, n_paths, vocab, max_chars, &r);
    double secs = nv_now() - t0;
    if (e != NV_OK) {
        rc = cli_error(cmd, e == NV_ERANGE ? 2 : 1, "%s", nv_errmsg());
        goto done;
    }
    nv_iov part = {r.data, r.len};
    e = nv_file_write_atomic(out_path, &part, 1);
    if (e != NV_OK) {
        cli_error(cmd, 1, "%s", nv_errmsg());
    } else {
        if (r.n_tokens < vocab)
            fprintf(stderr, "nerve tokenizer: note: no pair occurs twice any more; wrote %d tokens, not %d\n", r.n_tokens,
                    vocab);
        printf("wrote %s: %d tokens (%d characters, %d learned pieces; %d rare characters left to the byte fallback) "
               "from %llu bytes, %llu distinct words, in %.2f s\n",
               out_path, r.n_tokens, r.n_chars, r.n_learned, r.n_dropped, (unsigned long long)r.n_bytes,
               (unsigned long long)r.n_words, secs);
        rc = 0;
    }
    nv_bpe_result_free(&r);
done:
    free(paths);
    return rc;
}

int cmd_tokenizer(int argc, char **argv) {
    if (argc < 2) return cli_error("tokenizer", 2, "missing subcommand: nerve tokenizer train --vocab N -o OUT TEXT... (see --help)");
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        fputs(tokenizer_usage, stdout);
        return 0;
    }
    if (!strcmp(argv[1], "train")) return tokenizer_train(argc - 1, argv + 1);
    return cli_error("tokenizer", 2, "unknown subcommand '%s' (only 'train'; see nerve tokenizer --help)", argv[1]);
}
