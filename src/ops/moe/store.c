/*
 * store.c -- the layer's outputs: FP32 / FP64 accumulators rounded once into views of any dtype and strides;
 * add != 0 (accumulate_hidden_states_grad, skip_grad_initialization): the view's given value + the accumulator,
 * one FP32 addition, then rounded to the dtype. Contiguous views take a threaded fast path with the same roundings.
 */
#include <omp.h>

#include "../../kernels/registry.h"
#include "bwd_state.h"

/* Store a row-major flat FP32 / FP64 buffer into a view; add != 0: the view's value + src (one FP32 addition). */
void mxfp8i_moe_store_flat_f(const mxfp8_tensor *t, const float *src, int add) {
    int64_t n = mxfp8_tensor_numel(t), idx[MXFP8_MAX_DIMS] = {0};
    if (mxfp8i_is_contiguous(t) && t->dtype != MXFP8_DTYPE_F64) { /* fast path: one pass, threads split the range */
        const int nt = mxfp8i_moe_nt((double)n), direct = mxfp8i_moe_to_bf16_direct(t, add);
        mxfp8i_to_bf16_fn to_bf16 = mxfp8i_kernels_get()->quant->to_bf16;
#pragma omp parallel num_threads(nt)
        {
            const unsigned csr = mxfp8i_fenv_enter(); /* IEEE defaults on every thread of the region */
#pragma omp for schedule(static) nowait
            for (int c = 0; c < nt; c++) {
                if (direct) { /* the vectorized rounding of the GEMM epilogue */
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
            mxfp8i_fenv_leave(csr);
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
void mxfp8i_moe_zero_f(float *acc, int64_t n) {
    const int nt = mxfp8i_moe_nt((double)n);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int c = 0; c < nt; c++) /* +0 is all zero bits */
        memset(acc + n * c / nt, 0, (size_t)(n * (c + 1) / nt - n * c / nt) * sizeof(float));
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

/* Round expert e's FP32 accumulator (per = elements of one expert) into expert e of the output view, whose element k
 * of expert e is the expert's row-major element k. add != 0: the output's given value + acc (one FP32 addition),
 * exactly as mxfp8i_moe_store_flat_f would round it. clear != 0: acc is left zeroed for the next expert (each piece
 * right after it is read, while it is in cache). Contiguous BF16 and F32 views take one vectorized pass per piece
 * (the registry's to_bf16, a copy, or add_f32: the same roundings and additions as the element loop). */
void mxfp8i_moe_store_expert(const mxfp8_tensor *t, int64_t e, int64_t per, float *acc, int add, int clear) {
    enum { PIECE = 8192 }; /* 32 KiB of accumulators */
    const int cont = mxfp8i_is_contiguous(t);
    const int nt = mxfp8i_moe_nt((double)per);
    const int bf16 = cont && !add && t->dtype == MXFP8_DTYPE_BF16, f32 = cont && t->dtype == MXFP8_DTYPE_F32;
    if (bf16 || f32) {
        const mxfp8i_qkernel *qk = mxfp8i_kernels_get()->quant;
#pragma omp parallel num_threads(nt)
        {
            const unsigned csr = mxfp8i_fenv_enter(); /* IEEE defaults on every thread of the region */
#pragma omp for schedule(static) nowait
            for (int c = 0; c < nt; c++)
                for (int64_t k0 = per * c / nt, k1 = per * (c + 1) / nt; k0 < k1; k0 += PIECE) {
                    const int64_t n = k1 - k0 < PIECE ? k1 - k0 : PIECE;
                    if (bf16) qk->to_bf16(acc + k0, 0, (uint16_t *)t->data + e * per + k0, 0, 1, n);
                    else if (add) qk->add_f32(acc + k0, 0, (float *)t->data + e * per + k0, 0, 1, n); /* given + acc */
                    else memcpy((float *)t->data + e * per + k0, acc + k0, (size_t)n * sizeof(float));
                    if (clear) memset(acc + k0, 0, (size_t)n * sizeof(float));
                }
            mxfp8i_fenv_leave(csr);
        }
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        const unsigned csr = mxfp8i_fenv_enter(); /* IEEE defaults on every thread of the region */
#pragma omp for schedule(static) nowait
        for (int c = 0; c < nt; c++)
            for (int64_t k = per * c / nt; k < per * (c + 1) / nt; k++) {
                const int64_t off = cont ? e * per + k : sub_off(t, e, k);
                float v = acc[k];
                if (add) v = (float)mxfp8i_moe_ld(t, off) + v;
                if (t->dtype == MXFP8_DTYPE_BF16) ((uint16_t *)t->data)[off] = mxfp8i_fp32_to_bf16(v);
                else mxfp8i_moe_st(t, off, (double)v);
                if (clear) acc[k] = 0.0f;
            }
        mxfp8i_fenv_leave(csr);
    }
}

int mxfp8i_moe_combine_reserve(const mxfp8i_moe *p, int *k, float **acc, float **V, int32_t **first, int32_t **list) {
    const int64_t NB = p->N * p->B, T = p->T, H = p->H;
    const int64_t n[4] = {T * H, NB * H, 2 * (T + 1), NB};
    const size_t es[4] = {sizeof(float), sizeof(float), sizeof(int32_t), sizeof(int32_t)};
    void *b[4];
    for (int i = 0; i < 4; i++)
        if (!(b[i] = mxfp8i_ws_get((*k)++, (size_t)(n[i] > 0 ? n[i] : 1) * es[i]))) return 0;
    *acc = (float *)b[0], *V = (float *)b[1], *first = (int32_t *)b[2], *list = (int32_t *)b[3];
    return 1;
}

int mxfp8i_moe_combine_plan(const mxfp8i_moe *p, const int32_t *bord, int64_t nb, int32_t *first, int32_t *list,
                            const mxfp8_tensor *out, int add) {
    const int64_t N = p->N, B = p->B, T = p->T;
    int32_t *cur = first + T + 1;
    /* each token's positions in that order (a counting sort by token) */
    for (int64_t t = 0; t <= T; t++) first[t] = 0;
    for (int64_t q = 0; q < N * B; q++)
        if (p->tok[q] >= 0) first[p->tok[q] + 1]++;
    for (int64_t t = 0; t < T; t++) first[t + 1] += first[t];
    for (int64_t t = 0; t < T; t++) cur[t] = first[t];
    for (int64_t i = 0; i < (bord ? nb : N); i++) {
        const int64_t n = bord ? bord[i] : i;
        for (int64_t q = n * B; q < (n + 1) * B; q++)
            if (p->tok[q] >= 0) list[cur[p->tok[q]]++] = (int32_t)q;
    }
    return mxfp8i_moe_to_bf16_direct(out, add); /* (then rounded row by row from L1) */
}

void mxfp8i_moe_combine_tokens(const mxfp8i_moe *p, const float *V, const float *aq, const float *b2, float *acc,
                               const int32_t *first, const int32_t *list, const mxfp8_tensor *out, int direct,
                               int64_t t0, int64_t t1) {
    const int64_t B = p->B, H = p->H;
    const mxfp8i_to_bf16_fn to_bf16 = direct ? mxfp8i_kernels_get()->quant->to_bf16 : NULL;
    for (int64_t t = t0; t < t1; t++) {
        /* direct: row t0 of acc, which is scratch then (each range of tokens has its own first row) */
        float *dst = acc + (direct ? t0 : t) * H;
        if (first[t] == first[t + 1]) memset(dst, 0, (size_t)H * sizeof(float)); /* no rows */
        for (int32_t k = first[t]; k < first[t + 1]; k++) {
            const int64_t q = list[k];
            const float *src = V + q * H;
            /* +0 + the first row: the first addition to a zeroed accumulator (a forward token whose weighted rows
               are all -0 sums to +0; the backward's rows, GEMM outputs, are never -0) */
            const int lead = k == first[t];
            if (aq) {
                const float a = aq[q], *bb = b2 + p->expert[q / B] * H;
                if (lead)
                    for (int64_t h = 0; h < H; h++) dst[h] = 0.0f + a * (src[h] + bb[h]);
                else
                    for (int64_t h = 0; h < H; h++) dst[h] += a * (src[h] + bb[h]);
            } else if (lead) {
                for (int64_t h = 0; h < H; h++) dst[h] = 0.0f + src[h];
            } else {
                for (int64_t h = 0; h < H; h++) dst[h] += src[h];
            }
        }
        if (direct) to_bf16(dst, 0, (uint16_t *)out->data + t * H, 0, 1, H);
    }
}

int mxfp8i_moe_combine_rows(const mxfp8i_moe *p, const int32_t *bord, int64_t nb, const float *V, const float *aq,
                            const float *b2, float *acc, int32_t *first, int32_t *list, const mxfp8_tensor *out,
                            int add) {
    const int64_t T = p->T;
    const int direct = mxfp8i_moe_combine_plan(p, bord, nb, first, list, out, add);
    const int nt = mxfp8i_moe_nt((double)p->N * (double)p->B * (double)p->H);
#pragma omp parallel num_threads(nt)
    {
        const unsigned csr = mxfp8i_fenv_enter(); /* IEEE defaults on every thread of the region */
        const int64_t tid = omp_get_thread_num(), n = omp_get_num_threads();
        mxfp8i_moe_combine_tokens(p, V, aq, b2, acc, first, list, out, direct, T * tid / n, T * (tid + 1) / n);
        mxfp8i_fenv_leave(csr);
    }
    return direct;
}
