/*
 * tensor.h -- tensor views inside libmxfp8: the validation helpers every public entry uses (tensor.c), element
 * access with the inline codecs, and checked size arithmetic (internal).
 */
#ifndef MXFP8_RUNTIME_TENSOR_H
#define MXFP8_RUNTIME_TENSOR_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "../format/codec.h"
#include "error.h"

/** Validate a view: data non-NULL, 0 <= ndim <= MXFP8_MAX_DIMS, shape >= 0, numel and the addressed byte span
 *  do not overflow. `fn`/`name` are used in the message ("mxfp8_quantize: src ..."). */
mxfp8_status mxfp8i_check_view(const char *fn, const char *name, const mxfp8_tensor *t);
/** As mxfp8i_check_view plus: ndim == `ndim` (if ndim >= 0). */
mxfp8_status mxfp8i_check_rank(const char *fn, const char *name, const mxfp8_tensor *t, int ndim);
/** dtype must be one of the `n` listed. */
mxfp8_status mxfp8i_check_dtype(const char *fn, const char *name, const mxfp8_tensor *t, int n, ...);
/** A layer's given bias "bias": a 1-D F32, BF16 or F16 view of n elements; the length message names n as `n_name`
 *  ("E", "N") and says where it comes from (`n_from`: "weight's rows"). */
mxfp8_status mxfp8i_check_bias(const char *fn, const mxfp8_tensor *bias, int64_t n, const char *n_name,
                               const char *n_from);
/** Shapes must be equal (same ndim, same extents). */
mxfp8_status mxfp8i_check_same_shape(const char *fn, const char *na, const mxfp8_tensor *a, const char *nb,
                                     const mxfp8_tensor *b);
/** Error MXFP8_ERR_ALIASING if the byte ranges addressed by the two views overlap (conservative: uses the span
 *  from the lowest to the highest addressed byte). Absent views (data NULL) never alias. */
mxfp8_status mxfp8i_check_no_alias(const char *fn, const char *na, const mxfp8_tensor *a, const char *nb,
                                   const mxfp8_tensor *b);
/** Error MXFP8_ERR_BAD_STRIDES unless the view's elements are distinct (no zero stride over an extent > 1, no
 *  dimensions that interleave: sorted by |stride|, each stride exceeds the reach of the smaller ones). For output
 *  views, after mxfp8i_check_view. */
mxfp8_status mxfp8i_check_distinct(const char *fn, const char *name, const mxfp8_tensor *t);
/** "[d0, d1, ...]" of a view's shape (all dimensions) into buf; returns buf. For messages. */
const char *mxfp8i_shape_str(const mxfp8_tensor *t, char *buf, size_t size);
/** Byte span [lo, hi) addressed by a view; false if empty. */
bool mxfp8i_view_span(const mxfp8_tensor *t, uintptr_t *lo, uintptr_t *hi);
/** Normalize an axis (negative counts from the end); false if out of range. */
bool mxfp8i_norm_axis(int axis, int ndim, int *out);
/** True when a view is row-major contiguous (dimensions of extent 1 may have any stride). */
bool mxfp8i_is_contiguous(const mxfp8_tensor *t);

/** Element pointer of a view at a multi-index. */
static inline void *mxfp8i_elem_ptr(const mxfp8_tensor *t, const int64_t *idx) {
    int64_t off = 0;
    for (int i = 0; i < t->ndim; i++) off += idx[i] * t->strides[i];
    return (char *)t->data + off * (int64_t)mxfp8_dtype_size(t->dtype);
}
/** Load element `off` (in elements from data) of a F32/BF16/F16/F64 buffer as float (F64 rounded to FP32). */
static inline float mxfp8i_load_f32(const void *data, mxfp8_dtype dt, int64_t off) {
    switch (dt) {
    case MXFP8_DTYPE_F32: return ((const float *)data)[off];
    case MXFP8_DTYPE_BF16: return mxfp8i_bf16_to_fp32(((const uint16_t *)data)[off]);
    case MXFP8_DTYPE_F16: return mxfp8i_fp16_to_fp32(((const uint16_t *)data)[off]);
    case MXFP8_DTYPE_F64: return (float)((const double *)data)[off];
    default: return 0.0f;
    }
}
/** Store a float into element `off` of a F32/BF16/F16/F64 buffer (RNE for the narrow types). */
static inline void mxfp8i_store_f32(void *data, mxfp8_dtype dt, int64_t off, float v) {
    switch (dt) {
    case MXFP8_DTYPE_F32: ((float *)data)[off] = v; break;
    case MXFP8_DTYPE_BF16: ((uint16_t *)data)[off] = mxfp8i_fp32_to_bf16(v); break;
    case MXFP8_DTYPE_F16: ((uint16_t *)data)[off] = mxfp8i_fp32_to_fp16(v); break;
    case MXFP8_DTYPE_F64: ((double *)data)[off] = v; break;
    default: break;
    }
}
static inline bool mxfp8i_is_float_dtype(mxfp8_dtype dt) {
    return dt == MXFP8_DTYPE_F32 || dt == MXFP8_DTYPE_BF16 || dt == MXFP8_DTYPE_F16;
}
static inline bool mxfp8i_is_fp8_dtype(mxfp8_dtype dt) { return dt == MXFP8_DTYPE_E4M3 || dt == MXFP8_DTYPE_E5M2; }
/** Checked multiply of sizes (false on overflow or negative). */
static inline bool mxfp8i_mul_size(int64_t a, int64_t b, int64_t *out) {
    if (a < 0 || b < 0) return false;
    if (a != 0 && b > INT64_MAX / a) return false;
    *out = a * b;
    return true;
}
static inline int64_t mxfp8i_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline int64_t mxfp8i_round_up(int64_t a, int64_t b) { return mxfp8i_ceil_div(a, b) * b; }

#endif /* MXFP8_RUNTIME_TENSOR_H */
