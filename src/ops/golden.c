/*
 * golden.c -- golden references for matmul and the NKI pass criteria [NKI-M].
 *
 * mxfp8_gemm_golden_unquantized: C = A @ B^T from the high-precision operands (optionally rounded to BF16 first, as
 *   the upstream test's golden), acc = fmaf(a, b, acc) over k ascending from +0, C F32 or F64.
 * mxfp8_gemm_golden_quantized: each operand MX-quantized along K (reference quantizer), dequantized exactly, products
 *   accumulated in double (k ascending); C F64 (or F32, rounded once).
 * mxfp8_compare: the upstream criteria: allclose(atol = atol_frac * max|g|, rtol), cosine similarity, normalized
 *   Euclidean distance |k - g| / (|k| + |g|).
 */
#include <math.h>
#include <stdlib.h>

#include "../gemm/gemm.h"
#include "../runtime/enums.h"
#include "../runtime/threads.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__gnu_linux__)
#define MXFP8_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define MXFP8_CLONES
#endif

/* acc = fmaf(a[k], b[k], acc) for k ascending from +0 (fmaf is exact by definition: both clones give the same bits). */
MXFP8_CLONES
static float dot_fma(const float *a, const float *b, int64_t K) {
    float acc = 0.0f;
    for (int64_t k = 0; k < K; k++) acc = fmaf(a[k], b[k], acc);
    return acc;
}

static mxfp8_status check_hp(const char *fn, const char *name, const mxfp8_tensor *t) {
    MXFP8I_RETURN_ERROR_IF(!t, MXFP8_ERR_NULL_POINTER, "%s: %s is NULL", fn, name);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_rank(fn, name, t, 2));
    return mxfp8i_check_dtype(fn, name, t, 4, MXFP8_DTYPE_F32, MXFP8_DTYPE_BF16, MXFP8_DTYPE_F16, MXFP8_DTYPE_F64);
}

static mxfp8_status check_golden_args(const char *fn, const mxfp8_tensor *a, const mxfp8_tensor *b,
                                      const mxfp8_tensor *c) {
    mxfp8_status st;
    if ((st = check_hp(fn, "a", a)) || (st = check_hp(fn, "b", b))) return st;
    MXFP8I_RETURN_ERROR_IF(!c, MXFP8_ERR_NULL_POINTER, "%s: c is NULL", fn);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_rank(fn, "c", c, 2));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_dtype(fn, "c", c, 2, MXFP8_DTYPE_F32, MXFP8_DTYPE_F64));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_distinct(fn, "c", c));
    MXFP8I_RETURN_ERROR_IF(a->shape[1] != b->shape[1], MXFP8_ERR_SHAPE_MISMATCH,
                           "%s: a has K = %lld but b has K = %lld", fn, (long long)a->shape[1], (long long)b->shape[1]);
    MXFP8I_RETURN_ERROR_IF(c->shape[0] != a->shape[0] || c->shape[1] != b->shape[0], MXFP8_ERR_SHAPE_MISMATCH,
                           "%s: c has shape [%lld, %lld], expected [%lld, %lld]", fn, (long long)c->shape[0],
                           (long long)c->shape[1], (long long)a->shape[0], (long long)b->shape[0]);
    if ((st = mxfp8i_check_no_alias(fn, "c", c, "a", a)) || (st = mxfp8i_check_no_alias(fn, "c", c, "b", b))) return st;
    return MXFP8_OK;
}

/* Row-major FP32 copy of a [R, K] operand (optionally BF16-rounded). */
static float *load_matrix(const mxfp8_tensor *t, int round_bf16) {
    int64_t R = t->shape[0], K = t->shape[1], n;
    if (!mxfp8i_mul_size(R, K, &n)) return NULL;
    float *m = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!m) return NULL;
    for (int64_t r = 0; r < R; r++)
        for (int64_t k = 0; k < K; k++) {
            float v = mxfp8i_load_f32(t->data, t->dtype, r * t->strides[0] + k * t->strides[1]);
            if (round_bf16) v = mxfp8_bf16_to_fp32(mxfp8_fp32_to_bf16(v));
            m[r * K + k] = v;
        }
    return m;
}

static void store_c(const mxfp8_tensor *c, int64_t m, int64_t n, double v) {
    int64_t off = m * c->strides[0] + n * c->strides[1];
    if (c->dtype == MXFP8_DTYPE_F64) ((double *)c->data)[off] = v;
    else ((float *)c->data)[off] = (float)v;
}

mxfp8_status mxfp8_gemm_golden_unquantized(const mxfp8_tensor *a, const mxfp8_tensor *b, int round_to_bf16,
                                           mxfp8_tensor *c) {
    static const char *fn = "mxfp8_gemm_golden_unquantized";
    mxfp8i_clear_error();
    MXFP8I_RETURN_ERROR_IF(round_to_bf16 != 0 && round_to_bf16 != 1, MXFP8_ERR_INVALID_ARGUMENT,
                           "%s: round_to_bf16 %d is not 0 or 1", fn, round_to_bf16);
    MXFP8I_FORWARD_IF_ERROR(check_golden_args(fn, a, b, c));
    float *A = load_matrix(a, round_to_bf16), *B = load_matrix(b, round_to_bf16);
    if (!A || !B) {
        free(A);
        free(B);
        return mxfp8i_error(MXFP8_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    int64_t M = a->shape[0], N = b->shape[0], K = a->shape[1];
#pragma omp parallel for schedule(static) num_threads(mxfp8i_num_threads())
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) { store_c(c, m, n, dot_fma(A + m * K, B + n * K, K)); }
    free(A);
    free(B);
    return MXFP8_OK;
}

mxfp8_status mxfp8_gemm_golden_quantized(const mxfp8_tensor *a, const mxfp8_tensor *b, const mxfp8_quant_params *params,
                                         mxfp8_tensor *c) {
    static const char *fn = "mxfp8_gemm_golden_quantized";
    mxfp8i_clear_error();
    mxfp8_status st;
    MXFP8I_RETURN_ERROR_IF(!params, MXFP8_ERR_NULL_POINTER, "%s: params is NULL", fn);
    if ((st = mxfp8i_check_enum(fn, "params->fmt", MXFP8_ENUM_FORMAT, (int)params->fmt)) ||
        (st = mxfp8i_check_enum(fn, "params->rule", MXFP8_ENUM_SCALE_RULE, (int)params->rule)) ||
        (st = mxfp8i_check_enum(fn, "params->group", MXFP8_ENUM_GROUP_SCHEME, (int)params->group)))
        return st;
    MXFP8I_FORWARD_IF_ERROR(check_golden_args(fn, a, b, c));
    int64_t M = a->shape[0], N = b->shape[0], K = a->shape[1];
    MXFP8I_RETURN_ERROR_IF(params->group == MXFP8_GROUP_WRAPX && K % 128, MXFP8_ERR_UNSUPPORTED,
                           "%s: wrapX needs K %% 128 == 0, K = %lld", fn, (long long)K);
    /* F64 operands are read as F32 (mxfp8i_load_f32), i.e. quantization starts from their FP32 rounding. */
    float *A = load_matrix(a, 0), *B = load_matrix(b, 0), *tmp = malloc((size_t)(K > 0 ? K : 1) * sizeof(float));
    int64_t nA = 0, nB = 0;
    if (!mxfp8i_mul_size(M, K, &nA) || !mxfp8i_mul_size(N, K, &nB)) nA = nB = -1;
    float *QA = malloc((size_t)(nA > 0 ? nA : 1) * sizeof(float)),
          *QB = malloc((size_t)(nB > 0 ? nB : 1) * sizeof(float));
    if (!A || !B || !tmp || !QA || !QB || nA < 0) {
        free(A);
        free(B);
        free(tmp);
        free(QA);
        free(QB);
        return mxfp8i_error(MXFP8_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    mxfp8i_gop ga = {0}, gb = {0};
    ga.data = (const char *)A;
    ga.dtype = MXFP8_DTYPE_F32;
    ga.R = M;
    ga.K = K;
    ga.s0 = K;
    ga.s1 = 1;
    gb.data = (const char *)B;
    gb.dtype = MXFP8_DTYPE_F32;
    gb.R = N;
    gb.K = K;
    gb.s0 = K;
    gb.s1 = 1;
    ga.rc = gb.rc = mxfp8i_recipe_make(params->fmt, params->rule, params->group);
    for (int64_t m = 0; m < M; m++) mxfp8i_gop_deq_row(&ga, m, QA + m * K, tmp);
    for (int64_t n = 0; n < N; n++) mxfp8i_gop_deq_row(&gb, n, QB + n * K, tmp);
#pragma omp parallel for schedule(static) num_threads(mxfp8i_num_threads())
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double acc = 0.0;
            const float *ar = QA + m * K, *br = QB + n * K;
            for (int64_t k = 0; k < K; k++) acc += (double)ar[k] * (double)br[k];
            store_c(c, m, n, acc);
        }
    free(A);
    free(B);
    free(tmp);
    free(QA);
    free(QB);
    return MXFP8_OK;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* comparison                                                                                                  */
/* ---------------------------------------------------------------------------------------------------------- */
static double load_d(const mxfp8_tensor *t, int64_t i) {
    /* i-th element in row-major order of the view */
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t n = t->shape[d];
        off += (i % n) * t->strides[d];
        i /= n;
    }
    if (t->dtype == MXFP8_DTYPE_F64) return ((const double *)t->data)[off];
    return mxfp8i_load_f32(t->data, t->dtype, off);
}

mxfp8_status mxfp8_compare(const mxfp8_tensor *kernel, const mxfp8_tensor *golden, double atol_frac, double rtol,
                           mxfp8_compare_result *result) {
    static const char *fn = "mxfp8_compare";
    mxfp8i_clear_error();
    mxfp8_status st;
    MXFP8I_RETURN_ERROR_IF(!kernel || !golden || !result, MXFP8_ERR_NULL_POINTER, "%s: %s is NULL", fn,
                           !kernel   ? "kernel"
                           : !golden ? "golden"
                                     : "result");
    if ((st = mxfp8i_check_view(fn, "kernel", kernel)) || (st = mxfp8i_check_view(fn, "golden", golden))) return st;
    if ((st = mxfp8i_check_dtype(fn, "kernel", kernel, 4, MXFP8_DTYPE_F32, MXFP8_DTYPE_F64, MXFP8_DTYPE_BF16,
                                 MXFP8_DTYPE_F16)) ||
        (st = mxfp8i_check_dtype(fn, "golden", golden, 4, MXFP8_DTYPE_F32, MXFP8_DTYPE_F64, MXFP8_DTYPE_BF16,
                                 MXFP8_DTYPE_F16)))
        return st;
    MXFP8I_RETURN_ERROR_IF(!(atol_frac >= 0) || !(rtol >= 0), MXFP8_ERR_INVALID_ARGUMENT,
                           "%s: atol_frac %g and rtol %g must be >= 0", fn, atol_frac, rtol);
    int64_t n = mxfp8_tensor_numel(kernel), ng = mxfp8_tensor_numel(golden);
    MXFP8I_RETURN_ERROR_IF(n != ng, MXFP8_ERR_SHAPE_MISMATCH, "%s: kernel has %lld elements but golden has %lld", fn,
                           (long long)n, (long long)ng);
    double maxg = 0, maxe = 0, dot = 0, kk = 0, gg = 0, dd = 0;
    int64_t nan = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = load_d(golden, i), k = load_d(kernel, i);
        if (isnan(k)) nan++;
        if (fabs(g) > maxg) maxg = fabs(g);
        double e = fabs(k - g);
        if (!(e <= maxe)) maxe = e; /* NaN propagates */
        dot += k * g;
        kk += k * k;
        gg += g * g;
        dd += (k - g) * (k - g);
    }
    double atol = atol_frac * maxg;
    int close = 1;
    for (int64_t i = 0; i < n && close; i++) {
        double g = load_d(golden, i), k = load_d(kernel, i);
        if (!(fabs(k - g) <= atol + rtol * fabs(g))) close = 0;
    }
    result->max_abs_golden = maxg;
    result->max_abs_err = maxe;
    result->max_rel_err = maxg > 0 ? maxe / maxg : (maxe == 0 ? 0.0 : INFINITY);
    double nk = sqrt(kk), ng2 = sqrt(gg), nd = sqrt(dd);
    result->cosine = (nk == 0 && ng2 == 0) ? 1.0 : (nk == 0 || ng2 == 0) ? 0.0 : dot / (nk * ng2);
    result->norm_euclid = (nk + ng2 == 0) ? 0.0 : nd / (nk + ng2);
    result->allclose = close;
    result->num_nan = nan;
    return MXFP8_OK;
}
