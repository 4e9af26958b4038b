/* Large buffers (weights, gradients, optimizer moments, activations, packed plans): the allocator's
 * own memory, freed with free(), asked to be backed by 2 MiB pages where the kernel offers them
 * (transparent huge pages in "madvise" mode). A gigabyte then takes 512 page faults instead of
 * 262,144 on first touch, and streaming it misses the TLB far less. Untouched parts stay untouched:
 * nothing here writes the memory. */
#ifndef NV_BASE_MEM_H
#define NV_BASE_MEM_H

#include <stddef.h>

/* calloc(n, size), large buffers advised as above. */
void *nv_calloc_large(size_t n, size_t size);
/* aligned_alloc(align, bytes rounded up to align), not zeroed; advised as above when huge (a buffer
 * that lives long: per-call temporaries skip the system call, and the compaction a huge-page fault
 * may wait for). */
void *nv_alloc_large(size_t align, size_t bytes, int huge);

#endif
