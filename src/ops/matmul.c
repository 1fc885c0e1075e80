/*
 * matmul.c -- public block-scaled GEMM and matmul_mxfp8 forward/backward [NKI-M].
 *
 * Forward  Y[M, N]  = X[M, K] @ W[N, K]^T            (both quantized along K)
 * dgrad    dX[M, K] = dY[M, N] @ W[N, K]              (dY, W quantized along N; W viewed as the [K, N] operand)
 * wgrad    dW[N, K] = dY[M, N]^T @ X[M, K]            (dY, X quantized along M; both viewed transposed)
 * dY is quantized twice, along N and along M, each time from its high-precision values (or, when given pre-quantized
 * along N, from its exact dequantized values). Every knob of the phase configs is speed-only (see src/gemm/).
 * Validation happens completely before the first output store.
 */
#include <stdio.h>
#include <stdlib.h>

#include "../gemm/gemm.h"
#include "../runtime/enums.h"
#include "../runtime/threads.h"
#include "../runtime/workspace.h"
#include "opstats.h"

/* A 2-D output view must address M*N distinct elements (threads write disjoint elements). */
static mxfp8_status check_injective(const char *fn, const char *name, const mxfp8_tensor *t) {
    int64_t n0 = t->shape[0], n1 = t->shape[1];
    int64_t a0 = t->strides[0] < 0 ? -t->strides[0] : t->strides[0];
    int64_t a1 = t->strides[1] < 0 ? -t->strides[1] : t->strides[1];
    if (n0 == 0 || n1 == 0) return MXFP8_OK;
    if (n0 <= 1 || n1 <= 1) {
        MXFP8I_RETURN_ERROR_IF((n0 > 1 && a0 == 0) || (n1 > 1 && a1 == 0), MXFP8_ERR_BAD_STRIDES,
                               "%s: %s has a zero stride, so elements overlap", fn, name);
        return MXFP8_OK;
    }
    int ok = (a1 >= 1 && a0 >= a1 * n1) || (a0 >= 1 && a1 >= a0 * n0);
    MXFP8I_RETURN_ERROR_IF(!ok, MXFP8_ERR_BAD_STRIDES,
                           "%s: %s strides [%lld, %lld] make elements of shape [%lld, %lld] overlap", fn, name,
                           (long long)t->strides[0], (long long)t->strides[1], (long long)n0, (long long)n1);
    return MXFP8_OK;
}

static mxfp8_status check_out_alias(const char *fn, const char *oname, const mxfp8_tensor *out, const char *iname,
                                    const mxfp8_tensor *in) {
    if (!in || !in->data) return MXFP8_OK;
    return mxfp8i_check_no_alias(fn, oname, out, iname, in);
}

static mxfp8_status check_output(const char *fn, const char *name, const mxfp8_tensor *c, int64_t M, int64_t N,
                                 int need_f32) {
    MXFP8I_RETURN_ERROR_IF(!c, MXFP8_ERR_NULL_POINTER, "%s: %s is NULL", fn, name);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_rank(fn, name, c, 2));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_dtype(fn, name, c, 3, MXFP8_DTYPE_F32, MXFP8_DTYPE_BF16, MXFP8_DTYPE_F16));
    MXFP8I_RETURN_ERROR_IF(need_f32 && c->dtype != MXFP8_DTYPE_F32, MXFP8_ERR_DTYPE,
                           "%s: accumulate needs an f32 %s, got %s", fn, name, mxfp8_dtype_name(c->dtype));
    MXFP8I_RETURN_ERROR_IF(c->shape[0] != M || c->shape[1] != N, MXFP8_ERR_SHAPE_MISMATCH,
                           "%s: %s has shape [%lld, %lld], expected [%lld, %lld]", fn, name, (long long)c->shape[0],
                           (long long)c->shape[1], (long long)M, (long long)N);
    return check_injective(fn, name, c);
}

static mxfp8_status check_dims(const char *fn, const char *name, const mxfp8_matmul_config *c, int64_t M, int64_t K,
                               int64_t N) {
    MXFP8I_RETURN_ERROR_IF((c->M && c->M != M) || (c->K && c->K != K) || (c->N && c->N != N), MXFP8_ERR_SHAPE_MISMATCH,
                           "%s: %s (M, K, N) = (%lld, %lld, %lld) disagrees with the tensors' (%lld, %lld, %lld)", fn,
                           name, (long long)c->M, (long long)c->K, (long long)c->N, (long long)M, (long long)K,
                           (long long)N);
    return MXFP8_OK;
}

/* The element rounding of an operand quantized on the fly (logical index r*K + k). */
static mxfp8_status operand_rounding(const char *fn, const char *name, const mxfp8_operand *op, mxfp8i_gop *g) {
    char param[96];
    snprintf(param, sizeof param, "%s.rounding", name);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_enum(fn, param, MXFP8_ENUM_ROUNDING, (int)op->rounding));
    g->sr = mxfp8i_sround_make(op->rounding == MXFP8_ROUND_STOCHASTIC, op->seed, op->stream, 0, g->K, 1);
    return MXFP8_OK;
}

/* The statistics of a call's `n` quantizations: quantization i asks for them when out[i] is not NULL, and its
 * operand's descriptor then carries the request (gop.stats = &acc[i]). They are computed before the GEMM(s) (an
 * allocation failure leaves every output untouched) and exported by stats_export after they succeed. */
typedef struct op_stats {
    int n;
    mxfp8_quant_stats *out[4];
    mxfp8i_qstats acc[4];
} op_stats;
/* Quantization i's statistics request (out: the caller's, or NULL): the accumulator, or NULL. */
static mxfp8i_qstats *stats_request(op_stats *s, int i, mxfp8_quant_stats *out) {
    s->out[i] = out;
    mxfp8i_qstats_zero(&s->acc[i]);
    return out ? &s->acc[i] : NULL;
}
static mxfp8_status stats_collect(const char *fn, const mxfp8i_gop *const *ops, int n) {
    for (int i = 0; i < n; i++) {
        mxfp8_status st = mxfp8i_gop_stats(ops[i], mxfp8i_num_threads());
        MXFP8I_RETURN_ERROR_IF(st, st, "%s: out of memory for the statistics pass", fn);
    }
    return MXFP8_OK;
}
static void stats_export(const op_stats *s) {
    for (int i = 0; i < s->n; i++)
        if (s->out[i]) mxfp8i_qstats_export(&s->acc[i], s->out[i]);
}

/* A validated GEMM call: its config (the driver reads its speed knobs only) and its operands, each with the recipe
 * resolved from the config, its rounding and its statistics request (into os). */
typedef struct gemm_job {
    const char *fn;
    mxfp8_matmul_config cfg;
    mxfp8i_gop ga, gb;
    int stats; /* an operand's statistics are asked for */
    op_stats os;
    const mxfp8_tensor *bias; /* mxfp8_linear's bias [N], or NULL */
} gemm_job;

/* Every check of mxfp8_gemm / mxfp8_matmul, before anything is written (shared by the calls and their _validate). */
static mxfp8_status gemm_validate(const char *fn, const char *na, const mxfp8_operand *a, const char *nb,
                                  const mxfp8_operand *b, const mxfp8_matmul_config *config, int accumulate,
                                  const char *nc, const mxfp8_tensor *c, gemm_job *j) {
    mxfp8_status st;
    mxfp8_matmul_config defaults;
    MXFP8I_RETURN_ERROR_IF(!a, MXFP8_ERR_NULL_POINTER, "%s: %s is NULL", fn, na);
    MXFP8I_RETURN_ERROR_IF(!b, MXFP8_ERR_NULL_POINTER, "%s: %s is NULL", fn, nb);
    MXFP8I_RETURN_ERROR_IF(!c, MXFP8_ERR_NULL_POINTER, "%s: %s is NULL", fn, nc);
    MXFP8I_RETURN_ERROR_IF(accumulate != 0 && accumulate != 1, MXFP8_ERR_INVALID_ARGUMENT,
                           "%s: accumulate %d is not 0 or 1", fn, accumulate);
    if (config) {
        MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_config(fn, "config", config));
    } else {
        mxfp8_matmul_config_init(&defaults);
        config = &defaults;
    }
    /* enable_scale_packing asserts NKI packed scales on every pre-quantized operand [NKI-M use_scale_packing]. */
    if (config->enable_scale_packing) {
        const mxfp8_operand *ops[2] = {a, b};
        const char *nms[2] = {na, nb};
        for (int i = 0; i < 2; i++)
            MXFP8I_RETURN_ERROR_IF(ops[i]->scales.data && ops[i]->scale_layout != MXFP8_SCALES_NKI_PACKED,
                                   MXFP8_ERR_INVALID_ARGUMENT,
                                   "%s: config.enable_scale_packing is set but %s's scale_layout is %d, not "
                                   "MXFP8_SCALES_NKI_PACKED (2)",
                                   fn, nms[i], (int)ops[i]->scale_layout);
    }
    /* The operands' recipe, resolved once from the (checked) config. */
    const mxfp8i_recipe rc = mxfp8i_recipe_make(config->float8_dtype, config->scale_rule, config->quant_scheme);
    /* Contraction length: config->K, else the output-independent operand that knows it. */
    int64_t hint = config->K > 0 ? config->K : -1;
    int a_x4 = a->values.dtype == MXFP8_DTYPE_U32 && !a->swizzled;
    /* a config.K that disagrees with a plain operand's K is the config's error, not the operand's */
    MXFP8I_RETURN_ERROR_IF(hint > 0 && !a_x4 && !a->swizzled && a->values.ndim == 2 && a->values.shape[1] >= 0 &&
                               a->values.shape[1] != hint,
                           MXFP8_ERR_SHAPE_MISMATCH, "%s: config.K = %lld disagrees with %s's K = %lld", fn,
                           (long long)hint, na, (long long)a->values.shape[1]);
    if (hint < 0 && a_x4) {
        MXFP8I_FORWARD_IF_ERROR(mxfp8i_gop_from_operand(fn, nb, b, -1, rc, &j->gb));
        if (!(j->gb.x4 && !j->gb.swizzled)) hint = j->gb.K;
    }
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_gop_from_operand(fn, na, a, hint, rc, &j->ga));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_gop_from_operand(fn, nb, b, j->ga.K, rc, &j->gb));
    MXFP8I_FORWARD_IF_ERROR(check_dims(fn, "config", config, j->ga.R, j->ga.K, j->gb.R));
    MXFP8I_FORWARD_IF_ERROR(check_output(fn, nc, c, j->ga.R, j->gb.R, accumulate));
    if ((st = check_out_alias(fn, nc, c, na, &a->values)) || (st = check_out_alias(fn, nc, c, na, &a->scales)) ||
        (st = check_out_alias(fn, nc, c, nb, &b->values)) || (st = check_out_alias(fn, nc, c, nb, &b->scales)))
        return st;
    MXFP8I_FORWARD_IF_ERROR(operand_rounding(fn, na, a, &j->ga));
    MXFP8I_FORWARD_IF_ERROR(operand_rounding(fn, nb, b, &j->gb));
    j->fn = fn;
    j->cfg = *config;
    j->stats = a->stats || b->stats;
    j->os.n = 2;
    j->ga.stats = stats_request(&j->os, 0, a->stats);
    j->gb.stats = stats_request(&j->os, 1, b->stats);
    j->bias = NULL;
    return MXFP8_OK;
}

/* mxfp8_linear's checks beyond mxfp8_matmul's: the bias absent (NULL or data NULL), or [N] F32/BF16/F16 elements
 * not overlapping the output. */
static mxfp8_status linear_validate(const char *fn, const mxfp8_operand *a, const mxfp8_operand *b,
                                    const mxfp8_tensor *bias, const mxfp8_matmul_config *config, const mxfp8_tensor *c,
                                    gemm_job *j) {
    MXFP8I_FORWARD_IF_ERROR(gemm_validate(fn, "input_activation", a, "weights", b, config, 0, "output", c, j));
    if (!bias || !bias->data) return MXFP8_OK;
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_bias(fn, bias, j->gb.R, "N", "weights' rows"));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_no_alias(fn, "output", c, "bias", bias));
    j->bias = bias;
    return MXFP8_OK;
}

/* mxfp8_linear's bias in FP32, contiguous: [N] floats of its workspace slot (NULL when it cannot be had). */
static float *linear_bias_buf(const gemm_job *j) {
    return (float *)mxfp8i_ws_get(MXFP8I_WS_LINEAR_BIAS, (size_t)(j->gb.R + 1) * sizeof(float));
}

/* Every buffer of the call, obtained before the first store (mxfp8i_ws_plan): the statistics pass's, the GEMM's. */
static mxfp8_status gemm_reserve_job(const void *p) {
    const gemm_job *j = (const gemm_job *)p;
    const int nt = mxfp8i_num_threads();
    MXFP8I_RETURN_ERROR_IF(j->stats && mxfp8i_gop_stats_reserve(j->ga.K, nt), MXFP8_ERR_OUT_OF_MEMORY,
                           "%s: out of memory for the statistics pass", j->fn);
    MXFP8I_RETURN_ERROR_IF(mxfp8i_gemm_reserve(j->ga.R, j->gb.R, j->ga.K, &j->cfg, nt, -1), MXFP8_ERR_OUT_OF_MEMORY,
                           "%s: out of memory for the packed operands", j->fn);
    MXFP8I_RETURN_ERROR_IF(j->bias && !linear_bias_buf(j),
                           MXFP8_ERR_OUT_OF_MEMORY, "%s: out of memory for the bias", j->fn);
    return MXFP8_OK;
}

/* A validated GEMM job run: its buffers, the statistics pass, the GEMM (with the bias, FP32, when it has one). */
static mxfp8_status gemm_run(const char *fn, gemm_job *j, int accumulate, mxfp8_tensor *c) {
    mxfp8_status st;
    const mxfp8i_gop *ops[2] = {&j->ga, &j->gb};
    mxfp8i_scope scope;
    MXFP8I_RETURN_ERROR_IF(mxfp8i_scope_begin(&scope, j->cfg.workspace), MXFP8_ERR_OUT_OF_MEMORY,
                           "%s: out of memory for the workspace", fn);
    st = mxfp8i_ws_plan(fn, gemm_reserve_job, j, NULL);
    if (!st && j->stats) st = stats_collect(fn, ops, 2);
    if (st) {
        mxfp8i_scope_end(&scope);
        return st;
    }
    float *bias = NULL;
    if (j->bias) { /* its FP32 values, contiguous (reserved above) */
        bias = linear_bias_buf(j);
        for (int64_t n = 0; n < j->gb.R; n++)
            bias[n] = mxfp8i_load_f32(j->bias->data, j->bias->dtype, n * j->bias->strides[0]);
    }
    st = mxfp8i_gemm_gop_bias(&j->ga, &j->gb, &j->cfg, accumulate, bias, c, mxfp8i_num_threads());
    mxfp8i_scope_end(&scope);
    MXFP8I_RETURN_ERROR_IF(st, st, "%s: out of memory for the packed operands", fn);
    stats_export(&j->os);
    return MXFP8_OK;
}

static mxfp8_status gemm_checked(const char *fn, const char *na, const mxfp8_operand *a, const char *nb,
                                 const mxfp8_operand *b, const mxfp8_matmul_config *config, int accumulate,
                                 const char *nc, mxfp8_tensor *c) {
    gemm_job j;
    mxfp8_status st = gemm_validate(fn, na, a, nb, b, config, accumulate, nc, c, &j);
    if (st) return st;
    return gemm_run(fn, &j, accumulate, c);
}

/* The _validate entries: the call's checks, then its workspace size (the same reservation, on a sizing arena). */
static mxfp8_status gemm_size(const char *fn, const char *na, const mxfp8_operand *a, const char *nb,
                              const mxfp8_operand *b, const mxfp8_matmul_config *config, int accumulate, const char *nc,
                              const mxfp8_tensor *c, size_t *workspace_bytes) {
    gemm_job j;
    size_t bytes = 0;
    mxfp8_status st = gemm_validate(fn, na, a, nb, b, config, accumulate, nc, c, &j);
    if (!st) st = mxfp8i_ws_plan(fn, gemm_reserve_job, &j, &bytes);
    if (workspace_bytes) *workspace_bytes = st ? 0 : bytes;
    return st;
}

mxfp8_status mxfp8_gemm(const mxfp8_operand *a, const mxfp8_operand *b, const mxfp8_matmul_config *config,
                        int accumulate, mxfp8_tensor *c) {
    mxfp8i_clear_error();
    return gemm_checked("mxfp8_gemm", "a", a, "b", b, config, accumulate, "c", c);
}

mxfp8_status mxfp8_gemm_validate(const mxfp8_operand *a, const mxfp8_operand *b, const mxfp8_matmul_config *config,
                                 int accumulate, const mxfp8_tensor *c, size_t *workspace_bytes) {
    mxfp8i_clear_error();
    return gemm_size("mxfp8_gemm", "a", a, "b", b, config, accumulate, "c", c, workspace_bytes);
}

mxfp8_status mxfp8_matmul(const mxfp8_operand *input_activation, const mxfp8_operand *weights,
                          const mxfp8_matmul_config *config, mxfp8_tensor *output) {
    mxfp8i_clear_error();
    return gemm_checked("mxfp8_matmul", "input_activation", input_activation, "weights", weights, config, 0, "output",
                        output);
}

mxfp8_status mxfp8_linear(const mxfp8_operand *input_activation, const mxfp8_operand *weights, const mxfp8_tensor *bias,
                          const mxfp8_matmul_config *config, mxfp8_tensor *output) {
    static const char *fn = "mxfp8_linear";
    mxfp8i_clear_error();
    gemm_job j;
    MXFP8I_FORWARD_IF_ERROR(linear_validate(fn, input_activation, weights, bias, config, output, &j));
    return gemm_run(fn, &j, 0, output);
}

mxfp8_status mxfp8_linear_validate(const mxfp8_operand *input_activation, const mxfp8_operand *weights,
                                   const mxfp8_tensor *bias, const mxfp8_matmul_config *config,
                                   const mxfp8_tensor *output, size_t *workspace_bytes) {
    static const char *fn = "mxfp8_linear";
    mxfp8i_clear_error();
    gemm_job j;
    size_t bytes = 0;
    mxfp8_status st = linear_validate(fn, input_activation, weights, bias, config, output, &j);
    if (!st) st = mxfp8i_ws_plan(fn, gemm_reserve_job, &j, &bytes);
    if (workspace_bytes) *workspace_bytes = st ? 0 : bytes;
    return st;
}

mxfp8_status mxfp8_matmul_validate(const mxfp8_operand *input_activation, const mxfp8_operand *weights,
                                   const mxfp8_matmul_config *config, const mxfp8_tensor *output,
                                   size_t *workspace_bytes) {
    mxfp8i_clear_error();
    return gemm_size("mxfp8_matmul", "input_activation", input_activation, "weights", weights, config, 0, "output",
                     output, workspace_bytes);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* backward                                                                                                    */
/* ---------------------------------------------------------------------------------------------------------- */
void mxfp8_matmul_bwd_args_init(mxfp8_matmul_bwd_args *args) {
    if (!args) return;
    memset(args, 0, sizeof *args);
    args->tile_loop_order = MXFP8_LOOP_MNK;
    args->float8_dtype = MXFP8_FMT_E5M2;
    args->output_dtype = MXFP8_DTYPE_BF16;
    args->run_with_lnc2 = 1;
    args->lnc_2_shard_rhs = 1;
    args->scale_layout = MXFP8_SCALES_COMPACT;
    args->scale_rule = MXFP8_SCALE_NKI;
    args->quant_scheme = MXFP8_GROUP_1X32;
}

/* The transposed 2-D view. */
static mxfp8_tensor transpose2(const mxfp8_tensor *t) {
    mxfp8_tensor r = *t;
    r.shape[0] = t->shape[1];
    r.shape[1] = t->shape[0];
    r.strides[0] = t->strides[1];
    r.strides[1] = t->strides[0];
    return r;
}

/* Operand of a [C, F] tensor (contraction axis C first, e.g. W [N, K] in dgrad, X [M, K] in wgrad): plain views are
 * transposed to [F, C]; swizzled views already are NKI's [C/4, 4F] (x4: [C/4, F]) of the [C, F] tensor. */
static mxfp8_operand operand_cf(const mxfp8_tensor *v, const mxfp8_tensor *scales, mxfp8_scale_layout layout,
                                int swizzled) {
    mxfp8_operand op;
    memset(&op, 0, sizeof op);
    op.values = (swizzled || v->ndim != 2) ? *v : transpose2(v);
    if (scales) op.scales = *scales;
    op.scale_layout = layout;
    op.swizzled = swizzled;
    return op;
}

/* The phase config: the caller's or the args' speed knobs (the recipe is the operands', from the args). */
static void phase_config(const mxfp8_matmul_bwd_args *a, const mxfp8_matmul_config *given, mxfp8_matmul_config *out) {
    if (given) *out = *given;
    else {
        mxfp8_matmul_config_init(out);
        out->tile_loop_order = a->tile_loop_order;
        out->run_with_lnc2 = a->run_with_lnc2;
        out->lnc_2_shard_rhs = a->lnc_2_shard_rhs ? 1 : 0;
        out->spill_reload = a->spill_reload;
    }
    out->M = out->K = out->N = 0;
}

/* The scalar arguments and the phase configs. */
static mxfp8_status check_bwd_args(const char *fn, const mxfp8_matmul_bwd_args *args) {
    const int flag[6] = {args->run_with_lnc2,           args->use_scale_packing,   args->spill_reload,
                         args->output_grad_is_swizzled, args->weights_is_swizzled, args->input_is_swizzled};
    static const char *flag_nm[6] = {"run_with_lnc2",           "use_scale_packing",   "spill_reload",
                                     "output_grad_is_swizzled", "weights_is_swizzled", "input_is_swizzled"};
    for (int i = 0; i < 6; i++) /* booleans are 0 or 1, not "any nonzero" */
        MXFP8I_RETURN_ERROR_IF(flag[i] != 0 && flag[i] != 1, MXFP8_ERR_INVALID_ARGUMENT, "%s: args.%s %d is not 0 or 1",
                               fn, flag_nm[i], flag[i]);
    MXFP8I_RETURN_ERROR_IF(args->lnc_2_shard_rhs < -1 || args->lnc_2_shard_rhs > 1, MXFP8_ERR_INVALID_ARGUMENT,
                           "%s: args.lnc_2_shard_rhs %d is not 1 (N), 0 (M) or -1 (auto)", fn, args->lnc_2_shard_rhs);
    MXFP8I_FORWARD_IF_ERROR(
        mxfp8i_check_enum(fn, "tile_loop_order", MXFP8_ENUM_LOOP_ORDER, (int)args->tile_loop_order));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_enum(fn, "float8_dtype", MXFP8_ENUM_FLOAT8_DTYPE, (int)args->float8_dtype));
    MXFP8I_RETURN_ERROR_IF(!mxfp8i_is_float_dtype(args->output_dtype), MXFP8_ERR_INVALID_ARGUMENT,
                           "%s: output_dtype %d is not f32, bf16 or f16", fn, (int)args->output_dtype);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_enum(fn, "scale_layout", MXFP8_ENUM_SCALE_LAYOUT, (int)args->scale_layout));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_enum(fn, "scale_rule", MXFP8_ENUM_SCALE_RULE, (int)args->scale_rule));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_enum(fn, "quant_scheme", MXFP8_ENUM_GROUP_SCHEME, (int)args->quant_scheme));
    const mxfp8_rounding rnd[3] = {args->output_grad_rounding, args->weights_rounding, args->input_rounding};
    static const char *rnd_nm[3] = {"args.output_grad_rounding", "args.weights_rounding", "args.input_rounding"};
    for (int i = 0; i < 3; i++)
        MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_enum(fn, rnd_nm[i], MXFP8_ENUM_ROUNDING, (int)rnd[i]));
    if (args->input_grad_config)
        MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_config(fn, "input_grad_config", args->input_grad_config));
    if (args->weight_grad_config)
        MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_config(fn, "weight_grad_config", args->weight_grad_config));
    return MXFP8_OK;
}

/* When the three inputs are plain 2-D views (neither x4-packed nor swizzled): one message that shows every shape
 * against Y = X @ W^T, so that swapped or transposed arguments are easy to spot. */
static mxfp8_status check_bwd_shapes(const char *fn, const mxfp8_matmul_bwd_args *args, int64_t M, int64_t N,
                                     int64_t K) {
    const mxfp8_tensor *t[3] = {&args->output_grad, &args->weights, &args->input_activation};
    static const char *const nm[3] = {"output_grad", "weights", "input_activation"};
    const int64_t want[3][2] = {{M, N}, {N, K}, {M, K}};
    const int sw[3] = {args->output_grad_is_swizzled, args->weights_is_swizzled, args->input_is_swizzled};
    int fits = 1;
    for (int i = 0; i < 3; i++) {
        if (!t[i]->data || t[i]->ndim != 2 || t[i]->dtype == MXFP8_DTYPE_U32 || sw[i]) return MXFP8_OK;
        MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_view(fn, nm[i], t[i])); /* extents, overflow: their own errors */
        fits &= t[i]->shape[0] == want[i][0] && t[i]->shape[1] == want[i][1];
    }
    if (fits) return MXFP8_OK;
    return mxfp8i_error(
        MXFP8_ERR_SHAPE_MISMATCH,
        "%s: the shapes do not fit Y = X @ W^T: output_grad (dY) [%lld, %lld], weights (W) [%lld, %lld],"
        " input_activation (X) [%lld, %lld]; with M = %lld, N = %lld, K = %lld (from input_grad [M, K] "
        "and weight_grad [N, K]) they must be dY [M, N] = [%lld, %lld], W [N, K] = [%lld, %lld], "
        "X [M, K] = [%lld, %lld]",
        fn, (long long)t[0]->shape[0], (long long)t[0]->shape[1], (long long)t[1]->shape[0], (long long)t[1]->shape[1],
        (long long)t[2]->shape[0], (long long)t[2]->shape[1], (long long)M, (long long)N, (long long)K, (long long)M,
        (long long)N, (long long)N, (long long)K, (long long)M, (long long)K);
}

/* The three operands for (M, N, K) read from the outputs, as descriptors; shapes, wrapX and aliasing. */
static mxfp8_status bwd_operands(const char *fn, const mxfp8_matmul_bwd_args *args, const mxfp8_tensor *input_grad,
                                 const mxfp8_tensor *weight_grad, int64_t M, int64_t N, int64_t K, mxfp8i_recipe rc,
                                 mxfp8i_gop *g_dy, mxfp8i_gop *g_w, mxfp8i_gop *g_x) {
    mxfp8_scale_layout lay = args->use_scale_packing ? MXFP8_SCALES_NKI_PACKED : args->scale_layout;
    /* dgrad operands: dY [M, N] (contraction N last), W [N, K] as [K, N]; wgrad's X [M, K] as [K, M]. */
    mxfp8_operand op_dy, op_w, op_x;
    memset(&op_dy, 0, sizeof op_dy);
    op_dy.values = args->output_grad;
    op_dy.scales = args->output_grad_scales;
    op_dy.scale_layout = lay;
    op_dy.swizzled = args->output_grad_is_swizzled;
    op_w = operand_cf(&args->weights, &args->weight_scales, lay, args->weights_is_swizzled);
    op_x = operand_cf(&args->input_activation, &args->input_scales, lay, args->input_is_swizzled);
    MXFP8I_FORWARD_IF_ERROR(check_bwd_shapes(fn, args, M, N, K));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_gop_from_operand(fn, "output_grad", &op_dy, N, rc, g_dy));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_gop_from_operand(fn, "weights", &op_w, N, rc, g_w));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_gop_from_operand(fn, "input_activation", &op_x, M, rc, g_x));
    MXFP8I_RETURN_ERROR_IF(g_dy->R != M, MXFP8_ERR_SHAPE_MISMATCH,
                           "%s: output_grad has %lld rows but input_grad has M = %lld", fn, (long long)g_dy->R,
                           (long long)M);
    MXFP8I_RETURN_ERROR_IF(g_w->R != K, MXFP8_ERR_SHAPE_MISMATCH,
                           "%s: weights has %lld columns but input_grad has K = %lld", fn, (long long)g_w->R,
                           (long long)K);
    MXFP8I_RETURN_ERROR_IF(g_x->R != K, MXFP8_ERR_SHAPE_MISMATCH,
                           "%s: input_activation has %lld columns, expected K = %lld", fn, (long long)g_x->R,
                           (long long)K);
    MXFP8I_RETURN_ERROR_IF(rc.group == MXFP8_GROUP_WRAPX && M % 128, MXFP8_ERR_UNSUPPORTED,
                           "%s: quant_scheme wrapX needs M %% 128 == 0 (dY is quantized along M), but M = %lld", fn,
                           (long long)M);
    const mxfp8_tensor *ins[6] = {&args->output_grad,        &args->weights,       &args->input_activation,
                                  &args->output_grad_scales, &args->weight_scales, &args->input_scales};
    static const char *inames[6] = {"output_grad",        "weights",       "input_activation",
                                    "output_grad_scales", "weight_scales", "input_scales"};
    for (int i = 0; i < 6; i++) {
        MXFP8I_FORWARD_IF_ERROR(check_out_alias(fn, "input_grad", input_grad, inames[i], ins[i]));
        MXFP8I_FORWARD_IF_ERROR(check_out_alias(fn, "weight_grad", weight_grad, inames[i], ins[i]));
    }
    return mxfp8i_check_no_alias(fn, "input_grad", input_grad, "weight_grad", weight_grad);
}

/* A validated backward call: its phase configs (speed knobs), the recipe of its four quantizations (from the args)
 * and its operands (each with that recipe, its rounding and its statistics request, into os). */
typedef struct bwd_job {
    const char *fn;
    const mxfp8_matmul_bwd_args *args;
    mxfp8_matmul_config cx, cw;
    mxfp8i_recipe rc;
    mxfp8i_gop g_dy, g_w, g_x;
    int64_t M, K, N;
    op_stats os;
} bwd_job;

/* Every buffer of the backward, before dX is written (mxfp8i_ws_plan): dY's FP32 copy when dY is swizzled or
 * pre-quantized, the statistics pass's, both GEMMs'. So an OUT_OF_MEMORY leaves both outputs untouched. */
static int bwd_need_dyf(const bwd_job *j) { return j->M > 0 && j->N > 0 && (j->g_dy.prequant || j->g_dy.swizzled); }
static mxfp8_status bwd_reserve_job(const void *p) {
    const bwd_job *j = (const bwd_job *)p;
    const int64_t M = j->M, K = j->K, N = j->N;
    const int nt = mxfp8i_num_threads();
    int64_t n = 0;
    MXFP8I_RETURN_ERROR_IF(
        bwd_need_dyf(j) && (!mxfp8i_mul_size(M, N * 4, &n) || !mxfp8i_ws_get(MXFP8I_WS_MATMUL_DY, (size_t)n)),
        MXFP8_ERR_OUT_OF_MEMORY, "%s: out of memory for dY's [%lld, %lld] buffer", j->fn, (long long)M, (long long)N);
    MXFP8I_RETURN_ERROR_IF(j->args->stats && mxfp8i_gop_stats_reserve(M > N ? M : N, nt), MXFP8_ERR_OUT_OF_MEMORY,
                           "%s: out of memory for the statistics pass", j->fn);
    MXFP8I_RETURN_ERROR_IF(mxfp8i_gemm_reserve(M, K, N, &j->cx, nt, -1) || mxfp8i_gemm_reserve(N, K, M, &j->cw, nt, -1),
                           MXFP8_ERR_OUT_OF_MEMORY, "%s: out of memory for the packed operands", j->fn);
    return MXFP8_OK;
}

/* The two GEMMs inside the call's workspace scope, after bwd_reserve_job's buffers are in place. */
static mxfp8_status backward_scoped(bwd_job *j, mxfp8_tensor *input_grad, mxfp8_tensor *weight_grad) {
    const char *fn = j->fn;
    const mxfp8_matmul_bwd_args *args = j->args;
    const mxfp8i_gop *g_dy = &j->g_dy, *g_w = &j->g_w, *g_x = &j->g_x;
    const mxfp8_matmul_config *cx = &j->cx, *cw = &j->cw;
    const int64_t M = j->M, N = j->N;
    const int nt = mxfp8i_num_threads();
    /* wgrad operand dY^T [N, M]: the high-precision dY, transposed; when dY is swizzled or pre-quantized, its FP32
     * values (exact dequantized values) are first written to a plain [M, N] buffer. */
    mxfp8i_gop g_dyt = mxfp8i_gop_hp(args->output_grad.data, args->output_grad.dtype, N, M,
                                     args->output_grad.strides[1], args->output_grad.strides[0]);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_ws_plan(fn, bwd_reserve_job, j, NULL));
    if (bwd_need_dyf(j)) {
        float *dyf = mxfp8i_ws_get(MXFP8I_WS_MATMUL_DY, (size_t)(M * N * 4));
        for (int64_t m = 0; m < M; m++)
            mxfp8i_gop_load_row(g_dy, m, dyf + m * N);
        g_dyt = mxfp8i_gop_hp(dyf, MXFP8_DTYPE_F32, N, M, 1, N);
    }
    g_dyt.rc = j->rc;
    g_dyt.sr = mxfp8i_sround_make(args->output_grad_rounding == MXFP8_ROUND_STOCHASTIC, args->rounding_seed, 2, 0, 1,
                                  N); /* (n, m) */
    g_dyt.stats = stats_request(&j->os, 2, args->stats ? args->stats + 2 : NULL);
    const mxfp8i_gop *ops[4] = {g_dy, g_w, &g_dyt, g_x};
    if (args->stats) MXFP8I_FORWARD_IF_ERROR(stats_collect(fn, ops, 4));
    mxfp8_status st = mxfp8i_gemm_gop(g_dy, g_w, cx, 0, input_grad, nt);
    if (!st) st = mxfp8i_gemm_gop(&g_dyt, g_x, cw, 0, weight_grad, nt);
    MXFP8I_RETURN_ERROR_IF(st, MXFP8_ERR_INTERNAL, "%s: a GEMM failed after its reservation", fn);
    stats_export(&j->os);
    return MXFP8_OK;
}

/* Every check of mxfp8_matmul_backward, before anything is written (shared by the call and its _validate). */
static mxfp8_status bwd_validate(const char *fn, const mxfp8_matmul_bwd_args *args, const mxfp8_tensor *input_grad,
                                 const mxfp8_tensor *weight_grad, bwd_job *j) {
    MXFP8I_RETURN_ERROR_IF(!args, MXFP8_ERR_NULL_POINTER, "%s: args is NULL", fn);
    MXFP8I_RETURN_ERROR_IF(!input_grad, MXFP8_ERR_NULL_POINTER, "%s: input_grad is NULL", fn);
    MXFP8I_RETURN_ERROR_IF(!weight_grad, MXFP8_ERR_NULL_POINTER, "%s: weight_grad is NULL", fn);
    MXFP8I_FORWARD_IF_ERROR(check_bwd_args(fn, args));
    /* Dimensions come from the outputs: dX [M, K], dW [N, K]. */
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_rank(fn, "input_grad", input_grad, 2));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_rank(fn, "weight_grad", weight_grad, 2));
    int64_t M = input_grad->shape[0], K = input_grad->shape[1], N = weight_grad->shape[0];
    MXFP8I_FORWARD_IF_ERROR(check_output(fn, "input_grad", input_grad, M, K, 0));
    MXFP8I_FORWARD_IF_ERROR(check_output(fn, "weight_grad", weight_grad, N, K, 0));
    /* weight_grad may also be F32 (mixed precision: FP32 master weights); each output is rounded once to its own
       dtype from its GEMM's FP32 result */
    MXFP8I_RETURN_ERROR_IF(input_grad->dtype != args->output_dtype ||
                               (weight_grad->dtype != args->output_dtype && weight_grad->dtype != MXFP8_DTYPE_F32),
                           MXFP8_ERR_DTYPE,
                           "%s: input_grad (%s) must have output_dtype %s, weight_grad (%s) output_dtype or f32", fn,
                           mxfp8_dtype_name(input_grad->dtype), mxfp8_dtype_name(args->output_dtype),
                           mxfp8_dtype_name(weight_grad->dtype));
    phase_config(args, args->input_grad_config, &j->cx);
    phase_config(args, args->weight_grad_config, &j->cw);
    if (args->input_grad_config)
        MXFP8I_FORWARD_IF_ERROR(check_dims(fn, "input_grad_config", args->input_grad_config, M, N, K));
    if (args->weight_grad_config)
        MXFP8I_FORWARD_IF_ERROR(check_dims(fn, "weight_grad_config", args->weight_grad_config, N, M, K));
    j->rc = mxfp8i_recipe_make(args->float8_dtype, args->scale_rule, args->quant_scheme); /* checked above */
    MXFP8I_FORWARD_IF_ERROR(
        bwd_operands(fn, args, input_grad, weight_grad, M, N, K, j->rc, &j->g_dy, &j->g_w, &j->g_x));

    /* the four quantizations: stream q, the row-major index of the element in its own tensor */
    const uint64_t seed = args->rounding_seed;
    j->g_dy.sr =
        mxfp8i_sround_make(args->output_grad_rounding == MXFP8_ROUND_STOCHASTIC, seed, 0, 0, N, 1);     /* (m, n) */
    j->g_w.sr = mxfp8i_sround_make(args->weights_rounding == MXFP8_ROUND_STOCHASTIC, seed, 1, 0, 1, K); /* (k, n) */
    j->g_x.sr = mxfp8i_sround_make(args->input_rounding == MXFP8_ROUND_STOCHASTIC, seed, 3, 0, 1, K);   /* (k, m) */
    mxfp8_quant_stats *so = args->stats;
    j->os.n = 4;
    j->g_dy.stats = stats_request(&j->os, 0, so ? so + 0 : NULL);
    j->g_w.stats = stats_request(&j->os, 1, so ? so + 1 : NULL);
    j->g_x.stats = stats_request(&j->os, 3, so ? so + 3 : NULL);
    j->fn = fn;
    j->args = args;
    j->M = M, j->K = K, j->N = N;
    return MXFP8_OK;
}

mxfp8_status mxfp8_matmul_backward(const mxfp8_matmul_bwd_args *args, mxfp8_tensor *input_grad,
                                   mxfp8_tensor *weight_grad) {
    static const char *fn = "mxfp8_matmul_backward";
    mxfp8i_clear_error();
    bwd_job j;
    MXFP8I_FORWARD_IF_ERROR(bwd_validate(fn, args, input_grad, weight_grad, &j));
    mxfp8i_scope scope;
    MXFP8I_RETURN_ERROR_IF(mxfp8i_scope_begin(&scope, args->workspace), MXFP8_ERR_OUT_OF_MEMORY,
                           "%s: out of memory for the workspace", fn);
    mxfp8_status st = backward_scoped(&j, input_grad, weight_grad);
    mxfp8i_scope_end(&scope);
    return st;
}

mxfp8_status mxfp8_matmul_backward_validate(const mxfp8_matmul_bwd_args *args, const mxfp8_tensor *input_grad,
                                            const mxfp8_tensor *weight_grad, size_t *workspace_bytes) {
    mxfp8i_clear_error();
    bwd_job j;
    size_t bytes = 0;
    mxfp8_status st = bwd_validate("mxfp8_matmul_backward", args, input_grad, weight_grad, &j);
    if (!st) st = mxfp8i_ws_plan("mxfp8_matmul_backward", bwd_reserve_job, &j, &bytes);
    if (workspace_bytes) *workspace_bytes = st ? 0 : bytes;
    return st;
}
