/*
 * cmd_diff.c -- `mxfp8 diff INPUT OTHER`: which of our quantization profiles explains another stack's MXFP8 bits,
 * and what kind of groups none does (mxfp8_diff, the reference section of mxfp8.h).
 *
 * INPUT holds one high-precision tensor (.npy or .safetensors), OTHER the other stack's result as `mxfp8 quantize`
 * writes it: `data` (FP8 codes, or U32 x4-packed codes along the axis) and `scales` (U8 / F8_E8M0; compact, or for a
 * 2-D input quantized along its last axis any layout of --scale-layout). Prints the profiles, the best one on a line
 * starting "profile:", then the groups it does not reproduce by class with examples. Exit 0 when the best profile
 * reproduces OTHER bit for bit ("bitwise equal"), 1 otherwise, 2 on bad usage / input.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "mx_meta.h"
#include "io/tensorfile.h"

static void help(void) {
    printf("usage: mxfp8 diff INPUT OTHER.safetensors [--fmt %s] [--axis A] [--group %s]\n"
           "                  [--tensor NAME] [--scale-layout L] [--examples N]\n\n",
           cli_names(MXFP8_ENUM_FORMAT, "|", -1), cli_names(MXFP8_ENUM_GROUP_SCHEME, "|", -1));
    printf("Explains another stack's MXFP8 result for a high-precision tensor: re-quantizes INPUT under every profile\n"
           "of this library (scale rule %s x rounding nearest-even|toward-zero x NaN/Inf as a NaN group |\n"
           "per element x saturate | no saturation x signed | unsigned zeros), reports the profile that reproduces\n"
           "the most groups bit for bit, and classifies the groups it does not reproduce: nonfinite (NaN/Inf in the\n"
           "group), tiny (amax near the bottom of E8M0), zero-sign (only the sign of zeros differs), saturation\n"
           "(elements beyond max normal, or NaN/Inf codes for finite values), pow2 (scales one step apart, amax near\n"
           "2^k or max_normal*2^k: a floating-point log2), subnormal (only FP8 subnormals differ), other.\n\n"
           "  INPUT              .npy or .safetensors with the high-precision tensor (F32, BF16, F16; F64 -> F32)\n"
           "  OTHER              .safetensors with `data` (F8_E4M3 / F8_E5M2 / U8 codes, INPUT's shape, or U32\n"
           "                     x4-packed along the axis) and `scales` (U8 / F8_E8M0)\n"
           "  --fmt F            %s (default: from data's dtype; needed for U8 / U32 codes)\n"
           "  --axis A           the quantization axis (default: where the scales' shape differs, else -1)\n"
           "  --group G          %s\n"
           "  --tensor NAME      which tensor of a .safetensors INPUT (default: the only one)\n"
           "  --scale-layout L   %s (2-D INPUT, last axis)\n"
           "  --examples N       examples printed per class (default 3, at most 4)\n"
           "  --threads N        threads (default: MXFP8_NUM_THREADS, OMP_NUM_THREADS, else all cores)\n"
           "  --quiet            accepted as by every command (diff prints no notes or progress)\n\n"
           "When OTHER describes itself (the safetensors metadata mx.format, mx.group, mx.axis, mx.scale_layout that\n"
           "mxfp8 quantize writes), those are the defaults, and a flag that contradicts them is an error.\n\n"
           "exit status: 0 a profile reproduces OTHER bit for bit, 1 it does not, 2 bad usage or input\n",
           cli_names(MXFP8_ENUM_SCALE_RULE, "|", -1), cli_names(MXFP8_ENUM_FORMAT, " | ", -1),
           cli_names(MXFP8_ENUM_GROUP_SCHEME, NULL, MXFP8_GROUP_1X32),
           cli_names(MXFP8_ENUM_SCALE_LAYOUT, NULL, MXFP8_SCALES_COMPACT));
}

/* The axis indices of group g (1x32 or wrapX, as the library's groups). */
static int members(int64_t K, int wrapx, int64_t g, int64_t *idx) {
    if (!wrapx) {
        int n = K - 32 * g < 32 ? (int)(K - 32 * g) : 32;
        for (int i = 0; i < n; i++) idx[i] = 32 * g + i;
        return n;
    }
    int64_t full = K / 512 * 512, k = 32 * g, k0, P;
    if (k < full) k0 = k - k % 512, P = 512;
    else if (K - full >= 256 && k < full + 256) k0 = full, P = 256;
    else k0 = full + (K - full >= 256 ? 256 : 0), P = 128;
    for (int s = 0; s < 4; s++)
        for (int q = 0; q < 8; q++) idx[s * 8 + q] = k0 + s * (P / 4) + 8 * (g - k0 / 32) + q;
    return 32;
}

static const char *class_note(int c) {
    static const char *const notes[MXFP8_DIFF_NUM_CLASSES] = {
        "a NaN or Inf in the group", "amax below 2^(emax-126): the shared exponent near E8M0's floor",
        "only the sign of zeros differs", "elements beyond max normal, or NaN/Inf codes for finite values",
        "scales one step apart, amax near 2^k or max_normal*2^k (a floating-point log2)",
        "only FP8 subnormals differ", "elements on the other side of x / 2^e: another element rounding",
        "none of the above"};
    return c >= 0 && c < MXFP8_DIFF_NUM_CLASSES ? notes[c] : "";
}

static void profile_name(const mxfp8_quant_profile *p, char *buf, size_t n, int longform) {
    const char *rule = mxfp8_enum_name(MXFP8_ENUM_SCALE_RULE, p->rule);
    if (longform)
        snprintf(buf, n, "%s (scale rule), %s, %s, %s, %s", rule,
                 p->round_toward_zero ? "rounding toward zero" : "round to nearest even",
                 p->nonfinite_per_element ? "NaN/Inf per element" : "NaN/Inf -> whole group NaN",
                 p->no_saturation ? "no saturation (overflow -> NaN/Inf)" : "saturating",
                 p->unsigned_zero ? "zeros unsigned (+0)" : "signed zeros");
    else
        snprintf(buf, n, "%s/%s/%s/%s/%s", rule, p->round_toward_zero ? "rtz" : "rne",
                 p->nonfinite_per_element ? "nan-element" : "nan-group", p->no_saturation ? "overflow" : "saturate",
                 p->unsigned_zero ? "unsigned-zero" : "signed-zero");
}

static float load_x(const tf_tensor *x, int64_t off) {
    if (x->dtype == TF_F32) return ((const float *)x->data)[off];
    if (x->dtype == TF_BF16) return mxfp8_bf16_to_fp32(((const uint16_t *)x->data)[off]);
    return mxfp8_fp16_to_fp32(((const uint16_t *)x->data)[off]);
}

/* One example group (gi: row-major index into the scales): where it is, amax, both scales, a differing element. */
static void print_example(const tf_tensor *x, int ax, int wrapx, mxfp8_format fmt, const uint8_t *theirs_d,
                          const uint8_t *theirs_s, const uint8_t *ours_d, const uint8_t *ours_s,
                          const int64_t *sshape, int64_t gi) {
    int64_t idx[MXFP8_MAX_DIMS], rem = gi, base = 0, st[MXFP8_MAX_DIMS], m[32];
    for (int d = x->ndim - 1, s = 1; d >= 0; d--) st[d] = s, s *= (int)x->shape[d];
    for (int d = x->ndim - 1; d >= 0; d--) idx[d] = rem % sshape[d], rem /= sshape[d];
    for (int d = 0; d < x->ndim; d++)
        if (d != ax) base += idx[d] * st[d];
    const int n = members(x->shape[ax], wrapx, idx[ax], m);
    float amax = 0.0f;
    int ndiff = 0, first = -1;
    for (int i = 0; i < n; i++) {
        const int64_t off = base + m[i] * st[ax];
        const float v = load_x(x, off);
        if (!(fabsf(v) <= amax)) amax = fabsf(v); /* NaN / Inf show */
        if (theirs_d[off] != ours_d[off] && ndiff++ == 0) first = i;
    }
    char where[128] = "";
    for (int d = 0; d < x->ndim; d++)
        snprintf(where + strlen(where), sizeof where - strlen(where), "%s%lld", d ? ", " : "", (long long)idx[d]);
    char so[24], sth[24];
    snprintf(so, sizeof so, ours_s[gi] == 255 ? "255 (NaN)" : "%u (2^%d)", ours_s[gi], (int)ours_s[gi] - 127);
    snprintf(sth, sizeof sth, theirs_s[gi] == 255 ? "255 (NaN)" : "%u (2^%d)", theirs_s[gi],
             (int)theirs_s[gi] - 127);
    printf("    group [%s]: amax %.6g, scale ours %s theirs %s, %d of %d elements differ", where, (double)amax, so, sth,
           ndiff, n);
    if (first >= 0) {
        const int64_t off = base + m[first] * st[ax];
        printf("; e.g. index %lld along the axis: x = %.6g, ours 0x%02x (%g), theirs 0x%02x (%g)",
               (long long)m[first], (double)load_x(x, off), ours_d[off], (double)mxfp8_fp8_to_fp32(ours_d[off], fmt),
               theirs_d[off], (double)mxfp8_fp8_to_fp32(theirs_d[off], fmt));
    }
    printf("\n");
}

/* OTHER's `data` as U8 codes of INPUT's shape (U32 x4-packed words unpacked along the axis). */
static int other_codes(const char *cmd, tf_set *work, const tf_tensor *x, tf_tensor *d, int ax, tf_tensor **out) {
    char err[TF_ERR_LEN];
    if (d->dtype != TF_U32) {
        *out = d;
        return CLI_OK;
    }
    tf_tensor *u = tf_add_new(work, "codes", TF_U8, x->ndim, x->shape, err, sizeof err);
    if (!u) return cli_error(cmd, "%s", err);
    mxfp8_tensor in = tf_view(d), ov = tf_view(u);
    mxfp8_status st = mxfp8_unpack_x4(&in, ax, &ov);
    if (st) return cli_lib_error(cmd, "mxfp8_unpack_x4 (OTHER's x4-packed data)", st);
    *out = u;
    return CLI_OK;
}

/* OTHER's `scales` as compact [.., G, ..] (a 2-D INPUT's other layouts converted). */
static int other_scales(const char *cmd, tf_set *work, const tf_tensor *x, tf_tensor *s, int ax, int layout,
                        const int64_t *sshape, tf_tensor **out) {
    char err[TF_ERR_LEN];
    if (layout == 0) {
        *out = s;
        return CLI_OK;
    }
    if (x->ndim != 2 || ax != 1)
        return cli_error(cmd, "--scale-layout other than compact needs a 2-D INPUT quantized along axis 1");
    tf_tensor *c = tf_add_new(work, "compact", TF_U8, 2, sshape, err, sizeof err);
    if (!c) return cli_error(cmd, "%s", err);
    mxfp8_tensor in = tf_view(s), cv = tf_view(c);
    if (in.dtype == MXFP8_DTYPE_E8M0) in.dtype = MXFP8_DTYPE_U8;
    mxfp8_status st = mxfp8_scales_from_layout(&in, x->shape[1], (mxfp8_scale_layout)layout, &cv);
    if (st) return cli_lib_error(cmd, "mxfp8_scales_from_layout (OTHER's scales)", st);
    *out = c;
    return CLI_OK;
}

/* The report; returns CLI_OK (bitwise equal) or CLI_FAIL. */
static int report(const mxfp8_diff_result *r, const tf_tensor *x, int ax, int wrapx, mxfp8_format fmt,
                  const tf_tensor *d, const tf_tensor *s, const tf_tensor *od, const tf_tensor *os, int nex) {
    char name[200];
    int order[MXFP8_DIFF_MAX_PROFILES];
    for (int i = 0; i < r->num_profiles; i++) order[i] = i;
    for (int i = 1; i < r->num_profiles; i++) /* by groups reproduced, stable */
        for (int j = i; j > 0 && r->matched[order[j]] > r->matched[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    printf("profiles reproducing the most groups (of %lld):\n", (long long)r->groups);
    for (int i = 0; i < 6 && i < r->num_profiles; i++) {
        mxfp8_quant_profile p;
        mxfp8_diff_profile(order[i], &p);
        profile_name(&p, name, sizeof name, 0);
        printf("  %-48s %lld\n", name, (long long)r->matched[order[i]]);
    }
    mxfp8_quant_profile best;
    mxfp8_diff_profile(r->best, &best);
    profile_name(&best, name, sizeof name, 1);
    printf("profile: %s -- reproduces %lld of %lld groups\n", name, (long long)r->matched[r->best],
           (long long)r->groups);
    const int64_t un = r->groups - r->matched[r->best];
    if (un == 0) {
        printf("bitwise equal: every group, scale and element code, as this profile gives it\n");
        return CLI_OK;
    }
    printf("unexplained: %lld groups the profile does not reproduce (%lld that no profile reproduces)\n",
           (long long)un, (long long)r->unmatched_by_all);
    for (int c = 0; c < MXFP8_DIFF_NUM_CLASSES; c++) {
        if (!r->unexplained[c]) continue;
        printf("  %s: %lld group%s (%s)\n", mxfp8_diff_class_name(c), (long long)r->unexplained[c],
               r->unexplained[c] == 1 ? "" : "s", class_note(c));
        for (int e = 0; e < nex && e < MXFP8_DIFF_EXAMPLES && r->example[c * MXFP8_DIFF_EXAMPLES + e] >= 0; e++)
            print_example(x, ax, wrapx, fmt, (const uint8_t *)od->data, (const uint8_t *)os->data,
                          (const uint8_t *)d->data, (const uint8_t *)s->data, s->shape,
                          r->example[c * MXFP8_DIFF_EXAMPLES + e]);
    }
    return CLI_FAIL;
}

int cmd_diff(int argc, char **argv) {
    const char *cmd = "diff";
    cli_opt opts[] = {{"fmt", 0, 0, NULL},    {"axis", 0, 0, NULL},         {"group", 0, 0, NULL},
                      {"tensor", 0, 0, NULL}, {"scale-layout", 0, 0, NULL}, {"examples", 0, 0, NULL},
                      {"threads", 0, 0, NULL}, {"quiet", 'q', 1, NULL}};
    cli_cmdline cl;
    int rc = cli_begin(&cl, cmd, argc, argv, opts, CLI_COUNT(opts), 2, help);
    if (rc != CLI_CONTINUE) return rc;
    const char *const *pos = cl.pos;
    if (cl.npos != 2) return cli_error(cmd, "needs INPUT and OTHER files (see mxfp8 diff --help)");
    int fmt = -1, layout = 0;
    int64_t axis = 0, nex = 3;
    mxfp8_group_scheme group = MXFP8_GROUP_1X32;
    const char *fmt_s = cli_val(&cl, "fmt"), *axis_s = cli_val(&cl, "axis"), *group_s = cli_val(&cl, "group"),
               *layout_s = cli_val(&cl, "scale-layout");
    if (cli_enum(cmd, "fmt", fmt_s, MXFP8_ENUM_FORMAT, &fmt) ||
        cli_int(cmd, "axis", axis_s, -MXFP8_MAX_DIMS, MXFP8_MAX_DIMS - 1, &axis) ||
        cli_group(cmd, group_s, &group) ||
        cli_enum(cmd, "scale-layout", layout_s, MXFP8_ENUM_SCALE_LAYOUT, &layout) ||
        cli_int(cmd, "examples", cli_val(&cl, "examples"), 0, MXFP8_DIFF_EXAMPLES, &nex))
        return CLI_USAGE;
    char err[TF_ERR_LEN], b1[160], b2[160], b3[160];
    tf_set in = {0}, other = {0}, work = {0};
    rc = CLI_USAGE;
    tf_tensor *x = NULL, *d0, *s0, *d = NULL, *s = NULL;
    if (tf_load(pos[0], &in, err, sizeof err) || tf_load(pos[1], &other, err, sizeof err)) {
        cli_error(cmd, "%s", err);
        goto done;
    }
    const char *tname = cli_val(&cl, "tensor");
    x = tname ? tf_find(&in, tname) : in.n == 1 ? in.t[0] : NULL;
    if (!x) {
        cli_error(cmd, "%s: %s", pos[0], tname ? "no such tensor" : "holds several tensors; choose one with --tensor");
        goto done;
    }
    if (x->dtype == TF_F64 && tf_to_f32(x, err, sizeof err)) {
        cli_error(cmd, "%s", err);
        goto done;
    }
    if ((x->dtype != TF_F32 && x->dtype != TF_BF16 && x->dtype != TF_F16) || x->ndim < 1) {
        cli_error(cmd, "%s: '%s' must be an F32, BF16 or F16 tensor of rank >= 1", pos[0], x->name);
        goto done;
    }
    d0 = tf_find(&other, "data"), s0 = tf_find(&other, "scales");
    if (!d0 || !s0) {
        cli_error(cmd, "%s: needs tensors 'data' and 'scales' (as mxfp8 quantize writes them)", pos[1]);
        goto done;
    }
    /* OTHER's own description (mxfp8 quantize writes it): the default, and a contradicting flag is an error. */
    mx_file_params fp;
    if (mx_meta_read(cmd, &other, pos[1], d0->ndim, d0->dtype, &fp)) goto done;
    if (fp.have_fmt) {
        if (fmt >= 0 && fmt != fp.fmt_e5m2) {
            mx_meta_conflict(cmd, "fmt", fmt_s, pos[1], mxfp8_enum_name(MXFP8_ENUM_FORMAT, fp.fmt_e5m2));
            goto done;
        }
        fmt = fp.fmt_e5m2;
    }
    if (fp.have_group) {
        if (group_s && group != fp.group) {
            mx_meta_conflict(cmd, "group", group_s, pos[1],
                             mxfp8_enum_name(MXFP8_ENUM_GROUP_SCHEME, fp.group));
            goto done;
        }
        group = fp.group;
    }
    if (fp.layout) {
        int32_t fl = -1;
        if (mxfp8_enum_from_name(MXFP8_ENUM_SCALE_LAYOUT, fp.layout, &fl) != MXFP8_OK) {
            cli_error(cmd, "%s: the metadata's scale layout '%s' is not %s", pos[1], fp.layout,
                      cli_names(MXFP8_ENUM_SCALE_LAYOUT, NULL, -1));
            goto done;
        }
        if (layout_s && layout != fl) {
            mx_meta_conflict(cmd, "scale-layout", layout_s, pos[1], fp.layout);
            goto done;
        }
        layout = fl;
    }
    if (fp.have_axis && fp.axis >= x->ndim) {
        cli_error(cmd, "%s: quantized along axis %d (its metadata), but INPUT is %d-D", pos[1], fp.axis, x->ndim);
        goto done;
    }
    if (fp.have_axis && axis_s && (axis < 0 ? axis + x->ndim : axis) != fp.axis) {
        char rec[32];
        snprintf(rec, sizeof rec, "axis %d", fp.axis);
        mx_meta_conflict(cmd, "axis", axis_s, pos[1], rec);
        goto done;
    }
    if (fp.have_axis && !axis_s) {
        axis = fp.axis;
        axis_s = ""; /* as if given: the file's axis, not the shapes', decides */
    }
    if (fmt < 0) {
        if (d0->dtype != TF_F8_E4M3 && d0->dtype != TF_F8_E5M2) {
            cli_error(cmd, "%s: 'data' has dtype %s: give --fmt %s", pos[1], tf_dtype_name(d0->dtype),
                      cli_names(MXFP8_ENUM_FORMAT, "|", -1));
            goto done;
        }
        fmt = d0->dtype == TF_F8_E5M2;
    }
    int ax = (int)axis;
    if (!axis_s) { /* where the scales' shape differs from the input's */
        ax = x->ndim - 1;
        if (s0->ndim == x->ndim)
            for (int k = 0; k < x->ndim; k++)
                if (s0->shape[k] != x->shape[k]) ax = k;
    } else if (ax < 0) ax += x->ndim;
    if (ax < 0 || ax >= x->ndim) {
        cli_error(cmd, "--axis %lld is out of range for the %d-D input", (long long)axis, x->ndim);
        goto done;
    }
    int64_t sshape[MXFP8_MAX_DIMS];
    memcpy(sshape, x->shape, sizeof sshape);
    sshape[ax] = (x->shape[ax] + 31) / 32;
    if (other_codes(cmd, &work, x, d0, ax, &d)) goto done;
    int same_shape = d->ndim == x->ndim;
    for (int k = 0; same_shape && k < x->ndim; k++) same_shape = d->shape[k] == x->shape[k];
    if (!same_shape) { /* said here with the files' names: the library would name its own parameters */
        cli_error(cmd, "%s: 'data' %s does not have the shape of INPUT %s '%s' %s (the codes of every element)",
                  pos[1], tf_shape_str(d->ndim, d->shape, b2, sizeof b2), pos[0], x->name,
                  tf_shape_str(x->ndim, x->shape, b1, sizeof b1));
        goto done;
    }
    if (other_scales(cmd, &work, x, s0, ax, layout, sshape, &s)) goto done;
    tf_tensor *ourd = tf_add_new(&work, "ours_data", TF_U8, x->ndim, x->shape, err, sizeof err);
    tf_tensor *ours = ourd ? tf_add_new(&work, "ours_scales", TF_U8, x->ndim, sshape, err, sizeof err) : NULL;
    if (!ours) {
        cli_error(cmd, "%s", err);
        goto done;
    }
    const mxfp8_format f = fmt ? MXFP8_FMT_E5M2 : MXFP8_FMT_E4M3;
    mxfp8_tensor xv = tf_view(x), dv = tf_view(d), sv = tf_view(s), odv = tf_view(ourd), osv = tf_view(ours);
    if (dv.dtype == MXFP8_DTYPE_E4M3 || dv.dtype == MXFP8_DTYPE_E5M2) dv.dtype = MXFP8_DTYPE_U8;
    if (sv.dtype == MXFP8_DTYPE_E8M0) sv.dtype = MXFP8_DTYPE_U8;
    printf("mxfp8 diff: %s '%s' %s %s vs %s data %s %s, scales %s (axis %d, %s groups, %s)\n", pos[0], x->name,
           tf_shape_str(x->ndim, x->shape, b1, sizeof b1), tf_dtype_name(x->dtype), pos[1],
           tf_shape_str(d0->ndim, d0->shape, b2, sizeof b2), tf_dtype_name(d0->dtype),
           tf_shape_str(s0->ndim, s0->shape, b3, sizeof b3), ax, mxfp8_enum_name(MXFP8_ENUM_GROUP_SCHEME, group),
           mxfp8_enum_name(MXFP8_ENUM_FORMAT, fmt));
    mxfp8_diff_result r;
    mxfp8_status st = mxfp8_diff(&xv, ax, f, group, &dv, &sv, &r);
    if (st) {
        cli_lib_error(cmd, "mxfp8_diff", st);
        goto done;
    }
    mxfp8_quant_profile best;
    mxfp8_diff_profile(r.best, &best);
    if ((st = mxfp8_quantize_profile(&xv, ax, f, group, &best, &odv, &osv))) {
        cli_lib_error(cmd, "mxfp8_quantize_profile", st);
        goto done;
    }
    rc = report(&r, x, ax, group == MXFP8_GROUP_WRAPX, f, ourd, ours, d, s, (int)nex);
done:
    tf_free(&in);
    tf_free(&other);
    tf_free(&work);
    return rc;
}
