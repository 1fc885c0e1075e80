/*
 * panel.h -- MX quantization for the library's other layers (the GEMM packer, the MoE layer, the goldens): panels
 * through the kernel registry, plus row / column wrappers (internal; implementation src/quant/panel.c).
 *
 * Unchecked entries for callers that validated their arguments. All are single-threaded and re-entrant; sizes may be
 * 0; bit-identical to mxfp8i_quantize_group_ref whatever kernel runs. They run under IEEE MXCSR defaults whatever the
 * calling thread has set, and restore its MXCSR on return.
 *
 * Geometry (src/kernels/qpanel.h has the general strided form). A "rows" panel: element (r, k) at src[r*ld_src + k],
 * R rows of K contiguous values, quantized along the row. A "cols" panel: element (k, c) at src[k*ld_src + c], src
 * [K, C] row-major, quantized along K (down each column; no transpose). Outputs use the same geometry: rows:
 * out[r*ld_out + k], scales[r*ld_scales + g]; cols: out[k*ld_out + c], scales[g*ld_scales + c]; g < G = ceil(K/32) in
 * compact group order. `group` = MXFP8_GROUP_WRAPX needs K % 128 == 0 (the caller checks). src dtype: F32, BF16 or
 * F16. ld_* are in elements of the buffer's own type. The BF16 qdq variants return the number of elements whose BF16
 * value differs from the exact FP32 value (a caller that needs exactness redoes such a panel in F32). `scales` may be
 * NULL in the qdq variants (not stored).
 */
#ifndef MXFP8_QUANT_PANEL_H
#define MXFP8_QUANT_PANEL_H

#include "../kernels/qpanel.h"

/** One panel through the registry's quantization kernel (the reference when it declines the geometry). Returns
 *  the BF16/F16-inexact count (qpanel.h). */
int64_t mxfp8i_quantize_panel(const mxfp8i_qpanel *p);
int64_t mxfp8i_dequantize_panel(const mxfp8i_dqpanel *p);

/** Quantize rows: codes[r*ld_codes + k] (uint8 FP8 codes), scales[r*ld_scales + g]. */
void mxfp8i_quantize_rows(const void *src, mxfp8_dtype dtype, int64_t R, int64_t K, int64_t ld_src,
                          mxfp8_format fmt, mxfp8_scale_rule rule, mxfp8_group_scheme group, uint8_t *codes,
                          int64_t ld_codes, uint8_t *scales, int64_t ld_scales);
/** Quantize along columns: src [K, C] (row stride ld_src), codes [K, C] (ld_codes), scales [G, C] (ld_scales). */
void mxfp8i_quantize_cols(const void *src, mxfp8_dtype dtype, int64_t K, int64_t C, int64_t ld_src,
                          mxfp8_format fmt, mxfp8_scale_rule rule, mxfp8_group_scheme group, uint8_t *codes,
                          int64_t ld_codes, uint8_t *scales, int64_t ld_scales);
/** qdq rows / columns into BF16; return the count of BF16-inexact elements. */
int64_t mxfp8i_qdq_rows_bf16(const void *src, mxfp8_dtype dtype, int64_t R, int64_t K, int64_t ld_src,
                             mxfp8_format fmt, mxfp8_scale_rule rule, mxfp8_group_scheme group, uint16_t *out,
                             int64_t ld_out, uint8_t *scales, int64_t ld_scales);
int64_t mxfp8i_qdq_cols_bf16(const void *src, mxfp8_dtype dtype, int64_t K, int64_t C, int64_t ld_src,
                             mxfp8_format fmt, mxfp8_scale_rule rule, mxfp8_group_scheme group, uint16_t *out,
                             int64_t ld_out, uint8_t *scales, int64_t ld_scales);
/** qdq rows / columns into FP32 (exact). */
void mxfp8i_qdq_rows_f32(const void *src, mxfp8_dtype dtype, int64_t R, int64_t K, int64_t ld_src, mxfp8_format fmt,
                         mxfp8_scale_rule rule, mxfp8_group_scheme group, float *out, int64_t ld_out,
                         uint8_t *scales, int64_t ld_scales);
void mxfp8i_qdq_cols_f32(const void *src, mxfp8_dtype dtype, int64_t K, int64_t C, int64_t ld_src, mxfp8_format fmt,
                         mxfp8_scale_rule rule, mxfp8_group_scheme group, float *out, int64_t ld_out,
                         uint8_t *scales, int64_t ld_scales);
/** Dequantize pre-quantized rows / columns -> out (F32, BF16 or F16); return the BF16/F16-inexact count. */
int64_t mxfp8i_dequantize_rows(const uint8_t *codes, int64_t R, int64_t K, int64_t ld_codes, mxfp8_format fmt,
                               const uint8_t *scales, int64_t ld_scales, mxfp8_group_scheme group, void *out,
                               mxfp8_dtype out_dtype, int64_t ld_out);
int64_t mxfp8i_dequantize_cols(const uint8_t *codes, int64_t K, int64_t C, int64_t ld_codes, mxfp8_format fmt,
                               const uint8_t *scales, int64_t ld_scales, mxfp8_group_scheme group, void *out,
                               mxfp8_dtype out_dtype, int64_t ld_out);

#endif /* MXFP8_QUANT_PANEL_H */
