/*
 * test_moe.c -- blockwise MoE: router, forward, backward, checked first against the tests' independent FP64 oracle
 * (tests/c/oracle/moe.c: its own activations, clamp masks, affinity options, biases, routing and quantizer), with the
 * library's FP64 golden references as a second opinion, and against themselves where the contract promises bitwise
 * equality (checkpoints vs recomputing, pre-quantized vs on-the-fly weights, 1 vs 2 threads), plus edge cases and
 * bad input (error, every output untouched). The numpy oracle of tests/python/moe_oracle.py is a third opinion.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MXFP8_REFERENCE_API /* goldens and compare (the no-ABI-promise section of mxfp8.h) */
#include "mxfp8.h"
#include "oracle.h"

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
static int g_worst_grad = 0; /* index of the worst gradient of the last grads_relerr */
static double grads_relerr(const grads *k, const grads *g, int bias, double *per) {
    double worst = 0;
    g_worst_grad = 0;
    for (int j = 0; j < (bias ? 6 : 4); j++) {
        double num = 0, den = 0;
        for (size_t i = 0; i < k->n[j]; i++) {
            double d = gval(k, j, i) - gval(g, j, i);
            num += d * d;
            den += gval(g, j, i) * gval(g, j, i);
        }
        double r = den > 0 ? sqrt(num / den) : sqrt(num);
        if (per) per[j] = r;
        if (r > worst || r != r) {
            worst = r != r ? INFINITY : r;
            g_worst_grad = j;
        }
    }
    return worst;
}
static int grads_finite(const grads *G, int bias) {
    for (int k = 0; k < (bias ? 6 : 4); k++)
        for (size_t i = 0; i < G->n[k]; i++)
            if (!isfinite(gval(G, k, i))) return 0;
    return 1;
}

/* ---- the tests' independent oracle (tests/c/oracle/moe.c): FP64 on its own quantized GEMM operands ---- */
static orc_moe oracle_problem(const prob *P, const mxfp8_moe_config *cfg) {
    orc_moe m = {P->T, P->H, P->I, P->E, P->N, P->B, P->X, P->W1, P->W2, P->a, P->dY,
                 cfg->bias ? P->b1 : NULL, cfg->bias ? P->b2 : NULL, P->tok, P->b2e, cfg->skip_token ? -1 : (int32_t)P->T,
                 (int)cfg->quant_dtype, (int)cfg->scale_rule, (int)cfg->activation, (int)cfg->affinity_option,
                 cfg->gate_clamp_lower, cfg->gate_clamp_upper, cfg->up_clamp_lower, cfg->up_clamp_upper, 1};
    return m;
}
/* The oracle's gradients of P under cfg, as an F64 gradient set. */
static void oracle_grads(const prob *P, const mxfp8_moe_config *cfg, grads *o) {
    grads_make(o, P, MXFP8_DTYPE_F64, cfg->bias);
    orc_moe m = oracle_problem(P, cfg);
    orc_moe_grads g = {o->p[0], o->p[1], o->p[2], o->p[3], cfg->bias ? o->p[4] : NULL, cfg->bias ? o->p[5] : NULL};
    CHECK(orc_moe_backward(&m, &g) == 0, "oracle backward: out of memory");
}
/* Bounds against the oracle, per gradient: normwise relative error, and every element within a fraction of the
 * gradient's largest magnitude. The kernel's FP32 arithmetic (GEMM accumulation, activations) vs the oracle's FP64
 * shows at ~1e-7 on these problems; an FP8 code moved across a rounding boundary by it would show as an isolated
 * element near 1e-3; a lost term, a wrong mask or a misrouted expert shows at >= 1e-2. */
#define ORACLE_TOL_NORM 1e-5
#define ORACLE_TOL_ELEM 1e-4
/* Kernel gradients against the oracle; returns the worst normwise relative error. */
static double check_vs_oracle(const grads *k, const prob *P, const mxfp8_moe_config *cfg, const char *what) {
    grads o;
    oracle_grads(P, cfg, &o);
    double per[6];
    double r = grads_relerr(k, &o, cfg->bias, per);
    CHECK(r <= ORACLE_TOL_NORM, "%s: kernel vs oracle %.3g (%s; dX %.2g da %.2g dW1 %.2g dW2 %.2g)", what, r,
          GNAME[g_worst_grad], per[0], per[1], per[2], per[3]);
    for (int j = 0; j < (cfg->bias ? 6 : 4); j++) {
        double mx = 0, worst = 0;
        size_t at = 0;
        for (size_t i = 0; i < o.n[j]; i++) mx = fmax(mx, fabs(gval(&o, j, i)));
        for (size_t i = 0; i < o.n[j]; i++) {
            double d = fabs(gval(k, j, i) - gval(&o, j, i));
            if (!(d <= worst)) worst = d, at = i; /* NaN counts as worst */
        }
        CHECK(worst <= ORACLE_TOL_ELEM * mx, "%s: %s[%zu] = %.9g, oracle %.9g (max |oracle| %.3g)", what, GNAME[j], at,
              gval(k, j, at), gval(&o, j, at), mx);
    }
    grads_free(&o);
    return r;
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
        check_vs_oracle(&k2, &P, &cfg, aff ? "backward ON_H, pre-quantized weights" : "backward ON_I, pre-quantized weights");
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
    /* dense + num_valid_tokens with a scaled-intermediate checkpoint or bias: unsupported */
    prob_make(&P, 32, 32, 16, 1, 1, 16, 1, NULL);
    mxfp8_moe_config_init(&cfg);
    cfg.single_expert_dense = 1;
    bwd_args(&P, &cfg, &A);
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

static void test_edges(void) {
    mxfp8_moe_config cfg;
    mxfp8_moe_config_init(&cfg);
    /* an expert with no tokens: counts [44, 0, 20], B = 32 and 64 */
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
    /* B = 1, 32, 100 */
    const int64_t Bs[3] = {1, 32, 100};
    for (int i = 0; i < 3; i++) {
        prob P;
        prob_make(&P, 50, 33, 17, 4, 2, Bs[i], 1, NULL);
        char what[32];
        snprintf(what, sizeof what, "B = %lld", (long long)Bs[i]);
        run_vs_golden(&P, &cfg, what, NULL);
        prob_free(&P);
    }
    /* T = 0 (E - 1 padding-only blocks) */
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
    /* padding conventions: the same routing with padding -1 (skip_token) and T gives identical gradients;
       with extra all-padding blocks (K = 1 of E = 4 leaves leftover blocks) */
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
    /* E = 1 dense with num_valid_tokens == explicit routing of the first V tokens; rows past V are zero */
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
    /* accumulate_hidden_states_grad / skip_grad_initialization add into the given buffers (one FP32 addition) */
    {
        prob P;
        prob_make(&P, 30, 40, 24, 3, 2, 16, 1, NULL);
        mxfp8_moe_config c2 = cfg;
        c2.bias = 1;
        mxfp8_moe_bwd_args A;
        bwd_args(&P, &c2, &A);
        grads k1, k2;
        grads_make(&k1, &P, MXFP8_DTYPE_F32, 1);
        grads_make(&k2, &P, MXFP8_DTYPE_F32, 1);
        CHECK(mxfp8_moe_backward(&A, &k1.g) == MXFP8_OK, "fresh: %s", mxfp8_last_error_message());
        check_vs_oracle(&k1, &P, &c2, "bias, ON_I, fresh gradients");
        for (int j = 0; j < 6; j++)
            for (size_t i = 0; i < k2.n[j]; i++) ((float *)k2.p[j])[i] = uni(-1, 1);
        grads k0;
        grads_make(&k0, &P, MXFP8_DTYPE_F32, 1);
        for (int j = 0; j < 6; j++) memcpy(k0.p[j], k2.p[j], k2.n[j] * 4);
        c2.accumulate_hidden_states_grad = 1;
        c2.skip_grad_initialization = 1;
        CHECK(mxfp8_moe_backward(&A, &k2.g) == MXFP8_OK, "accumulate: %s", mxfp8_last_error_message());
        for (int j = 0; j < 6; j++) {
            int bad = 0;
            for (size_t i = 0; i < k2.n[j] && !bad; i++) {
                float want = j == 1 ? ((float *)k1.p[j])[i] : ((float *)k0.p[j])[i] + ((float *)k1.p[j])[i];
                bad = ((float *)k2.p[j])[i] != want;
            }
            CHECK(!bad, "accumulate: %s is not given + grad (affinity grad is overwritten)", GNAME[j]);
        }
        grads_free(&k0); grads_free(&k1); grads_free(&k2);
        prob_free(&P);
    }
}

int main(void) {
    test_route();
    test_vs_golden();
    test_checkpoints();
    test_prequantized();
    test_threads();
    test_errors();
    test_edges();
    if (g_fail) {
        printf("%d failure(s)\n", g_fail);
        return 1;
    }
    printf("all MoE tests passed\n");
    return 0;
}
