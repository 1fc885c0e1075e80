/*
 * test_qkernels.c -- every quantization kernel of the kernel registry (mxfp8i_qkernel_list(): the reference panels
 * and the AVX-512 panels) against the tests' independent oracle (tests/c/oracle/), bit for bit: codes, scales, qdq
 * values as F32/BF16/F16, the BF16/F16-inexact counts, dequantized values, and the bytes around the outputs left
 * untouched. Every kernel the CPU supports runs, whatever MXFP8_ISA says (it chooses the library's path, not what is
 * tested); a kernel whose instructions the CPU lacks is a counted skip with the reason printed.
 * Data: all 65,536 BF16 and F16 values (sorted and shuffled), random FP32 values across every binade (NaN/Inf
 * included), boundary groups (RCEIL's 1.75 boundary, exact ties, clamped exponents, subnormal amax), groups at
 * the smallest scale codes with elements down to 2^-149 (qdq values below 2^-126, ties included), axis lengths 1,
 * 31, 32, 33, 127, 129, 2432, rows and columns with odd leading dimensions, both formats, all three rules, 1x32 and
 * wrapX; a strided panel that a SIMD kernel may decline (then it must write nothing); dequantization of random codes
 * and scales (NaN codes, scale 0 and 255 included); the FP32 -> BF16 rounding of the GEMM epilogue that comes with
 * each kernel; the transposing BF16 load and FP32 copy of the MoE checkpoints (plain and streaming stores); the FP32
 * copy of the segmented GEMM's outputs (every offset in a cache line); the exponential of the MoE activations:
 * every 251st FP32 bit pattern and the special values against exp in double precision (within 0.502 ULP of its
 * float format: the rule's accuracy), against glibc's expf bit for bit where the C library is glibc 2.28 or later
 * and the CPU has FMA (the rule is that expf's algorithm), and every kernel against the first, in place and out of
 * place, every tail length; the MoE activations' elementwise rows (every activation kind, clamps present and
 * absent, given and computed values, NaN / Inf / signed zeros, tail lengths) against their FP32 expressions, bit for
 * bit, nothing written past a row.
 */
#include <float.h>
#include <math.h>

#include "kernels/qpanel.h"
#include "kernels/registry.h"
#include "oracle.h"
#include "testutil.h"

static const mxfp8_dtype OUT_DT[4] = {MXFP8_DTYPE_U8, MXFP8_DTYPE_F32, MXFP8_DTYPE_BF16, MXFP8_DTYPE_F16};
static const char *OUT_NAME[4] = {"codes", "f32", "bf16", "f16"};
static const char *FMT_NAME[2] = {"e4m3", "e5m2"};
static const char *RULE_NAME[3] = {"nki", "ocp", "rceil"};
enum { SENT = 0x5A };

static const mxfp8i_qkernel *g_kernels[8];
static int g_nk, g_skips;

/* The value of element i of a buffer of dtype dt, by the oracle's own decoders. */
static double src_value(const void *buf, mxfp8_dtype dt, int64_t i) {
    if (dt == MXFP8_DTYPE_F32) return (double)((const float *)buf)[i];
    if (dt == MXFP8_DTYPE_BF16) return orc_bf16_value(((const uint16_t *)buf)[i]);
    return orc_fp16_value(((const uint16_t *)buf)[i]);
}

/* The oracle's output of kind ok (1 F32, 2 BF16, 3 F16) for a code under scale s, as raw bits, and whether a
 * BF16/F16 value differs from the exact FP32 one (the kernels' inexact count); memoized per (fmt, kind, s). */
typedef struct expect_row {
    int ready;
    uint32_t bits[256];
    uint8_t inexact[256];
} expect_row;
static const expect_row *expected_row(int fmt, int ok, int s) {
    static expect_row rows[2][4][256];
    expect_row *r = &rows[fmt][ok][s];
    if (r->ready) return r;
    for (int c = 0; c < 256; c++) {
        const float f = orc_f32(orc_dequant((uint8_t)c, s, fmt));
        uint16_t h = 0;
        if (ok == 1) {
            memcpy(&r->bits[c], &f, 4);
            r->inexact[c] = 0;
            continue;
        }
        h = ok == 2 ? orc_bf16_encode((double)f) : orc_fp16_encode((double)f);
        r->bits[c] = h;
        r->inexact[c] = !isnan(f) && (ok == 2 ? orc_bf16_value(h) : orc_fp16_value(h)) != (double)f;
    }
    r->ready = 1;
    return r;
}
/* Store the oracle's output for a code under scale s at element `off` of an output of kind ok; returns the
 * inexact flag. */
static int put_expected(void *out, int ok, int64_t off, uint8_t code, int s, int fmt) {
    if (ok == 0) {
        ((uint8_t *)out)[off] = code;
        return 0;
    }
    const expect_row *r = expected_row(fmt, ok, s);
    if (ok == 1) memcpy((float *)out + off, &r->bits[code], 4);
    else ((uint16_t *)out)[off] = (uint16_t)r->bits[code];
    return r->inexact[code];
}

/* A panel of `lines` lines of K values; rows: element (l, k) at src[l*ld + k], cols: at src[k*ld + l]. */
typedef struct qcase {
    const void *src;
    mxfp8_dtype dt;
    int64_t lines, K, ld;
    int cols;             /* 0 rows, 1 cols, 2 strided (rows with every other element: a SIMD kernel may decline) */
    mxfp8_group_scheme group;
    const char *what;
} qcase;

/* Element (l, k) of a panel of leading dimension ld in geometry cols (element stride 2 for the strided case). */
static int64_t at(int cols, int64_t ld, int64_t l, int64_t k) {
    return cols == 1 ? k * ld + l : cols == 2 ? l * ld + 2 * k : l * ld + k;
}

/* Source values (l*K + k) mod n of vals, in the case's geometry; padding never read is NaN-ish garbage. */
static void *make_src(const void *vals, int64_t n, qcase *c) {
    const size_t es = mxfp8_dtype_size(c->dt);
    c->ld = c->cols == 1 ? c->lines + 3 : c->cols == 2 ? 2 * c->K + 5 : c->K + 5;
    const int64_t size = (c->cols == 1 ? c->K : c->lines) * c->ld;
    char *buf = tu_alloc((size_t)size * es);
    memset(buf, 0x7F, (size_t)size * es);
    for (int64_t l = 0; l < c->lines; l++)
        for (int64_t k = 0; k < c->K; k++) {
            int64_t i = (l * c->K + k) % n, off = at(c->cols, c->ld, l, k);
            memcpy(buf + off * es, (const char *)vals + i * es, es);
        }
    c->src = buf;
    return buf;
}

/* Report the first difference of two buffers of element size es. */
static void report(const char *what, const char *part, const void *got, const void *want, size_t n, size_t es) {
    const char *g = got, *w = want;
    size_t i = 0;
    while (i < n && !memcmp(g + i * es, w + i * es, es)) i++;
    uint32_t a = 0, b = 0;
    memcpy(&a, g + i * es, es);
    memcpy(&b, w + i * es, es);
    TU_CHECK(0, "%s: %s element %zu: got 0x%x, oracle 0x%x", what, part, i, a, b);
}

/* One kernel on one (case, fmt, rule, output kind) against the expected buffers. */
static void run_quant(const mxfp8i_qkernel *qk, const qcase *c, int fmt, int rule, int ok, const char *eo,
                      const uint8_t *es, int64_t einx, size_t osz, size_t ssz, int64_t ldo, int64_t ld_sc) {
    const int cm = c->cols == 1;
    char *o = tu_alloc(osz);
    uint8_t *s = tu_alloc(ssz);
    memset(o, SENT, osz);
    memset(s, SENT, ssz);
    mxfp8i_qpanel p = {c->src,         c->dt,          c->lines,       c->K,
                       cm ? 1 : c->ld, cm ? c->ld : (c->cols == 2 ? 2 : 1),
                       (mxfp8_format)fmt, (mxfp8_scale_rule)rule, c->group, o,
                       OUT_DT[ok],     cm ? 1 : ldo,   cm ? ldo : 1,   s,
                       cm ? 1 : ld_sc, cm ? ld_sc : 1,  {0, 0, 0, 0, 0, 0},
                       NULL};
    char what[256];
    snprintf(what, sizeof what, "%s %s %s %s %s", qk->name, c->what, FMT_NAME[fmt], RULE_NAME[rule], OUT_NAME[ok]);
    int64_t r = qk->quantize(&p);
    if (r < 0) {
        int untouched = 1;
        for (size_t i = 0; i < osz; i++) untouched &= o[i] == (char)SENT;
        for (size_t i = 0; i < ssz; i++) untouched &= s[i] == SENT;
        TU_CHECK(untouched, "%s: declined the panel but wrote to it", what);
        TU_CHECK(c->cols == 2 && qk->isa_level > 0, "%s: declined a %s panel", what,
                 c->cols == 2 ? "strided panel (the reference must take any geometry)" : "rows/cols");
    } else {
        TU_CHECK(r == einx, "%s: inexact count %lld, oracle %lld", what, (long long)r, (long long)einx);
        if (memcmp(s, es, ssz)) report(what, "scales", s, es, ssz, 1);
        size_t e = mxfp8_dtype_size(OUT_DT[ok]);
        if (memcmp(o, eo, osz)) report(what, "out", o, eo, osz / e, e);
    }
    free(o);
    free(s);
}

/* Every kernel on a case: every format, rule and output kind. */
static void check_quant(qcase *c) {
    const int cm = c->cols == 1;
    const int64_t K = c->K, L = c->lines, G = (K + 31) / 32, rows = cm ? K : L, ldo = cm ? L + 1 : K + 2;
    const int64_t sc_rows = cm ? G : L, ld_sc = cm ? L + 2 : G + 1;
    const size_t ssz = (size_t)(sc_rows * ld_sc);
    uint8_t *codes = tu_alloc((size_t)(L * K)), *sc = tu_alloc((size_t)(L * G)), *es = tu_alloc(ssz);
    double *x = tu_alloc(sizeof(double) * (size_t)K);
    for (int fmt = 0; fmt < 2; fmt++)
        for (int rule = 0; rule < 3; rule++) {
            for (int64_t l = 0; l < L; l++) {
                for (int64_t k = 0; k < K; k++) x[k] = src_value(c->src, c->dt, at(c->cols, c->ld, l, k));
                orc_quant_line(x, 1, K, fmt, rule, (int)c->group, codes + l * K, sc + l * G);
            }
            memset(es, SENT, ssz);
            for (int64_t l = 0; l < L; l++)
                for (int64_t g = 0; g < G; g++) es[cm ? g * ld_sc + l : l * ld_sc + g] = sc[l * G + g];
            for (int ok = 0; ok < 4; ok++) {
                const size_t osz = (size_t)(rows * ldo) * mxfp8_dtype_size(OUT_DT[ok]);
                char *eo = tu_alloc(osz);
                memset(eo, SENT, osz);
                int64_t einx = 0, idx[32];
                for (int64_t l = 0; l < L; l++)
                    for (int64_t g = 0; g < G; g++) {
                        int n = orc_group_members(K, (int)c->group, g, idx);
                        for (int i = 0; i < n; i++) {
                            const int64_t off = cm ? idx[i] * ldo + l : l * ldo + idx[i];
                            einx += put_expected(eo, ok, off, codes[l * K + idx[i]], sc[l * G + g], fmt);
                        }
                    }
                for (int q = 0; q < g_nk; q++)
                    run_quant(g_kernels[q], c, fmt, rule, ok, eo, es, einx, osz, ssz, ldo, ld_sc);
                free(eo);
            }
        }
    free(codes), free(sc), free(es), free(x);
}

static void quant_case(const void *vals, int64_t n, mxfp8_dtype dt, int64_t lines, int64_t K, int cols,
                       mxfp8_group_scheme group, const char *what) {
    char name[160];
    snprintf(name, sizeof name, "%s %s K=%lld lines=%lld", what, cols == 1 ? "cols" : cols ? "strided" : "rows",
             (long long)K, (long long)lines);
    qcase c = {NULL, dt, lines, K, 0, cols, group, name};
    void *buf = make_src(vals, n, &c);
    check_quant(&c);
    free(buf);
}

/* Dequantization of random codes and scales (NaN codes, scales 0 and 255, ordinary scales). */
static void check_dequant(int64_t lines, int64_t K, int cols, mxfp8_group_scheme group, tu_rng *rng) {
    const int64_t G = (K + 31) / 32, rows = cols ? K : lines, ldc = cols ? lines + 1 : K + 3;
    const int64_t sc_rows = cols ? G : lines, ld_sc = cols ? lines : G;
    uint8_t *codes = tu_alloc((size_t)(rows * ldc)), *sc = tu_alloc((size_t)(sc_rows * ld_sc));
    for (int64_t i = 0; i < rows * ldc; i++) codes[i] = (uint8_t)tu_next(rng);
    for (int64_t i = 0; i < sc_rows * ld_sc; i++) {
        uint64_t r = tu_next(rng);
        sc[i] = (r & 7) == 0 ? (uint8_t)(r >> 8) : (r & 7) == 1 ? (uint8_t)(r >> 8 & 1 ? 0 : 255)
                                                                : (uint8_t)(120 + (r >> 8) % 16);
    }
    for (int fmt = 0; fmt < 2; fmt++)
        for (int ok = 1; ok < 4; ok++) {
            const size_t e = mxfp8_dtype_size(OUT_DT[ok]), osz = (size_t)(rows * ldc) * e;
            char *eo = tu_alloc(osz), *o = tu_alloc(osz);
            memset(eo, 0x33, osz);
            int64_t einx = 0, idx[32];
            for (int64_t l = 0; l < lines; l++)
                for (int64_t g = 0; g < G; g++) {
                    int n = orc_group_members(K, (int)group, g, idx);
                    for (int i = 0; i < n; i++) {
                        int64_t off = cols ? idx[i] * ldc + l : l * ldc + idx[i];
                        einx += put_expected(eo, ok, off, codes[off], sc[cols ? g * ld_sc + l : l * ld_sc + g], fmt);
                    }
                }
            for (int q = 0; q < g_nk; q++) {
                const mxfp8i_qkernel *qk = g_kernels[q];
                memset(o, 0x33, osz);
                mxfp8i_dqpanel p = {codes, (mxfp8_format)fmt, lines, K, cols ? 1 : ldc, cols ? ldc : 1, sc,
                                    cols ? 1 : ld_sc, cols ? ld_sc : 1, group, o, OUT_DT[ok], cols ? 1 : ldc,
                                    cols ? ldc : 1};
                char what[200];
                snprintf(what, sizeof what, "%s dequantize %s %s %s group %d lines %lld K %lld", qk->name,
                         cols ? "cols" : "rows", FMT_NAME[fmt], OUT_NAME[ok], (int)group, (long long)lines,
                         (long long)K);
                int64_t r = qk->dequantize(&p);
                TU_CHECK(r == einx, "%s: inexact count %lld, oracle %lld", what, (long long)r, (long long)einx);
                if (memcmp(o, eo, osz)) report(what, "out", o, eo, osz / e, e);
            }
            free(eo), free(o);
        }
    free(codes), free(sc);
}

/* The FP32 -> BF16 rounding of the GEMM epilogue (the kernels' to_bf16): RNE against the oracle's nearest-code
 * search on random bits (every binade, NaN with payloads, Inf, subnormals) and exact ties of the BF16 grid, for
 * tails of every length and an odd leading dimension; NaN must stay a quiet NaN with its sign; nothing outside the
 * rows x n block may be written. */
static void check_to_bf16(tu_rng *rng) {
    enum { ROWS = 37, N = 53, LDS = 61, LDD = 59 };
    float *src = tu_alloc(sizeof(float) * ROWS * LDS);
    uint16_t *got = tu_alloc(2 * ROWS * LDD);
    for (int i = 0; i < ROWS * LDS; i++) {
        uint64_t r = tu_next(rng);
        uint32_t u = (uint32_t)r;
        if ((r >> 40) % 3 == 0) u = (u & 0xFFFF0000u) | 0x8000u;        /* an exact tie */
        else if ((r >> 40) % 3 == 1) u = (u & 0xFFFF0000u) | ((u & 1) ? 0x7FFFu : 0x8001u); /* just beside one */
        src[i] = tu_bits_f32(u);
    }
    for (int q = 0; q < g_nk; q++) {
        const mxfp8i_qkernel *qk = g_kernels[q];
        for (int64_t n = 1; n <= N; n += n < 20 ? 1 : 11) {
            memset(got, 0xA5, 2 * ROWS * LDD);
            qk->to_bf16(src, LDS, got, LDD, ROWS, n);
            int64_t bad = 0, outside = 0;
            for (int r = 0; r < ROWS; r++)
                for (int j = 0; j < LDD; j++) {
                    const uint16_t h = got[r * LDD + j];
                    if (j >= n) {
                        outside += h != 0xA5A5;
                        continue;
                    }
                    const float x = src[r * LDS + j];
                    if (isnan(x)) {
                        bad += !isnan(orc_bf16_value(h)) || !(h & 0x40) || (h >> 15) != (tu_f32_bits(x) >> 31);
                        continue;
                    }
                    if (h != orc_bf16_encode((double)x) && bad++ < 3)
                        TU_CHECK(0, "%s to_bf16 of %a (0x%08x): 0x%04x, oracle 0x%04x", qk->name, x, tu_f32_bits(x), h,
                                 orc_bf16_encode((double)x));
                }
            TU_CHECK(bad == 0 && outside == 0, "%s to_bf16, n = %lld: %lld values differ from the oracle, %lld written "
                     "outside the block", qk->name, (long long)n, (long long)bad, (long long)outside);
        }
    }
    free(src);
    free(got);
}

/* The transposing loads of the MoE checkpoints: dst[c*ld_dst + r] = src[r*ld_src + c], bit for bit (BF16 widened
 * to FP32 by its bits << 16; FP32 copied, NaN payloads included, with plain and streaming stores: the streaming
 * copy also into a 64-byte aligned destination with a 64-float leading dimension, where a kernel's non-temporal
 * stores apply), for tile-sized and ragged shapes, nothing written outside the block. */
static void check_transposes(tu_rng *rng) {
    enum { R = 53, C = 47, LDS = 59, LDD_MAX = 64 };
    uint16_t *s16 = tu_alloc(2 * R * LDS);
    float *s32 = tu_alloc(4 * R * LDS), *got = tu_alloc_aligned(4 * C * LDD_MAX);
    for (int i = 0; i < R * LDS; i++) {
        const uint32_t u = (uint32_t)tu_next(rng);
        s16[i] = (uint16_t)u;
        s32[i] = tu_bits_f32(u);
    }
    static const int64_t shapes[][2] = {{16, 16}, {48, 32}, {1, 1}, {17, 15}, {53, 47}, {16, 47}, {53, 16}, {3, 31}};
    for (int q = 0; q < g_nk; q++) {
        const mxfp8i_qkernel *qk = g_kernels[q];
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (int kind = 0; kind < 4; kind++) { /* bf16_t; f32_t plain; streaming (odd ld); streaming (aligned) */
                const int64_t rows = shapes[si][0], cols = shapes[si][1], LDD = kind == 3 ? LDD_MAX : 61;
                memset(got, 0xA5, 4 * C * LDD_MAX);
                if (kind == 0) qk->bf16_t(s16, LDS, got, LDD, rows, cols);
                else qk->f32_t(s32, LDS, got, LDD, rows, cols, kind >= 2);
                int64_t bad = 0;
                for (int64_t c = 0; c < C; c++)
                    for (int64_t r = 0; r < LDD; r++) {
                        const uint32_t g = tu_f32_bits(got[c * LDD + r]);
                        const uint32_t want = r < rows && c < cols
                                                  ? (kind == 0 ? (uint32_t)s16[r * LDS + c] << 16
                                                               : tu_f32_bits(s32[r * LDS + c]))
                                                  : 0xA5A5A5A5u;
                        bad += g != want;
                    }
                static const char *kname[4] = {"bf16_t", "f32_t", "f32_t streaming", "f32_t streaming, aligned"};
                TU_CHECK(bad == 0, "%s %s [%lld x %lld]: %lld values wrong or written outside the block", qk->name,
                         kname[kind], (long long)rows, (long long)cols, (long long)bad);
            }
    }
    free(s16), free(s32), free(got);
}

/* The FP32 copy into an output written once (the segmented GEMM's weight gradients): dst[r*ld_dst + j] =
 * src[r*ld_src + j], bit for bit (NaN payloads included), for destinations at every float offset within a 64-byte
 * line, row lengths around the 16-float vector and the line, odd and line-multiple leading dimensions; nothing
 * written outside the rows. */
static void check_copy_f32(tu_rng *rng) {
    enum { ROWS = 5, LDS = 83, LDD_MAX = 96, SPAN = ROWS * LDD_MAX + 16 };
    float *src = tu_alloc(4 * ROWS * LDS), *buf = tu_alloc_aligned(4 * SPAN);
    for (int i = 0; i < ROWS * LDS; i++) src[i] = tu_bits_f32((uint32_t)tu_next(rng));
    static const int64_t ns[] = {1, 3, 15, 16, 17, 31, 32, 33, 47, 64, 80};
    static const int64_t lds[] = {80, 83, 96};
    for (int q = 0; q < g_nk; q++) {
        const mxfp8i_qkernel *qk = g_kernels[q];
        for (int off = 0; off < 16; off++)
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                for (size_t li = 0; li < sizeof lds / sizeof lds[0]; li++) {
                    const int64_t n = ns[ni], ldd = lds[li];
                    memset(buf, 0xA5, 4 * SPAN);
                    qk->copy_f32(src, LDS, buf + off, ldd, ROWS, n);
                    int64_t bad = 0;
                    for (int64_t i = 0; i < SPAN; i++) {
                        const int64_t k = i - off, r = k >= 0 ? k / ldd : -1, j = k >= 0 ? k % ldd : -1;
                        const uint32_t want = r >= 0 && r < ROWS && j < n ? tu_f32_bits(src[r * LDS + j]) : 0xA5A5A5A5u;
                        bad += tu_f32_bits(buf[i]) != want;
                    }
                    TU_CHECK(bad == 0,
                             "%s copy_f32 (offset %d floats, n = %lld, ld %lld): %lld values wrong or written "
                             "outside the rows",
                             qk->name, off, (long long)n, (long long)ldd, (long long)bad);
                }
    }
    free(src), free(buf);
}

/* The error of y as an approximation of e (double, exp of a float) in ULPs of y's float format (subnormal spacing
 * below 2^-126); 0 when both are the same infinity or both NaN. */
static double ulp_error(float y, double e) {
    if (isnan(y) || isnan(e)) return isnan(y) && isnan(e) ? 0.0 : INFINITY;
    if (isinf(y) && y > 0) /* overflow: e at least 0.002 ULP below the midpoint between FLT_MAX and 2^128 */
        return e >= 0x1.ffffffp127 - 0x1p95 ? 0.0 : INFINITY;
    int k;
    frexp(e > 0x1p-126 ? e : 0x1p-126, &k);
    return fabs((double)y - e) / ldexp(1.0, k - 24);
}

static int glibc_fma_expf(void) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 28)) && defined(__x86_64__)
    return __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

static void check_exp_f32(void) {
    enum { STRIDE = 251, NSP = 16 };
    const int64_t n = (int64_t)(0x100000000ull / STRIDE) + NSP;
    float *x = tu_alloc(sizeof(float) * (size_t)n), *y0 = tu_alloc(sizeof(float) * (size_t)n),
          *y = tu_alloc(sizeof(float) * (size_t)n);
    static const uint32_t special[NSP] = {0xff800000u, 0x7f800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u, 0,
                                          0x80000000u, 0x42b17217u, 0x42b17218u, 0xc2cff1b4u, 0xc2cff1b5u,
                                          0xc2ce8ecfu, 0xc2ce8ed0u, 0x42b00000u, 0xc2b00000u, 0x00000001u};
    for (int i = 0; i < NSP; i++) x[i] = tu_bits_f32(special[i]);
    for (int64_t i = NSP; i < n; i++) x[i] = tu_bits_f32((uint32_t)((uint64_t)(i - NSP) * STRIDE));
    const int libm = glibc_fma_expf();
    if (!libm) printf("test_qkernels: exp_f32 not compared with expf bit for bit (not glibc 2.28+ with FMA)\n");
    for (int q = 0; q < g_nk; q++) {
        const mxfp8i_qkernel *qk = g_kernels[q];
        qk->exp_f32(x, y, n);
        int64_t far = 0, differ = 0, cross = 0;
        for (int64_t i = 0; i < n; i++) {
            const double err = ulp_error(y[i], exp((double)x[i]));
            if (!(err <= 0.502) && far++ < 3)
                TU_CHECK(0, "%s exp_f32(%a) = %a: %.3f ULP from exp", qk->name, x[i], y[i], err);
            const float want = expf(x[i]);
            if (libm && memcmp(&want, &y[i], 4) != 0 && differ++ < 3)
                TU_CHECK(0, "%s exp_f32(%a) = %a, expf gives %a", qk->name, x[i], y[i], want);
            if (q > 0 && memcmp(&y0[i], &y[i], 4) != 0 && cross++ < 3)
                TU_CHECK(0, "%s exp_f32(%a) = %a, %s gives %a", qk->name, x[i], y[i], g_kernels[0]->name, y0[i]);
        }
        TU_CHECK(far == 0 && differ == 0 && cross == 0, "%s exp_f32: %lld values over 0.502 ULP, %lld differ from expf, "
                 "%lld from %s (of %lld)", qk->name, (long long)far, (long long)differ, (long long)cross,
                 g_kernels[0]->name, (long long)n);
        if (q == 0) memcpy(y0, y, sizeof(float) * (size_t)n);
        for (int64_t len = 1; len <= 40; len++) { /* tails, in place: the same values, nothing past the end */
            float buf[48];
            for (int i = 0; i < 48; i++) buf[i] = i < len ? x[NSP + 7919 * len + i] : -1.5f;
            qk->exp_f32(buf, buf, len);
            int bad = 0;
            for (int i = 0; i < 48; i++)
                bad += i < len ? memcmp(&buf[i], &y0[NSP + 7919 * len + i], 4) != 0 : buf[i] != -1.5f;
            TU_CHECK(bad == 0, "%s exp_f32 in place, length %lld: %d values wrong or written past the end", qk->name,
                     (long long)len, bad);
        }
    }
    free(x), free(y0), free(y);
}

/* ---- the MoE's elementwise rows (act_fwd / act_bwd) against the FP32 expressions of include/mxfp8.h's activations,
 * element by element (the exponential taken from the kernel's own exp_f32, checked above; this file is built for the
 * baseline ISA, which has no FMA to contract the products into) ---- */
static float t_clamp(float x, float lo, float hi) {
    if (x < lo) return lo;
    if (x > hi) return hi;
    return x; /* NaN stays NaN */
}
static int t_pass(float x, float lo, float hi) { /* strict inside a present limit; NaN counts as inside */
    return (lo == -INFINITY || !(x <= lo)) && (hi == INFINITY || !(x >= hi));
}
static float t_sigmoid(const mxfp8i_qkernel *qk, float b, float g) {
    float e = -b * g;
    qk->exp_f32(&e, &e, 1);
    return 1.0f / (1.0f + e);
}
static float t_act(const mxfp8i_qkernel *qk, const mxfp8i_act_params *ap, float g) {
    if (ap->squared_relu) {
        const float r = g > 0.0f || isnan(g) ? g : 0.0f;
        return r * r;
    }
    return g * t_sigmoid(qk, ap->beta, g);
}
static float t_dact(const mxfp8i_qkernel *qk, const mxfp8i_act_params *ap, float g, const float *sg) {
    if (sg || !ap->squared_relu) {
        const float s = sg ? *sg : t_sigmoid(qk, ap->beta, g);
        return s * (1.0f + ap->beta * g * (1.0f - s));
    }
    return g > 0.0f || isnan(g) ? 2.0f * g : 0.0f;
}
/* Equal bits, or both NaN: where two NaN operands meet, IEEE 754 leaves open which one the result carries (x86 takes
 * the first source operand, and a compiler may order the operands of a product either way). */
static int same_f32(float a, float b) { return memcmp(&a, &b, 4) == 0 || (isnan(a) && isnan(b)); }

/* A value for the rows: random across binades near the activations' interesting range, the clamp limits themselves,
 * and specials (NaN, +-Inf, +-0, subnormals). */
static float act_value(tu_rng *r) {
    static const float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN,     2.0f,
                               -2.0f, 3.0f, 1e-40f,    -1e-40f,  88.5f,   -104.0f};
    const uint64_t k = tu_next(r);
    if (k % 9 == 0) return sp[(k >> 8) % (sizeof sp / sizeof sp[0])];
    return (float)((tu_uniform(r) * 2.0 - 1.0) * ldexp(1.0, (int)((k >> 16) % 12) - 6));
}

/* ---- the affinity gradient's FP64 dot products (dot_f64) against their definition: each row's sum continued from
 * out[r], the exact FP64 products added one by one in ascending i; equal bits (or both NaN), for row counts around
 * the 8-lane vector, lengths around 8 (tails), separate and shared (ldy = 0) y rows, values with cancellation and
 * specials; nothing written past the rows ---- */
static void check_dot_f64(tu_rng *rng) {
    enum { RMAX = 19, NMAX = 530, LD = NMAX + 3 };
    static const int64_t lens[] = {0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 70, 512, NMAX};
    float *x = tu_alloc(sizeof(float) * RMAX * LD), *y = tu_alloc(sizeof(float) * RMAX * LD);
    double *got = tu_alloc(sizeof(double) * (RMAX + 4)), *want = tu_alloc(sizeof(double) * RMAX);
    int64_t cases = 0;
    for (int q = 0; q < g_nk; q++) {
        const mxfp8i_qkernel *qk = g_kernels[q];
        int64_t bad = 0;
        for (int specials = 0; specials < 2; specials++)
            for (int rows = 1; rows <= RMAX; rows++)
                for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
                    for (int shared = 0; shared < 2; shared++) {
                        const int64_t n = lens[li], ldy = shared ? 0 : LD;
                        for (int64_t i = 0; i < RMAX * LD; i++) { /* products over 2^-60 .. 2^60, both signs */
                            const double sx = ldexp(1.0, (int)(tu_next(rng) % 60) - 30);
                            x[i] = specials ? act_value(rng) : (float)((tu_uniform(rng) - 0.5) * sx);
                            y[i] = (float)((tu_uniform(rng) - 0.5) * ldexp(1.0, (int)(tu_next(rng) % 60) - 30));
                        }
                        for (int r = 0; r < RMAX + 4; r++) got[r] = r < rows ? tu_uniform(rng) - 0.5 : -3.5;
                        for (int r = 0; r < rows; r++) {
                            double sum = got[r];
                            for (int64_t i = 0; i < n; i++) sum += (double)x[r * LD + i] * (double)y[r * ldy + i];
                            want[r] = sum;
                        }
                        qk->dot_f64(x, LD, y, ldy, n, rows, got);
                        for (int r = 0; r < RMAX + 4; r++) {
                            const double w = r < rows ? want[r] : -3.5;
                            bad += memcmp(&got[r], &w, sizeof w) != 0 && !(isnan(got[r]) && isnan(w));
                        }
                        cases++;
                    }
        TU_CHECK(bad == 0, "%s dot_f64: %lld sums differ from the sequential FP64 sums or were written past the rows",
                 qk->name, (long long)bad);
    }
    TU_CHECK(cases > 0, "dot_f64: no case ran");
    free(x), free(y), free(got), free(want);
}

static void check_act_rows(tu_rng *rng) {
    enum { IMAX = 1024, PAD = 8 };
    static const int64_t lens[] = {1, 2, 15, 16, 17, 31, 33, 100, IMAX};
    static const float betas[] = {1.0f, 1.702f, 1.5f};
    float *in = tu_alloc(sizeof(float) * 8 * (IMAX + PAD)), *out = tu_alloc(sizeof(float) * 8 * (IMAX + PAD));
    int64_t cases = 0;
    for (int q = 0; q < g_nk; q++) {
        const mxfp8i_qkernel *qk = g_kernels[q];
        int64_t bad = 0;
        for (int mode = 0; mode < 48; mode++) {
            mxfp8i_act_params ap = {mode % 4 == 3, mode % 2, betas[mode % 3], -INFINITY, INFINITY, -INFINITY, INFINITY};
            if (ap.squared_relu) ap.beta = 0.0f;
            if (mode / 4 % 3 == 1) ap.gate_hi = 2.0f, ap.up_lo = -2.0f, ap.up_hi = 3.0f;
            if (mode / 4 % 3 == 2) ap.gate_lo = -1.0f, ap.up_hi = 0.5f;
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
                const int64_t I = lens[li];
                const int given = mode / 12; /* 0: from gu; 1: g, u given; 2: act given too; 3: act and inter given */
                float *gu = in, *b1 = in + 2 * (IMAX + PAD), *dI = in + 4 * (IMAX + PAD);
                float *g = out, *u = out + (IMAX + PAD), *act = out + 2 * (IMAX + PAD), *inter = out + 3 * (IMAX + PAD);
                float *S = out + 4 * (IMAX + PAD), *sg = out + 5 * (IMAX + PAD), *dgu = out + 6 * (IMAX + PAD);
                for (int64_t i = 0; i < 8 * (IMAX + PAD); i++) in[i] = act_value(rng), out[i] = -7.25f;
                for (int64_t i = 0; i < I; i++) { /* given rows hold their values; the rest sentinels */
                    if (given >= 1) g[i] = act_value(rng), u[i] = act_value(rng);
                    if (given >= 2) act[i] = act_value(rng);
                    if (given >= 3) inter[i] = act_value(rng);
                }
                float eg[IMAX], eu[IMAX], ea[IMAX], ei[IMAX], es[IMAX], esg[IMAX], edg[2 * IMAX];
                const float aq = act_value(rng);
                const int want_sg = mode % 5 != 0 && !ap.squared_relu, want_S = mode % 3 != 0;
                for (int64_t i = 0; i < I; i++) {
                    eg[i] = given ? g[i] : t_clamp(gu[i] + b1[i], ap.gate_lo, ap.gate_hi);
                    eu[i] = given ? u[i] : t_clamp(gu[I + i] + b1[I + i], ap.up_lo, ap.up_hi);
                    esg[i] = ap.squared_relu ? 0.0f : t_sigmoid(qk, ap.beta, eg[i]);
                    ea[i] = given >= 2 ? act[i] : t_act(qk, &ap, eg[i]);
                    ei[i] = given >= 3 ? inter[i] : ap.up_plus_one ? ea[i] * (eu[i] + 1.0f) : ea[i] * eu[i];
                    es[i] = aq * ei[i];
                }
                qk->act_fwd(&ap, I, given ? NULL : gu, b1, g, u, act, given >= 2, inter, given >= 3, want_S ? S : NULL,
                            aq, want_sg ? sg : NULL);
                for (int64_t i = 0; i < I + PAD; i++) {
                    const int in_row = i < I;
                    bad += !same_f32(g[i], in_row ? eg[i] : -7.25f) + !same_f32(u[i], in_row ? eu[i] : -7.25f);
                    bad += !same_f32(act[i], in_row ? ea[i] : -7.25f) + !same_f32(inter[i], in_row ? ei[i] : -7.25f);
                    bad += !same_f32(S[i], in_row && want_S ? es[i] : -7.25f);
                    if (want_sg && given < 2) bad += !same_f32(sg[i], in_row ? esg[i] : -7.25f);
                    else bad += !same_f32(sg[i], -7.25f); /* untouched */
                }
                /* the backward row on the forward's values (sg from the forward when it was asked for) */
                const int scale = mode % 2 == 0, use_sg = want_sg && given < 2;
                for (int64_t i = 0; i < I; i++) {
                    const float dIv = scale ? aq * dI[i] : dI[i];
                    const float d = t_dact(qk, &ap, eg[i], use_sg ? &esg[i] : NULL);
                    const float v = ap.up_plus_one ? dIv * (eu[i] + 1.0f) * d : dIv * eu[i] * d;
                    edg[i] = t_pass(eg[i], ap.gate_lo, ap.gate_hi) ? v : 0.0f;
                    edg[I + i] = t_pass(eu[i], ap.up_lo, ap.up_hi) ? dIv * ea[i] : 0.0f;
                }
                qk->act_bwd(&ap, I, dI, aq, scale, g, u, act, use_sg ? sg : NULL, dgu);
                for (int64_t i = 0; i < 2 * I + PAD; i++) bad += !same_f32(dgu[i], i < 2 * I ? edg[i] : -7.25f);
                if (use_sg) { /* act(g) left out: the row takes g * sg, the forward's product */
                    for (int64_t i = 0; i < 2 * I + PAD; i++) dgu[i] = -7.25f;
                    qk->act_bwd(&ap, I, dI, aq, scale, g, u, NULL, sg, dgu);
                    for (int64_t i = 0; i < 2 * I + PAD; i++) bad += !same_f32(dgu[i], i < 2 * I ? edg[i] : -7.25f);
                }
                cases++;
            }
        }
        TU_CHECK(bad == 0, "%s act_fwd / act_bwd: %lld values differ from the FP32 expressions or were written past "
                 "the row", qk->name, (long long)bad);
    }
    printf("test_qkernels: activation rows, %lld cases per kernel\n", (long long)(cases / (g_nk ? g_nk : 1)));
    free(in), free(out);
}

/* Boundary groups: amax with a fraction at the RCEIL boundary (1.75 = 0x600000 and its neighbours) or other edges,
 * exponents across the whole FP32 range (the clamps at -127/+127 included, subnormal amax), and elements with few
 * significant bits placed 0..14 binades below amax, which lands them on exact ties of the FP8 grid. */
static void fill_edge_f32(float *x, int64_t n, tu_rng *rng) {
    static const uint32_t fr[] = {0,        0x600000, 0x600001, 0x5FFFFF, 0x7FFFFF, 0x400000,
                                  0x700000, 0x780000, 0x7C0000, 0x100000, 0x000001, 0x200000};
    const int nfr = (int)(sizeof fr / sizeof fr[0]);
    int E = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = tu_next(rng);
        if (i % 32 == 0) E = (int)(tu_next(rng) % 280) - 150;
        if (i % 32 == (int64_t)(r >> 60) % 32 || i % 32 == 0) {
            int e = E < -126 ? -126 : E > 127 ? 127 : E;
            uint32_t u = ((uint32_t)(e + 127) << 23) | fr[(r >> 8) % nfr];
            if (E < -126) u = fr[(r >> 8) % nfr] >> ((-126 - E) % 23); /* subnormal amax */
            x[i] = tu_bits_f32(u | ((uint32_t)(r & 1) << 31));
        } else {
            int d = (int)((r >> 4) % 15);
            uint32_t man = (uint32_t)(r >> 32) & 0x7E0000u; /* <= 6 significant bits */
            x[i] = (r & 2 ? -1.0f : 1.0f) * ldexpf(1.0f + (float)man / 8388608.0f, E - d < -149 ? -149 : E - d);
        }
    }
}

/* Groups at the smallest scales: amax exponents -135..-96 (scale codes 0 to about 30 under every rule and format),
 * element j of a group j binades below amax (j = 1..31, down to 2^-149), with random low mantissa bits or an exact
 * tie of the FP8 grid, random signs: qdq values reach below 2^-126 at scale codes up to 16 (E5M2's smallest
 * subnormal, 31 binades below its largest value), where a BF16 output must be rounded, not truncated. */
static void fill_tiny_f32(float *x, int64_t n, tu_rng *rng) {
    for (int64_t i = 0; i < n; i++) {
        const uint64_t r = tu_next(rng);
        const int E = -135 + (int)((i / 32) % 40), j = (int)(i % 32);
        const float m = j == 0 ? 1.0f + (float)((r >> 40) & 0x7F) / 128.0f
                               : (r & 4) ? 1.5f : 1.0f + (float)((r >> 20) & 0xFFFF) / 65536.0f;
        x[i] = (r & 1 ? -1.0f : 1.0f) * ldexpf(m, E - j < -149 ? -149 : E - j);
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

static void test_all_kernels(void) {
    tu_rng rng = {12345};
    static const int64_t Ks[] = {1, 31, 32, 33, 127, 129, 2432}, Kw[] = {128, 256, 384, 640, 2432};
    uint16_t *all = tu_alloc(65536 * 2), *shuf = tu_alloc(65536 * 2);
    for (int i = 0; i < 65536; i++) all[i] = shuf[i] = (uint16_t)i;
    shuffle_u16(shuf, 65536, &rng);
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
        int64_t K = Ks[ki], lines = (65536 + K - 1) / K;
        for (int cols = 0; cols < 2; cols++) {
            quant_case(all, 65536, MXFP8_DTYPE_BF16, lines, K, cols, MXFP8_GROUP_1X32, "bf16 all values sorted");
            quant_case(shuf, 65536, MXFP8_DTYPE_BF16, lines, K, cols, MXFP8_GROUP_1X32, "bf16 all values shuffled");
            quant_case(shuf, 65536, MXFP8_DTYPE_F16, lines, K, cols, MXFP8_GROUP_1X32, "f16 all values shuffled");
        }
    }
    const int64_t nf = 1 << 18;
    float *xf = tu_alloc((size_t)nf * 4), *xe = tu_alloc((size_t)nf * 4);
    tu_fill_random_f32(xf, nf, &rng);
    fill_edge_f32(xe, nf, &rng);
    float *xt = tu_alloc(40 * 32 * 16 * 4);
    fill_tiny_f32(xt, 40 * 32 * 16, &rng);
    for (int cols = 0; cols < 2; cols++) {
        quant_case(xf, nf, MXFP8_DTYPE_F32, nf / 32, 32, cols, MXFP8_GROUP_1X32, "f32 random");
        quant_case(xf, nf, MXFP8_DTYPE_F32, nf / 2432 + 1, 2432, cols, MXFP8_GROUP_1X32, "f32 random");
        quant_case(xe, nf, MXFP8_DTYPE_F32, nf / 64, 64, cols, MXFP8_GROUP_1X32, "f32 edge groups");
        quant_case(xt, 40 * 32 * 16, MXFP8_DTYPE_F32, 40 * 16, 32, cols, MXFP8_GROUP_1X32, "f32 tiny scales");
        quant_case(xt, 40 * 32 * 16, MXFP8_DTYPE_F32, 40, 512, cols, MXFP8_GROUP_1X32, "f32 tiny scales");
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) /* short lengths, few lines: tails across lines */
            quant_case(xf + 1000, 37 * Ks[ki], MXFP8_DTYPE_F32, 37, Ks[ki], cols, MXFP8_GROUP_1X32, "f32 random");
        for (size_t ki = 0; ki < sizeof Kw / sizeof Kw[0]; ki++) {
            quant_case(xf, 45 * Kw[ki], MXFP8_DTYPE_F32, 45, Kw[ki], cols, MXFP8_GROUP_WRAPX, "wrapX f32");
            quant_case(shuf, 33 * Kw[ki] < 65536 ? 33 * Kw[ki] : 65536, MXFP8_DTYPE_BF16, 33, Kw[ki], cols,
                       MXFP8_GROUP_WRAPX, "wrapX bf16");
        }
    }
    quant_case(xe, nf, MXFP8_DTYPE_F32, 40, 100, 2, MXFP8_GROUP_1X32, "f32 edge groups");
    quant_case(shuf, 65536, MXFP8_DTYPE_BF16, 20, 256, 2, MXFP8_GROUP_WRAPX, "wrapX bf16");
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
        for (int cols = 0; cols < 2; cols++) check_dequant(77, Ks[ki], cols, MXFP8_GROUP_1X32, &rng);
    for (size_t ki = 0; ki < sizeof Kw / sizeof Kw[0]; ki++)
        for (int cols = 0; cols < 2; cols++) check_dequant(41, Kw[ki], cols, MXFP8_GROUP_WRAPX, &rng);
    check_to_bf16(&rng);
    check_transposes(&rng);
    check_copy_f32(&rng);
    check_exp_f32();
    check_act_rows(&rng);
    check_dot_f64(&rng);
    free(xf), free(xe), free(xt), free(all), free(shuf);
}

int main(void) {
    for (const mxfp8i_qkernel *const *it = mxfp8i_qkernel_list(); *it && g_nk < 8; it++) {
        if (!mxfp8i_cpu_has((*it)->needs)) {
            printf("test_qkernels: SKIP %s: this CPU lacks its instructions (%s)\n", (*it)->name, (*it)->isa_name);
            g_skips++;
            continue;
        }
        g_kernels[g_nk++] = *it;
        printf("test_qkernels: %s against the oracle\n", (*it)->name);
    }
    TU_CHECK(g_nk >= 1 && g_kernels[g_nk - 1]->isa_level == 0, "the reference kernel must be in the list");
    test_all_kernels();
    if (g_skips) printf("test_qkernels: %d kernel(s) skipped for absent CPU features\n", g_skips);
    return tu_finish("test_qkernels");
}
