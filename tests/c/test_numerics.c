/*
 * test_numerics.c -- stochastic rounding and quantization statistics, against oracles written here:
 *   - Philox-4x32-10: the Random123 known-answer vectors, through the library's generator and through this file's own
 *     implementation (which then serves as the oracle of the element words);
 *   - the stochastic rounding of one value: the two FP8 neighbours of |y| from a table of every FP8 value (public
 *     decoder), the fraction in FP64, floor(2^32 f) compared with the element's word;
 *   - mxfp8_quantize with rounding = STOCHASTIC: every code equals that oracle with the documented logical index
 *     (row-major in src's shape), for rows, columns and strided views, 1 and 2 threads;
 *   - statistics: counts from the codes and the inputs (public codecs), sums in long double; equal (bitwise, sums
 *     included) for 1 and 2 threads, rows and columns, both formats and rules; outputs unchanged with statistics on;
 *   - the AVX-512 extras panels against the reference panels, bit for bit (codes, scales, values, inexact counts and
 *     every statistic), including the per-lane generator path (index steps other than 1). Skipped parts say why.
 */
#include <math.h>

#include "format/codec.h"
#include "format/philox.h"
#include "kernels/avx512/avx512.h"
#include "kernels/qpanel.h"
#include "kernels/ref/ref.h"
#include "testutil.h"

/* ---------------------------------------------------------------------------------------------------------- */
/* An independent Philox-4x32-10 and the element word (include/mxfp8.h, "Stochastic rounding")                */
/* ---------------------------------------------------------------------------------------------------------- */
static void philox_oracle(uint32_t c[4], uint32_t k0, uint32_t k1) {
    for (int r = 0; r < 10; r++) {
        uint64_t a = (uint64_t)0xD2511F53u * c[0], b = (uint64_t)0xCD9E8D57u * c[2];
        uint32_t n0 = (uint32_t)(b >> 32) ^ c[1] ^ k0, n2 = (uint32_t)(a >> 32) ^ c[3] ^ k1;
        c[1] = (uint32_t)b;
        c[3] = (uint32_t)a;
        c[0] = n0;
        c[2] = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}
static uint32_t word_oracle(uint64_t seed, uint64_t stream, int64_t i) {
    uint64_t q = (uint64_t)i / 4;
    uint32_t c[4] = {(uint32_t)q, (uint32_t)(q >> 32), (uint32_t)stream, (uint32_t)(stream >> 32)};
    philox_oracle(c, (uint32_t)seed, (uint32_t)(seed >> 32));
    return c[i % 4];
}

static void test_philox_kat(void) {
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {~0u, ~0u, ~0u, ~0u, ~0u, ~0u, 0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb, 0x5001e420,
         0x24126ea1}};
    for (int v = 0; v < 3; v++) {
        uint32_t o[4], c[4] = {kat[v][0], kat[v][1], kat[v][2], kat[v][3]};
        mxfp8i_philox4x32_10(kat[v], kat[v] + 4, o);
        philox_oracle(c, kat[v][4], kat[v][5]);
        for (int i = 0; i < 4; i++) {
            TU_CHECK(o[i] == kat[v][6 + i], "philox KAT %d word %d: 0x%08x, expected 0x%08x", v, i, o[i],
                     kat[v][6 + i]);
            TU_CHECK(c[i] == kat[v][6 + i], "oracle philox KAT %d word %d: 0x%08x", v, i, c[i]);
        }
    }
    tu_rng rng = {99};
    for (int i = 0; i < 1000; i++) {
        uint64_t s = tu_next(&rng), t = tu_next(&rng);
        int64_t idx = (int64_t)(tu_next(&rng) >> (i % 40 + 1));
        TU_CHECK(mxfp8i_sr_word(s, t, idx) == word_oracle(s, t, idx), "element word of index %lld", (long long)idx);
    }
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Stochastic rounding of one value                                                                           */
/* ---------------------------------------------------------------------------------------------------------- */
static float grid[2][128]; /* the non-negative finite FP8 values, ascending (E4M3: 127 of them, E5M2: 124) */
static int ngrid[2];
static void make_grid(void) {
    for (int f = 0; f < 2; f++) {
        ngrid[f] = 0;
        for (int c = 0; c < 128; c++) {
            float v = mxfp8_fp8_to_fp32((uint8_t)c, (mxfp8_format)f);
            if (isfinite(v)) grid[f][ngrid[f]++] = v;
        }
    }
}
/* The SR code of y (finite) with word r: the neighbours of min(|y|, max normal) on the grid. */
static uint8_t sr_oracle(float y, mxfp8_format f, uint32_t r) {
    double a = fabs((double)y), maxn = grid[f][ngrid[f] - 1];
    if (a > maxn) a = maxn;
    int i = 0;
    while (i + 1 < ngrid[f] && (double)grid[f][i + 1] <= a) i++;
    int c = i;
    if (i + 1 < ngrid[f] && a > grid[f][i]) {
        double frac = (a - grid[f][i]) / ((double)grid[f][i + 1] - grid[f][i]);
        double F = floor(ldexp(frac, 32));
        if ((double)r < F) c = i + 1;
    }
    return (uint8_t)(c | (signbit(y) ? 0x80 : 0));
}

static void test_sr_scalar(void) {
    tu_rng rng = {7};
    for (int f = 0; f < 2; f++)
        for (int i = 0; i < 400000; i++) {
            uint64_t z = tu_next(&rng);
            float y;
            if (i % 4 == 0) y = tu_bits_f32((uint32_t)z & 0x87FFFFFFu); /* tiny values, FP32 subnormals */
            else y = ldexpf((float)(z >> 40) / 16777216.0f, (int)((z >> 8) % 40) - 24) * ((z & 1) ? -1.f : 1.f);
            uint32_t r = (uint32_t)(tu_next(&rng) >> 32);
            if (i % 7 == 0) r = 0;
            if (i % 7 == 1) r = ~0u;
            uint8_t got = mxfp8i_fp32_to_fp8_sr(y, (mxfp8_format)f, r), want = sr_oracle(y, (mxfp8_format)f, r);
            TU_CHECK(got == want, "sr %s y=%a r=0x%08x: code 0x%02x, oracle 0x%02x", f ? "e5m2" : "e4m3", y, r, got,
                     want);
        }
}

/* ---------------------------------------------------------------------------------------------------------- */
/* mxfp8_quantize: stochastic codes against the oracle; statistics against counts and long-double sums         */
/* ---------------------------------------------------------------------------------------------------------- */
/* A [R, C] F32 test tensor: groups of mixed magnitudes, some saturating under OCP, tiny elements that flush, an
 * all-zero group, a NaN group and an Inf group. */
static void fill_tensor(float *x, int64_t R, int64_t C, tu_rng *rng) {
    for (int64_t i = 0; i < R * C; i++) {
        uint64_t z = tu_next(rng);
        double u = (double)(z >> 11) / 9007199254740992.0;
        int e = (int)((i / 32) % 23) - 12;
        x[i] = (float)ldexp(u * 2.0 - 1.0, e - (int)(z % 20 == 0 ? 20 : 0));
    }
    for (int64_t k = 0; k < 32 && k < C; k++) x[k] = 0.0f;
    if (R > 3 && C > 40) {
        x[2 * C + 5] = NAN;
        x[3 * C + 40] = -INFINITY;
    }
}

typedef struct oracle_stats {
    int64_t elements, saturated, flushed, subnormal, nonfinite, zero, hist[256];
    long double err, sig;
} oracle_stats;

/* Counts and sums of a [R, C] tensor quantized along axis (codes d, scales s), from the public codecs. */
static void stats_oracle(const float *x, const uint8_t *d, const uint8_t *s, int64_t R, int64_t C, int axis,
                         mxfp8_format f, oracle_stats *o) {
    memset(o, 0, sizeof *o);
    const int64_t L = axis == 1 ? R : C, K = axis == 1 ? C : R, G = (K + 31) / 32;
    const double maxn = f == MXFP8_FMT_E5M2 ? 57344.0 : 448.0, emin = f == MXFP8_FMT_E5M2 ? 0x1p-14 : 0x1p-6;
    for (int64_t l = 0; l < L; l++)
        for (int64_t g = 0; g < G; g++) {
            uint8_t sc = axis == 1 ? s[l * G + g] : s[g * L + l];
            int n = (int)(K - 32 * g < 32 ? K - 32 * g : 32), zero = 1;
            o->elements += n;
            o->hist[sc]++;
            if (sc == 255) {
                o->nonfinite++;
                continue;
            }
            for (int q = 0; q < n; q++) {
                int64_t k = 32 * g + q, off = axis == 1 ? l * C + k : k * C + l;
                double xv = x[off], v = (double)mxfp8_fp8_to_fp32(d[off], f) * ldexp(1.0, sc - 127);
                double y = fabs(xv) * ldexp(1.0, 127 - sc);
                if (xv != 0) zero = 0;
                o->saturated += y > maxn;
                o->flushed += xv != 0 && v == 0;
                o->subnormal += v != 0 && fabs(v) * ldexp(1.0, 127 - sc) < emin;
                o->err += (long double)(xv - v) * (long double)(xv - v);
                o->sig += (long double)xv * xv;
            }
            o->zero += zero;
        }
}

static void check_stats(const mxfp8_quant_stats *st, const oracle_stats *o, const char *what) {
    TU_CHECK(st->elements == o->elements, "%s: elements %lld, oracle %lld", what, (long long)st->elements,
             (long long)o->elements);
    TU_CHECK(st->saturated == o->saturated, "%s: saturated %lld, oracle %lld", what, (long long)st->saturated,
             (long long)o->saturated);
    TU_CHECK(st->flushed_to_zero == o->flushed, "%s: flushed %lld, oracle %lld", what, (long long)st->flushed_to_zero,
             (long long)o->flushed);
    TU_CHECK(st->subnormal == o->subnormal, "%s: subnormal %lld, oracle %lld", what, (long long)st->subnormal,
             (long long)o->subnormal);
    TU_CHECK(st->nonfinite_groups == o->nonfinite, "%s: nonfinite %lld, oracle %lld", what,
             (long long)st->nonfinite_groups, (long long)o->nonfinite);
    TU_CHECK(st->zero_groups == o->zero, "%s: zero groups %lld, oracle %lld", what, (long long)st->zero_groups,
             (long long)o->zero);
    int64_t groups = 0, hd = 0;
    for (int i = 0; i < 256; i++) {
        groups += o->hist[i];
        hd += st->scale_histogram[i] != o->hist[i];
    }
    TU_CHECK(hd == 0 && st->groups == groups, "%s: histogram differs in %lld codes", what, (long long)hd);
    TU_CHECK(fabsl(st->sum_sq_error - o->err) <= 1e-6L * o->err, "%s: sum_sq_error %.17g, oracle %.17Lg", what,
             st->sum_sq_error, o->err);
    TU_CHECK(fabsl(st->sum_sq_signal - o->sig) <= 1e-6L * o->sig, "%s: sum_sq_signal %.17g, oracle %.17Lg", what,
             st->sum_sq_signal, o->sig);
}

/* Quantize x [R, C] (F32) along `axis`, through a transposed copy when `transposed` (another panel geometry). */
static void quantize_2d(const float *x, int64_t R, int64_t C, int axis, int transposed, mxfp8_quant_params *qp,
                        uint8_t *d, uint8_t *s) {
    int64_t shape[2] = {R, C}, G = axis == 1 ? (C + 31) / 32 : (R + 31) / 32;
    int64_t sshape[2] = {axis == 1 ? R : G, axis == 1 ? G : C};
    float *xt = NULL;
    mxfp8_tensor src = mxfp8_tensor_make((void *)x, MXFP8_DTYPE_F32, 2, shape);
    if (transposed) { /* the same logical tensor stored column-major */
        xt = tu_alloc((size_t)(R * C) * 4);
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++) xt[c * R + r] = x[r * C + c];
        src.data = xt;
        src.strides[0] = 1;
        src.strides[1] = R;
    }
    mxfp8_tensor dt = mxfp8_tensor_make(d, qp->fmt == MXFP8_FMT_E5M2 ? MXFP8_DTYPE_E5M2 : MXFP8_DTYPE_E4M3, 2, shape);
    mxfp8_tensor st = mxfp8_tensor_make(s, MXFP8_DTYPE_E8M0, 2, sshape);
    mxfp8_status rc = mxfp8_quantize(&src, axis, qp, &dt, &st);
    TU_CHECK(rc == MXFP8_OK, "quantize: %s", mxfp8_last_error_message());
    free(xt);
}

static void test_quantize_sr_and_stats(void) {
    const int64_t R = 96, C = 200;
    tu_rng rng = {2024};
    float *x = tu_alloc((size_t)(R * C) * 4);
    fill_tensor(x, R, C, &rng);
    uint8_t *d0 = tu_alloc((size_t)(R * C)), *d1 = tu_alloc((size_t)(R * C)), *s0 = tu_alloc((size_t)(R * C)),
            *s1 = tu_alloc((size_t)(R * C));
    char what[160];
    for (int f = 0; f < 2; f++)
        for (int rule = 0; rule < 3; rule++)
            for (int axis = 0; axis < 2; axis++) {
                const int64_t ns = axis == 1 ? R * ((C + 31) / 32) : ((R + 31) / 32) * C;
                mxfp8_quant_params qp = mxfp8_quant_params_default();
                qp.fmt = (mxfp8_format)f;
                qp.rule = (mxfp8_scale_rule)rule;
                /* nearest with and without statistics: outputs identical; stats against the oracle */
                mxfp8_quant_stats st0, st1;
                quantize_2d(x, R, C, axis, 0, &qp, d0, s0);
                qp.stats = &st0;
                mxfp8_set_num_threads(1);
                quantize_2d(x, R, C, axis, 0, &qp, d1, s1);
                snprintf(what, sizeof what, "nearest %s rule %d axis %d", f ? "e5m2" : "e4m3", rule, axis);
                TU_CHECK(!memcmp(d0, d1, (size_t)(R * C)) && !memcmp(s0, s1, (size_t)ns),
                         "%s: outputs change with statistics on", what);
                oracle_stats o;
                stats_oracle(x, d1, s1, R, C, axis, (mxfp8_format)f, &o);
                check_stats(&st0, &o, what);
                /* 2 threads, transposed storage: the same statistics, bit for bit */
                for (int v = 0; v < 2; v++) {
                    mxfp8_set_num_threads(2);
                    qp.stats = &st1;
                    quantize_2d(x, R, C, axis, v, &qp, d1, s1);
                    TU_CHECK(!memcmp(&st0, &st1, sizeof st0), "%s: statistics differ with 2 threads%s", what,
                             v ? ", transposed storage" : "");
                }
                /* stochastic: every code from the oracle, the same for 1 / 2 threads and both storages */
                qp.rounding = MXFP8_ROUND_STOCHASTIC;
                qp.seed = 0x123456789ABCDEFull + (uint64_t)(f * 3 + rule);
                qp.stream = (uint64_t)axis << 40 | 77;
                qp.stats = NULL;
                mxfp8_set_num_threads(1);
                quantize_2d(x, R, C, axis, 0, &qp, d0, s0);
                int64_t bad = 0, first = -1;
                const int64_t K = axis == 1 ? C : R, L = axis == 1 ? R : C, G = (K + 31) / 32;
                for (int64_t i = 0; i < R * C; i++) {
                    int64_t r = i / C, c = i % C, k = axis == 1 ? c : r, l = axis == 1 ? r : c;
                    uint8_t sc = axis == 1 ? s0[l * G + k / 32] : s0[(k / 32) * L + l];
                    if (sc == 255) continue;
                    float y = x[i] * ldexpf(1.0f, 127 - sc);
                    uint8_t want = sr_oracle(y, (mxfp8_format)f, word_oracle(qp.seed, qp.stream, i));
                    if (want != d0[i] && bad++ == 0) first = i;
                }
                snprintf(what, sizeof what, "stochastic %s rule %d axis %d", f ? "e5m2" : "e4m3", rule, axis);
                TU_CHECK(bad == 0, "%s: %lld codes differ from the oracle (first at index %lld)", what, (long long)bad,
                         (long long)first);
                for (int v = 0; v < 2; v++) {
                    mxfp8_set_num_threads(2);
                    qp.stats = &st1;
                    quantize_2d(x, R, C, axis, v, &qp, d1, s1);
                    TU_CHECK(!memcmp(d0, d1, (size_t)(R * C)) && !memcmp(s0, s1, (size_t)ns),
                             "%s: codes differ with 2 threads%s", what, v ? ", transposed storage" : "");
                    stats_oracle(x, d1, s1, R, C, axis, (mxfp8_format)f, &o);
                    check_stats(&st1, &o, what);
                }
            }
    mxfp8_set_num_threads(0);
    free(x);
    free(d0);
    free(d1);
    free(s0);
    free(s1);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* The AVX-512 extras panels against the reference panels                                                     */
/* ---------------------------------------------------------------------------------------------------------- */
static const mxfp8_dtype OUT_DT[4] = {MXFP8_DTYPE_U8, MXFP8_DTYPE_F32, MXFP8_DTYPE_BF16, MXFP8_DTYPE_F16};

/* One geometry: `lines` lines of K values (rows or cols, odd leading dimensions) from vals (dtype dt), every format,
 * rule and output, with stochastic rounding (index steps ks_idx along K, ls_idx across lines) and/or statistics. */
static void cmp_x_panel(const void *vals, mxfp8_dtype dt, int64_t lines, int64_t K, int cols, mxfp8_group_scheme group,
                        int sr, int stats, int64_t ls_idx, int64_t ks_idx, const char *what) {
    const size_t es = mxfp8_dtype_size(dt);
    const int64_t ld = cols ? lines + 3 : K + 5, rows = cols ? K : lines, G = (K + 31) / 32;
    const int64_t ldo = cols ? lines + 1 : K + 2, sc_rows = cols ? G : lines, ld_sc = cols ? lines : G + 1;
    char *src = tu_alloc((size_t)(rows * ld) * es);
    memset(src, 0x7F, (size_t)(rows * ld) * es);
    for (int64_t l = 0; l < lines; l++)
        for (int64_t k = 0; k < K; k++)
            memcpy(src + (cols ? k * ld + l : l * ld + k) * es, (const char *)vals + (l * K + k) * es, es);
    for (int fmt = 0; fmt < 2; fmt++)
        for (int rule = 0; rule < 3; rule++)
            for (int ok = 0; ok < 4; ok++) {
                const size_t os = mxfp8_dtype_size(OUT_DT[ok]), osz = (size_t)(rows * ldo) * os;
                const size_t ssz = (size_t)(sc_rows * ld_sc);
                char *o1 = tu_alloc(osz), *o2 = tu_alloc(osz);
                uint8_t *s1 = tu_alloc(ssz), *s2 = tu_alloc(ssz);
                memset(o1, 0x5A, osz), memset(o2, 0x5A, osz), memset(s1, 0x5A, ssz), memset(s2, 0x5A, ssz);
                mxfp8i_qstats q1, q2;
                mxfp8i_qstats_zero(&q1);
                mxfp8i_qstats_zero(&q2);
                mxfp8i_qpanel p;
                memset(&p, 0, sizeof p);
                p.src = src, p.src_dtype = dt, p.lines = lines, p.K = K;
                p.src_ls = cols ? 1 : ld, p.src_ks = cols ? ld : 1;
                p.fmt = (mxfp8_format)fmt, p.rule = (mxfp8_scale_rule)rule, p.group = group;
                p.out = o1, p.out_dtype = OUT_DT[ok], p.out_ls = cols ? 1 : ldo, p.out_ks = cols ? ldo : 1;
                p.scales = s1, p.sc_ls = cols ? 1 : ld_sc, p.sc_gs = cols ? ld_sc : 1;
                if (sr) {
                    mxfp8i_sround r = {1, 0xFEEDFACE12345ull * (uint64_t)(fmt + 1), (uint64_t)(rule * 4 + ok), 5,
                                       ls_idx, ks_idx};
                    p.sr = r;
                }
                p.stats = stats ? &q1 : NULL;
                int64_t r1 = mxfp8i_quantize_panel__ref(&p);
                p.out = o2, p.scales = s2, p.stats = stats ? &q2 : NULL;
                int64_t r2 = mxfp8i_quantize_panel__avx512(&p);
                if (r2 < 0) { /* a geometry the kernel declines: the dispatcher would run the reference */
                    TU_CHECK(!cols && group == MXFP8_GROUP_WRAPX, "%s: avx512 declined an expected geometry", what);
                    goto next;
                }
                TU_CHECK(r1 == r2, "%s fmt %d rule %d out %d: inexact ref %lld avx512 %lld", what, fmt, rule, ok,
                         (long long)r1, (long long)r2);
                TU_CHECK(!memcmp(s1, s2, ssz), "%s fmt %d rule %d out %d: scales differ", what, fmt, rule, ok);
                if (memcmp(o1, o2, osz)) {
                    size_t i = 0;
                    while (!memcmp(o1 + i * os, o2 + i * os, os)) i++;
                    TU_CHECK(0, "%s fmt %d rule %d out %d: output element %zu differs", what, fmt, rule, ok, i);
                }
                if (stats) {
                    mxfp8_quant_stats e1, e2;
                    mxfp8i_qstats_export(&q1, &e1);
                    mxfp8i_qstats_export(&q2, &e2);
                    TU_CHECK(!memcmp(&e1, &e2, sizeof e1),
                             "%s fmt %d rule %d out %d: statistics differ (elements %lld/%lld, sat %lld/%lld, flush "
                             "%lld/%lld, sub %lld/%lld, zero %lld/%lld, err %a/%a, sig %a/%a)",
                             what, fmt, rule, ok, (long long)e1.elements, (long long)e2.elements,
                             (long long)e1.saturated, (long long)e2.saturated, (long long)e1.flushed_to_zero,
                             (long long)e2.flushed_to_zero, (long long)e1.subnormal, (long long)e2.subnormal,
                             (long long)e1.zero_groups, (long long)e2.zero_groups, e1.sum_sq_error, e2.sum_sq_error,
                             e1.sum_sq_signal, e2.sum_sq_signal);
                }
            next:
                free(o1), free(o2), free(s1), free(s2);
            }
    free(src);
}

static void test_avx512_extras(void) {
    if (!tu_has_avx512()) {
        printf("test_numerics: CPU lacks AVX-512: the AVX-512 extras panels are not compared\n");
        return;
    }
    tu_rng rng = {31337};
    const int64_t n = 1 << 17;
    float *xf = tu_alloc((size_t)n * 4);
    uint16_t *xb = tu_alloc((size_t)n * 2), *xh = tu_alloc((size_t)n * 2);
    tu_fill_random_f32(xf, n, &rng);
    for (int64_t i = 0; i < n; i++) {
        xb[i] = mxfp8_fp32_to_bf16(xf[i]);
        xh[i] = mxfp8_fp32_to_fp16(xf[i] * 0x1p-100f * (float)(1 << (i / 32 % 20)));
    }
    static const int64_t Ks[] = {1, 31, 32, 33, 96, 130, 512};
    const void *vals[3] = {xf, xb, xh};
    const mxfp8_dtype dts[3] = {MXFP8_DTYPE_F32, MXFP8_DTYPE_BF16, MXFP8_DTYPE_F16};
    char what[160];
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
        for (int cols = 0; cols < 2; cols++)
            for (int d = 0; d < 3; d++)
                for (int mode = 1; mode < 4; mode++) { /* 1: stochastic, 2: statistics, 3: both */
                    const int64_t K = Ks[ki], lines = 67;
                    /* logical indices: row-major [lines, K] (steps K and 1), or column-major (1 and lines) */
                    const int64_t ls = cols ? 1 : K, ks = cols ? lines : 1;
                    snprintf(what, sizeof what, "%s %s K=%lld mode %d", cols ? "cols" : "rows",
                             mxfp8_dtype_name(dts[d]), (long long)K, mode);
                    cmp_x_panel(vals[d], dts[d], lines, K, cols, MXFP8_GROUP_1X32, mode & 1, mode & 2, ls, ks, what);
                    if (mode == 1) { /* per-lane generator words: the other index order */
                        snprintf(what, sizeof what, "%s %s K=%lld stochastic, index steps (%lld, %lld)",
                                 cols ? "cols" : "rows", mxfp8_dtype_name(dts[d]), (long long)K, (long long)ks * 3,
                                 (long long)ls * 3 + 1);
                        cmp_x_panel(vals[d], dts[d], lines, K, cols, MXFP8_GROUP_1X32, 1, 1, ks * 3, ls * 3 + 1, what);
                    }
                }
    /* single-group panels of full-precision values of similar magnitude: each group sum is the whole total, so the
     * order of its FP64 additions shows in the result (mixed binades above would hide it) */
    float *xu = tu_alloc(32 * 4 * 200);
    for (int i = 0; i < 32 * 200; i++) xu[i] = (float)(tu_uniform(&rng) * 2.0 - 1.0) * (float)(1 + i % 3);
    for (int t = 0; t < 200; t++)
        for (int cols = 0; cols < 2; cols++) {
            snprintf(what, sizeof what, "one group %d %s", t, cols ? "cols" : "rows");
            cmp_x_panel(xu + 32 * t, MXFP8_DTYPE_F32, 1, 32, cols, MXFP8_GROUP_1X32, t & 1, 1, 32, 1, what);
        }
    free(xu);
    for (int cols = 0; cols < 2; cols++) {
        snprintf(what, sizeof what, "wrapX %s K=640", cols ? "cols" : "rows");
        cmp_x_panel(xf, MXFP8_DTYPE_F32, 40, 640, cols, MXFP8_GROUP_WRAPX, 1, 1, 640, 1, what);
        cmp_x_panel(xb, MXFP8_DTYPE_BF16, 40, 640, cols, MXFP8_GROUP_WRAPX, 1, 1, 1, 40, what);
    }
    free(xf), free(xb), free(xh);
}

int main(void) {
    make_grid();
    test_philox_kat();
    test_sr_scalar();
    test_quantize_sr_and_stats();
    test_avx512_extras();
    return tu_finish("test_numerics");
}
