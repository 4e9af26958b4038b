/* nerve export: a training checkpoint's weights as a llama2.c checkpoint `nerve generate` reads. */
#include <stdio.h>
#include <string.h>

#include "base/file.h"
#include "cli/cli.h"
#include "model/model.h"
#include "train/ckpt.h"

#define CMD "export"

int cmd_export(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: nerve export CHECKPOINT|RUN_DIR -o model.bin\n"
                   "  writes the weights of a training checkpoint as a llama2.c version-1 checkpoint\n");
            return 0;
        }
        if (a[0] != '-') {
            if (in) return cli_error(CMD, 2, "one checkpoint at a time");
            in = a;
            continue;
        }
        if (!(v = cli_value(CMD, argc, argv, &i))) return 2;
        if (!strcmp(a, "-o")) out = v;
        else return cli_error(CMD, 2, "unknown option '%s'", a);
    }
    if (!in || !out) return cli_error(CMD, 2, "usage: nerve export CHECKPOINT|RUN_DIR -o model.bin");
    char path[4200];
    snprintf(path, sizeof path, "%s", in);
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/ckpt.bin", in);
    if (nv_file_exists(probe)) snprintf(path, sizeof path, "%s", probe);
    nv_ckpt ck;
    if (nv_ckpt_load(path, &ck) != NV_OK) return cli_error(CMD, 1, "%s", nv_errmsg());
    nv_model m = {0};
    nv_ckpt_header_get_config(&ck.h, &m.config);
    m.params = (float *)ck.params; /* read only: the writer only reads it */
    m.n_params = ck.h.n_params;
    long long step = (long long)ck.h.step;
    nv_err e = nv_model_save_v1(&m, out);
    nv_ckpt_close(&ck);
    if (e) return cli_error(CMD, 1, "%s", nv_errmsg());
    fprintf(stderr, "nerve: wrote %s (step %lld)\n", out, step);
    return 0;
}
