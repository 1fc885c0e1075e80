/*
 * gemm.h -- internal API of the block-scaled GEMM (src/gemm/).
 *
 *   C[M, N] (=|+=) sum_k deq(A)[m, k] * deq(B)[n, k]
 *
 * Both operands are logically [R, K] with the contraction axis K last (R = M for A, N for B). Each is either high
 * precision (F32/BF16/F16, MX-quantized on the fly along K with its own recipe -- format, rule and group scheme,
 * mxfp8i_gop.rc -- and rounding, then dequantized exactly) or pre-quantized (FP8 codes, or x4-packed U32 words, plus E8M0 scales in any
 * mxfp8_scale_layout), optionally in NKI's swizzled arrangement. The dequantized FP32 values feed the registry's
 * microkernel (src/kernels/ukernel.h), which accumulates with fmaf in ascending k from +0, so the result does not
 * depend on blocking, loop order, thread count, spill_reload or ISA. With accumulate, C (F32) gets C + sum (one
 * rounding); otherwise the sum is rounded once (RNE) to C's dtype. Every element of C is written by one thread.
 *
 * Validate once at the edge (as oneDNN's brgemm_desc_init -> brgemm_kernel_execute): public entries turn their
 * operands into mxfp8i_gop descriptors with mxfp8i_gop_from_operand (operand.c), giving each the recipe resolved
 * once from their config or arguments, and check the config with mxfp8i_check_config (config.c); the MoE layer
 * builds its descriptors itself from validated tensors, with the layer's recipe. The driver (mxfp8i_gemm_gop,
 * driver.c) reads the recipe from the operands and only the speed knobs (tiles, loop orders, threads, shard axis,
 * spill_reload) from its config; it checks nothing and fails only with OUT_OF_MEMORY.
 */
#ifndef MXFP8_GEMM_GEMM_H
#define MXFP8_GEMM_GEMM_H

#include "../format/recipe.h"
#include "../kernels/qpanel.h"
#include "../kernels/ukernel.h"
#include "../runtime/tensor.h"
#include "../runtime/workspace.h"

/** A validated operand, flattened for the packer, with its quantization: recipe, rounding, statistics request. */
typedef struct mxfp8i_gop {
    const char *data;          /**< values: F32/BF16/F16 (high precision), E4M3/E5M2/U8 codes, U32 x4 codes */
    mxfp8_dtype dtype;
    int64_t R, K;              /**< logical [R, K] */
    int64_t s0, s1;            /**< strides (elements) of the values view: plain [R, K] (x4: [R, ceil(K/4)]);
                                    swizzled [K/4, 4R] (x4: [K/4, R]) */
    int swizzled, x4, prequant;
    const uint8_t *scales;     /**< pre-quantized only */
    mxfp8_scale_layout layout;
    int64_t ss0, ss1;          /**< strides of the scales view (for SWIZZLE_128X4 on a 1-D view: ss0 = C', ss1 = 1) */
    int64_t scols;             /**< columns of the layout's 2-D shape (src/quant/layout.h) */
    mxfp8i_recipe rc;          /**< format (of the codes made or held), rule (high precision only), group scheme */
    mxfp8i_sround sr;          /**< rounding of a high-precision operand's elements (sr.on = 0: RNE): element (r, k)
                                    has the logical index sr.idx0 + r*sr.i_ls + k*sr.i_ks (src/kernels/qpanel.h) */
    mxfp8i_qstats *stats;      /**< statistics request: NULL, or the accumulator the statistics pass over this
                                    operand adds to (src/ops/opstats.h; the GEMM itself does not read it) */
} mxfp8i_gop;

/** The rounding of a panel whose line l is row r0 + l of op. */
static inline mxfp8i_sround mxfp8i_gop_sround(const mxfp8i_gop *op, int64_t r0) {
    mxfp8i_sround s = op->sr;
    s.idx0 += r0 * s.i_ls;
    return s;
}

/** A high-precision operand [R, K]: element (r, k) at data[r*s0 + k*s1] (strides in elements of dtype). Its recipe,
 *  rounding and statistics request are zero (E4M3, NKI, 1x32, RNE, none) until the caller sets them. */
static inline mxfp8i_gop mxfp8i_gop_hp(const void *data, mxfp8_dtype dtype, int64_t R, int64_t K, int64_t s0,
                                       int64_t s1) {
    mxfp8i_gop g;
    memset(&g, 0, sizeof g);
    g.data = (const char *)data;
    g.dtype = dtype;
    g.R = R;
    g.K = K;
    g.s0 = s0;
    g.s1 = s1;
    return g;
}
/** A pre-quantized operand [R, K] with 1x32 compact scales: code (r, k) at codes[r*s0 + k*s1], scale (r, g) at
 *  scales[r*ss0 + g*ss1]. */
static inline mxfp8i_gop mxfp8i_gop_codes(const uint8_t *codes, int64_t R, int64_t K, int64_t s0, int64_t s1,
                                          const uint8_t *scales, int64_t ss0, int64_t ss1) {
    mxfp8i_gop g = mxfp8i_gop_hp(codes, MXFP8_DTYPE_U8, R, K, s0, s1);
    g.prequant = 1;
    g.scales = scales;
    g.layout = MXFP8_SCALES_COMPACT;
    g.ss0 = ss0;
    g.ss1 = ss1;
    g.scols = mxfp8i_ceil_div(K, 32);
    return g;
}

/** Resolve the speed knobs of a config for kernel `uk` (copy in `out`): every 0 / auto field gets its value (tile
 *  defaults from the kernel), tiles are rounded to the kernel's register tile. Never fails (the config must have
 *  been validated). The config's float8_dtype, scale_rule and quant_scheme are not read below the public entries
 *  (they become the operands' recipes there). */
void mxfp8i_gemm_resolve(const mxfp8_matmul_config *in, const mxfp8i_ukernel *uk, int64_t M, int64_t N, int64_t K,
                         int nthreads, mxfp8_matmul_config *out);

/** Validate the non-tensor fields of a config (enum ranges, negative sizes). `fn` names the caller. */
mxfp8_status mxfp8i_check_config(const char *fn, const char *name, const mxfp8_matmul_config *cfg);

/** Validate a public operand and flatten it with recipe `rc` (resolved and range-checked by the caller; checked
 *  here against the operand: FP8 codes of rc.fmt, wrapX groups on K % 128 == 0). K_hint: the contraction length when
 *  known from elsewhere (config->K or the other operand), else -1; needed for x4-packed operands. On success *out is
 *  filled (RNE rounding, no statistics request: the caller sets them). */
mxfp8_status mxfp8i_gop_from_operand(const char *fn, const char *name, const mxfp8_operand *op, int64_t K_hint,
                                     mxfp8i_recipe rc, mxfp8i_gop *out);

/** The GEMM on validated operands (a.K == b.K; C [a.R, b.R] F32/BF16/F16 view, F32 when accumulate), with
 *  `config` (validated, NULL = defaults; resolved inside) and at most `num_threads` threads (1 = run on the calling
 *  thread, which may be inside the caller's own parallel region). Returns MXFP8_OK or MXFP8_ERR_OUT_OF_MEMORY (then C
 *  is untouched). */
mxfp8_status mxfp8i_gemm_gop(const mxfp8i_gop *a, const mxfp8i_gop *b, const mxfp8_matmul_config *config,
                             int accumulate, const mxfp8_tensor *c, int num_threads);
/** mxfp8i_gemm_gop with a bias (accumulate 0): each element's sum + bias[n] (FP32 [b.R], contiguous; one FP32
 *  addition after the chain), then rounded once to C's dtype (mxfp8_linear). bias NULL: mxfp8i_gemm_gop. */
mxfp8_status mxfp8i_gemm_gop_bias(const mxfp8i_gop *a, const mxfp8i_gop *b, const mxfp8_matmul_config *config,
                                  int accumulate, const float *bias, const mxfp8_tensor *c, int num_threads);

/* Scratch: every buffer of a GEMM is a slot of the calling thread's open workspace scope
 * (src/runtime/workspace.h; a private scope when none is open), so the GEMMs of one public call, and the calls of
 * one user workspace, reuse their buffers. mxfp8i_ws_bkey keeps an expert's packed weights across its blocks. */

/** Make the open scope's arena hold every buffer a later mxfp8i_gemm_gop of this size will take (C [M, N],
 *  contraction K, the same config and thread count; keyed_slot >= 0: its B panels in that keyed slot), so that the
 *  GEMM itself cannot fail: a layer reserves all its GEMMs before its first store. OK or OUT_OF_MEMORY. */
mxfp8_status mxfp8i_gemm_reserve(int64_t M, int64_t N, int64_t K, const mxfp8_matmul_config *config, int num_threads,
                                 int keyed_slot);

/** Segmented accumulation: for s = 0 .. nseg-1 in order, C (F32 [a[0].R, b[0].R]; or BF16 with c_zero, the FP32
 *  result rounded once (RNE, the registry's to_bf16) at the end) += the GEMM of a[s], b[s]
 *  (a[s].R = a[0].R, b[s].R = b[0].R, a[s].K = b[s].K >= 1, each with its own rounding): bitwise what nseg calls of
 *  mxfp8i_gemm_gop with accumulate = 1 give (each element: C + the segment's fmaf chain from +0, one FP32 addition
 *  per segment, segments in order), with each block of C kept in cache across the segments instead of read and
 *  written once per segment. Threads split C along the shard axis as mxfp8i_gemm_gop does; the other operand's
 *  panels of every segment are packed first (shared by the threads, one barrier), and each thread packs the panels
 *  of its own share of the sharded operand, a few at a time, just before it uses them.
 *  c_zero = 1: the caller vouches that C holds +0 everywhere, so C is not read (its running values start at +0: the
 *  same bits; the first segment's chain is taken as the running value, +0 + a chain from +0 being that chain) and
 *  the output is written once. stream = 1: C is an output not read again soon (a weight gradient in the caller's
 *  tensor): its F32 tiles are stored through the registry's copy_f32, which may go past the caches (speed only).
 *  OK or OUT_OF_MEMORY (C untouched). */
mxfp8_status mxfp8i_gemm_segments(const mxfp8i_gop *a, const mxfp8i_gop *b, int nseg, int c_zero, int stream,
                                  const mxfp8_matmul_config *config, const mxfp8_tensor *c, int num_threads);
/** Reserve what a later mxfp8i_gemm_segments of C [M, N] with at most nseg segments of contraction <= Kmax takes. */
mxfp8_status mxfp8i_gemm_segments_reserve(int64_t M, int64_t N, int64_t Kmax, int nseg,
                                          const mxfp8_matmul_config *config, int num_threads);

/* ---- packing (pack.c) ---- */
/** Dequantized values of row r of an operand for k in [0, K): out[k] (exact FP32), with the operand's recipe.
 *  Quantizes high-precision rows group by group (reference quantizer). `tmp` holds at least K floats of scratch
 *  (unused, may be NULL, for a pre-quantized operand). */
void mxfp8i_gop_deq_row(const mxfp8i_gop *op, int64_t r, float *out, float *tmp);
/** A column-geometry operand (a transposed view: s0 == 1, s1 > 0, not swizzled; pre-quantized: not x4): rows
 *  [r0, r0 + rows) dequantized (quantized first when high precision, with the operand's rounding) straight into
 *  out[k*ld + i], the values mxfp8i_gop_rows_f32 gives. sbuf >= rows*ceil(K/32) bytes. Returns 1, or 0 writing
 *  nothing when the operand is not of that geometry or rows <= 0. */
int mxfp8i_gop_cols_f32(const mxfp8i_gop *op, int64_t r0, int rows, float *out, int64_t ld, uint8_t *sbuf);
/** Rows [r0, r0 + rows) of an operand over all of K, dequantized (quantized first when high precision), into
 *  out[i*K + k]. sbuf >= rows*ceil(K/32) bytes, tmp >= K floats; t2 (rows*K floats, or NULL) lets a column-geometry operand
 *  (a transposed view) take the fast column quantizer before a transpose. */
void mxfp8i_gop_rows_f32(const mxfp8i_gop *op, int64_t r0, int rows, float *out, uint8_t *sbuf, float *tmp,
                         float *t2);
/** Row r of an operand as FP32 without quantizing: the high-precision values, or the exact dequantized values of a
 *  pre-quantized operand. out[0..K). */
void mxfp8i_gop_load_row(const mxfp8i_gop *op, int64_t r, float *out);

#endif /* MXFP8_GEMM_GEMM_H */
