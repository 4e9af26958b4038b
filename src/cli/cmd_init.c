/* nerve init: write a randomly initialised llama2.c version-1 checkpoint of a preset shape. */
#include <stdio.h>
#include <string.h>

#include "base/pool.h"
#include "cli/cli.h"
#include "model/model.h"

#define CMD "init"

static void usage(FILE *f) {
    fprintf(f,
            "usage: nerve init --preset NAME [--seq-len N] [--seed S] -o FILE\n"
            "  --preset NAME  one of: %s\n"
            "  --seq-len N    context length (default: the preset's)\n"
            "  --seed S       initialisation seed (default 1)\n"
            "  -o FILE        output llama2.c v1 checkpoint (written atomically)\n",
            nv_config_preset_names());
}

int cmd_init(int argc, char **argv) {
    const char *preset = NULL, *out = NULL;
    int seq_len = 0;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!(v = cli_value(CMD, argc, argv, &i))) return 2;
        if (!strcmp(a, "--preset")) preset = v;
        else if (!strcmp(a, "--seq-len")) { if (!cli_int(CMD, a, v, 1, 1 << 22, &seq_len)) return 2; }
        else if (!strcmp(a, "--seed")) { if (!cli_u64(CMD, a, v, &seed)) return 2; }
        else if (!strcmp(a, "-o")) out = v;
        else return cli_error(CMD, 2, "unknown option '%s' (see nerve init --help)", a);
    }
    if (!preset || !out) return cli_error(CMD, 2, "--preset and -o are required (see nerve init --help)");
    nv_config c;
    if (nv_config_preset(preset, &c) != NV_OK) return cli_error(CMD, 2, "%s", nv_errmsg());
    if (seq_len) c.seq_len = seq_len;
    nv_model m;
    if (nv_model_alloc(&m, &c) != NV_OK) return cli_error(CMD, 1, "%s", nv_errmsg());
    nv_pool_init(0); /* the initial weights are drawn on every core (the same values on any count) */
    nv_model_init_random(&m, seed);
    nv_err e = nv_model_save_v1(&m, out);
    nv_model_free(&m);
    if (e != NV_OK) return cli_error(CMD, 1, "%s", nv_errmsg());
    fprintf(stderr, "nerve: wrote %s (%s, %.2fM parameters, context %d)\n", out, preset,
            (double)nv_config_param_count(&c) / 1e6, c.seq_len);
    return 0;
}
