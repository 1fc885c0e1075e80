/*
 * layouts.c -- E8M0 scale layouts, x4 packing of FP8 codes, and NKI's swizzle of a [K, F] operand.
 *
 * Contract (include/mxfp8.h, "Scale layouts, x4 packing, NKI swizzle"): an operand of F non-contracted rows and K
 * contraction indices has G = ceil(K/32) groups per row. Positions of scale (f, g):
 *   COMPACT        [F, G]                      (f, g)
 *   NKI_UNPACKED   [ceil(G/4)*32, F]           ((g/4)*32 + g%4, f)                               [NKI-Q]
 *   NKI_PACKED     [ceil(K/2048)*128, F]       ((g/64)*128 + ((g%64)/16)*4 + ((g%16)/4)*32 + g%4, f)
 *   SWIZZLE_128X4  [R', C'] (or flat [R'*C'])  flat off = ((f/128)*(C'/4) + g/4)*512 + (f%32)*16 +
 *                                              ((f%128)/32)*4 + g%4, R' = F up to 128, C' = G up to 4 (cuBLAS)
 * Positions that hold no scale are written 0 by mxfp8_scales_to_layout. These are plain copies (no arithmetic);
 * speed is not a concern here (scales are 1/32 of the data).
 */
#include "../runtime/tensor.h"
#include "../format/groups.h"
#include "layout.h"

/* ceil(a/b) for 0 <= a (no overflow near INT64_MAX) */
static int64_t cdiv(int64_t a, int64_t b) { return mxfp8i_layout_cdiv(a, b); }

mxfp8_status mxfp8_scale_layout_shape(mxfp8_scale_layout layout, int64_t F, int64_t K, int64_t shape[2]) {
    static const char *fn = "mxfp8_scale_layout_shape";
    mxfp8i_clear_error();
    MXFP8I_RETURN_ERROR_IF(!shape, MXFP8_ERR_NULL_POINTER, "%s: shape is NULL", fn);
    MXFP8I_RETURN_ERROR_IF(!mxfp8i_layout_known(layout), MXFP8_ERR_INVALID_ARGUMENT,
                           "%s: layout %d is not a mxfp8_scale_layout", fn, (int)layout);
    MXFP8I_RETURN_ERROR_IF(F < 0 || K < 0, MXFP8_ERR_SIZE_OVERFLOW, "%s: F %lld and K %lld must be >= 0", fn,
                           (long long)F, (long long)K);
    int64_t s[2];
    MXFP8I_RETURN_ERROR_IF(!mxfp8i_layout_shape(layout, F, K, s), MXFP8_ERR_SIZE_OVERFLOW,
                           "%s: the layout's size overflows for F %lld, K %lld", fn, (long long)F, (long long)K);
    shape[0] = s[0];
    shape[1] = s[1];
    return MXFP8_OK;
}

/* Element offset (in elements, with the view's strides) of scale (f, g) in a validated layout view (the 128x4
 * swizzle may be the flat 1-D view). Cp: columns of the layout's 2-D shape. */
static int64_t layout_offset(const mxfp8_tensor *t, mxfp8_scale_layout layout, int64_t f, int64_t g, int64_t Cp) {
    int64_t r, c;
    mxfp8i_layout_pos(layout, f, g, Cp, &r, &c);
    if (t->ndim == 1) return (r * Cp + c) * t->strides[0];
    return r * t->strides[0] + c * t->strides[1];
}

/* Validate a layout view `t` (name) for (F, K): dtype E8M0/U8, shape = the layout's (swizzle: also flat 1-D). */
static mxfp8_status check_layout_view(const char *fn, const char *name, const mxfp8_tensor *t,
                                      mxfp8_scale_layout layout, int64_t F, int64_t K, int64_t shape[2]) {
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_view(fn, name, t));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_dtype(fn, name, t, 2, MXFP8_DTYPE_E8M0, MXFP8_DTYPE_U8));
    MXFP8I_RETURN_ERROR_IF(!mxfp8i_layout_shape(layout, F, K, shape), MXFP8_ERR_SIZE_OVERFLOW,
                           "%s: the layout's size overflows for F %lld, K %lld", fn, (long long)F, (long long)K);
    bool ok = t->ndim == 2 && t->shape[0] == shape[0] && t->shape[1] == shape[1];
    if (layout == MXFP8_SCALES_SWIZZLE_128X4 && t->ndim == 1) ok = t->shape[0] == shape[0] * shape[1];
    char sb[160];
    MXFP8I_RETURN_ERROR_IF(!ok, MXFP8_ERR_SHAPE_MISMATCH,
                           "%s: %s must have shape [%lld, %lld] for layout %s, F %lld, K %lld; got %s", fn, name,
                           (long long)shape[0], (long long)shape[1], mxfp8i_layout_name(layout), (long long)F,
                           (long long)K, mxfp8i_shape_str(t, sb, sizeof sb));
    return MXFP8_OK;
}

static mxfp8_status check_compact(const char *fn, const mxfp8_tensor *c, int64_t K) {
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_rank(fn, "compact", c, 2));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_dtype(fn, "compact", c, 2, MXFP8_DTYPE_E8M0, MXFP8_DTYPE_U8));
    MXFP8I_RETURN_ERROR_IF(K < 0, MXFP8_ERR_SIZE_OVERFLOW, "%s: K %lld is negative", fn, (long long)K);
    MXFP8I_RETURN_ERROR_IF(c->shape[1] != cdiv(K, 32), MXFP8_ERR_SHAPE_MISMATCH,
                           "%s: compact has %lld columns but K %lld needs ceil(K/32) = %lld", fn,
                           (long long)c->shape[1], (long long)K, (long long)cdiv(K, 32));
    return MXFP8_OK;
}

mxfp8_status mxfp8_scales_to_layout(const mxfp8_tensor *compact, int64_t K, mxfp8_scale_layout layout,
                                    mxfp8_tensor *out) {
    static const char *fn = "mxfp8_scales_to_layout";
    mxfp8i_clear_error();
    MXFP8I_FORWARD_IF_ERROR(check_compact(fn, compact, K));
    MXFP8I_RETURN_ERROR_IF(!mxfp8i_layout_known(layout), MXFP8_ERR_INVALID_ARGUMENT,
                           "%s: layout %d is not a mxfp8_scale_layout", fn, (int)layout);
    int64_t F = compact->shape[0], G = compact->shape[1], sh[2];
    MXFP8I_FORWARD_IF_ERROR(check_layout_view(fn, "out", out, layout, F, K, sh));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_distinct(fn, "out", out));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_no_alias(fn, "out", out, "compact", compact));
    uint8_t *o = (uint8_t *)out->data;
    const uint8_t *c = (const uint8_t *)compact->data;
    if (out->ndim == 1) {
        for (int64_t i = 0; i < sh[0] * sh[1]; i++) o[i * out->strides[0]] = 0;
    } else {
        for (int64_t r = 0; r < sh[0]; r++)
            for (int64_t j = 0; j < sh[1]; j++) o[r * out->strides[0] + j * out->strides[1]] = 0;
    }
    for (int64_t f = 0; f < F; f++)
        for (int64_t g = 0; g < G; g++)
            o[layout_offset(out, layout, f, g, sh[1])] = c[f * compact->strides[0] + g * compact->strides[1]];
    return MXFP8_OK;
}

mxfp8_status mxfp8_scales_from_layout(const mxfp8_tensor *in, int64_t K, mxfp8_scale_layout layout,
                                      mxfp8_tensor *compact) {
    static const char *fn = "mxfp8_scales_from_layout";
    mxfp8i_clear_error();
    MXFP8I_FORWARD_IF_ERROR(check_compact(fn, compact, K));
    MXFP8I_RETURN_ERROR_IF(!mxfp8i_layout_known(layout), MXFP8_ERR_INVALID_ARGUMENT,
                           "%s: layout %d is not a mxfp8_scale_layout", fn, (int)layout);
    int64_t F = compact->shape[0], G = compact->shape[1], sh[2];
    MXFP8I_FORWARD_IF_ERROR(check_layout_view(fn, "in", in, layout, F, K, sh));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_distinct(fn, "compact", compact));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_no_alias(fn, "compact", compact, "in", in));
    uint8_t *c = (uint8_t *)compact->data;
    const uint8_t *i8 = (const uint8_t *)in->data;
    for (int64_t f = 0; f < F; f++)
        for (int64_t g = 0; g < G; g++)
            c[f * compact->strides[0] + g * compact->strides[1]] = i8[layout_offset(in, layout, f, g, sh[1])];
    return MXFP8_OK;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* x4 packing                                                                                                 */
/* ---------------------------------------------------------------------------------------------------------- */
/* Advance the multi-index `idx` over every dimension except `skip`; false when done. */
static bool odometer_next(int64_t *idx, const int64_t *shape, int ndim, int skip) {
    for (int i = ndim - 1; i >= 0; i--) {
        if (i == skip) continue;
        if (++idx[i] < shape[i]) return true;
        idx[i] = 0;
    }
    return false;
}

/* Common checks: `bytes` (E4M3/E5M2/U8, L along the axis) and `words` (U32, ceil(L/4) along it, rest equal). */
static mxfp8_status check_x4(const char *fn, const char *nb, const mxfp8_tensor *bytes, const char *nw,
                             const mxfp8_tensor *words, int axis, int *ax) {
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_view(fn, nb, bytes));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_view(fn, nw, words));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_dtype(fn, nb, bytes, 3, MXFP8_DTYPE_E4M3, MXFP8_DTYPE_E5M2, MXFP8_DTYPE_U8));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_dtype(fn, nw, words, 1, MXFP8_DTYPE_U32));
    MXFP8I_RETURN_ERROR_IF(bytes->ndim < 1, MXFP8_ERR_SHAPE_MISMATCH, "%s: %s must have rank >= 1", fn, nb);
    MXFP8I_RETURN_ERROR_IF(!mxfp8i_norm_axis(axis, bytes->ndim, ax), MXFP8_ERR_INVALID_ARGUMENT,
                           "%s: axis %d is out of range for a %d-D tensor", fn, axis, (int)bytes->ndim);
    bool ok = words->ndim == bytes->ndim;
    for (int i = 0; ok && i < bytes->ndim; i++)
        ok = words->shape[i] == (i == *ax ? mxfp8i_ceil_div(bytes->shape[i], 4) : bytes->shape[i]);
    MXFP8I_RETURN_ERROR_IF(!ok, MXFP8_ERR_SHAPE_MISMATCH, "%s: %s must have %s's shape with shape[%d] = ceil(%lld/4)",
                           fn, nw, nb, *ax, (long long)bytes->shape[*ax]);
    /* the output ("out") must address distinct elements */
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_distinct(fn, "out", strcmp(nw, "out") == 0 ? words : bytes));
    return mxfp8i_check_no_alias(fn, nw, words, nb, bytes);
}

mxfp8_status mxfp8_pack_x4(const mxfp8_tensor *in, int axis, mxfp8_tensor *out) {
    static const char *fn = "mxfp8_pack_x4";
    mxfp8i_clear_error();
    int ax;
    MXFP8I_FORWARD_IF_ERROR(check_x4(fn, "in", in, "out", out, axis, &ax));
    if (mxfp8_tensor_numel(out) == 0) return MXFP8_OK;
    int64_t idx[MXFP8_MAX_DIMS] = {0}, L = in->shape[ax], W = out->shape[ax];
    const uint8_t *src = (const uint8_t *)in->data;
    uint32_t *dst = (uint32_t *)out->data;
    do {
        int64_t bi = 0, bo = 0;
        for (int i = 0; i < in->ndim; i++) {
            bi += idx[i] * in->strides[i];
            bo += idx[i] * out->strides[i];
        }
        for (int64_t p = 0; p < W; p++) {
            uint32_t w = 0;
            for (int c = 0; c < 4 && 4 * p + c < L; c++)
                w |= (uint32_t)src[bi + (4 * p + c) * in->strides[ax]] << (8 * c);
            dst[bo + p * out->strides[ax]] = w;
        }
    } while (odometer_next(idx, in->shape, in->ndim, ax));
    return MXFP8_OK;
}

mxfp8_status mxfp8_unpack_x4(const mxfp8_tensor *in, int axis, mxfp8_tensor *out) {
    static const char *fn = "mxfp8_unpack_x4";
    mxfp8i_clear_error();
    int ax;
    MXFP8I_FORWARD_IF_ERROR(check_x4(fn, "out", out, "in", in, axis, &ax));
    if (mxfp8_tensor_numel(out) == 0) return MXFP8_OK;
    int64_t idx[MXFP8_MAX_DIMS] = {0}, L = out->shape[ax];
    const uint32_t *src = (const uint32_t *)in->data;
    uint8_t *dst = (uint8_t *)out->data;
    do {
        int64_t bi = 0, bo = 0;
        for (int i = 0; i < out->ndim; i++) {
            bi += idx[i] * in->strides[i];
            bo += idx[i] * out->strides[i];
        }
        for (int64_t k = 0; k < L; k++)
            dst[bo + k * out->strides[ax]] = (uint8_t)(src[bi + (k / 4) * in->strides[ax]] >> (8 * (k % 4)));
    } while (odometer_next(idx, out->shape, out->ndim, ax));
    return MXFP8_OK;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* NKI swizzle: [K, F] <-> [K/4, 4F]; for the (sub)tile at k0 of size P, S = P/4:                              */
/* swz[k0/4 + p, 4f + s] = in[k0 + s*S + p, f]                                                                */
/* ---------------------------------------------------------------------------------------------------------- */
static mxfp8_status check_swizzle(const char *fn, const mxfp8_tensor *plain, const char *np, const mxfp8_tensor *swz,
                                  const char *ns, bool plain_is_input) {
    const mxfp8_tensor *first = plain_is_input ? plain : swz;
    const char *nf = plain_is_input ? np : ns;
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_rank(fn, nf, first, 2));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_rank(fn, plain_is_input ? ns : np, plain_is_input ? swz : plain, 2));
    MXFP8I_RETURN_ERROR_IF(plain->dtype != swz->dtype, MXFP8_ERR_DTYPE, "%s: in has dtype %s but out has %s", fn,
                           mxfp8_dtype_name(plain_is_input ? plain->dtype : swz->dtype),
                           mxfp8_dtype_name(plain_is_input ? swz->dtype : plain->dtype));
    int64_t K = plain_is_input ? plain->shape[0] : 4 * swz->shape[0];
    MXFP8I_RETURN_ERROR_IF(!plain_is_input && swz->shape[1] % 4 != 0, MXFP8_ERR_SHAPE_MISMATCH,
                           "%s: in has %lld columns, not a multiple of 4", fn, (long long)swz->shape[1]);
    MXFP8I_RETURN_ERROR_IF(K % 128 != 0, MXFP8_ERR_UNSUPPORTED, "%s: in: the NKI swizzle needs K %% 128 == 0; K = %lld",
                           fn, (long long)K);
    int64_t F = plain_is_input ? plain->shape[1] : swz->shape[1] / 4;
    MXFP8I_RETURN_ERROR_IF(
        plain->shape[0] != K || plain->shape[1] != F || swz->shape[0] != K / 4 || swz->shape[1] != 4 * F,
        MXFP8_ERR_SHAPE_MISMATCH,
        "%s: out has shape [%lld, %lld] for in [%lld, %lld]; shapes must be [K, F] = [%lld, %lld] "
        "and [K/4, 4F] = [%lld, %lld]",
        fn, (long long)(plain_is_input ? swz : plain)->shape[0], (long long)(plain_is_input ? swz : plain)->shape[1],
        (long long)(plain_is_input ? plain : swz)->shape[0], (long long)(plain_is_input ? plain : swz)->shape[1],
        (long long)K, (long long)F, (long long)(K / 4), (long long)(4 * F));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_distinct(fn, "out", plain_is_input ? swz : plain));
    return mxfp8i_check_no_alias(fn, "out", plain_is_input ? swz : plain, "in", plain_is_input ? plain : swz);
}

static void swizzle_copy(const mxfp8_tensor *plain, const mxfp8_tensor *swz, bool to_swz) {
    int64_t K = plain->shape[0], F = plain->shape[1], es = (int64_t)mxfp8_dtype_size(plain->dtype);
    char *pb = (char *)plain->data, *sb = (char *)swz->data;
    for (int64_t k0 = 0, P; k0 < K; k0 += P) {
        int64_t t0;
        mxfp8i_wrapx_tile_of(K, k0, &t0, &P);
        int64_t S = P / 4;
        for (int64_t s = 0; s < 4; s++)
            for (int64_t p = 0; p < S; p++)
                for (int64_t f = 0; f < F; f++) {
                    char *a = pb + ((k0 + s * S + p) * plain->strides[0] + f * plain->strides[1]) * es;
                    char *b = sb + ((k0 / 4 + p) * swz->strides[0] + (4 * f + s) * swz->strides[1]) * es;
                    if (to_swz) memcpy(b, a, (size_t)es);
                    else memcpy(a, b, (size_t)es);
                }
    }
}

mxfp8_status mxfp8_swizzle_nki(const mxfp8_tensor *in, mxfp8_tensor *out) {
    static const char *fn = "mxfp8_swizzle_nki";
    mxfp8i_clear_error();
    MXFP8I_FORWARD_IF_ERROR(check_swizzle(fn, in, "in", out, "out", true));
    swizzle_copy(in, out, true);
    return MXFP8_OK;
}

mxfp8_status mxfp8_unswizzle_nki(const mxfp8_tensor *in, mxfp8_tensor *out) {
    static const char *fn = "mxfp8_unswizzle_nki";
    mxfp8i_clear_error();
    MXFP8I_FORWARD_IF_ERROR(check_swizzle(fn, out, "out", in, "in", false));
    swizzle_copy(out, in, false);
    return MXFP8_OK;
}
