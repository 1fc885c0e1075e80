/*
 * test_codec.c -- the scalar codecs against oracles written here from the format definitions [OCP §5]:
 *  - all 256 codes of E4M3, E5M2 and E8M0 decode to (-1)^s * 2^(E-bias) * (1 + M/2^m) (subnormal: M/2^m *
 *    2^(1-bias)), with the formats' NaN/Inf codes;
 *  - encoding all 65,536 BF16 values and 2^20 random FP32 values: the nearest representable value found by search
 *    over the decoded code table (ties to the even code), saturating to +-max normal beyond it, NaN/Inf per format;
 *  - BF16 and FP16 conversions (FP16: all 65,536 codes), and the three scale rules from a floating-point log2.
 */
#include <math.h>

#include "testutil.h"

/* ---- decoding from the definition ---- */
static double def_fp8(unsigned c, int fmt, int *is_nan) {
    int m = fmt ? 2 : 3, bias = fmt ? 15 : 7, ebits = fmt ? 5 : 4;
    int s = c >> 7, E = (c >> m) & ((1 << ebits) - 1), M = c & ((1 << m) - 1);
    *is_nan = 0;
    double sign = s ? -1.0 : 1.0;
    if (!fmt && E == 15 && M == 7) return *is_nan = 1, NAN;
    if (fmt && E == 31) {
        if (M) return *is_nan = 1, NAN;
        return sign * INFINITY;
    }
    if (E == 0) return sign * ldexp((double)M / (1 << m), 1 - bias);
    return sign * ldexp(1.0 + (double)M / (1 << m), E - bias);
}

static void test_decode(void) {
    for (int fmt = 0; fmt < 2; fmt++)
        for (unsigned c = 0; c < 256; c++) {
            int nan;
            double want = def_fp8(c, fmt, &nan);
            float got = mxfp8_fp8_to_fp32((uint8_t)c, (mxfp8_format)fmt);
            if (nan)
                TU_CHECK(isnan(got) && !!signbit(got) == !!(c & 0x80), "fmt %d code 0x%02x: %a, want NaN (sign %d)",
                         fmt, c, got, c >> 7);
            else
                TU_CHECK((double)got == want && !!signbit(got) == !!(c & 0x80), "fmt %d code 0x%02x: %a, want %a", fmt,
                         c, got, want);
        }
    for (unsigned c = 0; c < 256; c++) {
        float got = mxfp8_e8m0_to_fp32((uint8_t)c);
        if (c == 255)
            TU_CHECK(isnan(got), "e8m0 255 must be NaN, got %a", got);
        else
            TU_CHECK((double)got == ldexp(1.0, (int)c - 127), "e8m0 %u: %a, want 2^%d", c, got, (int)c - 127);
    }
    /* spot values from the spec */
    TU_CHECK(mxfp8_fp8_to_fp32(0x7E, MXFP8_FMT_E4M3) == 448.0f, "E4M3 max normal");
    TU_CHECK(mxfp8_fp8_to_fp32(0x01, MXFP8_FMT_E4M3) == ldexpf(1, -9), "E4M3 min subnormal");
    TU_CHECK(mxfp8_fp8_to_fp32(0x7B, MXFP8_FMT_E5M2) == 57344.0f, "E5M2 max normal");
    TU_CHECK(mxfp8_fp8_to_fp32(0x01, MXFP8_FMT_E5M2) == ldexpf(1, -16), "E5M2 min subnormal");
    TU_CHECK(isinf(mxfp8_fp8_to_fp32(0xFC, MXFP8_FMT_E5M2)) && mxfp8_fp8_to_fp32(0xFC, MXFP8_FMT_E5M2) < 0,
             "E5M2 -Inf");
}

/* ---- encoding oracle: search over the positive finite codes ---- */
typedef struct table {
    double v[128];
    int n; /* positive finite codes 0..n-1, increasing */
} table;

static void make_table(table *t, int fmt) {
    t->n = 0;
    for (unsigned c = 0; c < 128; c++) {
        int nan;
        double v = def_fp8(c, fmt, &nan);
        if (nan || isinf(v)) break;
        t->v[t->n++] = v;
    }
}

static uint8_t oracle_encode(float x, int fmt, const table *t) {
    uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x)) return sign | (fmt ? 0x7E : 0x7F);
    if (isinf(x)) return sign | (fmt ? 0x7C : 0x7F);
    double a = fabs((double)x);
    if (a >= t->v[t->n - 1]) return sign | (uint8_t)(t->n - 1); /* saturate */
    int lo = 0, hi = t->n - 1;                                  /* v[lo] <= a < v[hi] */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (t->v[mid] <= a)
            lo = mid;
        else
            hi = mid;
    }
    double dl = a - t->v[lo], dh = t->v[hi] - a;
    int c = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
    return sign | (uint8_t)c;
}

static void check_encode(float x, const table *tabs, long *bad) {
    for (int fmt = 0; fmt < 2; fmt++) {
        uint8_t want = oracle_encode(x, fmt, &tabs[fmt]), got = mxfp8_fp32_to_fp8(x, (mxfp8_format)fmt);
        if (want != got) {
            if (bad[fmt]++ < 5)
                TU_CHECK(0, "encode fmt %d of %a (0x%08x): 0x%02x, want 0x%02x", fmt, x, tu_f32_bits(x), got, want);
        }
    }
}

static void test_encode(void) {
    table tabs[2];
    make_table(&tabs[0], 0);
    make_table(&tabs[1], 1);
    TU_CHECK(tabs[0].n == 127 && tabs[1].n == 124, "code tables: %d %d finite codes", tabs[0].n, tabs[1].n);
    long bad[2] = {0, 0};
    for (uint32_t b = 0; b < 65536; b++) check_encode(mxfp8_bf16_to_fp32((uint16_t)b), tabs, bad);
    tu_rng rng = {2024};
    for (int i = 0; i < (1 << 20); i++) {
        uint64_t r = tu_next(&rng);
        uint32_t u = (uint32_t)r;
        /* half the values near the FP8 range (exponents -20..17), half raw bit patterns */
        if (r >> 63) u = (u & 0x807FFFFFu) | ((uint32_t)(107 + (r >> 40) % 38) << 23);
        check_encode(tu_bits_f32(u), tabs, bad);
    }
    TU_CHECK(bad[0] == 0 && bad[1] == 0, "encode mismatches: e4m3 %ld, e5m2 %ld", bad[0], bad[1]);
    /* saturation cases of the issue: a finite input never becomes NaN or Inf */
    const float sat4[] = {449.0f, 464.0f, 465.0f, 1000.0f, 3.0e38f};
    for (size_t i = 0; i < sizeof sat4 / sizeof sat4[0]; i++) {
        TU_CHECK(mxfp8_fp32_to_fp8(sat4[i], MXFP8_FMT_E4M3) == 0x7E, "e4m3 %g must saturate to 0x7E", sat4[i]);
        TU_CHECK(mxfp8_fp32_to_fp8(-sat4[i], MXFP8_FMT_E4M3) == 0xFE, "e4m3 -%g must saturate to 0xFE", sat4[i]);
    }
    const float sat5[] = {57344.0f, 61439.0f, 61440.0f, 65535.0f, 65536.0f, 1e30f};
    for (size_t i = 0; i < sizeof sat5 / sizeof sat5[0]; i++)
        TU_CHECK(mxfp8_fp32_to_fp8(sat5[i], MXFP8_FMT_E5M2) == 0x7B, "e5m2 %g must saturate to 0x7B", sat5[i]);
    TU_CHECK(mxfp8_fp32_to_fp8(ldexpf(1, -10), MXFP8_FMT_E4M3) == 0x00, "2^-10 ties to 0 in E4M3");
    TU_CHECK(mxfp8_fp32_to_fp8(ldexpf(3, -10), MXFP8_FMT_E4M3) == 0x02, "3*2^-10 ties to 2*2^-9 in E4M3");
}

/* ---- BF16 / FP16 ---- */
static void test_bf16_fp16(void) {
    tu_rng rng = {7};
    long bad = 0;
    for (int i = 0; i < (1 << 20); i++) {
        float x = tu_bits_f32((uint32_t)tu_next(&rng));
        uint16_t b = mxfp8_fp32_to_bf16(x);
        if (isnan(x)) {
            bad += !isnan(mxfp8_bf16_to_fp32(b)) || (b >> 15) != (tu_f32_bits(x) >> 31);
            continue;
        }
        /* oracle: the nearer of the two BF16 neighbours (truncation and next up), ties to even */
        /* truncation t and the next BF16 up in magnitude, t + 1 ulp (Inf standing for 2^128 when it overflows) */
        uint32_t u = tu_f32_bits(x), t = u & 0xFFFF0000u;
        uint16_t want = (uint16_t)(t >> 16);
        if (!isinf(x)) {
            uint32_t n = t + 0x10000u;
            double a = fabs((double)x), lo = fabs((double)tu_bits_f32(t));
            double hi = (n & 0x7F800000u) == 0x7F800000u ? ldexp(1.0, 128) : fabs((double)tu_bits_f32(n));
            double dl = a - lo, dh = hi - a;
            if (dh < dl || (dh == dl && ((t >> 16) & 1))) want = (uint16_t)(n >> 16);
        }
        bad += b != want;
    }
    TU_CHECK(bad == 0, "fp32 -> bf16: %ld mismatches", bad);
    bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        int e = (h >> 10) & 31, f = h & 1023;
        double want = (h & 0x8000 ? -1.0 : 1.0) * (e ? ldexp(1.0 + f / 1024.0, e - 15) : ldexp(f / 1024.0, -14));
        float got = mxfp8_fp16_to_fp32((uint16_t)h);
        if (e == 31) {
            bad += f ? !isnan(got) : !(isinf(got) && !!signbit(got) == !!(h & 0x8000));
            continue;
        }
        bad += (double)got != want || !!signbit(got) != !!(h & 0x8000);
        bad += mxfp8_fp32_to_fp16(got) != h; /* exact round trip */
    }
    TU_CHECK(bad == 0, "fp16 decode / round trip: %ld mismatches", bad);
    TU_CHECK(mxfp8_fp32_to_fp16(65520.0f) == 0x7C00, "fp16 overflow -> Inf");
    TU_CHECK(mxfp8_fp32_to_fp16(65519.0f) == 0x7BFF, "fp16 65519 -> max");
    TU_CHECK(mxfp8_fp32_to_fp16(ldexpf(1, -25)) == 0x0000, "fp16 2^-25 ties to 0");
    TU_CHECK(mxfp8_fp32_to_fp16(ldexpf(3, -26)) == 0x0001, "fp16 1.5*2^-25 -> min subnormal");
}

/* ---- scale rules from a floating-point log2 (double is exact enough: amax is an FP32 value) ---- */
static int oracle_scale(float amax, int fmt, int rule) {
    if (isnan(amax) || isinf(amax)) return 255;
    if (amax == 0) return 0;
    int emax = fmt ? 15 : 8;
    double maxn = fmt ? 57344.0 : 448.0, a = fabs((double)amax);
    int fl = (int)floor(log2(a)), e;
    if (ldexp(1.0, fl) > a) fl--; /* guard against log2 rounding */
    if (ldexp(1.0, fl + 1) <= a) fl++;
    if (rule == 0)
        e = fl - (emax - 1);
    else if (rule == 1)
        e = fl - emax;
    else {
        e = (int)ceil(log2(a / maxn));
        while (ldexp(maxn, e - 1) >= a) e--;
        while (ldexp(maxn, e) < a) e++;
    }
    if (e < -127) e = -127;
    if (e > 127) e = 127;
    return e + 127;
}

static void test_scale_rules(void) {
    tu_rng rng = {31337};
    long bad = 0;
    for (int i = 0; i < (1 << 18); i++) {
        uint32_t u = (uint32_t)tu_next(&rng) & 0x7FFFFFFFu;
        if (i & 1) u = (u & 0x807FFFFFu) | 0x00600000u | (u & 0x7F800000u); /* near the 1.75 boundary */
        if (i % 7 == 0) u = (u & 0x7F800000u) | 0x600000u;                  /* exactly 1.75 * 2^k */
        float a = tu_bits_f32(u);
        for (int fmt = 0; fmt < 2; fmt++)
            for (int rule = 0; rule < 3; rule++) {
                int want = oracle_scale(a, fmt, rule),
                    got = mxfp8_scale_code(a, (mxfp8_format)fmt, (mxfp8_scale_rule)rule);
                if (want != got && bad++ < 5)
                    TU_CHECK(0, "scale code of %a fmt %d rule %d: %d, want %d", a, fmt, rule, got, want);
            }
    }
    TU_CHECK(bad == 0, "scale code mismatches: %ld", bad);
    TU_CHECK(mxfp8_scale_code(960.0f, MXFP8_FMT_E4M3, MXFP8_SCALE_OCP) == 128, "960 ocp");
    TU_CHECK(mxfp8_scale_code(960.0f, MXFP8_FMT_E4M3, MXFP8_SCALE_RCEIL) == 129, "960 rceil");
    TU_CHECK(mxfp8_scale_code(300.0f, MXFP8_FMT_E4M3, MXFP8_SCALE_OCP) == 127, "300 ocp");
    TU_CHECK(mxfp8_scale_code(449.0f, MXFP8_FMT_E4M3, MXFP8_SCALE_RCEIL) == 128, "449 rceil");
    TU_CHECK(mxfp8_scale_code(tu_bits_f32(0x437FFFFFu), MXFP8_FMT_E4M3, MXFP8_SCALE_OCP) == 126, "0x437FFFFF ocp");
    TU_CHECK(mxfp8_scale_code(0.0f, MXFP8_FMT_E4M3, MXFP8_SCALE_NKI) == 0, "zero");
    TU_CHECK(mxfp8_scale_code(INFINITY, MXFP8_FMT_E5M2, MXFP8_SCALE_NKI) == 255, "inf");
    TU_CHECK(mxfp8_scale_code(NAN, MXFP8_FMT_E5M2, MXFP8_SCALE_OCP) == 255, "nan");
    TU_CHECK(mxfp8_scale_code(3.4e38f, MXFP8_FMT_E4M3, MXFP8_SCALE_NKI) == 127 + 127 - 7, "FLT_MAX-ish nki");
    TU_CHECK(mxfp8_scale_code(ldexpf(1, -149), MXFP8_FMT_E4M3, MXFP8_SCALE_OCP) == 0, "subnormal amax clamps");
}

/* The scalar codecs have no error channel: an unknown enum gives a NaN code (include/mxfp8.h), never a value. */
static void test_unknown_enums(void) {
    const int bad_fmt[] = {2, 7, -1, 255};
    const float xs[] = {1.0f, -3.5f, 0.0f, 448.0f, NAN};
    for (int i = 0; i < 4; i++) {
        mxfp8_format f = (mxfp8_format)bad_fmt[i];
        for (int j = 0; j < 5; j++)
            TU_CHECK(mxfp8_fp32_to_fp8(xs[j], f) == 0xFF, "fp32_to_fp8(%g, fmt %d) = 0x%02X, want 0xFF (NaN)",
                     (double)xs[j], bad_fmt[i], mxfp8_fp32_to_fp8(xs[j], f));
        TU_CHECK(isnan(mxfp8_fp8_to_fp32(0x38, f)), "fp8_to_fp32(0x38, fmt %d) is not NaN", bad_fmt[i]);
        TU_CHECK(mxfp8_scale_code(1.0f, f, MXFP8_SCALE_NKI) == 255, "scale_code(1, fmt %d, NKI) != 255", bad_fmt[i]);
    }
    const int bad_rule[] = {3, 9, -1};
    for (int i = 0; i < 3; i++)
        for (int fmt = 0; fmt < 2; fmt++)
            TU_CHECK(mxfp8_scale_code(1.0f, (mxfp8_format)fmt, (mxfp8_scale_rule)bad_rule[i]) == 255,
                     "scale_code(1, fmt %d, rule %d) = %d, want 255", fmt, bad_rule[i],
                     mxfp8_scale_code(1.0f, (mxfp8_format)fmt, (mxfp8_scale_rule)bad_rule[i]));
    /* the NaN codes decode as NaN in both formats */
    TU_CHECK(isnan(mxfp8_fp8_to_fp32(0xFF, MXFP8_FMT_E4M3)) && isnan(mxfp8_fp8_to_fp32(0xFF, MXFP8_FMT_E5M2)), "0xFF");
}

int main(void) {
    test_unknown_enums();
    test_decode();
    test_encode();
    test_bf16_fp16();
    test_scale_rules();
    return tu_finish("test_codec");
}
