/* nerve init: write a randomly initialised model of a preset shape (llama2.c version 1, or GGUF),
 * optionally as a mixture of experts of that FFN shape. */
#include <stdio.h>
#include <string.h>

#include "base/pool.h"
#include "cli/cli.h"
#include "model/gguf.h"
#include "model/model.h"

#define CMD "init"

static void usage(FILE *f) {
    fprintf(f,
            "usage: nerve init --preset NAME [--seq-len N] [--experts N [--experts-used K]] [--seed S] -o FILE\n"
            "  --preset NAME      one of: %s\n"
            "  --seq-len N        context length (default: the preset's)\n"
            "  --experts N        a mixture of N experts of the preset's FFN in every layer (GGUF only)\n"
            "  --experts-used K   experts each token runs (default 2)\n"
            "  --seed S           initialisation seed (default 1)\n"
            "  -o FILE            output: a llama2.c v1 checkpoint, or F32 GGUF when FILE ends in .gguf\n"
            "                     (written atomically)\n",
            nv_config_preset_names());
}

int cmd_init(int argc, char **argv) {
    const char *preset = NULL, *out = NULL;
    int seq_len = 0, experts = 0, used = 0;
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
        else if (!strcmp(a, "--experts")) { if (!cli_int(CMD, a, v, 1, NV_MOE_MAX_EXPERTS, &experts)) return 2; }
        else if (!strcmp(a, "--experts-used")) { if (!cli_int(CMD, a, v, 1, NV_MOE_MAX_EXPERTS, &used)) return 2; }
        else if (!strcmp(a, "-o")) out = v;
        else return cli_error(CMD, 2, "unknown option '%s' (see nerve init --help)", a);
    }
    if (!preset || !out) return cli_error(CMD, 2, "--preset and -o are required (see nerve init --help)");
    if (cli_experts(CMD, experts, &used)) return 2;
    nv_config c;
    if (nv_config_preset(preset, &c) != NV_OK) return cli_error(CMD, 2, "%s", nv_errmsg());
    if (seq_len) c.seq_len = seq_len;
    if (experts) c.n_experts = experts, c.n_experts_used = used;
    if (nv_config_validate(&c) != NV_OK) return cli_error(CMD, 2, "%s", nv_errmsg());
    const size_t ol = strlen(out);
    const int gguf = ol > 5 && !strcmp(out + ol - 5, ".gguf");
    nv_model m;
    if (nv_model_alloc(&m, &c) != NV_OK) return cli_error(CMD, 1, "%s", nv_errmsg());
    nv_pool_init(0); /* the initial weights are drawn on every core (the same values on any count) */
    nv_model_init_random(&m, seed);
    nv_err e = gguf ? nv_gguf_save(&m, NULL, preset, out, NV_GGUF_F32, NULL, NULL) : nv_model_save_v1(&m, out);
    nv_model_free(&m);
    if (e != NV_OK) return cli_error(CMD, 1, "%s", nv_errmsg());
    char moe[64] = "";
    if (experts) snprintf(moe, sizeof moe, ", %d experts, %d a token", experts, used);
    fprintf(stderr, "nerve: wrote %s (%s%s, %.2fM parameters, context %d)\n", out, preset, moe,
            (double)nv_config_param_count(&c) / 1e6, c.seq_len);
    return 0;
}
