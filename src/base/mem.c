#include "base/mem.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define HUGE_PAGE ((size_t)2 << 20)

/* Advises the whole 2 MiB pages inside [p, p + bytes). Below a few huge pages it is not worth a
 * system call; a kernel without THP refuses the advice, which changes nothing. */
static void advise_huge(void *p, size_t bytes) {
    if (!p || bytes < 4 * HUGE_PAGE) return;
    const uintptr_t lo = ((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1);
    const uintptr_t hi = ((uintptr_t)p + bytes) & ~(uintptr_t)(HUGE_PAGE - 1);
#ifdef MADV_HUGEPAGE
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
    (void)lo, (void)hi;
#endif
}

void *nv_calloc_large(size_t n, size_t size) {
    void *p = calloc(n, size);
    if (p) advise_huge(p, n * size); /* calloc checked n * size for overflow */
    return p;
}

#if defined(__SANITIZE_ADDRESS__)
#define NV_RESERVE_CALLOC 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NV_RESERVE_CALLOC 1
#endif
#endif

void *nv_reserve_zeroed(size_t bytes) {
#ifdef NV_RESERVE_CALLOC
    return nv_calloc_large(bytes ? bytes : 1, 1);
#else
    void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return NULL;
    advise_huge(p, bytes);
    return p;
#endif
}

void nv_reserve_free(void *p, size_t bytes) {
    if (!p) return;
#ifdef NV_RESERVE_CALLOC
    (void)bytes;
    free(p);
#else
    munmap(p, bytes ? bytes : 1);
#endif
}

void *nv_alloc_large(size_t align, size_t bytes, int huge) {
    if (bytes == 0) bytes = align;
    if (bytes > SIZE_MAX - align) return NULL;
    bytes = (bytes + align - 1) / align * align;
    void *p = aligned_alloc(align, bytes);
    if (huge) advise_huge(p, bytes);
    return p;
}

void nv_mem_release(const void *p, size_t bytes) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = ((uintptr_t)p + page - 1) & ~(page - 1), hi = ((uintptr_t)p + bytes) & ~(page - 1);
    if (p && hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}
