/*
 * weights.c -- the experts' weights as GEMM operands, with their stochastic rounding when the config asks for it.
 *
 * A GEMM contracts each weight along one axis: W1 along H (forward GEMM 1, and its recomputation in the backward),
 * W1 along 2I (backward Phase 2), W2 along I (forward GEMM 2, the AFFINITY_ON_H recomputation), W2 along H
 * (backward Phase 1). The operand is the caller's own tensor viewed as [R, K] with its strides (high precision:
 * quantized by the GEMM's packer; pre-quantized along that axis: its codes and scales as given), so no copy is
 * made. Only pre-quantized weights used along another axis (dequantized exactly, then re-quantized: the highest
 * precision available), and W1 views whose (2, I) dimensions cannot be read as one 2I axis, go through an exact
 * FP32 copy of the expert's weights (mxfp8i_moe_load_w1 / _w2).
 */
#include <stdlib.h>

#include "../opstats.h"
#include "moe.h"

/* ---------------------------------------------------------------------------------------------------------- */
/* Weights                                                                                                    */
/* ---------------------------------------------------------------------------------------------------------- */
static inline float deq_code(const mxfp8i_moe *p, const mxfp8_tensor *codes, int64_t off, const mxfp8_tensor *sc,
                             int64_t soff) {
    uint8_t c = ((const uint8_t *)codes->data)[off];
    uint8_t s = ((const uint8_t *)sc->data)[soff];
    return mxfp8_fp8_to_fp32(c, p->rc.fmt) * mxfp8_e8m0_to_fp32(s);
}

void mxfp8i_moe_load_w1(const mxfp8i_moe *p, int64_t e, float *w1f) {
    const int64_t H = p->H, I = p->I;
    const mxfp8_tensor *w = &p->W1, *s = &p->W1s;
#pragma omp parallel num_threads(mxfp8i_moe_nt(2.0 * (double)H * (double)I))
    {
        const unsigned csr = mxfp8i_fenv_enter(); /* IEEE defaults on every thread of the region */
#pragma omp for schedule(static) nowait
        for (int64_t h = 0; h < H; h++)
            for (int64_t j = 0; j < 2; j++)
                for (int64_t i = 0; i < I; i++) {
                    int64_t off = e * w->strides[0] + h * w->strides[1] + j * w->strides[2] + i * w->strides[3];
                    float v;
                    if (!p->w1_prequant) {
                        v = mxfp8i_load_f32(w->data, w->dtype, off);
                    } else if (p->bwd) { /* scales [E, H, G(2I)] */
                        int64_t c = j * I + i;
                        v = deq_code(p, w, off, s, e * s->strides[0] + h * s->strides[1] + (c / 32) * s->strides[2]);
                    } else { /* scales [E, G(H), 2, I] */
                        v = deq_code(p, w, off, s,
                                     e * s->strides[0] + (h / 32) * s->strides[1] + j * s->strides[2] +
                                         i * s->strides[3]);
                    }
                    w1f[h * 2 * I + j * I + i] = v;
                }
        mxfp8i_fenv_leave(csr);
    }
}

void mxfp8i_moe_load_w2(const mxfp8i_moe *p, int64_t e, float *w2f) {
    const int64_t H = p->H, I = p->I;
    const mxfp8_tensor *w = &p->W2, *s = &p->W2s;
#pragma omp parallel num_threads(mxfp8i_moe_nt((double)H *(double)I))
    {
        const unsigned csr = mxfp8i_fenv_enter(); /* IEEE defaults on every thread of the region */
#pragma omp for schedule(static) nowait
        for (int64_t i = 0; i < I; i++)
            for (int64_t h = 0; h < H; h++) {
                int64_t off = e * w->strides[0] + i * w->strides[1] + h * w->strides[2];
                float v;
                if (!p->w2_prequant) v = mxfp8i_load_f32(w->data, w->dtype, off);
                else if (p->bwd) /* scales [E, I, G(H)] */
                    v = deq_code(p, w, off, s, e * s->strides[0] + i * s->strides[1] + (h / 32) * s->strides[2]);
                else /* scales [E, G(I), H] */
                    v = deq_code(p, w, off, s, e * s->strides[0] + (i / 32) * s->strides[1] + h * s->strides[2]);
                w2f[i * H + h] = v;
            }
        mxfp8i_fenv_leave(csr);
    }
}

void mxfp8i_moe_load_b1(const mxfp8i_moe *p, int64_t e, float *b1) {
    const int64_t I = p->I;
    for (int64_t j = 0; j < 2; j++)
        for (int64_t i = 0; i < I; i++)
            b1[j * I + i] = p->b1.data ? mxfp8i_load_f32(p->b1.data, p->b1.dtype,
                                                         e * p->b1.strides[0] + j * p->b1.strides[1] +
                                                             i * p->b1.strides[2])
                                       : 0.0f;
}

void mxfp8i_moe_load_b2(const mxfp8i_moe *p, int64_t e, float *b2) {
    for (int64_t h = 0; h < p->H; h++)
        b2[h] = p->b2.data ? mxfp8i_moe_ld2(&p->b2, e, h) : 0.0f;
}

/* Can W1[e]'s (2, I) dimensions (and, pre-quantized along H, its scales') be read as one axis c = j*I + i? */
static int w1_flat(const mxfp8i_moe *p) {
    const mxfp8_tensor *w = &p->W1, *s = &p->W1s;
    if (w->strides[2] != p->I * w->strides[3]) return 0;
    if (p->w1_prequant && !p->bwd && s->strides[2] != p->I * s->strides[3]) return 0;
    return 1;
}

int mxfp8i_moe_weight_needs_copy(const mxfp8i_moe *p, mxfp8i_moe_wuse use) {
    switch (use) {
    case MXFP8I_W1_H: return !w1_flat(p) || (p->w1_prequant && p->bwd);
    case MXFP8I_W1_2I: return !w1_flat(p) || (p->w1_prequant && !p->bwd);
    case MXFP8I_W2_I: return p->w2_prequant && p->bwd;
    default: return p->w2_prequant && !p->bwd;
    }
}

mxfp8_status mxfp8i_moe_wcopy_alloc(const mxfp8i_moe *p, unsigned uses, mxfp8i_moe_wcopy *w) {
    memset(w, 0, sizeof *w);
    w->e1 = w->e2 = -1;
    int need1 = 0, need2 = 0;
    for (int u = 0; u < 4; u++)
        if ((uses >> u & 1) && mxfp8i_moe_weight_needs_copy(p, (mxfp8i_moe_wuse)u)) {
            if (u == MXFP8I_W1_H || u == MXFP8I_W1_2I) need1 = 1;
            else need2 = 1;
        }
    const size_t HI = (size_t)p->H * (size_t)p->I;
    if (need1 && !(w->w1f = (float *)mxfp8i_ws_get(MXFP8I_WS_MOE_W1F, 2 * HI * sizeof(float))))
        return MXFP8_ERR_OUT_OF_MEMORY;
    if (need2 && !(w->w2f = (float *)mxfp8i_ws_get(MXFP8I_WS_MOE_W2F, HI * sizeof(float))))
        return MXFP8_ERR_OUT_OF_MEMORY;
    return MXFP8_OK;
}

/* The weight's stochastic rounding when the config asks for it: the operand id of the use, and the row-major index
 * in W1 [E, H, 2I] (c = j*I + i) or W2 [E, I, H] of element (r, k) of the use's [R, K] view. */
static mxfp8i_gop weight_rounding(const mxfp8i_moe *p, int64_t e, mxfp8i_moe_wuse use, mxfp8i_gop g) {
    static const int id[4] = {MXFP8_MOE_GEMM1_W1, MXFP8_MOE_P2_W1, MXFP8_MOE_GEMM2_W2, MXFP8_MOE_P1_W2};
    const int64_t H = p->H, I = p->I, I2 = 2 * I;
    if (!((p->cfg.stochastic_rounding >> id[use]) & 1u)) return g;
    int64_t base = e * H * I2, i0, i1; /* W1[e] and W2[e] have H*2I and I*H elements: the same base for both */
    switch (use) {
    case MXFP8I_W1_H: i0 = 1, i1 = I2; break;   /* (c, h): h*2I + c */
    case MXFP8I_W1_2I: i0 = I2, i1 = 1; break;  /* (h, c) */
    case MXFP8I_W2_I: base = e * I * H, i0 = 1, i1 = H; break; /* (h, i): i*H + h */
    default: base = e * I * H, i0 = H, i1 = 1; break;           /* (i, h) */
    }
    g.sr = mxfp8i_sround_make(1, p->cfg.rounding_seed, (uint64_t)id[use], base, i0, i1);
    return g;
}

static mxfp8i_gop weight_view(const mxfp8i_moe *p, mxfp8i_moe_wcopy *w, int64_t e, mxfp8i_moe_wuse use);

mxfp8i_gop mxfp8i_moe_weight(const mxfp8i_moe *p, mxfp8i_moe_wcopy *w, int64_t e, mxfp8i_moe_wuse use) {
    mxfp8i_gop g = weight_view(p, w, e, use);
    g.rc = p->rc; /* the layer's recipe: the format of pre-quantized codes, or the quantization of the GEMM's packer */
    return weight_rounding(p, e, use, g);
}

static mxfp8i_gop weight_view(const mxfp8i_moe *p, mxfp8i_moe_wcopy *w, int64_t e, mxfp8i_moe_wuse use) {
    const int64_t H = p->H, I = p->I, I2 = 2 * I;
    const int w1 = use == MXFP8I_W1_H || use == MXFP8I_W1_2I;
    if (mxfp8i_moe_weight_needs_copy(p, use)) { /* exact FP32 values of the expert, quantized by the GEMM */
        if (w1 && w->e1 != e) mxfp8i_moe_load_w1(p, e, w->w1f), w->e1 = e;
        if (!w1 && w->e2 != e) mxfp8i_moe_load_w2(p, e, w->w2f), w->e2 = e;
        switch (use) {
        case MXFP8I_W1_H: return mxfp8i_gop_hp(w->w1f, MXFP8_DTYPE_F32, I2, H, 1, I2);
        case MXFP8I_W1_2I: return mxfp8i_gop_hp(w->w1f, MXFP8_DTYPE_F32, H, I2, I2, 1);
        case MXFP8I_W2_I: return mxfp8i_gop_hp(w->w2f, MXFP8_DTYPE_F32, H, I, 1, H);
        default: return mxfp8i_gop_hp(w->w2f, MXFP8_DTYPE_F32, I, H, H, 1);
        }
    }
    const mxfp8_tensor *t = w1 ? &p->W1 : &p->W2, *s = w1 ? &p->W1s : &p->W2s;
    const size_t es = mxfp8_dtype_size(t->dtype);
    const char *base = (const char *)t->data + (size_t)(e * t->strides[0]) * es;
    const int64_t *ts = t->strides;
    int64_t R, K, s0, s1; /* the [R, K] view of the expert's weight for this use */
    switch (use) {
    case MXFP8I_W1_H: R = I2, K = H, s0 = ts[3], s1 = ts[1]; break;
    case MXFP8I_W1_2I: R = H, K = I2, s0 = ts[1], s1 = ts[3]; break;
    case MXFP8I_W2_I: R = H, K = I, s0 = ts[2], s1 = ts[1]; break;
    default: R = I, K = H, s0 = ts[1], s1 = ts[2]; break;
    }
    if (!(w1 ? p->w1_prequant : p->w2_prequant)) return mxfp8i_gop_hp(base, t->dtype, R, K, s0, s1);
    /* codes pre-quantized along this use's axis; scales in their documented layouts:
     *   forward  W1 [E, G(H), 2, I]   W2 [E, G(I), H]      backward  W1 [E, H, G(2I)]   W2 [E, I, G(H)] */
    const uint8_t *sb = (const uint8_t *)s->data + e * s->strides[0];
    const int64_t *ss = s->strides;
    int64_t ss0, ss1;
    switch (use) {
    case MXFP8I_W1_H: ss0 = ss[3], ss1 = ss[1]; break;
    case MXFP8I_W1_2I: ss0 = ss[1], ss1 = ss[2]; break;
    case MXFP8I_W2_I: ss0 = ss[2], ss1 = ss[1]; break;
    default: ss0 = ss[1], ss1 = ss[2]; break;
    }
    return mxfp8i_gop_codes((const uint8_t *)base, R, K, s0, s1, sb, ss0, ss1);
}
