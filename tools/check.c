/* check.c -- the verdicts of matmul-bwd and moe-bwd (see check.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "progress.h"

static double elem(const tf_tensor *t, int64_t i) {
    switch (t->dtype) {
    case TF_F32: return ((const float *)t->data)[i];
    case TF_F64: return ((const double *)t->data)[i];
    case TF_BF16: return mxfp8_bf16_to_fp32(((const uint16_t *)t->data)[i]);
    case TF_F16: return mxfp8_fp16_to_fp32(((const uint16_t *)t->data)[i]);
    default: return NAN;
    }
}

double cli_bound_ratio(const tf_tensor *kernel, const double *q, const cli_bound *b, double *norm_err) {
    double r = 0, d2 = 0, q2 = 0;
    for (int64_t i = 0; i < kernel->numel; i++) {
        double k = elem(kernel, i), ref = q[i], e;
        if (!isfinite(ref)) {
            e = (isnan(ref) ? isnan(k) : k == ref) ? 0 : INFINITY;
        } else if (!isfinite(k)) {
            e = INFINITY;
        } else {
            double allowed = b->rel_out * fabs(ref) + b->abs;
            if (b->row_norm && b->cols > 0) allowed += b->gamma * b->row_norm[i / b->cols] * b->col_norm[i % b->cols];
            double d = fabs(k - ref);
            e = d == 0 ? 0 : allowed > 0 ? d / allowed : INFINITY;
            d2 += d * d;
            q2 += ref * ref;
        }
        if (!(e <= r)) r = e;
    }
    double ne = q2 > 0 ? sqrt(d2 / q2) : d2 > 0 ? INFINITY : 0;
    if (norm_err) *norm_err = ne;
    if (b->norm_rel > 0 && !(ne / b->norm_rel <= r)) r = ne / b->norm_rel;
    return r;
}

double cli_unit_roundoff(tf_dtype dt) {
    return dt == TF_BF16 ? 0x1p-8 : dt == TF_F16 ? 0x1p-11 : dt == TF_F32 ? 0x1p-24 : 0x1p-53;
}

double cli_half_min_subnormal(tf_dtype dt) {
    return dt == TF_BF16 ? 0x1p-134 : dt == TF_F16 ? 0x1p-25 : dt == TF_F32 ? 0x1p-150 : 0.0; /* F64: negligible */
}

double cli_gamma_fp32(int64_t n) {
    double nu = (double)n * 0x1p-24;
    return nu < 1 ? nu / (1 - nu) : INFINITY;
}

int cli_grad_compare(const char *cmd, const char *name, const tf_tensor *kernel, const tf_tensor *golden,
                     const tf_tensor *qref, const cli_nki_criteria *crit, cli_grad_check *c) {
    memset(c, 0, sizeof *c);
    c->name = name;
    tf_shape_str(kernel->ndim, kernel->shape, c->shape, sizeof c->shape);
    mxfp8_tensor k = tf_view(kernel), g = tf_view(golden), q = tf_view(qref);
    mxfp8_status st;
    if ((st = mxfp8_compare(&k, &g, crit->atol_frac, crit->rtol, &c->kernel_vs_golden)) ||
        (st = mxfp8_compare(&q, &g, crit->atol_frac, crit->rtol, &c->qref_vs_golden)) ||
        (st = mxfp8_compare(&k, &q, 0.0, 0.0, &c->kernel_vs_qref)))
        return cli_lib_error(cmd, "mxfp8_compare", st);
    const double *qd = qref->data;
    double maxq = 0, maxe = 0; /* over the elements finite in both */
    for (int64_t i = 0; i < kernel->numel; i++) {
        double kv = elem(kernel, i), qv = qd[i];
        if (isnan(qv)) c->ref_nan++, c->nan_same += isnan(kv) != 0;
        else if (isinf(qv)) c->ref_inf++, c->inf_same += kv == qv;
        else if (!isfinite(kv)) c->kernel_only_nonfinite++;
        else {
            if (fabs(qv) > maxq) maxq = fabs(qv);
            if (fabs(kv - qv) > maxe) maxe = fabs(kv - qv);
        }
    }
    if (c->ref_nan || c->ref_inf || c->kernel_only_nonfinite) /* the table's max rel err: finite elements only */
        c->kernel_vs_qref.max_rel_err = maxq > 0 ? maxe / maxq : maxe == 0 ? 0.0 : INFINITY;
    return CLI_OK;
}

/* Under a gradient's verdict row: what the reference holds that is not a number, and whether the kernel agrees. */
static void print_nonfinite(const cli_grad_check *g) {
    const char *pad = "                               ";
    if (g->ref_nan)
        printf("%s%lld NaN values in the reference; the kernel has NaN at %s\n", pad, (long long)g->ref_nan,
               g->nan_same == g->ref_nan ? "the same places (they match)" : "only some of those places (mismatch)");
    if (g->ref_inf)
        printf("%s%lld infinities in the reference; the kernel has %s\n", pad, (long long)g->ref_inf,
               g->inf_same == g->ref_inf ? "the same ones at the same places (they match)"
                                         : "other values at some of those places (mismatch)");
    if (g->kernel_only_nonfinite)
        printf("%s%lld NaN or infinite values in the kernel's output where the reference is finite\n", pad,
               (long long)g->kernel_only_nonfinite);
    if (g->ref_nan || g->ref_inf)
        printf("%s(max rel err and norm rel err: over the elements finite in both)\n", pad);
}

static int nki_pass(const cli_nki_criteria *c, const mxfp8_compare_result *r) {
    return r->allclose && r->cosine >= c->cosine_min && r->norm_euclid <= c->norm_euclid_max && r->num_nan == 0;
}

/* "cosine, norm-eucl" etc.: the criteria r misses. */
static void misses(const cli_nki_criteria *c, const mxfp8_compare_result *r, char *buf, size_t len) {
    buf[0] = 0;
    const char *sep = "";
    if (!r->allclose) snprintf(buf + strlen(buf), len - strlen(buf), "%sallclose", sep), sep = ", ";
    if (!(r->cosine >= c->cosine_min)) snprintf(buf + strlen(buf), len - strlen(buf), "%scosine", sep), sep = ", ";
    if (!(r->norm_euclid <= c->norm_euclid_max))
        snprintf(buf + strlen(buf), len - strlen(buf), "%snorm-eucl", sep), sep = ", ";
    if (r->num_nan) snprintf(buf + strlen(buf), len - strlen(buf), "%sNaN values", sep);
}

static void print_tables(const cli_grad_check *g, int n, const cli_nki_criteria *crit, const char *bound_text) {
    printf("\nthe kernel against the quantized FP64 reference (the verdict: no error beyond FP32 accumulation)\n");
    printf("%-30s %-18s %-13s %-13s %-17s %s\n", "gradient", "shape", "max rel err", "norm rel err",
           "worst / allowed", "result");
    for (int i = 0; i < n; i++) {
        printf("%-30s %-18s %-13.3e %-13.3e %-17.3g %s\n", g[i].name, g[i].shape, g[i].kernel_vs_qref.max_rel_err,
               g[i].norm_err, g[i].ratio, g[i].ratio <= 1 ? "PASS" : "FAIL");
        print_nonfinite(&g[i]);
    }
    printf("%s\n", bound_text);
    char cos_h[32], ne_h[32];
    snprintf(cos_h, sizeof cos_h, "cosine (>= %g)", crit->cosine_min);
    snprintf(ne_h, sizeof ne_h, "norm-eucl (<= %.2f)", crit->norm_euclid_max);
    printf("\nNKI pass criteria against the unquantized FP64 golden (information)   | MXFP8 alone: the quantized "
           "reference\n");
    printf("%-30s %-9s %-18s %-20s | %-9s %-9s %s\n", "gradient", "allclose", cos_h, ne_h, "allclose", "cosine",
           "norm-eucl");
    for (int i = 0; i < n; i++) {
        const mxfp8_compare_result *k = &g[i].kernel_vs_golden, *q = &g[i].qref_vs_golden;
        char cs[32], ns[32];
        snprintf(cs, sizeof cs, "%.6f %s", k->cosine, k->cosine >= crit->cosine_min ? "PASS" : "FAIL");
        snprintf(ns, sizeof ns, "%.5f %s", k->norm_euclid, k->norm_euclid <= crit->norm_euclid_max ? "PASS" : "FAIL");
        printf("%-30s %-9s %-18s %-20s | %-9s %-9.6f %.5f\n", g[i].name, k->allclose ? "PASS" : "FAIL", cs, ns,
               q->allclose ? "PASS" : "FAIL", q->cosine, q->norm_euclid);
        if (k->num_nan) printf("%-30s   %lld NaN values in the kernel's output\n", "", (long long)k->num_nan);
    }
    printf("%s.\nMXFP8 alone: the quantized FP64 reference against the same golden, the error of the format "
           "itself\n", crit->allclose_text);
}

int cli_print_verdict(const cli_grad_check *g, int n, const cli_nki_criteria *crit, const char *bound_text) {
    print_tables(g, n, crit, bound_text);
    int bad = 0, nki_bad = 0, fmt_too = 0;
    double worst = 0;
    char names[512] = "";
    for (int i = 0; i < n; i++) {
        if (!(g[i].ratio <= 1)) {
            bad++;
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", bad > 1 ? ", " : "", g[i].name);
            if (!(g[i].ratio <= worst)) worst = g[i].ratio;
        }
    }
    printf("\n");
    if (bad)
        printf("verdict: FAIL -- %s %s from the quantized FP64 reference by more than FP32 accumulation allows\n"
               "  (worst element %.3g times its allowed error)\n", names, bad > 1 ? "differ" : "differs", worst);
    else
        printf("verdict: PASS -- the kernel adds no error beyond FP32 accumulation: %s within the allowed error\n"
               "  of the quantized FP64 reference\n", n == 2 ? "both gradients are" : n == 1 ? "the gradient is" :
               n == 4 ? "all 4 gradients are" : "all 6 gradients are");
    char line[1024] = "";
    for (int i = 0; i < n; i++) {
        if (nki_pass(crit, &g[i].kernel_vs_golden)) continue;
        char m[96];
        misses(crit, &g[i].kernel_vs_golden, m, sizeof m);
        int q_misses = !nki_pass(crit, &g[i].qref_vs_golden);
        fmt_too += q_misses;
        snprintf(line + strlen(line), sizeof line - strlen(line), "%s%s (%s%s)", nki_bad++ ? "; " : "", g[i].name, m,
                 q_misses ? "" : "; the quantized reference meets it");
    }
    if (!nki_bad) printf("NKI criteria against the unquantized golden: all met\n");
    else
        printf("NKI criteria against the unquantized golden: not met by %s\n %s\n", line,
               fmt_too == nki_bad ? nki_bad > 1 ? " the quantized reference misses them too: the error of MXFP8 "
                                                  "itself, not of the kernel (information, not a failure)"
                                                : " the quantized reference misses it too: the error of MXFP8 "
                                                  "itself, not of the kernel (information, not a failure)"
                                  : " (information, not a failure)");
    return bad ? CLI_FAIL : CLI_OK;
}

int cli_test_corrupt(tf_tensor *t) {
    const char *which = getenv("MXFP8_CLI_TEST_CORRUPT");
    if (!which || strcmp(which, t->name) || t->numel < 1) return 0;
    int64_t at = 0;
    double mx = 0;
    for (int64_t i = 0; i < t->numel; i++)
        if (fabs(elem(t, i)) > mx) mx = fabs(elem(t, i)), at = i;
    double v = elem(t, at) + 0.05 * (mx > 0 ? mx : 1.0);
    switch (t->dtype) {
    case TF_F32: ((float *)t->data)[at] = (float)v; break;
    case TF_BF16: ((uint16_t *)t->data)[at] = mxfp8_fp32_to_bf16((float)v); break;
    case TF_F16: ((uint16_t *)t->data)[at] = mxfp8_fp32_to_fp16((float)v); break;
    default: return 0;
    }
    fprintf(stderr, "mxfp8: test hook MXFP8_CLI_TEST_CORRUPT: corrupted %s[%lld]\n", t->name, (long long)at);
    return 1;
}

void cli_golden_hint(const char *cmd, int quiet) {
    double golden = cli_progress_seconds(CLI_WORK_GOLDEN), total = cli_progress_elapsed();
    if (quiet || golden < 2.0 || golden < 0.5 * total) return;
    fprintf(stderr, "mxfp8 %s: note: the FP64 golden references took %.1f s of the %.1f s of this run; --no-check "
            "skips them (the kernel's time is the same either way)\n", cmd, golden, total);
}
