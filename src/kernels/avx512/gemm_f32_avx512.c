/*
 * gemm_f32_avx512.c -- AVX-512F FMA microkernel, 8 x 32 register tile, for the F32 panel contract of
 * src/kernels/ukernel.h. Each of the 16 accumulators is one zmm; step k does acc = fma(a[k][i] (broadcast), b[k][j..],
 * acc): exactly the reference's per-element sequence, so the result equals mxfp8i_f32_gemm_8x32__ref bit for bit
 * (the driver runs it under src/runtime/fenv.h's IEEE defaults: no FTZ/DAZ, round to nearest even).
 */
#include <immintrin.h>

#include "../ref/ref.h" /* the F32 panel format */
#include "avx512.h"

void mxfp8i_f32_gemm_8x32__avx512f(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int mr, int nr,
                                   int load_c) {
    __mmask16 m0 = (__mmask16)(nr >= 16 ? 0xFFFF : ((1u << nr) - 1u));
    __mmask16 m1 = (__mmask16)(nr >= 32 ? 0xFFFF : nr <= 16 ? 0 : ((1u << (nr - 16)) - 1u));
    __m512 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51, c60, c61, c70, c71;
    c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = _mm512_setzero_ps();
    c40 = c41 = c50 = c51 = c60 = c61 = c70 = c71 = _mm512_setzero_ps();
    if (load_c) {
#define LD(i, x0, x1)                                                                                                  \
    if (i < mr) {                                                                                                      \
        x0 = _mm512_maskz_loadu_ps(m0, c + (i)*ldc);                                                                   \
        x1 = _mm512_maskz_loadu_ps(m1, c + (i)*ldc + 16);                                                              \
    }
        LD(0, c00, c01) LD(1, c10, c11) LD(2, c20, c21) LD(3, c30, c31)
        LD(4, c40, c41) LD(5, c50, c51) LD(6, c60, c61) LD(7, c70, c71)
#undef LD
    }
    for (int64_t k = 0; k < kc; k++) {
        const float *ak = a + k * 8;
        __m512 b0 = _mm512_loadu_ps(b + k * 32), b1 = _mm512_loadu_ps(b + k * 32 + 16), av;
#define STEP(i, x0, x1)                                                                                                \
    av = _mm512_set1_ps(ak[i]);                                                                                        \
    x0 = _mm512_fmadd_ps(av, b0, x0);                                                                                  \
    x1 = _mm512_fmadd_ps(av, b1, x1);
        STEP(0, c00, c01) STEP(1, c10, c11) STEP(2, c20, c21) STEP(3, c30, c31)
        STEP(4, c40, c41) STEP(5, c50, c51) STEP(6, c60, c61) STEP(7, c70, c71)
#undef STEP
    }
#define ST(i, x0, x1)                                                                                                  \
    if (i < mr) {                                                                                                      \
        _mm512_mask_storeu_ps(c + (i)*ldc, m0, x0);                                                                    \
        _mm512_mask_storeu_ps(c + (i)*ldc + 16, m1, x1);                                                               \
    }
    ST(0, c00, c01) ST(1, c10, c11) ST(2, c20, c21) ST(3, c30, c31)
    ST(4, c40, c41) ST(5, c50, c51) ST(6, c60, c61) ST(7, c70, c71)
#undef ST
}

static void run_avx512f(int64_t k0, int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mr, int nr,
                        int load_c) {
    mxfp8i_f32_gemm_8x32__avx512f(kc, (const float *)a + k0 * MXFP8I_MR, (const float *)b + k0 * MXFP8I_NR, c, ldc,
                                  mr, nr, load_c);
}

const mxfp8i_ukernel mxfp8i_f32_gemm_8x32__avx512f_ukernel = {
    .name = "f32_gemm_8x32__avx512f", .isa_name = "avx512", .isa_level = 1, .needs = MXFP8I_NEEDS_AVX512,
    .test_only = 0, .panel = MXFP8I_PANEL_F32, .mr = MXFP8I_MR, .nr = MXFP8I_NR, .kalign = 1,
    .tile_m = 128, .tile_n = 256, .tile_k = 128, .fn = mxfp8i_f32_gemm_8x32__avx512f,
    .panel_bytes = mxfp8i_f32_panel_bytes, .pack = mxfp8i_f32_pack, .pack_cm = mxfp8i_f32_pack_cm,
    .run = run_avx512f, .selftest = MXFP8I_SELFTEST_SLOT};
