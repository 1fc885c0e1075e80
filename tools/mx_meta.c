/* mx_meta.c -- the self-description of quantized tensor files (see mx_meta.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "mx_meta.h"

static const char *const k_fmt = "mx.format", *const k_rule = "mx.scale_rule", *const k_group = "mx.group",
                         *const k_axis = "mx.axis", *const k_layout = "mx.scale_layout",
                         *const k_rounding = "mx.rounding";

int mx_meta_record(tf_set *out, int ax, const mxfp8_quant_params *qp, char *err, size_t errlen) {
    char axs[16];
    snprintf(axs, sizeof axs, "%d", ax);
    return tf_meta_set(out, k_fmt, mxfp8_enum_name(MXFP8_ENUM_FORMAT, qp->fmt), err, errlen) ||
           tf_meta_set(out, k_rule, mxfp8_enum_name(MXFP8_ENUM_SCALE_RULE, qp->rule), err, errlen) ||
           tf_meta_set(out, k_group, mxfp8_enum_name(MXFP8_ENUM_GROUP_SCHEME, qp->group), err, errlen) ||
           tf_meta_set(out, k_axis, axs, err, errlen) ||
           tf_meta_set(out, k_layout, mxfp8_enum_name(MXFP8_ENUM_SCALE_LAYOUT, MXFP8_SCALES_COMPACT), err, errlen) ||
           tf_meta_set(out, k_rounding, mxfp8_enum_name(MXFP8_ENUM_ROUNDING, qp->rounding), err, errlen)
               ? -1 : 0;
}

/* The value of key `key` as a name of enumeration e; an unknown one is the file's error. */
static int meta_enum(const char *cmd, const char *path, const char *key, const char *s, mxfp8_enum e, int32_t *v) {
    if (mxfp8_enum_from_name(e, s, v) != MXFP8_OK)
        return cli_error(cmd, "%s: the metadata's %s '%s' is not %s", path, key, s, cli_names(e, NULL, -1));
    return CLI_OK;
}

int mx_meta_read(const char *cmd, const tf_set *in, const char *path, int ndim, tf_dtype data_dtype,
                 mx_file_params *p) {
    memset(p, 0, sizeof *p);
    const char *f = tf_meta_get(in, k_fmt), *g = tf_meta_get(in, k_group), *a = tf_meta_get(in, k_axis);
    p->layout = tf_meta_get(in, k_layout);
    int32_t ev;
    if (f) {
        if (meta_enum(cmd, path, k_fmt, f, MXFP8_ENUM_FORMAT, &ev)) return CLI_USAGE;
        p->have_fmt = 1;
        p->fmt_e5m2 = ev == MXFP8_FMT_E5M2;
        if ((data_dtype == TF_F8_E4M3 && p->fmt_e5m2) || (data_dtype == TF_F8_E5M2 && !p->fmt_e5m2))
            return cli_error(cmd, "%s: the metadata says format %s but 'data' holds %s codes", path, f,
                             tf_dtype_name(data_dtype));
    }
    if (g) {
        if (meta_enum(cmd, path, k_group, g, MXFP8_ENUM_GROUP_SCHEME, &ev)) return CLI_USAGE;
        p->have_group = 1;
        p->group = (mxfp8_group_scheme)ev;
    }
    if (a) {
        char *end;
        long v = strtol(a, &end, 10);
        if (*end || end == a || v < 0 || v >= ndim)
            return cli_error(cmd, "%s: the metadata's %s '%s' is not an axis of the %d-D tensor 'data'", path, k_axis,
                             a, ndim);
        p->have_axis = 1;
        p->axis = (int)v;
    }
    return CLI_OK;
}

int mx_meta_conflict(const char *cmd, const char *flag, const char *given, const char *path, const char *recorded) {
    return cli_error(cmd, "--%s %s contradicts %s, quantized with %s (its metadata); leave --%s out", flag, given,
                     path, recorded, flag);
}
