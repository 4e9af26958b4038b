/* The thread pool: every task runs exactly once, rapid calls, one and two threads, nested and
 * concurrent callers, shutdown and restart. */
#include <pthread.h>
#include <stdatomic.h>

#include "base/pool.h"
#include "t.h"

#define MAXT 2000
static atomic_int hits[MAXT];
static atomic_int wrong_n;

static void count_task(void *ctx, int task, int n) {
    int expect_n = *(int *)ctx;
    if (n != expect_n || task < 0 || task >= n) atomic_fetch_add(&wrong_n, 1);
    else atomic_fetch_add(&hits[task], 1);
}

static void check_once(int threads) {
    T_CHECK(nv_pool_init(threads) == NV_OK, "init %d", threads);
    T_CHECK(nv_pool_threads() == threads, "threads %d, want %d", nv_pool_threads(), threads);
    static const int sizes[] = {1, 2, 3, 7, 64, 1000, MAXT};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int n = sizes[s];
        for (int i = 0; i < n; i++) atomic_store(&hits[i], 0);
        atomic_store(&wrong_n, 0);
        nv_pool_run(count_task, &n, n);
        int bad = 0;
        for (int i = 0; i < n; i++) bad += atomic_load(&hits[i]) != 1;
        T_CHECK(bad == 0 && atomic_load(&wrong_n) == 0, "threads %d, %d tasks: %d not run exactly once", threads, n, bad);
    }
    int zero = 0;
    nv_pool_run(count_task, &zero, 0); /* no tasks: returns at once */
}

static void test_every_task_once_1_thread(void) { check_once(1); }
static void test_every_task_once_2_threads(void) { check_once(2); }

static int order_seen[16], order_next;
static void order_task(void *ctx, int task, int n) {
    (void)ctx;
    (void)n;
    if (order_next < 16) order_seen[order_next] = task;
    order_next++;
}
static void test_one_thread_runs_in_order(void) {
    nv_pool_init(1);
    order_next = 0;
    nv_pool_run(order_task, NULL, 16);
    int ok = order_next == 16;
    for (int i = 0; i < 16 && ok; i++) ok = order_seen[i] == i;
    T_CHECK(ok, "inline tasks ran out of order (%d calls)", order_next);
}

typedef struct {
    atomic_long sum;
} sum_ctx;
static void sum_task(void *ctx, int task, int n) {
    (void)n;
    atomic_fetch_add(&((sum_ctx *)ctx)->sum, task + 1);
}

static void test_many_rapid_calls(void) {
    nv_pool_init(2);
    sum_ctx c;
    long want = 0;
    atomic_init(&c.sum, 0);
    for (int call = 0; call < 20000; call++) {
        int n = 1 + call % 5;
        nv_pool_run(sum_task, &c, n);
        want += (long)n * (n + 1) / 2;
    }
    T_CHECK(atomic_load(&c.sum) == want, "sum %ld, want %ld", atomic_load(&c.sum), want);
}

/* Results written by tasks (plain stores) are visible to the caller after the run. */
static float plain[4096];
static void write_task(void *ctx, int task, int n) {
    (void)ctx;
    for (int i = task * (4096 / n); i < (task + 1) * (4096 / n); i++) plain[i] = (float)(i + 1);
}
static void test_writes_visible(void) {
    nv_pool_init(2);
    for (int rep = 0; rep < 200; rep++) {
        memset(plain, 0, sizeof plain);
        nv_pool_run(write_task, NULL, 8);
        int bad = 0;
        for (int i = 0; i < 4096; i++) bad += plain[i] != (float)(i + 1);
        T_CHECK(bad == 0, "rep %d: %d writes not visible", rep, bad);
        if (bad) break;
    }
}

static void nested_task(void *ctx, int task, int n) {
    (void)task;
    (void)n;
    sum_ctx *c = ctx;
    nv_pool_run(sum_task, c, 3); /* runs inline on this thread */
}
static void test_nested_calls_run_inline(void) {
    nv_pool_init(2);
    sum_ctx c;
    atomic_init(&c.sum, 0);
    nv_pool_run(nested_task, &c, 4);
    T_CHECK(atomic_load(&c.sum) == 4 * 6, "nested sum %ld", atomic_load(&c.sum));
}

static void *outside_caller(void *arg) {
    sum_ctx *c = arg;
    for (int i = 0; i < 2000; i++) nv_pool_run(sum_task, c, 4);
    return NULL;
}
static void test_concurrent_callers(void) {
    nv_pool_init(2);
    sum_ctx a, b;
    atomic_init(&a.sum, 0);
    atomic_init(&b.sum, 0);
    pthread_t t;
    T_CHECK(pthread_create(&t, NULL, outside_caller, &a) == 0, "pthread_create");
    outside_caller(&b);
    pthread_join(t, NULL);
    T_CHECK(atomic_load(&a.sum) == 2000 * 10 && atomic_load(&b.sum) == 2000 * 10, "sums %ld %ld", atomic_load(&a.sum),
            atomic_load(&b.sum));
}

static void test_shutdown_and_restart(void) {
    nv_pool_init(2);
    nv_pool_shutdown();
    T_CHECK(nv_pool_threads() == 1, "after shutdown: %d threads", nv_pool_threads());
    sum_ctx c;
    atomic_init(&c.sum, 0);
    nv_pool_run(sum_task, &c, 3); /* inline */
    T_CHECK(atomic_load(&c.sum) == 6, "inline after shutdown");
    T_CHECK(nv_pool_init(0) == NV_OK && nv_pool_threads() >= 1, "init with 0 = cores");
    nv_pool_run(sum_task, &c, 3);
    T_CHECK(atomic_load(&c.sum) == 12, "after restart");
    nv_pool_shutdown();
}

int main(void) {
    T_RUN(test_every_task_once_1_thread);
    T_RUN(test_every_task_once_2_threads);
    T_RUN(test_one_thread_runs_in_order);
    T_RUN(test_many_rapid_calls);
    T_RUN(test_writes_visible);
    T_RUN(test_nested_calls_run_inline);
    T_RUN(test_concurrent_callers);
    T_RUN(test_shutdown_and_restart);
    nv_pool_shutdown();
    return t_done();
}
