/*
 * store.c -- the layer's outputs: FP32 / FP64 accumulators rounded once into views of any dtype and strides;
 * add != 0 (accumulate_hidden_states_grad, skip_grad_initialization): the view's given value + the accumulator,
 * one FP32 addition, then rounded to the dtype. Contiguous views take a threaded fast path with the same roundings.
 */
#include "../../kernels/registry.h"
#include "bwd_state.h"

/* Store a row-major flat FP32 / FP64 buffer into a view; add != 0: the view's value + src (one FP32 addition). */
void mxfp8i_moe_store_flat_f(const mxfp8_tensor *t, const float *src, int add) {
    int64_t n = mxfp8_tensor_numel(t), idx[MXFP8_MAX_DIMS] = {0};
    if (mxfp8i_is_contiguous(t) && t->dtype != MXFP8_DTYPE_F64) { /* fast path: one pass, threads split the range */
        const int nt = mxfp8i_moe_nt((double)n);
        mxfp8i_to_bf16_fn to_bf16 = mxfp8i_kernels_get()->quant->to_bf16;
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int c = 0; c < nt; c++) {
            if (t->dtype == MXFP8_DTYPE_BF16 && !add) { /* the vectorized rounding of the GEMM epilogue */
                to_bf16(src + n * c / nt, 0, (uint16_t *)t->data + n * c / nt, 0, 1, n * (c + 1) / nt - n * c / nt);
                continue;
            }
            if (t->dtype == MXFP8_DTYPE_BF16) {
                uint16_t *d = (uint16_t *)t->data;
                for (int64_t k = n * c / nt; k < n * (c + 1) / nt; k++)
                    d[k] = mxfp8i_fp32_to_bf16(add ? mxfp8i_bf16_to_fp32(d[k]) + src[k] : src[k]);
                continue;
            }
            for (int64_t k = n * c / nt; k < n * (c + 1) / nt; k++) {
                float v = add ? mxfp8i_load_f32(t->data, t->dtype, k) + src[k] : src[k];
                mxfp8i_store_f32(t->data, t->dtype, k, v);
            }
        }
        return;
    }
    for (int64_t k = 0; k < n; k++) {
        int64_t off = 0;
        for (int d = 0; d < t->ndim; d++) off += idx[d] * t->strides[d];
        float v = add ? (float)mxfp8i_moe_ld(t, off) + src[k] : src[k];
        mxfp8i_moe_st(t, off, (double)v);
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d]) break;
            idx[d] = 0;
        }
    }
}
void mxfp8i_moe_store_flat_d(const mxfp8_tensor *t, const double *src, int add) {
    int64_t n = mxfp8_tensor_numel(t), idx[MXFP8_MAX_DIMS] = {0};
    for (int64_t k = 0; k < n; k++) {
        int64_t off = 0;
        for (int d = 0; d < t->ndim; d++) off += idx[d] * t->strides[d];
        float v = add ? (float)mxfp8i_moe_ld(t, off) + (float)src[k] : (float)src[k];
        mxfp8i_moe_st(t, off, (double)v);
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d]) break;
            idx[d] = 0;
        }
    }
}

/* Offset (elements) of flat row-major index k of a view within its leading index e ([E, ...] views). */
static int64_t sub_off(const mxfp8_tensor *t, int64_t e, int64_t k) {
    int64_t off = e * t->strides[0];
    for (int d = t->ndim - 1; d >= 1; d--) {
        off += (k % t->shape[d]) * t->strides[d];
        k /= t->shape[d];
    }
    return off;
}

/* Round expert e's FP32 accumulator (per = elements of one expert) into the staging copy of a weight gradient (a
 * row-major buffer of the output's dtype and shape, whose element e*per + k is the expert's element k), or with
 * stage NULL straight into the output view. add != 0: the output's given value + acc (one FP32 addition), exactly
 * as mxfp8i_moe_store_flat_f would round it. clear != 0: acc is left zeroed for the next expert (each piece right
 * after it is read, while it is in cache). */
void mxfp8i_moe_stage_expert(const mxfp8_tensor *t, int64_t e, int64_t per, float *acc, int add, void *stage,
                             int clear) {
    enum { PIECE = 8192 }; /* 32 KiB of accumulators */
    mxfp8_tensor sv = *t;
    const int cont = mxfp8i_is_contiguous(t), direct = stage == NULL;
    if (!direct) sv.data = stage;
    const int nt = mxfp8i_moe_nt((double)per);
    if (cont && !add && t->dtype == MXFP8_DTYPE_BF16) { /* the common case: one vectorized rounding pass */
        uint16_t *d = (uint16_t *)sv.data + e * per;
        mxfp8i_to_bf16_fn to_bf16 = mxfp8i_kernels_get()->quant->to_bf16;
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int c = 0; c < nt; c++)
            for (int64_t k0 = per * c / nt, k1 = per * (c + 1) / nt; k0 < k1; k0 += PIECE) {
                const int64_t n = k1 - k0 < PIECE ? k1 - k0 : PIECE;
                to_bf16(acc + k0, 0, d + k0, 0, 1, n);
                if (clear) memset(acc + k0, 0, (size_t)n * sizeof(float));
            }
        return;
    }
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int c = 0; c < nt; c++)
        for (int64_t k = per * c / nt; k < per * (c + 1) / nt; k++) {
            const int64_t off = cont ? e * per + k : sub_off(t, e, k), so = direct ? off : e * per + k;
            float v = acc[k];
            if (add) v = (float)mxfp8i_moe_ld(t, off) + v;
            if (t->dtype == MXFP8_DTYPE_BF16) ((uint16_t *)sv.data)[so] = mxfp8i_fp32_to_bf16(v);
            else mxfp8i_moe_st(&sv, so, (double)v);
            if (clear) acc[k] = 0.0f;
        }
}

/* Copy experts [0, ne) of a staging buffer (row-major, the view's dtype) into the view. */
void mxfp8i_moe_store_staged(const mxfp8_tensor *t, const void *stage, int64_t ne) {
    const int64_t per = t->shape[0] ? mxfp8_tensor_numel(t) / t->shape[0] : 0, n = ne * per;
    const size_t es = mxfp8_dtype_size(t->dtype);
    if (n == 0) return;
    if (mxfp8i_is_contiguous(t)) { /* all experts but the last: large (E = 64: 100 MB of BF16), so both threads copy */
        const int nt = mxfp8i_moe_nt((double)n);
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int c = 0; c < nt; c++) {
            const size_t k0 = (size_t)(n * c / nt), k1 = (size_t)(n * (c + 1) / nt);
            memcpy((char *)t->data + k0 * es, (const char *)stage + k0 * es, (k1 - k0) * es);
        }
        return;
    }
    for (int64_t k = 0; k < n; k++)
        memcpy((char *)t->data + (size_t)sub_off(t, k / per, k % per) * es, (const char *)stage + (size_t)k * es, es);
}
