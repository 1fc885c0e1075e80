/*
 * quantize.c -- MX quantization and dequantization along an axis of an N-D tensor [OCP §6.3], [NKI-Q].
 *
 * Contract: mxfp8_quantize / mxfp8_dequantize (include/mxfp8.h) validate everything, then cut the tensor into
 * "panels" (src/kernels/qpanel.h): `lines` lines of K values along the axis, run by the registry's quantization
 * kernel (src/quant/panel.c): the AVX-512 kernel where the axis has unit stride (rows) or another dimension has unit
 * stride in every tensor (cols), the reference panel for any other strides. Every group goes through the
 * arithmetic of mxfp8i_quantize_group_ref (the executable specification), so all paths agree bit for bit.
 * Threads: panels are split into chunks of lines; each output element is written by exactly one thread.
 */
#include <math.h>
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "../format/groups.h"
#include "../runtime/enums.h"
#include "../runtime/threads.h"
#include "../runtime/tensor.h"
#include "panel.h"

/* ---------------------------------------------------------------------------------------------------------- */
/* N-D decomposition into panels                                                                              */
/* ---------------------------------------------------------------------------------------------------------- */
/* Up to three tensors walked together: t[0] the source, t[1] the output, t[2] the scales (scales have G along the
 * axis); t[3] is the row-major index of the element in the source's shape (the logical index of stochastic rounding).
 * A panel = the axis x one "line" dimension; every other dimension is an outer loop. */
typedef struct nd_plan {
    int ndim, axis, line_dim; /* line_dim = -1: a single line */
    int64_t shape[MXFP8_MAX_DIMS];
    int64_t st[4][MXFP8_MAX_DIMS];
    int64_t outer;        /* product of the other dimensions */
    int64_t lines, chunk; /* lines per panel; lines per work item */
    int64_t K, kchunk;    /* axis length; axis indices per work item (whole groups / wrapX tiles) */
    bool cols;            /* the line dimension has unit stride in all three tensors (and the axis does not) */
} nd_plan;

/* Choose the line dimension: for rows (the axis has unit stride in src and out), the largest other dimension; for
 * cols, a dimension with unit stride in all three; else the largest other dimension (reference panel). */
static void plan_make(nd_plan *pl, const mxfp8_tensor *t0, const mxfp8_tensor *t1, const mxfp8_tensor *t2, int axis) {
    pl->ndim = t0->ndim;
    pl->axis = axis;
    for (int i = 0; i < t0->ndim; i++) {
        pl->shape[i] = t0->shape[i];
        pl->st[0][i] = t0->strides[i];
        pl->st[1][i] = t1->strides[i];
        pl->st[2][i] = t2->strides[i];
    }
    for (int i = t0->ndim - 1, rm = 1; i >= 0; i--) { /* row-major strides of the logical index */
        pl->st[3][i] = rm;
        rm *= t0->shape[i];
    }
    int best = -1;
    bool rows = t0->strides[axis] == 1 && t1->strides[axis] == 1;
    if (!rows) {
        for (int i = 0; i < t0->ndim; i++)
            if (i != axis && t0->shape[i] > 1 && t0->strides[i] == 1 && t1->strides[i] == 1 && t2->strides[i] == 1)
                best = i;
    }
    if (best < 0) {
        for (int i = 0; i < t0->ndim; i++)
            if (i != axis && (best < 0 || t0->shape[i] > t0->shape[best])) best = i;
    }
    pl->line_dim = best;
    pl->lines = best >= 0 ? t0->shape[best] : 1;
    pl->K = t0->shape[axis];
    pl->cols = !rows && best >= 0 && t0->strides[best] == 1 && t1->strides[best] == 1 && t2->strides[best] == 1;
    pl->outer = 1;
    for (int i = 0; i < t0->ndim; i++)
        if (i != axis && i != best) pl->outer *= t0->shape[i];
}

/* Offsets (elements) of the first line of outer panel `o` in each tensor. */
static void plan_offsets(const nd_plan *pl, int64_t o, int64_t off[4]) {
    off[0] = off[1] = off[2] = off[3] = 0;
    for (int i = pl->ndim - 1; i >= 0; i--) {
        if (i == pl->axis || i == pl->line_dim) continue;
        int64_t idx = o % pl->shape[i];
        o /= pl->shape[i];
        for (int t = 0; t < 4; t++) off[t] += idx * pl->st[t][i];
    }
}

/* Work items: for the cols geometry (wide enough), ranges of the axis (whole groups; whole 512-tiles for wrapX, so
 * each range tiles exactly as the full axis does) over full-width lines, which keeps every row a long sequential
 * stream; otherwise ranges of lines. */
static void plan_split(nd_plan *pl, int64_t K, int nt, mxfp8_group_scheme group) {
    int64_t items_wanted = (int64_t)nt * 4;
    pl->kchunk = K;
    if (pl->cols && pl->lines >= 64 && K > 0) {
        int64_t granule = group == MXFP8_GROUP_WRAPX ? 512 : 32;
        int64_t per_outer = pl->outer >= items_wanted ? 1 : mxfp8i_ceil_div(items_wanted, pl->outer);
        int64_t kc = mxfp8i_ceil_div(K, per_outer), min_k = mxfp8i_ceil_div(16384, pl->lines);
        if (kc < min_k) kc = min_k;
        kc = mxfp8i_ceil_div(kc, granule) * granule;
        pl->kchunk = kc < K ? kc : K;
        pl->chunk = pl->lines;
        return;
    }
    int64_t per = pl->lines;
    if (pl->outer < items_wanted) per = mxfp8i_ceil_div(pl->lines, mxfp8i_ceil_div(items_wanted, pl->outer));
    /* Keep chunks of whole SIMD widths for the cols geometry and at least ~16 KiB of work each. */
    int64_t min_lines = K > 0 ? mxfp8i_ceil_div(16384, K) : 1;
    if (per < min_lines) per = min_lines;
    if (per < pl->lines) per = mxfp8i_ceil_div(per, 64) * 64;
    if (per > pl->lines) per = pl->lines;
    if (per < 1) per = 1;
    pl->chunk = per;
}

/* Work items of a split plan: outer panels x line chunks x axis chunks. */
static int64_t plan_items(const nd_plan *pl) {
    int64_t nk = mxfp8i_ceil_div(pl->K, pl->kchunk);
    return pl->outer * mxfp8i_ceil_div(pl->lines, pl->chunk) * nk;
}

/* Geometry of work item `it`: the element offset of its first value in each tensor (t[0] source, t[1] output,
 * t[2] scales, t[3] the logical index), its line count n, axis length kn, and each tensor's stride between lines. */
typedef struct nd_item {
    int64_t off[4], ls[4];
    int64_t n, kn;
} nd_item;
static void plan_item(const nd_plan *pl, int64_t it, nd_item *w) {
    int64_t nk = mxfp8i_ceil_div(pl->K, pl->kchunk), per_panel = mxfp8i_ceil_div(pl->lines, pl->chunk) * nk;
    int64_t o = it / per_panel, l0 = (it % per_panel) / nk * pl->chunk, k0 = (it % nk) * pl->kchunk;
    int ax = pl->axis, ld = pl->line_dim;
    plan_offsets(pl, o, w->off);
    for (int t = 0; t < 4; t++) w->ls[t] = ld >= 0 ? pl->st[t][ld] : 0;
    w->off[0] += k0 * pl->st[0][ax] + l0 * w->ls[0];
    w->off[1] += k0 * pl->st[1][ax] + l0 * w->ls[1];
    w->off[3] += k0 * pl->st[3][ax] + l0 * w->ls[3];
    w->off[2] += k0 / 32 * pl->st[2][ax] + l0 * w->ls[2];
    w->n = pl->lines - l0 < pl->chunk ? pl->lines - l0 : pl->chunk;
    w->kn = pl->K - k0 < pl->kchunk ? pl->K - k0 : pl->kchunk;
}

static int threads_for(int64_t numel) {
    int nt = mxfp8i_num_threads();
    if (numel < (1 << 16)) nt = 1;
    return nt < 1 ? 1 : nt;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Public API                                                                                                 */
/* ---------------------------------------------------------------------------------------------------------- */
mxfp8_quant_params mxfp8_quant_params_default(void) {
    mxfp8_quant_params p;
    memset(&p, 0, sizeof p);
    p.fmt = MXFP8_FMT_E4M3;
    p.rule = MXFP8_SCALE_NKI;
    p.group = MXFP8_GROUP_1X32;
    p.rounding = MXFP8_ROUND_NEAREST;
    return p;
}

/* Checks shared by quantize and dequantize: `scales` must be `ref`'s shape with the axis replaced by G. */
static mxfp8_status check_scales_shape(const char *fn, const mxfp8_tensor *ref, int axis, const mxfp8_tensor *sc) {
    bool ok = sc->ndim == ref->ndim;
    for (int i = 0; ok && i < ref->ndim; i++)
        ok = sc->shape[i] == (i == axis ? mxfp8i_ceil_div(ref->shape[i], 32) : ref->shape[i]);
    MXFP8I_RETURN_ERROR_IF(!ok, MXFP8_ERR_SHAPE_MISMATCH,
                           "%s: scales must have the data's shape with shape[%d] = ceil(%lld/32) = %lld", fn, axis,
                           (long long)ref->shape[axis], (long long)mxfp8i_ceil_div(ref->shape[axis], 32));
    return MXFP8_OK;
}

static mxfp8_status check_group(const char *fn, mxfp8_group_scheme group, int64_t len, int axis) {
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_enum(fn, "group", MXFP8_ENUM_GROUP_SCHEME, (int)group));
    MXFP8I_RETURN_ERROR_IF(group == MXFP8_GROUP_WRAPX && len % 128 != 0, MXFP8_ERR_UNSUPPORTED,
                           "%s: group scheme WRAPX needs the axis length %% 128 == 0; shape[%d] = %lld", fn, axis,
                           (long long)len);
    return MXFP8_OK;
}

/* The work items of a split plan, in parallel; tst: NULL or one statistics accumulator per thread. */
static void quantize_items(const nd_plan *pl, const mxfp8_tensor *src, const mxfp8_tensor *data,
                           const mxfp8_tensor *scales, const mxfp8_quant_params *qp, int nt, mxfp8i_qstats *tst) {
    const int ax = pl->axis;
    const int64_t items = plan_items(pl), es_src = (int64_t)mxfp8_dtype_size(src->dtype);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1 && items > 1)
    for (int64_t it = 0; it < items; it++) {
        nd_item w;
        plan_item(pl, it, &w);
        mxfp8i_qpanel p;
        memset(&p, 0, sizeof p);
        p.src = (const char *)src->data + w.off[0] * es_src;
        p.src_dtype = src->dtype;
        p.lines = w.n;
        p.K = w.kn;
        p.src_ls = w.ls[0];
        p.src_ks = pl->st[0][ax];
        p.fmt = qp->fmt;
        p.rule = qp->rule;
        p.group = qp->group;
        p.out = (uint8_t *)data->data + w.off[1];
        p.out_dtype = MXFP8_DTYPE_U8;
        p.out_ls = w.ls[1];
        p.out_ks = pl->st[1][ax];
        p.scales = (uint8_t *)scales->data + w.off[2];
        p.sc_ls = w.ls[2];
        p.sc_gs = pl->st[2][ax];
        if (qp->rounding == MXFP8_ROUND_STOCHASTIC) {
            mxfp8i_sround sr = {1, qp->seed, qp->stream, w.off[3], w.ls[3], pl->st[3][ax]};
            p.sr = sr;
        }
#ifdef _OPENMP
        p.stats = tst ? &tst[omp_get_thread_num()] : NULL;
#else
        p.stats = tst;
#endif
        mxfp8i_quantize_panel(&p);
    }
}

/* Every check of mxfp8_quantize (shared by the call and mxfp8_quantize_validate); *qp_out, *ax_out: the resolved
 * parameters and axis. */
static mxfp8_status quantize_validate(const char *fn, const mxfp8_tensor *src, int axis,
                                      const mxfp8_quant_params *params, const mxfp8_tensor *data,
                                      const mxfp8_tensor *scales, mxfp8_quant_params *qp_out, int *ax_out) {
    mxfp8_status st;
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_view(fn, "src", src));
    MXFP8I_RETURN_ERROR_IF(src->ndim < 1, MXFP8_ERR_SHAPE_MISMATCH, "%s: src must have rank >= 1, got 0", fn);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_dtype(fn, "src", src, 3, MXFP8_DTYPE_F32, MXFP8_DTYPE_BF16, MXFP8_DTYPE_F16));
    mxfp8_quant_params qp = params ? *params : mxfp8_quant_params_default();
    if ((st = mxfp8i_check_enum(fn, "params->fmt", MXFP8_ENUM_FORMAT, (int)qp.fmt)) ||
        (st = mxfp8i_check_enum(fn, "params->rule", MXFP8_ENUM_SCALE_RULE, (int)qp.rule)) ||
        (st = mxfp8i_check_enum(fn, "params->rounding", MXFP8_ENUM_ROUNDING, (int)qp.rounding)))
        return st;
    int ax;
    MXFP8I_RETURN_ERROR_IF(!mxfp8i_norm_axis(axis, src->ndim, &ax), MXFP8_ERR_INVALID_ARGUMENT,
                           "%s: axis %d is out of range for a %d-D tensor", fn, axis, (int)src->ndim);
    MXFP8I_FORWARD_IF_ERROR(check_group(fn, qp.group, src->shape[ax], ax));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_view(fn, "data", data));
    MXFP8I_RETURN_ERROR_IF(data->dtype != mxfp8i_fmt_dtype(qp.fmt), MXFP8_ERR_DTYPE,
                           "%s: data has dtype %s but params->fmt asks for %s", fn, mxfp8_dtype_name(data->dtype),
                           mxfp8_dtype_name(mxfp8i_fmt_dtype(qp.fmt)));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_same_shape(fn, "src", src, "data", data));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_view(fn, "scales", scales));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_dtype(fn, "scales", scales, 2, MXFP8_DTYPE_E8M0, MXFP8_DTYPE_U8));
    MXFP8I_FORWARD_IF_ERROR(check_scales_shape(fn, src, ax, scales));
    if ((st = mxfp8i_check_distinct(fn, "data", data)) || (st = mxfp8i_check_distinct(fn, "scales", scales))) return st;
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_no_alias(fn, "data", data, "src", src));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_no_alias(fn, "scales", scales, "src", src));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_no_alias(fn, "data", data, "scales", scales));
    *qp_out = qp;
    *ax_out = ax;
    return MXFP8_OK;
}

mxfp8_status mxfp8_quantize_validate(const mxfp8_tensor *src, int axis, const mxfp8_quant_params *params,
                                     const mxfp8_tensor *data, const mxfp8_tensor *scales, size_t *workspace_bytes) {
    mxfp8i_clear_error();
    mxfp8_quant_params qp;
    int ax;
    if (workspace_bytes) *workspace_bytes = 0; /* no workspace: at most one statistics accumulator per thread */
    return quantize_validate("mxfp8_quantize", src, axis, params, data, scales, &qp, &ax);
}

mxfp8_status mxfp8_quantize(const mxfp8_tensor *src, int axis, const mxfp8_quant_params *params, mxfp8_tensor *data,
                            mxfp8_tensor *scales) {
    static const char *fn = "mxfp8_quantize";
    mxfp8i_clear_error();
    mxfp8_quant_params qp;
    int ax;
    MXFP8I_FORWARD_IF_ERROR(quantize_validate(fn, src, axis, params, data, scales, &qp, &ax));

    int64_t numel = mxfp8_tensor_numel(src);
    nd_plan pl;
    plan_make(&pl, src, data, scales, ax);
    int64_t K = src->shape[ax];
    int nt = threads_for(numel);
    mxfp8i_qstats *tst = NULL; /* one accumulator per thread, merged after (exact, so in any order) */
    MXFP8I_RETURN_ERROR_IF(qp.stats && !(tst = (mxfp8i_qstats *)calloc((size_t)nt, sizeof *tst)),
                           MXFP8_ERR_OUT_OF_MEMORY, "%s: out of memory for %d statistics accumulators", fn, nt);
    if (numel > 0) {
        plan_split(&pl, K, nt, qp.group);
        quantize_items(&pl, src, data, scales, &qp, nt, tst);
    }
    if (qp.stats) {
        for (int t = 1; t < nt; t++) mxfp8i_qstats_merge(&tst[0], &tst[t]);
        mxfp8i_qstats_export(&tst[0], qp.stats);
        free(tst);
    }
    return MXFP8_OK;
}

/* Every check of mxfp8_dequantize (shared by the call and mxfp8_dequantize_validate); *ax_out: the axis. */
static mxfp8_status dequantize_validate(const char *fn, const mxfp8_tensor *data, const mxfp8_tensor *scales, int axis,
                                        mxfp8_group_scheme group, const mxfp8_tensor *out, int *ax_out) {
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_view(fn, "data", data));
    MXFP8I_RETURN_ERROR_IF(data->ndim < 1, MXFP8_ERR_SHAPE_MISMATCH, "%s: data must have rank >= 1, got 0", fn);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_dtype(fn, "data", data, 2, MXFP8_DTYPE_E4M3, MXFP8_DTYPE_E5M2));
    int ax;
    MXFP8I_RETURN_ERROR_IF(!mxfp8i_norm_axis(axis, data->ndim, &ax), MXFP8_ERR_INVALID_ARGUMENT,
                           "%s: axis %d is out of range for a %d-D tensor", fn, axis, (int)data->ndim);
    MXFP8I_FORWARD_IF_ERROR(check_group(fn, group, data->shape[ax], ax));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_view(fn, "scales", scales));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_dtype(fn, "scales", scales, 2, MXFP8_DTYPE_E8M0, MXFP8_DTYPE_U8));
    MXFP8I_FORWARD_IF_ERROR(check_scales_shape(fn, data, ax, scales));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_view(fn, "out", out));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_dtype(fn, "out", out, 3, MXFP8_DTYPE_F32, MXFP8_DTYPE_BF16, MXFP8_DTYPE_F16));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_same_shape(fn, "data", data, "out", out));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_distinct(fn, "out", out));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_no_alias(fn, "out", out, "data", data));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_no_alias(fn, "out", out, "scales", scales));
    *ax_out = ax;
    return MXFP8_OK;
}

mxfp8_status mxfp8_dequantize_validate(const mxfp8_tensor *data, const mxfp8_tensor *scales, int axis,
                                       mxfp8_group_scheme group, const mxfp8_tensor *out, size_t *workspace_bytes) {
    mxfp8i_clear_error();
    int ax;
    if (workspace_bytes) *workspace_bytes = 0; /* no scratch at all */
    return dequantize_validate("mxfp8_dequantize", data, scales, axis, group, out, &ax);
}

mxfp8_status mxfp8_dequantize(const mxfp8_tensor *data, const mxfp8_tensor *scales, int axis, mxfp8_group_scheme group,
                              mxfp8_tensor *out) {
    static const char *fn = "mxfp8_dequantize";
    mxfp8i_clear_error();
    int ax;
    MXFP8I_FORWARD_IF_ERROR(dequantize_validate(fn, data, scales, axis, group, out, &ax));

    int64_t numel = mxfp8_tensor_numel(data);
    if (numel == 0) return MXFP8_OK;
    mxfp8_format fmt = data->dtype == MXFP8_DTYPE_E5M2 ? MXFP8_FMT_E5M2 : MXFP8_FMT_E4M3;
    nd_plan pl;
    plan_make(&pl, data, out, scales, ax);
    int64_t K = data->shape[ax];
    int nt = threads_for(numel);
    plan_split(&pl, K, nt, group);
    int64_t items = plan_items(&pl);
    int64_t es_out = (int64_t)mxfp8_dtype_size(out->dtype);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1 && items > 1)
    for (int64_t it = 0; it < items; it++) {
        nd_item w;
        plan_item(&pl, it, &w);
        mxfp8i_dqpanel p = {(const uint8_t *)data->data + w.off[0],
                            fmt,
                            w.n,
                            w.kn,
                            w.ls[0],
                            pl.st[0][ax],
                            (const uint8_t *)scales->data + w.off[2],
                            w.ls[2],
                            pl.st[2][ax],
                            group,
                            (char *)out->data + w.off[1] * es_out,
                            out->dtype,
                            w.ls[1],
                            pl.st[1][ax]};
        mxfp8i_dequantize_panel(&p);
    }
    return MXFP8_OK;
}
