#include "base/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "base/cpu.h"
#include "base/log.h"

/* A job lives on the stack of the nv_pool_run call that posted it. Workers find it through
 * pool.job; a worker announces itself in pool.users *before* reading pool.job, and the caller
 * retires the job (pool.job = NULL) and then waits for pool.users to drain, so no worker can touch
 * a job after its call returned (all of these are sequentially consistent atomics). */
typedef struct {
    void (*fn)(void *ctx, int task, int n_tasks);
    void *ctx;
    int n;
    atomic_int next; /* next task to hand out */
    atomic_int done; /* tasks finished */
} pool_job;

#define SPIN_WORKER 4000 /* pause iterations an idle worker spins before blocking */
#define SPIN_YIELD 2000  /* pause iterations a waiting caller spins before yielding */

static struct {
    int threads; /* team size, caller included; 0/1 = inline */
    int started; /* workers actually running */
    pthread_t *tids;
    atomic_uint gen;         /* bumped once per posted job */
    _Atomic(pool_job *) job; /* the job in flight, NULL when none */
    atomic_int users;        /* workers between announcing themselves and leaving a job */
    atomic_int stop;
    atomic_int sleepers; /* workers blocked (or about to block) on cv */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_mutex_t run_mu; /* one job at a time */
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .run_mu = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local int in_task; /* this thread is a worker, or the caller running its share */

static inline void cpu_relax(void) { __builtin_ia32_pause(); }

static void job_work(pool_job *j) {
    for (;;) {
        int t = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (t >= j->n) break;
        j->fn(j->ctx, t, j->n);
        atomic_fetch_add_explicit(&j->done, 1, memory_order_release);
    }
}

static void *worker_main(void *arg) {
    (void)arg;
    in_task = 1;
    unsigned seen = atomic_load(&pool.gen);
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load(&pool.gen)) == seen && !atomic_load(&pool.stop)) {
            if (++spins < SPIN_WORKER) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&pool.mu);
            atomic_fetch_add(&pool.sleepers, 1);
            while (atomic_load(&pool.gen) == seen && !atomic_load(&pool.stop)) pthread_cond_wait(&pool.cv, &pool.mu);
            atomic_fetch_sub(&pool.sleepers, 1);
            pthread_mutex_unlock(&pool.mu);
            spins = 0;
        }
        if (atomic_load(&pool.stop)) break;
        seen = g;
        atomic_fetch_add(&pool.users, 1);
        pool_job *j = atomic_load(&pool.job);
        if (j) job_work(j);
        atomic_fetch_sub(&pool.users, 1);
    }
    return NULL;
}

void nv_pool_shutdown(void) {
    if (pool.started) {
        atomic_store(&pool.stop, 1);
        pthread_mutex_lock(&pool.mu);
        pthread_cond_broadcast(&pool.cv);
        pthread_mutex_unlock(&pool.mu);
        for (int i = 0; i < pool.started; i++) pthread_join(pool.tids[i], NULL);
    }
    free(pool.tids);
    pool.tids = NULL;
    pool.started = 0;
    pool.threads = 0;
    atomic_store(&pool.stop, 0);
}

nv_err nv_pool_init(int threads) {
    if (threads <= 0) threads = nv_cpu_probe()->cores;
    if (threads < 1) threads = 1;
    if (threads > 1024) return nv_fail(NV_ERANGE, "pool: %d threads is too many", threads);
    if (pool.threads == threads) return NV_OK;
    nv_pool_shutdown();
    pool.threads = 1;
    if (threads == 1) return NV_OK;
    pool.tids = calloc((size_t)threads - 1, sizeof *pool.tids);
    if (!pool.tids) return nv_fail(NV_ENOMEM, "pool: out of memory");
    for (int i = 0; i < threads - 1; i++) {
        if (pthread_create(&pool.tids[i], NULL, worker_main, NULL) != 0) {
            nv_warn("thread pool: started %d of %d threads", pool.started + 1, threads);
            break;
        }
        pool.started++;
    }
    pool.threads = pool.started + 1;
    return NV_OK;
}

int nv_pool_threads(void) { return pool.threads > 1 ? pool.threads : 1; }

static void run_inline(void (*fn)(void *, int, int), void *ctx, int n) {
    for (int t = 0; t < n; t++) fn(ctx, t, n);
}

void nv_pool_run(void (*fn)(void *ctx, int task, int n_tasks), void *ctx, int n_tasks) {
    if (n_tasks <= 0) return;
    if (n_tasks == 1 || pool.started == 0 || in_task || pthread_mutex_trylock(&pool.run_mu) != 0) {
        run_inline(fn, ctx, n_tasks);
        return;
    }
    pool_job j = {.fn = fn, .ctx = ctx, .n = n_tasks};
    atomic_init(&j.next, 0);
    atomic_init(&j.done, 0);
    atomic_store(&pool.job, &j);
    atomic_fetch_add(&pool.gen, 1);
    if (atomic_load(&pool.sleepers) > 0) {
        pthread_mutex_lock(&pool.mu);
        pthread_cond_broadcast(&pool.cv);
        pthread_mutex_unlock(&pool.mu);
    }
    in_task = 1;
    job_work(&j);
    in_task = 0;
    for (int spins = 0; atomic_load_explicit(&j.done, memory_order_acquire) < n_tasks;)
        if (++spins < SPIN_YIELD) cpu_relax();
        else sched_yield();
    atomic_store(&pool.job, NULL);
    for (int spins = 0; atomic_load(&pool.users) > 0;)
        if (++spins < SPIN_YIELD) cpu_relax();
        else sched_yield();
    pthread_mutex_unlock(&pool.run_mu);
}
