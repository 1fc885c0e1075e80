/*
 * moe_common.c -- blockwise MoE: defaults, validation shared by the kernels and the golden references, routing
 * resolution, per-expert weight quantization and the GEMM entry of the MoE phases.
 *
 * Contract (include/mxfp8.h, "Blockwise MoE"): every input is validated before any output is written; routing is
 * resolved into a flat table tok[n*B + p] (a token id in [0, V) or -1 for padding, num_valid_tokens applied) and
 * expert[n]. Weights are turned once per expert into exact FP32 copies and into 1x32 MX codes along each axis a GEMM
 * contracts them over; user pre-quantized weights are copied code for code where their axis matches, so they are
 * bitwise equal to quantizing on the fly.
 */
#include <stdio.h>
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "../gemm/gemm.h"
#include "moe_internal.h"

/* ---------------------------------------------------------------------------------------------------------- */
/* Defaults                                                                                                   */
/* ---------------------------------------------------------------------------------------------------------- */
/* A phase config: the matmul defaults with the MoE's E4M3 (phase outputs are FP32: weight grads accumulate in FP32). */
static void phase_config_default(mxfp8_matmul_config *c) {
    mxfp8_matmul_config_init(c);
    c->float8_dtype = MXFP8_FMT_E4M3;
}

void mxfp8_moe_config_init(mxfp8_moe_config *c) {
    if (!c) return;
    memset(c, 0, sizeof *c);
    c->compute_dtype = MXFP8_DTYPE_BF16;
    c->quant_dtype = MXFP8_FMT_E4M3;
    c->scale_rule = MXFP8_SCALE_NKI;
    c->activation = MXFP8_ACT_SILU;
    c->affinity_option = MXFP8_AFFINITY_ON_I;
    phase_config_default(&c->phase1);
    phase_config_default(&c->phase2);
    phase_config_default(&c->phase3);
    phase_config_default(&c->phase4);
    c->gate_clamp_lower = -INFINITY;
    c->gate_clamp_upper = INFINITY;
    c->up_clamp_lower = -INFINITY;
    c->up_clamp_upper = INFINITY;
    c->skip_token = 1;
}

void mxfp8_moe_bwd_args_init(mxfp8_moe_bwd_args *args) {
    if (!args) return;
    memset(args, 0, sizeof *args);
    args->block_size = 4096;
}

void mxfp8_moe_fwd_args_init(mxfp8_moe_fwd_args *args) {
    if (!args) return;
    memset(args, 0, sizeof *args);
    args->block_size = 4096;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Validation helpers                                                                                         */
/* ---------------------------------------------------------------------------------------------------------- */
static bool present(const mxfp8_tensor *t) { return t && t->data; }

static bool is_float_or(const mxfp8_tensor *t, int allow_f64) {
    return mxfp8i_is_float_dtype(t->dtype) || (allow_f64 && t->dtype == MXFP8_DTYPE_F64);
}

mxfp8_status mxfp8i_moe_check_tensor(const char *fn, const char *name, const mxfp8_tensor *t, int required,
                                     int allow_f64, int ndim, const int64_t *shape) {
    if (!present(t)) {
        if (required) return mxfp8i_error(MXFP8_ERR_NULL_POINTER, "%s: %s is required but absent", fn, name);
        return MXFP8_OK;
    }
    mxfp8_status st = mxfp8i_check_rank(fn, name, t, ndim);
    if (st) return st;
    if (!is_float_or(t, allow_f64))
        return mxfp8i_error(MXFP8_ERR_DTYPE, "%s: %s has dtype %s (expected f32, bf16 or f16%s)", fn, name,
                            mxfp8_dtype_name(t->dtype), allow_f64 ? " or f64" : "");
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != shape[i]) {
            char want[160], got[160];
            int w = 0, g = 0;
            for (int j = 0; j < ndim; j++) {
                w += snprintf(want + w, sizeof want - (size_t)w, j ? ", %lld" : "%lld", (long long)shape[j]);
                g += snprintf(got + g, sizeof got - (size_t)g, j ? ", %lld" : "%lld", (long long)t->shape[j]);
            }
            return mxfp8i_error(MXFP8_ERR_SHAPE_MISMATCH, "%s: %s has shape [%s], expected [%s]", fn, name, got,
                                want);
        }
    return MXFP8_OK;
}

mxfp8_status mxfp8i_moe_check_vec(const char *fn, const char *name, const mxfp8_tensor *t, int allow_f64, int64_t n) {
    if (!present(t)) return mxfp8i_error(MXFP8_ERR_NULL_POINTER, "%s: %s is required but absent", fn, name);
    mxfp8_status st = mxfp8i_check_view(fn, name, t);
    if (st) return st;
    if (!(t->ndim == 1 || (t->ndim == 2 && t->shape[1] == 1)))
        return mxfp8i_error(MXFP8_ERR_SHAPE_MISMATCH, "%s: %s must be [T*E, 1] or [T*E] (got a %d-D view)", fn, name,
                            (int)t->ndim);
    if (t->shape[0] != n)
        return mxfp8i_error(MXFP8_ERR_SHAPE_MISMATCH, "%s: %s has %lld entries, expected T*E = %lld", fn, name,
                            (long long)t->shape[0], (long long)n);
    if (!is_float_or(t, allow_f64))
        return mxfp8i_error(MXFP8_ERR_DTYPE, "%s: %s has dtype %s (expected f32, bf16 or f16%s)", fn, name,
                            mxfp8_dtype_name(t->dtype), allow_f64 ? " or f64" : "");
    return MXFP8_OK;
}

mxfp8_status mxfp8i_moe_check_alias(const char *fn, const char *oname, const mxfp8_tensor *o, int n,
                                    const mxfp8_tensor *const *v, const char *const *names) {
    if (!present(o)) return MXFP8_OK;
    for (int i = 0; i < n; i++) {
        if (!present(v[i]) || v[i] == o) continue;
        mxfp8_status st = mxfp8i_check_no_alias(fn, oname, o, names[i], v[i]);
        if (st) return st;
    }
    return MXFP8_OK;
}

static mxfp8_status check_config(const char *fn, const mxfp8_moe_config *c) {
    if (c->compute_dtype != MXFP8_DTYPE_BF16 && c->compute_dtype != MXFP8_DTYPE_F32)
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: config.compute_dtype %d is not bf16 or f32", fn,
                            (int)c->compute_dtype);
    if (c->quant_dtype != MXFP8_FMT_E4M3 && c->quant_dtype != MXFP8_FMT_E5M2)
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: config.quant_dtype %d is not e4m3 (0) or e5m2 (1)", fn,
                            (int)c->quant_dtype);
    if ((unsigned)c->scale_rule > MXFP8_SCALE_RCEIL)
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: config.scale_rule %d is unknown", fn, (int)c->scale_rule);
    if ((unsigned)c->activation > MXFP8_ACT_SQUARED_RELU)
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: config.activation %d is unknown", fn, (int)c->activation);
    if ((unsigned)c->affinity_option > MXFP8_AFFINITY_ON_H)
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: config.affinity_option %d is unknown", fn,
                            (int)c->affinity_option);
    const float lim[4] = {c->gate_clamp_lower, c->gate_clamp_upper, c->up_clamp_lower, c->up_clamp_upper};
    const char *lname[4] = {"gate_clamp_lower", "gate_clamp_upper", "up_clamp_lower", "up_clamp_upper"};
    for (int i = 0; i < 4; i++)
        if (isnan(lim[i]))
            return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: config.%s is NaN (use +-INFINITY for no limit)", fn,
                                lname[i]);
    if (lim[0] > lim[1])
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: config.gate_clamp_lower %g > gate_clamp_upper %g", fn,
                            (double)lim[0], (double)lim[1]);
    if (lim[2] > lim[3])
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: config.up_clamp_lower %g > up_clamp_upper %g", fn,
                            (double)lim[2], (double)lim[3]);
    if (c->shard_option < 0 || c->shard_option > 2) /* hardware-only knobs are still validated */
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: config.shard_option %d is not 0, 1 or 2", fn,
                            c->shard_option);
    if (c->skip_token != 0 && c->skip_token != 1)
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: config.skip_token %d is not 0 or 1", fn, c->skip_token);
    const int flag[6] = {c->skip_weight, c->accumulate_hidden_states_grad, c->skip_grad_initialization,
                         c->single_expert_dense, c->bias, c->use_fast_dma};
    static const char *flag_nm[6] = {"skip_weight", "accumulate_hidden_states_grad", "skip_grad_initialization",
                                     "single_expert_dense", "bias", "use_fast_dma"};
    for (int i = 0; i < 6; i++) /* booleans are 0 or 1, not "any nonzero" */
        if (flag[i] != 0 && flag[i] != 1)
            return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: config.%s %d is not 0 or 1", fn, flag_nm[i], flag[i]);
    const int mode[5] = {c->p3_transpose_mode, c->p4_transpose_mode, c->hidden_states_swizzle_mode,
                         c->output_grad_swizzle_mode, c->weight_swizzle_mode};
    static const char *mode_nm[5] = {"p3_transpose_mode", "p4_transpose_mode", "hidden_states_swizzle_mode",
                                     "output_grad_swizzle_mode", "weight_swizzle_mode"};
    for (int i = 0; i < 5; i++) /* hardware-only modes: validated, no effect on results */
        if (mode[i] < 0 || mode[i] > 2)
            return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: config.%s %d is not 0, 1 or 2", fn, mode_nm[i],
                                mode[i]);
    const mxfp8_matmul_config *ph[4] = {&c->phase1, &c->phase2, &c->phase3, &c->phase4};
    for (int i = 0; i < 4; i++) {
        char phname[32];
        snprintf(phname, sizeof phname, "config.phase%d", i + 1);
        mxfp8_status st = mxfp8i_check_config(fn, phname, ph[i]);
        if (st) return st;
        if (ph[i]->quant_scheme == MXFP8_GROUP_WRAPX)
            return mxfp8i_error(MXFP8_ERR_UNSUPPORTED,
                                "%s: config.phase%d.quant_scheme is wrapX; the MoE layer quantizes in 1x32 groups", fn,
                                i + 1);
        if (ph[i]->quant_scheme != MXFP8_GROUP_1X32)
            return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: config.phase%d.quant_scheme %d is unknown", fn, i + 1,
                                (int)ph[i]->quant_scheme);
    }
    return MXFP8_OK;
}

/* A weight: F32/BF16/F16, or FP8 codes of the config's format together with scales of the given shape. */
static mxfp8_status check_weight(const char *fn, const char *name, const mxfp8_tensor *w, const char *sname,
                                 const mxfp8_tensor *s, mxfp8_format fmt, int ndim, const int64_t *sshape,
                                 int *prequant) {
    *prequant = 0;
    if (mxfp8i_is_fp8_dtype(w->dtype) || w->dtype == MXFP8_DTYPE_U8) {
        if (w->dtype != MXFP8_DTYPE_U8 && w->dtype != mxfp8i_fmt_dtype(fmt))
            return mxfp8i_error(MXFP8_ERR_DTYPE, "%s: %s holds %s codes but config.quant_dtype is %s", fn, name,
                                mxfp8_dtype_name(w->dtype), fmt == MXFP8_FMT_E5M2 ? "e5m2" : "e4m3");
        if (!present(s))
            return mxfp8i_error(MXFP8_ERR_NULL_POINTER, "%s: %s holds FP8 codes but %s is absent", fn, name, sname);
        mxfp8_status st = mxfp8i_check_rank(fn, sname, s, ndim);
        if (st) return st;
        st = mxfp8i_check_dtype(fn, sname, s, 2, MXFP8_DTYPE_E8M0, MXFP8_DTYPE_U8);
        if (st) return st;
        for (int i = 0; i < ndim; i++)
            if (s->shape[i] != sshape[i])
                return mxfp8i_error(MXFP8_ERR_SHAPE_MISMATCH, "%s: %s has extent %lld in dimension %d, expected %lld",
                                    fn, sname, (long long)s->shape[i], i, (long long)sshape[i]);
        *prequant = 1;
        return MXFP8_OK;
    }
    if (!mxfp8i_is_float_dtype(w->dtype))
        return mxfp8i_error(MXFP8_ERR_DTYPE, "%s: %s has dtype %s (expected f32, bf16, f16 or FP8 codes)", fn, name,
                            mxfp8_dtype_name(w->dtype));
    if (present(s))
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: %s is given but %s is not FP8 codes (%s)", fn, sname,
                            name, mxfp8_dtype_name(w->dtype));
    return MXFP8_OK;
}

static mxfp8_status check_dims(const char *fn, const char *name, const mxfp8_tensor *t, int ndim,
                               const int64_t *shape) {
    mxfp8_status st = mxfp8i_check_rank(fn, name, t, ndim);
    if (st) return st;
    for (int i = 0; i < ndim; i++)
        if (shape[i] >= 0 && t->shape[i] != shape[i])
            return mxfp8i_error(MXFP8_ERR_SHAPE_MISMATCH, "%s: %s has extent %lld in dimension %d, expected %lld", fn,
                                name, (long long)t->shape[i], i, (long long)shape[i]);
    return MXFP8_OK;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Setup                                                                                                      */
/* ---------------------------------------------------------------------------------------------------------- */
/* Rows of the per-block workspaces: the longest prefix of a block that ends with a real position (at least 1),
 * so a block size far above the token count costs nothing. */
static mxfp8_status set_workspace_rows(mxfp8i_moe *p) {
    int64_t rows = 1, w;
    for (int64_t n = 0; n < p->N; n++) {
        int64_t L = mxfp8i_moe_block_len(p, n);
        if (L > rows) rows = L;
    }
    p->Bw = rows;
    if (!mxfp8i_mul_size(rows, p->H + 2 * p->I, &w) || w > INT64_MAX / 64) {
        mxfp8i_moe_free(p);
        return mxfp8i_error(MXFP8_ERR_SIZE_OVERFLOW, "%s: block workspace L*(H + 2I) overflows", p->fn);
    }
    return MXFP8_OK;
}

mxfp8_status mxfp8i_moe_setup(const char *fn, const mxfp8i_moe_in *in, int bwd, mxfp8i_moe *p) {
    mxfp8_status st;
    memset(p, 0, sizeof *p);
    p->fn = fn;
    p->bwd = bwd;
    if (in->cfg) p->cfg = *in->cfg;
    else mxfp8_moe_config_init(&p->cfg);
    if ((st = check_config(fn, &p->cfg))) return st;
    const mxfp8_moe_config *c = &p->cfg;

    /* X [T, H] */
    if (!in->X) return mxfp8i_error(MXFP8_ERR_NULL_POINTER, "%s: hidden_states is required", fn);
    if ((st = mxfp8i_check_rank(fn, "hidden_states", in->X, 2))) return st;
    if (!mxfp8i_is_float_dtype(in->X->dtype))
        return mxfp8i_error(MXFP8_ERR_DTYPE, "%s: hidden_states has dtype %s (expected f32, bf16 or f16)", fn,
                            mxfp8_dtype_name(in->X->dtype));
    const int64_t T = in->X->shape[0], H = in->X->shape[1];
    if (H < 1)
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: hidden size H = %lld must be >= 1", fn, (long long)H);

    /* W1 [E, H, 2, I], W2 [E, I, H] */
    if (!in->W1 || !in->W1->data)
        return mxfp8i_error(MXFP8_ERR_NULL_POINTER, "%s: gate_up_proj_weight is required", fn);
    if (!in->W2 || !in->W2->data) return mxfp8i_error(MXFP8_ERR_NULL_POINTER, "%s: down_proj_weight is required", fn);
    if ((st = mxfp8i_check_rank(fn, "gate_up_proj_weight", in->W1, 4))) return st;
    const int64_t E = in->W1->shape[0], I = in->W1->shape[3];
    if (E < 1)
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: number of experts E = %lld must be >= 1", fn,
                            (long long)E);
    if (I < 1)
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: intermediate size I = %lld must be >= 1", fn,
                            (long long)I);
    {
        /* Name both tensors when they disagree on a size (E and I are taken from gate_up_proj_weight, H from
           hidden_states): the message must not blame the one that happens to be checked second. */
        if ((st = mxfp8i_check_rank(fn, "down_proj_weight", in->W2, 3))) return st;
        const struct { const mxfp8_tensor *t; int dim; int64_t want; const char *nm, *size, *from; } agree[] = {
            {in->W1, 1, H, "gate_up_proj_weight", "H", "hidden_states"},
            {in->W2, 0, E, "down_proj_weight", "E", "gate_up_proj_weight"},
            {in->W2, 1, I, "down_proj_weight", "I", "gate_up_proj_weight"},
            {in->W2, 2, H, "down_proj_weight", "H", "hidden_states"},
        };
        for (int k = 0; k < 4; k++)
            if (agree[k].t->shape[agree[k].dim] != agree[k].want)
                return mxfp8i_error(MXFP8_ERR_SHAPE_MISMATCH, "%s: %s has %s = %lld but %s has %s = %lld", fn,
                                    agree[k].from, agree[k].size, (long long)agree[k].want, agree[k].nm,
                                    agree[k].size, (long long)agree[k].t->shape[agree[k].dim]);
        const int64_t s1[4] = {E, H, 2, I}, s2[3] = {E, I, H};
        if ((st = check_dims(fn, "gate_up_proj_weight", in->W1, 4, s1))) return st;
        if ((st = check_dims(fn, "down_proj_weight", in->W2, 3, s2))) return st;
    }
    const int64_t GH = mxfp8i_moe_groups(H), GI = mxfp8i_moe_groups(I), G2I = mxfp8i_moe_groups(2 * I);
    {
        const int64_t s1b[3] = {E, H, G2I}, s1f[4] = {E, GH, 2, I}, s2b[3] = {E, I, GH}, s2f[3] = {E, GI, H};
        if ((st = check_weight(fn, "gate_up_proj_weight", in->W1, "gate_up_weight_scales", in->W1s, c->quant_dtype,
                               bwd ? 3 : 4, bwd ? s1b : s1f, &p->w1_prequant)))
            return st;
        if ((st = check_weight(fn, "down_proj_weight", in->W2, "down_weight_scales", in->W2s, c->quant_dtype, 3,
                               bwd ? s2b : s2f, &p->w2_prequant)))
            return st;
    }

    /* a [T*E, 1] */
    int64_t TE;
    if (!mxfp8i_mul_size(T, E, &TE)) return mxfp8i_error(MXFP8_ERR_SIZE_OVERFLOW, "%s: T*E overflows", fn);
    if ((st = mxfp8i_moe_check_vec(fn, "expert_affinities_masked", in->a, 0, TE))) return st;

    /* dY [T, H] */
    if (bwd) {
        const int64_t sy[2] = {T, H};
        if ((st = mxfp8i_moe_check_tensor(fn, "output_hidden_states_grad", in->dY, 1, 0, 2, sy))) return st;
    }

    /* block size, num_valid_tokens */
    const int64_t B = in->B;
    if (B < 1) return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: block_size %lld must be >= 1", fn, (long long)B);
    int64_t V = T;
    if (present(in->nvt)) {
        if (!c->single_expert_dense)
            return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT,
                                "%s: num_valid_tokens requires config.single_expert_dense = 1", fn);
        if ((st = mxfp8i_check_view(fn, "num_valid_tokens", in->nvt))) return st;
        if ((st = mxfp8i_check_dtype(fn, "num_valid_tokens", in->nvt, 1, MXFP8_DTYPE_I32))) return st;
        if (mxfp8_tensor_numel(in->nvt) != 1)
            return mxfp8i_error(MXFP8_ERR_SHAPE_MISMATCH, "%s: num_valid_tokens must hold exactly one value (has %lld)",
                                fn, (long long)mxfp8_tensor_numel(in->nvt));
        int32_t v = *(const int32_t *)in->nvt->data;
        if (v < 0) return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: num_valid_tokens = %d is negative", fn, (int)v);
        if (c->bias)
            return mxfp8i_error(MXFP8_ERR_UNSUPPORTED, "%s: num_valid_tokens is unsupported together with bias", fn);
        V = v < T ? v : T;
    }

    /* biases */
    if (!c->bias) {
        if (present(in->b1))
            return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: gate_and_up_proj_bias is given but config.bias is 0",
                                fn);
        if (present(in->b2))
            return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: down_proj_bias is given but config.bias is 0", fn);
    } else {
        const int64_t s1[3] = {E, 2, I}, s2[2] = {E, H};
        if ((st = mxfp8i_moe_check_tensor(fn, "gate_and_up_proj_bias", in->b1, 0, 0, 3, s1))) return st;
        if ((st = mxfp8i_moe_check_tensor(fn, "down_proj_bias", in->b2, 0, 0, 2, s2))) return st;
    }

    /* routing */
    int64_t N;
    if (c->single_expert_dense) {
        if (E != 1)
            return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT,
                                "%s: config.single_expert_dense needs E = 1 expert (gate_up_proj_weight has E = %lld)",
                                fn, (long long)E);
        N = mxfp8i_ceil_div(T, B);
    } else {
        if (!present(in->tok)) return mxfp8i_error(MXFP8_ERR_NULL_POINTER, "%s: token_position_to_id is required", fn);
        if (!present(in->b2e)) return mxfp8i_error(MXFP8_ERR_NULL_POINTER, "%s: block_to_expert is required", fn);
        if ((st = mxfp8i_check_rank(fn, "token_position_to_id", in->tok, 1))) return st;
        if ((st = mxfp8i_check_dtype(fn, "token_position_to_id", in->tok, 1, MXFP8_DTYPE_I32))) return st;
        if (in->tok->shape[0] % B)
            return mxfp8i_error(MXFP8_ERR_SHAPE_MISMATCH,
                                "%s: token_position_to_id has %lld positions, not a multiple of block_size %lld", fn,
                                (long long)in->tok->shape[0], (long long)B);
        N = in->tok->shape[0] / B;
        if ((st = mxfp8i_check_view(fn, "block_to_expert", in->b2e))) return st;
        if ((st = mxfp8i_check_dtype(fn, "block_to_expert", in->b2e, 1, MXFP8_DTYPE_I32))) return st;
        if (!(in->b2e->ndim == 1 || (in->b2e->ndim == 2 && in->b2e->shape[1] == 1)) || in->b2e->shape[0] != N)
            return mxfp8i_error(MXFP8_ERR_SHAPE_MISMATCH,
                                "%s: block_to_expert must be [N] or [N, 1] with N = %lld blocks (token_position_to_id "
                                "has N*B = %lld positions)", fn, (long long)N, (long long)in->tok->shape[0]);
    }
    int64_t NB;
    if (!mxfp8i_mul_size(N, B, &NB) || NB > INT64_MAX / 8)
        return mxfp8i_error(MXFP8_ERR_SIZE_OVERFLOW, "%s: N*B overflows", fn);

    p->T = T; p->H = H; p->I = I; p->E = E; p->N = N; p->B = B; p->V = V;
    p->Bw = 1; /* set from the routing below: the longest block prefix that holds a real position */
    p->X = *in->X;
    p->a = *in->a;
    p->W1 = *in->W1;
    p->W2 = *in->W2;
    if (c->bias && present(in->b1)) p->b1 = *in->b1;
    if (c->bias && present(in->b2)) p->b2 = *in->b2;
    if (p->w1_prequant) p->W1s = *in->W1s;
    if (p->w2_prequant) p->W2s = *in->W2s;
    if (bwd) p->dY = *in->dY;

    /* Resolve and check the routing (reads every id before any output is written). */
    p->tok = (int32_t *)malloc((size_t)(NB > 0 ? NB : 1) * sizeof(int32_t));
    p->expert = (int32_t *)malloc((size_t)(N > 0 ? N : 1) * sizeof(int32_t));
    if (!p->tok || !p->expert) {
        mxfp8i_moe_free(p);
        return mxfp8i_error(MXFP8_ERR_OUT_OF_MEMORY, "%s: cannot allocate the routing table (%lld positions)", fn,
                            (long long)NB);
    }
    if (c->single_expert_dense) {
        for (int64_t i = 0; i < NB; i++) p->tok[i] = i < V ? (int32_t)i : -1;
        for (int64_t n = 0; n < N; n++) p->expert[n] = 0;
        return set_workspace_rows(p);
    }
    const int32_t pad = c->skip_token ? -1 : (int32_t)(T > INT32_MAX ? INT32_MAX : T);
    if (T > INT32_MAX - 1) {
        mxfp8i_moe_free(p);
        return mxfp8i_error(MXFP8_ERR_SIZE_OVERFLOW, "%s: T = %lld does not fit int32 token ids", fn, (long long)T);
    }
    const int32_t *tk = (const int32_t *)in->tok->data;
    for (int64_t i = 0; i < NB; i++) {
        int32_t t = tk[i * in->tok->strides[0]];
        if (t == pad) {
            p->tok[i] = -1;
        } else if (t < 0 || t >= T) {
            mxfp8i_moe_free(p);
            return mxfp8i_error(MXFP8_ERR_INDEX_OUT_OF_RANGE,
                                "%s: token_position_to_id[%lld] = %d is out of range: valid are [0, T = %lld) and the "
                                "padding id %d (config.skip_token = %d)", fn, (long long)i, (int)t, (long long)T,
                                (int)pad, c->skip_token ? 1 : 0);
        } else {
            p->tok[i] = t < V ? t : -1;
        }
    }
    const int32_t *be = (const int32_t *)in->b2e->data;
    for (int64_t n = 0; n < N; n++) {
        int32_t e = be[n * in->b2e->strides[0]];
        if (e < 0 || e >= E) {
            mxfp8i_moe_free(p);
            return mxfp8i_error(MXFP8_ERR_INDEX_OUT_OF_RANGE,
                                "%s: block_to_expert[%lld] = %d is out of range [0, E = %lld)", fn, (long long)n,
                                (int)e, (long long)E);
        }
        p->expert[n] = e;
    }
    return set_workspace_rows(p);
}

void mxfp8i_moe_free(mxfp8i_moe *p) {
    free(p->tok);
    free(p->expert);
    p->tok = NULL;
    p->expert = NULL;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Weights                                                                                                    */
/* ---------------------------------------------------------------------------------------------------------- */
static inline float deq_code(const mxfp8i_moe *p, const mxfp8_tensor *codes, int64_t off, const mxfp8_tensor *sc,
                             int64_t soff) {
    uint8_t c = ((const uint8_t *)codes->data)[off];
    uint8_t s = ((const uint8_t *)sc->data)[soff];
    return mxfp8_fp8_to_fp32(c, p->cfg.quant_dtype) * mxfp8_e8m0_to_fp32(s);
}

void mxfp8i_moe_load_w1(const mxfp8i_moe *p, int64_t e, float *w1f) {
    const int64_t H = p->H, I = p->I;
    const mxfp8_tensor *w = &p->W1, *s = &p->W1s;
#pragma omp parallel for schedule(static) num_threads(mxfp8i_moe_nt(2.0 * (double)H * (double)I))
    for (int64_t h = 0; h < H; h++)
        for (int64_t j = 0; j < 2; j++)
            for (int64_t i = 0; i < I; i++) {
                int64_t off = e * w->strides[0] + h * w->strides[1] + j * w->strides[2] + i * w->strides[3];
                float v;
                if (!p->w1_prequant) {
                    v = mxfp8i_load_f32(w->data, w->dtype, off);
                } else if (p->bwd) { /* scales [E, H, G(2I)] */
                    int64_t c = j * I + i;
                    v = deq_code(p, w, off, s, e * s->strides[0] + h * s->strides[1] + (c / 32) * s->strides[2]);
                } else { /* scales [E, G(H), 2, I] */
                    v = deq_code(p, w, off, s,
                                 e * s->strides[0] + (h / 32) * s->strides[1] + j * s->strides[2] + i * s->strides[3]);
                }
                w1f[h * 2 * I + j * I + i] = v;
            }
}

void mxfp8i_moe_load_w2(const mxfp8i_moe *p, int64_t e, float *w2f) {
    const int64_t H = p->H, I = p->I;
    const mxfp8_tensor *w = &p->W2, *s = &p->W2s;
#pragma omp parallel for schedule(static) num_threads(mxfp8i_moe_nt((double)H * (double)I))
    for (int64_t i = 0; i < I; i++)
        for (int64_t h = 0; h < H; h++) {
            int64_t off = e * w->strides[0] + i * w->strides[1] + h * w->strides[2];
            float v;
            if (!p->w2_prequant) v = mxfp8i_load_f32(w->data, w->dtype, off);
            else if (p->bwd) /* scales [E, I, G(H)] */
                v = deq_code(p, w, off, s, e * s->strides[0] + i * s->strides[1] + (h / 32) * s->strides[2]);
            else /* scales [E, G(I), H] */
                v = deq_code(p, w, off, s, e * s->strides[0] + (i / 32) * s->strides[1] + h * s->strides[2]);
            w2f[i * H + h] = v;
        }
}

void mxfp8i_moe_load_b1(const mxfp8i_moe *p, int64_t e, float *b1) {
    const int64_t I = p->I;
    for (int64_t j = 0; j < 2; j++)
        for (int64_t i = 0; i < I; i++)
            b1[j * I + i] = p->b1.data ? mxfp8i_load_f32(p->b1.data, p->b1.dtype,
                                                         e * p->b1.strides[0] + j * p->b1.strides[1] +
                                                             i * p->b1.strides[2])
                                       : 0.0f;
}

void mxfp8i_moe_load_b2(const mxfp8i_moe *p, int64_t e, float *b2) {
    for (int64_t h = 0; h < p->H; h++)
        b2[h] = p->b2.data ? mxfp8i_moe_ld2(&p->b2, e, h) : 0.0f;
}

mxfp8_status mxfp8i_moe_wq_alloc(const mxfp8i_moe *p, int want_fwd, int want_bwd, mxfp8i_moe_wq *w) {
    memset(w, 0, sizeof *w);
    w->e = -1;
    w->want_fwd = want_fwd;
    w->want_bwd = want_bwd;
    const size_t HI = (size_t)p->H * (size_t)p->I;
    const size_t GH = (size_t)mxfp8i_moe_groups(p->H), GI = (size_t)mxfp8i_moe_groups(p->I),
                 G2I = (size_t)mxfp8i_moe_groups(2 * p->I);
    bool ok = true;
    w->w1f = (float *)malloc(2 * HI * sizeof(float));
    w->w2f = (float *)malloc(HI * sizeof(float));
    ok = w->w1f && w->w2f;
    if (want_bwd) {
        w->w1_2i_c = (uint8_t *)malloc(2 * HI);
        w->w1_2i_s = (uint8_t *)malloc((size_t)p->H * G2I);
        w->w2_h_c = (uint8_t *)malloc(HI);
        w->w2_h_s = (uint8_t *)malloc((size_t)p->I * GH);
        ok = ok && w->w1_2i_c && w->w1_2i_s && w->w2_h_c && w->w2_h_s;
    }
    if (want_fwd) {
        w->w1_h_c = (uint8_t *)malloc(2 * HI);
        w->w1_h_s = (uint8_t *)malloc(2 * (size_t)p->I * GH);
        w->w2_i_c = (uint8_t *)malloc(HI);
        w->w2_i_s = (uint8_t *)malloc((size_t)p->H * GI);
        ok = ok && w->w1_h_c && w->w1_h_s && w->w2_i_c && w->w2_i_s;
    }
    if (!ok) {
        mxfp8i_moe_wq_free(w);
        return MXFP8_ERR_OUT_OF_MEMORY;
    }
    return MXFP8_OK;
}

void mxfp8i_moe_wq_free(mxfp8i_moe_wq *w) {
    free(w->w1f); free(w->w2f);
    free(w->w1_2i_c); free(w->w1_2i_s); free(w->w2_h_c); free(w->w2_h_s);
    free(w->w1_h_c); free(w->w1_h_s); free(w->w2_i_c); free(w->w2_i_s);
    memset(w, 0, sizeof *w);
    w->e = -1;
}

/* Quantize `lines` lines of K FP32 values (element (l, k) at src[l*ls + k*ks]) into codes [lines][K] and scales
 * [lines][G], 1x32 along K, lines split between threads. */
static void quantize_lines(const mxfp8i_moe *p, const float *src, int64_t lines, int64_t K, int64_t ls, int64_t ks,
                           uint8_t *codes, uint8_t *scales) {
    const int64_t G = mxfp8i_moe_groups(K);
    const int nt = mxfp8i_moe_nt((double)lines * (double)K);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int c = 0; c < nt; c++) {
        int64_t l0 = lines * c / nt, l1 = lines * (c + 1) / nt;
        if (l1 <= l0) continue;
        mxfp8i_qpanel q = {0};
        q.src = src + l0 * ls;
        q.src_dtype = MXFP8_DTYPE_F32;
        q.lines = l1 - l0;
        q.K = K;
        q.src_ls = ls;
        q.src_ks = ks;
        q.fmt = p->cfg.quant_dtype;
        q.rule = p->cfg.scale_rule;
        q.group = MXFP8_GROUP_1X32;
        q.out = codes + l0 * K;
        q.out_dtype = MXFP8_DTYPE_U8;
        q.out_ls = K;
        q.out_ks = 1;
        q.scales = scales + l0 * G;
        q.sc_ls = G;
        q.sc_gs = 1;
        mxfp8i_quantize_panel(&q);
    }
}

/* Quantize src [K][C] (row-major) down its columns: codes [K][C], scales [G][C]; columns split between threads. */
static void quantize_cols(const mxfp8i_moe *p, const float *src, int64_t K, int64_t C, uint8_t *codes,
                          uint8_t *scales) {
    const int nt = mxfp8i_moe_nt((double)K * (double)C);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int t = 0; t < nt; t++) {
        int64_t c0 = C * t / nt, c1 = C * (t + 1) / nt;
        if (c1 > c0)
            mxfp8i_quantize_cols(src + c0, MXFP8_DTYPE_F32, K, c1 - c0, C, p->cfg.quant_dtype, p->cfg.scale_rule,
                                 MXFP8_GROUP_1X32, codes + c0, C, scales + c0, C);
    }
}

void mxfp8i_moe_wq_prepare(const mxfp8i_moe *p, int64_t e, mxfp8i_moe_wq *w) {
    if (w->e == e) return;
    const int64_t H = p->H, I = p->I, I2 = 2 * I;
    const int64_t GH = mxfp8i_moe_groups(H), GI = mxfp8i_moe_groups(I), G2I = mxfp8i_moe_groups(I2);
    mxfp8i_moe_load_w1(p, e, w->w1f);
    mxfp8i_moe_load_w2(p, e, w->w2f);
    const mxfp8_tensor *W1 = &p->W1, *W2 = &p->W2, *S1 = &p->W1s, *S2 = &p->W2s;
    const uint8_t *c1 = (const uint8_t *)W1->data, *c2 = (const uint8_t *)W2->data;
    const uint8_t *s1 = (const uint8_t *)S1->data, *s2 = (const uint8_t *)S2->data;
    if (w->want_bwd) {
        /* W1 along 2I: operand [H, 2I] */
        if (p->bwd && p->w1_prequant) {
            for (int64_t h = 0; h < H; h++) {
                for (int64_t j = 0; j < 2; j++)
                    for (int64_t i = 0; i < I; i++)
                        w->w1_2i_c[h * I2 + j * I + i] =
                            c1[e * W1->strides[0] + h * W1->strides[1] + j * W1->strides[2] + i * W1->strides[3]];
                for (int64_t g = 0; g < G2I; g++)
                    w->w1_2i_s[h * G2I + g] = s1[e * S1->strides[0] + h * S1->strides[1] + g * S1->strides[2]];
            }
        } else {
            quantize_lines(p, w->w1f, H, I2, I2, 1, w->w1_2i_c, w->w1_2i_s);
        }
        /* W2 along H: operand [I, H] */
        if (p->bwd && p->w2_prequant) {
            for (int64_t i = 0; i < I; i++) {
                for (int64_t h = 0; h < H; h++)
                    w->w2_h_c[i * H + h] = c2[e * W2->strides[0] + i * W2->strides[1] + h * W2->strides[2]];
                for (int64_t g = 0; g < GH; g++)
                    w->w2_h_s[i * GH + g] = s2[e * S2->strides[0] + i * S2->strides[1] + g * S2->strides[2]];
            }
        } else {
            quantize_lines(p, w->w2f, I, H, H, 1, w->w2_h_c, w->w2_h_s);
        }
    }
    if (w->want_fwd) {
        /* W1 along H, kept in W1's own [H][2I] layout (codes quantized down each column c = j*I + i, scales
           [G(H)][2I]); the GEMM reads it as the strided operand [2I, H]. */
        if (!p->bwd && p->w1_prequant) {
            for (int64_t h = 0; h < H; h++)
                for (int64_t j = 0; j < 2; j++)
                    for (int64_t i = 0; i < I; i++)
                        w->w1_h_c[h * I2 + j * I + i] =
                            c1[e * W1->strides[0] + h * W1->strides[1] + j * W1->strides[2] + i * W1->strides[3]];
            for (int64_t g = 0; g < GH; g++)
                for (int64_t j = 0; j < 2; j++)
                    for (int64_t i = 0; i < I; i++)
                        w->w1_h_s[g * I2 + j * I + i] =
                            s1[e * S1->strides[0] + g * S1->strides[1] + j * S1->strides[2] + i * S1->strides[3]];
        } else {
            quantize_cols(p, w->w1f, H, I2, w->w1_h_c, w->w1_h_s);
        }
        /* W2 along I, kept in W2's [I][H] layout (scales [G(I)][H]); read as the strided operand [H, I]. */
        if (!p->bwd && p->w2_prequant) {
            for (int64_t i = 0; i < I; i++)
                for (int64_t h = 0; h < H; h++)
                    w->w2_i_c[i * H + h] = c2[e * W2->strides[0] + i * W2->strides[1] + h * W2->strides[2]];
            for (int64_t g = 0; g < GI; g++)
                for (int64_t h = 0; h < H; h++)
                    w->w2_i_s[g * H + h] = s2[e * S2->strides[0] + g * S2->strides[1] + h * S2->strides[2]];
        } else {
            quantize_cols(p, w->w2f, I, H, w->w2_i_c, w->w2_i_s);
        }
    }
    w->e = e;
}

static mxfp8i_moe_op codes_op(const uint8_t *c, const uint8_t *s, int64_t K) {
    mxfp8i_moe_op o = {0};
    o.codes = c;
    o.crs = K;
    o.cks = 1;
    o.scales = s;
    o.srs = mxfp8i_moe_groups(K);
    o.sgs = 1;
    return o;
}
static mxfp8i_moe_op codes_op_cols(const uint8_t *c, const uint8_t *s, int64_t R) {
    mxfp8i_moe_op o = {0}; /* codes [K][R], scales [G][R]: operand [R, K] */
    o.codes = c;
    o.crs = 1;
    o.cks = R;
    o.scales = s;
    o.srs = 1;
    o.sgs = R;
    return o;
}
mxfp8i_moe_op mxfp8i_moe_op_w1_h(const mxfp8i_moe *p, const mxfp8i_moe_wq *w) {
    return codes_op_cols(w->w1_h_c, w->w1_h_s, 2 * p->I);
}
mxfp8i_moe_op mxfp8i_moe_op_w2_i(const mxfp8i_moe *p, const mxfp8i_moe_wq *w) {
    return codes_op_cols(w->w2_i_c, w->w2_i_s, p->H);
}
mxfp8i_moe_op mxfp8i_moe_op_w1_2i(const mxfp8i_moe *p, const mxfp8i_moe_wq *w) {
    return codes_op(w->w1_2i_c, w->w1_2i_s, 2 * p->I);
}
mxfp8i_moe_op mxfp8i_moe_op_w2_h(const mxfp8i_moe *p, const mxfp8i_moe_wq *w) {
    return codes_op(w->w2_h_c, w->w2_h_s, p->H);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* GEMM                                                                                                       */
/* ---------------------------------------------------------------------------------------------------------- */
static mxfp8i_gop to_gop(int64_t R, int64_t K, const mxfp8i_moe_op *op) {
    if (op->v) return mxfp8i_gop_hp(op->v, MXFP8_DTYPE_F32, R, K, op->rs, op->ks);
    return mxfp8i_gop_codes(op->codes, R, K, op->crs, op->cks, op->scales, op->srs, op->sgs);
}

/* One GEMM of a phase through the block-scaled GEMM of src/gemm (quantize along K, FP32 fmaf accumulation in
 * ascending k, C + sum when accumulating; each C element written by one thread). */
mxfp8_status mxfp8i_moe_gemm(const mxfp8i_moe *p, int64_t M, int64_t N, int64_t K, const mxfp8i_moe_op *A,
                             const mxfp8i_moe_op *B, int accumulate, float *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return MXFP8_OK;
    mxfp8_matmul_config cfg;
    mxfp8_matmul_config_init(&cfg);
    cfg.float8_dtype = p->cfg.quant_dtype;
    cfg.scale_rule = p->cfg.scale_rule;
    cfg.quant_scheme = MXFP8_GROUP_1X32;
    mxfp8i_gop a = to_gop(M, K, A), b = to_gop(N, K, B);
    mxfp8_tensor c;
    memset(&c, 0, sizeof c);
    c.data = C;
    c.dtype = MXFP8_DTYPE_F32;
    c.ndim = 2;
    c.shape[0] = M;
    c.shape[1] = N;
    c.strides[0] = ldc;
    c.strides[1] = 1;
    mxfp8_status st = mxfp8i_gemm_gop(&a, &b, &cfg, accumulate, &c,
                                      (double)M * (double)N * (double)K < 4194304.0 ? 1 : mxfp8i_num_threads());
    return st == MXFP8_OK ? MXFP8_OK : MXFP8_ERR_OUT_OF_MEMORY;
}
