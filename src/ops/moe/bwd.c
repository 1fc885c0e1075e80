/*
 * bwd.c -- blockwise_mm_bwd_mxfp8 [NKI-E]: the MXFP8 backward of the blockwise MoE layer (the driver: workspace,
 * the expert-major loop over the blocks of bwd_block.c, the final roundings of store.c).
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
 *                       (a BF16 scaled-intermediate checkpoint is S^T itself: read in place where a block has no
 *                       padding inside, bwd_block.c s_direct)
 *   bias grads          db1[e] += sum_p dGU ; db2[e] += sum_p a*dY   (FP64 sums)
 * Blocks run expert-major (expert 0's blocks in ascending block order, then expert 1's, ...), consecutive full
 * blocks of an expert stacked into runs for the phases up to Phase 2 (mxfp8i_moe_run_joins: the same bits). Phases 3
 * and 4 add each block's sum (a chain over its positions from +0) to the expert's FP32 pair in block order, either
 * block by block or, segmented, all of an expert's blocks in one mxfp8i_gemm_segments per weight gradient after its
 * last block (the same additions; use_segmented picks by size; for contiguous BF16 or F32 weight gradients with no
 * given values the segmented GEMMs write each expert straight into the output: direct). Accumulators:
 * hidden_states_grad in an FP32 [T, H] workspace (rounded once at the end); dW1, dW2 of the current expert in one FP32
 * pair, rounded into the outputs when the expert is done (every buffer of the call is reserved before the first GEMM,
 * so no allocation can fail once an output is written); affinity and bias
 * grads in FP64 (rounded to FP32, then to the output dtype). accumulate_hidden_states_grad / skip_grad_initialization
 * add the given value once: out = given + grad (one FP32 addition, then rounded to the dtype).
 * The weights enter the GEMMs as views of the caller's tensors (weights.c); the blocks of one expert share its packed
 * Phase 1 and Phase 2 weights, and those of the recomputations (the GEMM workspace's keyed slots 0-3), so each is
 * quantized and packed once per expert and call. Threads split GEMM output tiles, rows of
 * elementwise work and columns of reductions/scatters: bitwise identical for any thread count. Where runs of blocks
 * do not pay (small widths) the threads instead take whole blocks and whole weight gradients from one schedule, and
 * the additions across experts are made afterwards in this walk's order (backward_par, bwd_par): the same bits.
 */
#include <stdint.h>
#include <stdlib.h>
#include <omp.h>

#include "bwd_state.h"

/* A slot of the call's workspace for n elements of es bytes (the next of the layer's slots). */
static void *slot(int *next, int64_t n, size_t es, bool *ok) {
    void *q = mxfp8i_ws_get((*next)++, (size_t)(n > 0 ? n : 1) * es);
    if (!q) *ok = false;
    return q;
}

static int g_segmented = -1; /* mxfp8i_moe_set_segmented_wgrad: -1 by size, 0 per block, 1 segmented */

int mxfp8i_moe_set_segmented_wgrad(int mode) {
    const int prev = g_segmented;
    g_segmented = mode < 0 ? -1 : mode != 0;
    return prev;
}

/* The weight-gradient path by size (speed only: both give the same bits). The segmented path saves the FP32
 * read-modify-write of an expert's accumulators per block; when those fit in half a core's L2 (3*H*I floats up to
 * 1 MiB) the per-block path is kept. Measured at H = 256, I = 512 (1.5 MiB), 2 threads, AMD Zen 4: mxfp8.torch's
 * configuration (F32 gradients, FP32 gate/up checkpoint) 7-13% faster segmented, the bench's (BF16, all
 * checkpoints) within 3%; from 2 MiB up it is faster in both. */
static int use_segmented(const mxfp8i_moe *p) {
    if (g_segmented >= 0) return g_segmented;
    return 3.0 * (double)p->H * (double)p->I * (double)sizeof(float) > 1048576.0;
}

/* What the segmented weight gradients take beyond the per-block path (w->seg = 1): the block lists and operand
 * arrays, and both segmented GEMMs (Phase 3: [H, 2I], Phase 4: [I, H], at most Se segments of at most Bw
 * positions). Its expert-sized operand buffers are sized by the caller (rows Re). OUT_OF_MEMORY or OK. */
static mxfp8_status reserve_segmented_wgrad(mxfp8i_moe_bwd *w, const mxfp8i_moe *p, int64_t Se, int *next) {
    bool ok = true;
    w->sn = (int64_t *)slot(next, 3 * Se, sizeof(int64_t), &ok);
    w->sops = (mxfp8i_gop *)slot(next, 2 * Se, sizeof(mxfp8i_gop), &ok);
    if (!ok) return MXFP8_ERR_OUT_OF_MEMORY;
    w->sL = w->sn + Se;
    w->so = w->sL + Se;
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_gemm_segments_reserve(p, p->H, 2 * p->I, mxfp8i_moe_size_Bw(p), (int)Se));
    return mxfp8i_moe_gemm_segments_reserve(p, p->I, p->H, mxfp8i_moe_size_Bw(p), (int)Se);
}

static void bwd_state(mxfp8i_moe_bwd *w, const mxfp8i_moe *p, const mxfp8_moe_bwd_args *args);

/* The call's state for its reservation function: the problem, the gradients' views (their dtypes and layouts choose
 * direct), the statistics request, the call state whose buffers it fills. */
typedef struct bwd_job {
    const mxfp8i_moe *p;
    const mxfp8_moe_bwd_grads *grads;
    const mxfp8_quant_stats *stats;
    mxfp8i_moe_bwd *w;
    int par;    /* the call takes the expert-parallel path (mxfp8i_moe_par_pays) */
    int worker; /* the reservation of one worker of that path, in its own arena: one block's buffers, 1-thread GEMMs */
} bwd_job;

static mxfp8_status moe_bwd_reserve_job(const void *ctx);

static size_t al64(size_t b) { return (b + 63) & ~(size_t)63; }

/* The bytes of a row of one of the Phase 3 / 4 operand buffers on the expert-parallel path (i: 0 X, 1 dGU, 2 S
 * (ON_I) or inter (ON_H), 3 dY (ON_I) or D (ON_H)), and the rows of a wave (wave_rows): min(T, N B), which holds any
 * one expert's rows of mxfp8_moe_route's layout whatever the routing (so a training loop's later steps, whose
 * routing differs, need no larger workspace), or the most rows of one expert where another layout has more; at
 * least 4 full blocks. */
static size_t row_bytes(const mxfp8i_moe *p, int i) {
    const size_t xes = mxfp8_dtype_size(mxfp8i_moe_xb_dtype(&p->X)), f = sizeof(float);
    const size_t cols[4] = {(size_t)p->H * xes, (size_t)(2 * p->I) * f, (size_t)p->I * f, (size_t)p->H * f};
    return cols[i];
}
static int64_t wave_rows(const mxfp8i_moe *p) {
    const int64_t all = p->N * p->B, r = p->T < all ? p->T : all, b4 = 4 * p->B < all ? 4 * p->B : all;
    const int64_t w = r > b4 ? r : b4;
    return w > p->Re ? w : p->Re > 0 ? p->Re : 1;
}

/* Point the Phase 3 / 4 operand buffers of state tw (its *0 pointers) at row r0 of the call's buffers of wave wi
 * (two waves' buffers: wave wi uses those of wi % 2). */
static void set_carve(const mxfp8i_moe_bwd *w, int64_t wi, int64_t r0, mxfp8i_moe_bwd *tw) {
    char *c = w->sets;
    float *part[4];
    for (int i = 0; i < 4; i++) {
        const size_t b = al64((size_t)w->wrows * row_bytes(w->p, i));
        part[i] = (float *)(void *)(c + (size_t)(wi % 2) * b + (size_t)r0 * row_bytes(w->p, i));
        c += 2 * b;
    }
    tw->xb0 = part[0], tw->dgu0 = part[1];
    if (tw->onH) tw->inter0 = part[2], tw->D0 = part[3];
    else tw->S0 = part[2], tw->dyb0 = part[3];
}

/* The call's buffers on the expert-parallel path (in the call's arena): the accumulators of dX, the affinity and
 * bias gradients, each position's dX row V [N*B, H] and affinity-gradient term dab [N*B], the dX combine's scratch
 * and the blocks in expert-major order ([N + E + 1]), every expert's blocks and its first row in its wave, the waves
 * (estart, erow, wstart [E + 1]; sn, sL, so [N]; onw [threads]), the Phase 3 / 4 operand buffers of a wave's
 * experts (wave_rows rows each), and every worker's arena (sized by the worker's own reservation). The slots of V,
 * the combine's scratch and the arenas are those of the forward's expert-parallel path: one arena serving both holds
 * the larger of each. */
static mxfp8_status moe_bwd_reserve_par(const bwd_job *j) {
    const mxfp8i_moe *p = j->p;
    mxfp8i_moe_bwd *w = j->w;
    const int64_t NB = p->N * p->B, T = p->T, H = p->H, E = p->E, N = p->N;
    mxfp8i_moe_bwd tw;
    bwd_state(&tw, p, w->args);
    tw.seg = 1;
    const bwd_job tj = {p, j->grads, NULL, &tw, 1, 1};
    size_t inner = 0;
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_ws_plan(p->fn, moe_bwd_reserve_job, &tj, &inner));
    const int nt = mxfp8i_num_threads();
    w->par_bytes = mxfp8i_ws_sub_bytes(inner);
    w->wrows = wave_rows(p);
    size_t set_bytes = 0;
    for (int i = 0; i < 4; i++) set_bytes += 2 * al64((size_t)w->wrows * row_bytes(p, i)); /* two waves' */
    bool ok = true;
    int k = MXFP8I_WS_MOE_BUF0;
    ok = mxfp8i_moe_combine_reserve(p, &k, &w->dx, &w->V, &w->first, &w->list);
    w->bord = (int32_t *)slot(&k, N + E + 1, sizeof(int32_t), &ok);
    ok = ok && (size_t)nt <= SIZE_MAX / w->par_bytes &&
         (w->arenas = (char *)mxfp8i_ws_get(k++, (size_t)nt * w->par_bytes)) != NULL;
    ok = ok && (w->sets = (char *)mxfp8i_ws_get(k++, set_bytes)) != NULL;
    w->da = (double *)slot(&k, T * E, sizeof(double), &ok);
    w->db1 = (double *)slot(&k, E * 2 * p->I, sizeof(double), &ok);
    w->db2 = (double *)slot(&k, E * H, sizeof(double), &ok);
    w->dab = (double *)slot(&k, NB, sizeof(double), &ok);
    w->estart = (int64_t *)slot(&k, 10 * (E + 1) + 3 * N + nt, sizeof(int64_t), &ok);
    MXFP8I_RETURN_ERROR_IF(!ok, MXFP8_ERR_OUT_OF_MEMORY, "%s: cannot allocate workspaces", p->fn);
    int64_t **tab[] = {&w->erow, &w->wstart, &w->bdone, &w->wtaken, &w->elo, &w->ehi, &w->owner, &w->ewave, &w->wdone};
    for (int i = 0; i < 9; i++) *tab[i] = w->estart + (i + 1) * (E + 1);
    w->sn = w->estart + 10 * (E + 1), w->sL = w->sn + N, w->so = w->sL + N, w->onw = w->so + N;
    return MXFP8_OK;
}

/* Every buffer of the call, and every block GEMM's, the routing table's and the statistics passes': the one
 * reservation function (mxfp8i_ws_plan sizes it for mxfp8_moe_backward_validate and grows the call's arena once; the
 * call then runs it again for the pointers, which allocates nothing). It writes only the buffer pointers of *w (on a
 * sizing arena they must not be touched). OUT_OF_MEMORY (with a message) or OK. */
static mxfp8_status moe_bwd_reserve_job(const void *ctx) {
    const bwd_job *j = (const bwd_job *)ctx;
    const mxfp8i_moe *p = j->p;
    const mxfp8_moe_bwd_grads *grads = j->grads;
    mxfp8i_moe_bwd *w = j->w;
    /* rows of a run of blocks, for any routing (mxfp8i_moe_size_Rw) */
    const int64_t T = p->T, H = p->H, I = p->I, E = p->E, I2 = 2 * I, Bw = mxfp8i_moe_size_Rw(p);
    const int wk = j->worker; /* (a worker's dX rows, affinity terms and bias sums are the call's: not here) */
    bool ok = wk || !mxfp8i_moe_table_reserve(p);
    if (j->par && !wk) return ok ? moe_bwd_reserve_par(j) : MXFP8_ERR_OUT_OF_MEMORY;
    int64_t Re = 0, Se = 0;
    /* for any routing of mxfp8_moe_route's layout (mxfp8i_moe_size_Re, _Se), so later calls of a training loop need
       no larger arena; a worker's operand rows are the call's wave buffers */
    if (w->seg) Re = wk ? 0 : mxfp8i_moe_size_Re(p), Se = mxfp8i_moe_size_Se(p);
    if (Se > 0x7fffffff) w->seg = 0;    /* more segments than an int counts: the per-block path */
    /* rows of the Phase 3 / 4 operand buffers: expert-sized on the segmented path */
    const int64_t Rx = w->seg ? Re : Bw, RI = w->seg && !w->onH ? Re : Bw, RH = w->seg && w->onH ? Re : Bw;
    /* segmented, contiguous BF16 or F32 weight gradients with no given values to add: each expert's segmented GEMM
       writes straight into the output (every buffer is reserved before the first GEMM, so no allocation can fail
       once an output is written), with no FP32 pass */
    const mxfp8_tensor *wg[2] = {&grads->gate_up_proj_weight_grad, &grads->down_proj_weight_grad};
    for (int i = 0; i < 2; i++)
        w->direct[i] = w->seg && (wg[i]->dtype == MXFP8_DTYPE_BF16 || wg[i]->dtype == MXFP8_DTYPE_F32) &&
                       mxfp8i_is_contiguous(wg[i]) && !p->cfg.skip_grad_initialization;
    int k = MXFP8I_WS_MOE_BUF0;
    if (!wk) w->dx = (float *)slot(&k, T * H, sizeof(float), &ok);
    w->dw1 = (float *)slot(&k, H * I2, sizeof(float), &ok);
    w->dw2 = (float *)slot(&k, I * H, sizeof(float), &ok);
    if (!wk) {
        w->da = (double *)slot(&k, T * E, sizeof(double), &ok);
        w->db1 = (double *)slot(&k, E * I2, sizeof(double), &ok);
        w->db2 = (double *)slot(&k, E * H, sizeof(double), &ok);
        w->dxb = (float *)slot(&k, Bw * H, sizeof(float), &ok);
        w->dablk = (double *)slot(&k, Bw, sizeof(double), &ok);
    }
    float **rows[] = {&w->xb, &w->dyb, &w->D, &w->down}, **cols[] = {&w->g, &w->u, &w->act, &w->inter, &w->dI,
                                                                     &w->S, &w->sg};
    const int64_t nrows[] = {Rx, RI, RH, Bw}, ncols[] = {Bw, Bw, Bw, RH, Bw, RI, Bw};
    for (int i = 0; i < 4; i++) *rows[i] = (float *)slot(&k, nrows[i] * H, sizeof(float), &ok);
    for (int i = 0; i < 7; i++) *cols[i] = (float *)slot(&k, ncols[i] * I, sizeof(float), &ok);
    w->gu = (float *)slot(&k, Bw * I2, sizeof(float), &ok);
    w->dgu = (float *)slot(&k, Rx * I2, sizeof(float), &ok);
    w->b1 = (float *)slot(&k, I2, sizeof(float), &ok);
    w->b2 = (float *)slot(&k, H, sizeof(float), &ok);
    w->xb0 = w->xb, w->dgu0 = w->dgu, w->S0 = w->S, w->dyb0 = w->dyb, w->inter0 = w->inter, w->D0 = w->D;
    /* the weight uses: Phases 1, 2; the recomputations when their checkpoints are absent */
    const int re_gu = !w->args->gate_up_proj_act_checkpoint_T.data;
    const int re_down = w->onH && !w->args->down_proj_output_checkpoint.data;
    unsigned uses = 1u << MXFP8I_W2_H | 1u << MXFP8I_W1_2I;
    if (re_gu) uses |= 1u << MXFP8I_W1_H;
    if (re_down) uses |= 1u << MXFP8I_W2_I;
    ok = ok && !mxfp8i_moe_wcopy_alloc(p, uses, &w->wc);
    /* the run GEMMs (at most Rw positions): the Phase 1 and 2 weights in keyed slots 0 and 1, the recomputations'
       in 2 and 3; Phases 3 and 4 per block (at most Bw positions) unless segmented (a worker's on its thread) */
    const int one = mxfp8i_moe_gemm_one_thread(wk);
    ok = ok && !(w->seg && reserve_segmented_wgrad(w, p, Se, &k));
    ok = ok && !(mxfp8i_moe_gemm_reserve(p, Bw, I, H, 0) || mxfp8i_moe_gemm_reserve(p, Bw, H, I2, 1) ||
                 (!w->seg && (mxfp8i_moe_gemm_reserve(p, H, I2, mxfp8i_moe_size_Bw(p), -1) ||
                              mxfp8i_moe_gemm_reserve(p, I, H, mxfp8i_moe_size_Bw(p), -1))) ||
                 (re_gu && mxfp8i_moe_gemm_reserve(p, Bw, I2, H, 2)) ||
                 (re_down && mxfp8i_moe_gemm_reserve(p, Bw, H, I, 3)));
    mxfp8i_moe_gemm_one_thread(one);
    ok = ok && (wk || !mxfp8i_moe_stats_reserve(p, j->stats));
    MXFP8I_RETURN_ERROR_IF(!ok, MXFP8_ERR_OUT_OF_MEMORY, "%s: cannot allocate workspaces", p->fn);
    return MXFP8_OK;
}

/* The accumulators zeroed (after the reservation, on the call's own arena); dX's not on the expert-parallel path,
 * whose combine writes it whole. */
static void zero_accumulators(mxfp8i_moe_bwd *w, int par) {
    const mxfp8i_moe *p = w->p;
    const int64_t T = p->T, H = p->H, I = p->I, E = p->E, I2 = 2 * I;
    if (!par) mxfp8i_moe_zero_f(w->dx, T * H);
    for (int64_t i = 0; i < T * E; i++) w->da[i] = 0.0;
    for (int64_t i = 0; i < E * I2; i++) w->db1[i] = 0.0;
    for (int64_t i = 0; i < E * H; i++) w->db2[i] = 0.0;
}

/* The segmented path: point the Phase 3 / 4 operand buffers at row r of their expert-sized buffers. */
static void seg_point(mxfp8i_moe_bwd *w, int64_t r) {
    const mxfp8i_moe *p = w->p;
    const int64_t H = p->H, I = p->I;
    const size_t xes = mxfp8_dtype_size(mxfp8i_moe_xb_dtype(&p->X));
    w->xb = (float *)(void *)((char *)w->xb0 + (size_t)(r * H) * xes);
    w->dgu = w->dgu0 + r * 2 * I;
    if (w->onH) w->inter = w->inter0 + r * I, w->D = w->D0 + r * H;
    else w->S = w->S0 + r * I, w->dyb = w->dyb0 + r * H;
}
/* ... at the next rows, for the run of `blocks` blocks from n (its blocks' lengths B, ..., B, the last one's `last`),
 * and record each block. */
static void seg_next_run(mxfp8i_moe_bwd *w, int64_t n, int64_t blocks, int64_t last) {
    const mxfp8i_moe *p = w->p;
    seg_point(w, w->rows);
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t L = b + 1 < blocks ? p->B : last;
        w->sn[w->nseg] = n + b, w->sL[w->nseg] = L, w->so[w->nseg] = w->rows;
        w->nseg++;
        w->rows += L;
    }
}

/* Round once into the outputs: dX, the affinity and bias gradients (no allocation happens from here on). */
static void store_outputs(const mxfp8i_moe_bwd *w, const mxfp8_moe_bwd_grads *grads) {
    const mxfp8i_moe *p = w->p;
    const mxfp8_moe_config *c = &p->cfg;
    const int64_t T = p->T, E = p->E;
    if (!w->dx_stored)
        mxfp8i_moe_store_flat_f(&grads->hidden_states_grad, w->dx, c->accumulate_hidden_states_grad);
    const mxfp8_tensor *t = &grads->expert_affinities_masked_grad;
    for (int64_t i = 0; i < T * E; i++) mxfp8i_moe_st(t, mxfp8i_moe_vec_off(t, i), (double)(float)w->da[i]);
    /* (the weight gradients are in: run_experts stores each expert when it is done) */
    if (c->bias) {
        mxfp8i_moe_store_flat_d(&grads->gate_and_up_proj_bias_grad, w->db1, c->skip_grad_initialization);
        mxfp8i_moe_store_flat_d(&grads->down_proj_bias_grad, w->db2, c->skip_grad_initialization);
    }
}

/* Expert-major: expert e's blocks in ascending block order, its weight gradients accumulated in one expert-sized FP32
 * pair and then rounded straight into the outputs (every buffer was reserved before the first GEMM: nothing can
 * fail once an output is written). */
static mxfp8_status run_experts(mxfp8i_moe_bwd *w, const mxfp8_moe_bwd_grads *grads) {
    w->wgrad[0] = &grads->gate_up_proj_weight_grad, w->wgrad[1] = &grads->down_proj_weight_grad;
    const mxfp8i_moe *p = w->p;
    const int64_t H = p->H, I = p->I, I2 = 2 * I, per[2] = {H * I2, I * H};
    float *acc[2] = {w->dw1, w->dw2};
    memset(w->dw1, 0, sizeof(float) * (size_t)(H * I2)); /* per block: later experts find them zeroed by the store */
    memset(w->dw2, 0, sizeof(float) * (size_t)(I * H));
    for (int64_t e = 0; e < p->E; e++) {
        w->nseg = 0, w->rows = 0;
        for (int64_t n = 0, blocks; n < p->N; n += blocks) {
            int64_t last = p->expert[n] == e ? mxfp8i_moe_block_len(p, n) : 0; /* the run's last block's length */
            blocks = 1;
            if (last <= 0) continue;
            for (; n + blocks < p->N; blocks++) { /* the run of blocks (mxfp8i_moe_run_joins) */
                const int64_t Ln = mxfp8i_moe_block_len(p, n + blocks);
                if (!mxfp8i_moe_run_joins(p, blocks, e, last, p->expert[n + blocks], Ln)) break;
                last = Ln;
            }
            if (w->seg) seg_next_run(w, n, blocks, last);
            MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_bwd_run(w, n, blocks, e, (blocks - 1) * p->B + last));
        }
        if (w->seg) MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_wgrad_segments(w, e, 3));
        const int skip = p->cfg.skip_grad_initialization;
        /* the per-block path accumulates into zeroed pairs (cleared here but after the last expert); the segmented
           one overwrites them */
        const int clear = !w->seg && e + 1 < p->E;
        for (int i = 0; i < 2; i++) /* direct: already written into the output by the segmented GEMM */
            if (!w->direct[i]) mxfp8i_moe_store_expert(w->wgrad[i], e, per[i], acc[i], skip, clear);
    }
    return MXFP8_OK;
}

/* Expert e's weight gradient (which: 1 dW1 by Phase 3, 2 dW2 by Phase 4) and its bias gradient, on the calling
 * thread in worker state tw, from its wave wi's operand buffers; rounded into expert e of the output. */
static mxfp8_status par_wgrad(mxfp8i_moe_bwd *tw, const mxfp8i_moe_bwd *w, int64_t wi, int64_t e, int which) {
    const mxfp8i_moe *p = w->p;
    set_carve(w, wi, w->erow[e], tw);
    tw->sn = w->sn + w->estart[e], tw->sL = w->sL + w->estart[e], tw->so = w->so + w->estart[e];
    tw->nseg = (int)(w->estart[e + 1] - w->estart[e]);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_wgrad_segments(tw, e, which));
    if (p->cfg.bias) mxfp8i_moe_bias_segments(tw, e, which);
    const int i = which - 1;
    if (!tw->direct[i]) /* (direct: already written into the output by the segmented GEMM) */
        mxfp8i_moe_store_expert(tw->wgrad[i], e, i ? p->I * p->H : p->H * 2 * p->I, i ? tw->dw2 : tw->dw1,
                                p->cfg.skip_grad_initialization, 0);
    return MXFP8_OK;
}

/* The expert-parallel path's tables: the blocks with rows in expert-major order, ascending within an expert (bord,
 * and estart: a counting sort by expert), each with its length and first row in its expert's part (sn, sL, so); the
 * waves (wstart: consecutive experts; erow: each expert's first row in its wave's buffers) and the schedule's state
 * (par_take). */
static void par_plan(mxfp8i_moe_bwd *w) {
    const mxfp8i_moe *p = w->p;
    const int64_t N = p->N, E = p->E;
    int64_t *es = w->estart;
    int32_t *bcur = w->bord + N; /* (the counting sort's cursors) */
    for (int64_t e = 0; e <= E; e++) es[e] = 0;
    for (int64_t n = 0; n < N; n++)
        if (mxfp8i_moe_block_len(p, n) > 0) es[p->expert[n] + 1]++;
    for (int64_t e = 0; e < E; e++) es[e + 1] += es[e];
    for (int64_t e = 0; e < E; e++) bcur[e] = (int32_t)es[e];
    for (int64_t n = 0; n < N; n++)
        if (mxfp8i_moe_block_len(p, n) > 0) w->bord[bcur[p->expert[n]]++] = (int32_t)n;
    for (int64_t e = 0; e < E; e++)
        for (int64_t k = es[e], r = 0; k < es[e + 1]; k++) {
            w->sn[k] = w->bord[k], w->sL[k] = mxfp8i_moe_block_len(p, w->sn[k]), w->so[k] = r;
            r += w->sL[k];
        }
    int64_t *ws = w->wstart;
    w->nw = 0, ws[0] = 0;
    /* (a wave fills about (P + 1) / 2 of the largest experts, or 4 blocks per thread of smaller ones, well below the
       buffers' room where the routing is even: two waves in flight stay in the last-level cache) */
    const int64_t nt = mxfp8i_num_threads(), big = p->Re > 4 * p->B ? p->Re : 4 * p->B;
    const int64_t fill = (nt + 1) / 2 * big < w->wrows ? (nt + 1) / 2 * big : w->wrows;
    for (int64_t e = 0, cur = 0; e < E; e++) {
        const int64_t rows = es[e + 1] > es[e] ? w->so[es[e + 1] - 1] + w->sL[es[e + 1] - 1] : 0;
        if (cur > 0 && cur + rows > fill) ws[++w->nw] = e, cur = 0;
        w->erow[e] = cur;
        cur += rows;
    }
    ws[++w->nw] = E;
    for (int64_t v = 0; v < w->nw; v++) {
        w->wdone[v] = 0;
        for (int64_t x = ws[v]; x < ws[v + 1]; x++)
            w->bdone[x] = w->wtaken[x] = 0, w->elo[x] = es[x], w->ehi[x] = es[x + 1], w->owner[x] = -1,
            w->ewave[x] = v;
    }
    w->taken = w->nbdone = w->cnext = 0;
    for (int t = 0; t < mxfp8i_num_threads(); t++) w->onw[t] = 0;
}

/* par_take's task kinds besides a block: 1 and 2 (dW1, dW2: the bits of wtaken), and a run of the combine's tokens. */
#define PAR_COMBINE 3

/* For thread t, a weight gradient whose expert's blocks are all done, of an expert of a wave before vend (every dW1
 * in expert order, then every dW2: the longer first), marked taken and t marked as on it (onw): sets *e and *which
 * (1: dW1, 2: dW2); 0 when none. */
static int take_wgrad(mxfp8i_moe_bwd *w, int t, int64_t vend, int64_t *e, int *which) {
    const int64_t E = w->p->E, *es = w->estart;
    for (int b = 1; b <= 2; b++)
        for (int64_t x = 0; x < E; x++)
            if (w->ewave[x] < vend && !(w->wtaken[x] & b) && w->bdone[x] == es[x + 1] - es[x] &&
                w->elo[x] >= w->ehi[x]) {
                w->wtaken[x] |= b, *which = b, *e = x, w->taken++, w->onw[t] = 1;
                return 1;
            }
    return 0;
}

/* For thread t, a block by par_take's step 2 (the next of its own expert), 3 (the first of an expert nobody is on)
 * or 5 (the last of another thread's expert: with two or more left, or one while that thread runs a weight
 * gradient), of an expert whose wave's buffers are free: sets *k and *e; 0 when none. */
static int take_block(mxfp8i_moe_bwd *w, int t, int step, int64_t *k, int64_t *e) {
    const int64_t E = w->p->E, *ws = w->wstart, *ewave = w->ewave, *wdone = w->wdone;
    int64_t *elo = w->elo, *ehi = w->ehi, *owner = w->owner;
    for (int64_t x = 0; x < E; x++) {
        const int64_t v = ewave[x];
        if (elo[x] >= ehi[x] || (v >= 2 && wdone[v - 2] < 2 * (ws[v - 1] - ws[v - 2]))) continue;
        if (step == 2 && owner[x] == t) *k = elo[x]++;
        else if (step == 3 && owner[x] < 0) owner[x] = t, *k = elo[x]++;
        else if (step == 5 && (ehi[x] - elo[x] >= 2 || (owner[x] >= 0 && w->onw[owner[x]]))) *k = --ehi[x];
        else continue;
        *e = x;
        return 1;
    }
    return 0;
}

/* Thread t's next task (call holding the schedule's lock), after recording the one it has done (*which 0 and *k >= 0:
 * block *k of expert *e; *which 1 or 2: expert *e's weight gradient). Sets *k (a block of expert *e) or *which (1: dW1,
 * 2: dW2 of expert *e; PAR_COMBINE: the dX combine's tokens [*k ctok, *k ctok + ctok)), or neither when nothing is
 * ready yet. Returns 1 when every task has been taken. In order: 1. a weight gradient ready in a wave before the last
 * two (take_wgrad: its wave's buffers are wanted two waves on); 2. the next block of this thread's expert; 3. the first
 * block of an expert nobody is on -- of experts whose wave's buffers are free (the wave two before it has all its
 * weight gradients done); 4. a weight gradient of the last two waves; 5. the last block of another thread's expert that
 * has two or more left (with one left its thread takes it next, and the stealer would first quantize and pack that
 * expert's weights for itself), or one while that thread runs a weight gradient (onw); 6. once every block is done, the
 * combine's tokens. Keeping the last waves' weight gradients until the blocks run out lets the threads share them
 * longest first, instead of one thread running the last expert's dW1 while the other, with its dW2 done, waits; taken
 * before a steal they also spare most steals (3 per call at width 256 before, each packing the two weights again); the
 * combine's short tasks then fill the ends. 2 threads, width 256 (8 experts, one per wave): the idle end of the
 * parallel region 0.66 -> 0.23 ms with the ordering, 0.01 ms with the combine's tasks; taking the weight gradients
 * before steals and stealing only from two blocks 0.978-0.991 of the time (mxfp8.torch's configuration), 0.985-0.997
 * (the BF16 one), 0.975-0.978 on the fine-grained problem (one run of three at 1.034). */
static int par_take(mxfp8i_moe_bwd *w, int t, int64_t *k, int64_t *e, int *which) {
    if (*which == 0 && *k >= 0) w->bdone[*e]++, w->nbdone++;
    if (*which == 1 || *which == 2) w->wdone[w->ewave[*e]]++, w->onw[t] = 0;
    *k = -1, *which = 0;
    if (take_wgrad(w, t, w->nw - 2, e, which) || take_block(w, t, 2, k, e) || take_block(w, t, 3, k, e) ||
        take_wgrad(w, t, w->nw, e, which) || take_block(w, t, 5, k, e))
        return 0;
    const int64_t E = w->p->E;
    if (w->nbdone == w->estart[E] && w->cnext < w->ncomb) {
        *which = PAR_COMBINE, *k = w->cnext++;
        return 0;
    }
    /* (every block is taken before its expert's weight gradients, and done before the combine) */
    return w->taken == 2 * E && w->cnext == w->ncomb;
}

/* The expert-parallel path (speed only, the same bits; bwd_par): where runs of blocks do not pay (small widths) a
 * block's work is too short to split well between threads -- three elementwise parallel regions and two to four GEMMs
 * per block, each ending at a barrier, which a slowed thread holds up for all. Instead the threads take whole tasks
 * from one schedule, with no barrier until the end: a block of an expert (every phase as the serial walk runs it, on
 * the calling thread; its Phase 3 / 4 operands written to its rows of its expert's part of its wave's buffers), or the
 * weight gradient dW1 or dW2 of an expert whose blocks are all done (a segmented GEMM over its blocks in block order,
 * with that expert's bias sums, as run_experts does). The experts go in waves of consecutive experts (par_plan); two
 * waves' buffers (wave_rows each, whatever the routing), so a wave's blocks can start once the wave two before it has
 * all its weight gradients done. A thread stays on one expert while it has blocks (its weights packed once), then takes
 * the next expert nobody is on, and only then the last blocks of another thread's expert; weight gradients come first
 * whenever one is ready, except those of the last two waves, which wait for the blocks of the thread's own and new
 * experts to run out (par_take). What the serial walk adds across experts is added in its order once every block is
 * done: each token's dX rows (V) in expert-major block order (tasks of ctok tokens of the same schedule), then after
 * the region its affinity-gradient terms per (token, expert) in block order. Stochastic-rounding indices depend on the
 * block and position only: the same bits. Measured (AMD Zen 4, 2 threads, H = 256, I = 512, B = 128, E = 8, top-2, 2048
 * tokens, in one process against the serial walk): quiet 0.95-0.99 of its time in both configurations of the benchmark;
 * with one of the two vCPUs slowed by the host 0.65-0.76 (the serial walk went from 23 to 33 ms, this path stayed at
 * 23.5-25.5). With 64 experts of 2-3 blocks (H = 1024, I = 256, top-8) 0.98-1.00 quiet, 0.77-0.80 disturbed. Tried
 * first: threads on whole experts (an expert's work left one thread idle at the end: 1.00-1.05 quiet) and waves
 * separated by barriers (1.01-1.03). */
static mxfp8_status backward_par(mxfp8i_moe_bwd *w, const mxfp8_moe_bwd_grads *grads) {
    const mxfp8i_moe *p = w->p;
    const int64_t N = p->N, B = p->B, E = p->E;
    par_plan(w);
    const int64_t *ewave = w->ewave;
    const int nt = mxfp8i_num_threads();
    int failed = 0;
    /* the dX combine: each token's rows in expert-major block order (par_plan's list of the blocks with rows),
       rounded straight into a BF16 output; tasks of ctok tokens (about 16 per thread, at least 16 tokens) */
    w->cdirect = mxfp8i_moe_combine_plan(p, w->bord, w->estart[E], w->first, w->list, &grads->hidden_states_grad,
                                         p->cfg.accumulate_hidden_states_grad);
    w->ctok = mxfp8i_moe_max64(16, (p->T + 16 * nt - 1) / (16 * nt));
    w->ncomb = (p->T + w->ctok - 1) / w->ctok;
    omp_lock_t sched; /* the schedule's lock: this call's own (calls from several threads do not wait on each other) */
    omp_init_lock(&sched);
#pragma omp parallel num_threads(nt)
    {
        mxfp8i_moe_worker wk;
        mxfp8i_moe_worker_begin(&wk, w->arenas, w->par_bytes);
        const int t = wk.t;
        mxfp8i_moe_bwd tw;
        bwd_state(&tw, p, w->args);
        tw.seg = 1;
        const bwd_job tj = {p, grads, NULL, &tw, 1, 1};
        /* this worker's buffers, carved from its share of the arena (sized by the same reservation) */
        int ok = !mxfp8i_ws_plan(p->fn, moe_bwd_reserve_job, &tj, NULL) && !moe_bwd_reserve_job(&tj);
        tw.par = 1, tw.V = w->V, tw.dab = w->dab, tw.db1 = w->db1, tw.db2 = w->db2;
        /* the weight-gradient outputs (segmented: each expert's GEMM overwrites the worker's FP32 pair) */
        tw.wgrad[0] = &grads->gate_up_proj_weight_grad, tw.wgrad[1] = &grads->down_proj_weight_grad;
        int64_t k = -1, e = 0;
        int which = 0, done = 0;
        while (!done) {
            omp_set_lock(&sched);
            done = par_take(w, t, &k, &e, &which);
            omp_unset_lock(&sched);
            if (which == PAR_COMBINE) {
                const int64_t t0 = k * w->ctok, t1 = t0 + w->ctok < p->T ? t0 + w->ctok : p->T;
                if (ok)
                    mxfp8i_moe_combine_tokens(p, w->V, NULL, NULL, w->dx, w->first, w->list,
                                              &grads->hidden_states_grad, w->cdirect, t0, t1);
            } else if (which) {
                if (ok) ok = par_wgrad(&tw, w, ewave[e], e, which) == MXFP8_OK;
            } else if (k >= 0) {
                if (ok) {
                    set_carve(w, ewave[e], w->erow[e], &tw);
                    seg_point(&tw, w->so[k]);
                    ok = mxfp8i_moe_bwd_run(&tw, w->sn[k], 1, e, w->sL[k]) == MXFP8_OK;
                }
            } else if (!done) {
                for (volatile int spin = 0; spin < 256; spin++) {
                } /* (nothing ready: another thread's task comes first) */
            }
        }
        mxfp8i_moe_worker_end(&wk, ok, &failed);
    }
    omp_destroy_lock(&sched);
    MXFP8I_RETURN_ERROR_IF(failed, MXFP8_ERR_INTERNAL, "%s: a block failed after its reservation", p->fn);
    w->dx_stored = w->cdirect;
    for (int64_t q = 0; q < N * B; q++) /* per (token, expert): its positions in block order */
        if (p->tok[q] >= 0) w->da[p->tok[q] * E + p->expert[q / B]] += w->dab[q];
    return MXFP8_OK;
}

/* Whether the call takes the expert-parallel path (backward_par): mxfp8i_moe_par_pays, and segment counts an int
 * holds. */
static int bwd_par(const mxfp8i_moe *p, const mxfp8_quant_stats *stats) {
    return p->Se <= 0x7fffffff && mxfp8i_moe_par_pays(p, stats);
}

/* Every check of mxfp8_moe_backward (shared by the call and mxfp8_moe_backward_validate): nothing stored, no
 * workspace used. */
static mxfp8_status backward_check(const char *fn, const mxfp8_moe_bwd_args *args, const mxfp8_moe_bwd_grads *grads,
                                   mxfp8i_moe_in *in, mxfp8i_moe *p) {
    MXFP8I_RETURN_ERROR_IF(!args, MXFP8_ERR_NULL_POINTER, "%s: args is NULL", fn);
    MXFP8I_RETURN_ERROR_IF(!grads, MXFP8_ERR_NULL_POINTER, "%s: grads is NULL", fn);
    mxfp8i_moe_in_bwd(args, in);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_check(fn, in, 1, p));
    return mxfp8i_moe_check_bwd_grads(p, in, args, grads, 0);
}

/* The call state before its reservation: the problem, the checkpoints, the affinity option. */
static void bwd_state(mxfp8i_moe_bwd *w, const mxfp8i_moe *p, const mxfp8_moe_bwd_args *args) {
    memset(w, 0, sizeof *w);
    w->p = p;
    w->args = args;
    w->onH = p->cfg.affinity_option == MXFP8_AFFINITY_ON_H;
    w->dy16 = !w->onH && !p->cfg.bias && mxfp8i_moe_xb_dtype(&p->dY) == MXFP8_DTYPE_BF16;
    w->seg = use_segmented(p); /* the validate entry sizes the same path as the call */
}

/* The call inside its workspace scope, after its checks. */
static mxfp8_status backward_scoped(const mxfp8_moe_bwd_args *args, mxfp8_moe_bwd_grads *grads,
                                    const mxfp8i_moe_in *in, mxfp8i_moe *p) {
    const char *fn = p->fn;
    mxfp8i_moe_bwd w;
    bwd_state(&w, p, args);
    const bwd_job job = {p, grads, args->stats, &w, bwd_par(p, args->stats), 0};
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_ws_plan(fn, moe_bwd_reserve_job, &job, NULL));
    MXFP8I_FORWARD_IF_ERROR(moe_bwd_reserve_job(&job)); /* the buffers themselves: the arena has grown to them */
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_table(in, p));
    MXFP8I_RETURN_ERROR_IF(mxfp8i_moe_stats_alloc(p, args->stats), MXFP8_ERR_OUT_OF_MEMORY,
                           "%s: cannot allocate workspaces", fn);
    zero_accumulators(&w, job.par);
    if (job.par) MXFP8I_FORWARD_IF_ERROR(backward_par(&w, grads));
    else MXFP8I_RETURN_ERROR_IF(run_experts(&w, grads), MXFP8_ERR_INTERNAL,
                                "%s: a block GEMM failed after its reservation", fn);
    store_outputs(&w, grads);
    mxfp8i_moe_stats_export(p, args->stats);
    return MXFP8_OK;
}

mxfp8_status mxfp8_moe_backward(const mxfp8_moe_bwd_args *args, mxfp8_moe_bwd_grads *grads) {
    static const char *fn = "mxfp8_moe_backward";
    mxfp8i_clear_error();
    mxfp8i_moe_in in;
    mxfp8i_moe p;
    MXFP8I_FORWARD_IF_ERROR(backward_check(fn, args, grads, &in, &p));
    /* Every buffer, the block GEMMs' included, is a slot of this scope's arena: the caller's workspace, kept for
       the next call, or a private one freed here. */
    mxfp8i_scope scope;
    MXFP8I_RETURN_ERROR_IF(mxfp8i_scope_begin(&scope, args->workspace), MXFP8_ERR_OUT_OF_MEMORY,
                           "%s: cannot allocate a workspace", fn);
    const unsigned csr = mxfp8i_fenv_enter(); /* IEEE defaults here; each parallel region enters them on its threads */
    mxfp8_status st = backward_scoped(args, grads, &in, &p);
    mxfp8i_fenv_leave(csr);
    mxfp8i_scope_end(&scope);
    return st;
}

mxfp8_status mxfp8_moe_backward_validate(const mxfp8_moe_bwd_args *args, const mxfp8_moe_bwd_grads *grads,
                                         size_t *workspace_bytes) {
    static const char *fn = "mxfp8_moe_backward";
    mxfp8i_clear_error();
    mxfp8i_moe_in in;
    mxfp8i_moe p;
    mxfp8i_moe_bwd w;
    size_t bytes = 0;
    mxfp8_status st = backward_check(fn, args, grads, &in, &p);
    if (!st) {
        bwd_state(&w, &p, args);
        const bwd_job job = {&p, grads, args->stats, &w, bwd_par(&p, args->stats), 0};
        st = mxfp8i_ws_plan(fn, moe_bwd_reserve_job, &job, &bytes);
    }
    if (workspace_bytes) *workspace_bytes = st ? 0 : bytes;
    return st;
}
