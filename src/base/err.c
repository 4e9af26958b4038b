#include "base/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char err_message[1024];

nv_err nv_fail(nv_err code, const char *fmt, ...) {
    /* formatted aside first: an argument may be nv_errmsg() itself, the message being wrapped */
    char text[sizeof err_message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    memcpy(err_message, text, sizeof text);
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
