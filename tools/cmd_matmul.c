/*
 * cmd_matmul.c -- `mxfp8 matmul-bwd`: matmul_mxfp8_backward (seed page [NKI-M]) on a bundle or on the upstream test
 * problem, checked against the golden references with the NKI pass criteria.
 *
 * dX [M, K] = dY [M, N] @ W [N, K] and dW [N, K] = dY^T [N, M] @ X [M, K]. Goldens (library functions): the
 * unquantized one (FP32 accumulation of the given operands) and the quantized FP64 one (both operands quantized
 * along the contraction axis with the same format/rule/groups, dequantized exactly, accumulated in double).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "io/tensorfile.h"

#define MM_ATOL_FRAC 0.2
#define MM_RTOL 1e-3
#define MM_COSINE_MIN 0.995
#define MM_NORM_EUCLID_MAX 0.10

static void help(void) {
    printf(
        "usage: mxfp8 matmul-bwd [--M M --N N --K K] [--inputs BUNDLE.safetensors] [--output GRADS.safetensors]\n"
        "                        [--float8-dtype float8_e5m2|float8_e4m3fn] [--scale-rule nki|ocp|rceil]\n"
        "                        [--group 1x32|wrapx] [--output-dtype bf16|f16|f32] [--threads N] [--seed S]\n"
        "                        [--repeat R] [--no-check] [--stats] [--stochastic-rounding dy,w,x]\n"
        "                        [--rounding-seed S]\n\n"
        "Backward of a linear layer Y = X @ W^T in MXFP8 (NKI matmul_mxfp8_backward):\n"
        "  input_grad  dX [M, K] = dY [M, N] @ W [N, K]      (dY and W quantized along N)\n"
        "  weight_grad dW [N, K] = dY^T @ X [M, K]          (dY and X quantized along M)\n"
        "and checks both against the golden references with the NKI pass criteria:\n"
        "  allclose(atol = 0.2*max|golden|, rtol = 1e-3), cosine similarity >= 0.995,\n"
        "  ||k - g|| / (||k|| + ||g||) <= 0.10   (golden: unquantized operands, FP32 accumulation),\n"
        "and prints the largest error against the quantized FP64 reference, the time and TFLOP/s.\n\n"
        "  --M, --N, --K N     problem size without --inputs (default 512 512 512, the first upstream shape)\n"
        "  --inputs FILE       .safetensors bundle: output_grad [M, N], weights [N, K], input_activation [M, K]\n"
        "                      (F32, BF16 or F16), optionally pre-quantized: FP8 codes plus output_grad_scales,\n"
        "                      weight_scales, input_scales (layout: --scale-layout)\n"
        "  --output FILE       write input_grad and weight_grad to a .safetensors file\n"
        "  --float8-dtype D    float8_e5m2 (default, as the NKI page) or float8_e4m3fn\n"
        "  --scale-rule R      nki (default), ocp or rceil\n"
        "  --group G           quantization groups: 1x32 (default) or wrapx (needs M, N %% 128 == 0)\n"
        "  --scale-layout L    layout of pre-quantized scales: compact (default), nki-unpacked, nki-packed,\n"
        "                      swizzle128x4\n"
        "  --output-dtype D    bf16 (default), f16 or f32\n"
        "  --threads N         threads (default: MXFP8_NUM_THREADS, OMP_NUM_THREADS, else all cores)\n"
        "  --seed S            seed of the random problem (default 42); data ~ N(0, 1), rounded to BF16\n"
        "  --repeat R          run the backward R times after one untimed warm-up call and report the best time\n"
        "                      (default 3)\n"
        "  --no-check          skip the golden references (just compute and write)\n"
        "  --save-inputs FILE  write the generated problem (output_grad, weights, input_activation) to a\n"
        "                      .safetensors bundle that --inputs (or the Python API) can read back\n"
        "  --stats             print the statistics of the four quantizations (dY along N and along M, W along N,\n"
        "                      X along M): saturated, flushed-to-zero, subnormal, scales used, SQNR\n"
        "  --stochastic-rounding L  round the elements of dy, w and/or x (comma-separated; all, none)\n"
        "                      stochastically instead of to nearest (Philox-4x32-10 by the element's index)\n"
        "  --rounding-seed S   the seed of stochastic rounding (default 0)\n\n"
        "exit status: 0 ok, 1 a pass criterion failed, 2 bad usage, bad input or IO error\n");
}

/* Normal random BF16 matrix. */
static void fill_normal_bf16(uint16_t *p, int64_t n, cli_rng *r) {
    for (int64_t i = 0; i < n; i++) p[i] = mxfp8_fp32_to_bf16((float)cli_rng_normal(r));
}

/* dst [cols, rows] = src [rows, cols]^T, element size esz. */
static void transpose_copy(const void *src, void *dst, int64_t rows, int64_t cols, size_t esz) {
    const char *s = src;
    char *d = dst;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) memcpy(d + ((size_t)j * rows + i) * esz, s + ((size_t)i * cols + j) * esz, esz);
}

typedef struct {
    mxfp8_compare_result vs_golden, vs_quant;
    int have;
} grad_check;

static int criteria_pass(const mxfp8_compare_result *r) {
    return r->allclose && r->cosine >= MM_COSINE_MIN && r->norm_euclid <= MM_NORM_EUCLID_MAX && r->num_nan == 0;
}

int cmd_matmul_bwd(int argc, char **argv) {
    const char *cmd = "matmul-bwd";
    cli_opt opts[] = {{"M", 0, 0, NULL},          {"N", 0, 0, NULL},           {"K", 0, 0, NULL},
                      {"inputs", 'i', 0, NULL},   {"output", 'o', 0, NULL},    {"float8-dtype", 0, 0, NULL},
                      {"scale-rule", 0, 0, NULL}, {"group", 0, 0, NULL},       {"scale-layout", 0, 0, NULL},
                      {"output-dtype", 0, 0, NULL}, {"threads", 0, 0, NULL},   {"seed", 0, 0, NULL},
                      {"repeat", 0, 0, NULL},     {"no-check", 0, 1, NULL},
                      {"save-inputs", 0, 0, NULL}, {"stats", 0, 1, NULL},   {"stochastic-rounding", 0, 0, NULL},
                      {"rounding-seed", 0, 0, NULL}};
    int nopts = (int)(sizeof opts / sizeof opts[0]), npos;
    const char *pos[1];
    int rc = cli_parse(cmd, argc, argv, opts, nopts, pos, 0, &npos);
    if (rc < 0) {
        help();
        return CLI_OK;
    }
    if (rc) return rc;
    int64_t M = 512, N = 512, K = 512, seed = 42, repeat = 3;
    const int64_t DMAX = (int64_t)1 << 24;
    mxfp8_matmul_bwd_args args;
    mxfp8_matmul_bwd_args_init(&args);
    static const char *const layouts[] = {"compact", "nki-unpacked", "nki-packed", "swizzle128x4"};
    static const char *const odts[] = {"bf16", "f16", "f32"};
    static const mxfp8_dtype odtv[] = {MXFP8_DTYPE_BF16, MXFP8_DTYPE_F16, MXFP8_DTYPE_F32};
    int layout = 0, odt = 0;
    const char *f8 = cli_get(opts, nopts, "float8-dtype");
    if (cli_int(cmd, "M", cli_get(opts, nopts, "M"), 0, DMAX, &M) ||
        cli_int(cmd, "N", cli_get(opts, nopts, "N"), 0, DMAX, &N) ||
        cli_int(cmd, "K", cli_get(opts, nopts, "K"), 0, DMAX, &K) ||
        cli_int(cmd, "seed", cli_get(opts, nopts, "seed"), 0, INT64_MAX, &seed) ||
        cli_int(cmd, "repeat", cli_get(opts, nopts, "repeat"), 1, 1000, &repeat) ||
        cli_float8_dtype(cmd, f8, &args.float8_dtype) ||
        cli_scale_rule(cmd, cli_get(opts, nopts, "scale-rule"), &args.scale_rule) ||
        cli_group(cmd, cli_get(opts, nopts, "group"), &args.quant_scheme) ||
        cli_choice(cmd, "scale-layout", cli_get(opts, nopts, "scale-layout"), layouts, 4, &layout) ||
        cli_choice(cmd, "output-dtype", cli_get(opts, nopts, "output-dtype"), odts, 3, &odt) ||
        cli_threads(cmd, cli_get(opts, nopts, "threads")) ||
        cli_matmul_rounding(cmd, cli_get(opts, nopts, "stochastic-rounding"), &args) ||
        cli_seed64(cmd, "rounding-seed", cli_get(opts, nopts, "rounding-seed"), &args.rounding_seed))
        return CLI_USAGE;
    args.output_dtype = odtv[odt];
    args.scale_layout = (mxfp8_scale_layout)layout;
    args.use_scale_packing = layout == MXFP8_SCALES_NKI_PACKED;
    const char *in_path = cli_get(opts, nopts, "inputs"), *out_path = cli_get(opts, nopts, "output");
    int check = cli_get(opts, nopts, "no-check") == NULL;
    const char *save_path = cli_get(opts, nopts, "save-inputs");
    char err0[TF_ERR_LEN];
    if (save_path && cli_get(opts, nopts, "inputs")) return cli_error(cmd, "--save-inputs is for the generated problem, not --inputs");
    if (save_path && tf_check_writable(save_path, 3, err0, sizeof err0)) return cli_error(cmd, "%s", err0);
    char err[TF_ERR_LEN], sb[160];
    if (in_path && (cli_get(opts, nopts, "M") || cli_get(opts, nopts, "N") || cli_get(opts, nopts, "K")))
        return cli_error(cmd, "--M/--N/--K set the random problem's size; with --inputs the bundle's shapes decide");
    if (out_path && tf_check_writable(out_path, 2, err, sizeof err)) return cli_error(cmd, "%s", err);

    tf_set in = {0}, grads = {0}, work = {0};
    rc = CLI_USAGE;
    tf_tensor *dy, *w, *x;
    int in_f64 = 0; /* the bundle's output_grad was F64 (rounded to F32 here) */
    int prequant = 0;
    if (in_path) {
        if (tf_load(in_path, &in, err, sizeof err)) {
            cli_error(cmd, "%s", err);
            goto done;
        }
        static const char *const need[] = {"output_grad", "weights", "input_activation"};
        for (int i = 0; i < 3; i++)
            if (!tf_find(&in, need[i])) {
                cli_error(cmd, "%s: the bundle has no tensor '%s' (needs output_grad, weights, input_activation)",
                          in_path, need[i]);
                goto done;
            }
        dy = tf_find(&in, "output_grad");
        w = tf_find(&in, "weights");
        x = tf_find(&in, "input_activation");
        tf_tensor *ops[3] = {dy, w, x};
        static const char *const sc_names[3] = {"output_grad_scales", "weight_scales", "input_scales"};
        mxfp8_tensor *sc_args[3] = {&args.output_grad_scales, &args.weight_scales, &args.input_scales};
        for (int i = 0; i < 3; i++) {
            tf_tensor *t = ops[i], *s = tf_find(&in, sc_names[i]);
            if (i == 0) in_f64 = t->dtype == TF_F64;
            if (t->dtype == TF_F64 && tf_to_f32(t, err, sizeof err)) {
                cli_error(cmd, "%s", err);
                goto done;
            }
            if (t->ndim != 2) {
                cli_error(cmd, "%s: '%s' must be 2-D, got %s", in_path, t->name, tf_shape_str(t->ndim, t->shape, sb, 160));
                goto done;
            }
            if (s) {
                if (t->dtype != TF_F8_E4M3 && t->dtype != TF_F8_E5M2 && t->dtype != TF_U8 && t->dtype != TF_U32) {
                    cli_error(cmd, "%s: '%s' has scales '%s' but dtype %s: pre-quantized operands hold FP8 codes",
                              in_path, t->name, sc_names[i], tf_dtype_name(t->dtype));
                    goto done;
                }
                if (!f8 && (t->dtype == TF_F8_E4M3 || t->dtype == TF_F8_E5M2))
                    args.float8_dtype = t->dtype == TF_F8_E4M3 ? MXFP8_FMT_E4M3 : MXFP8_FMT_E5M2;
                *sc_args[i] = tf_view(s);
                prequant = 1;
            } else if (t->dtype != TF_F32 && t->dtype != TF_BF16 && t->dtype != TF_F16) {
                cli_error(cmd, "%s: '%s' has dtype %s; F32, BF16 or F16 is needed (or FP8 codes with '%s')", in_path,
                          t->name, tf_dtype_name(t->dtype), sc_names[i]);
                goto done;
            }
        }
        /* Sizes from the high-precision shapes: dY [M, N], X [M, K], W [N, K] (swizzled/x4 operands not here). */
        M = dy->shape[0];
        N = dy->shape[1];
        K = x->shape[1];
        if (w->shape[0] != N || w->shape[1] != K || x->shape[0] != M) {
            char s1[64], s2[64], s3[64];
            cli_error(cmd, "%s: shapes do not match: output_grad %s [M, N], weights %s [N, K], input_activation %s "
                      "[M, K]", in_path, tf_shape_str(2, dy->shape, s1, 64), tf_shape_str(2, w->shape, s2, 64),
                      tf_shape_str(2, x->shape, s3, 64));
            goto done;
        }
        if (prequant && check) {
            fprintf(stderr, "mxfp8 matmul-bwd: note: pre-quantized operands: skipping the golden checks\n");
            check = 0;
        }
    } else {
        cli_rng r;
        cli_rng_seed(&r, (uint64_t)seed);
        int64_t s_dy[2] = {M, N}, s_w[2] = {N, K}, s_x[2] = {M, K};
        if (!(dy = tf_add_new(&in, "output_grad", TF_BF16, 2, s_dy, err, sizeof err)) ||
            !(w = tf_add_new(&in, "weights", TF_BF16, 2, s_w, err, sizeof err)) ||
            !(x = tf_add_new(&in, "input_activation", TF_BF16, 2, s_x, err, sizeof err))) {
            cli_error(cmd, "%s", err);
            goto done;
        }
        fill_normal_bf16(dy->data, dy->numel, &r);
        fill_normal_bf16(w->data, w->numel, &r);
        fill_normal_bf16(x->data, x->numel, &r);
        if (save_path) {
            if (tf_save(save_path, &in, err, sizeof err)) {
                cli_error(cmd, "%s", err);
                goto done;
            }
            printf("wrote the problem (output_grad, weights, input_activation) to %s\n", save_path);
        }
    }
    tf_dtype gdt = odt == 0 ? TF_BF16 : odt == 1 ? TF_F16 : TF_F32;
    int64_t s_dx[2] = {M, K}, s_dw[2] = {N, K};
    tf_tensor *dx = tf_add_new(&grads, "input_grad", gdt, 2, s_dx, err, sizeof err);
    tf_tensor *dw = dx ? tf_add_new(&grads, "weight_grad", gdt, 2, s_dw, err, sizeof err) : NULL;
    if (!dw) {
        cli_error(cmd, "%s", err);
        goto done;
    }
    args.output_grad = tf_view(dy);
    args.weights = tf_view(w);
    args.input_activation = tf_view(x);
    mxfp8_tensor vdx = tf_view(dx), vdw = tf_view(dw);
    mxfp8_info info;
    mxfp8_get_info(&info);
    static const char *const rules[] = {"nki", "ocp", "rceil"};
    printf("mxfp8 matmul-bwd  M=%lld N=%lld K=%lld  %s  scale rule %s  groups %s  output %s  %d thread%s (%s)\n",
           (long long)M, (long long)N, (long long)K,
           args.float8_dtype == MXFP8_FMT_E4M3 ? "float8_e4m3fn" : "float8_e5m2", rules[args.scale_rule],
           args.quant_scheme == MXFP8_GROUP_WRAPX ? "wrapX" : "1x32", odts[odt], info.num_threads,
           info.num_threads == 1 ? "" : "s", info.isa_name);
    if (in_path)
        printf("inputs: %s (%s%s)\n", in_path, prequant ? "pre-quantized" : in_f64 ? "F64" : tf_dtype_name(dy->dtype),
               !prequant && in_f64 ? ", rounded to F32" : "");
    else printf("inputs: random N(0, 1) rounded to BF16, seed %lld\n", (long long)seed);
    fflush(stdout);

    /* One untimed warm-up call first: thread start-up and first touch of the outputs and workspaces would
       otherwise dominate a single timed run (the results are overwritten by the timed calls). */
    mxfp8_quant_stats qstats[4];
    if (cli_get(opts, nopts, "stats")) args.stats = qstats; /* the warm-up call only: the timed calls run without */
    mxfp8_status wst = mxfp8_matmul_backward(&args, &vdx, &vdw);
    if (wst != MXFP8_OK) {
        cli_lib_error(cmd, "mxfp8_matmul_backward", wst);
        goto done;
    }
    if (args.stats) {
        static const char *const qn[4] = {"output_grad along N", "weights along N", "output_grad along M",
                                          "input along M"};
        printf("\n");
        cli_stats_header(stdout, "quantization");
        for (int i = 0; i < 4; i++) cli_stats_row(stdout, qn[i], &qstats[i]);
        cli_stats_note(stdout);
        args.stats = NULL;
    }
    double best = INFINITY;
    for (int64_t it = 0; it < repeat; it++) {
        double t0 = cli_now();
        mxfp8_status st = mxfp8_matmul_backward(&args, &vdx, &vdw);
        double t = cli_now() - t0;
        if (st != MXFP8_OK) {
            cli_lib_error(cmd, "mxfp8_matmul_backward", st);
            goto done;
        }
        if (t < best) best = t;
    }
    double flops = 4.0 * (double)M * (double)N * (double)K;

    int fail = 0;
    if (check) {
        /* Goldens: dX = dY @ W (a = dY [M, N], b = W^T [K, N]); dW = dY^T @ X (a = dY^T [N, M], b = X^T [K, M]). */
        size_t esz = tf_dtype_size(dy->dtype);
        int64_t s_wt[2] = {K, N}, s_dyt[2] = {N, M}, s_xt[2] = {K, M};
        tf_tensor *wt = tf_add_new(&work, "wt", w->dtype, 2, s_wt, err, sizeof err);
        tf_tensor *dyt = wt ? tf_add_new(&work, "dyt", dy->dtype, 2, s_dyt, err, sizeof err) : NULL;
        tf_tensor *xt = dyt ? tf_add_new(&work, "xt", x->dtype, 2, s_xt, err, sizeof err) : NULL;
        tf_tensor *gx = xt ? tf_add_new(&work, "gx", TF_F32, 2, s_dx, err, sizeof err) : NULL;
        tf_tensor *gw = gx ? tf_add_new(&work, "gw", TF_F32, 2, s_dw, err, sizeof err) : NULL;
        tf_tensor *qx = gw ? tf_add_new(&work, "qx", TF_F64, 2, s_dx, err, sizeof err) : NULL;
        tf_tensor *qw = qx ? tf_add_new(&work, "qw", TF_F64, 2, s_dw, err, sizeof err) : NULL;
        if (!qw) {
            cli_error(cmd, "%s", err);
            goto done;
        }
        transpose_copy(w->data, wt->data, N, K, tf_dtype_size(w->dtype));
        transpose_copy(dy->data, dyt->data, M, N, esz);
        transpose_copy(x->data, xt->data, M, K, tf_dtype_size(x->dtype));
        mxfp8_tensor vdy = tf_view(dy), vwt = tf_view(wt), vdyt = tf_view(dyt), vxt = tf_view(xt);
        mxfp8_tensor vgx = tf_view(gx), vgw = tf_view(gw), vqx = tf_view(qx), vqw = tf_view(qw);
        mxfp8_quant_params qp = mxfp8_quant_params_default();
        qp.fmt = args.float8_dtype;
        qp.rule = args.scale_rule;
        qp.group = args.quant_scheme;
        mxfp8_status st;
        if ((st = mxfp8_gemm_golden_unquantized(&vdy, &vwt, 0, &vgx)) ||
            (st = mxfp8_gemm_golden_unquantized(&vdyt, &vxt, 0, &vgw)) ||
            (st = mxfp8_gemm_golden_quantized(&vdy, &vwt, &qp, &vqx)) ||
            (st = mxfp8_gemm_golden_quantized(&vdyt, &vxt, &qp, &vqw))) {
            cli_lib_error(cmd, "golden reference", st);
            goto done;
        }
        grad_check gc[2];
        mxfp8_tensor *kern[2] = {&vdx, &vdw}, *gold[2] = {&vgx, &vgw}, *qref[2] = {&vqx, &vqw};
        for (int i = 0; i < 2; i++) {
            if ((st = mxfp8_compare(kern[i], gold[i], MM_ATOL_FRAC, MM_RTOL, &gc[i].vs_golden)) ||
                (st = mxfp8_compare(kern[i], qref[i], 0.0, 0.0, &gc[i].vs_quant))) {
                cli_lib_error(cmd, "mxfp8_compare", st);
                goto done;
            }
        }
        static const char *const names[2] = {"input_grad", "weight_grad"};
        int64_t *shapes[2] = {s_dx, s_dw};
        printf("\n%-26s %-48s %s\n", "", "NKI pass criteria vs unquantized golden", "vs quantized FP64 ref");
        printf("%-12s %-13s %-10s %-18s %-20s %-11s %s\n", "gradient", "shape", "allclose", "cosine (>= 0.995)",
               "norm-eucl (<= 0.10)", "max |err|", "max rel err");
        for (int i = 0; i < 2; i++) {
            const mxfp8_compare_result *g = &gc[i].vs_golden, *q = &gc[i].vs_quant;
            char cs[32], ns[32];
            snprintf(cs, sizeof cs, "%.6f %s", g->cosine, g->cosine >= MM_COSINE_MIN ? "PASS" : "FAIL");
            snprintf(ns, sizeof ns, "%.5f %s", g->norm_euclid, g->norm_euclid <= MM_NORM_EUCLID_MAX ? "PASS" : "FAIL");
            printf("%-12s %-13s %-10s %-18s %-20s %-11.3e %.3e\n", names[i], tf_shape_str(2, shapes[i], sb, sizeof sb),
                   g->allclose ? "PASS" : "FAIL", cs, ns, q->max_abs_err, q->max_rel_err);
            if (g->num_nan) printf("%-12s   %lld NaN values in the output\n", "", (long long)g->num_nan);
            if (!criteria_pass(g)) fail = 1;
        }
        if (args.output_grad_rounding || args.weights_rounding || args.input_rounding)
            printf("stochastic rounding: the quantized FP64 reference rounds to nearest, so its column measures the\n"
                   "difference of the roundings too\n");
        printf("allclose: atol = 0.2 x max|golden|, rtol = 1e-3.  rel err = max|k - ref| / max|ref|%s\n",
               odt == 0 ? "\n(rounding the output to BF16 alone gives up to 2^-8 = 3.91e-03 in this metric: half an ulp, "
               "2^(e-8), of an element near max|ref| >= 2^e)" : "");
    }
    printf("\ntime (dX + dW, best of %lld after a warm-up): %.3f ms   %.4g TFLOP/s   (%.3g GFLOP)\n", (long long)repeat, best * 1e3,
           best > 0 ? flops / best * 1e-12 : 0.0, flops * 1e-9);
    if (out_path) {
        if (tf_save(out_path, &grads, err, sizeof err)) {
            cli_error(cmd, "%s", err);
            goto done;
        }
        printf("wrote input_grad, weight_grad to %s\n", out_path);
    }
    if (check)
        printf("verdict: %s\n", fail ? "FAIL -- a NKI pass criterion does not hold (see the table)"
                                      : "PASS -- input_grad and weight_grad meet every NKI pass criterion");
    rc = fail ? CLI_FAIL : CLI_OK;
done:
    tf_free(&in);
    tf_free(&grads);
    tf_free(&work);
    return rc;
}
