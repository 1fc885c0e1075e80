/*
 * test_codec.c -- the scalar codecs against the tests' independent oracle (tests/c/oracle/, from the format
 * definitions [OCP §5]), and the oracle itself on hand-computed landmarks:
 *  - all 256 codes of E4M3, E5M2 and E8M0 decode to (-1)^s * 2^(E-bias) * (1 + M/2^m) (subnormal: M/2^m *
 *    2^(1-bias)), with the formats' NaN/Inf codes;
 *  - encoding all 65,536 BF16 values and 2^20 random FP32 values: the nearest representable value found by search
 *    over the decoded code table (ties to the even code), saturating to +-max normal beyond it, NaN/Inf per format;
 *  - BF16 and FP16 encodings of 2^20 random FP32 values, decodings of all 65,536 codes, and the three scale rules
 *    (amax compared with powers of two in double).
 */
#include <math.h>

#include "oracle.h"
#include "testutil.h"

static void test_decode(void) {
    for (int fmt = 0; fmt < 2; fmt++)
        for (unsigned c = 0; c < 256; c++) {
            double want = orc_fp8_value(c, fmt);
            float got = mxfp8_fp8_to_fp32((uint8_t)c, (mxfp8_format)fmt);
            if (isnan(want))
                TU_CHECK(isnan(got) && !!signbit(got) == !!(c & 0x80), "fmt %d code 0x%02x: %a, want NaN (sign %d)",
                         fmt, c, got, c >> 7);
            else
                TU_CHECK((double)got == want && !!signbit(got) == !!(c & 0x80), "fmt %d code 0x%02x: %a, want %a", fmt,
                         c, got, want);
        }
    for (unsigned c = 0; c < 256; c++) {
        float got = mxfp8_e8m0_to_fp32((uint8_t)c);
        if (c == 255)
            TU_CHECK(isnan(got) && isnan(orc_e8m0_value(c)), "e8m0 255 must be NaN, got %a", got);
        else
            TU_CHECK((double)got == orc_e8m0_value(c), "e8m0 %u: %a, want 2^%d", c, got, (int)c - 127);
    }
    /* spot values from the spec */
    TU_CHECK(mxfp8_fp8_to_fp32(0x7E, MXFP8_FMT_E4M3) == 448.0f, "E4M3 max normal");
    TU_CHECK(mxfp8_fp8_to_fp32(0x01, MXFP8_FMT_E4M3) == ldexpf(1, -9), "E4M3 min subnormal");
    TU_CHECK(mxfp8_fp8_to_fp32(0x7B, MXFP8_FMT_E5M2) == 57344.0f, "E5M2 max normal");
    TU_CHECK(mxfp8_fp8_to_fp32(0x01, MXFP8_FMT_E5M2) == ldexpf(1, -16), "E5M2 min subnormal");
    TU_CHECK(isinf(mxfp8_fp8_to_fp32(0xFC, MXFP8_FMT_E5M2)) && mxfp8_fp8_to_fp32(0xFC, MXFP8_FMT_E5M2) < 0,
             "E5M2 -Inf");
}

/* ---- encoding: the oracle's nearest-value search over the code table ---- */
static void check_encode(float x, long *bad) {
    for (int fmt = 0; fmt < 2; fmt++) {
        uint8_t want = orc_fp8_encode((double)x, fmt), got = mxfp8_fp32_to_fp8(x, (mxfp8_format)fmt);
        if (want != got) {
            if (bad[fmt]++ < 5)
                TU_CHECK(0, "encode fmt %d of %a (0x%08x): 0x%02x, want 0x%02x", fmt, x, tu_f32_bits(x), got, want);
        }
    }
}

static void test_encode(void) {
    /* the oracle itself on the format's landmarks */
    TU_CHECK(orc_fp8_encode(448.0, 0) == 0x7E && orc_fp8_encode(1e9, 0) == 0x7E &&
                 orc_fp8_encode(-INFINITY, 0) == 0xFF && orc_fp8_encode(57344.0, 1) == 0x7B && orc_fp8_encode(INFINITY, 1) == 0x7C &&
                 orc_fp8_encode(-NAN, 1) == 0xFE && orc_fp8_encode(ldexp(1, -10), 0) == 0x00 &&
                 orc_fp8_encode(ldexp(3, -10), 0) == 0x02,
             "oracle landmarks");
    long bad[2] = {0, 0};
    for (uint32_t b = 0; b < 65536; b++) check_encode(mxfp8_bf16_to_fp32((uint16_t)b), bad);
    tu_rng rng = {2024};
    for (int i = 0; i < (1 << 20); i++) {
        uint64_t r = tu_next(&rng);
        uint32_t u = (uint32_t)r;
        /* half the values near the FP8 range (exponents -20..17), half raw bit patterns */
        if (r >> 63) u = (u & 0x807FFFFFu) | ((uint32_t)(107 + (r >> 40) % 38) << 23);
        check_encode(tu_bits_f32(u), bad);
    }
    TU_CHECK(bad[0] == 0 && bad[1] == 0, "encode mismatches: e4m3 %ld, e5m2 %ld", bad[0], bad[1]);
    /* saturation cases: a finite input never becomes NaN or Inf */
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

/* ---- BF16 / FP16 against the oracle's nearest-code search ---- */
static void test_bf16_fp16(void) {
    tu_rng rng = {7};
    long bad_b = 0, bad_h = 0;
    for (int i = 0; i < (1 << 20); i++) {
        uint64_t r = tu_next(&rng);
        uint32_t u = (uint32_t)r;
        if ((r >> 40) & 1) u = (u & 0x807FFFFFu) | ((uint32_t)(98 + (r >> 48) % 50) << 23); /* near FP16's range */
        float x = tu_bits_f32(u);
        uint16_t b = mxfp8_fp32_to_bf16(x), h = mxfp8_fp32_to_fp16(x);
        if (isnan(x)) { /* NaN stays NaN (quiet), sign kept */
            bad_b += !isnan(mxfp8_bf16_to_fp32(b)) || (b >> 15) != (u >> 31) || !(b & 0x40);
            bad_h += !isnan(mxfp8_fp16_to_fp32(h)) || (h >> 15) != (u >> 31) || !(h & 0x200);
            continue;
        }
        if (b != orc_bf16_encode((double)x) && bad_b++ < 5)
            TU_CHECK(0, "fp32 -> bf16 of %a: 0x%04x, want 0x%04x", x, b, orc_bf16_encode((double)x));
        if (h != orc_fp16_encode((double)x) && bad_h++ < 5)
            TU_CHECK(0, "fp32 -> fp16 of %a: 0x%04x, want 0x%04x", x, h, orc_fp16_encode((double)x));
    }
    TU_CHECK(bad_b == 0 && bad_h == 0, "fp32 -> bf16: %ld, fp32 -> fp16: %ld mismatches", bad_b, bad_h);
    long bad = 0;
    for (uint32_t c = 0; c < 65536; c++) {
        double wb = orc_bf16_value((uint16_t)c), wh = orc_fp16_value((uint16_t)c);
        float gb = mxfp8_bf16_to_fp32((uint16_t)c), gh = mxfp8_fp16_to_fp32((uint16_t)c);
        bad += isnan(wb) ? !isnan(gb) : (double)gb != wb || !!signbit(gb) != !!(c & 0x8000);
        bad += isnan(wh) ? !isnan(gh) : (double)gh != wh || !!signbit(gh) != !!(c & 0x8000);
        if (!isnan(wh)) bad += mxfp8_fp32_to_fp16(gh) != c; /* exact round trip */
    }
    TU_CHECK(bad == 0, "bf16 / fp16 decode and round trip: %ld mismatches", bad);
    /* landmarks (checking the oracle too) */
    TU_CHECK(mxfp8_fp32_to_fp16(65520.0f) == 0x7C00 && orc_fp16_encode(65520.0) == 0x7C00, "fp16 overflow -> Inf");
    TU_CHECK(mxfp8_fp32_to_fp16(65519.0f) == 0x7BFF && orc_fp16_encode(65519.0) == 0x7BFF, "fp16 65519 -> max");
    TU_CHECK(mxfp8_fp32_to_fp16(ldexpf(1, -25)) == 0x0000 && orc_fp16_encode(ldexp(1, -25)) == 0, "fp16 2^-25 -> 0");
    TU_CHECK(mxfp8_fp32_to_fp16(ldexpf(3, -26)) == 0x0001 && orc_fp16_encode(ldexp(3, -26)) == 1, "fp16 1.5*2^-25");
    TU_CHECK(orc_bf16_encode(3.4028234663852886e38) == 0x7F80 && orc_bf16_encode(1.0 + 0x1p-8) == 0x3F80 &&
                 orc_bf16_encode(1.0 + 0x1.8p-8) == 0x3F81 && orc_bf16_encode(0.0) == 0 &&
                 orc_bf16_encode(-0.0) == 0x8000 && orc_fp16_encode(-0.0) == 0x8000 && orc_bf16_encode(-NAN) == 0xFFC0,
             "bf16 oracle landmarks");
}

/* ---- scale rules against the oracle's powers-of-two comparisons ---- */
static void test_scale_rules(void) {
    tu_rng rng = {31337};
    long bad = 0;
    for (int i = 0; i < (1 << 18); i++) {
        uint32_t u = (uint32_t)tu_next(&rng) & 0x7FFFFFFFu;
        if (i & 1) u = (u & 0x807FFFFFu) | 0x00600000u | (u & 0x7F800000u); /* near the 1.75 boundary */
        if (i % 7 == 0) u = (u & 0x7F800000u) | 0x600000u;                  /* exactly 1.75 * 2^k */
        if (i % 11 == 0) u = (u & 0x7F800000u) | (0x600000u + (i % 3) - 1); /* one ulp either side */
        float a = tu_bits_f32(u);
        for (int fmt = 0; fmt < 2; fmt++)
            for (int rule = 0; rule < 3; rule++) {
                int want = orc_scale_code((double)a, fmt, rule),
                    got = mxfp8_scale_code(a, (mxfp8_format)fmt, (mxfp8_scale_rule)rule);
                if (want != got && bad++ < 5)
                    TU_CHECK(0, "scale code of %a fmt %d rule %d: %d, want %d", a, fmt, rule, got, want);
            }
    }
    TU_CHECK(bad == 0, "scale code mismatches: %ld", bad);
    /* hand-computed values (checking the oracle as well) */
    static const struct { float amax; int fmt, rule, code; } hand[] = {
        {960.0f, 0, 1, 128}, {960.0f, 0, 2, 129}, {300.0f, 0, 1, 127}, {449.0f, 0, 2, 128}, {448.0f, 0, 2, 127},
        {0x1.fffffep7f, 0, 1, 126}, {0.0f, 0, 0, 0}, {INFINITY, 1, 0, 255}, {NAN, 1, 1, 255},
        {3.4e38f, 0, 0, 127 + 127 - 7}, {0x1p-149f, 0, 1, 0}, {57344.0f, 1, 2, 127}, {57345.0f, 1, 2, 128}};
    for (size_t i = 0; i < sizeof hand / sizeof hand[0]; i++) {
        int got = mxfp8_scale_code(hand[i].amax, (mxfp8_format)hand[i].fmt, (mxfp8_scale_rule)hand[i].rule);
        int orc = orc_scale_code((double)hand[i].amax, hand[i].fmt, hand[i].rule);
        TU_CHECK(got == hand[i].code && orc == hand[i].code, "scale code of %a fmt %d rule %d: %d (oracle %d), want %d",
                 hand[i].amax, hand[i].fmt, hand[i].rule, got, orc, hand[i].code);
    }
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
