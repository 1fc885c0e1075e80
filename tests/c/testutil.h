/*
 * testutil.h -- tiny shared helpers for the C tests (header-only; each test is its own executable).
 *
 *   TU_CHECK(cond, fmt, ...)   count a failure and print one line (at most TU_MAX_PRINT lines per test)
 *   tu_rng / tu_next / tu_uniform   a deterministic xorshift-style generator (splitmix64)
 *   tu_f32_bits / tu_bits_f32      bit casts
 *   tu_fill_random_f32              FP32 values over every binade, with ties, signed zeros, NaN/Inf bit patterns
 *   tu_has_avx512()             AVX-512F+BW present on this CPU (mxfp8_get_info), for skips
 *   tu_finish(name)             print a summary; returns the exit code (0 pass, 1 fail)
 * A test of several files (tests/c/test_X.c plus the files in tests/c/X/) defines TU_SHARED_COUNTERS before including this and
 * defines `long tu_failures, tu_checks;` in one of its files.
 * Exit codes: 0 pass, 77 skip (TU_SKIP), anything else fail.
 */
#ifndef MXFP8_TESTUTIL_H
#define MXFP8_TESTUTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MXFP8_REFERENCE_API /* goldens and compare (the no-ABI-promise section of mxfp8.h) */
#include "mxfp8.h"

#define TU_SKIP 77
#ifndef TU_MAX_PRINT
#define TU_MAX_PRINT 30
#endif

#ifdef TU_SHARED_COUNTERS /* a test made of several files: one of them defines the counters */
extern long tu_failures, tu_checks;
#else
static long tu_failures = 0;
static long tu_checks = 0;
#endif

#define TU_CHECK(cond, ...)                                                                                            \
    do {                                                                                                               \
        tu_checks++;                                                                                                   \
        if (!(cond)) {                                                                                                 \
            if (tu_failures++ < TU_MAX_PRINT) {                                                                        \
                fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                   \
                fprintf(stderr, __VA_ARGS__);                                                                          \
                fputc('\n', stderr);                                                                                   \
            }                                                                                                          \
        }                                                                                                              \
    } while (0)

static inline int tu_finish(const char *name) {
    if (tu_failures) {
        fprintf(stderr, "%s: %ld of %ld checks FAILED\n", name, tu_failures, tu_checks);
        return 1;
    }
    printf("%s: all %ld checks passed\n", name, tu_checks);
    return 0;
}

typedef struct tu_rng {
    uint64_t s;
} tu_rng;
static inline uint64_t tu_next(tu_rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/** Uniform in [0, 1). */
static inline double tu_uniform(tu_rng *r) { return (double)(tu_next(r) >> 11) * (1.0 / 9007199254740992.0); }

static inline uint32_t tu_f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static inline float tu_bits_f32(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* Random FP32 values spanning every binade (FP32 subnormals to FLT_MAX), with ties, exact zeros, and 1/64 raw
 * random bit patterns (NaN, Inf). Magnitudes vary per 32-block so that most groups are finite. */
static inline void tu_fill_random_f32(float *x, int64_t n, tu_rng *rng) {
    int eb = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i % 32 == 0) eb = (int)(tu_next(rng) % 300) - 160;
        uint64_t r = tu_next(rng);
        uint32_t u;
        if ((r & 63) == 0) {
            u = (uint32_t)(r >> 32);
        } else if ((r & 63) == 1) {
            u = (uint32_t)(r >> 63) << 31; /* signed zero */
        } else {
            int e = eb - (int)((r >> 8) % 14);
            uint32_t man = (uint32_t)(r >> 32) & 0x7FFFFFu;
            if ((r >> 16 & 3) == 0) man &= 0x7C0000u; /* few significant bits: exact ties after scaling */
            float v = ldexpf(1.0f + (float)man / 8388608.0f, e < -149 ? -149 : e > 127 ? 127 : e);
            u = tu_f32_bits(v) | ((uint32_t)(r >> 24) & 1u) << 31;
        }
        x[i] = tu_bits_f32(u);
    }
}

static inline int tu_has_avx512(void) {
    mxfp8_info in;
    if (mxfp8_get_info(&in) != MXFP8_OK) return 0;
    return in.has_avx512f && in.has_avx512bw && in.has_avx512vl;
}

/** malloc that never returns NULL (tests abort on OOM with a message). */
static inline void *tu_alloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "test: out of memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

/** tu_alloc with 64-byte alignment (a cache line: where the kernels' non-temporal stores apply); free() it. */
static inline void *tu_alloc_aligned(size_t n) {
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "test: out of memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

/** mxfp8_quantize of a row-major [R, C] tensor of dtype dt along axis (0 or 1) into codes [R, C] (E4M3 or E5M2 as
 *  p.fmt says) and compact scales (the axis' length rounded up to 32-groups); a failure is a test failure. */
static inline void tu_quantize_2d(const void *x, mxfp8_dtype dt, int64_t R, int64_t C, int axis, mxfp8_quant_params p,
                                  uint8_t *codes, uint8_t *sc) {
    int64_t sh[2] = {R, C}, ssh[2] = {R, C};
    ssh[axis] = (sh[axis] + 31) / 32;
    mxfp8_tensor X = mxfp8_tensor_make((void *)x, dt, 2, sh);
    mxfp8_tensor D = mxfp8_tensor_make(codes, p.fmt == MXFP8_FMT_E5M2 ? MXFP8_DTYPE_E5M2 : MXFP8_DTYPE_E4M3, 2, sh);
    mxfp8_tensor S = mxfp8_tensor_make(sc, MXFP8_DTYPE_E8M0, 2, ssh);
    TU_CHECK(mxfp8_quantize(&X, axis, &p, &D, &S) == MXFP8_OK, "quantize [%lld, %lld] axis %d: %s", (long long)R,
             (long long)C, axis, mxfp8_last_error_message());
}

#endif /* MXFP8_TESTUTIL_H */
