/*
 * driver.c -- the block-scaled GEMM driver: packing, cache blocking, loop orders, thread split, epilogue. Contract in
 * gemm.h; microkernel contract in src/kernels/ukernel.h; the kernel comes from the registry (src/kernels/registry.h).
 *
 * Plan of one call (M, N, K >= 1):
 *   1. B (the operand every output row needs) is quantized/dequantized once into NR-column panels covering all of K
 *      (threads split the panels).
 *   2. spill_reload = 1: A is likewise packed once into MR-row panels in a shared workspace. spill_reload = 0: each
 *      thread packs the MR-row panels of the block rows it is about to use into its own buffer (re-quantizing what
 *      another thread may also quantize: NKI's "quantize again" instead of "spill and reload").
 *   3. The output is cut into blocks (tile_m * TILES_IN_BLOCK_M rows by tile_n * TILES_IN_BLOCK_N columns). Threads
 *      split the blocks along N (lnc_2_shard_rhs) or M; each block has exactly one owner. Within a block, tiles
 *      (tile_m x tile_n x tile_k) run in tile_loop_order; each tile runs the microkernel over its MR x NR register
 *      tiles, accumulating in the owner's FP32 block buffer. k is ascending in every loop order, so the FP32 sum of
 *      every element is the same sequence of fused multiply-adds whatever the order, blocking or thread count.
 *   4. Epilogue: the owner rounds its block once to C's dtype (RNE), or adds it to C (accumulate, F32); with a bias
 *      (mxfp8_linear) each sum + bias[n] first, one FP32 addition. A plain F32 C with unit column stride and no bias
 *      needs none: the kernel accumulates in C itself (reloading a sum is exact).
 * Every GEMM thread runs under IEEE MXCSR defaults (src/runtime/fenv.h): the FP32 kernels' FMAs, the epilogue's
 * additions and conversions would otherwise follow a fast-math or flush-denormals caller.
 */
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "../kernels/registry.h"
#include "../quant/panel.h"
#include "../runtime/fenv.h"
#include "gemm.h"
#include "../runtime/workspace.h"

typedef struct gemm_ctx gemm_ctx;
struct gemm_ctx {
    const mxfp8i_gop *a, *b;
    const mxfp8_matmul_config *cfg;
    const mxfp8i_ukernel *uk;
    mxfp8i_to_bf16_fn to_bf16;    /* the registry's FP32 -> BF16 rounding (epilogue) */
    mxfp8i_add_f32_fn add_f32;    /* and its FP32 accumulation (epilogue with accumulate) */
    mxfp8i_copy_f32_fn copy_f32;  /* and its FP32 copy into an output written once (segmented, stream) */
    int accumulate;
    const float *bias;            /* NULL, or [N] FP32 added once to every column's sum before its rounding */
    const mxfp8_tensor *c;
    int64_t M, N, K, MCb, NCb, MB, NB, ldcb;
    int64_t pa_stride, pb_stride; /* bytes between consecutive A / B panels */
    char *Bp, *Ap;
    char *tbuf;                   /* every thread's buffers, thread t's at tbuf + t * tstride: */
    int64_t tstride, off_s, off_t, off_a; /* accumulators at 0, packing scratch, tmp, A block row (byte offsets) */
    int64_t off_acc;              /* segmented calls: the register tile's running C and segment sum, */
    int64_t off_own, off_ptrs;    /* the owned panel of every segment, the segments' panel pointers */
    char *ash[2];                 /* coop: the A panels of block rows mb (ash[mb & 1]), packed by all threads */
    int b_ready;                  /* Bp already holds B's panels (a keyed slot of the workspace scope) */
    int coop;                     /* threads share the packing of each block row's A panels (shard along N) */
                                  /* accumulators: FP32 of one block [MCb, ldcb]; scratch: max(mr, nr) * K floats;
                                     tmp: K floats + scale bytes; A block row: spill_reload = 0 without coop */
    int nt;
};
/* Thread t's buffers. */
static inline float *T_CBLK(const gemm_ctx *x, int t) { return (float *)(x->tbuf + t * x->tstride); }
static inline float *T_SCRATCH(const gemm_ctx *x, int t) { return (float *)(x->tbuf + t * x->tstride + x->off_s); }
static inline float *T_TMP(const gemm_ctx *x, int t) { return (float *)(x->tbuf + t * x->tstride + x->off_t); }
static inline char *T_ABUF(const gemm_ctx *x, int t) { return x->tbuf + t * x->tstride + x->off_a; }

/* A column-geometry operand's rows [r0, r0 + rows) into out[k*ld + i] (mxfp8i_gop_cols_f32: for the kernel's
 * pack_cm); 0, writing nothing, for any other operand. sbuf: rows * ceil(K/32) bytes. */
static int cols_f32(const mxfp8i_gop *op, int64_t r0, int rows, float *out, int64_t ld, uint8_t *sbuf) {
    return mxfp8i_gop_cols_f32(op, r0, rows, out, ld, sbuf);
}

/* A high-precision operand in 1x32 groups, rows or columns geometry: quantized into BF16 values and their scales,
 * then packed from those (the kernel's pack_q: half the bytes of the FP32 route, chunk facts from the scales).
 * Returns 0, writing nothing into the panel, when the operand does not qualify or a value is not exact in BF16
 * (then the FP32 route runs). */
static int pack_q(const gemm_ctx *x, int tid, const mxfp8i_gop *op, int is_b, int64_t r0, int rows, int w,
                  void *panel) {
    if (rows <= 0 || op->prequant || op->swizzled || op->rc.group != MXFP8_GROUP_1X32) return 0;
    const int64_t K = op->K, G = mxfp8i_ceil_div(K, 32);
    const int cm = op->s1 != 1;
    if (cm && (op->s0 != 1 || op->s1 <= 0)) return 0;
    uint16_t *q = (uint16_t *)T_SCRATCH(x, tid);
    uint8_t *sc = (uint8_t *)(T_TMP(x, tid) + K);
    const char *base = op->data + r0 * op->s0 * (int64_t)mxfp8_dtype_size(op->dtype);
    mxfp8i_qpanel p = {base, op->dtype, rows, K, op->s0, op->s1, op->rc.fmt, op->rc.rule,
                       MXFP8_GROUP_1X32, q, MXFP8_DTYPE_BF16, cm ? 1 : K, cm ? w : 1, sc, cm ? 1 : G, cm ? w : 1,
                       mxfp8i_gop_sround(op, r0), NULL};
    if (mxfp8i_quantize_panel(&p) != 0) return 0;
    x->uk->pack_q(is_b, q, cm ? w : K, cm, rows, K, sc, cm ? 1 : G, cm ? w : 1, (int)op->rc.fmt, panel);
    return 1;
}

/* Pack rows [r0, r0 + w) of op over all of K into one panel of the kernel's format, through the kernel's packers
 * only: from BF16 values and scales (pack_q) where the operand qualifies, else from FP32 values read down the
 * columns (pack_cm) or along the rows (pack). */
static void pack_panel(const gemm_ctx *x, int tid, const mxfp8i_gop *op, int is_b, int64_t r0, void *panel) {
    const mxfp8i_ukernel *uk = x->uk;
    int w = is_b ? uk->nr : uk->mr;
    int64_t K = op->K;
    float *tmp = T_TMP(x, tid);
    int rows = (int)(op->R - r0 < w ? op->R - r0 : w);
    if (rows < 0) rows = 0;
    if (uk->pack_q && pack_q(x, tid, op, is_b, r0, rows, w, panel)) return;
    if (uk->pack_cm && cols_f32(op, r0, rows, T_SCRATCH(x, tid), w, (uint8_t *)(tmp + K))) {
        uk->pack_cm(is_b, T_SCRATCH(x, tid), w, rows, K, panel);
        return;
    }
    mxfp8i_gop_rows_f32(op, r0, rows, T_SCRATCH(x, tid), (uint8_t *)(tmp + K), tmp,
                        T_SCRATCH(x, tid) + (int64_t)w * K);
    uk->pack(is_b, T_SCRATCH(x, tid), K, rows, K, panel);
}

/* Panels quantized together when the operand is read down its columns (the contraction axis strided): one pass
 * over PACK_GROUP * w columns reads each source row PACK_GROUP times longer, instead of w values per row. */
#define PACK_GROUP 4

/* Bytes of a thread's packing scratch per line of the widest panel and per k, the larger of 8 (pack_panel: a
 * panel's FP32 values and their staging in column order) and 2 * PACK_GROUP (pack_panels: PACK_GROUP panels of
 * BF16 values; 8 alone covers PACK_GROUP <= 4 only). */
#define SCRATCH_PER_COL (2 * PACK_GROUP > 8 ? 2 * PACK_GROUP : 8)

/* Whether pack_panels quantizes the operand's panels PACK_GROUP at a time (columns geometry, on the fly, 1x32). */
static int pack_grouped(const gemm_ctx *x, const mxfp8i_gop *op) {
    const mxfp8i_ukernel *uk = x->uk;
    return uk->pack_q && !op->prequant && !op->swizzled &&
           op->rc.group == MXFP8_GROUP_1X32 && op->s0 == 1 && op->s1 > 1;
}

/* How many consecutive panels of np a thread packs at a time when nt threads share them: PACK_GROUP for
 * grouped operands (fewer when that would leave a thread without panels), else 1. Speed only. */
static int64_t pack_step(const gemm_ctx *x, const mxfp8i_gop *op, int64_t np, int nt) {
    if (!pack_grouped(x, op)) return 1;
    const int64_t share = mxfp8i_ceil_div(np, nt);
    return share < 1 ? 1 : share < PACK_GROUP ? share : PACK_GROUP;
}

/* Panels [p0, p1) of op (panel p holds rows [p w, p w + w)), panel p at dst + (p - p0) * stride: the panels
 * pack_panel gives one by one. Column-geometry operands that pack from BF16 values are quantized PACK_GROUP
 * panels at a time into the thread's scratch, then each panel is packed from its slice; if a value of the group
 * is not exact in BF16 each panel goes through pack_panel. */
static void pack_panels(const gemm_ctx *x, int tid, const mxfp8i_gop *op, int is_b, int64_t p0, int64_t p1,
                        char *dst, int64_t stride) {
    const mxfp8i_ukernel *uk = x->uk;
    const int w = is_b ? uk->nr : uk->mr;
    const int grouped = pack_grouped(x, op);
    for (int64_t p = p0; p < p1;) {
        const int64_t n = p1 - p < PACK_GROUP ? p1 - p : PACK_GROUP;
        const int64_t r0 = p * w, rows = op->R - r0 < n * w ? op->R - r0 : n * w;
        if (!grouped || n == 1 || rows <= (n - 1) * w) {
            pack_panel(x, tid, op, is_b, r0, dst + (p - p0) * stride);
            p++;
            continue;
        }
        const int64_t K = op->K, ld = n * w;
        uint16_t *q = (uint16_t *)T_SCRATCH(x, tid);
        uint8_t *sc = (uint8_t *)(T_TMP(x, tid) + K);
        const char *base = op->data + r0 * (int64_t)mxfp8_dtype_size(op->dtype);
        mxfp8i_qpanel qp = {base, op->dtype, rows, K, 1, op->s1, op->rc.fmt, op->rc.rule,
                            MXFP8_GROUP_1X32, q, MXFP8_DTYPE_BF16, 1, ld, sc, 1, ld, mxfp8i_gop_sround(op, r0),
                            NULL};
        const int exact = mxfp8i_quantize_panel(&qp) == 0;
        for (int64_t j = 0; j < n; j++) {
            const int rj = (int)(rows - j * w < w ? rows - j * w : w);
            char *panel = dst + (p + j - p0) * stride;
            if (exact) uk->pack_q(is_b, q + j * w, ld, 1, rj, K, sc + j * w, 1, ld, (int)op->rc.fmt, panel);
            else pack_panel(x, tid, op, is_b, r0 + j * w, panel);
        }
        p += n;
    }
}

static void loop_dims(mxfp8_loop_order o, int d[3]) { /* 0 = m, 1 = n, 2 = k; d[0] outermost */
    static const int tab[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    d[0] = tab[o][0];
    d[1] = tab[o][1];
    d[2] = tab[o][2];
}

/* Rows [m0, m1) x columns [n0, n1) of C from the block accumulators (row m at cb[(m - m0) * ldcb + (n - n0)]; with a
 * bias, each sum + bias[n] first, one FP32 addition, in place). */
static void epilogue(const gemm_ctx *x, float *cb, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    const mxfp8_tensor *c = x->c;
    int64_t cs0 = c->strides[0], cs1 = c->strides[1], nn = n1 - n0;
    if (x->bias) /* (never with accumulate) */
        for (int64_t m = m0; m < m1; m++) {
            float *r = cb + (m - m0) * x->ldcb;
            const float *bn = x->bias + n0;
            for (int64_t n = 0; n < nn; n++) r[n] = r[n] + bn[n];
        }
    if (!x->accumulate && c->dtype == MXFP8_DTYPE_BF16 && cs1 == 1) { /* the common case: one call for all rows */
        x->to_bf16(cb, x->ldcb, (uint16_t *)c->data + m0 * cs0 + n0, cs0, m1 - m0, nn);
        return;
    }
    if (x->accumulate && cs1 == 1) { /* C + sum, one FP32 addition per element, all rows in one call */
        x->add_f32(cb, x->ldcb, (float *)c->data + m0 * cs0 + n0, cs0, m1 - m0, nn);
        return;
    }
    for (int64_t m = m0; m < m1; m++) {
        const float *src = cb + (m - m0) * x->ldcb;
        if (x->accumulate) {
            float *dst = (float *)c->data + m * cs0 + n0 * cs1;
            if (cs1 == 1) /* unit stride: the compiler vectorizes it (the same one FP32 addition per element) */
                for (int64_t n = 0; n < nn; n++) dst[n] = dst[n] + src[n];
            else
                for (int64_t n = 0; n < nn; n++) dst[n * cs1] = dst[n * cs1] + src[n];
        } else if (c->dtype == MXFP8_DTYPE_F32) { /* strided columns (unit stride: run_block's direct case) */
            float *dst = (float *)c->data + m * cs0 + n0 * cs1;
            for (int64_t n = 0; n < nn; n++) dst[n * cs1] = src[n];
        } else if (c->dtype == MXFP8_DTYPE_BF16) {
            uint16_t *dst = (uint16_t *)c->data + m * cs0 + n0 * cs1;
            if (cs1 == 1) x->to_bf16(src, x->ldcb, dst, cs0, 1, nn);
            else
                for (int64_t n = 0; n < nn; n++) dst[n * cs1] = mxfp8i_fp32_to_bf16(src[n]);
        } else {
            for (int64_t n = 0; n < nn; n++) mxfp8i_store_f32(c->data, c->dtype, m * cs0 + (n0 + n) * cs1, src[n]);
        }
    }
}

/* One output block (mb, nb): all its tiles in tile_loop_order, each micro-tile written to C after its last k chunk. */
static void run_block(const gemm_ctx *x, int tid, int64_t mb, int64_t nb, int64_t *packed_mb, const char *Acoop) {
    const mxfp8_matmul_config *cfg = x->cfg;
    const mxfp8i_ukernel *uk = x->uk;
    int64_t m0 = mb * x->MCb, m1 = m0 + x->MCb < x->M ? m0 + x->MCb : x->M;
    int64_t n0 = nb * x->NCb, n1 = n0 + x->NCb < x->N ? n0 + x->NCb : x->N;
    int64_t K = x->K;
    const char *Ablk;
    if (Acoop) {
        Ablk = Acoop;
    } else if (x->Ap) {
        Ablk = x->Ap + (m0 / uk->mr) * x->pa_stride;
    } else {
        if (*packed_mb != mb) {
            pack_panels(x, tid, x->a, 0, m0 / uk->mr, mxfp8i_ceil_div(m1, uk->mr), T_ABUF(x, tid), x->pa_stride);
            *packed_mb = mb;
        }
        Ablk = T_ABUF(x, tid);
    }
    /* An F32 C with unit column stride, not accumulated into, is the accumulator itself: the kernel's partial sums
     * go to C (reloading them is exact) and no epilogue copy is made. Otherwise the thread's block buffer. */
    const int direct = !x->accumulate && !x->bias && x->c->dtype == MXFP8_DTYPE_F32 && x->c->strides[1] == 1;
    float *cb = direct ? (float *)x->c->data + m0 * x->c->strides[0] + n0 : T_CBLK(x, tid);
    const int64_t ldc = direct ? x->c->strides[0] : x->ldcb;
    int64_t tm = cfg->tile_m, tn = cfg->tile_n, tk = cfg->tile_k;
    int64_t lo[3] = {m0, n0, 0}, hi[3] = {m1, n1, K}, step[3] = {tm, tn, tk};
    int d[3];
    loop_dims(cfg->tile_loop_order, d);
    int64_t i[3];
    for (i[d[0]] = lo[d[0]]; i[d[0]] < hi[d[0]]; i[d[0]] += step[d[0]])
        for (i[d[1]] = lo[d[1]]; i[d[1]] < hi[d[1]]; i[d[1]] += step[d[1]])
            for (i[d[2]] = lo[d[2]]; i[d[2]] < hi[d[2]]; i[d[2]] += step[d[2]]) {
                int64_t tm1 = i[0] + tm < m1 ? i[0] + tm : m1;
                int64_t tn1 = i[1] + tn < n1 ? i[1] + tn : n1;
                int64_t k0 = i[2], kc = (k0 + tk < K ? k0 + tk : K) - k0;
                for (int64_t n = i[1]; n < tn1; n += uk->nr) {
                    const char *bp = x->Bp + (n / uk->nr) * x->pb_stride;
                    int nr = (int)(tn1 - n < uk->nr ? tn1 - n : uk->nr);
                    for (int64_t m = i[0]; m < tm1; m += uk->mr) {
                        const char *ap = Ablk + ((m - m0) / uk->mr) * x->pa_stride;
                        int mr = (int)(tm1 - m < uk->mr ? tm1 - m : uk->mr);
                        float *ct = cb + (m - m0) * ldc + (n - n0);
                        uk->run(k0, kc, ap, bp, ct, ldc, mr, nr, k0 > 0);
                        /* the micro-tile is final after its last k chunk: written out while it is in L1 */
                        if (k0 + kc == K && !direct) epilogue(x, ct, m, m + mr, n, n + nr);
                    }
                }
            }
}

static void thread_body(const gemm_ctx *x, int tid, int nt) {
    const mxfp8i_ukernel *uk = x->uk;
    int shard_n = x->cfg->lnc_2_shard_rhs != 0;
    int64_t nsh = shard_n ? x->NB : x->MB, nother = shard_n ? x->MB : x->NB;
    int64_t s0 = nsh * tid / nt, s1 = nsh * (tid + 1) / nt;
    /* 1-2: packing of B (and A with spill_reload). Threads split along N whose block columns start on panel
     * boundaries pack only the panels of their own columns and need no barrier; otherwise the panels are split
     * between threads round-robin and every thread waits for all of them. */
    int64_t npb = mxfp8i_ceil_div(x->N, uk->nr);
    int own_b = shard_n && !x->Ap && x->NCb % uk->nr == 0;
    if (!x->b_ready) {
        if (own_b) {
            int64_t p0 = s0 * x->NCb / uk->nr, p1 = mxfp8i_ceil_div(s1 * x->NCb, uk->nr);
            if (p1 > npb) p1 = npb;
            if (p0 < p1) pack_panels(x, tid, x->b, 1, p0, p1, x->Bp + p0 * x->pb_stride, x->pb_stride);
        } else {
            const int64_t g = pack_step(x, x->b, npb, nt);
            for (int64_t p = tid * g; p < npb; p += nt * g)
                pack_panels(x, tid, x->b, 1, p, p + g < npb ? p + g : npb, x->Bp + p * x->pb_stride, x->pb_stride);
        }
    }
    if (x->Ap) {
        int64_t npa = mxfp8i_ceil_div(x->M, uk->mr);
        const int64_t g = pack_step(x, x->a, npa, nt);
        for (int64_t p = tid * g; p < npa; p += nt * g)
            pack_panels(x, tid, x->a, 0, p, p + g < npa ? p + g : npa, x->Ap + p * x->pa_stride, x->pa_stride);
    }
#ifdef _OPENMP
    if (nt > 1 && !own_b) {
#pragma omp barrier
    }
#endif
    /* 3: this thread's share of blocks along the shard axis. */
    int d[3];
    loop_dims(x->cfg->block_loop_order, d);
    int m_first = 1;
    for (int q = 0; q < 3; q++) {
        if (d[q] == 0) { m_first = 1; break; }
        if (d[q] == 1) { m_first = 0; break; }
    }
    int64_t packed_mb = -1;
    int64_t mlo = shard_n ? 0 : s0, mhi = shard_n ? nother : s1;
    int64_t nlo = shard_n ? s0 : 0, nhi = shard_n ? s1 : nother;
    if (x->coop) {
        /* Every thread needs every block row of A (its share is a range of block columns): the threads pack each
         * block row's panels together, once, into one of two shared buffers. One barrier per block row: a thread
         * packs row mb + 2 into the buffer of row mb only after every thread has packed row mb + 1, i.e. after
         * every thread has finished its blocks of row mb. */
        for (int64_t mb = 0; mb < x->MB; mb++) {
            int64_t m0 = mb * x->MCb, m1 = m0 + x->MCb < x->M ? m0 + x->MCb : x->M;
            int64_t np = mxfp8i_ceil_div(m1 - m0, uk->mr);
            char *buf = x->ash[mb & 1];
            const int64_t pm = m0 / uk->mr;
            const int64_t g = pack_step(x, x->a, np, nt);
            /* each thread a contiguous range of the row's panels: the rows a caller's own threads wrote, split the
               same way (the MoE's elementwise work splits positions so), are read from this thread's cache */
            const int64_t q0 = np * tid / nt, q1 = np * (tid + 1) / nt;
            for (int64_t p = q0; p < q1; p += g)
                pack_panels(x, tid, x->a, 0, pm + p, pm + (p + g < q1 ? p + g : q1), buf + p * x->pa_stride,
                            x->pa_stride);
#ifdef _OPENMP
            if (nt > 1) {
#pragma omp barrier
            }
#endif
            for (int64_t nb = nlo; nb < nhi; nb++) run_block(x, tid, mb, nb, &packed_mb, buf);
        }
    } else if (m_first) {
        for (int64_t mb = mlo; mb < mhi; mb++)
            for (int64_t nb = nlo; nb < nhi; nb++) run_block(x, tid, mb, nb, &packed_mb, NULL);
    } else {
        for (int64_t nb = nlo; nb < nhi; nb++)
            for (int64_t mb = mlo; mb < mhi; mb++) run_block(x, tid, mb, nb, &packed_mb, NULL);
    }
}

static void write_zero_sum(const mxfp8_tensor *c, int64_t M, int64_t N, int accumulate, const float *bias) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            int64_t off = m * c->strides[0] + n * c->strides[1];
            if (accumulate) ((float *)c->data)[off] = ((float *)c->data)[off] + 0.0f;
            else mxfp8i_store_f32(c->data, c->dtype, off, bias ? 0.0f + bias[n] : 0.0f);
        }
}

/* Bytes of each buffer of one GEMM (gemm_ctx fields already planned); false on overflow. */
typedef struct gemm_sizes {
    int64_t B, A, Ablk, C, S, T;
} gemm_sizes;
static bool buffer_sizes(const gemm_ctx *x, gemm_sizes *z) {
    const mxfp8i_ukernel *uk = x->uk;
    const int64_t M = x->M, N = x->N, K = x->K, bm = x->MCb < M ? x->MCb : M;
    const int64_t npa = mxfp8i_ceil_div(M, uk->mr), npb = mxfp8i_ceil_div(N, uk->nr);
    const int64_t wmax = uk->mr > uk->nr ? uk->mr : uk->nr;
    return mxfp8i_mul_size(npb, x->pb_stride, &z->B) && mxfp8i_mul_size(npa, x->pa_stride, &z->A) &&
           mxfp8i_mul_size(mxfp8i_ceil_div(bm, uk->mr), x->pa_stride, &z->Ablk) &&
           mxfp8i_mul_size(bm, x->ldcb * 4, &z->C) && mxfp8i_mul_size(wmax * SCRATCH_PER_COL, K, &z->S) &&
           mxfp8i_mul_size(K + wmax * PACK_GROUP * mxfp8i_ceil_div(K, 32) / 4 + 16, 4, &z->T);
}

/* The per-thread layout of the threads' slot: accumulators, scratch, tmp, A block row, each 64-byte aligned. */
static bool thread_layout(gemm_ctx *x, const gemm_sizes *z) {
    const int need_abuf = !x->cfg->spill_reload && !x->coop;
    int64_t off = mxfp8i_round_up(z->C, 64);
    x->off_s = off;
    off += mxfp8i_round_up(z->S, 64);
    x->off_t = off;
    off += mxfp8i_round_up(z->T, 64);
    x->off_a = off;
    off += need_abuf ? mxfp8i_round_up(z->Ablk, 64) : 0;
    x->tstride = off;
    int64_t all;
    return mxfp8i_mul_size(off, x->nt, &all);
}

/* Every buffer of the GEMM, slots of the scope's arena; false when one cannot be allocated. */
static bool get_buffers(gemm_ctx *x, const gemm_sizes *z, int kslot, uint64_t bkey) {
    const mxfp8_matmul_config *cfg = x->cfg;
    if (kslot >= 0) x->Bp = mxfp8i_ws_keyed(kslot, bkey, x->uk, (size_t)z->B, &x->b_ready); /* b_ready: packed before */
    else x->Bp = mxfp8i_ws_get(MXFP8I_WS_GEMM_B, (size_t)z->B);
    if (cfg->spill_reload) x->Ap = mxfp8i_ws_get(MXFP8I_WS_GEMM_A, (size_t)z->A);
    if (x->coop) {
        x->ash[0] = mxfp8i_ws_get(MXFP8I_WS_GEMM_ASH0, (size_t)z->Ablk);
        x->ash[1] = mxfp8i_ws_get(MXFP8I_WS_GEMM_ASH1, (size_t)z->Ablk);
    }
    x->tbuf = mxfp8i_ws_get(MXFP8I_WS_GEMM_THREADS, (size_t)(x->tstride * x->nt));
    return x->Bp && (!cfg->spill_reload || x->Ap) && (!x->coop || (x->ash[0] && x->ash[1])) && x->tbuf;
}

/* The blocking of one GEMM: block sizes, thread count (never more than blocks along the shard axis), panel
 * strides, and whether the threads share the packing of A's block rows. */
static void plan(gemm_ctx *x, const mxfp8_matmul_config *cfg, int nt) {
    const mxfp8i_ukernel *uk = x->uk;
    x->MCb = cfg->tile_m * cfg->tiles_in_block_m;
    x->NCb = cfg->tile_n * cfg->tiles_in_block_n;
    x->MB = mxfp8i_ceil_div(x->M, x->MCb);
    x->NB = mxfp8i_ceil_div(x->N, x->NCb);
    int64_t nsh = cfg->lnc_2_shard_rhs ? x->NB : x->MB;
    x->nt = nt > nsh ? (int)nsh : nt;
    int64_t bn = x->NCb < x->N ? x->NCb : x->N;
    x->ldcb = mxfp8i_round_up(bn, 16);
    x->pa_stride = mxfp8i_round_up(uk->panel_bytes(x->K, uk->mr), 64);
    x->pb_stride = mxfp8i_round_up(uk->panel_bytes(x->K, uk->nr), 64);
    /* Shared A block rows: threads split along N walk the block rows in the same order (block_loop_order with m
     * before n) and need all of them; packing each once instead of once per thread (spill_reload = 0 only). */
    int d[3], m_first = 1;
    loop_dims(cfg->block_loop_order, d);
    for (int q = 0; q < 3; q++) {
        if (d[q] == 0) { m_first = 1; break; }
        if (d[q] == 1) { m_first = 0; break; }
    }
    x->coop = x->nt > 1 && !cfg->spill_reload && cfg->lnc_2_shard_rhs && m_first;
}

static void run_threads(const gemm_ctx *x) {
    unsigned csr = mxfp8i_fenv_enter();
    if (x->nt == 1) {
        thread_body(x, 0, 1);
    } else {
#ifdef _OPENMP
#pragma omp parallel num_threads(x->nt)
        {
            /* If the runtime gives fewer threads, the shares follow the real count (buffers exist for nt). */
            unsigned wcsr = mxfp8i_fenv_enter();
            thread_body(x, omp_get_thread_num(), omp_get_num_threads());
            mxfp8i_fenv_leave(wcsr);
        }
#else
        thread_body(x, 0, 1);
#endif
    }
    mxfp8i_fenv_leave(csr);
}

/* The plan shared by a GEMM and its reservation: x (kernel, dimensions, blocking, thread split) with its resolved
 * config in *cfg (config NULL = defaults; 1 thread unless run_with_lnc2) and the buffer sizes z. False on a size
 * overflow. */
static bool prepare(gemm_ctx *x, mxfp8_matmul_config *cfg, gemm_sizes *z, const mxfp8_matmul_config *config,
                    int64_t M, int64_t N, int64_t K, int num_threads) {
    mxfp8_matmul_config defaults;
    if (!config) {
        mxfp8_matmul_config_init(&defaults);
        config = &defaults;
    }
    const int nt = num_threads < 1 || !config->run_with_lnc2 ? 1 : num_threads;
    memset(x, 0, sizeof *x);
    x->uk = mxfp8i_gemm_ukernel();
    mxfp8i_gemm_resolve(config, x->uk, M, N, K, nt, cfg);
    x->cfg = cfg;
    x->M = M;
    x->N = N;
    x->K = K;
    plan(x, cfg, nt);
    return buffer_sizes(x, z) && thread_layout(x, z);
}

static mxfp8_status gemm_scoped(const mxfp8i_gop *a, const mxfp8i_gop *b, const mxfp8_matmul_config *config,
                                int accumulate, const float *bias, const mxfp8_tensor *c, int num_threads);

mxfp8_status mxfp8i_gemm_gop(const mxfp8i_gop *a, const mxfp8i_gop *b, const mxfp8_matmul_config *config,
                             int accumulate, const mxfp8_tensor *c, int num_threads) {
    return mxfp8i_gemm_gop_bias(a, b, config, accumulate, NULL, c, num_threads);
}

mxfp8_status mxfp8i_gemm_gop_bias(const mxfp8i_gop *a, const mxfp8i_gop *b, const mxfp8_matmul_config *config,
                                  int accumulate, const float *bias, const mxfp8_tensor *c, int num_threads) {
    /* The buffers come from the open scope's arena (a private one when this GEMM runs alone). */
    mxfp8i_scope scope;
    if (mxfp8i_scope_begin(&scope, NULL)) return MXFP8_ERR_OUT_OF_MEMORY;
    mxfp8_status st = gemm_scoped(a, b, config, accumulate, bias, c, num_threads);
    mxfp8i_scope_end(&scope);
    return st;
}

static mxfp8_status gemm_scoped(const mxfp8i_gop *a, const mxfp8i_gop *b, const mxfp8_matmul_config *config,
                                int accumulate, const float *bias, const mxfp8_tensor *c, int num_threads) {
    int64_t M = a->R, N = b->R, K = a->K;
    /* A pending B key applies to this GEMM only, and only when its B operand is the one it was given for. */
    uint64_t bkey = 0;
    int kslot = mxfp8i_ws_take_bkey(b->data, &bkey);
    if (M == 0 || N == 0) return MXFP8_OK;
    if (K == 0) {
        unsigned csr = mxfp8i_fenv_enter();
        write_zero_sum(c, M, N, accumulate, bias);
        mxfp8i_fenv_leave(csr);
        return MXFP8_OK;
    }
    mxfp8_matmul_config cfg;
    gemm_ctx x;
    gemm_sizes z;
    if (!prepare(&x, &cfg, &z, config, M, N, K, num_threads)) return MXFP8_ERR_OUT_OF_MEMORY;
    x.to_bf16 = mxfp8i_kernels_get()->quant->to_bf16;
    x.add_f32 = mxfp8i_kernels_get()->quant->add_f32;
    x.a = a;
    x.b = b;
    x.accumulate = accumulate;
    x.bias = bias;
    x.c = c;
    if (!get_buffers(&x, &z, kslot, bkey)) return MXFP8_ERR_OUT_OF_MEMORY;
    run_threads(&x);
    if (kslot >= 0) mxfp8i_ws_keyed_done(kslot, bkey, x.uk);
    return MXFP8_OK;
}

mxfp8_status mxfp8i_gemm_reserve(int64_t M, int64_t N, int64_t K, const mxfp8_matmul_config *config, int num_threads,
                                 int keyed_slot) {
    if (M <= 0 || N <= 0 || K <= 0) return MXFP8_OK;
    mxfp8_matmul_config cfg;
    gemm_ctx x;
    gemm_sizes z;
    if (!prepare(&x, &cfg, &z, config, M, N, K, num_threads)) return MXFP8_ERR_OUT_OF_MEMORY;
    return get_buffers(&x, &z, keyed_slot, 0) ? MXFP8_OK : MXFP8_ERR_OUT_OF_MEMORY;
}

/* ---- segmented accumulation: C += A_0 B_0^T, then C += A_1 B_1^T, ... (gemm.h, mxfp8i_gemm_segments) ----
 * Threads split C along the shard axis (columns of register tiles when sharded along N, else rows), so of the
 * operand along that axis (the owned one: B when sharded along N, else A) each thread uses only its own panels, and
 * of the other one (the shared one) every panel. The shared operand's panels of every segment are packed first
 * (threads share them round-robin, one barrier). Then each thread takes its owned panels PACK_GROUP at a time: it
 * packs those panels of every segment into its own buffer (so they are in cache when used, and never travel between
 * threads) and runs their register tiles against every panel of the shared operand, each tile through
 * all segments in order: the segment's chain over its K_s from +0, added to the tile's running value (held in L1
 * from the first segment to the last). Each C element therefore receives, segment after segment, the same
 * additions the separate GEMMs would make, while the block of C stays in cache across the segments instead of
 * travelling to memory and back once per segment. */

/* Segment s of a segmented call as a gemm_ctx of its own (its operands, K_s, panels and their strides). */
static void seg_ctx(const gemm_ctx *x, const mxfp8i_gop *a, const mxfp8i_gop *b, char *Ap, char *Bp, gemm_ctx *s) {
    *s = *x;
    s->a = a;
    s->b = b;
    s->K = a->K;
    s->pa_stride = mxfp8i_round_up(x->uk->panel_bytes(a->K, x->uk->mr), 64);
    s->pb_stride = mxfp8i_round_up(x->uk->panel_bytes(a->K, x->uk->nr), 64);
    s->Ap = Ap;
    s->Bp = Bp;
    s->coop = 0;
    s->b_ready = 0;
}

typedef struct seg_call {
    const gemm_ctx *x;
    gemm_ctx *segs; /* [nseg] */
    int nseg;
    int c_zero;     /* C holds +0 everywhere: not read, the running values start at +0 */
    int stream;     /* C is an output written once: F32 tiles stored past the caches (the registry's copy_f32) */
} seg_call;

/* Whether a segmented call shards C along N (the owned operand is B). */
static int seg_shard_n(const gemm_ctx *x) { return x->cfg->lnc_2_shard_rhs != 0; }

/* Register tile (pm, pn) of C through every segment: ap[s], bp[s] are its A and B panels of segment s. */
static void seg_tile(const seg_call *sc, int tid, int64_t pm, int64_t pn, const char *const *ap,
                     const char *const *bp) {
    const gemm_ctx *x = sc->x;
    const mxfp8i_ukernel *uk = x->uk;
    const mxfp8_tensor *c = x->c;
    const int64_t cs0 = c->strides[0], cs1 = c->strides[1], tk = x->cfg->tile_k;
    float *acc = (float *)(x->tbuf + tid * x->tstride + x->off_acc), *ct = acc + uk->mr * uk->nr;
    const int ld = uk->nr;
    const int64_t m0 = pm * uk->mr, n0 = pn * uk->nr;
    const int mr = (int)(x->M - m0 < uk->mr ? x->M - m0 : uk->mr);
    const int nr = (int)(x->N - n0 < uk->nr ? x->N - n0 : uk->nr);
    const int bf16 = c->dtype == MXFP8_DTYPE_BF16; /* with c_zero: the sums rounded once at the end */
    float *dst = bf16 ? NULL : (float *)c->data + m0 * cs0 + n0 * cs1;
    for (int i = 0; i < mr && !sc->c_zero; i++)
        if (cs1 == 1) /* short rows: a loop, not a memcpy call */
            for (int j = 0; j < nr; j++) acc[i * ld + j] = dst[i * cs0 + j];
        else
            for (int j = 0; j < nr; j++) acc[i * ld + j] = dst[i * cs0 + j * cs1];
    for (int sg = 0; sg < sc->nseg; sg++) { /* the segments in order */
        const gemm_ctx *g = &sc->segs[sg];
        /* c_zero: the first segment's chain is the running value itself (+0 + chain is the chain bit for bit: a
           chain from +0 is never -0, and a NaN passes unchanged), so it is not added */
        const int first = sg == 0 && sc->c_zero;
        float *out = first ? acc : ct;
        for (int64_t k0 = 0; k0 < g->K; k0 += tk) {
            const int64_t kc = (k0 + tk < g->K ? k0 + tk : g->K) - k0;
            uk->run(k0, kc, ap[sg], bp[sg], out, ld, mr, nr, k0 > 0);
        }
        if (!first) x->add_f32(ct, ld, acc, ld, mr, nr);
    }
    if (bf16) {
        uint16_t *d16 = (uint16_t *)c->data + m0 * cs0 + n0 * cs1;
        if (cs1 == 1) x->to_bf16(acc, ld, d16, cs0, mr, nr);
        else
            for (int i = 0; i < mr; i++)
                for (int j = 0; j < nr; j++) d16[i * cs0 + j * cs1] = mxfp8i_fp32_to_bf16(acc[i * ld + j]);
        return;
    }
    if (sc->stream && cs1 == 1) {
        x->copy_f32(acc, ld, dst, cs0, mr, nr);
        return;
    }
    for (int i = 0; i < mr; i++)
        if (cs1 == 1)
            for (int j = 0; j < nr; j++) dst[i * cs0 + j] = acc[i * ld + j];
        else
            for (int j = 0; j < nr; j++) dst[i * cs0 + j * cs1] = acc[i * ld + j];
}

static void seg_thread(const seg_call *sc, int tid, int nt) {
    const gemm_ctx *x = sc->x;
    const mxfp8i_ukernel *uk = x->uk;
    const int64_t npa = mxfp8i_ceil_div(x->M, uk->mr), npb = mxfp8i_ceil_div(x->N, uk->nr);
    const int own_b = seg_shard_n(x); /* the owned operand: B when C is sharded along N, else A */
    const int64_t nsh = own_b ? npb : npa, nother = own_b ? npa : npb;
    /* 1: every segment's panels of the shared operand, round-robin (one unit = up to pack_step consecutive panels) */
    int64_t unit = 0;
    for (int s = 0; s < sc->nseg; s++) {
        const gemm_ctx *g = &sc->segs[s];
        const mxfp8i_gop *op = own_b ? g->a : g->b;
        const int64_t stride = own_b ? g->pa_stride : g->pb_stride;
        char *dst = own_b ? g->Ap : g->Bp;
        const int64_t step = pack_step(g, op, nother, nt);
        for (int64_t p = 0; p < nother; p += step, unit++)
            if (unit % nt == tid)
                pack_panels(g, tid, op, !own_b, p, p + step < nother ? p + step : nother, dst + p * stride, stride);
    }
#ifdef _OPENMP
    if (nt > 1) {
#pragma omp barrier
    }
#endif
    /* 2: this thread's owned panels, PACK_GROUP at a time: packed for every segment into the thread's own buffer,
     * then their register tiles against every panel of the shared operand */
    const int64_t s0 = nsh * tid / nt, s1 = nsh * (tid + 1) / nt;
    char *own = x->tbuf + tid * x->tstride + x->off_own;
    const char **ap = (const char **)(x->tbuf + tid * x->tstride + x->off_ptrs), **bp = ap + sc->nseg,
               **ob = bp + sc->nseg;
    for (int64_t p0 = s0; p0 < s1; p0 += PACK_GROUP) { /* PACK_GROUP owned panels at a time (pack_panels) */
        const int64_t p1 = p0 + PACK_GROUP < s1 ? p0 + PACK_GROUP : s1;
        char *q = own;
        for (int s = 0; s < sc->nseg; s++) {
            const gemm_ctx *g = &sc->segs[s];
            const int64_t stride = own_b ? g->pb_stride : g->pa_stride;
            pack_panels(g, tid, own_b ? g->b : g->a, own_b, p0, p1, q, stride);
            ob[s] = q;
            q += (p1 - p0) * stride;
        }
        for (int64_t po = p0; po < p1; po++)
            for (int64_t pt = 0; pt < nother; pt++) {
                for (int s = 0; s < sc->nseg; s++) {
                    const gemm_ctx *g = &sc->segs[s];
                    if (own_b) {
                        ap[s] = g->Ap + pt * g->pa_stride;
                        bp[s] = ob[s] + (po - p0) * g->pb_stride;
                    } else {
                        ap[s] = ob[s] + (po - p0) * g->pa_stride;
                        bp[s] = g->Bp + pt * g->pb_stride;
                    }
                }
                seg_tile(sc, tid, own_b ? pt : po, own_b ? po : pt, ap, bp);
            }
    }
}

/* The per-thread area of a segmented call: the thread layout of a GEMM plus the two register-tile buffers, the
 * owned panel of every segment (own_bytes) and the segments' panel pointers. */
static void seg_layout(gemm_ctx *x, int64_t own_bytes, int nseg) {
    x->off_acc = x->tstride;
    x->tstride += mxfp8i_round_up((int64_t)x->uk->mr * x->uk->nr * 2 * (int64_t)sizeof(float), 64);
    x->off_own = x->tstride;
    x->tstride += mxfp8i_round_up(own_bytes, 64);
    x->off_ptrs = x->tstride;
    x->tstride += mxfp8i_round_up(3 * (int64_t)nseg * (int64_t)sizeof(char *), 64);
}

/* Bytes of the shared operand's panels of nseg segments (the A panels when C is sharded along N, else the B
 * panels) and of one owned panel of every segment: the contractions a[s].K (a = NULL: Kmax each). */
static bool seg_bytes(const gemm_ctx *x, const mxfp8i_gop *a, int nseg, int64_t Kmax, int64_t *shared,
                      int64_t *own) {
    const mxfp8i_ukernel *uk = x->uk;
    const int shard_n = seg_shard_n(x);
    const int64_t np = shard_n ? mxfp8i_ceil_div(x->M, uk->mr) : mxfp8i_ceil_div(x->N, uk->nr);
    *shared = *own = 0;
    for (int s = 0; s < nseg; s++) {
        const int64_t k = a ? a[s].K : Kmax, pa = mxfp8i_round_up(uk->panel_bytes(k, uk->mr), 64),
                      pb = mxfp8i_round_up(uk->panel_bytes(k, uk->nr), 64);
        int64_t sz;
        if (!mxfp8i_mul_size(np, shard_n ? pa : pb, &sz)) return false;
        *shared += sz;
        *own += PACK_GROUP * (shard_n ? pb : pa);
        if (*shared < 0 || *own < 0) return false;
    }
    return true;
}

mxfp8_status mxfp8i_gemm_segments(const mxfp8i_gop *a, const mxfp8i_gop *b, int nseg, int c_zero, int stream,
                                  const mxfp8_matmul_config *config, const mxfp8_tensor *c, int num_threads) {
    if (nseg <= 0 || a[0].R == 0 || b[0].R == 0) return MXFP8_OK;
    int64_t Kmax = 0;
    for (int s = 0; s < nseg; s++)
        if (a[s].K > Kmax) Kmax = a[s].K;
    /* The buffers come from the open scope's arena (a private one when this GEMM runs alone). */
    mxfp8i_scope scope;
    if (mxfp8i_scope_begin(&scope, NULL)) return MXFP8_ERR_OUT_OF_MEMORY;
    mxfp8_status st = MXFP8_ERR_OUT_OF_MEMORY;
    mxfp8_matmul_config cfg;
    gemm_ctx x;
    gemm_sizes z;
    int64_t shb, ownb;
    if (!prepare(&x, &cfg, &z, config, a[0].R, b[0].R, Kmax, num_threads) ||
        !seg_bytes(&x, a, nseg, 0, &shb, &ownb))
        goto done;
    x.to_bf16 = mxfp8i_kernels_get()->quant->to_bf16;
    x.add_f32 = mxfp8i_kernels_get()->quant->add_f32;
    x.copy_f32 = mxfp8i_kernels_get()->quant->copy_f32;
    x.accumulate = 1;
    x.c = c;
    x.coop = 0;
    seg_layout(&x, ownb, nseg);
    const int shard_n = seg_shard_n(&x); /* the shared operand's panels in its slot (A when sharded along N) */
    char *P = mxfp8i_ws_get(shard_n ? MXFP8I_WS_GEMM_A : MXFP8I_WS_GEMM_B, (size_t)shb);
    gemm_ctx *segs = (gemm_ctx *)mxfp8i_ws_get(MXFP8I_WS_GEMM_SEGS, sizeof(gemm_ctx) * (size_t)nseg);
    x.tbuf = mxfp8i_ws_get(MXFP8I_WS_GEMM_THREADS, (size_t)(x.tstride * x.nt));
    if (!P || !segs || !x.tbuf) goto done;
    for (int s = 0; s < nseg; s++) {
        seg_ctx(&x, &a[s], &b[s], shard_n ? P : NULL, shard_n ? NULL : P, &segs[s]);
        P += shard_n ? mxfp8i_ceil_div(x.M, x.uk->mr) * segs[s].pa_stride
                     : mxfp8i_ceil_div(x.N, x.uk->nr) * segs[s].pb_stride;
    }
    seg_call sc = {&x, segs, nseg, c_zero, stream};
    unsigned csr = mxfp8i_fenv_enter();
    if (x.nt == 1) {
        seg_thread(&sc, 0, 1);
    } else {
#ifdef _OPENMP
#pragma omp parallel num_threads(x.nt)
        {
            unsigned wcsr = mxfp8i_fenv_enter();
            seg_thread(&sc, omp_get_thread_num(), omp_get_num_threads());
            mxfp8i_fenv_leave(wcsr);
        }
#else
        seg_thread(&sc, 0, 1);
#endif
    }
    mxfp8i_fenv_leave(csr);
    st = MXFP8_OK;
done:
    mxfp8i_scope_end(&scope);
    return st;
}

mxfp8_status mxfp8i_gemm_segments_reserve(int64_t M, int64_t N, int64_t Kmax, int nseg,
                                          const mxfp8_matmul_config *config, int num_threads) {
    if (M <= 0 || N <= 0 || Kmax <= 0 || nseg <= 0) return MXFP8_OK;
    mxfp8_matmul_config cfg;
    gemm_ctx x;
    gemm_sizes z;
    int64_t shb, ownb;
    if (!prepare(&x, &cfg, &z, config, M, N, Kmax, num_threads) || !seg_bytes(&x, NULL, nseg, Kmax, &shb, &ownb))
        return MXFP8_ERR_OUT_OF_MEMORY;
    seg_layout(&x, ownb, nseg);
    return mxfp8i_ws_get(seg_shard_n(&x) ? MXFP8I_WS_GEMM_A : MXFP8I_WS_GEMM_B, (size_t)shb) &&
                   mxfp8i_ws_get(MXFP8I_WS_GEMM_SEGS, sizeof(gemm_ctx) * (size_t)nseg) &&
                   mxfp8i_ws_get(MXFP8I_WS_GEMM_THREADS, (size_t)(x.tstride * x.nt))
               ? MXFP8_OK
               : MXFP8_ERR_OUT_OF_MEMORY;
}
