/* A small gpt-oss model for tests (model/config.h's gpt_oss): 3 layers of width 64, 4 query heads of
 * 16 over 2 key/value heads, 4 experts of width 64 (2 chosen), a window of 5 on layers 0 and 2, YaRN
 * (factor 4 over an original context of 16), random weights whose sinks, biases and router are large
 * enough to matter: sinks from -3 to 3 (some above every score), expert biases that push some of
 * SwiGLU-OAI's inputs past its clamps at 7, routers that choose apart. */
#ifndef NV_TEST_GPTOSS_MODEL_H
#define NV_TEST_GPTOSS_MODEL_H

#include "model/config.h"
#include "model/model.h"
#include "t.h"

static nv_config gptoss_config(int vocab) {
    nv_config c = {64, 64, 3, 4, 2, 16, vocab, 256, 150000.0f, 1e-5f, 0, 0, 0, {0}, 1, NV_CONFIG_PLAIN};
    c.n_experts = 4, c.n_experts_used = 2, c.gpt_oss = 1;
    c.swa_window = 5, c.swa_period = 2;
    const nv_rope_yarn y = {.factor = 4.0f, .orig_ctx = 16, .beta_fast = 32.0f, .beta_slow = 1.0f};
    T_CHECK(nv_config_rope_yarn(&c, &y) == NV_OK, "%s", nv_errmsg());
    return c;
}

/* ... of a vocabulary of vocab tokens */
static int gptoss_model_of(nv_model *m, uint64_t seed, int vocab) {
    const nv_config c = gptoss_config(vocab);
    T_CHECK(nv_model_alloc(m, &c) == NV_OK, "%s", nv_errmsg());
    if (!m->params) return 0;
    nv_model_init_random(m, seed);
    nv_weights *w = &m->w;
    const int L = c.n_layers, d = c.dim, h = c.hidden_dim, E = c.n_experts, H = c.n_heads;
    const int qd = nv_config_q_dim(&c), kvd = nv_config_kv_dim(&c);
    for (int i = 0; i < L * H; i++) w->sinks[i] = -3.0f + 0.5f * (float)((i * 7 + (int)seed) % 13);
    for (int i = 0; i < L * d; i++) w->bo[i] = 0.02f * (float)(i % 11 - 5);
    for (int i = 0; i < L * E; i++) w->router_b[i] = 0.3f * (float)(i % 5 - 2);
    for (int i = 0; i < L * E * d; i++) w->router[i] *= 50.0f, w->b2[i] = 0.01f * (float)(i % 9 - 4);
    for (int i = 0; i < L * E * h; i++) {
        w->b1[i] = i % 7 == 0 ? 9.0f : 0.05f * (float)(i % 5 - 2); /* past min(g, 7) */
        w->b3[i] = i % 5 == 0 ? (i % 10 ? 9.0f : -9.0f) : 0.04f * (float)(i % 3 - 1); /* past clamp(u, -7, 7) */
    }
    for (int i = 0; i < L * qd; i++) w->bq[i] = 0.05f * (float)(i % 17 - 8);
    for (int i = 0; i < L * kvd; i++) w->bk[i] = 0.04f * (float)(i % 13 - 6), w->bv[i] = 0.03f * (float)(i % 11 - 5);
    for (int i = 0; i < L * E * h * d; i++) w->w1[i] *= 8.0f, w->w3[i] *= 8.0f; /* products of a size the clamps meet */
    return 1;
}

static int gptoss_model(nv_model *m, uint64_t seed) { return gptoss_model_of(m, seed, 300); }

#endif
