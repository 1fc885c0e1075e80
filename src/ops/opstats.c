/*
 * opstats.c -- the statistics pass over a GEMM operand (opstats.h): chunks of rows quantized into scratch codes by the
 * registry's quantize panels (src/quant/panel.c) with the operand's rounding and a per-thread accumulator. Rows with
 * unit stride along K are read in place (rows geometry), [K, R]-contiguous operands (transposed views) down their
 * columns (cols geometry); any other arrangement (swizzled, general strides) is first loaded row by row into FP32
 * (exact), which gives the same codes since the quantizer sees the same values.
 */
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "../quant/panel.h"
#include "../runtime/workspace.h"
#include "opstats.h"

/* Rows [r0, r0 + n) of op: quantized into codes (n * K bytes of scratch; f32: n * K floats for loaded rows). */
static void stats_chunk(const mxfp8i_gop *op, int64_t r0, int64_t n, uint8_t *codes, float *f32, mxfp8i_qstats *st) {
    const int64_t K = op->K;
    const size_t es = mxfp8_dtype_size(op->dtype);
    mxfp8i_qpanel p;
    memset(&p, 0, sizeof p);
    p.src_dtype = op->dtype, p.lines = n, p.K = K;
    p.fmt = op->rc.fmt, p.rule = op->rc.rule, p.group = op->rc.group;
    p.out = codes, p.out_dtype = MXFP8_DTYPE_U8;
    p.sr = mxfp8i_gop_sround(op, r0);
    p.stats = st;
    if (!op->swizzled && op->s1 == 1) { /* rows in place */
        p.src = op->data + r0 * op->s0 * (int64_t)es;
        p.src_ls = op->s0, p.src_ks = 1, p.out_ls = K, p.out_ks = 1;
    } else if (!op->swizzled && op->s0 == 1) { /* a transposed view: down the columns */
        p.src = op->data + r0 * (int64_t)es;
        p.src_ls = 1, p.src_ks = op->s1, p.out_ls = 1, p.out_ks = n;
    } else { /* any other arrangement: the exact FP32 rows first */
        for (int64_t i = 0; i < n; i++) mxfp8i_gop_load_row(op, r0 + i, f32 + i * K);
        p.src = f32, p.src_dtype = MXFP8_DTYPE_F32;
        p.src_ls = K, p.src_ks = 1, p.out_ls = K, p.out_ks = 1;
    }
    mxfp8i_quantize_panel(&p);
}

/* Rows per chunk (whole SIMD widths, ~64 KiB of elements) and a bound on a chunk's elements, monotone in K. */
static int64_t chunk_rows(int64_t K) { return mxfp8i_round_up(mxfp8i_ceil_div(65536, K), 32); }
static size_t chunk_bound(int64_t K) { return (size_t)(65536 + 33 * K); }

/* A scratch buffer: the scope's slot, else (no scope open) malloc'ed and owned by the caller. */
static void *scratch(int slot, size_t bytes, int *owned) {
    void *p = mxfp8i_ws_get(slot, bytes);
    *owned = !p;
    return p ? p : malloc(bytes);
}

mxfp8_status mxfp8i_gop_stats_reserve(int64_t Kmax, int nt) {
    if (Kmax < 1) Kmax = 1;
    if (nt < 1) nt = 1;
    const size_t c = (size_t)nt * chunk_bound(Kmax);
    if (!mxfp8i_ws_get(MXFP8I_WS_STATS_ACC, (size_t)nt * sizeof(mxfp8i_qstats)) ||
        !mxfp8i_ws_get(MXFP8I_WS_STATS_CODES, c) || !mxfp8i_ws_get(MXFP8I_WS_STATS_F32, c * sizeof(float)))
        return MXFP8_ERR_OUT_OF_MEMORY;
    return MXFP8_OK;
}

mxfp8_status mxfp8i_gop_stats(const mxfp8i_gop *op, int nt) {
    const int64_t R = op->R, K = op->K;
    mxfp8i_qstats *st = op->stats;
    if (!st || op->prequant || R <= 0 || K <= 0) return MXFP8_OK;
    const int loaded = op->swizzled || (op->s1 != 1 && op->s0 != 1);
    int64_t n = chunk_rows(K);
    if (n > R) n = R;
    const int64_t chunks = mxfp8i_ceil_div(R, n);
    if (nt > chunks) nt = (int)chunks;
    if (nt < 1) nt = 1;
    int own_t = 0, own_c = 0, own_f = 0;
    mxfp8i_qstats *tst = (mxfp8i_qstats *)scratch(MXFP8I_WS_STATS_ACC, (size_t)nt * sizeof *tst, &own_t);
    uint8_t *codes = (uint8_t *)scratch(MXFP8I_WS_STATS_CODES, (size_t)nt * chunk_bound(K), &own_c);
    float *f32 = loaded ? (float *)scratch(MXFP8I_WS_STATS_F32, (size_t)nt * chunk_bound(K) * sizeof(float), &own_f)
                        : NULL;
    mxfp8_status rc = MXFP8_OK;
    if (!tst || !codes || (loaded && !f32)) {
        rc = MXFP8_ERR_OUT_OF_MEMORY;
    } else {
        for (int t = 0; t < nt; t++) mxfp8i_qstats_zero(&tst[t]);
        const size_t cb = chunk_bound(K);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
        for (int64_t c = 0; c < chunks; c++) {
#ifdef _OPENMP
            const int t = omp_get_thread_num();
#else
            const int t = 0;
#endif
            const int64_t r0 = c * n, m = R - r0 < n ? R - r0 : n;
            stats_chunk(op, r0, m, codes + t * cb, loaded ? f32 + t * cb : NULL, &tst[t]);
        }
        for (int t = 0; t < nt; t++) mxfp8i_qstats_merge(st, &tst[t]);
    }
    if (own_t) free(tst);
    if (own_c) free(codes);
    if (own_f) free(f32);
    return rc;
}
