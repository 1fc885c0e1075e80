/*
 * validate.c -- every check of the blockwise MoE layer, shared by the kernels and the golden references: config,
 * inputs (shapes, dtypes, pre-quantized weights, biases, num_valid_tokens), routing (token and expert ids, resolved
 * into a flat table), outputs and aliasing. Nothing here writes an output; a public entry calls these before its
 * first store (include/mxfp8.h, "Blockwise MoE", Errors).
 */
#include <stdio.h>
#include <stdlib.h>

#include "moe.h"
#include "../../runtime/enums.h"

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
        MXFP8I_RETURN_ERROR_IF(required, MXFP8_ERR_NULL_POINTER, "%s: %s is required but absent", fn, name);
        return MXFP8_OK;
    }
    mxfp8_status st = mxfp8i_check_rank(fn, name, t, ndim);
    if (st) return st;
    MXFP8I_RETURN_ERROR_IF(!is_float_or(t, allow_f64), MXFP8_ERR_DTYPE,
                           "%s: %s has dtype %s (expected f32, bf16 or f16%s)", fn, name, mxfp8_dtype_name(t->dtype),
                           allow_f64 ? " or f64" : "");
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != shape[i]) {
            char want[160], got[160];
            int w = 0, g = 0;
            for (int j = 0; j < ndim; j++) {
                w += snprintf(want + w, sizeof want - (size_t)w, j ? ", %lld" : "%lld", (long long)shape[j]);
                g += snprintf(got + g, sizeof got - (size_t)g, j ? ", %lld" : "%lld", (long long)t->shape[j]);
            }
            return mxfp8i_error(MXFP8_ERR_SHAPE_MISMATCH, "%s: %s has shape [%s], expected [%s]", fn, name, got, want);
        }
    return MXFP8_OK;
}

mxfp8_status mxfp8i_moe_check_vec(const char *fn, const char *name, const mxfp8_tensor *t, int allow_f64, int64_t n) {
    MXFP8I_RETURN_ERROR_IF(!present(t), MXFP8_ERR_NULL_POINTER, "%s: %s is required but absent", fn, name);
    mxfp8_status st = mxfp8i_check_view(fn, name, t);
    if (st) return st;
    if (!(t->ndim == 1 || (t->ndim == 2 && t->shape[1] == 1))) {
        char got[160];
        return mxfp8i_error(MXFP8_ERR_SHAPE_MISMATCH, "%s: %s must be [T*E, 1] or [T*E] = [%lld, 1] or [%lld], got %s",
                            fn, name, (long long)n, (long long)n, mxfp8i_shape_str(t, got, sizeof got));
    }
    MXFP8I_RETURN_ERROR_IF(t->shape[0] != n, MXFP8_ERR_SHAPE_MISMATCH, "%s: %s has %lld entries, expected T*E = %lld",
                           fn, name, (long long)t->shape[0], (long long)n);
    MXFP8I_RETURN_ERROR_IF(!is_float_or(t, allow_f64), MXFP8_ERR_DTYPE,
                           "%s: %s has dtype %s (expected f32, bf16 or f16%s)", fn, name, mxfp8_dtype_name(t->dtype),
                           allow_f64 ? " or f64" : "");
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
    MXFP8I_RETURN_ERROR_IF(c->compute_dtype != MXFP8_DTYPE_BF16 && c->compute_dtype != MXFP8_DTYPE_F32,
                           MXFP8_ERR_INVALID_ARGUMENT, "%s: config.compute_dtype %d is not bf16 or f32", fn,
                           (int)c->compute_dtype);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_enum(fn, "config.quant_dtype", MXFP8_ENUM_FLOAT8_DTYPE, (int)c->quant_dtype));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_enum(fn, "config.scale_rule", MXFP8_ENUM_SCALE_RULE, (int)c->scale_rule));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_enum(fn, "config.activation", MXFP8_ENUM_ACTIVATION, (int)c->activation));
    MXFP8I_FORWARD_IF_ERROR(
        mxfp8i_check_enum(fn, "config.affinity_option", MXFP8_ENUM_AFFINITY_OPTION, (int)c->affinity_option));
    const float lim[4] = {c->gate_clamp_lower, c->gate_clamp_upper, c->up_clamp_lower, c->up_clamp_upper};
    const char *lname[4] = {"gate_clamp_lower", "gate_clamp_upper", "up_clamp_lower", "up_clamp_upper"};
    for (int i = 0; i < 4; i++)
        MXFP8I_RETURN_ERROR_IF(isnan(lim[i]), MXFP8_ERR_INVALID_ARGUMENT,
                               "%s: config.%s is NaN (use +-INFINITY for no limit)", fn, lname[i]);
    MXFP8I_RETURN_ERROR_IF(lim[0] > lim[1], MXFP8_ERR_INVALID_ARGUMENT,
                           "%s: config.gate_clamp_lower %g > gate_clamp_upper %g", fn, (double)lim[0], (double)lim[1]);
    MXFP8I_RETURN_ERROR_IF(lim[2] > lim[3], MXFP8_ERR_INVALID_ARGUMENT,
                           "%s: config.up_clamp_lower %g > up_clamp_upper %g", fn, (double)lim[2], (double)lim[3]);
    if (c->shard_option < 0 || c->shard_option > 2) /* hardware-only knobs are still validated */
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: config.shard_option %d is not 0, 1 or 2", fn,
                            c->shard_option);
    MXFP8I_RETURN_ERROR_IF(c->skip_token != 0 && c->skip_token != 1, MXFP8_ERR_INVALID_ARGUMENT,
                           "%s: config.skip_token %d is not 0 or 1", fn, c->skip_token);
    const int flag[6] = {
        c->skip_weight, c->accumulate_hidden_states_grad, c->skip_grad_initialization, c->single_expert_dense, c->bias,
        c->use_fast_dma};
    static const char *flag_nm[6] = {
        "skip_weight", "accumulate_hidden_states_grad", "skip_grad_initialization", "single_expert_dense", "bias",
        "use_fast_dma"};
    for (int i = 0; i < 6; i++) /* booleans are 0 or 1, not "any nonzero" */
        MXFP8I_RETURN_ERROR_IF(flag[i] != 0 && flag[i] != 1, MXFP8_ERR_INVALID_ARGUMENT,
                               "%s: config.%s %d is not 0 or 1", fn, flag_nm[i], flag[i]);
    const int mode[5] = {c->p3_transpose_mode, c->p4_transpose_mode, c->hidden_states_swizzle_mode,
                         c->output_grad_swizzle_mode, c->weight_swizzle_mode};
    static const char *mode_nm[5] = {"p3_transpose_mode", "p4_transpose_mode", "hidden_states_swizzle_mode",
                                     "output_grad_swizzle_mode", "weight_swizzle_mode"};
    for (int i = 0; i < 5; i++) /* hardware-only modes: validated, no effect on results */
        MXFP8I_RETURN_ERROR_IF(mode[i] < 0 || mode[i] > 2, MXFP8_ERR_INVALID_ARGUMENT,
                               "%s: config.%s %d is not 0, 1 or 2", fn, mode_nm[i], mode[i]);
    const mxfp8_matmul_config *ph[4] = {&c->phase1, &c->phase2, &c->phase3, &c->phase4};
    for (int i = 0; i < 4; i++) {
        char phname[32];
        snprintf(phname, sizeof phname, "config.phase%d", i + 1);
        mxfp8_status st = mxfp8i_check_config(fn, phname, ph[i]);
        if (st) return st;
        MXFP8I_RETURN_ERROR_IF(ph[i]->quant_scheme == MXFP8_GROUP_WRAPX, MXFP8_ERR_UNSUPPORTED,
                               "%s: config.phase%d.quant_scheme is wrapX; the MoE layer quantizes in 1x32 groups", fn,
                               i + 1); /* (its range: mxfp8i_check_config) */
    }
    return MXFP8_OK;
}

/* A weight: F32/BF16/F16, or FP8 codes of the config's format together with scales of the given shape. */
static mxfp8_status check_weight(const char *fn, const char *name, const mxfp8_tensor *w, const char *sname,
                                 const mxfp8_tensor *s, mxfp8_format fmt, int ndim, const int64_t *sshape,
                                 int *prequant) {
    *prequant = 0;
    if (mxfp8i_is_fp8_dtype(w->dtype) || w->dtype == MXFP8_DTYPE_U8) {
        MXFP8I_RETURN_ERROR_IF(w->dtype != MXFP8_DTYPE_U8 && w->dtype != mxfp8i_fmt_dtype(fmt), MXFP8_ERR_DTYPE,
                               "%s: %s holds %s codes but config.quant_dtype is %s", fn, name,
                               mxfp8_dtype_name(w->dtype), mxfp8_enum_name(MXFP8_ENUM_FORMAT, (int32_t)fmt));
        MXFP8I_RETURN_ERROR_IF(!present(s), MXFP8_ERR_NULL_POINTER, "%s: %s holds FP8 codes but %s is absent", fn, name,
                               sname);
        mxfp8_status st = mxfp8i_check_rank(fn, sname, s, ndim);
        if (st) return st;
        st = mxfp8i_check_dtype(fn, sname, s, 2, MXFP8_DTYPE_E8M0, MXFP8_DTYPE_U8);
        if (st) return st;
        for (int i = 0; i < ndim; i++)
            MXFP8I_RETURN_ERROR_IF(s->shape[i] != sshape[i], MXFP8_ERR_SHAPE_MISMATCH,
                                   "%s: %s has extent %lld in dimension %d, expected %lld", fn, sname,
                                   (long long)s->shape[i], i, (long long)sshape[i]);
        *prequant = 1;
        return MXFP8_OK;
    }
    MXFP8I_RETURN_ERROR_IF(!mxfp8i_is_float_dtype(w->dtype), MXFP8_ERR_DTYPE,
                           "%s: %s has dtype %s (expected f32, bf16, f16 or FP8 codes)", fn, name,
                           mxfp8_dtype_name(w->dtype));
    MXFP8I_RETURN_ERROR_IF(present(s), MXFP8_ERR_INVALID_ARGUMENT, "%s: %s is given but %s is not FP8 codes (%s)", fn,
                           sname, name, mxfp8_dtype_name(w->dtype));
    return MXFP8_OK;
}

static mxfp8_status check_dims(const char *fn, const char *name, const mxfp8_tensor *t, int ndim,
                               const int64_t *shape) {
    mxfp8_status st = mxfp8i_check_rank(fn, name, t, ndim);
    if (st) return st;
    for (int i = 0; i < ndim; i++)
        MXFP8I_RETURN_ERROR_IF(shape[i] >= 0 && t->shape[i] != shape[i], MXFP8_ERR_SHAPE_MISMATCH,
                               "%s: %s has extent %lld in dimension %d, expected %lld", fn, name,
                               (long long)t->shape[i], i, (long long)shape[i]);
    return MXFP8_OK;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Setup                                                                                                      */
/* ---------------------------------------------------------------------------------------------------------- */
/* Rows of the per-block workspaces: the longest prefix of a block that ends with a real position (at least 1, found
 * by the routing walk), so a block size far above the token count costs nothing; the forward's runs (p->Rw, set
 * before) are checked with them. */
static mxfp8_status set_workspace_rows(mxfp8i_moe *p, int64_t rows) {
    int64_t w;
    p->Bw = rows;
    if (!mxfp8i_mul_size(rows > p->Rw ? rows : p->Rw, p->H + 2 * p->I, &w) || w > INT64_MAX / 64) {
        return mxfp8i_error(MXFP8_ERR_SIZE_OVERFLOW, "%s: block workspace L*(H + 2I) overflows", p->fn);
    }
    return MXFP8_OK;
}

/* hidden_states [T, H] and the weights W1 [E, H, 2, I], W2 [E, I, H] (high precision, or codes with their scales
 * in the pass's layout); sets p->T, H, E, I and the pre-quantized flags. */
static mxfp8_status check_hidden_and_weights(const char *fn, const mxfp8i_moe_in *in, mxfp8i_moe *p) {
    const int bwd = p->bwd;
    /* X [T, H] */
    MXFP8I_RETURN_ERROR_IF(!in->X, MXFP8_ERR_NULL_POINTER, "%s: hidden_states is required", fn);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_rank(fn, "hidden_states", in->X, 2));
    MXFP8I_RETURN_ERROR_IF(!mxfp8i_is_float_dtype(in->X->dtype), MXFP8_ERR_DTYPE,
                           "%s: hidden_states has dtype %s (expected f32, bf16 or f16)", fn,
                           mxfp8_dtype_name(in->X->dtype));
    const int64_t T = in->X->shape[0], H = in->X->shape[1];
    p->T = T;
    p->H = H;
    MXFP8I_RETURN_ERROR_IF(H < 1, MXFP8_ERR_INVALID_ARGUMENT, "%s: hidden size H = %lld must be >= 1", fn,
                           (long long)H);

    /* W1 [E, H, 2, I], W2 [E, I, H] */
    MXFP8I_RETURN_ERROR_IF(!in->W1 || !in->W1->data, MXFP8_ERR_NULL_POINTER, "%s: gate_up_proj_weight is required", fn);
    MXFP8I_RETURN_ERROR_IF(!in->W2 || !in->W2->data, MXFP8_ERR_NULL_POINTER, "%s: down_proj_weight is required", fn);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_rank(fn, "gate_up_proj_weight", in->W1, 4));
    const int64_t E = in->W1->shape[0], I = in->W1->shape[3];
    p->E = E;
    p->I = I;
    MXFP8I_RETURN_ERROR_IF(E < 1, MXFP8_ERR_INVALID_ARGUMENT, "%s: number of experts E = %lld must be >= 1", fn,
                           (long long)E);
    MXFP8I_RETURN_ERROR_IF(I < 1, MXFP8_ERR_INVALID_ARGUMENT, "%s: intermediate size I = %lld must be >= 1", fn,
                           (long long)I);
    {
        /* Name both tensors when they disagree on a size (E and I are taken from gate_up_proj_weight, H from
           hidden_states): the message must not blame the one that happens to be checked second. */
        MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_rank(fn, "down_proj_weight", in->W2, 3));
        const struct {
            const mxfp8_tensor *t;
            int dim;
            int64_t want;
            const char *nm, *size, *from;
        } agree[] = {
            {in->W1, 1, H, "gate_up_proj_weight", "H", "hidden_states"},
            {in->W2, 0, E, "down_proj_weight", "E", "gate_up_proj_weight"},
            {in->W2, 1, I, "down_proj_weight", "I", "gate_up_proj_weight"},
            {in->W2, 2, H, "down_proj_weight", "H", "hidden_states"},
        };
        for (int k = 0; k < 4; k++)
            MXFP8I_RETURN_ERROR_IF(agree[k].t->shape[agree[k].dim] != agree[k].want, MXFP8_ERR_SHAPE_MISMATCH,
                                   "%s: %s has %s = %lld but %s has %s = %lld", fn, agree[k].from, agree[k].size,
                                   (long long)agree[k].want, agree[k].nm, agree[k].size,
                                   (long long)agree[k].t->shape[agree[k].dim]);
        const int64_t s1[4] = {E, H, 2, I}, s2[3] = {E, I, H};
        MXFP8I_FORWARD_IF_ERROR(check_dims(fn, "gate_up_proj_weight", in->W1, 4, s1));
        MXFP8I_FORWARD_IF_ERROR(check_dims(fn, "down_proj_weight", in->W2, 3, s2));
    }
    const int64_t GH = mxfp8i_moe_groups(H), GI = mxfp8i_moe_groups(I), G2I = mxfp8i_moe_groups(2 * I);
    {
        const int64_t s1b[3] = {E, H, G2I}, s1f[4] = {E, GH, 2, I}, s2b[3] = {E, I, GH}, s2f[3] = {E, GI, H};
        MXFP8I_FORWARD_IF_ERROR(check_weight(fn, "gate_up_proj_weight", in->W1, "gate_up_weight_scales", in->W1s,
                                             p->rc.fmt, bwd ? 3 : 4, bwd ? s1b : s1f, &p->w1_prequant));
        MXFP8I_FORWARD_IF_ERROR(check_weight(fn, "down_proj_weight", in->W2, "down_weight_scales", in->W2s,
                                             p->rc.fmt, 3, bwd ? s2b : s2f, &p->w2_prequant));
    }

    return MXFP8_OK;
}

/* expert_affinities_masked [T*E], dY [T, H] (backward), block_size, num_valid_tokens, biases; sets p->B, p->V. */
static mxfp8_status check_side_inputs(const char *fn, const mxfp8i_moe_in *in, mxfp8i_moe *p) {
    const mxfp8_moe_config *c = &p->cfg;
    const int bwd = p->bwd;
    const int64_t T = p->T, H = p->H, E = p->E, I = p->I;
    /* a [T*E, 1] */
    int64_t TE;
    MXFP8I_RETURN_ERROR_IF(!mxfp8i_mul_size(T, E, &TE), MXFP8_ERR_SIZE_OVERFLOW, "%s: T*E overflows", fn);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_check_vec(fn, "expert_affinities_masked", in->a, 0, TE));

    /* dY [T, H] */
    if (bwd) {
        const int64_t sy[2] = {T, H};
        MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_check_tensor(fn, "output_hidden_states_grad", in->dY, 1, 0, 2, sy));
    }

    /* block size, num_valid_tokens */
    const int64_t B = in->B;
    p->B = B;
    MXFP8I_RETURN_ERROR_IF(B < 1, MXFP8_ERR_INVALID_ARGUMENT, "%s: block_size %lld must be >= 1", fn, (long long)B);
    int64_t V = T;
    if (present(in->nvt)) {
        MXFP8I_RETURN_ERROR_IF(!c->single_expert_dense, MXFP8_ERR_INVALID_ARGUMENT,
                               "%s: num_valid_tokens requires config.single_expert_dense = 1", fn);
        MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_view(fn, "num_valid_tokens", in->nvt));
        MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_dtype(fn, "num_valid_tokens", in->nvt, 1, MXFP8_DTYPE_I32));
        MXFP8I_RETURN_ERROR_IF(mxfp8_tensor_numel(in->nvt) != 1, MXFP8_ERR_SHAPE_MISMATCH,
                               "%s: num_valid_tokens must hold exactly one value (has %lld)", fn,
                               (long long)mxfp8_tensor_numel(in->nvt));
        int32_t v = *(const int32_t *)in->nvt->data;
        MXFP8I_RETURN_ERROR_IF(v < 0, MXFP8_ERR_INVALID_ARGUMENT, "%s: num_valid_tokens = %d is negative", fn, (int)v);
        MXFP8I_RETURN_ERROR_IF(c->bias, MXFP8_ERR_UNSUPPORTED, "%s: num_valid_tokens is unsupported together with bias",
                               fn);
        V = v < T ? v : T;
    }

    /* biases */
    if (!c->bias) {
        MXFP8I_RETURN_ERROR_IF(present(in->b1), MXFP8_ERR_INVALID_ARGUMENT,
                               "%s: gate_and_up_proj_bias is given but config.bias is 0", fn);
        MXFP8I_RETURN_ERROR_IF(present(in->b2), MXFP8_ERR_INVALID_ARGUMENT,
                               "%s: down_proj_bias is given but config.bias is 0", fn);
    } else {
        const int64_t s1[3] = {E, 2, I}, s2[2] = {E, H};
        MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_check_tensor(fn, "gate_and_up_proj_bias", in->b1, 0, 0, 3, s1));
        MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_check_tensor(fn, "down_proj_bias", in->b2, 0, 0, 2, s2));
    }

    p->V = V;
    return MXFP8_OK;
}

/* The routing tensors' shapes (or the identity routing of single_expert_dense); sets p->N. */
static mxfp8_status check_routing_shapes(const char *fn, const mxfp8i_moe_in *in, mxfp8i_moe *p) {
    const mxfp8_moe_config *c = &p->cfg;
    const int64_t T = p->T, E = p->E, B = p->B;
    int64_t N;
    if (c->single_expert_dense) {
        MXFP8I_RETURN_ERROR_IF(E != 1, MXFP8_ERR_INVALID_ARGUMENT,
                               "%s: config.single_expert_dense needs E = 1 expert (gate_up_proj_weight has E = %lld)",
                               fn, (long long)E);
        N = mxfp8i_ceil_div(T, B);
    } else {
        MXFP8I_RETURN_ERROR_IF(!present(in->tok), MXFP8_ERR_NULL_POINTER, "%s: token_position_to_id is required", fn);
        MXFP8I_RETURN_ERROR_IF(!present(in->b2e), MXFP8_ERR_NULL_POINTER, "%s: block_to_expert is required", fn);
        MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_rank(fn, "token_position_to_id", in->tok, 1));
        MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_dtype(fn, "token_position_to_id", in->tok, 1, MXFP8_DTYPE_I32));
        MXFP8I_RETURN_ERROR_IF(in->tok->shape[0] % B, MXFP8_ERR_SHAPE_MISMATCH,
                               "%s: token_position_to_id has %lld positions, not a multiple of block_size %lld", fn,
                               (long long)in->tok->shape[0], (long long)B);
        N = in->tok->shape[0] / B;
        MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_view(fn, "block_to_expert", in->b2e));
        MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_dtype(fn, "block_to_expert", in->b2e, 1, MXFP8_DTYPE_I32));
        MXFP8I_RETURN_ERROR_IF(!(in->b2e->ndim == 1 || (in->b2e->ndim == 2 && in->b2e->shape[1] == 1)) ||
                                   in->b2e->shape[0] != N,
                               MXFP8_ERR_SHAPE_MISMATCH,
                               "%s: block_to_expert must be [N] or [N, 1] with N = %lld blocks (token_position_to_id "
                               "has N*B = %lld positions)",
                               fn, (long long)N, (long long)in->tok->shape[0]);
    }
    int64_t NB;
    MXFP8I_RETURN_ERROR_IF(!mxfp8i_mul_size(N, B, &NB) || NB > INT64_MAX / 8, MXFP8_ERR_SIZE_OVERFLOW,
                           "%s: N*B overflows", fn);

    p->N = N;
    return MXFP8_OK;
}

/* The length of block n (its last real position + 1, 0 for a block of padding) read from the checked inputs, as
 * the routing table will hold it: pad is the padding id (dense mode: positions below V are real). */
static int64_t input_block_len(const mxfp8i_moe_in *in, const mxfp8i_moe *p, int64_t n, int32_t pad) {
    const int64_t B = p->B;
    if (p->cfg.single_expert_dense) {
        const int64_t L = p->V - n * B;
        return L < 0 ? 0 : L > B ? B : L;
    }
    const int32_t *tk = (const int32_t *)in->tok->data;
    for (int64_t q = B; q > 0; q--) {
        const int32_t t = tk[(n * B + q - 1) * in->tok->strides[0]];
        if (t != pad && t < p->V) return q;
    }
    return 0;
}

/* p->Rw: the forward's longest run of blocks (mxfp8i_moe_run_joins; a block alone is a run, so Rw >= Bw). */
static void run_rows(const mxfp8i_moe_in *in, mxfp8i_moe *p, int32_t pad) {
    const int32_t *be = p->cfg.single_expert_dense ? NULL : (const int32_t *)in->b2e->data;
    p->Rw = 1;
    int64_t blocks = 0, rows = 0, e = -1, L = 0;
    for (int64_t n = 0; n < p->N; n++) {
        const int64_t en = be ? be[n * in->b2e->strides[0]] : 0, Ln = input_block_len(in, p, n, pad);
        if (blocks > 0 && mxfp8i_moe_run_joins(p, blocks, e, L, en, Ln)) blocks++;
        else blocks = 1;
        rows = (blocks - 1) * p->B + Ln; /* the stacked positions, as the drivers count them */
        e = en, L = Ln;
        if (rows > p->Rw) p->Rw = rows;
    }
}

/* p->Re, p->Se from the checked routing, nothing stored: per-expert sums on the stack for E <= 1024, else one pass
 * over the blocks per expert; then p->Rw. */
enum { EXTENT_STACK = 1024 };
static void expert_extents(const mxfp8i_moe_in *in, mxfp8i_moe *p, int32_t pad) {
    run_rows(in, p, pad);
    const int64_t N = p->N, E = p->cfg.single_expert_dense ? 1 : p->E;
    const int32_t *be = p->cfg.single_expert_dense ? NULL : (const int32_t *)in->b2e->data;
    p->Re = p->Se = 0;
    if (E <= EXTENT_STACK) {
        int64_t r[EXTENT_STACK] = {0}, s[EXTENT_STACK] = {0};
        for (int64_t n = 0; n < N; n++) {
            const int64_t e = be ? be[n * in->b2e->strides[0]] : 0, L = input_block_len(in, p, n, pad);
            if (L > 0) r[e] += L, s[e]++;
        }
        for (int64_t e = 0; e < E; e++) {
            if (r[e] > p->Re) p->Re = r[e];
            if (s[e] > p->Se) p->Se = s[e];
        }
        return;
    }
    for (int64_t e = 0; e < E; e++) {
        int64_t r = 0, s = 0;
        for (int64_t n = 0; n < N; n++) {
            if (be[n * in->b2e->strides[0]] != e) continue;
            const int64_t L = input_block_len(in, p, n, pad);
            if (L > 0) r += L, s++;
        }
        if (r > p->Re) p->Re = r;
        if (s > p->Se) p->Se = s;
    }
}

/* The routing walk: every token and expert id checked, in position order, and the block rows p->Bw (the longest
 * block prefix that ends with a real position). With tok / expert not NULL it also writes the flat routing table
 * tok[n*B + q] (a token id in [0, V) or -1) and expert[n]; the validation walks with NULL (nothing stored). */
static mxfp8_status walk_routing(const char *fn, const mxfp8i_moe_in *in, mxfp8i_moe *p, int32_t *tok,
                                 int32_t *expert) {
    const mxfp8_moe_config *c = &p->cfg;
    const int64_t T = p->T, E = p->E, N = p->N, V = p->V, B = p->B, NB = N * B;
    int64_t rows = 1;
    if (c->single_expert_dense) {
        for (int64_t i = 0; i < NB; i++) {
            const int32_t t = i < V ? (int32_t)i : -1;
            if (tok) tok[i] = t;
            if (t >= 0 && i % B + 1 > rows) rows = i % B + 1;
        }
        if (expert)
            for (int64_t n = 0; n < N; n++) expert[n] = 0;
        expert_extents(in, p, -1);
        return set_workspace_rows(p, rows);
    }
    const int32_t pad = c->skip_token ? -1 : (int32_t)(T > INT32_MAX ? INT32_MAX : T);
    if (T > INT32_MAX - 1) {
        return mxfp8i_error(MXFP8_ERR_SIZE_OVERFLOW, "%s: T = %lld does not fit int32 token ids", fn, (long long)T);
    }
    const int32_t *tk = (const int32_t *)in->tok->data;
    for (int64_t i = 0; i < NB; i++) {
        int32_t t = tk[i * in->tok->strides[0]], m;
        if (t == pad) {
            m = -1;
        } else if (t < 0 || t >= T) {
            return mxfp8i_error(MXFP8_ERR_INDEX_OUT_OF_RANGE,
                                "%s: token_position_to_id[%lld] = %d is out of range: valid are [0, T = %lld) and the "
                                "padding id %d (config.skip_token = %d)",
                                fn, (long long)i, (int)t, (long long)T, (int)pad, c->skip_token ? 1 : 0);
        } else {
            m = t < V ? t : -1;
        }
        if (tok) tok[i] = m;
        if (m >= 0 && i % B + 1 > rows) rows = i % B + 1;
    }
    const int32_t *be = (const int32_t *)in->b2e->data;
    for (int64_t n = 0; n < N; n++) {
        int32_t e = be[n * in->b2e->strides[0]];
        if (e < 0 || e >= E) {
            return mxfp8i_error(MXFP8_ERR_INDEX_OUT_OF_RANGE,
                                "%s: block_to_expert[%lld] = %d is out of range [0, E = %lld)", fn, (long long)n,
                                (int)e, (long long)E);
        }
        if (expert) expert[n] = e;
    }
    expert_extents(in, p, pad);
    return set_workspace_rows(p, rows);
}

static size_t table_bytes(int64_t n) { return (size_t)(n > 0 ? n : 1) * sizeof(int32_t); }

mxfp8_status mxfp8i_moe_table_reserve(const mxfp8i_moe *p) {
    MXFP8I_RETURN_ERROR_IF(!mxfp8i_ws_get(MXFP8I_WS_MOE_TOK, table_bytes(p->N * p->B)) ||
                               !mxfp8i_ws_get(MXFP8I_WS_MOE_EXPERT, table_bytes(p->N)),
                           MXFP8_ERR_OUT_OF_MEMORY, "%s: cannot allocate the routing table (%lld positions)", p->fn,
                           (long long)(p->N * p->B));
    return MXFP8_OK;
}

mxfp8_status mxfp8i_moe_table(const mxfp8i_moe_in *in, mxfp8i_moe *p) {
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_table_reserve(p));
    p->tok = (int32_t *)mxfp8i_ws_get(MXFP8I_WS_MOE_TOK, table_bytes(p->N * p->B));
    p->expert = (int32_t *)mxfp8i_ws_get(MXFP8I_WS_MOE_EXPERT, table_bytes(p->N));
    return walk_routing(p->fn, in, p, p->tok, p->expert);
}

mxfp8_status mxfp8i_moe_check(const char *fn, const mxfp8i_moe_in *in, int bwd, mxfp8i_moe *p) {
    memset(p, 0, sizeof *p);
    p->fn = fn;
    p->bwd = bwd;
    if (in->cfg) p->cfg = *in->cfg;
    else mxfp8_moe_config_init(&p->cfg);
    MXFP8I_FORWARD_IF_ERROR(check_config(fn, &p->cfg));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_numerics_config(fn, &p->cfg)); /* numerics.c: gpt-oss limits, rounding */
    p->rc = mxfp8i_recipe_make(p->cfg.quant_dtype, p->cfg.scale_rule, MXFP8_GROUP_1X32); /* the GEMM operands' */
    MXFP8I_FORWARD_IF_ERROR(check_hidden_and_weights(fn, in, p));
    MXFP8I_FORWARD_IF_ERROR(check_side_inputs(fn, in, p));
    MXFP8I_FORWARD_IF_ERROR(check_routing_shapes(fn, in, p));
    p->Bw = p->Rw = 1; /* set by the routing walk below: the longest block prefix that holds a real position */
    p->X = *in->X;
    p->a = *in->a;
    p->W1 = *in->W1;
    p->W2 = *in->W2;
    const mxfp8_moe_config *c = &p->cfg;
    if (c->bias && present(in->b1)) p->b1 = *in->b1;
    if (c->bias && present(in->b2)) p->b2 = *in->b2;
    if (p->w1_prequant) p->W1s = *in->W1s;
    if (p->w2_prequant) p->W2s = *in->W2s;
    if (bwd) p->dY = *in->dY;

    /* reads every id before any output is written (nothing stored: the table comes with the call's workspace) */
    return walk_routing(fn, in, p, NULL, NULL);
}

mxfp8_status mxfp8i_moe_setup(const char *fn, const mxfp8i_moe_in *in, int bwd, mxfp8i_moe *p) {
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_check(fn, in, bwd, p));
    return mxfp8i_moe_table(in, p);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Outputs                                                                                                    */
/* ---------------------------------------------------------------------------------------------------------- */
void mxfp8i_moe_in_fwd(const mxfp8_moe_fwd_args *a, mxfp8i_moe_in *in) {
    memset(in, 0, sizeof *in);
    MXFP8I_MOE_IN_COMMON(in, a);
    in->dY = NULL;
}

#define NUM_IN 11
static void in_list(const mxfp8i_moe_in *in, const mxfp8_tensor *v[NUM_IN + 1], const char *names[NUM_IN + 1]) {
    const mxfp8_tensor *t[NUM_IN + 1] = {in->X,  in->a,  in->W1,  in->W2,  in->tok, in->b2e,
                                         in->b1, in->b2, in->W1s, in->W2s, in->nvt, in->dY};
    const char *n[NUM_IN + 1] = {"hidden_states",         "expert_affinities_masked", "gate_up_proj_weight",
                                 "down_proj_weight",      "token_position_to_id",     "block_to_expert",
                                 "gate_and_up_proj_bias", "down_proj_bias",           "gate_up_weight_scales",
                                 "down_weight_scales",    "num_valid_tokens",         "output_hidden_states_grad"};
    for (int i = 0; i <= NUM_IN; i++) {
        v[i] = t[i];
        names[i] = n[i];
    }
}

mxfp8_status mxfp8i_moe_check_outputs_alias(const char *fn, const mxfp8i_moe_in *in, int n,
                                            const mxfp8_tensor *const *outs, const char *const *onames,
                                            const mxfp8_tensor *const *extra, const char *const *enames, int nextra) {
    const mxfp8_tensor *v[NUM_IN + 1];
    const char *names[NUM_IN + 1];
    in_list(in, v, names);
    mxfp8_status st;
    for (int i = 0; i < n; i++) {
        /* an output's elements must be distinct (else threads race on them) */
        if (outs[i]->data && (st = mxfp8i_check_distinct(fn, onames[i], outs[i]))) return st;
        MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_check_alias(fn, onames[i], outs[i], NUM_IN + 1, v, names));
        MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_check_alias(fn, onames[i], outs[i], nextra, extra, enames));
        for (int j = i + 1; j < n; j++)
            MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_check_alias(fn, onames[i], outs[i], 1, &outs[j], &onames[j]));
    }
    return MXFP8_OK;
}

mxfp8_status mxfp8i_moe_check_fwd_outputs(const mxfp8i_moe *p, const mxfp8i_moe_in *in, const mxfp8_moe_fwd_outputs *o,
                                          int allow_f64) {
    const char *fn = p->fn;
    const int64_t sy[2] = {p->T, p->H}, sgu[4] = {p->N, 2, p->I, p->B}, si[3] = {p->N, p->I, p->B},
                  sd[3] = {p->N, p->B, p->H};
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_check_tensor(fn, "output", &o->output, 1, allow_f64, 2, sy));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_check_tensor(fn, "gate_up_proj_act_checkpoint_T",
                                                    &o->gate_up_proj_act_checkpoint_T, 0, allow_f64, 4, sgu));
    MXFP8I_FORWARD_IF_ERROR(
        mxfp8i_moe_check_tensor(fn, "gate_act_checkpoint_T", &o->gate_act_checkpoint_T, 0, allow_f64, 3, si));
    MXFP8I_FORWARD_IF_ERROR(
        mxfp8i_moe_check_tensor(fn, "intermediate_checkpoint_T", &o->intermediate_checkpoint_T, 0, allow_f64, 3, si));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_check_tensor(fn, "scaled_intermediate_checkpoint_T",
                                                    &o->scaled_intermediate_checkpoint_T, 0, allow_f64, 3, si));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_check_tensor(fn, "down_proj_output_checkpoint", &o->down_proj_output_checkpoint,
                                                    0, allow_f64, 3, sd));
    const mxfp8_tensor *outs[6] = {&o->output,
                                   &o->gate_up_proj_act_checkpoint_T,
                                   &o->gate_act_checkpoint_T,
                                   &o->intermediate_checkpoint_T,
                                   &o->scaled_intermediate_checkpoint_T,
                                   &o->down_proj_output_checkpoint};
    const char *on[6] = {"output",
                         "gate_up_proj_act_checkpoint_T",
                         "gate_act_checkpoint_T",
                         "intermediate_checkpoint_T",
                         "scaled_intermediate_checkpoint_T",
                         "down_proj_output_checkpoint"};
    return mxfp8i_moe_check_outputs_alias(fn, in, 6, outs, on, NULL, NULL, 0);
}

void mxfp8i_moe_in_bwd(const mxfp8_moe_bwd_args *a, mxfp8i_moe_in *in) {
    memset(in, 0, sizeof *in);
    MXFP8I_MOE_IN_COMMON(in, a);
    in->dY = &a->output_hidden_states_grad;
}

mxfp8_status mxfp8i_moe_check_bwd_grads(const mxfp8i_moe *p, const mxfp8i_moe_in *in, const mxfp8_moe_bwd_args *args,
                                        const mxfp8_moe_bwd_grads *g, int allow_f64) {
    const char *fn = p->fn;
    const int64_t N = p->N, B = p->B, H = p->H, I = p->I, E = p->E;
    /* checkpoints (inputs) */
    const int64_t sgu[4] = {N, 2, I, B}, si[3] = {N, I, B}, sd[3] = {N, B, H};
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_check_tensor(fn, "gate_up_proj_act_checkpoint_T",
                                                    &args->gate_up_proj_act_checkpoint_T, 0, 0, 4, sgu));
    MXFP8I_FORWARD_IF_ERROR(
        mxfp8i_moe_check_tensor(fn, "gate_act_checkpoint_T", &args->gate_act_checkpoint_T, 0, 0, 3, si));
    MXFP8I_FORWARD_IF_ERROR(
        mxfp8i_moe_check_tensor(fn, "intermediate_checkpoint_T", &args->intermediate_checkpoint_T, 0, 0, 3, si));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_check_tensor(fn, "scaled_intermediate_checkpoint_T",
                                                    &args->scaled_intermediate_checkpoint_T, 0, 0, 3, si));
    MXFP8I_FORWARD_IF_ERROR(
        mxfp8i_moe_check_tensor(fn, "down_proj_act_checkpoint", &args->down_proj_act_checkpoint, 0, 0, 3, sd));
    MXFP8I_FORWARD_IF_ERROR(
        mxfp8i_moe_check_tensor(fn, "down_proj_output_checkpoint", &args->down_proj_output_checkpoint, 0, 0, 3, sd));
    MXFP8I_RETURN_ERROR_IF(args->num_valid_tokens.data && args->scaled_intermediate_checkpoint_T.data,
                           MXFP8_ERR_UNSUPPORTED,
                           "%s: num_valid_tokens is unsupported together with scaled_intermediate_checkpoint_T", fn);
    /* gradients */
    const int64_t sy[2] = {p->T, H}, s1[4] = {E, H, 2, I}, s2[3] = {E, I, H}, sb1[3] = {E, 2, I}, sb2[2] = {E, H};
    MXFP8I_FORWARD_IF_ERROR(
        mxfp8i_moe_check_tensor(fn, "hidden_states_grad", &g->hidden_states_grad, 1, allow_f64, 2, sy));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_check_vec(fn, "expert_affinities_masked_grad", &g->expert_affinities_masked_grad,
                                                 allow_f64, p->T * E));
    MXFP8I_FORWARD_IF_ERROR(
        mxfp8i_moe_check_tensor(fn, "gate_up_proj_weight_grad", &g->gate_up_proj_weight_grad, 1, allow_f64, 4, s1));
    MXFP8I_FORWARD_IF_ERROR(
        mxfp8i_moe_check_tensor(fn, "down_proj_weight_grad", &g->down_proj_weight_grad, 1, allow_f64, 3, s2));
    if (p->cfg.bias) {
        MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_check_tensor(fn, "gate_and_up_proj_bias_grad",
                                                        &g->gate_and_up_proj_bias_grad, 1, allow_f64, 3, sb1));
        MXFP8I_FORWARD_IF_ERROR(
            mxfp8i_moe_check_tensor(fn, "down_proj_bias_grad", &g->down_proj_bias_grad, 1, allow_f64, 2, sb2));
    } else if (g->gate_and_up_proj_bias_grad.data || g->down_proj_bias_grad.data) {
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: a bias gradient is given but config.bias is 0", fn);
    }
    const mxfp8_tensor *outs[6] = {&g->hidden_states_grad,         &g->expert_affinities_masked_grad,
                                   &g->gate_up_proj_weight_grad,   &g->down_proj_weight_grad,
                                   &g->gate_and_up_proj_bias_grad, &g->down_proj_bias_grad};
    const char *on[6] = {"hidden_states_grad",    "expert_affinities_masked_grad", "gate_up_proj_weight_grad",
                         "down_proj_weight_grad", "gate_and_up_proj_bias_grad",    "down_proj_bias_grad"};
    const mxfp8_tensor *ex[6] = {&args->gate_up_proj_act_checkpoint_T, &args->gate_act_checkpoint_T,
                                 &args->intermediate_checkpoint_T,     &args->scaled_intermediate_checkpoint_T,
                                 &args->down_proj_act_checkpoint,      &args->down_proj_output_checkpoint};
    const char *en[6] = {"gate_up_proj_act_checkpoint_T",    "gate_act_checkpoint_T",    "intermediate_checkpoint_T",
                         "scaled_intermediate_checkpoint_T", "down_proj_act_checkpoint", "down_proj_output_checkpoint"};
    return mxfp8i_moe_check_outputs_alias(fn, in, 6, outs, on, ex, en, 6);
}
