/*
 * operand.c -- validation of a public mxfp8_operand at the edge (mxfp8_gemm, mxfp8_matmul, mxfp8_matmul_backward),
 * flattened into the internal descriptor mxfp8i_gop, with the recipe its caller resolved, that the GEMM driver takes
 * without checking it again.
 * Arrangements of the values and scales: pack.c.
 */
#include <stdio.h>

#include "../quant/layout.h"
#include "../runtime/enums.h"
#include "gemm.h"

/* ---------------------------------------------------------------------------------------------------------- */
/* validation                                                                                                  */
/* ---------------------------------------------------------------------------------------------------------- */
mxfp8_status mxfp8i_gop_from_operand(const char *fn, const char *name, const mxfp8_operand *op, int64_t K_hint,
                                     mxfp8i_recipe rc, mxfp8i_gop *out) {
    MXFP8I_RETURN_ERROR_IF(!op, MXFP8_ERR_NULL_POINTER, "%s: operand %s is NULL", fn, name);
    const mxfp8_tensor *v = &op->values;
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_rank(fn, name, v, 2));
    memset(out, 0, sizeof *out);
    out->data = (const char *)v->data;
    out->dtype = v->dtype;
    out->s0 = v->strides[0];
    out->s1 = v->strides[1];
    out->swizzled = op->swizzled != 0;
    out->rc = rc;
    switch (v->dtype) {
    case MXFP8_DTYPE_F32:
    case MXFP8_DTYPE_BF16:
    case MXFP8_DTYPE_F16: out->prequant = 0; break;
    case MXFP8_DTYPE_E4M3:
    case MXFP8_DTYPE_E5M2:
        MXFP8I_RETURN_ERROR_IF(v->dtype != mxfp8i_fmt_dtype(rc.fmt), MXFP8_ERR_DTYPE,
                               "%s: %s holds %s codes but float8_dtype is %s", fn, name, mxfp8_dtype_name(v->dtype),
                               mxfp8_dtype_name(mxfp8i_fmt_dtype(rc.fmt)));
        out->prequant = 1;
        break;
    case MXFP8_DTYPE_U8: out->prequant = 1; break;
    case MXFP8_DTYPE_U32:
        out->prequant = 1;
        out->x4 = 1;
        break;
    default:
        return mxfp8i_error(MXFP8_ERR_DTYPE, "%s: %s has dtype %s (want %s, %s, %s, %s, %s, %s or %s)", fn, name,
                            mxfp8_dtype_name(v->dtype), mxfp8_dtype_name(MXFP8_DTYPE_F32),
                            mxfp8_dtype_name(MXFP8_DTYPE_BF16), mxfp8_dtype_name(MXFP8_DTYPE_F16),
                            mxfp8_dtype_name(MXFP8_DTYPE_E4M3), mxfp8_dtype_name(MXFP8_DTYPE_E5M2),
                            mxfp8_dtype_name(MXFP8_DTYPE_U8), mxfp8_dtype_name(MXFP8_DTYPE_U32));
    }
    if (out->swizzled) {
        out->K = v->shape[0] * 4;
        if (out->x4) out->R = v->shape[1];
        else {
            MXFP8I_RETURN_ERROR_IF(v->shape[1] % 4, MXFP8_ERR_SHAPE_MISMATCH,
                                   "%s: swizzled %s has %lld columns, not a multiple of 4 ([K/4, 4R] expected)", fn,
                                   name, (long long)v->shape[1]);
            out->R = v->shape[1] / 4;
        }
        MXFP8I_RETURN_ERROR_IF(out->K % 128, MXFP8_ERR_UNSUPPORTED,
                               "%s: swizzled %s needs its contraction length %% 128 == 0, but it is %lld", fn, name,
                               (long long)out->K);
    } else {
        out->R = v->shape[0];
        if (out->x4) {
            if (K_hint >= 0) {
                MXFP8I_RETURN_ERROR_IF(mxfp8i_ceil_div(K_hint, 4) != v->shape[1], MXFP8_ERR_SHAPE_MISMATCH,
                                       "%s: x4-packed %s has %lld words per row, but K = %lld needs %lld", fn, name,
                                       (long long)v->shape[1], (long long)K_hint,
                                       (long long)mxfp8i_ceil_div(K_hint, 4));
                out->K = K_hint;
            } else out->K = v->shape[1] * 4;
        } else out->K = v->shape[1];
    }
    MXFP8I_RETURN_ERROR_IF(K_hint >= 0 && out->K != K_hint, MXFP8_ERR_SHAPE_MISMATCH,
                           "%s: %s has contraction length %lld, expected %lld", fn, name, (long long)out->K,
                           (long long)K_hint);
    MXFP8I_RETURN_ERROR_IF(rc.group == MXFP8_GROUP_WRAPX && out->K % 128, MXFP8_ERR_UNSUPPORTED,
                           "%s: quant_scheme wrapX needs the contraction length %% 128 == 0, but %s's is %lld", fn,
                           name, (long long)out->K);
    const mxfp8_tensor *s = &op->scales;
    if (!out->prequant) {
        MXFP8I_RETURN_ERROR_IF(s->data, MXFP8_ERR_INVALID_ARGUMENT,
                               "%s: %s is high precision (%s) but scales were given", fn, name,
                               mxfp8_dtype_name(v->dtype));
        return MXFP8_OK;
    }
    MXFP8I_RETURN_ERROR_IF(!s->data, MXFP8_ERR_NULL_POINTER, "%s: %s holds FP8 codes but its scales are absent", fn,
                           name);
    char sname[128];
    snprintf(sname, sizeof sname, "%s scale_layout", name);
    MXFP8I_FORWARD_IF_ERROR(
        mxfp8i_check_enum(fn, sname, MXFP8_ENUM_SCALE_LAYOUT,
                          (int)op->scale_layout)); /* messages about the scales view say so ("a scales has ...") */
    snprintf(sname, sizeof sname, "%s scales", name);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_view(fn, sname, s));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_dtype(fn, sname, s, 2, MXFP8_DTYPE_E8M0, MXFP8_DTYPE_U8));
    int64_t shp[2];
    MXFP8I_RETURN_ERROR_IF(!mxfp8i_layout_shape(op->scale_layout, out->R, out->K, shp), MXFP8_ERR_SIZE_OVERFLOW,
                           "%s: %s scales: the layout's size overflows", fn, name);
    out->scols = shp[1];
    out->scales = (const uint8_t *)s->data;
    out->layout = op->scale_layout;
    if (op->scale_layout == MXFP8_SCALES_SWIZZLE_128X4 && s->ndim == 1) {
        MXFP8I_RETURN_ERROR_IF(s->shape[0] != shp[0] * shp[1], MXFP8_ERR_SHAPE_MISMATCH,
                               "%s: %s scales (128x4 swizzle) have %lld elements, want %lld", fn, name,
                               (long long)s->shape[0], (long long)(shp[0] * shp[1]));
        out->ss0 = shp[1] * s->strides[0];
        out->ss1 = s->strides[0];
        return MXFP8_OK;
    }
    char sb[160];
    MXFP8I_RETURN_ERROR_IF(s->ndim != 2 || s->shape[0] != shp[0] || s->shape[1] != shp[1], MXFP8_ERR_SHAPE_MISMATCH,
                           "%s: %s scales must have shape [%lld, %lld] for layout %s (R = %lld, K = %lld), got %s", fn,
                           name, (long long)shp[0], (long long)shp[1], mxfp8i_layout_name(op->scale_layout),
                           (long long)out->R, (long long)out->K, mxfp8i_shape_str(s, sb, sizeof sb));
    out->ss0 = s->strides[0];
    out->ss1 = s->strides[1];
    return MXFP8_OK;
}
