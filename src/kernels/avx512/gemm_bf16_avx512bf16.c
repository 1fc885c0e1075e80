/*
 * gemm_bf16_avx512bf16.c -- the AVX512-BF16 (VDPBF16PS) GEMM microkernel on BF16 chunk panels (bf16chunk.h).
 *
 * Contract: the microkernel contract of src/kernels/ukernel.h with MR = NR = 32: C[valid mr x nr of 32x32] (=|+=)
 * the steps [k0, k0 + kc) of two panels, equal to the reference FMA sequence bit for bit. Why it can be exact and
 * how chunks are routed: bf16chunk.h.
 * VDPBF16PS reads exactly the panel's layout: a dword of the A slot is one row's pair (k = 2p, 2p + 1), broadcast to
 * 16 lanes; the 64-byte row p of the VNNI B slot is that pair for 16 columns. Per lane the unit does two FP32 FMAs
 * (DAZ, FTZ, RNE) in its own order within the pair; panels packed with swapped pairs (mxfp8i_bf16c_pack_swapped)
 * make a unit that takes the odd element first see k = 2p first, plain panels suit an even-first unit. The registry
 * keeps the descriptor whose packing reproduces the reference in the kernel checker (the SDM and AMD Zen 4: odd
 * first).
 *
 * Register tile: 8 rows x 32 columns (16 zmm accumulators), kept in registers across a run of consecutive chunks
 * that may all use the unit; a chunk that may not (or a partial last chunk) runs mxfp8i_bf16c_exact_chunk on the stored
 * accumulators. Compiled with -mavx512bf16 (this folder's flags); call only when the CPU has AVX512-BF16.
 */
#include <immintrin.h>
#include <string.h>

#include "../../runtime/fenv.h"
#include "avx512.h"
#include "bf16chunk.h"

/* Prefetch distance in chunks (kernel alone, 4 A x 64 B panels streamed, K = 2048: none 173-179 GFLOP/s, 1 chunk
 * ahead 180-186, 2 ahead 187-188, 4 ahead 184-188; L2-resident panels unchanged at 227). */
#define PF_DIST 2


/* A partial last chunk (kc % 32 steps) may run on the unit too: its steps past K are zeros in both panels, and
 * acc + (+0)(+0) = acc for every accumulator the unit may take, except -0 (-0 + +0 = +0 where the reference, which
 * stops at K, keeps -0). An accumulator starts at +0 or at C and stays -0 only while every product is -0, so the
 * tail goes to the unit when the chunk and the accumulators pass the usual tests and no accumulator is -0. */
static inline __attribute__((always_inline)) int has_neg_zero(const __m512 *v, int n) {
    __mmask16 z = 0;
    for (int i = 0; i < n; i++) z |= _mm512_cmpeq_epi32_mask(_mm512_castps_si512(v[i]), _mm512_set1_epi32((int)0x80000000u));
    return z != 0;
}

/* ---- full 32 x 32 tiles: accumulators loaded from and stored to C directly ---- */

/* Bit ch of the result: chunk ch of [0, nch) (nch <= 64) may run on the unit (all four tile pairs). */
static uint64_t ok_mask(const uint8_t *a, const uint8_t *b, int64_t nch, int route) {
    uint64_t m = 0;
    for (int64_t ch = 0; ch < nch; ch++)
        if (mxfp8i_bf16c_chunk_ok(a + ch * MXFP8I_BF16C_CHUNK_BYTES, b + ch * MXFP8I_BF16C_CHUNK_BYTES, route))
            m |= (uint64_t)1 << ch;
    return m;
}

/* 1 when every lane of the 16 accumulators is zero or 2^-103 <= |c| < Inf (biased exponent 24..254): then its
 * lowest set bit is >= 2^-126 (bf16chunk.h, condition 2). A conservative test: an accumulator that fails it only
 * sends its chunks down the exact path, which is always exact. */
static inline __attribute__((always_inline)) int regs_ok(const __m512 acc[8][2]) {
    const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF), lo = _mm512_set1_epi32(24 << 23),
                  span = _mm512_set1_epi32((255 - 24) << 23);
    __mmask16 bad = 0;
    for (int r = 0; r < 8; r++)
        for (int h = 0; h < 2; h++) {
            __m512i ax = _mm512_and_si512(_mm512_castps_si512(acc[r][h]), absm);
            bad |= _mm512_cmpge_epu32_mask(_mm512_sub_epi32(ax, lo), span) & _mm512_test_epi32_mask(ax, ax);
        }
    return bad == 0;
}

/* nch chunks from bases a (this group's 8 rows of the A slot) and b, all allowed on the unit, into acc. Software
 * prefetch of the chunk PF_DIST ahead (its B slots, this group's 8 A rows): panels streamed from memory (a B panel is
 * reused only by the few A panels of a tile) kept the unit waiting; the BF16 halves of the slots are 1 KiB runs
 * 2 KiB apart, which the hardware prefetchers follow poorly. */
static inline __attribute__((always_inline)) void dp_chunks(__m512 acc[8][2], const uint8_t *a, const uint8_t *b,
                                                            int64_t nch) {
    for (int64_t ch = 0; ch < nch; ch++) {
        const uint8_t *ca = a + ch * MXFP8I_BF16C_CHUNK_BYTES, *cbb = b + ch * MXFP8I_BF16C_CHUNK_BYTES + 64;
        const uint8_t *na = ca + PF_DIST * MXFP8I_BF16C_CHUNK_BYTES, *nb = cbb + PF_DIST * MXFP8I_BF16C_CHUNK_BYTES;
        const int pf = ch + PF_DIST < nch;
        for (int p = 0; p < 16; p++) {
            if (pf) {
                _mm_prefetch((const char *)(nb + p * 64), _MM_HINT_T0);
                _mm_prefetch((const char *)(nb + MXFP8I_BF16C_SLOT + p * 64), _MM_HINT_T0);
                if (p < 8) _mm_prefetch((const char *)(na + p * 64), _MM_HINT_T0);
            }
            __m512i b0 = _mm512_load_si512((const void *)(cbb + p * 64));
            __m512i b1 = _mm512_load_si512((const void *)(cbb + MXFP8I_BF16C_SLOT + p * 64));
            for (int r = 0; r < 8; r++) {
                int32_t w;
                memcpy(&w, ca + r * 64 + p * 4, 4);
                __m512bh av = (__m512bh)_mm512_set1_epi32(w);
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, (__m512bh)b0);
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, (__m512bh)b1);
            }
        }
    }
}

/* nch consecutive chunks (bases a, b), all allowed on the unit, onto cb rows [0, mr) (the 32 x 32 copy of a
 * partial tile). */
static void dp_run(float *cb, const uint8_t *a, const uint8_t *b, int64_t nch, int mr) {
    for (int g = 0; g < mr; g += 8) {
        __m512 acc[8][2];
        for (int r = 0; r < 8; r++) {
            acc[r][0] = _mm512_load_ps(cb + (g + r) * 32);
            acc[r][1] = _mm512_load_ps(cb + (g + r) * 32 + 16);
        }
        dp_chunks(acc, a + 64 + (g / 16) * MXFP8I_BF16C_SLOT + (g % 16) * 64, b, nch);
        for (int r = 0; r < 8; r++) {
            _mm512_store_ps(cb + (g + r) * 32, acc[r][0]);
            _mm512_store_ps(cb + (g + r) * 32 + 16, acc[r][1]);
        }
    }
}

static inline __attribute__((always_inline)) void load_rows(__m512 acc[8][2], const float *c, int64_t ldc,
                                                            int load_c) {
    for (int r = 0; r < 8; r++) {
        acc[r][0] = load_c ? _mm512_loadu_ps(c + r * ldc) : _mm512_setzero_ps();
        acc[r][1] = load_c ? _mm512_loadu_ps(c + r * ldc + 16) : _mm512_setzero_ps();
    }
}
static inline __attribute__((always_inline)) void store_rows(const __m512 acc[8][2], float *c, int64_t ldc) {
    for (int r = 0; r < 8; r++) {
        _mm512_storeu_ps(c + r * ldc, acc[r][0]);
        _mm512_storeu_ps(c + r * ldc + 16, acc[r][1]);
    }
}

/* A full tile (mr = nr = 32): per group of 8 rows, the accumulators live in registers across every run of chunks
 * allowed on the unit; a chunk that is not (or one after an accumulator left the safe range) is run on C by the
 * exact path between a store and a reload. */
static inline __attribute__((always_inline)) void full_tile(int route, int64_t nfull, int tail, const uint8_t *a,
                                                            const uint8_t *b, float *c, int64_t ldc, int load_c) {
    const uint64_t ok = ok_mask(a, b, nfull, route);
    const int tail_ok = tail && mxfp8i_bf16c_chunk_ok(a + nfull * MXFP8I_BF16C_CHUNK_BYTES,
                                                      b + nfull * MXFP8I_BF16C_CHUNK_BYTES, route);
    for (int g = 0; g < 32; g += 8) {
        const uint8_t *ag = a + 64 + (g / 16) * MXFP8I_BF16C_SLOT + (g % 16) * 64;
        float *cg = c + g * ldc;
        __m512 acc[8][2];
        load_rows(acc, cg, ldc, load_c);
        int c_ok = !route || !load_c || regs_ok(acc);
        int64_t ch = 0;
        while (ch < nfull) {
            if (!c_ok || !(ok >> ch & 1)) {
                store_rows(acc, cg, ldc);
                mxfp8i_bf16c_exact_rows8(cg, ldc, g, a + ch * MXFP8I_BF16C_CHUNK_BYTES,
                                         b + ch * MXFP8I_BF16C_CHUNK_BYTES, MXFP8I_BF16C_KCHUNK);
                load_rows(acc, cg, ldc, 1);
                c_ok = !route || regs_ok(acc);
                ch++;
                continue;
            }
            int64_t end = ch + 1;
            while (end < nfull && (ok >> end & 1)) end++;
            dp_chunks(acc, ag + ch * MXFP8I_BF16C_CHUNK_BYTES, b + ch * MXFP8I_BF16C_CHUNK_BYTES, end - ch);
            ch = end; /* accumulators stay multiples of 2^-126 on the unit: c_ok holds */
        }
        if (tail && c_ok && tail_ok && !has_neg_zero(&acc[0][0], 16)) { /* steps past K are zeros (above) */
            dp_chunks(acc, ag + nfull * MXFP8I_BF16C_CHUNK_BYTES, b + nfull * MXFP8I_BF16C_CHUNK_BYTES, 1);
            store_rows(acc, cg, ldc);
            continue;
        }
        store_rows(acc, cg, ldc);
        if (tail)
            mxfp8i_bf16c_exact_rows8(cg, ldc, g, a + nfull * MXFP8I_BF16C_CHUNK_BYTES,
                                     b + nfull * MXFP8I_BF16C_CHUNK_BYTES, tail);
    }
}

static inline __attribute__((always_inline)) void kernel(int route, int64_t k0, int64_t kc, const void *a_panel,
                                                         const void *b_panel, float *c, int64_t ldc, int mr, int nr,
                                                         int load_c) {
    int64_t nfull0 = kc / MXFP8I_BF16C_KCHUNK;
    if (mr == 32 && nr == 32 && nfull0 <= 64) {
        const uint8_t *a0 = (const uint8_t *)a_panel + (k0 / MXFP8I_BF16C_KCHUNK) * MXFP8I_BF16C_CHUNK_BYTES;
        const uint8_t *b0 = (const uint8_t *)b_panel + (k0 / MXFP8I_BF16C_KCHUNK) * MXFP8I_BF16C_CHUNK_BYTES;
        full_tile(route, nfull0, (int)(kc % MXFP8I_BF16C_KCHUNK), a0, b0, c, ldc, load_c);
        return;
    }
    /* partial tiles (and passes over 64 chunks): on a 32 x 32 copy of the valid block */
    float cb[32 * 32] __attribute__((aligned(64)));
    mxfp8i_bf16c_load_acc(cb, c, ldc, mr, nr, load_c);
    int c_ok = load_c ? mxfp8i_bf16c_acc_ok(cb) : 1;
    const uint8_t *a = (const uint8_t *)a_panel + (k0 / MXFP8I_BF16C_KCHUNK) * MXFP8I_BF16C_CHUNK_BYTES;
    const uint8_t *b = (const uint8_t *)b_panel + (k0 / MXFP8I_BF16C_KCHUNK) * MXFP8I_BF16C_CHUNK_BYTES;
    int64_t nfull = kc / MXFP8I_BF16C_KCHUNK;
    int tail = (int)(kc % MXFP8I_BF16C_KCHUNK);
    int64_t ch = 0;
    while (ch < nfull) {
        const uint8_t *ca = a + ch * MXFP8I_BF16C_CHUNK_BYTES, *cbp = b + ch * MXFP8I_BF16C_CHUNK_BYTES;
        if ((route && !c_ok) || !mxfp8i_bf16c_chunk_ok(ca, cbp, route)) {
            mxfp8i_bf16c_exact_chunk(cb, ca, cbp, MXFP8I_BF16C_KCHUNK);
            c_ok = mxfp8i_bf16c_acc_ok(cb);
            ch++;
            continue;
        }
        int64_t end = ch + 1;
        while (end < nfull && mxfp8i_bf16c_chunk_ok(a + end * MXFP8I_BF16C_CHUNK_BYTES, b + end * MXFP8I_BF16C_CHUNK_BYTES, route))
            end++;
        dp_run(cb, ca, cbp, end - ch, mr); /* accumulators stay multiples of 2^-126: c_ok holds */
        ch = end;
    }
    if (tail) {
        const uint8_t *ca = a + nfull * MXFP8I_BF16C_CHUNK_BYTES, *cbp = b + nfull * MXFP8I_BF16C_CHUNK_BYTES;
        if ((!route || c_ok) && mxfp8i_bf16c_chunk_ok(ca, cbp, route) && !has_neg_zero((const __m512 *)cb, 64))
            dp_run(cb, ca, cbp, 1, mr); /* steps past K are zeros (see has_neg_zero) */
        else
            mxfp8i_bf16c_exact_chunk(cb, ca, cbp, tail);
    }
    mxfp8i_bf16c_store_acc(cb, c, ldc, mr, nr);
}

/* libmxfp8 holds the real kernels; the test build compiles this file again with MXFP8_TEST_KERNELS for the
 * negative control alone (CMakeLists.txt: mxfp8_test_kernels), so it stays out of the shared library. */
#ifndef MXFP8_TEST_KERNELS
static void run_dp(int64_t k0, int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mr, int nr,
                   int load_c) {
    unsigned csr = mxfp8i_fenv_enter();
    kernel(1, k0, kc, a, b, c, ldc, mr, nr, load_c);
    mxfp8i_fenv_leave(csr);
}
#else
static void run_noroute(int64_t k0, int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mr, int nr,
                        int load_c) {
    unsigned csr = mxfp8i_fenv_enter();
    kernel(0, k0, kc, a, b, c, ldc, mr, nr, load_c);
    mxfp8i_fenv_leave(csr);
}
#endif

/* ---------------------------------------------------------------------------------------------------------- */
/* the GEMM slots (src/kernels/ukernel.h)                                                                      */
/* ---------------------------------------------------------------------------------------------------------- */
/* Tiles: the kernel reloads and checks its 32x32 accumulators per call, so a deep k tile pays: 512 measured ~16%
 * faster than 128 at 1024x2048x1024 on AMD Zen 4, and 2048 another 3-6% over 512 on the kernel alone (4 x 8 panels,
 * K = 2048: 220 -> 227 GFLOP/s; K = 4096: 206 -> 214). Speed only. */
#define DP_SLOT(nm, packfn, packcm, packq, tonly, runfn)                                                                      \
    {.name = nm, .isa_name = "avx512_bf16", .isa_level = 1, .needs = MXFP8I_NEEDS_AVX512 | MXFP8I_NEEDS_AVX512_BF16,  \
     .test_only = tonly, .panel = MXFP8I_PANEL_BF16C, .mr = 32, .nr = 32, .kalign = MXFP8I_BF16C_KCHUNK,               \
     .tile_m = 128, .tile_n = 256, .tile_k = 2048, .fn = NULL, .panel_bytes = mxfp8i_bf16c_panel_bytes,               \
     .pack = packfn, .pack_cm = packcm, .pack_q = packq, .run = runfn, .selftest = MXFP8I_SELFTEST_SLOT}
#ifndef MXFP8_TEST_KERNELS
/* The unit takes the odd element of each pair first (the SDM; AMD Zen 4): panels with swapped pairs. */
const mxfp8i_ukernel mxfp8i_bf16_gemm_32x32__avx512bf16_oddfirst_ukernel =
    DP_SLOT("bf16_gemm_32x32__avx512bf16_oddfirst", mxfp8i_bf16c_pack_swapped, mxfp8i_bf16c_pack_swapped_cm,
            mxfp8i_bf16c_pack_q_swapped, 0, run_dp);
/* A unit that takes the even element first: plain panels. */
const mxfp8i_ukernel mxfp8i_bf16_gemm_32x32__avx512bf16_evenfirst_ukernel =
    DP_SLOT("bf16_gemm_32x32__avx512bf16_evenfirst", mxfp8i_bf16c_pack, mxfp8i_bf16c_pack_cm, mxfp8i_bf16c_pack_q_plain,
            0, run_dp);
#else
/* Negative control (tests only): no DAZ/FTZ routing; must fail the checker on real hardware. */
const mxfp8i_ukernel mxfp8i_bf16_gemm_32x32__avx512bf16_noroute_ukernel =
    DP_SLOT("bf16_gemm_32x32__avx512bf16_noroute", mxfp8i_bf16c_pack_swapped, mxfp8i_bf16c_pack_swapped_cm,
            mxfp8i_bf16c_pack_q_swapped, 1, run_noroute);
#endif
