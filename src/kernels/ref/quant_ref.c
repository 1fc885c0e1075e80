/*
 * quant_ref.c -- the reference MX quantizer: one group of up to 32 values (the executable specification of
 * mxfp8_quantize, against which every SIMD path is tested bit for bit) and the reference quantize / dequantize
 * panels of src/kernels/qpanel.h (any strides, any geometry). [OCP §6.3], [NKI-Q]
 *
 *  amax over the n values (zero padding never enters); any NaN/Inf -> scale 255 and NaN codes (sign kept);
 *  amax == 0 -> scale 0 and elements RNE(x * 2^127) = signed zeros; else e = rule(amax), codes RNE(x * 2^-e)
 *  saturating; |x| is first clamped to mxfp8i_elem_cap (codec.h), so that at the top scale the nki and rceil rules
 *  reach (2^120 for E4M3, 2^113 for E5M2) no element rounds to a value whose product with the scale overflows FP32
 *  (it becomes 240 resp. 28672 and counts as saturated); every other code is unchanged. x * 2^-e is computed in FP32: a multiplication by an exact power of two (e in [-127, 127]) is exact
 *  except in FP32's subnormal range, which lies far below half the smallest FP8 subnormal, so no double rounding
 *  can change a code. Stochastic rounding (qpanel.h's sr) replaces RNE by mxfp8i_fp32_to_fp8_sr with each element's
 *  Philox word (src/format/philox.h); statistics go through mxfp8i_qstats_group (qstats.h).
 */
#include <math.h>

#include "../../format/codec.h"
#include "../../format/groups.h"
#include "../../format/philox.h"
#include "../../runtime/tensor.h"
#include "../act_rows.h"
#include "../expf.h"
#include "ref.h"

static inline float pow2f(int e) { return ldexpf(1.0f, e); }

uint8_t mxfp8i_quantize_group_ref(const float *x, int n, mxfp8_format fmt, mxfp8_scale_rule rule, uint8_t *codes) {
    return mxfp8i_quantize_group_sr(x, n, fmt, rule, NULL, codes);
}

uint8_t mxfp8i_quantize_group_sr(const float *x, int n, mxfp8_format fmt, mxfp8_scale_rule rule, const uint32_t *rnd,
                                 uint8_t *codes) {
    float amax = 0.0f;
    int nonfinite = 0;
    for (int i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (!(a <= 3.4028234663852886e38f)) nonfinite = 1; /* NaN or Inf */
        else if (a > amax) amax = a;
    }
    if (nonfinite) {
        uint8_t nan = mxfp8i_fmt(fmt).nan_code;
        for (int i = 0; i < n; i++) codes[i] = (uint8_t)(nan | (signbit(x[i]) ? 0x80 : 0));
        return 255;
    }
    uint8_t s = mxfp8i_scale_code(amax, fmt, rule);
    float inv = pow2f(127 - (int)s); /* 2^-e, e = s - 127 */
    if (rnd)
        for (int i = 0; i < n; i++) codes[i] = mxfp8i_fp32_to_fp8_sr(mxfp8i_clamp_elem(x[i], fmt) * inv, fmt, rnd[i]);
    else
        for (int i = 0; i < n; i++) codes[i] = mxfp8i_fp32_to_fp8(mxfp8i_clamp_elem(x[i], fmt) * inv, fmt);
    return s;
}

void mxfp8i_dequantize_group_ref(const uint8_t *codes, int n, uint8_t scale, mxfp8_format fmt, float *out) {
    if (scale == 255) {
        for (int i = 0; i < n; i++) out[i] = NAN;
        return;
    }
    float sc = mxfp8i_e8m0_to_fp32(scale);
    for (int i = 0; i < n; i++) out[i] = mxfp8i_fp8_to_fp32(codes[i], fmt) * sc;
}

uint8_t mxfp8i_qdq_group_ref(const float *x, int n, mxfp8_format fmt, mxfp8_scale_rule rule, float *out) {
    uint8_t codes[32];
    uint8_t s = mxfp8i_quantize_group_ref(x, n, fmt, rule, codes);
    mxfp8i_dequantize_group_ref(codes, n, s, fmt, out);
    return s;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Reference panels (any strides)                                                                             */
/* ---------------------------------------------------------------------------------------------------------- */
static inline int64_t store_value(void *out, mxfp8_dtype dt, int64_t off, float v) {
    switch (dt) {
    case MXFP8_DTYPE_F32: ((float *)out)[off] = v; return 0;
    case MXFP8_DTYPE_BF16: {
        uint16_t b = mxfp8i_fp32_to_bf16(v);
        ((uint16_t *)out)[off] = b;
        return (v == v && mxfp8i_bf16_to_fp32(b) != v) ? 1 : 0;
    }
    case MXFP8_DTYPE_F16: {
        uint16_t h = mxfp8i_fp32_to_fp16(v);
        ((uint16_t *)out)[off] = h;
        return (v == v && mxfp8i_fp16_to_fp32(h) != v) ? 1 : 0;
    }
    default: return 0;
    }
}

int64_t mxfp8i_quantize_line_group_ref(const mxfp8i_qpanel *p, int64_t l, int64_t g) {
    int64_t idx[32], inexact = 0;
    float x[32], v[32];
    uint8_t c[32];
    uint32_t rnd[32];
    int n = mxfp8i_group_members(p->K, p->group, g, idx);
    for (int i = 0; i < n; i++) x[i] = mxfp8i_load_f32(p->src, p->src_dtype, l * p->src_ls + idx[i] * p->src_ks);
    if (p->sr.on)
        for (int i = 0; i < n; i++)
            rnd[i] = mxfp8i_sr_word(p->sr.seed, p->sr.stream, p->sr.idx0 + l * p->sr.i_ls + idx[i] * p->sr.i_ks);
    uint8_t s = mxfp8i_quantize_group_sr(x, n, p->fmt, p->rule, p->sr.on ? rnd : NULL, c);
    if (p->stats) mxfp8i_qstats_group(p->stats, x, c, n, s, p->fmt);
    if (p->scales) p->scales[l * p->sc_ls + g * p->sc_gs] = s;
    if (!mxfp8i_is_float_dtype(p->out_dtype)) {
        uint8_t *o = (uint8_t *)p->out;
        for (int i = 0; i < n; i++) o[l * p->out_ls + idx[i] * p->out_ks] = c[i];
        return 0;
    }
    mxfp8i_dequantize_group_ref(c, n, s, p->fmt, v);
    for (int i = 0; i < n; i++) inexact += store_value(p->out, p->out_dtype, l * p->out_ls + idx[i] * p->out_ks, v[i]);
    return inexact;
}

int64_t mxfp8i_quantize_panel__ref(const mxfp8i_qpanel *p) {
    int64_t G = mxfp8i_ceil_div(p->K, 32), inexact = 0;
    for (int64_t l = 0; l < p->lines; l++)
        for (int64_t g = 0; g < G; g++) inexact += mxfp8i_quantize_line_group_ref(p, l, g);
    return inexact;
}

int64_t mxfp8i_dequantize_panel__ref(const mxfp8i_dqpanel *p) {
    int64_t G = mxfp8i_ceil_div(p->K, 32), inexact = 0, idx[32];
    float v[32];
    uint8_t c[32];
    for (int64_t l = 0; l < p->lines; l++) {
        for (int64_t g = 0; g < G; g++) {
            int n = mxfp8i_group_members(p->K, p->group, g, idx);
            for (int i = 0; i < n; i++) c[i] = p->codes[l * p->codes_ls + idx[i] * p->codes_ks];
            mxfp8i_dequantize_group_ref(c, n, p->scales[l * p->sc_ls + g * p->sc_gs], p->fmt, v);
            for (int i = 0; i < n; i++)
                inexact += store_value(p->out, p->out_dtype, l * p->out_ls + idx[i] * p->out_ks, v[i]);
        }
    }
    return inexact;
}

void mxfp8i_to_bf16__ref(const float *src, int64_t ld_src, uint16_t *dst, int64_t ld_dst, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < n; j++) dst[r * ld_dst + j] = mxfp8i_fp32_to_bf16(src[r * ld_src + j]);
}

void mxfp8i_bf16_t__ref(const uint16_t *src, int64_t ld_src, float *dst, int64_t ld_dst, int64_t rows, int64_t cols) {
    for (int64_t c = 0; c < cols; c++)
        for (int64_t r = 0; r < rows; r++) dst[c * ld_dst + r] = mxfp8i_bf16_to_fp32(src[r * ld_src + c]);
}

void mxfp8i_f32_t__ref(const float *src, int64_t ld_src, float *dst, int64_t ld_dst, int64_t rows, int64_t cols,
                       int stream) {
    (void)stream; /* plain stores */
    for (int64_t c = 0; c < cols; c++)
        for (int64_t r = 0; r < rows; r++) dst[c * ld_dst + r] = src[r * ld_src + c];
}

void mxfp8i_add_f32__ref(const float *src, int64_t ld_src, float *dst, int64_t ld_dst, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < n; j++) dst[r * ld_dst + j] = dst[r * ld_dst + j] + src[r * ld_src + j];
}

static void copy_f32__ref(const float *src, int64_t ld_src, float *dst, int64_t ld_dst, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < n; j++) dst[r * ld_dst + j] = src[r * ld_src + j];
}

void mxfp8i_exp_f32__ref(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = mxfp8i_expf1(x[i]);
}

/* The MoE's elementwise rows (act_rows.h) compiled for the baseline ISA. */
static void act_fwd__ref(const mxfp8i_act_params *ap, int64_t I, const float *gu, const float *b1, float *g, float *u,
                         float *act, int act_given, float *inter, int inter_given, float *S, float aq, float *sg) {
    mxfp8i_act_fwd_impl(mxfp8i_exp_f32__ref, ap, I, gu, b1, g, u, act, act_given, inter, inter_given, S, aq, sg);
}
static void act_bwd__ref(const mxfp8i_act_params *ap, int64_t I, const float *dI, float aq, int scale, const float *g,
                         const float *u, const float *act, const float *sg, float *dgu) {
    mxfp8i_act_bwd_impl(mxfp8i_exp_f32__ref, ap, I, dI, aq, scale, g, u, act, sg, dgu);
}

void mxfp8i_dot_f64__ref(const float *x, int64_t ldx, const float *y, int64_t ldy, int64_t n, int64_t rows,
                         double *out) {
    for (int64_t r = 0; r < rows; r++) {
        double s = out[r];
        for (int64_t i = 0; i < n; i++) s += (double)x[r * ldx + i] * (double)y[r * ldy + i];
        out[r] = s;
    }
}

const mxfp8i_qkernel mxfp8i_mx_quant__ref = {"mx_quant_panel__ref", "scalar", 0, 0, mxfp8i_quantize_panel__ref,
                                             mxfp8i_dequantize_panel__ref, mxfp8i_to_bf16__ref, mxfp8i_bf16_t__ref,
                                             mxfp8i_f32_t__ref, mxfp8i_add_f32__ref, copy_f32__ref,
                                             mxfp8i_exp_f32__ref, act_fwd__ref, act_bwd__ref,
                                             mxfp8i_dot_f64__ref};
