/*
 * moe_fwd.c -- forward of the blockwise MoE layer in MXFP8 (produces the backward's checkpoints).
 *
 * Contract (include/mxfp8.h, mxfp8_moe_forward): per block n of expert e, on the block's first L positions (L = last
 * real position + 1; padding rows inside are zero rows, trailing padding is skipped, which changes nothing):
 *   GU    = X_blk [L, H] @ W1[e] [H, 2I]   (GEMM, both operands quantized along H, FP32 accumulation)
 *   g, u  = clamp(GU + b1[e]) ; inter = act(g) * u           (FP32; zero at padding positions)
 *   down  = inter [L, I] @ W2[e] [I, H] + b2[e]              (GEMM, both quantized along I)
 *   out[t] += a[t*E+e] * down                                (FP32 accumulator, rounded once to output's dtype)
 * Checkpoints are written for every position (0 at padding). Blocks run in order; threads split GEMM tiles, rows of
 * the elementwise work and columns of the scatter, so the result is independent of the thread count. Consecutive
 * blocks of one expert reuse its packed weights (the GEMM workspace's keyed slots).
 */
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "moe.h"

/* Write the checkpoints of block n (positions [0, B)); values for real positions < L come from the block buffers
 * (aq: the affinity of each position), padding positions get 0. Rows i split between threads. */
static inline void st_ck(const mxfp8_tensor *t, int64_t off, float v) {
    if (t->dtype == MXFP8_DTYPE_F64) ((double *)t->data)[off] = v;
    else mxfp8i_store_f32(t->data, t->dtype, off, v);
}
static void write_checkpoints(const mxfp8i_moe *p, int64_t n, int64_t L, const mxfp8_moe_fwd_outputs *o,
                              const float *g, const float *u, const float *act, const float *inter,
                              const float *down, const float *aq) {
    const int64_t B = p->B, I = p->I, H = p->H;
    const int32_t *tok = p->tok + n * B;
    const mxfp8_tensor *ck = &o->gate_up_proj_act_checkpoint_T;
    const mxfp8_tensor *cks[3] = {&o->gate_act_checkpoint_T, &o->intermediate_checkpoint_T,
                                  &o->scaled_intermediate_checkpoint_T};
#pragma omp parallel for schedule(static) num_threads(mxfp8i_moe_nt((double)B * (double)I * 5.0))
    for (int64_t i = 0; i < I; i++) {
        for (int64_t q = 0; q < B; q++) {
            const int real = q < L && tok[q] >= 0;
            const float gv = real ? g[q * I + i] : 0.0f, uv = real ? u[q * I + i] : 0.0f;
            const float av = real ? act[q * I + i] : 0.0f, iv = real ? inter[q * I + i] : 0.0f;
            if (ck->data) {
                const int64_t base = n * ck->strides[0] + i * ck->strides[2] + q * ck->strides[3];
                st_ck(ck, base, gv);
                st_ck(ck, base + ck->strides[1], uv);
            }
            const float v3[3] = {av, iv, real ? aq[q] * iv : 0.0f};
            for (int c = 0; c < 3; c++)
                if (cks[c]->data)
                    st_ck(cks[c], n * cks[c]->strides[0] + i * cks[c]->strides[1] + q * cks[c]->strides[2], v3[c]);
        }
    }
    const mxfp8_tensor *d = &o->down_proj_output_checkpoint;
    if (d->data)
#pragma omp parallel for schedule(static) num_threads(mxfp8i_moe_nt((double)B * (double)H))
        for (int64_t q = 0; q < B; q++) {
            const int real = q < L && tok[q] >= 0;
            for (int64_t h = 0; h < H; h++)
                st_ck(d, n * d->strides[0] + q * d->strides[1] + h * d->strides[2], real ? down[q * H + h] : 0.0f);
        }
}

typedef struct fwd_ws {
    mxfp8i_moe_wcopy wc;
    float *acc;                                        /* the output accumulator [T*H] */
    float *xb, *gu, *g, *u, *act, *inter, *down, *b1, *b2, *aq; /* per-block buffers, rows [0, Bw) */
} fwd_ws;

static void ws_free(fwd_ws *w) {
    free(w->acc); free(w->xb); free(w->gu); free(w->g); free(w->u); free(w->act); free(w->inter); free(w->down);
    free(w->b1); free(w->b2); free(w->aq);
    mxfp8i_moe_wcopy_free(&w->wc);
}

static mxfp8_status ws_alloc(fwd_ws *w, const mxfp8i_moe *p) {
    const int64_t H = p->H, I = p->I, I2 = 2 * I, Bw = p->Bw;
    memset(w, 0, sizeof *w);
    w->acc = (float *)calloc((size_t)(p->T * H > 0 ? p->T * H : 1), sizeof(float));
    w->xb = (float *)malloc((size_t)(Bw * H) * sizeof(float));
    w->gu = (float *)malloc((size_t)(Bw * I2) * sizeof(float));
    w->g = (float *)malloc((size_t)(Bw * I) * sizeof(float));
    w->u = (float *)malloc((size_t)(Bw * I) * sizeof(float));
    w->act = (float *)malloc((size_t)(Bw * I) * sizeof(float));
    w->inter = (float *)malloc((size_t)(Bw * I) * sizeof(float));
    w->down = (float *)malloc((size_t)(Bw * H) * sizeof(float));
    w->b1 = (float *)malloc((size_t)I2 * sizeof(float));
    w->b2 = (float *)malloc((size_t)H * sizeof(float));
    w->aq = (float *)malloc((size_t)Bw * sizeof(float));
    int ok = w->acc && w->xb && w->gu && w->g && w->u && w->act && w->inter && w->down && w->b1 && w->b2 && w->aq;
    if (!ok || mxfp8i_moe_wcopy_alloc(p, 1u << MXFP8I_W1_H | 1u << MXFP8I_W2_I, &w->wc)) {
        ws_free(w);
        return MXFP8_ERR_OUT_OF_MEMORY;
    }
    return MXFP8_OK;
}

/* Block n of expert e, positions [0, L), L > 0: both GEMMs, the elementwise work, the weighted scatter into acc. */
static mxfp8_status fwd_block(const mxfp8i_moe *p, fwd_ws *w, int64_t n, int64_t e, int64_t L) {
    const int64_t H = p->H, I = p->I, I2 = 2 * I;
    const mxfp8_moe_config *c = &p->cfg;
    const int32_t *tok = p->tok + n * p->B;
    float *xb = w->xb, *gu = w->gu, *g = w->g, *u = w->u, *act = w->act, *inter = w->inter, *down = w->down;
    const float *b1 = w->b1, *b2 = w->b2;
    float *aq = w->aq;
    const int nt = mxfp8i_moe_nt((double)L * (double)(H + I2)); /* elementwise work of this block */
    mxfp8i_moe_load_b1(p, e, w->b1);
    mxfp8i_moe_load_b2(p, e, w->b2);
    /* gather X rows (padding rows zero) and the affinities of the positions */
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t q = 0; q < L; q++) {
        aq[q] = tok[q] >= 0 ? mxfp8i_moe_aff(p, tok[q], e) : 0.0f;
        for (int64_t h = 0; h < H; h++) xb[q * H + h] = tok[q] >= 0 ? mxfp8i_moe_ld2(&p->X, tok[q], h) : 0.0f;
    }
    /* GEMM 1: GU = X_blk @ W1[e], contraction H (W1[e]'s packed panels kept in keyed slot 0) */
    mxfp8i_gop A = mxfp8i_gop_hp(xb, MXFP8_DTYPE_F32, L, H, H, 1);
    mxfp8i_moe_round_block(p, &A, MXFP8_MOE_GEMM1_X, n, H, H, 1);
    mxfp8i_gop W = mxfp8i_moe_weight(p, &w->wc, e, MXFP8I_W1_H);
    mxfp8i_gemm_ws_bkey(0, (uint64_t)e + 1, W.data);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_gemm(p, e, &A, MXFP8_MOE_GEMM1_X, &W, MXFP8_MOE_GEMM1_W1, 0, gu, I2));
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t q = 0; q < L; q++)
        for (int64_t i = 0; i < I; i++) {
            float gv = 0.0f, uv = 0.0f, av = 0.0f, iv = 0.0f;
            if (tok[q] >= 0) {
                gv = mxfp8i_moe_clamp(gu[q * I2 + i] + b1[i], c->gate_clamp_lower, c->gate_clamp_upper);
                uv = mxfp8i_moe_clamp(gu[q * I2 + I + i] + b1[I + i], c->up_clamp_lower, c->up_clamp_upper);
                av = mxfp8i_moe_act(c, gv);
                iv = av * mxfp8i_moe_up(c, uv);
            }
            g[q * I + i] = gv;
            u[q * I + i] = uv;
            act[q * I + i] = av;
            inter[q * I + i] = iv;
        }
    /* GEMM 2: down = inter @ W2[e] + b2, contraction I (keyed slot 1) */
    A = mxfp8i_gop_hp(inter, MXFP8_DTYPE_F32, L, I, I, 1);
    mxfp8i_moe_round_block(p, &A, MXFP8_MOE_GEMM2_INTER, n, I, I, 1);
    W = mxfp8i_moe_weight(p, &w->wc, e, MXFP8I_W2_I);
    mxfp8i_gemm_ws_bkey(1, (uint64_t)e + 1, W.data);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_gemm(p, e, &A, MXFP8_MOE_GEMM2_INTER, &W, MXFP8_MOE_GEMM2_W2, 0, down, H));
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int t = 0; t < nt; t++) { /* column ranges split between threads; positions in order */
        const int64_t h0 = H * t / nt, h1 = H * (t + 1) / nt;
        for (int64_t q = 0; q < L; q++) {
            float *dq = down + q * H;
            if (tok[q] < 0) {
                for (int64_t h = h0; h < h1; h++) dq[h] = 0.0f;
                continue;
            }
            const float a = aq[q];
            float *dst = w->acc + tok[q] * H;
            for (int64_t h = h0; h < h1; h++) {
                float d = dq[h] + b2[h];
                dq[h] = d;
                dst[h] += a * d;
            }
        }
    }
    return MXFP8_OK;
}

mxfp8_status mxfp8_moe_forward(const mxfp8_moe_fwd_args *args, mxfp8_moe_fwd_outputs *outputs) {
    static const char *fn = "mxfp8_moe_forward";
    mxfp8i_clear_error();
    MXFP8I_RETURN_ERROR_IF(!args, MXFP8_ERR_NULL_POINTER, "%s: args is NULL", fn);
    MXFP8I_RETURN_ERROR_IF(!outputs, MXFP8_ERR_NULL_POINTER, "%s: outputs is NULL", fn);
    mxfp8i_moe_in in;
    mxfp8i_moe_in_fwd(args, &in);
    mxfp8i_moe p;
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_setup(fn, &in, 0, &p));
    mxfp8_status st = mxfp8i_moe_check_fwd_outputs(&p, &in, outputs, 0);
    if (!st && mxfp8i_moe_stats_alloc(&p, args->stats))
        st = mxfp8i_error(MXFP8_ERR_OUT_OF_MEMORY, "%s: cannot allocate the statistics", fn);
    fwd_ws w;
    if (!st && ws_alloc(&w, &p)) st = mxfp8i_error(MXFP8_ERR_OUT_OF_MEMORY, "%s: cannot allocate workspaces", fn);
    if (st) {
        mxfp8i_moe_free(&p);
        return st;
    }
    /* The block GEMMs reuse one set of GEMM buffers, and the blocks of one expert its packed weights. */
    mxfp8i_gemm_ws_begin();
    for (int64_t n = 0; n < p.N && !st; n++) {
        const int64_t e = p.expert[n], L = mxfp8i_moe_block_len(&p, n);
        if (L > 0) st = fwd_block(&p, &w, n, e, L);
        if (!st) write_checkpoints(&p, n, L, outputs, w.g, w.u, w.act, w.inter, w.down, w.aq);
    }
    mxfp8i_gemm_ws_end();
    if (st) {
        /* A GEMM workspace allocation failed after checkpoints of earlier blocks were written. */
        st = mxfp8i_error(MXFP8_ERR_OUT_OF_MEMORY, "%s: out of memory in a GEMM (outputs are incomplete)", fn);
    } else {
        const mxfp8_tensor *o = &outputs->output;
        const int64_t T = p.T, H = p.H;
#pragma omp parallel for schedule(static) num_threads(mxfp8i_moe_nt((double)T * (double)H))
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++)
                mxfp8i_store_f32(o->data, o->dtype, t * o->strides[0] + h * o->strides[1], w.acc[t * H + h]);
        mxfp8i_moe_stats_export(&p, args->stats);
    }
    ws_free(&w);
    mxfp8i_moe_free(&p);
    return st;
}
