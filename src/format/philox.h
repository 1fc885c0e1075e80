/*
 * philox.h -- the counter-based generator of stochastic rounding: Philox-4x32-10 (Salmon, Moraes, Dror, Shaw,
 * "Parallel random numbers: as easy as 1, 2, 3", SC 2011; the Random123 reference and its known-answer vectors), and
 * the random word of one element (internal; the public statement of the rule is in include/mxfp8.h, "Stochastic
 * rounding").
 *
 * Element with logical index i >= 0 of a quantization with seed s and stream id t (both 64-bit):
 *   counter = (lo32(i >> 2), hi32(i >> 2), lo32(t), hi32(t)),  key = (lo32(s), hi32(s)),
 *   word    = Philox-4x32-10(counter, key)[i & 3].
 * So four consecutive indices share one generator call, and any thread, tile or ISA path that handles an element
 * derives the same word from its index alone.
 */
#ifndef MXFP8_FORMAT_PHILOX_H
#define MXFP8_FORMAT_PHILOX_H

#include <stdint.h>

#define MXFP8I_PHILOX_M0 0xD2511F53u
#define MXFP8I_PHILOX_M1 0xCD9E8D57u
#define MXFP8I_PHILOX_W0 0x9E3779B9u /* golden ratio */
#define MXFP8I_PHILOX_W1 0xBB67AE85u /* sqrt(3) - 1 */

/** Philox-4x32-10: ten rounds on `c` with key `k` (the key is bumped by (W0, W1) before rounds 2..10). */
static inline void mxfp8i_philox4x32_10(const uint32_t c_in[4], const uint32_t k_in[2], uint32_t out[4]) {
    uint32_t c0 = c_in[0], c1 = c_in[1], c2 = c_in[2], c3 = c_in[3], k0 = k_in[0], k1 = k_in[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += MXFP8I_PHILOX_W0;
            k1 += MXFP8I_PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)MXFP8I_PHILOX_M0 * c0, p1 = (uint64_t)MXFP8I_PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0, hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/** The 32-bit random word of the element with logical index `idx` (>= 0) for (seed, stream). */
static inline uint32_t mxfp8i_sr_word(uint64_t seed, uint64_t stream, int64_t idx) {
    uint64_t q = (uint64_t)idx >> 2;
    uint32_t c[4] = {(uint32_t)q, (uint32_t)(q >> 32), (uint32_t)stream, (uint32_t)(stream >> 32)};
    uint32_t k[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, o[4];
    mxfp8i_philox4x32_10(c, k, o);
    return o[idx & 3];
}

#endif /* MXFP8_FORMAT_PHILOX_H */
