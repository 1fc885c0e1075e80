/*
 * qstats.c -- the statistics accumulator of the quantization kernels (qstats.h): the exact fixed-point sum, merging,
 * export to mxfp8_quant_stats, and the scalar per-group statistics.
 */
#include <math.h>
#include <string.h>

#include "../format/codec.h"
#include "qstats.h"

#define XSUM_LSB (-416) /* weight of bit 0 of word 0 */

static void xsum_carry(mxfp8i_xsum *s) {
    for (int i = 0; i + 1 < MXFP8I_XSUM_WORDS; i++) {
        int64_t c = s->w[i] >> 32; /* words are non-negative: an arithmetic shift is a division */
        s->w[i] -= c << 32;
        s->w[i + 1] += c;
    }
    s->n = 0;
}

void mxfp8i_xsum_add_int(mxfp8i_xsum *s, uint64_t M, int e) {
    int pos = e - 1075 - XSUM_LSB;
    if (pos < 0) {
        M = pos <= -64 ? 0 : M >> -pos;
        pos = 0;
    }
    int wi = pos / 32, sh = pos % 32;
    if (wi > MXFP8I_XSUM_WORDS - 4) wi = MXFP8I_XSUM_WORDS - 4; /* beyond 2^352: unreachable (group sums < 2^292) */
    unsigned __int128 x = (unsigned __int128)M << sh; /* < 2^95 */
    s->w[wi] += (int64_t)(uint32_t)x;
    s->w[wi + 1] += (int64_t)(uint32_t)(x >> 32);
    s->w[wi + 2] += (int64_t)(uint32_t)(x >> 64);
    if (++s->n >= ((int64_t)1 << 30)) xsum_carry(s);
}

void mxfp8i_xsum_add(mxfp8i_xsum *s, double v) {
    if (!(v > 0.0)) return; /* +0 (and, defensively, anything not positive) adds nothing */
    uint64_t u;
    memcpy(&u, &v, 8);
    int e = (int)(u >> 52); /* v finite and > 0: v = M * 2^(max(e, 1) - 1075) */
    uint64_t M = (u & 0xFFFFFFFFFFFFFull) | (e ? 1ull << 52 : 0);
    mxfp8i_xsum_add_int(s, M, e ? e : 1);
}

void mxfp8i_xbucket_flush(mxfp8i_xbucket *x) {
    for (int e = x->lo; e <= x->hi; e++)
        if (x->b[e]) mxfp8i_xsum_add_int(x->dst, (uint64_t)x->b[e], e), x->b[e] = 0;
    x->n = 0;
}

void mxfp8i_xsum_merge(mxfp8i_xsum *dst, const mxfp8i_xsum *src) {
    mxfp8i_xsum t = *src;
    xsum_carry(&t);
    xsum_carry(dst);
    for (int i = 0; i < MXFP8I_XSUM_WORDS; i++) dst->w[i] += t.w[i];
    xsum_carry(dst);
}

double mxfp8i_xsum_value(const mxfp8i_xsum *s) {
    mxfp8i_xsum t = *s;
    xsum_carry(&t);
    /* from the top digit down: a fixed sequence of FP64 operations on the exact digits */
    double v = 0.0;
    for (int i = MXFP8I_XSUM_WORDS - 1; i >= 0; i--) v += ldexp((double)t.w[i], 32 * i + XSUM_LSB);
    return v;
}

void mxfp8i_qstats_zero(mxfp8i_qstats *s) { memset(s, 0, sizeof *s); }

void mxfp8i_qstats_merge(mxfp8i_qstats *dst, const mxfp8i_qstats *src) {
    dst->elements += src->elements;
    dst->saturated += src->saturated;
    dst->flushed += src->flushed;
    dst->subnormal += src->subnormal;
    dst->nonfinite_groups += src->nonfinite_groups;
    dst->zero_groups += src->zero_groups;
    for (int i = 0; i < 256; i++) dst->hist[i] += src->hist[i];
    mxfp8i_xsum_merge(&dst->err, &src->err);
    mxfp8i_xsum_merge(&dst->sig, &src->sig);
}

void mxfp8i_qstats_export(const mxfp8i_qstats *s, mxfp8_quant_stats *out) {
    memset(out, 0, sizeof *out);
    out->elements = s->elements;
    out->saturated = s->saturated;
    out->flushed_to_zero = s->flushed;
    out->subnormal = s->subnormal;
    out->nonfinite_groups = s->nonfinite_groups;
    out->zero_groups = s->zero_groups;
    for (int i = 0; i < 256; i++) {
        out->scale_histogram[i] = s->hist[i];
        out->groups += s->hist[i];
    }
    out->sum_sq_error = mxfp8i_xsum_value(&s->err);
    out->sum_sq_signal = mxfp8i_xsum_value(&s->sig);
}

void mxfp8i_qstats_group(mxfp8i_qstats *s, const float *x, const uint8_t *codes, int n, uint8_t scale,
                         mxfp8_format fmt) {
    s->elements += n;
    s->hist[scale]++;
    if (scale == 255) {
        s->nonfinite_groups++;
        return;
    }
    const mxfp8i_fmt_info fi = mxfp8i_fmt(fmt);
    const int m = fmt == MXFP8_FMT_E5M2 ? 2 : 3;
    const float inv = ldexpf(1.0f, 127 - (int)scale);
    float te[32], ts[32];
    int nonzero = 0;
    for (int i = 0; i < 32; i++) {
        te[i] = ts[i] = 0.0f;
        if (i >= n) continue;
        const float y = fabsf(x[i] * inv), r = fabsf(mxfp8i_fp8_to_fp32(codes[i], fmt));
        const int mag = codes[i] & 0x7F;
        nonzero |= x[i] != 0.0f;
        if (y > fi.max_normal || fabsf(x[i]) > mxfp8i_elem_cap(fmt)) s->saturated++;
        if (x[i] != 0.0f && mag == 0) s->flushed++;
        if (mag != 0 && mag < (1 << m)) s->subnormal++;
        const float d = y - r;
        te[i] = d * d;
        ts[i] = y * y;
    }
    if (!nonzero) {
        s->zero_groups++;
        return;
    }
    mxfp8i_xsum_add(&s->err, mxfp8i_qstats_unscale(mxfp8i_qstats_tree(te), scale));
    mxfp8i_xsum_add(&s->sig, mxfp8i_qstats_unscale(mxfp8i_qstats_tree(ts), scale));
}

double mxfp8_quant_stats_sqnr_db(const mxfp8_quant_stats *stats) {
    if (!stats || !(stats->sum_sq_signal > 0.0)) return NAN;
    if (stats->sum_sq_error == 0.0) return INFINITY;
    return 10.0 * log10(stats->sum_sq_signal / stats->sum_sq_error);
}
