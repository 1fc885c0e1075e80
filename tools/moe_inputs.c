/*
 * moe_inputs.c -- the inputs of `mxfp8 moe-bwd`: a .safetensors bundle with the NKI parameter names, or the random
 * upstream-style problem: W1, W2 ~ U(-0.1, 0.1), X ~ U(0, 1), dY ~ U(-1, 1), all rounded to BF16; each token draws
 * TopK distinct experts (without replacement) and an affinity U(0, 1) per routed pair; routing by mxfp8_moe_route
 * (padding id -1).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe_job.h"

const char *const k_moe_bundle_names[] = {
    "hidden_states", "gate_up_proj_weight", "down_proj_weight", "output_hidden_states_grad",
    "token_position_to_id", "block_to_expert", "expert_affinities_masked", "topk_ids", "topk_weights",
    "gate_up_proj_act_checkpoint_T", "gate_act_checkpoint_T", "intermediate_checkpoint_T",
    "scaled_intermediate_checkpoint_T", "down_proj_act_checkpoint", "down_proj_output_checkpoint",
    "gate_and_up_proj_bias", "down_proj_bias", "gate_up_weight_scales", "down_weight_scales", "num_valid_tokens"};
const int k_moe_bundle_count = (int)(sizeof k_moe_bundle_names / sizeof k_moe_bundle_names[0]);

/* A float tensor of the bundle as BF16/F16/F32 (F64 rounded to F32). */
static int bundle_float(const char *cmd, const char *path, tf_tensor *t, int allow_codes) {
    char err[TF_ERR_LEN];
    if (t->dtype == TF_F64 && tf_to_f32(t, err, sizeof err)) return cli_error(cmd, "%s", err);
    if (t->dtype == TF_F32 || t->dtype == TF_BF16 || t->dtype == TF_F16) return CLI_OK;
    if (allow_codes && (t->dtype == TF_F8_E4M3 || t->dtype == TF_F8_E5M2 || t->dtype == TF_U8)) return CLI_OK;
    return cli_error(cmd, "%s: '%s' has dtype %s; F32, BF16 or F16 is needed%s", path, t->name,
                     tf_dtype_name(t->dtype), allow_codes ? " (or FP8 codes with their scales)" : "");
}

static int bundle_int(const char *cmd, tf_tensor *t) {
    char err[TF_ERR_LEN];
    if (tf_to_i32(t, err, sizeof err)) return cli_error(cmd, "%s", err);
    return CLI_OK;
}

/* Route topk_ids + topk_weights of the bundle with mxfp8_moe_route. */
static int route_topk(moe_job *j, tf_tensor *ids, tf_tensor *wts) {
    const char *cmd = j->cmd, *path = j->in_path;
    char err[TF_ERR_LEN], sb[160];
    if (j->tpi || j->b2e || j->ea)
        return cli_error(cmd, "%s: give routing either as topk_ids + topk_weights or as token_position_to_id + "
                         "block_to_expert + expert_affinities_masked, not both", path);
    if (bundle_int(cmd, ids) || bundle_float(cmd, path, wts, 0)) return CLI_USAGE;
    if (ids->ndim != 2)
        return cli_error(cmd, "%s: topk_ids must be [T, K], got %s", path, tf_shape_str(ids->ndim, ids->shape, sb, 160));
    j->TOPK = ids->shape[1];
    if (!j->block_size) {
        tf_tensor *ck = tf_find(&j->in, "gate_up_proj_act_checkpoint_T");
        if (ck && ck->ndim == 4) j->block_size = ck->shape[3];
    }
    if (!j->block_size) return cli_error(cmd, "%s: routing from topk_ids needs --block-size B", path);
    j->B = j->block_size;
    mxfp8_status st = mxfp8_moe_num_blocks(j->T, j->TOPK, j->E, j->B, &j->N);
    if (st) return cli_lib_error(cmd, "mxfp8_moe_num_blocks", st);
    int64_t s_tpi[1] = {j->N * j->B}, s_b2e[2] = {j->N, 1}, s_ea[2] = {j->T * j->E, 1};
    if (!(j->tpi = tf_add_new(&j->work, "token_position_to_id", TF_I32, 1, s_tpi, err, sizeof err)) ||
        !(j->b2e = tf_add_new(&j->work, "block_to_expert", TF_I32, 2, s_b2e, err, sizeof err)) ||
        !(j->ea = tf_add_new(&j->work, "expert_affinities_masked", j->x->dtype, 2, s_ea, err, sizeof err)))
        return cli_error(cmd, "%s", err);
    mxfp8_tensor vi = tf_view(ids), vw = tf_view(wts), vt = tf_view(j->tpi), vb = tf_view(j->b2e), va = tf_view(j->ea);
    if ((st = mxfp8_moe_route(&vi, &vw, j->E, j->B, -1, &vt, &vb, &va))) return cli_lib_error(cmd, "mxfp8_moe_route", st);
    j->routed_topk = 1;
    return CLI_OK;
}

/* Explicit routing of the bundle (or the dense mode): block size and padding convention. */
static int explicit_routing(moe_job *j) {
    const char *cmd = j->cmd, *path = j->in_path;
    if (j->cfg.single_expert_dense) {
        if (!j->ea) return cli_error(cmd, "%s: needs expert_affinities_masked", path);
        if (!j->block_size) return cli_error(cmd, "%s: --single-expert-dense needs --block-size B", path);
        j->B = j->block_size;
        j->N = (j->T + j->B - 1) / j->B;
        return CLI_OK;
    }
    if (!j->tpi || !j->b2e || !j->ea)
        return cli_error(cmd, "%s: needs routing: token_position_to_id + block_to_expert + expert_affinities_masked, "
                         "or topk_ids + topk_weights", path);
    if (bundle_int(cmd, j->tpi) || bundle_int(cmd, j->b2e)) return CLI_USAGE;
    j->N = j->b2e->ndim >= 1 ? j->b2e->shape[0] : 0;
    const int inferable = j->N > 0 && j->tpi->numel % j->N == 0 && j->tpi->numel > 0;
    if (j->block_size && inferable && j->tpi->numel / j->N != j->block_size)
        return cli_error(cmd, "%s: --block-size %lld contradicts the bundle's routing: token_position_to_id has %lld "
                         "positions for block_to_expert's %lld blocks, block size %lld (leave --block-size out)",
                         path, (long long)j->block_size, (long long)j->tpi->numel, (long long)j->N,
                         (long long)(j->tpi->numel / j->N));
    if (j->block_size) j->B = j->block_size;
    else if (inferable) j->B = j->tpi->numel / j->N;
    else
        return cli_error(cmd, "%s: cannot infer the block size from token_position_to_id (%lld) and block_to_expert "
                         "(%lld blocks); give --block-size", path, (long long)j->tpi->numel, (long long)j->N);
    /* Padding convention: id T means the zero-row convention (skip_token off). */
    const int32_t *ip = j->tpi->data;
    for (int64_t i = 0; i < j->tpi->numel; i++)
        if (ip[i] == j->T) {
            j->cfg.skip_token = 0;
            break;
        }
    return CLI_OK;
}

/* Checkpoints, biases, pre-quantized weight scales, num_valid_tokens. */
static int optional_tensors(moe_job *j, tf_tensor *w1s, tf_tensor *w2s) {
    mxfp8_moe_bwd_args *ba = &j->ba;
    struct {
        const char *name;
        mxfp8_tensor *slot;
        int is_int;
    } optional[] = {
        {"gate_up_proj_act_checkpoint_T", &ba->gate_up_proj_act_checkpoint_T, 0},
        {"gate_act_checkpoint_T", &ba->gate_act_checkpoint_T, 0},
        {"intermediate_checkpoint_T", &ba->intermediate_checkpoint_T, 0},
        {"scaled_intermediate_checkpoint_T", &ba->scaled_intermediate_checkpoint_T, 0},
        {"down_proj_act_checkpoint", &ba->down_proj_act_checkpoint, 0},
        {"down_proj_output_checkpoint", &ba->down_proj_output_checkpoint, 0},
        {"gate_and_up_proj_bias", &ba->gate_and_up_proj_bias, 0},
        {"down_proj_bias", &ba->down_proj_bias, 0},
        {"num_valid_tokens", &ba->num_valid_tokens, 1},
    };
    for (size_t i = 0; i < sizeof optional / sizeof optional[0]; i++) {
        tf_tensor *t = tf_find(&j->in, optional[i].name);
        if (!t) continue;
        if (optional[i].is_int ? bundle_int(j->cmd, t) : bundle_float(j->cmd, j->in_path, t, 0)) return CLI_USAGE;
        *optional[i].slot = tf_view(t);
    }
    if (ba->gate_and_up_proj_bias.data || ba->down_proj_bias.data) j->cfg.bias = 1;
    if (w1s) ba->gate_up_weight_scales = tf_view(w1s);
    if (w2s) ba->down_weight_scales = tf_view(w2s);
    if ((w1s || w2s) && !j->f8_given) {
        tf_tensor *codes = w1s ? j->w1 : j->w2;
        if (codes->dtype == TF_F8_E5M2) j->cfg.quant_dtype = MXFP8_FMT_E5M2;
    }
    char err[TF_ERR_LEN];
    if (j->out_path && tf_check_writable(j->out_path, 4 + (j->cfg.bias ? 2 : 0), err, sizeof err))
        return cli_error(j->cmd, "%s", err);
    return CLI_OK;
}

int moe_load_bundle(moe_job *j) {
    const char *cmd = j->cmd, *path = j->in_path;
    char err[TF_ERR_LEN];
    if (tf_load(path, &j->in, err, sizeof err) ||
        tf_check_names(&j->in, path, k_moe_bundle_names, k_moe_bundle_count, err, sizeof err))
        return cli_error(cmd, "%s", err);
    for (int i = 0; i < 4; i++)
        if (!tf_find(&j->in, k_moe_bundle_names[i]))
            return cli_error(cmd, "%s: the bundle has no tensor '%s' (see mxfp8 moe-bwd --help)", path,
                             k_moe_bundle_names[i]);
    j->x = tf_find(&j->in, "hidden_states");
    j->w1 = tf_find(&j->in, "gate_up_proj_weight");
    j->w2 = tf_find(&j->in, "down_proj_weight");
    j->dy = tf_find(&j->in, "output_hidden_states_grad");
    tf_tensor *w1s = tf_find(&j->in, "gate_up_weight_scales"), *w2s = tf_find(&j->in, "down_weight_scales");
    j->x_f64 = j->x->dtype == TF_F64;
    if (bundle_float(cmd, path, j->x, 0) || bundle_float(cmd, path, j->dy, 0) ||
        bundle_float(cmd, path, j->w1, w1s != NULL) || bundle_float(cmd, path, j->w2, w2s != NULL))
        return CLI_USAGE;
    if (j->x->ndim != 2 || j->w1->ndim != 4 || j->w2->ndim != 3)
        return cli_error(cmd, "%s: needs hidden_states [T, H], gate_up_proj_weight [E, H, 2, I], down_proj_weight "
                         "[E, I, H]", path);
    j->T = j->x->shape[0];
    j->H = j->x->shape[1];
    j->E = j->w1->shape[0];
    j->I = j->w1->shape[3];
    tf_tensor *ids = tf_find(&j->in, "topk_ids"), *wts = tf_find(&j->in, "topk_weights");
    j->tpi = tf_find(&j->in, "token_position_to_id");
    j->b2e = tf_find(&j->in, "block_to_expert");
    j->ea = tf_find(&j->in, "expert_affinities_masked");
    if (ids || wts) {
        if (!ids || !wts) return cli_error(cmd, "%s: topk routing needs both topk_ids and topk_weights", path);
        if (route_topk(j, ids, wts)) return CLI_USAGE;
    } else if (explicit_routing(j)) {
        return CLI_USAGE;
    }
    if (bundle_float(cmd, path, j->ea, 0)) return CLI_USAGE;
    return optional_tensors(j, w1s, w2s);
}

static void fill_uniform_bf16(uint16_t *p, int64_t n, double lo, double hi, cli_rng *r) {
    for (int64_t i = 0; i < n; i++) p[i] = mxfp8_fp32_to_bf16((float)(lo + (hi - lo) * cli_rng_uniform(r)));
}

/* Top-k experts per token without replacement (partial Fisher-Yates), affinity U(0, 1) (BF16 values). */
static int draw_topk(moe_job *j, tf_tensor *ids, tf_tensor *wts, cli_rng *r) {
    int32_t *perm = malloc((size_t)j->E * sizeof *perm);
    if (!perm) return cli_error(j->cmd, "out of memory");
    int32_t *idp = ids->data;
    float *wp = wts->data;
    for (int64_t t = 0; t < j->T; t++) {
        for (int64_t e = 0; e < j->E; e++) perm[e] = (int32_t)e;
        for (int64_t k = 0; k < j->TOPK; k++) {
            int64_t s = k + (int64_t)(cli_rng_uniform(r) * (double)(j->E - k));
            if (s >= j->E) s = j->E - 1;
            int32_t tmp = perm[k];
            perm[k] = perm[s];
            perm[s] = tmp;
            idp[t * j->TOPK + k] = perm[k];
            wp[t * j->TOPK + k] = mxfp8_bf16_to_fp32(mxfp8_fp32_to_bf16((float)cli_rng_uniform(r)));
        }
    }
    free(perm);
    return CLI_OK;
}

/* Routing of the random problem: the dense mode's identity, else mxfp8_moe_route. */
static int route_random(moe_job *j, tf_tensor *ids, tf_tensor *wts) {
    char err[TF_ERR_LEN];
    int64_t T = j->T, E = j->E, B = j->B;
    mxfp8_status st;
    if (j->cfg.single_expert_dense) {
        j->N = (T + B - 1) / B;
        int64_t s_ea[2] = {T, 1};
        if (!(j->ea = tf_add_new(&j->in, "expert_affinities_masked", TF_BF16, 2, s_ea, err, sizeof err)))
            return cli_error(j->cmd, "%s", err);
        uint16_t *ap = j->ea->data;
        const float *wp = wts->data;
        for (int64_t t = 0; t < T; t++) ap[t] = mxfp8_fp32_to_bf16(wp[t * j->TOPK]);
        return CLI_OK;
    }
    if ((st = mxfp8_moe_num_blocks(T, j->TOPK, E, B, &j->N))) return cli_lib_error(j->cmd, "mxfp8_moe_num_blocks", st);
    int64_t s_tpi[1] = {j->N * B}, s_b2e[2] = {j->N, 1}, s_ea[2] = {T * E, 1};
    if (!(j->tpi = tf_add_new(&j->in, "token_position_to_id", TF_I32, 1, s_tpi, err, sizeof err)) ||
        !(j->b2e = tf_add_new(&j->in, "block_to_expert", TF_I32, 2, s_b2e, err, sizeof err)) ||
        !(j->ea = tf_add_new(&j->in, "expert_affinities_masked", TF_BF16, 2, s_ea, err, sizeof err)))
        return cli_error(j->cmd, "%s", err);
    mxfp8_tensor vi = tf_view(ids), vw = tf_view(wts), vt = tf_view(j->tpi), vb = tf_view(j->b2e), va = tf_view(j->ea);
    if ((st = mxfp8_moe_route(&vi, &vw, E, B, -1, &vt, &vb, &va))) return cli_lib_error(j->cmd, "mxfp8_moe_route", st);
    j->routed_topk = 1;
    return CLI_OK;
}

int moe_make_problem(moe_job *j) {
    char err[TF_ERR_LEN];
    cli_rng r;
    cli_rng_seed(&r, (uint64_t)j->seed);
    int64_t T = j->T, H = j->H, E = j->E, I = j->I;
    int64_t s_x[2] = {T, H}, s_w1[4] = {E, H, 2, I}, s_w2[3] = {E, I, H}, s_ids[2] = {T, j->TOPK};
    tf_tensor *ids, *wts;
    if (!(j->x = tf_add_new(&j->in, "hidden_states", TF_BF16, 2, s_x, err, sizeof err)) ||
        !(j->w1 = tf_add_new(&j->in, "gate_up_proj_weight", TF_BF16, 4, s_w1, err, sizeof err)) ||
        !(j->w2 = tf_add_new(&j->in, "down_proj_weight", TF_BF16, 3, s_w2, err, sizeof err)) ||
        !(j->dy = tf_add_new(&j->in, "output_hidden_states_grad", TF_BF16, 2, s_x, err, sizeof err)) ||
        !(ids = tf_add_new(&j->work, "topk_ids", TF_I32, 2, s_ids, err, sizeof err)) ||
        !(wts = tf_add_new(&j->work, "topk_weights", TF_F32, 2, s_ids, err, sizeof err)))
        return cli_error(j->cmd, "%s", err);
    fill_uniform_bf16(j->w1->data, j->w1->numel, -0.1, 0.1, &r);
    fill_uniform_bf16(j->w2->data, j->w2->numel, -0.1, 0.1, &r);
    fill_uniform_bf16(j->x->data, j->x->numel, 0.0, 1.0, &r);
    fill_uniform_bf16(j->dy->data, j->dy->numel, -1.0, 1.0, &r);
    if (draw_topk(j, ids, wts, &r)) return CLI_USAGE;
    if (j->cfg.bias) {
        int64_t s_b1[3] = {E, 2, I}, s_b2[2] = {E, H};
        tf_tensor *b1, *b2;
        if (!(b1 = tf_add_new(&j->in, "gate_and_up_proj_bias", TF_BF16, 3, s_b1, err, sizeof err)) ||
            !(b2 = tf_add_new(&j->in, "down_proj_bias", TF_BF16, 2, s_b2, err, sizeof err)))
            return cli_error(j->cmd, "%s", err);
        fill_uniform_bf16(b1->data, b1->numel, -0.1, 0.1, &r);
        fill_uniform_bf16(b2->data, b2->numel, -0.1, 0.1, &r);
        j->ba.gate_and_up_proj_bias = tf_view(b1);
        j->ba.down_proj_bias = tf_view(b2);
    }
    if (route_random(j, ids, wts)) return CLI_USAGE;
    if (j->save_path) {
        if (tf_save(j->save_path, &j->in, err, sizeof err)) return cli_error(j->cmd, "%s", err);
        printf("wrote the problem (%d tensors, block size %lld) to %s\n", j->in.n, (long long)j->B, j->save_path);
    }
    return CLI_OK;
}
