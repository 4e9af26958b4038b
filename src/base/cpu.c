#include "base/cpu.h"

#include <cpuid.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static nv_cpu_info cpu;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

static unsigned long long read_xcr0(void) {
    unsigned int eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}

static void probe(void) {
    unsigned int a, b, c, d;
    unsigned int max_leaf = __get_cpuid_max(0, NULL);
    int osxsave = 0;
    if (max_leaf >= 1) {
        __cpuid_count(1, 0, a, b, c, d);
        cpu.fma = (c >> 12) & 1;
        cpu.f16c = (c >> 29) & 1;
        osxsave = (c >> 27) & 1;
    }
    if (max_leaf >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        cpu.avx2 = (b >> 5) & 1;
        cpu.avx512f = (b >> 16) & 1;
        cpu.avx512bw = (b >> 30) & 1;
        cpu.avx512vl = (b >> 31) & 1;
        cpu.avx512_vnni = (c >> 11) & 1;
        cpu.amx_bf16 = (d >> 22) & 1;
        cpu.amx_tile = (d >> 24) & 1;
        cpu.amx_int8 = (d >> 25) & 1;
        __cpuid_count(7, 1, a, b, c, d);
        cpu.avx_vnni = (a >> 4) & 1;
        cpu.avx512_bf16 = (a >> 5) & 1;
    }
    if (osxsave) {
        unsigned long long xcr0 = read_xcr0();
        cpu.os_avx = (xcr0 & 0x6) == 0x6;                 /* SSE + AVX state */
        cpu.os_avx512 = cpu.os_avx && (xcr0 & 0xe0) == 0xe0; /* opmask, ZMM_Hi256, Hi16_ZMM */
        cpu.os_amx = (xcr0 & 0x60000) == 0x60000;          /* XTILECFG + XTILEDATA */
    }
    if (!cpu.amx_tile) snprintf(cpu.amx_why, sizeof cpu.amx_why, "CPU has no AMX (CPUID.7.0:EDX[24] clear)");
    else if (!cpu.os_avx || !cpu.os_amx) snprintf(cpu.amx_why, sizeof cpu.amx_why, "OS does not enable AMX tile state (XCR0)");
    else {
        long r = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
        unsigned long long perm = 0;
        if (r == 0 && syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &perm) == 0 &&
            (perm & (1ull << XFEATURE_XTILEDATA)))
            cpu.amx_permission = 1;
        else
            snprintf(cpu.amx_why, sizeof cpu.amx_why, "kernel refused arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)");
    }

    /* Brand string, trimmed. */
    char brand[49] = {0};
    if (__get_cpuid_max(0x80000000, NULL) >= 0x80000004) {
        for (unsigned int i = 0; i < 3; i++) {
            __cpuid(0x80000002 + i, a, b, c, d);
            memcpy(brand + 16 * i, &a, 4);
            memcpy(brand + 16 * i + 4, &b, 4);
            memcpy(brand + 16 * i + 8, &c, 4);
            memcpy(brand + 16 * i + 12, &d, 4);
        }
    }
    char *s = brand;
    while (*s == ' ') s++;
    size_t n = strlen(s);
    while (n && s[n - 1] == ' ') s[--n] = '\0';
    snprintf(cpu.model, sizeof cpu.model, "%s", *s ? s : "unknown x86-64");

    /* Cores this process may run on (a container or taskset may allow fewer than are online). */
    cpu_set_t set;
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) nc = CPU_COUNT(&set);
    cpu.cores = nc > 0 ? (int)nc : 1;
    struct sysinfo si;
    if (sysinfo(&si) == 0) cpu.mem_total_bytes = (unsigned long long)si.totalram * si.mem_unit;
}

const nv_cpu_info *nv_cpu_probe(void) {
    pthread_once(&cpu_once, probe);
    return &cpu;
}
