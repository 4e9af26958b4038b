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
/* Zeroed, page-aligned memory that is only address space until written (mmap with MAP_NORESERVE),
 * advised as above, freed with nv_reserve_free(p, bytes): for a model's fp32 block, whose pending
 * matrices are never written, so that a model whose fp32 size exceeds the machine's memory (an 8B
 * model is 32 GB) still loads where its quantized form fits. (Sanitizer builds use calloc, which
 * they watch.) */
void *nv_reserve_zeroed(size_t bytes);
void nv_reserve_free(void *p, size_t bytes);
/* Gives the whole pages inside [p, p + bytes) back to the kernel (MADV_DONTNEED): memory that will
 * not be read again. Read anyway, an anonymous page reads zeros, a private file mapping's the
 * file's bytes. The pages at either end, shared with what lies beside, are kept. */
void nv_mem_release(const void *p, size_t bytes);

#endif
