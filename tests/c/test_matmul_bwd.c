/*
 * test_matmul_bwd.c -- mxfp8_matmul_backward and the GEMM entry's errors.
 *
 *  1. mxfp8_matmul_backward with dY high precision and pre-quantized (codes + compact scales), with the registry's
 *     kernel and every usable kernel forced, against the tests' independent oracle (tests/c/oracle/: each operand
 *     quantized along its contraction axis, the fmaf chain), and against the two mxfp8_gemm calls it stands for.
 *  2. Errors of mxfp8_gemm and mxfp8_matmul_backward: status codes, a message, and the outputs untouched.
 *  3. mxfp8_linear: mxfp8_matmul's F32 result plus the bias in one FP32 addition, rounded once to each output dtype;
 *     no bias = mxfp8_matmul; K = 0; its errors.
 */
#include "gemm_util.h"

static void test_errors(void) {
    float A[4 * 40], B[3 * 40], C[12];
    for (int i = 0; i < 160; i++) A[i] = 1;
    for (int i = 0; i < 120; i++) B[i] = 1;
    int64_t sa[2] = {4, 40}, sb[2] = {3, 40}, sc[2] = {4, 3}, sbad[2] = {3, 41};
    mxfp8_operand oa = {0}, ob = {0};
    oa.values = mxfp8_tensor_make(A, MXFP8_DTYPE_F32, 2, sa);
    ob.values = mxfp8_tensor_make(B, MXFP8_DTYPE_F32, 2, sb);
    mxfp8_tensor c = mxfp8_tensor_make(C, MXFP8_DTYPE_F32, 2, sc);
    for (int i = 0; i < 12; i++) C[i] = -7;
    struct { const char *what; mxfp8_status want; mxfp8_status got; } cases[8];
    int n = 0;
    cases[n].what = "NULL a"; cases[n].want = MXFP8_ERR_NULL_POINTER; cases[n++].got = mxfp8_gemm(NULL, &ob, NULL, 0, &c);
    mxfp8_operand obad = ob;
    obad.values = mxfp8_tensor_make(B, MXFP8_DTYPE_F32, 2, sbad);
    cases[n].what = "K mismatch"; cases[n].want = MXFP8_ERR_SHAPE_MISMATCH; cases[n++].got = mxfp8_gemm(&oa, &obad, NULL, 0, &c);
    mxfp8_tensor cbf = c;
    cbf.dtype = MXFP8_DTYPE_BF16;
    cases[n].what = "accumulate into bf16"; cases[n].want = MXFP8_ERR_DTYPE; cases[n++].got = mxfp8_gemm(&oa, &ob, NULL, 1, &cbf);
    mxfp8_tensor calias = mxfp8_tensor_make(A, MXFP8_DTYPE_F32, 2, sc);
    cases[n].what = "c aliases a"; cases[n].want = MXFP8_ERR_ALIASING; cases[n++].got = mxfp8_gemm(&oa, &ob, NULL, 0, &calias);
    mxfp8_matmul_config cfg;
    mxfp8_matmul_config_init(&cfg);
    cfg.tile_loop_order = (mxfp8_loop_order)9;
    cases[n].what = "bad loop order"; cases[n].want = MXFP8_ERR_INVALID_ARGUMENT; cases[n++].got = mxfp8_gemm(&oa, &ob, &cfg, 0, &c);
    mxfp8_matmul_config_init(&cfg);
    cfg.quant_scheme = MXFP8_GROUP_WRAPX;
    cases[n].what = "wrapX with K=40"; cases[n].want = MXFP8_ERR_UNSUPPORTED; cases[n++].got = mxfp8_gemm(&oa, &ob, &cfg, 0, &c);
    mxfp8_tensor cs = c;
    cs.strides[0] = 1;
    cases[n].what = "overlapping output strides"; cases[n].want = MXFP8_ERR_BAD_STRIDES; cases[n++].got = mxfp8_gemm(&oa, &ob, NULL, 0, &cs);
    mxfp8_operand oc = ob;
    oc.values.dtype = MXFP8_DTYPE_E5M2;
    cases[n].what = "codes without scales"; cases[n].want = MXFP8_ERR_NULL_POINTER; cases[n++].got = mxfp8_gemm(&oa, &oc, NULL, 0, &c);
    for (int i = 0; i < n; i++) {
        if (cases[i].got != cases[i].want) FAIL("%s: status %d, want %d", cases[i].what, cases[i].got, cases[i].want);
        else if (!*mxfp8_last_error_message()) FAIL("%s: no error message", cases[i].what);
    }
    for (int i = 0; i < 12; i++)
        if (C[i] != -7) { FAIL("an error call wrote the output"); break; }
}

/* mxfp8_matmul_backward == the two GEMMs it stands for (bitwise), and its errors leave the outputs untouched. */
static void test_backward(void) {
    int64_t M = 45, N = 70, K = 33;
    float *dy = malloc(sizeof(float) * M * N), *w = malloc(sizeof(float) * N * K), *x = malloc(sizeof(float) * M * K);
    float *dx = malloc(sizeof(float) * M * K), *dw = malloc(sizeof(float) * N * K);
    float *gx = malloc(sizeof(float) * M * K), *gw = malloc(sizeof(float) * N * K);
    for (int64_t i = 0; i < M * N; i++) dy[i] = nrand();
    for (int64_t i = 0; i < N * K; i++) w[i] = nrand();
    for (int64_t i = 0; i < M * K; i++) x[i] = nrand();
    int64_t s_dy[2] = {M, N}, s_w[2] = {N, K}, s_x[2] = {M, K};
    mxfp8_matmul_bwd_args args;
    mxfp8_matmul_bwd_args_init(&args);
    args.output_grad = mxfp8_tensor_make(dy, MXFP8_DTYPE_F32, 2, s_dy);
    args.weights = mxfp8_tensor_make(w, MXFP8_DTYPE_F32, 2, s_w);
    args.input_activation = mxfp8_tensor_make(x, MXFP8_DTYPE_F32, 2, s_x);
    args.output_dtype = MXFP8_DTYPE_F32;
    args.float8_dtype = MXFP8_FMT_E4M3;
    args.scale_rule = MXFP8_SCALE_RCEIL;
    mxfp8_tensor tdx = mxfp8_tensor_make(dx, MXFP8_DTYPE_F32, 2, s_x), tdw = mxfp8_tensor_make(dw, MXFP8_DTYPE_F32, 2, s_w);
    mxfp8_status st = mxfp8_matmul_backward(&args, &tdx, &tdw);
    if (st) FAIL("backward: status %d %s", st, mxfp8_last_error_message());
    /* the same as two GEMMs: dX = dY [M, N] . (W viewed [K, N]); dW = (dY viewed [N, M]) . (X viewed [K, M]) */
    mxfp8_matmul_config cfg;
    mxfp8_matmul_config_init(&cfg);
    cfg.float8_dtype = MXFP8_FMT_E4M3;
    cfg.scale_rule = MXFP8_SCALE_RCEIL;
    mxfp8_operand a = {0}, b = {0};
    a.values = args.output_grad;
    b.values = args.weights;
    b.values.shape[0] = K; b.values.shape[1] = N; b.values.strides[0] = 1; b.values.strides[1] = K;
    mxfp8_tensor tgx = mxfp8_tensor_make(gx, MXFP8_DTYPE_F32, 2, s_x), tgw = mxfp8_tensor_make(gw, MXFP8_DTYPE_F32, 2, s_w);
    if ((st = mxfp8_gemm(&a, &b, &cfg, 0, &tgx))) FAIL("gemm dX: %d", st);
    a.values.shape[0] = N; a.values.shape[1] = M; a.values.strides[0] = 1; a.values.strides[1] = N;
    b.values = args.input_activation;
    b.values.shape[0] = K; b.values.shape[1] = M; b.values.strides[0] = 1; b.values.strides[1] = K;
    if ((st = mxfp8_gemm(&a, &b, &cfg, 0, &tgw))) FAIL("gemm dW: %d", st);
    if (memcmp(dx, gx, sizeof(float) * M * K)) FAIL("backward dX differs from mxfp8_gemm");
    if (memcmp(dw, gw, sizeof(float) * N * K)) FAIL("backward dW differs from mxfp8_gemm");
    /* errors: status, message, outputs untouched */
    for (int64_t i = 0; i < M * K; i++) dx[i] = -3;
    for (int64_t i = 0; i < N * K; i++) dw[i] = -3;
    struct { const char *what; mxfp8_status want; } cs[8] = {
        {"input_grad aliases output_grad", MXFP8_ERR_ALIASING}, {"outputs overlap", MXFP8_ERR_ALIASING},
        {"output dtype != output_dtype", MXFP8_ERR_DTYPE}, {"float8_dtype 7", MXFP8_ERR_INVALID_ARGUMENT},
        {"bad phase loop order", MXFP8_ERR_INVALID_ARGUMENT}, {"phase config M mismatch", MXFP8_ERR_SHAPE_MISMATCH},
        {"weights K mismatch", MXFP8_ERR_SHAPE_MISMATCH}, {"scales with f32 operand", MXFP8_ERR_INVALID_ARGUMENT}};
    for (int c = 0; c < 8; c++) {
        mxfp8_matmul_bwd_args e = args;
        mxfp8_tensor ex = tdx, ew = tdw;
        mxfp8_matmul_config pc;
        mxfp8_matmul_config_init(&pc);
        uint8_t sc[64 * 8] = {0};
        int64_t s_sc[2] = {M, 3};
        switch (c) {
        case 0: ex = mxfp8_tensor_make(dy, MXFP8_DTYPE_F32, 2, s_x); break;
        case 1: ew = mxfp8_tensor_make(dx + 1, MXFP8_DTYPE_F32, 2, s_w); ew.shape[0] = 1; break;
        case 2: e.output_dtype = MXFP8_DTYPE_BF16; break;
        case 3: e.float8_dtype = (mxfp8_format)7; break;
        case 4: pc.tile_loop_order = (mxfp8_loop_order)6; e.input_grad_config = &pc; break;
        case 5: pc.M = M + 1; e.weight_grad_config = &pc; break;
        case 6: e.weights.shape[1] = K - 1; break;
        case 7: e.output_grad_scales = mxfp8_tensor_make(sc, MXFP8_DTYPE_U8, 2, s_sc); break;
        }
        if (c == 1) { /* weight_grad [1, K] overlapping input_grad: shapes must still agree, so N = 1 here */
            e.weights.shape[0] = 1;
            e.output_grad.shape[1] = 1;
        }
        st = mxfp8_matmul_backward(&e, &ex, &ew);
        if (st != cs[c].want) FAIL("backward error case '%s': status %d, want %d (%s)", cs[c].what, st, cs[c].want,
                                   mxfp8_last_error_message());
        else if (!*mxfp8_last_error_message()) FAIL("backward error case '%s': no message", cs[c].what);
    }
    for (int64_t i = 0; i < M * K; i++)
        if (dx[i] != -3) { FAIL("a failed backward call wrote input_grad"); break; }
    for (int64_t i = 0; i < N * K; i++)
        if (dw[i] != -3) { FAIL("a failed backward call wrote weight_grad"); break; }
    /* mixed precision: output_dtype BF16 with an F32 weight_grad: dX is the F32 result (gx, checked above) rounded
     * once to BF16, dW the F32 result itself; an F16 weight_grad, or an F32 input_grad, is still a DTYPE error */
    uint16_t *dx16 = malloc(sizeof(uint16_t) * M * K);
    mxfp8_matmul_bwd_args e = args;
    e.output_dtype = MXFP8_DTYPE_BF16;
    mxfp8_tensor t16 = mxfp8_tensor_make(dx16, MXFP8_DTYPE_BF16, 2, s_x);
    if ((st = mxfp8_matmul_backward(&e, &t16, &tdw))) FAIL("backward, BF16 dX and F32 dW: %d %s", st, mxfp8_last_error_message());
    for (int64_t i = 0; i < M * K; i++)
        if (dx16[i] != mxfp8_fp32_to_bf16(gx[i])) { FAIL("BF16 dX [%lld] is not the F32 result rounded", (long long)i); break; }
    if (memcmp(dw, gw, sizeof(float) * N * K)) FAIL("F32 dW beside a BF16 dX differs from the F32 result");
    uint16_t *dw16 = malloc(sizeof(uint16_t) * N * K);
    mxfp8_tensor t16w = mxfp8_tensor_make(dw16, MXFP8_DTYPE_F16, 2, s_w);
    for (int c = 0; c < 2; c++) {
        st = c == 0 ? mxfp8_matmul_backward(&e, &t16, &t16w) : mxfp8_matmul_backward(&e, &tdx, &tdw);
        if (st != MXFP8_ERR_DTYPE) FAIL("backward with %s: status %d, want DTYPE", c ? "an F32 dX" : "an F16 dW", st);
    }
    free(dx16); free(dw16);
    free(dy); free(w); free(x); free(dx); free(dw); free(gx); free(gw);
}

/* The oracle of mxfp8_matmul_backward: dX [M, K] = dY . W along N, dW [N, K] = dY^T . X along M, each operand
 * quantized along its contraction axis by the oracle; dyq (when not NULL) holds the values of a dY pre-quantized
 * along N, used as they are for dX and re-quantized along M for dW. */
static void bwd_oracle(const float *dy, const float *dyq, const float *w, const float *x, int64_t M, int64_t N,
                       int64_t K, int fmt, int rule, float *dx, float *dw) {
    const float *dv = dyq ? dyq : dy;
    float *qa = malloc(sizeof(float) * (size_t)(M * N)), *qb = malloc(sizeof(float) * (size_t)(K * N));
    for (int64_t m = 0; m < M; m++) {
        if (dyq) memcpy(qa + m * N, dyq + m * N, sizeof(float) * (size_t)N);
        else orc_qdq_line_f32(dy + m * N, 1, N, fmt, rule, 0, qa + m * N);
    }
    for (int64_t k = 0; k < K; k++) orc_qdq_line_f32(w + k, K, N, fmt, rule, 0, qb + k * N);
    orc_gemm_f32(qa, qb, M, K, N, dx, K);
    free(qa), free(qb);
    qa = malloc(sizeof(float) * (size_t)(N * M)), qb = malloc(sizeof(float) * (size_t)(K * M));
    for (int64_t n = 0; n < N; n++) orc_qdq_line_f32(dv + n, N, M, fmt, rule, 0, qa + n * M);
    for (int64_t k = 0; k < K; k++) orc_qdq_line_f32(x + k, K, M, fmt, rule, 0, qb + k * M);
    orc_gemm_f32(qa, qb, N, K, M, dw, K);
    free(qa), free(qb);
}

/* mxfp8_matmul_backward against the oracle, with dY high precision and pre-quantized (codes + compact scales), on
 * every usable kernel. */
static void test_backward_oracle(void) {
    const int64_t M = 45, N = 70, K = 33, G = (N + 31) / 32;
    float *dy = malloc(sizeof(float) * M * N), *w = malloc(sizeof(float) * N * K), *x = malloc(sizeof(float) * M * K);
    float *dyq = malloc(sizeof(float) * M * N), *ox = malloc(sizeof(float) * M * K);
    float *ow = malloc(sizeof(float) * N * K);
    float *dx = malloc(sizeof(float) * M * K), *dw = malloc(sizeof(float) * N * K);
    uint8_t *codes = malloc((size_t)(M * N)), *sc = malloc((size_t)(M * G));
    for (int64_t i = 0; i < M * N; i++) dy[i] = nrand();
    for (int64_t i = 0; i < N * K; i++) w[i] = nrand() * 0.1f;
    for (int64_t i = 0; i < M * K; i++) x[i] = nrand();
    const int fmt = MXFP8_FMT_E4M3, rule = MXFP8_SCALE_RCEIL;
    for (int64_t m = 0; m < M; m++) {
        double row[70];
        for (int64_t n = 0; n < N; n++) row[n] = dy[m * N + n];
        orc_quant_line(row, 1, N, fmt, rule, 0, codes + m * N, sc + m * G);
        for (int64_t n = 0; n < N; n++)
            dyq[m * N + n] = orc_f32(orc_dequant(codes[m * N + n], sc[m * G + n / 32], fmt));
    }
    const mxfp8i_ukernel *kernels[16];
    const int nk = gemm_kernels(kernels);
    int64_t s_dy[2] = {M, N}, s_w[2] = {N, K}, s_x[2] = {M, K}, s_sc[2] = {M, G};
    for (int pre = 0; pre < 2; pre++) {
        bwd_oracle(dy, pre ? dyq : NULL, w, x, M, N, K, fmt, rule, ox, ow);
        mxfp8_matmul_bwd_args args;
        mxfp8_matmul_bwd_args_init(&args);
        args.output_grad = pre ? mxfp8_tensor_make(codes, MXFP8_DTYPE_E4M3, 2, s_dy)
                               : mxfp8_tensor_make(dy, MXFP8_DTYPE_F32, 2, s_dy);
        if (pre) args.output_grad_scales = mxfp8_tensor_make(sc, MXFP8_DTYPE_E8M0, 2, s_sc);
        args.weights = mxfp8_tensor_make(w, MXFP8_DTYPE_F32, 2, s_w);
        args.input_activation = mxfp8_tensor_make(x, MXFP8_DTYPE_F32, 2, s_x);
        args.output_dtype = MXFP8_DTYPE_F32;
        args.float8_dtype = (mxfp8_format)fmt;
        args.scale_rule = (mxfp8_scale_rule)rule;
        for (int kk = 0; kk < nk; kk++) {
            mxfp8_tensor tdx = mxfp8_tensor_make(dx, MXFP8_DTYPE_F32, 2, s_x);
            mxfp8_tensor tdw = mxfp8_tensor_make(dw, MXFP8_DTYPE_F32, 2, s_w);
            if (kk) mxfp8i_force_ukernel(kernels[kk]);
            const char *kname = mxfp8i_gemm_ukernel()->name;
            mxfp8_status st = mxfp8_matmul_backward(&args, &tdx, &tdw);
            mxfp8i_force_ukernel(NULL);
            if (st) { FAIL("backward (%s, dY %s): status %d %s", kname, pre ? "pre-quantized" : "f32", st,
                           mxfp8_last_error_message()); continue; }
            if (memcmp(dx, ox, sizeof(float) * M * K)) FAIL("backward dX (%s, dY %s) differs from the oracle", kname,
                                                            pre ? "pre-quantized" : "f32");
            if (memcmp(dw, ow, sizeof(float) * N * K)) FAIL("backward dW (%s, dY %s) differs from the oracle", kname,
                                                            pre ? "pre-quantized" : "f32");
        }
    }
    free(dy); free(w); free(x); free(dyq); free(ox); free(ow); free(dx); free(dw); free(codes); free(sc);
}

/* mxfp8_linear = mxfp8_matmul into F32, + bias[n] (FP32), rounded once to the output's dtype (the library's codecs,
 * checked against ml_dtypes by the Python tests). */
static void test_linear(void) {
    const int64_t M = 37, N = 70, K = 45;
    uint16_t *x = malloc(2 * M * K), *y16 = malloc(2 * M * N), *b16 = malloc(2 * 2 * N);
    float *w = malloc(4 * N * K), *y32 = malloc(4 * M * N), *ref = malloc(4 * M * N), *yf = malloc(4 * M * N);
    float *b32 = malloc(4 * N);
    for (int64_t i = 0; i < M * K; i++) x[i] = mxfp8_fp32_to_bf16(nrand());
    for (int64_t i = 0; i < N * K; i++) w[i] = nrand();
    for (int64_t n = 0; n < N; n++) {
        b32[n] = n == 3 ? -0.0f : nrand() * 4; /* a -0 bias: chain + -0 */
        b16[2 * n] = mxfp8_fp32_to_bf16(b32[n]), b16[2 * n + 1] = 0x7FC0; /* strided BF16 copy, NaN between */
    }
    int64_t s_x[2] = {M, K}, s_w[2] = {N, K}, s_y[2] = {M, N}, s_b[1] = {N};
    mxfp8_operand a = {0}, b = {0};
    a.values = mxfp8_tensor_make(x, MXFP8_DTYPE_BF16, 2, s_x);
    b.values = mxfp8_tensor_make(w, MXFP8_DTYPE_F32, 2, s_w);
    mxfp8_matmul_config cfg;
    mxfp8_matmul_config_init(&cfg);
    cfg.float8_dtype = MXFP8_FMT_E4M3;
    mxfp8_tensor t32 = mxfp8_tensor_make(y32, MXFP8_DTYPE_F32, 2, s_y);
    mxfp8_tensor tf = mxfp8_tensor_make(yf, MXFP8_DTYPE_F32, 2, s_y);
    mxfp8_status st = mxfp8_matmul(&a, &b, &cfg, &t32);
    if (st) FAIL("matmul: %d %s", st, mxfp8_last_error_message());
    mxfp8_tensor bias32 = mxfp8_tensor_make(b32, MXFP8_DTYPE_F32, 1, s_b);
    mxfp8_tensor bias16 = mxfp8_tensor_make(b16, MXFP8_DTYPE_BF16, 1, s_b);
    bias16.strides[0] = 2;
    for (int bi = 0; bi < 2; bi++) {
        const mxfp8_tensor *bias = bi ? &bias16 : &bias32;
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                const float bv = bi ? mxfp8_bf16_to_fp32(b16[2 * n]) : b32[n];
                ref[m * N + n] = y32[m * N + n] + bv;
            }
        if ((st = mxfp8_linear(&a, &b, bias, &cfg, &tf))) FAIL("linear F32: %d %s", st, mxfp8_last_error_message());
        if (memcmp(yf, ref, 4 * M * N)) FAIL("linear F32 (bias %d) is not the matmul + bias", bi);
        for (int dt = 0; dt < 2; dt++) {
            mxfp8_tensor t16 = mxfp8_tensor_make(y16, dt ? MXFP8_DTYPE_F16 : MXFP8_DTYPE_BF16, 2, s_y);
            if ((st = mxfp8_linear(&a, &b, bias, &cfg, &t16)))
                FAIL("linear 16-bit: %d %s", st, mxfp8_last_error_message());
            for (int64_t i = 0; i < M * N; i++) {
                const uint16_t want = dt ? mxfp8_fp32_to_fp16(ref[i]) : mxfp8_fp32_to_bf16(ref[i]);
                if (y16[i] != want) {
                    FAIL("linear %s (bias %d) [%lld] not rounded once from matmul + bias", dt ? "F16" : "BF16", bi,
                         (long long)i);
                    break;
                }
            }
        }
    }
    /* no bias (NULL or an absent view): mxfp8_matmul's bits, -0 sums included */
    mxfp8_tensor none = {0};
    for (int c = 0; c < 2; c++) {
        if ((st = mxfp8_linear(&a, &b, c ? &none : NULL, &cfg, &tf))) FAIL("linear without bias: %d", st);
        if (memcmp(yf, y32, 4 * M * N))
            FAIL("linear without bias (%s) differs from mxfp8_matmul", c ? "absent view" : "NULL");
    }
    /* K = 0: +0 + bias */
    int64_t s_x0[2] = {M, 0}, s_w0[2] = {N, 0};
    mxfp8_operand a0 = a, b0 = b;
    a0.values = mxfp8_tensor_make(x, MXFP8_DTYPE_BF16, 2, s_x0);
    b0.values = mxfp8_tensor_make(w, MXFP8_DTYPE_F32, 2, s_w0);
    if ((st = mxfp8_linear(&a0, &b0, &bias32, &cfg, &tf))) FAIL("linear K = 0: %d %s", st, mxfp8_last_error_message());
    for (int64_t i = 0; i < M * N; i++)
        if (memcmp(&yf[i], &(float){0.0f + b32[i % N]}, 4)) {
            FAIL("linear K = 0 [%lld] is not +0 + bias", (long long)i);
            break;
        }
    /* errors: status, a message, the output untouched */
    for (int64_t i = 0; i < M * N; i++) yf[i] = -5;
    int64_t s_b2[2] = {1, N}, s_b1[1] = {N + 1}, s_bo[1] = {N};
    mxfp8_tensor e_rank = mxfp8_tensor_make(b32, MXFP8_DTYPE_F32, 2, s_b2);
    mxfp8_tensor e_len = mxfp8_tensor_make(b32, MXFP8_DTYPE_F32, 1, s_b1);
    mxfp8_tensor e_dt = mxfp8_tensor_make(b16, MXFP8_DTYPE_U8, 1, s_b);
    mxfp8_tensor e_alias = mxfp8_tensor_make(yf + 5, MXFP8_DTYPE_F32, 1, s_bo);
    struct { const char *what; const mxfp8_tensor *bias; mxfp8_status want; } cs[4] = {
        {"bias of rank 2", &e_rank, MXFP8_ERR_SHAPE_MISMATCH}, {"bias of N + 1", &e_len, MXFP8_ERR_SHAPE_MISMATCH},
        {"bias of u8", &e_dt, MXFP8_ERR_DTYPE}, {"bias overlapping the output", &e_alias, MXFP8_ERR_ALIASING}};
    for (int c = 0; c < 4; c++) {
        size_t bytes = 1;
        if ((st = mxfp8_linear(&a, &b, cs[c].bias, &cfg, &tf)) != cs[c].want)
            FAIL("linear error '%s': status %d, want %d", cs[c].what, st, cs[c].want);
        else if (!*mxfp8_last_error_message()) FAIL("linear error '%s': no message", cs[c].what);
        if (mxfp8_linear_validate(&a, &b, cs[c].bias, &cfg, &tf, &bytes) != cs[c].want || bytes != 0)
            FAIL("linear_validate '%s': not the call's status, or bytes not 0", cs[c].what);
    }
    for (int64_t i = 0; i < M * N; i++)
        if (yf[i] != -5) { FAIL("a failed linear call wrote the output"); break; }
    size_t bytes = 0;
    if (mxfp8_linear_validate(&a, &b, &bias16, &cfg, &tf, &bytes) || bytes == 0) FAIL("linear_validate: no bytes");
    free(x); free(y16); free(b16); free(w); free(y32); free(ref); free(yf); free(b32);
}

int main(void) {
    test_errors();
    test_linear();
    test_backward();
    test_backward_oracle();
    if (failures) {
        printf("test_matmul_bwd: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_matmul_bwd: ok\n");
    return 0;
}
