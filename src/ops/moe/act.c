/*
 * act.c -- the elementwise SwiGLU work of one position (a row of a block), shared by the forward and the backward:
 * act(g) = g * sigmoid(beta g) with act'(g) = s (1 + beta g (1 - s)), or squared ReLU (mxfp8i_moe_relu2 /
 * mxfp8i_moe_drelu2, moe.h), and the clamp masks (mxfp8i_moe_clamp_pass), element by element, in FP32, written as
 * loops without branches so that the compiler vectorizes them (the exponential in a pass of its own: the registry's
 * exp_f32, src/kernels/expf.h), so results are bitwise those of the scalar expressions.
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

/* s[i] = 1 / (1 + exp(-b g[i])) (FP32, the registry's exponential in a pass of its own); s may not be g. */
static void sigmoid_row(float b, const float *g, float *s, int64_t I) {
    for (int64_t i = 0; i < I; i++) s[i] = -b * g[i];
    mxfp8i_kernels_get()->quant->exp_f32(s, s, I);
    for (int64_t i = 0; i < I; i++) s[i] = 1.0f / (1.0f + s[i]);
}

void mxfp8i_moe_fwd_row(const mxfp8_moe_config *c, int64_t I, const float *gu, const float *b1, float *g, float *u,
                        float *act, int act_given, float *inter, int inter_given, float *S, float aq, float *sg) {
    if (gu) {
        const float gl = c->gate_clamp_lower, gh = c->gate_clamp_upper, ul = c->up_clamp_lower, uh = c->up_clamp_upper;
        for (int64_t i = 0; i < I; i++) g[i] = mxfp8i_moe_clamp(gu[i] + b1[i], gl, gh);
        for (int64_t i = 0; i < I; i++) u[i] = mxfp8i_moe_clamp(gu[I + i] + b1[I + i], ul, uh);
    }
    if (!act_given && mxfp8i_moe_sigmoid_act(c)) {
        float *s = sg ? sg : act; /* act itself holds the sigmoid until it is overwritten by g * s */
        sigmoid_row(mxfp8i_moe_beta(c), g, s, I);
        for (int64_t i = 0; i < I; i++) act[i] = g[i] * s[i];
    } else if (!act_given) {
        for (int64_t i = 0; i < I; i++) act[i] = mxfp8i_moe_relu2(g[i]);
    }
    if (!inter_given && mxfp8i_moe_act_desc(c)->up_plus_one) /* gpt-oss: act(g) * (u + 1) */
        for (int64_t i = 0; i < I; i++) inter[i] = act[i] * (u[i] + 1.0f);
    else if (!inter_given)
        for (int64_t i = 0; i < I; i++) inter[i] = act[i] * u[i];
    if (S)
        for (int64_t i = 0; i < I; i++) S[i] = aq * inter[i];
}

/* mxfp8i_moe_clamp_pass in FP32 with the limits' presence hoisted: x strictly inside (lo, hi); an absent limit
 * (lo_on / hi_on = 0) passes everything, NaN included. */
static inline int clamp_pass(float x, int lo_on, float lo, int hi_on, float hi) {
    return (!lo_on || !(x <= lo)) && (!hi_on || !(x >= hi));
}

void mxfp8i_moe_bwd_row(const mxfp8_moe_config *c, int64_t I, const float *dI, float aq, int scale, const float *g,
                        const float *u, const float *act, const float *sg, float *dgu) {
    const float gl = c->gate_clamp_lower, gh = c->gate_clamp_upper, ul = c->up_clamp_lower, uh = c->up_clamp_upper;
    const int gl_on = gl != -INFINITY, gh_on = gh != INFINITY, ul_on = ul != -INFINITY, uh_on = uh != INFINITY;
    float *dg = dgu, *du = dgu + I; /* du first holds dIv */
    if (scale)
        for (int64_t i = 0; i < I; i++) du[i] = aq * dI[i];
    else
        for (int64_t i = 0; i < I; i++) du[i] = dI[i];
    if (sg) {
        const float b = mxfp8i_moe_beta(c);
        for (int64_t i = 0; i < I; i++) dg[i] = sg[i] * (1.0f + b * g[i] * (1.0f - sg[i]));
    } else if (mxfp8i_moe_sigmoid_act(c)) { /* the forward's sigmoid recomputed, held in dg */
        const float b = mxfp8i_moe_beta(c);
        sigmoid_row(b, g, dg, I);
        for (int64_t i = 0; i < I; i++) dg[i] = dg[i] * (1.0f + b * g[i] * (1.0f - dg[i]));
    } else
        for (int64_t i = 0; i < I; i++) dg[i] = mxfp8i_moe_drelu2(g[i]);
    if (mxfp8i_moe_act_desc(c)->up_plus_one) /* d_gate = dIv * (u + 1) * act'(g) */
        for (int64_t i = 0; i < I; i++) {
            const int pg = clamp_pass(g[i], gl_on, gl, gh_on, gh);
            const float v = du[i] * (u[i] + 1.0f) * dg[i];
            dg[i] = pg ? v : 0.0f;
        }
    else
        for (int64_t i = 0; i < I; i++) {
            const int pg = clamp_pass(g[i], gl_on, gl, gh_on, gh);
            const float v = du[i] * u[i] * dg[i];
            dg[i] = pg ? v : 0.0f;
        }
    for (int64_t i = 0; i < I; i++) {
        const int pu = clamp_pass(u[i], ul_on, ul, uh_on, uh);
        const float v = du[i] * act[i];
        du[i] = pu ? v : 0.0f;
    }
}

