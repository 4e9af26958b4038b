/* nerve pull: a model from the Hugging Face Hub into the cache (hub.h), its local path printed. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/hub.h"

#define CMD "pull"

int cmd_pull(int argc, char **argv) {
    cli_hub_ref ref = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: nerve pull USER/NAME[:TAG] [--hf-file FILE] [--hf-token TOKEN]\n"
                   "  downloads a model from the Hugging Face Hub into $XDG_CACHE_HOME/nerve/hub (else\n"
                   "  ~/.cache/nerve/hub) and prints where it is; `-hf USER/NAME[:TAG]` on generate, chat, serve,\n"
                   "  perplexity, export, info and train (--init-from's model) does the same before loading it. A GGUF repository gives the file\n"
                   "  whose name holds TAG (Q4_K_M when none is given, else any GGUF file; the shortest such name;\n"
                   "  every file of a split model), or --hf-file's; one without GGUF files its transformers folder (config,\n"
                   "  tokenizer, safetensors weights). Downloads resume where they stopped and are checked against\n"
                   "  the Hub's sizes and SHA-256 sums; a file already fetched is not fetched again.\n"
                   "  $HF_TOKEN (or --hf-token): a token for gated or private repositories; $HF_ENDPOINT: another\n"
                   "  endpoint (default https://huggingface.co); $HF_HUB_OFFLINE=1: the cache alone\n");
            return 0;
        }
        const int hf = cli_hub_flag(CMD, argc, argv, &i, &ref);
        if (hf < 0) return 2;
        if (hf) continue;
        if (a[0] == '-') return cli_error(CMD, 2, "unknown option '%s'", a);
        if (ref.repo) return cli_error(CMD, 2, "one repository at a time");
        ref.repo = a;
    }
    if (!ref.repo) return cli_error(CMD, 2, "usage: nerve pull USER/NAME[:TAG] [--hf-file FILE]");
    char path[4400];
    const char *model = NULL;
    const int rc = cli_hub_fetch(CMD, &ref, &model, path, sizeof path);
    if (!rc) printf("%s\n", path);
    return rc;
}
