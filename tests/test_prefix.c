/* The prefix cache's parts, in process: the hashes and the hash map (base/hash.h), the pool's
 * idle list of cached blocks (serve/kv.h), the RAM index and the model identity
 * (serve/prefix.h), and the SSD tier (serve/disk.h): round trips, re-indexing, files that are
 * corrupted, truncated, of another model or format version, the size cap's LRU order, a full
 * write queue, and a writer that fails (a file size limit). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "base/hash.h"
#include "base/rng.h"
#include "engine/engine.h"
#include "model/model.h"
#include "serve/disk.h"
#include "serve/kv.h"
#include "serve/prefix.h"
#include "t.h"

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

#define GOLDEN_CK1 0xa2a96c4c16a403e0ull
#define GOLDEN_CK2 0x180baac43d6842a6ull
#define GOLDEN_H1 0xa70c3e19646b76eeull /* nv_hash64: part of the KV block file format */
#define GOLDEN_H2 0x240a961254a5ba6dull

/* ---- hashes and the map ---------------------------------------------------------------------------- */

static void test_hashes(void) {
    uint8_t buf[1000];
    for (int i = 0; i < 1000; i++) buf[i] = (uint8_t)(i * 7 + 3);
    /* the checkpoint format's checksum keeps its values (these are the values of the code in
       train/ckpt.c before it moved to base/hash.c) */
    T_CHECK(nv_checksum64(buf, 1000, 0) == GOLDEN_CK1 && nv_checksum64("nerve", 5, 42) == GOLDEN_CK2,
            "checksum64 changed: %" PRIx64 " %" PRIx64, nv_checksum64(buf, 1000, 0), nv_checksum64("nerve", 5, 42));
    T_CHECK(nv_hash64(buf, 1000, 0) == GOLDEN_H1 && nv_hash64("nerve", 5, 42) == GOLDEN_H2,
            "hash64 changed (the block file format): %" PRIx64 " %" PRIx64, nv_hash64(buf, 1000, 0), nv_hash64("nerve", 5, 42));
    uint64_t base = nv_hash64(buf, 1000, 0);
    int same = 0;
    for (int i = 0; i < 1000; i += 37) /* every byte position matters, lanes and tail alike */
        for (int bit = 0; bit < 8; bit += 3) {
            buf[i] ^= (uint8_t)(1u << bit);
            same += nv_hash64(buf, 1000, 0) == base;
            buf[i] ^= (uint8_t)(1u << bit);
        }
    T_CHECK(same == 0, "%d single-bit flips left nv_hash64 unchanged", same);
    T_CHECK(nv_hash64(buf, 1000, 0) == base && nv_hash64(buf, 1000, 1) != base && nv_hash64(buf, 999, 0) != base,
            "seed or length ignored");
    /* alignment does not matter */
    uint8_t *u = malloc(1001);
    memcpy(u + 1, buf, 1000);
    T_CHECK(nv_hash64(u + 1, 1000, 0) == base, "unaligned input hashes differently");
    free(u);
    /* the chain hash depends on the model, the parent and every token */
    int toks[16];
    for (int i = 0; i < 16; i++) toks[i] = 100 + i;
    uint64_t h = nv_prefix_chain(1, 0, toks, 16);
    T_CHECK(h != 0 && h != nv_prefix_chain(2, 0, toks, 16) && h != nv_prefix_chain(1, 7, toks, 16), "chain ignores model or parent");
    toks[15]++;
    T_CHECK(h != nv_prefix_chain(1, 0, toks, 16), "chain ignores the last token");
}

static void test_map(void) {
    nv_map64 m;
    T_CHECK(nv_map64_init(&m, 4) == NV_OK, "init");
    enum { N = 5000 };
    uint64_t *keys = malloc(N * sizeof *keys);
    uint64_t st = 99;
    for (int i = 0; i < N; i++) {
        keys[i] = ((uint64_t)nv_xorshift_u32(&st) << 32 | nv_xorshift_u32(&st)) & ~0xFull; /* clustered low bits */
        keys[i] |= (uint64_t)(i & 0xF);
        T_CHECK(nv_map64_put(&m, keys[i], i) == NV_OK, "put");
    }
    T_CHECK(m.n == N, "n %zu", m.n);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += nv_map64_get(&m, keys[i]) != i;
    T_CHECK(bad == 0, "%d lookups wrong", bad);
    for (int i = 0; i < N; i += 2) bad += nv_map64_del(&m, keys[i]) != 1;
    for (int i = 0; i < N; i++) bad += nv_map64_get(&m, keys[i]) != (i % 2 ? i : -1);
    T_CHECK(bad == 0 && m.n == N / 2, "%d wrong after deleting half", bad);
    T_CHECK(nv_map64_del(&m, keys[0]) == 0 && nv_map64_get(&m, 12345) == -1, "absent keys");
    for (int i = 0; i < N; i += 2) nv_map64_put(&m, keys[i], i + 1);
    for (int i = 0; i < N; i++) bad += nv_map64_get(&m, keys[i]) != (i % 2 ? i : i + 1);
    T_CHECK(bad == 0, "%d wrong after re-inserting", bad);
    free(keys);
    nv_map64_free(&m);
}

/* ---- the pool's idle list and the RAM index -------------------------------------------------------- */

static int evicted[64], n_evicted;
static void record_evict(void *ctx, int32_t b) {
    (void)ctx;
    if (n_evicted < 64) evicted[n_evicted++] = b;
}

static int pool_consistent(const nv_kv_pool *p) {
    int in_use = 0;
    for (int b = 0; b < p->n_blocks; b++) in_use += p->refs[b] > 0;
    return in_use == nv_kv_in_use(p) && p->n_free + p->n_idle + in_use == p->n_blocks && p->n_reserved <= p->n_free + p->n_idle;
}

static void fill_block(nv_kv_pool *p, int32_t b, int first_token) {
    for (int t = 0; t < p->block_size; t++) nv_kv_record(p, b, t, first_token + t);
}

static void test_pool_idle_list(void) {
    nv_config c;
    nv_config_preset("stories260K", &c);
    nv_kv_pool p;
    size_t bb = nv_kv_block_bytes(&c, 4, NV_KV_F32);
    T_CHECK(nv_kv_pool_init(&p, &c, NV_KV_LAYERS_ALL, 4, NV_KV_F32, bb * 6, 0) == NV_OK && p.n_blocks == 6, "init");
    p.on_evict = record_evict;
    n_evicted = 0;
    T_CHECK(nv_kv_reserve(&p, 3), "reserve");
    int32_t a = nv_kv_alloc(&p), b = nv_kv_alloc(&p), d = nv_kv_alloc(&p);
    fill_block(&p, a, 10);
    fill_block(&p, b, 20);
    nv_kv_set_cached(&p, a);
    nv_kv_set_cached(&p, b);
    nv_kv_unref(&p, b); /* b idle first, then a: a is the more recently used */
    nv_kv_unref(&p, a);
    nv_kv_unref(&p, d);
    T_CHECK(p.n_idle == 2 && p.n_free == 4 && nv_kv_in_use(&p) == 0 && nv_kv_available(&p) == 6 && pool_consistent(&p),
            "idle %d free %d in use %d", p.n_idle, p.n_free, nv_kv_in_use(&p));
    T_CHECK(p.fill[a] == 4 && p.tokens[(size_t)a * 4 + 3] == 13, "an idle block lost its contents");
    /* reservations count idle blocks; allocation past the free list evicts the LRU idle block */
    T_CHECK(nv_kv_reserve(&p, 6) && !nv_kv_reserve(&p, 1), "reserve counts free + idle");
    int32_t got[6];
    for (int i = 0; i < 5; i++) got[i] = nv_kv_alloc(&p);
    T_CHECK(n_evicted == 1 && evicted[0] == b && got[4] == b && !p.cached[b] && p.n_idle == 1 && pool_consistent(&p),
            "the LRU idle block was not the one evicted (%d evictions, first %d, b %d)", n_evicted, evicted[0], b);
    /* reviving the idle block takes it off the idle list: a caller does it only when
       nv_kv_available() covers it (here after giving back the last reservation) */
    T_CHECK(nv_kv_available(&p) == 0, "available %d", nv_kv_available(&p));
    nv_kv_unreserve(&p, 1);
    T_CHECK(nv_kv_available(&p) == 1, "available %d", nv_kv_available(&p));
    nv_kv_ref(&p, a);
    T_CHECK(p.n_idle == 0 && p.refs[a] == 1 && p.cached[a] && pool_consistent(&p), "revive");
    for (int i = 0; i < 5; i++) nv_kv_unref(&p, got[i]);
    nv_kv_unref(&p, a);
    T_CHECK(p.n_idle == 1 && p.n_free == 5 && p.n_reserved == 0 && pool_consistent(&p), "end: idle %d free %d reserved %d",
            p.n_idle, p.n_free, p.n_reserved);
    /* the idle budget */
    nv_kv_set_max_idle(&p, 0);
    T_CHECK(p.n_idle == 0 && p.n_free == 6 && n_evicted == 2 && evicted[1] == a, "max_idle 0 keeps an idle block");
    nv_kv_pool_free(&p);
}

static void test_prefix_index(void) {
    nv_config c;
    nv_config_preset("stories260K", &c);
    nv_kv_pool p;
    T_CHECK(nv_kv_pool_init(&p, &c, NV_KV_LAYERS_ALL, 4, NV_KV_F32, nv_kv_block_bytes(&c, 4, NV_KV_F32) * 4, 0) == NV_OK, "init");
    nv_prefix px;
    T_CHECK(nv_prefix_init(&px, &p, 77) == NV_OK, "prefix init");
    nv_kv_reserve(&p, 4);
    int32_t a = nv_kv_alloc(&p), b = nv_kv_alloc(&p);
    int ta[4] = {1, 2, 3, 4}, tb[4] = {5, 6, 7, 8};
    for (int t = 0; t < 4; t++) nv_kv_record(&p, a, t, ta[t]);
    for (int t = 0; t < 3; t++) nv_kv_record(&p, b, t, tb[t]);
    uint64_t ha = nv_prefix_chain(77, 0, ta, 4), hb = nv_prefix_chain(77, ha, tb, 4);
    T_CHECK(nv_prefix_insert(&px, b, hb, ha) == 0, "a block that is not full was indexed");
    nv_kv_record(&p, b, 3, tb[3]);
    T_CHECK(nv_prefix_insert(&px, a, ha, 0) == 1 && nv_prefix_insert(&px, b, hb, ha) == 1 && nv_prefix_blocks(&px) == 2, "insert");
    T_CHECK(nv_prefix_insert(&px, a, ha, 0) == 0, "indexed twice");
    T_CHECK(nv_prefix_find(&px, ha, 0, ta) == a && nv_prefix_find(&px, hb, ha, tb) == b, "find");
    int wrong[4] = {1, 2, 3, 5};
    T_CHECK(nv_prefix_find(&px, ha, 0, wrong) == -1, "a hash whose tokens differ was found");
    T_CHECK(nv_prefix_find(&px, hb, 12345, tb) == -1, "a block under another parent was found");
    /* another block with the same content is not indexed (it stays private) */
    int32_t a2 = nv_kv_alloc(&p);
    for (int t = 0; t < 4; t++) nv_kv_record(&p, a2, t, ta[t]);
    T_CHECK(nv_prefix_insert(&px, a2, ha, 0) == 0 && !p.cached[a2], "duplicate indexed");
    nv_kv_unref(&p, a2);
    /* idle blocks stay findable; eviction forgets them */
    nv_kv_unref(&p, b);
    nv_kv_unref(&p, a);
    T_CHECK(p.n_idle == 2 && nv_prefix_find(&px, ha, 0, ta) == a, "idle block not findable");
    nv_kv_set_max_idle(&p, 1); /* evicts b (least recently used) */
    T_CHECK(nv_prefix_find(&px, hb, ha, tb) == -1 && nv_prefix_find(&px, ha, 0, ta) == a && nv_prefix_blocks(&px) == 1,
            "eviction did not update the index");
    nv_kv_unreserve(&p, 1);
    T_CHECK(pool_consistent(&p), "pool");
    nv_prefix_free(&px);
    nv_kv_pool_free(&p);
}

static void test_model_identity(void) {
    nv_config c = {32, 64, 2, 4, 2, 8, 64, 32, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    nv_model m;
    T_CHECK(nv_model_alloc(&m, &c) == NV_OK, "%s", nv_errmsg());
    nv_model_init_random(&m, 3);
    T_CHECK(nv_model_build_plans(&m, NV_ENGINE_SCALAR) == NV_OK, "%s", nv_errmsg());
    uint64_t id = nv_prefix_model_id(&m, 16, NV_KV_F32);
    T_CHECK(id == nv_prefix_model_id(&m, 16, NV_KV_F32), "not deterministic");
    T_CHECK(id != nv_prefix_model_id(&m, 8, NV_KV_F32), "block size ignored");
    T_CHECK(id != nv_prefix_model_id(&m, 16, NV_KV_F16), "element type ignored");
    m.params[m.n_params - 1] += 1e-6f; /* the very last weight */
    T_CHECK(id != nv_prefix_model_id(&m, 16, NV_KV_F32), "weights ignored");
    m.params[m.n_params - 1] -= 1e-6f;
    /* Ministral 3's query temperature changes later layers' keys and values: its scale and its length */
    m.config.attn_temp_scale = 0.1f, m.config.attn_temp_len = 16;
    const uint64_t temp = nv_prefix_model_id(&m, 16, NV_KV_F32);
    m.config.attn_temp_len = 8;
    T_CHECK(temp != id && nv_prefix_model_id(&m, 16, NV_KV_F32) != temp, "the attention temperature is not part of the identity");
    m.config = c;
    nv_engine_id best = nv_engine_best();
    if (best != NV_ENGINE_SCALAR) {
        nv_model m2;
        nv_model_alloc(&m2, &c);
        nv_model_init_random(&m2, 3);
        nv_model_build_plans(&m2, best);
        T_CHECK(nv_prefix_model_id(&m2, 16, NV_KV_F32) != id, "the engine is not part of the identity");
        nv_model_free(&m2);
    }
    nv_model_free(&m);
}

/* ---- the SSD tier ------------------------------------------------------------------------------------- */

#define DB 4  /* block size */
#define DL 2  /* layers */
#define DKV 8 /* kv_dim */
#define PAYLOAD (DL * 2 * DB * DKV * 4)
#define FILE_BYTES (NV_DISK_HEADER_BYTES + 4 * DB + PAYLOAD)

static nv_disk_opts disk_opts(const char *root, uint64_t model, uint64_t max_bytes, int queue) {
    nv_disk_opts o = {.root = root, .model_id = model, .block_size = DB, .n_layers = DL, .kv_dim = DKV, .n_kv_heads = 2,
                      .dtype = NV_KV_F32, .max_bytes = max_bytes, .queue_cap = queue};
    return o;
}

typedef struct {
    int tokens[DB];
    uint8_t payload[PAYLOAD];
    uint64_t hash, parent;
} blk;

/* A chain of n blocks of model `model` with deterministic contents. */
static void make_chain(blk *b, int n, uint64_t model, int seed) {
    uint64_t parent = 0;
    for (int i = 0; i < n; i++) {
        for (int t = 0; t < DB; t++) b[i].tokens[t] = seed * 1000 + i * DB + t;
        for (int k = 0; k < PAYLOAD; k++) b[i].payload[k] = (uint8_t)(seed * 31 + i * 7 + k);
        b[i].parent = parent;
        b[i].hash = parent = nv_prefix_chain(model, parent, b[i].tokens, DB);
    }
}

/* Queues blocks [from, to) and waits until the writer handed them all back. */
static int write_chain(nv_disk *d, blk *b, int from, int to) {
    int queued = 0, back = 0;
    for (int i = from; i < to; i++) {
        nv_disk_job j = {b[i].hash, b[i].parent, (const int32_t *)b[i].tokens, b[i].payload, i};
        queued += nv_disk_enqueue(d, &j);
        int32_t got[16];
        while (back < queued - 1) back += nv_disk_reap(d, got, 16), sleep_ms(1);
    }
    int32_t got[16];
    for (int t = 0; back < queued && t < 5000; t++) back += nv_disk_reap(d, got, 16), sleep_ms(1);
    return queued;
}

static const char *model_dir(const char *root, uint64_t model) {
    static char buf[8][700];
    static int next;
    char *b = buf[next++ & 7];
    snprintf(b, sizeof buf[0], "%s/%016" PRIx64, root, model);
    return b;
}

static const char *block_file(const char *root, uint64_t model, uint64_t hash) {
    static char buf[8][760];
    static int next;
    char *b = buf[next++ & 7];
    snprintf(b, sizeof buf[0], "%s/%016" PRIx64 ".kvb", model_dir(root, model), hash);
    return b;
}

static long file_size(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 ? (long)sb.st_size : -1;
}

static int load_ok(nv_disk *d, const blk *b) {
    uint8_t got[PAYLOAD];
    return nv_disk_load(d, b->hash, b->parent, b->tokens, got) && memcmp(got, b->payload, PAYLOAD) == 0;
}

static void test_disk_round_trip(void) {
    const char *root = t_path("rt");
    blk b[5];
    make_chain(b, 5, 0xA1, 1);
    nv_disk *d;
    T_CHECK(nv_disk_open(&d, &(nv_disk_opts){0}) != NV_OK, "opened without a directory");
    nv_disk_opts o = disk_opts(root, 0xA1, 1 << 20, 8);
    T_CHECK(nv_disk_open(&d, &o) == NV_OK, "%s", nv_errmsg());
    if (!d) return;
    T_CHECK(nv_disk_file_bytes(d) == FILE_BYTES, "file bytes %" PRIu64, nv_disk_file_bytes(d));
    T_CHECK(write_chain(d, b, 0, 5) == 5, "not all queued");
    nv_disk_stats st;
    nv_disk_stats_get(d, &st);
    T_CHECK(st.files == 5 && st.bytes == 5 * FILE_BYTES && st.writes == 5 && st.queue_depth == 0 && st.writer_up, "stats");
    T_CHECK(nv_disk_has(d, b[2].hash) && !nv_disk_has(d, 42), "has");
    nv_disk_job again = {b[1].hash, b[1].parent, (const int32_t *)b[1].tokens, b[1].payload, 1};
    T_CHECK(nv_disk_enqueue(d, &again) == 0, "a block already on disk was queued again");
    T_CHECK(file_size(block_file(root, 0xA1, b[3].hash)) == FILE_BYTES, "file missing or of the wrong size");
    nv_disk_close(d);
    nv_disk_free(d);
    /* a restart indexes them again, and they read back exactly */
    T_CHECK(nv_disk_open(&d, &o) == NV_OK, "%s", nv_errmsg());
    nv_disk_stats_get(d, &st);
    T_CHECK(st.files == 5 && st.rejected == 0, "re-index found %ld files, rejected %" PRIu64, st.files, st.rejected);
    int ok = 0;
    for (int i = 0; i < 5; i++) ok += load_ok(d, &b[i]);
    T_CHECK(ok == 5, "%d of 5 blocks read back", ok);
    /* a lookup with other tokens under the same name is refused (and the file goes) */
    blk wrong = b[4];
    wrong.tokens[0]++;
    uint8_t tmp[PAYLOAD];
    T_CHECK(!nv_disk_load(d, wrong.hash, wrong.parent, wrong.tokens, tmp), "tokens not compared");
    nv_disk_free(d);
    /* fp32 blocks are never read into fp16 pages (nor an unknown element type opened) */
    nv_disk_opts o16 = o;
    o16.dtype = NV_KV_F16;
    T_CHECK(nv_disk_open(&d, &o16) == NV_OK, "%s", nv_errmsg());
    if (!d) return;
    nv_disk_stats_get(d, &st);
    T_CHECK(st.files == 0 && st.rejected == 4, "fp16 index found %ld fp32 files, rejected %" PRIu64, st.files, st.rejected);
    nv_disk_free(d);
    o16.dtype = (nv_kv_dtype)7;
    T_CHECK(nv_disk_open(&d, &o16) != NV_OK, "an unknown element type opened");
}

/* Rewrites the header's version and checksum of a block file. */
static void patch_version(const char *path, uint32_t version) {
    int fd = open(path, O_RDWR);
    uint8_t h[NV_DISK_HEADER_BYTES + 4 * DB];
    if (fd < 0 || pread(fd, h, sizeof h, 0) != (ssize_t)sizeof h) {
        if (fd >= 0) close(fd);
        return;
    }
    memcpy(h + 8, &version, 4);
    uint64_t sum = nv_checksum64(h, 72, 0);
    sum = nv_checksum64(h + NV_DISK_HEADER_BYTES, 4 * DB, sum);
    memcpy(h + 72, &sum, 8);
    T_CHECK(pwrite(fd, h, sizeof h, 0) == (ssize_t)sizeof h, "patch");
    close(fd);
}

static void flip_byte(const char *path, long off) {
    int fd = open(path, O_RDWR);
    uint8_t c = 0;
    if (fd >= 0 && pread(fd, &c, 1, off) == 1) {
        c ^= 0x40;
        T_CHECK(pwrite(fd, &c, 1, off) == 1, "flip");
    }
    if (fd >= 0) close(fd);
}

static void copy_file(const char *from, const char *to) {
    char *data = NULL;
    size_t n = 0;
    if (nv_file_read_all(from, &data, &n) != NV_OK) return;
    FILE *f = fopen(to, "wb");
    if (f) {
        fwrite(data, 1, n, f);
        fclose(f);
    }
    free(data);
}

static void test_disk_rejects_bad_files(void) {
    const char *root = t_path("bad");
    blk b[8], other[2];
    make_chain(b, 8, 0xB1, 2);
    make_chain(other, 2, 0xB2, 3);
    nv_disk *d, *d2;
    nv_disk_opts o = disk_opts(root, 0xB1, 1 << 20, 8), o2 = disk_opts(root, 0xB2, 1 << 20, 8);
    T_CHECK(nv_disk_open(&d, &o) == NV_OK && nv_disk_open(&d2, &o2) == NV_OK, "%s", nv_errmsg());
    if (!d || !d2) return;
    write_chain(d, b, 0, 8);
    write_chain(d2, other, 0, 2);
    nv_disk_free(d);
    nv_disk_free(d2);
    const char *dir = model_dir(root, 0xB1);
    /* 0: payload corrupted (caught when loaded); 1: truncated; 2: one byte longer; 3: format version 2;
       4: header corrupted (a token); 5: replaced by another model's block (swap); 6: another model's
       block under a name of its own; 7: left alone */
    flip_byte(block_file(root, 0xB1, b[0].hash), NV_DISK_HEADER_BYTES + 4 * DB + 100);
    T_CHECK(truncate(block_file(root, 0xB1, b[1].hash), FILE_BYTES - 7) == 0, "truncate");
    T_CHECK(truncate(block_file(root, 0xB1, b[2].hash), FILE_BYTES + 1) == 0, "extend");
    patch_version(block_file(root, 0xB1, b[3].hash), NV_DISK_VERSION + 1);
    flip_byte(block_file(root, 0xB1, b[4].hash), NV_DISK_HEADER_BYTES + 2);
    copy_file(block_file(root, 0xB2, other[0].hash), block_file(root, 0xB1, b[5].hash));
    copy_file(block_file(root, 0xB2, other[1].hash), block_file(root, 0xB1, other[1].hash));
    /* a stale temporary file (a crash mid-write) goes; a fresh one (another writer) stays; other names stay */
    char stale[800], fresh[800], notes[800];
    snprintf(stale, sizeof stale, "%s/0000000000000001.kvb.tmp.1.1", dir);
    snprintf(fresh, sizeof fresh, "%s/0000000000000002.kvb.tmp.1.2", dir);
    snprintf(notes, sizeof notes, "%s/notes.txt", dir);
    copy_file(block_file(root, 0xB1, b[7].hash), stale);
    copy_file(block_file(root, 0xB1, b[7].hash), fresh);
    copy_file(block_file(root, 0xB1, b[7].hash), notes);
    struct timespec old[2] = {{1000000000, 0}, {1000000000, 0}};
    utimensat(AT_FDCWD, stale, old, 0);

    T_CHECK(nv_disk_open(&d, &o) == NV_OK, "%s", nv_errmsg());
    if (!d) return;
    nv_disk_stats st;
    nv_disk_stats_get(d, &st);
    T_CHECK(st.files == 3 && st.rejected == 6, "after re-indexing: %ld files, %" PRIu64 " rejected (want 3, 6)", st.files,
            st.rejected);
    for (int i = 1; i <= 5; i++)
        T_CHECK(file_size(block_file(root, 0xB1, b[i].hash)) < 0, "bad file %d was not removed", i);
    T_CHECK(file_size(block_file(root, 0xB1, other[1].hash)) < 0, "another model's block was not removed");
    T_CHECK(file_size(stale) < 0 && file_size(fresh) > 0 && file_size(notes) > 0, "temporary or foreign files mishandled");
    T_CHECK(file_size(block_file(root, 0xB2, other[0].hash)) == FILE_BYTES, "the other model's own files were touched");
    for (int i = 1; i <= 5; i++) T_CHECK(!nv_disk_has(d, b[i].hash), "bad block %d is indexed", i);
    /* the corrupted payload passes the index but never a load; the file goes */
    T_CHECK(nv_disk_has(d, b[0].hash) && !load_ok(d, &b[0]), "a corrupted payload was used");
    T_CHECK(!nv_disk_has(d, b[0].hash) && file_size(block_file(root, 0xB1, b[0].hash)) < 0, "corrupted file kept");
    T_CHECK(load_ok(d, &b[6]) && load_ok(d, &b[7]), "good blocks lost");
    nv_disk_stats_get(d, &st);
    T_CHECK(st.files == 2 && st.rejected == 7 && st.load_failures == 1 && st.loads == 2, "stats after loads");
    /* a block file removed behind the tier's back is a miss, not an error */
    unlink(block_file(root, 0xB1, b[7].hash));
    T_CHECK(!load_ok(d, &b[7]) && !nv_disk_has(d, b[7].hash), "vanished file");
    nv_disk_free(d);
}

/* Files that are not what their place says: a part's block copied into the other part of the same
 * model (equal layer counts: same size and geometry) is refused; a FIFO under a block's name blocks
 * neither the start nor a load; a folder under a block's name drops that block alone (the writer
 * goes on); the tier's folder and files are its owner's alone. */
static void test_disk_parts_and_strangers(void) {
    const char *root = t_path("parts");
    blk b[3];
    make_chain(b, 3, 0xC1, 4);
    nv_disk_opts full = disk_opts(root, 0xC1, 1 << 20, 8), win = full;
    full.part = "full", win.part = "windowed";
    nv_disk *d = NULL, *w = NULL;
    T_CHECK(nv_disk_open(&w, &win) == NV_OK, "%s", nv_errmsg());
    if (!w) return;
    write_chain(w, b, 0, 1);
    nv_disk_free(w);
    char from[800], to[800], dir[760];
    snprintf(from, sizeof from, "%s-windowed/%016" PRIx64 ".kvb", model_dir(root, 0xC1), b[0].hash);
    snprintf(dir, sizeof dir, "%s-full", model_dir(root, 0xC1));
    snprintf(to, sizeof to, "%s/%016" PRIx64 ".kvb", dir, b[0].hash);
    T_CHECK(file_size(from) == FILE_BYTES, "the windowed part's file");
    T_CHECK(nv_mkdirs(dir) == NV_OK, "%s", nv_errmsg());
    copy_file(from, to);
    /* a FIFO named like a block: the start must not wait for a writer to open it */
    char fifo[800];
    snprintf(fifo, sizeof fifo, "%s/%016" PRIx64 ".kvb", dir, b[1].hash);
    T_CHECK(mkfifo(fifo, 0600) == 0, "mkfifo: %s", strerror(errno));
    T_CHECK(nv_disk_open(&d, &full) == NV_OK, "%s", nv_errmsg());
    if (!d) return;
    nv_disk_stats st;
    nv_disk_stats_get(d, &st);
    T_CHECK(st.files == 0 && st.rejected == 2 && !nv_disk_has(d, b[0].hash), "the other part's block: %ld files, %" PRIu64 " rejected",
            st.files, st.rejected);
    /* (the windowed part still reads its own) */
    T_CHECK(nv_disk_open(&w, &win) == NV_OK && w && load_ok(w, &b[0]), "the windowed part lost its block");
    nv_disk_free(w);
    /* a folder under block 1's name: its write fails, block 2's goes through, the writer stays up */
    snprintf(fifo, sizeof fifo, "%s/%016" PRIx64 ".kvb", dir, b[1].hash);
    unlink(fifo);
    T_CHECK(mkdir(fifo, 0700) == 0 && write_chain(d, b, 1, 3) == 2, "queue");
    nv_disk_stats_get(d, &st);
    T_CHECK(st.writer_up && st.write_errors == 1 && st.files == 1 && nv_disk_has(d, b[2].hash) && !nv_disk_has(d, b[1].hash),
            "after a folder in a block's place: up %d, %" PRIu64 " errors, %ld files", st.writer_up, st.write_errors, st.files);
    /* a FIFO put in place of a ready block: a load fails at once, the prefetch too */
    char two[800];
    snprintf(two, sizeof two, "%s/%016" PRIx64 ".kvb", dir, b[2].hash);
    struct stat sb;
    T_CHECK(stat(dir, &sb) == 0 && (sb.st_mode & 077) == 0, "the tier's folder is mode %o", (unsigned)(sb.st_mode & 0777));
    T_CHECK(stat(two, &sb) == 0 && (sb.st_mode & 077) == 0, "a block file is mode %o", (unsigned)(sb.st_mode & 0777));
    unlink(two);
    T_CHECK(mkfifo(two, 0600) == 0, "mkfifo");
    nv_disk_prefetch(d, b[2].hash);
    T_CHECK(!load_ok(d, &b[2]) && !nv_disk_has(d, b[2].hash), "a FIFO was loaded");
    nv_disk_free(d);
    rmdir(fifo);
}

/* The tier closed (d, when given) and opened again with a cap of max_bytes: a restart; NULL when it fails. */
static nv_disk *reopen(nv_disk *d, nv_disk_opts *o, uint64_t max_bytes) {
    nv_disk_free(d);
    o->max_bytes = max_bytes;
    nv_disk *again = NULL;
    T_CHECK(nv_disk_open(&again, o) == NV_OK, "%s", nv_errmsg());
    return again;
}

static void test_disk_cap_lru(void) {
    const char *root = t_path("cap");
    blk b[6];
    make_chain(b, 6, 0xC1, 4);
    nv_disk *d;
    nv_disk_opts o = disk_opts(root, 0xC1, 3 * FILE_BYTES, 8);
    T_CHECK(nv_disk_open(&d, &o) == NV_OK, "%s", nv_errmsg());
    if (!d) return;
    write_chain(d, b, 0, 3);
    T_CHECK(load_ok(d, &b[0]), "load"); /* b0 is now the most recently used; b1 the least */
    write_chain(d, b, 3, 5);            /* two more: b1 then b2 must go */
    nv_disk_stats st;
    nv_disk_stats_get(d, &st);
    T_CHECK(st.files == 3 && st.bytes == 3 * FILE_BYTES && st.evictions == 2, "files %ld evictions %" PRIu64, st.files,
            st.evictions);
    T_CHECK(nv_disk_has(d, b[0].hash) && !nv_disk_has(d, b[1].hash) && !nv_disk_has(d, b[2].hash) && nv_disk_has(d, b[4].hash),
            "LRU order not kept");
    T_CHECK(file_size(block_file(root, 0xC1, b[1].hash)) < 0, "evicted file still there");
    nv_disk_free(d);
    /* across a restart the order comes from the files' mtimes; a smaller cap trims the oldest */
    struct timespec t3[2] = {{1000000000, 0}, {1000000000, 0}}, t0[2] = {{1000000100, 0}, {1000000100, 0}},
                    t4[2] = {{1000000200, 0}, {1000000200, 0}};
    utimensat(AT_FDCWD, block_file(root, 0xC1, b[3].hash), t3, 0);
    utimensat(AT_FDCWD, block_file(root, 0xC1, b[0].hash), t0, 0);
    utimensat(AT_FDCWD, block_file(root, 0xC1, b[4].hash), t4, 0);
    o.max_bytes = 2 * FILE_BYTES;
    T_CHECK(nv_disk_open(&d, &o) == NV_OK, "%s", nv_errmsg());
    if (!d) return;
    T_CHECK(!nv_disk_has(d, b[3].hash) && nv_disk_has(d, b[0].hash) && nv_disk_has(d, b[4].hash),
            "the oldest file by mtime was not the one trimmed");
    /* a hit in RAM is a use too: b0 (older than b4) was used from RAM, so b4 goes for b1; at close its
       mtime says when, and after a restart with room for one file b0, used last, stays over b1 */
    nv_disk_touch(d, b[0].hash);
    write_chain(d, b, 1, 2);
    T_CHECK(nv_disk_has(d, b[0].hash) && nv_disk_has(d, b[1].hash) && !nv_disk_has(d, b[4].hash), "a block used from RAM was evicted");
    sleep_ms(30); /* b0 used again, after b1 was written: the newer of the two (past a clock tick of the files' stamps) */
    nv_disk_touch(d, b[0].hash);
    if (!(d = reopen(d, &o, FILE_BYTES))) return;
    T_CHECK(nv_disk_has(d, b[0].hash) && !nv_disk_has(d, b[1].hash), "the RAM use was not kept across the restart");
    /* a use from RAM, then a later read from disk: the read is the newer after a restart too (the RAM
       use is written at close as the time it came, not as the close's) */
    if (!(d = reopen(d, &o, 2 * FILE_BYTES))) return;
    write_chain(d, b, 2, 3); /* b0 and b2 */
    nv_disk_touch(d, b[0].hash);
    sleep_ms(30);
    T_CHECK(load_ok(d, &b[2]), "b2 read from disk");
    sleep_ms(30); /* (the close a tick later still: it must not stamp b0 as used then) */
    if (!(d = reopen(d, &o, FILE_BYTES))) return;
    T_CHECK(nv_disk_has(d, b[2].hash) && !nv_disk_has(d, b[0].hash), "a RAM use written at close outranked a later disk read");
    /* a file larger than the cap is never written */
    if (!(d = reopen(d, &o, FILE_BYTES - 1))) return;
    nv_disk_stats_get(d, &st);
    T_CHECK(st.files == 0, "cap below one file keeps %ld", st.files);
    write_chain(d, b, 5, 6);
    nv_disk_stats_get(d, &st);
    T_CHECK(st.files == 0 && st.writes == 0 && st.writer_up, "wrote past a cap below one file");
    nv_disk_free(d);
}

static void test_disk_queue_full_drops(void) {
    const char *root = t_path("queue");
    blk b[4];
    make_chain(b, 4, 0xD1, 5);
    nv_disk *d;
    nv_disk_opts o = disk_opts(root, 0xD1, 1 << 20, 2);
    T_CHECK(nv_disk_open(&d, &o) == NV_OK, "%s", nv_errmsg());
    if (!d) return;
    int q[4];
    for (int i = 0; i < 4; i++) {
        nv_disk_job j = {b[i].hash, b[i].parent, (const int32_t *)b[i].tokens, b[i].payload, i};
        q[i] = nv_disk_enqueue(d, &j); /* never blocks: outstanding jobs include those not reaped */
    }
    T_CHECK(q[0] && q[1] && !q[2] && !q[3], "queue of 2 took %d %d %d %d", q[0], q[1], q[2], q[3]);
    int32_t got[4];
    int back = 0;
    for (int t = 0; back < 2 && t < 5000; t++) back += nv_disk_reap(d, got + back, 4 - back), sleep_ms(1);
    T_CHECK(back == 2 && ((got[0] == 0 && got[1] == 1) || (got[0] == 1 && got[1] == 0)), "reaped %d", back);
    nv_disk_stats st;
    nv_disk_stats_get(d, &st);
    T_CHECK(st.write_drops == 2 && st.writes == 2, "drops %" PRIu64 " writes %" PRIu64, st.write_drops, st.writes);
    T_CHECK(write_chain(d, b, 2, 4) == 2, "room again after reaping");
    nv_disk_free(d);
}

static void test_disk_unusable_and_failing(void) {
    /* a path that is a file: the tier cannot open */
    const char *file = t_write("plainfile", "x", 1);
    nv_disk *d = NULL;
    nv_disk_opts o = disk_opts(file, 0xE1, 1 << 20, 4);
    T_CHECK(nv_disk_open(&d, &o) != NV_OK && d == NULL && strstr(nv_errmsg(), "SSD tier"), "opened under a file: %s",
            nv_errmsg());
    /* a writer whose writes fail (a file size limit, as a full disk would): it stops with one
       warning, later writes are dropped, reads go on */
    const char *root = t_path("fail");
    blk b[4];
    make_chain(b, 4, 0xE2, 6);
    o = disk_opts(root, 0xE2, 1 << 20, 4);
    T_CHECK(nv_disk_open(&d, &o) == NV_OK, "%s", nv_errmsg());
    if (!d) return;
    write_chain(d, b, 0, 1);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 400; /* above a warning line, below a block file */
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    /* capture stderr to count the warnings */
    fflush(stderr);
    int saved = dup(2), fd = open(t_path("warnings.txt"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    setrlimit(RLIMIT_FSIZE, &lim);
    write_chain(d, b, 1, 3);
    nv_disk_job j = {b[3].hash, b[3].parent, (const int32_t *)b[3].tokens, b[3].payload, 3};
    int queued = nv_disk_enqueue(d, &j);
    setrlimit(RLIMIT_FSIZE, &old);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    signal(SIGXFSZ, prev);
    nv_disk_stats st;
    nv_disk_stats_get(d, &st);
    T_CHECK(!st.writer_up && st.write_errors == 1 && !queued && st.files == 1, "writer up %d errors %" PRIu64 " queued %d",
            st.writer_up, st.write_errors, queued);
    char *text = NULL;
    nv_file_read_all(t_path("warnings.txt"), &text, NULL);
    int lines = 0;
    for (const char *p = text; p && (p = strstr(p, "writer stopped")); p++) lines++;
    T_CHECK(lines == 1, "%d warnings: %s", lines, text ? text : "");
    free(text);
    T_CHECK(load_ok(d, &b[0]), "reads stopped with the writer");
    DIR *dir = opendir(model_dir(root, 0xE2));
    int tmp_left = 0;
    for (struct dirent *de; dir && (de = readdir(dir));) tmp_left += strstr(de->d_name, ".tmp.") != NULL;
    if (dir) closedir(dir);
    T_CHECK(tmp_left == 0, "a failed write left its temporary file");
    nv_disk_free(d);
}

int main(void) {
    nv_engines_init(NULL, 0);
    T_RUN(test_hashes);
    T_RUN(test_map);
    T_RUN(test_pool_idle_list);
    T_RUN(test_prefix_index);
    T_RUN(test_model_identity);
    T_RUN(test_disk_round_trip);
    T_RUN(test_disk_rejects_bad_files);
    T_RUN(test_disk_parts_and_strangers);
    T_RUN(test_disk_cap_lru);
    T_RUN(test_disk_queue_full_drops);
    T_RUN(test_disk_unusable_and_failing);
    return t_done();
}
