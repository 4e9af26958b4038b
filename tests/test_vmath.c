/* base/vmath.h: the vector exp against libm's expf over its whole range (ulp distance), its edges
 * (underflow to 0, overflow to inf, NaN through), and the horizontal sum and max. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/vmath.h"
#include "t.h"

static int64_t ordered(float f) { /* floats as integers in order: the ulp distance is a difference */
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return i < 0 ? (int64_t)INT32_MIN - i : i;
}

static float exp1(float x) {
    float out[8];
    _mm256_storeu_ps(out, nv_exp256(_mm256_set1_ps(x)));
    return out[0];
}

static void test_exp_ulp(void) {
    int64_t worst = 0;
    float at = 0;
    for (float x = -87.0f; x <= 88.7f; x += 0.00097f) { /* ~180,000 points across the range */
        float a = exp1(x), b = expf(x);
        int64_t d = llabs(ordered(a) - ordered(b));
        if (d > worst) worst = d, at = x;
    }
    T_CHECK(worst <= 2, "nv_exp256 is %lld ulp from expf at %.9g", (long long)worst, (double)at);
    /* every lane is its own */
    float in[8] = {-3, -1, 0, 0.5f, 1, 2, 10, -20}, out[8];
    _mm256_storeu_ps(out, nv_exp256(_mm256_loadu_ps(in)));
    for (int i = 0; i < 8; i++) T_CHECK(fabsf(out[i] - expf(in[i])) <= 2e-7f * expf(in[i]), "lane %d", i);
}

static void test_exp_edges(void) {
    T_CHECK(exp1(0.0f) == 1.0f, "e^0 = %.9g", (double)exp1(0.0f));
    T_CHECK(exp1(-88.5f) == 0.0f && exp1(-1000.0f) == 0.0f && exp1(-INFINITY) == 0.0f, "underflow");
    T_CHECK(isinf(exp1(89.0f)) && isinf(exp1(INFINITY)) && exp1(88.7f) < INFINITY, "overflow: %g", (double)exp1(88.7f));
    T_CHECK(isnan(exp1(NAN)), "NaN lost");
}

/* nv_expf256_libm is this libm's expf bit for bit (glibc 2.27+, FMA build: checked over every float
 * once by hand, here over 2^32 / 65537 spread inputs and the edges); lanes it leaves to expf are
 * exactly |x| >= 88 and NaN; nv_softmax gives llama2.c's loop's values on rows with such lanes. */
static void test_expf_libm(void) {
    if (!nv_expf_libm_matches()) {
        printf("  skipped: this libm's expf is not glibc's (nv_softmax uses expf itself)\n");
        return;
    }
    float in[8], out[8];
    int n = 0, bad = 0, wrong_special = 0;
    static const float edges[] = {0.0f, -0.0f, -87.99f, 87.99f, -88.0f, 88.0f, -103.5f, -1e-30f, 1e-30f, -1e-45f, 0.5f, -0.5f,
                                  1.0f, -1.0f, 20.0f, -20.0f};
    for (uint64_t b = 0; b < (1ull << 32) + 16 * 65537; b += 65537) {
        if (b < (1ull << 32)) {
            const uint32_t u = (uint32_t)b;
            memcpy(&in[n++], &u, 4);
        } else {
            in[n++] = edges[(b - (1ull << 32)) / 65537 % 16];
        }
        if (n < 8) continue;
        n = 0;
        int special;
        _mm256_storeu_ps(out, nv_expf256_libm(_mm256_loadu_ps(in), &special));
        for (int i = 0; i < 8; i++) {
            const int big = isnan(in[i]) || fabsf(in[i]) >= 88.0f;
            wrong_special += big != (special >> i & 1);
            const float want = expf(in[i]);
            if (!big && memcmp(&want, &out[i], 4) != 0 && bad++ < 3)
                printf("    expf(%a) = %a, nv_expf256_libm %a\n", (double)in[i], (double)want, (double)out[i]);
        }
    }
    T_CHECK(bad == 0 && wrong_special == 0, "%d values differ from expf, %d lanes flagged wrongly", bad, wrong_special);
}

static void test_horizontal(void) {
    float v[8] = {1, -2, 3.5f, 4, -5, 6, 0.25f, -7};
    T_CHECK(nv_hsum256(_mm256_loadu_ps(v)) == 0.75f, "sum %g", (double)nv_hsum256(_mm256_loadu_ps(v)));
    T_CHECK(nv_hmax256(_mm256_loadu_ps(v)) == 6.0f, "max %g", (double)nv_hmax256(_mm256_loadu_ps(v)));
}

int main(void) {
    T_RUN(test_exp_ulp);
    T_RUN(test_exp_edges);
    T_RUN(test_expf_libm);
    T_RUN(test_horizontal);
    return t_done();
}
