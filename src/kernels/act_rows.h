/*
 * act_rows.h -- the MoE layer's elementwise SwiGLU rows (include/mxfp8.h, "Blockwise MoE"), written once as inline
 * loops without branches inside (whether a clamp limit is present is decided once per row: an absent one clamps
 * nothing and masks nothing, so those rows skip the clamp and the mask) and compiled by each ISA's file
 * (ref/quant_ref.c, avx512/quant_avx512.c) into the registry's act_fwd / act_bwd slots: the same IEEE FP32
 * operations element by element (files built with
 * -ffp-contract=off: no fused multiply-add, division and comparisons exact in any width), so every slot gives the
 * bits of the scalar expressions; only the exponential is called through the slot's own exp_f32 (bitwise the
 * reference, src/kernels/expf.h).
 *
 * act(g) = g * sigmoid(beta g) with act'(g) = s (1 + beta g (1 - s)) for the sigmoid-gated activations, or the
 * squared ReLU max(g, 0)^2 with act'(g) = 2 max(g, 0); inter = act(g) * (u + 1) with up_plus_one (gpt-oss), else
 * act(g) * u exactly (no + 0 that would turn -0 into +0). Clamps keep NaN; a clamp's gradient mask passes x strictly
 * inside a present limit, NaN counting as inside (an absent limit is -INFINITY / +INFINITY and masks nothing).
 */
#ifndef MXFP8_KERNELS_ACT_ROWS_H
#define MXFP8_KERNELS_ACT_ROWS_H

#include <math.h>

#include "qpanel.h"

/** Clamp keeping NaN (absent limits are +-INFINITY). */
static inline float mxfp8i_act_clamp(float x, float lo, float hi) { return x < lo ? lo : (x > hi ? hi : x); }
/** The squared ReLU max(g, 0)^2 and its derivative 2 max(g, 0) (NaN stays NaN). */
static inline float mxfp8i_act_relu2(float g) {
    float r = !(g <= 0.0f) ? g : 0.0f;
    return r * r;
}
static inline float mxfp8i_act_drelu2(float g) { return !(g <= 0.0f) ? 2.0f * g : 0.0f; }
/** The clamp's gradient mask with the limits' presence hoisted: x strictly inside (lo, hi); an absent limit
 *  (lo_on / hi_on = 0) passes everything, NaN included. */
static inline int mxfp8i_act_pass(float x, int lo_on, float lo, int hi_on, float hi) {
    return (!lo_on || !(x <= lo)) && (!hi_on || !(x >= hi));
}

/* e[i] = exp(-b g[i]) (the exponential in a pass of its own); e may not be g. */
static inline __attribute__((always_inline)) void mxfp8i_act_exp_neg(mxfp8i_exp_f32_fn expf32, float b,
                                                                      const float *g, float *e, int64_t I) {
    for (int64_t i = 0; i < I; i++) e[i] = -b * g[i];
    expf32(e, e, I);
}

/* s[i] = 1 / (1 + exp(-b g[i])); s may not be g. */
static inline __attribute__((always_inline)) void mxfp8i_act_sigmoid(mxfp8i_exp_f32_fn expf32, float b,
                                                                      const float *g, float *s, int64_t I) {
    mxfp8i_act_exp_neg(expf32, b, g, s, I);
    for (int64_t i = 0; i < I; i++) s[i] = 1.0f / (1.0f + s[i]);
}

/* After the exponential e (held in e[]): s = 1 / (1 + e), act = g * s, inter = act * u (or act * (u + 1)), one
 * pass element by element (the expressions of mxfp8i_act_sigmoid's last loop and of the forward row's act and inter
 * loops). keep_s: s into e[] (the kept sigmoid); put_act: act into act[] (else act[] is inter's row, which inter
 * overwrites anyway). Constant flags, so each caller's loop is straight-line and vectorizes with no overlap checks
 * between rows that are one array. */
static inline __attribute__((always_inline)) void mxfp8i_act_fwd_sig(int64_t I, const float *g, const float *u,
                                                                      float *e, int keep_s, float *act, int put_act,
                                                                      float *inter, int p1) {
    for (int64_t i = 0; i < I; i++) {
        const float si = 1.0f / (1.0f + e[i]), a = g[i] * si;
        if (keep_s) e[i] = si;
        if (put_act) act[i] = a;
        inter[i] = p1 ? a * (u[i] + 1.0f) : a * u[i];
    }
}

/* The forward row of qpanel.h's mxfp8i_act_fwd_fn. */
static inline __attribute__((always_inline)) void mxfp8i_act_fwd_impl(mxfp8i_exp_f32_fn expf32,
                                                                       const mxfp8i_act_params *ap, int64_t I,
                                                                       const float *gu, const float *b1, float *g,
                                                                       float *u, float *act, int act_given,
                                                                       float *inter, int inter_given, float *S,
                                                                       float aq, float *sg) {
    if (gu) { /* (absent limits clamp nothing, NaN included: those loops are plain sums) */
        const float gl = ap->gate_lo, gh = ap->gate_hi, ul = ap->up_lo, uh = ap->up_hi;
        if (gl == -INFINITY && gh == INFINITY)
            for (int64_t i = 0; i < I; i++) g[i] = gu[i] + b1[i];
        else
            for (int64_t i = 0; i < I; i++) g[i] = mxfp8i_act_clamp(gu[i] + b1[i], gl, gh);
        if (ul == -INFINITY && uh == INFINITY)
            for (int64_t i = 0; i < I; i++) u[i] = gu[I + i] + b1[I + i];
        else
            for (int64_t i = 0; i < I; i++) u[i] = mxfp8i_act_clamp(gu[I + i] + b1[I + i], ul, uh);
    }
    if (!act_given && !ap->squared_relu && !inter_given) { /* the exponential, then one pass (mxfp8i_act_fwd_sig) */
        const int p1 = ap->up_plus_one;
        mxfp8i_act_exp_neg(expf32, ap->beta, g, sg ? sg : act, I); /* (in act until g * s overwrites it) */
        if (sg && act == inter) mxfp8i_act_fwd_sig(I, g, u, sg, 1, inter, 0, inter, p1);
        else if (sg) mxfp8i_act_fwd_sig(I, g, u, sg, 1, act, 1, inter, p1);
        else if (act == inter) mxfp8i_act_fwd_sig(I, g, u, inter, 0, inter, 0, inter, p1);
        else mxfp8i_act_fwd_sig(I, g, u, act, 0, act, 1, inter, p1);
    } else {
        if (!act_given && !ap->squared_relu) {
            float *s = sg ? sg : act; /* act itself holds the sigmoid until it is overwritten by g * s */
            mxfp8i_act_sigmoid(expf32, ap->beta, g, s, I);
            for (int64_t i = 0; i < I; i++) act[i] = g[i] * s[i];
        } else if (!act_given) {
            for (int64_t i = 0; i < I; i++) act[i] = mxfp8i_act_relu2(g[i]);
        }
        if (!inter_given && ap->up_plus_one)
            for (int64_t i = 0; i < I; i++) inter[i] = act[i] * (u[i] + 1.0f);
        else if (!inter_given)
            for (int64_t i = 0; i < I; i++) inter[i] = act[i] * u[i];
    }
    if (S)
        for (int64_t i = 0; i < I; i++) S[i] = aq * inter[i];
}

/* The backward row from the forward's sigmoid s, one pass element by element (the expressions of the backward
 * row's loops, in their order): dIv = aq * dI (dI where the row is not scaled), dg = dIv * u * act'(g) (u + 1 with
 * p1), du = dIv * act (act = g * s, the forward row's own product, where act[] is not given), then the clamps'
 * masks. has_act constant, so each caller's loop is straight-line. */
static inline __attribute__((always_inline)) void mxfp8i_act_bwd_sig(int64_t I, const float *dI, float aq, int scale,
                                                                      const float *g, const float *u,
                                                                      const float *act, int has_act, const float *s,
                                                                      const mxfp8i_act_params *ap, float *dg,
                                                                      float *du) {
    const float gl = ap->gate_lo, gh = ap->gate_hi, ul = ap->up_lo, uh = ap->up_hi, b = ap->beta;
    const int p1 = ap->up_plus_one;
    const int gl_on = gl != -INFINITY, gh_on = gh != INFINITY, ul_on = ul != -INFINITY, uh_on = uh != INFINITY;
    for (int64_t i = 0; i < I; i++) {
        const float d = scale ? aq * dI[i] : dI[i], si = s[i], gi = g[i], ui = u[i];
        const float da = si * (1.0f + b * gi * (1.0f - si));
        const float vg = (p1 ? d * (ui + 1.0f) : d * ui) * da, vu = has_act ? d * act[i] : d * (gi * si);
        dg[i] = mxfp8i_act_pass(gi, gl_on, gl, gh_on, gh) ? vg : 0.0f;
        du[i] = mxfp8i_act_pass(ui, ul_on, ul, uh_on, uh) ? vu : 0.0f;
    }
}

/* The backward row of qpanel.h's mxfp8i_act_bwd_fn. */
static inline __attribute__((always_inline)) void mxfp8i_act_bwd_impl(mxfp8i_exp_f32_fn expf32,
                                                                       const mxfp8i_act_params *ap, int64_t I,
                                                                       const float *dI, float aq, int scale,
                                                                       const float *g, const float *u,
                                                                       const float *act, const float *sg,
                                                                       float *dgu) {
    const float gl = ap->gate_lo, gh = ap->gate_hi, ul = ap->up_lo, uh = ap->up_hi, b = ap->beta;
    const int gl_on = gl != -INFINITY, gh_on = gh != INFINITY, ul_on = ul != -INFINITY, uh_on = uh != INFINITY;
    float *dg = dgu, *du = dgu + I; /* du first holds dIv */
    if (sg) { /* one pass (mxfp8i_act_bwd_sig) */
        if (act) mxfp8i_act_bwd_sig(I, dI, aq, scale, g, u, act, 1, sg, ap, dg, du);
        else mxfp8i_act_bwd_sig(I, dI, aq, scale, g, u, g, 0, sg, ap, dg, du);
        return;
    }
    if (scale)
        for (int64_t i = 0; i < I; i++) du[i] = aq * dI[i];
    else
        for (int64_t i = 0; i < I; i++) du[i] = dI[i];
    if (!ap->squared_relu) { /* the forward's sigmoid recomputed, held in dg */
        mxfp8i_act_sigmoid(expf32, b, g, dg, I);
        for (int64_t i = 0; i < I; i++) dg[i] = dg[i] * (1.0f + b * g[i] * (1.0f - dg[i]));
    } else {
        for (int64_t i = 0; i < I; i++) dg[i] = mxfp8i_act_drelu2(g[i]);
    }
    if (ap->up_plus_one) /* d_gate = dIv * (u + 1) * act'(g) */
        for (int64_t i = 0; i < I; i++) dg[i] = du[i] * (u[i] + 1.0f) * dg[i];
    else
        for (int64_t i = 0; i < I; i++) dg[i] = du[i] * u[i] * dg[i];
    for (int64_t i = 0; i < I; i++) du[i] = du[i] * act[i]; /* (without the sigmoid, act is given) */
    /* the clamps' gradient masks, where a limit is present (g and u are the clamped values, unchanged above) */
    if (gl_on || gh_on)
        for (int64_t i = 0; i < I; i++) dg[i] = mxfp8i_act_pass(g[i], gl_on, gl, gh_on, gh) ? dg[i] : 0.0f;
    if (ul_on || uh_on)
        for (int64_t i = 0; i < I; i++) du[i] = mxfp8i_act_pass(u[i], ul_on, ul, uh_on, uh) ? du[i] : 0.0f;
}

#endif /* MXFP8_KERNELS_ACT_ROWS_H */
