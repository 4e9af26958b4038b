/* Error codes and the per-thread error message.
 *
 * Contract: a library function that can fail returns an nv_err. On failure it has called
 * nv_fail(), which records one human-readable line for the calling thread; the caller either
 * passes the code up unchanged or, at the CLI boundary, prints nv_errmsg() and exits non-zero.
 * Nothing in the library calls exit(). */
#ifndef NV_ERR_H
#define NV_ERR_H

typedef enum {
    NV_OK = 0,
    NV_EINVAL,       /* bad argument or option */
    NV_EIO,          /* open/read/write/mmap failed */
    NV_EFORMAT,      /* malformed or truncated file / payload */
    NV_ENOMEM,       /* allocation failed or a size would overflow */
    NV_EUNSUPPORTED, /* valid input this build or machine cannot handle */
    NV_ERANGE,       /* value out of the accepted range */
} nv_err;

/* Records a printf-style message for this thread and returns code. */
/* The arguments may include nv_errmsg() itself: a message wraps the one before it in place. */
nv_err nv_fail(nv_err code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The message of the last nv_fail() on this thread ("" if none). */
const char *nv_errmsg(void);
const char *nv_err_name(nv_err code);

#define NV_TRY(expr)                      \
    do {                                  \
        nv_err nv_try_e_ = (expr);        \
        if (nv_try_e_ != NV_OK) return nv_try_e_; \
    } while (0)

#endif
