/*
 * gemm_util.h -- what the GEMM tests (test_gemm.c, test_matmul_bwd.c) share: the kernels to force, a FAIL counter, a
 * deterministic generator and bit comparisons. Header-only: each test is its own executable.
 */
#ifndef MXFP8_TEST_GEMM_UTIL_H
#define MXFP8_TEST_GEMM_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm/gemm.h"
#include "kernels/registry.h"
#include "kernel_list.h"
#include "oracle.h"

/* The kernels mxfp8_gemm is run with: the registry's choice (NULL), then every runtime kernel this CPU supports,
 * whatever MXFP8_ISA says, that passed its self-test here (test_kernels checks those that fail). Returns the count. */
static inline int gemm_kernels(const mxfp8i_ukernel *out[16]) {
    int n = 0;
    out[n++] = NULL;
    for (const mxfp8i_ukernel *const *it = mxfp8t_all_ukernels(); *it && n < 16; it++)
        if (mxfp8i_ukernel_usable(*it)) out[n++] = *it;
    return n;
}

static int failures;
#define FAIL(...)                                                                                                      \
    do {                                                                                                               \
        failures++;                                                                                                    \
        if (failures < 30) { printf("FAIL: " __VA_ARGS__); printf("\n"); }                                             \
    } while (0)

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static inline uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static inline float urand(void) { return (float)(rnd() % 2000001) / 1000000.0f - 1.0f; }
static inline float nrand(void) {
    float s = 0;
    for (int i = 0; i < 6; i++) s += urand();
    return s;
}

/* A value an MXFP8 panel can hold: FP8 code x 2^e, including FP32 subnormals. */
static inline float deq_value(int kind) {
    uint8_t code = (uint8_t)rnd();
    mxfp8_format f = (rnd() & 1) ? MXFP8_FMT_E4M3 : MXFP8_FMT_E5M2;
    float v = mxfp8_fp8_to_fp32(code, f);
    if (isnan(v) || isinf(v)) v = 1.0f;
    int e = kind == 0 ? (int)(rnd() % 16) - 8 : kind == 1 ? -127 - (int)(rnd() % 4) : (int)(rnd() % 254) - 127;
    return ldexpf(v, e);
}

static inline int bits_eq(float a, float b) { return memcmp(&a, &b, 4) == 0; }
static inline uint32_t f32_bits(float a) {
    uint32_t u;
    memcpy(&u, &a, 4);
    return u;
}

#endif /* MXFP8_TEST_GEMM_UTIL_H */
