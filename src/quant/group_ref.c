/*
 * group_ref.c -- the reference MX quantizer for one group of up to 32 values: the executable specification of
 * mxfp8_quantize, against which every SIMD path is tested bit for bit. [OCP §6.3], [NKI-Q]
 *
 *  amax over the n values (zero padding never enters); any NaN/Inf -> scale 255 and NaN codes (sign kept);
 *  amax == 0 -> scale 0 and elements RNE(x * 2^127) = signed zeros; else e = rule(amax), codes RNE(x * 2^-e)
 *  saturating. x * 2^-e is computed in FP32: a multiplication by an exact power of two (e in [-127, 127]) is exact
 *  except in FP32's subnormal range, which lies far below half the smallest FP8 subnormal, so no double rounding
 *  can change a code.
 */
#include <math.h>

#include "../internal.h"

static inline float pow2f(int e) { return ldexpf(1.0f, e); }

uint8_t mxfp8i_quantize_group_ref(const float *x, int n, mxfp8_format fmt, mxfp8_scale_rule rule, uint8_t *codes) {
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
    uint8_t s = mxfp8_scale_code(amax, fmt, rule);
    float inv = pow2f(127 - (int)s); /* 2^-e, e = s - 127 */
    for (int i = 0; i < n; i++) codes[i] = mxfp8_fp32_to_fp8(x[i] * inv, fmt);
    return s;
}

void mxfp8i_dequantize_group_ref(const uint8_t *codes, int n, uint8_t scale, mxfp8_format fmt, float *out) {
    if (scale == 255) {
        for (int i = 0; i < n; i++) out[i] = NAN;
        return;
    }
    float sc = mxfp8_e8m0_to_fp32(scale);
    for (int i = 0; i < n; i++) out[i] = mxfp8_fp8_to_fp32(codes[i], fmt) * sc;
}

uint8_t mxfp8i_qdq_group_ref(const float *x, int n, mxfp8_format fmt, mxfp8_scale_rule rule, float *out) {
    uint8_t codes[32];
    uint8_t s = mxfp8i_quantize_group_ref(x, n, fmt, rule, codes);
    mxfp8i_dequantize_group_ref(codes, n, s, fmt, out);
    return s;
}
