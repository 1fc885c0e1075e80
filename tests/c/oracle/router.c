/*
 * router.c -- the oracle's router linear (oracle.h), from the section "Router linear" of include/mxfp8.h: each
 * output element one FP32 fmaf chain over its contraction index in ascending order from +0, the bias added once
 * after the chain. Written as the definition reads, one element at a time.
 */
#include <math.h>

#include "oracle.h"

void orc_router_logits(const float *x, const float *w, const float *b, int64_t T, int64_t H, int64_t E, float *out) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t e = 0; e < E; e++) {
            float acc = 0.0f;
            for (int64_t h = 0; h < H; h++) acc = fmaf(x[t * H + h], w[e * H + h], acc);
            out[t * E + e] = b ? acc + b[e] : acc;
        }
}

void orc_router_input_grad(const float *dl, const float *w, int64_t T, int64_t E, int64_t H, float *dx) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            float acc = 0.0f;
            for (int64_t e = 0; e < E; e++) acc = fmaf(dl[t * E + e], w[e * H + h], acc);
            dx[t * H + h] = acc;
        }
}

void orc_router_weight_grad(const float *dl, const float *x, int64_t T, int64_t E, int64_t H, float *dw) {
    for (int64_t e = 0; e < E; e++)
        for (int64_t h = 0; h < H; h++) {
            float acc = 0.0f;
            for (int64_t t = 0; t < T; t++) acc = fmaf(dl[t * E + e], x[t * H + h], acc);
            dw[e * H + h] = acc;
        }
}
