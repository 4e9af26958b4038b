/* OpenAI's fine-tuning jobs API on the server itself (`nerve serve --files-dir DIR`): POST
 * /v1/fine_tuning/jobs takes an uploaded training file (serve/files.h, purpose "fine-tune": chat
 * lines for the supervised method, preference pairs for dpo) and trains LoRA adapters on the served
 * model in a `nerve train` process of its own, at a lower CPU priority than the server's, so requests
 * go first; once it succeeds the adapters are served at once beside the base model, unmerged
 * (model/adapters.h), as the model ft:BASE:local:SUFFIX:ID, and again at every start.
 *
 * Contract:
 * - A job is DIR/ftjob-ID.json (its FineTuningJob object and order; ids "ftjob-" + 24 hex digits),
 *   written atomically at each change of status; its work is the folder DIR/ftjob-ID.run: the data
 *   (hard links to the uploaded files, so deleting them later does not stop the job), the trainer's
 *   run folder run/, its output train.log, and the job's events events.jsonl (a line each, appended).
 * - queued -> validating_files (the trainer reads and checks the data, builds its plans) -> running
 *   (from its first step) -> succeeded (the adapters loaded: fine_tuned_model; result_files one CSV
 *   of the step metrics, purpose fine-tune-results) or failed (error: the trainer's own message).
 *   POST .../cancel: cancelled; .../pause: the trainer stops at a step's end with its checkpoint
 *   (paused), .../resume queues it to go on from there (the losses those of a run never paused).
 *   One job trains at a time, the oldest queued first.
 * - Requests go first: with yield, the trainer is stopped (SIGSTOP) while the server has requests
 *   waiting or running and continued once it has had none for a moment (it also runs at a lower
 *   CPU priority); training takes the server's idle time.
 * - A server stopped part way stops its trainer the same way: at the next start the job goes on from
 *   the checkpoint. A trainer a server killed outright left behind (its pid in the record) is stopped
 *   at the next start, with its checkpoint, before the job goes on.
 * - A job of more than one epoch also serves its last two earlier epochs' models, as
 *   ft:...:ckpt-step-N (the trainer's --save-every epoch; its checkpoints list them); a job may
 *   start from any model fine-tuned here (model: its name; its adapters go on training, their rank kept).
 * - DELETE /v1/models/{fine_tuned_model} unloads the model and removes its adapters; the job stays.
 * - Every function is safe from any thread. */
#ifndef NV_SERVE_FINETUNE_H
#define NV_SERVE_FINETUNE_H

#include <cjson/cJSON.h>

#include "model/adapters.h"
#include "serve/api.h"
#include "serve/files.h"

typedef struct {
    const char *model_id;      /* the served model's id: the one base a job may name */
    const char *model_path;    /* the served model, as nerve train --init-from takes it */
    const char *tok_path;      /* its tokenizer (-z), NULL: the model's own */
    const char *template_name; /* the chat template the server renders requests with */
    const char *template_jinja; /* its Jinja text when the server runs one (a job trains with it), else NULL */
    int threads;               /* the trainer's --threads (0: its default, every core) */
    int nice;                  /* the trainer's CPU priority below the server's (0-19) */
    int (*busy)(void *ctx);    /* requests waiting or running (NULL: never busy) */
    void *busy_ctx;
    int yield;                 /* the trainer is held (SIGSTOP) while busy says so, going on once it is quiet */
    const char *unavailable;   /* why the served model cannot be fine-tuned here (NULL: it can) */
    nv_adapters *adapters;     /* where fine-tuned models are served */
    const nv_model *model;     /* the served model (its plans built) */
} nv_ftjobs_opts;

typedef struct nv_ftjobs nv_ftjobs;

/* The jobs DIR (the files' folder) holds; the succeeded ones' models loaded into o->adapters (one
 * that fails to load is skipped with a warning); jobs a stopped server left training queued again. */
nv_err nv_ftjobs_open(nv_ftjobs **out, nv_files *files, const nv_ftjobs_opts *o);
/* Starts the thread that trains them. */
nv_err nv_ftjobs_start(nv_ftjobs *j);
/* The server is stopping: a trainer running is asked to stop at its next step's end (it saves its
 * checkpoint); no other starts. */
void nv_ftjobs_stop(nv_ftjobs *j);
/* Waits for the trainer (a minute at most, then kills it), joins the thread and frees j. */
void nv_ftjobs_close(nv_ftjobs *j);

/* How many jobs are in each status: names[i] and counts[i] for the i < the returned number. */
int nv_ftjobs_counts(nv_ftjobs *j, const char **names, int *counts, int cap);

/* The endpoints: 0 with the JSON answer in *out (malloc'd), else the error in e (its status). */
int nv_ftjobs_create(nv_ftjobs *j, const char *body, size_t len, char **out, nv_api_error *e);
int nv_ftjobs_get(nv_ftjobs *j, const char *id, char **out, nv_api_error *e);
/* Newest first, after the job id given (NULL: from the newest), at most limit; metadata (NULL: any)
 * keeps the jobs whose metadata holds each of its strings (OpenAI's metadata[k]=v), JSON null those
 * with none. */
int nv_ftjobs_list(nv_ftjobs *j, int limit, const char *after, const cJSON *metadata, char **out, nv_api_error *e);
/* action: "cancel", "pause" or "resume". */
int nv_ftjobs_act(nv_ftjobs *j, const char *id, const char *action, char **out, nv_api_error *e);
/* A job's events, newest first, after the event id given (NULL: from the newest), at most limit. */
int nv_ftjobs_events(nv_ftjobs *j, const char *id, int limit, const char *after, char **out, nv_api_error *e);
/* A succeeded job's checkpoints, its models not deleted, newest first: the final one and up to two
 * earlier epochs' (NAME:ckpt-step-N), each with its step's metrics; after the checkpoint id given
 * (NULL: from the newest), at most limit. */
int nv_ftjobs_checkpoints(nv_ftjobs *j, const char *id, int limit, const char *after, char **out, nv_api_error *e);
/* 1 when model names a fine-tuned model of a job (an earlier epoch's too; deleted or not), else 0. */
int nv_ftjobs_owns(nv_ftjobs *j, const char *model);
/* Whether name is a model a job that has not failed, been cancelled or deleted serves or will serve
   (its fine-tuned model or one of its :ckpt-step-N): vLLM's load and unload endpoints keep off it. */
int nv_ftjobs_reserves(nv_ftjobs *j, const char *name);
/* The adapters' places the jobs yet to end will take when they succeed (run-time loads keep off them). */
int nv_ftjobs_pending_models(nv_ftjobs *j);
/* DELETE /v1/models/{model} of a fine-tuned model: unloaded, its adapters removed. */
int nv_ftjobs_delete_model(nv_ftjobs *j, const char *model, char **out, nv_api_error *e);

#endif
