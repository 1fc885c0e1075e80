/*
 * cmd_matmul.c -- `mxfp8 matmul-bwd`: matmul_mxfp8_backward (NKI matmul_mxfp8_backward) on a bundle or on the
 * upstream test problem, checked against the golden references.
 *
 * dX [M, K] = dY [M, N] @ W [N, K] and dW [N, K] = dY^T [N, M] @ X [M, K]. Goldens (library functions): the
 * unquantized one (FP32 accumulation of the given operands) and the quantized FP64 one (both operands quantized
 * along the contraction axis with the same format/rule/groups, dequantized exactly, accumulated in double).
 *
 * The verdict (check.h): each element of each gradient against the quantized FP64 reference q, allowed
 *   |k - q| <= u |q| + (1 + u) (gamma_n ||a_i|| ||b_j|| + n 2^-149) + eta + 2 n 2^-53 ||a_i|| ||b_j||
 * with n the contraction length, a_i and b_j the dequantized MXFP8 row of A and column of B, u and eta the
 * rounding of the output dtype (half an ulp; half its smallest subnormal), gamma_n = n 2^-24 / (1 - n 2^-24). Why:
 * the kernel computes each element as one FP32 FMA chain over exactly dequantized operands, so its error against
 * the exact sum is at most gamma_n sum_k |a_ik b_kj| (Higham, Lemma 3.1; plus n 2^-149 for sums in FP32's
 * subnormal range), sum_k |a_ik b_kj| <= ||a_i|| ||b_j|| (Cauchy-Schwarz), and rounding to the output adds u |.| or
 * eta; the reference's own FP64 error is the last term. A kernel within this bound adds nothing MXFP8 does not.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cli.h"
#include "io/tensorfile.h"
#include "memcheck.h"
#include "progress.h"

static const cli_nki_criteria k_crit = {0.2, 1e-3, 0.995, 0.10, "allclose: atol = 0.2 x max|golden|, rtol = 1e-3"};

static void help(void) {
    mxfp8_matmul_bwd_args d;
    mxfp8_matmul_bwd_args_init(&d);
    printf(
        "usage: mxfp8 matmul-bwd [--M M --N N --K K] [--inputs BUNDLE.safetensors] [--output GRADS.safetensors]\n"
        "                        [--float8-dtype %s] [--scale-rule %s]\n"
        "                        [--group %s] [--output-dtype bf16|f16|f32] [--threads N] [--seed S]\n"
        "                        [--repeat R] [--no-check] [--quiet] [--stats] [--stochastic-rounding L]\n"
        "                        [--rounding-seed S] [--scale-layout L] [--save-inputs BUNDLE.safetensors]\n\n"
        "Backward of a linear layer Y = X @ W^T in MXFP8 (NKI matmul_mxfp8_backward):\n"
        "  input_grad  dX [M, K] = dY [M, N] @ W [N, K]      (dY and W quantized along N)\n"
        "  weight_grad dW [N, K] = dY^T @ X [M, K]          (dY and X quantized along M)\n"
        "then checks both gradients:\n"
        "  verdict (exit status 1 when it fails): every element against the quantized FP64 reference (the same\n"
        "    MXFP8 operands, exact arithmetic) within what FP32 accumulation and the output's rounding allow;\n"
        "  information: the NKI pass criteria against the unquantized golden (allclose(atol = 0.2*max|golden|,\n"
        "    rtol = 1e-3), cosine similarity >= 0.995, ||k - g|| / (||k|| + ||g||) <= 0.10), beside the same\n"
        "    criteria of the quantized reference: MXFP8's own error;\n"
        "and prints the time and TFLOP/s.\n\n"
        "  --M, --N, --K N     problem size without --inputs (default 512 512 512, the first upstream shape)\n"
        "  --inputs FILE       .safetensors bundle: output_grad [M, N], weights [N, K], input_activation [M, K]\n"
        "                      (F32, BF16 or F16), optionally pre-quantized: FP8 codes plus output_grad_scales,\n"
        "                      weight_scales, input_scales (layout: --scale-layout); no other names\n"
        "  --output FILE       write input_grad and weight_grad to a .safetensors file\n"
        "  --float8-dtype D    %s; the default is the NKI page's\n"
        "  --scale-rule R      %s\n"
        "  --group G           quantization groups: %s (%s needs M, N %% 128 == 0)\n"
        "  --scale-layout L    layout of pre-quantized scales: %s\n"
        "  --output-dtype D    bf16 (default), f16 or f32\n"
        "  --threads N         threads (default: MXFP8_NUM_THREADS, OMP_NUM_THREADS, else all cores)\n"
        "  --seed S            seed of the random problem (default 42); data ~ N(0, 1), rounded to BF16\n"
        "  --repeat R          run the backward R times after one untimed warm-up call and report the best time\n"
        "                      (default 3)\n"
        "  --no-check          skip the golden references (just compute and write)\n"
        "  --no-memory-check   run even when the memory the problem needs (estimated before allocating) is more\n"
        "                      than the machine has available\n"
        "  --quiet             no progress line on stderr (shown only when stderr is a terminal)\n"
        "  --save-inputs FILE  write the generated problem (output_grad, weights, input_activation) to a\n"
        "                      .safetensors bundle that --inputs (or the Python API) can read back\n"
        "  --stats             print the statistics of the four quantizations (dY along N and along M, W along N,\n"
        "                      X along M): saturated, flushed-to-zero, subnormal, the scales used, the SQNR\n"
        "  --stochastic-rounding L  round the elements of dy, w and/or x (comma-separated; all, none)\n"
        "                      stochastically (Philox-4x32-10 by each element's index); the check against the\n"
        "                      quantized reference (which rounds to nearest) is then skipped\n"
        "  --rounding-seed S   the seed of stochastic rounding (default 0)\n\n"
        "exit status: 0 ok, 1 the kernel's result is wrong, 2 bad usage, bad input or IO error\n",
        cli_names(MXFP8_ENUM_FLOAT8_DTYPE, "|", -1), cli_names(MXFP8_ENUM_SCALE_RULE, "|", -1),
        cli_names(MXFP8_ENUM_GROUP_SCHEME, "|", -1), cli_names(MXFP8_ENUM_FLOAT8_DTYPE, NULL, (int)d.float8_dtype),
        cli_names(MXFP8_ENUM_SCALE_RULE, NULL, (int)d.scale_rule),
        cli_names(MXFP8_ENUM_GROUP_SCHEME, NULL, (int)d.quant_scheme),
        mxfp8_enum_name(MXFP8_ENUM_GROUP_SCHEME, MXFP8_GROUP_WRAPX),
        cli_names(MXFP8_ENUM_SCALE_LAYOUT, NULL, MXFP8_SCALES_COMPACT));
}

typedef struct mm_job {
    const char *cmd;
    int64_t M, N, K, seed, repeat;
    int odt, layout, check, quiet, prequant, in_f64, stats, allow_mem;
    const char *in_path, *out_path, *save_path, *f8;
    mxfp8_matmul_bwd_args args;
    tf_set in, grads, work;
    tf_tensor *dy, *w, *x, *dx, *dw;
    double best; /* seconds */
} mm_job;

static const char *const k_odts[] = {"bf16", "f16", "f32"};
static const tf_dtype k_odt_tf[] = {TF_BF16, TF_F16, TF_F32};

static int parse(mm_job *j, const cli_cmdline *cl) {
    const char *cmd = j->cmd;
    const int64_t DMAX = (int64_t)1 << 24;
    static const mxfp8_dtype odtv[] = {MXFP8_DTYPE_BF16, MXFP8_DTYPE_F16, MXFP8_DTYPE_F32};
    j->M = j->N = j->K = 512;
    j->seed = 42;
    j->repeat = 3;
    mxfp8_matmul_bwd_args_init(&j->args);
    j->f8 = cli_val(cl, "float8-dtype");
    if (cli_int(cmd, "M", cli_val(cl, "M"), 0, DMAX, &j->M) || cli_int(cmd, "N", cli_val(cl, "N"), 0, DMAX, &j->N) ||
        cli_int(cmd, "K", cli_val(cl, "K"), 0, DMAX, &j->K) ||
        cli_int(cmd, "seed", cli_val(cl, "seed"), 0, INT64_MAX, &j->seed) ||
        cli_int(cmd, "repeat", cli_val(cl, "repeat"), 1, 1000, &j->repeat) ||
        cli_float8_dtype(cmd, j->f8, &j->args.float8_dtype) ||
        cli_scale_rule(cmd, cli_val(cl, "scale-rule"), &j->args.scale_rule) ||
        cli_group(cmd, cli_val(cl, "group"), &j->args.quant_scheme) ||
        cli_enum(cmd, "scale-layout", cli_val(cl, "scale-layout"), MXFP8_ENUM_SCALE_LAYOUT, &j->layout) ||
        cli_choice(cmd, "output-dtype", cli_val(cl, "output-dtype"), k_odts, 3, &j->odt) ||
        cli_matmul_rounding(cmd, cli_val(cl, "stochastic-rounding"), &j->args) ||
        cli_seed64(cmd, "rounding-seed", cli_val(cl, "rounding-seed"), &j->args.rounding_seed))
        return CLI_USAGE;
    j->args.output_dtype = odtv[j->odt];
    j->args.scale_layout = (mxfp8_scale_layout)j->layout;
    j->args.use_scale_packing = j->layout == MXFP8_SCALES_NKI_PACKED;
    j->in_path = cli_val(cl, "inputs");
    j->out_path = cli_val(cl, "output");
    j->save_path = cli_val(cl, "save-inputs");
    j->check = cli_val(cl, "no-check") == NULL && !j->args.output_grad_rounding && !j->args.weights_rounding &&
               !j->args.input_rounding; /* the references round to nearest */
    j->stats = cli_val(cl, "stats") != NULL;
    j->quiet = cli_val(cl, "quiet") != NULL;
    j->allow_mem = cli_val(cl, "no-memory-check") != NULL;
    char err[TF_ERR_LEN];
    if (j->save_path && j->in_path) return cli_error(cmd, "--save-inputs is for the generated problem, not --inputs");
    if (j->save_path && tf_check_writable(j->save_path, 3, err, sizeof err)) return cli_error(cmd, "%s", err);
    if (j->in_path && (cli_val(cl, "M") || cli_val(cl, "N") || cli_val(cl, "K")))
        return cli_error(cmd, "--M/--N/--K set the random problem's size; with --inputs the bundle's shapes decide");
    if (cli_not_input(cmd, "output", j->out_path, j->in_path)) return CLI_USAGE;
    if (j->out_path && tf_check_writable(j->out_path, 2, err, sizeof err)) return cli_error(cmd, "%s", err);
    return CLI_OK;
}

/* One operand of the bundle: high precision (F64 rounded to F32), or FP8 codes with their scales. */
static int bundle_operand(mm_job *j, tf_tensor *t, const char *scale_name, mxfp8_tensor *scale_arg) {
    const char *cmd = j->cmd, *path = j->in_path;
    char err[TF_ERR_LEN], sb[160];
    tf_tensor *s = tf_find(&j->in, scale_name);
    if (t->dtype == TF_F64 && tf_to_f32(t, err, sizeof err)) return cli_error(cmd, "%s", err);
    if (t->ndim != 2)
        return cli_error(cmd, "%s: '%s' must be 2-D, got %s", path, t->name, tf_shape_str(t->ndim, t->shape, sb, 160));
    if (s) {
        if (t->dtype != TF_F8_E4M3 && t->dtype != TF_F8_E5M2 && t->dtype != TF_U8 && t->dtype != TF_U32)
            return cli_error(cmd, "%s: '%s' has scales '%s' but dtype %s: pre-quantized operands hold FP8 codes", path,
                             t->name, scale_name, tf_dtype_name(t->dtype));
        if (!j->f8 && (t->dtype == TF_F8_E4M3 || t->dtype == TF_F8_E5M2))
            j->args.float8_dtype = t->dtype == TF_F8_E4M3 ? MXFP8_FMT_E4M3 : MXFP8_FMT_E5M2;
        *scale_arg = tf_view(s);
        j->prequant = 1;
    } else if (t->dtype != TF_F32 && t->dtype != TF_BF16 && t->dtype != TF_F16) {
        return cli_error(cmd, "%s: '%s' has dtype %s; F32, BF16 or F16 is needed (or FP8 codes with '%s')", path,
                         t->name, tf_dtype_name(t->dtype), scale_name);
    }
    return CLI_OK;
}

static int load_bundle(mm_job *j) {
    const char *cmd = j->cmd, *path = j->in_path;
    static const char *const names[6] = {"output_grad", "weights", "input_activation",
                                         "output_grad_scales", "weight_scales", "input_scales"};
    char err[TF_ERR_LEN];
    if (tf_load(path, &j->in, err, sizeof err) || tf_check_names(&j->in, path, names, 6, err, sizeof err))
        return cli_error(cmd, "%s", err);
    for (int i = 0; i < 3; i++)
        if (!tf_find(&j->in, names[i]))
            return cli_error(cmd, "%s: the bundle has no tensor '%s' (needs output_grad, weights, input_activation)",
                             path, names[i]);
    j->dy = tf_find(&j->in, "output_grad");
    j->w = tf_find(&j->in, "weights");
    j->x = tf_find(&j->in, "input_activation");
    j->in_f64 = j->dy->dtype == TF_F64;
    if (bundle_operand(j, j->dy, names[3], &j->args.output_grad_scales) ||
        bundle_operand(j, j->w, names[4], &j->args.weight_scales) ||
        bundle_operand(j, j->x, names[5], &j->args.input_scales))
        return CLI_USAGE;
    /* Sizes from the high-precision shapes: dY [M, N], X [M, K], W [N, K]. */
    j->M = j->dy->shape[0];
    j->N = j->dy->shape[1];
    j->K = j->x->shape[1];
    if (j->w->shape[0] != j->N || j->w->shape[1] != j->K || j->x->shape[0] != j->M) {
        char s1[64], s2[64], s3[64];
        return cli_error(cmd, "%s: shapes do not match: output_grad %s [M, N], weights %s [N, K], input_activation "
                         "%s [M, K]", path, tf_shape_str(2, j->dy->shape, s1, 64), tf_shape_str(2, j->w->shape, s2, 64),
                         tf_shape_str(2, j->x->shape, s3, 64));
    }
    if (j->prequant && j->check) {
        fprintf(stderr, "mxfp8 matmul-bwd: note: pre-quantized operands: skipping the golden checks\n");
        j->check = 0;
    }
    return CLI_OK;
}

static int make_problem(mm_job *j) {
    char err[TF_ERR_LEN];
    cli_rng r;
    cli_rng_seed(&r, (uint64_t)j->seed);
    int64_t s_dy[2] = {j->M, j->N}, s_w[2] = {j->N, j->K}, s_x[2] = {j->M, j->K};
    if (!(j->dy = tf_add_new(&j->in, "output_grad", TF_BF16, 2, s_dy, err, sizeof err)) ||
        !(j->w = tf_add_new(&j->in, "weights", TF_BF16, 2, s_w, err, sizeof err)) ||
        !(j->x = tf_add_new(&j->in, "input_activation", TF_BF16, 2, s_x, err, sizeof err)))
        return cli_error(j->cmd, "%s", err);
    tf_tensor *t[3] = {j->dy, j->w, j->x};
    for (int k = 0; k < 3; k++) {
        uint16_t *p = t[k]->data;
        for (int64_t i = 0; i < t[k]->numel; i++) p[i] = mxfp8_fp32_to_bf16((float)cli_rng_normal(&r));
    }
    if (j->save_path) {
        if (tf_save(j->save_path, &j->in, err, sizeof err)) return cli_error(j->cmd, "%s", err);
        printf("wrote the problem (output_grad, weights, input_activation) to %s\n", j->save_path);
    }
    return CLI_OK;
}

/* The memory the run needs beyond what is loaded (the random problem's inputs when !loaded), estimated from the
 * sizes before anything large is allocated: the gradients, the library's scratch (include/mxfp8.h, Workspace and
 * memory: the larger GEMM's FP32 B panels and per-thread blocks), and with the check the references' copies (the
 * transposed operands, FP32 and FP64 goldens, the quantized golden's FP64 operands, the operand norms' scratch). */
static int memory_check(const mm_job *j, int loaded) {
    const double M = (double)j->M, N = (double)j->N, K = (double)j->K, MN = M * N, NK = N * K, MK = M * K;
    const double in_es = loaded ? (double)tf_dtype_size(j->dy->dtype) : 2.0, out_es = j->odt == 2 ? 4.0 : 2.0;
    mxfp8_info info;
    mxfp8_get_info(&info);
    const double P = info.num_threads > 0 ? info.num_threads : 1;
    double need = (loaded ? 0.0 : 2.0 * (MN + NK + MK)) + out_es * (MK + NK) +
                  4.0 * (M > N ? M : N) * (K + 32) + P * (4.0 * K * 592 + 4.0 * 512 * 528) + 65536.0;
    double chk = 0;
    if (j->check) {
        const double big = MN > NK ? (MN > MK ? MN : MK) : (NK > MK ? NK : MK);
        chk = in_es * (MN + NK + MK) + 12.0 * (MK + NK) + 8.0 * (MN + (NK > MK ? NK : MK)) + 5.0 * big;
    }
    return cli_mem_check(j->cmd, need + chk, chk, j->allow_mem);
}

/* One untimed warm-up call (thread start-up and first touch would otherwise dominate a single timed run), then
 * `repeat` timed calls; the best time. */
static int run_kernel(mm_job *j) {
    mxfp8_tensor vdx = tf_view(j->dx), vdw = tf_view(j->dw);
    j->best = INFINITY;
    mxfp8_quant_stats qst[4];
    if (j->stats) j->args.stats = qst; /* --stats: the warm-up call only (the timed calls run without) */
    for (int64_t it = -1; it < j->repeat; it++) {
        cli_progress_next();
        double t0 = cli_now();
        mxfp8_status st = mxfp8_matmul_backward(&j->args, &vdx, &vdw);
        double t = cli_now() - t0;
        if (j->args.stats && !st) cli_matmul_stats_table(stdout, qst);
        j->args.stats = NULL;
        if (st != MXFP8_OK) return cli_lib_error(j->cmd, "mxfp8_matmul_backward", st);
        if (it >= 0 && t < j->best) j->best = t;
    }
    cli_test_corrupt(j->dx);
    cli_test_corrupt(j->dw);
    return CLI_OK;
}

/* dst [cols, rows] = src [rows, cols]^T, element size esz. */
static void transpose_copy(const void *src, void *dst, int64_t rows, int64_t cols, size_t esz) {
    const char *s = src;
    char *d = dst;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t k = 0; k < cols; k++) memcpy(d + ((size_t)k * rows + i) * esz, s + ((size_t)i * cols + k) * esz, esz);
}

/* The 2-norms of the exactly dequantized MXFP8 operand t [R, C] quantized along `axis` (the contraction axis): one
 * per row (axis 1) or per column (axis 0). */
static int operand_norms(mm_job *j, const tf_tensor *t, int axis, double *norms) {
    int64_t R = t->shape[0], C = t->shape[1], sshape[2] = {R, C};
    sshape[axis] = (sshape[axis] + 31) / 32;
    char err[TF_ERR_LEN];
    tf_set tmp = {0};
    tf_tensor *codes = tf_add_new(&tmp, "codes", j->args.float8_dtype == MXFP8_FMT_E4M3 ? TF_F8_E4M3 : TF_F8_E5M2, 2,
                                  t->shape, err, sizeof err);
    tf_tensor *sc = codes ? tf_add_new(&tmp, "scales", TF_U8, 2, sshape, err, sizeof err) : NULL;
    tf_tensor *deq = sc ? tf_add_new(&tmp, "deq", TF_F32, 2, t->shape, err, sizeof err) : NULL;
    if (!deq) {
        tf_free(&tmp);
        return cli_error(j->cmd, "%s", err);
    }
    mxfp8_quant_params qp = mxfp8_quant_params_default();
    qp.fmt = j->args.float8_dtype;
    qp.rule = j->args.scale_rule;
    qp.group = j->args.quant_scheme;
    mxfp8_tensor vt = tf_view(t), vc = tf_view(codes), vs = tf_view(sc), vd = tf_view(deq);
    mxfp8_status st = mxfp8_quantize(&vt, axis, &qp, &vc, &vs);
    if (st == MXFP8_OK) st = mxfp8_dequantize(&vc, &vs, axis, qp.group, &vd);
    if (st != MXFP8_OK) {
        tf_free(&tmp);
        return cli_lib_error(j->cmd, "mxfp8_quantize", st);
    }
    const float *v = deq->data;
    int64_t n = axis == 1 ? R : C;
    for (int64_t i = 0; i < n; i++) norms[i] = 0;
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) norms[axis == 1 ? r : c] += (double)v[r * C + c] * v[r * C + c];
    for (int64_t i = 0; i < n; i++) norms[i] = sqrt(norms[i]);
    tf_free(&tmp);
    return CLI_OK;
}

/* The allowed error of the [rows, cols] gradient g with contraction length n (see the top of this file). */
static cli_bound bound_of(const tf_tensor *g, int64_t n, const double *rn, const double *cn) {
    double u = cli_unit_roundoff(g->dtype);
    cli_bound b = {u, (1 + u) * (double)n * 0x1p-149 + cli_half_min_subnormal(g->dtype),
                   (1 + u) * (cli_gamma_fp32(n) + 2.0 * (double)n * 0x1p-53), rn, cn, g->shape[0], g->shape[1], 0};
    return b;
}

/* Goldens, the allowed errors and the comparisons of both gradients into c[2]. */
static int check(mm_job *j, cli_grad_check c[2]) {
    const char *cmd = j->cmd;
    int64_t M = j->M, N = j->N, K = j->K;
    char err[TF_ERR_LEN];
    int64_t s_wt[2] = {K, N}, s_dyt[2] = {N, M}, s_xt[2] = {K, M}, s_dx[2] = {M, K}, s_dw[2] = {N, K};
    tf_tensor *wt = tf_add_new(&j->work, "wt", j->w->dtype, 2, s_wt, err, sizeof err);
    tf_tensor *dyt = wt ? tf_add_new(&j->work, "dyt", j->dy->dtype, 2, s_dyt, err, sizeof err) : NULL;
    tf_tensor *xt = dyt ? tf_add_new(&j->work, "xt", j->x->dtype, 2, s_xt, err, sizeof err) : NULL;
    tf_tensor *gx = xt ? tf_add_new(&j->work, "gx", TF_F32, 2, s_dx, err, sizeof err) : NULL;
    tf_tensor *gw = gx ? tf_add_new(&j->work, "gw", TF_F32, 2, s_dw, err, sizeof err) : NULL;
    tf_tensor *qx = gw ? tf_add_new(&j->work, "qx", TF_F64, 2, s_dx, err, sizeof err) : NULL;
    tf_tensor *qw = qx ? tf_add_new(&j->work, "qw", TF_F64, 2, s_dw, err, sizeof err) : NULL;
    int64_t s_n[1] = {2 * M + 2 * N + 2 * K};
    tf_tensor *nrm = qw ? tf_add_new(&j->work, "norms", TF_F64, 1, s_n, err, sizeof err) : NULL;
    if (!nrm) return cli_error(cmd, "%s", err);
    transpose_copy(j->w->data, wt->data, N, K, tf_dtype_size(j->w->dtype));
    transpose_copy(j->dy->data, dyt->data, M, N, tf_dtype_size(j->dy->dtype));
    transpose_copy(j->x->data, xt->data, M, K, tf_dtype_size(j->x->dtype));
    /* dX = dY @ W: a = dY [M, N], b = W^T [K, N]; dW = dY^T @ X: a = dY^T [N, M], b = X^T [K, M]. */
    mxfp8_tensor vdy = tf_view(j->dy), vwt = tf_view(wt), vdyt = tf_view(dyt), vxt = tf_view(xt);
    mxfp8_tensor vgx = tf_view(gx), vgw = tf_view(gw), vqx = tf_view(qx), vqw = tf_view(qw);
    mxfp8_quant_params qp = mxfp8_quant_params_default();
    qp.fmt = j->args.float8_dtype;
    qp.rule = j->args.scale_rule;
    qp.group = j->args.quant_scheme;
    mxfp8_status st;
    cli_progress_next();
    if ((st = mxfp8_gemm_golden_unquantized(&vdy, &vwt, 0, &vgx)) ||
        (st = mxfp8_gemm_golden_unquantized(&vdyt, &vxt, 0, &vgw)))
        return cli_lib_error(cmd, "mxfp8_gemm_golden_unquantized", st);
    cli_progress_next();
    if ((st = mxfp8_gemm_golden_quantized(&vdy, &vwt, &qp, &vqx)) ||
        (st = mxfp8_gemm_golden_quantized(&vdyt, &vxt, &qp, &vqw)))
        return cli_lib_error(cmd, "mxfp8_gemm_golden_quantized", st);
    cli_progress_next();
    /* norms: ||dYq[i, :]|| (M), ||Wq[:, k]|| along N (K); ||dYq[:, n]|| along M (N), ||Xq[:, k]|| along M (K) */
    double *n_dy_row = nrm->data, *n_w_col = n_dy_row + M, *n_dy_col = n_w_col + K, *n_x_col = n_dy_col + N;
    if (operand_norms(j, j->dy, 1, n_dy_row) || operand_norms(j, j->w, 0, n_w_col) ||
        operand_norms(j, j->dy, 0, n_dy_col) || operand_norms(j, j->x, 0, n_x_col))
        return CLI_USAGE;
    cli_bound bx = bound_of(j->dx, N, n_dy_row, n_w_col), bw = bound_of(j->dw, M, n_dy_col, n_x_col);
    if (cli_grad_compare(cmd, "input_grad", j->dx, gx, qx, &k_crit, &c[0]) ||
        cli_grad_compare(cmd, "weight_grad", j->dw, gw, qw, &k_crit, &c[1]))
        return CLI_USAGE;
    c[0].ratio = cli_bound_ratio(j->dx, qx->data, &bx, &c[0].norm_err);
    c[1].ratio = cli_bound_ratio(j->dw, qw->data, &bw, &c[1].norm_err);
    return CLI_OK;
}

/* The explanation printed under the verdict's table. */
static void bound_text(const mm_job *j, char *buf, size_t len) {
    tf_dtype dt = k_odt_tf[j->odt];
    double u = cli_unit_roundoff(dt);
    const char *ue = dt == TF_BF16 ? "2^-8" : dt == TF_F16 ? "2^-11" : "2^-24";
    snprintf(buf, len,
             "allowed: |k - ref| <= u |ref| + gamma_n ||a_i|| ||b_j|| for each element (i, j);\n"
             "  u = %s = %.2e, half an ulp of the %s output (its rounding); gamma_n = n 2^-24 / (1 - n 2^-24) with n\n"
             "  the contraction length (N = %lld for input_grad, M = %lld for weight_grad): an FP32 chain of n\n"
             "  products errs by at most gamma_n sum |a_ik b_kj| <= gamma_n ||a_i|| ||b_j||, a_i and b_j the\n"
             "  dequantized MXFP8 row and column%s", ue, u, k_odts[j->odt], (long long)j->N, (long long)j->M,
             dt == TF_BF16 ? ".\nrel err = max|k - ref| / max|ref|: rounding the output to BF16 alone gives up to "
                             "2^-8 = 3.91e-03 in this metric\n  (half an ulp, 2^(e-8), of an element near max|ref| >= "
                             "2^e)" : "");
}


static void header(const mm_job *j) {
    mxfp8_info info;
    mxfp8_get_info(&info);
    printf("mxfp8 matmul-bwd  M=%lld N=%lld K=%lld  %s  scale rule %s  groups %s  output %s  %d thread%s (%s)\n",
           (long long)j->M, (long long)j->N, (long long)j->K,
           mxfp8_enum_name(MXFP8_ENUM_FLOAT8_DTYPE, j->args.float8_dtype),
           mxfp8_enum_name(MXFP8_ENUM_SCALE_RULE, j->args.scale_rule),
           mxfp8_enum_name(MXFP8_ENUM_GROUP_SCHEME, j->args.quant_scheme), k_odts[j->odt], info.num_threads,
           info.num_threads == 1 ? "" : "s", info.isa_name);
    if (j->in_path)
        printf("inputs: %s (%s%s)\n", j->in_path,
               j->prequant ? "pre-quantized" : j->in_f64 ? "F64" : tf_dtype_name(j->dy->dtype),
               !j->prequant && j->in_f64 ? ", rounded to F32" : "");
    else printf("inputs: random N(0, 1) rounded to BF16, seed %lld\n", (long long)j->seed);
    fflush(stdout);
}

/* The phases of the run, for the progress line. */
static void plan(const mm_job *j) {
    double mnk = (double)j->M * (double)j->N * (double)j->K;
    cli_progress_add("backward, warm-up", CLI_WORK_KERNEL, 4 * mnk);
    for (int64_t i = 0; i < j->repeat; i++) cli_progress_add("backward, timed", CLI_WORK_KERNEL, 4 * mnk);
    if (!j->check) return;
    cli_progress_add("golden references, unquantized; --no-check skips them", CLI_WORK_GOLDEN, 4 * mnk);
    cli_progress_add("golden references, quantized FP64; --no-check skips them", CLI_WORK_GOLDEN, 4 * mnk);
    cli_progress_add("allowed errors", CLI_WORK_KERNEL, 8.0 * (double)(j->M * j->N + j->N * j->K + j->M * j->K));
}

int cmd_matmul_bwd(int argc, char **argv) {
    mm_job j;
    memset(&j, 0, sizeof j);
    j.cmd = "matmul-bwd";
    cli_opt opts[] = {{"M", 0, 0, NULL},          {"N", 0, 0, NULL},            {"K", 0, 0, NULL},
                      {"inputs", 'i', 0, NULL},   {"output", 'o', 0, NULL},     {"float8-dtype", 0, 0, NULL},
                      {"scale-rule", 0, 0, NULL}, {"group", 0, 0, NULL},        {"scale-layout", 0, 0, NULL},
                      {"output-dtype", 0, 0, NULL}, {"threads", 0, 0, NULL},    {"seed", 0, 0, NULL},
                      {"repeat", 0, 0, NULL},     {"no-check", 0, 1, NULL},     {"quiet", 'q', 1, NULL},
                      {"save-inputs", 0, 0, NULL}, {"stats", 0, 1, NULL},      {"stochastic-rounding", 0, 0, NULL},
                      {"rounding-seed", 0, 0, NULL}, {"no-memory-check", 0, 1, NULL}};
    cli_cmdline cl;
    int rc = cli_begin(&cl, j.cmd, argc, argv, opts, CLI_COUNT(opts), 0, help);
    if (rc != CLI_CONTINUE || (rc = parse(&j, &cl))) return rc;
    rc = CLI_USAGE;
    char err[TF_ERR_LEN];
    cli_progress_init(j.cmd, !j.quiet);
    if (j.in_path ? load_bundle(&j) || memory_check(&j, 1) : memory_check(&j, 0) || make_problem(&j)) goto done;
    int64_t s_dx[2] = {j.M, j.K}, s_dw[2] = {j.N, j.K};
    if (!(j.dx = tf_add_new(&j.grads, "input_grad", k_odt_tf[j.odt], 2, s_dx, err, sizeof err)) ||
        !(j.dw = tf_add_new(&j.grads, "weight_grad", k_odt_tf[j.odt], 2, s_dw, err, sizeof err))) {
        cli_error(j.cmd, "%s", err);
        goto done;
    }
    j.args.output_grad = tf_view(j.dy);
    j.args.weights = tf_view(j.w);
    j.args.input_activation = tf_view(j.x);
    header(&j);
    plan(&j);
    if (run_kernel(&j)) goto done;
    cli_grad_check gc[2];
    if (j.check && check(&j, gc)) goto done;
    cli_progress_done();
    double flops = 4.0 * (double)j.M * (double)j.N * (double)j.K;
    printf("\ntime (dX + dW, best of %lld after a warm-up): %.3f ms   %.4g TFLOP/s   (%.3g GFLOP)\n",
           (long long)j.repeat, j.best * 1e3, j.best > 0 ? flops / j.best * 1e-12 : 0.0, flops * 1e-9);
    if (j.out_path) {
        if (tf_save(j.out_path, &j.grads, err, sizeof err)) {
            cli_error(j.cmd, "%s", err);
            goto done;
        }
        printf("wrote input_grad, weight_grad to %s\n", j.out_path);
    }
    rc = CLI_OK;
    if (j.check) {
        char bt[1024];
        bound_text(&j, bt, sizeof bt);
        rc = cli_print_verdict(gc, 2, &k_crit, bt);
        cli_golden_hint(j.cmd, j.quiet);
    }
done:
    cli_progress_done();
    tf_free(&j.in);
    tf_free(&j.grads);
    tf_free(&j.work);
    return rc;
}
