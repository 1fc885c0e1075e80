/*
 * moe_golden.c -- FP64 golden references of the blockwise MoE layer and its backward (scalar, obvious, slow).
 *
 * Contract (include/mxfp8.h, mxfp8_moe_forward_golden / mxfp8_moe_backward_golden): same validation as the
 * kernels, outputs F64 or F32. The forward recomputes every intermediate in FP64 from the inputs; the backward
 * takes the checkpoints it is given exactly as the kernel does (gold_block_ck) and recomputes the rest.
 * quantized = 1 replaces each GEMM operand by its MX quantize-dequantize along that GEMM's
 * contraction axis (values rounded to FP32 first, the quantizer's input type; mxfp8i_qdq_group_ref, 1x32 groups;
 * along a block's positions the groups start at position 0), then multiplies in FP64. Pre-quantized weights are
 * used as given where their axis matches, re-quantized from their exact values otherwise (as the kernels do).
 */
#include <stdlib.h>

#include "moe.h"

typedef struct gold {
    const mxfp8i_moe *p;
    int quantized;
    float *w1f, *w2f, *bf;              /* exact FP32 weights of the current expert; bias scratch */
    double *w1_h, *w1_2i, *w2_i, *w2_h; /* W1 [H][2I] / W2 [I][H] as each GEMM sees them */
    double *b1, *b2;
    int64_t e;
    /* block buffers */
    double *xb, *dyb, *g, *u, *act, *inter, *down, *dI, *dgu, *dxb, *S, *D, *qa, *qb;
} gold;

static void gold_free(gold *G) {
    free(G->w1f);
    free(G->w2f);
    free(G->bf);
    free(G->w1_h);
    free(G->w1_2i);
    free(G->w2_i);
    free(G->w2_h);
    free(G->b1);
    free(G->b2);
    free(G->xb);
    free(G->dyb);
    free(G->g);
    free(G->u);
    free(G->act);
    free(G->inter);
    free(G->down);
    free(G->dI);
    free(G->dgu);
    free(G->dxb);
    free(G->S);
    free(G->D);
    free(G->qa);
    free(G->qb);
}

static bool gold_alloc(gold *G, const mxfp8i_moe *p, int quantized) {
    memset(G, 0, sizeof *G);
    G->p = p;
    G->quantized = quantized;
    G->e = -1;
    const size_t HI = (size_t)p->H * (size_t)p->I, B = (size_t)p->Bw, H = (size_t)p->H, I = (size_t)p->I;
    const size_t big = (B * H > B * 2 * I ? B * H : B * 2 * I) + (2 * HI > B * H ? 2 * HI : B * H) + 1;
    G->w1f = malloc(2 * HI * sizeof(float));
    G->w2f = malloc(HI * sizeof(float));
    G->bf = malloc((2 * I > H ? 2 * I : H) * sizeof(float));
    G->w1_h = malloc(2 * HI * sizeof(double));
    G->w1_2i = malloc(2 * HI * sizeof(double));
    G->w2_i = malloc(HI * sizeof(double));
    G->w2_h = malloc(HI * sizeof(double));
    G->b1 = malloc(2 * I * sizeof(double));
    G->b2 = malloc(H * sizeof(double));
    G->xb = malloc(B * H * sizeof(double));
    G->dyb = malloc(B * H * sizeof(double));
    G->g = malloc(B * I * sizeof(double));
    G->u = malloc(B * I * sizeof(double));
    G->act = malloc(B * I * sizeof(double));
    G->inter = malloc(B * I * sizeof(double));
    G->down = malloc(B * H * sizeof(double));
    G->dI = malloc(B * I * sizeof(double));
    G->dgu = malloc(B * 2 * I * sizeof(double));
    G->dxb = malloc(B * H * sizeof(double));
    G->S = malloc(B * I * sizeof(double));
    G->D = malloc(B * H * sizeof(double));
    G->qa = malloc(big * sizeof(double));
    G->qb = malloc(big * sizeof(double));
    bool ok = G->w1f && G->w2f && G->bf && G->w1_h && G->w1_2i && G->w2_i && G->w2_h && G->b1 && G->b2 && G->xb &&
              G->dyb && G->g && G->u && G->act && G->inter && G->down && G->dI && G->dgu && G->dxb && G->S && G->D &&
              G->qa && G->qb;
    if (!ok) gold_free(G);
    return ok;
}

/* Quantize-dequantize in place `lines` lines of K values (element (l, k) at x[l*ls + k*ks]) along K. */
static void qdq_lines(const mxfp8i_moe *p, double *x, int64_t lines, int64_t K, int64_t ls, int64_t ks) {
#pragma omp parallel num_threads(mxfp8i_moe_nt((double)lines *(double)K))
    {
        const unsigned csr = mxfp8i_fenv_enter(); /* IEEE defaults on every thread of the region */
#pragma omp for schedule(static) nowait
        for (int64_t l = 0; l < lines; l++)
            for (int64_t k0 = 0; k0 < K; k0 += 32) {
                float v[32], o[32];
                int nk = (int)(K - k0 < 32 ? K - k0 : 32);
                for (int i = 0; i < nk; i++) v[i] = (float)x[l * ls + (k0 + i) * ks];
                mxfp8i_qdq_group_ref(v, nk, p->rc.fmt, p->rc.rule, o);
                for (int i = 0; i < nk; i++) x[l * ls + (k0 + i) * ks] = (double)o[i];
            }
        mxfp8i_fenv_leave(csr);
    }
}

static void gold_expert(gold *G, int64_t e) {
    if (G->e == e) return;
    const mxfp8i_moe *p = G->p;
    const int64_t H = p->H, I = p->I, I2 = 2 * I;
    mxfp8i_moe_load_w1(p, e, G->w1f);
    mxfp8i_moe_load_w2(p, e, G->w2f);
    for (int64_t k = 0; k < H * I2; k++) G->w1_h[k] = G->w1_2i[k] = (double)G->w1f[k];
    for (int64_t k = 0; k < I * H; k++) G->w2_i[k] = G->w2_h[k] = (double)G->w2f[k];
    if (G->quantized) {
        /* W1 [H][2I]: along H = lines are the 2I columns; along 2I = rows. W2 [I][H]: along I = columns; H = rows. */
        if (p->bwd || !p->w1_prequant) qdq_lines(p, G->w1_h, I2, H, 1, I2);
        if (!p->bwd || !p->w1_prequant) qdq_lines(p, G->w1_2i, H, I2, I2, 1);
        if (p->bwd || !p->w2_prequant) qdq_lines(p, G->w2_i, H, I, 1, H);
        if (!p->bwd || !p->w2_prequant) qdq_lines(p, G->w2_h, I, H, H, 1);
    }
    mxfp8i_moe_load_b1(p, e, G->bf);
    for (int64_t k = 0; k < I2; k++) G->b1[k] = (double)G->bf[k];
    mxfp8i_moe_load_b2(p, e, G->bf);
    for (int64_t h = 0; h < H; h++) G->b2[h] = (double)G->bf[h];
    G->e = e;
}

/* C[m][n] (=|+=) sum_k A(m, k) * B(n, k), A(m, k) = a[m*ars + k*aks], B(n, k) = b[n*brs + k*bks]; the operands
 * are first copied and (quantized mode) quantize-dequantized along k unless *_preq says they already are. */
static void gold_gemm(gold *G, int64_t M, int64_t N, int64_t K, const double *a, int64_t ars, int64_t aks, int a_preq,
                      const double *b, int64_t brs, int64_t bks, int b_preq, double *C, int64_t ldc, int accumulate) {
    double *qa = G->qa, *qb = G->qb; /* copies [M][K], [K][N] */
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) qa[m * K + k] = a[m * ars + k * aks];
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) qb[k * N + n] = b[n * brs + k * bks];
    if (G->quantized) {
        if (!a_preq) qdq_lines(G->p, qa, M, K, K, 1);
        if (!b_preq) qdq_lines(G->p, qb, N, K, 1, N);
    }
    /* rows of C split between threads; each element summed over k in ascending order */
#pragma omp parallel num_threads(mxfp8i_moe_nt((double)M *(double)N *(double)K / 64.0))
    {
        const unsigned csr = mxfp8i_fenv_enter(); /* IEEE defaults on every thread of the region */
#pragma omp for schedule(static) nowait
        for (int64_t m = 0; m < M; m++) {
            double *c = C + m * ldc;
            if (!accumulate)
                for (int64_t n = 0; n < N; n++) c[n] = 0.0;
            for (int64_t k = 0; k < K; k++) {
                const double av = qa[m * K + k];
                const double *br = qb + k * N;
                for (int64_t n = 0; n < N; n++) c[n] += av * br[n];
            }
        }
        mxfp8i_fenv_leave(csr);
    }
}

/* down = inter @ W2 + b2 of block n on positions [0, L) (0 at padding). */
static void gold_block_down(gold *G, int64_t n, int64_t L) {
    const mxfp8i_moe *p = G->p;
    const int64_t H = p->H, I = p->I;
    const int32_t *tok = p->tok + n * p->B;
    /* GEMM 2: contraction I; W2 [I][H] as operand [H rows, K = I]: (r, k) at r + k*H */
    gold_gemm(G, L, H, I, G->inter, I, 1, 0, G->w2_i, 1, H, 1, G->down, H, 0);
    for (int64_t q = 0; q < L; q++)
        for (int64_t h = 0; h < H; h++) G->down[q * H + h] = tok[q] >= 0 ? G->down[q * H + h] + G->b2[h] : 0.0;
}

/* The forward of block n on positions [0, L): g, u, act, inter (0 at padding) and down = inter @ W2 + b2. */
static void gold_block_fwd(gold *G, int64_t n, int64_t L, int want_down) {
    const mxfp8i_moe *p = G->p;
    const mxfp8_moe_config *c = &p->cfg;
    const int64_t H = p->H, I = p->I, I2 = 2 * I, B = p->B;
    const int32_t *tok = p->tok + n * B;
    double *gu = G->dgu; /* scratch [L][2I] */
    for (int64_t q = 0; q < L; q++)
        for (int64_t h = 0; h < H; h++) G->xb[q * H + h] = tok[q] >= 0 ? (double)mxfp8i_moe_ld2(&p->X, tok[q], h) : 0.0;
    /* GEMM 1: contraction H; W1 [H][2I] as operand [2I rows, K = H]: (r, k) at r + k*2I */
    gold_gemm(G, L, I2, H, G->xb, H, 1, 0, G->w1_h, 1, I2, 1, gu, I2, 0);
    for (int64_t q = 0; q < L; q++)
        for (int64_t i = 0; i < I; i++) {
            double gv = 0, uv = 0, av = 0, iv = 0;
            if (tok[q] >= 0) {
                gv = mxfp8i_moe_clamp_d(gu[q * I2 + i] + G->b1[i], c->gate_clamp_lower, c->gate_clamp_upper);
                uv = mxfp8i_moe_clamp_d(gu[q * I2 + I + i] + G->b1[I + i], c->up_clamp_lower, c->up_clamp_upper);
                av = mxfp8i_moe_act_d(c, gv);
                iv = av * mxfp8i_moe_up_d(c, uv);
            }
            G->g[q * I + i] = gv;
            G->u[q * I + i] = uv;
            G->act[q * I + i] = av;
            G->inter[q * I + i] = iv;
        }
    if (want_down) gold_block_down(G, n, L);
}

/* The backward's forward values of block n taken from the checkpoints it was given, as the kernel takes them
 * (bwd_block.c): g and u from gate_up_proj_act_checkpoint_T (not clamped again), act(g) from gate_act_checkpoint_T
 * else recomputed from g, inter from intermediate_checkpoint_T else from act and u; the Phase 4 operand S and the
 * AFFINITY_ON_H operand D and down projection from their checkpoints where given (else S = a*inter, D = a*dY, down
 * recomputed from inter). Checkpoint values enter exactly (widened to FP64). */
static void gold_block_ck(gold *G, const mxfp8_moe_bwd_args *a, int64_t n, int64_t L, int onH) {
    const mxfp8i_moe *p = G->p;
    const mxfp8_moe_config *c = &p->cfg;
    const int64_t H = p->H, I = p->I, B = p->B;
    const int32_t *tok = p->tok + n * B;
    const mxfp8_tensor *gu = &a->gate_up_proj_act_checkpoint_T, *ac = &a->gate_act_checkpoint_T,
                       *in = &a->intermediate_checkpoint_T, *sc = &a->scaled_intermediate_checkpoint_T,
                       *dc = &a->down_proj_act_checkpoint, *oc = &a->down_proj_output_checkpoint;
    for (int64_t q = 0; q < L; q++) {
        if (tok[q] < 0) continue; /* padding: the zeros of gold_block_fwd */
        const double aq = (double)mxfp8i_moe_aff(p, tok[q], p->expert[n]);
        for (int64_t i = 0; i < I; i++) {
            const int64_t k = q * I + i;
            if (gu->data) {
                const int64_t o = n * gu->strides[0] + i * gu->strides[2] + q * gu->strides[3];
                G->g[k] = mxfp8i_moe_ld(gu, o);
                G->u[k] = mxfp8i_moe_ld(gu, o + gu->strides[1]);
            }
            G->act[k] = ac->data ? mxfp8i_moe_ld(ac, n * ac->strides[0] + i * ac->strides[1] + q * ac->strides[2])
                                 : mxfp8i_moe_act_d(c, G->g[k]);
            G->inter[k] = in->data ? mxfp8i_moe_ld(in, n * in->strides[0] + i * in->strides[1] + q * in->strides[2])
                                   : G->act[k] * mxfp8i_moe_up_d(c, G->u[k]);
            G->S[k] = sc->data && !onH ? mxfp8i_moe_ld(sc, n * sc->strides[0] + i * sc->strides[1] + q * sc->strides[2])
                                       : aq * G->inter[k];
        }
        if (onH && dc->data)
            for (int64_t h = 0; h < H; h++)
                G->D[q * H + h] = mxfp8i_moe_ld(dc, n * dc->strides[0] + q * dc->strides[1] + h * dc->strides[2]);
    }
    if (!onH) return;
    if (!oc->data) {
        gold_block_down(G, n, L);
        return;
    }
    for (int64_t q = 0; q < L; q++)
        for (int64_t h = 0; h < H; h++)
            G->down[q * H + h] =
                tok[q] >= 0 ? mxfp8i_moe_ld(oc, n * oc->strides[0] + q * oc->strides[1] + h * oc->strides[2]) : 0.0;
}

static void *xcalloc(int64_t n, size_t es, bool *ok) {
    void *q = calloc((size_t)(n > 0 ? n : 1), es);
    if (!q) *ok = false;
    return q;
}

static mxfp8_status forward_golden(const mxfp8_moe_fwd_args *args, mxfp8_moe_fwd_outputs *outputs, int quantized) {
    static const char *fn = "mxfp8_moe_forward_golden";
    MXFP8I_RETURN_ERROR_IF(!args, MXFP8_ERR_NULL_POINTER, "%s: args is NULL", fn);
    MXFP8I_RETURN_ERROR_IF(!outputs, MXFP8_ERR_NULL_POINTER, "%s: outputs is NULL", fn);
    MXFP8I_RETURN_ERROR_IF(quantized != 0 && quantized != 1, MXFP8_ERR_INVALID_ARGUMENT,
                           "%s: quantized %d is not 0 or 1", fn, quantized);
    mxfp8i_moe_in in;
    mxfp8i_moe_in_fwd(args, &in);
    mxfp8i_moe p;
    mxfp8_status st = mxfp8i_moe_setup(fn, &in, 0, &p);
    if (st) return st;
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_check_fwd_outputs(&p, &in, outputs, 1));
    const int64_t T = p.T, H = p.H, I = p.I, B = p.B;
    gold G;
    bool ok = true;
    double *acc = (double *)xcalloc(T * H, sizeof(double), &ok);
    if (!ok || !gold_alloc(&G, &p, quantized)) {
        free(acc);
        return mxfp8i_error(MXFP8_ERR_OUT_OF_MEMORY, "%s: cannot allocate workspaces", fn);
    }
    const mxfp8_moe_fwd_outputs *o = outputs;
    for (int64_t n = 0; n < p.N; n++) {
        const int64_t e = p.expert[n], L = mxfp8i_moe_block_len(&p, n);
        const int32_t *tok = p.tok + n * B;
        if (L > 0) {
            gold_expert(&G, e);
            gold_block_fwd(&G, n, L, 1);
            for (int64_t q = 0; q < L; q++)
                if (tok[q] >= 0) {
                    double a = (double)mxfp8i_moe_aff(&p, tok[q], e);
                    for (int64_t h = 0; h < H; h++) acc[tok[q] * H + h] += a * G.down[q * H + h];
                }
        }
        for (int64_t q = 0; q < B; q++) {
            const int real = q < L && tok[q] >= 0;
            const double a = real ? (double)mxfp8i_moe_aff(&p, tok[q], e) : 0.0;
            const mxfp8_tensor *t = &o->gate_up_proj_act_checkpoint_T;
            for (int64_t i = 0; i < I; i++) {
                if (t->data) {
                    mxfp8i_moe_st(t, n * t->strides[0] + i * t->strides[2] + q * t->strides[3],
                                  real ? G.g[q * I + i] : 0);
                    mxfp8i_moe_st(t, n * t->strides[0] + t->strides[1] + i * t->strides[2] + q * t->strides[3],
                                  real ? G.u[q * I + i] : 0);
                }
                const mxfp8_tensor *t3[3] = {&o->gate_act_checkpoint_T, &o->intermediate_checkpoint_T,
                                             &o->scaled_intermediate_checkpoint_T};
                const double v3[3] = {real ? G.act[q * I + i] : 0, real ? G.inter[q * I + i] : 0,
                                      real ? a * G.inter[q * I + i] : 0};
                for (int k = 0; k < 3; k++)
                    if (t3[k]->data)
                        mxfp8i_moe_st(t3[k], n * t3[k]->strides[0] + i * t3[k]->strides[1] + q * t3[k]->strides[2],
                                      v3[k]);
            }
            const mxfp8_tensor *d = &o->down_proj_output_checkpoint;
            if (d->data)
                for (int64_t h = 0; h < H; h++)
                    mxfp8i_moe_st(d, n * d->strides[0] + q * d->strides[1] + h * d->strides[2],
                                  real ? G.down[q * H + h] : 0);
        }
    }
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++)
            mxfp8i_moe_st(&o->output, t * o->output.strides[0] + h * o->output.strides[1], acc[t * H + h]);
    free(acc);
    gold_free(&G);
    return MXFP8_OK;
}

/* Flat row-major access of a view: store 0 = load into buf, 1 = store buf, 2 = store view + buf. */
static void flat_io(const mxfp8_tensor *t, double *buf, int store) {
    int64_t n = mxfp8_tensor_numel(t), idx[MXFP8_MAX_DIMS] = {0};
    for (int64_t k = 0; k < n; k++) {
        int64_t off = 0;
        for (int d = 0; d < t->ndim; d++) off += idx[d] * t->strides[d];
        if (store == 2) mxfp8i_moe_st(t, off, mxfp8i_moe_ld(t, off) + buf[k]);
        else if (store) mxfp8i_moe_st(t, off, buf[k]);
        else buf[k] = mxfp8i_moe_ld(t, off);
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d]) break;
            idx[d] = 0;
        }
    }
}

static mxfp8_status backward_golden(const mxfp8_moe_bwd_args *args, mxfp8_moe_bwd_grads *grads, int quantized) {
    static const char *fn = "mxfp8_moe_backward_golden";
    MXFP8I_RETURN_ERROR_IF(!args, MXFP8_ERR_NULL_POINTER, "%s: args is NULL", fn);
    MXFP8I_RETURN_ERROR_IF(!grads, MXFP8_ERR_NULL_POINTER, "%s: grads is NULL", fn);
    MXFP8I_RETURN_ERROR_IF(quantized != 0 && quantized != 1, MXFP8_ERR_INVALID_ARGUMENT,
                           "%s: quantized %d is not 0 or 1", fn, quantized);
    mxfp8i_moe_in in;
    mxfp8i_moe_in_bwd(args, &in);
    mxfp8i_moe p;
    mxfp8_status st = mxfp8i_moe_setup(fn, &in, 1, &p);
    if (st) return st;
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_check_bwd_grads(&p, &in, args, grads, 1));
    const int64_t T = p.T, H = p.H, I = p.I, E = p.E, B = p.B, I2 = 2 * I;
    const mxfp8_moe_config *c = &p.cfg;
    const int onH = c->affinity_option == MXFP8_AFFINITY_ON_H;
    gold G;
    bool ok = true;
    double *dx = (double *)xcalloc(T * H, sizeof(double), &ok);
    double *da = (double *)xcalloc(T * E, sizeof(double), &ok);
    double *dw1 = (double *)xcalloc(E * H * I2, sizeof(double), &ok);
    double *dw2 = (double *)xcalloc(E * I * H, sizeof(double), &ok);
    double *db1 = (double *)xcalloc(E * I2, sizeof(double), &ok);
    double *db2 = (double *)xcalloc(E * H, sizeof(double), &ok);
    if (!ok || !gold_alloc(&G, &p, quantized)) {
        free(dx);
        free(da);
        free(dw1);
        free(dw2);
        free(db1);
        free(db2);
        return mxfp8i_error(MXFP8_ERR_OUT_OF_MEMORY, "%s: cannot allocate workspaces", fn);
    }
    /* Given values (accumulate_hidden_states_grad / skip_grad_initialization) are added at the end. */
    for (int64_t n = 0; n < p.N; n++) {
        const int64_t e = p.expert[n], L = mxfp8i_moe_block_len(&p, n);
        const int32_t *tok = p.tok + n * B;
        if (L == 0) continue;
        gold_expert(&G, e);
        gold_block_fwd(&G, n, L, 0);
        double *dyb = G.dyb, *D = G.D, *S = G.S, *dI = G.dI, *dgu = G.dgu;
        for (int64_t q = 0; q < L; q++) {
            const int real = tok[q] >= 0;
            const double a = real ? (double)mxfp8i_moe_aff(&p, tok[q], e) : 0.0;
            for (int64_t h = 0; h < H; h++) {
                dyb[q * H + h] = real ? (double)mxfp8i_moe_ld2(&p.dY, tok[q], h) : 0.0;
                D[q * H + h] = a * dyb[q * H + h];
            }
            for (int64_t i = 0; i < I; i++) S[q * I + i] = a * G.inter[q * I + i];
        }
        gold_block_ck(&G, args, n, L, onH); /* the given checkpoints replace what they hold; down for ON_H */
        /* Phase 1: W2 [I][H] as operand [I rows, K = H] */
        gold_gemm(&G, L, I, H, onH ? D : dyb, H, 1, 0, G.w2_h, H, 1, 1, dI, I, 0);
        for (int64_t q = 0; q < L; q++) {
            if (tok[q] < 0) {
                for (int64_t k = 0; k < I2; k++) dgu[q * I2 + k] = 0.0;
                continue;
            }
            const double a = (double)mxfp8i_moe_aff(&p, tok[q], e);
            double s = 0.0;
            if (onH) {
                for (int64_t h = 0; h < H; h++) s += dyb[q * H + h] * G.down[q * H + h];
            } else {
                for (int64_t i = 0; i < I; i++) s += dI[q * I + i] * G.inter[q * I + i];
                for (int64_t h = 0; h < H; h++) s += dyb[q * H + h] * G.b2[h];
            }
            da[tok[q] * E + e] += s;
            for (int64_t i = 0; i < I; i++) {
                const double d = onH ? dI[q * I + i] : a * dI[q * I + i];
                const double gv = G.g[q * I + i], uv = G.u[q * I + i];
                dgu[q * I2 + i] = mxfp8i_moe_clamp_pass(gv, c->gate_clamp_lower, c->gate_clamp_upper)
                                      ? d * mxfp8i_moe_up_d(c, uv) * mxfp8i_moe_dact_d(c, gv)
                                      : 0.0;
                dgu[q * I2 + I + i] =
                    mxfp8i_moe_clamp_pass(uv, c->up_clamp_lower, c->up_clamp_upper) ? d * G.act[q * I + i] : 0.0;
            }
            for (int64_t k = 0; k < I2; k++) db1[e * I2 + k] += dgu[q * I2 + k];
            for (int64_t h = 0; h < H; h++) db2[e * H + h] += D[q * H + h];
        }
        /* Phase 2: W1 [H][2I] as operand [H rows, K = 2I] */
        gold_gemm(&G, L, H, I2, dgu, I2, 1, 0, G.w1_2i, I2, 1, 1, G.dxb, H, 0);
        for (int64_t q = 0; q < L; q++)
            if (tok[q] >= 0)
                for (int64_t h = 0; h < H; h++) dx[tok[q] * H + h] += G.dxb[q * H + h];
        /* Phase 3: dW1[e] [H][2I] += X_blk^T dGU (contraction over positions) */
        gold_gemm(&G, H, I2, L, G.xb, 1, H, 0, dgu, 1, I2, 0, dw1 + e * H * I2, I2, 1);
        /* Phase 4: dW2[e] [I][H] += S^T dY_blk (ON_I) or inter^T D (ON_H) */
        gold_gemm(&G, I, H, L, onH ? G.inter : S, 1, I, 0, onH ? D : dyb, 1, H, 0, dw2 + e * I * H, H, 1);
    }
    flat_io(&grads->hidden_states_grad, dx, c->accumulate_hidden_states_grad ? 2 : 1);
    {
        const mxfp8_tensor *t = &grads->expert_affinities_masked_grad;
        for (int64_t i = 0; i < T * E; i++) mxfp8i_moe_st(t, mxfp8i_moe_vec_off(t, i), da[i]);
    }
    const int wmode = c->skip_grad_initialization ? 2 : 1;
    flat_io(&grads->gate_up_proj_weight_grad, dw1, wmode);
    flat_io(&grads->down_proj_weight_grad, dw2, wmode);
    if (c->bias) {
        flat_io(&grads->gate_and_up_proj_bias_grad, db1, wmode);
        flat_io(&grads->down_proj_bias_grad, db2, wmode);
    }
    free(dx);
    free(da);
    free(dw1);
    free(dw2);
    free(db1);
    free(db2);
    gold_free(&G);
    return MXFP8_OK;
}

/* The public entries: the routing table is a slot of a private workspace scope. */
mxfp8_status mxfp8_moe_forward_golden(const mxfp8_moe_fwd_args *args, mxfp8_moe_fwd_outputs *outputs, int quantized) {
    mxfp8i_clear_error();
    mxfp8i_scope scope;
    MXFP8I_RETURN_ERROR_IF(mxfp8i_scope_begin(&scope, NULL), MXFP8_ERR_OUT_OF_MEMORY,
                           "mxfp8_moe_forward_golden: cannot allocate a workspace");
    const unsigned csr = mxfp8i_fenv_enter(); /* IEEE defaults here; each parallel region enters them on its threads */
    mxfp8_status st = forward_golden(args, outputs, quantized);
    mxfp8i_fenv_leave(csr);
    mxfp8i_scope_end(&scope);
    return st;
}

mxfp8_status mxfp8_moe_backward_golden(const mxfp8_moe_bwd_args *args, mxfp8_moe_bwd_grads *grads, int quantized) {
    mxfp8i_clear_error();
    mxfp8i_scope scope;
    MXFP8I_RETURN_ERROR_IF(mxfp8i_scope_begin(&scope, NULL), MXFP8_ERR_OUT_OF_MEMORY,
                           "mxfp8_moe_backward_golden: cannot allocate a workspace");
    const unsigned csr = mxfp8i_fenv_enter(); /* IEEE defaults here; each parallel region enters them on its threads */
    mxfp8_status st = backward_golden(args, grads, quantized);
    mxfp8i_fenv_leave(csr);
    mxfp8i_scope_end(&scope);
    return st;
}
