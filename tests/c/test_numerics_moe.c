/*
 * test_numerics_moe.c -- the MoE layer's numerics options: per-operand stochastic rounding and statistics, and the
 * gpt-oss SwiGLU activation in the kernels.
 *   - Statistics of the operands a dense single-expert problem quantizes equal mxfp8_quantize's statistics of the same
 *     tensors along the same axes with the documented streams and logical indices (with every operand rounded
 *     stochastically), bit for bit: dY along H and along the tokens, X along H and along the tokens, W1 along H and
 *     along 2I, W2 along H (weights counted once per expert).
 *   - Outputs are unchanged with statistics on; 1 and 2 threads give the same outputs and statistics.
 *   - With stochastic rounding of the forward's operands, the backward that recomputes g, u equals the backward fed
 *     with the forward's checkpoints (both passes round alike), bit for bit.
 *   - gpt-oss SwiGLU: the kernels' forward and backward against the FP64 golden (which tests/python checks against an
 *     independent reference and finite differences), with gate/up values exactly at and beyond the limit: their
 *     checkpoints are clamped and their gradients are exactly zero.
 */
#include "testutil.h"

static mxfp8_tensor vn(void *d, mxfp8_dtype dt, int n, int64_t a, int64_t b, int64_t c, int64_t e) {
    int64_t s[4] = {a, b, c, e};
    return mxfp8_tensor_make(d, dt, n, s);
}
static float *frand(int64_t n, double lo, double hi, tu_rng *r) {
    float *x = tu_alloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * tu_uniform(r));
    return x;
}
static void quant_stats(const float *x, int nd, const int64_t *shape, int axis, uint64_t seed, uint64_t stream,
                        mxfp8_quant_stats *st) {
    int64_t n = 1, ss[4];
    for (int i = 0; i < nd; i++) n *= shape[i], ss[i] = shape[i];
    ss[axis] = (shape[axis] + 31) / 32;
    uint8_t *d = tu_alloc((size_t)n), *s = tu_alloc((size_t)n);
    mxfp8_tensor X = mxfp8_tensor_make((void *)x, MXFP8_DTYPE_F32, nd, shape);
    mxfp8_tensor D = mxfp8_tensor_make(d, MXFP8_DTYPE_E4M3, nd, shape), S = mxfp8_tensor_make(s, MXFP8_DTYPE_E8M0,
                                                                                              nd, ss);
    mxfp8_quant_params p = mxfp8_quant_params_default();
    p.rounding = MXFP8_ROUND_STOCHASTIC, p.seed = seed, p.stream = stream, p.stats = st;
    TU_CHECK(mxfp8_quantize(&X, axis, &p, &D, &S) == MXFP8_OK, "quantize: %s", mxfp8_last_error_message());
    free(d), free(s);
}

typedef struct dense {
    int64_t T, H, I, B;
    float *X, *W1, *W2, *a, *dY;
    float *dx, *da, *dw1, *dw2; /* outputs */
} dense;

static mxfp8_status run_bwd(dense *P, const mxfp8_moe_config *cfg, mxfp8_quant_stats *stats, const float *ck_gu) {
    mxfp8_moe_bwd_args A;
    mxfp8_moe_bwd_args_init(&A);
    A.hidden_states = vn(P->X, MXFP8_DTYPE_F32, 2, P->T, P->H, 0, 0);
    A.expert_affinities_masked = vn(P->a, MXFP8_DTYPE_F32, 2, P->T, 1, 0, 0);
    A.gate_up_proj_weight = vn(P->W1, MXFP8_DTYPE_F32, 4, 1, P->H, 2, P->I);
    A.down_proj_weight = vn(P->W2, MXFP8_DTYPE_F32, 3, 1, P->I, P->H, 0);
    A.output_hidden_states_grad = vn(P->dY, MXFP8_DTYPE_F32, 2, P->T, P->H, 0, 0);
    A.block_size = P->B;
    A.config = cfg;
    A.stats = stats;
    if (ck_gu) A.gate_up_proj_act_checkpoint_T = vn((void *)ck_gu, MXFP8_DTYPE_F32, 4, P->T / P->B, 2, P->I, P->B);
    mxfp8_moe_bwd_grads G;
    memset(&G, 0, sizeof G);
    G.hidden_states_grad = vn(P->dx, MXFP8_DTYPE_F32, 2, P->T, P->H, 0, 0);
    G.expert_affinities_masked_grad = vn(P->da, MXFP8_DTYPE_F32, 2, P->T, 1, 0, 0);
    G.gate_up_proj_weight_grad = vn(P->dw1, MXFP8_DTYPE_F32, 4, 1, P->H, 2, P->I);
    G.down_proj_weight_grad = vn(P->dw2, MXFP8_DTYPE_F32, 3, 1, P->I, P->H, 0);
    return mxfp8_moe_backward(&A, &G);
}

static mxfp8_status run_fwd(dense *P, const mxfp8_moe_config *cfg, float *out, float *ck_gu) {
    mxfp8_moe_fwd_args A;
    mxfp8_moe_fwd_args_init(&A);
    A.hidden_states = vn(P->X, MXFP8_DTYPE_F32, 2, P->T, P->H, 0, 0);
    A.expert_affinities_masked = vn(P->a, MXFP8_DTYPE_F32, 2, P->T, 1, 0, 0);
    A.gate_up_proj_weight = vn(P->W1, MXFP8_DTYPE_F32, 4, 1, P->H, 2, P->I);
    A.down_proj_weight = vn(P->W2, MXFP8_DTYPE_F32, 3, 1, P->I, P->H, 0);
    A.block_size = P->B;
    A.config = cfg;
    mxfp8_moe_fwd_outputs O;
    memset(&O, 0, sizeof O);
    O.output = vn(out, MXFP8_DTYPE_F32, 2, P->T, P->H, 0, 0);
    O.gate_up_proj_act_checkpoint_T = vn(ck_gu, MXFP8_DTYPE_F32, 4, P->T / P->B, 2, P->I, P->B);
    return mxfp8_moe_forward(&A, &O);
}

static size_t out_bytes(const dense *P) { return (size_t)(P->T * P->H) * 4; }
static int same_outputs(const dense *P, const float *dx, const float *dw1, const float *dw2, const float *da) {
    return !memcmp(P->dx, dx, out_bytes(P)) && !memcmp(P->dw1, dw1, (size_t)(2 * P->H * P->I) * 4) &&
           !memcmp(P->dw2, dw2, (size_t)(P->H * P->I) * 4) && !memcmp(P->da, da, (size_t)P->T * 4);
}

static void test_dense_operand_stats(void) {
    tu_rng r = {77};
    dense P = {128, 96, 64, 64, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    const int64_t T = P.T, H = P.H, I = P.I;
    P.X = frand(T * H, 0, 1, &r), P.W1 = frand(2 * H * I, -0.1, 0.1, &r), P.W2 = frand(I * H, -0.1, 0.1, &r);
    P.a = frand(T, 0, 1, &r), P.dY = frand(T * H, -1, 1, &r);
    P.dx = tu_alloc(out_bytes(&P)), P.da = tu_alloc((size_t)T * 4), P.dw1 = tu_alloc((size_t)(2 * H * I) * 4);
    P.dw2 = tu_alloc((size_t)(H * I) * 4);
    float *rx = tu_alloc(out_bytes(&P)), *ra = tu_alloc((size_t)T * 4), *rw1 = tu_alloc((size_t)(2 * H * I) * 4),
          *rw2 = tu_alloc((size_t)(H * I) * 4);
    mxfp8_moe_config cfg;
    mxfp8_moe_config_init(&cfg);
    cfg.single_expert_dense = 1;
    cfg.stochastic_rounding = (1u << MXFP8_MOE_NUM_OPERANDS) - 1;
    cfg.rounding_seed = 0x5EED;
    mxfp8_quant_stats st[MXFP8_MOE_NUM_OPERANDS], st2[MXFP8_MOE_NUM_OPERANDS];
    mxfp8_set_num_threads(1);
    TU_CHECK(run_bwd(&P, &cfg, NULL, NULL) == MXFP8_OK, "backward: %s", mxfp8_last_error_message());
    memcpy(rx, P.dx, out_bytes(&P)), memcpy(ra, P.da, (size_t)T * 4);
    memcpy(rw1, P.dw1, (size_t)(2 * H * I) * 4), memcpy(rw2, P.dw2, (size_t)(H * I) * 4);
    for (int nt = 1; nt <= 2; nt++) {
        mxfp8_set_num_threads(nt);
        TU_CHECK(run_bwd(&P, &cfg, nt == 1 ? st : st2, NULL) == MXFP8_OK, "backward: %s", mxfp8_last_error_message());
        TU_CHECK(same_outputs(&P, rx, rw1, rw2, ra), "%d thread(s), statistics on: outputs differ", nt);
    }
    TU_CHECK(!memcmp(st, st2, sizeof st), "statistics differ between 1 and 2 threads");
    /* the oracle: mxfp8_quantize of the same tensors (the dispatched layout is the identity here) */
    const int64_t sTH[2] = {T, H}, sW1[2] = {H, 2 * I}, sW2[2] = {I, H};
    struct {
        int id;
        const float *x;
        const int64_t *shape;
        int axis;
    } want[] = {{MXFP8_MOE_GEMM1_X, P.X, sTH, 1},  {MXFP8_MOE_GEMM1_W1, P.W1, sW1, 0}, {MXFP8_MOE_P1_DY, P.dY, sTH, 1},
                {MXFP8_MOE_P1_W2, P.W2, sW2, 1}, {MXFP8_MOE_P2_W1, P.W1, sW1, 1},  {MXFP8_MOE_P3_X, P.X, sTH, 0},
                {MXFP8_MOE_P4_DY, P.dY, sTH, 0}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        mxfp8_quant_stats q;
        quant_stats(want[i].x, 2, want[i].shape, want[i].axis, cfg.rounding_seed, (uint64_t)want[i].id, &q);
        TU_CHECK(!memcmp(&q, &st[want[i].id], sizeof q),
                 "operand %d: statistics differ from mxfp8_quantize's (elements %lld / %lld, sum_sq_error %a / %a)",
                 want[i].id, (long long)st[want[i].id].elements, (long long)q.elements, st[want[i].id].sum_sq_error,
                 q.sum_sq_error);
    }
    TU_CHECK(st[MXFP8_MOE_GEMM2_W2].elements == 0, "GEMM 2 is not run by an AFFINITY_ON_I backward");
    TU_CHECK(st[MXFP8_MOE_P2_DGU].elements == T * 2 * I && st[MXFP8_MOE_P4_S].elements == T * I,
             "element counts of dGU / S");
    /* stochastic rounding of the forward's operands: recomputing g, u = reading the forward's checkpoint */
    float *out = tu_alloc(out_bytes(&P)), *ck = tu_alloc((size_t)(2 * I * T) * 4);
    TU_CHECK(run_fwd(&P, &cfg, out, ck) == MXFP8_OK, "forward: %s", mxfp8_last_error_message());
    TU_CHECK(run_bwd(&P, &cfg, NULL, ck) == MXFP8_OK, "backward: %s", mxfp8_last_error_message());
    TU_CHECK(same_outputs(&P, rx, rw1, rw2, ra), "backward from the forward's checkpoint differs from recomputing");
    /* and rounding changes something (the option is not a no-op) */
    cfg.stochastic_rounding = 0;
    TU_CHECK(run_bwd(&P, &cfg, NULL, NULL) == MXFP8_OK, "backward: %s", mxfp8_last_error_message());
    TU_CHECK(!same_outputs(&P, rx, rw1, rw2, ra), "nearest and stochastic rounding give the same gradients");
    cfg.stochastic_rounding = 1u << MXFP8_MOE_NUM_OPERANDS;
    TU_CHECK(run_bwd(&P, &cfg, NULL, NULL) == MXFP8_ERR_INVALID_ARGUMENT, "a bit beyond the operands is accepted");
    mxfp8_set_num_threads(0);
    free(P.X), free(P.W1), free(P.W2), free(P.a), free(P.dY), free(P.dx), free(P.da), free(P.dw1), free(P.dw2);
    free(rx), free(ra), free(rw1), free(rw2), free(out), free(ck);
}

/* gpt-oss SwiGLU in the kernels: checkpoints at and beyond the limits, zero gradients there, agreement with the
 * quantized FP64 golden. Tokens 0..3 have X = 0, so g and u are the bias values exactly (7, 9, -7, -9, ...). */
static void test_gpt_oss_swiglu(void) {
    tu_rng r = {88};
    const int64_t T = 64, H = 64, I = 32, B = 32, N = T / B;
    float *X = frand(T * H, -1, 1, &r), *W1 = frand(2 * H * I, -0.3, 0.3, &r), *W2 = frand(I * H, -0.1, 0.1, &r);
    float *a = frand(T, 0, 1, &r), *dY = frand(T * H, -1, 1, &r), *b1 = tu_alloc((size_t)(2 * I) * 4);
    float *b2 = frand(H, -0.5, 0.5, &r);
    static const float gate_b[4] = {7.0f, 9.0f, 7.0f, 12.0f}, up_b[4] = {7.0f, -7.0f, 9.0f, -9.0f};
    for (int64_t i = 0; i < I; i++) b1[i] = gate_b[i % 4], b1[I + i] = up_b[(i / 4) % 4];
    for (int64_t k = 0; k < 4 * H; k++) X[k] = 0.0f;
    mxfp8_moe_config cfg;
    mxfp8_moe_config_init(&cfg);
    cfg.single_expert_dense = 1;
    cfg.bias = 1;
    cfg.activation = MXFP8_ACT_GPT_OSS_SWIGLU;
    mxfp8_moe_fwd_args F;
    mxfp8_moe_fwd_args_init(&F);
    F.hidden_states = vn(X, MXFP8_DTYPE_F32, 2, T, H, 0, 0);
    F.expert_affinities_masked = vn(a, MXFP8_DTYPE_F32, 2, T, 1, 0, 0);
    F.gate_up_proj_weight = vn(W1, MXFP8_DTYPE_F32, 4, 1, H, 2, I);
    F.down_proj_weight = vn(W2, MXFP8_DTYPE_F32, 3, 1, I, H, 0);
    F.gate_and_up_proj_bias = vn(b1, MXFP8_DTYPE_F32, 3, 1, 2, I, 0);
    F.down_proj_bias = vn(b2, MXFP8_DTYPE_F32, 2, 1, H, 0, 0);
    F.block_size = B;
    F.config = &cfg;
    float *out = tu_alloc((size_t)(T * H) * 4), *ck = tu_alloc((size_t)(N * 2 * I * B) * 4);
    double *gout = tu_alloc((size_t)(T * H) * 8);
    mxfp8_moe_fwd_outputs O;
    memset(&O, 0, sizeof O);
    O.output = vn(out, MXFP8_DTYPE_F32, 2, T, H, 0, 0);
    O.gate_up_proj_act_checkpoint_T = vn(ck, MXFP8_DTYPE_F32, 4, N, 2, I, B);
    TU_CHECK(mxfp8_moe_forward(&F, &O) == MXFP8_OK, "forward: %s", mxfp8_last_error_message());
    for (int64_t q = 0; q < 4; q++)
        for (int64_t i = 0; i < I; i++) {
            float g = ck[(0 * 2 * I + i) * B + q], u = ck[(1 * I + i) * B + q];
            float wg = gate_b[i % 4] < 7.0f ? gate_b[i % 4] : 7.0f, wu = up_b[(i / 4) % 4];
            wu = wu > 7.0f ? 7.0f : wu < -7.0f ? -7.0f : wu;
            TU_CHECK(g == wg && u == wu, "token %lld column %lld: checkpoint (g, u) = (%g, %g), want (%g, %g)",
                     (long long)q, (long long)i, g, u, wg, wu);
        }
    mxfp8_moe_fwd_outputs GO = O;
    GO.output = vn(gout, MXFP8_DTYPE_F64, 2, T, H, 0, 0);
    GO.gate_up_proj_act_checkpoint_T = MXFP8_TENSOR_NONE;
    TU_CHECK(mxfp8_moe_forward_golden(&F, &GO, 1) == MXFP8_OK, "forward golden: %s", mxfp8_last_error_message());
    mxfp8_tensor tk = vn(out, MXFP8_DTYPE_F32, 2, T, H, 0, 0);
    mxfp8_compare_result cr;
    mxfp8_compare(&tk, &GO.output, 0.0, 0.0, &cr);
    TU_CHECK(cr.cosine > 0.99999 && cr.num_nan == 0, "forward vs quantized golden: cosine %.8f", cr.cosine);
    /* backward */
    mxfp8_moe_bwd_args A;
    mxfp8_moe_bwd_args_init(&A);
    A.hidden_states = F.hidden_states, A.expert_affinities_masked = F.expert_affinities_masked;
    A.gate_up_proj_weight = F.gate_up_proj_weight, A.down_proj_weight = F.down_proj_weight;
    A.gate_and_up_proj_bias = F.gate_and_up_proj_bias, A.down_proj_bias = F.down_proj_bias;
    A.output_hidden_states_grad = vn(dY, MXFP8_DTYPE_F32, 2, T, H, 0, 0);
    A.block_size = B, A.config = &cfg;
    float *g[6];
    double *gg[6];
    const int64_t n[6] = {T * H, T, 2 * H * I, I * H, 2 * I, H};
    for (int i = 0; i < 6; i++) g[i] = tu_alloc((size_t)n[i] * 4), gg[i] = tu_alloc((size_t)n[i] * 8);
    mxfp8_moe_bwd_grads G, GG;
    memset(&G, 0, sizeof G);
    G.hidden_states_grad = vn(g[0], MXFP8_DTYPE_F32, 2, T, H, 0, 0);
    G.expert_affinities_masked_grad = vn(g[1], MXFP8_DTYPE_F32, 2, T, 1, 0, 0);
    G.gate_up_proj_weight_grad = vn(g[2], MXFP8_DTYPE_F32, 4, 1, H, 2, I);
    G.down_proj_weight_grad = vn(g[3], MXFP8_DTYPE_F32, 3, 1, I, H, 0);
    G.gate_and_up_proj_bias_grad = vn(g[4], MXFP8_DTYPE_F32, 3, 1, 2, I, 0);
    G.down_proj_bias_grad = vn(g[5], MXFP8_DTYPE_F32, 2, 1, H, 0, 0);
    GG = G;
    mxfp8_tensor *gv[6] = {&GG.hidden_states_grad, &GG.expert_affinities_masked_grad, &GG.gate_up_proj_weight_grad,
                           &GG.down_proj_weight_grad, &GG.gate_and_up_proj_bias_grad, &GG.down_proj_bias_grad};
    for (int i = 0; i < 6; i++) gv[i]->data = gg[i], gv[i]->dtype = MXFP8_DTYPE_F64;
    TU_CHECK(mxfp8_moe_backward(&A, &G) == MXFP8_OK, "backward: %s", mxfp8_last_error_message());
    TU_CHECK(mxfp8_moe_backward_golden(&A, &GG, 1) == MXFP8_OK, "golden: %s", mxfp8_last_error_message());
    static const char *nm[6] = {"dX", "d affinity", "dW1", "dW2", "db1", "db2"};
    mxfp8_tensor *kv[6] = {&G.hidden_states_grad, &G.expert_affinities_masked_grad, &G.gate_up_proj_weight_grad,
                           &G.down_proj_weight_grad, &G.gate_and_up_proj_bias_grad, &G.down_proj_bias_grad};
    for (int i = 0; i < 6; i++) {
        mxfp8_compare(kv[i], gv[i], 0.0, 0.0, &cr);
        TU_CHECK(cr.cosine > 0.9999 && cr.num_nan == 0, "%s vs quantized golden: cosine %.8f", nm[i], cr.cosine);
    }
    /* tokens 0..3: every gate value is at or beyond 7 and every up value at or beyond +-7: dGU = 0, so dX = 0 */
    for (int64_t k = 0; k < 4 * H; k++)
        TU_CHECK(g[0][k] == 0.0f && gg[0][k] == 0.0, "dX of a clamped token: kernel %g golden %g", g[0][k], gg[0][k]);
    cfg.swiglu_limit = 0.0f;
    TU_CHECK(mxfp8_moe_backward(&A, &G) == MXFP8_ERR_INVALID_ARGUMENT, "swiglu_limit 0 accepted");
    cfg.swiglu_limit = 7.0f, cfg.swiglu_alpha = INFINITY;
    TU_CHECK(mxfp8_moe_forward(&F, &O) == MXFP8_ERR_INVALID_ARGUMENT, "swiglu_alpha inf accepted");
    for (int i = 0; i < 6; i++) free(g[i]), free(gg[i]);
    free(X), free(W1), free(W2), free(a), free(dY), free(b1), free(b2), free(out), free(ck), free(gout);
}

int main(void) {
    test_dense_operand_stats();
    test_gpt_oss_swiglu();
    return tu_finish("test_numerics_moe");
}
