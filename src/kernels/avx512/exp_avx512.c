/*
 * exp_avx512.c -- the library's FP32 exponential (src/kernels/expf.h) on 16 lanes: each half of 8 lanes in double
 * precision with the same fused operations as mxfp8i_expf1, the table of 2^(i/32) held in four registers
 * (VPERMT2Q on the low 4 bits of i, a blend on bit 4); lanes with |x| >= 88 or NaN go through mxfp8i_expf1. Bitwise
 * the reference (qpanel.h, mxfp8i_exp_f32_fn); exhaustively checked against it over all 2^32 inputs when written.
 */
#include <immintrin.h>

#include "../expf.h"
#include "avx512.h"

static inline __attribute__((always_inline)) __m256 exp8(__m256 x, const __m512i tab[4]) {
    const __m512d xd = _mm512_cvtps_pd(x), shift = _mm512_set1_pd(MXFP8I_EXPF_SHIFT);
    const __m512d invln2n = _mm512_set1_pd(MXFP8I_EXPF_INVLN2N);
    const __m512d kds = _mm512_fmadd_pd(invln2n, xd, shift);
    const __m512i ki = _mm512_castpd_si512(kds);
    const __m512d kd = _mm512_sub_pd(kds, shift), r = _mm512_fmsub_pd(invln2n, xd, kd);
    const __m512i lo = _mm512_permutex2var_epi64(tab[0], ki, tab[1]), hi = _mm512_permutex2var_epi64(tab[2], ki, tab[3]);
    const __m512i t = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(ki, _mm512_set1_epi64(16)), lo, hi);
    const __m512d s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64(ki, 47)));
    const __m512d z = _mm512_fmadd_pd(r, _mm512_set1_pd(MXFP8I_EXPF_C0), _mm512_set1_pd(MXFP8I_EXPF_C1));
    const __m512d y = _mm512_fmadd_pd(r, _mm512_set1_pd(MXFP8I_EXPF_C2), _mm512_set1_pd(1.0));
    return _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_fmadd_pd(z, _mm512_mul_pd(r, r), y), s));
}

void mxfp8i_exp_f32__avx512(const float *x, float *y, int64_t n) {
    __m512i tab[4];
    for (int i = 0; i < 4; i++) tab[i] = _mm512_loadu_si512((const void *)(mxfp8i_expf_tab + 8 * i));
    const __m512i big = _mm512_set1_epi32((int)MXFP8I_EXPF_BIG), top = _mm512_set1_epi32(0x7ff);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        const __m512i e = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(v), 20), top);
        const __mmask16 sp = _mm512_cmpgt_epu32_mask(e, big) & m;
        const __m256 ylo = exp8(_mm512_castps512_ps256(v), tab), yhi = exp8(_mm512_extractf32x8_ps(v, 1), tab);
        _mm512_mask_storeu_ps(y + i, m, _mm512_insertf32x8(_mm512_castps256_ps512(ylo), yhi, 1));
        for (unsigned b = sp; b; b &= b - 1) { /* |x| >= 88, inf, NaN: rare */
            const int64_t l = i + __builtin_ctz(b);
            y[l] = mxfp8i_expf1(x[l]);
        }
    }
}
