#include "base/err.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char err_message[1024];

nv_err nv_fail(nv_err code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_message, sizeof err_message, fmt, ap);
    va_end(ap);
    return code;
}

const char *nv_errmsg(void) { return err_message; }

const char *nv_err_name(nv_err code) {
    switch (code) {
    case NV_OK: return "ok";
    case NV_EINVAL: return "invalid argument";
    case NV_EIO: return "i/o error";
    case NV_EFORMAT: return "malformed input";
    case NV_ENOMEM: return "out of memory";
    case NV_EUNSUPPORTED: return "unsupported";
    case NV_ERANGE: return "out of range";
    }
    return "unknown error";
}
