/*
 * quant_avx512_x.c -- AVX-512 quantize panels with the extras of src/kernels/qpanel.h: stochastic rounding (sr) and
 * statistics (stats), for 1x32 rows, 1x32 / wrapX columns, F32/BF16/F16 sources, every output; the plain (RNE, no
 * statistics) panels stay in quant_avx512.c untouched. Contract: quant_avx512.c's file comment; bit-identical to the
 * reference (src/kernels/ref/quant_ref.c), statistics included.
 *
 *  - Philox-4x32-10 runs in 16 lanes: where the logical indices of a block step by 1 (the usual rows and columns), one
 *    call yields the words of 64 consecutive indices, transposed into index order and cached; other steps compute
 *    each lane's counter.
 *  - Stochastic rounding of |y| on the FP8 grid of binade E: with C = 2^(E + 23 - m) (the magic constant of RNE),
 *    t = |y| + C rounded toward zero gives lo = t - C exactly; d = |y| - lo is exact (Sterbenz, or lo = 0), and
 *    d * 2^(32 - (E - m)) is exact and < 2^32, so its truncation is floor(2^32 * fraction) as the reference computes
 *    it in integers; the code is bits(t) - bits(C) + (E - emin) << m, plus one when the word is below it.
 *  - Blocks are put in natural element order first (BF16 loads come in the unpack order), so words, signs, codes and
 *    statistics line up with the reference's member order. Statistics follow qstats.h: counts are popcounts; the
 *    group sums of squares are the canonical FP32 tree, reached with a group in two 16-lane vectors (rows) or with
 *    one lane per group and sixteen partial sums per lane (columns).
 *  - Groups holding a NaN or Inf go through the reference (mxfp8i_quantize_line_group_ref), whole.
 */
#include "../../format/philox.h"
#include "quant_lanes_avx512.h"

/* ---------------------------------------------------------------------------------------------------------- */
/* Philox-4x32-10 in 16 lanes                                                                                 */
/* ---------------------------------------------------------------------------------------------------------- */
AI void mulhilo16(__m512i a, uint32_t M, __m512i *hi, __m512i *lo) {
    const __m512i m = set1(M);
    __m512i pe = _mm512_mul_epu32(a, m), po = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
    *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(pe, 32), po);
    *lo = _mm512_mask_blend_epi32(0xAAAA, pe, _mm512_slli_epi64(po, 32));
}
AI void philox16(__m512i c0, __m512i c1, __m512i c2, __m512i c3, uint32_t k0, uint32_t k1, __m512i o[4]) {
    for (int r = 0; r < 10; r++) {
        if (r) {
            k0 += MXFP8I_PHILOX_W0;
            k1 += MXFP8I_PHILOX_W1;
        }
        __m512i hi0, lo0, hi1, lo1;
        mulhilo16(c0, MXFP8I_PHILOX_M0, &hi0, &lo0);
        mulhilo16(c2, MXFP8I_PHILOX_M1, &hi1, &lo1);
        c0 = _mm512_ternarylogic_epi32(hi1, c1, set1(k0), 0x96);
        c2 = _mm512_ternarylogic_epi32(hi0, c3, set1(k1), 0x96);
        c1 = lo1;
        c3 = lo0;
    }
    o[0] = c0, o[1] = c1, o[2] = c2, o[3] = c3;
}

typedef struct xctx {
    const mxfp8i_qpanel *p;
    uint32_t k0, k1, t0, t1; /* key and stream words */
    mxfp8i_qstats *st;
    mxfp8i_xbucket *xe, *xs; /* the fronts of st->err, st->sig */
    int64_t rbase;           /* rw holds the words of indices [rbase, rbase + 64); -1: empty */
    _Alignas(64) uint32_t rw[64];
} xctx;

/* Words of the 64 indices [4q, 4q + 64) into x->rw, in index order. */
static void fill64(xctx *x, uint64_t q) {
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i lo = _mm512_add_epi32(set1((uint32_t)q), iota);
    __mmask16 cy = _mm512_cmplt_epu32_mask(lo, set1((uint32_t)q));
    __m512i hi = _mm512_mask_add_epi32(set1((uint32_t)(q >> 32)), cy, set1((uint32_t)(q >> 32)), set1(1));
    __m512i o[4];
    philox16(lo, hi, set1(x->t0), set1(x->t1), x->k0, x->k1, o);
    /* o[w][L] is the word w of counter q + L, i.e. of index 4(q + L) + w: a 4 x 16 transpose */
    __m512i t0 = _mm512_unpacklo_epi32(o[0], o[1]), t1 = _mm512_unpackhi_epi32(o[0], o[1]);
    __m512i t2 = _mm512_unpacklo_epi32(o[2], o[3]), t3 = _mm512_unpackhi_epi32(o[2], o[3]);
    __m512i u0 = _mm512_unpacklo_epi64(t0, t2), u1 = _mm512_unpackhi_epi64(t0, t2);
    __m512i u2 = _mm512_unpacklo_epi64(t1, t3), u3 = _mm512_unpackhi_epi64(t1, t3);
    __m512i x0 = _mm512_shuffle_i32x4(u0, u1, 0x44), x1 = _mm512_shuffle_i32x4(u2, u3, 0x44);
    __m512i x2 = _mm512_shuffle_i32x4(u0, u1, 0xEE), x3 = _mm512_shuffle_i32x4(u2, u3, 0xEE);
    _mm512_store_si512(x->rw, _mm512_shuffle_i32x4(x0, x1, 0x88));
    _mm512_store_si512(x->rw + 16, _mm512_shuffle_i32x4(x0, x1, 0xDD));
    _mm512_store_si512(x->rw + 32, _mm512_shuffle_i32x4(x2, x3, 0x88));
    _mm512_store_si512(x->rw + 48, _mm512_shuffle_i32x4(x2, x3, 0xDD));
    x->rbase = (int64_t)(q * 4);
}

/* Words of 16 lanes with indices base + j*step (j < 16), each lane its own counter (AVX-512F only: no DQ). */
static __m512i words16(const xctx *x, int64_t base, int64_t step) {
    _Alignas(64) int64_t ix[16];
    for (int j = 0; j < 16; j++) ix[j] = base + j * step;
    __m512i ia = _mm512_load_si512(ix), ib = _mm512_load_si512(ix + 8);
    __m512i qa = _mm512_srli_epi64(ia, 2), qb = _mm512_srli_epi64(ib, 2);
    __m512i lo = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(qa)), _mm512_cvtepi64_epi32(qb), 1);
    __m512i hi = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(_mm512_srli_epi64(qa, 32))),
                                    _mm512_cvtepi64_epi32(_mm512_srli_epi64(qb, 32)), 1);
    __m512i sel = _mm512_and_si512(
        _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(ia)), _mm512_cvtepi64_epi32(ib), 1), set1(3));
    __m512i o[4];
    philox16(lo, hi, set1(x->t0), set1(x->t1), x->k0, x->k1, o);
    __m512i w = o[0];
    w = _mm512_mask_mov_epi32(w, _mm512_cmpeq_epi32_mask(sel, set1(1)), o[1]);
    w = _mm512_mask_mov_epi32(w, _mm512_cmpeq_epi32_mask(sel, set1(2)), o[2]);
    return _mm512_mask_mov_epi32(w, _mm512_cmpeq_epi32_mask(sel, set1(3)), o[3]);
}

/* The words of the 32 elements with indices base + j*step, natural order (r[0]: j < 16, r[1]: j >= 16). */
static void words32(xctx *x, int64_t base, int64_t step, __m512i r[2]) {
    if (step != 1) {
        r[0] = words16(x, base, step);
        r[1] = words16(x, base + 16 * step, step);
        return;
    }
    if (x->rbase < 0 || base < x->rbase || base + 32 > x->rbase + 64) fill64(x, (uint64_t)base >> 2);
    r[0] = _mm512_loadu_si512(x->rw + (base - x->rbase));
    r[1] = _mm512_loadu_si512(x->rw + (base - x->rbase) + 16);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* One block of 32 elements, natural order                                                                    */
/* ---------------------------------------------------------------------------------------------------------- */
/* BF16 blocks arrive in the unpack order (quant_lanes_avx512.h): put them in natural order. */
AI void natural32(int dt, __m512 *lo, __m512 *hi) {
    if (!unpack_order(dt)) return;
    __m512 a = *lo, b = *hi;
    *lo = _mm512_permutex2var_ps(a, _mm512_loadu_si512(F32_FROM_UNPACK), b);
    *hi = _mm512_permutex2var_ps(a, _mm512_loadu_si512(F32_FROM_UNPACK + 16), b);
}

/* What a block adds to the statistics: counts (lane masks) and the FP32 terms of its 32 elements (qstats.h). */
typedef struct xterms {
    __m512 te[2], ts[2];
    __mmask32 sat, flush, sub;
} xterms;

/* Half a block: a = |x| * inv, its code and rounded magnitude r (RNE, or stochastic with the words rnd). */
AI __m512i half_codes(__m512 ax, __m512 inv, int fmt, int sat, const __m512i *rnd, __m512 *r, __m512 *y,
                      __mmask16 *satm) {
    const int sh = fmt == MXFP8_FMT_E5M2 ? 21 : 20;                       /* 23 - m */
    const uint32_t k = fmt == MXFP8_FMT_E5M2 ? (134u << 2) : (141u << 3); /* (23 - m + emin + 127) << m */
    __m512 a = _mm512_mul_ps(ax, inv);
    *y = a;
    *satm = _mm512_cmp_ps_mask(a, set1f_bits(f_maxn(fmt)), _CMP_GT_OQ);
    if (sat) a = _mm512_min_ps(a, set1f_bits(f_maxn(fmt)));
    else { /* nki/rceil: the top-scale clamp of codec.h's mxfp8i_elem_cap (counted as saturated) */
        const __m512 cap = _mm512_set1_ps(mxfp8i_elem_cap(fmt));
        *satm |= _mm512_cmp_ps_mask(ax, cap, _CMP_GT_OQ);
        a = _mm512_mul_ps(_mm512_min_ps(ax, cap), inv);
    }
    __m512i Ci = rne_magic(a, fmt);
    __m512 C = _mm512_castsi512_ps(Ci);
    __m512i base = _mm512_sub_epi32(_mm512_srli_epi32(Ci, sh), set1(k)); /* (E - emin) << m */
    if (!rnd) {
        __m512 s = _mm512_add_ps(a, C);
        *r = _mm512_sub_ps(s, C);
        return _mm512_add_epi32(_mm512_sub_epi32(_mm512_castps_si512(s), Ci), base);
    }
    __m512 t = _mm512_add_round_ps(a, C, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m512 lo = _mm512_sub_ps(t, C), d = _mm512_sub_ps(a, lo);
    /* 2^(32 - (E - m)): exponent field 127 + 32 - (E - m) = 309 - field(C); ulp = 2^(E - m): field(C) - 23 */
    __m512i cf = _mm512_srli_epi32(Ci, 23);
    __m512 f2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(set1(309), cf), 23));
    __m512 ulp = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(cf, set1(23)), 23));
    __m512i F = _mm512_cvttps_epu32(_mm512_mul_ps(d, f2));
    __mmask16 up = _mm512_cmplt_epu32_mask(*rnd, F);
    *r = _mm512_mask_add_ps(lo, up, lo, ulp);
    __m512i c = _mm512_add_epi32(_mm512_sub_epi32(_mm512_castps_si512(t), Ci), base);
    return _mm512_mask_add_epi32(c, up, c, set1(1));
}

/* Quantize one block (magnitudes lo/hi, signs, natural order) with per-lane multipliers and scale values; store the
 * lanes of `m` (codes, or qdq values with the reference's rounding to BF16/F16); fill *xt when not NULL. Returns the
 * BF16/F16-inexact count of the stored lanes. */
AI int64_t block_x(int fmt, int ok, int sat, __m512 lo, __m512 hi, __mmask32 sign, __m512 ilo, __m512 ihi, __m512 svlo,
                   __m512 svhi, const __m512i *rnd, __mmask32 m, char *o, xterms *xt) {
    const bool full = m == 0xFFFFFFFFu;
    __m512 rl, rh, yl, yh;
    __mmask16 sl, shm;
    __m512i cl = half_codes(lo, ilo, fmt, sat, rnd ? rnd : NULL, &rl, &yl, &sl);
    __m512i ch = half_codes(hi, ihi, fmt, sat, rnd ? rnd + 1 : NULL, &rh, &yh, &shm);
    int64_t inexact = 0;
    if (ok == OUT_CODES) {
        __m256i c = pack_bytes(cl, ch, MXFP8_DTYPE_F32);
        c = _mm256_mask_mov_epi8(c, sign, _mm256_or_si256(c, _mm256_set1_epi8((char)0x80)));
        if (full)
            _mm256_storeu_si256((__m256i *)o, c);
        else
            _mm256_mask_storeu_epi8(o, m, c);
    } else {
        __m512 vl = _mm512_mul_ps(rl, svlo), vh = _mm512_mul_ps(rh, svhi);
        vl = _mm512_castsi512_ps(_mm512_mask_or_epi32(_mm512_castps_si512(vl), (__mmask16)sign,
                                                      _mm512_castps_si512(vl), set1(0x80000000u)));
        vh = _mm512_castsi512_ps(_mm512_mask_or_epi32(_mm512_castps_si512(vh), (__mmask16)(sign >> 16),
                                                      _mm512_castps_si512(vh), set1(0x80000000u)));
        inexact = store_vals(o, ok, vl, vh, m, full);
    }
    if (xt) {
        const __m512 z = _mm512_setzero_ps(), emin = set1f_bits(fmt == MXFP8_FMT_E5M2 ? 0x38800000u : 0x3C800000u);
        __mmask16 zl = _mm512_cmp_ps_mask(rl, z, _CMP_EQ_OQ), zh = _mm512_cmp_ps_mask(rh, z, _CMP_EQ_OQ);
        __mmask16 nl = _mm512_cmp_ps_mask(lo, z, _CMP_NEQ_OQ), nh = _mm512_cmp_ps_mask(hi, z, _CMP_NEQ_OQ);
        __mmask16 bl = _mm512_cmp_ps_mask(rl, emin, _CMP_LT_OQ), bh = _mm512_cmp_ps_mask(rh, emin, _CMP_LT_OQ);
        xt->sat = (uint32_t)sl | ((uint32_t)shm << 16);
        xt->flush = (uint32_t)(nl & zl) | ((uint32_t)(nh & zh) << 16);
        xt->sub = (uint32_t)(bl & ~zl) | ((uint32_t)(bh & ~zh) << 16);
        __m512 dl = _mm512_sub_ps(yl, rl), dh = _mm512_sub_ps(yh, rh);
        xt->te[0] = _mm512_mul_ps(dl, dl), xt->te[1] = _mm512_mul_ps(dh, dh);
        xt->ts[0] = _mm512_mul_ps(yl, yl), xt->ts[1] = _mm512_mul_ps(yh, yh);
    }
    return inexact;
}

/* The canonical tree (qstats.h) from P (16 lanes): Q_L = P_L + P_(L+8), R_L = Q_L + Q_(L+4), S_L = R_L + R_(L+2),
 * sum = S_0 + S_1 (lane 0). */
AI float tree16(__m512 P) {
    __m512 Q = _mm512_add_ps(P, _mm512_shuffle_f32x4(P, P, 0x4E));
    __m512 R = _mm512_add_ps(Q, _mm512_shuffle_f32x4(Q, Q, 0xB1));
    __m512 S = _mm512_add_ps(R, _mm512_permute_ps(R, 0x4E));
    return _mm512_cvtss_f32(_mm512_add_ps(S, _mm512_permute_ps(S, 0xB1)));
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Rows (1x32): one group at a time                                                                           */
/* ---------------------------------------------------------------------------------------------------------- */
AI int64_t q_row_x(xctx *x, int64_t l, int dt, int fmt, int ok, qctx cx) {
    const mxfp8i_qpanel *p = x->p;
    const int es = dt == MXFP8_DTYPE_F32 ? 4 : 2, os = out_size(ok);
    const int64_t K = p->K, G = mxfp8i_ceil_div(K, 32);
    const char *src = (const char *)p->src + l * p->src_ls * es;
    char *out = (char *)p->out + l * p->out_ls * os;
    uint8_t *sc = p->scales ? p->scales + l * p->sc_ls : NULL;
    const int64_t ib = p->sr.idx0 + l * p->sr.i_ls;
    int64_t inexact = 0, nsat = 0, nflush = 0, nsub = 0; /* counted locally, added to x->st once */
    for (int64_t g = 0; g < G; g++) {
        const int n = K - g * 32 >= 32 ? 32 : (int)(K - g * 32);
        const __mmask32 m = tail_mask(n);
        __m512 lo, hi;
        __mmask32 sign;
        load_abs32(src + g * 32 * es, dt, m, n == 32, &lo, &hi, &sign);
        __m512i amax = hmax(_mm512_max_epu32(_mm512_castps_si512(lo), _mm512_castps_si512(hi)));
        __m512i s = scale_codes(amax, cx.d, set1(cx.rceil));
        const uint8_t s8 = (uint8_t)_mm_cvtsi128_si32(_mm512_castsi512_si128(s));
        if (s8 == 255) {
            inexact += mxfp8i_quantize_line_group_ref(p, l, g);
            continue;
        }
        if (sc) sc[g * p->sc_gs] = s8;
        natural32(dt, &lo, &hi);
        __m512i rnd[2];
        if (p->sr.on) words32(x, ib + g * 32 * p->sr.i_ks, p->sr.i_ks, rnd);
        const __m512 inv = inv_scale(s), sv = scale_value(s);
        xterms xt;
        inexact += block_x(fmt, ok, cx.sat, lo, hi, sign, inv, inv, sv, sv, p->sr.on ? rnd : NULL, m,
                           out + g * 32 * os, x->st ? &xt : NULL);
        if (!x->st) continue;
        mxfp8i_qstats *st = x->st;
        st->elements += n;
        st->hist[s8]++;
        if (_mm_cvtsi128_si32(_mm512_castsi512_si128(amax)) == 0) {
            st->zero_groups++;
            continue;
        }
        nsat += __builtin_popcount(xt.sat);
        nflush += __builtin_popcount(xt.flush);
        nsub += __builtin_popcount(xt.sub);
        mxfp8i_xbucket_add(x->xe, mxfp8i_qstats_unscale(tree16(_mm512_add_ps(xt.te[0], xt.te[1])), s8));
        mxfp8i_xbucket_add(x->xs, mxfp8i_qstats_unscale(tree16(_mm512_add_ps(xt.ts[0], xt.ts[1])), s8));
    }
    if (x->st) x->st->saturated += nsat, x->st->flushed += nflush, x->st->subnormal += nsub;
    return inexact;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Columns (1x32 or wrapX): one lane per group                                                                */
/* ---------------------------------------------------------------------------------------------------------- */
/* Per group, tiles of CTX columns: pass 1 folds |x| bits into per-column amax; scales (natural order); pass 2
 * quantizes each member row, adding each lane's terms to the partial sum P_(i mod 16) of its group; then each lane's
 * tree is summed. Lanes of NaN/Inf groups are skipped in pass 2 and redone by the reference. */
#define CTX 128
AI void cols_scales(int dt, qctx cx, __m512i alo, __m512i ahi, int nc, uint8_t *s8, __m512 *inv, __m512 *sv,
                    __mmask32 *valid, __mmask32 *zero) {
    __m512 al = _mm512_castsi512_ps(alo), ah = _mm512_castsi512_ps(ahi);
    natural32(dt, &al, &ah);
    const __m512i rcm = set1(cx.rceil), z = _mm512_setzero_si512();
    __m512i slo = scale_codes(_mm512_castps_si512(al), cx.d, rcm);
    __m512i shi = scale_codes(_mm512_castps_si512(ah), cx.d, rcm);
    __m256i sb = pack_bytes(slo, shi, MXFP8_DTYPE_F32);
    _mm256_store_si256((__m256i *)s8, sb);
    const __mmask32 tm = tail_mask(nc);
    *valid = tm & ~_mm256_cmpeq_epi8_mask(sb, _mm256_set1_epi8(-1));
    *zero = *valid & ((uint32_t)_mm512_cmpeq_epi32_mask(_mm512_castps_si512(al), z) |
                      ((uint32_t)_mm512_cmpeq_epi32_mask(_mm512_castps_si512(ah), z) << 16));
    inv[0] = inv_scale(slo), inv[1] = inv_scale(shi), sv[0] = scale_value(slo), sv[1] = scale_value(shi);
}

/* Statistics of the groups of one 32-column chunk after pass 2, from the partial sums P[16][2] of its lanes (P_L of
 * lanes 0-15 in P[L][0], of lanes 16-31 in P[L][1]): the rest of the canonical tree, lane by lane. */
AI __m512 tree_lanes(__m512 P[16][2], int v) {
    __m512 Q[8], R[4];
    for (int L = 0; L < 8; L++) Q[L] = _mm512_add_ps(P[L][v], P[L + 8][v]);
    for (int L = 0; L < 4; L++) R[L] = _mm512_add_ps(Q[L], Q[L + 4]);
    return _mm512_add_ps(_mm512_add_ps(R[0], R[2]), _mm512_add_ps(R[1], R[3]));
}
static void cols_chunk_stats(xctx *x, int n, const uint8_t *s8, __mmask32 valid, __mmask32 zero,
                             __m512 pe[16][2], __m512 ps[16][2]) {
    _Alignas(64) float se[32], ss[32];
    mxfp8i_qstats *st = x->st;
    for (int v = 0; v < 2; v++) {
        _mm512_store_ps(se + 16 * v, tree_lanes(pe, v));
        _mm512_store_ps(ss + 16 * v, tree_lanes(ps, v));
    }
    for (int j = 0; j < 32; j++) {
        if (!((valid >> j) & 1)) continue;
        st->elements += n;
        st->hist[s8[j]]++;
        if ((zero >> j) & 1) st->zero_groups++;
        else {
            mxfp8i_xbucket_add(x->xe, mxfp8i_qstats_unscale(se[j], s8[j]));
            mxfp8i_xbucket_add(x->xs, mxfp8i_qstats_unscale(ss[j], s8[j]));
        }
    }
}

AI int64_t q_cols_x(xctx *x, int dt, int fmt, int ok, qctx cx) {
    const mxfp8i_qpanel *p = x->p;
    mxfp8i_qstats *st = x->st;
    const int es = dt == MXFP8_DTYPE_F32 ? 4 : 2, os = out_size(ok);
    const int64_t C = p->lines, K = p->K, G = mxfp8i_ceil_div(K, 32);
    const char *src = (const char *)p->src;
    char *out = (char *)p->out;
    int64_t inexact = 0, idx[32], nsat = 0, nflush = 0, nsub = 0;
    _Alignas(64) __m512i acc[CTX / 16];
    _Alignas(64) __m512 inv[CTX / 16], sv[CTX / 16];
    _Alignas(64) uint8_t s8[CTX];
    _Alignas(64) __m512 pe[CTX / 32][16][2], ps[CTX / 32][16][2];
    __mmask32 valid[CTX / 32], zero[CTX / 32];
    __m512 lo, hi;
    __mmask32 sign;
    for (int64_t g = 0; g < G; g++) {
        const int n = mxfp8i_group_members(K, p->group, g, idx);
        for (int64_t c0 = 0; c0 < C; c0 += CTX) {
            const int W = C - c0 >= CTX ? CTX : (int)(C - c0), nch = (W + 31) / 32, lastn = W - 32 * (nch - 1);
            for (int v = 0; v < 2 * nch; v++) acc[v] = _mm512_setzero_si512();
            for (int i = 0; i < n; i++) {
                const char *row = src + (idx[i] * p->src_ks + c0) * es;
                for (int ch = 0; ch < nch; ch++) {
                    const int nc = ch == nch - 1 ? lastn : 32;
                    load_abs32(row + 32 * ch * es, dt, tail_mask(nc), nc == 32, &lo, &hi, &sign);
                    acc[2 * ch] = _mm512_max_epu32(acc[2 * ch], _mm512_castps_si512(lo));
                    acc[2 * ch + 1] = _mm512_max_epu32(acc[2 * ch + 1], _mm512_castps_si512(hi));
                }
            }
            for (int ch = 0; ch < nch; ch++)
                cols_scales(dt, cx, acc[2 * ch], acc[2 * ch + 1], ch == nch - 1 ? lastn : 32, s8 + 32 * ch,
                            inv + 2 * ch, sv + 2 * ch, &valid[ch], &zero[ch]);
            if (p->scales) memcpy(p->scales + g * p->sc_gs + c0, s8, (size_t)W);
            if (st) memset(pe, 0, sizeof pe), memset(ps, 0, sizeof ps);
            for (int i = 0; i < n; i++) {
                const char *row = src + (idx[i] * p->src_ks + c0) * es;
                char *o = out + (idx[i] * p->out_ks + c0) * os;
                const int64_t ib = p->sr.idx0 + c0 * p->sr.i_ls + idx[i] * p->sr.i_ks;
                for (int ch = 0; ch < nch; ch++) {
                    if (!valid[ch]) continue;
                    const int nc = ch == nch - 1 ? lastn : 32;
                    load_abs32(row + 32 * ch * es, dt, tail_mask(nc), nc == 32, &lo, &hi, &sign);
                    natural32(dt, &lo, &hi);
                    __m512i rnd[2];
                    if (p->sr.on) words32(x, ib + 32 * ch * p->sr.i_ls, p->sr.i_ls, rnd);
                    xterms xt;
                    inexact += block_x(fmt, ok, cx.sat, lo, hi, sign, inv[2 * ch], inv[2 * ch + 1], sv[2 * ch],
                                       sv[2 * ch + 1], p->sr.on ? rnd : NULL, valid[ch], o + 32 * ch * os,
                                       st ? &xt : NULL);
                    if (!st) continue;
                    nsat += __builtin_popcount(xt.sat & valid[ch]);
                    nflush += __builtin_popcount(xt.flush & valid[ch]);
                    nsub += __builtin_popcount(xt.sub & valid[ch]);
                    for (int v = 0; v < 2; v++) { /* P_(i mod 16) += t_i: members i and i + 16 */
                        pe[ch][i & 15][v] = _mm512_add_ps(pe[ch][i & 15][v], xt.te[v]);
                        ps[ch][i & 15][v] = _mm512_add_ps(ps[ch][i & 15][v], xt.ts[v]);
                    }
                }
            }
            for (int ch = 0; ch < nch; ch++) {
                if (st) cols_chunk_stats(x, n, s8 + 32 * ch, valid[ch], zero[ch], pe[ch], ps[ch]);
                const __mmask32 nf = tail_mask(ch == nch - 1 ? lastn : 32) & ~valid[ch];
                for (int j = 0; j < 32; j++)
                    if ((nf >> j) & 1) inexact += mxfp8i_quantize_line_group_ref(p, c0 + 32 * ch + j, g);
            }
        }
    }
    if (st) st->saturated += nsat, st->flushed += nflush, st->subnormal += nsub;
    return inexact;
}
#undef CTX

/* ---------------------------------------------------------------------------------------------------------- */
/* Instantiation and dispatch                                                                                  */
/* ---------------------------------------------------------------------------------------------------------- */
typedef int64_t (*qx_fn)(xctx *, qctx);
#define XINST(DT, FMT, OK)                                                                                             \
    static int64_t xrows_##DT##_##FMT##_##OK(xctx *x, qctx cx) {                                                      \
        int64_t r = 0;                                                                                                 \
        for (int64_t l = 0; l < x->p->lines; l++) r += q_row_x(x, l, DT, FMT, OK, cx);                                 \
        return r;                                                                                                      \
    }                                                                                                                  \
    static int64_t xcols_##DT##_##FMT##_##OK(xctx *x, qctx cx) { return q_cols_x(x, DT, FMT, OK, cx); }
#define XINST_OK(DT, FMT) XINST(DT, FMT, 0) XINST(DT, FMT, 1) XINST(DT, FMT, 2) XINST(DT, FMT, 3)
#define XINST_FMT(DT) XINST_OK(DT, 0) XINST_OK(DT, 1)
XINST_FMT(0)
XINST_FMT(1)
XINST_FMT(2)
#define XTAB_OK(W, DT, FMT) {W##_##DT##_##FMT##_0, W##_##DT##_##FMT##_1, W##_##DT##_##FMT##_2, W##_##DT##_##FMT##_3}
static const qx_fn xrows_tab[3][2][4] = {{XTAB_OK(xrows, 0, 0), XTAB_OK(xrows, 0, 1)},
                                        {XTAB_OK(xrows, 1, 0), XTAB_OK(xrows, 1, 1)},
                                        {XTAB_OK(xrows, 2, 0), XTAB_OK(xrows, 2, 1)}};
static const qx_fn xcols_tab[3][2][4] = {{XTAB_OK(xcols, 0, 0), XTAB_OK(xcols, 0, 1)},
                                        {XTAB_OK(xcols, 1, 0), XTAB_OK(xcols, 1, 1)},
                                        {XTAB_OK(xcols, 2, 0), XTAB_OK(xcols, 2, 1)}};

int64_t mxfp8i_quantize_panel_x__avx512(const mxfp8i_qpanel *p, qctx cx, int di) {
    const int ok = out_kind(p->out_dtype), fmt = (int)p->fmt;
    xctx x;
    x.p = p;
    x.k0 = (uint32_t)p->sr.seed, x.k1 = (uint32_t)(p->sr.seed >> 32);
    x.t0 = (uint32_t)p->sr.stream, x.t1 = (uint32_t)(p->sr.stream >> 32);
    x.st = p->stats;
    x.rbase = -1;
    mxfp8i_xbucket xe, xs;
    if (x.st) mxfp8i_xbucket_init(&xe, &x.st->err), mxfp8i_xbucket_init(&xs, &x.st->sig);
    x.xe = &xe, x.xs = &xs;
    int64_t r = -1;
    if (p->src_ks == 1 && p->out_ks == 1 && p->group == MXFP8_GROUP_1X32) r = xrows_tab[di][fmt][ok](&x, cx);
    else if (p->src_ls == 1 && p->out_ls == 1 && (!p->scales || p->sc_ls == 1)) r = xcols_tab[di][fmt][ok](&x, cx);
    if (x.st) mxfp8i_xbucket_flush(&xe), mxfp8i_xbucket_flush(&xs);
    return r;
}
