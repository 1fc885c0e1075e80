/* config.c -- defaults of MXFP8MOEBwdConfig and of the forward / backward argument structs [NKI-E]; the test-only
 * switch of the runs of blocks (moe.h). */
#include "moe.h"

/* ---------------------------------------------------------------------------------------------------------- */
/* Defaults                                                                                                   */
/* ---------------------------------------------------------------------------------------------------------- */
/* A phase config: the matmul defaults with the MoE's E4M3 (phase outputs are FP32: weight grads accumulate in FP32). */
static void phase_config_default(mxfp8_matmul_config *c) {
    mxfp8_matmul_config_init(c);
    c->float8_dtype = MXFP8_FMT_E4M3;
}

void mxfp8_moe_config_init(mxfp8_moe_config *c) {
    if (!c) return;
    memset(c, 0, sizeof *c);
    c->compute_dtype = MXFP8_DTYPE_BF16;
    c->quant_dtype = MXFP8_FMT_E4M3;
    c->scale_rule = MXFP8_SCALE_NKI;
    c->activation = MXFP8_ACT_SILU;
    c->affinity_option = MXFP8_AFFINITY_ON_I;
    phase_config_default(&c->phase1);
    phase_config_default(&c->phase2);
    phase_config_default(&c->phase3);
    phase_config_default(&c->phase4);
    c->gate_clamp_lower = -INFINITY;
    c->gate_clamp_upper = INFINITY;
    c->up_clamp_lower = -INFINITY;
    c->up_clamp_upper = INFINITY;
    c->skip_token = 1;
    c->swiglu_alpha = 1.702f;
    c->swiglu_limit = 7.0f;
}

void mxfp8_moe_bwd_args_init(mxfp8_moe_bwd_args *args) {
    if (!args) return;
    memset(args, 0, sizeof *args);
    args->block_size = 4096;
}

void mxfp8_moe_fwd_args_init(mxfp8_moe_fwd_args *args) {
    if (!args) return;
    memset(args, 0, sizeof *args);
    args->block_size = 4096;
}

int mxfp8i_moe_runs_mode = -1;

int mxfp8i_moe_set_block_runs(int mode) {
    const int prev = mxfp8i_moe_runs_mode;
    mxfp8i_moe_runs_mode = mode < 0 ? -1 : mode != 0;
    return prev;
}

int mxfp8i_moe_par_mode = -1;

int mxfp8i_moe_set_expert_parallel(int mode) {
    const int prev = mxfp8i_moe_par_mode;
    mxfp8i_moe_par_mode = mode < 0 ? -1 : mode != 0;
    return prev;
}
