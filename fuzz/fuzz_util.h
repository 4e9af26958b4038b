/* Helpers shared by the libFuzzer harnesses (fuzz/fuzz_*.c).
 *
 * The loaders take a path, so a harness writes its input to a private temporary file
 * (mkstemp in $TMPDIR, else /tmp) and unlinks it afterwards. FZ_CHECK states a property the
 * harness expects of the library (beyond "no crash"): when it fails, the harness aborts with a
 * message, and libFuzzer records the input as a crash. */
#ifndef NV_FUZZ_UTIL_H
#define NV_FUZZ_UTIL_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "base/file.h"
#include "model/config.h"
#include "model/tokenizer.h"

#define FZ_CHECK(cond, ...)                                                       \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "%s:%d: property failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                         \
            fputc('\n', stderr);                                                  \
            abort();                                                              \
        }                                                                         \
    } while (0)

/* A fresh temporary file name: "<dir>/nerve-fuzz-<tag>-XXXXXX", created empty (fd returned,
 * -1 on failure after a message). */
/* 1 when llama2.c's v1 header can say c: no QK-norm, head_dim = dim / heads, RoPE theta 10000,
 * norm eps 1e-5, and none of the parts of the other families (RoPE factors, biases, experts,
 * Gemma's, SmolLM3's, Granite's, partial rotation): nv_model_save_v1 refuses anything else as
 * unsupported. */
static inline int fz_fits_v1(const nv_config *c) {
    return !c->qk_norm && c->head_dim * c->n_heads == c->dim && c->rope_theta == 10000.0f && c->norm_eps == 1e-5f &&
           !c->n_rope_factors && !c->rope_attn && !c->qkv_bias && !c->n_experts && !c->swa_window && !c->ffn_gelu && !c->post_norms &&
           c->emb_scale == 0.0f && c->attn_div == 0.0f && c->logit_softcap == 0.0f && c->attn_softcap == 0.0f && !c->nope_period &&
           c->residual_scale == 0.0f && c->logit_div == 0.0f && !c->rope_dim && c->attn_temp_scale == 0.0f;
}

/* The same, the name ending in suffix (for loaders that know a file by its name's ending). */
static inline int fz_temp_fd_as(const char *tag, const char *suffix, char *path, size_t cap) {
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    snprintf(path, cap, "%s/nerve-fuzz-%s-XXXXXX%s", dir, tag, suffix);
    int fd = mkstemps(path, (int)strlen(suffix));
    if (fd < 0) fprintf(stderr, "fuzz: cannot create a temporary file in %s: %s\n", dir, strerror(errno));
    return fd;
}

static inline int fz_temp_fd(const char *tag, char *path, size_t cap) { return fz_temp_fd_as(tag, "", path, cap); }

/* Writes data to a fresh temporary file whose name ends in suffix; its path goes to path. Returns
 * 0, or -1 (after a message) when the file could not be written. */
static inline int fz_write_temp_as(const char *tag, const char *suffix, const uint8_t *data, size_t len, char *path,
                                   size_t cap) {
    int fd = fz_temp_fd_as(tag, suffix, path, cap);
    if (fd < 0) return -1;
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(fd, data + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            fprintf(stderr, "fuzz: cannot write %s: %s\n", path, strerror(errno));
            close(fd);
            unlink(path);
            return -1;
        }
        done += (size_t)w;
    }
    close(fd);
    return 0;
}

/* fz_write_temp_as without a suffix; a failure is what the harness treats as "skip this input". */
static inline int fz_write_temp(const char *tag, const uint8_t *data, size_t len, char *path, size_t cap) {
    return fz_write_temp_as(tag, "", data, len, path, cap);
}

/* A temporary path that does not exist yet (for writers that create their own file). */
static inline int fz_temp_name(const char *tag, char *path, size_t cap) {
    int fd = fz_temp_fd(tag, path, cap);
    if (fd < 0) return -1;
    close(fd);
    unlink(path);
    return 0;
}

/* Clears this thread's error message, so that a failure without nv_fail() shows up. */
static inline void fz_clear_error(void) { nv_fail(NV_OK, "%s", ""); }

/* The error contract of src/base/err.h: a failure carries one non-empty line. */
static inline void fz_check_error(nv_err e, const char *what) {
    if (e == NV_OK) return;
    const char *msg = nv_errmsg();
    FZ_CHECK(msg[0] != '\0', "%s failed (%s) without a message", what, nv_err_name(e));
    FZ_CHECK(strchr(msg, '\n') == NULL, "%s: message is not one line: %s", what, msg);
}

/* Runs a loader that takes a path on data: writes it to a temporary file, calls load(path, out),
 * removes the file and checks the error contract. Returns the loader's code, or -1 when the
 * file could not be written (skip the input). */
typedef nv_err (*fz_loader)(const char *path, void *out);
static inline int fz_load_bytes(const char *tag, const uint8_t *data, size_t size, fz_loader load, void *out,
                                const char *what) {
    char path[512];
    if (fz_write_temp(tag, data, size, path, sizeof path) != 0) return -1;
    fz_clear_error();
    nv_err e = load(path, out);
    unlink(path);
    fz_check_error(e, what);
    return (int)e;
}

/* A NUL-terminated copy of the n bytes at data (caller frees); NULL when out of memory. */
static inline char *fz_text(const uint8_t *data, size_t n) {
    char *s = malloc(n + 1);
    if (!s) return NULL;
    if (n) memcpy(s, data, n);
    s[n] = '\0';
    return s;
}

#define FZ_TOK_VOCAB 512

/* <unk>, <s>, </s>, the 256 byte tokens, then " a".." z" and two-letter pieces up to 512
 * tokens: a stand-in when the shared data is absent. */
static inline nv_err fz_synthetic_tokenizer(nv_tokenizer **out) {
    size_t cap = 16384, n = 0;
    uint8_t *b = malloc(cap);
    if (!b) return nv_fail(NV_ENOMEM, "out of memory");
#define PUT(p, len) (memcpy(b + n, (p), (len)), n += (len))
    int32_t max_len = 8;
    PUT(&max_len, 4);
    for (int id = 0; id < FZ_TOK_VOCAB; id++) {
        char s[16];
        if (id == 0) snprintf(s, sizeof s, "<unk>");
        else if (id == 1) snprintf(s, sizeof s, "\n<s>\n");
        else if (id == 2) snprintf(s, sizeof s, "\n</s>\n");
        else if (id < 259) snprintf(s, sizeof s, "<0x%02X>", id - 3);
        else if (id < 259 + 26) snprintf(s, sizeof s, " %c", 'a' + (id - 259));
        else snprintf(s, sizeof s, "%c%c", 'a' + (id - 285) / 26, 'a' + (id - 285) % 26);
        float score = id < 259 ? 0.0f : -(float)id;
        int32_t len = (int32_t)strlen(s);
        PUT(&score, 4);
        PUT(&len, 4);
        PUT(s, (size_t)len);
    }
#undef PUT
    char path[512];
    int rc = fz_write_temp("apitok", b, n, path, sizeof path);
    free(b);
    if (rc != 0) return nv_fail(NV_EIO, "cannot write the stand-in tokenizer");
    nv_err e = nv_tokenizer_load(path, FZ_TOK_VOCAB, out);
    unlink(path);
    return e;
}

/* The tokenizer of the shared stories260K (models/tok512.bin through nv_data_path / NERVE_DATA),
 * else the stand-in; exits when neither loads. */
static inline nv_tokenizer *fz_tok512(const char *who) {
    char path[4096];
    nv_tokenizer *tok = NULL;
    if (nv_data_path("models/tok512.bin", path, sizeof path)) {
        if (nv_tokenizer_load_for_model(path, FZ_TOK_VOCAB, &tok) != NV_OK) {
            fprintf(stderr, "%s: %s\n", who, nv_errmsg());
            exit(1);
        }
    } else {
        fprintf(stderr, "%s: no shared data (%s; set NERVE_DATA): using a stand-in 512-token tokenizer\n", who, path);
        if (fz_synthetic_tokenizer(&tok) != NV_OK) {
            fprintf(stderr, "%s: %s\n", who, nv_errmsg());
            exit(1);
        }
    }
    return tok;
}

#endif
