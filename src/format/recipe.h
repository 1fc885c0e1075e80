/*
 * recipe.h -- the quantization recipe of one operand (internal): its element format, its scale rule and its group
 * scheme, resolved once at the public entry from the caller's config or arguments (float8_dtype, scale_rule,
 * quant_scheme of mxfp8_matmul_config / mxfp8_matmul_bwd_args; quant_dtype, scale_rule of mxfp8_moe_config) and
 * carried by the operand's descriptor (src/gemm/gemm.h, mxfp8i_gop.rc) next to its element rounding and its
 * statistics request. The layers below (the GEMM driver and packer, the statistics pass) read it from the operand;
 * their configurations carry speed knobs only.
 */
#ifndef MXFP8_FORMAT_RECIPE_H
#define MXFP8_FORMAT_RECIPE_H

#include "mxfp8.h"

typedef struct mxfp8i_recipe {
    mxfp8_format fmt;          /**< element format: of the codes the operand is quantized into, or holds */
    mxfp8_scale_rule rule;     /**< the scale of a group quantized on the fly (read only for high-precision
                                    operands: a pre-quantized operand's scales are given) */
    mxfp8_group_scheme group;  /**< which indices along K form a group (src/format/groups.h) */
} mxfp8i_recipe;

static inline mxfp8i_recipe mxfp8i_recipe_make(mxfp8_format fmt, mxfp8_scale_rule rule, mxfp8_group_scheme group) {
    mxfp8i_recipe r = {fmt, rule, group};
    return r;
}

#endif /* MXFP8_FORMAT_RECIPE_H */
