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

#define MXFP8_REFERENCE_API /* goldens and compare (the no-ABI-promise section of mxfp8.h) */
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
/** Error MXFP8_ERR_BAD_STRIDES unless the view's elements are distinct (no zero stride over an extent > 1, no
 *  dimensions that interleave: sorted by |stride|, each stride exceeds the reach of the smaller ones). For output
 *  views, after mxfp8i_check_view. */
mxfp8_status mxfp8i_check_distinct(const char *fn, const char *name, const mxfp8_tensor *t);
/** "[d0, d1, ...]" of a view's shape (all dimensions) into buf; returns buf. For messages. */
const char *mxfp8i_shape_str(const mxfp8_tensor *t, char *buf, size_t size);
/** Name of a scale layout as the Python API spells it ("compact", "nki_unpacked", ...; "unknown" otherwise). */
const char *mxfp8i_layout_name(mxfp8_scale_layout layout);
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
/** MXFP8_NUM_THREADS as the library reads it: 0 if unset/empty, -1 if not a whole positive decimal integer (then
 *  ignored), else the value clamped to MXFP8_MAX_THREADS. */
int mxfp8i_parse_num_threads(const char *s);
/** Threads a call may use (MXFP8_NUM_THREADS, else OMP_NUM_THREADS, else omp_get_max_threads(); clamped to
 *  MXFP8_MAX_THREADS). >= 1. */
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

/* ==== quantization fast paths (owner: quant) ====================================================================
 * src/quant/quantize.c (dispatch + reference panels), src/kernels/avx512/quant_avx512.c (AVX-512 panels).
 * Unchecked internal entries for callers that validated their arguments (mxfp8_quantize, the GEMM packing).
 * All are single-threaded and re-entrant; sizes may be 0; bit-identical to mxfp8i_quantize_group_ref whatever path
 * runs (AVX-512 when mxfp8i_use_avx512(), else the reference). They run under IEEE MXCSR defaults (no FTZ/DAZ,
 * round to nearest) whatever the calling thread has set, and restore its MXCSR on return.
 *
 * Geometry. A "rows" panel: element (r, k) at src[r*ld_src + k], R rows of K contiguous values, quantized along the
 * row. A "cols" panel: element (k, c) at src[k*ld_src + c], src [K, C] row-major, quantized along K (down each
 * column; no transpose). Outputs use the same geometry: rows: out[r*ld_out + k], scales[r*ld_scales + g];
 * cols: out[k*ld_out + c], scales[g*ld_scales + c]; g < G = ceil(K/32) in compact group order (wrapX: group
 * k0/32 + j of the (sub)tile at k0). `group` = MXFP8_GROUP_WRAPX needs K % 128 == 0 (the caller checks).
 * src dtype: F32, BF16 or F16. ld_* are in elements of the buffer's own type.
 *
 * qdq = quantize then dequantize exactly: v = fp8(code) * 2^(scale-127) computed in FP32, which is exact except
 * that a group whose amax lies at the very top of FP32's range can round up to 2^128 = Inf (same as the reference);
 * a NaN group (scale 255) gives the canonical quiet NaN 0x7FC00000 (BF16 0x7FC0). The BF16/F16 variants round that
 * FP32 value RNE; FP8 x 2^e is exact in BF16 unless |v| < 2^-126 (BF16 subnormal: low bits may be lost, possibly to
 * zero); they RETURN the number of elements whose BF16/F16 value differs from the FP32 value (0 = exact panel; a
 * caller that needs exactness can redo the panel with the F32 variant when the count is non-zero).
 * `scales` may be NULL in the qdq variants (not stored). */

/** Quantize rows: codes[r*ld_codes + k] (uint8 FP8 codes), scales[r*ld_scales + g]. */
void mxfp8i_quantize_rows(const void *src, mxfp8_dtype dtype, int64_t R, int64_t K, int64_t ld_src,
                          mxfp8_format fmt, mxfp8_scale_rule rule, mxfp8_group_scheme group, uint8_t *codes,
                          int64_t ld_codes, uint8_t *scales, int64_t ld_scales);
/** Quantize along columns: src [K, C] (row stride ld_src), codes [K, C] (ld_codes), scales [G, C] (ld_scales). */
void mxfp8i_quantize_cols(const void *src, mxfp8_dtype dtype, int64_t K, int64_t C, int64_t ld_src,
                          mxfp8_format fmt, mxfp8_scale_rule rule, mxfp8_group_scheme group, uint8_t *codes,
                          int64_t ld_codes, uint8_t *scales, int64_t ld_scales);
/** qdq rows into BF16 out[r*ld_out + k]; returns the count of BF16-inexact elements (see above). */
int64_t mxfp8i_qdq_rows_bf16(const void *src, mxfp8_dtype dtype, int64_t R, int64_t K, int64_t ld_src,
                             mxfp8_format fmt, mxfp8_scale_rule rule, mxfp8_group_scheme group, uint16_t *out,
                             int64_t ld_out, uint8_t *scales, int64_t ld_scales);
/** qdq along columns into BF16 out[k*ld_out + c]; returns the count of BF16-inexact elements. */
int64_t mxfp8i_qdq_cols_bf16(const void *src, mxfp8_dtype dtype, int64_t K, int64_t C, int64_t ld_src,
                             mxfp8_format fmt, mxfp8_scale_rule rule, mxfp8_group_scheme group, uint16_t *out,
                             int64_t ld_out, uint8_t *scales, int64_t ld_scales);
/** qdq rows into FP32 out[r*ld_out + k] (exact). */
void mxfp8i_qdq_rows_f32(const void *src, mxfp8_dtype dtype, int64_t R, int64_t K, int64_t ld_src, mxfp8_format fmt,
                         mxfp8_scale_rule rule, mxfp8_group_scheme group, float *out, int64_t ld_out,
                         uint8_t *scales, int64_t ld_scales);
/** qdq along columns into FP32 out[k*ld_out + c] (exact). */
void mxfp8i_qdq_cols_f32(const void *src, mxfp8_dtype dtype, int64_t K, int64_t C, int64_t ld_src, mxfp8_format fmt,
                         mxfp8_scale_rule rule, mxfp8_group_scheme group, float *out, int64_t ld_out,
                         uint8_t *scales, int64_t ld_scales);
/** Dequantize pre-quantized rows: codes[r*ld_codes + k], scales[r*ld_scales + g] -> out (F32, BF16 or F16)
 *  [r*ld_out + k]. Returns the count of elements whose BF16/F16 value differs from the exact FP32 value. */
int64_t mxfp8i_dequantize_rows(const uint8_t *codes, int64_t R, int64_t K, int64_t ld_codes, mxfp8_format fmt,
                               const uint8_t *scales, int64_t ld_scales, mxfp8_group_scheme group, void *out,
                               mxfp8_dtype out_dtype, int64_t ld_out);
/** Dequantize along columns: codes [K, C] (ld_codes), scales [G, C] (ld_scales) -> out [K, C] (ld_out). */
int64_t mxfp8i_dequantize_cols(const uint8_t *codes, int64_t K, int64_t C, int64_t ld_codes, mxfp8_format fmt,
                               const uint8_t *scales, int64_t ld_scales, mxfp8_group_scheme group, void *out,
                               mxfp8_dtype out_dtype, int64_t ld_out);

/* The general form behind the wrappers above: `lines` independent lines of K values along the axis; element k of
 * line l at base[l*ls + k*ks] (strides in elements, any sign). rows = (ls = ld, ks = 1); cols = (ls = 1, ks = ld).
 * Quantize: out_dtype E4M3/E5M2/U8 stores codes, F32/BF16/F16 stores qdq values; scales (may be NULL) at
 * scales[l*sc_ls + g*sc_gs]. Dequantize: codes + scales in, values out. Both return the BF16/F16-inexact count. */
typedef struct mxfp8i_qpanel {
    const void *src;
    mxfp8_dtype src_dtype;
    int64_t lines, K, src_ls, src_ks;
    mxfp8_format fmt;
    mxfp8_scale_rule rule;
    mxfp8_group_scheme group;
    void *out;
    mxfp8_dtype out_dtype;
    int64_t out_ls, out_ks;
    uint8_t *scales;
    int64_t sc_ls, sc_gs;
} mxfp8i_qpanel;
typedef struct mxfp8i_dqpanel {
    const uint8_t *codes;
    mxfp8_format fmt;
    int64_t lines, K, codes_ls, codes_ks;
    const uint8_t *scales;
    int64_t sc_ls, sc_gs;
    mxfp8_group_scheme group;
    void *out;
    mxfp8_dtype out_dtype;
    int64_t out_ls, out_ks;
} mxfp8i_dqpanel;
/** Dispatch: AVX-512 for the rows/cols geometries (unit stride along the axis, or unit stride across lines for
 *  src, out and scales) when available, else the reference. */
int64_t mxfp8i_quantize_panel(const mxfp8i_qpanel *p);
int64_t mxfp8i_dequantize_panel(const mxfp8i_dqpanel *p);
/** The reference (any strides) and the AVX-512 versions. The __avx512 ones return -1 (doing nothing) when the
 *  geometry is not rows/cols or the build lacks AVX-512; tests call both and compare. */
int64_t mxfp8i_quantize_panel__ref(const mxfp8i_qpanel *p);
int64_t mxfp8i_dequantize_panel__ref(const mxfp8i_dqpanel *p);
int64_t mxfp8i_quantize_panel__avx512(const mxfp8i_qpanel *p);
int64_t mxfp8i_dequantize_panel__avx512(const mxfp8i_dqpanel *p);

/** wrapX: the (sub)tile of an axis of length K (K % 128 == 0) holding index k: start *k0, size *P (512, 256, 128). */
static inline void mxfp8i_wrapx_tile_of(int64_t K, int64_t k, int64_t *k0, int64_t *P) {
    int64_t full = (K / 512) * 512;
    if (k < full) {
        *k0 = k - k % 512;
        *P = 512;
        return;
    }
    int64_t rem = K - full;
    if (rem >= 256 && k < full + 256) {
        *k0 = full;
        *P = 256;
        return;
    }
    *k0 = full + (rem >= 256 ? 256 : 0);
    *P = 128;
}
/** The indices along the axis of compact group g (ascending within each run); returns their count (<= 32). */
static inline int mxfp8i_group_members(int64_t K, mxfp8_group_scheme group, int64_t g, int64_t idx[32]) {
    if (group == MXFP8_GROUP_WRAPX) {
        int64_t k0, P;
        mxfp8i_wrapx_tile_of(K, g * 32, &k0, &P);
        int64_t S = P / 4, j = g - k0 / 32;
        for (int s = 0; s < 4; s++)
            for (int q = 0; q < 8; q++) idx[s * 8 + q] = k0 + s * S + 8 * j + q;
        return 32;
    }
    int n = K - g * 32 < 32 ? (int)(K - g * 32) : 32;
    for (int i = 0; i < n; i++) idx[i] = g * 32 + i;
    return n;
}
/** The compact group holding index k along the axis. */
static inline int64_t mxfp8i_group_of(int64_t K, mxfp8_group_scheme group, int64_t k) {
    if (group == MXFP8_GROUP_WRAPX) {
        int64_t k0, P;
        mxfp8i_wrapx_tile_of(K, k, &k0, &P);
        return k0 / 32 + ((k - k0) % (P / 4)) / 8;
    }
    return k / 32;
}

#endif /* MXFP8_INTERNAL_H */
