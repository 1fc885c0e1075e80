/* quant.c -- test_validation: mxfp8_quantize and mxfp8_dequantize. */
#include "harness.h"

/* ======================================================================================================== */
/* mxfp8_quantize / mxfp8_dequantize                                                                          */
/* ======================================================================================================== */
static mxfp8_status call_quantize(fx *f) { return mxfp8_quantize(f->tp[0], f->axis, f->qpp, f->tp[1], f->tp[2]); }
static mxfp8_status validate_quantize(fx *f, size_t *ws) {
    return mxfp8_quantize_validate(f->tp[0], f->axis, f->qpp, f->tp[1], f->tp[2], ws);
}
static void setup_quantize(fx *f) {
    f->fn = "mxfp8_quantize";
    f->call = call_quantize;
    f->validate = validate_quantize;
    add(f, "src", MXFP8_DTYPE_F32, 2, 4, 64, 0, 0, F_BYPTR);
    add(f, "data", MXFP8_DTYPE_E4M3, 2, 4, 64, 0, 0, F_BYPTR | F_OUT);
    add(f, "scales", MXFP8_DTYPE_E8M0, 2, 4, 2, 0, 0, F_BYPTR | F_OUT);
    f->axis = 1;
    f->qp = mxfp8_quant_params_default();
    f->qpp = &f->qp;
}
static void q_axis_hi(fx *f) { f->axis = 2; }
static void q_axis_lo(fx *f) { f->axis = -3; }
static void q_fmt(fx *f) { f->qp.fmt = (mxfp8_format)7; }
static void q_fmt_neg(fx *f) { f->qp.fmt = (mxfp8_format)-1; }
static void q_rule(fx *f) { f->qp.rule = (mxfp8_scale_rule)9; }
static void q_group(fx *f) { f->qp.group = (mxfp8_group_scheme)5; }
static void q_wrapx(fx *f) { f->qp.group = MXFP8_GROUP_WRAPX; }
static void q_data_fmt(fx *f) { f->t[1].dtype = MXFP8_DTYPE_E5M2; }
static void q_src_rank0(fx *f) { f->t[0].ndim = 0; }
static const special sp_quantize[] = {
    {"axis 2 of a 2-D tensor", q_axis_hi, MXFP8_ERR_INVALID_ARGUMENT, "axis", "2"},
    {"axis -3 of a 2-D tensor", q_axis_lo, MXFP8_ERR_INVALID_ARGUMENT, "axis", "-3"},
    {"unknown params->fmt", q_fmt, MXFP8_ERR_INVALID_ARGUMENT, "fmt", "7"},
    {"negative params->fmt", q_fmt_neg, MXFP8_ERR_INVALID_ARGUMENT, "fmt", "-1"},
    {"unknown params->rule", q_rule, MXFP8_ERR_INVALID_ARGUMENT, "rule", "9"},
    {"unknown params->group", q_group, MXFP8_ERR_INVALID_ARGUMENT, "group", "5"},
    {"wrapX with axis length 64", q_wrapx, MXFP8_ERR_UNSUPPORTED, "WRAPX", "64"},
    {"data E5M2 but fmt E4M3", q_data_fmt, MXFP8_ERR_DTYPE, "data", "e5m2"},
    {"src 0-D", q_src_rank0, MXFP8_ERR_SHAPE_MISMATCH, "src", NULL},
};

static mxfp8_status call_dequantize(fx *f) {
    return mxfp8_dequantize(f->tp[0], f->tp[1], f->axis, (mxfp8_group_scheme)f->group, f->tp[2]);
}
static mxfp8_status validate_dequantize(fx *f, size_t *ws) {
    return mxfp8_dequantize_validate(f->tp[0], f->tp[1], f->axis, (mxfp8_group_scheme)f->group, f->tp[2], ws);
}
static void setup_dequantize(fx *f) {
    f->fn = "mxfp8_dequantize";
    f->call = call_dequantize;
    f->validate = validate_dequantize;
    add(f, "data", MXFP8_DTYPE_E4M3, 2, 64, 6, 0, 0, F_BYPTR);
    add(f, "scales", MXFP8_DTYPE_E8M0, 2, 2, 6, 0, 0, F_BYPTR);
    add(f, "out", MXFP8_DTYPE_BF16, 2, 64, 6, 0, 0, F_BYPTR | F_OUT);
    f->axis = 0;
}
static void dq_axis(fx *f) { f->axis = 5; }
static void dq_group(fx *f) { f->group = 2; }
static void dq_wrapx(fx *f) { f->group = MXFP8_GROUP_WRAPX; }
static const special sp_dequantize[] = {
    {"axis 5", dq_axis, MXFP8_ERR_INVALID_ARGUMENT, "axis", "5"},
    {"unknown group", dq_group, MXFP8_ERR_INVALID_ARGUMENT, "group", "2"},
    {"wrapX with axis length 64", dq_wrapx, MXFP8_ERR_UNSUPPORTED, "WRAPX", "64"},
};

void validation_quant(void) {
    RUN("mxfp8_quantize", setup_quantize, sp_quantize);
    RUN("mxfp8_dequantize", setup_dequantize, sp_dequantize);
}
