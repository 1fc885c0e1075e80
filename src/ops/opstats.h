/*
 * opstats.h -- statistics of the GEMM operands a call quantizes (internal): a separate pass over an operand that
 * quantizes it exactly as the GEMM packer does (same values, and the operand's own recipe and element rounding, so the
 * same codes) into scratch, with the statistics accumulator of the quantize panels (src/kernels/qstats.h). The GEMM
 * itself (src/gemm/) is not involved, so its speed is unchanged when no statistics are asked for.
 */
#ifndef MXFP8_OPS_OPSTATS_H
#define MXFP8_OPS_OPSTATS_H

#include "../gemm/gemm.h"

/** *op->stats += the statistics of quantizing the high-precision operand op [R, K] along K with its recipe and
 *  rounding (nothing for a pre-quantized operand or one without a statistics request, op->stats == NULL). At most
 *  nt threads (per-thread accumulators, merged exactly). Scratch comes from the open workspace scope's slots
 *  (src/runtime/workspace.h; malloc when none is open). MXFP8_OK or MXFP8_ERR_OUT_OF_MEMORY (*op->stats unchanged). */
mxfp8_status mxfp8i_gop_stats(const mxfp8i_gop *op, int nt);
/** Grow the scope's slots to what every later mxfp8i_gop_stats with contraction length <= Kmax and <= nt threads
 *  needs, so that those calls cannot fail. OUT_OF_MEMORY or OK. */
mxfp8_status mxfp8i_gop_stats_reserve(int64_t Kmax, int nt);

#endif /* MXFP8_OPS_OPSTATS_H */
