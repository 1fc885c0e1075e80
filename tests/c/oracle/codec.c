/*
 * codec.c -- the oracle's codecs (oracle.h), from the format definitions [OCP 5.3.2, 5.4.1] and IEEE 754 binary16 /
 * bfloat16: decoding by the value formula; encoding by searching the ordered table of finite values for the nearest
 * one (the midpoint between two neighbours is exact in double, so ties are seen exactly and go to the even code);
 * the scale rules by comparing amax with powers of two in double.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "oracle.h"

/* ---- FP8 ---- */
typedef struct fp8_fmt {
    int ebits, mbits, bias;
} fp8_fmt;
static fp8_fmt fp8_of(int fmt) { return fmt ? (fp8_fmt){5, 2, 15} : (fp8_fmt){4, 3, 7}; }

static double fp8_value(unsigned code, int fmt) {
    const fp8_fmt f = fp8_of(fmt);
    const unsigned s = (code >> 7) & 1, E = (code >> f.mbits) & ((1u << f.ebits) - 1), M = code & ((1u << f.mbits) - 1);
    const double sign = s ? -1.0 : 1.0;
    if (fmt == 0 && E == 15 && M == 7) return copysign(NAN, sign); /* E4M3 ("FN"): only S.1111.111 is special */
    if (fmt == 1 && E == 31) return M ? copysign(NAN, sign) : sign * INFINITY;
    if (E == 0) return sign * ldexp((double)M, 1 - f.bias - f.mbits);
    return sign * ldexp((double)((1u << f.mbits) + M), (int)E - f.bias - f.mbits);
}

double orc_fp8_value(unsigned code, int fmt) {
    static double t[2][256];
    static int ready[2];
    if (!ready[fmt]) {
        for (unsigned c = 0; c < 256; c++) t[fmt][c] = fp8_value(c, fmt);
        ready[fmt] = 1;
    }
    return t[fmt][code & 0xFF];
}

/* The positive finite values of a format in code order (codes 0 .. n-1; ascending, as the encodings are). */
typedef struct fp8_table {
    double v[128];
    int n;
} fp8_table;
static const fp8_table *table_of(int fmt) {
    static fp8_table t[2];
    static int ready[2];
    if (!ready[fmt]) {
        t[fmt].n = 0;
        for (unsigned c = 0; c < 128; c++) {
            double v = orc_fp8_value(c, fmt);
            if (!isfinite(v)) break;
            t[fmt].v[t[fmt].n++] = v;
        }
        ready[fmt] = 1;
    }
    return &t[fmt];
}

uint8_t orc_fp8_encode(double x, int fmt) {
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x)) return sign | (fmt ? 0x7E : 0x7F);
    if (isinf(x)) return sign | (fmt ? 0x7C : 0x7F);
    const fp8_table *t = table_of(fmt);
    const double a = fabs(x);
    if (a >= t->v[t->n - 1]) return sign | (uint8_t)(t->n - 1); /* saturate: never NaN or Inf from a finite x */
    int lo = 0, hi = t->n - 1; /* v[lo] <= a < v[hi] */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (t->v[mid] <= a) lo = mid;
        else hi = mid;
    }
    const double mid = 0.5 * (t->v[lo] + t->v[hi]); /* exact: both have at most 4 significant bits */
    const int c = a < mid ? lo : a > mid ? hi : (lo % 2 == 0 ? lo : hi);
    return sign | (uint8_t)c;
}

double orc_e8m0_value(unsigned code) {
    static double t[256];
    if (t[0] == 0.0)
        for (int c = 0; c < 256; c++) t[c] = c == 255 ? NAN : ldexp(1.0, c - 127);
    return t[code & 0xFF];
}

/* ---- BF16 / FP16: (ebits, mbits, bias) = (8, 7, 127), (5, 10, 15) ---- */
static double ieee_value(unsigned h, int ebits, int mbits, int bias) {
    const unsigned s = (h >> (ebits + mbits)) & 1, E = (h >> mbits) & ((1u << ebits) - 1), M = h & ((1u << mbits) - 1);
    const double sign = s ? -1.0 : 1.0;
    if (E == (1u << ebits) - 1) return M ? copysign(NAN, sign) : sign * INFINITY;
    if (E == 0) return sign * ldexp((double)M, 1 - bias - mbits);
    return sign * ldexp((double)((1u << mbits) + M), (int)E - bias - mbits);
}
/* The values of all 65,536 codes of a 16-bit format (0 = BF16, 1 = FP16), decoded once. */
static const double *table16(int f) {
    static double *t[2];
    if (!t[f]) {
        double *v = malloc(sizeof(double) * 65536);
        if (!v) abort();
        for (unsigned h = 0; h < 65536; h++) v[h] = f ? ieee_value(h, 5, 10, 15) : ieee_value(h, 8, 7, 127);
        t[f] = v;
    }
    return t[f];
}
/* Nearest code by binary search over the positive codes 0 .. inf_code, where inf_code stands for 2^(emax + 1) (IEEE:
 * a value at or beyond the midpoint between the largest finite value and that power rounds to Inf). */
static unsigned ieee_encode(double x, int f, int ebits, int mbits, int bias) {
    const double *v = table16(f);
    const unsigned sign = (signbit(x) ? 1u : 0u) << (ebits + mbits), inf_code = ((1u << ebits) - 1) << mbits;
    if (isnan(x)) return sign | inf_code | (1u << (mbits - 1));
    const double a = fabs(x), top = ldexp(1.0, bias + 1); /* 2^(emax + 1): emax = bias for both formats */
    if (a >= top) return sign | inf_code;
    if (a == 0.0) return sign;
    /* search a's binade: codes [E << mbits, (E + 1) << mbits] (the subnormals and 2^(1 - bias) when E <= 0) */
    int ex;
    (void)frexp(a, &ex); /* a in [2^(ex-1), 2^ex) */
    const int E = ex - 1 + bias;
    unsigned lo = E <= 0 ? 0 : (unsigned)E << mbits, hi = E <= 0 ? 1u << mbits : (unsigned)(E + 1) << mbits;
    /* v[lo] <= a < value(hi) */
    while (hi - lo > 1) {
        unsigned mid = (lo + hi) / 2;
        if (v[mid] <= a) lo = mid;
        else hi = mid;
    }
    const double mid = 0.5 * (v[lo] + (hi == inf_code ? top : v[hi])); /* exact: at most 12 significant bits */
    const unsigned c = a < mid ? lo : a > mid ? hi : (lo % 2 == 0 ? lo : hi);
    return sign | c;
}
double orc_bf16_value(uint16_t h) { return table16(0)[h]; }
double orc_fp16_value(uint16_t h) { return table16(1)[h]; }
uint16_t orc_bf16_encode(double x) { return (uint16_t)ieee_encode(x, 0, 8, 7, 127); }
uint16_t orc_fp16_encode(double x) { return (uint16_t)ieee_encode(x, 1, 5, 10, 15); }

float orc_f32(double x) {
    if (isnan(x)) return signbit(x) ? -NAN : NAN;
    /* beyond the midpoint between FLT_MAX and 2^128, RNE gives Inf (converting such a double is not defined C) */
    if (fabs(x) >= ldexp(2.0, 127) - ldexp(1.0, 103)) return signbit(x) ? -INFINITY : INFINITY;
    return (float)x;
}

/* ---- scale rules ---- */
int orc_scale_code(double amax, int fmt, int rule) {
    if (isnan(amax) || isinf(amax)) return 255;
    if (amax == 0) return 0;
    const double a = fabs(amax), maxn = fmt ? 57344.0 : 448.0;
    const int emax = fmt ? 15 : 8;
    int fl;
    (void)frexp(a, &fl); /* a = f * 2^fl, f in [0.5, 1): floor(log2 a) = fl - 1, exactly */
    fl -= 1;
    int e;
    if (rule == 0) {
        e = fl - (emax - 1);
    } else if (rule == 1) {
        e = fl - emax;
    } else { /* the least e with a <= maxn * 2^e, i.e. a / maxn <= 2^e */
        e = fl - emax - 2;
        while (ldexp(maxn, e) < a) e++;
    }
    if (e < -127) e = -127;
    if (e > 127) e = 127;
    return e + 127;
}
