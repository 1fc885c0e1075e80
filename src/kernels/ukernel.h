/*
 * ukernel.h -- the GEMM microkernel slot: one contract, one reference kernel, ISA overrides (BLIS style). The
 * kernel registry (registry.h) fills the slot; the GEMM driver (src/gemm/driver.c) only calls through it.
 *
 * F32 panel format (MXFP8I_PANEL_F32, the reference and AVX-512F kernels):
 *   A panel of one MR-row micro-tile: K steps of MR FP32 values, a[k*MR + i] = deq(A)[m0 + i, k] (rows past M zero).
 *   B panel of one NR-column micro-tile: K steps of NR FP32 values, b[k*NR + j] = deq(B)[n0 + j, k] (columns past N
 *   zero). The dequantized values are exact in FP32 (FP8 x 2^e, e in [-127, 127]; values beyond FP32's range are
 *   +-Inf as in mxfp8_dequantize).
 *
 * Contract of every microkernel (each must equal the reference BIT FOR BIT):
 *   for i < mr, j < nr:
 *       acc = load_c ? c[i*ldc + j] : +0.0f
 *       for k = k0 .. k0+kc-1 (ascending):  acc = fmaf(A[i][k], B[j][k], acc)     (one rounding per step)
 *       c[i*ldc + j] = acc
 *   Only the mr x nr valid elements of c are read or written. kc >= 1; 1 <= mr <= MR; 1 <= nr <= NR.
 *   Because each step is a fused multiply-add in a fixed ascending k order, splitting K into tiles (store acc to c
 *   and reload it, which is exact) never changes a bit: the cache blocking, the loop orders and the thread split are
 *   speed-only by construction, and every kernel gives the same bits.
 *
 * Adding a kernel (docs/architecture.md, "How to add a GEMM microkernel"): write it in src/kernels/<isa>/,
 * describe it with one mxfp8i_ukernel (its packers, tile defaults, the CPU features it needs, its self-test slot),
 * and add the descriptor to the candidate list of src/kernels/registry.c.
 * The registry runs the kernel checker (check.h) on it at start-up and uses it only when it reproduces the
 * reference; tests/c/test_kernels.c checks every listed kernel against the test-side reference.
 */
#ifndef MXFP8_KERNELS_UKERNEL_H
#define MXFP8_KERNELS_UKERNEL_H

#include <stdint.h>

#include "../runtime/cpu.h"

/** Register tile of the F32 panel format shared by the F32 kernels. */
#define MXFP8I_MR 8
#define MXFP8I_NR 32

typedef enum mxfp8i_panel_format {
    MXFP8I_PANEL_F32 = 0,  /**< see the file comment */
    MXFP8I_PANEL_BF16C = 1 /**< BF16 chunk panels (src/kernels/avx512/bf16chunk.h), read by VDPBF16PS and AMX */
} mxfp8i_panel_format;

/** CPU features a kernel needs (all listed must be present): sets of src/runtime/cpu.h's features. */
#define MXFP8I_NEEDS_AVX512 \
    (MXFP8I_CPU_BIT(MXFP8I_CPU_AVX512F) | MXFP8I_CPU_BIT(MXFP8I_CPU_AVX512BW) | MXFP8I_CPU_BIT(MXFP8I_CPU_AVX512VL))
#define MXFP8I_NEEDS_AVX512_BF16 MXFP8I_CPU_BIT(MXFP8I_CPU_AVX512_BF16)
#define MXFP8I_NEEDS_AMX \
    (MXFP8I_CPU_BIT(MXFP8I_CPU_AMX_TILE) | MXFP8I_CPU_BIT(MXFP8I_CPU_AMX_BF16) | MXFP8I_CPU_BIT(MXFP8I_CPU_AMX_PERMITTED))

/** A kernel's start-up self-test result, kept with its descriptor (the registry writes it under its lock, once). */
typedef struct mxfp8i_selftest {
    int done;      /**< 1 once the checker ran on this kernel */
    int fails;     /**< failing cases (0: passed; -1: the checker could not allocate) */
    char why[256]; /**< the first failing case, or "" */
} mxfp8i_selftest;
/** The self-test storage of one descriptor: `.selftest = MXFP8I_SELFTEST_SLOT` (a file-scope compound literal, so
 *  static and writable; one per descriptor). */
#define MXFP8I_SELFTEST_SLOT (&(mxfp8i_selftest){0, 0, ""})

typedef void (*mxfp8i_ukernel_fn)(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int mr, int nr,
                                  int load_c);
/** Pack rows [0, rows) (rows <= w) of an FP32 matrix of exact dequantized MX values into one panel covering all of K:
 *  row-major source: element (r, k) at src[r*ld + k]; column-major source (pack_cm): at src[k*ld + r]. Rows past
 *  `rows` become zeros. is_b: 0 = A panel (rows of C, w = mr), 1 = B panel (columns of C, w = nr). */
typedef void (*mxfp8i_pack_fn)(int is_b, const float *src, int64_t ld, int rows, int64_t K, void *panel);
/** Pack from BF16 values that are exact dequantized MX values in 1x32 groups along K, with their E8M0 scales:
 *  element (r, k) at src[r*ld + k] (cm = 0) or src[k*ld + r] (cm = 1), the scale of row r's group g at
 *  scales[r*s_r + g*s_g], fmt 0 = E4M3 / 1 = E5M2. Gives a panel with the same results as pack() of the values. */
typedef void (*mxfp8i_pack_q_fn)(int is_b, const uint16_t *src, int64_t ld, int cm, int rows, int64_t K,
                                 const uint8_t *scales, int64_t s_r, int64_t s_g, int fmt, void *panel);

/** One microkernel. The driver uses panel_bytes, the packers (pack_q where the operand qualifies, else pack_cm
 *  for a column-geometry operand, else pack), run and the tile defaults; never the panel format:
 *    panel_bytes(K, w)  bytes of one packed panel of w rows (w = mr for A, nr for B) covering all of K; the driver
 *                       allocates panels 64-byte aligned, each at a multiple of round_up(panel_bytes, 64).
 *    run(k0, kc, a, b, c, ldc, mr, nr, load_c)
 *                       the contract above on steps [k0, k0 + kc) of the panels a, b (their bases, all of K);
 *                       k0 is a multiple of kalign; kc is a multiple of kalign unless k0 + kc == K.
 *  F32-panel kernels also set fn (the plain contract with pre-offset pointers; the tests call it). */
typedef struct mxfp8i_ukernel {
    const char *name;          /**< "what__how", e.g. "f32_gemm_8x32__avx512f" */
    const char *isa_name;      /**< "scalar", "avx512", "avx512_bf16", "amx" (for mxfp8 info) */
    int isa_level;             /**< the MXFP8_ISA level it belongs to: 0 scalar, 1 avx512, 2 amx */
    unsigned needs;            /**< MXFP8I_NEEDS_* (a set of MXFP8I_CPU_BIT features) */
    int test_only;             /**< 1: a negative control or an emulation, never selected at run time */
    int reference;             /**< 1: the specification itself: no self-test, the slot's last resort */
    mxfp8i_selftest *selftest; /**< its self-test result (MXFP8I_SELFTEST_SLOT; NULL for the reference) */
    mxfp8i_panel_format panel; /**< what its packers write (the driver never reads it: tests and docs only) */
    int mr, nr;                /**< register tile (MXFP8I_MR x MXFP8I_NR for F32 panels) */
    int kalign;                /**< k tiles start at multiples of this (1 for F32 panels, 32 for BF16 chunks) */
    int64_t tile_m, tile_n, tile_k; /**< the driver's default cache tiles for this kernel (speed only) */
    mxfp8i_ukernel_fn fn;      /**< F32 panels only; else NULL */
    int64_t (*panel_bytes)(int64_t K, int w);
    mxfp8i_pack_fn pack;       /**< row-major source */
    mxfp8i_pack_fn pack_cm;    /**< column-major source (NULL: the driver transposes first) */
    mxfp8i_pack_q_fn pack_q;   /**< BF16 values + scales (NULL: the driver packs from FP32 values) */
    void (*run)(int64_t k0, int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mr, int nr,
                int load_c);
} mxfp8i_ukernel;

#endif /* MXFP8_KERNELS_UKERNEL_H */
