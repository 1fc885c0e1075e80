/*
 * moe_util.h -- what the blockwise MoE tests (test_moe.c, test_moe_edges.c) share: a CHECK macro, a random problem
 * routed with mxfp8_moe_route, argument set-up, gradient sets with their comparisons, and the check of a kernel's
 * gradients against the tests' independent FP64 oracle (tests/c/oracle/moe.c). Header-only: each test is its own
 * executable.
 */
#ifndef MXFP8_TEST_MOE_UTIL_H
#define MXFP8_TEST_MOE_UTIL_H

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
static inline double urand(void) { /* [0, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) * (1.0 / 9007199254740992.0);
}
static inline float uni(double lo, double hi) { return (float)(lo + (hi - lo) * urand()); }

/* ---- a problem ---- */
typedef struct prob {
    int64_t T, H, I, E, K, B, N;
    float *X, *W1, *W2, *a, *dY, *b1, *b2;
    int32_t *tok, *b2e;
    int pad; /* padding id used */
} prob;

static inline mxfp8_tensor v2(void *d, mxfp8_dtype dt, int64_t a, int64_t b) {
    int64_t s[2] = {a, b};
    return mxfp8_tensor_make(d, dt, 2, s);
}
static inline mxfp8_tensor v3(void *d, mxfp8_dtype dt, int64_t a, int64_t b, int64_t c) {
    int64_t s[3] = {a, b, c};
    return mxfp8_tensor_make(d, dt, 3, s);
}
static inline mxfp8_tensor v4(void *d, mxfp8_dtype dt, int64_t a, int64_t b, int64_t c, int64_t e) {
    int64_t s[4] = {a, b, c, e};
    return mxfp8_tensor_make(d, dt, 4, s);
}
static inline mxfp8_tensor v1(void *d, mxfp8_dtype dt, int64_t a) { return mxfp8_tensor_make(d, dt, 1, &a); }

static inline void *xc(size_t n) { return calloc(n ? n : 1, 1); }

/* Random problem routed with mxfp8_moe_route; counts != NULL forces per-expert token counts (K = 1). */
static inline void prob_make(prob *P, int64_t T, int64_t H, int64_t I, int64_t E, int64_t K, int64_t B, int skip_token,
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
static inline void prob_free(prob *P) {
    free(P->X); free(P->dY); free(P->W1); free(P->W2); free(P->b1); free(P->b2); free(P->a); free(P->tok);
    free(P->b2e);
}

static inline void bwd_args(const prob *P, const mxfp8_moe_config *cfg, mxfp8_moe_bwd_args *A) {
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
static inline void fwd_args(const prob *P, const mxfp8_moe_config *cfg, mxfp8_moe_fwd_args *A) {
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
static inline void grads_make(grads *G, const prob *P, mxfp8_dtype dt, int bias) {
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
static inline void grads_free(grads *G) {
    for (int i = 0; i < 6; i++) free(G->p[i]);
}
static inline double gval(const grads *G, int k, size_t i) {
    return G->dt == MXFP8_DTYPE_F64 ? ((double *)G->p[k])[i] : (double)((float *)G->p[k])[i];
}
static inline int grads_bitwise(const grads *a, const grads *b, int bias, const char *what) {
    for (int k = 0; k < (bias ? 6 : 4); k++)
        if (memcmp(a->p[k], b->p[k], a->n[k] * mxfp8_dtype_size(a->dt))) {
            CHECK(0, "%s: %s differs bitwise", what, GNAME[k]);
            return 0;
        }
    return 1;
}
/* Normwise relative error ||k - g|| / ||g|| per gradient; returns the max over gradients. */
static int g_worst_grad = 0; /* index of the worst gradient of the last grads_relerr */
static inline double grads_relerr(const grads *k, const grads *g, int bias, double *per) {
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
static inline int grads_finite(const grads *G, int bias) {
    for (int k = 0; k < (bias ? 6 : 4); k++)
        for (size_t i = 0; i < G->n[k]; i++)
            if (!isfinite(gval(G, k, i))) return 0;
    return 1;
}

/* ---- the tests' independent oracle (tests/c/oracle/moe.c): FP64 on its own quantized GEMM operands ---- */
static inline orc_moe oracle_problem(const prob *P, const mxfp8_moe_config *cfg) {
    orc_moe m = {P->T, P->H, P->I, P->E, P->N, P->B, P->X, P->W1, P->W2, P->a, P->dY,
                 cfg->bias ? P->b1 : NULL, cfg->bias ? P->b2 : NULL, P->tok, P->b2e, cfg->skip_token ? -1 : (int32_t)P->T,
                 (int)cfg->quant_dtype, (int)cfg->scale_rule, (int)cfg->activation, (int)cfg->affinity_option,
                 cfg->gate_clamp_lower, cfg->gate_clamp_upper, cfg->up_clamp_lower, cfg->up_clamp_upper, 1};
    return m;
}
/* The oracle's gradients of P under cfg, as an F64 gradient set. */
static inline void oracle_grads(const prob *P, const mxfp8_moe_config *cfg, grads *o) {
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
static inline double check_vs_oracle(const grads *k, const prob *P, const mxfp8_moe_config *cfg, const char *what) {
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

#endif /* MXFP8_TEST_MOE_UTIL_H */
