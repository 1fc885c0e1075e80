/*
 * qpanel.h -- the quantization kernel slots: one contract for MX quantize / dequantize panels, the per-group
 * reference (the executable specification of mxfp8_quantize), and the ISA overrides (internal).
 *
 * A panel: `lines` independent lines of K values along the quantization axis; element k of line l at
 * base[l*ls + k*ks] (strides in elements of the buffer's own type, any sign). rows = (ls = ld, ks = 1);
 * cols = (ls = 1, ks = ld). K may be any length (the last 1x32 group may be short); wrapX needs K % 128 == 0
 * (the caller checks). src dtype: F32, BF16 or F16.
 *   Quantize: out_dtype E4M3/E5M2/U8 stores codes; F32/BF16/F16 stores the quantize-dequantize ("qdq") values
 *     v = fp8(code) * 2^(scale - 127), computed in FP32 (exact and finite: at the top scale elements are clamped so that
 *     v stays at most FLT_MAX, see codec.h's mxfp8i_elem_cap; a NaN group gives 0x7FC00000), rounded RNE
 *     for BF16/F16. Scales (may be NULL) at scales[l*sc_ls + g*sc_gs], g < ceil(K/32) in compact group order.
 *   Dequantize: codes + scales in, values out.
 *   Both return the number of elements whose BF16/F16 value differs from the exact FP32 value (0 for F32 and code
 *   outputs): FP8 x 2^e is exact in BF16 unless |v| < 2^-126.
 *   Quantize panels may also round stochastically (sr) and add each group's statistics to an accumulator (stats);
 *   both are defined per element / per group, so they too must match the reference exactly.
 * Every kernel must give the reference's bytes exactly. A kernel returns -1, writing nothing, for a geometry it
 * does not handle; the dispatcher (src/quant/panel.c) then runs the reference. Kernels run under IEEE MXCSR
 * defaults (the dispatcher takes src/runtime/fenv.h's guard), single-threaded, re-entrant.
 */
#ifndef MXFP8_KERNELS_QPANEL_H
#define MXFP8_KERNELS_QPANEL_H

#include <stdint.h>

#include "mxfp8.h"
#include "qstats.h"

/** Element rounding of a quantize panel. on = 0: RNE. on = 1: stochastic rounding (include/mxfp8.h) with the random
 *  word of logical index idx0 + l*i_ls + k*i_ks for element (l, k), from (seed, stream) (src/format/philox.h);
 *  every index must be >= 0. */
typedef struct mxfp8i_sround {
    int on;
    uint64_t seed, stream;
    int64_t idx0, i_ls, i_ks;
} mxfp8i_sround;

/** The rounding of an operand quantized by a call: stochastic (on != 0) with (seed, stream) and the logical index
 *  idx0 + r*i0 + k*i1 of element (r, k); RNE when on == 0. */
static inline mxfp8i_sround mxfp8i_sround_make(int on, uint64_t seed, uint64_t stream, int64_t idx0, int64_t i0,
                                               int64_t i1) {
    mxfp8i_sround s = {on ? 1 : 0, seed, stream, idx0, i0, i1};
    return s;
}

typedef struct mxfp8i_qpanel {
    const void *src;
    mxfp8_dtype src_dtype;
    int64_t lines, K, src_ls, src_ks;
    mxfp8_format fmt;
    mxfp8_scale_rule rule;
    mxfp8_group_scheme group;
    void *out;
    mxfp8_dtype out_dtype;
    int64_t out_ls, out_ks;
    uint8_t *scales;
    int64_t sc_ls, sc_gs;
    /* Optional (zero = RNE, no statistics; positional initializers may stop before them): */
    mxfp8i_sround sr;       /**< element rounding */
    mxfp8i_qstats *stats;   /**< NULL, or += the statistics of every group of the panel (qstats.h) */
} mxfp8i_qpanel;

typedef struct mxfp8i_dqpanel {
    const uint8_t *codes;
    mxfp8_format fmt;
    int64_t lines, K, codes_ls, codes_ks;
    const uint8_t *scales;
    int64_t sc_ls, sc_gs;
    mxfp8_group_scheme group;
    void *out;
    mxfp8_dtype out_dtype;
    int64_t out_ls, out_ks;
} mxfp8i_dqpanel;

typedef int64_t (*mxfp8i_qpanel_fn)(const mxfp8i_qpanel *p);
typedef int64_t (*mxfp8i_dqpanel_fn)(const mxfp8i_dqpanel *p);
/** FP32 -> BF16 rows (the GEMM epilogue): dst[r*ld_dst + j] = mxfp8i_fp32_to_bf16(src[r*ld_src + j]) for r < rows,
 *  j < n: round to nearest even, NaN quieted with its sign, subnormals kept (no FTZ: VCVTNEPS2BF16 does not apply). */
typedef void (*mxfp8i_to_bf16_fn)(const float *src, int64_t ld_src, uint16_t *dst, int64_t ld_dst, int64_t rows,
                                  int64_t n);

/** Transposing BF16 -> FP32 load (the MoE checkpoints, stored with positions innermost): dst[c*ld_dst + r] =
 *  the FP32 value of src[r*ld_src + c] for r < rows, c < cols (exact). */
typedef void (*mxfp8i_bf16_t_fn)(const uint16_t *src, int64_t ld_src, float *dst, int64_t ld_dst, int64_t rows,
                                 int64_t cols);

/** Transposing FP32 copy (the MoE's FP32 checkpoints, positions innermost, read and written): dst[c*ld_dst + r] =
 *  src[r*ld_src + c] for r < rows, c < cols (the bits moved, nothing rounded). stream != 0: dst is an output written
 *  once and not read again soon (the forward's checkpoints): a kernel may store it past the caches (non-temporal
 *  stores, which skip reading each line before it is written), every store visible to the other threads when the
 *  call returns. */
typedef void (*mxfp8i_f32_t_fn)(const float *src, int64_t ld_src, float *dst, int64_t ld_dst, int64_t rows,
                                int64_t cols, int stream);

/** FP32 accumulation rows (the GEMM epilogue with accumulate): dst[r*ld_dst + j] = dst[r*ld_dst + j] +
 *  src[r*ld_src + j] for r < rows, j < n, one IEEE FP32 addition (RNE, no FTZ/DAZ under the GEMM's MXCSR) each. */
typedef void (*mxfp8i_add_f32_fn)(const float *src, int64_t ld_src, float *dst, int64_t ld_dst, int64_t rows,
                                  int64_t n);

/** FP32 rows into an output written once and not read again soon (the segmented GEMM's weight gradients written
 *  straight into the caller's tensor): dst[r*ld_dst + j] = src[r*ld_src + j] for r < rows, j < n (the bits). A
 *  kernel may store past the caches (non-temporal stores); every store is visible to the other threads when the
 *  call returns. */
typedef void (*mxfp8i_copy_f32_fn)(const float *src, int64_t ld_src, float *dst, int64_t ld_dst, int64_t rows,
                                   int64_t n);

/** The library's FP32 exponential (the MoE activations' sigmoid): y[i] = exp(x[i]) for i < n by the rule of
 *  src/kernels/expf.h (glibc's expf algorithm with its fused operations, bit for bit; no errno); x and y may be the
 *  same array. */
typedef void (*mxfp8i_exp_f32_fn)(const float *x, float *y, int64_t n);

/** Sequential FP64 dot products of `rows` rows (the MoE backward's affinity gradient): for r < rows,
 *  out[r] = (((out[r] + x[r*ldx] y[r*ldy]) + x[r*ldx + 1] y[r*ldy + 1]) + ...) over i < n, each product
 *  (double)x * (double)y (exact: two FP32 significands fit in FP64's) added in i ascending by one IEEE FP64
 *  addition (RNE). ldy = 0 gives every row the same y. The order is the contract: any ISA gives the same bits. */
typedef void (*mxfp8i_dot_f64_fn)(const float *x, int64_t ldx, const float *y, int64_t ldy, int64_t n, int64_t rows,
                                  double *out);

/** An activation of the MoE layer as the elementwise rows see it (src/kernels/act_rows.h): squared_relu = 0 for
 *  the sigmoid-gated kinds act(g) = g * sigmoid(beta g), 1 for max(g, 0)^2; up_plus_one: inter = act(g) * (u + 1);
 *  the clamp limits of g = gate and u = up (absent: -INFINITY / +INFINITY). */
typedef struct mxfp8i_act_params {
    int squared_relu, up_plus_one;
    float beta;
    float gate_lo, gate_hi, up_lo, up_hi;
} mxfp8i_act_params;

/** The forward's elementwise work of one real position of a MoE block, I elements (FP32; the expressions of
 *  src/kernels/act_rows.h). With gu (GEMM 1's row [2I]) g = clamp(gu[:I] + b1[:I]), u = clamp(gu[I:] + b1[I:])
 *  (else g, u are given); act = act(g) unless act_given; inter = act * up(u) unless inter_given; S = aq * inter when
 *  S is not NULL; sg, when not NULL, receives sigmoid(beta g) of a sigmoid-gated activation (untouched otherwise). */
typedef void (*mxfp8i_act_fwd_fn)(const mxfp8i_act_params *ap, int64_t I, const float *gu, const float *b1, float *g,
                                  float *u, float *act, int act_given, float *inter, int inter_given, float *S,
                                  float aq, float *sg);
/** The backward's: dgu [2I] = [dIv * up(u) * act'(g) * pass(g) | dIv * act * pass(u)] with dIv = aq * dI (scale)
 *  or dI; act'(g) from sg (the forward row's sigmoid) when not NULL, else recomputed. act may be NULL when sg is
 *  given (a sigmoid-gated activation): then act = g * sg, the forward row's product (the same bits). dgu may not
 *  overlap the inputs. */
typedef void (*mxfp8i_act_bwd_fn)(const mxfp8i_act_params *ap, int64_t I, const float *dI, float aq, int scale,
                                  const float *g, const float *u, const float *act, const float *sg, float *dgu);

/** The quantization kernels of one ISA (the registry's quantize and dequantize slots; the FP32 -> BF16 rounding of
 *  the GEMM epilogue, the transposing BF16 load and FP32 copy of the MoE checkpoints, the exponential of the MoE
 *  activations, their elementwise rows and the affinity gradient's FP64 dot products come with them). */
typedef struct mxfp8i_qkernel {
    const char *name;          /**< e.g. "mx_quantize_panel__avx512" */
    const char *isa_name;      /**< "scalar", "avx512" */
    int isa_level;             /**< 0 scalar, 1 avx512 */
    unsigned needs;            /**< MXFP8I_NEEDS_* (ukernel.h) */
    mxfp8i_qpanel_fn quantize;
    mxfp8i_dqpanel_fn dequantize;
    mxfp8i_to_bf16_fn to_bf16;
    mxfp8i_bf16_t_fn bf16_t;
    mxfp8i_f32_t_fn f32_t;
    mxfp8i_add_f32_fn add_f32;
    mxfp8i_copy_f32_fn copy_f32;
    mxfp8i_exp_f32_fn exp_f32;
    mxfp8i_act_fwd_fn act_fwd;
    mxfp8i_act_bwd_fn act_bwd;
    mxfp8i_dot_f64_fn dot_f64;
} mxfp8i_qkernel;

/* ---- the per-group reference (src/kernels/ref/quant_ref.c) ----
 * One group = up to 32 values (n <= 32; missing values are zero padding that never enters amax).
 * mxfp8i_quantize_group_ref writes n codes and returns the E8M0 code: amax over the values; any NaN/Inf -> scale 255
 * and NaN codes (sign kept); amax == 0 -> scale 0 and signed zero codes; else e = rule(amax), codes RNE(x * 2^-e)
 * saturating [OCP §6.3], [NKI-Q]. mxfp8i_qdq_group_ref quantizes then dequantizes exactly into FP32
 * (out[i] = fp8(code[i]) * 2^(scale-127); NaN for scale 255). */
uint8_t mxfp8i_quantize_group_ref(const float *x, int n, mxfp8_format fmt, mxfp8_scale_rule rule, uint8_t *codes);
void mxfp8i_dequantize_group_ref(const uint8_t *codes, int n, uint8_t scale, mxfp8_format fmt, float *out);
uint8_t mxfp8i_qdq_group_ref(const float *x, int n, mxfp8_format fmt, mxfp8_scale_rule rule, float *out);
/** As mxfp8i_quantize_group_ref with stochastic rounding of the elements by the random words rnd[0..n) (NULL = RNE). */
uint8_t mxfp8i_quantize_group_sr(const float *x, int n, mxfp8_format fmt, mxfp8_scale_rule rule, const uint32_t *rnd,
                                 uint8_t *codes);
/** The reference for one (line l, group g) of a quantize panel: load, quantize (p->sr), store codes or qdq values
 *  and the scale, add to p->stats. Returns the BF16/F16-inexact count. SIMD kernels use it for rare groups. */
int64_t mxfp8i_quantize_line_group_ref(const mxfp8i_qpanel *p, int64_t l, int64_t g);

#endif /* MXFP8_KERNELS_QPANEL_H */
