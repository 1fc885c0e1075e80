/*
 * groups.h -- which indices along the quantization axis form one MX group (internal).
 *   1x32  [OCP §6]: group g = indices [32g, 32g + 32) (the last group may be short).
 *   wrapX [NKI-Q]:  the axis (length K, K % 128 == 0) is cut in 512-tiles, the remainder in a 256 and/or a 128
 *                   subtile; in a (sub)tile at k0 of size P, S = P/4, group j holds {k0 + s*S + 8j + q : s < 4,
 *                   q < 8}; its compact index is k0/32 + j.
 */
#ifndef MXFP8_FORMAT_GROUPS_H
#define MXFP8_FORMAT_GROUPS_H

#include <stdint.h>

#include "mxfp8.h"

/** wrapX: the (sub)tile of an axis of length K (K % 128 == 0) holding index k: start *k0, size *P (512, 256, 128). */
static inline void mxfp8i_wrapx_tile_of(int64_t K, int64_t k, int64_t *k0, int64_t *P) {
    int64_t full = (K / 512) * 512;
    if (k < full) {
        *k0 = k - k % 512;
        *P = 512;
        return;
    }
    int64_t rem = K - full;
    if (rem >= 256 && k < full + 256) {
        *k0 = full;
        *P = 256;
        return;
    }
    *k0 = full + (rem >= 256 ? 256 : 0);
    *P = 128;
}
/** The indices along the axis of compact group g (ascending within each run); returns their count (<= 32). */
static inline int mxfp8i_group_members(int64_t K, mxfp8_group_scheme group, int64_t g, int64_t idx[32]) {
    if (group == MXFP8_GROUP_WRAPX) {
        int64_t k0, P;
        mxfp8i_wrapx_tile_of(K, g * 32, &k0, &P);
        int64_t S = P / 4, j = g - k0 / 32;
        for (int s = 0; s < 4; s++)
            for (int q = 0; q < 8; q++) idx[s * 8 + q] = k0 + s * S + 8 * j + q;
        return 32;
    }
    int n = K - g * 32 < 32 ? (int)(K - g * 32) : 32;
    for (int i = 0; i < n; i++) idx[i] = g * 32 + i;
    return n;
}
/** The compact group holding index k along the axis. */
static inline int64_t mxfp8i_group_of(int64_t K, mxfp8_group_scheme group, int64_t k) {
    if (group == MXFP8_GROUP_WRAPX) {
        int64_t k0, P;
        mxfp8i_wrapx_tile_of(K, k, &k0, &P);
        return k0 / 32 + ((k - k0) % (P / 4)) / 8;
    }
    return k / 32;
}

#endif /* MXFP8_FORMAT_GROUPS_H */
