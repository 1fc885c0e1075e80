/*
 * ref.h -- the reference kernels (portable C): the executable specification every ISA kernel must reproduce bit for
 * bit, and the defaults of every registry slot (internal).
 */
#ifndef MXFP8_KERNELS_REF_H
#define MXFP8_KERNELS_REF_H

#include "../qpanel.h"
#include "../ukernel.h"

/** The reference quantize / dequantize panels (any strides; qpanel.h). Never return -1. */
int64_t mxfp8i_quantize_panel__ref(const mxfp8i_qpanel *p);
int64_t mxfp8i_dequantize_panel__ref(const mxfp8i_dqpanel *p);
void mxfp8i_to_bf16__ref(const float *src, int64_t ld_src, uint16_t *dst, int64_t ld_dst, int64_t rows, int64_t n);
void mxfp8i_f32_t__ref(const float *src, int64_t ld_src, float *dst, int64_t ld_dst, int64_t rows, int64_t cols,
                       int stream);
void mxfp8i_exp_f32__ref(const float *x, float *y, int64_t n);
void mxfp8i_dot_f64__ref(const float *x, int64_t ldx, const float *y, int64_t ldy, int64_t n, int64_t rows,
                         double *out);
void mxfp8i_add_f32__ref(const float *src, int64_t ld_src, float *dst, int64_t ld_dst, int64_t rows, int64_t n);
void mxfp8i_bf16_t__ref(const uint16_t *src, int64_t ld_src, float *dst, int64_t ld_dst, int64_t rows, int64_t cols);
extern const mxfp8i_qkernel mxfp8i_mx_quant__ref;

/** The reference F32 microkernel (the plain contract of ukernel.h with pre-offset panel pointers). */
void mxfp8i_f32_gemm_8x32__ref(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int mr, int nr,
                               int load_c);
/** The F32 panel format (ukernel.h), shared by every F32 kernel: bytes of a panel, and its packers. */
int64_t mxfp8i_f32_panel_bytes(int64_t K, int w);
void mxfp8i_f32_pack(int is_b, const float *src, int64_t ld, int rows, int64_t K, void *panel);
void mxfp8i_f32_pack_cm(int is_b, const float *src, int64_t ld, int rows, int64_t K, void *panel);
extern const mxfp8i_ukernel mxfp8i_f32_gemm_8x32__ref_ukernel;

#endif /* MXFP8_KERNELS_REF_H */
