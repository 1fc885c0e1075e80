/*
 * test_moe_edges.c -- blockwise MoE edge cases, each against the tests' independent FP64 oracle (tests/c/oracle/moe.c)
 * and the library's quantized golden: an expert with no tokens, block sizes 1, 32, 100, no tokens at all, both padding
 * conventions, E = 1 dense with num_valid_tokens, accumulate_hidden_states_grad / skip_grad_initialization; and bad
 * input (the right status, a message, every output untouched).
 */
#include "moe_util.h"

/* Fill every gradient with a byte pattern, call, expect `want` and the pattern intact. */
static void expect_error(const mxfp8_moe_bwd_args *A, const prob *P, int bias, mxfp8_status want, const char *what) {
    grads k;
    grads_make(&k, P, MXFP8_DTYPE_F32, bias);
    for (int i = 0; i < 6; i++) memset(k.p[i], 0xA5, k.n[i] * 4);
    mxfp8_status st = mxfp8_moe_backward(A, &k.g);
    CHECK(st == want, "%s: got status %d (%s), want %d", what, (int)st, mxfp8_last_error_message(), (int)want);
    CHECK(strlen(mxfp8_last_error_message()) > 10, "%s: no message", what);
    for (int i = 0; i < 6; i++)
        for (size_t j = 0; j < k.n[i] * 4; j++)
            if (((uint8_t *)k.p[i])[j] != 0xA5) {
                CHECK(0, "%s: %s was written", what, GNAME[i]);
                break;
            }
    grads_free(&k);
}

static void test_errors(void) {
    prob P;
    prob_make(&P, 20, 32, 16, 3, 2, 8, 1, NULL);
    mxfp8_moe_config cfg;
    mxfp8_moe_config_init(&cfg);
    mxfp8_moe_bwd_args A;
    bwd_args(&P, &cfg, &A);
    int32_t save = P.tok[3];
    P.tok[3] = -2;
    expect_error(&A, &P, 0, MXFP8_ERR_INDEX_OUT_OF_RANGE, "token id -2");
    P.tok[3] = (int32_t)P.T;
    expect_error(&A, &P, 0, MXFP8_ERR_INDEX_OUT_OF_RANGE, "token id T with skip_token");
    P.tok[3] = (int32_t)P.T + 1;
    expect_error(&A, &P, 0, MXFP8_ERR_INDEX_OUT_OF_RANGE, "token id T+1");
    cfg.skip_token = 0;
    P.tok[3] = -1;
    expect_error(&A, &P, 0, MXFP8_ERR_INDEX_OUT_OF_RANGE, "token id -1 without skip_token");
    P.tok[3] = (int32_t)P.T + 1;
    expect_error(&A, &P, 0, MXFP8_ERR_INDEX_OUT_OF_RANGE, "token id T+1 without skip_token");
    cfg.skip_token = 1;
    P.tok[3] = save;
    P.b2e[1] = (int32_t)P.E;
    expect_error(&A, &P, 0, MXFP8_ERR_INDEX_OUT_OF_RANGE, "expert id E");
    P.b2e[1] = -1;
    expect_error(&A, &P, 0, MXFP8_ERR_INDEX_OUT_OF_RANGE, "expert id -1");
    P.b2e[1] = 0;
    mxfp8_moe_bwd_args C = A;
    C.output_hidden_states_grad = v2(P.dY, MXFP8_DTYPE_F32, P.T, P.H - 1);
    expect_error(&C, &P, 0, MXFP8_ERR_SHAPE_MISMATCH, "dY shape");
    C = A;
    C.down_proj_weight = v3(P.W2, MXFP8_DTYPE_F32, P.E, P.I - 1, P.H);
    expect_error(&C, &P, 0, MXFP8_ERR_SHAPE_MISMATCH, "W2 shape");
    C = A;
    C.expert_affinities_masked = v2(P.a, MXFP8_DTYPE_F32, P.T * P.E - 1, 1);
    expect_error(&C, &P, 0, MXFP8_ERR_SHAPE_MISMATCH, "affinity shape");
    C = A;
    C.token_position_to_id = v1(P.tok, MXFP8_DTYPE_I32, P.N * P.B - 1);
    expect_error(&C, &P, 0, MXFP8_ERR_SHAPE_MISMATCH, "token_position_to_id length");
    C = A;
    C.block_to_expert = v2(P.b2e, MXFP8_DTYPE_I32, P.N - 1, 1);
    expect_error(&C, &P, 0, MXFP8_ERR_SHAPE_MISMATCH, "block_to_expert length");
    C = A;
    C.block_size = 0;
    expect_error(&C, &P, 0, MXFP8_ERR_INVALID_ARGUMENT, "block_size 0");
    C = A;
    C.hidden_states = v2(P.X, MXFP8_DTYPE_I32, P.T, P.H);
    expect_error(&C, &P, 0, MXFP8_ERR_DTYPE, "hidden_states dtype");
    int32_t nvt = 5;
    C = A;
    C.num_valid_tokens = v1(&nvt, MXFP8_DTYPE_I32, 1);
    expect_error(&C, &P, 0, MXFP8_ERR_INVALID_ARGUMENT, "num_valid_tokens without single_expert_dense");
    C = A;
    mxfp8_moe_config c2 = cfg;
    c2.gate_clamp_lower = NAN;
    C.config = &c2;
    expect_error(&C, &P, 0, MXFP8_ERR_INVALID_ARGUMENT, "NaN clamp");
    c2 = cfg;
    c2.activation = (mxfp8_activation)7;
    expect_error(&C, &P, 0, MXFP8_ERR_INVALID_ARGUMENT, "activation 7");
    c2 = cfg;
    c2.phase3.quant_scheme = MXFP8_GROUP_WRAPX;
    expect_error(&C, &P, 0, MXFP8_ERR_UNSUPPORTED, "wrapX phase");
    c2 = cfg;
    C.gate_and_up_proj_bias = v3(P.b1, MXFP8_DTYPE_F32, P.E, 2, P.I);
    expect_error(&C, &P, 0, MXFP8_ERR_INVALID_ARGUMENT, "bias tensor with bias = 0");
    C = A;
    c2 = cfg;
    c2.bias = 1;
    C.config = &c2;
    expect_error(&C, &P, 0, MXFP8_ERR_NULL_POINTER, "bias = 1 without bias grads");
    /* aliasing: hidden_states_grad on top of hidden_states */
    {
        grads k;
        grads_make(&k, &P, MXFP8_DTYPE_F32, 0);
        k.g.hidden_states_grad = v2(P.X, MXFP8_DTYPE_F32, P.T, P.H);
        CHECK(mxfp8_moe_backward(&A, &k.g) == MXFP8_ERR_ALIASING, "aliasing: %s", mxfp8_last_error_message());
        k.g.hidden_states_grad = v2(k.p[2], MXFP8_DTYPE_F32, P.T, P.H); /* overlaps the weight grad */
        CHECK(mxfp8_moe_backward(&A, &k.g) == MXFP8_ERR_ALIASING, "output aliasing: %s", mxfp8_last_error_message());
        grads_free(&k);
    }
    CHECK(mxfp8_moe_backward(NULL, NULL) == MXFP8_ERR_NULL_POINTER, "NULL args");
    /* the forward validates the same way and leaves output and checkpoints untouched */
    {
        float *out = xc(4 * P.T * P.H), *gu = xc(4 * P.N * 2 * P.I * P.B);
        memset(out, 0xA5, 4 * P.T * P.H);
        memset(gu, 0xA5, 4 * P.N * 2 * P.I * P.B);
        mxfp8_moe_fwd_args F;
        fwd_args(&P, &cfg, &F);
        mxfp8_moe_fwd_outputs O = {0};
        O.output = v2(out, MXFP8_DTYPE_F32, P.T, P.H);
        O.gate_up_proj_act_checkpoint_T = v4(gu, MXFP8_DTYPE_F32, P.N, 2, P.I, P.B);
        P.tok[5] = (int32_t)P.T + 3;
        CHECK(mxfp8_moe_forward(&F, &O) == MXFP8_ERR_INDEX_OUT_OF_RANGE, "forward bad token: %s",
              mxfp8_last_error_message());
        P.tok[5] = -1;
        O.gate_up_proj_act_checkpoint_T = v4(gu, MXFP8_DTYPE_F32, P.N, 2, P.I, P.B + 1);
        CHECK(mxfp8_moe_forward(&F, &O) == MXFP8_ERR_SHAPE_MISMATCH, "forward checkpoint shape");
        O.gate_up_proj_act_checkpoint_T = v4(P.X, MXFP8_DTYPE_F32, 1, 2, 1, 1);
        CHECK(mxfp8_moe_forward(&F, &O) == MXFP8_ERR_SHAPE_MISMATCH || mxfp8_moe_forward(&F, &O) == MXFP8_ERR_ALIASING,
              "forward checkpoint on an input");
        O.gate_up_proj_act_checkpoint_T = v4(gu, MXFP8_DTYPE_F32, P.N, 2, P.I, P.B);
        O.output = v2(P.X, MXFP8_DTYPE_F32, P.T, P.H);
        CHECK(mxfp8_moe_forward(&F, &O) == MXFP8_ERR_ALIASING, "forward output aliases hidden_states");
        int bad = 0;
        for (size_t i = 0; i < (size_t)(4 * P.T * P.H); i++) bad |= ((uint8_t *)out)[i] != 0xA5;
        for (size_t i = 0; i < (size_t)(4 * P.N * 2 * P.I * P.B); i++) bad |= ((uint8_t *)gu)[i] != 0xA5;
        CHECK(!bad, "forward wrote an output on error");
        free(out);
        free(gu);
    }
    prob_free(&P);
}

/* dense + num_valid_tokens with a scaled-intermediate checkpoint or bias: unsupported; a negative count: invalid */
static void test_dense_errors(void) {
    prob P;
    prob_make(&P, 32, 32, 16, 1, 1, 16, 1, NULL);
    mxfp8_moe_config cfg;
    mxfp8_moe_config_init(&cfg);
    cfg.single_expert_dense = 1;
    mxfp8_moe_bwd_args A, C;
    bwd_args(&P, &cfg, &A);
    int32_t nvt = 5;
    A.num_valid_tokens = v1(&nvt, MXFP8_DTYPE_I32, 1);
    float *si = xc(4 * P.N * P.I * P.B);
    C = A;
    C.scaled_intermediate_checkpoint_T = v3(si, MXFP8_DTYPE_F32, P.N, P.I, P.B);
    expect_error(&C, &P, 0, MXFP8_ERR_UNSUPPORTED, "num_valid_tokens + scaled checkpoint");
    cfg.bias = 1;
    expect_error(&A, &P, 1, MXFP8_ERR_UNSUPPORTED, "num_valid_tokens + bias");
    cfg.bias = 0;
    nvt = -1;
    expect_error(&A, &P, 0, MXFP8_ERR_INVALID_ARGUMENT, "negative num_valid_tokens");
    free(si);
    prob_free(&P);
}

static void run_vs_golden(prob *P, mxfp8_moe_config *cfg, const char *what, grads *keep) {
    mxfp8_moe_bwd_args A;
    bwd_args(P, cfg, &A);
    grads k, gq;
    grads_make(&k, P, MXFP8_DTYPE_F32, cfg->bias);
    grads_make(&gq, P, MXFP8_DTYPE_F64, cfg->bias);
    CHECK(mxfp8_moe_backward(&A, &k.g) == MXFP8_OK, "%s: %s", what, mxfp8_last_error_message());
    check_vs_oracle(&k, P, cfg, what);
    CHECK(mxfp8_moe_backward_golden(&A, &gq.g, 1) == MXFP8_OK, "%s golden: %s", what, mxfp8_last_error_message());
    double r = grads_relerr(&k, &gq, cfg->bias, NULL);
    CHECK(r <= 1e-4, "%s: kernel vs quantized golden %.3g (%s)", what, r, GNAME[g_worst_grad]);
    CHECK(grads_finite(&k, cfg->bias), "%s: non-finite gradient", what);
    if (keep) *keep = k;
    else grads_free(&k);
    grads_free(&gq);
}

/* An expert with no tokens: counts [44, 0, 20], B = 32 and 64; its gradients and the unrouted affinities are 0. */
static void test_empty_expert(void) {
    mxfp8_moe_config cfg;
    mxfp8_moe_config_init(&cfg);
    const int64_t counts[3] = {44, 0, 20};
    for (int bi = 0; bi < 2; bi++) {
        prob P;
        prob_make(&P, 64, 40, 24, 3, 1, bi ? 64 : 32, 1, counts);
        grads k;
        cfg.bias = 1;
        run_vs_golden(&P, &cfg, bi ? "counts [44,0,20] B=64" : "counts [44,0,20] B=32", &k);
        const size_t w1 = (size_t)(P.H * 2 * P.I), w2 = (size_t)(P.I * P.H);
        for (size_t i = 0; i < w1; i++) CHECK(((float *)k.p[2])[w1 + i] == 0.0f, "empty expert dW1 != 0");
        for (size_t i = 0; i < w2; i++) CHECK(((float *)k.p[3])[w2 + i] == 0.0f, "empty expert dW2 != 0");
        for (int64_t i = 0; i < 2 * P.I; i++) CHECK(((float *)k.p[4])[2 * P.I + i] == 0.0f, "empty expert db1");
        for (int64_t t = 0; t < P.T; t++) CHECK(((float *)k.p[1])[t * 3 + 1] == 0.0f, "unrouted da != 0");
        grads_free(&k);
        cfg.bias = 0;
        prob_free(&P);
    }
}

/* B = 1, 32, 100; and T = 0 (E - 1 padding-only blocks). */
static void test_block_sizes(void) {
    mxfp8_moe_config cfg;
    mxfp8_moe_config_init(&cfg);
    const int64_t Bs[3] = {1, 32, 100};
    for (int i = 0; i < 3; i++) {
        prob P;
        prob_make(&P, 50, 33, 17, 4, 2, Bs[i], 1, NULL);
        char what[32];
        snprintf(what, sizeof what, "B = %lld", (long long)Bs[i]);
        run_vs_golden(&P, &cfg, what, NULL);
        prob_free(&P);
    }
    {
        prob P;
        prob_make(&P, 0, 32, 16, 3, 1, 16, 1, NULL);
        CHECK(P.N == 2, "T = 0: N = %lld", (long long)P.N);
        grads k;
        run_vs_golden(&P, &cfg, "T = 0", &k);
        for (size_t i = 0; i < k.n[2]; i++) CHECK(((float *)k.p[2])[i] == 0.0f, "T = 0: dW1 != 0");
        grads_free(&k);
        prob_free(&P);
    }
}

/* Padding conventions: the same routing with padding -1 (skip_token) and T gives identical gradients; with extra
 * all-padding blocks (K = 1 of E = 4 leaves leftover blocks). */
static void test_padding(void) {
    mxfp8_moe_config cfg;
    mxfp8_moe_config_init(&cfg);
    {
        prob P;
        prob_make(&P, 24, 40, 24, 4, 1, 16, 1, NULL);
        grads k1, k2;
        run_vs_golden(&P, &cfg, "padding -1", &k1);
        for (int64_t i = 0; i < P.N * P.B; i++)
            if (P.tok[i] == -1) P.tok[i] = (int32_t)P.T;
        cfg.skip_token = 0;
        run_vs_golden(&P, &cfg, "padding T", &k2);
        cfg.skip_token = 1;
        grads_bitwise(&k1, &k2, 0, "padding -1 vs T");
        int allpad = 0;
        for (int64_t n = 0; n < P.N; n++) {
            int any = 0;
            for (int64_t q = 0; q < P.B; q++) any |= P.tok[n * P.B + q] != (int32_t)P.T;
            allpad += !any;
        }
        CHECK(allpad >= 1, "expected padding-only blocks (got %d)", allpad);
        grads_free(&k1); grads_free(&k2);
        prob_free(&P);
    }
}

/* E = 1 dense with num_valid_tokens == explicit routing of the first V tokens; rows past V are zero. */
static void test_dense(void) {
    mxfp8_moe_config cfg;
    mxfp8_moe_config_init(&cfg);
    {
        prob P;
        prob_make(&P, 50, 40, 24, 1, 1, 16, 1, NULL);
        mxfp8_moe_config d;
        mxfp8_moe_config_init(&d);
        d.single_expert_dense = 1;
        int32_t V = 37;
        mxfp8_moe_bwd_args A;
        bwd_args(&P, &d, &A);
        A.num_valid_tokens = v1(&V, MXFP8_DTYPE_I32, 1);
        grads k1, k2, k3;
        grads_make(&k1, &P, MXFP8_DTYPE_F32, 0);
        for (size_t i = 0; i < k1.n[0]; i++) ((float *)k1.p[0])[i] = 7.0f;
        for (size_t i = 0; i < k1.n[1]; i++) ((float *)k1.p[1])[i] = 7.0f;
        CHECK(mxfp8_moe_backward(&A, &k1.g) == MXFP8_OK, "dense nvt: %s", mxfp8_last_error_message());
        for (int64_t t = V; t < P.T; t++) {
            CHECK(((float *)k1.p[1])[t] == 0.0f, "dense: da[%lld] past the count not zero", (long long)t);
            for (int64_t h = 0; h < P.H; h++)
                CHECK(((float *)k1.p[0])[t * P.H + h] == 0.0f, "dense: dX row %lld past the count not zero",
                      (long long)t);
        }
        int64_t N = (P.T + P.B - 1) / P.B;
        int32_t *tok = xc(4 * N * P.B), *be = xc(4 * N);
        for (int64_t i = 0; i < N * P.B; i++) tok[i] = i < V ? (int32_t)i : -1;
        mxfp8_moe_bwd_args R;
        bwd_args(&P, &cfg, &R);
        R.token_position_to_id = v1(tok, MXFP8_DTYPE_I32, N * P.B);
        R.block_to_expert = v1(be, MXFP8_DTYPE_I32, N);
        grads_make(&k2, &P, MXFP8_DTYPE_F32, 0);
        CHECK(mxfp8_moe_backward(&R, &k2.g) == MXFP8_OK, "explicit routing: %s", mxfp8_last_error_message());
        grads_bitwise(&k1, &k2, 0, "dense + num_valid_tokens vs explicit routing");
        {
            prob R2 = P;
            R2.tok = tok, R2.b2e = be, R2.N = N;
            check_vs_oracle(&k2, &R2, &cfg, "dense + num_valid_tokens (as explicit routing)");
        }
        /* num_valid_tokens above T clamps to T == no count */
        V = 1000;
        grads_make(&k3, &P, MXFP8_DTYPE_F32, 0);
        CHECK(mxfp8_moe_backward(&A, &k3.g) == MXFP8_OK, "dense nvt > T: %s", mxfp8_last_error_message());
        A.num_valid_tokens = MXFP8_TENSOR_NONE;
        CHECK(mxfp8_moe_backward(&A, &k2.g) == MXFP8_OK, "dense: %s", mxfp8_last_error_message());
        grads_bitwise(&k3, &k2, 0, "num_valid_tokens > T vs absent");
        grads_free(&k1); grads_free(&k2); grads_free(&k3);
        free(tok); free(be);
        prob_free(&P);
    }
}

int mxfp8i_moe_set_expert_parallel(int mode); /* src/ops/moe/moe.h (test-only: -1 auto, 0 never, 1 always) */

/* accumulate_hidden_states_grad / skip_grad_initialization add into the given buffers (one FP32 addition, then the
 * rounding to the gradient's dtype): F32 and BF16 gradients, on the serial walk and on the expert-parallel path
 * (2 threads), against the fresh F32 gradients plus the given values (BF16: the oracle's nearest-even BF16 of that
 * FP32 sum). */
static float given_at(const grads *G, int j, size_t i) {
    return G->dt == MXFP8_DTYPE_BF16 ? (float)orc_bf16_value(((uint16_t *)G->p[j])[i]) : ((float *)G->p[j])[i];
}
static void test_accumulate(void) {
    mxfp8_moe_config cfg;
    mxfp8_moe_config_init(&cfg);
    prob P;
    prob_make(&P, 30, 40, 24, 3, 2, 16, 1, NULL);
    mxfp8_moe_config c2 = cfg;
    c2.bias = 1;
    mxfp8_moe_bwd_args A;
    bwd_args(&P, &c2, &A);
    grads k1;
    grads_make(&k1, &P, MXFP8_DTYPE_F32, 1);
    CHECK(mxfp8_moe_backward(&A, &k1.g) == MXFP8_OK, "fresh: %s", mxfp8_last_error_message());
    check_vs_oracle(&k1, &P, &c2, "bias, ON_I, fresh gradients");
    for (int v = 0; v < 4; v++) {
        const mxfp8_dtype dt = v & 1 ? MXFP8_DTYPE_BF16 : MXFP8_DTYPE_F32;
        const int par = v >> 1;
        grads k0, k2;
        grads_make(&k0, &P, dt, 1);
        grads_make(&k2, &P, dt, 1);
        for (int j = 0; j < 6; j++)
            for (size_t i = 0; i < k2.n[j]; i++) {
                const float x = (float)uni(-1, 1);
                if (dt == MXFP8_DTYPE_BF16) ((uint16_t *)k2.p[j])[i] = orc_bf16_encode(x);
                else ((float *)k2.p[j])[i] = x;
            }
        for (int j = 0; j < 6; j++) memcpy(k0.p[j], k2.p[j], k2.n[j] * mxfp8_dtype_size(dt));
        mxfp8_moe_config c3 = c2;
        c3.accumulate_hidden_states_grad = 1;
        c3.skip_grad_initialization = 1;
        A.config = &c3;
        mxfp8i_moe_set_expert_parallel(par);
        mxfp8_set_num_threads(par ? 2 : 0);
        CHECK(mxfp8_moe_backward(&A, &k2.g) == MXFP8_OK, "accumulate: %s", mxfp8_last_error_message());
        mxfp8_set_num_threads(0);
        mxfp8i_moe_set_expert_parallel(-1);
        for (int j = 0; j < 6; j++) {
            int bad = 0;
            for (size_t i = 0; i < k2.n[j] && !bad; i++) {
                const float fresh = ((float *)k1.p[j])[i], want = j == 1 ? fresh : given_at(&k0, j, i) + fresh;
                bad = dt == MXFP8_DTYPE_BF16 ? ((uint16_t *)k2.p[j])[i] != orc_bf16_encode(want)
                                             : given_at(&k2, j, i) != want;
            }
            CHECK(!bad, "accumulate (%s, %s path): %s is not given + grad (affinity grad is overwritten)",
                  dt == MXFP8_DTYPE_BF16 ? "BF16" : "F32", par ? "expert-parallel" : "serial", GNAME[j]);
        }
        grads_free(&k0);
        grads_free(&k2);
    }
    grads_free(&k1);
    prob_free(&P);
}

int main(void) {
    test_errors();
    test_dense_errors();
    test_empty_expert();
    test_block_sizes();
    test_padding();
    test_dense();
    test_accumulate();
    if (g_fail) {
        printf("test_moe_edges: %d failure(s)\n", g_fail);
        return 1;
    }
    printf("test_moe_edges: all MoE edge tests passed\n");
    return 0;
}
