/* Large buffers: zeroed where asked, aligned, sizes rounded up, overflow refused, and the huge-page
 * advice leaves the memory usable whether or not the kernel takes it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "t.h"

static void test_calloc_large(void) {
    static const size_t sizes[] = {1, 4096, (size_t)9 << 20, ((size_t)24 << 20) + 12};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        unsigned char *p = nv_calloc_large(sizes[s], 1);
        T_CHECK(p != NULL, "%zu bytes", sizes[s]);
        if (!p) continue;
        size_t nonzero = 0;
        for (size_t i = 0; i < sizes[s]; i += 4093) nonzero += p[i] != 0;
        nonzero += p[sizes[s] - 1] != 0;
        T_CHECK(nonzero == 0, "%zu bytes: not zeroed", sizes[s]);
        memset(p, 0x5a, sizes[s]);
        free(p);
    }
}

static void test_alloc_large(void) {
    static const size_t sizes[] = {0, 1, 63, 65, (size_t)10 << 20, ((size_t)10 << 20) + 1};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        unsigned char *p = nv_alloc_large(64, sizes[s], (int)(s & 1));
        T_CHECK(p != NULL && (uintptr_t)p % 64 == 0, "%zu bytes: %p", sizes[s], (void *)p);
        if (!p) continue;
        memset(p, 1, sizes[s] ? (sizes[s] + 63) / 64 * 64 : 64); /* the rounded size is usable */
        free(p);
    }
    T_CHECK(nv_alloc_large(64, SIZE_MAX - 8, 1) == NULL, "a size past SIZE_MAX accepted");
}

int main(void) {
    T_RUN(test_calloc_large);
    T_RUN(test_alloc_large);
    return t_done();
}
