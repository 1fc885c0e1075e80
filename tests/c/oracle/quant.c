/*
 * quant.c -- the oracle's MX quantizer and GEMM (oracle.h), written from include/mxfp8.h:
 *  - groups: 1x32 = 32 contiguous indices [OCP 6]; wrapX = the axis cut in 512-tiles, the remainder in a 256 and/or a
 *    128 subtile; in the (sub)tile at k0 of size P, S = P/4, group j holds {k0 + s*S + 8j + q : s < 4, q < 8} and has
 *    compact index k0/32 + j;
 *  - a group: amax over its values (a short group has no padding values); any NaN or Inf -> scale 255 and NaN codes
 *    with each element's sign; amax 0 -> scale 0 (zero codes keep their sign); else the rule's scale code s and codes
 *    = the FP8 encoding of x * 2^(127 - s), computed exactly in double (the encoding saturates) [OCP 6.3], then stepped down to the largest code whose
 *    dequantized value is at most FLT_MAX (include/mxfp8.h, "Values near FLT_MAX");
 *  - dequantization: value(code) * 2^(s - 127), exact; s = 255 -> NaN;
 *  - GEMM: C = fmaf chain over k ascending from +0 of the dequantized operands.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "oracle.h"

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "oracle: out of memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

int orc_group_members(int64_t K, int scheme, int64_t g, int64_t idx[32]) {
    if (scheme == 0) {
        int n = K - 32 * g < 32 ? (int)(K - 32 * g) : 32;
        for (int i = 0; i < n; i++) idx[i] = 32 * g + i;
        return n < 0 ? 0 : n;
    }
    for (int64_t k0 = 0, P; k0 < K; k0 += P) {
        P = K - k0 >= 512 ? 512 : K - k0 >= 256 ? 256 : 128;
        if (g >= (k0 + P) / 32) continue; /* group g lies in a later tile */
        const int64_t S = P / 4, j = g - k0 / 32;
        int n = 0;
        for (int s = 0; s < 4; s++)
            for (int q = 0; q < 8; q++) idx[n++] = k0 + s * S + 8 * j + q;
        return n;
    }
    return 0;
}

int orc_quant_group(const double *x, int n, int fmt, int rule, uint8_t *codes) {
    int nonfinite = 0;
    double amax = 0.0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(x[i])) nonfinite = 1;
        else if (fabs(x[i]) > amax) amax = fabs(x[i]);
    }
    if (nonfinite) {
        for (int i = 0; i < n; i++) codes[i] = (uint8_t)((signbit(x[i]) ? 0x80 : 0) | (fmt ? 0x7E : 0x7F));
        return 255;
    }
    const int s = orc_scale_code(amax, fmt, rule);
    const double inv = orc_e8m0_value((unsigned)(254 - s)); /* 2^(127 - s): x * inv is exact in double */
    for (int i = 0; i < n; i++) {
        codes[i] = orc_fp8_encode(x[i] * inv, fmt);
        /* the dequantized value must stay finite in FP32 (include/mxfp8.h, "Values near FLT_MAX"): step the
           magnitude down to the largest code whose value times 2^(s - 127) is at most FLT_MAX */
        while (fabs(orc_fp8_value(codes[i], fmt) * orc_e8m0_value((unsigned)s)) > 3.4028234663852886e38)
            codes[i] = (uint8_t)(codes[i] - 1);
    }
    return s;
}

double orc_dequant(uint8_t code, int scale, int fmt) {
    if (scale == 255) return NAN;
    const double v = orc_fp8_value(code, fmt);
    return isnan(v) ? v : v * orc_e8m0_value((unsigned)scale); /* exact in double */
}

void orc_quant_line(const double *x, int64_t xs, int64_t K, int fmt, int rule, int scheme, uint8_t *codes,
                    uint8_t *scales) {
    int64_t idx[32];
    double v[32];
    uint8_t c[32];
    for (int64_t g = 0; g < (K + 31) / 32; g++) {
        const int n = orc_group_members(K, scheme, g, idx);
        for (int i = 0; i < n; i++) v[i] = x[idx[i] * xs];
        const int s = orc_quant_group(v, n, fmt, rule, c);
        if (scales) scales[g] = (uint8_t)s;
        if (codes)
            for (int i = 0; i < n; i++) codes[idx[i]] = c[i];
    }
}

void orc_qdq_line_f32(const float *x, int64_t xs, int64_t K, int fmt, int rule, int scheme, float *out) {
    int64_t idx[32];
    double v[32];
    uint8_t c[32];
    for (int64_t g = 0; g < (K + 31) / 32; g++) {
        const int n = orc_group_members(K, scheme, g, idx);
        for (int i = 0; i < n; i++) v[i] = (double)x[idx[i] * xs];
        const int s = orc_quant_group(v, n, fmt, rule, c);
        for (int i = 0; i < n; i++) out[idx[i]] = orc_f32(orc_dequant(c[i], s, fmt));
    }
}

void orc_gemm_f32(const float *qa, const float *qb, int64_t M, int64_t N, int64_t K, float *C, int64_t ldc) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++) acc = fmaf(qa[m * K + k], qb[n * K + k], acc);
            C[m * ldc + n] = acc;
        }
}

void orc_mx_gemm(const float *A, const float *B, int64_t M, int64_t N, int64_t K, int fmt, int rule, int scheme,
                 float *C) {
    float *qa = xmalloc(sizeof(float) * (size_t)(M * K)), *qb = xmalloc(sizeof(float) * (size_t)(N * K));
    for (int64_t m = 0; m < M; m++) orc_qdq_line_f32(A + m * K, 1, K, fmt, rule, scheme, qa + m * K);
    for (int64_t n = 0; n < N; n++) orc_qdq_line_f32(B + n * K, 1, K, fmt, rule, scheme, qb + n * K);
    orc_gemm_f32(qa, qb, M, N, K, C, N);
    free(qa);
    free(qb);
}
