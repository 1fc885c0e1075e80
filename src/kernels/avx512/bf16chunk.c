/*
 * bf16chunk.c -- the BF16 chunk panel format (bf16chunk.h): the packers (FP32 -> BF16 slots with per tile-chunk
 * facts, FP32 slots where BF16 cannot hold a value exactly), the exact path (AVX-512 FMAs in ascending k) and the
 * accumulator helpers shared by the AVX512-BF16 and AMX kernels. AVX-512F/BW code (this folder's flags).
 */
#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#include "bf16chunk.h"

/* ---------------------------------------------------------------------------------------------------------- */
/* packing                                                                                                     */
/* ---------------------------------------------------------------------------------------------------------- */
/* Facts of one tile-chunk t[16][32] (raw FP32 bits). */
static mxfp8i_bf16c_meta chunk_meta(const uint32_t *t) {
    const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF), mantm = _mm512_set1_epi32(0x007FFFFF);
    const __m512i implicit = _mm512_set1_epi32(0x00800000), low16 = _mm512_set1_epi32(0xFFFF);
    const __m512i e255 = _mm512_set1_epi32(255), zero = _mm512_setzero_si512();
    __m512i vmax = _mm512_set1_epi32(-1), vmin = _mm512_set1_epi32(1 << 20), lowbits = zero;
    __mmask16 special = 0, anynz = 0;
    for (int v = 0; v < 32; v++) {
        __m512i x = _mm512_load_si512((const void *)(t + v * 16));
        __m512i ax = _mm512_and_si512(x, absm);
        __mmask16 nz = _mm512_test_epi32_mask(ax, ax);
        __m512i e = _mm512_srli_epi32(ax, 23);
        lowbits = _mm512_or_si512(lowbits, _mm512_and_si512(x, low16));
        special |= _mm512_cmpeq_epi32_mask(e, e255);
        special |= _mm512_mask_cmpeq_epi32_mask(nz, e, zero); /* subnormal */
        anynz |= nz;
        vmax = _mm512_mask_max_epi32(vmax, nz, vmax, e);
        /* exponent of the lowest set bit: biased e - 150 + tz(mantissa | implicit); tz from the exponent of the
         * (exactly converted) power of two m & -m. */
        __m512i m = _mm512_or_si512(_mm512_and_si512(ax, mantm), implicit);
        __m512i lb = _mm512_and_si512(m, _mm512_sub_epi32(zero, m));
        __m512i tz = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_castps_si512(_mm512_cvtepi32_ps(lb)), 23),
                                      _mm512_set1_epi32(127));
        vmin = _mm512_mask_min_epi32(vmin, nz, vmin, _mm512_add_epi32(e, tz));
    }
    mxfp8i_bf16c_meta m;
    memset(&m, 0, sizeof m);
    if (!anynz) {
        m.qmin = 1000;
        m.emax = -1000;
    } else {
        m.qmin = (int16_t)(_mm512_reduce_min_epi32(vmin) - 150);
        m.emax = (int16_t)(_mm512_reduce_max_epi32(vmax) - 127);
    }
    m.f32 = (uint8_t)(special != 0 || _mm512_test_epi32_mask(lowbits, lowbits) != 0);
    return m;
}

int64_t mxfp8i_bf16c_panel_bytes(int64_t K, int w) {
    (void)w; /* always 32 rows (w <= 32) */
    return mxfp8i_bf16c_chunks(K) * MXFP8I_BF16C_CHUNK_BYTES;
}

/* In-place transpose of a 16x16 matrix of dwords held as 16 rows. */
static inline void transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { /* u[4i + c]: column c of each 128-bit lane, rows 4i .. 4i+3 */
        u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int c = 0; c < 4; c++) { /* t[c]: lanes 0, 2 of rows 0-7; t[4 + c]: lanes 1, 3; t[8 + ...]: rows 8-15 */
        t[c] = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88);
        t[4 + c] = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xDD);
        t[8 + c] = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88);
        t[12 + c] = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xDD);
    }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0x88);           /* column c */
        r[4 + c] = _mm512_shuffle_i32x4(t[4 + c], t[12 + c], 0x88);  /* column 4 + c */
        r[8 + c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0xDD);       /* column 8 + c */
        r[12 + c] = _mm512_shuffle_i32x4(t[4 + c], t[12 + c], 0xDD); /* column 12 + c */
    }
}

/* BF16 slot of one tile-chunk from its pair dwords, given in the A layout (d_b = 0: d[r] = row r's 16 pairs) or the
 * B layout (d_b = 1: d[p] = pair p of the 16 rows), transposed when the slot's layout (is_b) is the other. Each
 * dword is bf16(kk = 2p) | bf16(kk = 2p + 1) << 16, rotated by 16 bits when swap. */
static void store_bf16_slot(int is_b, __m512i d[16], int d_b, uint8_t *slot, int swap) {
    if (swap)
        for (int r = 0; r < 16; r++) d[r] = _mm512_rol_epi32(d[r], 16);
    if (is_b != d_b) transpose16(d);
    for (int r = 0; r < 16; r++) _mm512_store_si512((void *)(slot + r * 64), d[r]);
}

/* One tile-chunk from its FP32 values t[16][32] (raw bits, [r][kk]): the facts from the values, then the slot in
 * BF16 (pairs of the BF16-exact values' high halves) or, when some value is not a BF16 normal or zero, in FP32. */
static void tile_from_f32(int is_b, const uint32_t *t, uint8_t *chunk, int tile, int swap) {
    const __m512i ev = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i od = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    mxfp8i_bf16c_meta m = chunk_meta(t);
    memcpy(chunk + tile * sizeof m, &m, sizeof m);
    uint8_t *slot = chunk + 64 + tile * MXFP8I_BF16C_SLOT;
    if (m.f32) {
        uint32_t *s = (uint32_t *)slot;
        if (!is_b) memcpy(s, t, 16 * 32 * 4); /* [r][kk] */
        else
            for (int kk = 0; kk < 32; kk++)
                for (int j = 0; j < 16; j++) s[kk * 16 + j] = t[j * 32 + kk]; /* [kk][j] */
        return;
    }
    __m512i d[16];
    for (int j = 0; j < 16; j++) {
        __m512i v0 = _mm512_load_si512((const void *)(t + j * 32));
        __m512i v1 = _mm512_load_si512((const void *)(t + j * 32 + 16));
        __m512i e = _mm512_permutex2var_epi32(v0, ev, v1), o = _mm512_permutex2var_epi32(v0, od, v1);
        d[j] = _mm512_or_si512(_mm512_srli_epi32(e, 16), _mm512_and_si512(o, _mm512_set1_epi32((int)0xFFFF0000u)));
    }
    store_bf16_slot(is_b, d, 0, slot, swap);
}

/* cm = 0: element (r, k) at src[r*rs + k]; cm = 1: at src[k*rs + r] (column-major, rs = leading dimension). */
static void bf16c_pack(int is_b, const float *src, int64_t rs, int rows, int64_t K, void *panel_v, int swap, int cm) {
    uint8_t *panel = panel_v;
    uint32_t t[16 * 32] __attribute__((aligned(64)));
    int64_t nch = mxfp8i_bf16c_chunks(K);
    for (int64_t ch = 0; ch < nch; ch++) {
        uint8_t *chunk = panel + ch * MXFP8I_BF16C_CHUNK_BYTES;
        memset(chunk, 0, 64); /* header: two mxfp8i_bf16c_meta, the pair-order byte, zeros */
        chunk[MXFP8I_BF16C_SWAP_BYTE] = (uint8_t)swap;
        int64_t k0 = ch * MXFP8I_BF16C_KCHUNK;
        int kn = (int)(K - k0 < MXFP8I_BF16C_KCHUNK ? K - k0 : MXFP8I_BF16C_KCHUNK);
        __mmask16 m0 = kn >= 16 ? 0xFFFF : (__mmask16)((1u << kn) - 1);
        __mmask16 m1 = kn >= 32 ? 0xFFFF : kn <= 16 ? 0 : (__mmask16)((1u << (kn - 16)) - 1);
        for (int tile = 0; tile < 2; tile++) {
            if (cm) {
                /* 16 rows x 32 steps from columns of src: load steps as vectors over rows, 16x16 transposes */
                int rn = rows - tile * 16;
                __mmask16 rm = rn >= 16 ? (__mmask16)0xFFFF : rn <= 0 ? 0 : (__mmask16)((1u << rn) - 1);
                for (int h = 0; h < 2; h++) {
                    __m512i w[16];
                    for (int q = 0; q < 16; q++) {
                        int kk = h * 16 + q;
                        w[q] = kk < kn && rm ? _mm512_maskz_loadu_epi32(rm, src + (k0 + kk) * rs + tile * 16)
                                             : _mm512_setzero_si512();
                    }
                    transpose16(w);
                    for (int r = 0; r < 16; r++) _mm512_store_si512((void *)(t + r * 32 + h * 16), w[r]);
                }
            } else {
                for (int r = 0; r < 16; r++) {
                    int row = tile * 16 + r;
                    __m512i v0 = _mm512_setzero_si512(), v1 = v0;
                    if (row < rows) {
                        const float *p = src + (int64_t)row * rs + k0;
                        v0 = _mm512_maskz_loadu_epi32(m0, p);
                        v1 = _mm512_maskz_loadu_epi32(m1, p + 16);
                    }
                    _mm512_store_si512((void *)(t + r * 32), v0);
                    _mm512_store_si512((void *)(t + r * 32 + 16), v1);
                }
            }
            tile_from_f32(is_b, t, chunk, tile, swap);
        }
    }
}


void mxfp8i_bf16c_pack(int is_b, const float *src, int64_t rs, int rows, int64_t K, void *panel) {
    bf16c_pack(is_b, src, rs, rows, K, panel, 0, 0);
}
void mxfp8i_bf16c_pack_swapped(int is_b, const float *src, int64_t rs, int rows, int64_t K, void *panel) {
    bf16c_pack(is_b, src, rs, rows, K, panel, 1, 0);
}
void mxfp8i_bf16c_pack_cm(int is_b, const float *src, int64_t ld, int rows, int64_t K, void *panel) {
    bf16c_pack(is_b, src, ld, rows, K, panel, 0, 1);
}
void mxfp8i_bf16c_pack_swapped_cm(int is_b, const float *src, int64_t ld, int rows, int64_t K, void *panel) {
    bf16c_pack(is_b, src, ld, rows, K, panel, 1, 1);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* packing from BF16 values with their 1x32 group scales                                                       */
/* ---------------------------------------------------------------------------------------------------------- */
/* The 8 bytes of a mxfp8i_bf16c_meta {qmin, emax, f32 = 0, zeros} as one word, built in a register: a struct filled
 * field by field on the stack and then copied whole made its 8-byte load wait on the 2-byte stores before it (a
 * store-forwarding stall: a third of the packer's samples). */
_Static_assert(offsetof(mxfp8i_bf16c_meta, qmin) == 0 && offsetof(mxfp8i_bf16c_meta, emax) == 2 &&
                   offsetof(mxfp8i_bf16c_meta, f32) == 4 && sizeof(mxfp8i_bf16c_meta) == 8,
               "mxfp8i_bf16c_meta layout");
static inline uint64_t meta_word(int qmin, int emax) {
    return (uint64_t)(uint16_t)(int16_t)qmin | (uint64_t)(uint16_t)(int16_t)emax << 16; /* (x86: little-endian) */
}

/* The facts of a tile-chunk from the E8M0 codes of its rows' groups (bf16chunk.h, why this is enough): a value of a
 * group with scale e is fp8 * 2^e, nonzero ones with exponent in [e - lo, e + hi] (E4M3: lo 9, hi 8; E5M2: 16, 15)
 * and a lowest set bit >= 2^(e - lo): so qmin >= min(e) - lo, emax <= max(e) + hi, from the smallest and largest
 * code of the tile-chunk's rn rows (scale_range). Conservative bounds only send more chunks down the exact path; a
 * code 0 (an all-zero group, or e = -127), 255 (NaN) or one low enough that a value may be a BF16 subnormal returns
 * 0: the caller derives the facts from the values instead. */
static int meta_from_scales(int smin, int smax, int rn, int fmt, uint64_t *m) {
    const int lo = fmt ? 16 : 9, hi = fmt ? 15 : 8;
    if (rn <= 0) { /* no valid row: zeros */
        *m = meta_word(1000, -1000);
        return 1;
    }
    if (smin == 0 || smax == 255 || smin - 127 - lo < -126) return 0;
    *m = meta_word(smin - 127 - lo, smax - 127 + hi);
    return 1;
}

/* The smallest and largest scale code of rows [0, rn) (1 <= rn <= 16) in each of nc <= 64 consecutive chunks c0 + i
 * (code of row r, chunk c at sc[r * s_r + c * s_g]): mn[i], mx[i]. Vector loads where the codes of a row's chunks
 * (s_g = 1) or of a chunk's rows (s_r = 1) are adjacent; the scalar loop it replaces took half of a rows-geometry
 * A panel's packing time. */
static void scale_range(const uint8_t *sc, int64_t s_r, int64_t s_g, int rn, int64_t c0, int nc, uint8_t *mn,
                        uint8_t *mx) {
    if (s_g == 1) {
        const __mmask64 m = nc >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << nc) - 1);
        __m512i vmin = _mm512_set1_epi8((char)0xFF), vmax = _mm512_setzero_si512();
        for (int r = 0; r < rn; r++) {
            const __m512i v = _mm512_maskz_loadu_epi8(m, sc + r * s_r + c0);
            vmin = _mm512_min_epu8(vmin, v), vmax = _mm512_max_epu8(vmax, v);
        }
        _mm512_mask_storeu_epi8(mn, m, vmin);
        _mm512_mask_storeu_epi8(mx, m, vmax);
        return;
    }
    if (s_r == 1) { /* per chunk: its rows' codes in one vector, reduced (lane 0 ends as the min / max of all) */
        const __mmask16 m = (__mmask16)((1u << rn) - 1);
        for (int i = 0; i < nc; i++) {
            const uint8_t *p = sc + (c0 + i) * s_g;
            __m128i a = _mm_mask_loadu_epi8(_mm_set1_epi8((char)0xFF), m, p), b = _mm_maskz_loadu_epi8(m, p);
            a = _mm_min_epu8(a, _mm_bsrli_si128(a, 8)), b = _mm_max_epu8(b, _mm_bsrli_si128(b, 8));
            a = _mm_min_epu8(a, _mm_bsrli_si128(a, 4)), b = _mm_max_epu8(b, _mm_bsrli_si128(b, 4));
            a = _mm_min_epu8(a, _mm_bsrli_si128(a, 2)), b = _mm_max_epu8(b, _mm_bsrli_si128(b, 2));
            a = _mm_min_epu8(a, _mm_bsrli_si128(a, 1)), b = _mm_max_epu8(b, _mm_bsrli_si128(b, 1));
            mn[i] = (uint8_t)_mm_cvtsi128_si32(a), mx[i] = (uint8_t)_mm_cvtsi128_si32(b);
        }
        return;
    }
    for (int i = 0; i < nc; i++) {
        int smin = 255, smax = 0;
        for (int r = 0; r < rn; r++) {
            const int c = sc[r * s_r + (c0 + i) * s_g];
            smin = c < smin ? c : smin;
            smax = c > smax ? c : smax;
        }
        mn[i] = (uint8_t)smin, mx[i] = (uint8_t)smax;
    }
}

/* The pair dwords d[16] of one tile-chunk from BF16 values, in the layout the source gives without a transpose:
 * rows geometry (row r at src + r*ld, kn <= 32 steps): the A layout, d[r] = row r's 16 pairs; column-major (step kk
 * at src + kk*ld, 16 rows): the B layout, d[p] = pair p of the 16 rows (dword j: row j). Rows past rn and steps past
 * kn are zero. */
static void load_pairs(const uint16_t *src, int64_t ld, int cm, int rn, int kn, __m512i d[16]) {
    if (!cm) {
        __mmask32 km = kn >= 32 ? 0xFFFFFFFFu : (((__mmask32)1 << kn) - 1);
        for (int r = 0; r < 16; r++)
            d[r] = r < rn ? _mm512_maskz_loadu_epi16(km, src + r * ld) : _mm512_setzero_si512();
        return;
    }
    /* steps 2p and 2p + 1 interleaved: dword j of e[p] = (row j at step 2p, row j at step 2p + 1) */
    __mmask16 rm = rn >= 16 ? (__mmask16)0xFFFF : rn <= 0 ? 0 : (__mmask16)((1u << rn) - 1);
    const __m512i idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                         37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    for (int p = 0; p < 16; p++) {
        int k = 2 * p;
        __m512i lo = k < kn ? _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(rm, src + k * ld))
                            : _mm512_setzero_si512();
        __m512i hi = k + 1 < kn ? _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(rm, src + (k + 1) * ld))
                                : _mm512_setzero_si512();
        d[p] = _mm512_permutex2var_epi16(lo, idx, hi);
    }
}

void mxfp8i_bf16c_pack_q(int is_b, const uint16_t *src, int64_t ld, int cm, int rows, int64_t K,
                         const uint8_t *scales, int64_t s_r, int64_t s_g, int fmt, int swap, void *panel_v) {
    uint8_t *panel = panel_v;
    uint32_t t[16 * 32] __attribute__((aligned(64)));
    const int64_t nch = mxfp8i_bf16c_chunks(K);
    uint8_t mn[2][64] = {{0}}, mx[2][64] = {{0}}; /* the scale codes' range per tile and chunk, 64 at a time */
    for (int64_t ch = 0; ch < nch; ch++) {
        uint8_t *chunk = panel + ch * MXFP8I_BF16C_CHUNK_BYTES;
        memset(chunk, 0, 64);
        chunk[MXFP8I_BF16C_SWAP_BYTE] = (uint8_t)swap;
        const int64_t k0 = ch * MXFP8I_BF16C_KCHUNK;
        const int kn = (int)(K - k0 < MXFP8I_BF16C_KCHUNK ? K - k0 : MXFP8I_BF16C_KCHUNK);
        for (int tile = 0; tile < 2 && ch % 64 == 0 && tile * 16 < rows; tile++) {
            const int rn = rows - tile * 16 > 16 ? 16 : rows - tile * 16;
            scale_range(scales + (int64_t)tile * 16 * s_r, s_r, s_g, rn, ch, nch - ch < 64 ? (int)(nch - ch) : 64,
                        mn[tile], mx[tile]);
        }
        for (int tile = 0; tile < 2; tile++) {
            const int rn = rows - tile * 16 < 0 ? 0 : rows - tile * 16 > 16 ? 16 : rows - tile * 16;
            const uint16_t *base = cm ? src + k0 * ld + tile * 16 : src + (int64_t)tile * 16 * ld + k0;
            __m512i d[16];
            load_pairs(base, ld, cm, rn, kn, d); /* B layout when cm, else A layout */
            uint64_t m;
            if (meta_from_scales(mn[tile][ch % 64], mx[tile][ch % 64], rn, fmt, &m)) {
                memcpy(chunk + tile * sizeof(mxfp8i_bf16c_meta), &m, sizeof m);
                store_bf16_slot(is_b, d, cm, chunk + 64 + tile * MXFP8I_BF16C_SLOT, swap);
                continue;
            }
            if (cm) transpose16(d); /* [p][r] -> [r][p] */
            /* the facts from the values: FP32 bits of each BF16 value (its pair dword's halves) */
            for (int r = 0; r < 16; r++) {
                __m512i lo = _mm512_slli_epi32(d[r], 16), hi = _mm512_and_si512(d[r], _mm512_set1_epi32((int)0xFFFF0000u));
                const __m512i i0 = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
                const __m512i i1 = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
                _mm512_store_si512((void *)(t + r * 32), _mm512_permutex2var_epi32(lo, i0, hi));
                _mm512_store_si512((void *)(t + r * 32 + 16), _mm512_permutex2var_epi32(lo, i1, hi));
            }
            tile_from_f32(is_b, t, chunk, tile, swap);
        }
    }
}

void mxfp8i_bf16c_pack_q_plain(int is_b, const uint16_t *src, int64_t ld, int cm, int rows, int64_t K,
                               const uint8_t *scales, int64_t s_r, int64_t s_g, int fmt, void *panel) {
    mxfp8i_bf16c_pack_q(is_b, src, ld, cm, rows, K, scales, s_r, s_g, fmt, 0, panel);
}
void mxfp8i_bf16c_pack_q_swapped(int is_b, const uint16_t *src, int64_t ld, int cm, int rows, int64_t K,
                                 const uint8_t *scales, int64_t s_r, int64_t s_g, int fmt, void *panel) {
    mxfp8i_bf16c_pack_q(is_b, src, ld, cm, rows, K, scales, s_r, s_g, fmt, 1, panel);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* the exact path and the accumulator check                                                                    */
/* ---------------------------------------------------------------------------------------------------------- */

/* Values of one chunk as FP32: af[i][kk] (32 rows of A), bf[kk][j] (32 columns of B). a, b: chunk bases. */
static void expand_chunk(const uint8_t *a, const uint8_t *b, float *af, float *bf) {
    const mxfp8i_bf16c_meta *am = mxfp8i_bf16c_chunk_meta(a), *bm = mxfp8i_bf16c_chunk_meta(b);
    int sa_sw = a[MXFP8I_BF16C_SWAP_BYTE], sb_sw = b[MXFP8I_BF16C_SWAP_BYTE];
    for (int tile = 0; tile < 2; tile++) {
        const uint8_t *sa = a + 64 + tile * MXFP8I_BF16C_SLOT, *sb = b + 64 + tile * MXFP8I_BF16C_SLOT;
        for (int r = 0; r < 16; r++)
            for (int kk = 0; kk < 32; kk++) {
                uint32_t u;
                if (am[tile].f32) memcpy(&u, sa + r * 128 + kk * 4, 4);
                else { uint16_t h; memcpy(&h, sa + r * 64 + (kk ^ sa_sw) * 2, 2); u = (uint32_t)h << 16; }
                memcpy(&af[(tile * 16 + r) * 32 + kk], &u, 4);
            }
        for (int kk = 0; kk < 32; kk++)
            for (int j = 0; j < 16; j++) {
                uint32_t u;
                if (bm[tile].f32) memcpy(&u, sb + kk * 64 + j * 4, 4);
                else {
                    uint16_t h;
                    memcpy(&h, sb + (kk / 2) * 64 + j * 4 + ((kk % 2) ^ sb_sw) * 2, 2);
                    u = (uint32_t)h << 16;
                }
                memcpy(&bf[kk * 32 + tile * 16 + j], &u, 4);
            }
    }
}

/* cb[32][32] += chunk, steps kk < kn, each element acc = fmaf(a, b, acc) in ascending kk. */
void mxfp8i_bf16c_exact_chunk(float *cb, const void *a_chunk, const void *b_chunk, int kn) {
    const uint8_t *a = a_chunk, *b = b_chunk;
    float af[32 * 32] __attribute__((aligned(64))), bf[32 * 32] __attribute__((aligned(64)));
    expand_chunk(a, b, af, bf);
    for (int i = 0; i < 32; i++) {
        __m512 c0 = _mm512_load_ps(cb + i * 32), c1 = _mm512_load_ps(cb + i * 32 + 16);
        for (int kk = 0; kk < kn; kk++) {
            __m512 av = _mm512_set1_ps(af[i * 32 + kk]);
            c0 = _mm512_fmadd_ps(av, _mm512_load_ps(bf + kk * 32), c0);
            c1 = _mm512_fmadd_ps(av, _mm512_load_ps(bf + kk * 32 + 16), c1);
        }
        _mm512_store_ps(cb + i * 32, c0);
        _mm512_store_ps(cb + i * 32 + 16, c1);
    }
}

/* 1 when every accumulator is zero, or a finite normal whose lowest set bit is >= 2^-126 (amx.h, condition 2). */
int mxfp8i_bf16c_acc_ok(const float *cb) {
    /* Fast test first: zero, or 2^-103 <= |c| < Inf (biased exponent 24..254) -- then the lowest set bit of the
     * 24-bit significand is >= 2^(-103-23) = 2^-126. Only when some value fails it, the exact test below. */
    const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF);
    __mmask16 out = 0;
    for (int v = 0; v < 64; v++) {
        __m512i ax = _mm512_and_si512(_mm512_load_si512((const void *)(cb + v * 16)), absm);
        __m512i off = _mm512_sub_epi32(ax, _mm512_set1_epi32(24 << 23)); /* in [0, (255-24) << 23) when fine */
        out |= _mm512_cmpge_epu32_mask(off, _mm512_set1_epi32((255 - 24) << 23)) &
               _mm512_test_epi32_mask(ax, ax);
    }
    if (!out) return 1;
    const __m512i mantm = _mm512_set1_epi32(0x007FFFFF);
    const __m512i implicit = _mm512_set1_epi32(0x00800000), zero = _mm512_setzero_si512();
    __mmask16 bad = 0;
    for (int v = 0; v < 64; v++) {
        __m512i ax = _mm512_and_si512(_mm512_load_si512((const void *)(cb + v * 16)), absm);
        __mmask16 nz = _mm512_test_epi32_mask(ax, ax);
        __m512i e = _mm512_srli_epi32(ax, 23);
        __m512i m = _mm512_or_si512(_mm512_and_si512(ax, mantm), implicit);
        __m512i lb = _mm512_and_si512(m, _mm512_sub_epi32(zero, m));
        __m512i tz = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_castps_si512(_mm512_cvtepi32_ps(lb)), 23),
                                      _mm512_set1_epi32(127));
        bad |= _mm512_mask_cmpeq_epi32_mask(nz, e, zero);                               /* subnormal */
        bad |= _mm512_mask_cmpeq_epi32_mask(nz, e, _mm512_set1_epi32(255));              /* Inf, NaN */
        bad |= _mm512_mask_cmplt_epi32_mask(nz, _mm512_add_epi32(e, tz), _mm512_set1_epi32(24)); /* q < -126 */
    }
    return bad == 0;
}


/* cb[32][32] = the valid mr x nr block of c (load_c) or zeros; and back. Masked 16-lane rows. */
void mxfp8i_bf16c_load_acc(float *cb, const float *c, int64_t ldc, int mr, int nr, int load_c) {
    __mmask16 m0 = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1);
    __mmask16 m1 = nr >= 32 ? (__mmask16)0xFFFF : nr <= 16 ? 0 : (__mmask16)((1u << (nr - 16)) - 1);
    for (int i = 0; i < 32; i++) {
        __m512 v0 = _mm512_setzero_ps(), v1 = v0;
        if (load_c && i < mr) {
            v0 = _mm512_maskz_loadu_ps(m0, c + i * ldc);
            v1 = _mm512_maskz_loadu_ps(m1, c + i * ldc + 16);
        }
        _mm512_store_ps(cb + i * 32, v0);
        _mm512_store_ps(cb + i * 32 + 16, v1);
    }
}
void mxfp8i_bf16c_store_acc(const float *cb, float *c, int64_t ldc, int mr, int nr) {
    __mmask16 m0 = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1);
    __mmask16 m1 = nr >= 32 ? (__mmask16)0xFFFF : nr <= 16 ? 0 : (__mmask16)((1u << (nr - 16)) - 1);
    for (int i = 0; i < mr; i++) {
        _mm512_mask_storeu_ps(c + i * ldc, m0, _mm512_load_ps(cb + i * 32));
        _mm512_mask_storeu_ps(c + i * ldc + 16, m1, _mm512_load_ps(cb + i * 32 + 16));
    }
}

/* Rows [r0, r0 + 8) (r0 a multiple of 8) of an A chunk and all 32 columns of a B chunk as FP32: af[i][kk], bf[kk][j]. */
static void expand_rows8(const uint8_t *a, const uint8_t *b, int r0, float *af, float *bf) {
    const mxfp8i_bf16c_meta *am = mxfp8i_bf16c_chunk_meta(a), *bm = mxfp8i_bf16c_chunk_meta(b);
    int sa_sw = a[MXFP8I_BF16C_SWAP_BYTE], sb_sw = b[MXFP8I_BF16C_SWAP_BYTE], tile = r0 / 16;
    const uint8_t *sa = a + 64 + tile * MXFP8I_BF16C_SLOT;
    for (int i = 0; i < 8; i++) {
        int r = r0 % 16 + i;
        for (int kk = 0; kk < 32; kk++) {
            uint32_t u;
            if (am[tile].f32) memcpy(&u, sa + r * 128 + kk * 4, 4);
            else { uint16_t h; memcpy(&h, sa + r * 64 + (kk ^ sa_sw) * 2, 2); u = (uint32_t)h << 16; }
            memcpy(&af[i * 32 + kk], &u, 4);
        }
    }
    for (int t = 0; t < 2; t++) {
        const uint8_t *sb = b + 64 + t * MXFP8I_BF16C_SLOT;
        for (int kk = 0; kk < 32; kk++)
            for (int j = 0; j < 16; j++) {
                uint32_t u;
                if (bm[t].f32) memcpy(&u, sb + kk * 64 + j * 4, 4);
                else {
                    uint16_t h;
                    memcpy(&h, sb + (kk / 2) * 64 + j * 4 + ((kk % 2) ^ sb_sw) * 2, 2);
                    u = (uint32_t)h << 16;
                }
                memcpy(&bf[kk * 32 + t * 16 + j], &u, 4);
            }
    }
}

void mxfp8i_bf16c_exact_rows8(float *c, int64_t ldc, int r0, const void *a_chunk, const void *b_chunk, int kn) {
    float af[8 * 32] __attribute__((aligned(64))), bf[32 * 32] __attribute__((aligned(64)));
    expand_rows8(a_chunk, b_chunk, r0, af, bf);
    for (int i = 0; i < 8; i++) {
        float *ci = c + (int64_t)i * ldc;
        __m512 c0 = _mm512_loadu_ps(ci), c1 = _mm512_loadu_ps(ci + 16);
        for (int kk = 0; kk < kn; kk++) {
            __m512 av = _mm512_set1_ps(af[i * 32 + kk]);
            c0 = _mm512_fmadd_ps(av, _mm512_load_ps(bf + kk * 32), c0);
            c1 = _mm512_fmadd_ps(av, _mm512_load_ps(bf + kk * 32 + 16), c1);
        }
        _mm512_storeu_ps(ci, c0);
        _mm512_storeu_ps(ci + 16, c1);
    }
}
