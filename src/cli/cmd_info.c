/* nerve info: the CPU, its run-time features, and which engines are on (and why not). */
#include <stdio.h>
#include <string.h>

#include "base/cpu.h"
#include "cli/cli.h"
#include "engine/engine.h"
#include "train/dist.h"

#define CMD "info"

int cmd_info(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: nerve info\n  prints the CPU, its instruction-set features and the engines found\n");
            return 0;
        }
        return cli_error(CMD, 2, "unknown option '%s'", argv[i]);
    }
    const nv_cpu_info *c = nv_cpu_probe();
    printf("cpu:      %s\n", c->model);
    printf("cores:    %d\n", c->cores);
    printf("memory:   %.1f GiB\n", (double)c->mem_total_bytes / (1024.0 * 1024 * 1024));
    printf("features:");
    struct {
        const char *name;
        int on;
    } f[] = {{"AVX2", c->avx2 && c->os_avx},   {"FMA", c->fma},
             {"AVX-512F", c->avx512f && c->os_avx512}, {"AVX512-BF16", c->avx512_bf16 && c->os_avx512},
             {"AVX512-VNNI", c->avx512_vnni && c->os_avx512}, {"AVX-VNNI", c->avx_vnni && c->os_avx},
             {"AMX-TILE", c->amx_tile},         {"AMX-BF16", c->amx_bf16},
             {"AMX-INT8", c->amx_int8}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) printf(" %s%s", f[i].on ? "+" : "-", f[i].name);
    printf("\n");
    if (c->amx_tile)
        printf("amx:      tile permission %s%s%s\n", c->amx_permission ? "granted" : "not granted",
               c->amx_why[0] ? ": " : "", c->amx_why);
    else
        printf("amx:      not available: %s\n", c->amx_why);
    if (nv_engines_init(NULL, 0) != NV_OK) return cli_error(CMD, 1, "%s", nv_errmsg());
    printf("engines:\n");
    for (int e = 0; e < NV_ENGINE_COUNT; e++) {
        if (nv_engine_available((nv_engine_id)e)) printf("  %-12s on\n", nv_engine_name((nv_engine_id)e));
        else printf("  %-12s off: %s\n", nv_engine_name((nv_engine_id)e), nv_engine_why_off((nv_engine_id)e));
    }
    printf("best:     %s (serve's default; train: %s, generate: %s)\n", nv_engine_name(nv_engine_best()),
           nv_engine_name(nv_engine_best_float()), nv_engine_name(nv_engine_best_fp32()));
    printf("train:    %s\n", nv_dist_built_in() ? "data parallel over processes with OpenMPI (mpirun -np N nerve train ...)"
                                                   : "one process (built without OpenMPI: install libopenmpi-dev and rebuild "
                                                     "for mpirun -np N nerve train)");
    char machine[512], path[4200];
    cli_tune_machine(machine, sizeof machine);
    const int tuned = cli_tune_count(machine, path, sizeof path);
    if (tuned > 0) printf("tune:     %d model%s tuned for this machine and these engines (%s)\n", tuned, tuned > 1 ? "s" : "", path);
    else if (tuned == 0) printf("tune:     no model tuned for this machine yet (nerve tune -m MODEL)\n");
    else if (path[0]) printf("tune:     the tune file %s cannot be read (a file that does not parse: nerve tune keeps it as .bad and writes a new one)\n", path);
    else printf("tune:     no place for a tune file (set NERVE_TUNE_FILE, XDG_CACHE_HOME or HOME)\n");
    return 0;
}
