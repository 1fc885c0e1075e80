/*
 * opstats.h -- statistics of the GEMM operands a call quantizes (internal): a separate pass over an operand that
 * quantizes it exactly as the GEMM packer does (same values, format, rule, group scheme and element rounding, so the
 * same codes) into scratch, with the statistics accumulator of the quantize panels (src/kernels/qstats.h). The GEMM
 * itself (src/gemm/) is not involved, so its speed is unchanged when no statistics are asked for.
 */
#ifndef MXFP8_OPS_OPSTATS_H
#define MXFP8_OPS_OPSTATS_H

#include "../gemm/gemm.h"

/** st += the statistics of quantizing the high-precision operand op [R, K] along K (nothing for a pre-quantized
 *  operand). At most nt threads (per-thread accumulators, merged exactly). Scratch comes from the open workspace
 *  scope's slots (src/runtime/workspace.h; malloc when none is open). MXFP8_OK or MXFP8_ERR_OUT_OF_MEMORY (st
 *  unchanged). */
mxfp8_status mxfp8i_gop_stats(const mxfp8i_gop *op, mxfp8_format fmt, mxfp8_scale_rule rule, mxfp8_group_scheme group,
                              int nt, mxfp8i_qstats *st);
/** Grow the scope's slots to what every later mxfp8i_gop_stats with contraction length <= Kmax and <= nt threads
 *  needs, so that those calls cannot fail. OUT_OF_MEMORY or OK. */
mxfp8_status mxfp8i_gop_stats_reserve(int64_t Kmax, int nt);

/** The rounding of an operand quantized by a call: stochastic (on != 0) with (seed, stream) and the logical index
 *  idx0 + r*i0 + k*i1 of element (r, k); RNE when on == 0. */
static inline mxfp8i_sround mxfp8i_sround_make(int on, uint64_t seed, uint64_t stream, int64_t idx0, int64_t i0,
                                               int64_t i1) {
    mxfp8i_sround s = {on ? 1 : 0, seed, stream, idx0, i0, i1};
    return s;
}

#endif /* MXFP8_OPS_OPSTATS_H */
