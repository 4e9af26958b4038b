/* Models from the Hugging Face Hub, as llama.cpp's -hf and vLLM's model ids fetch them: a
 * repository's GGUF file (by quantization tag) or its transformers folder, downloaded once into a
 * cache and loaded from there.
 *
 * Contract:
 * - The repository's file list ({endpoint}/api/models/USER/NAME?blobs=true; $HF_ENDPOINT, else
 *   https://huggingface.co) picks the files: with --hf-file that file; else the GGUF file whose
 *   name holds the tag (REPO:TAG, case-insensitive, bounded by other characters than letters, digits
 *   and '_'), Q4_K_M without one, else any GGUF file, the shortest name first (mmproj files never); every split file of
 *   a split model; a repository without GGUF files is a transformers folder: its .json and .jinja
 *   files and the weights model.safetensors.index.json names (else model.safetensors, else every
 *   .safetensors file at its top). Names that would leave the cache ("..", absolute, control
 *   characters) are refused.
 * - Each file goes to $XDG_CACHE_HOME/nerve/hub/USER/NAME/FILE (else ~/.cache/nerve/hub/...),
 *   through FILE.part, resumed with a Range request where one is left, checked against the size and
 *   (LFS files) the SHA-256 the list gives, then renamed: a failed or stopped download never leaves
 *   a file that looks whole. A file already there with the listed size (and, an LFS file, the SHA-256
 *   it was fetched with, kept beside it as .NAME.sha256) is not fetched again; one the repository
 *   changed is.
 * - Offline ($HF_HUB_OFFLINE=1, or the list unreachable): the files the last fetch of that
 *   repository and tag chose, if they are all there, with a warning; else an error.
 * - $HF_TOKEN (or --hf-token) is sent as a bearer token to the endpoint (curl keeps it from the hosts
 *   a download is redirected to). */
#ifndef NV_CLI_HUB_H
#define NV_CLI_HUB_H

#include <stddef.h>

/* The flags' lines of a command's --help. */
#define CLI_HUB_USAGE                                                                                              \
    "  -hf USER/NAME[:TAG]  a model on the Hugging Face Hub, downloaded once into the cache (nerve pull --help;\n" \
    "                 --hf-file FILE, --hf-token TOKEN)\n"

typedef struct {
    const char *repo;  /* -hf USER/NAME[:TAG] */
    const char *file;  /* -hff: a file of the repository, or NULL */
    const char *token; /* --hf-token, or NULL ($HF_TOKEN) */
} cli_hub_ref;

/* -hf/--hf-repo, -hff/--hf-file and --hf-token with their values into ref: 1 when argv[*i] is one of
 * them (*i moved past its value), 0 when not, -1 after a usage error on stderr. */
int cli_hub_flag(const char *cmd, int argc, char **argv, int *i, cli_hub_ref *ref);
/* With -hf: the model ref names in the cache (fetched as needed), its GGUF file or its folder, into
 * path, and *model_path = path; without, nothing (--hf-file or --hf-token alone: a usage error). 0,
 * or an exit status after one line on stderr; -m (*model_path) beside -hf is a usage error. */
int cli_hub_fetch(const char *cmd, const cli_hub_ref *ref, const char **model_path, char *path, size_t cap);

#endif
