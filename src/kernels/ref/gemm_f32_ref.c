/*
 * gemm_f32_ref.c -- the reference F32 GEMM microkernel: the executable specification of the contract in
 * src/gemm/ukernel.h (acc = fmaf(a, b, acc) for k ascending, one rounding per step). Portable C; compiled twice by
 * GCC target_clones (plain x86-64 and x86-64-v3) so the scalar ISA path stays usable on large problems -- fmaf is
 * exactly defined, so both clones give the same bits.
 */
#include <math.h>

#include "../../gemm/ukernel.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__gnu_linux__)
#define MXFP8_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define MXFP8_CLONES
#endif

MXFP8_CLONES
void mxfp8i_f32_gemm_8x32__ref(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int mr, int nr,
                               int load_c) {
    float acc[MXFP8I_MR][MXFP8I_NR];
    for (int i = 0; i < MXFP8I_MR; i++)
        for (int j = 0; j < MXFP8I_NR; j++) acc[i][j] = (load_c && i < mr && j < nr) ? c[i * ldc + j] : 0.0f;
    for (int64_t k = 0; k < kc; k++) {
        const float *ak = a + k * MXFP8I_MR, *bk = b + k * MXFP8I_NR;
        for (int i = 0; i < MXFP8I_MR; i++)
            for (int j = 0; j < MXFP8I_NR; j++) acc[i][j] = fmaf(ak[i], bk[j], acc[i][j]);
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) c[i * ldc + j] = acc[i][j];
}
