/*
 * oracle.h -- the C tests' independent reference for MX formats, quantization, GEMM and the blockwise MoE layer.
 *
 * Written from the definitions in include/mxfp8.h and [OCP] (OCP Microscaling Formats v1.0, sections 5 and 6),
 * sharing NO code with the library: it includes no library header and calls no library function, so a bug in the
 * library's codecs, group tables, scale rules, quantizers, GEMM kernels or MoE phases cannot hide in it. Arithmetic
 * is in double wherever the definitions allow (every FP32/BF16/FP16/FP8 value and every power-of-two scaling of one
 * is exact there); encodings are found by searching the code tables, not by bit manipulation.
 *
 * Integer arguments use the public enum values (fixed in mxfp8.h): fmt 0 = E4M3, 1 = E5M2; rule 0 = nki, 1 = ocp,
 * 2 = rceil; scheme 0 = 1x32, 1 = wrapX; act 0 = SiLU, 1 = Swish, 2 = SquaredReLU; aff 0 = AFFINITY_ON_I, 1 = ON_H.
 *
 *   codec.c  FP8 E4M3/E5M2, E8M0, BF16, FP16 values and encodings; the three scale rules
 *   quant.c  MX groups (1x32, wrapX), group quantization, line quantize / dequantize / qdq, naive GEMM
 *   moe.c    naive blockwise MoE forward and backward in FP64 on the oracle's quantized GEMM operands
 *   router.c the router linear (logits, input and weight gradients) as the fmaf chains its definition names
 */
#ifndef MXFP8_TEST_ORACLE_H
#define MXFP8_TEST_ORACLE_H

#include <stdint.h>

/* ---- codec.c ---- */
/** The value of an FP8 code [OCP 5.3.2]: (-1)^s 2^(E-bias) (1 + M/2^m), subnormal (-1)^s 2^(1-bias) M/2^m; NaN for
 *  NaN codes (E4M3 S.1111.111, E5M2 S.11111.{01,10,11}), +-Inf for E5M2 S.11111.00. */
double orc_fp8_value(unsigned code, int fmt);
/** The FP8 code of x: the nearest finite value of the format (found by searching the code table), a tie going to
 *  the even code; |x| at or beyond the largest finite value saturates to it; NaN -> 0x7F (E4M3) / 0x7E (E5M2) and
 *  Inf -> 0x7F (E4M3, which has no Inf) / 0x7C (E5M2), with x's sign. */
uint8_t orc_fp8_encode(double x, int fmt);
/** 2^(code - 127); NaN for 255 [OCP 5.4.1]. */
double orc_e8m0_value(unsigned code);
/** BF16 / FP16 bits -> value (exact). */
double orc_bf16_value(uint16_t h);
double orc_fp16_value(uint16_t h);
/** The nearest BF16 / FP16 to x (ties to the even code), IEEE overflow to +-Inf; NaN -> the quiet NaN with x's sign
 *  (0x7FC0 / 0x7E00 | sign). */
uint16_t orc_bf16_encode(double x);
uint16_t orc_fp16_encode(double x);
/** The exact FP32 value of x when it has one, else x rounded to FP32 (for the FP32 values of dequantized MX values,
 *  which are exact unless they lie beyond FP32's range, where they become +-Inf). */
float orc_f32(double x);
/** The E8M0 code of a group of magnitude `amax` under `rule` [OCP 6.3], [NKI-Q] as include/mxfp8.h defines it:
 *  255 for NaN/Inf, 0 for 0; else e + 127 with e clamped to [-127, 127], e = floor(log2 amax) - (emax - 1) (nki),
 *  floor(log2 amax) - emax (ocp), ceil(log2(amax / max_normal)) (rceil); emax 8 / 15, max normal 448 / 57344. */
int orc_scale_code(double amax, int fmt, int rule);

/* ---- quant.c ---- */
/** The members of compact group g of an axis of length K (scheme 0: [32g, 32g+32) cut at K; scheme 1: wrapX, K %
 *  128 == 0). Returns their count. */
int orc_group_members(int64_t K, int scheme, int64_t g, int64_t idx[32]);
/** One group of n <= 32 values: writes n codes, returns the E8M0 code [OCP 6.3]. */
int orc_quant_group(const double *x, int n, int fmt, int rule, uint8_t *codes);
/** The value of a code under an E8M0 scale code (NaN for 255; NaN codes keep their sign). */
double orc_dequant(uint8_t code, int scale, int fmt);
/** Quantize a line x[k * xs] of K values (any doubles; FP32/BF16/FP16 values for the library's inputs):
 *  codes[k], scales[g] (compact order; either may be NULL). */
void orc_quant_line(const double *x, int64_t xs, int64_t K, int fmt, int rule, int scheme, uint8_t *codes,
                    uint8_t *scales);
/** Quantize then dequantize a line of FP32 values x[k * xs] into out[k] (FP32; exact) -- one GEMM operand row. */
void orc_qdq_line_f32(const float *x, int64_t xs, int64_t K, int fmt, int rule, int scheme, float *out);
/** C[m*ldc + n] = fmaf chain over k ascending from +0 of qa[m*K + k] * qb[n*K + k] (the GEMM contract). */
void orc_gemm_f32(const float *qa, const float *qb, int64_t M, int64_t N, int64_t K, float *C, int64_t ldc);
/** The block-scaled GEMM of two FP32 operands A [M, K], B [N, K] (contraction last, row-major): both quantized along
 *  K (fmt, rule, scheme), dequantized exactly, then orc_gemm_f32. */
void orc_mx_gemm(const float *A, const float *B, int64_t M, int64_t N, int64_t K, int fmt, int rule, int scheme,
                 float *C);

/* ---- moe.c ---- */
/** A blockwise MoE problem (include/mxfp8.h, "Blockwise MoE"). All tensors row-major F32; b1, b2 NULL = no bias. */
typedef struct orc_moe {
    int64_t T, H, I, E, N, B;
    const float *X;      /**< [T, H] */
    const float *W1;     /**< [E, H, 2, I] */
    const float *W2;     /**< [E, I, H] */
    const float *a;      /**< [T * E] */
    const float *dY;     /**< [T, H] (backward) */
    const float *b1;     /**< [E, 2, I] or NULL */
    const float *b2;     /**< [E, H] or NULL */
    const int32_t *tok;  /**< [N * B]: token id, or `pad` */
    const int32_t *b2e;  /**< [N] */
    int32_t pad;         /**< the padding id: -1 (skip_token) or T */
    int fmt, rule, act, aff;
    float gate_lo, gate_hi, up_lo, up_hi; /**< -INFINITY / +INFINITY = no limit */
    int quantized;       /**< 1: every GEMM operand MX-quantized along its contraction axis (1x32; along a block's
                              positions the groups start at its position 0); 0: exact operands */
} orc_moe;
/** Gradients (caller-allocated FP64, sizes as the named outputs of mxfp8_moe_backward; db1/db2 NULL without bias). */
typedef struct orc_moe_grads {
    double *dX, *da, *dW1, *dW2, *db1, *db2;
} orc_moe_grads;
/** out[T, H] = the layer's forward (FP64; rows no block routes are 0). Returns 0, or -1 when out of memory. */
int orc_moe_forward(const orc_moe *m, double *out);
/** The layer's backward (FP64, every gradient overwritten). Returns 0, or -1 when out of memory. */
int orc_moe_backward(const orc_moe *m, orc_moe_grads *g);

/* ---- router.c ---- (include/mxfp8.h, "Router linear"; every array row-major, FP32 values) */
/** out[t*E + e] = (acc over h = 0..H-1 ascending from +0 of acc = fmaf(x[t*H + h], w[e*H + h], acc)) + b[e]
 *  (one FP32 addition; b NULL = none). */
void orc_router_logits(const float *x, const float *w, const float *b, int64_t T, int64_t H, int64_t E, float *out);
/** dx[t*H + h] = acc over e = 0..E-1 ascending from +0 of acc = fmaf(dl[t*E + e], w[e*H + h], acc). */
void orc_router_input_grad(const float *dl, const float *w, int64_t T, int64_t E, int64_t H, float *dx);
/** dw[e*H + h] = acc over t = 0..T-1 ascending from +0 of acc = fmaf(dl[t*E + e], x[t*H + h], acc). */
void orc_router_weight_grad(const float *dl, const float *x, int64_t T, int64_t E, int64_t H, float *dw);

#endif /* MXFP8_TEST_ORACLE_H */
