/* The process-wide thread pool.
 *
 * Contract: nv_pool_init(threads) starts threads-1 persistent workers (threads <= 0: one per core
 * this process may use, nv_cpu_probe()->cores); the thread that calls nv_pool_run() is the last
 * member of the team. nv_pool_run(fn, ctx, n) calls fn(ctx, task, n) exactly once for every task in
 * 0..n-1, spread over the workers and the caller, and returns when all of them have finished; writes
 * made by a task are visible to the caller afterwards. Tasks must not depend on each other.
 *
 * It is cheap to call thousands of times a second: an idle worker spins briefly (about 50-100 us)
 * on the job counter before blocking on a condition variable. With one thread, a single task, a
 * call from inside a task (nested), or a call while another thread is already running a job on the
 * pool, the tasks simply run inline on the calling thread, in order 0..n-1, so nv_pool_run is
 * always safe to call. Before nv_pool_init (or after nv_pool_shutdown) everything runs inline.
 *
 * nv_pool_init and nv_pool_shutdown are for the start and the end of the program (and tests): call
 * them from one thread while no nv_pool_run is in flight. nv_pool_init on a running pool of a
 * different size shuts it down and starts the new size.
 *
 * Per-thread CPU state (AMX tile configuration) belongs to the thread: a task that uses it sets it
 * up itself on whichever thread it lands. */
#ifndef NV_POOL_H
#define NV_POOL_H

#include "base/err.h"

nv_err nv_pool_init(int threads);
/* Threads in the team, the caller included (1 when the pool is not started). */
int nv_pool_threads(void);
void nv_pool_run(void (*fn)(void *ctx, int task, int n_tasks), void *ctx, int n_tasks);
/* Multiply-adds below which a job runs on the calling thread alone: waking the team costs a few
 * microseconds, about what this much work takes on one core. */
#define NV_POOL_MIN_WORK 65536.0
/* Stops and joins the workers; later runs are inline until the next nv_pool_init. */
void nv_pool_shutdown(void);

#endif
