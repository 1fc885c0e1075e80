/*
 * pack.c -- GEMM operands: element and scale addressing for every accepted arrangement, and the exact dequantized
 * FP32 rows or columns the kernel's packers read (validation happens at the edge: operand.c).
 *
 * Arrangements of the values (logical [R, K], contraction axis K):
 *   plain       view [R, K], element (r, k) at r*s0 + k*s1
 *   plain x4    view [R, ceil(K/4)] U32, byte k%4 (least significant first) of word (r, k/4)   [NKI-Q x4 storage]
 *   swizzled    view [K/4, 4R] (K % 128 == 0): for the wrapX (sub)tile at k0 of size P, S = P/4,
 *               k = k0 + s*S + p  ->  view (k0/4 + p, 4r + s)                                 (mxfp8_swizzle_nki)
 *   swizzled x4 view [K/4, R] U32: byte s of word (k0/4 + p, r)
 * Scales (pre-quantized): mxfp8_scale_layout, F = R rows, G = ceil(K/32) groups (compact group index; for wrapX the
 * group j of the tile at k0 is k0/32 + j).
 * The kernel's packers turn these FP32 rows or columns (or BF16 values and scales) into its own panel format.
 */
#include <math.h>
#include <stdlib.h>

#include "../kernels/qpanel.h"
#include "../format/groups.h"
#include "../quant/layout.h"
#include "../quant/panel.h"
#include "gemm.h"

/* Scale (r, g) of a pre-quantized operand, through the one layout formula (src/quant/layout.h). */
static inline uint8_t scale_at(const mxfp8i_gop *op, int64_t r, int64_t g) {
    int64_t row, col;
    mxfp8i_layout_pos(op->layout, r, g, op->scols, &row, &col);
    return op->scales[row * op->ss0 + col * op->ss1];
}

/* ---------------------------------------------------------------------------------------------------------- */
/* element addressing                                                                                          */
/* ---------------------------------------------------------------------------------------------------------- */
/* Offset (in elements of the values view) of (r, k), and for x4 the byte within the word. */
static inline int64_t elem_off(const mxfp8i_gop *op, int64_t r, int64_t k, int *byte) {
    if (!op->swizzled) {
        if (op->x4) { *byte = (int)(k & 3); return r * op->s0 + (k >> 2) * op->s1; }
        *byte = 0;
        return r * op->s0 + k * op->s1;
    }
    int64_t k0, P;
    mxfp8i_wrapx_tile_of(op->K, k, &k0, &P);
    int64_t S = P / 4, s = (k - k0) / S, p = (k - k0) % S, row = k0 / 4 + p;
    if (op->x4) { *byte = (int)s; return row * op->s0 + r * op->s1; }
    *byte = 0;
    return row * op->s0 + (4 * r + s) * op->s1;
}

static inline uint8_t code_at(const mxfp8i_gop *op, int64_t r, int64_t k) {
    int byte;
    int64_t off = elem_off(op, r, k, &byte);
    if (op->x4) return (uint8_t)(((const uint32_t *)op->data)[off] >> (8 * byte));
    return ((const uint8_t *)op->data)[off];
}

/* Load row r of a high-precision operand into x[0..K). */
static void load_row_hp(const mxfp8i_gop *op, int64_t r, float *x) {
    int64_t K = op->K;
    if (!op->swizzled) {
        int64_t base = r * op->s0, s1 = op->s1;
        switch (op->dtype) {
        case MXFP8_DTYPE_F32: {
            const float *p = (const float *)op->data + base;
            for (int64_t k = 0; k < K; k++) x[k] = p[k * s1];
            return;
        }
        case MXFP8_DTYPE_BF16: {
            const uint16_t *p = (const uint16_t *)op->data + base;
            for (int64_t k = 0; k < K; k++) {
                uint32_t u = (uint32_t)p[k * s1] << 16;
                memcpy(&x[k], &u, 4);
            }
            return;
        }
        default:
            for (int64_t k = 0; k < K; k++) x[k] = mxfp8i_load_f32(op->data, op->dtype, base + k * s1);
            return;
        }
    }
    int byte;
    for (int64_t k = 0; k < K; k++) x[k] = mxfp8i_load_f32(op->data, op->dtype, elem_off(op, r, k, &byte));
}

void mxfp8i_gop_deq_row(const mxfp8i_gop *op, int64_t r, float *out, float *tmp) {
    const int64_t K = op->K, G = mxfp8i_ceil_div(K, 32);
    const mxfp8_format fmt = op->rc.fmt;
    const mxfp8_group_scheme group = op->rc.group;
    if (!op->prequant) {
        const mxfp8_scale_rule rule = op->rc.rule;
        load_row_hp(op, r, tmp);
        if (op->sr.on) { /* stochastic rounding: the loaded row as a one-line panel (indices of row r) */
            mxfp8i_qpanel p = {tmp, MXFP8_DTYPE_F32, 1, K, K, 1, fmt, rule, group, out, MXFP8_DTYPE_F32, K, 1,
                               NULL, 0, 0, mxfp8i_gop_sround(op, r), NULL};
            mxfp8i_quantize_panel(&p);
            return;
        }
        if (group == MXFP8_GROUP_1X32) {
            for (int64_t g = 0; g < G; g++) {
                int n = (int)(K - 32 * g < 32 ? K - 32 * g : 32);
                mxfp8i_qdq_group_ref(tmp + 32 * g, n, fmt, rule, out + 32 * g);
            }
            return;
        }
        int64_t idx[32];
        float xg[32], yg[32];
        for (int64_t g = 0; g < G; g++) {
            int n = mxfp8i_group_members(K, group, g, idx);
            for (int q = 0; q < n; q++) xg[q] = tmp[idx[q]];
            mxfp8i_qdq_group_ref(xg, n, fmt, rule, yg);
            for (int q = 0; q < n; q++) out[idx[q]] = yg[q];
        }
        return;
    }
    int64_t idx[32];
    uint8_t cg[32];
    float yg[32];
    for (int64_t g = 0; g < G; g++) {
        int n = mxfp8i_group_members(K, group, g, idx);
        for (int q = 0; q < n; q++) cg[q] = code_at(op, r, idx[q]);
        mxfp8i_dequantize_group_ref(cg, n, scale_at(op, r, g), fmt, yg);
        for (int q = 0; q < n; q++) out[idx[q]] = yg[q];
    }
}

void mxfp8i_gop_load_row(const mxfp8i_gop *op, int64_t r, float *out) {
    if (!op->prequant) load_row_hp(op, r, out);
    else mxfp8i_gop_deq_row(op, r, out, NULL);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* FP32 rows or columns of exact dequantized values, for the kernel's packers                                  */
/* ---------------------------------------------------------------------------------------------------------- */
int mxfp8i_gop_cols_f32(const mxfp8i_gop *op, int64_t r0, int rows, float *out, int64_t ld, uint8_t *sbuf) {
    if (rows <= 0 || op->swizzled || op->s0 != 1 || op->s1 <= 0 || (op->prequant && op->x4)) return 0;
    const mxfp8_format fmt = op->rc.fmt;
    const mxfp8_group_scheme group = op->rc.group;
    if (op->prequant) {
        const int64_t G = mxfp8i_ceil_div(op->K, 32);
        for (int i = 0; i < rows; i++)
            for (int64_t g = 0; g < G; g++) sbuf[g * rows + i] = scale_at(op, r0 + i, g);
        mxfp8i_dqpanel p = {(const uint8_t *)op->data + r0, fmt, rows, op->K, 1, op->s1, sbuf, 1, rows, group, out,
                            MXFP8_DTYPE_F32, 1, ld};
        mxfp8i_dequantize_panel(&p);
        return 1;
    }
    const char *base = op->data + r0 * (int64_t)mxfp8_dtype_size(op->dtype);
    mxfp8i_qpanel p = {base, op->dtype, rows, op->K, 1, op->s1, fmt, op->rc.rule, group, out, MXFP8_DTYPE_F32, 1, ld,
                       NULL, 0, 0, mxfp8i_gop_sround(op, r0), NULL};
    mxfp8i_quantize_panel(&p);
    return 1;
}

/* out[i*K + k] = t[k*rows + i] */
static void transpose_to_rows(const float *t, int rows, int64_t K, float *out) {
    for (int64_t k0 = 0; k0 < K; k0 += 64) {
        int64_t k1 = k0 + 64 < K ? k0 + 64 : K;
        for (int i = 0; i < rows; i++)
            for (int64_t k = k0; k < k1; k++) out[i * K + k] = t[k * rows + i];
    }
}

void mxfp8i_gop_rows_f32(const mxfp8i_gop *op, int64_t r0, int rows, float *out, uint8_t *sbuf, float *tmp,
                         float *t2) {
    const int64_t K = op->K, G = mxfp8i_ceil_div(K, 32);
    const mxfp8_format fmt = op->rc.fmt;
    const mxfp8_scale_rule rule = op->rc.rule;
    const mxfp8_group_scheme group = op->rc.group;
    if (rows <= 0) return;
    size_t es = mxfp8_dtype_size(op->dtype);
    if (!op->swizzled && !op->prequant) {
        const char *base = op->data + (r0 * op->s0) * (int64_t)es;
        if (op->s0 == 1 && op->s1 > 0 && t2) {
            /* [K, R]-contiguous (a transposed view): quantize down the columns into t2 [K, rows], then transpose */
            mxfp8i_qpanel p = {base, op->dtype, rows, K, 1, op->s1, fmt, rule, group, t2, MXFP8_DTYPE_F32, 1, rows,
                               NULL, 0, 0, mxfp8i_gop_sround(op, r0), NULL};
            mxfp8i_quantize_panel(&p);
            transpose_to_rows(t2, rows, K, out);
            return;
        }
        mxfp8i_qpanel p = {base, op->dtype, rows, K, op->s0, op->s1, fmt, rule, group, out, MXFP8_DTYPE_F32, K, 1,
                           NULL, 0, 0, mxfp8i_gop_sround(op, r0), NULL};
        mxfp8i_quantize_panel(&p);
        return;
    }
    if (!op->swizzled && op->prequant && (op->s1 == 1 || !op->x4)) {
        int64_t cls = op->x4 ? op->s0 * 4 : op->s0, cks = op->x4 ? 1 : op->s1;
        const uint8_t *cb = (const uint8_t *)op->data + r0 * cls;
        if (cls == 1 && cks > 0 && t2) {
            for (int i = 0; i < rows; i++)
                for (int64_t g = 0; g < G; g++) sbuf[g * rows + i] = scale_at(op, r0 + i, g);
            mxfp8i_dqpanel p = {cb, fmt, rows, K, 1, cks, sbuf, 1, rows, group, t2, MXFP8_DTYPE_F32, 1, rows};
            mxfp8i_dequantize_panel(&p);
            transpose_to_rows(t2, rows, K, out);
            return;
        }
        for (int i = 0; i < rows; i++)
            for (int64_t g = 0; g < G; g++) sbuf[i * G + g] = scale_at(op, r0 + i, g);
        mxfp8i_dqpanel p = {cb, fmt, rows, K, cls, cks, sbuf, G, 1, group, out, MXFP8_DTYPE_F32, K, 1};
        mxfp8i_dequantize_panel(&p);
        return;
    }
    for (int i = 0; i < rows; i++) mxfp8i_gop_deq_row(op, r0 + i, out + (int64_t)i * K, tmp);
}
