/*
 * diff.c -- quantization under a profile (scale rule x rounding x NaN/Inf policy x saturation x sign of zero) and the
 * cross-stack diff that finds the profile explaining another stack's MXFP8 bits and classifies the groups it does
 * not (include/mxfp8.h, "Cross-stack diff"). Scalar reference code on the inline codecs (src/format/codec.h): a
 * diagnostic, not a kernel. Threads split the groups; counts are integers, so results do not depend on them.
 */
#include <math.h>
#include <stdlib.h>

#include "../format/codec.h"
#include "../format/groups.h"
#include "../runtime/enums.h"
#include "../runtime/threads.h"
#include "../runtime/tensor.h"

#define NPROF 48 /* 3 rules x 2 roundings x 2 NaN/Inf policies x 2 saturations x 2 zero signs */

int mxfp8_diff_num_profiles(void) { return NPROF; }

static mxfp8_quant_profile profile_of(int i) {
    mxfp8_quant_profile p;
    p.unsigned_zero = i & 1;
    p.no_saturation = (i >> 1) & 1;
    p.nonfinite_per_element = (i >> 2) & 1;
    p.round_toward_zero = (i >> 3) & 1;
    p.rule = (mxfp8_scale_rule)(i >> 4);
    return p;
}

mxfp8_status mxfp8_diff_profile(int i, mxfp8_quant_profile *out) {
    mxfp8i_clear_error();
    MXFP8I_RETURN_ERROR_IF(!out, MXFP8_ERR_NULL_POINTER, "mxfp8_diff_profile: out is NULL");
    MXFP8I_RETURN_ERROR_IF(i < 0 || i >= NPROF, MXFP8_ERR_INVALID_ARGUMENT,
                           "mxfp8_diff_profile: profile %d is not in [0, %d)", i, NPROF);
    *out = profile_of(i);
    return MXFP8_OK;
}

const char *mxfp8_diff_class_name(int c) {
    static const char *const names[MXFP8_DIFF_NUM_CLASSES] = {"nonfinite", "tiny",      "zero-sign", "saturation",
                                                              "pow2",      "subnormal", "rounding",  "other"};
    return c >= 0 && c < MXFP8_DIFF_NUM_CLASSES ? names[c] : "?";
}

/* ---------------------------------------------------------------------------------------------------------- */
/* One group under a profile                                                                                  */
/* ---------------------------------------------------------------------------------------------------------- */
static inline int is_nonfinite(float x) { return !(fabsf(x) <= 3.4028234663852886e38f); }

/* The code of one finite y = x * 2^-e under the profile's rounding, saturation and zero sign. */
static uint8_t elem_code(float y, mxfp8_format fmt, const mxfp8_quant_profile *pr) {
    const int e5 = fmt == MXFP8_FMT_E5M2, m = e5 ? 2 : 3, bias = e5 ? 15 : 7, maxc = e5 ? 0x7B : 0x7E;
    uint32_t u = mxfp8i_f32_bits(y), a = u & 0x7FFFFFFFu;
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    int64_t c = pr->round_toward_zero ? mxfp8i_round_to_code_sr(a, m, bias, 0xFFFFFFFFu) /* never rounds up */
                                      : mxfp8i_round_to_code(a, m, bias);
    if (c > maxc) {
        if (!pr->no_saturation) c = maxc;
        else return sign | (uint8_t)(e5 ? 0x7C : 0x7F); /* overflow: Inf (E5M2) / NaN (E4M3) */
    }
    if (c == 0 && pr->unsigned_zero) return 0;
    return sign | (uint8_t)c;
}

/* Quantize n values (member order) under a profile: codes[0..n) and the scale code. */
static uint8_t group_profile(const float *x, int n, mxfp8_format fmt, const mxfp8_quant_profile *pr, uint8_t *codes) {
    float amax = 0.0f;
    int nonfinite = 0;
    for (int i = 0; i < n; i++) {
        if (is_nonfinite(x[i])) nonfinite = 1;
        else if (fabsf(x[i]) > amax) amax = fabsf(x[i]);
    }
    const uint8_t nan = mxfp8i_fmt(fmt).nan_code;
    if (nonfinite && !pr->nonfinite_per_element) {
        for (int i = 0; i < n; i++) codes[i] = (uint8_t)(nan | (signbit(x[i]) ? 0x80 : 0));
        return 255;
    }
    const uint8_t s = mxfp8i_scale_code(amax, fmt, pr->rule);
    const float inv = ldexpf(1.0f, 127 - (int)s);
    for (int i = 0; i < n; i++) {
        if (isnan(x[i])) codes[i] = (uint8_t)(nan | (signbit(x[i]) ? 0x80 : 0));
        else if (isinf(x[i])) codes[i] = (uint8_t)((fmt == MXFP8_FMT_E5M2 ? 0x7C : 0x7F) | (x[i] < 0 ? 0x80 : 0));
        else codes[i] = elem_code(x[i] * inv, fmt, pr);
    }
    return s;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Walking the groups of an N-D tensor                                                                        */
/* ---------------------------------------------------------------------------------------------------------- */
typedef struct walk {
    const mxfp8_tensor *src, *data, *scales;
    int ax;
    int64_t K, ngroups;
    mxfp8_group_scheme group;
} walk;

/* Group gi (row-major index into the scales tensor): its values, and the element offsets of data and src. */
static int load_group(const walk *w, int64_t gi, float *x, int64_t *doff, int64_t *soff) {
    const mxfp8_tensor *s = w->scales;
    int64_t idx[MXFP8_MAX_DIMS], rem = gi, base_src = 0, base_data = 0;
    for (int d = s->ndim - 1; d >= 0; d--) {
        idx[d] = rem % s->shape[d];
        rem /= s->shape[d];
    }
    *soff = 0;
    for (int d = 0; d < s->ndim; d++) {
        *soff += idx[d] * s->strides[d];
        if (d == w->ax) continue;
        base_src += idx[d] * w->src->strides[d];
        base_data += idx[d] * w->data->strides[d];
    }
    int64_t mem[32];
    const int n = mxfp8i_group_members(w->K, w->group, idx[w->ax], mem);
    for (int i = 0; i < n; i++) {
        x[i] = mxfp8i_load_f32(w->src->data, w->src->dtype, base_src + mem[i] * w->src->strides[w->ax]);
        doff[i] = base_data + mem[i] * w->data->strides[w->ax];
    }
    return n;
}

static mxfp8_status check_args(const char *fn, const mxfp8_tensor *src, int axis, mxfp8_format fmt,
                               mxfp8_group_scheme group, const mxfp8_tensor *data, const mxfp8_tensor *scales,
                               int out, walk *w) {
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_view(fn, "src", src));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_dtype(fn, "src", src, 3, MXFP8_DTYPE_F32, MXFP8_DTYPE_BF16, MXFP8_DTYPE_F16));
    MXFP8I_RETURN_ERROR_IF(src->ndim < 1, MXFP8_ERR_SHAPE_MISMATCH, "%s: src must have rank >= 1", fn);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_enum(fn, "fmt", MXFP8_ENUM_FORMAT, (int)fmt));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_enum(fn, "group", MXFP8_ENUM_GROUP_SCHEME, (int)group));
    int ax;
    MXFP8I_RETURN_ERROR_IF(!mxfp8i_norm_axis(axis, src->ndim, &ax), MXFP8_ERR_INVALID_ARGUMENT,
                           "%s: axis %d is out of range for a %d-D tensor", fn, axis, (int)src->ndim);
    MXFP8I_RETURN_ERROR_IF(group == MXFP8_GROUP_WRAPX && src->shape[ax] % 128, MXFP8_ERR_UNSUPPORTED,
                           "%s: wrapX groups need the axis length %% 128 == 0", fn);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_view(fn, "data", data));
    MXFP8I_FORWARD_IF_ERROR(
        mxfp8i_check_dtype(fn, "data", data, 3, MXFP8_DTYPE_E4M3, MXFP8_DTYPE_E5M2, MXFP8_DTYPE_U8));
    MXFP8I_RETURN_ERROR_IF(data->dtype != MXFP8_DTYPE_U8 && data->dtype != mxfp8i_fmt_dtype(fmt), MXFP8_ERR_DTYPE,
                           "%s: data has dtype %s but fmt is %s", fn, mxfp8_dtype_name(data->dtype),
                           mxfp8_dtype_name(mxfp8i_fmt_dtype(fmt)));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_same_shape(fn, "src", src, "data", data));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_view(fn, "scales", scales));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_dtype(fn, "scales", scales, 2, MXFP8_DTYPE_E8M0, MXFP8_DTYPE_U8));
    int ok = scales->ndim == src->ndim;
    for (int d = 0; ok && d < src->ndim; d++)
        ok = scales->shape[d] == (d == ax ? mxfp8i_ceil_div(src->shape[d], 32) : src->shape[d]);
    MXFP8I_RETURN_ERROR_IF(!ok, MXFP8_ERR_SHAPE_MISMATCH,
                           "%s: scales must have src's shape with shape[%d] = ceil(%lld/32)", fn, ax,
                           (long long)src->shape[ax]);
    if (out) {
        MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_distinct(fn, "data", data));
        MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_distinct(fn, "scales", scales));
        MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_no_alias(fn, "data", data, "src", src));
        MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_no_alias(fn, "scales", scales, "src", src));
        MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_no_alias(fn, "data", data, "scales", scales));
    }
    w->src = src, w->data = data, w->scales = scales, w->ax = ax, w->K = src->shape[ax], w->group = group;
    w->ngroups = mxfp8_tensor_numel(scales);
    return MXFP8_OK;
}

mxfp8_status mxfp8_quantize_profile(const mxfp8_tensor *src, int axis, mxfp8_format fmt, mxfp8_group_scheme group,
                                    const mxfp8_quant_profile *profile, mxfp8_tensor *data, mxfp8_tensor *scales) {
    static const char *fn = "mxfp8_quantize_profile";
    mxfp8i_clear_error();
    MXFP8I_RETURN_ERROR_IF(!src || !data || !scales || !profile, MXFP8_ERR_NULL_POINTER, "%s: a pointer is NULL", fn);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_enum(fn, "profile->rule", MXFP8_ENUM_SCALE_RULE, (int)profile->rule));
    walk w;
    MXFP8I_FORWARD_IF_ERROR(check_args(fn, src, axis, fmt, group, data, scales, 1, &w));
#pragma omp parallel for schedule(static) num_threads(w.ngroups < 4096 ? 1 : mxfp8i_num_threads())
    for (int64_t gi = 0; gi < w.ngroups; gi++) {
        float x[32];
        int64_t doff[32], soff;
        uint8_t c[32];
        const int n = load_group(&w, gi, x, doff, &soff);
        ((uint8_t *)scales->data)[soff] = group_profile(x, n, fmt, profile, c);
        for (int i = 0; i < n; i++) ((uint8_t *)data->data)[doff[i]] = c[i];
    }
    return MXFP8_OK;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* The diff                                                                                                   */
/* ---------------------------------------------------------------------------------------------------------- */
/* |a / b - 1| <= 2^-16 for b = 2^k or max_normal * 2^k (k any). */
static int near_pow2_or_max(float amax, mxfp8_format fmt) {
    if (!(amax > 0.0f)) return 0;
    int k;
    double f = frexp((double)amax, &k); /* amax = f * 2^k, f in [0.5, 1) */
    const double tol = ldexp(1.0, -16);
    if (fabs(f / 0.5 - 1.0) <= tol || fabs(f - 1.0) <= tol) return 1;
    const double mn = (double)mxfp8i_fmt(fmt).max_normal, r = (double)amax / mn;
    int j;
    double g = frexp(r, &j);
    return fabs(g / 0.5 - 1.0) <= tol || fabs(g - 1.0) <= tol;
}

/* Codes a and b (a != b) are the two FP8 neighbours of finite y: same sign, adjacent magnitudes bracketing |y|. */
static int neighbours(float y, uint8_t a, uint8_t b, mxfp8_format fmt) {
    if ((a ^ b) & 0x80 || abs((int)(a & 0x7F) - (int)(b & 0x7F)) != 1) return 0;
    const float va = fabsf(mxfp8i_fp8_to_fp32(a, fmt)), vb = fabsf(mxfp8i_fp8_to_fp32(b, fmt)), ay = fabsf(y);
    return fminf(va, vb) <= ay && ay <= fmaxf(va, vb);
}

/* The class of a group the best profile does not reproduce: x[0..n) values, theirs/ours codes and scales. */
static int classify(const float *x, int n, mxfp8_format fmt, const uint8_t *theirs, uint8_t ts, const uint8_t *ours,
                    uint8_t os) {
    const mxfp8i_fmt_info fi = mxfp8i_fmt(fmt);
    const int m = fmt == MXFP8_FMT_E5M2 ? 2 : 3;
    float amax = 0.0f;
    for (int i = 0; i < n; i++) {
        if (is_nonfinite(x[i])) return MXFP8_DIFF_NONFINITE;
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]);
    }
    if (amax > 0.0f && amax < ldexpf(1.0f, fi.emax - 126)) return MXFP8_DIFF_TINY;
    int zero_sign = ts == os, subn = ts == os, nbr = ts == os && os != 255, sat = 0;
    const float inv = os == 255 ? 0.0f : ldexpf(1.0f, 127 - (int)os);
    for (int i = 0; i < n; i++) {
        if (os != 255 && fabsf(x[i] * inv) > fi.max_normal) sat = 1;
        const int tm = theirs[i] & 0x7F, om = ours[i] & 0x7F;
        if ((fmt == MXFP8_FMT_E4M3 && tm == 0x7F) || (fmt == MXFP8_FMT_E5M2 && tm >= 0x7C)) sat = 1;
        if (theirs[i] == ours[i]) continue;
        if (!(tm == 0 && om == 0)) zero_sign = 0;
        if (!(tm < (1 << m) || om < (1 << m))) subn = 0;
        if (nbr && !neighbours(x[i] * inv, theirs[i], ours[i], fmt)) nbr = 0;
    }
    if (zero_sign) return MXFP8_DIFF_ZERO_SIGN;
    if (sat) return MXFP8_DIFF_SATURATION;
    if (ts != 255 && os != 255 && abs((int)ts - (int)os) == 1 && near_pow2_or_max(amax, fmt)) return MXFP8_DIFF_POW2;
    if (subn) return MXFP8_DIFF_SUBNORMAL;
    if (nbr) return MXFP8_DIFF_ROUNDING;
    return MXFP8_DIFF_OTHER;
}

/* The group's other-stack codes and scale (offsets from load_group). */
static uint8_t load_theirs(const walk *w, int64_t soff, const int64_t *doff, int n, uint8_t *t) {
    for (int i = 0; i < n; i++) t[i] = ((const uint8_t *)w->data->data)[doff[i]];
    return ((const uint8_t *)w->scales->data)[soff];
}

mxfp8_status mxfp8_diff(const mxfp8_tensor *src, int axis, mxfp8_format fmt, mxfp8_group_scheme group,
                        const mxfp8_tensor *data, const mxfp8_tensor *scales, mxfp8_diff_result *r) {
    static const char *fn = "mxfp8_diff";
    mxfp8i_clear_error();
    MXFP8I_RETURN_ERROR_IF(!src || !data || !scales || !r, MXFP8_ERR_NULL_POINTER, "%s: a pointer is NULL", fn);
    walk w;
    MXFP8I_FORWARD_IF_ERROR(check_args(fn, src, axis, fmt, group, data, scales, 0, &w));
    uint64_t *mask = (uint64_t *)malloc((size_t)(w.ngroups > 0 ? w.ngroups : 1) * sizeof *mask);
    MXFP8I_RETURN_ERROR_IF(!mask, MXFP8_ERR_OUT_OF_MEMORY, "%s: out of memory for %lld groups", fn,
                           (long long)w.ngroups);
    mxfp8_quant_profile prof[NPROF];
    for (int p = 0; p < NPROF; p++) prof[p] = profile_of(p);
    int64_t matched[NPROF] = {0}, none = 0;
#pragma omp parallel for schedule(static) num_threads(w.ngroups < 1024 ? 1 : mxfp8i_num_threads()) \
    reduction(+ : matched[:NPROF], none)
    for (int64_t gi = 0; gi < w.ngroups; gi++) {
        float x[32];
        int64_t doff[32], soff;
        uint8_t t[32], c[32];
        const int n = load_group(&w, gi, x, doff, &soff);
        const uint8_t ts = load_theirs(&w, soff, doff, n, t);
        uint64_t mk = 0;
        for (int p = 0; p < NPROF; p++)
            if (group_profile(x, n, fmt, &prof[p], c) == ts && !memcmp(c, t, (size_t)n)) mk |= 1ull << p, matched[p]++;
        mask[gi] = mk;
        none += mk == 0;
    }
    memset(r, 0, sizeof *r);
    r->groups = w.ngroups;
    r->num_profiles = NPROF;
    r->unmatched_by_all = none;
    for (int p = 0; p < NPROF; p++) {
        r->matched[p] = matched[p];
        if (matched[p] > matched[r->best]) r->best = p;
    }
    for (int c = 0; c < MXFP8_DIFF_NUM_CLASSES; c++)
        for (int e = 0; e < MXFP8_DIFF_EXAMPLES; e++) r->example[c * MXFP8_DIFF_EXAMPLES + e] = -1;
    for (int64_t gi = 0; gi < w.ngroups; gi++) { /* in group order: the examples are the first of each class */
        if ((mask[gi] >> r->best) & 1) continue;
        float x[32];
        int64_t doff[32], soff;
        uint8_t t[32], c[32];
        const int n = load_group(&w, gi, x, doff, &soff);
        const uint8_t ts = load_theirs(&w, soff, doff, n, t), os = group_profile(x, n, fmt, &prof[r->best], c);
        const int k = classify(x, n, fmt, t, ts, c, os);
        if (r->unexplained[k] < MXFP8_DIFF_EXAMPLES) r->example[k * MXFP8_DIFF_EXAMPLES + r->unexplained[k]] = gi;
        r->unexplained[k]++;
    }
    free(mask);
    return MXFP8_OK;
}
