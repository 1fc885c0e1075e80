/*
 * quant_stats.c -- `mxfp8 quantize --stats`: what the quantization did to a tensor, computed here from the command's
 * own input and outputs (the FP8 codes, the E8M0 scales, and their exact dequantization by mxfp8_dequantize):
 *   - the histogram of the scale codes (one per group), and the groups holding NaN/Inf (code 255);
 *   - elements saturated (|x| beyond the largest normal times the group's scale: clipped), flushed to zero (x != 0
 *     quantized to 0) and stored as FP8 subnormals;
 *   - SQNR = 10 log10(sum x^2 / sum (x - x_hat)^2) over the finite groups;
 *   - the per-group relative error ||x_g - x_hat_g|| / ||x_g|| (all-zero groups excluded): median, 99th
 *     percentile, max, and a histogram in log-spaced bins for --plot.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant_stats.h"

static double value(const tf_tensor *t, int64_t i) {
    switch (t->dtype) {
    case TF_F32: return ((const float *)t->data)[i];
    case TF_BF16: return mxfp8_bf16_to_fp32(((const uint16_t *)t->data)[i]);
    case TF_F16: return mxfp8_fp16_to_fp32(((const uint16_t *)t->data)[i]);
    default: return NAN;
    }
}

/* Compact group index along an axis of length L of the element at a (mxfp8.h: MXFP8_GROUP_WRAPX). */
static int64_t group_of(int64_t a, int64_t L, mxfp8_group_scheme scheme) {
    if (scheme != MXFP8_GROUP_WRAPX) return a / 32;
    int64_t k0 = 0, P = 512;
    for (;;) {
        P = L - k0 >= 512 ? 512 : L - k0 >= 256 ? 256 : 128;
        if (a < k0 + P) break;
        k0 += P;
    }
    int64_t S = P / 4, r = (a - k0) % S;
    return k0 / 32 + r / 8;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* Per-group relative errors: quantiles and the log-binned histogram (edges 10^-8 .. 10^0, 10 bins a decade). */
static void group_errors(double *rel, int64_t n, int64_t exact, quant_stats *s, cJSON *doc) {
    qsort(rel, (size_t)n, sizeof *rel, cmp_double);
    s->rel_median = n ? rel[n / 2] : 0;
    s->rel_p99 = n ? rel[(int64_t)((double)(n - 1) * 0.99)] : 0;
    s->rel_max = n ? rel[n - 1] : 0;
    cJSON *h = cJSON_AddObjectToObject(doc, "group_rel_err_histogram");
    cJSON *edges = cJSON_AddArrayToObject(h, "edges"), *counts = cJSON_AddArrayToObject(h, "counts");
    enum { NB = 80 };
    int64_t c[NB] = {0};
    for (int64_t i = 0; i < n; i++) {
        int b = rel[i] <= 1e-8 ? 0 : (int)floor((log10(rel[i]) + 8.0) * 10.0);
        c[b < 0 ? 0 : b >= NB ? NB - 1 : b]++;
    }
    for (int b = 0; b <= NB; b++) cJSON_AddItemToArray(edges, cJSON_CreateNumber(pow(10.0, -8.0 + b / 10.0)));
    for (int b = 0; b < NB; b++) cJSON_AddItemToArray(counts, cJSON_CreateNumber((double)c[b]));
    cJSON_AddNumberToObject(h, "exact", (double)exact);
}

int quant_stats_compute(const tf_tensor *x, const tf_tensor *codes, const tf_tensor *scales, const tf_tensor *deq,
                        int axis, const mxfp8_quant_params *qp, const mxfp8_quant_stats *lib, quant_stats *s,
                        cJSON *doc) {
    memset(s, 0, sizeof *s);
    int64_t L = x->shape[axis], inner = 1, G = scales->shape[axis];
    for (int d = axis + 1; d < x->ndim; d++) inner *= x->shape[d];
    int64_t ngroups = scales->numel;
    double *x2 = calloc((size_t)(ngroups ? ngroups : 1), sizeof *x2), *d2 = calloc((size_t)(ngroups ? ngroups : 1), sizeof *d2);
    if (!x2 || !d2) {
        free(x2);
        free(d2);
        return -1;
    }
    const uint8_t *code = codes->data, *sc = scales->data;
    const float *xh = deq->data;
    int e4 = qp->fmt == MXFP8_FMT_E4M3;
    double maxnorm = e4 ? 448.0 : 57344.0, sx2 = 0, sd2 = 0;
    for (int64_t i = 0; i < x->numel; i++) {
        int64_t a = (i / inner) % L, outer = i / (inner * L), in = i % inner;
        int64_t g = (outer * G + group_of(a, L, qp->group)) * inner + in;
        if (sc[g] == 255) continue; /* a NaN/Inf group: decodes to NaN, counted below */
        double v = value(x, i), h = xh[i], d = v - h;
        int c = code[i] & 0x7F;
        s->saturated += fabs(v) > maxnorm * ldexp(1.0, sc[g] - 127);
        s->flushed += v != 0 && h == 0;
        s->subnormal += e4 ? ((c >> 3) == 0 && (c & 7)) : ((c >> 2) == 0 && (c & 3));
        x2[g] += v * v;
        d2[g] += d * d;
        sx2 += v * v;
        sd2 += d * d;
    }
    cJSON *hist = cJSON_AddArrayToObject(doc, "scale_code_histogram");
    int64_t counts[256] = {0};
    for (int64_t g = 0; g < ngroups; g++) counts[sc[g]]++;
    for (int k = 0; k < 256; k++) cJSON_AddItemToArray(hist, cJSON_CreateNumber((double)counts[k]));
    s->groups = ngroups;
    s->nan_groups = counts[255];
    s->code_min = 255, s->code_max = 0;
    for (int k = 0; k < 255; k++)
        if (counts[k]) {
            if (k < s->code_min) s->code_min = k;
            if (k > s->code_max) s->code_max = k;
            if (counts[k] > counts[s->code_mode]) s->code_mode = k;
        }
    s->mode_count = counts[s->code_mode];
    s->sqnr_db = sd2 > 0 ? 10.0 * log10(sx2 / sd2) : INFINITY;
    if (lib) { /* the library's counts (the same definitions) and its exactly summed SQNR */
        s->saturated = lib->saturated, s->flushed = lib->flushed_to_zero, s->subnormal = lib->subnormal;
        if (lib->sum_sq_error > 0) s->sqnr_db = mxfp8_quant_stats_sqnr_db(lib);
    }
    int64_t n = 0, exact = 0;
    for (int64_t g = 0; g < ngroups; g++) {
        if (sc[g] == 255 || x2[g] == 0) continue;
        if (d2[g] == 0) exact++;
        x2[n++] = sqrt(d2[g] / x2[g]); /* reuse x2 for the relative errors */
    }
    s->nonzero_groups = n;
    group_errors(x2, n, exact, s, doc);
    free(x2);
    free(d2);
    cJSON_AddNumberToObject(doc, "groups", (double)s->groups);
    cJSON_AddNumberToObject(doc, "nan_groups", (double)s->nan_groups);
    cJSON_AddNumberToObject(doc, "saturated", (double)s->saturated);
    cJSON_AddNumberToObject(doc, "flushed_to_zero", (double)s->flushed);
    cJSON_AddNumberToObject(doc, "subnormal", (double)s->subnormal);
    if (isfinite(s->sqnr_db)) cJSON_AddNumberToObject(doc, "sqnr_db", s->sqnr_db);
    else cJSON_AddNullToObject(doc, "sqnr_db");
    cJSON *q = cJSON_AddObjectToObject(doc, "group_rel_err");
    cJSON_AddNumberToObject(q, "median", s->rel_median);
    cJSON_AddNumberToObject(q, "p99", s->rel_p99);
    cJSON_AddNumberToObject(q, "max", s->rel_max);
    return 0;
}

void quant_stats_print(const quant_stats *s, int64_t numel, const mxfp8_quant_params *qp) {
    printf("stats: %lld elements in %lld groups\n", (long long)numel, (long long)s->groups);
    if (s->groups > s->nan_groups)
        printf("  scale exponents (E8M0 code - 127): %d .. %d; most groups at %d (%lld)", s->code_min - 127,
               s->code_max - 127, s->code_mode - 127, (long long)s->mode_count);
    else printf("  scale exponents: none finite");
    printf("; %lld groups hold NaN/Inf (code 255)\n", (long long)s->nan_groups);
    printf("  elements: %lld saturated (clipped to +-%s x scale), %lld flushed to zero, %lld FP8 subnormals\n",
           (long long)s->saturated, qp->fmt == MXFP8_FMT_E4M3 ? "448" : "57344", (long long)s->flushed,
           (long long)s->subnormal);
    if (isfinite(s->sqnr_db)) printf("  SQNR %.2f dB", s->sqnr_db);
    else printf("  SQNR inf (exact)");
    printf("; per-group relative error ||x - x_hat|| / ||x|| over %lld non-zero groups: median %.3e, 99th "
           "percentile %.3e, max %.3e\n", (long long)s->nonzero_groups, s->rel_median, s->rel_p99, s->rel_max);
}
