/*
 * test_quant_avx512.c -- the AVX-512 quantize / qdq / dequantize panels against the scalar reference panels, bit for
 * bit (codes, scales, qdq values, inexact counts): all 65,536 BF16 and F16 values (sorted and shuffled), 2^20
 * random FP32 values across every binade (NaN/Inf included), boundary groups (RCEIL's 1.75 boundary, exact ties,
 * clamped exponents), axis lengths 1, 31, 32, 33, 127, 129, 2432, rows and columns with odd leading dimensions,
 * both formats, all three rules, all output kinds, 1x32 and wrapX; dequantization of random codes and scales.
 * Both implementations are called directly, so the test means the same under any MXFP8_ISA. Exit 77 (skip) on a
 * CPU without AVX-512.
 */
#include <math.h>

#include "format/codec.h"
#include "format/groups.h"
#include "kernels/avx512/avx512.h"
#include "kernels/qpanel.h"
#include "kernels/ref/ref.h"
#include "kernels/registry.h"
#include "quant/panel.h"
#include "runtime/tensor.h"
#include "testutil.h"

static const mxfp8_dtype OUT_DT[4] = {MXFP8_DTYPE_U8, MXFP8_DTYPE_F32, MXFP8_DTYPE_BF16, MXFP8_DTYPE_F16};
static const char *OUT_NAME[4] = {"codes", "f32", "bf16", "f16"};
static const char *FMT_NAME[2] = {"e4m3", "e5m2"};
static const char *RULE_NAME[3] = {"nki", "ocp", "rceil"};

/* ---------------------------------------------------------------------------------------------------------- */
/* AVX-512 vs reference                                                                                       */
/* ---------------------------------------------------------------------------------------------------------- */
/* Element (l, k) of a panel taken from `vals` (n values of dtype dt) at (l*K + k) mod n... or zero past n. */
static void *make_panel_src(const void *vals, int64_t n, mxfp8_dtype dt, int64_t lines, int64_t K, int cols,
                            int64_t *ld) {
    size_t es = mxfp8_dtype_size(dt);
    *ld = cols ? lines + 3 : K + 5; /* odd leading dimensions */
    int64_t rows = cols ? K : lines, size = rows * *ld;
    char *buf = tu_alloc((size_t)size * es);
    memset(buf, 0x7F, (size_t)size * es); /* padding: NaN-ish garbage that must never be read */
    for (int64_t l = 0; l < lines; l++)
        for (int64_t k = 0; k < K; k++) {
            int64_t i = l * K + k, off = cols ? k * *ld + l : l * *ld + k;
            if (i < n)
                memcpy(buf + off * es, (const char *)vals + i * es, es);
            else
                memset(buf + off * es, 0, es);
        }
    return buf;
}

static void cmp_quant_panel(const void *vals, int64_t n, mxfp8_dtype dt, int64_t lines, int64_t K, int cols,
                            mxfp8_group_scheme group, const char *what) {
    int64_t ld;
    void *src = make_panel_src(vals, n, dt, lines, K, cols, &ld);
    int64_t G = (K + 31) / 32, rows = cols ? K : lines, ldo = cols ? lines + 1 : K + 2;
    int64_t sc_rows = cols ? G : lines, ld_sc = cols ? lines + 2 : G + 1;
    for (int fmt = 0; fmt < 2; fmt++)
        for (int rule = 0; rule < 3; rule++)
            for (int ok = 0; ok < 4; ok++) {
                size_t os = mxfp8_dtype_size(OUT_DT[ok]), osz = (size_t)(rows * ldo) * os;
                size_t ssz = (size_t)(sc_rows * ld_sc);
                char *o1 = tu_alloc(osz), *o2 = tu_alloc(osz);
                uint8_t *s1 = tu_alloc(ssz), *s2 = tu_alloc(ssz);
                memset(o1, 0x5A, osz);
                memset(o2, 0x5A, osz);
                memset(s1, 0x5A, ssz);
                memset(s2, 0x5A, ssz);
                mxfp8i_qpanel p = {src,
                                   dt,
                                   lines,
                                   K,
                                   cols ? 1 : ld,
                                   cols ? ld : 1,
                                   (mxfp8_format)fmt,
                                   (mxfp8_scale_rule)rule,
                                   group,
                                   o1,
                                   OUT_DT[ok],
                                   cols ? 1 : ldo,
                                   cols ? ldo : 1,
                                   s1,
                                   cols ? 1 : ld_sc,
                                   cols ? ld_sc : 1,
                                   {0, 0, 0, 0, 0, 0},
                                   NULL};
                int64_t r1 = mxfp8i_quantize_panel__ref(&p);
                p.out = o2;
                p.scales = s2;
                int64_t r2 = mxfp8i_quantize_panel__avx512(&p);
                TU_CHECK(r2 >= 0, "%s: avx512 panel refused the geometry", what);
                TU_CHECK(r1 == r2, "%s %s %s %s: inexact count ref %lld avx512 %lld", what, FMT_NAME[fmt],
                         RULE_NAME[rule], OUT_NAME[ok], (long long)r1, (long long)r2);
                if (memcmp(s1, s2, ssz)) {
                    size_t i = 0;
                    while (s1[i] == s2[i]) i++;
                    TU_CHECK(0, "%s %s %s %s: scale at byte %zu: ref %u avx512 %u", what, FMT_NAME[fmt],
                             RULE_NAME[rule], OUT_NAME[ok], i, s1[i], s2[i]);
                }
                if (memcmp(o1, o2, osz)) {
                    size_t i = 0;
                    while (!memcmp(o1 + i * os, o2 + i * os, os)) i++;
                    uint32_t a = 0, b = 0;
                    memcpy(&a, o1 + i * os, os);
                    memcpy(&b, o2 + i * os, os);
                    int64_t rr = (int64_t)i / ldo, cc = (int64_t)i % ldo;
                    int64_t l = cols ? cc : rr, k = cols ? rr : cc;
                    float x = l < lines && k < K ? mxfp8i_load_f32(src, dt, cols ? k * ld + l : l * ld + k) : 0;
                    TU_CHECK(0, "%s %s %s %s: element (line %lld, k %lld) x=%a: ref 0x%x avx512 0x%x", what,
                             FMT_NAME[fmt], RULE_NAME[rule], OUT_NAME[ok], (long long)l, (long long)k, x, a, b);
                }
                free(o1);
                free(o2);
                free(s1);
                free(s2);
            }
    free(src);
}

static void cmp_dequant_panel(int64_t lines, int64_t K, int cols, mxfp8_group_scheme group, tu_rng *rng) {
    int64_t G = (K + 31) / 32, rows = cols ? K : lines, ldc = cols ? lines + 1 : K + 3;
    int64_t sc_rows = cols ? G : lines, ld_sc = cols ? lines : G;
    uint8_t *codes = tu_alloc((size_t)(rows * ldc)), *sc = tu_alloc((size_t)(sc_rows * ld_sc));
    for (int64_t i = 0; i < rows * ldc; i++) codes[i] = (uint8_t)tu_next(rng);
    for (int64_t i = 0; i < sc_rows * ld_sc; i++) {
        uint64_t r = tu_next(rng);
        sc[i] = (r & 7) == 0   ? (uint8_t)(r >> 8)
                : (r & 7) == 1 ? (uint8_t)(r >> 8 & 1 ? 0 : 255)
                               : (uint8_t)(120 + (r >> 8) % 16);
    }
    for (int fmt = 0; fmt < 2; fmt++)
        for (int ok = 1; ok < 4; ok++) {
            size_t os = mxfp8_dtype_size(OUT_DT[ok]), osz = (size_t)(rows * ldc) * os;
            char *o1 = tu_alloc(osz), *o2 = tu_alloc(osz);
            memset(o1, 0x33, osz);
            memset(o2, 0x33, osz);
            mxfp8i_dqpanel p = {codes,
                                (mxfp8_format)fmt,
                                lines,
                                K,
                                cols ? 1 : ldc,
                                cols ? ldc : 1,
                                sc,
                                cols ? 1 : ld_sc,
                                cols ? ld_sc : 1,
                                group,
                                o1,
                                OUT_DT[ok],
                                cols ? 1 : ldc,
                                cols ? ldc : 1};
            int64_t r1 = mxfp8i_dequantize_panel__ref(&p);
            p.out = o2;
            int64_t r2 = mxfp8i_dequantize_panel__avx512(&p);
            TU_CHECK(r1 == r2, "dequant %s %s lines %lld K %lld %s: inexact ref %lld avx512 %lld",
                     cols ? "cols" : "rows", FMT_NAME[fmt], (long long)lines, (long long)K, OUT_NAME[ok], (long long)r1,
                     (long long)r2);
            if (memcmp(o1, o2, osz)) {
                size_t i = 0;
                while (!memcmp(o1 + i * os, o2 + i * os, os)) i++;
                uint32_t a = 0, b = 0;
                memcpy(&a, o1 + i * os, os);
                memcpy(&b, o2 + i * os, os);
                TU_CHECK(0,
                         "dequant %s %s %s group %d lines %lld K %lld: element %zu (code 0x%02x): ref 0x%x avx512 0x%x",
                         cols ? "cols" : "rows", FMT_NAME[fmt], OUT_NAME[ok], (int)group, (long long)lines,
                         (long long)K, i, codes[i], a, b);
            }
            free(o1);
            free(o2);
        }
    free(codes);
    free(sc);
}


/* Boundary groups: amax with a fraction at the RCEIL boundary (1.75 = 0x600000 and its neighbours) or other edges,
 * exponents across the whole FP32 range (the clamps at -127/+127 included), and elements with few significant bits
 * placed 0..14 binades below amax, which lands them on exact ties of the FP8 grid (normal and subnormal). */
static void fill_edge_f32(float *x, int64_t n, tu_rng *rng) {
    static const uint32_t fr[] = {0,        0x600000, 0x600001, 0x5FFFFF, 0x7FFFFF, 0x400000,
                                  0x700000, 0x780000, 0x7C0000, 0x100000, 0x000001, 0x200000};
    int E = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = tu_next(rng);
        if (i % 32 == 0) E = (int)(tu_next(rng) % 280) - 150;
        if (i % 32 == (int64_t)(r >> 60) % 32 || i % 32 == 0) {
            int e = E < -126 ? -126 : E > 127 ? 127 : E;
            uint32_t u = ((uint32_t)(e + 127) << 23) | fr[(r >> 8) % (sizeof fr / sizeof fr[0])];
            if (E < -126) u = fr[(r >> 8) % (sizeof fr / sizeof fr[0])] >> ((-126 - E) % 23); /* subnormal amax */
            x[i] = tu_bits_f32(u | ((uint32_t)(r & 1) << 31));
        } else {
            int d = (int)((r >> 4) % 15);
            uint32_t man = (uint32_t)(r >> 32) & 0x7E0000u; /* <= 6 significant bits */
            x[i] = (r & 2 ? -1.0f : 1.0f) * ldexpf(1.0f + (float)man / 8388608.0f, E - d < -149 ? -149 : E - d);
        }
    }
}

static void shuffle_u16(uint16_t *v, int64_t n, tu_rng *rng) {
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(tu_next(rng) % (uint64_t)(i + 1));
        uint16_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

static int test_avx512_vs_ref(void) {
    tu_rng rng = {12345};
    static const int64_t Ks[] = {1, 31, 32, 33, 127, 129, 2432};
    uint16_t *all = tu_alloc(65536 * 2), *shuf = tu_alloc(65536 * 2);
    for (int i = 0; i < 65536; i++) all[i] = shuf[i] = (uint16_t)i;
    shuffle_u16(shuf, 65536, &rng);
    char what[128];
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
        int64_t K = Ks[ki], lines = (65536 + K - 1) / K;
        for (int cols = 0; cols < 2; cols++) {
            snprintf(what, sizeof what, "bf16 all-values sorted %s K=%lld", cols ? "cols" : "rows", (long long)K);
            cmp_quant_panel(all, 65536, MXFP8_DTYPE_BF16, lines, K, cols, MXFP8_GROUP_1X32, what);
            snprintf(what, sizeof what, "bf16 all-values shuffled %s K=%lld", cols ? "cols" : "rows", (long long)K);
            cmp_quant_panel(shuf, 65536, MXFP8_DTYPE_BF16, lines, K, cols, MXFP8_GROUP_1X32, what);
            snprintf(what, sizeof what, "f16 all-values shuffled %s K=%lld", cols ? "cols" : "rows", (long long)K);
            cmp_quant_panel(shuf, 65536, MXFP8_DTYPE_F16, lines, K, cols, MXFP8_GROUP_1X32, what);
        }
    }
    /* 2^20 random FP32 values */
    int64_t nf = 1 << 20;
    float *xf = tu_alloc((size_t)nf * 4);
    tu_fill_random_f32(xf, nf, &rng);
    static const int64_t Kf[] = {32, 33, 2432};
    for (size_t ki = 0; ki < sizeof Kf / sizeof Kf[0]; ki++)
        for (int cols = 0; cols < 2; cols++) {
            int64_t K = Kf[ki], lines = (nf + K - 1) / K;
            snprintf(what, sizeof what, "f32 random %s K=%lld", cols ? "cols" : "rows", (long long)K);
            cmp_quant_panel(xf, nf, MXFP8_DTYPE_F32, lines, K, cols, MXFP8_GROUP_1X32, what);
        }
    float *xe = tu_alloc((size_t)(1 << 18) * 4);
    fill_edge_f32(xe, 1 << 18, &rng);
    for (int cols = 0; cols < 2; cols++) {
        snprintf(what, sizeof what, "f32 edge groups %s K=64", cols ? "cols" : "rows");
        cmp_quant_panel(xe, 1 << 18, MXFP8_DTYPE_F32, (1 << 18) / 64, 64, cols, MXFP8_GROUP_1X32, what);
    }
    free(xe);
    /* short lengths on FP32 and small line counts (tails across lines) */
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
        for (int cols = 0; cols < 2; cols++) {
            snprintf(what, sizeof what, "f32 random %s K=%lld lines=37", cols ? "cols" : "rows", (long long)Ks[ki]);
            cmp_quant_panel(xf + 1000, 37 * Ks[ki], MXFP8_DTYPE_F32, 37, Ks[ki], cols, MXFP8_GROUP_1X32, what);
        }
    /* wrapX */
    static const int64_t Kw[] = {128, 256, 384, 640, 2432};
    for (size_t ki = 0; ki < sizeof Kw / sizeof Kw[0]; ki++)
        for (int cols = 0; cols < 2; cols++) {
            int64_t K = Kw[ki];
            snprintf(what, sizeof what, "wrapX f32 %s K=%lld", cols ? "cols" : "rows", (long long)K);
            cmp_quant_panel(xf, 45 * K, MXFP8_DTYPE_F32, 45, K, cols, MXFP8_GROUP_WRAPX, what);
            snprintf(what, sizeof what, "wrapX bf16 %s K=%lld", cols ? "cols" : "rows", (long long)K);
            cmp_quant_panel(shuf, 33 * K < 65536 ? 33 * K : 65536, MXFP8_DTYPE_BF16, 33, K, cols, MXFP8_GROUP_WRAPX,
                            what);
        }
    /* dequantization */
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
        for (int cols = 0; cols < 2; cols++) cmp_dequant_panel(77, Ks[ki], cols, MXFP8_GROUP_1X32, &rng);
    for (size_t ki = 0; ki < sizeof Kw / sizeof Kw[0]; ki++)
        for (int cols = 0; cols < 2; cols++) cmp_dequant_panel(41, Kw[ki], cols, MXFP8_GROUP_WRAPX, &rng);
    free(xf);
    free(all);
    free(shuf);
    return 1;
}

int main(void) {
    if (!tu_has_avx512()) {
        printf("test_quant_avx512: CPU lacks AVX-512: skipped\n");
        return TU_SKIP;
    }
    test_avx512_vs_ref();
    return tu_finish("test_quant_avx512");
}
