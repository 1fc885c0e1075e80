/*
 * internal.h -- contracts shared inside libmxfp8 (not installed).
 *
 * Error model: a public entry validates everything first (mxfp8i_check_* helpers set the thread-local message and
 * return the status), then computes. Internal helpers called after validation return MXFP8_OK or
 * MXFP8_ERR_OUT_OF_MEMORY only.
 */
#ifndef MXFP8_INTERNAL_H
#define MXFP8_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "mxfp8.h"

#if defined(__GNUC__)
#define MXFP8_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define MXFP8_PRINTF(a, b)
#endif

/* ---- errors (src/runtime/status.c) ---- */
/** Set the calling thread's last error message (printf-style) and return `status`. */
mxfp8_status mxfp8i_error(mxfp8_status status, const char *fmt, ...) MXFP8_PRINTF(2, 3);
/** Clear the calling thread's last error message (called at the start of every public entry). */
void mxfp8i_clear_error(void);

/* ---- tensor views (src/runtime/tensor.c) ---- */
/** Validate a view: data non-NULL, 0 <= ndim <= MXFP8_MAX_DIMS, shape >= 0, numel and the addressed byte span
 *  do not overflow. `fn`/`name` are used in the message ("mxfp8_quantize: src ..."). */
mxfp8_status mxfp8i_check_view(const char *fn, const char *name, const mxfp8_tensor *t);
/** As mxfp8i_check_view plus: ndim == `ndim` (if ndim >= 0). */
mxfp8_status mxfp8i_check_rank(const char *fn, const char *name, const mxfp8_tensor *t, int ndim);
/** dtype must be one of the `n` listed. */
mxfp8_status mxfp8i_check_dtype(const char *fn, const char *name, const mxfp8_tensor *t, int n, ...);
/** Shapes must be equal (same ndim, same extents). */
mxfp8_status mxfp8i_check_same_shape(const char *fn, const char *na, const mxfp8_tensor *a, const char *nb,
                                     const mxfp8_tensor *b);
/** Error MXFP8_ERR_ALIASING if the byte ranges addressed by the two views overlap (conservative: uses the span
 *  from the lowest to the highest addressed byte). Absent views (data NULL) never alias. */
mxfp8_status mxfp8i_check_no_alias(const char *fn, const char *na, const mxfp8_tensor *a, const char *nb,
                                   const mxfp8_tensor *b);
/** Byte span [lo, hi) addressed by a view; false if empty. */
bool mxfp8i_view_span(const mxfp8_tensor *t, uintptr_t *lo, uintptr_t *hi);
/** Normalize an axis (negative counts from the end); false if out of range. */
bool mxfp8i_norm_axis(int axis, int ndim, int *out);
/** Element pointer of a view at a multi-index. */
static inline void *mxfp8i_elem_ptr(const mxfp8_tensor *t, const int64_t *idx) {
    int64_t off = 0;
    for (int i = 0; i < t->ndim; i++) off += idx[i] * t->strides[i];
    return (char *)t->data + off * (int64_t)mxfp8_dtype_size(t->dtype);
}
/** Load element `off` (in elements from data) of a F32/BF16/F16/F64 view as float. */
static inline float mxfp8i_load_f32(const void *data, mxfp8_dtype dt, int64_t off) {
    switch (dt) {
    case MXFP8_DTYPE_F32: return ((const float *)data)[off];
    case MXFP8_DTYPE_BF16: return mxfp8_bf16_to_fp32(((const uint16_t *)data)[off]);
    case MXFP8_DTYPE_F16: return mxfp8_fp16_to_fp32(((const uint16_t *)data)[off]);
    case MXFP8_DTYPE_F64: return (float)((const double *)data)[off];
    default: return 0.0f;
    }
}
/** Store a float into element `off` of a F32/BF16/F16/F64 view (RNE for the narrow types). */
static inline void mxfp8i_store_f32(void *data, mxfp8_dtype dt, int64_t off, float v) {
    switch (dt) {
    case MXFP8_DTYPE_F32: ((float *)data)[off] = v; break;
    case MXFP8_DTYPE_BF16: ((uint16_t *)data)[off] = mxfp8_fp32_to_bf16(v); break;
    case MXFP8_DTYPE_F16: ((uint16_t *)data)[off] = mxfp8_fp32_to_fp16(v); break;
    case MXFP8_DTYPE_F64: ((double *)data)[off] = v; break;
    default: break;
    }
}
static inline bool mxfp8i_is_float_dtype(mxfp8_dtype dt) {
    return dt == MXFP8_DTYPE_F32 || dt == MXFP8_DTYPE_BF16 || dt == MXFP8_DTYPE_F16;
}
static inline bool mxfp8i_is_fp8_dtype(mxfp8_dtype dt) { return dt == MXFP8_DTYPE_E4M3 || dt == MXFP8_DTYPE_E5M2; }
static inline mxfp8_dtype mxfp8i_fmt_dtype(mxfp8_format f) {
    return f == MXFP8_FMT_E5M2 ? MXFP8_DTYPE_E5M2 : MXFP8_DTYPE_E4M3;
}
/** Checked multiply of sizes (false on overflow or negative). */
static inline bool mxfp8i_mul_size(int64_t a, int64_t b, int64_t *out) {
    if (a < 0 || b < 0) return false;
    if (a != 0 && b > INT64_MAX / a) return false;
    *out = a * b;
    return true;
}
static inline int64_t mxfp8i_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* ---- runtime (src/runtime/cpu.c) ---- */
/** The ISA in use (decided once, thread-safely, from CPUID, AMX permission and MXFP8_ISA). */
mxfp8_isa mxfp8i_isa(void);
/** True if AVX-512F+BW are usable for quantization/dequantization (isa >= AVX512). */
bool mxfp8i_use_avx512(void);
/** True if the CPU has AVX512-BF16 and isa >= AVX512. */
bool mxfp8i_use_avx512_bf16(void);
/** Threads a call may use (MXFP8_NUM_THREADS, else OMP_NUM_THREADS, else omp_get_max_threads()). >= 1. */
int mxfp8i_num_threads(void);

/* ---- format (src/format/) ---- */
/** Format constants. */
typedef struct mxfp8i_fmt_info {
    int emax;            /**< exponent of the largest normal: 8 (E4M3), 15 (E5M2) */
    float max_normal;    /**< 448, 57344 */
    uint8_t nan_code;    /**< positive canonical NaN: 0x7F, 0x7E */
} mxfp8i_fmt_info;
static inline mxfp8i_fmt_info mxfp8i_fmt(mxfp8_format f) {
    mxfp8i_fmt_info e4 = {8, 448.0f, 0x7F}, e5 = {15, 57344.0f, 0x7E};
    return f == MXFP8_FMT_E5M2 ? e5 : e4;
}

/* ---- quantization kernels (src/quant/) ----
 * One group = up to 32 values (n <= 32; missing values are zero padding that never enters amax).
 * mxfp8i_quantize_group_ref: the executable specification of mxfp8_quantize for one group. Writes n codes and
 * returns the E8M0 code. Exact to the bit; every SIMD path must agree with it.
 * mxfp8i_qdq_group_ref: quantize then dequantize exactly into FP32 (used by GEMM packing and golden references):
 * out[i] = fp8(code[i]) * 2^(scale-127); NaN for scale 255. */
uint8_t mxfp8i_quantize_group_ref(const float *x, int n, mxfp8_format fmt, mxfp8_scale_rule rule, uint8_t *codes);
void mxfp8i_dequantize_group_ref(const uint8_t *codes, int n, uint8_t scale, mxfp8_format fmt, float *out);
uint8_t mxfp8i_qdq_group_ref(const float *x, int n, mxfp8_format fmt, mxfp8_scale_rule rule, float *out);

#endif /* MXFP8_INTERNAL_H */
