/*
 * qstats.h -- the statistics accumulator of the quantization kernels (internal): the counts and sums behind the public
 * mxfp8_quant_stats, gathered per group by every kernel so that they are the same for any thread count, tiling and ISA
 * path.
 *
 * Per group (a kernel reports each group exactly once): elements, the scale-code histogram; for a group with a NaN or
 * Inf nothing else (nonfinite_groups); for an all-zero group (amax == 0) zero_groups; otherwise, per element with
 * y = x * 2^-e (the FP32 product the quantizer rounds): saturated when |y| > max normal, flushed when x != 0 gets a
 * zero code, subnormal when the code's exponent field is 0 and its fraction is not. Squared error and squared signal
 * are taken in the group's scaled domain, in FP32: t = (|y| - r)^2 and s = |y|^2, r = |fp8(code)| (the error of x is
 * (|y| - r) * 2^e exactly, up to the rounding of y itself and of the FP32 operations; y^2 <= 2^32). The group's sums
 * are taken in one fixed order over its 32 members m (member order: ascending index for 1x32, mxfp8i_group_members for
 * wrapX; missing members of a short group are +0), a pairwise tree:
 *     P_L = t_L + t_(L+16) (L < 16),  Q_L = P_L + P_(L+8) (L < 8),  R_L = Q_L + Q_(L+4) (L < 4),
 *     S_L = R_L + R_(L+2) (L < 2),    sum = S_0 + S_1,
 * which SIMD kernels reach both with a group in two 16-lane vectors (rows) and with one lane per group (columns).
 * The group sum times 2^(2e) (exact in FP64) enters an exact fixed-point accumulator (mxfp8i_xsum), so the total does
 * not depend on the order in which groups arrive or accumulators merge; it is rounded to FP64 once, at the end.
 */
#ifndef MXFP8_KERNELS_QSTATS_H
#define MXFP8_KERNELS_QSTATS_H

#include <stdint.h>
#include <string.h>

#include "mxfp8.h"

/** Exact sum of non-negative finite FP64 values: 32-bit digits of weight 2^(32 i - 416) held in int64 words (carries
 *  are propagated every 2^30 additions). Covers every unscaled group sum (an FP32 sum, lowest bit >= 2^-149, times
 *  2^(2e) >= 2^-254; below 2^292) and totals below 2^352; bits below 2^-416 of a term would be dropped (a fixed rule,
 *  so the sum stays order-independent; it cannot happen for group sums). */
#define MXFP8I_XSUM_WORDS 24
typedef struct mxfp8i_xsum {
    int64_t w[MXFP8I_XSUM_WORDS];
    int64_t n; /* additions since the last carry propagation */
} mxfp8i_xsum;

typedef struct mxfp8i_qstats {
    int64_t elements, saturated, flushed, subnormal, nonfinite_groups, zero_groups;
    int64_t hist[256];
    mxfp8i_xsum err, sig;
} mxfp8i_qstats;

void mxfp8i_xsum_add(mxfp8i_xsum *s, double v);
/** s += M * 2^(e - 1075) (M < 2^63, e >= 1: the weight of an FP64 mantissa of biased exponent e), exactly. */
void mxfp8i_xsum_add_int(mxfp8i_xsum *s, uint64_t M, int e);

/** A fast front of mxfp8i_xsum for many additions (SIMD kernels): the 53-bit mantissas of the values are summed per
 *  FP64 exponent in int64 buckets (valid in [lo, hi], zeroed as the range grows) and moved into `dst` every 1024
 *  additions and at the end (mxfp8i_xbucket_flush). Exact, so the result equals adding each value to dst. */
typedef struct mxfp8i_xbucket {
    int lo, hi, n;
    mxfp8i_xsum *dst;
    int64_t b[2048];
} mxfp8i_xbucket;
void mxfp8i_xbucket_flush(mxfp8i_xbucket *x);
static inline void mxfp8i_xbucket_init(mxfp8i_xbucket *x, mxfp8i_xsum *dst) {
    x->lo = 1, x->hi = 0, x->n = 0, x->dst = dst;
}
static inline void mxfp8i_xbucket_add(mxfp8i_xbucket *x, double v) {
    if (!(v > 0.0)) return;
    uint64_t u;
    memcpy(&u, &v, 8);
    int e = (int)(u >> 52);
    uint64_t M = (u & 0xFFFFFFFFFFFFFull) | (e ? 1ull << 52 : 0);
    if (!e) e = 1;
    if (x->lo > x->hi) x->lo = x->hi = e, x->b[e] = 0;
    while (e < x->lo) x->b[--x->lo] = 0;
    while (e > x->hi) x->b[++x->hi] = 0;
    x->b[e] += (int64_t)M;
    if (++x->n == 1024) mxfp8i_xbucket_flush(x);
}
void mxfp8i_xsum_merge(mxfp8i_xsum *dst, const mxfp8i_xsum *src);
double mxfp8i_xsum_value(const mxfp8i_xsum *s);

void mxfp8i_qstats_zero(mxfp8i_qstats *s);
/** dst += src (every count and sum; exact, so merging order is irrelevant). */
void mxfp8i_qstats_merge(mxfp8i_qstats *dst, const mxfp8i_qstats *src);
/** The public form (the sums rounded once to FP64). */
void mxfp8i_qstats_export(const mxfp8i_qstats *s, mxfp8_quant_stats *out);

/** The canonical group sum of 32 FP32 terms (member order; pad with +0). */
static inline float mxfp8i_qstats_tree(const float t[32]) {
    float P[16], Q[8], R[4];
    for (int L = 0; L < 16; L++) P[L] = t[L] + t[L + 16];
    for (int L = 0; L < 8; L++) Q[L] = P[L] + P[L + 8];
    for (int L = 0; L < 4; L++) R[L] = Q[L] + Q[L + 4];
    return (R[0] + R[2]) + (R[1] + R[3]);
}
/** A group sum of the scaled domain back in x's units: sum * 2^(2 (scale - 127)), exact in FP64. */
static inline double mxfp8i_qstats_unscale(float sum, int scale) {
    uint64_t b = (uint64_t)(1023 + 2 * (scale - 127)) << 52;
    double p;
    memcpy(&p, &b, 8);
    return (double)sum * p;
}

/** Scalar statistics of one quantized group: values x[0..n) in member order (n <= 32), its codes and scale code.
 *  The reference kernel's form, and the fallback of SIMD kernels. */
void mxfp8i_qstats_group(mxfp8i_qstats *s, const float *x, const uint8_t *codes, int n, uint8_t scale,
                         mxfp8_format fmt);

#endif /* MXFP8_KERNELS_QSTATS_H */
