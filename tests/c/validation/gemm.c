/* gemm.c -- test_validation: mxfp8_gemm, mxfp8_matmul and mxfp8_matmul_backward. */
#include "harness.h"

/* ======================================================================================================== */
/* mxfp8_gemm / mxfp8_matmul                                                                                */
/* ======================================================================================================== */
static mxfp8_operand operand(fx *f, int v, int s) {
    mxfp8_operand o;
    memset(&o, 0, sizeof o);
    o.values = f->t[v];
    if (s >= 0) o.scales = f->t[s];
    o.scale_layout = f->layout;
    return o;
}
/* gemm fixture: t0 = a values, t1 = b values, t2 = c, [t3 = a scales] */
static mxfp8_status call_gemm(fx *f) {
    mxfp8_operand a = operand(f, 0, f->nt > 3 ? 3 : -1), b = operand(f, 1, -1);
    a.swizzled = f->swz_a;
    return mxfp8_gemm(f->tp[0] ? &a : NULL, f->tp[1] ? &b : NULL, f->cfgp, f->accumulate, f->tp[2]);
}
static mxfp8_status validate_gemm(fx *f, size_t *ws) {
    mxfp8_operand a = operand(f, 0, f->nt > 3 ? 3 : -1), b = operand(f, 1, -1);
    a.swizzled = f->swz_a;
    return mxfp8_gemm_validate(f->tp[0] ? &a : NULL, f->tp[1] ? &b : NULL, f->cfgp, f->accumulate, f->tp[2], ws);
}
static void setup_gemm(fx *f) {
    f->fn = "mxfp8_gemm";
    f->call = call_gemm;
    f->validate = validate_gemm;
    add(f, "a", MXFP8_DTYPE_F32, 2, 8, 64, 0, 0, F_BYPTR);
    add(f, "b", MXFP8_DTYPE_BF16, 2, 16, 64, 0, 0, F_BYPTR);
    add(f, "c", MXFP8_DTYPE_F32, 2, 8, 16, 0, 0, F_BYPTR | F_OUT);
    mxfp8_matmul_config_init(&f->cfg);
    f->cfgp = &f->cfg;
}
static void setup_gemm_prequant(fx *f) {
    setup_gemm(f);
    f->t[0].dtype = MXFP8_DTYPE_E5M2; /* codes (config float8_dtype E5M2) */
    fill_input(f->buf[0], MXFP8_DTYPE_E5M2);
    add(f, "scales", MXFP8_DTYPE_E8M0, 2, 8, 2, 0, 0, 0);
}
static void g_tile_neg(fx *f) { f->cfg.tile_m = -4; }
static void g_bloop(fx *f) { f->cfg.block_loop_order = (mxfp8_loop_order)6; }
static void g_tloop(fx *f) { f->cfg.tile_loop_order = (mxfp8_loop_order)-1; }
static void g_f8(fx *f) { f->cfg.float8_dtype = (mxfp8_format)2; }
static void g_scheme(fx *f) { f->cfg.quant_scheme = (mxfp8_group_scheme)3; }
static void g_rule(fx *f) { f->cfg.scale_rule = (mxfp8_scale_rule)3; }
static void g_shard(fx *f) { f->cfg.lnc_2_shard_rhs = 2; }
static void g_M(fx *f) { f->cfg.M = 9; }
static void g_K(fx *f) { f->cfg.K = 65; }
static void g_N(fx *f) { f->cfg.N = 3; }
static void g_acc_bf16(fx *f) {
    f->accumulate = 1;
    f->t[2].dtype = MXFP8_DTYPE_BF16;
}
static void g_wrapx(fx *f) { f->cfg.quant_scheme = MXFP8_GROUP_WRAPX; }
static void g_lnc2(fx *f) { f->cfg.run_with_lnc2 = 5; }
static void g_spill(fx *f) { f->cfg.spill_reload = -1; }
static void g_packing(fx *f) { f->cfg.enable_scale_packing = 2; }
static void g_acc(fx *f) { f->accumulate = 3; }
static void g_swz(fx *f) { f->swz_a = 1; }
static const special sp_gemm[] = {
    {"config tile_m < 0", g_tile_neg, MXFP8_ERR_INVALID_ARGUMENT, "tile_m", "-4"},
    {"config block_loop_order 6", g_bloop, MXFP8_ERR_INVALID_ARGUMENT, "block_loop_order", "6"},
    {"config tile_loop_order -1", g_tloop, MXFP8_ERR_INVALID_ARGUMENT, "tile_loop_order", "-1"},
    {"config float8_dtype 2", g_f8, MXFP8_ERR_INVALID_ARGUMENT, "float8_dtype", "2"},
    {"config quant_scheme 3", g_scheme, MXFP8_ERR_INVALID_ARGUMENT, "quant_scheme", "3"},
    {"config scale_rule 3", g_rule, MXFP8_ERR_INVALID_ARGUMENT, "scale_rule", "3"},
    {"config lnc_2_shard_rhs 2", g_shard, MXFP8_ERR_INVALID_ARGUMENT, "lnc_2_shard_rhs", "2"},
    {"config M disagrees", g_M, MXFP8_ERR_SHAPE_MISMATCH, "M", "9"},
    {"config K disagrees", g_K, MXFP8_ERR_SHAPE_MISMATCH, "K", "65"},
    {"config N disagrees", g_N, MXFP8_ERR_SHAPE_MISMATCH, "N", "3"},
    {"accumulate into bf16", g_acc_bf16, MXFP8_ERR_DTYPE, "c", NULL},
    {"wrapX with K = 64", g_wrapx, MXFP8_ERR_UNSUPPORTED, NULL, "64"},
    {"swizzled a with K/4 = 8 rows", g_swz, MXFP8_ERR_UNSUPPORTED, "a", NULL},
    {"config run_with_lnc2 5", g_lnc2, MXFP8_ERR_INVALID_ARGUMENT, "run_with_lnc2", "5"},
    {"config spill_reload -1", g_spill, MXFP8_ERR_INVALID_ARGUMENT, "spill_reload", "-1"},
    {"config enable_scale_packing 2", g_packing, MXFP8_ERR_INVALID_ARGUMENT, "enable_scale_packing", "2"},
    {"accumulate 3", g_acc, MXFP8_ERR_INVALID_ARGUMENT, "accumulate", "3"},
};
static void gp_no_scales(fx *f) { f->t[3].data = NULL; }
static void gp_codes_fmt(fx *f) { f->t[0].dtype = MXFP8_DTYPE_E4M3; }
static void gp_layout(fx *f) { f->layout = (mxfp8_scale_layout)9; }
static void gp_scales_hp(fx *f) { f->t[0].dtype = MXFP8_DTYPE_F32; }
static const special sp_gemm_prequant[] = {
    {"codes without scales", gp_no_scales, MXFP8_ERR_NULL_POINTER, "a", "scales"},
    {"E4M3 codes, float8_dtype E5M2", gp_codes_fmt, MXFP8_ERR_DTYPE, "a", "e4m3"},
    {"scale_layout 9", gp_layout, MXFP8_ERR_INVALID_ARGUMENT, "scale_layout", "9"},
    {"scales with a high-precision operand", gp_scales_hp, MXFP8_ERR_INVALID_ARGUMENT, "a", "scales"},
};

static mxfp8_status call_matmul(fx *f) {
    mxfp8_operand a = operand(f, 0, -1), b = operand(f, 1, -1);
    return mxfp8_matmul(f->tp[0] ? &a : NULL, f->tp[1] ? &b : NULL, f->cfgp, f->tp[2]);
}
static mxfp8_status validate_matmul(fx *f, size_t *ws) {
    mxfp8_operand a = operand(f, 0, -1), b = operand(f, 1, -1);
    return mxfp8_matmul_validate(f->tp[0] ? &a : NULL, f->tp[1] ? &b : NULL, f->cfgp, f->tp[2], ws);
}
static void setup_matmul(fx *f) {
    f->fn = "mxfp8_matmul";
    f->call = call_matmul;
    f->validate = validate_matmul;
    add(f, "input_activation", MXFP8_DTYPE_BF16, 2, 8, 40, 0, 0, F_BYPTR);
    add(f, "weights", MXFP8_DTYPE_F16, 2, 12, 40, 0, 0, F_BYPTR);
    add(f, "output", MXFP8_DTYPE_BF16, 2, 8, 12, 0, 0, F_BYPTR | F_OUT);
    mxfp8_matmul_config_init(&f->cfg);
    f->cfgp = &f->cfg;
}
static const special sp_matmul[] = {
    {"config tile_n < 0", g_tile_neg, MXFP8_ERR_INVALID_ARGUMENT, "tile_m", "-4"},
    {"config float8_dtype 2", g_f8, MXFP8_ERR_INVALID_ARGUMENT, "float8_dtype", "2"},
    {"config M disagrees", g_M, MXFP8_ERR_SHAPE_MISMATCH, "M", "9"},
};

/* ======================================================================================================== */
/* mxfp8_matmul_backward                                                                                    */
/* ======================================================================================================== */
/* t0 dY [M, N], t1 W [N, K], t2 X [M, K], t3 input_grad [M, K], t4 weight_grad [N, K] */
/* The args of the call and of its validate entry, from the fixture's views. */
static const mxfp8_matmul_bwd_args *fill_mbwd(fx *f) {
    f->mb.output_grad = f->t[0];
    f->mb.weights = f->t[1];
    f->mb.input_activation = f->t[2];
    f->mb.input_grad_config = f->cfgp;
    f->mb.weight_grad_config = f->cfgp2;
    if (f->nt > 5) f->mb.output_grad_scales = f->t[5];
    return f->argp ? &f->mb : NULL;
}
static mxfp8_status call_mbwd(fx *f) { return mxfp8_matmul_backward(fill_mbwd(f), f->tp[3], f->tp[4]); }
static mxfp8_status validate_mbwd(fx *f, size_t *ws) {
    return mxfp8_matmul_backward_validate(fill_mbwd(f), f->tp[3], f->tp[4], ws);
}
static void setup_mbwd(fx *f) {
    f->fn = "mxfp8_matmul_backward";
    f->call = call_mbwd;
    f->validate = validate_mbwd;
    add(f, "output_grad", MXFP8_DTYPE_F32, 2, 8, 48, 0, 0, 0);
    add(f, "weights", MXFP8_DTYPE_BF16, 2, 48, 20, 0, 0, 0);
    add(f, "input_activation", MXFP8_DTYPE_F32, 2, 8, 20, 0, 0, 0);
    add(f, "input_grad", MXFP8_DTYPE_BF16, 2, 8, 20, 0, 0, F_BYPTR | F_OUT);
    add(f, "weight_grad", MXFP8_DTYPE_BF16, 2, 48, 20, 0, 0, F_BYPTR | F_OUT);
    mxfp8_matmul_bwd_args_init(&f->mb);
    f->argp = &f->mb;
}
static void setup_mbwd_prequant(fx *f) {
    setup_mbwd(f);
    f->t[0].dtype = MXFP8_DTYPE_E5M2; /* dY codes quantized along N: scales [M, ceil(N/32)] */
    fill_input(f->buf[0], MXFP8_DTYPE_E5M2);
    add(f, "scales", MXFP8_DTYPE_E8M0, 2, 8, 2, 0, 0, 0); /* output_grad_scales: messages say "output_grad scales" */
}
static void mb_args(fx *f) { f->argp = NULL; }
static void mb_loop(fx *f) { f->mb.tile_loop_order = (mxfp8_loop_order)6; }
static void mb_f8(fx *f) { f->mb.float8_dtype = (mxfp8_format)5; }
static void mb_outdt(fx *f) { f->mb.output_dtype = MXFP8_DTYPE_F32; }
static void mb_outdt_bad(fx *f) { f->mb.output_dtype = MXFP8_DTYPE_E4M3; }
static void mb_grads_differ(fx *f) { f->t[4].dtype = MXFP8_DTYPE_F16; }
static void mb_layout(fx *f) { f->mb.scale_layout = (mxfp8_scale_layout)7; }
static void mb_rule(fx *f) { f->mb.scale_rule = (mxfp8_scale_rule)5; }
static void mb_scheme(fx *f) { f->mb.quant_scheme = (mxfp8_group_scheme)2; }
static void mb_cfg_neg(fx *f) {
    mxfp8_matmul_config_init(&f->cfg);
    f->cfg.tiles_in_block_k = -1;
    f->cfgp = &f->cfg;
}
static void mb_cfg2_dims(fx *f) {
    mxfp8_matmul_config_init(&f->cfg2);
    f->cfg2.M = 7;
    f->cfgp2 = &f->cfg2;
}
static void mb_wrapx(fx *f) { f->mb.quant_scheme = MXFP8_GROUP_WRAPX; }
static void mb_lnc2(fx *f) { f->mb.run_with_lnc2 = 5; }
static void mb_shard(fx *f) { f->mb.lnc_2_shard_rhs = -7; }
static void mb_shard2(fx *f) { f->mb.lnc_2_shard_rhs = 2; }
static void mb_packing(fx *f) { f->mb.use_scale_packing = 3; }
static void mb_spill(fx *f) { f->mb.spill_reload = 9; }
static void mb_swz_dy(fx *f) { f->mb.output_grad_is_swizzled = -1; }
static void mb_swz_w(fx *f) { f->mb.weights_is_swizzled = 2; }
static void mb_swz_x(fx *f) { f->mb.input_is_swizzled = 4; }
static void mb_cfg_lnc2(fx *f) {
    mxfp8_matmul_config_init(&f->cfg2);
    f->cfg2.run_with_lnc2 = 7;
    f->cfgp2 = &f->cfg2;
}
static const special sp_mbwd[] = {
    {"args NULL", mb_args, MXFP8_ERR_NULL_POINTER, "args", NULL},
    {"tile_loop_order 6", mb_loop, MXFP8_ERR_INVALID_ARGUMENT, "tile_loop_order", "6"},
    {"float8_dtype 5", mb_f8, MXFP8_ERR_INVALID_ARGUMENT, "float8_dtype", "5"},
    {"output_dtype f32 vs bf16 grads", mb_outdt, MXFP8_ERR_DTYPE, "output_dtype", NULL},
    {"output_dtype e4m3", mb_outdt_bad, MXFP8_ERR_INVALID_ARGUMENT, "output_dtype", NULL},
    {"grads of different dtypes", mb_grads_differ, MXFP8_ERR_DTYPE, "weight_grad", NULL},
    {"scale_layout 7", mb_layout, MXFP8_ERR_INVALID_ARGUMENT, "scale_layout", "7"},
    {"scale_rule 5", mb_rule, MXFP8_ERR_INVALID_ARGUMENT, "scale_rule", "5"},
    {"quant_scheme 2", mb_scheme, MXFP8_ERR_INVALID_ARGUMENT, "quant_scheme", "2"},
    {"input_grad_config tiles_in_block_k -1", mb_cfg_neg, MXFP8_ERR_INVALID_ARGUMENT, "input_grad_config", "-1"},
    {"weight_grad_config M disagrees", mb_cfg2_dims, MXFP8_ERR_SHAPE_MISMATCH, "weight_grad_config", "7"},
    {"wrapX with M = 8, N = 48", mb_wrapx, MXFP8_ERR_UNSUPPORTED, NULL, NULL},
    {"run_with_lnc2 5", mb_lnc2, MXFP8_ERR_INVALID_ARGUMENT, "run_with_lnc2", "5"},
    {"lnc_2_shard_rhs -7", mb_shard, MXFP8_ERR_INVALID_ARGUMENT, "lnc_2_shard_rhs", "-7"},
    {"lnc_2_shard_rhs 2", mb_shard2, MXFP8_ERR_INVALID_ARGUMENT, "lnc_2_shard_rhs", "2"},
    {"use_scale_packing 3", mb_packing, MXFP8_ERR_INVALID_ARGUMENT, "use_scale_packing", "3"},
    {"spill_reload 9", mb_spill, MXFP8_ERR_INVALID_ARGUMENT, "spill_reload", "9"},
    {"output_grad_is_swizzled -1", mb_swz_dy, MXFP8_ERR_INVALID_ARGUMENT, "output_grad_is_swizzled", "-1"},
    {"weights_is_swizzled 2", mb_swz_w, MXFP8_ERR_INVALID_ARGUMENT, "weights_is_swizzled", "2"},
    {"input_is_swizzled 4", mb_swz_x, MXFP8_ERR_INVALID_ARGUMENT, "input_is_swizzled", "4"},
    {"weight_grad_config run_with_lnc2 7", mb_cfg_lnc2, MXFP8_ERR_INVALID_ARGUMENT, "run_with_lnc2", "7"},
};
static void mbp_f8(fx *f) { f->mb.float8_dtype = MXFP8_FMT_E4M3; }
static const special sp_mbwd_prequant[] = {
    {"E5M2 codes with float8_dtype E4M3", mbp_f8, MXFP8_ERR_DTYPE, "output_grad", NULL},
};

void validation_gemm(void) {
    RUN("mxfp8_gemm", setup_gemm, sp_gemm);
    RUN("mxfp8_gemm (pre-quantized)", setup_gemm_prequant, sp_gemm_prequant);
    RUN("mxfp8_matmul", setup_matmul, sp_matmul);
    RUN("mxfp8_matmul_backward", setup_mbwd, sp_mbwd);
    RUN("mxfp8_matmul_backward (pq)", setup_mbwd_prequant, sp_mbwd_prequant);
}
