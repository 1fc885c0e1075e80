/*
 * cmd_quant.c -- `mxfp8 quantize` and `mxfp8 dequantize`: MX-quantize a tensor file along an axis, and back.
 *
 * quantize writes a .safetensors file with two tensors: `data` (F8_E4M3 / F8_E5M2 codes, the input's shape) and
 * `scales` (U8 E8M0 codes, the input's shape with the axis replaced by ceil(len/32), compact group order).
 * dequantize reads such a file (scales as U8 or F8_E8M0) and writes the values as F32, BF16 or F16.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "mx_meta.h"
#include "io/tensorfile.h"
#include "plot.h"
#include "quant_stats.h"

static void help_quantize(void) {
    const mxfp8_quant_params d = mxfp8_quant_params_default();
    printf("usage: mxfp8 quantize IN -o OUT.safetensors [--fmt %s] [--axis A] [--scale-rule %s]\n"
           "                      [--group %s] [--tensor NAME] [--stats] [--plot STATS.png]\n"
           "                      [--rounding %s] [--rounding-seed S]\n\n",
           cli_names(MXFP8_ENUM_FORMAT, "|", -1), cli_names(MXFP8_ENUM_SCALE_RULE, "|", -1),
           cli_names(MXFP8_ENUM_GROUP_SCHEME, "|", -1), cli_names(MXFP8_ENUM_ROUNDING, "|", -1));
    printf("MX-quantizes a tensor along one axis (OCP MX v1.0): groups of 32 values share one E8M0 scale.\n\n"
           "  IN                 .npy or .safetensors file; F32, BF16 or F16 values (F64 is rounded to F32 first)\n"
           "  -o, --output OUT   .safetensors file to write, holding:\n"
           "                       data    F8_E4M3 / F8_E5M2 codes, IN's shape\n"
           "                       scales  U8 E8M0 codes, IN's shape with the axis replaced by ceil(len/32)\n"
           "                     and, as safetensors metadata, how they were made: mx.format (%s),\n"
           "                     mx.scale_rule, mx.group, mx.axis (0-based), mx.scale_layout (%s),\n"
           "                     mx.rounding (%s); mxfp8 dequantize reads them\n"
           "  --fmt F            element format:\n",
           cli_names(MXFP8_ENUM_FORMAT, "|", -1), mxfp8_enum_name(MXFP8_ENUM_SCALE_LAYOUT, MXFP8_SCALES_COMPACT),
           cli_names(MXFP8_ENUM_ROUNDING, "|", -1));
    cli_help_values("                       ", MXFP8_ENUM_FORMAT, (int)d.fmt);
    printf("  --axis A           quantization axis (the contraction axis of the consuming GEMM); default -1 (last)\n"
           "  --scale-rule R     the exponent e of a group's scale 2^e, from its amax (emax: the format's largest\n"
           "                     exponent):\n");
    cli_help_values("                       ", MXFP8_ENUM_SCALE_RULE, (int)d.rule);
    printf("  --group G          which values form a group:\n");
    cli_help_values("                       ", MXFP8_ENUM_GROUP_SCHEME, (int)d.group);
    printf("  --tensor NAME      which tensor of a .safetensors input (default: the only one)\n"
           "  --rounding R       element rounding:\n");
    cli_help_values("                       ", MXFP8_ENUM_ROUNDING, (int)d.rounding);
    printf("  --rounding-seed S  the seed of stochastic rounding (default 0; decimal or 0x hex)\n"
           "  --stats            print what the quantization did: the scale codes' range, saturated, flushed-to-zero\n"
           "                     and subnormal elements, SQNR, the per-group relative error ||x - x_hat|| / ||x||\n"
           "  --plot FILE        --stats, and draw the histograms of the scale codes and of the per-group relative\n"
           "                     error (.png, .svg or .pdf; needs matplotlib: python3, or $MXFP8_PYTHON)\n"
           "  --threads N        threads (default: MXFP8_NUM_THREADS, OMP_NUM_THREADS, else all cores)\n"
           "  --quiet            no notes on stderr (as for every command)\n\n"
           "exit status: 0 ok, 2 bad usage, bad input or IO error (no output file is left behind)\n");
}

static void help_dequantize(void) {
    const char *groups = cli_names(MXFP8_ENUM_GROUP_SCHEME, "|", -1);
    const char *g_default = mxfp8_enum_name(MXFP8_ENUM_GROUP_SCHEME, MXFP8_GROUP_1X32);
    printf("usage: mxfp8 dequantize IN.safetensors -o OUT(.npy|.safetensors) [--axis A] [--group %s]\n"
           "                        [--dtype f32|bf16|f16]\n\n", groups);
    printf("Dequantizes the `data` and `scales` tensors written by mxfp8 quantize: value = fp8(data) * 2^(scale-127),\n"
           "exact in F32 (rounded to nearest even for BF16/F16). Scale code 255 decodes to NaN.\n\n"
           "  IN                 .safetensors with `data` (F8_E4M3 / F8_E5M2) and `scales` (U8 or F8_E8M0)\n"
           "  -o, --output OUT   .npy (F32/F16 only) or .safetensors (tensor `dequantized`)\n"
           "  --axis A           the quantization axis; default: the file's (see below), else the axis where the\n"
           "                     scales' shape differs, else -1\n"
           "  --group G          the group scheme used to quantize: %s; default: the file's, else %s\n"
           "  --dtype D          output dtype: f32 (default), bf16 or f16\n"
           "  --threads N        threads (default: MXFP8_NUM_THREADS, OMP_NUM_THREADS, else all cores)\n"
           "  --quiet            accepted as by every command (dequantize prints no notes or progress)\n\n"
           "Files written by mxfp8 quantize describe themselves in their safetensors metadata (mx.format,\n"
           "mx.scale_rule, mx.group, mx.axis, mx.scale_layout, mx.rounding): their group scheme and axis are used,\n"
           "and a --group or --axis that contradicts them is an error. Files without that metadata (other stacks)\n"
           "are read with the flags.\n\n"
           "exit status: 0 ok, 2 bad usage, bad input or IO error (no output file is left behind)\n",
           cli_names(MXFP8_ENUM_GROUP_SCHEME, NULL, -1), g_default);
}

/* "'a', 'b', 'c'" (the names of a set; "..." once they no longer fit), for messages. len >= 8. */
static const char *tensor_names(const tf_set *set, char *buf, size_t len) {
    size_t w = 0;
    buf[0] = 0;
    for (int i = 0; i < set->n; i++) {
        const char *nm = set->t[i]->name;
        if (w + strlen(nm) + 4 + 6 >= len) { /* keeps room for ", ..." */
            memcpy(buf + w, w ? ", ..." : "...", w ? 6 : 4);
            break;
        }
        w += (size_t)snprintf(buf + w, len - w, "%s'%s'", i ? ", " : "", nm);
    }
    return buf;
}

static int pick_tensor(const char *cmd, const char *path, tf_set *set, const char *name, tf_tensor **out) {
    char names[400];
    if (name) {
        *out = tf_find(set, name);
        if (!*out)
            return cli_error(cmd, "%s: no tensor named '%s' (it holds %s)", path, name,
                             tensor_names(set, names, sizeof names));
        return CLI_OK;
    }
    if (set->n == 0) return cli_error(cmd, "%s holds no tensors", path);
    if (set->n != 1)
        return cli_error(cmd, "%s holds %d tensors (%s); choose one with --tensor NAME", path, set->n,
                         tensor_names(set, names, sizeof names));
    *out = set->t[0];
    return CLI_OK;
}

/* --stats (and --plot): dequantize the outputs, compute and print the statistics, draw them. A plot that cannot be
 * drawn (matplotlib was checked before the work) sets *plot_failed after its error line and is not a failure of the
 * statistics: the quantized tensors are still written. */
static int report_stats(const char *cmd, const char *path, const tf_tensor *x, const tf_tensor *d, const tf_tensor *s,
                        int ax, const mxfp8_quant_params *qp, const char *plot, int *plot_failed) {
    char err[TF_ERR_LEN];
    tf_set tmp = {0};
    tf_tensor *deq = tf_add_new(&tmp, "deq", TF_F32, x->ndim, x->shape, err, sizeof err);
    if (!deq) return cli_error(cmd, "%s", err);
    mxfp8_tensor dv = tf_view(d), sv = tf_view(s), ov = tf_view(deq);
    mxfp8_status st = mxfp8_dequantize(&dv, &sv, ax, qp->group, &ov);
    cJSON *doc = cJSON_CreateObject();
    quant_stats qs;
    int rc = CLI_USAGE;
    if (st != MXFP8_OK) cli_lib_error(cmd, "mxfp8_dequantize", st);
    else if (!doc || quant_stats_compute(x, d, s, deq, ax, qp, qp->stats, &qs, doc)) cli_error(cmd, "out of memory");
    else {
        quant_stats_print(&qs, x->numel, qp);
        cJSON_AddStringToObject(doc, "input", path);
        cJSON_AddNumberToObject(doc, "axis", ax);
        cJSON_AddStringToObject(doc, "group", mxfp8_enum_name(MXFP8_ENUM_GROUP_SCHEME, qp->group));
        cJSON_AddStringToObject(doc, "fmt", mxfp8_enum_name(MXFP8_ENUM_FORMAT, qp->fmt));
        cJSON_AddStringToObject(doc, "rule", mxfp8_enum_name(MXFP8_ENUM_SCALE_RULE, qp->rule));
        rc = CLI_OK;
        if (plot && cli_plot(cmd, "quantize", doc, plot) != CLI_OK) *plot_failed = 1;
        else if (plot) printf("wrote the plot to %s\n", plot);
    }
    cJSON_Delete(doc);
    tf_free(&tmp);
    return rc;
}

int cmd_quantize(int argc, char **argv) {
    const char *cmd = "quantize";
    cli_opt opts[] = {{"output", 'o', 0, NULL},     {"fmt", 0, 0, NULL},   {"axis", 0, 0, NULL},
                      {"scale-rule", 0, 0, NULL}, {"group", 0, 0, NULL}, {"tensor", 0, 0, NULL},
                      {"stats", 0, 1, NULL},      {"plot", 0, 0, NULL},  {"rounding", 0, 0, NULL},
                      {"rounding-seed", 0, 0, NULL}, {"threads", 0, 0, NULL}, {"quiet", 'q', 1, NULL}};
    cli_cmdline cl;
    int rc = cli_begin(&cl, cmd, argc, argv, opts, CLI_COUNT(opts), 1, help_quantize);
    if (rc != CLI_CONTINUE) return rc;
    if (cl.npos != 1) return cli_error(cmd, "needs one input file (see mxfp8 quantize --help)");
    const char *out_path = cli_val(&cl, "output");
    if (!out_path) return cli_error(cmd, "needs -o OUT.safetensors");
    if (cli_not_input(cmd, "output", out_path, cl.pos[0])) return CLI_USAGE;
    int fmt = 0;
    int64_t axis = -1;
    mxfp8_quant_params qp = mxfp8_quant_params_default();
    const char *fs = cli_val(&cl, "fmt");
    if (cli_enum(cmd, "fmt", fs, MXFP8_ENUM_FORMAT, &fmt) ||
        cli_int(cmd, "axis", cli_val(&cl, "axis"), -MXFP8_MAX_DIMS, MXFP8_MAX_DIMS - 1, &axis) ||
        cli_scale_rule(cmd, cli_val(&cl, "scale-rule"), &qp.rule) ||
        cli_group(cmd, cli_val(&cl, "group"), &qp.group) ||
        cli_rounding(cmd, "rounding", cli_val(&cl, "rounding"), &qp.rounding) ||
        cli_seed64(cmd, "rounding-seed", cli_val(&cl, "rounding-seed"), &qp.seed))
        return CLI_USAGE;
    qp.fmt = fmt ? MXFP8_FMT_E5M2 : MXFP8_FMT_E4M3;
    char err[TF_ERR_LEN];
    size_t olen = strlen(out_path);
    if (olen < 12 || strcmp(out_path + olen - 12, ".safetensors"))
        return cli_error(cmd, "%s: the output holds two tensors (data, scales): its name must end in .safetensors",
                         out_path);
    if (tf_check_writable(out_path, 2, err, sizeof err)) return cli_error(cmd, "%s", err);
    const char *plot = cli_val(&cl, "plot");
    int stats = plot || cli_val(&cl, "stats");
    if (plot && cli_plot_check(cmd, plot)) return CLI_USAGE;
    mxfp8_quant_stats lib_stats; /* --stats: the library's own counts of the call */
    if (stats) qp.stats = &lib_stats;

    tf_set in = {0}, out = {0};
    rc = CLI_USAGE;
    if (tf_load(cl.pos[0], &in, err, sizeof err)) {
        cli_error(cmd, "%s", err);
        goto done;
    }
    tf_tensor *x;
    if (pick_tensor(cmd, cl.pos[0], &in, cli_val(&cl, "tensor"), &x)) goto done;
    if (x->dtype == TF_F64 && tf_to_f32(x, err, sizeof err)) {
        cli_error(cmd, "%s", err);
        goto done;
    }
    if (x->dtype != TF_F32 && x->dtype != TF_BF16 && x->dtype != TF_F16) {
        cli_error(cmd, "%s: tensor '%s' has dtype %s; quantize needs F32, BF16 or F16 values", cl.pos[0], x->name,
                  tf_dtype_name(x->dtype));
        goto done;
    }
    if (x->ndim < 1) {
        cli_error(cmd, "%s: tensor '%s' is a scalar; quantize needs rank >= 1", cl.pos[0], x->name);
        goto done;
    }
    if (axis < -x->ndim || axis >= x->ndim) {
        cli_error(cmd, "--axis %lld is out of range for the %d-D tensor '%s'", (long long)axis, x->ndim, x->name);
        goto done;
    }
    int ax = (int)(axis < 0 ? axis + x->ndim : axis);
    int64_t sshape[MXFP8_MAX_DIMS];
    memcpy(sshape, x->shape, sizeof sshape);
    sshape[ax] = (x->shape[ax] + 31) / 32;
    tf_tensor *d = tf_add_new(&out, "data", qp.fmt == MXFP8_FMT_E4M3 ? TF_F8_E4M3 : TF_F8_E5M2, x->ndim, x->shape,
                              err, sizeof err);
    tf_tensor *s = d ? tf_add_new(&out, "scales", TF_U8, x->ndim, sshape, err, sizeof err) : NULL;
    if (!s) {
        cli_error(cmd, "%s", err);
        goto done;
    }
    mxfp8_tensor src = tf_view(x), dv = tf_view(d), sv = tf_view(s);
    mxfp8_status st = mxfp8_quantize(&src, ax, &qp, &dv, &sv);
    if (st != MXFP8_OK) {
        cli_lib_error(cmd, "mxfp8_quantize", st);
        goto done;
    }
    if (mx_meta_record(&out, ax, &qp, err, sizeof err)) {
        cli_error(cmd, "%s", err);
        goto done;
    }
    /* --stats first: when they fail, no output is left behind (and the plot goes when the save fails); a plot that
     * could not be drawn leaves the output written, and the exit status says that the plot is missing */
    int plot_failed = 0;
    if (stats && report_stats(cmd, cl.pos[0], x, d, s, ax, &qp, plot, &plot_failed)) goto done;
    if (tf_save(out_path, &out, err, sizeof err)) {
        if (plot && !plot_failed) unlink(plot);
        cli_error(cmd, "%s", err);
        goto done;
    }
    char sb1[160], sb2[160];
    printf("%s: wrote data %s %s and scales %s U8 (E8M0; axis %d, %s groups, %s rule)\n", out_path,
           tf_shape_str(d->ndim, d->shape, sb1, sizeof sb1), tf_dtype_name(d->dtype),
           tf_shape_str(s->ndim, s->shape, sb2, sizeof sb2), ax, mxfp8_enum_name(MXFP8_ENUM_GROUP_SCHEME, qp.group),
           mxfp8_enum_name(MXFP8_ENUM_SCALE_RULE, qp.rule));
    if (plot_failed && !cli_val(&cl, "quiet"))
        fprintf(stderr, "mxfp8 %s: note: %s was written; only the plot %s is missing\n", cmd, out_path, plot);
    rc = plot_failed ? CLI_USAGE : CLI_OK;
done:
    tf_free(&in);
    tf_free(&out);
    return rc;
}

int cmd_dequantize(int argc, char **argv) {
    const char *cmd = "dequantize";
    cli_opt opts[] = {{"output", 'o', 0, NULL}, {"axis", 0, 0, NULL},    {"group", 0, 0, NULL},
                      {"dtype", 0, 0, NULL},    {"threads", 0, 0, NULL}, {"quiet", 'q', 1, NULL}};
    cli_cmdline cl;
    int rc = cli_begin(&cl, cmd, argc, argv, opts, CLI_COUNT(opts), 1, help_dequantize);
    if (rc != CLI_CONTINUE) return rc;
    if (cl.npos != 1) return cli_error(cmd, "needs one input file (see mxfp8 dequantize --help)");
    const char *out_path = cli_val(&cl, "output");
    if (!out_path) return cli_error(cmd, "needs -o OUT(.npy|.safetensors)");
    if (cli_not_input(cmd, "output", out_path, cl.pos[0])) return CLI_USAGE;
    static const char *const dts[] = {"f32", "bf16", "f16"};
    static const tf_dtype dtv[] = {TF_F32, TF_BF16, TF_F16};
    int dt = 0;
    int64_t axis = 0;
    int axis_given = cli_val(&cl, "axis") != NULL, group_given = cli_val(&cl, "group") != NULL;
    mxfp8_group_scheme group = MXFP8_GROUP_1X32;
    if (cli_choice(cmd, "dtype", cli_val(&cl, "dtype"), dts, 3, &dt) ||
        cli_int(cmd, "axis", cli_val(&cl, "axis"), -MXFP8_MAX_DIMS, MXFP8_MAX_DIMS - 1, &axis) ||
        cli_group(cmd, cli_val(&cl, "group"), &group))
        return CLI_USAGE;
    char err[TF_ERR_LEN];
    if (tf_check_writable(out_path, 1, err, sizeof err)) return cli_error(cmd, "%s", err);
    size_t olen = strlen(out_path);
    if (dtv[dt] == TF_BF16 && olen >= 4 && !strcmp(out_path + olen - 4, ".npy"))
        return cli_error(cmd, "%s: .npy cannot hold bf16; write .safetensors or use --dtype f32", out_path);

    tf_set in = {0}, out = {0};
    rc = CLI_USAGE;
    if (tf_load(cl.pos[0], &in, err, sizeof err)) {
        cli_error(cmd, "%s", err);
        goto done;
    }
    tf_tensor *d = tf_find(&in, "data"), *s = tf_find(&in, "scales");
    if (!d || !s) {
        cli_error(cmd, "%s: needs tensors 'data' and 'scales' (as written by mxfp8 quantize)", cl.pos[0]);
        goto done;
    }
    if (d->dtype != TF_F8_E4M3 && d->dtype != TF_F8_E5M2) {
        cli_error(cmd, "%s: 'data' has dtype %s; F8_E4M3 or F8_E5M2 codes are needed", cl.pos[0],
                  tf_dtype_name(d->dtype));
        goto done;
    }
    if (s->dtype != TF_U8 && s->dtype != TF_F8_E8M0) {
        cli_error(cmd, "%s: 'scales' has dtype %s; U8 or F8_E8M0 codes are needed", cl.pos[0], tf_dtype_name(s->dtype));
        goto done;
    }
    char sb1[160], sb2[160];
    if (d->ndim < 1 || d->ndim != s->ndim) {
        cli_error(cmd, "%s: 'data' %s and 'scales' %s do not match", cl.pos[0], tf_shape_str(d->ndim, d->shape, sb1, 160),
                  tf_shape_str(s->ndim, s->shape, sb2, 160));
        goto done;
    }
    /* The file's description (written by mxfp8 quantize): the default, and a contradicting flag is an error rather
     * than a silently wrong result. */
    mx_file_params fp;
    if (mx_meta_read(cmd, &in, cl.pos[0], d->ndim, d->dtype, &fp)) goto done;
    int32_t layout = MXFP8_SCALES_COMPACT;
    if (fp.layout && (mxfp8_enum_from_name(MXFP8_ENUM_SCALE_LAYOUT, fp.layout, &layout) != MXFP8_OK ||
                      layout != MXFP8_SCALES_COMPACT)) {
        cli_error(cmd, "%s: the metadata says scale layout '%s'; dequantize reads %s scales", cl.pos[0], fp.layout,
                  mxfp8_enum_name(MXFP8_ENUM_SCALE_LAYOUT, MXFP8_SCALES_COMPACT));
        goto done;
    }
    if (fp.have_group) {
        if (group_given && fp.group != group) {
            mx_meta_conflict(cmd, "group", cli_val(&cl, "group"), cl.pos[0],
                             mxfp8_enum_name(MXFP8_ENUM_GROUP_SCHEME, fp.group));
            goto done;
        }
        group = fp.group;
    }
    if (fp.have_axis) {
        if (axis_given && (axis < 0 ? axis + d->ndim : axis) != fp.axis) {
            char rec[32];
            snprintf(rec, sizeof rec, "axis %d", fp.axis);
            mx_meta_conflict(cmd, "axis", cli_val(&cl, "axis"), cl.pos[0], rec);
            goto done;
        }
        axis = fp.axis;
        axis_given = 1;
    }
    int ax = -1;
    if (axis_given) {
        if (axis < -d->ndim || axis >= d->ndim) {
            cli_error(cmd, "--axis %lld is out of range for the %d-D tensor 'data'", (long long)axis, d->ndim);
            goto done;
        }
        ax = (int)(axis < 0 ? axis + d->ndim : axis);
    } else {
        for (int i = 0; i < d->ndim; i++)
            if (d->shape[i] != s->shape[i]) {
                if (ax >= 0) {
                    ax = -2;
                    break;
                }
                ax = i;
            }
        if (ax == -2) {
            cli_error(cmd, "%s: 'data' %s and 'scales' %s differ in more than one axis", cl.pos[0],
                      tf_shape_str(d->ndim, d->shape, sb1, 160), tf_shape_str(s->ndim, s->shape, sb2, 160));
            goto done;
        }
        if (ax < 0) ax = d->ndim - 1;
    }
    tf_tensor *o = tf_add_new(&out, "dequantized", dtv[dt], d->ndim, d->shape, err, sizeof err);
    if (!o) {
        cli_error(cmd, "%s", err);
        goto done;
    }
    mxfp8_tensor dv = tf_view(d), sv = tf_view(s), ov = tf_view(o);
    mxfp8_status st = mxfp8_dequantize(&dv, &sv, ax, group, &ov);
    if (st != MXFP8_OK) {
        cli_lib_error(cmd, "mxfp8_dequantize", st);
        goto done;
    }
    if (tf_save(out_path, &out, err, sizeof err)) {
        cli_error(cmd, "%s", err);
        goto done;
    }
    printf("%s: wrote %s %s (axis %d, %s groups)\n", out_path, tf_shape_str(o->ndim, o->shape, sb1, sizeof sb1),
           tf_dtype_name(o->dtype), ax, mxfp8_enum_name(MXFP8_ENUM_GROUP_SCHEME, group));
    rc = CLI_OK;
done:
    tf_free(&in);
    tf_free(&out);
    return rc;
}
