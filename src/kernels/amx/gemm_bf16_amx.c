/*
 * gemm_bf16_amx.c -- AMX-BF16 GEMM microkernel (TDPBF16PS, 2x2 tiles = 32x32 of C), its panel packers, a C emulation
 * of the tile instructions for the tests, and the one-time self-test that guards its use.
 *
 * Contract, panel format and the exactness argument: src/kernels/amx/amx.h. In short: a 32-step chunk of k runs on
 * the tiles only when no BF16 subnormal input, no subnormal partial sum and no product overflow can occur (facts the
 * packer records per tile-chunk); any other chunk, and a trailing partial chunk, runs with AVX-512 FMAs in ascending
 * k on the stored accumulators. Either way the result is the reference sequence acc = fmaf(a, b, acc) -- provided the
 * hardware follows the SDM's sequential definition of TDPBF16PS, which mxfp8i_amx_self_test() checks before use.
 *
 * Compiled with -mavx512f/bw/vl/dq/bf16 -mamx-tile -mamx-bf16 (CMakeLists.txt): call only on an AMX CPU
 * (mxfp8i_isa() == MXFP8_ISA_AMX); the emulation and the packers need AVX-512F/BW only.
 */
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <threads.h>

#include "../../gemm/ukernel.h"
#include "../../internal.h"
#include "amx.h"

/* ---------------------------------------------------------------------------------------------------------- */
/* packing                                                                                                     */
/* ---------------------------------------------------------------------------------------------------------- */
/* Facts of one tile-chunk t[16][32] (raw FP32 bits). */
static mxfp8i_amx_meta chunk_meta(const uint32_t *t) {
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
    mxfp8i_amx_meta m;
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

int64_t mxfp8i_amx_panel_bytes(int64_t K, int w) {
    (void)w; /* always 32 rows (w <= 32) */
    return mxfp8i_amx_chunks(K) * MXFP8I_AMX_CHUNK_BYTES;
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

/* cm = 0: element (r, k) at src[r*rs + k]; cm = 1: at src[k*rs + r] (column-major, rs = leading dimension). */
static void amx_pack(int is_b, const float *src, int64_t rs, int rows, int64_t K, void *panel_v, int swap, int cm) {
    uint8_t *panel = panel_v;
    const __m512i ev = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i od = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    uint32_t t[16 * 32] __attribute__((aligned(64)));
    int64_t nch = mxfp8i_amx_chunks(K);
    for (int64_t ch = 0; ch < nch; ch++) {
        uint8_t *chunk = panel + ch * MXFP8I_AMX_CHUNK_BYTES;
        memset(chunk, 0, 64); /* header: two mxfp8i_amx_meta, the pair-order byte, zeros */
        chunk[MXFP8I_AMX_SWAP_BYTE] = (uint8_t)swap;
        int64_t k0 = ch * MXFP8I_AMX_KCHUNK;
        int kn = (int)(K - k0 < MXFP8I_AMX_KCHUNK ? K - k0 : MXFP8I_AMX_KCHUNK);
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
            mxfp8i_amx_meta m = chunk_meta(t);
            memcpy(chunk + tile * sizeof m, &m, sizeof m);
            uint8_t *slot = chunk + 64 + tile * MXFP8I_AMX_SLOT;
            if (m.f32) {
                uint32_t *s = (uint32_t *)slot;
                if (!is_b) memcpy(s, t, sizeof t); /* [r][kk] */
                else
                    for (int kk = 0; kk < 32; kk++)
                        for (int j = 0; j < 16; j++) s[kk * 16 + j] = t[j * 32 + kk]; /* [kk][j] */
            } else {
                /* Pair dwords of each row: bf16(kk = 2p) | bf16(kk = 2p + 1) << 16 (the high halves of the
                 * BF16-exact FP32 values), rotated by 16 bits when swap. A: row r's 16 dwords at byte r*64 (the
                 * [r][kk] bf16 layout); B (VNNI): dword (p, j) at byte p*64 + j*4, a 16x16 transpose. */
                __m512i w[16];
                for (int j = 0; j < 16; j++) {
                    __m512i v0 = _mm512_load_si512((const void *)(t + j * 32));
                    __m512i v1 = _mm512_load_si512((const void *)(t + j * 32 + 16));
                    __m512i e = _mm512_permutex2var_epi32(v0, ev, v1), o = _mm512_permutex2var_epi32(v0, od, v1);
                    __m512i d = _mm512_or_si512(_mm512_srli_epi32(e, 16),
                                                _mm512_and_si512(o, _mm512_set1_epi32((int)0xFFFF0000u)));
                    if (swap) d = _mm512_rol_epi32(d, 16);
                    if (is_b) w[j] = d;
                    else _mm512_store_si512((void *)(slot + j * 64), d);
                }
                if (is_b) {
                    transpose16(w);
                    for (int p = 0; p < 16; p++) _mm512_store_si512((void *)(slot + p * 64), w[p]);
                }
            }
        }
    }
}


void mxfp8i_amx_pack(int is_b, const float *src, int64_t rs, int rows, int64_t K, void *panel) {
    amx_pack(is_b, src, rs, rows, K, panel, 0, 0);
}
void mxfp8i_amx_pack_swapped(int is_b, const float *src, int64_t rs, int rows, int64_t K, void *panel) {
    amx_pack(is_b, src, rs, rows, K, panel, 1, 0);
}
void mxfp8i_amx_pack_cm(int is_b, const float *src, int64_t ld, int rows, int64_t K, void *panel) {
    amx_pack(is_b, src, ld, rows, K, panel, 0, 1);
}
void mxfp8i_amx_pack_swapped_cm(int is_b, const float *src, int64_t ld, int rows, int64_t K, void *panel) {
    amx_pack(is_b, src, ld, rows, K, panel, 1, 1);
}
mxfp8i_amx_pack_fn mxfp8i_amx_pack_cm_for(const struct mxfp8i_ukernel *uk) {
    if (!uk) return NULL;
    if (uk->pack == mxfp8i_amx_pack) return mxfp8i_amx_pack_cm;
    if (uk->pack == mxfp8i_amx_pack_swapped) return mxfp8i_amx_pack_swapped_cm;
    return NULL;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* the exact path and the accumulator check                                                                    */
/* ---------------------------------------------------------------------------------------------------------- */

/* Values of one chunk as FP32: af[i][kk] (32 rows of A), bf[kk][j] (32 columns of B). a, b: chunk bases. */
static void expand_chunk(const uint8_t *a, const uint8_t *b, float *af, float *bf) {
    const mxfp8i_amx_meta *am = mxfp8i_amx_chunk_meta(a), *bm = mxfp8i_amx_chunk_meta(b);
    int sa_sw = a[MXFP8I_AMX_SWAP_BYTE], sb_sw = b[MXFP8I_AMX_SWAP_BYTE];
    for (int tile = 0; tile < 2; tile++) {
        const uint8_t *sa = a + 64 + tile * MXFP8I_AMX_SLOT, *sb = b + 64 + tile * MXFP8I_AMX_SLOT;
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
void mxfp8i_amx_exact_chunk(float *cb, const void *a_chunk, const void *b_chunk, int kn) {
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
int mxfp8i_amx_acc_ok(const float *cb) {
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
void mxfp8i_amx_load_acc(float *cb, const float *c, int64_t ldc, int mr, int nr, int load_c) {
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
void mxfp8i_amx_store_acc(const float *cb, float *c, int64_t ldc, int mr, int nr) {
    __mmask16 m0 = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1);
    __mmask16 m1 = nr >= 32 ? (__mmask16)0xFFFF : nr <= 16 ? 0 : (__mmask16)((1u << (nr - 16)) - 1);
    for (int i = 0; i < mr; i++) {
        _mm512_mask_storeu_ps(c + i * ldc, m0, _mm512_load_ps(cb + i * 32));
        _mm512_mask_storeu_ps(c + i * ldc + 16, m1, _mm512_load_ps(cb + i * 32 + 16));
    }
}

/* ---------------------------------------------------------------------------------------------------------- */
/* tiles: the real instructions, and their emulation                                                           */
/* ---------------------------------------------------------------------------------------------------------- */
/* tmm0..3: C tiles (0,0) (0,1) (1,0) (1,1); tmm4, tmm5: A tiles 0, 1; tmm6, tmm7: B tiles 0, 1. Every tile is
 * 16 rows x 64 bytes. Own asm (with "memory" clobbers) rather than the compiler's macros, so that stores to the
 * accumulator buffer are never reordered around a tile load or store. */
#define AMX_LOAD(t, base, stride) \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(base), "r"((long)(stride)) : "memory")
#define AMX_STORE(t, base, stride) \
    __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(base), "r"((long)(stride)) : "memory")
#define AMX_DP(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)

typedef struct __attribute__((packed, aligned(64))) amx_cfg {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;
_Static_assert(sizeof(amx_cfg) == 64, "LDTILECFG reads 64 bytes");

typedef struct emu_tiles {
    float c[4][16][16];
} emu_tiles;

static float bf16_daz(uint16_t h) {
    if ((h & 0x7F80) == 0) h &= 0x8000; /* DAZ: a subnormal input reads as (signed) zero */
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static float f32_ftz(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7F800000) == 0) u &= 0x80000000u; /* FTZ (also used as DAZ on the accumulator input) */
    memcpy(&f, &u, 4);
    return f;
}
/* SDM TDPBF16PS for one 16x16 C tile: A slot [m][kk] bf16, B slot VNNI. */
static void emu_dp(float c[16][16], const uint8_t *as, const uint8_t *bs) {
    for (int m = 0; m < 16; m++) {
        float tmp[16];
        for (int n = 0; n < 16; n++) tmp[n] = f32_ftz(c[m][n]);
        for (int p = 0; p < 16; p++)
            for (int n = 0; n < 16; n++)
                for (int s = 0; s < 2; s++) {
                    uint16_t ha, hb;
                    memcpy(&ha, as + m * 64 + (2 * p + s) * 2, 2);
                    memcpy(&hb, bs + p * 64 + n * 4 + s * 2, 2);
                    tmp[n] = f32_ftz(fmaf(bf16_daz(ha), bf16_daz(hb), tmp[n]));
                }
        for (int n = 0; n < 16; n++) c[m][n] = tmp[n];
    }
}

/* The kernel, once; mode 0 = tiles, 1 = emulation. route = 0: no exact-path routing of full chunks (tests only). */
static inline __attribute__((always_inline)) void kernel_body(int mode, int route, int64_t k0, int64_t kc,
                                                              const void *a_panel, const void *b_panel, float *c,
                                                              int64_t ldc, int mr, int nr, int load_c) {
    const uint8_t *a = (const uint8_t *)a_panel + (k0 / MXFP8I_AMX_KCHUNK) * MXFP8I_AMX_CHUNK_BYTES;
    const uint8_t *b = (const uint8_t *)b_panel + (k0 / MXFP8I_AMX_KCHUNK) * MXFP8I_AMX_CHUNK_BYTES;
    float cb[32 * 32] __attribute__((aligned(64)));
    emu_tiles emu;
    mxfp8i_amx_load_acc(cb, c, ldc, mr, nr, load_c);
    int c_ok = load_c ? mxfp8i_amx_acc_ok(cb) : 1;
    int64_t nfull = kc / MXFP8I_AMX_KCHUNK;
    int tail = (int)(kc % MXFP8I_AMX_KCHUNK);
    const int64_t cs = 32 * 4; /* byte stride of a C row in cb */
    if (nfull > 0) {
        if (mode == 0) {
            amx_cfg cfg;
            memset(&cfg, 0, sizeof cfg);
            cfg.palette_id = 1;
            for (int t = 0; t < 8; t++) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
            __asm__ volatile("ldtilecfg (%0)" ::"r"(&cfg) : "memory");
        }
#define LOAD_C()                                                                                                   \
    do {                                                                                                           \
        if (mode == 0) {                                                                                           \
            AMX_LOAD(0, cb, cs); AMX_LOAD(1, cb + 16, cs); AMX_LOAD(2, cb + 512, cs); AMX_LOAD(3, cb + 528, cs);   \
        } else {                                                                                                   \
            for (int t = 0; t < 4; t++)                                                                            \
                for (int i = 0; i < 16; i++)                                                                       \
                    for (int j = 0; j < 16; j++) emu.c[t][i][j] = cb[((t >> 1) * 16 + i) * 32 + (t & 1) * 16 + j]; \
        }                                                                                                          \
    } while (0)
#define STORE_C()                                                                                                  \
    do {                                                                                                           \
        if (mode == 0) {                                                                                           \
            AMX_STORE(0, cb, cs); AMX_STORE(1, cb + 16, cs); AMX_STORE(2, cb + 512, cs); AMX_STORE(3, cb + 528, cs); \
        } else {                                                                                                   \
            for (int t = 0; t < 4; t++)                                                                            \
                for (int i = 0; i < 16; i++)                                                                       \
                    for (int j = 0; j < 16; j++) cb[((t >> 1) * 16 + i) * 32 + (t & 1) * 16 + j] = emu.c[t][i][j]; \
        }                                                                                                          \
    } while (0)
        LOAD_C();
        for (int64_t ch = 0; ch < nfull; ch++) {
            const uint8_t *ca = a + ch * MXFP8I_AMX_CHUNK_BYTES, *cbp = b + ch * MXFP8I_AMX_CHUNK_BYTES;
            const mxfp8i_amx_meta *ma = mxfp8i_amx_chunk_meta(ca), *mb = mxfp8i_amx_chunk_meta(cbp);
            int on_tiles = route ? (c_ok && mxfp8i_amx_pair_ok(ma, mb) && mxfp8i_amx_pair_ok(ma, mb + 1) && mxfp8i_amx_pair_ok(ma + 1, mb) &&
                                    mxfp8i_amx_pair_ok(ma + 1, mb + 1))
                                 : (!ma[0].f32 && !ma[1].f32 && !mb[0].f32 && !mb[1].f32);
            if (on_tiles) {
                if (mode == 0) {
                    AMX_LOAD(4, ca + 64, 64);
                    AMX_LOAD(5, ca + 64 + MXFP8I_AMX_SLOT, 64);
                    AMX_LOAD(6, cbp + 64, 64);
                    AMX_LOAD(7, cbp + 64 + MXFP8I_AMX_SLOT, 64);
                    AMX_DP(0, 4, 6);
                    AMX_DP(1, 4, 7);
                    AMX_DP(2, 5, 6);
                    AMX_DP(3, 5, 7);
                } else {
                    for (int t = 0; t < 4; t++)
                        emu_dp(emu.c[t], ca + 64 + (t >> 1) * MXFP8I_AMX_SLOT, cbp + 64 + (t & 1) * MXFP8I_AMX_SLOT);
                }
            } else {
                STORE_C();
                mxfp8i_amx_exact_chunk(cb, ca, cbp, MXFP8I_AMX_KCHUNK);
                c_ok = mxfp8i_amx_acc_ok(cb);
                LOAD_C();
            }
        }
        STORE_C();
        if (mode == 0) __asm__ volatile("tilerelease" ::: "memory");
#undef LOAD_C
#undef STORE_C
    }
    if (tail) mxfp8i_amx_exact_chunk(cb, a + nfull * MXFP8I_AMX_CHUNK_BYTES, b + nfull * MXFP8I_AMX_CHUNK_BYTES, tail);
    mxfp8i_amx_store_acc(cb, c, ldc, mr, nr);
}

void mxfp8i_bf16_gemm_32x32__amx(int64_t k0, int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mr,
                                 int nr, int load_c) {
    unsigned csr = mxfp8i_amx_mxcsr_enter();
    kernel_body(0, 1, k0, kc, a, b, c, ldc, mr, nr, load_c);
    mxfp8i_amx_mxcsr_leave(csr);
}

void mxfp8i_bf16_gemm_32x32__amxemu(int64_t k0, int64_t kc, const void *a, const void *b, float *c, int64_t ldc,
                                    int mr, int nr, int load_c, int route) {
    unsigned csr = mxfp8i_amx_mxcsr_enter();
    if (route) kernel_body(1, 1, k0, kc, a, b, c, ldc, mr, nr, load_c);
    else kernel_body(1, 0, k0, kc, a, b, c, ldc, mr, nr, load_c);
    mxfp8i_amx_mxcsr_leave(csr);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* self-test                                                                                                   */
/* ---------------------------------------------------------------------------------------------------------- */
static uint64_t st_rng(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A dequantized E4M3 value: code (finite, random sign) times 2^scale_exp, exact in FP32. */
static float mx_value(uint64_t *s, int scale_exp) {
    uint8_t code = (uint8_t)(st_rng(s) % 127u); /* 0..126: finite E4M3 magnitudes (0x7F is NaN) */
    if (st_rng(s) & 1) code |= 0x80;
    return ldexpf(mxfp8_fp8_to_fp32(code, MXFP8_FMT_E4M3), scale_exp);
}

enum { REG_NORMAL = 0, REG_SUBNORMAL = 1, REG_TINY_PRODUCT = 2, REG_HUGE = 3 };

/* Buffers of the checker (heap: no large static or thread-local storage in the library). */
enum { CHECK_KMAX = 256 };
typedef struct check_ws {
    float A[32 * CHECK_KMAX], B[32 * CHECK_KMAX];
    float ap[CHECK_KMAX * MXFP8I_MR], bp[CHECK_KMAX * MXFP8I_NR];
    uint8_t pa[(CHECK_KMAX / 32) * MXFP8I_AMX_CHUNK_BYTES], pb[(CHECK_KMAX / 32) * MXFP8I_AMX_CHUNK_BYTES];
    float c_init[32 * 32], c_ref[32 * 32], c_k[32 * 32];
} check_ws;

/* One case: fill A[32][K], B[32][K] group by group (group g gets scale exponents from the regime of chunk g; rows
 * past mr / nr are zero), run the kernel and the reference F32 microkernel, compare bits. 1 if they differ. */
static int run_case(check_ws *w, int kind, uint64_t seed, int64_t K, int mr, int nr, int load_c, const int *regime,
                    int trap) {
    float *A = w->A, *B = w->B;
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int r = 0; r < 32; r++)
        for (int64_t k = 0; k < K; k++) {
            int g = (int)(k / 32);
            int base = regime[g] == REG_SUBNORMAL ? -127 : regime[g] == REG_TINY_PRODUCT ? -66
                     : regime[g] == REG_HUGE ? 58 : -8;
            int spread = regime[g] == REG_NORMAL ? 16 : 4;
            int ea = base + (int)(st_rng(&s) % (uint64_t)spread), eb = base + (int)(st_rng(&s) % (uint64_t)spread);
            if (regime[g] == REG_SUBNORMAL) eb = -4; /* only A's values reach below 2^-126 */
            A[r * K + k] = (r < mr) ? mx_value(&s, ea) : 0.0f;
            B[r * K + k] = (r < nr) ? mx_value(&s, eb) : 0.0f;
        }
    if (trap && K >= 8) {
        /* Pair-rounding traps. k 0: acc = 1; pair (2, 3): products 2^-24, 2^-24 -- sequential RNE keeps 1, a fused
         * pair gives 1 + 2^-23. k 4: acc = 2^24; pair (6, 7): products 1 then 2 -- even-first sequential gives
         * 2^24 + 2, odd-first or fused gives 2^24 + 4. */
        static const float ta[8] = {1.0f, 0.0f, 0x1p-12f, 0x1p-12f, 0x1p12f, 0.0f, 1.0f, 1.0f};
        static const float tb[8] = {1.0f, 0.0f, 0x1p-12f, 0x1p-12f, 0x1p12f, 0.0f, 1.0f, 2.0f};
        for (int r = 0; r < 32; r++)
            for (int k = 0; k < 8; k++) {
                A[r * K + k] = r < mr ? ta[k] : 0.0f;
                B[r * K + k] = r < nr ? tb[k] : 0.0f;
            }
    }
    for (int i = 0; i < 32 * 32; i++) w->c_init[i] = (load_c && !trap) ? mx_value(&s, -2) : 0.0f;
    /* reference: the F32 reference microkernel over MXFP8I_MR x MXFP8I_NR register tiles */
    memcpy(w->c_ref, w->c_init, sizeof w->c_ref);
    for (int m0 = 0; m0 < mr; m0 += MXFP8I_MR)
        for (int n0 = 0; n0 < nr; n0 += MXFP8I_NR) {
            int mrr = mr - m0 < MXFP8I_MR ? mr - m0 : MXFP8I_MR, nrr = nr - n0 < MXFP8I_NR ? nr - n0 : MXFP8I_NR;
            for (int64_t k = 0; k < K; k++) {
                for (int i = 0; i < MXFP8I_MR; i++) w->ap[k * MXFP8I_MR + i] = m0 + i < 32 ? A[(m0 + i) * K + k] : 0.0f;
                for (int j = 0; j < MXFP8I_NR; j++) w->bp[k * MXFP8I_NR + j] = n0 + j < 32 ? B[(n0 + j) * K + k] : 0.0f;
            }
            unsigned csr = mxfp8i_amx_mxcsr_enter(); /* the reference is IEEE fmaf, whatever the caller set */
            mxfp8i_f32_gemm_8x32__ref(K, w->ap, w->bp, w->c_ref + m0 * 32 + n0, 32, mrr, nrr, load_c);
            mxfp8i_amx_mxcsr_leave(csr);
        }
    void (*pack)(int, const float *, int64_t, int, int64_t, void *) =
        (kind == 3 || kind == 5) ? mxfp8i_amx_pack_swapped : mxfp8i_amx_pack;
    pack(0, A, K, mr, K, w->pa);
    pack(1, B, K, nr, K, w->pb);
    memcpy(w->c_k, w->c_init, sizeof w->c_k);
    if (kind == 0) mxfp8i_bf16_gemm_32x32__amx(0, K, w->pa, w->pb, w->c_k, 32, mr, nr, load_c);
    else if (kind == 5) mxfp8i_bf16_gemm_32x32__avx512bf16_noroute(0, K, w->pa, w->pb, w->c_k, 32, mr, nr, load_c);
    else if (kind >= 3) mxfp8i_bf16_gemm_32x32__avx512bf16(0, K, w->pa, w->pb, w->c_k, 32, mr, nr, load_c);
    else mxfp8i_bf16_gemm_32x32__amxemu(0, K, w->pa, w->pb, w->c_k, 32, mr, nr, load_c, kind == 1);
    for (int i = 0; i < 32; i++)
        for (int j = 0; j < 32; j++) {
            int valid = i < mr && j < nr;
            if (memcmp(&w->c_k[i * 32 + j], valid ? &w->c_ref[i * 32 + j] : &w->c_init[i * 32 + j], 4) != 0) return 1;
        }
    return 0;
}

int mxfp8i_amx_check_kernel(int kind, int quick, int *ncases) {
    /* full: every K and tile shape; quick (the run-time self-tests): the K tail and partial tiles, still every
     * regime and the traps */
    static const int64_t Ks_full[] = {32, 71, 160, 7, 256}, Ks_quick[] = {71, 160}; /* the trap needs K >= 8 */
    static const int mrs_full[][2] = {{32, 32}, {19, 27}, {1, 1}, {16, 17}}, mrs_quick[][2] = {{32, 32}, {19, 27}};
    const int64_t *Ks = quick ? Ks_quick : Ks_full;
    const int(*mrs)[2] = quick ? mrs_quick : mrs_full;
    unsigned nK = quick ? 2u : 5u, nM = quick ? 2u : 4u;
    int regime[CHECK_KMAX / 32], fails = 0, n = 0;
    check_ws *w = aligned_alloc(64, (sizeof(check_ws) + 63) & ~(size_t)63);
    if (!w) {
        if (ncases) *ncases = 0;
        return -1;
    }
    for (int reg = 0; reg < 5; reg++)
        for (unsigned ki = 0; ki < nK; ki++)
            for (unsigned mi = 0; mi < nM; mi++)
                for (int load_c = 0; load_c < 2; load_c++) {
                    int64_t K = Ks[ki];
                    /* all groups normal, or one special group (the second when there is one, so the accumulators
                     * are nonzero when it arrives), or (reg 4) the pair-rounding trap in the first chunk */
                    for (int g = 0; g < CHECK_KMAX / 32; g++) regime[g] = REG_NORMAL;
                    int special = mxfp8i_amx_chunks(K) > 1 ? 1 : 0;
                    if (reg == 1) regime[special] = REG_SUBNORMAL;
                    if (reg == 2) regime[special] = REG_TINY_PRODUCT;
                    if (reg == 3) regime[special] = REG_HUGE;
                    uint64_t seed = (uint64_t)(reg * 1000 + ki * 100 + mi * 10 + load_c + 1);
                    fails += run_case(w, kind, seed, K, mrs[mi][0], mrs[mi][1], load_c, regime, reg == 4);
                    n++;
                }
    /* every group tiny-product: the accumulators themselves stay below 2^-100 */
    for (int g = 0; g < CHECK_KMAX / 32; g++) regime[g] = REG_TINY_PRODUCT;
    fails += run_case(w, kind, 77, CHECK_KMAX, 32, 32, 0, regime, 0);
    n++;
    free(w);
    if (ncases) *ncases = n;
    return fails;
}

static once_flag g_selftest_once = ONCE_FLAG_INIT;
static const char *g_selftest_result;
static char g_selftest_msg[160];

static void selftest_run(void) {
    int n = 0, fails = mxfp8i_amx_check_kernel(0, 1, &n);
    if (fails < 0) {
        g_selftest_result = "AMX self-test could not allocate its workspace";
    } else if (fails == 0) {
        g_selftest_result = NULL;
    } else {
        snprintf(g_selftest_msg, sizeof g_selftest_msg,
                 "AMX self-test failed: TDPBF16PS differs from the reference FMA sequence in %d of %d cases; using AVX-512", fails,
                 n);
        g_selftest_result = g_selftest_msg;
    }
}

const char *mxfp8i_amx_self_test(void) {
    call_once(&g_selftest_once, selftest_run);
    return g_selftest_result;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* the GEMM slot (src/gemm/ukernel.h)                                                                          */
/* ---------------------------------------------------------------------------------------------------------- */
static const mxfp8i_ukernel k_amx = {
    .name = "bf16_gemm_32x32__amx", .panel = MXFP8I_PANEL_OTHER, .mr = 32, .nr = 32, .kalign = MXFP8I_AMX_KCHUNK,
    .exact_order = 1, .fn = NULL, .panel_bytes = mxfp8i_amx_panel_bytes, .pack = mxfp8i_amx_pack,
    .run = mxfp8i_bf16_gemm_32x32__amx};

const mxfp8i_ukernel *mxfp8i_amx_ukernel(void) { return mxfp8i_amx_self_test() ? NULL : &k_amx; }
