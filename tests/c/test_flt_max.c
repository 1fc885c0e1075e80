/*
 * test_flt_max.c -- finite values near FLT_MAX (include/mxfp8.h, "Values near FLT_MAX"): for each scale rule (nki,
 * ocp, rceil), format (E4M3, E5M2) and input dtype (F32, BF16), mxfp8_quantize of groups whose amax lies in the top
 * FP32 binade against the oracle (tests/c/oracle: the FP8 encoding, stepped down until the dequantized value is at
 * most FLT_MAX), the boundary elements (the tie 248 * 2^120 that used to round to 256 * 2^120 = inf, 240 * 2^120,
 * FLT_MAX; E5M2: 30720 * 2^113, 28672 * 2^113), the dequantize round trip (no finite input gives a non-finite
 * output), stochastic rounding (finite for several seeds), the `saturated` statistic, and a matmul whose result is
 * about 3.2. Runs on whichever ISA path MXFP8_ISA selects (ctest runs it as is; run it with MXFP8_ISA=scalar too).
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mxfp8.h"
#include "oracle.h"
#include "testutil.h"

#define R 4
#define K 512 /* 16 groups per row (a full batch of the BF16 row kernel); row 3, group 1 mixes a huge value with small ones */
#define G (K / 32)

/* BF16 by truncation, so that values near FLT_MAX stay finite (RNE would round FLT_MAX up to inf) */
static uint16_t bf16_trunc(float x) { return (uint16_t)(tu_f32_bits(x) >> 16); }
static float bf16_value(uint16_t b) { return tu_bits_f32((uint32_t)b << 16); }

static void make_input(float *x, int fmt, tu_rng *rng) {
    const double two127 = ldexp(1.0, 127);
    for (int i = 0; i < R * K; i++) {
        double u = 1.0 + tu_uniform(rng) * (1.0 - ldexp(1.0, -24)); /* [1, 2) */
        float v = (float)(u * two127);
        if (!isfinite(v)) v = FLT_MAX;
        x[i] = (tu_next(rng) & 1) ? -v : v;
    }
    /* boundary values in row 0 */
    const float b4[] = {(float)ldexp(248.0, 120), (float)ldexp(247.0, 120), (float)ldexp(240.0, 120), FLT_MAX,
                        -FLT_MAX, -(float)ldexp(248.0, 120), nextafterf((float)ldexp(248.0, 120), 0.0f),
                        (float)ldexp(1.9375, 127)};
    const float b5[] = {(float)ldexp(30720.0, 113), (float)ldexp(28672.0, 113), nextafterf((float)ldexp(30720.0, 113), 0.0f),
                        FLT_MAX, -FLT_MAX, -(float)ldexp(30720.0, 113), (float)ldexp(1.875, 127), (float)ldexp(1.75, 127)};
    for (int i = 0; i < 8; i++) x[i] = fmt ? b5[i] : b4[i];
    /* row 3, group 1: one huge element among ordinary ones (its own group sets the top scale) */
    for (int i = 0; i < 32; i++) x[3 * K + 32 + i] = (float)(tu_uniform(rng) * 1e30);
    x[3 * K + 40] = FLT_MAX;
}

static void run_case(int fmt, int rule, int bf16, int sr, uint64_t seed, int with_stats) {
    char what[96];
    snprintf(what, sizeof what, "fmt %s rule %d %s %s seed %llu%s", fmt ? "e5m2" : "e4m3", rule, bf16 ? "bf16" : "f32",
             sr ? "stochastic" : "nearest", (unsigned long long)seed, with_stats ? " stats" : "");
    tu_rng rng = {0x5eed0000u + (uint64_t)(fmt * 16 + rule)};
    static float x[R * K], xq[R * K], out[R * K];
    static uint16_t xb[R * K];
    make_input(x, fmt, &rng);
    for (int i = 0; i < R * K; i++) {
        xb[i] = bf16_trunc(x[i]);
        xq[i] = bf16 ? bf16_value(xb[i]) : x[i];
    }
    uint8_t d[R * K], s[R * G];
    int64_t shape[2] = {R, K}, sshape[2] = {R, G};
    mxfp8_tensor src = mxfp8_tensor_make(bf16 ? (void *)xb : (void *)x, bf16 ? MXFP8_DTYPE_BF16 : MXFP8_DTYPE_F32, 2, shape);
    mxfp8_tensor dt = mxfp8_tensor_make(d, fmt ? MXFP8_DTYPE_E5M2 : MXFP8_DTYPE_E4M3, 2, shape);
    mxfp8_tensor st = mxfp8_tensor_make(s, MXFP8_DTYPE_E8M0, 2, sshape);
    mxfp8_quant_stats stats;
    mxfp8_quant_params qp = mxfp8_quant_params_default();
    qp.fmt = (mxfp8_format)fmt;
    qp.rule = (mxfp8_scale_rule)rule;
    qp.rounding = sr ? MXFP8_ROUND_STOCHASTIC : MXFP8_ROUND_NEAREST;
    qp.seed = seed;
    qp.stats = with_stats ? &stats : NULL; /* statistics take another kernel path than plain codes */
    mxfp8_status rc = mxfp8_quantize(&src, 1, &qp, &dt, &st);
    TU_CHECK(rc == MXFP8_OK, "%s: quantize: %s", what, mxfp8_last_error_message());
    if (rc) return;
    int64_t sat_oracle = 0;
    for (int r = 0; r < R; r++)
        for (int g = 0; g < G; g++) {
            double v[32];
            uint8_t oc[32];
            for (int i = 0; i < 32; i++) v[i] = (double)xq[r * K + 32 * g + i];
            int os = orc_quant_group(v, 32, fmt, rule, oc);
            TU_CHECK(os == s[r * G + g], "%s: row %d group %d: scale %d, oracle %d", what, r, g, s[r * G + g], os);
            /* the largest finite dequantized magnitude of this group (oracle), and saturation against it */
            double top = 0.0;
            for (unsigned c = 0; c < 0x7F; c++) {
                double q = orc_fp8_value(c, fmt) * orc_e8m0_value((unsigned)os);
                if (isfinite(q) && q <= FLT_MAX && q > top) top = q;
            }
            for (int i = 0; i < 32; i++) {
                sat_oracle += fabs(v[i]) > top;
                uint8_t got = d[r * K + 32 * g + i];
                if (!sr) {
                    TU_CHECK(got == oc[i], "%s: x[%d][%d] = %a: code %02x, oracle %02x", what, r, 32 * g + i, v[i],
                             got, oc[i]);
                } else {
                    double q = fabs(orc_fp8_value(got, fmt) * orc_e8m0_value((unsigned)os));
                    TU_CHECK(q <= top && (got & 0x80) == (oc[i] & 0x80),
                             "%s: x[%d][%d] = %a: code %02x decodes past the largest finite value", what, r,
                             32 * g + i, v[i], got);
                }
            }
        }
    if (with_stats && !sr) TU_CHECK(stats.saturated == sat_oracle, "%s: saturated %lld, oracle %lld", what,
                      (long long)stats.saturated, (long long)sat_oracle);
    TU_CHECK(!with_stats || rule == MXFP8_SCALE_OCP || stats.saturated > 0, "%s: nothing counted as saturated", what);
    /* round trip: every dequantized value finite */
    mxfp8_tensor ot = mxfp8_tensor_make(out, MXFP8_DTYPE_F32, 2, shape);
    rc = mxfp8_dequantize(&dt, &st, 1, MXFP8_GROUP_1X32, &ot);
    TU_CHECK(rc == MXFP8_OK, "%s: dequantize: %s", what, mxfp8_last_error_message());
    int bad = 0;
    for (int i = 0; i < R * K; i++) bad += !isfinite(out[i]);
    TU_CHECK(bad == 0, "%s: %d of %d finite inputs dequantize to a non-finite value", what, bad, R * K);
}

/* Y = X @ W^T with X[0][0] = 3.3e38 (alone in its group) and W[n][0] = 1e-38: Y[0][n] is about 3.2, finite. */
static void test_matmul(int fmt, int rule, int bf16) {
    enum { M = 2, N = 3, KK = 64 };
    float X[M * KK], W[N * KK], Y[M * N];
    uint16_t Xb[M * KK], Wb[N * KK];
    memset(X, 0, sizeof X);
    for (int n = 0; n < N * KK; n++) W[n] = (n % KK == 0) ? 1e-38f : 0.0f;
    X[0] = 3.3e38f;
    X[KK + 1] = FLT_MAX; /* row 1 multiplies zeros of W: 0 */
    for (int i = 0; i < M * KK; i++) Xb[i] = bf16_trunc(X[i]);
    for (int i = 0; i < N * KK; i++) Wb[i] = bf16_trunc(W[i]);
    int64_t sx[2] = {M, KK}, sw[2] = {N, KK}, sy[2] = {M, N};
    mxfp8_operand ox = {0}, ow = {0};
    ox.values = mxfp8_tensor_make(bf16 ? (void *)Xb : (void *)X, bf16 ? MXFP8_DTYPE_BF16 : MXFP8_DTYPE_F32, 2, sx);
    ow.values = mxfp8_tensor_make(bf16 ? (void *)Wb : (void *)W, bf16 ? MXFP8_DTYPE_BF16 : MXFP8_DTYPE_F32, 2, sw);
    mxfp8_matmul_config cfg;
    mxfp8_matmul_config_init(&cfg);
    cfg.float8_dtype = (mxfp8_format)fmt;
    cfg.scale_rule = (mxfp8_scale_rule)rule;
    mxfp8_tensor y = mxfp8_tensor_make(Y, MXFP8_DTYPE_F32, 2, sy);
    mxfp8_status rc = mxfp8_matmul(&ox, &ow, &cfg, &y);
    TU_CHECK(rc == MXFP8_OK, "matmul: %s", mxfp8_last_error_message());
    for (int n = 0; n < N; n++) {
        TU_CHECK(isfinite(Y[n]) && Y[n] > 2.5f && Y[n] < 4.0f, "matmul fmt %d rule %d bf16 %d: Y[0][%d] = %g", fmt,
                 rule, bf16, n, Y[n]);
        TU_CHECK(Y[N + n] == 0.0f, "matmul fmt %d rule %d bf16 %d: Y[1][%d] = %g", fmt, rule, bf16, n, Y[N + n]);
    }
}

int main(void) {
    for (int fmt = 0; fmt < 2; fmt++)
        for (int rule = 0; rule < 3; rule++)
            for (int bf16 = 0; bf16 < 2; bf16++) {
                run_case(fmt, rule, bf16, 0, 0, 0);
                run_case(fmt, rule, bf16, 0, 0, 1);
                for (uint64_t seed = 1; seed <= 4; seed++) run_case(fmt, rule, bf16, 1, seed, seed & 1);
                test_matmul(fmt, rule, bf16);
            }
    return tu_finish("test_flt_max");
}
