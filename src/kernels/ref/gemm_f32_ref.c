/*
 * gemm_f32_ref.c -- the reference F32 GEMM microkernel: the executable specification of the contract in
 * src/kernels/ukernel.h (acc = fmaf(a, b, acc) for k ascending, one rounding per step), and the F32 panel format's
 * packer. Portable C; compiled twice by GCC target_clones (plain x86-64 and x86-64-v3) so the scalar ISA path stays
 * usable on large problems -- fmaf is exactly defined, so both clones give the same bits.
 */
#include <math.h>

#include "ref.h"

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

int64_t mxfp8i_f32_panel_bytes(int64_t K, int w) { return K * w * (int64_t)sizeof(float); }

/* panel[k*w + i] = src[i*ld + k]; rows past `rows` zero. */
void mxfp8i_f32_pack(int is_b, const float *src, int64_t ld, int rows, int64_t K, void *panel) {
    int w = is_b ? MXFP8I_NR : MXFP8I_MR;
    float *p = (float *)panel;
    for (int64_t k0 = 0; k0 < K; k0 += 64) {
        int64_t k1 = k0 + 64 < K ? k0 + 64 : K;
        for (int i = 0; i < rows; i++)
            for (int64_t k = k0; k < k1; k++) p[k * w + i] = src[i * ld + k];
    }
    if (rows < w)
        for (int64_t k = 0; k < K; k++)
            for (int i = rows; i < w; i++) p[k * w + i] = 0.0f;
}

/* panel[k*w + i] = src[k*ld + i]; rows past `rows` zero. */
void mxfp8i_f32_pack_cm(int is_b, const float *src, int64_t ld, int rows, int64_t K, void *panel) {
    int w = is_b ? MXFP8I_NR : MXFP8I_MR;
    float *p = (float *)panel;
    for (int64_t k = 0; k < K; k++) {
        for (int i = 0; i < rows; i++) p[k * w + i] = src[k * ld + i];
        for (int i = rows; i < w; i++) p[k * w + i] = 0.0f;
    }
}

static void run_ref(int64_t k0, int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mr, int nr,
                    int load_c) {
    mxfp8i_f32_gemm_8x32__ref(kc, (const float *)a + k0 * MXFP8I_MR, (const float *)b + k0 * MXFP8I_NR, c, ldc, mr,
                              nr, load_c);
}

const mxfp8i_ukernel mxfp8i_f32_gemm_8x32__ref_ukernel = {
    .name = "f32_gemm_8x32__ref", .isa_name = "scalar", .isa_level = 0, .needs = 0, .test_only = 0, .reference = 1,
    .panel = MXFP8I_PANEL_F32, .mr = MXFP8I_MR, .nr = MXFP8I_NR, .kalign = 1,
    .tile_m = 128, .tile_n = 256, .tile_k = 128,
    .fn = mxfp8i_f32_gemm_8x32__ref, .panel_bytes = mxfp8i_f32_panel_bytes, .pack = mxfp8i_f32_pack,
    .pack_cm = mxfp8i_f32_pack_cm,
    .run = run_ref};
