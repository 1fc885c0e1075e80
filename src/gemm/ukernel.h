/*
 * ukernel.h -- the GEMM microkernel slot: one contract, one reference kernel, ISA overrides (BLIS style).
 *
 * Panels (written by src/gemm/pack.c, read by a microkernel):
 *   A panel of one MR-row micro-tile: kc steps of MR FP32 values, a[k*MR + i] = deq(A)[m0 + i, k0 + k]
 *   (rows past M are zero).
 *   B panel of one NR-column micro-tile: kc steps of NR FP32 values, b[k*NR + j] = deq(B)[n0 + j, k0 + k]
 *   (columns past N are zero).
 *   The dequantized values are exact in FP32 (FP8 x 2^e, e in [-127, 127], never below 2^-149; values beyond FP32's
 *   range are +-Inf as in mxfp8_dequantize).
 *
 * Contract of an MXFP8I_PANEL_F32 microkernel (every F32 kernel must equal the reference BIT FOR BIT):
 *   for i < mr, j < nr:
 *       acc = load_c ? c[i*ldc + j] : +0.0f
 *       for k = 0 .. kc-1 (ascending):  acc = fmaf(a[k*MR + i], b[k*NR + j], acc)     (one rounding per step)
 *       c[i*ldc + j] = acc
 *   Only the mr x nr valid elements of c are read or written. kc >= 1; 1 <= mr <= MR; 1 <= nr <= NR.
 *   Because each step is a fused multiply-add in a fixed ascending k order, splitting K into tiles (store acc to c
 *   and reload it, which is exact) never changes a bit: the cache blocking, the loop orders and the thread split are
 *   speed-only by construction, and every F32 kernel (scalar, AVX-512F) gives the same bits.
 *
 * Adding a kernel (e.g. AMX-BF16, src/kernels/amx/): write the function, add one mxfp8i_ukernel descriptor, and
 * return it from mxfp8i_select_ukernel() (src/gemm/driver.c) when the ISA allows. A kernel with a different panel
 * format declares it in `panel` (and the packer gains one writer for it); a kernel that cannot keep the exact F32
 * order sets exact_order = 0 and must state its own accumulation order and the bound it meets.
 */
#ifndef MXFP8_GEMM_UKERNEL_H
#define MXFP8_GEMM_UKERNEL_H

#include <stdint.h>

/** Register tile of the F32 panel format shared by all F32 kernels. */
#define MXFP8I_MR 8
#define MXFP8I_NR 32

typedef enum mxfp8i_panel_format {
    MXFP8I_PANEL_F32 = 0,     /**< see the file comment */
    MXFP8I_PANEL_OTHER = 1    /**< kernel-defined (e.g. AMX BF16 tiles + metadata); written by the slot's pack() */
} mxfp8i_panel_format;

typedef void (*mxfp8i_ukernel_fn)(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int mr, int nr,
                                  int load_c);

/** One microkernel slot. The driver (src/gemm/driver.c) only uses panel_bytes, pack and run, so a kernel with its
 *  own panel format plugs in by filling them:
 *    panel_bytes(K, w)  bytes of one packed panel of w rows (w = mr for A, nr for B) covering all of K; the driver
 *                       allocates panels 64-byte aligned, each at a multiple of round_up(panel_bytes, 64).
 *    pack(is_b, src, rs, rows, K, panel)
 *                       write the panel of rows [0, rows) (rows <= w) of an FP32 matrix src[r*rs + k], k < K, holding
 *                       exact dequantized MX values; rows past `rows` must become zeros. is_b: 0 = A panel (rows of
 *                       C, w = mr), 1 = B panel (columns of C, w = nr).
 *    run(k0, kc, a, b, c, ldc, mr, nr, load_c)
 *                       the contract above on steps [k0, k0 + kc) of the panels a, b (their bases, all of K);
 *                       k0 is a multiple of kalign; kc is a multiple of kalign unless k0 + kc == K.
 *  F32-panel kernels also set fn (the plain contract with pre-offset pointers); the driver then packs straight from
 *  the quantizer into the panel. */
typedef struct mxfp8i_ukernel {
    const char *name;          /**< "what__how", e.g. "f32_gemm_8x32__avx512f" */
    mxfp8i_panel_format panel;
    int mr, nr;                /**< register tile (MXFP8I_MR x MXFP8I_NR for F32 panels) */
    int kalign;                /**< k tiles start at multiples of this (1 for F32 panels, 32 for AMX chunks) */
    int exact_order;           /**< 1: bitwise the reference order above */
    mxfp8i_ukernel_fn fn;      /**< F32 panels only; else NULL */
    int64_t (*panel_bytes)(int64_t K, int w);
    void (*pack)(int is_b, const float *src, int64_t rs, int rows, int64_t K, void *panel);
    void (*run)(int64_t k0, int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mr, int nr,
                int load_c);
} mxfp8i_ukernel;

/** The scalar reference kernel (src/kernels/ref/gemm_f32_ref.c): the executable specification of the contract. */
void mxfp8i_f32_gemm_8x32__ref(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int mr, int nr,
                               int load_c);
/** AVX-512F FMA kernel (src/kernels/avx512/gemm_f32_avx512.c); call only when mxfp8i_use_avx512(). */
void mxfp8i_f32_gemm_8x32__avx512f(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int mr, int nr,
                                   int load_c);

/** The kernel the GEMM driver uses for the ISA in force (MXFP8_ISA respected). Never NULL. */
const mxfp8i_ukernel *mxfp8i_select_ukernel(void);
/** Tests only: make mxfp8i_select_ukernel() return `uk` (NULL = back to the ISA's choice). Not thread-safe with
 *  respect to GEMMs running at the same time. */
void mxfp8i_force_ukernel(const mxfp8i_ukernel *uk);
/** The F32 AVX-512F kernel descriptor, or NULL when AVX-512 is not in use. */
const mxfp8i_ukernel *mxfp8i_f32_avx512_ukernel(void);
/** The reference kernel descriptor. */
const mxfp8i_ukernel *mxfp8i_ref_ukernel(void);

#endif /* MXFP8_GEMM_UKERNEL_H */
