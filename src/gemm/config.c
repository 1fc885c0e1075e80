/* config.c -- MatmulMxfp8KernelConfig: defaults, validation, and the resolution of its speed knobs for a kernel. */
#include <stdio.h>

#include "gemm.h"
#include "../runtime/enums.h"

/* ---------------------------------------------------------------------------------------------------------- */
/* config                                                                                                      */
/* ---------------------------------------------------------------------------------------------------------- */
void mxfp8_matmul_config_init(mxfp8_matmul_config *config) {
    if (!config) return;
    memset(config, 0, sizeof *config);
    config->block_loop_order = MXFP8_LOOP_MNK;
    config->tile_loop_order = MXFP8_LOOP_MNK;
    config->float8_dtype = MXFP8_FMT_E5M2;
    config->run_with_lnc2 = 1;
    config->lnc_2_shard_rhs = -1;
    config->spill_reload = 0;
    config->quant_scheme = MXFP8_GROUP_1X32;
    config->scale_rule = MXFP8_SCALE_NKI;
}

mxfp8_status mxfp8i_check_config(const char *fn, const char *name, const mxfp8_matmul_config *c) {
    const int64_t *sz[] = {&c->M,
                           &c->K,
                           &c->N,
                           &c->tile_m,
                           &c->tile_k,
                           &c->tile_n,
                           &c->tiles_in_block_m,
                           &c->tiles_in_block_n,
                           &c->tiles_in_block_k,
                           &c->tiles_in_load_m,
                           &c->tiles_in_load_n};
    static const char *nm[] = {"M",
                               "K",
                               "N",
                               "tile_m",
                               "tile_k",
                               "tile_n",
                               "tiles_in_block_m",
                               "tiles_in_block_n",
                               "tiles_in_block_k",
                               "tiles_in_load_m",
                               "tiles_in_load_n"};
    for (int i = 0; i < 11; i++)
        MXFP8I_RETURN_ERROR_IF(*sz[i] < 0, MXFP8_ERR_INVALID_ARGUMENT, "%s: %s.%s = %lld is negative", fn, name, nm[i],
                               (long long)*sz[i]);
    const struct {
        const char *field;
        mxfp8_enum e;
        int value;
    } en[5] = {{"block_loop_order", MXFP8_ENUM_LOOP_ORDER, (int)c->block_loop_order},
               {"tile_loop_order", MXFP8_ENUM_LOOP_ORDER, (int)c->tile_loop_order},
               {"float8_dtype", MXFP8_ENUM_FLOAT8_DTYPE, (int)c->float8_dtype},
               {"quant_scheme", MXFP8_ENUM_GROUP_SCHEME, (int)c->quant_scheme},
               {"scale_rule", MXFP8_ENUM_SCALE_RULE, (int)c->scale_rule}};
    for (int i = 0; i < 5; i++) {
        char param[96];
        snprintf(param, sizeof param, "%s.%s", name, en[i].field);
        mxfp8_status st = mxfp8i_check_enum(fn, param, en[i].e, en[i].value);
        if (st) return st;
    }
    MXFP8I_RETURN_ERROR_IF(c->lnc_2_shard_rhs < -1 || c->lnc_2_shard_rhs > 1, MXFP8_ERR_INVALID_ARGUMENT,
                           "%s: %s.lnc_2_shard_rhs %d is not -1, 0 or 1", fn, name, c->lnc_2_shard_rhs);
    const int flag[3] = {c->enable_scale_packing, c->run_with_lnc2, c->spill_reload};
    static const char *flag_nm[3] = {"enable_scale_packing", "run_with_lnc2", "spill_reload"};
    for (int i = 0; i < 3; i++) /* booleans are 0 or 1, not "any nonzero" */
        MXFP8I_RETURN_ERROR_IF(flag[i] != 0 && flag[i] != 1, MXFP8_ERR_INVALID_ARGUMENT, "%s: %s.%s %d is not 0 or 1",
                               fn, name, flag_nm[i], flag[i]);
    return MXFP8_OK;
}

void mxfp8i_gemm_resolve(const mxfp8_matmul_config *in, const mxfp8i_ukernel *uk, int64_t M, int64_t N, int64_t K,
                         int nthreads, mxfp8_matmul_config *out) {
    *out = *in;
    out->M = M;
    out->N = N;
    out->K = K;
    /* tile defaults come with the kernel (src/kernels/ukernel.h); tiles are rounded to its register tile */
    out->tile_m = mxfp8i_round_up(in->tile_m > 0 ? in->tile_m : uk->tile_m, uk->mr);
    out->tile_n = mxfp8i_round_up(in->tile_n > 0 ? in->tile_n : uk->tile_n, uk->nr);
    out->tile_k = mxfp8i_round_up(in->tile_k > 0 ? in->tile_k : uk->tile_k, uk->kalign);
    out->tiles_in_block_m = in->tiles_in_block_m > 0 ? in->tiles_in_block_m : 4;
    out->tiles_in_block_n = in->tiles_in_block_n > 0 ? in->tiles_in_block_n : 2;
    out->tiles_in_block_k = in->tiles_in_block_k > 0 ? in->tiles_in_block_k : 1;
    out->tiles_in_load_m = in->tiles_in_load_m > 0 ? in->tiles_in_load_m : 1;
    out->tiles_in_load_n = in->tiles_in_load_n > 0 ? in->tiles_in_load_n : 1;
    if (out->lnc_2_shard_rhs < 0) out->lnc_2_shard_rhs = N >= M;
    /* Give every thread at least one block along the shard axis when the problem allows (speed only). */
    if (nthreads > 1 && out->run_with_lnc2) {
        int64_t dim = out->lnc_2_shard_rhs ? N : M, tile = out->lnc_2_shard_rhs ? out->tile_n : out->tile_m;
        int64_t *tib = out->lnc_2_shard_rhs ? &out->tiles_in_block_n : &out->tiles_in_block_m;
        int64_t want = mxfp8i_ceil_div(mxfp8i_ceil_div(dim, nthreads), tile);
        if (want < 1) want = 1;
        if (*tib > want) *tib = want;
        /* a default tile longer than a thread's share would leave threads without a block (N = 256 on 2 threads
         * with 256-wide tiles): shrink it to the share, in whole register tiles */
        const int64_t share = mxfp8i_round_up(mxfp8i_ceil_div(dim, nthreads), out->lnc_2_shard_rhs ? uk->nr : uk->mr);
        int64_t *t = out->lnc_2_shard_rhs ? &out->tile_n : &out->tile_m;
        if ((out->lnc_2_shard_rhs ? in->tile_n : in->tile_m) <= 0 && *t > share) *t = share;
    }
}
