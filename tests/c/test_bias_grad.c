/*
 * test_bias_grad.c -- mxfp8_bias_grad against the order the header documents, written here from that text as a
 * recursion over chunks (the library keeps a stack): bitwise, for row counts whose chunk counts have one, two and
 * three binary digits set, every source / output dtype, 1 / 2 / 3 threads, a transposed view; the errors write
 * nothing.
 */
#include "testutil.h"

/* S(c0, k) of the header: chunk sums of 32 rows from +0, then left + right with the left the largest power of 2. */
static float tree(const float *chunk, int64_t c0, int64_t k) {
    if (k == 1) return chunk[c0];
    int64_t h = 1;
    while (h * 2 < k) h *= 2;
    float l = tree(chunk, c0, h), r = tree(chunk, c0 + h, k - h);
    return l + r;
}

static float oracle(const float *dy, int64_t M, int64_t N, int64_t n) {
    int64_t nc = (M + 31) / 32;
    if (nc == 0) return 0.0f;
    float *chunk = tu_alloc((size_t)nc * sizeof(float));
    for (int64_t c = 0; c < nc; ++c) {
        float s = 0.0f;
        for (int64_t m = 32 * c; m < M && m < 32 * c + 32; ++m) s += dy[m * N + n];
        chunk[c] = s;
    }
    float t = tree(chunk, 0, nc);
    free(chunk);
    return t;
}

int main(void) {
    tu_rng rng = {12345};
    const int64_t Ms[] = {0, 1, 32, 33, 200, 350, 1000, 1500};
    const int64_t Ns[] = {1, 129, 300};
    for (size_t a = 0; a < sizeof Ms / sizeof *Ms; ++a)
        for (size_t b = 0; b < sizeof Ns / sizeof *Ns; ++b) {
            int64_t M = Ms[a], N = Ns[b];
            float *dy = tu_alloc((size_t)(M * N + 1) * sizeof(float));
            uint16_t *dyh = tu_alloc((size_t)(M * N + 1) * sizeof(uint16_t));
            for (int64_t i = 0; i < M * N; ++i) dy[i] = (float)(tu_uniform(&rng) * 2 - 1) * ldexpf(1, (int)(i % 13));
            for (int64_t i = 0; i < M * N; ++i) dyh[i] = mxfp8_fp32_to_bf16(dy[i]);
            float *dyb = tu_alloc((size_t)(M * N + 1) * sizeof(float)); /* the BF16 values as FP32 */
            for (int64_t i = 0; i < M * N; ++i) dyb[i] = mxfp8_bf16_to_fp32(dyh[i]);
            float *got = tu_alloc((size_t)N * sizeof(float));
            uint16_t *got16 = tu_alloc((size_t)N * sizeof(uint16_t));
            for (int nt = 1; nt <= 3; ++nt) {
                mxfp8_set_num_threads(nt);
                int64_t s2[2] = {M, N}, s1[1] = {N};
                mxfp8_tensor v = mxfp8_tensor_make(dy, MXFP8_DTYPE_F32, 2, s2);
                mxfp8_tensor o = mxfp8_tensor_make(got, MXFP8_DTYPE_F32, 1, s1);
                TU_CHECK(mxfp8_bias_grad(&v, &o) == MXFP8_OK, "F32 M %lld N %lld: %s", (long long)M, (long long)N,
                         mxfp8_last_error_message());
                for (int64_t n = 0; n < N; ++n)
                    TU_CHECK(tu_f32_bits(got[n]) == tu_f32_bits(oracle(dy, M, N, n)), "F32 M %lld N %lld n %lld nt %d",
                             (long long)M, (long long)N, (long long)n, nt);
                /* BF16 source as a transposed [M, N] view of an [N, M] buffer, BF16 output */
                uint16_t *tr = tu_alloc((size_t)(M * N + 1) * sizeof(uint16_t));
                for (int64_t m = 0; m < M; ++m)
                    for (int64_t n = 0; n < N; ++n) tr[n * M + m] = dyh[m * N + n];
                mxfp8_tensor vt = mxfp8_tensor_make(tr, MXFP8_DTYPE_BF16, 2, s2);
                vt.strides[0] = 1;
                vt.strides[1] = M;
                mxfp8_tensor oh = mxfp8_tensor_make(got16, MXFP8_DTYPE_BF16, 1, s1);
                TU_CHECK(mxfp8_bias_grad(&vt, &oh) == MXFP8_OK, "BF16: %s", mxfp8_last_error_message());
                for (int64_t n = 0; n < N; ++n)
                    TU_CHECK(got16[n] == mxfp8_fp32_to_bf16(oracle(dyb, M, N, n)), "BF16 M %lld N %lld n %lld nt %d",
                             (long long)M, (long long)N, (long long)n, nt);
                free(tr);
            }
            free(dy), free(dyh), free(dyb), free(got), free(got16);
        }
    mxfp8_set_num_threads(0);

    /* errors: status, and nothing written */
    float dy[6] = {1, 2, 3, 4, 5, 6}, out[4] = {-7, -7, -7, -7};
    int64_t s23[2] = {2, 3}, s2[1] = {2}, s3[1] = {3};
    mxfp8_tensor v = mxfp8_tensor_make(dy, MXFP8_DTYPE_F32, 2, s23);
    mxfp8_tensor o2 = mxfp8_tensor_make(out, MXFP8_DTYPE_F32, 1, s2);
    mxfp8_tensor o3 = mxfp8_tensor_make(out, MXFP8_DTYPE_F32, 1, s3);
    mxfp8_tensor alias = mxfp8_tensor_make(dy + 1, MXFP8_DTYPE_F32, 1, s3);
    mxfp8_tensor o3i = mxfp8_tensor_make(out, MXFP8_DTYPE_I32, 1, s3);
    mxfp8_tensor o3z = o3;
    o3z.strides[0] = 0;
    TU_CHECK(mxfp8_bias_grad(NULL, &o3) == MXFP8_ERR_NULL_POINTER, "NULL");
    TU_CHECK(mxfp8_bias_grad(&v, &o2) == MXFP8_ERR_SHAPE_MISMATCH, "length");
    TU_CHECK(strstr(mxfp8_last_error_message(), "N = 3") != NULL, "message: %s", mxfp8_last_error_message());
    TU_CHECK(mxfp8_bias_grad(&v, &o3i) == MXFP8_ERR_DTYPE, "dtype");
    TU_CHECK(mxfp8_bias_grad(&v, &o3z) == MXFP8_ERR_BAD_STRIDES, "zero stride");
    TU_CHECK(mxfp8_bias_grad(&v, &alias) == MXFP8_ERR_ALIASING, "alias");
    TU_CHECK(mxfp8_bias_grad(&o3, &o3) == MXFP8_ERR_SHAPE_MISMATCH, "rank");
    for (int i = 0; i < 4; ++i) TU_CHECK(out[i] == -7.0f, "written on error");
    TU_CHECK(mxfp8_bias_grad(&v, &o3) == MXFP8_OK && out[0] == 5 && out[1] == 7 && out[2] == 9 && out[3] == -7,
             "[[1,2,3],[4,5,6]]");
    return tu_finish("test_bias_grad");
}
