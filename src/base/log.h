/* One-line diagnostics on stderr. NERVE_LOG=debug|info|warn|quiet sets the level (info default). */
#ifndef NV_LOG_H
#define NV_LOG_H

typedef enum { NV_LOG_DEBUG = 0, NV_LOG_INFO, NV_LOG_WARN, NV_LOG_QUIET } nv_log_level;

void nv_log(nv_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void nv_log_set_level(nv_log_level level);

#define nv_debug(...) nv_log(NV_LOG_DEBUG, __VA_ARGS__)
#define nv_info(...) nv_log(NV_LOG_INFO, __VA_ARGS__)
#define nv_warn(...) nv_log(NV_LOG_WARN, __VA_ARGS__)

#endif
