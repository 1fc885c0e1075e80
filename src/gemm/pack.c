/*
 * pack.c -- GEMM operands: validation/flattening of a public mxfp8_operand, element and scale addressing for every
 * accepted arrangement, and the fused "quantize -> dequantize -> write the microkernel's panel" pass.
 *
 * Arrangements of the values (logical [R, K], contraction axis K):
 *   plain       view [R, K], element (r, k) at r*s0 + k*s1
 *   plain x4    view [R, ceil(K/4)] U32, byte k%4 (least significant first) of word (r, k/4)   [NKI-Q x4 storage]
 *   swizzled    view [K/4, 4R] (K % 128 == 0): for the wrapX (sub)tile at k0 of size P, S = P/4,
 *               k = k0 + s*S + p  ->  view (k0/4 + p, 4r + s)                                 (mxfp8_swizzle_nki)
 *   swizzled x4 view [K/4, R] U32: byte s of word (k0/4 + p, r)
 * Scales (pre-quantized): mxfp8_scale_layout, F = R rows, G = ceil(K/32) groups (compact group index; for wrapX the
 * group j of the tile at k0 is k0/32 + j).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "gemm.h"
#include "ukernel.h"

/* ---------------------------------------------------------------------------------------------------------- */
/* scale layouts                                                                                               */
/* ---------------------------------------------------------------------------------------------------------- */
static void layout_shape(mxfp8_scale_layout layout, int64_t F, int64_t K, int64_t shape[2]) {
    int64_t G = mxfp8i_ceil_div(K, 32);
    switch (layout) {
    case MXFP8_SCALES_COMPACT: shape[0] = F; shape[1] = G; break;
    case MXFP8_SCALES_NKI_UNPACKED: shape[0] = mxfp8i_ceil_div(G, 4) * 32; shape[1] = F; break;
    case MXFP8_SCALES_NKI_PACKED: shape[0] = mxfp8i_ceil_div(K, 2048) * 128; shape[1] = F; break;
    default: shape[0] = mxfp8i_ceil_div(F, 128) * 128; shape[1] = mxfp8i_ceil_div(G, 4) * 4; break;
    }
}

static inline uint8_t scale_at(const mxfp8i_gop *op, int64_t r, int64_t g) {
    int64_t row, col;
    switch (op->layout) {
    case MXFP8_SCALES_COMPACT: row = r; col = g; break;
    case MXFP8_SCALES_NKI_UNPACKED: row = (g / 4) * 32 + g % 4; col = r; break;
    case MXFP8_SCALES_NKI_PACKED:
        row = (g / 64) * 128 + ((g % 64) / 16) * 4 + ((g % 16) / 4) * 32 + g % 4;
        col = r;
        break;
    default: {
        int64_t C4 = mxfp8i_ceil_div(mxfp8i_ceil_div(op->K, 32), 4) * 4;
        int64_t off = ((r / 128) * (C4 / 4) + g / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + g % 4;
        row = off / C4;
        col = off % C4;
        break;
    }
    }
    return op->scales[row * op->ss0 + col * op->ss1];
}

/* ---------------------------------------------------------------------------------------------------------- */
/* validation                                                                                                  */
/* ---------------------------------------------------------------------------------------------------------- */
mxfp8_status mxfp8i_gop_from_operand(const char *fn, const char *name, const mxfp8_operand *op, int64_t K_hint,
                                     mxfp8_format fmt, mxfp8_group_scheme group, mxfp8i_gop *out) {
    mxfp8_status st;
    if (!op) return mxfp8i_error(MXFP8_ERR_NULL_POINTER, "%s: operand %s is NULL", fn, name);
    const mxfp8_tensor *v = &op->values;
    if ((st = mxfp8i_check_rank(fn, name, v, 2))) return st;
    memset(out, 0, sizeof *out);
    out->data = (const char *)v->data;
    out->dtype = v->dtype;
    out->s0 = v->strides[0];
    out->s1 = v->strides[1];
    out->swizzled = op->swizzled != 0;
    switch (v->dtype) {
    case MXFP8_DTYPE_F32: case MXFP8_DTYPE_BF16: case MXFP8_DTYPE_F16: out->prequant = 0; break;
    case MXFP8_DTYPE_E4M3: case MXFP8_DTYPE_E5M2:
        if (v->dtype != mxfp8i_fmt_dtype(fmt))
            return mxfp8i_error(MXFP8_ERR_DTYPE, "%s: %s holds %s codes but float8_dtype is %s", fn, name,
                                mxfp8_dtype_name(v->dtype), mxfp8_dtype_name(mxfp8i_fmt_dtype(fmt)));
        out->prequant = 1;
        break;
    case MXFP8_DTYPE_U8: out->prequant = 1; break;
    case MXFP8_DTYPE_U32: out->prequant = 1; out->x4 = 1; break;
    default:
        return mxfp8i_error(MXFP8_ERR_DTYPE, "%s: %s has dtype %s (want f32, bf16, f16, e4m3, e5m2, u8 or u32)", fn,
                            name, mxfp8_dtype_name(v->dtype));
    }
    if (out->swizzled) {
        out->K = v->shape[0] * 4;
        if (out->x4) out->R = v->shape[1];
        else {
            if (v->shape[1] % 4)
                return mxfp8i_error(MXFP8_ERR_SHAPE_MISMATCH,
                                    "%s: swizzled %s has %lld columns, not a multiple of 4 ([K/4, 4R] expected)", fn,
                                    name, (long long)v->shape[1]);
            out->R = v->shape[1] / 4;
        }
        if (out->K % 128)
            return mxfp8i_error(MXFP8_ERR_UNSUPPORTED,
                                "%s: swizzled %s needs its contraction length %% 128 == 0, but it is %lld", fn, name,
                                (long long)out->K);
    } else {
        out->R = v->shape[0];
        if (out->x4) {
            if (K_hint >= 0) {
                if (mxfp8i_ceil_div(K_hint, 4) != v->shape[1])
                    return mxfp8i_error(MXFP8_ERR_SHAPE_MISMATCH,
                                        "%s: x4-packed %s has %lld words per row, but K = %lld needs %lld", fn, name,
                                        (long long)v->shape[1], (long long)K_hint,
                                        (long long)mxfp8i_ceil_div(K_hint, 4));
                out->K = K_hint;
            } else out->K = v->shape[1] * 4;
        } else out->K = v->shape[1];
    }
    if (K_hint >= 0 && out->K != K_hint)
        return mxfp8i_error(MXFP8_ERR_SHAPE_MISMATCH, "%s: %s has contraction length %lld, expected %lld", fn, name,
                            (long long)out->K, (long long)K_hint);
    if (group == MXFP8_GROUP_WRAPX && out->K % 128)
        return mxfp8i_error(MXFP8_ERR_UNSUPPORTED,
                            "%s: quant_scheme wrapX needs the contraction length %% 128 == 0, but %s's is %lld",
                            fn, name, (long long)out->K);
    const mxfp8_tensor *s = &op->scales;
    if (!out->prequant) {
        if (s->data)
            return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT,
                                "%s: %s is high precision (%s) but scales were given", fn, name,
                                mxfp8_dtype_name(v->dtype));
        return MXFP8_OK;
    }
    if (!s->data)
        return mxfp8i_error(MXFP8_ERR_NULL_POINTER, "%s: %s holds FP8 codes but its scales are absent", fn, name);
    if ((unsigned)op->scale_layout > MXFP8_SCALES_SWIZZLE_128X4)
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: %s scale_layout %d is not a mxfp8_scale_layout", fn,
                            name, (int)op->scale_layout);
    char sname[128]; /* messages about the scales view say so ("a scales has ...") */
    snprintf(sname, sizeof sname, "%s scales", name);
    if ((st = mxfp8i_check_view(fn, sname, s))) return st;
    if ((st = mxfp8i_check_dtype(fn, sname, s, 2, MXFP8_DTYPE_E8M0, MXFP8_DTYPE_U8))) return st;
    int64_t shp[2];
    layout_shape(op->scale_layout, out->R, out->K, shp);
    out->scales = (const uint8_t *)s->data;
    out->layout = op->scale_layout;
    if (op->scale_layout == MXFP8_SCALES_SWIZZLE_128X4 && s->ndim == 1) {
        if (s->shape[0] != shp[0] * shp[1])
            return mxfp8i_error(MXFP8_ERR_SHAPE_MISMATCH, "%s: %s scales (128x4 swizzle) have %lld elements, want %lld",
                                fn, name, (long long)s->shape[0], (long long)(shp[0] * shp[1]));
        out->ss0 = shp[1] * s->strides[0];
        out->ss1 = s->strides[0];
        return MXFP8_OK;
    }
    char sb[160];
    if (s->ndim != 2 || s->shape[0] != shp[0] || s->shape[1] != shp[1])
        return mxfp8i_error(MXFP8_ERR_SHAPE_MISMATCH,
                            "%s: %s scales must have shape [%lld, %lld] for layout %s (R = %lld, K = %lld), got %s",
                            fn, name, (long long)shp[0], (long long)shp[1], mxfp8i_layout_name(op->scale_layout),
                            (long long)out->R, (long long)out->K, mxfp8i_shape_str(s, sb, sizeof sb));
    out->ss0 = s->strides[0];
    out->ss1 = s->strides[1];
    return MXFP8_OK;
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

/* Member list of compact group g: idx[0..n). Members are given in ascending k. */

void mxfp8i_gop_deq_row(const mxfp8i_gop *op, int64_t r, mxfp8_format fmt, mxfp8_scale_rule rule,
                        mxfp8_group_scheme group, float *out, float *tmp) {
    int64_t K = op->K, G = mxfp8i_ceil_div(K, 32);
    if (!op->prequant) {
        load_row_hp(op, r, tmp);
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

void mxfp8i_gop_load_row(const mxfp8i_gop *op, int64_t r, mxfp8_format fmt, mxfp8_group_scheme group, float *out) {
    if (!op->prequant) load_row_hp(op, r, out);
    else mxfp8i_gop_deq_row(op, r, fmt, MXFP8_SCALE_NKI, group, out, NULL);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* the fused pack: quantize (or read codes) -> dequantize exactly -> panel[k*W + i]                            */
/* ---------------------------------------------------------------------------------------------------------- */
void mxfp8i_gop_pack_panel(const mxfp8i_gop *op, mxfp8_format fmt, mxfp8_scale_rule rule, mxfp8_group_scheme group,
                           int64_t r0, int W, float *panel, float *scratch, uint8_t *sbuf, float *tmp) {
    int64_t K = op->K, G = mxfp8i_ceil_div(K, 32);
    int rows = (int)(op->R - r0 < W ? op->R - r0 : W);
    if (rows < 0) rows = 0;
    size_t es = mxfp8_dtype_size(op->dtype);
    int done = 0;
    if (rows > 0 && !op->swizzled) {
        const char *base = op->data + (r0 * op->s0) * (int64_t)es;
        if (!op->prequant && op->s0 == 1 && op->s1 > 0) {
            /* [K, R]-contiguous operand (a transposed view): quantize down the columns straight into the panel. */
            mxfp8i_qpanel p = {base, op->dtype, rows, K, 1, op->s1, fmt, rule, group, panel, MXFP8_DTYPE_F32, 1, W,
                               NULL, 0, 0};
            mxfp8i_quantize_panel(&p);
            done = 1;
        } else if (!op->prequant && op->s1 == 1) {
            mxfp8i_qpanel p = {base, op->dtype, rows, K, op->s0, 1, fmt, rule, group, scratch, MXFP8_DTYPE_F32, K, 1,
                               NULL, 0, 0};
            mxfp8i_quantize_panel(&p);
            done = 2;
        } else if (op->prequant && (op->s1 == 1 || (op->s0 == 1 && !op->x4))) {
            /* codes: contiguous along K (x4 words are little-endian bytes in element order), or down the columns */
            for (int i = 0; i < rows; i++)
                for (int64_t g = 0; g < G; g++) sbuf[i * G + g] = scale_at(op, r0 + i, g);
            int64_t cls = op->x4 ? op->s0 * 4 : op->s0;
            const uint8_t *cb = (const uint8_t *)op->data + r0 * cls;
            if (op->s1 == 1) {
                mxfp8i_dqpanel p = {cb, fmt, rows, K, cls, 1, sbuf, G, 1, group, scratch, MXFP8_DTYPE_F32, K, 1};
                mxfp8i_dequantize_panel(&p);
                done = 2;
            } else {
                for (int i = 0; i < rows; i++)
                    for (int64_t g = 0; g < G; g++) sbuf[g * rows + i] = scale_at(op, r0 + i, g);
                mxfp8i_dqpanel p = {cb, fmt, rows, K, 1, op->s1, sbuf, 1, rows, group, panel, MXFP8_DTYPE_F32, 1, W};
                mxfp8i_dequantize_panel(&p);
                done = 1;
            }
        }
    }
    if (!done) {
        for (int i = 0; i < rows; i++) {
            mxfp8i_gop_deq_row(op, r0 + i, fmt, rule, group, scratch + (int64_t)i * K, tmp);
        }
        done = 2;
    }
    if (done == 2) {
        for (int64_t k0 = 0; k0 < K; k0 += 64) {
            int64_t k1 = k0 + 64 < K ? k0 + 64 : K;
            for (int i = 0; i < rows; i++) {
                const float *src = scratch + (int64_t)i * K;
                for (int64_t k = k0; k < k1; k++) panel[k * W + i] = src[k];
            }
        }
    }
    if (rows < W)
        for (int64_t k = 0; k < K; k++)
            for (int i = rows; i < W; i++) panel[k * W + i] = 0.0f;
}

/* out[i*K + k] = t[k*rows + i] */
static void transpose_to_rows(const float *t, int rows, int64_t K, float *out) {
    for (int64_t k0 = 0; k0 < K; k0 += 64) {
        int64_t k1 = k0 + 64 < K ? k0 + 64 : K;
        for (int i = 0; i < rows; i++)
            for (int64_t k = k0; k < k1; k++) out[i * K + k] = t[k * rows + i];
    }
}

void mxfp8i_gop_rows_f32(const mxfp8i_gop *op, mxfp8_format fmt, mxfp8_scale_rule rule, mxfp8_group_scheme group,
                         int64_t r0, int rows, float *out, uint8_t *sbuf, float *tmp, float *t2) {
    int64_t K = op->K, G = mxfp8i_ceil_div(K, 32);
    if (rows <= 0) return;
    size_t es = mxfp8_dtype_size(op->dtype);
    if (!op->swizzled && !op->prequant) {
        const char *base = op->data + (r0 * op->s0) * (int64_t)es;
        if (op->s0 == 1 && op->s1 > 0 && t2) {
            /* [K, R]-contiguous (a transposed view): quantize down the columns into t2 [K, rows], then transpose */
            mxfp8i_qpanel p = {base, op->dtype, rows, K, 1, op->s1, fmt, rule, group, t2, MXFP8_DTYPE_F32, 1, rows,
                               NULL, 0, 0};
            mxfp8i_quantize_panel(&p);
            transpose_to_rows(t2, rows, K, out);
            return;
        }
        mxfp8i_qpanel p = {base, op->dtype, rows, K, op->s0, op->s1, fmt, rule, group, out, MXFP8_DTYPE_F32, K, 1,
                           NULL, 0, 0};
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
    for (int i = 0; i < rows; i++) mxfp8i_gop_deq_row(op, r0 + i, fmt, rule, group, out + (int64_t)i * K, tmp);
}
