/*
 * quant_avx512.c -- AVX-512 MX quantize / qdq / dequantize panels.
 *
 * Contract (src/kernels/qpanel.h): mxfp8i_quantize_panel__avx512 and
 * mxfp8i_dequantize_panel__avx512 handle the "rows" geometry (unit stride along the axis for src and out) and the
 * "cols" geometry (unit stride across lines for src, out and scales), 1x32 and wrapX groups, F32/BF16/F16 sources,
 * E4M3/E5M2, the three scale rules; outputs codes, or exact qdq values as F32/BF16/F16. Any other geometry returns
 * -1 and writes nothing. Results equal the reference panels (src/kernels/ref/quant_ref.c) bit for bit:
 *  - amax is the unsigned-integer max of |x| bits (NaN > Inf > finite), so a non-finite group is seen exactly as the
 *    reference sees it, and the scale code is read from amax's exponent field exactly as mxfp8_scale_code does
 *    (an FP32-subnormal amax always clamps to code 0 under every rule);
 *  - |y| = |x| * 2^-e is the same IEEE multiply as the reference (signs are applied to the finished bytes/words);
 *    the FP8 code of |y| comes from a magic addition: with E = max(exponent(|y|), emin), |y| + 2^(E + 23 - m) is
 *    rounded by the FPU to nearest-even on exactly the FP8 grid of binade E, normal and subnormal alike; |y| is
 *    first saturated to max normal under the OCP rule (rounding is monotonic, so saturating first is the same as
 *    after; under nki/rceil a finite group never exceeds max normal);
 *  - qdq values are the rounded |y| times 2^(s-127) (the multiply the reference dequantizer does); BF16 outputs are
 *    the high halves, which is exact because such values have <= 4 significant bits, unless a value lies below
 *    2^-126: then (like NaN groups in qdq) the block is redone element-wise with the reference arithmetic.
 * Rows: 16 groups per batch, their amax reduced together by a transposing shuffle tree. Cols: per group, tiles of
 * 512 columns swept row by row twice (amax into per-column accumulators; then quantize, from L1/L2 with per-column
 * multipliers), so each pass is one sequential stream.
 * BF16 sources are processed in the in-lane "unpack order" so that conversion and packing are single instructions.
 * BF16 -> codes (the common training case) has its own path in 16-bit integer lanes, 32 elements per vector, exact
 * by construction (see bf16_codes); groups with a tiny or non-finite amax fall back to the FP32 path. Its cols form
 * uses 2048-column tiles, prefetches the next tile, and writes the codes of large panels with streaming stores.
 * wrapX rows: each (sub)tile is gathered into group order in a small buffer, processed as 1x32, and scattered back.
 */
#include <math.h>

#include "../../format/codec.h"
#include "../../format/groups.h"
#include "../../runtime/tensor.h"
#include "avx512.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

enum { OUT_CODES = 0, OUT_F32 = 1, OUT_BF16 = 2, OUT_F16 = 3 };

static int out_kind(mxfp8_dtype dt) {
    switch (dt) {
    case MXFP8_DTYPE_F32: return OUT_F32;
    case MXFP8_DTYPE_BF16: return OUT_BF16;
    case MXFP8_DTYPE_F16: return OUT_F16;
    default: return OUT_CODES;
    }
}
static int out_size(int ok) { return ok == OUT_CODES ? 1 : ok == OUT_F32 ? 4 : 2; }

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
            c = mxfp8_fp32_to_fp8(x * ldexpf(1.0f, 127 - (int)sc), (mxfp8_format)fmt);
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

/* Store the qdq magnitudes (vlo, vhi; block order) with signs. Returns the inexact count, or -1 when a lane needs
 * the element-wise fallback (a non-zero value below 2^-126 for BF16 output: truncation would not be RNE). */
AI int64_t store_qdq32(char *o, int ok, int dt, __m512 vlo, __m512 vhi, __mmask32 sign, __mmask32 m, bool full) {
    if (ok == OUT_BF16) {
        __m512i bl = _mm512_castps_si512(vlo), bh = _mm512_castps_si512(vhi);
        __mmask16 rl = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(bl, set1(1)), set1(0x007FFFFFu));
        __mmask16 rh = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(bh, set1(1)), set1(0x007FFFFFu));
        if ((((uint32_t)rl | ((uint32_t)rh << 16)) & m) != 0) return -1;
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

/* min(|x| * 2^-e, max normal); the min only where the rule can overshoot (a finite group under nki/rceil never
 * does: amax * 2^-e < 2^emax resp. <= max normal, and RNE cannot round past max normal from below it). */
AI __m512 scaled_abs(__m512 x, __m512 inv, int fmt, int sat) {
    __m512 a = _mm512_mul_ps(x, inv);
    return sat ? _mm512_min_ps(a, set1f_bits(f_maxn(fmt))) : a;
}

/* One block: quantize the magnitudes with multipliers (ilo, ihi) and store codes or qdq values (scale values
 * svlo/svhi). s32/ss: the scale codes for the fallback. */
AI int64_t do_block(const char *src, int dt, int fmt, int ok, int sat, __m512 lo, __m512 hi, __mmask32 sign, __m512 ilo,
                    __m512 ihi, __m512 svlo, __m512 svhi, __mmask32 m, bool full, int n, char *o, const uint8_t *s32,
                    int ss) {
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
    int64_t r = store_qdq32(o, ok, dt, vlo, vhi, sign, m, full);
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
    for (; g + 16 <= nfull; g += 16) {
        const char *s0 = (const char *)src + g * 32 * es;
        char *o0 = (char *)out + g * 32 * os;
        __m512i mm[16];
        for (int j = 0; j < 16; j++) {
            load_abs32(s0 + j * 32 * es, dt, ~0u, true, &lo, &hi, &sign);
            mm[j] = _mm512_max_epu32(_mm512_castps_si512(lo), _mm512_castps_si512(hi));
        }
        __m512i s = scale_codes(reduce16(mm), cx.d, rcm);
        uint8_t sb[16];
        _mm_storeu_si128((__m128i *)sb, _mm512_cvtepi32_epi8(s));
        if (sc) {
            if (sc_gs == 1)
                memcpy(sc + g, sb, 16);
            else
                for (int j = 0; j < 16; j++) sc[(g + j) * sc_gs] = sb[j];
        }
        __mmask16 nf = _mm512_cmpeq_epi32_mask(s, set1(255));
        __m512 inv = inv_scale(s), sv = scale_value(s);
        for (int j = 0; j < 16; j++) {
            const char *sj = s0 + j * 32 * es;
            char *oj = o0 + j * 32 * os;
            if ((nf >> j) & 1) {
                inexact += ref_elems(sj, dt, 32, sb + j, 0, fmt, ok, oj);
                continue;
            }
            __m512i bj = _mm512_set1_epi32(j);
            __m512 ij = _mm512_permutexvar_ps(bj, inv), svj = _mm512_permutexvar_ps(bj, sv);
            load_abs32(sj, dt, ~0u, true, &lo, &hi, &sign);
            inexact += do_block(sj, dt, fmt, ok, cx.sat, lo, hi, sign, ij, ij, svj, svj, ~0u, true, 32, oj, sb + j, 0);
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

/* Cols: for each group, column tiles of up to CT columns. Pass 1 sweeps each of the group's rows along the tile
 * (one sequential stream) folding |x| bits into per-column accumulators; the scales, multipliers and scale values
 * of the whole tile are then computed once; pass 2 sweeps the rows again (from L1/L2) and quantizes with the
 * per-column multipliers. Blocks with NaN groups (rare) go through cols_chunk. */
#define CT 512
AI int64_t q_cols(const mxfp8i_qpanel *p, int dt, int fmt, int ok, qctx cx) {
    const int es = dt == MXFP8_DTYPE_F32 ? 4 : 2, os = out_size(ok);
    const int64_t C = p->lines, K = p->K, G = mxfp8i_ceil_div(K, 32);
    const __m512i rcm = set1(cx.rceil);
    const char *src = (const char *)p->src;
    char *out = (char *)p->out;
    int64_t inexact = 0, idx[32];
    _Alignas(64) __m512i acc[CT / 16];
    _Alignas(64) __m512 inv[CT / 16], sv[CT / 16];
    _Alignas(64) uint8_t s8[CT];
    uint32_t nfmask[CT / 32];
    __m512 lo, hi;
    __mmask32 sign;
    for (int64_t g = 0; g < G; g++) {
        int n = mxfp8i_group_members(K, p->group, g, idx);
        for (int64_t c0 = 0; c0 < C; c0 += CT) {
            const int W = C - c0 >= CT ? CT : (int)(C - c0), nch = (W + 31) / 32;
            const int lastn = W - 32 * (nch - 1);
            for (int v = 0; v < 2 * nch; v++) acc[v] = _mm512_setzero_si512();
            for (int i = 0; i < n; i++) {
                const char *row = src + (idx[i] * p->src_ks + c0) * es;
                for (int ch = 0; ch < nch; ch++) {
                    int nc = ch == nch - 1 ? lastn : 32;
                    load_abs32(row + 32 * ch * es, dt, tail_mask(nc), nc == 32, &lo, &hi, &sign);
                    acc[2 * ch] = _mm512_max_epu32(acc[2 * ch], _mm512_castps_si512(lo));
                    acc[2 * ch + 1] = _mm512_max_epu32(acc[2 * ch + 1], _mm512_castps_si512(hi));
                }
            }
            uint32_t any_nf = 0;
            for (int ch = 0; ch < nch; ch++) {
                __m512i slo = scale_codes(acc[2 * ch], cx.d, rcm), shi = scale_codes(acc[2 * ch + 1], cx.d, rcm);
                __m256i sb = pack_bytes(slo, shi, dt);
                _mm256_store_si256((__m256i *)(s8 + 32 * ch), sb);
                nfmask[ch] = _mm256_cmpeq_epi8_mask(sb, _mm256_set1_epi8(-1)) & tail_mask(ch == nch - 1 ? lastn : 32);
                any_nf |= nfmask[ch];
                inv[2 * ch] = inv_scale(slo), inv[2 * ch + 1] = inv_scale(shi);
                sv[2 * ch] = scale_value(slo), sv[2 * ch + 1] = scale_value(shi);
            }
            if (p->scales) memcpy(p->scales + g * p->sc_gs + c0, s8, (size_t)W);
            for (int i = 0; i < n; i++) {
                const char *row = src + (idx[i] * p->src_ks + c0) * es;
                char *o = out + (idx[i] * p->out_ks + c0) * os;
                for (int ch = 0; ch < nch; ch++) {
                    int nc = ch == nch - 1 ? lastn : 32;
                    if (any_nf && nfmask[ch]) continue; /* done below */
                    load_abs32(row + 32 * ch * es, dt, tail_mask(nc), nc == 32, &lo, &hi, &sign);
                    inexact += do_block(row + 32 * ch * es, dt, fmt, ok, cx.sat, lo, hi, sign, inv[2 * ch],
                                        inv[2 * ch + 1], sv[2 * ch], sv[2 * ch + 1], tail_mask(nc), nc == 32, nc,
                                        o + 32 * ch * os, s8 + 32 * ch, 1);
                }
            }
            if (any_nf)
                for (int ch = 0; ch < nch; ch++)
                    if (nfmask[ch])
                        inexact += cols_chunk(p, dt, fmt, ok, cx, g, idx, n, c0 + 32 * ch, ch == nch - 1 ? lastn : 32,
                                              acc[2 * ch], acc[2 * ch + 1]);
        }
    }
    return inexact;
}
#undef CT

/* ---------------------------------------------------------------------------------------------------------- */
/* BF16 -> codes in 16-bit lanes (32 elements per vector, no FP32 widening)                                    */
/* ---------------------------------------------------------------------------------------------------------- */
/* For a group with scale code s, y = |x| * 2^(127-s). A BF16 |x| = sig * 2^(bx - 134) with bx its exponent field
 * and sig = 128 + its 7 fraction bits (bx >= 1). With K2 = s + emin and m the FP8 fraction bits, the FP8 code of y
 * (RNE on the grid of binade max(exponent(y), emin), as the reference rounds) is
 *     code = (max(bx - K2, 0) << m) + RNE(sig >> (7 - m + max(K2 - bx, 0)))
 * (normal y: the exponent field times 2^m plus the rounded significand, a carry moving to the next binade;
 * subnormal y: the significand shifted to the fixed subnormal grid), all exact integer arithmetic. BF16 subnormals
 * and zeros (bx = 0) are taken as if bx were 0 with the implicit bit: for s >= Q16_SMIN both they and the true
 * values lie below half the smallest FP8 subnormal, so both give code 0. Groups with s < Q16_SMIN (tiny amax) or
 * s = 255 (NaN/Inf) take the FP32 path above. OCP saturation: the code is clamped to max normal's (rounding is
 * monotonic, so this equals saturating y first). */
#define Q16_SMIN 20 /* >= 2 - emin + m for E4M3 (11) and E5M2 (18) */
AI __m512i set1w(int v) { return _mm512_set1_epi16((short)v); }
AI __m512i bf16_codes(__m512i v, __m512i k2, int fmt, int sat) {
    const int m = fmt == MXFP8_FMT_E5M2 ? 2 : 3;
    __m512i a = _mm512_and_si512(v, set1w(0x7FFF));
    __m512i bx = _mm512_srli_epi16(a, 7);
    __m512i sig = _mm512_ternarylogic_epi32(v, set1w(0x7F), set1w(0x80), 0xEA); /* (v & 0x7F) | 0x80 */
    __m512i d = _mm512_subs_epu16(k2, bx);
    __m512i base = _mm512_slli_epi16(_mm512_subs_epu16(bx, k2), m);
    __m512i sh = _mm512_add_epi16(d, set1w(7 - m));
    /* 2^(sh-1) - 1 (0 once sh > 16, where the result is 0 anyway) */
    __m512i half = _mm512_srlv_epi16(set1w(0x7FFF), _mm512_sub_epi16(set1w(9 + m), d));
    __m512i lsb = _mm512_and_si512(_mm512_srlv_epi16(sig, sh), set1w(1));
    __m512i q = _mm512_srlv_epi16(_mm512_add_epi16(_mm512_add_epi16(sig, half), lsb), sh);
    __m512i c = _mm512_add_epi16(base, q);
    if (sat) c = _mm512_min_epu16(c, set1w(fmt == MXFP8_FMT_E5M2 ? 0x7B : 0x7E));
    return _mm512_ternarylogic_epi32(c, _mm512_srli_epi16(v, 8), set1w(0x80), 0xF8); /* c | (sign >> 8) */
}
/* Two vectors of 16-bit codes -> 64 bytes in order. */
AI __m512i pack_codes2(__m512i c0, __m512i c1) {
    return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), _mm512_packus_epi16(c0, c1));
}

/* The FP32 path for BF16 -> codes (slow groups, tails), out of line: it is rare, and inlining it here once made
 * GCC 12 fail (internal compiler error vectorizing ref_elems). */
__attribute__((noinline)) static int64_t q_row_bf16c_fp32(const void *src, int64_t K, int fmt, qctx cx, void *out,
                                                          uint8_t *sc, int64_t sc_gs) {
    if (fmt == MXFP8_FMT_E5M2)
        return q_row_seg(src, MXFP8_DTYPE_BF16, K, MXFP8_FMT_E5M2, OUT_CODES, cx, out, sc, sc_gs);
    return q_row_seg(src, MXFP8_DTYPE_BF16, K, MXFP8_FMT_E4M3, OUT_CODES, cx, out, sc, sc_gs);
}

/* 16 vectors of 32 words -> FP32 bits (word << 16) of each vector's max word, lane j for vector j: a transposing
 * tree of 16-bit maxima (halves, quarters, qwords, dwords), then the two words of each dword; the tree leaves
 * vector 4k + L in dword 4L + k, which the final permutation undoes. */
AI __m512i reduce16_w(const __m512i *m) {
    __m512i v[8], w[4], z[2];
    for (int i = 0; i < 8; i++)
        v[i] = _mm512_max_epu16(_mm512_shuffle_i64x2(m[2 * i], m[2 * i + 1], 0x44),
                                _mm512_shuffle_i64x2(m[2 * i], m[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++)
        w[i] = _mm512_max_epu16(_mm512_shuffle_i64x2(v[2 * i], v[2 * i + 1], 0x88),
                                _mm512_shuffle_i64x2(v[2 * i], v[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++)
        z[i] = _mm512_max_epu16(_mm512_unpacklo_epi64(w[2 * i], w[2 * i + 1]),
                                _mm512_unpackhi_epi64(w[2 * i], w[2 * i + 1]));
    __m512 a = _mm512_castsi512_ps(z[0]), b = _mm512_castsi512_ps(z[1]);
    __m512i f = _mm512_max_epu16(_mm512_castps_si512(_mm512_shuffle_ps(a, b, 0x88)),
                                 _mm512_castps_si512(_mm512_shuffle_ps(a, b, 0xDD)));
    f = _mm512_slli_epi32(_mm512_max_epu16(f, _mm512_srli_epi32(f, 16)), 16);
    return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), f);
}

/* Rows, BF16 -> codes: 16 groups per batch (amax by a 16-bit max + the transposing tree, then the 16-bit codes). */
AI int64_t q_row_bf16c(const void *src, int64_t K, int fmt, qctx cx, void *out, uint8_t *sc, int64_t sc_gs) {
    const __m512i rcm = set1(cx.rceil);
    const int emin = fmt == MXFP8_FMT_E5M2 ? -14 : -6;
    const int64_t nb = K / 512;
    for (int64_t b = 0; b < nb; b++) {
        const char *s0 = (const char *)src + b * 1024;
        uint8_t *o0 = (uint8_t *)out + b * 512;
        __m512i mm[16];
        for (int j = 0; j < 16; j++) mm[j] = _mm512_and_si512(_mm512_loadu_si512(s0 + 64 * j), set1w(0x7FFF));
        __m512i s = scale_codes(reduce16_w(mm), cx.d, rcm);
        if (sc) {
            __m128i sb = _mm512_cvtepi32_epi8(s);
            if (sc_gs == 1)
                _mm_storeu_si128((__m128i *)(sc + b * 16), sb);
            else {
                _Alignas(16) uint8_t t[16];
                _mm_store_si128((__m128i *)t, sb);
                for (int j = 0; j < 16; j++) sc[(b * 16 + j) * sc_gs] = t[j];
            }
        }
        __mmask16 slow = _mm512_cmpge_epu32_mask(_mm512_sub_epi32(s, set1(Q16_SMIN)), set1(255 - Q16_SMIN));
        __m512i k2v = _mm512_add_epi32(s, set1((uint32_t)emin));
        _Alignas(64) int32_t k2[16]; /* K2 in both halves of each dword: broadcast by a plain load per group */
        _mm512_store_si512(k2, _mm512_or_si512(k2v, _mm512_slli_epi32(k2v, 16)));
        if (!slow) {
            for (int j = 0; j < 16; j += 2) {
                __m512i c0 = bf16_codes(_mm512_loadu_si512(s0 + 64 * j), _mm512_set1_epi32(k2[j]), fmt, cx.sat);
                __m512i c1 = bf16_codes(_mm512_loadu_si512(s0 + 64 * j + 64), _mm512_set1_epi32(k2[j + 1]), fmt, cx.sat);
                _mm512_storeu_si512(o0 + 32 * j, pack_codes2(c0, c1));
            }
            continue;
        }
        for (int j = 0; j < 16; j++) {
            if ((slow >> j) & 1) {
                q_row_bf16c_fp32(s0 + 64 * j, 32, fmt, cx, o0 + 32 * j, NULL, 1);
                continue;
            }
            __m512i c = bf16_codes(_mm512_loadu_si512(s0 + 64 * j), _mm512_set1_epi32(k2[j]), fmt, cx.sat);
            _mm256_storeu_si256((__m256i *)(o0 + 32 * j), _mm512_cvtepi16_epi8(c));
        }
    }
    if (nb * 512 < K)
        q_row_bf16c_fp32((const char *)src + nb * 1024, K - nb * 512, fmt, cx, (uint8_t *)out + nb * 512,
                         sc ? sc + nb * 16 * sc_gs : NULL, sc_gs);
    return 0;
}

/* E8M0 codes from 16-bit amax (BF16 |x| bits), as scale_codes does from the FP32 bits. */
AI __m512i scale_codes16(__m512i a, int d, int rceil) {
    __m512i s = _mm512_sub_epi16(_mm512_srli_epi16(a, 7), set1w(d));
    if (rceil) s = _mm512_mask_add_epi16(s, _mm512_cmpgt_epu16_mask(_mm512_and_si512(a, set1w(0x7F)), set1w(0x60)), s,
                                         set1w(1));
    s = _mm512_min_epi16(_mm512_max_epi16(s, _mm512_setzero_si512()), set1w(254));
    return _mm512_mask_mov_epi16(s, _mm512_cmpge_epu16_mask(a, set1w(0x7F80)), set1w(255));
}

/* Cols, BF16 -> codes: per group, tiles of CT16 columns; pass 1 folds |x| bits into 16-bit per-column maxima,
 * pass 2 quantizes from cache while prefetching the rows of the next tile (its pass 1 then reads from L2; one tile
 * ahead keeps the L2 footprint at two tiles). Chunks of 32 columns holding a slow group
 * (tiny amax, NaN/Inf) go through cols_chunk. */
#define CT16 2048 /* 4096^2 cols, 1 thread: 2048-column tiles 2.64-2.74 ms, 4096 2.89-3.10, 1024 2.71-2.92 */
#define PFH _MM_HINT_T2 /* measured: T0 (into L1) is slower, T1 ~ T2 */
AI int64_t q_cols_bf16c(const mxfp8i_qpanel *p, int fmt, qctx cx) {
    const int64_t C = p->lines, K = p->K, G = mxfp8i_ceil_div(K, 32);
    const int emin = fmt == MXFP8_FMT_E5M2 ? -14 : -6;
    const char *src = (const char *)p->src;
    uint8_t *out = (uint8_t *)p->out;
    int64_t idx[32], nidx[32];
    _Alignas(64) __m512i acc[CT16 / 32], k2[CT16 / 32];
    uint32_t slow[CT16 / 32];
    /* Codes of a panel larger than L2 are written with streaming stores (64-byte aligned full lines): no read for
     * ownership, and the next group's prefetched rows are not evicted by output lines (4096^2 BF16 cols, 1 thread:
     * 4.0-4.2 -> 3.15-3.4 ms). Smaller outputs are likely read again soon, from cache: ordinary stores. The rows
     * kernel keeps ordinary stores (streaming measured slower there: 2.8 -> 3.2 ms). */
    const bool stream = C * K >= ((int64_t)2 << 20);
    int nn = G > 0 ? mxfp8i_group_members(K, p->group, 0, nidx) : 0;
    for (int64_t g = 0; g < G; g++) {
        int n = nn;
        for (int i = 0; i < n; i++) idx[i] = nidx[i];
        nn = g + 1 < G ? mxfp8i_group_members(K, p->group, g + 1, nidx) : 0;
        for (int64_t c0 = 0; c0 < C; c0 += CT16) {
            const int W = C - c0 >= CT16 ? CT16 : (int)(C - c0), nch = (W + 31) / 32;
            const int lastn = W - 32 * (nch - 1);
            const __mmask32 lm = tail_mask(lastn);
            /* the next item (tile to the right, or the next group's first tile): its rows are prefetched while
             * this one computes */
            const int64_t c2 = c0 + CT16 < C ? c0 + CT16 : 0;
            const int64_t *pidx = c2 ? idx : nidx;
            const int pn = c2 ? n : nn;
            const int nch2 = (int)(((C - c2 < CT16 ? C - c2 : CT16) + 31) / 32);
            for (int ch = 0; ch < nch; ch++) acc[ch] = _mm512_setzero_si512();
            for (int i = 0; i < n; i++) {
                const uint16_t *row = (const uint16_t *)src + idx[i] * p->src_ks + c0;
                for (int ch = 0; ch < nch - 1; ch++)
                    acc[ch] = _mm512_max_epu16(acc[ch], _mm512_and_si512(_mm512_loadu_si512(row + 32 * ch), set1w(0x7FFF)));
                acc[nch - 1] = _mm512_max_epu16(
                    acc[nch - 1], _mm512_and_si512(_mm512_maskz_loadu_epi16(lm, row + 32 * (nch - 1)), set1w(0x7FFF)));
            }
            uint32_t any_slow = 0;
            for (int ch = 0; ch < nch; ch++) {
                __m512i s = scale_codes16(acc[ch], cx.d, cx.rceil != 0);
                __mmask32 m = ch == nch - 1 ? lm : ~0u;
                if (p->scales) _mm256_mask_storeu_epi8(p->scales + g * p->sc_gs + c0 + 32 * ch, m, _mm512_cvtepi16_epi8(s));
                slow[ch] = _mm512_mask_cmpge_epu16_mask(m, _mm512_sub_epi16(s, set1w(Q16_SMIN)), set1w(255 - Q16_SMIN));
                any_slow |= slow[ch];
                k2[ch] = _mm512_add_epi16(s, set1w(emin));
            }
            for (int i = 0; i < n; i++) {
                const uint16_t *row = (const uint16_t *)src + idx[i] * p->src_ks + c0;
                uint8_t *o = out + idx[i] * p->out_ks + c0;
                const bool nt_ok = stream && ((uintptr_t)o & 63) == 0;
                const char *nrow = i < pn ? (const char *)((const uint16_t *)src + pidx[i] * p->src_ks + c2) : NULL;
                int ch = 0;
                if (!any_slow) {
                    for (; ch + 2 <= nch - 1; ch += 2) {
                        if (nrow && ch + 1 < nch2) {
                            _mm_prefetch(nrow + 64 * ch, PFH);
                            _mm_prefetch(nrow + 64 * ch + 64, PFH);
                        }
                        __m512i c0v = bf16_codes(_mm512_loadu_si512(row + 32 * ch), k2[ch], fmt, cx.sat);
                        __m512i c1v = bf16_codes(_mm512_loadu_si512(row + 32 * ch + 32), k2[ch + 1], fmt, cx.sat);
                        if (nt_ok)
                            _mm512_stream_si512((__m512i *)(o + 32 * ch), pack_codes2(c0v, c1v));
                        else
                            _mm512_storeu_si512(o + 32 * ch, pack_codes2(c0v, c1v));
                    }
                }
                for (; ch < nch; ch++) {
                    if (nrow && ch < nch2) _mm_prefetch(nrow + 64 * ch, PFH);
                    if (slow[ch]) continue; /* done below */
                    __mmask32 m = ch == nch - 1 ? lm : ~0u;
                    __m512i v = _mm512_maskz_loadu_epi16(m, row + 32 * ch);
                    _mm256_mask_storeu_epi8(o + 32 * ch, m, _mm512_cvtepi16_epi8(bf16_codes(v, k2[ch], fmt, cx.sat)));
                }
            }
            if (any_slow)
                for (int ch = 0; ch < nch; ch++)
                    if (slow[ch]) {
                        __m512i z = _mm512_setzero_si512();
                        cols_chunk(p, MXFP8_DTYPE_BF16, fmt, OUT_CODES, cx, g, idx, n, c0 + 32 * ch,
                                   ch == nch - 1 ? lastn : 32, _mm512_unpacklo_epi16(z, acc[ch]),
                                   _mm512_unpackhi_epi16(z, acc[ch]));
                    }
        }
    }
    if (stream) _mm_sfence(); /* order the streaming stores before the caller's (and other threads') reads */
    return 0;
}
#undef CT16

/* ---------------------------------------------------------------------------------------------------------- */
/* Dequantize                                                                                                 */
/* ---------------------------------------------------------------------------------------------------------- */
AI void dq32(const uint8_t *c, __mmask32 m, bool full, __m512 slo, __m512 shi, int fmt, __m512 *lo, __m512 *hi) {
    __m256i b = full ? _mm256_loadu_si256((const __m256i *)c) : _mm256_maskz_loadu_epi8(m, c);
    *lo = _mm512_mul_ps(decode16(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(b)), fmt), slo);
    *hi = _mm512_mul_ps(decode16(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(b, 1)), fmt), shi);
}

/* Store dequantized values (natural order, signed): BF16 by truncation when every lane is exact in BF16 (zero,
 * |v| >= 2^-126, Inf or NaN: truncating a NaN gives what the RNE formula gives for the quiet NaNs produced here),
 * else through the RNE path. */
AI int64_t store_deq(char *o, int ok, __m512 lo, __m512 hi, __mmask32 m, bool full) {
    if (ok == OUT_BF16) {
        __m512i bl = _mm512_and_si512(_mm512_castps_si512(lo), set1(0x7FFFFFFFu));
        __m512i bh = _mm512_and_si512(_mm512_castps_si512(hi), set1(0x7FFFFFFFu));
        __mmask16 rl = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(bl, set1(1)), set1(0x007FFFFFu));
        __mmask16 rh = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(bh, set1(1)), set1(0x007FFFFFu));
        if ((((uint32_t)rl | ((uint32_t)rh << 16)) & m) == 0) {
            __m512i w = _mm512_permutex2var_epi16(_mm512_castps_si512(lo), _mm512_loadu_si512(HI_WORDS_NATURAL),
                                                  _mm512_castps_si512(hi));
            if (full)
                _mm512_storeu_si512(o, w);
            else
                _mm512_mask_storeu_epi16(o, m, w);
            return 0;
        }
    }
    return store_vals(o, ok, lo, hi, m, full);
}

AI int64_t dq_row_seg(const uint8_t *codes, int64_t K, int fmt, int ok, const uint8_t *sc, int64_t sc_gs, void *out) {
    const int os = out_size(ok);
    int64_t inexact = 0;
    for (int64_t k = 0, g = 0; k < K; k += 32, g++) {
        bool full = K - k >= 32;
        __mmask32 m = tail_mask(K - k);
        uint8_t s = sc[g * sc_gs];
        __m512 lo, hi;
        if (s == 255) {
            lo = hi = set1f_bits(0x7FC00000u);
        } else {
            __m512 sv = scale_value(set1(s));
            dq32(codes + k, m, full, sv, sv, fmt, &lo, &hi);
        }
        inexact += store_deq((char *)out + k * os, ok, lo, hi, m, full);
    }
    return inexact;
}

AI int64_t dq_cols(const mxfp8i_dqpanel *p, int fmt, int ok) {
    const int os = out_size(ok);
    const int64_t C = p->lines, K = p->K, G = mxfp8i_ceil_div(K, 32);
    int64_t inexact = 0, idx[32];
    for (int64_t g = 0; g < G; g++) {
        int n = mxfp8i_group_members(K, p->group, g, idx);
        for (int64_t c0 = 0; c0 < C; c0 += 32) {
            bool full = C - c0 >= 32;
            __mmask32 m = tail_mask(C - c0);
            const uint8_t *sp = p->scales + g * p->sc_gs + c0;
            __m256i sb = full ? _mm256_loadu_si256((const __m256i *)sp) : _mm256_maskz_loadu_epi8(m, sp);
            __m512i slo = _mm512_cvtepu8_epi32(_mm256_castsi256_si128(sb));
            __m512i shi = _mm512_cvtepu8_epi32(_mm256_extracti128_si256(sb, 1));
            __mmask16 nlo = _mm512_cmpeq_epi32_mask(slo, set1(255)), nhi = _mm512_cmpeq_epi32_mask(shi, set1(255));
            __m512 vlo = scale_value(slo), vhi = scale_value(shi);
            for (int i = 0; i < n; i++) {
                __m512 lo, hi;
                dq32(p->codes + idx[i] * p->codes_ks + c0, m, full, vlo, vhi, fmt, &lo, &hi);
                lo = _mm512_mask_mov_ps(lo, nlo, set1f_bits(0x7FC00000u));
                hi = _mm512_mask_mov_ps(hi, nhi, set1f_bits(0x7FC00000u));
                inexact += store_deq((char *)p->out + (idx[i] * p->out_ks + c0) * os, ok, lo, hi, m, full);
            }
        }
    }
    return inexact;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Instantiation: one specialized function per (source dtype, format, output kind)                            */
/* ---------------------------------------------------------------------------------------------------------- */
typedef int64_t (*q_row_fn)(const void *, int64_t, qctx, void *, uint8_t *, int64_t);
typedef int64_t (*q_cols_fn)(const mxfp8i_qpanel *, qctx);
typedef int64_t (*dq_row_fn)(const uint8_t *, int64_t, const uint8_t *, int64_t, void *);
typedef int64_t (*dq_cols_fn)(const mxfp8i_dqpanel *);

/* Source dtypes by their fixed enum values: 0 = F32, 1 = BF16, 2 = F16; formats 0 = E4M3, 1 = E5M2. */
_Static_assert(MXFP8_DTYPE_F32 == 0 && MXFP8_DTYPE_BF16 == 1 && MXFP8_DTYPE_F16 == 2, "dtype values");
#define QINST(DT, FMT, OK)                                                                                             \
    static int64_t qrow_##DT##_##FMT##_##OK(const void *s, int64_t K, qctx cx, void *o, uint8_t *sc, int64_t gs) {     \
        if (DT == MXFP8_DTYPE_BF16 && OK == OUT_CODES) return q_row_bf16c(s, K, FMT, cx, o, sc, gs);                 \
        return q_row_seg(s, DT, K, FMT, OK, cx, o, sc, gs);                                                            \
    }                                                                                                                  \
    static int64_t qcols_##DT##_##FMT##_##OK(const mxfp8i_qpanel *p, qctx cx) {                                     \
        if (DT == MXFP8_DTYPE_BF16 && OK == OUT_CODES) return q_cols_bf16c(p, FMT, cx);                               \
        return q_cols(p, DT, FMT, OK, cx);                                                                             \
    }
#define QINST_OK(DT, FMT) QINST(DT, FMT, 0) QINST(DT, FMT, 1) QINST(DT, FMT, 2) QINST(DT, FMT, 3)
#define QINST_FMT(DT) QINST_OK(DT, 0) QINST_OK(DT, 1)
QINST_FMT(0)
QINST_FMT(1)
QINST_FMT(2)
#define QROW_OK(DT, FMT)                                                                                               \
    { qrow_##DT##_##FMT##_0, qrow_##DT##_##FMT##_1, qrow_##DT##_##FMT##_2, qrow_##DT##_##FMT##_3 }
#define QCOL_OK(DT, FMT)                                                                                               \
    { qcols_##DT##_##FMT##_0, qcols_##DT##_##FMT##_1, qcols_##DT##_##FMT##_2, qcols_##DT##_##FMT##_3 }
static const q_row_fn q_row_tab[3][2][4] = {
    {QROW_OK(0, 0), QROW_OK(0, 1)}, {QROW_OK(1, 0), QROW_OK(1, 1)}, {QROW_OK(2, 0), QROW_OK(2, 1)}};
static const q_cols_fn q_cols_tab[3][2][4] = {
    {QCOL_OK(0, 0), QCOL_OK(0, 1)}, {QCOL_OK(1, 0), QCOL_OK(1, 1)}, {QCOL_OK(2, 0), QCOL_OK(2, 1)}};

#define DQINST(FMT, OK)                                                                                                \
    static int64_t dqrow_##FMT##_##OK(const uint8_t *c, int64_t K, const uint8_t *sc, int64_t gs, void *o) {           \
        return dq_row_seg(c, K, FMT, OK, sc, gs, o);                                                                   \
    }                                                                                                                  \
    static int64_t dqcols_##FMT##_##OK(const mxfp8i_dqpanel *p) { return dq_cols(p, FMT, OK); }
DQINST(0, 1)
DQINST(0, 2)
DQINST(0, 3)
DQINST(1, 1) DQINST(1, 2) DQINST(1, 3) static const dq_row_fn dq_row_tab[2][4] = {
    {NULL, dqrow_0_1, dqrow_0_2, dqrow_0_3}, {NULL, dqrow_1_1, dqrow_1_2, dqrow_1_3}};
static const dq_cols_fn dq_cols_tab[2][4] = {{NULL, dqcols_0_1, dqcols_0_2, dqcols_0_3},
                                             {NULL, dqcols_1_1, dqcols_1_2, dqcols_1_3}};

/* ---------------------------------------------------------------------------------------------------------- */
/* wrapX rows: gather a (sub)tile into group order, run 1x32, scatter back                                    */
/* ---------------------------------------------------------------------------------------------------------- */
/* tmp[j*32 + s*8 + q] <-> row[k0 + s*S + 8j + q], element size es. */
AI void wrapx_move(char *dst, const char *src, int64_t k0, int64_t P, int es, bool gather) {
    int64_t S = P / 4;
    for (int64_t j = 0; j < P / 32; j++)
        for (int s = 0; s < 4; s++) {
            char *t = (gather ? dst : (char *)src) + (j * 32 + s * 8) * es;
            char *r = (gather ? (char *)src : dst) + (k0 + s * S + 8 * j) * es;
            if (gather)
                memcpy(t, r, 8 * (size_t)es);
            else
                memcpy(r, t, 8 * (size_t)es);
        }
}
/* tmp[j*32 + s*8 + q] <-> row[k0 + s*S + 8j + q] for element sizes 1, 2, 4 (constant-size copies). */
static void wrapx_gather(const char *row, int64_t k0, int64_t P, int es, char *tmp) {
    if (es == 1)
        wrapx_move(tmp, row, k0, P, 1, true);
    else if (es == 2)
        wrapx_move(tmp, row, k0, P, 2, true);
    else
        wrapx_move(tmp, row, k0, P, 4, true);
}
static void wrapx_scatter(const char *tmp, int64_t k0, int64_t P, int es, char *row) {
    if (es == 1)
        wrapx_move(row, tmp, k0, P, 1, false);
    else if (es == 2)
        wrapx_move(row, tmp, k0, P, 2, false);
    else
        wrapx_move(row, tmp, k0, P, 4, false);
}

static int dt_index(mxfp8_dtype dt) { return dt == MXFP8_DTYPE_F32 ? 0 : dt == MXFP8_DTYPE_BF16 ? 1 : 2; }

int64_t mxfp8i_quantize_panel__avx512(const mxfp8i_qpanel *p) {
    if (!mxfp8i_is_float_dtype(p->src_dtype) || (unsigned)p->fmt > 1u || (unsigned)p->rule > 2u) return -1;
    const int ok = out_kind(p->out_dtype), fmt = (int)p->fmt;
    const int es = (int)mxfp8_dtype_size(p->src_dtype), os = out_size(ok);
    const int emax = mxfp8i_fmt(p->fmt).emax;
    qctx cx = {p->rule == MXFP8_SCALE_NKI ? emax - 1 : emax, p->rule == MXFP8_SCALE_RCEIL ? 0x7FFFFFu : 0u,
               p->rule == MXFP8_SCALE_OCP};
    const int di = dt_index(p->src_dtype);
    if (p->src_ks == 1 && p->out_ks == 1) {
        q_row_fn f = q_row_tab[di][fmt][ok];
        int64_t inexact = 0;
        for (int64_t l = 0; l < p->lines; l++) {
            const char *s = (const char *)p->src + l * p->src_ls * es;
            char *o = (char *)p->out + l * p->out_ls * os;
            uint8_t *sc = p->scales ? p->scales + l * p->sc_ls : NULL;
            if (p->group != MXFP8_GROUP_WRAPX) {
                inexact += f(s, p->K, cx, o, sc, p->sc_gs);
                continue;
            }
            _Alignas(64) char tin[512 * 4], tout[512 * 4];
            for (int64_t k0 = 0, P; k0 < p->K; k0 += P) {
                int64_t t0;
                mxfp8i_wrapx_tile_of(p->K, k0, &t0, &P);
                wrapx_gather(s, k0, P, es, tin);
                inexact += f(tin, P, cx, tout, sc ? sc + (k0 / 32) * p->sc_gs : NULL, p->sc_gs);
                wrapx_scatter(tout, k0, P, os, o);
            }
        }
        return inexact;
    }
    if (p->src_ls == 1 && p->out_ls == 1 && (!p->scales || p->sc_ls == 1)) return q_cols_tab[di][fmt][ok](p, cx);
    return -1;
}

int64_t mxfp8i_dequantize_panel__avx512(const mxfp8i_dqpanel *p) {
    const int ok = out_kind(p->out_dtype), fmt = (int)p->fmt;
    if (ok == OUT_CODES || (unsigned)p->fmt > 1u) return -1;
    const int os = out_size(ok);
    if (p->codes_ks == 1 && p->out_ks == 1) {
        dq_row_fn f = dq_row_tab[fmt][ok];
        int64_t inexact = 0;
        for (int64_t l = 0; l < p->lines; l++) {
            const uint8_t *c = p->codes + l * p->codes_ls, *sc = p->scales + l * p->sc_ls;
            char *o = (char *)p->out + l * p->out_ls * os;
            if (p->group != MXFP8_GROUP_WRAPX) {
                inexact += f(c, p->K, sc, p->sc_gs, o);
                continue;
            }
            _Alignas(64) char tin[512], tout[512 * 4];
            for (int64_t k0 = 0, P; k0 < p->K; k0 += P) {
                int64_t t0;
                mxfp8i_wrapx_tile_of(p->K, k0, &t0, &P);
                wrapx_gather((const char *)c, k0, P, 1, tin);
                inexact += f((const uint8_t *)tin, P, sc + (k0 / 32) * p->sc_gs, p->sc_gs, tout);
                wrapx_scatter(tout, k0, P, os, o);
            }
        }
        return inexact;
    }
    if (p->codes_ls == 1 && p->out_ls == 1 && p->sc_ls == 1) return dq_cols_tab[fmt][ok](p);
    return -1;
}

#else /* no AVX-512 in this build: the dispatcher falls back to the reference */
int64_t mxfp8i_quantize_panel__avx512(const mxfp8i_qpanel *p) {
    (void)p;
    return -1;
}
int64_t mxfp8i_dequantize_panel__avx512(const mxfp8i_dqpanel *p) {
    (void)p;
    return -1;
}
#endif

const mxfp8i_qkernel mxfp8i_mx_quant__avx512 = {"mx_quant_panel__avx512", "avx512", 1, MXFP8I_NEEDS_AVX512,
                                                mxfp8i_quantize_panel__avx512, mxfp8i_dequantize_panel__avx512};
