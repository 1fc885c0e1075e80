/*
 * test_gemm_mxcsr.c -- a caller's MXCSR (flush-to-zero, denormals-are-zero, directed rounding) must not change any
 * GEMM result, on every microkernel path (the selected one, the AVX-512F FP32 kernel, the scalar reference), on 1 and
 * 2 threads, for F32/BF16/F16 outputs and accumulate; and the caller's MXCSR must be restored. The data has groups
 * around 2^-70 (their products, ~2^-140, are FP32 subnormals that FTZ would flush) and ordinary groups (whose sums
 * round differently toward zero or upward). A negative control shows the data is sensitive: the bare FP32
 * microkernel, called without the driver's guard, gives different bits under FTZ/DAZ and under round-toward-zero.
 * Oracle: the same call under the IEEE default MXCSR, whose F32 result must equal the tests' independent oracle
 * (tests/c/oracle/: its own quantizer and the IEEE fmaf chain).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm/gemm.h"
#include "kernels/avx512/avx512.h"
#include "kernels/ref/ref.h"
#include "kernels/registry.h"
#include "kernel_list.h"
#include "oracle.h"
#include "testutil.h"

#if defined(__x86_64__)
#include <xmmintrin.h>

static const unsigned k_modes[] = {0x8040u, 0x6000u, 0x6000u | 0x8040u, 0x4000u, 0x2000u};

/* Values x 2^e with e chosen per group of 32 along K: 0, -60, -70 or -75. */
static void fill(float *x, int64_t R, int64_t K, tu_rng *r) {
    static const int ex[4] = {0, -60, -70, -75};
    for (int64_t i = 0; i < R; i++)
        for (int64_t k = 0; k < K; k++) {
            int e = ex[(i + k / 32) % 4];
            x[i * K + k] = ldexpf((float)(tu_uniform(r) * 2.0 - 1.0), e);
        }
}

static size_t dsize(mxfp8_dtype d) { return d == MXFP8_DTYPE_F32 ? 4 : 2; }

/* C = A @ B^T through mxfp8_gemm under MXCSR `mode` (0 = leave as is); returns 0 when MXCSR came back unchanged. */
static int run(const float *A, const float *B, int64_t M, int64_t N, int64_t K, mxfp8_dtype cd, int accumulate,
               const void *c0, void *c, unsigned mode) {
    mxfp8_operand a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    int64_t sa[2] = {M, K}, sb[2] = {N, K}, sc[2] = {M, N};
    a.values = mxfp8_tensor_make((void *)A, MXFP8_DTYPE_F32, 2, sa);
    b.values = mxfp8_tensor_make((void *)B, MXFP8_DTYPE_F32, 2, sb);
    memcpy(c, c0, (size_t)(M * N) * dsize(cd));
    mxfp8_tensor C = mxfp8_tensor_make(c, cd, 2, sc);
    mxfp8_matmul_config cfg;
    mxfp8_matmul_config_init(&cfg);
    cfg.float8_dtype = MXFP8_FMT_E4M3;
    cfg.tile_m = 32; /* several blocks, so that 2 threads both work */
    cfg.tile_n = 32;
    unsigned old = _mm_getcsr();
    if (mode) _mm_setcsr((old & ~0xE040u) | mode);
    unsigned before = _mm_getcsr();
    mxfp8_status st = mxfp8_gemm(&a, &b, &cfg, accumulate, &C);
    unsigned after = _mm_getcsr();
    _mm_setcsr(old);
    TU_CHECK(st == MXFP8_OK, "mxfp8_gemm failed: %s", mxfp8_last_error_message());
    return (after & 0xFFC0u) != (before & 0xFFC0u);
}

static void test_gemm_modes(void) {
    const int64_t M = 40, N = 70, K = 100;
    tu_rng r = {2024};
    float *A = tu_alloc((size_t)(M * K) * 4), *B = tu_alloc((size_t)(N * K) * 4);
    fill(A, M, K, &r);
    fill(B, N, K, &r);
    float *c0 = tu_alloc((size_t)(M * N) * 4);
    for (int64_t i = 0; i < M * N; i++) /* accumulate starts from subnormal, tiny and ordinary values */
        c0[i] = i % 3 == 0 ? ldexpf(1.0f + (float)(i % 7), -140) : i % 3 == 1 ? ldexpf(1.0f, -120) : 0.5f;
    void *zero = calloc((size_t)(M * N), 4), *ref = tu_alloc((size_t)(M * N) * 4), *got = tu_alloc((size_t)(M * N) * 4);
    float *orc = tu_alloc((size_t)(M * N) * 4); /* the oracle of the F32 output under the IEEE defaults */
    orc_mx_gemm(A, B, M, N, K, MXFP8_FMT_E4M3, MXFP8_SCALE_NKI, MXFP8_GROUP_1X32, orc);
    /* the registry's choice, then every runtime kernel this CPU supports (whatever MXFP8_ISA says) */
    const mxfp8i_ukernel *kernels[16] = {NULL};
    const char *kname[16] = {"selected"};
    int nk = 1;
    for (const mxfp8i_ukernel *const *it = mxfp8t_all_ukernels(); *it && nk < 16; it++)
        if (mxfp8i_ukernel_usable(*it)) kname[nk] = (*it)->name, kernels[nk++] = *it;
    static const mxfp8_dtype cds[3] = {MXFP8_DTYPE_F32, MXFP8_DTYPE_BF16, MXFP8_DTYPE_F16};
    for (int kk = 0; kk < nk; kk++) {
        mxfp8i_force_ukernel(kernels[kk]);
        for (int nt = 1; nt <= 2; nt++) {
            mxfp8_set_num_threads(nt);
            for (int v = 0; v < 4; v++) {
                mxfp8_dtype cd = v == 3 ? MXFP8_DTYPE_F32 : cds[v];
                int acc = v == 3;
                const void *init = acc ? (const void *)c0 : zero;
                run(A, B, M, N, K, cd, acc, init, ref, 0);
                if (v == 0)
                    TU_CHECK(!memcmp(ref, orc, (size_t)(M * N) * 4), "%s kernel, %d thread(s): differs from the oracle",
                             kname[kk], nt);
                for (size_t m = 0; m < sizeof k_modes / sizeof k_modes[0]; m++) {
                    int changed = run(A, B, M, N, K, cd, acc, init, got, k_modes[m]);
                    TU_CHECK(!changed, "%s kernel, %d thread(s): MXCSR mode 0x%x was not restored", kname[kk], nt,
                             k_modes[m]);
                    size_t nb = (size_t)(M * N) * dsize(cd);
                    int64_t ndiff = 0;
                    for (size_t i = 0; i < nb; i++) ndiff += ((uint8_t *)ref)[i] != ((uint8_t *)got)[i];
                    TU_CHECK(ndiff == 0, "%s kernel, %d thread(s), %s output%s: %lld bytes change under MXCSR 0x%x",
                             kname[kk], nt, mxfp8_dtype_name(cd), acc ? " (accumulate)" : "", (long long)ndiff,
                             k_modes[m]);
                }
            }
        }
    }
    mxfp8i_force_ukernel(NULL);
    mxfp8_set_num_threads(0);
    free(A), free(B), free(c0), free(zero), free(ref), free(got), free(orc);
}

/* Negative control: the bare FP32 microkernel follows MXCSR, so the guard above is what keeps results fixed. */
static void test_control(void) {
    enum { KC = 32 };
    float a[KC * MXFP8I_MR], b[KC * MXFP8I_NR], c1[MXFP8I_MR * MXFP8I_NR], c2[MXFP8I_MR * MXFP8I_NR];
    tu_rng r = {7};
    for (int i = 0; i < KC * MXFP8I_MR; i++) a[i] = ldexpf(1.0f + (float)(tu_uniform(&r) * 0.9), i % 2 ? -70 : 3);
    for (int i = 0; i < KC * MXFP8I_NR; i++) b[i] = ldexpf(1.0f + (float)(tu_uniform(&r) * 0.9), -71 + (i % 3));
    const mxfp8i_ukernel *uk = mxfp8i_cpu_has(mxfp8i_f32_gemm_8x32__avx512f_ukernel.needs)
                                   ? &mxfp8i_f32_gemm_8x32__avx512f_ukernel
                                   : &mxfp8i_f32_gemm_8x32__ref_ukernel;
    static const unsigned modes[2] = {0x8040u, 0x6000u};
    for (int m = 0; m < 2; m++) {
        uk->fn(KC, a, b, c1, MXFP8I_NR, MXFP8I_MR, MXFP8I_NR, 0);
        unsigned old = _mm_getcsr();
        _mm_setcsr((old & ~0xE040u) | modes[m]);
        uk->fn(KC, a, b, c2, MXFP8I_NR, MXFP8I_MR, MXFP8I_NR, 0);
        _mm_setcsr(old);
        TU_CHECK(memcmp(c1, c2, sizeof c1) != 0,
                 "negative control: the bare %s kernel gives the same bits under MXCSR 0x%x (data not sensitive)",
                 uk->name, modes[m]);
    }
}

int main(void) {
    test_control();
    test_gemm_modes();
    return tu_finish("test_gemm_mxcsr");
}
#else
int main(void) {
    printf("skip: MXCSR exists only on x86-64\n");
    return 77;
}
#endif
