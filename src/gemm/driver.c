/*
 * driver.c -- the block-scaled GEMM driver: config resolution, packing, cache blocking, loop orders, thread split,
 * epilogue. Contract in gemm.h; microkernel contract in ukernel.h.
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
 *      tiles, accumulating in an FP32 workspace Cacc [M, N]. k is ascending in every loop order, so the FP32 sum of
 *      every element is the same sequence of fused multiply-adds whatever the order, blocking or thread count.
 *   4. Epilogue: the owner rounds its block once to C's dtype (RNE), or adds it to C (accumulate, F32).
 */
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "gemm.h"
#include "ukernel.h"

/* ---------------------------------------------------------------------------------------------------------- */
/* microkernel selection                                                                                       */
/* ---------------------------------------------------------------------------------------------------------- */
static const mxfp8i_ukernel k_ref = {"f32_gemm_8x32__ref", MXFP8I_PANEL_F32, MXFP8I_MR, MXFP8I_NR, 1,
                                     mxfp8i_f32_gemm_8x32__ref};
static const mxfp8i_ukernel k_avx512f = {"f32_gemm_8x32__avx512f", MXFP8I_PANEL_F32, MXFP8I_MR, MXFP8I_NR, 1,
                                         mxfp8i_f32_gemm_8x32__avx512f};

const mxfp8i_ukernel *mxfp8i_ref_ukernel(void) { return &k_ref; }
const mxfp8i_ukernel *mxfp8i_select_ukernel(void) {
#if defined(__x86_64__)
    if (mxfp8i_use_avx512()) return &k_avx512f;
#endif
    return &k_ref;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* config                                                                                                      */
/* ---------------------------------------------------------------------------------------------------------- */
void mxfp8_matmul_config_init(mxfp8_matmul_config *config) {
    if (!config) return;
    memset(config, 0, sizeof *config);
    config->block_loop_order = MXFP8_LOOP_MNK;
    config->tile_loop_order = MXFP8_LOOP_MNK;
    config->float8_dtype = MXFP8_FMT_E5M2;
    config->run_with_lnc2 = 1;
    config->lnc_2_shard_rhs = -1;
    config->spill_reload = 0;
    config->quant_scheme = MXFP8_GROUP_1X32;
    config->scale_rule = MXFP8_SCALE_NKI;
    config->output_dtype = MXFP8_DTYPE_BF16;
}

mxfp8_status mxfp8i_check_config(const char *fn, const char *name, const mxfp8_matmul_config *c) {
    const int64_t *sz[] = {&c->M, &c->K, &c->N, &c->tile_m, &c->tile_k, &c->tile_n, &c->tiles_in_block_m,
                           &c->tiles_in_block_n, &c->tiles_in_block_k, &c->tiles_in_load_m, &c->tiles_in_load_n};
    static const char *nm[] = {"M", "K", "N", "tile_m", "tile_k", "tile_n", "tiles_in_block_m", "tiles_in_block_n",
                               "tiles_in_block_k", "tiles_in_load_m", "tiles_in_load_n"};
    for (int i = 0; i < 11; i++)
        if (*sz[i] < 0)
            return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: %s.%s = %lld is negative", fn, name, nm[i],
                                (long long)*sz[i]);
    if ((unsigned)c->block_loop_order > MXFP8_LOOP_KNM)
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: %s.block_loop_order %d is not a loop order", fn, name,
                            (int)c->block_loop_order);
    if ((unsigned)c->tile_loop_order > MXFP8_LOOP_KNM)
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: %s.tile_loop_order %d is not a loop order", fn, name,
                            (int)c->tile_loop_order);
    if ((unsigned)c->float8_dtype > MXFP8_FMT_E5M2)
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: %s.float8_dtype %d is not E4M3 (0) or E5M2 (1)", fn,
                            name, (int)c->float8_dtype);
    if ((unsigned)c->quant_scheme > MXFP8_GROUP_WRAPX)
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: %s.quant_scheme %d is not 1x32 (0) or wrapX (1)", fn,
                            name, (int)c->quant_scheme);
    if ((unsigned)c->scale_rule > MXFP8_SCALE_RCEIL)
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: %s.scale_rule %d is not a mxfp8_scale_rule", fn, name,
                            (int)c->scale_rule);
    if (c->lnc_2_shard_rhs < -1 || c->lnc_2_shard_rhs > 1)
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: %s.lnc_2_shard_rhs %d is not -1, 0 or 1", fn, name,
                            c->lnc_2_shard_rhs);
    if (!mxfp8i_is_float_dtype(c->output_dtype))
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: %s.output_dtype %d (%s) is not f32, bf16 or f16", fn,
                            name, (int)c->output_dtype, mxfp8_dtype_name(c->output_dtype));
    return MXFP8_OK;
}

static int64_t round_up(int64_t x, int64_t m) { return mxfp8i_ceil_div(x, m) * m; }

void mxfp8i_gemm_resolve(const mxfp8_matmul_config *in, int64_t M, int64_t N, int64_t K, int nthreads,
                         mxfp8_matmul_config *out) {
    *out = *in;
    out->M = M;
    out->N = N;
    out->K = K;
    out->tile_m = round_up(in->tile_m > 0 ? in->tile_m : 128, MXFP8I_MR);
    out->tile_n = round_up(in->tile_n > 0 ? in->tile_n : 256, MXFP8I_NR);
    out->tile_k = in->tile_k > 0 ? in->tile_k : 256;
    out->tiles_in_block_m = in->tiles_in_block_m > 0 ? in->tiles_in_block_m : 4;
    out->tiles_in_block_n = in->tiles_in_block_n > 0 ? in->tiles_in_block_n : 2;
    out->tiles_in_block_k = in->tiles_in_block_k > 0 ? in->tiles_in_block_k : 1;
    out->tiles_in_load_m = in->tiles_in_load_m > 0 ? in->tiles_in_load_m : 1;
    out->tiles_in_load_n = in->tiles_in_load_n > 0 ? in->tiles_in_load_n : 1;
    if (out->lnc_2_shard_rhs < 0) out->lnc_2_shard_rhs = N >= M;
    /* Give every thread at least one block along the shard axis when the problem allows (speed only). */
    if (nthreads > 1 && out->run_with_lnc2) {
        int64_t dim = out->lnc_2_shard_rhs ? N : M, tile = out->lnc_2_shard_rhs ? out->tile_n : out->tile_m;
        int64_t *tib = out->lnc_2_shard_rhs ? &out->tiles_in_block_n : &out->tiles_in_block_m;
        int64_t want = mxfp8i_ceil_div(mxfp8i_ceil_div(dim, nthreads), tile);
        if (want < 1) want = 1;
        if (*tib > want) *tib = want;
    }
}

/* ---------------------------------------------------------------------------------------------------------- */
/* packing                                                                                                     */
/* ---------------------------------------------------------------------------------------------------------- */
/* Panel of W (= MR or NR) rows of op starting at row r0, all of K: panel[k*W + i]. */
static void pack_panel(const mxfp8i_gop *op, const mxfp8_matmul_config *cfg, int64_t r0, int W, float *panel,
                       float *row, float *tmp) {
    int64_t K = op->K;
    for (int i = 0; i < W; i++) {
        if (r0 + i < op->R) {
            mxfp8i_gop_deq_row(op, r0 + i, cfg->float8_dtype, cfg->scale_rule, cfg->quant_scheme, row, tmp);
            for (int64_t k = 0; k < K; k++) panel[k * W + i] = row[k];
        } else {
            for (int64_t k = 0; k < K; k++) panel[k * W + i] = 0.0f;
        }
    }
}

static void *alloc_floats(int64_t n) {
    int64_t bytes;
    if (!mxfp8i_mul_size(n > 0 ? n : 1, 4, &bytes)) return NULL;
    bytes = round_up(bytes, 64);
    return aligned_alloc(64, (size_t)bytes);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* the driver                                                                                                  */
/* ---------------------------------------------------------------------------------------------------------- */
typedef struct gemm_ctx {
    const mxfp8i_gop *a, *b;
    const mxfp8_matmul_config *cfg;
    const mxfp8i_ukernel *uk;
    int accumulate;
    const mxfp8_tensor *c;
    int64_t M, N, K, MCb, NCb, MB, NB;
    float *Bp, *Ap, *Cacc;
    float **abuf, **row, **tmp; /* per thread */
    int nt;
} gemm_ctx;

static void loop_dims(mxfp8_loop_order o, int d[3]) { /* 0 = m, 1 = n, 2 = k; d[0] outermost */
    static const int tab[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    d[0] = tab[o][0];
    d[1] = tab[o][1];
    d[2] = tab[o][2];
}

static void epilogue(const gemm_ctx *x, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    const mxfp8_tensor *c = x->c;
    int64_t cs0 = c->strides[0], cs1 = c->strides[1];
    for (int64_t m = m0; m < m1; m++) {
        const float *src = x->Cacc + m * x->N;
        if (x->accumulate) {
            float *dst = (float *)c->data + m * cs0;
            for (int64_t n = n0; n < n1; n++) dst[n * cs1] = dst[n * cs1] + src[n];
        } else if (c->dtype == MXFP8_DTYPE_F32) {
            float *dst = (float *)c->data + m * cs0;
            for (int64_t n = n0; n < n1; n++) dst[n * cs1] = src[n];
        } else {
            for (int64_t n = n0; n < n1; n++) mxfp8i_store_f32(c->data, c->dtype, m * cs0 + n * cs1, src[n]);
        }
    }
}

/* One output block (mb, nb): all its tiles in tile_loop_order, then the epilogue. */
static void run_block(const gemm_ctx *x, int tid, int64_t mb, int64_t nb, int64_t *packed_mb) {
    const mxfp8_matmul_config *cfg = x->cfg;
    int64_t m0 = mb * x->MCb, m1 = m0 + x->MCb < x->M ? m0 + x->MCb : x->M;
    int64_t n0 = nb * x->NCb, n1 = n0 + x->NCb < x->N ? n0 + x->NCb : x->N;
    int64_t K = x->K;
    const float *Ablk;
    if (x->Ap) {
        Ablk = x->Ap + (m0 / MXFP8I_MR) * K * MXFP8I_MR;
    } else {
        if (*packed_mb != mb) {
            for (int64_t r = m0; r < m1; r += MXFP8I_MR)
                pack_panel(x->a, cfg, r, MXFP8I_MR, x->abuf[tid] + ((r - m0) / MXFP8I_MR) * K * MXFP8I_MR,
                           x->row[tid], x->tmp[tid]);
            *packed_mb = mb;
        }
        Ablk = x->abuf[tid];
    }
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
                for (int64_t n = i[1]; n < tn1; n += MXFP8I_NR) {
                    const float *bp = x->Bp + (n / MXFP8I_NR) * K * MXFP8I_NR + k0 * MXFP8I_NR;
                    int nr = (int)(tn1 - n < MXFP8I_NR ? tn1 - n : MXFP8I_NR);
                    for (int64_t m = i[0]; m < tm1; m += MXFP8I_MR) {
                        const float *ap = Ablk + ((m - m0) / MXFP8I_MR) * K * MXFP8I_MR + k0 * MXFP8I_MR;
                        int mr = (int)(tm1 - m < MXFP8I_MR ? tm1 - m : MXFP8I_MR);
                        x->uk->fn(kc, ap, bp, x->Cacc + m * x->N + n, x->N, mr, nr, k0 > 0);
                    }
                }
            }
    epilogue(x, m0, m1, n0, n1);
}

static void thread_body(const gemm_ctx *x, int tid, int nt) {
    int64_t K = x->K;
    /* 1-2: packing of B (and A with spill_reload), panels split between threads. */
    int64_t npb = mxfp8i_ceil_div(x->N, MXFP8I_NR);
    for (int64_t p = tid; p < npb; p += nt)
        pack_panel(x->b, x->cfg, p * MXFP8I_NR, MXFP8I_NR, x->Bp + p * K * MXFP8I_NR, x->row[tid], x->tmp[tid]);
    if (x->Ap) {
        int64_t npa = mxfp8i_ceil_div(x->M, MXFP8I_MR);
        for (int64_t p = tid; p < npa; p += nt)
            pack_panel(x->a, x->cfg, p * MXFP8I_MR, MXFP8I_MR, x->Ap + p * K * MXFP8I_MR, x->row[tid], x->tmp[tid]);
    }
#ifdef _OPENMP
    if (nt > 1) {
#pragma omp barrier
    }
#endif
    /* 3: this thread's share of blocks along the shard axis. */
    int shard_n = x->cfg->lnc_2_shard_rhs != 0;
    int64_t nsh = shard_n ? x->NB : x->MB, nother = shard_n ? x->MB : x->NB;
    int64_t s0 = nsh * tid / nt, s1 = nsh * (tid + 1) / nt;
    int d[3];
    loop_dims(x->cfg->block_loop_order, d);
    int m_first = 1;
    for (int q = 0; q < 3; q++) {
        if (d[q] == 0) { m_first = 1; break; }
        if (d[q] == 1) { m_first = 0; break; }
    }
    int64_t packed_mb = -1;
    int64_t outer0 = 0, outer1, inner0 = 0, inner1;
    /* outer loop over m blocks when m comes first in block_loop_order */
    int64_t mlo = shard_n ? 0 : s0, mhi = shard_n ? nother : s1;
    int64_t nlo = shard_n ? s0 : 0, nhi = shard_n ? s1 : nother;
    if (m_first) {
        outer0 = mlo; outer1 = mhi; inner0 = nlo; inner1 = nhi;
        for (int64_t mb = outer0; mb < outer1; mb++)
            for (int64_t nb = inner0; nb < inner1; nb++) run_block(x, tid, mb, nb, &packed_mb);
    } else {
        outer0 = nlo; outer1 = nhi; inner0 = mlo; inner1 = mhi;
        for (int64_t nb = outer0; nb < outer1; nb++)
            for (int64_t mb = inner0; mb < inner1; mb++) run_block(x, tid, mb, nb, &packed_mb);
    }
}

static void write_zero_sum(const mxfp8_tensor *c, int64_t M, int64_t N, int accumulate) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            int64_t off = m * c->strides[0] + n * c->strides[1];
            if (accumulate) ((float *)c->data)[off] = ((float *)c->data)[off] + 0.0f;
            else mxfp8i_store_f32(c->data, c->dtype, off, 0.0f);
        }
}

mxfp8_status mxfp8i_gemm_gop(const mxfp8i_gop *a, const mxfp8i_gop *b, const mxfp8_matmul_config *config,
                             int accumulate, const mxfp8_tensor *c, int num_threads) {
    int64_t M = a->R, N = b->R, K = a->K;
    if (M == 0 || N == 0) return MXFP8_OK;
    if (K == 0) {
        write_zero_sum(c, M, N, accumulate);
        return MXFP8_OK;
    }
    mxfp8_matmul_config defaults, cfg;
    if (!config) {
        mxfp8_matmul_config_init(&defaults);
        config = &defaults;
    }
    int nt = num_threads < 1 ? 1 : num_threads;
    if (!config->run_with_lnc2) nt = 1;
    mxfp8i_gemm_resolve(config, M, N, K, nt, &cfg);
    gemm_ctx x;
    memset(&x, 0, sizeof x);
    x.a = a;
    x.b = b;
    x.cfg = &cfg;
    x.uk = mxfp8i_select_ukernel();
    x.accumulate = accumulate;
    x.c = c;
    x.M = M;
    x.N = N;
    x.K = K;
    x.MCb = cfg.tile_m * cfg.tiles_in_block_m;
    x.NCb = cfg.tile_n * cfg.tiles_in_block_n;
    x.MB = mxfp8i_ceil_div(M, x.MCb);
    x.NB = mxfp8i_ceil_div(N, x.NCb);
    /* Never more threads than blocks along the shard axis. */
    int64_t nsh = cfg.lnc_2_shard_rhs ? x.NB : x.MB;
    if (nt > nsh) nt = (int)nsh;
    x.nt = nt;
    mxfp8_status st = MXFP8_ERR_OUT_OF_MEMORY;
    int64_t pa = mxfp8i_ceil_div(M, MXFP8I_MR) * MXFP8I_MR, pb = mxfp8i_ceil_div(N, MXFP8I_NR) * MXFP8I_NR, n1,
            n2, n3;
    if (!mxfp8i_mul_size(pb, K, &n1) || !mxfp8i_mul_size(pa, K, &n2) || !mxfp8i_mul_size(M, N, &n3)) return st;
    x.Bp = alloc_floats(n1);
    x.Cacc = alloc_floats(n3);
    if (cfg.spill_reload) x.Ap = alloc_floats(n2);
    x.abuf = calloc((size_t)nt, sizeof(float *));
    x.row = calloc((size_t)nt, sizeof(float *));
    x.tmp = calloc((size_t)nt, sizeof(float *));
    int ok = x.Bp && x.Cacc && (!cfg.spill_reload || x.Ap) && x.abuf && x.row && x.tmp;
    for (int t = 0; ok && t < nt; t++) {
        x.row[t] = alloc_floats(K);
        x.tmp[t] = alloc_floats(K);
        if (!cfg.spill_reload) x.abuf[t] = alloc_floats(round_up(x.MCb, MXFP8I_MR) * K);
        ok = x.row[t] && x.tmp[t] && (cfg.spill_reload || x.abuf[t]);
    }
    if (ok) {
        if (nt == 1) {
            thread_body(&x, 0, 1);
        } else {
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
            {
                int tid = omp_get_thread_num(), n = omp_get_num_threads();
                /* If the runtime gave fewer threads, the shares are recomputed from the real count. */
                thread_body(&x, tid, n);
            }
#else
            thread_body(&x, 0, 1);
#endif
        }
        st = MXFP8_OK;
    }
    for (int t = 0; t < nt; t++) {
        if (x.row) free(x.row[t]);
        if (x.tmp) free(x.tmp[t]);
        if (x.abuf) free(x.abuf[t]);
    }
    free(x.row);
    free(x.tmp);
    free(x.abuf);
    free(x.Bp);
    free(x.Ap);
    free(x.Cacc);
    return st;
}

mxfp8_status mxfp8i_gemm(const mxfp8_operand *a, const mxfp8_operand *b, const mxfp8_matmul_config *config,
                         int accumulate, mxfp8_tensor *c, int num_threads) {
    mxfp8_matmul_config defaults;
    if (!config) {
        mxfp8_matmul_config_init(&defaults);
        config = &defaults;
    }
    mxfp8i_gop ga, gb;
    mxfp8_status st;
    int a_x4 = a->values.dtype == MXFP8_DTYPE_U32 && !a->swizzled;
    int64_t hint = config->K > 0 ? config->K : -1;
    if (a_x4 && hint < 0) {
        if ((st = mxfp8i_gop_from_operand("mxfp8_gemm", "b", b, -1, config->float8_dtype, config->quant_scheme,
                                          &gb)))
            return st;
        hint = gb.x4 && !gb.swizzled ? -1 : gb.K;
    }
    if ((st = mxfp8i_gop_from_operand("mxfp8_gemm", "a", a, hint, config->float8_dtype, config->quant_scheme, &ga)))
        return st;
    if ((st = mxfp8i_gop_from_operand("mxfp8_gemm", "b", b, ga.K, config->float8_dtype, config->quant_scheme, &gb)))
        return st;
    return mxfp8i_gemm_gop(&ga, &gb, config, accumulate, c, num_threads);
}
