/* Test-only: the AMX tile loops of kern_amx_tmpl.h on tile registers emulated in C, following the
 * pseudo-code of TILELOADD, TILESTORED, TILEZERO, TDPBF16PS and TDPBSSD in the Intel SDM. Every
 * operation checks what the hardware would fault on (no configuration, palette, rows > 16, colsb >
 * 64, and for the products: A rows == C rows, A colsb / 4 == B rows, B colsb == C colsb), and
 * aborts with a message, so a layout or configuration bug shows here rather than as #UD/#GP on a
 * Xeon. Loads and stores touch exactly the bytes the hardware would (rows x colsb at the stride),
 * so AddressSanitizer checks the buffer padding too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kern.h"

static _Thread_local struct {
    int configured;
    nv_amx_cfg cfg;
    uint8_t t[8][16][64];
} emu;

static void emu_fault(const char *what, int t) {
    fprintf(stderr, "amx emulation: %s (tile %d): the hardware would fault here\n", what, t);
    abort();
}

static void emu_cfg(const nv_amx_cfg *cfg) {
    if (cfg->palette_id != 1) emu_fault("palette is not 1", -1);
    if (cfg->start_row != 0) emu_fault("start_row is not 0", -1);
    for (int i = 0; i < 14; i++)
        if (cfg->reserved[i]) emu_fault("reserved config bytes are not 0", -1);
    for (int t = 0; t < 16; t++) {
        if (t >= 8 && (cfg->rows[t] || cfg->colsb[t])) emu_fault("tile beyond 7 configured", t);
        if (cfg->rows[t] > 16 || cfg->colsb[t] > 64) emu_fault("tile larger than 16 x 64 bytes", t);
        if ((cfg->rows[t] == 0) != (cfg->colsb[t] == 0)) emu_fault("tile with rows xor colsb zero", t);
    }
    emu.cfg = *cfg;
    emu.configured = 1;
    memset(emu.t, 0, sizeof emu.t);
}

static void emu_check(int t) {
    if (!emu.configured) emu_fault("tile used without a configuration", t);
    if (!emu.cfg.rows[t]) emu_fault("tile not configured", t);
}

static void emu_zero(int t) {
    emu_check(t);
    memset(emu.t[t], 0, sizeof emu.t[t]);
}

static void emu_load(int t, const void *p, long stride) {
    emu_check(t);
    memset(emu.t[t], 0, sizeof emu.t[t]);
    for (int r = 0; r < emu.cfg.rows[t]; r++) memcpy(emu.t[t][r], (const char *)p + r * stride, emu.cfg.colsb[t]);
}

static void emu_store(int t, void *p, long stride) {
    emu_check(t);
    for (int r = 0; r < emu.cfg.rows[t]; r++) memcpy((char *)p + r * stride, emu.t[t][r], emu.cfg.colsb[t]);
}

static void emu_dp_check(int c, int a, int b) {
    emu_check(c);
    emu_check(a);
    emu_check(b);
    if (c == a || c == b || a == b) emu_fault("product with repeated tile operands", c);
    if (emu.cfg.rows[a] != emu.cfg.rows[c]) emu_fault("A rows != C rows", a);
    if (emu.cfg.colsb[a] / 4 != emu.cfg.rows[b]) emu_fault("A colsb / 4 != B rows", b);
    if (emu.cfg.colsb[b] != emu.cfg.colsb[c]) emu_fault("B colsb != C colsb", b);
    if (emu.cfg.colsb[a] % 4 || emu.cfg.colsb[c] % 4) emu_fault("colsb not a multiple of 4", c);
}

static int emu_inject; /* nv_kern_amx_emu_inject(): drop the last K group of every product */

static float bf(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return nv_f32_from_bf16(h);
}

static void emu_dpbf16(int c, int a, int b) {
    emu_dp_check(c, a, b);
    const int M = emu.cfg.rows[c], K = emu.cfg.colsb[a] / 4 - (emu_inject ? 1 : 0), N = emu.cfg.colsb[c] / 4;
    float bv[16][16][2];
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++) {
            bv[k][n][0] = bf(&emu.t[b][k][4 * n]);
            bv[k][n][1] = bf(&emu.t[b][k][4 * n + 2]);
        }
    for (int m = 0; m < M; m++) {
        float acc[16];
        memcpy(acc, emu.t[c][m], sizeof acc);
        for (int k = 0; k < K; k++) {
            const float a0 = bf(&emu.t[a][m][4 * k]), a1 = bf(&emu.t[a][m][4 * k + 2]);
            for (int n = 0; n < N; n++) {
                acc[n] += a0 * bv[k][n][0];
                acc[n] += a1 * bv[k][n][1];
            }
        }
        memset(emu.t[c][m], 0, 64);
        memcpy(emu.t[c][m], acc, (size_t)N * 4);
    }
}

static void emu_dpbssd(int c, int a, int b) {
    emu_dp_check(c, a, b);
    const int M = emu.cfg.rows[c], K = emu.cfg.colsb[a] / 4 - (emu_inject ? 1 : 0), N = emu.cfg.colsb[c] / 4;
    for (int m = 0; m < M; m++) {
        int32_t acc[16];
        memcpy(acc, emu.t[c][m], sizeof acc);
        for (int k = 0; k < K; k++)
            for (int n = 0; n < N; n++)
                for (int i = 0; i < 4; i++)
                    acc[n] += (int32_t)(int8_t)emu.t[a][m][4 * k + i] * (int32_t)(int8_t)emu.t[b][k][4 * n + i];
        memset(emu.t[c][m], 0, 64);
        memcpy(emu.t[c][m], acc, (size_t)N * 4);
    }
}

static void emu_release(void) {
    emu.configured = 0;
    memset(emu.t, 0, sizeof emu.t);
}

#define AP(name) amxemu_##name
#define TCFG(cfg) emu_cfg(cfg)
#define TZERO(t) emu_zero(t)
#define TLOAD(t, p, stride) emu_load(t, p, stride)
#define TSTORE(t, p, stride) emu_store(t, p, stride)
#define TDPBF16(c, a, b) emu_dpbf16(c, a, b)
#define TDPBSSD(c, a, b) emu_dpbssd(c, a, b)
#define TRELEASE() emu_release()

#include "engine/kern_amx_tmpl.h"

const nv_kern_amx nv_kern_amx_emu = {"amx (emulated)", amxemu_bf16_gemm, amxemu_int8_gemm, 0, NULL, 0};

void nv_kern_amx_emu_inject(int on) { emu_inject = on; }
