/* Data-parallel training across processes, on one machine or many: OpenMPI when nerve is started by
 * mpirun (or another launcher that sets up an MPI job), a single process otherwise.
 *
 * Every process holds the whole model and takes its share of each step's batch; the gradients
 * are summed over the processes before the optimizer, so every process makes the same update and
 * the weights stay identical without being sent. Process 0 owns the run folder (checkpoints,
 * metrics, the model) and the console; the others only compute.
 *
 * The job is process-wide state, like MPI itself: nv_dist_init once, then the queries. Without a
 * launcher (or in a build without OpenMPI's headers) rank is 0, size is 1 and every collective
 * returns at once, touching nothing. A failed collective (a process died) ends the whole job, the
 * MPI default: nothing waits forever on a peer that is gone. Only the calling thread talks to MPI. */
#ifndef NV_DIST_H
#define NV_DIST_H

#include <stddef.h>

#include "base/err.h"

/* Starts the job when this process was launched by mpirun (or another MPI launcher); a no-op
 * otherwise. Fails when launched so but built without OpenMPI. */
nv_err nv_dist_init(void);
/* 1 when nerve was built with OpenMPI (libopenmpi-dev present at build time). */
int nv_dist_built_in(void);
int nv_dist_rank(void);
int nv_dist_size(void);
/* The processes of the job on this machine, and this process's place among them. */
int nv_dist_local_size(void);
/* Threads for this process's pool when the launcher left several processes the same CPUs (their
 * CPU sets divided between them); 0 when this process may use every CPU it was given. Warns
 * (process 0 only) when the launcher's binding leaves most of the machine's cores idle. */
int nv_dist_threads(void);
/* In place: buf = the sum over all processes (the same bits on every one). */
void nv_dist_sum_f32(float *buf, size_t n);
void nv_dist_sum_f64(double *buf, size_t n);
/* buf = process 0's bytes on every process. */
void nv_dist_bcast(void *buf, size_t bytes);
/* The largest of v over all processes (a flag any one of them raised). */
long nv_dist_max(long v);
/* Ends every process of the job with this exit code (after one failed alone). Returns only when
 * there is no job. */
void nv_dist_abort(int code);
/* Leaves the job cleanly; every process must call it. */
void nv_dist_finalize(void);

#endif
