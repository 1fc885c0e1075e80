/*
 * mpi_problem.h -- the gathered MoE problem the MPI tests share (header-only). Every rank builds the same global
 * problem from a seed (tokens of all ranks, all experts), then takes its slice: rank r's tokens are rows
 * [o_r, o_r + T_r), its experts mxfp8_mpi_moe_expert_range's. Slices point into the global arrays (no copies).
 * The oracle of the tests is the single-process libmxfp8 layer (mxfp8_moe_route + mxfp8_moe_forward /
 * mxfp8_moe_backward) on the whole problem: the determinism contract of include/mxfp8_mpi.h.
 */
#ifndef MXFP8_TESTS_MPI_PROBLEM_H
#define MXFP8_TESTS_MPI_PROBLEM_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mxfp8_mpi.h"
#include "testutil.h"

/* The MPI tests' check: counts, and prints the first 20 failures with this rank's number (each rank checks its own
 * slice; main reduces g_fail over the ranks). */
static int g_rank, g_size;
static long g_fail, g_checks;
#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        g_checks++;                                                                                                    \
        if (!(cond)) {                                                                                                 \
            if (g_fail++ < 20) {                                                                                       \
                fprintf(stderr, "FAIL rank %d %s:%d: ", g_rank, __FILE__, __LINE__);                                  \
                fprintf(stderr, __VA_ARGS__);                                                                          \
                fputc('\n', stderr);                                                                                   \
            }                                                                                                          \
        }                                                                                                              \
    } while (0)

typedef struct tcase {
    const char *name;
    int64_t H, I, E, K, B;
    int by_affinities;           /* route by expert_affinities_masked instead of topk ids */
    mxfp8_dtype xdt, odt, gdt;   /* hidden_states / dY, forward output, gradients */
    mxfp8_mpi_wire wire;
    int keep, bias, prequant;
    mxfp8_affinity_option aff;
    mxfp8_activation act;
    mxfp8_format quant;
    mxfp8_scale_rule rule;
    float glo, ghi, ulo, uhi;
    int skip_token, acc, sgi;
    int empty_expert;            /* an expert no token routes to, or -1 */
    int tokens;                  /* 0: uneven with a rank of none; 1: all on the last rank; 2: none anywhere;
                                    3: 5 + 3 r on rank r (every rank has some); 4: larger, uneven, a rank of none */
    int ftz;                     /* the ranks call with FTZ and DAZ set, on a problem whose sums are subnormal: W2 zero,
                                    b2 and the given dX (F32) subnormal */
} tcase;

/* Rank r's token count for P ranks. */
static inline int64_t mp_tokens(const tcase *c, int P, int r) {
    static const int64_t uneven[4] = {13, 0, 29, 7};
    if (c->tokens == 1) return r == P - 1 ? 40 : 0;
    if (c->tokens == 2) return 0;
    if (c->tokens == 3) return 5 + 3 * r;
    if (c->tokens == 4) {
        static const int64_t larger[4] = {400, 0, 250, 130};
        return larger[r % 4];
    }
    return uneven[r % 4];
}

typedef struct mp {
    int64_t T, H, I, E, K, B, N, G2I, GH, GI;
    int64_t *off;                /* [P + 1] first token of each rank */
    void *X, *dY;                /* [T, H] of xdt */
    float *Xw, *dYw;             /* the MX round trip of X, dY (F32) for the MXFP8 wire oracle */
    int32_t *ids;                /* [T, K] */
    float *wts;                  /* [T, K] */
    float *W1, *W2, *b1, *b2;    /* [E, H, 2, I], [E, I, H], [E, 2, I], [E, H] */
    uint8_t *W1f, *W1fs, *W2f, *W2fs, *W1b, *W1bs, *W2b, *W2bs; /* pre-quantized: forward / backward axes */
    int32_t *tok, *b2e;          /* routing of the gathered problem */
    float *a;                    /* [T*E] */
    void *gdx, *gW1, *gW2, *gb1, *gb2; /* given gradient buffers (acc / sgi), gdt */
} mp;

static inline mxfp8_tensor mpv(void *d, mxfp8_dtype dt, int n, int64_t a, int64_t b, int64_t c, int64_t e) {
    const int64_t s[4] = {a, b, c, e};
    return mxfp8_tensor_make(d, dt, n, s);
}

static inline void mp_store(void *buf, mxfp8_dtype dt, int64_t i, float v) {
    if (dt == MXFP8_DTYPE_F32) ((float *)buf)[i] = v;
    else if (dt == MXFP8_DTYPE_BF16) ((uint16_t *)buf)[i] = mxfp8_fp32_to_bf16(v);
    else ((uint16_t *)buf)[i] = mxfp8_fp32_to_fp16(v);
}

static inline void *mp_random(int64_t n, mxfp8_dtype dt, double lo, double hi, tu_rng *g) {
    void *b = tu_alloc((size_t)(n > 0 ? n : 1) * mxfp8_dtype_size(dt));
    for (int64_t i = 0; i < n; i++) mp_store(b, dt, i, (float)(lo + (hi - lo) * tu_uniform(g)));
    return b;
}

/* Activations of varying magnitude: U(lo, hi) * 2^k, k uniform in [-6, 2] per element, so that MX groups along H
 * and along the token positions get different scales (with one dominant binade the MX round trip of the MXFP8 wire
 * would be invisible to the kernels, which re-quantize with the same scale). */
static inline void *mp_activations(int64_t n, mxfp8_dtype dt, double lo, double hi, tu_rng *g) {
    void *b = tu_alloc((size_t)(n > 0 ? n : 1) * mxfp8_dtype_size(dt));
    for (int64_t i = 0; i < n; i++)
        mp_store(b, dt, i, ldexpf((float)(lo + (hi - lo) * tu_uniform(g)), (int)(tu_next(g) % 9) - 6));
    return b;
}

/* X' = dequantize(quantize(X along H)) in F32 (the MXFP8 wire's round trip). */
static inline float *mp_round_trip(const void *x, mxfp8_dtype dt, int64_t T, int64_t H, const tcase *c) {
    const int64_t G = (H + 31) / 32;
    uint8_t *q = tu_alloc((size_t)(T * H + 1)), *s = tu_alloc((size_t)(T * G + 1));
    float *out = tu_alloc(sizeof(float) * (size_t)(T * H + 1));
    mxfp8_tensor vx = mpv((void *)x, dt, 2, T, H, 0, 0), vq = mpv(q, c->quant ? MXFP8_DTYPE_E5M2 : MXFP8_DTYPE_E4M3,
                                                                   2, T, H, 0, 0);
    mxfp8_tensor vs = mpv(s, MXFP8_DTYPE_E8M0, 2, T, G, 0, 0), vo = mpv(out, MXFP8_DTYPE_F32, 2, T, H, 0, 0);
    mxfp8_quant_params qp = mxfp8_quant_params_default();
    qp.fmt = c->quant;
    qp.rule = c->rule;
    if (mxfp8_quantize(&vx, 1, &qp, &vq, &vs) || mxfp8_dequantize(&vq, &vs, 1, MXFP8_GROUP_1X32, &vo)) {
        fprintf(stderr, "mp_round_trip: %s\n", mxfp8_last_error_message());
        exit(2);
    }
    free(q);
    free(s);
    return out;
}

/* Quantize w (F32, ndim dims) along axis into codes + scales (allocated). */
static inline void mp_prequant(const float *w, int ndim, const int64_t *shape, int axis, const tcase *c,
                               uint8_t **codes, uint8_t **scales) {
    int64_t ss[4], n = 1, ns = 1;
    for (int i = 0; i < ndim; i++) {
        ss[i] = i == axis ? (shape[i] + 31) / 32 : shape[i];
        n *= shape[i];
        ns *= ss[i];
    }
    *codes = tu_alloc((size_t)n);
    *scales = tu_alloc((size_t)ns);
    mxfp8_tensor vw = mxfp8_tensor_make((void *)w, MXFP8_DTYPE_F32, ndim, shape);
    mxfp8_tensor vc = mxfp8_tensor_make(*codes, c->quant ? MXFP8_DTYPE_E5M2 : MXFP8_DTYPE_E4M3, ndim, shape);
    mxfp8_tensor vs = mxfp8_tensor_make(*scales, MXFP8_DTYPE_E8M0, ndim, ss);
    mxfp8_quant_params qp = mxfp8_quant_params_default();
    qp.fmt = c->quant;
    qp.rule = c->rule;
    if (mxfp8_quantize(&vw, axis, &qp, &vc, &vs)) {
        fprintf(stderr, "mp_prequant: %s\n", mxfp8_last_error_message());
        exit(2);
    }
}

static inline void mp_config(const tcase *c, mxfp8_moe_config *cfg) {
    mxfp8_moe_config_init(cfg);
    cfg->quant_dtype = c->quant;
    cfg->scale_rule = c->rule;
    cfg->activation = c->act;
    cfg->affinity_option = c->aff;
    cfg->gate_clamp_lower = c->glo;
    cfg->gate_clamp_upper = c->ghi;
    cfg->up_clamp_lower = c->ulo;
    cfg->up_clamp_upper = c->uhi;
    cfg->skip_token = c->skip_token;
    cfg->accumulate_hidden_states_grad = c->acc;
    cfg->skip_grad_initialization = c->sgi;
    cfg->bias = c->bias;
}

/* The gathered problem for P ranks, routed with mxfp8_moe_route. */
static inline void mp_make(mp *m, const tcase *c, int P, uint64_t seed) {
    memset(m, 0, sizeof *m);
    tu_rng g = {seed};
    m->H = c->H; m->I = c->I; m->E = c->E; m->K = c->K; m->B = c->B;
    m->off = tu_alloc(sizeof(int64_t) * (size_t)(P + 1));
    m->off[0] = 0;
    for (int r = 0; r < P; r++) m->off[r + 1] = m->off[r] + mp_tokens(c, P, r);
    const int64_t T = m->T = m->off[P], H = c->H, I = c->I, E = c->E, K = c->K;
    m->X = mp_activations(T * H, c->xdt, 0, 1, &g);
    m->dY = mp_activations(T * H, c->xdt, -1, 1, &g);
    m->W1 = mp_random(E * H * 2 * I, MXFP8_DTYPE_F32, -0.1, 0.1, &g);
    m->W2 = mp_random(E * I * H, MXFP8_DTYPE_F32, -0.1, 0.1, &g);
    m->b1 = mp_random(E * 2 * I, MXFP8_DTYPE_F32, -0.3, 0.3, &g);
    m->b2 = mp_random(E * H, MXFP8_DTYPE_F32, -0.3, 0.3, &g);
    m->ids = tu_alloc(sizeof(int32_t) * (size_t)(T * K + 1));
    m->wts = tu_alloc(sizeof(float) * (size_t)(T * K + 1));
    for (int64_t t = 0; t < T; t++) { /* K distinct experts, never c->empty_expert */
        for (int64_t k = 0; k < K; k++) {
            int32_t e;
            int again;
            do {
                e = (int32_t)(tu_next(&g) % (uint64_t)E);
                again = e == c->empty_expert;
                for (int64_t j = 0; j < k; j++) again |= m->ids[t * K + j] == e;
            } while (again);
            m->ids[t * K + k] = e;
            m->wts[t * K + k] = (float)(0.05 + 0.95 * tu_uniform(&g));
        }
    }
    if (mxfp8_moe_num_blocks(T, K, E, c->B, &m->N)) exit(2);
    m->tok = tu_alloc(sizeof(int32_t) * (size_t)(m->N * c->B + 1));
    m->b2e = tu_alloc(sizeof(int32_t) * (size_t)(m->N + 1));
    m->a = tu_alloc(sizeof(float) * (size_t)(T * E + 1));
    mxfp8_tensor ti = mpv(m->ids, MXFP8_DTYPE_I32, 2, T, K, 0, 0), tw = mpv(m->wts, MXFP8_DTYPE_F32, 2, T, K, 0, 0);
    mxfp8_tensor tp = mpv(m->tok, MXFP8_DTYPE_I32, 1, m->N * c->B, 0, 0, 0);
    mxfp8_tensor tb = mpv(m->b2e, MXFP8_DTYPE_I32, 1, m->N, 0, 0, 0), ta = mpv(m->a, MXFP8_DTYPE_F32, 1, T * E, 0, 0, 0);
    if (mxfp8_moe_route(&ti, &tw, E, c->B, c->skip_token ? -1 : (int32_t)T, &tp, &tb, &ta)) {
        fprintf(stderr, "mp_make: route: %s\n", mxfp8_last_error_message());
        exit(2);
    }
    if (c->wire == MXFP8_MPI_WIRE_MXFP8) {
        m->Xw = mp_round_trip(m->X, c->xdt, T, H, c);
        m->dYw = mp_round_trip(m->dY, c->xdt, T, H, c);
    }
    if (c->prequant) {
        const int64_t s1[4] = {E, H, 2, I}, s2[3] = {E, I, H}, s1b[3] = {E, H, 2 * I};
        mp_prequant(m->W1, 4, s1, 1, c, &m->W1f, &m->W1fs);
        mp_prequant(m->W2, 3, s2, 1, c, &m->W2f, &m->W2fs);
        mp_prequant(m->W1, 3, s1b, 2, c, &m->W1b, &m->W1bs);
        mp_prequant(m->W2, 3, s2, 2, c, &m->W2b, &m->W2bs);
    }
    m->gdx = mp_random(T * H, c->gdt, -1, 1, &g);
    if (c->ftz) { /* the output is a * b2 per pair, dX the given value: subnormal sums (scaled by 2^-130, exact) */
        memset(m->W2, 0, sizeof(float) * (size_t)(E * I * H));
        for (int64_t i = 0; i < E * H; i++) m->b2[i] = ldexpf(m->b2[i], -130);
        for (int64_t i = 0; c->gdt == MXFP8_DTYPE_F32 && i < T * H; i++)
            ((float *)m->gdx)[i] = ldexpf(((float *)m->gdx)[i], -130);
    }
    m->gW1 = mp_random(E * H * 2 * I, c->gdt, -1, 1, &g);
    m->gW2 = mp_random(E * I * H, c->gdt, -1, 1, &g);
    m->gb1 = mp_random(E * 2 * I, c->gdt, -1, 1, &g);
    m->gb2 = mp_random(E * H, c->gdt, -1, 1, &g);
}

static inline void mp_free(mp *m) {
    void *p[] = {m->off, m->X, m->dY, m->Xw, m->dYw, m->ids, m->wts, m->W1, m->W2, m->b1, m->b2, m->W1f, m->W1fs,
                 m->W2f, m->W2fs, m->W1b, m->W1bs, m->W2b, m->W2bs, m->tok, m->b2e, m->a, m->gdx, m->gW1, m->gW2,
                 m->gb1, m->gb2};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
}

/* Pointer to element i of a typed buffer. */
static inline void *mp_at(const void *b, mxfp8_dtype dt, int64_t i) {
    return (char *)b + (size_t)i * mxfp8_dtype_size(dt);
}

#endif /* MXFP8_TESTS_MPI_PROBLEM_H */
