/*
 * layout.h -- the one formula of each E8M0 scale layout (internal; the public enum mxfp8_scale_layout documents the
 * same formulas for users). An operand of F non-contracted rows and K contraction indices has G = ceil(K/32) groups
 * per row; scale (f, g) sits at (row, col) of the layout's 2-D shape:
 *   COMPACT        [F, G]                      (f, g)
 *   NKI_UNPACKED   [ceil(G/4)*32, F]           ((g/4)*32 + g%4, f)                                         [NKI-Q]
 *   NKI_PACKED     [ceil(K/2048)*128, F]       ((g/64)*128 + ((g%64)/16)*4 + ((g%16)/4)*32 + g%4, f)      [NKI-Q]
 *   SWIZZLE_128X4  [R', C'] (or flat [R'*C'])  flat off = ((f/128)*(C'/4) + g/4)*512 + (f%32)*16 +
 *                                              ((f%128)/32)*4 + g%4; R' = F up to 128, C' = G up to 4  (cuBLAS)
 * Users: src/quant/layouts.c (conversions), src/gemm/operand.c (pre-quantized GEMM operands).
 */
#ifndef MXFP8_QUANT_LAYOUT_H
#define MXFP8_QUANT_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>

#include "mxfp8.h"

static inline bool mxfp8i_layout_known(mxfp8_scale_layout l) {
    return mxfp8_enum_name(MXFP8_ENUM_SCALE_LAYOUT, (int32_t)l) != NULL;
}
/** Name of a scale layout (its canonical name of MXFP8_ENUM_SCALE_LAYOUT; "unknown" otherwise). */
static inline const char *mxfp8i_layout_name(mxfp8_scale_layout layout) {
    const char *name = mxfp8_enum_name(MXFP8_ENUM_SCALE_LAYOUT, (int32_t)layout);
    return name ? name : "unknown";
}

/* ceil(a/b) for a >= 0, b > 0, without overflow near INT64_MAX */
static inline int64_t mxfp8i_layout_cdiv(int64_t a, int64_t b) { return a / b + (a % b != 0); }

/** The 2-D shape of `layout` for (F, K); false on a negative size, an unknown layout or an overflowing size. */
static inline bool mxfp8i_layout_shape(mxfp8_scale_layout layout, int64_t F, int64_t K, int64_t shape[2]) {
    if (F < 0 || K < 0 || F > INT64_MAX / 4 || K > INT64_MAX / 4) return false;
    int64_t G = mxfp8i_layout_cdiv(K, 32);
    switch (layout) {
    case MXFP8_SCALES_COMPACT: shape[0] = F; shape[1] = G; break;
    case MXFP8_SCALES_NKI_UNPACKED: shape[0] = mxfp8i_layout_cdiv(G, 4) * 32; shape[1] = F; break;
    case MXFP8_SCALES_NKI_PACKED: shape[0] = mxfp8i_layout_cdiv(K, 2048) * 128; shape[1] = F; break;
    case MXFP8_SCALES_SWIZZLE_128X4:
        shape[0] = mxfp8i_layout_cdiv(F, 128) * 128;
        shape[1] = mxfp8i_layout_cdiv(G, 4) * 4;
        break;
    default: return false;
    }
    return shape[0] >= 0 && shape[1] >= 0 && (shape[0] == 0 || shape[1] <= INT64_MAX / shape[0]);
}

/** Position (row, col) of scale (f, g) in `layout`, whose 2-D shape has C' = cols columns (the SWIZZLE_128X4 flat
 *  offset is row * cols + col). */
static inline void mxfp8i_layout_pos(mxfp8_scale_layout layout, int64_t f, int64_t g, int64_t cols, int64_t *row,
                                     int64_t *col) {
    switch (layout) {
    case MXFP8_SCALES_COMPACT: *row = f; *col = g; return;
    case MXFP8_SCALES_NKI_UNPACKED: *row = (g / 4) * 32 + g % 4; *col = f; return;
    case MXFP8_SCALES_NKI_PACKED: *row = (g / 64) * 128 + ((g % 64) / 16) * 4 + ((g % 16) / 4) * 32 + g % 4; *col = f;
        return;
    default: {
        int64_t off = ((f / 128) * (cols / 4) + g / 4) * 512 + (f % 32) * 16 + ((f % 128) / 32) * 4 + g % 4;
        *row = off / cols;
        *col = off % cols;
        return;
    }
    }
}

#endif /* MXFP8_QUANT_LAYOUT_H */
