/*
 * quant_lanes_avx512.h -- the AVX-512 MX quantization primitives in vector lanes, and the entry points of the
 * specialized panel bodies: shared by quant_avx512.c (FP32 lanes: every source dtype and output, dequantization,
 * the dispatch), quant_avx512_bf16.c (BF16 -> codes in 16-bit lanes) and quant_avx512_x.c (stochastic rounding,
 * statistics). Per-format constants, scale codes from amax bits, the magic-addition RNE, loads in "unpack order",
 * stores with BF16/F16 inexactness counts, the element-wise reference fallback, the FP32 row and column-chunk
 * bodies. Internal to src/kernels/avx512/ (static inline, always inlined into each specialized instance); the
 * contract and the exactness argument are in quant_avx512.c's file comment.
 */
#ifndef MXFP8_KERNELS_AVX512_QUANT_LANES_AVX512_H
#define MXFP8_KERNELS_AVX512_QUANT_LANES_AVX512_H

#include <math.h>

#include "../../format/codec.h"
#include "../../format/groups.h"
#include "../../runtime/tensor.h"
#include "avx512.h"

#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

enum { OUT_CODES = 0, OUT_F32 = 1, OUT_BF16 = 2, OUT_F16 = 3 };

static inline int out_kind(mxfp8_dtype dt) {
    switch (dt) {
    case MXFP8_DTYPE_F32: return OUT_F32;
    case MXFP8_DTYPE_BF16: return OUT_BF16;
    case MXFP8_DTYPE_F16: return OUT_F16;
    default: return OUT_CODES;
    }
}
static inline int out_size(int ok) { return ok == OUT_CODES ? 1 : ok == OUT_F32 ? 4 : 2; }

AI __m512i set1(uint32_t v) { return _mm512_set1_epi32((int)v); }
AI __m512 set1f_bits(uint32_t v) { return _mm512_castsi512_ps(_mm512_set1_epi32((int)v)); }
AI __mmask32 tail_mask(int64_t n) { return n >= 32 ? 0xFFFFFFFFu : (((__mmask32)1 << n) - 1); }

/* ---- per-format constants ---- */
AI uint32_t f_maxn(int fmt) { return fmt == MXFP8_FMT_E5M2 ? 0x47600000u : 0x43E00000u; } /* 57344, 448 */
AI uint32_t f_nan(int fmt) { return fmt == MXFP8_FMT_E5M2 ? 0x7Eu : 0x7Fu; }

/* E8M0 codes from amax bits: clamp(expfield - d (+1 for rceil when the fraction > 0.75), 0, 254); 255 when
 * amax is NaN/Inf. d = emax-1 (nki) or emax (ocp, rceil). */
AI __m512i scale_codes(__m512i ab, int d, __m512i rceil_mask) {
    __m512i s = _mm512_sub_epi32(_mm512_srli_epi32(ab, 23), _mm512_set1_epi32(d));
    __mmask16 up = _mm512_cmpgt_epu32_mask(_mm512_and_si512(ab, rceil_mask), set1(0x600000u));
    s = _mm512_mask_add_epi32(s, up, s, set1(1));
    s = _mm512_max_epi32(s, _mm512_setzero_si512());
    s = _mm512_min_epi32(s, set1(254));
    __mmask16 nf = _mm512_cmpge_epu32_mask(ab, set1(0x7F800000u));
    return _mm512_mask_mov_epi32(s, nf, set1(255));
}
/* 2^-e = 2^(127-s) (s <= 247 for any finite amax, so this is a normal float). */
AI __m512 inv_scale(__m512i s) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(set1(254), s), 23)); }
/* 2^(s-127) as mxfp8_e8m0_to_fp32 gives it (s = 0: the FP32 subnormal 2^-127). */
AI __m512 scale_value(__m512i s) {
    __mmask16 z = _mm512_cmpeq_epi32_mask(s, _mm512_setzero_si512());
    return _mm512_castsi512_ps(_mm512_mask_mov_epi32(_mm512_slli_epi32(s, 23), z, set1(0x00400000u)));
}

/* Decode 16 FP8 codes (int32 lanes) to FP32 exactly, as mxfp8_fp8_to_fp32 (NaN codes: quiet NaN, sign kept). */
AI __m512 decode16(__m512i c, int fmt) {
    __m512i m = _mm512_and_si512(c, set1(0x7F));
    __m512i v;
    if (fmt == MXFP8_FMT_E5M2) {
        __m512i t = _mm512_slli_epi32(m, 21);
        v = _mm512_add_epi32(t, set1(112u << 23));
        __m512 sub = _mm512_sub_ps(_mm512_castsi512_ps(_mm512_add_epi32(t, set1(113u << 23))), set1f_bits(0x38800000u));
        v = _mm512_mask_mov_epi32(v, _mm512_cmplt_epi32_mask(m, set1(4)), _mm512_castps_si512(sub));
        v = _mm512_mask_mov_epi32(v, _mm512_cmpeq_epi32_mask(m, set1(0x7C)), set1(0x7F800000u));
        v = _mm512_mask_mov_epi32(v, _mm512_cmpgt_epi32_mask(m, set1(0x7C)), set1(0x7FC00000u));
    } else {
        __m512i t = _mm512_slli_epi32(m, 20);
        v = _mm512_add_epi32(t, set1(120u << 23));
        __m512 sub = _mm512_sub_ps(_mm512_castsi512_ps(_mm512_add_epi32(t, set1(121u << 23))), set1f_bits(0x3C800000u));
        v = _mm512_mask_mov_epi32(v, _mm512_cmplt_epi32_mask(m, set1(8)), _mm512_castps_si512(sub));
        v = _mm512_mask_mov_epi32(v, _mm512_cmpeq_epi32_mask(m, set1(0x7F)), set1(0x7FC00000u));
    }
    v = _mm512_or_si512(v, _mm512_slli_epi32(_mm512_and_si512(c, set1(0x80)), 24));
    return _mm512_castsi512_ps(v);
}

AI __m256i bf16_of(__m512 v, __mmask16 *inexact) {
    __m512i u = _mm512_castps_si512(v);
    __m512i r =
        _mm512_add_epi32(_mm512_add_epi32(u, set1(0x7FFF)), _mm512_and_si512(_mm512_srli_epi32(u, 16), set1(1)));
    r = _mm512_srli_epi32(r, 16);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), set1(0x40)));
    *inexact = _mm512_mask_cmpneq_epi32_mask((__mmask16)~nan, _mm512_slli_epi32(r, 16), u);
    return _mm512_cvtepi32_epi16(r);
}
AI __m256i f16_of(__m512 v, __mmask16 *inexact) {
    __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    *inexact = _mm512_cmp_ps_mask(_mm512_cvtph_ps(h), v, _CMP_NEQ_OQ);
    return h;
}
AI int64_t store_vals(void *p, int ok, __m512 lo, __m512 hi, __mmask32 m, bool full) {
    if (ok == OUT_F32) {
        float *f = (float *)p;
        if (full) {
            _mm512_storeu_ps(f, lo);
            _mm512_storeu_ps(f + 16, hi);
        } else {
            _mm512_mask_storeu_ps(f, (__mmask16)m, lo);
            _mm512_mask_storeu_ps(f + 16, (__mmask16)(m >> 16), hi);
        }
        return 0;
    }
    __mmask16 ia, ib;
    __m256i a = ok == OUT_BF16 ? bf16_of(lo, &ia) : f16_of(lo, &ia);
    __m256i b = ok == OUT_BF16 ? bf16_of(hi, &ib) : f16_of(hi, &ib);
    __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
    uint32_t inx = ((uint32_t)ia | ((uint32_t)ib << 16)) & m;
    if (full)
        _mm512_storeu_si512(p, w);
    else
        _mm512_mask_storeu_epi16(p, m, w);
    return __builtin_popcount(inx);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Quantize                                                                                                   */
/* ---------------------------------------------------------------------------------------------------------- */
/* A "block" is 32 consecutive source values held as two F32 vectors (lo, hi) of MAGNITUDES plus a 32-bit sign mask
 * (natural order). F32 and F16 sources use the natural order (lo = elements 0..15); BF16 uses the in-lane unpack
 * order (lo lane 4c+L = element 8c+L, hi lane 4c+L = element 8c+4+L), in which BF16 -> F32 is one unpack and
 * 32-bit codes pack back to natural-order bytes with one packus + one vpmovwb. */
AI bool unpack_order(int dt) { return dt == MXFP8_DTYPE_BF16; }

AI void load_abs32(const void *p, int dt, __mmask32 m, bool full, __m512 *lo, __m512 *hi, __mmask32 *sign) {
    if (dt == MXFP8_DTYPE_F32) {
        const float *f = (const float *)p;
        __m512i a = full ? _mm512_loadu_si512(f) : _mm512_maskz_loadu_epi32((__mmask16)m, f);
        __m512i b = full ? _mm512_loadu_si512(f + 16) : _mm512_maskz_loadu_epi32((__mmask16)(m >> 16), f + 16);
        __m512i z = _mm512_setzero_si512();
        *sign = (__mmask32)_mm512_cmplt_epi32_mask(a, z) | ((__mmask32)_mm512_cmplt_epi32_mask(b, z) << 16);
        *lo = _mm512_castsi512_ps(_mm512_and_si512(a, set1(0x7FFFFFFFu)));
        *hi = _mm512_castsi512_ps(_mm512_and_si512(b, set1(0x7FFFFFFFu)));
        return;
    }
    __m512i v = full ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(m, p);
    *sign = _mm512_movepi16_mask(v);
    __m512i a = _mm512_and_si512(v, _mm512_set1_epi16(0x7FFF));
    if (dt == MXFP8_DTYPE_BF16) {
        *lo = _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), a));
        *hi = _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), a));
    } else {
        *lo = _mm512_cvtph_ps(_mm512_castsi512_si256(a));
        *hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(a, 1));
    }
}

/* 32-bit lanes (values < 65536) of a block -> 32 natural-order bytes. */
AI __m256i pack_bytes(__m512i lo, __m512i hi, int dt) {
    if (unpack_order(dt)) return _mm512_cvtepi16_epi8(_mm512_packus_epi32(lo, hi));
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtepi32_epi8(lo)), _mm512_cvtepi32_epi8(hi), 1);
}

/* RNE of |y| (finite, >= 0, saturated to max normal) to the FP8 grid. With E = max(exponent of |y|, emin),
 * C = 2^(E + 23 - m) has ulp 2^(E - m), the FP8 spacing at E (normal and subnormal alike), so the FPU's |y| + C
 * rounds |y| to nearest-even on that grid: (|y| + C) - C is the rounded value, and bits(|y| + C) - bits(C) its
 * index in the binade, giving code = that + ((E - emin) << m). */
AI __m512i rne_magic(__m512 a, int fmt) {
    const uint32_t emin_bits = fmt == MXFP8_FMT_E5M2 ? (113u << 23) : (121u << 23);
    const uint32_t madd = (fmt == MXFP8_FMT_E5M2 ? 21u : 20u) << 23;
    __m512i eb = _mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(a), set1(0x7F800000u)), set1(emin_bits));
    return _mm512_add_epi32(eb, set1(madd));
}
AI __m512i fp8_code(__m512 a, int fmt) {
    const int sh = fmt == MXFP8_FMT_E5M2 ? 21 : 20;                       /* 23 - m */
    const uint32_t k = fmt == MXFP8_FMT_E5M2 ? (134u << 2) : (141u << 3); /* (23 - m + emin + 127) << m */
    __m512i C = rne_magic(a, fmt);
    __m512i sum = _mm512_castps_si512(_mm512_add_ps(a, _mm512_castsi512_ps(C)));
    __m512i t = _mm512_sub_epi32(_mm512_srli_epi32(C, sh), C);
    return _mm512_sub_epi32(_mm512_add_epi32(sum, t), set1(k));
}
AI __m512 fp8_round(__m512 a, int fmt) {
    __m512 C = _mm512_castsi512_ps(rne_magic(a, fmt));
    return _mm512_sub_ps(_mm512_add_ps(a, C), C);
}

/* 16 amax bit vectors -> one vector whose lane j is the max of m[j] (a transposing reduction tree). */
AI __m512i reduce16(const __m512i *m) {
    __m512i v[8], w[4], z[2];
    for (int i = 0; i < 8; i++)
        v[i] = _mm512_max_epu32(_mm512_shuffle_i64x2(m[2 * i], m[2 * i + 1], 0x44),
                                _mm512_shuffle_i64x2(m[2 * i], m[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++)
        w[i] = _mm512_max_epu32(_mm512_shuffle_i64x2(v[2 * i], v[2 * i + 1], 0x88),
                                _mm512_shuffle_i64x2(v[2 * i], v[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++)
        z[i] = _mm512_max_epu32(_mm512_unpacklo_epi64(w[2 * i], w[2 * i + 1]),
                                _mm512_unpackhi_epi64(w[2 * i], w[2 * i + 1]));
    __m512 a = _mm512_castsi512_ps(z[0]), b = _mm512_castsi512_ps(z[1]);
    __m512i f = _mm512_max_epu32(_mm512_castps_si512(_mm512_shuffle_ps(a, b, 0x88)),
                                 _mm512_castps_si512(_mm512_shuffle_ps(a, b, 0xDD)));
    return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), f);
}
/* Max over all lanes, broadcast. */
AI __m512i hmax(__m512i ab) {
    ab = _mm512_max_epu32(ab, _mm512_shuffle_i32x4(ab, ab, 0x4E));
    ab = _mm512_max_epu32(ab, _mm512_shuffle_i32x4(ab, ab, 0xB1));
    ab = _mm512_max_epu32(ab, _mm512_shuffle_epi32(ab, (_MM_PERM_ENUM)0x4E));
    return _mm512_max_epu32(ab, _mm512_shuffle_epi32(ab, (_MM_PERM_ENUM)0xB1));
}

/* One source element as float through the out-of-line public codecs: ref_elems must stay a scalar loop (GCC 12
 * fails with an internal compiler error when it vectorizes it with the inline codecs in this AVX-512 file). */
static float load_elem(const char *src, int dt, int i) {
    switch (dt) {
    case MXFP8_DTYPE_F32: return ((const float *)src)[i];
    case MXFP8_DTYPE_BF16: return mxfp8_bf16_to_fp32(((const uint16_t *)src)[i]);
    default: return mxfp8_fp16_to_fp32(((const uint16_t *)src)[i]);
    }
}

/* Element-wise reference arithmetic (mxfp8i_quantize_group_ref + mxfp8i_dequantize_group_ref for one element whose
 * group has scale code s[i*ss]): the rare-case fallback (NaN groups in qdq, BF16-subnormal results). */
static int64_t ref_elems(const char *src, int dt, int n, const uint8_t *s, int ss, int fmt, int ok, char *out) {
    int64_t inexact = 0;
    uint8_t nan = f_nan(fmt);
    for (int i = 0; i < n; i++) {
        float x = load_elem(src, dt, i), v;
        uint8_t sc = s[i * ss], c;
        if (sc == 255) {
            c = (uint8_t)(nan | (signbit(x) ? 0x80 : 0));
            v = NAN;
        } else {
            c = mxfp8_fp32_to_fp8(mxfp8i_clamp_elem(x, (mxfp8_format)fmt) * ldexpf(1.0f, 127 - (int)sc), (mxfp8_format)fmt);
            v = mxfp8_fp8_to_fp32(c, (mxfp8_format)fmt) * mxfp8_e8m0_to_fp32(sc);
        }
        switch (ok) {
        case OUT_CODES: ((uint8_t *)out)[i] = c; break;
        case OUT_F32: ((float *)out)[i] = v; break;
        case OUT_BF16: {
            uint16_t b = mxfp8_fp32_to_bf16(v);
            ((uint16_t *)out)[i] = b;
            inexact += v == v && mxfp8_bf16_to_fp32(b) != v;
            break;
        }
        default: {
            uint16_t h = mxfp8_fp32_to_fp16(v);
            ((uint16_t *)out)[i] = h;
            inexact += v == v && mxfp8_fp16_to_fp32(h) != v;
            break;
        }
        }
    }
    return inexact;
}

static const int16_t HI_WORDS_UNPACK[32] = {1,  3,  5,  7,  33, 35, 37, 39, 9,  11, 13, 15, 41, 43, 45, 47,
                                            17, 19, 21, 23, 49, 51, 53, 55, 25, 27, 29, 31, 57, 59, 61, 63};
static const int16_t HI_WORDS_NATURAL[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
                                             33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
static const int32_t F32_FROM_UNPACK[32] = {0, 1, 2,  3,  16, 17, 18, 19, 4,  5,  6,  7,  20, 21, 22, 23,
                                            8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};

/* From scale code 10 up every qdq value is exact in BF16 as its FP32 high half, below 2^-126 too: it is an FP8
 * value (a multiple of 2^-16 in E5M2, of 2^-9 in E4M3) times 2^(s - 127), so a multiple of 2^(s - 143) >= 2^-133,
 * BF16's subnormal spacing (FP32 holds it exactly; its low 16 bits are zero). Blocks whose scale codes are all >=
 * MXFP8I_QDQ_EXACT_S skip store_qdq32's test for values below 2^-126. */
#define MXFP8I_QDQ_EXACT_S 10

/* Store the qdq magnitudes (vlo, vhi; block order) with signs. Returns the inexact count, or -1 when a lane needs
 * the element-wise fallback (a non-zero value below 2^-126 for BF16 output: truncation might not be RNE); tiny = 0
 * (every scale code of the block >= MXFP8I_QDQ_EXACT_S: truncation is exact) skips that test. */
AI int64_t store_qdq32(char *o, int ok, int dt, __m512 vlo, __m512 vhi, __mmask32 sign, __mmask32 m, bool full,
                       int tiny) {
    if (ok == OUT_BF16) {
        __m512i bl = _mm512_castps_si512(vlo), bh = _mm512_castps_si512(vhi);
        __mmask16 rl = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(bl, set1(1)), set1(0x007FFFFFu));
        __mmask16 rh = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(bh, set1(1)), set1(0x007FFFFFu));
        if (tiny && (((uint32_t)rl | ((uint32_t)rh << 16)) & m) != 0) return -1;
        /* every value is an exact BF16 (<= 4 significant bits, normal or zero or Inf): take the high halves */
        __m512i idx = _mm512_loadu_si512(unpack_order(dt) ? HI_WORDS_UNPACK : HI_WORDS_NATURAL);
        __m512i w = _mm512_permutex2var_epi16(bl, idx, bh);
        w = _mm512_mask_mov_epi16(w, sign, _mm512_or_si512(w, _mm512_set1_epi16((short)0x8000)));
        if (full)
            _mm512_storeu_si512(o, w);
        else
            _mm512_mask_storeu_epi16(o, m, w);
        return 0;
    }
    __m512 nlo = vlo, nhi = vhi;
    if (unpack_order(dt)) {
        nlo = _mm512_permutex2var_ps(vlo, _mm512_loadu_si512(F32_FROM_UNPACK), vhi);
        nhi = _mm512_permutex2var_ps(vlo, _mm512_loadu_si512(F32_FROM_UNPACK + 16), vhi);
    }
    nlo = _mm512_castsi512_ps(
        _mm512_mask_or_epi32(_mm512_castps_si512(nlo), (__mmask16)sign, _mm512_castps_si512(nlo), set1(0x80000000u)));
    nhi = _mm512_castsi512_ps(_mm512_mask_or_epi32(_mm512_castps_si512(nhi), (__mmask16)(sign >> 16),
                                                   _mm512_castps_si512(nhi), set1(0x80000000u)));
    return store_vals(o, ok, nlo, nhi, m, full);
}

typedef struct qctx {
    int d;          /* emax-1 (nki) or emax */
    uint32_t rceil; /* 0x7FFFFF for rceil, else 0 */
    int sat;        /* scaled values can exceed max normal (ocp only: nki and rceil keep amax * 2^-e <= max) */
} qctx;

/* min(|x| * 2^-e, max normal) under ocp; under nki/rceil (amax * 2^-e < 2^emax resp. <= max normal, no saturation)
 * min(|x|, mxfp8i_elem_cap) * 2^-e, which changes only elements of a group at the top scale, where rounding up to
 * 2^emax would decode past FLT_MAX (codec.h). Under ocp the cap lies above max normal * 2^e: nothing to do. */
AI __m512 scaled_abs(__m512 x, __m512 inv, int fmt, int sat) {
    if (!sat) return _mm512_mul_ps(_mm512_min_ps(x, _mm512_set1_ps(mxfp8i_elem_cap(fmt))), inv); /* top scale */
    return _mm512_min_ps(_mm512_mul_ps(x, inv), set1f_bits(f_maxn(fmt)));
}

/* One block: quantize the magnitudes with multipliers (ilo, ihi) and store codes or qdq values (scale values
 * svlo/svhi). Returns the inexact count, or -1, writing nothing, when the block needs the element-wise fallback
 * (store_qdq32). No calls: a loop of these keeps its constants in registers (a call on the path, even a rare one,
 * makes the compiler rematerialize them at every block, all vector registers being call-clobbered). */
AI int64_t quant_block(int dt, int fmt, int ok, int sat, __m512 lo, __m512 hi, __mmask32 sign, __m512 ilo, __m512 ihi,
                       __m512 svlo, __m512 svhi, __mmask32 m, bool full, char *o, int tiny) {
    __m512 alo = scaled_abs(lo, ilo, fmt, sat), ahi = scaled_abs(hi, ihi, fmt, sat);
    if (ok == OUT_CODES) {
        __m256i c = pack_bytes(fp8_code(alo, fmt), fp8_code(ahi, fmt), dt);
        c = _mm256_mask_mov_epi8(c, sign, _mm256_or_si256(c, _mm256_set1_epi8((char)0x80)));
        if (full)
            _mm256_storeu_si256((__m256i *)o, c);
        else
            _mm256_mask_storeu_epi8(o, m, c);
        return 0;
    }
    __m512 vlo = _mm512_mul_ps(fp8_round(alo, fmt), svlo), vhi = _mm512_mul_ps(fp8_round(ahi, fmt), svhi);
    return store_qdq32(o, ok, dt, vlo, vhi, sign, m, full, tiny);
}
/* quant_block with its fallback: the n elements at src again by the reference arithmetic (s32/ss: the scale
 * codes). */
AI int64_t do_block(const char *src, int dt, int fmt, int ok, int sat, __m512 lo, __m512 hi, __mmask32 sign, __m512 ilo,
                    __m512 ihi, __m512 svlo, __m512 svhi, __mmask32 m, bool full, int n, char *o, const uint8_t *s32,
                    int ss) {
    const int64_t r = quant_block(dt, fmt, ok, sat, lo, hi, sign, ilo, ihi, svlo, svhi, m, full, o, 1);
    return r >= 0 ? r : ref_elems(src, dt, n, s32, ss, fmt, ok, o);
}

/* Rows: a contiguous segment of K values, 1x32 groups; 16 full groups per batch share one reduction. */
AI int64_t q_row_seg(const void *src, int dt, int64_t K, int fmt, int ok, qctx cx, void *out, uint8_t *sc,
                     int64_t sc_gs) {
    const int es = dt == MXFP8_DTYPE_F32 ? 4 : 2, os = out_size(ok);
    const __m512i rcm = set1(cx.rceil);
    const int64_t nfull = K / 32, G = mxfp8i_ceil_div(K, 32);
    int64_t inexact = 0, g = 0;
    __m512 lo, hi;
    __mmask32 sign;
    for (int ng; g < nfull; g += ng) { /* batches of up to 16 whole groups (unused lanes reduce zeros, never read) */
        ng = nfull - g < 16 ? (int)(nfull - g) : 16;
        const char *s0 = (const char *)src + g * 32 * es;
        char *o0 = (char *)out + g * 32 * os;
        __m512i mm[16];
        for (int j = 0; j < 16; j++) {
            if (j >= ng) {
                mm[j] = _mm512_setzero_si512();
                continue;
            }
            load_abs32(s0 + j * 32 * es, dt, ~0u, true, &lo, &hi, &sign);
            mm[j] = _mm512_max_epu32(_mm512_castps_si512(lo), _mm512_castps_si512(hi));
        }
        __m512i s = scale_codes(reduce16(mm), cx.d, rcm);
        uint8_t sb[16];
        _mm_storeu_si128((__m128i *)sb, _mm512_cvtepi32_epi8(s));
        if (sc) {
            if (sc_gs == 1)
                memcpy(sc + g, sb, (size_t)ng);
            else
                for (int j = 0; j < ng; j++) sc[(g + j) * sc_gs] = sb[j];
        }
        /* groups by the reference arithmetic after the loop (NaN groups, and blocks quant_block leaves): no call
           inside it */
        uint32_t redo = _mm512_cmpeq_epi32_mask(s, set1(255));
        const uint32_t tiny = _mm512_cmplt_epu32_mask(s, set1(MXFP8I_QDQ_EXACT_S));
        __m512 inv = inv_scale(s), sv = scale_value(s);
        for (int j = 0; j < ng; j++) {
            if ((redo >> j) & 1) continue;
            const char *sj = s0 + j * 32 * es;
            __m512i bj = _mm512_set1_epi32(j);
            __m512 ij = _mm512_permutexvar_ps(bj, inv), svj = _mm512_permutexvar_ps(bj, sv);
            load_abs32(sj, dt, ~0u, true, &lo, &hi, &sign);
            const int64_t r = quant_block(dt, fmt, ok, cx.sat, lo, hi, sign, ij, ij, svj, svj, ~0u, true,
                                          o0 + j * 32 * os, (tiny >> j) & 1);
            if (r < 0) redo |= 1u << j;
            else inexact += r;
        }
        for (uint32_t b = redo & ((1u << ng) - 1); b; b &= b - 1) {
            const int j = __builtin_ctz(b);
            inexact += ref_elems(s0 + j * 32 * es, dt, 32, sb + j, 0, fmt, ok, o0 + j * 32 * os);
        }
    }
    for (; g < G; g++) {
        int n = K - g * 32 >= 32 ? 32 : (int)(K - g * 32);
        bool full = n == 32;
        __mmask32 m = tail_mask(n);
        const char *sj = (const char *)src + g * 32 * es;
        char *oj = (char *)out + g * 32 * os;
        load_abs32(sj, dt, m, full, &lo, &hi, &sign);
        __m512i s = scale_codes(hmax(_mm512_max_epu32(_mm512_castps_si512(lo), _mm512_castps_si512(hi))), cx.d, rcm);
        uint8_t sv8 = (uint8_t)_mm_cvtsi128_si32(_mm512_castsi512_si128(s));
        if (sc) sc[g * sc_gs] = sv8;
        if (sv8 == 255) {
            inexact += ref_elems(sj, dt, n, &sv8, 0, fmt, ok, oj);
            continue;
        }
        __m512 inv = inv_scale(s), sv = scale_value(s);
        inexact += do_block(sj, dt, fmt, ok, cx.sat, lo, hi, sign, inv, inv, sv, sv, m, full, n, oj, &sv8, 0);
    }
    return inexact;
}

/* Cols, second half of a 32-column chunk at c0 of group g: scales from the amax bits (alo, ahi), then quantize
 * the group's rows (read again: they are in L1). */
AI int64_t cols_chunk(const mxfp8i_qpanel *p, int dt, int fmt, int ok, qctx cx, int64_t g, const int64_t *idx, int n,
                      int64_t c0, int nc, __m512i alo, __m512i ahi) {
    const int es = dt == MXFP8_DTYPE_F32 ? 4 : 2, os = out_size(ok);
    const char *src = (const char *)p->src;
    char *out = (char *)p->out;
    const bool full = nc == 32;
    const __mmask32 m = tail_mask(nc);
    const __m512i rcm = set1(cx.rceil);
    int64_t inexact = 0;
    __m512i slo = scale_codes(alo, cx.d, rcm), shi = scale_codes(ahi, cx.d, rcm);
    __m256i sbytes = pack_bytes(slo, shi, dt);
    _Alignas(32) uint8_t s32[32];
    _mm256_store_si256((__m256i *)s32, sbytes);
    if (p->scales) {
        if (full)
            _mm256_storeu_si256((__m256i *)(p->scales + g * p->sc_gs + c0), sbytes);
        else
            _mm256_mask_storeu_epi8(p->scales + g * p->sc_gs + c0, m, sbytes);
    }
    __mmask32 nfm = _mm256_cmpeq_epi8_mask(sbytes, _mm256_set1_epi8(-1)) & m, sign;
    __m512 ilo = inv_scale(slo), ihi = inv_scale(shi), vlo = scale_value(slo), vhi = scale_value(shi), lo, hi;
    for (int i = 0; i < n; i++) {
        const char *row = src + (idx[i] * p->src_ks + c0) * es;
        char *o = out + (idx[i] * p->out_ks + c0) * os;
        if (nfm && ok != OUT_CODES) {
            inexact += ref_elems(row, dt, nc, s32, 1, fmt, ok, o);
            continue;
        }
        load_abs32(row, dt, m, full, &lo, &hi, &sign);
        if (nfm) { /* codes of a block with NaN groups: NaN codes there, sign kept */
            __m512 al = scaled_abs(lo, ilo, fmt, cx.sat), ah = scaled_abs(hi, ihi, fmt, cx.sat);
            __m256i c = pack_bytes(fp8_code(al, fmt), fp8_code(ah, fmt), dt);
            c = _mm256_mask_mov_epi8(c, nfm, _mm256_set1_epi8((char)f_nan(fmt)));
            c = _mm256_mask_mov_epi8(c, sign, _mm256_or_si256(c, _mm256_set1_epi8((char)0x80)));
            if (full)
                _mm256_storeu_si256((__m256i *)o, c);
            else
                _mm256_mask_storeu_epi8(o, m, c);
            continue;
        }
        inexact += do_block(row, dt, fmt, ok, cx.sat, lo, hi, sign, ilo, ihi, vlo, vhi, m, full, nc, o, s32, 1);
    }
    return inexact;
}

/* Quantize panels with stochastic rounding or statistics (quant_avx512_x.c); di: source dtype index (0 F32, 1 BF16,
 * 2 F16). -1 for a geometry it does not handle (rows with wrapX groups, other strides). */
int64_t mxfp8i_quantize_panel_x__avx512(const mxfp8i_qpanel *p, qctx cx, int di);

/* The BF16 -> codes panels (quant_avx512_bf16.c), one instance per format (0 E4M3, 1 E5M2). */
int64_t mxfp8i_qrow_bf16c_0(const void *src, int64_t K, qctx cx, void *out, uint8_t *sc, int64_t sc_gs);
int64_t mxfp8i_qrow_bf16c_1(const void *src, int64_t K, qctx cx, void *out, uint8_t *sc, int64_t sc_gs);
int64_t mxfp8i_qcols_bf16c_0(const mxfp8i_qpanel *p, qctx cx);
int64_t mxfp8i_qcols_bf16c_1(const mxfp8i_qpanel *p, qctx cx);
/* BF16 -> BF16 qdq values, the same 16-bit-lane rounding (quant_avx512_bf16.c). */
int64_t mxfp8i_qrow_bf16v_0(const void *src, int64_t K, qctx cx, void *out, uint8_t *sc, int64_t sc_gs);
int64_t mxfp8i_qrow_bf16v_1(const void *src, int64_t K, qctx cx, void *out, uint8_t *sc, int64_t sc_gs);
int64_t mxfp8i_qcols_bf16v_0(const mxfp8i_qpanel *p, qctx cx);
int64_t mxfp8i_qcols_bf16v_1(const mxfp8i_qpanel *p, qctx cx);

#endif /* MXFP8_KERNELS_AVX512_QUANT_LANES_AVX512_H */
