/*
 * bwd_block.c -- one block of blockwise_mm_bwd_mxfp8 [NKI-E]: gather, g/u/act/inter (checkpoints or recomputed),
 * Phase 1, the affinity gradient and the activation backward, Phase 2 with its scatter and the bias sums, Phases 3
 * and 4 (per block, or at the end of the expert as segmented GEMMs: mxfp8i_moe_wgrad_segments).
 * Math: bwd.c's file comment. Threads split GEMM output tiles, rows of elementwise work and column ranges of sums
 * and scatters (positions always in order), so every result is independent of the thread count. Between the GEMMs
 * a block has three parallel regions (gathers + checkpoints + forward values; affinity gradient + activation
 * backward; scatter + bias sums), each thread's work in one region being row- or column-local.
 */
#include "bwd_state.h"
#include "../../kernels/registry.h"

/* Element (n, i, q) of an [N, I, B] checkpoint / (n, q, h) of [N, B, H]. */
static inline float ck3(const mxfp8_tensor *t, int64_t n, int64_t x, int64_t y) {
    return mxfp8i_load_f32(t->data, t->dtype, n * t->strides[0] + x * t->strides[1] + y * t->strides[2]);
}

/* Whether Phase 4's A operand of block n (AFFINITY_ON_I) is the scaled-intermediate checkpoint itself: given in
 * BF16 with positions contiguous, and no padding among the block's first L positions (L = its last real position +
 * 1; a padding position's checkpoint value is never read, it may hold anything). Block n's [I, B] slab is then S^T
 * with rows along the positions: quantized in place along them (the values the S buffer would hold, so the same
 * codes, scales, rounding indices and statistics) instead of being loaded transposed into the S buffer and
 * quantized down its columns. */
static int s_direct(const mxfp8i_moe_bwd *w, int64_t n) {
    const mxfp8_tensor *t = &w->args->scaled_intermediate_checkpoint_T;
    if (w->onH || !t->data || t->dtype != MXFP8_DTYPE_BF16 || t->strides[2] != 1) return 0;
    const int64_t L = mxfp8i_moe_block_len(w->p, n);
    const int32_t *tok = w->p->tok + n * w->p->B;
    for (int64_t q = 0; q < L; q++)
        if (tok[q] < 0) return 0;
    return 1;
}
/* Phase 4's A operand of block n, L positions: the checkpoint's slab (s_direct), else rows [r, r + L) of the S
 * buffer (ON_I) or of inter (ON_H), viewed [I, L] and quantized down its columns. */
static mxfp8i_gop p4_a(const mxfp8i_moe_bwd *w, int64_t n, int64_t L, const float *S, const float *inter, int64_t r) {
    const int64_t I = w->p->I;
    if (s_direct(w, n)) {
        const mxfp8_tensor *t = &w->args->scaled_intermediate_checkpoint_T;
        return mxfp8i_gop_hp((const uint16_t *)t->data + n * t->strides[0], MXFP8_DTYPE_BF16, I, L, t->strides[1], 1);
    }
    return mxfp8i_gop_hp((w->onH ? inter : S) + r * I, MXFP8_DTYPE_F32, I, L, 1, I);
}

/* Positions [q0, q1) of the block: X and dY rows of their tokens (padding rows zero; X in mxfp8i_moe_xb_dtype, dY
 * in FP32, or as BF16 with dy16). */
static void gather_rows(mxfp8i_moe_bwd *w, const int32_t *tok, int64_t q0, int64_t q1) {
    const mxfp8i_moe *p = w->p;
    const int64_t H = p->H;
    for (int64_t q = q0; q < q1; q++) {
        mxfp8i_moe_x_row(&p->X, tok[q], H, w->xb, q);
        if (tok[q] < 0) {
            memset(w->dyb + q * H, 0, (size_t)H * sizeof(float));
            continue;
        }
        if (q + 1 < q1 && tok[q + 1] >= 0) {
            mxfp8i_moe_prefetch_row(&p->X, tok[q + 1], H);
            mxfp8i_moe_prefetch_row(&p->dY, tok[q + 1], H);
        }
        if (w->dy16) /* (X's gather: BF16 rows as they are, here one per FP32 row) */
            mxfp8i_moe_x_row(&p->dY, tok[q], H, w->dyb + q * H, 0);
        else
            mxfp8i_moe_row_f32(&p->dY, tok[q], H, w->dyb + q * H);
    }
}

/* Rows [r, r + L) of a dY buffer (base: dyb or dyb0) as a GEMM operand: [L, H] (t = 0: Phase 1's A) or its
 * transpose [H, L] (t = 1: Phase 4's B); FP32 rows of H, or BF16 rows in their places (dy16: 2 H BF16 apart). */
static mxfp8i_gop dy_op(const mxfp8i_moe_bwd *w, const float *base, int64_t r, int64_t L, int t) {
    const int64_t H = w->p->H, ld = w->dy16 ? 2 * H : H;
    const mxfp8_dtype dt = w->dy16 ? MXFP8_DTYPE_BF16 : MXFP8_DTYPE_F32;
    return t ? mxfp8i_gop_hp(base + r * H, dt, H, L, 1, ld) : mxfp8i_gop_hp(base + r * H, dt, L, H, ld, 1);
}

/* Positions [q0, q1) of a checkpoint's [I] x [positions] block (positions innermost, strides si, sq) into d[q][i],
 * read in 16-row blocks of i (each row's positions contiguous when sq = 1). */
static void read_ck(const mxfp8_tensor *t, int64_t base, int64_t si, int64_t sq, int64_t I, int64_t q0, int64_t q1,
                    float *d) {
    if (q1 <= q0) return;
    if (t->dtype == MXFP8_DTYPE_BF16 && sq == 1) { /* the registry's transposing load */
        mxfp8i_kernels_get()->quant->bf16_t((const uint16_t *)t->data + base + q0, si, d + q0 * I, I, I, q1 - q0);
        return;
    }
    if (t->dtype == MXFP8_DTYPE_F32 && sq == 1) { /* and its transposing FP32 copy */
        mxfp8i_kernels_get()->quant->f32_t((const float *)t->data + base + q0, si, d + q0 * I, I, I, q1 - q0, 0);
        return;
    }
    if ((t->dtype == MXFP8_DTYPE_F32 || t->dtype == MXFP8_DTYPE_BF16) && si == 1) { /* positions-major memory
                                                                                    ([.., q, i]): row by row */
        const mxfp8_tensor rows = {(char *)t->data + (size_t)base * mxfp8_dtype_size(t->dtype), t->dtype, 2,
                                   {q1, I}, {sq, 1}};
        for (int64_t q = q0; q < q1; q++) mxfp8i_moe_row_f32(&rows, q, I, d + q * I);
        return;
    }
    for (int64_t i0 = 0; i0 < I; i0 += 16) {
        const int64_t i1 = i0 + 16 < I ? i0 + 16 : I;
        if (t->dtype == MXFP8_DTYPE_F32) {
            const float *src = (const float *)t->data + base;
            for (int64_t q = q0; q < q1; q++)
                for (int64_t i = i0; i < i1; i++) d[q * I + i] = src[i * si + q * sq];
        } else if (t->dtype == MXFP8_DTYPE_BF16) {
            const uint16_t *src = (const uint16_t *)t->data + base;
            for (int64_t q = q0; q < q1; q++)
                for (int64_t i = i0; i < i1; i++) d[q * I + i] = mxfp8i_bf16_to_fp32(src[i * si + q * sq]);
        } else {
            for (int64_t q = q0; q < q1; q++)
                for (int64_t i = i0; i < i1; i++)
                    d[q * I + i] = mxfp8i_load_f32(t->data, t->dtype, base + i * si + q * sq);
        }
    }
}

/* The checkpoint read into buffer k of read_checkpoints (0 g, 1 u, 2 act, 3 inter, 4 S). */
static const mxfp8_tensor *ck_of(const mxfp8i_moe_bwd *w, int k) {
    const mxfp8_moe_bwd_args *a = w->args;
    return k < 2 ? &a->gate_up_proj_act_checkpoint_T
                 : k == 2 ? &a->gate_act_checkpoint_T
                          : k == 3 ? &a->intermediate_checkpoint_T : &a->scaled_intermediate_checkpoint_T;
}

/* Positions [q0, q1) of the run starting at block n, all in its block b = q0 / B, of checkpoint k ([n, (j,) i, q])
 * into d[(q - q0) I + i]. */
static void read_ck_span(const mxfp8i_moe_bwd *w, int k, int64_t n, int64_t q0, int64_t q1, float *d) {
    const mxfp8_tensor *t = ck_of(w, k);
    const int64_t B = w->p->B, b = q0 / B;
    const int four = t->ndim == 4;
    const int64_t si = t->strides[four ? 2 : 1], sq = t->strides[four ? 3 : 2];
    const int64_t base = (n + b) * t->strides[0] + (four ? (k == 1) * t->strides[1] : 0) + (q0 - b * B) * sq;
    read_ck(t, base, si, sq, w->p->I, 0, q1 - q0, d);
}

/* Whether the activation backward reads g, u, act(g) and inter from their checkpoints itself, a span of positions at
 * a time into the thread's rows of those buffers, just before it uses them (read_ck_span): where all four checkpoints
 * are given (the forward rows then compute nothing) and nothing else reads those rows (AFFINITY_ON_I: Phase 4 takes
 * S). Else forward_values reads every given checkpoint up front, and the [positions, I] rows come back from memory
 * after Phase 1. The same values either way. */
static int ck_deferred(const mxfp8i_moe_bwd *w) {
    const mxfp8_moe_bwd_args *a = w->args;
    return !w->onH && a->gate_up_proj_act_checkpoint_T.data && a->gate_act_checkpoint_T.data &&
           a->intermediate_checkpoint_T.data && a->scaled_intermediate_checkpoint_T.data;
}

/* Positions [q0, q1) of the run starting at block n (position q: position q % B of block n + q / B) of every given
 * checkpoint ([n, (j,) i, q]) into the [q][i] buffers g, u, act, inter, S, block by block; only S when the reads are
 * deferred (ck_deferred). */
static void read_checkpoints(mxfp8i_moe_bwd *w, int64_t n, int64_t q0, int64_t q1) {
    const int64_t B = w->p->B, I = w->p->I;
    float *dst[5] = {w->g, w->u, w->act, w->inter, w->S};
    for (int k = ck_deferred(w) ? 4 : w->gck ? 2 : 0; k < 5; k++) { /* (g and u read in place: not copied) */
        if (!ck_of(w, k)->data || (k == 4 && w->onH)) continue;
        for (int64_t q = q0; q < q1;) {
            const int64_t b = q / B, qe = q1 < (b + 1) * B ? q1 : (b + 1) * B;
            if (!(k == 4 && s_direct(w, n + b))) /* (else Phase 4 reads this block's slab in place) */
                read_ck_span(w, k, n, q, qe, dst[k] + q * I);
            q = qe;
        }
    }
}

/* Whether act(g) is not kept (the activation backward takes g * sigmoid, act_bwd's act = NULL): recomputed from a
 * sigmoid-gated activation whose sigmoid is kept (w->have_sg) and whose intermediate is recomputed too (the forward
 * row then computes act into the inter row, which inter overwrites). Saves writing and reading back act's
 * [positions, I] buffer (a quarter of the forward rows' output). */
static int act_in_sg(const mxfp8i_moe_bwd *w) { return w->have_sg && !w->args->intermediate_checkpoint_T.data; }

/* Positions [q0, q1): g, u, act(g), inter (from the checkpoints read, else from GU + b1 + clamp), and the Phase 4
 * operand S = a*inter (ON_I) or the Phase 1 operand D = a*dY (ON_H); zeros at padding positions. */
static void forward_rows(mxfp8i_moe_bwd *w, int64_t n, int64_t e, const int32_t *tok, int64_t q0, int64_t q1) {
    const mxfp8i_moe *p = w->p;
    const mxfp8_moe_config *c = &p->cfg;
    const mxfp8_moe_bwd_args *a = w->args;
    const mxfp8_tensor *ck_gu = &a->gate_up_proj_act_checkpoint_T, *ck_act = &a->gate_act_checkpoint_T,
                       *ck_inter = &a->intermediate_checkpoint_T, *ck_s = &a->scaled_intermediate_checkpoint_T,
                       *ck_D = &a->down_proj_act_checkpoint;
    const int64_t H = p->H, I = p->I, I2 = 2 * I;
    const int deferred = ck_deferred(w), no_act = act_in_sg(w);
    for (int64_t q = q0; q < q1; q++) {
        /* g, u in place in the checkpoint (only read: the row function writes them only when given GU) */
        float *g = w->gck ? (float *)(uintptr_t)(w->gck + q * w->gld) : w->g + q * I;
        float *u = w->gck ? (float *)(uintptr_t)(w->uck + q * w->gld) : w->u + q * I;
        float *inter = w->inter + q * I, *act = no_act ? inter : w->act + q * I; /* (inter overwrites it) */
        float *S = w->onH ? NULL : w->S + q * I;
        if (tok[q] < 0) { /* padding: zeros (g, u in place and deferred rows are never read there: not written) */
            const int own = !deferred;
            float *rows[5] = {own && !w->gck ? g : NULL, own && !w->gck ? u : NULL, own ? act : NULL,
                              own ? inter : NULL, S};
            for (int k = 0; k < 5; k++)
                if (rows[k]) memset(rows[k], 0, (size_t)I * sizeof(float));
            if (w->onH) memset(w->D + q * H, 0, (size_t)H * sizeof(float));
            continue;
        }
        if (deferred) continue; /* every value given: the forward row computes nothing */
        const float aq = mxfp8i_moe_aff(p, tok[q], e);
        mxfp8i_moe_fwd_row(c, I, ck_gu->data ? NULL : w->gu + q * I2, w->b1, g, u, act, ck_act->data != NULL, inter,
                           ck_inter->data != NULL, ck_s->data ? NULL : S, aq, w->have_sg ? w->sg + q * I : NULL);
        if (w->onH) {
            float *D = w->D + q * H;
            if (ck_D->data)
                for (int64_t h = 0; h < H; h++) D[h] = ck3(ck_D, n + q / p->B, q % p->B, h);
            else
                for (int64_t h = 0; h < H; h++) D[h] = aq * w->dyb[q * H + h];
        }
    }
}

/* The block's inputs and forward values: the gathers, the checkpoints, and g, u, act(g), inter, S or D (with the
 * gate/up checkpoint: all in one parallel region, each thread on its positions; without it, the forward's GEMM 1
 * (GU = X_blk @ W1[e], contraction H) between the gathers and the rest). Sets w->have_sg when w->sg holds
 * sigmoid(c g) of every position. Row by row the same expressions whatever the split: bitwise equal for any thread
 * count. */
static mxfp8_status forward_values(mxfp8i_moe_bwd *w, int64_t n, int64_t e, const int32_t *tok, int64_t L, int nt) {
    const mxfp8i_moe *p = w->p;
    const mxfp8_moe_bwd_args *a = w->args;
    const int64_t H = p->H, I2 = 2 * p->I;
    const int re_gu = !a->gate_up_proj_act_checkpoint_T.data;
    w->have_sg = !a->gate_act_checkpoint_T.data && mxfp8i_moe_sigmoid_act(&p->cfg);
#pragma omp parallel num_threads(nt)
    {
        const unsigned csr = mxfp8i_fenv_enter(); /* IEEE defaults on every thread of the region */
#pragma omp for schedule(static) nowait
        for (int t = 0; t < nt; t++) {
            const int64_t q0 = L * t / nt, q1 = L * (t + 1) / nt;
            gather_rows(w, tok, q0, q1);
            read_checkpoints(w, n, q0, q1);
            if (!re_gu) forward_rows(w, n, e, tok, q0, q1);
        }
        mxfp8i_fenv_leave(csr);
    }
    if (!re_gu) return MXFP8_OK;
    mxfp8i_gop A = mxfp8i_gop_hp(w->xb, mxfp8i_moe_xb_dtype(&p->X), L, H, H, 1);
    mxfp8i_moe_round_block(p, &A, MXFP8_MOE_GEMM1_X, n, H, H, 1);
    mxfp8i_gop W = mxfp8i_moe_weight(p, &w->wc, e, MXFP8I_W1_H);
    mxfp8i_ws_bkey(2, (uint64_t)e + 1, W.data); /* W1[e] along H: packed once per expert (keyed slot 2) */
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_gemm(p, e, &A, MXFP8_MOE_GEMM1_X, &W, MXFP8_MOE_GEMM1_W1, 0, w->gu, I2));
#pragma omp parallel num_threads(nt)
    {
        const unsigned csr = mxfp8i_fenv_enter(); /* IEEE defaults on every thread of the region */
#pragma omp for schedule(static) nowait
        for (int t = 0; t < nt; t++) forward_rows(w, n, e, tok, L * t / nt, L * (t + 1) / nt);
        mxfp8i_fenv_leave(csr);
    }
    return MXFP8_OK;
}

/* Phase 1 (contraction H): dI_raw = dY_blk @ W2[e]^T (ON_I) or dI = D @ W2[e]^T (ON_H); for ON_H without the down
 * projection checkpoint, the forward's GEMM 2 (down = inter @ W2[e], contraction I) too. */
static mxfp8_status phase1(mxfp8i_moe_bwd *w, int64_t n, int64_t e, int64_t L) {
    const mxfp8i_moe *p = w->p;
    const int64_t H = p->H, I = p->I;
    mxfp8i_gop A = w->onH ? mxfp8i_gop_hp(w->D, MXFP8_DTYPE_F32, L, H, H, 1) : dy_op(w, w->dyb, 0, L, 0);
    mxfp8i_moe_round_block(p, &A, MXFP8_MOE_P1_DY, n, H, H, 1);
    mxfp8i_gop W = mxfp8i_moe_weight(p, &w->wc, e, MXFP8I_W2_H);
    mxfp8i_ws_bkey(0, (uint64_t)e + 1, W.data); /* W2[e]'s packed panels serve all of e's blocks (slot 0) */
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_gemm(p, e, &A, MXFP8_MOE_P1_DY, &W, MXFP8_MOE_P1_W2, 0, w->dI, I));
    if (w->onH && !w->args->down_proj_output_checkpoint.data) {
        mxfp8i_gop Ai = mxfp8i_gop_hp(w->inter, MXFP8_DTYPE_F32, L, I, I, 1);
        mxfp8i_moe_round_block(p, &Ai, MXFP8_MOE_GEMM2_INTER, n, I, I, 1);
        mxfp8i_gop W2 = mxfp8i_moe_weight(p, &w->wc, e, MXFP8I_W2_I);
        mxfp8i_ws_bkey(3, (uint64_t)e + 1, W2.data); /* W2[e] along I: keyed slot 3 */
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
    const mxfp8i_dot_f64_fn dot = mxfp8i_kernels_get()->quant->dot_f64;
    const int deferred = ck_deferred(w), no_act = act_in_sg(w);
    float *const ckrow[4] = {w->g, w->u, w->act, w->inter}; /* the deferred reads' buffers */
    /* each thread on its positions, a span at a time (deferred reads: at most 16 positions, in one block, read into
       the thread's first rows: the transposing load's 16 x 16 tiles; 16 measured 0.96-0.99 of 32's backward time,
       64 1.01-1.03); affinity gradients 8 positions at a time (padding positions give 0) */
#pragma omp parallel num_threads(nt)
    {
        const unsigned csr = mxfp8i_fenv_enter(); /* IEEE defaults on every thread of the region */
#pragma omp for schedule(static) nowait
        for (int t = 0; t < nt; t++) {
            const int64_t t0 = L * t / nt, t1 = L * (t + 1) / nt;
            for (int64_t c0 = t0, c1; c0 < t1; c0 = c1) {
                c1 = t1;
                int64_t r = 0; /* the span's rows of g, u, act, inter start at row c0 - r */
                if (deferred) {
                    const int64_t next_b = (c0 / p->B + 1) * p->B, next_16 = (c0 / 16 + 1) * 16;
                    c1 = t1 < next_b ? t1 : next_b;
                    c1 = c1 < next_16 ? c1 : next_16;
                    r = c0 - t0;
                    for (int k = w->gck ? 2 : 0; k < 4; k++) read_ck_span(w, k, n, c0, c1, ckrow[k] + t0 * I);
                }
                for (int64_t q0 = c0; q0 < c1; q0 += 8) {
                    const int rows = (int)(c1 - q0 < 8 ? c1 - q0 : 8);
                    double *da = w->dablk + q0;
                    for (int k = 0; k < rows; k++) da[k] = 0.0;
                    if (!w->onH) { /* sum_i dI_raw * inter, continued by sum_h dY * b2 (sequential FP64 sums) */
                        dot(w->dI + q0 * I, I, w->inter + (q0 - r) * I, I, I, rows, da);
                        if (p->b2.data) dot(w->dyb + q0 * H, H, w->b2, 0, H, rows, da);
                    } else {
                        for (int k = 0; k < rows; k++) {
                            const int64_t q = q0 + k;
                            double s = 0.0;
                            for (int64_t h = 0; h < H; h++) {
                                float dn = ck_down->data ? ck3(ck_down, n + q / p->B, q % p->B, h)
                                                         : w->down[q * H + h] + w->b2[h];
                                s += (double)w->dyb[q * H + h] * (double)dn;
                            }
                            da[k] = s;
                        }
                    }
                    for (int k = 0; k < rows; k++)
                        if (tok[q0 + k] < 0) da[k] = 0.0;
                    for (int64_t q = q0; q < q0 + rows; q++) { /* the same positions' dGU rows */
                        if (tok[q] < 0) {
                            memset(w->dgu + q * I2, 0, (size_t)I2 * sizeof(float));
                            continue;
                        }
                        const float aq = mxfp8i_moe_aff(p, tok[q], e);
                        const int64_t o = (q - r) * I; /* q's row of g, u, act */
                        mxfp8i_moe_bwd_row(c, I, w->dI + q * I, aq, !w->onH, w->gck ? w->gck + q * w->gld : w->g + o,
                                           w->gck ? w->uck + q * w->gld : w->u + o,
                                           no_act ? NULL : w->act + o, w->have_sg ? w->sg + q * I : NULL,
                                           w->dgu + q * I2);
                    }
                }
            }
        }
        mxfp8i_fenv_leave(csr);
    }
}

/* The bias sums of positions [0, L) of a block (tok its routing) from their rows dgu [L, 2I] and r2 [L, H] (D under
 * AFFINITY_ON_H, else dY, weighted here): db1[e][k] += dGU[q][k] for k in [k0, k1), db2[e][h] += D[q][h] or
 * a * dY[q][h] for h in [h0, h1); FP64, real positions in order. */
static void bias_rows(const mxfp8i_moe_bwd *w, int64_t e, const int32_t *tok, int64_t L, const float *dgu,
                      const float *r2, int64_t k0, int64_t k1, int64_t h0, int64_t h1) {
    const mxfp8i_moe *p = w->p;
    const int64_t H = p->H, I2 = 2 * p->I;
    double *db1 = w->db1 + e * I2, *db2 = w->db2 + e * H;
    for (int64_t q = 0; q < L; q++) {
        if (tok[q] < 0) continue;
        const float aq = mxfp8i_moe_aff(p, tok[q], e);
        for (int64_t k = k0; k < k1; k++) db1[k] += (double)dgu[q * I2 + k];
        for (int64_t h = h0; h < h1; h++) db2[h] += w->onH ? (double)r2[q * H + h] : (double)(aq * r2[q * H + h]);
    }
}

/* Thread t of nt: the block's bias sums on its column ranges. */
static void bias_grads(mxfp8i_moe_bwd *w, int64_t e, const int32_t *tok, int64_t L, int t, int nt) {
    const int64_t H = w->p->H, I2 = 2 * w->p->I;
    bias_rows(w, e, tok, L, w->dgu, w->onH ? w->D : w->dyb, I2 * t / nt, I2 * (t + 1) / nt, H * t / nt,
              H * (t + 1) / nt);
}

/* Phase 2 (contraction 2I): dX_blk = dGU @ W1[e]^T, then scatter-added into dx in position order; the bias sums in
 * the same parallel region (both split by column ranges). */
static mxfp8_status phase2(mxfp8i_moe_bwd *w, int64_t n, int64_t e, const int32_t *tok, int64_t L, int nt) {
    const mxfp8i_moe *p = w->p;
    const int64_t H = p->H, I2 = 2 * p->I;
    mxfp8i_gop A = mxfp8i_gop_hp(w->dgu, MXFP8_DTYPE_F32, L, I2, I2, 1);
    mxfp8i_moe_round_block(p, &A, MXFP8_MOE_P2_DGU, n, I2, I2, 1);
    mxfp8i_gop W = mxfp8i_moe_weight(p, &w->wc, e, MXFP8I_W1_2I);
    mxfp8i_ws_bkey(1, (uint64_t)e + 1, W.data); /* W1[e] along 2I: keyed slot 1 */
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_gemm(p, e, &A, MXFP8_MOE_P2_DGU, &W, MXFP8_MOE_P2_W1, 0, w->dxb, H));
    /* (a worker's dX rows stay in V, and its bias sums come with its expert's weight gradients: backward_par) */
    const int bias = p->cfg.bias && !w->par, scatter = !w->par;
#pragma omp parallel num_threads(nt)
    {
        const unsigned csr = mxfp8i_fenv_enter(); /* IEEE defaults on every thread of the region */
#pragma omp for schedule(static) nowait
        for (int t = 0; t < nt; t++) {
            if (bias) bias_grads(w, e, tok, L, t, nt);
            const int64_t h0 = H * t / nt, h1 = H * (t + 1) / nt;
            for (int64_t q = 0; scatter && q < L; q++) {
                if (tok[q] < 0) continue;
                float *dst = w->dx + tok[q] * H;
                const float *src = w->dxb + q * H;
                if (q + 1 < L && tok[q + 1] >= 0)
                    mxfp8i_moe_prefetch(w->dx + tok[q + 1] * H + h0, (size_t)(h1 - h0) * sizeof(float), 1);
                for (int64_t h = h0; h < h1; h++) dst[h] += src[h];
            }
        }
        mxfp8i_fenv_leave(csr);
    }
    return MXFP8_OK;
}

/* Phase 3: dW1[e] [H, 2I] += X_blk^T @ dGU; Phase 4: dW2[e] [I, H] += S^T @ dY_blk (ON_I) or inter^T @ D (ON_H). The
 * operands are transposed views ([H, L] with strides (1, H), ...) that the GEMM quantizes down their columns, along
 * the block's positions. */
static mxfp8_status phases34(mxfp8i_moe_bwd *w, int64_t n, int64_t e, int64_t L, int64_t r) {
    const mxfp8i_moe *p = w->p;
    const int64_t H = p->H, I = p->I, I2 = 2 * I;
    const mxfp8_dtype xdt = mxfp8i_moe_xb_dtype(&p->X);
    mxfp8i_gop A = mxfp8i_gop_hp((const char *)w->xb + (size_t)(r * H) * mxfp8_dtype_size(xdt), xdt, H, L, 1, H);
    mxfp8i_gop B = mxfp8i_gop_hp(w->dgu + r * I2, MXFP8_DTYPE_F32, I2, L, 1, I2);
    mxfp8i_moe_round_block(p, &A, MXFP8_MOE_P3_X, n, H, 1, H);
    mxfp8i_moe_round_block(p, &B, MXFP8_MOE_P3_DGU, n, I2, 1, I2);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_gemm(p, e, &A, MXFP8_MOE_P3_X, &B, MXFP8_MOE_P3_DGU, 1, w->dw1, I2));
    A = p4_a(w, n, L, w->S, w->inter, r);
    B = w->onH ? mxfp8i_gop_hp(w->D + r * H, MXFP8_DTYPE_F32, H, L, 1, H) : dy_op(w, w->dyb, r, L, 1);
    mxfp8i_moe_round_block(p, &A, MXFP8_MOE_P4_S, n, I, 1, I);
    mxfp8i_moe_round_block(p, &B, MXFP8_MOE_P4_DY, n, H, 1, H);
    return mxfp8i_moe_gemm(p, e, &A, MXFP8_MOE_P4_S, &B, MXFP8_MOE_P4_DY, 1, w->dw2, H);
}

/* Phases 3 and 4 of expert e over the blocks recorded by the driver, as two segmented GEMMs: per block the same
 * operands (views of its rows of the expert-sized buffers, with its rounding) as phases34, the blocks' sums added
 * in block order. */
mxfp8_status mxfp8i_moe_wgrad_segments(mxfp8i_moe_bwd *w, int64_t e, int which) {
    const mxfp8i_moe *p = w->p;
    const int64_t H = p->H, I = p->I, I2 = 2 * I;
    const int ns = w->nseg;
    /* where each weight gradient goes: expert e of the BF16 or F32 output (direct) or the FP32 accumulator, which
       starts every expert at +0 (zeroed once; each expert's segmented GEMM writes all of it) */
    const mxfp8_dtype d1 = w->direct[0] ? w->wgrad[0]->dtype : MXFP8_DTYPE_F32,
                      d2 = w->direct[1] ? w->wgrad[1]->dtype : MXFP8_DTYPE_F32;
    const size_t es1 = mxfp8_dtype_size(d1), es2 = mxfp8_dtype_size(d2);
    void *c1 = w->direct[0] ? (void *)((char *)w->wgrad[0]->data + (size_t)(e * H * I2) * es1) : (void *)w->dw1;
    void *c2 = w->direct[1] ? (void *)((char *)w->wgrad[1]->data + (size_t)(e * I * H) * es2) : (void *)w->dw2;
    if (ns == 0) { /* an expert with no tokens: zero weight gradients (the accumulators may hold the last expert's) */
        if (which & 1) memset(c1, 0, es1 * (size_t)(H * I2)); /* +0 is all zero bits in BF16 and F32 */
        if (which & 2) memset(c2, 0, es2 * (size_t)(I * H));
        return MXFP8_OK;
    }
    mxfp8i_gop *A = w->sops, *B = w->sops + ns;
    const mxfp8_dtype xdt = mxfp8i_moe_xb_dtype(&p->X);
    const size_t xes = mxfp8_dtype_size(xdt);
    for (int s = 0; s < ns && (which & 1); s++) {
        const int64_t n = w->sn[s], L = w->sL[s], r = w->so[s];
        A[s] = mxfp8i_gop_hp((const char *)w->xb0 + (size_t)(r * H) * xes, xdt, H, L, 1, H);
        B[s] = mxfp8i_gop_hp(w->dgu0 + r * I2, MXFP8_DTYPE_F32, I2, L, 1, I2);
        mxfp8i_moe_round_block(p, &A[s], MXFP8_MOE_P3_X, n, H, 1, H);
        mxfp8i_moe_round_block(p, &B[s], MXFP8_MOE_P3_DGU, n, I2, 1, I2);
    }
    if (which & 1)
        MXFP8I_FORWARD_IF_ERROR(
            mxfp8i_moe_gemm_segments(p, e, ns, A, MXFP8_MOE_P3_X, B, MXFP8_MOE_P3_DGU, 1, w->direct[0], c1, d1, I2));
    if (!(which & 2)) return MXFP8_OK;
    for (int s = 0; s < ns; s++) {
        const int64_t n = w->sn[s], L = w->sL[s], r = w->so[s];
        A[s] = p4_a(w, n, L, w->S0, w->inter0, r);
        B[s] = w->onH ? mxfp8i_gop_hp(w->D0 + r * H, MXFP8_DTYPE_F32, H, L, 1, H) : dy_op(w, w->dyb0, r, L, 1);
        mxfp8i_moe_round_block(p, &A[s], MXFP8_MOE_P4_S, n, I, 1, I);
        mxfp8i_moe_round_block(p, &B[s], MXFP8_MOE_P4_DY, n, H, 1, H);
    }
    return mxfp8i_moe_gemm_segments(p, e, ns, A, MXFP8_MOE_P4_S, B, MXFP8_MOE_P4_DY, 1, w->direct[1], c2, d2, H);
}

void mxfp8i_moe_bias_segments(mxfp8i_moe_bwd *w, int64_t e, int which) {
    const mxfp8i_moe *p = w->p;
    const int64_t H = p->H, I2 = 2 * p->I;
    for (int s = 0; s < w->nseg; s++)
        bias_rows(w, e, p->tok + w->sn[s] * p->B, w->sL[s], w->dgu0 + w->so[s] * I2,
                  (w->onH ? w->D0 : w->dyb0) + w->so[s] * H, 0, (which & 1) ? I2 : 0, 0, (which & 2) ? H : 0);
}

mxfp8_status mxfp8i_moe_bwd_run(mxfp8i_moe_bwd *w, int64_t n, int64_t blocks, int64_t e, int64_t L) {
    const mxfp8i_moe *p = w->p;
    const int32_t *tok = p->tok + n * p->B;
    /* elementwise work of this block: threads by size, or the worker's thread alone */
    const int nt = w->par ? 1 : mxfp8i_moe_nt((double)L * (double)(p->H + 2 * p->I));
    if (w->par) w->dxb = w->V + n * p->B * p->H, w->dablk = w->dab + n * p->B; /* the run's rows of V and dab */
    mxfp8i_moe_load_b1(p, e, w->b1);
    mxfp8i_moe_load_b2(p, e, w->b2);
    /* an F32 gate/up checkpoint in positions-major memory whose blocks follow each other (block stride B position
       strides: mxfp8.torch's) holds the run's g and u rows as they are: read in place */
    const mxfp8_tensor *ck = &w->args->gate_up_proj_act_checkpoint_T;
    w->gck = w->uck = NULL;
    if (ck->data && ck->dtype == MXFP8_DTYPE_F32 && ck->strides[2] == 1 && ck->strides[0] == p->B * ck->strides[3]) {
        w->gck = (const float *)ck->data + n * ck->strides[0];
        w->uck = w->gck + ck->strides[1];
        w->gld = ck->strides[3];
    }
    MXFP8I_FORWARD_IF_ERROR(forward_values(w, n, e, tok, L, nt));
    MXFP8I_FORWARD_IF_ERROR(phase1(w, n, e, L));
    activation_backward(w, n, e, tok, L, nt);
    MXFP8I_FORWARD_IF_ERROR(phase2(w, n, e, tok, L, nt));
    for (int64_t b = 0; !w->seg && b < blocks; b++) /* block by block (else at the end of the expert) */
        MXFP8I_FORWARD_IF_ERROR(phases34(w, n + b, e, b + 1 < blocks ? p->B : L - b * p->B, b * p->B));
    for (int64_t q = 0; !w->par && q < L; q++)
        if (tok[q] >= 0) w->da[tok[q] * p->E + e] += w->dablk[q];
    return MXFP8_OK;
}
