/* tensor.c -- tensor views: construction and the validation helpers every public entry uses. */
#include <stdarg.h>
#include <stdio.h>

#include "tensor.h"

size_t mxfp8_dtype_size(mxfp8_dtype dtype) {
    switch (dtype) {
    case MXFP8_DTYPE_F32:
    case MXFP8_DTYPE_I32:
    case MXFP8_DTYPE_U32: return 4;
    case MXFP8_DTYPE_BF16:
    case MXFP8_DTYPE_F16: return 2;
    case MXFP8_DTYPE_E4M3:
    case MXFP8_DTYPE_E5M2:
    case MXFP8_DTYPE_E8M0:
    case MXFP8_DTYPE_U8: return 1;
    case MXFP8_DTYPE_F64: return 8;
    }
    return 0;
}

const char *mxfp8_dtype_name(mxfp8_dtype dtype) {
    const char *name = mxfp8_enum_name(MXFP8_ENUM_DTYPE, (int32_t)dtype);
    return name ? name : "?";
}

mxfp8_tensor mxfp8_tensor_make(void *data, mxfp8_dtype dtype, int32_t ndim, const int64_t *shape) {
    mxfp8_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    /* an ndim outside 0..MXFP8_MAX_DIMS is kept as given (no extent is read), so that the call that uses the view
     * fails with INVALID_ARGUMENT: clamping it would make a different, smaller view, and a call on it could succeed
     * and write only part of the caller's tensor */
    t.ndim = ndim;
    if (ndim < 0 || ndim > MXFP8_MAX_DIMS) return t;
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t.shape[i] = shape ? shape[i] : 0;
        t.strides[i] = stride;
        if (t.shape[i] > 0 && stride <= INT64_MAX / t.shape[i]) stride *= t.shape[i];
    }
    return t;
}

int64_t mxfp8_tensor_numel(const mxfp8_tensor *t) {
    if (!t || t->ndim < 0 || t->ndim > MXFP8_MAX_DIMS) return -1;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        if (!mxfp8i_mul_size(n, t->shape[i], &n)) return -1;
    return n;
}

bool mxfp8i_norm_axis(int axis, int ndim, int *out) {
    if (axis < 0) axis += ndim;
    if (axis < 0 || axis >= ndim) return false;
    *out = axis;
    return true;
}

bool mxfp8i_view_span(const mxfp8_tensor *t, uintptr_t *lo, uintptr_t *hi) {
    if (!t->data) return false;
    int64_t mn = 0, mx = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0) return false;
        int64_t ext = (t->shape[i] - 1) * t->strides[i];
        if (ext < 0) mn += ext;
        else mx += ext;
    }
    int64_t es = (int64_t)mxfp8_dtype_size(t->dtype);
    *lo = (uintptr_t)t->data + (intptr_t)(mn * es);
    *hi = (uintptr_t)t->data + (intptr_t)((mx + 1) * es);
    return true;
}

mxfp8_status mxfp8i_check_view(const char *fn, const char *name, const mxfp8_tensor *t) {
    MXFP8I_RETURN_ERROR_IF(!t, MXFP8_ERR_NULL_POINTER, "%s: %s is NULL", fn, name);
    MXFP8I_RETURN_ERROR_IF(t->ndim < 0 || t->ndim > MXFP8_MAX_DIMS, MXFP8_ERR_INVALID_ARGUMENT,
                           "%s: %s has ndim %d (must be 0..%d)", fn, name, (int)t->ndim, MXFP8_MAX_DIMS);
    MXFP8I_RETURN_ERROR_IF(mxfp8_dtype_size(t->dtype) == 0, MXFP8_ERR_DTYPE, "%s: %s has unknown dtype %d", fn, name,
                           (int)t->dtype);
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) {
        MXFP8I_RETURN_ERROR_IF(t->shape[i] < 0, MXFP8_ERR_SIZE_OVERFLOW, "%s: %s has negative shape[%d] = %lld", fn,
                               name, i, (long long)t->shape[i]);
        MXFP8I_RETURN_ERROR_IF(!mxfp8i_mul_size(n, t->shape[i], &n), MXFP8_ERR_SIZE_OVERFLOW,
                               "%s: %s: the product of its shape overflows", fn, name);
    }
    /* The addressed span in bytes must not overflow. */
    int64_t es = (int64_t)mxfp8_dtype_size(t->dtype), span = 0;
    if (n > 0) {
        for (int i = 0; i < t->ndim; i++) {
            int64_t s = t->strides[i] < 0 ? -t->strides[i] : t->strides[i], ext;
            MXFP8I_RETURN_ERROR_IF(t->strides[i] == INT64_MIN || !mxfp8i_mul_size(t->shape[i] - 1, s, &ext) ||
                                       span > INT64_MAX - ext,
                                   MXFP8_ERR_BAD_STRIDES, "%s: %s: strides address beyond any buffer", fn, name);
            span += ext;
        }
        MXFP8I_RETURN_ERROR_IF(span == INT64_MAX || !mxfp8i_mul_size(span + 1, es, &span), MXFP8_ERR_BAD_STRIDES,
                               "%s: %s: strides address beyond any buffer", fn, name);
    }
    MXFP8I_RETURN_ERROR_IF(!t->data && n > 0, MXFP8_ERR_NULL_POINTER, "%s: %s.data is NULL", fn, name);
    return MXFP8_OK;
}

mxfp8_status mxfp8i_check_rank(const char *fn, const char *name, const mxfp8_tensor *t, int ndim) {
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_view(fn, name, t));
    MXFP8I_RETURN_ERROR_IF(ndim >= 0 && t->ndim != ndim, MXFP8_ERR_SHAPE_MISMATCH, "%s: %s must be %d-D, got %d-D", fn,
                           name, ndim, (int)t->ndim);
    return MXFP8_OK;
}

mxfp8_status mxfp8i_check_bias(const char *fn, const mxfp8_tensor *bias, int64_t n, const char *n_name,
                               const char *n_from) {
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_rank(fn, "bias", bias, 1));
    MXFP8I_FORWARD_IF_ERROR(
        mxfp8i_check_dtype(fn, "bias", bias, 3, MXFP8_DTYPE_F32, MXFP8_DTYPE_BF16, MXFP8_DTYPE_F16));
    MXFP8I_RETURN_ERROR_IF(bias->shape[0] != n, MXFP8_ERR_SHAPE_MISMATCH,
                           "%s: bias has %lld elements, expected %s = %lld (%s)", fn, (long long)bias->shape[0],
                           n_name, (long long)n, n_from);
    return MXFP8_OK;
}

mxfp8_status mxfp8i_check_dtype(const char *fn, const char *name, const mxfp8_tensor *t, int n, ...) {
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) {
        if ((int)t->dtype == va_arg(ap, int)) {
            va_end(ap);
            return MXFP8_OK;
        }
    }
    va_end(ap);
    return mxfp8i_error(MXFP8_ERR_DTYPE, "%s: %s has dtype %s, which is not accepted here", fn, name,
                        mxfp8_dtype_name(t->dtype));
}

mxfp8_status mxfp8i_check_same_shape(const char *fn, const char *na, const mxfp8_tensor *a, const char *nb,
                                     const mxfp8_tensor *b) {
    bool same = a->ndim == b->ndim;
    for (int i = 0; same && i < a->ndim; i++) same = a->shape[i] == b->shape[i];
    MXFP8I_RETURN_ERROR_IF(!same, MXFP8_ERR_SHAPE_MISMATCH, "%s: %s and %s have different shapes", fn, na, nb);
    return MXFP8_OK;
}

mxfp8_status mxfp8i_check_no_alias(const char *fn, const char *na, const mxfp8_tensor *a, const char *nb,
                                   const mxfp8_tensor *b) {
    uintptr_t alo, ahi, blo, bhi;
    if (!a || !b || !mxfp8i_view_span(a, &alo, &ahi) || !mxfp8i_view_span(b, &blo, &bhi)) return MXFP8_OK;
    MXFP8I_RETURN_ERROR_IF(alo < bhi && blo < ahi, MXFP8_ERR_ALIASING, "%s: %s overlaps %s in memory", fn, na, nb);
    return MXFP8_OK;
}

/* Outputs must address distinct elements, or threads would race on shared bytes and the
 * result would depend on the schedule. Sufficient rule (the usual "nested strides" one): the dimensions with extent
 * > 1, taken by increasing |stride|, each step past everything the smaller ones span. */
mxfp8_status mxfp8i_check_distinct(const char *fn, const char *name, const mxfp8_tensor *t) {
    int64_t st[MXFP8_MAX_DIMS], sh[MXFP8_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < t->ndim && i < MXFP8_MAX_DIMS; i++) {
        if (t->shape[i] == 0) return MXFP8_OK;
        if (t->shape[i] == 1) continue;
        int64_t a = t->strides[i] < 0 ? -t->strides[i] : t->strides[i];
        int j = n++;
        while (j > 0 && st[j - 1] > a) { /* insertion sort by |stride| */
            st[j] = st[j - 1];
            sh[j] = sh[j - 1];
            j--;
        }
        st[j] = a;
        sh[j] = t->shape[i];
    }
    int64_t reach = 0; /* the largest element offset the smaller dimensions reach (they were checked to fit) */
    for (int j = 0; j < n; j++) {
        MXFP8I_RETURN_ERROR_IF(st[j] <= reach, MXFP8_ERR_BAD_STRIDES,
                               "%s: %s has stride %lld, which makes its elements overlap (output views must address "
                               "distinct elements)",
                               fn, name, (long long)st[j]);
        reach += st[j] * (sh[j] - 1); /* no overflow: mxfp8i_check_view bounded the span */
    }
    return MXFP8_OK;
}

const char *mxfp8i_shape_str(const mxfp8_tensor *t, char *buf, size_t size) {
    size_t n = 0;
    if (!size) return buf;
    buf[0] = 0;
    n += (size_t)snprintf(buf + n, size - n, "[");
    for (int i = 0; i < t->ndim && i < MXFP8_MAX_DIMS && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (n < size) snprintf(buf + n, size - n, "]");
    return buf;
}

bool mxfp8i_is_contiguous(const mxfp8_tensor *t) {
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->strides[d] != s) return false;
        s *= t->shape[d];
    }
    return true;
}
