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
 *    2^-126 in a block with a scale code below 10 (MXFP8I_QDQ_EXACT_S): then (like NaN groups in qdq) the block is
 *    redone element-wise with the reference arithmetic, after the loop over the blocks (no call inside it).
 * Rows: up to 16 whole groups per batch, their amax reduced together by a transposing shuffle tree. Cols: per
 * group, tiles of 512 columns swept row by row twice (amax into per-column accumulators, four 32-column chunks at a
 * time so that their accumulators stay in registers; then quantize, from L1/L2 with per-column multipliers), so each
 * pass is one sequential stream.
 * BF16 sources are processed in the in-lane "unpack order" so that conversion and packing are single instructions.
 * BF16 -> codes (the common training case) has its own path in 16-bit integer lanes, 32 elements per vector, exact
 * by construction (see bf16_codes); groups with a tiny or non-finite amax fall back to the FP32 path. Its cols form
 * uses 2048-column tiles, prefetches the next tile, and writes the codes of large panels with streaming stores.
 * wrapX rows: each (sub)tile is gathered into group order in a small buffer, processed as 1x32, and scattered back.
 * Panels with stochastic rounding or statistics go to quant_avx512_x.c.
 */
#include "../act_rows.h"
#include "quant_lanes_avx512.h"
#include "../ref/ref.h"

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
    uint32_t nfmask[CT / 32], tiny[CT / 32];
    __m512 lo, hi;
    __mmask32 sign;
    for (int64_t g = 0; g < G; g++) {
        int n = mxfp8i_group_members(K, p->group, g, idx);
        for (int64_t c0 = 0; c0 < C; c0 += CT) {
            const int W = C - c0 >= CT ? CT : (int)(C - c0), nch = (W + 31) / 32;
            const int lastn = W - 32 * (nch - 1);
            for (int c4 = 0; c4 < nch; c4 += 4) { /* 4 chunks at a time: their 8 accumulators stay in registers */
                __m512i a[8];
                for (int v = 0; v < 8; v++) a[v] = _mm512_setzero_si512();
                for (int i = 0; i < n; i++) {
                    const char *row = src + (idx[i] * p->src_ks + c0) * es;
#pragma GCC unroll 4
                    for (int k = 0; k < 4; k++) {
                        const int ch = c4 + k;
                        if (ch >= nch) break;
                        const int nc = ch == nch - 1 ? lastn : 32;
                        load_abs32(row + 32 * ch * es, dt, tail_mask(nc), nc == 32, &lo, &hi, &sign);
                        a[2 * k] = _mm512_max_epu32(a[2 * k], _mm512_castps_si512(lo));
                        a[2 * k + 1] = _mm512_max_epu32(a[2 * k + 1], _mm512_castps_si512(hi));
                    }
                }
                for (int v = 0; v < 8 && 2 * c4 + v < 2 * nch; v++) acc[2 * c4 + v] = a[v];
            }
            uint32_t any_nf = 0;
            for (int ch = 0; ch < nch; ch++) {
                __m512i slo = scale_codes(acc[2 * ch], cx.d, rcm), shi = scale_codes(acc[2 * ch + 1], cx.d, rcm);
                __m256i sb = pack_bytes(slo, shi, dt);
                _mm256_store_si256((__m256i *)(s8 + 32 * ch), sb);
                const __mmask32 live = tail_mask(ch == nch - 1 ? lastn : 32);
                nfmask[ch] = _mm256_cmpeq_epi8_mask(sb, _mm256_set1_epi8(-1)) & live;
                tiny[ch] = _mm256_cmplt_epu8_mask(sb, _mm256_set1_epi8(MXFP8I_QDQ_EXACT_S)) & live;
                any_nf |= nfmask[ch];
                inv[2 * ch] = inv_scale(slo), inv[2 * ch + 1] = inv_scale(shi);
                sv[2 * ch] = scale_value(slo), sv[2 * ch + 1] = scale_value(shi);
            }
            if (p->scales) memcpy(p->scales + g * p->sc_gs + c0, s8, (size_t)W);
            uint32_t redo[CT / 32] = {0}; /* per chunk, the rows quant_block leaves: by the reference arithmetic
                                             after the loop (no call inside it) */
            for (int i = 0; i < n; i++) {
                const char *row = src + (idx[i] * p->src_ks + c0) * es;
                char *o = out + (idx[i] * p->out_ks + c0) * os;
                for (int ch = 0; ch < nch; ch++) {
                    int nc = ch == nch - 1 ? lastn : 32;
                    if (any_nf && nfmask[ch]) continue; /* done below */
                    load_abs32(row + 32 * ch * es, dt, tail_mask(nc), nc == 32, &lo, &hi, &sign);
                    const int64_t r = quant_block(dt, fmt, ok, cx.sat, lo, hi, sign, inv[2 * ch], inv[2 * ch + 1],
                                                  sv[2 * ch], sv[2 * ch + 1], tail_mask(nc), nc == 32, o + 32 * ch * os,
                                                  tiny[ch] != 0);
                    if (r < 0) redo[ch] |= 1u << i;
                    else inexact += r;
                }
            }
            for (int ch = 0; ch < nch; ch++)
                for (uint32_t b = redo[ch]; b; b &= b - 1) {
                    const int i = __builtin_ctz(b);
                    inexact += ref_elems(src + (idx[i] * p->src_ks + c0 + 32 * ch) * es, dt,
                                         ch == nch - 1 ? lastn : 32, s8 + 32 * ch, 1, fmt, ok,
                                         out + (idx[i] * p->out_ks + c0 + 32 * ch) * os);
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
        if (DT == MXFP8_DTYPE_BF16 && OK == OUT_CODES) return mxfp8i_qrow_bf16c_##FMT(s, K, cx, o, sc, gs);                 \
        if (DT == MXFP8_DTYPE_BF16 && OK == OUT_BF16) return mxfp8i_qrow_bf16v_##FMT(s, K, cx, o, sc, gs);                  \
        return q_row_seg(s, DT, K, FMT, OK, cx, o, sc, gs);                                                            \
    }                                                                                                                  \
    static int64_t qcols_##DT##_##FMT##_##OK(const mxfp8i_qpanel *p, qctx cx) {                                     \
        if (DT == MXFP8_DTYPE_BF16 && OK == OUT_CODES) return mxfp8i_qcols_bf16c_##FMT(p, cx);                               \
        if (DT == MXFP8_DTYPE_BF16 && OK == OUT_BF16) return mxfp8i_qcols_bf16v_##FMT(p, cx);                                \
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
    if (p->sr.on || p->stats) return mxfp8i_quantize_panel_x__avx512(p, cx, di); /* quant_avx512_x.c */
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

/* FP32 -> BF16, RNE on the bits (as mxfp8i_fp32_to_bf16): (u + 0x7FFF + lsb) >> 16; NaN -> (u >> 16) | 0x40. */
void mxfp8i_to_bf16__avx512(const float *src, int64_t ld_src, uint16_t *dst, int64_t ld_dst, int64_t rows,
                            int64_t n) {
    const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
    const __m512i bias = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1), q = _mm512_set1_epi32(0x40);
    for (int64_t r = 0; r < rows; r++) {
        const float *s = src + r * ld_src;
        uint16_t *d = dst + r * ld_dst;
        for (int64_t j = 0; j < n; j += 16) {
            const __mmask16 m = n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1);
            __m512i u = _mm512_maskz_loadu_epi32(m, s + j);
            __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
            __m512i rne = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, bias), lsb), 16);
            __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, absm), inf);
            __m512i v = _mm512_mask_or_epi32(rne, nan, _mm512_srli_epi32(u, 16), q);
            _mm256_mask_storeu_epi16(d + j, m, _mm512_cvtepi32_epi16(v));
        }
    }
}

/* dst += src, 16 lanes of VADDPS (the same IEEE FP32 addition per element as the scalar loop). */
void mxfp8i_add_f32__avx512(const float *src, int64_t ld_src, float *dst, int64_t ld_dst, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++) {
        const float *s = src + r * ld_src;
        float *d = dst + r * ld_dst;
        for (int64_t j = 0; j < n; j += 16) {
            const __mmask16 m = n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1);
            _mm512_mask_storeu_ps(d + j, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, d + j), _mm512_maskz_loadu_ps(m, s + j)));
        }
    }
}

/* FP32 rows into an output written once: non-temporal 64-byte stores for every line a row fills (its floats up to
 * the first line boundary and its tail stored as usual), then a store fence. */
static void copy_f32__avx512(const float *src, int64_t ld_src, float *dst, int64_t ld_dst, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++) {
        const float *s = src + r * ld_src;
        float *d = dst + r * ld_dst;
        const int64_t head = (int64_t)(((64 - ((uintptr_t)d & 63)) & 63) / sizeof(float)); /* floats to a line */
        int64_t j = 0;
        for (; j < n && j < head; j++) d[j] = s[j];
        for (; j + 16 <= n; j += 16) _mm512_stream_ps(d + j, _mm512_loadu_ps(s + j));
        for (; j < n; j++) d[j] = s[j];
    }
    _mm_sfence(); /* the non-temporal stores ordered before every later store of this thread */
}

/* The MoE's elementwise rows (act_rows.h): the same loops, which the compiler vectorizes with this folder's
 * AVX-512 flags (16 lanes instead of the baseline's 4), and the 16-lane exponential. */
static void act_fwd__avx512(const mxfp8i_act_params *ap, int64_t I, const float *gu, const float *b1, float *g,
                            float *u, float *act, int act_given, float *inter, int inter_given, float *S, float aq,
                            float *sg) {
    mxfp8i_act_fwd_impl(mxfp8i_exp_f32__avx512, ap, I, gu, b1, g, u, act, act_given, inter, inter_given, S, aq, sg);
}
static void act_bwd__avx512(const mxfp8i_act_params *ap, int64_t I, const float *dI, float aq, int scale,
                            const float *g, const float *u, const float *act, const float *sg, float *dgu) {
    mxfp8i_act_bwd_impl(mxfp8i_exp_f32__avx512, ap, I, dI, aq, scale, g, u, act, sg, dgu);
}

/* Sequential FP64 dot products, 8 rows at a time in the 8 lanes of one vector: per 8 terms, each row's products
 * (exact in FP64) in a vector, the 8 x 8 block transposed (unpack, then two 128-bit shuffles), then added column
 * after column, so each lane adds its row's terms in i ascending, as the reference does. Rows past a multiple of 8
 * go through the reference. */
static void dot_f64__avx512(const float *x, int64_t ldx, const float *y, int64_t ldy, int64_t n, int64_t rows,
                            double *out) {
    int64_t r0 = 0;
    for (; r0 + 8 <= rows; r0 += 8) {
        __m512d acc = _mm512_loadu_pd(out + r0);
        for (int64_t i = 0; i < n; i += 8) {
            const int m = n - i < 8 ? (int)(n - i) : 8;
            const __mmask8 k = (__mmask8)((1u << m) - 1);
            __m512d p[8], t[8], u[8];
            for (int r = 0; r < 8; r++) {
                const __m512d xv = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(k, x + (r0 + r) * ldx + i));
                const __m512d yv = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(k, y + (r0 + r) * ldy + i));
                p[r] = _mm512_mul_pd(xv, yv);
            }
            for (int r = 0; r < 8; r += 2) { /* t[r]: the even terms of rows r, r + 1; t[r + 1]: the odd ones */
                t[r] = _mm512_unpacklo_pd(p[r], p[r + 1]);
                t[r + 1] = _mm512_unpackhi_pd(p[r], p[r + 1]);
            }
            for (int h = 0; h < 2; h++) { /* h = 0: terms 0, 4 and 2, 6; h = 1: 1, 5 and 3, 7 */
                u[4 * h] = _mm512_shuffle_f64x2(t[h], t[2 + h], 0x88);
                u[4 * h + 1] = _mm512_shuffle_f64x2(t[h], t[2 + h], 0xDD);
                u[4 * h + 2] = _mm512_shuffle_f64x2(t[4 + h], t[6 + h], 0x88);
                u[4 * h + 3] = _mm512_shuffle_f64x2(t[4 + h], t[6 + h], 0xDD);
            }
            __m512d col[8];
            for (int h = 0; h < 2; h++) {
                col[h] = _mm512_shuffle_f64x2(u[4 * h], u[4 * h + 2], 0x88);     /* term h */
                col[4 + h] = _mm512_shuffle_f64x2(u[4 * h], u[4 * h + 2], 0xDD); /* term 4 + h */
                col[2 + h] = _mm512_shuffle_f64x2(u[4 * h + 1], u[4 * h + 3], 0x88);
                col[6 + h] = _mm512_shuffle_f64x2(u[4 * h + 1], u[4 * h + 3], 0xDD);
            }
            for (int j = 0; j < m; j++) acc = _mm512_add_pd(acc, col[j]);
        }
        _mm512_storeu_pd(out + r0, acc);
    }
    if (r0 < rows) mxfp8i_dot_f64__ref(x + r0 * ldx, ldx, y + r0 * ldy, ldy, n, rows - r0, out + r0);
}

const mxfp8i_qkernel mxfp8i_mx_quant__avx512 = {"mx_quant_panel__avx512", "avx512", 1, MXFP8I_NEEDS_AVX512,
                                                mxfp8i_quantize_panel__avx512, mxfp8i_dequantize_panel__avx512,
                                                mxfp8i_to_bf16__avx512, mxfp8i_bf16_t__avx512, mxfp8i_f32_t__avx512,
                                                mxfp8i_add_f32__avx512, copy_f32__avx512, mxfp8i_exp_f32__avx512,
                                                act_fwd__avx512, act_bwd__avx512, dot_f64__avx512};
