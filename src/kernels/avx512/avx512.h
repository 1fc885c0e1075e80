/*
 * avx512.h -- the AVX-512 kernels (this folder is compiled with AVX-512F/BW/VL/DQ + AVX512-BF16 flags; each kernel
 * runs only where the registry found the features it needs) (internal).
 */
#ifndef MXFP8_KERNELS_AVX512_H
#define MXFP8_KERNELS_AVX512_H

#include "../qpanel.h"
#include "../ukernel.h"

/** MX quantize / dequantize panels (qpanel.h) for the "rows" geometry (unit stride along the axis for src and out)
 *  and the "cols" geometry (unit stride across lines for src, out and scales); -1 for any other (quant_avx512.c). */
int64_t mxfp8i_quantize_panel__avx512(const mxfp8i_qpanel *p);
int64_t mxfp8i_dequantize_panel__avx512(const mxfp8i_dqpanel *p);
void mxfp8i_f32_t__avx512(const float *src, int64_t ld_src, float *dst, int64_t ld_dst, int64_t rows, int64_t cols,
                          int stream);
void mxfp8i_exp_f32__avx512(const float *x, float *y, int64_t n);
void mxfp8i_add_f32__avx512(const float *src, int64_t ld_src, float *dst, int64_t ld_dst, int64_t rows, int64_t n);
void mxfp8i_to_bf16__avx512(const float *src, int64_t ld_src, uint16_t *dst, int64_t ld_dst, int64_t rows,
                            int64_t n);
/** The transposing BF16 -> FP32 load in 16 x 16 register tiles (transpose_avx512.c). */
void mxfp8i_bf16_t__avx512(const uint16_t *src, int64_t ld_src, float *dst, int64_t ld_dst, int64_t rows,
                           int64_t cols);
extern const mxfp8i_qkernel mxfp8i_mx_quant__avx512;

/** The AVX-512F FMA microkernel on F32 panels, 8 x 32 register tile (gemm_f32_avx512.c). */
void mxfp8i_f32_gemm_8x32__avx512f(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int mr, int nr,
                                   int load_c);
extern const mxfp8i_ukernel mxfp8i_f32_gemm_8x32__avx512f_ukernel;

/** The AVX512-BF16 (VDPBF16PS) microkernel on BF16 chunk panels (gemm_bf16_avx512bf16.c), one descriptor per pair
 *  order of the unit (the checker finds which one this CPU has), and a negative control without the DAZ/FTZ routing
 *  (tests only, defined in the test build's mxfp8_test_kernels, not in libmxfp8: it must fail the checker). */
extern const mxfp8i_ukernel mxfp8i_bf16_gemm_32x32__avx512bf16_oddfirst_ukernel;
extern const mxfp8i_ukernel mxfp8i_bf16_gemm_32x32__avx512bf16_evenfirst_ukernel;
extern const mxfp8i_ukernel mxfp8i_bf16_gemm_32x32__avx512bf16_noroute_ukernel;

#endif /* MXFP8_KERNELS_AVX512_H */
