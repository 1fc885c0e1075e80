/*
 * panel.c -- the quantization entry of the library's other layers (panel.h): each panel runs the registry's
 * quantization kernel under IEEE MXCSR defaults (src/runtime/fenv.h), the reference where that kernel declines the
 * geometry; and the row / column wrappers.
 */
#include "../kernels/ref/ref.h"
#include "../kernels/registry.h"
#include "../runtime/fenv.h"
#include "panel.h"

/* ---------------------------------------------------------------------------------------------------------- */
/* Dispatch and the row / column wrappers                                                                      */
/* ---------------------------------------------------------------------------------------------------------- */
int64_t mxfp8i_quantize_panel(const mxfp8i_qpanel *p) {
    if (p->lines <= 0 || p->K <= 0) return 0;
    unsigned csr = mxfp8i_fenv_enter();
    int64_t r = mxfp8i_kernels_get()->quant->quantize(p);
    if (r < 0) r = mxfp8i_quantize_panel__ref(p);
    mxfp8i_fenv_leave(csr);
    return r;
}

int64_t mxfp8i_dequantize_panel(const mxfp8i_dqpanel *p) {
    if (p->lines <= 0 || p->K <= 0) return 0;
    unsigned csr = mxfp8i_fenv_enter();
    int64_t r = mxfp8i_kernels_get()->quant->dequantize(p);
    if (r < 0) r = mxfp8i_dequantize_panel__ref(p);
    mxfp8i_fenv_leave(csr);
    return r;
}

static int64_t qrows(const void *src, mxfp8_dtype dtype, int64_t R, int64_t K, int64_t ld_src, mxfp8_format fmt,
                     mxfp8_scale_rule rule, mxfp8_group_scheme group, void *out, mxfp8_dtype out_dtype, int64_t ld_out,
                     uint8_t *scales, int64_t ld_scales) {
    mxfp8i_qpanel p = {src, dtype, R, K, ld_src, 1, fmt, rule, group, out, out_dtype, ld_out, 1, scales, ld_scales, 1,
                       {0, 0, 0, 0, 0, 0}, NULL};
    return mxfp8i_quantize_panel(&p);
}
static int64_t qcols(const void *src, mxfp8_dtype dtype, int64_t K, int64_t C, int64_t ld_src, mxfp8_format fmt,
                     mxfp8_scale_rule rule, mxfp8_group_scheme group, void *out, mxfp8_dtype out_dtype, int64_t ld_out,
                     uint8_t *scales, int64_t ld_scales) {
    mxfp8i_qpanel p = {src, dtype, C, K, 1, ld_src, fmt, rule, group, out, out_dtype, 1, ld_out, scales, 1, ld_scales,
                       {0, 0, 0, 0, 0, 0}, NULL};
    return mxfp8i_quantize_panel(&p);
}

void mxfp8i_quantize_rows(const void *src, mxfp8_dtype dtype, int64_t R, int64_t K, int64_t ld_src, mxfp8_format fmt,
                          mxfp8_scale_rule rule, mxfp8_group_scheme group, uint8_t *codes, int64_t ld_codes,
                          uint8_t *scales, int64_t ld_scales) {
    qrows(src, dtype, R, K, ld_src, fmt, rule, group, codes, MXFP8_DTYPE_U8, ld_codes, scales, ld_scales);
}
void mxfp8i_quantize_cols(const void *src, mxfp8_dtype dtype, int64_t K, int64_t C, int64_t ld_src, mxfp8_format fmt,
                          mxfp8_scale_rule rule, mxfp8_group_scheme group, uint8_t *codes, int64_t ld_codes,
                          uint8_t *scales, int64_t ld_scales) {
    qcols(src, dtype, K, C, ld_src, fmt, rule, group, codes, MXFP8_DTYPE_U8, ld_codes, scales, ld_scales);
}
int64_t mxfp8i_qdq_rows_bf16(const void *src, mxfp8_dtype dtype, int64_t R, int64_t K, int64_t ld_src, mxfp8_format fmt,
                             mxfp8_scale_rule rule, mxfp8_group_scheme group, uint16_t *out, int64_t ld_out,
                             uint8_t *scales, int64_t ld_scales) {
    return qrows(src, dtype, R, K, ld_src, fmt, rule, group, out, MXFP8_DTYPE_BF16, ld_out, scales, ld_scales);
}
int64_t mxfp8i_qdq_cols_bf16(const void *src, mxfp8_dtype dtype, int64_t K, int64_t C, int64_t ld_src, mxfp8_format fmt,
                             mxfp8_scale_rule rule, mxfp8_group_scheme group, uint16_t *out, int64_t ld_out,
                             uint8_t *scales, int64_t ld_scales) {
    return qcols(src, dtype, K, C, ld_src, fmt, rule, group, out, MXFP8_DTYPE_BF16, ld_out, scales, ld_scales);
}
void mxfp8i_qdq_rows_f32(const void *src, mxfp8_dtype dtype, int64_t R, int64_t K, int64_t ld_src, mxfp8_format fmt,
                         mxfp8_scale_rule rule, mxfp8_group_scheme group, float *out, int64_t ld_out, uint8_t *scales,
                         int64_t ld_scales) {
    qrows(src, dtype, R, K, ld_src, fmt, rule, group, out, MXFP8_DTYPE_F32, ld_out, scales, ld_scales);
}
void mxfp8i_qdq_cols_f32(const void *src, mxfp8_dtype dtype, int64_t K, int64_t C, int64_t ld_src, mxfp8_format fmt,
                         mxfp8_scale_rule rule, mxfp8_group_scheme group, float *out, int64_t ld_out, uint8_t *scales,
                         int64_t ld_scales) {
    qcols(src, dtype, K, C, ld_src, fmt, rule, group, out, MXFP8_DTYPE_F32, ld_out, scales, ld_scales);
}
int64_t mxfp8i_dequantize_rows(const uint8_t *codes, int64_t R, int64_t K, int64_t ld_codes, mxfp8_format fmt,
                               const uint8_t *scales, int64_t ld_scales, mxfp8_group_scheme group, void *out,
                               mxfp8_dtype out_dtype, int64_t ld_out) {
    mxfp8i_dqpanel p = {codes, fmt, R, K, ld_codes, 1, scales, ld_scales, 1, group, out, out_dtype, ld_out, 1};
    return mxfp8i_dequantize_panel(&p);
}
int64_t mxfp8i_dequantize_cols(const uint8_t *codes, int64_t K, int64_t C, int64_t ld_codes, mxfp8_format fmt,
                               const uint8_t *scales, int64_t ld_scales, mxfp8_group_scheme group, void *out,
                               mxfp8_dtype out_dtype, int64_t ld_out) {
    mxfp8i_dqpanel p = {codes, fmt, C, K, 1, ld_codes, scales, 1, ld_scales, group, out, out_dtype, 1, ld_out};
    return mxfp8i_dequantize_panel(&p);
}
