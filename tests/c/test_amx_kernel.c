/*
 * test_amx_kernel.c -- the AMX-BF16 GEMM microkernel (src/kernels/amx/) against the reference F32 microkernel.
 *
 *  1. Panel packer: byte layout of BF16 A / VNNI B / FP32 slots and the per-chunk facts (qmin, emax, f32) on values
 *     whose answers are worked out by hand here.
 *  2. The kernel with its tile instructions emulated (SDM definition: DAZ, FTZ, RNE, sequential pair order) equals
 *     the reference bit for bit on the self-test's cases: K equal to, below and above the 32-step chunk, a K tail,
 *     partial M and N tiles, load_c, a group with BF16-subnormal dequantized values, tiny-product groups (FTZ
 *     territory), near-overflow groups, a pair-rounding trap. Splitting K across two calls changes no bit.
 *  3. Negative control: the emulation WITHOUT the exact-path routing differs on the tiny-product cases (so the
 *     routing is what keeps the results exact, and this test can fail).
 *  4. The AVX512-BF16 (VDPBF16PS) kernel on the same panels and cases, in both pair orders: the order its self-test
 *     picks must reproduce the reference, and the trap cases must tell the two orders apart; without the routing the
 *     real unit's DAZ/FTZ must show (negative control on hardware) -- skipped without AVX512-BF16.
 *  5. Under a caller's FTZ/DAZ/round-toward-zero MXCSR the kernels still equal the (IEEE) reference, and the caller's
 *     MXCSR is restored.
 *  6. The real AMX kernel on the same cases, and the one-time self-test -- skipped (with a line saying so) when the
 *     CPU lacks AMX-BF16 or the OS refuses XTILEDATA.
 * Sections 1-3 need AVX-512F/BW (the folder is compiled for it); without it the whole test is skipped.
 */
#include <math.h>

#include "kernels/amx/amx.h"
#include "gemm/ukernel.h"
#include "testutil.h"

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void test_packer(void) {
    enum { K = 40 }; /* two chunks: 32 + a tail of 8 */
    static float src[32 * K];
    static uint8_t pa[2 * MXFP8I_AMX_CHUNK_BYTES] __attribute__((aligned(64)));
    static uint8_t pb[2 * MXFP8I_AMX_CHUNK_BYTES] __attribute__((aligned(64)));
    mxfp8i_amx_meta ma[4], mb[4];
    TU_CHECK(mxfp8i_amx_panel_bytes(K, 32) == (int64_t)sizeof pa, "panel_bytes(40) = %lld",
             (long long)mxfp8i_amx_panel_bytes(K, 32));
    memset(src, 0, sizeof src);
    /* rows 0..15, chunk 0: 0.1875 = 1.5 * 2^-3 (lowest set bit 2^-4) and 32 (2^5): qmin -4, emax 5, BF16 */
    src[3 * K + 5] = 0.1875f;
    src[7 * K + 30] = -32.0f;
    /* rows 16..31, chunk 0: 1 + 2^-8 needs 9 significant bits: FP32 slot */
    src[20 * K + 1] = 1.0f + 0x1p-8f;
    /* rows 0..15, chunk 1 (k 32..39): a BF16 subnormal 2^-130: FP32 slot */
    src[2 * K + 33] = 0x1p-130f;
    /* rows 16..31, chunk 1: all zero */
    memset(pa, 0xAB, sizeof pa); /* stale bytes: whatever the kernel reads must have been written by the packer */
    memset(pb, 0xAB, sizeof pb);
    mxfp8i_amx_pack(0, src, K, 30, K, pa);
    mxfp8i_amx_pack(1, src, K, 30, K, pb);
    /* chunk c header (64 bytes): meta of tile 0, tile 1; slot t at 64 + t * SLOT */
    for (int c = 0; c < 2; c++) {
        memcpy(&ma[2 * c], pa + c * MXFP8I_AMX_CHUNK_BYTES, 2 * sizeof(mxfp8i_amx_meta));
        memcpy(&mb[2 * c], pb + c * MXFP8I_AMX_CHUNK_BYTES, 2 * sizeof(mxfp8i_amx_meta));
    }
    for (int p = 0; p < 2; p++) {
        const mxfp8i_amx_meta *m = p ? mb : ma;
        const char *w = p ? "B" : "A";
        TU_CHECK(m[0].f32 == 0 && m[0].qmin == -4 && m[0].emax == 5, "%s chunk0 tile0: f32 %d qmin %d emax %d", w,
                 m[0].f32, m[0].qmin, m[0].emax);
        TU_CHECK(m[1].f32 == 1, "%s chunk0 tile1 (9 significant bits) must be FP32, f32 = %d", w, m[1].f32);
        TU_CHECK(m[2].f32 == 1, "%s chunk1 tile0 (subnormal) must be FP32, f32 = %d", w, m[2].f32);
        TU_CHECK(m[3].f32 == 0 && m[3].qmin == 1000 && m[3].emax == -1000, "%s all-zero tile: f32 %d qmin %d emax %d",
                 w, m[3].f32, m[3].qmin, m[3].emax);
    }
    /* A, BF16 slot (chunk 0, tile 0): row r, step kk at r*64 + kk*2 */
    uint16_t h;
    memcpy(&h, pa + 64 + 3 * 64 + 5 * 2, 2);
    TU_CHECK(h == (bits(0.1875f) >> 16), "A bf16 slot: got 0x%04x", h);
    memcpy(&h, pa + 64 + 7 * 64 + 30 * 2, 2);
    TU_CHECK(h == (bits(-32.0f) >> 16), "A bf16 slot: got 0x%04x", h);
    /* B, VNNI slot: row j, step kk at (kk/2)*64 + j*4 + (kk%2)*2 */
    memcpy(&h, pb + 64 + (5 / 2) * 64 + 3 * 4 + (5 % 2) * 2, 2);
    TU_CHECK(h == (bits(0.1875f) >> 16), "B vnni slot: got 0x%04x", h);
    memcpy(&h, pb + 64 + (30 / 2) * 64 + 7 * 4 + 0, 2);
    TU_CHECK(h == (bits(-32.0f) >> 16), "B vnni slot: got 0x%04x", h);
    /* FP32 slots: A [r][kk] at r*128 + kk*4; B [kk][j] at kk*64 + j*4 */
    float f;
    memcpy(&f, pa + 64 + 1 * MXFP8I_AMX_SLOT + (20 - 16) * 128 + 1 * 4, 4);
    TU_CHECK(f == 1.0f + 0x1p-8f, "A f32 slot: got %a", f);
    memcpy(&f, pb + 64 + 1 * MXFP8I_AMX_SLOT + 1 * 64 + (20 - 16) * 4, 4);
    TU_CHECK(f == 1.0f + 0x1p-8f, "B f32 slot: got %a", f);
    memcpy(&f, pa + MXFP8I_AMX_CHUNK_BYTES + 64 + 2 * 128 + 1 * 4, 4);
    TU_CHECK(f == 0x1p-130f, "A f32 slot (tail chunk): got %a", f);
    /* the tail steps (k >= 40) of chunk 1 and rows >= 30 are zero */
    int nonzero = 0;
    for (int r = 0; r < 16; r++)
        for (int kk = 8; kk < 32; kk++) {
            memcpy(&f, pa + MXFP8I_AMX_CHUNK_BYTES + 64 + r * 128 + kk * 4, 4);
            nonzero += f != 0.0f;
        }
    TU_CHECK(nonzero == 0, "A tail padding: %d nonzero", nonzero);
}

/* K split across two calls (chunk offset, load_c) equals one call, bit for bit (emulation). */
static void test_split(void) {
    enum { K = 160 };
    static float A[32 * K], B[32 * K], c1[32 * 32], c2[32 * 32];
    static uint8_t pa[5 * MXFP8I_AMX_CHUNK_BYTES] __attribute__((aligned(64)));
    static uint8_t pb[5 * MXFP8I_AMX_CHUNK_BYTES] __attribute__((aligned(64)));
    tu_rng r = {123};
    for (int i = 0; i < 32 * K; i++) {
        A[i] = ldexpf(mxfp8_fp8_to_fp32((uint8_t)(tu_next(&r) % 127u), MXFP8_FMT_E4M3), (int)(tu_next(&r) % 9) - 4);
        B[i] = ldexpf(mxfp8_fp8_to_fp32((uint8_t)(tu_next(&r) % 255u), MXFP8_FMT_E5M2), (int)(tu_next(&r) % 9) - 4);
        if (B[i] != B[i] || isinf(B[i])) B[i] = 0.0f;
    }
    mxfp8i_amx_pack(0, A, K, 32, K, pa);
    mxfp8i_amx_pack(1, B, K, 32, K, pb);
    mxfp8i_bf16_gemm_32x32__amxemu(0, K, pa, pb, c1, 32, 32, 32, 0, 1);
    mxfp8i_bf16_gemm_32x32__amxemu(0, 64, pa, pb, c2, 32, 32, 32, 0, 1);
    mxfp8i_bf16_gemm_32x32__amxemu(64, K - 64, pa, pb, c2, 32, 32, 32, 1, 1);
    TU_CHECK(memcmp(c1, c2, sizeof c1) == 0, "K split 64 + 96 differs from one call");
    /* the same split against the reference F32 kernel on 8x32 register tiles */
    static float ap[K * MXFP8I_MR], bp[K * MXFP8I_NR], c3[32 * 32];
    for (int m0 = 0; m0 < 32; m0 += MXFP8I_MR)
        for (int n0 = 0; n0 < 32; n0 += MXFP8I_NR) {
            for (int k = 0; k < K; k++) {
                for (int i = 0; i < MXFP8I_MR; i++) ap[k * MXFP8I_MR + i] = A[(m0 + i) * K + k];
                for (int j = 0; j < MXFP8I_NR; j++) bp[k * MXFP8I_NR + j] = n0 + j < 32 ? B[(n0 + j) * K + k] : 0.0f;
            }
            int nrr = 32 - n0 < MXFP8I_NR ? 32 - n0 : MXFP8I_NR;
            mxfp8i_f32_gemm_8x32__ref(K, ap, bp, c3 + m0 * 32 + n0, 32, MXFP8I_MR, nrr, 0);
        }
    TU_CHECK(memcmp(c1, c3, sizeof c1) == 0, "emulated AMX kernel (K = 160, E4M3 x E5M2) differs from the reference");
}

int main(void) {
    mxfp8_info info;
    if (mxfp8_get_info(&info) != MXFP8_OK || !info.has_avx512f || !info.has_avx512bw) {
        printf("test_amx_kernel: SKIP (the AMX folder's packers and emulation need AVX-512F/BW)\n");
        return TU_SKIP;
    }
    test_packer();
    test_split();
    int n = 0;
    int fails = mxfp8i_amx_check_kernel(1, 0, &n);
    TU_CHECK(fails == 0 && n > 0, "emulated AMX kernel differs from the reference in %d of %d cases", fails, n);
    int fails_noroute = mxfp8i_amx_check_kernel(2, 0, &n);
    TU_CHECK(fails_noroute > 0,
             "negative control: without exact-path routing the emulation should differ (FTZ), but 0 of %d differ", n);
    printf("test_amx_kernel: emulation %d/%d cases bitwise equal; without routing %d cases differ (expected > 0)\n",
           n - fails, n, fails_noroute);
    if (info.has_avx512_bf16) {
        int n3 = 0, n4 = 0, f3 = mxfp8i_amx_check_kernel(3, 0, &n3), f4 = mxfp8i_amx_check_kernel(4, 0, &n4);
        const char *why = NULL;
        int order = mxfp8i_avx512bf16_self_test(&why);
        printf("test_amx_kernel: AVX512-BF16 kernel: swapped panels %d/%d, plain panels %d/%d cases bitwise equal; "
               "self-test picks %s\n", n3 - f3, n3, n4 - f4, n4,
               order == 1 ? "swapped" : order == 0 ? "plain" : why);
        TU_CHECK(order == -1 || (order == 1 ? f3 : f4) == 0, "self-test picked order %d but it fails", order);
        TU_CHECK(order != -1 || (f3 > 0 && f4 > 0), "self-test rejected both orders but one passes");
        /* the two orders cannot both reproduce the reference: the pair-order trap separates them */
        TU_CHECK(f3 > 0 || f4 > 0, "both pair orders pass: the trap cases do not discriminate");
        if (order == 1) { /* negative control on the real unit: its DAZ/FTZ shows without the routing */
            int n5 = 0, f5 = mxfp8i_amx_check_kernel(5, 0, &n5);
            printf("test_amx_kernel: AVX512-BF16 without routing: %d of %d cases differ (expected > 0: DAZ/FTZ)\n", f5,
                   n5);
            TU_CHECK(f5 > 0, "AVX512-BF16 without routing matches the reference everywhere: the subnormal and "
                             "tiny-product cases do not reach DAZ/FTZ");
        }
        int q3 = mxfp8i_amx_check_kernel(3, 1, NULL), q4 = mxfp8i_amx_check_kernel(4, 1, NULL);
        TU_CHECK((q3 == 0) == (f3 == 0) && (q4 == 0) == (f4 == 0),
                 "the quick self-test subset disagrees with the full set (swapped %d/%d, plain %d/%d failures)", q3, f3,
                 q4, f4);
    } else {
        printf("test_amx_kernel: AVX512-BF16 kernel not run: CPU lacks AVX512-BF16\n");
    }
    /* The caller's MXCSR (flush-to-zero, denormals-are-zero, round toward zero) must not change a bit: the kernels
     * run their exact path under IEEE defaults. The reference inside the checker is computed under IEEE too. */
    {
        unsigned saved, ftz = 0x1F80u | 0x8000u | 0x0040u | 0x6000u; /* FTZ | DAZ | RC = toward zero */
        __asm__ volatile("stmxcsr %0" : "=m"(saved));
        __asm__ volatile("ldmxcsr %0" ::"m"(ftz));
        int nf = 0, ff = mxfp8i_amx_check_kernel(1, 0, &nf);
        int fd = info.has_avx512_bf16 && mxfp8i_avx512bf16_self_test(NULL) == 1 ? mxfp8i_amx_check_kernel(3, 0, NULL) : 0;
        unsigned after;
        __asm__ volatile("stmxcsr %0" : "=m"(after));
        __asm__ volatile("ldmxcsr %0" ::"m"(saved));
        TU_CHECK(ff == 0, "under FTZ/DAZ/round-toward-zero the emulated kernel differs in %d of %d cases", ff, nf);
        TU_CHECK(fd == 0, "under FTZ/DAZ/round-toward-zero the AVX512-BF16 kernel differs in %d cases", fd);
        TU_CHECK((after & 0xFFC0u) == (ftz & 0xFFC0u), "the kernels did not restore the caller's MXCSR: 0x%x", after);
    }
    if (info.has_amx_tile && info.has_amx_bf16 && info.amx_permitted) {
        int nr = 0, fr = mxfp8i_amx_check_kernel(0, 0, &nr);
        TU_CHECK(fr == 0, "real AMX kernel differs from the reference in %d of %d cases", fr, nr);
        const char *why = mxfp8i_amx_self_test();
        printf("test_amx_kernel: real AMX kernel %d/%d cases bitwise equal; self-test: %s\n", nr - fr, nr,
               why ? why : "passed");
    } else {
        printf("test_amx_kernel: real AMX kernel not run: %s\n",
               !(info.has_amx_tile && info.has_amx_bf16) ? "CPU lacks AMX-TILE/AMX-BF16" : "OS refused XTILEDATA");
    }
    return tu_finish("test_amx_kernel");
}
