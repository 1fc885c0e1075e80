/*
 * test_moe.c -- blockwise MoE: router, forward, backward, checked first against the tests' independent FP64 oracle
 * (tests/c/oracle/moe.c: its own activations, clamp masks, affinity options, biases, routing and quantizer), with the
 * library's FP64 golden references as a second opinion, and against themselves where the contract promises bitwise
 * equality (checkpoints vs recomputing, pre-quantized vs on-the-fly weights, BF16 vs F32 inputs of the same values,
 * 1 vs 2 threads). Edge cases and bad input: test_moe_edges.c. The numpy oracle of tests/python/moe_oracle.py is a
 * third opinion.
 */
#include "moe_util.h"

/* ======================================================================================================== */
static void test_route(void) {
    /* expert token counts [44, 0, 20], K = 1, B = 32 and 64 */
    const int64_t counts[3] = {44, 0, 20};
    for (int bi = 0; bi < 2; bi++) {
        int64_t B = bi ? 64 : 32;
        prob P;
        prob_make(&P, 64, 8, 8, 3, 1, B, 1, counts);
        int64_t want_N = (64 - 2 + B - 1) / B + 2;
        CHECK(P.N == want_N, "route B=%lld: N = %lld, want %lld", (long long)B, (long long)P.N, (long long)want_N);
        /* expert 0 blocks first: tokens 0..43 ascending; then expert 2: tokens 44..63 */
        int64_t nb0 = (44 + B - 1) / B, nb2 = (20 + B - 1) / B;
        for (int64_t n = 0; n < P.N; n++) {
            int want_e = n < nb0 ? 0 : 2;
            CHECK(P.b2e[n] == want_e, "route B=%lld: block %lld expert %d want %d", (long long)B, (long long)n,
                  P.b2e[n], want_e);
        }
        for (int64_t q = 0; q < nb0 * B; q++)
            CHECK(P.tok[q] == (q < 44 ? q : -1), "route: position %lld holds %d", (long long)q, P.tok[q]);
        for (int64_t q = 0; q < nb2 * B; q++)
            CHECK(P.tok[nb0 * B + q] == (q < 20 ? 44 + q : -1), "route: expert 2 position %lld", (long long)q);
        for (int64_t q = (nb0 + nb2) * B; q < P.N * B; q++) CHECK(P.tok[q] == -1, "route: leftover not padding");
        for (int64_t t = 0; t < 64; t++)
            for (int64_t e = 0; e < 3; e++)
                CHECK((P.a[t * 3 + e] != 0) == ((t < 44 && e == 0) || (t >= 44 && e == 2)), "route: affinity mask");
        prob_free(&P);
    }
    int64_t N;
    CHECK(mxfp8_moe_num_blocks(1024, 4, 4, 512, &N) == MXFP8_OK && N == 11, "num_blocks upstream = %lld", (long long)N);
    CHECK(mxfp8_moe_num_blocks(0, 1, 4, 32, &N) == MXFP8_OK && N == 3, "num_blocks T=0 = %lld", (long long)N);
    CHECK(mxfp8_moe_num_blocks(4, 5, 4, 32, &N) == MXFP8_ERR_INVALID_ARGUMENT, "num_blocks K > E");
    /* duplicate and out-of-range ids */
    int32_t ids[4] = {0, 0, 1, 2}, tp[64], be[4];
    float w[4] = {1, 1, 1, 1}, a[6];
    mxfp8_tensor ti = v2(ids, MXFP8_DTYPE_I32, 2, 2), tw = v2(w, MXFP8_DTYPE_F32, 2, 2);
    mxfp8_moe_num_blocks(2, 2, 3, 16, &N);
    mxfp8_tensor tpv = v1(tp, MXFP8_DTYPE_I32, N * 16), bev = v1(be, MXFP8_DTYPE_I32, N),
                 av = v2(a, MXFP8_DTYPE_F32, 6, 1);
    CHECK(mxfp8_moe_route(&ti, &tw, 3, 16, -1, &tpv, &bev, &av) == MXFP8_ERR_INVALID_ARGUMENT, "duplicate id");
    ids[1] = 3;
    CHECK(mxfp8_moe_route(&ti, &tw, 3, 16, -1, &tpv, &bev, &av) == MXFP8_ERR_INDEX_OUT_OF_RANGE, "id >= E: %s",
          mxfp8_last_error_message());
}

/* kernel vs quantized golden (and unquantized golden for the NKI cosine criterion) over the option grid */
static void test_vs_golden(void) {
    prob P;
    prob_make(&P, 40, 48, 40, 3, 2, 16, 1, NULL); /* H, I not multiples of 32 */
    double worst = 0, worst_o = 0;
    for (int act = 0; act < 3; act++)
        for (int aff = 0; aff < 2; aff++)
            for (int bias = 0; bias < 2; bias++)
                for (int clamp = 0; clamp < 3; clamp++) {
                    mxfp8_moe_config cfg;
                    mxfp8_moe_config_init(&cfg);
                    cfg.activation = (mxfp8_activation)act;
                    cfg.affinity_option = (mxfp8_affinity_option)aff;
                    cfg.bias = bias;
                    if (clamp == 1) { /* both limits of both clamps: many values land exactly on a limit */
                        cfg.gate_clamp_lower = -0.25f; cfg.gate_clamp_upper = 0.5f;
                        cfg.up_clamp_lower = -0.3f; cfg.up_clamp_upper = 0.3f;
                    } else if (clamp == 2) { /* one limit each, the other absent */
                        cfg.gate_clamp_lower = -0.1f;
                        cfg.up_clamp_upper = 0.2f;
                    }
                    mxfp8_moe_bwd_args A;
                    bwd_args(&P, &cfg, &A);
                    grads k, gq, gu;
                    grads_make(&k, &P, MXFP8_DTYPE_F32, bias);
                    grads_make(&gq, &P, MXFP8_DTYPE_F64, bias);
                    grads_make(&gu, &P, MXFP8_DTYPE_F64, bias);
                    mxfp8_status s1 = mxfp8_moe_backward(&A, &k.g);
                    CHECK(s1 == MXFP8_OK, "backward: %s", mxfp8_last_error_message());
                    mxfp8_status s2 = mxfp8_moe_backward_golden(&A, &gq.g, 1);
                    CHECK(s2 == MXFP8_OK, "golden q: %s", mxfp8_last_error_message());
                    mxfp8_status s3 = mxfp8_moe_backward_golden(&A, &gu.g, 0);
                    CHECK(s3 == MXFP8_OK, "golden: %s", mxfp8_last_error_message());
                    char what[96];
                    snprintf(what, sizeof what, "act %d aff %d bias %d clamp %d", act, aff, bias, clamp);
                    double ro = check_vs_oracle(&k, &P, &cfg, what);
                    if (ro > worst_o) worst_o = ro;
                    /* second opinion: the library's quantized FP64 golden */
                    double per[6], perq[6];
                    double r = grads_relerr(&k, &gq, bias, per);
                    int wr = g_worst_grad;
                    double ru = grads_relerr(&gq, &gu, bias, perq);
                    if (r > worst) worst = r;
                    /* Bound: FP32 vs FP64 arithmetic only moves a handful of FP8 codes across a rounding boundary;
                       normwise 1e-4 is ~300x below the quantization error itself (checked just below). */
                    CHECK(r <= 1e-4, "act %d aff %d bias %d clamp %d: kernel vs quantized golden %.3g (%s)", act, aff,
                          bias, clamp, r, GNAME[wr]);
                    CHECK(ru > 3e-3, "act %d aff %d bias %d clamp %d: quantization effect %.3g too small to tell",
                          act, aff, bias, clamp, ru);
                    CHECK(grads_finite(&k, bias), "non-finite gradient");
                    grads_free(&k); grads_free(&gq); grads_free(&gu);
                }
    printf("kernel vs oracle: worst normwise relative error %.3g over 36 option sets (golden: %.3g)\n", worst_o,
           worst);
    prob_free(&P);
}

/* BF16 hidden states and output gradient (mxfp8.torch's under autocast): against the oracle, and bitwise equal to
 * the same values given as F32 (quantization sees values only, whatever their storage: the same codes, the same
 * stochastic-rounding indices), for both affinity options with and without biases, with stochastic rounding of dY's
 * and X's operands on the last pass; 1 and 2 threads. */
static void test_bf16_inputs(void) {
    prob P;
    prob_make(&P, 40, 64, 48, 3, 2, 16, 1, NULL);
    const int64_t n = P.T * P.H;
    uint16_t *x16 = xc(sizeof(uint16_t) * n), *dy16 = xc(sizeof(uint16_t) * n);
    for (int64_t i = 0; i < n; i++) { /* the F32 inputs become BF16 values (the oracle's encoder) */
        x16[i] = orc_bf16_encode(P.X[i]), dy16[i] = orc_bf16_encode(P.dY[i]);
        P.X[i] = (float)orc_bf16_value(x16[i]), P.dY[i] = (float)orc_bf16_value(dy16[i]);
    }
    for (int v = 0; v < 5; v++) {
        mxfp8_moe_config cfg;
        mxfp8_moe_config_init(&cfg);
        cfg.affinity_option = (mxfp8_affinity_option)(v & 1);
        cfg.bias = (v >> 1) & 1;
        if (v == 4) {
            cfg.stochastic_rounding = 1u << MXFP8_MOE_P1_DY | 1u << MXFP8_MOE_P4_DY | 1u << MXFP8_MOE_P3_X;
            cfg.rounding_seed = 7;
        }
        mxfp8_moe_bwd_args A, A16;
        bwd_args(&P, &cfg, &A);
        A16 = A;
        A16.hidden_states = v2(x16, MXFP8_DTYPE_BF16, P.T, P.H);
        A16.output_hidden_states_grad = v2(dy16, MXFP8_DTYPE_BF16, P.T, P.H);
        char what[80];
        snprintf(what, sizeof what, "BF16 X and dY, affinity %d bias %d%s", v & 1, cfg.bias, v == 4 ? " SR" : "");
        for (int nt = 1; nt <= 2; nt++) {
            mxfp8_set_num_threads(nt);
            grads k, k16;
            grads_make(&k, &P, MXFP8_DTYPE_F32, cfg.bias);
            grads_make(&k16, &P, MXFP8_DTYPE_F32, cfg.bias);
            CHECK(mxfp8_moe_backward(&A, &k.g) == MXFP8_OK, "%s: %s", what, mxfp8_last_error_message());
            CHECK(mxfp8_moe_backward(&A16, &k16.g) == MXFP8_OK, "%s: %s", what, mxfp8_last_error_message());
            if (v < 4) check_vs_oracle(&k16, &P, &cfg, what);
            grads_bitwise(&k16, &k, cfg.bias, what);
            grads_free(&k), grads_free(&k16);
        }
        mxfp8_set_num_threads(0);
    }
    printf("BF16 inputs: oracle and F32 inputs' bits, 5 option sets, 1 and 2 threads\n");
    free(x16), free(dy16);
    prob_free(&P);
}

/* forward F32 checkpoints -> backward with every checkpoint subset is bitwise equal to recomputing */
static void test_checkpoints(void) {
    prob P;
    prob_make(&P, 36, 40, 24, 3, 2, 16, 1, NULL);
    for (int aff = 0; aff < 2; aff++) {
        mxfp8_moe_config cfg;
        mxfp8_moe_config_init(&cfg);
        cfg.affinity_option = (mxfp8_affinity_option)aff;
        cfg.bias = 1;
        cfg.gate_clamp_upper = 0.4f;
        cfg.up_clamp_lower = -0.2f;
        const int64_t N = P.N, B = P.B, I = P.I, H = P.H;
        float *gu = xc(sizeof(float) * N * 2 * I * B), *ga = xc(sizeof(float) * N * I * B),
              *in = xc(sizeof(float) * N * I * B), *si = xc(sizeof(float) * N * I * B),
              *dn = xc(sizeof(float) * N * B * H), *dact = xc(sizeof(float) * N * B * H),
              *out = xc(sizeof(float) * P.T * H), *outg = xc(sizeof(double) * P.T * H);
        mxfp8_moe_fwd_args F;
        fwd_args(&P, &cfg, &F);
        mxfp8_moe_fwd_outputs O = {0};
        O.output = v2(out, MXFP8_DTYPE_F32, P.T, H);
        O.gate_up_proj_act_checkpoint_T = v4(gu, MXFP8_DTYPE_F32, N, 2, I, B);
        O.gate_act_checkpoint_T = v3(ga, MXFP8_DTYPE_F32, N, I, B);
        O.intermediate_checkpoint_T = v3(in, MXFP8_DTYPE_F32, N, I, B);
        O.scaled_intermediate_checkpoint_T = v3(si, MXFP8_DTYPE_F32, N, I, B);
        O.down_proj_output_checkpoint = v3(dn, MXFP8_DTYPE_F32, N, B, H);
        CHECK(mxfp8_moe_forward(&F, &O) == MXFP8_OK, "forward: %s", mxfp8_last_error_message());
        /* forward vs the oracle's forward, then vs the library's quantized golden (second opinion) */
        {
            double *oo = xc(sizeof(double) * P.T * H), num = 0, den = 0, mx = 0, worst = 0;
            orc_moe m = oracle_problem(&P, &cfg);
            CHECK(orc_moe_forward(&m, oo) == 0, "oracle forward: out of memory");
            for (int64_t i = 0; i < P.T * H; i++) {
                double d = fabs(out[i] - oo[i]);
                num += d * d, den += oo[i] * oo[i], mx = fmax(mx, fabs(oo[i])), worst = fmax(worst, d);
            }
            CHECK(sqrt(num / den) <= ORACLE_TOL_NORM && worst <= ORACLE_TOL_ELEM * mx,
                  "affinity %d: forward vs oracle: normwise %.3g, worst element %.3g of max %.3g", aff, sqrt(num / den),
                  worst, mx);
            free(oo);
        }
        mxfp8_moe_fwd_outputs OG = {0};
        OG.output = v2(outg, MXFP8_DTYPE_F64, P.T, H);
        CHECK(mxfp8_moe_forward_golden(&F, &OG, 1) == MXFP8_OK, "forward golden: %s", mxfp8_last_error_message());
        double num = 0, den = 0;
        for (int64_t i = 0; i < P.T * H; i++) {
            double d = out[i] - ((double *)outg)[i];
            num += d * d;
            den += ((double *)outg)[i] * ((double *)outg)[i];
        }
        CHECK(sqrt(num / den) < 1e-5, "forward vs quantized golden: %.3g", sqrt(num / den));
        /* down_proj_act_checkpoint = a * dY[t] (FP32), 0 at padding */
        for (int64_t n = 0; n < N; n++)
            for (int64_t q = 0; q < B; q++) {
                int32_t t = P.tok[n * B + q];
                for (int64_t h = 0; h < H; h++)
                    dact[(n * B + q) * H + h] = t >= 0 ? P.a[t * P.E + P.b2e[n]] * P.dY[t * H + h] : 0.0f;
            }
        mxfp8_moe_bwd_args A;
        bwd_args(&P, &cfg, &A);
        grads ref;
        grads_make(&ref, &P, MXFP8_DTYPE_F32, 1);
        CHECK(mxfp8_moe_backward(&A, &ref.g) == MXFP8_OK, "backward: %s", mxfp8_last_error_message());
        int bad = 0;
        for (int mask = 1; mask < 64 && !bad; mask++) {
            mxfp8_moe_bwd_args C = A;
            if (mask & 1) C.gate_up_proj_act_checkpoint_T = O.gate_up_proj_act_checkpoint_T;
            if (mask & 2) C.gate_act_checkpoint_T = O.gate_act_checkpoint_T;
            if (mask & 4) C.intermediate_checkpoint_T = O.intermediate_checkpoint_T;
            if (mask & 8) C.scaled_intermediate_checkpoint_T = O.scaled_intermediate_checkpoint_T;
            if (mask & 16) C.down_proj_output_checkpoint = O.down_proj_output_checkpoint;
            if (mask & 32) C.down_proj_act_checkpoint = v3(dact, MXFP8_DTYPE_F32, N, B, H);
            grads k;
            grads_make(&k, &P, MXFP8_DTYPE_F32, 1);
            CHECK(mxfp8_moe_backward(&C, &k.g) == MXFP8_OK, "backward: %s", mxfp8_last_error_message());
            char what[96];
            snprintf(what, sizeof what, "affinity %d, checkpoint mask %d vs recompute", aff, mask);
            if (!grads_bitwise(&k, &ref, 1, what)) bad = 1;
            grads_free(&k);
        }
        grads_free(&ref);
        free(gu); free(ga); free(in); free(si); free(dn); free(dact); free(out); free(outg);
    }
    prob_free(&P);
}

/* weights pre-quantized with mxfp8_quantize (codes + scales) are bitwise equal to quantizing on the fly */
static void test_prequantized(void) {
    prob P;
    prob_make(&P, 30, 72, 20, 2, 1, 8, 1, NULL); /* 2I = 40, H = 72: short last groups */
    const int64_t E = P.E, H = P.H, I = P.I, N = P.N, B = P.B;
    mxfp8_quant_params qp = mxfp8_quant_params_default();
    for (int aff = 0; aff < 2; aff++) {
        mxfp8_moe_config cfg;
        mxfp8_moe_config_init(&cfg);
        cfg.affinity_option = (mxfp8_affinity_option)aff;
        /* forward layouts: W1 along H (axis 1), W2 along I (axis 1) */
        uint8_t *c1 = xc(E * H * 2 * I), *s1 = xc(E * ((H + 31) / 32) * 2 * I), *c2 = xc(E * I * H),
                *s2 = xc(E * ((I + 31) / 32) * H);
        mxfp8_tensor w1 = v4(P.W1, MXFP8_DTYPE_F32, E, H, 2, I), w2 = v3(P.W2, MXFP8_DTYPE_F32, E, I, H);
        mxfp8_tensor c1v = v4(c1, MXFP8_DTYPE_E4M3, E, H, 2, I), s1v = v4(s1, MXFP8_DTYPE_E8M0, E, (H + 31) / 32, 2, I);
        mxfp8_tensor c2v = v3(c2, MXFP8_DTYPE_E4M3, E, I, H), s2v = v3(s2, MXFP8_DTYPE_E8M0, E, (I + 31) / 32, H);
        CHECK(mxfp8_quantize(&w1, 1, &qp, &c1v, &s1v) == MXFP8_OK, "quantize W1: %s", mxfp8_last_error_message());
        CHECK(mxfp8_quantize(&w2, 1, &qp, &c2v, &s2v) == MXFP8_OK, "quantize W2: %s", mxfp8_last_error_message());
        float *o1 = xc(4 * P.T * H), *o2 = xc(4 * P.T * H), *gu = xc(4 * N * 2 * I * B), *dn = xc(4 * N * B * H);
        mxfp8_moe_fwd_args F;
        fwd_args(&P, &cfg, &F);
        mxfp8_moe_fwd_outputs O = {0};
        O.output = v2(o1, MXFP8_DTYPE_F32, P.T, H);
        O.gate_up_proj_act_checkpoint_T = v4(gu, MXFP8_DTYPE_F32, N, 2, I, B);
        O.down_proj_output_checkpoint = v3(dn, MXFP8_DTYPE_F32, N, B, H);
        CHECK(mxfp8_moe_forward(&F, &O) == MXFP8_OK, "forward: %s", mxfp8_last_error_message());
        mxfp8_moe_fwd_args Fq = F;
        Fq.gate_up_proj_weight = c1v; Fq.gate_up_weight_scales = s1v;
        Fq.down_proj_weight = c2v; Fq.down_weight_scales = s2v;
        mxfp8_moe_fwd_outputs O2 = {0};
        O2.output = v2(o2, MXFP8_DTYPE_F32, P.T, H);
        CHECK(mxfp8_moe_forward(&Fq, &O2) == MXFP8_OK, "forward prequant: %s", mxfp8_last_error_message());
        CHECK(!memcmp(o1, o2, 4 * P.T * H), "forward: pre-quantized weights differ from on-the-fly");
        /* backward layouts: W1 along 2I (view [E, H, 2I], axis 2), W2 along H (axis 2) */
        uint8_t *d1 = xc(E * H * 2 * I), *t1 = xc(E * H * ((2 * I + 31) / 32)), *d2 = xc(E * I * H),
                *t2 = xc(E * I * ((H + 31) / 32));
        mxfp8_tensor w1f = v3(P.W1, MXFP8_DTYPE_F32, E, H, 2 * I);
        mxfp8_tensor d1v = v3(d1, MXFP8_DTYPE_E4M3, E, H, 2 * I);
        mxfp8_tensor t1v = v3(t1, MXFP8_DTYPE_E8M0, E, H, (2 * I + 31) / 32);
        mxfp8_tensor d2v = v3(d2, MXFP8_DTYPE_E4M3, E, I, H), t2v = v3(t2, MXFP8_DTYPE_E8M0, E, I, (H + 31) / 32);
        CHECK(mxfp8_quantize(&w1f, 2, &qp, &d1v, &t1v) == MXFP8_OK, "quantize W1 bwd: %s", mxfp8_last_error_message());
        CHECK(mxfp8_quantize(&w2, 2, &qp, &d2v, &t2v) == MXFP8_OK, "quantize W2 bwd: %s", mxfp8_last_error_message());
        mxfp8_moe_bwd_args A;
        bwd_args(&P, &cfg, &A);
        A.gate_up_proj_act_checkpoint_T = O.gate_up_proj_act_checkpoint_T; /* no recompute along the other axis */
        A.down_proj_output_checkpoint = O.down_proj_output_checkpoint;
        grads k1, k2;
        grads_make(&k1, &P, MXFP8_DTYPE_F32, 0);
        grads_make(&k2, &P, MXFP8_DTYPE_F32, 0);
        CHECK(mxfp8_moe_backward(&A, &k1.g) == MXFP8_OK, "backward: %s", mxfp8_last_error_message());
        A.gate_up_proj_weight = v4(d1, MXFP8_DTYPE_E4M3, E, H, 2, I);
        A.gate_up_weight_scales = t1v;
        A.down_proj_weight = d2v;
        A.down_weight_scales = t2v;
        CHECK(mxfp8_moe_backward(&A, &k2.g) == MXFP8_OK, "backward prequant: %s", mxfp8_last_error_message());
        grads_bitwise(&k1, &k2, 0,
                      aff ? "backward ON_H: pre-quantized vs on-the-fly" : "backward ON_I: pre-quantized vs on-the-fly");
        check_vs_oracle(&k2, &P, &cfg,
                        aff ? "backward ON_H, pre-quantized weights" : "backward ON_I, pre-quantized weights");
        /* the golden agrees too (pre-quantized path of the golden) */
        grads gq;
        grads_make(&gq, &P, MXFP8_DTYPE_F64, 0);
        CHECK(mxfp8_moe_backward_golden(&A, &gq.g, 1) == MXFP8_OK, "golden prequant: %s", mxfp8_last_error_message());
        double r = grads_relerr(&k2, &gq, 0, NULL);
        CHECK(r < 1e-4, "prequant kernel vs golden %.3g", r);
        /* scales given with high-precision weights, and codes of the wrong format, are errors */
        A.gate_up_proj_weight = v4(P.W1, MXFP8_DTYPE_F32, E, H, 2, I);
        CHECK(mxfp8_moe_backward(&A, &k2.g) == MXFP8_ERR_INVALID_ARGUMENT, "scales with f32 weights");
        A.gate_up_proj_weight = v4(d1, MXFP8_DTYPE_E5M2, E, H, 2, I);
        CHECK(mxfp8_moe_backward(&A, &k2.g) == MXFP8_ERR_DTYPE, "e5m2 codes with e4m3 config");
        grads_free(&k1); grads_free(&k2); grads_free(&gq);
        free(c1); free(s1); free(c2); free(s2); free(o1); free(o2); free(gu); free(dn);
        free(d1); free(t1); free(d2); free(t2);
    }
    prob_free(&P);
}

static void test_threads(void) {
    prob P; /* large enough that every phase splits between threads (small work runs on one thread) */
    prob_make(&P, 400, 256, 128, 3, 2, 256, 1, NULL);
    mxfp8_moe_config cfg;
    mxfp8_moe_config_init(&cfg);
    cfg.bias = 1;
    mxfp8_moe_bwd_args A;
    bwd_args(&P, &cfg, &A);
    grads k1, k2;
    grads_make(&k1, &P, MXFP8_DTYPE_F32, 1);
    grads_make(&k2, &P, MXFP8_DTYPE_F32, 1);
    mxfp8_set_num_threads(1);
    CHECK(mxfp8_moe_backward(&A, &k1.g) == MXFP8_OK, "backward 1 thread");
    mxfp8_set_num_threads(2);
    CHECK(mxfp8_moe_backward(&A, &k2.g) == MXFP8_OK, "backward 2 threads");
    mxfp8_set_num_threads(0);
    grads_bitwise(&k1, &k2, 1, "1 vs 2 threads");
    check_vs_oracle(&k2, &P, &cfg, "2 threads");
    grads_free(&k1); grads_free(&k2);
    prob_free(&P);
}

int main(void) {
    test_route();
    test_vs_golden();
    test_bf16_inputs();
    test_checkpoints();
    test_prequantized();
    test_threads();
    if (g_fail) {
        printf("test_moe: %d failure(s)\n", g_fail);
        return 1;
    }
    printf("test_moe: all MoE tests passed\n");
    return 0;
}
