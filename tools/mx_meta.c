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
    static const char *const rules[] = {"nki", "ocp", "rceil"};
    char axs[16];
    snprintf(axs, sizeof axs, "%d", ax);
    return tf_meta_set(out, k_fmt, qp->fmt == MXFP8_FMT_E4M3 ? "e4m3" : "e5m2", err, errlen) ||
           tf_meta_set(out, k_rule, rules[qp->rule], err, errlen) ||
           tf_meta_set(out, k_group, qp->group == MXFP8_GROUP_WRAPX ? "wrapx" : "1x32", err, errlen) ||
           tf_meta_set(out, k_axis, axs, err, errlen) || tf_meta_set(out, k_layout, "compact", err, errlen) ||
           tf_meta_set(out, k_rounding, qp->rounding == MXFP8_ROUND_STOCHASTIC ? "stochastic" : "nearest", err,
                       errlen)
               ? -1 : 0;
}

int mx_meta_read(const char *cmd, const tf_set *in, const char *path, int ndim, tf_dtype data_dtype,
                 mx_file_params *p) {
    memset(p, 0, sizeof *p);
    const char *f = tf_meta_get(in, k_fmt), *g = tf_meta_get(in, k_group), *a = tf_meta_get(in, k_axis);
    p->layout = tf_meta_get(in, k_layout);
    if (f) {
        if (strcmp(f, "e4m3") && strcmp(f, "e5m2"))
            return cli_error(cmd, "%s: the metadata's %s '%s' is not e4m3 or e5m2", path, k_fmt, f);
        p->have_fmt = 1;
        p->fmt_e5m2 = !strcmp(f, "e5m2");
        if ((data_dtype == TF_F8_E4M3 && p->fmt_e5m2) || (data_dtype == TF_F8_E5M2 && !p->fmt_e5m2))
            return cli_error(cmd, "%s: the metadata says format %s but 'data' holds %s codes", path, f,
                             tf_dtype_name(data_dtype));
    }
    if (g) {
        if (strcmp(g, "1x32") && strcmp(g, "wrapx"))
            return cli_error(cmd, "%s: the metadata's %s '%s' is not 1x32 or wrapx", path, k_group, g);
        p->have_group = 1;
        p->group = !strcmp(g, "wrapx") ? MXFP8_GROUP_WRAPX : MXFP8_GROUP_1X32;
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
