/*
 * test_numerics_gemm.c -- stochastic rounding and statistics of GEMM operands (mxfp8_gemm, mxfp8_matmul_backward),
 * against mxfp8_quantize (whose stochastic codes test_numerics.c checks against an oracle written from the spec):
 *   - a GEMM whose operand is rounded stochastically equals, bit for bit, the GEMM of that operand pre-quantized by
 *     mxfp8_quantize with the same seed, stream and logical index (plain, transposed and swizzled arrangements);
 *   - each operand's statistics equal mxfp8_quantize's statistics of the same quantization, bit for bit;
 *   - outputs do not change when statistics are collected; 1 and 2 threads give the same bits;
 *   - the matmul backward's four quantizations use the documented streams and indices: its dX and dW equal GEMMs of
 *     operands pre-quantized accordingly, and its four statistics equal mxfp8_quantize's.
 */
#include "testutil.h"

static void fill(float *x, int64_t n, tu_rng *r) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)((tu_uniform(r) * 2.0 - 1.0) * ldexp(1.0, (int)(i / 32 % 9) - 4));
}

/* Quantize x [R, C] along axis with (fmt, rounding, seed, stream): codes d [R, C], scales s (compact for the axis). */
static void quant(const float *x, int64_t R, int64_t C, int axis, mxfp8_format fmt, int sr, uint64_t seed,
                  uint64_t stream, uint8_t *d, uint8_t *s, mxfp8_quant_stats *st) {
    int64_t sh[2] = {R, C}, ss[2] = {R, C};
    ss[axis] = (sh[axis] + 31) / 32;
    mxfp8_tensor X = mxfp8_tensor_make((void *)x, MXFP8_DTYPE_F32, 2, sh);
    mxfp8_tensor D = mxfp8_tensor_make(d, fmt == MXFP8_FMT_E5M2 ? MXFP8_DTYPE_E5M2 : MXFP8_DTYPE_E4M3, 2, sh);
    mxfp8_tensor S = mxfp8_tensor_make(s, MXFP8_DTYPE_E8M0, 2, ss);
    mxfp8_quant_params p = mxfp8_quant_params_default();
    p.fmt = fmt;
    p.rounding = sr ? MXFP8_ROUND_STOCHASTIC : MXFP8_ROUND_NEAREST;
    p.seed = seed, p.stream = stream, p.stats = st;
    TU_CHECK(mxfp8_quantize(&X, axis, &p, &D, &S) == MXFP8_OK, "quantize: %s", mxfp8_last_error_message());
}

/* A 2-D view [r, c] of `data` with strides (s0, s1). */
static mxfp8_tensor view2(void *data, mxfp8_dtype dt, int64_t r, int64_t c, int64_t s0, int64_t s1) {
    int64_t sh[2] = {r, c};
    mxfp8_tensor t = mxfp8_tensor_make(data, dt, 2, sh);
    t.strides[0] = s0, t.strides[1] = s1;
    return t;
}

static int same_stats(const mxfp8_quant_stats *a, const mxfp8_quant_stats *b) { return !memcmp(a, b, sizeof *a); }

static void test_gemm_operands(void) {
    const int64_t M = 70, N = 45, K = 256;
    tu_rng rng = {5};
    float *a = tu_alloc((size_t)(M * K) * 4), *at = tu_alloc((size_t)(M * K) * 4), *b = tu_alloc((size_t)(N * K) * 4);
    fill(a, M * K, &rng);
    fill(b, N * K, &rng);
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) at[k * M + m] = a[m * K + k];
    float *c0 = tu_alloc((size_t)(M * N) * 4), *c1 = tu_alloc((size_t)(M * N) * 4);
    uint8_t *ad = tu_alloc((size_t)(M * K)), *as = tu_alloc((size_t)(M * K));
    const uint64_t seed = 0xABCDEF0123ull, stream = 9;
    mxfp8_matmul_config cfg;
    mxfp8_matmul_config_init(&cfg);
    mxfp8_quant_stats qa, qb, ga, gb;
    for (int f = 0; f < 2; f++) {
        cfg.float8_dtype = (mxfp8_format)f;
        /* the reference: A pre-quantized stochastically by mxfp8_quantize (index m*K + k), B quantized by the GEMM */
        uint8_t *bd = tu_alloc((size_t)(N * K)), *bs = tu_alloc((size_t)(N * K));
        quant(b, N, K, 1, (mxfp8_format)f, 0, 0, 0, bd, bs, &qb);
        quant(a, M, K, 1, (mxfp8_format)f, 1, seed, stream, ad, as, &qa);
        mxfp8_operand A, B;
        memset(&A, 0, sizeof A), memset(&B, 0, sizeof B);
        A.values = view2(ad, f ? MXFP8_DTYPE_E5M2 : MXFP8_DTYPE_E4M3, M, K, K, 1);
        A.scales = view2(as, MXFP8_DTYPE_E8M0, M, K / 32, K / 32, 1);
        B.values = view2(b, MXFP8_DTYPE_F32, N, K, K, 1);
        mxfp8_tensor C0 = view2(c0, MXFP8_DTYPE_F32, M, N, N, 1), C1 = view2(c1, MXFP8_DTYPE_F32, M, N, N, 1);
        TU_CHECK(mxfp8_gemm(&A, &B, &cfg, 0, &C0) == MXFP8_OK, "gemm (pre-quantized A): %s",
                 mxfp8_last_error_message());
        /* the same GEMM with A rounded stochastically on the fly: plain, transposed view, swizzled */
        for (int arr = 0; arr < 3; arr++)
            for (int nt = 1; nt <= 2; nt++) {
                mxfp8_set_num_threads(nt);
                float *sw = NULL;
                memset(&A, 0, sizeof A);
                if (arr == 0) A.values = view2(a, MXFP8_DTYPE_F32, M, K, K, 1);
                if (arr == 1) A.values = view2(at, MXFP8_DTYPE_F32, M, K, 1, M);
                if (arr == 2) { /* NKI's [K/4, 4M] arrangement of the [K, M] tensor */
                    sw = tu_alloc((size_t)(M * K) * 4);
                    mxfp8_tensor in = view2(at, MXFP8_DTYPE_F32, K, M, M, 1), out = view2(sw, MXFP8_DTYPE_F32, K / 4,
                                                                                          4 * M, 4 * M, 1);
                    TU_CHECK(mxfp8_swizzle_nki(&in, &out) == MXFP8_OK, "swizzle: %s", mxfp8_last_error_message());
                    A.values = out;
                    A.swizzled = 1;
                }
                A.rounding = MXFP8_ROUND_STOCHASTIC, A.seed = seed, A.stream = stream, A.stats = &ga;
                B.stats = &gb;
                memset(c1, 0xFF, (size_t)(M * N) * 4);
                TU_CHECK(mxfp8_gemm(&A, &B, &cfg, 0, &C1) == MXFP8_OK, "gemm (stochastic A): %s",
                         mxfp8_last_error_message());
                TU_CHECK(!memcmp(c0, c1, (size_t)(M * N) * 4),
                         "fmt %d arrangement %d, %d thread(s): the GEMM of A rounded stochastically differs from the "
                         "GEMM of A pre-quantized by mxfp8_quantize",
                         f, arr, nt);
                TU_CHECK(same_stats(&ga, &qa), "fmt %d arrangement %d: A's statistics differ from mxfp8_quantize's", f,
                         arr);
                TU_CHECK(same_stats(&gb, &qb), "fmt %d arrangement %d: B's statistics differ from mxfp8_quantize's", f,
                         arr);
                /* without statistics: the same output */
                A.stats = B.stats = NULL;
                memset(c1, 0xFF, (size_t)(M * N) * 4);
                TU_CHECK(mxfp8_gemm(&A, &B, &cfg, 0, &C1) == MXFP8_OK, "gemm: %s", mxfp8_last_error_message());
                TU_CHECK(!memcmp(c0, c1, (size_t)(M * N) * 4), "fmt %d arrangement %d: output changes without stats",
                         f, arr);
                free(sw);
            }
        free(bd), free(bs);
    }
    mxfp8_set_num_threads(0);
    free(a), free(at), free(b), free(c0), free(c1), free(ad), free(as);
}

/* matmul_mxfp8_backward with all three tensors rounded stochastically and statistics of its four quantizations. */
static void test_matmul_backward(void) {
    const int64_t M = 64, N = 96, K = 80;
    tu_rng rng = {17};
    float *dy = tu_alloc((size_t)(M * N) * 4), *w = tu_alloc((size_t)(N * K) * 4), *x = tu_alloc((size_t)(M * K) * 4);
    fill(dy, M * N, &rng);
    fill(w, N * K, &rng);
    fill(x, M * K, &rng);
    float *dx = tu_alloc((size_t)(M * K) * 4), *dw = tu_alloc((size_t)(N * K) * 4);
    float *rx = tu_alloc((size_t)(M * K) * 4), *rw = tu_alloc((size_t)(N * K) * 4);
    const uint64_t seed = 424242;
    const mxfp8_format f = MXFP8_FMT_E5M2;
    const mxfp8_dtype cd = MXFP8_DTYPE_E5M2;
    /* the four quantizations as documented: (tensor, axis, stream) = (dY, 1, 0), (W, 0, 1), (dY, 0, 2), (X, 0, 3) */
    uint8_t *c0 = tu_alloc((size_t)(M * N)), *s0 = tu_alloc((size_t)(M * N)), *c1 = tu_alloc((size_t)(N * K)),
            *s1 = tu_alloc((size_t)(N * K)), *c2 = tu_alloc((size_t)(M * N)), *s2 = tu_alloc((size_t)(M * N)),
            *c3 = tu_alloc((size_t)(M * K)), *s3 = tu_alloc((size_t)(M * K));
    mxfp8_quant_stats q[4], g[4];
    quant(dy, M, N, 1, f, 1, seed, 0, c0, s0, &q[0]);
    quant(w, N, K, 0, f, 1, seed, 1, c1, s1, &q[1]);
    quant(dy, M, N, 0, f, 1, seed, 2, c2, s2, &q[2]);
    quant(x, M, K, 0, f, 1, seed, 3, c3, s3, &q[3]);
    const int64_t GN = (N + 31) / 32, GM = (M + 31) / 32;
    mxfp8_matmul_config cfg;
    mxfp8_matmul_config_init(&cfg);
    cfg.float8_dtype = f;
    mxfp8_operand A, B;
    memset(&A, 0, sizeof A), memset(&B, 0, sizeof B);
    /* dX = dY [M, N] @ W: operands dY (codes along N) and W viewed [K, N] (codes along N: [N, K], scales [GN, K]) */
    A.values = view2(c0, cd, M, N, N, 1), A.scales = view2(s0, MXFP8_DTYPE_E8M0, M, GN, GN, 1);
    B.values = view2(c1, cd, K, N, 1, K), B.scales = view2(s1, MXFP8_DTYPE_E8M0, K, GN, 1, K);
    mxfp8_tensor RX = view2(rx, MXFP8_DTYPE_F32, M, K, K, 1), RW = view2(rw, MXFP8_DTYPE_F32, N, K, K, 1);
    TU_CHECK(mxfp8_gemm(&A, &B, &cfg, 0, &RX) == MXFP8_OK, "dX reference: %s", mxfp8_last_error_message());
    /* dW = dY^T @ X: dY^T [N, M] (codes along M: [M, N], scales [GM, N]) and X viewed [K, M] */
    A.values = view2(c2, cd, N, M, 1, N), A.scales = view2(s2, MXFP8_DTYPE_E8M0, N, GM, 1, N);
    B.values = view2(c3, cd, K, M, 1, K), B.scales = view2(s3, MXFP8_DTYPE_E8M0, K, GM, 1, K);
    TU_CHECK(mxfp8_gemm(&A, &B, &cfg, 0, &RW) == MXFP8_OK, "dW reference: %s", mxfp8_last_error_message());
    for (int nt = 1; nt <= 2; nt++) {
        mxfp8_set_num_threads(nt);
        mxfp8_matmul_bwd_args args;
        mxfp8_matmul_bwd_args_init(&args);
        args.output_grad = view2(dy, MXFP8_DTYPE_F32, M, N, N, 1);
        args.weights = view2(w, MXFP8_DTYPE_F32, N, K, K, 1);
        args.input_activation = view2(x, MXFP8_DTYPE_F32, M, K, K, 1);
        args.output_dtype = MXFP8_DTYPE_F32;
        args.output_grad_rounding = args.weights_rounding = args.input_rounding = MXFP8_ROUND_STOCHASTIC;
        args.rounding_seed = seed;
        args.stats = g;
        mxfp8_tensor DX = view2(dx, MXFP8_DTYPE_F32, M, K, K, 1), DW = view2(dw, MXFP8_DTYPE_F32, N, K, K, 1);
        TU_CHECK(mxfp8_matmul_backward(&args, &DX, &DW) == MXFP8_OK, "backward: %s", mxfp8_last_error_message());
        TU_CHECK(!memcmp(dx, rx, (size_t)(M * K) * 4), "%d thread(s): dX differs from the GEMM of the documented "
                 "stochastic quantizations", nt);
        TU_CHECK(!memcmp(dw, rw, (size_t)(N * K) * 4), "%d thread(s): dW differs from the GEMM of the documented "
                 "stochastic quantizations", nt);
        for (int i = 0; i < 4; i++)
            TU_CHECK(same_stats(&g[i], &q[i]), "%d thread(s): statistics %d differ from mxfp8_quantize's", nt, i);
        /* statistics off: the same outputs */
        args.stats = NULL;
        TU_CHECK(mxfp8_matmul_backward(&args, &DX, &DW) == MXFP8_OK, "backward: %s", mxfp8_last_error_message());
        TU_CHECK(!memcmp(dx, rx, (size_t)(M * K) * 4) && !memcmp(dw, rw, (size_t)(N * K) * 4),
                 "outputs change without statistics");
        /* a bad rounding value is rejected before anything is written */
        args.input_rounding = (mxfp8_rounding)7;
        TU_CHECK(mxfp8_matmul_backward(&args, &DX, &DW) == MXFP8_ERR_INVALID_ARGUMENT, "rounding 7 accepted");
    }
    mxfp8_set_num_threads(0);
    free(dy), free(w), free(x), free(dx), free(dw), free(rx), free(rw);
    free(c0), free(s0), free(c1), free(s1), free(c2), free(s2), free(c3), free(s3);
}

int main(void) {
    test_gemm_operands();
    test_matmul_backward();
    return tu_finish("test_numerics_gemm");
}
