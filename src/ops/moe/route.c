/*
 * moe_route.c -- block layout of a top-K routing (the upstream blockwise MoE test convention) [NKI-E].
 *
 * Contract (include/mxfp8.h): N = ceil((T*K - (E-1)) / B) + E - 1 blocks. Expert e gets ceil(count_e / B) blocks in
 * expert order, holding its tokens in ascending order and padded with padding_id; the remaining blocks are all
 * padding and belong to expert E-1. a[t*E + e] is the top-K weight of e in row t (0 when not routed).
 * Every input is validated before an output is written.
 */
#include <stdlib.h>
#include <string.h>

#include "moe.h"

#define ROUTE_STACK_EXPERTS 1024

static int64_t ceil_div_signed(int64_t num, int64_t den) { /* den > 0; rounds toward +inf */
    return num >= 0 ? (num + den - 1) / den : -((-num) / den);
}

mxfp8_status mxfp8_moe_num_blocks(int64_t T, int64_t top_k, int64_t num_experts, int64_t block_size,
                                  int64_t *num_blocks) {
    static const char *fn = "mxfp8_moe_num_blocks";
    mxfp8i_clear_error();
    MXFP8I_RETURN_ERROR_IF(!num_blocks, MXFP8_ERR_NULL_POINTER, "%s: num_blocks is NULL", fn);
    MXFP8I_RETURN_ERROR_IF(T < 0, MXFP8_ERR_INVALID_ARGUMENT, "%s: T = %lld is negative", fn, (long long)T);
    MXFP8I_RETURN_ERROR_IF(num_experts < 1, MXFP8_ERR_INVALID_ARGUMENT, "%s: num_experts = %lld must be >= 1", fn,
                           (long long)num_experts);
    MXFP8I_RETURN_ERROR_IF(top_k < 1 || top_k > num_experts, MXFP8_ERR_INVALID_ARGUMENT,
                           "%s: top_k = %lld must be in [1, num_experts = %lld]", fn, (long long)top_k,
                           (long long)num_experts);
    MXFP8I_RETURN_ERROR_IF(block_size < 1, MXFP8_ERR_INVALID_ARGUMENT, "%s: block_size = %lld must be >= 1", fn,
                           (long long)block_size);
    int64_t TK;
    MXFP8I_RETURN_ERROR_IF(!mxfp8i_mul_size(T, top_k, &TK) || TK > INT64_MAX - block_size, MXFP8_ERR_SIZE_OVERFLOW,
                           "%s: T*top_k overflows", fn);
    *num_blocks = ceil_div_signed(TK - (num_experts - 1), block_size) + num_experts - 1;
    return MXFP8_OK;
}

/* Every check of mxfp8_moe_route's arguments except the ids themselves; *N = the number of blocks. */
static mxfp8_status check_route(const char *fn, const mxfp8_tensor *topk_ids, const mxfp8_tensor *topk_weights,
                                int64_t num_experts, int64_t block_size, int32_t padding_id,
                                const mxfp8_tensor *token_position_to_id, const mxfp8_tensor *block_to_expert,
                                const mxfp8_tensor *expert_affinities_masked, int64_t *n_blocks) {
    mxfp8_status st;
    {
        const void *args[5] = {topk_ids, topk_weights, token_position_to_id, block_to_expert, expert_affinities_masked};
        const char *argn[5] = {"topk_ids", "topk_weights", "token_position_to_id", "block_to_expert",
                               "expert_affinities_masked"};
        for (int i = 0; i < 5; i++) /* the message names the parameter */
            MXFP8I_RETURN_ERROR_IF(!args[i], MXFP8_ERR_NULL_POINTER, "%s: %s is NULL", fn, argn[i]);
    }
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_rank(fn, "topk_ids", topk_ids, 2));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_dtype(fn, "topk_ids", topk_ids, 1, MXFP8_DTYPE_I32));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_rank(fn, "topk_weights", topk_weights, 2));
    MXFP8I_RETURN_ERROR_IF(!mxfp8i_is_float_dtype(topk_weights->dtype), MXFP8_ERR_DTYPE,
                           "%s: topk_weights has dtype %s (expected f32, bf16 or f16)", fn,
                           mxfp8_dtype_name(topk_weights->dtype));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_same_shape(fn, "topk_ids", topk_ids, "topk_weights", topk_weights));
    const int64_t T = topk_ids->shape[0], K = topk_ids->shape[1], E = num_experts, B = block_size;
    int64_t N, NB, TE;
    MXFP8I_RETURN_ERROR_IF(padding_id != -1 && (int64_t)padding_id != T, MXFP8_ERR_INVALID_ARGUMENT,
                           "%s: padding_id %d must be -1 or T = %lld", fn, (int)padding_id, (long long)T);
    MXFP8I_RETURN_ERROR_IF(T > INT32_MAX - 1, MXFP8_ERR_SIZE_OVERFLOW, "%s: T = %lld does not fit int32 token ids", fn,
                           (long long)T);
    if ((st = mxfp8_moe_num_blocks(T, K, E, B, &N))) {
        /* re-raise with this function's name */
        return mxfp8i_error(st, "%s: T = %lld, top_k = %lld, num_experts = %lld, block_size = %lld: %s", fn,
                            (long long)T, (long long)K, (long long)E, (long long)B,
                            "invalid routing sizes (need "
                            "num_experts >= 1, 1 <= top_k <= num_experts, block_size >= 1)");
    }
    MXFP8I_RETURN_ERROR_IF(!mxfp8i_mul_size(N, B, &NB) || !mxfp8i_mul_size(T, E, &TE), MXFP8_ERR_SIZE_OVERFLOW,
                           "%s: N*B or T*E overflows", fn);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_rank(fn, "token_position_to_id", token_position_to_id, 1));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_dtype(fn, "token_position_to_id", token_position_to_id, 1, MXFP8_DTYPE_I32));
    MXFP8I_RETURN_ERROR_IF(token_position_to_id->shape[0] != NB, MXFP8_ERR_SHAPE_MISMATCH,
                           "%s: token_position_to_id has %lld entries, expected N*B = %lld", fn,
                           (long long)token_position_to_id->shape[0], (long long)NB);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_view(fn, "block_to_expert", block_to_expert));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_dtype(fn, "block_to_expert", block_to_expert, 1, MXFP8_DTYPE_I32));
    MXFP8I_RETURN_ERROR_IF(
        !(block_to_expert->ndim == 1 || (block_to_expert->ndim == 2 && block_to_expert->shape[1] == 1)) ||
            block_to_expert->shape[0] != N,
        MXFP8_ERR_SHAPE_MISMATCH, "%s: block_to_expert must be [N] or [N, 1] with N = %lld", fn, (long long)N);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_moe_check_vec(fn, "expert_affinities_masked", expert_affinities_masked, 1, TE));
    {
        const mxfp8_tensor *outs[3] = {token_position_to_id, block_to_expert, expert_affinities_masked};
        const char *names[3] = {"token_position_to_id", "block_to_expert", "expert_affinities_masked"};
        const mxfp8_tensor *ins[5] = {topk_ids, topk_weights, token_position_to_id, block_to_expert,
                                      expert_affinities_masked};
        const char *inames[5] = {"topk_ids", "topk_weights", "token_position_to_id", "block_to_expert",
                                 "expert_affinities_masked"};
        for (int o = 0; o < 3; o++)
            if ((st = mxfp8i_check_distinct(fn, names[o], outs[o])) ||
                (st = mxfp8i_moe_check_alias(fn, names[o], outs[o], 5, ins, inames)))
                return st;
    }
    *n_blocks = N;
    return MXFP8_OK;
}

/* Every id of topk_ids in [0, E) and distinct within its row, in (row, k) order: the first bad one is reported.
 * Nothing is allocated (so mxfp8_moe_route_validate runs the same checks): a row's earlier ids are kept as stamps
 * in a stack table for E <= 1024, else compared pairwise. */
enum { ROUTE_STAMPS = 1024 };
static mxfp8_status check_ids(const char *fn, const mxfp8_tensor *topk_ids, int64_t E) {
    const int64_t T = topk_ids->shape[0], K = topk_ids->shape[1], s0 = topk_ids->strides[0], s1 = topk_ids->strides[1];
    int64_t stamp[ROUTE_STAMPS];
    const int stamps = E <= ROUTE_STAMPS;
    if (stamps)
        for (int64_t e = 0; e < E; e++) stamp[e] = -1;
    const int32_t *ids = (const int32_t *)topk_ids->data;
    for (int64_t t = 0; t < T; t++)
        for (int64_t k = 0; k < K; k++) {
            int32_t e = ids[t * s0 + k * s1];
            MXFP8I_RETURN_ERROR_IF(e < 0 || e >= E, MXFP8_ERR_INDEX_OUT_OF_RANGE,
                                   "%s: topk_ids[%lld, %lld] = %d is out of range [0, num_experts = %lld)", fn,
                                   (long long)t, (long long)k, (int)e, (long long)E);
            int dup = 0;
            if (stamps) dup = stamp[e] == t, stamp[e] = t;
            else
                for (int64_t k2 = 0; k2 < k && !dup; k2++) dup = ids[t * s0 + k2 * s1] == e;
            MXFP8I_RETURN_ERROR_IF(dup, MXFP8_ERR_INVALID_ARGUMENT, "%s: topk_ids row %lld names expert %d twice", fn,
                                   (long long)t, (int)e);
        }
    return MXFP8_OK;
}

/* count[e] = tokens routed to e (ids checked); cursor[e] = first position of e. */
static mxfp8_status count_ids(const char *fn, const mxfp8_tensor *topk_ids, int64_t E, int64_t B, int64_t N,
                              int64_t *count, int64_t *cursor) {
    const int64_t T = topk_ids->shape[0], K = topk_ids->shape[1];
    const int32_t *ids = (const int32_t *)topk_ids->data;
    for (int64_t t = 0; t < T; t++)
        for (int64_t k = 0; k < K; k++) count[ids[t * topk_ids->strides[0] + k * topk_ids->strides[1]]]++;
    int64_t used = 0;
    for (int64_t e = 0; e < E; e++) {
        cursor[e] = used * B; /* first position of expert e */
        used += mxfp8i_ceil_div(count[e], B);
    }
    MXFP8I_RETURN_ERROR_IF(used > N, MXFP8_ERR_INTERNAL, "%s: routing needs %lld blocks > N = %lld", fn,
                           (long long)used, (long long)N); /* cannot happen: N bounds any routing */
    return MXFP8_OK;
}

mxfp8_status mxfp8_moe_route_validate(const mxfp8_tensor *topk_ids, const mxfp8_tensor *topk_weights,
                                      int64_t num_experts, int64_t block_size, int32_t padding_id,
                                      const mxfp8_tensor *token_position_to_id, const mxfp8_tensor *block_to_expert,
                                      const mxfp8_tensor *expert_affinities_masked, size_t *workspace_bytes) {
    static const char *fn = "mxfp8_moe_route";
    mxfp8i_clear_error();
    if (workspace_bytes) *workspace_bytes = 0;
    int64_t N;
    MXFP8I_FORWARD_IF_ERROR(check_route(fn, topk_ids, topk_weights, num_experts, block_size, padding_id,
                                        token_position_to_id, block_to_expert, expert_affinities_masked, &N));
    return check_ids(fn, topk_ids, num_experts);
}

mxfp8_status mxfp8_moe_route(const mxfp8_tensor *topk_ids, const mxfp8_tensor *topk_weights, int64_t num_experts,
                             int64_t block_size, int32_t padding_id, mxfp8_tensor *token_position_to_id,
                             mxfp8_tensor *block_to_expert, mxfp8_tensor *expert_affinities_masked) {
    static const char *fn = "mxfp8_moe_route";
    mxfp8i_clear_error();
    int64_t N;
    MXFP8I_FORWARD_IF_ERROR(check_route(fn, topk_ids, topk_weights, num_experts, block_size, padding_id,
                                        token_position_to_id, block_to_expert, expert_affinities_masked, &N));
    const int64_t T = topk_ids->shape[0], K = topk_ids->shape[1], E = num_experts, B = block_size;
    const int64_t NB = N * B, TE = T * E;
    MXFP8I_FORWARD_IF_ERROR(check_ids(fn, topk_ids, E));
    /* two counters per expert: on the stack up to ROUTE_STACK_EXPERTS experts (a training step's routing then
       allocates nothing), else on the heap */
    int64_t onstack[2 * ROUTE_STACK_EXPERTS];
    int64_t *heap = NULL;
    MXFP8I_RETURN_ERROR_IF(E > ROUTE_STACK_EXPERTS && !(heap = (int64_t *)malloc(2 * (size_t)E * sizeof(int64_t))),
                           MXFP8_ERR_OUT_OF_MEMORY, "%s: cannot allocate %lld expert counters", fn, (long long)E);
    int64_t *count = heap ? heap : onstack, *cursor = count + E;
    memset(count, 0, 2 * (size_t)E * sizeof(int64_t));
    mxfp8_status st = count_ids(fn, topk_ids, E, B, N, count, cursor);
    if (st) {
        free(heap);
        return st;
    }
    const int32_t *ids = (const int32_t *)topk_ids->data;

    /* Write. */
    int32_t *tp = (int32_t *)token_position_to_id->data;
    const int64_t ts = token_position_to_id->strides[0];
    for (int64_t i = 0; i < NB; i++) tp[i * ts] = padding_id;
    int32_t *be = (int32_t *)block_to_expert->data;
    const int64_t bs = block_to_expert->strides[0];
    {
        int64_t n = 0;
        for (int64_t e = 0; e < E; e++)
            for (int64_t b = 0; b < mxfp8i_ceil_div(count[e], B); b++) be[(n++) * bs] = (int32_t)e;
        for (; n < N; n++) be[n * bs] = (int32_t)(E - 1);
    }
    mxfp8_tensor *a = expert_affinities_masked;
    for (int64_t i = 0; i < TE; i++) mxfp8i_store_f32(a->data, a->dtype, i * a->strides[0], 0.0f);
    for (int64_t t = 0; t < T; t++)
        for (int64_t k = 0; k < K; k++) {
            int32_t e = ids[t * topk_ids->strides[0] + k * topk_ids->strides[1]];
            tp[(cursor[e]++) * ts] = (int32_t)t;
            float w = mxfp8i_load_f32(topk_weights->data, topk_weights->dtype,
                                      t * topk_weights->strides[0] + k * topk_weights->strides[1]);
            if (a->dtype == MXFP8_DTYPE_F64) ((double *)a->data)[(t * E + e) * a->strides[0]] = (double)w;
            else mxfp8i_store_f32(a->data, a->dtype, (t * E + e) * a->strides[0], w);
        }
    free(heap);
    return MXFP8_OK;
}
