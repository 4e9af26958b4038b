#include "serve/metrics.h"

#include <string.h>

#include "engine/engine.h"
#include "base/buf.h"

static const char *const finish_names[NV_FINISH_COUNT] = {"none",    "stop",     "length", "cancelled",
                                                          "timeout", "shutdown", "error"};

const char *nv_finish_name(nv_finish f) { return (unsigned)f < NV_FINISH_COUNT ? finish_names[f] : "?"; }

static void hist_init(nv_hist *h, const double *le, int n) {
    memset(h, 0, sizeof *h);
    h->n = n;
    memcpy(h->le, le, (size_t)n * sizeof *le);
}

static void hist_add(nv_hist *h, double v) {
    for (int i = 0; i < h->n; i++)
        if (v <= h->le[i]) {
            h->counts[i]++;
            break;
        }
    h->count++;
    h->sum += v;
}

void nv_metrics_init(nv_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    static const double ttft[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
    static const double itl[] = {0.0002, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};
    static const double e2e[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
    hist_init(&m->ttft, ttft, 14);
    hist_init(&m->itl, itl, 14);
    hist_init(&m->e2e, e2e, 14);
}

void nv_metrics_free(nv_metrics *m) { pthread_mutex_destroy(&m->mu); }

void nv_metrics_status(nv_metrics *m, int status) {
    pthread_mutex_lock(&m->mu);
    if (status >= 100 && status < 600) m->by_status[status]++;
    pthread_mutex_unlock(&m->mu);
}

void nv_metrics_finish(nv_metrics *m, nv_finish f, int prompt_tokens, int completion_tokens, double e2e_s) {
    pthread_mutex_lock(&m->mu);
    if ((unsigned)f < NV_FINISH_COUNT) m->finished[f]++;
    m->prompt_tokens += (uint64_t)(prompt_tokens > 0 ? prompt_tokens : 0);
    m->completion_tokens += (uint64_t)(completion_tokens > 0 ? completion_tokens : 0);
    hist_add(&m->e2e, e2e_s);
    pthread_mutex_unlock(&m->mu);
}

void nv_metrics_ttft(nv_metrics *m, double s) {
    pthread_mutex_lock(&m->mu);
    hist_add(&m->ttft, s);
    pthread_mutex_unlock(&m->mu);
}

void nv_metrics_itl(nv_metrics *m, double s) {
    pthread_mutex_lock(&m->mu);
    hist_add(&m->itl, s);
    pthread_mutex_unlock(&m->mu);
}

void nv_metrics_step(nv_metrics *m, int rows) {
    pthread_mutex_lock(&m->mu);
    m->steps++;
    m->step_rows += (uint64_t)rows;
    pthread_mutex_unlock(&m->mu);
}

void nv_metrics_spec(nv_metrics *m, unsigned long steps, unsigned long drafted, unsigned long accepted) {
    pthread_mutex_lock(&m->mu);
    m->spec_steps += steps;
    m->spec_drafted += drafted;
    m->spec_accepted += accepted;
    pthread_mutex_unlock(&m->mu);
}

void nv_metrics_preempted(nv_metrics *m) {
    pthread_mutex_lock(&m->mu);
    m->preemptions++;
    pthread_mutex_unlock(&m->mu);
}

void nv_metrics_grammar(nv_metrics *m, unsigned long tokens, unsigned long masks, double mask_s) {
    pthread_mutex_lock(&m->mu);
    m->grammar_tokens += tokens;
    m->grammar_masks += masks;
    m->grammar_mask_s += mask_s;
    pthread_mutex_unlock(&m->mu);
}

void nv_metrics_prefix(nv_metrics *m, int ram_hits, int ram_misses, int disk_hits, int disk_misses, int cached_tokens) {
    pthread_mutex_lock(&m->mu);
    m->prefix_hits[0] += (uint64_t)(ram_hits > 0 ? ram_hits : 0);
    m->prefix_misses[0] += (uint64_t)(ram_misses > 0 ? ram_misses : 0);
    m->prefix_hits[1] += (uint64_t)(disk_hits > 0 ? disk_hits : 0);
    m->prefix_misses[1] += (uint64_t)(disk_misses > 0 ? disk_misses : 0);
    m->cached_tokens += (uint64_t)(cached_tokens > 0 ? cached_tokens : 0);
    pthread_mutex_unlock(&m->mu);
}

/* A label value with \, " and newline escaped. */
static void put_label(nv_buf *b, const char *s) {
    for (; *s; s++) {
        if (*s == '\\') nv_buf_puts(b, "\\\\");
        else if (*s == '"') nv_buf_puts(b, "\\\"");
        else if (*s == '\n') nv_buf_puts(b, "\\n");
        else nv_buf_append(b, s, 1);
    }
}

static void head(nv_buf *b, const char *name, const char *type, const char *help) {
    nv_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A metric with no labels: its HELP/TYPE lines and its one value. */
static void put_one(nv_buf *b, const char *name, const char *type, const char *help, unsigned long long v) {
    head(b, name, type, help);
    nv_buf_printf(b, "%s %llu\n", name, v);
}

static void put_hist(nv_buf *b, const char *name, const char *help, const nv_hist *h) {
    head(b, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i < h->n; i++) {
        cum += h->counts[i];
        nv_buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i], (unsigned long long)cum);
    }
    nv_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)h->count,
                  name, h->sum, name, (unsigned long long)h->count);
}

char *nv_metrics_render(nv_metrics *m, const nv_metrics_gauges *g) {
    nv_buf b = {0};
    pthread_mutex_lock(&m->mu);
    head(&b, "nerve_info", "gauge", "The served model and the engine its plans run on.");
    nv_buf_puts(&b, "nerve_info{model=\"");
    put_label(&b, g->model_id ? g->model_id : "");
    nv_buf_puts(&b, "\",engine=\"");
    put_label(&b, g->engine ? g->engine : "");
    nv_buf_puts(&b, "\"} 1\n");
    head(&b, "nerve_requests_total", "counter", "HTTP responses by status code.");
    for (int s = 100; s < 600; s++)
        if (m->by_status[s]) nv_buf_printf(&b, "nerve_requests_total{status=\"%d\"} %llu\n", s, (unsigned long long)m->by_status[s]);
    head(&b, "nerve_sequences_finished_total", "counter", "Generations that ended, by how they ended.");
    for (int f = 1; f < NV_FINISH_COUNT; f++)
        nv_buf_printf(&b, "nerve_sequences_finished_total{reason=\"%s\"} %llu\n", finish_names[f],
                      (unsigned long long)m->finished[f]);
    put_one(&b, "nerve_prompt_tokens_total", "counter", "Prompt tokens of finished sequences.", m->prompt_tokens);
    put_one(&b, "nerve_completion_tokens_total", "counter",
            "Generated tokens of finished sequences.",
            m->completion_tokens);
    put_one(&b, "nerve_steps_total", "counter", "Batched forward steps run.", m->steps);
    put_one(&b, "nerve_step_rows_total", "counter",
            "Token rows over all steps (rows per step = this / steps).",
            m->step_rows);
    put_one(&b, "nerve_grammar_tokens_total", "counter",
            "Tokens drawn under a grammar (response_format, tool calls).", m->grammar_tokens);
    put_one(&b, "nerve_grammar_masks_total", "counter",
            "Whole token masks computed because the grammar refused the first draw.", m->grammar_masks);
    head(&b, "nerve_grammar_mask_seconds_total", "counter", "Time spent computing those masks.");
    nv_buf_printf(&b, "nerve_grammar_mask_seconds_total %.6f\n", m->grammar_mask_s);
    put_one(&b, "nerve_spec_drafts_total", "counter",
            "Decode rows that carried draft tokens to check (speculative decoding, --spec-tokens).", m->spec_steps);
    put_one(&b, "nerve_spec_draft_tokens_total", "counter", "Draft tokens proposed (by prompt lookup or the draft model).", m->spec_drafted);
    put_one(&b, "nerve_spec_accepted_tokens_total", "counter",
            "Draft tokens the model agreed with (each one a decode step saved).", m->spec_accepted);
    put_one(&b, "nerve_preemptions_total", "counter",
            "Running sequences sent back to the queue (for a request that outranked them, or for room under --kv-overcommit).",
            m->preemptions);
    put_hist(&b, "nerve_time_to_first_token_seconds", "From arrival to the first generated token.", &m->ttft);
    put_hist(&b, "nerve_inter_token_latency_seconds", "Between consecutive generated tokens of a sequence.", &m->itl);
    put_hist(&b, "nerve_request_duration_seconds", "From arrival to the end of generation.", &m->e2e);
    uint64_t hits[2] = {m->prefix_hits[0], m->prefix_hits[1]}, misses[2] = {m->prefix_misses[0], m->prefix_misses[1]};
    uint64_t cached = m->cached_tokens;
    pthread_mutex_unlock(&m->mu);
    if (g->prefix_on) {
        static const char *const tiers[2] = {"ram", "disk"};
        const nv_disk_stats *d = &g->disk;
        head(&b, "nerve_prefix_cache_hits_total", "counter",
             "Prompt blocks a lookup found, by tier (disk: read back and verified).");
        for (int t = 0; t < 2; t++)
            nv_buf_printf(&b, "nerve_prefix_cache_hits_total{tier=\"%s\"} %llu\n", tiers[t], (unsigned long long)hits[t]);
        head(&b, "nerve_prefix_cache_misses_total", "counter",
             "Reusable prompt blocks a tier could not supply (the rest of the lookup after its last hit).");
        for (int t = 0; t < 2; t++)
            nv_buf_printf(&b, "nerve_prefix_cache_misses_total{tier=\"%s\"} %llu\n", tiers[t], (unsigned long long)misses[t]);
        put_one(&b, "nerve_prefix_cached_tokens_total", "counter",
                "Prompt tokens whose KV came from the cache, not prefill.",
                cached);
        head(&b, "nerve_prefix_cache_blocks", "gauge", "Blocks held by each tier (RAM: indexed blocks in the pool).");
        nv_buf_printf(&b, "nerve_prefix_cache_blocks{tier=\"ram\"} %d\n", g->ram_blocks);
        nv_buf_printf(&b, "nerve_prefix_cache_blocks{tier=\"disk\"} %ld\n", g->disk_on ? d->files : 0L);
        head(&b, "nerve_prefix_cache_bytes", "gauge", "Bytes held by each tier.");
        nv_buf_printf(&b, "nerve_prefix_cache_bytes{tier=\"ram\"} %llu\n",
                      (unsigned long long)((uint64_t)g->ram_blocks * g->kv_block_bytes));
        nv_buf_printf(&b, "nerve_prefix_cache_bytes{tier=\"disk\"} %llu\n", (unsigned long long)(g->disk_on ? d->bytes : 0));
        head(&b, "nerve_prefix_cache_max_bytes", "gauge",
             "Each tier's budget (RAM: idle cached blocks, --kv-ram-cache; disk: --kv-disk-cache).");
        nv_buf_printf(&b, "nerve_prefix_cache_max_bytes{tier=\"ram\"} %llu\n",
                      (unsigned long long)((uint64_t)g->ram_max_idle * g->kv_block_bytes));
        nv_buf_printf(&b, "nerve_prefix_cache_max_bytes{tier=\"disk\"} %llu\n", (unsigned long long)(g->disk_on ? d->max_bytes : 0));
        put_one(&b, "nerve_prefix_cache_idle_blocks", "gauge",
                "Cached blocks in RAM that no sequence references (reclaimable).",
                g->kv_idle);
        head(&b, "nerve_prefix_cache_evictions_total", "counter", "Cached blocks evicted, by tier.");
        nv_buf_printf(&b, "nerve_prefix_cache_evictions_total{tier=\"ram\"} %llu\n", (unsigned long long)g->kv_evictions);
        nv_buf_printf(&b, "nerve_prefix_cache_evictions_total{tier=\"disk\"} %llu\n",
                      (unsigned long long)(g->disk_on ? d->evictions : 0));
        put_one(&b, "nerve_prefix_disk_up", "gauge",
                "1 while the SSD tier is on and its writer runs (0: off or stopped on an error).",
                g->disk_on && d->writer_up);
        put_one(&b, "nerve_prefix_disk_write_queue_depth", "gauge",
                "Blocks queued for the SSD writer or being written.",
                g->disk_on ? d->queue_depth : 0);
        head(&b, "nerve_prefix_disk_writes_total", "counter",
             "Block writes: written, dropped (queue full or writer stopped), failed.");
        nv_buf_printf(&b, "nerve_prefix_disk_writes_total{result=\"written\"} %llu\n", (unsigned long long)(g->disk_on ? d->writes : 0));
        nv_buf_printf(&b, "nerve_prefix_disk_writes_total{result=\"dropped\"} %llu\n",
                      (unsigned long long)(g->disk_on ? d->write_drops : 0));
        nv_buf_printf(&b, "nerve_prefix_disk_writes_total{result=\"failed\"} %llu\n",
                      (unsigned long long)(g->disk_on ? d->write_errors : 0));
        put_one(&b, "nerve_prefix_disk_rejected_total", "counter",
                "Block files removed because they failed a check (other model or format, truncated, bad checksum).",
                g->disk_on ? d->rejected : 0);
    }

    put_one(&b, "nerve_queue_depth", "gauge", "Requests waiting for admission.", g->waiting);
    put_one(&b, "nerve_running_sequences", "gauge", "Sequences in the running batch.", g->running);
    put_one(&b, "nerve_max_batch", "gauge", "Most sequences in one step (--max-batch).", g->max_batch);
    put_one(&b, "nerve_kv_blocks_total", "gauge", "KV cache blocks in the pool.", g->kv_total);
    put_one(&b, "nerve_kv_blocks_in_use", "gauge",
            "KV cache blocks holding a sequence's keys and values.",
            g->kv_in_use);
    put_one(&b, "nerve_kv_blocks_free", "gauge",
            "KV cache blocks not referenced by a sequence (free, or idle cached blocks).",
            g->kv_total - g->kv_in_use);
    put_one(&b, "nerve_kv_blocks_reserved", "gauge", "Free blocks promised to admitted sequences.", g->kv_reserved);
    put_one(&b, "nerve_kv_block_size_tokens", "gauge", "Positions per KV block.", g->kv_block_size);
    put_one(&b, "nerve_kv_block_bytes", "gauge", "Bytes per KV block.", g->kv_block_bytes);
    if (g->kv_window_total) {
        put_one(&b, "nerve_kv_window_blocks_total", "gauge",
                "Blocks of the sliding-window layers' own pool (--swa-cache window): a ring a sequence.", g->kv_window_total);
        put_one(&b, "nerve_kv_window_blocks_in_use", "gauge", "Windowed-layer blocks in sequences' rings.", g->kv_window_in_use);
        put_one(&b, "nerve_kv_window_blocks_reserved", "gauge", "Windowed-layer blocks promised to admitted sequences.",
                g->kv_window_reserved);
        put_one(&b, "nerve_kv_window_blocks_kept", "gauge",
                "Windowed-layer blocks of finished sequences kept for a prompt that continues one (prefix cache).",
                g->kv_window_kept);
        put_one(&b, "nerve_kv_window_block_bytes", "gauge", "Bytes per windowed-layer block.", g->kv_window_block_bytes);
    }
    if (g->lora_on) {
        put_one(&b, "nerve_lora_adapters", "gauge", "LoRA adapters a request may name (--lora-modules, /v1/load_lora_adapter).",
                (unsigned long long)g->lora_n);
        head(&b, "nerve_lora_sequences", "gauge", "Sequences of each LoRA adapter, queued or running.");
        for (int i = 0; i < g->lora_n; i++)
            for (int st = 0; st < 2; st++) {
                nv_buf_puts(&b, "nerve_lora_sequences{adapter=\"");
                put_label(&b, g->lora_name[i]);
                nv_buf_printf(&b, "\",state=\"%s\"} %d\n", st ? "running" : "waiting", st ? g->lora_running[i] : g->lora_waiting[i]);
            }
    }
    if (g->responses_on) {
        put_one(&b, "nerve_responses_stored", "gauge", "Responses API responses kept for previous_response_id (--responses-store).",
                (unsigned long long)g->responses_kept);
        put_one(&b, "nerve_responses_stored_bytes", "gauge", "Bytes the kept responses take.", (unsigned long long)g->responses_bytes);
        put_one(&b, "nerve_conversations", "gauge", "Conversations the Conversations API keeps (--responses-store).",
                (unsigned long long)g->conversations);
        put_one(&b, "nerve_conversations_bytes", "gauge", "Bytes their items take, as JSON.", (unsigned long long)g->conversations_bytes);
    }
    if (g->files_on) {
        put_one(&b, "nerve_files", "gauge", "Files the Files API keeps (--files-dir): uploads and batches' results.",
                (unsigned long long)g->files_n);
        put_one(&b, "nerve_files_bytes", "gauge", "Bytes of those files.", (unsigned long long)g->files_bytes);
        head(&b, "nerve_batches", "gauge", "Batches (OpenAI's Batch API and Anthropic's Message Batches) in each status.");
        for (int i = 0; i < g->batch_n; i++) nv_buf_printf(&b, "nerve_batches{status=\"%s\"} %d\n", g->batch_status[i], g->batches[i]);
        if (g->ftjob_n) head(&b, "nerve_fine_tuning_jobs", "gauge", "Fine-tuning jobs (OpenAI's fine-tuning API) in each status.");
        for (int i = 0; i < g->ftjob_n; i++)
            nv_buf_printf(&b, "nerve_fine_tuning_jobs{status=\"%s\"} %d\n", g->ftjob_status[i], g->ftjobs[i]);
    }
    head(&b, "nerve_engine_available", "gauge", "1 when the engine probed well and is on.");
    for (int e = 0; e < NV_ENGINE_COUNT; e++)
        nv_buf_printf(&b, "nerve_engine_available{engine=\"%s\"} %d\n", nv_engine_name((nv_engine_id)e),
                      nv_engine_available((nv_engine_id)e));
    head(&b, "nerve_engine_latched", "gauge", "Engines latched off, with the reason.");
    for (int e = 0; e < NV_ENGINE_COUNT; e++) {
        if (nv_engine_available((nv_engine_id)e)) continue;
        nv_buf_printf(&b, "nerve_engine_latched{engine=\"%s\",reason=\"", nv_engine_name((nv_engine_id)e));
        put_label(&b, nv_engine_why_off((nv_engine_id)e));
        nv_buf_puts(&b, "\"} 1\n");
    }
    return nv_buf_take(&b);
}
