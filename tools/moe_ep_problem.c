/*
 * moe_ep_problem.c -- the gathered MoE problem of `mxfp8 moe-bwd --expert-parallel`: generated exactly as
 * `mxfp8 moe-bwd` generates its default problem, or read from a bundle (tensor names of `mxfp8 moe-bwd --inputs`).
 * A bundle's explicit routing must be in mxfp8_moe_route's layout (expert-major, tokens ascending, ceil(count / B)
 * blocks per expert, padding-only blocks last): expert parallelism forms its blocks that way, so only such a
 * routing gives the same gradients as the single-process run.
 */
#ifdef MXFP8_HAVE_MPI
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe_ep.h"

#define FAIL(...) (snprintf(err, errlen, __VA_ARGS__), -1)

static void fill_bf16(uint16_t *q, int64_t n, double lo, double hi, cli_rng *r) {
    for (int64_t i = 0; i < n; i++) q[i] = mxfp8_fp32_to_bf16((float)(lo + (hi - lo) * cli_rng_uniform(r)));
}

int moe_ep_generate(moe_ep_problem *p, int64_t H, int64_t T, int64_t E, int64_t B, int64_t K, int64_t I,
                    uint64_t seed, int bias, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    p->T = T; p->H = H; p->E = E; p->I = I; p->K = K; p->B = B;
    p->skip_token = 1;
    const int64_t s_x[2] = {T, H}, s_w1[4] = {E, H, 2, I}, s_w2[3] = {E, I, H}, s_ids[2] = {T, K};
    if (!(p->x = tf_add_new(&p->in, "hidden_states", TF_BF16, 2, s_x, err, errlen)) ||
        !(p->w1 = tf_add_new(&p->in, "gate_up_proj_weight", TF_BF16, 4, s_w1, err, errlen)) ||
        !(p->w2 = tf_add_new(&p->in, "down_proj_weight", TF_BF16, 3, s_w2, err, errlen)) ||
        !(p->dy = tf_add_new(&p->in, "output_hidden_states_grad", TF_BF16, 2, s_x, err, errlen)) ||
        !(p->ids = tf_add_new(&p->work, "topk_ids", TF_I32, 2, s_ids, err, errlen)) ||
        !(p->wts = tf_add_new(&p->work, "topk_weights", TF_F32, 2, s_ids, err, errlen)))
        return -1;
    /* the same draws, in the same order, as `mxfp8 moe-bwd` */
    cli_rng r;
    cli_rng_seed(&r, seed);
    fill_bf16(p->w1->data, p->w1->numel, -0.1, 0.1, &r);
    fill_bf16(p->w2->data, p->w2->numel, -0.1, 0.1, &r);
    fill_bf16(p->x->data, p->x->numel, 0.0, 1.0, &r);
    fill_bf16(p->dy->data, p->dy->numel, -1.0, 1.0, &r);
    int32_t *perm = malloc((size_t)E * sizeof *perm), *idp = p->ids->data;
    float *wp = p->wts->data;
    if (!perm) return FAIL("out of memory");
    for (int64_t t = 0; t < T; t++) {
        for (int64_t e = 0; e < E; e++) perm[e] = (int32_t)e;
        for (int64_t k = 0; k < K; k++) {
            int64_t j = k + (int64_t)(cli_rng_uniform(&r) * (double)(E - k));
            if (j >= E) j = E - 1;
            const int32_t tmp = perm[k];
            perm[k] = perm[j];
            perm[j] = tmp;
            idp[t * K + k] = perm[k];
            wp[t * K + k] = mxfp8_bf16_to_fp32(mxfp8_fp32_to_bf16((float)cli_rng_uniform(&r)));
        }
    }
    free(perm);
    if (bias) {
        const int64_t s_b1[3] = {E, 2, I}, s_b2[2] = {E, H};
        if (!(p->b1 = tf_add_new(&p->in, "gate_and_up_proj_bias", TF_BF16, 3, s_b1, err, errlen)) ||
            !(p->b2 = tf_add_new(&p->in, "down_proj_bias", TF_BF16, 2, s_b2, err, errlen)))
            return -1;
        fill_bf16(p->b1->data, p->b1->numel, -0.1, 0.1, &r);
        fill_bf16(p->b2->data, p->b2->numel, -0.1, 0.1, &r);
    }
    return 0;
}

static int as_float(tf_tensor *t, int allow_codes, const char *path, char *err, size_t errlen) {
    if (t->dtype == TF_F64 && tf_to_f32(t, err, errlen)) return -1;
    if (t->dtype == TF_F32 || t->dtype == TF_BF16 || t->dtype == TF_F16) return 0;
    if (allow_codes && (t->dtype == TF_F8_E4M3 || t->dtype == TF_F8_E5M2 || t->dtype == TF_U8)) return 0;
    return FAIL("%s: '%s' has dtype %s; F32, BF16 or F16 is needed%s", path, t->name, tf_dtype_name(t->dtype),
                allow_codes ? " (or FP8 codes with their scales)" : "");
}

/* Exact F32 values of pre-quantized codes [R, L] with scales [R, ceil(L/32)] (the backward's axis, last): the
 * forward's weights (its GEMMs quantize along other axes, from exact values, as the single-process recompute does). */
static tf_tensor *dequantized(moe_ep_problem *p, const char *name, tf_tensor *codes, tf_tensor *scales, int ndim,
                              const int64_t *shape, int64_t L, char *err, size_t errlen) {
    const int64_t R = codes->numel / L, sc[2] = {R, L}, ss[2] = {R, (L + 31) / 32};
    if (scales->numel != R * ss[1]) {
        snprintf(err, errlen, "'%s' must hold %lld scales (%lld rows of ceil(%lld/32))", scales->name,
                 (long long)(R * ss[1]), (long long)R, (long long)L);
        return NULL;
    }
    tf_tensor *out = tf_add_new(&p->work, name, TF_F32, ndim, shape, err, errlen);
    if (!out) return NULL;
    const mxfp8_dtype cd = codes->dtype == TF_F8_E5M2 ? MXFP8_DTYPE_E5M2 : MXFP8_DTYPE_E4M3;
    mxfp8_tensor c = mxfp8_tensor_make(codes->data, cd, 2, sc), s = mxfp8_tensor_make(scales->data, MXFP8_DTYPE_U8, 2, ss);
    mxfp8_tensor o = mxfp8_tensor_make(out->data, MXFP8_DTYPE_F32, 2, sc);
    mxfp8_status st = mxfp8_dequantize(&c, &s, 1, MXFP8_GROUP_1X32, &o);
    if (st) {
        snprintf(err, errlen, "dequantizing %s: %s", codes->name, mxfp8_last_error_message());
        return NULL;
    }
    return out;
}

static float ld(const tf_tensor *t, int64_t i) {
    if (t->dtype == TF_F32) return ((const float *)t->data)[i];
    if (t->dtype == TF_BF16) return mxfp8_bf16_to_fp32(((const uint16_t *)t->data)[i]);
    return mxfp8_fp16_to_fp32(((const uint16_t *)t->data)[i]);
}

/* An explicit routing must be mxfp8_moe_route's layout of the pairs that expert_affinities_masked marks nonzero. */
static int check_canonical(moe_ep_problem *p, const tf_tensor *tpi, const tf_tensor *b2e, char *err, size_t errlen) {
    const int64_t T = p->T, E = p->E, B = p->B, N = b2e->shape[0];
    const int32_t *pos = tpi->data, *be = b2e->data;
    unsigned char *mark = calloc((size_t)(T * E > 0 ? T * E : 1), 1);
    int rc = -1;
    if (!mark) return FAIL("out of memory");
    for (int64_t n = 0; n < N; n++) {
        if (be[n] < 0 || be[n] >= E) { snprintf(err, errlen, "block_to_expert[%lld] = %d is not an expert", (long long)n, be[n]); goto out; }
        for (int64_t q = 0; q < B; q++) {
            const int32_t t = pos[n * B + q];
            if (t == T) p->skip_token = 0;
            if (t == -1 || t == T) continue;
            if (t < 0 || t > T) { snprintf(err, errlen, "token_position_to_id holds %d (T = %lld)", t, (long long)T); goto out; }
            if (mark[t * E + be[n]]++) { snprintf(err, errlen, "the routing sends token %d to expert %d twice", t, be[n]); goto out; }
        }
    }
    for (int64_t i = 0; i < T * E; i++) {
        const float a = ld(p->ea, i);
        if ((a != 0.0f || a != a) != (mark[i] != 0)) {
            snprintf(err, errlen, "expert_affinities_masked and the blocks disagree at token %lld, expert %lld (expert parallelism "
                 "routes the pairs with nonzero affinity)", (long long)(i / E), (long long)(i % E));
            goto out;
        }
    }
    int64_t n = 0;
    for (int64_t e = 0; e < E; e++) {
        int64_t t = 0;
        for (;;) {
            int64_t q = 0;
            for (; t < T && q < B; t++)
                if (mark[t * E + e]) {
                    if (n >= N || be[n] != e || pos[n * B + q] != t) goto layout;
                    q++;
                }
            if (q == 0) break;
            for (; q < B; q++)
                if (n >= N || (pos[n * B + q] != -1 && pos[n * B + q] != T)) goto layout;
            n++;
        }
    }
    for (; n < N; n++)
        for (int64_t q = 0; q < B; q++)
            if (pos[n * B + q] != -1 && pos[n * B + q] != T) goto layout;
    rc = 0;
    goto out;
layout:
    snprintf(err, errlen, "the bundle's blocks are not mxfp8_moe_route's layout (block %lld differs); expert parallelism forms its "
         "blocks that way: give topk_ids + topk_weights instead", (long long)n);
out:
    free(mark);
    return rc;
}

static int load_routing(moe_ep_problem *p, const char *path, int64_t block_size, char *err, size_t errlen) {
    tf_tensor *ids = tf_find(&p->in, "topk_ids"), *wts = tf_find(&p->in, "topk_weights");
    tf_tensor *tpi = tf_find(&p->in, "token_position_to_id"), *b2e = tf_find(&p->in, "block_to_expert");
    tf_tensor *ck = tf_find(&p->in, "gate_up_proj_act_checkpoint_T");
    p->ea = tf_find(&p->in, "expert_affinities_masked");
    p->B = block_size;
    if (ids || wts) {
        if (!ids || !wts) return FAIL("%s: topk routing needs both topk_ids and topk_weights", path);
        if (tpi || b2e || p->ea)
            return FAIL("%s: give routing either as topk_ids + topk_weights or as token_position_to_id + "
                        "block_to_expert + expert_affinities_masked, not both", path);
        if (tf_to_i32(ids, err, errlen) || as_float(wts, 0, path, err, errlen)) return -1;
        if (ids->ndim != 2 || wts->ndim != 2 || ids->shape[0] != p->T || wts->shape[1] != ids->shape[1])
            return FAIL("%s: topk_ids and topk_weights must be [T, K]", path);
        p->ids = ids;
        p->wts = wts;
        p->K = ids->shape[1];
        if (wts->dtype != p->x->dtype) { /* `mxfp8 moe-bwd` routes into affinities of hidden_states' dtype */
            if (!(p->wts = tf_add_new(&p->work, "topk_weights (rounded)", p->x->dtype, 2, wts->shape, err, errlen)))
                return -1;
            for (int64_t i = 0; i < wts->numel; i++) {
                const float v = ld(wts, i);
                if (p->x->dtype == TF_F32) ((float *)p->wts->data)[i] = v;
                else if (p->x->dtype == TF_BF16) ((uint16_t *)p->wts->data)[i] = mxfp8_fp32_to_bf16(v);
                else ((uint16_t *)p->wts->data)[i] = mxfp8_fp32_to_fp16(v);
            }
        }
        if (!p->B && ck && ck->ndim == 4) p->B = ck->shape[3];
        if (!p->B) return FAIL("%s: routing from topk_ids needs --block-size B", path);
        return 0;
    }
    if (!tpi || !b2e || !p->ea)
        return FAIL("%s: needs routing: token_position_to_id + block_to_expert + expert_affinities_masked, or "
                    "topk_ids + topk_weights", path);
    if (tf_to_i32(tpi, err, errlen) || tf_to_i32(b2e, err, errlen) || as_float(p->ea, 0, path, err, errlen))
        return -1;
    if (p->ea->numel != p->T * p->E) return FAIL("%s: expert_affinities_masked must hold T*E values", path);
    const int64_t N = b2e->ndim >= 1 ? b2e->shape[0] : 0;
    if (!p->B) {
        if (N > 0 && tpi->numel > 0 && tpi->numel % N == 0) p->B = tpi->numel / N;
        else return FAIL("%s: cannot infer the block size; give --block-size", path);
    }
    if (tpi->numel != N * p->B) return FAIL("%s: token_position_to_id must hold N*B = %lld ids", path,
                                            (long long)(N * p->B));
    p->K = -1;
    return check_canonical(p, tpi, b2e, err, errlen);
}

int moe_ep_load(moe_ep_problem *p, const char *path, int64_t block_size, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    p->skip_token = 1;
    if (tf_load(path, &p->in, err, errlen)) return -1;
    static const char *const need[4] = {"hidden_states", "gate_up_proj_weight", "down_proj_weight",
                                        "output_hidden_states_grad"};
    for (int i = 0; i < 4; i++)
        if (!tf_find(&p->in, need[i])) return FAIL("%s: the bundle has no tensor '%s'", path, need[i]);
    p->x = tf_find(&p->in, need[0]);
    p->w1 = tf_find(&p->in, need[1]);
    p->w2 = tf_find(&p->in, need[2]);
    p->dy = tf_find(&p->in, need[3]);
    p->w1s = tf_find(&p->in, "gate_up_weight_scales");
    p->w2s = tf_find(&p->in, "down_weight_scales");
    if (as_float(p->x, 0, path, err, errlen) || as_float(p->dy, 0, path, err, errlen) ||
        as_float(p->w1, p->w1s != NULL, path, err, errlen) || as_float(p->w2, p->w2s != NULL, path, err, errlen))
        return -1;
    if (p->x->ndim != 2 || p->w1->ndim != 4 || p->w2->ndim != 3 || p->dy->ndim != 2)
        return FAIL("%s: needs hidden_states [T, H], gate_up_proj_weight [E, H, 2, I], down_proj_weight [E, I, H]",
                    path);
    p->T = p->x->shape[0]; p->H = p->x->shape[1]; p->E = p->w1->shape[0]; p->I = p->w1->shape[3];
    if (tf_find(&p->in, "num_valid_tokens")) return FAIL("%s: num_valid_tokens (single_expert_dense) has no "
                                                         "expert-parallel form", path);
    static const char *const cks[6] = {"gate_up_proj_act_checkpoint_T", "gate_act_checkpoint_T",
                                       "intermediate_checkpoint_T", "scaled_intermediate_checkpoint_T",
                                       "down_proj_act_checkpoint", "down_proj_output_checkpoint"};
    for (int i = 0; i < 6; i++) p->ignored_checkpoints |= tf_find(&p->in, cks[i]) != NULL;
    p->b1 = tf_find(&p->in, "gate_and_up_proj_bias");
    p->b2 = tf_find(&p->in, "down_proj_bias");
    if ((p->b1 && as_float(p->b1, 0, path, err, errlen)) || (p->b2 && as_float(p->b2, 0, path, err, errlen)))
        return -1;
    if ((p->w1s && p->w1->dtype != TF_F8_E4M3 && p->w1->dtype != TF_F8_E5M2) ||
        (p->w2s && p->w2->dtype != TF_F8_E4M3 && p->w2->dtype != TF_F8_E5M2))
        return FAIL("%s: pre-quantized weights must be F8_E4M3 or F8_E5M2 codes", path);
    const int64_t s1[4] = {p->E, p->H, 2, p->I}, s2[3] = {p->E, p->I, p->H};
    if (p->w1s) {
        p->w1c = p->w1;
        if (!(p->w1 = dequantized(p, "gate_up_proj_weight (F32)", p->w1c, p->w1s, 4, s1, 2 * p->I, err, errlen)))
            return -1;
    }
    if (p->w2s) {
        p->w2c = p->w2;
        if (!(p->w2 = dequantized(p, "down_proj_weight (F32)", p->w2c, p->w2s, 3, s2, p->H, err, errlen))) return -1;
    }
    return load_routing(p, path, block_size, err, errlen);
}

void moe_ep_free(moe_ep_problem *p) {
    tf_free(&p->in);
    tf_free(&p->work);
    memset(p, 0, sizeof *p);
}

int moe_ep_mpi_begin(int *argc, char ***argv, int *rank, int *size) {
    int init = 0, own = 0;
    MPI_Initialized(&init);
    if (!init) {
        int provided;
        MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
        own = 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
    return own;
}

void moe_ep_default_threads(MPI_Comm comm) {
    const char *a = getenv("MXFP8_NUM_THREADS"), *b = getenv("OMP_NUM_THREADS");
    if ((a && *a) || (b && *b)) return;
    MPI_Comm node;
    int n = 1;
    if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        MPI_Comm_size(node, &n);
        MPI_Comm_free(&node);
    }
    mxfp8_info info;
    if (mxfp8_get_info(&info) == MXFP8_OK) mxfp8_set_num_threads(info.num_threads / n > 1 ? info.num_threads / n : 1);
}
#endif /* MXFP8_HAVE_MPI */
