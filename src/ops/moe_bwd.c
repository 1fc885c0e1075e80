/*
 * moe_bwd.c -- blockwise_mm_bwd_mxfp8 [NKI-E]: the MXFP8 backward of the blockwise MoE layer.
 *
 * Contract (include/mxfp8.h, "Blockwise MoE" and mxfp8_moe_backward). Per block n of expert e, on its first L
 * positions (L = last real position + 1; padding rows are zero and never read from the inputs; trailing padding
 * would only add zero rows / zero group members, so it is skipped):
 *   g, u, act, inter    checkpoints or recomputed (GEMM X_blk @ W1[e] quantized along H, + b1, clamp; FP32)
 *   Phase 1             dI_raw = dY_blk @ W2[e]^T (ON_I)  or  dI = D @ W2[e]^T, D = a*dY_blk (ON_H); along H
 *   affinity grad       ON_I: sum_i dI_raw*inter + sum_h dY*b2 ; ON_H: sum_h dY*down (down: checkpoint or the
 *                       forward's GEMM 2 recomputed) ; sums in FP64
 *   activation bwd      dGU = [dI*u*act'(g)*pass(g) | dI*act(g)*pass(u)]  (FP32; pass = mxfp8i_moe_clamp_pass)
 *   Phase 2             dX_blk = dGU @ W1[e]^T (W1[e] as [H, 2I]); along 2I; scatter-added in processing order
 *   Phase 3             dW1[e] += X_blk^T @ dGU; along the block's positions
 *   Phase 4             dW2[e] += S^T @ dY_blk (S = a*inter, ON_I) or inter^T @ D (ON_H); along the positions
 *   bias grads          db1[e] += sum_p dGU ; db2[e] += sum_p a*dY   (FP64 sums)
 * Blocks run expert-major (expert 0's blocks in ascending block order, then expert 1's, ...). Accumulators:
 * hidden_states_grad in an FP32 [T, H] workspace (rounded once at the end); dW1, dW2 of the current expert in one FP32
 * pair, rounded when the expert is done into a staging copy of the output's dtype (the last expert's straight into the
 * output after the last GEMM), so that no output is written before every allocation has succeeded; affinity and bias
 * grads in FP64 (rounded to FP32, then to the output dtype). accumulate_hidden_states_grad / skip_grad_initialization
 * add the given value once: out = given + grad (one FP32 addition, then rounded to the dtype).
 * Weights are quantized once per expert (mxfp8i_moe_wq). Threads split GEMM
 * output tiles, rows of elementwise work and columns of reductions/scatters: bitwise identical for any thread count.
 */
#include <stdlib.h>

#include "../gemm/gemm.h" /* mxfp8i_gemm_ws_begin/end */
#include "moe_internal.h"

void mxfp8i_moe_in_bwd(const mxfp8_moe_bwd_args *a, mxfp8i_moe_in *in) {
    memset(in, 0, sizeof *in);
    MXFP8I_MOE_IN_COMMON(in, a);
    in->dY = &a->output_hidden_states_grad;
}

mxfp8_status mxfp8i_moe_check_bwd_grads(const mxfp8i_moe *p, const mxfp8i_moe_in *in, const mxfp8_moe_bwd_args *args,
                                        const mxfp8_moe_bwd_grads *g, int allow_f64) {
    const char *fn = p->fn;
    mxfp8_status st;
    const int64_t N = p->N, B = p->B, H = p->H, I = p->I, E = p->E;
    /* checkpoints (inputs) */
    const int64_t sgu[4] = {N, 2, I, B}, si[3] = {N, I, B}, sd[3] = {N, B, H};
    if ((st = mxfp8i_moe_check_tensor(fn, "gate_up_proj_act_checkpoint_T", &args->gate_up_proj_act_checkpoint_T, 0, 0,
                                      4, sgu)))
        return st;
    if ((st = mxfp8i_moe_check_tensor(fn, "gate_act_checkpoint_T", &args->gate_act_checkpoint_T, 0, 0, 3, si)))
        return st;
    if ((st = mxfp8i_moe_check_tensor(fn, "intermediate_checkpoint_T", &args->intermediate_checkpoint_T, 0, 0, 3, si)))
        return st;
    if ((st = mxfp8i_moe_check_tensor(fn, "scaled_intermediate_checkpoint_T", &args->scaled_intermediate_checkpoint_T,
                                      0, 0, 3, si)))
        return st;
    if ((st = mxfp8i_moe_check_tensor(fn, "down_proj_act_checkpoint", &args->down_proj_act_checkpoint, 0, 0, 3, sd)))
        return st;
    if ((st = mxfp8i_moe_check_tensor(fn, "down_proj_output_checkpoint", &args->down_proj_output_checkpoint, 0, 0, 3,
                                      sd)))
        return st;
    if (args->num_valid_tokens.data && args->scaled_intermediate_checkpoint_T.data)
        return mxfp8i_error(MXFP8_ERR_UNSUPPORTED,
                            "%s: num_valid_tokens is unsupported together with scaled_intermediate_checkpoint_T", fn);
    /* gradients */
    const int64_t sy[2] = {p->T, H}, s1[4] = {E, H, 2, I}, s2[3] = {E, I, H}, sb1[3] = {E, 2, I}, sb2[2] = {E, H};
    if ((st = mxfp8i_moe_check_tensor(fn, "hidden_states_grad", &g->hidden_states_grad, 1, allow_f64, 2, sy)))
        return st;
    if ((st = mxfp8i_moe_check_vec(fn, "expert_affinities_masked_grad", &g->expert_affinities_masked_grad, allow_f64,
                                   p->T * E)))
        return st;
    if ((st = mxfp8i_moe_check_tensor(fn, "gate_up_proj_weight_grad", &g->gate_up_proj_weight_grad, 1, allow_f64, 4,
                                      s1)))
        return st;
    if ((st = mxfp8i_moe_check_tensor(fn, "down_proj_weight_grad", &g->down_proj_weight_grad, 1, allow_f64, 3, s2)))
        return st;
    if (p->cfg.bias) {
        if ((st = mxfp8i_moe_check_tensor(fn, "gate_and_up_proj_bias_grad", &g->gate_and_up_proj_bias_grad, 1,
                                          allow_f64, 3, sb1)))
            return st;
        if ((st = mxfp8i_moe_check_tensor(fn, "down_proj_bias_grad", &g->down_proj_bias_grad, 1, allow_f64, 2, sb2)))
            return st;
    } else if (g->gate_and_up_proj_bias_grad.data || g->down_proj_bias_grad.data) {
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: a bias gradient is given but config.bias is 0", fn);
    }
    const mxfp8_tensor *outs[6] = {&g->hidden_states_grad, &g->expert_affinities_masked_grad,
                                   &g->gate_up_proj_weight_grad, &g->down_proj_weight_grad,
                                   &g->gate_and_up_proj_bias_grad, &g->down_proj_bias_grad};
    const char *on[6] = {"hidden_states_grad", "expert_affinities_masked_grad", "gate_up_proj_weight_grad",
                         "down_proj_weight_grad", "gate_and_up_proj_bias_grad", "down_proj_bias_grad"};
    const mxfp8_tensor *ex[6] = {&args->gate_up_proj_act_checkpoint_T, &args->gate_act_checkpoint_T,
                                 &args->intermediate_checkpoint_T, &args->scaled_intermediate_checkpoint_T,
                                 &args->down_proj_act_checkpoint, &args->down_proj_output_checkpoint};
    const char *en[6] = {"gate_up_proj_act_checkpoint_T", "gate_act_checkpoint_T", "intermediate_checkpoint_T",
                         "scaled_intermediate_checkpoint_T", "down_proj_act_checkpoint",
                         "down_proj_output_checkpoint"};
    return mxfp8i_moe_check_outputs_alias(fn, in, 6, outs, on, ex, en, 6);
}

/* mxfp8i_load_f32 / mxfp8i_store_f32 with the BF16 conversions inline (exactly mxfp8_bf16_to_fp32 and
 * mxfp8_fp32_to_bf16: a shift; RNE with NaN quieted, sign kept): the per-element library calls were ~6% of the
 * backward's CPU time (checkpoint and gather loads, the final rounding of dX, dW1, dW2). */
static inline float ldf(const void *data, mxfp8_dtype dt, int64_t off) {
    if (dt == MXFP8_DTYPE_BF16) {
        uint32_t u = (uint32_t)((const uint16_t *)data)[off] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    return mxfp8i_load_f32(data, dt, off);
}
static inline uint16_t bf16_rne(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static inline float ld2(const mxfp8_tensor *t, int64_t r, int64_t c) {
    return ldf(t->data, t->dtype, r * t->strides[0] + c * t->strides[1]);
}

/* Element (n, i, q) of an [N, I, B] checkpoint / (n, j, i, q) of [N, 2, I, B] / (n, q, h) of [N, B, H]. */
static inline float ck3(const mxfp8_tensor *t, int64_t n, int64_t x, int64_t y) {
    return ldf(t->data, t->dtype, n * t->strides[0] + x * t->strides[1] + y * t->strides[2]);
}
static inline float ck4(const mxfp8_tensor *t, int64_t n, int64_t j, int64_t i, int64_t q) {
    return ldf(t->data, t->dtype, n * t->strides[0] + j * t->strides[1] + i * t->strides[2] + q * t->strides[3]);
}

/* Store a row-major flat FP32 / FP64 buffer into a view; add != 0: the view's value + src (one FP32 addition). */
static bool contiguous(const mxfp8_tensor *t) {
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->strides[d] != s) return false;
        s *= t->shape[d];
    }
    return true;
}
static void store_flat_f(const mxfp8_tensor *t, const float *src, int add) {
    int64_t n = mxfp8_tensor_numel(t), idx[MXFP8_MAX_DIMS] = {0};
    if (contiguous(t) && t->dtype != MXFP8_DTYPE_F64) { /* fast path: one pass, threads split the range */
        const int nt = mxfp8i_moe_nt((double)n);
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int c = 0; c < nt; c++) {
            if (t->dtype == MXFP8_DTYPE_BF16) {
                uint16_t *d = (uint16_t *)t->data;
                for (int64_t k = n * c / nt; k < n * (c + 1) / nt; k++)
                    d[k] = bf16_rne(add ? ldf(d, MXFP8_DTYPE_BF16, k) + src[k] : src[k]);
                continue;
            }
            for (int64_t k = n * c / nt; k < n * (c + 1) / nt; k++) {
                float v = add ? mxfp8i_load_f32(t->data, t->dtype, k) + src[k] : src[k];
                mxfp8i_store_f32(t->data, t->dtype, k, v);
            }
        }
        return;
    }
    for (int64_t k = 0; k < n; k++) {
        int64_t off = 0;
        for (int d = 0; d < t->ndim; d++) off += idx[d] * t->strides[d];
        float v = add ? (float)mxfp8i_moe_ld(t, off) + src[k] : src[k];
        mxfp8i_moe_st(t, off, (double)v);
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d]) break;
            idx[d] = 0;
        }
    }
}
static void store_flat_d(const mxfp8_tensor *t, const double *src, int add) {
    int64_t n = mxfp8_tensor_numel(t), idx[MXFP8_MAX_DIMS] = {0};
    for (int64_t k = 0; k < n; k++) {
        int64_t off = 0;
        for (int d = 0; d < t->ndim; d++) off += idx[d] * t->strides[d];
        float v = add ? (float)mxfp8i_moe_ld(t, off) + (float)src[k] : (float)src[k];
        mxfp8i_moe_st(t, off, (double)v);
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d]) break;
            idx[d] = 0;
        }
    }
}

/* Offset (elements) of flat row-major index k of a view within its leading index e ([E, ...] views). */
static int64_t sub_off(const mxfp8_tensor *t, int64_t e, int64_t k) {
    int64_t off = e * t->strides[0];
    for (int d = t->ndim - 1; d >= 1; d--) {
        off += (k % t->shape[d]) * t->strides[d];
        k /= t->shape[d];
    }
    return off;
}

/* Round expert e's FP32 accumulator (per = elements of one expert) into the staging copy of a weight gradient (a
 * row-major buffer of the output's dtype and shape, whose element e*per + k is the expert's element k), or with
 * stage NULL straight into the output view. add != 0: the output's given value + acc (one FP32 addition), exactly
 * as store_flat_f would round it. */
static void stage_expert(const mxfp8_tensor *t, int64_t e, int64_t per, const float *acc, int add, void *stage) {
    mxfp8_tensor sv = *t;
    const int cont = contiguous(t), direct = stage == NULL;
    if (!direct) sv.data = stage;
    const int nt = mxfp8i_moe_nt((double)per);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int c = 0; c < nt; c++)
        for (int64_t k = per * c / nt; k < per * (c + 1) / nt; k++) {
            const int64_t off = cont ? e * per + k : sub_off(t, e, k), so = direct ? off : e * per + k;
            float v = acc[k];
            if (add) v = (float)mxfp8i_moe_ld(t, off) + v;
            if (t->dtype == MXFP8_DTYPE_BF16) ((uint16_t *)sv.data)[so] = bf16_rne(v);
            else mxfp8i_moe_st(&sv, so, (double)v);
        }
}

/* Copy experts [0, ne) of a staging buffer (row-major, the view's dtype) into the view. */
static void store_staged(const mxfp8_tensor *t, const void *stage, int64_t ne) {
    const int64_t per = t->shape[0] ? mxfp8_tensor_numel(t) / t->shape[0] : 0, n = ne * per;
    const size_t es = mxfp8_dtype_size(t->dtype);
    if (n == 0) return;
    if (contiguous(t)) {
        memcpy(t->data, stage, (size_t)n * es);
        return;
    }
    for (int64_t k = 0; k < n; k++)
        memcpy((char *)t->data + (size_t)sub_off(t, k / per, k % per) * es, (const char *)stage + (size_t)k * es, es);
}

typedef struct bwd_ws {
    float *dx;                         /* accumulator [T*H] */
    float *dw1, *dw2;                  /* one expert's accumulators [H*2I], [I*H]: wq's weight scratch (not owned) */
    void *sw1, *sw2;                   /* staging copies of experts 0..E-2 of the weight gradients, [(E-1)*H*2I],
                                          [(E-1)*I*H] in their dtypes (the last expert is stored from its FP32 pair) */
    double *da, *db1, *db2;            /* [T*E], [E*2I], [E*H] */
    float *xb, *dyb, *gu, *g, *u, *act, *inter, *dI, *dgu, *dxb, *S, *D, *down, *b1, *b2;
    double *dablk;
} bwd_ws;

static void ws_free(bwd_ws *w) {
    free(w->dx); free(w->sw1); free(w->sw2); free(w->da); free(w->db1); free(w->db2);
    free(w->xb); free(w->dyb); free(w->gu); free(w->g); free(w->u); free(w->act); free(w->inter); free(w->dI);
    free(w->dgu); free(w->dxb); free(w->S); free(w->D); free(w->down); free(w->b1); free(w->b2); free(w->dablk);
}

static void *xmalloc(int64_t n, size_t es, bool *ok) {
    void *q = malloc((size_t)(n > 0 ? n : 1) * es);
    if (!q) *ok = false;
    return q;
}

mxfp8_status mxfp8_moe_backward(const mxfp8_moe_bwd_args *args, mxfp8_moe_bwd_grads *grads) {
    static const char *fn = "mxfp8_moe_backward";
    mxfp8i_clear_error();
    if (!args) return mxfp8i_error(MXFP8_ERR_NULL_POINTER, "%s: args is NULL", fn);
    if (!grads) return mxfp8i_error(MXFP8_ERR_NULL_POINTER, "%s: grads is NULL", fn);
    mxfp8i_moe_in in;
    mxfp8i_moe_in_bwd(args, &in);
    mxfp8i_moe p;
    mxfp8_status st = mxfp8i_moe_setup(fn, &in, 1, &p);
    if (st) return st;
    if ((st = mxfp8i_moe_check_bwd_grads(&p, &in, args, grads, 0))) {
        mxfp8i_moe_free(&p);
        return st;
    }
    const int64_t T = p.T, H = p.H, I = p.I, E = p.E, B = p.B, I2 = 2 * I, Bw = p.Bw;
    const mxfp8_moe_config *c = &p.cfg;
    const int onH = c->affinity_option == MXFP8_AFFINITY_ON_H;
    const mxfp8_tensor *ck_gu = &args->gate_up_proj_act_checkpoint_T, *ck_act = &args->gate_act_checkpoint_T,
                       *ck_inter = &args->intermediate_checkpoint_T, *ck_s = &args->scaled_intermediate_checkpoint_T,
                       *ck_D = &args->down_proj_act_checkpoint, *ck_down = &args->down_proj_output_checkpoint;

    /* Workspaces: everything allocated before the first store. */
    bwd_ws w;
    memset(&w, 0, sizeof w);
    bool ok = true;
    w.dx = (float *)xmalloc(T * H, sizeof(float), &ok);
    const int64_t Es = E > 1 ? E - 1 : 0; /* staged experts */
    w.sw1 = xmalloc(Es * H * I2, mxfp8_dtype_size(grads->gate_up_proj_weight_grad.dtype), &ok);
    w.sw2 = xmalloc(Es * I * H, mxfp8_dtype_size(grads->down_proj_weight_grad.dtype), &ok);
    w.da = (double *)xmalloc(T * E, sizeof(double), &ok);
    w.db1 = (double *)xmalloc(E * I2, sizeof(double), &ok);
    w.db2 = (double *)xmalloc(E * H, sizeof(double), &ok);
    w.xb = (float *)xmalloc(Bw * H, sizeof(float), &ok);
    w.dyb = (float *)xmalloc(Bw * H, sizeof(float), &ok);
    w.gu = (float *)xmalloc(Bw * I2, sizeof(float), &ok);
    w.g = (float *)xmalloc(Bw * I, sizeof(float), &ok);
    w.u = (float *)xmalloc(Bw * I, sizeof(float), &ok);
    w.act = (float *)xmalloc(Bw * I, sizeof(float), &ok);
    w.inter = (float *)xmalloc(Bw * I, sizeof(float), &ok);
    w.dI = (float *)xmalloc(Bw * I, sizeof(float), &ok);
    w.dgu = (float *)xmalloc(Bw * I2, sizeof(float), &ok);
    w.dxb = (float *)xmalloc(Bw * H, sizeof(float), &ok);
    w.S = (float *)xmalloc(Bw * I, sizeof(float), &ok);
    w.D = (float *)xmalloc(Bw * H, sizeof(float), &ok);
    w.down = (float *)xmalloc(Bw * H, sizeof(float), &ok);
    w.b1 = (float *)xmalloc(I2, sizeof(float), &ok);
    w.b2 = (float *)xmalloc(H, sizeof(float), &ok);
    w.dablk = (double *)xmalloc(Bw, sizeof(double), &ok);
    mxfp8i_moe_wq wq;
    const int want_fwd = !ck_gu->data || (onH && !ck_down->data);
    if (!ok || mxfp8i_moe_wq_alloc(&p, want_fwd, 1, &wq)) {
        if (ok) mxfp8i_moe_wq_free(&wq);
        ws_free(&w);
        mxfp8i_moe_free(&p);
        return mxfp8i_error(MXFP8_ERR_OUT_OF_MEMORY, "%s: cannot allocate workspaces", fn);
    }
    /* The expert's weight-gradient accumulators share the FP32 weight scratch of wq (same sizes, H*2I and I*H):
       mxfp8i_moe_wq_prepare uses it only when it switches experts, which happens below before the expert's
       accumulators are zeroed, and after the previous expert was staged. */
    w.dw1 = wq.w1f;
    w.dw2 = wq.w2f;

    /* The block GEMMs reuse one set of GEMM buffers (no fresh pages per GEMM); freed after the loop (or at `done`). */
    mxfp8i_gemm_ws_begin();
    int ws_open = 1;
    /* Accumulators start at zero; given values are added once (dX at the end; dW1, dW2 when an expert is staged). */
    memset(w.dx, 0, sizeof(float) * (size_t)(T * H));
    for (int64_t i = 0; i < T * E; i++) w.da[i] = 0.0;
    for (int64_t i = 0; i < E * I2; i++) w.db1[i] = 0.0;
    for (int64_t i = 0; i < E * H; i++) w.db2[i] = 0.0;

    /* Expert-major: expert e's blocks in ascending block order, its weight gradients accumulated in one expert-sized
       FP32 pair and then rounded into the staging copies (outputs are written only after the last GEMM). */
    for (int64_t e = 0; e < E; e++) {
        for (int64_t n = 0; n < p.N; n++)
            if (p.expert[n] == e && mxfp8i_moe_block_len(&p, n) > 0) {
                mxfp8i_moe_wq_prepare(&p, e, &wq); /* clobbers w.dw1, w.dw2 */
                break;
            }
        memset(w.dw1, 0, sizeof(float) * (size_t)(H * I2));
        memset(w.dw2, 0, sizeof(float) * (size_t)(I * H));
        for (int64_t n = 0; n < p.N; n++) {
            if (p.expert[n] != e) continue;
            const int64_t L = mxfp8i_moe_block_len(&p, n);
            const int32_t *tok = p.tok + n * B;
            if (L == 0) continue;
            mxfp8i_moe_wq_prepare(&p, e, &wq);
            mxfp8i_moe_load_b1(&p, e, w.b1);
            mxfp8i_moe_load_b2(&p, e, w.b2);
            float *xb = w.xb, *dyb = w.dyb, *g = w.g, *u = w.u, *act = w.act, *inter = w.inter, *dI = w.dI,
                  *dgu = w.dgu, *S = w.S, *D = w.D, *down = w.down, *b1 = w.b1, *b2 = w.b2;
            double *dablk = w.dablk;

            const int nt = mxfp8i_moe_nt((double)L * (double)(H + I2)); /* elementwise work of this block */
            /* gather X and dY rows (padding rows zero) */
#pragma omp parallel for schedule(static) num_threads(nt)
            for (int64_t q = 0; q < L; q++)
                for (int64_t h = 0; h < H; h++) {
                    xb[q * H + h] = tok[q] >= 0 ? ld2(&p.X, tok[q], h) : 0.0f;
                    dyb[q * H + h] = tok[q] >= 0 ? ld2(&p.dY, tok[q], h) : 0.0f;
                }

            /* g, u: checkpoint or the forward's GEMM 1 */
            if (!ck_gu->data) {
                mxfp8i_moe_op A = {0};
                A.v = xb; A.rs = H; A.ks = 1;
                mxfp8i_moe_op W = mxfp8i_moe_op_w1_h(&p, &wq);
                if ((st = mxfp8i_moe_gemm(&p, L, I2, H, &A, &W, 0, w.gu, I2))) goto oom;
            }
#pragma omp parallel for schedule(static) num_threads(nt)
            for (int64_t q = 0; q < L; q++) {
                const int real = tok[q] >= 0;
                const float aq = real ? mxfp8i_moe_aff(&p, tok[q], e) : 0.0f;
                for (int64_t i = 0; i < I; i++) {
                    float gv = 0.0f, uv = 0.0f, av = 0.0f, iv = 0.0f;
                    if (real) {
                        if (ck_gu->data) {
                            gv = ck4(ck_gu, n, 0, i, q);
                            uv = ck4(ck_gu, n, 1, i, q);
                        } else {
                            gv = mxfp8i_moe_clamp(w.gu[q * I2 + i] + b1[i], c->gate_clamp_lower, c->gate_clamp_upper);
                            uv = mxfp8i_moe_clamp(w.gu[q * I2 + I + i] + b1[I + i], c->up_clamp_lower,
                                                  c->up_clamp_upper);
                        }
                        av = ck_act->data ? ck3(ck_act, n, i, q) : mxfp8i_moe_act(c->activation, gv);
                        iv = ck_inter->data ? ck3(ck_inter, n, i, q) : av * uv;
                    }
                    g[q * I + i] = gv;
                    u[q * I + i] = uv;
                    act[q * I + i] = av;
                    inter[q * I + i] = iv;
                    if (!onH) S[q * I + i] = real ? (ck_s->data ? ck3(ck_s, n, i, q) : aq * iv) : 0.0f;
                }
                if (onH)
                    for (int64_t h = 0; h < H; h++)
                        D[q * H + h] = real ? (ck_D->data ? ck3(ck_D, n, q, h) : aq * dyb[q * H + h]) : 0.0f;
            }

            /* Phase 1 (contraction H): dI_raw = dY_blk @ W2^T (ON_I) or dI = D @ W2^T (ON_H) */
            {
                mxfp8i_moe_op A = {0};
                A.v = onH ? D : dyb; A.rs = H; A.ks = 1;
                mxfp8i_moe_op W = mxfp8i_moe_op_w2_h(&p, &wq);
                /* W2[e]'s packed panels serve every block of expert e (keyed slot 0 of the GEMM workspace scope) */
                mxfp8i_gemm_ws_bkey(0, (uint64_t)e + 1, W.codes);
                if ((st = mxfp8i_moe_gemm(&p, L, I, H, &A, &W, 0, dI, I))) goto oom;
            }
            if (onH && !ck_down->data) { /* the forward's GEMM 2: down = inter @ W2 + b2 (contraction I) */
                mxfp8i_moe_op A = {0};
                A.v = inter; A.rs = I; A.ks = 1;
                mxfp8i_moe_op W = mxfp8i_moe_op_w2_i(&p, &wq);
                if ((st = mxfp8i_moe_gemm(&p, L, H, I, &A, &W, 0, down, H))) goto oom;
            }
            /* affinity gradient of each position, dI, activation backward */
#pragma omp parallel for schedule(static) num_threads(nt)
            for (int64_t q = 0; q < L; q++) {
                const int real = tok[q] >= 0;
                double da = 0.0;
                if (real && !onH) {
                    for (int64_t i = 0; i < I; i++) da += (double)dI[q * I + i] * (double)inter[q * I + i];
                    if (p.b2.data)
                        for (int64_t h = 0; h < H; h++) da += (double)dyb[q * H + h] * (double)b2[h];
                } else if (real) {
                    for (int64_t h = 0; h < H; h++) {
                        float dn = ck_down->data ? ck3(ck_down, n, q, h) : down[q * H + h] + b2[h];
                        da += (double)dyb[q * H + h] * (double)dn;
                    }
                }
                dablk[q] = da;
                const float aq = real ? mxfp8i_moe_aff(&p, tok[q], e) : 0.0f;
                for (int64_t i = 0; i < I; i++) {
                    float dIv = real ? (onH ? dI[q * I + i] : aq * dI[q * I + i]) : 0.0f;
                    float gv = g[q * I + i], uv = u[q * I + i];
                    float dg = 0.0f, du = 0.0f;
                    if (real) {
                        if (mxfp8i_moe_clamp_pass(gv, c->gate_clamp_lower, c->gate_clamp_upper))
                            dg = dIv * uv * mxfp8i_moe_dact(c->activation, gv);
                        if (mxfp8i_moe_clamp_pass(uv, c->up_clamp_lower, c->up_clamp_upper)) du = dIv * act[q * I + i];
                    }
                    dgu[q * I2 + i] = dg;
                    dgu[q * I2 + I + i] = du;
                }
            }
            /* bias gradients (FP64, positions added in order; column ranges split between threads) */
            if (c->bias) {
                double *db1 = w.db1 + e * I2, *db2 = w.db2 + e * H;
#pragma omp parallel for schedule(static) num_threads(nt)
                for (int t = 0; t < nt; t++) {
                    const int64_t k0 = I2 * t / nt, k1 = I2 * (t + 1) / nt, h0 = H * t / nt, h1 = H * (t + 1) / nt;
                    for (int64_t q = 0; q < L; q++) {
                        if (tok[q] < 0) continue;
                        const float aq = mxfp8i_moe_aff(&p, tok[q], e);
                        for (int64_t k = k0; k < k1; k++) db1[k] += (double)dgu[q * I2 + k];
                        for (int64_t h = h0; h < h1; h++)
                            db2[h] += onH ? (double)D[q * H + h] : (double)(aq * dyb[q * H + h]);
                    }
                }
            }
            /* Phase 2 (contraction 2I): dX_blk = dGU @ W1[e]^T, scatter-add in position order */
            {
                mxfp8i_moe_op A = {0};
                A.v = dgu; A.rs = I2; A.ks = 1;
                mxfp8i_moe_op W = mxfp8i_moe_op_w1_2i(&p, &wq);
                mxfp8i_gemm_ws_bkey(1, (uint64_t)e + 1, W.codes); /* W1[e] along 2I: keyed slot 1 */
                if ((st = mxfp8i_moe_gemm(&p, L, H, I2, &A, &W, 0, w.dxb, H))) goto oom;
            }
#pragma omp parallel for schedule(static) num_threads(nt)
            for (int t = 0; t < nt; t++) {
                const int64_t h0 = H * t / nt, h1 = H * (t + 1) / nt;
                for (int64_t q = 0; q < L; q++) {
                    if (tok[q] < 0) continue;
                    float *dst = w.dx + tok[q] * H;
                    const float *src = w.dxb + q * H;
                    for (int64_t h = h0; h < h1; h++) dst[h] += src[h];
                }
            }
            /* Phase 3: dW1[e] [H, 2I] += X_blk^T @ dGU; both operands are transposed views ([H, L] with strides
               (1, H), [2I, L] with strides (1, 2I)) that the GEMM quantizes down their columns */
            {
                mxfp8i_moe_op A = {0}, Bo = {0};
                A.v = xb; A.rs = 1; A.ks = H;
                Bo.v = dgu; Bo.rs = 1; Bo.ks = I2;
                if ((st = mxfp8i_moe_gemm(&p, H, I2, L, &A, &Bo, 1, w.dw1, I2))) goto oom;
            }
            /* Phase 4: dW2[e] [I, H] += S^T @ dY_blk (ON_I) or inter^T @ D (ON_H), transposed views likewise */
            {
                mxfp8i_moe_op A = {0}, Bo = {0};
                A.v = onH ? inter : S; A.rs = 1; A.ks = I;
                Bo.v = onH ? D : dyb; Bo.rs = 1; Bo.ks = H;
                if ((st = mxfp8i_moe_gemm(&p, I, H, L, &A, &Bo, 1, w.dw2, H))) goto oom;
            }
            for (int64_t q = 0; q < L; q++)
                if (tok[q] >= 0) w.da[tok[q] * E + e] += dablk[q];
        }
        if (e == E - 1) break; /* the last expert's FP32 pair is stored straight into the outputs below */
        stage_expert(&grads->gate_up_proj_weight_grad, e, H * I2, w.dw1, c->skip_grad_initialization, w.sw1);
        stage_expert(&grads->down_proj_weight_grad, e, I * H, w.dw2, c->skip_grad_initialization, w.sw2);
    }
    /* No allocation follows: release the GEMM buffers before the stores. */
    mxfp8i_gemm_ws_end();
    ws_open = 0;

    /* Round once into the outputs. */
    store_flat_f(&grads->hidden_states_grad, w.dx, c->accumulate_hidden_states_grad);
    {
        const mxfp8_tensor *t = &grads->expert_affinities_masked_grad;
        for (int64_t i = 0; i < T * E; i++) mxfp8i_moe_st(t, mxfp8i_moe_vec_off(t, i), (double)(float)w.da[i]);
    }
    store_staged(&grads->gate_up_proj_weight_grad, w.sw1, Es);
    store_staged(&grads->down_proj_weight_grad, w.sw2, Es);
    if (E > 0) {
        stage_expert(&grads->gate_up_proj_weight_grad, E - 1, H * I2, w.dw1, c->skip_grad_initialization, NULL);
        stage_expert(&grads->down_proj_weight_grad, E - 1, I * H, w.dw2, c->skip_grad_initialization, NULL);
    }
    if (c->bias) {
        store_flat_d(&grads->gate_and_up_proj_bias_grad, w.db1, c->skip_grad_initialization);
        store_flat_d(&grads->down_proj_bias_grad, w.db2, c->skip_grad_initialization);
    }
    st = MXFP8_OK;
    goto done;
oom:
    st = mxfp8i_error(MXFP8_ERR_OUT_OF_MEMORY, "%s: out of memory in a GEMM workspace (outputs untouched)", fn);
done:
    if (ws_open) mxfp8i_gemm_ws_end();
    mxfp8i_moe_wq_free(&wq);
    ws_free(&w);
    mxfp8i_moe_free(&p);
    return st;
}
