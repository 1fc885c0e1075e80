/*
 * codec.h -- the scalar codecs as static inline functions: FP8 E4M3/E5M2, E8M0, BF16, FP16 <-> FP32, and the three
 * MX scale rules. This is the executable specification every kernel is checked against, and the one copy of each
 * conversion the hot loops use (the public mxfp8_* codec functions in codec.c wrap these).
 *
 * Integer arithmetic on the FP32 bits, no floating-point log, no detour through another format.
 * [OCP] OCP Microscaling Formats v1.0, sections 5.3 (FP8), 5.4.1 (E8M0), 6.3 (conversion); [NKI-Q] the Trainium
 * quantize_mx scale rule. Semantics of each function: include/mxfp8.h, "Scalar codecs".
 */
#ifndef MXFP8_FORMAT_CODEC_H
#define MXFP8_FORMAT_CODEC_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "mxfp8.h"

/** Format constants [OCP §5.3.2]. */
typedef struct mxfp8i_fmt_info {
    int emax;            /**< exponent of the largest normal: 8 (E4M3), 15 (E5M2) */
    float max_normal;    /**< 448, 57344 */
    uint8_t nan_code;    /**< positive canonical NaN: 0x7F, 0x7E */
} mxfp8i_fmt_info;
static inline mxfp8i_fmt_info mxfp8i_fmt(mxfp8_format f) {
    mxfp8i_fmt_info e4 = {8, 448.0f, 0x7F}, e5 = {15, 57344.0f, 0x7E};
    return f == MXFP8_FMT_E5M2 ? e5 : e4;
}
/** The largest |x| an element may carry into the conversion so that its decoded value stays finite in FP32:
 *  240 * 2^120 (E4M3) and 28672 * 2^113 = 1.75 * 2^127 (E5M2), the largest FP8 value v with v * 2^e <= FLT_MAX at
 *  the top scale e the nki and rceil rules reach (E8M0 247 resp. 240). Clamping |x| to it before scaling changes
 *  only elements of groups at that scale (|x| >= about 3.3e38); at every lower scale it lies above max normal * 2^e,
 *  where the element saturates anyway. The MX value X = S * P [OCP §6.3] must be representable by its FP32
 *  consumers: without the clamp such an element rounds to 2^(emax+1) (valid FP8 at 256 resp. 2^15 only as the next
 *  binade) and S * P = 2^128 = inf. */
static inline float mxfp8i_elem_cap(mxfp8_format f) {
    return f == MXFP8_FMT_E5M2 ? 0x1.cp127f /* 1.75 * 2^127 */ : 0x1.ep127f /* 1.875 * 2^127 = 240 * 2^120 */;
}
/** x with its magnitude clamped to mxfp8i_elem_cap (sign kept; NaN passes through). */
static inline float mxfp8i_clamp_elem(float x, mxfp8_format f) {
    const float c = mxfp8i_elem_cap(f);
    return x > c ? c : x < -c ? -c : x;
}
static inline mxfp8_dtype mxfp8i_fmt_dtype(mxfp8_format f) {
    return f == MXFP8_FMT_E5M2 ? MXFP8_DTYPE_E5M2 : MXFP8_DTYPE_E4M3;
}

static inline uint32_t mxfp8i_f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static inline float mxfp8i_f32_from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/*
 * Round |x| (FP32 bits `a`, finite, non-NaN) to a binary format with `m` mantissa bits and exponent bias `bias`,
 * round to nearest, ties to even, and return the unsigned code assuming an unbounded exponent:
 * code = ((e + bias - 1) << m) + r, which carries a mantissa overflow into the exponent and gives subnormal codes in
 * the bottom binade (e = 1 - bias). The caller saturates.
 */
static inline int64_t mxfp8i_round_to_code(uint32_t a, int m, int bias) {
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

/** FP32 -> FP8 code: RNE, saturating finite overflow, NaN -> canonical NaN (sign kept), Inf -> NaN (E4M3) or Inf
 *  (E5M2); an unknown format gives 0xFF. [OCP §5.3, §6.3] */
static inline uint8_t mxfp8i_fp32_to_fp8(float x, mxfp8_format fmt) {
    uint32_t u = mxfp8i_f32_bits(x), a = u & 0x7FFFFFFFu;
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    if ((unsigned)fmt > MXFP8_FMT_E5M2) return 0xFF; /* unknown format: a NaN code in both formats */
    if (fmt == MXFP8_FMT_E5M2) {
        if (a > 0x7F800000u) return sign | 0x7E;  /* NaN */
        if (a == 0x7F800000u) return sign | 0x7C; /* +-Inf */
        int64_t c = mxfp8i_round_to_code(a, 2, 15);
        if (c > 0x7B) c = 0x7B; /* saturate finite overflow to 57344 */
        return sign | (uint8_t)c;
    }
    if (a >= 0x7F800000u) return sign | 0x7F; /* NaN or Inf: E4M3FN has no Inf -> NaN */
    int64_t c = mxfp8i_round_to_code(a, 3, 7);
    if (c > 0x7E) c = 0x7E; /* saturate to 448 (0x7F is NaN) */
    return sign | (uint8_t)c;
}

/*
 * Stochastic rounding of |x| (FP32 bits `a`, finite) to the grid of mxfp8i_round_to_code with the 32-bit random
 * word `rnd`: with ulp the grid spacing at max(exponent of |x|, emin), lo = floor(|x| / ulp) and the fraction
 * f = |x| / ulp - lo in [0, 1), the code is lo's plus one iff rnd < floor(f * 2^32) (so it rounds up with probability
 * floor(f * 2^32) / 2^32, within 2^-32 of f; a value on the grid never moves). FP32 subnormals take part exactly.
 * Unsaturated, as mxfp8i_round_to_code.
 */
static inline int64_t mxfp8i_round_to_code_sr(uint32_t a, int m, int bias, uint32_t rnd) {
    int emin = 1 - bias;
    int exp = (int)(a >> 23);
    uint32_t sig = (a & 0x7FFFFFu) | (exp ? 0x800000u : 0u); /* value = sig * 2^(max(exp, 1) - 150) */
    if (exp == 0) exp = 1;
    int e = exp - 127;
    if (e < emin) e = emin;
    int shift = (e - m) - (exp - 150); /* >= 23 - m > 0: the bits of sig below the grid */
    uint32_t r = shift >= 32 ? 0u : sig >> shift;
    uint64_t rem = shift >= 32 ? sig : sig & ((1u << shift) - 1u);
    uint32_t f32 = shift <= 32        ? (uint32_t)(rem << (32 - shift))
                   : shift - 32 >= 24 ? 0u
                                      : (uint32_t)(rem >> (shift - 32));
    return ((int64_t)(e + bias - 1) << m) + r + (rnd < f32 ? 1 : 0);
}

/** FP32 -> FP8 code with stochastic rounding by the random word `rnd` (mxfp8i_round_to_code_sr), saturating finite
 *  values to max normal; NaN and Inf as mxfp8i_fp32_to_fp8. */
static inline uint8_t mxfp8i_fp32_to_fp8_sr(float x, mxfp8_format fmt, uint32_t rnd) {
    uint32_t u = mxfp8i_f32_bits(x), a = u & 0x7FFFFFFFu;
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    if ((unsigned)fmt > MXFP8_FMT_E5M2) return 0xFF;
    if (fmt == MXFP8_FMT_E5M2) {
        if (a > 0x7F800000u) return sign | 0x7E;
        if (a == 0x7F800000u) return sign | 0x7C;
        int64_t c = mxfp8i_round_to_code_sr(a, 2, 15, rnd);
        return sign | (uint8_t)(c > 0x7B ? 0x7B : c);
    }
    if (a >= 0x7F800000u) return sign | 0x7F;
    int64_t c = mxfp8i_round_to_code_sr(a, 3, 7, rnd);
    return sign | (uint8_t)(c > 0x7E ? 0x7E : c);
}

/** FP8 code -> FP32, exact [OCP §5.3.2]. An unknown format gives NaN. */
static inline float mxfp8i_fp8_to_fp32(uint8_t code, mxfp8_format fmt) {
    if ((unsigned)fmt > MXFP8_FMT_E5M2) return NAN;
    int m = fmt == MXFP8_FMT_E5M2 ? 2 : 3, bias = fmt == MXFP8_FMT_E5M2 ? 15 : 7;
    int e = (code & 0x7F) >> m, f = code & ((1 << m) - 1);
    float s = (code & 0x80) ? -1.0f : 1.0f;
    if (fmt == MXFP8_FMT_E4M3 && (code & 0x7F) == 0x7F) return copysignf(NAN, s); /* s * NAN drops the sign */
    if (fmt == MXFP8_FMT_E5M2 && e == 31) return f ? copysignf(NAN, s) : s * INFINITY;
    if (e == 0) return s * ldexpf((float)f, 1 - bias - m);
    return s * ldexpf((float)((1 << m) + f), e - bias - m);
}

/** E8M0 code -> 2^(code - 127) (2^-127 is an FP32 subnormal, exact); 255 -> NaN [OCP §5.4.1]. */
static inline float mxfp8i_e8m0_to_fp32(uint8_t code) {
    if (code == 255) return NAN;
    return ldexpf(1.0f, (int)code - 127);
}

/** FP32 -> BF16 bits, RNE; NaN stays NaN (quieted, sign kept). */
static inline uint16_t mxfp8i_fp32_to_bf16(float x) {
    uint32_t u = mxfp8i_f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
/** BF16 bits -> FP32, exact. */
static inline float mxfp8i_bf16_to_fp32(uint16_t bits) { return mxfp8i_f32_from_bits((uint32_t)bits << 16); }

/** FP32 -> IEEE FP16 bits, RNE, overflow -> Inf, NaN payload kept (quieted). */
static inline uint16_t mxfp8i_fp32_to_fp16(float x) {
    uint32_t u = mxfp8i_f32_bits(x), a = u & 0x7FFFFFFFu;
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (a > 0x7F800000u) return sign | 0x7E00u | (uint16_t)((a >> 13) & 0x3FFu);
    if (a == 0x7F800000u) return sign | 0x7C00u;
    int64_t c = mxfp8i_round_to_code(a, 10, 15);
    if (c >= 0x7C00) c = 0x7C00; /* IEEE overflow -> Inf */
    return sign | (uint16_t)c;
}
/** FP16 bits -> FP32, exact. */
static inline float mxfp8i_fp16_to_fp32(uint16_t h) {
    int e = (h >> 10) & 0x1F, f = h & 0x3FF;
    float s = (h & 0x8000) ? -1.0f : 1.0f;
    if (e == 31) return f ? copysignf(NAN, s) : s * INFINITY;
    if (e == 0) return s * ldexpf((float)f, -24);
    return s * ldexpf((float)(1024 + f), e - 25);
}

/** The E8M0 code of a group of amax `amax` under `rule` [OCP §6.3], [NKI-Q]: 0 for amax == 0, 255 for a
 *  non-finite amax or an unknown format/rule; else e + 127 with e clamped to [-127, 127], where e is
 *  floor(log2 amax) - emax (OCP), floor(log2 amax) - (emax - 1) (NKI) or ceil(log2(amax / max_normal)) (RCEIL),
 *  read exactly from the FP32 bits. */
static inline uint8_t mxfp8i_scale_code(float amax, mxfp8_format fmt, mxfp8_scale_rule rule) {
    uint32_t a = mxfp8i_f32_bits(amax) & 0x7FFFFFFFu;
    if (a >= 0x7F800000u) return 255;
    if ((unsigned)fmt > MXFP8_FMT_E5M2 || (unsigned)rule > MXFP8_SCALE_RCEIL) return 255;
    if (a == 0) return 0;
    int exp = (int)(a >> 23);
    uint32_t frac = a & 0x7FFFFFu;
    if (exp == 0) { /* subnormal: normalize */
        int lz = __builtin_clz(frac) - 8; /* leading zeros within the 24-bit field */
        frac = (frac << (lz + 1)) & 0x7FFFFFu;
        exp = -lz;
    }
    int fl = exp - 127, emax = mxfp8i_fmt(fmt).emax, e;
    switch (rule) {
    case MXFP8_SCALE_OCP: e = fl - emax; break;
    case MXFP8_SCALE_RCEIL:
        /* max_normal = 1.75 * 2^emax for both formats: amax / max_normal = (1.frac / 1.75) * 2^(fl - emax), whose
           ceil(log2) is fl - emax when 1.frac <= 1.75 and fl - emax + 1 otherwise. */
        e = fl - emax + (frac > 0x600000u ? 1 : 0);
        break;
    default: /* MXFP8_SCALE_NKI */ e = fl - (emax - 1); break;
    }
    if (e < -127) e = -127;
    if (e > 127) e = 127;
    return (uint8_t)(e + 127);
}

#endif /* MXFP8_FORMAT_CODEC_H */
