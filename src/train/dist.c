#include "train/dist.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"

#ifdef NV_HAVE_MPI
#include <mpi.h>
#endif

static int dist_on, dist_rank, dist_size = 1, dist_local_size = 1, dist_threads;

/* Set by mpirun (OMPI_*), by a PMIx launcher such as Slurm's srun --mpi=pmix (PMIX_RANK) or by a
   PMI-1/2 one (PMI_RANK). */
static int launched_by_mpi(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

int nv_dist_built_in(void) {
#ifdef NV_HAVE_MPI
    return 1;
#else
    return 0;
#endif
}

int nv_dist_rank(void) { return dist_rank; }
int nv_dist_size(void) { return dist_size; }
int nv_dist_local_size(void) { return dist_local_size; }
int nv_dist_threads(void) { return dist_threads; }

#ifdef NV_HAVE_MPI
/* Processes on this machine whose CPU sets overlap share those CPUs: each takes its part, so two
   processes given the whole machine do not run twice as many threads as cores. Every process takes
   part in the sum (an empty set when its own cannot be read): none is left waiting. */
static void plan_threads(MPI_Comm node) {
    cpu_set_t mine;
    CPU_ZERO(&mine);
    if (sched_getaffinity(0, sizeof mine, &mine) != 0) CPU_ZERO(&mine);
    static int users[CPU_SETSIZE]; /* processes of this machine on each CPU */
    for (int c = 0; c < CPU_SETSIZE; c++) users[c] = CPU_ISSET(c, &mine) ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, users, CPU_SETSIZE, MPI_INT, MPI_SUM, node);
    int sharing = 1;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &mine) && users[c] > sharing) sharing = users[c];
    const int cpus = CPU_COUNT(&mine);
    if (!cpus) return;
    if (sharing > 1) dist_threads = cpus / sharing > 0 ? cpus / sharing : 1;
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    const int used = dist_threads ? dist_threads : cpus;
    if (dist_rank == 0 && online > 0 && (long)used * dist_local_size * 2 <= online)
        nv_warn("%d thread%s a process x %d process%s on this machine of %ld CPUs: the launcher bound them (pass "
                "mpirun --bind-to none, or --bind-to socket with one process a socket, to use the rest)",
                used, used == 1 ? "" : "s", dist_local_size, dist_local_size == 1 ? "" : "es", online);
}
#endif

nv_err nv_dist_init(void) {
    if (dist_on || !launched_by_mpi()) return NV_OK;
#ifdef NV_HAVE_MPI
    int provided = 0;
    /* the pool's threads never call MPI: only the thread that runs the training loop does */
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return nv_fail(NV_EIO, "MPI_Init failed");
    dist_on = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &dist_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &dist_size);
    if (provided < MPI_THREAD_FUNNELED) {
        dist_size = 1, dist_rank = 0;
        return nv_fail(NV_EUNSUPPORTED, "this MPI library does not allow a multi-threaded process (MPI_THREAD_FUNNELED)");
    }
    /* a launcher OpenMPI cannot join (MPICH's mpiexec, say) starts every process as a job of its own:
       N copies of one run writing one folder */
    const char *expected = getenv("OMPI_COMM_WORLD_SIZE");
    if (!expected) expected = getenv("PMI_SIZE");
    if (expected && atoi(expected) > 1 && dist_size == 1)
        return nv_fail(NV_EUNSUPPORTED, "started as one of %d processes, but OpenMPI sees a job of one: the launcher is "
                                        "not one OpenMPI works with (use OpenMPI's mpirun, or srun --mpi=pmix)",
                       atoi(expected));
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, dist_rank, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &dist_local_size);
    plan_threads(node);
    MPI_Comm_free(&node);
    return NV_OK;
#else
    return nv_fail(NV_EUNSUPPORTED, "started by an MPI launcher, but this nerve was built without OpenMPI: install "
                                    "libopenmpi-dev (scripts/deps.sh does) and rebuild");
#endif
}

/* MPI counts are ints: large buffers go in pieces of 2^30 elements. */
#define DIST_PIECE ((size_t)1 << 30)

#ifdef NV_HAVE_MPI
static void sum_in_place(void *buf, size_t n, size_t elem, MPI_Datatype type) {
    if (dist_size < 2) return;
    for (size_t i = 0; i < n; i += DIST_PIECE)
        MPI_Allreduce(MPI_IN_PLACE, (char *)buf + i * elem, (int)(n - i < DIST_PIECE ? n - i : DIST_PIECE), type, MPI_SUM,
                      MPI_COMM_WORLD);
}
#endif

void nv_dist_sum_f32(float *buf, size_t n) {
#ifdef NV_HAVE_MPI
    sum_in_place(buf, n, sizeof *buf, MPI_FLOAT);
#else
    (void)buf, (void)n;
#endif
}

void nv_dist_sum_f64(double *buf, size_t n) {
#ifdef NV_HAVE_MPI
    sum_in_place(buf, n, sizeof *buf, MPI_DOUBLE);
#else
    (void)buf, (void)n;
#endif
}

void nv_dist_bcast(void *buf, size_t bytes) {
#ifdef NV_HAVE_MPI
    if (dist_size < 2) return;
    for (size_t i = 0; i < bytes; i += DIST_PIECE)
        MPI_Bcast((char *)buf + i, (int)(bytes - i < DIST_PIECE ? bytes - i : DIST_PIECE), MPI_BYTE, 0, MPI_COMM_WORLD);
#else
    (void)buf, (void)bytes;
#endif
}

long nv_dist_max(long v) {
#ifdef NV_HAVE_MPI
    if (dist_size > 1) MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
#endif
    return v;
}

void nv_dist_abort(int code) {
#ifdef NV_HAVE_MPI
    if (dist_on && dist_size > 1) MPI_Abort(MPI_COMM_WORLD, code);
#else
    (void)code;
#endif
}

void nv_dist_finalize(void) {
#ifdef NV_HAVE_MPI
    if (dist_on) MPI_Finalize();
#endif
    dist_on = 0;
}
