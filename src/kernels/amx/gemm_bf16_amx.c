/*
 * gemm_bf16_amx.c -- the AMX-BF16 GEMM microkernel (TDPBF16PS, 2x2 tiles = 32x32 of C) on BF16 chunk panels, and a C
 * emulation of the tile instructions (the SDM definition: DAZ, FTZ, RNE, sequential pairs) for the tests.
 *
 * Contract: the microkernel contract of src/kernels/ukernel.h with MR = NR = 32, bit for bit. Panel format and why
 * the tiles can be exact: src/kernels/avx512/bf16chunk.h. A 32-step chunk of k runs on the tiles only when no BF16
 * subnormal input, no subnormal partial sum and no product overflow can occur (facts the packer records per
 * tile-chunk); any other chunk, and a trailing partial chunk, runs with AVX-512 FMAs in ascending k on the stored
 * accumulators. The registry uses the kernel only after the kernel checker (src/kernels/check.h) reproduced the
 * reference on this CPU.
 *
 * Compiled with -mavx512f/bw/vl/dq/bf16 -mamx-tile -mamx-bf16 (CMakeLists.txt): the real kernel needs AMX-TILE +
 * AMX-BF16 and the XTILEDATA permission; the emulation needs AVX-512F/BW only.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "../../runtime/fenv.h"
#include "../avx512/bf16chunk.h"
#include "amx.h"

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
    const uint8_t *a = (const uint8_t *)a_panel + (k0 / MXFP8I_BF16C_KCHUNK) * MXFP8I_BF16C_CHUNK_BYTES;
    const uint8_t *b = (const uint8_t *)b_panel + (k0 / MXFP8I_BF16C_KCHUNK) * MXFP8I_BF16C_CHUNK_BYTES;
    float cb[32 * 32] __attribute__((aligned(64)));
    emu_tiles emu;
    mxfp8i_bf16c_load_acc(cb, c, ldc, mr, nr, load_c);
    int c_ok = load_c ? mxfp8i_bf16c_acc_ok(cb) : 1;
    int64_t nfull = kc / MXFP8I_BF16C_KCHUNK;
    int tail = (int)(kc % MXFP8I_BF16C_KCHUNK);
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
            const uint8_t *ca = a + ch * MXFP8I_BF16C_CHUNK_BYTES, *cbp = b + ch * MXFP8I_BF16C_CHUNK_BYTES;
            const mxfp8i_bf16c_meta *ma = mxfp8i_bf16c_chunk_meta(ca), *mb = mxfp8i_bf16c_chunk_meta(cbp);
            int on_tiles = route ? (c_ok && mxfp8i_bf16c_pair_ok(ma, mb) && mxfp8i_bf16c_pair_ok(ma, mb + 1) && mxfp8i_bf16c_pair_ok(ma + 1, mb) &&
                                    mxfp8i_bf16c_pair_ok(ma + 1, mb + 1))
                                 : (!ma[0].f32 && !ma[1].f32 && !mb[0].f32 && !mb[1].f32);
            if (on_tiles) {
                if (mode == 0) {
                    AMX_LOAD(4, ca + 64, 64);
                    AMX_LOAD(5, ca + 64 + MXFP8I_BF16C_SLOT, 64);
                    AMX_LOAD(6, cbp + 64, 64);
                    AMX_LOAD(7, cbp + 64 + MXFP8I_BF16C_SLOT, 64);
                    AMX_DP(0, 4, 6);
                    AMX_DP(1, 4, 7);
                    AMX_DP(2, 5, 6);
                    AMX_DP(3, 5, 7);
                } else {
                    for (int t = 0; t < 4; t++)
                        emu_dp(emu.c[t], ca + 64 + (t >> 1) * MXFP8I_BF16C_SLOT, cbp + 64 + (t & 1) * MXFP8I_BF16C_SLOT);
                }
            } else {
                STORE_C();
                mxfp8i_bf16c_exact_chunk(cb, ca, cbp, MXFP8I_BF16C_KCHUNK);
                c_ok = mxfp8i_bf16c_acc_ok(cb);
                LOAD_C();
            }
        }
        STORE_C();
        if (mode == 0) __asm__ volatile("tilerelease" ::: "memory");
#undef LOAD_C
#undef STORE_C
    }
    if (tail) mxfp8i_bf16c_exact_chunk(cb, a + nfull * MXFP8I_BF16C_CHUNK_BYTES, b + nfull * MXFP8I_BF16C_CHUNK_BYTES, tail);
    mxfp8i_bf16c_store_acc(cb, c, ldc, mr, nr);
}

/* libmxfp8 holds the real kernel; the test build compiles this file again with MXFP8_TEST_KERNELS for the
 * emulations alone (CMakeLists.txt: mxfp8_test_kernels), so they stay out of the shared library. */
#ifndef MXFP8_TEST_KERNELS
void mxfp8i_bf16_gemm_32x32__amx(int64_t k0, int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mr,
                                 int nr, int load_c) {
    unsigned csr = mxfp8i_fenv_enter();
    kernel_body(0, 1, k0, kc, a, b, c, ldc, mr, nr, load_c);
    mxfp8i_fenv_leave(csr);
}
#else
static void run_emu(int64_t k0, int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mr, int nr,
                    int load_c) {
    unsigned csr = mxfp8i_fenv_enter();
    kernel_body(1, 1, k0, kc, a, b, c, ldc, mr, nr, load_c);
    mxfp8i_fenv_leave(csr);
}
static void run_emu_noroute(int64_t k0, int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mr,
                            int nr, int load_c) {
    unsigned csr = mxfp8i_fenv_enter();
    kernel_body(1, 0, k0, kc, a, b, c, ldc, mr, nr, load_c);
    mxfp8i_fenv_leave(csr);
}
#endif

/* ---------------------------------------------------------------------------------------------------------- */
/* the GEMM slots (src/kernels/ukernel.h)                                                                      */
/* ---------------------------------------------------------------------------------------------------------- */
#define BF16C_SLOT(nm, isa, lvl, nd, tonly, runfn)                                                                          \
    {.name = nm, .isa_name = isa, .isa_level = lvl, .needs = nd, .test_only = tonly, .panel = MXFP8I_PANEL_BF16C,    \
     .mr = 32, .nr = 32, .kalign = MXFP8I_BF16C_KCHUNK, .tile_m = 128, .tile_n = 256, .tile_k = 2048, .fn = NULL,      \
     .panel_bytes = mxfp8i_bf16c_panel_bytes, .pack = mxfp8i_bf16c_pack, .pack_cm = mxfp8i_bf16c_pack_cm, .pack_q = mxfp8i_bf16c_pack_q_plain,   \
     .run = runfn, .selftest = MXFP8I_SELFTEST_SLOT}
#ifndef MXFP8_TEST_KERNELS
const mxfp8i_ukernel mxfp8i_bf16_gemm_32x32__amx_ukernel =
    BF16C_SLOT("bf16_gemm_32x32__amx", "amx", 2, MXFP8I_NEEDS_AVX512 | MXFP8I_NEEDS_AMX, 0, mxfp8i_bf16_gemm_32x32__amx);
#else
/* The emulation is exact by construction of the routing (a tests-only check of the routing and the packer on any
 * AVX-512 CPU); without routing it must fail the checker (a negative control). */
const mxfp8i_ukernel mxfp8i_bf16_gemm_32x32__amxemu_ukernel =
    BF16C_SLOT("bf16_gemm_32x32__amxemu", "avx512", 1, MXFP8I_NEEDS_AVX512, 1, run_emu);
const mxfp8i_ukernel mxfp8i_bf16_gemm_32x32__amxemu_noroute_ukernel =
    BF16C_SLOT("bf16_gemm_32x32__amxemu_noroute", "avx512", 1, MXFP8I_NEEDS_AVX512, 1, run_emu_noroute);
#endif
