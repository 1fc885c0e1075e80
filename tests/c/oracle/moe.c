/*
 * moe.c -- the oracle's blockwise MoE layer (oracle.h), from the section "Blockwise MoE" of include/mxfp8.h, in FP64:
 *   forward, per block n (expert e = b2e[n]) and position q holding token t (padding: a zero row):
 *     g = clamp(X[t] @ W1[e][:, 0, :] + b1[e, 0]), u = clamp(X[t] @ W1[e][:, 1, :] + b1[e, 1]),
 *     inter = act(g) * u, down = inter @ W2[e] + b2[e], out[t] += a[t*E + e] * down
 *   backward (dY, loss = sum(out * dY)):
 *     ON_I: dI_raw = dY[t] @ W2[e]^T, da = sum_i dI_raw * inter + sum_h dY * b2, dI = a * dI_raw,
 *           dW2[e] += (a * inter)^T @ dY
 *     ON_H: D = a * dY[t], dI = D @ W2[e]^T, da = sum_h dY * down, dW2[e] += inter^T @ D
 *     dgate = pass(g) ? dI * u * act'(g) : 0, dup = pass(u) ? dI * act(g) : 0 (strict masks; NaN inside; an absent
 *     limit masks nothing), dX[t] += [dgate | dup] @ W1[e]^T, dW1[e] += X^T @ [dgate | dup],
 *     db1[e] += sum_q [dgate | dup], db2[e] += sum_q a * dY
 * Quantized: every GEMM operand is rounded to FP32 and MX-quantized (1x32 groups, fmt, rule) along that GEMM's
 * contraction axis -- H, I, H, 2I, and a block's positions for the weight gradients (groups from position 0;
 * padding rows are zeros) -- with this oracle's quantizer (quant.c), dequantized exactly; the products then sum in
 * FP64. Activations, masks, affinities and sums are FP64 throughout.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "oracle.h"

#define SWISH_BETA 1.702

static double sigmoid(double z) { return 1.0 / (1.0 + exp(-z)); }
static double act_f(int act, double g) {
    if (act == 1) return g * sigmoid(SWISH_BETA * g);
    if (act == 2) {
        const double r = g > 0.0 || isnan(g) ? g : 0.0; /* max(g, 0), NaN kept */
        return r * r;
    }
    return g * sigmoid(g);
}
static double act_df(int act, double g) {
    if (act == 1) {
        const double s = sigmoid(SWISH_BETA * g);
        return s + SWISH_BETA * g * s * (1.0 - s);
    }
    if (act == 2) return 2.0 * (g > 0.0 || isnan(g) ? g : 0.0);
    const double s = sigmoid(g);
    return s + g * s * (1.0 - s);
}
static double clampv(double x, double lo, double hi) {
    if (isnan(x)) return x;
    return x < lo ? lo : x > hi ? hi : x;
}
/* The clamp lets x through strictly inside its present limits; NaN counts as inside. */
static int passes(double x, double lo, double hi) {
    const int lo_ok = lo == -INFINITY || isnan(x) || x > lo;
    const int hi_ok = hi == INFINITY || isnan(x) || x < hi;
    return lo_ok && hi_ok;
}

/* One GEMM operand: q[r*K + k] = element (r, k) of x (at x[r*rs + k*ks]), quantized along k when m->quantized. */
static void operand(const orc_moe *m, const double *x, int64_t R, int64_t K, int64_t rs, int64_t ks, double *q,
                    float *tmp) {
    for (int64_t r = 0; r < R; r++) {
        if (!m->quantized) {
            for (int64_t k = 0; k < K; k++) q[r * K + k] = x[r * rs + k * ks];
            continue;
        }
        for (int64_t k = 0; k < K; k++) tmp[k] = (float)x[r * rs + k * ks];
        orc_qdq_line_f32(tmp, 1, K, m->fmt, m->rule, 0, tmp + K);
        for (int64_t k = 0; k < K; k++) q[r * K + k] = (double)tmp[K + k];
    }
}

typedef struct ws {
    double *qa, *qb; /* GEMM operands, up to max(B, H, 2I) x max(B, H, 2I) each */
    float *tmp;
    double *w1, *w2, *xb, *dyb, *gu, *g, *u, *ac, *inter, *down, *dI, *dgu, *dxb, *S;
} ws;

/* C[M][N] (+)= sum_k A(m, k) B(n, k); A(m, k) at A[m*ars + k*aks], B(n, k) at B[n*brs + k*bks]. */
static void mm(const orc_moe *m, ws *w, const double *A, int64_t ars, int64_t aks, const double *B, int64_t brs,
               int64_t bks, int64_t M, int64_t N, int64_t K, int acc, double *C) {
    operand(m, A, M, K, ars, aks, w->qa, w->tmp);
    operand(m, B, N, K, brs, bks, w->qb, w->tmp);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0.0;
            for (int64_t k = 0; k < K; k++) s += w->qa[i * K + k] * w->qb[j * K + k];
            C[i * N + j] = acc ? C[i * N + j] + s : s;
        }
}

static int ws_alloc(const orc_moe *m, ws *w) {
    const int64_t B = m->B, H = m->H, I = m->I, L = B > H ? B : H, D = L > 2 * I ? L : 2 * I;
    memset(w, 0, sizeof *w);
    double **d[] = {&w->w1, &w->w2, &w->xb, &w->dyb, &w->gu, &w->g, &w->u, &w->ac, &w->inter, &w->down,
                    &w->dI, &w->dgu, &w->dxb, &w->S, &w->qa, &w->qb};
    const int64_t n[] = {H * 2 * I, I * H, B * H, B * H, B * 2 * I, B * I, B * I, B * I, B * I, B * H,
                         B * I, B * 2 * I, B * H, B * I, D * D, D * D};
    int ok = 1;
    for (size_t i = 0; i < sizeof n / sizeof n[0]; i++) ok &= (*d[i] = calloc((size_t)n[i] + 1, 8)) != NULL;
    ok &= (w->tmp = calloc((size_t)(2 * D) + 1, 4)) != NULL;
    return ok ? 0 : -1;
}
static void ws_free(ws *w) {
    double *d[] = {w->w1, w->w2, w->xb, w->dyb, w->gu, w->g, w->u, w->ac, w->inter, w->down, w->dI, w->dgu,
                   w->dxb, w->S, w->qa, w->qb};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) free(d[i]);
    free(w->tmp);
}

static int is_real(const orc_moe *m, int32_t t) { return t != m->pad && t >= 0 && t < m->T; }

/* The forward of block n: xb (and dyb when dY), g, u, act, inter, down (with b2); W1[e] as [H][2I] (column j*I + i),
 * W2[e] as [I][H] in w->w1, w->w2. */
static void block_forward(const orc_moe *m, ws *w, int64_t n) {
    const int64_t B = m->B, H = m->H, I = m->I, I2 = 2 * I, e = m->b2e[n];
    const int32_t *tok = m->tok + n * B;
    for (int64_t h = 0; h < H; h++)
        for (int64_t c = 0; c < I2; c++) w->w1[h * I2 + c] = m->W1[(e * H + h) * I2 + c];
    for (int64_t i = 0; i < I * H; i++) w->w2[i] = m->W2[e * I * H + i];
    for (int64_t q = 0; q < B; q++)
        for (int64_t h = 0; h < H; h++) {
            const int r = is_real(m, tok[q]);
            w->xb[q * H + h] = r ? m->X[tok[q] * H + h] : 0.0;
            w->dyb[q * H + h] = r && m->dY ? m->dY[tok[q] * H + h] : 0.0;
        }
    /* GEMM 1 along H: X_blk [B, H] with W1[e] as [2I, H] */
    mm(m, w, w->xb, H, 1, w->w1, 1, I2, B, I2, H, 0, w->gu);
    for (int64_t q = 0; q < B; q++)
        for (int64_t i = 0; i < I; i++) {
            const int r = is_real(m, tok[q]);
            const double b1g = m->b1 ? m->b1[e * I2 + i] : 0.0, b1u = m->b1 ? m->b1[e * I2 + I + i] : 0.0;
            const double g = r ? clampv(w->gu[q * I2 + i] + b1g, m->gate_lo, m->gate_hi) : 0.0;
            const double u = r ? clampv(w->gu[q * I2 + I + i] + b1u, m->up_lo, m->up_hi) : 0.0;
            w->g[q * I + i] = g;
            w->u[q * I + i] = u;
            w->ac[q * I + i] = r ? act_f(m->act, g) : 0.0;
            w->inter[q * I + i] = w->ac[q * I + i] * u;
        }
    /* GEMM 2 along I: inter [B, I] with W2[e] as [H, I] */
    mm(m, w, w->inter, I, 1, w->w2, 1, H, B, H, I, 0, w->down);
    for (int64_t q = 0; q < B; q++)
        for (int64_t h = 0; h < H; h++)
            w->down[q * H + h] = is_real(m, tok[q]) ? w->down[q * H + h] + (m->b2 ? m->b2[e * H + h] : 0.0) : 0.0;
}

int orc_moe_forward(const orc_moe *m, double *out) {
    ws w;
    if (ws_alloc(m, &w)) return ws_free(&w), -1;
    memset(out, 0, sizeof(double) * (size_t)(m->T * m->H));
    for (int64_t n = 0; n < m->N; n++) {
        block_forward(m, &w, n);
        const int32_t *tok = m->tok + n * m->B;
        for (int64_t q = 0; q < m->B; q++) {
            if (!is_real(m, tok[q])) continue;
            const double a = m->a[tok[q] * m->E + m->b2e[n]];
            for (int64_t h = 0; h < m->H; h++) out[tok[q] * m->H + h] += a * w.down[q * m->H + h];
        }
    }
    ws_free(&w);
    return 0;
}

/* Phase 1 and the activation backward of block n (after block_forward): dI, the affinity gradients, dGU. */
static void block_phase1(const orc_moe *m, ws *w, int64_t n, orc_moe_grads *g) {
    const int64_t B = m->B, H = m->H, I = m->I, I2 = 2 * I, E = m->E, e = m->b2e[n];
    const int32_t *tok = m->tok + n * B;
    for (int64_t q = 0; q < B; q++) {
        const double a = is_real(m, tok[q]) ? m->a[tok[q] * E + e] : 0.0;
        for (int64_t h = 0; h < H; h++) w->dxb[q * H + h] = a * w->dyb[q * H + h]; /* D = a * dY (dxb as scratch) */
        for (int64_t i = 0; i < I; i++) w->S[q * I + i] = a * w->inter[q * I + i];
    }
    /* along H: dY_blk (ON_I) or D (ON_H) with W2[e] as [I, H] */
    mm(m, w, m->aff ? w->dxb : w->dyb, H, 1, w->w2, H, 1, B, I, H, 0, w->dI);
    for (int64_t q = 0; q < B; q++) {
        if (!is_real(m, tok[q])) {
            for (int64_t c = 0; c < I2; c++) w->dgu[q * I2 + c] = 0.0;
            continue;
        }
        const double a = m->a[tok[q] * E + e];
        double da = 0.0;
        if (!m->aff) {
            for (int64_t i = 0; i < I; i++) da += w->dI[q * I + i] * w->inter[q * I + i];
            if (m->b2)
                for (int64_t h = 0; h < H; h++) da += w->dyb[q * H + h] * m->b2[e * H + h];
        } else {
            for (int64_t h = 0; h < H; h++) da += w->dyb[q * H + h] * w->down[q * H + h];
        }
        g->da[tok[q] * E + e] += da;
        for (int64_t i = 0; i < I; i++) {
            const double dI = m->aff ? w->dI[q * I + i] : a * w->dI[q * I + i];
            const double gv = w->g[q * I + i], uv = w->u[q * I + i];
            w->dgu[q * I2 + i] = passes(gv, m->gate_lo, m->gate_hi) ? dI * uv * act_df(m->act, gv) : 0.0;
            w->dgu[q * I2 + I + i] = passes(uv, m->up_lo, m->up_hi) ? dI * w->ac[q * I + i] : 0.0;
        }
    }
}

/* Phases 2-4 and the bias sums of block n (after block_phase1; w->dxb still holds D = a * dY). */
static void block_phases234(const orc_moe *m, ws *w, int64_t n, orc_moe_grads *g) {
    const int64_t B = m->B, H = m->H, I = m->I, I2 = 2 * I, e = m->b2e[n];
    const int32_t *tok = m->tok + n * B;
    /* Phase 4 along the positions: (a * inter)^T @ dY_blk (ON_I) or inter^T @ D (ON_H) into dW2[e] [I, H] */
    mm(m, w, m->aff ? w->inter : w->S, 1, I, m->aff ? w->dxb : w->dyb, 1, H, I, H, B, 1, g->dW2 + e * I * H);
    if (g->db2)
        for (int64_t q = 0; q < B; q++)
            if (is_real(m, tok[q]))
                for (int64_t h = 0; h < H; h++) g->db2[e * H + h] += w->dxb[q * H + h];
    /* Phase 3 along the positions: X_blk^T @ dGU into dW1[e] [H, 2I] */
    mm(m, w, w->xb, 1, H, w->dgu, 1, I2, H, I2, B, 1, g->dW1 + e * H * I2);
    if (g->db1)
        for (int64_t q = 0; q < B; q++)
            for (int64_t c = 0; c < I2; c++) g->db1[e * I2 + c] += w->dgu[q * I2 + c];
    /* Phase 2 along 2I: dGU [B, 2I] with W1[e] as [H, 2I]; scattered into dX */
    mm(m, w, w->dgu, I2, 1, w->w1, I2, 1, B, H, I2, 0, w->dxb);
    for (int64_t q = 0; q < B; q++)
        if (is_real(m, tok[q]))
            for (int64_t h = 0; h < H; h++) g->dX[tok[q] * H + h] += w->dxb[q * H + h];
}

int orc_moe_backward(const orc_moe *m, orc_moe_grads *g) {
    ws w;
    if (ws_alloc(m, &w)) return ws_free(&w), -1;
    const int64_t T = m->T, H = m->H, I = m->I, E = m->E;
    memset(g->dX, 0, sizeof(double) * (size_t)(T * H));
    memset(g->da, 0, sizeof(double) * (size_t)(T * E));
    memset(g->dW1, 0, sizeof(double) * (size_t)(E * H * 2 * I));
    memset(g->dW2, 0, sizeof(double) * (size_t)(E * I * H));
    if (g->db1) memset(g->db1, 0, sizeof(double) * (size_t)(E * 2 * I));
    if (g->db2) memset(g->db2, 0, sizeof(double) * (size_t)(E * H));
    for (int64_t n = 0; n < m->N; n++) {
        block_forward(m, &w, n);
        block_phase1(m, &w, n, g);
        block_phases234(m, &w, n, g);
    }
    ws_free(&w);
    return 0;
}
