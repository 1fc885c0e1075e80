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
#include "opstats.h"

/* Rows [r0, r0 + n) of op: quantized into codes (n * K bytes of scratch; f32: n * K floats for loaded rows). */
static void stats_chunk(const mxfp8i_gop *op, mxfp8_format fmt, mxfp8_scale_rule rule, mxfp8_group_scheme group,
                        int64_t r0, int64_t n, uint8_t *codes, float *f32, mxfp8i_qstats *st) {
    const int64_t K = op->K;
    const size_t es = mxfp8_dtype_size(op->dtype);
    mxfp8i_qpanel p;
    memset(&p, 0, sizeof p);
    p.src_dtype = op->dtype, p.lines = n, p.K = K;
    p.fmt = fmt, p.rule = rule, p.group = group;
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
        for (int64_t i = 0; i < n; i++) mxfp8i_gop_load_row(op, r0 + i, fmt, group, f32 + i * K);
        p.src = f32, p.src_dtype = MXFP8_DTYPE_F32;
        p.src_ls = K, p.src_ks = 1, p.out_ls = K, p.out_ks = 1;
    }
    mxfp8i_quantize_panel(&p);
}

mxfp8_status mxfp8i_gop_stats(const mxfp8i_gop *op, mxfp8_format fmt, mxfp8_scale_rule rule, mxfp8_group_scheme group,
                              int nt, mxfp8i_qstats *st) {
    const int64_t R = op->R, K = op->K;
    if (op->prequant || R <= 0 || K <= 0) return MXFP8_OK;
    const int loaded = op->swizzled || (op->s1 != 1 && op->s0 != 1);
    /* chunks of whole SIMD widths of rows, ~64 KiB of elements each */
    int64_t n = mxfp8i_ceil_div(65536, K);
    n = mxfp8i_round_up(n < 1 ? 1 : n, 32);
    if (n > R) n = R;
    const int64_t chunks = mxfp8i_ceil_div(R, n);
    if (nt > chunks) nt = (int)chunks;
    if (nt < 1) nt = 1;
    mxfp8i_qstats *tst = (mxfp8i_qstats *)calloc((size_t)nt, sizeof *tst);
    uint8_t *codes = (uint8_t *)malloc((size_t)(nt * n * K));
    float *f32 = loaded ? (float *)malloc((size_t)(nt * n * K) * sizeof(float)) : NULL;
    if (!tst || !codes || (loaded && !f32)) {
        free(tst), free(codes), free(f32);
        return MXFP8_ERR_OUT_OF_MEMORY;
    }
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
    for (int64_t c = 0; c < chunks; c++) {
#ifdef _OPENMP
        const int t = omp_get_thread_num();
#else
        const int t = 0;
#endif
        const int64_t r0 = c * n, m = R - r0 < n ? R - r0 : n;
        stats_chunk(op, fmt, rule, group, r0, m, codes + t * n * K, loaded ? f32 + t * n * K : NULL, &tst[t]);
    }
    for (int t = 0; t < nt; t++) mxfp8i_qstats_merge(st, &tst[t]);
    free(tst), free(codes), free(f32);
    return MXFP8_OK;
}
