/* Server metrics and their Prometheus text rendering.
 *
 * Contract: counters and histograms are updated from any thread (HTTP connection threads count
 * responses by status, the scheduler loop counts tokens and latencies); every function takes the
 * metrics' own lock. Gauges that belong to the scheduler (queue depth, running sequences, KV
 * blocks) are passed to nv_metrics_render() by the caller, read under the scheduler's lock.
 * The text follows the Prometheus exposition format 0.0.4 (HELP/TYPE lines, cumulative
 * histogram buckets with le="+Inf", _sum and _count; label values escaped). */
#ifndef NV_SERVE_METRICS_H
#define NV_SERVE_METRICS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "model/adapters.h"
#include "serve/disk.h"

/* How a sequence ended. */
typedef enum {
    NV_FINISH_NONE = 0,
    NV_FINISH_STOP,      /* end of text or a stop string */
    NV_FINISH_LENGTH,    /* max_tokens or the context */
    NV_FINISH_CANCELLED, /* the client went away */
    NV_FINISH_TIMEOUT,   /* --timeout passed */
    NV_FINISH_SHUTDOWN,  /* the server is stopping */
    NV_FINISH_ERROR,     /* the forward pass failed */
    NV_FINISH_COUNT
} nv_finish;
const char *nv_finish_name(nv_finish f);

#define NV_HIST_BUCKETS 14
typedef struct {
    int n;
    double le[NV_HIST_BUCKETS];
    uint64_t counts[NV_HIST_BUCKETS]; /* per bucket (not cumulative); above the last: count - sum */
    uint64_t count;
    double sum;
} nv_hist;

typedef struct {
    pthread_mutex_t mu;
    uint64_t by_status[600]; /* responses by HTTP status (index = status) */
    uint64_t finished[NV_FINISH_COUNT];
    uint64_t prompt_tokens, completion_tokens;
    uint64_t steps, step_rows;
    nv_hist ttft, itl, e2e;
    /* prefix cache lookups, in blocks: [0] RAM, [1] SSD */
    uint64_t prefix_hits[2], prefix_misses[2];
    uint64_t cached_tokens;
    /* constrained decoding: tokens drawn under a grammar, whole masks computed, their seconds */
    uint64_t grammar_tokens, grammar_masks;
    double grammar_mask_s;
    /* speculative decoding: draft tokens proposed and accepted, decode steps that carried a draft */
    uint64_t spec_drafted, spec_accepted, spec_steps;
    uint64_t preemptions; /* running sequences sent back to the queue */
} nv_metrics;

typedef struct {
    int waiting, running;
    int kv_in_use, kv_total, kv_reserved, kv_block_size;
    size_t kv_block_bytes;
    /* split pages (serve --swa-cache window): the windowed layers' pool; kv_window_total 0 otherwise */
    int kv_window_total, kv_window_in_use, kv_window_reserved, kv_window_kept;
    size_t kv_window_block_bytes;
    int max_batch;
    const char *model_id, *engine;
    /* the prefix cache */
    int prefix_on;
    int kv_idle;           /* cached blocks no sequence references */
    uint64_t kv_evictions; /* idle cached blocks reused for other data */
    int ram_blocks;        /* blocks indexed in RAM (referenced or idle) */
    int ram_max_idle;      /* --kv-ram-cache in blocks */
    int disk_on;
    const char *disk_dir;
    nv_disk_stats disk;
    /* LoRA adapters served per request: the live ones, with their queued and running sequences */
    int lora_on, lora_n;
    char lora_name[NV_MAX_ADAPTERS][NV_ADAPTER_NAME_CAP];
    int lora_waiting[NV_MAX_ADAPTERS], lora_running[NV_MAX_ADAPTERS];
    /* the Responses API's store (--responses-store; off: responses_on 0) */
    int responses_on;
    size_t responses_kept, responses_bytes;
    size_t conversations, conversations_bytes; /* the Conversations API's (with the store) */
    /* the Files and Batch APIs (--files-dir; off: files_on 0): the files kept and their bytes, and
       the batches (OpenAI's and Anthropic's) in each of batch_n statuses */
    int files_on, files_n;
    uint64_t files_bytes;
    int batch_n;
    const char *batch_status[8];
    int batches[8];
    int ftjob_n; /* the fine-tuning jobs in each of ftjob_n statuses (0: the API is off) */
    const char *ftjob_status[8];
    int ftjobs[8];
} nv_metrics_gauges;

void nv_metrics_init(nv_metrics *m);
void nv_metrics_free(nv_metrics *m);
void nv_metrics_status(nv_metrics *m, int status);
void nv_metrics_finish(nv_metrics *m, nv_finish f, int prompt_tokens, int completion_tokens, double e2e_s);
void nv_metrics_ttft(nv_metrics *m, double s);
void nv_metrics_itl(nv_metrics *m, double s);
void nv_metrics_step(nv_metrics *m, int rows);
void nv_metrics_grammar(nv_metrics *m, unsigned long tokens, unsigned long masks, double mask_s);
/* A running sequence went back to the queue (for a request that outranked it, or for room). */
void nv_metrics_preempted(nv_metrics *m);
/* One step's speculative decoding: drafts checked (sequences), tokens proposed and accepted. */
void nv_metrics_spec(nv_metrics *m, unsigned long steps, unsigned long drafted, unsigned long accepted);
/* One lookup's outcome in blocks (a tier's misses: the prompt blocks it could not supply), and
 * the prompt tokens it served. */
void nv_metrics_prefix(nv_metrics *m, int ram_hits, int ram_misses, int disk_hits, int disk_misses, int cached_tokens);
/* Prometheus text (malloc'd, NUL-terminated; NULL when out of memory). */
char *nv_metrics_render(nv_metrics *m, const nv_metrics_gauges *g);

#endif
