/* A growable byte buffer for building responses and text (always NUL-terminated).
 *
 * Contract: after any failed allocation the buffer is marked failed (oom = 1) and every later
 * append is a no-op, so a caller checks once at the end instead of after every append. */
#ifndef NV_BASE_BUF_H
#define NV_BASE_BUF_H

#include <stddef.h>

typedef struct {
    char *data;
    size_t len, cap;
    int oom;
} nv_buf;

/* qsort's and bsearch's order of C strings held by pointer (strcmp's). */
int nv_strcmp_ptrs(const void *a, const void *b);

void nv_buf_append(nv_buf *b, const void *p, size_t n);
void nv_buf_puts(nv_buf *b, const char *s);
void nv_buf_printf(nv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Drops the first n bytes. */
void nv_buf_consume(nv_buf *b, size_t n);
/* Hands the bytes to the caller (NULL when failed) and resets the buffer. */
char *nv_buf_take(nv_buf *b);
void nv_buf_free(nv_buf *b);

#endif
