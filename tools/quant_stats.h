/* quant_stats.h -- `mxfp8 quantize --stats` (see quant_stats.c). */
#ifndef MXFP8_TOOLS_QUANT_STATS_H
#define MXFP8_TOOLS_QUANT_STATS_H

#include <cjson/cJSON.h>

#include "cli.h"
#include "io/tensorfile.h"

typedef struct quant_stats {
    int64_t groups, nan_groups, nonzero_groups, mode_count;
    int code_min, code_max, code_mode;   /**< finite scale codes (0..254) */
    int64_t saturated, flushed, subnormal; /**< elements */
    double sqnr_db;                       /**< +inf when exact */
    double rel_median, rel_p99, rel_max;  /**< per-group relative error */
} quant_stats;

/** The statistics of quantizing x (F32/BF16/F16) along `axis` with qp into codes and scales (compact layout),
 *  whose dequantization (F32) is deq. Fills *s and adds them to doc (the --plot input); lib, when not NULL, is the
 *  library's statistics of the call (mxfp8_quant_params.stats), whose element counts and SQNR are taken. 0, or -1
 *  when out of memory. */
int quant_stats_compute(const tf_tensor *x, const tf_tensor *codes, const tf_tensor *scales, const tf_tensor *deq,
                        int axis, const mxfp8_quant_params *qp, const mxfp8_quant_stats *lib, quant_stats *s,
                        cJSON *doc);
void quant_stats_print(const quant_stats *s, int64_t numel, const mxfp8_quant_params *qp);

#endif
