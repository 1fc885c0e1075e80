/*
 * quant_avx512.c -- AVX-512 MX quantize / qdq / dequantize panels (contract: src/internal.h, "quantization fast
 * paths"). Bit-identical to the reference panels. (First version: not yet vectorized; returns -1 so the
 * dispatcher uses the reference.)
 */
#include "../../internal.h"

int64_t mxfp8i_quantize_panel__avx512(const mxfp8i_qpanel *p) {
    (void)p;
    return -1;
}
int64_t mxfp8i_dequantize_panel__avx512(const mxfp8i_dqpanel *p) {
    (void)p;
    return -1;
}
