/*
 * codec.c -- scalar codecs: FP8 E4M3/E5M2, E8M0, BF16, FP16 <-> FP32, and the three MX scale rules.
 * This file is the executable specification: integer arithmetic on the FP32 bits, no floating-point log,
 * no detour through another format. [OCP §5.3, §5.4, §6.3], [NKI-Q]
 */
#include <math.h>

#include "../internal.h"

static inline uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static inline float f32_from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/*
 * Round |x| (FP32 bits `a`, finite, non-NaN, exponent field > 0) to a binary format with `m` mantissa bits and
 * minimum normal exponent `emin`, round to nearest, ties to even, and return the unsigned code assuming an
 * unbounded exponent: code = ((e + bias - 1) << m) + r, which carries a mantissa overflow into the exponent and
 * gives subnormal codes in the bottom binade (e = emin). Caller saturates.
 */
static inline int64_t round_to_code(uint32_t a, int m, int bias) {
    int emin = 1 - bias;
    int exp = (int)(a >> 23);
    if (exp == 0) return 0; /* FP32 zero/subnormal: below half the smallest FP8/FP16 subnormal */
    uint32_t sig = (a & 0x7FFFFFu) | 0x800000u; /* value = sig * 2^(exp - 150) */
    int e = exp - 127;
    if (e < emin) e = emin;
    int shift = (e - m) - (exp - 150); /* >= 23 - m > 0 */
    uint32_t r;
    if (shift >= 32) {
        r = 0; /* sig < 2^24 <= half ulp */
    } else {
        r = sig >> shift;
        uint32_t rem = sig & ((1u << shift) - 1u), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) r++;
    }
    return ((int64_t)(e + bias - 1) << m) + r;
}

uint8_t mxfp8_fp32_to_fp8(float x, mxfp8_format fmt) {
    uint32_t u = f32_bits(x), a = u & 0x7FFFFFFFu;
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    if ((unsigned)fmt > MXFP8_FMT_E5M2) return 0xFF; /* unknown format: a NaN code in both formats (no error channel) */
    if (fmt == MXFP8_FMT_E5M2) {
        if (a > 0x7F800000u) return sign | 0x7E;          /* NaN */
        if (a == 0x7F800000u) return sign | 0x7C;         /* +-Inf */
        int64_t c = round_to_code(a, 2, 15);
        if (c > 0x7B) c = 0x7B;                            /* saturate finite overflow to 57344 */
        return sign | (uint8_t)c;
    }
    if (a >= 0x7F800000u) return sign | 0x7F;              /* NaN or Inf: E4M3FN has no Inf -> NaN */
    int64_t c = round_to_code(a, 3, 7);
    if (c > 0x7E) c = 0x7E;                                /* saturate to 448 (0x7F is NaN) */
    return sign | (uint8_t)c;
}

float mxfp8_fp8_to_fp32(uint8_t code, mxfp8_format fmt) {
    if ((unsigned)fmt > MXFP8_FMT_E5M2) return NAN; /* unknown format (no error channel) */
    int m = fmt == MXFP8_FMT_E5M2 ? 2 : 3, bias = fmt == MXFP8_FMT_E5M2 ? 15 : 7;
    int e = (code & 0x7F) >> m, f = code & ((1 << m) - 1);
    float s = (code & 0x80) ? -1.0f : 1.0f;
    if (fmt == MXFP8_FMT_E4M3 && (code & 0x7F) == 0x7F) return copysignf(NAN, s); /* s * NAN drops the sign */
    if (fmt == MXFP8_FMT_E5M2 && e == 31) return f ? copysignf(NAN, s) : s * INFINITY;
    if (e == 0) return s * ldexpf((float)f, 1 - bias - m);
    return s * ldexpf((float)((1 << m) + f), e - bias - m);
}

float mxfp8_e8m0_to_fp32(uint8_t code) {
    if (code == 255) return NAN;
    return ldexpf(1.0f, (int)code - 127);
}

uint16_t mxfp8_fp32_to_bf16(float x) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN, sign kept */
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

float mxfp8_bf16_to_fp32(uint16_t bits) { return f32_from_bits((uint32_t)bits << 16); }

uint16_t mxfp8_fp32_to_fp16(float x) {
    uint32_t u = f32_bits(x), a = u & 0x7FFFFFFFu;
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (a > 0x7F800000u) return sign | 0x7E00u | (uint16_t)((a >> 13) & 0x3FFu);
    if (a == 0x7F800000u) return sign | 0x7C00u;
    int64_t c = round_to_code(a, 10, 15);
    if (c >= 0x7C00) c = 0x7C00; /* IEEE overflow -> Inf */
    return sign | (uint16_t)c;
}

float mxfp8_fp16_to_fp32(uint16_t h) {
    int e = (h >> 10) & 0x1F, f = h & 0x3FF;
    float s = (h & 0x8000) ? -1.0f : 1.0f;
    if (e == 31) return f ? copysignf(NAN, s) : s * INFINITY;
    if (e == 0) return s * ldexpf((float)f, -24);
    return s * ldexpf((float)(1024 + f), e - 25);
}

/* floor(log2(a)) and "mantissa > 1.75" for a positive finite FP32 bit pattern (normal or subnormal). */
static inline void log2_parts(uint32_t a, int *fl, uint32_t *frac23) {
    int exp = (int)(a >> 23);
    uint32_t man = a & 0x7FFFFFu;
    if (exp == 0) { /* subnormal: normalize */
        int lz = __builtin_clz(man) - 8; /* leading zeros within the 24-bit field */
        man = (man << (lz + 1)) & 0x7FFFFFu;
        exp = -lz;
    }
    *fl = exp - 127;
    *frac23 = man;
}

uint8_t mxfp8_scale_code(float amax, mxfp8_format fmt, mxfp8_scale_rule rule) {
    uint32_t a = f32_bits(amax) & 0x7FFFFFFFu;
    if (a >= 0x7F800000u) return 255;
    if ((unsigned)fmt > MXFP8_FMT_E5M2 || (unsigned)rule > MXFP8_SCALE_RCEIL) return 255; /* unknown: NaN scale */
    if (a == 0) return 0;
    int fl;
    uint32_t frac;
    log2_parts(a, &fl, &frac);
    int emax = mxfp8i_fmt(fmt).emax, e;
    switch (rule) {
    case MXFP8_SCALE_OCP: e = fl - emax; break;
    case MXFP8_SCALE_RCEIL:
        /* max_normal = 1.75 * 2^emax for both formats: amax / max_normal = (1.frac / 1.75) * 2^(fl - emax),
           whose ceil(log2) is fl - emax when 1.frac <= 1.75 and fl - emax + 1 otherwise. */
        e = fl - emax + (frac > 0x600000u ? 1 : 0);
        break;
    default: /* MXFP8_SCALE_NKI */ e = fl - (emax - 1); break;
    }
    if (e < -127) e = -127;
    if (e > 127) e = 127;
    return (uint8_t)(e + 127);
}
