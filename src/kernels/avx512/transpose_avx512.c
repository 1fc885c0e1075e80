/*
 * transpose_avx512.c -- the transposing BF16 -> FP32 load and FP32 copy of the MoE checkpoints (qpanel.h,
 * mxfp8i_bf16_t_fn, mxfp8i_f32_t_fn): 16 x 16 tiles, each row a 256-bit load widened to FP32 (exact: the BF16 bits
 * become the high half) or a 512-bit load, transposed in registers (the 4-stage unpack / shuffle network, which
 * moves bits only), stored as 16 rows of 16 floats (streamed past the caches when the FP32 copy writes an output:
 * non-temporal stores wherever the destination rows are 64-byte aligned, then a store fence). Edges go through the
 * reference.
 */
#include <immintrin.h>
#include <stdint.h>

#include "avx512.h"
#include "../ref/ref.h"

/* Transpose 16 rows of 16 floats in place. */
static inline void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 16; i += 8)
        for (int j = 0; j < 4; j++) {
            t[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0x88);
            t[i + j + 4] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0xDD);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xDD);
    }
}

/* The full 16 x 16 tiles of either load (bf16: the source is BF16, widened; else FP32), rows [0, r16) x columns
 * [0, c16); the callers run the edges through their references. stream: non-temporal stores where the destination
 * rows are 64-byte aligned (the caller fences). */
static inline __attribute__((always_inline)) void full_tiles(const void *src, int bf16, int64_t ld_src, float *dst,
                                                             int64_t ld_dst, int64_t r16, int64_t c16, int stream) {
    const int nt = stream && ((uintptr_t)dst & 63) == 0 && (ld_dst & 15) == 0; /* then every tile row is aligned */
    for (int64_t r0 = 0; r0 < r16; r0 += 16)
        for (int64_t c0 = 0; c0 < c16; c0 += 16) {
            __m512 v[16];
            for (int i = 0; i < 16; i++) {
                const int64_t off = (r0 + i) * ld_src + c0;
                if (bf16) {
                    __m256i b = _mm256_loadu_si256((const __m256i *)((const uint16_t *)src + off));
                    v[i] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
                } else {
                    v[i] = _mm512_loadu_ps((const float *)src + off);
                }
            }
            transpose16(v);
            if (nt)
                for (int j = 0; j < 16; j++) _mm512_stream_ps(dst + (c0 + j) * ld_dst + r0, v[j]);
            else
                for (int j = 0; j < 16; j++) _mm512_storeu_ps(dst + (c0 + j) * ld_dst + r0, v[j]);
        }
}

void mxfp8i_bf16_t__avx512(const uint16_t *src, int64_t ld_src, float *dst, int64_t ld_dst, int64_t rows,
                           int64_t cols) {
    const int64_t r16 = rows / 16 * 16, c16 = cols / 16 * 16;
    full_tiles(src, 1, ld_src, dst, ld_dst, r16, c16, 0);
    /* the edges: columns past c16 of every row, rows past r16 of the first c16 columns */
    if (c16 < cols) mxfp8i_bf16_t__ref(src + c16, ld_src, dst + c16 * ld_dst, ld_dst, rows, cols - c16);
    if (r16 < rows) mxfp8i_bf16_t__ref(src + r16 * ld_src, ld_src, dst + r16, ld_dst, rows - r16, c16);
}

void mxfp8i_f32_t__avx512(const float *src, int64_t ld_src, float *dst, int64_t ld_dst, int64_t rows, int64_t cols,
                          int stream) {
    const int64_t r16 = rows / 16 * 16, c16 = cols / 16 * 16;
    full_tiles(src, 0, ld_src, dst, ld_dst, r16, c16, stream);
    if (c16 < cols) mxfp8i_f32_t__ref(src + c16, ld_src, dst + c16 * ld_dst, ld_dst, rows, cols - c16, 0);
    if (r16 < rows) mxfp8i_f32_t__ref(src + r16 * ld_src, ld_src, dst + r16, ld_dst, rows - r16, c16, 0);
    if (stream) _mm_sfence(); /* the non-temporal stores ordered before every later store of this thread */
}
