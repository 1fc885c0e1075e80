/*
 * bias_grad.c -- mxfp8_bias_grad: the bias gradient of a linear layer, db[n] = sum_m dY[m, n], in FP32 in one
 * fixed order (include/mxfp8.h, "Bias gradient").
 *
 * The order, per column: rows in chunks of 32 (MXFP8I_BIAS_CHUNK) summed one after the other from +0, then the
 * chunk sums combined pairwise: S(c0, n) = S(c0, h) + S(c0 + h, n - h) with h the largest power of two below n.
 * It is computed with a stack of partial sums per column, one per level of the tree (as a binary counter: after
 * chunk c, two partials of the same size merge), folded from the top at the end -- which is the same tree. Each
 * column's order depends on M alone, so threads (which take disjoint blocks of columns) and the vectorization
 * across columns change no bit.
 */
#include <stddef.h>

#include "../format/codec.h"
#include "../runtime/threads.h"
#include "../runtime/error.h"
#include "../runtime/fenv.h"
#include "../runtime/tensor.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#define MXFP8I_BIAS_CHUNK 32 /* rows summed one after the other before the pairwise tree */
#define COLS 128             /* columns of one block (a thread's unit of work) */
#define LEVELS 64            /* levels of the tree: enough for any int64 row count */

/* acc[j] += row[j * cs] for j < w: the three source dtypes, each a loop the compiler vectorizes across columns. */
static void add_row(float *acc, const void *row, int64_t cs, int w, mxfp8_dtype dt) {
    if (dt == MXFP8_DTYPE_F32) {
        const float *p = (const float *)row;
        if (cs == 1)
            for (int j = 0; j < w; ++j) acc[j] += p[j];
        else
            for (int j = 0; j < w; ++j) acc[j] += p[j * cs];
    } else if (dt == MXFP8_DTYPE_BF16) {
        const uint16_t *p = (const uint16_t *)row;
        if (cs == 1)
            for (int j = 0; j < w; ++j) acc[j] += mxfp8i_bf16_to_fp32(p[j]);
        else
            for (int j = 0; j < w; ++j) acc[j] += mxfp8i_bf16_to_fp32(p[j * cs]);
    } else {
        const uint16_t *p = (const uint16_t *)row;
        for (int j = 0; j < w; ++j) acc[j] += mxfp8i_fp16_to_fp32(p[j * cs]);
    }
}

/* The FP32 sums of columns [j0, j0 + w) of src (2-D, validated) into sum[0..w). */
static void column_block(const mxfp8_tensor *src, int64_t j0, int w, float *sum) {
    float level[LEVELS][COLS];
    int64_t size[LEVELS]; /* chunks in each partial of the stack */
    int top = 0;          /* partials on the stack */
    const int64_t M = src->shape[0], rs = src->strides[0], cs = src->strides[1];
    const size_t es = mxfp8_dtype_size(src->dtype);
    const char *base = (const char *)src->data + (ptrdiff_t)(j0 * cs * (int64_t)es);
    for (int64_t m0 = 0; m0 < M; m0 += MXFP8I_BIAS_CHUNK) {
        float *acc = level[top];
        for (int j = 0; j < w; ++j) acc[j] = 0.0f;
        int64_t m1 = m0 + MXFP8I_BIAS_CHUNK < M ? m0 + MXFP8I_BIAS_CHUNK : M;
        for (int64_t m = m0; m < m1; ++m) add_row(acc, base + (ptrdiff_t)(m * rs * (int64_t)es), cs, w, src->dtype);
        size[top++] = 1;
        while (top >= 2 && size[top - 1] == size[top - 2]) { /* merge two partials of the same size */
            for (int j = 0; j < w; ++j) level[top - 2][j] += level[top - 1][j];
            size[top - 2] *= 2;
            --top;
        }
    }
    if (top == 0) {
        for (int j = 0; j < w; ++j) sum[j] = 0.0f;
        return;
    }
    for (int j = 0; j < w; ++j) sum[j] = level[top - 1][j];
    for (int l = top - 2; l >= 0; --l) /* the left subtree is the larger one: S = left + right */
        for (int j = 0; j < w; ++j) sum[j] = level[l][j] + sum[j];
}

mxfp8_status mxfp8_bias_grad(const mxfp8_tensor *output_grad, mxfp8_tensor *bias_grad) {
    static const char *fn = "mxfp8_bias_grad";
    mxfp8i_clear_error();
    MXFP8I_RETURN_ERROR_IF(!output_grad, MXFP8_ERR_NULL_POINTER, "%s: output_grad is NULL", fn);
    MXFP8I_RETURN_ERROR_IF(!bias_grad, MXFP8_ERR_NULL_POINTER, "%s: bias_grad is NULL", fn);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_view(fn, "output_grad", output_grad));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_view(fn, "bias_grad", bias_grad));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_rank(fn, "output_grad", output_grad, 2));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_rank(fn, "bias_grad", bias_grad, 1));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_dtype(fn, "output_grad", output_grad, 3, MXFP8_DTYPE_F32, MXFP8_DTYPE_BF16,
                                               MXFP8_DTYPE_F16));
    MXFP8I_FORWARD_IF_ERROR(
        mxfp8i_check_dtype(fn, "bias_grad", bias_grad, 3, MXFP8_DTYPE_F32, MXFP8_DTYPE_BF16, MXFP8_DTYPE_F16));
    const int64_t N = output_grad->shape[1];
    MXFP8I_RETURN_ERROR_IF(bias_grad->shape[0] != N, MXFP8_ERR_SHAPE_MISMATCH,
                           "%s: bias_grad has %lld elements, output_grad [M, N] = [%lld, %lld] needs N = %lld", fn,
                           (long long)bias_grad->shape[0], (long long)output_grad->shape[0], (long long)N,
                           (long long)N);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_distinct(fn, "bias_grad", bias_grad));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_no_alias(fn, "bias_grad", bias_grad, "output_grad", output_grad));

    const int64_t M = output_grad->shape[0], blocks = mxfp8i_ceil_div(N, COLS);
    const double work = (double)M * (double)N;
    const int nt = work < 262144.0 ? 1 : mxfp8i_num_threads();
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && blocks > 1)
    for (int64_t b = 0; b < blocks; ++b) {
        unsigned csr = mxfp8i_fenv_enter();
        float sum[COLS];
        const int64_t j0 = b * COLS;
        const int w = (int)(N - j0 < COLS ? N - j0 : COLS);
        column_block(output_grad, j0, w, sum);
        for (int j = 0; j < w; ++j)
            mxfp8i_store_f32(bias_grad->data, bias_grad->dtype, (j0 + j) * bias_grad->strides[0], sum[j]);
        mxfp8i_fenv_leave(csr);
    }
    return MXFP8_OK;
}
