/* moe.c -- test_validation: mxfp8_moe_num_blocks, route, forward, backward, their goldens and the dense mode; route,
 * forward and backward (the dense mode too) also through their _validate entries (harness.c compares them). */
#include "harness.h"

/* ======================================================================================================== */
/* MoE                                                                                                       */
/* ======================================================================================================== */
static mxfp8_status call_nblocks(fx *f) {
    return mxfp8_moe_num_blocks(f->i64[0], f->i64[1], f->i64[2], f->i64[3], f->nblocks_outp ? (int64_t *)f->buf[0] : NULL);
}
static void setup_nblocks(fx *f) {
    f->fn = "mxfp8_moe_num_blocks";
    f->call = call_nblocks;
    add(f, "num_blocks", MXFP8_DTYPE_U8, 1, 8, 0, 0, 0, F_OUT | F_NOGEN);
    f->i64[0] = 6, f->i64[1] = 2, f->i64[2] = 4, f->i64[3] = 4;
    f->nblocks_outp = &f->nblocks_out;
}
static void nb_null(fx *f) { f->nblocks_outp = NULL; }
static void nb_T(fx *f) { f->i64[0] = -1; }
static void nb_K0(fx *f) { f->i64[1] = 0; }
static void nb_KE(fx *f) { f->i64[1] = 5; }
static void nb_E(fx *f) { f->i64[2] = 0; }
static void nb_B(fx *f) { f->i64[3] = 0; }
static void nb_Bneg(fx *f) { f->i64[3] = -8; }
static void nb_ovf(fx *f) { f->i64[0] = INT64_MAX / 2, f->i64[1] = 4, f->i64[2] = 4; }
static const special sp_nblocks[] = {
    {"num_blocks NULL", nb_null, MXFP8_ERR_NULL_POINTER, "num_blocks", NULL},
    {"T -1", nb_T, MXFP8_ERR_INVALID_ARGUMENT, "T", "-1"},
    {"top_k 0", nb_K0, MXFP8_ERR_INVALID_ARGUMENT, NULL, "0"},
    {"top_k > E", nb_KE, MXFP8_ERR_INVALID_ARGUMENT, NULL, "5"},
    {"E 0", nb_E, MXFP8_ERR_INVALID_ARGUMENT, NULL, "0"},
    {"block_size 0", nb_B, MXFP8_ERR_INVALID_ARGUMENT, NULL, "0"},
    {"block_size -8", nb_Bneg, MXFP8_ERR_INVALID_ARGUMENT, NULL, "-8"},
    {"T*K overflows", nb_ovf, MXFP8_ERR_SIZE_OVERFLOW, NULL, NULL},
};

/* route: T = 6, K = 2, E = 4, B = 4 -> N = 6 */
static mxfp8_status call_route(fx *f) {
    return mxfp8_moe_route(f->tp[0], f->tp[1], f->i64[2], f->i64[3], f->pad_id, f->tp[2], f->tp[3], f->tp[4]);
}
static mxfp8_status validate_route(fx *f, size_t *ws) {
    return mxfp8_moe_route_validate(f->tp[0], f->tp[1], f->i64[2], f->i64[3], f->pad_id, f->tp[2], f->tp[3], f->tp[4],
                                    ws);
}
static void setup_route(fx *f) {
    f->fn = "mxfp8_moe_route";
    f->call = call_route;
    f->validate = validate_route;
    int a = add(f, "topk_ids", MXFP8_DTYPE_I32, 2, 6, 2, 0, 0, F_BYPTR);
    add(f, "topk_weights", MXFP8_DTYPE_F32, 2, 6, 2, 0, 0, F_BYPTR);
    add(f, "token_position_to_id", MXFP8_DTYPE_I32, 1, 24, 0, 0, 0, F_BYPTR | F_OUT);
    add(f, "block_to_expert", MXFP8_DTYPE_I32, 1, 6, 0, 0, 0, F_BYPTR | F_OUT | F_FLEXRANK);
    add(f, "expert_affinities_masked", MXFP8_DTYPE_F32, 2, 24, 1, 0, 0, F_BYPTR | F_OUT | F_FLEXRANK);
    static const int32_t idv[12] = {0, 1, 2, 3, 1, 0, 3, 2, 0, 2, 1, 3};
    memcpy(ids(f, a), idv, sizeof idv);
    f->i64[2] = 4, f->i64[3] = 4, f->pad_id = -1;
}
static void r_id_hi(fx *f) { ids(f, 0)[5] = 4; }
static void r_id_neg(fx *f) { ids(f, 0)[3] = -1; }
static void r_dup(fx *f) { ids(f, 0)[1] = 0; }
static void r_pad(fx *f) { f->pad_id = 5; }
static void r_E(fx *f) { f->i64[2] = 0; }
static void r_B(fx *f) { f->i64[3] = 0; }
static void r_KE(fx *f) { f->i64[2] = 1; }
static const special sp_route[] = {
    {"expert id = E", r_id_hi, MXFP8_ERR_INDEX_OUT_OF_RANGE, "topk_ids", "4"},
    {"expert id -1", r_id_neg, MXFP8_ERR_INDEX_OUT_OF_RANGE, "topk_ids", "-1"},
    {"duplicate id in a row", r_dup, MXFP8_ERR_INVALID_ARGUMENT, "topk_ids", NULL},
    {"padding_id 5", r_pad, MXFP8_ERR_INVALID_ARGUMENT, "padding_id", "5"},
    {"num_experts 0", r_E, MXFP8_ERR_INVALID_ARGUMENT, "num_experts", "0"},
    {"block_size 0", r_B, MXFP8_ERR_INVALID_ARGUMENT, "block_size", "0"},
    {"top_k > num_experts", r_KE, MXFP8_ERR_INVALID_ARGUMENT, NULL, NULL},
};

/* route with E = 2000 experts: the id checks compare a row's ids pairwise instead of keeping stamps (E > 1024), with
 * the same messages. T = 6, K = 2, B = 4 -> N = 1503. */
static void setup_route_wide(fx *f) {
    f->fn = "mxfp8_moe_route";
    f->call = call_route;
    f->validate = validate_route;
    int a = add(f, "topk_ids", MXFP8_DTYPE_I32, 2, 6, 2, 0, 0, F_BYPTR);
    add(f, "topk_weights", MXFP8_DTYPE_F32, 2, 6, 2, 0, 0, F_BYPTR);
    add(f, "token_position_to_id", MXFP8_DTYPE_I32, 1, 1503 * 4, 0, 0, 0, F_BYPTR | F_OUT);
    add(f, "block_to_expert", MXFP8_DTYPE_I32, 1, 1503, 0, 0, 0, F_BYPTR | F_OUT | F_FLEXRANK);
    add(f, "expert_affinities_masked", MXFP8_DTYPE_F32, 2, 6 * 2000, 1, 0, 0, F_BYPTR | F_OUT | F_FLEXRANK);
    static const int32_t idv[12] = {0, 1999, 1500, 3, 1, 0, 3, 2, 1024, 1025, 1, 1998};
    memcpy(ids(f, a), idv, sizeof idv);
    f->i64[2] = 2000, f->i64[3] = 4, f->pad_id = -1;
}
static void rw_id_hi(fx *f) { ids(f, 0)[9] = 2000; }
static void rw_dup(fx *f) { ids(f, 0)[9] = 1024; }
static void rw_dup_first(fx *f) { ids(f, 0)[3] = 1500, ids(f, 0)[5] = 1999; } /* row 1 repeats 1500; row 2 is fine */
static const special sp_route_wide[] = {
    {"expert id = E", rw_id_hi, MXFP8_ERR_INDEX_OUT_OF_RANGE, "topk_ids", "2000"},
    {"duplicate id in a row", rw_dup, MXFP8_ERR_INVALID_ARGUMENT, "topk_ids", "1024"},
    {"duplicate id, the first bad row reported", rw_dup_first, MXFP8_ERR_INVALID_ARGUMENT, "topk_ids", "1500"},
};

/* forward/backward: T = 5, H = 32, I = 32, E = 2, B = 4, N = 2.
 * Expert 0: tokens 0, 2, 4 (block 0); expert 1: tokens 1, 3 (block 1). */
enum { MT = 5, MH = 32, MI = 32, ME = 2, MB = 4, MN = 2 };
static void moe_inputs(fx *f) {
    add(f, "hidden_states", MXFP8_DTYPE_F32, 2, MT, MH, 0, 0, 0);
    int a = add(f, "expert_affinities_masked", MXFP8_DTYPE_F32, 2, MT * ME, 1, 0, 0, F_FLEXRANK);
    add(f, "gate_up_proj_weight", MXFP8_DTYPE_BF16, 4, ME, MH, 2, MI, 0);
    add(f, "down_proj_weight", MXFP8_DTYPE_F32, 3, ME, MI, MH, 0, 0);
    int tok = add(f, "token_position_to_id", MXFP8_DTYPE_I32, 1, MN * MB, 0, 0, 0, 0);
    int b2e = add(f, "block_to_expert", MXFP8_DTYPE_I32, 1, MN, 0, 0, 0, F_FLEXRANK);
    static const int32_t tv[8] = {0, 2, 4, -1, 1, 3, -1, -1}, bv[2] = {0, 1};
    memcpy(ids(f, tok), tv, sizeof tv);
    memcpy(ids(f, b2e), bv, sizeof bv);
    float *av = (float *)f->buf[a];
    for (int t = 0; t < MT; t++)
        for (int e = 0; e < ME; e++) av[t * ME + e] = (t % 2 == e) ? 0.75f : 0.0f;
    f->i64[3] = MB;
    mxfp8_moe_config_init(&f->mc);
    f->mcp = &f->mc;
}
/* indices: 0 X, 1 a, 2 W1, 3 W2, 4 tok, 5 b2e */
static void moe_fill_fwd_args(fx *f, mxfp8_moe_fwd_args *a) {
    mxfp8_moe_fwd_args_init(a);
    a->hidden_states = f->t[0];
    a->expert_affinities_masked = f->t[1];
    a->gate_up_proj_weight = f->t[2];
    a->down_proj_weight = f->t[3];
    a->token_position_to_id = f->t[4];
    a->block_to_expert = f->t[5];
    a->block_size = f->i64[3];
    a->config = f->mcp;
}
/* forward: 6 output, 7 gate_up checkpoint, 8 down_proj_output checkpoint, [9 num_valid_tokens, 10 bias b2] */
static int fwd_golden;
/* The args and outputs of the call and of its validate entry, from the fixture's views. */
static void fill_moe_fwd(fx *f, mxfp8_moe_fwd_args *a, mxfp8_moe_fwd_outputs *o) {
    moe_fill_fwd_args(f, a);
    memset(o, 0, sizeof *o);
    o->output = f->t[6];
    o->gate_up_proj_act_checkpoint_T = f->t[7];
    o->down_proj_output_checkpoint = f->t[8];
    for (int i = 9; i < f->nt; i++) {
        if (!strcmp(f->name[i], "num_valid_tokens")) a->num_valid_tokens = f->t[i];
        if (!strcmp(f->name[i], "down_proj_bias")) a->down_proj_bias = f->t[i];
    }
}
static mxfp8_status call_moe_fwd(fx *f) {
    mxfp8_moe_fwd_args a;
    mxfp8_moe_fwd_outputs o;
    fill_moe_fwd(f, &a, &o);
    if (fwd_golden) return mxfp8_moe_forward_golden(f->argp ? &a : NULL, f->tp[6] ? &o : NULL, f->quantized);
    return mxfp8_moe_forward(f->argp ? &a : NULL, f->tp[6] ? &o : NULL);
}
static mxfp8_status validate_moe_fwd(fx *f, size_t *ws) {
    mxfp8_moe_fwd_args a;
    mxfp8_moe_fwd_outputs o;
    fill_moe_fwd(f, &a, &o);
    return mxfp8_moe_forward_validate(f->argp ? &a : NULL, f->tp[6] ? &o : NULL, ws);
}
static void setup_moe_fwd(fx *f) {
    f->fn = fwd_golden ? "mxfp8_moe_forward_golden" : "mxfp8_moe_forward";
    f->call = call_moe_fwd;
    moe_inputs(f);
    add(f, "output", MXFP8_DTYPE_BF16, 2, MT, MH, 0, 0, F_OUT);
    add(f, "gate_up_proj_act_checkpoint_T", MXFP8_DTYPE_F32, 4, MN, 2, MI, MB, F_OUT | F_OPT);
    add(f, "down_proj_output_checkpoint", MXFP8_DTYPE_F32, 3, MN, MB, MH, 0, F_OUT | F_OPT);
    f->argp = &f->mb; /* only its non-NULLness matters */
    f->quantized = 1;
}
static void mo_args(fx *f) { f->argp = NULL; }
static void mo_B0(fx *f) { f->i64[3] = 0; }
static void mo_Bneg(fx *f) { f->i64[3] = -4; }
static void mo_tok_T(fx *f) { ids(f, 4)[2] = MT; }
static void mo_tok_neg(fx *f) { ids(f, 4)[7] = -2; }
static void mo_tok_skip0(fx *f) { f->mc.skip_token = 0; } /* -1 padding is then out of range */
static void mo_exp_hi(fx *f) { ids(f, 5)[1] = ME; }
static void mo_exp_neg(fx *f) { ids(f, 5)[0] = -1; }
static void mo_nvt(fx *f) { /* num_valid_tokens without single_expert_dense */
    int i = add(f, "num_valid_tokens", MXFP8_DTYPE_I32, 1, 1, 0, 0, 0, 0);
    ids(f, i)[0] = 3;
}
static void mo_bias_no_cfg(fx *f) {
    add(f, "down_proj_bias", MXFP8_DTYPE_F32, 2, ME, MH, 0, 0, 0);
}
static void mo_cdt(fx *f) { f->mc.compute_dtype = MXFP8_DTYPE_E4M3; }
static void mo_qdt(fx *f) { f->mc.quant_dtype = (mxfp8_format)3; }
static void mo_rule(fx *f) { f->mc.scale_rule = (mxfp8_scale_rule)6; }
static void mo_act(fx *f) { f->mc.activation = (mxfp8_activation)8; }
static void mo_aff(fx *f) { f->mc.affinity_option = (mxfp8_affinity_option)4; }
static void mo_shard(fx *f) { f->mc.shard_option = 9; }
static void mo_skip(fx *f) { f->mc.skip_token = 7; }
static void mo_clamp_nan(fx *f) { f->mc.gate_clamp_upper = NAN; }
static void mo_clamp_order(fx *f) { f->mc.up_clamp_lower = 2.0f, f->mc.up_clamp_upper = 1.0f; }
static void mo_phase_scheme(fx *f) { f->mc.phase2.quant_scheme = (mxfp8_group_scheme)4; }
static void mo_phase_neg(fx *f) { f->mc.phase3.tile_k = -1; }
static void mo_outputs(fx *f) { f->tp[6] = NULL; }
static void mo_quantized(fx *f) { f->quantized = 2; }
static void mo_tok_len(fx *f) { f->t[4].shape[0] = 7; }
static void mo_skip_weight(fx *f) { f->mc.skip_weight = 2; }
static void mo_acc(fx *f) { f->mc.accumulate_hidden_states_grad = -1; }
static void mo_skip_init(fx *f) { f->mc.skip_grad_initialization = 5; }
static void mo_dense(fx *f) { f->mc.single_expert_dense = 3; }
static void mo_bias(fx *f) { f->mc.bias = 8; }
static void mo_fast_dma(fx *f) { f->mc.use_fast_dma = 2; }
static void mo_p3(fx *f) { f->mc.p3_transpose_mode = 3; }
static void mo_p4(fx *f) { f->mc.p4_transpose_mode = -1; }
static void mo_swz_hs(fx *f) { f->mc.hidden_states_swizzle_mode = 6; }
static void mo_swz_dy(fx *f) { f->mc.output_grad_swizzle_mode = -2; }
static void mo_swz_w(fx *f) { f->mc.weight_swizzle_mode = 3; }
static void mo_phase_lnc2(fx *f) { f->mc.phase1.run_with_lnc2 = 4; }
#define MOE_COMMON_SPECIALS                                                                                     \
    {"args NULL", mo_args, MXFP8_ERR_NULL_POINTER, "args", NULL},                                               \
    {"block_size 0", mo_B0, MXFP8_ERR_INVALID_ARGUMENT, "block_size", "0"},                                     \
    {"block_size -4", mo_Bneg, MXFP8_ERR_INVALID_ARGUMENT, "block_size", "-4"},                                 \
    {"token id = T", mo_tok_T, MXFP8_ERR_INDEX_OUT_OF_RANGE, "token_position_to_id", "5"},                      \
    {"token id -2", mo_tok_neg, MXFP8_ERR_INDEX_OUT_OF_RANGE, "token_position_to_id", "-2"},                    \
    {"padding -1 with skip_token 0", mo_tok_skip0, MXFP8_ERR_INDEX_OUT_OF_RANGE, "token_position_to_id", "-1"}, \
    {"expert id = E", mo_exp_hi, MXFP8_ERR_INDEX_OUT_OF_RANGE, "block_to_expert", "2"},                        \
    {"expert id -1", mo_exp_neg, MXFP8_ERR_INDEX_OUT_OF_RANGE, "block_to_expert", "-1"},                       \
    {"token_position_to_id length not a multiple of B", mo_tok_len, MXFP8_ERR_SHAPE_MISMATCH,                  \
     "token_position_to_id", "7"},                                                                              \
    {"num_valid_tokens without single_expert_dense", mo_nvt, MXFP8_ERR_INVALID_ARGUMENT, "num_valid_tokens", NULL}, \
    {"bias given with config.bias 0", mo_bias_no_cfg, MXFP8_ERR_INVALID_ARGUMENT, "down_proj_bias", NULL},      \
    {"compute_dtype e4m3", mo_cdt, MXFP8_ERR_INVALID_ARGUMENT, "compute_dtype", NULL},                          \
    {"quant_dtype 3", mo_qdt, MXFP8_ERR_INVALID_ARGUMENT, "quant_dtype", "3"},                                  \
    {"scale_rule 6", mo_rule, MXFP8_ERR_INVALID_ARGUMENT, "scale_rule", "6"},                                   \
    {"activation 8", mo_act, MXFP8_ERR_INVALID_ARGUMENT, "activation", "8"},                                    \
    {"affinity_option 4", mo_aff, MXFP8_ERR_INVALID_ARGUMENT, "affinity_option", "4"},                          \
    {"shard_option 9", mo_shard, MXFP8_ERR_INVALID_ARGUMENT, "shard_option", "9"},                              \
    {"skip_token 7", mo_skip, MXFP8_ERR_INVALID_ARGUMENT, "skip_token", "7"},                                   \
    {"gate clamp NaN", mo_clamp_nan, MXFP8_ERR_INVALID_ARGUMENT, "gate_clamp_upper", NULL},                     \
    {"up clamp lower > upper", mo_clamp_order, MXFP8_ERR_INVALID_ARGUMENT, "up_clamp_lower", "2"},              \
    {"phase2 quant_scheme 4", mo_phase_scheme, MXFP8_ERR_INVALID_ARGUMENT, "quant_scheme", "4"},                \
    {"phase3 tile_k -1", mo_phase_neg, MXFP8_ERR_INVALID_ARGUMENT, "tile_k", "-1"},                            \
    {"skip_weight 2", mo_skip_weight, MXFP8_ERR_INVALID_ARGUMENT, "skip_weight", "2"},                          \
    {"accumulate_hidden_states_grad -1", mo_acc, MXFP8_ERR_INVALID_ARGUMENT, "accumulate_hidden_states_grad", "-1"}, \
    {"skip_grad_initialization 5", mo_skip_init, MXFP8_ERR_INVALID_ARGUMENT, "skip_grad_initialization", "5"},  \
    {"single_expert_dense 3", mo_dense, MXFP8_ERR_INVALID_ARGUMENT, "single_expert_dense", "3"},                \
    {"bias 8", mo_bias, MXFP8_ERR_INVALID_ARGUMENT, "bias", "8"},                                               \
    {"use_fast_dma 2", mo_fast_dma, MXFP8_ERR_INVALID_ARGUMENT, "use_fast_dma", "2"},                           \
    {"p3_transpose_mode 3", mo_p3, MXFP8_ERR_INVALID_ARGUMENT, "p3_transpose_mode", "3"},                       \
    {"p4_transpose_mode -1", mo_p4, MXFP8_ERR_INVALID_ARGUMENT, "p4_transpose_mode", "-1"},                     \
    {"hidden_states_swizzle_mode 6", mo_swz_hs, MXFP8_ERR_INVALID_ARGUMENT, "hidden_states_swizzle_mode", "6"}, \
    {"output_grad_swizzle_mode -2", mo_swz_dy, MXFP8_ERR_INVALID_ARGUMENT, "output_grad_swizzle_mode", "-2"},   \
    {"weight_swizzle_mode 3", mo_swz_w, MXFP8_ERR_INVALID_ARGUMENT, "weight_swizzle_mode", "3"},                \
    {"phase1 run_with_lnc2 4", mo_phase_lnc2, MXFP8_ERR_INVALID_ARGUMENT, "run_with_lnc2", "4"}
static const special sp_moe_fwd[] = {
    MOE_COMMON_SPECIALS,
    {"outputs NULL", mo_outputs, MXFP8_ERR_NULL_POINTER, "outputs", NULL},
};
static const special sp_moe_fwd_golden[] = {
    MOE_COMMON_SPECIALS,
    {"outputs NULL", mo_outputs, MXFP8_ERR_NULL_POINTER, "outputs", NULL},
    {"quantized 2", mo_quantized, MXFP8_ERR_INVALID_ARGUMENT, "quantized", "2"},
};
static void setup_moe_fwd_kernel(fx *f) {
    fwd_golden = 0;
    setup_moe_fwd(f);
    f->validate = validate_moe_fwd;
}
static void setup_moe_fwd_golden(fx *f) {
    fwd_golden = 1;
    setup_moe_fwd(f);
    f->t[6].dtype = MXFP8_DTYPE_F64;
}

/* backward: 6 dY, 7 gate_up checkpoint (optional input), 8 dX, 9 da, 10 dW1, 11 dW2, [12 num_valid_tokens] */
static int bwd_golden;
/* The args and gradients of the call and of its validate entry, from the fixture's views. */
static void fill_moe_bwd(fx *f, mxfp8_moe_bwd_args *a, mxfp8_moe_bwd_grads *g) {
    mxfp8_moe_fwd_args fa;
    moe_fill_fwd_args(f, &fa);
    mxfp8_moe_bwd_args_init(a);
    a->hidden_states = fa.hidden_states;
    a->expert_affinities_masked = fa.expert_affinities_masked;
    a->gate_up_proj_weight = fa.gate_up_proj_weight;
    a->down_proj_weight = fa.down_proj_weight;
    a->token_position_to_id = fa.token_position_to_id;
    a->block_to_expert = fa.block_to_expert;
    a->block_size = fa.block_size;
    a->config = fa.config;
    a->output_hidden_states_grad = f->t[6];
    a->gate_up_proj_act_checkpoint_T = f->t[7];
    memset(g, 0, sizeof *g);
    g->hidden_states_grad = f->t[8];
    g->expert_affinities_masked_grad = f->t[9];
    g->gate_up_proj_weight_grad = f->t[10];
    g->down_proj_weight_grad = f->t[11];
    for (int i = 12; i < f->nt; i++) {
        if (!strcmp(f->name[i], "num_valid_tokens")) a->num_valid_tokens = f->t[i];
        if (!strcmp(f->name[i], "down_proj_bias")) a->down_proj_bias = f->t[i];
    }
}
static mxfp8_status validate_moe_bwd(fx *f, size_t *ws) {
    mxfp8_moe_bwd_args a;
    mxfp8_moe_bwd_grads g;
    fill_moe_bwd(f, &a, &g);
    return mxfp8_moe_backward_validate(f->argp ? &a : NULL, f->tp[8] ? &g : NULL, ws);
}
static mxfp8_status call_moe_bwd(fx *f) {
    mxfp8_moe_bwd_args a;
    mxfp8_moe_bwd_grads g;
    fill_moe_bwd(f, &a, &g);
    if (bwd_golden) return mxfp8_moe_backward_golden(f->argp ? &a : NULL, f->tp[8] ? &g : NULL, f->quantized);
    return mxfp8_moe_backward(f->argp ? &a : NULL, f->tp[8] ? &g : NULL);
}
static void setup_moe_bwd(fx *f) {
    f->fn = bwd_golden ? "mxfp8_moe_backward_golden" : "mxfp8_moe_backward";
    f->call = call_moe_bwd;
    moe_inputs(f);
    add(f, "output_hidden_states_grad", MXFP8_DTYPE_BF16, 2, MT, MH, 0, 0, 0);
    add(f, "gate_up_proj_act_checkpoint_T", MXFP8_DTYPE_F32, 4, MN, 2, MI, MB, F_OPT);
    add(f, "hidden_states_grad", MXFP8_DTYPE_F32, 2, MT, MH, 0, 0, F_OUT);
    add(f, "expert_affinities_masked_grad", MXFP8_DTYPE_F32, 1, MT * ME, 0, 0, 0, F_OUT | F_FLEXRANK);
    add(f, "gate_up_proj_weight_grad", MXFP8_DTYPE_BF16, 4, ME, MH, 2, MI, F_OUT);
    add(f, "down_proj_weight_grad", MXFP8_DTYPE_F32, 3, ME, MI, MH, 0, F_OUT);
    f->argp = &f->mb;
    f->quantized = 1;
}
static void mb_outputs(fx *f) { f->tp[8] = NULL; }
static void mb_nvt_reindex(fx *f) { /* as mo_nvt; the backward reads extra tensors from index 12 */
    mo_nvt(f);
}
static const special sp_moe_bwd[] = {
    MOE_COMMON_SPECIALS,
    {"grads NULL", mb_outputs, MXFP8_ERR_NULL_POINTER, "grads", NULL},
    {"num_valid_tokens (bwd)", mb_nvt_reindex, MXFP8_ERR_INVALID_ARGUMENT, "num_valid_tokens", NULL},
};
static const special sp_moe_bwd_golden[] = {
    MOE_COMMON_SPECIALS,
    {"grads NULL", mb_outputs, MXFP8_ERR_NULL_POINTER, "grads", NULL},
    {"quantized 2", mo_quantized, MXFP8_ERR_INVALID_ARGUMENT, "quantized", "2"},
};
static void setup_moe_bwd_kernel(fx *f) {
    bwd_golden = 0;
    setup_moe_bwd(f);
    f->validate = validate_moe_bwd;
}
static void setup_moe_bwd_golden(fx *f) {
    bwd_golden = 1;
    setup_moe_bwd(f);
}

/* single_expert_dense backward: E = 1, T = 8, B = 4, num_valid_tokens = 6 */
static void setup_moe_dense(fx *f) {
    f->fn = "mxfp8_moe_backward";
    f->call = call_moe_bwd;
    f->validate = validate_moe_bwd;
    bwd_golden = 0;
    add(f, "hidden_states", MXFP8_DTYPE_F32, 2, 8, MH, 0, 0, 0);
    add(f, "expert_affinities_masked", MXFP8_DTYPE_F32, 2, 8, 1, 0, 0, F_FLEXRANK);
    add(f, "gate_up_proj_weight", MXFP8_DTYPE_F32, 4, 1, MH, 2, MI, 0);
    add(f, "down_proj_weight", MXFP8_DTYPE_F32, 3, 1, MI, MH, 0, 0);
    add(f, "token_position_to_id", MXFP8_DTYPE_I32, 1, 0, 0, 0, 0, F_OPT | F_NOGEN);
    add(f, "block_to_expert", MXFP8_DTYPE_I32, 1, 0, 0, 0, 0, F_OPT | F_NOGEN);
    f->t[4].data = f->t[5].data = NULL;
    add(f, "output_hidden_states_grad", MXFP8_DTYPE_F32, 2, 8, MH, 0, 0, 0);
    add(f, "gate_up_proj_act_checkpoint_T", MXFP8_DTYPE_F32, 4, 2, 2, MI, 4, F_OPT | F_NOGEN);
    f->t[7].data = NULL;
    add(f, "hidden_states_grad", MXFP8_DTYPE_F32, 2, 8, MH, 0, 0, F_OUT);
    add(f, "expert_affinities_masked_grad", MXFP8_DTYPE_F32, 2, 8, 1, 0, 0, F_OUT | F_FLEXRANK);
    add(f, "gate_up_proj_weight_grad", MXFP8_DTYPE_F32, 4, 1, MH, 2, MI, F_OUT);
    add(f, "down_proj_weight_grad", MXFP8_DTYPE_F32, 3, 1, MI, MH, 0, F_OUT);
    int n = add(f, "num_valid_tokens", MXFP8_DTYPE_I32, 1, 1, 0, 0, 0, F_FLEXRANK | F_OPT);
    ids(f, n)[0] = 6;
    f->i64[3] = 4;
    mxfp8_moe_config_init(&f->mc);
    f->mc.single_expert_dense = 1;
    f->mcp = &f->mc;
    f->argp = &f->mb;
}
static void md_nvt_neg(fx *f) { ids(f, 12)[0] = -1; }
static void md_nvt_two(fx *f) { f->t[12].shape[0] = 2; }
static void md_nvt_dtype(fx *f) { f->t[12].dtype = MXFP8_DTYPE_F32; }
static void md_E2(fx *f) {
    f->t[2].shape[0] = 2;
    f->t[3].shape[0] = 2;
    f->t[2] = mxfp8_tensor_make(f->t[2].data, f->t[2].dtype, 4, f->t[2].shape);
    f->t[3] = mxfp8_tensor_make(f->t[3].data, f->t[3].dtype, 3, f->t[3].shape);
    f->t[1].shape[0] = f->t[9].shape[0] = 16; /* a and its grad [T*E, 1] */
}
static const special sp_moe_dense[] = {
    {"num_valid_tokens -1", md_nvt_neg, MXFP8_ERR_INVALID_ARGUMENT, "num_valid_tokens", "-1"},
    {"num_valid_tokens with 2 values", md_nvt_two, MXFP8_ERR_SHAPE_MISMATCH, "num_valid_tokens", "2"},
    {"num_valid_tokens f32", md_nvt_dtype, MXFP8_ERR_DTYPE, "num_valid_tokens", NULL},
    {"single_expert_dense with E = 2", md_E2, MXFP8_ERR_INVALID_ARGUMENT, "single_expert_dense", NULL},
};

void validation_moe(void) {
    RUN("mxfp8_moe_num_blocks", setup_nblocks, sp_nblocks);
    RUN("mxfp8_moe_route", setup_route, sp_route);
    RUN("mxfp8_moe_route (E = 2000)", setup_route_wide, sp_route_wide);
    RUN("mxfp8_moe_forward", setup_moe_fwd_kernel, sp_moe_fwd);
    RUN("mxfp8_moe_forward_golden", setup_moe_fwd_golden, sp_moe_fwd_golden);
    RUN("mxfp8_moe_backward", setup_moe_bwd_kernel, sp_moe_bwd);
    RUN("mxfp8_moe_backward_golden", setup_moe_bwd_golden, sp_moe_bwd_golden);
    RUN("mxfp8_moe_backward (dense)", setup_moe_dense, sp_moe_dense);
}
