/*
 * test_quant.c -- MX quantization through the public API (whatever ISA is active; CI runs it both ways): the rules
 * on hand-computed groups (independent of the code under test), NaN/Inf/zero/subnormal groups, N-D strided views
 * against the tests' independent oracle (tests/c/oracle/), 1, 2 and 3 threads each against the oracle, X^T along
 * rows == X along columns, a caller's MXCSR, and the error model of quantize / dequantize (errors leave outputs
 * untouched). Every quantization kernel is compared with the oracle on its own in test_qkernels.c; layouts, x4
 * packing and the swizzle, with their errors, in test_layouts.c.
 */
#include <math.h>

#include "oracle.h"
#include "quant/panel.h"
#include "runtime/tensor.h"
#include "testutil.h"

static const char *FMT_NAME[2] = {"e4m3", "e5m2"};
static const char *RULE_NAME[3] = {"nki", "ocp", "rceil"};


/* ---------------------------------------------------------------------------------------------------------- */
/* Hand-computed groups through the public API (whatever ISA is active)                                       */
/* ---------------------------------------------------------------------------------------------------------- */
/* Quantize one 1-D F32 vector of n values; returns the scales in sc[] and codes in c[]. */
static mxfp8_status quant1d(const float *x, int64_t n, mxfp8_format fmt, mxfp8_scale_rule rule, uint8_t *c,
                            uint8_t *sc) {
    int64_t sh[1] = {n}, g[1] = {(n + 31) / 32};
    mxfp8_tensor X = mxfp8_tensor_make((void *)x, MXFP8_DTYPE_F32, 1, sh);
    mxfp8_tensor D = mxfp8_tensor_make(c, fmt == MXFP8_FMT_E5M2 ? MXFP8_DTYPE_E5M2 : MXFP8_DTYPE_E4M3, 1, sh);
    mxfp8_tensor S = mxfp8_tensor_make(sc, MXFP8_DTYPE_E8M0, 1, g);
    mxfp8_quant_params p = {fmt, rule, MXFP8_GROUP_1X32, MXFP8_ROUND_NEAREST, 0, 0, NULL};
    return mxfp8_quantize(&X, 0, &p, &D, &S);
}

static void test_special_groups(void) {
    float x[96];
    uint8_t c[96], sc[3];
    /* group 0: amax 960 (with 240, -960); group 1: all zero (one -0); group 2: amax 300 */
    for (int i = 0; i < 96; i++) x[i] = 0.0f;
    x[0] = 960.0f, x[1] = 240.0f, x[2] = -960.0f, x[3] = 1.0f;
    x[40] = -0.0f;
    x[64] = 300.0f, x[65] = -2.0f;
    TU_CHECK(quant1d(x, 96, MXFP8_FMT_E4M3, MXFP8_SCALE_OCP, c, sc) == MXFP8_OK, "ocp quantize failed");
    TU_CHECK(sc[0] == 128, "ocp amax 960: scale %u, want 128", sc[0]);
    TU_CHECK(c[0] == 0x7E && c[2] == 0xFE, "ocp 960/2 = 480 must saturate to 448 (0x7E/0xFE): 0x%02x 0x%02x", c[0],
             c[2]);
    TU_CHECK(c[1] == 0x6F, "ocp 240/2 = 120 = 1.875*2^6 -> 0x6F, got 0x%02x", c[1]);
    TU_CHECK(sc[1] == 0, "all-zero group: scale %u, want 0", sc[1]);
    TU_CHECK(c[40] == 0x80 && c[41] == 0x00, "all-zero group codes 0x%02x 0x%02x, want 0x80 (-0) 0x00", c[40], c[41]);
    TU_CHECK(sc[2] == 127, "ocp amax 300: scale %u, want 127", sc[2]);
    TU_CHECK(c[64] == 0x79, "ocp 300 -> 288 = 1.125*2^8 (0x79), got 0x%02x", c[64]);
    TU_CHECK(c[65] == 0xC0, "ocp -2 -> 0xC0, got 0x%02x", c[65]);
    TU_CHECK(quant1d(x, 96, MXFP8_FMT_E4M3, MXFP8_SCALE_RCEIL, c, sc) == MXFP8_OK, "rceil quantize failed");
    TU_CHECK(sc[0] == 129, "rceil amax 960: scale %u, want 129", sc[0]);
    TU_CHECK(c[0] == 0x77 && c[2] == 0xF7, "rceil 960/4 = 240 exact (0x77): 0x%02x 0x%02x", c[0], c[2]);
    TU_CHECK(quant1d(x, 96, MXFP8_FMT_E4M3, MXFP8_SCALE_NKI, c, sc) == MXFP8_OK, "nki quantize failed");
    TU_CHECK(sc[0] == 129 && c[0] == 0x77, "nki amax 960: scale %u code 0x%02x, want 129, 0x77", sc[0], c[0]);
    TU_CHECK(sc[2] == 128 && c[64] == 0x71, "nki amax 300: scale %u (128) code 0x%02x (150 -> 144 = 0x71)", sc[2],
             c[64]);

    /* FP32 amax 449 under rceil -> 128; amax bits 0x437FFFFF under ocp -> 126 */
    float y[32] = {449.0f};
    TU_CHECK(quant1d(y, 32, MXFP8_FMT_E4M3, MXFP8_SCALE_RCEIL, c, sc) == MXFP8_OK && sc[0] == 128,
             "rceil amax 449: scale %u, want 128", sc[0]);
    y[0] = tu_bits_f32(0x437FFFFFu);
    TU_CHECK(quant1d(y, 32, MXFP8_FMT_E4M3, MXFP8_SCALE_OCP, c, sc) == MXFP8_OK && sc[0] == 126,
             "ocp amax 0x437FFFFF: scale %u, want 126", sc[0]);
    /* rceil at exactly 1.75 * 2^k: 448 -> e = 0 (127); 448.00003 -> 128 */
    y[0] = 448.0f;
    quant1d(y, 32, MXFP8_FMT_E4M3, MXFP8_SCALE_RCEIL, c, sc);
    TU_CHECK(sc[0] == 127 && c[0] == 0x7E, "rceil amax 448: scale %u code 0x%02x, want 127 0x7E", sc[0], c[0]);
    y[0] = tu_bits_f32(0x43E00001u);
    quant1d(y, 32, MXFP8_FMT_E4M3, MXFP8_SCALE_RCEIL, c, sc);
    TU_CHECK(sc[0] == 128, "rceil amax just above 448: scale %u, want 128", sc[0]);

    /* ocp saturation: scale 2^0 (amax in [256, 512)); 449, 464, 465, 511 -> 448; 431 -> 416; 440 -> 448 (tie?) */
    float z[32] = {449.0f, 464.0f, 465.0f, 511.0f, -464.0f, 431.0f, 432.0f, 400.0f};
    quant1d(z, 32, MXFP8_FMT_E4M3, MXFP8_SCALE_OCP, c, sc);
    TU_CHECK(sc[0] == 127, "ocp saturation group: scale %u, want 127", sc[0]);
    TU_CHECK(c[0] == 0x7E && c[1] == 0x7E && c[2] == 0x7E && c[3] == 0x7E && c[4] == 0xFE,
             "ocp: 449/464/465/511/-464 must give max normal: %02x %02x %02x %02x %02x", c[0], c[1], c[2], c[3], c[4]);
    TU_CHECK(c[5] == 0x7D && c[6] == 0x7E && c[7] == 0x7C,
             "ocp: 431 -> 416 (7D), 432 tie -> 448 (7E, even), 400 -> 384 (7C, tie to even): %02x %02x %02x", c[5],
             c[6], c[7]);
    /* E5M2 ocp: amax 65535 -> scale 127, values in [57344, 65536) saturate to 57344 (0x7B), never Inf */
    float w[32] = {65535.0f, 61440.0f, 57345.0f, -65000.0f, 40000.0f};
    quant1d(w, 32, MXFP8_FMT_E5M2, MXFP8_SCALE_OCP, c, sc);
    TU_CHECK(sc[0] == 127, "e5m2 ocp amax 65535: scale %u, want 127", sc[0]);
    TU_CHECK(c[0] == 0x7B && c[1] == 0x7B && c[2] == 0x7B && c[3] == 0xFB,
             "e5m2 ocp: [57344, 65536) must saturate to 0x7B: %02x %02x %02x %02x", c[0], c[1], c[2], c[3]);
    TU_CHECK(c[4] == 0x79, "e5m2 40000 -> 40960 = 1.25*2^15 (0x79): %02x", c[4]);

    /* NaN group and +-Inf group between finite groups */
    float v[96];
    for (int i = 0; i < 96; i++) v[i] = (float)(i % 7) - 3.0f;
    v[33] = NAN;
    v[34] = -5.0f;
    v[70] = -INFINITY;
    for (int fmt = 0; fmt < 2; fmt++)
        for (int rule = 0; rule < 3; rule++) {
            quant1d(v, 96, (mxfp8_format)fmt, (mxfp8_scale_rule)rule, c, sc);
            uint8_t nan = fmt ? 0x7E : 0x7F;
            TU_CHECK(sc[1] == 255 && sc[2] == 255, "%s %s: NaN/Inf groups scales %u %u, want 255", FMT_NAME[fmt],
                     RULE_NAME[rule], sc[1], sc[2]);
            TU_CHECK(sc[0] != 255, "finite group got scale 255");
            for (int i = 32; i < 96; i++) {
                uint8_t want = (uint8_t)(nan | (signbit(v[i]) ? 0x80 : 0));
                TU_CHECK(c[i] == want, "%s %s: element %d of a non-finite group: 0x%02x, want 0x%02x", FMT_NAME[fmt],
                         RULE_NAME[rule], i, c[i], want);
            }
        }

    /* Subnormal outputs and FP32-subnormal inputs: amax 2^-130 -> e clamps to -127 (scale 0), y = x * 2^127 */
    float u[32] = {ldexpf(1.0f, -130), ldexpf(1.0f, -140), ldexpf(3.0f, -138),
                   ldexpf(1.0f, -137), ldexpf(1.5f, -136), -ldexpf(1.0f, -149)};
    quant1d(u, 32, MXFP8_FMT_E4M3, MXFP8_SCALE_NKI, c, sc);
    TU_CHECK(sc[0] == 0, "tiny group: scale %u, want 0", sc[0]);
    TU_CHECK(c[0] == 0x20 && c[1] == 0x00 && c[2] == 0x01 && c[3] == 0x00 && c[4] == 0x02 && c[5] == 0x80,
             "tiny group codes %02x %02x %02x %02x %02x %02x, want 20 00 01 00 02 80", c[0], c[1], c[2], c[3], c[4],
             c[5]);
    /* BF16 subnormal inputs: 0x0001 = 2^-133 -> 2^-6 (0x08); 0x007F = 127*2^-133 -> 1.984 -> 2.0 (0x40) */
    uint16_t b[32] = {0x0001, 0x007F, 0x8040};
    int64_t sh[1] = {32}, g1[1] = {1};
    mxfp8_tensor X = mxfp8_tensor_make(b, MXFP8_DTYPE_BF16, 1, sh), D = mxfp8_tensor_make(c, MXFP8_DTYPE_E4M3, 1, sh),
                 S = mxfp8_tensor_make(sc, MXFP8_DTYPE_U8, 1, g1);
    TU_CHECK(mxfp8_quantize(&X, -1, NULL, &D, &S) == MXFP8_OK, "bf16 subnormal quantize failed");
    TU_CHECK(sc[0] == 0 && c[0] == 0x08 && c[1] == 0x40 && c[2] == 0xB8,
             "bf16 subnormals: scale %u codes %02x %02x %02x, want 0 08 40 B8", sc[0], c[0], c[1], c[2]);

    /* qdq to BF16: a value below BF16's normal range loses bits and is counted */
    float q[32] = {ldexpf(1.0f, -120), ldexpf(1.875f, -132), ldexpf(1.0f, -128)};
    uint16_t ob[32];
    float of[32];
    uint8_t s1, s2;
    int64_t cnt = mxfp8i_qdq_rows_bf16(q, MXFP8_DTYPE_F32, 1, 32, 32, MXFP8_FMT_E4M3, MXFP8_SCALE_NKI, MXFP8_GROUP_1X32,
                                       ob, 32, &s1, 1);
    mxfp8i_qdq_rows_f32(q, MXFP8_DTYPE_F32, 1, 32, 32, MXFP8_FMT_E4M3, MXFP8_SCALE_NKI, MXFP8_GROUP_1X32, of, 32, &s2,
                        1);
    TU_CHECK(s1 == 0 && s2 == 0, "qdq tiny group scale %u %u, want 0", s1, s2);
    TU_CHECK(of[1] == ldexpf(1.875f, -132) && of[2] == ldexpf(1.0f, -128) && of[0] == ldexpf(1.0f, -120),
             "qdq f32 must be exact: %a %a %a", of[0], of[1], of[2]);
    TU_CHECK(cnt == 1, "qdq bf16: %lld inexact elements reported, want 1 (1.875*2^-132)", (long long)cnt);
    TU_CHECK(ob[2] == 0x0020 && ob[0] == 0x0380, "qdq bf16 of 2^-128 / 2^-120: 0x%04x 0x%04x", ob[2], ob[0]);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* N-D views, strides, axes: against the oracle's line quantizer (tests/c/oracle/)                          */
/* ---------------------------------------------------------------------------------------------------------- */
typedef struct view3 {
    int64_t shape[3], strides[3];
} view3;

static void test_nd(void) {
    tu_rng rng = {777};
    const int64_t shp[3] = {5, 70, 6};
    int64_t n = 5 * 70 * 6;
    float *big = tu_alloc((size_t)n * 4 * 2);
    tu_fill_random_f32(big, n * 2, &rng);
    for (int axis = -3; axis < 3; axis++)
        for (int variant = 0; variant < 3; variant++) {
            int ax = axis < 0 ? axis + 3 : axis;
            /* src: contiguous (0), permuted strides (1), reversed along dim 1 with a gap (2) */
            mxfp8_tensor X = mxfp8_tensor_make(big, MXFP8_DTYPE_F32, 3, shp);
            if (variant == 1) {
                X.strides[0] = 1, X.strides[1] = 5 * 6, X.strides[2] = 5;
            } else if (variant == 2) {
                X.strides[0] = 70 * 12, X.strides[1] = -12, X.strides[2] = 2;
                X.data = big + 69 * 12;
            }
            int64_t G = (shp[ax] + 31) / 32, ssh[3] = {shp[0], shp[1], shp[2]};
            ssh[ax] = G;
            int64_t ns = ssh[0] * ssh[1] * ssh[2];
            uint8_t *codes = tu_alloc((size_t)n * 2), *sc = tu_alloc((size_t)ns * 2);
            memset(codes, 0xEE, (size_t)n * 2);
            memset(sc, 0xEE, (size_t)ns * 2);
            mxfp8_tensor D = mxfp8_tensor_make(codes, MXFP8_DTYPE_E5M2, 3, shp);
            mxfp8_tensor S = mxfp8_tensor_make(sc, MXFP8_DTYPE_E8M0, 3, ssh);
            if (variant == 2) { /* strided outputs too: every other byte */
                for (int i = 0; i < 3; i++) D.strides[i] *= 2, S.strides[i] *= 2;
            }
            mxfp8_quant_params p = {MXFP8_FMT_E5M2, MXFP8_SCALE_RCEIL, MXFP8_GROUP_1X32, MXFP8_ROUND_NEAREST, 0, 0,
                                    NULL};
            mxfp8_status st = mxfp8_quantize(&X, axis, &p, &D, &S);
            TU_CHECK(st == MXFP8_OK, "nd axis %d variant %d: status %d (%s)", axis, variant, st,
                     mxfp8_last_error_message());
            /* the oracle, line by line */
            int64_t idx[3], bad = 0;
            int o1 = ax == 0 ? 1 : 0, o2 = ax == 2 ? 1 : 2;
            for (idx[o1] = 0; idx[o1] < shp[o1]; idx[o1]++)
                for (idx[o2] = 0; idx[o2] < shp[o2]; idx[o2]++) {
                    double xv[70];
                    uint8_t cw[70], sw[3];
                    for (idx[ax] = 0; idx[ax] < shp[ax]; idx[ax]++)
                        xv[idx[ax]] = *(float *)mxfp8i_elem_ptr(&X, idx);
                    orc_quant_line(xv, 1, shp[ax], MXFP8_FMT_E5M2, MXFP8_SCALE_RCEIL, MXFP8_GROUP_1X32, cw, sw);
                    for (idx[ax] = 0; idx[ax] < G; idx[ax]++)
                        bad += *(uint8_t *)mxfp8i_elem_ptr(&S, idx) != sw[idx[ax]];
                    for (idx[ax] = 0; idx[ax] < shp[ax]; idx[ax]++)
                        bad += *(uint8_t *)mxfp8i_elem_ptr(&D, idx) != cw[idx[ax]];
                }
            TU_CHECK(bad == 0, "nd axis %d variant %d: %lld elements differ from the group oracle", axis, variant,
                     (long long)bad);
            if (variant == 2) { /* bytes between strided outputs untouched */
                int64_t touched = 0;
                for (int64_t i = 1; i < n * 2; i += 2) touched += codes[i] != 0xEE;
                TU_CHECK(touched == 0, "nd: %lld bytes between strided codes were written", (long long)touched);
            }
            /* dequantize back (F32) and compare with the group oracle's dequantization */
            float *out = tu_alloc((size_t)n * 4);
            mxfp8_tensor O = mxfp8_tensor_make(out, MXFP8_DTYPE_F32, 3, shp);
            st = mxfp8_dequantize(&D, &S, axis, MXFP8_GROUP_1X32, &O);
            TU_CHECK(st == MXFP8_OK, "nd dequantize: status %d (%s)", st, mxfp8_last_error_message());
            bad = 0;
            for (idx[0] = 0; idx[0] < shp[0]; idx[0]++)
                for (idx[1] = 0; idx[1] < shp[1]; idx[1]++)
                    for (idx[2] = 0; idx[2] < shp[2]; idx[2]++) {
                        uint8_t code = *(uint8_t *)mxfp8i_elem_ptr(&D, idx);
                        int64_t k = idx[ax];
                        idx[ax] = k / 32;
                        uint8_t s = *(uint8_t *)mxfp8i_elem_ptr(&S, idx);
                        idx[ax] = k;
                        float want = orc_f32(orc_dequant(code, s, MXFP8_FMT_E5M2));
                        float got = *(float *)mxfp8i_elem_ptr(&O, idx);
                        if (tu_f32_bits(got) != tu_f32_bits(want)) bad++;
                    }
            TU_CHECK(bad == 0, "nd dequantize axis %d variant %d: %lld elements differ", axis, variant, (long long)bad);
            free(out);
            free(codes);
            free(sc);
        }
    free(big);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Thread count independence and X^T rows == X cols transposed                                                */
/* ---------------------------------------------------------------------------------------------------------- */

static void test_threads_and_transpose(void) {
    tu_rng rng = {4242};
    int64_t R = 300, C = 2432, n = R * C;
    float *x = tu_alloc((size_t)n * 4);
    tu_fill_random_f32(x, n, &rng);
    uint8_t *c1 = tu_alloc((size_t)n), *c2 = tu_alloc((size_t)n), *s1 = tu_alloc((size_t)n / 16),
            *s2 = tu_alloc((size_t)n / 16), *co = tu_alloc((size_t)n), *so = tu_alloc((size_t)n / 16);
    double *line = tu_alloc(sizeof(double) * (size_t)(R > C ? R : C));
    mxfp8_quant_params p = {MXFP8_FMT_E4M3, MXFP8_SCALE_NKI, MXFP8_GROUP_1X32, MXFP8_ROUND_NEAREST, 0, 0, NULL};
    for (int axis = 0; axis < 2; axis++) {
        const int64_t nl = axis ? R : C, K = axis ? C : R, G = (K + 31) / 32;
        const size_t ns = (size_t)(nl * G);
        /* the oracle: line l along the axis; codes at (r, c) as the library lays them out, scales [G, C] or [R, G] */
        for (int64_t l = 0; l < nl; l++) {
            uint8_t *cl = tu_alloc((size_t)K), sl[76];
            for (int64_t k = 0; k < K; k++) line[k] = x[axis ? l * C + k : k * C + l];
            orc_quant_line(line, 1, K, MXFP8_FMT_E4M3, MXFP8_SCALE_NKI, MXFP8_GROUP_1X32, cl, sl);
            for (int64_t k = 0; k < K; k++) co[axis ? l * C + k : k * C + l] = cl[k];
            for (int64_t g = 0; g < G; g++) so[axis ? l * G + g : g * C + l] = sl[g];
            free(cl);
        }
        mxfp8_set_num_threads(1);
        tu_quantize_2d(x, MXFP8_DTYPE_F32, R, C, axis, p, c1, s1);
        TU_CHECK(!memcmp(c1, co, (size_t)n) && !memcmp(s1, so, ns), "axis %d, 1 thread: differs from the oracle",
                 axis);
        for (int nt = 2; nt <= 3; nt++) {
            mxfp8_set_num_threads(nt);
            memset(c2, 0xEE, (size_t)n);
            memset(s2, 0xEE, ns);
            tu_quantize_2d(x, MXFP8_DTYPE_F32, R, C, axis, p, c2, s2);
            TU_CHECK(!memcmp(c2, co, (size_t)n) && !memcmp(s2, so, ns), "axis %d, %d threads: differs from the oracle",
                     axis, nt);
        }
        /* dequantize (split between threads along the axis or the lines) against the one-element oracle */
        int64_t sh[2] = {R, C}, ssh[2] = {R, C};
        ssh[axis] = (sh[axis] + 31) / 32;
        float *deq = tu_alloc((size_t)n * 4);
        mxfp8_tensor D = mxfp8_tensor_make(c1, MXFP8_DTYPE_E4M3, 2, sh), S = mxfp8_tensor_make(s1, MXFP8_DTYPE_E8M0, 2, ssh),
                     O = mxfp8_tensor_make(deq, MXFP8_DTYPE_F32, 2, sh);
        for (int nt = 1; nt <= 3; nt += 2) {
            mxfp8_set_num_threads(nt);
            TU_CHECK(mxfp8_dequantize(&D, &S, axis, MXFP8_GROUP_1X32, &O) == MXFP8_OK, "dequantize: %s",
                     mxfp8_last_error_message());
            int64_t bad = 0;
            for (int64_t r = 0; r < R; r++)
                for (int64_t c = 0; c < C; c++) {
                    uint8_t sc = axis ? s1[r * ssh[1] + c / 32] : s1[(r / 32) * C + c];
                    float want = orc_f32(orc_dequant(c1[r * C + c], sc, MXFP8_FMT_E4M3));
                    bad += tu_f32_bits(want) != tu_f32_bits(deq[r * C + c]);
                }
            TU_CHECK(bad == 0, "dequantize axis %d, %d threads: %lld elements differ", axis, nt, (long long)bad);
        }
        free(deq);
    }
    mxfp8_set_num_threads(0);
    free(c1), free(c2), free(s1), free(s2), free(co), free(so), free(line), free(x);

    /* X [K, F] along columns (axis 0) vs X^T [F, K] along rows (axis 1) */
    static const int64_t Fs[] = {1, 127, 129, 160}, Ks[] = {32, 96, 160, 256, 2432};
    uint16_t *xb = tu_alloc(2432 * 160 * 2), *xt = tu_alloc(2432 * 160 * 2);
    for (int i = 0; i < 2432 * 160; i++) {
        float v;
        tu_fill_random_f32(&v, 1, &rng);
        xb[i] = mxfp8_fp32_to_bf16(v);
    }
    uint8_t *ca = tu_alloc(2432 * 160), *cb = tu_alloc(2432 * 160), *sa = tu_alloc(2432 * 160 / 32 + 8),
            *sb = tu_alloc(2432 * 160 / 32 + 8);
    for (size_t fi = 0; fi < 4; fi++)
        for (size_t ki = 0; ki < 5; ki++)
            for (int fmt = 0; fmt < 2; fmt++)
                for (int rule = 0; rule < 3; rule++)
                    for (int grp = 0; grp < 2; grp++) {
                        int64_t F = Fs[fi], K = Ks[ki], G = (K + 31) / 32;
                        if (grp == 1 && K % 128) continue;
                        for (int64_t k = 0; k < K; k++)
                            for (int64_t f = 0; f < F; f++) xt[f * K + k] = xb[k * F + f];
                        mxfp8_quant_params q = {(mxfp8_format)fmt, (mxfp8_scale_rule)rule, (mxfp8_group_scheme)grp,
                                                MXFP8_ROUND_NEAREST, 0, 0, NULL};
                        tu_quantize_2d(xb, MXFP8_DTYPE_BF16, K, F, 0, q, ca, sa);
                        tu_quantize_2d(xt, MXFP8_DTYPE_BF16, F, K, 1, q, cb, sb);
                        int64_t bad = 0;
                        for (int64_t k = 0; k < K; k++)
                            for (int64_t f = 0; f < F; f++) bad += ca[k * F + f] != cb[f * K + k];
                        for (int64_t g = 0; g < G; g++)
                            for (int64_t f = 0; f < F; f++) bad += sa[g * F + f] != sb[f * G + g];
                        TU_CHECK(bad == 0, "transpose F=%lld K=%lld %s %s group %d: %lld mismatches", (long long)F,
                                 (long long)K, FMT_NAME[fmt], RULE_NAME[rule], grp, (long long)bad);
                    }
    free(xb), free(xt), free(ca), free(cb), free(sa), free(sb);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Errors: right status, a message, outputs untouched                                                         */
/* ---------------------------------------------------------------------------------------------------------- */
#define SENT 0xA7
static int untouched(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != SENT) return 0;
    return 1;
}

static void test_errors(void) {
    float x[4 * 100];
    for (int i = 0; i < 400; i++) x[i] = (float)i;
    uint8_t codes[400], sc[64];
    int64_t sh[2] = {4, 100}, ssh[2] = {4, 4};
    mxfp8_quant_params p = mxfp8_quant_params_default();
    struct {
        const char *what;
        mxfp8_status want;
    } cases[] = {{"src NULL", MXFP8_ERR_NULL_POINTER},
                 {"data NULL", MXFP8_ERR_NULL_POINTER},
                 {"scales data NULL", MXFP8_ERR_NULL_POINTER},
                 {"axis 2", MXFP8_ERR_INVALID_ARGUMENT},
                 {"axis -3", MXFP8_ERR_INVALID_ARGUMENT},
                 {"fmt 7", MXFP8_ERR_INVALID_ARGUMENT},
                 {"rule 9", MXFP8_ERR_INVALID_ARGUMENT},
                 {"group 5", MXFP8_ERR_INVALID_ARGUMENT},
                 {"src u8", MXFP8_ERR_DTYPE},
                 {"data e5m2 for e4m3", MXFP8_ERR_DTYPE},
                 {"scales f32", MXFP8_ERR_DTYPE},
                 {"data shape", MXFP8_ERR_SHAPE_MISMATCH},
                 {"scales shape", MXFP8_ERR_SHAPE_MISMATCH},
                 {"wrapX K=100", MXFP8_ERR_UNSUPPORTED},
                 {"data aliases src", MXFP8_ERR_ALIASING},
                 {"scales alias data", MXFP8_ERR_ALIASING},
                 {"negative shape", MXFP8_ERR_SIZE_OVERFLOW},
                 {"rank 0", MXFP8_ERR_SHAPE_MISMATCH},
                 {"scales stride overflow", MXFP8_ERR_BAD_STRIDES}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        memset(codes, SENT, sizeof codes);
        memset(sc, SENT, sizeof sc);
        mxfp8_tensor X = mxfp8_tensor_make(x, MXFP8_DTYPE_F32, 2, sh),
                     D = mxfp8_tensor_make(codes, MXFP8_DTYPE_E4M3, 2, sh),
                     S = mxfp8_tensor_make(sc, MXFP8_DTYPE_E8M0, 2, ssh);
        mxfp8_quant_params q = p;
        int axis = 1;
        const mxfp8_tensor *xs = &X;
        mxfp8_tensor *ds = &D;
        switch (c) {
        case 0: xs = NULL; break;
        case 1: ds = NULL; break;
        case 2: S.data = NULL; break;
        case 3: axis = 2; break;
        case 4: axis = -3; break;
        case 5: q.fmt = (mxfp8_format)7; break;
        case 6: q.rule = (mxfp8_scale_rule)9; break;
        case 7: q.group = (mxfp8_group_scheme)5; break;
        case 8: X.dtype = MXFP8_DTYPE_U8; break;
        case 9: D.dtype = MXFP8_DTYPE_E5M2; break;
        case 10: S.dtype = MXFP8_DTYPE_F32; break;
        case 11: D.shape[1] = 99; break;
        case 12: S.shape[1] = 3; break;
        case 13: q.group = MXFP8_GROUP_WRAPX; break;
        case 14:
            X.dtype = MXFP8_DTYPE_U8, X.data = codes, X.dtype = MXFP8_DTYPE_BF16, X.shape[1] = 50, X.strides[0] = 50,
            D.shape[1] = 50, D.strides[0] = 50, S.shape[1] = 2, S.strides[0] = 2;
            break;
        case 15: S.data = codes + 396; break;
        case 16: X.shape[0] = -4, D.shape[0] = -4, S.shape[0] = -4; break;
        case 17: X.ndim = 0, D.ndim = 0, S.ndim = 0; break;
        case 18: S.strides[0] = INT64_MAX / 2; break;
        }
        mxfp8_status st = mxfp8_quantize(xs, axis, &q, ds, &S);
        TU_CHECK(st == cases[c].want, "quantize error case '%s': status %d (%s), want %d", cases[c].what, st,
                 mxfp8_status_string(st), cases[c].want);
        TU_CHECK(st == MXFP8_OK || mxfp8_last_error_message()[0], "error case '%s': no message", cases[c].what);
        TU_CHECK(untouched(codes, sizeof codes) && untouched(sc, sizeof sc), "error case '%s': outputs were written",
                 cases[c].what);
    }
    /* the message names the parameter */
    {
        mxfp8_tensor X = mxfp8_tensor_make(x, MXFP8_DTYPE_F32, 2, sh),
                     D = mxfp8_tensor_make(codes, MXFP8_DTYPE_E4M3, 2, sh),
                     S = mxfp8_tensor_make(sc, MXFP8_DTYPE_E8M0, 2, ssh);
        mxfp8_quantize(&X, 5, NULL, &D, &S);
        TU_CHECK(strstr(mxfp8_last_error_message(), "axis 5") != NULL, "message '%s' does not name axis 5",
                 mxfp8_last_error_message());
        TU_CHECK(mxfp8_quantize(&X, 1, NULL, &D, &S) == MXFP8_OK && mxfp8_last_error_message()[0] == 0,
                 "a successful call must clear the message");
    }
    /* dequantize errors */
    float out[400];
    {
        mxfp8_tensor D = mxfp8_tensor_make(codes, MXFP8_DTYPE_E4M3, 2, sh),
                     S = mxfp8_tensor_make(sc, MXFP8_DTYPE_E8M0, 2, ssh),
                     O = mxfp8_tensor_make(out, MXFP8_DTYPE_F32, 2, sh);
        memset(out, SENT, sizeof out);
        memset(codes, SENT, sizeof codes);
        TU_CHECK(mxfp8_dequantize(&D, &S, 0, MXFP8_GROUP_1X32, &O) == MXFP8_ERR_SHAPE_MISMATCH,
                 "dequant axis 0 scales");
        TU_CHECK(mxfp8_dequantize(&D, &S, 1, (mxfp8_group_scheme)3, &O) == MXFP8_ERR_INVALID_ARGUMENT, "dequant group");
        TU_CHECK(mxfp8_dequantize(&D, &S, 1, MXFP8_GROUP_WRAPX, &O) == MXFP8_ERR_UNSUPPORTED, "dequant wrapX");
        O.dtype = MXFP8_DTYPE_U8;
        TU_CHECK(mxfp8_dequantize(&D, &S, 1, MXFP8_GROUP_1X32, &O) == MXFP8_ERR_DTYPE, "dequant out dtype");
        O.dtype = MXFP8_DTYPE_F32;
        D.dtype = MXFP8_DTYPE_BF16;
        TU_CHECK(mxfp8_dequantize(&D, &S, 1, MXFP8_GROUP_1X32, &O) == MXFP8_ERR_DTYPE, "dequant data dtype");
        D.dtype = MXFP8_DTYPE_E4M3;
        O.data = codes;
        O.dtype = MXFP8_DTYPE_F16;
        O.shape[1] = 50, O.strides[0] = 50, D.shape[1] = 50, D.strides[0] = 50, S.shape[1] = 2, S.strides[0] = 2;
        TU_CHECK(mxfp8_dequantize(&D, &S, 1, MXFP8_GROUP_1X32, &O) == MXFP8_ERR_ALIASING, "dequant aliasing");
        TU_CHECK(untouched((uint8_t *)out, sizeof out) && untouched(codes, sizeof codes),
                 "dequant errors wrote output");
    }
}

/* A caller's MXCSR (flush-to-zero, denormals-are-zero, round toward zero) must not change any result. */
#if defined(__x86_64__)
#include <xmmintrin.h>
static void test_mxcsr_independence(void) {
    tu_rng rng = {555};
    int64_t R = 40, K = 160, n = R * K;
    float *x = tu_alloc((size_t)n * 4);
    tu_fill_random_f32(x, n, &rng);
    for (int64_t i = 0; i < n; i += 7) x[i] = ldexpf((float)(i % 5) + 1.0f, -140 - (int)(i % 9)); /* subnormals */
    uint8_t *c1 = tu_alloc((size_t)n), *c2 = tu_alloc((size_t)n), *s1 = tu_alloc((size_t)n), *s2 = tu_alloc((size_t)n);
    float *q1 = tu_alloc((size_t)n * 4), *q2 = tu_alloc((size_t)n * 4);
    static const unsigned modes[] = {0x8040u, 0x6000u, 0x2000u | 0x8040u, 0x4000u};
    for (int axis = 0; axis < 2; axis++)
        for (int rule = 0; rule < 3; rule++) {
            mxfp8_quant_params p = {MXFP8_FMT_E4M3, (mxfp8_scale_rule)rule, MXFP8_GROUP_1X32, MXFP8_ROUND_NEAREST, 0, 0,
                                    NULL};
            int64_t sh[2] = {R, K}, gs[2] = {R, K};
            gs[axis] = (sh[axis] + 31) / 32;
            mxfp8_tensor X = mxfp8_tensor_make(x, MXFP8_DTYPE_F32, 2, sh),
                         S1 = mxfp8_tensor_make(s1, MXFP8_DTYPE_U8, 2, gs),
                         S2 = mxfp8_tensor_make(s2, MXFP8_DTYPE_U8, 2, gs),
                         D1 = mxfp8_tensor_make(c1, MXFP8_DTYPE_E4M3, 2, sh),
                         D2 = mxfp8_tensor_make(c2, MXFP8_DTYPE_E4M3, 2, sh),
                         Q1 = mxfp8_tensor_make(q1, MXFP8_DTYPE_F32, 2, sh),
                         Q2 = mxfp8_tensor_make(q2, MXFP8_DTYPE_F32, 2, sh);
            mxfp8_quantize(&X, axis, &p, &D1, &S1);
            mxfp8_dequantize(&D1, &S1, axis, MXFP8_GROUP_1X32, &Q1);
            for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
                unsigned old = _mm_getcsr();
                _mm_setcsr(old | modes[m]);
                mxfp8_quantize(&X, axis, &p, &D2, &S2);
                mxfp8_dequantize(&D2, &S2, axis, MXFP8_GROUP_1X32, &Q2);
                unsigned after = _mm_getcsr();
                _mm_setcsr(old);
                TU_CHECK((after & 0xE040u) == modes[m], "MXCSR mode 0x%x was not restored (0x%x)", modes[m], after);
                TU_CHECK(!memcmp(c1, c2, (size_t)n) && !memcmp(s1, s2, (size_t)(gs[0] * gs[1])) &&
                             !memcmp(q1, q2, (size_t)n * 4),
                         "axis %d rule %s: results change under MXCSR mode 0x%x", axis, RULE_NAME[rule], modes[m]);
            }
        }
    free(x), free(c1), free(c2), free(s1), free(s2), free(q1), free(q2);
}
#else
static void test_mxcsr_independence(void) {}
#endif

int main(void) {
    test_special_groups();
    test_mxcsr_independence();
    test_nd();
    test_threads_and_transpose();
    test_errors();
    return tu_finish("test_quant");
}
