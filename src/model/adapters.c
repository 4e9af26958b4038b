#include "model/adapters.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "base/pool.h"
#include "model/gguf.h"
#include "model/hf.h"

/* Frees the slot's adapter; the slot keeps its generation (the next adapter's is one more). */
static void adapter_free(nv_adapter *a, int n_plans) {
    for (int i = 0; i < n_plans; i++) {
        if (a->a) nv_plan_free(a->a[i]);
        if (a->b) nv_plan_free(a->b[i]);
    }
    free(a->a);
    free(a->b);
    free(a->w);
    free(a->path);
    const unsigned gen = a->gen;
    memset(a, 0, sizeof *a);
    a->gen = gen;
}

void nv_adapters_init(nv_adapters *set, int max_rank) {
    memset(set, 0, sizeof *set);
    pthread_mutex_init(&set->mu, NULL);
    set->max_rank = max_rank > 0 ? max_rank : 1;
}

void nv_adapters_free(nv_adapters *set) {
    for (int i = 0; i < NV_MAX_ADAPTERS; i++)
        if (set->v[i].state != NV_ADAPTER_FREE) adapter_free(&set->v[i], set->n_layers * NV_LAYER_MATRICES);
    pthread_mutex_destroy(&set->mu);
    memset(set, 0, sizeof *set);
}

/* The slot of a live or loading adapter called name, -1 when none (lock held). */
static int slot_of(const nv_adapters *set, const char *name, int loading_too) {
    for (int i = 0; i < NV_MAX_ADAPTERS; i++) {
        const nv_adapter *a = &set->v[i];
        if ((a->state == NV_ADAPTER_LIVE || (loading_too && a->state == NV_ADAPTER_LOADING)) && !strcmp(a->name, name)) return i;
    }
    return -1;
}

int nv_adapters_find(nv_adapters *set, const char *name, unsigned *gen) {
    if (!set) return 0;
    pthread_mutex_lock(&set->mu);
    const int i = slot_of(set, name, 0);
    if (i >= 0 && gen) *gen = set->v[i].gen;
    pthread_mutex_unlock(&set->mu);
    return i + 1;
}

int nv_adapters_pin(nv_adapters *set, int k, unsigned gen) {
    if (!set || k < 1 || k > NV_MAX_ADAPTERS) return 0;
    pthread_mutex_lock(&set->mu);
    nv_adapter *a = &set->v[k - 1];
    /* removed but still held: a request that named it before the removal may still run on it */
    const int ok = a->gen == gen && (a->state == NV_ADAPTER_LIVE || (a->state == NV_ADAPTER_REMOVED && a->refs > 0));
    if (ok) a->refs++;
    pthread_mutex_unlock(&set->mu);
    return ok;
}

void nv_adapters_unpin(nv_adapters *set, int k) {
    if (!set || k < 1 || k > NV_MAX_ADAPTERS) return;
    pthread_mutex_lock(&set->mu);
    nv_adapter *a = &set->v[k - 1];
    if (a->refs > 0 && --a->refs == 0 && a->state == NV_ADAPTER_REMOVED) adapter_free(a, set->n_layers * NV_LAYER_MATRICES);
    pthread_mutex_unlock(&set->mu);
}

nv_err nv_adapters_remove(nv_adapters *set, const char *name) {
    pthread_mutex_lock(&set->mu);
    const int i = slot_of(set, name, 0);
    if (i >= 0) {
        nv_adapter *a = &set->v[i];
        set->live--;
        if (a->refs == 0) adapter_free(a, set->n_layers * NV_LAYER_MATRICES);
        else a->state = NV_ADAPTER_REMOVED; /* freed by its last request */
    }
    pthread_mutex_unlock(&set->mu);
    return i >= 0 ? NV_OK : nv_fail(NV_EINVAL, "no LoRA adapter is called '%.80s'", name);
}

void nv_adapters_each(nv_adapters *set, void (*fn)(void *arg, int k, const nv_adapter *a), void *arg) {
    pthread_mutex_lock(&set->mu);
    for (int i = 0; i < NV_MAX_ADAPTERS; i++)
        if (set->v[i].state == NV_ADAPTER_LIVE) fn(arg, i + 1, &set->v[i]);
    pthread_mutex_unlock(&set->mu);
}

typedef struct {
    char (*names)[NV_ADAPTER_NAME_CAP];
    int *numbers, cap, n;
} names_arg;

static void add_name(void *arg, int k, const nv_adapter *a) {
    names_arg *o = arg;
    if (o->n == o->cap) return;
    if (o->numbers) o->numbers[o->n] = k;
    memcpy(o->names[o->n++], a->name, sizeof a->name);
}

int nv_adapters_names(nv_adapters *set, char (*names)[NV_ADAPTER_NAME_CAP], int *numbers, int cap) {
    names_arg o = {names, numbers, cap, 0};
    nv_adapters_each(set, add_name, &o);
    return o.n;
}

int nv_adapter_mix_find(const nv_adapter_mix *m, int k) {
    for (int i = 0; i < m->n; i++)
        if (m->k[i] == k) return i;
    return -1;
}

nv_err nv_adapter_mix_check(const nv_adapter_mix *m) {
    if (m->n < 0 || m->n > NV_MIX_ADAPTERS) return nv_fail(NV_EINVAL, "a mix of %d LoRA adapters (at most %d)", m->n, NV_MIX_ADAPTERS);
    for (int i = 0; i < m->n; i++)
        if (m->k[i] < 1 || m->k[i] > NV_MAX_ADAPTERS || (i && m->k[i] <= m->k[i - 1]) || !isfinite(m->factor[i]) || m->factor[i] == 0.0f)
            return nv_fail(NV_EINVAL, "a mix's adapter %d (factor %g) is out of range, out of order or of no factor", m->k[i],
                           (double)m->factor[i]);
    return NV_OK;
}

/* m's entries from `from` to its end moved to start at `to` (one place either way). */
static void mix_shift(nv_adapter_mix *m, int from, int to) {
    const size_t n = (size_t)(m->n - from);
    memmove(&m->k[to], &m->k[from], n * sizeof m->k[0]);
    memmove(&m->factor[to], &m->factor[from], n * sizeof m->factor[0]);
    memmove(&m->gen[to], &m->gen[from], n * sizeof m->gen[0]);
}

nv_err nv_adapter_mix_set(nv_adapter_mix *m, int k, unsigned gen, float f) {
    int at = 0;
    while (at < m->n && m->k[at] < k) at++;
    const int held = at < m->n && m->k[at] == k;
    if (f == 0.0f) { /* out */
        if (held) mix_shift(m, at + 1, at), m->n--;
        return NV_OK;
    }
    if (!held) {
        if (m->n == NV_MIX_ADAPTERS) return nv_fail(NV_ERANGE, "at most %d LoRA adapters at once", NV_MIX_ADAPTERS);
        mix_shift(m, at, at + 1), m->n++;
    }
    m->k[at] = k;
    m->gen[at] = gen;
    m->factor[at] = f;
    return NV_OK;
}

int nv_adapters_live_count(nv_adapters *set) {
    if (!set) return 0;
    pthread_mutex_lock(&set->mu);
    const int n = set->live;
    pthread_mutex_unlock(&set->mu);
    return n;
}

int nv_adapters_live(nv_adapters *set, int k, unsigned *gen) {
    if (!set || k < 1 || k > NV_MAX_ADAPTERS) return 0;
    pthread_mutex_lock(&set->mu);
    const int live = set->v[k - 1].state == NV_ADAPTER_LIVE;
    if (live && gen) *gen = set->v[k - 1].gen;
    pthread_mutex_unlock(&set->mu);
    return live;
}

int nv_adapters_pin_mix(nv_adapters *set, const nv_adapter_mix *m) {
    for (int i = 0; i < m->n; i++)
        if (!nv_adapters_pin(set, m->k[i], m->gen[i])) {
            while (i-- > 0) nv_adapters_unpin(set, m->k[i]);
            return 0;
        }
    return 1;
}

void nv_adapters_unpin_mix(nv_adapters *set, const nv_adapter_mix *m) {
    for (int i = 0; i < m->n; i++) nv_adapters_unpin(set, m->k[i]);
}

uint64_t nv_adapters_mix_root(const nv_adapters *set, const nv_adapter_mix *m) {
    if (m->n == 0) return 0;
    if (m->n == 1 && m->factor[0] == 1.0f) return set->v[m->k[0] - 1].hash; /* the adapter named as the model */
    uint64_t h = nv_hash64(&m->n, sizeof m->n, 0x6d6978u);
    for (int i = 0; i < m->n; i++) {
        h = nv_hash64(&set->v[m->k[i] - 1].hash, sizeof(uint64_t), h);
        h = nv_hash64(&m->factor[i], sizeof(float), h);
    }
    return h ? h : 1;
}

void nv_adapters_applied(nv_adapters *set, nv_adapter_mix *out) {
    out->n = 0;
    if (!set) return;
    pthread_mutex_lock(&set->mu);
    for (int i = 0; i < NV_MAX_ADAPTERS; i++)
        if (set->v[i].state == NV_ADAPTER_LIVE && set->v[i].applied != 0.0f) /* (at most NV_MIX_ADAPTERS: nv_adapters_apply's) */
            nv_adapter_mix_set(out, i + 1, set->v[i].gen, set->v[i].applied);
    pthread_mutex_unlock(&set->mu);
}

int nv_adapters_apply(nv_adapters *set, const nv_adapter_mix *m) {
    pthread_mutex_lock(&set->mu);
    int all = 1;
    for (int i = 0; i < m->n; i++) all &= set->v[m->k[i] - 1].state == NV_ADAPTER_LIVE && set->v[m->k[i] - 1].gen == m->gen[i];
    for (int i = 0; all && i < NV_MAX_ADAPTERS; i++) set->v[i].applied = 0.0f;
    for (int i = 0; all && i < m->n; i++) set->v[m->k[i] - 1].applied = m->factor[i];
    pthread_mutex_unlock(&set->mu);
    return all;
}

/* The widest input and output of a layer's adaptable matrices. */
static void widest_dims(const nv_config *c, int *in_max, int *out_max) {
    *in_max = *out_max = 0;
    for (int t = 0; t < NV_LAYER_MATRICES; t++) {
        int out, in;
        nv_lora_dims(c, t, &out, &in);
        if (in > *in_max) *in_max = in;
        if (out > *out_max) *out_max = out;
    }
}

/* Builds A's and B's plans of every targeted matrix from p (nv_lora_offset's layout: A, then B^T),
 * whose B^T become B' = k B in place (out x rank: the same floats); p then belongs to the plans
 * (some engines read their weights in place). */
static nv_err build_plans(nv_adapter *ad, const nv_model *m, float *p, float k) {
    const nv_config *c = &m->config;
    const nv_lora_shape *s = &ad->shape;
    const int r = s->rank, n_plans = c->n_layers * NV_LAYER_MATRICES;
    const nv_engine_id e = nv_model_engine(m);
    ad->a = calloc((size_t)n_plans, sizeof *ad->a);
    ad->b = calloc((size_t)n_plans, sizeof *ad->b);
    int in_max, widest;
    widest_dims(c, &in_max, &widest);
    float *tmp = malloc((size_t)widest * (size_t)r * sizeof(float));
    if (!ad->a || !ad->b || !tmp) {
        free(tmp);
        return nv_fail(NV_ENOMEM, "out of memory for the plans of adapter %s", ad->name);
    }
    nv_err err = NV_OK;
    for (int l = 0; l < c->n_layers && err == NV_OK; l++)
        for (int t = 0; t < NV_LAYER_MATRICES && err == NV_OK; t++) {
            if (!(s->targets & (1u << t))) continue;
            int out, in;
            nv_lora_dims(c, t, &out, &in);
            float *a = p + nv_lora_offset(c, s, l, t), *b = a + (size_t)r * in;
            int finite = 1;
            for (int o = 0; o < out; o++)
                for (int j = 0; j < r; j++) finite &= isfinite(tmp[(size_t)o * r + j] = k * b[(size_t)j * out + o]);
            if (!finite) {
                err = nv_fail(NV_EINVAL, "adapter %s (%s): alpha / rank x B is not finite (alpha %g)", ad->name, ad->path,
                              (double)s->alpha);
                break;
            }
            memcpy(b, tmp, (size_t)out * (size_t)r * sizeof(float));
            const int at = l * NV_LAYER_MATRICES + t;
            err = nv_plan_build(&ad->a[at], e, a, r, in);
            if (err == NV_OK) err = nv_plan_build(&ad->b[at], e, b, out, r);
        }
    free(tmp);
    return err;
}

nv_err nv_adapters_check_name(const char *name) {
    const size_t len = strlen(name);
    if (len < 1 || len >= NV_ADAPTER_NAME_CAP)
        return nv_fail(NV_EINVAL, "adapter name '%.80s': 1 to %d characters", name, NV_ADAPTER_NAME_CAP - 1);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f) return nv_fail(NV_EINVAL, "adapter name: no control characters");
    return NV_OK;
}

nv_err nv_adapters_add(nv_adapters *set, const nv_model *m, const char *name, const char *path, float scale) {
    const nv_config *c = &m->config;
    if (!m->plans) return nv_fail(NV_EINVAL, "adapter %s: the model's plans are not built", name);
    NV_TRY(nv_adapters_check_name(name));
    const size_t len = strlen(name);
    if (!(scale == scale) || scale < -1e6f || scale > 1e6f)
        return nv_fail(NV_EINVAL, "adapter %s: scale must be a number in -1e6..1e6", name);
    /* the name and a slot are taken under the lock; the file is read and the plans built outside it */
    pthread_mutex_lock(&set->mu);
    int slot = -1;
    nv_err err = NV_OK;
    if (slot_of(set, name, 1) >= 0) err = nv_fail(NV_EINVAL, "adapter name '%s' is given twice", name);
    else if (set->live && set->n_layers != c->n_layers) err = nv_fail(NV_EINVAL, "adapter %s: another model's set", name);
    for (int i = 0; err == NV_OK && slot < 0 && i < NV_MAX_ADAPTERS; i++)
        if (set->v[i].state == NV_ADAPTER_FREE) slot = i;
    if (err == NV_OK && slot < 0)
        err = nv_fail(NV_EINVAL, "no room for adapter %s: %d are loaded, loading, or removed with requests still on them", name,
                      NV_MAX_ADAPTERS);
    nv_adapter *ad = slot >= 0 ? &set->v[slot] : NULL;
    if (err == NV_OK) {
        ad->state = NV_ADAPTER_LOADING;
        memcpy(ad->name, name, len + 1);
        set->n_layers = c->n_layers;
    }
    pthread_mutex_unlock(&set->mu);
    if (err != NV_OK) return err;
    float *p = NULL;
    err = nv_lora_load(path, c, &ad->shape, &p);
    if (err == NV_OK && ad->shape.rank > set->max_rank)
        err = nv_fail(NV_EINVAL, "adapter %s (%s): rank %d is above this server's largest, %d (--max-lora-rank)", name, path,
                      ad->shape.rank, set->max_rank);
    ad->path = strdup(path);
    ad->scale = scale;
    ad->n_params = nv_lora_param_count(c, &ad->shape);
    if (err == NV_OK && !ad->path) err = nv_fail(NV_ENOMEM, "out of memory for adapter %s", name);
    ad->w = p;
    if (err == NV_OK) err = build_plans(ad, m, p, scale * ad->shape.alpha / (float)ad->shape.rank);
    if (err == NV_OK) {
        /* what the rows' keys and values depend on besides the base: A and the scaled B */
        const uint32_t meta[2] = {(uint32_t)ad->shape.rank, ad->shape.targets};
        const uint64_t h = nv_hash64(p, ad->n_params * sizeof(float), nv_hash64(meta, sizeof meta, 0x6c6f7261u));
        ad->hash = h ? h : 1;
    }
    pthread_mutex_lock(&set->mu);
    if (err != NV_OK) {
        adapter_free(ad, c->n_layers * NV_LAYER_MATRICES);
    } else {
        ad->gen++;
        ad->state = NV_ADAPTER_LIVE;
        set->live++;
    }
    pthread_mutex_unlock(&set->mu);
    return err;
}

nv_err nv_adapter_rows_init(nv_adapter_rows *r, const nv_config *c, const nv_adapters *set, int max_rows) {
    memset(r, 0, sizeof *r);
    int in_max, out_max;
    widest_dims(c, &in_max, &out_max);
    r->set = set;
    r->gx = malloc((size_t)max_rows * (size_t)in_max * sizeof(float));
    r->u = malloc((size_t)max_rows * (size_t)set->max_rank * sizeof(float)); /* max_rank >= 1 (nv_adapters_init) */
    r->dy = malloc((size_t)max_rows * (size_t)out_max * sizeof(float));
    int ok = r->gx && r->u && r->dy;
    for (int w = 0; w < NV_MIX_ADAPTERS && ok; w++) {
        nv_adapter_wave *v = &r->wave[w];
        v->order = malloc((size_t)max_rows * sizeof(int));
        v->factor = malloc((size_t)max_rows * sizeof(float));
        v->units = malloc(((size_t)max_rows + NV_MAX_ADAPTERS) * sizeof *v->units);
        ok = v->order && v->factor && v->units;
    }
    if (ok) return NV_OK;
    nv_adapter_rows_free(r);
    return nv_fail(NV_ENOMEM, "cannot allocate the adapters' scratch (%d rows)", max_rows);
}

void nv_adapter_rows_free(nv_adapter_rows *r) {
    for (int w = 0; w < NV_MIX_ADAPTERS; w++) {
        free(r->wave[w].order);
        free(r->wave[w].factor);
        free(r->wave[w].units);
    }
    free(r->gx);
    free(r->u);
    free(r->dy);
    memset(r, 0, sizeof *r);
}

void nv_adapter_rows_group(nv_adapter_rows *r, const nv_adapter_mix *const *row_mix, int n) {
    r->n = n;
    r->n_waves = 0;
    r->targets = 0;
    for (int i = 0; i < n; i++)
        if (row_mix[i] && row_mix[i]->n > r->n_waves) r->n_waves = row_mix[i]->n;
    for (int w = 0; w < r->n_waves; w++) {
        nv_adapter_wave *v = &r->wave[w];
        unsigned char present[NV_MAX_ADAPTERS + 1] = {0};
        for (int i = 0; i < n; i++)
            if (row_mix[i] && row_mix[i]->n > w) present[row_mix[i]->k[w]] = 1;
        v->n_units = 0;
        int p = 0;
        for (int k = 1; r->set && k <= NV_MAX_ADAPTERS; k++) {
            if (!present[k]) continue;
            const int p0 = p;
            for (int i = 0; i < n; i++)
                if (row_mix[i] && row_mix[i]->n > w && row_mix[i]->k[w] == k) v->factor[p] = row_mix[i]->factor[w], v->order[p++] = i;
            r->targets |= r->set->v[k - 1].shape.targets;
            for (int q = p0; q < p; q += NV_ADAPTER_UNIT)
                v->units[v->n_units++] = (nv_adapter_unit){k, q, q + NV_ADAPTER_UNIT < p ? q + NV_ADAPTER_UNIT : p};
        }
    }
}

typedef struct {
    const nv_adapter_rows *r;
    const nv_adapter_wave *w;
    size_t at; /* the matrix's index among the adapter's plans */
    unsigned bit;
    int out, in;
    const float *x;
    float *y;
} add_job;

static void add_unit(const add_job *j, const nv_adapter_unit *un) {
    const nv_adapter_rows *r = j->r;
    const nv_adapter *ad = &r->set->v[un->adapter - 1];
    if (!(ad->shape.targets & j->bit)) return;
    const int cnt = un->p1 - un->p0, *rows = j->w->order + un->p0, rank = ad->shape.rank;
    const float *factor = j->w->factor + un->p0;
    const int in = j->in, out = j->out;
    const float *xs = j->x + (size_t)rows[0] * in; /* a run of consecutive rows (a sequence's) is read in place */
    if (rows[cnt - 1] - rows[0] + 1 != cnt) {
        float *g = r->gx + (size_t)un->p0 * in;
        for (int q = 0; q < cnt; q++) memcpy(g + (size_t)q * in, j->x + (size_t)rows[q] * in, (size_t)in * sizeof(float));
        xs = g;
    }
    float *u = r->u + (size_t)un->p0 * r->set->max_rank, *dy = r->dy + (size_t)un->p0 * out;
    nv_plan_run(ad->a[j->at], xs, cnt, u);
    for (int q = 0; q < cnt; q++) /* a mix's factor on A x: rank multiplies, not out */
        if (factor[q] != 1.0f)
            for (int i = 0; i < rank; i++) u[(size_t)q * rank + i] *= factor[q];
    nv_plan_run(ad->b[j->at], u, cnt, dy);
    for (int q = 0; q < cnt; q++) {
        float *yr = j->y + (size_t)rows[q] * out;
        const float *d = dy + (size_t)q * out;
        for (int o = 0; o < out; o++) yr[o] += d[o];
    }
}

static void add_task(void *ctx, int task, int n_tasks) {
    const add_job *j = ctx;
    for (int i = task; i < j->w->n_units; i += n_tasks) add_unit(j, &j->w->units[i]);
}

void nv_adapter_rows_add(const nv_adapter_rows *r, const nv_config *c, int l, int t, const float *x, float *y) {
    if (!nv_adapter_rows_target(r, t)) return;
    add_job j = {r, NULL, (size_t)l * NV_LAYER_MATRICES + (size_t)t, 1u << t, 0, 0, x, y};
    nv_lora_dims(c, t, &j.out, &j.in);
    /* inside a task a plan runs on that thread alone: one unit runs here, several share the pool */
    const int tasks = nv_pool_threads();
    for (int w = 0; w < r->n_waves; w++) { /* waves one after another: a row is in each at most once */
        j.w = &r->wave[w];
        nv_pool_run(add_task, &j, j.w->n_units < tasks ? j.w->n_units : tasks);
    }
}
