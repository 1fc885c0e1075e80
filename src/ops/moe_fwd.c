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
 * the elementwise work and columns of the scatter, so the result is independent of the thread count.
 */
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "moe_internal.h"

void mxfp8i_moe_in_fwd(const mxfp8_moe_fwd_args *a, mxfp8i_moe_in *in) {
    memset(in, 0, sizeof *in);
    MXFP8I_MOE_IN_COMMON(in, a);
    in->dY = NULL;
}

#define NUM_IN 11
static void in_list(const mxfp8i_moe_in *in, const mxfp8_tensor *v[NUM_IN + 1], const char *names[NUM_IN + 1]) {
    const mxfp8_tensor *t[NUM_IN + 1] = {in->X, in->a, in->W1, in->W2, in->tok, in->b2e, in->b1, in->b2, in->W1s,
                                         in->W2s, in->nvt, in->dY};
    const char *n[NUM_IN + 1] = {"hidden_states", "expert_affinities_masked", "gate_up_proj_weight",
                                 "down_proj_weight", "token_position_to_id", "block_to_expert",
                                 "gate_and_up_proj_bias", "down_proj_bias", "gate_up_weight_scales",
                                 "down_weight_scales", "num_valid_tokens", "output_hidden_states_grad"};
    for (int i = 0; i <= NUM_IN; i++) {
        v[i] = t[i];
        names[i] = n[i];
    }
}

mxfp8_status mxfp8i_moe_check_outputs_alias(const char *fn, const mxfp8i_moe_in *in, int n,
                                            const mxfp8_tensor *const *outs, const char *const *onames,
                                            const mxfp8_tensor *const *extra, const char *const *enames, int nextra) {
    const mxfp8_tensor *v[NUM_IN + 1];
    const char *names[NUM_IN + 1];
    in_list(in, v, names);
    mxfp8_status st;
    for (int i = 0; i < n; i++) {
        /* issue 6: an output's elements must be distinct (else threads race on them) */
        if (outs[i]->data && (st = mxfp8i_check_distinct(fn, onames[i], outs[i]))) return st;
        if ((st = mxfp8i_moe_check_alias(fn, onames[i], outs[i], NUM_IN + 1, v, names))) return st;
        if ((st = mxfp8i_moe_check_alias(fn, onames[i], outs[i], nextra, extra, enames))) return st;
        for (int j = i + 1; j < n; j++)
            if ((st = mxfp8i_moe_check_alias(fn, onames[i], outs[i], 1, &outs[j], &onames[j]))) return st;
    }
    return MXFP8_OK;
}

mxfp8_status mxfp8i_moe_check_fwd_outputs(const mxfp8i_moe *p, const mxfp8i_moe_in *in, const mxfp8_moe_fwd_outputs *o,
                                          int allow_f64) {
    const char *fn = p->fn;
    mxfp8_status st;
    const int64_t sy[2] = {p->T, p->H}, sgu[4] = {p->N, 2, p->I, p->B}, si[3] = {p->N, p->I, p->B},
                  sd[3] = {p->N, p->B, p->H};
    if ((st = mxfp8i_moe_check_tensor(fn, "output", &o->output, 1, allow_f64, 2, sy))) return st;
    if ((st = mxfp8i_moe_check_tensor(fn, "gate_up_proj_act_checkpoint_T", &o->gate_up_proj_act_checkpoint_T, 0,
                                      allow_f64, 4, sgu)))
        return st;
    if ((st = mxfp8i_moe_check_tensor(fn, "gate_act_checkpoint_T", &o->gate_act_checkpoint_T, 0, allow_f64, 3, si)))
        return st;
    if ((st = mxfp8i_moe_check_tensor(fn, "intermediate_checkpoint_T", &o->intermediate_checkpoint_T, 0, allow_f64, 3,
                                      si)))
        return st;
    if ((st = mxfp8i_moe_check_tensor(fn, "scaled_intermediate_checkpoint_T", &o->scaled_intermediate_checkpoint_T, 0,
                                      allow_f64, 3, si)))
        return st;
    if ((st = mxfp8i_moe_check_tensor(fn, "down_proj_output_checkpoint", &o->down_proj_output_checkpoint, 0,
                                      allow_f64, 3, sd)))
        return st;
    const mxfp8_tensor *outs[6] = {&o->output, &o->gate_up_proj_act_checkpoint_T, &o->gate_act_checkpoint_T,
                                   &o->intermediate_checkpoint_T, &o->scaled_intermediate_checkpoint_T,
                                   &o->down_proj_output_checkpoint};
    const char *on[6] = {"output", "gate_up_proj_act_checkpoint_T", "gate_act_checkpoint_T",
                         "intermediate_checkpoint_T", "scaled_intermediate_checkpoint_T",
                         "down_proj_output_checkpoint"};
    return mxfp8i_moe_check_outputs_alias(fn, in, 6, outs, on, NULL, NULL, 0);
}

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

mxfp8_status mxfp8_moe_forward(const mxfp8_moe_fwd_args *args, mxfp8_moe_fwd_outputs *outputs) {
    static const char *fn = "mxfp8_moe_forward";
    mxfp8i_clear_error();
    if (!args) return mxfp8i_error(MXFP8_ERR_NULL_POINTER, "%s: args is NULL", fn);
    if (!outputs) return mxfp8i_error(MXFP8_ERR_NULL_POINTER, "%s: outputs is NULL", fn);
    mxfp8i_moe_in in;
    mxfp8i_moe_in_fwd(args, &in);
    mxfp8i_moe p;
    mxfp8_status st = mxfp8i_moe_setup(fn, &in, 0, &p);
    if (st) return st;
    if ((st = mxfp8i_moe_check_fwd_outputs(&p, &in, outputs, 0))) {
        mxfp8i_moe_free(&p);
        return st;
    }
    const int64_t T = p.T, H = p.H, I = p.I, B = p.B, I2 = 2 * I, Bw = p.Bw;
    const mxfp8_moe_config *c = &p.cfg;

    /* Workspaces (all allocated before the first store). */
    mxfp8i_moe_wq wq;
    float *acc = (float *)calloc((size_t)(T * H > 0 ? T * H : 1), sizeof(float));
    float *xb = (float *)malloc((size_t)(Bw * H) * sizeof(float));
    float *gu = (float *)malloc((size_t)(Bw * I2) * sizeof(float));
    float *g = (float *)malloc((size_t)(Bw * I) * sizeof(float));
    float *u = (float *)malloc((size_t)(Bw * I) * sizeof(float));
    float *act = (float *)malloc((size_t)(Bw * I) * sizeof(float));
    float *inter = (float *)malloc((size_t)(Bw * I) * sizeof(float));
    float *down = (float *)malloc((size_t)(Bw * H) * sizeof(float));
    float *b1 = (float *)malloc((size_t)I2 * sizeof(float));
    float *b2 = (float *)malloc((size_t)H * sizeof(float));
    float *aq = (float *)malloc((size_t)Bw * sizeof(float));
    st = mxfp8i_moe_wq_alloc(&p, 1, 0, &wq);
    if (st || !acc || !xb || !gu || !g || !u || !act || !inter || !down || !b1 || !b2 || !aq) {
        if (!st) mxfp8i_moe_wq_free(&wq);
        st = mxfp8i_error(MXFP8_ERR_OUT_OF_MEMORY, "%s: cannot allocate workspaces", fn);
        goto done;
    }

    for (int64_t n = 0; n < p.N; n++) {
        const int64_t e = p.expert[n], L = mxfp8i_moe_block_len(&p, n);
        const int32_t *tok = p.tok + n * B;
        if (L == 0) {
            write_checkpoints(&p, n, 0, outputs, g, u, act, inter, down, aq);
            continue;
        }
        const int nt = mxfp8i_moe_nt((double)L * (double)(H + I2)); /* elementwise work of this block */
        mxfp8i_moe_wq_prepare(&p, e, &wq);
        mxfp8i_moe_load_b1(&p, e, b1);
        mxfp8i_moe_load_b2(&p, e, b2);
        /* gather X rows (padding rows zero) and the affinities of the positions */
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t q = 0; q < L; q++) {
            aq[q] = tok[q] >= 0 ? mxfp8i_moe_aff(&p, tok[q], e) : 0.0f;
            for (int64_t h = 0; h < H; h++) xb[q * H + h] = tok[q] >= 0 ? mxfp8i_moe_ld2(&p.X, tok[q], h) : 0.0f;
        }
        /* GEMM 1: GU = X_blk @ W1[e], contraction H */
        mxfp8i_moe_op A = {0};
        A.v = xb; A.rs = H; A.ks = 1;
        mxfp8i_moe_op W = mxfp8i_moe_op_w1_h(&p, &wq);
        if ((st = mxfp8i_moe_gemm(&p, L, I2, H, &A, &W, 0, gu, I2))) goto oom;
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t q = 0; q < L; q++)
            for (int64_t i = 0; i < I; i++) {
                float gv = 0.0f, uv = 0.0f, av = 0.0f, iv = 0.0f;
                if (tok[q] >= 0) {
                    gv = mxfp8i_moe_clamp(gu[q * I2 + i] + b1[i], c->gate_clamp_lower, c->gate_clamp_upper);
                    uv = mxfp8i_moe_clamp(gu[q * I2 + I + i] + b1[I + i], c->up_clamp_lower, c->up_clamp_upper);
                    av = mxfp8i_moe_act(c->activation, gv);
                    iv = av * uv;
                }
                g[q * I + i] = gv;
                u[q * I + i] = uv;
                act[q * I + i] = av;
                inter[q * I + i] = iv;
            }
        /* GEMM 2: down = inter @ W2[e] + b2, contraction I */
        A.v = inter; A.rs = I; A.ks = 1;
        W = mxfp8i_moe_op_w2_i(&p, &wq);
        if ((st = mxfp8i_moe_gemm(&p, L, H, I, &A, &W, 0, down, H))) goto oom;
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
                float *dst = acc + tok[q] * H;
                for (int64_t h = h0; h < h1; h++) {
                    float d = dq[h] + b2[h];
                    dq[h] = d;
                    dst[h] += a * d;
                }
            }
        }
        write_checkpoints(&p, n, L, outputs, g, u, act, inter, down, aq);
    }
    {
        const mxfp8_tensor *o = &outputs->output;
#pragma omp parallel for schedule(static) num_threads(mxfp8i_moe_nt((double)T * (double)H))
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++)
                mxfp8i_store_f32(o->data, o->dtype, t * o->strides[0] + h * o->strides[1], acc[t * H + h]);
    }
    st = MXFP8_OK;
    mxfp8i_moe_wq_free(&wq);
    goto done;
oom:
    /* A GEMM workspace allocation failed after checkpoints of earlier blocks were written. */
    mxfp8i_moe_wq_free(&wq);
    st = mxfp8i_error(MXFP8_ERR_OUT_OF_MEMORY, "%s: out of memory in a GEMM (outputs are incomplete)", fn);
done:
    free(acc); free(xb); free(gu); free(g); free(u); free(act); free(inter); free(down); free(b1); free(b2); free(aq);
    mxfp8i_moe_free(&p);
    return st;
}
