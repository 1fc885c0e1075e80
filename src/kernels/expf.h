/*
 * expf.h -- the library's FP32 exponential: the one rule behind every exp of the MoE activations (sigmoid-gated
 * SwiGLU), shared by the reference and the AVX-512 kernel (qpanel.h, mxfp8i_exp_f32_fn).
 *
 * The rule is the algorithm of glibc's expf (2.28 and later, from Arm's optimized-routines) on CPUs with FMA, fused
 * operations included, so that on such a system results are bitwise those of libm's expf; spelled out here so that
 * they no longer depend on the C library or on whether the CPU has FMA (glibc's other variant rounds two of these
 * steps separately). In double precision: k = round(x N / ln 2) with N = 32 (through the 1.5 * 2^52 shift),
 * r = x N / ln 2 - k (one fused operation), 2^(k / N) from a table of 2^(i / N) and the exponent bits of k, and
 * exp(x) ~ 2^(k / N) (C0 r^3 + C1 r^2 + C2 r + 1) with the minimax coefficients of that library, rounded once to FP32.
 * |x| >= 88 and NaN take the special cases: exp(-inf) = +0, inf and NaN give x + x, x > 88.72283 gives +inf, x below
 * -103.97208 gives +0, below -103.27893 the smallest subnormal, otherwise the general formula. errno is not set.
 */
#ifndef MXFP8_KERNELS_EXPF_H
#define MXFP8_KERNELS_EXPF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* The bits of 2^(i/32) rounded to the nearest double, minus i << 47 (so that adding k << 47 with k = i mod 32
 * sets the exponent of 2^(k/32)). */
static const uint64_t mxfp8i_expf_tab[32] = {
    0x3ff0000000000000u, 0x3fefd9b0d3158574u, 0x3fefb5586cf9890fu, 0x3fef9301d0125b51u, 0x3fef72b83c7d517bu,
    0x3fef54873168b9aau, 0x3fef387a6e756238u, 0x3fef1e9df51fdee1u, 0x3fef06fe0a31b715u, 0x3feef1a7373aa9cbu,
    0x3feedea64c123422u, 0x3feece086061892du, 0x3feebfdad5362a27u, 0x3feeb42b569d4f82u, 0x3feeab07dd485429u,
    0x3feea47eb03a5585u, 0x3feea09e667f3bcdu, 0x3fee9f75e8ec5f74u, 0x3feea11473eb0187u, 0x3feea589994cce13u,
    0x3feeace5422aa0dbu, 0x3feeb737b0cdc5e5u, 0x3feec49182a3f090u, 0x3feed503b23e255du, 0x3feee89f995ad3adu,
    0x3feeff76f2fb5e47u, 0x3fef199bdd85529cu, 0x3fef3720dcef9069u, 0x3fef5818dcfba487u, 0x3fef7c97337b9b5fu,
    0x3fefa4afa2a490dau, 0x3fefd0765b6e4540u};

#define MXFP8I_EXPF_INVLN2N 0x1.71547652b82fep+5 /* 32 / ln 2 */
#define MXFP8I_EXPF_SHIFT 0x1.8p+52
#define MXFP8I_EXPF_C0 0x1.c6af84b912394p-20 /* coefficients of r^3, r^2, r, scaled by 32^-3, 32^-2, 32^-1 */
#define MXFP8I_EXPF_C1 0x1.ebfce50fac4f3p-13
#define MXFP8I_EXPF_C2 0x1.62e42ff0c52d6p-6
#define MXFP8I_EXPF_BIG 0x42au /* bits 30..20 of x above this: |x| >= 88 or NaN (the special cases) */

/* The special cases (bits 30..20 of x above MXFP8I_EXPF_BIG); 0 with *y unset for those the general formula
 * takes. */
static inline int mxfp8i_expf_special(float x, float *y) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if (u == 0xff800000u) return *y = 0.0f, 1;
    if (((u >> 20) & 0x7ffu) > 0x7f7u) return *y = x + x, 1; /* inf, NaN */
    if (x > 0x1.62e42ep6f) return *y = INFINITY, 1;
    if (x < -0x1.9fe368p6f) return *y = 0.0f, 1;
    if (x < -0x1.9d1d9ep6f) return *y = 0x1p-149f, 1;
    return 0;
}

/* exp(x) by the rule above, one element (fma: one rounding, as C99 defines it). */
static inline float mxfp8i_expf1(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    float sp;
    if (((u >> 20) & 0x7ffu) > MXFP8I_EXPF_BIG && mxfp8i_expf_special(x, &sp)) return sp;
    const double xd = (double)x, kds = fma(MXFP8I_EXPF_INVLN2N, xd, MXFP8I_EXPF_SHIFT);
    uint64_t ki;
    memcpy(&ki, &kds, sizeof ki);
    const double kd = kds - MXFP8I_EXPF_SHIFT, r = fma(MXFP8I_EXPF_INVLN2N, xd, -kd);
    const uint64_t t = mxfp8i_expf_tab[ki & 31u] + (ki << 47);
    double s;
    memcpy(&s, &t, sizeof s);
    const double z = fma(r, MXFP8I_EXPF_C0, MXFP8I_EXPF_C1), r2 = r * r, y = fma(r, MXFP8I_EXPF_C2, 1.0);
    return (float)(fma(z, r2, y) * s);
}

#endif /* MXFP8_KERNELS_EXPF_H */
