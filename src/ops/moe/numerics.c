/*
 * numerics.c -- the MoE layer's options beyond the NKI page: gpt-oss SwiGLU's limits (folded into the clamp limits,
 * so forward, backward and goldens clamp and mask with them), stochastic rounding of the GEMM operands selected by
 * config.stochastic_rounding, and per-expert, per-operand statistics (args.stats), taken in a separate pass over each
 * operand (src/ops/opstats.c) next to its GEMM. Operand ids and logical indices: include/mxfp8.h,
 * mxfp8_moe_operand.
 */
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "../../runtime/workspace.h"
#include "../opstats.h"
#include "moe.h"

mxfp8_status mxfp8i_moe_numerics_config(const char *fn, mxfp8_moe_config *c) {
    MXFP8I_RETURN_ERROR_IF(c->stochastic_rounding >> MXFP8_MOE_NUM_OPERANDS, MXFP8_ERR_INVALID_ARGUMENT,
                           "%s: config.stochastic_rounding 0x%x has bits beyond the %d operands", fn,
                           (unsigned)c->stochastic_rounding, MXFP8_MOE_NUM_OPERANDS);
    if (!mxfp8i_moe_act_desc(c)->uses_limit) return MXFP8_OK;
    MXFP8I_RETURN_ERROR_IF(!isfinite(c->swiglu_alpha), MXFP8_ERR_INVALID_ARGUMENT,
                           "%s: config.swiglu_alpha %g is not finite", fn, (double)c->swiglu_alpha);
    MXFP8I_RETURN_ERROR_IF(!(c->swiglu_limit > 0.0f), MXFP8_ERR_INVALID_ARGUMENT,
                           "%s: config.swiglu_limit %g is not > 0 (+INFINITY: no limit)", fn, (double)c->swiglu_limit);
    const float lim = c->swiglu_limit;
    if (lim < c->gate_clamp_upper) c->gate_clamp_upper = lim;
    if (-lim > c->up_clamp_lower) c->up_clamp_lower = -lim;
    if (lim < c->up_clamp_upper) c->up_clamp_upper = lim;
    MXFP8I_RETURN_ERROR_IF(c->gate_clamp_lower > c->gate_clamp_upper || c->up_clamp_lower > c->up_clamp_upper,
                           MXFP8_ERR_INVALID_ARGUMENT,
                           "%s: config's clamp limits are empty once swiglu_limit %g applies (gate [%g, %g], up [%g, "
                           "%g])", fn, (double)lim, (double)c->gate_clamp_lower, (double)c->gate_clamp_upper,
                           (double)c->up_clamp_lower, (double)c->up_clamp_upper);
    return MXFP8_OK;
}

void mxfp8i_moe_round_block(const mxfp8i_moe *p, mxfp8i_gop *op, int id, int64_t n, int64_t width, int64_t i0,
                            int64_t i1) {
    op->rc = p->rc;
    if (!((p->cfg.stochastic_rounding >> id) & 1u)) return;
    op->sr = mxfp8i_sround_make(1, p->cfg.rounding_seed, (uint64_t)id, n * p->B * width, i0, i1);
}

static size_t stats_bytes(const mxfp8i_moe *p) {
    return (size_t)p->E * MXFP8_MOE_NUM_OPERANDS * (sizeof(mxfp8i_qstats) + 1);
}

mxfp8_status mxfp8i_moe_stats_reserve(const mxfp8i_moe *p, const mxfp8_quant_stats *stats) {
    if (!stats) return MXFP8_OK;
    const int64_t kmax = mxfp8i_moe_max64(mxfp8i_moe_max64(p->H, 2 * p->I), mxfp8i_moe_size_Bw(p)); /* any routing */
    if (!mxfp8i_ws_get(MXFP8I_WS_MOE_STATS, stats_bytes(p)) || mxfp8i_gop_stats_reserve(kmax, mxfp8i_num_threads()))
        return MXFP8_ERR_OUT_OF_MEMORY;
    return MXFP8_OK;
}

mxfp8_status mxfp8i_moe_stats_alloc(mxfp8i_moe *p, const mxfp8_quant_stats *stats) {
    p->qst = NULL, p->wdone = NULL;
    if (!stats) return MXFP8_OK;
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_stats_reserve(p, stats));
    const size_t n = (size_t)p->E * MXFP8_MOE_NUM_OPERANDS, bytes = stats_bytes(p);
    char *buf = (char *)mxfp8i_ws_get(MXFP8I_WS_MOE_STATS, bytes);
    memset(buf, 0, bytes);
    p->qst = (mxfp8i_qstats *)buf;
    p->wdone = (uint8_t *)(buf + n * sizeof(mxfp8i_qstats));
    return MXFP8_OK;
}

void mxfp8i_moe_stats_export(const mxfp8i_moe *p, mxfp8_quant_stats *stats) {
    if (!p->qst) return;
    for (int64_t i = 0; i < p->E * MXFP8_MOE_NUM_OPERANDS; i++) mxfp8i_qstats_export(&p->qst[i], &stats[i]);
}

/* The statistics of operand `id` of expert e (weights: the first time only), requested into its slot. */
static mxfp8_status operand_stats(const mxfp8i_moe *p, int64_t e, const mxfp8i_gop *op, int id, int nt) {
    const int64_t slot = e * MXFP8_MOE_NUM_OPERANDS + id;
    const int weight = id == MXFP8_MOE_GEMM1_W1 || id == MXFP8_MOE_GEMM2_W2 || id == MXFP8_MOE_P1_W2 ||
                       id == MXFP8_MOE_P2_W1;
    if (weight && p->wdone[slot]) return MXFP8_OK;
    mxfp8i_gop g = *op;
    g.stats = &p->qst[slot];
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_gop_stats(&g, nt));
    if (weight) p->wdone[slot] = 1;
    return MXFP8_OK;
}

_Thread_local int mxfp8i_moe_alone; /* mxfp8i_moe_gemm_one_thread */

int mxfp8i_moe_gemm_one_thread(int on) {
    const int prev = mxfp8i_moe_alone;
    mxfp8i_moe_alone = on != 0;
    return prev;
}

void mxfp8i_moe_worker_begin(mxfp8i_moe_worker *k, char *arenas, size_t bytes) {
#ifdef _OPENMP
    k->t = omp_get_thread_num();
#else
    k->t = 0;
#endif
    mxfp8i_scope_begin_sub(&k->sc, arenas + (size_t)k->t * bytes, bytes);
    k->csr = mxfp8i_fenv_enter(); /* IEEE defaults on every thread of the region */
    k->one = mxfp8i_moe_gemm_one_thread(1);
}

void mxfp8i_moe_worker_end(mxfp8i_moe_worker *k, int ok, int *failed) {
    mxfp8i_moe_gemm_one_thread(k->one);
    if (!ok) {
#pragma omp atomic write
        *failed = 1;
    }
    mxfp8i_fenv_leave(k->csr);
    mxfp8i_scope_end(&k->sc);
}

/* The config (speed knobs: the defaults) and thread count of a phase GEMM (small GEMMs, and every GEMM of a thread
 * that runs its blocks alone, run on the calling thread). */
static void phase_setup(const mxfp8i_moe *p, int64_t M, int64_t N, int64_t K, mxfp8_matmul_config *cfg, int *nt) {
    (void)p;
    mxfp8_matmul_config_init(cfg);
    *nt = mxfp8i_moe_alone || (double)M * (double)N * (double)K < 4194304.0 ? 1 : mxfp8i_num_threads();
}

mxfp8_status mxfp8i_moe_gemm_reserve(const mxfp8i_moe *p, int64_t M, int64_t N, int64_t K, int keyed_slot) {
    mxfp8_matmul_config cfg;
    int nt;
    phase_setup(p, M, N, K, &cfg, &nt);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_gemm_reserve(M, N, K, &cfg, 1, keyed_slot)); /* smaller problems: 1 thread */
    return mxfp8i_moe_alone ? MXFP8_OK : mxfp8i_gemm_reserve(M, N, K, &cfg, mxfp8i_num_threads(), keyed_slot);
}

/* One GEMM of a phase through the block-scaled GEMM of src/gemm (quantize along K, FP32 fmaf accumulation in
 * ascending k, C + sum when accumulating; each C element written by one thread), after the operands' statistics
 * (their scratch reserved by mxfp8i_moe_stats_alloc). */
mxfp8_status mxfp8i_moe_gemm(const mxfp8i_moe *p, int64_t e, const mxfp8i_gop *A, int ida, const mxfp8i_gop *B,
                             int idb, int accumulate, float *C, int64_t ldc) {
    const int64_t M = A->R, N = B->R, K = A->K;
    if (M <= 0 || N <= 0) return MXFP8_OK;
    mxfp8_matmul_config cfg;
    int nt;
    phase_setup(p, M, N, K, &cfg, &nt);
    if (p->qst) {
        MXFP8I_FORWARD_IF_ERROR(operand_stats(p, e, A, ida, nt));
        MXFP8I_FORWARD_IF_ERROR(operand_stats(p, e, B, idb, nt));
    }
    mxfp8_tensor c;
    memset(&c, 0, sizeof c);
    c.data = C;
    c.dtype = MXFP8_DTYPE_F32;
    c.ndim = 2;
    c.shape[0] = M;
    c.shape[1] = N;
    c.strides[0] = ldc;
    c.strides[1] = 1;
    mxfp8_status st = mxfp8i_gemm_gop(A, B, &cfg, accumulate, &c, nt);
    return st == MXFP8_OK ? MXFP8_OK : MXFP8_ERR_OUT_OF_MEMORY;
}

mxfp8_status mxfp8i_moe_gemm_segments_reserve(const mxfp8i_moe *p, int64_t M, int64_t N, int64_t Kmax, int nseg) {
    mxfp8_matmul_config cfg;
    int nt;
    phase_setup(p, M, N, Kmax, &cfg, &nt);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_gemm_segments_reserve(M, N, Kmax, nseg, &cfg, 1));
    return mxfp8i_moe_alone ? MXFP8_OK : mxfp8i_gemm_segments_reserve(M, N, Kmax, nseg, &cfg, mxfp8i_num_threads());
}

/* The segmented GEMM (mxfp8i_gemm_segments) after each segment's operand statistics, segment by segment in the
 * order the separate GEMMs of mxfp8i_moe_gemm would take them. */
mxfp8_status mxfp8i_moe_gemm_segments(const mxfp8i_moe *p, int64_t e, int nseg, const mxfp8i_gop *A, int ida,
                                      const mxfp8i_gop *B, int idb, int c_zero, int stream, void *C, mxfp8_dtype cdt,
                                      int64_t ldc) {
    if (nseg <= 0 || A[0].R <= 0 || B[0].R <= 0) return MXFP8_OK;
    const int64_t M = A[0].R, N = B[0].R;
    mxfp8_matmul_config cfg;
    int nt;
    int64_t Ksum = 0;
    for (int s = 0; s < nseg; s++) {
        phase_setup(p, M, N, A[s].K, &cfg, &nt);
        if (p->qst) {
            MXFP8I_FORWARD_IF_ERROR(operand_stats(p, e, &A[s], ida, nt));
            MXFP8I_FORWARD_IF_ERROR(operand_stats(p, e, &B[s], idb, nt));
        }
        Ksum += A[s].K;
    }
    phase_setup(p, M, N, Ksum, &cfg, &nt);
    mxfp8_tensor c;
    memset(&c, 0, sizeof c);
    c.data = C;
    c.dtype = cdt;
    c.ndim = 2;
    c.shape[0] = M;
    c.shape[1] = N;
    c.strides[0] = ldc;
    c.strides[1] = 1;
    mxfp8_status st = mxfp8i_gemm_segments(A, B, nseg, c_zero, stream, &cfg, &c, nt);
    return st == MXFP8_OK ? MXFP8_OK : MXFP8_ERR_OUT_OF_MEMORY;
}
