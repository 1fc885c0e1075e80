/*
 * bwd_block.c -- one block of blockwise_mm_bwd_mxfp8 [NKI-E]: gather, g/u/act/inter (checkpoints or recomputed),
 * Phase 1, the affinity gradient and the activation backward, the bias sums, Phase 2 and its scatter, Phases 3 and 4.
 * Math: bwd.c's file comment. Threads split GEMM output tiles, rows of elementwise work and column ranges of sums
 * and scatters (positions always in order), so every result is independent of the thread count.
 */
#include "bwd.h"

/* Element (n, i, q) of an [N, I, B] checkpoint / (n, j, i, q) of [N, 2, I, B] / (n, q, h) of [N, B, H]. */
static inline float ck3(const mxfp8_tensor *t, int64_t n, int64_t x, int64_t y) {
    return mxfp8i_load_f32(t->data, t->dtype, n * t->strides[0] + x * t->strides[1] + y * t->strides[2]);
}
static inline float ck4(const mxfp8_tensor *t, int64_t n, int64_t j, int64_t i, int64_t q) {
    return mxfp8i_load_f32(t->data, t->dtype,
                           n * t->strides[0] + j * t->strides[1] + i * t->strides[2] + q * t->strides[3]);
}

/* X and dY rows of the block's tokens (padding rows zero). */
static void gather(mxfp8i_moe_bwd *w, const int32_t *tok, int64_t L, int nt) {
    const mxfp8i_moe *p = w->p;
    const int64_t H = p->H;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t q = 0; q < L; q++) {
        if (tok[q] < 0) {
            memset(w->xb + q * H, 0, (size_t)H * sizeof(float));
            memset(w->dyb + q * H, 0, (size_t)H * sizeof(float));
            continue;
        }
        mxfp8i_moe_row_f32(&p->X, tok[q], H, w->xb + q * H);
        mxfp8i_moe_row_f32(&p->dY, tok[q], H, w->dyb + q * H);
    }
}

/* g, u, act(g), inter (checkpoints, else the forward's GEMM 1 + b1 + clamp), and the Phase 4 operand S = a*inter
 * (ON_I) or the Phase 1 operand D = a*dY (ON_H). */
static mxfp8_status forward_values(mxfp8i_moe_bwd *w, int64_t n, int64_t e, const int32_t *tok, int64_t L, int nt) {
    const mxfp8i_moe *p = w->p;
    const mxfp8_moe_config *c = &p->cfg;
    const mxfp8_moe_bwd_args *a = w->args;
    const mxfp8_tensor *ck_gu = &a->gate_up_proj_act_checkpoint_T, *ck_act = &a->gate_act_checkpoint_T,
                       *ck_inter = &a->intermediate_checkpoint_T, *ck_s = &a->scaled_intermediate_checkpoint_T,
                       *ck_D = &a->down_proj_act_checkpoint;
    const int64_t H = p->H, I = p->I, I2 = 2 * I;
    if (!ck_gu->data) { /* the forward's GEMM 1: GU = X_blk @ W1[e], contraction H */
        mxfp8i_gop A = mxfp8i_gop_hp(w->xb, MXFP8_DTYPE_F32, L, H, H, 1);
        mxfp8i_moe_round_block(p, &A, MXFP8_MOE_GEMM1_X, n, H, H, 1);
        mxfp8i_gop W = mxfp8i_moe_weight(p, &w->wc, e, MXFP8I_W1_H);
        MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_gemm(p, e, &A, MXFP8_MOE_GEMM1_X, &W, MXFP8_MOE_GEMM1_W1, 0, w->gu, I2));
    }
    const float *b1 = w->b1;
    /* checkpoints ([n, (j,) i, q]: positions innermost) read in 16-row blocks of i, q ascending, into the [q][i]
       buffers: contiguous reads along q, one cache line written per (q, block) */
    const mxfp8_tensor *ckt[5] = {ck_gu, ck_gu, ck_act, ck_inter, ck_s};
    float *dst[5] = {w->g, w->u, w->act, w->inter, w->S};
    for (int k = 0; k < 5; k++) {
        const mxfp8_tensor *t = ckt[k];
        if (!t->data || (k == 4 && w->onH)) continue;
        const int four = t->ndim == 4;
        const int64_t base = n * t->strides[0] + (four ? (k == 1) * t->strides[1] : 0);
        const int64_t si = t->strides[four ? 2 : 1], sq = t->strides[four ? 3 : 2];
        float *d = dst[k];
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t i0 = 0; i0 < I; i0 += 16)
            for (int64_t q = 0; q < L; q++)
                for (int64_t i = i0; i < I && i < i0 + 16; i++)
                    d[q * I + i] = mxfp8i_load_f32(t->data, t->dtype, base + i * si + q * sq);
    }
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t q = 0; q < L; q++) {
        const int real = tok[q] >= 0;
        const float aq = real ? mxfp8i_moe_aff(p, tok[q], e) : 0.0f;
        for (int64_t i = 0; i < I; i++) {
            float gv = 0.0f, uv = 0.0f, av = 0.0f, iv = 0.0f;
            if (real) {
                if (ck_gu->data) {
                    gv = w->g[q * I + i];
                    uv = w->u[q * I + i];
                } else {
                    gv = mxfp8i_moe_clamp(w->gu[q * I2 + i] + b1[i], c->gate_clamp_lower, c->gate_clamp_upper);
                    uv = mxfp8i_moe_clamp(w->gu[q * I2 + I + i] + b1[I + i], c->up_clamp_lower, c->up_clamp_upper);
                }
                av = ck_act->data ? w->act[q * I + i] : mxfp8i_moe_act(c, gv);
                iv = ck_inter->data ? w->inter[q * I + i] : av * mxfp8i_moe_up(c, uv);
            }
            w->g[q * I + i] = gv;
            w->u[q * I + i] = uv;
            w->act[q * I + i] = av;
            w->inter[q * I + i] = iv;
            if (!w->onH) w->S[q * I + i] = real ? (ck_s->data ? w->S[q * I + i] : aq * iv) : 0.0f;
        }
        if (w->onH)
            for (int64_t h = 0; h < H; h++)
                w->D[q * H + h] = real ? (ck_D->data ? ck3(ck_D, n, q, h) : aq * w->dyb[q * H + h]) : 0.0f;
    }
    return MXFP8_OK;
}

/* Phase 1 (contraction H): dI_raw = dY_blk @ W2[e]^T (ON_I) or dI = D @ W2[e]^T (ON_H); for ON_H without the down
 * projection checkpoint, the forward's GEMM 2 (down = inter @ W2[e], contraction I) too. */
static mxfp8_status phase1(mxfp8i_moe_bwd *w, int64_t n, int64_t e, int64_t L) {
    const mxfp8i_moe *p = w->p;
    const int64_t H = p->H, I = p->I;
    mxfp8i_gop A = mxfp8i_gop_hp(w->onH ? w->D : w->dyb, MXFP8_DTYPE_F32, L, H, H, 1);
    mxfp8i_moe_round_block(p, &A, MXFP8_MOE_P1_DY, n, H, H, 1);
    mxfp8i_gop W = mxfp8i_moe_weight(p, &w->wc, e, MXFP8I_W2_H);
    mxfp8i_ws_bkey(0, (uint64_t)e + 1, W.data); /* W2[e]'s packed panels serve all of e's blocks (slot 0) */
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_gemm(p, e, &A, MXFP8_MOE_P1_DY, &W, MXFP8_MOE_P1_W2, 0, w->dI, I));
    if (w->onH && !w->args->down_proj_output_checkpoint.data) {
        mxfp8i_gop Ai = mxfp8i_gop_hp(w->inter, MXFP8_DTYPE_F32, L, I, I, 1);
        mxfp8i_moe_round_block(p, &Ai, MXFP8_MOE_GEMM2_INTER, n, I, I, 1);
        mxfp8i_gop W2 = mxfp8i_moe_weight(p, &w->wc, e, MXFP8I_W2_I);
        MXFP8I_FORWARD_IF_ERROR(
            mxfp8i_moe_gemm(p, e, &Ai, MXFP8_MOE_GEMM2_INTER, &W2, MXFP8_MOE_GEMM2_W2, 0, w->down, H));
    }
    return MXFP8_OK;
}

/* The affinity gradient of each position (FP64 sums) and the activation backward:
 *   dI = a * dI_raw (ON_I) or dI (ON_H);  dGU = [dI * u * act'(g) * pass(g) | dI * act(g) * pass(u)]. */
static void activation_backward(mxfp8i_moe_bwd *w, int64_t n, int64_t e, const int32_t *tok, int64_t L, int nt) {
    const mxfp8i_moe *p = w->p;
    const mxfp8_moe_config *c = &p->cfg;
    const mxfp8_tensor *ck_down = &w->args->down_proj_output_checkpoint;
    const int64_t H = p->H, I = p->I, I2 = 2 * I;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t q = 0; q < L; q++) {
        const int real = tok[q] >= 0;
        double da = 0.0;
        if (real && !w->onH) {
            for (int64_t i = 0; i < I; i++) da += (double)w->dI[q * I + i] * (double)w->inter[q * I + i];
            if (p->b2.data)
                for (int64_t h = 0; h < H; h++) da += (double)w->dyb[q * H + h] * (double)w->b2[h];
        } else if (real) {
            for (int64_t h = 0; h < H; h++) {
                float dn = ck_down->data ? ck3(ck_down, n, q, h) : w->down[q * H + h] + w->b2[h];
                da += (double)w->dyb[q * H + h] * (double)dn;
            }
        }
        w->dablk[q] = da;
        const float aq = real ? mxfp8i_moe_aff(p, tok[q], e) : 0.0f;
        for (int64_t i = 0; i < I; i++) {
            float dIv = real ? (w->onH ? w->dI[q * I + i] : aq * w->dI[q * I + i]) : 0.0f;
            float gv = w->g[q * I + i], uv = w->u[q * I + i], dg = 0.0f, du = 0.0f;
            if (real) {
                if (mxfp8i_moe_clamp_pass(gv, c->gate_clamp_lower, c->gate_clamp_upper))
                    dg = dIv * mxfp8i_moe_up(c, uv) * mxfp8i_moe_dact(c, gv);
                if (mxfp8i_moe_clamp_pass(uv, c->up_clamp_lower, c->up_clamp_upper)) du = dIv * w->act[q * I + i];
            }
            w->dgu[q * I2 + i] = dg;
            w->dgu[q * I2 + I + i] = du;
        }
    }
}

/* db1[e] += sum_p dGU;  db2[e] += sum_p a*dY (ON_I) or D (ON_H). FP64, positions in order, column ranges split. */
static void bias_grads(mxfp8i_moe_bwd *w, int64_t e, const int32_t *tok, int64_t L, int nt) {
    const mxfp8i_moe *p = w->p;
    const int64_t H = p->H, I2 = 2 * p->I;
    double *db1 = w->db1 + e * I2, *db2 = w->db2 + e * H;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int t = 0; t < nt; t++) {
        const int64_t k0 = I2 * t / nt, k1 = I2 * (t + 1) / nt, h0 = H * t / nt, h1 = H * (t + 1) / nt;
        for (int64_t q = 0; q < L; q++) {
            if (tok[q] < 0) continue;
            const float aq = mxfp8i_moe_aff(p, tok[q], e);
            for (int64_t k = k0; k < k1; k++) db1[k] += (double)w->dgu[q * I2 + k];
            for (int64_t h = h0; h < h1; h++)
                db2[h] += w->onH ? (double)w->D[q * H + h] : (double)(aq * w->dyb[q * H + h]);
        }
    }
}

/* Phase 2 (contraction 2I): dX_blk = dGU @ W1[e]^T, then scatter-added into dx in position order. */
static mxfp8_status phase2(mxfp8i_moe_bwd *w, int64_t n, int64_t e, const int32_t *tok, int64_t L, int nt) {
    const mxfp8i_moe *p = w->p;
    const int64_t H = p->H, I2 = 2 * p->I;
    mxfp8i_gop A = mxfp8i_gop_hp(w->dgu, MXFP8_DTYPE_F32, L, I2, I2, 1);
    mxfp8i_moe_round_block(p, &A, MXFP8_MOE_P2_DGU, n, I2, I2, 1);
    mxfp8i_gop W = mxfp8i_moe_weight(p, &w->wc, e, MXFP8I_W1_2I);
    mxfp8i_ws_bkey(1, (uint64_t)e + 1, W.data); /* W1[e] along 2I: keyed slot 1 */
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_gemm(p, e, &A, MXFP8_MOE_P2_DGU, &W, MXFP8_MOE_P2_W1, 0, w->dxb, H));
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int t = 0; t < nt; t++) {
        const int64_t h0 = H * t / nt, h1 = H * (t + 1) / nt;
        for (int64_t q = 0; q < L; q++) {
            if (tok[q] < 0) continue;
            float *dst = w->dx + tok[q] * H;
            const float *src = w->dxb + q * H;
            for (int64_t h = h0; h < h1; h++) dst[h] += src[h];
        }
    }
    return MXFP8_OK;
}

/* Phase 3: dW1[e] [H, 2I] += X_blk^T @ dGU; Phase 4: dW2[e] [I, H] += S^T @ dY_blk (ON_I) or inter^T @ D (ON_H). The
 * operands are transposed views ([H, L] with strides (1, H), ...) that the GEMM quantizes down their columns, along
 * the block's positions. */
static mxfp8_status phases34(mxfp8i_moe_bwd *w, int64_t n, int64_t e, int64_t L) {
    const mxfp8i_moe *p = w->p;
    const int64_t H = p->H, I = p->I, I2 = 2 * I;
    mxfp8i_gop A = mxfp8i_gop_hp(w->xb, MXFP8_DTYPE_F32, H, L, 1, H);
    mxfp8i_gop B = mxfp8i_gop_hp(w->dgu, MXFP8_DTYPE_F32, I2, L, 1, I2);
    mxfp8i_moe_round_block(p, &A, MXFP8_MOE_P3_X, n, H, 1, H);
    mxfp8i_moe_round_block(p, &B, MXFP8_MOE_P3_DGU, n, I2, 1, I2);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_gemm(p, e, &A, MXFP8_MOE_P3_X, &B, MXFP8_MOE_P3_DGU, 1, w->dw1, I2));
    A = mxfp8i_gop_hp(w->onH ? w->inter : w->S, MXFP8_DTYPE_F32, I, L, 1, I);
    B = mxfp8i_gop_hp(w->onH ? w->D : w->dyb, MXFP8_DTYPE_F32, H, L, 1, H);
    mxfp8i_moe_round_block(p, &A, MXFP8_MOE_P4_S, n, I, 1, I);
    mxfp8i_moe_round_block(p, &B, MXFP8_MOE_P4_DY, n, H, 1, H);
    return mxfp8i_moe_gemm(p, e, &A, MXFP8_MOE_P4_S, &B, MXFP8_MOE_P4_DY, 1, w->dw2, H);
}

mxfp8_status mxfp8i_moe_bwd_block(mxfp8i_moe_bwd *w, int64_t n, int64_t e, int64_t L) {
    const mxfp8i_moe *p = w->p;
    const int32_t *tok = p->tok + n * p->B;
    const int nt = mxfp8i_moe_nt((double)L * (double)(p->H + 2 * p->I)); /* elementwise work of this block */
    mxfp8i_moe_load_b1(p, e, w->b1);
    mxfp8i_moe_load_b2(p, e, w->b2);
    gather(w, tok, L, nt);
    MXFP8I_FORWARD_IF_ERROR(forward_values(w, n, e, tok, L, nt));
    MXFP8I_FORWARD_IF_ERROR(phase1(w, n, e, L));
    activation_backward(w, n, e, tok, L, nt);
    if (p->cfg.bias) bias_grads(w, e, tok, L, nt);
    MXFP8I_FORWARD_IF_ERROR(phase2(w, n, e, tok, L, nt));
    MXFP8I_FORWARD_IF_ERROR(phases34(w, n, e, L));
    for (int64_t q = 0; q < L; q++)
        if (tok[q] >= 0) w->da[tok[q] * p->E + e] += w->dablk[q];
    return MXFP8_OK;
}
