/*
 * quant_avx512_bf16.c -- BF16 -> FP8 codes (the common training case) in 16-bit integer lanes, 32 elements per
 * vector, rows and columns; exact by construction (see bf16_codes); groups with a tiny or non-finite amax fall back
 * to the FP32-lane path. Contract: quant_avx512.c. This folder is compiled with AVX-512 flags.
 */
#include "quant_lanes_avx512.h"

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
    if (!sat) /* nki/rceil: clamp |x| to codec.h's mxfp8i_elem_cap (BF16 bits 0x7F70 / 0x7F60), sign kept */
        v = _mm512_or_si512(_mm512_min_epu16(_mm512_and_si512(v, set1w(0x7FFF)), set1w(fmt == MXFP8_FMT_E5M2 ? 0x7F60 : 0x7F70)),
                            _mm512_and_si512(v, set1w(0x8000)));
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
/* BF16 -> the BF16 bits of its qdq value fp8(code) * 2^(s-127), from the same integer rounding as bf16_codes: the
 * rounded significand R = q << sh is a multiple of the FP8 grid step of x's binade, so with sh <= 7 (R in [128, 256],
 * 256 carrying into the exponent) the value's bits are (bx << 7) + R - 128; with sh >= 8 (x below half a binade of
 * the FP8 subnormal grid: q is 0 or 1) the value is 0 or the smallest FP8 subnormal, 2^(K2 - m - 127), bits
 * (K2 - m) << 7. OCP saturation clamps to max normal's bits ((emax + s) << 7 | 0x60). Zeros keep their sign (the
 * reference's -0 code gives -0.0). For s >= Q16_SMIN every value is a BF16 normal or zero. */
AI __m512i bf16_qdq(__m512i v, __m512i k2, int fmt, int sat) {
    const int m = fmt == MXFP8_FMT_E5M2 ? 2 : 3;
    if (!sat) /* nki/rceil: clamp |x| to codec.h's mxfp8i_elem_cap (BF16 bits 0x7F70 / 0x7F60), sign kept */
        v = _mm512_or_si512(_mm512_min_epu16(_mm512_and_si512(v, set1w(0x7FFF)), set1w(fmt == MXFP8_FMT_E5M2 ? 0x7F60 : 0x7F70)),
                            _mm512_and_si512(v, set1w(0x8000)));
    __m512i a = _mm512_and_si512(v, set1w(0x7FFF));
    __m512i bx = _mm512_srli_epi16(a, 7);
    __m512i sig = _mm512_ternarylogic_epi32(v, set1w(0x7F), set1w(0x80), 0xEA); /* (v & 0x7F) | 0x80 */
    __m512i d = _mm512_subs_epu16(k2, bx);
    __m512i sh = _mm512_add_epi16(d, set1w(7 - m));
    __m512i half = _mm512_srlv_epi16(set1w(0x7FFF), _mm512_sub_epi16(set1w(9 + m), d));
    __m512i lsb = _mm512_and_si512(_mm512_srlv_epi16(sig, sh), set1w(1));
    __m512i q = _mm512_srlv_epi16(_mm512_add_epi16(_mm512_add_epi16(sig, half), lsb), sh);
    __m512i small = _mm512_sub_epi16(_mm512_add_epi16(_mm512_slli_epi16(bx, 7), _mm512_sllv_epi16(q, sh)), set1w(128));
    __m512i big = _mm512_maskz_mov_epi16(_mm512_test_epi16_mask(q, q), _mm512_slli_epi16(_mm512_sub_epi16(k2, set1w(m)), 7));
    __m512i r = _mm512_mask_mov_epi16(small, _mm512_cmpgt_epu16_mask(sh, set1w(7)), big);
    if (sat) {
        const int span = fmt == MXFP8_FMT_E5M2 ? 29 : 14; /* emax - emin */
        r = _mm512_min_epu16(r, _mm512_or_si512(_mm512_slli_epi16(_mm512_add_epi16(k2, set1w(span)), 7), set1w(0x60)));
    }
    return _mm512_ternarylogic_epi32(r, v, set1w(0x8000), 0xF8); /* r | (v & 0x8000) */
}

/* Two vectors of 16-bit codes -> 64 bytes in order. */
AI __m512i pack_codes2(__m512i c0, __m512i c1) {
    return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), _mm512_packus_epi16(c0, c1));
}

/* The FP32 path for BF16 -> codes (slow groups, tails), out of line: it is rare, and inlining it here once made
 * GCC 12 fail (internal compiler error vectorizing ref_elems). */
__attribute__((noinline)) static int64_t q_row_bf16c_fp32(const void *src, int64_t K, int fmt, int ok, qctx cx,
                                                          void *out, uint8_t *sc, int64_t sc_gs) {
    if (ok == OUT_BF16)
        return fmt == MXFP8_FMT_E5M2 ? q_row_seg(src, MXFP8_DTYPE_BF16, K, MXFP8_FMT_E5M2, OUT_BF16, cx, out, sc, sc_gs)
                                     : q_row_seg(src, MXFP8_DTYPE_BF16, K, MXFP8_FMT_E4M3, OUT_BF16, cx, out, sc, sc_gs);
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

/* Rows, BF16 -> codes (ok = OUT_CODES) or BF16 qdq values (OUT_BF16): up to 16 whole groups per batch (amax by a
 * 16-bit max + the transposing tree, then the 16-bit codes or values; a batch of ng < 16 groups, at the end of the
 * row, gives the tree zero vectors for the missing ones and stores only its own); a last partial group through the
 * FP32 path. */
AI int64_t q_row_bf16c(const void *src, int64_t K, int fmt, int ok, qctx cx, void *out, uint8_t *sc, int64_t sc_gs) {
    const __m512i rcm = set1(cx.rceil);
    const int emin = fmt == MXFP8_FMT_E5M2 ? -14 : -6, os = ok == OUT_BF16 ? 2 : 1;
    const int64_t G = K / 32; /* whole groups */
    int64_t inexact = 0;
    for (int64_t g0 = 0; g0 < G; g0 += 16) {
        const int ng = G - g0 < 16 ? (int)(G - g0) : 16;
        const char *s0 = (const char *)src + g0 * 64;
        uint8_t *o0 = (uint8_t *)out + g0 * 32 * os;
        __m512i mm[16];
        for (int j = 0; j < 16; j++)
            mm[j] = j < ng ? _mm512_and_si512(_mm512_loadu_si512(s0 + 64 * j), set1w(0x7FFF)) : _mm512_setzero_si512();
        __m512i s = scale_codes(reduce16_w(mm), cx.d, rcm);
        const __mmask16 live = (__mmask16)((1u << ng) - 1u); /* ng <= 16: 32-bit shift */
        if (sc) {
            __m128i sb = _mm512_cvtepi32_epi8(s);
            if (sc_gs == 1) _mm_mask_storeu_epi8(sc + g0, live, sb);
            else {
                _Alignas(16) uint8_t t[16];
                _mm_store_si128((__m128i *)t, sb);
                for (int j = 0; j < ng; j++) sc[(g0 + j) * sc_gs] = t[j];
            }
        }
        __mmask16 slow = _mm512_cmpge_epu32_mask(_mm512_sub_epi32(s, set1(Q16_SMIN)), set1(255 - Q16_SMIN)) & live;
        __m512i k2v = _mm512_add_epi32(s, set1((uint32_t)emin));
        _Alignas(64) int32_t k2[16]; /* K2 in both halves of each dword: broadcast by a plain load per group */
        _mm512_store_si512(k2, _mm512_or_si512(k2v, _mm512_slli_epi32(k2v, 16)));
        if (!slow && ok == OUT_BF16) {
            for (int j = 0; j < ng; j++)
                _mm512_storeu_si512(o0 + 64 * j,
                                    bf16_qdq(_mm512_loadu_si512(s0 + 64 * j), _mm512_set1_epi32(k2[j]), fmt, cx.sat));
            continue;
        }
        if (!slow) {
            int j = 0;
            for (; j + 1 < ng; j += 2) {
                __m512i c0 = bf16_codes(_mm512_loadu_si512(s0 + 64 * j), _mm512_set1_epi32(k2[j]), fmt, cx.sat);
                __m512i c1 = bf16_codes(_mm512_loadu_si512(s0 + 64 * j + 64), _mm512_set1_epi32(k2[j + 1]), fmt, cx.sat);
                _mm512_storeu_si512(o0 + 32 * j, pack_codes2(c0, c1));
            }
            if (j < ng)
                _mm256_storeu_si256((__m256i *)(o0 + 32 * j),
                                    _mm512_cvtepi16_epi8(bf16_codes(_mm512_loadu_si512(s0 + 64 * j),
                                                                    _mm512_set1_epi32(k2[j]), fmt, cx.sat)));
            continue;
        }
        for (int j = 0; j < ng; j++) {
            if ((slow >> j) & 1) {
                inexact += q_row_bf16c_fp32(s0 + 64 * j, 32, fmt, ok, cx, o0 + 32 * os * j, NULL, 1);
                continue;
            }
            __m512i v = _mm512_loadu_si512(s0 + 64 * j), k = _mm512_set1_epi32(k2[j]);
            if (ok == OUT_BF16) _mm512_storeu_si512(o0 + 64 * j, bf16_qdq(v, k, fmt, cx.sat));
            else _mm256_storeu_si256((__m256i *)(o0 + 32 * j), _mm512_cvtepi16_epi8(bf16_codes(v, k, fmt, cx.sat)));
        }
    }
    if (G * 32 < K)
        inexact += q_row_bf16c_fp32((const char *)src + G * 64, K - G * 32, fmt, ok, cx, (uint8_t *)out + G * 32 * os,
                                    sc ? sc + G * sc_gs : NULL, sc_gs);
    return inexact;
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
AI int64_t q_cols_bf16c(const mxfp8i_qpanel *p, int fmt, int ok, qctx cx) {
    const int64_t C = p->lines, K = p->K, G = mxfp8i_ceil_div(K, 32);
    const int emin = fmt == MXFP8_FMT_E5M2 ? -14 : -6, os = ok == OUT_BF16 ? 2 : 1;
    int64_t inexact = 0;
    const char *src = (const char *)p->src;
    uint8_t *out = (uint8_t *)p->out;
    int64_t idx[32], nidx[32];
    _Alignas(64) __m512i acc[CT16 / 32], k2[CT16 / 32];
    uint32_t slow[CT16 / 32];
    /* Codes of a panel larger than L2 are written with streaming stores (64-byte aligned full lines): no read for
     * ownership, and the next group's prefetched rows are not evicted by output lines (4096^2 BF16 cols, 1 thread:
     * 4.0-4.2 -> 3.15-3.4 ms). Smaller outputs are likely read again soon, from cache: ordinary stores. The rows
     * kernel keeps ordinary stores (streaming measured slower there: 2.8 -> 3.2 ms). */
    const bool stream = C * K * os >= ((int64_t)2 << 20);
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
                uint8_t *o = out + (idx[i] * p->out_ks + c0) * os;
                const bool nt_ok = stream && ((uintptr_t)o & 63) == 0;
                const char *nrow = i < pn ? (const char *)((const uint16_t *)src + pidx[i] * p->src_ks + c2) : NULL;
                int ch = 0;
                if (!any_slow) {
                    for (; ch + 2 <= nch - 1; ch += 2) {
                        if (nrow && ch + 1 < nch2) {
                            _mm_prefetch(nrow + 64 * ch, PFH);
                            _mm_prefetch(nrow + 64 * ch + 64, PFH);
                        }
                        if (ok == OUT_BF16) {
                            __m512i w0 = bf16_qdq(_mm512_loadu_si512(row + 32 * ch), k2[ch], fmt, cx.sat);
                            __m512i w1 = bf16_qdq(_mm512_loadu_si512(row + 32 * ch + 32), k2[ch + 1], fmt, cx.sat);
                            if (nt_ok) {
                                _mm512_stream_si512((__m512i *)(o + 64 * ch), w0);
                                _mm512_stream_si512((__m512i *)(o + 64 * ch + 64), w1);
                            } else {
                                _mm512_storeu_si512(o + 64 * ch, w0);
                                _mm512_storeu_si512(o + 64 * ch + 64, w1);
                            }
                            continue;
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
                    if (ok == OUT_BF16) _mm512_mask_storeu_epi16(o + 64 * ch, m, bf16_qdq(v, k2[ch], fmt, cx.sat));
                    else _mm256_mask_storeu_epi8(o + 32 * ch, m, _mm512_cvtepi16_epi8(bf16_codes(v, k2[ch], fmt, cx.sat)));
                }
            }
            if (any_slow)
                for (int ch = 0; ch < nch; ch++)
                    if (slow[ch]) {
                        __m512i z = _mm512_setzero_si512();
                        inexact += cols_chunk(p, MXFP8_DTYPE_BF16, fmt, ok, cx, g, idx, n, c0 + 32 * ch,
                                              ch == nch - 1 ? lastn : 32, _mm512_unpacklo_epi16(z, acc[ch]),
                                              _mm512_unpackhi_epi16(z, acc[ch]));
                    }
        }
    }
    if (stream) _mm_sfence(); /* order the streaming stores before the caller's (and other threads') reads */
    return inexact;
}
#undef CT16

#define BF16C_INST(FMT)                                                                                                \
    int64_t mxfp8i_qrow_bf16c_##FMT(const void *s, int64_t K, qctx cx, void *o, uint8_t *sc, int64_t gs) {            \
        return q_row_bf16c(s, K, FMT, OUT_CODES, cx, o, sc, gs);                                                       \
    }                                                                                                                  \
    int64_t mxfp8i_qrow_bf16v_##FMT(const void *s, int64_t K, qctx cx, void *o, uint8_t *sc, int64_t gs) {            \
        return q_row_bf16c(s, K, FMT, OUT_BF16, cx, o, sc, gs);                                                        \
    }                                                                                                                  \
    int64_t mxfp8i_qcols_bf16c_##FMT(const mxfp8i_qpanel *p, qctx cx) { return q_cols_bf16c(p, FMT, OUT_CODES, cx); } \
    int64_t mxfp8i_qcols_bf16v_##FMT(const mxfp8i_qpanel *p, qctx cx) { return q_cols_bf16c(p, FMT, OUT_BF16, cx); }
BF16C_INST(0)
BF16C_INST(1)
