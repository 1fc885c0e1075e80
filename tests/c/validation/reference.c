/* reference.c -- test_validation: the GEMM golden references and mxfp8_compare. */
#include "harness.h"

static void q_src_rank0(fx *f) { f->t[0].ndim = 0; } /* as quant.c: operand a 0-D */
/* ======================================================================================================== */
/* goldens, compare, runtime                                                                                 */
/* ======================================================================================================== */
static mxfp8_status call_gold_u(fx *f) {
    return mxfp8_gemm_golden_unquantized(f->tp[0], f->tp[1], f->quantized, f->tp[2]); /* quantized: round_to_bf16 */
}
static mxfp8_status call_gold_q(fx *f) { return mxfp8_gemm_golden_quantized(f->tp[0], f->tp[1], f->qpp, f->tp[2]); }
static void setup_gold_u(fx *f) {
    f->fn = "mxfp8_gemm_golden_unquantized";
    f->call = call_gold_u;
    f->quantized = 1;
    add(f, "a", MXFP8_DTYPE_F32, 2, 5, 40, 0, 0, F_BYPTR);
    add(f, "b", MXFP8_DTYPE_BF16, 2, 7, 40, 0, 0, F_BYPTR);
    add(f, "c", MXFP8_DTYPE_F32, 2, 5, 7, 0, 0, F_BYPTR | F_OUT);
}
static void setup_gold_q(fx *f) {
    setup_gold_u(f);
    f->fn = "mxfp8_gemm_golden_quantized";
    f->call = call_gold_q;
    f->t[2].dtype = MXFP8_DTYPE_F64;
    f->qp = mxfp8_quant_params_default();
    f->qpp = &f->qp;
}
static void gu_round(fx *f) { f->quantized = 2; }
static const special sp_gold_u[] = {
    {"c f16", q_src_rank0, MXFP8_ERR_SHAPE_MISMATCH, "a", NULL},
    {"round_to_bf16 2", gu_round, MXFP8_ERR_INVALID_ARGUMENT, "round_to_bf16", "2"},
};
static void gq_fmt(fx *f) { f->qp.fmt = (mxfp8_format)4; }
static void gq_rule(fx *f) { f->qp.rule = (mxfp8_scale_rule)-2; }
static void gq_group(fx *f) { f->qp.group = (mxfp8_group_scheme)9; }
static const special sp_gold_q[] = {
    {"params->fmt 4", gq_fmt, MXFP8_ERR_INVALID_ARGUMENT, "fmt", "4"},
    {"params->rule -2", gq_rule, MXFP8_ERR_INVALID_ARGUMENT, "rule", "-2"},
    {"params->group 9", gq_group, MXFP8_ERR_INVALID_ARGUMENT, "group", "9"},
};

/* t0 kernel, t1 golden, t2 = the result struct's bytes (checked untouched, not mutated) */
static mxfp8_status call_compare(fx *f) {
    return mxfp8_compare(f->tp[0], f->tp[1], f->d0, f->d1, f->cmpp ? (mxfp8_compare_result *)f->buf[2] : NULL);
}
static void setup_compare(fx *f) {
    f->fn = "mxfp8_compare";
    f->call = call_compare;
    add(f, "kernel", MXFP8_DTYPE_BF16, 2, 6, 10, 0, 0, F_BYPTR | F_FLEXRANK); /* only numel must agree */
    add(f, "golden", MXFP8_DTYPE_F64, 2, 6, 10, 0, 0, F_BYPTR | F_FLEXRANK);
    add(f, "result", MXFP8_DTYPE_U8, 1, (int64_t)sizeof(mxfp8_compare_result), 0, 0, 0, F_OUT | F_NOGEN);
    f->d0 = 1e-2;
    f->d1 = 1e-2;
    f->cmpp = &f->cmp;
}
static void c_result(fx *f) { f->cmpp = NULL; }
static void c_atol_nan(fx *f) { f->d0 = NAN; }
static void c_rtol_neg(fx *f) { f->d1 = -1.0; }
static void c_numel(fx *f) { f->t[1].shape[0] = 5; }
static void c_stride_edge(fx *f) { /* one extent of exactly INT64_MAX elements: the span + 1 must not overflow */
    f->t[0].ndim = 1;
    f->t[0].shape[0] = 2;
    f->t[0].strides[0] = INT64_MAX;
}
static const special sp_compare[] = {
    {"stride INT64_MAX on an extent of 2", c_stride_edge, MXFP8_ERR_BAD_STRIDES, "kernel", NULL},
    {"result NULL", c_result, MXFP8_ERR_NULL_POINTER, "result", NULL},
    {"atol_frac NaN", c_atol_nan, MXFP8_ERR_INVALID_ARGUMENT, "atol_frac", "nan"},
    {"rtol negative", c_rtol_neg, MXFP8_ERR_INVALID_ARGUMENT, "rtol", "-1"},
    {"numel differs", c_numel, MXFP8_ERR_SHAPE_MISMATCH, "golden", NULL},
};

void validation_reference(void) {
    RUN("gemm_golden_unquantized", setup_gold_u, sp_gold_u);
    RUN("gemm_golden_quantized", setup_gold_q, sp_gold_q);
    RUN("mxfp8_compare", setup_compare, sp_compare);
}
