/*
 * check.h -- the verdicts of matmul-bwd and moe-bwd.
 *
 * Two questions, answered separately:
 *  1. Is the kernel right? (the verdict, and exit status 1 when not) The kernel is compared with the quantized FP64
 *     reference: the same MXFP8 quantization of every GEMM operand, then exact (FP64) arithmetic. The kernel may
 *     differ from it only by what FP32 accumulation and the final rounding to the output dtype allow; each element
 *     gets an allowed error (cli_bound) and the verdict fails when any element exceeds it.
 *  2. How far is MXFP8 from full precision? (information) The NKI pass criteria of the kernel against the
 *     unquantized FP64 golden, printed beside the same criteria of the quantized reference itself: when the kernel
 *     misses a criterion that the quantized reference misses too, the format's error decides it, not the kernel.
 *
 * Test hook: MXFP8_CLI_TEST_CORRUPT=<gradient name> makes the command corrupt that gradient's largest element (add
 * 5% of the gradient's largest magnitude) after the kernel ran and before it is checked or written, so the tests
 * can show that a wrong kernel result fails the verdict. Read by the CLI only, never by the library.
 */
#ifndef MXFP8_TOOLS_CHECK_H
#define MXFP8_TOOLS_CHECK_H

#include "cli.h"
#include "io/tensorfile.h"

/** The allowed error of element (i, j) of a [rows, cols] output against the FP64 reference q:
 *    |k - q| <= rel_out * |q| + abs + gamma * row_norm[i] * col_norm[j]   (the last term only when the norms are
 *  given), and, when norm_rel > 0, over the whole tensor ||k - q||_2 <= norm_rel * ||q||_2. Non-finite q requires
 *  the same non-finite k (NaN for NaN, the same infinity). */
typedef struct cli_bound {
    double rel_out;  /**< relative rounding of the output dtype */
    double abs;      /**< constant absolute allowance */
    double gamma;    /**< coefficient of the norm product (FP32 accumulation, see cmd_matmul.c) */
    const double *row_norm, *col_norm;
    int64_t rows, cols;
    double norm_rel; /**< allowed ||k - q|| / ||q|| (0: not checked) */
} cli_bound;

/** Worst error / allowed over the elements of kernel (contiguous F32/BF16/F16) against q (F64, same numel), and
 *  the normwise ||k - q|| / ||q|| over norm_rel when that is checked: <= 1 passes; +inf when a non-finite element
 *  disagrees. *norm_err = ||k - q|| / ||q|| over the finite elements (may be NULL). */
double cli_bound_ratio(const tf_tensor *kernel, const double *q, const cli_bound *b, double *norm_err);

/** u_out: the largest relative error of rounding to the dtype (half an ulp: 2^-8 BF16, 2^-11 F16, 2^-24 F32), and
 *  eta_out: half its smallest subnormal (the absolute error of rounding in its subnormal range). */
double cli_unit_roundoff(tf_dtype dt);
double cli_half_min_subnormal(tf_dtype dt);
/** gamma_n = n u / (1 - n u), u = 2^-24: the FP32 accumulation bound of an n-term dot product [Higham, Accuracy and
 *  Stability of Numerical Algorithms, 2nd ed., Lemma 3.1 and section 3.1]; +inf when n u >= 1. */
double cli_gamma_fp32(int64_t n);

/** The NKI pass criteria of one command. */
typedef struct cli_nki_criteria {
    double atol_frac, rtol, cosine_min, norm_euclid_max;
    const char *allclose_text; /**< "allclose: atol = ... x max|golden|, rtol = ..." */
} cli_nki_criteria;

/** One gradient's checks. */
typedef struct cli_grad_check {
    const char *name;
    char shape[64];
    mxfp8_compare_result kernel_vs_golden; /**< the NKI criteria of the kernel (unquantized golden) */
    mxfp8_compare_result qref_vs_golden;   /**< the same of the quantized reference: MXFP8's own error */
    mxfp8_compare_result kernel_vs_qref;   /**< max_rel_err: the table's metric of question 1 */
    double ratio;                          /**< worst error / allowed (cli_bound_ratio) */
    double norm_err;                       /**< ||k - q|| / ||q|| */
    /* Non-finite elements of the quantized reference and where the kernel agrees (same NaN / same infinity at the
     * same index), and the kernel's non-finite elements where the reference is finite. */
    int64_t ref_nan, nan_same, ref_inf, inf_same, kernel_only_nonfinite;
} cli_grad_check;

/** Compare kernel (a gradient of the command) with golden (F32/F64) and qref (F64): fills *c except ratio and
 *  norm_err (cli_bound_ratio), counting the non-finite elements of qref and whether the kernel has them too. */
int cli_grad_compare(const char *cmd, const char *name, const tf_tensor *kernel, const tf_tensor *golden,
                     const tf_tensor *qref, const cli_nki_criteria *crit, cli_grad_check *c);
/** Print both tables, the explanation of the allowed error (bound_text), the verdict and the NKI summary.
 *  Returns CLI_OK when every gradient is within its allowed error, else CLI_FAIL. */
int cli_print_verdict(const cli_grad_check *g, int n, const cli_nki_criteria *crit, const char *bound_text);

/** Unless quiet: a note on stderr that --no-check skips the golden references when they took most of the run
 *  (over 2 s and over half of it). */
void cli_golden_hint(const char *cmd, int quiet);

/** The test hook: corrupt tensor t when MXFP8_CLI_TEST_CORRUPT names it. Returns 1 when it did. */
int cli_test_corrupt(tf_tensor *t);

#endif
