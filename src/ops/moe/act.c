/*
 * act.c -- the activations' table, and the elementwise SwiGLU work of one position (a row of a block) shared by the
 * forward and the backward: act(g) = g * sigmoid(beta g) with act'(g) = s (1 + beta g (1 - s)), or squared ReLU, and
 * the clamp masks, element by element in FP32, through the registry's act_fwd / act_bwd rows (src/kernels/act_rows.h:
 * the same loops compiled for each ISA, bitwise the scalar expressions).
 */
#include "../../kernels/registry.h"
#include "moe.h"

/* One row per mxfp8_activation (include/mxfp8.h). */
const mxfp8i_act_desc mxfp8i_moe_acts[] = {
    [MXFP8_ACT_SILU] = {MXFP8I_ACT_SIGMOID_GATED, 0, 1.0f, 1.0, 0, 0},
    [MXFP8_ACT_SWISH] = {MXFP8I_ACT_SIGMOID_GATED, 0, 1.702f, 1.702, 0, 0},
    [MXFP8_ACT_SQUARED_RELU] = {MXFP8I_ACT_SQUARED_RELU, 0, 0.0f, 0.0, 0, 0},
    [MXFP8_ACT_GPT_OSS_SWIGLU] = {MXFP8I_ACT_SIGMOID_GATED, 1, 0.0f, 0.0, 1, 1},
};
_Static_assert(sizeof mxfp8i_moe_acts / sizeof mxfp8i_moe_acts[0] == MXFP8_ACT_GPT_OSS_SWIGLU + 1, "activations");

/* The activation and the config's clamp limits as the registry's rows take them. */
static void act_params(const mxfp8_moe_config *c, mxfp8i_act_params *ap) {
    const mxfp8i_act_desc *d = mxfp8i_moe_act_desc(c);
    ap->squared_relu = d->kind == MXFP8I_ACT_SQUARED_RELU;
    ap->up_plus_one = d->up_plus_one;
    ap->beta = ap->squared_relu ? 0.0f : mxfp8i_moe_beta(c);
    ap->gate_lo = c->gate_clamp_lower;
    ap->gate_hi = c->gate_clamp_upper;
    ap->up_lo = c->up_clamp_lower;
    ap->up_hi = c->up_clamp_upper;
}

void mxfp8i_moe_fwd_row(const mxfp8_moe_config *c, int64_t I, const float *gu, const float *b1, float *g, float *u,
                        float *act, int act_given, float *inter, int inter_given, float *S, float aq, float *sg) {
    mxfp8i_act_params ap;
    act_params(c, &ap);
    mxfp8i_kernels_get()->quant->act_fwd(&ap, I, gu, b1, g, u, act, act_given, inter, inter_given, S, aq, sg);
}

void mxfp8i_moe_bwd_row(const mxfp8_moe_config *c, int64_t I, const float *dI, float aq, int scale, const float *g,
                        const float *u, const float *act, const float *sg, float *dgu) {
    mxfp8i_act_params ap;
    act_params(c, &ap);
    mxfp8i_kernels_get()->quant->act_bwd(&ap, I, dI, aq, scale, g, u, act, sg, dgu);
}
