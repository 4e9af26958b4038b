#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int log_level = -1;

void nv_log_set_level(nv_log_level level) { log_level = (int)level; }

static int current_level(void) {
    if (log_level < 0) {
        const char *e = getenv("NERVE_LOG");
        log_level = NV_LOG_INFO;
        if (e) {
            if (!strcmp(e, "debug")) log_level = NV_LOG_DEBUG;
            else if (!strcmp(e, "warn")) log_level = NV_LOG_WARN;
            else if (!strcmp(e, "quiet")) log_level = NV_LOG_QUIET;
        }
    }
    return log_level;
}

void nv_log(nv_log_level level, const char *fmt, ...) {
    if ((int)level < current_level()) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    for (char *p = line; *p; p++) /* one line each, whatever a request put into the message */
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
    fprintf(stderr, "nerve: %s%s\n", level == NV_LOG_WARN ? "warning: " : "", line);
}
