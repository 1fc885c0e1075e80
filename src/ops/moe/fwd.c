/*
 * moe_fwd.c -- forward of the blockwise MoE layer in MXFP8 (produces the backward's checkpoints).
 *
 * Contract (include/mxfp8.h, mxfp8_moe_forward): per block n of expert e, on the block's first L positions (L = last
 * real position + 1; padding rows inside are zero rows, trailing padding is skipped, which changes nothing):
 *   GU    = X_blk [L, H] @ W1[e] [H, 2I]   (GEMM, both operands quantized along H, FP32 accumulation)
 *   g, u  = clamp(GU + b1[e]) ; inter = act(g) * u           (FP32; zero at padding positions)
 *   down  = inter [L, I] @ W2[e] [I, H] + b2[e]              (GEMM, both quantized along I)
 *   out[t] += a[t*E+e] * down                                (FP32 accumulator, rounded once to output's dtype)
 * Checkpoints are written for every position (0 at padding). Blocks run in order (consecutive full blocks of one
 * expert stacked into runs where that pays: mxfp8i_moe_run_joins, the same bits); threads split GEMM tiles, rows of
 * the elementwise work and columns of the scatter, so the result is independent of the thread count. Consecutive
 * blocks of one expert reuse its packed weights (the GEMM workspace's keyed slots). Where runs do not pay (small
 * widths) the threads instead take whole groups of one expert's blocks, each in an arena of its own, and the
 * scatter's additions are made afterwards, per token in block order (forward_par, fwd_par): the same bits.
 */
#include <stdint.h>
#include <stdlib.h>
#include <omp.h>

#include "../../kernels/registry.h"
#include "moe.h"

/* Write the checkpoints of block n (positions [0, B)); values for real positions < L come from the block buffers
 * ([q][i] rows; aq: the affinity of each position), padding positions get 0. The [.., i, q] checkpoints (positions
 * innermost) are written in blocks of 16 rows i, q ascending: one cache line of each buffer read per position,
 * contiguous writes along q; blocks split between threads. */
static inline void st_ck(const mxfp8_tensor *t, int64_t off, float v) {
    if (t->dtype == MXFP8_DTYPE_F64) ((double *)t->data)[off] = v;
    else mxfp8i_store_f32(t->data, t->dtype, off, v);
}
/* rows [i0, i1) x positions [0, B) of one [.., i, q] checkpoint from src[q][i] (scale: times aq[q]) */
static void ck_block(const mxfp8_tensor *t, int64_t base, int64_t si, int64_t sq, int64_t i0, int64_t i1, int64_t B,
                     int64_t L, const int32_t *tok, const float *src, int64_t I, const float *aq) {
    if (t->dtype == MXFP8_DTYPE_F32 && sq == 1 && !aq) { /* the registry's transposing copy, streamed past the
                                                            caches (src rows of padding positions are zeros),
                                                            then 0 past L */
        float *d = (float *)t->data + base;
        mxfp8i_kernels_get()->quant->f32_t(src + i0, I, d + i0 * si, si, L, i1 - i0, 1);
        for (int64_t i = i0; i < i1 && L < B; i++) memset(d + i * si + L, 0, (size_t)(B - L) * sizeof(float));
        return;
    }
    if (t->dtype == MXFP8_DTYPE_F32 && si == 1 && !aq) { /* positions-major memory ([.., q, i]: mxfp8.torch's FP32
                                                            gate/up checkpoint): the rows copied as they are,
                                                            streamed, then 0 past L */
        float *d = (float *)t->data + base;
        mxfp8i_kernels_get()->quant->copy_f32(src + i0, I, d + i0, sq, L, i1 - i0);
        for (int64_t q = L; q < B; q++) memset(d + q * sq + i0, 0, (size_t)(i1 - i0) * sizeof(float));
        return;
    }
    for (int64_t q = 0; q < B; q++) {
        const int real = q < L && tok[q] >= 0;
        const float a = aq && real ? aq[q] : 1.0f;
        if (t->dtype == MXFP8_DTYPE_F32) {
            float *d = (float *)t->data + base + q * sq;
            for (int64_t i = i0; i < i1; i++) d[i * si] = real ? (aq ? a * src[q * I + i] : src[q * I + i]) : 0.0f;
        } else {
            for (int64_t i = i0; i < i1; i++)
                st_ck(t, base + i * si + q * sq, real ? (aq ? a * src[q * I + i] : src[q * I + i]) : 0.0f);
        }
    }
}
/* Rows [ilo, ihi) of one checkpoint: in blocks of 16 rows (positions contiguous: each block's source columns stay
 * in L1), or at once when the checkpoint's memory is positions-major (i stride 1: each position's run of the rows
 * is contiguous there, mxfp8.torch's FP32 gate/up checkpoint). */
static void ck_rows(const mxfp8_tensor *t, int64_t base, int64_t si, int64_t sq, int64_t ilo, int64_t ihi, int64_t B,
                    int64_t L, const int32_t *tok, const float *src, int64_t I, const float *aq) {
    if (si == 1) {
        ck_block(t, base, si, sq, ilo, ihi, B, L, tok, src, I, aq);
        return;
    }
    for (int64_t i0 = ilo; i0 < ihi; i0 += 16)
        ck_block(t, base, si, sq, i0, i0 + 16 < ihi ? i0 + 16 : ihi, B, L, tok, src, I, aq);
}
/* Whether the gate/up checkpoint is F32 in positions-major memory ([.., q, i], mxfp8.torch's): then each thread
 * copies its positions' g and u rows in fwd_run's elementwise region, right after computing them (gu_pm_rows),
 * instead of in the scatter's region (write_checkpoints), where the rows had left the cache for GEMM 2's operands
 * and both threads' copies met the scatter's traffic: 0.95 of the forward's time at width 256 on 2 threads, 0.98
 * on 1 (AMD Zen 4). */
static int gu_pm(const mxfp8_tensor *ck) { return ck->data && ck->dtype == MXFP8_DTYPE_F32 && ck->strides[2] == 1; }
/* Positions [q0, q1) of the run at block n (L stacked positions, `blocks` blocks) into a positions-major F32
 * gate/up checkpoint, from the g, u rows (padding rows zero); the thread with q1 == L also zeros the last block's
 * positions past its length. Streamed past the caches (the registry's copy_f32). */
static void gu_pm_rows(const mxfp8i_moe *p, const mxfp8_tensor *ck, int64_t n, int64_t blocks, int64_t L,
                       const float *g, const float *u, int64_t q0, int64_t q1) {
    const int64_t B = p->B, I = p->I, sq = ck->strides[3];
    const mxfp8i_copy_f32_fn copy = mxfp8i_kernels_get()->quant->copy_f32;
    for (int64_t q = q0; q < q1;) {
        const int64_t b = q / B, qe = q1 < (b + 1) * B ? q1 : (b + 1) * B;
        float *d = (float *)ck->data + (n + b) * ck->strides[0] + (q - b * B) * sq;
        copy(g + q * I, I, d, sq, qe - q, I);
        copy(u + q * I, I, d + ck->strides[1], sq, qe - q, I);
        q = qe;
    }
    if (q1 == L && q0 < q1)
        for (int64_t q = L - (blocks - 1) * B; q < B; q++) {
            float *d = (float *)ck->data + (n + blocks - 1) * ck->strides[0] + q * sq;
            memset(d, 0, (size_t)I * sizeof(float));
            memset(d + ck->strides[1], 0, (size_t)I * sizeof(float));
        }
}

/* Thread t of nt's share of the checkpoints of block n: its rows i (whole 16-row blocks) of the [.., i, q]
 * checkpoints (the gate/up one only when gu), and the down projection's column range [H t / nt, H (t + 1) / nt)
 * (the one its thread of the scatter finished). */
static void write_checkpoints(const mxfp8i_moe *p, int64_t n, int64_t L, const mxfp8_moe_fwd_outputs *o, int gu,
                              const float *g, const float *u, const float *act, const float *inter,
                              const float *down, const float *aq, int t, int nt) {
    const int64_t B = p->B, I = p->I, H = p->H, nib = (I + 15) / 16;
    const int32_t *tok = p->tok + n * B;
    const mxfp8_tensor *ck = &o->gate_up_proj_act_checkpoint_T;
    const mxfp8_tensor *cks[3] = {&o->gate_act_checkpoint_T, &o->intermediate_checkpoint_T,
                                  &o->scaled_intermediate_checkpoint_T};
    const float *srcs[3] = {act, inter, inter};
    const int64_t ilo = nib * t / nt * 16, ihi = nib * (t + 1) / nt * 16 < I ? nib * (t + 1) / nt * 16 : I;
    if (ck->data && gu) {
        const int64_t base = n * ck->strides[0];
        ck_rows(ck, base, ck->strides[2], ck->strides[3], ilo, ihi, B, L, tok, g, I, NULL);
        ck_rows(ck, base + ck->strides[1], ck->strides[2], ck->strides[3], ilo, ihi, B, L, tok, u, I, NULL);
    }
    for (int c = 0; c < 3; c++)
        if (cks[c]->data)
            ck_rows(cks[c], n * cks[c]->strides[0], cks[c]->strides[1], cks[c]->strides[2], ilo, ihi, B, L, tok,
                    srcs[c], I, c == 2 ? aq : NULL);
    const mxfp8_tensor *d = &o->down_proj_output_checkpoint; /* the scatter's column range: its final values */
    const int64_t h0 = H * t / nt, h1 = H * (t + 1) / nt;
    if (d->data)
        for (int64_t q = 0; q < B; q++) {
            const int real = q < L && tok[q] >= 0;
            for (int64_t h = h0; h < h1; h++)
                st_ck(d, n * d->strides[0] + q * d->strides[1] + h * d->strides[2], real ? down[q * H + h] : 0.0f);
        }
}
/* Any checkpoint asked for. */
static int any_checkpoint(const mxfp8_moe_fwd_outputs *o) {
    return o->gate_up_proj_act_checkpoint_T.data || o->gate_act_checkpoint_T.data ||
           o->intermediate_checkpoint_T.data || o->scaled_intermediate_checkpoint_T.data ||
           o->down_proj_output_checkpoint.data;
}

typedef struct fwd_ws {
    mxfp8i_moe_wcopy wc;
    float *acc;                                        /* the output accumulator [T*H] */
    float *xb, *gu, *g, *u, *act, *inter, *down, *b1, *b2, *aq; /* a run's buffers, rows [0, Rw) */
    float *rows; /* per thread: one position's g, u, act(g) when no checkpoint needs the block's ([nt][3][I]) */
    /* the expert-parallel path (fwd_par): each position's down projection row [N*B, H], its affinity [N*B] and
       every expert's b2 [E, H] (the combine weights them); the combine's scratch (mxfp8i_moe_combine_rows:
       [2 (T + 1)] and [N*B]); the starts of the groups of consecutive blocks of one expert [N + 1]; the workers'
       arenas, par_bytes each */
    float *V, *aqs, *b2s;
    int32_t *first, *list, *grp, *gsched; /* gsched: the schedule's per-group state [3 (N + 1)] (take_block) */
    char *par;
    size_t par_bytes;
} fwd_ws;

/* The call's state for its reservation function: the problem, its statistics request, the buffers to fill. */
typedef struct fwd_job {
    const mxfp8i_moe *p;
    const mxfp8_quant_stats *stats;
    fwd_ws *w;
    int par;    /* the call takes the expert-parallel path (fwd_par) */
    int worker; /* the reservation of one worker of that path, in its own arena: one block's buffers, 1-thread GEMMs */
} fwd_job;

static mxfp8_status moe_fwd_reserve_job(const void *ctx);

/* The expert-parallel path's buffers in the call's arena: the combine's (the accumulator, the per-position rows, the
 * token lists), the groups, the positions' affinities, the experts' b2, and every worker's arena (sized by the
 * worker's own reservation). */
static mxfp8_status moe_fwd_reserve_par(const fwd_job *j) {
    const mxfp8i_moe *p = j->p;
    fwd_ws *w = j->w;
    fwd_ws tw;
    const fwd_job tj = {p, NULL, &tw, 1, 1};
    size_t inner = 0;
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_ws_plan(p->fn, moe_fwd_reserve_job, &tj, &inner));
    const int nt = mxfp8i_num_threads();
    w->par_bytes = mxfp8i_ws_sub_bytes(inner);
    int k = MXFP8I_WS_MOE_BUF0;
    int ok = mxfp8i_moe_combine_reserve(p, &k, &w->acc, &w->V, &w->first, &w->list);
    ok = ok && (w->grp = (int32_t *)mxfp8i_ws_get(k++, (size_t)(p->N + 1) * sizeof(int32_t))) != NULL;
    ok = ok && (w->gsched = (int32_t *)mxfp8i_ws_get(k++, (size_t)(3 * (p->N + 1)) * sizeof(int32_t))) != NULL;
    ok = ok && (w->aqs = (float *)mxfp8i_ws_get(k++, (size_t)(p->N * p->B > 0 ? p->N * p->B : 1) * sizeof(float)));
    ok = ok && (w->b2s = (float *)mxfp8i_ws_get(k++, (size_t)(p->E * p->H) * sizeof(float))) != NULL;
    ok = ok && (size_t)nt <= SIZE_MAX / w->par_bytes &&
         (w->par = (char *)mxfp8i_ws_get(k++, (size_t)nt * w->par_bytes)) != NULL;
    MXFP8I_RETURN_ERROR_IF(!ok, MXFP8_ERR_OUT_OF_MEMORY, "%s: cannot allocate workspaces", p->fn);
    return MXFP8_OK;
}

/* Every buffer of the call, and both block GEMMs' (weights in keyed slots 0 and 1), the routing table's and the
 * statistics passes': the one reservation function (mxfp8i_ws_plan sizes it for mxfp8_moe_forward_validate and grows
 * the call's arena once; the call then runs it again for the pointers, which allocates nothing). It writes only *w
 * (on a sizing arena its pointers must not be touched). With j->par, the expert-parallel path's buffers instead
 * (moe_fwd_reserve_par); with j->worker, one worker's, in that worker's arena. */
static mxfp8_status moe_fwd_reserve_job(const void *ctx) {
    const fwd_job *j = (const fwd_job *)ctx;
    const mxfp8i_moe *p = j->p;
    fwd_ws *w = j->w;
    /* rows of the longest run of blocks (a worker runs one block at a time) */
    const int64_t H = p->H, I = p->I, I2 = 2 * I, Bw = j->worker ? p->B : mxfp8i_moe_size_Rw(p);
    memset(w, 0, sizeof *w);
    const size_t f = sizeof(float);
    int k = MXFP8I_WS_MOE_BUF0;
    if (!j->worker) MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_table_reserve(p));
    if (j->par && !j->worker) return moe_fwd_reserve_par(j);
    float **bufs[] = {&w->acc, &w->xb, &w->gu, &w->g, &w->u, &w->act, &w->inter, &w->down, &w->b1, &w->b2, &w->aq,
                      &w->rows};
    const int64_t len[] = {j->worker ? 0 : p->T * H, Bw * H, Bw * I2, Bw * I, Bw * I, Bw * I, Bw * I, Bw * H, I2, H,
                           Bw, (j->worker ? 1 : (int64_t)mxfp8i_num_threads()) * 3 * I};
    int ok = 1;
    for (int i = 0; i < 12 && ok; i++)
        ok = (*bufs[i] = (float *)mxfp8i_ws_get(k++, (size_t)(len[i] > 0 ? len[i] : 1) * f)) != NULL;
    ok = ok && !mxfp8i_moe_wcopy_alloc(p, 1u << MXFP8I_W1_H | 1u << MXFP8I_W2_I, &w->wc);
    const int one = mxfp8i_moe_gemm_one_thread(j->worker);
    ok = ok && !mxfp8i_moe_gemm_reserve(p, Bw, I2, H, 0);
    ok = ok && !mxfp8i_moe_gemm_reserve(p, Bw, H, I, 1);
    mxfp8i_moe_gemm_one_thread(one);
    ok = ok && (j->worker || !mxfp8i_moe_stats_reserve(p, j->stats));
    MXFP8I_RETURN_ERROR_IF(!ok, MXFP8_ERR_OUT_OF_MEMORY, "%s: cannot allocate workspaces", p->fn);
    return MXFP8_OK;
}

/* The run of `blocks` blocks n, n + 1, ... of expert e (mxfp8i_moe_run_joins), positions [0, L) of the stacked
 * blocks (L = (blocks - 1) B + the last block's length, > 0): both GEMMs, the elementwise work, the weighted
 * scatter into acc and the blocks' checkpoints (in the scatter's parallel region). Position q is position q % B of
 * block n + q / B, so the stochastic-rounding indices of block n's rows run on through the others'. V not NULL (a
 * worker of the expert-parallel path, no down projection checkpoint): everything on the calling thread, GEMM 2
 * writing block n's rows n B + q of V (the combine weights them: a * (down + b2), a from w->aq) instead of the
 * weighted scatter into acc. */
static mxfp8_status fwd_run(const mxfp8i_moe *p, fwd_ws *w, int64_t n, int64_t blocks, int64_t e, int64_t L,
                            const mxfp8_moe_fwd_outputs *o, float *V) {
    const int64_t H = p->H, I = p->I, I2 = 2 * I, B = p->B;
    const mxfp8_moe_config *c = &p->cfg;
    const int32_t *tok = p->tok + n * B;
    float *xb = w->xb, *gu = w->gu, *g = w->g, *u = w->u, *act = w->act, *inter = w->inter, *down = w->down;
    const float *b1 = w->b1, *b2 = w->b2;
    float *aq = w->aq;
    const int nt = V ? 1 : mxfp8i_moe_nt((double)L * (double)(H + I2)); /* elementwise work of this block */
    mxfp8i_moe_load_b1(p, e, w->b1);
    mxfp8i_moe_load_b2(p, e, w->b2);
    /* gather X rows (padding rows zero; BF16 kept as BF16) and the affinities of the positions */
#pragma omp parallel num_threads(nt)
    {
        const unsigned csr = mxfp8i_fenv_enter(); /* IEEE defaults on every thread of the region */
#pragma omp for schedule(static) nowait
        for (int64_t q = 0; q < L; q++) {
            aq[q] = tok[q] >= 0 ? mxfp8i_moe_aff(p, tok[q], e) : 0.0f;
            if (q + 1 < L && tok[q + 1] >= 0) mxfp8i_moe_prefetch_row(&p->X, tok[q + 1], H);
            mxfp8i_moe_x_row(&p->X, tok[q], H, xb, q);
        }
        mxfp8i_fenv_leave(csr);
    }
    /* GEMM 1: GU = X_blk @ W1[e], contraction H (W1[e]'s packed panels kept in keyed slot 0) */
    mxfp8i_gop A = mxfp8i_gop_hp(xb, mxfp8i_moe_xb_dtype(&p->X), L, H, H, 1);
    mxfp8i_moe_round_block(p, &A, MXFP8_MOE_GEMM1_X, n, H, H, 1);
    mxfp8i_gop W = mxfp8i_moe_weight(p, &w->wc, e, MXFP8I_W1_H);
    mxfp8i_ws_bkey(0, (uint64_t)e + 1, W.data);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_gemm(p, e, &A, MXFP8_MOE_GEMM1_X, &W, MXFP8_MOE_GEMM1_W1, 0, gu, I2));
    /* g, u and act(g) of the block only where a checkpoint takes them, else one position at a time in the thread's
     * rows (in L1); inter always (GEMM 2's operand) */
    const int pm = gu_pm(&o->gate_up_proj_act_checkpoint_T);
    const int keep_gu = o->gate_up_proj_act_checkpoint_T.data != NULL, keep_act = o->gate_act_checkpoint_T.data != NULL;
#pragma omp parallel num_threads(nt)
    {
        const unsigned csr = mxfp8i_fenv_enter(); /* IEEE defaults on every thread of the region */
#pragma omp for schedule(static) nowait
        for (int t = 0; t < nt; t++) {
            for (int64_t q = L * t / nt; q < L * (t + 1) / nt; q++) {
                float *own = w->rows + (int64_t)t * 3 * I;
                float *rows[4] = {keep_gu ? g + q * I : own, keep_gu ? u + q * I : own + I,
                                  keep_act ? act + q * I : own + 2 * I, inter + q * I};
                if (tok[q] < 0)
                    for (int k = 0; k < 4; k++) memset(rows[k], 0, (size_t)I * sizeof(float));
                else
                    mxfp8i_moe_fwd_row(c, I, gu + q * I2, b1, rows[0], rows[1], rows[2], 0, rows[3], 0, NULL, 0.0f,
                                       NULL);
            }
            if (pm) /* these positions' rows of the gate/up checkpoint, while they are in cache */
                gu_pm_rows(p, &o->gate_up_proj_act_checkpoint_T, n, blocks, L, g, u, L * t / nt, L * (t + 1) / nt);
        }
        mxfp8i_fenv_leave(csr);
    }
    /* GEMM 2: down = inter @ W2[e] + b2, contraction I (keyed slot 1) */
    A = mxfp8i_gop_hp(inter, MXFP8_DTYPE_F32, L, I, I, 1);
    mxfp8i_moe_round_block(p, &A, MXFP8_MOE_GEMM2_INTER, n, I, I, 1);
    W = mxfp8i_moe_weight(p, &w->wc, e, MXFP8I_W2_I);
    mxfp8i_ws_bkey(1, (uint64_t)e + 1, W.data);
    if (V) down = V + n * B * H;
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_gemm(p, e, &A, MXFP8_MOE_GEMM2_INTER, &W, MXFP8_MOE_GEMM2_W2, 0, down, H));
    const int ckp = any_checkpoint(o), keep_down = o->down_proj_output_checkpoint.data != NULL;
    if (V && !ckp) return MXFP8_OK;
#pragma omp parallel num_threads(nt)
    {
        const unsigned csr = mxfp8i_fenv_enter(); /* IEEE defaults on every thread of the region */
#pragma omp for schedule(static) nowait
        for (int t = 0; t < nt; t++) { /* column ranges split between threads; positions in order */
            const int64_t h0 = H * t / nt, h1 = H * (t + 1) / nt;
            for (int64_t q = 0; !V && q < L; q++) {
                if (tok[q] < 0) continue; /* padding: nothing to add (its checkpoint rows are written as zeros) */
                float *dq = down + q * H;
                const float a = aq[q];
                float *dst = w->acc + tok[q] * H;
                if (q + 1 < L && tok[q + 1] >= 0)
                    mxfp8i_moe_prefetch(w->acc + tok[q + 1] * H + h0, (size_t)(h1 - h0) * sizeof(float), 1);
                if (keep_down) /* down + b2 kept for the down projection's checkpoint */
                    for (int64_t h = h0; h < h1; h++) {
                        float d = dq[h] + b2[h];
                        dq[h] = d;
                        dst[h] += a * d;
                    }
                else
                    for (int64_t h = h0; h < h1; h++) dst[h] += a * (dq[h] + b2[h]);
            }
            for (int64_t b = 0; ckp && b < blocks; b++) /* each block's checkpoints from its rows of the run */
                write_checkpoints(p, n + b, b + 1 < blocks ? B : L - b * B, o, !pm, g + b * B * I, u + b * B * I,
                                  act + b * B * I, inter + b * B * I, down + b * B * H, aq + b * B, t, nt);
        }
        mxfp8i_fenv_leave(csr);
    }
    return MXFP8_OK;
}

/* The expert-parallel path (speed only, the same bits): where runs of blocks do not pay (small widths), each
 * block's work is too short to split well between threads -- five parallel regions per block, each ending at a
 * barrier. Instead the threads take whole blocks (take_block: a thread keeps to one group of consecutive blocks of
 * one expert while it has blocks, its weights packed once, then takes a group nobody is on, and only then the last
 * blocks of another thread's group), each block on one thread exactly as fwd_run does it, every checkpoint row
 * written by that thread; each position's down projection goes to its own row of V, and the combine then adds each
 * token's a * (down + b2) in position order, which is block order: the scatter's operations, in the same order, so
 * the same bits (rounded straight into a BF16 output). Not with operand statistics (their
 * accumulation per expert is the serial path's) or a down projection checkpoint (its own scatter), and only while
 * the per-position rows stay within 256 MiB. Measured (AMD Zen 4, 2 threads, H = 256, I = 512, B = 128, E = 8,
 * top-2, 2048 tokens) when it took whole groups of blocks: 0.94-0.96 of the serial walk's time, the same on 1
 * thread; but with one group per expert it left one thread idle for 1.1-2.2 of the region's 11-12 ms, the last
 * expert's share: hence blocks. Now (with the combine's weighting): 0.93 of the serial walk's time there, 0.97 on
 * the fine-grained problem (H = 1024, I = 256, 64 experts, top-8). */
static int fwd_par(const mxfp8i_moe *p, const mxfp8_moe_fwd_outputs *o, const mxfp8_quant_stats *stats) {
    return !o->down_proj_output_checkpoint.data && mxfp8i_moe_par_pays(p, stats);
}

/* The next block for the thread on group *cur (-1: none yet), or -1 when every block is taken; call holding the
 * schedule's lock. Per group g of ng (blocks [grp[g], grp[g + 1])): its next block from the front nx[g], its end
 * en[g] (blocks stolen from the back lower it), the thread on it ow[g] (-1: none). In order: the next block of the
 * thread's own group; the first block of the first group nobody is on (the groups in order); the last block of the
 * group with the most blocks left, when it has two or more (with one left its thread takes it next, and the
 * stealer would pack that expert's weights first). */
static int64_t take_block(const fwd_ws *w, int64_t ng, int t, int64_t *cur) {
    int32_t *nx = w->gsched, *en = nx + ng, *ow = en + ng;
    if (*cur >= 0 && nx[*cur] < en[*cur]) return nx[*cur]++;
    int64_t best = -1;
    for (int64_t g = 0; g < ng; g++) {
        if (nx[g] >= en[g]) continue;
        if (ow[g] < 0) {
            ow[g] = t, *cur = g;
            return nx[g]++;
        }
        if (en[g] - nx[g] >= 2 && (best < 0 || en[g] - nx[g] > en[best] - nx[best])) best = g;
    }
    if (best < 0) return -1;
    *cur = best;
    return --en[best];
}

static mxfp8_status forward_par(const mxfp8i_moe *p, fwd_ws *w, const mxfp8_moe_fwd_outputs *o, int *stored) {
    const int64_t N = p->N;
    int64_t ng = 0;
    for (int64_t n = 0; n < N; n++)
        if (n == 0 || p->expert[n] != p->expert[n - 1]) w->grp[ng++] = (int32_t)n;
    w->grp[ng] = (int32_t)N;
    for (int64_t g = 0; g < ng; g++) /* take_block's state */
        w->gsched[g] = w->grp[g], w->gsched[ng + g] = w->grp[g + 1], w->gsched[2 * ng + g] = -1;
    omp_lock_t sched; /* the schedule's lock: this call's own */
    omp_init_lock(&sched);
    for (int64_t e = 0; e < p->E; e++) mxfp8i_moe_load_b2(p, e, w->b2s + e * p->H);
    const int nt = mxfp8i_num_threads();
    int failed = 0;
#pragma omp parallel num_threads(nt)
    {
        mxfp8i_moe_worker wk;
        mxfp8i_moe_worker_begin(&wk, w->par, w->par_bytes);
        fwd_ws tw;
        const fwd_job tj = {p, NULL, &tw, 1, 1};
        /* this worker's buffers, carved from its share of the arena (sized by the same reservation) */
        int ok = !mxfp8i_ws_plan(p->fn, moe_fwd_reserve_job, &tj, NULL) && !moe_fwd_reserve_job(&tj);
        int64_t cur = -1, n;
        for (;;) {
            omp_set_lock(&sched);
            n = take_block(w, ng, wk.t, &cur);
            omp_unset_lock(&sched);
            if (n < 0) break;
            const int64_t L = mxfp8i_moe_block_len(p, n);
            tw.aq = w->aqs + n * p->B; /* the block's affinities, for the combine */
            if (L > 0 && ok) ok = fwd_run(p, &tw, n, 1, p->expert[n], L, o, w->V) == MXFP8_OK;
            else if (L == 0 && ok && any_checkpoint(o)) /* a padding-only block: zero checkpoints */
                write_checkpoints(p, n, 0, o, 1, tw.g, tw.u, tw.act, tw.inter, tw.down, tw.aq, 0, 1);
        }
        mxfp8i_moe_worker_end(&wk, ok, &failed);
    }
    omp_destroy_lock(&sched);
    MXFP8I_RETURN_ERROR_IF(failed, MXFP8_ERR_INTERNAL, "%s: a block failed after its reservation", p->fn);
    /* in position order (block order), rounded straight into a BF16 output */
    *stored = mxfp8i_moe_combine_rows(p, NULL, p->N, w->V, w->aqs, w->b2s, w->acc, w->first, w->list, &o->output, 0);
    return MXFP8_OK;
}

/* The blocks in order, on all the call's threads (runs of blocks where mxfp8i_moe_run_joins stacks them). */
static mxfp8_status forward_blocks(const mxfp8i_moe *p, fwd_ws *w, const mxfp8_moe_fwd_outputs *o) {
    for (int64_t n = 0, blocks; n < p->N; n += blocks) {
        const int64_t e = p->expert[n];
        int64_t last = mxfp8i_moe_block_len(p, n); /* the run's last block's length */
        for (blocks = 1; n + blocks < p->N; blocks++) {
            const int64_t Ln = mxfp8i_moe_block_len(p, n + blocks);
            if (!mxfp8i_moe_run_joins(p, blocks, e, last, p->expert[n + blocks], Ln)) break;
            last = Ln;
        }
        const int64_t L = (blocks - 1) * p->B + last; /* the stacked positions */
        MXFP8I_RETURN_ERROR_IF(L > 0 && fwd_run(p, w, n, blocks, e, L, o, NULL), MXFP8_ERR_INTERNAL,
                               "%s: a block GEMM failed after its reservation", p->fn);
        if (L == 0 && any_checkpoint(o)) { /* a padding-only block: zero checkpoints */
            const int nt = mxfp8i_moe_nt((double)p->B * (double)(5 * p->I + p->H));
#pragma omp parallel num_threads(nt)
            {
                const unsigned csr = mxfp8i_fenv_enter(); /* IEEE defaults on every thread of the region */
#pragma omp for schedule(static) nowait
                for (int t = 0; t < nt; t++)
                    write_checkpoints(p, n, 0, o, 1, w->g, w->u, w->act, w->inter, w->down, w->aq, t, nt);
                mxfp8i_fenv_leave(csr);
            }
        }
    }
    return MXFP8_OK;
}

/* Every check of mxfp8_moe_forward (shared by the call and mxfp8_moe_forward_validate): nothing stored, no workspace
 * used. */
static mxfp8_status forward_check(const char *fn, const mxfp8_moe_fwd_args *args,
                                  const mxfp8_moe_fwd_outputs *outputs, mxfp8i_moe_in *in, mxfp8i_moe *p) {
    MXFP8I_RETURN_ERROR_IF(!args, MXFP8_ERR_NULL_POINTER, "%s: args is NULL", fn);
    MXFP8I_RETURN_ERROR_IF(!outputs, MXFP8_ERR_NULL_POINTER, "%s: outputs is NULL", fn);
    mxfp8i_moe_in_fwd(args, in);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_check(fn, in, 0, p));
    return mxfp8i_moe_check_fwd_outputs(p, in, outputs, 0);
}

/* The call inside its workspace scope, after its checks. Every buffer and GEMM reservation comes before the first
 * checkpoint is written, so an OUT_OF_MEMORY leaves every output untouched. */
static mxfp8_status forward_scoped(const mxfp8_moe_fwd_args *args, mxfp8_moe_fwd_outputs *outputs,
                                   const mxfp8i_moe_in *in, mxfp8i_moe *p) {
    const char *fn = p->fn;
    fwd_ws w;
    const fwd_job job = {p, args->stats, &w, fwd_par(p, outputs, args->stats), 0};
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_ws_plan(fn, moe_fwd_reserve_job, &job, NULL));
    MXFP8I_FORWARD_IF_ERROR(moe_fwd_reserve_job(&job)); /* the buffers themselves: the arena has grown to them */
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_table(in, p));
    MXFP8I_RETURN_ERROR_IF(mxfp8i_moe_stats_alloc(p, args->stats), MXFP8_ERR_OUT_OF_MEMORY,
                           "%s: cannot allocate workspaces", fn);
    int stored = 0; /* the expert-parallel path's combine writes the whole accumulator, or the output itself */
    if (!job.par) mxfp8i_moe_zero_f(w.acc, p->T * p->H);
    MXFP8I_FORWARD_IF_ERROR(job.par ? forward_par(p, &w, outputs, &stored) : forward_blocks(p, &w, outputs));
    if (!stored) mxfp8i_moe_store_flat_f(&outputs->output, w.acc, 0); /* [T, H], rounded once */
    mxfp8i_moe_stats_export(p, args->stats);
    return MXFP8_OK;
}

mxfp8_status mxfp8_moe_forward(const mxfp8_moe_fwd_args *args, mxfp8_moe_fwd_outputs *outputs) {
    static const char *fn = "mxfp8_moe_forward";
    mxfp8i_clear_error();
    mxfp8i_moe_in in;
    mxfp8i_moe p;
    MXFP8I_FORWARD_IF_ERROR(forward_check(fn, args, outputs, &in, &p));
    mxfp8i_scope scope;
    MXFP8I_RETURN_ERROR_IF(mxfp8i_scope_begin(&scope, args->workspace), MXFP8_ERR_OUT_OF_MEMORY,
                           "%s: cannot allocate a workspace", fn);
    const unsigned csr = mxfp8i_fenv_enter(); /* IEEE defaults here; each parallel region enters them on its threads */
    mxfp8_status st = forward_scoped(args, outputs, &in, &p);
    mxfp8i_fenv_leave(csr);
    mxfp8i_scope_end(&scope);
    return st;
}

mxfp8_status mxfp8_moe_forward_validate(const mxfp8_moe_fwd_args *args, const mxfp8_moe_fwd_outputs *outputs,
                                        size_t *workspace_bytes) {
    static const char *fn = "mxfp8_moe_forward";
    mxfp8i_clear_error();
    mxfp8i_moe_in in;
    mxfp8i_moe p;
    fwd_ws w;
    size_t bytes = 0;
    mxfp8_status st = forward_check(fn, args, outputs, &in, &p);
    if (!st) {
        const fwd_job job = {&p, args->stats, &w, fwd_par(&p, outputs, args->stats), 0};
        st = mxfp8i_ws_plan(fn, moe_fwd_reserve_job, &job, &bytes);
    }
    if (workspace_bytes) *workspace_bytes = st ? 0 : bytes;
    return st;
}
