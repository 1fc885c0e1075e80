/*
 * mx_meta.h -- how a quantized tensor file describes itself: the safetensors metadata that `mxfp8 quantize` writes
 * beside `data` and `scales`, and that `dequantize` and `diff` read (the file's values are their defaults; a flag
 * that contradicts them is an error). All values are strings, in the CLI's own option spellings:
 *   mx.format        e4m3 | e5m2
 *   mx.scale_rule    nki | ocp | rceil
 *   mx.group         1x32 | wrapx
 *   mx.axis          the quantization axis, 0-based
 *   mx.scale_layout  compact
 *   mx.rounding      nearest | stochastic
 * Files from other stacks carry none of these keys and are read with the flags alone.
 */
#ifndef MXFP8_TOOLS_MX_META_H
#define MXFP8_TOOLS_MX_META_H

#include "io/tensorfile.h"

/** Record how data + scales in *out were made (quantization axis ax >= 0). 0, or -1 + err. */
int mx_meta_record(tf_set *out, int ax, const mxfp8_quant_params *qp, char *err, size_t errlen);

/** What a file says about itself (have_* = 0: the key is absent). */
typedef struct mx_file_params {
    int have_fmt, fmt_e5m2;
    int have_group;
    mxfp8_group_scheme group;
    int have_axis, axis;
    const char *layout; /**< NULL when absent */
} mx_file_params;

/** Read and check the keys of a file (path, for messages) whose `data` tensor has rank ndim and FP8 dtype
 *  data_dtype (TF_F8_E4M3 / TF_F8_E5M2, or another: not checked against mx.format). CLI_OK, or CLI_USAGE after
 *  printing the error of command cmd (a value that is not one of the spellings above, an axis out of range, a
 *  format that disagrees with the codes). */
int mx_meta_read(const char *cmd, const tf_set *in, const char *path, int ndim, tf_dtype data_dtype,
                 mx_file_params *p);

/** The error of a flag that contradicts the file: "--FLAG GIVEN contradicts PATH, quantized with RECORDED (its
 *  metadata); leave --FLAG out". Returns CLI_USAGE. */
int mx_meta_conflict(const char *cmd, const char *flag, const char *given, const char *path, const char *recorded);

#endif
