/* Monotonic wall-clock time. */
#ifndef NV_TIMER_H
#define NV_TIMER_H

#include <time.h>

static inline double nv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
